/* JSON Schema to GBNF: one rule per schema node that needs one, primitives shared, $ref
 * targets as rules (so recursion is a rule calling itself). Every keyword of a schema node
 * is either used, an annotation, or refused with its JSON pointer. The pattern subset:
 * ^...$ anchored; literals, escapes, . [] [^] \d \w \s (and negations), groups (...) and
 * (?:...), |, * + ? {m} {m,} {m,n}; no backreferences, lookaround or lazy semantics. */
#include <ctype.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/json_schema.h"

struct sbuf {
	char *s;
	size_t n, cap;
	bool oom;
};

static void sb_addn(struct sbuf *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->n + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 256;
		while (cap < b->n + n + 1)
			cap *= 2;
		char *g = realloc(b->s, cap);
		if (!g || cap > JSON_SCHEMA_MAX_OUTPUT * 2) {
			free(g);
			b->s = NULL;
			b->oom = true;
			return;
		}
		b->s = g;
		b->cap = cap;
	}
	memcpy(b->s + b->n, s, n);
	b->n += n;
	b->s[b->n] = 0;
}

static void sb_add(struct sbuf *b, const char *s)
{
	sb_addn(b, s, strlen(s));
}

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
	char tmp[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n < sizeof tmp) {
		sb_addn(b, tmp, (size_t)n);
		return;
	}
	char *big = malloc((size_t)n + 1);
	if (!big) {
		b->oom = true;
		return;
	}
	va_start(ap, fmt);
	vsnprintf(big, (size_t)n + 1, fmt, ap);
	va_end(ap);
	sb_addn(b, big, (size_t)n);
	free(big);
}

static char *sb_take(struct sbuf *b)
{
	if (b->oom) {
		free(b->s);
		return NULL;
	}
	if (!b->s)
		return strdup("");
	return b->s;
}

/* A GBNF literal of bytes: "..." with quotes, backslashes and controls escaped. */
static void sb_lit(struct sbuf *b, const char *s, size_t n)
{
	sb_add(b, "\"");
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '"')
			sb_add(b, "\\\"");
		else if (c == '\\')
			sb_add(b, "\\\\");
		else if (c == '\n')
			sb_add(b, "\\n");
		else if (c == '\r')
			sb_add(b, "\\r");
		else if (c == '\t')
			sb_add(b, "\\t");
		else if (c < 0x20 || c == 0x7f)
			sb_printf(b, "\\x%02X", c);
		else
			sb_addn(b, (const char *)&c, 1);
	}
	sb_add(b, "\"");
}

struct rule {
	char *name;
	char *body; /* NULL while being generated */
};

struct refmap {
	char *ptr;
	char *rule;
};

struct conv {
	const json_t *root;
	struct rule *rules;
	size_t n_rules, cap_rules;
	struct refmap *refs;
	size_t n_refs, cap_refs;
	unsigned depth;
	size_t out_bytes;
	struct hearth_error *err;
	int rc;
};

static int fail(struct conv *c, int code, const char *ptr, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int fail(struct conv *c, int code, const char *ptr, const char *fmt, ...)
{
	if (c->rc)
		return c->rc;
	char what[360];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	c->rc = hearth_error_set(c->err, code, "json_schema %s: %s", *ptr ? ptr : "/", what);
	return c->rc;
}

static int oom(struct conv *c)
{
	return fail(c, HEARTH_ENOMEM, "", "out of memory");
}

static struct rule *rule_find(struct conv *c, const char *name)
{
	for (size_t i = 0; i < c->n_rules; i++)
		if (strcmp(c->rules[i].name, name) == 0)
			return &c->rules[i];
	return NULL;
}

static const char *const prim_names[] = {
	"space", "boolean", "null", "integral-part", "decimal-part", "integer", "number", "char",
	"string", "array", "object", "value", NULL,
};

static bool name_taken(struct conv *c, const char *name, bool is_shared)
{
	if (rule_find(c, name))
		return true;
	for (int i = 0; !is_shared && prim_names[i]; i++)
		if (!strcmp(prim_names[i], name))
			return true;
	return false;
}

/* Reserves a unique rule name from a hint; returns its index or -1. Names of the shared
 * primitives are kept for them. */
static long rule_reserve_as(struct conv *c, const char *hint, bool is_shared)
{
	if (c->n_rules >= JSON_SCHEMA_MAX_RULES) {
		fail(c, HEARTH_ERANGE, "", "more than %d grammar rules", JSON_SCHEMA_MAX_RULES);
		return -1;
	}
	char base[80];
	size_t k = 0;
	for (const char *p = hint; *p && k < 48; p++) {
		unsigned char ch = (unsigned char)*p;
		base[k++] = isalnum(ch) ? (char)ch : '-';
	}
	if (k == 0)
		base[k++] = 'r';
	base[k] = 0;
	char name[96];
	snprintf(name, sizeof name, "%s", base);
	for (unsigned i = 1; name_taken(c, name, is_shared); i++)
		snprintf(name, sizeof name, "%s-%u", base, i);
	if (c->n_rules == c->cap_rules) {
		size_t cap = c->cap_rules ? c->cap_rules * 2 : 32;
		struct rule *g = realloc(c->rules, cap * sizeof *g);
		if (!g) {
			oom(c);
			return -1;
		}
		c->rules = g;
		c->cap_rules = cap;
	}
	c->rules[c->n_rules].name = strdup(name);
	c->rules[c->n_rules].body = NULL;
	if (!c->rules[c->n_rules].name) {
		oom(c);
		return -1;
	}
	return (long)c->n_rules++;
}

static long rule_reserve(struct conv *c, const char *hint)
{
	return rule_reserve_as(c, hint, false);
}

static void rule_set(struct conv *c, long i, char *body)
{
	if (!body) {
		oom(c);
		return;
	}
	c->out_bytes += strlen(body) + strlen(c->rules[i].name) + 6;
	if (c->out_bytes > JSON_SCHEMA_MAX_OUTPUT)
		fail(c, HEARTH_ERANGE, "", "the grammar grows beyond %u bytes", JSON_SCHEMA_MAX_OUTPUT);
	free(c->rules[i].body);
	c->rules[i].body = body;
}

static long rule_reserve_as(struct conv *c, const char *hint, bool is_shared);

/* A named shared rule (primitives), defined once. */
static const char *shared(struct conv *c, const char *name, const char *body)
{
	struct rule *r = rule_find(c, name);
	if (r)
		return r->name;
	long i = rule_reserve_as(c, name, true);
	if (i < 0)
		return "space";
	rule_set(c, i, strdup(body));
	return c->rules[i].name;
}

#define SPACE_BODY "| \" \" | \"\\n\"{1,2} [ \\t]{0,20}"
/* One JSON string character: escapes never name a surrogate (so length counts code points). */
#define CHAR_BODY "[^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} ) )"

static void need_space(struct conv *c)
{
	shared(c, "space", SPACE_BODY);
}

static const char *prim(struct conv *c, const char *type)
{
	need_space(c);
	if (!strcmp(type, "boolean"))
		return shared(c, "boolean", "(\"true\" | \"false\") space");
	if (!strcmp(type, "null"))
		return shared(c, "null", "\"null\" space");
	if (!strcmp(type, "integer")) {
		shared(c, "integral-part", "[0] | [1-9] [0-9]{0,15}");
		return shared(c, "integer", "(\"-\"? integral-part) space");
	}
	if (!strcmp(type, "number")) {
		shared(c, "integral-part", "[0] | [1-9] [0-9]{0,15}");
		shared(c, "decimal-part", "[0-9]{1,16}");
		return shared(c, "number",
			      "(\"-\"? integral-part) (\".\" decimal-part)? ([eE] [-+]? integral-part)? space");
	}
	if (!strcmp(type, "string")) {
		shared(c, "char", CHAR_BODY);
		return shared(c, "string", "\"\\\"\" char* \"\\\"\" space");
	}
	/* any value */
	prim(c, "boolean");
	prim(c, "null");
	prim(c, "number");
	prim(c, "string");
	shared(c, "array", "\"[\" space ( value (\",\" space value)* )? \"]\" space");
	shared(c, "object", "\"{\" space ( string \":\" space value (\",\" space string \":\" space value)* )? \"}\" space");
	return shared(c, "value", "object | array | string | number | boolean | null");
}

/* ---- keyword bookkeeping ---- */
static const char *const annotations[] = {
	"title", "description", "$schema", "$id", "$comment", "default", "examples", "deprecated",
	"readOnly", "writeOnly", "$defs", "definitions", "$anchor", "contentEncoding",
	"contentMediaType", NULL,
};

struct used {
	const char *k[40];
	int n;
};

static void use(struct used *u, const char *k)
{
	if (u->n < 40)
		u->k[u->n++] = k;
}

static int check_unused(struct conv *c, const json_t *s, const struct used *u, const char *ptr)
{
	const char *key;
	json_t *val;
	json_object_foreach((json_t *)s, key, val) {
		bool ok = false;
		for (int i = 0; i < u->n && !ok; i++)
			ok = strcmp(u->k[i], key) == 0;
		for (int i = 0; annotations[i] && !ok; i++)
			ok = strcmp(annotations[i], key) == 0;
		/* false-valued switches constrain nothing */
		if (!ok && (!strcmp(key, "uniqueItems")) && json_is_false(val))
			ok = true;
		if (!ok)
			return fail(c, HEARTH_EUNSUPPORTED, ptr, "unsupported keyword '%s'", key);
	}
	return 0;
}

static void ptr_join(char *out, size_t cap, const char *ptr, const char *seg)
{
	size_t n = (size_t)snprintf(out, cap, "%s/", ptr);
	for (const char *p = seg; *p && n + 3 < cap; p++) {
		if (*p == '~') {
			out[n++] = '~';
			out[n++] = '0';
		} else if (*p == '/') {
			out[n++] = '~';
			out[n++] = '1';
		} else {
			out[n++] = *p;
		}
	}
	out[n < cap ? n : cap - 1] = 0;
}

static char *gen(struct conv *c, const json_t *s, const char *ptr, const char *hint);

/* ---- enum / const ---- */
static int type_matches(const json_t *v, const char *type)
{
	if (!strcmp(type, "string"))
		return json_is_string(v);
	if (!strcmp(type, "integer"))
		return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == (double)(long long)json_real_value(v));
	if (!strcmp(type, "number"))
		return json_is_number(v);
	if (!strcmp(type, "boolean"))
		return json_is_boolean(v);
	if (!strcmp(type, "null"))
		return json_is_null(v);
	if (!strcmp(type, "object"))
		return json_is_object(v);
	if (!strcmp(type, "array"))
		return json_is_array(v);
	return 0;
}

