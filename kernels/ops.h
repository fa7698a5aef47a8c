/* The transformer's building blocks as plain scalar loops: the reference every faster
 * kernel is tested against. Pure compute: no I/O, no allocation (callers pass scratch),
 * no state. Vectors are f32; weights stay in their file type and are dequantized a row
 * at a time, so a large model never needs an f32 copy of its matrices. */
#ifndef HEARTH_KERNELS_OPS_H
#define HEARTH_KERNELS_OPS_H

#include <stddef.h>

#include "kernels/quant.h"

/* How RoPE pairs a head's dimensions (llama.cpp's LLAMA_ROPE_TYPE_*). NORM rotates
 * adjacent pairs (0,1), (2,3), ... (llama); NEOX rotates (i, i + n_rot/2) (qwen2, qwen3). */
enum ops_rope_style {
	OPS_ROPE_NORM = 0,
	OPS_ROPE_NEOX = 2,
};

/* y[t][o] = sum_i W[o][i] * x[t][i] for t < n_tok, o < n_out.
 * W has n_out rows of n_in elements of `type`, row_bytes apart; x is n_tok x n_in and y
 * n_tok x n_out, both row-major. Each weight row is dequantized once into row_scratch
 * (n_in floats; unused for F32) and dotted with every token, so a batch reads the weights
 * once. Dot products as ops_ref_dot. */
void ops_ref_matmul(enum qtype type, const void *w, size_t row_bytes, size_t n_in, size_t n_out,
		    const float *x, size_t n_tok, float *y, float *row_scratch);

/* dst = row `row` of a weight matrix (n_in elements of `type`), as f32: an embedding lookup. */
void ops_ref_get_row(enum qtype type, const void *w, size_t row_bytes, size_t n_in, size_t row,
		     float *dst);

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i] (weight may be NULL for none).
 * out may equal x. The sum of squares accumulates in double, as ggml does. */
void ops_ref_rmsnorm(float *out, const float *x, const float *weight, size_t n, float eps);

/* Rotates the first n_rot dimensions of each of n_heads heads (head_dim floats each,
 * contiguous) of x in place for position pos; dimensions from n_rot on pass through.
 * Pair i turns by pos * freq_base^(-2i/n_rot) / freq_factors[i] * freq_scale, the angle
 * built as llama.cpp builds it (running product of the per-pair ratio, in float).
 * freq_factors may be NULL (all 1). n_rot is even and <= head_dim. */
void ops_ref_rope(float *x, size_t n_heads, size_t head_dim, size_t n_rot, enum ops_rope_style style,
		  int pos, float freq_base, float freq_scale, const float *freq_factors);

/* x = softmax(x) over n elements, in place (max subtracted; the sum in double). */
void ops_ref_softmax(float *x, size_t n);

/* gate[i] = silu(gate[i]) * up[i]: SwiGLU's elementwise half. */
void ops_ref_silu_mul(float *gate, const float *up, size_t n);

/* gate[i] = gelu(gate[i]) * up[i]: GeGLU's elementwise half, GELU by its tanh
 * approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as ggml_gelu_f32 writes it
 * (ggml's CPU backend then looks it up in an f16 table: within 1e-3 relative of this). */
void ops_ref_gelu_mul(float *gate, const float *up, size_t n);

/* x[i] = cap * tanh(x[i] / cap): Gemma's final logit softcapping. */
void ops_ref_softcap(float *x, size_t n, float cap);

/* y[i] += x[i]. */
void ops_ref_add(float *y, const float *x, size_t n);

/* Sum of a[i] * b[i]: sixteen float lanes (element i into lane i % 16), then the lanes
 * and any tail added in double. */
double ops_ref_dot(const float *a, const float *b, size_t n);

#endif
