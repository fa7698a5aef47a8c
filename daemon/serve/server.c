/* The loop thread: owns the listening socket, the sessions, signals and timers, and is the
 * only thread that talks to the compute thread (through sched's queues). Models arrive from
 * loader threads through `mu` and an async wake-up, so the socket is served while a model
 * loads, and SIGHUP can swap models without closing it. */
#include "daemon/serve/server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/engine/load.h"
#include "daemon/engine/memstat.h"
#include "daemon/serve/calib.h"
#include "daemon/serve/offload.h"
#include "daemon/serve/serve.h"
#include "daemon/serve/sockpath.h"
#include "protocol/assert.h"
#include "protocol/clock.h"

const struct server_model *server_model_view(const struct server *s)
{
	return s->state == SERVE_READY || s->have_model ? &s->model : NULL;
}

void server_loading_snapshot(struct server *s, struct server_loading *out)
{
	pthread_mutex_lock(&s->mu);
	out->state = s->state;
	memcpy(out->phase, s->phase, sizeof out->phase);
	out->phase[sizeof out->phase - 1] = 0;
	out->done = s->load_done;
	out->total = s->load_total;
	snprintf(out->error, sizeof out->error, "%s", s->exit_err.msg);
	pthread_mutex_unlock(&s->mu);
}

void server_session_link(struct server *s, struct session *ss)
{
	ss->prev = NULL;
	ss->next = s->sessions;
	if (s->sessions)
		s->sessions->prev = ss;
	s->sessions = ss;
	s->n_sessions++;
}

void server_session_unlink(struct server *s, struct session *ss)
{
	if (ss->prev)
		ss->prev->next = ss->next;
	else
		s->sessions = ss->next;
	if (ss->next)
		ss->next->prev = ss->prev;
	ss->next = ss->prev = NULL;
	hearth_assert(s->n_sessions > 0);
	s->n_sessions--;
}

void server_sessions_walk(struct server *s, void (*fn)(struct session *ss, void *ctx), void *ctx)
{
	for (struct session *ss = s->sessions, *next; ss; ss = next) {
		next = ss->next;
		fn(ss, ctx);
	}
}

uint32_t server_n_sessions(const struct server *s)
{
	return s->n_sessions;
}

int serve_post(struct server *srv, struct sched_msg *m)
{
	return sched_msg_send(srv->sched, m);
}

unsigned serve_post_gone(struct server *srv, struct session *ss)
{
	struct sched *live[2] = { srv->sched, srv->old_sched };
	unsigned n = 0;
	for (int i = 0; i < 2; i++) {
		if (live[i] && sched_msg_send(live[i], sched_msg_new(SCHED_MSG_CLIENT_GONE,
									  &ss->client, ss)) == 0)
			n++;
	}
	return n;
}

/* ---- models: loading, serving, retiring ---- */

static void server_notify(void *ctx)
{
	struct server *srv = ctx;
	uv_async_send(&srv->wake);
}

static int server_begin_load(struct server *srv, const struct hearth_config *cfg)
{
	struct hearth_error e;
	if (srv->load(srv->load_ctx, srv, cfg, &e) < 0) {
		log_error(srv->log, "cannot start loading %s: %s", cfg->model, e.msg);
		return e.code;
	}
	srv->loads_in_flight++;
	return 0;
}

static void server_release(struct server *srv, struct server_model *m)
{
	if (m->release)
		offload_quiesce(srv); /* no worker may still read its tokenizer */
	if (m->release)
		m->release(m->owner);
	memset(m, 0, sizeof *m);
}

/* Stops a scheduler and gives every message it still holds to its session. */
static void server_retire_sched(struct server *srv, struct sched *s)
{
	sched_stop(s);
	struct sched_msg *m;
	while ((m = sched_take(s))) {
		if (m->type == SCHED_MSG_SHUTDOWN || m->type == SCHED_MSG_DRAIN)
			free(m);
		else
			session_deliver(srv, m);
	}
	sched_destroy(s);
}

/* READY=1 that ends a reload (RELOADING=1 was sent at its start) without a new model
 * serving: nothing changed that needed one, or the swap was given up. */
static void server_reload_done(struct server *srv, const char *status)
{
	struct hearth_error e;
	if (systemd_notify_ready(status, &e) < 0)
		log_warning(srv->log, "systemd notify: %s", e.msg);
}

