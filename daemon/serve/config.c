/* The key table and the parsers behind it: one row per key holds its name, kind, field,
 * default, bounds (or an enum's words), check hook and how a reload applies it, so defaults,
 * file, flags, formatting, reload and the documentation test all walk the same list. */
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

#include "daemon/engine/load.h"
#include "daemon/engine/model.h"
#include "daemon/serve/draft.h"
#include "protocol/units.h"

struct key;

/* How a kind of value is read and printed. parse writes the value into cfg only when the
 * whole text is good; format prints the canonical text parse reads back. */
struct kind {
	bool empty_ok;                  /* "" is a value (an empty list), not an error */
	int (*parse)(const struct key *k, const char *v, struct hearth_config *cfg,
		     struct hearth_error *err);
	void (*format)(const struct key *k, const struct hearth_config *cfg, char *buf,
		       size_t size);
};

/* One row per key: everything about a key is here and nowhere else. */
struct key {
	const char *name;
	const struct kind *kind;
	size_t offset, size;            /* the field in struct hearth_config */
	const char *def;                /* canonical text of the default; NULL: unset (zero) */
	uint64_t min, max;              /* numbers, sizes, durations, modes */
	const char *const *words;       /* enums: indexed by the enum value, NULL-terminated */
	bool has_auto;                  /* numbers: "auto" is a value, stored as auto_value */
	int64_t auto_value;
	bool group;                     /* id lists: names are groups, not users */
	size_t count_offset;            /* id lists: the size_t holding the entry count */
	size_t set_offset;              /* a bool made true when the key is set; 0: none */
	/* Checks what the kind cannot (a socket path must be absolute); may be NULL. */
	int (*check)(const struct key *k, const char *v, struct hearth_error *err);
	enum config_reload reload;
};

static const struct kind kind_path, kind_uint, kind_size, kind_duration, kind_bool, kind_mode,
	kind_ids, kind_level, kind_enum;

static int socket_check(const struct key *k, const char *v, struct hearth_error *err);

static const char *const hugepages_words[] = { "auto", "hugetlb", "thp", "none", NULL };
static const char *const weights_words[] = { "w4a16", "w4a8", NULL };
static const char *const weights_group_words[] = { "128", "32", "64", NULL };
static const char *const head_words[] = { "auto", "int4", "int6", "int8", NULL };
static const char *const weights_mix_words[] = { "auto", "off", NULL };
static const char *const model_swap_words[] = { "auto", "beside", "drain", NULL };
static const char *const prefix_share_words[] = { "uid", "group", "all", NULL };
static const char *const kv_type_words[] = { "f16", "bf16", "f32", "q8", NULL };

#define F(field) .offset = offsetof(struct hearth_config, field), \
	.size = sizeof(((struct hearth_config *)0)->field)
#define STR_(x) #x
#define STR(x) STR_(x)

/* The order is the documentation order of hearthd.conf(5). The defaults the loader shares
 * (max_context, kv_budget) are its macros, spelled as text here. weights defaults to w4a8
 * for the daemon while load_opts_default keeps w4a16: on VNNI CPUs prefill runs at the int8
 * rate and decode is at least as fast, at the same fidelity (doc/benchmarks.md); tools and
 * tests that call the loader directly need no VNNI. */
