/* GPTQ's arithmetic around the packer: the covariance sums a calibration run collects, how
 * much of them to trust (damping, shrinkage), and the upper-triangular U with H^-1 = U^T U.
 * Not on the hot path (the loader factors once per distinct matrix input), so plain code. */
#include "kernels/gptq.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* sum a[k] b[k] over n in eight lanes, two vectors of four (their order fixed, so every
 * machine gets the same sum): one dependent add a step would make the factor
 * latency-bound. */
typedef double gptq_v4du __attribute__((vector_size(32), aligned(8)));
static double dot_d(const double *a, const double *b, size_t n)
{
	gptq_v4du l0 = { 0 }, l1 = { 0 };
	double s = 0;
	size_t k = 0;
	for (; k + 8 <= n; k += 8) {
		l0 += *(const gptq_v4du *)(a + k) * *(const gptq_v4du *)(b + k);
		l1 += *(const gptq_v4du *)(a + k + 4) * *(const gptq_v4du *)(b + k + 4);
	}
	for (; k < n; k++)
		s += a[k] * b[k];
	l0 += l1;
	return s + ((l0[0] + l0[1]) + (l0[2] + l0[3]));
}

/* y += a x, four at a time in vectors (GCC's -O2 leaves a loop of unknown length scalar);
 * the same products and sums as one at a time. */
static void axpy_d(double *y, const double *x, double a, size_t n)
{
	size_t k = 0;
	for (; k + 4 <= n; k += 4)
		*(gptq_v4du *)(y + k) += a * *(const gptq_v4du *)(x + k);
	for (; k < n; k++)
		y[k] += a * x[k];
}

double gptq_damping(const float *h, size_t d, size_t block, double tokens)
{
	double mean = 0;
	for (size_t i = 0; block && i < d; i++)
		mean += (double)h[i * block + i % block];
	mean = d ? mean / (double)d : 0;
	double damp = GPTQ_DAMP + (tokens > 0 ? (double)block / tokens : 0.0);
	return damp * (mean > 0 ? mean : 1.0);
}

double gptq_keep(const float *h, size_t ldh, size_t n, double tokens)
{
	/* Over a block's pairs: the squared sample correlations r^2, and what their noise
	 * alone would give, (1 + r^2) / tokens each for Gaussian inputs. */
	double signal = 0, noise = 0;
	for (size_t i = 0; tokens > 0 && i < n; i++) {
		double hi = h[i * ldh + i];
		for (size_t j = i + 1; j < n && hi > 0; j++) {
			double hj = h[j * ldh + j];
			if (!(hj > 0))
				continue;
			double r2 = (double)h[i * ldh + j] * h[i * ldh + j] / (hi * hj);
			signal += r2;
			noise += (1.0 + r2) / tokens;
		}
	}
	double keep = signal > 0 ? 1.0 - noise / signal : 0.0;
	return keep < 0 ? 0.0 : keep > 1 ? 1.0 : keep;
}

int gptq_factor(const float *h, size_t ldh, size_t n, double add, double keep, float *u, size_t ldu)
{
	if (n == 0 || n > ((size_t)-1) / sizeof(double) / n)
		return -1;
	double *v = calloc(n * n, sizeof *v);
	double *inv = calloc(n, sizeof *inv);
	double *acc = calloc(n, sizeof *acc);
	int rc = 0;
	if (!v || !inv || !acc) {
		rc = -1;
		goto out;
	}
	/* H = V V^T, V upper, from the bottom-right corner up: row i of V past column j is
	 * what the columns after j already explain, so each entry is one contiguous dot. */
	for (size_t jj = n; jj-- > 0;) {
		double *vj = v + jj * n;
		double s = (double)h[jj * ldh + jj] + add - dot_d(vj + jj + 1, vj + jj + 1, n - jj - 1);
		if (!(s > 0) || !isfinite(s)) {
			rc = -1;
			goto out;
		}
		vj[jj] = sqrt(s);
		inv[jj] = 1.0 / vj[jj];
		for (size_t i = 0; i < jj; i++) {
			double *vi = v + i * n;
			vi[jj] = ((double)h[i * ldh + jj] * keep - dot_d(vi + jj + 1, vj + jj + 1, n - jj - 1)) * inv[jj];
		}
	}
	/* U = V^-1, row by row: row i of U V = e_i gives
	 * U[i][j] = -(sum_{i<=k<j} U[i][k] V[k][j]) / V[j][j], accumulated a row of V at a
	 * time so every inner loop runs along a row. */
	for (size_t i = 0; i < n; i++) {
		for (size_t j = 0; j < n; j++)
			acc[j] = 0;
		float *ui = u + i * ldu;
		for (size_t j = 0; j < i; j++)
			ui[j] = 0.0f;
		for (size_t k = i; k < n; k++) {
			/* acc[k] holds sum_{i<=l<k} U[i][l] V[l][k]: U[i][k] is now known */
			double uik = k == i ? inv[i] : -acc[k] * inv[k];
			ui[k] = (float)uik;
			axpy_d(acc + k + 1, v + k * n + k + 1, uik, n - k - 1);
		}
	}
out:
	free(v);
	free(inv);
	free(acc);
	return rc;
}