static int server_start_serving(struct server *srv)
{
	struct hearth_error e;
	struct sched_params p;
	if (srv->model.sched)
		p = *srv->model.sched;
	else
		sched_params_default(&p);
	if (sched_start(&srv->sched, &p, &srv->model.eng, srv->model.tok, server_notify, srv, &e) < 0) {
		log_error(srv->log, "cannot start the compute thread: %s", e.msg);
		srv->sched = NULL;
		return e.code;
	}
	srv->state = SERVE_READY;
	systemd_progress_init(&srv->progress, 0, hearth_now_ns() / 1000);
	log_notice(srv->log, "ready: %s, %s model (%s), %u tokens of context, KV for %llu tokens",
		   srv->cfg.model, srv->model.info.arch.ptr ? srv->model.info.arch.ptr : "?",
		   srv->model.info.quant.ptr ? srv->model.info.quant.ptr : "?",
		   srv->model.eng.max_context, (unsigned long long)srv->model.eng.kv_tokens);
	if (systemd_notify_ready(srv->old_sched ? "serving the new model; the old one drains" : "serving",
				 &e) < 0)
		log_warning(srv->log, "systemd notify: %s", e.msg);
	for (struct session *ss = srv->sessions; ss; ss = ss->next)
		session_model_ready(ss);
	return 0;
}

static void server_fail(struct server *srv, const struct hearth_error *e)
{
	srv->state = SERVE_FAILED;
	srv->exit_code = e->code ? e->code : HEARTH_EIO;
	srv->exit_err = *e;
}

static void server_finish_stop(struct server *srv)
{
	srv->stopping = true;
	if (srv->sched) {
		server_retire_sched(srv, srv->sched);
		srv->sched = NULL;
	}
	if (srv->old_sched) {
		server_retire_sched(srv, srv->old_sched);
		srv->old_sched = NULL;
	}
	server_release(srv, &srv->model);
	server_release(srv, &srv->old_model);
	srv->have_model = false;
	struct session *ss = srv->sessions;
	while (ss) {
		struct session *next = ss->next;
		session_close(ss);
		ss = next;
	}
	if (srv->listener_open) {
		srv->listener_open = false;
		uv_close((uv_handle_t *)&srv->listener, NULL);
	}
	/* A loader still running will call back through the wake handle: it stays open
	 * until that model has arrived and been released. */
	if (srv->handles_open && srv->loads_in_flight == 0) {
		srv->handles_open = false;
		uv_close((uv_handle_t *)&srv->tick, NULL);
		uv_close((uv_handle_t *)&srv->wake, NULL);
		uv_close((uv_handle_t *)&srv->sig_term, NULL);
		uv_close((uv_handle_t *)&srv->sig_int, NULL);
		uv_close((uv_handle_t *)&srv->sig_hup, NULL);
	}
}

/* The keys whose reload column says a change means loading the model anew. */
static bool server_model_keys_differ(const struct hearth_config *a, const struct hearth_config *b)
{
	return config_keys_differ(a, b, CONFIG_RELOAD_MODEL);
}

/* Takes the new configuration's model settings, keeping the socket (it is never closed). */
static void server_adopt_cfg(struct server *srv, const struct hearth_config *fresh)
{
	struct hearth_config c = *fresh;
	memcpy(c.socket, srv->cfg.socket, sizeof c.socket);
	c.socket_mode = srv->cfg.socket_mode;
	srv->cfg = c;
}

