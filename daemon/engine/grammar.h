/* Constrained decoding: GBNF grammars (llama.cpp's syntax) compiled to a byte-level pushdown
 * automaton, token masks over a vocabulary (context-independent tokens precomputed per
 * automaton position, the rest checked at run time), and a matcher per sequence. */
#ifndef HEARTH_DAEMON_GRAMMAR_H
#define HEARTH_DAEMON_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/engine/tokenizer.h"
#include "protocol/error.h"

/* Bounds a grammar must fit (errors name the one exceeded). */
#define GRAMMAR_MAX_SOURCE (1u << 20)   /* bytes of GBNF text */
#define GRAMMAR_MAX_RULES 8192
#define GRAMMAR_MAX_DEPTH 128           /* nesting of parentheses */
#define GRAMMAR_MAX_REPEAT 100000       /* m and n of {m,n} */
#define GRAMMAR_MAX_NODES (1u << 19)    /* automaton nodes, after repetitions are expanded */
#define GRAMMAR_MAX_EDGES (1u << 23)    /* successor entries, after epsilons are removed */
#define GRAMMAR_INDEX_STEPS 50000000ull /* trie steps of the mask precomputation (~1 s) */
#define GRAMMAR_INDEX_STEPS_TEXT "50000000"

/* A compiled grammar: immutable, shareable between threads. */
struct grammar;

/* Parses GBNF and compiles it. Refuses (HEARTH_EFORMAT for syntax, HEARTH_EINVAL for
 * meaning, HEARTH_ERANGE for size) with a message naming the rule and line:column:
 * undefined rules, left recursion, rules that match no string, missing root, repetitions
 * or sizes beyond the bounds above. */
int grammar_compile(struct grammar **out, const char *text, size_t len, struct hearth_error *err);
void grammar_free(struct grammar *g);

/* Whole-string check in accept mode (no vocabulary): does the grammar generate these bytes? */
bool grammar_accepts(const struct grammar *g, const char *s, size_t len);

/* A token trie over a vocabulary's decoded bytes; built once per tokenizer, immutable. */
struct grammar_vocab;
int grammar_vocab_new(struct grammar_vocab **out, const struct tok *t, struct hearth_error *err);
/* The same from raw pieces (token id -> bytes); eog lists the end-of-generation ids. */
int grammar_vocab_new_pieces(struct grammar_vocab **out, const char *const *pieces, const size_t *lens,
			     int32_t n, const int32_t *eog, size_t n_eog, struct hearth_error *err);
void grammar_vocab_free(struct grammar_vocab *v);
int32_t grammar_vocab_n(const struct grammar_vocab *v);

/* A grammar bound to a vocabulary with its precomputed per-position token sets: immutable
 * and shareable between threads once built (matchers only read it). Refcounted so a cache
 * and the requests using an entry can each hold it. */
struct grammar_index;
int grammar_index_new(struct grammar_index **out, struct grammar *g, const struct grammar_vocab *v,
		      struct hearth_error *err); /* takes ownership of g, even on failure */
struct grammar_index *grammar_index_ref(struct grammar_index *ix);
void grammar_index_unref(struct grammar_index *ix);
const struct grammar *grammar_index_grammar(const struct grammar_index *ix);

/* What a request constrains with; the cache key is (kind, text). */
enum grammar_kind {
	GRAMMAR_GBNF,        /* text is GBNF */
	GRAMMAR_JSON_SCHEMA, /* text is a JSON Schema document */
	GRAMMAR_JSON_OBJECT, /* any JSON object; text is ignored */
};

/* Compiled grammars with their indexes, keyed by (kind, text), for one vocabulary; the
 * least recently used entry goes when capacity is reached. Thread-safe (one mutex, taken
 * only when a request starts, never on the per-token path). */
struct grammar_cache;
int grammar_cache_new(struct grammar_cache **out, const struct grammar_vocab *v, size_t capacity,
		      struct hearth_error *err);
void grammar_cache_free(struct grammar_cache *c);
/* Returns a reference the caller releases with grammar_index_unref. */
int grammar_cache_get(struct grammar_cache *c, enum grammar_kind kind, const char *text, size_t len,
		      struct grammar_index **out, struct hearth_error *err);