static bool value_has_type(const json_t *v, const json_t *type)
{
	if (!type)
		return true;
	if (json_is_string(type))
		return type_matches(v, json_string_value(type));
	size_t i;
	json_t *t;
	json_array_foreach(type, i, t)
		if (json_is_string(t) && type_matches(v, json_string_value(t)))
			return true;
	return false;
}

static char *gen_values(struct conv *c, const json_t *vals, size_t n, const json_t *type, const char *ptr)
{
	struct sbuf b = { 0 };
	need_space(c);
	size_t emitted = 0;
	sb_add(&b, "(");
	for (size_t i = 0; i < n; i++) {
		const json_t *v = json_is_array(vals) ? json_array_get(vals, i) : vals;
		if (!value_has_type(v, type))
			continue;
		char *txt = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
		if (!txt) {
			free(b.s);
			oom(c);
			return NULL;
		}
		if (emitted++)
			sb_add(&b, " | ");
		sb_lit(&b, txt, strlen(txt));
		free(txt);
	}
	sb_add(&b, ") space");
	if (!emitted) {
		free(b.s);
		fail(c, HEARTH_EINVAL, ptr, "no value of enum/const has the schema's type");
		return NULL;
	}
	return sb_take(&b);
}

/* ---- integers in a range ---- */
static void digits_class(struct sbuf *b, int lo, int hi)
{
	if (lo == hi)
		sb_printf(b, "[%d]", lo);
	else
		sb_printf(b, "[%d-%d]", lo, hi);
}

/* Decimal strings of the same length n between s and t (inclusive, s <= t). */
static void same_len(struct sbuf *b, const char *s, const char *t, size_t n)
{
	if (n == 0)
		return;
	if (s[0] == t[0]) {
		digits_class(b, s[0] - '0', s[0] - '0');
		if (n > 1) {
			sb_add(b, " ");
			same_len(b, s + 1, t + 1, n - 1);
		}
		return;
	}
	bool s_zero = true, t_nine = true;
	for (size_t i = 1; i < n; i++) {
		s_zero &= s[i] == '0';
		t_nine &= t[i] == '9';
	}
	int lo = s[0] - '0' + (s_zero ? 0 : 1), hi = t[0] - '0' - (t_nine ? 0 : 1);
	bool first = true;
	sb_add(b, "(");
	if (!s_zero) {
		char nines[24];
		memset(nines, '9', n - 1);
		digits_class(b, s[0] - '0', s[0] - '0');
		sb_add(b, " ");
		same_len(b, s + 1, nines, n - 1);
		first = false;
	}
	if (lo <= hi) {
		if (!first)
			sb_add(b, " | ");
		digits_class(b, lo, hi);
		if (n > 1)
			sb_printf(b, " [0-9]{%zu}", n - 1);
		first = false;
	}
	if (!t_nine) {
		char zeros[24];
		memset(zeros, '0', n - 1);
		if (!first)
			sb_add(b, " | ");
		digits_class(b, t[0] - '0', t[0] - '0');
		sb_add(b, " ");
		same_len(b, zeros, t + 1, n - 1);
	}
	sb_add(b, ")");
}

#define NO_BOUND (-1LL)

/* Non-negative integers in [a, b] (b == NO_BOUND: unbounded), as an alternation. */
static void nonneg(struct sbuf *b, long long a, long long hi)
{
	char sa[24], sh[24], lo_s[24], hi_s[24];
	int la = snprintf(sa, sizeof sa, "%lld", a);
	int lh = hi == NO_BOUND ? la : snprintf(sh, sizeof sh, "%lld", hi);
	bool first = true;
	sb_add(b, "(");
	for (int L = la; L <= lh; L++) {
		long long p = 1;
		for (int k = 1; k < L; k++)
			p *= 10;
		long long lo_l = L == 1 ? 0 : p, hi_l = p * 10 - 1;
		if (lo_l < a)
			lo_l = a;
		if (hi != NO_BOUND && hi_l > hi)
			hi_l = hi;
		if (lo_l > hi_l)
			continue;
		snprintf(lo_s, sizeof lo_s, "%lld", lo_l);
		snprintf(hi_s, sizeof hi_s, "%lld", hi_l);
		if (!first)
			sb_add(b, " | ");
		same_len(b, lo_s, hi_s, (size_t)L);
		first = false;
	}
	if (hi == NO_BOUND) {
		int maxd = la + 1 > 16 ? la + 1 : 16;
		if (!first)
			sb_add(b, " | ");
		sb_printf(b, "[1-9] [0-9]{%d,%d}", la, maxd - 1);
	}
	sb_add(b, ")");
}

static char *gen_int_range(struct conv *c, bool has_lo, long long lo, bool has_hi, long long hi, const char *ptr)
{
	if (has_lo && has_hi && lo > hi) {
		fail(c, HEARTH_EINVAL, ptr, "integer bounds leave no value (%lld > %lld)", lo, hi);
		return NULL;
	}
	struct sbuf b = { 0 };
	need_space(c);
	bool first = true;
	sb_add(&b, "(");
	if (!has_lo || lo < 0) {
		/* negatives in [lo, min(hi, -1)] are "-" and magnitudes in [max(1, -hi), -lo] */
		long long top = has_hi && hi < -1 ? hi : -1;
		long long mag_lo = -top, mag_hi = has_lo ? -lo : NO_BOUND;
		sb_add(&b, "\"-\" ");
		nonneg(&b, mag_lo, mag_hi);
		first = false;
	}
	if (!has_hi || hi >= 0) {
		if (!first)
			sb_add(&b, " | ");
		nonneg(&b, has_lo && lo > 0 ? lo : 0, has_hi ? hi : NO_BOUND);
	}
	sb_add(&b, ") space");
	return sb_take(&b);
}

static bool get_int(const json_t *v, long long *out)
{
	if (json_is_integer(v)) {
		*out = json_integer_value(v);
		return *out > -1000000000000000000LL && *out < 1000000000000000000LL;
	}
	return false;
}

static bool get_bound(const json_t *v, bool upper, long long *out)
{
	if (json_is_integer(v))
		return get_int(v, out);
	if (json_is_real(v)) {
		double d = json_real_value(v);
		if (!(d > -1e18 && d < 1e18))
			return false;
		long long t = (long long)d;
		/* the tightest integer bound: ceil for a minimum, floor for a maximum */
		if (!upper && (double)t < d)
			t++;
		if (upper && (double)t > d)
			t--;
		*out = t;
		return true;
	}
	return false;
}

