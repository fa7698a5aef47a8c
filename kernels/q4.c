/* The q4 layout itself: geometry, packing from f32 and carry-over from Q4_0/Q4_1/Q4_K
 * rows, unpacking, and carving activation buffers. Scalar and not on the hot path: the
 * loader calls it a few rows at a time, so its working set stays in cache. */
#include "kernels/q4.h"

#include <math.h>
#include <string.h>

static size_t align64(size_t n)
{
	return (n + 63) & ~(size_t)63;
}

static bool group_ok(size_t group)
{
	return group == 32 || group == 64 || group == 128;
}

/* Shared by both scale encodings: per row block, `head` bytes, then per group 16 d and
 * (asym) 16 m of `each` bytes, padded to 64; cols/2 code bytes per row. */
static int plan_geometry(struct q4_matrix *m, size_t rows, size_t cols, size_t group, bool asym, bool row8)
{
	size_t codes, total, head = row8 ? Q4_ROW8_HEAD : 0, each = row8 ? 1 : 2;

	memset(m, 0, sizeof(*m));
	if (rows == 0 || cols == 0 || !group_ok(group) || cols % group != 0 || (row8 && !asym))
		return HEARTH_EINVAL;
	if (row8 && cols / group > Q4_ROW8_MAX_GROUPS)
		return HEARTH_ERANGE;
	m->rows = rows;
	m->cols = cols;
	m->group = group;
	m->asym = asym;
	m->row8 = row8;
	m->n_groups = cols / group;
	m->n_row_blocks = (rows + Q4_ROWS - 1) / Q4_ROWS;
	if (__builtin_mul_overflow(m->n_groups, (size_t)Q4_ROWS * each * (asym ? 2 : 1), &m->scale_bytes) ||
	    m->scale_bytes > SIZE_MAX - 64 - head)
		return HEARTH_ERANGE;
	m->scale_bytes = align64(m->scale_bytes + head);
	if (__builtin_mul_overflow(cols, (size_t)(Q4_ROWS / 2), &codes) ||
	    __builtin_add_overflow(codes, m->scale_bytes, &m->block_bytes) ||
	    __builtin_mul_overflow(m->block_bytes, m->n_row_blocks, &total))
		return HEARTH_ERANGE;
	return 0;
}

int q4_matrix_plan(struct q4_matrix *m, size_t rows, size_t cols, size_t group, bool asym)
{
	return plan_geometry(m, rows, cols, group, asym, false);
}

int q4_matrix_plan_row8(struct q4_matrix *m, size_t rows, size_t cols, size_t group)
{
	return plan_geometry(m, rows, cols, group, true, true);
}

size_t q4_matrix_bytes(const struct q4_matrix *m)
{
	return m->block_bytes * m->n_row_blocks;
}

double q4_matrix_bpw(const struct q4_matrix *m)
{
	return (double)m->block_bytes * 8.0 / ((double)Q4_ROWS * (double)m->cols);
}

static uint8_t *block_of(const struct q4_matrix *m, size_t row)
{
	return m->data + (row / Q4_ROWS) * m->block_bytes;
}

static qfp16 *d_slot(const struct q4_matrix *m, size_t row, size_t g)
{
	return (qfp16 *)block_of(m, row) + g * Q4_ROWS + row % Q4_ROWS;
}

static qfp16 *m_slot(const struct q4_matrix *m, size_t row, size_t g)
{
	return (qfp16 *)block_of(m, row) + (m->n_groups + g) * Q4_ROWS + row % Q4_ROWS;
}

/* row8: the row's two fp16 scales, and its 8-bit d and m codes of group g. */
static qfp16 *sd_slot(const struct q4_matrix *m, size_t row)
{
	return (qfp16 *)block_of(m, row) + row % Q4_ROWS;
}

static qfp16 *sm_slot(const struct q4_matrix *m, size_t row)
{
	return (qfp16 *)block_of(m, row) + Q4_ROWS + row % Q4_ROWS;
}

static uint8_t *dcode_slot(const struct q4_matrix *m, size_t row, size_t g)
{
	return block_of(m, row) + Q4_ROW8_HEAD + g * Q4_ROWS + row % Q4_ROWS;
}

static int8_t *mcode_slot(const struct q4_matrix *m, size_t row, size_t g)
{
	return (int8_t *)block_of(m, row) + Q4_ROW8_HEAD + (m->n_groups + g) * Q4_ROWS + row % Q4_ROWS;
}

/* The 4 bytes row `row` owns in the chunk holding column col (col a multiple of 8). */
static uint8_t *code_slot(const struct q4_matrix *m, size_t row, size_t col)
{
	return block_of(m, row) + m->scale_bytes + (col / Q4_CHUNK_COLS) * Q4_CHUNK_BYTES +
	       (row % Q4_ROWS) * 4;
}

/* Writes n codes (values 0..15) of one row, starting at column col0 (a multiple of 8). */
static void put_codes(struct q4_matrix *m, size_t row, size_t col0, const uint8_t *q, size_t n)
{
	for (size_t c = 0; c < n; c += Q4_CHUNK_COLS) {
		uint8_t *dst = code_slot(m, row, col0 + c);

		for (int j = 0; j < 4; j++)
			dst[j] = (uint8_t)(q[c + j] | (q[c + 4 + j] << 4));
	}
}

