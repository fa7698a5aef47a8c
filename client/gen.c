/* Generation: the pull iterator (start / next / cancel / finish) and the blocking callback
 * form built on it, so both share one path. Prompts too large for a frame are pushed into
 * the client->daemon ring and named by the generate frame's prompt_ref. */
#include <stdlib.h>
#include <string.h>

#include "client/conn.h"

struct hearth_gen_params hearth_gen_params_default(void)
{
	struct hearth_gen_params p;
	memset(&p, 0, sizeof p);
	p.max_tokens = MSG_DEFAULT_MAX_TOKENS;
	p.temperature = MSG_DEFAULT_TEMPERATURE;
	p.top_k = MSG_DEFAULT_TOP_K;
	p.top_p = MSG_DEFAULT_TOP_P;
	p.min_p = MSG_DEFAULT_MIN_P;
	p.repeat_penalty = MSG_DEFAULT_REPEAT_PENALTY;
	p.repeat_last_n = MSG_DEFAULT_REPEAT_LAST_N;
	p.jump_forward = true;
	return p;
}

_Static_assert(HEARTH_SPECULATE_MAX == MSG_SPECULATE_MAX, "libhearth's bound is the protocol's");

const char *hearth_finish_name(enum hearth_finish f)
{
	switch (f) {
	case HEARTH_FINISH_STOP: return "stop";
	case HEARTH_FINISH_LENGTH: return "length";
	case HEARTH_FINISH_CONTEXT: return "context";
	case HEARTH_FINISH_CANCEL: return "cancel";
	case HEARTH_FINISH_TOOL_CALLS: return "tool_calls";
	default: return "none";
	}
}

int gen_fill(struct msg_generate *g, const struct hearth_gen_params *p, struct msg_bytes *stop,
	     struct hearth_err *err)
{
	if (!!p->grammar + !!p->json_schema + p->json_object > 1)
		return conn_err_set(err, HEARTH_EINVAL, "at most one of grammar, json_schema, json_object");
	for (int i = 0; i < 2; i++) {
		const char *s = i ? p->json_schema : p->grammar;
		if (s && (!*s || strlen(s) > MSG_GRAMMAR_MAX || !msg_utf8_valid(s, strlen(s))))
			return conn_err_set(err, HEARTH_EINVAL, "the %s must be 1..%u bytes of UTF-8",
					    i ? "JSON schema" : "grammar", MSG_GRAMMAR_MAX);
	}
	g->has_grammar = p->grammar != NULL;
	g->grammar = (struct msg_bytes){ p->grammar, p->grammar ? strlen(p->grammar) : 0 };
	g->has_json_schema = p->json_schema != NULL;
	g->json_schema = (struct msg_bytes){ p->json_schema, p->json_schema ? strlen(p->json_schema) : 0 };
	g->json_object = p->json_object;
	/* sent only to turn it off, so a 1.1 daemon sees no field it does not know */
	g->has_jump_forward = !p->jump_forward;
	g->jump_forward = p->jump_forward;
	if (p->speculate < -1 || p->speculate > MSG_SPECULATE_MAX)
		return conn_err_set(err, HEARTH_EINVAL, "speculate %d: -1 (off), 0 (the daemon's default) or 1..%u",
				    (int)p->speculate, MSG_SPECULATE_MAX);
	g->has_speculate = p->speculate != 0;
	g->speculate = p->speculate > 0 ? (uint32_t)p->speculate : 0;
	g->has_draft = p->draft != NULL;
	g->draft = (struct msg_bytes){ p->draft, p->draft ? strlen(p->draft) : 0 };
	if (p->n_stop > MSG_STOP_MAX)
		return conn_err_set(err, HEARTH_EINVAL, "%zu stop strings; at most %d", p->n_stop,
				    MSG_STOP_MAX);
	if (p->n_stop && !p->stop)
		return conn_err_set(err, HEARTH_EINVAL, "n_stop is %zu but stop is NULL", p->n_stop);
	if (p->n_stop_tokens && !p->stop_tokens)
		return conn_err_set(err, HEARTH_EINVAL, "n_stop_tokens is %zu but stop_tokens is NULL",
				    p->n_stop_tokens);
	for (size_t i = 0; i < p->n_stop; i++) {
		if (!p->stop[i] || !p->stop[i][0] || strlen(p->stop[i]) > MSG_STOP_LEN_MAX)
			return conn_err_set(err, HEARTH_EINVAL,
					    "stop string %zu must hold 1..%d bytes", i, MSG_STOP_LEN_MAX);
		stop[i] = (struct msg_bytes){ p->stop[i], strlen(p->stop[i]) };
	}
	g->max_tokens = p->max_tokens;
	g->sampling.temperature = p->temperature;
	g->sampling.top_k = p->top_k;
	g->sampling.top_p = p->top_p;
	g->sampling.min_p = p->min_p;
	g->sampling.repeat_penalty = p->repeat_penalty;
	g->sampling.repeat_last_n = p->repeat_last_n;
	g->sampling.has_seed = p->has_seed;
	g->sampling.seed = p->seed;
	g->stop = p->n_stop ? stop : NULL;
	g->n_stop = p->n_stop;
	g->stop_tokens = (uint32_t *)p->stop_tokens;
	g->n_stop_tokens = p->n_stop_tokens;
	g->logprobs = p->logprobs;
	g->top_logprobs = p->top_logprobs;
	g->logits = p->logits;
	g->ignore_eos = p->ignore_eos;
	return 0;
}