/* One sequence's position in the grammar. Not thread-safe; one per sequence. */
struct grammar_matcher;
int grammar_matcher_new(struct grammar_matcher **out, struct grammar_index *ix,
			struct hearth_error *err); /* holds a reference to ix */
void grammar_matcher_free(struct grammar_matcher *m);
/* Back to the start for a new sequence with the same grammar, keeping what the matcher has
 * learnt (memoised steps, masks of recent states): a warm matcher's first masks are cheap. */
int grammar_matcher_reset(struct grammar_matcher *m, struct hearth_error *err);

/* Bit i of bits (n_vocab bits, (n_vocab + 31) / 32 words) is set when token i may come
 * next: its bytes continue the grammar, or it ends generation (EOS, EOT...) and the grammar
 * can end here. Tokens with no bytes that do not end generation are never allowed. */
int grammar_matcher_fill_mask(struct grammar_matcher *m, uint32_t *bits, struct hearth_error *err);
/* Advances over a token; HEARTH_EINVAL (state unchanged) when the mask would not allow it.
 * An end-of-generation token marks the matcher done. */
int grammar_matcher_accept_token(struct grammar_matcher *m, int32_t id, struct hearth_error *err);
/* Advances over raw bytes (forced bytes after jump-forward, for example); counts as one
 * step for rollback. HEARTH_EINVAL, state unchanged, when they do not continue the grammar. */
int grammar_matcher_accept_bytes(struct grammar_matcher *m, const char *s, size_t len,
				 struct hearth_error *err);
/* The grammar may end here (an EOS token is allowed). */
bool grammar_matcher_can_end(const struct grammar_matcher *m);
/* An end-of-generation token was accepted, or the grammar can end and nothing may follow. */
bool grammar_matcher_is_done(const struct grammar_matcher *m);
/* The longest byte string every continuation starts with (jump-forward); at most cap bytes
 * are written, the length is returned. 0 when the next byte is not determined. */
size_t grammar_matcher_forced_bytes(struct grammar_matcher *m, char *buf, size_t cap);
/* The same, and what may follow them: next holds the 256-bit set of bytes allowed after
 * the forced ones, *can_end whether the grammar may end there instead. */
size_t grammar_matcher_forced_next(struct grammar_matcher *m, char *buf, size_t cap, uint64_t next[4],
				   bool *can_end);
/* The vocabulary the matcher's masks are over, and a token's bytes in it (NULL, 0 for an id
 * out of range; 0 bytes for end-of-generation and empty tokens). */
const struct grammar_vocab *grammar_matcher_vocab(const struct grammar_matcher *m);
const uint8_t *grammar_vocab_bytes(const struct grammar_vocab *v, int32_t id, uint32_t *len);

/* Jump-forward (grammar_jump.c): when the grammar allows exactly one continuation string,
 * its tokens are fed without sampling. The forced bytes are tokenized with t (the
 * vocabulary the matcher was built from) and cut where that tokenization is stable: only
 * the leading tokens that the tokenizations of the forced bytes alone and of the forced
 * bytes followed by each probed next byte agree on, and whose bytes are exactly the forced
 * ones, are taken (the rest is left to the model, which may merge it with what it writes
 * next). At most max_ids ids are written to ids; the matcher accepts each of them, one
 * history step per token. *n_ids 0: nothing forced, or no stable token. */
#define GRAMMAR_JUMP_MAX_BYTES 256
#define GRAMMAR_JUMP_PROBES 8
int grammar_jump_tokens(struct grammar_matcher *m, const struct tok *t, int32_t *ids, size_t max_ids,
			size_t *n_ids, struct hearth_error *err);
/* Undoes the last n accept steps (tokens or byte strings); HEARTH_ERANGE if fewer exist. */
int grammar_matcher_rollback(struct grammar_matcher *m, size_t n, struct hearth_error *err);
size_t grammar_matcher_history(const struct grammar_matcher *m);

/* Sets logits of tokens whose bit is clear to -INFINITY (the sampler's pre-step). */
void grammar_mask_apply(float *logits, const uint32_t *bits, int32_t n_vocab);

/* The GBNF of "any JSON object" (json_object mode), NUL-terminated, static. */
const char *grammar_json_object_gbnf(void);

#endif
