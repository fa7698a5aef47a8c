/* AVX-512 variants of the vector ops in kernels/vec.h: 16 floats a step, masked tails,
 * a Cephes-style exp (about 2 ulp) for SiLU, and attention that converts each f16/bf16/int8
 * K/V row on the fly. Built with AVX-512 target flags. */
#include "kernels/vec.h"

#include <immintrin.h>
#include <stdbool.h>
#include <math.h>
#include <string.h>

static inline __mmask16 tail_mask(size_t left)
{
	return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

/* exp(x) for x in any range: exp(-inf..-87.3) ~ 1e-38, exp(x > 88.3) is large but finite. */
static inline __m512 exp512(__m512 x)
{
	x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
	__m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
					_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);

	r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
	__m512 p = _mm512_set1_ps(1.9875691500e-4f);

	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
	p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
	return _mm512_scalef_ps(p, n);
}

void vec_rmsnorm_avx512(float *out, const float *x, const float *w, size_t n, float eps)
{
	__m512 s0 = _mm512_setzero_ps(), s1 = s0;
	size_t i = 0;

	for (; i + 32 <= n; i += 32) {
		__m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);

		s0 = _mm512_fmadd_ps(a, a, s0);
		s1 = _mm512_fmadd_ps(b, b, s1);
	}
	for (; i < n; i += 16) {
		__m512 a = _mm512_maskz_loadu_ps(tail_mask(n - i), x + i);

		s0 = _mm512_fmadd_ps(a, a, s0);
	}
	float ss = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
	__m512 scale = _mm512_set1_ps(1.0f / sqrtf(ss / (float)n + eps));

	for (i = 0; i < n; i += 16) {
		__mmask16 k = tail_mask(n - i);
		__m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), scale);

		if (w)
			v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(k, w + i));
		_mm512_mask_storeu_ps(out + i, k, v);
	}
}

void vec_rope_avx512(float *x, size_t n_heads, size_t head_dim, size_t n_rot, enum vec_rope_style style,
		     const float *cos_row, const float *sin_row)
{
	const size_t half = n_rot / 2;
	const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);

	for (size_t h = 0; h < n_heads; h++) {
		float *v = x + h * head_dim;

		if (style == VEC_ROPE_NEOX) {
			for (size_t i = 0; i < half; i += 16) {
				__mmask16 k = tail_mask(half - i);
				__m512 a = _mm512_maskz_loadu_ps(k, v + i), b = _mm512_maskz_loadu_ps(k, v + i + half);
				__m512 c = _mm512_maskz_loadu_ps(k, cos_row + i), s = _mm512_maskz_loadu_ps(k, sin_row + i);

				_mm512_mask_storeu_ps(v + i, k, _mm512_fmsub_ps(a, c, _mm512_mul_ps(b, s)));
				_mm512_mask_storeu_ps(v + i + half, k, _mm512_fmadd_ps(a, s, _mm512_mul_ps(b, c)));
			}
			continue;
		}
		/* Adjacent pairs: even lanes x0*c - x1*s, odd lanes x1*c + x0*s (fmaddsub). */
		for (size_t i = 0; i < half; i += 8) {
			size_t pairs = half - i < 8 ? half - i : 8;
			__mmask16 k = tail_mask(2 * pairs);
			__m512 xv = _mm512_maskz_loadu_ps(k, v + 2 * i);
			__m512 c = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(
								      _mm256_maskz_loadu_ps((__mmask8)((1u << pairs) - 1), cos_row + i)));
			__m512 s = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(
								      _mm256_maskz_loadu_ps((__mmask8)((1u << pairs) - 1), sin_row + i)));
			__m512 sw = _mm512_permute_ps(xv, 0xB1);

			_mm512_mask_storeu_ps(v + 2 * i, k, _mm512_fmaddsub_ps(xv, c, _mm512_mul_ps(sw, s)));
		}
	}
}

void vec_silu_mul_avx512(float *gate, const float *up, size_t n)
{
	const __m512 one = _mm512_set1_ps(1.0f);

	for (size_t i = 0; i < n; i += 16) {
		__mmask16 k = tail_mask(n - i);
		__m512 g = _mm512_maskz_loadu_ps(k, gate + i), u = _mm512_maskz_loadu_ps(k, up + i);
		__m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));

		_mm512_mask_storeu_ps(gate + i, k, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u));
	}
}