/* ---- pattern (regex subset) to GBNF over JSON string content ---- */
struct rx {
	const char *s;
	size_t i, n;
	struct conv *c;
	const char *ptr;
	unsigned depth;
};

/* Code point ranges to GBNF over JSON string content: raw characters except '"', '\\' and
 * controls, which are written as their escapes (controls are left out). */
static void emit_ranges(struct sbuf *b, const uint32_t *r, size_t n)
{
	bool has_quote = false, has_bs = false, first = true;
	sb_add(b, "(");
	struct sbuf cls = { 0 };
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t lo = r[2 * i], hi = r[2 * i + 1];
		if (lo < 0x20)
			lo = 0x20;
		if (lo > hi)
			continue;
		/* cut out '"' (0x22) and '\\' (0x5c) */
		uint32_t cuts[2] = { 0x22, 0x5c };
		uint32_t segs[6], ns = 0;
		uint32_t a = lo;
		for (int q = 0; q < 2; q++) {
			if (cuts[q] >= a && cuts[q] <= hi) {
				if (cuts[q] == 0x22)
					has_quote = true;
				else
					has_bs = true;
				if (cuts[q] > a) {
					segs[ns++] = a;
					segs[ns++] = cuts[q] - 1;
				}
				a = cuts[q] + 1;
			}
		}
		if (a <= hi) {
			segs[ns++] = a;
			segs[ns++] = hi;
		}
		for (uint32_t q = 0; q < ns; q += 2) {
			if (segs[q] == segs[q + 1])
				sb_printf(&cls, "\\U%08X", segs[q]);
			else
				sb_printf(&cls, "\\U%08X-\\U%08X", segs[q], segs[q + 1]);
			k++;
		}
	}
	if (k) {
		sb_add(b, "[");
		if (cls.s)
			sb_add(b, cls.s);
		sb_add(b, "]");
		first = false;
	}
	free(cls.s);
	if (has_quote) {
		sb_add(b, first ? "" : " | ");
		sb_add(b, "\"\\\\\\\"\"");
		first = false;
	}
	if (has_bs) {
		sb_add(b, first ? "" : " | ");
		sb_add(b, "\"\\\\\\\\\"");
		first = false;
	}
	if (first)
		sb_add(b, "[^\\x00-\\U0010FFFF]"); /* matches nothing: the compiler reports it */
	sb_add(b, ")");
}

static int cmp_pair(const void *a, const void *b)
{
	const uint32_t *x = a, *y = b;
	return x[0] < y[0] ? -1 : x[0] > y[0];
}

static size_t norm_ranges(uint32_t *r, size_t n, bool neg)
{
	qsort(r, n, 2 * sizeof *r, cmp_pair);
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		if (k && r[2 * i] <= r[2 * k - 1] + 1) {
			if (r[2 * i + 1] > r[2 * k - 1])
				r[2 * k - 1] = r[2 * i + 1];
		} else {
			r[2 * k] = r[2 * i];
			r[2 * k + 1] = r[2 * i + 1];
			k++;
		}
	}
	if (!neg)
		return k;
	uint32_t tmp[2 * 130];
	size_t m = 0;
	uint32_t next = 0;
	for (size_t i = 0; i < k && m < 128; i++) {
		if (r[2 * i] > next) {
			tmp[2 * m] = next;
			tmp[2 * m + 1] = r[2 * i] - 1;
			m++;
		}
		next = r[2 * i + 1] + 1;
	}
	if (next <= 0x10ffff) {
		tmp[2 * m] = next;
		tmp[2 * m + 1] = 0x10ffff;
		m++;
	}
	memcpy(r, tmp, 2 * m * sizeof *r);
	return m;
}

static int rx_fail(struct rx *x, const char *what)
{
	return fail(x->c, HEARTH_EUNSUPPORTED, x->ptr, "pattern: %s at offset %zu", what, x->i);
}

static int rx_utf8(struct rx *x, uint32_t *cp)
{
	const unsigned char *b = (const unsigned char *)x->s + x->i;
	size_t left = x->n - x->i, n = 1;
	uint32_t c = b[0];
	if (c >= 0xf0)
		n = 4, c &= 0x07;
	else if (c >= 0xe0)
		n = 3, c &= 0x0f;
	else if (c >= 0xc0)
		n = 2, c &= 0x1f;
	if (n > left)
		return rx_fail(x, "truncated UTF-8");
	for (size_t i = 1; i < n; i++)
		c = c << 6 | (b[i] & 0x3f);
	x->i += n;
	*cp = c;
	return 0;
}

/* Class escapes \d \w \s and their negations as ranges; returns the count or 0. */
static size_t class_escape(char e, uint32_t *r, bool *neg)
{
	*neg = e == 'D' || e == 'W' || e == 'S';
	switch (tolower((unsigned char)e)) {
	case 'd':
		r[0] = '0', r[1] = '9';
		return 1;
	case 'w':
		r[0] = '0', r[1] = '9', r[2] = 'A', r[3] = 'Z', r[4] = 'a', r[5] = 'z', r[6] = '_', r[7] = '_';
		return 4;
	case 's':
		r[0] = ' ', r[1] = ' ';
		return 1;
	}
	return 0;
}

static int rx_escape_char(struct rx *x, uint32_t *cp)
{
	char e = x->s[x->i++];
	switch (e) {
	case 'n': *cp = '\n'; return 0;
	case 't': *cp = '\t'; return 0;
	case 'r': *cp = '\r'; return 0;
	case 'f': *cp = '\f'; return 0;
	case 'v': *cp = '\v'; return 0;
	}
	if (e == 'u' && x->i + 4 <= x->n) {
		uint32_t v = 0;
		for (int k = 0; k < 4; k++) {
			char h = x->s[x->i + (size_t)k];
			int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 :
				h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
			if (d < 0)
				return rx_fail(x, "\\u needs 4 hex digits");
			v = v << 4 | (uint32_t)d;
		}
		if (v >= 0xd800 && v <= 0xdfff)
			return rx_fail(x, "\\u names a surrogate");
		x->i += 4;
		*cp = v;
		return 0;
	}
	if (isalnum((unsigned char)e)) {
		x->i--;
		return rx_fail(x, "unsupported escape");
	}
	*cp = (unsigned char)e;
	return 0;
}

static int rx_alt(struct rx *x, struct sbuf *b);

static int rx_atom(struct rx *x, struct sbuf *b)
{
	char ch = x->s[x->i];
	uint32_t r[2 * 130];
	if (ch == '(') {
		x->i++;
		if (x->i + 1 < x->n && x->s[x->i] == '?') {
			if (x->s[x->i + 1] != ':')
				return rx_fail(x, "lookaround and named groups are not supported");
			x->i += 2;
		}
		if (++x->depth > 32)
			return rx_fail(x, "groups nested deeper than 32");
		sb_add(b, "(");
		if (rx_alt(x, b))
			return x->c->rc;
		x->depth--;
		if (x->i >= x->n || x->s[x->i] != ')')
			return rx_fail(x, "expected ')'");
		x->i++;
		sb_add(b, ")");
		return 0;
	}
	if (ch == '.') {
		x->i++;
		r[0] = '\n', r[1] = '\n';
		emit_ranges(b, r, norm_ranges(r, 1, true));
		return 0;
	}
	if (ch == '[') {
		x->i++;
		bool neg = false;
		if (x->i < x->n && x->s[x->i] == '^') {
			neg = true;
			x->i++;
		}
		size_t n = 0;
		bool first = true;
		while (x->i < x->n && (x->s[x->i] != ']' || first)) {
			first = false;
			if (n > 120)
				return rx_fail(x, "character class too long");
			uint32_t lo;
			if (x->s[x->i] == '\\' && x->i + 1 < x->n) {
				x->i++;
				bool en;
				size_t k = class_escape(x->s[x->i], r + 2 * n, &en);
				if (k) {
					if (en)
						return rx_fail(x, "negated class escape inside []");
					x->i++;
					n += k;
					continue;
				}
				if (rx_escape_char(x, &lo))
					return x->c->rc;
			} else if (rx_utf8(x, &lo)) {
				return x->c->rc;
			}
			uint32_t hi = lo;
			if (x->i + 1 < x->n && x->s[x->i] == '-' && x->s[x->i + 1] != ']') {
				x->i++;
				if (x->s[x->i] == '\\' && x->i + 1 < x->n) {
					x->i++;
					if (rx_escape_char(x, &hi))
						return x->c->rc;
				} else if (rx_utf8(x, &hi)) {
					return x->c->rc;
				}
				if (hi < lo)
					return rx_fail(x, "reversed range");
			}
			r[2 * n] = lo;
			r[2 * n + 1] = hi;
			n++;
		}
		if (x->i >= x->n)
			return rx_fail(x, "unterminated '['");
		x->i++;
		emit_ranges(b, r, norm_ranges(r, n, neg));
		return 0;
	}
	uint32_t cp;
	if (ch == '\\') {
		x->i++;
		if (x->i >= x->n)
			return rx_fail(x, "trailing backslash");
		bool neg;
		size_t k = class_escape(x->s[x->i], r, &neg);
		if (k) {
			x->i++;
			emit_ranges(b, r, norm_ranges(r, k, neg));
			return 0;
		}
		if (rx_escape_char(x, &cp))
			return x->c->rc;
	} else if (strchr("*+?{})|^$", ch)) {
		return rx_fail(x, "unexpected metacharacter");
	} else if (rx_utf8(x, &cp)) {
		return x->c->rc;
	}
	r[0] = r[1] = cp;
	emit_ranges(b, r, 1);
	return 0;
}

