/* Config parsing: the defaults the man page promises, every key read from a file and from
 * flags, and bad files whose errors must name file, line and key. Also the shared size and
 * duration parsers (daemon/units), and that the man page and example list every key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/serve/config.h"
#include "daemon/serve/units.h"

static char tmpdir[64];

static int setup_dir(void **state)
{
	snprintf(tmpdir, sizeof tmpdir, "/tmp/hearth-test-config-XXXXXX");
	return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_dir(void **state)
{
	char path[128];
	snprintf(path, sizeof path, "%s/hearthd.conf", tmpdir);
	unlink(path);
	return rmdir(tmpdir);
}

/* Writes text (which may hold NUL bytes, hence len) as the test's hearthd.conf. */
static const char *write_conf_n(const char *text, size_t len)
{
	static char path[128];
	snprintf(path, sizeof path, "%s/hearthd.conf", tmpdir);
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(text, 1, len, f), len);
	fclose(f);
	return path;
}

static const char *write_conf(const char *text)
{
	return write_conf_n(text, strlen(text));
}

/* ---- units ---- */

static void test_units_size_reads_binary_suffixes(void **state)
{
	struct hearth_error err;
	uint64_t v;
	assert_int_equal(units_parse_size("192MiB", &v, &err), 0);
	assert_int_equal(v, 192ull * 1048576);
	assert_int_equal(units_parse_size("1GiB", &v, &err), 0);
	assert_int_equal(v, 1073741824ull);
	assert_int_equal(units_parse_size(" 2 G ", &v, &err), 0);
	assert_int_equal(v, 2147483648ull);
	assert_int_equal(units_parse_size("4096", &v, &err), 0);
	assert_int_equal(v, 4096);
	assert_int_equal(units_parse_size("3KiB", &v, &err), 0);
	assert_int_equal(v, 3072);
	assert_int_equal(units_parse_size("1TiB", &v, &err), 0);
	assert_int_equal(v, 1099511627776ull);
	assert_int_equal(units_parse_size("7B", &v, &err), 0);
	assert_int_equal(v, 7);
}

static void test_units_size_rejects_ambiguous_and_malformed(void **state)
{
	struct hearth_error err;
	uint64_t v = 99;
	assert_int_equal(units_parse_size("256MB", &v, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "MiB"));
	assert_int_equal(units_parse_size("1.5GiB", &v, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "fraction"));
	assert_int_equal(units_parse_size("-1", &v, &err), HEARTH_EINVAL);
	assert_int_equal(units_parse_size("", &v, &err), HEARTH_EINVAL);
	assert_int_equal(units_parse_size("12 MiB x", &v, &err), HEARTH_EINVAL);
	assert_int_equal(units_parse_size("12mib", &v, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "'mib'"));
	/* 2^24 TiB = 2^64 bytes: one past uint64. */
	assert_int_equal(units_parse_size("16777216TiB", &v, &err), HEARTH_ERANGE);
	assert_int_equal(units_parse_size("99999999999999999999", &v, &err), HEARTH_ERANGE);
	assert_int_equal(v, 99);
}

static void test_units_size_format_reads_back(void **state)
{
	const uint64_t values[] = { 0, 1, 1000, 1024, 1536 * 1024, 256ull << 20, 3ull << 30,
				    (1ull << 40) + 1024, 5ull << 40 };
	const char *expect[] = { "0", "1", "1000", "1KiB", "1536KiB", "256MiB", "3GiB",
				 "1073741825KiB", "5TiB" };
	for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
		char buf[24];
		uint64_t back;
		assert_string_equal(units_format_size(values[i], buf, sizeof buf), expect[i]);
		assert_int_equal(units_parse_size(buf, &back, NULL), 0);
		assert_int_equal(back, values[i]);
	}
}

