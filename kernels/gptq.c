/* GPTQ's factor: the upper-triangular U with H^-1 = U^T U, from an input covariance H.
 * Not on the hot path: the loader computes one per distinct matrix input (q, k and v
 * share theirs), so it is plain double-precision code. */
#include "kernels/gptq.h"

#include <math.h>
#include <stdlib.h>

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

int gptq_factor(const float *h, size_t d, double damp, float *u)
{
	if (d == 0 || d > ((size_t)-1) / sizeof(double) / d)
		return -1;
	double *v = calloc(d * d, sizeof *v);
	double *inv = calloc(d, sizeof *inv);
	int rc = 0;
	if (!v || !inv) {
		rc = -1;
		goto out;
	}
	double mean = 0;
	for (size_t i = 0; i < d; i++)
		mean += (double)h[i * d + i];
	mean = mean / (double)d;
	double add = damp * (mean > 0 ? mean : 1.0);
	/* H = V V^T, V upper, from the bottom-right corner up: row i of V past column j is
	 * what the columns after j already explain, so each entry is one contiguous dot. */
	for (size_t jj = d; jj-- > 0;) {
		double *vj = v + jj * d;
		double s = (double)h[jj * d + jj] + add - dot_d(vj + jj + 1, vj + jj + 1, d - jj - 1);
		if (!(s > 0) || !isfinite(s)) {
			rc = -1;
			goto out;
		}
		vj[jj] = sqrt(s);
		inv[jj] = 1.0 / vj[jj];
		for (size_t i = 0; i < jj; i++) {
			double *vi = v + i * d;
			vi[jj] = ((double)h[i * d + jj] - dot_d(vi + jj + 1, vj + jj + 1, d - jj - 1)) * inv[jj];
		}
	}
	/* U = V^-1, row by row from the last: row i of U V = e_i gives
	 * U[i][j] = -(sum_{i<=k<j} U[i][k] V[k][j]) / V[j][j], accumulated a row of V at a
	 * time so every inner loop runs along a row. */
	double *acc = calloc(d, sizeof *acc);
	if (!acc) {
		rc = -1;
		goto out;
	}
	for (size_t i = 0; i < d; i++) {
		for (size_t j = 0; j < d; j++)
			acc[j] = 0;
		float *ui = u + i * d;
		for (size_t j = 0; j < i; j++)
			ui[j] = 0.0f;
		for (size_t k = i; k < d; k++) {
			/* acc[k] holds sum_{i<=l<k} U[i][l] V[l][k]: U[i][k] is now known */
			double uik = k == i ? inv[i] : -acc[k] * inv[k];
			ui[k] = (float)uik;
			axpy_d(acc + k + 1, v + k * d + k + 1, uik, d - k - 1);
		}
	}
	free(acc);
out:
	free(v);
	free(inv);
	return rc;
}

/* Four lanes of floats as the baseline ISA's registers hold them: the compiler keeps
 * these accumulators in registers, where an array of them would go through memory. */
typedef float gptq_v4 __attribute__((vector_size(16)));

static double v4_sum(gptq_v4 v)
{
	return ((double)v[0] + (double)v[1]) + ((double)v[2] + (double)v[3]);
}

int gptq_cov_add(double *cov, size_t d, const float *x, size_t n_tok)
{
	enum { B = GPTQ_COV_BLOCK };
	gptq_v4 *xt = aligned_alloc(64, (d * B * sizeof(float) + 63) & ~(size_t)63);
	if (!xt)
		return -1;
	float *f = (float *)xt;
	for (size_t t0 = 0; t0 < n_tok; t0 += B) {
		size_t nt = n_tok - t0 < B ? n_tok - t0 : B;
		for (size_t i = 0; i < d; i++)
			for (size_t t = 0; t < B; t++)
				f[i * B + t] = t < nt ? x[(t0 + t) * d + i] : 0.0f;
		for (size_t i = 0; i < d; i++) {
			const gptq_v4 *a = xt + i * (B / 4);
			double *ci = cov + i * d;
			size_t j = i;
			for (; j + 4 <= d; j += 4) {
				const gptq_v4 *b0 = xt + j * (B / 4), *b1 = b0 + B / 4, *b2 = b1 + B / 4, *b3 = b2 + B / 4;
				gptq_v4 s0 = { 0 }, s1 = { 0 }, s2 = { 0 }, s3 = { 0 };
				for (size_t k = 0; k < B / 4; k++) {
					s0 += a[k] * b0[k];
					s1 += a[k] * b1[k];
					s2 += a[k] * b2[k];
					s3 += a[k] * b3[k];
				}
				ci[j] += v4_sum(s0);
				ci[j + 1] += v4_sum(s1);
				ci[j + 2] += v4_sum(s2);
				ci[j + 3] += v4_sum(s3);
			}
			for (; j < d; j++) {
				const gptq_v4 *b = xt + j * (B / 4);
				gptq_v4 s0 = { 0 };
				for (size_t k = 0; k < B / 4; k++)
					s0 += a[k] * b[k];
				ci[j] += v4_sum(s0);
			}
		}
	}
	free(xt);
	return 0;
}
