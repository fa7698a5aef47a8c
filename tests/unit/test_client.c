/* Tests of libhearth against a scripted fake hearthd: a thread that listens on a temporary
 * Unix socket and speaks the real protocol through protocol/ (frames, msgpack, a real
 * ring_create'd memfd passed with SCM_RIGHTS, token records in the ring). Each test's
 * script plays one daemon behaviour; the client under test uses only the public API. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "protocol/clock.h"
#include "protocol/error.h"
#include "protocol/fdpass.h"
#include "protocol/frame.h"
#include "protocol/msg.h"
#include "protocol/ring.h"
#include "client/hearth.h"

#define FAKE_WAIT_MS 5000

/* ---- the fake daemon ---- */

struct fake;
typedef void (*fake_script)(struct fake *f);

struct fake {
	char dir[64];
	char path[128];
	int lfd;
	int fd;
	pthread_t thr;
	fake_script script;
	void *arg;
	struct frame_reader fr;
	struct ring ring;
	bool ring_open;
	size_t d2c_cap;
	size_t c2d_cap;
	int n_loading;            /* loading frames before the welcome */
	int n_conns;              /* connections to serve one after another (0 = 1) */
	char fail[600];           /* the script's first failure; checked by the test */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int go;                   /* bumped by the test to release a waiting script */
	int go_seen;
	uint64_t ids[8];          /* request ids the script saw, for the test to check */
	char hello_name[MSG_NAME_MAX + 1];
};