static void test_units_duration_reads_suffixes_and_bare_seconds(void **state)
{
	struct hearth_error err;
	uint64_t v;
	assert_int_equal(units_parse_duration("10", &v, &err), 0);
	assert_int_equal(v, 10000000);
	assert_int_equal(units_parse_duration("500ms", &v, &err), 0);
	assert_int_equal(v, 500000);
	assert_int_equal(units_parse_duration("2min", &v, &err), 0);
	assert_int_equal(v, 120000000);
	assert_int_equal(units_parse_duration("1h", &v, &err), 0);
	assert_int_equal(v, 3600000000ull);
	assert_int_equal(units_parse_duration("250us", &v, &err), 0);
	assert_int_equal(v, 250);
	assert_int_equal(units_parse_duration("10 sec", &v, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "'sec'"));
	char buf[24];
	assert_string_equal(units_format_duration(1500000, buf, sizeof buf), "1500ms");
	assert_string_equal(units_format_duration(120000000, buf, sizeof buf), "2min");
	assert_string_equal(units_format_duration(0, buf, sizeof buf), "0s");
}

/* ---- config ---- */

static void test_config_defaults_match_documentation(void **state)
{
	struct hearth_config c;
	config_defaults(&c);
	assert_string_equal(c.model, "");
	assert_int_equal(c.max_context, 4096);
	assert_int_equal(c.kv_budget, 256ull * 1024 * 1024);
	assert_int_equal(c.kv_type, CONFIG_KV_F16);
	assert_int_equal(c.weights, CONFIG_WEIGHTS_W4A8);
	assert_int_equal(c.weights_group, CONFIG_GROUP_128);
	assert_int_equal(c.head, CONFIG_HEAD_INT4);
	assert_int_equal(c.threads, 0);
	assert_int_equal(c.numa_node, -1);
	assert_int_equal(c.hugepages, CONFIG_HUGEPAGES_AUTO);
	assert_false(c.lock_memory);
	assert_string_equal(c.socket, "/run/hearth/hearth.sock");
	assert_int_equal(c.socket_mode, 0660);
	assert_int_equal(c.n_allow_uids, 0);
	assert_int_equal(c.n_allow_gids, 0);
	assert_int_equal(c.max_requests_per_client, 8);
	assert_int_equal(c.max_queued_tokens_per_client, 65536);
	assert_int_equal(c.max_requests_per_uid, 16);
	assert_int_equal(c.log_level, LOG_LEVEL_INFO);
	assert_int_equal(c.shutdown_grace_usec, 10000000);
	struct hearth_error err;
	assert_int_equal(config_check(&c, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "model"));
}

static void test_config_file_sets_every_key(void **state)
{
	const char *path = write_conf(
		"# a comment\n"
		"\n"
		"model = /var/lib/hearth/models/smol.gguf\n"
		"   max_context=2048   \n"
		"kv_budget = 192MiB\n"
		"kv_type = bf16\n"
		"weights = w4a8\n"
		"weights_group = 32\n"
		"head = int8\n"
		"threads = 2\n"
		"numa_node = 0\n"
		"hugepages = thp\n"
		"lock_memory = yes\n"
		"socket = /tmp/h.sock\n"
		"socket_mode = 0600\n"
		"allow_users = root, 1001\n"
		"allow_groups = 65534,0\n"
		"max_requests_per_client = 3\n"
		"max_queued_tokens_per_client = 9000\n"
		"max_requests_per_uid = 5\n"
		"log_level = debug\n"
		"shutdown_grace = 1500ms\r\n"
		"\t# indented comment\n");
	struct hearth_config c;
	struct hearth_error err = { 0 };
	config_defaults(&c);
	int rc = config_load_file(&c, path, &err);
	if (rc)
		fail_msg("%s", err.msg);
	assert_string_equal(c.model, "/var/lib/hearth/models/smol.gguf");
	assert_int_equal(c.max_context, 2048);
	assert_int_equal(c.kv_budget, 192ull << 20);
	assert_int_equal(c.kv_type, CONFIG_KV_BF16);
	assert_int_equal(c.weights, CONFIG_WEIGHTS_W4A8);
	assert_int_equal(c.weights_group, CONFIG_GROUP_32);
	assert_int_equal(c.head, CONFIG_HEAD_INT8);
	assert_int_equal(c.threads, 2);
	assert_int_equal(c.numa_node, 0);
	assert_int_equal(c.hugepages, CONFIG_HUGEPAGES_THP);
	assert_true(c.lock_memory);
	assert_string_equal(c.socket, "/tmp/h.sock");
	assert_int_equal(c.socket_mode, 0600);
	assert_int_equal(c.n_allow_uids, 2);
	assert_int_equal(c.allow_uids[0], 0);
	assert_int_equal(c.allow_uids[1], 1001);
	assert_int_equal(c.n_allow_gids, 2);
	assert_int_equal(c.allow_gids[0], 65534);
	assert_int_equal(c.allow_gids[1], 0);
	assert_int_equal(c.max_requests_per_client, 3);
	assert_int_equal(c.max_queued_tokens_per_client, 9000);
	assert_int_equal(c.max_requests_per_uid, 5);
	assert_int_equal(c.log_level, LOG_LEVEL_DEBUG);
	assert_int_equal(c.shutdown_grace_usec, 1500000);
	assert_int_equal(config_check(&c, &err), 0);
}

