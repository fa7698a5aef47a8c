/* The raw protocol client of tclient.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/tclient.h"


uint64_t tc_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int tc_connect_path(struct tclient *c, const char *path)
{
	memset(c, 0, sizeof *c);
	c->next_id = 1;
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
	if (connect(c->fd, (struct sockaddr *)&a, sizeof a) < 0) {
		close(c->fd);
		return -1;
	}
	struct hearth_error e;
	frame_reader_init(&c->fr, 8u << 20, &e);
	return 0;
}

void tc_close(struct tclient *c)
{
	if (c->have_ring)
		ring_close(&c->ring);
	for (size_t i = 0; i < c->n_fds; i++)
		close(c->fds[i]);
	msg_free(&c->welcome);
	frame_reader_free(&c->fr);
	close(c->fd);
}

void tc_send_raw(struct tclient *c, const void *p, size_t n)
{
	const uint8_t *b = p;
	while (n) {
		ssize_t w = send(c->fd, b, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return; /* the daemon closed: the caller's next read says so */
		b += w;
		n -= (size_t)w;
	}
}

void tc_send(struct tclient *c, const struct msg *m)
{
	struct msg_buf b = { 0 };
	struct hearth_error e;
	assert_int_equal(msg_encode(m, &b, &e), 0);
	tc_send_raw(c, b.data, b.len);
	msg_buf_free(&b);
}

/* Next frame from the daemon: 1 with *out decoded, 0 when the daemon closed, -1 on
 * timeout. */
int tc_recv(struct tclient *c, struct msg *out, int timeout_ms)
{
	uint64_t end = tc_now_ms() + (uint64_t)timeout_ms;
	struct hearth_error e;
	for (;;) {
		const uint8_t *p;
		size_t len;
		int rc = frame_reader_next(&c->fr, &p, &len, &e);
		if (rc == FRAME_READY) {
			struct msg_reject rej;
			assert_int_equal(msg_decode(p, len, MSG_FROM_DAEMON, out, &rej, &e), 0);
			return 1;
		}
		uint64_t now = tc_now_ms();
		if (now >= end)
			return -1;
		struct pollfd pfd = { .fd = c->fd, .events = POLLIN };
		if (poll(&pfd, 1, (int)(end - now)) <= 0)
			continue;
		uint8_t buf[65536];
		size_t got = 0, nf = 0;
		int fds[FDPASS_MAX];
		rc = fdpass_recv(c->fd, buf, sizeof buf, &got, fds, FDPASS_MAX, &nf, &e);
		if (rc == HEARTH_EBUSY)
			continue;
		if (rc < 0 || got == 0)
			return 0;
		for (size_t i = 0; i < nf && c->n_fds < FDPASS_MAX; i++)
			c->fds[c->n_fds++] = fds[i];
		frame_reader_feed(&c->fr, buf, got, &e);
	}
}

/* hello, then loading frames until welcome; attaches the ring. */
void tc_hello(struct tclient *c, const char *name)
{
	struct msg m;
	msg_init(&m, MSG_HELLO, c->next_id++);
	m.u.hello.proto_major = MSG_PROTO_MAJOR;
	m.u.hello.name = (struct msg_bytes){ name, strlen(name) };
	m.u.hello.ring = true;
	tc_send(c, &m);
	for (;;) {
		struct msg r;
		int rc = tc_recv(c, &r, 30000);
		if (rc != 1)
			fail_msg("no welcome from the daemon (rc %d)", rc);
		if (r.type == MSG_LOADING) {
			msg_free(&r);
			continue;
		}
		if (r.type == MSG_ERROR)
			fail_msg("hello refused: %s", r.u.error.message.ptr);
		assert_int_equal(r.type, MSG_WELCOME);
		c->welcome = r;
		break;
	}
	assert_true(c->welcome.u.welcome.ring);
	assert_int_equal(c->n_fds, 3);
	struct hearth_error e;
	assert_int_equal(ring_attach(&c->ring, c->fds[0], c->fds[1], c->fds[2], &e), 0);
	c->have_ring = true;
	c->n_fds = 0;
}


void tc_drain_ring(struct tclient *c, uint64_t id, struct gen_result *g)
{
	struct hearth_error e;
	for (;;) {
		uint32_t type;
		const void *p;
		size_t len;
		int rc = ring_peek(&c->ring, &type, &p, &len, &e);
		assert_true(rc >= 0);
		if (rc == 0)
			break;
		if (type == RING_REC_TOKEN) {
			uint8_t copy[4096];
			assert_true(len <= sizeof copy);
			memcpy(copy, p, len);
			struct ring_token t;
			assert_int_equal(ring_token_decode(copy, len, &t, &e), 0);
			if (t.request_id == id && g->n < MAX_TOK)
				g->tokens[g->n++] = (int32_t)t.token;
			if (t.request_id == id && g->text_len + t.text_len < sizeof g->text) {
				memcpy(g->text + g->text_len, t.text, t.text_len);
				g->text_len += t.text_len;
			}
		}
		ring_consume(&c->ring);
	}
	ring_notify(&c->ring, NULL);
}

uint64_t tc_generate_start(struct tclient *c, const int32_t *prompt, uint32_t n,
				  uint32_t max_tokens, double temp, uint64_t seed, bool logits)
{
	struct msg m;
	uint64_t id = c->next_id++;
	msg_init(&m, MSG_GENERATE, id);
	uint32_t ids[256];
	for (uint32_t i = 0; i < n; i++)
		ids[i] = (uint32_t)prompt[i];
	m.u.generate.tokens = ids;
	m.u.generate.n_tokens = n;
	m.u.generate.max_tokens = max_tokens;
	m.u.generate.sampling.temperature = temp;
	m.u.generate.sampling.has_seed = true;
	m.u.generate.sampling.seed = seed;
	m.u.generate.logits = logits;
	tc_send(c, &m);
	return id;
}

/* Collects a generation's tokens until its final frame. */
void tc_generate_wait(struct tclient *c, uint64_t id, struct gen_result *g, int timeout_ms)
{
	uint64_t end = tc_now_ms() + (uint64_t)timeout_ms;
	for (;;) {
		tc_drain_ring(c, id, g);
		struct msg r;
		int rc = tc_recv(c, &r, 20);
		if (rc == 0)
			fail_msg("the daemon closed the connection during a generation");
		if (rc == 1) {
			if ((r.type == MSG_DONE || r.type == MSG_ERROR) && r.id == id) {
				tc_drain_ring(c, id, g); /* every token is in the ring before done */
				g->final = r;
				return;
			}
			msg_free(&r);
		}
		if (tc_now_ms() > end)
			fail_msg("generation %llu did not finish in %d ms", (unsigned long long)id, timeout_ms);
	}
}

void tc_generate(struct tclient *c, const int32_t *prompt, uint32_t n, uint32_t max_tokens,
			double temp, uint64_t seed, struct gen_result *g)
{
	memset(g, 0, sizeof *g);
	uint64_t id = tc_generate_start(c, prompt, n, max_tokens, temp, seed, false);
	tc_generate_wait(c, id, g, 60000);
}

struct msg tc_simple(struct tclient *c, enum msg_type t)
{
	struct msg m, r;
	msg_init(&m, t, c->next_id++);
	tc_send(c, &m);
	for (;;) {
		assert_int_equal(tc_recv(c, &r, 10000), 1);
		if (r.id == m.id)
			return r;
		msg_free(&r);
	}
}

