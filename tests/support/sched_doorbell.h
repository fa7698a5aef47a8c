/* The scheduler's hand-back doorbell in its tests: sched_start gets sched_doorbell_ring with
 * a pointer to an eventfd as its context, and sched_doorbell_take waits on that eventfd for
 * the next message the scheduler hands back. Include after cmocka.h. */
#ifndef HEARTH_TESTS_SUPPORT_SCHED_DOORBELL_H
#define HEARTH_TESTS_SUPPORT_SCHED_DOORBELL_H

#include <poll.h>
#include <stdint.h>
#include <unistd.h>

#include "daemon/serve/sched.h"

static inline void sched_doorbell_ring(void *ctx)
{
	uint64_t one = 1;
	ssize_t r = write(*(const int *)ctx, &one, sizeof one);
	(void)r;
}

/* The next message s hands back; fails the test after seconds. */
static inline struct sched_msg *sched_doorbell_take(struct sched *s, int efd, int seconds)
{
	for (int i = 0; i < seconds * 100; i++) {
		struct sched_msg *m = sched_take(s);
		if (m)
			return m;
		struct pollfd pfd = { .fd = efd, .events = POLLIN };
		if (poll(&pfd, 1, 10) > 0) {
			uint64_t v;
			ssize_t r = read(efd, &v, sizeof v);
			(void)r;
		}
	}
	fail_msg("the scheduler handed nothing back within %d s", seconds);
	return NULL;
}

#endif
