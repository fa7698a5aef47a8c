/* Random walks over the grammar automaton (see grammar_walk.h). Uses the engine's internal
 * states; the distance to an accepting state is computed here from the rule graph. */
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/grammar_impl.h"
#include "tests/support/grammar_walk.h"

struct gwalk {
	const struct grammar *g;
	struct gpool pool;
	uint64_t *m;       /* per node: fewest bytes from entering it to its rule's END */
	uint64_t *minlen;  /* per rule */
};

#define INF_DIST (UINT64_MAX / 4)

uint64_t gwalk_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static uint64_t succ_min(const struct gwalk *w, uint32_t first, uint32_t n)
{
	uint64_t best = INF_DIST;
	for (uint32_t e = 0; e < n; e++) {
		uint64_t v = w->m[w->g->succ[first + e]];
		if (v < best)
			best = v;
	}
	return best;
}

struct gwalk *gwalk_new(const struct grammar *g)
{
	struct gwalk *w = calloc(1, sizeof *w);
	if (!w)
		return NULL;
	w->g = g;
	w->m = malloc((g->n_nodes + 1) * sizeof *w->m);
	w->minlen = malloc((g->n_rules + 1) * sizeof *w->minlen);
	if (!w->m || !w->minlen || gpool_init(&w->pool, g, 16, 1u << 22)) {
		free(w->m);
		free(w->minlen);
		free(w);
		return NULL;
	}
	for (uint32_t v = 0; v < g->n_nodes; v++)
		w->m[v] = g->nodes[v].kind == GN_END ? 0 : INF_DIST;
	for (uint32_t r = 0; r < g->n_rules; r++)
		w->minlen[r] = INF_DIST;
	/* relax until stable (Bellman-Ford over a graph with positive or zero weights) */
	for (int changed = 1; changed;) {
		changed = 0;
		for (uint32_t v = 0; v < g->n_nodes; v++) {
			const struct gnode *d = &g->nodes[v];
			if (d->kind == GN_END)
				continue;
			uint64_t after = succ_min(w, d->succ, d->n_succ);
			uint64_t self = d->kind == GN_TERM ? 1 : w->minlen[d->arg];
			uint64_t t = after + self < INF_DIST ? after + self : INF_DIST;
			if (t < w->m[v]) {
				w->m[v] = t;
				changed = 1;
			}
		}
		for (uint32_t r = 0; r < g->n_rules; r++) {
			uint64_t t = succ_min(w, g->rules[r].start, g->rules[r].n_start);
			if (t < w->minlen[r]) {
				w->minlen[r] = t;
				changed = 1;
			}
		}
	}
	return w;
}

void gwalk_free(struct gwalk *w)
{
	if (!w)
		return;
	gpool_free(&w->pool);
	free(w->m);
	free(w->minlen);
	free(w);
}

/* Fewest bytes from this state to an accepting one. */
static uint64_t state_dist(const struct gwalk *w, uint32_t st)
{
	uint32_t n;
	const uint32_t *fr = gpool_frames(&w->pool, st, &n);
	uint64_t best = INF_DIST;
	for (uint32_t i = 0; i < n; i++) {
		if (fr[i] == GFRAME_ROOT)
			return 0;
		uint32_t f = fr[i];
		const struct gnode *d = &w->g->nodes[w->pool.f_node[f]];
		uint64_t t = 1 + succ_min(w, d->succ, d->n_succ);
		for (uint32_t p = w->pool.f_parent[f]; p > GFRAME_CTX && t < INF_DIST; p = w->pool.f_parent[p]) {
			const struct gnode *c = &w->g->nodes[w->pool.f_node[p]];
			t += succ_min(w, c->succ, c->n_succ);
		}
		if (t < best)
			best = t;
	}
	return best;
}

long gwalk_sample(struct gwalk *w, uint64_t *rng, size_t budget, char *out, size_t cap)
{
	const struct grammar *g = w->g;
	uint32_t st = gpool_start(&w->pool);
	size_t n = 0;
	for (;;) {
		if (w->pool.err || st == 0)
			return -1;
		bool can_end = gpool_can_end(&w->pool, st);
		uint32_t nf;
		const uint32_t *fr = gpool_frames(&w->pool, st, &nf);
		uint64_t u[4] = { 0 };
		for (uint32_t i = 0; i < nf; i++)
			if (fr[i] > GFRAME_CTX)
				for (int k = 0; k < 4; k++)
					u[k] |= g->sets[g->nodes[w->pool.f_node[fr[i]]].arg][k];
		int count = 0;
		for (int k = 0; k < 4; k++)
			count += __builtin_popcountll(u[k]);
		if (count == 0 || (can_end && (n >= budget || gwalk_rand(rng) % 8 == 0)))
			return can_end ? (long)n : -1;
		if (n >= cap)
			return -1;
		int pick = -1;
		if (n < budget) {
			int k = (int)(gwalk_rand(rng) % (uint64_t)count);
			for (int b = 0; b < 256; b++)
				if (gset_has(u, (unsigned)b) && k-- == 0) {
					pick = b;
					break;
				}
		} else {
			/* heading home: the byte whose state is closest to an end (random ties) */
			uint64_t best = INF_DIST;
			int ties = 0;
			for (int b = 0; b < 256; b++) {
				if (!gset_has(u, (unsigned)b))
					continue;
				uint32_t nx = gpool_step(&w->pool, st, (uint8_t)b);
				if (nx == 0)
					continue;
				uint64_t d = state_dist(w, nx);
				if (d < best) {
					best = d;
					pick = b;
					ties = 1;
				} else if (d == best && gwalk_rand(rng) % (uint64_t)++ties == 0) {
					pick = b;
				}
			}
		}
		if (pick < 0)
			return -1;
		out[n++] = (char)pick;
		st = gpool_step(&w->pool, st, (uint8_t)pick);
	}
}
