/* sd-daemon glue without a systemd PID 1: a datagram socket in a temp dir stands in for
 * $NOTIFY_SOCKET and receives exactly what the daemon would send; the listening-fd check
 * runs in forked children given fd 3 and LISTEN_* by hand, and once under the real
 * systemd-socket-activate(1). */
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
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/serve/systemd.h"

static char tmpdir[64];
static char notify_path[100];
static int notify_fd = -1;

static int setup_notify(void **state)
{
	snprintf(tmpdir, sizeof tmpdir, "/tmp/hearth-test-systemd-XXXXXX");
	if (!mkdtemp(tmpdir))
		return -1;
	snprintf(notify_path, sizeof notify_path, "%s/notify", tmpdir);
	notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof a.sun_path, "%s", notify_path);
	if (notify_fd < 0 || bind(notify_fd, (struct sockaddr *)&a, sizeof a) != 0)
		return -1;
	return 0;
}

static int teardown_notify(void **state)
{
	close(notify_fd);
	unlink(notify_path);
	return rmdir(tmpdir);
}

static int with_notify_socket(void **state)
{
	setenv("NOTIFY_SOCKET", notify_path, 1);
	return 0;
}

static int without_notify_socket(void **state)
{
	unsetenv("NOTIFY_SOCKET");
	return 0;
}

/* The next datagram, or "" when none arrives within 200 ms. */
static const char *received(void)
{
	static char buf[1024];
	struct pollfd p = { .fd = notify_fd, .events = POLLIN };
	if (poll(&p, 1, 200) != 1)
		return "";
	ssize_t n = recv(notify_fd, buf, sizeof buf - 1, 0);
	buf[n > 0 ? n : 0] = '\0';
	return buf;
}

static void test_systemd_ready_sends_ready_with_status(void **state)
{
	struct hearth_error err;
	assert_int_equal(systemd_notify_ready("serving smol.gguf", &err), 1);
	assert_string_equal(received(), "READY=1\nSTATUS=serving smol.gguf");
	assert_int_equal(systemd_notify_ready(NULL, &err), 1);
	assert_string_equal(received(), "READY=1");
}

static void test_systemd_status_is_formatted(void **state)
{
	struct hearth_error err;
	assert_int_equal(systemd_notify_status(&err, "loading %s (%d%%)", "blk.12", 43), 1);
	assert_string_equal(received(), "STATUS=loading blk.12 (43%)");
	assert_int_equal(systemd_notify_status(&err, "%u clients, %u running, %u tok/s", 3u, 2u, 41u),
			 1);
	assert_string_equal(received(), "STATUS=3 clients, 2 running, 41 tok/s");
}

static void test_systemd_status_cannot_inject_fields(void **state)
{
	/* A newline would make "READY=1" a field of its own in the datagram. */
	struct hearth_error err;
	assert_int_equal(systemd_notify_status(&err, "model %s", "x\nREADY=1\tMAINPID=1"), 1);
	assert_string_equal(received(), "STATUS=model x READY=1 MAINPID=1");
	assert_int_equal(systemd_notify_stopping("bye\nWATCHDOG=trigger", &err), 1);
	assert_string_equal(received(), "STOPPING=1\nSTATUS=bye WATCHDOG=trigger");
}

