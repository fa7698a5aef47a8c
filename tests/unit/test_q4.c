/* Unit tests for the q4 layout and every kernel variant: packing against llama.cpp's own
 * dequantization (kernels/quant.c), each ISA against the scalar reference on random and
 * ragged shapes (W4A8 bit-exact, W4A16 within a stated float bound), the reference
 * against float truth computed here in double, the int8 (embedding/head) layout the same
 * way, and the vector ops against double truth. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"
#include "kernels/dispatch.h"
#include "kernels/gptq.h"
#include "kernels/ops.h"
#include "kernels/pool.h"
#include "kernels/q4.h"
#include "kernels/q6.h"
#include "kernels/q8.h"
#include "kernels/quant.h"
#include "kernels/vec.h"

/* ---- helpers ---- */

static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * UINT64_C(2685821657736338717);
}

static size_t rng_below(uint64_t *s, size_t n)
{
	return (size_t)(rng_next(s) >> 11) % n;
}

/* Uniform in [-1, 1). */
static float rng_unit(uint64_t *s)
{
	return (float)((double)(rng_next(s) >> 11) / 4503599627370496.0 - 1.0);
}

static void *xalloc(size_t n)
{
	void *p = aligned_alloc(64, (n + 63) & ~(size_t)63);

	assert_non_null(p);
	memset(p, 0xA5, n); /* garbage, so nothing relies on zeroed memory */
	return p;
}

static float *random_floats(uint64_t *s, size_t n, float amp)
{
	float *x = xalloc(n * sizeof(float));

	for (size_t i = 0; i < n; i++)
		x[i] = rng_unit(s) * amp;
	return x;
}

/* Every variant to compare with the reference, as available on this CPU. */
static const struct kern_table *variants[3];
static size_t n_variants;

static int setup_variants(void **state)
{
	(void)state;
	n_variants = 0;
	for (int isa = KERN_AVX2; isa <= KERN_AVX512; isa++) {
		const struct kern_table *t = kern_table_for((enum kern_isa)isa);

		if (t)
			variants[n_variants++] = t;
		else
			fprintf(stderr, "# isa %d not available on this cpu: not tested\n", isa);
	}
	return 0;
}

struct case_shape {
	size_t rows, cols, group, n_tok;
	bool asym, row8;
};

static struct case_shape random_shape(uint64_t *s)
{
	struct case_shape c;

	c.group = (size_t)32 << rng_below(s, 3);     /* 32, 64, 128 */
	c.rows = 1 + rng_below(s, 80);             /* mostly not a multiple of 16 */
	c.cols = c.group * (1 + rng_below(s, 384 / c.group));
	/* A quarter are single tokens: the decode GEMV paths differ from the GEMM tiles. */
	c.n_tok = rng_below(s, 4) == 0 ? 1 : 1 + rng_below(s, 33);
	c.asym = rng_below(s, 2);
	c.row8 = c.asym && rng_below(s, 2); /* the 8-bit scale codes of row8 */
	return c;
}

static struct q4_matrix packed_random(uint64_t *s, const struct case_shape *c, float **w_out)
{
	struct q4_matrix m;
	float *w = random_floats(s, c->rows * c->cols, 1.0f);

	if (c->row8)
		assert_int_equal(q4_matrix_plan_row8(&m, c->rows, c->cols, c->group), 0);
	else
		assert_int_equal(q4_matrix_plan(&m, c->rows, c->cols, c->group, c->asym), 0);
	m.data = xalloc(q4_matrix_bytes(&m));
	q4_pack_rows_f32(&m, w, c->cols, NULL, 0, c->rows);
	if (w_out)
		*w_out = w;
	else
		free(w);
	return m;
}

static struct q4_acts make_acts(enum q4_act_kind kind, size_t n_tok, size_t cols, size_t group)
{
	struct q4_acts a;
	size_t bytes = q4_acts_bytes(kind, n_tok, cols, group);

	assert_true(bytes > 0);
	assert_int_equal(q4_acts_init(&a, kind, n_tok, cols, group, xalloc(bytes)), 0);
	return a;
}

/* ---- layout ---- */

static void test_q4_plan_reports_size_and_rejects_bad_shapes(void **state)
{
	struct q4_matrix m;

	(void)state;
	assert_int_equal(q4_matrix_plan(&m, 2048, 6144, 128, true), 0);
	assert_true(fabs(q4_matrix_bpw(&m) - 4.25) < 1e-12);
	assert_int_equal(q4_matrix_bytes(&m), 2048 * 6144 / 2 + 2048 * 48 * 4);
	assert_null(m.data);
	assert_int_equal(q4_matrix_plan(&m, 2048, 6144, 128, false), 0);
	assert_true(fabs(q4_matrix_bpw(&m) - 4.125) < 1e-12);
	assert_int_equal(q4_matrix_plan(&m, 33, 4096, 32, false), 0);
	assert_true(fabs(q4_matrix_bpw(&m) - 4.5) < 1e-12);
	assert_int_equal(m.n_row_blocks, 3);
	assert_int_equal(m.block_bytes % Q4_ALIGN, 0);

	/* row8 at group 64: 64 bytes of per-row fp16 scales a block, then a byte each for d and
	 * m per (row, group): 2048 x 2048 is 4.25 + 32/2048 = 4.265625 bits a weight. */
	assert_int_equal(q4_matrix_plan_row8(&m, 2048, 2048, 64), 0);
	assert_true(m.row8 && m.asym);
	assert_int_equal(m.scale_bytes, 64 + 32 * 32);
	assert_true(fabs(q4_matrix_bpw(&m) - 4.265625) < 1e-12);
	assert_int_equal(q4_matrix_plan_row8(&m, 17, 192, 64), 0);
	assert_int_equal(m.scale_bytes, 192); /* 64 + 3 x 32 = 160, padded */
	assert_int_equal(m.block_bytes, 192 + 16 * 96);
	assert_int_equal(q4_matrix_plan(&m, 16, 128, 64, true), 0);
	assert_true(fabs(q4_matrix_bpw(&m) - 4.5) < 1e-12);
	assert_int_equal(q4_matrix_plan_row8(&m, 16, 96, 64), HEARTH_EINVAL); /* cols % group */
	assert_int_equal(q4_matrix_plan_row8(&m, 16, 64 * (Q4_ROW8_MAX_GROUPS + 1), 64), HEARTH_ERANGE);
	assert_int_equal(q4_matrix_plan(&m, 16, 100, 32, true), HEARTH_EINVAL);  /* cols % group */
	assert_int_equal(q4_matrix_plan(&m, 16, 192, 96, true), HEARTH_EINVAL);  /* group */
	assert_int_equal(q4_matrix_plan(&m, 0, 128, 32, true), HEARTH_EINVAL);
	assert_int_equal(q4_matrix_plan(&m, SIZE_MAX / 4, 1u << 20, 128, true), HEARTH_ERANGE);
	{
		struct q4_matrix w;
		struct q4_acts a = make_acts(Q4_ACT_A8, 2, 256, 128), b = make_acts(Q4_ACT_A16, 1, 256, 32);

		assert_int_equal(q4_matrix_plan(&w, 40, 256, 128, true), 0);
		assert_true(q4_acts_fit(&w, &a));
		assert_false(q4_acts_fit(&w, &b)); /* group differs */
		assert_int_equal(q4_matrix_plan(&w, 40, 512, 128, true), 0);
		assert_false(q4_acts_fit(&w, &a)); /* cols differ */
		free(a.codes);
		free(b.codes);
	}
	assert_int_equal(q4_acts_bytes(Q4_ACT_A8, 1, 100, 32), 0);
	assert_int_equal(q4_acts_bytes(Q4_ACT_A8, SIZE_MAX / 2, 1u << 20, 128), 0);
}

/* Codes are the nearest for the scales as stored: each value is within half a step
 * (plus float rounding) of d*q + m, or lies beyond the end code it was clamped to. */
static void test_q4_pack_f32_asym_codes_nearest_for_stored_scales(void **state)
{
	uint64_t s = 11;

	(void)state;
	for (int it = 0; it < 20; it++) {
		struct case_shape c = random_shape(&s);
		float *w;

		c.asym = true;
		struct q4_matrix m = packed_random(&s, &c, &w);
		float *u = xalloc(c.rows * c.cols * sizeof(float));

		q4_unpack_rows(&m, 0, c.rows, u, c.cols);
		for (size_t r = 0; r < c.rows; r++) {
			for (size_t k = 0; k < c.cols; k++) {
				size_t g = k / c.group;
				double d = q4_scale_d(&m, r, g), mn = q4_scale_m(&m, r, g);
				double x = w[r * c.cols + k], v = u[r * c.cols + k], eps = 1e-6;
				unsigned q = q4_code(&m, r, k);

				assert_true(q <= 15);
				assert_true(d > 0.0);
				/* Below the first code or above the last is clamping, not rounding. */
				bool clamped = (q == 0 && x < v) || (q == 15 && x > v);

				if (!clamped && fabs(v - x) > 0.5 * d + eps)
					fail_msg("row %zu col %zu code %u: %g vs %g (d %g m %g)", r, k, q, v, x, d, mn);
			}
		}
		free(u);
		free(w);
		free(m.data);
	}
}

/* Plain min/max asym quantization of one group, computed here as the rule was before the
 * search: d = (max-min)/15, m = min, both rounded to fp16, nearest codes against them.
 * Returns the sum of squared errors of d*q + m (float) against x, in double. */
/* The min/max fit's squared error, each column's counted w[i] times (w NULL: once). */
static double minmax_group_wsse(const float *x, const float *w, size_t n)
{
	float lo = x[0], hi = x[0];

	for (size_t i = 1; i < n; i++) {
		lo = fminf(lo, x[i]);
		hi = fmaxf(hi, x[i]);
	}
	float d = quant_fp16_to_f32(quant_f32_to_fp16((hi - lo) / 15.0f));
	float m = quant_fp16_to_f32(quant_f32_to_fp16(lo));
	float id = d != 0.0f ? 1.0f / d : 0.0f;
	double e = 0.0;

	for (size_t i = 0; i < n; i++) {
		float v = nearbyintf((x[i] - m) * id);
		float q = v < 0.0f ? 0.0f : v > 15.0f ? 15.0f : v;
		double t = (double)x[i] - (double)(d * q + m);

		e += t * t * (w ? w[i] : 1.0f);
	}
	return e;
}

static double minmax_group_sse(const float *x, size_t n)
{
	return minmax_group_wsse(x, NULL, n);
}

enum group_kind {
	GROUP_UNIFORM, GROUP_NORMALISH, GROUP_CONSTANT, GROUP_OUTLIER, GROUP_NEGATIVE, GROUP_TINY,
	GROUP_FP16_SUBNORMAL, GROUP_F32_DENORMAL, GROUP_TWO_VALUES, GROUP_KINDS
};

static void fill_group(uint64_t *s, enum group_kind kind, float *x, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float u = rng_unit(s);
		float g = (rng_unit(s) + rng_unit(s) + rng_unit(s) + rng_unit(s)) * 0.866f;

		switch (kind) {
		case GROUP_UNIFORM: x[i] = u * 0.7f + 0.1f; break;
		case GROUP_NORMALISH: x[i] = g * 0.02f; break;
		case GROUP_CONSTANT: x[i] = 0.3125f; break;
		case GROUP_OUTLIER: x[i] = i == n / 3 ? 9.0f : g * 0.05f; break;
		case GROUP_NEGATIVE: x[i] = -1.5f - fabsf(g); break;
		case GROUP_TINY: x[i] = g * 1e-3f; break;
		case GROUP_FP16_SUBNORMAL: x[i] = g * 2e-6f; break;       /* d below fp16's 6.1e-5 */
		case GROUP_F32_DENORMAL: x[i] = g * 1e-39f; break;
		case GROUP_TWO_VALUES: x[i] = (i & 1) ? 0.25f : -0.75f; break;
		default: x[i] = 0.0f; break;
		}
	}
}

/* The scale search never ends with more squared error per group than plain min/max, on
 * random groups and on the cases that break naive searches. */
static void test_q4_pack_f32_asym_search_never_worse_than_min_max(void **state)
{
	uint64_t s = 21;
	size_t groups = 0, better = 0;
	double sse_search = 0, sse_plain = 0;

	(void)state;
	for (size_t gi = 0; gi < 2; gi++) {
		const size_t group = gi ? 128 : 32, rows = 16, cols = 2 * group;
		float *w = xalloc(rows * cols * sizeof(float)), *u = xalloc(rows * cols * sizeof(float));
		struct q4_matrix m;

		assert_int_equal(q4_matrix_plan(&m, rows, cols, group, true), 0);
		m.data = xalloc(q4_matrix_bytes(&m));
		for (int it = 0; it < 24; it++) {
			/* Each row a kind; the two groups of a row differ (second one random). */
			for (size_t r = 0; r < rows; r++) {
				fill_group(&s, (enum group_kind)((r + (size_t)it) % GROUP_KINDS), w + r * cols, group);
				fill_group(&s, it % 2 ? GROUP_NORMALISH : GROUP_UNIFORM, w + r * cols + group, group);
			}
			q4_pack_rows_f32(&m, w, cols, NULL, 0, rows);
			q4_unpack_rows(&m, 0, rows, u, cols);
			for (size_t r = 0; r < rows; r++) {
				for (size_t g = 0; g < 2; g++) {
					const float *x = w + r * cols + g * group, *v = u + r * cols + g * group;
					double e = 0.0, p = minmax_group_sse(x, group);

					for (size_t i = 0; i < group; i++)
						e += ((double)x[i] - v[i]) * ((double)x[i] - v[i]);
					if (!(e <= p * (1.0 + 1e-12)))
						fail_msg("group %zu, row %zu (kind %zu) half %zu: search %.9g > min/max %.9g",
							 group, r, (r + (size_t)it) % GROUP_KINDS, g, e, p);
					groups++;
					better += e < p * (1.0 - 1e-6);
					sse_search += e;
					sse_plain += p;
				}
			}
		}
		free(m.data);
		free(w);
		free(u);
	}
	/* And it does find better fits: most random groups improve, the total clearly. */
	assert_true(better > groups / 2);
	assert_true(sse_search < 0.95 * sse_plain);
}

/* Column weights (an imatrix's): weights of 1 give the bytes of no weights; skewed
 * ones are never fitted worse than min/max in the error they weigh, and fit that error
 * better than the unweighted search does; a group whose weights are all 0 is searched as
 * if unweighted. */
static void test_q4_pack_f32_weighted_search(void **state)
{
	uint64_t s = 77;
	double wsse_weighted = 0, wsse_plain = 0;

	(void)state;
	for (size_t gi = 0; gi < 2; gi++) {
		const size_t group = gi ? 128 : 32, rows = 32, cols = 4 * group;
		float *x = xalloc(rows * cols * sizeof(float)), *u = xalloc(rows * cols * sizeof(float));
		float *v = xalloc(rows * cols * sizeof(float)), *w = xalloc(cols * sizeof(float));
		struct q4_matrix a, b;

		assert_int_equal(q4_matrix_plan(&a, rows, cols, group, true), 0);
		assert_int_equal(q4_matrix_plan(&b, rows, cols, group, true), 0);
		a.data = xalloc(q4_matrix_bytes(&a));
		b.data = xalloc(q4_matrix_bytes(&b));
		for (size_t r = 0; r < rows; r++)
			for (size_t g = 0; g < 4; g++)
				fill_group(&s, (enum group_kind)((r + g) % GROUP_KINDS), x + r * cols + g * group, group);
		for (size_t k = 0; k < cols; k++)
			w[k] = 1.0f;
		q4_pack_rows_f32(&a, x, cols, NULL, 0, rows);
		q4_pack_rows_f32(&b, x, cols, w, 0, rows);
		assert_memory_equal(a.data, b.data, q4_matrix_bytes(&a));
		/* the last group's weights all 0: as unweighted */
		for (size_t k = 0; k < cols; k++)
			w[k] = k >= 3 * group ? 0.0f : (float)(1.0 + 50.0 * pow((double)(rng_next(&s) >> 11) * 0x1p-53, 8.0));
		q4_pack_rows_f32(&b, x, cols, w, 0, rows);
		q4_unpack_rows(&a, 0, rows, u, cols);
		q4_unpack_rows(&b, 0, rows, v, cols);
		for (size_t r = 0; r < rows; r++) {
			for (size_t g = 0; g < 4; g++) {
				const float *xg = x + r * cols + g * group, *wg = w + g * group;
				double ew = 0, ep = 0;
				if (g == 3) {
					assert_memory_equal(u + r * cols + g * group, v + r * cols + g * group,
							    group * sizeof(float));
					continue;
				}
				for (size_t i = 0; i < group; i++) {
					double tw = (double)xg[i] - v[r * cols + g * group + i];
					double tp = (double)xg[i] - u[r * cols + g * group + i];
					ew += wg[i] * tw * tw;
					ep += wg[i] * tp * tp;
				}
				double mm = minmax_group_wsse(xg, wg, group);
				if (!(ew <= mm * (1.0 + 1e-12)))
					fail_msg("group %zu row %zu half %zu: weighted %.9g > min/max %.9g", group, r, g, ew, mm);
				wsse_weighted += ew;
				wsse_plain += ep;
			}
		}
		free(a.data);
		free(b.data);
		free(x);
		free(u);
		free(v);
		free(w);
	}
	assert_true(wsse_weighted < 0.97 * wsse_plain);
}

