/* The boundary between the scheduler and a model implementation: sequences that own KV
 * state, and one batched forward step over spans of many sequences, so every running
 * sequence shares one pass over the weights. The reference model and the int4 model both
 * sit behind it. */
#ifndef HEARTH_DAEMON_ENGINE_H
#define HEARTH_DAEMON_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "protocol/error.h"

struct engine_seq; /* per-sequence state of the implementation (its KV blocks) */

/* seq_open's share for a sequence outside every prefix-sharing domain. */
#define ENGINE_SHARE_PRIVATE UINT64_MAX

struct engine_span {
	struct engine_seq *seq;
	const int32_t *tokens;  /* appended at the sequence's current length */
	uint32_t n;
	float *logits;          /* NULL, or n_logits x n_vocab floats: the logits after each of
				 * the last n_logits tokens, in order */
	/* Rows of logits wanted; 0 means 1. Above 1 the span verifies a draft (speculative
	 * decoding): its last n_logits - 1 positions are tentative. The engine does not
	 * publish them to the prefix cache, and seq_truncate may take them back. */
	uint32_t n_logits;
	/* NULL, or n x n_embd floats: the final hidden state of each of the span's tokens
	 * after the output norm (what an embedding pools; no head is run for them). Not with
	 * logits: an embedding sequence is prefill only. */
	float *embd;
};

struct engine {
	void *impl;
	uint32_t n_vocab;
	uint32_t n_embd;        /* width of a span's embd rows */
	int pooling;            /* the file's pooling_type (enum model_pooling, model.h): the
				 * default of an embed request; MODEL_POOLING_UNSPECIFIED if none */
	uint32_t max_context;   /* tokens one sequence may hold */
	uint64_t kv_tokens;     /* tokens the whole KV budget holds */
	/* Opens a sequence for a prompt and reserves KV for n_reserve tokens in all.
	 * *n_cached is how many leading prompt tokens are already computed (a shared prefix).
	 * HEARTH_EKVFULL when the budget cannot hold it now. share is the prefix-sharing
	 * domain (kv_seq_set_share): a prefix is found only in the same domain. prompt NULL
	 * (n_prompt 0) matches nothing: every position is computed (an embedding that pools
	 * hidden states a cached prefix does not have). Share ENGINE_SHARE_PRIVATE opens a
	 * sequence that neither finds nor publishes a prefix, so seq_truncate may take back
	 * any of its positions (a draft model's sequence, whose guesses are fed one token a
	 * step and rolled back after verification). */
	int (*seq_open)(void *impl, const int32_t *prompt, uint32_t n_prompt, uint32_t n_reserve,
			uint64_t share, struct engine_seq **out, uint32_t *n_cached, struct hearth_error *err);
	void (*seq_close)(void *impl, struct engine_seq *seq);
	int (*forward)(void *impl, const struct engine_span *spans, size_t n_spans,
		       struct hearth_error *err);
	/* Takes back the positions of seq from n_past on: only tentative ones (of its last
	 * span, n_logits > 1), or any of a private sequence's, may be taken back. NULL: the engine cannot verify drafts. */
	int (*seq_truncate)(void *impl, struct engine_seq *seq, uint32_t n_past,
			    struct hearth_error *err);
	/* Rows of logits one forward step can return in all spans together (0 = one per
	 * span, as before drafts). */
	uint32_t max_logit_rows;
	/* KV bytes in use and in all, for stats. */
	void (*kv_usage)(void *impl, uint64_t *used, uint64_t *total);
	/* Optional: called once on the compute thread before its first step (the int4
	 * engine pins it to the first CPU of the pool, as thread 0 of every step). */
	void (*thread_init)(void *impl);
};

/* One real step of one token on a fresh sequence, closed again: it touches every weight
 * page and code path before the first request, and finds an engine that cannot step before
 * anyone is told it is ready. 0, or the error of the seq_open or forward that failed. */
static inline int engine_warm_up(const struct engine *eng, int32_t tok, struct hearth_error *err)
{
	struct engine_seq *s = NULL;
	uint32_t cached;
	int rc = eng->seq_open(eng->impl, &tok, 1, 1, 0, &s, &cached, err);
	if (rc < 0)
		return rc;
	struct engine_span sp = { s, &tok, 1, NULL, 0, NULL };
	rc = eng->forward(eng->impl, &sp, 1, err);
	eng->seq_close(eng->impl, s);
	return rc < 0 ? rc : 0;
}

#endif
