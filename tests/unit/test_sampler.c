/* The sampler: exact greedy choices and repetition penalty arithmetic, and the distributions
 * of temperature, top-k, top-p and min-p checked statistically with fixed seeds against the
 * probabilities computed by hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/sampler.h"

#define DRAWS 100000

static struct sampler *new_sampler(const struct sampler_params *p, uint32_t n_vocab)
{
	struct hearth_error err = { 0 };
	struct sampler *s = NULL;
	if (sampler_new(&s, p, n_vocab, &err) < 0)
		fail_msg("%s", err.msg);
	return s;
}

/* Everything off: plain temperature-1 sampling unless the test turns something on. */
static struct sampler_params plain(void)
{
	struct sampler_params p = {
		.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
		.repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 42,
	};
	return p;
}

/* Draws DRAWS tokens and requires each token's frequency within 0.01 of want[] (the
 * standard error at 1e5 draws is at most 0.0016, so 0.01 is over six of them). */
static void check_freq(const struct sampler_params *p, const float *logits, const double *want,
		       uint32_t n)
{
	struct sampler *s = new_sampler(p, n);
	unsigned *count = calloc(n, sizeof(*count));

	assert_non_null(count);
	for (int i = 0; i < DRAWS; i++) {
		int32_t t = sampler_sample(s, logits);
		assert_true(t >= 0 && (uint32_t)t < n);
		count[t]++;
	}
	for (uint32_t i = 0; i < n; i++) {
		double f = (double)count[i] / DRAWS;
		if (fabs(f - want[i]) > 0.01)
			fail_msg("token %u: frequency %.4f, expected %.4f", i, f, want[i]);
		if (want[i] == 0.0)
			assert_int_equal(count[i], 0);
	}
	free(count);
	sampler_free(s);
}

/* logits = log(p) for p = 0.2, 0.5, 0.3 (token 1 is the most likely; ids out of order so
 * nothing relies on sorted input). */
static const float base_p[3] = { 0.2f, 0.5f, 0.3f };

static void base_logits(float *l)
{
	for (int i = 0; i < 3; i++)
		l[i] = logf(base_p[i]);
}

static void test_sampler_greedy_picks_argmax_lowest_id_on_ties(void **state)
{
	struct sampler_params p = plain();
	float l[5] = { 0.5f, 2.0f, -1.0f, 2.0f, 1.9f };
	struct sampler *s;
	(void)state;

	p.temperature = 0.0f;
	s = new_sampler(&p, 5);
	for (int i = 0; i < 100; i++)
		assert_int_equal(sampler_sample(s, l), 1);
	sampler_free(s);

	p.temperature = -1.0f; /* negative is greedy too, as in llama.cpp */
	s = new_sampler(&p, 5);
	assert_int_equal(sampler_sample(s, l), 1);
	sampler_free(s);
}

static void test_sampler_temperature_one_follows_softmax(void **state)
{
	struct sampler_params p = plain();
	float l[3];
	const double want[3] = { 0.2, 0.5, 0.3 };
	(void)state;
	base_logits(l);
	check_freq(&p, l, want, 3);
}

static void test_sampler_temperature_sharpens_and_flattens(void **state)
{
	struct sampler_params p = plain();
	float l[3];
	double want[3], z = 0;
	(void)state;
	base_logits(l);

	/* T = 0.5: p^2 renormalized. */
	p.temperature = 0.5f;
	for (int i = 0; i < 3; i++)
		z += (double)base_p[i] * base_p[i];
	for (int i = 0; i < 3; i++)
		want[i] = (double)base_p[i] * base_p[i] / z;
	check_freq(&p, l, want, 3);

	/* T = 2: sqrt(p) renormalized. */
	p.temperature = 2.0f;
	z = 0;
	for (int i = 0; i < 3; i++)
		z += sqrt(base_p[i]);
	for (int i = 0; i < 3; i++)
		want[i] = sqrt(base_p[i]) / z;
	check_freq(&p, l, want, 3);
}

static void test_sampler_top_k_keeps_k_best(void **state)
{
	struct sampler_params p = plain();
	float l[3];
	const double want2[3] = { 0.0, 0.5 / 0.8, 0.3 / 0.8 };
	const double want1[3] = { 0.0, 1.0, 0.0 };
	(void)state;
	base_logits(l);
	p.top_k = 2;
	check_freq(&p, l, want2, 3);
	p.top_k = 1;
	check_freq(&p, l, want1, 3);
	p.top_k = 3; /* = vocabulary: no change */
	{
		const double want[3] = { 0.2, 0.5, 0.3 };
		check_freq(&p, l, want, 3);
	}
}