unsigned q4_code(const struct q4_matrix *m, size_t row, size_t col)
{
	const uint8_t *b = code_slot(m, row, col & ~(size_t)7);
	unsigned j = col & 7;

	return j < 4 ? b[j] & 15u : b[j - 4] >> 4;
}

/* row8's d and m are one float product each, the kernels' own, so every path agrees. */
float q4_scale_d(const struct q4_matrix *m, size_t row, size_t g)
{
	if (m->row8)
		return quant_fp16_to_f32(*sd_slot(m, row)) * (float)*dcode_slot(m, row, g);
	return quant_fp16_to_f32(*d_slot(m, row, g));
}

float q4_scale_m(const struct q4_matrix *m, size_t row, size_t g)
{
	if (!m->asym)
		return -8.0f * q4_scale_d(m, row, g);
	if (m->row8)
		return quant_fp16_to_f32(*sm_slot(m, row)) * (float)*mcode_slot(m, row, g);
	return quant_fp16_to_f32(*m_slot(m, row, g));
}

/* Pad rows of the last block must read as zero weights; done by whoever packs the last row. */
static void zero_pad_rows(struct q4_matrix *m, size_t row0, size_t n_rows)
{
	if (row0 + n_rows != m->rows)
		return;
	for (size_t r = m->rows; r < m->n_row_blocks * Q4_ROWS; r++) {
		if (m->row8)
			*sd_slot(m, r) = *sm_slot(m, r) = 0;
		for (size_t g = 0; g < m->n_groups; g++) {
			if (m->row8) {
				*dcode_slot(m, r, g) = 0;
				*mcode_slot(m, r, g) = 0;
			} else {
				*d_slot(m, r, g) = 0;
				if (m->asym)
					*m_slot(m, r, g) = 0;
			}
		}
		for (size_t c = 0; c < m->cols; c += Q4_CHUNK_COLS)
			memset(code_slot(m, r, c), 0, 4);
	}
}

/* Asym search (quantize_group_asym): grids of 15 + Q4_SEARCH_RMIN + k * Q4_SEARCH_RDELTA
 * steps over a group's range, k < Q4_SEARCH_STEPS, then up to Q4_SEARCH_REFITS rounds of
 * least squares over the chosen codes. Why 8 grids (doc/benchmarks.md): 21 grids in steps
 * of 0.1 gain little over them at about twice the load time; no grid at all (refits from
 * min/max only) gives up about half the gain. */
#define Q4_SEARCH_STEPS 8
#define Q4_SEARCH_RMIN (-1.0f)
#define Q4_SEARCH_RDELTA 0.25f
#define Q4_SEARCH_REFITS 2

/* Round to nearest even for |v| < 2^22 (exact there), without a libm call. */
static inline float round_small(float v)
{
	return (v + 0x1.8p23f) - 0x1.8p23f;
}

/* Eight per-lane squared errors summed pairwise (the order both error measures share). */
static inline double pairs_sum8(const double e[8])
{
	return ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
}

/* The nearest code for each x against the stored d and m (clamped to 0..15) into q, and
 * the squared error of exactly the values the kernels multiply by (d*q + m, in float).
 * x lies in [lo, hi]. Each squared error counts w[i] times (all ones: plain least squares). */
double q4_group_codes_ref(const float *x, const float *w, size_t n, float lo, float hi, float d, float m,
			  uint8_t *q)
{
	float id = d != 0.0f ? 1.0f / d : 0.0f;
	float vlo = (lo - m) * id, vhi = (hi - m) * id;
	double e[8] = { 0 };

	if (vlo > -0x1p20f && vhi < 0x1p20f) {
		/* Rounded while in range of the rounding trick, clamped as integers: the
		 * same codes as clamping first, and a loop the compiler can vectorize. */
		for (size_t i = 0; i < n; i++) {
			int c = (int)round_small((x[i] - m) * id);

			c = c > 0 ? c : 0;
			c = c < 15 ? c : 15;
			q[i] = (uint8_t)c;
		}
	} else {
		for (size_t i = 0; i < n; i++) {
			float v = (x[i] - m) * id;

			v = v > 0.0f ? v : 0.0f;
			v = v < 15.0f ? v : 15.0f;
			q[i] = (uint8_t)round_small(v);
		}
	}
	for (size_t i = 0; i < n; i += 8)
		for (size_t j = 0; j < 8; j++) {
			double t = (double)x[i + j] - (double)(d * (float)q[i + j] + m);

			e[j] += (t * t) * w[i + j];
		}
	return pairs_sum8(e);
}

void q4_grid_sums_ref(const float *x, const float *w, size_t n, float lo, float is, float ll[8], float lll[8],
		      float lxl[8])
{
	for (size_t j = 0; j < 8; j++)
		ll[j] = lll[j] = lxl[j] = 0.0f;
	/* (x - lo) * is lies in [0, 16]: the integer conversion is safe, and an integer clamp
	 * keeps the loop free of branches. */
	for (size_t i = 0; i < n; i += 8)
		for (size_t j = 0; j < 8; j++) {
			int c = (int)((x[i + j] - lo) * is + 0.5f);

			c = c < 15 ? c : 15;
			float l = (float)c;

			ll[j] += l * w[i + j];
			lll[j] += (l * l) * w[i + j];
			lxl[j] += (x[i + j] * l) * w[i + j];
		}
}