/* The per-group entry bench/fidelity simulates layouts with is the packer's own rule. */
static void test_q4_quantize_group_matches_pack(void **state)
{
	uint64_t s = 22;
	const size_t rows = 3, cols = 256;
	float *w = random_floats(&s, rows * cols, 2.0f);
	struct q4_matrix m;
	uint8_t q[128];

	(void)state;
	assert_int_equal(q4_matrix_plan(&m, rows, cols, 128, true), 0);
	m.data = xalloc(q4_matrix_bytes(&m));
	q4_pack_rows_f32(&m, w, cols, NULL, 0, rows);
	for (size_t r = 0; r < rows; r++) {
		for (size_t g = 0; g < 2; g++) {
			float d, mn;

			q4_quantize_group_f32(w + r * cols + g * 128, NULL, 128, Q4_RULE_ASYM, q, &d, &mn);
			assert_true(d == q4_scale_d(&m, r, g) && mn == q4_scale_m(&m, r, g));
			for (size_t k = 0; k < 128; k++)
				assert_int_equal(q[k], q4_code(&m, r, g * 128 + k));
		}
	}
	/* SYM_SEARCH is the sym packer's rule: same codes and scale. */
	struct q4_matrix ms;
	assert_int_equal(q4_matrix_plan(&ms, rows, cols, 32, false), 0);
	ms.data = xalloc(q4_matrix_bytes(&ms));
	q4_pack_rows_f32(&ms, w, cols, NULL, 0, rows);
	for (size_t r = 0; r < rows; r++) {
		for (size_t g = 0; g < cols / 32; g++) {
			float d, mn;

			q4_quantize_group_f32(w + r * cols + g * 32, NULL, 32, Q4_RULE_SYM_SEARCH, q, &d, &mn);
			assert_true(d == q4_scale_d(&ms, r, g) && mn == q4_scale_m(&ms, r, g));
			for (size_t k = 0; k < 32; k++)
				assert_int_equal(q[k], q4_code(&ms, r, g * 32 + k));
		}
	}
	free(ms.data);
	/* SYM_Q4_0 is llama.cpp's Q4_0 rule: the same values as a Q4_0 round trip. */
	struct block_q4_0 blk;
	float truth[32], d, mn;

	assert_true(quant_quantize_row(QTYPE_Q4_0, w, &blk, 32));
	quant_dequant_row(QTYPE_Q4_0, &blk, truth, 32);
	q4_quantize_group_f32(w, NULL, 32, Q4_RULE_SYM_Q4_0, q, &d, &mn);
	for (size_t k = 0; k < 32; k++)
		assert_true(((float)q[k] - 8.0f) * d == truth[k]);
	free(m.data);
	free(w);
}

/* Squared error of one group quantized by llama.cpp's Q4_0 rule, computed here from a Q4_0
 * round trip through kernels/quant.c (quantize_row_q4_0_ref's rule), independent of q4.c. */
static double q4_0_group_sse(const float *x)
{
	struct block_q4_0 blk;
	float v[QK4_0];
	double e = 0.0;

	assert_true(quant_quantize_row(QTYPE_Q4_0, x, &blk, QK4_0));
	quant_dequant_row(QTYPE_Q4_0, &blk, v, QK4_0);
	for (size_t i = 0; i < QK4_0; i++)
		e += ((double)x[i] - v[i]) * ((double)x[i] - v[i]);
	return e;
}

/* Sym packing from f32 (the weights_group 32 layout) searches each group's scale and never
 * ends with more squared error than llama.cpp's Q4_0 rule, per group, on random groups and
 * on the cases that break naive searches; the values are (q - 8) * d with d as stored. */
static void test_q4_pack_f32_sym_search_never_worse_than_q4_0(void **state)
{
	uint64_t s = 12;
	const size_t rows = 16, cols = 4 * 32;
	float *w = xalloc(rows * cols * sizeof(float)), *u = xalloc(rows * cols * sizeof(float));
	size_t groups = 0, better = 0;
	double sse_search = 0, sse_q4_0 = 0;
	struct q4_matrix m;

	(void)state;
	assert_int_equal(q4_matrix_plan(&m, rows, cols, 32, false), 0);
	m.data = xalloc(q4_matrix_bytes(&m));
	for (int it = 0; it < 40; it++) {
		/* Each row: a special kind, then three random groups of two scales. */
		for (size_t r = 0; r < rows; r++) {
			fill_group(&s, (enum group_kind)((r + (size_t)it) % GROUP_KINDS), w + r * cols, 32);
			for (size_t g = 1; g < 4; g++)
				fill_group(&s, (it + g) % 2 ? GROUP_NORMALISH : GROUP_UNIFORM, w + r * cols + g * 32, 32);
			if (it % 3 == 0) /* negate: Q4_0's scale sign follows the absmax */
				for (size_t k = 0; k < cols; k++)
					w[r * cols + k] = -w[r * cols + k];
		}
		q4_pack_rows_f32(&m, w, cols, NULL, 0, rows);
		q4_unpack_rows(&m, 0, rows, u, cols);
		for (size_t r = 0; r < rows; r++) {
			for (size_t g = 0; g < 4; g++) {
				const float *x = w + r * cols + g * 32, *v = u + r * cols + g * 32;
				double e = 0.0, p = q4_0_group_sse(x);

				for (size_t k = 0; k < 32; k++) {
					unsigned q = q4_code(&m, r, g * 32 + k);
					float d = q4_scale_d(&m, r, g);

					assert_true(v[k] == ((float)q - 8.0f) * d);
					assert_true(q4_scale_m(&m, r, g) == -8.0f * d);
					e += ((double)x[k] - v[k]) * ((double)x[k] - v[k]);
				}
				if (!(e <= p))
					fail_msg("row %zu group %zu (it %d): search %.9g > Q4_0 %.9g", r, g, it, e, p);
				groups++;
				better += e < p * (1.0 - 1e-6);
				sse_search += e;
				sse_q4_0 += p;
			}
		}
	}
	/* And the search pays: most random groups improve, the total by several percent. */
	assert_true(better > groups / 2);
	assert_true(sse_search < 0.93 * sse_q4_0);
	free(m.data);
	free(w);
	free(u);
}

static void random_bytes(uint64_t *s, void *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		((uint8_t *)p)[i] = (uint8_t)rng_next(s);
}

/* A finite fp16 of moderate size and either sign. */
static qfp16 random_half(uint64_t *s)
{
	return quant_f32_to_fp16(rng_unit(s) * 0.05f);
}

static void test_q4_0_carry_over_matches_llama_dequant_exactly(void **state)
{
	uint64_t s = 13;
	const size_t rows = 37, cols = 320, nb = rows * cols / 32;
	struct block_q4_0 *b = xalloc(nb * sizeof(*b));
	float *truth = xalloc(rows * cols * sizeof(float));
	float *u = xalloc(48 * cols * sizeof(float));
	struct q4_matrix m;

	(void)state;
	for (size_t i = 0; i < nb; i++) {
		b[i].d = random_half(&s);
		random_bytes(&s, b[i].qs, sizeof(b[i].qs));
	}
	quant_dequant_row(QTYPE_Q4_0, b, truth, rows * cols);
	assert_int_equal(q4_matrix_plan(&m, rows, cols, 32, true), 0);
	m.data = xalloc(q4_matrix_bytes(&m));
	assert_int_equal(q4_pack_rows_q4_0(&m, b, 0, rows), HEARTH_EINVAL); /* asym matrix */
	free(m.data);
	assert_int_equal(q4_matrix_plan(&m, rows, cols, 32, false), 0);
	m.data = xalloc(q4_matrix_bytes(&m));
	/* The loader's way: a few rows at a time. */
	for (size_t r = 0; r < rows; r += 5) {
		size_t n = rows - r < 5 ? rows - r : 5;

		assert_int_equal(q4_pack_rows_q4_0(&m, b + r * (cols / 32), r, n), 0);
	}
	/* Unpack the pad rows too: they must read as zero weights. */
	q4_unpack_rows(&m, 0, 48, u, cols);
	assert_memory_equal(u, truth, rows * cols * sizeof(float));
	for (size_t i = rows * cols; i < 48 * cols; i++)
		assert_true(u[i] == 0.0f);
	free(b);
	free(truth);
	free(u);
	free(m.data);
}

static void test_q4_1_carry_over_matches_llama_dequant_exactly(void **state)
{
	uint64_t s = 14;
	const size_t rows = 19, cols = 128, nb = rows * cols / 32;
	struct block_q4_1 *b = xalloc(nb * sizeof(*b));
	float *truth = xalloc(rows * cols * sizeof(float)), *u = xalloc(rows * cols * sizeof(float));
	struct q4_matrix m;

	(void)state;
	for (size_t i = 0; i < nb; i++) {
		b[i].d = random_half(&s);
		b[i].m = random_half(&s);
		random_bytes(&s, b[i].qs, sizeof(b[i].qs));
	}
	quant_dequant_row(QTYPE_Q4_1, b, truth, rows * cols);
	assert_int_equal(q4_matrix_plan(&m, rows, cols, 32, true), 0);
	m.data = xalloc(q4_matrix_bytes(&m));
	assert_int_equal(q4_pack_rows_q4_1(&m, b, 0, rows), 0);
	q4_unpack_rows(&m, 0, rows, u, cols);
	assert_memory_equal(u, truth, rows * cols * sizeof(float));
	free(b);
	free(truth);
	free(u);
	free(m.data);
}

/* Q4_K's sub-block scale d*sc and min dmin*m are re-rounded to fp16: each weight is off
 * by at most 15 * |d*sc| * 2^-11 + |dmin*m| * 2^-11 (half an fp16 ulp each). */
static void test_q4_k_carry_over_within_fp16_scale_rounding(void **state)
{
	uint64_t s = 15;
	const size_t rows = 17, cols = 512, nb = rows * cols / 256;
	struct block_q4_K *b = xalloc(nb * sizeof(*b));
	float *truth = xalloc(rows * cols * sizeof(float)), *u = xalloc(rows * cols * sizeof(float));
	struct q4_matrix m;
	size_t n_exact = 0;

	(void)state;
	for (size_t i = 0; i < nb; i++) {
		b[i].d = quant_f32_to_fp16(fabsf(rng_unit(&s)) * 0.01f);
		b[i].dmin = quant_f32_to_fp16(fabsf(rng_unit(&s)) * 0.01f);
		random_bytes(&s, b[i].scales, sizeof(b[i].scales));
		random_bytes(&s, b[i].qs, sizeof(b[i].qs));
	}
	quant_dequant_row(QTYPE_Q4_K, b, truth, rows * cols);
	assert_int_equal(q4_matrix_plan(&m, rows, cols, 32, true), 0);
	m.data = xalloc(q4_matrix_bytes(&m));
	assert_int_equal(q4_pack_rows_q4_k(&m, b, 0, rows), 0);
	q4_unpack_rows(&m, 0, rows, u, cols);
	for (size_t i = 0; i < rows * cols; i++) {
		const struct block_q4_K *blk = &b[i / 256];
		double bound = (15.0 * 63.0 * quant_fp16_to_f32(blk->d) + 63.0 * quant_fp16_to_f32(blk->dmin)) /
			       2048.0 + 1e-7;

		assert_true(fabs((double)u[i] - truth[i]) <= bound);
		n_exact += u[i] == truth[i];
	}
	assert_true(n_exact > 0);
	free(b);
	free(truth);
	free(u);
	free(m.data);
}

/* Row blocks are shared by 16 rows; packing them a few at a time, out of order, must give
 * the same bytes as packing all at once. */
static void test_q4_pack_rows_in_pieces_gives_same_bytes(void **state)
{
	uint64_t s = 16;
	const size_t rows = 45, cols = 256;
	float *w = random_floats(&s, rows * cols, 1.0f);
	struct q4_matrix a, b;

	(void)state;
	for (int row8 = 0; row8 < 2; row8++) {
		if (row8)
			assert_int_equal(q4_matrix_plan_row8(&a, rows, cols, 64), 0);
		else
			assert_int_equal(q4_matrix_plan(&a, rows, cols, 128, true), 0);
		b = a;
		a.data = xalloc(q4_matrix_bytes(&a));
		b.data = xalloc(q4_matrix_bytes(&b));
		memset(b.data, 0xA5, q4_matrix_bytes(&b));
		q4_pack_rows_f32(&a, w, cols, NULL, 0, rows);
		static const size_t order[][2] = { { 40, 5 }, { 3, 10 }, { 0, 3 }, { 13, 27 } };
		for (size_t i = 0; i < 4; i++)
			q4_pack_rows_f32(&b, w + order[i][0] * cols, cols, NULL, order[i][0], order[i][1]);
		/* only the bytes the layout defines: scale padding is never read */
		for (size_t r = 0; r < a.n_row_blocks * Q4_ROWS; r++) {
			for (size_t g = 0; g < a.n_groups; g++) {
				assert_true(q4_scale_d(&a, r, g) == q4_scale_d(&b, r, g));
				assert_true(q4_scale_m(&a, r, g) == q4_scale_m(&b, r, g));
			}
			for (size_t k = 0; k < cols; k++)
				assert_int_equal(q4_code(&a, r, k), q4_code(&b, r, k));
		}
		free(a.data);
		free(b.data);
	}
	free(w);
}

/* row8 keeps the search's fit but for rounding each group's d and m to 8-bit multiples of
 * the row's scales: on every kind of group its squared error stays within a few percent
 * of the same search with fp16 d and m at group 64 (the bound the encoding was chosen
 * for), pad rows read as zero, and carried-over codes are refused (they have their own
 * fp16 scales). */
static void test_q4_row8_close_to_fp16_scales(void **state)
{
	uint64_t s = 88;
	const size_t rows = 40, cols = 1024;
	float *w = xalloc(rows * cols * sizeof(float)), *u = xalloc(16 * 3 * cols * sizeof(float));
	float *v = xalloc(16 * 3 * cols * sizeof(float));
	struct q4_matrix a, b;
	double ea = 0, eb = 0;

	(void)state;
	for (size_t r = 0; r < rows; r++)
		for (size_t g = 0; g < cols / 64; g++)
			fill_group(&s, r % 4 == 3 ? GROUP_OUTLIER : GROUP_NORMALISH, w + r * cols + g * 64, 64);
	assert_int_equal(q4_matrix_plan(&a, rows, cols, 64, true), 0);
	assert_int_equal(q4_matrix_plan_row8(&b, rows, cols, 64), 0);
	assert_true(b.block_bytes < a.block_bytes);
	a.data = xalloc(q4_matrix_bytes(&a));
	b.data = xalloc(q4_matrix_bytes(&b));
	q4_pack_rows_f32(&a, w, cols, NULL, 0, rows);
	q4_pack_rows_f32(&b, w, cols, NULL, 0, rows);
	q4_unpack_rows(&a, 0, 48, u, cols);
	q4_unpack_rows(&b, 0, 48, v, cols);
	for (size_t i = 0; i < rows * cols; i++) {
		ea += ((double)w[i] - u[i]) * ((double)w[i] - u[i]);
		eb += ((double)w[i] - v[i]) * ((double)w[i] - v[i]);
	}
	for (size_t i = rows * cols; i < 48 * cols; i++)
		assert_true(v[i] == 0.0f);
	if (!(eb <= 1.05 * ea))
		fail_msg("row8 squared error %g against fp16 scales' %g", eb, ea);
	assert_true(eb > 0.0);
	fprintf(stderr, "# row8 / fp16-scale squared error at group 64: %.4f\n", eb / ea);
	struct block_q4_1 blk[1024 / 32];
	struct q4_matrix c;
	memset(blk, 0, sizeof blk);
	assert_int_equal(q4_matrix_plan_row8(&c, 1, 1024, 32), 0); /* Q4_1's own group and kind */
	c.data = xalloc(q4_matrix_bytes(&c));
	assert_int_equal(q4_pack_rows_q4_1(&c, blk, 0, 1), HEARTH_EINVAL);
	assert_int_equal(q4_pack_rows_q4_k(&c, blk, 0, 1), HEARTH_EINVAL);
	free(c.data);
	free(a.data);
	free(b.data);
	free(w);
	free(u);
	free(v);
}

