/* AVX2 variants of the vector ops in kernels/vec.h: 8 floats a step with scalar tails,
 * a Cephes-style exp (about 2 ulp) for SiLU, attention converting f16/bf16 rows on the
 * fly. Built with AVX2/FMA/F16C target flags. */
#include "kernels/vec.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/quant.h"

static inline float hsum(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* exp(x), x clamped to [-87.3, 88.3] so 2^n stays a normal float. */
static inline __m256 exp256(__m256 x)
{
	x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
	__m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
				   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);

	r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
	__m256 p = _mm256_set1_ps(1.9875691500e-4f);

	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
	p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
	__m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);

	return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

void vec_rmsnorm_avx2(float *out, const float *x, const float *w, size_t n, float eps)
{
	__m256 s0 = _mm256_setzero_ps(), s1 = s0;
	size_t i = 0;
	float tail = 0.0f;

	for (; i + 16 <= n; i += 16) {
		__m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);

		s0 = _mm256_fmadd_ps(a, a, s0);
		s1 = _mm256_fmadd_ps(b, b, s1);
	}
	for (; i < n; i++)
		tail += x[i] * x[i];
	float ss = hsum(_mm256_add_ps(s0, s1)) + tail;
	float scale = 1.0f / sqrtf(ss / (float)n + eps);
	__m256 vs = _mm256_set1_ps(scale);

	for (i = 0; i + 8 <= n; i += 8) {
		__m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);

		if (w)
			v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
		_mm256_storeu_ps(out + i, v);
	}
	for (; i < n; i++)
		out[i] = w ? x[i] * scale * w[i] : x[i] * scale;
}

void vec_rope_avx2(float *x, size_t n_heads, size_t head_dim, size_t n_rot, enum vec_rope_style style,
		   const float *cos_row, const float *sin_row)
{
	const size_t half = n_rot / 2;
	const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);

	for (size_t h = 0; h < n_heads; h++) {
		float *v = x + h * head_dim;
		size_t i = 0;

		if (style == VEC_ROPE_NEOX) {
			for (; i + 8 <= half; i += 8) {
				__m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + i + half);
				__m256 c = _mm256_loadu_ps(cos_row + i), s = _mm256_loadu_ps(sin_row + i);

				_mm256_storeu_ps(v + i, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)));
				_mm256_storeu_ps(v + i + half, _mm256_fmadd_ps(a, s, _mm256_mul_ps(b, c)));
			}
		} else {
			for (; i + 4 <= half; i += 4) {
				__m256 xv = _mm256_loadu_ps(v + 2 * i);
				__m256 c = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cos_row + i)), dup);
				__m256 s = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sin_row + i)), dup);
				__m256 sw = _mm256_permute_ps(xv, 0xB1);

				_mm256_storeu_ps(v + 2 * i, _mm256_fmaddsub_ps(xv, c, _mm256_mul_ps(sw, s)));
			}
		}
		for (; i < half; i++) {
			size_t a = style == VEC_ROPE_NEOX ? i : 2 * i;
			size_t b = style == VEC_ROPE_NEOX ? i + half : 2 * i + 1;
			float x0 = v[a], x1 = v[b], c = cos_row[i], s = sin_row[i];

			v[a] = x0 * c - x1 * s;
			v[b] = x0 * s + x1 * c;
		}
	}
}

void vec_silu_mul_avx2(float *gate, const float *up, size_t n)
{
	const __m256 one = _mm256_set1_ps(1.0f);
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m256 g = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i);
		__m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));

		_mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u));
	}
	for (; i < n; i++)
		gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

void vec_gelu_mul_avx2(float *gate, const float *up, size_t n)
{
	const __m256 one = _mm256_set1_ps(1.0f), m2c = _mm256_set1_ps(-2.0f * VEC_GELU_SQRT_2_PI);
	const __m256 a = _mm256_set1_ps(VEC_GELU_COEF);
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m256 x = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i);
		__m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
		__m256 e = exp256(_mm256_mul_ps(m2c, _mm256_fmadd_ps(a, x3, x)));

		_mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), u));
	}
	vec_gelu_mul_ref(gate + i, up + i, n - i);
}