const struct q4_search q4_search_ref = { q4_group_codes_ref, q4_grid_sums_ref };

/* The 8 lane sums of a vectorizable loop folded in lane order (one order everywhere, so
 * a group quantizes the same way in every caller). */
static inline double lanes_sum(const float l[8])
{
	double s = 0;

	for (size_t j = 0; j < 8; j++)
		s += l[j];
	return s;
}

/* Least squares x ~ d*q + m over fixed codes, each term weighted by w. False when that
 * gives no positive d. */
static bool group_refit(const float *x, const float *w, size_t n, const uint8_t *q, float *d, float *m)
{
	float lw[8] = { 0 }, lq[8] = { 0 }, lqq[8] = { 0 }, lx[8] = { 0 }, lxq[8] = { 0 };

	for (size_t i = 0; i < n; i += 8)
		for (size_t j = 0; j < 8; j++) {
			float l = q[i + j], wi = w[i + j];

			lw[j] += wi;
			lq[j] += l * wi;
			lqq[j] += (l * l) * wi;
			lx[j] += x[i + j] * wi;
			lxq[j] += (x[i + j] * l) * wi;
		}
	double sq = lanes_sum(lq), sqq = lanes_sum(lqq), sx = lanes_sum(lx), sxq = lanes_sum(lxq);
	double cn = lanes_sum(lw);
	double den = cn * sqq - sq * sq;
	if (!(den > 0.0))
		return false;
	*d = (float)((cn * sxq - sx * sq) / den);
	*m = (float)((sqq * sx - sq * sxq) / den);
	return *d > 0.0f;
}

/* Keeps (dh, mh, codes) of the candidate when its fp16-rounded scales give less error. */
static void group_try(const struct q4_search *k, const float *x, const float *w, size_t n, float lo, float hi,
		      float d, float m, uint8_t *q, uint8_t *tmp, qfp16 *dh, qfp16 *mh, double *best)
{
	qfp16 cd = quant_f32_to_fp16(d), cm = quant_f32_to_fp16(m);
	float fd = quant_fp16_to_f32(cd), fm = quant_fp16_to_f32(cm);

	if (!isfinite(fd) || !isfinite(fm))
		return;
	double e = k->codes(x, w, n, lo, hi, fd, fm, tmp);
	if (e < *best) {
		*best = e;
		*dh = cd;
		*mh = cm;
		memcpy(q, tmp, n);
	}
}

/* Asym (n a multiple of 8, at most 256): min/max first (d = (max-min)/15, m = min, both
 * rounded to fp16 before the codes are chosen against them), then a search for less
 * squared error: for a few step counts around 15 over the range, the least-squares d and
 * m of the grid's codes (the idea of llama.cpp's make_qkx2_quants); the best fit is
 * rounded to fp16, its codes re-chosen and refit in turn. A candidate replaces min/max
 * only when its error, measured on the fp16 values, is lower: never worse, deterministic.
 * Every error and fit weighs column i by w[i] (ones: plain least squares, the same bits as
 * an unweighted search, since each product with 1.0f is exact). */
static void quantize_group_asym(const struct q4_search *k, const float *x, const float *w, size_t n, uint8_t *q,
				qfp16 *dh, qfp16 *mh)
{
	float lo = x[0], hi = x[0];
	uint8_t tmp[256];

	for (size_t i = 1; i < n; i++) {
		lo = x[i] < lo ? x[i] : lo;
		hi = x[i] > hi ? x[i] : hi;
	}
	*dh = quant_f32_to_fp16((hi - lo) / 15.0f);
	*mh = quant_f32_to_fp16(lo);
	double best = k->codes(x, w, n, lo, hi, quant_fp16_to_f32(*dh), quant_fp16_to_f32(*mh), q);
	/* Nothing to search when all values are equal, or when the range is too small (or
	 * too large) for a grid's step to be a float. */
	if (!(hi > lo) || !isfinite(16.0f / (hi - lo)) || !isfinite(hi - lo))
		return;
	/* Sums in 8 independent lanes: the compiler vectorizes them without reordering. */
	float lw[8] = { 0 }, lx[8] = { 0 }, lxx[8] = { 0 };
	for (size_t i = 0; i < n; i += 8)
		for (size_t j = 0; j < 8; j++) {
			lw[j] += w[i + j];
			lx[j] += x[i + j] * w[i + j];
			lxx[j] += (x[i + j] * x[i + j]) * w[i + j];
		}
	double sx = lanes_sum(lx), sxx = lanes_sum(lxx), cn = lanes_sum(lw);
	double best_res = INFINITY, bd = 0, bm = 0;
	for (int g = 0; g < Q4_SEARCH_STEPS; g++) {
		float is = (15.0f + Q4_SEARCH_RMIN + Q4_SEARCH_RDELTA * (float)g) / (hi - lo);
		float ll[8], lll[8], lxl[8];

		k->grid(x, w, n, lo, is, ll, lll, lxl);
		double sl = lanes_sum(ll), sll = lanes_sum(lll), sxl = lanes_sum(lxl);
		double den = cn * sll - sl * sl;
		if (!(den > 0.0))
			continue;
		double d = (cn * sxl - sx * sl) / den, m = (sll * sx - sl * sxl) / den;
		/* The fit's residual, sum x^2 - d sum xl - m sum x, ranks the grids cheaply. */
		double res = sxx - d * sxl - m * sx;
		if (d > 0.0 && res < best_res) {
			best_res = res;
			bd = d;
			bm = m;
		}
	}
	float d = (float)bd, m = (float)bm;
	if (!(best_res < INFINITY) && !group_refit(x, w, n, q, &d, &m))
		return;
	for (int r = 0; r <= Q4_SEARCH_REFITS; r++) {
		double before = best;

		group_try(k, x, w, n, lo, hi, d, m, q, tmp, dh, mh, &best);
		if (!(best < before) || !group_refit(x, w, n, q, &d, &m))
			break;
	}
}

