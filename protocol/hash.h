/* FNV-1a, 64 bits: the one byte hash hearth names and indexes things by (GGUF key lookup,
 * the tokenizer's piece table, imatrix = self's cache names). Not a defence against anyone
 * choosing the input: a name, not a MAC. */
#ifndef HEARTH_PROTOCOL_HASH_H
#define HEARTH_PROTOCOL_HASH_H

#include <stddef.h>
#include <stdint.h>

#define HEARTH_FNV1A_SEED 0xcbf29ce484222325ull

/* h continued over n bytes at p (HEARTH_FNV1A_SEED to start). */
static inline uint64_t hearth_fnv1a(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

#endif
