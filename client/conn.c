/* One connection to hearthd: connect and hello, the serialised writer, and the reader role
 * that any waiting thread takes in turn to read the socket and the ring and hand every
 * frame and token event to the request it names. No background thread: callbacks and
 * blocking stay on the caller's threads (hearth.h, "Threading model"). */
#include "client/conn.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "protocol/fdpass.h"
#include "protocol/clock.h"

#define CONN_RECV_CHUNK (64u * 1024u)
/* Bytes one reader step takes from the socket before it dispatches, so a flood of frames
 * cannot keep the waiters from seeing their answers. */
#define CONN_STEP_MAX (4u << 20)

/* ---- errors ---- */

int conn_err_set(struct hearth_err *err, int code, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof err->msg, fmt, ap);
		va_end(ap);
		err->code = code;
	}
	return code;
}

/* Copies a protocol-level error into the public struct; returns its code. */
static int conn_err_from(struct hearth_err *err, const struct hearth_error *e)
{
	if (err) {
		err->code = e->code;
		snprintf(err->msg, sizeof err->msg, "%s", e->msg);
	}
	return e->code;
}

static int conn_error_frame(struct hearth_err *err, const struct msg_error *e)
{
	int code = msg_errcode_to_hearth(e->code);
	return conn_err_set(err, code, "hearthd: %s: %.*s", msg_errcode_name(e->code),
			    (int)(e->message.len < 400 ? e->message.len : 400),
			    e->message.ptr ? e->message.ptr : "");
}

/* ---- time ---- */

/* ---- the request table (h->mu held) ---- */

static struct conn_req *req_find(struct hearth *h, uint64_t id)
{
	for (struct conn_req *r = h->reqs; r; r = r->next)
		if (r->id == id)
			return r;
	return NULL;
}

static void req_fail(struct conn_req *r, int code, const struct hearth_err *e)
{
	if (r->final)
		return;
	r->final = true;
	r->rc = code;
	r->err = *e;
	r->err.code = code;
}

/* Every request still waiting gets the connection's death as its outcome. */
static void conn_die(struct hearth *h, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void conn_die(struct hearth *h, int code, const char *fmt, ...)
{
	if (!h->dead) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(h->dead_err.msg, sizeof h->dead_err.msg, fmt, ap);
		va_end(ap);
		h->dead_err.code = code;
		__atomic_store_n(&h->dead, true, __ATOMIC_RELEASE);
	}
	for (struct conn_req *r = h->reqs; r; r = r->next)
		req_fail(r, h->dead_err.code, &h->dead_err);
	pthread_cond_broadcast(&h->cv);
}

static void conn_die_locked(struct hearth *h, const struct hearth_err *e)
{
	pthread_mutex_lock(&h->mu);
	conn_die(h, e->code, "%s", e->msg);
	pthread_mutex_unlock(&h->mu);
}

uint64_t conn_new_id(struct hearth *h)
{
	pthread_mutex_lock(&h->mu);
	uint64_t id = h->next_id++;
	pthread_mutex_unlock(&h->mu);
	return id;
}

int conn_register(struct hearth *h, struct conn_req *r, bool is_gen, struct hearth_err *err)
{
	pthread_mutex_lock(&h->mu);
	if (h->dead) {
		int rc = conn_err_set(err, h->dead_err.code, "%s", h->dead_err.msg);
		pthread_mutex_unlock(&h->mu);
		return rc;
	}
	r->id = h->next_id++;
	r->is_gen = is_gen;
	r->next = h->reqs;
	h->reqs = r;
	pthread_mutex_unlock(&h->mu);
	return 0;
}

void conn_event_free(struct conn_event *e)
{
	if (!e)
		return;
	free(e->logits);
	free(e);
}

void conn_unregister(struct hearth *h, struct conn_req *r)
{
	pthread_mutex_lock(&h->mu);
	for (struct conn_req **pp = &h->reqs; *pp; pp = &(*pp)->next)
		if (*pp == r) {
			*pp = r->next;
			break;
		}
	pthread_mutex_unlock(&h->mu);
	while (r->head) {
		struct conn_event *e = r->head;
		r->head = e->next;
		conn_event_free(e);
	}
	r->tail = NULL;
	conn_event_free(r->pend_logits);
	r->pend_logits = NULL;
	hearth_chat_result_free(&r->chat);
	while (r->loading) {
		struct conn_loading *l = r->loading;
		r->loading = l->next;
		free(l);
	}
	r->loading_tail = NULL;
	for (size_t i = 0; i < r->n_fds; i++)
		close(r->fds[i]);
	r->n_fds = 0;
	msg_free(&r->reply);
}

/* ---- writing ---- */

