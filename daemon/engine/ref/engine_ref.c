/* Reference engine: a batch is run span by span through model_forward. Sequences own a
 * model_ctx sized by what they reserved, so the budget is real memory, not a promise. */
#include "daemon/engine/ref/engine_ref.h"

#include <stdlib.h>

/* Each span writes its rows straight into the caller's buffer, so any number fits; this
 * bounds only what the scheduler asks for in one step. */
#define ENGINE_REF_LOGIT_ROWS 256

struct engine_seq {
	struct model_ctx *ctx;
	uint32_t reserved;
};

struct engine_ref {
	const struct model *m;
	uint32_t max_context;
	uint64_t kv_tokens;     /* the budget in tokens */
	uint64_t kv_reserved;   /* tokens reserved by open sequences */
	float *scratch_logits;  /* for spans whose logits nobody wants */
};

uint64_t engine_ref_kv_bytes_per_token(const struct model *m)
{
	uint64_t b = 0;
	for (uint32_t l = 0; l < m->hp.n_layer; l++) {
		const struct model_layer *L = &m->layers[l];
		b += (uint64_t)L->n_head_kv * (L->head_dim + L->head_dim_v) * sizeof(float);
	}
	return b;
}

static int ref_seq_open(void *impl, const int32_t *prompt, uint32_t n_prompt, uint32_t n_reserve, uint64_t share,
			struct engine_seq **out, uint32_t *n_cached, struct hearth_error *err)
{
	struct engine_ref *e = impl;
	(void)prompt;
	(void)n_prompt;
	*out = NULL;
	*n_cached = 0;
	if (e->kv_reserved + n_reserve > e->kv_tokens)
		return hearth_error_set(err, HEARTH_EKVFULL,
					"KV budget full: %llu of %llu tokens reserved, %u more asked",
					(unsigned long long)e->kv_reserved,
					(unsigned long long)e->kv_tokens, n_reserve);
	struct engine_seq *s = calloc(1, sizeof *s);
	if (!s)
		return hearth_error_set(err, HEARTH_ENOMEM, "engine: out of memory for a sequence");
	int rc = model_ctx_new(&s->ctx, e->m, n_reserve, err);
	if (rc < 0) {
		free(s);
		return rc;
	}
	s->reserved = n_reserve;
	e->kv_reserved += n_reserve;
	*out = s;
	return 0;
}

static void ref_seq_close(void *impl, struct engine_seq *s)
{
	struct engine_ref *e = impl;
	if (!s)
		return;
	e->kv_reserved -= s->reserved;
	model_ctx_free(s->ctx);
	free(s);
}

static int ref_forward(void *impl, const struct engine_span *spans, size_t n_spans,
		       struct hearth_error *err)
{
	struct engine_ref *e = impl;
	for (size_t i = 0; i < n_spans; i++) {
		const struct engine_span *sp = &spans[i];
		if (sp->embd) {
			if (sp->logits)
				return hearth_error_set(err, HEARTH_EINVAL,
							"engine: a span wants both logits and embeddings");
			int rc = model_forward(e->m, sp->seq->ctx, sp->tokens, sp->n, MODEL_EMBD_ALL,
					       sp->embd, err);
			if (rc < 0)
				return rc;
			continue;
		}
		float *out = sp->logits ? sp->logits : e->scratch_logits;
		uint32_t rows = sp->logits && sp->n_logits > 1 ? sp->n_logits : 1;
		if (rows > sp->n)
			return hearth_error_set(err, HEARTH_EINVAL, "engine: %u logit rows of a %u-token span",
						rows, sp->n);
		/* The rows are the span's last tokens': the head before them is a plain run (the
		 * result does not depend on how a sequence is split into calls). */
		int rc = 0;
		if (rows < sp->n)
			rc = model_forward(e->m, sp->seq->ctx, sp->tokens, sp->n - rows, MODEL_LOGITS_LAST,
					   e->scratch_logits, err);
		if (rc >= 0)
			rc = model_forward(e->m, sp->seq->ctx, sp->tokens + sp->n - rows, rows,
					   rows > 1 ? MODEL_LOGITS_ALL : MODEL_LOGITS_LAST, out, err);
		if (rc < 0)
			return rc;
	}
	return 0;
}

static int ref_seq_truncate(void *impl, struct engine_seq *s, uint32_t n_past, struct hearth_error *err)
{
	(void)impl;
	if (n_past > model_ctx_n_past(s->ctx))
		return hearth_error_set(err, HEARTH_EINVAL, "engine: truncate to %u of %u positions", n_past,
					model_ctx_n_past(s->ctx));
	model_ctx_truncate(s->ctx, n_past);
	return 0;
}

static void ref_kv_usage(void *impl, uint64_t *used, uint64_t *total)
{
	struct engine_ref *e = impl;
	uint64_t per_token = engine_ref_kv_bytes_per_token(e->m);
	*used = e->kv_reserved * per_token;
	*total = e->kv_tokens * per_token;
}

int engine_ref_new(struct engine_ref **out, const struct model *m, uint32_t max_context,
		   uint64_t kv_budget, struct engine *eng, struct hearth_error *err)
{
	*out = NULL;
	uint64_t per_token = engine_ref_kv_bytes_per_token(m);
	if (per_token == 0 || kv_budget / per_token == 0)
		return hearth_error_set(err, HEARTH_EINVAL,
					"kv_budget of %llu bytes holds no token (%llu bytes each)",
					(unsigned long long)kv_budget, (unsigned long long)per_token);
	struct engine_ref *e = calloc(1, sizeof *e);
	if (!e)
		return hearth_error_set(err, HEARTH_ENOMEM, "engine: out of memory");
	e->scratch_logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
	if (!e->scratch_logits) {
		free(e);
		return hearth_error_set(err, HEARTH_ENOMEM, "engine: out of memory for logits");
	}
	e->m = m;
	e->max_context = max_context;
	e->kv_tokens = kv_budget / per_token;
	*eng = (struct engine){
		.impl = e,
		.n_vocab = m->hp.n_vocab,
		.n_embd = m->hp.n_embd,
		.pooling = m->hp.pooling,
		.max_context = max_context,
		.kv_tokens = e->kv_tokens,
		.seq_open = ref_seq_open,
		.seq_close = ref_seq_close,
		.forward = ref_forward,
		.seq_truncate = ref_seq_truncate,
		.max_logit_rows = ENGINE_REF_LOGIT_ROWS,
		.kv_usage = ref_kv_usage,
	};
	*out = e;
	return 0;
}

void engine_ref_free(struct engine_ref *e)
{
	if (!e)
		return;
	free(e->scratch_logits);
	free(e);
}
