/* Token masks: a trie over the vocabulary's bytes, per automaton position the tokens that
 * are allowed whatever the stack below (precomputed) and those that depend on it (checked
 * at run time against the real stacks), the per-sequence matcher, and the grammar cache. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <jansson.h>

#include "daemon/engine/grammar_impl.h"
#include "daemon/engine/json_schema.h"

/* ---- vocabulary trie ---- */
struct grammar_vocab {
	int32_t n_vocab;
	uint8_t *bytes;
	uint32_t *tok_off, *tok_len; /* per id */
	int32_t *sorted;             /* ids with bytes, by bytes */
	uint32_t n_sorted;
	/* trie nodes in preorder: byte, depth (1 = first byte), end of subtree, tokens
	 * ending here (a run of sorted[]) */
	uint32_t n_nodes;
	uint8_t *t_byte;
	uint16_t *t_depth;
	uint32_t *t_end, *t_tok, *t_ntok;
	uint32_t max_len;
	int32_t *eog;
	uint32_t n_eog;
};

static int cmp_tok(const void *a, const void *b, void *ctx)
{
	const struct grammar_vocab *v = ctx;
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	uint32_t lx = v->tok_len[x], ly = v->tok_len[y];
	int c = memcmp(v->bytes + v->tok_off[x], v->bytes + v->tok_off[y], lx < ly ? lx : ly);
	if (c)
		return c;
	if (lx != ly)
		return lx < ly ? -1 : 1;
	return x < y ? -1 : x > y;
}

void grammar_vocab_free(struct grammar_vocab *v)
{
	if (!v)
		return;
	free(v->bytes);
	free(v->tok_off);
	free(v->tok_len);
	free(v->sorted);
	free(v->t_byte);
	free(v->t_depth);
	free(v->t_end);
	free(v->t_tok);
	free(v->t_ntok);
	free(v->eog);
	free(v);
}

int32_t grammar_vocab_n(const struct grammar_vocab *v)
{
	return v->n_vocab;
}

int grammar_vocab_new_pieces(struct grammar_vocab **out, const char *const *pieces, const size_t *lens,
			     int32_t n, const int32_t *eog, size_t n_eog, struct hearth_error *err)
{
	*out = NULL;
	struct grammar_vocab *v = calloc(1, sizeof *v);
	if (!v || n <= 0)
		goto oom;
	v->n_vocab = n;
	v->tok_off = calloc((size_t)n, sizeof *v->tok_off);
	v->tok_len = calloc((size_t)n, sizeof *v->tok_len);
	v->sorted = malloc((size_t)n * sizeof *v->sorted);
	v->eog = malloc((n_eog ? n_eog : 1) * sizeof *v->eog);
	if (!v->tok_off || !v->tok_len || !v->sorted || !v->eog)
		goto oom;
	for (size_t k = 0; k < n_eog; k++)
		if (eog[k] >= 0 && eog[k] < n)
			v->eog[v->n_eog++] = eog[k];
	size_t total = 0;
	for (int32_t id = 0; id < n; id++)
		if (lens[id] <= 0xffff)
			total += lens[id];
	v->bytes = malloc(total + 1);
	if (!v->bytes)
		goto oom;
	total = 0;
	for (int32_t id = 0; id < n; id++) {
		size_t len = lens[id];
		bool end_token = false;
		for (uint32_t k = 0; k < v->n_eog && !end_token; k++)
			end_token = v->eog[k] == id;
		/* pieces longer than 64 KiB do not occur; the bound keeps depths in 16 bits */
		if (len == 0 || len > 0xffff || end_token)
			continue;
		memcpy(v->bytes + total, pieces[id], len);
		v->tok_off[id] = (uint32_t)total;
		v->tok_len[id] = (uint32_t)len;
		total += len;
		v->sorted[v->n_sorted++] = id;
		if (len > v->max_len)
			v->max_len = (uint32_t)len;
	}
	qsort_r(v->sorted, v->n_sorted, sizeof *v->sorted, cmp_tok, v);
	/* nodes: at most one per byte of every token */
	size_t ncap = total + 1;
	v->t_byte = malloc(ncap);
	v->t_depth = malloc(ncap * sizeof *v->t_depth);
	v->t_end = malloc(ncap * sizeof *v->t_end);
	v->t_tok = malloc(ncap * sizeof *v->t_tok);
	v->t_ntok = calloc(ncap, sizeof *v->t_ntok);
	uint32_t *open = malloc(((size_t)v->max_len + 1) * sizeof *open);
	if (!v->t_byte || !v->t_depth || !v->t_end || !v->t_tok || !v->t_ntok || !open) {
		free(open);
		goto oom;
	}
	uint32_t depth_open = 0, nn = 0;
	const uint8_t *prev = NULL;
	uint32_t prev_len = 0;
	for (uint32_t i = 0; i < v->n_sorted; i++) {
		int32_t id = v->sorted[i];
		const uint8_t *b = v->bytes + v->tok_off[id];
		uint32_t len = v->tok_len[id], l = 0;
		while (prev && l < len && l < prev_len && b[l] == prev[l])
			l++;
		/* close open nodes deeper than the shared prefix */
		while (depth_open > l) {
			v->t_end[open[depth_open - 1]] = nn;
			depth_open--;
		}
		for (uint32_t k = l; k < len; k++) {
			v->t_byte[nn] = b[k];
			v->t_depth[nn] = (uint16_t)(k + 1);
			v->t_ntok[nn] = 0;
			open[depth_open++] = nn;
			nn++;
		}
		uint32_t node = open[len - 1];
		if (!v->t_ntok[node])
			v->t_tok[node] = i;
		v->t_ntok[node]++;
		prev = b;
		prev_len = len;
	}
	while (depth_open) {
		v->t_end[open[depth_open - 1]] = nn;
		depth_open--;
	}
	v->n_nodes = nn;
	free(open);
	*out = v;
	return 0;
oom:
	grammar_vocab_free(v);
	return hearth_error_set(err, HEARTH_ENOMEM, "grammar: out of memory building the token trie");
}