/* ---- GPTQ ---- */

/* h (d x d) = sum x x^T over the n_tok rows of x, in double. */
static void gptq_cov_of(const float *x, size_t d, size_t n_tok, float *h)
{
	for (size_t i = 0; i < d; i++)
		for (size_t j = 0; j < d; j++) {
			double v = 0;
			for (size_t t = 0; t < n_tok; t++)
				v += (double)x[t * d + i] * x[t * d + j];
			h[i * d + j] = (float)v;
		}
}

/* The full d x d h in the blocked layout of blocks of nb (kernels/gptq.h) into hb. */
static void gptq_blocked(const float *h, size_t d, size_t nb, float *hb)
{
	for (size_t i = 0; i < d; i++)
		for (size_t c = 0; c < nb; c++) {
			size_t j = i / nb * nb + c;
			hb[i * nb + c] = j < d ? h[i * d + j] : 0.0f;
		}
}

/* An input covariance with real structure: tokens x = A z over n_tok tokens, A mixing d
 * latent factors with a few strong ones, so columns correlate and differ in scale. h
 * receives sum x x^T (full), x (n_tok x d) the tokens. */
static void gptq_tokens(uint64_t *s, size_t d, size_t n_tok, float *x, float *h)
{
	float *a = xalloc(d * d * sizeof(float));
	for (size_t i = 0; i < d * d; i++)
		a[i] = rng_unit(s) * (i % d < 4 ? 3.0f : 0.3f);
	for (size_t t = 0; t < n_tok; t++) {
		float z[512];
		for (size_t k = 0; k < d; k++)
			z[k] = rng_unit(s);
		for (size_t i = 0; i < d; i++) {
			float v = 0;
			for (size_t k = 0; k < d; k++)
				v += a[i * d + k] * z[k];
			x[t * d + i] = v;
		}
	}
	gptq_cov_of(x, d, n_tok, h);
	free(a);
}

/* The layouts GPTQ is held to: row8 group 64, asym group 128, sym group 32 (kind 2, 1, 0). */
struct gptq_layout {
	size_t group;
	int kind;
};
#define GPTQ_LAYOUTS { { 64, 2 }, { 128, 1 }, { 32, 0 } }

static void gptq_plan(struct q4_matrix *m, size_t rows, size_t cols, size_t group, int kind)
{
	if (kind == 2)
		assert_int_equal(q4_matrix_plan_row8(m, rows, cols, group), 0);
	else
		assert_int_equal(q4_matrix_plan(m, rows, cols, group, kind), 0);
	m->data = xalloc(q4_matrix_bytes(m));
	memset(m->data, 0, q4_matrix_bytes(m));
}

static void test_gptq_factor_inverts_the_dampened_covariance(void **state)
{
	uint64_t s = 401;
	const size_t d = 48, n_tok = 200;
	float *x = xalloc(n_tok * d * sizeof(float)), *h = xalloc(d * d * sizeof(float));
	float *u = xalloc(d * d * sizeof(float));

	(void)state;
	gptq_tokens(&s, d, n_tok, x, h);
	h[5 * d + 5] = 0.0f; /* a column no token reached: the damping alone holds it */
	for (size_t j = 0; j < d; j++)
		h[5 * d + j] = h[j * d + 5] = 0.0f;
	double add = gptq_damping(h, d, d, 0), mean = 0;
	for (size_t i = 0; i < d; i++)
		mean += h[i * d + i] / (double)d;
	assert_true(fabs(add - GPTQ_DAMP * mean) <= 1e-9 * add);
	/* from 4d tokens: a quarter of the mean more */
	assert_true(fabs(gptq_damping(h, d, d, 4.0 * d) - (GPTQ_DAMP + 0.25) * mean) <= 1e-9 * mean);
	assert_int_equal(gptq_factor_blocks(h, d, d, add, -1.0, u), 0);
	/* U^T U (H + damp) = I, U upper */
	for (size_t i = 0; i < d; i++)
		for (size_t j = 0; j < d; j++) {
			if (j < i)
				assert_true(u[i * d + j] == 0.0f);
			double v = 0;
			for (size_t k = 0; k < d; k++) {
				double uu = 0;
				for (size_t l = 0; l < d; l++)
					uu += (double)u[l * d + i] * u[l * d + k];
				v += uu * ((double)h[k * d + j] + (k == j ? add : 0.0));
			}
			if (fabs(v - (i == j)) > 1e-3)
				fail_msg("(U^T U H)[%zu][%zu] = %g", i, j, v);
		}
	/* In blocks of 20 (the last 8 wide) each block is its own factor, padded with zeros:
	 * the blocked layout keeps row i's block's columns. */
	const size_t nb = 20;
	float *hb = xalloc(d * nb * sizeof(float)), *ub = xalloc(d * nb * sizeof(float));
	float *uf = xalloc(nb * nb * sizeof(float));
	gptq_blocked(h, d, nb, hb);
	assert_int_equal(gptq_factor_blocks(hb, d, nb, add, -1.0, ub), 0);
	for (size_t b = 0; b < d; b += nb) {
		size_t n = d - b < nb ? d - b : nb;
		assert_int_equal(gptq_factor(h + b * d + b, d, n, add, 1.0, uf, nb), 0);
		for (size_t i = 0; i < n; i++)
			for (size_t c = 0; c < nb; c++)
				assert_true(ub[(b + i) * nb + c] == (c < n ? uf[i * nb + c] : 0.0f));
	}
	/* shared among 2 to 4 threads' parts (3 blocks: 4 parts leave one none), the same factor */
	for (size_t parts = 2; parts <= 4; parts++) {
		float *up = xalloc(d * nb * sizeof(float));
		memset(up, 0xff, d * nb * sizeof(float));
		for (size_t p = 0; p < parts; p++)
			assert_int_equal(gptq_factor_blocks_part(hb, d, nb, add, -1.0, up, p, parts), 0);
		assert_memory_equal(up, ub, d * nb * sizeof(float));
		free(up);
	}
	/* not a covariance: refused */
	h[0] = -1e6f;
	assert_int_equal(gptq_factor_blocks(h, d, d, add, -1.0, u), -1);
	assert_int_equal(gptq_factor(h, d, 0, add, 1.0, u, d), -1);
	assert_int_equal(gptq_factor_blocks(h, d, d + 1, add, -1.0, u), -1);
	free(x);
	free(h);
	free(u);
	free(hb);
	free(ub);
	free(uf);
}

/* gptq_keep: the sample covariance of independent columns is its tokens' noise, and keeps
 * (nearly) none of it; strongly correlated columns keep nearly all; the same columns over
 * fewer tokens keep less. */
static void test_gptq_keep_tells_correlation_from_noise(void **state)
{
	uint64_t s = 404;
	const size_t d = 48, n_tok = 400;
	float *x = xalloc(n_tok * d * sizeof(float)), *h = xalloc(d * d * sizeof(float));

	(void)state;
	for (size_t i = 0; i < n_tok * d; i++)
		x[i] = rng_unit(&s);
	gptq_cov_of(x, d, n_tok, h);
	double indep = gptq_keep(h, d, d, (double)n_tok);
	gptq_tokens(&s, d, n_tok, x, h);
	double corr = gptq_keep(h, d, d, (double)n_tok), fewer = gptq_keep(h, d, d, n_tok / 20.0);
	fprintf(stderr, "# gptq_keep: independent %.3f, correlated %.3f (as if from 20 tokens %.3f)\n", indep, corr,
		fewer);
	assert_true(indep < 0.1);
	assert_true(corr > 0.9);
	assert_true(fewer < corr);
	free(x);
	free(h);
}

/* With a diagonal covariance no error moves: GPTQ's bytes are the plain packer's steered
 * by the same diagonal, in every layout; and so with a full covariance none of whose
 * off-diagonal gptq_keep keeps (one token behind it). */
static void test_gptq_diagonal_covariance_gives_plain_packing(void **state)
{
	uint64_t s = 402;
	const size_t rows = 21, cols = 256;
	float *w = random_floats(&s, rows * cols, 0.1f), *x = xalloc(rows * cols * sizeof(float));
	float *h = xalloc(cols * cols * sizeof(float)), *u = xalloc(cols * cols * sizeof(float));
	float *cw = xalloc(cols * sizeof(float));

	(void)state;
	for (size_t i = 0; i < cols; i++)
		for (size_t j = 0; j < cols; j++)
			h[i * cols + j] = i == j ? 0.0f : 0.3f * rng_unit(&s);
	for (size_t i = 0; i < cols; i++)
		h[i * cols + i] = cw[i] = 0.5f + fabsf(rng_unit(&s)) * 4.0f;
	/* one token behind correlations this weak: all of them noise, none kept */
	assert_true(gptq_keep(h, cols, cols, 1.0) == 0.0);
	assert_int_equal(gptq_factor_blocks(h, cols, cols, gptq_damping(h, cols, cols, 0), 1.0, u), 0);
	const struct gptq_layout lay[] = GPTQ_LAYOUTS;
	for (size_t k = 0; k < sizeof lay / sizeof lay[0]; k++) {
		struct q4_matrix a, b;
		gptq_plan(&a, rows, cols, lay[k].group, lay[k].kind);
		gptq_plan(&b, rows, cols, lay[k].group, lay[k].kind);
		q4_pack_rows_f32(&a, w, cols, cw, 0, rows);
		memcpy(x, w, rows * cols * sizeof(float));
		q4_pack_rows_gptq(&b, x, cols, cw, u, cols, 0, rows, &vec_gptq_ref, &q4_search_ref);
		assert_memory_equal(a.data, b.data, q4_matrix_bytes(&a));
		free(a.data);
		free(b.data);
	}
	free(w);
	free(x);
	free(h);
	free(u);
	free(cw);
}

/* On correlated inputs GPTQ's product error ||X (W - Q)||^2 is well below rounding each
 * weight to its nearest (steered by the same diagonal), in every layout, with the whole
 * covariance and with it in blocks of 48 (the last 32 wide), which keeps less of it: the
 * blocked error lies between the two. */
static double gptq_product_error(const float *w, const float *q, const float *tok, size_t rows, size_t cols,
				 size_t n_tok)
{
	double e = 0;
	for (size_t t = 0; t < n_tok; t++)
		for (size_t r = 0; r < rows; r++) {
			double dd = 0;
			for (size_t c = 0; c < cols; c++)
				dd += ((double)w[r * cols + c] - q[r * cols + c]) * tok[t * cols + c];
			e += dd * dd;
		}
	return e;
}

/* Correlated tokens (gptq_tokens), their covariance whole and in blocks of nb, and the
 * GPTQ factor of each at the default damping: what the product-error tests round against. */
struct gptq_fix {
	size_t cols, n_tok, nb;
	float *tok, *h, *u, *hb, *ub;
};

static void gptq_fix_make(struct gptq_fix *f, uint64_t *s, size_t cols, size_t n_tok, size_t nb)
{
	*f = (struct gptq_fix){ cols, n_tok, nb, xalloc(n_tok * cols * sizeof(float)), xalloc(cols * cols * sizeof(float)),
				xalloc(cols * cols * sizeof(float)), xalloc(cols * nb * sizeof(float)),
				xalloc(cols * nb * sizeof(float)) };
	gptq_tokens(s, cols, n_tok, f->tok, f->h);
	gptq_blocked(f->h, cols, nb, f->hb);
	double add = gptq_damping(f->h, cols, cols, 0);
	assert_int_equal(gptq_factor_blocks(f->h, cols, cols, add, -1.0, f->u), 0);
	assert_int_equal(gptq_factor_blocks(f->hb, cols, nb, add, -1.0, f->ub), 0);
}

static void gptq_fix_free(struct gptq_fix *f)
{
	free(f->tok);
	free(f->h);
	free(f->u);
	free(f->hb);
	free(f->ub);
}

/* GPTQ's product error (eb[0] whole, eb[1] blocked) well below the nearest codes' (ea),
 * the blocked one between the two. */
static void gptq_gain_check(const char *what, double ea, const double *eb, size_t nb)
{
	fprintf(stderr, "# %s: gptq / nearest product error whole %.3f, blocks of %zu %.3f\n", what, eb[0] / ea, nb,
		eb[1] / ea);
	if (!(eb[0] < 0.7 * ea) || !(eb[0] < eb[1]) || !(eb[1] < ea))
		fail_msg("%s: GPTQ product error %g (blocks %g) against nearest %g", what, eb[0], eb[1], ea);
}

static void test_gptq_lowers_the_product_error(void **state)
{
	uint64_t s = 403;
	const size_t rows = 24, cols = 128, n_tok = 512, nb = 48;
	float *cw = xalloc(cols * sizeof(float));
	float *w = random_floats(&s, rows * cols, 0.05f), *x = xalloc(rows * cols * sizeof(float));
	float *qa = xalloc(32 * cols * sizeof(float)), *qb = xalloc(32 * cols * sizeof(float));
	struct gptq_fix f;

	(void)state;
	gptq_fix_make(&f, &s, cols, n_tok, nb);
	for (size_t i = 0; i < cols; i++)
		cw[i] = f.h[i * cols + i];
	const struct gptq_layout lay[] = GPTQ_LAYOUTS;
	for (size_t k = 0; k < sizeof lay / sizeof lay[0]; k++) {
		struct q4_matrix a, b;
		gptq_plan(&a, rows, cols, lay[k].group, lay[k].kind);
		gptq_plan(&b, rows, cols, lay[k].group, lay[k].kind);
		q4_pack_rows_f32(&a, w, cols, cw, 0, rows);
		q4_unpack_rows(&a, 0, 32, qa, cols);
		double ea = gptq_product_error(w, qa, f.tok, rows, cols, n_tok), eb[2];
		for (int blocked = 0; blocked < 2; blocked++) {
			memcpy(x, w, rows * cols * sizeof(float));
			q4_pack_rows_gptq(&b, x, cols, cw, blocked ? f.ub : f.u, blocked ? nb : cols, 0, rows,
					  &vec_gptq_ref, &q4_search_ref);
			q4_unpack_rows(&b, 0, 32, qb, cols);
			for (size_t i = rows * cols; i < 32 * cols; i++)
				assert_true(qb[i] == 0.0f);
			eb[blocked] = gptq_product_error(w, qb, f.tok, rows, cols, n_tok);
		}
		/* Rows are rounded side by side only to share U's reads: in calls of 1, 5 and 18
		 * rows (partial batches), and with every ISA's corrections, the bytes are the same. */
		for (int isa = KERN_REF; isa <= KERN_AVX512; isa++) {
			const struct kern_table *kt = kern_table_for((enum kern_isa)isa);
			if (!kt)
				continue;
			struct q4_matrix c;
			gptq_plan(&c, rows, cols, lay[k].group, lay[k].kind);
			memcpy(x, w, rows * cols * sizeof(float));
			q4_pack_rows_gptq(&c, x, cols, cw, f.ub, nb, 0, 1, kt->gptq, kt->search);
			q4_pack_rows_gptq(&c, x + cols, cols, cw, f.ub, nb, 1, 5, kt->gptq, kt->search);
			q4_pack_rows_gptq(&c, x + 6 * cols, cols, cw, f.ub, nb, 6, 18, kt->gptq, kt->search);
			assert_memory_equal(c.data, b.data, q4_matrix_bytes(&b));
			free(c.data);
		}
		char what[64];
		snprintf(what, sizeof what, "int4 group %zu kind %d", lay[k].group, lay[k].kind);
		gptq_gain_check(what, ea, eb, nb);
		free(a.data);
		free(b.data);
	}
	gptq_fix_free(&f);
	free(cw);
	free(w);
	free(x);
	free(qa);
	free(qb);
}

/* The int6 head's GPTQ (q6_pack_rows_gptq) held as q4's: a covariance whose off-diagonal
 * is all noise gives q6_pack_rows_f32's bytes; on correlated inputs the product error is
 * well below the nearest codes', whole or in blocks of 48 (between the two), in the
 * textbook's floats (q6_gptq_textbook: column by column); and calls of
 * 1, 5 and 15 rows with every ISA's corrections give the same bytes. */
static void q6_gptq_plan(struct q6_matrix *m, size_t rows, size_t cols)
{
	assert_int_equal(q6_matrix_plan(m, rows, cols), 0);
	m->data = xalloc(q6_matrix_bytes(m));
	memset(m->data, 0, q6_matrix_bytes(m));
}

