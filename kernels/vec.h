/* The SIMD-dispatched vector ops around the matmuls: RMSNorm, RoPE from a precomputed
 * table, SwiGLU's silu(gate)*up, K/V rows to f16/bf16/int8, a logits row's argmax, and
 * attention over a KV span with an online softmax (GQA: the query heads that share one
 * KV head read each K/V row once). Declared here,
 * implemented per ISA in vec_ref.c / vec_avx2.c / vec_avx512.c, reached through
 * kernels/dispatch.h. Pure compute: caller-owned buffers, no allocation. */
#ifndef HEARTH_KERNELS_VEC_H
#define HEARTH_KERNELS_VEC_H

#include <stddef.h>
#include <stdint.h>

/* How a KV cache stores its rows: f16 or bf16 elements, or (VEC_KV_Q8) head_dim int8
 * codes followed by one f32 scale, x ~ scale * code, scale = absmax/127 per row. The
 * values follow kernels/quant.h's QTYPE_F16, QTYPE_BF16 and QTYPE_KV_Q8. */
enum vec_kv_type { VEC_KV_F16 = 1, VEC_KV_BF16 = 30, VEC_KV_Q8 = 1024 };

#define VEC_KV_Q8_SCALE_BYTES 4

/* Bytes of one stored row of dim values. */
static inline size_t vec_kv_row_bytes(enum vec_kv_type type, size_t dim)
{
	return type == VEC_KV_Q8 ? dim + VEC_KV_Q8_SCALE_BYTES : 2 * dim;
}

/* RoPE pairing, as kernels/ops.h (llama.cpp's NORM = adjacent, NEOX = halves). */
enum vec_rope_style { VEC_ROPE_NORM = 0, VEC_ROPE_NEOX = 2 };

/* Fills cos/sin tables of n_pos x (n_rot/2) floats, angle for position p and pair i
 * built exactly as ops_ref_rope builds it (llama.cpp's running product in float), so the
 * table is sized by the configured context, never by the model's advertised one.
 * freq_factors may be NULL. */
void vec_rope_table(float *cos_tab, float *sin_tab, size_t n_pos, size_t n_rot, float freq_base,
		    float freq_scale, const float *freq_factors);

/* Online-softmax state of one query head: running max, running sum of exp, and the
 * unnormalized weighted sum of V rows in acc[head_dim]. */
void vec_attn_init(float *max, float *sum, float *acc, size_t n_rep, size_t head_dim);
/* out[r][i] = acc[r][i] / sum[r]; a head that saw no position gets zeros. out may be acc. */
void vec_attn_finish(float *out, const float *sum, const float *acc, size_t n_rep, size_t head_dim);

/* Signatures of the dispatched ops (one implementation per ISA). */

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i] (w may be NULL); out may equal x. */
typedef void (*vec_rmsnorm_fn)(float *out, const float *x, const float *w, size_t n, float eps);

/* Rotates the first n_rot dims of n_heads heads (head_dim apart) in place, with the
 * position's rows of the cos/sin tables (n_rot/2 each). */
typedef void (*vec_rope_fn)(float *x, size_t n_heads, size_t head_dim, size_t n_rot,
			    enum vec_rope_style style, const float *cos_row, const float *sin_row);

/* gate[i] = silu(gate[i]) * up[i]. */
typedef void (*vec_silu_mul_fn)(float *gate, const float *up, size_t n);

/* gate[i] = gelu(gate[i]) * up[i], GELU by its tanh approximation (Gemma's GeGLU),
 * computed as x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3): the same function as
 * 0.5 x (1 + tanh(u)), with the exp the SIMD variants already have. */
typedef void (*vec_gelu_mul_fn)(float *gate, const float *up, size_t n);
#define VEC_GELU_SQRT_2_PI 0.79788456080286535588f
#define VEC_GELU_COEF 0.044715f

/* A K or V row of n values into the cache (vec_kv_row_bytes(type, n) bytes at dst).
 * f16/bf16: each value rounded to nearest even, as quant_f32_to_fp16 / quant_f32_to_bf16,
 * bit for bit, NaN included. Q8: amax = max |x|, scale = amax / 127, codes
 * round-to-nearest-even(x * (127 / amax)) clamped to [-127, 127] (all 0 when amax is 0;
 * a NaN's code is 0, and a NaN never is the amax), then the f32 scale; every ISA writes the reference's bytes. */
typedef void (*vec_to_kv_fn)(void *dst, const float *src, size_t n, enum vec_kv_type type);

/* Index of the largest of x[0..n): the first on a tie, a NaN never (it compares false),
 * and 0 when x[0] is a NaN or n is 0, exactly as the loop `if (x[i] > x[best]) best = i`
 * answers. A kernel because greedy sampling scans a whole vocabulary (152k entries) per
 * token and sequence, on the compute thread. */
typedef size_t (*vec_argmax_fn)(const float *x, size_t n);

/* The wrapping sum of the 64-bit words of p[0..n) (n a multiple of 256 bytes, p 64-byte
 * aligned): a pure streaming read, the probe decode's bandwidth is judged against. Every
 * ISA returns the reference's sum. */
