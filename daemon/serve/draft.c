/* The draft model's side of speculative decoding (draft.h): keeping each sequence's draft
 * KV in step with what the target accepted, and proposing greedily in batched draft steps.
 * A draft step costs the small model's weights once for every drafting sequence. */
#include "daemon/serve/draft.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/grammar.h"
#include "daemon/engine/tokenizer.h"

struct drafter {
	struct engine eng;
	uint32_t max_seqs, step_tokens;
	struct engine_span *spans;      /* max_seqs */
	struct draft_job **span_job;    /* max_seqs: whose span */
	float *logits;                  /* max_seqs x n_vocab */
	uint32_t *mask;                 /* one grammar mask, n_vocab bits */
	uint32_t *n_accepted;           /* max_seqs: grammar steps taken per job this round */
};

int drafter_new(struct drafter **out, const struct engine *eng, uint32_t max_seqs, uint32_t step_tokens,
		struct hearth_error *err)
{
	*out = NULL;
	struct drafter *d = calloc(1, sizeof *d);
	if (!d)
		return hearth_error_set(err, HEARTH_ENOMEM, "draft model: out of memory");
	d->eng = *eng;
	d->max_seqs = max_seqs;
	d->step_tokens = step_tokens;
	d->spans = calloc(max_seqs, sizeof *d->spans);
	d->span_job = calloc(max_seqs, sizeof *d->span_job);
	d->logits = malloc((size_t)max_seqs * eng->n_vocab * sizeof(float));
	d->mask = malloc(((size_t)eng->n_vocab + 31) / 32 * sizeof(uint32_t));
	d->n_accepted = calloc(max_seqs, sizeof *d->n_accepted);
	if (!d->spans || !d->span_job || !d->logits || !d->mask || !d->n_accepted) {
		drafter_free(d);
		return hearth_error_set(err, HEARTH_ENOMEM, "draft model: out of memory for %u sequences",
					max_seqs);
	}
	*out = d;
	return 0;
}

void drafter_free(struct drafter *d)
{
	if (!d)
		return;
	free(d->spans);
	free(d->span_job);
	free(d->logits);
	free(d->mask);
	free(d->n_accepted);
	free(d);
}

void drafter_kv_usage(const struct drafter *d, uint64_t *used, uint64_t *total)
{
	*used = *total = 0;
	if (d->eng.kv_usage)
		d->eng.kv_usage(d->eng.impl, used, total);
}

void drafter_seq_close(struct drafter *d, struct draft_seq *ds)
{
	if (ds->eseq)
		d->eng.seq_close(d->eng.impl, ds->eseq);
	*ds = (struct draft_seq){ 0 };
}

/* Brings ds in step with the sequence: the proposal's tokens that the sequence now has
 * (accepted) stay, the rest go back. Returns how many tokens must be fed before a proposal
 * (0: none possible now), or -1 when the last proposal still stands. */
static int64_t draft_sync(struct drafter *d, struct draft_job *j, struct hearth_error *err)
{
	struct draft_seq *ds = j->ds;
	if (j->n_tokens >= d->eng.max_context) {
		drafter_seq_close(d, ds); /* past the draft's context: the lookup alone drafts */
		return 0;
	}
	if (!ds->eseq) {
		/* A sequence the draft cannot hold (its KV budget is full now, or the sequence is
		 * longer than its max_context) is drafted for by the lookup alone. */
		uint32_t cached, n_reserve = j->n_reserve < d->eng.max_context ? j->n_reserve : d->eng.max_context;
		struct hearth_error oe;
		if (j->n_tokens >= n_reserve ||
		    d->eng.seq_open(d->eng.impl, j->tokens, j->n_tokens, n_reserve, ENGINE_SHARE_PRIVATE, &ds->eseq,
				    &cached, &oe) < 0) {
			ds->eseq = NULL;
			return 0;
		}
		ds->n_fed = 0;
		ds->base = j->n_tokens;
		ds->n_out = 0;
		return j->n_tokens;
	}
	/* Nothing happened to the sequence since (the step did not take the proposal): the same
	 * tokens and grammar state give the same greedy proposal. */
	if (j->n_tokens == ds->base && ds->n_out > 0)
		return -1;
	uint32_t keep = ds->base;
	if (keep > j->n_tokens)
		keep = j->n_tokens; /* cannot happen: a sequence only grows while it has a draft */
	for (uint32_t i = 0; keep < j->n_tokens && keep < ds->n_fed && i < ds->n_out &&
			     j->tokens[keep] == ds->out[i]; i++)
		keep++;
	if (keep > ds->n_fed)
		keep = ds->n_fed;
	if (keep < ds->n_fed) {
		int rc = d->eng.seq_truncate(d->eng.impl, ds->eseq, keep, err);
		if (rc < 0)
			return rc;
		ds->n_fed = keep;
	}
	ds->n_out = 0;
	ds->base = j->n_tokens;
	return j->n_tokens - ds->n_fed;
}

/* The greedy token among those the grammar allows after row (NULL grammar: all), or -1. */
static int32_t draft_pick(struct drafter *d, struct draft_job *j, float *row)
{
	struct hearth_error ge;
	if (j->grammar) {
		if (grammar_matcher_is_done(j->grammar) || grammar_matcher_fill_mask(j->grammar, d->mask, &ge) < 0)
			return -1;
		grammar_mask_apply(row, d->mask, (int32_t)d->eng.n_vocab);
	}
	int32_t best = -1;
	float bv = -INFINITY;
	for (uint32_t i = 0; i < d->eng.n_vocab; i++)
		if (row[i] > bv) {
			bv = row[i];
			best = (int32_t)i;
		}
	if (best >= 0 && j->grammar && grammar_matcher_accept_token(j->grammar, best, &ge) < 0)
		return -1;
	return best;
}

