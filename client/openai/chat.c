/* POST /v1/chat/completions: OpenAI's chat request turned into a hearthd `chat` (the model's
 * own template, tools, structured output), answered whole or streamed as SSE chunks in
 * OpenAI's shape (role, content/reasoning deltas, tool calls as structured deltas, usage). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/openai/gw.h"
#include "client/openai/params.h"
#include "client/openai/reply.h"

#define CHAT_MESSAGES_MAX 1024
#define CHAT_CALLS_MAX 64

/* The request's messages as libhearth takes them. Strings point into the request body or
 * into owned (joined content parts, arguments written as JSON text). */
struct chat_input {
	struct hearth_message *msgs;
	struct hearth_tool_call *calls;
	size_t n_msgs, n_calls;
	char **owned;
	size_t n_owned;
	char *tools;
	char *vars;
	struct hearth_chat chat;
};

static void input_free(struct chat_input *in)
{
	for (size_t i = 0; i < in->n_owned; i++)
		free(in->owned[i]);
	free(in->owned);
	free(in->msgs);
	free(in->calls);
	free(in->tools);
	free(in->vars);
}

static const char *own(struct chat_input *in, char *s)
{
	if (!s)
		return NULL;
	in->owned[in->n_owned++] = s;
	return s;
}

/* content: a string, null, or an array of {"type": "text", "text"} parts (joined). */
static bool content_of(struct chat_input *in, json_t *c, size_t mi, const char **out, struct gw_reply *r)
{
	*out = NULL;
	if (!c || json_is_null(c))
		return true;
	if (json_is_string(c)) {
		*out = json_string_value(c);
		return true;
	}
	if (!json_is_array(c)) {
		gw_reply_error(r, 400, "invalid_request_error", "messages", "invalid_value",
			       "messages[%zu].content must be a string or an array of text parts", mi);
		return false;
	}
	size_t total = 1, i;
	json_t *part;
	json_array_foreach(c, i, part) {
		const char *type = json_string_value(json_object_get(part, "type"));
		const char *text = json_string_value(json_object_get(part, "text"));
		if (!type || strcmp(type, "text") || !text) {
			gw_reply_error(r, 400, "invalid_request_error", "messages", "unsupported_value",
				       "messages[%zu].content[%zu]: only text parts are supported (type '%s')", mi, i,
				       type ? type : "?");
			return false;
		}
		total += strlen(text);
	}
	char *s = malloc(total);
	if (!s)
		return false;
	s[0] = 0;
	json_array_foreach(c, i, part)
		strcat(s, json_string_value(json_object_get(part, "text")));
	*out = own(in, s);
	return true;
}

static bool calls_of(struct chat_input *in, json_t *tc, size_t mi, struct hearth_message *m, struct gw_reply *r)
{
	if (!tc || json_is_null(tc))
		return true;
	if (!json_is_array(tc) || json_array_size(tc) > CHAT_CALLS_MAX) {
		gw_reply_error(r, 400, "invalid_request_error", "messages", "invalid_value",
			       "messages[%zu].tool_calls must be an array of at most %d calls", mi, CHAT_CALLS_MAX);
		return false;
	}
	m->tool_calls = in->calls + in->n_calls;
	size_t i;
	json_t *call;
	json_array_foreach(tc, i, call) {
		json_t *fn = json_object_get(call, "function");
		const char *name = json_string_value(json_object_get(fn, "name"));
		json_t *args = json_object_get(fn, "arguments");
		if (!name || !(json_is_string(args) || json_is_object(args))) {
			gw_reply_error(r, 400, "invalid_request_error", "messages", "invalid_value",
				       "messages[%zu].tool_calls[%zu] needs function.name and function.arguments", mi, i);
			return false;
		}
		struct hearth_tool_call *c = &in->calls[in->n_calls++];
		c->id = json_string_value(json_object_get(call, "id"));
		c->name = name;
		c->arguments = json_is_string(args) ? json_string_value(args) : own(in, json_dumps(args, JSON_COMPACT));
		m->n_tool_calls++;
	}
	return true;
}