static int conn_write_all(struct hearth *h, const uint8_t *p, size_t n, struct hearth_err *err)
{
	while (n > 0) {
		ssize_t w = send(h->fd, p, n, MSG_NOSIGNAL);
		if (w > 0) {
			p += w;
			n -= (size_t)w;
			continue;
		}
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			struct pollfd pf = { .fd = h->fd, .events = POLLOUT };
			int pr = poll(&pf, 1, h->timeout_ms < 0 ? -1 : h->timeout_ms);
			if (pr < 0 && errno != EINTR)
				return conn_err_set(err, HEARTH_EIO, "poll on the hearthd socket: %s",
						    strerror(errno));
			if (pr == 0)
				return conn_err_set(err, HEARTH_ETIMEDOUT,
						    "hearthd has not read its socket for %d ms",
						    h->timeout_ms);
			continue;
		}
		if (w < 0 && (errno == EPIPE || errno == ECONNRESET))
			return conn_err_set(err, HEARTH_ECLOSED, "hearthd closed the connection");
		return conn_err_set(err, HEARTH_EIO, "write to the hearthd socket: %s",
				    w < 0 ? strerror(errno) : "wrote nothing");
	}
	return 0;
}

/* The daemon takes bulk records off the ring when it reads the frame naming them, so a
 * full ring empties on its own: wait in short sleeps rather than compete with the reader
 * for the doorbell. */
static int conn_push_bulk(struct hearth *h, const struct conn_bulk *b, struct hearth_err *err)
{
	struct hearth_error e;
	int64_t deadline = h->timeout_ms < 0 ? -1 : (int64_t)(hearth_now_ns() / 1000000) + h->timeout_ms;
	for (;;) {
		int rc = ring_push_bulk(&h->ring, b->type, b->ref, b->data, b->len, &e);
		if (rc == 0)
			break;
		if (rc != HEARTH_EBUSY) {
			if (rc == HEARTH_ERANGE)
				return conn_err_set(err, HEARTH_ERANGE,
						    "a bulk payload of %zu bytes does not fit hearthd's "
						    "ring (at most %zu)", b->len,
						    ring_max_payload(&h->ring) - 8);
			return conn_err_from(err, &e);
		}
		if (deadline >= 0 && (int64_t)(hearth_now_ns() / 1000000) >= deadline)
			return conn_err_set(err, HEARTH_ETIMEDOUT,
					    "hearthd's ring stayed full for %d ms", h->timeout_ms);
		if (__atomic_load_n(&h->dead, __ATOMIC_ACQUIRE))
			return conn_err_set(err, HEARTH_ECLOSED, "hearthd closed the connection");
		struct timespec ts = { 0, 1000000 };
		nanosleep(&ts, NULL);
	}
	struct hearth_error e2;
	if (ring_notify(&h->ring, &e2) < 0)
		return conn_err_from(err, &e2);
	return 0;
}

int conn_send(struct hearth *h, const struct msg *m, const struct conn_bulk *bulk,
	      struct hearth_err *err)
{
	struct msg_buf b = { 0 };
	struct hearth_error e;
	if (msg_encode(m, &b, &e) < 0) {
		msg_buf_free(&b);
		return conn_err_from(err, &e);
	}
	if (bulk && !h->has_ring) {
		msg_buf_free(&b);
		return conn_err_set(err, HEARTH_EINVAL,
				    "a payload of %zu bytes needs the shared-memory ring, and this "
				    "connection has none", bulk->len);
	}
	pthread_mutex_lock(&h->wmu);
	int rc = 0;
	if (__atomic_load_n(&h->dead, __ATOMIC_ACQUIRE)) {
		pthread_mutex_lock(&h->mu);
		rc = conn_err_set(err, h->dead_err.code, "%s", h->dead_err.msg);
		pthread_mutex_unlock(&h->mu);
		goto out;
	}
	if (bulk && (rc = conn_push_bulk(h, bulk, err)) < 0) {
		/* The record may sit in the ring unnamed; the daemon skips it as stale. */
		goto out;
	}
	rc = conn_write_all(h, b.data, b.len, err);
	if (rc < 0 && rc != HEARTH_ECLOSED) {
		/* A frame cut off midway leaves the stream unusable for everyone. A closed peer
		 * is left to the reader: it may still find the frame that says why (a fatal
		 * `forbidden`) before the end of the stream. */
		struct hearth_err tmp;
		conn_err_set(&tmp, rc, "%s", err ? err->msg : "write to hearthd failed");
		conn_die_locked(h, &tmp);
	}
out:
	pthread_mutex_unlock(&h->wmu);
	msg_buf_free(&b);
	return rc;
}

/* ---- reading: the reader role ---- */

/* What one reader step collected, dispatched in one go under h->mu. */
struct conn_batch {
	struct msg *frames;
	size_t n_frames;
	size_t cap_frames;
	struct conn_event *ev_head;
	struct conn_event *ev_tail;
	bool closed;              /* the socket reached EOF or failed */
	int fail_code;            /* the stream broke (framing, ring): die with this */
	struct hearth_err fail;
};

static void batch_fail(struct conn_batch *b, const struct hearth_error *e, const char *what)
{
	if (b->fail_code)
		return;
	b->fail_code = e->code ? e->code : HEARTH_EPROTO;
	snprintf(b->fail.msg, sizeof b->fail.msg, "%s: %.440s", what, e->msg);
	b->fail.code = b->fail_code;
}

static void batch_event(struct conn_batch *b, struct conn_event *e)
{
	e->next = NULL;
	if (b->ev_tail)
		b->ev_tail->next = e;
	else
		b->ev_head = e;
	b->ev_tail = e;
}

