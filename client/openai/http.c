/* The HTTP side of hearth-openai on libmicrohttpd: request bodies collected under a size
 * bound, authentication, routing to the endpoint handlers, JSON and streamed (SSE) replies,
 * and the access figures /metrics reports. */
#include "client/openai/http.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

struct gw_req {
	char *body;
	size_t len, cap;
	bool too_large;
};

void gw_reply_error(struct gw_reply *r, int status, const char *type, const char *param, const char *code,
		    const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	json_decref(r->body);
	r->status = status;
	r->body = json_pack("{s:{s:s,s:s,s:s?,s:s?}}", "error", "message", msg, "type", type, "param", param,
			    "code", code);
}

void gw_reply_hearth_error(struct gw_reply *r, const struct hearth_err *err)
{
	const char *m = err->msg[0] ? err->msg : hearth_strerror(err->code);
	switch (err->code) {
	case HEARTH_EINVAL:
		gw_reply_error(r, 400, "invalid_request_error", NULL, NULL, "%s", m);
		break;
	case HEARTH_ERANGE:
		gw_reply_error(r, 400, "invalid_request_error", NULL, "context_length_exceeded", "%s", m);
		break;
	case HEARTH_EBUSY:
	case HEARTH_EKVFULL:
		gw_reply_error(r, 429, "rate_limit_error", NULL, hearth_strerror(err->code), "%s", m);
		break;
	case HEARTH_EPERM:
		gw_reply_error(r, 403, "permission_error", NULL, NULL, "%s", m);
		break;
	case HEARTH_ECLOSED:
	case HEARTH_EIO:
	case HEARTH_ESHUTDOWN:
	case HEARTH_ETIMEDOUT:
		gw_reply_error(r, 503, "server_error", NULL, hearth_strerror(err->code), "hearthd: %s", m);
		break;
	default:
		gw_reply_error(r, 500, "server_error", NULL, hearth_strerror(err->code), "%s", m);
	}
}

static enum gw_endpoint endpoint_of(const char *url)
{
	if (!strcmp(url, "/v1/chat/completions"))
		return GW_EP_CHAT;
	if (!strcmp(url, "/v1/completions"))
		return GW_EP_COMPLETIONS;
	if (!strcmp(url, "/v1/models"))
		return GW_EP_MODELS;
	if (!strcmp(url, "/v1/embeddings"))
		return GW_EP_EMBEDDINGS;
	if (!strcmp(url, "/health"))
		return GW_EP_HEALTH;
	if (!strcmp(url, "/metrics"))
		return GW_EP_METRICS;
	return GW_EP_OTHER;
}

static void count(struct gw *g, enum gw_endpoint ep, int status)
{
	int k = status < 300 ? 0 : status == 429 ? 2 : status == 503 ? 4 : status < 500 ? 1 : 3;
	atomic_fetch_add(&g->metrics.requests[ep][k], 1);
}

/* Who is asking: a Unix peer by uid (SO_PEERCRED), else the key's name, else "anonymous". */
static bool caller_of(struct gw *g, struct MHD_Connection *c, struct gw_caller *who, struct gw_reply *r)
{
	const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
	snprintf(who->name, sizeof who->name, "openai");
	if (g->n_keys) {
		const char *name = auth ? gw_keys_check(g, auth) : NULL;
		if (!name) {
			gw_reply_error(r, 401, "invalid_request_error", NULL, "invalid_api_key",
				       auth ? "Incorrect API key provided."
					    : "Missing API key: send 'Authorization: Bearer KEY'.");
			return false;
		}
		snprintf(who->name, sizeof who->name, "openai/%s", name);
	}
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	struct ucred cred;
	socklen_t len = sizeof cred;
	if (ci && getsockopt(ci->connect_fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && len == sizeof cred &&
	    !g->n_keys)
		snprintf(who->name, sizeof who->name, "openai/uid:%u", (unsigned)cred.uid);
	return true;
}

/* ---- streamed replies ---- */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	(void)pos;
	struct gw_source *s = cls;
	long n = s->next(s->ctx, buf, max);
	if (n < 0)
		return MHD_CONTENT_READER_END_WITH_ERROR;
	if (n == 0)
		return MHD_CONTENT_READER_END_OF_STREAM;
	return n;
}

static void stream_free(void *cls)
{
	struct gw_source *s = cls;
	s->done(s->ctx);
	free(s);
}

static enum MHD_Result send_reply(struct MHD_Connection *c, struct gw_reply *r)
{
	struct MHD_Response *resp;
	int status = r->status;

	if (r->source.next) {
		struct gw_source *s = malloc(sizeof *s);
		if (!s) {
			r->source.done(r->source.ctx);
			return MHD_NO;
		}
		*s = r->source;
		resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, s, stream_free);
		if (!resp) {
			stream_free(s);
			return MHD_NO;
		}
		MHD_add_response_header(resp, "Content-Type", "text/event-stream");
		MHD_add_response_header(resp, "Cache-Control", "no-cache");
		status = 200;
	} else if (r->text) {
		resp = MHD_create_response_from_buffer(strlen(r->text), r->text, MHD_RESPMEM_MUST_COPY);
		if (resp)
			MHD_add_response_header(resp, "Content-Type", r->content_type ? r->content_type : "text/plain");
	} else {
		char *js = r->body ? json_dumps(r->body, JSON_COMPACT) : NULL;
		if (!js)
			return MHD_NO;
		resp = MHD_create_response_from_buffer(strlen(js), js, MHD_RESPMEM_MUST_FREE);
		if (!resp)
			free(js);
		else
			MHD_add_response_header(resp, "Content-Type", "application/json");
	}
	if (!resp)
		return MHD_NO;
	if (status == 401)
		MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
	enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, resp);
	MHD_destroy_response(resp);
	return ret;
}

