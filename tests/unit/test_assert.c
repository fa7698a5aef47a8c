/* Tests of protocol's header-only helpers: hearth_assert (on in every build that runs these
 * tests, reporting file:line, function and condition, then aborting) and hearth_now_ns (the
 * monotonic clock daemon and client share). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "protocol/assert.h"
#include "protocol/clock.h"

/* The libraries are compiled with the same AM_CPPFLAGS as this file, so this is also the
 * state of every hearth_assert inside them. */
static void test_assert_is_on_in_builds_that_run_the_tests(void **state)
{
	(void)state;
	if (!HEARTH_ASSERT_ON)
		fail_msg("hearth_assert is compiled out: configure without --disable-debug to test");
}

static int evaluations;

static int count_true(void)
{
	evaluations++;
	return 1;
}

static void test_assert_true_condition_is_evaluated_once_and_returns(void **state)
{
	(void)state;
	evaluations = 0;
	hearth_assert(count_true());
	assert_int_equal(evaluations, 1);
}

/* Runs a failing assertion in a child with stderr on a pipe; returns what it printed. */
static void run_failing_assert(char *out, size_t cap, int *status, int *line)
{
	int fd[2];
	assert_int_equal(pipe(fd), 0);
	*line = __LINE__ + 6;
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(fd[1], STDERR_FILENO);
		int two = 2;
		hearth_assert(two + 2 == 5);
		_exit(0);
	}
	close(fd[1]);
	size_t n = 0;
	ssize_t r;
	while (n + 1 < cap && (r = read(fd[0], out + n, cap - 1 - n)) > 0)
		n += (size_t)r;
	out[n] = '\0';
	close(fd[0]);
	assert_int_equal(waitpid(pid, status, 0), pid);
}

static void test_assert_false_condition_reports_file_line_condition_and_aborts(void **state)
{
	(void)state;
	char out[512], where[64];
	int status, line;
	run_failing_assert(out, sizeof out, &status, &line);
	assert_true(WIFSIGNALED(status));
	assert_int_equal(WTERMSIG(status), SIGABRT);
	snprintf(where, sizeof where, "test_assert.c:%d: run_failing_assert:", line);
	assert_non_null(strstr(out, where));
	assert_non_null(strstr(out, "two + 2 == 5"));
}

static void test_now_ns_follows_the_monotonic_clock(void **state)
{
	(void)state;
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	uint64_t t0 = hearth_now_ns();
	struct timespec nap = { 0, 3 * 1000 * 1000 };
	nanosleep(&nap, NULL);
	uint64_t t1 = hearth_now_ns();
	clock_gettime(CLOCK_MONOTONIC, &b);
	uint64_t lo = (uint64_t)a.tv_sec * 1000000000ull + (uint64_t)a.tv_nsec;
	uint64_t hi = (uint64_t)b.tv_sec * 1000000000ull + (uint64_t)b.tv_nsec;
	assert_true(lo <= t0 && t0 <= t1 && t1 <= hi);
	assert_true(t1 - t0 >= 3 * 1000 * 1000);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_assert_is_on_in_builds_that_run_the_tests),
		cmocka_unit_test(test_assert_true_condition_is_evaluated_once_and_returns),
		cmocka_unit_test(test_assert_false_condition_reports_file_line_condition_and_aborts),
		cmocka_unit_test(test_now_ns_follows_the_monotonic_clock),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