static inline __m256 kv_load(enum vec_kv_type type, const uint8_t *row, size_t i)
{
	if (type == VEC_KV_Q8)  /* codes only: the row's scale is applied outside */
		return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + i))));
	__m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * i));

	if (type == VEC_KV_BF16)
		return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
	return _mm256_cvtph_ps(h);
}

#define ATTN_POS 8     /* positions per block: one exp256 and one rescale per block */

static inline float hmax(__m256 v)
{
	__m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	m = _mm_max_ps(m, _mm_movehl_ps(m, m));
	m = _mm_max_ss(m, _mm_movehdup_ps(m));
	return _mm_cvtss_f32(m);
}

/* One query head against a block of up to 8 rows (K rows k[j], V rows v[j]). */
static void attn_block(const float *q, size_t head_dim, enum vec_kv_type type, const uint8_t *const *k,
		       const uint8_t *const *v, size_t nb, float scale, float *max, float *sum, float *acc)
{
	float sc[ATTN_POS], e[ATTN_POS];

	for (size_t j = 0; j < ATTN_POS; j++)
		sc[j] = -INFINITY;
	for (size_t j = 0; j < nb; j++) {
		const uint8_t *kr = k[j];
		__m256 d0 = _mm256_setzero_ps(), d1 = d0;

		for (size_t i = 0; i < head_dim; i += 16) {
			d0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), kv_load(type, kr, i), d0);
			d1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), kv_load(type, kr, i + 8), d1);
		}
		float ks = 1.0f;

		if (type == VEC_KV_Q8)
			memcpy(&ks, kr + head_dim, sizeof ks);
		sc[j] = hsum(_mm256_add_ps(d0, d1)) * ks * scale;
	}
	__m256 s = _mm256_loadu_ps(sc);
	float bmax = hmax(s);

	if (bmax > *max) {
		/* A new maximum rescales what was summed so far, once per block. */
		float c = *max == -INFINITY ? 0.0f : expf(*max - bmax);
		__m256 vc = _mm256_set1_ps(c);

		for (size_t i = 0; i < head_dim; i += 8)
			_mm256_storeu_ps(acc + i, _mm256_mul_ps(_mm256_loadu_ps(acc + i), vc));
		*sum *= c;
		*max = bmax;
	}
	/* Dead lanes hold -inf: exp256 clamps them to ~1e-38, the mask makes them 0. */
	__m256 live = _mm256_cmp_ps(s, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ);
	__m256 ev = _mm256_and_ps(live, exp256(_mm256_sub_ps(s, _mm256_set1_ps(*max))));

	*sum += hsum(ev);
	_mm256_storeu_ps(e, ev);
	if (type == VEC_KV_Q8)  /* the V row's scale rides on its weight */
		for (size_t j = 0; j < nb; j++) {
			float vs;

			memcpy(&vs, v[j] + head_dim, sizeof vs);
			e[j] *= vs;
		}
	for (size_t i = 0; i < head_dim; i += 8) {
		__m256 a0 = _mm256_loadu_ps(acc + i), a1 = _mm256_setzero_ps();
		size_t j = 0;

		for (; j + 2 <= nb; j += 2) {
			a0 = _mm256_fmadd_ps(_mm256_set1_ps(e[j]), kv_load(type, v[j], i), a0);
			a1 = _mm256_fmadd_ps(_mm256_set1_ps(e[j + 1]), kv_load(type, v[j + 1], i), a1);
		}
		if (j < nb)
			a0 = _mm256_fmadd_ps(_mm256_set1_ps(e[j]), kv_load(type, v[j], i), a0);
		_mm256_storeu_ps(acc + i, _mm256_add_ps(a0, a1));
	}
}

