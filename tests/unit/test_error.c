/* Tests of the one error space: every code has its own value and its own stable name (the
 * names reach logs and the CLI), and the message helpers fill, append and prefix without
 * overrunning the caller's buffer. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "protocol/error.h"

static const struct {
	int code;
	const char *name;
} codes[] = {
	{ HEARTH_OK, "ok" },
	{ HEARTH_EINVAL, "bad_value" },
	{ HEARTH_ENOMEM, "no_memory" },
	{ HEARTH_EIO, "io_error" },
	{ HEARTH_EFORMAT, "bad_format" },
	{ HEARTH_EUNSUPPORTED, "unsupported" },
	{ HEARTH_ERANGE, "too_large" },
	{ HEARTH_ENOTFOUND, "not_found" },
	{ HEARTH_EBUSY, "busy" },
	{ HEARTH_EKVFULL, "kv_full" },
	{ HEARTH_ECLOSED, "closed" },
	{ HEARTH_EPROTO, "protocol_error" },
	{ HEARTH_EPERM, "forbidden" },
	{ HEARTH_ETIMEDOUT, "timed_out" },
	{ HEARTH_ECANCELED, "canceled" },
	{ HEARTH_ESHUTDOWN, "shutting_down" },
};
#define N_CODES (sizeof codes / sizeof codes[0])

static void test_error_every_code_has_its_own_value_and_name(void **state)
{
	(void)state;
	/* The list above is every code: as many as the range 0..HEARTH_ECODE_LAST holds. */
	assert_int_equal(N_CODES, (size_t)(1 - HEARTH_ECODE_LAST));
	for (size_t i = 0; i < N_CODES; i++) {
		assert_true(codes[i].code <= 0 && codes[i].code >= HEARTH_ECODE_LAST);
		assert_string_equal(hearth_strerror(codes[i].code), codes[i].name);
		for (size_t j = 0; j < i; j++) {
			assert_int_not_equal(codes[i].code, codes[j].code);
			assert_string_not_equal(codes[i].name, codes[j].name);
		}
	}
}

static void test_error_every_code_in_the_range_is_named(void **state)
{
	(void)state;
	for (int c = 0; c >= HEARTH_ECODE_LAST; c--)
		assert_string_not_equal(hearth_strerror(c), "unknown_error");
	assert_string_equal(hearth_strerror(HEARTH_ECODE_LAST - 1), "unknown_error");
	assert_string_equal(hearth_strerror(1), "unknown_error");
}

static void test_error_set_fills_the_message_and_returns_the_code(void **state)
{
	(void)state;
	struct hearth_error e;
	assert_int_equal(hearth_error_set(&e, HEARTH_EFORMAT, "%s: byte %d", "x.gguf", 12),
			 HEARTH_EFORMAT);
	assert_int_equal(e.code, HEARTH_EFORMAT);
	assert_string_equal(e.msg, "x.gguf: byte 12");
	assert_int_equal(hearth_error_set(NULL, HEARTH_ERANGE, "ignored"), HEARTH_ERANGE);

	assert_int_equal(hearth_error_errno(&e, HEARTH_EIO, ENOENT, "open %s", "m"), HEARTH_EIO);
	assert_string_equal(e.msg, "open m: No such file or directory");

	hearth_error_prefix(&e, "load");
	assert_string_equal(e.msg, "load: open m: No such file or directory");
	hearth_error_clear(&e);
	assert_int_equal(e.code, HEARTH_OK);
	assert_string_equal(e.msg, "");
}

static void test_error_prefix_cuts_at_the_buffer_end(void **state)
{
	(void)state;
	struct hearth_error e;
	char long_msg[HEARTH_ERROR_MSG_MAX + 64];
	memset(long_msg, 'a', sizeof long_msg - 1);
	long_msg[sizeof long_msg - 1] = '\0';
	hearth_error_set(&e, HEARTH_EINVAL, "%s", long_msg);
	assert_int_equal(strlen(e.msg), HEARTH_ERROR_MSG_MAX - 1);
	hearth_error_prefix(&e, "ctx");
	assert_int_equal(strlen(e.msg), HEARTH_ERROR_MSG_MAX - 1);
	assert_memory_equal(e.msg, "ctx: aaa", 8);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_error_every_code_has_its_own_value_and_name),
		cmocka_unit_test(test_error_every_code_in_the_range_is_named),
		cmocka_unit_test(test_error_set_fills_the_message_and_returns_the_code),
		cmocka_unit_test(test_error_prefix_cuts_at_the_buffer_end),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