static int fake_failf(struct fake *f, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int fake_failf(struct fake *f, int line, const char *fmt, ...)
{
	if (!f->fail[0]) {
		int n = snprintf(f->fail, sizeof f->fail, "fake daemon, line %d: ", line);
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(f->fail + n, sizeof f->fail - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return -1;
}

#define FCHECK(f, cond, ...) \
	do { \
		if (!(cond)) { \
			fake_failf(f, __LINE__, __VA_ARGS__); \
			return; \
		} \
	} while (0)
#define FTRY(x) \
	do { \
		if ((x) < 0) \
			return; \
	} while (0)

/* The next frame from the client, strictly decoded. 1 when the client closed. */
static int fake_recv(struct fake *f, struct msg *m)
{
	uint8_t buf[65536];
	for (;;) {
		const uint8_t *payload;
		size_t len;
		struct hearth_error e;
		int rc = frame_reader_next(&f->fr, &payload, &len, &e);
		if (rc == FRAME_READY) {
			struct msg_reject rej;
			if (msg_decode(payload, len, MSG_FROM_CLIENT, m, &rej, &e) < 0)
				return fake_failf(f, __LINE__, "client frame refused: %s", e.msg);
			return 0;
		}
		if (rc != FRAME_NEED_MORE)
			return fake_failf(f, __LINE__, "client framing: %s", e.msg);
		struct pollfd pf = { .fd = f->fd, .events = POLLIN };
		if (poll(&pf, 1, FAKE_WAIT_MS) != 1)
			return fake_failf(f, __LINE__, "no frame from the client in %d ms", FAKE_WAIT_MS);
		ssize_t n = read(f->fd, buf, sizeof buf);
		if (n == 0)
			return 1;
		if (n < 0)
			return fake_failf(f, __LINE__, "read: %s", strerror(errno));
		if (frame_reader_feed(&f->fr, buf, (size_t)n, &e) < 0)
			return fake_failf(f, __LINE__, "feed: %s", e.msg);
	}
}

/* The next frame, which must be of type t. */
static int fake_expect(struct fake *f, enum msg_type t, struct msg *m)
{
	int rc = fake_recv(f, m);
	if (rc < 0)
		return rc;
	if (rc == 1)
		return fake_failf(f, __LINE__, "client closed while %s was expected",
				  msg_type_name(t));
	if (m->type != t) {
		fake_failf(f, __LINE__, "got %s, expected %s", msg_type_name(m->type),
			   msg_type_name(t));
		msg_free(m);
		return -1;
	}
	return 0;
}

static int fake_write(struct fake *f, const void *p, size_t n)
{
	const uint8_t *b = p;
	while (n) {
		ssize_t w = send(f->fd, b, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return fake_failf(f, __LINE__, "write: %s", strerror(errno));
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

static int fake_send(struct fake *f, const struct msg *m)
{
	struct msg_buf b = { 0 };
	struct hearth_error e;
	if (msg_encode(m, &b, &e) < 0) {
		msg_buf_free(&b);
		return fake_failf(f, __LINE__, "encode %s: %s", msg_type_name(m->type), e.msg);
	}
	int rc = fake_write(f, b.data, b.len);
	msg_buf_free(&b);
	return rc;
}

static int fake_send_error(struct fake *f, uint64_t id, enum msg_errcode code, bool fatal,
			   const char *text)
{
	struct msg_buf b = { 0 };
	struct hearth_error e;
	if (msg_encode_error(&b, id, code, fatal, &e, "%s", text) < 0) {
		msg_buf_free(&b);
		return fake_failf(f, __LINE__, "encode error: %s", e.msg);
	}
	int rc = fake_write(f, b.data, b.len);
	msg_buf_free(&b);
	return rc;
}

static void fake_model(struct msg_welcome *w)
{
	w->daemon = (struct msg_bytes){ "9.9.9", 5 };
	w->model.arch = (struct msg_bytes){ "llama", 5 };
	w->model.name = (struct msg_bytes){ "tiny-test", 9 };
	w->model.quant = (struct msg_bytes){ "q4_g128", 7 };
	w->model.n_params = 123456789;
	w->model.n_ctx = 2048;
	w->model.n_ctx_train = 4096;
	w->model.n_vocab = 32000;
	w->model.n_layer = 4;
	w->model.n_embd = 256;
	w->model.has_draft = true;
	w->model.draft = (struct msg_draft_info){ .arch = { "llama", 5 }, .name = { "tinier", 6 },
						  .quant = { "q4_g32", 6 }, .n_params = 2890000, .n_ctx = 256,
						  .n_layer = 2, .n_embd = 64 };
	w->max_frame = FRAME_MAX_DEFAULT;
}

/* hello -> n_loading `loading` frames -> welcome with the ring's 3 fds (one sendmsg). */
static int fake_handshake(struct fake *f)
{
	struct msg m;
	if (fake_expect(f, MSG_HELLO, &m) < 0)
		return -1;
	uint64_t id = m.id;
	bool ring = m.u.hello.ring;
	snprintf(f->hello_name, sizeof f->hello_name, "%.*s", (int)m.u.hello.name.len,
		 m.u.hello.name.ptr);
	msg_free(&m);
	if (!ring)
		return fake_failf(f, __LINE__, "hello without ring: true");
	for (int i = 0; i < f->n_loading; i++) {
		struct msg l;
		msg_init(&l, MSG_LOADING, id);
		l.u.loading.phase = (struct msg_bytes){ "repack", 6 };
		l.u.loading.done = (uint64_t)i + 1;
		l.u.loading.total = (uint64_t)f->n_loading;
		if (fake_send(f, &l) < 0)
			return -1;
	}
	struct hearth_error e;
	if (ring_create(&f->ring, f->d2c_cap, f->c2d_cap, &e) < 0)
		return fake_failf(f, __LINE__, "ring_create: %s", e.msg);
	f->ring_open = true;
	struct msg w;
	msg_init(&w, MSG_WELCOME, id);
	fake_model(&w.u.welcome);
	w.u.welcome.ring = true;
	w.u.welcome.ring_d2c = f->ring.tx.cap;
	w.u.welcome.ring_c2d = f->ring.rx.cap;
	struct msg_buf b = { 0 };
	if (msg_encode(&w, &b, &e) < 0) {
		msg_buf_free(&b);
		return fake_failf(f, __LINE__, "encode welcome: %s", e.msg);
	}
	int fds[3];
	ring_fds(&f->ring, fds);
	size_t sent;
	int rc = fdpass_send(f->fd, b.data, b.len, fds, 3, &sent, &e);
	if (rc == 0 && sent < b.len)
		rc = fake_write(f, b.data + sent, b.len - sent);
	msg_buf_free(&b);
	if (rc < 0)
		return fake_failf(f, __LINE__, "sending welcome: %s", e.msg);
	return 0;
}

/* Pushes a record, waiting on the daemon doorbell while the ring is full: the client
 * must ring it after popping. */
static int fake_push_token_ex(struct fake *f, uint64_t id, uint32_t token, const char *text,
			      size_t text_len, bool notify)
{
	struct ring_token t = { .request_id = id, .token = token,
				.text = (const uint8_t *)text, .text_len = text_len };
	struct hearth_error e;
	for (;;) {
		int rc = ring_push_token(&f->ring, &t, &e);
		if (rc == 0)
			break;
		if (rc != HEARTH_EBUSY)
			return fake_failf(f, __LINE__, "ring_push_token: %s", e.msg);
		ring_notify(&f->ring, NULL);
		struct pollfd pf = { .fd = ring_wait_fd(&f->ring), .events = POLLIN };
		if (poll(&pf, 1, FAKE_WAIT_MS) != 1)
			return fake_failf(f, __LINE__, "ring full and the client never rang the "
					  "doorbell after popping");
		ring_doorbell_clear(&f->ring, NULL);
	}
	if (notify)
		ring_notify(&f->ring, NULL);
	return 0;
}

static int fake_push_token(struct fake *f, uint64_t id, uint32_t token, const char *text)
{
	return fake_push_token_ex(f, id, token, text, strlen(text), true);
}

static int fake_done(struct fake *f, uint64_t id, enum msg_finish finish, uint32_t n_prompt,
		     uint32_t n_gen)
{
	struct msg d;
	msg_init(&d, MSG_DONE, id);
	d.u.done.finish = finish;
	d.u.done.n_prompt = n_prompt;
	d.u.done.n_gen = n_gen;
	d.u.done.queue_ms = 1.5;
	d.u.done.prefill_ms = 20.25;
	d.u.done.decode_ms = 100.5;
	d.u.done.prefill_tps = 148.0;
	d.u.done.decode_tps = 39.75;
	return fake_send(f, &d);
}

/* Blocks the script until the test calls fake_go. */
static int fake_wait_go(struct fake *f)
{
	pthread_mutex_lock(&f->mu);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += FAKE_WAIT_MS / 1000;
	while (f->go == f->go_seen)
		if (pthread_cond_timedwait(&f->cv, &f->mu, &ts) == ETIMEDOUT)
			break;
	bool ok = f->go != f->go_seen;
	f->go_seen = f->go;
	pthread_mutex_unlock(&f->mu);
	return ok ? 0 : fake_failf(f, __LINE__, "the test never said go");
}

static void fake_go(struct fake *f)
{
	pthread_mutex_lock(&f->mu);
	f->go++;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
}

/* Waits for the client to hang up (scripts end this way so the client owns the close). */
static void fake_wait_close(struct fake *f)
{
	struct msg m;
	int rc = fake_recv(f, &m);
	if (rc == 0) {
		fake_failf(f, __LINE__, "unexpected %s at the end", msg_type_name(m.type));
		msg_free(&m);
	}
}

static void fake_close(struct fake *f)
{
	if (f->fd >= 0)
		close(f->fd);
	f->fd = -1;
	if (f->ring_open)
		ring_close(&f->ring);
	f->ring_open = false;
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;
	struct pollfd pf = { .fd = f->lfd, .events = POLLIN };
	if (poll(&pf, 1, FAKE_WAIT_MS) != 1) {
		fake_failf(f, __LINE__, "no client connected");
		return NULL;
	}
	for (int i = 0; i < (f->n_conns ? f->n_conns : 1) && !f->fail[0]; i++) {
		if (i > 0 && poll(&pf, 1, FAKE_WAIT_MS) != 1) {
			fake_failf(f, __LINE__, "client %d never connected", i + 1);
			return NULL;
		}
		f->fd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
		if (f->fd < 0) {
			fake_failf(f, __LINE__, "accept: %s", strerror(errno));
			return NULL;
		}
		frame_reader_free(&f->fr);
		frame_reader_init(&f->fr, 0, NULL);
		f->script(f);
		fake_close(f);
	}
	return NULL;
}

static struct fake *fake_start(fake_script script, void *arg)
{
	struct fake *f = calloc(1, sizeof *f);
	assert_non_null(f);
	f->fd = -1;
	f->script = script;
	f->arg = arg;
	f->d2c_cap = 1 << 16;
	f->c2d_cap = 1 << 16;
	pthread_mutex_init(&f->mu, NULL);
	pthread_cond_init(&f->cv, NULL);
	struct hearth_error e;
	assert_int_equal(frame_reader_init(&f->fr, 0, &e), 0);
	snprintf(f->dir, sizeof f->dir, "/tmp/hearth-test-client-XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	snprintf(f->path, sizeof f->path, "%s/hearth.sock", f->dir);
	f->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(f->lfd >= 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	memcpy(sa.sun_path, f->path, strlen(f->path) + 1);
	assert_int_equal(bind(f->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
	assert_int_equal(listen(f->lfd, 4), 0);
	return f;
}

static void fake_run(struct fake *f)
{
	assert_int_equal(pthread_create(&f->thr, NULL, fake_main, f), 0);
}

/* Joins the script and fails the test with the script's own complaint, if any. */
static void fake_stop(struct fake *f)
{
	pthread_join(f->thr, NULL);
	close(f->lfd);
	unlink(f->path);
	rmdir(f->dir);
	frame_reader_free(&f->fr);
	char fail[sizeof f->fail];
	memcpy(fail, f->fail, sizeof fail);
	pthread_mutex_destroy(&f->mu);
	pthread_cond_destroy(&f->cv);
	free(f);
	if (fail[0])
		fail_msg("%s", fail);
}

static struct hearth *client_connect(struct fake *f, int timeout_ms)
{
	struct hearth_connect_opts o = { .socket_path = f->path, .client_name = "test-client",
					 .timeout_ms = timeout_ms };
	struct hearth *h = NULL;
	struct hearth_err err = { 0 };
	int rc = hearth_connect_with(&h, &o, &err);
	if (rc)
		print_message("connect: %s\n", err.msg);
	assert_int_equal(rc, 0);
	return h;
}

/* What a callback saw. */
struct seen {
	uint32_t tokens[512];
	uint32_t index[512];
	float logprob[512];
	size_t n_top[512];
	struct hearth_top top0[512];
	float logit_first[512];
	uint32_t n_vocab[512];
	uint64_t t_sampled[512];
	size_t n;
	char text[8192];
	size_t len;
	int stop_after;           /* > 0: ask to cancel after this many tokens */
};

static int collect(void *user, const struct hearth_token *t)
{
	struct seen *s = user;
	if (s->n < 512) {
		s->tokens[s->n] = t->token;
		s->index[s->n] = t->index;
		s->logprob[s->n] = t->has_logprob ? t->logprob : 1.0f;
		s->n_top[s->n] = t->n_top;
		if (t->n_top)
			s->top0[s->n] = t->top[0];
		s->n_vocab[s->n] = t->n_vocab;
		s->logit_first[s->n] = t->logits ? t->logits[0] : -1.0f;
		s->t_sampled[s->n] = t->t_sampled_ns;
	}
	s->n++;
	if (s->len + t->text_len < sizeof s->text) {
		memcpy(s->text + s->len, t->text, t->text_len);
		s->len += t->text_len;
		s->text[s->len] = '\0';
	}
	return s->stop_after > 0 && s->n >= (size_t)s->stop_after;
}

static struct hearth_prompt text_prompt(const char *s)
{
	return (struct hearth_prompt){ .text = s, .len = strlen(s) };
}

/* ---- connect ---- */

static void script_welcome_only(struct fake *f)
{
	FTRY(fake_handshake(f));
	fake_wait_close(f);
}

struct loading_calls {
	int n;
	char phase[8][32];
	uint64_t done[8];
	uint64_t total[8];
};

static void on_loading(void *user, const char *phase, uint64_t done, uint64_t total)
{
	struct loading_calls *c = user;
	if (c->n < 8) {
		snprintf(c->phase[c->n], sizeof c->phase[0], "%s", phase);
		c->done[c->n] = done;
		c->total[c->n] = total;
	}
	c->n++;
}

static void test_client_connect_reports_loading_then_takes_welcome_and_ring(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_welcome_only, NULL);
	f->n_loading = 3;
	fake_run(f);
	struct loading_calls calls = { 0 };
	struct hearth_connect_opts o = { .socket_path = f->path, .client_name = "test-client",
					 .timeout_ms = 5000, .on_loading = on_loading,
					 .user = &calls };
	struct hearth *h;
	struct hearth_err err = { 0 };
	assert_int_equal(hearth_connect_with(&h, &o, &err), 0);
	assert_int_equal(calls.n, 3);
	for (int i = 0; i < 3; i++) {
		assert_string_equal(calls.phase[i], "repack");
		assert_int_equal(calls.done[i], (uint64_t)i + 1);
		assert_int_equal(calls.total[i], 3);
	}
	struct hearth_model m;
	assert_int_equal(hearth_model_info(h, &m, &err), 0);
	assert_string_equal(m.daemon_version, "9.9.9");
	assert_string_equal(m.arch, "llama");
	assert_string_equal(m.name, "tiny-test");
	assert_string_equal(m.quant, "q4_g128");
	assert_int_equal(m.n_params, 123456789);
	assert_int_equal(m.n_ctx, 2048);
	assert_int_equal(m.n_ctx_train, 4096);
	assert_int_equal(m.n_vocab, 32000);
	assert_int_equal(m.n_layer, 4);
	assert_int_equal(m.n_embd, 256);
	assert_string_equal(m.draft.arch, "llama"); /* welcome.model.draft */
	assert_string_equal(m.draft.name, "tinier");
	assert_string_equal(m.draft.quant, "q4_g32");
	assert_int_equal(m.draft.n_params, 2890000);
	assert_int_equal(m.draft.n_ctx, 256);
	assert_int_equal(m.draft.n_layer, 2);
	assert_int_equal(m.draft.n_embd, 64);
	assert_int_equal(m.proto_major, MSG_PROTO_MAJOR);
	assert_string_equal(f->hello_name, "test-client");
	hearth_close(h);
	fake_stop(f);
}

static void script_welcome_without_fds(struct fake *f)
{
	struct msg m;
	FTRY(fake_expect(f, MSG_HELLO, &m));
	struct msg w;
	msg_init(&w, MSG_WELCOME, m.id);
	msg_free(&m);
	fake_model(&w.u.welcome);
	w.u.welcome.ring = true;
	w.u.welcome.ring_d2c = 4096;
	w.u.welcome.ring_c2d = 4096;
	FTRY(fake_send(f, &w)); /* a plain write: no descriptors */
	fake_wait_close(f);
}

static void test_client_connect_refuses_a_ring_welcome_without_descriptors(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_welcome_without_fds, NULL);
	fake_run(f);
	struct hearth_connect_opts o = { .socket_path = f->path, .client_name = "test-client",
					 .timeout_ms = 5000 };
	struct hearth *h = NULL;
	struct hearth_err err = { 0 };
	assert_int_equal(hearth_connect_with(&h, &o, &err), HEARTH_EPROTO);
	assert_int_equal(err.code, HEARTH_EPROTO);
	assert_null(h);
	assert_non_null(strstr(err.msg, "descriptors"));
	fake_stop(f);
}

static void script_forbidden(struct fake *f)
{
	/* What hearthd's policy does at accept: say why, then close, reading nothing. */
	FTRY(fake_send_error(f, 0, MSG_ERR_FORBIDDEN, true, "uid 1234 is not in allow_users"));
}

static void test_client_connect_reports_why_the_daemon_refused_it(void **state)
{
	(void)state;
	/* The daemon closes with the client's hello unread: the client's read then ends in
	 * ECONNRESET, but only after the error frame queued before it. */
	struct fake *f = fake_start(script_forbidden, NULL);
	fake_run(f);
	struct hearth_connect_opts o = { .socket_path = f->path, .client_name = "test-client",
					 .timeout_ms = 5000 };
	struct hearth *h = NULL;
	struct hearth_err err = { 0 };
	assert_int_equal(hearth_connect_with(&h, &o, &err), HEARTH_EPERM);
	assert_null(h);
	assert_non_null(strstr(err.msg, "forbidden"));
	assert_non_null(strstr(err.msg, "uid 1234 is not in allow_users"));
	fake_stop(f);
}

static void test_client_connect_names_the_socket_it_could_not_reach(void **state)
{
	(void)state;
	struct hearth *h = NULL;
	struct hearth_err err = { 0 };
	const char *path = "/tmp/hearth-test-client-no-such-dir/hearth.sock";
	assert_int_equal(hearth_connect(&h, path, "test-client", &err), HEARTH_EIO);
	assert_null(h);
	assert_non_null(strstr(err.msg, path));
	assert_non_null(strstr(err.msg, "No such file"));
}

static void test_client_socket_path_comes_from_the_environment(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_welcome_only, NULL);
	fake_run(f);
	char *old = getenv(HEARTH_SOCKET_ENV) ? strdup(getenv(HEARTH_SOCKET_ENV)) : NULL;
	setenv(HEARTH_SOCKET_ENV, f->path, 1);
	assert_string_equal(hearth_socket_path_default(), f->path);
	struct hearth *h = NULL;
	struct hearth_err err = { 0 };
	int rc = hearth_connect(&h, NULL, "test-client", &err);
	if (old) {
		setenv(HEARTH_SOCKET_ENV, old, 1);
		free(old);
	} else {
		unsetenv(HEARTH_SOCKET_ENV);
		assert_string_equal(hearth_socket_path_default(), HEARTH_SOCKET_DEFAULT);
	}
	assert_int_equal(rc, 0);
	hearth_close(h);
	fake_stop(f);
}

/* ---- generate ---- */

static void script_stream_five(struct fake *f)
{
	FTRY(fake_handshake(f));
	struct msg m;
	FTRY(fake_expect(f, MSG_GENERATE, &m));
	const struct msg_generate *g = &m.u.generate;
	uint64_t id = m.id;
	f->ids[0] = id;
	bool ok = g->has_prompt && g->prompt.len == 5 && memcmp(g->prompt.ptr, "Hello", 5) == 0 &&
		  g->max_tokens == 5 && g->sampling.temperature == 0.0 && g->sampling.top_k == 1 &&
		  g->sampling.has_seed && g->sampling.seed == 42 && g->n_stop == 2 &&
		  g->stop[0].len == 2 && memcmp(g->stop[0].ptr, "\n\n", 2) == 0 &&
		  g->stop[1].len == 3 && memcmp(g->stop[1].ptr, "END", 3) == 0 &&
		  g->n_stop_tokens == 1 && g->stop_tokens[0] == 2 && g->logprobs &&
		  g->top_logprobs == 2 && !g->logits && !g->stream_socket && !g->ignore_eos;
	msg_free(&m);
	FCHECK(f, ok, "the generate frame does not carry the client's parameters");
	/* "é" split over two tokens, as byte tokens do. */
	static const char *const pieces[] = { "A", "B", "\xc3", "\xa9", "C" };
	for (uint32_t i = 0; i < 5; i++) {
		struct ring_top top[2] = { { 100 + i, -0.5f }, { 200 + i, -1.5f } };
		struct ring_token t = { .request_id = id, .token = 10 + i, .has_logprob = true,
					.logprob = -0.25f * (float)i,
					.text = (const uint8_t *)pieces[i],
					.text_len = strlen(pieces[i]), .top = top, .n_top = 2 };
		struct hearth_error e;
		FCHECK(f, ring_push_token(&f->ring, &t, &e) == 0, "push: %s", e.msg);
		ring_notify(&f->ring, NULL);
	}
	FTRY(fake_done(f, id, MSG_FINISH_LENGTH, 3, 5));
	fake_wait_close(f);
}

static void test_client_generate_streams_tokens_in_order_with_the_result(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_stream_five, NULL);
	fake_run(f);
	struct hearth *h = client_connect(f, 5000);
	struct hearth_gen_params p = hearth_gen_params_default();
	p.max_tokens = 5;
	p.temperature = 0;
	p.top_k = 1;
	p.has_seed = true;
	p.seed = 42;
	const char *stop[] = { "\n\n", "END" };
	p.stop = stop;
	p.n_stop = 2;
	uint32_t stop_tokens[] = { 2 };
	p.stop_tokens = stop_tokens;
	p.n_stop_tokens = 1;
	p.logprobs = true;
	p.top_logprobs = 2;
	struct seen s = { 0 };
	struct hearth_result res;
	struct hearth_err err = { 0 };
	struct hearth_prompt prompt = text_prompt("Hello");
	int rc = hearth_generate(h, &prompt, &p, collect, &s, &res, &err);
	if (rc)
		print_message("generate: %s\n", err.msg);
	assert_int_equal(rc, 0);
	assert_int_equal(s.n, 5);
	for (uint32_t i = 0; i < 5; i++) {
		assert_int_equal(s.tokens[i], 10 + i);
		assert_int_equal(s.index[i], i);
		assert_true(s.logprob[i] == -0.25f * (float)i);
		assert_int_equal(s.n_top[i], 2);
		assert_int_equal(s.top0[i].token, 100 + i);
		assert_true(s.top0[i].logprob == -0.5f);
		assert_int_equal(s.n_vocab[i], 0);
		assert_true(s.t_sampled[i] == 0);   /* the fake daemon stamped none */
	}
	assert_int_equal(s.len, 5);
	assert_string_equal(s.text, "AB\xc3\xa9" "C");
	assert_int_equal(res.finish, HEARTH_FINISH_LENGTH);
	assert_string_equal(hearth_finish_name(res.finish), "length");
	assert_int_equal(res.n_prompt, 3);
	assert_int_equal(res.n_gen, 5);
	assert_true(res.queue_ms == 1.5 && res.prefill_ms == 20.25 && res.decode_ms == 100.5);
	assert_true(res.prefill_tps == 148.0 && res.decode_tps == 39.75);
	hearth_close(h);
	fake_stop(f);
}

/* Tokens pushed without a doorbell, then `done` at once: only a client that drains the
 * ring before acting on `done` sees them all. */

/* The bench's two needs: ignore_eos reaches the daemon, and each token's sampling time
 * (the daemon's CLOCK_MONOTONIC) reaches the callback unchanged. */
static void script_stamped_tokens(struct fake *f)
{
	FTRY(fake_handshake(f));
	struct msg m;
	FTRY(fake_expect(f, MSG_GENERATE, &m));
	uint64_t id = m.id;
	bool ok = m.u.generate.ignore_eos && m.u.generate.max_tokens == 3;
	msg_free(&m);
	FCHECK(f, ok, "the generate frame lost ignore_eos");
	static const uint64_t stamps[3] = { 0x0123456789abcdefull, 1, UINT64_MAX };
	for (uint32_t i = 0; i < 3; i++) {
		struct ring_token t = { .request_id = id, .token = 7 + i,
					.t_sampled_ns = stamps[i],
					.text = (const uint8_t *)"x", .text_len = 1 };
		struct hearth_error e;
		FCHECK(f, ring_push_token(&f->ring, &t, &e) == 0, "push: %s", e.msg);
		ring_notify(&f->ring, NULL);
	}
	FTRY(fake_done(f, id, MSG_FINISH_LENGTH, 1, 3));
	fake_wait_close(f);
}

static void test_client_token_carries_the_daemon_sample_time_and_ignore_eos(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_stamped_tokens, NULL);
	fake_run(f);
	struct hearth *h = client_connect(f, 5000);
	struct hearth_gen_params p = hearth_gen_params_default();
	p.max_tokens = 3;
	p.ignore_eos = true;
	struct seen s = { 0 };
	struct hearth_err err = { 0 };
	struct hearth_prompt prompt = text_prompt("Hi");
	int rc = hearth_generate(h, &prompt, &p, collect, &s, NULL, &err);
	if (rc)
		print_message("generate: %s\n", err.msg);
	assert_int_equal(rc, 0);
	assert_int_equal(s.n, 3);
	assert_true(s.t_sampled[0] == 0x0123456789abcdefull);
	assert_true(s.t_sampled[1] == 1);
	assert_true(s.t_sampled[2] == UINT64_MAX);
	assert_int_equal(s.tokens[2], 9);
	hearth_close(h);
	fake_stop(f);
}

static void script_tokens_then_done_without_doorbell(struct fake *f)
{
	FTRY(fake_handshake(f));
	struct msg m;
	FTRY(fake_expect(f, MSG_GENERATE, &m));
	uint64_t id = m.id;
	msg_free(&m);
	char text[16];
	for (uint32_t i = 0; i < 100; i++) {
		snprintf(text, sizeof text, "%u,", i);
		FTRY(fake_push_token_ex(f, id, i, text, strlen(text), false));
	}
	FTRY(fake_done(f, id, MSG_FINISH_STOP, 1, 100));
	fake_wait_close(f);
}

static void test_client_drains_the_ring_before_acting_on_done(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_tokens_then_done_without_doorbell, NULL);
	fake_run(f);
	struct hearth *h = client_connect(f, 5000);
	struct seen *s = calloc(1, sizeof *s);
	struct hearth_result res;
	struct hearth_err err = { 0 };
	struct hearth_prompt prompt = text_prompt("x");
	assert_int_equal(hearth_generate(h, &prompt, NULL, collect, s, &res, &err), 0);
	assert_int_equal(s->n, 100);
	for (uint32_t i = 0; i < 100; i++)
		assert_int_equal(s->tokens[i], i);
	assert_int_equal(strncmp(s->text, "0,1,2,3,", 8), 0);
	assert_int_equal(res.finish, HEARTH_FINISH_STOP);
	free(s);
	hearth_close(h);
	fake_stop(f);
}

/* A ring much smaller than the generation: the fake blocks on a full ring until the
 * client pops and rings the daemon's doorbell. */
static void script_backpressure(struct fake *f)
{
	FTRY(fake_handshake(f));
	struct msg m;
	FTRY(fake_expect(f, MSG_GENERATE, &m));
	uint64_t id = m.id;
	msg_free(&m);
	char text[48];
	for (uint32_t i = 0; i < 400; i++) {
		snprintf(text, sizeof text, "[%03u-padding-padding-padding-padding]", i);
		FTRY(fake_push_token(f, id, i, text));
	}
	FTRY(fake_done(f, id, MSG_FINISH_LENGTH, 1, 400));
	fake_wait_close(f);
}

static void test_client_rings_the_doorbell_so_a_full_ring_drains(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_backpressure, NULL);
	f->d2c_cap = RING_CAP_MIN; /* about 50 of these records */
	fake_run(f);
	struct hearth *h = client_connect(f, 5000);
	struct seen *s = calloc(1, sizeof *s);
	struct hearth_result res;
	struct hearth_err err = { 0 };
	struct hearth_prompt prompt = text_prompt("x");
	int rc = hearth_generate(h, &prompt, NULL, collect, s, &res, &err);
	if (rc)
		print_message("generate: %s\n", err.msg);
	assert_int_equal(rc, 0);
	assert_int_equal(s->n, 400);
	for (uint32_t i = 0; i < 400; i++)
		if (i < 512)
			assert_int_equal(s->tokens[i], i);
	assert_int_equal(res.n_gen, 400);
	free(s);
	hearth_close(h);
	fake_stop(f);
}

static void script_logits(struct fake *f)
{
	FTRY(fake_handshake(f));
	struct msg m;
	FTRY(fake_expect(f, MSG_GENERATE, &m));
	uint64_t id = m.id;
	bool want = m.u.generate.logits;
	msg_free(&m);
	FCHECK(f, want, "generate without logits: true");
	for (uint32_t i = 0; i < 3; i++) {
		float row[8];
		for (int k = 0; k < 8; k++)
			row[k] = (float)(i * 10 + (uint32_t)k);
		struct hearth_error e;
		FCHECK(f, ring_push_logits(&f->ring, id, i, row, 8, &e) == 0, "%s", e.msg);
		FTRY(fake_push_token(f, id, 7 + i, "t"));
	}
	FTRY(fake_done(f, id, MSG_FINISH_STOP, 1, 3));
	fake_wait_close(f);
}

static void test_client_attaches_each_logits_row_to_its_token(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_logits, NULL);
	fake_run(f);
	struct hearth *h = client_connect(f, 5000);
	struct hearth_gen_params p = hearth_gen_params_default();
	p.logits = true;
	struct seen s = { 0 };
	struct hearth_err err = { 0 };
	struct hearth_prompt prompt = text_prompt("x");
	assert_int_equal(hearth_generate(h, &prompt, &p, collect, &s, NULL, &err), 0);
	assert_int_equal(s.n, 3);
	for (uint32_t i = 0; i < 3; i++) {
		assert_int_equal(s.tokens[i], 7 + i);
		assert_int_equal(s.n_vocab[i], 8);
		assert_true(s.logit_first[i] == (float)(i * 10));
	}
	hearth_close(h);
	fake_stop(f);
}

/* ---- the iterator ---- */

static void script_iterator(struct fake *f)
{
	FTRY(fake_handshake(f));
	struct msg m;
	FTRY(fake_expect(f, MSG_GENERATE, &m));
	uint64_t id = m.id;
	msg_free(&m);
	FTRY(fake_push_token(f, id, 1, "one"));
	FTRY(fake_wait_go(f));
	FTRY(fake_push_token(f, id, 2, "two"));
	FTRY(fake_done(f, id, MSG_FINISH_STOP, 4, 2));
	fake_wait_close(f);
}

static void test_client_iterator_yields_tokens_then_the_end_and_survives_a_timeout(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_iterator, NULL);
	fake_run(f);
	struct hearth *h = client_connect(f, 5000);
	struct hearth_gen *g;
	struct hearth_err err = { 0 };
	struct hearth_prompt prompt = text_prompt("count");
	assert_int_equal(hearth_gen_start(h, &prompt, NULL, &g, &err), 0);
	const struct hearth_token *t;
	assert_int_equal(hearth_gen_next(g, &t, -1, &err), 1);
	assert_int_equal(t->token, 1);
	assert_string_equal(t->text, "one");
	int64_t t0 = (int64_t)(hearth_now_ns() / 1000000);
	assert_int_equal(hearth_gen_next(g, &t, 100, &err), HEARTH_ETIMEDOUT);
	assert_int_equal(err.code, HEARTH_ETIMEDOUT);
	assert_null(t);
	int64_t waited = (int64_t)(hearth_now_ns() / 1000000) - t0;
	assert_true(waited >= 90 && waited < 2000);
	assert_int_equal(hearth_gen_next(g, &t, 0, &err), HEARTH_ETIMEDOUT);
	fake_go(f);
	assert_int_equal(hearth_gen_next(g, &t, -1, &err), 1);
	assert_int_equal(t->token, 2);
	assert_int_equal(t->index, 1);
	assert_string_equal(t->text, "two");
	assert_int_equal(hearth_gen_next(g, &t, -1, &err), 0);
	assert_int_equal(hearth_gen_next(g, &t, -1, &err), 0); /* stays ended */
	struct hearth_result res;
	assert_int_equal(hearth_gen_finish(g, &res, &err), 0);
	assert_int_equal(res.finish, HEARTH_FINISH_STOP);
	assert_int_equal(res.n_prompt, 4);
	assert_int_equal(res.n_gen, 2);
	hearth_close(h);
	fake_stop(f);
}

/* ---- cancel ---- */

/* Pushes n_before tokens, then expects a cancel naming the generate; answers it the way
 * hearthd does (done ok for the cancel, done cancel for the generation). */
static void script_cancel(struct fake *f)
{
	int n_before = f->arg ? *(int *)f->arg : 1;
	FTRY(fake_handshake(f));
	struct msg m;
	FTRY(fake_expect(f, MSG_GENERATE, &m));
	uint64_t id = m.id;
	msg_free(&m);
	for (int i = 0; i < n_before; i++)
		FTRY(fake_push_token(f, id, (uint32_t)i, "tok"));
	FTRY(fake_expect(f, MSG_CANCEL, &m));
	uint64_t cancel_id = m.id, target = m.u.cancel.target;
	msg_free(&m);
	FCHECK(f, target == id, "cancel names %llu, the generate was %llu",
	       (unsigned long long)target, (unsigned long long)id);
	FCHECK(f, cancel_id != id, "cancel reuses the generate's id");
	FTRY(fake_done(f, cancel_id, MSG_FINISH_OK, 0, 0));
	FTRY(fake_done(f, id, MSG_FINISH_CANCEL, 2, (uint32_t)n_before));
	fake_wait_close(f);
}

static void test_client_cancel_names_the_generation_and_ends_it(void **state)
{
	(void)state;
	int n_before = 1;
	struct fake *f = fake_start(script_cancel, &n_before);
	fake_run(f);
	struct hearth *h = client_connect(f, 5000);
	struct hearth_gen *g;
	struct hearth_err err = { 0 };
	struct hearth_prompt prompt = text_prompt("a long story");
	assert_int_equal(hearth_gen_start(h, &prompt, NULL, &g, &err), 0);
	const struct hearth_token *t;
	assert_int_equal(hearth_gen_next(g, &t, -1, &err), 1);
	assert_int_equal(hearth_cancel(g, &err), 0);
	assert_int_equal(hearth_cancel(g, &err), 0); /* once is enough: no second frame */
	assert_int_equal(hearth_gen_next(g, &t, -1, &err), 0);
	struct hearth_result res;
	assert_int_equal(hearth_gen_finish(g, &res, &err), 0);
	assert_int_equal(res.finish, HEARTH_FINISH_CANCEL);
	assert_int_equal(res.n_gen, 1);
	hearth_close(h);
	fake_stop(f);
}

static void test_client_callback_returning_nonzero_cancels(void **state)
{
	(void)state;
	int n_before = 3;
	struct fake *f = fake_start(script_cancel, &n_before);
	fake_run(f);
	struct hearth *h = client_connect(f, 5000);
	struct seen s = { .stop_after = 1 };
	struct hearth_result res;
	struct hearth_err err = { 0 };
	struct hearth_prompt prompt = text_prompt("a long story");
	assert_int_equal(hearth_generate(h, &prompt, NULL, collect, &s, &res, &err), 0);
	assert_int_equal(s.n, 1); /* the two tokens already on their way are not delivered */
	assert_int_equal(res.finish, HEARTH_FINISH_CANCEL);
	hearth_close(h);
	fake_stop(f);
}

static void test_client_finish_before_the_end_cancels_and_discards(void **state)
{
	(void)state;
	int n_before = 2;
	struct fake *f = fake_start(script_cancel, &n_before);
	fake_run(f);
	struct hearth *h = client_connect(f, 5000);
	struct hearth_gen *g;
	struct hearth_err err = { 0 };
	struct hearth_prompt prompt = text_prompt("a long story");
	assert_int_equal(hearth_gen_start(h, &prompt, NULL, &g, &err), 0);
	struct hearth_result res;
	assert_int_equal(hearth_gen_finish(g, &res, &err), 0);
	assert_int_equal(res.finish, HEARTH_FINISH_CANCEL);
	hearth_close(h);
	fake_stop(f);
}

/* ---- errors ---- */

static void script_errors(struct fake *f)
{
	FTRY(fake_handshake(f));
	struct msg m;
	FTRY(fake_expect(f, MSG_GENERATE, &m));
	uint64_t id = m.id;
	msg_free(&m);
	FTRY(fake_send_error(f, id, MSG_ERR_KV_FULL, false,
			     "the request needs 300 MiB of KV cache, 200 MiB are free"));
	FTRY(fake_expect(f, MSG_TOKENIZE, &m));
	id = m.id;
	msg_free(&m);
	FTRY(fake_send_error(f, id, MSG_ERR_BAD_TOKEN, false, "tokens[0] = 99999 is beyond"));
	FTRY(fake_expect(f, MSG_DETOKENIZE, &m));
	id = m.id;
	msg_free(&m);
	FTRY(fake_send_error(f, id, MSG_ERR_CONTEXT, false, "too long"));
	FTRY(fake_expect(f, MSG_PING, &m));
	id = m.id;
	msg_free(&m);
	struct msg p;
	msg_init(&p, MSG_PONG, id);
	FTRY(fake_send(f, &p));
	fake_wait_close(f);
}

static void test_client_error_frames_become_hearth_errors_and_the_connection_lives(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_errors, NULL);
	fake_run(f);
	struct hearth *h = client_connect(f, 5000);
	struct seen s = { 0 };
	struct hearth_err err = { 0 };
	struct hearth_prompt prompt = text_prompt("x");
	assert_int_equal(hearth_generate(h, &prompt, NULL, collect, &s, NULL, &err), HEARTH_EKVFULL);
	assert_int_equal(err.code, HEARTH_EKVFULL);
	assert_non_null(strstr(err.msg, "kv_full"));
	assert_non_null(strstr(err.msg, "300 MiB of KV cache"));
	assert_int_equal(s.n, 0);
	uint32_t *ids = NULL;
	size_t n = 0;
	assert_int_equal(hearth_tokenize(h, "x", 1, 0, &ids, &n, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "bad_token"));
	assert_null(ids);
	char *text = NULL;
	uint32_t one = 1;
	assert_int_equal(hearth_detokenize(h, &one, 1, &text, NULL, &err), HEARTH_ERANGE);
	assert_non_null(strstr(err.msg, "context: too long"));
	assert_int_equal(hearth_ping(h, NULL, &err), 0);
	hearth_close(h);
	fake_stop(f);
}

