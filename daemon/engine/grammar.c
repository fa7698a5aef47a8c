/* Rule trees to a byte-level pushdown automaton: Thompson construction per rule (classes
 * over code points become UTF-8 byte-range chains), small and non-recursive rules inlined,
 * epsilons removed, then the checks (left recursion, rules matching nothing) and the FOLLOW
 * sets the mask precomputation uses. Also the stack-set states with memoised steps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/grammar_impl.h"

/* ---- epsilon NFA under construction ---- */
enum { NK_EPS, NK_TERM, NK_CALL, NK_END };

struct nfa {
	uint8_t *kind;
	uint32_t *arg;
	uint32_t *rule;
	uint32_t n, cap;
	uint32_t *efrom, *eto;
	size_t ne, cape;
	/* byte sets, deduplicated */
	uint64_t (*sets)[4];
	uint32_t n_sets, cap_sets;
	uint32_t *set_hash;
	uint32_t set_hash_cap;
};

struct cstate {
	struct nfa nfa;
	struct gparse *p;
	const char *src;
	size_t len;
	uint32_t *refcount;
	bool *recursive;
	uint32_t cur_rule; /* the rule whose automaton is being built */
	uint32_t src_rule; /* the rule whose text is being compiled (differs when inlining) */
	unsigned inline_depth;
	uint32_t node_limit; /* lowered while trying an inline */
	struct hearth_error *err;
};

struct frag {
	uint32_t in, out;
};

#define INLINE_MAX_NODES 4096
#define INLINE_MAX_DEPTH 32
#define OVER_BUDGET 1

static int cerr(struct cstate *c, uint32_t off, int code, const char *fmt, const char *name)
{
	char at[32];
	gparse_where(c->src, c->len, off, at, sizeof at);
	char what[200];
	snprintf(what, sizeof what, fmt, name);
	return hearth_error_set(c->err, code, "grammar %s: %s", at, what);
}

static int nfa_node(struct cstate *c, uint8_t kind, uint32_t arg, uint32_t *out, uint32_t off)
{
	struct nfa *n = &c->nfa;
	if (n->n >= c->node_limit) {
		if (c->node_limit < GRAMMAR_MAX_NODES)
			return OVER_BUDGET;
		return cerr(c, off, HEARTH_ERANGE,
			    "rule '%.64s' expands to more than 524288 automaton nodes",
			    c->p->rules[c->src_rule].name);
	}
	if (n->n == n->cap) {
		uint32_t cap = n->cap ? n->cap * 2 : 1024;
		uint8_t *k = realloc(n->kind, cap);
		if (k)
			n->kind = k;
		uint32_t *a = realloc(n->arg, cap * sizeof *a);
		if (a)
			n->arg = a;
		uint32_t *r = realloc(n->rule, cap * sizeof *r);
		if (r)
			n->rule = r;
		if (!k || !a || !r)
			return hearth_error_set(c->err, HEARTH_ENOMEM, "grammar: out of memory");
		n->cap = cap;
	}
	n->kind[n->n] = kind;
	n->arg[n->n] = arg;
	n->rule[n->n] = c->cur_rule;
	*out = n->n++;
	return 0;
}

static int nfa_edge(struct cstate *c, uint32_t from, uint32_t to)
{
	struct nfa *n = &c->nfa;
	if (n->ne == n->cape) {
		size_t cap = n->cape ? n->cape * 2 : 2048;
		uint32_t *f = realloc(n->efrom, cap * sizeof *f);
		if (f)
			n->efrom = f;
		uint32_t *t = realloc(n->eto, cap * sizeof *t);
		if (t)
			n->eto = t;
		if (!f || !t)
			return hearth_error_set(c->err, HEARTH_ENOMEM, "grammar: out of memory");
		n->cape = cap;
	}
	n->efrom[n->ne] = from;
	n->eto[n->ne] = to;
	n->ne++;
	return 0;
}

static uint32_t set_hash(const uint64_t *s)
{
	uint64_t h = s[0] * 0x9e3779b97f4a7c15ull ^ s[1] * 0xc2b2ae3d27d4eb4full ^
		     s[2] * 0x165667b19e3779f9ull ^ s[3] * 0x27d4eb2f165667c5ull;
	return (uint32_t)(h ^ h >> 32);
}

static int set_intern(struct cstate *c, const uint64_t *s, uint32_t *out)
{
	struct nfa *n = &c->nfa;
	if (n->n_sets * 2 >= n->set_hash_cap) {
		uint32_t cap = n->set_hash_cap ? n->set_hash_cap * 2 : 256;
		uint32_t *h = calloc(cap, sizeof *h);
		if (!h)
			return hearth_error_set(c->err, HEARTH_ENOMEM, "grammar: out of memory");
		for (uint32_t i = 0; i < n->n_sets; i++) {
			uint32_t at = set_hash(n->sets[i]) & (cap - 1);
			while (h[at])
				at = (at + 1) & (cap - 1);
			h[at] = i + 1;
		}
		free(n->set_hash);
		n->set_hash = h;
		n->set_hash_cap = cap;
	}
	uint32_t at = set_hash(s) & (n->set_hash_cap - 1);
	while (n->set_hash[at]) {
		uint32_t i = n->set_hash[at] - 1;
		if (memcmp(n->sets[i], s, 32) == 0) {
			*out = i;
			return 0;
		}
		at = (at + 1) & (n->set_hash_cap - 1);
	}
	if (n->n_sets == n->cap_sets) {
		uint32_t cap = n->cap_sets ? n->cap_sets * 2 : 64;
		uint64_t(*g)[4] = realloc(n->sets, cap * sizeof *g);
		if (!g)
			return hearth_error_set(c->err, HEARTH_ENOMEM, "grammar: out of memory");
		n->sets = g;
		n->cap_sets = cap;
	}
	memcpy(n->sets[n->n_sets], s, 32);
	n->set_hash[at] = ++n->n_sets;
	*out = n->n_sets - 1;
	return 0;
}

static int term_range(struct cstate *c, unsigned lo, unsigned hi, uint32_t *out, uint32_t off)
{
	uint64_t s[4] = { 0 };
	for (unsigned b = lo; b <= hi; b++)
		s[b >> 6] |= 1ull << (b & 63);
	uint32_t id;
	int rc = set_intern(c, s, &id);
	return rc ? rc : nfa_node(c, NK_TERM, id, out, off);
}

/* ---- UTF-8 byte-range sequences of a code point range ---- */
struct useq {
	uint8_t n, lo[4], hi[4];
};

static unsigned enc(uint32_t cp, uint8_t *o)
{
	if (cp < 0x80) {
		o[0] = (uint8_t)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (uint8_t)(0xc0 | cp >> 6);
		o[1] = (uint8_t)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (uint8_t)(0xe0 | cp >> 12);
		o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
		o[2] = (uint8_t)(0x80 | (cp & 0x3f));
		return 3;
	}
	o[0] = (uint8_t)(0xf0 | cp >> 18);
	o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
	o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
	o[3] = (uint8_t)(0x80 | (cp & 0x3f));
	return 4;
}