/* GPTQ as its paper states it, one row and one column at a time, each error taken off
 * every later column of its block at once (sub_scaled alone): rows x turned into d * q. */
static void q6_gptq_textbook(float *x, size_t rows, size_t cols, const float *u, size_t ublock)
{
	int8_t q[Q6_GROUP];
	float d;

	for (size_t r = 0; r < rows; r++) {
		float *xr = x + r * cols;

		for (size_t g0 = 0; g0 < cols; g0 += Q6_GROUP) {
			q6_quantize_group_f32(xr + g0, q, &d);
			for (size_t i = g0; i < g0 + Q6_GROUP; i++) {
				size_t bs = i / ublock * ublock, end = bs + ublock < cols ? bs + ublock : cols;
				const float *ui = u + i * ublock - bs;
				float v = d != 0.0f ? nearbyintf(xr[i] * (1.0f / d)) : 0.0f;

				v = v > 31.0f ? 31.0f : v < -32.0f ? -32.0f : v;
				vec_sub_scaled_ref(xr + i + 1, ui + i + 1, (xr[i] - d * v) / ui[i], end - i - 1);
				xr[i] = (float)(int8_t)v * d; /* as q6_unpack_rows: a code of -0 is 0 */
			}
		}
	}
}

static void test_q6_gptq_is_plain_on_a_diagonal_and_lowers_the_product_error(void **state)
{
	uint64_t s = 404;
	const size_t rows = 21, cols = 128, n_tok = 512, nb = 48;
	float *h = xalloc(cols * cols * sizeof(float)), *u = xalloc(cols * cols * sizeof(float));
	float *w = random_floats(&s, rows * cols, 0.05f), *x = xalloc(rows * cols * sizeof(float));
	float *qa = xalloc(rows * cols * sizeof(float)), *qb = xalloc(rows * cols * sizeof(float));
	struct q6_matrix a, b, c;
	struct gptq_fix f;

	(void)state;
	/* Correlations one token cannot support: none kept, the plain bytes. */
	for (size_t i = 0; i < cols; i++)
		for (size_t j = 0; j < cols; j++)
			h[i * cols + j] = i == j ? 0.5f + fabsf(rng_unit(&s)) * 4.0f : 0.3f * rng_unit(&s);
	assert_true(gptq_keep(h, cols, cols, 1.0) == 0.0);
	assert_int_equal(gptq_factor_blocks(h, cols, cols, gptq_damping(h, cols, cols, 0), 1.0, u), 0);
	q6_gptq_plan(&a, rows, cols);
	q6_gptq_plan(&b, rows, cols);
	q6_pack_rows_f32(&a, w, cols, 0, rows);
	memcpy(x, w, rows * cols * sizeof(float));
	q6_pack_rows_gptq(&b, x, cols, u, cols, 0, rows, &vec_gptq_ref);
	assert_memory_equal(a.data, b.data, q6_matrix_bytes(&a));

	gptq_fix_make(&f, &s, cols, n_tok, nb);
	q6_unpack_rows(&a, 0, rows, qa, cols);
	double ea = gptq_product_error(w, qa, f.tok, rows, cols, n_tok), eb[2];
	for (int blocked = 0; blocked < 2; blocked++) {
		memcpy(x, w, rows * cols * sizeof(float));
		q6_pack_rows_gptq(&b, x, cols, blocked ? f.ub : f.u, blocked ? nb : cols, 0, rows, &vec_gptq_ref);
		q6_unpack_rows(&b, 0, rows, qb, cols);
		eb[blocked] = gptq_product_error(w, qb, f.tok, rows, cols, n_tok);
		/* the packer's batched corrections are the textbook's column-by-column floats */
		memcpy(x, w, rows * cols * sizeof(float));
		q6_gptq_textbook(x, rows, cols, blocked ? f.ub : f.u, blocked ? nb : cols);
		assert_memory_equal(x, qb, rows * cols * sizeof(float));
	}
	for (int isa = KERN_REF; isa <= KERN_AVX512; isa++) {
		const struct kern_table *kt = kern_table_for((enum kern_isa)isa);
		if (!kt)
			continue;
		q6_gptq_plan(&c, rows, cols);
		memcpy(x, w, rows * cols * sizeof(float));
		q6_pack_rows_gptq(&c, x, cols, f.ub, nb, 0, 1, kt->gptq);
		q6_pack_rows_gptq(&c, x + cols, cols, f.ub, nb, 1, 5, kt->gptq);
		q6_pack_rows_gptq(&c, x + 6 * cols, cols, f.ub, nb, 6, 15, kt->gptq);
		assert_memory_equal(c.data, b.data, q6_matrix_bytes(&b));
		free(c.data);
	}
	gptq_gain_check("int6", ea, eb, nb);
	free(a.data);
	free(b.data);
	gptq_fix_free(&f);
	free(h);
	free(u);
	free(w);
	free(x);
	free(qa);
	free(qb);
}

/* The scale search's steps in every ISA: q4_group_codes the reference's codes and error
 * bits, q4_grid_sums its lane sums, on groups of 8 to 256 with ones and with skewed weights, against scales as the
 * search makes them (min/max, a grid, fp16-rounded) and ones whose range leaves the
 * rounding trick's (the reference's own path), or with every mantissa bit (row8's, where
 * a fused multiply-add would round differently); and whole matrices packed through each
 * ISA's (q4_pack_rows_f32_k) are the reference's bytes in every layout. */
static void test_q4_group_codes_every_isa_matches_reference(void **state)
{
	uint64_t s = 405;
	static const size_t ns[] = { 8, 32, 64, 128, 256 };
	float x[256], w[256], ones[256];
	uint8_t qr[256], qi[256];

	(void)state;
	for (size_t i = 0; i < 256; i++)
		ones[i] = 1.0f;
	for (int it = 0; it < 400; it++) {
		size_t n = ns[it % 5];
		float scale = it % 7 == 0 ? 1e-4f : it % 7 == 1 ? 300.0f : 1.0f;
		float lo = INFINITY, hi = -INFINITY;
		for (size_t i = 0; i < n; i++) {
			x[i] = rng_unit(&s) * scale + (i % 13 == 0 ? 3.0f * scale : 0.0f);
			w[i] = 0.01f + fabsf(rng_unit(&s)) * (i % 5 == 0 ? 40.0f : 1.0f);
			lo = x[i] < lo ? x[i] : lo;
			hi = x[i] > hi ? x[i] : hi;
		}
		float d = quant_fp16_to_f32(quant_f32_to_fp16((hi - lo) / (13.0f + (float)(it % 5))));
		float m = quant_fp16_to_f32(quant_f32_to_fp16(lo + (it % 3) * 0.01f * scale));
		if (it % 4 == 3) { /* row8's scales: products of two floats, every mantissa bit used */
			d = (hi - lo) / 14.37f * (1.0f + 1e-3f * rng_unit(&s));
			m = lo * 1.0173f;
		}
		if (it % 11 == 0)
			d = (hi - lo) * 1e-7f; /* codes far past 2^20 steps: the reference's own path */
		if (it % 17 == 0)
			d = 0.0f;
		const float *wt = it % 2 ? w : ones;
		double er = q4_group_codes_ref(x, wt, n, lo, hi, d, m, qr);
		for (int isa = KERN_AVX2; isa <= KERN_AVX512; isa++) {
			const struct kern_table *kt = kern_table_for((enum kern_isa)isa);
			if (!kt)
				continue;
			memset(qi, 0xee, sizeof qi);
			double ei = kt->search->codes(x, wt, n, lo, hi, d, m, qi);
			assert_memory_equal(qi, qr, n);
			if (memcmp(&ei, &er, sizeof er))
				fail_msg("%s: group of %zu (iteration %d): error %.17g, the reference's %.17g", kt->name, n,
					 it, ei, er);
			/* the grid's sums at one of the search's step counts over the group's range */
			if (hi > lo) {
				float is = (14.0f + 0.25f * (float)(it % 8)) / (hi - lo), r[3][8], v[3][8];
				q4_grid_sums_ref(x, wt, n, lo, is, r[0], r[1], r[2]);
				kt->search->grid(x, wt, n, lo, is, v[0], v[1], v[2]);
				assert_memory_equal(v, r, sizeof r);
			}
		}
	}
	const size_t rows = 19, cols = 512;
	float *src = random_floats(&s, rows * cols, 0.08f), *cw = random_floats(&s, cols, 1.0f);
	for (size_t i = 0; i < cols; i++)
		cw[i] = 0.05f + fabsf(cw[i]) * (i % 9 == 0 ? 30.0f : 1.0f);
	const struct gptq_layout lay[] = GPTQ_LAYOUTS;
	for (size_t k = 0; k < sizeof lay / sizeof lay[0]; k++)
		for (int weighted = 0; weighted < 2; weighted++) {
			struct q4_matrix a;
			gptq_plan(&a, rows, cols, lay[k].group, lay[k].kind);
			q4_pack_rows_f32(&a, src, cols, weighted ? cw : NULL, 0, rows);
			for (int isa = KERN_REF; isa <= KERN_AVX512; isa++) {
				const struct kern_table *kt = kern_table_for((enum kern_isa)isa);
				if (!kt)
					continue;
				struct q4_matrix b;
				gptq_plan(&b, rows, cols, lay[k].group, lay[k].kind);
				q4_pack_rows_f32_k(&b, src, cols, weighted ? cw : NULL, 0, rows, kt->search);
				assert_memory_equal(b.data, a.data, q4_matrix_bytes(&a));
				free(b.data);
			}
			free(a.data);
		}
	free(src);
	free(cw);
}

/* ---- activations ---- */

static void test_q4_acts_a8_every_isa_matches_reference_bytes(void **state)
{
	uint64_t s = 21;

	(void)state;
	for (int it = 0; it < 30; it++) {
		struct case_shape c = random_shape(&s);
		float *x = random_floats(&s, c.n_tok * c.cols, 4.0f);
		struct q4_acts ref = make_acts(Q4_ACT_A8, c.n_tok, c.cols, c.group);

		if (it == 0)
			memset(x, 0, c.cols * sizeof(float)); /* an all-zero token: scale 0 */
		q4_acts_prepare_ref(&ref, x, c.cols, 0, c.n_tok);
		for (size_t v = 0; v < n_variants; v++) {
			struct q4_acts a = make_acts(Q4_ACT_A8, c.n_tok, c.cols, c.group);

			variants[v]->acts_prepare(&a, x, c.cols, 0, c.n_tok);
			assert_memory_equal(a.codes, ref.codes, c.n_tok * c.cols);
			assert_memory_equal(a.scale, ref.scale, c.n_tok * a.n_groups * sizeof(float));
			assert_memory_equal(a.sum, ref.sum, c.n_tok * a.n_groups * sizeof(float));
			free(a.codes);
		}
		/* Independent truth: |x - scale*q| <= scale/2 and |q| <= 127. */
		for (size_t t = 0; t < c.n_tok; t++) {
			for (size_t k = 0; k < c.cols; k++) {
				int8_t q = ((int8_t *)ref.codes)[t * c.cols + k];
				float sc = ref.scale[t * ref.n_groups + k / c.group];

				assert_true(q >= -127);
				assert_true(fabsf(x[t * c.cols + k] - sc * q) <= sc * 0.5f * 1.0001f);
			}
		}
		free(ref.codes);
		free(x);
	}
}

static void test_q4_acts_a16_every_isa_matches_reference(void **state)
{
	uint64_t s = 22;

	(void)state;
	for (int it = 0; it < 30; it++) {
		struct case_shape c = random_shape(&s);
		float *x = random_floats(&s, c.n_tok * c.cols, 4.0f);
		struct q4_acts ref = make_acts(Q4_ACT_A16, c.n_tok, c.cols, c.group);

		/* Rounding edge cases: ties, the largest finite values, infinities, NaN, denormals. */
		static const uint32_t edge[] = { 0x3f808000, 0x3f818000, 0x7f7fffff, 0xff7fffff, 0x7f800000,
						 0xff800000, 0x7fc00001, 0x7f800001, 0x00000001, 0x807fffff };
		for (size_t i = 0; i < sizeof(edge) / sizeof(edge[0]) && i < c.cols; i++)
			memcpy(&x[i], &edge[i], 4);
		q4_acts_prepare_ref(&ref, x, c.cols, 0, c.n_tok);
		/* Truth: each column's bf16 sits where q4_a16_index says. */
		for (size_t t = 0; t < c.n_tok; t++)
			for (size_t k = 0; k < c.cols; k++)
				assert_int_equal(((uint16_t *)ref.codes)[t * c.cols + q4_a16_index(k)],
						 quant_f32_to_bf16(x[t * c.cols + k]));
		for (size_t v = 0; v < n_variants; v++) {
			struct q4_acts a = make_acts(Q4_ACT_A16, c.n_tok, c.cols, c.group);

			variants[v]->acts_prepare(&a, x, c.cols, 0, c.n_tok);
			assert_memory_equal(a.codes, ref.codes, c.n_tok * c.cols * 2);
			/* Sums of <= 128 values of |x| <= 4: order changes them by <= 128 ulp(512).
			 * (The first group of token 0 holds the edge values: inf/NaN sums.) */
			for (size_t i = 1; i < c.n_tok * a.n_groups; i++)
				assert_true(fabsf(a.sum[i] - ref.sum[i]) <= 128 * 512 * 1.2e-7f);
			free(a.codes);
		}
		free(ref.codes);
		free(x);
	}
}

/* ---- matmul ---- */

static float *nan_filled(size_t n)
{
	float *y = xalloc(n * sizeof(float));

	for (size_t i = 0; i < n; i++)
		y[i] = NAN;
	return y;
}

/* Runs a variant over [0, rows) split at a row block boundary, as two threads would. */
static void matmul_split(const struct kern_table *k, const struct q4_matrix *m, const struct q4_acts *a,
			 float *y, size_t split)
{
	k->matmul(m, a, y, m->rows, 0, split);
	k->matmul(m, a, y, m->rows, split, m->rows);
}

static void test_q4_w4a8_every_isa_bit_exact_vs_reference(void **state)
{
	uint64_t s = 31;

	(void)state;
	for (int it = 0; it < 60; it++) {
		struct case_shape c = random_shape(&s);
		struct q4_matrix m = packed_random(&s, &c, NULL);
		float *x = random_floats(&s, c.n_tok * c.cols, 2.0f);
		struct q4_acts a = make_acts(Q4_ACT_A8, c.n_tok, c.cols, c.group);
		float *ref = nan_filled(c.n_tok * c.rows);
		size_t split = Q4_ROWS * rng_below(&s, m.n_row_blocks + 1);

		if (split > c.rows)
			split = c.rows;
		q4_acts_prepare_ref(&a, x, c.cols, 0, c.n_tok);
		q4_matmul_ref(&m, &a, ref, c.rows, 0, c.rows);
		for (size_t v = 0; v < n_variants; v++) {
			float *y = nan_filled(c.n_tok * c.rows);

			matmul_split(variants[v], &m, &a, y, split);
			if (memcmp(y, ref, c.n_tok * c.rows * sizeof(float)) != 0)
				fail_msg("%s: rows %zu cols %zu group %zu tokens %zu asym %d row8 %d differs",
					 variants[v]->name, c.rows, c.cols, c.group, c.n_tok, c.asym, c.row8);
			free(y);
		}
		free(m.data);
		free(x);
		free(a.codes);
		free(ref);
	}
}

/* |d*q + m| summed over the row, weighted by |x|: the scale of the float error. With
 * 128+q inside the AVX-512 path the accumulator holds up to 143*|d|*sum|x| per group. */
static double a16_error_scale(const struct q4_matrix *m, const struct q4_acts *a, size_t r, size_t t)
{
	double b = 0.0;

	for (size_t g = 0; g < m->n_groups; g++) {
		double sx = 0.0;

		for (size_t k = g * m->group; k < (g + 1) * m->group; k++)
			sx += fabs(quant_bf16_to_f32(((uint16_t *)a->codes)[t * a->cols + q4_a16_index(k)]));
		b += (143.0 * fabs(q4_scale_d(m, r, g)) + fabs(q4_scale_m(m, r, g))) * sx;
	}
	return b;
}

/* Float sums in different orders: each path rounds at most ~(terms per chain + groups)
 * times, about 40 unit roundoffs (2.4e-6) of the error scale in the worst case for these
 * shapes; 1e-5 leaves a 4x margin while still catching any wrong code, scale or column. */