/* llama.cpp's quantize_row_q4_0_ref rule: the sym search's first candidate. */
static void quantize_group_sym(const float *x, size_t n, uint8_t *q, qfp16 *dh)
{
	float amax = 0.0f, max = 0.0f;

	for (size_t i = 0; i < n; i++) {
		if (fabsf(x[i]) > amax) {
			amax = fabsf(x[i]);
			max = x[i];
		}
	}
	float d = max / -8.0f;
	float id = d != 0.0f ? 1.0f / d : 0.0f;

	*dh = quant_f32_to_fp16(d);
	for (size_t i = 0; i < n; i++) {
		int v = (int)(x[i] * id + 8.5f);
		q[i] = (uint8_t)(v > 15 ? 15 : v < 0 ? 0 : v);
	}
}

/* The codes nearest x / d + 8 (clamped to 0..15) into q, and the squared error of the
 * values the kernels multiply by, (q - 8) * d in float. amax bounds |x|. Eight lanes and
 * integer clamps, so the compiler vectorizes it. */
static double sym_codes(const float *x, size_t n, float amax, float d, uint8_t *q)
{
	float id = d != 0.0f ? 1.0f / d : 0.0f;
	double e[8] = { 0 };

	if (amax * fabsf(id) < 0x1p20f) {
		for (size_t i = 0; i < n; i++) {
			int c = (int)round_small(x[i] * id + 8.0f);

			c = c > 0 ? c : 0;
			c = c < 15 ? c : 15;
			q[i] = (uint8_t)c;
		}
	} else {
		/* Only a refit over degenerate codes gets here: a scale far below the absmax. */
		for (size_t i = 0; i < n; i++) {
			float v = x[i] * id + 8.0f;

			v = v > 0.0f ? v : 0.0f;
			v = v < 15.0f ? v : 15.0f;
			q[i] = (uint8_t)round_small(v);
		}
	}
	for (size_t i = 0; i < n; i += 8)
		for (size_t j = 0; j < 8; j++) {
			double t = (double)x[i + j] - (double)(((float)q[i + j] - 8.0f) * d);

			e[j] += t * t;
		}
	return pairs_sum8(e);
}

/* Keeps d (rounded to fp16) and its codes when they give less error than *best. */
static void sym_try(const float *x, size_t n, float amax, float d, uint8_t *q, uint8_t *tmp,
		    qfp16 *dh, double *best)
{
	qfp16 cd = quant_f32_to_fp16(d);
	float fd = quant_fp16_to_f32(cd);

	if (!isfinite(fd) || fd == 0.0f)
		return;
	double e = sym_codes(x, n, amax, fd, tmp);
	if (e < *best) {
		*best = e;
		*dh = cd;
		memcpy(q, tmp, n);
	}
}

/* Least squares x ~ (q - 8) * d over fixed codes. False when every code is 8. */
static bool sym_refit(const float *x, size_t n, const uint8_t *q, float *d)
{
	float lxl[8] = { 0 }, lll[8] = { 0 };

	for (size_t i = 0; i < n; i += 8)
		for (size_t j = 0; j < 8; j++) {
			float l = (float)q[i + j] - 8.0f;

			lxl[j] += x[i + j] * l;
			lll[j] += l * l;
		}
	double sxl = lanes_sum(lxl), sll = lanes_sum(lll);
	if (!(sll > 0.0))
		return false;
	*d = (float)(sxl / sll);
	return true;
}

/* Sym (the searched rule of q4_pack_rows_f32; n a multiple of 8, at most 256): llama.cpp's
 * Q4_0 rule is the first candidate, measured as stored. Then scales that put the signed
 * absmax at code -8-t or at +7+t, for the grid of t the asym search uses: each one's codes,
 * the least-squares d over them, ranked by the fit's residual (sum x^2 - (sum xl)^2 /
 * sum l^2, no second pass). The best is rounded to fp16, its codes re-chosen and measured,
 * and refit over its own codes while that helps. A candidate replaces Q4_0 only when its
 * measured error is lower: never worse than Q4_0, deterministic. */
