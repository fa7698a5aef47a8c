/* One client connection on the loop thread: frames in, decoded strictly, answered; generate
 * requests handed to the compute thread; token events go straight from the compute thread
 * into the client's ring (session_emit). A session ends when its socket closes, and its
 * memory goes only after the compute thread has handed back every message naming it. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/serve/chat.h"
#include "daemon/serve/ledger_reply.h"
#include "daemon/serve/serve.h"
#include "daemon/serve/spec.h"
#include "daemon/engine/embed.h"
#include "daemon/engine/tokenizer.h"
#include "daemon/serve/offload.h"
#include "protocol/fdpass.h"
#include "protocol/assert.h"
#include "protocol/clock.h"

#define SESSION_LEDGER_REUSE_NS 1000000000ull
#define SESSION_TOKENIZE_INLINE 4096u   /* longer texts are tokenized by offload.c */
#define SESSION_RING_D2C (1u << 20)
#define SESSION_RING_C2D (1u << 20)
/* Full logit rows (f32) the daemon-to-client ring holds beyond SESSION_RING_D2C, so a
 * request that asks for logits does not stall on a client a few tokens behind. */
#define SESSION_RING_LOGIT_ROWS 4
/* The private ring of socket-streamed tokens: the loop thread frames its records onto the
 * socket each time its doorbell rings, so it holds only what one wake-up's worth of steps
 * produced; 256 KiB is thousands of token records. */
#define SESSION_SOCKET_RING (256u << 10)

struct session_write {
	uv_write_t req;
	uint8_t *data;
	size_t len;
};

static void session_finalize(struct session *ss);

/* ---- writing frames ---- */

static void session_welcome(struct session *ss);

static void session_on_write(uv_write_t *req, int status)
{
	struct session_write *w = (struct session_write *)req;
	struct session *ss = req->handle->data;
	(void)status; /* a failed write shows up as a read error or EOF, handled there */
	size_t len = w->len;
	free(w->data);
	free(w);
	if (ss)
		limits_sent(ss, len);
	if (ss && ss->welcome_deferred && !ss->closing &&
	    uv_stream_get_write_queue_size((uv_stream_t *)&ss->pipe) == 0)
		session_welcome(ss);
}

static void session_send_buf(struct session *ss, struct msg_buf *b)
{
	if (ss->handle_closed || !b->len) {
		msg_buf_free(b);
		return;
	}
	/* Past twice the bound something other than requests fills the queue (results of
	 * running generations while reading is paused): the peer has had its chance. */
	if (ss->lim.queued > 2 * ss->srv->cfg.client_send_queue + (1u << 20)) {
		log_warning(ss->srv->log, "client %s (pid %d) does not read its replies: %llu bytes unread, twice client_send_queue: closing",
			    ss->name, (int)ss->cred.pid, (unsigned long long)ss->lim.queued);
		msg_buf_free(b);
		session_close(ss);
		return;
	}
	struct session_write *w = malloc(sizeof *w);
	if (!w) {
		msg_buf_free(b);
		session_close(ss);
		return;
	}
	w->data = b->data;
	w->len = b->len;
	uv_buf_t buf = uv_buf_init((char *)b->data, (unsigned)b->len);
	memset(b, 0, sizeof *b);
	if (uv_write(&w->req, (uv_stream_t *)&ss->pipe, &buf, 1, session_on_write) < 0) {
		free(w->data);
		free(w);
		session_close(ss);
		return;
	}
	limits_queued(ss, buf.len);
}

static void session_send(struct session *ss, const struct msg *m)
{
	struct msg_buf b = { 0 };
	struct hearth_error e;
	if (msg_encode(m, &b, &e) < 0) {
		/* Only a daemon bug gets here: say so to the client rather than go silent. */
		log_error(ss->srv->log, "cannot encode a %s reply: %s", msg_type_name(m->type), e.msg);
		msg_buf_free(&b);
		if (msg_encode_error(&b, m->id, MSG_ERR_INTERNAL, false, &e, "internal error: %s",
				     e.msg) < 0) {
			msg_buf_free(&b);
			return;
		}
	}
	session_send_buf(ss, &b);
}

static void session_send_error(struct session *ss, uint64_t id, enum msg_errcode code, bool fatal,
			       const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void session_send_error(struct session *ss, uint64_t id, enum msg_errcode code, bool fatal,
			       const char *fmt, ...)
{
	char text[MSG_MESSAGE_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	struct msg_buf b = { 0 };
	struct hearth_error e;
	if (msg_encode_error(&b, id, code, fatal, &e, "%s", text) < 0) {
		msg_buf_free(&b);
		return;
	}
	session_send_buf(ss, &b);
}

/* The welcome frame carries the ring's memfd and both eventfds. libuv cannot pass raw fds,
 * so this one frame goes out with sendmsg (fdpass_send); it is only sent while libuv has
 * nothing queued, which keeps the byte stream in order. */
static int session_send_with_fds(struct session *ss, struct msg_buf *b, const int *fds, int n_fds,
				 struct hearth_error *e)
{
	uv_os_fd_t fd;
	if (uv_fileno((uv_handle_t *)&ss->pipe, &fd) < 0)
		return hearth_error_set(e, HEARTH_EIO, "the connection has no descriptor");
	size_t sent = 0;
	int rc = fdpass_send(fd, b->data, b->len, fds, (size_t)n_fds, &sent, e);
	if (rc < 0)
		return rc;
	if (sent < b->len) {
		/* The fds went with the first byte; the rest is ordinary data. */
		struct msg_buf rest = { 0 };
		rest.len = b->len - sent;
		rest.data = malloc(rest.len);
		if (!rest.data)
			return hearth_error_set(e, HEARTH_ENOMEM, "out of memory");
		memcpy(rest.data, b->data + sent, rest.len);
		session_send_buf(ss, &rest);
	}
	return 0;
}

void session_reply(struct session *ss, const struct msg *m)
{
	session_send(ss, m);
}

void session_reply_error(struct session *ss, uint64_t id, enum msg_errcode code, const char *text)
{
	session_send_error(ss, id, code, false, "%s", text);
}

void session_unhold(struct session *ss)
{
	ss->n_inflight--;
	if (ss->closing && ss->n_inflight == 0)
		session_finalize(ss);
}

/* ---- hello / welcome ---- */

static void session_welcome(struct session *ss)
{
	struct server *srv = ss->srv;
	struct hearth_error e;
	ss->hello_pending = false;
	if (ss->want_ring && !ss->ring_open) {
		if (ring_create(&ss->ring, SESSION_RING_D2C + (uint64_t)SESSION_RING_LOGIT_ROWS *
						   server_model_view(srv)->eng.n_vocab * sizeof(float),
				SESSION_RING_C2D, &e) < 0) {
			log_error(srv->log, "client %s: cannot make its ring: %s", ss->name, e.msg);
			session_send_error(ss, ss->hello_id, MSG_ERR_INTERNAL, true,
					   "cannot create the shared-memory ring: %s", e.msg);
			session_close(ss);
			return;
		}
		ss->ring_open = true;
	}
	struct msg m;
	msg_init(&m, MSG_WELCOME, ss->hello_id);
	m.u.welcome.proto_major = MSG_PROTO_MAJOR;
	m.u.welcome.proto_minor = MSG_PROTO_MINOR;
	m.u.welcome.daemon = (struct msg_bytes){ PACKAGE_VERSION, strlen(PACKAGE_VERSION) };
	m.u.welcome.model = server_model_view(srv)->info;
	m.u.welcome.max_frame = FRAME_MAX_DEFAULT;
	m.u.welcome.ring = ss->ring_open;
	m.u.welcome.ring_d2c = ss->ring_open ? ss->ring.tx.cap : 0;
	m.u.welcome.ring_c2d = ss->ring_open ? ss->ring.rx.cap : 0;
	struct msg_buf b = { 0 };
	if (msg_encode(&m, &b, &e) < 0) {
		log_error(srv->log, "cannot encode welcome: %s", e.msg);
		msg_buf_free(&b);
		session_close(ss);
		return;
	}
	if (!ss->ring_open) {
		session_send_buf(ss, &b);
		ss->welcomed = true;
		return;
	}
	if (uv_stream_get_write_queue_size((uv_stream_t *)&ss->pipe) > 0) {
		/* Loading frames still queued: wait until they are out (session_on_write). */
		ss->welcome_deferred = true;
		ss->hello_pending = false;
		msg_buf_free(&b);
		return;
	}
	int fds[3];
	ring_fds(&ss->ring, fds);
	int rc = session_send_with_fds(ss, &b, fds, 3, &e);
	msg_buf_free(&b);
	if (rc < 0) {
		log_warning(srv->log, "client %s: cannot send the welcome: %s", ss->name, e.msg);
		session_close(ss);
		return;
	}
	ss->welcomed = true;
	ss->welcome_deferred = false;
}

void session_model_ready(struct session *ss)
{
	if (ss->hello_pending && !ss->closing)
		session_welcome(ss);
}

void session_model_failed(struct session *ss, const struct hearth_error *e)
{
	if (ss->closing)
		return;
	session_send_error(ss, ss->hello_pending ? ss->hello_id : 0, MSG_ERR_INTERNAL, true,
			   "the model failed to load: %s", e->msg);
}

void session_send_loading(struct session *ss, const char *phase, uint64_t done, uint64_t total)
{
	if (ss->closing)
		return;
	struct msg m;
	msg_init(&m, MSG_LOADING, ss->hello_id);
	m.u.loading.phase = (struct msg_bytes){ phase, strlen(phase) };
	m.u.loading.done = done;
	m.u.loading.total = total;
	session_send(ss, &m);
}

static void session_on_hello(struct session *ss, const struct msg *m)
{
	const struct msg_hello *h = &m->u.hello;
	if (ss->welcomed || ss->hello_pending || ss->welcome_deferred) {
		session_send_error(ss, m->id, MSG_ERR_BAD_STATE, false, "hello was already received");
		return;
	}
	size_t n = h->name.len < MSG_NAME_MAX ? h->name.len : MSG_NAME_MAX;
	memcpy(ss->name, h->name.ptr, n);
	ss->name[n] = '\0';
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)ss->name[i] < 0x20)
			ss->name[i] = '?';
	ss->hello_id = m->id;
	ss->want_ring = h->ring;
	ss->reader.max_payload = FRAME_MAX_DEFAULT; /* LIMITS_HELLO_FRAME_MAX until now */
	log_info(ss->srv->log, "client %s connected (uid %u, pid %d)", ss->name,
		 (unsigned)ss->cred.uid, (int)ss->cred.pid);
	struct server_loading ld;
	server_loading_snapshot(ss->srv, &ld);
	switch (ld.state) {
	case SERVE_LOADING:
		ss->hello_pending = true;
		session_send_loading(ss, ld.phase[0] ? ld.phase : "loading", ld.done, ld.total);
		break;
	case SERVE_READY:
		session_welcome(ss);
		break;
	case SERVE_FAILED:
		session_send_error(ss, m->id, MSG_ERR_INTERNAL, true, "the model failed to load: %s", ld.error);
		break;
	}
}