/* top-k on a larger vocabulary exercises the selection (not just sorting of 3). */
static void test_sampler_top_k_selects_from_large_vocab(void **state)
{
	enum { N = 5000 };
	struct sampler_params p = plain();
	float *l = malloc(N * sizeof(float));
	double *want = calloc(N, sizeof(double));
	uint32_t x = 7;
	(void)state;

	assert_true(l && want);
	for (int i = 0; i < N; i++) {
		x = x * 1664525u + 1013904223u;
		l[i] = (float)(x >> 8) / (float)(1u << 24) * 4.0f - 8.0f; /* in [-8, -4) */
	}
	l[4321] = 1.0f;  /* the four best, with probabilities e^1 : e^0.5 : e^0 : e^0 */
	l[17] = 0.5f;
	l[2500] = 0.0f;
	l[9] = 0.0f;
	double z = exp(1.0) + exp(0.5) + 2.0;
	want[4321] = exp(1.0) / z;
	want[17] = exp(0.5) / z;
	want[2500] = 1.0 / z;
	want[9] = 1.0 / z;
	p.top_k = 4;
	check_freq(&p, l, want, N);
	free(l);
	free(want);
}

static void test_sampler_top_p_keeps_smallest_sufficient_set(void **state)
{
	struct sampler_params p = plain();
	float l[3];
	(void)state;
	base_logits(l);

	/* Sorted: 0.5, 0.3, 0.2. p = 0.6 needs 0.5 + 0.3. */
	p.top_p = 0.6f;
	{
		const double want[3] = { 0.0, 0.5 / 0.8, 0.3 / 0.8 };
		check_freq(&p, l, want, 3);
	}
	/* p = 0.45: the top token alone reaches it. */
	p.top_p = 0.45f;
	{
		const double want[3] = { 0.0, 1.0, 0.0 };
		check_freq(&p, l, want, 3);
	}
	/* p = 0.85 needs all three. */
	p.top_p = 0.85f;
	{
		const double want[3] = { 0.2, 0.5, 0.3 };
		check_freq(&p, l, want, 3);
	}
}

static void test_sampler_min_p_is_relative_to_top_probability(void **state)
{
	struct sampler_params p = plain();
	float l[3];
	(void)state;
	base_logits(l);

	/* min_p 0.5: keep p >= 0.25, i.e. 0.5 and 0.3. */
	p.min_p = 0.5f;
	{
		const double want[3] = { 0.0, 0.5 / 0.8, 0.3 / 0.8 };
		check_freq(&p, l, want, 3);
	}
	/* min_p 0.7: keep p >= 0.35: only the top. */
	p.min_p = 0.7f;
	{
		const double want[3] = { 0.0, 1.0, 0.0 };
		check_freq(&p, l, want, 3);
	}
	/* min_p 0.3 with top_k off: 0.2 >= 0.15 stays. */
	p.min_p = 0.3f;
	{
		const double want[3] = { 0.2, 0.5, 0.3 };
		check_freq(&p, l, want, 3);
	}
}

/* Filters before temperature (llama.cpp's order): top_k 2 at T = 0.5 samples 0.5^2 : 0.3^2. */
static void test_sampler_filters_apply_before_temperature(void **state)
{
	struct sampler_params p = plain();
	float l[3];
	(void)state;
	base_logits(l);
	p.top_k = 2;
	p.temperature = 0.5f;
	{
		const double z = 0.25 + 0.09;
		const double want[3] = { 0.0, 0.25 / z, 0.09 / z };
		check_freq(&p, l, want, 3);
	}
}

static void test_sampler_repeat_penalty_divides_positive_multiplies_negative(void **state)
{
	struct sampler_params p = plain();
	struct sampler *s;
	(void)state;

	p.temperature = 0.0f;
	p.repeat_penalty = 1.5f;

	/* 2.0 / 1.5 = 1.33 > 1.0: one division, even though token 0 occurred twice
	 * (twice would be 0.89 < 1.0). */
	{
		const float l[2] = { 2.0f, 1.0f };
		s = new_sampler(&p, 2);
		sampler_accept(s, 0);
		sampler_accept(s, 0);
		assert_int_equal(sampler_sample(s, l), 0);
		sampler_free(s);
	}
	/* 2.0 / 1.5 = 1.33 < 1.4. */
	{
		const float l[2] = { 2.0f, 1.4f };
		s = new_sampler(&p, 2);
		sampler_accept(s, 0);
		assert_int_equal(sampler_sample(s, l), 1);
		sampler_free(s);
	}
	/* Negative: -1.0 * 1.5 = -1.5 < -1.2 (dividing would have raised it to -0.67). */
	{
		const float l[2] = { -1.0f, -1.2f };
		s = new_sampler(&p, 2);
		sampler_accept(s, 0);
		assert_int_equal(sampler_sample(s, l), 1);
		sampler_free(s);
	}
	/* The logits array itself is not modified. */
	{
		const float l[2] = { 2.0f, 1.4f };
		float copy[2];
		memcpy(copy, l, sizeof(copy));
		s = new_sampler(&p, 2);
		sampler_accept(s, 0);
		(void)sampler_sample(s, copy);
		assert_memory_equal(copy, l, sizeof(copy));
		sampler_free(s);
	}
}