static void test_config_flags_override_file(void **state)
{
	const char *path = write_conf("model = /m.gguf\nkv_budget = 192MiB\nthreads = 2\n");
	struct hearth_config c;
	struct hearth_error err;
	config_defaults(&c);
	assert_int_equal(config_load_file(&c, path, &err), 0);
	assert_int_equal(config_set_pair(&c, "kv-budget=1GiB", &err), 0);
	assert_int_equal(config_set(&c, "threads", "auto", &err), 0);
	assert_int_equal(config_set_pair(&c, "kv-type=q8", &err), 0);
	assert_int_equal(c.kv_type, CONFIG_KV_Q8);
	assert_int_equal(c.kv_budget, 1ull << 30);
	assert_int_equal(c.threads, 0);
	assert_string_equal(c.model, "/m.gguf");
	assert_int_equal(config_set_pair(&c, "no-equals-sign", &err), HEARTH_EINVAL);
	assert_int_equal(config_set(&c, "kv_bugdet", "1GiB", &err), HEARTH_ENOTFOUND);
	assert_string_equal(err.msg, "unknown key 'kv_bugdet' (did you mean 'kv_budget'?)");
}

static void test_config_build_applies_defaults_file_then_flags(void **state)
{
	const char *path = write_conf("model = /m.gguf\nkv_budget = 192MiB\nthreads = 2\n");
	const char *sets[] = { "kv-budget=1GiB", "log_level=debug", "log-level=notice", "weights-group=32",
			       "head=int8" };
	struct hearth_config c;
	struct hearth_error err;
	config_defaults(&c);
	c.max_context = 77; /* stale value from a previous build: must not survive */
	if (config_build(&c, path, sets, 5, &err))
		fail_msg("%s", err.msg);
	assert_int_equal(c.kv_budget, 1ull << 30);
	assert_int_equal(c.weights_group, CONFIG_GROUP_32);
	assert_int_equal(c.head, CONFIG_HEAD_INT8);
	assert_int_equal(c.threads, 2);
	assert_int_equal(c.max_context, 4096);
	assert_int_equal(c.log_level, LOG_LEVEL_NOTICE);
	assert_string_equal(c.model, "/m.gguf");

	/* A failure leaves the config as it was (a refused reload keeps running). */
	struct hearth_config before = c;
	const char *bad[] = { "threads=lots" };
	assert_int_equal(config_build(&c, path, bad, 1, &err), HEARTH_EINVAL);
	assert_string_equal(err.msg, "command line: threads: bad number 'lots'");
	assert_memory_equal(&c, &before, sizeof c);
	const char *bad_group[] = { "weights-group=16" };
	assert_int_equal(config_build(&c, path, bad_group, 1, &err), HEARTH_EINVAL);
	assert_string_equal(err.msg, "command line: weights_group: bad value '16' (use 128, 32)");
	assert_memory_equal(&c, &before, sizeof c);
	path = write_conf("kv_budget = 1GiB\n");
	assert_int_equal(config_build(&c, path, NULL, 0, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "no model configured"));
	assert_memory_equal(&c, &before, sizeof c);
	const char *model[] = { "model=/n.gguf" };
	assert_int_equal(config_build(&c, NULL, model, 1, &err), 0);
	assert_string_equal(c.model, "/n.gguf");
	assert_int_equal(c.kv_budget, 256ull << 20);
}

