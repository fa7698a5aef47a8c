/* POST /v1/completions (plain text continuation, OpenAI's legacy completions shape) and the
 * small GET endpoints: /v1/models, /health, /metrics. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/openai/gw.h"
#include "client/openai/params.h"
#include "client/openai/reply.h"

static const char *const completion_fields[] = {
	"model", "prompt", "max_tokens", "temperature", "top_p", "stream", "stream_options", "stop", "seed",
	"logprobs", "n", "user", "echo", "frequency_penalty", "presence_penalty", "top_k", "min_p",
	"repeat_penalty", "response_format", "ignore_eos", "speculate", "draft", NULL,
};

/* prompt: a string, an array of one string, or an array of token ids. */
static bool prompt_of(json_t *body, struct hearth_prompt *pr, uint32_t **ids, struct gw_reply *r)
{
	json_t *p = json_object_get(body, "prompt");
	memset(pr, 0, sizeof *pr);
	*ids = NULL;
	if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
		p = json_array_get(p, 0);
	if (json_is_string(p)) {
		pr->text = json_string_value(p);
		pr->len = json_string_length(p);
		return true;
	}
	if (json_is_array(p) && json_array_size(p) > 0) {
		size_t i, n = json_array_size(p);
		json_t *v;
		*ids = malloc(n * sizeof **ids);
		if (!*ids)
			return false;
		json_array_foreach(p, i, v) {
			if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 0x7fffffff) {
				gw_reply_error(r, 400, "invalid_request_error", "prompt", "invalid_value",
					       "'prompt' must be a string, [string] or [token ids] (batches are not supported)");
				free(*ids);
				*ids = NULL;
				return false;
			}
			(*ids)[i] = (uint32_t)json_integer_value(v);
		}
		pr->tokens = *ids;
		pr->n_tokens = n;
		return true;
	}
	gw_reply_error(r, 400, "invalid_request_error", "prompt", "invalid_value",
		       "'prompt' must be a string, [string] or [token ids] (batches are not supported)");
	return false;
}

/* OpenAI's legacy logprobs: parallel arrays. */
struct legacy_lp {
	json_t *tokens, *token_logprobs, *top, *offsets;
	size_t offset;
};

static void legacy_add(struct gw *g, struct hearth *h, struct legacy_lp *l, const struct hearth_token *t)
{
	json_t *e = gw_logprob_entry(g, h, t);
	json_array_append(l->tokens, json_object_get(e, "token"));
	json_array_append_new(l->token_logprobs, json_real(t->logprob));
	json_t *top = json_object(), *alt;
	size_t i;
	json_array_foreach(json_object_get(e, "top_logprobs"), i, alt)
		json_object_set(top, json_string_value(json_object_get(alt, "token")), json_object_get(alt, "logprob"));
	json_array_append_new(l->top, top);
	json_array_append_new(l->offsets, json_integer((json_int_t)l->offset));
	l->offset += t->text_len;
	json_decref(e);
}

static json_t *legacy_json(struct legacy_lp *l)
{
	return json_pack("{s:O,s:O,s:O,s:O}", "tokens", l->tokens, "token_logprobs", l->token_logprobs,
			 "top_logprobs", l->top, "text_offset", l->offsets);
}

static void legacy_clear(struct legacy_lp *l)
{
	json_decref(l->tokens);
	json_decref(l->token_logprobs);
	json_decref(l->top);
	json_decref(l->offsets);
	memset(l, 0, sizeof *l);
}

static void legacy_init(struct legacy_lp *l)
{
	l->tokens = json_array();
	l->token_logprobs = json_array();
	l->top = json_array();
	l->offsets = json_array();
	l->offset = 0;
}

struct cmpl_stream {
	struct gw *g;
	struct hearth *h;
	struct hearth_gen *gen;
	struct gw_params p;
	uint32_t *ids;
	struct gw_sse sse;
	struct gw_timing t;
	bool ended;
};