/* Splits [lo, hi] (same encoded length, no surrogates) until each piece is a product of
 * per-byte ranges, appending the pieces to seq (at most 64 from one range). */
static void utf8_split(uint32_t lo, uint32_t hi, struct useq *seq, unsigned *n)
{
	static const uint32_t max_of[4] = { 0x7f, 0x7ff, 0xffff, 0x10ffff };
	for (unsigned k = 0; k < 3; k++) {
		if (lo <= max_of[k] && hi > max_of[k]) {
			utf8_split(lo, max_of[k], seq, n);
			utf8_split(max_of[k] + 1, hi, seq, n);
			return;
		}
	}
	uint8_t a[4], b[4];
	unsigned len = enc(lo, a);
	for (unsigned i = 1; i < len; i++) {
		uint32_t m = (1u << (6 * i)) - 1;
		if ((lo & ~m) != (hi & ~m)) {
			if ((lo & m) != 0) {
				utf8_split(lo, lo | m, seq, n);
				utf8_split((lo | m) + 1, hi, seq, n);
				return;
			}
			if ((hi & m) != m) {
				utf8_split(lo, (hi & ~m) - 1, seq, n);
				utf8_split(hi & ~m, hi, seq, n);
				return;
			}
		}
	}
	enc(hi, b);
	struct useq *q = &seq[(*n)++];
	q->n = (uint8_t)len;
	for (unsigned i = 0; i < len; i++) {
		q->lo[i] = a[i];
		q->hi[i] = b[i];
	}
}

static int compile_class(struct cstate *c, const struct gast *a, struct frag *f)
{
	int rc;
	uint32_t in, out;
	if ((rc = nfa_node(c, NK_EPS, 0, &in, a->off)) || (rc = nfa_node(c, NK_EPS, 0, &out, a->off)))
		return rc;
	uint64_t ascii[4] = { 0 };
	bool any_ascii = false;
	size_t edges_before = c->nfa.ne;
	for (uint32_t r = 0; r < a->n; r++) {
		uint32_t lo = a->u.ranges[2 * r], hi = a->u.ranges[2 * r + 1];
		/* surrogates are not characters: cut them out */
		uint32_t pieces[4];
		unsigned np = 0;
		if (lo <= 0xd7ff || hi >= 0xe000) {
			if (lo < 0xd800 && hi > 0xdfff) {
				pieces[np++] = lo, pieces[np++] = 0xd7ff;
				pieces[np++] = 0xe000, pieces[np++] = hi;
			} else if (lo >= 0xd800 && lo <= 0xdfff) {
				pieces[np++] = 0xe000, pieces[np++] = hi;
			} else if (hi >= 0xd800 && hi <= 0xdfff) {
				pieces[np++] = lo, pieces[np++] = 0xd7ff;
			} else {
				pieces[np++] = lo, pieces[np++] = hi;
			}
		}
		for (unsigned k = 0; k < np; k += 2) {
			if (pieces[k] > pieces[k + 1])
				continue;
			struct useq seq[64];
			unsigned ns = 0;
			utf8_split(pieces[k], pieces[k + 1], seq, &ns);
			for (unsigned q = 0; q < ns; q++) {
				if (seq[q].n == 1) {
					for (unsigned b = seq[q].lo[0]; b <= seq[q].hi[0]; b++)
						ascii[b >> 6] |= 1ull << (b & 63);
					any_ascii = true;
					continue;
				}
				uint32_t prev = in;
				for (unsigned i = 0; i < seq[q].n; i++) {
					uint32_t t;
					if ((rc = term_range(c, seq[q].lo[i], seq[q].hi[i], &t, a->off)) ||
					    (rc = nfa_edge(c, prev, t)))
						return rc;
					prev = t;
				}
				if ((rc = nfa_edge(c, prev, out)))
					return rc;
			}
		}
	}
	if (!any_ascii && c->nfa.ne == edges_before)
		return cerr(c, a->off, HEARTH_EINVAL, "character class in rule '%.64s' matches no character",
			    c->p->rules[c->src_rule].name);
	if (any_ascii) {
		uint32_t id, t;
		if ((rc = set_intern(c, ascii, &id)) || (rc = nfa_node(c, NK_TERM, id, &t, a->off)) ||
		    (rc = nfa_edge(c, in, t)) || (rc = nfa_edge(c, t, out)))
			return rc;
	}
	f->in = in;
	f->out = out;
	return 0;
}

static int compile(struct cstate *c, const struct gast *a, bool in_loop, struct frag *f);

static int compile_ref(struct cstate *c, const struct gast *a, bool in_loop, struct frag *f)
{
	uint32_t r = a->u.rule;
	int rc;
	if (!c->recursive[r] && c->inline_depth < INLINE_MAX_DEPTH &&
	    (c->refcount[r] == 1 || in_loop || c->refcount[r] <= 4)) {
		/* try inlining under a budget; fall back to a call when it grows too much. An
		 * enclosing attempt's tighter budget is not ours to fall back from: that failure
		 * goes up, so nested attempts cannot multiply. */
		uint32_t mark_n = c->nfa.n;
		size_t mark_e = c->nfa.ne;
		uint32_t save_limit = c->node_limit, save_src = c->src_rule;
		uint32_t budget = c->nfa.n + INLINE_MAX_NODES;
		bool own = budget < c->node_limit;
		if (own)
			c->node_limit = budget;
		c->inline_depth++;
		c->src_rule = r;
		rc = compile(c, c->p->rules[r].body, false, f);
		c->inline_depth--;
		c->node_limit = save_limit;
		c->src_rule = save_src;
		if (rc != OVER_BUDGET || !own)
			return rc;
		c->nfa.n = mark_n;
		c->nfa.ne = mark_e;
	}
	uint32_t call;
	if ((rc = nfa_node(c, NK_CALL, r, &call, a->off)))
		return rc;
	f->in = f->out = call;
	return 0;
}