static void test_config_resolves_user_and_group_names(void **state)
{
	/* root/0 and nobody/65534, nogroup/65534 are fixed on Debian; names go through NSS. */
	struct hearth_config c;
	struct hearth_error err;
	config_defaults(&c);
	assert_int_equal(config_set(&c, "allow_users", "nobody, root,nobody", &err), 0);
	assert_int_equal(c.n_allow_uids, 2);
	assert_int_equal(c.allow_uids[0], 65534);
	assert_int_equal(c.allow_uids[1], 0);
	assert_int_equal(config_set(&c, "allow_groups", "nogroup", &err), 0);
	assert_int_equal(c.n_allow_gids, 1);
	assert_int_equal(c.allow_gids[0], 65534);
	assert_int_equal(config_set(&c, "allow_users", "no_such_user_hearth", &err), HEARTH_ENOTFOUND);
	assert_string_equal(err.msg, "allow_users: no such user 'no_such_user_hearth'");
	assert_int_equal(config_set(&c, "allow_groups", "no_such_group_hearth", &err),
			 HEARTH_ENOTFOUND);
	assert_string_equal(err.msg, "allow_groups: no such group 'no_such_group_hearth'");
	assert_int_equal(config_set(&c, "allow_users", "1,,2", &err), HEARTH_EINVAL);
	assert_int_equal(config_set(&c, "allow_users", "1,", &err), HEARTH_EINVAL);
	assert_int_equal(config_set(&c, "allow_users", "4294967295", &err), HEARTH_ERANGE);
	/* An empty value clears a list. */
	assert_int_equal(config_set(&c, "allow_users", "", &err), 0);
	assert_int_equal(c.n_allow_uids, 0);
}

struct bad_line {
	const char *line;
	int code;
	const char *says;  /* a fragment the message must contain after "PATH:LINE: " */
};

static const struct bad_line bad_lines[] = {
	{ "kv_bugdet = 1GiB", HEARTH_ENOTFOUND, "unknown key 'kv_bugdet' (did you mean 'kv_budget'?)" },
	{ "frobnicate = 1", HEARTH_ENOTFOUND, "unknown key 'frobnicate'" },
	{ "just words", HEARTH_EFORMAT, "expected 'key = value'" },
	{ "= 5", HEARTH_EFORMAT, "missing key" },
	{ "Max_Context = 5", HEARTH_EFORMAT, "bad key 'Max_Context'" },
	{ "max_context = 0", HEARTH_ERANGE, "max_context: 0 is out of range 1..1048576" },
	{ "max_context = 1048577", HEARTH_ERANGE, "out of range" },
	{ "max_context = -5", HEARTH_EINVAL, "max_context: bad number '-5'" },
	{ "max_context = 4k", HEARTH_EINVAL, "bad number '4k'" },
	{ "max_context =", HEARTH_EINVAL, "max_context: empty value" },
	{ "threads = 2   # two cores", HEARTH_EINVAL, "comments must be on their own line" },
	{ "kv_budget = 256MB", HEARTH_EINVAL, "kv_budget: bad size '256MB'" },
	{ "kv_budget = 512KiB", HEARTH_ERANGE, "kv_budget: 512KiB is out of range 1MiB..1TiB" },
	{ "kv_type = q8_0", HEARTH_EINVAL, "kv_type: bad value 'q8_0' (use f16, bf16, f32, q8)" },
	{ "kv_type = int8", HEARTH_EINVAL, "kv_type: bad value 'int8' (use f16, bf16, f32, q8)" },
	{ "weights = w8a8", HEARTH_EINVAL, "use w4a16, w4a8" },
	{ "weights_group = 64", HEARTH_EINVAL, "weights_group: bad value '64' (use 128, 32)" },
	{ "weights_group = g32", HEARTH_EINVAL, "weights_group: bad value 'g32' (use 128, 32)" },
	{ "weights_groups = 32", HEARTH_ENOTFOUND, "(did you mean 'weights_group'?)" },
	{ "head = q8", HEARTH_EINVAL, "head: bad value 'q8' (use int4, int8)" },
	{ "head = 8", HEARTH_EINVAL, "head: bad value '8' (use int4, int8)" },
	{ "head =", HEARTH_EINVAL, "head: empty value" },
	{ "hugepages = always", HEARTH_EINVAL, "use auto, hugetlb, thp, none" },
	{ "lock_memory = maybe", HEARTH_EINVAL, "lock_memory: bad boolean 'maybe'" },
	{ "numa_node = 1024", HEARTH_ERANGE, "numa_node" },
	{ "socket = relative.sock", HEARTH_EINVAL, "not an absolute path" },
	{ "socket = /run/hearth/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.sock",
	  HEARTH_ERANGE, "limit of a Unix socket address" },
	{ "socket_mode = 0680", HEARTH_EINVAL, "bad mode '0680'" },
	{ "socket_mode = 4755", HEARTH_ERANGE, "beyond 0777" },
	{ "allow_users = no_such_user_hearth", HEARTH_ENOTFOUND, "no such user 'no_such_user_hearth'" },
	{ "log_level = verbose", HEARTH_EINVAL, "log_level: bad log level 'verbose'" },
	{ "shutdown_grace = 2h", HEARTH_ERANGE, "shutdown_grace: 2h is longer than 1h" },
	{ "shutdown_grace = soon", HEARTH_EINVAL, "bad duration 'soon'" },
	{ "max_requests_per_client = 0", HEARTH_ERANGE, "max_requests_per_client: 0 is out of range" },
	{ "max_requests_per_uid = 99999999999999999999999", HEARTH_ERANGE, "max_requests_per_uid" },
};