static void test_q4_w4a16_every_isa_close_to_reference(void **state)
{
	uint64_t s = 32;

	(void)state;
	for (int it = 0; it < 60; it++) {
		struct case_shape c = random_shape(&s);
		struct q4_matrix m = packed_random(&s, &c, NULL);
		float *x = random_floats(&s, c.n_tok * c.cols, 2.0f);
		struct q4_acts a = make_acts(Q4_ACT_A16, c.n_tok, c.cols, c.group);
		float *ref = nan_filled(c.n_tok * c.rows);
		size_t split = Q4_ROWS * rng_below(&s, m.n_row_blocks + 1);

		if (split > c.rows)
			split = c.rows;
		q4_acts_prepare_ref(&a, x, c.cols, 0, c.n_tok);
		q4_matmul_ref(&m, &a, ref, c.rows, 0, c.rows);
		for (size_t v = 0; v < n_variants; v++) {
			float *y = nan_filled(c.n_tok * c.rows);

			matmul_split(variants[v], &m, &a, y, split);
			for (size_t t = 0; t < c.n_tok; t++) {
				for (size_t r = 0; r < c.rows; r++) {
					double e = fabs((double)y[t * c.rows + r] - ref[t * c.rows + r]);
					double tol = 1e-5 * a16_error_scale(&m, &a, r, t);

					if (!(e <= tol))
						fail_msg("%s: rows %zu cols %zu group %zu tok %zu: row %zu token %zu "
							 "%g vs %g (tol %g)", variants[v]->name, c.rows, c.cols,
							 c.group, c.n_tok, r, t, y[t * c.rows + r], ref[t * c.rows + r], tol);
				}
			}
			free(y);
		}
		free(m.data);
		free(x);
		free(a.codes);
		free(ref);
	}
}

/* The reference itself against a double dot of the unpacked weights with x: A8 may be off
 * by the activation rounding (|x - s*q| <= s/2 per column), A16 by bf16 rounding (2^-9
 * relative per column), plus float noise. */
static void test_q4_reference_matches_double_truth(void **state)
{
	uint64_t s = 33;

	(void)state;
	for (int it = 0; it < 20; it++) {
		struct case_shape c = random_shape(&s);
		struct q4_matrix m = packed_random(&s, &c, NULL);
		float *x = random_floats(&s, c.n_tok * c.cols, 2.0f);
		float *u = xalloc(c.rows * c.cols * sizeof(float));

		q4_unpack_rows(&m, 0, c.rows, u, c.cols);
		for (int kind = Q4_ACT_A8; kind <= Q4_ACT_A16; kind += 8) {
			struct q4_acts a = make_acts((enum q4_act_kind)kind, c.n_tok, c.cols, c.group);
			float *y = nan_filled(c.n_tok * c.rows);

			q4_acts_prepare_ref(&a, x, c.cols, 0, c.n_tok);
			q4_matmul_ref(&m, &a, y, c.rows, 0, c.rows);
			for (size_t t = 0; t < c.n_tok; t++) {
				for (size_t r = 0; r < c.rows; r++) {
					double dot = 0.0, bound = 0.0, mag = 0.0;

					for (size_t k = 0; k < c.cols; k++) {
						double wk = u[r * c.cols + k], xk = x[t * c.cols + k];

						dot += wk * xk;
						mag += fabs(wk * xk);
						if (kind == Q4_ACT_A8)
							bound += fabs(wk) * 0.5 * a.scale[t * a.n_groups + k / c.group];
						else
							bound += fabs(wk * xk) / 512.0;
					}
					bound += 1e-4 * mag + 1e-6;
					assert_true(fabs(y[t * c.rows + r] - dot) <= bound);
				}
			}
			free(a.codes);
			free(y);
		}
		free(m.data);
		free(x);
		free(u);
	}
}

/* Rows outside [row_begin, row_end) belong to other threads: never written. */
static void test_q4_matmul_writes_only_its_rows(void **state)
{
	uint64_t s = 34;
	struct case_shape c = { .rows = 70, .cols = 256, .group = 128, .n_tok = 3, .asym = true };
	struct q4_matrix m = packed_random(&s, &c, NULL);
	float *x = random_floats(&s, c.n_tok * c.cols, 1.0f);

	(void)state;
	for (int kind = Q4_ACT_A8; kind <= Q4_ACT_A16; kind += 8) {
		struct q4_acts a = make_acts((enum q4_act_kind)kind, c.n_tok, c.cols, c.group);

		q4_acts_prepare_ref(&a, x, c.cols, 0, c.n_tok);
		for (size_t v = 0; v <= n_variants; v++) {
			const struct kern_table *k = v < n_variants ? variants[v] : kern_table_for(KERN_REF);
			float *y = nan_filled(c.n_tok * c.rows);

			k->matmul(&m, &a, y, c.rows, 16, 48);
			for (size_t t = 0; t < c.n_tok; t++)
				for (size_t r = 0; r < c.rows; r++)
					assert_true(isnan(y[t * c.rows + r]) == (r < 16 || r >= 48));
			free(y);
		}
		free(a.codes);
	}
	free(m.data);
	free(x);
}

/* The way the engine runs a matmul: every pool thread takes whole row blocks of the
 * output (pool_split); the result must equal one thread doing all rows, bit for bit. */
struct pool_matmul {
	const struct kern_table *k;
	const struct q4_matrix *m;
	struct q4_acts *a;
	const float *x;
	float *y;
};

static void pool_matmul_fn(void *arg, size_t t, size_t n, struct pool *p)
{
	struct pool_matmul *j = arg;
	size_t b, e;

	/* Tokens are prepared in parallel too, then a barrier before the matmul reads them. */
	pool_split(j->a->n_tok, 1, t, n, &b, &e);
	j->k->acts_prepare(j->a, j->x, j->a->cols, b, e);
	pool_barrier(p);
	pool_split(j->m->rows, Q4_ROWS, t, n, &b, &e);
	j->k->matmul(j->m, j->a, j->y, j->m->rows, b, e);
}

static struct pool *test_pool;

static void pool_matmul_entry(void *arg, size_t t, size_t n)
{
	pool_matmul_fn(arg, t, n, test_pool);
}

static void test_q4_matmul_on_pool_equals_one_thread(void **state)
{
	uint64_t s = 35;

	(void)state;
	assert_int_equal(pool_create(&test_pool, 3, NULL, 0, 0), 0);
	for (int it = 0; it < 10; it++) {
		struct case_shape c = random_shape(&s);
		struct q4_matrix m = packed_random(&s, &c, NULL);
		float *x = random_floats(&s, c.n_tok * c.cols, 1.0f);

		for (int kind = Q4_ACT_A8; kind <= Q4_ACT_A16; kind += 8) {
			const struct kern_table *k = kern_best();
			struct q4_acts a1 = make_acts((enum q4_act_kind)kind, c.n_tok, c.cols, c.group);
			struct q4_acts an = make_acts((enum q4_act_kind)kind, c.n_tok, c.cols, c.group);
			float *y1 = nan_filled(c.n_tok * c.rows), *yn = nan_filled(c.n_tok * c.rows);
			struct pool_matmul j = { .k = k, .m = &m, .a = &an, .x = x, .y = yn };

			k->acts_prepare(&a1, x, c.cols, 0, c.n_tok);
			k->matmul(&m, &a1, y1, c.rows, 0, c.rows);
			pool_run(test_pool, pool_matmul_entry, &j);
			assert_memory_equal(y1, yn, c.n_tok * c.rows * sizeof(float));
			free(a1.codes);
			free(an.codes);
			free(y1);
			free(yn);
		}
		free(m.data);
		free(x);
	}
	pool_destroy(test_pool);
}

/* ---- int6 layout (embedding / head) ---- */

static void test_q6_plan_reports_size_and_rejects_bad_shapes(void **state)
{
	struct q6_matrix m;

	(void)state;
	assert_int_equal(q6_matrix_plan(&m, 100, 2048), 0);
	assert_int_equal(m.n_row_blocks, 7);
	assert_true(m.data == NULL);
	/* 6 bits of code and 16 bits of scale per 32 weights: nothing else is stored. */
	assert_true(q6_matrix_bpw(&m) == 6.5);
	assert_int_equal(q6_matrix_bytes(&m), 7 * (16 * 2048 * 6 / 8 + 16 * 64 * 2));
	assert_int_equal(q6_matrix_plan(&m, 16, 96), 0);
	assert_int_equal(m.scale_bytes, 128); /* 3 x 32 bytes of d, padded to a line */
	assert_int_equal(q6_matrix_plan(&m, 0, 64), HEARTH_EINVAL);
	assert_int_equal(q6_matrix_plan(&m, 4, 48), HEARTH_EINVAL);
	assert_int_equal(q6_matrix_plan(&m, 4, 32 * (Q6_MAX_GROUPS + 1)), HEARTH_ERANGE);
	assert_int_equal(q6_matrix_plan(&m, 4, 32 * Q6_MAX_GROUPS), 0);
}

/* The plain rule the search starts from: d = absmax/31 as fp16, nearest codes. */
static double q6_absmax_error(const float *x)
{
	float amax = 0.0f, d;
	double e = 0.0;

	for (int i = 0; i < 32; i++)
		amax = fmaxf(amax, fabsf(x[i]));
	d = quant_fp16_to_f32(quant_f32_to_fp16(amax / 31.0f));
	for (int i = 0; i < 32; i++) {
		float v = d > 0.0f ? nearbyintf(x[i] * (1.0f / d)) : 0.0f;
		double t = (double)x[i] - (double)(v * d);

		e += t * t;
	}
	return e;
}

static void test_q6_pack_f32_within_half_step_and_never_worse_than_absmax(void **state)
{
	uint64_t s = 61;
	const size_t rows = 37, cols = 160, padded = 48;
	float *w = random_floats(&s, rows * cols, 2.0f), *u = xalloc(padded * cols * sizeof(float));
	struct q6_matrix m;
	double sum_search = 0.0, sum_absmax = 0.0;

	(void)state;
	/* Outliers, a zero group and a group of one sign: the search's edge cases. */
	for (size_t r = 0; r < rows; r += 5)
		w[r * cols + (r * 7) % cols] *= 9.0f;
	for (size_t k = 0; k < 32; k++) {
		w[3 * cols + 32 + k] = 0.0f;
		w[4 * cols + 64 + k] = fabsf(w[4 * cols + 64 + k]);
	}
	assert_int_equal(q6_matrix_plan(&m, rows, cols), 0);
	m.data = xalloc(q6_matrix_bytes(&m));
	for (size_t r = 0; r < rows; r += 5)
		q6_pack_rows_f32(&m, w + r * cols, cols, r, rows - r < 5 ? rows - r : 5);
	q6_unpack_rows(&m, 0, padded, u, cols);
	for (size_t r = 0; r < rows; r++) {
		for (size_t g = 0; g < m.n_groups; g++) {
			float d = q6_scale_d(&m, r, g);
			double e = 0.0;

			for (size_t k = g * 32; k < g * 32 + 32; k++) {
				float t = u[r * cols + k] - w[r * cols + k];

				assert_true(q6_code(&m, r, k) >= -32 && q6_code(&m, r, k) <= 31);
				assert_true(u[r * cols + k] == (float)q6_code(&m, r, k) * d);
				assert_true(fabsf(t) <= 0.5f * d * 1.001f + 1e-7f);
				e += (double)t * t;
			}
			double e0 = q6_absmax_error(w + r * cols + g * 32);

			assert_true(e <= e0);
			sum_search += e;
			sum_absmax += e0;
		}
	}
	for (size_t i = rows * cols; i < padded * cols; i++)
		assert_true(u[i] == 0.0f);
	/* The search is worth its time: clearly below the plain rule over the matrix. */
	assert_true(sum_search < 0.9 * sum_absmax);
	free(w);
	free(u);
	free(m.data);
}

/* Packing is deterministic and rows packed in any order give the same bytes. */
static void test_q6_pack_same_bytes_in_any_row_order(void **state)
{
	uint64_t s = 62;
	const size_t rows = 21, cols = 96;
	float *w = random_floats(&s, rows * cols, 1.0f);
	struct q6_matrix a, b;

	(void)state;
	assert_int_equal(q6_matrix_plan(&a, rows, cols), 0);
	b = a;
	a.data = xalloc(q6_matrix_bytes(&a));
	b.data = xalloc(q6_matrix_bytes(&b));
	q6_pack_rows_f32(&a, w, cols, 0, rows);
	for (size_t r = rows; r-- > 0;)
		q6_pack_rows_f32(&b, w + r * cols, cols, r, 1);
	assert_memory_equal(a.data, b.data, q6_matrix_bytes(&a));
	free(w);
	free(a.data);
	free(b.data);
}

/* A reference matmul (int6 or int8 weights u, unpacked; activations at a's group) against
 * the double-precision dot: within half an activation step per weight for A8, bf16
 * rounding for A16. */
static void assert_ref_near_truth(const float *ref, const float *u, const float *x, const struct q4_acts *a,
				  size_t n_tok, size_t rows, size_t cols)
{
	for (size_t t = 0; t < n_tok; t++) {
		for (size_t r = 0; r < rows; r++) {
			double dot = 0.0, bound = 1e-6, scale = 0.0;

			for (size_t k = 0; k < cols; k++) {
				double wk = u[r * cols + k], xk = x[t * cols + k];

				dot += wk * xk;
				scale += fabs(wk * xk);
				bound += a->kind == Q4_ACT_A8 ? fabs(wk) * 0.5 * a->scale[t * a->n_groups + k / a->group]
							      : fabs(wk * xk) / 512.0;
			}
			assert_true(fabs(ref[t * rows + r] - dot) <= bound + 1e-4 * scale);
		}
	}
}
static void test_q6_matmul_every_isa_matches_reference_and_truth(void **state)
{
	uint64_t s = 63;

	(void)state;
	for (int it = 0; it < 36; it++) {
		/* The last case has enough groups that the SIMD kernels split the tokens by
		 * their table of activation sums. */
		bool wide = it == 35;
		size_t rows = wide ? 19 : 1 + rng_below(&s, 70);
		size_t cols = wide ? 32 * 1500 : 32 * (1 + rng_below(&s, 12));
		size_t n_tok = wide ? 11 : it % 3 == 0 ? 1 : 1 + rng_below(&s, 20);
		float *w = random_floats(&s, rows * cols, 1.0f);
		float *x = random_floats(&s, n_tok * cols, 2.0f), *u = xalloc(rows * cols * sizeof(float));
		struct q6_matrix m;

		assert_int_equal(q6_matrix_plan(&m, rows, cols), 0);
		m.data = xalloc(q6_matrix_bytes(&m));
		q6_pack_rows_f32(&m, w, cols, 0, rows);
		size_t split = Q4_ROWS * rng_below(&s, m.n_row_blocks + 1);

		if (split > rows)
			split = rows;
		q6_unpack_rows(&m, 0, rows, u, cols);
		for (int kind = Q4_ACT_A8; kind <= Q4_ACT_A16; kind += 8) {
			struct q4_acts a = make_acts((enum q4_act_kind)kind, n_tok, cols, 32);
			float *ref = nan_filled(n_tok * rows);

			q4_acts_prepare_ref(&a, x, cols, 0, n_tok);
			q6_matmul_ref(&m, &a, ref, rows, 0, rows);
			assert_ref_near_truth(ref, u, x, &a, n_tok, rows, cols);
			for (size_t v = 0; v < n_variants; v++) {
				float *y = nan_filled(n_tok * rows);

				variants[v]->q6_matmul(&m, &a, y, rows, 0, split);
				variants[v]->q6_matmul(&m, &a, y, rows, split, rows);
				if (kind == Q4_ACT_A8) {
					if (memcmp(y, ref, n_tok * rows * sizeof(float)) != 0)
						fail_msg("%s: W6A8 rows %zu cols %zu tokens %zu differs", variants[v]->name,
							 rows, cols, n_tok);
				} else {
					/* AVX-512 sums (128 + nibble) * x and takes 2208 * sum(x) back out
					 * per group, so its error scales with 2208 |d| sum|x|. */
					for (size_t t = 0; t < n_tok; t++) {
						for (size_t r = 0; r < rows; r++) {
							double sc = 0.0;

							for (size_t k = 0; k < cols; k++)
								sc += 2208.0 * fabs(q6_scale_d(&m, r, k / 32)) * fabs(x[t * cols + k]);
							if (!(fabs(y[t * rows + r] - ref[t * rows + r]) <= 1e-5 * sc + 1e-30))
								fail_msg("%s: W6A16 rows %zu cols %zu tokens %zu: %g vs %g",
									 variants[v]->name, rows, cols, n_tok,
									 (double)y[t * rows + r], (double)ref[t * rows + r]);
						}
					}
				}
				free(y);
			}
			free(a.codes);
			free(ref);
		}
		free(w);
		free(x);
		free(u);
		free(m.data);
	}
}

