/* OpenAI reply pieces shared by the chat and completions endpoints: the SSE stream buffer,
 * the envelope, usage, tool calls, logprobs (token text from a per-gateway cache, so a
 * top_logprobs list costs a round trip per token id once, not per request), and the
 * latency figures /metrics shows. */
#include "client/openai/reply.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void gw_sse_init(struct gw_sse *s, struct gw *g)
{
	memset(s, 0, sizeof *s);
	s->g = g;
	uint64_t r = 0;
	if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
		r = (uint64_t)(uintptr_t)s ^ (uint64_t)time(NULL);
	snprintf(s->id, sizeof s->id, "chatcmpl-%016llx", (unsigned long long)r);
	s->created = (int64_t)time(NULL);
}

void gw_sse_free(struct gw_sse *s)
{
	free(s->buf);
	s->buf = NULL;
}

static void sse_append(struct gw_sse *s, const char *p, size_t n)
{
	if (s->off == s->len)
		s->off = s->len = 0;
	if (s->len + n > s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 4096;
		while (cap < s->len + n)
			cap *= 2;
		char *b = realloc(s->buf, cap);
		if (!b)
			return; /* the client then sees a truncated stream, never a corrupt one */
		s->buf = b;
		s->cap = cap;
	}
	memcpy(s->buf + s->len, p, n);
	s->len += n;
}

json_t *gw_sse_chunk(struct gw_sse *s, const char *object, json_t *choices)
{
	return json_pack("{s:s,s:s,s:I,s:s,s:s,s:o}", "id", s->id, "object", object, "created", (json_int_t)s->created,
			 "model", s->g->model_id, "system_fingerprint", "hearth", "choices", choices);
}

void gw_sse_send(struct gw_sse *s, json_t *chunk)
{
	char *js = chunk ? json_dumps(chunk, JSON_COMPACT) : NULL;
	json_decref(chunk);
	if (!js)
		return;
	sse_append(s, "data: ", 6);
	sse_append(s, js, strlen(js));
	sse_append(s, "\n\n", 2);
	free(js);
}

void gw_sse_error(struct gw_sse *s, const struct hearth_err *err)
{
	struct gw_reply r = { 0 };
	gw_reply_hearth_error(&r, err);
	gw_sse_send(s, r.body);
}

void gw_sse_done(struct gw_sse *s)
{
	sse_append(s, "data: [DONE]\n\n", 14);
}

bool gw_sse_pending(const struct gw_sse *s)
{
	return s->off < s->len;
}

long gw_sse_take(struct gw_sse *s, char *buf, size_t cap)
{
	size_t n = s->len - s->off < cap ? s->len - s->off : cap;
	memcpy(buf, s->buf + s->off, n);
	s->off += n;
	return (long)n;
}

json_t *gw_completion_json(struct gw *g, const char *object, json_t *choices)
{
	struct gw_sse id;
	gw_sse_init(&id, g);
	if (!strcmp(object, "text_completion"))
		memcpy(id.id, "cmpl", 4), memmove(id.id + 4, id.id + 8, strlen(id.id + 8) + 1);
	return json_pack("{s:s,s:s,s:I,s:s,s:s,s:o}", "id", id.id, "object", object, "created",
			 (json_int_t)id.created, "model", g->model_id, "system_fingerprint", "hearth", "choices", choices);
}

json_t *gw_usage_json(const struct hearth_result *res)
{
	return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)res->n_prompt, "completion_tokens",
			 (json_int_t)res->n_gen, "total_tokens", (json_int_t)res->n_prompt + (json_int_t)res->n_gen,
			 "prompt_tokens_details", "cached_tokens", (json_int_t)res->n_cached);
}

const char *gw_finish_name(enum hearth_finish f)
{
	switch (f) {
	case HEARTH_FINISH_LENGTH:
	case HEARTH_FINISH_CONTEXT:
		return "length";
	case HEARTH_FINISH_TOOL_CALLS:
		return "tool_calls";
	default:
		return "stop";
	}
}

json_t *gw_tool_call_json(const struct hearth_tool_call *c, size_t index, bool with_index)
{
	json_t *j = json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", c->id ? c->id : "", "type", "function", "function",
			      "name", c->name ? c->name : "", "arguments", c->arguments ? c->arguments : "{}");
	if (with_index)
		json_object_set_new(j, "index", json_integer((json_int_t)index));
	return j;
}

/* ---- token text ---- */

static pthread_mutex_t piece_lock = PTHREAD_MUTEX_INITIALIZER;
#define PIECE_CACHE_MAX (1u << 22)
static char **piece_cache;        /* by token id, NULL until first asked */

