/* hearth's one repacked int4 weight layout (doc/kernels.md draws it): 16-row blocks,
 * per-group fp16 scale d and offset m (w = d*q + m, q in 0..15), codes interleaved so one
 * 64-byte load feeds 16 output rows. Packing (from f32, Q4_0, Q4_1, Q4_K rows), unpacking,
 * and the activation formats that the W4A16 / W4A8 kernels (kernels/dispatch.h) read. */
#ifndef HEARTH_KERNELS_Q4_H
#define HEARTH_KERNELS_Q4_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/quant.h"
#include "kernels/vec.h"
#include "protocol/error.h"

#define Q4_ROWS 16          /* rows interleaved in one row block */
#define Q4_CHUNK_COLS 8     /* columns of one 64-byte chunk (16 rows x 8 codes) */
#define Q4_CHUNK_BYTES 64
#define Q4_ALIGN 64         /* packed data and every row block start on a cache line */

/* Geometry of one packed matrix; the bytes live in caller-owned memory (the daemon's
 * arena), Q4_ALIGN-aligned, q4_matrix_bytes() long. Row block b starts at
 * data + b * block_bytes: first the scales (n_groups x 16 fp16 d, then, when asym,
 * n_groups x 16 fp16 m; padded to 64 bytes), then n_groups x (group/8) chunks of codes.
 * In chunk c of group g, row r owns bytes 4r..4r+3: byte j holds column g*group+8c+j in
 * its low nibble and column g*group+8c+4+j in its high nibble. Rows past `rows` in the
 * last block are zero (d = m = 0). Symmetric matrices (asym false) store no m: m = -8d. */
struct q4_matrix {
	size_t rows, cols, group;
	size_t n_groups;        /* cols / group */
	size_t n_row_blocks;    /* ceil(rows / 16) */
	size_t scale_bytes;     /* per row block, a multiple of 64 */
	size_t block_bytes;     /* per row block: scale_bytes + 8 * group * n_groups */
	bool asym;
	bool row8;              /* asym, with d and m as 8-bit codes against per-row scales */
	uint8_t *data;
};

/* row8 (q4_matrix_plan_row8): the scale region of a row block is 16 fp16 sd (one per row),
 * 16 fp16 sm, then n_groups x 16 uint8 d codes, then n_groups x 16 int8 m codes, padded to
 * 64 bytes: d = sd * dcode, m = sm * mcode, each one float product. At group 64 that is the
 * bytes of group 128's fp16 pairs plus 4 bytes a row (4.28 bits a weight at 2048 columns
 * against 4.25), for twice the groups. */
#define Q4_ROW8_HEAD 64
#define Q4_ROW8_MAX_GROUPS 2048

/* Fills the geometry for rows x cols at `group` (32, 64 or 128; cols a multiple of it) and
 * sets data to NULL. Returns 0, HEARTH_EINVAL for a bad shape, HEARTH_ERANGE when the size overflows. */
int q4_matrix_plan(struct q4_matrix *m, size_t rows, size_t cols, size_t group, bool asym);
/* The same for the row8 encoding (asymmetric; at most Q4_ROW8_MAX_GROUPS groups a row). */
int q4_matrix_plan_row8(struct q4_matrix *m, size_t rows, size_t cols, size_t group);
size_t q4_matrix_bytes(const struct q4_matrix *m);
/* Bits per weight the layout spends, scales included (4.125 sym g128, 4.25 asym g128). */
double q4_matrix_bpw(const struct q4_matrix *m);

/* Quantize and pack rows [row0, row0 + n_rows) from f32 (row i at src + i*ld). Asym:
 * per group, the d and m of least squared error found by a small search: min/max
 * (d = (max-min)/15, m = min) is the first candidate, then grids of 14..15.75 steps over
 * the range whose codes get a least-squares d and m, the best refit over its own codes
 * twice more. Every candidate's d and m are rounded to fp16 and the codes re-chosen
 * (nearest, clamped to 0..15) before its error is measured, so the error is that of the
 * values the kernels multiply by, and the result is never worse than min/max. Same
 * input, same bytes. Sym (group 32 is Q4_0's format): llama.cpp's Q4_0 rule (d = signed
 * absmax / -8) is the first candidate, then scales that put the absmax at -8-t or 7+t on
 * the same grid of t, ranked by their least-squares fit, the best refit over its own codes;
 * measured on the fp16 d as stored, so never worse than Q4_0's rule. Rows can be
 * packed in any order and any number per call; the call that packs the last row zeroes
 * the pad rows. Only the rows named are touched, so the loader streams a few rows at a
 * time. col_w (NULL, or cols finite weights >= 0): asym errors and fits weigh column k by
 * col_w[k], the importance of the activation it multiplies (E[x_k^2]: llama.cpp's imatrix
 * idea), so the search spends its precision where the output feels it; a group whose
 * weights sum to 0 is searched unweighted, and weights of 1 give the same bytes as NULL.
 * Sym ignores it. */
void q4_pack_rows_f32(struct q4_matrix *m, const float *src, size_t ld, const float *col_w, size_t row0,
		      size_t n_rows);

