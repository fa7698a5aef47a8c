/* Embedding pooling: one vector from a sequence's final hidden states (after the output
 * norm, the tensor llama.cpp pools as result_norm), by the file's or the request's pooling,
 * then L2-normalised as llama.cpp's embedding examples do. Pure arithmetic, no model. */
#ifndef HEARTH_ENGINE_EMBED_H
#define HEARTH_ENGINE_EMBED_H

#include <stdbool.h>
#include <stddef.h>

#include "daemon/engine/model.h"
#include "protocol/error.h"

/* Pools rows as they come, a prefill chunk at a time, so a long input never needs all its
 * hidden states at once: the scheduler holds n_embd doubles per sequence, not n_pos rows.
 * acc is the caller's (n_embd doubles); the pooler owns nothing. */
struct embed_pooler {
	enum model_pooling pooling;
	size_t n_embd;
	size_t n_pos;           /* rows added so far */
	double *acc;            /* MEAN: the sum of the rows; CLS: the first; LAST: the latest */
};

/* NONE, RANK and UNSPECIFIED have no single vector: HEARTH_EINVAL naming the pooling. */
int embed_pooler_init(struct embed_pooler *p, enum model_pooling pooling, size_t n_embd, double *acc,
		      struct hearth_error *err);
/* rows: n_rows x n_embd floats, the next positions in order. */
void embed_pooler_add(struct embed_pooler *p, const float *rows, size_t n_rows);
/* out: n_embd floats, scaled to unit L2 norm when normalize (a zero vector stays zero: there
 * is no direction to keep). HEARTH_EINVAL when no row was added. */
int embed_pooler_finish(const struct embed_pooler *p, bool normalize, float *out, struct hearth_error *err);

/* The name of a pooling as llama.cpp's --pooling spells it ("mean", "cls", "last", "none",
 * "rank"), "unspecified" for a file without pooling_type; and back (false: not one of the
 * three that give a vector). */
const char *embed_pooling_name(enum model_pooling pooling);
bool embed_pooling_parse(const char *name, size_t len, enum model_pooling *out);

/* All rows at once: hidden holds n_pos rows of n_embd floats, row i = position i; out gets
 * n_embd floats. The pooler over one chunk (HEARTH_ENOMEM when its n_embd doubles cannot be
 * had). */
int embed_pool(const float *hidden, size_t n_pos, size_t n_embd, enum model_pooling pooling,
	       bool normalize, float *out, struct hearth_error *err);

#endif