static void quantize_group_sym_search(const float *x, size_t n, uint8_t *q, qfp16 *dh)
{
	float amax = 0.0f, max = 0.0f;
	uint8_t tmp[256];

	for (size_t i = 0; i < n; i++) {
		if (fabsf(x[i]) > amax) {
			amax = fabsf(x[i]);
			max = x[i];
		}
	}
	quantize_group_sym(x, n, q, dh);
	float d0 = quant_fp16_to_f32(*dh);
	double best = 0.0;
	for (size_t i = 0; i < n; i++) {
		double t = (double)x[i] - (double)(((float)q[i] - 8.0f) * d0);

		best += t * t;
	}
	/* Nothing to search for an all-zero group, or when 9/absmax is not a float. */
	if (!(amax > 0.0f) || !isfinite(9.0f / amax))
		return;
	float lxx[8] = { 0 };
	for (size_t i = 0; i < n; i += 8)
		for (size_t j = 0; j < 8; j++)
			lxx[j] += x[i + j] * x[i + j];
	double sxx = lanes_sum(lxx);
	double best_res = INFINITY, bd = 0;
	for (int side = 0; side < 2; side++) {
		for (int k = 0; k < Q4_SEARCH_STEPS; k++) {
			float t = Q4_SEARCH_RMIN + Q4_SEARCH_RDELTA * (float)k;
			/* The inverse scale: x * is lies in [-9, 9], so the rounding trick holds. */
			float is = (side == 0 ? -8.0f - t : 7.0f + t) / max;
			float lxl[8] = { 0 }, lll[8] = { 0 };

			/* Rounded half up and clamped as integers (x * is + 8.5 lies in
			 * [-0.5, 17.5]; truncation of a negative there gives 0 as the clamp
			 * would): no branches, and the compiler vectorizes it. */
			for (size_t i = 0; i < n; i += 8)
				for (size_t j = 0; j < 8; j++) {
					int c = (int)(x[i + j] * is + 8.5f);

					c = c < 15 ? c : 15;
					c = c > 0 ? c : 0;
					float l = (float)(c - 8);

					lxl[j] += x[i + j] * l;
					lll[j] += l * l;
				}
			double sxl = lanes_sum(lxl), sll = lanes_sum(lll);
			if (!(sll > 0.0))
				continue;
			double res = sxx - sxl * sxl / sll;
			if (res < best_res) {
				best_res = res;
				bd = sxl / sll;
			}
		}
	}
	if (!(best_res < INFINITY))
		return;
	float d = (float)bd;
	for (int r = 0; r <= Q4_SEARCH_REFITS; r++) {
		double before = best;

		sym_try(x, n, amax, d, q, tmp, dh, &best);
		if (!(best < before) || !sym_refit(x, n, q, &d))
			break;
	}
}

/* The weights of an unweighted search: every column counts once. */
static const float q4_ones[256] = {
#define Q4_ONE8 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f
#define Q4_ONE64 Q4_ONE8, Q4_ONE8, Q4_ONE8, Q4_ONE8, Q4_ONE8, Q4_ONE8, Q4_ONE8, Q4_ONE8
	Q4_ONE64, Q4_ONE64, Q4_ONE64, Q4_ONE64
#undef Q4_ONE64
#undef Q4_ONE8
};

/* A group's weights: col_w's, or every column alike when there are none or they sum to 0
 * (columns no calibration token reached: nothing to prefer among them). */
static const float *group_weights(const float *col_w, size_t col0, size_t n)
{
	if (!col_w)
		return q4_ones;
	float sum = 0.0f;
	for (size_t i = 0; i < n; i++)
		sum += col_w[col0 + i];
	return sum > 0.0f ? col_w + col0 : q4_ones;
}

void q4_quantize_group_f32(const float *x, const float *w, size_t n, enum q4_rule rule, uint8_t *q,
			   float *d, float *m)
{
	qfp16 dh, mh;

	if (rule == Q4_RULE_ASYM) {
		quantize_group_asym(&q4_search_ref, x, group_weights(w, 0, n), n, q, &dh, &mh);
		*d = quant_fp16_to_f32(dh);
		*m = quant_fp16_to_f32(mh);
		return;
	}
	if (rule == Q4_RULE_SYM_Q4_0)
		quantize_group_sym(x, n, q, &dh);
	else
		quantize_group_sym_search(x, n, q, &dh);
	*d = quant_fp16_to_f32(dh);
	*m = -8.0f * *d;
}

/* An fp16 scale that makes `top` (>= 0) about `steps` of it: rounded to fp16, never 0
 * while top is not (the smallest subnormal instead), never infinite (65504 instead). */
static qfp16 row8_scale(float top, float steps)
{
	qfp16 h = quant_f32_to_fp16(top / steps);
	float f = quant_fp16_to_f32(h);

	if (!(f > 0.0f) && top > 0.0f)
		return 0x0001;
	return isfinite(f) ? h : 0x7bff;
}

/* row8's per-row scales from each group's asym search over x: sd (the row's largest d
 * over 255) and sm (its largest |m| over 127), stored; d and mn receive the groups' own. */
static void row8_scales(const struct q4_search *k, struct q4_matrix *m, size_t row, const float *x, const float *col_w,
			float *d, float *mn)
{
	float dmax = 0.0f, mmax = 0.0f;
	uint8_t q[256];

	for (size_t g = 0; g < m->n_groups; g++) {
		qfp16 dh, mh;

		quantize_group_asym(k, x + g * m->group, group_weights(col_w, g * m->group, m->group), m->group,
				    q, &dh, &mh);
		d[g] = quant_fp16_to_f32(dh);
		mn[g] = quant_fp16_to_f32(mh);
		dmax = d[g] > dmax ? d[g] : dmax;
		mmax = fabsf(mn[g]) > mmax ? fabsf(mn[g]) : mmax;
	}
	*sd_slot(m, row) = row8_scale(dmax, 255.0f);
	*sm_slot(m, row) = row8_scale(mmax, 127.0f);
}