static void test_systemd_status_is_cut_at_256_bytes(void **state)
{
	char big[600];
	memset(big, 'a', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	assert_int_equal(systemd_notify_status(NULL, "%s", big), 1);
	const char *got = received();
	assert_int_equal(strlen(got), strlen("STATUS=") + 256);
}

static void test_systemd_stopping_and_watchdog_and_mainpid(void **state)
{
	struct hearth_error err;
	assert_int_equal(systemd_notify_stopping(NULL, &err), 1);
	assert_string_equal(received(), "STOPPING=1");
	assert_int_equal(systemd_watchdog_ping(&err), 1);
	assert_string_equal(received(), "WATCHDOG=1");
	assert_int_equal(systemd_notify_mainpid(4242, &err), 1);
	assert_string_equal(received(), "MAINPID=4242");
	assert_int_equal(systemd_notify_extend_timeout(90000000, &err), 1);
	assert_string_equal(received(), "EXTEND_TIMEOUT_USEC=90000000");
}

static uint64_t monotonic_usec(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void test_systemd_reloading_carries_monotonic_time(void **state)
{
	struct hearth_error err;
	uint64_t before = monotonic_usec();
	assert_int_equal(systemd_notify_reloading("reloading configuration", &err), 1);
	uint64_t after = monotonic_usec();
	const char *got = received();
	unsigned long long usec;
	char status[64];
	int end = 0;
	assert_int_equal(sscanf(got, "RELOADING=1\nMONOTONIC_USEC=%llu\nSTATUS=%63[^\n]%n", &usec,
				status, &end), 2);
	assert_int_equal(got[end], '\0');
	assert_string_equal(status, "reloading configuration");
	assert_true(usec >= before && usec <= after);
	assert_int_equal(systemd_notify_ready("serving", &err), 1);
	assert_string_equal(received(), "READY=1\nSTATUS=serving");
}

static void test_systemd_notify_is_noop_without_notify_socket(void **state)
{
	struct hearth_error err;
	assert_int_equal(systemd_notify_ready("x", &err), 0);
	assert_int_equal(systemd_notify_status(&err, "x"), 0);
	assert_int_equal(systemd_notify_stopping(NULL, &err), 0);
	assert_int_equal(systemd_notify_reloading(NULL, &err), 0);
	assert_int_equal(systemd_watchdog_ping(&err), 0);
	assert_string_equal(received(), "");
}

static void test_systemd_notify_reports_unreachable_socket(void **state)
{
	char path[160];
	snprintf(path, sizeof path, "%s/nobody-listens", tmpdir);
	setenv("NOTIFY_SOCKET", path, 1);
	struct hearth_error err;
	assert_int_equal(systemd_notify_ready(NULL, &err), HEARTH_EIO);
	assert_string_equal(err.msg, "sd_notify READY=1: No such file or directory");
}

static void test_systemd_watchdog_interval_from_environment(void **state)
{
	struct hearth_error err;
	uint64_t usec = 0;
	unsetenv("WATCHDOG_USEC");
	unsetenv("WATCHDOG_PID");
	assert_int_equal(systemd_watchdog_interval(&usec, &err), 0);

	setenv("WATCHDOG_USEC", "30000000", 1);
	assert_int_equal(systemd_watchdog_interval(&usec, &err), 1);
	assert_int_equal(usec, 30000000);

	char pid[32];
	snprintf(pid, sizeof pid, "%ld", (long)getpid());
	setenv("WATCHDOG_PID", pid, 1);
	usec = 0;
	assert_int_equal(systemd_watchdog_interval(&usec, &err), 1);
	assert_int_equal(usec, 30000000);

	/* Meant for another process (a parent that exec'd us without clearing it). */
	snprintf(pid, sizeof pid, "%ld", (long)getpid() + 1);
	setenv("WATCHDOG_PID", pid, 1);
	assert_int_equal(systemd_watchdog_interval(&usec, &err), 0);

	unsetenv("WATCHDOG_PID");
	setenv("WATCHDOG_USEC", "thirty", 1);
	assert_int_equal(systemd_watchdog_interval(&usec, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "WATCHDOG_USEC"));
	unsetenv("WATCHDOG_USEC");
}

static void test_systemd_progress_pings_while_idle_or_moving_only(void **state)
{
	/* Interval 20 s: checks every 5 s, stall after 10 s without a step. */
	const uint64_t S = 1000000, stall = 10 * S;
	struct systemd_progress p;
	systemd_progress_init(&p, 100, 0);
	/* Idle for a minute: healthy though no steps. */
	assert_true(systemd_progress_check(&p, 100, false, 5 * S, stall));
	assert_true(systemd_progress_check(&p, 100, false, 60 * S, stall));
	/* Work arrives; its first step gets the full stall time from here, not from t=0. */
	assert_true(systemd_progress_check(&p, 100, true, 65 * S, stall));
	assert_true(systemd_progress_check(&p, 100, true, 70 * S, stall));   /* 5 s in one step */
	assert_true(systemd_progress_check(&p, 101, true, 75 * S, stall));   /* moved */
	assert_true(systemd_progress_check(&p, 180, true, 80 * S, stall));
	assert_true(systemd_progress_check(&p, 180, true, 89 * S, stall));   /* 9 s: still ok */
	assert_false(systemd_progress_check(&p, 180, true, 90 * S, stall));  /* 10 s: stalled */
	assert_false(systemd_progress_check(&p, 180, true, 95 * S, stall));
	/* It recovers as soon as a step completes. */
	assert_true(systemd_progress_check(&p, 181, true, 100 * S, stall));
	assert_false(systemd_progress_check(&p, 181, true, 110 * S, stall));
	/* Work drained: healthy again, and the next work starts a fresh clock. */
	assert_true(systemd_progress_check(&p, 181, false, 111 * S, stall));
	assert_true(systemd_progress_check(&p, 181, true, 200 * S, stall));
	assert_true(systemd_progress_check(&p, 181, true, 209 * S, stall));
	assert_false(systemd_progress_check(&p, 181, true, 210 * S, stall));
}

/* ---- listening fd ---- */

enum fd_kind { FD_LISTENING_STREAM, FD_UNLISTENED_STREAM, FD_DGRAM, FD_TWO };

/* In a child: puts a socket of the given kind at fd 3 (and 4 for FD_TWO), sets LISTEN_FDS /
 * LISTEN_PID as systemd would (pid_offset != 0 aims them at another process), and exits with
 * the result encoded: 10 + rc for the return code, 50 when fd 3 came back, +100 when the
 * LISTEN_* variables were cleared. */
static int listen_fd_in_child(enum fd_kind kind, int pid_offset)
{
	pid_t pid = fork();
	if (pid == 0) {
		int type = kind == FD_DGRAM ? SOCK_DGRAM : SOCK_STREAM;
		int s = socket(AF_UNIX, type, 0);
		char path[100];
		snprintf(path, sizeof path, "%s/listen-%d", tmpdir, (int)getpid());
		struct sockaddr_un a = { .sun_family = AF_UNIX };
		snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
		if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0)
			_exit(1);
		unlink(path);
		if (kind != FD_UNLISTENED_STREAM && kind != FD_DGRAM && listen(s, 8) != 0)
			_exit(2);
		if (dup2(s, 3) != 3)
			_exit(3);
		if (kind == FD_TWO && dup2(s, 4) != 4)
			_exit(4);
		char n[16];
		snprintf(n, sizeof n, "%ld", (long)getpid() + pid_offset);
		setenv("LISTEN_PID", n, 1);
		setenv("LISTEN_FDS", kind == FD_TWO ? "2" : "1", 1);
		int fd = -1;
		struct hearth_error err;
		int rc = systemd_listen_fd(&fd, &err);
		int code = 10 + rc;
		if (rc == 1 && fd == 3 && (fcntl(3, F_GETFD) & FD_CLOEXEC))
			code += 50;
		if (!getenv("LISTEN_FDS") && !getenv("LISTEN_PID"))
			code += 100;
		_exit(code);
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	return WEXITSTATUS(status);
}

static void test_systemd_listen_fd_takes_passed_listening_socket(void **state)
{
	/* rc 1, fd 3 with close-on-exec, environment cleared. */
	assert_int_equal(listen_fd_in_child(FD_LISTENING_STREAM, 0), 100 + 50 + 11);
}

static void test_systemd_listen_fd_none_when_meant_for_another_process(void **state)
{
	assert_int_equal(listen_fd_in_child(FD_LISTENING_STREAM, 1) % 100, 10);
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_PID");
	int fd = -1;
	assert_int_equal(systemd_listen_fd(&fd, NULL), 0);
	assert_int_equal(fd, -1);
}

static void test_systemd_listen_fd_rejects_wrong_sockets(void **state)
{
	assert_int_equal(listen_fd_in_child(FD_DGRAM, 0) % 100, 10 + HEARTH_EINVAL);
	assert_int_equal(listen_fd_in_child(FD_UNLISTENED_STREAM, 0) % 100, 10 + HEARTH_EINVAL);
	assert_int_equal(listen_fd_in_child(FD_TWO, 0) % 100, 10 + HEARTH_EINVAL);
}

/* Probe mode, run by systemd-socket-activate: reports what systemd_listen_fd saw on stdout
 * and proves the fd is the listening socket by accepting the connection that woke it. */
static int listen_probe(void)
{
	int fd = -1;
	struct hearth_error err = { 0 };
	int rc = systemd_listen_fd(&fd, &err);
	int c = rc == 1 ? accept(fd, NULL, NULL) : -1;
	printf("rc=%d fd=%d accepted=%s env=%s msg=%s\n", rc, fd, c >= 0 ? "yes" : "no",
	       getenv("LISTEN_FDS") ? "kept" : "cleared", err.msg);
	return 0;
}

static void test_systemd_listen_fd_under_systemd_socket_activate(void **state)
{
	const char *tool = "/usr/bin/systemd-socket-activate";
	if (access(tool, X_OK) != 0) {
		print_message("# %s missing (Debian package systemd); skipped\n", tool);
		skip();
	}
	char self[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	assert_true(n > 0);
	self[n] = '\0';
	char sock[100];
	snprintf(sock, sizeof sock, "%s/activate.sock", tmpdir);
	int out[2];
	assert_int_equal(pipe(out), 0);
	pid_t pid = fork();
	if (pid == 0) {
		dup2(out[1], 1);
		int devnull = open("/dev/null", O_WRONLY);
		dup2(devnull, 2); /* its chatter ("Listening on ...") is not under test */
		close(out[0]);
		execl(tool, tool, "-l", sock, self, "--listen-probe", (char *)NULL);
		_exit(127);
	}
	close(out[1]);
	/* It execs the program at the first connection, like a socket unit without Accept=. */
	int c = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof a.sun_path, "%s", sock);
	int connected = -1;
	for (int i = 0; i < 200 && connected != 0; i++) {
		connected = connect(c, (struct sockaddr *)&a, sizeof a);
		if (connected != 0)
			usleep(10000);
	}
	char buf[512] = "";
	if (connected == 0) {
		struct pollfd p = { .fd = out[0], .events = POLLIN };
		if (poll(&p, 1, 5000) == 1) {
			ssize_t r = read(out[0], buf, sizeof buf - 1);
			buf[r > 0 ? r : 0] = '\0';
		}
	}
	close(c);
	close(out[0]);
	kill(pid, SIGTERM);
	waitpid(pid, NULL, 0);
	unlink(sock);
	assert_int_equal(connected, 0);
	assert_string_equal(buf, "rc=1 fd=3 accepted=yes env=cleared msg=\n");
}

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "--listen-probe") == 0)
		return listen_probe();
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_systemd_ready_sends_ready_with_status, with_notify_socket),
		cmocka_unit_test_setup(test_systemd_status_is_formatted, with_notify_socket),
		cmocka_unit_test_setup(test_systemd_status_cannot_inject_fields, with_notify_socket),
		cmocka_unit_test_setup(test_systemd_status_is_cut_at_256_bytes, with_notify_socket),
		cmocka_unit_test_setup(test_systemd_stopping_and_watchdog_and_mainpid,
				       with_notify_socket),
		cmocka_unit_test_setup(test_systemd_reloading_carries_monotonic_time,
				       with_notify_socket),
		cmocka_unit_test_setup(test_systemd_notify_is_noop_without_notify_socket,
				       without_notify_socket),
		cmocka_unit_test_setup_teardown(test_systemd_notify_reports_unreachable_socket, NULL,
						without_notify_socket),
		cmocka_unit_test(test_systemd_watchdog_interval_from_environment),
		cmocka_unit_test(test_systemd_progress_pings_while_idle_or_moving_only),
		cmocka_unit_test(test_systemd_listen_fd_takes_passed_listening_socket),
		cmocka_unit_test(test_systemd_listen_fd_none_when_meant_for_another_process),
		cmocka_unit_test(test_systemd_listen_fd_rejects_wrong_sockets),
		cmocka_unit_test(test_systemd_listen_fd_under_systemd_socket_activate),
	};
	return cmocka_run_group_tests(tests, setup_notify, teardown_notify);
}
