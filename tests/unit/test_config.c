/* Config parsing: the defaults the man page promises, every key read from a file and from
 * flags, and bad files whose errors must name file, line and key. Also the shared size and
 * duration parsers (protocol/units), and that the man page and example list every key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/engine/load.h"
#include "daemon/serve/config.h"
#include "protocol/units.h"

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
	assert_false(c.kv_budget_set); /* so a sliding-window model's rings come on top */
	assert_int_equal(c.kv_type, CONFIG_KV_F16);
	assert_int_equal(c.weights, CONFIG_WEIGHTS_W4A8);
	assert_int_equal(c.weights_group, CONFIG_GROUP_64);
	assert_int_equal(c.head, CONFIG_HEAD_AUTO);
	assert_int_equal(c.weights_mix, CONFIG_MIX_AUTO);
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
		"weights_mix = off\n"
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
	assert_int_equal(c.weights_mix, CONFIG_MIX_OFF);
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
	struct hearth_config flag_only;
	config_defaults(&flag_only);
	assert_int_equal(config_set_pair(&flag_only, "kv-budget=1GiB", &err), 0);
	assert_true(flag_only.kv_budget_set);
	config_defaults(&c);
	assert_int_equal(config_load_file(&c, path, &err), 0);
	assert_true(c.kv_budget_set);
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
			       "head=int8", "weights-mix=off" };
	struct hearth_config c;
	struct hearth_error err;
	config_defaults(&c);
	c.max_context = 77; /* stale value from a previous build: must not survive */
	if (config_build(&c, path, sets, 6, &err))
		fail_msg("%s", err.msg);
	assert_int_equal(c.kv_budget, 1ull << 30);
	assert_int_equal(c.weights_group, CONFIG_GROUP_32);
	assert_int_equal(c.head, CONFIG_HEAD_INT8);
	assert_int_equal(c.weights_mix, CONFIG_MIX_OFF);
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
	assert_string_equal(err.msg, "command line: weights_group: bad value '16' (use 128, 32, 64)");
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
	{ "weights_group = 96", HEARTH_EINVAL, "weights_group: bad value '96' (use 128, 32, 64)" },
	{ "weights_group = g32", HEARTH_EINVAL, "weights_group: bad value 'g32' (use 128, 32, 64)" },
	{ "weights_groups = 32", HEARTH_ENOTFOUND, "(did you mean 'weights_group'?)" },
	{ "head = q8", HEARTH_EINVAL, "head: bad value 'q8' (use auto, int4, int6, int8)" },
	{ "head = 8", HEARTH_EINVAL, "head: bad value '8' (use auto, int4, int6, int8)" },
	{ "weights_mix = on", HEARTH_EINVAL, "weights_mix: bad value 'on' (use auto, off)" },
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
		{ "model", "/srv/m #1.gguf" }, { "chat_template", "/tmp/t.jinja" },
		{ "draft_model", "/srv/d.gguf" }, { "draft_kv_budget", "3MiB" },
		{ "max_context", "777" }, { "kv_budget", "1536KiB" },
		{ "kv_type", "q8" }, { "weights", "w4a16" }, { "weights_group", "32" },
		{ "head", "int8" }, { "weights_mix", "off" }, { "imatrix", "/srv/m.imatrix.gguf" },
		{ "imatrix_samples", "9" }, { "imatrix_cache", "/var/cache/h x" }, { "weights_cache", "/var/cache/w x" },
		{ "threads", "3" }, { "numa_node", "1" },
		{ "hugepages", "none" }, { "lock_memory", "on" }, { "socket", "/tmp/x.sock" },
		{ "socket_mode", "666" }, { "allow_users", "0,4242,nobody" },
		{ "allow_groups", "nogroup,777" }, { "max_requests_per_client", "2" },
		{ "max_queued_tokens_per_client", "123" }, { "max_requests_per_uid", "9" },
		{ "max_clients", "17" }, { "max_clients_per_uid", "5" }, { "client_timeout", "3s" },
		{ "client_send_queue", "640KiB" },
		{ "log_level", "warning" }, { "shutdown_grace", "90" }, { "model_swap", "drain" },
		{ "prefix_share", "group" },
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