static int compile(struct cstate *c, const struct gast *a, bool in_loop, struct frag *f)
{
	int rc;
	switch (a->kind) {
	case GAST_BYTES: {
		if (a->n == 0)
			goto empty;
		uint32_t prev = 0;
		for (uint32_t i = 0; i < a->n; i++) {
			uint32_t t;
			if ((rc = term_range(c, a->u.bytes[i], a->u.bytes[i], &t, a->off)))
				return rc;
			if (i == 0)
				f->in = t;
			else if ((rc = nfa_edge(c, prev, t)))
				return rc;
			prev = t;
		}
		f->out = prev;
		return 0;
	}
	case GAST_CLASS:
		return compile_class(c, a, f);
	case GAST_REF:
		return compile_ref(c, a, in_loop, f);
	case GAST_SEQ: {
		if (a->n == 0)
			goto empty;
		struct frag k;
		for (uint32_t i = 0; i < a->n; i++) {
			if ((rc = compile(c, a->u.kids[i], in_loop, &k)))
				return rc;
			if (i == 0)
				f->in = k.in;
			else if ((rc = nfa_edge(c, f->out, k.in)))
				return rc;
			f->out = k.out;
		}
		return 0;
	}
	case GAST_ALT: {
		if ((rc = nfa_node(c, NK_EPS, 0, &f->in, a->off)) ||
		    (rc = nfa_node(c, NK_EPS, 0, &f->out, a->off)))
			return rc;
		for (uint32_t i = 0; i < a->n; i++) {
			struct frag k;
			if ((rc = compile(c, a->u.kids[i], in_loop, &k)) || (rc = nfa_edge(c, f->in, k.in)) ||
			    (rc = nfa_edge(c, k.out, f->out)))
				return rc;
		}
		return 0;
	}
	case GAST_REP: {
		const struct gast *kid = a->u.kids[0];
		bool loop = in_loop || a->max == GAST_INF || a->max <= 4;
		if ((rc = nfa_node(c, NK_EPS, 0, &f->in, a->off)))
			return rc;
		uint32_t cur = f->in;
		/* x{m,} is m-1 copies and then one copy that loops back (x+), so nested
		 * unbounded repetitions stay linear in size */
		uint32_t plain = a->max == GAST_INF && a->min > 0 ? a->min - 1 : a->min;
		for (uint32_t i = 0; i < plain; i++) {
			struct frag k;
			if ((rc = compile(c, kid, loop, &k)) || (rc = nfa_edge(c, cur, k.in)))
				return rc;
			cur = k.out;
		}
		if (a->max == GAST_INF) {
			uint32_t l;
			struct frag k;
			if ((rc = nfa_node(c, NK_EPS, 0, &l, a->off)) || (rc = compile(c, kid, loop, &k)) ||
			    (rc = nfa_edge(c, k.out, l)) || (rc = nfa_edge(c, l, k.in)))
				return rc;
			/* x+: enter the copy; x*: the loop node is also the way past */
			if ((rc = nfa_edge(c, cur, a->min > 0 ? k.in : l)))
				return rc;
			f->out = l;
			return 0;
		}
		uint32_t exit;
		if ((rc = nfa_node(c, NK_EPS, 0, &exit, a->off)) || (rc = nfa_edge(c, cur, exit)))
			return rc;
		for (uint32_t i = a->min; i < a->max; i++) {
			struct frag k;
			if ((rc = compile(c, kid, loop, &k)) || (rc = nfa_edge(c, cur, k.in)) ||
			    (rc = nfa_edge(c, k.out, exit)))
				return rc;
			cur = k.out;
		}
		f->out = exit;
		return 0;
	}
	}
empty:
	if ((rc = nfa_node(c, NK_EPS, 0, &f->in, a->off)))
		return rc;
	f->out = f->in;
	return 0;
}

/* ---- rule reference graph: counts and recursion (Tarjan's SCC) ---- */
static void count_refs(const struct gast *a, uint32_t *count, uint32_t mult)
{
	if (a->kind == GAST_REF) {
		count[a->u.rule] += mult;
		return;
	}
	if (a->kind == GAST_ALT || a->kind == GAST_SEQ || a->kind == GAST_REP) {
		/* a repetition's body appears once per copy; a loop counts as many */
		uint32_t m = mult;
		if (a->kind == GAST_REP)
			m = a->max == GAST_INF || a->max > 4 ? 5 : (a->max ? a->max : 1);
		for (uint32_t i = 0; i < a->n; i++)
			count_refs(a->u.kids[i], count, m > mult ? m : mult);
	}
}

static int refs_of(const struct gast *a, uint32_t **out, size_t *n, size_t *cap)
{
	if (a->kind == GAST_REF) {
		if (*n == *cap) {
			size_t c2 = *cap ? *cap * 2 : 16;
			uint32_t *g = realloc(*out, c2 * sizeof *g);
			if (!g)
				return -1;
			*out = g;
			*cap = c2;
		}
		(*out)[(*n)++] = a->u.rule;
		return 0;
	}
	if (a->kind == GAST_ALT || a->kind == GAST_SEQ || a->kind == GAST_REP)
		for (uint32_t i = 0; i < a->n; i++)
			if (refs_of(a->u.kids[i], out, n, cap))
				return -1;
	return 0;
}

struct tarjan {
	uint32_t *off, *adj; /* CSR */
	uint32_t *index, *low, *stack;
	bool *on;
	uint32_t next, sp;
	bool *recursive;
};

static void tarjan_visit(struct tarjan *t, uint32_t v)
{
	t->index[v] = t->low[v] = ++t->next;
	t->stack[t->sp++] = v;
	t->on[v] = true;
	for (uint32_t e = t->off[v]; e < t->off[v + 1]; e++) {
		uint32_t w = t->adj[e];
		if (w == v)
			t->recursive[v] = true;
		if (!t->index[w]) {
			tarjan_visit(t, w);
			if (t->low[w] < t->low[v])
				t->low[v] = t->low[w];
		} else if (t->on[w] && t->index[w] < t->low[v]) {
			t->low[v] = t->index[w];
		}
	}
	if (t->low[v] == t->index[v]) {
		uint32_t size = 0, w;
		uint32_t base = t->sp;
		do {
			w = t->stack[--base];
			size++;
		} while (w != v);
		do {
			w = t->stack[--t->sp];
			t->on[w] = false;
			if (size > 1)
				t->recursive[w] = true;
		} while (w != v);
	}
}

static int find_recursion(struct gparse *p, bool *recursive)
{
	uint32_t n = p->n_rules;
	struct tarjan t = { 0 };
	uint32_t *adj = NULL;
	size_t na = 0, cap = 0;
	t.off = calloc(n + 1, sizeof *t.off);
	t.index = calloc(n, sizeof *t.index);
	t.low = calloc(n, sizeof *t.low);
	t.stack = calloc(n, sizeof *t.stack);
	t.on = calloc(n, sizeof *t.on);
	int rc = -1;
	if (!t.off || !t.index || !t.low || !t.stack || !t.on)
		goto out;
	for (uint32_t r = 0; r < n; r++) {
		t.off[r] = (uint32_t)na;
		if (refs_of(p->rules[r].body, &adj, &na, &cap))
			goto out;
	}
	t.off[n] = (uint32_t)na;
	t.adj = adj;
	t.recursive = recursive;
	for (uint32_t r = 0; r < n; r++)
		if (!t.index[r])
			tarjan_visit(&t, r);
	rc = 0;
out:
	free(adj);
	free(t.off);
	free(t.index);
	free(t.low);
	free(t.stack);
	free(t.on);
	return rc;
}

/* ---- epsilon removal ---- */
struct closure_ctx {
	uint32_t *off, *adj; /* nfa out-edges CSR */
	uint32_t *stamp, cur;
	uint32_t *stack;
	uint32_t *real_id;
	uint32_t *buf;
	size_t n_buf, cap_buf;
};

