/* `hearth bench`: the serving benchmark of the CLI. N client processes (fork, one connection
 * each) generate at once against a running hearthd; it reports aggregate and per-client
 * tokens/s, time to first token and the per-token IPC latency. Uses only hearth.h. */
#ifndef HEARTH_CLIENT_BENCH_H
#define HEARTH_CLIENT_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BENCH_LEVELS_MAX 16

struct bench_opts {
	const char *socket;       /* NULL: libhearth's default */
	int timeout_ms;           /* the connections' idle timeout (0 = libhearth's default) */
	uint32_t clients[BENCH_LEVELS_MAX]; /* concurrency levels, run in this order */
	size_t n_levels;
	uint32_t prompt_tokens;   /* prompt length in tokens (ids drawn from the seed) */
	uint32_t tokens;          /* tokens each client generates (EOS ignored) */
	uint64_t seed;
	bool json;
	int verbose;              /* > 0: one line per client too */
	unsigned spin_us;         /* each client's hearth_connect_opts.spin_us */
};

/* Runs every level and prints the report on stdout. Returns the CLI's exit status: 0 ok,
 * 1 when a client failed or generated fewer tokens than asked (messages on stderr). */
int bench_run(const struct bench_opts *o);

#endif
