/* The f32 reference forward pass: one sequence's KV cache and scratch (model_ctx) and the
 * plain forward over a batch of tokens (model_forward). Written to be read top to bottom,
 * like llama2.c's run.c; it is the oracle the int4 engine and llama.cpp are held to. */
#include "daemon/engine/ref/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "kernels/quant.h"

/* Tokens per internal forward chunk: bounds the scratch; a longer batch is run in chunks,
 * which gives the same result because attention is causal. */
#define MODEL_CHUNK 64

/* ------------------------------------------------------------------------------------ */
/* Sequence state: KV cache and scratch                                                  */

struct model_ctx {
	const struct model *m;
	uint32_t max_ctx;
	uint32_t n_past;
	uint32_t n_chunk;       /* tokens per internal forward chunk */

	/* The KV cache: per layer, max_ctx positions of n_head_kv x head_dim floats (K) and
	 * n_head_kv x head_dim_v floats (V), contiguous. Only kv_k/kv_v know this layout, so
	 * the paged pool can replace it. */
	float *k_cache, *v_cache;
	size_t *k_off, *v_off;  /* per layer, in floats */

	/* Scratch for one chunk of n_chunk tokens; widths are the maxima over layers. */
	float *x;               /* residual stream    n_chunk x n_embd */
	float *xb;              /* normed input       n_chunk x n_embd */
	float *xb2;             /* a block's output   n_chunk x n_embd */
	float *q;               /*                    n_chunk x max n_head*head_dim */
	float *k;               /*                    n_chunk x max n_head_kv*head_dim */
	float *v;               /*                    n_chunk x max n_head_kv*head_dim_v */
	float *att;             /* attention output   n_chunk x max n_head*head_dim_v */
	float *hb, *hb2;        /* ffn gate and up    n_chunk x max n_ff */
	float *scores;          /* one head's scores  max_ctx */
	float *head_q;          /* one query head     max head_dim */
	float *head_acc;        /* one head's output  max head_dim_v */
	float *row;             /* one dequantized weight row: max row length */
	model_observe_fn observe;
	void *observe_arg;
};

static float to_f16(float x)
{
	return quant_fp16_to_f32(quant_f32_to_fp16(x));
}

static float *kv_k(struct model_ctx *c, uint32_t layer, uint32_t pos)
{
	const struct model_layer *L = &c->m->layers[layer];
	return c->k_cache + c->k_off[layer] + (size_t)pos * L->n_head_kv * L->head_dim;
}

static float *kv_v(struct model_ctx *c, uint32_t layer, uint32_t pos)
{
	const struct model_layer *L = &c->m->layers[layer];
	return c->v_cache + c->v_off[layer] + (size_t)pos * L->n_head_kv * L->head_dim_v;
}

/* Writes one position's keys and values (n_head_kv heads each) into the cache. */
static void kv_store(struct model_ctx *c, uint32_t layer, uint32_t pos, const float *k,
		     const float *v)
{
	const struct model_layer *L = &c->m->layers[layer];
	const size_t w_k = (size_t)L->n_head_kv * L->head_dim;
	const size_t w_v = (size_t)L->n_head_kv * L->head_dim_v;
	float *kd = kv_k(c, layer, pos), *vd = kv_v(c, layer, pos);

	for (size_t i = 0; i < w_k; i++)
		kd[i] = c->m->opts.kv_type == MODEL_KV_F16 ? to_f16(k[i]) : k[i];
	for (size_t i = 0; i < w_v; i++)
		vd[i] = c->m->opts.kv_type == MODEL_KV_F16 ? to_f16(v[i]) : v[i];
}

/* calloc of a x b floats, overflow-checked. */
static float *floats_new(size_t a, size_t b)
{
	size_t n;
	if (__builtin_mul_overflow(a, b, &n) || n > SIZE_MAX / sizeof(float))
		return NULL;
	return calloc(n ? n : 1, sizeof(float));
}

static size_t max_sz(size_t a, size_t b)
{
	return a > b ? a : b;
}

void model_ctx_free(struct model_ctx *c)
{
	if (!c)
		return;
	free(c->k_cache);
	free(c->v_cache);
	free(c->k_off);
	free(c->v_off);
	free(c->x);
	free(c->xb);
	free(c->xb2);
	free(c->q);
	free(c->k);
	free(c->v);
	free(c->att);
	free(c->hb);
	free(c->hb2);
	free(c->scores);
	free(c->head_q);
	free(c->head_acc);
	free(c->row);
	free(c);
}

