/* The key table and the parsers behind it: one row per key says how its text is read, where
 * the value lives and whether a reload may change it, so file, flags, formatting and the
 * documentation test all walk the same list. */
#include "daemon/serve/config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/serve/units.h"

enum kind {
	KIND_PATH,
	KIND_SOCKET,
	KIND_U32,
	KIND_U64,
	KIND_SIZE,
	KIND_THREADS,
	KIND_NODE,
	KIND_BOOL,
	KIND_MODE,
	KIND_USERS,
	KIND_GROUPS,
	KIND_LEVEL,
	KIND_DURATION,
	KIND_ENUM,
};

struct key {
	const char *name;
	enum kind kind;
	size_t offset;
	uint64_t min, max;              /* numeric kinds */
	const char *const *words;       /* KIND_ENUM: indexed by the enum value, NULL-terminated */
	bool reloadable;
};

static const char *const hugepages_words[] = { "auto", "hugetlb", "thp", "none", NULL };
static const char *const weights_words[] = { "w4a16", "w4a8", NULL };
static const char *const weights_group_words[] = { "128", "32", NULL };
static const char *const head_words[] = { "int4", "int8", NULL };
static const char *const model_swap_words[] = { "auto", "beside", "drain", NULL };
static const char *const kv_type_words[] = { "f16", "bf16", "f32", "q8", NULL };

#define F(field) offsetof(struct hearth_config, field)

/* The order is the documentation order of hearthd.conf(5). */
static const struct key keys[] = {
	{ "model", KIND_PATH, F(model), 0, 0, NULL, false },
	{ "max_context", KIND_U32, F(max_context), 1, CONFIG_MAX_CONTEXT_LIMIT, NULL, false },
	{ "kv_budget", KIND_SIZE, F(kv_budget), 1ull << 20, 1ull << 40, NULL, false },
	{ "kv_type", KIND_ENUM, F(kv_type), 0, 0, kv_type_words, false },
	{ "weights", KIND_ENUM, F(weights), 0, 0, weights_words, false },
	{ "weights_group", KIND_ENUM, F(weights_group), 0, 0, weights_group_words, false },
	{ "head", KIND_ENUM, F(head), 0, 0, head_words, false },
	{ "threads", KIND_THREADS, F(threads), 0, 1024, NULL, false },
	{ "numa_node", KIND_NODE, F(numa_node), 0, 1023, NULL, false },
	{ "hugepages", KIND_ENUM, F(hugepages), 0, 0, hugepages_words, false },
	{ "lock_memory", KIND_BOOL, F(lock_memory), 0, 0, NULL, false },
	{ "socket", KIND_SOCKET, F(socket), 0, 0, NULL, false },
	{ "socket_mode", KIND_MODE, F(socket_mode), 0, 0777, NULL, false },
	{ "allow_users", KIND_USERS, F(allow_uids), 0, 0, NULL, true },
	{ "allow_groups", KIND_GROUPS, F(allow_gids), 0, 0, NULL, true },
	{ "max_requests_per_client", KIND_U32, F(max_requests_per_client), 1, 1024, NULL, true },
	{ "max_queued_tokens_per_client", KIND_U64, F(max_queued_tokens_per_client), 1,
	  UINT32_MAX, NULL, true },
	{ "max_requests_per_uid", KIND_U32, F(max_requests_per_uid), 1, 65536, NULL, true },
	{ "max_clients", KIND_U32, F(max_clients), 1, 65536, NULL, true },
	{ "max_clients_per_uid", KIND_U32, F(max_clients_per_uid), 1, 65536, NULL, true },
	{ "client_timeout", KIND_DURATION, F(client_timeout_usec), 100000, 3600ull * 1000000, NULL,
	  true },
	{ "client_send_queue", KIND_SIZE, F(client_send_queue), 64ull << 10, 1ull << 30, NULL, true },
	{ "log_level", KIND_LEVEL, F(log_level), 0, 0, NULL, true },
	{ "shutdown_grace", KIND_DURATION, F(shutdown_grace_usec), 0, 3600ull * 1000000, NULL, true },
	{ "model_swap", KIND_ENUM, F(model_swap), 0, 0, model_swap_words, true },
};