/* ---- requests ---- */

static struct serve_req *session_find_req(struct session *ss, uint64_t id)
{
	for (struct serve_req *r = ss->reqs; r; r = r->next)
		if (r->id == id)
			return r;
	return NULL;
}

static void session_forget_req(struct session *ss, uint64_t id)
{
	for (struct serve_req **pp = &ss->reqs; *pp; pp = &(*pp)->next) {
		struct serve_req *r = *pp;
		if (r->id != id)
			continue;
		*pp = r->next;
		ss->n_reqs--;
		ss->queued_tokens -= r->tokens;
		policy_uid_release(&ss->srv->policy, ss->cred.uid);
		free(r);
		return;
	}
}

/* Copies a bulk record the client pushed into its ring before the frame that names it.
 * Records are consumed in order; any record before the named one is stale and dropped.
 * want_type 0 accepts text or token ids; *type says which came. */
static int session_take_bulk(struct session *ss, uint32_t want_type, uint64_t ref, void **data,
			     size_t *len, uint32_t *type_out, struct hearth_error *e)
{
	if (!ss->ring_open)
		return hearth_error_set(e, HEARTH_EINVAL, "a *_ref field needs the ring (hello ring=true)");
	/* The client->daemon lane bounds every record the client can push. */
	size_t cap = ss->ring.rx.cap;
	uint8_t *buf = malloc(cap);
	if (!buf)
		return hearth_error_set(e, HEARTH_ENOMEM, "out of memory for a bulk record");
	for (;;) {
		uint32_t type;
		size_t n;
		int rc = ring_pop(&ss->ring, &type, buf, cap, &n, e);
		if (rc < 0) {
			free(buf);
			return HEARTH_EPROTO;
		}
		if (rc == 0) {
			free(buf);
			return hearth_error_set(e, HEARTH_EINVAL,
						"no bulk record with ref %llu in the ring",
						(unsigned long long)ref);
		}
		uint64_t got_ref;
		const void *payload;
		size_t plen;
		if (ring_bulk_decode(type, buf, n, &got_ref, &payload, &plen, e) < 0)
			continue;
		if (got_ref != ref)
			continue;
		if (want_type && type != want_type) {
			free(buf);
			return hearth_error_set(e, HEARTH_EINVAL, "bulk record %llu has the wrong type",
						(unsigned long long)ref);
		}
		memmove(buf, payload, plen);
		*data = buf;
		*len = plen;
		*type_out = type;
		ring_notify(&ss->ring, NULL); /* space freed: wake a client waiting to push */
		return 0;
	}
}

static bool session_emit(void *sink, const struct sched_token *t);

/* Turns the prompt of a generate (text, ids or a bulk record) into token ids. */
static int session_prompt_tokens(struct session *ss, const struct msg_generate *g, int32_t **out,
				 uint32_t *n_out, enum msg_errcode *code, struct hearth_error *e)
{
	const struct tok *tok = server_model_view(ss->srv)->tok;
	uint32_t n_vocab = server_model_view(ss->srv)->eng.n_vocab;
	uint32_t max_ctx = server_model_view(ss->srv)->eng.max_context;
	*code = MSG_ERR_BAD_FIELD;
	const char *text = NULL;
	size_t text_len = 0;
	void *bulk = NULL;
	size_t bulk_len = 0;
	const uint32_t *ids = g->tokens;
	size_t n_ids = g->n_tokens;
	if (g->has_prompt_ref) {
		/* Either record type may carry a prompt: text, or u32 token ids. */
		uint32_t type;
		int rc = session_take_bulk(ss, 0, g->prompt_ref, &bulk, &bulk_len, &type, e);
		if (rc == HEARTH_EPROTO) {
			*code = MSG_ERR_RING;
			return rc;
		}
		if (rc < 0)
			return rc;
		if (type == RING_REC_BULK_TEXT) {
			text = bulk;
			text_len = bulk_len;
		} else {
			ids = bulk; /* 4-byte ids, length checked by ring_bulk_decode */
			n_ids = bulk_len / sizeof(uint32_t);
		}
	} else if (g->has_prompt) {
		text = g->prompt.ptr;
		text_len = g->prompt.len;
	}
	int32_t *toks = NULL;
	size_t n = 0;
	if (text) {
		size_t cap = text_len + 8;
		if (cap > (size_t)max_ctx + 8)
			cap = (size_t)max_ctx + 8;
		toks = malloc(cap * sizeof *toks);
		if (!toks) {
			free(bulk);
			return hearth_error_set(e, HEARTH_ENOMEM, "out of memory for the prompt");
		}
		int rc = tok_encode(tok, text, text_len, tok_add_bos(tok), false, toks, cap, &n, e);
		free(bulk);
		if (rc == HEARTH_ERANGE) {
			free(toks);
			*code = MSG_ERR_CONTEXT;
			return hearth_error_set(e, HEARTH_ERANGE,
						"the prompt is longer than max_context (%u tokens)", max_ctx);
		}
		if (rc < 0) {
			free(toks);
			return rc;
		}
	} else {
		if (n_ids > max_ctx) {
			free(bulk);
			*code = MSG_ERR_CONTEXT;
			return hearth_error_set(e, HEARTH_ERANGE,
						"the prompt has %zu tokens; max_context is %u", n_ids, max_ctx);
		}
		toks = malloc((n_ids ? n_ids : 1) * sizeof *toks);
		if (!toks) {
			free(bulk);
			return hearth_error_set(e, HEARTH_ENOMEM, "out of memory for the prompt");
		}
		for (size_t i = 0; i < n_ids; i++) {
			if (ids[i] >= n_vocab) {
				free(toks);
				free(bulk);
				*code = MSG_ERR_BAD_TOKEN;
				return hearth_error_set(e, HEARTH_EINVAL,
							"tokens[%zu] = %u is beyond the vocabulary (%u tokens)",
							i, ids[i], n_vocab);
			}
			toks[i] = (int32_t)ids[i];
		}
		n = n_ids;
		free(bulk);
	}
	if (n == 0) {
		free(toks);
		return hearth_error_set(e, HEARTH_EINVAL, "the prompt is empty");
	}
	if (n >= max_ctx) {
		free(toks);
		*code = MSG_ERR_CONTEXT;
		return hearth_error_set(e, HEARTH_ERANGE,
					"the prompt has %zu tokens; max_context is %u and one more is needed",
					n, max_ctx);
	}
	*out = toks;
	*n_out = (uint32_t)n;
	return 0;
}