static int closure_from(struct closure_ctx *x, const struct nfa *n, const uint32_t *seeds,
			uint32_t n_seeds, size_t *n_out)
{
	x->cur++;
	size_t sp = 0, start = x->n_buf;
	for (uint32_t i = 0; i < n_seeds; i++) {
		if (x->stamp[seeds[i]] != x->cur) {
			x->stamp[seeds[i]] = x->cur;
			x->stack[sp++] = seeds[i];
		}
	}
	while (sp) {
		uint32_t v = x->stack[--sp];
		if (n->kind[v] != NK_EPS) {
			if (x->n_buf == x->cap_buf) {
				size_t cap = x->cap_buf ? x->cap_buf * 2 : 4096;
				if (cap > GRAMMAR_MAX_EDGES + (size_t)4096)
					return HEARTH_ERANGE;
				uint32_t *g = realloc(x->buf, cap * sizeof *g);
				if (!g)
					return HEARTH_ENOMEM;
				x->buf = g;
				x->cap_buf = cap;
			}
			x->buf[x->n_buf++] = x->real_id[v];
			continue;
		}
		for (uint32_t e = x->off[v]; e < x->off[v + 1]; e++) {
			uint32_t w = x->adj[e];
			if (x->stamp[w] != x->cur) {
				x->stamp[w] = x->cur;
				x->stack[sp++] = w;
			}
		}
	}
	if (x->n_buf > GRAMMAR_MAX_EDGES)
		return HEARTH_ERANGE;
	*n_out = x->n_buf - start;
	return 0;
}

static int build_graph(struct cstate *c, struct grammar *g, const uint32_t *rule_in, const uint32_t *rule_end)
{
	struct nfa *n = &c->nfa;
	struct closure_ctx x = { 0 };
	int rc = HEARTH_ENOMEM;
	x.off = calloc((size_t)n->n + 1, sizeof *x.off);
	x.adj = malloc((n->ne ? n->ne : 1) * sizeof *x.adj);
	x.stamp = calloc(n->n, sizeof *x.stamp);
	x.stack = malloc(((size_t)n->n + 1) * sizeof *x.stack);
	x.real_id = malloc(((size_t)n->n + 1) * sizeof *x.real_id);
	if (!x.off || !x.adj || !x.stamp || !x.stack || !x.real_id)
		goto out;
	for (size_t e = 0; e < n->ne; e++)
		x.off[n->efrom[e] + 1]++;
	for (uint32_t v = 0; v < n->n; v++)
		x.off[v + 1] += x.off[v];
	{
		uint32_t *pos = malloc(((size_t)n->n + 1) * sizeof *pos);
		if (!pos)
			goto out;
		memcpy(pos, x.off, ((size_t)n->n + 1) * sizeof *pos);
		for (size_t e = 0; e < n->ne; e++)
			x.adj[pos[n->efrom[e]]++] = n->eto[e];
		free(pos);
	}
	uint32_t n_real = 0;
	for (uint32_t v = 0; v < n->n; v++)
		x.real_id[v] = n->kind[v] == NK_EPS ? UINT32_MAX : n_real++;
	g->nodes = calloc(n_real ? n_real : 1, sizeof *g->nodes);
	if (!g->nodes)
		goto out;
	g->n_nodes = n_real;
	for (uint32_t v = 0; v < n->n; v++) {
		if (n->kind[v] == NK_EPS)
			continue;
		struct gnode *d = &g->nodes[x.real_id[v]];
		d->kind = n->kind[v] == NK_TERM ? GN_TERM : n->kind[v] == NK_CALL ? GN_CALL : GN_END;
		d->arg = n->arg[v];
		d->rule = n->rule[v];
		if (d->kind == GN_END)
			continue;
		size_t cnt;
		d->succ = (uint32_t)x.n_buf;
		if ((rc = closure_from(&x, n, x.adj + x.off[v], x.off[v + 1] - x.off[v], &cnt)))
			goto too_big;
		d->n_succ = (uint32_t)cnt;
	}
	for (uint32_t r = 0; r < g->n_rules; r++) {
		size_t cnt;
		g->rules[r].start = (uint32_t)x.n_buf;
		if ((rc = closure_from(&x, n, &rule_in[r], 1, &cnt)))
			goto too_big;
		g->rules[r].n_start = (uint32_t)cnt;
		(void)rule_end;
	}
	g->succ = x.buf;
	g->n_succ = x.n_buf;
	x.buf = NULL;
	rc = 0;
	goto out;
too_big:
	if (rc == HEARTH_ERANGE)
		hearth_error_set(c->err, rc,
				 "grammar: more than %u automaton edges once empty alternatives are "
				 "resolved (long runs of optional elements)", GRAMMAR_MAX_EDGES);
	else
		hearth_error_set(c->err, rc, "grammar: out of memory");
out:
	free(x.off);
	free(x.adj);
	free(x.stamp);
	free(x.stack);
	free(x.real_id);
	free(x.buf);
	return rc;
}

/* ---- analyses on the graph ---- */
static bool set_empty(const uint64_t *s)
{
	return !(s[0] | s[1] | s[2] | s[3]);
}

/* Can the node list reach END through nodes that are "passable" (CALLs to rules with
 * flag[] set, TERMs when terms_pass)? Used for nullable (no TERMs) and productive. */
static bool reaches_end(const struct grammar *g, uint32_t first, uint32_t count, const bool *flag,
			bool terms_pass, uint32_t *stamp, uint32_t cur, uint32_t *stack)
{
	size_t sp = 0;
	for (uint32_t i = 0; i < count; i++) {
		uint32_t v = g->succ[first + i];
		if (stamp[v] != cur) {
			stamp[v] = cur;
			stack[sp++] = v;
		}
	}
	while (sp) {
		const struct gnode *d = &g->nodes[stack[--sp]];
		if (d->kind == GN_END)
			return true;
		bool pass = d->kind == GN_CALL ? flag[d->arg] : terms_pass && !set_empty(g->sets[d->arg]);
		if (!pass)
			continue;
		for (uint32_t e = 0; e < d->n_succ; e++) {
			uint32_t w = g->succ[d->succ + e];
			if (stamp[w] != cur) {
				stamp[w] = cur;
				stack[sp++] = w;
			}
		}
	}
	return false;
}

static int report_left_recursion(struct cstate *c, struct grammar *g, const uint32_t *lr_off,
				 const uint32_t *lr_adj)
{
	/* iterative DFS with colours; the grey path is the cycle when a grey node is met */
	uint32_t n = g->n_rules;
	uint8_t *color = calloc(n, 1);
	uint32_t *path = malloc((size_t)n * sizeof *path), *edge = malloc((size_t)n * sizeof *edge);
	int rc = 0;
	if (!color || !path || !edge) {
		rc = hearth_error_set(c->err, HEARTH_ENOMEM, "grammar: out of memory");
		goto out;
	}
	for (uint32_t s = 0; s < n && !rc; s++) {
		if (color[s])
			continue;
		uint32_t depth = 0;
		path[0] = s;
		edge[0] = lr_off[s];
		color[s] = 1;
		depth = 1;
		while (depth && !rc) {
			uint32_t v = path[depth - 1];
			if (edge[depth - 1] == lr_off[v + 1]) {
				color[v] = 2;
				depth--;
				continue;
			}
			uint32_t w = lr_adj[edge[depth - 1]++];
			if (color[w] == 1) {
				char chain[320];
				size_t at = 0;
				uint32_t i = 0;
				while (path[i] != w)
					i++;
				for (uint32_t k = i; k < depth && at < sizeof chain - 80; k++)
					at += (size_t)snprintf(chain + at, sizeof chain - at, "%.40s -> ",
							       g->rules[path[k]].name);
				snprintf(chain + at, sizeof chain - at, "%.40s", g->rules[w].name);
				char at_s[32];
				gparse_where(c->src, c->len, g->rules[w].def_off, at_s, sizeof at_s);
				rc = hearth_error_set(c->err, HEARTH_EINVAL,
						      "grammar %s: rule '%.64s' is left-recursive (%s)", at_s,
						      g->rules[w].name, chain);
			} else if (!color[w]) {
				color[w] = 1;
				path[depth] = w;
				edge[depth] = lr_off[w];
				depth++;
			}
		}
	}
out:
	free(color);
	free(path);
	free(edge);
	return rc;
}