static void script_fatal(struct fake *f)
{
	FTRY(fake_handshake(f));
	struct msg m;
	FTRY(fake_expect(f, MSG_GENERATE, &m));
	msg_free(&m);
	FTRY(fake_send_error(f, 0, MSG_ERR_SHUTTING_DOWN, true, "hearthd is stopping"));
	/* and the daemon closes the connection (fake_main does) */
}

static void test_client_fatal_error_fails_the_generation_and_later_calls(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_fatal, NULL);
	fake_run(f);
	struct hearth *h = client_connect(f, 5000);
	struct hearth_err err = { 0 };
	struct hearth_prompt prompt = text_prompt("x");
	assert_int_equal(hearth_generate(h, &prompt, NULL, NULL, NULL, NULL, &err),
			 HEARTH_ESHUTDOWN);
	assert_non_null(strstr(err.msg, "hearthd is stopping"));
	int64_t t0 = (int64_t)(hearth_now_ns() / 1000000);
	assert_int_equal(hearth_ping(h, NULL, &err), HEARTH_ESHUTDOWN);
	assert_true((int64_t)(hearth_now_ns() / 1000000) - t0 < 1000);
	hearth_close(h);
	fake_stop(f);
}

static void script_die_mid_generation(struct fake *f)
{
	FTRY(fake_handshake(f));
	struct msg m;
	FTRY(fake_expect(f, MSG_GENERATE, &m));
	uint64_t id = m.id;
	msg_free(&m);
	FTRY(fake_push_token(f, id, 1, "a"));
	FTRY(fake_push_token(f, id, 2, "b"));
	/* The daemon dies: the kernel closes its end of the socket. */
}

