/* Tests of the engine interface's warm-up step (engine.h) against a scripted engine: the
 * step runs one token on a fresh sequence, closes it, and hands back the failing call's
 * error, which hearthd then refuses to serve. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "daemon/engine/engine.h"

struct scripted {
	int open_rc, forward_rc;
	int opened, closed, forwards;
	int32_t token_seen;
	uint32_t n_seen;
	struct engine_seq *seq_given, *seq_closed;
};

static int s_seq_open(void *impl, const int32_t *prompt, uint32_t n_prompt, uint32_t n_reserve, uint64_t share,
		      struct engine_seq **out, uint32_t *n_cached, struct hearth_error *err)
{
	struct scripted *s = impl;
	if (s->open_rc < 0)
		return hearth_error_set(err, s->open_rc, "scripted: no sequence");
	s->opened++;
	*out = s->seq_given;
	*n_cached = 0;
	return 0;
}

static void s_seq_close(void *impl, struct engine_seq *seq)
{
	struct scripted *s = impl;
	s->closed++;
	s->seq_closed = seq;
}

static int s_forward(void *impl, const struct engine_span *spans, size_t n_spans,
		     struct hearth_error *err)
{
	struct scripted *s = impl;
	s->forwards++;
	assert_int_equal(n_spans, 1);
	assert_ptr_equal(spans[0].seq, s->seq_given);
	s->token_seen = spans[0].tokens[0];
	s->n_seen = spans[0].n;
	if (s->forward_rc < 0)
		return hearth_error_set(err, s->forward_rc, "scripted: step %d failed", s->forwards);
	return 0;
}

static struct engine scripted_engine(struct scripted *s)
{
	static int seq_tag;
	s->seq_given = (struct engine_seq *)&seq_tag;
	return (struct engine){ .impl = s, .n_vocab = 100, .max_context = 16, .seq_open = s_seq_open,
				.seq_close = s_seq_close, .forward = s_forward };
}

static void test_engine_warm_up_steps_one_token_and_closes_the_sequence(void **state)
{
	(void)state;
	struct scripted s = { 0 };
	struct engine eng = scripted_engine(&s);
	struct hearth_error e;
	assert_int_equal(engine_warm_up(&eng, 7, &e), 0);
	assert_int_equal(s.opened, 1);
	assert_int_equal(s.forwards, 1);
	assert_int_equal(s.token_seen, 7);
	assert_int_equal(s.n_seen, 1);
	assert_int_equal(s.closed, 1);
	assert_ptr_equal(s.seq_closed, s.seq_given);
}

static void test_engine_warm_up_reports_a_failed_step_and_still_closes(void **state)
{
	(void)state;
	struct scripted s = { .forward_rc = HEARTH_EIO };
	struct engine eng = scripted_engine(&s);
	struct hearth_error e;
	assert_int_equal(engine_warm_up(&eng, 3, &e), HEARTH_EIO);
	assert_int_equal(e.code, HEARTH_EIO);
	assert_non_null(strstr(e.msg, "step 1 failed"));
	assert_int_equal(s.closed, 1);
}

static void test_engine_warm_up_reports_a_sequence_it_cannot_open(void **state)
{
	(void)state;
	struct scripted s = { .open_rc = HEARTH_EKVFULL };
	struct engine eng = scripted_engine(&s);
	struct hearth_error e;
	assert_int_equal(engine_warm_up(&eng, 3, &e), HEARTH_EKVFULL);
	assert_non_null(strstr(e.msg, "no sequence"));
	assert_int_equal(s.forwards, 0);
	assert_int_equal(s.closed, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_engine_warm_up_steps_one_token_and_closes_the_sequence),
		cmocka_unit_test(test_engine_warm_up_reports_a_failed_step_and_still_closes),
		cmocka_unit_test(test_engine_warm_up_reports_a_sequence_it_cannot_open),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