static int analyse(struct cstate *c, struct grammar *g)
{
	uint32_t nr = g->n_rules, nn = g->n_nodes;
	int rc = HEARTH_ENOMEM;
	uint32_t *stamp = calloc(nn + 1, sizeof *stamp), cur = 0;
	uint32_t *stack = malloc(((size_t)nn + 1) * sizeof *stack);
	bool *flag = calloc(nr, sizeof *flag);
	bool *good = calloc(nn + 1, sizeof *good);
	uint32_t *lr_off = calloc((size_t)nr + 1, sizeof *lr_off), *lr_adj = NULL;
	uint32_t *roff = NULL, *radj = NULL;
	if (!stamp || !stack || !flag || !good || !lr_off)
		goto oom;

	/* nullable: passes until stable (at most one pass per rule) */
	for (bool changed = true; changed;) {
		changed = false;
		for (uint32_t r = 0; r < nr; r++) {
			if (flag[r])
				continue;
			if (reaches_end(g, g->rules[r].start, g->rules[r].n_start, flag, false, stamp, ++cur, stack))
				flag[r] = changed = true;
		}
	}
	for (uint32_t r = 0; r < nr; r++)
		g->rules[r].nullable = flag[r];

	/* left recursion: R -> S when R can call S before consuming a byte */
	{
		size_t na = 0, cap = 0;
		for (uint32_t r = 0; r < nr; r++) {
			lr_off[r] = (uint32_t)na;
			size_t sp = 0;
			cur++;
			for (uint32_t i = 0; i < g->rules[r].n_start; i++) {
				uint32_t v = g->succ[g->rules[r].start + i];
				if (stamp[v] != cur) {
					stamp[v] = cur;
					stack[sp++] = v;
				}
			}
			while (sp) {
				const struct gnode *d = &g->nodes[stack[--sp]];
				if (d->kind != GN_CALL)
					continue;
				if (na == cap) {
					cap = cap ? cap * 2 : 256;
					uint32_t *gr = realloc(lr_adj, cap * sizeof *gr);
					if (!gr)
						goto oom;
					lr_adj = gr;
				}
				lr_adj[na++] = d->arg;
				if (!g->rules[d->arg].nullable)
					continue;
				for (uint32_t e = 0; e < d->n_succ; e++) {
					uint32_t w = g->succ[d->succ + e];
					if (stamp[w] != cur) {
						stamp[w] = cur;
						stack[sp++] = w;
					}
				}
			}
		}
		lr_off[nr] = (uint32_t)na;
		if ((rc = report_left_recursion(c, g, lr_off, lr_adj)))
			goto out;
	}

	/* productive rules (derive some finite byte string) */
	memset(flag, 0, nr * sizeof *flag);
	for (bool changed = true; changed;) {
		changed = false;
		for (uint32_t r = 0; r < nr; r++) {
			if (flag[r])
				continue;
			if (reaches_end(g, g->rules[r].start, g->rules[r].n_start, flag, true, stamp, ++cur, stack))
				flag[r] = changed = true;
		}
	}
	/* rules reachable from root (before pruning): each must be productive */
	{
		size_t sp = 0;
		cur++;
		g->rules[g->root].reachable = true;
		uint32_t *rstack = malloc((size_t)nr * sizeof *rstack);
		size_t rsp = 0;
		if (!rstack)
			goto oom;
		rstack[rsp++] = g->root;
		while (rsp) {
			uint32_t r = rstack[--rsp];
			for (uint32_t i = 0; i < g->rules[r].n_start; i++) {
				uint32_t v = g->succ[g->rules[r].start + i];
				if (stamp[v] != cur) {
					stamp[v] = cur;
					stack[sp++] = v;
				}
			}
			while (sp) {
				const struct gnode *d = &g->nodes[stack[--sp]];
				if (d->kind == GN_CALL && !g->rules[d->arg].reachable) {
					g->rules[d->arg].reachable = true;
					rstack[rsp++] = d->arg;
				}
				if (d->kind == GN_END)
					continue;
				for (uint32_t e = 0; e < d->n_succ; e++) {
					uint32_t w = g->succ[d->succ + e];
					if (stamp[w] != cur) {
						stamp[w] = cur;
						stack[sp++] = w;
					}
				}
			}
		}
		free(rstack);
		for (uint32_t r = 0; r < nr; r++) {
			if (g->rules[r].reachable && !flag[r]) {
				char at[32];
				gparse_where(c->src, c->len, g->rules[r].def_off, at, sizeof at);
				rc = hearth_error_set(c->err, HEARTH_EINVAL,
						      "grammar %s: rule '%.64s' matches no finite string%s", at,
						      g->rules[r].name,
						      r == g->root ? " (the grammar's language is empty)" : "");
				goto out;
			}
		}
	}

	/* prune nodes that cannot lead to their rule's END (dead branches) */
	for (uint32_t v = 0; v < nn; v++) {
		const struct gnode *d = &g->nodes[v];
		good[v] = d->kind == GN_END || (d->kind == GN_CALL ? flag[d->arg] : !set_empty(g->sets[d->arg]));
	}
	roff = calloc((size_t)nn + 1, sizeof *roff);
	radj = malloc((g->n_succ ? g->n_succ : 1) * sizeof *radj);
	if (!roff || !radj)
		goto oom;
	for (uint32_t v = 0; v < nn; v++)
		for (uint32_t e = 0; e < g->nodes[v].n_succ; e++)
			roff[g->succ[g->nodes[v].succ + e] + 1]++;
	for (uint32_t v = 0; v < nn; v++)
		roff[v + 1] += roff[v];
	{
		uint32_t *pos = malloc(((size_t)nn + 1) * sizeof *pos);
		if (!pos)
			goto oom;
		memcpy(pos, roff, ((size_t)nn + 1) * sizeof *pos);
		for (uint32_t v = 0; v < nn; v++)
			for (uint32_t e = 0; e < g->nodes[v].n_succ; e++)
				radj[pos[g->succ[g->nodes[v].succ + e]]++] = v;
		free(pos);
	}
	{
		/* live = good and reaches END backwards through good nodes */
		bool *live = calloc(nn + 1, sizeof *live);
		if (!live)
			goto oom;
		size_t sp = 0;
		for (uint32_t v = 0; v < nn; v++)
			if (g->nodes[v].kind == GN_END) {
				live[v] = true;
				stack[sp++] = v;
			}
		while (sp) {
			uint32_t v = stack[--sp];
			for (uint32_t e = roff[v]; e < roff[v + 1]; e++) {
				uint32_t w = radj[e];
				if (!live[w] && good[w]) {
					live[w] = true;
					stack[sp++] = w;
				}
			}
		}
		for (uint32_t v = 0; v < nn; v++) {
			struct gnode *d = &g->nodes[v];
			uint32_t k = 0;
			for (uint32_t e = 0; e < d->n_succ; e++)
				if (live[g->succ[d->succ + e]])
					g->succ[d->succ + k++] = g->succ[d->succ + e];
			d->n_succ = k;
		}
		for (uint32_t r = 0; r < nr; r++) {
			struct grule *R = &g->rules[r];
			uint32_t k = 0;
			for (uint32_t e = 0; e < R->n_start; e++)
				if (live[g->succ[R->start + e]])
					g->succ[R->start + k++] = g->succ[R->start + e];
			R->n_start = k;
		}
		free(live);
	}

	/* who calls each rule: where the precomputation continues when a rule ends */
	{
		size_t total = 0;
		for (uint32_t v = 0; v < nn; v++)
			if (g->nodes[v].kind == GN_CALL && g->rules[g->nodes[v].rule].reachable) {
				g->rules[g->nodes[v].arg].n_callers++;
				total++;
			}
		g->callers = malloc((total ? total : 1) * sizeof *g->callers);
		if (!g->callers)
			goto oom;
		uint32_t at = 0;
		for (uint32_t r = 0; r < nr; r++) {
			g->rules[r].callers = at;
			at += g->rules[r].n_callers;
			g->rules[r].n_callers = 0;
		}
		for (uint32_t v = 0; v < nn; v++)
			if (g->nodes[v].kind == GN_CALL && g->rules[g->nodes[v].rule].reachable) {
				struct grule *R = &g->rules[g->nodes[v].arg];
				g->callers[R->callers + R->n_callers++] = v;
			}
	}
	rc = 0;
	goto out;
oom:
	rc = hearth_error_set(c->err, HEARTH_ENOMEM, "grammar: out of memory");
out:
	free(stamp);
	free(stack);
	free(flag);
	free(good);
	free(lr_off);
	free(lr_adj);
	free(roff);
	free(radj);
	return rc;
}