/* ---- int8 layout (embedding / head) ---- */

static struct q8_matrix q8_from_q8_0(uint64_t *s, size_t rows, size_t cols, struct block_q8_0 **blocks)
{
	size_t nb = rows * cols / 32;
	struct block_q8_0 *b = xalloc(nb * sizeof(*b));
	struct q8_matrix m;

	for (size_t i = 0; i < nb; i++) {
		b[i].d = random_half(s);
		random_bytes(s, b[i].qs, sizeof(b[i].qs)); /* includes -128 */
	}
	assert_int_equal(q8_matrix_plan(&m, rows, cols, 32), 0);
	m.data = xalloc(q8_matrix_bytes(&m));
	for (size_t r = 0; r < rows; r += 7)
		assert_int_equal(q8_pack_rows_q8_0(&m, b + r * (cols / 32), r, rows - r < 7 ? rows - r : 7), 0);
	*blocks = b;
	return m;
}

static void test_q8_0_carry_over_matches_llama_dequant_exactly(void **state)
{
	uint64_t s = 51;
	const size_t rows = 35, cols = 192;
	struct block_q8_0 *b;
	struct q8_matrix m = q8_from_q8_0(&s, rows, cols, &b);
	float *truth = xalloc(rows * cols * sizeof(float)), *u = xalloc(48 * cols * sizeof(float));

	(void)state;
	quant_dequant_row(QTYPE_Q8_0, b, truth, rows * cols);
	q8_unpack_rows(&m, 0, 48, u, cols);
	assert_memory_equal(u, truth, rows * cols * sizeof(float));
	for (size_t i = rows * cols; i < 48 * cols; i++)
		assert_true(u[i] == 0.0f);
	struct q8_matrix g128;

	assert_int_equal(q8_matrix_plan(&g128, rows, 256, 128), 0);
	assert_int_equal(q8_pack_rows_q8_0(&g128, b, 0, 1), HEARTH_EINVAL);
	free(b);
	free(truth);
	free(u);
	free(m.data);
}

static void test_q8_pack_f32_round_trips_within_half_step(void **state)
{
	uint64_t s = 52;
	const size_t rows = 20, cols = 256;
	float *w = random_floats(&s, rows * cols, 2.0f), *u = xalloc(rows * cols * sizeof(float));
	struct q8_matrix m;

	(void)state;
	assert_int_equal(q8_matrix_plan(&m, rows, cols, 128), 0);
	m.data = xalloc(q8_matrix_bytes(&m));
	q8_pack_rows_f32(&m, w, cols, 0, rows);
	q8_unpack_rows(&m, 0, rows, u, cols);
	for (size_t r = 0; r < rows; r++) {
		for (size_t k = 0; k < cols; k++) {
			float d = q8_scale_d(&m, r, k / 128);

			assert_true(abs(q8_code(&m, r, k)) <= 127);
			assert_true(fabsf(u[r * cols + k] - w[r * cols + k]) <= 0.5f * d * 1.001f + 1e-7f);
		}
	}
	free(w);
	free(u);
	free(m.data);
}

static void test_q8_matmul_every_isa_matches_reference_and_truth(void **state)
{
	uint64_t s = 53;

	(void)state;
	for (int it = 0; it < 45; it++) {
		/* group 32 carried over from Q8_0 (codes include -128), 64 and 128 packed from f32
		 * (the mix rule's layer copies, the int8 head) */
		size_t group = (size_t)32 << (it % 3);
		size_t rows = 1 + rng_below(&s, 70), cols = group * (1 + rng_below(&s, 256 / group));
		size_t n_tok = it % 4 == 0 ? 1 : 1 + rng_below(&s, 20);
		struct block_q8_0 *b = NULL;
		struct q8_matrix m;
		if (group == 32) {
			m = q8_from_q8_0(&s, rows, cols, &b);
		} else {
			float *w = random_floats(&s, rows * cols, 1.5f);
			assert_int_equal(q8_matrix_plan(&m, rows, cols, group), 0);
			m.data = xalloc(q8_matrix_bytes(&m));
			q8_pack_rows_f32(&m, w, cols, 0, rows);
			free(w);
		}
		float *x = random_floats(&s, n_tok * cols, 2.0f), *u = xalloc(rows * cols * sizeof(float));
		size_t split = Q4_ROWS * rng_below(&s, m.n_row_blocks + 1);

		if (split > rows)
			split = rows;
		q8_unpack_rows(&m, 0, rows, u, cols);
		for (int kind = Q4_ACT_A8; kind <= Q4_ACT_A16; kind += 8) {
			struct q4_acts a = make_acts((enum q4_act_kind)kind, n_tok, cols, group);
			float *ref = nan_filled(n_tok * rows);

			q4_acts_prepare_ref(&a, x, cols, 0, n_tok);
			q8_matmul_ref(&m, &a, ref, rows, 0, rows);
			assert_ref_near_truth(ref, u, x, &a, n_tok, rows, cols);
			for (size_t v = 0; v < n_variants; v++) {
				float *y = nan_filled(n_tok * rows);

				variants[v]->q8_matmul(&m, &a, y, rows, 0, split);
				variants[v]->q8_matmul(&m, &a, y, rows, split, rows);
				if (kind == Q4_ACT_A8) {
					if (memcmp(y, ref, n_tok * rows * sizeof(float)) != 0)
						fail_msg("%s: W8A8 rows %zu cols %zu group %zu tokens %zu differs",
							 variants[v]->name, rows, cols, group, n_tok);
				} else {
					/* Float sums in other orders. AVX-512 sums (128 + nibble) * x and
					 * takes 2304 * sum(x) back out per group, so its error scales with
					 * 2304 |d| sum|x| (as 143 |d| sum|x| for q4), not with sum|w x|. */
					for (size_t t = 0; t < n_tok; t++) {
						for (size_t r = 0; r < rows; r++) {
							double sc = 0.0;

							for (size_t k = 0; k < cols; k++)
								sc += 2304.0 * fabs(q8_scale_d(&m, r, k / group)) * fabs(x[t * cols + k]);
							assert_true(fabs(y[t * rows + r] - ref[t * rows + r]) <= 1e-5 * sc + 1e-30);
						}
					}
				}
				free(y);
			}
			free(a.codes);
			free(ref);
		}
		free(b);
		free(x);
		free(u);
		free(m.data);
	}
}

/* ---- vector ops, against double truth computed here ---- */

static void test_vec_rmsnorm_every_isa_matches_double(void **state)
{
	uint64_t s = 41;

	(void)state;
	for (size_t n = 1; n < 300; n += 37) {
		float *x = random_floats(&s, n, 3.0f), *w = random_floats(&s, n, 1.0f);
		double ss = 0.0;

		for (size_t i = 0; i < n; i++)
			ss += (double)x[i] * x[i];
		double scale = 1.0 / sqrt(ss / (double)n + 1e-5);

		for (size_t v = 0; v <= n_variants; v++) {
			const struct kern_table *k = v < n_variants ? variants[v] : kern_table_for(KERN_REF);
			float *out = xalloc(n * sizeof(float));

			k->rmsnorm(out, x, w, n, 1e-5f);
			for (size_t i = 0; i < n; i++)
				assert_true(fabs(out[i] - x[i] * scale * w[i]) <= 1e-5 * fabs(x[i] * scale) + 1e-7);
			if (k->isa == KERN_REF) {
				/* The same arithmetic as the reference engine's RMSNorm, bit for bit. */
				float *want = xalloc(n * sizeof(float));

				ops_ref_rmsnorm(want, x, w, n, 1e-5f);
				assert_memory_equal(out, want, n * sizeof(float));
				free(want);
			}
			free(out);
		}
		free(x);
		free(w);
	}
}

static void test_vec_rope_every_isa_matches_double(void **state)
{
	uint64_t s = 42;
	const size_t head_dim = 80, n_rot = 76, n_heads = 3, half = n_rot / 2, pos = 1234;
	float *cos_tab = xalloc((pos + 1) * half * sizeof(float)), *sin_tab = xalloc((pos + 1) * half * sizeof(float));

	(void)state;
	vec_rope_table(cos_tab, sin_tab, pos + 1, n_rot, 10000.0f, 1.0f, NULL);
	/* The table follows theta_i = pos * base^(-2i/n_rot) (to float precision). */
	for (size_t i = 0; i < half; i++) {
		double ang = (double)pos * pow(10000.0, -2.0 * (double)i / (double)n_rot);

		assert_true(fabs(cos_tab[pos * half + i] - cos(ang)) < 2e-3);
		assert_true(fabs(sin_tab[pos * half + i] - sin(ang)) < 2e-3);
	}
	for (int style = VEC_ROPE_NORM; style <= VEC_ROPE_NEOX; style += 2) {
		float *x = random_floats(&s, n_heads * head_dim, 1.0f);

		for (size_t v = 0; v <= n_variants; v++) {
			const struct kern_table *k = v < n_variants ? variants[v] : kern_table_for(KERN_REF);
			float *y = xalloc(n_heads * head_dim * sizeof(float));
			const float *c = cos_tab + pos * half, *sn = sin_tab + pos * half;

			memcpy(y, x, n_heads * head_dim * sizeof(float));
			k->rope(y, n_heads, head_dim, n_rot, (enum vec_rope_style)style, c, sn);
			for (size_t h = 0; h < n_heads; h++) {
				const float *xv = x + h * head_dim;
				const float *yv = y + h * head_dim;

				for (size_t i = 0; i < half; i++) {
					size_t a = style == VEC_ROPE_NEOX ? i : 2 * i;
					size_t b = style == VEC_ROPE_NEOX ? i + half : 2 * i + 1;
					double ya = (double)xv[a] * c[i] - (double)xv[b] * sn[i];
					double yb = (double)xv[a] * sn[i] + (double)xv[b] * c[i];

					assert_true(fabs(yv[a] - ya) < 1e-6 && fabs(yv[b] - yb) < 1e-6);
				}
				for (size_t i = n_rot; i < head_dim; i++)
					assert_true(yv[i] == xv[i]);
			}
			free(y);
		}
		free(x);
	}
	free(cos_tab);
	free(sin_tab);
}

/* The table-driven RoPE must rotate exactly as the reference engine's ops_ref_rope (which
 * builds angles as llama.cpp does), with and without frequency factors. */
static void test_vec_rope_table_matches_ops_ref_rope(void **state)
{
	uint64_t s = 45;
	const size_t head_dim = 64, n_rot = 48, half = n_rot / 2, n_heads = 2, n_pos = 2048;
	static const int positions[] = { 0, 1, 777, 2047 };
	float *cos_tab = xalloc(n_pos * half * sizeof(float)), *sin_tab = xalloc(n_pos * half * sizeof(float));
	float *ff = random_floats(&s, half, 0.5f);

	(void)state;
	for (size_t i = 0; i < half; i++)
		ff[i] += 1.5f;
	for (int with_ff = 0; with_ff <= 1; with_ff++) {
		vec_rope_table(cos_tab, sin_tab, n_pos, n_rot, 1000000.0f, 0.5f, with_ff ? ff : NULL);
		for (int style = VEC_ROPE_NORM; style <= VEC_ROPE_NEOX; style += 2) {
			for (size_t pi = 0; pi < sizeof(positions) / sizeof(positions[0]); pi++) {
				int pos = positions[pi];
				float *x = random_floats(&s, n_heads * head_dim, 1.0f);
				float *want = xalloc(n_heads * head_dim * sizeof(float));
				float *got = xalloc(n_heads * head_dim * sizeof(float));

				memcpy(want, x, n_heads * head_dim * sizeof(float));
				ops_ref_rope(want, n_heads, head_dim, n_rot, (enum ops_rope_style)style, pos, 1000000.0f,
					     0.5f, with_ff ? ff : NULL);
				for (size_t v = 0; v <= n_variants; v++) {
					const struct kern_table *k = v < n_variants ? variants[v] : kern_table_for(KERN_REF);

					memcpy(got, x, n_heads * head_dim * sizeof(float));
					k->rope(got, n_heads, head_dim, n_rot, (enum vec_rope_style)style,
						cos_tab + (size_t)pos * half, sin_tab + (size_t)pos * half);
					if (k->isa == KERN_REF)
						assert_memory_equal(got, want, n_heads * head_dim * sizeof(float));
					for (size_t i = 0; i < n_heads * head_dim; i++)
						assert_true(fabsf(got[i] - want[i]) <= 1e-6f);
				}
				free(x);
				free(want);
				free(got);
			}
		}
	}
	free(cos_tab);
	free(sin_tab);
	free(ff);
}

/* The gated activations act(gate) * up of every ISA against the formula in double, on
 * random gates of |x| < range plus -100 (exp overflow territory: -0), 100 and 0. */
enum gated_act { GATED_SILU, GATED_GELU };

static double gated_act_double(enum gated_act act, double x)
{
	if (act == GATED_SILU)
		return x / (1.0 + exp(-x));
	return 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}

static void check_gated_act_every_isa(enum gated_act act, uint64_t s, float range, double rel, double abs_tol)
{
	const size_t n = 203;
	float *g = random_floats(&s, n, range), *u = random_floats(&s, n, 2.0f);

	g[0] = -100.0f;
	g[1] = 100.0f;
	g[2] = 0.0f;
	for (size_t v = 0; v <= n_variants; v++) {
		const struct kern_table *k = v < n_variants ? variants[v] : kern_table_for(KERN_REF);
		float *y = xalloc(n * sizeof(float));

		memcpy(y, g, n * sizeof(float));
		(act == GATED_SILU ? k->silu_mul : k->gelu_mul)(y, u, n);
		for (size_t i = 0; i < n; i++) {
			double t = gated_act_double(act, g[i]) * u[i];

			assert_true(fabs(y[i] - t) <= rel * fabs(t) + abs_tol);
		}
		free(y);
	}
	free(g);
	free(u);
}

static void test_vec_silu_mul_every_isa_matches_double(void **state)
{
	(void)state;
	check_gated_act_every_isa(GATED_SILU, 43, 20.0f, 1e-6, 1e-30);
}

/* GELU-tanh: the exp form x / (1 + exp(-2u)) every variant uses is 0.5 x (1 + tanh(u)). */
static void test_vec_gelu_mul_every_isa_matches_double(void **state)
{
	(void)state;
	check_gated_act_every_isa(GATED_GELU, 47, 12.0f, 2e-6, 1e-7);
}

/* K/V rows into the cache: every variant equals the scalar conversions bit for bit, over
 * ties, subnormals on both sides, overflow, infinities and NaNs of either sign, at every
 * tail length. */
static void test_vec_to_kv_every_isa_matches_scalar(void **state)
{
	static const uint32_t special[] = {
		0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
		0xFFA00001, 0x00000001, 0x807FFFFF, /* f32 subnormals */
		0x33800000, 0x33000000, 0x33000001, 0x387FC000, /* f16 subnormal range and ties */
		0x477FE000, 0x477FF000, 0x477FEFFF, 0x47800000, 0x7F7FFFFF, /* f16 max, tie, overflow */
		0x3F808000, 0x3F818000, 0x3F800001, 0x3F7FFFFF, /* bf16 ties, both parities */
	};
	const size_t n_special = sizeof special / sizeof special[0];
	uint64_t s = 47;
	const size_t n_max = 100;
	float *x = xalloc(n_max * sizeof(float));

	(void)state;
	for (size_t i = 0; i < n_max; i++) {
		float f = rng_unit(&s);
		uint32_t u;

		memcpy(&u, &f, 4);
		/* Spread exponents over the whole range, keeping random mantissa bits. */
		u = (u & 0x807FFFFFu) | ((uint32_t)((i * 37) % 255) << 23);
		if (i < n_special)
			u = special[i];
		memcpy(&x[i], &u, 4);
	}
	for (int type = 0; type < 2; type++) {
		enum vec_kv_type kt = type ? VEC_KV_BF16 : VEC_KV_F16;
		uint16_t want[100], got[102];

		for (size_t i = 0; i < n_max; i++)
			want[i] = kt == VEC_KV_BF16 ? quant_f32_to_bf16(x[i]) : quant_f32_to_fp16(x[i]);
		for (size_t v = 0; v <= n_variants; v++) {
			const struct kern_table *k = v < n_variants ? variants[v] : kern_table_for(KERN_REF);

			for (size_t n = 0; n <= n_max; n += n < 40 ? 1 : 20) {
				memset(got, 0xA5, sizeof got);
				k->to_kv(got, x, n, kt);
				assert_memory_equal(got, want, n * sizeof(uint16_t));
				assert_int_equal(got[n], 0xA5A5); /* nothing past the row */
			}
		}
	}
	free(x);
}