int grammar_vocab_new(struct grammar_vocab **out, const struct tok *t, struct hearth_error *err)
{
	*out = NULL;
	int32_t n = tok_n_vocab(t);
	size_t pmax = tok_piece_max(t);
	if (n <= 0)
		return hearth_error_set(err, HEARTH_EINVAL, "grammar: empty vocabulary");
	char *bytes = NULL, **pieces = malloc((size_t)n * sizeof *pieces);
	size_t *lens = malloc((size_t)n * sizeof *lens), total = 0;
	int32_t *eog = malloc((size_t)n * sizeof *eog);
	size_t n_eog = 0;
	int rc = HEARTH_ENOMEM;
	if (!pieces || !lens || !eog)
		goto out;
	for (int32_t id = 0; id < n; id++)
		total += tok_piece(t, id, false, NULL, 0);
	bytes = malloc(total + pmax + 1);
	if (!bytes)
		goto out;
	total = 0;
	for (int32_t id = 0; id < n; id++) {
		size_t len = tok_piece(t, id, false, bytes + total, pmax + 1);
		if (len > pmax)
			len = 0;
		pieces[id] = bytes + total;
		lens[id] = len;
		total += len;
		if (tok_is_eog(t, id))
			eog[n_eog++] = id;
	}
	rc = grammar_vocab_new_pieces(out, (const char *const *)pieces, lens, n, eog, n_eog, err);
out:
	if (rc == HEARTH_ENOMEM && !*out)
		hearth_error_set(err, rc, "grammar: out of memory building the token trie");
	free(bytes);
	free(pieces);
	free(lens);
	free(eog);
	return rc;
}

/* ---- per-position token sets ---- */
struct gpos {
	uint32_t *acc; /* ids, or a bitmap when acc_bitmap */
	uint32_t n_acc;
	bool acc_bitmap, done;
	int32_t *unc; /* ids in byte order */
	uint32_t n_unc;
};

struct grammar_index {
	atomic_int refs;
	struct grammar *g;
	const struct grammar_vocab *v;
	struct gpos *pos; /* per node; filled for TERM nodes of reachable rules */
	uint32_t words;
};

const struct grammar *grammar_index_grammar(const struct grammar_index *ix)
{
	return ix->g;
}

struct ivec {
	uint32_t *v;
	size_t n, cap;
};

