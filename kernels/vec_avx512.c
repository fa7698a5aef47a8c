/* AVX-512 variants of the vector ops in kernels/vec.h: 16 floats a step, masked tails,
 * a Cephes-style exp (about 2 ulp) for SiLU, and attention that converts each f16/bf16
 * K/V row on the fly. Built with AVX-512 target flags. */
#include "kernels/vec.h"

#include <immintrin.h>
#include <math.h>

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

static inline __m512 kv_load(enum vec_kv_type type, const uint8_t *row, size_t i)
{
	__m256i h = _mm256_loadu_si256((const __m256i *)(row + 2 * i));

	if (type == VEC_KV_BF16)
		return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
	return _mm512_cvtph_ps(h);
}

#define ATTN_POS 16   /* positions per block: one exp512 and one rescale per block */

/* One query head against a block of up to 16 positions. K/V chunks are converted again
 * for each head of the group: that keeps every accumulator in a register (a per-head
 * array of accumulators would live on the stack and chain through store forwarding). */
static void attn_block(const float *q, size_t head_dim, enum vec_kv_type type, const uint8_t *k,
		       size_t k_stride, const uint8_t *v, size_t v_stride, size_t nb, float scale,
		       float *max, float *sum, float *acc)
{
	float sc[ATTN_POS], e[ATTN_POS];
	__mmask16 live = tail_mask(nb);

	for (size_t j = 0; j < nb; j++) {
		const uint8_t *kr = k + j * k_stride;
		__m512 d0 = _mm512_setzero_ps(), d1 = d0;
		size_t i = 0;

		for (; i + 32 <= head_dim; i += 32) {
			d0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), kv_load(type, kr, i), d0);
			d1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i + 16), kv_load(type, kr, i + 16), d1);
		}
		if (i < head_dim)
			d0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), kv_load(type, kr, i), d0);
		sc[j] = _mm512_reduce_add_ps(_mm512_add_ps(d0, d1)) * scale;
	}
	__m512 s = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), live, sc);
	float bmax = _mm512_reduce_max_ps(s);

	if (bmax > *max) {
		/* A new maximum rescales what was summed so far, once per block. */
		float c = *max == -INFINITY ? 0.0f : expf(*max - bmax);
		__m512 vc = _mm512_set1_ps(c);

		for (size_t i = 0; i < head_dim; i += 16)
			_mm512_storeu_ps(acc + i, _mm512_mul_ps(_mm512_loadu_ps(acc + i), vc));
		*sum *= c;
		*max = bmax;
	}
	__m512 ev = _mm512_maskz_mov_ps(live, exp512(_mm512_sub_ps(s, _mm512_set1_ps(*max))));

	*sum += _mm512_reduce_add_ps(ev);
	_mm512_storeu_ps(e, ev);
	for (size_t i = 0; i < head_dim; i += 16) {
		__m512 a0 = _mm512_loadu_ps(acc + i), a1 = _mm512_setzero_ps();
		size_t j = 0;

		for (; j + 2 <= nb; j += 2) {
			a0 = _mm512_fmadd_ps(_mm512_set1_ps(e[j]), kv_load(type, v + j * v_stride, i), a0);
			a1 = _mm512_fmadd_ps(_mm512_set1_ps(e[j + 1]), kv_load(type, v + (j + 1) * v_stride, i), a1);
		}
		if (j < nb)
			a0 = _mm512_fmadd_ps(_mm512_set1_ps(e[j]), kv_load(type, v + j * v_stride, i), a0);
		_mm512_storeu_ps(acc + i, _mm512_add_ps(a0, a1));
	}
}

void vec_attn_avx512(const float *q, size_t n_rep, size_t head_dim, enum vec_kv_type type,
		     const void *k, size_t k_stride, const void *v, size_t v_stride,
		     size_t n_pos, float scale, float *max, float *sum, float *acc)
{
	for (size_t p0 = 0; p0 < n_pos; p0 += ATTN_POS) {
		size_t nb = n_pos - p0 < ATTN_POS ? n_pos - p0 : ATTN_POS;

		/* The block's K/V rows (16 x head_dim x 2 bytes) stay in L1 for every head. */
		for (size_t r = 0; r < n_rep; r++)
			attn_block(q + r * head_dim, head_dim, type, (const uint8_t *)k + p0 * k_stride, k_stride,
				   (const uint8_t *)v + p0 * v_stride, v_stride, nb, scale, &max[r], &sum[r],
				   acc + r * head_dim);
	}
}