static void test_client_daemon_death_mid_generation_fails_fast(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_die_mid_generation, NULL);
	fake_run(f);
	struct hearth *h = client_connect(f, 60000); /* the idle timeout must not be needed */
	struct seen s = { 0 };
	struct hearth_err err = { 0 };
	struct hearth_prompt prompt = text_prompt("x");
	int64_t t0 = (int64_t)(hearth_now_ns() / 1000000);
	assert_int_equal(hearth_generate(h, &prompt, NULL, collect, &s, NULL, &err),
			 HEARTH_ECLOSED);
	assert_true((int64_t)(hearth_now_ns() / 1000000) - t0 < 3000);
	assert_int_equal(s.n, 2);
	assert_string_equal(s.text, "ab");
	assert_non_null(strstr(err.msg, "closed"));
	assert_int_equal(hearth_ping(h, NULL, &err), HEARTH_ECLOSED);
	hearth_close(h);
	fake_stop(f);
}

static void script_hang(struct fake *f)
{
	FTRY(fake_handshake(f));
	struct msg m;
	FTRY(fake_expect(f, MSG_PING, &m));
	msg_free(&m);
	FTRY(fake_expect(f, MSG_GENERATE, &m));
	msg_free(&m);
	/* Never answers either. The client may cancel the abandoned generation (without
	 * waiting for an answer); then it hangs up. */
	for (;;) {
		int rc = fake_recv(f, &m);
		FTRY(rc);
		if (rc == 1)
			break;
		enum msg_type t = m.type;
		msg_free(&m);
		FCHECK(f, t == MSG_CANCEL, "unexpected %s", msg_type_name(t));
	}
}

