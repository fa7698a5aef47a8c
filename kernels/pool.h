/* A fixed team of compute threads, each pinned to one given cpu (the caller passes its
 * NUMA node's cpu list). pool_run hands every thread the same function; work is split
 * by output rows (pool_split). Waiting spins first and sleeps on a futex after, so the
 * hot path (run, barrier, finish) makes no system call and allocates nothing. */
#ifndef HEARTH_KERNELS_POOL_H
#define HEARTH_KERNELS_POOL_H

#include <stdbool.h>
#include <stddef.h>

#include "protocol/error.h"

struct pool;

/* Called on every thread of the pool; thread 0 is the caller of pool_run. */
typedef void (*pool_fn)(void *arg, size_t thread, size_t n_threads);

#define POOL_PIN_CALLER 1u   /* also pin the creating thread to cpus[0] */
/* Workers waiting for the next job yield the CPU every ~1 us of spinning, and once more
 * when the job arrives, so that a task woken on their CPU between jobs (a client reading
 * the token just sampled) runs at once instead of after the worker's time slice. */
#define POOL_YIELD_IDLE 2u

/* Creates a pool of n_threads threads: the caller (thread 0) plus n_threads-1 workers.
 * With cpus (n_threads entries), worker i is pinned to cpus[i] before it runs anything;
 * cpus NULL leaves placement to the OS (tests). spin is how many pause-loops a waiting
 * thread spins before it sleeps (0 picks a default). Returns 0, HEARTH_EINVAL for a bad
 * count or CPU, HEARTH_ENOMEM, or HEARTH_EIO with errno set to the pthread call's error. */
int pool_create(struct pool **out, size_t n_threads, const int *cpus, unsigned spin, unsigned flags);

/* Stops and joins the workers and frees the pool. NULL is fine. */
void pool_destroy(struct pool *p);

size_t pool_threads(const struct pool *p);

/* Runs fn(arg, t, n) on every thread t < n, the caller's share as t = 0, and returns
 * when all are done. Not reentrant: one pool_run at a time, from one thread. */
void pool_run(struct pool *p, pool_fn fn, void *arg);

/* Inside fn: waits until every thread of the pool has reached it (between ops of one
 * forward pass, so a step needs one pool_run, not one per op). */
void pool_barrier(struct pool *p);

/* [*begin, *end) of n items for thread t of n_threads, split in whole units of `align`
 * items (Q4_ROWS for matmul rows) so no two threads write the same row block. */
void pool_split(size_t n, size_t align, size_t t, size_t n_threads, size_t *begin, size_t *end);

#endif