static int rx_seq(struct rx *x, struct sbuf *b)
{
	bool any = false;
	while (x->i < x->n && x->s[x->i] != '|' && x->s[x->i] != ')') {
		if (x->s[x->i] == '$' && x->i + 1 == x->n)
			break;
		if (any)
			sb_add(b, " ");
		sb_add(b, "(");
		if (rx_atom(x, b))
			return x->c->rc;
		sb_add(b, ")");
		any = true;
		if (x->i >= x->n)
			break;
		char q = x->s[x->i];
		if (q == '*' || q == '+' || q == '?') {
			x->i++;
			sb_addn(b, &q, 1);
		} else if (q == '{') {
			size_t j = x->i + 1;
			unsigned long m = 0, n;
			bool has_n = true, comma = false;
			if (j >= x->n || !isdigit((unsigned char)x->s[j]))
				return rx_fail(x, "expected a count after '{'");
			while (j < x->n && isdigit((unsigned char)x->s[j]) && m <= 1000)
				m = m * 10 + (unsigned long)(x->s[j++] - '0');
			n = m;
			if (j < x->n && x->s[j] == ',') {
				comma = true;
				j++;
				has_n = j < x->n && isdigit((unsigned char)x->s[j]);
				n = 0;
				while (j < x->n && isdigit((unsigned char)x->s[j]) && n <= 1000)
					n = n * 10 + (unsigned long)(x->s[j++] - '0');
			}
			if (j >= x->n || x->s[j] != '}')
				return rx_fail(x, "expected '}'");
			if (m > 1000 || (has_n && n > 1000))
				return rx_fail(x, "repetition count above 1000");
			if (has_n && n < m)
				return rx_fail(x, "repetition {m,n} with n < m");
			x->i = j + 1;
			if (!comma)
				sb_printf(b, "{%lu}", m);
			else if (has_n)
				sb_printf(b, "{%lu,%lu}", m, n);
			else
				sb_printf(b, "{%lu,}", m);
		} else {
			continue;
		}
		if (x->i < x->n && (x->s[x->i] == '?' || x->s[x->i] == '+'))
			x->i++; /* lazy / possessive: the same language */
		if (x->i < x->n && strchr("*+?{", x->s[x->i]))
			return rx_fail(x, "repeated quantifier");
	}
	if (!any)
		sb_add(b, "\"\"");
	return 0;
}

static int rx_alt(struct rx *x, struct sbuf *b)
{
	for (;;) {
		if (rx_seq(x, b))
			return x->c->rc;
		if (x->i < x->n && x->s[x->i] == '|') {
			x->i++;
			sb_add(b, " | ");
			continue;
		}
		return 0;
	}
}

static char *gen_pattern(struct conv *c, const char *pat, const char *ptr)
{
	size_t n = strlen(pat);
	if (n < 2 || pat[0] != '^' || pat[n - 1] != '$' || (n >= 3 && pat[n - 2] == '\\'))
		return fail(c, HEARTH_EUNSUPPORTED, ptr, "pattern must be anchored with ^ and $"), NULL;
	struct rx x = { .s = pat, .i = 1, .n = n, .c = c, .ptr = ptr };
	struct sbuf b = { 0 };
	need_space(c);
	sb_add(&b, "\"\\\"\" (");
	if (rx_alt(&x, &b) || x.i != n - 1) {
		if (!c->rc)
			rx_fail(&x, "unexpected character");
		free(b.s);
		return NULL;
	}
	sb_add(&b, ") \"\\\"\" space");
	return sb_take(&b);
}

/* ---- formats ---- */
static const char *format_body(const char *f)
{
#define D31 "(\"0\" [1-9] | [12] [0-9] | \"3\" [01])"
#define D30 "(\"0\" [1-9] | [12] [0-9] | \"30\")"
#define D28 "(\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8])"
#define DATE "[1-9] [0-9]{3} \"-\" ((\"0\" [13578] | \"1\" [02]) \"-\" " D31 " | (\"0\" [469] | \"11\") \"-\" " D30 " | \"02-\" " D28 ")"
#define TIME "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? (\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])"
	if (!strcmp(f, "date"))
		return DATE;
	if (!strcmp(f, "time"))
		return TIME;
	if (!strcmp(f, "date-time"))
		return DATE " \"T\" " TIME;
	if (!strcmp(f, "uuid"))
		return "[0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [1-5] [0-9a-f]{3} \"-\" [89ab] [0-9a-f]{3} \"-\" [0-9a-f]{12}";
	if (!strcmp(f, "email"))
		return "[a-zA-Z0-9] [a-zA-Z0-9._+-]{0,30} \"@\" [a-zA-Z0-9] [a-zA-Z0-9-]{0,30} \".\" [a-z]{2,10}";
	return NULL;
}

/* ---- strings ---- */
static char *gen_string(struct conv *c, const json_t *s, const char *ptr, struct used *u)
{
	const json_t *fmt = json_object_get(s, "format"), *pat = json_object_get(s, "pattern");
	const json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
	need_space(c);
	if (fmt) {
		use(u, "format");
		if (!json_is_string(fmt) || !format_body(json_string_value(fmt)))
			return fail(c, HEARTH_EUNSUPPORTED, ptr, "unsupported format '%s'",
				    json_is_string(fmt) ? json_string_value(fmt) : "?"), NULL;
		if (pat || mn || mx)
			return fail(c, HEARTH_EUNSUPPORTED, ptr,
				    "format together with pattern/minLength/maxLength is not supported"), NULL;
		struct sbuf b = { 0 };
		sb_printf(&b, "\"\\\"\" %s \"\\\"\" space", format_body(json_string_value(fmt)));
		return sb_take(&b);
	}
	if (pat) {
		use(u, "pattern");
		if (!json_is_string(pat))
			return fail(c, HEARTH_EINVAL, ptr, "pattern is not a string"), NULL;
		if (mn || mx)
			return fail(c, HEARTH_EUNSUPPORTED, ptr,
				    "pattern together with minLength/maxLength is not supported"), NULL;
		return gen_pattern(c, json_string_value(pat), ptr);
	}
	if (mn || mx) {
		long long lo = 0, hi = -1;
		if (mn) {
			use(u, "minLength");
			if (!get_int(mn, &lo) || lo < 0)
				return fail(c, HEARTH_EINVAL, ptr, "minLength is not a non-negative integer"), NULL;
		}
		if (mx) {
			use(u, "maxLength");
			if (!get_int(mx, &hi) || hi < 0)
				return fail(c, HEARTH_EINVAL, ptr, "maxLength is not a non-negative integer"), NULL;
		}
		if (lo > JSON_SCHEMA_MAX_ITEMS || hi > JSON_SCHEMA_MAX_ITEMS)
			return fail(c, HEARTH_ERANGE, ptr, "string length bounds above %d", JSON_SCHEMA_MAX_ITEMS), NULL;
		if (hi >= 0 && hi < lo)
			return fail(c, HEARTH_EINVAL, ptr, "maxLength below minLength"), NULL;
		shared(c, "char", CHAR_BODY);
		struct sbuf b = { 0 };
		if (hi >= 0)
			sb_printf(&b, "\"\\\"\" char{%lld,%lld} \"\\\"\" space", lo, hi);
		else
			sb_printf(&b, "\"\\\"\" char{%lld,} \"\\\"\" space", lo);
		return sb_take(&b);
	}
	return strdup(prim(c, "string"));
}