/* The scale search's inner step, a dispatch-table kernel (most of a load's time): the
 * nearest code of each of n values x (n a multiple of 8, at most 256; x within [lo, hi])
 * against d and m, clamped to 0..15, into q, and the squared error of exactly the values
 * the matmuls use (d*q + m in float, no fused multiply-add), each term weighted by w[i],
 * summed in 8 double lanes folded pairwise. Every ISA returns the reference's codes and
 * bits, so a matrix packs to the same bytes on every machine. */
typedef double (*q4_group_codes_fn)(const float *x, const float *w, size_t n, float lo, float hi, float d,
				    float m, uint8_t *q);
double q4_group_codes_ref(const float *x, const float *w, size_t n, float lo, float hi, float d, float m,
			  uint8_t *q);
double q4_group_codes_avx2(const float *x, const float *w, size_t n, float lo, float hi, float d, float m,
			   uint8_t *q);
double q4_group_codes_avx512(const float *x, const float *w, size_t n, float lo, float hi, float d, float m,
			     uint8_t *q);
/* The asym search's grid step, a dispatch-table kernel too: for one grid (codes
 * l = min(15, (int)((x - lo) * is + 0.5f))) the weighted sums of l, l^2 and x*l in 8
 * float lanes (lane j: values j, j+8, ...), the reference's bits on every ISA. */
typedef void (*q4_grid_sums_fn)(const float *x, const float *w, size_t n, float lo, float is, float ll[8],
				float lll[8], float lxl[8]);
void q4_grid_sums_ref(const float *x, const float *w, size_t n, float lo, float is, float ll[8], float lll[8],
		      float lxl[8]);
void q4_grid_sums_avx2(const float *x, const float *w, size_t n, float lo, float is, float ll[8], float lll[8],
		       float lxl[8]);
/* One ISA's scale-search kernels (a kernel table's `search`). */
struct q4_search {
	q4_group_codes_fn codes;
	q4_grid_sums_fn grid;
};
extern const struct q4_search q4_search_ref, q4_search_avx2, q4_search_avx512;
/* q4_pack_rows_f32 with the search's kernels from a kernel table (the same bytes). */
void q4_pack_rows_f32_k(struct q4_matrix *m, const float *src, size_t ld, const float *col_w, size_t row0,
			size_t n_rows, const struct q4_search *k);

/* The same layout rounded by GPTQ (kernels/gptq.h): u is the factor gptq_factor_blocks
 * made from the covariance of the matrix's inputs, in the blocked layout (cols x ublock;
 * ublock = cols: the whole matrix). Each row's columns are rounded in order, each one's
 * rounding error taken off the columns still to come in its block in proportion to u, and
 * each group's scales searched (as above, col_w steering it) on its values as those errors
 * left them; row8's per-row scales come from the row as given. The rows at src are
 * overwritten. With a diagonal covariance nothing moves and the bytes are
 * q4_pack_rows_f32's with col_w. spread (a kernel table's gptq) takes the errors off:
 * the per-row work, about cols x ublock / 2 multiply-adds, most of them batched a group at
 * a time (GPTQ's lazy batch updates; the same floats as column by column); k (its search)
 * runs the scale search. */
void q4_pack_rows_gptq(struct q4_matrix *m, float *src, size_t ld, const float *col_w, const float *u,
		       size_t ublock, size_t row0, size_t n_rows, const struct vec_gptq *spread, const struct q4_search *k);

/* One group of n values (a multiple of 8, at most 256) by a rule, for tools that simulate
 * other layouts in f32 (bench/fidelity --ablate): codes into q, d and m as stored (fp16
 * values; sym: m = -8d, value (q-8)*d). ASYM and SYM_SEARCH are the rules
 * q4_pack_rows_f32 uses for asym and sym matrices; SYM_Q4_0 is llama.cpp's Q4_0 rule (for
 * comparison). w (NULL or n weights) as col_w above, for ASYM. */
enum q4_rule { Q4_RULE_ASYM, Q4_RULE_SYM_Q4_0, Q4_RULE_SYM_SEARCH };
void q4_quantize_group_f32(const float *x, const float *w, size_t n, enum q4_rule rule, uint8_t *q,
			   float *d, float *m);

/* Carry-over from pre-quantized files without re-rounding the codes. src holds n_rows
 * rows of cols/32 (Q4_0, Q4_1) or cols/256 (Q4_K) blocks each, row after row.
 * Q4_0 needs a sym group-32 matrix and is exact (same values as quant_dequant_row);
 * Q4_1 needs asym group 32 and is exact; Q4_K needs asym group 32: its sub-block scale
 * d*sc and offset -dmin*m are rounded to fp16 (relative error <= 2^-11 on each).
 * Return 0 or HEARTH_EINVAL when the matrix's group/asym/cols do not fit the type. */
int q4_pack_rows_q4_0(struct q4_matrix *m, const void *src, size_t row0, size_t n_rows);
int q4_pack_rows_q4_1(struct q4_matrix *m, const void *src, size_t row0, size_t n_rows);
int q4_pack_rows_q4_k(struct q4_matrix *m, const void *src, size_t row0, size_t n_rows);