static bool input_parse(json_t *body, struct chat_input *in, struct gw_reply *r)
{
	json_t *msgs = json_object_get(body, "messages");
	if (!json_is_array(msgs) || json_array_size(msgs) == 0 || json_array_size(msgs) > CHAT_MESSAGES_MAX) {
		gw_reply_error(r, 400, "invalid_request_error", "messages", "invalid_value",
			       "'messages' must be an array of 1..%d messages", CHAT_MESSAGES_MAX);
		return false;
	}
	size_t n = json_array_size(msgs), i;
	in->msgs = calloc(n, sizeof *in->msgs);
	in->calls = calloc(n * CHAT_CALLS_MAX < 4096 ? n * CHAT_CALLS_MAX : 4096, sizeof *in->calls);
	in->owned = calloc(n * (CHAT_CALLS_MAX + 1), sizeof *in->owned);
	if (!in->msgs || !in->calls || !in->owned) {
		gw_reply_error(r, 500, "server_error", NULL, NULL, "out of memory");
		return false;
	}
	json_t *m;
	json_array_foreach(msgs, i, m) {
		struct hearth_message *hm = &in->msgs[in->n_msgs++];
		const char *role = json_string_value(json_object_get(m, "role"));
		if (!json_is_object(m) || !role) {
			gw_reply_error(r, 400, "invalid_request_error", "messages", "invalid_value",
				       "messages[%zu] needs a 'role'", i);
			return false;
		}
		/* OpenAI's newer name for the system role; templates know only "system". */
		hm->role = !strcmp(role, "developer") ? "system" : role;
		hm->name = json_string_value(json_object_get(m, "name"));
		hm->tool_call_id = json_string_value(json_object_get(m, "tool_call_id"));
		hm->reasoning_content = json_string_value(json_object_get(m, "reasoning_content"));
		json_t *tc = json_object_get(m, "tool_calls");
		if (tc && json_array_size(tc) + in->n_calls > 4096) {
			gw_reply_error(r, 400, "invalid_request_error", "messages", "invalid_value",
				       "more than 4096 tool calls in one conversation");
			return false;
		}
		if (!content_of(in, json_object_get(m, "content"), i, &hm->content, r) || !calls_of(in, tc, i, hm, r))
			return false;
	}
	in->chat.messages = in->msgs;
	in->chat.n_messages = in->n_msgs;

	json_t *tools = json_object_get(body, "tools");
	if (tools && !json_is_null(tools)) {
		size_t k;
		json_t *t;
		if (!json_is_array(tools)) {
			gw_reply_error(r, 400, "invalid_request_error", "tools", "invalid_value", "'tools' must be an array");
			return false;
		}
		json_array_foreach(tools, k, t) {
			const char *type = json_string_value(json_object_get(t, "type"));
			if (!type || strcmp(type, "function") ||
			    !json_is_string(json_object_get(json_object_get(t, "function"), "name"))) {
				gw_reply_error(r, 400, "invalid_request_error", "tools", "invalid_value",
					       "tools[%zu] must be {\"type\": \"function\", \"function\": {\"name\", ...}}", k);
				return false;
			}
		}
		if (json_array_size(tools)) {
			in->tools = json_dumps(tools, JSON_COMPACT);
			in->chat.tools = in->tools;
		}
	}
	json_t *choice = json_object_get(body, "tool_choice");
	if (json_is_string(choice)) {
		in->chat.tool_choice = json_string_value(choice);
		if (strcmp(in->chat.tool_choice, "auto") && strcmp(in->chat.tool_choice, "none") &&
		    strcmp(in->chat.tool_choice, "required")) {
			gw_reply_error(r, 400, "invalid_request_error", "tool_choice", "invalid_value",
				       "'tool_choice' must be auto, none, required or {\"type\": \"function\", ...}");
			return false;
		}
	} else if (json_is_object(choice)) {
		in->chat.tool_choice = json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
		if (!in->chat.tool_choice) {
			gw_reply_error(r, 400, "invalid_request_error", "tool_choice", "invalid_value",
				       "'tool_choice' names no function");
			return false;
		}
	} else if (choice && !json_is_null(choice)) {
		gw_reply_error(r, 400, "invalid_request_error", "tool_choice", "invalid_value",
			       "'tool_choice' must be a string or an object");
		return false;
	}
	if (in->chat.tool_choice && !in->tools && strcmp(in->chat.tool_choice, "none") &&
	    strcmp(in->chat.tool_choice, "auto")) {
		gw_reply_error(r, 400, "invalid_request_error", "tool_choice", "invalid_value",
			       "'tool_choice' needs 'tools'");
		return false;
	}
	json_t *kw = json_object_get(body, "chat_template_kwargs");
	if (kw && !json_is_null(kw)) {
		if (!json_is_object(kw)) {
			gw_reply_error(r, 400, "invalid_request_error", "chat_template_kwargs", "invalid_value",
				       "'chat_template_kwargs' must be an object");
			return false;
		}
		in->vars = json_dumps(kw, JSON_COMPACT);
		in->chat.vars = in->vars;
	}
	return true;
}