void vec_attn_avx2(const float *q, size_t n_rep, size_t head_dim, const struct vec_kv_span *kv,
		   float scale, float *max, float *sum, float *acc)
{
	const uint8_t *k[ATTN_POS], *v[ATTN_POS];

	for (size_t h = 0; h < kv->n_heads; h++)
		for (size_t p0 = 0; p0 < kv->n; p0 += ATTN_POS) {
			size_t nb = kv->n - p0 < ATTN_POS ? kv->n - p0 : ATTN_POS;

			vec_kv_rows(kv, h, p0, nb, k, v);
			for (size_t r = h * n_rep; r < (h + 1) * n_rep; r++)
				attn_block(q + r * head_dim, head_dim, kv->type, k, v, nb, scale, &max[r], &sum[r],
					   acc + r * head_dim);
		}
}

/* The Q8 row exactly as vec_ref.c's to_kv_q8: vmaxps returns its second operand when
 * either is NaN, so max(|x|, amax) skips NaNs as the reference's comparison does; max is
 * exact, so lane order does not matter; the same two divisions; cvtps2dq rounds to nearest
 * even like rintf; NaN codes masked to 0 after the clamp; tails in the reference's
 * scalar operations. */
static void to_kv_q8(int8_t *d, const float *src, size_t n)
{
	const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
	__m256 vmax = _mm256_setzero_ps();
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		vmax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(src + i), abs_mask), vmax);
	float amax = hmax(vmax);

	for (; i < n; i++) {
		float a = fabsf(src[i]);

		amax = a > amax ? a : amax;
	}
	float scale = amax / 127.0f, inv = amax != 0.0f ? 127.0f / amax : 0.0f;
	const __m256 vinv = _mm256_set1_ps(inv), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);

	for (i = 0; i + 8 <= n; i += 8) {
		__m256 x = _mm256_mul_ps(_mm256_loadu_ps(src + i), vinv);
		__m256i num = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_ORD_Q));
		__m256i c = _mm256_and_si256(_mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(x, lo), hi)), num);
		__m128i w = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));

		_mm_storel_epi64((__m128i *)(d + i), _mm_packs_epi16(w, w));
	}
	for (; i < n; i++) {
		float v = src[i] * inv;

		v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
		d[i] = v == v ? (int8_t)rintf(v) : 0;
	}
	memcpy(d + n, &scale, sizeof scale);
}

/* f16 by vcvtps2ph (round to nearest even), bf16 rounded in integers; NaN (rare: a
 * broken row) goes through the scalar reference so the bits match it. */
void vec_to_kv_avx2(void *dst, const float *src, size_t n, enum vec_kv_type type)
{
	uint16_t *d = dst;
	size_t i = 0;

	if (type == VEC_KV_Q8) {
		to_kv_q8(dst, src, n);
		return;
	}
	for (; i + 8 <= n; i += 8) {
		__m256 x = _mm256_loadu_ps(src + i);

		if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)))
			break;
		if (type == VEC_KV_BF16) {
			__m256i b = _mm256_castps_si256(x);
			__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
			__m256i h = _mm256_srli_epi32(
				_mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)), 16);
			__m128i p = _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));

			_mm_storeu_si128((__m128i *)(d + i), p);
		} else {
			_mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
		}
	}
	for (; i < n; i++)
		d[i] = type == VEC_KV_BF16 ? quant_f32_to_bf16(src[i]) : quant_f32_to_fp16(src[i]);
}

/* As vec_argmax_avx512: the maximum of the non-NaN values (vmaxps keeps its second
 * operand when the first is a NaN), then the first index equal to it. */
size_t vec_argmax_avx2(const float *x, size_t n)
{
	if (n == 0 || x[0] != x[0])
		return 0;
	__m256 m = _mm256_set1_ps(-INFINITY);
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
	__m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
	h = _mm_max_ps(h, _mm_movehl_ps(h, h));
	h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
	float mx = _mm_cvtss_f32(h);

	for (; i < n; i++)
		if (x[i] > mx)
			mx = x[i];
	__m256 best = _mm256_set1_ps(mx);

	for (i = 0; i + 8 <= n; i += 8) {
		int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), best, _CMP_EQ_OQ));

		if (eq)
			return i + (size_t)__builtin_ctz((unsigned)eq);
	}
	for (; i < n; i++)
		if (x[i] == mx)
			return i;
	return 0;
}