/* dst[i*ld + k] = d*q + m for rows [row0, row0 + n_rows): the exact values every kernel
 * multiplies by (an embedding lookup uses this). */
void q4_unpack_rows(const struct q4_matrix *m, size_t row0, size_t n_rows, float *dst, size_t ld);
/* One code / scale, for tests and tools. */
unsigned q4_code(const struct q4_matrix *m, size_t row, size_t col);
float q4_scale_d(const struct q4_matrix *m, size_t row, size_t group_index);
float q4_scale_m(const struct q4_matrix *m, size_t row, size_t group_index);

/* Activations prepared once per token for every matrix of the same cols and group.
 * A16: x rounded to bf16 (W4A16 means 16-bit activations), stored per 8 columns in the
 * order k0,k2,k4,k6,k1,k3,k5,k7 so a 32-bit broadcast pairs with the AVX-512 BF16 nibble
 * extraction; sum[t][g] = sum of the bf16 values of group g (float).
 * A8: x quantized per group to int8 in [-127,127] with scale[t][g] = absmax/127 (q =
 * round-to-even(x * 127/absmax)), natural column order; sum[t][g] = scale * sum(q),
 * the term that carries the weights' offset m. */
enum q4_act_kind { Q4_ACT_A16 = 16, Q4_ACT_A8 = 8 };

struct q4_acts {
	enum q4_act_kind kind;
	size_t n_tok, cols, group, n_groups;
	void *codes;     /* n_tok x cols: uint16_t bf16 (A16) or int8_t (A8) */
	float *scale;    /* n_tok x n_groups; A8 only */
	float *sum;      /* n_tok x n_groups */
};

/* Bytes of caller memory q4_acts_init needs; 0 for a bad shape or overflow. A buffer
 * carved for max_tokens serves any smaller batch: set a->n_tok (<= the carved count)
 * before acts_prepare/matmul, the regions do not move. */
size_t q4_acts_bytes(enum q4_act_kind kind, size_t n_tok, size_t cols, size_t group);
/* Carves mem (q4_acts_bytes long, 64-byte aligned) into a. Returns 0 or HEARTH_EINVAL. */
int q4_acts_init(struct q4_acts *a, enum q4_act_kind kind, size_t n_tok, size_t cols, size_t group,
		 void *mem);

/* True when a can feed a matmul of w: same cols and group. Kernels do not check (hot
 * path); the engine checks each pairing once, when it builds the model. */
bool q4_acts_fit(const struct q4_matrix *w, const struct q4_acts *a);

/* Position of column k's bf16 inside an A16 token row (the pair order above). */
static inline size_t q4_a16_index(size_t k)
{
	static const unsigned char pos[8] = { 0, 4, 1, 5, 2, 6, 3, 7 };
	return (k & ~(size_t)7) | pos[k & 7];
}

/* Dispatched kernels (kernels/dispatch.h picks one implementation per ISA).
 *
 * acts_prepare: fills tokens [tok_begin, tok_end) of a from x (token t at x + t*ldx),
 * as a->kind says. Every ISA produces the same bytes for A8 (exact); for A16 the bf16
 * codes are identical and the group sums may differ in the last bits (summation order).
 *
 * matmul: y[t*ldy + r] = sum_k w[r][k] * act[t][k] for every token of a and rows
 * [row_begin, row_end); row_begin is a multiple of Q4_ROWS and row_end a multiple of it
 * or w->rows, so threads split the work by whole row blocks and never share a line of
 * weights. A8: per group, an exact integer dot sum(q*a), then
 * y = fma(dot, d*scale, y); y = fma(m, sum, y) in group order: every ISA gives the same
 * bits. A16: float sums whose order differs per ISA (tests bound the difference). */
typedef void (*q4_acts_fn)(struct q4_acts *a, const float *x, size_t ldx, size_t tok_begin,
			   size_t tok_end);
typedef void (*q4_matmul_fn)(const struct q4_matrix *w, const struct q4_acts *a, float *y,
			     size_t ldy, size_t row_begin, size_t row_end);

void q4_acts_prepare_ref(struct q4_acts *a, const float *x, size_t ldx, size_t tok_begin, size_t tok_end);
void q4_matmul_ref(const struct q4_matrix *w, const struct q4_acts *a, float *y, size_t ldy,
		   size_t row_begin, size_t row_end);
void q4_acts_prepare_avx2(struct q4_acts *a, const float *x, size_t ldx, size_t tok_begin, size_t tok_end);
void q4_matmul_avx2(const struct q4_matrix *w, const struct q4_acts *a, float *y, size_t ldy,
		    size_t row_begin, size_t row_end);
void q4_acts_prepare_avx512(struct q4_acts *a, const float *x, size_t ldx, size_t tok_begin, size_t tok_end);
void q4_matmul_avx512(const struct q4_matrix *w, const struct q4_acts *a, float *y, size_t ldy,
		      size_t row_begin, size_t row_end);

#endif
