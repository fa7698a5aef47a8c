/* State shared by server.c (the loop, the listener, signals, timers) and session.c (one
 * client's protocol): internal to the serving module, never included elsewhere. Everything
 * here belongs to the loop thread, except the loader hand-over fields under `mu`. */
#ifndef HEARTH_DAEMON_SERVE_H
#define HEARTH_DAEMON_SERVE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "daemon/serve/config.h"
#include "daemon/serve/limits.h"
#include "daemon/serve/log.h"
#include "daemon/serve/policy.h"
#include "daemon/serve/sched.h"
#include "daemon/serve/server.h"
#include "daemon/serve/systemd.h"
#include "protocol/frame.h"
#include "protocol/msg.h"
#include "protocol/ring.h"

enum serve_state {
	SERVE_LOADING,
	SERVE_READY,
	SERVE_FAILED,
};

/* A request of a session that the compute thread has (or had) in hand. */
struct serve_req {
	uint64_t id;
	uint64_t tokens;           /* prompt + max_tokens, counted against the client's limit */
	bool cancel_posted;        /* one cancel per request reaches the scheduler */
	struct serve_req *next;
};

struct session {
	uv_pipe_t pipe;            /* first: libuv handles are cast back to the session */
	struct server *srv;
	struct session *prev, *next;
	struct ucred cred;
	char name[MSG_NAME_MAX + 1];
	struct frame_reader reader;
	bool reader_open;
	bool hello_pending;        /* hello received while loading: welcome when ready */
	bool welcome_deferred;     /* welcome waits for queued frames to leave first */
	uint64_t hello_id;
	bool want_ring;
	bool welcomed;
	bool closing;              /* no more reads; waiting for the compute thread */
	bool handle_closed;
	struct ring ring;          /* daemon side of the client's shared memory */
	bool ring_open;
	/* Token events for requests with `socket: true`: a private ring the compute thread
	 * fills (sring) and the loop thread reads through a client-side view (speer), woken by
	 * its eventfd (spoll), then sends as `token` frames. */
	struct ring sring, speer;
	bool sring_open;
	uv_poll_t spoll;
	bool spoll_open;
	int closes_pending;        /* libuv handles still closing before the session is freed */
	_Atomic bool ring_broken;  /* set by the compute thread when the client corrupted it */
	struct sched_client client;
	struct serve_req *reqs;    /* requests in the compute thread's hands */
	uint32_t n_reqs;
	uint64_t queued_tokens;
	uint32_t n_inflight;       /* messages naming this session inside the scheduler */
	struct limits_peer lim;
	uint8_t rbuf[64 * 1024];
};

/* The loop thread's state. Read-only for sessions (session.c, offload.c, limits.c): loop,
 * wake and listener (their own handles hang off them), cfg, log, policy (its uid counts),
 * stopping, start_ns and the ledger cache. Everything else is private to server.c: the
 * model, the load's progress and the session list are reached through the functions
 * declared below the struct. */
struct server {
	/* read-only for sessions */
	uv_loop_t loop;
	uv_pipe_t listener;
	bool listener_open;
	int lock_fd;               /* the socket path's lock (sockpath.h), -1 with systemd's */
	uv_signal_t sig_term, sig_int, sig_hup;
	uv_timer_t tick;           /* status lines, loading frames, watchdog */
	uv_async_t wake;           /* compute thread or loader has something for the loop */
	bool handles_open;

	struct hearth_config cfg;
	const char *config_path;   /* NULL: no file */
	const char *const *sets;
	size_t n_sets;
	struct log *log;
	struct policy policy;

	pthread_mutex_t mu;        /* loader -> loop hand-over; never taken on the hot path */
	/* Thread-pool work reading the tokenizer (offload.c), waited for before a model goes. */
	pthread_mutex_t offload_mu;
	pthread_cond_t offload_cv;
	unsigned offload_busy;
	bool model_arrived, load_failed;
	struct server_model model_in;
	struct hearth_error load_err;
	char phase[64];
	uint64_t load_done, load_total;
	bool loads_stop;           /* set when stopping: a loader may give up (server_progress) */

	enum serve_state state;
	struct server_model model;
	bool have_model;
	struct sched *sched;

