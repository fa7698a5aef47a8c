/* Chat (protocol 1.1): the conversation goes to hearthd as messages, the daemon renders the
 * model's template and parses the reply; here the request is built, and the stream of tokens
 * and parsed deltas is handed out in arrival order on the generation machinery of gen.c. */
#include <stdlib.h>
#include <string.h>

#include "client/conn.h"

void hearth_chat_result_free(struct hearth_chat_result *r)
{
	if (!r)
		return;
	free(r->content);
	free(r->reasoning_content);
	for (size_t i = 0; i < r->n_tool_calls; i++) {
		free((char *)r->tool_calls[i].id);
		free((char *)r->tool_calls[i].name);
		free((char *)r->tool_calls[i].arguments);
	}
	free(r->tool_calls);
	memset(r, 0, sizeof *r);
}

static struct msg_bytes bytes_of(const char *s)
{
	return (struct msg_bytes){ s, s ? strlen(s) : 0 };
}

/* Checks a string field and fills it; absent (NULL) leaves *has false. */
static int opt_str(const char *s, size_t max, const char *what, size_t i, bool *has, struct msg_bytes *out,
		   struct hearth_err *err)
{
	if (!s)
		return 0;
	size_t n = strlen(s);
	if (n > max || !msg_utf8_valid(s, n))
		return conn_err_set(err, HEARTH_EINVAL, "message %zu: %s must be at most %zu bytes of UTF-8", i, what,
				    max);
	if (has)
		*has = true;
	*out = (struct msg_bytes){ s, n };
	return 0;
}

/* The wire form of the messages; calls live in one array the caller frees. */
static int fill_messages(const struct hearth_chat *c, struct msg_chat *mc, struct msg_chat_call **calls_out,
			 struct hearth_err *err)
{
	*calls_out = NULL;
	if (!c->messages || c->n_messages == 0 || c->n_messages > MSG_CHAT_MESSAGES_MAX)
		return conn_err_set(err, HEARTH_EINVAL, "a chat needs 1..%d messages", MSG_CHAT_MESSAGES_MAX);
	size_t n_calls = 0;
	for (size_t i = 0; i < c->n_messages; i++) {
		if (c->messages[i].n_tool_calls > MSG_CHAT_CALLS_MAX)
			return conn_err_set(err, HEARTH_EINVAL, "message %zu: more than %d tool calls", i,
					    MSG_CHAT_CALLS_MAX);
		n_calls += c->messages[i].n_tool_calls;
	}
	struct msg_chat_message *msgs = calloc(c->n_messages, sizeof *msgs);
	struct msg_chat_call *calls = calloc(n_calls ? n_calls : 1, sizeof *calls);
	if (!msgs || !calls) {
		free(msgs);
		free(calls);
		return conn_err_set(err, HEARTH_ENOMEM, "out of memory for a chat");
	}
	size_t k = 0;
	int rc = 0;
	for (size_t i = 0; i < c->n_messages && rc == 0; i++) {
		const struct hearth_message *hm = &c->messages[i];
		struct msg_chat_message *w = &msgs[i];
		if (!hm->role || !*hm->role) {
			rc = conn_err_set(err, HEARTH_EINVAL, "message %zu has no role", i);
			break;
		}
		if ((rc = opt_str(hm->role, MSG_ROLE_MAX, "role", i, NULL, &w->role, err)) ||
		    (rc = opt_str(hm->content, MSG_STR_MAX, "content", i, &w->has_content, &w->content, err)) ||
		    (rc = opt_str(hm->name, MSG_TOOL_NAME_MAX, "name", i, &w->has_name, &w->name, err)) ||
		    (rc = opt_str(hm->tool_call_id, MSG_TOOL_NAME_MAX, "tool_call_id", i, &w->has_tool_call_id,
				  &w->tool_call_id, err)) ||
		    (rc = opt_str(hm->reasoning_content, MSG_STR_MAX, "reasoning_content", i, &w->has_reasoning,
				  &w->reasoning_content, err)))
			break;
		if (hm->n_tool_calls && !hm->tool_calls) {
			rc = conn_err_set(err, HEARTH_EINVAL, "message %zu: n_tool_calls without tool_calls", i);
			break;
		}
		w->tool_calls = hm->n_tool_calls ? calls + k : NULL;
		w->n_tool_calls = hm->n_tool_calls;
		for (size_t j = 0; j < hm->n_tool_calls; j++, k++) {
			const struct hearth_tool_call *tc = &hm->tool_calls[j];
			if (!tc->name || !*tc->name) {
				rc = conn_err_set(err, HEARTH_EINVAL, "message %zu: tool call %zu has no name", i, j);
				break;
			}
			calls[k] = (struct msg_chat_call){ bytes_of(tc->id), bytes_of(tc->name),
							  bytes_of(tc->arguments ? tc->arguments : "{}") };
		}
	}
	if (rc < 0) {
		free(msgs);
		free(calls);
		return rc;
	}
	mc->messages = msgs;
	mc->n_messages = c->n_messages;
	*calls_out = calls;
	return 0;
}