/* Each bad line goes after lineno-1 good or blank lines, so a wrong line count shows. */
static void test_config_bad_lines_name_file_and_line(void **state)
{
	for (size_t i = 0; i < sizeof bad_lines / sizeof bad_lines[0]; i++) {
		unsigned lineno = 3 + (unsigned)(i % 11);
		char text[1024] = "";
		for (unsigned l = 1; l < lineno; l++)
			strcat(text, l % 3 == 0 ? "\n" : l % 3 == 1 ? "# comment\n" : "  \t\n");
		strcat(text, bad_lines[i].line);
		strcat(text, "\nthreads = 1\n");
		const char *path = write_conf(text);
		struct hearth_config c;
		struct hearth_error err = { 0 };
		config_defaults(&c);
		int rc = config_load_file(&c, path, &err);
		char prefix[200];
		snprintf(prefix, sizeof prefix, "%s:%u: ", path, lineno);
		if (rc != bad_lines[i].code || strncmp(err.msg, prefix, strlen(prefix)) != 0 ||
		    !strstr(err.msg, bad_lines[i].says))
			fail_msg("line '%s': got %d '%s', want %d '%s...%s'", bad_lines[i].line, rc,
				 err.msg, bad_lines[i].code, prefix, bad_lines[i].says);
	}
}

static void test_config_rejects_duplicate_key_naming_both_lines(void **state)
{
	const char *path = write_conf("threads = 1\n# x\nmodel = /a\nthreads = 2\n");
	struct hearth_config c;
	struct hearth_error err;
	config_defaults(&c);
	assert_int_equal(config_load_file(&c, path, &err), HEARTH_EINVAL);
	char want[200];
	snprintf(want, sizeof want, "%s:4: 'threads' is already set on line 1", path);
	assert_string_equal(err.msg, want);
}

static void test_config_rejects_nul_byte_and_overlong_line(void **state)
{
	struct hearth_config c;
	struct hearth_error err;
	config_defaults(&c);
	const char *path = write_conf_n("threads = 1\nmodel = /a\0b\n", 24);
	assert_int_equal(config_load_file(&c, path, &err), HEARTH_EFORMAT);
	assert_non_null(strstr(err.msg, ":2: NUL byte"));

	char *big = malloc(CONFIG_LINE_MAX + 64);
	assert_non_null(big);
	strcpy(big, "# ok\nmodel = /");
	size_t n = strlen(big);
	memset(big + n, 'a', CONFIG_LINE_MAX);
	big[n + CONFIG_LINE_MAX] = '\0';
	path = write_conf(big);
	free(big);
	assert_int_equal(config_load_file(&c, path, &err), HEARTH_EFORMAT);
	assert_non_null(strstr(err.msg, ":2: line longer than"));
}

static void test_config_missing_file_names_path(void **state)
{
	struct hearth_config c;
	struct hearth_error err;
	config_defaults(&c);
	assert_int_equal(config_load_file(&c, "/nonexistent/hearthd.conf", &err), HEARTH_EIO);
	assert_string_equal(err.msg, "/nonexistent/hearthd.conf: No such file or directory");
	assert_int_equal(config_load_file(&c, tmpdir, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "not a regular file"));
}