/* The probe's streaming sum: every ISA gives the scalar loop's wrapping sum, on lengths
 * that are and are not a multiple of each variant's unrolled step. */
static void test_vec_sum_u64_every_isa_matches_scalar(void **state)
{
	(void)state;
	size_t max = 64 * 1024;
	uint64_t *w = aligned_alloc(64, max);
	assert_non_null(w);
	for (size_t i = 0; i < max / 8; i++)
		w[i] = (i + 1) * 0x9E3779B97F4A7C15ull;
	static const size_t lens[] = { 0, 256, 512, 768, 4096, 64 * 1024 - 256, 64 * 1024 };
	for (int isa = KERN_REF; isa <= KERN_AVX512; isa++) {
		const struct kern_table *k = kern_table_for((enum kern_isa)isa);
		if (!k)
			continue;
		for (size_t c = 0; c < sizeof lens / sizeof lens[0]; c++)
			assert_true(k->sum_u64(w, lens[c]) == vec_sum_u64_ref(w, lens[c]));
	}
	free(w);
}

/* GPTQ's covariance sums: every ISA gives the reference's doubles, bit for bit, over
 * column ranges of every tail length (and whole unrolled steps), token counts 1 to 32,
 * with values of mixed sign and magnitude; and the reference is the exact sum (in double)
 * to within the float rounding bound of its terms. */
static void test_vec_cov_row_every_isa_matches_reference(void **state)
{
	uint64_t s = 77;
	const size_t ld = 203, n_tok = 32;
	float *x = random_floats(&s, n_tok * ld, 3.0f);
	double *c = xalloc(ld * sizeof(double)), *r = xalloc(ld * sizeof(double));

	(void)state;
	for (size_t t = 0; t < n_tok; t++)
		x[t * ld + 5] *= 1000.0f; /* one large column */
	static const size_t toks[] = { 1, 3, 17, 32 };
	static const vec_cov_row_fn row_fns[] = { vec_cov_row_ref, vec_cov_row_avx2, vec_cov_row_avx512 };
	for (size_t a = 0; a < sizeof toks / sizeof toks[0]; a++)
		for (size_t j0 = 0; j0 < 80; j0 += 7)
			for (size_t j1 = j0; j1 <= ld; j1 += j1 < j0 + 140 ? 1 : 37) {
				size_t i = (j0 * 13 + j1) % ld;
				for (size_t j = 0; j < ld; j++)
					r[j] = (double)j * 0.5;
				vec_cov_row_ref(r, x, ld, toks[a], i, j0, j1);
				for (size_t j = 0; j < j1 - j0; j++) {
					double want = (double)j * 0.5, mag = 0.0;
					for (size_t t = 0; t < toks[a]; t++) {
						want += (double)x[t * ld + i] * x[t * ld + j0 + j];
						mag += fabs((double)x[t * ld + i] * x[t * ld + j0 + j]);
					}
					/* n float roundings of a sum of n terms: at most n u of their magnitudes */
					if (fabs(r[j] - want) > (double)(toks[a] + 1) * 0x1p-24 * mag)
						fail_msg("cov_row ref: %g, the sum is %g", r[j], want);
				}
				for (int isa = KERN_REF; isa <= KERN_AVX512; isa++) {
					const struct kern_table *k = kern_table_for((enum kern_isa)isa);
					if (!k)
						continue;
					for (size_t j = 0; j < ld; j++)
						c[j] = (double)j * 0.5;
					row_fns[isa](c, x, ld, toks[a], i, j0, j1);
					assert_memory_equal(c, r, ld * sizeof(double)); /* past j1 - j0 untouched too */
				}
			}
	free(x);
	free(c);
	free(r);
}

/* The kernel table's cov_rows: the reference is cov_row row by row from each diagonal, and
 * every ISA the reference, bit for bit, for 1 to 9 rows (the AVX-512 kernel's four-row
 * steps and the rows left over), ends of 0 to 3 columns past the last row's diagonal and
 * of every tail past a 64-column step, token counts 1 to 32; the entries left of each
 * diagonal, past j1 and past the rows untouched. */
static void test_vec_cov_rows_every_isa_matches_reference(void **state)
{
	uint64_t s = 78;
	const size_t ld = 211, n_tok = 32, ldc = 240, n_c = 10 * ldc;
	float *x = random_floats(&s, n_tok * ld, 3.0f);
	double *c = xalloc(n_c * sizeof(double)), *r = xalloc(n_c * sizeof(double));
	static const size_t toks[] = { 1, 17, 32 }, starts[] = { 0, 5, 130 };

	(void)state;
	for (size_t a = 0; a < sizeof toks / sizeof toks[0]; a++)
		for (size_t b = 0; b < sizeof starts / sizeof starts[0]; b++)
			for (size_t n_rows = 1; n_rows <= 9; n_rows++) {
				size_t i = starts[b];
				for (size_t j1 = i + n_rows - 1; j1 <= ld; j1 += j1 < i + 140 ? 1 : 9) {
					for (size_t k = 0; k < n_c; k++)
						r[k] = (double)k * 0.25;
					for (size_t q = 0; q < n_rows; q++)
						vec_cov_row_ref(r + q * ldc + q, x, ld, toks[a], i + q, i + q, j1 < i + q ? i + q : j1);
					for (int isa = KERN_REF; isa <= KERN_AVX512; isa++) {
						const struct kern_table *k = kern_table_for((enum kern_isa)isa);
						if (!k)
							continue;
						for (size_t q = 0; q < n_c; q++)
							c[q] = (double)q * 0.25;
						k->cov_rows(c, ldc, x, ld, toks[a], i, n_rows, j1);
						if (memcmp(c, r, n_c * sizeof(double)))
							fail_msg("cov_rows %s: %zu tokens, rows %zu + %zu, to column %zu differ",
								 k->name, toks[a], i, n_rows, j1);
					}
				}
			}
	free(x);
	free(c);
	free(r);
}

/* gptq_cov_add: blocks of 20 of a 45-wide input (the last 5 wide: the 8-row chunks cross
 * block edges), 70 tokens (three batches, the last short): each kept entry is the sum of
 * x_i x_j over the tokens to within its float batches' rounding, entries left of the
 * diagonal and past a narrow block are never written, every ISA's table gives the same
 * doubles, the rows shared among 2 or 3 parts (gptq_cov_add_part) add the same, and one
 * call over many batches the same as a call a batch. */
static void test_gptq_cov_add_in_blocks(void **state)
{
	uint64_t s = 79;
	const size_t d = 45, nb = 20, n_tok = 70, ld = gptq_cov_ld(d);
	float *x = random_floats(&s, n_tok * d, 2.0f), *xs = xalloc(n_tok * ld * sizeof(float));
	double *r = xalloc(d * nb * sizeof(double)), *c = xalloc(d * nb * sizeof(double));

	(void)state;
	memset(r, 0, d * nb * sizeof(double));
	assert_int_equal(gptq_cov_add(r, d, nb, x, n_tok, vec_cov_rows_ref), 0);
	for (size_t i = 0; i < d; i++) {
		size_t bs = i / nb * nb;
		for (size_t jj = 0; jj < nb; jj++) {
			size_t j = bs + jj;
			double got = r[i * nb + jj];
			if (j < i || j >= d) {
				assert_true(got == 0.0);
				continue;
			}
			double want = 0.0, mag = 0.0;
			for (size_t t = 0; t < n_tok; t++) {
				want += (double)x[t * d + i] * x[t * d + j];
				mag += fabs((double)x[t * d + i] * x[t * d + j]);
			}
			if (fabs(got - want) > 34.0 * 0x1p-24 * mag)
				fail_msg("cov[%zu][%zu] = %g, the sum is %g", i, j, got, want);
		}
	}
	for (int isa = KERN_REF; isa <= KERN_AVX512; isa++) {
		const struct kern_table *k = kern_table_for((enum kern_isa)isa);
		if (!k)
			continue;
		memset(c, 0, d * nb * sizeof(double));
		assert_int_equal(gptq_cov_add(c, d, nb, x, n_tok, k->cov_rows), 0);
		assert_memory_equal(c, r, d * nb * sizeof(double));
	}
	for (size_t t = 0; t < n_tok; t++)
		memcpy(xs + t * ld, x + t * d, d * sizeof(float));
	for (size_t parts = 2; parts <= 3; parts++) {
		memset(c, 0, d * nb * sizeof(double));
		for (size_t p = 0; p < parts; p++)
			gptq_cov_add_part(c, d, nb, xs, ld, n_tok, GPTQ_COV_TOKENS, p, parts, kern_best()->cov_rows);
		assert_memory_equal(c, r, d * nb * sizeof(double));
	}
	/* One call over every batch of `batch` tokens adds what one call a batch adds, to the
	 * bit, on every ISA (the rows are outside the batches, the order per entry the same). */
	for (int isa = KERN_REF; isa <= KERN_AVX512; isa++) {
		const struct kern_table *k = kern_table_for((enum kern_isa)isa);
		if (!k)
			continue;
		const size_t batches[] = { 1, 7, 8, GPTQ_COV_TOKENS };
		for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
			size_t batch = batches[b];
			memset(r, 0, d * nb * sizeof(double));
			for (size_t t0 = 0; t0 < n_tok; t0 += batch)
				gptq_cov_add_part(r, d, nb, xs + t0 * ld, ld, n_tok - t0 < batch ? n_tok - t0 : batch, batch, 0,
						  1, k->cov_rows);
			memset(c, 0, d * nb * sizeof(double));
			gptq_cov_add_part(c, d, nb, xs, ld, n_tok, batch, 0, 1, k->cov_rows);
			assert_memory_equal(c, r, d * nb * sizeof(double));
		}
	}
	free(x);
	free(xs);
	free(r);
	free(c);
}

/* GPTQ's corrections: every ISA gives the reference's floats (one fused multiply-add each:
 * x - e u rounded once: within half an ulp of it computed in double), at
 * every length up to past two unrolled steps, the floats past n untouched. */
static void test_vec_sub_scaled_every_isa_matches_reference(void **state)
{
	uint64_t s = 91;
	const size_t max = 80;
	float *u = random_floats(&s, max, 2.0f), *x0 = random_floats(&s, max + 8, 3.0f);
	float *r = xalloc((max + 8) * sizeof(float)), *c = xalloc((max + 8) * sizeof(float));

	(void)state;
	for (size_t n = 0; n <= max; n++) {
		float e = (float)n * 0.37f - 9.1f;

		memcpy(r, x0, (max + 8) * sizeof(float));
		vec_sub_scaled_ref(r, u, e, n);
		for (size_t j = 0; j < max + 8; j++) {
			if (j >= n) {
				assert_true(r[j] == x0[j]);
				continue;
			}
			/* rounded once: within half an ulp of x - e u (the product exact in double) */
			double want = (double)x0[j] - (double)e * u[j];
			float ulp = nextafterf(fabsf(r[j]), INFINITY) - fabsf(r[j]);
			if (!(fabs((double)r[j] - want) <= 0.5 * ulp * (1.0 + 1e-9)))
				fail_msg("sub_scaled ref: %.9g, x - e u is %.17g", (double)r[j], want);
		}
		for (int isa = KERN_REF; isa <= KERN_AVX512; isa++) {
			const struct kern_table *k = kern_table_for((enum kern_isa)isa);
			if (!k)
				continue;
			memcpy(c, x0, (max + 8) * sizeof(float));
			k->gptq->col(c, u, e, n);
			assert_memory_equal(c, r, (max + 8) * sizeof(float));
		}
	}
	free(u);
	free(x0);
	free(r);
	free(c);
}

/* GPTQ's batched corrections: the reference equals nk sub_scaled calls a row (the same
 * multiply-adds in the same order), and every ISA the reference, for 1 to 8 rows (the
 * AVX kernels' four-row steps and their repeated last row), runs of 0 to 64 columns and
 * every width up to past two steps, the floats past n and between the rows untouched. */
static void test_vec_sub_run_every_isa_matches_reference(void **state)
{
	uint64_t s = 92;
	const size_t max = 72, ld = max + 8, ldu = max + 5, nks[] = { 0, 1, 3, 32, 64 };
	float *u = random_floats(&s, 64 * ldu, 2.0f), *e = random_floats(&s, 8 * 64, 0.5f);
	float *x0 = random_floats(&s, 8 * ld, 3.0f);
	float *r = xalloc(8 * ld * sizeof(float)), *c = xalloc(8 * ld * sizeof(float));

	(void)state;
	for (size_t n_rows = 1; n_rows <= 8; n_rows++)
		for (size_t t = 0; t < sizeof nks / sizeof nks[0]; t++)
			for (size_t n = 0; n <= max; n += n < 40 ? 1 : 7) {
				size_t nk = nks[t];

				memcpy(r, x0, 8 * ld * sizeof(float));
				for (size_t i = 0; i < n_rows; i++)
					for (size_t k = 0; k < nk; k++)
						vec_sub_scaled_ref(r + i * ld, u + k * ldu, e[i * nk + k], n);
				for (int isa = KERN_REF; isa <= KERN_AVX512; isa++) {
					const struct kern_table *kt = kern_table_for((enum kern_isa)isa);
					if (!kt)
						continue;
					memcpy(c, x0, 8 * ld * sizeof(float));
					kt->gptq->run(c, ld, n_rows, e, nk, u, ldu, n);
					if (memcmp(c, r, 8 * ld * sizeof(float)))
						fail_msg("sub_run %s: %zu rows, %zu columns of run, %zu wide differ", kt->name,
							 n_rows, nk, n);
				}
			}
	free(u);
	free(e);
	free(x0);
	free(r);
	free(c);
}

/* argmax: hand-built rows with a known answer (ties go to the first, a NaN never wins
 * unless it is x[0], +0 and -0 tie, an all -inf row answers 0), then random rows of every
 * tail length and a vocabulary-sized one with its maximum planted at chosen places, with
 * NaNs, infinities and duplicates of the maximum; every variant against the reference. */
static void test_vec_argmax_every_isa_matches_scalar(void **state)
{
	const float inf = INFINITY, nan = NAN;
	static const struct {
		float x[20];
		size_t n, want;
	} cases[] = {
		{ { 0 }, 0, 0 },
		{ { 5 }, 1, 0 },
		{ { 1, 3, 2, 3 }, 4, 1 },
		{ { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 9 }, 18, 16 },
		{ { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 99 }, 18, 17 },
		{ { -inf, -inf, -inf }, 3, 0 },
		{ { -0.0f, 0.0f, -1 }, 3, 0 },
	};
	uint64_t s = 91;
	const size_t big = 151936;
	float *x = xalloc(big * sizeof(float));

	(void)state;
	for (size_t v = 0; v <= n_variants; v++) {
		const struct kern_table *k = v < n_variants ? variants[v] : kern_table_for(KERN_REF);

		for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
			assert_int_equal(k->argmax(cases[c].x, cases[c].n), cases[c].want);
		float w[20] = { nan, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19 };
		assert_int_equal(k->argmax(w, 20), 0);       /* x[0] a NaN: nothing compares above it */
		w[0] = 0;
		w[3] = nan;
		w[19] = nan;
		w[17] = inf;
		assert_int_equal(k->argmax(w, 20), 17);      /* NaNs skipped, +inf wins */
		w[17] = 17;
		assert_int_equal(k->argmax(w, 20), 18);
	}
	for (size_t n = 1; n <= big; n = n < 70 ? n + 1 : n < big ? big : big + 1) {
		for (int round = 0; round < 4; round++) {
			for (size_t i = 0; i < n; i++)
				x[i] = 8.0f * rng_unit(&s) - 4.0f;
			if (round >= 1) /* the maximum, twice: at i and later */
				for (size_t j = 0; j < 2; j++)
					x[(size_t)(rng_unit(&s) * (float)n) % n] = 5.0f;
			if (round >= 2)
				for (size_t j = 0; j < 3; j++)
					x[(size_t)(rng_unit(&s) * (float)n) % n] = j ? -inf : nan;
			if (round == 3)
				x[n - 1] = 6.0f; /* in the tail */
			size_t want = vec_argmax_ref(x, n);

			for (size_t v = 0; v < n_variants; v++)
				assert_int_equal(variants[v]->argmax(x, n), want);
		}
	}
	free(x);
}

/* Q8 rows: every variant writes the reference's bytes (codes and scale) at every tail
 * length, over rows with infinities and NaNs, exact .5 ties (amax 127 makes x * inv = x),
 * an all-zero row, a row of subnormals (127 / amax overflows: the clamp) and random
 * rows; and the reference itself keeps every finite value within half a step of
 * scale * code, with ties to even. */