static const struct key keys[] = {
	{ "model", &kind_path, F(model), .reload = CONFIG_RELOAD_MODEL },
	{ "chat_template", &kind_path, F(chat_template), .reload = CONFIG_RELOAD_MODEL },
	{ "draft_model", &kind_path, F(draft_model), .reload = CONFIG_RELOAD_MODEL },
	{ "draft_kv_budget", &kind_size, F(draft_kv_budget), "64MiB", 1ull << 20, 1ull << 40,
	  .reload = CONFIG_RELOAD_MODEL },
	{ "max_context", &kind_uint, F(max_context), STR(LOAD_DEFAULT_MAX_CONTEXT), 1,
	  MODEL_MAX_CTX_LIMIT, .reload = CONFIG_RELOAD_MODEL },
	{ "kv_budget", &kind_size, F(kv_budget), STR(LOAD_DEFAULT_KV_BUDGET_MIB) "MiB", 1ull << 20,
	  1ull << 40, .reload = CONFIG_RELOAD_MODEL,
	  .set_offset = offsetof(struct hearth_config, kv_budget_set) },
	{ "kv_type", &kind_enum, F(kv_type), "f16", .words = kv_type_words,
	  .reload = CONFIG_RELOAD_MODEL },
	{ "weights", &kind_enum, F(weights), "w4a8", .words = weights_words,
	  .reload = CONFIG_RELOAD_MODEL },
	{ "weights_group", &kind_enum, F(weights_group), "64", .words = weights_group_words,
	  .reload = CONFIG_RELOAD_MODEL },
	{ "head", &kind_enum, F(head), "auto", .words = head_words,
	  .reload = CONFIG_RELOAD_MODEL },
	{ "weights_mix", &kind_enum, F(weights_mix), "auto", .words = weights_mix_words,
	  .reload = CONFIG_RELOAD_MODEL },
	{ "imatrix", &kind_path, F(imatrix), CONFIG_IMATRIX_AUTO, .reload = CONFIG_RELOAD_MODEL },
	{ "imatrix_samples", &kind_uint, F(imatrix_samples), "64", 1, 4096, .reload = CONFIG_RELOAD_MODEL },
	{ "imatrix_cache", &kind_path, F(imatrix_cache), .reload = CONFIG_RELOAD_MODEL },
	{ "weights_cache", &kind_path, F(weights_cache), .reload = CONFIG_RELOAD_MODEL },
	{ "threads", &kind_uint, F(threads), "auto", 0, 1024, .has_auto = true, .auto_value = 0,
	  .reload = CONFIG_RELOAD_MODEL },
	{ "numa_node", &kind_uint, F(numa_node), "auto", 0, 1023, .has_auto = true,
	  .auto_value = -1, .reload = CONFIG_RELOAD_MODEL },
	{ "hugepages", &kind_enum, F(hugepages), "auto", .words = hugepages_words,
	  .reload = CONFIG_RELOAD_MODEL },
	{ "lock_memory", &kind_bool, F(lock_memory), "no", .reload = CONFIG_RELOAD_MODEL },
	{ "socket", &kind_path, F(socket), CONFIG_DEFAULT_SOCKET, .check = socket_check,
	  .reload = CONFIG_RELOAD_RESTART },
	{ "socket_mode", &kind_mode, F(socket_mode), "0660", 0, 0777,
	  .reload = CONFIG_RELOAD_RESTART },
	{ "allow_users", &kind_ids, F(allow_uids), "",
	  .count_offset = offsetof(struct hearth_config, n_allow_uids),
	  .reload = CONFIG_RELOAD_LIVE },
	{ "allow_groups", &kind_ids, F(allow_gids), "", .group = true,
	  .count_offset = offsetof(struct hearth_config, n_allow_gids),
	  .reload = CONFIG_RELOAD_LIVE },
	{ "max_requests_per_client", &kind_uint, F(max_requests_per_client), "8", 1, 1024,
	  .reload = CONFIG_RELOAD_LIVE },
	{ "max_queued_tokens_per_client", &kind_uint, F(max_queued_tokens_per_client), "65536", 1,
	  UINT32_MAX, .reload = CONFIG_RELOAD_LIVE },
	{ "max_requests_per_uid", &kind_uint, F(max_requests_per_uid), "16", 1, 65536,
	  .reload = CONFIG_RELOAD_LIVE },
	{ "max_clients", &kind_uint, F(max_clients), "256", 1, 65536, .reload = CONFIG_RELOAD_LIVE },
	{ "max_clients_per_uid", &kind_uint, F(max_clients_per_uid), "64", 1, 65536,
	  .reload = CONFIG_RELOAD_LIVE },
	{ "client_timeout", &kind_duration, F(client_timeout_usec), "10s", 100000, 3600ull * 1000000,
	  .reload = CONFIG_RELOAD_LIVE },
	{ "client_send_queue", &kind_size, F(client_send_queue), "4MiB", 64ull << 10, 1ull << 30,
	  .reload = CONFIG_RELOAD_LIVE },
	{ "log_level", &kind_level, F(log_level), "info", .reload = CONFIG_RELOAD_LIVE },
	{ "shutdown_grace", &kind_duration, F(shutdown_grace_usec), "10s", 0, 3600ull * 1000000,
	  .reload = CONFIG_RELOAD_LIVE },
	{ "model_swap", &kind_enum, F(model_swap), "auto", .words = model_swap_words,
	  .reload = CONFIG_RELOAD_LIVE },
	{ "prefix_share", &kind_enum, F(prefix_share), "uid", .words = prefix_share_words,
	  .reload = CONFIG_RELOAD_LIVE },
};

