/* Byte sizes and durations as people write them. Strict on purpose: anything not fully
 * consumed is an error, so "256MB" or "10 sec" is rejected with the offending text instead of
 * silently meaning something else. */
#include "protocol/units.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

struct unit {
	const char *name;
	uint64_t factor;
};

static const struct unit size_units[] = {
	{ "", 1 }, { "B", 1 },
	{ "K", 1ull << 10 }, { "KiB", 1ull << 10 },
	{ "M", 1ull << 20 }, { "MiB", 1ull << 20 },
	{ "G", 1ull << 30 }, { "GiB", 1ull << 30 },
	{ "T", 1ull << 40 }, { "TiB", 1ull << 40 },
};

static const struct unit duration_units[] = {
	{ "", 1000000 }, { "us", 1 }, { "ms", 1000 }, { "s", 1000000 },
	{ "min", 60000000ull }, { "h", 3600000000ull },
};

/* Splits "  123 MiB " into the number and the suffix word; the number must be plain decimal
 * digits (strtoull alone would accept signs, blanks and hex). */
static int parse_number_suffix(const char *text, const char *what, uint64_t *num,
			       const char **suffix, size_t *suffix_len, struct hearth_error *err)
{
	const char *p = text;
	while (isspace((unsigned char)*p))
		p++;
	if (!isdigit((unsigned char)*p))
		return hearth_error_set(err, HEARTH_EINVAL, "bad %s '%s': expected a number", what, text);
	uint64_t v = 0;
	while (isdigit((unsigned char)*p)) {
		uint64_t d = (uint64_t)(*p - '0');
		if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, d, &v))
			return hearth_error_set(err, HEARTH_ERANGE, "%s '%s' is too large", what, text);
		p++;
	}
	if (*p == '.' || *p == ',')
		return hearth_error_set(err, HEARTH_EINVAL,
					"bad %s '%s': fractions are not accepted, use a smaller unit", what, text);
	while (isspace((unsigned char)*p))
		p++;
	const char *s = p;
	while (*p && !isspace((unsigned char)*p))
		p++;
	size_t n = (size_t)(p - s);
	while (isspace((unsigned char)*p))
		p++;
	if (*p)
		return hearth_error_set(err, HEARTH_EINVAL, "bad %s '%s': trailing text", what, text);
	*num = v;
	*suffix = s;
	*suffix_len = n;
	return 0;
}

static const struct unit *unit_find(const struct unit *units, size_t n_units, const char *s,
				    size_t n)
{
	for (size_t i = 0; i < n_units; i++)
		if (strlen(units[i].name) == n && strncmp(units[i].name, s, n) == 0)
			return &units[i];
	return NULL;
}

int units_parse_size(const char *text, uint64_t *out, struct hearth_error *err)
{
	uint64_t v;
	const char *s;
	size_t n;
	int rc = parse_number_suffix(text, "size", &v, &s, &n, err);
	if (rc)
		return rc;
	const struct unit *u = unit_find(size_units, sizeof size_units / sizeof size_units[0], s, n);
	if (!u) {
		if (n == 2 && strchr("kKMGT", s[0]) && s[1] == 'B')
			return hearth_error_set(err, HEARTH_EINVAL,
						"bad size '%s': decimal units are ambiguous here, write %.1siB (1024-based)",
						text, s[0] == 'k' ? "K" : s);
		return hearth_error_set(err, HEARTH_EINVAL,
					"bad size '%s': unknown unit '%.*s' (use B, KiB, MiB, GiB, TiB)",
					text, (int)n, s);
	}
	uint64_t bytes;
	if (__builtin_mul_overflow(v, u->factor, &bytes))
		return hearth_error_set(err, HEARTH_ERANGE, "size '%s' is too large", text);
	*out = bytes;
	return 0;
}

int units_parse_duration(const char *text, uint64_t *out_usec, struct hearth_error *err)
{
	uint64_t v;
	const char *s;
	size_t n;
	int rc = parse_number_suffix(text, "duration", &v, &s, &n, err);
	if (rc)
		return rc;
	const struct unit *u =
		unit_find(duration_units, sizeof duration_units / sizeof duration_units[0], s, n);
	if (!u)
		return hearth_error_set(err, HEARTH_EINVAL,
					"bad duration '%s': unknown unit '%.*s' (use us, ms, s, min, h)",
					text, (int)n, s);
	uint64_t usec;
	if (__builtin_mul_overflow(v, u->factor, &usec))
		return hearth_error_set(err, HEARTH_ERANGE, "duration '%s' is too large", text);
	*out_usec = usec;
	return 0;
}

/* Largest unit that divides the value exactly, so the printed form reads back unchanged. */
static char *format_exact(uint64_t v, const struct unit *units, size_t n_units, const char *zero,
			  char *buf, size_t size)
{
	if (v == 0) {
		snprintf(buf, size, "%s", zero);
		return buf;
	}
	const struct unit *best = NULL;
	for (size_t i = 0; i < n_units; i++)
		if (units[i].name[0] && v % units[i].factor == 0 &&
		    (!best || units[i].factor > best->factor))
			best = &units[i];
	if (!best)
		snprintf(buf, size, "%" PRIu64, v);
	else
		snprintf(buf, size, "%" PRIu64 "%s", v / best->factor, best->name);
	return buf;
}

char *units_format_size(uint64_t bytes, char *buf, size_t size)
{
	/* Only the long spellings, and bare bytes for values that are not a KiB multiple. */
	static const struct unit printed[] = {
		{ "KiB", 1ull << 10 }, { "MiB", 1ull << 20 }, { "GiB", 1ull << 30 }, { "TiB", 1ull << 40 },
	};
	return format_exact(bytes, printed, sizeof printed / sizeof printed[0], "0", buf, size);
}

char *units_format_duration(uint64_t usec, char *buf, size_t size)
{
	static const struct unit printed[] = {
		{ "us", 1 }, { "ms", 1000 }, { "s", 1000000 }, { "min", 60000000ull }, { "h", 3600000000ull },
	};
	return format_exact(usec, printed, sizeof printed / sizeof printed[0], "0s", buf, size);
}