typedef uint64_t (*vec_sum_u64_fn)(const void *p, size_t n);

/* GPTQ's covariance sums (kernels/gptq.h, gptq_cov_add): for j in [j0, j1), c[j - j0] +=
 * the sum over tokens t < n_tok of x[t*ld + i] * x[t*ld + j], each taken in float in token
 * order with one fused multiply-add a token (fmaf) and added to its double once: every ISA
 * gives the reference's doubles. Lanes run over j, so a token's term costs one FMA and the
 * conversion to double is paid once per batch. */
typedef void (*vec_cov_row_fn)(double *c, const float *x, size_t ld, size_t n_tok, size_t i, size_t j0,
			       size_t j1);

/* The same sums for the upper triangle of rows i .. i + n_rows - 1: row i + r's entries j
 * in [i + r, j1) into c[r*ldc + j - i], each as cov_row makes it (cov_row on row i + r
 * from column i + r gives the same doubles). Several rows share each load of a token's
 * columns: one row at a time a term costs a load for its FMA. */
typedef void (*vec_cov_rows_fn)(double *c, size_t ldc, const float *x, size_t ld, size_t n_tok, size_t i,
				size_t n_rows, size_t j1);

/* GPTQ's correction (kernels/q4.h, q4_pack_rows_gptq): x[j] -= e u[j] for j < n, each one
 * fused multiply-add (fmaf(-e, u[j], x[j])): every ISA gives the reference's floats, so a
 * matrix rounded by GPTQ is the same bytes on every machine. */
typedef void (*vec_sub_scaled_fn)(float *x, const float *u, float e, size_t n);

/* GPTQ's corrections of a run of nk columns at once (its lazy batch update): for the
 * n_rows rows of x (ld apart) and each j < n, x[r*ld + j] -= e[r*nk + k] u[k*ldu + j] for
 * k = 0 .. nk-1 in that order, each one fused multiply-add. Those are the floats nk
 * sub_scaled calls a row give, so nothing about the rounding changes; but x and u are read
 * once for all the rows and the whole run instead of once a column and row, which turns
 * a load/store-bound axpy into register-bound multiply-adds. */
typedef void (*vec_sub_run_fn)(float *x, size_t ld, size_t n_rows, const float *e, size_t nk, const float *u,
			       size_t ldu, size_t n);

/* GPTQ's two correction kernels as the packers take them from a kernel table: col pushes
 * one column's error onto the rest of its run, run a finished run's errors onto the
 * columns after it. */
struct vec_gptq {
	vec_sub_scaled_fn col;
	vec_sub_run_fn run;
};
extern const struct vec_gptq vec_gptq_ref, vec_gptq_avx2, vec_gptq_avx512;

/* The SIMD sub_run kernels' rows for the step at row r0: four, each x row's pointer with
 * its e row, the last row repeated where fewer than four are left (the repeat computes
 * and writes the same floats again). */
static inline void vec_gptq_rows4(float *x, size_t ld, const float *e, size_t nk, size_t r0, size_t n_rows,
				  float **xr, const float **er)
{
	for (size_t q = 0; q < 4; q++) {
		size_t r = r0 + q < n_rows ? r0 + q : n_rows - 1;

		xr[q] = x + r * ld;
		er[q] = e + r * nk;
	}
}

/* Where the run the packers batch from column a ends: at most VEC_GPTQ_RUN columns, none
 * past g1 (its group's end) or past a's block of U (ublock columns of cols, which starts
 * at *bs and ends at *end). Within a run each column's error goes onto the rest of the run
 * by col, one call a row, so long runs spend their time there; short ones reload x more
 * often in run. 16 loaded a GPTQ Qwen3-1.7B shape fastest: 45 s, against 49 s for runs of
 * whole groups of 64 and 45 s for 8. */
#define VEC_GPTQ_RUN 16
static inline size_t vec_gptq_run_end(size_t a, size_t g1, size_t ublock, size_t cols, size_t *bs, size_t *end)
{
	size_t b;

	*bs = a / ublock * ublock;
	*end = *bs + ublock < cols ? *bs + ublock : cols;
	b = g1 < *end ? g1 : *end;
	return b - a > VEC_GPTQ_RUN ? a + VEC_GPTQ_RUN : b;
}

/* The K/V rows of n_heads KV heads as a paged cache holds them: row p of the sequence is in
 * page pages[p / page_rows], slot p % page_rows; head h's K row starts at base + page *
 * page_bytes + k_off + h * k_head_bytes + slot * k_stride, its V row likewise (k_off/v_off:
 * where the first head's rows begin inside a page). Rows [first, first + n) are the ones to
 * read. Contiguous rows of one head are one page of page_rows >= first + n. For Q8 a row is
 * its codes then its f32 scale. */
struct vec_kv_span {
	const uint8_t *base;
	const uint32_t *pages;
	size_t page_bytes, page_rows;
	size_t k_off, v_off, k_stride, v_stride;
	size_t n_heads, k_head_bytes, v_head_bytes;
	size_t first, n;
	enum vec_kv_type type;
};

