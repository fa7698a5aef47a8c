/* What one peer may cost a real hearthd, and the lifecycle edges around it: a client that
 * closes before reading cannot kill the daemon whatever SIGPIPE disposition it started
 * with; a client that never reads is paused, then closed, at a bounded cost; connection
 * counts, the hello and frame clocks, cancel floods and ledger floods stay bounded; the
 * protocol's limits hold at each boundary; max_tokens 0 makes no token; a SIGHUP onto a
 * broken model keeps serving; a second daemon does not take over a live socket. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/prompt.h"
#include "tests/support/tclient.h"

static char g_dir[256];
static char g_model[4096];
static pid_t g_spawned[16];
static size_t g_n_spawned;
static unsigned g_seq;

struct daemon {
	pid_t pid;
	char sock[320];
	char log[320];
};

/* Starts hearthd on a socket of its own with extra flags; SIGPIPE as given (SIG_DFL: as a
 * shell leaves it; SIG_IGN: as systemd sets it). stderr goes to d->log. */
static void daemon_start_sig(struct daemon *d, const char *const *extra, void (*sigpipe)(int))
{
	unsigned n = g_seq++;
	snprintf(d->sock, sizeof d->sock, "%s/d%u.sock", g_dir, n);
	snprintf(d->log, sizeof d->log, "%s/d%u.log", g_dir, n);
	const char *bd = getenv("HEARTH_BUILDDIR");
	char bin[4096], model_kv[4200], sock_kv[400];
	snprintf(bin, sizeof bin, "%s/hearthd", bd ? bd : ".");
	snprintf(model_kv, sizeof model_kv, "--model=%s", g_model);
	snprintf(sock_kv, sizeof sock_kv, "--socket=%s", d->sock);
	const char *argv[40] = { bin, model_kv, sock_kv, "--max-context=256", "--kv-budget=4MiB",
				 "--threads=2", "--shutdown-grace=3s", "--log-level=info",
				 "--weights=w4a16" };
	int k = 9;
	for (int i = 0; extra && extra[i]; i++)
		argv[k++] = extra[i];
	argv[k] = NULL;
	pid_t pid = fork();
	if (pid == 0) {
		signal(SIGPIPE, sigpipe);
		unsetenv("NOTIFY_SOCKET");
		unsetenv("WATCHDOG_USEC");
		unsetenv("LISTEN_FDS");
		int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0) {
			dup2(fd, 2);
			close(fd);
		}
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	d->pid = pid;
	if (g_n_spawned < sizeof g_spawned / sizeof g_spawned[0])
		g_spawned[g_n_spawned++] = pid;
	for (int i = 0; i < 1000; i++) {
		struct tclient c;
		if (tc_connect_path(&c, d->sock) == 0) {
			tc_close(&c);
			return;
		}
		usleep(10000);
	}
	fail_msg("hearthd never listened on %s", d->sock);
}

static void daemon_start(struct daemon *d, const char *const *extra)
{
	daemon_start_sig(d, extra, SIG_IGN);
}

static bool daemon_alive(const struct daemon *d)
{
	int st;
	return waitpid(d->pid, &st, WNOHANG) == 0;
}

static void daemon_forget(pid_t pid)
{
	for (size_t i = 0; i < g_n_spawned; i++)
		if (g_spawned[i] == pid)
			g_spawned[i] = g_spawned[--g_n_spawned];
}