#define N_KEYS (sizeof keys / sizeof keys[0])

/* Enums are stored through an int, id lists through uint32_t. */
_Static_assert(sizeof(enum config_kv_type) == sizeof(int) &&
	       sizeof(enum config_model_swap) == sizeof(int) &&
	       sizeof(enum config_prefix_share) == sizeof(int) &&
	       sizeof(enum log_level) == sizeof(int), "config enums are int-sized");
_Static_assert(sizeof(uid_t) == sizeof(uint32_t) && sizeof(gid_t) == sizeof(uint32_t),
	       "uid_t and gid_t are 32-bit");

static void *key_field(struct hearth_config *cfg, const struct key *k)
{
	return (char *)cfg + k->offset;
}

static const void *key_cfield(const struct hearth_config *cfg, const struct key *k)
{
	return (const char *)cfg + k->offset;
}

/* Unsigned fields of any width through one pair of helpers; the row says the width. */
static void store_uint(void *field, size_t size, uint64_t x)
{
	switch (size) {
	case 1: { uint8_t v = (uint8_t)x; memcpy(field, &v, 1); return; }
	case 2: { uint16_t v = (uint16_t)x; memcpy(field, &v, 2); return; }
	case 4: { uint32_t v = (uint32_t)x; memcpy(field, &v, 4); return; }
	default: memcpy(field, &x, 8); return;
	}
}

static uint64_t load_uint(const void *field, size_t size)
{
	switch (size) {
	case 1: { uint8_t v; memcpy(&v, field, 1); return v; }
	case 2: { uint16_t v; memcpy(&v, field, 2); return v; }
	case 4: { uint32_t v; memcpy(&v, field, 4); return v; }
	default: { uint64_t v; memcpy(&v, field, 8); return v; }
	}
}

/* auto_value as the field holds it (-1 in an int reads back as 0xffffffff). */
static uint64_t key_auto_bits(const struct key *k)
{
	uint64_t x = (uint64_t)k->auto_value;
	return k->size >= 8 ? x : x & ((1ull << (8 * k->size)) - 1);
}
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
	for (size_t i = 0; i < N_KEYS; i++) {
		if (!keys[i].def)
			continue;
		struct hearth_error err;
		int rc = keys[i].kind->parse(&keys[i], keys[i].def, cfg, &err);
		/* A default the table cannot read is a defect in the table; the tests read every
		 * one, so this never fires in a built daemon. */
		if (rc) {
			fprintf(stderr, "hearthd: bad built-in default: %s\n", err.msg);
			abort();
		}
	}
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