int model_ctx_new(struct model_ctx **out, const struct model *m, uint32_t max_ctx,
		  struct hearth_error *err)
{
	const struct model_hparams *hp = &m->hp;
	size_t w_q = 0, w_k = 0, w_v = 0, w_att = 0, w_ff = 0, k_total = 0, v_total = 0;
	size_t hd = 0, hd_v = 0;
	struct model_ctx *c;

	*out = NULL;
	if (max_ctx == 0 || max_ctx > m->opts.max_ctx)
		return hearth_error_set(err, HEARTH_EINVAL,
					"model: context of %u positions outside 1..%u (max_ctx)",
					max_ctx, m->opts.max_ctx);
	c = calloc(1, sizeof(*c));
	if (!c)
		return hearth_error_set(err, HEARTH_ENOMEM, "model: out of memory");
	c->m = m;
	c->max_ctx = max_ctx;
	c->n_chunk = max_ctx < MODEL_CHUNK ? max_ctx : MODEL_CHUNK;
	c->k_off = calloc(hp->n_layer, sizeof(*c->k_off));
	c->v_off = calloc(hp->n_layer, sizeof(*c->v_off));
	if (!c->k_off || !c->v_off)
		goto nomem;

	for (uint32_t l = 0; l < hp->n_layer; l++) {
		const struct model_layer *L = &m->layers[l];
		size_t k_layer, v_layer;

		w_q = max_sz(w_q, (size_t)L->n_head * L->head_dim);
		w_k = max_sz(w_k, (size_t)L->n_head_kv * L->head_dim);
		w_v = max_sz(w_v, (size_t)L->n_head_kv * L->head_dim_v);
		w_att = max_sz(w_att, (size_t)L->n_head * L->head_dim_v);
		w_ff = max_sz(w_ff, L->n_ff);
		hd = max_sz(hd, L->head_dim);
		hd_v = max_sz(hd_v, L->head_dim_v);
		c->k_off[l] = k_total;
		c->v_off[l] = v_total;
		if (__builtin_mul_overflow((size_t)L->n_head_kv * L->head_dim, (size_t)max_ctx, &k_layer) ||
		    __builtin_mul_overflow((size_t)L->n_head_kv * L->head_dim_v, (size_t)max_ctx, &v_layer) ||
		    __builtin_add_overflow(k_total, k_layer, &k_total) ||
		    __builtin_add_overflow(v_total, v_layer, &v_total))
			goto nomem;
	}

	c->k_cache = floats_new(k_total, 1);
	c->v_cache = floats_new(v_total, 1);
	c->x = floats_new(c->n_chunk, hp->n_embd);
	c->xb = floats_new(c->n_chunk, hp->n_embd);
	c->xb2 = floats_new(c->n_chunk, hp->n_embd);
	c->q = floats_new(c->n_chunk, w_q);
	c->k = floats_new(c->n_chunk, w_k);
	c->v = floats_new(c->n_chunk, w_v);
	c->att = floats_new(c->n_chunk, w_att);
	c->hb = floats_new(c->n_chunk, w_ff);
	c->hb2 = floats_new(c->n_chunk, w_ff);
	c->scores = floats_new(max_ctx, 1);
	c->head_q = floats_new(hd, 1);
	c->head_acc = floats_new(hd_v, 1);
	c->row = floats_new(max_sz(max_sz(hp->n_embd, w_att), w_ff), 1);
	if (!c->k_cache || !c->v_cache || !c->x || !c->xb || !c->xb2 || !c->q || !c->k || !c->v ||
	    !c->att || !c->hb || !c->hb2 || !c->scores || !c->head_q || !c->head_acc || !c->row)
		goto nomem;
	*out = c;
	return 0;
nomem:
	model_ctx_free(c);
	return hearth_error_set(err, HEARTH_ENOMEM,
				"model: out of memory for a context of %u positions", max_ctx);
}

void model_ctx_reset(struct model_ctx *c)
{
	c->n_past = 0;
}

void model_ctx_observe(struct model_ctx *c, model_observe_fn fn, void *arg)
{
	c->observe = fn;
	c->observe_arg = arg;
}

