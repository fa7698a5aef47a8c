/* A shared fixture model through the f32 reference engine, for the scheduler's tests: the
 * file, model and tokenizer opened once, and the independent truth for greedy output (the
 * model alone, one token at a time). Include after cmocka.h. */
#ifndef HEARTH_TESTS_SUPPORT_REF_FIXTURE_H
#define HEARTH_TESTS_SUPPORT_REF_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/engine/gguf.h"
#include "daemon/engine/model.h"
#include "daemon/engine/ref/forward.h"
#include "daemon/engine/tokenizer.h"

/* Context the fixture model is loaded and run with. */
#define REF_FIXTURE_CTX 256

/* rel under $HEARTH_SHARED, into buf; exits when make check did not set it. */
static inline const char *ref_fixture_path(const char *rel, char *buf, size_t cap)
{
	const char *sh = getenv("HEARTH_SHARED");
	if (!sh) {
		fprintf(stderr, "HEARTH_SHARED is not set: run through make check\n");
		exit(1);
	}
	snprintf(buf, cap, "%s/%s", sh, rel);
	return buf;
}

/* Opens fixtures/name of the shared directory: 0, or -1 with the reason on stderr. */
static inline int ref_fixture_open(const char *name, struct gguf_file **f, struct model **m,
				   struct tok **tok)
{
	char rel[256], path[4096];
	struct hearth_error e;
	snprintf(rel, sizeof rel, "fixtures/%s", name);
	if (gguf_open(f, ref_fixture_path(rel, path, sizeof path), &e) < 0 ||
	    model_load(m, *f, &(struct model_opts){ .max_ctx = REF_FIXTURE_CTX }, &e) < 0 ||
	    tok_load(tok, *f, &e) < 0) {
		fprintf(stderr, "fixture %s: %s\n", name, e.msg);
		return -1;
	}
	return 0;
}

static inline void ref_fixture_close(struct gguf_file *f, struct model *m, struct tok *tok)
{
	tok_free(tok);
	model_free(m);
	gguf_close(f);
}

/* The model alone, greedy: max_tokens ids after prompt into out; returns max_tokens. */
static inline uint32_t ref_solo_greedy(const struct model *m, const int32_t *prompt, uint32_t n,
				       uint32_t max_tokens, int32_t *out)
{
	struct model_ctx *c;
	struct hearth_error e;
	uint32_t n_vocab = m->hp.n_vocab;
	float *logits = malloc(n_vocab * sizeof *logits);
	assert_non_null(logits);
	assert_int_equal(model_ctx_new(&c, m, REF_FIXTURE_CTX, &e), 0);
	assert_int_equal(model_forward(m, c, prompt, n, MODEL_LOGITS_LAST, logits, &e), 0);
	uint32_t k = 0;
	for (;;) {
		int32_t best = 0;
		for (uint32_t i = 1; i < n_vocab; i++)
			if (logits[i] > logits[best])
				best = (int32_t)i;
		out[k++] = best;
		if (k == max_tokens)
			break; /* the scheduler runs these with ignore_eos */
		assert_int_equal(model_forward(m, c, &best, 1, MODEL_LOGITS_LAST, logits, &e), 0);
	}
	model_ctx_free(c);
	free(logits);
	return k;
}

#endif