void grammar_free(struct grammar *g)
{
	if (!g)
		return;
	for (uint32_t r = 0; r < g->n_rules; r++)
		free(g->rules[r].name);
	free(g->rules);
	free(g->nodes);
	free(g->succ);
	free(g->sets);
	free(g->callers);
	free(g);
}

int grammar_compile(struct grammar **out, const char *text, size_t len, struct hearth_error *err)
{
	*out = NULL;
	struct gparse p;
	int rc = gparse_run(&p, text, len, err);
	struct cstate c = { 0 };
	struct grammar *g = NULL;
	uint32_t *rule_in = NULL, *rule_end = NULL;
	if (rc)
		goto out;
	uint32_t root = UINT32_MAX;
	for (uint32_t r = 0; r < p.n_rules; r++)
		if (strcmp(p.rules[r].name, "root") == 0)
			root = r;
	if (root == UINT32_MAX) {
		rc = hearth_error_set(err, HEARTH_EINVAL, "grammar: no rule named 'root'");
		goto out;
	}
	c.p = &p;
	c.src = text;
	c.len = len;
	c.err = err;
	c.node_limit = GRAMMAR_MAX_NODES;
	c.refcount = calloc(p.n_rules, sizeof *c.refcount);
	c.recursive = calloc(p.n_rules, sizeof *c.recursive);
	rule_in = calloc(p.n_rules, sizeof *rule_in);
	rule_end = calloc(p.n_rules, sizeof *rule_end);
	g = calloc(1, sizeof *g);
	if (!c.refcount || !c.recursive || !rule_in || !rule_end || !g || find_recursion(&p, c.recursive)) {
		rc = hearth_error_set(err, HEARTH_ENOMEM, "grammar: out of memory");
		goto out;
	}
	for (uint32_t r = 0; r < p.n_rules; r++)
		count_refs(p.rules[r].body, c.refcount, 1);
	for (uint32_t r = 0; r < p.n_rules; r++) {
		struct frag f;
		c.cur_rule = c.src_rule = r;
		if ((rc = compile(&c, p.rules[r].body, false, &f)) ||
		    (rc = nfa_node(&c, NK_END, r, &rule_end[r], p.rules[r].def_off)) ||
		    (rc = nfa_edge(&c, f.out, rule_end[r])))
			goto out;
		rule_in[r] = f.in;
	}
	g->n_rules = p.n_rules;
	g->root = root;
	g->rules = calloc(p.n_rules, sizeof *g->rules);
	if (!g->rules) {
		rc = hearth_error_set(err, HEARTH_ENOMEM, "grammar: out of memory");
		goto out;
	}
	for (uint32_t r = 0; r < p.n_rules; r++) {
		g->rules[r].name = p.rules[r].name;
		p.rules[r].name = NULL;
		g->rules[r].def_off = p.rules[r].def_off;
	}
	g->sets = c.nfa.sets;
	g->n_sets = c.nfa.n_sets;
	c.nfa.sets = NULL;
	if ((rc = build_graph(&c, g, rule_in, rule_end)) || (rc = analyse(&c, g)))
		goto out;
	*out = g;
	g = NULL;
out:
	grammar_free(g);
	free(c.refcount);
	free(c.recursive);
	free(rule_in);
	free(rule_end);
	free(c.nfa.kind);
	free(c.nfa.arg);
	free(c.nfa.rule);
	free(c.nfa.efrom);
	free(c.nfa.eto);
	free(c.nfa.sets);
	free(c.nfa.set_hash);
	gparse_free(&p);
	return rc;
}

/* ---- stack-set states ---- */
static uint32_t mix64(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	k *= 0xc4ceb9fe1a85ec53ull;
	k ^= k >> 33;
	return (uint32_t)k;
}