static const char *const chat_fields[] = {
	"model", "messages", "tools", "tool_choice", "response_format", "stream", "stream_options", "stop",
	"max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "logprobs", "top_logprobs", "n",
	"user", "parallel_tool_calls", "frequency_penalty", "presence_penalty", "top_k", "min_p",
	"repeat_penalty", "chat_template_kwargs", "ignore_eos", "speculate", "draft", NULL,
};

/* ---- the whole reply ---- */

struct collect {
	struct gw *g;
	struct hearth *h;
	json_t *logprobs;         /* array of entries, or NULL */
	struct gw_timing t;
};

static int collect_event(void *user, const struct hearth_event *ev)
{
	struct collect *c = user;
	if (ev->kind != HEARTH_EVENT_TOKEN)
		return 0;
	gw_timing_token(&c->t, c->g);
	if (c->logprobs)
		json_array_append_new(c->logprobs, gw_logprob_entry(c->g, c->h, ev->token));
	return 0;
}

static json_t *message_json(const struct hearth_chat_result *res)
{
	json_t *m = json_pack("{s:s}", "role", "assistant");
	json_object_set_new(m, "content", res->n_tool_calls && !*res->content ? json_null() : json_string(res->content));
	if (res->reasoning_content && *res->reasoning_content)
		json_object_set_new(m, "reasoning_content", json_string(res->reasoning_content));
	if (res->n_tool_calls) {
		json_t *calls = json_array();
		for (size_t i = 0; i < res->n_tool_calls; i++)
			json_array_append_new(calls, gw_tool_call_json(&res->tool_calls[i], i, false));
		json_object_set_new(m, "tool_calls", calls);
	}
	return m;
}

/* ---- the streamed reply ---- */

struct chat_stream {
	struct gw *g;
	struct hearth *h;
	struct hearth_gen *gen;
	struct chat_input in;
	struct gw_params p;
	struct gw_sse sse;
	json_t *pending_lp;       /* logprob entries of tokens not yet sent with a delta */
	struct gw_timing t;
	int phase;                /* 0 role chunk, 1 streaming, 2 ended */
};

static json_t *chunk_new(struct chat_stream *s, json_t *delta, const char *finish)
{
	json_t *choice = json_pack("{s:i,s:o,s:o,s:o}", "index", 0, "delta", delta, "logprobs", json_null(),
				   "finish_reason", finish ? json_string(finish) : json_null());
	if (s->pending_lp && json_array_size(s->pending_lp) && delta && json_object_size(delta)) {
		json_object_set_new(choice, "logprobs", json_pack("{s:o}", "content", s->pending_lp));
		s->pending_lp = json_array();
	}
	return gw_sse_chunk(&s->sse, "chat.completion.chunk", json_pack("[o]", choice));
}

static void stream_end(struct chat_stream *s, struct hearth_chat_result *res)
{
	gw_sse_send(&s->sse, chunk_new(s, json_object(), gw_finish_name(res->gen.finish)));
	if (s->p.include_usage) {
		json_t *c = gw_sse_chunk(&s->sse, "chat.completion.chunk", json_array());
		json_object_set_new(c, "usage", gw_usage_json(&res->gen));
		gw_sse_send(&s->sse, c);
	}
	gw_metrics_usage(s->g, &res->gen);
}