#define N_KEYS (sizeof keys / sizeof keys[0])

#ifndef HEARTH_SYSCONFDIR
#define HEARTH_SYSCONFDIR "/etc"
#endif

const char *config_default_path(void)
{
	return HEARTH_SYSCONFDIR "/hearth/hearthd.conf";
}

void config_defaults(struct hearth_config *cfg)
{
	/* Zeroed first so that two configs with the same settings are byte-identical. */
	memset(cfg, 0, sizeof *cfg);
	cfg->max_context = 4096;
	cfg->kv_budget = 256ull << 20;
	cfg->kv_type = CONFIG_KV_F16;
	/* W4A8: on VNNI CPUs prefill runs at the int8 rate and decode is at least as fast, at
	 * the same fidelity (doc/benchmarks.md); on AVX2-only CPUs W4A16 is compute-bound. */
	cfg->weights = CONFIG_WEIGHTS_W4A8;
	cfg->weights_group = CONFIG_GROUP_128;
	cfg->head = CONFIG_HEAD_INT4;
	cfg->model_swap = CONFIG_SWAP_AUTO;
	cfg->threads = 0;
	cfg->numa_node = -1;
	cfg->hugepages = CONFIG_HUGEPAGES_AUTO;
	cfg->lock_memory = false;
	snprintf(cfg->socket, sizeof cfg->socket, "%s", CONFIG_DEFAULT_SOCKET);
	cfg->socket_mode = 0660;
	cfg->max_requests_per_client = 8;
	cfg->max_queued_tokens_per_client = 65536;
	cfg->max_requests_per_uid = 16;
	cfg->max_clients = 256;
	cfg->max_clients_per_uid = 64;
	cfg->client_timeout_usec = 10ull * 1000000;
	cfg->client_send_queue = 4ull << 20;
	cfg->log_level = LOG_LEVEL_INFO;
	cfg->shutdown_grace_usec = 10ull * 1000000;
}

const char *config_key_at(size_t i)
{
	return i < N_KEYS ? keys[i].name : NULL;
}

/* Key names compare with '-' and '_' equal, so flags may be spelled --kv-budget. */
static bool key_equal(const char *a, const char *b)
{
	for (;; a++, b++) {
		char ca = *a == '-' ? '_' : *a, cb = *b == '-' ? '_' : *b;
		if (ca != cb)
			return false;
		if (!ca)
			return true;
	}
}

static const struct key *key_find(const char *name)
{
	for (size_t i = 0; i < N_KEYS; i++)
		if (key_equal(keys[i].name, name))
			return &keys[i];
	return NULL;
}

/* Edit distance, for "did you mean"; names are short, so the O(n*m) table is tiny. */
static size_t edit_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	if (la > 63 || lb > 63)
		return SIZE_MAX;
	size_t d[64][64];
	for (size_t i = 0; i <= la; i++)
		d[i][0] = i;
	for (size_t j = 0; j <= lb; j++)
		d[0][j] = j;
	for (size_t i = 1; i <= la; i++)
		for (size_t j = 1; j <= lb; j++) {
			size_t sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
			size_t del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
			size_t m = sub < del ? sub : del;
			d[i][j] = m < ins ? m : ins;
		}
	return d[la][lb];
}

static int unknown_key(const char *name, struct hearth_error *err)
{
	const char *best = NULL;
	size_t best_d = 3; /* more than two edits away is a different word, not a typo */
	for (size_t i = 0; i < N_KEYS; i++) {
		size_t d = edit_distance(name, keys[i].name);
		if (d < best_d) {
			best_d = d;
			best = keys[i].name;
		}
	}
	if (best)
		return hearth_error_set(err, HEARTH_ENOTFOUND, "unknown key '%s' (did you mean '%s'?)",
					name, best);
	return hearth_error_set(err, HEARTH_ENOTFOUND, "unknown key '%s'", name);
}