static void conn_take_frames(struct hearth *h, struct conn_batch *b)
{
	for (;;) {
		const uint8_t *payload;
		size_t len;
		struct hearth_error e;
		int rc = frame_reader_next(&h->fr, &payload, &len, &e);
		if (rc == FRAME_NEED_MORE)
			return;
		if (rc == FRAME_OVERSIZED)
			continue; /* the daemon never sends these; its bytes are skipped */
		if (rc < 0) {
			batch_fail(b, &e, "reading hearthd's frames");
			return;
		}
		if (b->n_frames == b->cap_frames) {
			size_t cap = b->cap_frames ? b->cap_frames * 2 : 8;
			struct msg *nf = realloc(b->frames, cap * sizeof *nf);
			if (!nf) {
				struct hearth_error oom = { HEARTH_ENOMEM, "out of memory" };
				batch_fail(b, &oom, "reading hearthd's frames");
				return;
			}
			b->frames = nf;
			b->cap_frames = cap;
		}
		struct msg_reject rej;
		struct msg *m = &b->frames[b->n_frames];
		if (msg_decode(payload, len, MSG_FROM_DAEMON, m, &rej, &e) < 0) {
			/* A newer daemon's frame type: not ours to judge. A malformed frame fails
			 * only the request it names. */
			if (rej.code == MSG_ERR_UNKNOWN_TYPE || rej.id == 0)
				continue;
			msg_init(m, MSG_ERROR, rej.id);
			m->u.error.code = MSG_ERR_BAD_FRAME;
			m->u.error.message.ptr = NULL;
			m->id = rej.id;
			/* The words go in a field msg_free does not own; keep them in the batch. */
			struct msg_error *me = &m->u.error;
			me->fatal = false;
			static const char why[] = "malformed reply from hearthd";
			me->message.ptr = why;
			me->message.len = sizeof why - 1;
		}
		b->n_frames++;
	}
}

static struct conn_event *event_token(const struct ring_token *t)
{
	size_t text_off = sizeof(struct conn_event);
	size_t top_off = (text_off + t->text_len + 1 + 7) & ~(size_t)7;
	size_t size = top_off + t->n_top * sizeof(struct hearth_top);
	struct conn_event *e = malloc(size);
	if (!e)
		return NULL;
	memset(e, 0, sizeof *e);
	e->req_id = t->request_id;
	char *text = (char *)e + text_off;
	if (t->text_len)
		memcpy(text, t->text, t->text_len);
	text[t->text_len] = '\0';
	struct hearth_top *top = (struct hearth_top *)((char *)e + top_off);
	for (size_t i = 0; i < t->n_top; i++) {
		struct ring_top rt;
		memcpy(&rt, &t->top[i], sizeof rt);
		top[i].token = rt.token;
		top[i].logprob = rt.logprob;
	}
	e->tok.token = t->token;
	e->tok.text = text;
	e->tok.text_len = t->text_len;
	e->tok.has_logprob = t->has_logprob;
	e->tok.logprob = t->logprob;
	e->tok.top = t->n_top ? top : NULL;
	e->tok.n_top = t->n_top;
	e->tok.t_sampled_ns = t->t_sampled_ns;
	return e;
}

static struct conn_event *event_logits(const struct ring_logits *l)
{
	size_t off = (sizeof(struct conn_event) + 15) & ~(size_t)15;
	struct conn_event *e = malloc(off + (size_t)l->n_vocab * sizeof(float));
	if (!e)
		return NULL;
	memset(e, 0, sizeof *e);
	e->req_id = l->request_id;
	e->is_logits = true;
	float *row = (float *)((char *)e + off);
	memcpy(row, l->logits, (size_t)l->n_vocab * sizeof(float));
	e->tok.logits = row;
	e->tok.n_vocab = l->n_vocab;
	e->tok.index = l->index;
	return e;
}

/* Empties the daemon->client ring. Called after the socket was read, so every token the
 * daemon pushed before a `done` we hold is taken before that `done` is acted on. */
static void conn_drain_ring(struct hearth *h, struct conn_batch *b)
{
	struct hearth_error e;
	size_t popped = 0;
	ring_doorbell_clear(&h->ring, NULL);
	for (;;) {
		uint32_t type;
		size_t len;
		int rc = ring_pop(&h->ring, &type, h->ring_buf, h->ring_buf_cap, &len, &e);
		if (rc == 0)
			break;
		if (rc < 0) {
			batch_fail(b, &e, "hearthd's ring");
			break;
		}
		popped++;
		struct conn_event *ev = NULL;
		if (type == RING_REC_TOKEN) {
			struct ring_token t;
			if (ring_token_decode(h->ring_buf, len, &t, &e) < 0) {
				batch_fail(b, &e, "a token record in hearthd's ring");
				break;
			}
			ev = event_token(&t);
		} else if (type == RING_REC_LOGITS) {
			struct ring_logits l;
			if (ring_logits_decode(h->ring_buf, len, &l, &e) < 0) {
				batch_fail(b, &e, "a logits record in hearthd's ring");
				break;
			}
			ev = event_logits(&l);
		} else {
			continue; /* a record type of a newer daemon */
		}
		if (!ev) {
			struct hearth_error oom = { HEARTH_ENOMEM, "out of memory for a token event" };
			batch_fail(b, &oom, "hearthd's ring");
			break;
		}
		batch_event(b, ev);
	}
	/* Space was freed: a daemon blocked on a full ring may go on. */
	if (popped)
		ring_notify(&h->ring, NULL);
}

