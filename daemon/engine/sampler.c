/* Sampling one token from logits, per sequence. The steps and their order follow
 * llama.cpp's default chain (penalties, top-k, top-p, min-p, temperature, draw), so a
 * setting means what it means there; the PRNG is our own (xoshiro256**), so draws differ. */
#include "daemon/engine/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dispatch.h"

struct cand {
	int32_t id;
	float logit;
};

struct sampler {
	struct sampler_params p;
	uint32_t n_vocab;
	uint64_t rng[4];
	struct cand *cand;      /* n_vocab */
	int32_t *hist;          /* ring of the last repeat_last_n accepted tokens */
	int32_t *hist_sorted;   /* scratch: the ring, sorted, to penalize each token once */
	uint32_t hist_len, hist_cap, hist_head;
};

/* ---- PRNG: xoshiro256**, seeded through splitmix64 so nearby seeds diverge at once. ---- */

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += UINT64_C(0x9E3779B97F4A7C15));
	z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
	return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(uint64_t s[4])
{
	const uint64_t result = rotl(s[1] * 5, 7) * 9;
	const uint64_t t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4])
{
	return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

static void rng_seed(uint64_t s[4], uint64_t seed)
{
	uint64_t x = seed;
	for (int i = 0; i < 4; i++)
		s[i] = splitmix64(&x);
}

/* ---- parameters and lifetime ---- */

void sampler_params_default(struct sampler_params *p)
{
	p->temperature = 0.8f;
	p->top_k = 40;
	p->top_p = 0.95f;
	p->min_p = 0.05f;
	p->repeat_penalty = 1.0f;
	p->repeat_last_n = 64;
	p->seed = 0;
}

int sampler_new(struct sampler **out, const struct sampler_params *p, uint32_t n_vocab,
		struct hearth_error *err)
{
	struct sampler *s;

	*out = NULL;
	if (n_vocab == 0)
		return hearth_error_set(err, HEARTH_EINVAL, "sampler: empty vocabulary");
	if (isnan(p->temperature))
		return hearth_error_set(err, HEARTH_EINVAL, "sampler: temperature is NaN");
	if (!(p->top_p >= 0.0f))
		return hearth_error_set(err, HEARTH_EINVAL, "sampler: top_p %g must be >= 0",
					(double)p->top_p);
	if (!(p->min_p <= 1.0f) || isnan(p->min_p))
		return hearth_error_set(err, HEARTH_EINVAL, "sampler: min_p %g must be <= 1",
					(double)p->min_p);
	if (!(p->repeat_penalty > 0.0f) || !isfinite(p->repeat_penalty))
		return hearth_error_set(err, HEARTH_EINVAL, "sampler: repeat_penalty %g must be > 0",
					(double)p->repeat_penalty);
	if (p->repeat_last_n > (1u << 20))
		return hearth_error_set(err, HEARTH_EINVAL, "sampler: repeat_last_n %u above %u",
					p->repeat_last_n, 1u << 20);

	s = calloc(1, sizeof(*s));
	if (!s)
		return hearth_error_set(err, HEARTH_ENOMEM, "sampler: out of memory");
	s->p = *p;
	s->n_vocab = n_vocab;
	s->hist_cap = p->repeat_last_n;
	s->cand = calloc(n_vocab, sizeof(*s->cand));
	s->hist = calloc(s->hist_cap ? s->hist_cap : 1, sizeof(*s->hist));
	s->hist_sorted = calloc(s->hist_cap ? s->hist_cap : 1, sizeof(*s->hist_sorted));
	if (!s->cand || !s->hist || !s->hist_sorted) {
		sampler_free(s);
		return hearth_error_set(err, HEARTH_ENOMEM, "sampler: out of memory for %u tokens",
					n_vocab);
	}
	rng_seed(s->rng, p->seed);
	*out = s;
	return 0;
}

void sampler_free(struct sampler *s)
{
	if (!s)
		return;
	free(s->cand);
	free(s->hist);
	free(s->hist_sorted);
	free(s);
}

void sampler_reset(struct sampler *s)
{
	s->hist_len = 0;
	s->hist_head = 0;
	rng_seed(s->rng, s->p.seed);
}

void sampler_accept(struct sampler *s, int32_t token)
{
	if (s->hist_cap == 0 || token < 0 || (uint32_t)token >= s->n_vocab)
		return;
	s->hist[s->hist_head] = token;
	s->hist_head = (s->hist_head + 1) % s->hist_cap;
	if (s->hist_len < s->hist_cap)
		s->hist_len++;
}

/* ---- the steps ---- */

static int cmp_int32(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	return (x > y) - (x < y);
}

/* "a before b": higher logit first, lower id on ties, so every order is total and
 * results never depend on qsort's or the selection's tie handling. */
static int cand_before(const struct cand *a, const struct cand *b)
{
	return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cmp_cand(const void *a, const void *b)
{
	return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

static void cand_swap(struct cand *a, struct cand *b)
{
	struct cand t = *a;
	*a = *b;
	*b = t;
}

/* Rearranges c so that c[0..k) are the k best (in no order): quickselect, O(n) on average,
 * where sorting the whole vocabulary would be O(n log n) for every token. */
static void cand_select(struct cand *c, size_t n, size_t k)
{
	size_t lo = 0, hi = n;

	while (hi - lo > 1) {
		size_t store = lo;

		cand_swap(&c[lo + (hi - lo) / 2], &c[hi - 1]);
		for (size_t i = lo; i < hi - 1; i++)
			if (cand_before(&c[i], &c[hi - 1]))
				cand_swap(&c[i], &c[store++]);
		cand_swap(&c[store], &c[hi - 1]);
		/* c[lo..store) beat the pivot, now at store. */
		if (store == k || store + 1 == k)
			return;
		if (k < store)
			hi = store;
		else
			lo = store + 1;
	}
}

/* llama.cpp's repetition penalty: each distinct token among the last repeat_last_n has
 * its logit divided by the penalty if positive, multiplied if not; once, however often
 * it occurred. c is still indexed by token id here. */
static void apply_penalty(struct sampler *s, struct cand *c)
{
	if (s->p.repeat_penalty == 1.0f || s->hist_len == 0)
		return;
	memcpy(s->hist_sorted, s->hist, s->hist_len * sizeof(*s->hist));
	qsort(s->hist_sorted, s->hist_len, sizeof(*s->hist_sorted), cmp_int32);
	for (uint32_t i = 0; i < s->hist_len; i++) {
		float *l;

		if (i > 0 && s->hist_sorted[i] == s->hist_sorted[i - 1])
			continue;
		l = &c[s->hist_sorted[i]].logit;
		*l = *l > 0.0f ? *l / s->p.repeat_penalty : *l * s->p.repeat_penalty;
	}
}

int32_t sampler_sample(struct sampler *s, const float *logits)
{
	struct cand *c = s->cand;
	size_t n = s->n_vocab;
	bool sorted = false;
	float max;

	/* Greedy without a penalty: the argmax of the row itself (highest logit, lowest id on
	 * a tie, as cand_before orders them), by the vector kernel: copying a 150k-entry row
	 * into candidates would cost the compute thread ten times as much per sequence and
	 * step, and a scalar loop several times as much. */
	if (!(s->p.temperature > 0.0f) && (s->p.repeat_penalty == 1.0f || s->hist_len == 0))
		return (int32_t)kern_active()->argmax(logits, n);

	for (size_t i = 0; i < n; i++) {
		c[i].id = (int32_t)i;
		c[i].logit = logits[i];
	}
	apply_penalty(s, c);

	if (!(s->p.temperature > 0.0f)) {
		size_t best = 0;
		for (size_t i = 1; i < n; i++)
			if (cand_before(&c[i], &c[best]))
				best = i;
		return c[best].id;
	}

	if (s->p.top_k > 0 && (size_t)s->p.top_k < n) {
		cand_select(c, n, (size_t)s->p.top_k);
		n = (size_t)s->p.top_k;
		qsort(c, n, sizeof(*c), cmp_cand);
		sorted = true;
	}

	if (s->p.top_p < 1.0f) {
		double sum = 0.0, cum = 0.0;

		if (!sorted) {
			qsort(c, n, sizeof(*c), cmp_cand);
			sorted = true;
		}
		for (size_t i = 0; i < n; i++)
			sum += exp((double)c[i].logit - c[0].logit);
		for (size_t i = 0; i < n; i++) {
			cum += exp((double)c[i].logit - c[0].logit) / sum;
			if (cum >= s->p.top_p) {
				n = i + 1;
				break;
			}
		}
	}

	max = c[0].logit;
	if (!sorted)
		for (size_t i = 1; i < n; i++)
			if (c[i].logit > max)
				max = c[i].logit;

	if (s->p.min_p > 0.0f) {
		/* p_i >= min_p * p_max  <=>  logit_i >= max + log(min_p). */
		const float floor = max + logf(s->p.min_p);
		size_t kept = 0;

		for (size_t i = 0; i < n; i++)
			if (c[i].logit >= floor)
				c[kept++] = c[i];
		n = kept;  /* the maximum always survives: kept >= 1 */
	}

	/* Temperature, softmax, draw. */
	{
		const double inv_t = 1.0 / s->p.temperature;
		double sum = 0.0, u, cum = 0.0;

		for (size_t i = 0; i < n; i++)
			sum += exp(((double)c[i].logit - max) * inv_t);
		u = rng_uniform(s->rng) * sum;
		for (size_t i = 0; i < n; i++) {
			cum += exp(((double)c[i].logit - max) * inv_t);
			if (u < cum)
				return c[i].id;
		}
		return c[n - 1].id;
	}
}