void vec_gelu_mul_avx512(float *gate, const float *up, size_t n)
{
	const __m512 one = _mm512_set1_ps(1.0f), m2c = _mm512_set1_ps(-2.0f * VEC_GELU_SQRT_2_PI);
	const __m512 a = _mm512_set1_ps(VEC_GELU_COEF);

	for (size_t i = 0; i < n; i += 16) {
		__mmask16 k = tail_mask(n - i);
		__m512 x = _mm512_maskz_loadu_ps(k, gate + i), u = _mm512_maskz_loadu_ps(k, up + i);
		__m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
		__m512 e = exp512(_mm512_mul_ps(m2c, _mm512_fmadd_ps(a, x3, x)));

		_mm512_mask_storeu_ps(gate + i, k, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), u));
	}
}

static inline __m512 kv_load(enum vec_kv_type type, const uint8_t *row, size_t i)
{
	if (type == VEC_KV_Q8)  /* vpmovsxbd + vcvtdq2ps: the row's scale is applied outside */
		return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + i))));
	__m256i h = _mm256_loadu_si256((const __m256i *)(row + 2 * i));

	if (type == VEC_KV_BF16)
		return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
	return _mm512_cvtph_ps(h);
}

#define ATTN_POS 16   /* rows per score block: one hsum16 per block and head */
#define ATTN_WIN 128  /* rows per window: one max, one rescale and one exp pass per window */
#define ATTN_HEADS 4  /* query heads that share one pass over a window's K/V rows */
#define ATTN_AHEAD 32 /* K rows are prefetched this far ahead of the scores */

/* Sums each of v[0..15] across its 16 lanes and returns the 16 sums in one vector, in
 * the order position k + 4e at lane 4k + e (the permutation the shuffle tree leaves);
 * 30 shuffles and 15 adds instead of 16 separate horizontal reductions. */
static inline __m512 hsum16(const __m512 *v)
{
	__m512 a[8], b[4], c[2];

	/* 512 -> 256 bits: lanes 0-1 of a vector plus its lanes 2-3, two vectors at a time. */
	for (int i = 0; i < 8; i++)
		a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
				     _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
	/* 256 -> 128: lane k of the result holds vector k's four partial sums. */
	for (int i = 0; i < 4; i++)
		b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
				     _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
	/* Within each 128-bit lane: 4 -> 2 -> 1 partial sums per vector. */
	for (int i = 0; i < 2; i++)
		c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44),
				     _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
	return _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xDD));
}

/* Q8 rows' scales (the f32 after the codes) for the block's live rows, 1 past them: the K
 * scale multiplies a row's score, the V scale its softmax weight, so the inner loops see
 * bare codes. */
static inline __m512 q8_scales(const uint8_t *const *rows, size_t head_dim, size_t nb)
{
	float f[ATTN_POS] __attribute__((aligned(64)));

	for (size_t j = 0; j < ATTN_POS; j++)
		f[j] = 1.0f;
	for (size_t j = 0; j < nb; j++)
		memcpy(&f[j], rows[j] + head_dim, sizeof f[j]);
	return _mm512_load_ps(f);
}

/* A KV row's lines: into L1 for rows the scores read next, into L2 for rows read a pass
 * later (L1 would lose them first). */
static inline void prefetch_row(const uint8_t *row, size_t bytes, int l2)
{
	for (size_t o = 0; o < bytes; o += 64) {
		if (l2)
			_mm_prefetch((const char *)row + o, _MM_HINT_T1);
		else
			_mm_prefetch((const char *)row + o, _MM_HINT_T0);
	}
}

/* The V pass over NC (a constant) 16-column chunks from column i0: the NR heads' output
 * columns stay in registers across all nw rows, rows front to back. The first group of
 * a window also prefetches the next window's K rows into L2 (k_next, n_next rows). */
static inline __attribute__((always_inline)) void
attn_vpass(const size_t NR, const size_t NC, size_t head_dim, enum vec_kv_type type, const uint8_t *const *v,
	   const float (*s)[ATTN_WIN], size_t nw, size_t i0, const float *cr, float *acc,
	   const uint8_t *const *k_next, size_t n_next, size_t row_bytes)
{
	__m512 a[ATTN_HEADS][8];

#pragma GCC unroll 8
	for (size_t r = 0; r < NR; r++)
#pragma GCC unroll 8
		for (size_t c = 0; c < NC; c++)
			a[r][c] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * head_dim + i0 + 16 * c), _mm512_set1_ps(cr[r]));
	for (size_t j = 0; j < nw; j++) {
		const uint8_t *vr = v[j];

		if (j < n_next)
			prefetch_row(k_next[j], row_bytes, 1);
#pragma GCC unroll 8
		for (size_t c = 0; c < NC; c++) {
			__m512 vc = kv_load(type, vr, i0 + 16 * c);

#pragma GCC unroll 8
			for (size_t r = 0; r < NR; r++)
				a[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(s[r][j]), vc, a[r][c]);
		}
	}