/* Turns every record the compute thread put in the private ring into a frame: `token` for
 * socket streaming, `delta` for a chat's parsed reply. Called when its doorbell rings and
 * before a `done`, so they precede it. */
static void session_drain_socket_tokens(struct session *ss)
{
	if (!ss->sring_open)
		return;
	struct hearth_error e;
	for (;;) {
		uint32_t type;
		const void *p;
		size_t len;
		int rc = ring_peek(&ss->speer, &type, &p, &len, &e);
		if (rc <= 0)
			break; /* both ends are the daemon's own: a broken ring cannot happen */
		uint8_t copy[RING_TOKEN_TEXT_MAX + 64 + RING_TOKEN_TOP_MAX * 8];
		struct ring_token t;
		if (type == SERVE_CHAT_DELTA_REC) {
			/* Built by this daemon's compute thread from the reply it parsed. */
			struct msg f;
			if (serve_chat_delta_decode(p, len, &f, &e) == 0)
				session_send(ss, &f);
		} else if (type == RING_REC_TOKEN && len <= sizeof copy) {
			memcpy(copy, p, len);
			if (ring_token_decode(copy, len, &t, &e) == 0) {
				struct msg_top top[RING_TOKEN_TOP_MAX];
				for (size_t i = 0; i < t.n_top && i < RING_TOKEN_TOP_MAX; i++)
					top[i] = (struct msg_top){ t.top[i].token, t.top[i].logprob };
				struct msg f;
				msg_init(&f, MSG_TOKEN, t.request_id);
				f.u.token.token = t.token;
				f.u.token.text = (struct msg_bytes){ (const char *)t.text, t.text_len };
				f.u.token.has_logprob = t.has_logprob;
				f.u.token.logprob = t.logprob;
				f.u.token.top = top;
				f.u.token.n_top = t.n_top;
				session_send(ss, &f);
			}
		}
		ring_consume(&ss->speer);
	}
}

static void session_on_socket_doorbell(uv_poll_t *h, int status, int events)
{
	struct session *ss = h->data;
	(void)status;
	(void)events;
	ring_doorbell_clear(&ss->speer, NULL);
	/* Over the reply bound the tokens wait in the ring, and the compute thread parks the
	 * sequence when it fills: the back-pressure reaches the generation. */
	if (!ss->closing && !ss->lim.paused)
		session_drain_socket_tokens(ss);
}

/* The private ring for socket-streamed tokens, made at the first request that wants it. */
static int session_open_socket_ring(struct session *ss, struct hearth_error *e)
{
	if (ss->sring_open)
		return 0;
	int rc = ring_create(&ss->sring, SESSION_SOCKET_RING, RING_CAP_MIN, e);
	if (rc < 0)
		return rc;
	int fds[3], dups[3] = { -1, -1, -1 };
	ring_fds(&ss->sring, fds);
	for (int i = 0; i < 3; i++)
		dups[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 0);
	rc = ring_attach(&ss->speer, dups[0], dups[1], dups[2], e); /* takes the dups */
	if (rc < 0) {
		ring_close(&ss->sring);
		return rc;
	}
	ss->sring_open = true;
	uv_poll_init(&ss->srv->loop, &ss->spoll, ring_wait_fd(&ss->speer));
	ss->spoll.data = ss;
	ss->spoll_open = true;
	uv_poll_start(&ss->spoll, UV_READABLE, session_on_socket_doorbell);
	return 0;
}

static void session_send_cb(void *ctx, const struct msg *m);

/* The first checks of every request the scheduler runs: false when a refusal was sent. */
static bool session_req_admissible(struct session *ss, uint64_t id)
{
	if (!ss->welcomed) {
		session_send_error(ss, id, ss->hello_pending ? MSG_ERR_LOADING : MSG_ERR_BAD_STATE,
				   false, ss->hello_pending ? "the model is still loading" : "send hello first");
		return false;
	}
	if (ss->srv->stopping) {
		session_send_error(ss, id, MSG_ERR_SHUTTING_DOWN, false, "the daemon is shutting down");
		return false;
	}
	return true;
}

/* The id is free and the connection below max_requests_per_client: false when refused. */
static bool session_req_slot(struct session *ss, uint64_t id)
{
	if (session_find_req(ss, id)) {
		session_send_error(ss, id, MSG_ERR_DUPLICATE_ID, false,
				   "request %llu is still running", (unsigned long long)id);
		return false;
	}
	if (ss->n_reqs >= ss->srv->cfg.max_requests_per_client) {
		session_send_error(ss, id, MSG_ERR_BUSY, false,
				   "this connection already has %u requests running (max_requests_per_client)",
				   ss->n_reqs);
		return false;
	}
	return true;
}

/* The checks generate and chat share, before any prompt work; false when a refusal was sent. */
static bool session_gen_admissible(struct session *ss, uint64_t id, const struct msg_generate *g, bool chat)
{
	struct hearth_error e;
	if (!session_req_admissible(ss, id))
		return false;
	if (!ss->ring_open && !g->stream_socket) {
		session_send_error(ss, id, MSG_ERR_BAD_STATE, false,
				   "without a shared-memory ring (hello ring=false), ask for socket: true");
		return false;
	}
	if (g->stream_socket && g->logits) {
		session_send_error(ss, id, MSG_ERR_BAD_FIELD, false,
				   "logits rows travel only through the ring; they cannot come with socket: true");
		return false;
	}
	/* A chat's deltas come to the loop thread through the private ring too. */
	if ((g->stream_socket || chat) && session_open_socket_ring(ss, &e) < 0) {
		session_send_error(ss, id, MSG_ERR_INTERNAL, false, "socket streaming: %s", e.msg);
		return false;
	}
	if (!session_req_slot(ss, id))
		return false;
	if (g->top_logprobs > SCHED_MAX_TOP || g->n_stop > SCHED_MAX_STOP_STRINGS ||
	    g->n_stop_tokens > SCHED_MAX_STOP_TOKENS) {
		session_send_error(ss, id, MSG_ERR_BAD_FIELD, false,
				   "at most %d top_logprobs, %d stop strings and %d stop_tokens",
				   SCHED_MAX_TOP, SCHED_MAX_STOP_STRINGS, SCHED_MAX_STOP_TOKENS);
		return false;
	}
	for (size_t i = 0; i < g->n_stop; i++)
		if (g->stop[i].len > SCHED_MAX_STOP_LEN) {
			session_send_error(ss, id, MSG_ERR_BAD_FIELD, false,
					   "stop[%zu] is %zu bytes; at most %d", i, g->stop[i].len,
					   SCHED_MAX_STOP_LEN);
			return false;
		}
	return true;
}

/* The matcher of a request's structured output (grammar, json_schema, json_object) or of a
 * chat's tool calls; *out NULL when nothing constrains it. Compiled grammars come from the
 * model's cache, so a schema used again costs no compilation. */
static int session_grammar(struct session *ss, const struct msg_generate *g, const struct serve_chat *chat,
			   struct grammar_matcher **out, char trigger[SCHED_TRIGGER_MAX], struct hearth_error *e)
{
	enum grammar_kind kind = GRAMMAR_GBNF;
	const char *text = NULL, *trig = "";
	size_t len = 0;
	*out = NULL;
	trigger[0] = 0;
	if (g->has_grammar) {
		text = g->grammar.ptr;
		len = g->grammar.len;
	} else if (g->has_json_schema) {
		kind = GRAMMAR_JSON_SCHEMA;
		text = g->json_schema.ptr;
		len = g->json_schema.len;
	} else if (g->json_object) {
		kind = GRAMMAR_JSON_OBJECT;
		text = "";
	} else if (chat && (text = serve_chat_tool_grammar(chat, &trig))) {
		len = strlen(text);
	}
	if (!text)
		return 0;
	if (!server_model_view(ss->srv)->grammars)
		return hearth_error_set(e, HEARTH_EUNSUPPORTED, "this model has no grammar index");
	struct grammar_index *ix;
	int rc = grammar_cache_get(server_model_view(ss->srv)->grammars, kind, text, len, &ix, e);
	if (rc < 0)
		return rc;
	rc = grammar_matcher_new(out, ix, e);
	grammar_index_unref(ix);
	snprintf(trigger, SCHED_TRIGGER_MAX, "%s", trig);
	return rc;
}

/* The request's prefix-sharing domain: domains never meet, uids and gids in separate halves,
 * 0 for all. */
static uint64_t session_prefix_share(const struct session *ss)
{
	switch (ss->srv->cfg.prefix_share) {
	case CONFIG_SHARE_UID: return (1ull << 32) | ss->cred.uid;
	case CONFIG_SHARE_GROUP: return (2ull << 32) | ss->cred.gid;
	default: return 0;
	}
}