void model_ctx_truncate(struct model_ctx *c, uint32_t n_past)
{
	if (n_past < c->n_past)
		c->n_past = n_past;
}

uint32_t model_ctx_n_past(const struct model_ctx *c)
{
	return c->n_past;
}

uint32_t model_ctx_max(const struct model_ctx *c)
{
	return c->max_ctx;
}

/* ------------------------------------------------------------------------------------ */
/* Forward pass                                                                          */

static size_t row_bytes_of(const struct gguf_tensor *t)
{
	size_t bytes = 0;
	qtype_row_bytes(t->type, t->ne[0], &bytes); /* validated at load */
	return bytes;
}

/* y (n_tok x rows of W) = x (n_tok x W's row length) times W transposed. */
static void matmul(struct model_ctx *c, const struct gguf_tensor *w, const float *x, size_t n_tok,
		   float *y)
{
	if (c->observe)
		c->observe(c->observe_arg, w, x, n_tok);
	ops_ref_matmul(w->type, w->data, row_bytes_of(w), w->ne[0], w->ne[1], x, n_tok, y, c->row);
}

static void add_bias(const struct gguf_tensor *b, float *y, size_t n_tok, size_t width)
{
	if (!b)
		return;
	for (size_t t = 0; t < n_tok; t++)
		ops_ref_add(y + t * width, b->data, width);
}

/* Gemma's norm of a block's output (n_tok rows of width) before the residual add; a
 * model without one (w NULL) adds the output as it is. */
static void post_norm(const struct gguf_tensor *w, float *y, size_t n_tok, size_t width, float eps)
{
	if (!w)
		return;
	for (size_t t = 0; t < n_tok; t++)
		ops_ref_rmsnorm(y + t * width, y + t * width, w->data, width, eps);
}

/* One query head over cache positions first..first+n_seen-1 of KV head kvh, exactly:
 * out = softmax(scale * q.K) V. */
static void attend_f32(struct model_ctx *c, uint32_t layer, const float *q, size_t kvh,
		       uint32_t first, size_t n_seen, float *out)
{
	const struct model_layer *L = &c->m->layers[layer];

	for (size_t i = 0; i < n_seen; i++) {
		const float *k = kv_k(c, layer, first + (uint32_t)i) + kvh * L->head_dim;
		c->scores[i] = (float)ops_ref_dot(q, k, L->head_dim) * L->attn_scale;
	}
	ops_ref_softmax(c->scores, n_seen);
	for (size_t d = 0; d < L->head_dim_v; d++) {
		double sum = 0.0;
		for (size_t i = 0; i < n_seen; i++)
			sum += (double)c->scores[i] *
			       kv_v(c, layer, first + (uint32_t)i)[kvh * L->head_dim_v + d];
		out[d] = (float)sum;
	}
}

/* The same, as llama.cpp's CPU flash attention computes it over an f16 cache (K and V were
 * rounded when stored): q rounded to f16; one pass over the positions keeping the running
 * maximum M and sum S of exp(score - M), the weighted V sum held in f16 and rescaled
 * whenever M grows; out = acc / S. */
static void attend_f16(struct model_ctx *c, uint32_t layer, const float *q, size_t kvh,
		       uint32_t first, size_t n_seen, float *out)
{
	const struct model_layer *L = &c->m->layers[layer];
	float *q16 = c->head_q, *acc = c->head_acc;
	float max = -INFINITY, sum = 0.0f;

	for (size_t d = 0; d < L->head_dim; d++)
		q16[d] = to_f16(q[d]);
	for (size_t d = 0; d < L->head_dim_v; d++)
		acc[d] = 0.0f;
	for (size_t i = 0; i < n_seen; i++) {
		const float *k = kv_k(c, layer, first + (uint32_t)i) + kvh * L->head_dim;
		const float *v = kv_v(c, layer, first + (uint32_t)i) + kvh * L->head_dim_v;
		const float s = (float)ops_ref_dot(q16, k, L->head_dim) * L->attn_scale;
		float rescale = 1.0f, weight = 1.0f;

		if (s > max) {
			rescale = expf(max - s);
			max = s;
			for (size_t d = 0; d < L->head_dim_v; d++)
				acc[d] = to_f16(acc[d] * rescale);
		} else {
			weight = expf(s - max);
		}
		for (size_t d = 0; d < L->head_dim_v; d++)
			acc[d] = to_f16(acc[d] + v[d] * weight);
		sum = sum * rescale + weight;
	}
	for (size_t d = 0; d < L->head_dim_v; d++)
		out[d] = acc[d] / sum;
}