static void test_client_hung_daemon_hits_the_idle_timeout(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_hang, NULL);
	fake_run(f);
	struct hearth *h = client_connect(f, 200);
	struct hearth_err err = { 0 };
	int64_t t0 = (int64_t)(hearth_now_ns() / 1000000);
	assert_int_equal(hearth_ping(h, NULL, &err), HEARTH_ETIMEDOUT);
	int64_t waited = (int64_t)(hearth_now_ns() / 1000000) - t0;
	assert_true(waited >= 190 && waited < 2000);
	assert_non_null(strstr(err.msg, "200 ms"));
	struct hearth_prompt prompt = text_prompt("x");
	t0 = (int64_t)(hearth_now_ns() / 1000000);
	assert_int_equal(hearth_generate(h, &prompt, NULL, NULL, NULL, NULL, &err),
			 HEARTH_ETIMEDOUT);
	/* One idle timeout, not a second one spent waiting for the cancel's answer. */
	assert_true((int64_t)(hearth_now_ns() / 1000000) - t0 < 1000);
	hearth_close(h);
	fake_stop(f);
}

/* ---- bulk prompts through the ring ---- */

static void fill_pattern(char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (char)('a' + (i * 7 + i / 26) % 26);
}

#define BULK_LEN ((size_t)950 * 1024)
#define BULK_TOKENS (MSG_ARRAY_MAX + 1000u)

static int fake_take_bulk(struct fake *f, uint32_t want_type, uint64_t ref, size_t want_len)
{
	size_t cap = (size_t)f->ring.rx.cap; /* ring_max_payload is the tx lane's */
	uint8_t *buf = malloc(cap);
	char *expect = malloc(want_len);
	if (!buf || !expect) {
		free(buf);
		free(expect);
		return fake_failf(f, __LINE__, "out of memory");
	}
	uint32_t type;
	size_t len;
	struct hearth_error e;
	int rc = ring_pop(&f->ring, &type, buf, cap, &len, &e);
	uint64_t got_ref = 0;
	const void *data = NULL;
	size_t n = 0;
	if (rc == 1)
		rc = ring_bulk_decode(type, buf, len, &got_ref, &data, &n, &e) == 0 ? 1 : -1;
	fill_pattern(expect, want_len);
	bool ok = rc == 1 && type == want_type && got_ref == ref && n == want_len &&
		  memcmp(data, expect, n) == 0;
	free(buf);
	free(expect);
	if (!ok)
		return fake_failf(f, __LINE__, "bulk record: rc %d type %u ref %llu (want %llu), "
				  "%zu bytes (want %zu) or wrong contents", rc, type,
				  (unsigned long long)got_ref, (unsigned long long)ref, n, want_len);
	ring_notify(&f->ring, NULL);
	return 0;
}