/* Group g of a row8 row against its stored scales: d becomes the nearest 8-bit multiple of
 * sd or one either side, whichever fits xg best once its codes are chosen again against it
 * (weighted as the search was), m the nearest multiple of sm in -127..127. Stores both
 * codes; q receives the group's codes, *df and *mf the values they stand for. */
static void row8_group(const struct q4_search *k, struct q4_matrix *m, size_t row, size_t g, const float *xg,
		       const float *w, float d, float mn, uint8_t *q, float *df, float *mf)
{
	float sd = quant_fp16_to_f32(*sd_slot(m, row)), sm = quant_fp16_to_f32(*sm_slot(m, row));
	float lo = xg[0], hi = xg[0];
	uint8_t tmp[256];

	for (size_t i = 1; i < m->group; i++) {
		lo = xg[i] < lo ? xg[i] : lo;
		hi = xg[i] > hi ? xg[i] : hi;
	}
	float qd = sd > 0.0f ? roundf(d / sd) : 0.0f, qm = sm > 0.0f ? roundf(mn / sm) : 0.0f;
	int mc = qm < -127.0f ? -127 : qm > 127.0f ? 127 : (int)qm;
	int dc0 = qd > 255.0f ? 255 : (int)qd, best_dc = dc0;
	double best = INFINITY;
	for (int dc = dc0 - 1; dc <= dc0 + 1; dc++) {
		if (dc < 0 || dc > 255)
			continue;
		double e = k->codes(xg, w, m->group, lo, hi, sd * (float)dc, sm * (float)mc, tmp);
		if (e < best) {
			best = e;
			best_dc = dc;
			memcpy(q, tmp, m->group);
		}
	}
	*dcode_slot(m, row, g) = (uint8_t)best_dc;
	*mcode_slot(m, row, g) = (int8_t)mc;
	*df = sd * (float)best_dc;
	*mf = sm * (float)mc;
}

/* One row in the row8 encoding: each group's d and m from the asym search, then the row's
 * scales, then each group's codes against them (row8_group). */
static void pack_row_row8(const struct q4_search *k, struct q4_matrix *m, size_t row, const float *x,
			  const float *col_w)
{
	float d[Q4_ROW8_MAX_GROUPS], mn[Q4_ROW8_MAX_GROUPS], df, mf;
	uint8_t q[256];

	row8_scales(k, m, row, x, col_w, d, mn);
	for (size_t g = 0; g < m->n_groups; g++) {
		row8_group(k, m, row, g, x + g * m->group, group_weights(col_w, g * m->group, m->group), d[g],
			   mn[g], q, &df, &mf);
		put_codes(m, row, g * m->group, q, m->group);
	}
}

/* Group g of a row in the fp16-scale layouts: its d (and asym m) searched and stored, q its
 * codes, *d and *mn the values they stand for (sym: m = -8d). */
static void plain_group(const struct q4_search *k, struct q4_matrix *m, size_t row, size_t g, const float *xg,
			const float *w, uint8_t *q, float *d, float *mn)
{
	if (m->asym)
		quantize_group_asym(k, xg, w, m->group, q, d_slot(m, row, g), m_slot(m, row, g));
	else
		quantize_group_sym_search(xg, m->group, q, d_slot(m, row, g));
	*d = quant_fp16_to_f32(*d_slot(m, row, g));
	*mn = m->asym ? quant_fp16_to_f32(*m_slot(m, row, g)) : -8.0f * *d;
}

void q4_pack_rows_f32_k(struct q4_matrix *m, const float *src, size_t ld, const float *col_w, size_t row0,
			size_t n_rows, const struct q4_search *k)
{
	uint8_t q[256];

	for (size_t i = 0; i < n_rows; i++) {
		const float *x = src + i * ld;
		size_t row = row0 + i;

		if (m->row8) {
			pack_row_row8(k, m, row, x, col_w);
			continue;
		}
		for (size_t g = 0; g < m->n_groups; g++) {
			float d, mn;

			plain_group(k, m, row, g, x + g * m->group, group_weights(col_w, g * m->group, m->group), q,
				    &d, &mn);
			put_codes(m, row, g * m->group, q, m->group);
		}
	}
	zero_pad_rows(m, row0, n_rows);
}

void q4_pack_rows_f32(struct q4_matrix *m, const float *src, size_t ld, const float *col_w, size_t row0,
		      size_t n_rows)
{
	q4_pack_rows_f32_k(m, src, ld, col_w, row0, n_rows, &q4_search_ref);
}

/* The nearest code for x against d and m, clamped to 0..15: q4_group_codes' choice for one
 * value (clamping before rounding picks the same code). */
static uint8_t code_nearest(float x, float d, float m)
{
	float v = (x - m) * (d != 0.0f ? 1.0f / d : 0.0f);

	v = v > 0.0f ? v : 0.0f;
	v = v < 15.0f ? v : 15.0f;
	return (uint8_t)round_small(v);
}

/* Rows GPTQ rounds side by side: U's rows (up to ublock floats a column, the factor cols x
 * ublock) come from L2 or memory for the first row and from L1 for the others. */
#define GPTQ_ROWS 8