/* Receives what the socket has (without blocking), keeping any descriptors that came with
 * it for the welcome. */
static void conn_recv(struct hearth *h, struct conn_batch *b)
{
	size_t total = 0;
	while (total < CONN_STEP_MAX && !b->fail_code) {
		int fds[FDPASS_MAX];
		size_t got = 0, nfds = 0;
		struct hearth_error e;
		int rc = fdpass_recv(h->fd, h->rbuf, h->rbuf_cap, &got, fds, FDPASS_MAX, &nfds, &e);
		if (rc == HEARTH_EBUSY)
			break;
		if (rc < 0) {
			if (rc == HEARTH_ECLOSED) {
				b->closed = true;
				break;
			}
			batch_fail(b, &e, "reading the hearthd socket");
			break;
		}
		for (size_t i = 0; i < nfds; i++) {
			if (!h->fds_done && h->n_pend_fds < 3)
				h->pend_fds[h->n_pend_fds++] = fds[i];
			else
				close(fds[i]);
		}
		if (got == 0) {
			b->closed = true;
			break;
		}
		total += got;
		if (frame_reader_feed(&h->fr, h->rbuf, got, &e) < 0) {
			batch_fail(b, &e, "reading hearthd's frames");
			break;
		}
		conn_take_frames(h, b);
	}
}

static void req_push_event(struct conn_req *r, struct conn_event *e)
{
	e->next = NULL;
	if (r->pend_logits) {
		e->logits = r->pend_logits;
		r->pend_logits = NULL;
		e->tok.logits = e->logits->tok.logits;
		e->tok.n_vocab = e->logits->tok.n_vocab;
	}
	if (!e->is_delta)
		e->tok.index = r->n_tokens++;
	if (r->tail)
		r->tail->next = e;
	else
		r->head = e;
	r->tail = e;
}

static void dispatch_event(struct hearth *h, struct conn_event *e)
{
	struct conn_req *r = req_find(h, e->req_id);
	if (!r || !r->is_gen || r->final) {
		conn_event_free(e); /* a generation already finished or abandoned */
		return;
	}
	if (e->is_logits) {
		conn_event_free(r->pend_logits);
		r->pend_logits = e;
		return;
	}
	req_push_event(r, e);
}

/* A `token` frame: the socket-streaming form of a ring token event. */
static void dispatch_token_frame(struct hearth *h, struct conn_req *r, const struct msg *m)
{
	const struct msg_token *t = &m->u.token;
	struct ring_top tops[RING_TOKEN_TOP_MAX];
	size_t n_top = t->n_top < RING_TOKEN_TOP_MAX ? t->n_top : RING_TOKEN_TOP_MAX;
	for (size_t i = 0; i < n_top; i++)
		tops[i] = (struct ring_top){ t->top[i].token, t->top[i].logprob };
	struct ring_token rt = { .request_id = m->id, .token = t->token,
				 .has_logprob = t->has_logprob, .logprob = t->logprob,
				 .text = (const uint8_t *)t->text.ptr,
				 .text_len = t->text.len,
				 .top = n_top ? tops : NULL, .n_top = n_top };
	struct conn_event *e = event_token(&rt);
	if (!e)
		return;
	req_push_event(r, e);
}

static char *dup_bytes(struct msg_bytes b)
{
	char *s = malloc(b.len + 1);
	if (s) {
		if (b.len)
			memcpy(s, b.ptr, b.len);
		s[b.len] = '\0';
	}
	return s;
}

/* A `delta` frame: one allocation holds the event and its strings. */
static void dispatch_delta(struct conn_req *r, const struct msg_delta *d)
{
	size_t need = sizeof(struct conn_event) + d->text.len + d->call.id.len + d->call.name.len +
		      d->call.arguments.len + 4;
	struct conn_event *e = calloc(1, need);
	if (!e)
		return;
	char *p = (char *)(e + 1);
	const struct msg_bytes parts[4] = { d->text, d->call.id, d->call.name, d->call.arguments };
	const char *at[4];
	for (int i = 0; i < 4; i++) {
		at[i] = p;
		if (parts[i].len)
			memcpy(p, parts[i].ptr, parts[i].len);
		p[parts[i].len] = '\0';
		p += parts[i].len + 1;
	}
	e->is_delta = true;
	bool is = d->kind.len == 9 && !memcmp(d->kind.ptr, "reasoning", 9);
	bool call = d->has_call && d->kind.len == 9 && !memcmp(d->kind.ptr, "tool_call", 9);
	e->delta.kind = call ? HEARTH_DELTA_TOOL_CALL : is ? HEARTH_DELTA_REASONING : HEARTH_DELTA_CONTENT;
	e->delta.text = at[0];
	e->delta.len = d->text.len;
	e->delta.call = (struct hearth_tool_call){ at[1], at[2], at[3] };
	e->delta.index = d->index;
	req_push_event(r, e);
}