static void script_bulk(struct fake *f)
{
	FTRY(fake_handshake(f));
	struct msg m;
	/* 1: a large text prompt comes by reference */
	FTRY(fake_expect(f, MSG_GENERATE, &m));
	uint64_t id = m.id;
	bool by_ref = m.u.generate.has_prompt_ref && !m.u.generate.has_prompt &&
		      m.u.generate.prompt_ref == id;
	msg_free(&m);
	FCHECK(f, by_ref, "a %zu-byte prompt did not come as prompt_ref = the request id",
	       BULK_LEN);
	FTRY(fake_take_bulk(f, RING_REC_BULK_TEXT, id, BULK_LEN));
	FTRY(fake_done(f, id, MSG_FINISH_LENGTH, 100000, 0));
	/* 2: a small one stays in the frame */
	FTRY(fake_expect(f, MSG_GENERATE, &m));
	id = m.id;
	bool inline_ok = m.u.generate.has_prompt && !m.u.generate.has_prompt_ref &&
			 m.u.generate.prompt.len == 5;
	msg_free(&m);
	FCHECK(f, inline_ok, "a small prompt did not travel in the frame");
	FCHECK(f, ring_rx_pending(&f->ring) == 0, "a small prompt left a ring record");
	FTRY(fake_done(f, id, MSG_FINISH_LENGTH, 2, 0));
	/* 3: a large tokenize text, also by reference */
	FTRY(fake_expect(f, MSG_TOKENIZE, &m));
	id = m.id;
	by_ref = m.u.tokenize.has_text_ref && m.u.tokenize.text_ref == id && !m.u.tokenize.has_text;
	msg_free(&m);
	FCHECK(f, by_ref, "a large tokenize text did not come as text_ref");
	FTRY(fake_take_bulk(f, RING_REC_BULK_TEXT, id, BULK_LEN));
	struct msg r;
	msg_init(&r, MSG_TOKENS, id);
	uint32_t toks[3] = { 5, 6, 7 };
	r.u.tokens.tokens = toks;
	r.u.tokens.n_tokens = 3;
	FTRY(fake_send(f, &r));
	/* 4: token ids: a few in the frame, more than a frame's array by reference */
	FTRY(fake_expect(f, MSG_GENERATE, &m));
	id = m.id;
	inline_ok = m.u.generate.tokens && m.u.generate.n_tokens == 3 &&
		    m.u.generate.tokens[0] == 1 && m.u.generate.tokens[2] == 70000;
	msg_free(&m);
	FCHECK(f, inline_ok, "three prompt tokens did not travel in the frame");
	FTRY(fake_done(f, id, MSG_FINISH_LENGTH, 3, 0));
	FTRY(fake_expect(f, MSG_GENERATE, &m));
	id = m.id;
	by_ref = m.u.generate.has_prompt_ref && m.u.generate.prompt_ref == id &&
		 !m.u.generate.tokens;
	msg_free(&m);
	FCHECK(f, by_ref, "%u prompt tokens did not come as prompt_ref", BULK_TOKENS);
	{
		uint8_t *buf = malloc(f->ring.rx.cap);
		FCHECK(f, buf, "out of memory");
		uint32_t type;
		size_t len, n;
		uint64_t ref = 0;
		const void *data = NULL;
		struct hearth_error e;
		int rc = ring_pop(&f->ring, &type, buf, f->ring.rx.cap, &len, &e);
		if (rc == 1)
			rc = ring_bulk_decode(type, buf, len, &ref, &data, &n, &e) == 0 ? 1 : -1;
		bool ok = rc == 1 && type == RING_REC_BULK_TOKENS && ref == id &&
			  n == BULK_TOKENS * sizeof(uint32_t);
		for (size_t i = 0; ok && i < BULK_TOKENS; i++) {
			uint32_t t;
			memcpy(&t, (const uint8_t *)data + 4 * i, 4);
			ok = t == (uint32_t)(i * 31 % 50000);
		}
		free(buf);
		FCHECK(f, ok, "the bulk token record is wrong (rc %d, type %u, %zu bytes)", rc, type,
		       n);
	}
	FTRY(fake_done(f, id, MSG_FINISH_LENGTH, BULK_TOKENS, 0));
	/* 5: the too-large prompt never reached us; the next frame is the ping */
	FTRY(fake_expect(f, MSG_PING, &m));
	id = m.id;
	msg_free(&m);
	FCHECK(f, ring_rx_pending(&f->ring) == 0, "a refused prompt left a ring record");
	msg_init(&r, MSG_PONG, id);
	FTRY(fake_send(f, &r));
	fake_wait_close(f);
}

static void test_client_large_prompts_go_through_the_ring(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_bulk, NULL);
	f->c2d_cap = 2u << 20;
	fake_run(f);
	struct hearth *h = client_connect(f, 5000);
	size_t big_len = 3u << 20;
	char *big = malloc(big_len);
	assert_non_null(big);
	fill_pattern(big, big_len);
	struct hearth_err err = { 0 };
	struct hearth_result res;
	struct hearth_prompt prompt = { .text = big, .len = BULK_LEN };
	int rc = hearth_generate(h, &prompt, NULL, NULL, NULL, &res, &err);
	if (rc)
		print_message("generate: %s (%s)\n", err.msg, f->fail);
	assert_int_equal(rc, 0);
	assert_int_equal(res.n_prompt, 100000);
	prompt.len = 5;
	assert_int_equal(hearth_generate(h, &prompt, NULL, NULL, NULL, &res, &err), 0);
	uint32_t *ids;
	size_t n;
	assert_int_equal(hearth_tokenize(h, big, BULK_LEN, 0, &ids, &n, &err), 0);
	assert_int_equal(n, 3);
	assert_int_equal(ids[0], 5);
	assert_int_equal(ids[2], 7);
	hearth_free(ids);
	uint32_t few[3] = { 1, 2, 70000 };
	struct hearth_prompt tp = { .tokens = few, .n_tokens = 3 };
	assert_int_equal(hearth_generate(h, &tp, NULL, NULL, NULL, &res, &err), 0);
	uint32_t *many = malloc(BULK_TOKENS * sizeof *many);
	assert_non_null(many);
	for (size_t i = 0; i < BULK_TOKENS; i++)
		many[i] = (uint32_t)(i * 31 % 50000);
	tp = (struct hearth_prompt){ .tokens = many, .n_tokens = BULK_TOKENS };
	rc = hearth_generate(h, &tp, NULL, NULL, NULL, &res, &err);
	if (rc)
		print_message("generate: %s (%s)\n", err.msg, f->fail);
	assert_int_equal(rc, 0);
	assert_int_equal(res.n_prompt, BULK_TOKENS);
	free(many);
	prompt.len = big_len; /* beyond the 2 MiB ring */
	assert_int_equal(hearth_generate(h, &prompt, NULL, NULL, NULL, &res, &err), HEARTH_ERANGE);
	assert_non_null(strstr(err.msg, "ring"));
	assert_int_equal(hearth_ping(h, NULL, &err), 0);
	free(big);
	hearth_close(h);
	fake_stop(f);
}

static void test_client_refuses_invalid_prompts_before_sending(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_welcome_only, NULL);
	fake_run(f);
	struct hearth *h = client_connect(f, 5000);
	struct hearth_err err = { 0 };
	struct hearth_gen *g = NULL;
	struct hearth_prompt bad_utf8 = { .text = "\xff\xfe", .len = 2 };
	assert_int_equal(hearth_gen_start(h, &bad_utf8, NULL, &g, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "UTF-8"));
	uint32_t ids[1] = { 1 };
	struct hearth_prompt both = { .text = "x", .len = 1, .tokens = ids, .n_tokens = 1 };
	assert_int_equal(hearth_gen_start(h, &both, NULL, &g, &err), HEARTH_EINVAL);
	struct hearth_gen_params p = hearth_gen_params_default();
	p.top_p = 0; /* out of (0, 1]: msg_encode refuses what the daemon would */
	struct hearth_prompt ok = text_prompt("x");
	assert_int_equal(hearth_gen_start(h, &ok, &p, &g, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "top_p"));
	assert_null(g);
	hearth_close(h);
	fake_stop(f);
}

/* ---- two threads, one connection ---- */

#define INTERLEAVED 60

static void script_two_generations(struct fake *f)
{
	FTRY(fake_handshake(f));
	struct msg m;
	uint64_t id[2];
	for (int k = 0; k < 2; k++) {
		FTRY(fake_expect(f, MSG_GENERATE, &m));
		bool first = m.u.generate.prompt.len == 5 && memcmp(m.u.generate.prompt.ptr, "first", 5) == 0;
		id[first ? 0 : 1] = m.id;
		msg_free(&m);
	}
	FCHECK(f, id[0] != id[1], "two generations with one id");
	char text[32];
	for (uint32_t i = 0; i < INTERLEAVED; i++) {
		for (int k = 0; k < 2; k++) {
			snprintf(text, sizeof text, "%c%u ", k ? 'b' : 'a', i);
			FTRY(fake_push_token(f, id[k], (uint32_t)(k + 1) * 1000 + i, text));
		}
		if (i % 16 == 0) {
			struct timespec ts = { 0, 2000000 };
			nanosleep(&ts, NULL);
		}
	}
	FTRY(fake_done(f, id[1], MSG_FINISH_LENGTH, 1, INTERLEAVED));
	FTRY(fake_done(f, id[0], MSG_FINISH_STOP, 1, INTERLEAVED));
	fake_wait_close(f);
}

struct worker {
	struct hearth *h;
	const char *prompt;
	struct seen s;
	struct hearth_result res;
	int rc;
	struct hearth_err err;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct hearth_prompt p = text_prompt(w->prompt);
	w->rc = hearth_generate(w->h, &p, NULL, collect, &w->s, &w->res, &w->err);
	return NULL;
}