int hearth_chat_start(struct hearth *h, const struct hearth_chat *chat, const struct hearth_gen_params *params,
		      struct hearth_gen **out, struct hearth_err *err)
{
	*out = NULL;
	if (!h || !chat)
		return conn_err_set(err, HEARTH_EINVAL, "hearth_chat_start: no connection or chat");
	if (!h->welcomed || !h->has_ring)
		return conn_err_set(err, HEARTH_EINVAL,
				    "chat needs a connection that said hello and got hearthd's shared-memory ring");
	struct hearth_gen_params defaults = hearth_gen_params_default();
	struct msg m;
	msg_init(&m, MSG_CHAT, 0);
	struct msg_chat *mc = &m.u.chat;
	struct msg_bytes stop[MSG_STOP_MAX];
	int rc = gen_fill(&mc->gen, params ? params : &defaults, stop, err);
	if (rc < 0)
		return rc;
	struct { const char *s; size_t max; const char *what; bool *has; struct msg_bytes *out; } opt[] = {
		{ chat->tools, MSG_STR_MAX, "tools", &mc->has_tools, &mc->tools },
		{ chat->tool_choice, MSG_TOOL_NAME_MAX, "tool_choice", &mc->has_tool_choice, &mc->tool_choice },
		{ chat->vars, MSG_STR_MAX, "vars", &mc->has_vars, &mc->vars },
		{ chat->template_name, MSG_NAME_MAX, "template_name", &mc->has_template, &mc->template_name },
	};
	for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++)
		if (opt[i].s && (!*opt[i].s || (rc = opt_str(opt[i].s, opt[i].max, opt[i].what, 0, opt[i].has,
							      opt[i].out, err)) < 0))
			return rc < 0 ? rc : conn_err_set(err, HEARTH_EINVAL, "chat: %s is empty", opt[i].what);
	mc->add_generation_prompt = !chat->no_generation_prompt;
	struct msg_chat_call *calls;
	if ((rc = fill_messages(chat, mc, &calls, err)) < 0)
		return rc;
	struct hearth_gen *gen = calloc(1, sizeof *gen);
	if (!gen)
		rc = conn_err_set(err, HEARTH_ENOMEM, "out of memory for a chat");
	else
		rc = gen_send(h, gen, &m, &mc->gen, NULL, err);
	free(mc->messages);
	free(calls);
	if (rc == 0)
		*out = gen;
	return rc;
}

int hearth_chat_next(struct hearth_gen *g, struct hearth_event *ev, int timeout_ms, struct hearth_err *err)
{
	memset(ev, 0, sizeof *ev);
	int rc = gen_next_event(g, timeout_ms, err);
	if (rc != 1)
		return rc;
	if (g->cur->is_delta) {
		ev->kind = HEARTH_EVENT_DELTA;
		ev->delta = &g->cur->delta;
	} else {
		ev->kind = HEARTH_EVENT_TOKEN;
		ev->token = &g->cur->tok;
	}
	return 1;
}

int hearth_chat_finish(struct hearth_gen *g, struct hearth_chat_result *result, struct hearth_err *err)
{
	struct hearth_chat_result local;
	struct hearth_chat_result *out = result ? result : &local;
	memset(out, 0, sizeof *out);
	int rc = gen_end(g, &out->gen, out, err);
	free(g);
	if (!result)
		hearth_chat_result_free(&local);
	return rc;
}

int hearth_chat_run(struct hearth *h, const struct hearth_chat *chat, const struct hearth_gen_params *params,
		    hearth_event_fn cb, void *user, struct hearth_chat_result *result, struct hearth_err *err)
{
	struct hearth_gen *g;
	if (result)
		memset(result, 0, sizeof *result);
	int rc = hearth_chat_start(h, chat, params, &g, err);
	if (rc < 0)
		return rc;
	bool stopping = false;
	for (;;) {
		struct hearth_event ev;
		rc = hearth_chat_next(g, &ev, -1, err);
		if (rc != 1)
			break;
		if (!stopping && cb && cb(user, &ev) != 0) {
			stopping = true;
			hearth_cancel(g, NULL);
		}
	}
	struct hearth_err ferr;
	int frc = hearth_chat_finish(g, result, &ferr);
	if (rc < 0) {
		hearth_chat_result_free(result);
		return rc;
	}
	if (frc < 0 && err)
		*err = ferr;
	return frc;
}
