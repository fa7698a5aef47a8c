/* The int8 layout: geometry, packing from f32 or Q8_0 rows, unpacking. Scalar, load-time
 * only, a few rows per call like kernels/q4.c. */
#include "kernels/q8.h"

#include <math.h>
#include <string.h>

int q8_matrix_plan(struct q8_matrix *m, size_t rows, size_t cols, size_t group)
{
	size_t codes, total;

	memset(m, 0, sizeof(*m));
	if (rows == 0 || cols == 0 || (group != 32 && group != 64 && group != 128) || cols % group != 0)
		return HEARTH_EINVAL;
	m->rows = rows;
	m->cols = cols;
	m->group = group;
	m->n_groups = cols / group;
	m->n_row_blocks = (rows + Q4_ROWS - 1) / Q4_ROWS;
	/* 16 fp16 scales + 16 int16 sums per group. */
	if (__builtin_mul_overflow(m->n_groups, (size_t)64, &m->scale_bytes) ||
	    __builtin_mul_overflow(cols, (size_t)Q4_ROWS, &codes) ||
	    __builtin_add_overflow(codes, m->scale_bytes, &m->block_bytes) ||
	    __builtin_mul_overflow(m->block_bytes, m->n_row_blocks, &total))
		return HEARTH_ERANGE;
	return 0;
}

size_t q8_matrix_bytes(const struct q8_matrix *m)
{
	return m->block_bytes * m->n_row_blocks;
}

static uint8_t *block_of(const struct q8_matrix *m, size_t row)
{
	return m->data + (row / Q4_ROWS) * m->block_bytes;
}

static qfp16 *d_slot(const struct q8_matrix *m, size_t row, size_t g)
{
	return (qfp16 *)block_of(m, row) + g * Q4_ROWS + row % Q4_ROWS;
}

static int16_t *sum_slot(const struct q8_matrix *m, size_t row, size_t g)
{
	return (int16_t *)block_of(m, row) + (m->n_groups + g) * Q4_ROWS + row % Q4_ROWS;
}

static int8_t *code_slot(const struct q8_matrix *m, size_t row, size_t col)
{
	return (int8_t *)block_of(m, row) + m->scale_bytes + (col / Q8_CHUNK_COLS) * Q4_CHUNK_BYTES +
	       (row % Q4_ROWS) * 4 + col % Q8_CHUNK_COLS;
}

int q8_code(const struct q8_matrix *m, size_t row, size_t col)
{
	return *code_slot(m, row, col);
}

float q8_scale_d(const struct q8_matrix *m, size_t row, size_t g)
{
	return quant_fp16_to_f32(*d_slot(m, row, g));
}

static void put_group(struct q8_matrix *m, size_t row, size_t g, qfp16 d, const int8_t *q)
{
	int sum = 0;

	*d_slot(m, row, g) = d;
	for (size_t i = 0; i < m->group; i++) {
		*code_slot(m, row, g * m->group + i) = q[i];
		sum += q[i];
	}
	*sum_slot(m, row, g) = (int16_t)sum; /* |sum| <= 128 * 128 */
}

static void zero_pad_rows(struct q8_matrix *m, size_t row0, size_t n_rows)
{
	int8_t zero[128] = { 0 };

	if (row0 + n_rows != m->rows)
		return;
	for (size_t r = m->rows; r < m->n_row_blocks * Q4_ROWS; r++)
		for (size_t g = 0; g < m->n_groups; g++)
			put_group(m, r, g, 0, zero);
}

void q8_pack_rows_f32(struct q8_matrix *m, const float *src, size_t ld, size_t row0, size_t n_rows)
{
	int8_t q[128];

	for (size_t i = 0; i < n_rows; i++) {
		for (size_t g = 0; g < m->n_groups; g++) {
			const float *x = src + i * ld + g * m->group;
			float amax = 0.0f;

			for (size_t k = 0; k < m->group; k++)
				amax = fmaxf(amax, fabsf(x[k]));
			qfp16 dh = quant_f32_to_fp16(amax / 127.0f);
			float d = quant_fp16_to_f32(dh), id = d != 0.0f ? 1.0f / d : 0.0f;

			for (size_t k = 0; k < m->group; k++) {
				float v = nearbyintf(x[k] * id);

				q[k] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : v);
			}
			put_group(m, row0 + i, g, dh, q);
		}
	}
	zero_pad_rows(m, row0, n_rows);
}

int q8_pack_rows_q8_0(struct q8_matrix *m, const void *src, size_t row0, size_t n_rows)
{
	const struct block_q8_0 *b = src;

	if (m->group != QK8_0)
		return HEARTH_EINVAL;
	for (size_t i = 0; i < n_rows; i++)
		for (size_t g = 0; g < m->n_groups; g++, b++)
			put_group(m, row0 + i, g, b->d, b->qs);
	zero_pad_rows(m, row0, n_rows);
	return 0;
}

void q8_unpack_rows(const struct q8_matrix *m, size_t row0, size_t n_rows, float *dst, size_t ld)
{
	for (size_t i = 0; i < n_rows; i++)
		for (size_t k = 0; k < m->cols; k++)
			dst[i * ld + k] = (float)q8_code(m, row0 + i, k) * q8_scale_d(m, row0 + i, k / m->group);
}