/* ---- objects ---- */
struct prop {
	const char *key;
	const json_t *schema;
	char ptr[256];
};

static bool key_plain(const char *k)
{
	for (const unsigned char *p = (const unsigned char *)k; *p; p++)
		if (*p < 0x20 || *p >= 0x7f || *p == '"' || *p == '\\')
			return false;
	return true;
}

/* JSON string content that is none of the given keys: a trie walk over the keys. */
static void not_keys(struct sbuf *b, const char **keys, size_t n, size_t depth)
{
	/* at this depth: the set of next characters among keys still matching, and whether
	 * one of them ends here */
	bool ends = false;
	char next[128];
	size_t nn = 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)keys[i][depth];
		if (!ch) {
			ends = true;
			continue;
		}
		if (!memchr(next, ch, nn))
			next[nn++] = (char)ch;
	}
	sb_add(b, "(");
	bool first = true;
	if (!ends) {
		sb_add(b, "\"\"");
		first = false;
	}
	/* a character none of the keys has here, then anything */
	if (!first)
		sb_add(b, " | ");
	sb_add(b, "(");
	sb_add(b, "[^\"\\\\\\x7F\\x00-\\x1F");
	for (size_t k = 0; k < nn; k++) {
		if (next[k] == ']' || next[k] == '-' || next[k] == '^' || next[k] == '[')
			sb_printf(b, "\\%c", next[k]);
		else
			sb_addn(b, &next[k], 1);
	}
	sb_add(b, "] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" ([0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))) char*");
	for (size_t k = 0; k < nn; k++) {
		const char *sub[256];
		size_t ns = 0;
		for (size_t i = 0; i < n && ns < 256; i++)
			if (keys[i][depth] == next[k])
				sub[ns++] = keys[i];
		sb_add(b, " | ");
		sb_lit(b, &next[k], 1);
		sb_add(b, " ");
		not_keys(b, sub, ns, depth + 1);
	}
	sb_add(b, ")");
}

static char *gen_object(struct conv *c, const json_t *s, const char *ptr, const char *hint, struct used *u)
{
	const json_t *props = json_object_get(s, "properties");
	const json_t *req = json_object_get(s, "required");
	const json_t *addl = json_object_get(s, "additionalProperties");
	if (props) {
		use(u, "properties");
		if (!json_is_object(props))
			return fail(c, HEARTH_EINVAL, ptr, "properties is not an object"), NULL;
	}
	if (req) {
		use(u, "required");
		if (!json_is_array(req))
			return fail(c, HEARTH_EINVAL, ptr, "required is not an array"), NULL;
	}
	if (addl)
		use(u, "additionalProperties");
	need_space(c);
	size_t np = props ? json_object_size(props) : 0;
	if (np > 256)
		return fail(c, HEARTH_ERANGE, ptr, "more than 256 properties"), NULL;
	/* required names must be properties, or additionalProperties must let them in */
	size_t i;
	json_t *r;
	json_array_foreach(req, i, r) {
		if (!json_is_string(r))
			return fail(c, HEARTH_EINVAL, ptr, "required holds a non-string"), NULL;
		if (!props || !json_object_get(props, json_string_value(r)))
			return fail(c, HEARTH_EUNSUPPORTED, ptr,
				    "required property '%s' has no schema under properties",
				    json_string_value(r)), NULL;
	}
	if (!props && (!addl || json_is_true(addl)))
	{
		prim(c, "any");
		return strdup("object");
	}

	struct prop *pl = calloc(np ? np : 1, sizeof *pl);
	char **kv = calloc(np + 1, sizeof *kv);
	if (!pl || !kv) {
		free(pl);
		free(kv);
		return oom(c), NULL;
	}
	size_t k = 0;
	const char *key;
	json_t *val;
	char pp[256];
	ptr_join(pp, sizeof pp, ptr, "properties");
	if (props)
		json_object_foreach((json_t *)props, key, val) {
			pl[k].key = key;
			pl[k].schema = val;
			ptr_join(pl[k].ptr, sizeof pl[k].ptr, pp, key);
			k++;
		}
	/* kv rules: "key" space ":" space value */
	for (i = 0; i < np && !c->rc; i++) {
		char h[128];
		snprintf(h, sizeof h, "%s-%s", hint, pl[i].key);
		char *v = gen(c, pl[i].schema, pl[i].ptr, h);
		if (!v)
			break;
		struct sbuf b = { 0 };
		json_t *js = json_string(pl[i].key);
		char *ks = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
		json_decref(js);
		if (!ks) {
			free(v);
			oom(c);
			break;
		}
		sb_lit(&b, ks, strlen(ks));
		free(ks);
		sb_printf(&b, " space \":\" space %s", v);
		free(v);
		snprintf(h, sizeof h, "%s-%s-kv", hint, pl[i].key);
		long ri = rule_reserve(c, h);
		if (ri < 0) {
			free(b.s);
			break;
		}
		rule_set(c, ri, sb_take(&b));
		kv[i] = strdup(c->rules[ri].name);
		if (!kv[i])
			oom(c);
	}
	/* additional properties: keys that are none of the named ones */
	char *extra = NULL;
	if (!c->rc && addl && !json_is_false(addl)) {
		char ap[256];
		ptr_join(ap, sizeof ap, ptr, "additionalProperties");
		char h[128];
		snprintf(h, sizeof h, "%s-additional", hint);
		char *v = json_is_true(addl) ? strdup(prim(c, "any")) : gen(c, addl, ap, h);
		if (v) {
			struct sbuf b = { 0 };
			prim(c, "string");
			if (np) {
				const char **keys = malloc(np * sizeof *keys);
				for (i = 0; keys && i < np; i++)
					if (!key_plain(pl[i].key)) {
						free(keys);
						free(v);
						free(b.s);
						fail(c, HEARTH_EUNSUPPORTED, ptr,
						     "additionalProperties beside property names needing escapes");
						goto kv_done;
					}
				for (i = 0; keys && i < np; i++)
					keys[i] = pl[i].key;
				if (!keys) {
					free(v);
					oom(c);
					goto kv_done;
				}
				sb_add(&b, "\"\\\"\" ");
				not_keys(&b, keys, np, 0);
				sb_add(&b, " \"\\\"\" space");
				free(keys);
			} else {
				sb_add(&b, "string");
			}
			sb_printf(&b, " \":\" space %s", v);
			free(v);
			snprintf(h, sizeof h, "%s-additional-kv", hint);
			long ri = rule_reserve(c, h);
			if (ri >= 0) {
				rule_set(c, ri, sb_take(&b));
				extra = strdup(c->rules[ri].name);
			} else {
				free(b.s);
			}
		}
	}
kv_done:;
	char *out = NULL;
	if (!c->rc) {
		/* required first, then optional, each in schema order */
		size_t *ord = malloc((np + 1) * sizeof *ord), n_req = 0, n_opt = 0;
		if (!ord) {
			oom(c);
			goto done;
		}
		for (i = 0; i < np; i++) {
			bool is_req = false;
			size_t j;
			json_array_foreach(req, j, r) is_req |= !strcmp(json_string_value(r), pl[i].key);
			if (is_req)
				ord[n_req++] = i;
		}
		for (i = 0; i < np; i++) {
			bool is_req = false;
			size_t j;
			json_array_foreach(req, j, r) is_req |= !strcmp(json_string_value(r), pl[i].key);
			if (!is_req)
				ord[n_req + n_opt++] = i;
		}
		struct sbuf b = { 0 };
		sb_add(&b, "\"{\" space");
		for (i = 0; i < n_req; i++)
			sb_printf(&b, "%s %s", i ? " \",\" space" : "", kv[ord[i]]);
		/* optional ones: any ordered subset, via "rest" rules as llama.cpp's converter does */
		size_t n_o = n_opt + (extra ? 1 : 0);
		if (n_o) {
			char **rest = calloc(n_o + 1, sizeof *rest);
			if (!rest) {
				oom(c);
				free(ord);
				free(b.s);
				goto done;
			}
			/* rest[j]: what may follow optional j: ("," space kv_{j+1})? rest[j+1] */
			for (size_t j = n_o; j-- > 0 && !c->rc;) {
				if (j + 1 == n_o) {
					rest[j] = strdup("");
					continue;
				}
				struct sbuf rb = { 0 };
				const char *nk = j + 1 < n_opt ? kv[ord[n_req + j + 1]] : extra;
				bool star = j + 1 == n_opt && extra;
				sb_printf(&rb, "(\",\" space %s)%s %s", nk, star ? "*" : "?", rest[j + 1]);
				char h[128];
				snprintf(h, sizeof h, "%s-rest", hint);
				long ri = rule_reserve(c, h);
				if (ri < 0) {
					free(rb.s);
					break;
				}
				rule_set(c, ri, sb_take(&rb));
				rest[j] = strdup(c->rules[ri].name);
			}
			if (!c->rc) {
				sb_add(&b, n_req ? " (\",\" space (" : " (");
				for (size_t j = 0; j < n_o; j++) {
					const char *ks = j < n_opt ? kv[ord[n_req + j]] : extra;
					bool star = j == n_opt;
					sb_printf(&b, "%s%s%s %s", j ? " | " : "", ks,
						  star ? " (\",\" space " : "", star ? ks : "");
					if (star)
						sb_add(&b, ")*");
					else
						sb_printf(&b, " %s", rest[j] ? rest[j] : "");
				}
				sb_add(&b, n_req ? "))?" : ")?");
			}
			for (size_t j = 0; j < n_o; j++)
				free(rest[j]);
			free(rest);
		}
		sb_add(&b, " \"}\" space");
		free(ord);
		out = sb_take(&b);
	}
done:
	for (i = 0; i < np; i++)
		free(kv[i]);
	free(kv);
	free(extra);
	free(pl);
	return c->rc ? (free(out), NULL) : out;
}

