/* Scalar reference of the dispatched vector ops (kernels/vec.h) and the ISA-free helpers
 * (RoPE tables, attention state). Sums in double: the SIMD variants are measured against
 * these, so these aim at the exact value. */
#include "kernels/vec.h"

#include <math.h>
#include <string.h>

#include "kernels/quant.h"

void vec_rope_table(float *cos_tab, float *sin_tab, size_t n_pos, size_t n_rot, float freq_base,
		    float freq_scale, const float *freq_factors)
{
	/* As ops_ref_rope: the angle is a running product in float, as llama.cpp builds it. */
	const float ratio = powf(freq_base, -2.0f / (float)n_rot);
	const size_t half = n_rot / 2;

	for (size_t p = 0; p < n_pos; p++) {
		float theta = (float)p;

		for (size_t i = 0; i < half; i++) {
			float ff = freq_factors ? freq_factors[i] : 1.0f;
			float angle = freq_scale * (theta / ff);

			cos_tab[p * half + i] = cosf(angle);
			sin_tab[p * half + i] = sinf(angle);
			theta *= ratio;
		}
	}
}

void vec_attn_init(float *max, float *sum, float *acc, size_t n_rep, size_t head_dim)
{
	for (size_t r = 0; r < n_rep; r++) {
		max[r] = -INFINITY;
		sum[r] = 0.0f;
	}
	memset(acc, 0, n_rep * head_dim * sizeof(float));
}

void vec_attn_finish(float *out, const float *sum, const float *acc, size_t n_rep, size_t head_dim)
{
	for (size_t r = 0; r < n_rep; r++) {
		float inv = sum[r] > 0.0f ? 1.0f / sum[r] : 0.0f;

		for (size_t i = 0; i < head_dim; i++)
			out[r * head_dim + i] = acc[r * head_dim + i] * inv;
	}
}

void vec_rmsnorm_ref(float *out, const float *x, const float *w, size_t n, float eps)
{
	double ss = 0.0;

	for (size_t i = 0; i < n; i++)
		ss += (double)x[i] * (double)x[i];
	float scale = 1.0f / sqrtf((float)(ss / (double)n) + eps);

	for (size_t i = 0; i < n; i++)
		out[i] = w ? x[i] * scale * w[i] : x[i] * scale;
}

void vec_rope_ref(float *x, size_t n_heads, size_t head_dim, size_t n_rot, enum vec_rope_style style,
		  const float *cos_row, const float *sin_row)
{
	const size_t half = n_rot / 2;

	for (size_t h = 0; h < n_heads; h++) {
		float *v = x + h * head_dim;

		for (size_t i = 0; i < half; i++) {
			size_t a = style == VEC_ROPE_NEOX ? i : 2 * i;
			size_t b = style == VEC_ROPE_NEOX ? i + half : 2 * i + 1;
			float x0 = v[a], x1 = v[b], c = cos_row[i], s = sin_row[i];

			v[a] = x0 * c - x1 * s;
			v[b] = x0 * s + x1 * c;
		}
	}
}

void vec_silu_mul_ref(float *gate, const float *up, size_t n)
{
	for (size_t i = 0; i < n; i++)
		gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

void vec_gelu_mul_ref(float *gate, const float *up, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float x = gate[i];
		float u = VEC_GELU_SQRT_2_PI * (x + VEC_GELU_COEF * x * x * x);
		gate[i] = x / (1.0f + expf(-2.0f * u)) * up[i];
	}
}

static float kv_at(enum vec_kv_type type, const void *row, size_t i)
{
	uint16_t h;

	if (type == VEC_KV_Q8)
		return (float)((const int8_t *)row)[i];
	memcpy(&h, (const uint8_t *)row + 2 * i, 2);
	return type == VEC_KV_BF16 ? quant_bf16_to_f32(h) : quant_fp16_to_f32(h);
}

/* A row's scale: 1 for f16/bf16, the f32 after the codes for Q8. */
static float kv_scale(enum vec_kv_type type, const void *row, size_t head_dim)
{
	float f = 1.0f;

	if (type == VEC_KV_Q8)
		memcpy(&f, (const uint8_t *)row + head_dim, sizeof f);
	return f;
}

void vec_kv_rows(const struct vec_kv_span *kv, size_t h, size_t from, size_t count, const uint8_t **k,
		 const uint8_t **v)
{
	size_t row = kv->first + from;
	size_t page = row / kv->page_rows, slot = row % kv->page_rows;
	size_t k_off = kv->k_off + h * kv->k_head_bytes, v_off = kv->v_off + h * kv->v_head_bytes;

	for (size_t j = 0; j < count; j++) {
		const uint8_t *pg = kv->base + (size_t)kv->pages[page] * kv->page_bytes;

		k[j] = pg + k_off + slot * kv->k_stride;
		v[j] = pg + v_off + slot * kv->v_stride;
		if (++slot == kv->page_rows) {
			slot = 0;
			page++;
		}
	}
}