/* Posts a filled SUBMIT message for request id costing `cost` tokens of the connection's
 * queue: the per-connection and per-uid limits, then the scheduler. True when posted (the
 * request is tracked until its message comes back); false when refused, the refusal sent
 * and sm freed (what sm->req points to stays the caller's). */
static bool session_post_req(struct session *ss, uint64_t id, uint64_t cost, struct sched_msg *sm)
{
	struct server *srv = ss->srv;
	struct hearth_error e;
	if (ss->queued_tokens + cost > srv->cfg.max_queued_tokens_per_client) {
		session_send_error(ss, id, MSG_ERR_BUSY, false,
				   "this connection would have %llu tokens queued; the limit is %llu (max_queued_tokens_per_client)",
				   (unsigned long long)(ss->queued_tokens + cost),
				   (unsigned long long)srv->cfg.max_queued_tokens_per_client);
		free(sm);
		return false;
	}
	if (policy_uid_acquire(&srv->policy, ss->cred.uid, &e) < 0) {
		session_send_error(ss, id, MSG_ERR_BUSY, false, "%s", e.msg);
		free(sm);
		return false;
	}
	struct serve_req *r = calloc(1, sizeof *r);
	if (!r) {
		free(sm);
		policy_uid_release(&srv->policy, ss->cred.uid);
		session_send_error(ss, id, MSG_ERR_INTERNAL, false, "out of memory");
		return false;
	}
	sm->result.t_submit = hearth_now_ns();
	r->id = id;
	r->tokens = cost;
	if (serve_post(srv, sm) < 0) {
		free(r);
		policy_uid_release(&srv->policy, ss->cred.uid);
		session_send_error(ss, id, MSG_ERR_BUSY, false, "the daemon's request queue is full");
		return false;
	}
	r->next = ss->reqs;
	ss->reqs = r;
	ss->n_reqs++;
	ss->queued_tokens += cost;
	ss->n_inflight++;
	return true;
}

/* Hands a request with its prompt tokens to the scheduler. Takes prompt (and chat, a chat's
 * state) in every case: on refusal they are freed here. */
static void session_gen_submit(struct session *ss, uint64_t id, const struct msg_generate *g, int32_t *prompt,
			       uint32_t n_prompt, struct serve_chat *chat)
{
	struct hearth_error e;
	struct grammar_matcher *gm = NULL;
	char trigger[SCHED_TRIGGER_MAX];
	if (g->max_tokens == 0) {
		/* Nothing to generate (doc/protocol.md): the prompt was checked, no token is made. */
		struct msg d;
		msg_init(&d, MSG_DONE, id);
		d.u.done.finish = MSG_FINISH_LENGTH;
		d.u.done.n_prompt = n_prompt;
		if (chat)
			serve_chat_finish(chat, id, session_send_cb, ss, &d.u.done);
		session_send(ss, &d);
		goto refuse; /* frees what it was given */
	}
	uint64_t cost = (uint64_t)n_prompt + g->max_tokens;
	if (session_grammar(ss, g, chat, &gm, trigger, &e) < 0) {
		session_send_error(ss, id, MSG_ERR_BAD_FIELD, false, "%s", e.msg);
		goto refuse;
	}
	enum spec_source draft = SPEC_SOURCE_AUTO;
	if (g->has_draft && spec_source_parse(g->draft.ptr, g->draft.len, &draft) < 0) {
		session_send_error(ss, id, MSG_ERR_BAD_FIELD, false,
				   "draft \"%.*s\": auto, lookup or model", (int)g->draft.len, (const char *)g->draft.ptr);
		goto refuse;
	}
	struct sched_msg *sm = sched_msg_new(SCHED_MSG_SUBMIT, &ss->client, ss);
	if (!sm) {
		session_send_error(ss, id, MSG_ERR_INTERNAL, false, "out of memory");
		goto refuse;
	}
	struct sched_request *q = &sm->req;
	q->id = id;
	q->prompt = prompt;
	q->n_prompt = n_prompt;
	q->max_tokens = g->max_tokens;
	q->sampling = (struct sampler_params){
		.temperature = (float)g->sampling.temperature,
		.top_k = (int32_t)g->sampling.top_k,
		.top_p = (float)g->sampling.top_p,
		.min_p = (float)g->sampling.min_p,
		.repeat_penalty = (float)g->sampling.repeat_penalty,
		.repeat_last_n = g->sampling.repeat_last_n,
	};
	q->seed = g->sampling.has_seed ? g->sampling.seed : (hearth_now_ns() ^ ((uint64_t)ss->cred.pid << 32) ^ id);
	for (size_t i = 0; i < g->n_stop_tokens; i++)
		q->stop_tokens[i] = (int32_t)g->stop_tokens[i];
	q->n_stop_tokens = (uint32_t)g->n_stop_tokens;
	for (size_t i = 0; i < g->n_stop; i++) {
		memcpy(q->stop_strings[i], g->stop[i].ptr, g->stop[i].len);
		q->stop_strings[i][g->stop[i].len] = '\0';
	}
	q->n_stop_strings = (uint32_t)g->n_stop;
	q->logprobs = g->logprobs;
	q->top_logprobs = g->top_logprobs;
	q->full_logits = g->logits;
	q->ignore_eos = g->ignore_eos;
	q->speculate = g->has_speculate ? g->speculate : SPEC_K_DEFAULT;
	q->draft_source = draft;
	q->to_socket = g->stream_socket;
	q->prefix_share = session_prefix_share(ss);
	q->special_text = chat != NULL;
	q->user = chat;
	q->grammar = gm;
	memcpy(q->grammar_trigger, trigger, sizeof q->grammar_trigger);
	/* A jumped position has no distribution of its own to report: requests that read the
	 * model's distribution at every position sample every token. */
	q->jump_forward = (!g->has_jump_forward || g->jump_forward) && !g->logprobs && !g->top_logprobs &&
			  !g->logits;
	if (session_post_req(ss, id, cost, sm))
		return;
refuse:
	free(prompt);
	grammar_matcher_free(gm);
	serve_chat_free(chat);
}

static void session_on_generate(struct session *ss, const struct msg *m)
{
	const struct msg_generate *g = &m->u.generate;
	struct hearth_error e;
	if (!session_gen_admissible(ss, m->id, g, false))
		return;
	int32_t *prompt = NULL;
	uint32_t n_prompt = 0;
	enum msg_errcode code;
	if (session_prompt_tokens(ss, g, &prompt, &n_prompt, &code, &e) < 0) {
		session_send_error(ss, m->id, code, code == MSG_ERR_RING, "%s", e.msg);
		if (code == MSG_ERR_RING)
			session_close(ss);
		return;
	}
	session_gen_submit(ss, m->id, g, prompt, n_prompt, NULL);
}

/* A chat: the model's template renders the conversation, the reply is parsed as it comes. */
static void session_on_chat(struct session *ss, const struct msg *m)
{
	const struct msg_chat *c = &m->u.chat;
	struct server *srv = ss->srv;
	struct hearth_error e;
	if (!session_gen_admissible(ss, m->id, &c->gen, true))
		return;
	int32_t *prompt = NULL;
	uint32_t n_prompt = 0;
	enum msg_errcode code;
	struct serve_chat *sc = NULL;
	if (serve_chat_prepare(server_model_view(srv)->chat, server_model_view(srv)->tok, c, server_model_view(srv)->eng.max_context, &prompt, &n_prompt, &sc,
			       &code, &e) < 0) {
		session_send_error(ss, m->id, code, false, "%s", e.msg);
		return;
	}
	session_gen_submit(ss, m->id, &c->gen, prompt, n_prompt, sc);
}

/* ---- embed ---- */

/* Room a reply frame needs besides its vectors: the map, keys, pooling, timings, and up to
 * 5 bytes per n_tokens entry. */
#define SESSION_EMBED_OVERHEAD 256u

