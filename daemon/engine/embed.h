/* Embedding pooling: one vector from a sequence's final hidden states (after the output
 * norm, the tensor llama.cpp pools as result_norm), by the file's or the request's pooling,
 * then L2-normalised as llama.cpp's embedding examples do. Pure arithmetic, no model. */
#ifndef HEARTH_ENGINE_EMBED_H
#define HEARTH_ENGINE_EMBED_H

#include <stdbool.h>
#include <stddef.h>

#include "daemon/engine/model.h"
#include "protocol/error.h"

/* hidden: n_pos rows of n_embd floats, row i = position i. out: n_embd floats. MEAN averages
 * the rows, CLS takes the first, LAST the last; NONE and RANK have no single vector and are
 * refused, as is n_pos 0. With normalize, out is scaled to unit L2 norm (a zero vector stays
 * zero: there is no direction to keep). */
int embed_pool(const float *hidden, size_t n_pos, size_t n_embd, enum model_pooling pooling,
		   bool normalize, float *out, struct hearth_error *err);

#endif
