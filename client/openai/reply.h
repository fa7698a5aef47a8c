/* Pieces of OpenAI-shaped replies shared by the endpoints (reply.c): SSE framing, the
 * completion envelope, usage, tool calls, logprob entries, timing into the metrics. */
#ifndef HEARTH_OPENAI_REPLY_H
#define HEARTH_OPENAI_REPLY_H

#include "client/openai/gw.h"

/* Bytes of an SSE stream waiting to be taken by the HTTP layer, plus the envelope's fixed
 * parts (id, created, model). */
struct gw_sse {
	struct gw *g;
	char id[48];
	int64_t created;
	char *buf;
	size_t len, off, cap;
};

void gw_sse_init(struct gw_sse *s, struct gw *g);
void gw_sse_free(struct gw_sse *s);
/* A chunk object {"id", "object", "created", "model", "choices"}; choices is stolen. */
json_t *gw_sse_chunk(struct gw_sse *s, const char *object, json_t *choices);
/* Queues "data: JSON\n\n" (chunk is stolen). */
void gw_sse_send(struct gw_sse *s, json_t *chunk);
/* Queues an error event in OpenAI's error shape. */
void gw_sse_error(struct gw_sse *s, const struct hearth_err *err);
void gw_sse_done(struct gw_sse *s);
bool gw_sse_pending(const struct gw_sse *s);
/* Moves up to cap queued bytes into buf. */
long gw_sse_take(struct gw_sse *s, char *buf, size_t cap);

/* {"id", "object", "created", "model", "choices", "system_fingerprint"}; choices stolen. */
json_t *gw_completion_json(struct gw *g, const char *object, json_t *choices);
json_t *gw_usage_json(const struct hearth_result *res);
const char *gw_finish_name(enum hearth_finish f);
/* {"index"?, "id", "type": "function", "function": {"name", "arguments"}}. */
json_t *gw_tool_call_json(const struct hearth_tool_call *c, size_t index, bool with_index);
/* {"token", "logprob", "bytes", "top_logprobs": [...]} of a sampled token. */
json_t *gw_logprob_entry(struct gw *g, struct hearth *h, const struct hearth_token *t);
/* The text of a token id (cached per gateway; the vocabulary is the daemon's). */
int gw_piece(struct gw *g, struct hearth *h, uint32_t id, char *buf, size_t cap);
uint32_t gw_context_of(struct hearth *h);

struct gw_timing {
	double t0, t_prev;
	uint32_t n;
};
void gw_timing_start(struct gw_timing *t);
void gw_timing_token(struct gw_timing *t, struct gw *g);
void gw_metrics_usage(struct gw *g, const struct hearth_result *res);

#endif