void vec_attn_ref(const float *q, size_t n_rep, size_t head_dim, const struct vec_kv_span *kv,
		  float scale, float *max, float *sum, float *acc)
{
	enum vec_kv_type type = kv->type;

	/* query head r reads KV head r / n_rep, one row at a time */
	for (size_t r = 0; r < kv->n_heads * n_rep; r++) {
		for (size_t p = 0; p < kv->n; p++) {
			const uint8_t *kr, *vr;
			double dot = 0.0;

			vec_kv_rows(kv, r / n_rep, p, 1, &kr, &vr);
			for (size_t i = 0; i < head_dim; i++)
				dot += (double)q[r * head_dim + i] * kv_at(type, kr, i);
			float s = (float)dot * kv_scale(type, kr, head_dim) * scale;
			float m = s > max[r] ? s : max[r];
			float c = max[r] == -INFINITY ? 0.0f : expf(max[r] - m);
			float e = expf(s - m);
			float ew = e * kv_scale(type, vr, head_dim);

			sum[r] = sum[r] * c + e;
			for (size_t i = 0; i < head_dim; i++)
				acc[r * head_dim + i] = acc[r * head_dim + i] * c + ew * kv_at(type, vr, i);
			max[r] = m;
		}
	}
}

/* The int8 row every ISA reproduces: max by comparison (a NaN never wins), one division
 * for the scale and one for its inverse, codes by rintf (nearest even under the default
 * rounding mode, as cvtps2dq). |x * inv| rounds to at most 127 unless 127 / amax
 * overflowed (amax below ~4e-37), hence the clamp; NaN (and an infinity, whose row has
 * inv 0) gives code 0. */
static void to_kv_q8(void *dst, const float *src, size_t n)
{
	int8_t *d = dst;
	float amax = 0.0f;

	for (size_t i = 0; i < n; i++) {
		float a = fabsf(src[i]);

		amax = a > amax ? a : amax;
	}
	float scale = amax / 127.0f, inv = amax != 0.0f ? 127.0f / amax : 0.0f;

	for (size_t i = 0; i < n; i++) {
		float v = src[i] * inv;

		v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
		d[i] = v == v ? (int8_t)rintf(v) : 0;
	}
	memcpy(d + n, &scale, sizeof scale);
}

void vec_to_kv_ref(void *dst, const float *src, size_t n, enum vec_kv_type type)
{
	uint16_t *d = dst;

	if (type == VEC_KV_Q8) {
		to_kv_q8(dst, src, n);
		return;
	}
	for (size_t i = 0; i < n; i++)
		d[i] = type == VEC_KV_BF16 ? quant_f32_to_bf16(src[i]) : quant_f32_to_fp16(src[i]);
}

size_t vec_argmax_ref(const float *x, size_t n)
{
	size_t best = 0;

	for (size_t i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

uint64_t vec_sum_u64_ref(const void *p, size_t n)
{
	const uint64_t *w = p;
	uint64_t s = 0;

	for (size_t i = 0; i < n / 8; i++)
		s += w[i];
	return s;
}

void vec_cov_row_ref(double *c, const float *x, size_t ld, size_t n_tok, size_t i, size_t j0, size_t j1)
{
	for (size_t j = j0; j < j1; j++) {
		float acc = 0.0f;

		for (size_t t = 0; t < n_tok; t++)
			acc = fmaf(x[t * ld + i], x[t * ld + j], acc);
		c[j - j0] += (double)acc;
	}
}

void vec_cov_rows_ref(double *c, size_t ldc, const float *x, size_t ld, size_t n_tok, size_t i, size_t n_rows,
		      size_t j1)
{
	for (size_t r = 0; r < n_rows; r++)
		vec_cov_row_ref(c + r * ldc + r, x, ld, n_tok, i + r, i + r, j1);
}

void vec_sub_scaled_ref(float *x, const float *u, float e, size_t n)
{
	for (size_t j = 0; j < n; j++)
		x[j] = fmaf(-e, u[j], x[j]);
}

void vec_sub_run_ref(float *x, size_t ld, size_t n_rows, const float *e, size_t nk, const float *u, size_t ldu,
		     size_t n)
{
	for (size_t r = 0; r < n_rows; r++)
		for (size_t j = 0; j < n; j++) {
			float a = x[r * ld + j];

			for (size_t k = 0; k < nk; k++)
				a = fmaf(-e[r * nk + k], u[k * ldu + j], a);
			x[r * ld + j] = a;
		}
}

const struct vec_gptq vec_gptq_ref = { vec_sub_scaled_ref, vec_sub_run_ref };
