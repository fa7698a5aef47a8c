/* libhearth's inside (not installed): one connection, its request table and the reader
 * role that demultiplexes socket frames and ring records to requests by id. The public
 * API in hearth.h is built on the few functions declared here. */
#ifndef HEARTH_CLIENT_CONN_H
#define HEARTH_CLIENT_CONN_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/error.h"
#include "protocol/frame.h"
#include "protocol/msg.h"
#include "protocol/ring.h"
#include "client/hearth.h"

/* Text prompts and tokenize texts above this many bytes go through the ring instead of
 * the frame: a 1 MiB frame leaves room for the other fields of a generate. A daemon that
 * announces a smaller max_frame lowers it (conn.inline_max). */
#define CONN_INLINE_MAX (900u * 1024u)
#define CONN_FRAME_SLACK (16u * 1024u) /* stop strings and sampling fields, generously */

/* A token event waiting for its generation's thread. One allocation holds the event, its
 * text, alternatives and logits row. */
struct conn_event {
	struct conn_event *next;
	uint64_t req_id;
	bool is_logits;           /* a RING_REC_LOGITS row waiting for its token */
	struct conn_event *logits; /* the row attached to this token, owned by it */
	struct hearth_token tok;
};

/* One `loading` progress frame, queued for hearth_connect's callback. */
struct conn_loading {
	struct conn_loading *next;
	char phase[MSG_NAME_MAX + 1];
	uint64_t done;
	uint64_t total;
};

/* A request in flight. Everything here is guarded by conn.mu. */
struct conn_req {
	struct conn_req *next;
	uint64_t id;
	bool is_gen;
	bool final;               /* its last frame came, or it failed */
	int rc;                   /* 0, or the failure (err has the words) */
	struct hearth_err err;
	struct msg reply;         /* the final frame of a control request (owned) */
	/* hello: progress frames not yet reported, and the ring fds of the welcome */
	struct conn_loading *loading;
	struct conn_loading *loading_tail;
	int fds[3];
	size_t n_fds;
	/* generate */
	struct conn_event *head;
	struct conn_event *tail;
	struct conn_event *pend_logits;
	uint32_t n_tokens;        /* events queued so far: the next token's index */
	struct hearth_result result;
};

struct hearth {
	int fd;
	int timeout_ms;           /* idle timeout, < 0 none */
	unsigned spin_us;         /* ring watch before each sleep (hearth_connect_opts) */
	pthread_mutex_t mu;       /* request table, reader flag, death */
	pthread_cond_t cv;        /* something was dispatched, or the reader role freed up */
	pthread_mutex_t wmu;      /* socket writes and client->daemon ring pushes */
	bool reading;             /* a waiter holds the reader role */
	bool dead;                /* set once, under mu; also read atomically by writers */
	struct hearth_err dead_err;
	uint64_t next_id;
	struct conn_req *reqs;

	/* Owned by the reader role: only the thread holding it touches these. */
	struct frame_reader fr;
	uint8_t *rbuf;
	size_t rbuf_cap;
	int pend_fds[3];
	size_t n_pend_fds;
	bool fds_done;            /* the welcome was seen: later descriptors are refused */
	uint8_t *ring_buf;        /* d2c records are copied here before decoding */
	size_t ring_buf_cap;

	bool has_ring;            /* fixed after connect */
	struct ring ring;         /* rx lane: reader role; tx lane: under wmu */
	bool welcomed;
	struct hearth_model model;
	size_t inline_max;        /* prompt bytes that still travel in a frame */
};

int conn_err_set(struct hearth_err *err, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Adds r (zeroed by the caller) to the table with a fresh id; fails on a dead connection. */
int conn_register(struct hearth *h, struct conn_req *r, bool is_gen, struct hearth_err *err);
/* Takes r out of the table and frees what it still holds (queued events, reply). */
void conn_unregister(struct hearth *h, struct conn_req *r);
uint64_t conn_new_id(struct hearth *h);

/* Writes one frame; when bulk is set, first pushes the bulk record (type, ref) into the
 * client->daemon ring, under the same lock so records and frames stay in order. A write
 * failure kills the connection. */
struct conn_bulk {
	uint32_t type;
	uint64_t ref;
	const void *data;
	size_t len;
};
int conn_send(struct hearth *h, const struct msg *m, const struct conn_bulk *bulk,
	      struct hearth_err *err);

/* With h->mu held: waits until r has a queued event or is final, for at most timeout_ms
 * (< 0: forever). Returns 0 or HEARTH_ETIMEDOUT; h->mu is held again on return. */
int conn_wait(struct hearth *h, struct conn_req *r, int timeout_ms);

/* Sends a request and waits for its final frame; on success *reply owns it and its type
 * is want (an error frame becomes the return code). */
int conn_call(struct hearth *h, struct msg *m, const struct conn_bulk *bulk, enum msg_type want,
	      struct msg *reply, struct hearth_err *err);

void conn_event_free(struct conn_event *e);

#endif