/* Bytes the ids take in a msgpack array: 1, 2, 3 or 5 each by magnitude. */
static size_t tokens_packed_size(const uint32_t *ids, size_t n)
{
	size_t bytes = 5;
	for (size_t i = 0; i < n; i++)
		bytes += ids[i] < 128 ? 1 : ids[i] < 256 ? 2 : ids[i] < 65536 ? 3 : 5;
	return bytes;
}

int hearth_gen_start(struct hearth *h, const struct hearth_prompt *prompt,
		     const struct hearth_gen_params *params, struct hearth_gen **out,
		     struct hearth_err *err)
{
	*out = NULL;
	if (!h || !prompt)
		return conn_err_set(err, HEARTH_EINVAL, "hearth_gen_start: no connection or prompt");
	if ((prompt->text != NULL) == (prompt->tokens != NULL))
		return conn_err_set(err, HEARTH_EINVAL,
				    "a prompt is either text or token ids, exactly one of them");
	if (!h->welcomed || !h->has_ring)
		return conn_err_set(err, HEARTH_EINVAL,
				    "generating needs a connection that said hello and got hearthd's "
				    "shared-memory ring");
	struct hearth_gen_params defaults = hearth_gen_params_default();
	const struct hearth_gen_params *p = params ? params : &defaults;

	struct msg m;
	msg_init(&m, MSG_GENERATE, 0);
	struct msg_generate *g = &m.u.generate;
	struct msg_bytes stop[MSG_STOP_MAX];
	int rc = gen_fill(g, p, stop, err);
	if (rc < 0)
		return rc;

	struct conn_bulk bulk = { 0 };
	bool use_bulk = false;
	if (prompt->text) {
		if (!msg_utf8_valid(prompt->text, prompt->len))
			return conn_err_set(err, HEARTH_EINVAL, "the prompt is not valid UTF-8");
		if (prompt->len > h->inline_max) {
			use_bulk = true;
			bulk = (struct conn_bulk){ RING_REC_BULK_TEXT, 0, prompt->text, prompt->len };
		} else {
			g->has_prompt = true;
			g->prompt = (struct msg_bytes){ prompt->text, prompt->len };
		}
	} else {
		if (prompt->n_tokens == 0)
			return conn_err_set(err, HEARTH_EINVAL, "the prompt has no tokens");
		if (prompt->n_tokens > MSG_ARRAY_MAX ||
		    tokens_packed_size(prompt->tokens, prompt->n_tokens) > h->inline_max) {
			size_t bytes;
			if (__builtin_mul_overflow(prompt->n_tokens, sizeof(uint32_t), &bytes))
				return conn_err_set(err, HEARTH_ERANGE, "%zu prompt tokens",
						    prompt->n_tokens);
			use_bulk = true;
			bulk = (struct conn_bulk){ RING_REC_BULK_TOKENS, 0, prompt->tokens, bytes };
		} else {
			g->tokens = (uint32_t *)prompt->tokens;
			g->n_tokens = prompt->n_tokens;
		}
	}

	struct hearth_gen *gen = calloc(1, sizeof *gen);
	if (!gen)
		return conn_err_set(err, HEARTH_ENOMEM, "out of memory for a generation");
	rc = gen_send(h, gen, &m, g, use_bulk ? &bulk : NULL, err);
	if (rc == 0)
		*out = gen;
	return rc;
}

int gen_send(struct hearth *h, struct hearth_gen *gen, struct msg *m, struct msg_generate *g,
	     struct conn_bulk *bulk, struct hearth_err *err)
{
	gen->h = h;
	int rc = conn_register(h, &gen->req, true, err);
	if (rc < 0) {
		free(gen);
		return rc;
	}
	m->id = gen->req.id;
	if (bulk) {
		/* The request id doubles as the bulk ref: unique on this connection. */
		bulk->ref = gen->req.id;
		g->has_prompt_ref = true;
		g->prompt_ref = bulk->ref;
	}
	rc = conn_send(h, m, bulk, err);
	if (rc < 0) {
		conn_unregister(h, &gen->req);
		free(gen);
	}
	return rc;
}

int hearth_gen_next(struct hearth_gen *g, const struct hearth_token **tok, int timeout_ms,
		    struct hearth_err *err)
{
	*tok = NULL;
	for (;;) {
		int rc = gen_next_event(g, timeout_ms, err);
		if (rc != 1)
			return rc;
		if (!g->cur->is_delta) {
			*tok = &g->cur->tok;
			return 1;
		}
		/* a chat driven as a plain generation: its deltas are not asked for */
	}
}