#pragma GCC unroll 8
	for (size_t r = 0; r < NR; r++)
#pragma GCC unroll 8
		for (size_t c = 0; c < NC; c++)
			_mm512_storeu_ps(acc + r * head_dim + i0 + 16 * c, a[r][c]);
}

/* NR (<= ATTN_HEADS, a constant after inlining) query heads against one window of nw rows
 * (k[j], v[j]; rows past nw up to n_ahead are the next window's, prefetched only).
 *   scores: two rows at a time (four FMA chains for two heads), each K chunk converted
 *   once for every head, 16 rows reduced at once (hsum16);
 *   softmax: one max, one rescale and one exp pass over the window's scores;
 *   V pass: attn_vpass, in column groups that fit the registers (8 chunks for up to two
 *   heads, 4 for three or four).
 * Memory: K rows ATTN_AHEAD ahead into L1, this window's V rows and the next window's K
 * rows into L2 while the scores and the V pass compute, so DRAM is kept busy in both. */
static inline __attribute__((always_inline)) void
attn_heads(const float *q, const size_t NR, size_t head_dim, enum vec_kv_type type, const uint8_t *const *k,
	   const uint8_t *const *v, size_t nw, size_t n_ahead, float scale, float *max, float *sum,
	   float *acc)
{
	float s[ATTN_HEADS][ATTN_WIN] __attribute__((aligned(64)));
	float cr[ATTN_HEADS];
	const size_t row_bytes = vec_kv_row_bytes(type, head_dim);
	/* Undoes hsum16's order: lane j takes the sum of row j from lane 4(j%4) + j/4. */
	const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
	const __m512 ninf = _mm512_set1_ps(-INFINITY);

	for (size_t j0 = 0; j0 < nw; j0 += ATTN_POS) {
		size_t nb = nw - j0 < ATTN_POS ? nw - j0 : ATTN_POS;
		__m512 dots[ATTN_HEADS][ATTN_POS];

		for (size_t j = j0 + ATTN_AHEAD; j < j0 + ATTN_AHEAD + ATTN_POS && j < n_ahead; j++)
			prefetch_row(k[j], row_bytes, 0);
		for (size_t j = j0; j < j0 + nb; j++)
			prefetch_row(v[j], row_bytes, 1);
		for (size_t j = 0; j < ATTN_POS; j += 2) {
			/* Rows past nb repeat the last live one: their lanes are masked below. */
			const uint8_t *k0 = k[j0 + (j < nb ? j : nb - 1)], *k1 = k[j0 + (j + 1 < nb ? j + 1 : nb - 1)];
			__m512 d0[ATTN_HEADS], d1[ATTN_HEADS];

#pragma GCC unroll 8
			for (size_t r = 0; r < NR; r++)
				d0[r] = d1[r] = _mm512_setzero_ps();
			for (size_t i = 0; i < head_dim; i += 16) {
				__m512 c0 = kv_load(type, k0, i), c1 = kv_load(type, k1, i);

#pragma GCC unroll 8
				for (size_t r = 0; r < NR; r++) {
					__m512 qv = _mm512_loadu_ps(q + r * head_dim + i);

					d0[r] = _mm512_fmadd_ps(qv, c0, d0[r]);
					d1[r] = _mm512_fmadd_ps(qv, c1, d1[r]);
				}
			}
#pragma GCC unroll 8
			for (size_t r = 0; r < NR; r++) {
				dots[r][j] = d0[r];
				dots[r][j + 1] = d1[r];
			}
		}
		__m512 ks = type == VEC_KV_Q8 ? q8_scales(k + j0, head_dim, nb) : _mm512_set1_ps(1.0f);

#pragma GCC unroll 8
		for (size_t r = 0; r < NR; r++) {
			__m512 sc = _mm512_permutexvar_ps(order, hsum16(dots[r]));

			if (type == VEC_KV_Q8)
				sc = _mm512_mul_ps(sc, ks);
			_mm512_store_ps(s[r] + j0, _mm512_mask_mul_ps(ninf, tail_mask(nb), sc, _mm512_set1_ps(scale)));
		}
	}
#pragma GCC unroll 8
	for (size_t r = 0; r < NR; r++) {
		__m512 vmax = ninf, vsum = _mm512_setzero_ps();

		for (size_t j0 = 0; j0 < nw; j0 += ATTN_POS)
			vmax = _mm512_max_ps(vmax, _mm512_load_ps(s[r] + j0));
		float bmax = _mm512_reduce_max_ps(vmax), c = 1.0f;

		if (bmax > max[r]) {
			c = max[r] == -INFINITY ? 0.0f : expf(max[r] - bmax);
			max[r] = bmax;
		}
		__m512 vm = _mm512_set1_ps(max[r]);

		for (size_t j0 = 0; j0 < nw; j0 += ATTN_POS) {
			size_t nb = nw - j0 < ATTN_POS ? nw - j0 : ATTN_POS;
			/* Dead lanes hold -inf: exp512 clamps them to ~1e-38, the mask makes them 0. */
			__m512 ev = _mm512_maskz_mov_ps(tail_mask(nb), exp512(_mm512_sub_ps(_mm512_load_ps(s[r] + j0), vm)));

			vsum = _mm512_add_ps(vsum, ev);
			if (type == VEC_KV_Q8) /* the V row's scale rides on its weight */
				ev = _mm512_mul_ps(ev, q8_scales(v + j0, head_dim, nb));
			_mm512_store_ps(s[r] + j0, ev);
		}
		sum[r] = sum[r] * c + _mm512_reduce_add_ps(vsum);
		cr[r] = c;
	}
	const size_t CG = NR <= 2 ? 8 : 4;
	const uint8_t *const *k_next = k + nw;
	size_t n_next = n_ahead - nw, left = head_dim / 16, i0 = 0;

	for (; left >= CG; left -= CG, i0 += CG * 16, n_next = 0)
		attn_vpass(NR, CG, head_dim, type, v, s, nw, i0, cr, acc, k_next, n_next, row_bytes);
	if (left >= 4) {
		attn_vpass(NR, 4, head_dim, type, v, s, nw, i0, cr, acc, k_next, n_next, row_bytes);
		left -= 4, i0 += 64, n_next = 0;
	}
	if (left >= 2) {
		attn_vpass(NR, 2, head_dim, type, v, s, nw, i0, cr, acc, k_next, n_next, row_bytes);
		left -= 2, i0 += 32, n_next = 0;
	}
	if (left)
		attn_vpass(NR, 1, head_dim, type, v, s, nw, i0, cr, acc, k_next, n_next, row_bytes);
}