/* SIGTERM; returns the exit status (128+signal when killed). */
static int daemon_stop(struct daemon *d)
{
	daemon_forget(d->pid);
	kill(d->pid, SIGTERM);
	int st;
	for (int i = 0; i < 1000; i++) {
		if (waitpid(d->pid, &st, WNOHANG) == d->pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		usleep(10000);
	}
	kill(d->pid, SIGKILL);
	waitpid(d->pid, &st, 0);
	return -1;
}

static bool log_has(const struct daemon *d, const char *what)
{
	FILE *f = fopen(d->log, "r");
	if (!f)
		return false;
	char line[2048];
	bool found = false;
	while (!found && fgets(line, sizeof line, f))
		found = strstr(line, what) != NULL;
	fclose(f);
	return found;
}

/* Lines of the log that name what. */
static int log_count(const struct daemon *d, const char *what)
{
	FILE *f = fopen(d->log, "r");
	if (!f)
		return 0;
	char line[2048];
	int n = 0;
	while (fgets(line, sizeof line, f))
		n += strstr(line, what) != NULL;
	fclose(f);
	return n;
}

/* Waits up to ms for the log to name what. */
static bool log_wait(const struct daemon *d, const char *what, int ms)
{
	for (int i = 0; i < ms / 20; i++) {
		if (log_has(d, what))
			return true;
		usleep(20000);
	}
	return log_has(d, what);
}

static size_t rss_kib(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	size_t kb = 0;
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "VmRSS: %zu kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

static void ping_ok(const char *sock)
{
	struct tclient c;
	assert_int_equal(tc_connect_path(&c, sock), 0);
	struct msg p = tc_simple(&c, MSG_PING);
	assert_int_equal(p.type, MSG_PONG);
	msg_free(&p);
	tc_close(&c);
}

/* Reads frames until the daemon closes (1), or ms pass (0). */
static int wait_closed(struct tclient *c, int ms)
{
	uint64_t end = tc_now_ms() + (uint64_t)ms;
	while (tc_now_ms() < end) {
		struct msg r;
		int rc = tc_recv(c, &r, 50);
		if (rc == 0)
			return 1;
		if (rc == 1)
			msg_free(&r);
	}
	return 0;
}

/* Ids below 50000: inside the fixture's vocabulary. */
static void test_prompt_ids(uint32_t seed, int32_t *p, uint32_t n)
{
	test_prompt(seed, p, n, 50000);
}

static int setup(void **state)
{
	(void)state;
	const char *sh = getenv("HEARTH_SHARED");
	if (!sh) {
		fprintf(stderr, "HEARTH_SHARED is not set: run through make check\n");
		return -1;
	}
	snprintf(g_model, sizeof g_model, "%s/fixtures/fx-qwen3.gguf", sh);
	snprintf(g_dir, sizeof g_dir, "/tmp/hearth-limits-XXXXXX");
	if (!mkdtemp(g_dir))
		return -1;
	signal(SIGPIPE, SIG_IGN);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	while (g_n_spawned) {
		pid_t p = g_spawned[--g_n_spawned];
		kill(p, SIGKILL);
		waitpid(p, NULL, 0);
	}
	char cmd[512];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
	return getenv("HEARTH_KEEP") ? 0 : (system(cmd) == 0 ? 0 : -1);
}

/* ---- SIGPIPE ---- */

/* Pings, then closes without reading: the pong meets a closed socket. Then a client that
 * sends many pings and never reads before closing. */
static void close_before_reading(const char *sock)
{
	struct msg m;
	msg_init(&m, MSG_PING, 1);
	struct msg_buf b = { 0 };
	struct hearth_error e;
	assert_int_equal(msg_encode(&m, &b, &e), 0);
	for (int i = 0; i < 200; i++) {
		struct tclient c;
		assert_int_equal(tc_connect_path(&c, sock), 0);
		tc_send_raw(&c, b.data, b.len);
		tc_close(&c);
	}
	struct tclient c;
	assert_int_equal(tc_connect_path(&c, sock), 0);
	for (int i = 0; i < 5000; i++)
		tc_send_raw(&c, b.data, b.len);
	tc_close(&c);
	msg_buf_free(&b);
	usleep(200000);
}

static void check_sigpipe(void (*disposition)(int))
{
	struct daemon d;
	daemon_start_sig(&d, NULL, disposition);
	close_before_reading(d.sock);
	assert_true(daemon_alive(&d));
	ping_ok(d.sock);
	assert_int_equal(daemon_stop(&d), 0);
}

static void test_limits_client_closing_before_its_reply_cannot_kill_a_shell_started_daemon(void **state)
{
	(void)state;
	check_sigpipe(SIG_DFL);
}

static void test_limits_client_closing_before_its_reply_cannot_kill_a_systemd_started_daemon(void **state)
{
	(void)state;
	check_sigpipe(SIG_IGN);
}

/* ---- the reply queue ---- */

/* 300,000 pings that are never read: reading pauses at client_send_queue, the daemon's RSS
 * stays within a few MiB of where it was, other clients are served, and the peer is closed
 * after client_timeout with a log line naming the bound. */
static void test_limits_client_that_never_reads_is_paused_then_closed_at_bounded_cost(void **state)
{
	(void)state;
	struct daemon d;
	const char *extra[] = { "--client-send-queue=256KiB", "--client-timeout=2s", NULL };
	daemon_start(&d, extra);
	struct tclient c;
	assert_int_equal(tc_connect_path(&c, d.sock), 0);
	tc_hello(&c, "never-reads");
	size_t before = rss_kib(d.pid);
	struct msg m;
	msg_init(&m, MSG_PING, 7);
	struct msg_buf b = { 0 };
	struct hearth_error e;
	assert_int_equal(msg_encode(&m, &b, &e), 0);
	/* A burst of pings in one buffer, sent without blocking until the socket stays full. */
	size_t per = 4096;
	uint8_t *burst = malloc(per * b.len);
	for (size_t i = 0; i < per; i++)
		memcpy(burst + i * b.len, b.data, b.len);
	int fl = fcntl(c.fd, F_GETFL);
	fcntl(c.fd, F_SETFL, fl | O_NONBLOCK);
	size_t sent = 0, want = 300000 * b.len;
	uint64_t stuck_since = 0;
	while (sent < want) {
		size_t at = sent % (per * b.len);
		ssize_t w = send(c.fd, burst + at, per * b.len - at, MSG_NOSIGNAL);
		if (w > 0) {
			sent += (size_t)w;
			stuck_since = 0;
			continue;
		}
		if (w < 0 && errno != EAGAIN)
			break; /* closed by the daemon */
		if (!stuck_since)
			stuck_since = tc_now_ms();
		if (tc_now_ms() - stuck_since > 1000)
			break;
		usleep(2000);
	}
	free(burst);
	msg_buf_free(&b);
	size_t during = rss_kib(d.pid);
	/* Another client is not held up by the one that does not read. */
	ping_ok(d.sock);
	fcntl(c.fd, F_SETFL, fl);
	print_message("# sent %zu of %zu bytes of pings; daemon RSS %zu -> %zu KiB\n", sent, want,
		      before, during);
	assert_true(sent < want);
	assert_true(during < before + 16 * 1024);
	assert_true(log_wait(&d, "client_send_queue", 6000));
	assert_true(daemon_alive(&d));
	/* Nothing read yet: the daemon closes after client_timeout. */
	assert_true(log_wait(&d, "stayed over client_send_queue", 8000));
	assert_int_equal(wait_closed(&c, 5000), 1);
	tc_close(&c);
	assert_int_equal(daemon_stop(&d), 0);
}

/* ---- connections and clocks ---- */

static void test_limits_connections_beyond_max_clients_and_per_uid_are_refused(void **state)
{
	(void)state;
	struct daemon d;
	const char *extra[] = { "--max-clients=3", NULL };
	daemon_start(&d, extra);
	struct tclient c[4];
	for (int i = 0; i < 3; i++) {
		assert_int_equal(tc_connect_path(&c[i], d.sock), 0);
		tc_hello(&c[i], "held");
	}
	assert_int_equal(tc_connect_path(&c[3], d.sock), 0);
	struct msg r;
	assert_int_equal(tc_recv(&c[3], &r, 5000), 1);
	assert_int_equal(r.type, MSG_ERROR);
	assert_int_equal(r.u.error.code, MSG_ERR_BUSY);
	assert_true(r.u.error.fatal);
	assert_non_null(strstr(r.u.error.message.ptr, "max_clients"));
	msg_free(&r);
	assert_int_equal(wait_closed(&c[3], 3000), 1);
	tc_close(&c[3]);
	/* One leaves: there is room again. */
	tc_close(&c[0]);
	usleep(100000);
	assert_int_equal(tc_connect_path(&c[0], d.sock), 0);
	tc_hello(&c[0], "back");
	for (int i = 0; i < 3; i++)
		tc_close(&c[i]);
	assert_int_equal(daemon_stop(&d), 0);

	const char *extra2[] = { "--max-clients-per-uid=2", NULL };
	daemon_start(&d, extra2);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(tc_connect_path(&c[i], d.sock), 0);
		tc_hello(&c[i], "held");
	}
	assert_int_equal(tc_connect_path(&c[2], d.sock), 0);
	assert_int_equal(tc_recv(&c[2], &r, 5000), 1);
	assert_int_equal(r.type, MSG_ERROR);
	assert_int_equal(r.u.error.code, MSG_ERR_BUSY);
	assert_non_null(strstr(r.u.error.message.ptr, "max_clients_per_uid"));
	msg_free(&r);
	for (int i = 0; i < 3; i++)
		tc_close(&c[i]);
	assert_int_equal(daemon_stop(&d), 0);
}

/* Slowloris: a byte every 200 ms never makes a hello, and a welcomed client that starts a
 * frame and trickles it is closed too; a client idle between frames is not. */
static void test_limits_slow_hello_and_slow_frames_are_closed_after_client_timeout(void **state)
{
	(void)state;
	struct daemon d;
	const char *extra[] = { "--client-timeout=1s", NULL };
	daemon_start(&d, extra);
	struct tclient slow, trickle, idle;
	assert_int_equal(tc_connect_path(&slow, d.sock), 0);
	assert_int_equal(tc_connect_path(&trickle, d.sock), 0);
	tc_hello(&trickle, "trickle");
	assert_int_equal(tc_connect_path(&idle, d.sock), 0);
	tc_hello(&idle, "idle");
	uint8_t header[4] = { 0, 0, 0x10, 0 }; /* announces 4096 bytes */
	tc_send_raw(&trickle, header, 4);
	uint64_t start = tc_now_ms();
	bool slow_closed = false, trickle_closed = false;
	while (tc_now_ms() - start < 5000 && !(slow_closed && trickle_closed)) {
		uint8_t byte = 0;
		if (!slow_closed && send(slow.fd, &byte, 1, MSG_NOSIGNAL) < 0)
			slow_closed = true;
		if (!trickle_closed && send(trickle.fd, &byte, 1, MSG_NOSIGNAL) < 0)
			trickle_closed = true;
		/* A byte every 200 ms, whatever the sockets say (a closed one polls at once). */
		usleep(200000);
		struct pollfd p[2] = { { slow_closed ? -1 : slow.fd, POLLIN, 0 },
				       { trickle_closed ? -1 : trickle.fd, POLLIN, 0 } };
		poll(p, 2, 0);
		char buf[4096];
		if (!slow_closed && (p[0].revents & (POLLIN | POLLHUP)) && recv(slow.fd, buf, sizeof buf, 0) <= 0)
			slow_closed = true;
		if (!trickle_closed && (p[1].revents & (POLLIN | POLLHUP)) &&
		    recv(trickle.fd, buf, sizeof buf, 0) <= 0)
			trickle_closed = true;
	}
	uint64_t took = tc_now_ms() - start;
	print_message("# slow peers closed after %llu ms\n", (unsigned long long)took);
	assert_true(slow_closed);
	assert_true(trickle_closed);
	assert_true(log_has(&d, "no hello within client_timeout"));
	assert_true(log_has(&d, "one frame took longer than client_timeout"));
	/* The idle client was never inside a frame: still served. */
	struct msg p = tc_simple(&idle, MSG_PING);
	assert_int_equal(p.type, MSG_PONG);
	msg_free(&p);
	tc_close(&idle);
	tc_close(&slow);
	tc_close(&trickle);
	assert_int_equal(daemon_stop(&d), 0);
}

/* Before hello a frame may be at most LIMITS_HELLO_FRAME_MAX (16 KiB): a larger one is
 * refused as too_large without being buffered; after hello 1 MiB frames are accepted. */
static void test_limits_frames_before_hello_are_bounded(void **state)
{
	(void)state;
	struct daemon d;
	daemon_start(&d, NULL);
	struct tclient c;
	assert_int_equal(tc_connect_path(&c, d.sock), 0);
	size_t n = 64 << 10;
	uint8_t *big = calloc(1, n + 4);
	frame_header_write(big, n);
	tc_send_raw(&c, big, n + 4);
	struct msg r;
	assert_int_equal(tc_recv(&c, &r, 5000), 1);
	assert_int_equal(r.type, MSG_ERROR);
	assert_int_equal(r.u.error.code, MSG_ERR_TOO_LARGE);
	msg_free(&r);
	/* The same frame after hello is read whole (and refused for its content). */
	tc_hello(&c, "after");
	tc_send_raw(&c, big, n + 4);
	assert_int_equal(tc_recv(&c, &r, 5000), 1);
	assert_int_equal(r.type, MSG_ERROR);
	assert_int_not_equal(r.u.error.code, MSG_ERR_TOO_LARGE);
	msg_free(&r);
	free(big);
	tc_close(&c);
	assert_int_equal(daemon_stop(&d), 0);
}

/* ---- quotas ---- */

/* One connection pipelines a generation, 8000 cancels of it and a second generation: the
 * cancels cost the daemon-wide queue one entry, so its second request and another
 * client's are served, not refused "queue full". */
static void test_limits_cancel_flood_cannot_fill_the_daemon_queue(void **state)
{
	(void)state;
	struct daemon d;
	daemon_start(&d, NULL);
	struct tclient a, b;
	assert_int_equal(tc_connect_path(&a, d.sock), 0);
	tc_hello(&a, "flood");
	assert_int_equal(tc_connect_path(&b, d.sock), 0);
	tc_hello(&b, "bystander");
	int32_t prompt[8];
	test_prompt_ids(70, prompt, 8);
	uint64_t first = tc_generate_start(&a, prompt, 8, 200, 0.0, 1, false);
	struct msg_buf out = { 0 };
	struct hearth_error e;
	for (int i = 0; i < 8000; i++) {
		struct msg m;
		msg_init(&m, MSG_CANCEL, 1000 + (uint64_t)i);
		m.u.cancel.target = first;
		struct msg_buf one = { 0 };
		assert_int_equal(msg_encode(&m, &one, &e), 0);
		out.data = realloc(out.data, out.len + one.len);
		memcpy(out.data + out.len, one.data, one.len);
		out.len += one.len;
		msg_buf_free(&one);
	}
	tc_send_raw(&a, out.data, out.len);
	free(out.data);
	a.next_id = 20000;
	static struct gen_result g;
	memset(&g, 0, sizeof g);
	uint64_t second = tc_generate_start(&a, prompt, 8, 4, 0.0, 1, false);
	static struct gen_result gb;
	tc_generate(&b, prompt, 8, 4, 0.0, 1, &gb);
	assert_int_equal(gb.final.type, MSG_DONE);
	msg_free(&gb.final);
	tc_generate_wait(&a, second, &g, 30000);
	if (g.final.type == MSG_ERROR)
		fail_msg("the second request was refused: %s", g.final.u.error.message.ptr);
	assert_int_equal(g.final.type, MSG_DONE);
	msg_free(&g.final);
	tc_close(&a);
	tc_close(&b);
	assert_int_equal(daemon_stop(&d), 0);
}

/* 300 ledger requests pipelined by one client while another pings every few ms: the worst
 * ping stays under 250 ms. */
static void test_limits_ledger_flood_keeps_pings_fast(void **state)
{
	(void)state;
	struct daemon d;
	daemon_start(&d, NULL);
	struct tclient a, b;
	assert_int_equal(tc_connect_path(&a, d.sock), 0);
	tc_hello(&a, "ledgers");
	assert_int_equal(tc_connect_path(&b, d.sock), 0);
	tc_hello(&b, "pinger");
	struct msg_buf out = { 0 };
	struct hearth_error e;
	for (int i = 0; i < 300; i++) {
		struct msg m;
		msg_init(&m, MSG_LEDGER, 100 + (uint64_t)i);
		struct msg_buf one = { 0 };
		assert_int_equal(msg_encode(&m, &one, &e), 0);
		out.data = realloc(out.data, out.len + one.len);
		memcpy(out.data + out.len, one.data, one.len);
		out.len += one.len;
		msg_buf_free(&one);
	}
	tc_send_raw(&a, out.data, out.len);
	free(out.data);
	uint64_t worst = 0;
	size_t got = 0;
	uint64_t end = tc_now_ms() + 3000;
	while (tc_now_ms() < end) {
		uint64_t t0 = tc_now_ms();
		struct msg p = tc_simple(&b, MSG_PING);
		uint64_t dt = tc_now_ms() - t0;
		msg_free(&p);
		if (dt > worst)
			worst = dt;
		struct msg r;
		while (tc_recv(&a, &r, 0) == 1) {
			assert_int_equal(r.type, MSG_LEDGER_REPLY);
			got++;
			msg_free(&r);
		}
		usleep(5000);
	}
	struct msg r;
	while (got < 300 && tc_recv(&a, &r, 5000) == 1) {
		got++;
		msg_free(&r);
	}
	print_message("# worst ping %llu ms during 300 ledgers\n", (unsigned long long)worst);
	assert_int_equal(got, 300);
	assert_true(worst < 250);
	tc_close(&a);
	tc_close(&b);
	assert_int_equal(daemon_stop(&d), 0);
}

/* Six clients each send a tokenize request of 300 KB of base64-like text (tens to
 * hundreds of ms of tokenizer work each) at the same moment while another pings: the
 * tokenizer runs off the loop thread, so the worst ping stays under 150 ms (inline, the
 * six run back to back on the loop thread) and every request is answered. */
static void test_limits_long_tokenize_requests_keep_pings_fast(void **state)
{
	(void)state;
	struct daemon d;
	daemon_start(&d, NULL);
	enum { K = 6 };
	struct tclient a[K], b;
	for (int i = 0; i < K; i++) {
		assert_int_equal(tc_connect_path(&a[i], d.sock), 0);
		tc_hello(&a[i], "tokenizer");
	}
	assert_int_equal(tc_connect_path(&b, d.sock), 0);
	tc_hello(&b, "pinger");
	static const char alphabet[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t n = 300000;
	char *text = malloc(n);
	uint64_t x = 88172645463325252ull;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		text[i] = i % 101 == 100 ? '\n' : alphabet[x % 64];
	}
	struct msg m;
	msg_init(&m, MSG_TOKENIZE, 500);
	m.u.tokenize.has_text = true;
	m.u.tokenize.text = (struct msg_bytes){ text, n };
	struct msg_buf out = { 0 };
	struct hearth_error e;
	assert_int_equal(msg_encode(&m, &out, &e), 0);
	free(text);
	/* All but the last byte of each first, then the last bytes together: the six frames
	 * complete within microseconds of each other. */
	for (int i = 0; i < K; i++)
		tc_send_raw(&a[i], out.data, out.len - 1);
	usleep(200000);
	for (int i = 0; i < K; i++)
		tc_send_raw(&a[i], out.data + out.len - 1, 1);
	msg_buf_free(&out);
	uint64_t worst = 0;
	size_t got = 0;
	uint64_t end = tc_now_ms() + 30000;
	while (got < K && tc_now_ms() < end) {
		uint64_t t0 = tc_now_ms();
		struct msg p = tc_simple(&b, MSG_PING);
		uint64_t dt = tc_now_ms() - t0;
		msg_free(&p);
		if (dt > worst)
			worst = dt;
		for (int i = 0; i < K; i++) {
			struct msg r;
			while (tc_recv(&a[i], &r, 1) == 1) {
				if (r.type != MSG_TOKENS)
					fail_msg("tokenize: %s %s", msg_type_name(r.type),
						 r.type == MSG_ERROR ? r.u.error.message.ptr : "");
				assert_true(r.u.tokens.n_tokens > n / 20);
				got++;
				msg_free(&r);
			}
		}
		usleep(2000);
	}
	print_message("# worst ping %llu ms during %d long tokenizations\n", (unsigned long long)worst, K);
	assert_int_equal(got, K);
	assert_true(worst < 150);
	for (int i = 0; i < K; i++)
		tc_close(&a[i]);
	tc_close(&b);
	assert_int_equal(daemon_stop(&d), 0);
}

/* ---- the protocol's limits, at each boundary ---- */

/* Sends a generate with the given counts and returns the final frame's type (and code). */
static enum msg_type generate_with(struct tclient *c, size_t n_stop, size_t stop_len,
				   size_t n_stop_tokens, uint32_t top, enum msg_errcode *code)
{
	static char stops[MSG_STOP_MAX + 1][MSG_STOP_LEN_MAX + 2];
	static struct msg_bytes stop[MSG_STOP_MAX + 1];
	static uint32_t stop_tokens[MSG_STOP_TOKENS_MAX + 1];
	for (size_t i = 0; i < n_stop; i++) {
		/* Bytes no generation of 3 tokens can produce: the generation runs its length. */
		memset(stops[i], 'Q', stop_len);
		stops[i][0] = (char)('A' + i % 26);
		stop[i] = (struct msg_bytes){ stops[i], stop_len };
	}
	for (size_t i = 0; i < n_stop_tokens; i++)
		stop_tokens[i] = 60000 + (uint32_t)i; /* beyond the fixture's vocabulary: never sampled */
	int32_t prompt[6];
	test_prompt_ids(80, prompt, 6);
	uint32_t ids[6];
	for (int i = 0; i < 6; i++)
		ids[i] = (uint32_t)prompt[i];
	struct msg m;
	uint64_t id = c->next_id++;
	msg_init(&m, MSG_GENERATE, id);
	m.u.generate.tokens = ids;
	m.u.generate.n_tokens = 6;
	m.u.generate.max_tokens = 3;
	m.u.generate.sampling.temperature = 0;
	m.u.generate.stop = stop;
	m.u.generate.n_stop = n_stop;
	m.u.generate.stop_tokens = stop_tokens;
	m.u.generate.n_stop_tokens = n_stop_tokens;
	m.u.generate.logprobs = top > 0;
	m.u.generate.top_logprobs = top;
	struct msg_buf b = { 0 };
	struct hearth_error e;
	/* The encoder checks the same limits: past them, encode by hand is not needed, the
	 * daemon must see exactly what a hostile client would send, so raw-encode when the
	 * encoder refuses. */
	if (msg_encode(&m, &b, &e) < 0)
		fail_msg("cannot encode: %s", e.msg);
	tc_send_raw(c, b.data, b.len);
	msg_buf_free(&b);
	static struct gen_result g;
	memset(&g, 0, sizeof g);
	tc_generate_wait(c, id, &g, 30000);
	enum msg_type t = g.final.type;
	*code = t == MSG_ERROR ? g.final.u.error.code : MSG_ERR_NONE;
	if (t == MSG_DONE)
		assert_int_equal(g.n, 3);
	msg_free(&g.final);
	return t;
}

static void test_limits_generate_accepts_every_documented_maximum(void **state)
{
	(void)state;
	struct daemon d;
	daemon_start(&d, NULL);
	struct tclient c;
	assert_int_equal(tc_connect_path(&c, d.sock), 0);
	tc_hello(&c, "limits");
	enum msg_errcode code;
	/* 9 stop strings of 8 bytes, 65-byte strings, 17 stop tokens, 33 alternatives: each
	 * inside the protocol's limits. */
	assert_int_equal(generate_with(&c, 9, 8, 0, 0, &code), MSG_DONE);
	assert_int_equal(generate_with(&c, 1, 65, 0, 0, &code), MSG_DONE);
	assert_int_equal(generate_with(&c, 0, 0, 17, 0, &code), MSG_DONE);
	assert_int_equal(generate_with(&c, 0, 0, 0, 33, &code), MSG_DONE);
	/* Every maximum at once. */
	assert_int_equal(generate_with(&c, MSG_STOP_MAX, MSG_STOP_LEN_MAX, MSG_STOP_TOKENS_MAX,
				       MSG_TOP_MAX, &code),
			 MSG_DONE);
	tc_close(&c);
	assert_int_equal(daemon_stop(&d), 0);
}

/* One past each maximum, sent raw (the encoder refuses them too): too_large for a count or
 * length, bad_field for a number out of range, and the connection survives. */
static void test_limits_generate_refuses_one_past_each_maximum(void **state)
{
	(void)state;
	struct daemon d;
	daemon_start(&d, NULL);
	struct tclient c;
	assert_int_equal(tc_connect_path(&c, d.sock), 0);
	tc_hello(&c, "limits");
	/* Hand-made msgpack: {t: generate, id, tokens: [1], <field>: <value>}. */
	struct {
		const char *what;
		enum msg_errcode code; /* a count past a field's limit is too_large (§3) */
		uint8_t body[64 * 300];
		size_t len;
	} cases[4];
	size_t nc = 0;
	uint8_t *p;
	/* 17 stop strings of 1 byte */
	p = cases[nc].body;
	cases[nc].what = "17 stop strings";
	cases[nc].code = MSG_ERR_TOO_LARGE;
	p += sprintf((char *)p, "%s", "\x84\xa1t\xa8generate\xa2id\x01\xa6tokens\x91\x01\xa4stop");
	*p++ = 0xdc, *p++ = 0, *p++ = MSG_STOP_MAX + 1;
	for (int i = 0; i < MSG_STOP_MAX + 1; i++)
		*p++ = 0xa1, *p++ = 'x';
	cases[nc].len = (size_t)(p - cases[nc].body);
	nc++;
	/* one stop string of 257 bytes */
	p = cases[nc].body;
	cases[nc].what = "a 257-byte stop string";
	cases[nc].code = MSG_ERR_TOO_LARGE;
	p += sprintf((char *)p, "%s", "\x84\xa1t\xa8generate\xa2id\x02\xa6tokens\x91\x01\xa4stop\x91");
	*p++ = 0xda, *p++ = (MSG_STOP_LEN_MAX + 1) >> 8, *p++ = (MSG_STOP_LEN_MAX + 1) & 0xff;
	memset(p, 'y', MSG_STOP_LEN_MAX + 1);
	p += MSG_STOP_LEN_MAX + 1;
	cases[nc].len = (size_t)(p - cases[nc].body);
	nc++;
	/* 65 stop tokens */
	p = cases[nc].body;
	cases[nc].what = "65 stop_tokens";
	cases[nc].code = MSG_ERR_TOO_LARGE;
	p += sprintf((char *)p, "%s", "\x84\xa1t\xa8generate\xa2id\x03\xa6tokens\x91\x01\xabstop_tokens");
	*p++ = 0xdc, *p++ = 0, *p++ = MSG_STOP_TOKENS_MAX + 1;
	for (int i = 0; i < MSG_STOP_TOKENS_MAX + 1; i++)
		*p++ = 0x05;
	cases[nc].len = (size_t)(p - cases[nc].body);
	nc++;
	/* top_logprobs 65 */
	p = cases[nc].body;
	cases[nc].what = "top_logprobs 65";
	cases[nc].code = MSG_ERR_BAD_FIELD;
	p += sprintf((char *)p, "%s", "\x85\xa1t\xa8generate\xa2id\x04\xa6tokens\x91\x01\xa8logprobs\xc3\xactop_logprobs");
	*p++ = (uint8_t)(MSG_TOP_MAX + 1);
	cases[nc].len = (size_t)(p - cases[nc].body);
	nc++;
	for (size_t i = 0; i < nc; i++) {
		uint8_t hdr[4];
		frame_header_write(hdr, cases[i].len);
		tc_send_raw(&c, hdr, 4);
		tc_send_raw(&c, cases[i].body, cases[i].len);
		struct msg r;
		assert_int_equal(tc_recv(&c, &r, 5000), 1);
		if (r.type != MSG_ERROR || r.u.error.code != cases[i].code)
			fail_msg("%s: got %s %s", cases[i].what, msg_type_name(r.type), r.type == MSG_ERROR ? r.u.error.message.ptr : "");
		assert_int_equal(r.id, i + 1);
		msg_free(&r);
	}
	struct msg pong = tc_simple(&c, MSG_PING);
	assert_int_equal(pong.type, MSG_PONG);
	msg_free(&pong);
	tc_close(&c);
	assert_int_equal(daemon_stop(&d), 0);
}

/* doc/protocol.md quotes the code's limits by name: each row must carry the value the
 * code has, so the two cannot drift apart. */
static void test_limits_protocol_md_quotes_the_code_limits(void **state)
{
	(void)state;
	const char *src = getenv("HEARTH_SRCDIR");
	char path[4200];
	snprintf(path, sizeof path, "%s/doc/protocol.md", src ? src : ".");
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	static char doc[1 << 20];
	size_t n = fread(doc, 1, sizeof doc - 1, f);
	fclose(f);
	doc[n] = '\0';
	struct {
		const char *name;
		unsigned long long value;
	} limits[] = {
		{ "MSG_STOP_MAX", MSG_STOP_MAX },
		{ "MSG_STOP_LEN_MAX", MSG_STOP_LEN_MAX },
		{ "MSG_STOP_TOKENS_MAX", MSG_STOP_TOKENS_MAX },
		{ "MSG_TOP_MAX", MSG_TOP_MAX },
		{ "MSG_MAX_TOKENS_LIMIT", MSG_MAX_TOKENS_LIMIT },
		{ "MSG_ARRAY_MAX", MSG_ARRAY_MAX },
		{ "MSG_STR_MAX", MSG_STR_MAX },
		{ "MSG_MAP_MAX", MSG_MAP_MAX },
		{ "MSG_DEPTH_MAX", MSG_DEPTH_MAX },
		{ "MSG_KEY_MAX", MSG_KEY_MAX },
		{ "MSG_NAME_MAX", MSG_NAME_MAX },
		{ "MSG_MESSAGE_MAX", MSG_MESSAGE_MAX },
		{ "MSG_LEDGER_MAX", MSG_LEDGER_MAX },
		{ "MSG_EMBED_INPUTS_MAX", MSG_EMBED_INPUTS_MAX },
		{ "MSG_POOLING_MAX", MSG_POOLING_MAX },
		{ "FRAME_MAX_DEFAULT", FRAME_MAX_DEFAULT },
	};
	for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
		char row[128];
		snprintf(row, sizeof row, "| `%s` | %llu |", limits[i].name, limits[i].value);
		if (!strstr(doc, row))
			fail_msg("doc/protocol.md has no row \"%s\"", row);
	}
}