/* ---- the key table ---- */

/* Every key's default is the table's text: a config built from an empty file is the one
 * config_defaults gives, and each key of it prints as its default text. */
static void test_config_defaults_come_from_the_table(void **state)
{
	struct hearth_config d, c;
	struct hearth_error err;
	config_defaults(&d);
	memset(&c, 0xa5, sizeof c);
	config_defaults(&c);
	assert_memory_equal(&c, &d, sizeof c);
	if (config_load_file(&c, write_conf(""), &err))
		fail_msg("%s", err.msg);
	assert_memory_equal(&c, &d, sizeof c);
	size_t n_with_default = 0;
	for (size_t i = 0; config_key_at(i); i++) {
		const char *key = config_key_at(i), *def = config_key_default(key);
		char text[512];
		assert_int_equal(config_format(&d, key, text, sizeof text, &err), 0);
		if (!def) {
			assert_string_equal(text, ""); /* model: unset */
			continue;
		}
		if (strcmp(text, def))
			fail_msg("%s prints as '%s' but its default is '%s'", key, text, def);
		n_with_default++;
	}
	assert_int_equal(n_with_default, 29);
	assert_null(config_key_default("model"));
	assert_null(config_key_default("no_such_key"));
	assert_string_equal(config_key_default("kv_budget"), "256MiB");
	assert_string_equal(config_key_default("max_context"), "4096");
}

/* An enum word the key does not have is refused with the key and every word it takes, and
 * the setting is left as it was (no key falls into another's storage). */
static void test_config_unknown_enum_word_names_key_and_words(void **state)
{
	const struct { const char *key, *bad, *msg; } cases[] = {
		{ "kv_type", "q4", "kv_type: bad value 'q4' (use f16, bf16, f32, q8)" },
		{ "weights", "w8a8", "weights: bad value 'w8a8' (use w4a16, w4a8)" },
		{ "weights_group", "96", "weights_group: bad value '96' (use 128, 32, 64)" },
		{ "head", "int2", "head: bad value 'int2' (use auto, int4, int6, int8)" },
		{ "weights_mix", "no", "weights_mix: bad value 'no' (use auto, off)" },
		{ "hugepages", "always", "hugepages: bad value 'always' (use auto, hugetlb, thp, none)" },
		{ "model_swap", "swap", "model_swap: bad value 'swap' (use auto, beside, drain)" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		struct hearth_config c, d;
		struct hearth_error err;
		config_defaults(&c);
		config_defaults(&d);
		assert_int_equal(config_set(&c, cases[i].key, cases[i].bad, &err), HEARTH_EINVAL);
		assert_string_equal(err.msg, cases[i].msg);
		assert_memory_equal(&c, &d, sizeof c);
	}
	/* Each enum key writes its own field: setting the last word of one leaves the rest. */
	struct hearth_config c, d;
	struct hearth_error err;
	config_defaults(&c);
	config_defaults(&d);
	assert_int_equal(config_set(&c, "model_swap", "drain", &err), 0);
	assert_int_equal(c.model_swap, CONFIG_SWAP_DRAIN);
	assert_int_equal(c.kv_type, d.kv_type);
	assert_int_equal(config_set(&c, "hugepages", "none", &err), 0);
	assert_int_equal(c.hugepages, CONFIG_HUGEPAGES_NONE);
	assert_int_equal(c.kv_type, d.kv_type);
}

/* head takes every word the man page lists, int6 among them, and each reaches the loader
 * as its head_bits (auto: 0, the mix rule's choice); a word it lacks ("int5") is refused
 * by name. */
static void test_config_head_words_reach_the_loader(void **state)
{
	(void)state;
	static const struct {
		const char *word;
		enum config_head head;
		uint32_t bits;
	} cases[] = {
		{ "auto", CONFIG_HEAD_AUTO, 0 },
		{ "int4", CONFIG_HEAD_INT4, LOAD_HEAD_INT4 },
		{ "int6", CONFIG_HEAD_INT6, LOAD_HEAD_INT6 },
		{ "int8", CONFIG_HEAD_INT8, LOAD_HEAD_INT8 },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		struct hearth_config c;
		struct hearth_error err;
		struct load_opts o;
		config_defaults(&c);
		assert_int_equal(config_set(&c, "head", cases[i].word, &err), 0);
		assert_int_equal(c.head, cases[i].head);
		config_load_opts(&c, &o);
		assert_int_equal(o.head_bits, cases[i].bits);
	}
	struct hearth_config c;
	struct hearth_error err;
	config_defaults(&c);
	assert_int_equal(config_set(&c, "head", "int5", &err), HEARTH_EINVAL);
	assert_string_equal(err.msg, "head: bad value 'int5' (use auto, int4, int6, int8)");
	/* and weights_group's words, the default first */
	static const struct {
		const char *word;
		uint32_t group;
	} groups[] = { { NULL, LOAD_GROUP_64 }, { "128", LOAD_GROUP_128 }, { "64", LOAD_GROUP_64 }, { "32", LOAD_GROUP_32 } };
	for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) {
		struct load_opts o;
		config_defaults(&c);
		if (groups[i].word)
			assert_int_equal(config_set(&c, "weights_group", groups[i].word, &err), 0);
		config_load_opts(&c, &o);
		assert_int_equal(o.weights_group, groups[i].group);
	}
}