/* Head by head, windows of ATTN_WIN rows; each window's row pointers reach one window
 * further (into the next head's first rows after a head's last window), for the
 * prefetches. A head's query heads go in groups of up to four, each group one pass over the
 * window; the switch gives every group size its own unrolled copy. */
static inline __attribute__((always_inline)) void
attn_span(const float *q, size_t n_rep, size_t head_dim, enum vec_kv_type type, const struct vec_kv_span *kv,
	  float scale, float *max, float *sum, float *acc)
{
	const uint8_t *k[2 * ATTN_WIN], *v[2 * ATTN_WIN];

	for (size_t h = 0; h < kv->n_heads; h++) {
		for (size_t w0 = 0; w0 < kv->n; w0 += ATTN_WIN) {
			size_t left = kv->n - w0;
			size_t nw = left < ATTN_WIN ? left : ATTN_WIN, n_ahead = left < 2 * ATTN_WIN ? left : 2 * ATTN_WIN;

			vec_kv_rows(kv, h, w0, n_ahead, k, v);
			if (n_ahead - nw < ATTN_WIN && h + 1 < kv->n_heads) {
				size_t more = ATTN_WIN - (n_ahead - nw) < kv->n ? ATTN_WIN - (n_ahead - nw) : kv->n;

				vec_kv_rows(kv, h + 1, 0, more, k + n_ahead, v + n_ahead);
				n_ahead += more;
			}
			for (size_t r = h * n_rep; r < (h + 1) * n_rep; r += ATTN_HEADS) {
				size_t nr = (h + 1) * n_rep - r < ATTN_HEADS ? (h + 1) * n_rep - r : ATTN_HEADS;
				const float *qr = q + r * head_dim;
				float *ar = acc + r * head_dim;

				switch (nr) {
				case 1:
					attn_heads(qr, 1, head_dim, type, k, v, nw, n_ahead, scale, max + r, sum + r, ar);
					break;
				case 2:
					attn_heads(qr, 2, head_dim, type, k, v, nw, n_ahead, scale, max + r, sum + r, ar);
					break;
				case 3:
					attn_heads(qr, 3, head_dim, type, k, v, nw, n_ahead, scale, max + r, sum + r, ar);
					break;
				default:
					attn_heads(qr, 4, head_dim, type, k, v, nw, n_ahead, scale, max + r, sum + r, ar);
					break;
				}
			}
		}
	}
}

