/* Fidelity of a quantized model against its unquantized original, shared by bench/fidelity
 * (hearth's int4 paths against the f32 reference) and bench/fidelity_llama (llama.cpp's Q4_0
 * against its own unquantized run): one corpus, one set of metrics, so the figures compare. */
#ifndef HEARTH_BENCH_FIDELITY_METRICS_H
#define HEARTH_BENCH_FIDELITY_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/error.h"

struct tok;

/* The corpus: n_seqs sequences of len ids each. With text, sequence 0 is the tokenized
 * built-in paragraph (the model's BOS first when it adds one), cut to len; the others are
 * pseudo-random ids below n_vocab from seed, the same on every run and in both tools. */
struct fidelity_corpus {
	uint32_t n_seqs, len;
	int32_t *ids;              /* n_seqs x len */
};

int fidelity_corpus_build(struct fidelity_corpus *c, const struct tok *tok, uint32_t n_vocab,
			  uint32_t n_seqs, uint32_t len, uint32_t seed, bool text,
			  struct hearth_error *err);
/* A corpus of real text: path holds one document a line (bench/train writes its held-out
 * chapters so); sequence s is the s-th line long enough, tokenized (BOS first when the
 * model adds one) and cut to len. Fails when fewer than n_seqs lines are long enough. */
int fidelity_corpus_read(struct fidelity_corpus *c, const struct tok *tok, const char *path,
			 uint32_t n_seqs, uint32_t len, struct hearth_error *err);
void fidelity_corpus_free(struct fidelity_corpus *c);

/* Per-position results; summaries are taken at the end. */
struct fidelity_acc {
	size_t n, cap;
	double *kl;                /* KL(reference || quantized) in nats, one per position */
	size_t top1_hits;
};

struct fidelity_summary {
	size_t positions;
	double top1;               /* fraction of positions whose argmax agrees */
	double kl_mean, kl_p99, kl_max;
};

void fidelity_acc_init(struct fidelity_acc *a);
void fidelity_acc_free(struct fidelity_acc *a);
/* Compares n positions: ref and q hold n x n_vocab logits each. */
int fidelity_acc_add(struct fidelity_acc *a, const float *ref, const float *q, size_t n,
		     uint32_t n_vocab, struct hearth_error *err);
/* p99 is the nearest-rank percentile: the smallest KL that at least 99% of positions stay
 * at or under. */
struct fidelity_summary fidelity_acc_summary(const struct fidelity_acc *a);

/* What a GGUF file spends on its tensors: bytes as stored (scales included) and elements,
 * over every tensor and over the 2-D ones (the matrices) alone. */
struct fidelity_bpw {
	uint64_t bytes_all, params_all, bytes_mat, params_mat;
};
int fidelity_gguf_bpw(const char *path, struct fidelity_bpw *out, struct hearth_error *err);
double fidelity_bpw_of(uint64_t bytes, uint64_t params);

/* The same, and per ggml type id (< 64) how many matrices use it, from the file's tensor
 * infos alone: works for llama.cpp types hearth does not load (IQ4_XS, the other K-quants),
 * whose sizes it only has to know, not decode. */
int fidelity_gguf_census(const char *path, struct fidelity_bpw *out, unsigned count[64],
			 struct hearth_error *err);
/* ggml's name for type id t ("IQ4_XS"), or "?" */
const char *fidelity_type_name(unsigned t);

#endif
