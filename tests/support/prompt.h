/* Deterministic pseudo-random token ids for tests that need prompts of a given length:
 * the same seed gives the same ids in every test and every run. */
#ifndef HEARTH_TESTS_SUPPORT_PROMPT_H
#define HEARTH_TESTS_SUPPORT_PROMPT_H

#include <stdint.h>

/* p[0..n) = xorshift ids below n_vocab, from seed. */
static inline void test_prompt(uint32_t seed, int32_t *p, uint32_t n, uint32_t n_vocab)
{
	uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
	for (uint32_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (int32_t)(x % n_vocab);
	}
}

#endif
