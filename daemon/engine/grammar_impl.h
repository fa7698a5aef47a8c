/* Internals shared by the grammar engine's files (grammar_parse.c: GBNF text to rule trees;
 * grammar.c: trees to the byte automaton and its stack-set states; grammar_mask.c: token
 * masks). Not a public header: the engine's users include grammar.h. */
#ifndef HEARTH_DAEMON_GRAMMAR_IMPL_H
#define HEARTH_DAEMON_GRAMMAR_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/engine/grammar.h"

/* ---- rule trees, as parsed (grammar_parse.c) ---- */
enum gast_kind {
	GAST_ALT,   /* kids: alternatives */
	GAST_SEQ,   /* kids: in order */
	GAST_BYTES, /* a literal's UTF-8 bytes (possibly empty) */
	GAST_CLASS, /* code point ranges, already negated and normalised; '.' is a class */
	GAST_REF,   /* another rule */
	GAST_REP,   /* kids[0] repeated min..max times (max GAST_INF: unbounded) */
};
#define GAST_INF UINT32_MAX

struct gast {
	enum gast_kind kind;
	uint32_t off; /* byte offset in the source, for line:column in errors */
	uint32_t n;   /* kids, bytes or range pairs */
	union {
		struct gast **kids;
		uint8_t *bytes;
		uint32_t *ranges; /* lo0, hi0, lo1, hi1, ... sorted, disjoint */
		uint32_t rule;
	} u;
	uint32_t min, max;
};

struct gparse_rule {
	char *name;
	uint32_t def_off; /* where the definition starts; UINT32_MAX when only referenced */
	uint32_t ref_off; /* first reference, for "undefined rule" */
	struct gast *body;
};

struct gparse {
	const char *src;
	size_t len;
	struct gparse_rule *rules;
	uint32_t n_rules, cap_rules;
	uint32_t *hash; /* open addressing over rule names: index + 1, 0 = empty */
	uint32_t hash_cap;
	/* every allocation of the trees, freed together */
	void **allocs;
	size_t n_allocs, cap_allocs;
};

int gparse_run(struct gparse *p, const char *src, size_t len, struct hearth_error *err);
void gparse_free(struct gparse *p);
/* "line:column" (1-based, columns in bytes) of an offset, into buf. */
void gparse_where(const char *src, size_t len, uint32_t off, char *buf, size_t cap);

/* ---- the automaton (grammar.c) ----
 * Every rule is a graph of nodes after epsilon elimination: TERM nodes consume one byte of
 * a 256-bit set, CALL nodes enter another rule (their successors are where the caller goes
 * on after the callee ends), and one END node per rule. A parse position is a stack of
 * nodes: a TERM on top, the CALL nodes to return through below it. */
enum gnode_kind { GN_TERM, GN_CALL, GN_END };

struct gnode {
	uint8_t kind;
	uint32_t arg;  /* TERM: byte set index; CALL: callee rule */
	uint32_t rule; /* the rule the node belongs to */
	uint32_t succ, n_succ; /* into grammar.succ */
};

struct grule {
	char *name;
	uint32_t def_off;
	uint32_t start, n_start; /* into grammar.succ */
	bool nullable, reachable;
	uint32_t callers, n_callers; /* into grammar.callers: CALL nodes that enter this rule */
};

struct grammar {
	struct gnode *nodes;
	uint32_t n_nodes;
	uint32_t *succ;
	size_t n_succ;
	struct grule *rules;
	uint32_t n_rules;
	uint32_t root;
	uint64_t (*sets)[4];
	uint32_t n_sets;
	uint32_t *callers;
};

static inline bool gset_has(const uint64_t *s, unsigned b)
{
	return (s[b >> 6] >> (b & 63)) & 1;
}

/* ---- stack-set states over a grammar, with memoised byte steps (a lazy DFA) ----
 * Frames are hash-consed (node, parent) pairs, so a stack is one frame id and equal stacks
 * are equal ids. Frame 0 is the empty stack below the root (a state holding it can end).
 * The per-position precomputation starts from "node over BOTTOM" (an unknown caller): when
 * that rule ends, the state records frame 1 (the token fits here whatever the caller) and
 * goes on in every place the rule is called from, over CTX; frames over CTX stand for
 * "some caller", so tokens that need them are only possible, and tokens no context accepts
 * are rejected. A state is an interned sorted set of frame ids; state 0 is dead (empty). */
#define GFRAME_ROOT 0u
#define GFRAME_BOTTOM 1u
#define GFRAME_CTX 2u
#define GSTATE_DEAD 0u

struct gpool {
	const struct grammar *g;
	uint32_t *f_node, *f_parent;
	uint32_t n_frames, cap_frames;
	uint32_t *f_hash; /* id + 1 */
	uint32_t f_hash_cap;
	uint32_t *f_stamp, *f_rstamp; /* entered / returned through, this closure */
	uint8_t *f_ctx;               /* the frame stands over CTX */
	uint32_t stamp;
	/* states */
	uint32_t *s_off, *s_len;
	uint8_t *s_local; /* some stack of the state never left the start rule (or left it
			   * on the last byte) */
	uint32_t n_states, cap_states;
	uint32_t *s_data;
	size_t n_data, cap_data;
	uint32_t *s_hash;
	uint32_t s_hash_cap;
	/* memo: (state << 8 | byte) -> next state, direct mapped */
	uint64_t *memo_key;
	uint32_t *memo_val;
	uint32_t memo_mask;
	/* scratch */
	uint32_t *work, *out;
	size_t cap_work, cap_out;
	uint32_t max_frames;
	int err; /* sticky: HEARTH_ERANGE when a bound below was hit */
};

#define GPOOL_MAX_STACKS 2048 /* stacks in one state: beyond this a grammar is too ambiguous */

int gpool_init(struct gpool *p, const struct grammar *g, uint32_t memo_log2, uint32_t max_frames);
void gpool_free(struct gpool *p);
/* The state {stacks of start(root)}; or, for bottom, the single stack "node over BOTTOM". */
uint32_t gpool_start(struct gpool *p);
uint32_t gpool_single(struct gpool *p, uint32_t term_node);
uint32_t gpool_step_slow(struct gpool *p, uint32_t state, uint8_t byte);

static inline uint32_t gpool_memo_slot(const struct gpool *p, uint64_t key)
{
	key *= 0x9e3779b97f4a7c15ull;
	return (uint32_t)(key >> 32) & p->memo_mask;
}

/* One byte from a state: a memo hit costs a multiply and a compare (the mask paths call
 * this for every trie node they visit). */
static inline uint32_t gpool_step(struct gpool *p, uint32_t state, uint8_t byte)
{
	uint64_t key = (uint64_t)state << 8 | byte;
	uint32_t slot = gpool_memo_slot(p, key);
	if (p->memo_key[slot] == key)
		return p->memo_val[slot];
	return gpool_step_slow(p, state, byte);
}
static inline const uint32_t *gpool_frames(const struct gpool *p, uint32_t state, uint32_t *n)
{
	*n = p->s_len[state];
	return p->s_data + p->s_off[state];
}
static inline bool gpool_can_end(const struct gpool *p, uint32_t state)
{
	return p->s_len[state] && p->s_data[p->s_off[state]] == GFRAME_ROOT;
}
static inline bool gpool_local(const struct gpool *p, uint32_t state)
{
	return p->s_local[state];
}

#endif