/* Each element type gets its own copy of the span with the type a constant, so the
 * conversions (and Q8's scale multiplies) are straight-line code in the inner loops. */
static void attn_span_f16(const float *q, size_t n_rep, size_t head_dim, const struct vec_kv_span *kv,
			  float scale, float *max, float *sum, float *acc)
{
	attn_span(q, n_rep, head_dim, VEC_KV_F16, kv, scale, max, sum, acc);
}

static void attn_span_bf16(const float *q, size_t n_rep, size_t head_dim, const struct vec_kv_span *kv,
			   float scale, float *max, float *sum, float *acc)
{
	attn_span(q, n_rep, head_dim, VEC_KV_BF16, kv, scale, max, sum, acc);
}

static void attn_span_q8(const float *q, size_t n_rep, size_t head_dim, const struct vec_kv_span *kv,
			 float scale, float *max, float *sum, float *acc)
{
	attn_span(q, n_rep, head_dim, VEC_KV_Q8, kv, scale, max, sum, acc);
}

void vec_attn_avx512(const float *q, size_t n_rep, size_t head_dim, const struct vec_kv_span *kv,
		     float scale, float *max, float *sum, float *acc)
{
	if (kv->type == VEC_KV_Q8)
		attn_span_q8(q, n_rep, head_dim, kv, scale, max, sum, acc);
	else if (kv->type == VEC_KV_BF16)
		attn_span_bf16(q, n_rep, head_dim, kv, scale, max, sum, acc);
	else
		attn_span_f16(q, n_rep, head_dim, kv, scale, max, sum, acc);
}

/* f16 by vcvtps2ph (round to nearest even), with NaN made the reference's 0x7E00; bf16
 * rounded in integers like q4_avx512.c's A16 activations (vcvtneps2bf16 would flush
 * subnormals). */
static inline __m256i half16(__m512 x, enum vec_kv_type type)
{
	__m512i b = _mm512_castps_si512(x);
	__mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);

	if (type == VEC_KV_BF16) {
		__m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
		__m512i h = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb)), 16);

		h = _mm512_mask_or_epi32(h, nan, _mm512_srli_epi32(b, 16), _mm512_set1_epi32(64));
		return _mm512_cvtepi32_epi16(h);
	}
	__m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256i canon = _mm256_or_si256(_mm512_cvtepi32_epi16(_mm512_srli_epi32(b, 16)), _mm256_set1_epi16(0x7E00));

	canon = _mm256_and_si256(canon, _mm256_set1_epi16((short)0xFE00));
	return _mm256_mask_blend_epi16(nan, h, canon);
}

/* The Q8 row exactly as vec_ref.c's to_kv_q8: vmaxps returns its second operand when
 * either is NaN, so max(|x|, amax) skips NaNs as the reference's comparison does; max is
 * exact, so the lane order does not matter; the same two divisions; cvtps2dq rounds to
 * nearest even like rintf; NaN codes masked to 0 after the clamp. */
static void to_kv_q8(int8_t *d, const float *src, size_t n)
{
	__m512 vmax = _mm512_setzero_ps();

	for (size_t i = 0; i < n; i += 16)
		vmax = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(tail_mask(n - i), src + i)), vmax);
	float amax = _mm512_reduce_max_ps(vmax);
	float scale = amax / 127.0f, inv = amax != 0.0f ? 127.0f / amax : 0.0f;
	const __m512 vinv = _mm512_set1_ps(inv), hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);

	for (size_t i = 0; i < n; i += 16) {
		__mmask16 m = tail_mask(n - i);
		__m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, src + i), vinv);
		__mmask16 num = _mm512_cmp_ps_mask(x, x, _CMP_ORD_Q);
		__m512i c = _mm512_cvt_roundps_epi32(_mm512_min_ps(_mm512_max_ps(x, lo), hi),
						     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);

		_mm512_mask_cvtsepi32_storeu_epi8(d + i, m, _mm512_maskz_mov_epi32(num, c));
	}
	memcpy(d + n, &scale, sizeof scale);
}

