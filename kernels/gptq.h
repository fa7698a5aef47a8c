/* GPTQ's factor (Frantar et al., 2022): what lets the int4 packer round a matrix's columns
 * in order and push each column's rounding error onto the columns not yet rounded, so that
 * the product with the activations, not each weight, stays close (q4_pack_rows_gptq). */
#ifndef HEARTH_KERNELS_GPTQ_H
#define HEARTH_KERNELS_GPTQ_H

#include <stddef.h>

/* h: the d x d input covariance (sum of x x^T over calibration tokens; only its upper
 * triangle, h[i*d+j] for j >= i, is read). Dampened by damp times the mean of its diagonal
 * (a column no token reached gets that alone), it is factored as H = V V^T with V upper
 * triangular, and u (d x d, row-major) receives U = V^-1: upper triangular with
 * H^-1 = U^T U, the Cholesky factor of the inverse GPTQ rounds against (its strict lower
 * triangle is zeroed). Returns 0, or -1 when the dampened matrix is not positive
 * definite (not a covariance) or d is 0. */
int gptq_factor(const float *h, size_t d, double damp, float *u);

/* cov (d x d doubles, upper triangle: cov[i*d+j], j >= i) += x^T x for the n_tok rows
 * of x (each d floats). Tokens go GPTQ_COV_BLOCK at a time, transposed, so each entry is
 * a float dot over the block added once to its double, and the d^2 doubles are read once
 * per block rather than once per token. 0, or -1 when the block's scratch cannot be had. */
#define GPTQ_COV_BLOCK 32
int gptq_cov_add(double *cov, size_t d, const float *x, size_t n_tok);

/* The damping GPTQ's authors use: 1 % of the mean diagonal. */
#define GPTQ_DAMP 0.01

#endif