/* ---- lifecycle ---- */

static void test_limits_max_tokens_zero_generates_no_token(void **state)
{
	(void)state;
	struct daemon d;
	daemon_start(&d, NULL);
	struct tclient c;
	assert_int_equal(tc_connect_path(&c, d.sock), 0);
	tc_hello(&c, "zero");
	int32_t prompt[5];
	test_prompt_ids(90, prompt, 5);
	static struct gen_result g;
	tc_generate(&c, prompt, 5, 0, 0.0, 1, &g);
	assert_int_equal(g.final.type, MSG_DONE);
	assert_int_equal(g.n, 0);
	assert_int_equal(g.final.u.done.n_gen, 0);
	assert_int_equal(g.final.u.done.n_prompt, 5);
	assert_int_equal(g.final.u.done.finish, MSG_FINISH_LENGTH);
	msg_free(&g.final);
	tc_close(&c);
	assert_int_equal(daemon_stop(&d), 0);
}

/* A GGUF header that parses (one key, no tensors) but is no model: the swap's plan reads it
 * and refuses it before the old model is drained. */
static void write_hollow_gguf(const char *path)
{
	FILE *f = fopen(path, "wb");
	const char key[] = "general.architecture", val[] = "qwen3";
	uint32_t version = 3, type_str = 8;
	uint64_t n_tensors = 0, n_kv = 1, klen = sizeof key - 1, vlen = sizeof val - 1;
	fwrite("GGUF", 1, 4, f);
	fwrite(&version, 4, 1, f);
	fwrite(&n_tensors, 8, 1, f);
	fwrite(&n_kv, 8, 1, f);
	fwrite(&klen, 8, 1, f);
	fwrite(key, 1, klen, f);
	fwrite(&type_str, 4, 1, f);
	fwrite(&vlen, 8, 1, f);
	fwrite(val, 1, vlen, f);
	fclose(f);
}