/* Four independent accumulators: one add chain would bound the loop by its latency. */
uint64_t vec_sum_u64_avx2(const void *p, size_t n)
{
	const uint8_t *b = p;
	__m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;

	for (size_t i = 0; i + 128 <= n; i += 128) {
		a0 = _mm256_add_epi64(a0, _mm256_load_si256((const void *)(b + i)));
		a1 = _mm256_add_epi64(a1, _mm256_load_si256((const void *)(b + i + 32)));
		a2 = _mm256_add_epi64(a2, _mm256_load_si256((const void *)(b + i + 64)));
		a3 = _mm256_add_epi64(a3, _mm256_load_si256((const void *)(b + i + 96)));
	}
	a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
	uint64_t l[4];
	_mm256_storeu_si256((void *)l, a0);
	return l[0] + l[1] + l[2] + l[3];
}

/* c[0..8) += the eight floats of a, each widened to double. */
static void cov_add8(double *c, __m256 a)
{
	_mm256_storeu_pd(c, _mm256_add_pd(_mm256_loadu_pd(c), _mm256_cvtps_pd(_mm256_castps256_ps128(a))));
	_mm256_storeu_pd(c + 4, _mm256_add_pd(_mm256_loadu_pd(c + 4), _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1))));
}

void vec_cov_row_avx2(double *c, const float *x, size_t ld, size_t n_tok, size_t i, size_t j0, size_t j1)
{
	size_t j = j0;

	for (; j + 32 <= j1; j += 32) {
		__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;

		for (size_t t = 0; t < n_tok; t++) {
			const float *r = x + t * ld + j;
			__m256 xi = _mm256_set1_ps(x[t * ld + i]);

			a0 = _mm256_fmadd_ps(xi, _mm256_loadu_ps(r), a0);
			a1 = _mm256_fmadd_ps(xi, _mm256_loadu_ps(r + 8), a1);
			a2 = _mm256_fmadd_ps(xi, _mm256_loadu_ps(r + 16), a2);
			a3 = _mm256_fmadd_ps(xi, _mm256_loadu_ps(r + 24), a3);
		}
		cov_add8(c + j - j0, a0);
		cov_add8(c + j - j0 + 8, a1);
		cov_add8(c + j - j0 + 16, a2);
		cov_add8(c + j - j0 + 24, a3);
	}
	for (; j + 8 <= j1; j += 8) {
		__m256 a = _mm256_setzero_ps();

		for (size_t t = 0; t < n_tok; t++)
			a = _mm256_fmadd_ps(_mm256_set1_ps(x[t * ld + i]), _mm256_loadu_ps(x + t * ld + j), a);
		cov_add8(c + j - j0, a);
	}
	vec_cov_row_ref(c + j - j0, x, ld, n_tok, i, j, j1); /* the last columns, fewer than 8 */
}

/* Row by row: eight lanes leave too few registers to share loads among rows. */
void vec_cov_rows_avx2(double *c, size_t ldc, const float *x, size_t ld, size_t n_tok, size_t i, size_t n_rows,
		       size_t j1)
{
	for (size_t r = 0; r < n_rows; r++)
		vec_cov_row_avx2(c + r * ldc + r, x, ld, n_tok, i + r, i + r, j1);
}

