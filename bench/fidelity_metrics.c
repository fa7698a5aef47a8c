/* Corpus, KL / top-1 accounting and bits-per-weight for the fidelity tools. KL is taken over
 * the full vocabulary in double precision with log-sum-exp, so a flat distribution over 150k
 * ids neither underflows nor loses the small differences 4-bit weights make. */
#include "bench/fidelity_metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/gguf.h"
#include "daemon/engine/tokenizer.h"

/* Plain prose with digits, punctuation and a few longer words, so a real tokenizer yields
 * a mix of common and rare pieces. Long enough for 64+ tokens in either vocabulary. */
static const char fidelity_text[] =
	"The keeper of the lighthouse wrote in the log every evening at six: the wind from "
	"the north-west, the sea calm, two fishing boats returned before dark. In winter the "
	"lamp burned for fourteen hours, and the oil lasted, by his careful reckoning, "
	"exactly 37 nights. Visitors rarely came; when they did, they asked why anyone would "
	"choose such a life. He answered that the light was not for him, but for the ships "
	"he would never meet, and that a quiet job done well is its own kind of company.";

static void fidelity_random_ids(uint32_t seed, int32_t *p, uint32_t n, uint32_t n_vocab)
{
	uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
	for (uint32_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (int32_t)(x % n_vocab);
	}
}

int fidelity_corpus_build(struct fidelity_corpus *c, const struct tok *tok, uint32_t n_vocab,
			  uint32_t n_seqs, uint32_t len, uint32_t seed, bool text,
			  struct hearth_error *err)
{
	memset(c, 0, sizeof *c);
	size_t n;
	if (!n_seqs || !len || !n_vocab || __builtin_mul_overflow((size_t)n_seqs, (size_t)len, &n))
		return hearth_error_set(err, HEARTH_EINVAL, "corpus: %u sequences of %u tokens", n_seqs, len);
	c->ids = malloc(n * sizeof *c->ids);
	if (!c->ids)
		return hearth_error_set(err, HEARTH_ENOMEM, "corpus: %zu ids", n);
	c->n_seqs = n_seqs;
	c->len = len;
	uint32_t first = 0;
	if (text) {
		size_t cap = sizeof fidelity_text + 8, got;
		int32_t *buf = malloc(cap * sizeof *buf);
		if (!buf) {
			fidelity_corpus_free(c);
			return hearth_error_set(err, HEARTH_ENOMEM, "corpus: text ids");
		}
		int rc = tok_encode(tok, fidelity_text, sizeof fidelity_text - 1, tok_add_bos(tok), false,
				    buf, cap, &got, err);
		if (rc == 0 && got < len)
			rc = hearth_error_set(err, HEARTH_ERANGE,
					      "corpus: the paragraph is %zu tokens, fewer than --len %u "
					      "(use --no-text or a shorter --len)", got, len);
		if (rc < 0) {
			free(buf);
			fidelity_corpus_free(c);
			return rc;
		}
		memcpy(c->ids, buf, len * sizeof *buf);
		free(buf);
		first = 1;
	}
	for (uint32_t s = first; s < n_seqs; s++)
		fidelity_random_ids(seed + s, c->ids + (size_t)s * len, len, n_vocab);
	return 0;
}

void fidelity_corpus_free(struct fidelity_corpus *c)
{
	free(c->ids);
	memset(c, 0, sizeof *c);
}

void fidelity_acc_init(struct fidelity_acc *a)
{
	memset(a, 0, sizeof *a);
}

void fidelity_acc_free(struct fidelity_acc *a)
{
	free(a->kl);
	memset(a, 0, sizeof *a);
}

static uint32_t fidelity_argmax(const float *x, uint32_t n)
{
	uint32_t best = 0;
	for (uint32_t i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

/* log of the sum of exp(x[i]) */
static double fidelity_logsumexp(const float *x, uint32_t n, double max)
{
	double z = 0;
	for (uint32_t i = 0; i < n; i++)
		z += exp((double)x[i] - max);
	return max + log(z);
}

int fidelity_acc_add(struct fidelity_acc *a, const float *ref, const float *q, size_t n,
		     uint32_t n_vocab, struct hearth_error *err)
{
	if (a->n + n > a->cap) {
		size_t cap = a->cap ? a->cap : 256;
		while (cap < a->n + n)
			cap *= 2;
		double *kl = realloc(a->kl, cap * sizeof *kl);
		if (!kl)
			return hearth_error_set(err, HEARTH_ENOMEM, "fidelity: %zu positions", cap);
		a->kl = kl;
		a->cap = cap;
	}
	for (size_t t = 0; t < n; t++) {
		const float *p = ref + t * n_vocab, *r = q + t * n_vocab;
		uint32_t ip = fidelity_argmax(p, n_vocab), ir = fidelity_argmax(r, n_vocab);
		double lzp = fidelity_logsumexp(p, n_vocab, p[ip]);
		double lzr = fidelity_logsumexp(r, n_vocab, r[ir]);
		double kl = 0;
		for (uint32_t i = 0; i < n_vocab; i++) {
			double lp = (double)p[i] - lzp, lr = (double)r[i] - lzr;
			kl += exp(lp) * (lp - lr);
		}
		/* Rounding can leave an identical pair a hair below zero. */
		a->kl[a->n++] = kl > 0 ? kl : 0;
		a->top1_hits += ip == ir;
	}
	return 0;
}

static int fidelity_cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;
	return (a > b) - (a < b);
}

struct fidelity_summary fidelity_acc_summary(const struct fidelity_acc *a)
{
	struct fidelity_summary s = { 0 };
	s.positions = a->n;
	if (!a->n)
		return s;
	double *sorted = malloc(a->n * sizeof *sorted);
	double sum = 0;
	for (size_t i = 0; i < a->n; i++)
		sum += a->kl[i];
	s.top1 = (double)a->top1_hits / (double)a->n;
	s.kl_mean = sum / (double)a->n;
	if (sorted) {
		memcpy(sorted, a->kl, a->n * sizeof *sorted);
		qsort(sorted, a->n, sizeof *sorted, fidelity_cmp_double);
		size_t rank = (size_t)ceil(0.99 * (double)a->n);
		s.kl_p99 = sorted[(rank ? rank : 1) - 1];
		s.kl_max = sorted[a->n - 1];
		free(sorted);
	} else {
		s.kl_p99 = NAN;
		s.kl_max = NAN;
	}
	return s;
}

int fidelity_gguf_bpw(const char *path, struct fidelity_bpw *out, struct hearth_error *err)
{
	memset(out, 0, sizeof *out);
	struct gguf_file *f;
	int rc = gguf_open(&f, path, err);
	if (rc < 0)
		return rc;
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		out->bytes_all += t->size;
		out->params_all += t->n_elems;
		if (t->n_dims >= 2 && t->ne[1] > 1) {
			out->bytes_mat += t->size;
			out->params_mat += t->n_elems;
		}
	}
	gguf_close(f);
	return 0;
}

double fidelity_bpw_of(uint64_t bytes, uint64_t params)
{
	return params ? 8.0 * (double)bytes / (double)params : 0;
}
