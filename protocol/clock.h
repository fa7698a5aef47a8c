/* The one clock hearth measures with: CLOCK_MONOTONIC in nanoseconds. Daemon and client
 * read the same clock, so a token's t_sampled_ns (protocol/ring.h) and a client's receive
 * time are comparable on one machine. */
#ifndef HEARTH_PROTOCOL_CLOCK_H
#define HEARTH_PROTOCOL_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t hearth_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