static void test_vec_to_kv_q8_every_isa_matches_scalar(void **state)
{
	enum { N_MAX = 100, N_ROWS = 7 };
	float rows[N_ROWS][N_MAX];
	uint8_t want[N_MAX + 4], got[N_MAX + 8];
	uint64_t s = 48;

	(void)state;
	for (size_t i = 0; i < N_MAX; i++) {
		float f = rng_unit(&s);
		uint32_t u;

		memcpy(&u, &f, 4);
		rows[0][i] = i % 7 == 3 ? INFINITY : f * 2.0f;
		rows[1][i] = i % 11 == 5 ? NAN : rng_unit(&s) * 3.0f;
		rows[2][i] = i == 17 ? 127.0f : (float)((int)(i % 21) - 10) + 0.5f;
		rows[3][i] = 0.0f;
		u = (u & 0x807FFFFFu) >> (i % 20); /* subnormal, both signs */
		memcpy(&rows[4][i], &u, 4);
		/* Exponents 2^-30 .. 2^20 with random mantissas: a few values dominate. */
		u = (u & 0x807FFFFFu) | ((uint32_t)(97 + (i * 13) % 51) << 23);
		memcpy(&rows[5][i], &u, 4);
		rows[6][i] = rng_unit(&s) * 0.01f;
	}
	rows[1][0] = NAN; /* a NaN first must not become the amax */
	for (size_t r = 0; r < N_ROWS; r++) {
		for (size_t n = 0; n <= N_MAX; n += n < 40 ? 1 : 20) {
			float scale;

			vec_to_kv_ref(want, rows[r], n, VEC_KV_Q8);
			memcpy(&scale, want + n, 4);
			for (size_t i = 0; i < n && r != 0; i++) {
				float x = rows[r][i];
				int c = (int8_t)want[i];

				if (x != x) {
					assert_int_equal(c, 0);
					continue;
				}
				assert_true(c >= -127 && c <= 127);
				if (r != 4 && !(fabs((double)x - (double)scale * c) <= 0.5000001 * scale))
					fail_msg("row %zu n %zu: %g stored as %d x %g", r, n, x, c, scale);
			}
			if (r == 2 && n > 17) {
				assert_true(scale == 1.0f);
				for (size_t i = 0; i < n; i++) /* x.5 goes to the even neighbour */
					assert_int_equal((int8_t)want[i], (int)nearbyint(rows[2][i]));
			}
			for (size_t v = 0; v < n_variants; v++) {
				memset(got, 0xA5, sizeof got);
				variants[v]->to_kv(got, rows[r], n, VEC_KV_Q8);
				if (memcmp(got, want, n + 4))
					fail_msg("%s: row %zu n %zu differs from the reference", variants[v]->name, r, n);
				assert_int_equal(got[n + 4], 0xA5); /* nothing past the row */
			}
		}
	}
}

/* Attention over a paged KV span of n_heads KV heads, in two calls (rows [first, first +
 * split) then the rest), against a plain softmax in double over the same f16/bf16 values
 * (Q8: codes times the row's scale). The pages sit in the pool in shuffled order, every
 * head's K rows then every head's V rows inside each page, as daemon/kv.h lays them out;
 * the sequence may start inside a page (a sliding window). Shapes cover ragged blocks and
 * windows, spans longer than two windows (the prefetch look-ahead, also into the next
 * head), more query heads per KV head than one pass takes, head_dim 16..256, and column
 * counts that leave a partial register group. */
static void check_attn(uint64_t *s, enum vec_kv_type type, size_t head_dim, size_t n_rep, size_t n_heads,
		       size_t n_pos, size_t split, size_t page_rows, size_t first)
{
	const size_t stride = head_dim * 2 + 32; /* rows need not be packed */
	const size_t n_rows = n_heads * n_pos, n_q = n_heads * n_rep; /* row h * n_pos + p */
	uint8_t *k = xalloc(n_rows * stride), *v = xalloc(n_rows * stride);
	size_t n_pages = (first + n_pos + page_rows - 1) / page_rows, head_bytes = page_rows * stride;
	size_t k_off = 64, v_off = k_off + n_heads * head_bytes, page_bytes = v_off + n_heads * head_bytes + 64;
	uint8_t *pool = xalloc(n_pages * page_bytes);
	uint32_t *pages = xalloc(n_pages * sizeof *pages);
	float *q = random_floats(s, n_q * head_dim, 1.0f);
	float *kf = xalloc(n_rows * head_dim * sizeof(float)), *vf = xalloc(n_rows * head_dim * sizeof(float));
	float *mx = xalloc(n_q * sizeof(float)), *sm = xalloc(n_q * sizeof(float));
	float *acc = xalloc(n_q * head_dim * sizeof(float)), *out = xalloc(n_q * head_dim * sizeof(float));
	double *sc = xalloc(n_pos * sizeof(double));
	const float scale = 1.0f / sqrtf((float)head_dim);

	for (size_t p = 0; p < n_rows; p++) {
		for (size_t i = 0; i < head_dim; i++) {
			float a = rng_unit(s) * 3.0f, b = rng_unit(s);

			if (type == VEC_KV_Q8) { /* stored below, a whole row at a time */
				kf[p * head_dim + i] = a;
				vf[p * head_dim + i] = b;
				continue;
			}
			uint16_t ha = type == VEC_KV_BF16 ? quant_f32_to_bf16(a) : quant_f32_to_fp16(a);
			uint16_t hb = type == VEC_KV_BF16 ? quant_f32_to_bf16(b) : quant_f32_to_fp16(b);

			memcpy(k + p * stride + 2 * i, &ha, 2);
			memcpy(v + p * stride + 2 * i, &hb, 2);
			kf[p * head_dim + i] = type == VEC_KV_BF16 ? quant_bf16_to_f32(ha) : quant_fp16_to_f32(ha);
			vf[p * head_dim + i] = type == VEC_KV_BF16 ? quant_bf16_to_f32(hb) : quant_fp16_to_f32(hb);
		}
		if (type == VEC_KV_Q8) {
			/* The truth is the stored row's values: code * scale, dequantized here. */
			uint8_t *kr = k + p * stride, *vr = v + p * stride;
			float ks, vs;

			vec_to_kv_ref(kr, kf + p * head_dim, head_dim, VEC_KV_Q8);
			vec_to_kv_ref(vr, vf + p * head_dim, head_dim, VEC_KV_Q8);
			memcpy(&ks, kr + head_dim, 4);
			memcpy(&vs, vr + head_dim, 4);
			for (size_t i = 0; i < head_dim; i++) {
				kf[p * head_dim + i] = (float)((double)(int8_t)kr[i] * ks);
				vf[p * head_dim + i] = (float)((double)(int8_t)vr[i] * vs);
			}
		}
	}
	for (size_t i = 0; i < n_pages; i++)
		pages[i] = (uint32_t)i;
	for (size_t i = n_pages; i > 1; i--) {
		size_t j = rng_below(s, i);
		uint32_t t = pages[i - 1];

		pages[i - 1] = pages[j];
		pages[j] = t;
	}
	memset(pool, 0x7F, n_pages * page_bytes); /* NaN-ish f16 anywhere a kernel must not read */
	for (size_t h = 0; h < n_heads; h++)
		for (size_t p = 0; p < n_pos; p++) {
			size_t row = first + p, slot = h * page_rows + row % page_rows;
			uint8_t *pg = pool + (size_t)pages[row / page_rows] * page_bytes;

			memcpy(pg + k_off + slot * stride, k + (h * n_pos + p) * stride, stride);
			memcpy(pg + v_off + slot * stride, v + (h * n_pos + p) * stride, stride);
		}
	for (size_t vi = 0; vi <= n_variants; vi++) {
		const struct kern_table *kt = vi < n_variants ? variants[vi] : kern_table_for(KERN_REF);
		struct vec_kv_span span = {
			.base = pool, .pages = pages, .page_bytes = page_bytes, .page_rows = page_rows,
			.k_off = k_off, .v_off = v_off, .k_stride = stride, .v_stride = stride,
			.n_heads = n_heads, .k_head_bytes = head_bytes, .v_head_bytes = head_bytes,
			.first = first, .n = split, .type = type,
		};

		vec_attn_init(mx, sm, acc, n_q, head_dim);
		kt->attn(q, n_rep, head_dim, &span, scale, mx, sm, acc);
		span.first = first + split;
		span.n = n_pos - split;
		kt->attn(q, n_rep, head_dim, &span, scale, mx, sm, acc);
		vec_attn_finish(out, sm, acc, n_q, head_dim);
		for (size_t qh = 0; qh < n_q; qh++) {
			const float *kh = kf + qh / n_rep * n_pos * head_dim, *vh = vf + qh / n_rep * n_pos * head_dim;
			double mxd = -INFINITY, tot = 0.0;

			for (size_t p = 0; p < n_pos; p++) {
				double d = 0.0;

				for (size_t i = 0; i < head_dim; i++)
					d += (double)q[qh * head_dim + i] * kh[p * head_dim + i];
				sc[p] = d * scale;
				mxd = fmax(mxd, sc[p]);
			}
			for (size_t p = 0; p < n_pos; p++)
				tot += exp(sc[p] - mxd);
			for (size_t i = 0; i < head_dim; i++) {
				double o = 0.0;

				for (size_t p = 0; p < n_pos; p++)
					o += exp(sc[p] - mxd) / tot * vh[p * head_dim + i];
				if (!(fabs(out[qh * head_dim + i] - o) < 2e-5))
					fail_msg("%s: head_dim %zu n_rep %zu n_heads %zu n_pos %zu: query head %zu dim %zu: "
						 "%g vs %g", kt->name, head_dim, n_rep, n_heads, n_pos, qh, i,
						 out[qh * head_dim + i], o);
			}
		}
	}
	free(k);
	free(v);
	free(pool);
	free(pages);
	free(q);
	free(kf);
	free(vf);
	free(mx);
	free(sm);
	free(acc);
	free(out);
	free(sc);
}

static void test_vec_attn_every_isa_matches_double_softmax(void **state)
{
	uint64_t s = 44;

	(void)state;
	static const enum vec_kv_type types[] = { VEC_KV_F16, VEC_KV_BF16, VEC_KV_Q8 };

	for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
		enum vec_kv_type type = types[t];

		/* head_dim, n_rep, KV heads, rows, split, page rows, first row */
		check_attn(&s, type, 64, 3, 1, 45, 29, 16, 0);
		check_attn(&s, type, 128, 10, 1, 70, 16, 16, 5);
		check_attn(&s, type, 16, 1, 3, 5, 0, 4, 3);
		check_attn(&s, type, 32, 8, 1, 33, 33, 33, 0);   /* contiguous: one page */
		check_attn(&s, type, 128, 2, 3, 300, 131, 16, 7); /* > 2 windows, 3 heads */
		check_attn(&s, type, 80, 2, 2, 290, 0, 5, 2);     /* 5 of 8 chunks in the group */
		check_attn(&s, type, 192, 3, 2, 140, 139, 7, 0);  /* 3 groups of 4 chunks */
		check_attn(&s, type, 256, 1, 1, 129, 128, 16, 15);
		check_attn(&s, type, 64, 2, 4, 20, 7, 16, 1);    /* short heads: the look-ahead reaches the next */
	}
}

/* ---- dispatch ---- */

static void test_kern_select_forces_and_rejects(void **state)
{
	struct cpu_features f;
	char desc[256];

	(void)state;
	cpu_detect(&f);
	cpu_describe(&f, desc, sizeof(desc));
	fprintf(stderr, "# cpu: %s\n", desc);
	assert_int_equal(kern_select("ref"), 0);
	assert_string_equal(kern_active()->name, "ref");
	assert_int_equal(kern_select("fastest-please"), HEARTH_EINVAL);
	assert_string_equal(kern_active()->name, "ref"); /* a bad name changes nothing */
	assert_int_equal(kern_select(NULL), 0);
	assert_ptr_equal(kern_active(), kern_best());
	if (cpu_has_avx512_set(&f))
		assert_string_equal(kern_best()->name, "avx512");
	else if (cpu_has_avx2_set(&f))
		assert_string_equal(kern_best()->name, "avx2");
	if (!cpu_has_avx512_set(&f))
		assert_int_equal(kern_select("avx512"), HEARTH_EUNSUPPORTED);
	assert_int_equal(kern_table_for(KERN_REF)->isa, KERN_REF);
	for (size_t v = 0; v < n_variants; v++) {
		assert_int_equal(kern_select(variants[v]->name), 0);
		assert_ptr_equal(kern_active(), variants[v]);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_q4_plan_reports_size_and_rejects_bad_shapes),
		cmocka_unit_test(test_q4_pack_f32_asym_codes_nearest_for_stored_scales),
		cmocka_unit_test(test_q4_pack_f32_asym_search_never_worse_than_min_max),
		cmocka_unit_test(test_q4_pack_f32_weighted_search),
		cmocka_unit_test(test_q4_quantize_group_matches_pack),
		cmocka_unit_test(test_q4_pack_f32_sym_search_never_worse_than_q4_0),
		cmocka_unit_test(test_q4_0_carry_over_matches_llama_dequant_exactly),
		cmocka_unit_test(test_q4_1_carry_over_matches_llama_dequant_exactly),
		cmocka_unit_test(test_q4_k_carry_over_within_fp16_scale_rounding),
		cmocka_unit_test(test_q4_pack_rows_in_pieces_gives_same_bytes),
		cmocka_unit_test(test_q4_row8_close_to_fp16_scales),
		cmocka_unit_test(test_gptq_factor_inverts_the_dampened_covariance),
		cmocka_unit_test(test_gptq_keep_tells_correlation_from_noise),
		cmocka_unit_test(test_gptq_diagonal_covariance_gives_plain_packing),
		cmocka_unit_test(test_gptq_lowers_the_product_error),
		cmocka_unit_test(test_q6_gptq_is_plain_on_a_diagonal_and_lowers_the_product_error),
		cmocka_unit_test(test_q4_group_codes_every_isa_matches_reference),
		cmocka_unit_test(test_q4_acts_a8_every_isa_matches_reference_bytes),
		cmocka_unit_test(test_q4_acts_a16_every_isa_matches_reference),
		cmocka_unit_test(test_q4_w4a8_every_isa_bit_exact_vs_reference),
		cmocka_unit_test(test_q4_w4a16_every_isa_close_to_reference),
		cmocka_unit_test(test_q4_reference_matches_double_truth),
		cmocka_unit_test(test_q4_matmul_writes_only_its_rows),
		cmocka_unit_test(test_q4_matmul_on_pool_equals_one_thread),
		cmocka_unit_test(test_q6_plan_reports_size_and_rejects_bad_shapes),
		cmocka_unit_test(test_q6_pack_f32_within_half_step_and_never_worse_than_absmax),
		cmocka_unit_test(test_q6_pack_same_bytes_in_any_row_order),
		cmocka_unit_test(test_q6_matmul_every_isa_matches_reference_and_truth),
		cmocka_unit_test(test_q8_0_carry_over_matches_llama_dequant_exactly),
		cmocka_unit_test(test_q8_pack_f32_round_trips_within_half_step),
		cmocka_unit_test(test_q8_matmul_every_isa_matches_reference_and_truth),
		cmocka_unit_test(test_vec_rmsnorm_every_isa_matches_double),
		cmocka_unit_test(test_vec_rope_every_isa_matches_double),
		cmocka_unit_test(test_vec_rope_table_matches_ops_ref_rope),
		cmocka_unit_test(test_vec_silu_mul_every_isa_matches_double),
		cmocka_unit_test(test_vec_gelu_mul_every_isa_matches_double),
		cmocka_unit_test(test_vec_to_kv_every_isa_matches_scalar),
		cmocka_unit_test(test_vec_argmax_every_isa_matches_scalar),
		cmocka_unit_test(test_vec_sum_u64_every_isa_matches_scalar),
		cmocka_unit_test(test_vec_cov_row_every_isa_matches_reference),
		cmocka_unit_test(test_vec_sub_scaled_every_isa_matches_reference),
		cmocka_unit_test(test_vec_sub_run_every_isa_matches_reference),
		cmocka_unit_test(test_vec_cov_rows_every_isa_matches_reference),
		cmocka_unit_test(test_gptq_cov_add_in_blocks),
		cmocka_unit_test(test_vec_to_kv_q8_every_isa_matches_scalar),
		cmocka_unit_test(test_vec_attn_every_isa_matches_double_softmax),
		cmocka_unit_test(test_kern_select_forces_and_rejects),
	};

	return cmocka_run_group_tests(tests, setup_variants, NULL);
}