/* done's assistant message, copied out of the frame (which is freed right after). */
static void take_chat_reply(struct conn_req *r, const struct msg_chat_reply *m)
{
	struct hearth_chat_result *c = &r->chat;
	hearth_chat_result_free(c);
	c->content = dup_bytes(m->content);
	c->reasoning_content = dup_bytes(m->reasoning_content);
	if (m->n_tool_calls) {
		c->tool_calls = calloc(m->n_tool_calls, sizeof *c->tool_calls);
		if (c->tool_calls) {
			for (size_t i = 0; i < m->n_tool_calls; i++)
				c->tool_calls[i] = (struct hearth_tool_call){ dup_bytes(m->tool_calls[i].id),
									      dup_bytes(m->tool_calls[i].name),
									      dup_bytes(m->tool_calls[i].arguments) };
			c->n_tool_calls = m->n_tool_calls;
		}
	}
}

static void dispatch_frame(struct hearth *h, struct msg *m)
{
	if (m->type == MSG_ERROR && m->id == 0) {
		if (m->u.error.fatal) {
			struct hearth_err e;
			conn_error_frame(&e, &m->u.error);
			conn_die(h, e.code, "%s", e.msg);
		}
		/* A non-fatal connection-level error answers a frame we could not have sent
		 * malformed; nothing waits on it. */
		msg_free(m);
		return;
	}
	struct conn_req *r = req_find(h, m->id);
	if (!r || r->final) {
		msg_free(m);
		return;
	}
	switch (m->type) {
	case MSG_LOADING: {
		struct conn_loading *l = calloc(1, sizeof *l);
		if (l) {
			size_t n = m->u.loading.phase.len;
			if (n > MSG_NAME_MAX)
				n = MSG_NAME_MAX;
			if (n)
				memcpy(l->phase, m->u.loading.phase.ptr, n);
			l->done = m->u.loading.done;
			l->total = m->u.loading.total;
			if (r->loading_tail)
				r->loading_tail->next = l;
			else
				r->loading = l;
			r->loading_tail = l;
		}
		msg_free(m);
		return;
	}
	case MSG_TOKEN:
		if (r->is_gen)
			dispatch_token_frame(h, r, m);
		msg_free(m);
		return;
	case MSG_DELTA:
		if (r->is_gen)
			dispatch_delta(r, &m->u.delta);
		msg_free(m);
		return;
	case MSG_ERROR: {
		struct hearth_err e;
		int code = conn_error_frame(&e, &m->u.error);
		req_fail(r, code, &e);
		if (m->u.error.fatal)
			conn_die(h, code, "%s", e.msg);
		msg_free(m);
		return;
	}
	case MSG_WELCOME:
		h->fds_done = true;
		if (m->u.welcome.ring) {
			if (h->n_pend_fds != 3) {
				struct hearth_err e;
				conn_err_set(&e, HEARTH_EPROTO,
					     "hearthd's welcome came with %zu descriptors, not the "
					     "ring's 3", h->n_pend_fds);
				req_fail(r, HEARTH_EPROTO, &e);
				msg_free(m);
				return;
			}
			memcpy(r->fds, h->pend_fds, sizeof r->fds);
			r->n_fds = 3;
			h->n_pend_fds = 0;
		}
		break;
	case MSG_DONE:
		if (r->is_gen) {
			const struct msg_done *d = &m->u.done;
			r->result.finish = d->finish == MSG_FINISH_OK ? HEARTH_FINISH_STOP
								     : (enum hearth_finish)d->finish;
			r->result.n_prompt = d->n_prompt;
			r->result.n_gen = d->n_gen;
			r->result.queue_ms = d->queue_ms;
			r->result.prefill_ms = d->prefill_ms;
			r->result.decode_ms = d->decode_ms;
			r->result.prefill_tps = d->prefill_tps;
			r->result.decode_tps = d->decode_tps;
			r->result.n_cached = d->n_cached;
			r->result.n_forced = d->n_forced;
			if (d->has_message)
				take_chat_reply(r, &d->message);
			r->final = true;
			msg_free(m);
			return;
		}
		break;
	default:
		break;
	}
	if (!msg_type_is_final(m->type)) {
		msg_free(m);
		return;
	}
	msg_free(&r->reply);
	r->reply = *m;
	memset(m, 0, sizeof *m);
	r->final = true;
}

