/* The f32 reference forward pass over a model_load'ed model: per-sequence state and the
 * forward call. The oracle every faster path is held to. */
#ifndef HEARTH_ENGINE_REF_FORWARD_H
#define HEARTH_ENGINE_REF_FORWARD_H

#include "daemon/engine/model.h"

/* One sequence's state: its KV cache and the scratch a forward pass needs. A model is
 * read-only after model_load, so contexts may run forward passes on different threads. */
struct model_ctx;

enum model_logits {
	MODEL_LOGITS_LAST,      /* logits_out holds n_vocab floats: the last token's */
	MODEL_LOGITS_ALL,       /* logits_out holds n x n_vocab floats: every token's */
	MODEL_EMBD_ALL,         /* logits_out holds n x n_embd floats: every token's final hidden
				 * state after the output norm (what embeddings pool), no head */
};

/* A fresh sequence able to hold max_ctx positions (<= opts.max_ctx). */
int model_ctx_new(struct model_ctx **out, const struct model *m, uint32_t max_ctx,
		  struct hearth_error *err);
void model_ctx_free(struct model_ctx *c);
/* Forget every position: the next token is at position 0. */
void model_ctx_reset(struct model_ctx *c);
/* Positions already in the KV cache. */
uint32_t model_ctx_n_past(const struct model_ctx *c);
/* Forget positions n_past.. (a rejected draft's): the next token is at n_past. A larger
 * n_past than held changes nothing. */
void model_ctx_truncate(struct model_ctx *c, uint32_t n_past);
uint32_t model_ctx_max(const struct model_ctx *c);

/* Called with every weight matrix's input before the product (n_tok rows of w->ne[0]
 * floats): how a quantizer measures which columns the activations lean on (the
 * importance a calibration pass collects). NULL turns it off; off by default. */
typedef void (*model_observe_fn)(void *arg, const struct gguf_tensor *w, const float *x, size_t n_tok);
void model_ctx_observe(struct model_ctx *c, model_observe_fn fn, void *arg);

/* Runs tokens[0..n) at positions n_past.. and appends them to the KV cache. Fails with
 * HEARTH_EKVFULL (and changes nothing) when they do not fit, HEARTH_EINVAL for a token
 * outside the vocabulary. The result does not depend on how a sequence is split into
 * calls. */
int model_forward(const struct model *m, struct model_ctx *c, const int32_t *tokens, size_t n,
		  enum model_logits which, float *logits_out, struct hearth_error *err);

#endif
