/* What each fuzz target gives the standalone driver (fuzz_main.c): its libFuzzer entry
 * point and a few valid inputs to start mutating from. Under `make fuzz` libFuzzer drives
 * the same entry point and the seeds are not used. */
#ifndef HEARTH_TESTS_FUZZ_H
#define HEARTH_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef void (*fuzz_seed_fn)(void *ctx, const uint8_t *data, size_t size);
void fuzz_seeds(fuzz_seed_fn add, void *ctx);

/* Aborts with a message: a broken invariant is a finding, like a sanitizer report. */
#define FUZZ_CHECK(cond) \
	do { \
		if (!(cond)) \
			fuzz_fail(__FILE__, __LINE__, #cond); \
	} while (0)
void fuzz_fail(const char *file, int line, const char *what) __attribute__((noreturn));

#endif