static void server_model_arrived(struct server *srv, const struct server_model *m)
{
	if (srv->stopping) {
		struct server_model tmp = *m;
		server_release(srv, &tmp);
		return;
	}
	if (srv->swapping && srv->swap_beside && srv->sched) {
		/* The old model keeps what it is running; everything new goes to the new one. */
		srv->old_sched = srv->sched;
		srv->old_model = srv->model;
		srv->sched = NULL;
		srv->model = *m;
		server_adopt_cfg(srv, &srv->pending_cfg);
		if (server_start_serving(srv) < 0) {
			/* Keep serving with the old model. */
			server_release(srv, &srv->model);
			srv->sched = srv->old_sched;
			srv->model = srv->old_model;
			srv->old_sched = NULL;
			memset(&srv->old_model, 0, sizeof srv->old_model);
			srv->swapping = false;
			server_reload_done(srv, "serving the old model; the new one could not start (see the log)");
			return;
		}
		if (sched_msg_send(srv->old_sched, sched_msg_new(SCHED_MSG_DRAIN, NULL, NULL)) == 0)
			return;
		/* Cannot ask it to drain: end it now. */
		server_retire_sched(srv, srv->old_sched);
		srv->old_sched = NULL;
		server_release(srv, &srv->old_model);
		srv->swapping = false;
		return;
	}
	srv->model = *m;
	srv->have_model = true;
	if (srv->swapping) {
		server_adopt_cfg(srv, &srv->pending_cfg);
		srv->swapping = false;
	}
	if (server_start_serving(srv) < 0) {
		struct hearth_error e;
		hearth_error_set(&e, HEARTH_EIO, "cannot start serving");
		server_fail(srv, &e);
		server_finish_stop(srv);
	}
}

static void server_on_sched_msg(struct server *srv, struct sched *from, struct sched_msg *msg)
{
	switch (msg->type) {
	case SCHED_MSG_SHUTDOWN:
		free(msg);
		log_notice(srv->log, "every request is done; stopping");
		server_finish_stop(srv);
		return;
	case SCHED_MSG_DRAIN:
		free(msg);
		if (from == srv->old_sched) {
			server_retire_sched(srv, srv->old_sched);
			srv->old_sched = NULL;
			server_release(srv, &srv->old_model);
			srv->swapping = false;
			log_notice(srv->log, "model swap done: the old model drained and was freed");
			systemd_notify_status(NULL, "serving");
		} else if (from == srv->sched) {
			/* Drain-first swap: the old model is idle; free it, then load. */
			server_retire_sched(srv, srv->sched);
			srv->sched = NULL;
			server_release(srv, &srv->model);
			srv->have_model = false;
			srv->state = SERVE_LOADING;
			log_notice(srv->log, "model swap: the old model drained and was freed; loading %s",
				   srv->pending_cfg.model);
			if (server_begin_load(srv, &srv->pending_cfg) < 0) {
				struct hearth_error e;
				hearth_error_set(&e, HEARTH_EIO, "the model swap could not start its load");
				server_fail(srv, &e);
				server_finish_stop(srv);
			}
		} else {
			log_warning(srv->log, "a drain came back from a retired scheduler");
		}
		return;
	default:
		session_deliver(srv, msg);
	}
}

static void server_on_wake(uv_async_t *h)
{
	struct server *srv = h->data;
	pthread_mutex_lock(&srv->mu);
	bool arrived = srv->model_arrived, failed = srv->load_failed;
	srv->model_arrived = srv->load_failed = false;
	struct server_model m = srv->model_in;
	struct hearth_error le = srv->load_err;
	pthread_mutex_unlock(&srv->mu);

	if (arrived || failed) {
		hearth_assert(srv->loads_in_flight > 0);
		srv->loads_in_flight--;
	}
	if (failed) {
		if (srv->swapping && srv->swap_beside && srv->sched) {
			log_error(srv->log, "model swap failed, still serving the old model: %s", le.msg);
			srv->swapping = false;
			server_reload_done(srv, "model swap failed; serving the old model");
		} else if (srv->swapping && !srv->stopping) {
			/* Drain-first swap: the old model is gone, but its settings are still the
			 * running config (adopted only on success): load it again. */
			log_error(srv->log, "model swap failed: %s; loading the previous model %s again",
				  le.msg, srv->cfg.model);
			systemd_notify_status(NULL, "model swap failed; loading the previous model again");
			srv->swapping = false;
			if (server_begin_load(srv, &srv->cfg) < 0) {
				server_fail(srv, &le);
				server_finish_stop(srv);
				return;
			}
		} else if (!srv->stopping) {
			log_error(srv->log, "the model failed to load: %s", le.msg);
			server_fail(srv, &le);
			for (struct session *ss = srv->sessions; ss; ss = ss->next)
				session_model_failed(ss, &le);
			server_finish_stop(srv);
			return;
		}
	}
	if (arrived)
		server_model_arrived(srv, &m);
	if (srv->stopping && (arrived || failed)) {
		server_finish_stop(srv); /* closes the handles now that no load is in flight */
		return;
	}
	for (struct session *ss = srv->sessions, *next; ss; ss = next) {
		next = ss->next;
		session_check_ring(ss);
	}
	struct sched *scheds[2] = { srv->sched, srv->old_sched };
	for (int i = 0; i < 2; i++) {
		struct sched *s = scheds[i];
		struct sched_msg *msg;
		while (s && (s == srv->sched || s == srv->old_sched) && (msg = sched_take(s))) {
			server_on_sched_msg(srv, s, msg);
			if (srv->stopping && !srv->handles_open)
				return;
		}
	}
}

