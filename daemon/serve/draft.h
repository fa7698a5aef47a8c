/* Speculative decoding's second drafting source: a small draft model with the target's
 * vocabulary proposes each sequence's next tokens greedily, one batched draft step per
 * token over every drafting sequence. The scheduler verifies the proposals (sched.c). */
#ifndef HEARTH_DAEMON_DRAFT_H
#define HEARTH_DAEMON_DRAFT_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/engine/engine.h"
#include "daemon/serve/spec.h"
#include "protocol/error.h"

struct tok;
struct grammar_matcher;

/* One sequence in the draft model: its own KV (a private engine sequence, so any of its
 * positions can be taken back) and the last proposal. The draft's KV holds tokens[0..base)
 * of the sequence and then the proposal's first n_fed - base tokens. */
struct draft_seq {
	struct engine_seq *eseq;        /* NULL until the first proposal (or after a close) */
	uint32_t n_fed;                 /* positions in the draft's KV */
	uint32_t base;                  /* the sequence's length when the proposal was made */
	uint32_t n_out;                 /* the proposal: out[0..n_out) follow tokens[0..base) */
	int32_t out[SPEC_K_MAX];
};

/* What one sequence asks of a proposal round. */
struct draft_job {
	struct draft_seq *ds;
	const int32_t *tokens;          /* the sequence so far (all certain) */
	uint32_t n_tokens;
	uint32_t k;                     /* tokens wanted, 1..SPEC_K_MAX */
	uint32_t n_reserve;             /* KV positions the draft sequence may reach */
	struct grammar_matcher *grammar; /* constrains the proposal when not NULL (left as it
					  * was found) */
};

struct drafter;

/* A drafter over draft engine eng (copied; its model outlives the drafter) for at most
 * max_seqs sequences at once and step_tokens tokens a draft step. */
int drafter_new(struct drafter **out, const struct engine *eng, uint32_t max_seqs, uint32_t step_tokens,
		struct hearth_error *err);
void drafter_free(struct drafter *d);

/* Proposes for every job (ds->out, ds->n_out; 0 when the draft cannot now: its KV budget is
 * full, or the sequence's catch-up does not fit this step). First each draft KV is brought
 * in step with the sequence (positions of a rejected proposal go back, tokens the draft
 * has not seen are fed), then one batched draft step per proposed token, each taking the
 * greedy token among those the sequence's grammar allows. A proposal made for a sequence
 * that has not moved since is kept as it is. Errors are the draft engine's. */
int drafter_propose(struct drafter *d, struct draft_job *jobs, uint32_t n_jobs, struct hearth_error *err);

/* The draft's KV in use and in all, in bytes (the engine's kv_usage; 0 and 0 when the
 * draft engine does not say): the stats reply's draft_kv_used and draft_kv_total. */
void drafter_kv_usage(const struct drafter *d, uint64_t *used, uint64_t *total);

/* Gives ds's draft KV back (the sequence ended or was preempted). */
void drafter_seq_close(struct drafter *d, struct draft_seq *ds);

/* 0 when the draft's tokenizer is the target's token for token (count, text and type), as
 * llama.cpp's speculative example requires; else an error naming the first difference. */
int draft_vocab_check(const struct tok *target, const struct tok *draft, struct hearth_error *err);

#endif