static bool ivec_push(struct ivec *a, uint32_t x)
{
	if (a->n == a->cap) {
		size_t cap = a->cap ? a->cap * 2 : 256;
		uint32_t *g = realloc(a->v, cap * sizeof *g);
		if (!g)
			return false;
		a->v = g;
		a->cap = cap;
	}
	a->v[a->n++] = x;
	return true;
}

static bool ivec_tokens(struct ivec *a, const struct grammar_vocab *v, uint32_t node)
{
	for (uint32_t k = 0; k < v->t_ntok[node]; k++)
		if (!ivec_push(a, (uint32_t)v->sorted[v->t_tok[node] + k]))
			return false;
	return true;
}

/* Walks the trie from "node P over an unknown caller": a token is accepted when some path
 * consumes all its bytes without leaving P's rule (leaving it on the last byte is fine),
 * uncertain when only paths through some caller's continuation consume it, and rejected
 * when no path does (then nothing below it in the trie is possible either). */
static int precompute_pos(struct grammar_index *ix, struct gpool *pool, uint32_t P, uint32_t *st,
			  struct ivec *acc, struct ivec *unc, uint64_t *budget)
{
	const struct grammar_vocab *v = ix->v;
	acc->n = unc->n = 0;
	st[0] = gpool_single(pool, P);
	uint32_t i = 0;
	while (i < v->n_nodes) {
		if ((*budget)-- == 0)
			return HEARTH_ERANGE;
		uint32_t d = v->t_depth[i];
		uint32_t nx = gpool_step(pool, st[d - 1], v->t_byte[i]);
		if (pool->err)
			return pool->err;
		if (nx == GSTATE_DEAD) {
			i = v->t_end[i];
			continue;
		}
		if (!ivec_tokens(gpool_local(pool, nx) ? acc : unc, v, i))
			return HEARTH_ENOMEM;
		st[d] = nx;
		i++;
	}
	return 0;
}

static void index_free(struct grammar_index *ix)
{
	if (!ix)
		return;
	if (ix->pos)
		for (uint32_t n = 0; n < ix->g->n_nodes; n++) {
			free(ix->pos[n].acc);
			free(ix->pos[n].unc);
		}
	free(ix->pos);
	grammar_free(ix->g);
	free(ix);
}

int grammar_index_new(struct grammar_index **out, struct grammar *g, const struct grammar_vocab *v,
		      struct hearth_error *err)
{
	*out = NULL;
	struct grammar_index *ix = calloc(1, sizeof *ix);
	if (!ix) {
		grammar_free(g);
		return hearth_error_set(err, HEARTH_ENOMEM, "grammar: out of memory");
	}
	atomic_init(&ix->refs, 1);
	ix->g = g;
	ix->v = v;
	ix->words = ((uint32_t)v->n_vocab + 31) / 32;
	ix->pos = calloc(g->n_nodes ? g->n_nodes : 1, sizeof *ix->pos);
	uint32_t *st = malloc(((size_t)v->max_len + 2) * sizeof *st);
	struct ivec acc = { 0 }, unc = { 0 };
	struct gpool pool;
	uint64_t budget = GRAMMAR_INDEX_STEPS;
	int rc = gpool_init(&pool, g, 16, 1u << 22);
	if (rc || !ix->pos || !st) {
		rc = hearth_error_set(err, HEARTH_ENOMEM, "grammar: out of memory");
		goto out;
	}
	for (uint32_t n = 0; n < g->n_nodes; n++) {
		const struct gnode *d = &g->nodes[n];
		if (d->kind != GN_TERM || !g->rules[d->rule].reachable)
			continue;
		rc = precompute_pos(ix, &pool, n, st, &acc, &unc, &budget);
		if (rc) {
			rc = hearth_error_set(err, rc, "grammar: precomputing token sets: %s",
					      rc == HEARTH_ERANGE ? (budget == UINT64_MAX
						      ? "more than " GRAMMAR_INDEX_STEPS_TEXT " trie steps (grammar too large for masks)"
						      : "too many parallel parses (ambiguous grammar)")
								  : "out of memory");
			goto out;
		}
		struct gpos *p = &ix->pos[n];
		p->done = true;
		p->n_acc = (uint32_t)acc.n;
		if (acc.n > ix->words) {
			p->acc_bitmap = true;
			p->acc = calloc(ix->words, sizeof *p->acc);
			if (!p->acc)
				goto oom;
			for (size_t k = 0; k < acc.n; k++)
				p->acc[acc.v[k] >> 5] |= 1u << (acc.v[k] & 31);
		} else if (acc.n) {
			p->acc = malloc(acc.n * sizeof *p->acc);
			if (!p->acc)
				goto oom;
			memcpy(p->acc, acc.v, acc.n * sizeof *p->acc);
		}
		if (unc.n) {
			p->unc = malloc(unc.n * sizeof *p->unc);
			if (!p->unc)
				goto oom;
			memcpy(p->unc, unc.v, unc.n * sizeof *p->unc);
			p->n_unc = (uint32_t)unc.n;
		}
		/* the pool's memo and states serve the next position too; only a runaway size
		 * is worth a reset */
		if (pool.n_frames > (1u << 21) || pool.n_data > (1u << 24)) {
			gpool_free(&pool);
			if (gpool_init(&pool, g, 16, 1u << 22))
				goto oom;
		}
	}
	*out = ix;
	ix = NULL;
	rc = 0;
	goto out;
oom:
	rc = hearth_error_set(err, HEARTH_ENOMEM, "grammar: out of memory");
out:
	gpool_free(&pool);
	free(st);
	free(acc.v);
	free(unc.v);
	if (ix) {
		index_free(ix);
	}
	return rc;
}