	/* Loads and model swaps (SIGHUP). */
	server_load_fn load;
	void *load_ctx;
	unsigned loads_in_flight;
	bool swapping;             /* a swap is under way */
	bool swap_beside;          /* the new model loads while the old one serves */
	struct hearth_config pending_cfg;
	struct sched *old_sched;   /* retiring after a swap: drains, then goes */
	struct server_model old_model;

	/* private: server.c's list (server_session_link/unlink/walk) */
	struct session *sessions;
	uint32_t n_sessions;
	bool stopping;
	bool shutdown_posted;
	int exit_code;
	struct hearth_error exit_err;

	uint64_t start_ns;
	/* The last ledger (session_on_ledger): answered again while the rings and the model
	 * are the same and it is younger than SESSION_LEDGER_REUSE_NS, so a flood of ledger
	 * requests costs the loop thread one collection a second. */
	struct ledger *ledger_last;
	uint64_t ledger_last_ns, ledger_last_key;
	uint64_t watchdog_usec;
	struct systemd_progress progress;
};

/* session.c */
void session_accept(struct server *srv);
void session_deliver(struct server *srv, struct sched_msg *m);
void session_model_ready(struct session *ss);
void session_model_failed(struct session *ss, const struct hearth_error *e);
void session_send_loading(struct session *ss, const char *phase, uint64_t done, uint64_t total);
void session_close(struct session *ss);
void session_check_ring(struct session *ss);
/* For work finished off the loop thread (offload.c): a reply, an error reply, and the end
 * of a hold on the session taken with n_inflight++ (the session may be freed here). */
void session_reply(struct session *ss, const struct msg *m);
void session_reply_error(struct session *ss, uint64_t id, enum msg_errcode code, const char *text);
void session_unhold(struct session *ss);

/* An embed request's inputs as tokens back to back (*prompt) and where each ends (*ends):
 * texts tokenized as llama.cpp's embedding tool and server do (the model's BOS and EOS,
 * special-token text parsed), ids checked against the vocabulary; each input must fit
 * max_ctx. 0, or the wire code and words of the refusal in *code and e. Touches no session:
 * offload.c runs it on a worker. */
int serve_embed_tokens(const struct tok *tok, uint32_t max_ctx, uint32_t n_vocab, const struct msg_embed *em,
		       int32_t **prompt, uint32_t **ends, uint32_t *n_total, enum msg_errcode *code,
		       struct hearth_error *e);
/* Hands an embed's tokens to the scheduler (takes prompt and ends in every case). */
void session_embed_submit(struct session *ss, uint64_t id, int pooling, size_t n_in, int32_t *prompt,
			  uint32_t *ends, uint32_t n_total);
/* Takes the frames left buffered while paused, then reads from the peer again. */
void session_resume_reading(struct session *ss);

/* server.c: what sessions may know of the server, through these and never its fields. */

/* The model in service (a const view: tokenizer, engine, templates, grammars, facts), or
 * NULL while none is ready. */
const struct server_model *server_model_view(const struct server *s);

/* Where a load stands, read under the loader's lock: state, phase and progress, and the
 * reason when it failed. */
struct server_loading {
	enum serve_state state;
	char phase[64];
	uint64_t done, total;
	char error[HEARTH_ERROR_MSG_MAX];
};
void server_loading_snapshot(struct server *s, struct server_loading *out);

/* The server owns the list of sessions: a new one is linked, a closing one unlinked, and
 * a walk visits each in turn (fn must not link or unlink). */
void server_session_link(struct server *s, struct session *ss);
void server_session_unlink(struct server *s, struct session *ss);
void server_sessions_walk(struct server *s, void (*fn)(struct session *ss, void *ctx), void *ctx);
uint32_t server_n_sessions(const struct server *s);

/* sched_msg_send to the current scheduler: 0, or m is freed and HEARTH_ENOMEM/EBUSY. */
int serve_post(struct server *srv, struct sched_msg *m);
/* Posts a CLIENT_GONE for ss to every live scheduler (the current and a retiring one);
 * returns how many went out. */
unsigned serve_post_gone(struct server *srv, struct session *ss);

#endif