/* Row pointers of head h's rows [first + from, first + from + count) of a span, K into k[]
 * and V into v[]: one walk over the pages per window of rows, no division per row. */
void vec_kv_rows(const struct vec_kv_span *kv, size_t h, size_t from, size_t count, const uint8_t **k,
		 const uint8_t **v);

/* Folds the span's rows into the online-softmax state of n_rep query heads per KV head
 * (q: n_heads x n_rep x head_dim floats, KV head h's queries at q + h * n_rep * head_dim;
 * max, sum and acc the same way): score = scale * q.k of each K row, weight on its V row
 * (for Q8 each row's values are its codes times its trailing scale). Causal masking is the
 * caller's: it passes only the positions a query may see. A sequence's heads are one call,
 * so the softmax's serial steps run once per window of rows, not once per page, and the
 * next head's rows can be fetched while this one's compute. head_dim is a multiple of 16. */
typedef void (*vec_attn_fn)(const float *q, size_t n_rep, size_t head_dim, const struct vec_kv_span *kv,
			    float scale, float *max, float *sum, float *acc);

void vec_rmsnorm_ref(float *out, const float *x, const float *w, size_t n, float eps);
void vec_rope_ref(float *x, size_t n_heads, size_t head_dim, size_t n_rot, enum vec_rope_style style,
		  const float *cos_row, const float *sin_row);
void vec_silu_mul_ref(float *gate, const float *up, size_t n);
void vec_gelu_mul_ref(float *gate, const float *up, size_t n);
void vec_to_kv_ref(void *dst, const float *src, size_t n, enum vec_kv_type type);
size_t vec_argmax_ref(const float *x, size_t n);
uint64_t vec_sum_u64_ref(const void *p, size_t n);
void vec_cov_row_ref(double *c, const float *x, size_t ld, size_t n_tok, size_t i, size_t j0, size_t j1);
void vec_cov_rows_ref(double *c, size_t ldc, const float *x, size_t ld, size_t n_tok, size_t i, size_t n_rows,
		      size_t j1);
void vec_sub_scaled_ref(float *x, const float *u, float e, size_t n);
void vec_sub_run_ref(float *x, size_t ld, size_t n_rows, const float *e, size_t nk, const float *u, size_t ldu,
		     size_t n);
void vec_attn_ref(const float *q, size_t n_rep, size_t head_dim, const struct vec_kv_span *kv,
		  float scale, float *max, float *sum, float *acc);

void vec_rmsnorm_avx2(float *out, const float *x, const float *w, size_t n, float eps);
void vec_rope_avx2(float *x, size_t n_heads, size_t head_dim, size_t n_rot, enum vec_rope_style style,
		   const float *cos_row, const float *sin_row);
void vec_silu_mul_avx2(float *gate, const float *up, size_t n);
void vec_gelu_mul_avx2(float *gate, const float *up, size_t n);
void vec_to_kv_avx2(void *dst, const float *src, size_t n, enum vec_kv_type type);
size_t vec_argmax_avx2(const float *x, size_t n);
uint64_t vec_sum_u64_avx2(const void *p, size_t n);
void vec_cov_row_avx2(double *c, const float *x, size_t ld, size_t n_tok, size_t i, size_t j0, size_t j1);
void vec_cov_rows_avx2(double *c, size_t ldc, const float *x, size_t ld, size_t n_tok, size_t i, size_t n_rows,
		       size_t j1);
void vec_sub_scaled_avx2(float *x, const float *u, float e, size_t n);
void vec_sub_run_avx2(float *x, size_t ld, size_t n_rows, const float *e, size_t nk, const float *u, size_t ldu,
		      size_t n);
void vec_attn_avx2(const float *q, size_t n_rep, size_t head_dim, const struct vec_kv_span *kv,
		   float scale, float *max, float *sum, float *acc);

void vec_rmsnorm_avx512(float *out, const float *x, const float *w, size_t n, float eps);
void vec_rope_avx512(float *x, size_t n_heads, size_t head_dim, size_t n_rot, enum vec_rope_style style,
		     const float *cos_row, const float *sin_row);
void vec_silu_mul_avx512(float *gate, const float *up, size_t n);
void vec_gelu_mul_avx512(float *gate, const float *up, size_t n);
void vec_to_kv_avx512(void *dst, const float *src, size_t n, enum vec_kv_type type);
size_t vec_argmax_avx512(const float *x, size_t n);
uint64_t vec_sum_u64_avx512(const void *p, size_t n);
void vec_cov_row_avx512(double *c, const float *x, size_t ld, size_t n_tok, size_t i, size_t j0, size_t j1);
void vec_cov_rows_avx512(double *c, size_t ldc, const float *x, size_t ld, size_t n_tok, size_t i, size_t n_rows,
			 size_t j1);
void vec_sub_scaled_avx512(float *x, const float *u, float e, size_t n);
void vec_sub_run_avx512(float *x, size_t ld, size_t n_rows, const float *e, size_t nk, const float *u, size_t ldu,
			size_t n);
void vec_attn_avx512(const float *q, size_t n_rep, size_t head_dim, const struct vec_kv_span *kv,
		     float scale, float *max, float *sum, float *acc);

#endif