int serve_embed_tokens(const struct tok *tok, uint32_t max_ctx, uint32_t n_vocab, const struct msg_embed *em,
		       int32_t **prompt, uint32_t **ends, uint32_t *n_total, enum msg_errcode *code, struct hearth_error *e)
{
	size_t n_in = em->n_input ? em->n_input : em->n_tokens, total = 0, cap = 0;
	int32_t *toks = NULL;
	uint32_t *end = calloc(n_in, sizeof *end);
	*code = MSG_ERR_INTERNAL;
	if (!end)
		return hearth_error_set(e, HEARTH_ENOMEM, "out of memory");
	for (size_t i = 0; i < n_in; i++) {
		/* Room for this input at its longest: the context, and one more to tell too long. */
		size_t want = total + max_ctx + 2;
		if (want > cap) {
			size_t ncap = cap ? cap * 2 : 1024;
			while (ncap < want)
				ncap *= 2;
			int32_t *t = realloc(toks, ncap * sizeof *t);
			if (!t)
				goto oom;
			toks = t;
			cap = ncap;
		}
		size_t n = 0;
		if (em->n_input) {
			bool eos = tok_add_eos(tok);
			int rc = tok_encode(tok, em->input[i].ptr, em->input[i].len, tok_add_bos(tok), true, toks + total,
					    max_ctx + 1 - eos, &n, e);
			if (rc == HEARTH_ERANGE || (rc == 0 && n + eos > max_ctx)) {
				*code = MSG_ERR_CONTEXT;
				hearth_error_set(e, HEARTH_ERANGE, "input[%zu] is %zu tokens; the context holds %u", i,
						 n + eos, max_ctx);
				goto fail;
			}
			if (rc < 0) {
				*code = MSG_ERR_BAD_FIELD;
				hearth_error_prefix(e, "input[%zu]", i);
				goto fail;
			}
			if (eos)
				toks[total + n++] = tok_eos(tok);
			if (n == 0) {
				*code = MSG_ERR_BAD_FIELD;
				hearth_error_set(e, HEARTH_EINVAL, "input[%zu] makes no token", i);
				goto fail;
			}
		} else {
			const struct msg_u32s *a = &em->tokens[i];
			if (a->n > max_ctx) {
				*code = MSG_ERR_CONTEXT;
				hearth_error_set(e, HEARTH_ERANGE, "tokens[%zu] has %zu tokens; the context holds %u", i, a->n,
						 max_ctx);
				goto fail;
			}
			for (size_t j = 0; j < a->n; j++) {
				if (a->v[j] >= n_vocab) {
					*code = MSG_ERR_BAD_TOKEN;
					hearth_error_set(e, HEARTH_EINVAL, "tokens[%zu][%zu] = %u is beyond the vocabulary (%u tokens)",
							 i, j, a->v[j], n_vocab);
					goto fail;
				}
				toks[total + j] = (int32_t)a->v[j];
			}
			n = a->n;
		}
		total += n;
		end[i] = (uint32_t)total;
	}
	*prompt = toks;
	*ends = end;
	*n_total = (uint32_t)total;
	return 0;
oom:
	hearth_error_set(e, HEARTH_ENOMEM, "out of memory for the inputs' tokens");
fail:
	free(toks);
	free(end);
	return e->code ? e->code : HEARTH_EINVAL;
}

void session_embed_submit(struct session *ss, uint64_t id, int pooling, size_t n_in, int32_t *prompt,
			  uint32_t *ends, uint32_t n_total)
{
	size_t n_embd = server_model_view(ss->srv)->eng.n_embd;
	float *out = malloc(n_in * n_embd * sizeof *out);
	struct sched_msg *sm = sched_msg_new(SCHED_MSG_SUBMIT, &ss->client, ss);
	/* A duplicate id may have come while the texts were tokenized off the loop. */
	if (!out || !sm || !session_req_slot(ss, id)) {
		if (!out || !sm)
			session_send_error(ss, id, MSG_ERR_INTERNAL, false, "out of memory");
		free(out);
		free(sm);
		free(prompt);
		free(ends);
		return;
	}
	struct sched_request *q = &sm->req;
	q->id = id;
	q->prompt = prompt;
	q->n_prompt = n_total;
	q->embed = true;
	q->pooling = pooling;
	q->n_inputs = (uint32_t)n_in;
	q->input_end = ends;
	q->embd_out = out;
	q->prefix_share = session_prefix_share(ss);
	if (!session_post_req(ss, id, n_total, sm)) {
		free(prompt);
		free(ends);
		free(out);
	}
}

/* Texts of an embed copied for a worker: one allocation holds the array and the bytes. */
static struct msg_embed *session_embed_copy(const struct msg_embed *em)
{
	size_t bytes = em->n_input * sizeof(struct msg_bytes);
	for (size_t i = 0; i < em->n_input; i++)
		bytes += em->input[i].len + 1;
	struct msg_embed *c = malloc(sizeof *c + bytes);
	if (!c)
		return NULL;
	*c = (struct msg_embed){ .input = (struct msg_bytes *)(c + 1), .n_input = em->n_input };
	char *at = (char *)(c->input + em->n_input);
	for (size_t i = 0; i < em->n_input; i++) {
		memcpy(at, em->input[i].ptr, em->input[i].len);
		at[em->input[i].len] = 0;
		c->input[i] = (struct msg_bytes){ at, em->input[i].len };
		at += em->input[i].len + 1;
	}
	return c;
}

static void session_on_embed(struct session *ss, const struct msg *m)
{
	const struct msg_embed *em = &m->u.embed;
	const struct server_model *model = server_model_view(ss->srv);
	struct hearth_error e = { 0 };
	if (!session_req_admissible(ss, m->id) || !session_req_slot(ss, m->id))
		return;
	/* The request's pooling, else the file's; a file that declares none is a generative
	 * model, which gives a vector only for a pooling the request names. */
	enum model_pooling pooling = (enum model_pooling)model->eng.pooling;
	if (em->has_pooling)
		embed_pooling_parse(em->pooling.ptr, em->pooling.len, &pooling);
	if (pooling != MODEL_POOLING_MEAN && pooling != MODEL_POOLING_CLS && pooling != MODEL_POOLING_LAST) {
		session_send_error(ss, m->id, MSG_ERR_BAD_FIELD, false,
				   "this model's pooling_type is %s, which gives no single vector: name a pooling "
				   "(mean, cls or last)", embed_pooling_name(pooling));
		return;
	}
	size_t n_in = em->n_input ? em->n_input : em->n_tokens, n_embd = model->eng.n_embd;
	size_t per_frame = (FRAME_MAX_DEFAULT - SESSION_EMBED_OVERHEAD) / (n_embd * sizeof(float) + 5);
	if (n_in > per_frame) {
		session_send_error(ss, m->id, MSG_ERR_TOO_LARGE, false,
				   "%zu inputs: the vectors of at most %zu (%zu floats each) fit in one reply frame",
				   n_in, per_frame, n_embd);
		return;
	}
	size_t text_bytes = 0;
	for (size_t i = 0; i < em->n_input; i++)
		text_bytes += em->input[i].len;
	if (text_bytes > SESSION_TOKENIZE_INLINE) {
		/* Long texts take the tokenizer milliseconds to seconds: off the loop thread. */
		struct msg_embed *copy = session_embed_copy(em);
		if (!copy) {
			session_send_error(ss, m->id, MSG_ERR_INTERNAL, false, "out of memory");
			return;
		}
		offload_embed(ss, m->id, pooling, copy);
		return;
	}
	int32_t *prompt = NULL;
	uint32_t *ends = NULL, n_total = 0;
	enum msg_errcode code;
	if (serve_embed_tokens(model->tok, model->eng.max_context, model->eng.n_vocab, em, &prompt, &ends, &n_total,
			       &code, &e) < 0) {
		session_send_error(ss, m->id, code, false, "%s", e.msg);
		return;
	}
	session_embed_submit(ss, m->id, pooling, n_in, prompt, ends, n_total);
}

/* The final frame of an embed request the scheduler handed back. */
static void session_embed_reply(struct session *ss, const struct sched_msg *m)
{
	const struct sched_result *res = &m->result;
	const struct sched_request *q = &m->req;
	if (res->finish == SCHED_FINISH_ERROR) {
		session_send_error(ss, q->id, msg_errcode_from_hearth(res->err.code), false, "%s", res->err.msg);
		return;
	}
	struct msg r;
	if (res->finish == SCHED_FINISH_CANCELED) {
		msg_init(&r, MSG_DONE, q->id);
		r.u.done.finish = MSG_FINISH_CANCEL;
		r.u.done.n_prompt = res->n_prompt;
		session_send(ss, &r);
		return;
	}
	uint32_t n_embd = server_model_view(ss->srv)->eng.n_embd;
	uint32_t counts[MSG_EMBED_INPUTS_MAX];
	for (uint32_t i = 0; i < q->n_inputs; i++)
		counts[i] = q->input_end[i] - (i ? q->input_end[i - 1] : 0);
	const char *pn = embed_pooling_name((enum model_pooling)q->pooling);
	uint64_t admit = res->t_admit ? res->t_admit : res->t_end;
	msg_init(&r, MSG_EMBEDDINGS, q->id);
	r.u.embeddings = (struct msg_embeddings){
		.n_embd = n_embd,
		.data = { (const char *)q->embd_out, (size_t)q->n_inputs * n_embd * sizeof(float) },
		.n_tokens = counts,
		.n_inputs = q->n_inputs,
		.pooling = { pn, strlen(pn) },
		.n_cached = res->n_cached,
		.queue_ms = (double)(admit - res->t_submit) / 1e6,
		.compute_ms = (double)(res->t_end - admit) / 1e6,
	};
	session_send(ss, &r);
}