/* GPTQ on n_rows <= GPTQ_ROWS rows ld apart (x, modified): each group's scales are chosen,
 * as q4_pack_rows_f32 chooses them, from the group's values as the errors pushed onto them
 * so far have left them; then its columns are rounded one by one, each one's error divided
 * by U's diagonal and taken off the columns after it in proportion to U's row. A column's
 * error reaches the rest of its run (vec_gptq_run_end) at once, the columns past the run
 * in one sub_run when the run is done: the same multiply-adds in the same order, as
 * GPTQ's lazy batch updates. The rows are independent, side by side only to share U's
 * reads. */
static void pack_rows_gptq(struct q4_matrix *m, size_t row0, size_t n_rows, float *x, size_t ld, const float *col_w,
			   const float *u, size_t ublock, const struct vec_gptq *spread, const struct q4_search *k)
{
	float d8[Q4_ROW8_MAX_GROUPS], mn8[Q4_ROW8_MAX_GROUPS], d[GPTQ_ROWS], mn[GPTQ_ROWS];
	float e[GPTQ_ROWS * VEC_GPTQ_RUN]; /* the run's errors, row by row */
	uint8_t q[GPTQ_ROWS][256];
	size_t cols = m->cols;

	for (size_t r = 0; m->row8 && r < n_rows; r++) /* each row's scales from its values as given */
		row8_scales(k, m, row0 + r, x + r * ld, col_w, d8, mn8);
	for (size_t g = 0; g < m->n_groups; g++) {
		const float *w = group_weights(col_w, g * m->group, m->group);
		size_t g0 = g * m->group, g1 = g0 + m->group;

		for (size_t r = 0; r < n_rows; r++) {
			float *xg = x + r * ld + g0;

			if (m->row8) {
				qfp16 dh, mh;

				quantize_group_asym(k, xg, w, m->group, q[r], &dh, &mh);
				row8_group(k, m, row0 + r, g, xg, w, quant_fp16_to_f32(dh), quant_fp16_to_f32(mh), q[r],
					   &d[r], &mn[r]);
			} else {
				plain_group(k, m, row0 + r, g, xg, w, q[r], &d[r], &mn[r]);
			}
		}
		for (size_t a = g0, b, bs, end; a < g1; a = b) {
			b = vec_gptq_run_end(a, g1, ublock, cols, &bs, &end);
			for (size_t i = a; i < b; i++) {
				const float *ui = u + i * ublock - bs; /* ui[j]: U[i][j], j in its block */

				for (size_t r = 0; r < n_rows; r++) {
					float *xr = x + r * ld;
					uint8_t c = code_nearest(xr[i], d[r], mn[r]);
					float ei = (xr[i] - (d[r] * (float)c + mn[r])) / ui[i];

					q[r][i - g0] = c;
					e[r * (b - a) + (i - a)] = ei;
					spread->col(xr + i + 1, ui + i + 1, ei, b - i - 1);
				}
			}
			spread->run(x + b, ld, n_rows, e, b - a, u + a * ublock - bs + b, ublock, end - b);
		}
		for (size_t r = 0; r < n_rows; r++)
			put_codes(m, row0 + r, g0, q[r], m->group);
	}
}

void q4_pack_rows_gptq(struct q4_matrix *m, float *src, size_t ld, const float *col_w, const float *u,
		       size_t ublock, size_t row0, size_t n_rows, const struct vec_gptq *spread, const struct q4_search *k)
{
	for (size_t i = 0; i < n_rows; i += GPTQ_ROWS)
		pack_rows_gptq(m, row0 + i, n_rows - i < GPTQ_ROWS ? n_rows - i : GPTQ_ROWS, src + i * ld, ld, col_w, u,
			       ublock, spread, k);
	zero_pad_rows(m, row0, n_rows);
}

int q4_pack_rows_q4_0(struct q4_matrix *m, const void *src, size_t row0, size_t n_rows)
{
	const struct block_q4_0 *b = src;
	uint8_t q[QK4_0];

	if (m->row8 || m->group != QK4_0 || m->asym)
		return HEARTH_EINVAL;
	for (size_t i = 0; i < n_rows; i++) {
		size_t row = row0 + i;

		for (size_t g = 0; g < m->n_groups; g++, b++) {
			for (int j = 0; j < QK4_0 / 2; j++) {
				q[j] = b->qs[j] & 15;
				q[j + QK4_0 / 2] = b->qs[j] >> 4;
			}
			*d_slot(m, row, g) = b->d;
			put_codes(m, row, g * QK4_0, q, QK4_0);
		}
	}
	zero_pad_rows(m, row0, n_rows);
	return 0;
}

int q4_pack_rows_q4_1(struct q4_matrix *m, const void *src, size_t row0, size_t n_rows)
{
	const struct block_q4_1 *b = src;
	uint8_t q[QK4_1];

	if (m->row8 || m->group != QK4_1 || !m->asym)
		return HEARTH_EINVAL;
	for (size_t i = 0; i < n_rows; i++) {
		size_t row = row0 + i;

		for (size_t g = 0; g < m->n_groups; g++, b++) {
			for (int j = 0; j < QK4_1 / 2; j++) {
				q[j] = b->qs[j] & 15;
				q[j + QK4_1 / 2] = b->qs[j] >> 4;
			}
			*d_slot(m, row, g) = b->d;
			*m_slot(m, row, g) = b->m;
			put_codes(m, row, g * QK4_1, q, QK4_1);
		}
	}
	zero_pad_rows(m, row0, n_rows);
	return 0;
}