static int path_parse(const struct key *k, const char *v, struct hearth_config *cfg,
		      struct hearth_error *err)
{
	if (k->check) {
		int rc = k->check(k, v, err);
		if (rc)
			return rc;
	}
	size_t n = strlen(v);
	if (n >= k->size)
		return hearth_error_set(err, HEARTH_ERANGE, "%s: path longer than %zu bytes", k->name,
					k->size - 1);
	char *field = key_field(cfg, k);
	memset(field, 0, k->size);
	memcpy(field, v, n);
	return 0;
}

static void path_format(const struct key *k, const struct hearth_config *cfg, char *buf,
			size_t size)
{
	snprintf(buf, size, "%s", (const char *)key_cfield(cfg, k));
}

static int socket_check(const struct key *k, const char *v, struct hearth_error *err)
{
	if (v[0] != '/')
		return hearth_error_set(err, HEARTH_EINVAL, "%s: '%s' is not an absolute path",
					k->name, v);
	if (strlen(v) >= k->size)
		return hearth_error_set(err, HEARTH_ERANGE,
					"%s: path longer than %zu bytes (the limit of a Unix socket address)",
					k->name, k->size - 1);
	return 0;
}

static int uint_parse(const struct key *k, const char *v, struct hearth_config *cfg,
		      struct hearth_error *err)
{
	uint64_t x;
	if (k->has_auto && strcmp(v, "auto") == 0) {
		x = key_auto_bits(k);
	} else {
		int rc = parse_u64(k->name, v, k->min, k->max, &x, err);
		if (rc)
			return rc;
	}
	store_uint(key_field(cfg, k), k->size, x);
	return 0;
}

static void uint_format(const struct key *k, const struct hearth_config *cfg, char *buf,
			size_t size)
{
	uint64_t x = load_uint(key_cfield(cfg, k), k->size);
	if (k->has_auto && x == key_auto_bits(k))
		snprintf(buf, size, "auto");
	else
		snprintf(buf, size, "%" PRIu64, x);
}

static int size_parse(const struct key *k, const char *v, struct hearth_config *cfg,
		      struct hearth_error *err)
{
	uint64_t x;
	char lo[16], hi[16];
	int rc = units_parse_size(v, &x, err);
	if (rc) {
		hearth_error_prefix(err, "%s", k->name);
		return rc;
	}
	if (x < k->min || x > k->max)
		return hearth_error_set(err, HEARTH_ERANGE, "%s: %s is out of range %s..%s", k->name, v,
					units_format_size(k->min, lo, sizeof lo),
					units_format_size(k->max, hi, sizeof hi));
	store_uint(key_field(cfg, k), k->size, x);
	return 0;
}

static void size_format(const struct key *k, const struct hearth_config *cfg, char *buf,
			size_t size)
{
	char tmp[24];
	snprintf(buf, size, "%s",
		 units_format_size(load_uint(key_cfield(cfg, k), k->size), tmp, sizeof tmp));
}

static int duration_parse(const struct key *k, const char *v, struct hearth_config *cfg,
			  struct hearth_error *err)
{
	uint64_t x;
	char limit[24];
	int rc = units_parse_duration(v, &x, err);
	if (rc) {
		hearth_error_prefix(err, "%s", k->name);
		return rc;
	}
	if (x < k->min)
		return hearth_error_set(err, HEARTH_ERANGE, "%s: %s is shorter than %s", k->name, v,
					units_format_duration(k->min, limit, sizeof limit));
	if (x > k->max)
		return hearth_error_set(err, HEARTH_ERANGE, "%s: %s is longer than %s", k->name, v,
					units_format_duration(k->max, limit, sizeof limit));
	store_uint(key_field(cfg, k), k->size, x);
	return 0;
}

static void duration_format(const struct key *k, const struct hearth_config *cfg, char *buf,
			    size_t size)
{
	char tmp[24];
	snprintf(buf, size, "%s",
		 units_format_duration(load_uint(key_cfield(cfg, k), k->size), tmp, sizeof tmp));
}