/* Causal attention of the chunk's n_tok queries (at positions pos0..) over the cache,
 * which already holds their own keys and values. GQA: query head h reads KV head
 * h / (n_head / n_head_kv). A sliding-window layer sees its last `window` positions. */
static void attention(struct model_ctx *c, uint32_t layer, uint32_t pos0, size_t n_tok)
{
	const struct model_layer *L = &c->m->layers[layer];
	const size_t group = L->n_head / L->n_head_kv;
	const size_t w_q = (size_t)L->n_head * L->head_dim;
	const size_t w_att = (size_t)L->n_head * L->head_dim_v;

	for (size_t t = 0; t < n_tok; t++) {
		const uint32_t pos = pos0 + (uint32_t)t;
		const uint32_t first = (L->window && pos + 1 > L->window) ? pos + 1 - L->window : 0;
		const size_t n_seen = pos + 1 - first;

		for (size_t h = 0; h < L->n_head; h++) {
			const float *q = c->q + t * w_q + h * L->head_dim;
			float *out = c->att + t * w_att + h * L->head_dim_v;

			if (c->m->opts.kv_type == MODEL_KV_F16)
				attend_f16(c, layer, q, h / group, first, n_seen, out);
			else
				attend_f32(c, layer, q, h / group, first, n_seen, out);
		}
	}
}

/* One chunk of at most n_chunk tokens at positions n_past..; logits for every token
 * (which == ALL: n_tok x n_vocab), for the last one only, or none (logits NULL). */
