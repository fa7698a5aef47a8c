/* hearthd's serving side, on the libuv loop thread: the listening socket (passed by
 * systemd or made from the config), one session per client, signals, status and watchdog
 * timers, and the hand-off to the compute thread. The socket listens before the model is
 * loaded, so early clients wait (told `loading`) instead of being refused. */
#ifndef HEARTH_DAEMON_SERVER_H
#define HEARTH_DAEMON_SERVER_H

#include <stdint.h>

#include "daemon/serve/config.h"
#include "daemon/engine/arena.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/ledger.h"
#include "daemon/serve/log.h"
#include "daemon/serve/sched.h"
#include "protocol/error.h"
#include "protocol/msg.h"

struct server;
struct tok;
struct serve_chat_model;
struct grammar_cache;

/* What a loaded model gives the server. The server calls release(owner) on the loop
 * thread once nothing uses the model any more (after a swap retired it, or at stop). */
struct server_model {
	const struct tok *tok;
	struct engine eng;
	struct msg_model_info info;    /* strings point into the owner's storage */
	const struct sched_params *sched; /* NULL: sched_params_default */
	const struct arena *arena;     /* for the ledger (the draft's regions too); NULL: none */
	const struct ledger_load *load; /* what the load sampler saw; NULL: none */
	const struct serve_chat_model *chat; /* the model's chat templates */
	struct grammar_cache *grammars;      /* compiled grammars for this vocabulary */
	void (*release)(void *owner);
	void *owner;
};

/* Starts loading cfg->model on a thread of the caller's (cfg may be copied, not kept). The
 * thread reports with server_progress, then exactly one of server_model_ready or
 * server_model_failed. Used for the first load and for every model swap on SIGHUP. */
typedef int (*server_load_fn)(void *ctx, struct server *s, const struct hearth_config *cfg,
			      struct hearth_error *err);

/* listen_fd: a listening AF_UNIX socket (systemd's), or -1 to create cfg->socket.
 * config_path and sets (the command line's key=value settings) are kept so SIGHUP can
 * rebuild the configuration the same way start-up did; both are borrowed for the server's
 * life. */
int server_new(struct server **out, const struct hearth_config *cfg, const char *config_path,
	       const char *const *sets, size_t n_sets, struct log *lg, int listen_fd,
	       server_load_fn load, void *load_ctx, struct hearth_error *err);

/* Any thread (the loader): progress while loading, then exactly one of ready / failed.
 * server_progress is false once the daemon is stopping: a loader in a long step that can
 * stop (imatrix = self's sampling) gives up with an error instead of holding the stop. */
bool server_progress(struct server *s, const char *phase, uint64_t done, uint64_t total);
void server_model_ready(struct server *s, const struct server_model *m);
void server_model_failed(struct server *s, const struct hearth_error *e);

/* Starts the first load, then runs the loop until SIGTERM/SIGINT has drained every
 * request, or the model failed to load. Returns 0 for a clean stop, else an error. */
int server_run(struct server *s, struct hearth_error *err);

void server_free(struct server *s);

#endif