void vec_to_kv_avx512(void *dst, const float *src, size_t n, enum vec_kv_type type)
{
	uint16_t *d = dst;
	size_t i = 0;

	if (type == VEC_KV_Q8) {
		to_kv_q8(dst, src, n);
		return;
	}
	for (; i + 16 <= n; i += 16)
		_mm256_storeu_si256((__m256i *)(d + i), half16(_mm512_loadu_ps(src + i), type));
	if (i < n) {
		__mmask16 m = tail_mask(n - i);

		_mm256_mask_storeu_epi16(d + i, m, half16(_mm512_maskz_loadu_ps(m, src + i), type));
	}
}

/* Two passes over a row that sits in L2: the maximum of the non-NaN values (vmaxps
 * returns its second operand when the first is a NaN, so the running maximum never takes
 * one), then the first index equal to it. */
size_t vec_argmax_avx512(const float *x, size_t n)
{
	if (n == 0 || x[0] != x[0])
		return 0;
	__m512 m = _mm512_set1_ps(-INFINITY);

	for (size_t i = 0; i < n; i += 16) {
		__mmask16 k = tail_mask(n - i);

		m = _mm512_max_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + i), m);
	}
	__m512 best = _mm512_set1_ps(_mm512_reduce_max_ps(m));

	for (size_t i = 0; i < n; i += 16) {
		__mmask16 k = tail_mask(n - i);
		__mmask16 eq = _mm512_mask_cmp_ps_mask(k, _mm512_maskz_loadu_ps(k, x + i), best, _CMP_EQ_OQ);

		if (eq)
			return i + (size_t)__builtin_ctz(eq);
	}
	return 0;
}

/* Four independent accumulators: one add chain would bound the loop by its latency. */
uint64_t vec_sum_u64_avx512(const void *p, size_t n)
{
	const uint8_t *b = p;
	__m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;

	for (size_t i = 0; i + 256 <= n; i += 256) {
		a0 = _mm512_add_epi64(a0, _mm512_load_si512((const void *)(b + i)));
		a1 = _mm512_add_epi64(a1, _mm512_load_si512((const void *)(b + i + 64)));
		a2 = _mm512_add_epi64(a2, _mm512_load_si512((const void *)(b + i + 128)));
		a3 = _mm512_add_epi64(a3, _mm512_load_si512((const void *)(b + i + 192)));
	}
	a0 = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
	return (uint64_t)_mm512_reduce_add_epi64(a0);
}

/* c[0..16) += the sixteen floats of a widened to double, lanes outside k left alone. */
static void cov_add16(double *c, __m512 a, __mmask16 k)
{
	__mmask8 lo = (__mmask8)k, hi = (__mmask8)(k >> 8);

	_mm512_mask_storeu_pd(c, lo, _mm512_add_pd(_mm512_maskz_loadu_pd(lo, c), _mm512_cvtps_pd(_mm512_castps512_ps256(a))));
	_mm512_mask_storeu_pd(c + 8, hi,
			      _mm512_add_pd(_mm512_maskz_loadu_pd(hi, c + 8), _mm512_cvtps_pd(_mm512_extractf32x8_ps(a, 1))));
}

void vec_cov_row_avx512(double *c, const float *x, size_t ld, size_t n_tok, size_t i, size_t j0, size_t j1)
{
	size_t j = j0;

	for (; j + 64 <= j1; j += 64) {
		__m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;

		for (size_t t = 0; t < n_tok; t++) {
			const float *r = x + t * ld + j;
			__m512 xi = _mm512_set1_ps(x[t * ld + i]);

			a0 = _mm512_fmadd_ps(xi, _mm512_loadu_ps(r), a0);
			a1 = _mm512_fmadd_ps(xi, _mm512_loadu_ps(r + 16), a1);
			a2 = _mm512_fmadd_ps(xi, _mm512_loadu_ps(r + 32), a2);
			a3 = _mm512_fmadd_ps(xi, _mm512_loadu_ps(r + 48), a3);
		}
		cov_add16(c + j - j0, a0, 0xffff);
		cov_add16(c + j - j0 + 16, a1, 0xffff);
		cov_add16(c + j - j0 + 32, a2, 0xffff);
		cov_add16(c + j - j0 + 48, a3, 0xffff);
	}
	for (; j < j1; j += 16) {
		__mmask16 k = j1 - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (j1 - j)) - 1);
		__m512 a = _mm512_setzero_ps();

		for (size_t t = 0; t < n_tok; t++)
			a = _mm512_fmadd_ps(_mm512_set1_ps(x[t * ld + i]), _mm512_maskz_loadu_ps(k, x + t * ld + j), a);
		cov_add16(c + j - j0, a, k);
	}
}

