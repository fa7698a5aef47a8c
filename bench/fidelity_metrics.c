/* Corpus, KL / top-1 accounting and bits-per-weight for the fidelity tools. KL is taken over
 * the full vocabulary in double precision with log-sum-exp, so a flat distribution over 150k
 * ids neither underflows nor loses the small differences 4-bit weights make. */
#include "bench/fidelity_metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

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

int fidelity_corpus_read(struct fidelity_corpus *c, const struct tok *tok, const char *path,
			 uint32_t n_seqs, uint32_t len, struct hearth_error *err)
{
	memset(c, 0, sizeof *c);
	size_t n, cap = 0, got;
	char *line = NULL;
	int32_t *buf = NULL;
	int rc = 0;
	if (!n_seqs || !len || __builtin_mul_overflow((size_t)n_seqs, (size_t)len, &n))
		return hearth_error_set(err, HEARTH_EINVAL, "corpus: %u sequences of %u tokens", n_seqs, len);
	FILE *f = fopen(path, "rb");
	if (!f)
		return hearth_error_set(err, HEARTH_EIO, "corpus: %s: %s", path, strerror(errno));
	if (!(c->ids = malloc(n * sizeof *c->ids))) {
		rc = hearth_error_set(err, HEARTH_ENOMEM, "corpus: %zu ids", n);
		goto out;
	}
	c->len = len;
	ssize_t linelen;
	while (c->n_seqs < n_seqs && (linelen = getline(&line, &cap, f)) > 0) {
		if (line[linelen - 1] == '\n')
			linelen--;
		/* a token is at least one byte, and BOS adds one */
		int32_t *grown = realloc(buf, ((size_t)linelen + 2) * sizeof *buf);
		if (!grown) {
			rc = hearth_error_set(err, HEARTH_ENOMEM, "corpus: ids for a %zd-byte line", linelen);
			goto out;
		}
		buf = grown;
		if ((rc = tok_encode(tok, line, (size_t)linelen, tok_add_bos(tok), false, buf, (size_t)linelen + 2,
				     &got, err)) < 0)
			goto out;
		if (got >= len)
			memcpy(c->ids + (size_t)c->n_seqs++ * len, buf, len * sizeof *buf);
	}
	if (c->n_seqs < n_seqs)
		rc = hearth_error_set(err, HEARTH_ERANGE, "corpus: %s has %u lines of %u or more tokens, not %u",
				      path, c->n_seqs, len, n_seqs);
out:
	free(line);
	free(buf);
	fclose(f);
	if (rc < 0)
		fidelity_corpus_free(c);
	return rc < 0 ? rc : 0;
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

/* ggml's block sizes (ggml.c type_traits), for the types llama-quantize writes at 2-8 bits. */
static const struct {
	const char *name;
	uint32_t block_elems, block_bytes;
} fidelity_types[64] = {
	[0] = { "F32", 1, 4 }, [1] = { "F16", 1, 2 }, [2] = { "Q4_0", 32, 18 }, [3] = { "Q4_1", 32, 20 },
	[6] = { "Q5_0", 32, 22 }, [7] = { "Q5_1", 32, 24 }, [8] = { "Q8_0", 32, 34 },
	[10] = { "Q2_K", 256, 84 }, [11] = { "Q3_K", 256, 110 }, [12] = { "Q4_K", 256, 144 },
	[13] = { "Q5_K", 256, 176 }, [14] = { "Q6_K", 256, 210 }, [20] = { "IQ4_NL", 32, 18 },
	[23] = { "IQ4_XS", 256, 136 }, [30] = { "BF16", 1, 2 },
};

const char *fidelity_type_name(unsigned t)
{
	return t < 64 && fidelity_types[t].name ? fidelity_types[t].name : "?";
}

struct scan {
	FILE *f;
	bool bad;
};

static uint64_t scan_u(struct scan *s, int bytes)
{
	uint8_t b[8];
	uint64_t v = 0;
	if (fread(b, 1, (size_t)bytes, s->f) != (size_t)bytes) {
		s->bad = true;
		return 0;
	}
	for (int i = bytes - 1; i >= 0; i--)
		v = v << 8 | b[i];
	return v;
}

static void scan_skip(struct scan *s, uint64_t n)
{
	if (n > (1u << 30) || fseek(s->f, (long)n, SEEK_CUR))
		s->bad = true;
}

/* Skips one metadata value of GGUF type t (arrays of arrays are not in any real file). */
static void scan_value(struct scan *s, uint32_t t, int depth)
{
	static const int width[13] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };
	if (t == 8) {
		scan_skip(s, scan_u(s, 8));
	} else if (t == 9 && depth == 0) {
		uint32_t et = (uint32_t)scan_u(s, 4);
		uint64_t n = scan_u(s, 8);
		if (et == 8 || et == 9) {
			for (uint64_t i = 0; i < n && !s->bad; i++)
				scan_value(s, et, 1);
		} else if (et < 13 && width[et]) {
			scan_skip(s, n * (uint64_t)width[et]);
		} else {
			s->bad = true;
		}
	} else if (t < 13 && width[t]) {
		scan_skip(s, (uint64_t)width[t]);
	} else {
		s->bad = true;
	}
}

int fidelity_gguf_census(const char *path, struct fidelity_bpw *out, unsigned count[64],
			 struct hearth_error *err)
{
	memset(out, 0, sizeof *out);
	memset(count, 0, 64 * sizeof *count);
	struct scan s = { fopen(path, "rb"), false };
	if (!s.f)
		return hearth_error_set(err, HEARTH_EIO, "%s: %s", path, strerror(errno));
	int rc = 0;
	if (scan_u(&s, 4) != 0x46554747u || scan_u(&s, 4) < 2) { /* "GGUF", version 2 or 3 */
		rc = hearth_error_set(err, HEARTH_EFORMAT, "%s: not a GGUF v2/v3 file", path);
		goto out;
	}
	uint64_t n_tensors = scan_u(&s, 8), n_kv = scan_u(&s, 8);
	for (uint64_t i = 0; i < n_kv && !s.bad; i++) {
		scan_skip(&s, scan_u(&s, 8));
		scan_value(&s, (uint32_t)scan_u(&s, 4), 0);
	}
	for (uint64_t i = 0; i < n_tensors && !s.bad; i++) {
		scan_skip(&s, scan_u(&s, 8));
		uint32_t n_dims = (uint32_t)scan_u(&s, 4);
		uint64_t ne[4] = { 1, 1, 1, 1 }, n = 1;
		for (uint32_t d = 0; d < n_dims && d < 4; d++)
			n *= ne[d] = scan_u(&s, 8);
		uint32_t t = (uint32_t)scan_u(&s, 4);
		scan_u(&s, 8); /* offset */
		if (s.bad || n_dims > 4 || t >= 64 || !fidelity_types[t].name) {
			rc = hearth_error_set(err, HEARTH_EUNSUPPORTED, "%s: tensor %" PRIu64 ": type %u unknown here",
					      path, i, t);
			goto out;
		}
		uint64_t bytes = n / fidelity_types[t].block_elems * fidelity_types[t].block_bytes;
		out->bytes_all += bytes;
		out->params_all += n;
		if (n_dims >= 2 && ne[1] > 1) {
			out->bytes_mat += bytes;
			out->params_mat += n;
			count[t]++;
		}
	}
	if (s.bad)
		rc = hearth_error_set(err, HEARTH_EFORMAT, "%s: truncated or malformed header", path);
out:
	fclose(s.f);
	return rc;
}