/* Setting every key to a non-default value, formatting it and reading that text into a
 * fresh config must give the same config: config_format is what --check-config prints. */
static void test_config_format_reads_back_every_key(void **state)
{
	static const char *const settings[][2] = {
		{ "model", "/srv/m #1.gguf" }, { "max_context", "777" }, { "kv_budget", "1536KiB" },
		{ "kv_type", "q8" }, { "weights", "w4a16" }, { "weights_group", "32" },
		{ "head", "int8" }, { "threads", "3" }, { "numa_node", "1" },
		{ "hugepages", "none" }, { "lock_memory", "on" }, { "socket", "/tmp/x.sock" },
		{ "socket_mode", "666" }, { "allow_users", "0,4242,nobody" },
		{ "allow_groups", "nogroup,777" }, { "max_requests_per_client", "2" },
		{ "max_queued_tokens_per_client", "123" }, { "max_requests_per_uid", "9" },
		{ "max_clients", "17" }, { "max_clients_per_uid", "5" }, { "client_timeout", "3s" },
		{ "client_send_queue", "640KiB" },
		{ "log_level", "warning" }, { "shutdown_grace", "90" }, { "model_swap", "drain" },
	};
	size_t n = sizeof settings / sizeof settings[0];
	size_t n_keys = 0;
	while (config_key_at(n_keys))
		n_keys++;
	assert_int_equal(n, n_keys); /* a new key needs a line here */
	struct hearth_config a, b, d;
	struct hearth_error err;
	config_defaults(&a);
	config_defaults(&b);
	config_defaults(&d);
	for (size_t i = 0; i < n; i++)
		if (config_set(&a, settings[i][0], settings[i][1], &err))
			fail_msg("%s", err.msg);
	for (size_t i = 0; i < n; i++) {
		char text[1024], dtext[1024];
		assert_int_equal(config_format(&a, settings[i][0], text, sizeof text, &err), 0);
		assert_int_equal(config_format(&d, settings[i][0], dtext, sizeof dtext, &err), 0);
		if (strcmp(text, dtext) == 0)
			fail_msg("%s: test value '%s' equals the default", settings[i][0], text);
		if (config_set(&b, settings[i][0], text, &err))
			fail_msg("%s = %s: %s", settings[i][0], text, err.msg);
	}
	assert_memory_equal(&a, &b, sizeof a);
	char text[64];
	assert_int_equal(config_format(&a, "socket_mode", text, sizeof text, &err), 0);
	assert_string_equal(text, "0666");
	assert_int_equal(config_format(&a, "allow_users", text, sizeof text, &err), 0);
	assert_string_equal(text, "root,4242,nobody");
	assert_int_equal(config_format(&a, "shutdown_grace", text, sizeof text, &err), 0);
	assert_string_equal(text, "90s");
}

static void test_config_reload_takes_only_reloadable_keys(void **state)
{
	struct hearth_config live, fresh;
	struct hearth_error err;
	config_defaults(&live);
	config_defaults(&fresh);
	assert_int_equal(config_set(&fresh, "kv_budget", "1GiB", &err), 0);
	assert_int_equal(config_set(&fresh, "threads", "2", &err), 0);
	assert_int_equal(config_set(&fresh, "log_level", "debug", &err), 0);
	assert_int_equal(config_set(&fresh, "allow_users", "4242", &err), 0);
	assert_int_equal(config_set(&fresh, "max_requests_per_uid", "3", &err), 0);
	char restart[256];
	config_reload_merge(&live, &fresh, restart, sizeof restart);
	assert_string_equal(restart, "kv_budget,threads");
	assert_int_equal(live.kv_budget, 256ull << 20);
	assert_int_equal(live.threads, 0);
	assert_int_equal(live.log_level, LOG_LEVEL_DEBUG);
	assert_int_equal(live.n_allow_uids, 1);
	assert_int_equal(live.allow_uids[0], 4242);
	assert_int_equal(live.max_requests_per_uid, 3);
	assert_true(config_key_reloadable("allow_groups"));
	assert_false(config_key_reloadable("model"));
	config_reload_merge(&live, &live, restart, sizeof restart);
	assert_string_equal(restart, "");
}