int gpool_init(struct gpool *p, const struct grammar *g, uint32_t memo_log2, uint32_t max_frames)
{
	memset(p, 0, sizeof *p);
	p->g = g;
	p->max_frames = max_frames;
	p->memo_mask = (1u << memo_log2) - 1;
	p->memo_key = malloc(((size_t)p->memo_mask + 1) * sizeof *p->memo_key);
	p->memo_val = malloc(((size_t)p->memo_mask + 1) * sizeof *p->memo_val);
	if (!p->memo_key || !p->memo_val) {
		gpool_free(p);
		return HEARTH_ENOMEM;
	}
	memset(p->memo_key, 0xff, ((size_t)p->memo_mask + 1) * sizeof *p->memo_key);
	/* frames 0 and 1 are the sentinels; state 0 is the empty set */
	p->cap_frames = 1024;
	p->f_node = malloc(p->cap_frames * sizeof *p->f_node);
	p->f_parent = malloc(p->cap_frames * sizeof *p->f_parent);
	p->f_stamp = calloc(p->cap_frames, sizeof *p->f_stamp);
	p->f_rstamp = calloc(p->cap_frames, sizeof *p->f_rstamp);
	p->f_ctx = calloc(p->cap_frames, 1);
	p->f_hash_cap = 2048;
	p->f_hash = calloc(p->f_hash_cap, sizeof *p->f_hash);
	p->cap_states = 256;
	p->s_off = malloc(p->cap_states * sizeof *p->s_off);
	p->s_len = malloc(p->cap_states * sizeof *p->s_len);
	p->s_local = calloc(p->cap_states, 1);
	p->s_hash_cap = 512;
	p->s_hash = calloc(p->s_hash_cap, sizeof *p->s_hash);
	p->cap_data = 4096;
	p->s_data = malloc(p->cap_data * sizeof *p->s_data);
	if (!p->f_node || !p->f_parent || !p->f_stamp || !p->f_rstamp || !p->f_ctx || !p->f_hash || !p->s_off || !p->s_len || !p->s_local ||
	    !p->s_hash || !p->s_data) {
		gpool_free(p);
		return HEARTH_ENOMEM;
	}
	for (uint32_t f = 0; f <= GFRAME_CTX; f++)
		p->f_node[f] = p->f_parent[f] = UINT32_MAX;
	p->n_frames = GFRAME_CTX + 1;
	p->s_off[0] = 0;
	p->s_len[0] = 0;
	p->n_states = 1;
	return 0;
}

void gpool_free(struct gpool *p)
{
	free(p->f_node);
	free(p->f_parent);
	free(p->f_stamp);
	free(p->f_rstamp);
	free(p->f_ctx);
	free(p->f_hash);
	free(p->s_off);
	free(p->s_len);
	free(p->s_local);
	free(p->s_data);
	free(p->s_hash);
	free(p->memo_key);
	free(p->memo_val);
	free(p->work);
	free(p->out);
	memset(p, 0, sizeof *p);
}

static uint32_t frame_intern(struct gpool *p, uint32_t node, uint32_t parent)
{
	uint64_t key = (uint64_t)node << 32 | parent;
	uint32_t at = mix64(key) & (p->f_hash_cap - 1);
	while (p->f_hash[at]) {
		uint32_t f = p->f_hash[at] - 1;
		if (p->f_node[f] == node && p->f_parent[f] == parent)
			return f;
		at = (at + 1) & (p->f_hash_cap - 1);
	}
	if (p->n_frames >= p->max_frames) {
		p->err = HEARTH_ERANGE;
		return UINT32_MAX;
	}
	if (p->n_frames == p->cap_frames) {
		uint32_t cap = p->cap_frames * 2;
		uint32_t *a = realloc(p->f_node, cap * sizeof *a);
		if (a)
			p->f_node = a;
		uint32_t *b = realloc(p->f_parent, cap * sizeof *b);
		if (b)
			p->f_parent = b;
		uint32_t *s = realloc(p->f_stamp, cap * sizeof *s);
		if (s)
			p->f_stamp = s;
		uint32_t *r = realloc(p->f_rstamp, cap * sizeof *r);
		if (r)
			p->f_rstamp = r;
		uint8_t *x = realloc(p->f_ctx, cap);
		if (x)
			p->f_ctx = x;
		if (!a || !b || !s || !r || !x) {
			p->err = HEARTH_ENOMEM;
			return UINT32_MAX;
		}
		memset(p->f_stamp + p->cap_frames, 0, (cap - p->cap_frames) * sizeof *s);
		memset(p->f_rstamp + p->cap_frames, 0, (cap - p->cap_frames) * sizeof *r);
		p->cap_frames = cap;
	}
	uint32_t f = p->n_frames++;
	p->f_node[f] = node;
	p->f_parent[f] = parent;
	p->f_ctx[f] = parent == GFRAME_CTX || (parent > GFRAME_CTX && p->f_ctx[parent]);
	p->f_hash[at] = f + 1;
	if (p->n_frames * 2 > p->f_hash_cap) {
		uint32_t cap = p->f_hash_cap * 2;
		uint32_t *h = calloc(cap, sizeof *h);
		if (!h) {
			p->err = HEARTH_ENOMEM;
			return f;
		}
		for (uint32_t i = GFRAME_CTX + 1; i < p->n_frames; i++) {
			uint32_t a = mix64((uint64_t)p->f_node[i] << 32 | p->f_parent[i]) & (cap - 1);
			while (h[a])
				a = (a + 1) & (cap - 1);
			h[a] = i + 1;
		}
		free(p->f_hash);
		p->f_hash = h;
		p->f_hash_cap = cap;
	}
	return f;
}

static uint32_t state_hash(const uint32_t *v, uint32_t n)
{
	uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
	for (uint32_t i = 0; i < n; i++)
		h = (h ^ v[i]) * 0x100000001b3ull;
	return mix64(h);
}

static uint32_t state_intern(struct gpool *p, const uint32_t *v, uint32_t n)
{
	if (n == 0)
		return GSTATE_DEAD;
	uint32_t at = state_hash(v, n) & (p->s_hash_cap - 1);
	while (p->s_hash[at]) {
		uint32_t s = p->s_hash[at] - 1;
		if (p->s_len[s] == n && memcmp(p->s_data + p->s_off[s], v, n * sizeof *v) == 0)
			return s;
		at = (at + 1) & (p->s_hash_cap - 1);
	}
	if (p->n_states == p->cap_states) {
		uint32_t cap = p->cap_states * 2;
		uint32_t *a = realloc(p->s_off, cap * sizeof *a);
		if (a)
			p->s_off = a;
		uint32_t *b = realloc(p->s_len, cap * sizeof *b);
		if (b)
			p->s_len = b;
		uint8_t *l = realloc(p->s_local, cap);
		if (l)
			p->s_local = l;
		if (!a || !b || !l) {
			p->err = HEARTH_ENOMEM;
			return GSTATE_DEAD;
		}
		p->cap_states = cap;
	}
	if (p->n_data + n > p->cap_data) {
		size_t cap = p->cap_data * 2;
		while (cap < p->n_data + n)
			cap *= 2;
		uint32_t *d = realloc(p->s_data, cap * sizeof *d);
		if (!d) {
			p->err = HEARTH_ENOMEM;
			return GSTATE_DEAD;
		}
		p->s_data = d;
		p->cap_data = cap;
	}
	uint32_t s = p->n_states++;
	p->s_off[s] = (uint32_t)p->n_data;
	p->s_len[s] = n;
	p->s_local[s] = 0;
	for (uint32_t i = 0; i < n && !p->s_local[s]; i++)
		p->s_local[s] = v[i] == GFRAME_BOTTOM || (v[i] > GFRAME_CTX && !p->f_ctx[v[i]]);
	memcpy(p->s_data + p->n_data, v, n * sizeof *v);
	p->n_data += n;
	p->s_hash[at] = s + 1;
	if (p->n_states * 2 > p->s_hash_cap) {
		uint32_t cap = p->s_hash_cap * 2;
		uint32_t *h = calloc(cap, sizeof *h);
		if (!h) {
			p->err = HEARTH_ENOMEM;
			return s;
		}
		for (uint32_t i = 1; i < p->n_states; i++) {
			uint32_t a = state_hash(p->s_data + p->s_off[i], p->s_len[i]) & (cap - 1);
			while (h[a])
				a = (a + 1) & (cap - 1);
			h[a] = i + 1;
		}
		free(p->s_hash);
		p->s_hash = h;
		p->s_hash_cap = cap;
	}
	return s;
}

