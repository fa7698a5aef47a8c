/* hearth-openai, the OpenAI-compatible HTTP gateway: its shared types. HTTP comes from
 * libmicrohttpd (one thread per connection, so a streaming reply may block on the daemon),
 * JSON from jansson; the daemon is reached through libhearth only, one hearthd connection per
 * HTTP request, so an HTTP client that goes away ends its request in hearthd at once. */
#ifndef HEARTH_OPENAI_GW_H
#define HEARTH_OPENAI_GW_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/hearth.h"

#define GW_KEYS_MAX 256
#define GW_KEY_NAME_MAX 64
#define GW_KEY_MAX 256

struct gw_key {
	char name[GW_KEY_NAME_MAX];
	char key[GW_KEY_MAX];
	size_t len;
};

struct gw_config {
	const char *listen;             /* "HOST:PORT" for TCP, "" for none */
	const char *unix_path;          /* an HTTP listener on a Unix socket, or NULL */
	const char *hearth_socket;      /* hearthd's socket, NULL = libhearth's default */
	const char *api_keys;           /* key file ("name:key" per line), NULL = no keys */
	const char *model_name;         /* the id /v1/models reports, NULL = the model's own */
	size_t max_body;                /* request body bytes */
	unsigned max_connections;
	unsigned timeout_s;             /* idle HTTP connection */
};

/* Prometheus histogram with fixed bounds, lock-free (one writer at a time per bucket is
 * not needed: each observation is one atomic add). */
#define GW_HIST_BUCKETS 14
struct gw_hist {
	_Atomic uint64_t count[GW_HIST_BUCKETS + 1]; /* last: +Inf */
	_Atomic uint64_t sum_us;
	_Atomic uint64_t n;
};

enum gw_endpoint { GW_EP_CHAT, GW_EP_COMPLETIONS, GW_EP_MODELS, GW_EP_EMBEDDINGS, GW_EP_HEALTH, GW_EP_METRICS,
		   GW_EP_OTHER, GW_EP_COUNT };

struct gw_metrics {
	_Atomic uint64_t requests[GW_EP_COUNT][6];   /* by status class: 2xx,4xx,429,5xx,503,client gone */
	_Atomic uint64_t prompt_tokens;
	_Atomic uint64_t gen_tokens;
	_Atomic uint64_t cached_tokens;         /* prompt tokens the prefix cache held */
	_Atomic uint64_t in_flight;
	struct gw_hist ttft;                         /* seconds to the first token */
	struct gw_hist tpot;                         /* seconds per output token after the first */
};

struct gw {
	struct gw_config cfg;
	struct gw_key keys[GW_KEYS_MAX];
	size_t n_keys;
	struct gw_metrics metrics;
	char model_id[320];
	int64_t started;
};

/* What an HTTP request was allowed as: the key's name, or the Unix peer's uid. Forwarded to
 * hearthd as the connection's client name so its per-client limits follow the caller. */
struct gw_caller {
	char name[96];
};

/* A streamed body (SSE), pulled by the HTTP layer as the client can take it: next fills
 * buf with up to cap bytes and returns how many (blocking for the daemon as needed), 0 at
 * the end, -1 on an error that ends the stream. done frees the source; the HTTP layer calls
 * it when the stream ended or the client went away, which closes the hearthd connection and
 * so ends the request in the daemon. */
struct gw_source {
	long (*next)(void *ctx, char *buf, size_t cap);
	void (*done)(void *ctx);
	void *ctx;
};

/* A reply under construction: status with a JSON body or a text body, or a stream. */
struct gw_reply {
	int status;
	json_t *body;                   /* owned */
	const char *content_type;
	char *text;                     /* owned: a non-JSON body (metrics) */
	struct gw_source source;        /* next != NULL: a streamed 200 */
};

/* The error shape OpenAI clients parse: {"error": {"message", "type", "param", "code"}}. */
void gw_reply_error(struct gw_reply *r, int status, const char *type, const char *param, const char *code,
		    const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* A libhearth error mapped to its HTTP status and OpenAI type. */
void gw_reply_hearth_error(struct gw_reply *r, const struct hearth_err *err);

/* Endpoint handlers. body is the parsed request (NULL for GET), borrowed. */
void gw_chat_completions(struct gw *g, const struct gw_caller *who, json_t *body, struct gw_reply *r);
void gw_completions(struct gw *g, const struct gw_caller *who, json_t *body, struct gw_reply *r);
void gw_embeddings(struct gw *g, const struct gw_caller *who, json_t *body, struct gw_reply *r);
void gw_models(struct gw *g, const struct gw_caller *who, struct gw_reply *r);
void gw_health(struct gw *g, struct gw_reply *r);
void gw_metrics_reply(struct gw *g, struct gw_reply *r);

/* Connects to hearthd on behalf of who. */
int gw_connect(struct gw *g, const struct gw_caller *who, struct hearth **out, struct hearth_err *err);

void gw_hist_observe(struct gw_hist *h, double seconds);

/* The key file: "name:key" or "key" per line, '#' comments. */
int gw_keys_load(struct gw *g, const char *path, char *msg, size_t cap);
/* The key's name when auth (an Authorization header value) matches one, compared in
 * constant time over every key; NULL otherwise. */
const char *gw_keys_check(const struct gw *g, const char *auth);

#endif
