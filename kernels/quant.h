/* Tensor element types as GGUF files store them (ggml's numbering and block formats) and
 * their exact scalar conversions: dequantize any supported row to f32, quantize f32 rows
 * to the few types the fixture generator writes. Pure compute: no I/O, no allocation. */
#ifndef HEARTH_KERNELS_QUANT_H
#define HEARTH_KERNELS_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Values are ggml's type ids, as written in GGUF tensor infos. */
enum qtype {
	QTYPE_F32 = 0,
	QTYPE_F16 = 1,
	QTYPE_Q4_0 = 2,
	QTYPE_Q4_1 = 3,
	QTYPE_Q5_0 = 6,
	QTYPE_Q5_1 = 7,
	QTYPE_Q8_0 = 8,
	QTYPE_Q4_K = 12,
	QTYPE_Q5_K = 13,
	QTYPE_Q6_K = 14,
	QTYPE_BF16 = 30,
	/* Not a GGUF type: hearth's int8 KV cache row (kernels/vec.h VEC_KV_Q8: head_dim int8
	 * codes, then one f32 scale). Numbered outside ggml's range so no file can name it;
	 * qtype_known() is false for it. */
	QTYPE_KV_Q8 = 1024,
};

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef uint16_t qfp16; /* IEEE half, raw bits */

/* Block layouts, byte for byte as ggml-common.h defines them. */
struct block_q4_0 { qfp16 d; uint8_t qs[QK4_0 / 2]; };
struct block_q4_1 { qfp16 d, m; uint8_t qs[QK4_1 / 2]; };
struct block_q5_0 { qfp16 d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; };
struct block_q5_1 { qfp16 d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; };
struct block_q8_0 { qfp16 d; int8_t qs[QK8_0]; };
struct block_q4_K { qfp16 d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };
struct block_q5_K { qfp16 d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct block_q6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; qfp16 d; };

_Static_assert(sizeof(struct block_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(struct block_q4_1) == 20, "q4_1 block");
_Static_assert(sizeof(struct block_q5_0) == 22, "q5_0 block");
_Static_assert(sizeof(struct block_q5_1) == 24, "q5_1 block");
_Static_assert(sizeof(struct block_q8_0) == 34, "q8_0 block");
_Static_assert(sizeof(struct block_q4_K) == 144, "q4_K block");
_Static_assert(sizeof(struct block_q5_K) == 176, "q5_K block");
_Static_assert(sizeof(struct block_q6_K) == 210, "q6_K block");

/* True for the ids above; anything else is unsupported and must be rejected by readers. */
bool qtype_known(uint32_t type);
const char *qtype_name(uint32_t type);      /* "Q4_K", or "?" when unknown */
size_t qtype_block_elems(enum qtype type);  /* elements per block: 1, 32 or 256 */
size_t qtype_block_bytes(enum qtype type);  /* bytes per block */

/* Bytes for a row of n elements; false when n is not a whole number of blocks or the
 * product overflows size_t. */
bool qtype_row_bytes(enum qtype type, uint64_t n, size_t *out);

float quant_fp16_to_f32(qfp16 h);
qfp16 quant_f32_to_fp16(float f);           /* round to nearest even, as ggml */
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f);        /* round to nearest even; NaN stays NaN */

/* Dequantizes n elements (a whole number of blocks) of a row of `type` into dst, exactly
 * as llama.cpp's dequantize_row_* does. */
void quant_dequant_row(enum qtype type, const void *src, float *dst, size_t n);

/* Quantizes n elements (a whole number of blocks) of f32 into dst, as llama.cpp's
 * reference quantize_row_*_ref does. Supported: F32, F16, BF16, Q8_0, Q4_0. Returns false
 * for other types. */
bool quant_quantize_row(enum qtype type, const float *src, void *dst, size_t n);

#endif