static void test_sampler_repeat_penalty_sees_only_last_n(void **state)
{
	struct sampler_params p = plain();
	const float l[3] = { 2.0f, 1.4f, 0.0f };
	struct sampler *s;
	(void)state;

	p.temperature = 0.0f;
	p.repeat_penalty = 1.5f;
	p.repeat_last_n = 3;
	s = new_sampler(&p, 3);
	sampler_accept(s, 0);
	assert_int_equal(sampler_sample(s, l), 1);
	sampler_accept(s, 2);
	sampler_accept(s, 2);
	assert_int_equal(sampler_sample(s, l), 1); /* 0 still among the last 3 */
	sampler_accept(s, 2);
	assert_int_equal(sampler_sample(s, l), 0); /* 0 has left the window */
	sampler_reset(s);
	sampler_accept(s, 0);
	assert_int_equal(sampler_sample(s, l), 1);
	sampler_free(s);

	p.repeat_last_n = 0; /* off */
	s = new_sampler(&p, 3);
	sampler_accept(s, 0);
	assert_int_equal(sampler_sample(s, l), 0);
	sampler_free(s);
}

static void test_sampler_same_seed_same_draws_and_states_independent(void **state)
{
	struct sampler_params p = plain();
	float l[3];
	struct sampler *a, *b, *c;
	int32_t seq_a[200];
	int differ = 0;
	(void)state;
	base_logits(l);

	a = new_sampler(&p, 3);
	for (int i = 0; i < 200; i++)
		seq_a[i] = sampler_sample(a, l);

	/* Same seed, interleaved with another sampler: the same sequence. */
	sampler_reset(a);
	p.seed = 43;
	c = new_sampler(&p, 3);
	p.seed = 42;
	b = new_sampler(&p, 3);
	for (int i = 0; i < 200; i++) {
		int32_t from_c = sampler_sample(c, l);
		assert_int_equal(sampler_sample(b, l), seq_a[i]);
		assert_int_equal(sampler_sample(a, l), seq_a[i]);
		differ += from_c != seq_a[i];
	}
	/* Seed 43 is a different stream (equal by chance at ~38% of draws). */
	assert_true(differ > 50);
	sampler_free(a);
	sampler_free(b);
	sampler_free(c);
}

static void test_sampler_rejects_bad_parameters(void **state)
{
	struct sampler_params p = plain();
	struct hearth_error err = { 0 };
	struct sampler *s = NULL;
	(void)state;

	assert_int_equal(sampler_new(&s, &p, 0, &err), HEARTH_EINVAL);
	p.temperature = NAN;
	assert_int_equal(sampler_new(&s, &p, 3, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "temperature"));
	p = plain();
	p.top_p = -0.1f;
	assert_int_equal(sampler_new(&s, &p, 3, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "top_p"));
	p = plain();
	p.min_p = 1.5f;
	assert_int_equal(sampler_new(&s, &p, 3, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "min_p"));
	p = plain();
	p.repeat_penalty = 0.0f;
	assert_int_equal(sampler_new(&s, &p, 3, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "repeat_penalty"));
	assert_null(s);
}

static void test_sampler_defaults_are_llama_cpp_defaults(void **state)
{
	struct sampler_params p;
	(void)state;
	sampler_params_default(&p);
	assert_float_equal(p.temperature, 0.8f, 0);
	assert_int_equal(p.top_k, 40);
	assert_float_equal(p.top_p, 0.95f, 0);
	assert_float_equal(p.min_p, 0.05f, 0);
	assert_float_equal(p.repeat_penalty, 1.0f, 0);
	assert_int_equal(p.repeat_last_n, 64);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sampler_greedy_picks_argmax_lowest_id_on_ties),
		cmocka_unit_test(test_sampler_temperature_one_follows_softmax),
		cmocka_unit_test(test_sampler_temperature_sharpens_and_flattens),
		cmocka_unit_test(test_sampler_top_k_keeps_k_best),
		cmocka_unit_test(test_sampler_top_k_selects_from_large_vocab),
		cmocka_unit_test(test_sampler_top_p_keeps_smallest_sufficient_set),
		cmocka_unit_test(test_sampler_min_p_is_relative_to_top_probability),
		cmocka_unit_test(test_sampler_filters_apply_before_temperature),
		cmocka_unit_test(test_sampler_repeat_penalty_divides_positive_multiplies_negative),
		cmocka_unit_test(test_sampler_repeat_penalty_sees_only_last_n),
		cmocka_unit_test(test_sampler_same_seed_same_draws_and_states_independent),
		cmocka_unit_test(test_sampler_rejects_bad_parameters),
		cmocka_unit_test(test_sampler_defaults_are_llama_cpp_defaults),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