static long cmpl_next(void *ctx, char *buf, size_t cap)
{
	struct cmpl_stream *s = ctx;
	struct hearth_err err = { 0 };

	while (!gw_sse_pending(&s->sse) && !s->ended) {
		const struct hearth_token *tok;
		int rc = hearth_gen_next(s->gen, &tok, -1, &err);
		if (rc == 1) {
			gw_timing_token(&s->t, s->g);
			json_t *choice = json_pack("{s:i,s:s%,s:o,s:o}", "index", 0, "text", tok->text, tok->text_len,
						   "logprobs", json_null(), "finish_reason", json_null());
			if (!choice) /* a token ending inside a UTF-8 character */
				choice = json_pack("{s:i,s:s,s:o,s:o}", "index", 0, "text", "", "logprobs", json_null(),
						   "finish_reason", json_null());
			if (s->p.gen.logprobs) {
				struct legacy_lp l;
				legacy_init(&l);
				legacy_add(s->g, s->h, &l, tok);
				json_object_set_new(choice, "logprobs", legacy_json(&l));
				legacy_clear(&l);
			}
			gw_sse_send(&s->sse, gw_sse_chunk(&s->sse, "text_completion", json_pack("[o]", choice)));
			continue;
		}
		struct hearth_result res = { 0 };
		int frc = hearth_gen_finish(s->gen, &res, &err);
		s->gen = NULL;
		if (rc < 0 || frc < 0) {
			gw_sse_error(&s->sse, &err);
		} else {
			json_t *choice = json_pack("{s:i,s:s,s:o,s:s}", "index", 0, "text", "", "logprobs", json_null(),
						   "finish_reason", gw_finish_name(res.finish));
			gw_sse_send(&s->sse, gw_sse_chunk(&s->sse, "text_completion", json_pack("[o]", choice)));
			if (s->p.include_usage) {
				json_t *c = gw_sse_chunk(&s->sse, "text_completion", json_array());
				json_object_set_new(c, "usage", gw_usage_json(&res));
				gw_sse_send(&s->sse, c);
			}
			gw_metrics_usage(s->g, &res);
		}
		gw_sse_done(&s->sse);
		s->ended = true;
	}
	return gw_sse_take(&s->sse, buf, cap);
}

static void cmpl_done(void *ctx)
{
	struct cmpl_stream *s = ctx;
	if (s->gen)
		hearth_gen_finish(s->gen, NULL, NULL);
	hearth_close(s->h);
	gw_sse_free(&s->sse);
	gw_params_free(&s->p);
	free(s->ids);
	free(s);
}

struct collect_text {
	struct gw *g;
	struct hearth *h;
	char *text;
	size_t len, cap;
	struct legacy_lp lp;
	bool want_lp;
	struct gw_timing t;
};

static int collect_token(void *user, const struct hearth_token *tok)
{
	struct collect_text *c = user;
	gw_timing_token(&c->t, c->g);
	if (c->len + tok->text_len + 1 > c->cap) {
		size_t cap = c->cap ? c->cap * 2 : 1024;
		while (cap < c->len + tok->text_len + 1)
			cap *= 2;
		char *p = realloc(c->text, cap);
		if (!p)
			return 1;
		c->text = p;
		c->cap = cap;
	}
	memcpy(c->text + c->len, tok->text, tok->text_len);
	c->len += tok->text_len;
	c->text[c->len] = 0;
	if (c->want_lp)
		legacy_add(c->g, c->h, &c->lp, tok);
	return 0;
}

