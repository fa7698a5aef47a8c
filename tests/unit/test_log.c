/* The log writer on a pipe: journald "<N>" prefix only when the fd is the stream named by
 * JOURNAL_STREAM, timestamped text otherwise, level filtering, one line per message with
 * control characters neutralised and long messages cut. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <regex.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/serve/log.h"

struct capture {
	int rd, wr;
};

static int setup_pipe(void **state)
{
	static struct capture cap;
	int fds[2];
	if (pipe2(fds, O_NONBLOCK) != 0)
		return -1;
	cap.rd = fds[0];
	cap.wr = fds[1];
	*state = &cap;
	return 0;
}

static int teardown_pipe(void **state)
{
	struct capture *cap = *state;
	close(cap->rd);
	close(cap->wr);
	return 0;
}

/* Everything written so far, NUL-terminated. */
static const char *drain(struct capture *cap)
{
	static char buf[8192];
	ssize_t n = read(cap->rd, buf, sizeof buf - 1);
	buf[n > 0 ? n : 0] = '\0';
	return buf;
}

static void stream_id_of(int fd, char *buf, size_t size)
{
	struct stat st;
	assert_int_equal(fstat(fd, &st), 0);
	snprintf(buf, size, "%ju:%ju", (uintmax_t)st.st_dev, (uintmax_t)st.st_ino);
}

static void test_log_uses_priority_prefix_on_the_journal_stream(void **state)
{
	struct capture *cap = *state;
	char id[64];
	stream_id_of(cap->wr, id, sizeof id);
	struct log lg;
	log_open(&lg, cap->wr, LOG_LEVEL_DEBUG, id);
	assert_true(lg.journal);
	log_warning(&lg, "kv budget %d%% used", 93);
	log_error(&lg, "boom");
	log_debug(&lg, "detail");
	assert_string_equal(drain(cap), "<4>kv budget 93% used\n<3>boom\n<7>detail\n");
}

static void test_log_plain_text_when_stream_is_elsewhere(void **state)
{
	struct capture *cap = *state;
	char id[64];
	/* Another pipe is another inode: a daemon started by hand from a unit's shell inherits
	 * JOURNAL_STREAM while its stderr points somewhere else. */
	int other[2];
	assert_int_equal(pipe(other), 0);
	stream_id_of(other[1], id, sizeof id);
	close(other[0]);
	close(other[1]);
	const char *not_journal[] = { NULL, "", "garbage", "1:2:3", id };
	for (size_t i = 0; i < sizeof not_journal / sizeof not_journal[0]; i++) {
		struct log lg;
		log_open(&lg, cap->wr, LOG_LEVEL_INFO, not_journal[i]);
		assert_false(lg.journal);
		log_notice(&lg, "listening on %s", "/run/hearth/hearth.sock");
		const char *out = drain(cap);
		regex_t re;
		assert_int_equal(regcomp(&re,
					 "^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3} "
					 "notice: listening on /run/hearth/hearth.sock\n$",
					 REG_EXTENDED | REG_NOSUB), 0);
		if (regexec(&re, out, 0, NULL, 0) != 0)
			fail_msg("unexpected line '%s'", out);
		regfree(&re);
	}
}

static void test_log_drops_messages_above_level_and_level_can_change(void **state)
{
	struct capture *cap = *state;
	char id[64];
	stream_id_of(cap->wr, id, sizeof id);
	struct log lg;
	log_open(&lg, cap->wr, LOG_LEVEL_WARNING, id);
	log_info(&lg, "hidden");
	log_notice(&lg, "hidden");
	log_warning(&lg, "shown");
	assert_false(log_enabled(&lg, LOG_LEVEL_INFO));
	log_set_level(&lg, LOG_LEVEL_INFO);
	assert_true(log_enabled(&lg, LOG_LEVEL_INFO));
	log_info(&lg, "now shown");
	log_debug(&lg, "hidden");
	assert_string_equal(drain(cap), "<4>shown\n<6>now shown\n");
}

static void test_log_neutralises_control_characters(void **state)
{
	struct capture *cap = *state;
	char id[64];
	stream_id_of(cap->wr, id, sizeof id);
	struct log lg;
	log_open(&lg, cap->wr, LOG_LEVEL_INFO, id);
	/* A model name from a file or a client string must not forge a second entry. */
	log_info(&lg, "model '%s'", "evil\n<0>emergency\x1b[31m");
	assert_string_equal(drain(cap), "<6>model 'evil?<0>emergency?[31m'\n");
}

static void test_log_cuts_long_messages_keeping_the_line_end(void **state)
{
	struct capture *cap = *state;
	char id[64];
	stream_id_of(cap->wr, id, sizeof id);
	struct log lg;
	log_open(&lg, cap->wr, LOG_LEVEL_INFO, id);
	char big[LOG_LINE_MAX * 2];
	memset(big, 'x', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	log_info(&lg, "%s", big);
	const char *out = drain(cap);
	size_t n = strlen(out);
	assert_int_equal(n, LOG_LINE_MAX - 1);
	assert_memory_equal(out, "<6>xxx", 6);
	assert_string_equal(out + n - 4, "...\n");
}

static void test_log_level_names_round_trip(void **state)
{
	const char *names[] = { "error", "warning", "notice", "info", "debug" };
	for (int i = 0; i < 5; i++) {
		enum log_level l;
		assert_int_equal(log_level_parse(names[i], &l, NULL), 0);
		assert_int_equal(l, LOG_LEVEL_ERROR + i);
		assert_string_equal(log_level_name(l), names[i]);
	}
	struct hearth_error err;
	enum log_level l;
	assert_int_equal(log_level_parse("warn", &l, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "'warn'"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_log_uses_priority_prefix_on_the_journal_stream,
						setup_pipe, teardown_pipe),
		cmocka_unit_test_setup_teardown(test_log_plain_text_when_stream_is_elsewhere, setup_pipe,
						teardown_pipe),
		cmocka_unit_test_setup_teardown(test_log_drops_messages_above_level_and_level_can_change,
						setup_pipe, teardown_pipe),
		cmocka_unit_test_setup_teardown(test_log_neutralises_control_characters, setup_pipe,
						teardown_pipe),
		cmocka_unit_test_setup_teardown(test_log_cuts_long_messages_keeping_the_line_end,
						setup_pipe, teardown_pipe),
		cmocka_unit_test(test_log_level_names_round_trip),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