struct grammar_index *grammar_index_ref(struct grammar_index *ix)
{
	atomic_fetch_add(&ix->refs, 1);
	return ix;
}

void grammar_index_unref(struct grammar_index *ix)
{
	if (ix && atomic_fetch_sub(&ix->refs, 1) == 1)
		index_free(ix);
}

/* ---- matcher ---- */
#define MATCHER_DONE 0x80000000u
#define MASK_CACHE 8

struct grammar_matcher {
	struct grammar_index *ix;
	struct gpool pool;
	uint32_t *hist; /* states; MATCHER_DONE marks an accepted end-of-generation token */
	size_t n_hist, cap_hist;
	uint32_t *walk; /* states along a token's bytes */
	uint32_t cache_state[MASK_CACHE];
	uint32_t *cache_bits;
	uint32_t *seen;
};

void grammar_matcher_free(struct grammar_matcher *m)
{
	if (!m)
		return;
	gpool_free(&m->pool);
	free(m->hist);
	free(m->walk);
	free(m->cache_bits);
	free(m->seen);
	grammar_index_unref(m->ix);
	free(m);
}

int grammar_matcher_new(struct grammar_matcher **out, struct grammar_index *ix, struct hearth_error *err)
{
	*out = NULL;
	struct grammar_matcher *m = calloc(1, sizeof *m);
	if (!m)
		return hearth_error_set(err, HEARTH_ENOMEM, "grammar: out of memory");
	m->ix = grammar_index_ref(ix);
	m->cap_hist = 64;
	m->hist = malloc(m->cap_hist * sizeof *m->hist);
	m->walk = malloc(((size_t)ix->v->max_len + 2) * sizeof *m->walk);
	m->cache_bits = malloc((size_t)MASK_CACHE * ix->words * sizeof *m->cache_bits);
	m->seen = malloc(((size_t)GPOOL_MAX_STACKS + 2) * sizeof *m->seen);
	if (!m->hist || !m->walk || !m->cache_bits || !m->seen || gpool_init(&m->pool, ix->g, 16, 1u << 22)) {
		grammar_matcher_free(m);
		return hearth_error_set(err, HEARTH_ENOMEM, "grammar: out of memory");
	}
	for (int i = 0; i < MASK_CACHE; i++)
		m->cache_state[i] = UINT32_MAX;
	uint32_t s = gpool_start(&m->pool);
	if (m->pool.err || s == GSTATE_DEAD) {
		grammar_matcher_free(m);
		return hearth_error_set(err, HEARTH_ERANGE, "grammar: the start state cannot be built");
	}
	m->hist[0] = s;
	m->n_hist = 1;
	*out = m;
	return 0;
}