static void reply_free(struct gw_reply *r)
{
	json_decref(r->body);
	free(r->text);
}

static void dispatch(struct gw *g, struct MHD_Connection *c, const char *url, const char *method,
		     struct gw_req *req, struct gw_reply *r)
{
	enum gw_endpoint ep = endpoint_of(url);
	bool post = ep == GW_EP_CHAT || ep == GW_EP_COMPLETIONS || ep == GW_EP_EMBEDDINGS;
	struct gw_caller who;

	if (ep == GW_EP_OTHER) {
		gw_reply_error(r, 404, "invalid_request_error", NULL, "unknown_url", "Unknown request URL: %s %s",
			       method, url);
		return;
	}
	if (strcmp(method, post ? "POST" : "GET")) {
		gw_reply_error(r, 405, "invalid_request_error", NULL, "method_not_allowed",
			       "%s takes %s, not %s", url, post ? "POST" : "GET", method);
		return;
	}
	/* Health and metrics answer probes and scrapers without a key, like llama-server's. */
	if (ep == GW_EP_HEALTH) {
		gw_health(g, r);
		return;
	}
	if (ep == GW_EP_METRICS) {
		gw_metrics_reply(g, r);
		return;
	}
	if (!caller_of(g, c, &who, r))
		return;
	if (ep == GW_EP_MODELS) {
		gw_models(g, &who, r);
		return;
	}
	if (req->too_large) {
		gw_reply_error(r, 413, "invalid_request_error", NULL, "request_too_large",
			       "request body larger than %zu bytes", g->cfg.max_body);
		return;
	}
	json_error_t jerr;
	json_t *body = json_loadb(req->body ? req->body : "", req->len, JSON_REJECT_DUPLICATES, &jerr);
	if (!body) {
		gw_reply_error(r, 400, "invalid_request_error", NULL, "invalid_json",
			       "request body is not JSON: %s (line %d, column %d)", jerr.text, jerr.line,
			       jerr.column);
		return;
	}
	if (!json_is_object(body)) {
		gw_reply_error(r, 400, "invalid_request_error", NULL, "invalid_json", "request body is not a JSON object");
	} else if (ep == GW_EP_CHAT) {
		gw_chat_completions(g, &who, body, r);
	} else if (ep == GW_EP_COMPLETIONS) {
		gw_completions(g, &who, body, r);
	} else {
		gw_embeddings(g, &who, body, r);
	}
	json_decref(body);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
				  const char *version, const char *upload, size_t *upload_size, void **state)
{
	(void)version;
	struct gw *g = cls;
	struct gw_req *req = *state;

	if (!req) {
		req = calloc(1, sizeof *req);
		if (!req)
			return MHD_NO;
		*state = req;
		return MHD_YES;
	}
	if (*upload_size) {
		size_t n = *upload_size;
		*upload_size = 0;
		if (req->too_large || n > g->cfg.max_body - req->len) {
			req->too_large = true;
			return MHD_YES;
		}
		if (req->len + n + 1 > req->cap) {
			size_t cap = req->cap ? req->cap * 2 : 4096;
			while (cap < req->len + n + 1)
				cap *= 2;
			char *p = realloc(req->body, cap);
			if (!p)
				return MHD_NO;
			req->body = p;
			req->cap = cap;
		}
		memcpy(req->body + req->len, upload, n);
		req->len += n;
		return MHD_YES;
	}
	struct gw_reply r = { 0 };
	atomic_fetch_add(&g->metrics.in_flight, 1);
	dispatch(g, c, url, method, req, &r);
	atomic_fetch_sub(&g->metrics.in_flight, 1);
	count(g, endpoint_of(url), r.source.next ? 200 : r.status);
	enum MHD_Result ret = send_reply(c, &r);
	reply_free(&r);
	return ret;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **state, enum MHD_RequestTerminationCode why)
{
	(void)c;
	struct gw *g = cls;
	struct gw_req *req = *state;
	if (why == MHD_REQUEST_TERMINATED_CLIENT_ABORT || why == MHD_REQUEST_TERMINATED_READ_ERROR)
		atomic_fetch_add(&g->metrics.requests[GW_EP_OTHER][5], 1);
	if (req) {
		free(req->body);
		free(req);
	}
	*state = NULL;
}

struct MHD_Daemon *gw_http_start(struct gw *g, int listen_fd, char *msg, size_t cap)
{
	struct MHD_Daemon *d = MHD_start_daemon(
		MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL,
		on_request, g, MHD_OPTION_LISTEN_SOCKET, listen_fd, MHD_OPTION_NOTIFY_COMPLETED, on_completed, g,
		MHD_OPTION_CONNECTION_LIMIT, g->cfg.max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
		g->cfg.timeout_s, MHD_OPTION_END);
	if (!d)
		snprintf(msg, cap, "libmicrohttpd refused to start on fd %d", listen_fd);
	return d;
}