static void session_on_cancel(struct session *ss, const struct msg *m)
{
	uint64_t target = m->u.cancel.target;
	struct msg d;
	msg_init(&d, MSG_DONE, m->id);
	d.u.done.finish = MSG_FINISH_OK;
	struct serve_req *req = session_find_req(ss, target);
	if (!req || req->cancel_posted) {
		/* Idempotent (doc/protocol.md): the request may have finished while the cancel
		 * was on its way, and a repeated cancel adds nothing, so it costs the daemon-wide
		 * queue nothing either. */
		session_send(ss, &d);
		return;
	}
	struct sched_msg *sm = sched_msg_new(SCHED_MSG_CANCEL, &ss->client, ss);
	if (sm)
		sm->req_id = target;
	int rc = serve_post(ss->srv, sm);
	if (rc < 0) {
		if (rc == HEARTH_ENOMEM)
			session_send_error(ss, m->id, MSG_ERR_INTERNAL, false, "out of memory");
		else
			session_send_error(ss, m->id, MSG_ERR_BUSY, false,
					   "the daemon's request queue is full");
		return;
	}
	ss->n_inflight++;
	req->cancel_posted = true;
	session_send(ss, &d);
}

static void session_on_tokenize(struct session *ss, const struct msg *m)
{
	const struct msg_tokenize *t = &m->u.tokenize;
	const struct tok *tok = server_model_view(ss->srv)->tok;
	/* add_bos asks for the model's BOS, which a file whose tokenizer.ggml.add_bos_token is
	 * false does not have: as llama.cpp's add_special, and as the daemon tokenizes prompts. */
	const bool add_bos = t->add_bos && tok_add_bos(tok);
	struct hearth_error e;
	const char *text = t->text.ptr;
	size_t len = t->text.len;
	void *bulk = NULL;
	if (t->has_text_ref) {
		uint32_t type;
		int rc = session_take_bulk(ss, RING_REC_BULK_TEXT, t->text_ref, &bulk, &len, &type, &e);
		if (rc < 0) {
			session_send_error(ss, m->id, rc == HEARTH_EPROTO ? MSG_ERR_RING : MSG_ERR_BAD_FIELD,
					   rc == HEARTH_EPROTO, "%s", e.msg);
			if (rc == HEARTH_EPROTO)
				session_close(ss);
			return;
		}
		text = bulk;
	}
	if (len > SESSION_TOKENIZE_INLINE) {
		/* Long texts take the tokenizer milliseconds to seconds: off the loop thread. */
		char *copy = bulk ? bulk : malloc(len ? len : 1);
		if (!copy) {
			session_send_error(ss, m->id, MSG_ERR_INTERNAL, false, "out of memory");
			return;
		}
		if (!bulk)
			memcpy(copy, text, len);
		offload_tokenize(ss, m->id, copy, len, add_bos, t->special);
		return;
	}
	size_t cap = len + 8, n = 0;
	if (cap > MSG_ARRAY_MAX)
		cap = MSG_ARRAY_MAX;
	int32_t *ids = malloc(cap * sizeof *ids);
	if (!ids) {
		free(bulk);
		session_send_error(ss, m->id, MSG_ERR_INTERNAL, false, "out of memory");
		return;
	}
	int rc = tok_encode(tok, text, len, add_bos, t->special, ids, cap, &n, &e);
	free(bulk);
	if (rc < 0) {
		free(ids);
		session_send_error(ss, m->id, rc == HEARTH_ERANGE ? MSG_ERR_TOO_LARGE : MSG_ERR_BAD_FIELD,
				   false, "%s", e.msg);
		return;
	}
	struct msg r;
	msg_init(&r, MSG_TOKENS, m->id);
	r.u.tokens.tokens = (uint32_t *)ids; /* ids are < n_vocab, so non-negative */
	r.u.tokens.n_tokens = n;
	session_send(ss, &r);
	free(ids);
}

static void session_on_detokenize(struct session *ss, const struct msg *m)
{
	const struct msg_detokenize *d = &m->u.detokenize;
	const struct tok *tok = server_model_view(ss->srv)->tok;
	uint32_t n_vocab = server_model_view(ss->srv)->eng.n_vocab;
	for (size_t i = 0; i < d->n_tokens; i++)
		if (d->tokens[i] >= n_vocab) {
			session_send_error(ss, m->id, MSG_ERR_BAD_TOKEN, false,
					   "tokens[%zu] = %u is beyond the vocabulary (%u tokens)", i,
					   d->tokens[i], n_vocab);
			return;
		}
	struct hearth_error e;
	size_t need = 0;
	char small[1];
	int rc = tok_decode(tok, (const int32_t *)d->tokens, d->n_tokens, false, small, 0, &need, &e);
	if (rc < 0 && rc != HEARTH_ERANGE) {
		session_send_error(ss, m->id, MSG_ERR_BAD_FIELD, false, "%s", e.msg);
		return;
	}
	if (need > MSG_STR_MAX) {
		session_send_error(ss, m->id, MSG_ERR_TOO_LARGE, false,
				   "the text would be %zu bytes; at most %u fit in a frame", need,
				   MSG_STR_MAX);
		return;
	}
	char *buf = malloc(need + 1);
	if (!buf) {
		session_send_error(ss, m->id, MSG_ERR_INTERNAL, false, "out of memory");
		return;
	}
	size_t n = 0;
	tok_decode(tok, (const int32_t *)d->tokens, d->n_tokens, false, buf, need + 1, &n, &e);
	struct msg r;
	msg_init(&r, MSG_TEXT, m->id);
	r.u.text.text = (struct msg_bytes){ buf, n };
	session_send(ss, &r);
	free(buf);
}

static uint64_t session_rss(void)
{
	FILE *f = fopen("/proc/self/statm", "r");
	unsigned long long size = 0, rss = 0;
	if (f) {
		if (fscanf(f, "%llu %llu", &size, &rss) != 2)
			rss = 0;
		fclose(f);
	}
	return rss * (uint64_t)sysconf(_SC_PAGESIZE);
}

static void session_on_stats(struct session *ss, const struct msg *m)
{
	struct server *srv = ss->srv;
	struct msg r;
	msg_init(&r, MSG_STATS_REPLY, m->id);
	struct msg_stats_reply *st = &r.u.stats;
	st->uptime_ms = (hearth_now_ns() - srv->start_ns) / 1000000;
	st->clients = server_n_sessions(srv);
	if (srv->sched) {
		const struct sched_stats *ss_ = sched_stats(srv->sched);
		st->running = atomic_load(&ss_->running);
		st->queued = atomic_load(&ss_->waiting);
		st->prompt_tokens = atomic_load(&ss_->tokens_prefilled);
		st->gen_tokens = atomic_load(&ss_->tokens_generated);
		st->kv_used = atomic_load(&ss_->kv_used);
		st->kv_total = atomic_load(&ss_->kv_total);
		st->draft_kv_total = atomic_load(&ss_->draft_kv_total);
		st->draft_kv_used = atomic_load(&ss_->draft_kv_used);
		st->has_draft_kv = st->draft_kv_total > 0;
		st->draft_tokens = atomic_load(&ss_->spec_drafted);
		st->draft_accepted = atomic_load(&ss_->spec_accepted);
		st->draft_model_tokens = atomic_load(&ss_->spec_model_drafted);
		st->draft_model_accepted = atomic_load(&ss_->spec_model_accepted);
		st->prefix_lookup_tokens = atomic_load(&ss_->prefix_lookup_tokens);
		st->prefix_hit_tokens = atomic_load(&ss_->prefix_hit_tokens);
	}
	st->rss = session_rss();
	/* stats is answered before hello too, so a monitor sees the load's progress. */
	struct server_loading ld;
	server_loading_snapshot(srv, &ld);
	const char *phase = ld.state == SERVE_READY ? "ready" : ld.state == SERVE_FAILED ? "failed" :
			    ld.phase[0] ? ld.phase : "loading";
	st->phase = (struct msg_bytes){ phase, strlen(phase) };
	session_send(ss, &r);
}

/* The ledger's cache key: the model and every client ring, which a new reply must show. */
static void ledger_key_of(struct session *o, void *ctx)
{
	uint64_t *key = ctx;
	if (o->ring_open)
		*key = (*key ^ (uint64_t)(uintptr_t)o->ring.map) * 0x100000001b3ull;
}

struct ring_ranges {
	struct ledger_range *ranges;
	char (*names)[LEDGER_NAME_MAX];
	size_t n;
};