int grammar_matcher_reset(struct grammar_matcher *m, struct hearth_error *err)
{
	/* the pool's states and memo are what make a warm matcher fast; only a pool grown
	 * large is started afresh */
	if (m->pool.n_frames > (1u << 20) || m->pool.n_data > (1u << 24)) {
		gpool_free(&m->pool);
		for (int i = 0; i < MASK_CACHE; i++)
			m->cache_state[i] = UINT32_MAX;
		if (gpool_init(&m->pool, m->ix->g, 16, 1u << 22))
			return hearth_error_set(err, HEARTH_ENOMEM, "grammar: out of memory");
		uint32_t s = gpool_start(&m->pool);
		if (m->pool.err || s == GSTATE_DEAD)
			return hearth_error_set(err, HEARTH_ERANGE, "grammar: the start state cannot be built");
		m->hist[0] = s;
	}
	m->n_hist = 1;
	return 0;
}

static uint32_t cur_state(const struct grammar_matcher *m)
{
	return m->hist[m->n_hist - 1] & ~MATCHER_DONE;
}

static int pool_error(struct grammar_matcher *m, struct hearth_error *err)
{
	return hearth_error_set(err, m->pool.err,
				"grammar: %s", m->pool.err == HEARTH_ERANGE
				? "parse state beyond its bounds (too many parallel parses or frames)"
				: "out of memory");
}

/* Checks a position's uncertain tokens against the real state, sharing work between
 * tokens with a common prefix (the list is in byte order). */
static void check_uncertain(struct grammar_matcher *m, uint32_t state, const struct gpos *p, uint32_t *bits)
{
	const struct grammar_vocab *v = m->ix->v;
	uint32_t valid = 0;
	const uint8_t *prev = NULL;
	uint32_t prev_len = 0;
	m->walk[0] = state;
	for (uint32_t i = 0; i < p->n_unc; i++) {
		int32_t id = p->unc[i];
		if (bits[id >> 5] >> (id & 31) & 1)
			continue;
		const uint8_t *b = v->bytes + v->tok_off[id];
		uint32_t len = v->tok_len[id], k = 0;
		uint32_t lim = valid < len ? valid : len;
		if (prev)
			while (k < lim && k < prev_len && b[k] == prev[k])
				k++;
		while (k < len) {
			m->walk[k + 1] = gpool_step(&m->pool, m->walk[k], b[k]);
			k++;
			if (m->walk[k] == GSTATE_DEAD)
				break;
		}
		valid = k;
		prev = b;
		prev_len = len;
		if (k == len && m->walk[len] != GSTATE_DEAD)
			bits[id >> 5] |= 1u << (id & 31);
	}
}

int grammar_matcher_fill_mask(struct grammar_matcher *m, uint32_t *bits, struct hearth_error *err)
{
	const struct grammar_index *ix = m->ix;
	uint32_t words = ix->words;
	if (m->hist[m->n_hist - 1] & MATCHER_DONE) {
		memset(bits, 0, words * sizeof *bits);
		return 0;
	}
	uint32_t state = cur_state(m);
	uint32_t slot = state % MASK_CACHE;
	if (m->cache_state[slot] == state) {
		memcpy(bits, m->cache_bits + (size_t)slot * words, words * sizeof *bits);
		return 0;
	}
	memset(bits, 0, words * sizeof *bits);
	uint32_t n;
	const uint32_t *fr = gpool_frames(&m->pool, state, &n);
	uint32_t n_seen = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (fr[i] <= GFRAME_CTX)
			continue;
		uint32_t P = m->pool.f_node[fr[i]];
		bool dup = false;
		for (uint32_t k = 0; k < n_seen && !dup; k++)
			dup = m->seen[k] == P;
		if (dup)
			continue;
		m->seen[n_seen++] = P;
		const struct gpos *p = &ix->pos[P];
		if (p->acc_bitmap) {
			for (uint32_t w = 0; w < words; w++)
				bits[w] |= p->acc[w];
		} else {
			for (uint32_t k = 0; k < p->n_acc; k++)
				bits[p->acc[k] >> 5] |= 1u << (p->acc[k] & 31);
		}
	}
	for (uint32_t k = 0; k < n_seen; k++) {
		/* the state's frames may move as the walk interns states: only P is kept */
		check_uncertain(m, state, &ix->pos[m->seen[k]], bits);
		if (m->pool.err)
			return pool_error(m, err);
	}
	if (gpool_can_end(&m->pool, state))
		for (uint32_t k = 0; k < ix->v->n_eog; k++)
			bits[ix->v->eog[k] >> 5] |= 1u << (ix->v->eog[k] & 31);
	m->cache_state[slot] = state;
	memcpy(m->cache_bits + (size_t)slot * words, bits, words * sizeof *bits);
	return 0;
}