static void test_client_two_threads_generate_at_once_on_one_connection(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_two_generations, NULL);
	fake_run(f);
	struct hearth *h = client_connect(f, 5000);
	struct worker *w = calloc(2, sizeof *w);
	assert_non_null(w);
	w[0].h = w[1].h = h;
	w[0].prompt = "first";
	w[1].prompt = "second";
	pthread_t thr[2];
	for (int k = 0; k < 2; k++)
		assert_int_equal(pthread_create(&thr[k], NULL, worker_main, &w[k]), 0);
	for (int k = 0; k < 2; k++)
		pthread_join(thr[k], NULL);
	for (int k = 0; k < 2; k++) {
		if (w[k].rc)
			print_message("worker %d: %s\n", k, w[k].err.msg);
		assert_int_equal(w[k].rc, 0);
		assert_int_equal(w[k].s.n, INTERLEAVED);
		for (uint32_t i = 0; i < INTERLEAVED; i++) {
			assert_int_equal(w[k].s.tokens[i], (uint32_t)(k + 1) * 1000 + i);
			assert_int_equal(w[k].s.index[i], i);
		}
		assert_int_equal(w[k].s.text[0], k ? 'b' : 'a');
		assert_null(strchr(w[k].s.text, k ? 'a' : 'b'));
	}
	assert_int_equal(w[0].res.finish, HEARTH_FINISH_STOP);
	assert_int_equal(w[1].res.finish, HEARTH_FINISH_LENGTH);
	free(w);
	hearth_close(h);
	fake_stop(f);
}

/* ---- the other requests ---- */

static void script_requests(struct fake *f)
{
	FTRY(fake_handshake(f));
	struct msg m, r;
	FTRY(fake_expect(f, MSG_TOKENIZE, &m));
	bool ok = m.u.tokenize.has_text && m.u.tokenize.text.len == 11 &&
		  memcmp(m.u.tokenize.text.ptr, "hello world", 11) == 0 && !m.u.tokenize.add_bos &&
		  m.u.tokenize.special;
	msg_init(&r, MSG_TOKENS, m.id);
	msg_free(&m);
	FCHECK(f, ok, "tokenize frame does not match the call");
	uint32_t toks[2] = { 15043, 3186 };
	r.u.tokens.tokens = toks;
	r.u.tokens.n_tokens = 2;
	FTRY(fake_send(f, &r));

	FTRY(fake_expect(f, MSG_DETOKENIZE, &m));
	ok = m.u.detokenize.n_tokens == 3 && m.u.detokenize.tokens[0] == 1 &&
	     m.u.detokenize.tokens[2] == 3;
	msg_init(&r, MSG_TEXT, m.id);
	msg_free(&m);
	FCHECK(f, ok, "detokenize frame does not match the call");
	r.u.text.text = (struct msg_bytes){ "a\0b\xe2\x82", 5 }; /* NUL and a cut-off char */
	FTRY(fake_send(f, &r));

	FTRY(fake_expect(f, MSG_STATS, &m));
	msg_init(&r, MSG_STATS_REPLY, m.id);
	msg_free(&m);
	r.u.stats = (struct msg_stats_reply){ .uptime_ms = 3723000, .clients = 3, .running = 2,
					      .queued = 1, .prompt_tokens = 1000, .gen_tokens = 2000,
					      .kv_used = 1 << 20, .kv_total = 64 << 20,
					      .rss = 900 << 20, .has_draft_kv = true,
					      .draft_kv_used = 3 << 20, .draft_kv_total = 16 << 20 };
	FTRY(fake_send(f, &r));

	FTRY(fake_expect(f, MSG_LEDGER, &m));
	msg_init(&r, MSG_LEDGER_REPLY, m.id);
	msg_free(&m);
	struct msg_ledger_entry e[2] = { { { "weights", 7 }, 700u << 20 },
					 { { "kv_pool", 7 }, 64u << 20 } };
	r.u.ledger.entries = e;
	r.u.ledger.n_entries = 2;
	r.u.ledger.total = 764u << 20;
	r.u.ledger.peak = 800u << 20;
	FTRY(fake_send(f, &r));

	FTRY(fake_expect(f, MSG_PING, &m));
	msg_init(&r, MSG_PONG, m.id);
	msg_free(&m);
	FTRY(fake_send(f, &r));
	fake_wait_close(f);
}

static void test_client_tokenize_detokenize_stats_ledger_ping_round_trip(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_requests, NULL);
	fake_run(f);
	struct hearth *h = client_connect(f, 5000);
	struct hearth_err err = { 0 };
	uint32_t *ids;
	size_t n;
	assert_int_equal(hearth_tokenize(h, "hello world", 11,
					 HEARTH_TOKENIZE_NO_BOS | HEARTH_TOKENIZE_SPECIAL, &ids, &n,
					 &err), 0);
	assert_int_equal(n, 2);
	assert_int_equal(ids[0], 15043);
	assert_int_equal(ids[1], 3186);
	hearth_free(ids);
	uint32_t in[3] = { 1, 2, 3 };
	char *text;
	size_t len;
	assert_int_equal(hearth_detokenize(h, in, 3, &text, &len, &err), 0);
	assert_int_equal(len, 5);
	assert_memory_equal(text, "a\0b\xe2\x82", 5);
	assert_int_equal(text[5], '\0');
	hearth_free(text);
	struct hearth_stats st;
	assert_int_equal(hearth_stats(h, &st, &err), 0);
	assert_int_equal(st.uptime_ms, 3723000);
	assert_int_equal(st.clients, 3);
	assert_int_equal(st.running, 2);
	assert_int_equal(st.queued, 1);
	assert_int_equal(st.prompt_tokens, 1000);
	assert_int_equal(st.gen_tokens, 2000);
	assert_int_equal(st.kv_used, 1 << 20);
	assert_int_equal(st.kv_total, 64 << 20);
	assert_int_equal(st.rss, 900 << 20);
	assert_int_equal(st.draft_kv_used, 3 << 20);
	assert_int_equal(st.draft_kv_total, 16 << 20);
	struct hearth_ledger *l = malloc(sizeof *l);
	assert_non_null(l);
	assert_int_equal(hearth_ledger(h, l, &err), 0);
	assert_int_equal(l->n_entries, 2);
	assert_string_equal(l->entries[0].name, "weights");
	assert_int_equal(l->entries[0].bytes, 700u << 20);
	assert_string_equal(l->entries[1].name, "kv_pool");
	assert_int_equal(l->total, 764u << 20);
	assert_int_equal(l->peak, 800u << 20);
	free(l);
	uint64_t rtt = 0;
	assert_int_equal(hearth_ping(h, &rtt, &err), 0);
	assert_true(rtt > 0 && rtt < 5000000);
	hearth_close(h);
	fake_stop(f);
}

static void script_no_hello(struct fake *f)
{
	struct msg m, r;
	FTRY(fake_expect(f, MSG_PING, &m)); /* first frame: no hello */
	msg_init(&r, MSG_PONG, m.id);
	msg_free(&m);
	FTRY(fake_send(f, &r));
	fake_wait_close(f);
}

static void test_client_no_hello_connection_pings_but_cannot_generate(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_no_hello, NULL);
	fake_run(f);
	struct hearth_connect_opts o = { .socket_path = f->path, .timeout_ms = 5000,
					 .no_hello = true };
	struct hearth *h;
	struct hearth_err err = { 0 };
	assert_int_equal(hearth_connect_with(&h, &o, &err), 0);
	assert_int_equal(hearth_ping(h, NULL, &err), 0);
	struct hearth_model mi;
	assert_int_equal(hearth_model_info(h, &mi, &err), HEARTH_EINVAL);
	struct hearth_gen *g;
	struct hearth_prompt p = text_prompt("x");
	assert_int_equal(hearth_gen_start(h, &p, NULL, &g, &err), HEARTH_EINVAL);
	hearth_close(h);
	fake_stop(f);
}

/* ---- the CLI against the fake daemon ---- */

static void script_cli_generate(struct fake *f)
{
	FTRY(fake_handshake(f));
	struct msg m;
	FTRY(fake_expect(f, MSG_GENERATE, &m));
	uint64_t id = m.id;
	bool ok = m.u.generate.has_prompt && m.u.generate.prompt.len == 2 &&
		  memcmp(m.u.generate.prompt.ptr, "Hi", 2) == 0 && m.u.generate.max_tokens == 3 &&
		  m.u.generate.sampling.temperature == 0 && m.u.generate.sampling.has_seed &&
		  m.u.generate.sampling.seed == 7 && m.u.generate.n_stop == 1;
	msg_free(&m);
	FCHECK(f, ok, "the CLI's generate frame does not match its options");
	FTRY(fake_push_token(f, id, 1, "Hel"));
	FTRY(fake_push_token(f, id, 2, "lo!"));
	FTRY(fake_done(f, id, MSG_FINISH_LENGTH, 2, 2));
	fake_wait_close(f);
}

/* Runs the built `hearth` with HEARTH_SOCKET pointing at the fake; returns its exit code
 * and its stdout in out. */
static int run_cli(struct fake *f, const char *args, char *out, size_t cap)
{
	const char *builddir = getenv("HEARTH_BUILDDIR");
	if (!builddir)
		fail_msg("HEARTH_BUILDDIR is not set: run through `make check`, or set it to the "
			 "build directory holding ./hearth");
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "HEARTH_SOCKET='%s' '%s/hearth' %s 2>/dev/null",
		 f ? f->path : "/nonexistent", builddir, args);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	size_t n = fread(out, 1, cap - 1, p);
	out[n] = '\0';
	int st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli_generate_streams_text_and_exits_zero(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_cli_generate, NULL);
	fake_run(f);
	char out[256];
	int rc = run_cli(f, "generate -n 3 --temp 0 --seed 7 --stop '\n' Hi", out, sizeof out);
	fake_stop(f);
	assert_int_equal(rc, 0);
	assert_string_equal(out, "Hello!\n");
}