/* The rings of the first clients by name; any more are counted with shared memory. */
static void ledger_ring_of(struct session *o, void *ctx)
{
	struct ring_ranges *rr = ctx;
	if (!o->ring_open || rr->n >= LEDGER_MAX_RANGES)
		return;
	snprintf(rr->names[rr->n], sizeof rr->names[rr->n], "ring %.32s (pid %d)", o->name, (int)o->cred.pid);
	rr->ranges[rr->n] = (struct ledger_range){ rr->names[rr->n], LEDGER_RINGS, o->ring.map, o->ring.map_size };
	rr->n++;
}

/* Counts every byte the daemon holds (ledger_collect: the arena region by region, client
 * rings, code, the rest of the heap) and answers with it. It reads /proc and calls
 * mincore: milliseconds on the loop thread, so a collection is reused for a second while
 * the set of rings and the model are unchanged (ledger_last). */
static void session_on_ledger(struct session *ss, const struct msg *m)
{
	struct server *srv = ss->srv;
	uint64_t key = 0x9e3779b97f4a7c15ull * (uint64_t)(uintptr_t)(server_model_view(srv) ? server_model_view(srv)->arena : NULL);
	server_sessions_walk(srv, ledger_key_of, &key);
	uint64_t now = hearth_now_ns();
	struct msg_ledger_entry *ents = malloc(LEDGER_MAX_ENTRIES * sizeof *ents);
	if (ents && srv->ledger_last && srv->ledger_last_key == key &&
	    now - srv->ledger_last_ns < SESSION_LEDGER_REUSE_NS) {
		struct msg r;
		msg_init(&r, MSG_LEDGER_REPLY, m->id);
		ledger_to_reply(srv->ledger_last, ents, LEDGER_MAX_ENTRIES, &r.u.ledger);
		session_send(ss, &r);
		free(ents);
		return;
	}
	struct ledger *l = malloc(sizeof *l);
	if (!l || !ents) {
		free(l);
		free(ents);
		session_send_error(ss, m->id, MSG_ERR_INTERNAL, false, "out of memory");
		return;
	}
	/* The rings of the first clients by name; any more are counted with shared memory. */
	struct ledger_range ranges[LEDGER_MAX_RANGES];
	char names[LEDGER_MAX_RANGES][LEDGER_NAME_MAX];
	const struct server_model *model = server_model_view(srv);
	struct ring_ranges rr = { ranges, names, 0 };
	server_sessions_walk(srv, ledger_ring_of, &rr);
	struct hearth_error e;
	if (ledger_collect(l, model ? model->arena : NULL, ranges, rr.n, model ? model->load : NULL, &e) < 0) {
		session_send_error(ss, m->id, MSG_ERR_INTERNAL, false, "ledger: %s", e.msg);
	} else {
		struct msg r;
		msg_init(&r, MSG_LEDGER_REPLY, m->id);
		ledger_to_reply(l, ents, LEDGER_MAX_ENTRIES, &r.u.ledger);
		session_send(ss, &r);
		free(srv->ledger_last);
		srv->ledger_last = l;
		srv->ledger_last_ns = now;
		srv->ledger_last_key = key;
		l = NULL;
	}
	free(l);
	free(ents);
}

static void session_dispatch(struct session *ss, const struct msg *m)
{
	if (m->type != MSG_HELLO && m->type != MSG_PING && m->type != MSG_STATS && !ss->welcomed) {
		struct server_loading ld;
		server_loading_snapshot(ss->srv, &ld);
		bool loading = ss->hello_pending || ld.state == SERVE_LOADING;
		session_send_error(ss, m->id, loading ? MSG_ERR_LOADING : MSG_ERR_BAD_STATE, false,
				   loading ? "the model is still loading" : "send hello first");
		return;
	}
	switch (m->type) {
	case MSG_HELLO:
		session_on_hello(ss, m);
		break;
	case MSG_GENERATE:
		session_on_generate(ss, m);
		break;
	case MSG_CHAT:
		session_on_chat(ss, m);
		break;
	case MSG_CANCEL:
		session_on_cancel(ss, m);
		break;
	case MSG_TOKENIZE:
		session_on_tokenize(ss, m);
		break;
	case MSG_DETOKENIZE:
		session_on_detokenize(ss, m);
		break;
	case MSG_EMBED:
		session_on_embed(ss, m);
		break;
	case MSG_STATS:
		session_on_stats(ss, m);
		break;
	case MSG_LEDGER:
		session_on_ledger(ss, m);
		break;
	case MSG_PING: {
		struct msg r;
		msg_init(&r, MSG_PONG, m->id);
		session_send(ss, &r);
		break;
	}
	default:
		session_send_error(ss, m->id, MSG_ERR_UNKNOWN_TYPE, false, "%s is not a request",
				   msg_type_name(m->type));
		break;
	}
}

/* ---- reading ---- */

static void session_take_frames(struct session *ss);

static void session_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct session *ss = (struct session *)h;
	(void)suggested;
	buf->base = (char *)ss->rbuf;
	buf->len = sizeof ss->rbuf;
}

static void session_on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
	struct session *ss = (struct session *)st;
	if (n < 0) {
		if (n != UV_EOF)
			log_debug(ss->srv->log, "client %s: read: %s", ss->name, uv_strerror((int)n));
		session_close(ss);
		return;
	}
	if (n == 0 || ss->closing)
		return;
	struct hearth_error e;
	if (frame_reader_feed(&ss->reader, buf->base, (size_t)n, &e) < 0) {
		session_send_error(ss, 0, MSG_ERR_BAD_FRAME, true, "%s", e.msg);
		session_close(ss);
		return;
	}
	session_take_frames(ss);
}

void session_resume_reading(struct session *ss)
{
	session_drain_socket_tokens(ss);
	session_take_frames(ss);
	if (!ss->closing && !ss->lim.paused)
		uv_read_start((uv_stream_t *)&ss->pipe, session_on_alloc, session_on_read);
}

/* Answers the frames buffered so far; stops early while the peer's unread replies are over
 * their bound (the rest wait in the reader until session_resume_reading). */
static void session_take_frames(struct session *ss)
{
	struct hearth_error e;
	while (!ss->closing && !ss->lim.paused) {
		const uint8_t *payload;
		size_t len;
		int rc = frame_reader_next(&ss->reader, &payload, &len, &e);
		if (rc == FRAME_NEED_MORE)
			break;
		if (rc == FRAME_OVERSIZED) {
			session_send_error(ss, 0, MSG_ERR_TOO_LARGE, false, "%s", e.msg);
			continue;
		}
		if (rc < 0) {
			session_send_error(ss, 0, MSG_ERR_BAD_FRAME, true, "%s", e.msg);
			session_close(ss);
			return;
		}
		struct msg m;
		struct msg_reject rej;
		if (msg_decode(payload, len, MSG_FROM_CLIENT, &m, &rej, &e) < 0) {
			session_send_error(ss, rej.id, rej.code, false, "%s", e.msg);
			continue;
		}
		session_dispatch(ss, &m);
		msg_free(&m);
	}
	if (!ss->closing)
		limits_after_read(ss);
}

/* ---- the compute thread's side ---- */

/* Runs on the compute thread: puts one token event (and the logits row, when asked) into
 * the client's ring and rings its doorbell. The ring's tx lane is touched by no other
 * thread. */
static bool session_emit(void *sink, const struct sched_token *t)
{
	struct session *ss = sink;
	struct ring *r = t->to_socket ? &ss->sring : &ss->ring;
	struct ring_token rt = {
		.request_id = t->req_id,
		.token = (uint32_t)t->token,
		.has_logprob = t->n_top > 0 || t->logprob != 0,
		.logprob = t->logprob,
		.text = (const uint8_t *)t->text,
		.text_len = t->text_len,
		.top = NULL,
		.n_top = 0,
		.t_sampled_ns = t->t_sampled_ns,
	};
	struct ring_top top[SCHED_MAX_TOP];
	for (uint32_t i = 0; i < t->n_top && i < SCHED_MAX_TOP; i++)
		top[i] = (struct ring_top){ (uint32_t)t->top_ids[i], t->top_logprobs[i] };
	rt.top = top;
	rt.n_top = t->n_top;
	if (t->logits) {
		/* Both records or neither: room for each plus a wrap's padding. */
		size_t need = 2 * (ring_token_size(&rt) + 16 + (size_t)t->n_vocab * 4 + 32);
		if (r->tx.cap - ring_tx_used(r) < need)
			return false;
		int lrc = ring_push_logits(r, t->req_id, t->index, t->logits, t->n_vocab, NULL);
		if (lrc == HEARTH_EBUSY)
			return false;
		if (lrc < 0)
			goto broken;
	}
	int rc = ring_push_token(r, &rt, NULL);
	if (rc == HEARTH_EBUSY)
		return false;
	if (rc < 0)
		goto broken;
	ring_notify(r, NULL);
	/* A chat's reply parser sees each token's text once, right after the token went out;
	 * its deltas wait in the request's state when the private ring is full. */
	if (t->user)
		serve_chat_feed(t->user, &ss->sring, t->req_id, t->index, t->text, t->text_len);
	return true;
broken:
	/* The client corrupted its ring: its sequences stall until the loop closes it. */
	atomic_store(&ss->ring_broken, true);
	uv_async_send(&ss->srv->wake);
	return false;
}