/* ---- listening ---- */

static void server_on_connection(uv_stream_t *listener, int status)
{
	struct server *srv = listener->data;
	if (status < 0) {
		log_warning(srv->log, "accept: %s", uv_strerror(status));
		return;
	}
	session_accept(srv);
}

static int server_listen(struct server *srv, int listen_fd, struct hearth_error *err)
{
	int rc = uv_pipe_init(&srv->loop, &srv->listener, 0);
	if (rc < 0)
		return hearth_error_set(err, HEARTH_EIO, "uv_pipe_init: %s", uv_strerror(rc));
	srv->listener.data = srv;
	srv->listener_open = true;
	if (listen_fd >= 0) {
		rc = uv_pipe_open(&srv->listener, listen_fd);
		if (rc < 0)
			return hearth_error_set(err, HEARTH_EIO, "the socket systemd passed (fd %d): %s",
						listen_fd, uv_strerror(rc));
		log_info(srv->log, "serving on the socket systemd passed (fd %d)", listen_fd);
	} else {
		const char *path = srv->cfg.socket;
		rc = sockpath_claim(path, &srv->lock_fd, err);
		if (rc < 0)
			return rc;
		rc = uv_pipe_bind(&srv->listener, path);
		if (rc < 0)
			return hearth_error_set(err, HEARTH_EIO, "cannot bind %s: %s", path, uv_strerror(rc));
		if (chmod(path, srv->cfg.socket_mode) < 0)
			return hearth_error_errno(err, HEARTH_EIO, errno, "chmod %s", path);
		log_info(srv->log, "serving on %s (mode %04o)", path, (unsigned)srv->cfg.socket_mode);
	}
	rc = uv_listen((uv_stream_t *)&srv->listener, 128, server_on_connection);
	if (rc < 0)
		return hearth_error_set(err, HEARTH_EIO, "listen: %s", uv_strerror(rc));
	return 0;
}

/* ---- signals ---- */

static void server_begin_stop(struct server *srv, const char *why)
{
	if (srv->stopping)
		return;
	srv->stopping = true;
	pthread_mutex_lock(&srv->mu);
	srv->loads_stop = true;
	pthread_mutex_unlock(&srv->mu);
	struct hearth_error e;
	log_notice(srv->log, "%s: stopping; running requests get %llu ms to finish", why,
		   (unsigned long long)(srv->cfg.shutdown_grace_usec / 1000));
	if (systemd_notify_stopping("draining", &e) < 0)
		log_warning(srv->log, "systemd notify: %s", e.msg);
	/* Stop accepting. A socket file we bound ourselves is left: a restart rebinds it, and
	 * one systemd passed belongs to hearthd.socket. */
	if (srv->listener_open) {
		srv->listener_open = false;
		uv_close((uv_handle_t *)&srv->listener, NULL);
	}
	if (!srv->sched) {
		/* Nothing is being served (loading, or between a drain and a load). */
		server_finish_stop(srv);
		return;
	}
	struct sched_msg *m = sched_msg_new(SCHED_MSG_SHUTDOWN, NULL, NULL);
	if (m)
		m->grace_ns = srv->cfg.shutdown_grace_usec * 1000ull;
	/* Queued requests are told shutting_down at once; running ones get the grace period
	 * (sched). Sessions stay open so their final frames reach the clients. */
	if (serve_post(srv, m) < 0)
		server_finish_stop(srv);
}

/* What a loaded model holds beside its arena: tokenizer, KV bookkeeping, grammar index,
 * and the load's transients (tens of MiB for the models hearth serves). */
#define SERVER_MODEL_OVERHEAD (64ull << 20)