static void forward_chunk(const struct model *m, struct model_ctx *c, const int32_t *tokens,
			  size_t n_tok, enum model_logits which, float *logits)
{
	const struct model_hparams *hp = &m->hp;
	const size_t n_embd = hp->n_embd;
	const uint32_t pos0 = c->n_past;

	/* Embeddings: the file's rows, dequantized (and scaled, for gemma). */
	for (size_t t = 0; t < n_tok; t++) {
		float *x = c->x + t * n_embd;
		ops_ref_get_row(m->tok_embd->type, m->tok_embd->data, row_bytes_of(m->tok_embd),
				n_embd, (size_t)tokens[t], x);
		if (hp->embd_scale != 1.0f)
			for (size_t i = 0; i < n_embd; i++)
				x[i] *= hp->embd_scale;
	}

	for (uint32_t l = 0; l < hp->n_layer; l++) {
		const struct model_layer *L = &m->layers[l];
		const size_t w_q = (size_t)L->n_head * L->head_dim;
		const size_t w_k = (size_t)L->n_head_kv * L->head_dim;
		const size_t w_v = (size_t)L->n_head_kv * L->head_dim_v;

		/* Attention block: x += Wo * attention(rope(q), rope(k), v) of rmsnorm(x). */
		for (size_t t = 0; t < n_tok; t++)
			ops_ref_rmsnorm(c->xb + t * n_embd, c->x + t * n_embd, L->attn_norm->data,
					n_embd, hp->norm_eps);
		matmul(c, L->wq, c->xb, n_tok, c->q);
		matmul(c, L->wk, c->xb, n_tok, c->k);
		matmul(c, L->wv, c->xb, n_tok, c->v);
		add_bias(L->bq, c->q, n_tok, w_q);
		add_bias(L->bk, c->k, n_tok, w_k);
		add_bias(L->bv, c->v, n_tok, w_v);

		for (size_t t = 0; t < n_tok; t++) {
			float *qt = c->q + t * w_q, *kt = c->k + t * w_k;

			if (L->q_norm)
				for (size_t h = 0; h < L->n_head; h++)
					ops_ref_rmsnorm(qt + h * L->head_dim, qt + h * L->head_dim,
							L->q_norm->data, L->head_dim, hp->norm_eps);
			if (L->k_norm)
				for (size_t h = 0; h < L->n_head_kv; h++)
					ops_ref_rmsnorm(kt + h * L->head_dim, kt + h * L->head_dim,
							L->k_norm->data, L->head_dim, hp->norm_eps);
			ops_ref_rope(qt, L->n_head, L->head_dim, L->n_rot, hp->rope_style,
				     (int)(pos0 + t), L->rope_base, L->rope_scale, m->rope_freqs);
			ops_ref_rope(kt, L->n_head_kv, L->head_dim, L->n_rot, hp->rope_style,
				     (int)(pos0 + t), L->rope_base, L->rope_scale, m->rope_freqs);

			kv_store(c, l, pos0 + (uint32_t)t, kt, c->v + t * w_v);
		}

		attention(c, l, pos0, n_tok);
		matmul(c, L->wo, c->att, n_tok, c->xb2);
		add_bias(L->bo, c->xb2, n_tok, n_embd);
		post_norm(L->attn_post_norm, c->xb2, n_tok, n_embd, hp->norm_eps);
		ops_ref_add(c->x, c->xb2, n_tok * n_embd);

		/* Feed-forward block: x += down(act(gate(h)) * up(h)), h = rmsnorm(x), act silu
		 * (SwiGLU) or tanh-GELU (GeGLU). */
		for (size_t t = 0; t < n_tok; t++)
			ops_ref_rmsnorm(c->xb + t * n_embd, c->x + t * n_embd, L->ffn_norm->data,
					n_embd, hp->norm_eps);
		matmul(c, L->ffn_gate, c->xb, n_tok, c->hb);
		matmul(c, L->ffn_up, c->xb, n_tok, c->hb2);
		if (hp->ffn_act == MODEL_FFN_GELU)
			ops_ref_gelu_mul(c->hb, c->hb2, n_tok * L->n_ff);
		else
			ops_ref_silu_mul(c->hb, c->hb2, n_tok * L->n_ff);
		matmul(c, L->ffn_down, c->hb, n_tok, c->xb2);
		post_norm(L->ffn_post_norm, c->xb2, n_tok, n_embd, hp->norm_eps);
		ops_ref_add(c->x, c->xb2, n_tok * n_embd);
	}
	c->n_past += (uint32_t)n_tok;

	if (!logits)
		return;
	if (which == MODEL_EMBD_ALL) {
		for (size_t t = 0; t < n_tok; t++)
			ops_ref_rmsnorm(logits + t * n_embd, c->x + t * n_embd, m->output_norm->data,
					n_embd, hp->norm_eps);
		return;
	}
	/* Head: only the rows whose logits are wanted. */
	size_t first = which == MODEL_LOGITS_ALL ? 0 : n_tok - 1;
	for (size_t t = first; t < n_tok; t++)
		ops_ref_rmsnorm(c->xb + t * n_embd, c->x + t * n_embd, m->output_norm->data, n_embd,
				hp->norm_eps);
	matmul(c, m->output, c->xb + first * n_embd, n_tok - first, logits);
	if (hp->logit_softcap > 0.0f)
		ops_ref_softcap(logits, (n_tok - first) * hp->n_vocab, hp->logit_softcap);
}

int model_forward(const struct model *m, struct model_ctx *c, const int32_t *tokens, size_t n,
		  enum model_logits which, float *logits_out, struct hearth_error *err)
{
	if (n == 0)
		return hearth_error_set(err, HEARTH_EINVAL, "model: forward of zero tokens");
	if (n > (size_t)(c->max_ctx - c->n_past))
		return hearth_error_set(err, HEARTH_EKVFULL,
					"model: %zu tokens do not fit: %u of %u positions used", n,
					c->n_past, c->max_ctx);
	for (size_t i = 0; i < n; i++)
		if (tokens[i] < 0 || (uint32_t)tokens[i] >= m->hp.n_vocab)
			return hearth_error_set(err, HEARTH_EINVAL,
						"model: token %d at %zu outside the vocabulary of %u",
						tokens[i], i, m->hp.n_vocab);

	for (size_t start = 0; start < n; start += c->n_chunk) {
		size_t n_tok = n - start < c->n_chunk ? n - start : c->n_chunk;
		bool last = start + n_tok == n;
		float *logits = NULL;

		if (which == MODEL_LOGITS_ALL)
			logits = logits_out + start * m->hp.n_vocab;
		else if (which == MODEL_EMBD_ALL)
			logits = logits_out + start * m->hp.n_embd;
		else if (last)
			logits = logits_out;
		forward_chunk(m, c, tokens + start, n_tok, which, logits);
	}
	return 0;
}