/* One turn of the reader role, without h->mu: poll, read, drain, then dispatch. */
static void conn_read_step(struct hearth *h, int timeout_ms)
{
	struct pollfd pf[2] = {
		{ .fd = h->fd, .events = POLLIN },
		{ .fd = h->has_ring ? ring_wait_fd(&h->ring) : -1, .events = POLLIN },
	};
	/* The opt-in spin: a record in the ring ends it; the socket is checked only by the
	 * poll after it (frames other than tokens are not latency-bound). */
	if (h->spin_us && h->has_ring) {
		int64_t end = (int64_t)(hearth_now_ns() / 1000) + h->spin_us;
		uint32_t type;
		const void *p;
		size_t len;
		while (ring_peek(&h->ring, &type, &p, &len, NULL) == 0 && (int64_t)(hearth_now_ns() / 1000) < end) {
#if defined(__x86_64__) || defined(__i386__)
			__builtin_ia32_pause();
#endif
		}
	}
	int pr = poll(pf, h->has_ring ? 2 : 1, timeout_ms);
	if (pr < 0 && errno != EINTR) {
		pthread_mutex_lock(&h->mu);
		conn_die(h, HEARTH_EIO, "poll on the hearthd socket: %s", strerror(errno));
		pthread_mutex_unlock(&h->mu);
		return;
	}
	if (pr <= 0)
		return;
	struct conn_batch b;
	memset(&b, 0, sizeof b);
	if (pf[0].revents)
		conn_recv(h, &b);
	if (h->has_ring && !b.fail_code)
		conn_drain_ring(h, &b);

	pthread_mutex_lock(&h->mu);
	/* Ring events first: the daemon pushed them before any `done` read with them. */
	while (b.ev_head) {
		struct conn_event *e = b.ev_head;
		b.ev_head = e->next;
		dispatch_event(h, e);
	}
	for (size_t i = 0; i < b.n_frames; i++)
		dispatch_frame(h, &b.frames[i]);
	if (b.fail_code)
		conn_die(h, b.fail_code, "%s", b.fail.msg);
	else if (b.closed)
		conn_die(h, HEARTH_ECLOSED, "hearthd closed the connection");
	pthread_cond_broadcast(&h->cv);
	pthread_mutex_unlock(&h->mu);
	free(b.frames);
}

static bool req_ready(const struct conn_req *r)
{
	return r->final || r->head || r->loading;
}

int conn_wait(struct hearth *h, struct conn_req *r, int timeout_ms)
{
	int64_t deadline = timeout_ms < 0 ? -1 : (int64_t)(hearth_now_ns() / 1000000) + timeout_ms;
	for (;;) {
		if (req_ready(r))
			return 0;
		int64_t left = -1;
		if (deadline >= 0) {
			left = deadline - (int64_t)(hearth_now_ns() / 1000000);
			if (left < 0 || (left == 0 && timeout_ms > 0))
				return HEARTH_ETIMEDOUT;
		}
		if (!h->reading) {
			h->reading = true;
			pthread_mutex_unlock(&h->mu);
			conn_read_step(h, left > INT32_MAX ? INT32_MAX : (int)left);
			pthread_mutex_lock(&h->mu);
			h->reading = false;
			pthread_cond_broadcast(&h->cv);
			if (timeout_ms == 0 && !req_ready(r))
				return HEARTH_ETIMEDOUT;
			continue;
		}
		if (deadline < 0) {
			pthread_cond_wait(&h->cv, &h->mu);
		} else {
			struct timespec ts;
			clock_gettime(CLOCK_MONOTONIC, &ts);
			ts.tv_sec += left / 1000;
			ts.tv_nsec += (left % 1000) * 1000000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&h->cv, &h->mu, &ts);
		}
	}
}

int conn_call(struct hearth *h, struct msg *m, const struct conn_bulk *bulk, enum msg_type want,
	      struct msg *reply, struct hearth_err *err)
{
	struct conn_req r;
	memset(&r, 0, sizeof r);
	memset(reply, 0, sizeof *reply);
	int rc = conn_register(h, &r, false, err);
	if (rc < 0)
		return rc;
	m->id = r.id;
	struct conn_bulk bk;
	if (bulk) {
		bk = *bulk;
		bk.ref = r.id;
		bulk = &bk;
		if (m->type == MSG_TOKENIZE)
			m->u.tokenize.text_ref = r.id;
		else if (m->type == MSG_GENERATE)
			m->u.generate.prompt_ref = r.id;
	}
	rc = conn_send(h, m, bulk, err);
	if (rc < 0) {
		conn_unregister(h, &r);
		return rc;
	}
	pthread_mutex_lock(&h->mu);
	rc = conn_wait(h, &r, h->timeout_ms);
	if (rc == HEARTH_ETIMEDOUT) {
		conn_err_set(err, rc, "no answer from hearthd to %s within %d ms",
			     msg_type_name(m->type), h->timeout_ms);
	} else if (r.rc < 0) {
		rc = r.rc;
		if (err)
			*err = r.err;
	} else if (r.reply.type != want) {
		rc = conn_err_set(err, HEARTH_EPROTO, "hearthd answered %s with %s",
				  msg_type_name(m->type), msg_type_name(r.reply.type));
	} else {
		*reply = r.reply;
		memset(&r.reply, 0, sizeof r.reply);
	}
	pthread_mutex_unlock(&h->mu);
	conn_unregister(h, &r);
	return rc;
}

/* ---- connecting ---- */

const char *hearth_socket_path_default(void)
{
	const char *env = getenv(HEARTH_SOCKET_ENV);
	return env && *env ? env : HEARTH_SOCKET_DEFAULT;
}

