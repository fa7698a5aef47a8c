/* hearthd's serving side, on the libuv loop thread: the listening socket (passed by
 * systemd or made from the config), one session per client, signals, status and watchdog
 * timers, and the hand-off to the compute thread. The socket listens before the model is
 * loaded, so early clients wait (told `loading`) instead of being refused. */
#ifndef HEARTH_DAEMON_SERVER_H
#define HEARTH_DAEMON_SERVER_H

#include <stdint.h>

#include "daemon/config.h"
#include "daemon/engine.h"
#include "daemon/log.h"
#include "daemon/sched.h"
#include "protocol/error.h"
#include "protocol/msg.h"

struct server;
struct tok;

/* What a loaded model gives the server. Owned by the caller, which keeps it alive until
 * server_run returns. */
struct server_model {
	const struct tok *tok;
	struct engine eng;
	struct msg_model_info info;    /* strings point into caller storage */
	const struct sched_params *sched; /* NULL: sched_params_default */
};

/* listen_fd: a listening AF_UNIX socket (systemd's), or -1 to create cfg->socket.
 * config_path and sets (the command line's key=value settings) are kept so SIGHUP can
 * rebuild the configuration the same way start-up did; both are borrowed for the server's
 * life. */
int server_new(struct server **out, const struct hearth_config *cfg, const char *config_path,
	       const char *const *sets, size_t n_sets, struct log *lg, int listen_fd,
	       struct hearth_error *err);

/* Any thread (the loader): progress while loading, then exactly one of ready / failed. */
void server_progress(struct server *s, const char *phase, uint64_t done, uint64_t total);
void server_model_ready(struct server *s, const struct server_model *m);
void server_model_failed(struct server *s, const struct hearth_error *e);

/* Runs the loop until SIGTERM/SIGINT has drained every request, or the model failed to
 * load. Returns 0 for a clean stop, else an error (the model's). */
int server_run(struct server *s, struct hearth_error *err);

void server_free(struct server *s);

#endif
