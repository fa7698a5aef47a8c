/* Token sampling for one sequence: repetition penalty, then greedy or top-k / top-p /
 * min-p / temperature and a seeded draw, in llama.cpp's order and with its semantics. Each
 * sampler owns its PRNG state and history, so sequences never share randomness. */
#ifndef HEARTH_DAEMON_SAMPLER_H
#define HEARTH_DAEMON_SAMPLER_H

#include <stdint.h>

#include "protocol/error.h"

struct sampler;

struct sampler_params {
	float temperature;      /* <= 0: greedy (the highest logit, lowest id on ties) */
	int32_t top_k;          /* keep the k highest; <= 0: off */
	float top_p;            /* keep the smallest top set with probability >= p; >= 1: off */
	float min_p;            /* keep tokens with probability >= min_p x the top one; <= 0: off */
	float repeat_penalty;   /* divide positive / multiply negative logits of recent tokens; 1: off */
	uint32_t repeat_last_n; /* how many recent tokens the penalty looks at; 0: off */
	uint64_t seed;
};

/* llama.cpp's defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, no repetition
 * penalty (1.0, last 64), seed 0. */
void sampler_params_default(struct sampler_params *p);

/* HEARTH_EINVAL names a parameter out of range (NaN, negative temperature is fine = greedy,
 * top_p <= 0, min_p > 1, penalty <= 0); n_vocab must be positive. */
int sampler_new(struct sampler **out, const struct sampler_params *p, uint32_t n_vocab,
		struct hearth_error *err);
void sampler_free(struct sampler *s);

/* Records a token in the history the repetition penalty sees: feed the prompt and every
 * generated token. Tokens outside the vocabulary are ignored. */
void sampler_accept(struct sampler *s, int32_t token);

/* Picks the next token from n_vocab logits (not modified). Deterministic for a given seed,
 * history and sequence of calls. */
int32_t sampler_sample(struct sampler *s, const float *logits);

/* Forgets the history and restarts the PRNG from the seed. */
void sampler_reset(struct sampler *s);

#endif
