/* The int6 layout: geometry, packing from f32 rows with a small scale search, unpacking.
 * Scalar, load-time only, a few rows per call like kernels/q4.c. */
#include "kernels/q6.h"

#include <math.h>
#include <string.h>

int q6_matrix_plan(struct q6_matrix *m, size_t rows, size_t cols)
{
	size_t codes, total;

	memset(m, 0, sizeof(*m));
	if (rows == 0 || cols == 0 || cols % Q6_GROUP != 0)
		return HEARTH_EINVAL;
	if (cols / Q6_GROUP > Q6_MAX_GROUPS)
		return HEARTH_ERANGE;
	m->rows = rows;
	m->cols = cols;
	m->n_groups = cols / Q6_GROUP;
	m->n_row_blocks = (rows + Q4_ROWS - 1) / Q4_ROWS;
	m->scale_bytes = (m->n_groups * Q4_ROWS * sizeof(qfp16) + Q4_ALIGN - 1) / Q4_ALIGN * Q4_ALIGN;
	if (__builtin_mul_overflow(m->n_groups, (size_t)Q6_GROUP_BYTES, &codes) ||
	    __builtin_add_overflow(codes, m->scale_bytes, &m->block_bytes) ||
	    __builtin_mul_overflow(m->block_bytes, m->n_row_blocks, &total))
		return HEARTH_ERANGE;
	return 0;
}

size_t q6_matrix_bytes(const struct q6_matrix *m)
{
	return m->block_bytes * m->n_row_blocks;
}

double q6_matrix_bpw(const struct q6_matrix *m)
{
	return 8.0 * (double)m->block_bytes / ((double)Q4_ROWS * (double)m->cols);
}

static uint8_t *block_of(const struct q6_matrix *m, size_t row)
{
	return m->data + (row / Q4_ROWS) * m->block_bytes;
}

static qfp16 *d_slot(const struct q6_matrix *m, size_t row, size_t g)
{
	return (qfp16 *)block_of(m, row) + g * Q4_ROWS + row % Q4_ROWS;
}

/* The byte holding column col's low nibble (*shift 0 or 4) and its 2 high bits (*hshift). */
static uint8_t *low_slot(const struct q6_matrix *m, size_t row, size_t col, unsigned *shift)
{
	size_t k = col % Q6_GROUP;

	*shift = (unsigned)((k / 4) % 2) * 4;
	return block_of(m, row) + m->scale_bytes + (col / Q6_GROUP) * Q6_GROUP_BYTES + (k / 8) * Q4_CHUNK_BYTES +
	       (row % Q4_ROWS) * 4 + k % 4;
}

static uint8_t *high_slot(const struct q6_matrix *m, size_t row, size_t col, unsigned *shift)
{
	size_t k = col % Q6_GROUP;

	*shift = (unsigned)((k % 16) / 4) * 2;
	return block_of(m, row) + m->scale_bytes + (col / Q6_GROUP) * Q6_GROUP_BYTES + 4 * Q4_CHUNK_BYTES +
	       (k / 16) * Q4_CHUNK_BYTES + (row % Q4_ROWS) * 4 + k % 4;
}

int q6_code(const struct q6_matrix *m, size_t row, size_t col)
{
	unsigned sl, sh;
	unsigned l = (*low_slot(m, row, col, &sl) >> sl) & 15u;
	unsigned h = (*high_slot(m, row, col, &sh) >> sh) & 3u;

	return (int)(16u * h + l) - 32;
}

float q6_scale_d(const struct q6_matrix *m, size_t row, size_t g)
{
	return quant_fp16_to_f32(*d_slot(m, row, g));
}

static void put_group(struct q6_matrix *m, size_t row, size_t g, qfp16 d, const int8_t *q)
{
	*d_slot(m, row, g) = d;
	for (size_t i = 0; i < Q6_GROUP; i++) {
		unsigned u = (unsigned)(q[i] + 32), sl, sh;
		uint8_t *lp = low_slot(m, row, g * Q6_GROUP + i, &sl);
		uint8_t *hp = high_slot(m, row, g * Q6_GROUP + i, &sh);

		*lp = (uint8_t)((*lp & ~(15u << sl)) | ((u & 15u) << sl));
		*hp = (uint8_t)((*hp & ~(3u << sh)) | ((u >> 4) << sh));
	}
}