/* SIGHUP onto a broken model with model_swap = drain: a file that does not parse, or parses
 * but is no model, is refused by the swap's plan while the old model serves; a model that
 * plans but cannot be mapped (numa_node names a node the machine lacks, which only the
 * arena's creation finds) brings the old model back. Either way the daemon keeps serving
 * and the log says why. */
static void test_limits_sighup_onto_a_broken_model_with_drain_keeps_serving(void **state)
{
	(void)state;
	char conf[320], truncated[320], hollow[320], conf_kv[400];
	snprintf(conf, sizeof conf, "%s/drain.conf", g_dir);
	snprintf(truncated, sizeof truncated, "%s/truncated.gguf", g_dir);
	snprintf(hollow, sizeof hollow, "%s/hollow.gguf", g_dir);
	/* The first MiB of the real model: its header promises tensors the file lacks. */
	FILE *in = fopen(g_model, "rb"), *out = fopen(truncated, "wb");
	static uint8_t buf[1 << 20];
	size_t n = fread(buf, 1, sizeof buf, in);
	fwrite(buf, 1, n, out);
	fclose(in);
	fclose(out);
	write_hollow_gguf(hollow);
	const char *broken[3] = { truncated, hollow, g_model };
	const char *extra[3] = { "", "", "numa_node = 1023\n" };
	const char *said[3] = { "model swap refused", "model swap refused", "loading the previous model" };
	/* The model comes from the file alone: a --model flag would win over it on reload. */
	FILE *f;
	struct daemon d;
	f = fopen(conf, "w");
	fprintf(f, "model = %s\nmodel_swap = drain\n", g_model);
	fclose(f);
	unsigned seq = g_seq++;
	snprintf(d.sock, sizeof d.sock, "%s/swap%u.sock", g_dir, seq);
	snprintf(d.log, sizeof d.log, "%s/swap%u.log", g_dir, seq);
	const char *bd = getenv("HEARTH_BUILDDIR");
	char bin[4096], sock_kv[400];
	snprintf(bin, sizeof bin, "%s/hearthd", bd ? bd : ".");
	snprintf(sock_kv, sizeof sock_kv, "--socket=%s", d.sock);
	snprintf(conf_kv, sizeof conf_kv, "--config=%s", conf);
	d.pid = fork();
	if (d.pid == 0) {
		int fd = open(d.log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		dup2(fd, 2);
		execl(bin, bin, conf_kv, sock_kv, "--max-context=256", "--kv-budget=4MiB",
		      "--threads=2", "--log-level=info", "--weights=w4a16", (char *)NULL);
		_exit(127);
	}
	g_spawned[g_n_spawned++] = d.pid;
	for (int i = 0; i < 1000; i++) {
		struct tclient c;
		if (tc_connect_path(&c, d.sock) == 0) {
			tc_hello(&c, "before"); /* the welcome: the first model is in */
			tc_close(&c);
			break;
		}
		usleep(10000);
	}
	for (int k = 0; k < 3; k++) {
		f = fopen(conf, "w");
		fprintf(f, "model = %s\nmodel_swap = drain\n%s", broken[k], extra[k]);
		fclose(f);
		int seen = log_count(&d, said[k]);
		kill(d.pid, SIGHUP);
		for (int i = 0; i < 500 && log_count(&d, said[k]) == seen; i++)
			usleep(20000);
		assert_true(log_count(&d, said[k]) > seen);
		/* Served again by the fixture's model. */
		bool served = false;
		for (int i = 0; i < 300 && !served; i++) {
			assert_true(daemon_alive(&d));
			struct tclient c;
			assert_int_equal(tc_connect_path(&c, d.sock), 0);
			tc_hello(&c, "after");
			served = strcmp(c.welcome.u.welcome.model.arch.ptr, "qwen3") == 0;
			if (served) {
				int32_t prompt[5];
				test_prompt_ids(91, prompt, 5);
				static struct gen_result g;
				tc_generate(&c, prompt, 5, 3, 0.0, 1, &g);
				assert_int_equal(g.final.type, MSG_DONE);
				assert_int_equal(g.n, 3);
				msg_free(&g.final);
			}
			tc_close(&c);
			if (!served)
				usleep(20000);
		}
		assert_true(served);
	}
	assert_true(daemon_alive(&d));
	assert_int_equal(daemon_stop(&d), 0);
}

/* A second daemon on a live daemon's socket path refuses to start and the first keeps
 * answering; once the first is killed (its socket file left behind), a new one replaces
 * the stale socket. */
static void test_limits_second_daemon_does_not_take_over_a_live_socket(void **state)
{
	(void)state;
	struct daemon first;
	daemon_start(&first, NULL);
	const char *bd = getenv("HEARTH_BUILDDIR");
	char bin[4096], model_kv[4200], sock_kv[400], log2[320];
	snprintf(bin, sizeof bin, "%s/hearthd", bd ? bd : ".");
	snprintf(model_kv, sizeof model_kv, "--model=%s", g_model);
	snprintf(sock_kv, sizeof sock_kv, "--socket=%s", first.sock);
	snprintf(log2, sizeof log2, "%s/second.log", g_dir);
	pid_t second = fork();
	if (second == 0) {
		int fd = open(log2, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		dup2(fd, 2);
		execl(bin, bin, model_kv, sock_kv, "--max-context=256", "--kv-budget=4MiB",
		      "--threads=2", "--weights=w4a16", (char *)NULL);
		_exit(127);
	}
	g_spawned[g_n_spawned++] = second;
	int st = 0;
	bool exited = false;
	for (int i = 0; i < 500 && !exited; i++) {
		exited = waitpid(second, &st, WNOHANG) == second;
		if (!exited)
			usleep(10000);
	}
	daemon_forget(second);
	if (!exited) {
		kill(second, SIGKILL);
		waitpid(second, NULL, 0);
		fail_msg("a second hearthd started on a live daemon's socket");
	}
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) != 0);
	/* The first still answers on its path, with its welcome. */
	struct tclient c;
	assert_int_equal(tc_connect_path(&c, first.sock), 0);
	tc_hello(&c, "still-first");
	tc_close(&c);
	/* A daemon killed outright leaves its socket file: the next one replaces it. */
	daemon_forget(first.pid);
	kill(first.pid, SIGKILL);
	waitpid(first.pid, NULL, 0);
	struct stat sb;
	assert_int_equal(lstat(first.sock, &sb), 0);
	struct daemon next = first;
	pid_t pid = fork();
	if (pid == 0) {
		execl(bin, bin, model_kv, sock_kv, "--max-context=256", "--kv-budget=4MiB",
		      "--threads=2", "--weights=w4a16", "--log-level=warning", (char *)NULL);
		_exit(127);
	}
	next.pid = pid;
	g_spawned[g_n_spawned++] = pid;
	bool up = false;
	for (int i = 0; i < 500 && !up; i++) {
		if (tc_connect_path(&c, first.sock) == 0) {
			tc_hello(&c, "next");
			tc_close(&c);
			up = true;
		} else {
			usleep(10000);
		}
	}
	assert_true(up);
	assert_int_equal(daemon_stop(&next), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_limits_client_closing_before_its_reply_cannot_kill_a_shell_started_daemon),
		cmocka_unit_test(test_limits_client_closing_before_its_reply_cannot_kill_a_systemd_started_daemon),
		cmocka_unit_test(test_limits_client_that_never_reads_is_paused_then_closed_at_bounded_cost),
		cmocka_unit_test(test_limits_connections_beyond_max_clients_and_per_uid_are_refused),
		cmocka_unit_test(test_limits_slow_hello_and_slow_frames_are_closed_after_client_timeout),
		cmocka_unit_test(test_limits_frames_before_hello_are_bounded),
		cmocka_unit_test(test_limits_cancel_flood_cannot_fill_the_daemon_queue),
		cmocka_unit_test(test_limits_ledger_flood_keeps_pings_fast),
		cmocka_unit_test(test_limits_long_tokenize_requests_keep_pings_fast),
		cmocka_unit_test(test_limits_generate_accepts_every_documented_maximum),
		cmocka_unit_test(test_limits_generate_refuses_one_past_each_maximum),
		cmocka_unit_test(test_limits_protocol_md_quotes_the_code_limits),
		cmocka_unit_test(test_limits_max_tokens_zero_generates_no_token),
		cmocka_unit_test(test_limits_sighup_onto_a_broken_model_with_drain_keeps_serving),
		cmocka_unit_test(test_limits_second_daemon_does_not_take_over_a_live_socket),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
