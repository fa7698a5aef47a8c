/* The int6 weight layout for the embedding and output head: nearly int8's accuracy (a
 * quarter of int4's rounding step) at 6.5 bits a weight. The q4 layout's 16-row blocks,
 * symmetric codes q in [-32, 31] with one fp16 scale per (row, group of 32), w = d*q,
 * stored as a 4-bit plane and a 2-bit plane of u = q + 32. Reads q4_acts (A8 or A16). */
#ifndef HEARTH_KERNELS_Q6_H
#define HEARTH_KERNELS_Q6_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/q4.h"

#define Q6_GROUP 32
#define Q6_GROUP_BYTES 384    /* 16 rows x 32 codes x 6 bits: 4 low chunks + 2 high chunks */
#define Q6_MAX_GROUPS 4096    /* the SIMD kernels' per-call table of activation sums */

/* Row block b starts at data + b * block_bytes: n_groups x 16 fp16 d, padded to 64 bytes;
 * then per group 384 bytes. With u = q + 32 = 16h + l (l in 0..15, h in 0..3), bytes
 * 64m..64m+63 (m = 0..3) hold l of the group's columns 8m..8m+7: row r owns bytes
 * 4r..4r+3, byte j holds column 8m+j in its low nibble and 8m+4+j in its high nibble (q4's
 * chunk). Bytes 256+64n.. (n = 0..1) hold h of columns 16n..16n+15: row r's byte j holds
 * column 16n+4s+j in bits 2s..2s+1. So a 4-column slice of 16 rows (the 64-byte int8 tile
 * vpdpbusd reads, as in q8) is one mask of a low chunk, one shift of a high chunk and one
 * vpternlogd. Pad rows of the last block are zero (d = 0, q = 0). No code sums are
 * stored: the kernels take 32 * sum(x) back out per (token, group), which costs nothing
 * per row, where q8's per-row sums cost 0.5 bits a weight. */
struct q6_matrix {
	size_t rows, cols, n_groups, n_row_blocks;
	size_t scale_bytes, block_bytes;
	uint8_t *data;
};

/* cols a multiple of 32, at most 32 * Q6_MAX_GROUPS. 0, HEARTH_EINVAL or HEARTH_ERANGE. */
int q6_matrix_plan(struct q6_matrix *m, size_t rows, size_t cols);
size_t q6_matrix_bytes(const struct q6_matrix *m);
/* Bits per weight, scales and padding included (6.5 for a whole block). */
double q6_matrix_bpw(const struct q6_matrix *m);

/* From f32 rows, per group the d of least squared error among candidates: absmax/31 (the
 * plain rule, never clamped) first, then absmax over a grid of divisors 24..32.5 and a
 * least-squares refit of the best; each rounded to fp16 and measured with its own codes
 * (nearest, clamped to [-32, 31]). A candidate that would leave any weight more than d/2
 * from d*q (clamping) is refused, so |w - d*q| <= d/2 always and the error is never worse
 * than absmax's. Same input, same bytes; the call packing the last row zeroes pad rows. */
void q6_pack_rows_f32(struct q6_matrix *m, const float *src, size_t ld, size_t row0, size_t n_rows);
/* The same layout rounded by GPTQ (kernels/gptq.h), as q4_pack_rows_gptq: u the factor of
 * the inputs' covariance in blocks of ublock columns; each group's d by the rule above on
 * its values as the errors before it left them, each code nearest (clamped), each error
 * taken off the columns still to come in its block through spread (a kernel table's
 * gptq, a group at a time past the group). The rows at src are overwritten. With a diagonal covariance nothing moves
 * and the bytes are q6_pack_rows_f32's. */
void q6_pack_rows_gptq(struct q6_matrix *m, float *src, size_t ld, const float *u, size_t ublock, size_t row0,
		       size_t n_rows, const struct vec_gptq *spread);
/* One group of 32 by the same rule: codes in q, d as stored (an fp16 value). */
void q6_quantize_group_f32(const float *x, int8_t *q, float *d);
/* dst[i*ld + k] = d*q (an embedding lookup). */
void q6_unpack_rows(const struct q6_matrix *m, size_t row0, size_t n_rows, float *dst, size_t ld);
int q6_code(const struct q6_matrix *m, size_t row, size_t col);
float q6_scale_d(const struct q6_matrix *m, size_t row, size_t group_index);

/* y[t*ldy + r] = sum_k w[r][k] * act[t][k], rows [row_begin, row_end) as q4_matmul_fn;
 * a->group must be 32. A8: exact integer dot sum(q*x) per group, then
 * y = fma(dot, d*scale, y) in group order: bit-identical on every ISA. A16: float sums. */
typedef void (*q6_matmul_fn)(const struct q6_matrix *w, const struct q4_acts *a, float *y, size_t ldy,
			     size_t row_begin, size_t row_end);

void q6_matmul_ref(const struct q6_matrix *w, const struct q4_acts *a, float *y, size_t ldy,
		   size_t row_begin, size_t row_end);
void q6_matmul_avx2(const struct q6_matrix *w, const struct q4_acts *a, float *y, size_t ldy,
		    size_t row_begin, size_t row_end);
void q6_matmul_avx512(const struct q6_matrix *w, const struct q4_acts *a, float *y, size_t ldy,
		      size_t row_begin, size_t row_end);

#endif