/* ---- documentation agrees with the code ---- */

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		fail_msg("cannot open %s", path);
	char *buf = malloc(1 << 20);
	assert_non_null(buf);
	size_t n = fread(buf, 1, (1 << 20) - 1, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

static const char *srcdir(void)
{
	const char *s = getenv("HEARTH_SRCDIR");
	if (!s)
		fail_msg("HEARTH_SRCDIR is not set: run through `make check` or set it to the source tree");
	return s;
}

static void test_config_every_key_is_in_man_page_and_example(void **state)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/doc/hearthd.conf.5", srcdir());
	char *man = slurp(path);
	snprintf(path, sizeof path, "%s/systemd/hearthd.conf.example", srcdir());
	char *example = slurp(path);
	for (size_t i = 0; config_key_at(i); i++) {
		char want[128];
		/* roff escapes '_' nowhere, and a key's entry starts a tagged paragraph line. */
		snprintf(want, sizeof want, "\n.B %s\n", config_key_at(i));
		if (!strstr(man, want))
			fail_msg("hearthd.conf.5 has no entry '.B %s'", config_key_at(i));
		snprintf(want, sizeof want, "\n#%s = ", config_key_at(i));
		if (!strstr(example, want))
			fail_msg("hearthd.conf.example has no line '#%s = ...'", config_key_at(i));
	}
	free(man);
	free(example);
}

/* The example shows each key commented out with its default value; uncommenting a line
 * must parse, and (except for the keys without a default) change nothing. */
static void test_config_example_shows_the_defaults(void **state)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/systemd/hearthd.conf.example", srcdir());
	char *example = slurp(path);
	struct hearth_config d;
	struct hearth_error err;
	config_defaults(&d);
	/* As shipped (all commented) it loads to the defaults. */
	struct hearth_config c;
	config_defaults(&c);
	if (config_load_file(&c, path, &err))
		fail_msg("%s", err.msg);
	assert_memory_equal(&c, &d, sizeof c);
	size_t checked = 0;
	for (char *line = strtok(example, "\n"); line; line = strtok(NULL, "\n")) {
		if (line[0] != '#' || line[1] == ' ' || line[1] == '#' || !line[1])
			continue;
		char *eq = strstr(line, " = ");
		if (!eq)
			continue;
		*eq = '\0';
		const char *key = line + 1, *value = eq + 3;
		config_defaults(&c);
		if (config_set(&c, key, value, &err))
			fail_msg("example line '#%s = %s': %s", key, value, err.msg);
		checked++;
		if (!strcmp(key, "model") || !strcmp(key, "allow_users") || !strcmp(key, "allow_groups"))
			continue;
		char a[512], b[512];
		config_format(&c, key, a, sizeof a, NULL);
		config_format(&d, key, b, sizeof b, NULL);
		if (strcmp(a, b))
			fail_msg("example shows %s = %s but the default is %s", key, value, b);
	}
	assert_true(checked >= 18);
	free(example);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_units_size_reads_binary_suffixes),
		cmocka_unit_test(test_units_size_rejects_ambiguous_and_malformed),
		cmocka_unit_test(test_units_size_format_reads_back),
		cmocka_unit_test(test_units_duration_reads_suffixes_and_bare_seconds),
		cmocka_unit_test(test_config_defaults_match_documentation),
		cmocka_unit_test(test_config_file_sets_every_key),
		cmocka_unit_test(test_config_flags_override_file),
		cmocka_unit_test(test_config_build_applies_defaults_file_then_flags),
		cmocka_unit_test(test_config_resolves_user_and_group_names),
		cmocka_unit_test(test_config_bad_lines_name_file_and_line),
		cmocka_unit_test(test_config_rejects_duplicate_key_naming_both_lines),
		cmocka_unit_test(test_config_rejects_nul_byte_and_overlong_line),
		cmocka_unit_test(test_config_missing_file_names_path),
		cmocka_unit_test(test_config_format_reads_back_every_key),
		cmocka_unit_test(test_config_reload_takes_only_reloadable_keys),
		cmocka_unit_test(test_config_every_key_is_in_man_page_and_example),
		cmocka_unit_test(test_config_example_shows_the_defaults),
	};
	return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