static __mmask16 cov_mask(size_t js, size_t j1)
{
	return js >= j1 ? 0 : j1 - js >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (j1 - js)) - 1);
}

/* One row's four accumulators of a cov_rows step added, lanes left of the row's diagonal
 * (its first r, in the step that starts at column i0) left out. */
static void cov_add64(double *c, __m512 a0, __m512 a1, __m512 a2, __m512 a3, const __mmask16 *k, bool first,
		      int r)
{
	cov_add16(c, a0, first ? (__mmask16)(k[0] & (0xffffu << r)) : k[0]);
	cov_add16(c + 16, a1, k[1]);
	cov_add16(c + 32, a2, k[2]);
	cov_add16(c + 48, a3, k[3]);
}

/* Four rows by 64 columns a step: sixteen accumulators, each token's four loads of columns
 * shared by the four rows (a load per four FMAs instead of one each). Every row starts at
 * column i0, the first row's diagonal: the entries left of a row's own (its first r lanes,
 * r < 4 < 16) are computed and not added. Rows past a multiple of four go one at a time. */
void vec_cov_rows_avx512(double *c, size_t ldc, const float *x, size_t ld, size_t n_tok, size_t i, size_t n_rows,
			 size_t j1)
{
	size_t r0 = 0;

	for (; r0 + 4 <= n_rows; r0 += 4) {
		size_t i0 = i + r0;

		for (size_t j = i0; j < j1; j += 64) {
			const __mmask16 k[4] = { cov_mask(j, j1), cov_mask(j + 16, j1), cov_mask(j + 32, j1),
						 cov_mask(j + 48, j1) };
			__m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
			__m512 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
			__m512 a20 = a00, a21 = a00, a22 = a00, a23 = a00;
			__m512 a30 = a00, a31 = a00, a32 = a00, a33 = a00;

			for (size_t t = 0; t < n_tok; t++) {
				const float *xt = x + t * ld;
				__m512 v0 = _mm512_maskz_loadu_ps(k[0], xt + j), v1 = _mm512_maskz_loadu_ps(k[1], xt + j + 16);
				__m512 v2 = _mm512_maskz_loadu_ps(k[2], xt + j + 32), v3 = _mm512_maskz_loadu_ps(k[3], xt + j + 48);
				__m512 b;

				b = _mm512_set1_ps(xt[i0]);
				a00 = _mm512_fmadd_ps(b, v0, a00);
				a01 = _mm512_fmadd_ps(b, v1, a01);
				a02 = _mm512_fmadd_ps(b, v2, a02);
				a03 = _mm512_fmadd_ps(b, v3, a03);
				b = _mm512_set1_ps(xt[i0 + 1]);
				a10 = _mm512_fmadd_ps(b, v0, a10);
				a11 = _mm512_fmadd_ps(b, v1, a11);
				a12 = _mm512_fmadd_ps(b, v2, a12);
				a13 = _mm512_fmadd_ps(b, v3, a13);
				b = _mm512_set1_ps(xt[i0 + 2]);
				a20 = _mm512_fmadd_ps(b, v0, a20);
				a21 = _mm512_fmadd_ps(b, v1, a21);
				a22 = _mm512_fmadd_ps(b, v2, a22);
				a23 = _mm512_fmadd_ps(b, v3, a23);
				b = _mm512_set1_ps(xt[i0 + 3]);
				a30 = _mm512_fmadd_ps(b, v0, a30);
				a31 = _mm512_fmadd_ps(b, v1, a31);
				a32 = _mm512_fmadd_ps(b, v2, a32);
				a33 = _mm512_fmadd_ps(b, v3, a33);
			}
			double *cr = c + r0 * ldc + r0 + (j - i0);
			cov_add64(cr, a00, a01, a02, a03, k, j == i0, 0);
			cov_add64(cr + ldc, a10, a11, a12, a13, k, j == i0, 1);
			cov_add64(cr + 2 * ldc, a20, a21, a22, a23, k, j == i0, 2);
			cov_add64(cr + 3 * ldc, a30, a31, a32, a33, k, j == i0, 3);
		}
	}
	for (; r0 < n_rows; r0++)
		vec_cov_row_avx512(c + r0 * ldc + r0, x, ld, n_tok, i + r0, i + r0, j1);
}