int gen_next_event(struct hearth_gen *g, int timeout_ms, struct hearth_err *err)
{
	struct hearth *h = g->h;
	conn_event_free(g->cur);
	g->cur = NULL;
	int wait_ms = timeout_ms < 0 ? h->timeout_ms : timeout_ms;
	pthread_mutex_lock(&h->mu);
	int rc = conn_wait(h, &g->req, wait_ms);
	struct conn_req *r = &g->req;
	if (r->head) {
		/* Queued tokens come out even after a failure: they were produced. */
		g->cur = r->head;
		r->head = g->cur->next;
		if (!r->head)
			r->tail = NULL;
		pthread_mutex_unlock(&h->mu);
		return 1;
	}
	if (rc == HEARTH_ETIMEDOUT) {
		pthread_mutex_unlock(&h->mu);
		if (timeout_ms < 0)
			g->idle_timed_out = true;
		return conn_err_set(err, HEARTH_ETIMEDOUT, "no token from hearthd within %d ms",
				    wait_ms);
	}
	g->idle_timed_out = false;
	rc = r->rc;
	if (rc < 0 && err)
		*err = r->err;
	pthread_mutex_unlock(&h->mu);
	return rc < 0 ? rc : 0;
}

int hearth_cancel(struct hearth_gen *g, struct hearth_err *err)
{
	struct hearth *h = g->h;
	pthread_mutex_lock(&h->mu);
	bool skip = g->req.final || g->cancel_sent;
	g->cancel_sent = true;
	uint64_t target = g->req.id;
	pthread_mutex_unlock(&h->mu);
	if (skip)
		return 0;
	/* The cancel's own reply names an id nobody waits for and is dropped. */
	struct msg m;
	msg_init(&m, MSG_CANCEL, conn_new_id(h));
	m.u.cancel.target = target;
	return conn_send(h, &m, NULL, err);
}

int hearth_gen_finish(struct hearth_gen *g, struct hearth_result *result,
		      struct hearth_err *err)
{
	int rc = gen_end(g, result, NULL, err);
	free(g);
	return rc;
}

int gen_end(struct hearth_gen *g, struct hearth_result *result, struct hearth_chat_result *chat,
	    struct hearth_err *err)
{
	struct hearth *h = g->h;
	struct conn_req *r = &g->req;
	conn_event_free(g->cur);
	g->cur = NULL;
	if (result)
		memset(result, 0, sizeof *result);
	pthread_mutex_lock(&h->mu);
	bool running = !r->final;
	pthread_mutex_unlock(&h->mu);
	/* Even an abandoned generation is canceled: the daemon may only be slow. */
	if (running)
		hearth_cancel(g, NULL);
	int rc = 0;
	pthread_mutex_lock(&h->mu);
	while (!r->final && !g->idle_timed_out) {
		while (r->head) {
			struct conn_event *e = r->head;
			r->head = e->next;
			conn_event_free(e);
		}
		r->tail = NULL;
		if (conn_wait(h, r, h->timeout_ms) == HEARTH_ETIMEDOUT)
			break;
	}
	if (!r->final) {
		rc = conn_err_set(err, HEARTH_ETIMEDOUT,
				  "hearthd did not end generation %llu; abandoned it",
				  (unsigned long long)r->id);
	} else if (r->rc < 0) {
		rc = r->rc;
		if (err)
			*err = r->err;
	} else {
		/* A chat's result holds its own gen: the message goes in first. */
		if (chat) {
			*chat = r->chat;
			memset(&r->chat, 0, sizeof r->chat);
		}
		if (result)
			*result = r->result;
	}
	pthread_mutex_unlock(&h->mu);
	conn_unregister(h, r);
	return rc;
}

int hearth_generate(struct hearth *h, const struct hearth_prompt *prompt,
		    const struct hearth_gen_params *params, hearth_token_fn cb, void *user,
		    struct hearth_result *result, struct hearth_err *err)
{
	struct hearth_gen *g;
	if (result)
		memset(result, 0, sizeof *result);
	int rc = hearth_gen_start(h, prompt, params, &g, err);
	if (rc < 0)
		return rc;
	bool stopping = false;
	for (;;) {
		const struct hearth_token *t;
		rc = hearth_gen_next(g, &t, -1, err);
		if (rc != 1)
			break;
		if (!stopping && cb && cb(user, t) != 0) {
			/* Tokens already on their way are drained, not delivered. */
			stopping = true;
			hearth_cancel(g, NULL);
		}
	}
	struct hearth_result res;
	struct hearth_err ferr;
	int frc = hearth_gen_finish(g, &res, &ferr);
	if (rc < 0)
		return rc;
	if (frc < 0) {
		if (err)
			*err = ferr;
		return frc;
	}
	if (result)
		*result = res;
	return 0;
}