static bool push_work(struct gpool *p, size_t *sp, uint32_t node, uint32_t parent)
{
	if (*sp + 2 > p->cap_work) {
		size_t cap = p->cap_work ? p->cap_work * 2 : 256;
		uint32_t *w = realloc(p->work, cap * sizeof *w);
		if (!w) {
			p->err = HEARTH_ENOMEM;
			return false;
		}
		p->work = w;
		p->cap_work = cap;
	}
	p->work[(*sp)++] = node;
	p->work[(*sp)++] = parent;
	return true;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

/* Expands the work list to TERM tops (plus the sentinels when a rule returns into them)
 * and interns the resulting set. */
static uint32_t close_and_intern(struct gpool *p, size_t sp)
{
	const struct grammar *g = p->g;
	size_t n_out = 0;
	bool end_root = false, end_bottom = false;
	p->stamp++;
	if (p->stamp == 0) {
		memset(p->f_stamp, 0, p->cap_frames * sizeof *p->f_stamp);
		memset(p->f_rstamp, 0, p->cap_frames * sizeof *p->f_rstamp);
		p->stamp = 1;
	}
	while (sp && !p->err) {
		uint32_t parent = p->work[--sp];
		uint32_t node = p->work[--sp];
		const struct gnode *d = &g->nodes[node];
		if (d->kind == GN_END) {
			if (parent == GFRAME_ROOT) {
				end_root = true;
			} else if (parent == GFRAME_BOTTOM || parent == GFRAME_CTX) {
				/* the rule ended below what the precomputation knows: go on in every
				 * place it is called from (once each), and at the root's end the
				 * text may end */
				if (parent == GFRAME_BOTTOM)
					end_bottom = true;
				const struct grule *R = &g->rules[d->rule];
				if (d->rule == g->root)
					end_root = true;
				for (uint32_t k = 0; k < R->n_callers; k++) {
					uint32_t cf = frame_intern(p, g->callers[R->callers + k], GFRAME_CTX);
					if (cf == UINT32_MAX)
						return GSTATE_DEAD;
					if (p->f_rstamp[cf] == p->stamp)
						continue;
					p->f_rstamp[cf] = p->stamp;
					const struct gnode *call = &g->nodes[g->callers[R->callers + k]];
					for (uint32_t e = 0; e < call->n_succ; e++)
						if (!push_work(p, &sp, g->succ[call->succ + e], GFRAME_CTX))
							return GSTATE_DEAD;
				}
			} else {
				/* a callee ended: continue after its call, once per parent frame */
				if (p->f_rstamp[parent] == p->stamp)
					continue;
				p->f_rstamp[parent] = p->stamp;
				const struct gnode *call = &g->nodes[p->f_node[parent]];
				for (uint32_t e = 0; e < call->n_succ; e++)
					if (!push_work(p, &sp, g->succ[call->succ + e], p->f_parent[parent]))
						return GSTATE_DEAD;
			}
			continue;
		}
		uint32_t f = frame_intern(p, node, parent);
		if (f == UINT32_MAX)
			return GSTATE_DEAD;
		if (f >= p->cap_frames || p->f_stamp[f] == p->stamp)
			continue;
		p->f_stamp[f] = p->stamp;
		if (d->kind == GN_TERM) {
			if (n_out + 3 > p->cap_out) {
				size_t cap = p->cap_out ? p->cap_out * 2 : 64;
				uint32_t *o = realloc(p->out, cap * sizeof *o);
				if (!o) {
					p->err = HEARTH_ENOMEM;
					return GSTATE_DEAD;
				}
				p->out = o;
				p->cap_out = cap;
			}
			p->out[n_out++] = f;
			if (n_out > GPOOL_MAX_STACKS) {
				p->err = HEARTH_ERANGE;
				return GSTATE_DEAD;
			}
		} else {
			const struct grule *R = &g->rules[d->arg];
			for (uint32_t e = 0; e < R->n_start; e++)
				if (!push_work(p, &sp, g->succ[R->start + e], f))
					return GSTATE_DEAD;
		}
	}
	if (p->err)
		return GSTATE_DEAD;
	if (n_out + 2 > p->cap_out) {
		uint32_t *o = realloc(p->out, (n_out + 2) * sizeof *o);
		if (!o) {
			p->err = HEARTH_ENOMEM;
			return GSTATE_DEAD;
		}
		p->out = o;
		p->cap_out = n_out + 2;
	}
	if (end_root)
		p->out[n_out++] = GFRAME_ROOT;
	if (end_bottom)
		p->out[n_out++] = GFRAME_BOTTOM;
	qsort(p->out, n_out, sizeof *p->out, cmp_u32);
	return state_intern(p, p->out, (uint32_t)n_out);
}

uint32_t gpool_start(struct gpool *p)
{
	const struct grule *R = &p->g->rules[p->g->root];
	size_t sp = 0;
	for (uint32_t e = 0; e < R->n_start; e++)
		if (!push_work(p, &sp, p->g->succ[R->start + e], GFRAME_ROOT))
			return GSTATE_DEAD;
	return close_and_intern(p, sp);
}

uint32_t gpool_single(struct gpool *p, uint32_t term_node)
{
	uint32_t f = frame_intern(p, term_node, GFRAME_BOTTOM);
	if (f == UINT32_MAX)
		return GSTATE_DEAD;
	return state_intern(p, &f, 1);
}

uint32_t gpool_step_slow(struct gpool *p, uint32_t state, uint8_t byte)
{
	if (state == GSTATE_DEAD)
		return GSTATE_DEAD;
	uint64_t key = (uint64_t)state << 8 | byte;
	uint32_t slot = gpool_memo_slot(p, key);
	const struct grammar *g = p->g;
	uint32_t n = p->s_len[state];
	size_t sp = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t f = p->s_data[p->s_off[state] + i];
		if (f <= GFRAME_CTX)
			continue;
		const struct gnode *d = &g->nodes[p->f_node[f]];
		if (!gset_has(g->sets[d->arg], byte))
			continue;
		for (uint32_t e = 0; e < d->n_succ; e++)
			if (!push_work(p, &sp, g->succ[d->succ + e], p->f_parent[f]))
				return GSTATE_DEAD;
	}
	uint32_t next = close_and_intern(p, sp);
	if (!p->err) {
		p->memo_key[slot] = key;
		p->memo_val[slot] = next;
	}
	return next;
}

bool grammar_accepts(const struct grammar *g, const char *s, size_t len)
{
	struct gpool p;
	if (gpool_init(&p, g, 10, 1u << 22))
		return false;
	uint32_t st = gpool_start(&p);
	for (size_t i = 0; i < len && st != GSTATE_DEAD; i++)
		st = gpool_step(&p, st, (uint8_t)s[i]);
	bool ok = !p.err && st != GSTATE_DEAD && gpool_can_end(&p, st);
	gpool_free(&p);
	return ok;
}