/* ---- arrays ---- */
static char *gen_array(struct conv *c, const json_t *s, const char *ptr, const char *hint, struct used *u)
{
	const json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
	const json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
	long long lo = 0, hi = -1;
	if (mn) {
		use(u, "minItems");
		if (!get_int(mn, &lo) || lo < 0)
			return fail(c, HEARTH_EINVAL, ptr, "minItems is not a non-negative integer"), NULL;
	}
	if (mx) {
		use(u, "maxItems");
		if (!get_int(mx, &hi) || hi < 0)
			return fail(c, HEARTH_EINVAL, ptr, "maxItems is not a non-negative integer"), NULL;
	}
	if (lo > JSON_SCHEMA_MAX_ITEMS || hi > JSON_SCHEMA_MAX_ITEMS)
		return fail(c, HEARTH_ERANGE, ptr, "item count bounds above %d", JSON_SCHEMA_MAX_ITEMS), NULL;
	if (hi >= 0 && hi < lo)
		return fail(c, HEARTH_EINVAL, ptr, "maxItems below minItems"), NULL;
	if (items)
		use(u, "items");
	if (prefix)
		use(u, "prefixItems");
	/* draft 4-7 tuples: items as an array */
	if (json_is_array(items) && !prefix) {
		prefix = items;
		items = json_object_get(s, "additionalItems");
		if (items)
			use(u, "additionalItems");
	}
	need_space(c);
	struct sbuf b = { 0 };
	sb_add(&b, "\"[\" space");
	size_t np = prefix ? json_array_size(prefix) : 0;
	if (prefix && !json_is_array(prefix))
		return fail(c, HEARTH_EINVAL, ptr, "prefixItems is not an array"), NULL;
	if (hi >= 0 && (long long)np > hi)
		np = (size_t)hi; /* a tuple cut short by maxItems is still valid */
	for (size_t i = 0; i < np && !c->rc; i++) {
		char ip[256], idx[24], h[128];
		snprintf(idx, sizeof idx, "%zu", i);
		ptr_join(ip, sizeof ip, ptr, json_is_array(json_object_get(s, "prefixItems")) ? "prefixItems" : "items");
		ptr_join(ip, sizeof ip, ip, idx);
		snprintf(h, sizeof h, "%s-%zu", hint, i);
		char *v = gen(c, json_array_get(prefix, i), ip, h);
		if (!v)
			break;
		sb_printf(&b, "%s %s", i ? " \",\" space" : "", v);
		free(v);
	}
	if (c->rc) {
		free(b.s);
		return NULL;
	}
	/* the rest: items after the prefix, within [lo - np, hi - np] */
	long long more_lo = lo > (long long)np ? lo - (long long)np : 0;
	long long more_hi = hi < 0 ? -1 : hi - (long long)np;
	bool items_false = json_is_false(items);
	bool rest_allowed = !items_false && more_hi != 0;
	if (np < (size_t)(lo > 0 ? lo : 0) && !rest_allowed) {
		free(b.s);
		return fail(c, HEARTH_EINVAL, ptr, "minItems cannot be met"), NULL;
	}
	if (rest_allowed && (!prefix || items || more_lo > 0)) {
		char ip[256], h[128];
		ptr_join(ip, sizeof ip, ptr, prefix && json_is_array(json_object_get(s, "prefixItems")) ? "items" :
					     prefix ? "additionalItems" : "items");
		snprintf(h, sizeof h, "%s-item", hint);
		char *v = items && !json_is_true(items) ? gen(c, items, ip, h) : strdup(prim(c, "any"));
		if (!v) {
			free(b.s);
			return NULL;
		}
		const char *sep = np ? "\",\" space " : "";
		if (np) {
			/* every further item is preceded by a comma */
			if (more_hi < 0)
				sb_printf(&b, " (%s%s){%lld,}", sep, v, more_lo);
			else
				sb_printf(&b, " (%s%s){%lld,%lld}", sep, v, more_lo, more_hi);
		} else if (more_lo > 0) {
			if (more_hi < 0)
				sb_printf(&b, " %s (\",\" space %s){%lld,}", v, v, more_lo - 1);
			else
				sb_printf(&b, " %s (\",\" space %s){%lld,%lld}", v, v, more_lo - 1, more_hi - 1);
		} else {
			if (more_hi < 0)
				sb_printf(&b, " (%s (\",\" space %s)*)?", v, v);
			else
				sb_printf(&b, " (%s (\",\" space %s){0,%lld})?", v, v, more_hi - 1);
		}
		free(v);
	}
	sb_add(&b, " \"]\" space");
	return sb_take(&b);
}

/* ---- combinators ---- */
enum { K_NULL = 1, K_BOOL = 2, K_NUM = 4, K_STR = 8, K_ARR = 16, K_OBJ = 32, K_ALL = 63 };

static const json_t *resolve(struct conv *c, const char *ref)
{
	if (ref[0] != '#')
		return NULL;
	const json_t *cur = c->root;
	const char *p = ref + 1;
	while (*p == '/' && cur) {
		p++;
		char seg[256];
		size_t n = 0;
		while (*p && *p != '/' && n < sizeof seg - 1) {
			if (p[0] == '~' && p[1] == '0')
				seg[n++] = '~', p += 2;
			else if (p[0] == '~' && p[1] == '1')
				seg[n++] = '/', p += 2;
			else
				seg[n++] = *p++;
		}
		seg[n] = 0;
		if (json_is_object(cur)) {
			cur = json_object_get(cur, seg);
		} else if (json_is_array(cur)) {
			char *end;
			unsigned long idx = strtoul(seg, &end, 10);
			cur = *end ? NULL : json_array_get(cur, idx);
		} else {
			cur = NULL;
		}
	}
	return *p ? NULL : cur;
}

static unsigned kinds_of(struct conv *c, const json_t *s, unsigned depth)
{
	if (!json_is_object(s) || depth > 16)
		return K_ALL;
	const json_t *ref = json_object_get(s, "$ref");
	if (json_is_string(ref)) {
		const json_t *t = resolve(c, json_string_value(ref));
		return t ? kinds_of(c, t, depth + 1) : K_ALL;
	}
	const json_t *vals = json_object_get(s, "enum"), *cst = json_object_get(s, "const");
	if (cst)
		vals = cst;
	if (vals) {
		unsigned k = 0;
		size_t n = json_is_array(vals) && !cst ? json_array_size(vals) : 1;
		for (size_t i = 0; i < n; i++) {
			const json_t *v = cst ? cst : json_array_get(vals, i);
			k |= json_is_null(v) ? K_NULL : json_is_boolean(v) ? K_BOOL : json_is_number(v) ? K_NUM :
			     json_is_string(v) ? K_STR : json_is_array(v) ? K_ARR : K_OBJ;
		}
		return k;
	}
	const json_t *type = json_object_get(s, "type");
	if (type) {
		unsigned k = 0;
		size_t n = json_is_array(type) ? json_array_size(type) : 1;
		for (size_t i = 0; i < n; i++) {
			const json_t *t = json_is_array(type) ? json_array_get(type, i) : type;
			const char *ts = json_is_string(t) ? json_string_value(t) : "";
			k |= !strcmp(ts, "null") ? K_NULL : !strcmp(ts, "boolean") ? K_BOOL :
			     !strcmp(ts, "number") || !strcmp(ts, "integer") ? K_NUM : !strcmp(ts, "string") ? K_STR :
			     !strcmp(ts, "array") ? K_ARR : !strcmp(ts, "object") ? K_OBJ : K_ALL;
		}
		return k;
	}
	if (json_object_get(s, "properties"))
		return K_OBJ;
	if (json_object_get(s, "items") || json_object_get(s, "prefixItems"))
		return K_ARR;
	return K_ALL;
}