void vec_sub_scaled_avx512(float *x, const float *u, float e, size_t n)
{
	__m512 ve = _mm512_set1_ps(e);
	size_t j = 0;

	for (; j + 32 <= n; j += 32) {
		_mm512_storeu_ps(x + j, _mm512_fnmadd_ps(ve, _mm512_loadu_ps(u + j), _mm512_loadu_ps(x + j)));
		_mm512_storeu_ps(x + j + 16, _mm512_fnmadd_ps(ve, _mm512_loadu_ps(u + j + 16), _mm512_loadu_ps(x + j + 16)));
	}
	for (; j < n; j += 16) {
		__mmask16 k = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1);

		_mm512_mask_storeu_ps(x + j, k,
				      _mm512_fnmadd_ps(ve, _mm512_maskz_loadu_ps(k, u + j), _mm512_maskz_loadu_ps(k, x + j)));
	}
}

static __mmask16 run_mask(size_t left)
{
	return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
}

/* Four rows by 32 columns at a time, eight accumulators, each row of u read once for the
 * four rows. Fewer than four rows left repeat the last one: the same floats computed and
 * written twice, so no separate narrow path. */
void vec_sub_run_avx512(float *x, size_t ld, size_t n_rows, const float *e, size_t nk, const float *u, size_t ldu,
			size_t n)
{
	for (size_t r0 = 0; r0 < n_rows; r0 += 4) {
		float *xr[4];
		const float *er[4];

		vec_gptq_rows4(x, ld, e, nk, r0, n_rows, xr, er);
		float *x0 = xr[0], *x1 = xr[1], *x2 = xr[2], *x3 = xr[3];
		const float *e0 = er[0], *e1 = er[1], *e2 = er[2], *e3 = er[3];

		for (size_t j = 0; j < n; j += 32) {
			__mmask16 m0 = run_mask(n - j), m1 = n - j > 16 ? run_mask(n - j - 16) : 0;
			__m512 a0 = _mm512_maskz_loadu_ps(m0, x0 + j), a1 = _mm512_maskz_loadu_ps(m1, x0 + j + 16);
			__m512 a2 = _mm512_maskz_loadu_ps(m0, x1 + j), a3 = _mm512_maskz_loadu_ps(m1, x1 + j + 16);
			__m512 a4 = _mm512_maskz_loadu_ps(m0, x2 + j), a5 = _mm512_maskz_loadu_ps(m1, x2 + j + 16);
			__m512 a6 = _mm512_maskz_loadu_ps(m0, x3 + j), a7 = _mm512_maskz_loadu_ps(m1, x3 + j + 16);
			const float *uk = u + j;

			for (size_t k = 0; k < nk; k++, uk += ldu) {
				__m512 u0 = _mm512_maskz_loadu_ps(m0, uk), u1 = _mm512_maskz_loadu_ps(m1, uk + 16);
				__m512 b0 = _mm512_set1_ps(e0[k]), b1 = _mm512_set1_ps(e1[k]);
				__m512 b2 = _mm512_set1_ps(e2[k]), b3 = _mm512_set1_ps(e3[k]);

				a0 = _mm512_fnmadd_ps(b0, u0, a0);
				a1 = _mm512_fnmadd_ps(b0, u1, a1);
				a2 = _mm512_fnmadd_ps(b1, u0, a2);
				a3 = _mm512_fnmadd_ps(b1, u1, a3);
				a4 = _mm512_fnmadd_ps(b2, u0, a4);
				a5 = _mm512_fnmadd_ps(b2, u1, a5);
				a6 = _mm512_fnmadd_ps(b3, u0, a6);
				a7 = _mm512_fnmadd_ps(b3, u1, a7);
			}
			_mm512_mask_storeu_ps(x3 + j, m0, a6);
			_mm512_mask_storeu_ps(x3 + j + 16, m1, a7);
			_mm512_mask_storeu_ps(x2 + j, m0, a4);
			_mm512_mask_storeu_ps(x2 + j + 16, m1, a5);
			_mm512_mask_storeu_ps(x1 + j, m0, a2);
			_mm512_mask_storeu_ps(x1 + j + 16, m1, a3);
			_mm512_mask_storeu_ps(x0 + j, m0, a0);
			_mm512_mask_storeu_ps(x0 + j + 16, m1, a1);
		}
	}
}

const struct vec_gptq vec_gptq_avx512 = { vec_sub_scaled_avx512, vec_sub_run_avx512 };