static void conn_free(struct hearth *h)
{
	if (h->fd >= 0)
		close(h->fd);
	for (size_t i = 0; i < h->n_pend_fds; i++)
		close(h->pend_fds[i]);
	if (h->has_ring)
		ring_close(&h->ring);
	frame_reader_free(&h->fr);
	free(h->rbuf);
	free(h->ring_buf);
	pthread_cond_destroy(&h->cv);
	pthread_mutex_destroy(&h->mu);
	pthread_mutex_destroy(&h->wmu);
	free(h);
}

static void copy_bytes(char *dst, size_t cap, struct msg_bytes b)
{
	size_t n = b.len < cap - 1 ? b.len : cap - 1;
	if (n)
		memcpy(dst, b.ptr, n);
	dst[n] = '\0';
}

/* Waits for hello's final frame on r, passing loading progress to o->on_loading in order
 * (even when the welcome came in the same read). Returns 0 with r->reply a welcome, or a
 * HEARTH_E* with err filled. */
static int conn_await_welcome(struct hearth *h, const struct hearth_connect_opts *o,
			      struct conn_req *r, struct hearth_err *err)
{
	int rc;
	pthread_mutex_lock(&h->mu);
	for (;;) {
		rc = conn_wait(h, r, h->timeout_ms);
		if (rc == HEARTH_ETIMEDOUT) {
			rc = conn_err_set(err, rc, "no welcome from hearthd within %d ms",
					  h->timeout_ms);
			break;
		}
		if (r->loading) {
			struct conn_loading *l = r->loading;
			r->loading = l->next;
			if (!r->loading)
				r->loading_tail = NULL;
			pthread_mutex_unlock(&h->mu);
			if (o->on_loading)
				o->on_loading(o->user, l->phase, l->done, l->total);
			free(l);
			pthread_mutex_lock(&h->mu);
			continue;
		}
		if (r->rc < 0) {
			rc = r->rc;
			if (err)
				*err = r->err;
		} else if (r->reply.type != MSG_WELCOME) {
			rc = conn_err_set(err, HEARTH_EPROTO, "hearthd answered hello with %s",
					  msg_type_name(r->reply.type));
		}
		break;
	}
	pthread_mutex_unlock(&h->mu);
	return rc;
}

/* The welcome's model facts into h->model, and the frame limit into h->inline_max. */
static void conn_take_welcome(struct hearth *h, const struct msg_welcome *w)
{
	struct hearth_model *mi = &h->model;
	copy_bytes(mi->daemon_version, sizeof mi->daemon_version, w->daemon);
	mi->proto_major = w->proto_major;
	mi->proto_minor = w->proto_minor;
	copy_bytes(mi->arch, sizeof mi->arch, w->model.arch);
	copy_bytes(mi->name, sizeof mi->name, w->model.name);
	copy_bytes(mi->quant, sizeof mi->quant, w->model.quant);
	mi->n_params = w->model.n_params;
	mi->n_ctx = w->model.n_ctx;
	mi->n_ctx_train = w->model.n_ctx_train;
	mi->n_vocab = w->model.n_vocab;
	mi->n_layer = w->model.n_layer;
	mi->n_embd = w->model.n_embd;
	copy_bytes(mi->chat_template, sizeof mi->chat_template, w->model.chat_template);
	memset(&mi->draft, 0, sizeof mi->draft);
	if (w->model.has_draft) {
		const struct msg_draft_info *d = &w->model.draft;
		copy_bytes(mi->draft.arch, sizeof mi->draft.arch, d->arch);
		copy_bytes(mi->draft.name, sizeof mi->draft.name, d->name);
		copy_bytes(mi->draft.quant, sizeof mi->draft.quant, d->quant);
		mi->draft.n_params = d->n_params;
		mi->draft.n_ctx = d->n_ctx;
		mi->draft.n_layer = d->n_layer;
		mi->draft.n_embd = d->n_embd;
	}
	if (w->max_frame && w->max_frame < CONN_INLINE_MAX + CONN_FRAME_SLACK)
		h->inline_max = w->max_frame > 2 * CONN_FRAME_SLACK ? w->max_frame - CONN_FRAME_SLACK
								     : CONN_FRAME_SLACK;
}

/* Maps the rings whose memfd and eventfds came with the welcome (r->fds), checks their
 * sizes against what the welcome announced, and allocates the read buffer. */
static int conn_attach_ring(struct hearth *h, struct conn_req *r, const struct msg_welcome *w,
			    struct hearth_err *err)
{
	struct hearth_error e;
	uint64_t d2c = w->ring_d2c, c2d = w->ring_c2d;
	int rc = ring_attach(&h->ring, r->fds[0], r->fds[1], r->fds[2], &e);
	r->n_fds = 0; /* ring_attach owns them now, also on failure */
	if (rc < 0) {
		conn_err_from(err, &e);
		return rc;
	}
	h->has_ring = true;
	if (h->ring.rx.cap != d2c || h->ring.tx.cap != c2d)
		return conn_err_set(err, HEARTH_EPROTO,
				    "hearthd's welcome announces rings of %llu/%llu bytes, "
				    "the memfd holds %llu/%llu",
				    (unsigned long long)d2c, (unsigned long long)c2d,
				    (unsigned long long)h->ring.rx.cap,
				    (unsigned long long)h->ring.tx.cap);
	h->ring_buf_cap = (size_t)h->ring.rx.cap;
	h->ring_buf = malloc(h->ring_buf_cap);
	if (!h->ring_buf)
		return conn_err_set(err, HEARTH_ENOMEM, "out of memory for a %zu-byte ring buffer",
				    h->ring_buf_cap);
	return 0;
}