int gptq_factor_blocks(const float *h, size_t d, size_t block, double add, double tokens, float *u)
{
	return gptq_factor_blocks_part(h, d, block, add, tokens, u, 0, 1);
}

int gptq_factor_blocks_part(const float *h, size_t d, size_t block, double add, double tokens, float *u,
			    size_t part, size_t n_parts)
{
	if (block == 0 || block > d || part >= n_parts)
		return -1;
	for (size_t b = part * block; b < d; b += n_parts * block) {
		size_t n = d - b < block ? d - b : block;
		for (size_t i = b; i < b + block && i < d; i++) /* the narrow last block's pad */
			for (size_t j = n; j < block; j++)
				u[i * block + j] = 0.0f;
		double keep = tokens < 0 ? 1.0 : gptq_keep(h + b * block, block, n, tokens);
		if (gptq_factor(h + b * block, block, n, add, keep, u + b * block, block) < 0)
			return -1;
	}
	return 0;
}

size_t gptq_cov_ld(size_t d)
{
	return (d + 15) / 16 * 16 + 16;
}

void gptq_cov_add_part(double *cov, size_t d, size_t block, const float *x, size_t ld, size_t n_tok, size_t batch,
		       size_t part, size_t n_parts, vec_cov_rows_fn rows)
{
	/* Rows outside, batches inside: a chunk's doubles stay in cache while every batch is
	 * added to them in order (each entry's sums and their order are the batches', as
	 * batches outside would add them), so the doubles cross memory once per call rather
	 * than once per batch. */
	for (size_t c = part * GPTQ_COV_ROWS; c < d; c += n_parts * GPTQ_COV_ROWS)
		for (size_t i = c, n; i < c + GPTQ_COV_ROWS && i < d; i += n) { /* the chunk's rows in one block */
			size_t bs = i / block * block, end = bs + block < d ? bs + block : d;
			size_t last = c + GPTQ_COV_ROWS < end ? c + GPTQ_COV_ROWS : end;

			n = last - i;
			for (size_t t0 = 0; t0 < n_tok; t0 += batch) {
				size_t nt = n_tok - t0 < batch ? n_tok - t0 : batch;
				rows(cov + i * block + (i - bs), block, x + t0 * ld, ld, nt, i, n, end);
			}
		}
}

int gptq_cov_add(double *cov, size_t d, size_t block, const float *x, size_t n_tok, vec_cov_rows_fn rows)
{
	if (block == 0 || block > d)
		return -1;
	size_t ld = gptq_cov_ld(d);
	float *xb = malloc(GPTQ_COV_TOKENS * ld * sizeof *xb);
	if (!xb)
		return -1;
	for (size_t t0 = 0; t0 < n_tok; t0 += GPTQ_COV_TOKENS) {
		size_t nt = n_tok - t0 < GPTQ_COV_TOKENS ? n_tok - t0 : GPTQ_COV_TOKENS;

		for (size_t t = 0; t < nt; t++)
			memcpy(xb + t * ld, x + (t0 + t) * d, d * sizeof *xb);
		gptq_cov_add_part(cov, d, block, xb, ld, nt, GPTQ_COV_TOKENS, 0, 1, rows);
	}
	free(xb);
	return 0;
}