static int bool_parse(const struct key *k, const char *v, struct hearth_config *cfg,
		      struct hearth_error *err)
{
	static const char *const yes[] = { "yes", "true", "on", "1" };
	static const char *const no[] = { "no", "false", "off", "0" };
	bool *field = key_field(cfg, k);
	for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
		if (strcmp(v, yes[i]) == 0) {
			*field = true;
			return 0;
		}
		if (strcmp(v, no[i]) == 0) {
			*field = false;
			return 0;
		}
	}
	return hearth_error_set(err, HEARTH_EINVAL, "%s: bad boolean '%s' (use yes or no)", k->name,
				v);
}

static void bool_format(const struct key *k, const struct hearth_config *cfg, char *buf,
			size_t size)
{
	snprintf(buf, size, "%s", *(const bool *)key_cfield(cfg, k) ? "yes" : "no");
}

/* Octal always, with or without the leading 0, as chmod(1) reads it. */
static int mode_parse(const struct key *k, const char *v, struct hearth_config *cfg,
		      struct hearth_error *err)
{
	uint64_t x = 0;
	for (const char *p = v; *p; p++) {
		if (*p < '0' || *p > '7' || x > 07777)
			return hearth_error_set(err, HEARTH_EINVAL, "%s: bad mode '%s' (octal, like 0660)",
						k->name, v);
		x = x * 8 + (uint64_t)(*p - '0');
	}
	if (x > k->max)
		return hearth_error_set(err, HEARTH_ERANGE,
					"%s: %s has bits beyond %04" PRIo64 " (no setuid, setgid or sticky)",
					k->name, v, k->max);
	store_uint(key_field(cfg, k), k->size, x);
	return 0;
}

static void mode_format(const struct key *k, const struct hearth_config *cfg, char *buf,
			size_t size)
{
	snprintf(buf, size, "%04" PRIo64, load_uint(key_cfield(cfg, k), k->size));
}

static int enum_parse(const struct key *k, const char *v, struct hearth_config *cfg,
		      struct hearth_error *err)
{
	char list[128] = "";
	for (int i = 0; k->words[i]; i++) {
		if (strcmp(v, k->words[i]) == 0) {
			memcpy(key_field(cfg, k), &i, sizeof i);
			return 0;
		}
		size_t n = strlen(list);
		snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", k->words[i]);
	}
	return hearth_error_set(err, HEARTH_EINVAL, "%s: bad value '%s' (use %s)", k->name, v, list);
}

static void enum_format(const struct key *k, const struct hearth_config *cfg, char *buf,
			size_t size)
{
	int i;
	memcpy(&i, key_cfield(cfg, k), sizeof i);
	snprintf(buf, size, "%s", k->words[i]);
}

static int level_parse(const struct key *k, const char *v, struct hearth_config *cfg,
		       struct hearth_error *err)
{
	enum log_level l;
	int rc = log_level_parse(v, &l, err);
	if (rc) {
		hearth_error_prefix(err, "%s", k->name);
		return rc;
	}
	memcpy(key_field(cfg, k), &l, sizeof l);
	return 0;
}