/* The code of x at inverse scale id: nearest, clamped to [-32, 31]. */
static float code_nearest(float x, float id)
{
	float v = nearbyintf(x * id);

	return v > 31.0f ? 31.0f : v < -32.0f ? -32.0f : v;
}

/* Codes of x at scale d (code_nearest) and their squared error; *clamped when some weight
 * ends more than half a step from its value. */
static double group_codes(const float *x, float d, int8_t *q, bool *clamped)
{
	float id = 1.0f / d;
	double err = 0.0;

	*clamped = false;
	for (size_t i = 0; i < Q6_GROUP; i++) {
		float v = code_nearest(x[i], id);
		double e;

		q[i] = (int8_t)v;
		e = (double)x[i] - (double)(v * d);
		if (fabs(e) > 0.5 * (double)d * 1.0001)
			*clamped = true;
		err += e * e;
	}
	return err;
}

/* Measures candidate d as stored (fp16); keeps it when unclamped and better. */
static void try_scale(const float *x, float d, int8_t *best_q, qfp16 *best_d, double *best_err)
{
	qfp16 dh = quant_f32_to_fp16(d);
	float fd = quant_fp16_to_f32(dh);
	int8_t q[Q6_GROUP];
	bool clamped;

	if (!isfinite(fd) || !(fd > 0.0f))
		return;
	double err = group_codes(x, fd, q, &clamped);
	if (clamped || !(err < *best_err))
		return;
	*best_err = err;
	*best_d = dh;
	memcpy(best_q, q, sizeof(q));
}

/* Divisors of the absmax tried after the plain 31: the absmax at code +-31.5 or -32..-32.5
 * lowers the step, a smaller divisor trades the largest weights' error for the rest's. */
static const float q6_divisors[] = { 32.5f, 32.25f, 32.0f, 31.75f, 31.5f, 31.25f, 30.5f, 30.0f, 29.0f, 28.0f, 26.0f };

void q6_quantize_group_f32(const float *x, int8_t *q, float *d)
{
	float amax = 0.0f;
	qfp16 dh = 0;
	double best = INFINITY;
	bool clamped;

	for (size_t i = 0; i < Q6_GROUP; i++)
		amax = fmaxf(amax, fabsf(x[i]));
	/* The plain rule, always kept as the baseline (it never clamps). */
	dh = quant_f32_to_fp16(amax / 31.0f);
	float d0 = quant_fp16_to_f32(dh);
	if (!(d0 > 0.0f) || !isfinite(d0)) {
		memset(q, 0, Q6_GROUP);
		*d = 0.0f;
		return;
	}
	best = group_codes(x, d0, q, &clamped);
	for (size_t i = 0; i < sizeof(q6_divisors) / sizeof(q6_divisors[0]); i++)
		try_scale(x, amax / q6_divisors[i], q, &dh, &best);
	/* Least squares over the best codes, twice: moves d off the grid. */
	for (int r = 0; r < 2; r++) {
		double sxq = 0.0, sqq = 0.0;

		for (size_t i = 0; i < Q6_GROUP; i++) {
			sxq += (double)x[i] * q[i];
			sqq += (double)q[i] * q[i];
		}
		if (!(sqq > 0.0))
			break;
		try_scale(x, (float)(sxq / sqq), q, &dh, &best);
	}
	*d = quant_fp16_to_f32(dh);
}

static void zero_pad_rows(struct q6_matrix *m, size_t row0, size_t n_rows)
{
	int8_t zero[Q6_GROUP] = { 0 };

	if (row0 + n_rows != m->rows)
		return;
	for (size_t r = m->rows; r < m->n_row_blocks * Q4_ROWS; r++)
		for (size_t g = 0; g < m->n_groups; g++)
			put_group(m, r, g, 0, zero);
}

