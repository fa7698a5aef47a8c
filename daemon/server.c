/* The loop thread: owns the listening socket, the sessions, signals and timers, and is the
 * only thread that talks to the compute thread (through sched's queues). The model arrives
 * from a loader thread through `mu` and an async wake-up, so the socket is served while the
 * model loads. */
#include "daemon/server.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/serve.h"

uint64_t serve_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

bool serve_post(struct server *srv, struct sched_msg *m)
{
	return srv->sched && sched_post(srv->sched, m);
}

/* ---- the compute thread's wake-up ---- */

static void server_notify(void *ctx)
{
	struct server *srv = ctx;
	uv_async_send(&srv->wake);
}

static void server_start_serving(struct server *srv)
{
	struct hearth_error e;
	struct sched_params p;
	if (srv->model.sched)
		p = *srv->model.sched;
	else
		sched_params_default(&p);
	p.stall_ns = srv->cfg.shutdown_grace_usec * 1000ull > p.stall_ns ? srv->cfg.shutdown_grace_usec * 1000ull : p.stall_ns;
	if (sched_start(&srv->sched, &p, &srv->model.eng, srv->model.tok, server_notify, srv, &e) < 0) {
		log_error(srv->log, "cannot start the compute thread: %s", e.msg);
		srv->state = SERVE_FAILED;
		srv->exit_code = e.code;
		srv->exit_err = e;
		return;
	}
	srv->state = SERVE_READY;
	systemd_progress_init(&srv->progress, 0, serve_now_ns() / 1000);
	log_notice(srv->log, "ready: %s model, %u tokens of context, KV for %llu tokens",
		   srv->model.info.arch.ptr ? srv->model.info.arch.ptr : "?", srv->model.eng.max_context,
		   (unsigned long long)srv->model.eng.kv_tokens);
	if (systemd_notify_ready("serving", &e) < 0)
		log_warning(srv->log, "systemd notify: %s", e.msg);
	for (struct session *ss = srv->sessions; ss; ss = ss->next)
		session_model_ready(ss);
}

