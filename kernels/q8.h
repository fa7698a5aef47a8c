/* The optional int8 weight layout for the embedding and output head (where 4 bits cost
 * the most quality): the q4 layout's 16-row blocks with 4 int8 columns per row in each
 * 64-byte chunk, one fp16 scale per (row, group) (w = d*q), and per (row, group) the sum
 * of the codes, which lets AVX-512 feed vpdpbusd with x+128. Reads q4_acts (A8 or A16). */
#ifndef HEARTH_KERNELS_Q8_H
#define HEARTH_KERNELS_Q8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/q4.h"

#define Q8_CHUNK_COLS 4     /* 16 rows x 4 int8 = 64 bytes */

/* Row block b starts at data + b * block_bytes: n_groups x 16 fp16 d, then n_groups x 16
 * int16 code sums, padded to 64 bytes; then cols/4 chunks where row r owns bytes
 * 4r..4r+3 = columns 4c..4c+3. Pad rows of the last block are zero. */
struct q8_matrix {
	size_t rows, cols, group, n_groups, n_row_blocks;
	size_t scale_bytes, block_bytes;
	uint8_t *data;
};

/* group 32, 64 or 128, cols a multiple of it. 0, HEARTH_EINVAL or HEARTH_ERANGE. */
int q8_matrix_plan(struct q8_matrix *m, size_t rows, size_t cols, size_t group);
size_t q8_matrix_bytes(const struct q8_matrix *m);

/* From f32 rows: d = absmax/127 per group (rounded to fp16 first), q = round(x/d). */
void q8_pack_rows_f32(struct q8_matrix *m, const float *src, size_t ld, size_t row0, size_t n_rows);
/* From Q8_0 rows (cols/32 blocks each), exact; needs group 32. 0 or HEARTH_EINVAL. */
int q8_pack_rows_q8_0(struct q8_matrix *m, const void *src, size_t row0, size_t n_rows);
/* dst[i*ld + k] = d*q (an embedding lookup; equal to quant_dequant_row for Q8_0). */
void q8_unpack_rows(const struct q8_matrix *m, size_t row0, size_t n_rows, float *dst, size_t ld);
int q8_code(const struct q8_matrix *m, size_t row, size_t col);
float q8_scale_d(const struct q8_matrix *m, size_t row, size_t group_index);

/* y[t*ldy + r] = sum_k w[r][k] * act[t][k], rows [row_begin, row_end) as q4_matmul_fn.
 * A8 (act group == matrix group): exact integer dot per group, then
 * y = fma(dot, d*scale, y) in group order: bit-identical on every ISA. A16: float sums. */
typedef void (*q8_matmul_fn)(const struct q8_matrix *w, const struct q4_acts *a, float *y, size_t ldy,
			     size_t row_begin, size_t row_end);

void q8_matmul_ref(const struct q8_matrix *w, const struct q4_acts *a, float *y, size_t ldy,
		   size_t row_begin, size_t row_end);
void q8_matmul_avx2(const struct q8_matrix *w, const struct q4_acts *a, float *y, size_t ldy,
		    size_t row_begin, size_t row_end);
void q8_matmul_avx512(const struct q8_matrix *w, const struct q4_acts *a, float *y, size_t ldy,
		      size_t row_begin, size_t row_end);

#endif