/* Plain decimal digits only: strtoull would also take signs, blanks and 0x. */
static int parse_u64(const char *key, const char *v, uint64_t min, uint64_t max, uint64_t *out,
		     struct hearth_error *err)
{
	uint64_t x = 0;
	if (!*v)
		return hearth_error_set(err, HEARTH_EINVAL, "%s: empty value", key);
	for (const char *p = v; *p; p++) {
		if (!isdigit((unsigned char)*p))
			return hearth_error_set(err, HEARTH_EINVAL, "%s: bad number '%s'", key, v);
		if (__builtin_mul_overflow(x, 10, &x) ||
		    __builtin_add_overflow(x, (uint64_t)(*p - '0'), &x))
			return hearth_error_set(err, HEARTH_ERANGE, "%s: %s is out of range %" PRIu64
						"..%" PRIu64, key, v, min, max);
	}
	if (x < min || x > max)
		return hearth_error_set(err, HEARTH_ERANGE, "%s: %s is out of range %" PRIu64 "..%" PRIu64,
					key, v, min, max);
	*out = x;
	return 0;
}

static int parse_bool(const char *key, const char *v, bool *out, struct hearth_error *err)
{
	static const char *const yes[] = { "yes", "true", "on", "1" };
	static const char *const no[] = { "no", "false", "off", "0" };
	for (size_t i = 0; i < 4; i++) {
		if (strcmp(v, yes[i]) == 0) {
			*out = true;
			return 0;
		}
		if (strcmp(v, no[i]) == 0) {
			*out = false;
			return 0;
		}
	}
	return hearth_error_set(err, HEARTH_EINVAL, "%s: bad boolean '%s' (use yes or no)", key, v);
}

static int parse_enum(const struct key *k, const char *v, int *out, struct hearth_error *err)
{
	char list[128] = "";
	for (int i = 0; k->words[i]; i++) {
		if (strcmp(v, k->words[i]) == 0) {
			*out = i;
			return 0;
		}
		size_t n = strlen(list);
		snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", k->words[i]);
	}
	return hearth_error_set(err, HEARTH_EINVAL, "%s: bad value '%s' (use %s)", k->name, v, list);
}

static bool all_digits(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (!isdigit((unsigned char)*s))
			return false;
	return true;
}

/* getpwnam_r/getgrnam_r with a buffer that grows: NSS entries (large groups) can exceed any
 * fixed size. Returns 0 found, HEARTH_ENOTFOUND, or HEARTH_EIO/ENOMEM. */
static int lookup_name(bool group, const char *name, unsigned long *id, struct hearth_error *err)
{
	size_t size = 16384;
	for (;;) {
		char *buf = malloc(size);
		if (!buf)
			return hearth_error_set(err, HEARTH_ENOMEM, "out of memory resolving '%s'", name);
		int r;
		bool found;
		if (group) {
			struct group gr, *res = NULL;
			r = getgrnam_r(name, &gr, buf, size, &res);
			found = res != NULL;
			if (found)
				*id = gr.gr_gid;
		} else {
			struct passwd pw, *res = NULL;
			r = getpwnam_r(name, &pw, buf, size, &res);
			found = res != NULL;
			if (found)
				*id = pw.pw_uid;
		}
		free(buf);
		if (r == ERANGE && size < (1u << 24)) {
			size *= 2;
			continue;
		}
		if (found)
			return 0;
		if (r != 0 && r != ENOENT && r != ESRCH)
			return hearth_error_errno(err, HEARTH_EIO, r, "looking up %s '%s'",
						  group ? "group" : "user", name);
		return hearth_error_set(err, HEARTH_ENOTFOUND, "no such %s '%s'",
					group ? "group" : "user", name);
	}
}

/* A comma list of names or numeric ids into ids; duplicates are dropped. uid_t and gid_t
 * are both 32-bit unsigned on Linux, so one routine fills either array. */