static int conn_hello(struct hearth *h, const struct hearth_connect_opts *o,
		      struct hearth_err *err)
{
	const char *name = o->client_name && *o->client_name ? o->client_name : "libhearth";
	struct conn_req r;
	memset(&r, 0, sizeof r);
	int rc = conn_register(h, &r, false, err);
	if (rc < 0)
		return rc;
	struct msg m;
	msg_init(&m, MSG_HELLO, r.id);
	m.u.hello.name = (struct msg_bytes){ name, strlen(name) };
	m.u.hello.ring = true;
	rc = conn_send(h, &m, NULL, err);
	/* On a closed socket, read on: the daemon may have said why before it closed. */
	if (rc >= 0 || rc == HEARTH_ECLOSED)
		rc = conn_await_welcome(h, o, &r, err);
	if (rc < 0)
		goto out;
	const struct msg_welcome *w = &r.reply.u.welcome;
	conn_take_welcome(h, w);
	if (w->proto_major != MSG_PROTO_MAJOR) {
		rc = conn_err_set(err, HEARTH_EUNSUPPORTED, "hearthd speaks protocol %u, this library %d",
				  w->proto_major, MSG_PROTO_MAJOR);
		goto out;
	}
	if (w->ring && (rc = conn_attach_ring(h, &r, w, err)) < 0)
		goto out;
	h->welcomed = true;
	rc = 0;
out:
	conn_unregister(h, &r);
	return rc;
}

int hearth_connect_with(struct hearth **out, const struct hearth_connect_opts *opts,
			struct hearth_err *err)
{
	static const struct hearth_connect_opts none;
	const struct hearth_connect_opts *o = opts ? opts : &none;
	*out = NULL;
	const char *path = o->socket_path && *o->socket_path ? o->socket_path
							       : hearth_socket_path_default();
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof sa.sun_path)
		return conn_err_set(err, HEARTH_EINVAL, "socket path %s is longer than %zu bytes",
				    path, sizeof sa.sun_path - 1);
	memcpy(sa.sun_path, path, strlen(path) + 1);

	struct hearth *h = calloc(1, sizeof *h);
	if (!h)
		return conn_err_set(err, HEARTH_ENOMEM, "out of memory for a connection");
	h->fd = -1;
	h->next_id = 1;
	h->inline_max = CONN_INLINE_MAX;
	h->spin_us = o->spin_us;
	h->timeout_ms = o->timeout_ms == 0 ? HEARTH_TIMEOUT_DEFAULT_MS
					   : o->timeout_ms < 0 ? -1 : o->timeout_ms;
	pthread_mutex_init(&h->mu, NULL);
	pthread_mutex_init(&h->wmu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&h->cv, &ca);
	pthread_condattr_destroy(&ca);
	struct hearth_error e;
	int rc = frame_reader_init(&h->fr, 0, &e);
	if (rc < 0) {
		conn_free(h);
		return conn_err_from(err, &e);
	}
	h->rbuf_cap = CONN_RECV_CHUNK;
	h->rbuf = malloc(h->rbuf_cap);
	if (!h->rbuf) {
		conn_free(h);
		return conn_err_set(err, HEARTH_ENOMEM, "out of memory for a connection");
	}
	h->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (h->fd < 0) {
		rc = conn_err_set(err, HEARTH_EIO, "socket: %s", strerror(errno));
		conn_free(h);
		return rc;
	}
	int cr;
	do
		cr = connect(h->fd, (struct sockaddr *)&sa, sizeof sa);
	while (cr < 0 && errno == EINTR);
	if (cr < 0) {
		int en = errno;
		rc = conn_err_set(err, HEARTH_EIO, "cannot connect to hearthd at %s: %s%s", path,
				  strerror(en),
				  en == ENOENT || en == ECONNREFUSED ? " (is hearthd running? $"
				  HEARTH_SOCKET_ENV " names another socket)" : "");
		conn_free(h);
		return rc;
	}
	int fl = fcntl(h->fd, F_GETFL);
	if (fl < 0 || fcntl(h->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
		rc = conn_err_set(err, HEARTH_EIO, "fcntl on the hearthd socket: %s",
				  strerror(errno));
		conn_free(h);
		return rc;
	}
	if (!o->no_hello) {
		rc = conn_hello(h, o, err);
		if (rc < 0) {
			conn_free(h);
			return rc;
		}
	}
	*out = h;
	return 0;
}

int hearth_connect(struct hearth **out, const char *socket_path, const char *client_name,
		   struct hearth_err *err)
{
	struct hearth_connect_opts o = { .socket_path = socket_path, .client_name = client_name };
	return hearth_connect_with(out, &o, err);
}

void hearth_close(struct hearth *h)
{
	if (!h)
		return;
	/* Requests a caller forgot: their memory is the caller's, only unlink them. */
	h->reqs = NULL;
	conn_free(h);
}
