/* hearth_assert: a check of the code's own invariants (a count that cannot go negative, an
 * index the code itself computed), never of input, which gets a HEARTH_E* value. On when
 * HEARTH_DEBUG is defined; off (the condition is not evaluated) otherwise. */
#ifndef HEARTH_PROTOCOL_ASSERT_H
#define HEARTH_PROTOCOL_ASSERT_H

/* configure defines HEARTH_DEBUG unless given --disable-debug, so every build that runs
 * make check has the checks on; release builds configure with --disable-debug. */
#ifdef HEARTH_DEBUG

#include <stdio.h>
#include <stdlib.h>

/* Reports where and what failed, then aborts: a broken invariant means state that cannot be
 * trusted any more, and a core dump at the spot is the best evidence. */
static inline _Noreturn void hearth_assert_fail(const char *cond, const char *file, int line,
						 const char *func)
{
	fprintf(stderr, "%s:%d: %s: invariant violated: %s\n", file, line, func, cond);
	fflush(stderr);
	abort();
}

#define hearth_assert(cond) \
	((cond) ? (void)0 : hearth_assert_fail(#cond, __FILE__, __LINE__, __func__))
#define HEARTH_ASSERT_ON 1

#else

/* sizeof keeps the condition type-checked (and its variables used) without running it. */
#define hearth_assert(cond) ((void)sizeof(!(cond)))
#define HEARTH_ASSERT_ON 0

#endif

#endif
