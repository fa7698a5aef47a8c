/* hearthd as a real process, driven by real clients over its Unix socket and shared-memory
 * rings: many clients at once get what each would get alone, a killed or stalled client
 * costs the others nothing and gives its KV back, hostile frames and ring writes get their
 * errors while the daemon keeps serving, and the systemd contract (notify, socket
 * activation, SIGTERM drain, peer policy) holds. The clients speak the raw protocol so
 * they can also misbehave. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/prompt.h"
#include "tests/support/tclient.h"
#include "protocol/fdpass.h"
#include "protocol/frame.h"
#include "protocol/msg.h"
#include "protocol/ring.h"
#include "protocol/clock.h"

static char g_dir[256];
static char g_sock[300];
static char g_model[4096];
static pid_t g_daemon = -1;
/* Every daemon a test started and has not stopped: a failing assertion leaves a test
 * early, and teardown must not leave its daemons running. */
static pid_t g_spawned[16];
static size_t g_n_spawned;

/* ---- the daemon process ---- */

static pid_t daemon_spawn_env(const char *const *extra, const char *notify, const char *sock_override,
			      const char *watchdog_usec)
{
	const char *bd = getenv("HEARTH_BUILDDIR");
	char bin[4096], model_kv[4200], sock_kv[400];
	snprintf(bin, sizeof bin, "%s/hearthd", bd ? bd : ".");
	snprintf(model_kv, sizeof model_kv, "--model=%s", g_model);
	snprintf(sock_kv, sizeof sock_kv, "--socket=%s", sock_override ? sock_override : g_sock);
	const char *argv[40] = { bin, model_kv, sock_kv, "--max-context=256", "--kv-budget=4MiB",
				 "--threads=2", "--shutdown-grace=3s", "--socket-mode=0666",
				 "--log-level=warning", getenv("HEARTH_TEST_WEIGHTS") ? getenv("HEARTH_TEST_WEIGHTS") : "--weights=w4a16" };
	int n = 10;
	for (int i = 0; extra && extra[i]; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	pid_t pid = fork();
	if (pid == 0) {
		if (notify)
			setenv("NOTIFY_SOCKET", notify, 1);
		else
			unsetenv("NOTIFY_SOCKET");
		if (watchdog_usec)
			setenv("WATCHDOG_USEC", watchdog_usec, 1);
		else
			unsetenv("WATCHDOG_USEC");
		unsetenv("WATCHDOG_PID");
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	if (g_n_spawned < sizeof g_spawned / sizeof g_spawned[0])
		g_spawned[g_n_spawned++] = pid;
	return pid;
}

static pid_t daemon_spawn(const char *const *extra, const char *notify, const char *sock_override)
{
	return daemon_spawn_env(extra, notify, sock_override, NULL);
}

static void wait_for_socket(const char *path)
{
	for (int i = 0; i < 500; i++) {
		struct tclient c;
		if (tc_connect_path(&c, path) == 0) {
			tc_close(&c);
			return;
		}
		usleep(10000);
	}
	fail_msg("hearthd never listened on %s", path);
}

static void daemon_forget(pid_t pid)
{
	for (size_t i = 0; i < g_n_spawned; i++)
		if (g_spawned[i] == pid)
			g_spawned[i] = g_spawned[--g_n_spawned];
}

static int daemon_stop(pid_t pid)
{
	daemon_forget(pid);
	kill(pid, SIGTERM);
	int st;
	for (int i = 0; i < 1000; i++) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		usleep(10000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	return -1;
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
	snprintf(g_dir, sizeof g_dir, "/tmp/hearth-serve-XXXXXX");
	if (!mkdtemp(g_dir))
		return -1;
	chmod(g_dir, 0755);
	snprintf(g_sock, sizeof g_sock, "%s/hearth.sock", g_dir);
	signal(SIGPIPE, SIG_IGN);
	g_daemon = daemon_spawn(NULL, NULL, NULL);
	wait_for_socket(g_sock);
	return 0;
}

/* The daemons leave their sockets' lock files behind by design (removing one would race a
 * daemon starting on the same path), so the scratch directory is emptied whole. */
static void dir_empty(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	char path[4400];
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		unlink(path);
	}
	closedir(d);
}

static int teardown(void **state)
{
	(void)state;
	while (g_n_spawned) {
		pid_t p = g_spawned[--g_n_spawned];
		if (p != g_daemon) {
			kill(p, SIGKILL);
			waitpid(p, NULL, 0);
		}
	}
	int rc = daemon_stop(g_daemon);
	dir_empty(g_dir);
	rmdir(g_dir);
	if (rc != 0) {
		fprintf(stderr, "hearthd exited with %d after SIGTERM\n", rc);
		return -1;
	}
	return 0;
}

/* Ids below 50000: inside the fixture's vocabulary. */
static void make_prompt(uint32_t seed, int32_t *p, uint32_t n)
{
	test_prompt(seed, p, n, 50000);
}

/* ---- tests ---- */

static void test_serve_welcome_describes_the_model(void **state)
{
	(void)state;
	struct tclient c;
	assert_int_equal(tc_connect_path(&c, g_sock), 0);
	tc_hello(&c, "welcome-test");
	const struct msg_welcome *w = &c.welcome.u.welcome;
	assert_int_equal(w->proto_major, MSG_PROTO_MAJOR);
	assert_string_equal(w->model.arch.ptr, "qwen3");
	assert_int_equal(w->model.n_layer, 3);
	assert_int_equal(w->model.n_embd, 64);
	assert_int_equal(w->model.n_ctx, 256);
	assert_true(w->model.n_vocab >= 50257);
	assert_true(w->ring_d2c >= RING_CAP_MIN && w->ring_c2d >= RING_CAP_MIN);
	struct msg p = tc_simple(&c, MSG_PING);
	assert_int_equal(p.type, MSG_PONG);
	msg_free(&p);
	/* The ledger names the arena's parts and this client's ring, and adds up. */
	struct msg l = tc_simple(&c, MSG_LEDGER);
	assert_int_equal(l.type, MSG_LEDGER_REPLY);
	bool kv = false, ring = false, weights = false;
	uint64_t sum = 0;
	for (size_t i = 0; i < l.u.ledger.n_entries; i++) {
		const char *name = l.u.ledger.entries[i].name.ptr;
		kv |= strcmp(name, "kv_pool") == 0 && l.u.ledger.entries[i].bytes >= (4u << 20) - 65536;
		ring |= strncmp(name, "ring welcome-test", 17) == 0;
		weights |= strncmp(name, "weights.q4g", 11) == 0;
		sum += l.u.ledger.entries[i].bytes;
	}
	assert_true(kv && ring && weights);
	assert_int_equal(sum, l.u.ledger.total);
	assert_true(l.u.ledger.peak >= l.u.ledger.total);
	msg_free(&l);
	tc_close(&c);
}

enum { N_CLIENTS = 16 };

static void client_request(int i, int32_t *prompt, uint32_t *n, uint32_t *max_tokens, double *temp,
			   uint64_t *seed)
{
	*n = 4 + (uint32_t)(i * 7) % 29;
	make_prompt(1000u + (uint32_t)i, prompt, *n);
	*max_tokens = 6 + (uint32_t)i % 9;
	*temp = i % 3 == 0 ? 0.0 : 0.7 + 0.1 * (i % 4);
	*seed = 42u + (uint64_t)i;
}

static void test_serve_sixteen_clients_at_once_equal_each_alone(void **state)
{
	(void)state;
	static struct gen_result alone[N_CLIENTS];
	struct tclient c;
	assert_int_equal(tc_connect_path(&c, g_sock), 0);
	tc_hello(&c, "alone");
	for (int i = 0; i < N_CLIENTS; i++) {
		int32_t prompt[64];
		uint32_t n, mt;
		double temp;
		uint64_t seed;
		client_request(i, prompt, &n, &mt, &temp, &seed);
		tc_generate(&c, prompt, n, mt, temp, seed, &alone[i]);
		assert_int_equal(alone[i].final.type, MSG_DONE);
		assert_int_equal(alone[i].n, mt);
		msg_free(&alone[i].final);
	}
	tc_close(&c);

	int pipes[N_CLIENTS][2];
	pid_t kids[N_CLIENTS];
	for (int i = 0; i < N_CLIENTS; i++) {
		assert_int_equal(pipe(pipes[i]), 0);
		kids[i] = fork();
		if (kids[i] == 0) {
			close(pipes[i][0]);
			struct tclient k;
			if (tc_connect_path(&k, g_sock) < 0)
				_exit(2);
			tc_hello(&k, "batch");
			int32_t prompt[64];
			uint32_t n, mt;
			double temp;
			uint64_t seed;
			client_request(i, prompt, &n, &mt, &temp, &seed);
			static struct gen_result g;
			tc_generate(&k, prompt, n, mt, temp, seed, &g);
			ssize_t w = write(pipes[i][1], &g.n, sizeof g.n);
			w += write(pipes[i][1], g.tokens, g.n * sizeof(int32_t));
			(void)w;
			_exit(g.final.type == MSG_DONE ? 0 : 3);
		}
		close(pipes[i][1]);
	}
	for (int i = 0; i < N_CLIENTS; i++) {
		int st;
		assert_int_equal(waitpid(kids[i], &st, 0), kids[i]);
		assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		uint32_t n = 0;
		int32_t toks[MAX_TOK];
		assert_int_equal(read(pipes[i][0], &n, sizeof n), (ssize_t)sizeof n);
		assert_int_equal(read(pipes[i][0], toks, n * sizeof(int32_t)), (ssize_t)(n * sizeof(int32_t)));
		close(pipes[i][0]);
		assert_int_equal(n, alone[i].n);
		assert_memory_equal(toks, alone[i].tokens, n * sizeof(int32_t));
	}
}

static struct msg_stats_reply wait_idle(struct tclient *c)
{
	struct msg_stats_reply st = { 0 };
	for (int i = 0; i < 500; i++) {
		struct msg r = tc_simple(c, MSG_STATS);
		assert_int_equal(r.type, MSG_STATS_REPLY);
		st = r.u.stats;
		msg_free(&r);
		if (st.running == 0 && st.queued == 0 && st.kv_used == 0)
			return st;
		usleep(10000);
	}
	fail_msg("the daemon still holds %u running requests and %llu KV bytes", st.running,
		 (unsigned long long)st.kv_used);
	return st;
}

static void test_serve_killed_client_gives_its_kv_back(void **state)
{
	(void)state;
	pid_t kid = fork();
	if (kid == 0) {
		struct tclient k;
		if (tc_connect_path(&k, g_sock) < 0)
			_exit(2);
		tc_hello(&k, "doomed");
		int32_t prompt[16];
		make_prompt(77, prompt, 16);
		/* Logits rows it never reads fill its ring: it stays running, holding KV, until
		 * it is killed, however fast the model is. */
		tc_generate_start(&k, prompt, 16, 200, 0.0, 1, true);
		pause();
		_exit(0);
	}
	struct tclient c;
	assert_int_equal(tc_connect_path(&c, g_sock), 0);
	tc_hello(&c, "observer");
	bool running = false;
	for (int i = 0; i < 500 && !running; i++) {
		struct msg r = tc_simple(&c, MSG_STATS);
		running = r.u.stats.running > 0 && r.u.stats.kv_used > 0;
		msg_free(&r);
		if (!running)
			usleep(5000);
	}
	assert_true(running);
	kill(kid, SIGKILL);
	waitpid(kid, NULL, 0);
	wait_idle(&c);
	/* and the daemon still serves */
	int32_t prompt[8];
	make_prompt(5, prompt, 8);
	static struct gen_result g;
	tc_generate(&c, prompt, 8, 5, 0.0, 1, &g);
	assert_int_equal(g.final.type, MSG_DONE);
	assert_int_equal(g.n, 5);
	msg_free(&g.final);
	tc_close(&c);
}

static void test_serve_client_that_never_reads_its_ring_stalls_only_itself(void **state)
{
	(void)state;
	struct tclient lazy, busy;
	assert_int_equal(tc_connect_path(&lazy, g_sock), 0);
	tc_hello(&lazy, "lazy");
	int32_t prompt[8];
	make_prompt(9, prompt, 8);
	/* Full logits rows fill its ring within a few tokens; it never reads them. */
	tc_generate_start(&lazy, prompt, 8, 200, 0.0, 1, true);
	usleep(200000);
	assert_int_equal(tc_connect_path(&busy, g_sock), 0);
	tc_hello(&busy, "busy");
	static struct gen_result g;
	tc_generate(&busy, prompt, 8, 20, 0.0, 1, &g);
	assert_int_equal(g.final.type, MSG_DONE);
	assert_int_equal(g.n, 20);
	msg_free(&g.final);
	struct msg r = tc_simple(&busy, MSG_STATS);
	assert_int_equal(r.u.stats.running, 1); /* the lazy one, parked */
	msg_free(&r);
	tc_close(&lazy);
	wait_idle(&busy);
	tc_close(&busy);
}

/* One user parks every sequence slot (16 generations whose rings it never reads); another
 * user's request is served within seconds, not after the 30 s stall timeout: the parked
 * sequences give their places and KV back. Read at last, they finish with the tokens a
 * solo run gives. The other user is nobody when the test runs as root. */
static void test_serve_parked_sequences_give_way_to_another_user(void **state)
{
	(void)state;
	enum { N_LAZY = 16, N_GEN = 40 };
	static struct tclient lazy[N_LAZY];
	uint64_t ids[N_LAZY];
	int32_t prompt[8];
	make_prompt(21, prompt, 8);
	/* The solo run first: while root parks 16 sequences it may run no more. */
	struct tclient solo;
	assert_int_equal(tc_connect_path(&solo, g_sock), 0);
	tc_hello(&solo, "solo");
	static struct gen_result want, got;
	tc_generate(&solo, prompt, 8, N_GEN, 0.0, 1, &want);
	assert_int_equal(want.n, N_GEN);
	for (int i = 0; i < N_LAZY; i++) {
		assert_int_equal(tc_connect_path(&lazy[i], g_sock), 0);
		tc_hello(&lazy[i], "parker");
		/* full logits rows fill its ring within a few tokens */
		ids[i] = tc_generate_start(&lazy[i], prompt, 8, N_GEN, 0.0, 1, true);
	}
	usleep(500000);
	uint64_t t0 = tc_now_ms();
	pid_t pid = fork();
	if (pid == 0) {
		if (getuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
			_exit(3);
		struct tclient b;
		if (tc_connect_path(&b, g_sock) != 0)
			_exit(4);
		tc_hello(&b, "other");
		static struct gen_result g;
		tc_generate(&b, prompt, 8, 20, 0.0, 1, &g);
		_exit(g.final.type == MSG_DONE && g.n == 20 ? 0 : 1);
	}
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	uint64_t waited = tc_now_ms() - t0;
	fprintf(stderr, "the other user's 20 tokens took %llu ms\n", (unsigned long long)waited);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_true(waited < 5000);

	for (int i = 0; i < N_LAZY; i++) {
		memset(&got, 0, sizeof got);
		tc_generate_wait(&lazy[i], ids[i], &got, 20000);
		assert_int_equal(got.final.type, MSG_DONE);
		assert_int_equal(got.n, N_GEN);
		assert_memory_equal(got.tokens, want.tokens, N_GEN * sizeof(int32_t));
		msg_free(&got.final);
		tc_close(&lazy[i]);
	}
	msg_free(&want.final);
	wait_idle(&solo);
	tc_close(&solo);
}

static void expect_error(struct tclient *c, enum msg_errcode code, const char *what)
{
	struct msg r;
	assert_int_equal(tc_recv(c, &r, 5000), 1);
	if (r.type != MSG_ERROR || r.u.error.code != code)
		fail_msg("%s: expected error %s, got %s %s", what, msg_errcode_name(code),
			 msg_type_name(r.type),
			 r.type == MSG_ERROR ? msg_errcode_name(r.u.error.code) : "");
	assert_true(r.u.error.message.len > 0);
	msg_free(&r);
}

static void send_payload(struct tclient *c, const void *p, uint32_t n)
{
	uint8_t h[4];
	frame_header_write(h, n);
	tc_send_raw(c, h, 4);
	tc_send_raw(c, p, n);
}

static void test_serve_hostile_frames_get_errors_and_the_daemon_keeps_serving(void **state)
{
	(void)state;
	struct tclient c;
	assert_int_equal(tc_connect_path(&c, g_sock), 0);

	/* generate before hello */
	int32_t prompt[4] = { 1, 2, 3, 4 };
	tc_generate_start(&c, prompt, 4, 4, 0.0, 1, false);
	expect_error(&c, MSG_ERR_BAD_STATE, "generate before hello");

	/* not a map: a msgpack integer */
	uint8_t one = 0x01;
	send_payload(&c, &one, 1);
	expect_error(&c, MSG_ERR_BAD_FRAME, "non-map payload");

	/* truncated map: says 3 entries, has one */
	uint8_t trunc[] = { 0x83, 0xa1, 't', 0xa4, 'p', 'i', 'n', 'g' };
	send_payload(&c, trunc, sizeof trunc);
	expect_error(&c, MSG_ERR_BAD_FRAME, "truncated map");

	/* unknown type */
	uint8_t unk[] = { 0x82, 0xa1, 't', 0xa4, 'z', 'a', 'p', '!', 0xa2, 'i', 'd', 0x07 };
	send_payload(&c, unk, sizeof unk);
	expect_error(&c, MSG_ERR_UNKNOWN_TYPE, "unknown type");

	/* wrong field type: id as a string */
	uint8_t wrong[] = { 0x82, 0xa1, 't', 0xa4, 'p', 'i', 'n', 'g', 0xa2, 'i', 'd', 0xa1, 'x' };
	send_payload(&c, wrong, sizeof wrong);
	expect_error(&c, MSG_ERR_BAD_FIELD, "string id");

	/* 10000 levels of nested arrays */
	static uint8_t deep[20000];
	size_t n = 0;
	deep[n++] = 0x83;
	deep[n++] = 0xa1;
	deep[n++] = 't';
	deep[n++] = 0xa4;
	memcpy(deep + n, "ping", 4);
	n += 4;
	deep[n++] = 0xa2;
	deep[n++] = 'i';
	deep[n++] = 'd';
	deep[n++] = 0x09;
	deep[n++] = 0xa1;
	deep[n++] = 'x';
	for (int i = 0; i < 10000; i++)
		deep[n++] = 0x91;
	deep[n++] = 0xc0;
	send_payload(&c, deep, (uint32_t)n);
	struct msg r;
	assert_int_equal(tc_recv(&c, &r, 5000), 1);
	assert_int_equal(r.type, MSG_ERROR);
	assert_true(r.u.error.code == MSG_ERR_TOO_LARGE || r.u.error.code == MSG_ERR_BAD_FIELD);
	msg_free(&r);

	/* an oversized frame (2 MiB) is skipped, the connection goes on */
	static uint8_t big[2u << 20];
	memset(big, 0x90, sizeof big);
	send_payload(&c, big, sizeof big);
	expect_error(&c, MSG_ERR_TOO_LARGE, "oversized frame");

	/* after all that, the connection still works */
	tc_hello(&c, "survivor");
	struct msg p = tc_simple(&c, MSG_PING);
	assert_int_equal(p.type, MSG_PONG);
	msg_free(&p);

	/* a duplicate hello is a state error, not fatal */
	struct msg h;
	msg_init(&h, MSG_HELLO, 999);
	h.u.hello.proto_major = MSG_PROTO_MAJOR;
	h.u.hello.name = (struct msg_bytes){ "again", 5 };
	tc_send(&c, &h);
	expect_error(&c, MSG_ERR_BAD_STATE, "second hello");

	/* a token id beyond the vocabulary */
	int32_t bad[2] = { 1, 1 << 30 };
	tc_generate_start(&c, bad, 2, 4, 0.0, 1, false);
	expect_error(&c, MSG_ERR_BAD_TOKEN, "token beyond vocabulary");

	/* framing lost: text typed into the socket */
	const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
	tc_send_raw(&c, http, strlen(http));
	assert_int_equal(tc_recv(&c, &r, 5000), 1);
	assert_int_equal(r.type, MSG_ERROR);
	assert_int_equal(r.u.error.code, MSG_ERR_BAD_FRAME);
	assert_true(r.u.error.fatal);
	msg_free(&r);
	assert_int_equal(tc_recv(&c, &r, 5000), 0); /* closed */
	tc_close(&c);

	/* and everyone else is still served */
	struct tclient d;
	assert_int_equal(tc_connect_path(&d, g_sock), 0);
	tc_hello(&d, "after");
	p = tc_simple(&d, MSG_PING);
	assert_int_equal(p.type, MSG_PONG);
	msg_free(&p);
	tc_close(&d);
}

static void test_serve_hostile_ring_indices_close_only_that_client(void **state)
{
	(void)state;
	struct tclient evil, good;
	assert_int_equal(tc_connect_path(&evil, g_sock), 0);
	tc_hello(&evil, "evil");
	/* The client owns the d2c tail: claim to have consumed far more than was written. */
	uint64_t *tail = (uint64_t *)((uint8_t *)evil.ring.map + RING_OFF_D2C_TAIL);
	*tail = 0x7fffffffffffull;
	int32_t prompt[6];
	make_prompt(3, prompt, 6);
	uint64_t id = tc_generate_start(&evil, prompt, 6, 30, 0.0, 1, false);
	bool closed = false;
	for (int i = 0; i < 300 && !closed; i++) {
		struct msg r;
		int rc = tc_recv(&evil, &r, 20);
		if (rc == 0)
			closed = true;
		if (rc == 1) {
			if (r.type == MSG_ERROR && (r.u.error.code == MSG_ERR_RING || r.id == id))
				closed = r.u.error.fatal || closed;
			msg_free(&r);
		}
	}
	assert_true(closed);
	tc_close(&evil);
	assert_int_equal(tc_connect_path(&good, g_sock), 0);
	tc_hello(&good, "good");
	static struct gen_result g;
	tc_generate(&good, prompt, 6, 8, 0.0, 1, &g);
	assert_int_equal(g.final.type, MSG_DONE);
	msg_free(&g.final);
	wait_idle(&good);
	tc_close(&good);
}

static void test_serve_cancel_stops_a_generation(void **state)
{
	(void)state;
	struct tclient c;
	assert_int_equal(tc_connect_path(&c, g_sock), 0);
	tc_hello(&c, "canceller");
	int32_t prompt[8];
	make_prompt(12, prompt, 8);
	uint64_t id = tc_generate_start(&c, prompt, 8, 240, 0.0, 1, false);
	/* Cancel as soon as the first token is out: the generation is running, and the tiny
	 * model would finish all 240 tokens within tens of milliseconds of a fixed sleep. */
	static struct gen_result g;
	memset(&g, 0, sizeof g);
	for (int i = 0; i < 5000 && g.n == 0; i++) {
		tc_drain_ring(&c, id, &g);
		if (g.n == 0)
			usleep(100);
	}
	assert_true(g.n > 0);
	struct msg m;
	msg_init(&m, MSG_CANCEL, c.next_id++);
	m.u.cancel.target = id;
	tc_send(&c, &m);
	tc_generate_wait(&c, id, &g, 10000);
	assert_int_equal(g.final.type, MSG_DONE);
	assert_int_equal(g.final.u.done.finish, MSG_FINISH_CANCEL);
	assert_true(g.n < 240);
	msg_free(&g.final);
	wait_idle(&c);
	tc_close(&c);
}

static void test_serve_tokenize_and_detokenize_round_trip(void **state)
{
	(void)state;
	struct tclient c;
	assert_int_equal(tc_connect_path(&c, g_sock), 0);
	tc_hello(&c, "tok");
	const char *text = "Hello, world! Ünïcödé and 12345 digits.";
	struct msg m, r;
	msg_init(&m, MSG_TOKENIZE, c.next_id++);
	m.u.tokenize.has_text = true;
	m.u.tokenize.text = (struct msg_bytes){ text, strlen(text) };
	m.u.tokenize.add_bos = false;
	tc_send(&c, &m);
	assert_int_equal(tc_recv(&c, &r, 5000), 1);
	assert_int_equal(r.type, MSG_TOKENS);
	assert_true(r.u.tokens.n_tokens > 5 && r.u.tokens.n_tokens < strlen(text));
	struct msg d;
	msg_init(&d, MSG_DETOKENIZE, c.next_id++);
	d.u.detokenize.tokens = r.u.tokens.tokens;
	d.u.detokenize.n_tokens = r.u.tokens.n_tokens;
	tc_send(&c, &d);
	struct msg t;
	assert_int_equal(tc_recv(&c, &t, 5000), 1);
	assert_int_equal(t.type, MSG_TEXT);
	assert_int_equal(t.u.text.text.len, strlen(text));
	assert_memory_equal(t.u.text.text.ptr, text, strlen(text));
	msg_free(&t);
	msg_free(&r);
	tc_close(&c);
}

static size_t count_of(const char *s, const char *what)
{
	size_t n = 0;
	for (const char *p = s; (p = strstr(p, what)); p += strlen(what))
		n++;
	return n;
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* A second daemon, under a NOTIFY_SOCKET receiver and a 400 ms watchdog: READY=1 after the
 * load, STATUS lines, WATCHDOG=1 pings while it serves, STOPPING=1 on SIGTERM, and a running
 * request that finishes within the grace period. */
static void test_serve_systemd_notify_and_sigterm_drain(void **state)
{
	(void)state;
	char nsock[320], sock2[320];
	snprintf(nsock, sizeof nsock, "%s/notify", g_dir);
	snprintf(sock2, sizeof sock2, "%s/second.sock", g_dir);
	int nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	assert_true(strlen(nsock) < sizeof a.sun_path);
	memcpy(a.sun_path, nsock, strlen(nsock) + 1);
	assert_int_equal(bind(nfd, (struct sockaddr *)&a, sizeof a), 0);
	uint64_t t0 = now_ms();
	pid_t pid = daemon_spawn_env(NULL, nsock, sock2, "400000");
	char all[16384];
	size_t n_all = 0;
	bool ready = false;
	for (int i = 0; i < 3000 && !ready; i++) {
		struct pollfd pfd = { .fd = nfd, .events = POLLIN };
		if (poll(&pfd, 1, 10) > 0) {
			ssize_t got = recv(nfd, all + n_all, sizeof all - n_all - 1, 0);
			if (got > 0) {
				n_all += (size_t)got;
				all[n_all++] = '\n';
				all[n_all] = '\0';
				ready = strstr(all, "READY=1") != NULL;
			}
		}
	}
	assert_true(ready);
	assert_non_null(strstr(all, "STATUS="));
	/* The load pushed the start timeout ahead, at most once a second (not per tensor). */
	size_t extends = count_of(all, "EXTEND_TIMEOUT_USEC=");
	uint64_t load_s = (now_ms() - t0) / 1000;
	if (extends < 1 || extends > load_s + 1)
		fail_msg("%zu EXTEND_TIMEOUT_USEC in a %llu s load: %s", extends, (unsigned long long)load_s, all);
	/* Pings keep coming while it serves (every 100 ms with a 400 ms watchdog). */
	for (int i = 0; i < 100 && !strstr(all, "WATCHDOG=1"); i++) {
		struct pollfd pfd = { .fd = nfd, .events = POLLIN };
		if (poll(&pfd, 1, 10) > 0) {
			ssize_t got = recv(nfd, all + n_all, sizeof all - n_all - 1, 0);
			if (got > 0) {
				n_all += (size_t)got;
				all[n_all++] = '\n';
				all[n_all] = '\0';
			}
		}
	}
	assert_non_null(strstr(all, "WATCHDOG=1"));
	struct tclient c;
	assert_int_equal(tc_connect_path(&c, sock2), 0);
	tc_hello(&c, "drained");
	int32_t prompt[8];
	make_prompt(31, prompt, 8);
	uint64_t id = tc_generate_start(&c, prompt, 8, 30, 0.0, 1, false);
	usleep(20000);
	kill(pid, SIGTERM);
	static struct gen_result g;
	memset(&g, 0, sizeof g);
	/* Generous: a loaded machine (other builds beside the test) slows every step. */
	tc_generate_wait(&c, id, &g, 30000);
	/* Within the grace period it finishes; the rest would be told shutting_down. */
	assert_true(g.final.type == MSG_DONE ||
		    (g.final.type == MSG_ERROR && g.final.u.error.code == MSG_ERR_SHUTTING_DOWN));
	msg_free(&g.final);
	tc_close(&c);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	for (;;) {
		struct pollfd pfd = { .fd = nfd, .events = POLLIN };
		if (poll(&pfd, 1, 50) <= 0)
			break;
		ssize_t got = recv(nfd, all + n_all, sizeof all - n_all - 1, 0);
		if (got <= 0)
			break;
		n_all += (size_t)got;
		all[n_all++] = '\n';
		all[n_all] = '\0';
	}
	assert_non_null(strstr(all, "STOPPING=1"));
	close(nfd);
	unlink(nsock);
	unlink(sock2);
}

static void test_serve_refuses_peers_outside_allow_users(void **state)
{
	(void)state;
	if (geteuid() != 0)
		fail_msg("this test runs a client as another uid and needs root");
	char sock3[320];
	snprintf(sock3, sizeof sock3, "%s/policy.sock", g_dir);
	const char *extra[] = { "--allow-users=root", NULL };
	pid_t pid = daemon_spawn(extra, NULL, sock3);
	wait_for_socket(sock3);
	pid_t kid = fork();
	if (kid == 0) {
		if (setgid(65534) < 0 || setuid(65534) < 0)
			_exit(10);
		struct tclient c;
		if (tc_connect_path(&c, sock3) < 0)
			_exit(11);
		struct msg r;
		if (tc_recv(&c, &r, 5000) != 1)
			_exit(12);
		_exit(r.type == MSG_ERROR && r.u.error.code == MSG_ERR_FORBIDDEN &&
		      strstr(r.u.error.message.ptr, "65534") ? 0 : 13);
	}
	int st;
	waitpid(kid, &st, 0);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	/* root is served */
	struct tclient c;
	assert_int_equal(tc_connect_path(&c, sock3), 0);
	tc_hello(&c, "root");
	tc_close(&c);
	assert_int_equal(daemon_stop(pid), 0);
	unlink(sock3);
}

static void test_serve_socket_activation_uses_the_passed_socket(void **state)
{
	(void)state;
	if (access("/usr/bin/systemd-socket-activate", X_OK) != 0)
		fail_msg("systemd-socket-activate is missing: install the Debian package systemd");
	char sock4[320], bin[4096], model_kv[4200];
	snprintf(sock4, sizeof sock4, "%s/activated.sock", g_dir);
	const char *bd = getenv("HEARTH_BUILDDIR");
	snprintf(bin, sizeof bin, "%s/hearthd", bd ? bd : ".");
	snprintf(model_kv, sizeof model_kv, "--model=%s", g_model);
	pid_t pid = fork();
	if (pid == 0) {
		execl("/usr/bin/systemd-socket-activate", "systemd-socket-activate", "-l", sock4, bin,
		      model_kv, "--socket=/nonexistent/dir/never-used.sock", "--max-context=256",
		      "--kv-budget=4MiB", "--threads=2", "--log-level=warning", (char *)NULL);
		_exit(127);
	}
	g_spawned[g_n_spawned++] = pid;
	wait_for_socket(sock4);
	struct tclient c;
	assert_int_equal(tc_connect_path(&c, sock4), 0);
	tc_hello(&c, "activated");
	struct msg p = tc_simple(&c, MSG_PING);
	assert_int_equal(p.type, MSG_PONG);
	msg_free(&p);
	tc_close(&c);
	assert_int_equal(daemon_stop(pid), 0);
	unlink(sock4);
}

/* Appends the datagrams nfd receives to all (each followed by a newline) until until
 * occurs in all + from, or timeout_ms passes; says whether it occurred. */
static bool notify_wait(int nfd, char *all, size_t cap, size_t *n_all, size_t from, const char *until,
			int timeout_ms)
{
	uint64_t end = hearth_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	while (!(until && strstr(all + from, until)) && hearth_now_ns() < end) {
		struct pollfd pfd = { .fd = nfd, .events = POLLIN };
		if (poll(&pfd, 1, 10) <= 0)
			continue;
		ssize_t got = recv(nfd, all + *n_all, cap - *n_all - 2, 0);
		if (got > 0) {
			*n_all += (size_t)got;
			all[(*n_all)++] = '\n';
			all[*n_all] = '\0';
		}
	}
	return until && strstr(all + from, until);
}

/* SIGHUP with a different model in the config file swaps models without closing the
 * socket: a generation running across the swap finishes on the old model, and a client
 * that connects afterwards is served by the new one. Both swap modes. Under a NOTIFY_SOCKET
 * receiver, the reload is told as systemd's Type=notify-reload wants it: RELOADING=1 with
 * MONOTONIC_USEC (CLOCK_MONOTONIC when the reload began) at once, then one READY=1, sent
 * only when the new model serves: a client connecting right then meets it. */
static void check_swap(const char *mode)
{
	char conf[320], sock5[320], llama[4200], nsock[320];
	/* Paths of its own per mode: a daemon left by a failed run must not answer the next. */
	snprintf(conf, sizeof conf, "%s/swap-%s.conf", g_dir, mode);
	snprintf(sock5, sizeof sock5, "%s/swap-%s.sock", g_dir, mode);
	snprintf(nsock, sizeof nsock, "%s/swap-%s.notify", g_dir, mode);
	int nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un na = { .sun_family = AF_UNIX };
	assert_true(strlen(nsock) < sizeof na.sun_path);
	memcpy(na.sun_path, nsock, strlen(nsock) + 1);
	unlink(nsock);
	assert_int_equal(bind(nfd, (struct sockaddr *)&na, sizeof na), 0);
	static char all[65536];
	size_t n_all = 0;
	all[0] = '\0';
	const char *sh = getenv("HEARTH_SHARED");
	snprintf(llama, sizeof llama, "%s/fixtures/fx-llama.gguf", sh);
	FILE *f = fopen(conf, "w");
	fprintf(f, "model = %s\nmodel_swap = %s\n", g_model, mode);
	fclose(f);
	const char *bd = getenv("HEARTH_BUILDDIR");
	char bin[4096], conf_kv[400], sock_kv[400];
	snprintf(bin, sizeof bin, "%s/hearthd", bd ? bd : ".");
	snprintf(conf_kv, sizeof conf_kv, "--config=%s", conf);
	snprintf(sock_kv, sizeof sock_kv, "--socket=%s", sock5);
	pid_t pid = fork();
	if (pid == 0) {
		setenv("NOTIFY_SOCKET", nsock, 1);
		execl(bin, bin, conf_kv, sock_kv, "--max-context=256", "--kv-budget=4MiB",
		      "--threads=2", "--log-level=warning", (char *)NULL);
		_exit(127);
	}
	g_spawned[g_n_spawned++] = pid;
	wait_for_socket(sock5);
	assert_true(notify_wait(nfd, all, sizeof all, &n_all, 0, "READY=1", 30000));
	size_t at_hup = n_all;
	struct tclient c;
	assert_int_equal(tc_connect_path(&c, sock5), 0);
	tc_hello(&c, "across");
	assert_string_equal(c.welcome.u.welcome.model.arch.ptr, "qwen3");
	int32_t prompt[8];
	make_prompt(50, prompt, 8);
	uint64_t id = tc_generate_start(&c, prompt, 8, 120, 0.0, 1, false);
	f = fopen(conf, "w");
	fprintf(f, "model = %s\nmodel_swap = %s\n", llama, mode);
	fclose(f);
	uint64_t t_hup = hearth_now_ns() / 1000;
	kill(pid, SIGHUP);
	assert_true(notify_wait(nfd, all, sizeof all, &n_all, at_hup, "READY=1", 30000));
	uint64_t t_ready = hearth_now_ns() / 1000;
	{
		struct tclient d;
		assert_int_equal(tc_connect_path(&d, sock5), 0);
		tc_hello(&d, "at-ready");
		if (strcmp(d.welcome.u.welcome.model.arch.ptr, "llama") != 0)
			fail_msg("READY=1 came while the old model (%s) still served new clients: %s",
				 d.welcome.u.welcome.model.arch.ptr, all + at_hup);
		tc_close(&d);
	}
	const char *reloading = strstr(all + at_hup, "RELOADING=1\nMONOTONIC_USEC=");
	assert_non_null(reloading);
	assert_true(reloading < strstr(all + at_hup, "READY=1"));
	unsigned long long usec = strtoull(reloading + strlen("RELOADING=1\nMONOTONIC_USEC="), NULL, 10);
	assert_true(usec >= t_hup && usec <= t_ready);
	static struct gen_result g;
	memset(&g, 0, sizeof g);
	tc_generate_wait(&c, id, &g, 20000);
	assert_int_equal(g.final.type, MSG_DONE);
	assert_int_equal(g.n, 120);
	msg_free(&g.final);
	tc_close(&c);
	/* A new client meets the new model once the swap is through. */
	bool swapped = false;
	for (int i = 0; i < 200 && !swapped; i++) {
		struct tclient d;
		assert_int_equal(tc_connect_path(&d, sock5), 0);
		tc_hello(&d, "after-swap");
		swapped = strcmp(d.welcome.u.welcome.model.arch.ptr, "llama") == 0;
		if (swapped) {
			int32_t p2[6];
			make_prompt(51, p2, 6);
			for (int k = 0; k < 6; k++)
				p2[k] %= 32000; /* the llama fixture's vocabulary */
			tc_generate(&d, p2, 6, 5, 0.0, 1, &g);
			assert_int_equal(g.final.type, MSG_DONE);
			assert_int_equal(g.n, 5);
			msg_free(&g.final);
		}
		tc_close(&d);
		if (!swapped)
			usleep(20000);
	}
	assert_true(swapped);
	/* The swap is through (beside: the old model drains in the background): whatever else
	 * came, the reload ended once. */
	notify_wait(nfd, all, sizeof all, &n_all, at_hup, NULL, 300);
	if (count_of(all + at_hup, "READY=1") != 1)
		fail_msg("the reload sent READY=1 %zu times: %s", count_of(all + at_hup, "READY=1"), all + at_hup);
	assert_int_equal(daemon_stop(pid), 0);
	close(nfd);
	unlink(nsock);
	unlink(sock5);
	unlink(conf);
}

static void test_serve_sighup_swaps_models_beside_the_old(void **state)
{
	(void)state;
	check_swap("beside");
}

static void test_serve_sighup_swaps_models_after_draining(void **state)
{
	(void)state;
	check_swap("drain");
}

/* A client without shared memory (hello ring=false) asks for socket: true and gets every
 * token as a `token` frame before `done`: the same tokens the ring delivers. */
static void test_serve_socket_streaming_without_a_ring(void **state)
{
	(void)state;
	int32_t prompt[10];
	make_prompt(61, prompt, 10);
	static struct gen_result via_ring;
	struct tclient a;
	assert_int_equal(tc_connect_path(&a, g_sock), 0);
	tc_hello(&a, "ring-side");
	tc_generate(&a, prompt, 10, 12, 0.0, 1, &via_ring);
	assert_int_equal(via_ring.final.type, MSG_DONE);
	msg_free(&via_ring.final);
	tc_close(&a);

	struct tclient c;
	assert_int_equal(tc_connect_path(&c, g_sock), 0);
	struct msg h;
	msg_init(&h, MSG_HELLO, c.next_id++);
	h.u.hello.proto_major = MSG_PROTO_MAJOR;
	h.u.hello.name = (struct msg_bytes){ "no-ring", 7 };
	h.u.hello.ring = false;
	tc_send(&c, &h);
	struct msg r;
	do {
		assert_int_equal(tc_recv(&c, &r, 10000), 1);
		if (r.type != MSG_WELCOME)
			msg_free(&r);
	} while (r.type != MSG_WELCOME);
	assert_false(r.u.welcome.ring);
	assert_int_equal(c.n_fds, 0);
	msg_free(&r);

	/* Without socket: true there is nowhere to put the tokens. */
	tc_generate_start(&c, prompt, 10, 12, 0.0, 1, false);
	expect_error(&c, MSG_ERR_BAD_STATE, "generate without ring or socket");

	struct msg g;
	uint64_t id = c.next_id++;
	msg_init(&g, MSG_GENERATE, id);
	uint32_t ids[10];
	for (int i = 0; i < 10; i++)
		ids[i] = (uint32_t)prompt[i];
	g.u.generate.tokens = ids;
	g.u.generate.n_tokens = 10;
	g.u.generate.max_tokens = 12;
	g.u.generate.sampling.temperature = 0.0;
	g.u.generate.stream_socket = true;
	tc_send(&c, &g);
	int32_t toks[64];
	uint32_t n = 0;
	for (;;) {
		assert_int_equal(tc_recv(&c, &r, 20000), 1);
		if (r.type == MSG_TOKEN) {
			assert_int_equal(r.id, id);
			assert_true(n < 64);
			toks[n++] = (int32_t)r.u.token.token;
			msg_free(&r);
			continue;
		}
		assert_int_equal(r.type, MSG_DONE);
		assert_int_equal(r.id, id);
		assert_int_equal(r.u.done.n_gen, 12);
		msg_free(&r);
		break;
	}
	assert_int_equal(n, via_ring.n);
	assert_memory_equal(toks, via_ring.tokens, n * sizeof(int32_t));
	tc_close(&c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_serve_welcome_describes_the_model),
		cmocka_unit_test(test_serve_sixteen_clients_at_once_equal_each_alone),
		cmocka_unit_test(test_serve_killed_client_gives_its_kv_back),
		cmocka_unit_test(test_serve_client_that_never_reads_its_ring_stalls_only_itself),
		cmocka_unit_test(test_serve_parked_sequences_give_way_to_another_user),
		cmocka_unit_test(test_serve_hostile_frames_get_errors_and_the_daemon_keeps_serving),
		cmocka_unit_test(test_serve_hostile_ring_indices_close_only_that_client),
		cmocka_unit_test(test_serve_cancel_stops_a_generation),
		cmocka_unit_test(test_serve_tokenize_and_detokenize_round_trip),
		cmocka_unit_test(test_serve_socket_streaming_without_a_ring),
		cmocka_unit_test(test_serve_systemd_notify_and_sigterm_drain),
		cmocka_unit_test(test_serve_refuses_peers_outside_allow_users),
		cmocka_unit_test(test_serve_socket_activation_uses_the_passed_socket),
		cmocka_unit_test(test_serve_sighup_swaps_models_beside_the_old),
		cmocka_unit_test(test_serve_sighup_swaps_models_after_draining),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