static int parse_id_list(const struct key *k, const char *v, uint32_t *ids, size_t *n_out,
			 struct hearth_error *err)
{
	bool group = k->kind == KIND_GROUPS;
	size_t n = 0;
	const char *p = v;
	while (*p) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		while (len && isspace((unsigned char)*p)) {
			p++;
			len--;
		}
		while (len && isspace((unsigned char)p[len - 1]))
			len--;
		if (len == 0)
			return hearth_error_set(err, HEARTH_EINVAL, "%s: empty entry in '%s'", k->name, v);
		char name[256];
		if (len >= sizeof name)
			return hearth_error_set(err, HEARTH_EINVAL, "%s: entry too long in '%s'", k->name, v);
		memcpy(name, p, len);
		name[len] = '\0';
		unsigned long id;
		if (all_digits(name)) {
			uint64_t x;
			/* (uid_t)-1 means "no id" to the kernel's set*id calls; never a real one. */
			int rc = parse_u64(k->name, name, 0, UINT32_MAX - 1, &x, err);
			if (rc)
				return rc;
			id = (unsigned long)x;
		} else {
			int rc = lookup_name(group, name, &id, err);
			if (rc) {
				hearth_error_prefix(err, "%s", k->name);
				return rc;
			}
		}
		bool dup = false;
		for (size_t i = 0; i < n; i++)
			dup |= ids[i] == (uint32_t)id;
		if (!dup) {
			if (n == CONFIG_LIST_MAX)
				return hearth_error_set(err, HEARTH_ERANGE, "%s: more than %d entries",
							k->name, CONFIG_LIST_MAX);
			ids[n++] = (uint32_t)id;
		}
		if (!end)
			break;
		p = end + 1;
		if (!*p)
			return hearth_error_set(err, HEARTH_EINVAL, "%s: empty entry in '%s'", k->name, v);
	}
	*n_out = n;
	return 0;
}