/* Q4_K's 6-bit sub-block scale and min, unpacked as ggml's get_scale_min_k4 does. */
static void q4_k_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *mn)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*mn = s[j + 4] & 63;
	} else {
		*sc = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
		*mn = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
	}
}

int q4_pack_rows_q4_k(struct q4_matrix *m, const void *src, size_t row0, size_t n_rows)
{
	const struct block_q4_K *b = src;
	uint8_t q[QK_K];

	if (m->row8 || m->group != 32 || !m->asym || m->cols % QK_K != 0)
		return HEARTH_EINVAL;
	for (size_t i = 0; i < n_rows; i++) {
		size_t row = row0 + i;

		for (size_t sb = 0; sb < m->cols / QK_K; sb++, b++) {
			float d = quant_fp16_to_f32(b->d), dmin = quant_fp16_to_f32(b->dmin);

			/* 64 values per 32 bytes: low nibbles are sub-block 2j, high 2j+1. */
			for (int j = 0; j < 4; j++) {
				for (int l = 0; l < 32; l++) {
					q[64 * j + l] = b->qs[32 * j + l] & 15;
					q[64 * j + 32 + l] = b->qs[32 * j + l] >> 4;
				}
			}
			for (int j = 0; j < 8; j++) {
				uint8_t sc, mn;
				size_t g = sb * 8 + (size_t)j;

				q4_k_scale_min(j, b->scales, &sc, &mn);
				*d_slot(m, row, g) = quant_f32_to_fp16(d * (float)sc);
				*m_slot(m, row, g) = quant_f32_to_fp16(-(dmin * (float)mn));
			}
			put_codes(m, row, sb * QK_K, q, QK_K);
		}
	}
	zero_pad_rows(m, row0, n_rows);
	return 0;
}

void q4_unpack_rows(const struct q4_matrix *m, size_t row0, size_t n_rows, float *dst, size_t ld)
{
	for (size_t i = 0; i < n_rows; i++) {
		size_t row = row0 + i;

		for (size_t g = 0; g < m->n_groups; g++) {
			float d = q4_scale_d(m, row, g), mn = q4_scale_m(m, row, g);

			/* Sym as (q - 8) * d, llama.cpp's own expression: equal to d*q + m, and
			 * it also keeps the sign of zero llama.cpp gives (-0 when d < 0). */
			for (size_t k = g * m->group; k < (g + 1) * m->group; k++)
				dst[i * ld + k] = m->asym ? d * (float)q4_code(m, row, k) + mn
							  : ((float)q4_code(m, row, k) - 8.0f) * d;
		}
	}
}

/* Activation buffer regions, each 64-byte aligned: codes, then scale (A8), then sum. */
static int acts_layout(enum q4_act_kind kind, size_t n_tok, size_t cols, size_t group,
		       size_t *codes, size_t *scales, size_t *total)
{
	size_t elem = kind == Q4_ACT_A16 ? 2 : 1, n, ng;

	if ((kind != Q4_ACT_A16 && kind != Q4_ACT_A8) || n_tok == 0 || cols == 0 || !group_ok(group) ||
	    cols % group != 0)
		return HEARTH_EINVAL;
	if (__builtin_mul_overflow(n_tok, cols, &n) || __builtin_mul_overflow(n, elem, codes) ||
	    __builtin_mul_overflow(n_tok, cols / group, &ng) ||
	    __builtin_mul_overflow(ng, sizeof(float), scales) || *codes > SIZE_MAX / 2 ||
	    *scales > SIZE_MAX / 8)
		return HEARTH_ERANGE;
	*codes = align64(*codes);
	*scales = align64(*scales);
	*total = *codes + *scales * (kind == Q4_ACT_A8 ? 2 : 1);
	return 0;
}

size_t q4_acts_bytes(enum q4_act_kind kind, size_t n_tok, size_t cols, size_t group)
{
	size_t codes, scales, total;

	if (acts_layout(kind, n_tok, cols, group, &codes, &scales, &total) != 0)
		return 0;
	return total;
}

int q4_acts_init(struct q4_acts *a, enum q4_act_kind kind, size_t n_tok, size_t cols, size_t group,
		 void *mem)
{
	size_t codes, scales, total;
	int rc = acts_layout(kind, n_tok, cols, group, &codes, &scales, &total);

	memset(a, 0, sizeof(*a));
	if (rc != 0)
		return rc;
	if (mem == NULL || ((uintptr_t)mem & 63) != 0)
		return HEARTH_EINVAL;
	a->kind = kind;
	a->n_tok = n_tok;
	a->cols = cols;
	a->group = group;
	a->n_groups = cols / group;
	a->codes = mem;
	if (kind == Q4_ACT_A8) {
		a->scale = (float *)((char *)mem + codes);
		a->sum = (float *)((char *)mem + codes + scales);
	} else {
		a->sum = (float *)((char *)mem + codes);
	}
	return 0;
}

bool q4_acts_fit(const struct q4_matrix *w, const struct q4_acts *a)
{
	return a->cols == w->cols && a->group == w->group && a->codes != NULL;
}
