/* GPTQ (Frantar et al., 2022): what lets the int4 packer round a matrix's columns in order
 * and push each column's rounding error onto the columns not yet rounded, so that the
 * product with the activations, not each weight, stays close (q4_pack_rows_gptq).
 *
 * Covariances are kept block-diagonal: the d columns of an input fall in blocks of B
 * (the last one narrower when B does not divide d), and only a block's own entries are
 * kept, d x B floats, row i holding H[i][b .. b+B) for its block's first column b (entries
 * past d zero). With B = d that is the whole matrix; narrower blocks keep the file, the
 * memory and the per-row work at d x B, for matrices thousands of columns wide. */
#ifndef HEARTH_KERNELS_GPTQ_H
#define HEARTH_KERNELS_GPTQ_H

#include <stddef.h>

#include "kernels/vec.h"

/* What is added to every diagonal entry of an input's covariance (h: d x block, the
 * blocked layout, summed over `tokens` tokens; 0 or less: unknown): its mean diagonal
 * times GPTQ_DAMP, the 1 % GPTQ's authors use, plus block / tokens. The inverse GPTQ
 * rounds against is ruled by the smallest eigenvalues, which a block estimated from few
 * more tokens than its width gets worst; the second term damps them in proportion (a
 * random-weight model 512 wide, from 508 tokens: mean KL 0.063 against 0.099 with the 1 %
 * alone). A column no token reached gets the damping alone; 1 stands for the mean when
 * none was reached. */
#define GPTQ_DAMP 0.01
double gptq_damping(const float *h, size_t d, size_t block, double tokens);

/* How much of an n x n block's off-diagonal to keep (row stride ldh; summed over `tokens`
 * tokens): 1 - noise / signal over its pairs, where signal is the sum of the squared
 * sample correlations r^2 and noise what sampling alone would make of them, (1 + r^2) /
 * tokens each for Gaussian inputs (a Ledoit-Wolf shrinkage toward the diagonal), clamped to
 * 0..1. A block whose correlations are no larger than its tokens' noise would have GPTQ
 * fit that noise, and rounding against it does worse on other text than the plain
 * imatrix (doc/kernels.md has the measurements); shrunk toward its diagonal it becomes
 * that imatrix's weighting at 0. */
double gptq_keep(const float *h, size_t ldh, size_t n, double tokens);

/* One n x n block (row stride ldh; its upper triangle read), its off-diagonal entries
 * scaled by keep and its diagonal damped by add, factored as H = V V^T with V upper
 * triangular; u (row stride ldu) receives U = V^-1: upper triangular with H^-1 = U^T U,
 * the Cholesky factor of the inverse GPTQ rounds against (its strict lower triangle
 * zeroed). 0, or -1 when the block is not positive definite (not a covariance), n is 0,
 * or no memory. */
int gptq_factor(const float *h, size_t ldh, size_t n, double add, double keep, float *u, size_t ldu);

/* Every block of a d-wide input with blocks of B (h and u both d x B, as above), each
 * keeping gptq_keep of its off-diagonal for `tokens` tokens (negative: all of it). */
int gptq_factor_blocks(const float *h, size_t d, size_t block, double add, double tokens, float *u);

/* gptq_factor_blocks for the blocks k with k % n_parts == part only: n_parts threads, one
 * part each, make the same factor (the blocks are independent) in a share of the time. */
int gptq_factor_blocks_part(const float *h, size_t d, size_t block, double add, double tokens, float *u,
			    size_t part, size_t n_parts);

/* cov (d x B doubles, the blocked layout; only entries at or right of the diagonal
 * accumulated) += x^T x for the n_tok rows of x (each d floats), by `rows` (a kernel
 * table's cov_rows): tokens GPTQ_COV_TOKENS at a time, each entry a float sum over them
 * added once to its double, so the doubles are read once per batch rather than once per
 * token and the float sums stay short. The batch is copied at gptq_cov_ld's stride first:
 * rows a power of two apart fall in the same L1 sets, and the kernel reads 32 of them at
 * once. 0, or -1 for a block of 0 or wider than d, or no memory for the batch. */
#define GPTQ_COV_TOKENS 32
int gptq_cov_add(double *cov, size_t d, size_t block, const float *x, size_t n_tok, vec_cov_rows_fn rows);

/* A row stride for a batch d floats wide: a multiple of 16 floats, and 16 more. */
size_t gptq_cov_ld(size_t d);

/* gptq_cov_add's sums for rows x already at stride ld, in batches of `batch` tokens (1 to
 * GPTQ_COV_TOKENS; gptq_cov_add's are GPTQ_COV_TOKENS) from x's first row, and only cov's
 * rows i with (i / GPTQ_COV_ROWS) % n_parts == part: n_parts threads, one part each, add
 * the same as one whole call, to the bit (each entry's batches are the same), in a share of
 * the time. One call over many batches adds what a call a batch adds, to the bit, and reads
 * the doubles once. */
#define GPTQ_COV_ROWS 8
void gptq_cov_add_part(double *cov, size_t d, size_t block, const float *x, size_t ld, size_t n_tok, size_t batch,
		       size_t part, size_t n_parts, vec_cov_rows_fn rows);

#endif