void vec_sub_scaled_avx2(float *x, const float *u, float e, size_t n)
{
	__m256 ve = _mm256_set1_ps(e);
	size_t j = 0;

	for (; j + 16 <= n; j += 16) {
		_mm256_storeu_ps(x + j, _mm256_fnmadd_ps(ve, _mm256_loadu_ps(u + j), _mm256_loadu_ps(x + j)));
		_mm256_storeu_ps(x + j + 8, _mm256_fnmadd_ps(ve, _mm256_loadu_ps(u + j + 8), _mm256_loadu_ps(x + j + 8)));
	}
	for (; j + 8 <= n; j += 8)
		_mm256_storeu_ps(x + j, _mm256_fnmadd_ps(ve, _mm256_loadu_ps(u + j), _mm256_loadu_ps(x + j)));
	vec_sub_scaled_ref(x + j, u + j, e, n - j); /* the last columns, fewer than 8 */
}

/* As the AVX-512 kernel: four rows (the last repeated when fewer are left) by 16 columns,
 * eight accumulators; the last columns, fewer than 8, by the reference. */
void vec_sub_run_avx2(float *x, size_t ld, size_t n_rows, const float *e, size_t nk, const float *u, size_t ldu,
		      size_t n)
{
	size_t n8 = n / 8 * 8;

	for (size_t r0 = 0; r0 < n_rows; r0 += 4) {
		float *xr[4];
		const float *er[4];

		vec_gptq_rows4(x, ld, e, nk, r0, n_rows, xr, er);
		float *x0 = xr[0], *x1 = xr[1], *x2 = xr[2], *x3 = xr[3];
		const float *e0 = er[0], *e1 = er[1], *e2 = er[2], *e3 = er[3];

		/* 16-column steps, the last maybe 8 (h 0: its second half repeats the first) */
		for (size_t j = 0, h; j < n8; j += 8 + h) {
			h = j + 16 <= n8 ? 8 : 0;
			__m256 a0 = _mm256_loadu_ps(x0 + j), a1 = _mm256_loadu_ps(x0 + j + h);
			__m256 a2 = _mm256_loadu_ps(x1 + j), a3 = _mm256_loadu_ps(x1 + j + h);
			__m256 a4 = _mm256_loadu_ps(x2 + j), a5 = _mm256_loadu_ps(x2 + j + h);
			__m256 a6 = _mm256_loadu_ps(x3 + j), a7 = _mm256_loadu_ps(x3 + j + h);
			const float *uk = u + j;

			for (size_t k = 0; k < nk; k++, uk += ldu) {
				__m256 u0 = _mm256_loadu_ps(uk), u1 = _mm256_loadu_ps(uk + h);
				__m256 b0 = _mm256_set1_ps(e0[k]), b1 = _mm256_set1_ps(e1[k]);
				__m256 b2 = _mm256_set1_ps(e2[k]), b3 = _mm256_set1_ps(e3[k]);

				a0 = _mm256_fnmadd_ps(b0, u0, a0);
				a1 = _mm256_fnmadd_ps(b0, u1, a1);
				a2 = _mm256_fnmadd_ps(b1, u0, a2);
				a3 = _mm256_fnmadd_ps(b1, u1, a3);
				a4 = _mm256_fnmadd_ps(b2, u0, a4);
				a5 = _mm256_fnmadd_ps(b2, u1, a5);
				a6 = _mm256_fnmadd_ps(b3, u0, a6);
				a7 = _mm256_fnmadd_ps(b3, u1, a7);
			}
			_mm256_storeu_ps(x3 + j + h, a7);
			_mm256_storeu_ps(x3 + j, a6);
			_mm256_storeu_ps(x2 + j + h, a5);
			_mm256_storeu_ps(x2 + j, a4);
			_mm256_storeu_ps(x1 + j + h, a3);
			_mm256_storeu_ps(x1 + j, a2);
			_mm256_storeu_ps(x0 + j + h, a1);
			_mm256_storeu_ps(x0 + j, a0);
		}
	}
	if (n8 < n)
		vec_sub_run_ref(x + n8, ld, n_rows, e, nk, u + n8, ldu, n - n8);
}

const struct vec_gptq vec_gptq_avx2 = { vec_sub_scaled_avx2, vec_sub_run_avx2 };