static int set_value(struct hearth_config *cfg, const struct key *k, const char *v,
		     struct hearth_error *err)
{
	char *field = (char *)cfg + k->offset;
	uint64_t x;
	int rc;
	if (!*v && k->kind != KIND_USERS && k->kind != KIND_GROUPS)
		return hearth_error_set(err, HEARTH_EINVAL, "%s: empty value", k->name);
	switch (k->kind) {
	case KIND_PATH:
		if (strlen(v) >= sizeof cfg->model)
			return hearth_error_set(err, HEARTH_ERANGE, "%s: path longer than %zu bytes",
						k->name, sizeof cfg->model - 1);
		snprintf(cfg->model, sizeof cfg->model, "%s", v);
		return 0;
	case KIND_SOCKET:
		if (v[0] != '/')
			return hearth_error_set(err, HEARTH_EINVAL, "%s: '%s' is not an absolute path",
						k->name, v);
		if (strlen(v) >= sizeof cfg->socket)
			return hearth_error_set(err, HEARTH_ERANGE,
						"%s: path longer than %zu bytes (the limit of a Unix socket address)",
						k->name, sizeof cfg->socket - 1);
		snprintf(cfg->socket, sizeof cfg->socket, "%s", v);
		return 0;
	case KIND_U32:
		if ((rc = parse_u64(k->name, v, k->min, k->max, &x, err)))
			return rc;
		*(uint32_t *)field = (uint32_t)x;
		return 0;
	case KIND_U64:
		if ((rc = parse_u64(k->name, v, k->min, k->max, &x, err)))
			return rc;
		*(uint64_t *)field = x;
		return 0;
	case KIND_SIZE: {
		char lo[16], hi[16];
		if ((rc = units_parse_size(v, &x, err))) {
			hearth_error_prefix(err, "%s", k->name);
			return rc;
		}
		if (x < k->min || x > k->max)
			return hearth_error_set(err, HEARTH_ERANGE, "%s: %s is out of range %s..%s",
						k->name, v, units_format_size(k->min, lo, sizeof lo),
						units_format_size(k->max, hi, sizeof hi));
		*(uint64_t *)field = x;
		return 0;
	}
	case KIND_DURATION: {
		char hi[24];
		if ((rc = units_parse_duration(v, &x, err))) {
			hearth_error_prefix(err, "%s", k->name);
			return rc;
		}
		if (x > k->max)
			return hearth_error_set(err, HEARTH_ERANGE, "%s: %s is longer than %s", k->name, v,
						units_format_duration(k->max, hi, sizeof hi));
		*(uint64_t *)field = x;
		return 0;
	}
	case KIND_THREADS:
		if (strcmp(v, "auto") == 0) {
			cfg->threads = 0;
			return 0;
		}
		if ((rc = parse_u64(k->name, v, k->min, k->max, &x, err)))
			return rc;
		cfg->threads = (uint32_t)x;
		return 0;
	case KIND_NODE:
		if (strcmp(v, "auto") == 0) {
			cfg->numa_node = -1;
			return 0;
		}
		if ((rc = parse_u64(k->name, v, k->min, k->max, &x, err)))
			return rc;
		cfg->numa_node = (int)x;
		return 0;
	case KIND_BOOL:
		return parse_bool(k->name, v, (bool *)field, err);
	case KIND_MODE: {
		/* Octal always, with or without the leading 0, as chmod(1) reads it. */
		x = 0;
		for (const char *p = v; *p; p++) {
			if (*p < '0' || *p > '7' || x > 07777)
				return hearth_error_set(err, HEARTH_EINVAL,
							"%s: bad mode '%s' (octal, like 0660)", k->name, v);
			x = x * 8 + (uint64_t)(*p - '0');
		}
		if (x > k->max)
			return hearth_error_set(err, HEARTH_ERANGE,
						"%s: %s has bits beyond 0777 (no setuid, setgid or sticky)",
						k->name, v);
		cfg->socket_mode = (mode_t)x;
		return 0;
	}
	case KIND_USERS: {
		uint32_t ids[CONFIG_LIST_MAX];
		size_t n;
		if ((rc = parse_id_list(k, v, ids, &n, err)))
			return rc;
		for (size_t i = 0; i < n; i++)
			cfg->allow_uids[i] = (uid_t)ids[i];
		for (size_t i = n; i < CONFIG_LIST_MAX; i++)
			cfg->allow_uids[i] = 0;
		cfg->n_allow_uids = n;
		return 0;
	}
	case KIND_GROUPS: {
		uint32_t ids[CONFIG_LIST_MAX];
		size_t n;
		if ((rc = parse_id_list(k, v, ids, &n, err)))
			return rc;
		for (size_t i = 0; i < n; i++)
			cfg->allow_gids[i] = (gid_t)ids[i];
		for (size_t i = n; i < CONFIG_LIST_MAX; i++)
			cfg->allow_gids[i] = 0;
		cfg->n_allow_gids = n;
		return 0;
	}
	case KIND_LEVEL: {
		enum log_level l;
		if ((rc = log_level_parse(v, &l, err))) {
			hearth_error_prefix(err, "%s", k->name);
			return rc;
		}
		cfg->log_level = l;
		return 0;
	}
	case KIND_ENUM: {
		int i = 0;
		if ((rc = parse_enum(k, v, &i, err)))
			return rc;
		if (k->offset == F(hugepages))
			cfg->hugepages = (enum config_hugepages)i;
		else if (k->offset == F(weights))
			cfg->weights = (enum config_weights)i;
		else if (k->offset == F(weights_group))
			cfg->weights_group = (enum config_weights_group)i;
		else if (k->offset == F(head))
			cfg->head = (enum config_head)i;
		else if (k->offset == F(model_swap))
			cfg->model_swap = (enum config_model_swap)i;
		else
			cfg->kv_type = (enum config_kv_type)i;
		return 0;
	}
	}
	return hearth_error_set(err, HEARTH_EINVAL, "%s: unhandled key kind", k->name);
}

int config_set(struct hearth_config *cfg, const char *key, const char *value,
	       struct hearth_error *err)
{
	const struct key *k = key_find(key);
	if (!k)
		return unknown_key(key, err);
	return set_value(cfg, k, value, err);
}

int config_set_pair(struct hearth_config *cfg, const char *pair, struct hearth_error *err)
{
	const char *eq = strchr(pair, '=');
	if (!eq)
		return hearth_error_set(err, HEARTH_EINVAL, "expected key=value, got '%s'", pair);
	char key[64];
	size_t n = (size_t)(eq - pair);
	if (n == 0 || n >= sizeof key)
		return hearth_error_set(err, HEARTH_EINVAL, "expected key=value, got '%s'", pair);
	memcpy(key, pair, n);
	key[n] = '\0';
	return config_set(cfg, key, eq + 1, err);
}