int gw_piece(struct gw *g, struct hearth *h, uint32_t id, char *buf, size_t cap)
{
	(void)g;
	if (id < PIECE_CACHE_MAX) {
		pthread_mutex_lock(&piece_lock);
		const char *hit = piece_cache ? piece_cache[id] : NULL;
		if (hit)
			snprintf(buf, cap, "%s", hit);
		pthread_mutex_unlock(&piece_lock);
		if (hit)
			return 0;
	}
	char *text = NULL;
	size_t len = 0;
	struct hearth_err err;
	int rc = hearth_detokenize(h, &id, 1, &text, &len, &err);
	if (rc < 0)
		return rc;
	snprintf(buf, cap, "%.*s", (int)len, text);
	if (id < PIECE_CACHE_MAX) {
		pthread_mutex_lock(&piece_lock);
		if (!piece_cache)
			piece_cache = calloc(PIECE_CACHE_MAX, sizeof *piece_cache);
		if (piece_cache && !piece_cache[id])
			piece_cache[id] = strdup(buf);
		pthread_mutex_unlock(&piece_lock);
	}
	hearth_free(text);
	return 0;
}

static json_t *bytes_json(const char *s, size_t n)
{
	json_t *a = json_array();
	for (size_t i = 0; i < n; i++)
		json_array_append_new(a, json_integer((unsigned char)s[i]));
	return a;
}

/* JSON strings must be UTF-8: a token that ends inside a character is shown with U+FFFD, its
 * exact bytes are in "bytes" (OpenAI does the same). */
static json_t *text_json(const char *s, size_t n)
{
	json_t *j = json_stringn(s, n);
	if (j)
		return j;
	char *fixed = malloc(n * 3 + 1);
	size_t k = 0;
	for (size_t i = 0; fixed && i < n; i++) {
		if ((unsigned char)s[i] < 0x80)
			fixed[k++] = s[i];
		else
			memcpy(fixed + k, "\xEF\xBF\xBD", 3), k += 3;
	}
	j = fixed ? json_stringn(fixed, k) : json_string("");
	free(fixed);
	return j;
}

json_t *gw_logprob_entry(struct gw *g, struct hearth *h, const struct hearth_token *t)
{
	json_t *e = json_pack("{s:o,s:f,s:o}", "token", text_json(t->text, t->text_len), "logprob",
			      t->has_logprob ? (double)t->logprob : 0.0, "bytes", bytes_json(t->text, t->text_len));
	json_t *top = json_array();
	for (size_t i = 0; i < t->n_top; i++) {
		char piece[256];
		if (gw_piece(g, h, t->top[i].token, piece, sizeof piece) < 0)
			piece[0] = 0;
		json_array_append_new(top, json_pack("{s:o,s:f,s:o}", "token", text_json(piece, strlen(piece)),
						     "logprob", (double)t->top[i].logprob, "bytes",
						     bytes_json(piece, strlen(piece))));
	}
	json_object_set_new(e, "top_logprobs", top);
	return e;
}

uint32_t gw_context_of(struct hearth *h)
{
	struct hearth_model m;
	return hearth_model_info(h, &m, NULL) == 0 && m.n_ctx ? m.n_ctx : 4096;
}

/* ---- timing ---- */

void gw_hist_observe(struct gw_hist *h, double seconds)
{
	static const double bounds[GW_HIST_BUCKETS] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
							0.25,  0.5,    1,     2.5,  5,     10,   30 };
	size_t i = 0;
	while (i < GW_HIST_BUCKETS && seconds > bounds[i])
		i++;
	atomic_fetch_add(&h->count[i], 1);
	atomic_fetch_add(&h->sum_us, (uint64_t)(seconds * 1e6));
	atomic_fetch_add(&h->n, 1);
}

void gw_timing_start(struct gw_timing *t)
{
	t->t0 = t->t_prev = now_s();
	t->n = 0;
}

void gw_timing_token(struct gw_timing *t, struct gw *g)
{
	double now = now_s();
	gw_hist_observe(t->n == 0 ? &g->metrics.ttft : &g->metrics.tpot, now - (t->n == 0 ? t->t0 : t->t_prev));
	t->t_prev = now;
	t->n++;
}

void gw_metrics_usage(struct gw *g, const struct hearth_result *res)
{
	atomic_fetch_add(&g->metrics.prompt_tokens, res->n_prompt);
	atomic_fetch_add(&g->metrics.gen_tokens, res->n_gen);
	atomic_fetch_add(&g->metrics.cached_tokens, res->n_cached);
}

int gw_connect(struct gw *g, const struct gw_caller *who, struct hearth **out, struct hearth_err *err)
{
	struct hearth_connect_opts o = {
		.socket_path = g->cfg.hearth_socket,
		.client_name = who->name,
	};
	return hearth_connect_with(out, &o, err);
}