static void test_cli_generate_json_reads_the_prompt_from_stdin(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_cli_generate, NULL);
	fake_run(f);
	char file[200], args[400], out[1024];
	snprintf(file, sizeof file, "%s/prompt.txt", f->dir);
	FILE *pf = fopen(file, "w");
	assert_non_null(pf);
	fputs("Hi", pf);
	fclose(pf);
	snprintf(args, sizeof args, "generate --json -n 3 --temp 0 --seed 7 --stop x - < '%s'",
		 file);
	int rc = run_cli(f, args, out, sizeof out);
	unlink(file);
	fake_stop(f);
	assert_int_equal(rc, 0);
	assert_string_equal(out,
			    "{\"index\":0,\"token\":1,\"text\":\"Hel\"}\n"
			    "{\"index\":1,\"token\":2,\"text\":\"lo!\"}\n"
			    "{\"finish\":\"length\",\"n_prompt\":2,\"n_gen\":2,\"queue_ms\":1.500,"
			    "\"prefill_ms\":20.250,\"decode_ms\":100.500,\"prefill_tps\":148.00,"
			    "\"decode_tps\":39.75,\"n_forced\":0,\"text\":\"Hello!\"}\n");
}

static void script_cli_interrupted(struct fake *f)
{
	FTRY(fake_handshake(f));
	struct msg m;
	FTRY(fake_expect(f, MSG_GENERATE, &m));
	uint64_t id = m.id;
	msg_free(&m);
	FTRY(fake_push_token(f, id, 1, "partial"));
	FTRY(fake_expect(f, MSG_CANCEL, &m)); /* the ^C */
	uint64_t cancel_id = m.id, target = m.u.cancel.target;
	msg_free(&m);
	FCHECK(f, target == id, "the CLI canceled %llu, not its generation",
	       (unsigned long long)target);
	FTRY(fake_done(f, cancel_id, MSG_FINISH_OK, 0, 0));
	FTRY(fake_done(f, id, MSG_FINISH_CANCEL, 2, 1));
	fake_wait_close(f);
}

static void test_cli_interrupt_cancels_the_generation(void **state)
{
	(void)state;
	const char *builddir = getenv("HEARTH_BUILDDIR");
	if (!builddir)
		fail_msg("HEARTH_BUILDDIR is not set: run through `make check`");
	struct fake *f = fake_start(script_cli_interrupted, NULL);
	fake_run(f);
	char exe[512];
	snprintf(exe, sizeof exe, "%s/hearth", builddir);
	int out[2];
	assert_int_equal(pipe(out), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(out[1], 1);
		int devnull = open("/dev/null", O_WRONLY);
		dup2(devnull, 2);
		close(out[0]);
		execl(exe, "hearth", "--socket", f->path, "generate", "tell me everything",
		      (char *)NULL);
		_exit(127);
	}
	close(out[1]);
	char buf[256];
	size_t n = 0;
	while (n < 7) {
		struct pollfd pf = { .fd = out[0], .events = POLLIN };
		if (poll(&pf, 1, FAKE_WAIT_MS) != 1)
			break;
		ssize_t got = read(out[0], buf + n, sizeof buf - 1 - n);
		if (got <= 0)
			break;
		n += (size_t)got;
	}
	kill(pid, SIGINT);
	for (;;) {
		ssize_t got = read(out[0], buf + n, sizeof buf - 1 - n);
		if (got <= 0)
			break;
		n += (size_t)got;
	}
	buf[n] = '\0';
	close(out[0]);
	int st;
	waitpid(pid, &st, 0);
	fake_stop(f);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	assert_string_equal(buf, "partial\n");
}

/* Answers one stats or ledger request per connection, with fixed numbers. */
static void script_cli_reports(struct fake *f)
{
	FTRY(fake_handshake(f));
	struct msg m, r;
	FTRY(fake_recv(f, &m));
	if (m.type == MSG_STATS) {
		msg_init(&r, MSG_STATS_REPLY, m.id);
		r.u.stats = (struct msg_stats_reply){ .uptime_ms = 3723000, .clients = 3,
						      .running = 2, .queued = 1,
						      .prompt_tokens = 1000, .gen_tokens = 2000,
						      .kv_used = 1 << 20, .kv_total = 64 << 20,
						      .rss = 900 << 20 };
		msg_free(&m);
		FTRY(fake_send(f, &r));
	} else if (m.type == MSG_LEDGER) {
		msg_init(&r, MSG_LEDGER_REPLY, m.id);
		msg_free(&m);
		struct msg_ledger_entry e[2] = { { { "weights", 7 }, 700u << 20 },
						 { { "kv_pool", 7 }, 64u << 20 } };
		r.u.ledger.entries = e;
		r.u.ledger.n_entries = 2;
		r.u.ledger.total = 764u << 20;
		r.u.ledger.peak = 800u << 20;
		FTRY(fake_send(f, &r));
	} else {
		fake_failf(f, __LINE__, "unexpected %s", msg_type_name(m.type));
		msg_free(&m);
		return;
	}
	fake_wait_close(f);
}

static void test_cli_stats_and_ledger_print_tables_and_json(void **state)
{
	(void)state;
	struct fake *f = fake_start(script_cli_reports, NULL);
	f->n_conns = 4;
	fake_run(f);
	char stats[2048], stats_json[2048], ledger[2048], ledger_json[2048];
	int rc[4];
	rc[0] = run_cli(f, "stats", stats, sizeof stats);
	rc[1] = run_cli(f, "stats --json", stats_json, sizeof stats_json);
	rc[2] = run_cli(f, "ledger", ledger, sizeof ledger);
	rc[3] = run_cli(f, "--socket /nonexistent ledger --json --socket \"$HEARTH_SOCKET\"",
			ledger_json, sizeof ledger_json);
	fake_stop(f);
	for (int i = 0; i < 4; i++)
		assert_int_equal(rc[i], 0);
	assert_non_null(strstr(stats, "uptime           1h 02m 03s\n"));
	assert_non_null(strstr(stats, "kv cache         1.00 MiB / 64.00 MiB (1.6%)\n"));
	assert_non_null(strstr(stats, "tiny-test (llama, q4_g128, 123.5M parameters)"));
	assert_non_null(strstr(stats_json, "\"kv_used\":1048576,\"kv_total\":67108864,"));
	assert_non_null(strstr(stats_json, "\"model\":{\"name\":\"tiny-test\""));
	assert_non_null(strstr(ledger, "weights                       734003200  700.00 MiB\n"));
	assert_non_null(strstr(ledger, "peak                          838860800  800.00 MiB\n"));
	assert_string_equal(ledger_json, "{\"entries\":[{\"name\":\"weights\",\"bytes\":734003200},"
			    "{\"name\":\"kv_pool\",\"bytes\":67108864}],\"total\":801112064,"
			    "\"peak\":838860800}\n");
}

static void test_cli_exit_codes_for_usage_and_errors(void **state)
{
	(void)state;
	char out[256];
	assert_int_equal(run_cli(NULL, "frobnicate", out, sizeof out), 2);
	assert_int_equal(run_cli(NULL, "generate -n notanumber x", out, sizeof out), 2);
	assert_int_equal(run_cli(NULL, "generate", out, sizeof out), 2);
	assert_int_equal(run_cli(NULL, "ping", out, sizeof out), 1); /* no daemon there */
	assert_int_equal(run_cli(NULL, "--help", out, sizeof out), 0);
	assert_non_null(strstr(out, "generate"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_client_connect_reports_loading_then_takes_welcome_and_ring),
		cmocka_unit_test(test_client_connect_refuses_a_ring_welcome_without_descriptors),
		cmocka_unit_test(test_client_connect_reports_why_the_daemon_refused_it),
		cmocka_unit_test(test_client_connect_names_the_socket_it_could_not_reach),
		cmocka_unit_test(test_client_socket_path_comes_from_the_environment),
		cmocka_unit_test(test_client_generate_streams_tokens_in_order_with_the_result),
		cmocka_unit_test(test_client_token_carries_the_daemon_sample_time_and_ignore_eos),
		cmocka_unit_test(test_client_drains_the_ring_before_acting_on_done),
		cmocka_unit_test(test_client_rings_the_doorbell_so_a_full_ring_drains),
		cmocka_unit_test(test_client_attaches_each_logits_row_to_its_token),
		cmocka_unit_test(test_client_iterator_yields_tokens_then_the_end_and_survives_a_timeout),
		cmocka_unit_test(test_client_cancel_names_the_generation_and_ends_it),
		cmocka_unit_test(test_client_callback_returning_nonzero_cancels),
		cmocka_unit_test(test_client_finish_before_the_end_cancels_and_discards),
		cmocka_unit_test(test_client_error_frames_become_hearth_errors_and_the_connection_lives),
		cmocka_unit_test(test_client_fatal_error_fails_the_generation_and_later_calls),
		cmocka_unit_test(test_client_daemon_death_mid_generation_fails_fast),
		cmocka_unit_test(test_client_hung_daemon_hits_the_idle_timeout),
		cmocka_unit_test(test_client_large_prompts_go_through_the_ring),
		cmocka_unit_test(test_client_refuses_invalid_prompts_before_sending),
		cmocka_unit_test(test_client_two_threads_generate_at_once_on_one_connection),
		cmocka_unit_test(test_client_tokenize_detokenize_stats_ledger_ping_round_trip),
		cmocka_unit_test(test_client_no_hello_connection_pings_but_cannot_generate),
		cmocka_unit_test(test_cli_generate_streams_text_and_exits_zero),
		cmocka_unit_test(test_cli_generate_json_reads_the_prompt_from_stdin),
		cmocka_unit_test(test_cli_interrupt_cancels_the_generation),
		cmocka_unit_test(test_cli_stats_and_ledger_print_tables_and_json),
		cmocka_unit_test(test_cli_exit_codes_for_usage_and_errors),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
