/* Random strings from a compiled grammar, for tests: a walk over the byte automaton that
 * picks random allowed bytes until a length budget is spent, then bytes that bring the
 * shortest completion closer, so every walk ends in an accepted string. */
#ifndef HEARTH_TESTS_GRAMMAR_WALK_H
#define HEARTH_TESTS_GRAMMAR_WALK_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/engine/grammar.h"

struct gwalk;
struct gwalk *gwalk_new(const struct grammar *g);
void gwalk_free(struct gwalk *w);
/* Writes one string (at most cap bytes) and returns its length, or -1 when cap was too
 * small or the automaton's bounds were hit. budget: random bytes before heading home. */
long gwalk_sample(struct gwalk *w, uint64_t *rng, size_t budget, char *out, size_t cap);

uint64_t gwalk_rand(uint64_t *s);

#endif