static int hist_push(struct grammar_matcher *m, uint32_t s, struct hearth_error *err)
{
	if (m->n_hist == m->cap_hist) {
		size_t cap = m->cap_hist * 2;
		uint32_t *h = realloc(m->hist, cap * sizeof *h);
		if (!h)
			return hearth_error_set(err, HEARTH_ENOMEM, "grammar: out of memory");
		m->hist = h;
		m->cap_hist = cap;
	}
	m->hist[m->n_hist++] = s;
	return 0;
}

static bool is_eog(const struct grammar_vocab *v, int32_t id)
{
	for (uint32_t k = 0; k < v->n_eog; k++)
		if (v->eog[k] == id)
			return true;
	return false;
}

int grammar_matcher_accept_bytes(struct grammar_matcher *m, const char *s, size_t len,
				 struct hearth_error *err)
{
	if (m->hist[m->n_hist - 1] & MATCHER_DONE)
		return hearth_error_set(err, HEARTH_EINVAL, "grammar: bytes after the end of generation");
	uint32_t st = cur_state(m);
	for (size_t i = 0; i < len && st != GSTATE_DEAD; i++)
		st = gpool_step(&m->pool, st, (uint8_t)s[i]);
	if (m->pool.err)
		return pool_error(m, err);
	if (st == GSTATE_DEAD)
		return hearth_error_set(err, HEARTH_EINVAL, "grammar: %zu bytes do not continue the grammar", len);
	return hist_push(m, st, err);
}

int grammar_matcher_accept_token(struct grammar_matcher *m, int32_t id, struct hearth_error *err)
{
	const struct grammar_vocab *v = m->ix->v;
	if (id < 0 || id >= v->n_vocab)
		return hearth_error_set(err, HEARTH_EINVAL, "grammar: token %d outside the vocabulary", id);
	if (m->hist[m->n_hist - 1] & MATCHER_DONE)
		return hearth_error_set(err, HEARTH_EINVAL, "grammar: token %d after the end of generation", id);
	if (is_eog(v, id)) {
		if (!gpool_can_end(&m->pool, cur_state(m)))
			return hearth_error_set(err, HEARTH_EINVAL,
						"grammar: end-of-generation token %d before the grammar can end", id);
		return hist_push(m, cur_state(m) | MATCHER_DONE, err);
	}
	if (v->tok_len[id] == 0)
		return hearth_error_set(err, HEARTH_EINVAL, "grammar: token %d has no bytes", id);
	int rc = grammar_matcher_accept_bytes(m, (const char *)v->bytes + v->tok_off[id], v->tok_len[id], err);
	if (rc == HEARTH_EINVAL)
		return hearth_error_set(err, rc, "grammar: token %d does not continue the grammar", id);
	return rc;
}

bool grammar_matcher_can_end(const struct grammar_matcher *m)
{
	return !(m->hist[m->n_hist - 1] & MATCHER_DONE) && gpool_can_end(&m->pool, cur_state(m));
}

bool grammar_matcher_is_done(const struct grammar_matcher *m)
{
	if (m->hist[m->n_hist - 1] & MATCHER_DONE)
		return true;
	uint32_t n;
	gpool_frames(&m->pool, cur_state(m), &n);
	return n == 1 && gpool_can_end(&m->pool, cur_state(m));
}