/* Each kind at its bounds: the bound is taken, one step past it is refused. */
static void test_config_bounds_hold_at_the_boundary(void **state)
{
	char long_model[4097], long_socket[109];
	memset(long_model, 'm', sizeof long_model - 1);
	long_model[0] = '/';
	long_model[sizeof long_model - 1] = '\0';
	memset(long_socket, 's', sizeof long_socket - 1);
	long_socket[0] = '/';
	long_socket[sizeof long_socket - 1] = '\0';
	char ok_model[4096], ok_socket[108];
	memcpy(ok_model, long_model, sizeof ok_model - 1);
	ok_model[sizeof ok_model - 1] = '\0';
	memcpy(ok_socket, long_socket, sizeof ok_socket - 1);
	ok_socket[sizeof ok_socket - 1] = '\0';
	char ids[64 * 8 + 1] = "", ids_over[sizeof ids + 8];
	for (int i = 0; i < 64; i++) {
		size_t n = strlen(ids);
		snprintf(ids + n, sizeof ids - n, "%s%d", i ? "," : "", 5000 + i);
	}
	snprintf(ids_over, sizeof ids_over, "%s,6000", ids);
	const struct { const char *key, *value; int rc; } cases[] = {
		{ "max_context", "1", 0 }, { "max_context", "0", HEARTH_ERANGE },
		{ "max_context", "1048576", 0 }, { "max_context", "1048577", HEARTH_ERANGE },
		{ "max_queued_tokens_per_client", "4294967295", 0 },
		{ "max_queued_tokens_per_client", "4294967296", HEARTH_ERANGE },
		{ "max_queued_tokens_per_client", "18446744073709551616", HEARTH_ERANGE },
		{ "max_requests_per_uid", "65536", 0 }, { "max_requests_per_uid", "65537", HEARTH_ERANGE },
		{ "threads", "1024", 0 }, { "threads", "1025", HEARTH_ERANGE }, { "threads", "auto", 0 },
		{ "numa_node", "0", 0 }, { "numa_node", "1023", 0 }, { "numa_node", "1024", HEARTH_ERANGE },
		{ "numa_node", "-1", HEARTH_EINVAL },
		{ "kv_budget", "1MiB", 0 }, { "kv_budget", "1048575", HEARTH_ERANGE },
		{ "kv_budget", "1TiB", 0 }, { "kv_budget", "1099511627777", HEARTH_ERANGE },
		{ "shutdown_grace", "0s", 0 }, { "shutdown_grace", "1h", 0 },
		{ "shutdown_grace", "3600000001us", HEARTH_ERANGE },
		{ "socket_mode", "0777", 0 }, { "socket_mode", "1000", HEARTH_ERANGE },
		{ "socket_mode", "0", 0 }, { "socket_mode", "8", HEARTH_EINVAL },
		{ "lock_memory", "on", 0 }, { "lock_memory", "2", HEARTH_EINVAL },
		{ "log_level", "debug", 0 }, { "log_level", "loud", HEARTH_EINVAL },
		{ "model", ok_model, 0 }, { "model", long_model, HEARTH_ERANGE },
		{ "socket", ok_socket, 0 }, { "socket", long_socket, HEARTH_ERANGE },
		{ "socket", "relative.sock", HEARTH_EINVAL },
		{ "allow_users", ids, 0 }, { "allow_users", ids_over, HEARTH_ERANGE },
		{ "allow_groups", ids, 0 }, { "allow_groups", ids_over, HEARTH_ERANGE },
		{ "allow_users", "4294967294", 0 }, { "allow_users", "4294967295", HEARTH_ERANGE },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		struct hearth_config c;
		struct hearth_error err = { 0 };
		config_defaults(&c);
		int rc = config_set(&c, cases[i].key, cases[i].value, &err);
		if (rc != cases[i].rc)
			fail_msg("%s = %.40s: got %d (%s), want %d", cases[i].key, cases[i].value, rc,
				 err.msg, cases[i].rc);
		if (rc) {
			if (strncmp(err.msg, cases[i].key, strlen(cases[i].key)))
				fail_msg("error for %s does not name it: %s", cases[i].key, err.msg);
			continue;
		}
		/* What was taken prints back to a text that reads to the same setting. */
		char text[8192];
		struct hearth_config again;
		config_defaults(&again);
		assert_int_equal(config_format(&c, cases[i].key, text, sizeof text, &err), 0);
		if (config_set(&again, cases[i].key, text, &err))
			fail_msg("%s: '%s' does not read back: %s", cases[i].key, text, err.msg);
		assert_memory_equal(&again, &c, sizeof c);
	}
}

