/* The pinned thread pool: a start generation counter the workers watch, a pending count
 * the caller watches, and a barrier generation; each is spun on first and slept on with
 * futex only when the wait is long (sequentially consistent atomics make the
 * "announce sleeper, re-check, sleep" handshake safe against a missed wake-up). */
#include "kernels/pool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define POOL_DEFAULT_SPIN 20000u
#define POOL_YIELD_SPINS 64u /* ~1 us of pause loops */

struct pool_worker {
	struct pool *pool;
	size_t index;
	pthread_t thread;
};

struct pool {
	size_t n_threads;
	unsigned spin;
	bool yield_idle;
	/* Each watched word on its own cache line: spinners should not slow writers. */
	_Alignas(64) _Atomic uint32_t start_gen;
	_Atomic uint32_t start_sleepers;
	_Alignas(64) _Atomic uint32_t pending;
	_Atomic uint32_t caller_sleeping;
	_Alignas(64) _Atomic uint32_t bar_count;
	_Alignas(64) _Atomic uint32_t bar_gen;
	_Atomic uint32_t bar_sleepers;
	_Alignas(64) pool_fn fn;
	void *arg;
	bool stop;
	size_t n_started;
	struct pool_worker *workers;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
	syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr)
{
	syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static inline void cpu_relax(void)
{
	__builtin_ia32_pause();
}

/* Waits until *word != val: spin (yielding now and then when asked), then sleep. */
static void wait_change(struct pool *p, _Atomic uint32_t *word, uint32_t val, _Atomic uint32_t *sleepers,
			bool yield)
{
	for (unsigned i = 0; i < p->spin; i++) {
		if (atomic_load_explicit(word, memory_order_acquire) != val)
			return;
		cpu_relax();
		if (yield && i % POOL_YIELD_SPINS == POOL_YIELD_SPINS - 1)
			sched_yield();
	}
	while (atomic_load(word) == val) {
		atomic_fetch_add(sleepers, 1);
		if (atomic_load(word) == val)
			futex_wait(word, val);
		atomic_fetch_sub(sleepers, 1);
	}
}

static void *worker_main(void *arg)
{
	struct pool_worker *w = arg;
	struct pool *p = w->pool;
	uint32_t seen = 0;

	for (;;) {
		wait_change(p, &p->start_gen, seen, &p->start_sleepers, p->yield_idle);
		seen = atomic_load(&p->start_gen);
		if (p->stop)
			break;
		/* A client woken onto this CPU just before the job came (its token was
		 * emitted as the step began) would otherwise wait out the whole step. */
		if (p->yield_idle)
			sched_yield();
		p->fn(p->arg, w->index, p->n_threads);
		if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_sleeping))
			futex_wake_all(&p->pending);
	}
	return NULL;
}

static void pool_stop_workers(struct pool *p)
{
	p->stop = true;
	atomic_fetch_add(&p->start_gen, 1);
	futex_wake_all(&p->start_gen);
	for (size_t i = 0; i < p->n_started; i++)
		pthread_join(p->workers[i].thread, NULL);
	p->n_started = 0;
}

int pool_create(struct pool **out, size_t n_threads, const int *cpus, unsigned spin, unsigned flags)
{
	struct pool *p;
	int rc = HEARTH_EIO;
	int sys = 0; /* a pthread call's error number, for HEARTH_EIO */

	*out = NULL;
	if (n_threads == 0 || n_threads > CPU_SETSIZE)
		return HEARTH_EINVAL;
	if (posix_memalign((void **)&p, 64, sizeof(*p)) != 0)
		return HEARTH_ENOMEM;
	memset(p, 0, sizeof(*p));
	p->n_threads = n_threads;
	p->spin = spin ? spin : POOL_DEFAULT_SPIN;
	p->yield_idle = flags & POOL_YIELD_IDLE;
	p->workers = calloc(n_threads, sizeof(*p->workers));
	if (p->workers == NULL) {
		free(p);
		return HEARTH_ENOMEM;
	}
	if (cpus && (flags & POOL_PIN_CALLER)) {
		cpu_set_t set;

		if (cpus[0] < 0 || cpus[0] >= CPU_SETSIZE) {
			rc = HEARTH_EINVAL;
			goto fail;
		}
		CPU_ZERO(&set);
		CPU_SET(cpus[0], &set);
		sys = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
		if (sys != 0)
			goto fail;
	}
	for (size_t i = 1; i < n_threads; i++) {
		struct pool_worker *w = &p->workers[i - 1];
		pthread_attr_t attr;

		w->pool = p;
		w->index = i;
		sys = pthread_attr_init(&attr);
		if (sys != 0)
			goto fail;
		if (cpus) {
			cpu_set_t set;

			if (cpus[i] < 0 || cpus[i] >= CPU_SETSIZE) {
				pthread_attr_destroy(&attr);
				rc = HEARTH_EINVAL;
				goto fail;
			}
			CPU_ZERO(&set);
			CPU_SET(cpus[i], &set);
			sys = pthread_attr_setaffinity_np(&attr, sizeof(set), &set);
		}
		if (sys == 0)
			sys = pthread_create(&w->thread, &attr, worker_main, w);
		pthread_attr_destroy(&attr);
		if (sys != 0)
			goto fail;
		p->n_started++;
	}
	*out = p;
	return 0;
fail:
	pool_stop_workers(p);
	free(p->workers);
	free(p);
	if (rc == HEARTH_EIO)
		errno = sys;
	return rc;
}

void pool_destroy(struct pool *p)
{
	if (p == NULL)
		return;
	pool_stop_workers(p);
	free(p->workers);
	free(p);
}

size_t pool_threads(const struct pool *p)
{
	return p->n_threads;
}

void pool_run(struct pool *p, pool_fn fn, void *arg)
{
	if (p->n_threads == 1) {
		fn(arg, 0, 1);
		return;
	}
	p->fn = fn;
	p->arg = arg;
	atomic_store(&p->pending, (uint32_t)(p->n_threads - 1));
	atomic_fetch_add(&p->start_gen, 1);
	if (atomic_load(&p->start_sleepers))
		futex_wake_all(&p->start_gen);
	fn(arg, 0, p->n_threads);
	for (unsigned i = 0; i < p->spin; i++) {
		if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0)
			return;
		cpu_relax();
	}
	atomic_store(&p->caller_sleeping, 1);
	for (uint32_t v; (v = atomic_load(&p->pending)) != 0;)
		futex_wait(&p->pending, v);
	atomic_store(&p->caller_sleeping, 0);
}

void pool_barrier(struct pool *p)
{
	if (p->n_threads == 1)
		return;
	uint32_t gen = atomic_load(&p->bar_gen);

	if (atomic_fetch_add(&p->bar_count, 1) == p->n_threads - 1) {
		/* Reset before releasing: nobody re-enters until bar_gen moves. */
		atomic_store(&p->bar_count, 0);
		atomic_fetch_add(&p->bar_gen, 1);
		if (atomic_load(&p->bar_sleepers))
			futex_wake_all(&p->bar_gen);
		return;
	}
	wait_change(p, &p->bar_gen, gen, &p->bar_sleepers, false);
}

void pool_split(size_t n, size_t align, size_t t, size_t n_threads, size_t *begin, size_t *end)
{
	size_t units = (n + align - 1) / align;
	size_t per = units / n_threads, extra = units % n_threads;
	size_t u0 = t * per + (t < extra ? t : extra);
	size_t u1 = u0 + per + (t < extra ? 1 : 0);

	*begin = u0 * align < n ? u0 * align : n;
	*end = u1 * align < n ? u1 * align : n;
}