static void session_send_cb(void *ctx, const struct msg *m)
{
	session_send(ctx, m);
}

/* Runs on the loop thread for every message the compute thread hands back. */
void session_deliver(struct server *srv, struct sched_msg *m)
{
	struct session *ss = m->user;
	if (!ss) {
		free(m);
		return;
	}
	hearth_assert(ss->n_inflight > 0);
	ss->n_inflight--;
	if (m->type == SCHED_MSG_SUBMIT && m->req.embed) {
		if (!ss->closing)
			session_embed_reply(ss, m);
		session_forget_req(ss, m->req.id);
		free(m->req.prompt);
		free(m->req.input_end);
		free(m->req.embd_out);
	} else if (m->type == SCHED_MSG_SUBMIT) {
		const struct sched_result *res = &m->result;
		struct serve_chat *chat = m->req.user;
		if ((m->req.to_socket || chat) && !ss->closing)
			session_drain_socket_tokens(ss); /* every token and delta before the final frame */
		if (!ss->closing) {
			if (res->finish == SCHED_FINISH_ERROR) {
				session_send_error(ss, m->req.id, msg_errcode_from_hearth(res->err.code),
						   false, "%s", res->err.msg);
			} else {
				struct msg d;
				msg_init(&d, MSG_DONE, m->req.id);
				struct msg_done *dn = &d.u.done;
				switch (res->finish) {
				case SCHED_FINISH_LENGTH: dn->finish = MSG_FINISH_LENGTH; break;
				case SCHED_FINISH_CONTEXT: dn->finish = MSG_FINISH_CONTEXT; break;
				case SCHED_FINISH_CANCELED: dn->finish = MSG_FINISH_CANCEL; break;
				default: dn->finish = MSG_FINISH_STOP; break;
				}
				dn->n_prompt = res->n_prompt;
				dn->n_gen = res->n_generated;
				dn->n_cached = res->n_cached;
				dn->n_forced = res->n_forced;
				uint64_t admit = res->t_admit ? res->t_admit : res->t_end;
				uint64_t first = res->t_first ? res->t_first : res->t_end;
				dn->queue_ms = (double)(admit - res->t_submit) / 1e6;
				dn->prefill_ms = (double)(first - admit) / 1e6;
				dn->decode_ms = (double)(res->t_end - first) / 1e6;
				dn->prefill_tps = dn->prefill_ms > 0 ? (res->n_prompt - res->n_cached) / (dn->prefill_ms / 1e3) : 0;
				dn->decode_tps = dn->decode_ms > 0 && res->n_generated > 1
					? (res->n_generated - 1) / (dn->decode_ms / 1e3) : 0;
				if (chat)
					serve_chat_finish(chat, m->req.id, session_send_cb, ss, dn);
				session_send(ss, &d);
			}
		}
		session_forget_req(ss, m->req.id);
		free(m->req.prompt);
		grammar_matcher_free(m->req.grammar);
		serve_chat_free(chat);
	}
	free(m);
	if (ss->closing && ss->n_inflight == 0)
		session_finalize(ss);
}

/* ---- opening and closing ---- */

void session_accept(struct server *srv)
{
	struct session *ss = calloc(1, sizeof *ss);
	if (!ss) {
		log_error(srv->log, "out of memory for a new client");
		return;
	}
	ss->srv = srv;
	snprintf(ss->name, sizeof ss->name, "?");
	uv_pipe_init(&srv->loop, &ss->pipe, 0);
	ss->pipe.data = ss;
	if (uv_accept((uv_stream_t *)&srv->listener, (uv_stream_t *)&ss->pipe) < 0) {
		ss->handle_closed = true;
		uv_close((uv_handle_t *)&ss->pipe, (uv_close_cb)free);
		return;
	}
	server_session_link(srv, ss);
	ss->client.sink = ss;
	ss->client.emit = session_emit;
	struct hearth_error e;
	ss->lim.since_ns = hearth_now_ns();
	if (frame_reader_init(&ss->reader, LIMITS_HELLO_FRAME_MAX, &e) < 0) {
		log_error(srv->log, "new client: %s", e.msg);
		session_close(ss);
		return;
	}
	ss->reader_open = true;
	uv_os_fd_t fd;
	uv_fileno((uv_handle_t *)&ss->pipe, &fd);
	if (policy_check(&srv->policy, fd, &ss->cred, &e) < 0) {
		log_warning(srv->log, "refused a connection: %s", e.msg);
		session_send_error(ss, 0, MSG_ERR_FORBIDDEN, true, "%s", e.msg);
		session_close(ss);
		return;
	}
	ss->client.uid = ss->cred.uid;
	if (srv->stopping) {
		session_send_error(ss, 0, MSG_ERR_SHUTTING_DOWN, true, "the daemon is shutting down");
		session_close(ss);
		return;
	}
	if (limits_admit(srv, ss, &e) < 0) {
		log_warning(srv->log, "refused a connection: %s", e.msg);
		session_send_error(ss, 0, MSG_ERR_BUSY, true, "%s", e.msg);
		session_close(ss);
		return;
	}
	uv_read_start((uv_stream_t *)&ss->pipe, session_on_alloc, session_on_read);
}

static void session_free(struct session *ss)
{
	if (ss->reader_open)
		frame_reader_free(&ss->reader);
	if (ss->ring_open)
		ring_close(&ss->ring);
	if (ss->sring_open) {
		ring_close(&ss->speer);
		ring_close(&ss->sring);
	}
	free(ss);
}

/* Each libuv handle of the session reports here once closed; the last one frees it. */
static void session_on_handle_closed(uv_handle_t *h)
{
	struct session *ss = h->data;
	if (--ss->closes_pending == 0)
		session_free(ss);
}

static void session_on_closed(uv_handle_t *h)
{
	session_on_handle_closed(h);
}

static void session_on_shutdown(uv_shutdown_t *req, int status)
{
	struct session *ss = req->data;
	(void)status;
	free(req);
	uv_close((uv_handle_t *)&ss->pipe, session_on_closed);
}

/* Last step: the compute thread holds nothing of this session any more. Replies still
 * queued are flushed (uv_shutdown) before the handle closes. */
static void session_finalize(struct session *ss)
{
	struct server *srv = ss->srv;
	if (ss->handle_closed)
		return;
	ss->handle_closed = true;
	server_session_unlink(srv, ss);
	while (ss->reqs)
		session_forget_req(ss, ss->reqs->id);
	if (ss->welcomed)
		log_info(srv->log, "client %s (pid %d) disconnected", ss->name, (int)ss->cred.pid);
	ss->closes_pending = 1 + ss->spoll_open;
	if (ss->spoll_open) {
		ss->spoll_open = false;
		uv_poll_stop(&ss->spoll);
		uv_close((uv_handle_t *)&ss->spoll, session_on_handle_closed);
	}
	uv_shutdown_t *req = malloc(sizeof *req);
	if (req) {
		req->data = ss;
		if (uv_shutdown(req, (uv_stream_t *)&ss->pipe, session_on_shutdown) == 0)
			return;
		free(req);
	}
	uv_close((uv_handle_t *)&ss->pipe, session_on_closed);
}

void session_close(struct session *ss)
{
	if (ss->closing)
		return;
	ss->closing = true;
	ss->hello_pending = false;
	uv_read_stop((uv_stream_t *)&ss->pipe);
	if (ss->n_inflight > 0) {
		/* Every scheduler that may hold its requests ends them and says so; if a queue
		 * is full, the session's messages still come back as their requests end. */
		ss->n_inflight += serve_post_gone(ss->srv, ss);
		return;
	}
	session_finalize(ss);
}

/* Called by the server after a wake-up: sessions whose client broke the ring close. */
void session_check_ring(struct session *ss)
{
	if (!ss->closing && atomic_load(&ss->ring_broken)) {
		log_warning(ss->srv->log, "client %s (pid %d) corrupted its shared-memory ring: closing",
			    ss->name, (int)ss->cred.pid);
		session_send_error(ss, 0, MSG_ERR_RING, true,
				   "the ring's indices or records broke the protocol");
		session_close(ss);
	}
}