/* Reads at most CONFIG_FILE_MAX bytes of a regular file into a NUL-terminated buffer. */
#define CONFIG_FILE_MAX (1u << 20)

static int read_file(const char *path, char **out, size_t *len, struct hearth_error *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return hearth_error_errno(err, HEARTH_EIO, errno, "%s", path);
	struct stat st;
	if (fstat(fd, &st) != 0) {
		int e = errno;
		close(fd);
		return hearth_error_errno(err, HEARTH_EIO, e, "%s", path);
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return hearth_error_set(err, HEARTH_EINVAL, "%s: not a regular file", path);
	}
	if (st.st_size > CONFIG_FILE_MAX) {
		close(fd);
		return hearth_error_set(err, HEARTH_ERANGE, "%s: larger than %u bytes", path,
					CONFIG_FILE_MAX);
	}
	char *buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		close(fd);
		return hearth_error_set(err, HEARTH_ENOMEM, "%s: out of memory", path);
	}
	size_t n = 0;
	while (n < (size_t)st.st_size) {
		ssize_t r = read(fd, buf + n, (size_t)st.st_size - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int e = errno;
			free(buf);
			close(fd);
			return hearth_error_errno(err, HEARTH_EIO, e, "%s", path);
		}
		if (r == 0)
			break; /* shrank while we read; take what is there */
		n += (size_t)r;
	}
	close(fd);
	buf[n] = '\0';
	*out = buf;
	*len = n;
	return 0;
}

static int parse_line(struct hearth_config *cfg, char *line, unsigned lineno,
		      unsigned *seen_on, struct hearth_error *err)
{
	char *p = line;
	while (isspace((unsigned char)*p))
		p++;
	if (!*p || *p == '#')
		return 0;
	char *eq = strchr(p, '=');
	if (!eq)
		return hearth_error_set(err, HEARTH_EFORMAT, "expected 'key = value'");
	char *kend = eq;
	while (kend > p && isspace((unsigned char)kend[-1]))
		kend--;
	*kend = '\0';
	if (!*p)
		return hearth_error_set(err, HEARTH_EFORMAT, "missing key before '='");
	for (char *c = p; *c; c++)
		if (!islower((unsigned char)*c) && !isdigit((unsigned char)*c) && *c != '_')
			return hearth_error_set(err, HEARTH_EFORMAT, "bad key '%s'", p);
	char *v = eq + 1;
	while (isspace((unsigned char)*v))
		v++;
	char *vend = v + strlen(v);
	while (vend > v && isspace((unsigned char)vend[-1]))
		vend--;
	*vend = '\0';
	const struct key *k = key_find(p);
	if (!k)
		return unknown_key(p, err);
	size_t idx = (size_t)(k - keys);
	if (seen_on[idx])
		return hearth_error_set(err, HEARTH_EINVAL, "'%s' is already set on line %u", k->name,
					seen_on[idx]);
	seen_on[idx] = lineno;
	int rc = set_value(cfg, k, v, err);
	if (rc && strchr(v, '#')) {
		size_t n = strlen(err->msg);
		snprintf(err->msg + n, sizeof err->msg - n, " (comments must be on their own line)");
	}
	return rc;
}

int config_load_file(struct hearth_config *cfg, const char *path, struct hearth_error *err)
{
	char *buf = NULL;
	size_t len = 0;
	int rc = read_file(path, &buf, &len, err);
	if (rc)
		return rc;
	unsigned seen_on[N_KEYS] = { 0 };
	unsigned lineno = 0;
	char *p = buf, *end = buf + len;
	while (p < end) {
		lineno++;
		char *nl = memchr(p, '\n', (size_t)(end - p));
		char *eol = nl ? nl : end;
		size_t n = (size_t)(eol - p);
		struct hearth_error local;
		hearth_error_clear(&local);
		if (memchr(p, '\0', n)) {
			rc = hearth_error_set(&local, HEARTH_EFORMAT, "NUL byte in line");
		} else if (n >= CONFIG_LINE_MAX) {
			rc = hearth_error_set(&local, HEARTH_EFORMAT, "line longer than %d bytes",
					      CONFIG_LINE_MAX - 1);
		} else {
			*eol = '\0';
			if (n && p[n - 1] == '\r')
				p[n - 1] = '\0';
			rc = parse_line(cfg, p, lineno, seen_on, &local);
		}
		if (rc) {
			hearth_error_set(err, rc, "%s:%u: %s", path, lineno, local.msg);
			free(buf);
			return rc;
		}
		p = eol + 1;
	}
	free(buf);
	return 0;
}