static long chat_next(void *ctx, char *buf, size_t cap)
{
	struct chat_stream *s = ctx;
	struct hearth_err err = { 0 };

	while (!gw_sse_pending(&s->sse) && s->phase != 2) {
		if (s->phase == 0) {
			gw_sse_send(&s->sse, chunk_new(s, json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL));
			s->phase = 1;
			continue;
		}
		struct hearth_event ev;
		int rc = hearth_chat_next(s->gen, &ev, -1, &err);
		if (rc == 1 && ev.kind == HEARTH_EVENT_TOKEN) {
			gw_timing_token(&s->t, s->g);
			if (s->pending_lp)
				json_array_append_new(s->pending_lp, gw_logprob_entry(s->g, s->h, ev.token));
		} else if (rc == 1) {
			const struct hearth_delta *d = ev.delta;
			json_t *delta;
			if (d->kind == HEARTH_DELTA_TOOL_CALL)
				delta = json_pack("{s:[o]}", "tool_calls", gw_tool_call_json(&d->call, d->index, true));
			else
				delta = json_pack("{s:s%}", d->kind == HEARTH_DELTA_REASONING ? "reasoning_content" : "content",
						  d->text, d->len);
			gw_sse_send(&s->sse, chunk_new(s, delta, NULL));
		} else {
			struct hearth_chat_result res;
			memset(&res, 0, sizeof res);
			int frc = hearth_chat_finish(s->gen, &res, rc < 0 ? NULL : &err);
			s->gen = NULL;
			if (rc < 0 || frc < 0)
				gw_sse_error(&s->sse, rc < 0 ? &err : &err);
			else
				stream_end(s, &res);
			hearth_chat_result_free(&res);
			gw_sse_done(&s->sse);
			s->phase = 2;
		}
	}
	return gw_sse_take(&s->sse, buf, cap);
}

static void chat_done(void *ctx)
{
	struct chat_stream *s = ctx;
	if (s->gen) {
		struct hearth_chat_result res;
		memset(&res, 0, sizeof res);
		hearth_chat_finish(s->gen, &res, NULL);
		hearth_chat_result_free(&res);
	}
	hearth_close(s->h);
	json_decref(s->pending_lp);
	gw_sse_free(&s->sse);
	input_free(&s->in);
	gw_params_free(&s->p);
	free(s);
}

void gw_chat_completions(struct gw *g, const struct gw_caller *who, json_t *body, struct gw_reply *r)
{
	struct chat_input in;
	struct gw_params p;
	struct hearth_err err = { 0 };
	struct hearth *h = NULL;
	memset(&in, 0, sizeof in);
	memset(&p, 0, sizeof p);

	if (!gw_check_fields(body, chat_fields, r) || !gw_params_parse(body, true, &p, r) ||
	    !gw_response_format(body, &p, r) || !input_parse(body, &in, r))
		goto out;
	if (gw_connect(g, who, &h, &err) < 0) {
		gw_reply_hearth_error(r, &err);
		goto out;
	}
	if (p.gen.max_tokens == 0)
		p.gen.max_tokens = gw_context_of(h);

	if (p.stream) {
		struct chat_stream *s = calloc(1, sizeof *s);
		if (!s) {
			gw_reply_error(r, 500, "server_error", NULL, NULL, "out of memory");
			goto out;
		}
		s->g = g;
		s->h = h;
		s->in = in;
		s->p = p;
		s->in.chat.messages = s->in.msgs;
		s->p.gen.stop = s->p.stop;
		gw_sse_init(&s->sse, g);
		gw_timing_start(&s->t);
		if (p.gen.logprobs)
			s->pending_lp = json_array();
		if (hearth_chat_start(h, &s->in.chat, &s->p.gen, &s->gen, &err) < 0) {
			gw_reply_hearth_error(r, &err);
			s->gen = NULL;
			chat_done(s);
			return;
		}
		r->source = (struct gw_source){ .next = chat_next, .done = chat_done, .ctx = s };
		return;
	}

	struct collect c = { .g = g, .h = h, .logprobs = p.gen.logprobs ? json_array() : NULL };
	struct hearth_chat_result res;
	memset(&res, 0, sizeof res);
	gw_timing_start(&c.t);
	if (hearth_chat_run(h, &in.chat, &p.gen, collect_event, &c, &res, &err) < 0) {
		gw_reply_hearth_error(r, &err);
		json_decref(c.logprobs);
		hearth_chat_result_free(&res);
		goto out;
	}
	json_t *choice = json_pack("{s:i,s:o,s:o,s:s}", "index", 0, "message", message_json(&res), "logprobs",
				   c.logprobs ? json_pack("{s:o}", "content", c.logprobs) : json_null(),
				   "finish_reason", gw_finish_name(res.gen.finish));
	r->status = 200;
	r->body = gw_completion_json(g, "chat.completion", json_pack("[o]", choice));
	json_object_set_new(r->body, "usage", gw_usage_json(&res.gen));
	gw_metrics_usage(g, &res.gen);
	hearth_chat_result_free(&res);
out:
	hearth_close(h);
	input_free(&in);
	gw_params_free(&p);
}