/* Whether the machine can hold a second model beside the first: arena_bytes is the new
 * arena as the loader plans it (load_plan_size: weights, KV with any sliding-window rings
 * on top of a default budget, scratch, and the draft model's regions), or imatrix = self's
 * calibration when that is more, plus the rest. */
static bool server_room_beside(uint64_t arena_bytes)
{
	uint64_t avail;
	struct hearth_error e;
	return memstat_mem_available(&avail, &e) == 0 && avail > arena_bytes + SERVER_MODEL_OVERHEAD;
}

static void server_reload(struct server *srv)
{
	struct hearth_error e;
	/* A SIGHUP while a load or swap is under way tells systemd nothing: the start-up's or
	 * the swap's READY=1 is still to come, and one sent now would claim it early. */
	const bool busy = srv->swapping || srv->state != SERVE_READY;
	if (!busy)
		systemd_notify_reloading("reloading the configuration", &e);
	/* Rebuilt from scratch as at start-up (defaults, file, flags), so a key removed from
	 * the file goes back to its default and flags still win. */
	struct hearth_config fresh;
	if (config_build(&fresh, srv->config_path, srv->sets, srv->n_sets, &e) < 0) {
		log_error(srv->log, "reload refused, configuration unchanged: %s", e.msg);
		if (!busy)
			server_reload_done(srv, "serving");
		return;
	}
	bool new_model = server_model_keys_differ(&srv->cfg, &fresh);
	char restart[512];
	config_reload_merge(&srv->cfg, &fresh, restart, sizeof restart);
	log_set_level(srv->log, srv->cfg.log_level);
	policy_update(&srv->policy, &srv->cfg);
	if (strcmp(fresh.socket, srv->cfg.socket) || fresh.socket_mode != srv->cfg.socket_mode)
		log_warning(srv->log, "the socket path and mode change only with a restart");
	if (!new_model) {
		log_notice(srv->log, "reloaded the configuration");
		if (!busy)
			server_reload_done(srv, "serving");
		return;
	}
	if (srv->swapping || srv->state != SERVE_READY || !srv->sched) {
		log_warning(srv->log, "the model settings changed, but a load or swap is already under way; send SIGHUP again after it");
		if (!busy)
			server_reload_done(srv, "serving");
		return;
	}
	/* The new pair planned as the loader will plan it, before anything is freed: a file that
	 * cannot even be parsed, a draft of another vocabulary or a KV budget that holds no
	 * block is refused while the old model still serves. */
	struct load_opts lo;
	size_t arena_bytes;
	config_load_opts(&fresh, &lo);
	if (load_plan_size(fresh.model, &lo, &arena_bytes, &e) < 0) {
		log_error(srv->log, "model swap refused, keeping %s: %s", srv->cfg.model, e.msg);
		server_reload_done(srv, "serving; the model swap was refused (see the log)");
		return;
	}
	log_info(srv->log, "model swap: the new arena plans %zu bytes%s", arena_bytes,
		 fresh.draft_model[0] ? " (the draft model's regions included)" : "");
	/* imatrix = self (or auto) without a file for the new model loads a calibration copy first (and
	 * the covariance sums beside it), which beside the running model may be the peak. */
	uint64_t need = arena_bytes;
	bool room_known = true;
	if (calib_wanted(&fresh, &lo, NULL, 0)) {
		struct calib cal;
		uint64_t calib_bytes;
		int rc = calib_locate(&cal, &fresh, &lo, &e);
		bool made = rc == 0 && calib_ready(&cal);
		if (rc < 0 || (!made && calib_plan(&cal, fresh.model, &lo, &calib_bytes, &e) < 0)) {
			log_warning(srv->log, "model swap: cannot plan imatrix = self's calibration (%s)", e.msg);
			room_known = false;
		} else if (!made) {
			log_info(srv->log, "model swap: imatrix = self samples the new model first: %llu bytes for that",
				 (unsigned long long)calib_bytes);
			if (calib_bytes > need)
				need = calib_bytes;
		}
	}
	srv->pending_cfg = fresh;
	srv->swapping = true;
	srv->swap_beside = fresh.model_swap == CONFIG_SWAP_BESIDE ||
			   (fresh.model_swap == CONFIG_SWAP_AUTO && room_known && server_room_beside(need));
	/* From here the reload ends when the new model serves (server_start_serving sends
	 * READY=1) or the swap is given up; until then only the status line moves. */
	if (srv->swap_beside) {
		log_notice(srv->log, "model swap: loading %s beside the running model", fresh.model);
		systemd_notify_status(NULL, "serving; loading the new model beside the old");
		if (server_begin_load(srv, &srv->pending_cfg) < 0) {
			srv->swapping = false;
			server_reload_done(srv, "serving; the new model could not start loading (see the log)");
		}
		return;
	}
	/* Drain-first frees the old model before the new one loads (planned above). */
	log_notice(srv->log, "model swap: draining running requests, then freeing the model and loading %s",
		   fresh.model);
	systemd_notify_status(NULL, "draining, then loading the new model");
	if (serve_post(srv, sched_msg_new(SCHED_MSG_DRAIN, NULL, NULL)) == 0) {
		/* New requests meet `loading` until the new model is in. */
		srv->state = SERVE_LOADING;
		return;
	}
	log_error(srv->log, "model swap: cannot drain now; keeping the old model");
	srv->swapping = false;
	server_reload_done(srv, "serving; the model swap could not drain (see the log)");
}