static bool all_values(const json_t *s)
{
	return json_is_object(s) && (json_object_get(s, "const") || json_object_get(s, "enum"));
}

static bool values_overlap(const json_t *a, const json_t *b)
{
	const json_t *ca = json_object_get(a, "const"), *cb = json_object_get(b, "const");
	const json_t *ea = ca ? NULL : json_object_get(a, "enum"), *eb = cb ? NULL : json_object_get(b, "enum");
	size_t na = ca ? 1 : json_array_size(ea), nb = cb ? 1 : json_array_size(eb);
	for (size_t i = 0; i < na; i++)
		for (size_t j = 0; j < nb; j++)
			if (json_equal(ca ? ca : json_array_get(ea, i), cb ? cb : json_array_get(eb, j)))
				return true;
	return false;
}

static char *gen_alts(struct conv *c, const json_t *arr, const char *kw, const char *ptr, const char *hint)
{
	char ap[256];
	ptr_join(ap, sizeof ap, ptr, kw);
	if (!json_is_array(arr) || json_array_size(arr) == 0)
		return fail(c, HEARTH_EINVAL, ap, "%s must be a non-empty array", kw), NULL;
	size_t n = json_array_size(arr);
	if (!strcmp(kw, "oneOf")) {
		/* exactly one must match: only branches that cannot overlap are expressible */
		for (size_t i = 0; i < n; i++)
			for (size_t j = i + 1; j < n; j++) {
				const json_t *a = json_array_get(arr, i), *b = json_array_get(arr, j);
				bool disjoint = !(kinds_of(c, a, 0) & kinds_of(c, b, 0)) ||
						(all_values(a) && all_values(b) && !values_overlap(a, b));
				if (!disjoint)
					return fail(c, HEARTH_EUNSUPPORTED, ap,
						    "oneOf alternatives %zu and %zu may both match (not expressible; use anyOf)",
						    i, j), NULL;
			}
	}
	struct sbuf b = { 0 };
	sb_add(&b, "(");
	for (size_t i = 0; i < n && !c->rc; i++) {
		char ip[256], idx[24], h[128];
		snprintf(idx, sizeof idx, "%zu", i);
		ptr_join(ip, sizeof ip, ap, idx);
		snprintf(h, sizeof h, "%s-%zu", hint, i);
		char *v = gen(c, json_array_get(arr, i), ip, h);
		if (!v)
			break;
		sb_printf(&b, "%s%s", i ? " | " : "", v);
		free(v);
	}
	sb_add(&b, ")");
	if (c->rc) {
		free(b.s);
		return NULL;
	}
	return sb_take(&b);
}

/* allOf of object schemas: properties and required merged (one definition per name). */
static char *gen_all_of(struct conv *c, const json_t *s, const json_t *arr, const char *ptr, const char *hint)
{
	char ap[256];
	ptr_join(ap, sizeof ap, ptr, "allOf");
	if (!json_is_array(arr) || json_array_size(arr) == 0)
		return fail(c, HEARTH_EINVAL, ap, "allOf must be a non-empty array"), NULL;
	json_t *merged = json_object(), *props = json_object(), *req = json_array();
	if (!merged || !props || !req) {
		json_decref(merged);
		json_decref(props);
		json_decref(req);
		return oom(c), NULL;
	}
	json_object_set_new(merged, "type", json_string("object"));
	size_t n = json_array_size(arr);
	/* the allOf node's own object keywords join in as one more part */
	for (size_t i = 0; i <= n && !c->rc; i++) {
		const json_t *part = i < n ? json_array_get(arr, i) : s;
		char ip[256], idx[24];
		snprintf(idx, sizeof idx, "%zu", i);
		ptr_join(ip, sizeof ip, ap, idx);
		for (int hops = 0; json_is_object(part) && json_is_string(json_object_get(part, "$ref")) && hops < 16; hops++)
			part = resolve(c, json_string_value(json_object_get(part, "$ref")));
		if (!json_is_object(part)) {
			fail(c, HEARTH_EUNSUPPORTED, ip, "allOf part is not an object schema");
			break;
		}
		const char *key;
		json_t *val;
		json_object_foreach((json_t *)part, key, val) {
			bool ann = false;
			for (int a = 0; annotations[a] && !ann; a++)
				ann = !strcmp(annotations[a], key);
			if (ann || !strcmp(key, "allOf") || !strcmp(key, "$ref"))
				continue;
			if (!strcmp(key, "type")) {
				if (!json_is_string(val) || strcmp(json_string_value(val), "object")) {
					fail(c, HEARTH_EUNSUPPORTED, ip, "allOf is expressible only over object schemas");
					break;
				}
			} else if (!strcmp(key, "properties") && json_is_object(val)) {
				const char *pk;
				json_t *pv;
				json_object_foreach(val, pk, pv) {
					json_t *have = json_object_get(props, pk);
					if (have && !json_equal(have, pv)) {
						fail(c, HEARTH_EUNSUPPORTED, ip,
						     "allOf parts give property '%s' different schemas", pk);
						break;
					}
					json_object_set(props, pk, pv);
				}
			} else if (!strcmp(key, "required") && json_is_array(val)) {
				size_t k;
				json_t *rv;
				json_array_foreach(val, k, rv) json_array_append(req, rv);
			} else if (!strcmp(key, "additionalProperties") && json_is_false(val)) {
				/* the merged object never has extra keys anyway */
			} else {
				fail(c, HEARTH_EUNSUPPORTED, ip, "unsupported keyword '%s' inside allOf", key);
				break;
			}
		}
	}
	json_object_set_new(merged, "properties", props);
	json_object_set_new(merged, "required", req);
	char *out = c->rc ? NULL : gen(c, merged, ptr, hint);
	json_decref(merged);
	return out;
}

static char *gen_ref(struct conv *c, const char *ref, const char *ptr)
{
	for (size_t i = 0; i < c->n_refs; i++)
		if (!strcmp(c->refs[i].ptr, ref))
			return strdup(c->refs[i].rule);
	const json_t *t = resolve(c, ref);
	if (!t)
		return fail(c, HEARTH_EUNSUPPORTED, ptr, "$ref '%.200s' is not a local JSON pointer that resolves",
			    ref), NULL;
	const char *last = strrchr(ref, '/');
	long ri = rule_reserve(c, last && last[1] ? last + 1 : "root-ref");
	if (ri < 0)
		return NULL;
	if (c->n_refs == c->cap_refs) {
		size_t cap = c->cap_refs ? c->cap_refs * 2 : 16;
		struct refmap *g = realloc(c->refs, cap * sizeof *g);
		if (!g)
			return oom(c), NULL;
		c->refs = g;
		c->cap_refs = cap;
	}
	c->refs[c->n_refs].ptr = strdup(ref);
	c->refs[c->n_refs].rule = strdup(c->rules[ri].name);
	if (!c->refs[c->n_refs].ptr || !c->refs[c->n_refs].rule)
		return oom(c), NULL;
	c->n_refs++;
	char tp[256];
	snprintf(tp, sizeof tp, "%s", ref + 1);
	char *body = gen(c, t, tp, c->rules[ri].name);
	if (!body)
		return NULL;
	rule_set(c, ri, body);
	return strdup(c->rules[ri].name);
}