void q6_pack_rows_f32(struct q6_matrix *m, const float *src, size_t ld, size_t row0, size_t n_rows)
{
	int8_t q[Q6_GROUP];

	for (size_t i = 0; i < n_rows; i++) {
		for (size_t g = 0; g < m->n_groups; g++) {
			float d;

			q6_quantize_group_f32(src + i * ld + g * Q6_GROUP, q, &d);
			put_group(m, row0 + i, g, quant_f32_to_fp16(d), q);
		}
	}
	zero_pad_rows(m, row0, n_rows);
}

/* Rows GPTQ rounds side by side, so each of U's rows is read once for them (as q4's). */
#define Q6_GPTQ_ROWS 8

/* GPTQ on n_rows <= Q6_GPTQ_ROWS rows ld apart (x, modified): each group's d chosen by
 * q6_quantize_group_f32's rule from its values as the errors pushed onto them have left
 * them, then its columns rounded one by one (nearest, clamped), each one's error divided by
 * U's diagonal and taken off the columns after it in its block in proportion to U's row:
 * within the run (vec_gptq_run_end) at once, past it in one sub_run when the run is done,
 * as q4's. */
static void pack_rows_gptq(struct q6_matrix *m, size_t row0, size_t n_rows, float *x, size_t ld, const float *u,
			   size_t ublock, const struct vec_gptq *spread)
{
	int8_t q[Q6_GPTQ_ROWS][Q6_GROUP];
	float d[Q6_GPTQ_ROWS], e[Q6_GPTQ_ROWS * VEC_GPTQ_RUN]; /* e: the run's errors, row by row */

	for (size_t g = 0; g < m->n_groups; g++) {
		size_t g0 = g * Q6_GROUP, g1 = g0 + Q6_GROUP;

		for (size_t r = 0; r < n_rows; r++)
			q6_quantize_group_f32(x + r * ld + g0, q[r], &d[r]);
		for (size_t a = g0, b, bs, end; a < g1; a = b) {
			b = vec_gptq_run_end(a, g1, ublock, m->cols, &bs, &end);
			for (size_t i = a; i < b; i++) {
				const float *ui = u + i * ublock - bs; /* ui[j]: U[i][j], j in its block */

				for (size_t r = 0; r < n_rows; r++) {
					float *xr = x + r * ld;
					/* group_codes' rounding, so a diagonal covariance gives its bytes */
					float v = d[r] != 0.0f ? code_nearest(xr[i], 1.0f / d[r]) : 0.0f;
					float ei = (xr[i] - d[r] * v) / ui[i];

					q[r][i - g0] = (int8_t)v;
					e[r * (b - a) + (i - a)] = ei;
					spread->col(xr + i + 1, ui + i + 1, ei, b - i - 1);
				}
			}
			spread->run(x + b, ld, n_rows, e, b - a, u + a * ublock - bs + b, ublock, end - b);
		}
		for (size_t r = 0; r < n_rows; r++)
			put_group(m, row0 + r, g, quant_f32_to_fp16(d[r]), q[r]);
	}
}

void q6_pack_rows_gptq(struct q6_matrix *m, float *src, size_t ld, const float *u, size_t ublock, size_t row0,
		       size_t n_rows, const struct vec_gptq *spread)
{
	for (size_t i = 0; i < n_rows; i += Q6_GPTQ_ROWS)
		pack_rows_gptq(m, row0 + i, n_rows - i < Q6_GPTQ_ROWS ? n_rows - i : Q6_GPTQ_ROWS, src + i * ld, ld, u,
			       ublock, spread);
	zero_pad_rows(m, row0, n_rows);
}

void q6_unpack_rows(const struct q6_matrix *m, size_t row0, size_t n_rows, float *dst, size_t ld)
{
	for (size_t i = 0; i < n_rows; i++)
		for (size_t k = 0; k < m->cols; k++)
			dst[i * ld + k] = (float)q6_code(m, row0 + i, k) * q6_scale_d(m, row0 + i, k / Q6_GROUP);
}