static void level_format(const struct key *k, const struct hearth_config *cfg, char *buf,
			 size_t size)
{
	enum log_level l;
	memcpy(&l, key_cfield(cfg, k), sizeof l);
	snprintf(buf, size, "%s", log_level_name(l));
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

/* A comma list of names or numeric ids; duplicates are dropped. The list is written to cfg
 * only when every entry is good, unused slots zeroed so equal lists compare equal. */
static int ids_parse(const struct key *k, const char *v, struct hearth_config *cfg,
		     struct hearth_error *err)
{
	uint32_t ids[CONFIG_LIST_MAX];
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
			int rc = lookup_name(k->group, name, &id, err);
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
	uint32_t *field = key_field(cfg, k);
	memset(field, 0, k->size);
	memcpy(field, ids, n * sizeof ids[0]);
	memcpy((char *)cfg + k->count_offset, &n, sizeof n);
	return 0;
}

/* The name an id prints as: one that resolves back to the same id, else NULL (print the
 * number), so the text reads back to the same list even with duplicate names. */
static const char *id_name(bool group, uint32_t id, char *tmp, size_t size)
{
	const char *shown = NULL;
	if (group) {
		struct group gr, *res = NULL;
		if (getgrgid_r(id, &gr, tmp, size, &res) == 0 && res && !all_digits(gr.gr_name))
			shown = gr.gr_name;
	} else {
		struct passwd pw, *res = NULL;
		if (getpwuid_r(id, &pw, tmp, size, &res) == 0 && res && !all_digits(pw.pw_name))
			shown = pw.pw_name;
	}
	unsigned long back;
	if (shown && (lookup_name(group, shown, &back, NULL) != 0 || back != id))
		shown = NULL;
	return shown;
}

static void ids_format(const struct key *k, const struct hearth_config *cfg, char *buf,
		       size_t size)
{
	const uint32_t *ids = key_cfield(cfg, k);
	size_t n;
	memcpy(&n, (const char *)cfg + k->count_offset, sizeof n);
	size_t used = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < n && used < size; i++) {
		char tmp[16384];
		const char *shown = id_name(k->group, ids[i], tmp, sizeof tmp);
		int w = shown ? snprintf(buf + used, size - used, "%s%s", i ? "," : "", shown)
			      : snprintf(buf + used, size - used, "%s%" PRIu32, i ? "," : "", ids[i]);
		if (w < 0)
			return;
		used += (size_t)w;
	}
}

static const struct kind kind_path = { false, path_parse, path_format };
static const struct kind kind_uint = { false, uint_parse, uint_format };
static const struct kind kind_size = { false, size_parse, size_format };
static const struct kind kind_duration = { false, duration_parse, duration_format };
static const struct kind kind_bool = { false, bool_parse, bool_format };
static const struct kind kind_mode = { false, mode_parse, mode_format };
static const struct kind kind_ids = { true, ids_parse, ids_format };
static const struct kind kind_level = { false, level_parse, level_format };
static const struct kind kind_enum = { false, enum_parse, enum_format };