static char *gen_typed(struct conv *c, const json_t *s, const char *type, const char *ptr, const char *hint,
		       struct used *u)
{
	if (!strcmp(type, "string"))
		return gen_string(c, s, ptr, u);
	if (!strcmp(type, "object"))
		return gen_object(c, s, ptr, hint, u);
	if (!strcmp(type, "array"))
		return gen_array(c, s, ptr, hint, u);
	if (!strcmp(type, "integer")) {
		const json_t *mn = json_object_get(s, "minimum"), *mx = json_object_get(s, "maximum");
		const json_t *xmn = json_object_get(s, "exclusiveMinimum"), *xmx = json_object_get(s, "exclusiveMaximum");
		if (!mn && !mx && !xmn && !xmx)
			return strdup(prim(c, "integer"));
		bool has_lo = false, has_hi = false;
		long long lo = 0, hi = 0, v;
		if (mn) {
			use(u, "minimum");
			if (!get_bound(mn, false, &v))
				return fail(c, HEARTH_EINVAL, ptr, "minimum is not a number within +-1e18"), NULL;
			has_lo = true, lo = v;
		}
		if (xmn) {
			use(u, "exclusiveMinimum");
			if (!get_bound(xmn, true, &v))
				return fail(c, HEARTH_EUNSUPPORTED, ptr, "exclusiveMinimum is not a number within +-1e18"), NULL;
			if (!has_lo || v + 1 > lo)
				has_lo = true, lo = v + 1;
		}
		if (mx) {
			use(u, "maximum");
			if (!get_bound(mx, true, &v))
				return fail(c, HEARTH_EINVAL, ptr, "maximum is not a number within +-1e18"), NULL;
			has_hi = true, hi = v;
		}
		if (xmx) {
			use(u, "exclusiveMaximum");
			if (!get_bound(xmx, false, &v))
				return fail(c, HEARTH_EUNSUPPORTED, ptr, "exclusiveMaximum is not a number within +-1e18"), NULL;
			if (!has_hi || v - 1 < hi)
				has_hi = true, hi = v - 1;
		}
		return gen_int_range(c, has_lo, lo, has_hi, hi, ptr);
	}
	if (!strcmp(type, "number")) {
		const json_t *mn = json_object_get(s, "minimum");
		if (mn && json_is_number(mn) && json_number_value(mn) == 0 && !json_object_get(s, "maximum") &&
		    !json_object_get(s, "exclusiveMinimum") && !json_object_get(s, "exclusiveMaximum")) {
			use(u, "minimum");
			prim(c, "number");
			return strdup("(integral-part (\".\" decimal-part)? ([eE] [-+]? integral-part)? space)");
		}
		return strdup(prim(c, "number"));
	}
	if (!strcmp(type, "boolean") || !strcmp(type, "null"))
		return strdup(prim(c, type));
	return fail(c, HEARTH_EUNSUPPORTED, ptr, "unknown type '%s'", type), NULL;
}

static char *gen_inner(struct conv *c, const json_t *s, const char *ptr, const char *hint)
{
	if (json_is_true(s))
		return strdup(prim(c, "any"));
	if (json_is_false(s))
		return fail(c, HEARTH_EINVAL, ptr, "schema false: nothing can match"), NULL;
	if (!json_is_object(s))
		return fail(c, HEARTH_EINVAL, ptr, "a schema must be an object or a boolean"), NULL;
	struct used u = { 0 };
	char *out = NULL;
	const json_t *ref = json_object_get(s, "$ref"), *type = json_object_get(s, "type");
	const json_t *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
	const json_t *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf");
	const json_t *all = json_object_get(s, "allOf");
	if (ref) {
		use(&u, "$ref");
		if (!json_is_string(ref))
			return fail(c, HEARTH_EINVAL, ptr, "$ref is not a string"), NULL;
		out = gen_ref(c, json_string_value(ref), ptr);
	} else if (cst || en) {
		use(&u, cst ? "const" : "enum");
		if (type)
			use(&u, "type");
		if (en && (!json_is_array(en) || json_array_size(en) == 0))
			return fail(c, HEARTH_EINVAL, ptr, "enum must be a non-empty array"), NULL;
		if (cst && en)
			return fail(c, HEARTH_EUNSUPPORTED, ptr, "const together with enum"), NULL;
		out = cst ? gen_values(c, cst, 1, type, ptr) : gen_values(c, en, json_array_size(en), type, ptr);
	} else if (any || one) {
		if (any && one)
			return fail(c, HEARTH_EUNSUPPORTED, ptr, "anyOf together with oneOf"), NULL;
		use(&u, any ? "anyOf" : "oneOf");
		out = gen_alts(c, any ? any : one, any ? "anyOf" : "oneOf", ptr, hint);
	} else if (all) {
		/* the merge checks every keyword of every part, this node's included */
		return gen_all_of(c, s, all, ptr, hint);
	} else if (type) {
		use(&u, "type");
		if (json_is_string(type)) {
			out = gen_typed(c, s, json_string_value(type), ptr, hint, &u);
		} else if (json_is_array(type) && json_array_size(type) > 0) {
			struct sbuf b = { 0 };
			size_t i;
			json_t *t;
			sb_add(&b, "(");
			json_array_foreach(type, i, t) {
				if (!json_is_string(t)) {
					free(b.s);
					return fail(c, HEARTH_EINVAL, ptr, "type array holds a non-string"), NULL;
				}
				char *v = gen_typed(c, s, json_string_value(t), ptr, hint, &u);
				if (!v) {
					free(b.s);
					return NULL;
				}
				sb_printf(&b, "%s%s", i ? " | " : "", v);
				free(v);
			}
			sb_add(&b, ")");
			out = sb_take(&b);
		} else {
			return fail(c, HEARTH_EINVAL, ptr, "type is neither a string nor a non-empty array"), NULL;
		}
	} else if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties") ||
		   json_object_get(s, "required")) {
		out = gen_typed(c, s, "object", ptr, hint, &u);
	} else if (json_object_get(s, "items") || json_object_get(s, "prefixItems") ||
		   json_object_get(s, "minItems") || json_object_get(s, "maxItems")) {
		out = gen_typed(c, s, "array", ptr, hint, &u);
	} else if (json_object_get(s, "pattern") || json_object_get(s, "format") ||
		   json_object_get(s, "minLength") || json_object_get(s, "maxLength")) {
		out = gen_typed(c, s, "string", ptr, hint, &u);
	} else if (json_object_get(s, "minimum") || json_object_get(s, "maximum") ||
		   json_object_get(s, "exclusiveMinimum") || json_object_get(s, "exclusiveMaximum")) {
		/* unconstrained type with numeric bounds: anything non-numeric would pass too,
		 * but only integers are expressible with bounds */
		out = gen_typed(c, s, "integer", ptr, hint, &u);
	} else {
		out = strdup(prim(c, "any"));
	}
	if (!out)
		return NULL;
	if (check_unused(c, s, &u, ptr)) {
		free(out);
		return NULL;
	}
	return out;
}

static char *gen(struct conv *c, const json_t *s, const char *ptr, const char *hint)
{
	if (c->rc)
		return NULL;
	if (++c->depth > JSON_SCHEMA_MAX_DEPTH) {
		fail(c, HEARTH_ERANGE, ptr, "schema nested deeper than %d", JSON_SCHEMA_MAX_DEPTH);
		c->depth--;
		return NULL;
	}
	char *out = gen_inner(c, s, ptr, hint);
	c->depth--;
	if (!out && !c->rc)
		oom(c);
	return out;
}

int json_schema_to_gbnf(const json_t *schema, char **out, struct hearth_error *err)
{
	*out = NULL;
	struct conv c = { .root = schema, .err = err };
	long root = rule_reserve(&c, "root");
	char *body = root < 0 ? NULL : gen(&c, schema, "", "root");
	if (body)
		rule_set(&c, root, body);
	int rc = c.rc;
	if (!rc) {
		struct sbuf b = { 0 };
		for (size_t i = 0; i < c.n_rules; i++) {
			if (!c.rules[i].body) {
				rc = hearth_error_set(err, HEARTH_EINVAL, "json_schema: rule '%s' was never defined",
						      c.rules[i].name);
				break;
			}
			sb_printf(&b, "%s ::= %s\n", c.rules[i].name, c.rules[i].body);
		}
		if (!rc) {
			*out = sb_take(&b);
			if (!*out)
				rc = hearth_error_set(err, HEARTH_ENOMEM, "json_schema: out of memory");
		} else {
			free(b.s);
		}
	}
	for (size_t i = 0; i < c.n_rules; i++) {
		free(c.rules[i].name);
		free(c.rules[i].body);
	}
	free(c.rules);
	for (size_t i = 0; i < c.n_refs; i++) {
		free(c.refs[i].ptr);
		free(c.refs[i].rule);
	}
	free(c.refs);
	return rc;
}
