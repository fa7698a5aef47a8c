/* Unit tests for kernels/pool: every thread runs each job exactly once, barriers order
 * phases (on the spin path and on the futex path), workers sleep and wake between runs,
 * pinning puts each worker on its cpu, and pool_split covers rows in whole blocks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "kernels/pool.h"

#define MAX_T 4

struct count_job {
	_Atomic int runs[MAX_T];
	_Atomic int bad_n;
	size_t expect_n;
};

static void count_fn(void *arg, size_t t, size_t n)
{
	struct count_job *j = arg;

	if (n != j->expect_n || t >= n)
		atomic_fetch_add(&j->bad_n, 1);
	else
		atomic_fetch_add(&j->runs[t], 1);
}

static void run_counted(size_t n_threads, unsigned spin, int runs, useconds_t pause, unsigned flags)
{
	struct pool *p;
	struct count_job j;

	memset(&j, 0, sizeof(j));
	j.expect_n = n_threads;
	assert_int_equal(pool_create(&p, n_threads, NULL, spin, flags), 0);
	assert_int_equal(pool_threads(p), n_threads);
	for (int r = 0; r < runs; r++) {
		pool_run(p, count_fn, &j);
		/* pool_run returned: every thread's share is finished, none is pending. */
		for (size_t t = 0; t < n_threads; t++)
			assert_int_equal(atomic_load(&j.runs[t]), r + 1);
		if (pause)
			usleep(pause);
	}
	assert_int_equal(atomic_load(&j.bad_n), 0);
	pool_destroy(p);
}

static void test_pool_runs_each_thread_once_per_job(void **state)
{
	(void)state;
	/* More threads than this machine's cores spin against each other: fewer runs there. */
	for (size_t n = 1; n <= MAX_T; n++)
		run_counted(n, 0, n <= 2 ? 1000 : 30, 0, 0);
}

/* spin = 1 makes every wait go to the futex: the sleep/wake handshake must not lose a
 * wake-up; pauses between runs let workers fall asleep for real. */
static void test_pool_wakes_sleeping_workers(void **state)
{
	(void)state;
	run_counted(3, 1, 300, 0, 0);
	run_counted(2, 0, 20, 3000, 0);
}

/* Workers that yield while they wait for a job (the daemon's pool) still run every job
 * exactly once: back to back, after pauses long enough to pass through many yields and
 * into the futex, and with more threads than cores yielding to each other. */
static void test_pool_yielding_workers_run_each_job_once(void **state)
{
	(void)state;
	run_counted(2, 0, 1000, 0, POOL_YIELD_IDLE);
	run_counted(2, 0, 20, 3000, POOL_YIELD_IDLE);
	run_counted(MAX_T, 0, 30, 200, POOL_YIELD_IDLE);
}

struct barrier_job {
	struct pool *pool;
	int rounds;
	int slot[MAX_T];
	_Atomic int errors;
};

static void barrier_fn(void *arg, size_t t, size_t n)
{
	struct barrier_job *j = arg;

	for (int r = 1; r <= j->rounds; r++) {
		__atomic_store_n(&j->slot[t], r, __ATOMIC_RELAXED);
		pool_barrier(j->pool);
		/* After the barrier every thread has written round r. */
		for (size_t u = 0; u < n; u++)
			if (__atomic_load_n(&j->slot[u], __ATOMIC_RELAXED) < r)
				atomic_fetch_add(&j->errors, 1);
		pool_barrier(j->pool);
	}
}

static void test_pool_barrier_orders_phases(void **state)
{
	(void)state;
	for (unsigned spin = 0; spin <= 1; spin++) {
		for (size_t n = 1; n <= 3; n++) {
			struct barrier_job j;

			memset(&j, 0, sizeof(j));
			j.rounds = spin ? 200 : n <= 2 ? 1000 : 30;
			assert_int_equal(pool_create(&j.pool, n, NULL, spin, 0), 0);
			pool_run(j.pool, barrier_fn, &j);
			pool_run(j.pool, barrier_fn, &j); /* barrier state is reusable */
			assert_int_equal(atomic_load(&j.errors), 0);
			pool_destroy(j.pool);
		}
	}
}

struct pin_job {
	int cpu_of[MAX_T];
	int count_of[MAX_T];
};

static void pin_fn(void *arg, size_t t, size_t n)
{
	struct pin_job *j = arg;
	cpu_set_t set;

	(void)n;
	CPU_ZERO(&set);
	pthread_getaffinity_np(pthread_self(), sizeof(set), &set);
	j->count_of[t] = CPU_COUNT(&set);
	j->cpu_of[t] = -1;
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &set))
			j->cpu_of[t] = c;
}

static void test_pool_pins_workers_to_given_cpus(void **state)
{
	cpu_set_t mine;
	int cpus[2] = { -1, -1 }, found = 0;
	struct pool *p;
	struct pin_job j;

	(void)state;
	/* Use cpus this process may run on, the last one for the worker. */
	assert_int_equal(sched_getaffinity(0, sizeof(mine), &mine), 0);
	for (int c = 0; c < CPU_SETSIZE && found < 2; c++)
		if (CPU_ISSET(c, &mine))
			cpus[found++] = c;
	if (found < 2)
		cpus[1] = cpus[0];
	int rev[2] = { cpus[1], cpus[0] };

	assert_int_equal(pool_create(&p, 2, rev, 0, 0), 0);
	memset(&j, 0, sizeof(j));
	pool_run(p, pin_fn, &j);
	assert_int_equal(j.count_of[1], 1);
	assert_int_equal(j.cpu_of[1], rev[1]);
	pool_destroy(p);
}

static void test_pool_create_rejects_bad_arguments(void **state)
{
	struct pool *p = (struct pool *)&p;
	int bad[2] = { 0, -1 };

	(void)state;
	assert_int_equal(pool_create(&p, 0, NULL, 0, 0), HEARTH_EINVAL);
	assert_null(p);
	assert_int_equal(pool_create(&p, 2, bad, 0, 0), HEARTH_EINVAL);
	assert_null(p);
	pool_destroy(NULL);
}

static void test_pool_split_covers_rows_in_whole_blocks(void **state)
{
	(void)state;
	for (size_t n = 0; n < 300; n += 7) {
		for (size_t nt = 1; nt <= 5; nt++) {
			size_t next = 0, most = 0, least = SIZE_MAX;

			for (size_t t = 0; t < nt; t++) {
				size_t b, e;

				pool_split(n, 16, t, nt, &b, &e);
				assert_int_equal(b, next);
				assert_true(e >= b);
				assert_true(b % 16 == 0 || b == n);
				assert_true(e % 16 == 0 || e == n);
				next = e;
				size_t blocks = (e - b + 15) / 16;

				most = blocks > most ? blocks : most;
				least = blocks < least ? blocks : least;
			}
			assert_int_equal(next, n);
			assert_true(most - least <= 1); /* balanced to one block */
		}
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pool_runs_each_thread_once_per_job),
		cmocka_unit_test(test_pool_wakes_sleeping_workers),
		cmocka_unit_test(test_pool_barrier_orders_phases),
		cmocka_unit_test(test_pool_pins_workers_to_given_cpus),
		cmocka_unit_test(test_pool_yielding_workers_run_each_job_once),
		cmocka_unit_test(test_pool_create_rejects_bad_arguments),
		cmocka_unit_test(test_pool_split_covers_rows_in_whole_blocks),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