size_t grammar_matcher_forced_next(struct grammar_matcher *m, char *buf, size_t cap, uint64_t next[4],
				   bool *can_end)
{
	next[0] = next[1] = next[2] = next[3] = 0;
	*can_end = false;
	if (m->hist[m->n_hist - 1] & MATCHER_DONE)
		return 0;
	const struct grammar *g = m->ix->g;
	uint32_t st = cur_state(m);
	size_t n = 0;
	while (st != GSTATE_DEAD) {
		uint64_t u[4] = { 0 };
		uint32_t k;
		const uint32_t *fr = gpool_frames(&m->pool, st, &k);
		for (uint32_t i = 0; i < k; i++)
			if (fr[i] > GFRAME_CTX)
				for (int w = 0; w < 4; w++)
					u[w] |= g->sets[g->nodes[m->pool.f_node[fr[i]]].arg][w];
		int count = 0, byte = -1;
		for (int w = 0; w < 4; w++) {
			count += __builtin_popcountll(u[w]);
			if (u[w] && byte < 0)
				byte = w * 64 + __builtin_ctzll(u[w]);
		}
		bool end = gpool_can_end(&m->pool, st);
		if (count != 1 || end || n == cap) {
			memcpy(next, u, sizeof u);
			*can_end = end;
			break;
		}
		buf[n++] = (char)byte;
		st = gpool_step(&m->pool, st, (uint8_t)byte);
	}
	return n;
}

size_t grammar_matcher_forced_bytes(struct grammar_matcher *m, char *buf, size_t cap)
{
	uint64_t next[4];
	bool end;
	return grammar_matcher_forced_next(m, buf, cap, next, &end);
}

const uint8_t *grammar_vocab_bytes(const struct grammar_vocab *v, int32_t id, uint32_t *len)
{
	if (id < 0 || id >= v->n_vocab) {
		*len = 0;
		return NULL;
	}
	*len = v->tok_len[id];
	return v->bytes + v->tok_off[id];
}

const struct grammar_vocab *grammar_matcher_vocab(const struct grammar_matcher *m)
{
	return m->ix->v;
}

int grammar_matcher_rollback(struct grammar_matcher *m, size_t n, struct hearth_error *err)
{
	if (n >= m->n_hist)
		return hearth_error_set(err, HEARTH_ERANGE, "grammar: rollback of %zu steps, only %zu taken",
					n, m->n_hist - 1);
	m->n_hist -= n;
	return 0;
}

size_t grammar_matcher_history(const struct grammar_matcher *m)
{
	return m->n_hist - 1;
}

void grammar_mask_apply(float *logits, const uint32_t *bits, int32_t n_vocab)
{
	for (int32_t w = 0; w * 32 < n_vocab; w++) {
		uint32_t b = bits[w];
		if (b == 0xffffffffu)
			continue;
		int32_t end = w * 32 + 32 < n_vocab ? w * 32 + 32 : n_vocab;
		if (b == 0) {
			/* the common case under a grammar: a whole word disallowed, a plain store loop */
			for (int32_t i = w * 32; i < end; i++)
				logits[i] = -INFINITY;
			continue;
		}
		for (int32_t i = w * 32; i < end; i++)
			if (!(b >> (i & 31) & 1))
				logits[i] = -INFINITY;
	}
}

/* ---- any JSON object ---- */
static const char json_object_gbnf[] =
	"root ::= object\n"
	"value ::= object | array | string | number | (\"true\" | \"false\" | \"null\") space\n"
	"object ::= \"{\" space ( string \":\" space value (\",\" space string \":\" space value)* )? \"}\" space\n"
	"array ::= \"[\" space ( value (\",\" space value)* )? \"]\" space\n"
	"string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" space\n"
	"number ::= \"-\"? ([0-9] | [1-9] [0-9]{1,15}) (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,4})? space\n"
	"space ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

const char *grammar_json_object_gbnf(void)
{
	return json_object_gbnf;
}

/* ---- cache ---- */
struct centry {
	enum grammar_kind kind;
	char *text;
	size_t len;
	struct grammar_index *ix;
	uint64_t used;
};

struct grammar_cache {
	pthread_mutex_t lock;
	const struct grammar_vocab *v;
	struct centry *e;
	size_t n, cap;
	uint64_t clock;
};