static void server_on_signal(uv_signal_t *h, int signum)
{
	struct server *srv = h->data;
	if (signum == SIGHUP) {
		server_reload(srv);
		return;
	}
	server_begin_stop(srv, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* ---- the tick: loading progress, status, watchdog ---- */

static void server_on_tick(uv_timer_t *t)
{
	struct server *srv = t->data;
	struct hearth_error e;
	limits_sweep(srv);
	if (srv->state == SERVE_LOADING) {
		pthread_mutex_lock(&srv->mu);
		char phase[64];
		memcpy(phase, srv->phase, sizeof phase);
		uint64_t done = srv->load_done, total = srv->load_total;
		pthread_mutex_unlock(&srv->mu);
		unsigned pct = total ? (unsigned)(done * 100 / total) : 0;
		systemd_notify_status(&e, "%s (%u%%)", phase[0] ? phase : "loading", pct);
		for (struct session *ss = srv->sessions; ss; ss = ss->next)
			if (ss->hello_pending)
				session_send_loading(ss, phase, done, total);
		if (srv->watchdog_usec)
			systemd_watchdog_ping(&e); /* loading is progress the loader reports */
		return;
	}
	if (srv->state != SERVE_READY || !srv->sched)
		return;
	const struct sched_stats *st = sched_stats(srv->sched);
	uint32_t running = atomic_load(&st->running), waiting = atomic_load(&st->waiting);
	uint32_t tps100 = atomic_load(&st->decode_tps_x100);
	systemd_notify_status(&e, "%u clients, %u running, %u queued, %u.%u tok/s", srv->n_sessions,
			      running, waiting, tps100 / 100, (tps100 % 100) / 10);
	if (srv->watchdog_usec) {
		uint64_t now = hearth_now_ns() / 1000;
		uint64_t steps = atomic_load(&st->steps);
		/* Sequences parked on a client's full ring are not the compute thread's work:
		 * a slow reader must not look like a hang. */
		uint32_t parked = atomic_load(&st->parked);
		bool pending = waiting + running > parked;
		if (systemd_progress_check(&srv->progress, steps, pending, now, srv->watchdog_usec / 2))
			systemd_watchdog_ping(&e);
		else
			log_error(srv->log, "the compute thread has made no step for %llu ms with work pending; withholding the watchdog ping",
				  (unsigned long long)((now - srv->progress.since_usec) / 1000));
	}
}

/* ---- the loader's side (any thread) ---- */

bool server_progress(struct server *s, const char *phase, uint64_t done, uint64_t total)
{
	pthread_mutex_lock(&s->mu);
	snprintf(s->phase, sizeof s->phase, "%s", phase);
	s->load_done = done;
	s->load_total = total;
	bool go_on = !s->loads_stop;
	pthread_mutex_unlock(&s->mu);
	return go_on;
}

void server_model_ready(struct server *s, const struct server_model *m)
{
	pthread_mutex_lock(&s->mu);
	s->model_in = *m;
	s->model_arrived = true;
	pthread_mutex_unlock(&s->mu);
	uv_async_send(&s->wake);
}

void server_model_failed(struct server *s, const struct hearth_error *e)
{
	pthread_mutex_lock(&s->mu);
	s->load_err = *e;
	s->load_failed = true;
	pthread_mutex_unlock(&s->mu);
	uv_async_send(&s->wake);
}

/* ---- life cycle ---- */

int server_new(struct server **out, const struct hearth_config *cfg, const char *config_path,
	       const char *const *sets, size_t n_sets, struct log *lg, int listen_fd,
	       server_load_fn load, void *load_ctx, struct hearth_error *err)
{
	*out = NULL;
	struct server *srv = calloc(1, sizeof *srv);
	if (!srv)
		return hearth_error_set(err, HEARTH_ENOMEM, "server: out of memory");
	srv->cfg = *cfg;
	srv->config_path = config_path;
	srv->sets = sets;
	srv->n_sets = n_sets;
	srv->load = load;
	srv->load_ctx = load_ctx;
	srv->log = lg;
	srv->start_ns = hearth_now_ns();
	srv->lock_fd = -1;
	pthread_mutex_init(&srv->mu, NULL);
	pthread_mutex_init(&srv->offload_mu, NULL);
	pthread_cond_init(&srv->offload_cv, NULL);
	policy_init(&srv->policy, cfg);
	int rc = uv_loop_init(&srv->loop);
	if (rc < 0) {
		pthread_mutex_destroy(&srv->mu);
		policy_free(&srv->policy);
		free(srv);
		return hearth_error_set(err, HEARTH_EIO, "uv_loop_init: %s", uv_strerror(rc));
	}
	uv_async_init(&srv->loop, &srv->wake, server_on_wake);
	srv->wake.data = srv;
	uv_timer_init(&srv->loop, &srv->tick);
	srv->tick.data = srv;
	uv_signal_init(&srv->loop, &srv->sig_term);
	uv_signal_init(&srv->loop, &srv->sig_int);
	uv_signal_init(&srv->loop, &srv->sig_hup);
	srv->sig_term.data = srv->sig_int.data = srv->sig_hup.data = srv;
	srv->handles_open = true;
	uv_signal_start(&srv->sig_term, server_on_signal, SIGTERM);
	uv_signal_start(&srv->sig_int, server_on_signal, SIGINT);
	uv_signal_start(&srv->sig_hup, server_on_signal, SIGHUP);
	struct hearth_error we;
	if (systemd_watchdog_interval(&srv->watchdog_usec, &we) < 0) {
		log_warning(lg, "watchdog disabled: %s", we.msg);
		srv->watchdog_usec = 0;
	}
	*out = srv;
	rc = server_listen(srv, listen_fd, err);
	if (rc < 0) {
		server_finish_stop(srv);
		uv_run(&srv->loop, UV_RUN_DEFAULT);
		server_free(srv);
		*out = NULL;
		return rc;
	}
	/* A quarter of the watchdog interval (systemd's advice is half), else once a second. */
	uint64_t tick_ms = srv->watchdog_usec ? srv->watchdog_usec / 4000 : 1000;
	if (tick_ms == 0)
		tick_ms = 1;
	if (tick_ms > 1000)
		tick_ms = 1000;
	uv_timer_start(&srv->tick, server_on_tick, tick_ms, tick_ms);
	return 0;
}

int server_run(struct server *s, struct hearth_error *err)
{
	if (server_begin_load(s, &s->cfg) < 0) {
		hearth_error_set(&s->exit_err, HEARTH_EIO, "cannot start loading %s", s->cfg.model);
		s->exit_code = HEARTH_EIO;
		server_finish_stop(s);
	}
	uv_run(&s->loop, UV_RUN_DEFAULT);
	if (s->exit_code < 0) {
		if (err)
			*err = s->exit_err;
		return s->exit_code;
	}
	return 0;
}

void server_free(struct server *s)
{
	if (!s)
		return;
	if (s->handles_open || s->listener_open || s->sched || s->old_sched || s->sessions ||
	    s->model.release) {
		server_finish_stop(s);
		uv_run(&s->loop, UV_RUN_DEFAULT);
	}
	uv_loop_close(&s->loop);
	if (s->lock_fd >= 0)
		close(s->lock_fd);
	free(s->ledger_last);
	policy_free(&s->policy);
	pthread_mutex_destroy(&s->mu);
	pthread_mutex_destroy(&s->offload_mu);
	pthread_cond_destroy(&s->offload_cv);
	free(s);
}