void gw_completions(struct gw *g, const struct gw_caller *who, json_t *body, struct gw_reply *r)
{
	struct gw_params p;
	struct hearth_prompt pr;
	uint32_t *ids = NULL;
	struct hearth *h = NULL;
	struct hearth_err err = { 0 };
	memset(&p, 0, sizeof p);

	if (!gw_check_fields(body, completion_fields, r) || !gw_params_parse(body, false, &p, r) ||
	    !gw_response_format(body, &p, r) || !prompt_of(body, &pr, &ids, r))
		goto out;
	json_t *echo = json_object_get(body, "echo");
	if (json_is_true(echo)) {
		gw_reply_error(r, 400, "invalid_request_error", "echo", "unsupported_value", "'echo': true is not supported");
		goto out;
	}
	if (gw_connect(g, who, &h, &err) < 0) {
		gw_reply_hearth_error(r, &err);
		goto out;
	}
	if (p.stream) {
		struct cmpl_stream *s = calloc(1, sizeof *s);
		if (!s) {
			gw_reply_error(r, 500, "server_error", NULL, NULL, "out of memory");
			goto out;
		}
		s->g = g;
		s->h = h;
		s->p = p;
		s->p.gen.stop = s->p.stop;
		s->ids = ids;
		gw_sse_init(&s->sse, g);
		memcpy(s->sse.id, "cmpl", 4), memmove(s->sse.id + 4, s->sse.id + 8, strlen(s->sse.id + 8) + 1);
		gw_timing_start(&s->t);
		if (hearth_gen_start(h, &pr, &s->p.gen, &s->gen, &err) < 0) {
			gw_reply_hearth_error(r, &err);
			s->gen = NULL;
			cmpl_done(s);
			return;
		}
		r->source = (struct gw_source){ .next = cmpl_next, .done = cmpl_done, .ctx = s };
		return;
	}
	struct collect_text c = { .g = g, .h = h, .want_lp = p.gen.logprobs };
	struct hearth_result res = { 0 };
	if (c.want_lp)
		legacy_init(&c.lp);
	gw_timing_start(&c.t);
	if (hearth_generate(h, &pr, &p.gen, collect_token, &c, &res, &err) < 0) {
		gw_reply_hearth_error(r, &err);
	} else {
		json_t *text = json_stringn(c.text ? c.text : "", c.len);
		json_t *choice = json_pack("{s:i,s:o,s:o,s:s}", "index", 0, "text", text ? text : json_string(""),
					   "logprobs", c.want_lp ? legacy_json(&c.lp) : json_null(), "finish_reason",
					   gw_finish_name(res.finish));
		r->status = 200;
		r->body = gw_completion_json(g, "text_completion", json_pack("[o]", choice));
		json_object_set_new(r->body, "usage", gw_usage_json(&res));
		gw_metrics_usage(g, &res);
	}
	if (c.want_lp)
		legacy_clear(&c.lp);
	free(c.text);
out:
	hearth_close(h);
	gw_params_free(&p);
	free(ids);
}

void gw_models(struct gw *g, const struct gw_caller *who, struct gw_reply *r)
{
	(void)who;
	r->status = 200;
	r->body = json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id", g->model_id, "object",
			    "model", "created", (json_int_t)g->started, "owned_by", "hearth");
}

void gw_health(struct gw *g, struct gw_reply *r)
{
	struct hearth_connect_opts o = { .socket_path = g->cfg.hearth_socket, .client_name = "openai/health",
					 .no_hello = true, .timeout_ms = 2000 };
	struct hearth *h = NULL;
	struct hearth_err err = { 0 };
	struct hearth_stats st;
	if (hearth_connect_with(&h, &o, &err) < 0 || hearth_stats(h, &st, &err) < 0) {
		r->status = 503;
		r->body = json_pack("{s:s,s:s}", "status", "unavailable", "error", err.msg);
		hearth_close(h);
		return;
	}
	hearth_close(h);
	/* A model still loading answers stats but not hello: ready means a hello is welcomed. */
	o.no_hello = false;
	o.timeout_ms = 500;
	if (hearth_connect_with(&h, &o, &err) < 0) {
		r->status = 503;
		r->body = json_pack("{s:s}", "status", "loading");
		return;
	}
	hearth_close(h);
	r->status = 200;
	r->body = json_pack("{s:s}", "status", "ok");
}
