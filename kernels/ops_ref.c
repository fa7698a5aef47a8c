/* Scalar reference for the ops in kernels/ops.h: short loops written for clarity and
 * accuracy (sums finished in double), matching llama.cpp's arithmetic where the order of
 * operations changes results (RoPE angles, RMSNorm). The reference engine runs on these; SIMD variants are
 * checked against them. */
#include "kernels/ops.h"

#include <math.h>

/* Sixteen float partial sums, combined in double: a fixed, documented order that compilers
 * can vectorize at -O2, and within a few ulps of the exact sum for the row lengths of real
 * models (a double accumulator would cost 4x in the reference engine's hottest loop). */
double ops_ref_dot(const float *a, const float *b, size_t n)
{
	float lane[16] = { 0 };
	double sum = 0.0;
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		/* Unrolled, the lanes stay in registers (2x at -O2). */
#pragma GCC unroll 16
		for (size_t j = 0; j < 16; j++)
			lane[j] += a[i + j] * b[i + j];
	}
	for (size_t j = 0; j < 16; j++)
		sum += lane[j];
	for (; i < n; i++)
		sum += (double)a[i] * (double)b[i];
	return sum;
}

void ops_ref_matmul(enum qtype type, const void *w, size_t row_bytes, size_t n_in, size_t n_out,
		    const float *x, size_t n_tok, float *y, float *row_scratch)
{
	const unsigned char *rows = w;

	for (size_t o = 0; o < n_out; o++) {
		const float *row = row_scratch;

		/* F32 rows are read in place: copying them would only cost time. */
		if (type == QTYPE_F32)
			row = (const float *)(rows + o * row_bytes);
		else
			quant_dequant_row(type, rows + o * row_bytes, row_scratch, n_in);
		for (size_t t = 0; t < n_tok; t++)
			y[t * n_out + o] = (float)ops_ref_dot(row, x + t * n_in, n_in);
	}
}

void ops_ref_get_row(enum qtype type, const void *w, size_t row_bytes, size_t n_in, size_t row,
		     float *dst)
{
	quant_dequant_row(type, (const unsigned char *)w + row * row_bytes, dst, n_in);
}

void ops_ref_rmsnorm(float *out, const float *x, const float *weight, size_t n, float eps)
{
	double sum = 0.0;

	for (size_t i = 0; i < n; i++)
		sum += (double)x[i] * (double)x[i];
	/* ggml rounds the mean to float before adding eps and taking the root. */
	float mean = (float)(sum / (double)n);
	float scale = 1.0f / sqrtf(mean + eps);

	for (size_t i = 0; i < n; i++) {
		float v = x[i] * scale;
		out[i] = weight ? v * weight[i] : v;
	}
}

void ops_ref_rope(float *x, size_t n_heads, size_t head_dim, size_t n_rot, enum ops_rope_style style,
		  int pos, float freq_base, float freq_scale, const float *freq_factors)
{
	/* llama.cpp builds the angles as a running product in float, not as powf per pair;
	 * the two differ in the last bits at large positions, so follow it. */
	const float ratio = powf(freq_base, -2.0f / (float)n_rot);
	const size_t half = n_rot / 2;

	for (size_t h = 0; h < n_heads; h++) {
		float *v = x + h * head_dim;
		float theta = (float)pos;

		for (size_t i = 0; i < half; i++) {
			float ff = freq_factors ? freq_factors[i] : 1.0f;
			float angle = freq_scale * (theta / ff);
			float c = cosf(angle), s = sinf(angle);
			size_t a, b;

			if (style == OPS_ROPE_NEOX) {
				a = i;
				b = i + half;
			} else {
				a = 2 * i;
				b = 2 * i + 1;
			}
			float x0 = v[a], x1 = v[b];
			v[a] = x0 * c - x1 * s;
			v[b] = x0 * s + x1 * c;
			theta *= ratio;
		}
	}
}

void ops_ref_softmax(float *x, size_t n)
{
	float max = -INFINITY;
	double sum = 0.0;

	for (size_t i = 0; i < n; i++)
		if (x[i] > max)
			max = x[i];
	for (size_t i = 0; i < n; i++) {
		x[i] = expf(x[i] - max);
		sum += x[i];
	}
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(x[i] / sum);
}

void ops_ref_silu_mul(float *gate, const float *up, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float g = gate[i];
		gate[i] = g / (1.0f + expf(-g)) * up[i];
	}
}

void ops_ref_gelu_mul(float *gate, const float *up, size_t n)
{
	const float sqrt_2_over_pi = 0.79788456080286535587989211986876f;
	const float coef_a = 0.044715f;

	for (size_t i = 0; i < n; i++) {
		float x = gate[i];
		gate[i] = 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * x * (1.0f + coef_a * x * x))) * up[i];
	}
}

void ops_ref_softcap(float *x, size_t n, float cap)
{
	for (size_t i = 0; i < n; i++)
		x[i] = cap * tanhf(x[i] / cap);
}

void ops_ref_add(float *y, const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] += x[i];
}