/* What a reload does with a change follows the key's column alone: server.c asks
 * config_keys_differ(..., CONFIG_RELOAD_MODEL) whether to load the model anew. */
static void test_config_reload_difference_follows_the_column(void **state)
{
	/* A value other than the default for every key. */
	const struct { const char *key, *value; enum config_reload want; } cases[] = {
		{ "model", "/m.gguf", CONFIG_RELOAD_MODEL },
		{ "chat_template", "/tmp/t.jinja", CONFIG_RELOAD_MODEL },
		{ "draft_model", "/d.gguf", CONFIG_RELOAD_MODEL },
		{ "draft_kv_budget", "16MiB", CONFIG_RELOAD_MODEL },
		{ "max_context", "8192", CONFIG_RELOAD_MODEL },
		{ "kv_budget", "1GiB", CONFIG_RELOAD_MODEL },
		{ "kv_type", "q8", CONFIG_RELOAD_MODEL },
		{ "weights", "w4a16", CONFIG_RELOAD_MODEL },
		{ "weights_group", "32", CONFIG_RELOAD_MODEL },
		{ "head", "int8", CONFIG_RELOAD_MODEL },
		{ "weights_mix", "off", CONFIG_RELOAD_MODEL },
		{ "imatrix", "/srv/m.imatrix.gguf", CONFIG_RELOAD_MODEL },
		{ "imatrix_samples", "9", CONFIG_RELOAD_MODEL },
		{ "imatrix_cache", "/var/cache/h", CONFIG_RELOAD_MODEL },
		{ "weights_cache", "off", CONFIG_RELOAD_MODEL },
		{ "threads", "3", CONFIG_RELOAD_MODEL },
		{ "numa_node", "0", CONFIG_RELOAD_MODEL },
		{ "hugepages", "thp", CONFIG_RELOAD_MODEL },
		{ "lock_memory", "yes", CONFIG_RELOAD_MODEL },
		{ "socket", "/run/other.sock", CONFIG_RELOAD_RESTART },
		{ "socket_mode", "0600", CONFIG_RELOAD_RESTART },
		{ "allow_users", "4242", CONFIG_RELOAD_LIVE },
		{ "allow_groups", "4243", CONFIG_RELOAD_LIVE },
		{ "max_requests_per_client", "2", CONFIG_RELOAD_LIVE },
		{ "max_queued_tokens_per_client", "100", CONFIG_RELOAD_LIVE },
		{ "max_requests_per_uid", "2", CONFIG_RELOAD_LIVE },
		{ "max_clients", "9", CONFIG_RELOAD_LIVE },
		{ "max_clients_per_uid", "3", CONFIG_RELOAD_LIVE },
		{ "client_timeout", "2s", CONFIG_RELOAD_LIVE },
		{ "client_send_queue", "1MiB", CONFIG_RELOAD_LIVE },
		{ "prefix_share", "all", CONFIG_RELOAD_LIVE },
		{ "log_level", "debug", CONFIG_RELOAD_LIVE },
		{ "shutdown_grace", "1s", CONFIG_RELOAD_LIVE },
		{ "model_swap", "drain", CONFIG_RELOAD_LIVE },
	};
	size_t n_keys = 0;
	while (config_key_at(n_keys))
		n_keys++;
	assert_int_equal(sizeof cases / sizeof cases[0], n_keys);
	for (size_t i = 0; i < n_keys; i++) {
		struct hearth_config a, b;
		struct hearth_error err;
		config_defaults(&a);
		config_defaults(&b);
		if (config_set(&b, cases[i].key, cases[i].value, &err))
			fail_msg("%s", err.msg);
		if (config_key_reload(cases[i].key) != cases[i].want)
			fail_msg("%s: reload column %d, want %d", cases[i].key,
				 config_key_reload(cases[i].key), cases[i].want);
		for (int w = CONFIG_RELOAD_LIVE; w <= CONFIG_RELOAD_RESTART; w++)
			if (config_keys_differ(&a, &b, w) != (w == (int)cases[i].want))
				fail_msg("%s changed: differ(column %d) is wrong", cases[i].key, w);
		assert_int_equal(config_key_reloadable(cases[i].key),
				 cases[i].want == CONFIG_RELOAD_LIVE);
		/* The merge takes a live key and leaves (and names) the others. */
		char restart[256];
		struct hearth_config live = a;
		config_reload_merge(&live, &b, restart, sizeof restart);
		if (cases[i].want == CONFIG_RELOAD_LIVE) {
			assert_memory_equal(&live, &b, sizeof live);
			assert_string_equal(restart, "");
		} else {
			assert_memory_equal(&live, &a, sizeof live);
			assert_string_equal(restart, cases[i].key);
		}
	}
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
		if (!strcmp(key, "model") || !strcmp(key, "chat_template") || !strcmp(key, "draft_model") ||
		    !strcmp(key, "imatrix") || !strcmp(key, "imatrix_cache") || !strcmp(key, "weights_cache") ||
		    !strcmp(key, "allow_users") ||
		    !strcmp(key, "allow_groups"))
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

/* The KEYS section's entries: each ".TP\n.B name\n" up to the next .TP, .SS or .SH. */
static const char *man_entry(const char *man, const char *key, size_t *len)
{
	char want[96];
	snprintf(want, sizeof want, ".TP\n.B %s\n", key);
	const char *keys = strstr(man, "\n.SH KEYS\n");
	const char *end = keys ? strstr(keys + 1, "\n.SH ") : NULL;
	const char *p = keys ? strstr(keys, want) : NULL;
	if (!p || p > end)
		return NULL;
	const char *q = p + strlen(want);
	const char *next = strstr(q, "\n.TP\n"), *ss = strstr(q, "\n.SS "), *sh = strstr(q, "\n.SH ");
	const char *stop = sh;
	if (next && next < stop)
		stop = next;
	if (ss && ss < stop)
		stop = ss;
	*len = (size_t)(stop - p);
	return p;
}

/* The man page and the example list exactly the table's keys, the man page states each
 * table default and marks (reload) exactly the keys a reload applies at once. */
static void test_config_man_page_and_example_match_the_table(void **state)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/doc/hearthd.conf.5", srcdir());
	char *man = slurp(path);
	snprintf(path, sizeof path, "%s/systemd/hearthd.conf.example", srcdir());
	char *example = slurp(path);
	size_t n_keys = 0;
	for (; config_key_at(n_keys); n_keys++) {
		const char *key = config_key_at(n_keys), *def = config_key_default(key);
		size_t len = 0;
		const char *e = man_entry(man, key, &len);
		if (!e)
			fail_msg("hearthd.conf.5 has no KEYS entry for %s", key);
		char *entry = strndup(e, len + 1); /* with the line end before the next entry */
		if (def && *def) {
			char want[256];
			snprintf(want, sizeof want, "\nDefault: %s.\n", def);
			if (!strstr(entry, want))
				fail_msg("hearthd.conf.5 does not give %s's default as '%s'", key, def);
		}
		bool marked = strstr(entry, "\n.I (reload)\n") != NULL;
		if (marked != config_key_reloadable(key))
			fail_msg("hearthd.conf.5 %s %s as (reload)", marked ? "marks" : "does not mark",
				 key);
		free(entry);
	}
	/* And nothing more: count the entries in the KEYS section and the example's keys. */
	const char *keys = strstr(man, "\n.SH KEYS\n"), *end = strstr(keys + 1, "\n.SH ");
	size_t n_man = 0;
	for (const char *p = strstr(keys, "\n.TP\n.B "); p && p < end; p = strstr(p + 1, "\n.TP\n.B "))
		n_man++;
	assert_int_equal(n_man, n_keys);
	size_t n_example = 0;
	for (char *line = strtok(example, "\n"); line; line = strtok(NULL, "\n")) {
		char *eq = strstr(line, " = ");
		if (line[0] != '#' || !eq || line[1] == ' ' || line[1] == '#')
			continue;
		*eq = '\0';
		if (!config_key_default(line + 1) && strcmp(line + 1, "model") && strcmp(line + 1, "chat_template") &&
		    strcmp(line + 1, "draft_model") && strcmp(line + 1, "imatrix") && strcmp(line + 1, "imatrix_cache") &&
		    strcmp(line + 1, "weights_cache"))
			fail_msg("hearthd.conf.example shows '%s', which is not a key", line + 1);
		n_example++;
	}
	assert_int_equal(n_example, n_keys);
	free(man);
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
		cmocka_unit_test(test_config_example_shows_the_defaults),
		cmocka_unit_test(test_config_defaults_come_from_the_table),
		cmocka_unit_test(test_config_unknown_enum_word_names_key_and_words),
		cmocka_unit_test(test_config_head_words_reach_the_loader),
		cmocka_unit_test(test_config_bounds_hold_at_the_boundary),
		cmocka_unit_test(test_config_reload_difference_follows_the_column),
		cmocka_unit_test(test_config_man_page_and_example_match_the_table),
	};
	return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