static void server_finish_stop(struct server *srv)
{
	if (srv->sched) {
		sched_stop(srv->sched);
		struct sched_msg *m;
		while ((m = sched_take(srv->sched)))
			session_deliver(srv, m);
		sched_destroy(srv->sched);
		srv->sched = NULL;
	}
	struct session *ss = srv->sessions;
	while (ss) {
		struct session *next = ss->next;
		session_close(ss);
		ss = next;
	}
	if (srv->handles_open) {
		srv->handles_open = false;
		uv_close((uv_handle_t *)&srv->tick, NULL);
		uv_close((uv_handle_t *)&srv->wake, NULL);
		uv_close((uv_handle_t *)&srv->sig_term, NULL);
		uv_close((uv_handle_t *)&srv->sig_int, NULL);
		uv_close((uv_handle_t *)&srv->sig_hup, NULL);
	}
	if (srv->listener_open) {
		srv->listener_open = false;
		uv_close((uv_handle_t *)&srv->listener, NULL);
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

	if (failed && srv->state == SERVE_LOADING) {
		log_error(srv->log, "the model failed to load: %s", le.msg);
		srv->state = SERVE_FAILED;
		srv->exit_code = le.code ? le.code : HEARTH_EIO;
		srv->exit_err = le;
		for (struct session *ss = srv->sessions; ss; ss = ss->next)
			session_model_failed(ss, &le);
		srv->stopping = true;
		server_finish_stop(srv);
		return;
	}
	if (arrived && srv->state == SERVE_LOADING) {
		srv->model = m;
		if (srv->stopping) {
			/* SIGTERM came during the load: nothing to serve, nothing to drain. */
			server_finish_stop(srv);
			return;
		}
		server_start_serving(srv);
	}
	if (!srv->sched)
		return;
	for (struct session *ss = srv->sessions, *next; ss; ss = next) {
		next = ss->next;
		session_check_ring(ss);
	}
	struct sched_msg *msg;
	while ((msg = sched_take(srv->sched))) {
		if (msg->type == SCHED_MSG_SHUTDOWN) {
			free(msg);
			log_notice(srv->log, "every request is done; stopping");
			server_finish_stop(srv);
			return;
		}
		session_deliver(srv, msg);
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
		struct stat st;
		/* A socket file left by a crashed daemon would make bind fail; anything that is
		 * not a socket is left alone and reported. */
		if (lstat(path, &st) == 0) {
			if (!S_ISSOCK(st.st_mode))
				return hearth_error_set(err, HEARTH_EINVAL,
							"socket path %s exists and is not a socket", path);
			unlink(path);
		}
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
	if (srv->state == SERVE_LOADING)
		return; /* stops when the loader hands the model over */
	if (!srv->sched) {
		server_finish_stop(srv);
		return;
	}
	struct sched_msg *m = calloc(1, sizeof *m);
	if (!m) {
		server_finish_stop(srv);
		return;
	}
	m->type = SCHED_MSG_SHUTDOWN;
	m->grace_ns = srv->cfg.shutdown_grace_usec * 1000ull;
	if (!serve_post(srv, m)) {
		free(m);
		server_finish_stop(srv);
		return;
	}
	srv->shutdown_posted = true;
	for (struct session *ss = srv->sessions; ss; ss = ss->next)
		session_shutdown(ss);
}

static void server_on_signal(uv_signal_t *h, int signum)
{
	struct server *srv = h->data;
	if (signum == SIGHUP) {
		struct hearth_error e;
		systemd_notify_reloading("reloading the configuration", &e);
		/* Rebuilt from scratch as at start-up (defaults, file, flags), so a key removed
		 * from the file goes back to its default and flags still win. */
		struct hearth_config fresh;
		int rc = config_build(&fresh, srv->config_path, srv->sets, srv->n_sets, &e);
		if (rc < 0) {
			log_error(srv->log, "reload refused, configuration unchanged: %s", e.msg);
		} else {
			char restart[512];
			config_reload_merge(&srv->cfg, &fresh, restart, sizeof restart);
			log_set_level(srv->log, srv->cfg.log_level);
			policy_update(&srv->policy, &srv->cfg);
			if (restart[0])
				log_warning(srv->log, "reloaded; these keys changed but need a restart: %s", restart);
			else
				log_notice(srv->log, "reloaded the configuration");
		}
		systemd_notify_ready(srv->state == SERVE_READY ? "serving" : "loading", &e);
		return;
	}
	server_begin_stop(srv, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* ---- the tick: loading progress, status, watchdog ---- */

static void server_on_tick(uv_timer_t *t)
{
	struct server *srv = t->data;
	struct hearth_error e;
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
		uint64_t now = serve_now_ns() / 1000;
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

void server_progress(struct server *s, const char *phase, uint64_t done, uint64_t total)
{
	pthread_mutex_lock(&s->mu);
	snprintf(s->phase, sizeof s->phase, "%s", phase);
	s->load_done = done;
	s->load_total = total;
	pthread_mutex_unlock(&s->mu);
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
	       struct hearth_error *err)
{
	*out = NULL;
	struct server *srv = calloc(1, sizeof *srv);
	if (!srv)
		return hearth_error_set(err, HEARTH_ENOMEM, "server: out of memory");
	srv->cfg = *cfg;
	srv->config_path = config_path;
	srv->sets = sets;
	srv->n_sets = n_sets;
	srv->log = lg;
	srv->start_ns = serve_now_ns();
	pthread_mutex_init(&srv->mu, NULL);
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
	if (s->handles_open || s->listener_open || s->sched || s->sessions) {
		server_finish_stop(s);
		uv_run(&s->loop, UV_RUN_DEFAULT);
	}
	uv_loop_close(&s->loop);
	policy_free(&s->policy);
	pthread_mutex_destroy(&s->mu);
	free(s);
}