int config_check(const struct hearth_config *cfg, struct hearth_error *err)
{
	if (!cfg->model[0])
		return hearth_error_set(err, HEARTH_EINVAL,
					"no model configured: set 'model = /path/to/file.gguf' in the "
					"config file or pass --model=PATH");
	return 0;
}

int config_build(struct hearth_config *cfg, const char *path, const char *const *sets,
		 size_t n_sets, struct hearth_error *err)
{
	/* Built in a scratch copy so that a failure anywhere leaves *cfg as it was. */
	struct hearth_config *c = malloc(sizeof *c);
	if (!c)
		return hearth_error_set(err, HEARTH_ENOMEM, "out of memory reading the configuration");
	config_defaults(c);
	int rc = path ? config_load_file(c, path, err) : 0;
	for (size_t i = 0; rc == 0 && i < n_sets; i++) {
		rc = config_set_pair(c, sets[i], err);
		if (rc)
			hearth_error_prefix(err, "command line");
	}
	if (rc == 0)
		rc = config_check(c, err);
	if (rc == 0)
		*cfg = *c;
	free(c);
	return rc;
}

static void format_ids(const struct key *k, const uint32_t *ids, size_t n, char *buf, size_t size)
{
	size_t used = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < n && used < size; i++) {
		char name[256];
		const char *shown = NULL;
		char tmp[16384];
		if (k->kind == KIND_USERS) {
			struct passwd pw, *res = NULL;
			if (getpwuid_r(ids[i], &pw, tmp, sizeof tmp, &res) == 0 && res &&
			    !all_digits(pw.pw_name))
				shown = pw.pw_name;
		} else {
			struct group gr, *res = NULL;
			if (getgrgid_r(ids[i], &gr, tmp, sizeof tmp, &res) == 0 && res &&
			    !all_digits(gr.gr_name))
				shown = gr.gr_name;
		}
		/* A name that resolves to another id than this one (duplicate names) would not
		 * read back the same; print the number then. */
		unsigned long back;
		if (shown && (lookup_name(k->kind == KIND_GROUPS, shown, &back, NULL) != 0 ||
			      back != ids[i]))
			shown = NULL;
		if (shown)
			snprintf(name, sizeof name, "%s", shown);
		else
			snprintf(name, sizeof name, "%" PRIu32, ids[i]);
		int w = snprintf(buf + used, size - used, "%s%s", i ? "," : "", name);
		if (w < 0)
			return;
		used += (size_t)w;
	}
}

