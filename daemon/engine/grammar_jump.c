/* Jump-forward: when a grammar allows exactly one continuation string (a schema's fixed
 * property names, `": "`, closing brackets), its tokens are fed to the model without being
 * sampled. This file decides which tokens: the forced bytes, tokenized, cut where the
 * tokenization no longer depends on what the model writes after them. */
#include <string.h>

#include "daemon/engine/grammar.h"

/* Bytes to try after the forced ones, in order: one of each kind a BPE pre-tokenizer
 * treats differently (letters, digits, spaces, newlines), then punctuation one by one,
 * since merges such as `":` or `",` are per character. */
static size_t pick_probes(const uint64_t next[4], uint8_t probes[GRAMMAR_JUMP_PROBES])
{
	static const uint8_t kinds[] = { 'a', 'A', '0', ' ', '\n', '\t' };
	size_t n = 0;
	for (size_t i = 0; i < sizeof kinds && n < GRAMMAR_JUMP_PROBES; i++) {
		/* the first byte of the set in the same kind stands for all of it */
		for (unsigned b = 0; b < 128; b++) {
			bool same = kinds[i] == 'a' ? (b >= 'a' && b <= 'z')
				  : kinds[i] == 'A' ? (b >= 'A' && b <= 'Z')
				  : kinds[i] == '0' ? (b >= '0' && b <= '9')
				  : b == kinds[i];
			if (same && (next[b >> 6] >> (b & 63) & 1)) {
				probes[n++] = (uint8_t)b;
				break;
			}
		}
	}
	for (unsigned b = 0x21; b < 0x7f && n < GRAMMAR_JUMP_PROBES; b++) {
		bool alnum = (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9');
		if (!alnum && (next[b >> 6] >> (b & 63) & 1))
			probes[n++] = (uint8_t)b;
	}
	/* A lone lead byte would read as U+FFFD and probe nothing real; a set of only
	 * non-ASCII bytes is probed with "é" when its lead byte is allowed. */
	if (n == 0 && (next[0xc3 >> 6] >> (0xc3 & 63) & 1))
		probes[n++] = 0xc3;
	return n;
}

int grammar_jump_tokens(struct grammar_matcher *m, const struct tok *t, int32_t *ids, size_t max_ids,
			size_t *n_ids, struct hearth_error *err)
{
	*n_ids = 0;
	if (max_ids == 0)
		return 0;
	char forced[GRAMMAR_JUMP_MAX_BYTES + 2];
	uint64_t next[4];
	bool can_end;
	size_t nf = grammar_matcher_forced_next(m, forced, GRAMMAR_JUMP_MAX_BYTES, next, &can_end);
	if (nf == 0)
		return 0;
	/* One id per byte at most, plus a SentencePiece space prefix. */
	enum { CAP = GRAMMAR_JUMP_MAX_BYTES + 8 };
	int32_t base[CAP], probe[CAP];
	size_t n_base, n_probe;
	int rc = tok_encode(t, forced, nf, false, false, base, CAP, &n_base, err);
	if (rc < 0)
		return rc;
	/* The stable prefix: tokens every probed continuation's tokenization starts with. The
	 * end of the grammar is a continuation too, and the forced bytes alone stand for it. */
	size_t keep = n_base;
	uint8_t probes[GRAMMAR_JUMP_PROBES];
	size_t n_probes = pick_probes(next, probes);
	if (!can_end && n_probes == 0)
		keep = n_base ? n_base - 1 : 0; /* nothing to probe with: keep the last back */
	for (size_t i = 0; i < n_probes && keep > 0; i++) {
		size_t len = nf;
		forced[len++] = (char)probes[i];
		if (probes[i] == 0xc3)
			forced[len++] = (char)0xa9;
		rc = tok_encode(t, forced, len, false, false, probe, CAP, &n_probe, err);
		if (rc < 0)
			return rc;
		size_t k = 0;
		while (k < keep && k < n_probe && probe[k] == base[k])
			k++;
		keep = k;
	}
	/* The tokens taken must spell the forced bytes themselves (a SentencePiece space
	 * prefix, for one, does not). */
	const struct grammar_vocab *v = grammar_matcher_vocab(m);
	size_t off = 0, n = 0;
	for (; n < keep && n < max_ids; n++) {
		uint32_t len;
		const uint8_t *b = grammar_vocab_bytes(v, base[n], &len);
		if (!b || len == 0 || off + len > nf || memcmp(b, forced + off, len) != 0)
			break;
		off += len;
	}
	for (size_t i = 0; i < n; i++) {
		rc = grammar_matcher_accept_token(m, base[i], err);
		if (rc < 0) {
			/* cannot happen for bytes the grammar forced; undo rather than half-jump */
			struct hearth_error ignored;
			grammar_matcher_rollback(m, i, &ignored);
			return rc;
		}
		ids[i] = base[i];
	}
	*n_ids = n;
	return 0;
}