static int set_value(struct hearth_config *cfg, const struct key *k, const char *v,
		     struct hearth_error *err)
{
	if (!*v && !k->kind->empty_ok)
		return hearth_error_set(err, HEARTH_EINVAL, "%s: empty value", k->name);
	int rc = k->kind->parse(k, v, cfg, err);
	if (!rc && k->set_offset)
		*(bool *)((char *)cfg + k->set_offset) = true;
	return rc;
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

int config_format(const struct hearth_config *cfg, const char *key, char *buf, size_t size,
		  struct hearth_error *err)
{
	const struct key *k = key_find(key);
	if (!k)
		return unknown_key(key, err);
	k->kind->format(k, cfg, buf, size);
	return 0;
}

const char *config_key_default(const char *key)
{
	const struct key *k = key_find(key);
	return k ? k->def : NULL;
}

enum config_reload config_key_reload(const char *key)
{
	const struct key *k = key_find(key);
	return k ? k->reload : CONFIG_RELOAD_RESTART;
}

bool config_key_reloadable(const char *key)
{
	const struct key *k = key_find(key);
	return k && k->reload == CONFIG_RELOAD_LIVE;
}

/* Comparing canonical text keeps this right for every kind (a path's bytes past its NUL, a
 * list's order of resolution); reload is rare, so the cost does not matter. */
static bool key_differs(const struct hearth_config *a, const struct hearth_config *b,
			const struct key *k)
{
	char va[1024], vb[1024];
	k->kind->format(k, a, va, sizeof va);
	k->kind->format(k, b, vb, sizeof vb);
	return strcmp(va, vb) != 0;
}

bool config_keys_differ(const struct hearth_config *a, const struct hearth_config *b,
			enum config_reload which)
{
	for (size_t i = 0; i < N_KEYS; i++)
		if (keys[i].reload == which && key_differs(a, b, &keys[i]))
			return true;
	return false;
}

void config_reload_merge(struct hearth_config *live, const struct hearth_config *fresh,
			 char *restart_keys, size_t size)
{
	size_t used = 0;
	if (size)
		restart_keys[0] = '\0';
	for (size_t i = 0; i < N_KEYS; i++) {
		const struct key *k = &keys[i];
		if (k->reload == CONFIG_RELOAD_LIVE) {
			memcpy(key_field(live, k), key_cfield(fresh, k), k->size);
			if (k->kind == &kind_ids)
				memcpy((char *)live + k->count_offset,
				       (const char *)fresh + k->count_offset, sizeof(size_t));
		} else if (key_differs(live, fresh, k) && used < size) {
			int w = snprintf(restart_keys + used, size - used, "%s%s", used ? "," : "",
					 k->name);
			if (w > 0)
				used += (size_t)w;
		}
	}
}

void config_load_opts(const struct hearth_config *cfg, struct load_opts *o)
{
	load_opts_default(o);
	o->max_context = cfg->max_context;
	o->kv_budget = cfg->kv_budget;
	o->kv_rings_extra = !cfg->kv_budget_set;
	o->kv_type = cfg->kv_type == CONFIG_KV_BF16 ? QTYPE_BF16
		     : cfg->kv_type == CONFIG_KV_Q8 ? QTYPE_KV_Q8
		     : cfg->kv_type == CONFIG_KV_F32 ? QTYPE_F32 /* the loader refuses it, by name */
						    : QTYPE_F16;
	o->act = cfg->weights == CONFIG_WEIGHTS_W4A8 ? Q4_ACT_A8 : Q4_ACT_A16;
	o->weights_group = cfg->weights_group == CONFIG_GROUP_32   ? LOAD_GROUP_32
			   : cfg->weights_group == CONFIG_GROUP_64 ? LOAD_GROUP_64
								   : LOAD_GROUP_128;
	o->head_bits = cfg->head == CONFIG_HEAD_INT8 ? LOAD_HEAD_INT8
		       : cfg->head == CONFIG_HEAD_INT6 ? LOAD_HEAD_INT6
		       : cfg->head == CONFIG_HEAD_INT4 ? LOAD_HEAD_INT4
						      : 0;
	o->mix = cfg->weights_mix == CONFIG_MIX_OFF ? LOAD_MIX_OFF : LOAD_MIX_AUTO;
	/* "self" and "auto" are the loader thread's to resolve and make (daemon/serve/calib.h)
	 * and name here. */
	o->imatrix = cfg->imatrix[0] && strcmp(cfg->imatrix, CONFIG_IMATRIX_SELF) &&
				     strcmp(cfg->imatrix, CONFIG_IMATRIX_AUTO) && strcmp(cfg->imatrix, CONFIG_IMATRIX_NONE)
			     ? cfg->imatrix
			     : NULL;
	o->n_threads = cfg->threads;
	o->arena.numa_node = cfg->numa_node;
	o->arena.lock_memory = cfg->lock_memory;
	switch (cfg->hugepages) {
	case CONFIG_HUGEPAGES_HUGETLB: o->arena.pages = ARENA_PAGES_HUGETLB; break;
	case CONFIG_HUGEPAGES_THP: o->arena.pages = ARENA_PAGES_THP; break;
	case CONFIG_HUGEPAGES_NONE: o->arena.pages = ARENA_PAGES_NONE; break;
	default: o->arena.pages = ARENA_PAGES_AUTO; break;
	}
	if (cfg->draft_model[0]) {
		o->draft.path = cfg->draft_model;
		o->draft.kv_budget = cfg->draft_kv_budget;
		/* As before the draft shared the arena: its rings follow the model's rule. */
		o->draft.kv_rings_extra = o->kv_rings_extra;
		o->draft.vocab_check = draft_vocab_check;
	}
}