int config_format(const struct hearth_config *cfg, const char *key, char *buf, size_t size,
		  struct hearth_error *err)
{
	const struct key *k = key_find(key);
	if (!k)
		return unknown_key(key, err);
	const char *field = (const char *)cfg + k->offset;
	switch (k->kind) {
	case KIND_PATH:
	case KIND_SOCKET:
		snprintf(buf, size, "%s", field);
		break;
	case KIND_U32:
		snprintf(buf, size, "%" PRIu32, *(const uint32_t *)field);
		break;
	case KIND_U64:
		snprintf(buf, size, "%" PRIu64, *(const uint64_t *)field);
		break;
	case KIND_SIZE: {
		char tmp[24];
		snprintf(buf, size, "%s", units_format_size(*(const uint64_t *)field, tmp, sizeof tmp));
		break;
	}
	case KIND_DURATION: {
		char tmp[24];
		snprintf(buf, size, "%s",
			 units_format_duration(*(const uint64_t *)field, tmp, sizeof tmp));
		break;
	}
	case KIND_THREADS:
		if (cfg->threads == 0)
			snprintf(buf, size, "auto");
		else
			snprintf(buf, size, "%" PRIu32, cfg->threads);
		break;
	case KIND_NODE:
		if (cfg->numa_node < 0)
			snprintf(buf, size, "auto");
		else
			snprintf(buf, size, "%d", cfg->numa_node);
		break;
	case KIND_BOOL:
		snprintf(buf, size, "%s", *(const bool *)field ? "yes" : "no");
		break;
	case KIND_MODE:
		snprintf(buf, size, "%04o", (unsigned)cfg->socket_mode);
		break;
	case KIND_USERS: {
		uint32_t ids[CONFIG_LIST_MAX];
		for (size_t i = 0; i < cfg->n_allow_uids; i++)
			ids[i] = (uint32_t)cfg->allow_uids[i];
		format_ids(k, ids, cfg->n_allow_uids, buf, size);
		break;
	}
	case KIND_GROUPS: {
		uint32_t ids[CONFIG_LIST_MAX];
		for (size_t i = 0; i < cfg->n_allow_gids; i++)
			ids[i] = (uint32_t)cfg->allow_gids[i];
		format_ids(k, ids, cfg->n_allow_gids, buf, size);
		break;
	}
	case KIND_LEVEL:
		snprintf(buf, size, "%s", log_level_name(cfg->log_level));
		break;
	case KIND_ENUM: {
		int i = k->offset == F(hugepages) ? (int)cfg->hugepages
			: k->offset == F(weights) ? (int)cfg->weights
			: k->offset == F(weights_group) ? (int)cfg->weights_group
			: k->offset == F(head) ? (int)cfg->head
			: k->offset == F(model_swap) ? (int)cfg->model_swap
			: (int)cfg->kv_type;
		snprintf(buf, size, "%s", k->words[i]);
		break;
	}
	}
	return 0;
}

bool config_key_reloadable(const char *key)
{
	const struct key *k = key_find(key);
	return k && k->reloadable;
}

/* Field-by-field copy of one key's storage; list keys carry their count along. */
static void key_copy(struct hearth_config *dst, const struct hearth_config *src, const struct key *k)
{
	switch (k->kind) {
	case KIND_USERS:
		memcpy(dst->allow_uids, src->allow_uids, sizeof dst->allow_uids);
		dst->n_allow_uids = src->n_allow_uids;
		return;
	case KIND_GROUPS:
		memcpy(dst->allow_gids, src->allow_gids, sizeof dst->allow_gids);
		dst->n_allow_gids = src->n_allow_gids;
		return;
	case KIND_U32:
	case KIND_THREADS:
		*(uint32_t *)((char *)dst + k->offset) = *(const uint32_t *)((const char *)src + k->offset);
		return;
	case KIND_U64:
	case KIND_SIZE:
	case KIND_DURATION:
		*(uint64_t *)((char *)dst + k->offset) = *(const uint64_t *)((const char *)src + k->offset);
		return;
	case KIND_LEVEL:
		dst->log_level = src->log_level;
		return;
	default:
		return; /* no reloadable key of the other kinds */
	}
}

static bool key_differs(const struct hearth_config *a, const struct hearth_config *b,
			const struct key *k)
{
	char va[1024], vb[1024];
	/* Comparing canonical text keeps this correct for every kind without a second switch;
	 * reload is rare, so the cost does not matter. */
	config_format(a, k->name, va, sizeof va, NULL);
	config_format(b, k->name, vb, sizeof vb, NULL);
	return strcmp(va, vb) != 0;
}

void config_reload_merge(struct hearth_config *live, const struct hearth_config *fresh,
			 char *restart_keys, size_t size)
{
	size_t used = 0;
	if (size)
		restart_keys[0] = '\0';
	for (size_t i = 0; i < N_KEYS; i++) {
		const struct key *k = &keys[i];
		if (k->reloadable) {
			key_copy(live, fresh, k);
		} else if (key_differs(live, fresh, k) && used < size) {
			int w = snprintf(restart_keys + used, size - used, "%s%s", used ? "," : "",
					 k->name);
			if (w > 0)
				used += (size_t)w;
		}
	}
}