int drafter_propose(struct drafter *d, struct draft_job *jobs, uint32_t n_jobs, struct hearth_error *err)
{
	if (n_jobs > d->max_seqs)
		n_jobs = d->max_seqs;
	/* Round 0: every draft catches up with its sequence (usually the one or two tokens the
	 * last verification added), as far as the step's tokens go; its last row gives the
	 * proposal's first token. */
	uint32_t n = 0, budget = d->step_tokens;
	for (uint32_t i = 0; i < n_jobs; i++) {
		struct draft_job *j = &jobs[i];
		d->n_accepted[i] = 0;
		int64_t need = draft_sync(d, j, err);
		if (need < 0 && need != -1)
			return (int)need;
		if (need <= 0 || budget == 0)
			continue;
		struct draft_seq *ds = j->ds;
		uint32_t take = need < budget ? (uint32_t)need : budget;
		bool whole = take == need;
		d->spans[n] = (struct engine_span){ ds->eseq, j->tokens + ds->n_fed, take,
						    whole ? d->logits + (size_t)n * d->eng.n_vocab : NULL, 0, NULL };
		d->span_job[n++] = whole ? j : NULL;
		ds->n_fed += take;
		budget -= take;
	}
	if (n == 0)
		return 0;
	int rc = d->eng.forward(d->eng.impl, d->spans, n, err);
	if (rc < 0)
		return rc;
	/* Rounds 1..: each job still drafting feeds its last proposed token. */
	for (;;) {
		uint32_t m = 0;
		for (uint32_t i = 0; i < n; i++) {
			struct draft_job *j = d->span_job[i];
			if (!j)
				continue;
			struct draft_seq *ds = j->ds;
			int32_t t = draft_pick(d, j, d->logits + (size_t)i * d->eng.n_vocab);
			if (t < 0) {
				d->span_job[i] = NULL;
				continue;
			}
			if (j->grammar)
				d->n_accepted[j - jobs]++;
			ds->out[ds->n_out++] = t;
			if (ds->n_out >= j->k || ds->n_out >= SPEC_K_MAX || ds->n_fed >= j->n_reserve ||
			    ds->n_fed >= d->eng.max_context) {
				d->span_job[i] = NULL;
				continue;
			}
			/* Compacted in place: the next step writes row m, after every row of this
			 * one was read (m <= i). */
			d->spans[m] = (struct engine_span){ ds->eseq, &ds->out[ds->n_out - 1], 1,
							    d->logits + (size_t)m * d->eng.n_vocab, 0, NULL };
			d->span_job[m++] = j;
			ds->n_fed++;
		}
		for (uint32_t i = m; i < n; i++)
			d->span_job[i] = NULL;
		n = m;
		if (n == 0)
			break;
		rc = d->eng.forward(d->eng.impl, d->spans, n, err);
		if (rc < 0)
			return rc;
	}
	/* The grammars go back to where the sequences are: the proposals are only guesses. */
	for (uint32_t i = 0; i < n_jobs; i++) {
		struct hearth_error ge;
		if (d->n_accepted[i] && grammar_matcher_rollback(jobs[i].grammar, d->n_accepted[i], &ge) < 0)
			return hearth_error_set(err, HEARTH_EINVAL, "draft model: grammar rollback: %s", ge.msg);
	}
	return 0;
}

int draft_vocab_check(const struct tok *target, const struct tok *draft, struct hearth_error *err)
{
	int32_t n = tok_n_vocab(target);
	if (tok_n_vocab(draft) != n)
		return hearth_error_set(err, HEARTH_EINVAL,
					"the draft model has %d tokens, the model %d: the vocabularies must be the same",
					tok_n_vocab(draft), n);
	if (tok_bos(draft) != tok_bos(target) || tok_eos(draft) != tok_eos(target) ||
	    tok_add_bos(draft) != tok_add_bos(target))
		return hearth_error_set(err, HEARTH_EINVAL,
					"the draft model's BOS/EOS (%d/%d, add_bos %d) differ from the model's (%d/%d, add_bos %d)",
					tok_bos(draft), tok_eos(draft), tok_add_bos(draft), tok_bos(target),
					tok_eos(target), tok_add_bos(target));
	size_t cap = tok_piece_max(target) > tok_piece_max(draft) ? tok_piece_max(target) : tok_piece_max(draft);
	char *a = malloc(cap + 1), *b = malloc(cap + 1);
	if (!a || !b) {
		free(a);
		free(b);
		return hearth_error_set(err, HEARTH_ENOMEM, "out of memory comparing vocabularies");
	}
	int rc = 0;
	for (int32_t i = 0; i < n && rc == 0; i++) {
		size_t la = tok_piece(target, i, true, a, cap), lb = tok_piece(draft, i, true, b, cap);
		bool same = la == lb && la <= cap && !memcmp(a, b, la) &&
			    tok_is_control(target, i) == tok_is_control(draft, i) &&
			    tok_is_eog(target, i) == tok_is_eog(draft, i) &&
			    tok_piece(target, i, false, a, cap) == tok_piece(draft, i, false, b, cap);
		if (!same)
			rc = hearth_error_set(err, HEARTH_EINVAL,
					      "token %d differs between the model and the draft model (text or type): the vocabularies must be the same",
					      i);
	}
	free(a);
	free(b);
	return rc;
}
