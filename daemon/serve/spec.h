/* Speculative decoding's drafting side: prompt lookup (the draft is what followed the most
 * recent earlier occurrence of the sequence's last n-gram, in its prompt or its output) and
 * each sequence's adaptive draft length. The verification is the scheduler's (sched.c). */
#ifndef HEARTH_DAEMON_SPEC_H
#define HEARTH_DAEMON_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "protocol/msg.h"

/* Draft tokens one step may verify for one sequence (the protocol's `speculate` bound). */
#define SPEC_K_MAX MSG_SPECULATE_MAX
/* A request that does not say: drafts change no output (sched.c samples every token as
 * plain decoding would), so the only question is speed, and the adaptive length keeps a
 * failing lookup to one extra row a step (doc/benchmarks.md, Speculative decoding). */
#define SPEC_K_DEFAULT 8
/* The n-grams looked up, longest first: a longer match predicts better; a 1-gram matches
 * nearly everywhere and mostly wrongly. */
#define SPEC_NGRAM_MAX 4
#define SPEC_NGRAM_MIN 2

/* Where a request's drafts may come from. With a draft model loaded, auto takes the prompt
 * lookup's draft when the lookup finds a match and the draft model's otherwise: a match
 * costs no draft step and, where text is being copied, is right for long spans that a
 * small model would guess token by token; the model covers the free text in between. */
enum spec_source {
	SPEC_SOURCE_AUTO = 0,
	SPEC_SOURCE_LOOKUP,     /* prompt lookup only */
	SPEC_SOURCE_MODEL,      /* the draft model only (lookup when none is loaded) */
};

/* "auto", "lookup" or "model" (n bytes) into *out: 0, or -1 for any other text. */
int spec_source_parse(const char *text, size_t n, enum spec_source *out);

/* One sequence's drafting state. */
struct spec_seq {
	uint32_t k_max;         /* the request's bound; 0 = speculation off */
	uint32_t k;             /* the next lookup draft's length: adapts to what was accepted */
	uint32_t k_model;       /* the same for the draft model's proposals */
	enum spec_source source;
	uint64_t drafted;       /* draft tokens verified, in all (both sources) */
	uint64_t accepted;      /* of them, accepted */
	uint64_t model_drafted; /* of drafted, the draft model's */
	uint64_t model_accepted;
};

/* Sets s up for a request that allows drafts of at most k_max tokens (0: never). */
void spec_seq_init(struct spec_seq *s, uint32_t k_max);

/* Prompt lookup over tokens[0..n): finds the most recent earlier occurrence of the last
 * g tokens (g from SPEC_NGRAM_MAX down to SPEC_NGRAM_MIN, the first g that occurs wins)
 * and writes what followed it into draft, at most k_max tokens. A continuation that runs
 * into the end of the text goes on with the draft itself, so a repeating span of period p
 * drafts k tokens, not p. Returns the draft's length (0: no match). */
uint32_t spec_lookup(const int32_t *tokens, uint32_t n, int32_t *draft, uint32_t k_max);

/* The lookup's draft for sequence s now (at most limit tokens: what the step, the KV
 * reservation and max_tokens leave), written to draft; 0 when speculation is off, the
 * request drafts from the model only, or nothing matches. */
uint32_t spec_draft(struct spec_seq *s, const int32_t *tokens, uint32_t n, uint32_t limit,
		    int32_t *draft);

/* After a verifying step: n_draft tokens were drafted and the first n_accepted of them
 * accepted. The next draft grows after a fully accepted one and shrinks to one more than
 * was accepted otherwise, so a sequence whose drafts keep failing spends one extra row a
 * step, not k. */
void spec_seq_update(struct spec_seq *s, uint32_t n_draft, uint32_t n_accepted);

/* The same for a draft the draft model proposed: its own adaptive length (k_model) and
 * counters. */
void spec_seq_update_model(struct spec_seq *s, uint32_t n_draft, uint32_t n_accepted);

#endif