int grammar_cache_new(struct grammar_cache **out, const struct grammar_vocab *v, size_t capacity,
		      struct hearth_error *err)
{
	*out = NULL;
	struct grammar_cache *c = calloc(1, sizeof *c);
	if (!c || capacity == 0 || !(c->e = calloc(capacity, sizeof *c->e))) {
		free(c);
		return hearth_error_set(err, capacity ? HEARTH_ENOMEM : HEARTH_EINVAL,
					"grammar cache: %s", capacity ? "out of memory" : "capacity 0");
	}
	pthread_mutex_init(&c->lock, NULL);
	c->v = v;
	c->cap = capacity;
	*out = c;
	return 0;
}

void grammar_cache_free(struct grammar_cache *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->n; i++) {
		free(c->e[i].text);
		grammar_index_unref(c->e[i].ix);
	}
	free(c->e);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

static struct grammar_index *cache_find(struct grammar_cache *c, enum grammar_kind kind, const char *text,
					size_t len)
{
	for (size_t i = 0; i < c->n; i++) {
		struct centry *e = &c->e[i];
		if (e->kind == kind && e->len == len && memcmp(e->text, text, len) == 0) {
			e->used = ++c->clock;
			return grammar_index_ref(e->ix);
		}
	}
	return NULL;
}

static int build_source(enum grammar_kind kind, const char *text, size_t len, char **gbnf, size_t *glen,
			struct hearth_error *err)
{
	if (kind == GRAMMAR_GBNF) {
		*gbnf = NULL;
		*glen = len;
		return 0;
	}
	if (kind == GRAMMAR_JSON_OBJECT) {
		*gbnf = NULL;
		*glen = sizeof json_object_gbnf - 1;
		return 0;
	}
	json_error_t je;
	json_t *schema = json_loadb(text, len, JSON_DECODE_ANY, &je);
	if (!schema)
		return hearth_error_set(err, HEARTH_EFORMAT, "json_schema: not JSON (line %d column %d): %s",
					je.line, je.column, je.text);
	int rc = json_schema_to_gbnf(schema, gbnf, err);
	json_decref(schema);
	if (!rc)
		*glen = strlen(*gbnf);
	return rc;
}

int grammar_cache_get(struct grammar_cache *c, enum grammar_kind kind, const char *text, size_t len,
		      struct grammar_index **out, struct hearth_error *err)
{
	*out = NULL;
	if (kind == GRAMMAR_JSON_OBJECT) {
		text = "";
		len = 0;
	}
	pthread_mutex_lock(&c->lock);
	struct grammar_index *ix = cache_find(c, kind, text, len);
	pthread_mutex_unlock(&c->lock);
	if (ix) {
		*out = ix;
		return 0;
	}
	/* compile outside the lock: other requests' lookups do not wait for it */
	char *gbnf = NULL;
	size_t glen = 0;
	int rc = build_source(kind, text, len, &gbnf, &glen, err);
	if (rc)
		return rc;
	const char *src = kind == GRAMMAR_GBNF ? text : kind == GRAMMAR_JSON_OBJECT ? json_object_gbnf : gbnf;
	struct grammar *g;
	rc = grammar_compile(&g, src, glen, err);
	free(gbnf);
	if (rc)
		return rc;
	if ((rc = grammar_index_new(&ix, g, c->v, err)))
		return rc;
	char *key = malloc(len + 1);
	if (!key) {
		grammar_index_unref(ix);
		return hearth_error_set(err, HEARTH_ENOMEM, "grammar: out of memory");
	}
	memcpy(key, text, len);
	key[len] = 0;
	pthread_mutex_lock(&c->lock);
	struct grammar_index *again = cache_find(c, kind, text, len);
	if (again) {
		pthread_mutex_unlock(&c->lock);
		free(key);
		grammar_index_unref(ix);
		*out = again;
		return 0;
	}
	size_t slot = c->n;
	if (c->n == c->cap) {
		slot = 0;
		for (size_t i = 1; i < c->n; i++)
			if (c->e[i].used < c->e[slot].used)
				slot = i;
		free(c->e[slot].text);
		grammar_index_unref(c->e[slot].ix);
	} else {
		c->n++;
	}
	c->e[slot] = (struct centry){ kind, key, len, grammar_index_ref(ix), ++c->clock };
	pthread_mutex_unlock(&c->lock);
	*out = ix;
	return 0;
}
