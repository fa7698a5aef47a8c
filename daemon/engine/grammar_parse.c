/* GBNF text to rule trees, in llama.cpp's syntax: `name ::= alternatives`, literals "...",
 * classes [...] with ranges and ^, '.', groups, * + ? {m} {m,} {m,n} {,n}, # comments,
 * escapes \x \u \U \t \n \r and punctuation. Newlines end a rule except inside parentheses
 * or after '|'. Every error names a line:column. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/grammar_impl.h"

struct pstate {
	struct gparse *p;
	size_t pos;
	unsigned depth;
	struct hearth_error *err;
};

void gparse_where(const char *src, size_t len, uint32_t off, char *buf, size_t cap)
{
	unsigned line = 1, col = 1;
	for (size_t i = 0; i < off && i < len; i++) {
		if (src[i] == '\n') {
			line++;
			col = 1;
		} else {
			col++;
		}
	}
	snprintf(buf, cap, "%u:%u", line, col);
}

static int perr(struct pstate *s, size_t off, int code, const char *what)
{
	char at[32];
	gparse_where(s->p->src, s->p->len, (uint32_t)off, at, sizeof at);
	return hearth_error_set(s->err, code, "grammar %s: %s", at, what);
}

static void *palloc(struct pstate *s, size_t size)
{
	struct gparse *p = s->p;
	if (p->n_allocs == p->cap_allocs) {
		size_t cap = p->cap_allocs ? p->cap_allocs * 2 : 64;
		void **a = realloc(p->allocs, cap * sizeof *a);
		if (!a)
			return NULL;
		p->allocs = a;
		p->cap_allocs = cap;
	}
	void *m = calloc(1, size ? size : 1);
	if (m)
		p->allocs[p->n_allocs++] = m;
	return m;
}

static struct gast *new_node(struct pstate *s, enum gast_kind k, size_t off)
{
	struct gast *a = palloc(s, sizeof *a);
	if (a) {
		a->kind = k;
		a->off = (uint32_t)off;
	}
	return a;
}

static int peek(struct pstate *s)
{
	return s->pos < s->p->len ? (unsigned char)s->p->src[s->pos] : -1;
}

static bool is_word(int c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '-' || c == '_';
}

static void skip_space(struct pstate *s, bool newline_ok)
{
	for (;;) {
		int c = peek(s);
		if (c == ' ' || c == '\t') {
			s->pos++;
		} else if (c == '#') {
			while (s->pos < s->p->len && s->p->src[s->pos] != '\n')
				s->pos++;
		} else if (newline_ok && (c == '\n' || c == '\r')) {
			s->pos++;
		} else {
			return;
		}
	}
}

static uint32_t name_hash(const char *n, size_t len)
{
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < len; i++)
		h = (h ^ (unsigned char)n[i]) * 16777619u;
	return h;
}

static int grow_hash(struct gparse *p)
{
	uint32_t cap = p->hash_cap ? p->hash_cap * 2 : 64;
	uint32_t *h = calloc(cap, sizeof *h);
	if (!h)
		return -1;
	for (uint32_t i = 0; i < p->n_rules; i++) {
		const char *n = p->rules[i].name;
		uint32_t at = name_hash(n, strlen(n)) & (cap - 1);
		while (h[at])
			at = (at + 1) & (cap - 1);
		h[at] = i + 1;
	}
	free(p->hash);
	p->hash = h;
	p->hash_cap = cap;
	return 0;
}

/* The index of rule `name`, created (undefined yet) when new. */
static int rule_lookup(struct pstate *s, const char *n, size_t len, size_t off, uint32_t *out)
{
	struct gparse *p = s->p;
	if (p->hash_cap) {
		uint32_t at = name_hash(n, len) & (p->hash_cap - 1);
		while (p->hash[at]) {
			struct gparse_rule *r = &p->rules[p->hash[at] - 1];
			if (strlen(r->name) == len && memcmp(r->name, n, len) == 0) {
				*out = p->hash[at] - 1;
				return 0;
			}
			at = (at + 1) & (p->hash_cap - 1);
		}
	}
	if (p->n_rules >= GRAMMAR_MAX_RULES)
		return perr(s, off, HEARTH_ERANGE, "more than 8192 rules");
	if (p->n_rules == p->cap_rules) {
		uint32_t cap = p->cap_rules ? p->cap_rules * 2 : 32;
		struct gparse_rule *r = realloc(p->rules, cap * sizeof *r);
		if (!r)
			return perr(s, off, HEARTH_ENOMEM, "out of memory");
		p->rules = r;
		p->cap_rules = cap;
	}
	struct gparse_rule *r = &p->rules[p->n_rules];
	memset(r, 0, sizeof *r);
	r->name = malloc(len + 1);
	if (!r->name)
		return perr(s, off, HEARTH_ENOMEM, "out of memory");
	memcpy(r->name, n, len);
	r->name[len] = 0;
	r->def_off = UINT32_MAX;
	r->ref_off = (uint32_t)off;
	p->n_rules++;
	if (p->n_rules * 2 > p->hash_cap) {
		/* rehashing inserts the new rule too */
		if (grow_hash(p)) {
			p->n_rules--;
			free(r->name);
			return perr(s, off, HEARTH_ENOMEM, "out of memory");
		}
	} else {
		uint32_t at = name_hash(n, len) & (p->hash_cap - 1);
		while (p->hash[at])
			at = (at + 1) & (p->hash_cap - 1);
		p->hash[at] = p->n_rules;
	}
	*out = p->n_rules - 1;
	return 0;
}

/* One UTF-8 code point from the source; invalid sequences are errors. */
static int read_utf8(struct pstate *s, uint32_t *cp)
{
	const unsigned char *b = (const unsigned char *)s->p->src + s->pos;
	size_t left = s->p->len - s->pos;
	size_t n;
	uint32_t c;
	if (b[0] < 0x80) {
		*cp = b[0];
		s->pos++;
		return 0;
	} else if ((b[0] & 0xe0) == 0xc0) {
		n = 2;
		c = b[0] & 0x1f;
	} else if ((b[0] & 0xf0) == 0xe0) {
		n = 3;
		c = b[0] & 0x0f;
	} else if ((b[0] & 0xf8) == 0xf0) {
		n = 4;
		c = b[0] & 0x07;
	} else {
		return perr(s, s->pos, HEARTH_EFORMAT, "invalid UTF-8");
	}
	if (left < n)
		return perr(s, s->pos, HEARTH_EFORMAT, "truncated UTF-8");
	for (size_t i = 1; i < n; i++) {
		if ((b[i] & 0xc0) != 0x80)
			return perr(s, s->pos, HEARTH_EFORMAT, "invalid UTF-8");
		c = c << 6 | (b[i] & 0x3f);
	}
	static const uint32_t min_of[5] = { 0, 0, 0x80, 0x800, 0x10000 };
	if (c < min_of[n] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
		return perr(s, s->pos, HEARTH_EFORMAT, "invalid UTF-8");
	*cp = c;
	s->pos += n;
	return 0;
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* A character of a literal or class (escape or UTF-8), as a code point. */
static int read_char(struct pstate *s, uint32_t *cp)
{
	size_t at = s->pos;
	if (peek(s) != '\\')
		return read_utf8(s, cp);
	s->pos++;
	int c = peek(s);
	if (c < 0)
		return perr(s, at, HEARTH_EFORMAT, "escape at end of input");
	s->pos++;
	int digits = 0;
	switch (c) {
	case 'x': digits = 2; break;
	case 'u': digits = 4; break;
	case 'U': digits = 8; break;
	case 't': *cp = '\t'; return 0;
	case 'n': *cp = '\n'; return 0;
	case 'r': *cp = '\r'; return 0;
	case 'f': *cp = '\f'; return 0;
	case 'v': *cp = '\v'; return 0;
	case '0': *cp = 0; return 0;
	case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/':
	case '.': case '(': case ')': case '|': case '*': case '+': case '?': case '{':
	case '}': case ' ':
		*cp = (uint32_t)c;
		return 0;
	default:
		return perr(s, at, HEARTH_EFORMAT, "unknown escape");
	}
	uint32_t v = 0;
	for (int i = 0; i < digits; i++) {
		int h = hexval(peek(s));
		if (h < 0)
			return perr(s, at, HEARTH_EFORMAT, "escape needs more hex digits");
		v = v << 4 | (uint32_t)h;
		s->pos++;
	}
	if (v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
		return perr(s, at, HEARTH_EFORMAT, "escape is not a Unicode scalar value");
	*cp = v;
	return 0;
}

static size_t utf8_put(uint32_t c, uint8_t *o)
{
	if (c < 0x80) {
		o[0] = (uint8_t)c;
		return 1;
	}
	if (c < 0x800) {
		o[0] = (uint8_t)(0xc0 | c >> 6);
		o[1] = (uint8_t)(0x80 | (c & 0x3f));
		return 2;
	}
	if (c < 0x10000) {
		o[0] = (uint8_t)(0xe0 | c >> 12);
		o[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3f));
		o[2] = (uint8_t)(0x80 | (c & 0x3f));
		return 3;
	}
	o[0] = (uint8_t)(0xf0 | c >> 18);
	o[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3f));
	o[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3f));
	o[3] = (uint8_t)(0x80 | (c & 0x3f));
	return 4;
}

static struct gast *parse_literal(struct pstate *s)
{
	size_t start = s->pos;
	s->pos++; /* " */
	size_t cap = 0;
	for (size_t i = s->pos; i < s->p->len && s->p->src[i] != '\n'; i++)
		cap++;
	uint8_t *buf = palloc(s, cap * 4 + 4);
	if (!buf) {
		perr(s, start, HEARTH_ENOMEM, "out of memory");
		return NULL;
	}
	size_t n = 0;
	for (;;) {
		int c = peek(s);
		if (c < 0 || c == '\n' || c == '\r') {
			perr(s, start, HEARTH_EFORMAT, "unterminated string literal");
			return NULL;
		}
		if (c == '"') {
			s->pos++;
			break;
		}
		uint32_t cp;
		if (read_char(s, &cp))
			return NULL;
		if (n + 4 > cap * 4 + 4) {
			perr(s, start, HEARTH_EFORMAT, "literal too long");
			return NULL;
		}
		n += utf8_put(cp, buf + n);
	}
	struct gast *a = new_node(s, GAST_BYTES, start);
	if (!a) {
		perr(s, start, HEARTH_ENOMEM, "out of memory");
		return NULL;
	}
	a->u.bytes = buf;
	a->n = (uint32_t)n;
	return a;
}

static int cmp_range(const void *a, const void *b)
{
	const uint32_t *x = a, *y = b;
	return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Sorts and merges pairs in place; returns the pair count. */
static uint32_t ranges_normalise(uint32_t *r, uint32_t n)
{
	qsort(r, n, 2 * sizeof *r, cmp_range);
	uint32_t k = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (k && r[2 * i] <= r[2 * (k - 1) + 1] + 1) {
			if (r[2 * i + 1] > r[2 * (k - 1) + 1])
				r[2 * (k - 1) + 1] = r[2 * i + 1];
		} else {
			r[2 * k] = r[2 * i];
			r[2 * k + 1] = r[2 * i + 1];
			k++;
		}
	}
	return k;
}

static struct gast *make_class(struct pstate *s, size_t start, uint32_t *r, uint32_t n, bool neg)
{
	n = ranges_normalise(r, n);
	uint32_t *out = palloc(s, (2 * (size_t)n + 2) * sizeof *out);
	if (!out) {
		perr(s, start, HEARTH_ENOMEM, "out of memory");
		return NULL;
	}
	uint32_t k = 0;
	if (neg) {
		uint32_t next = 0;
		for (uint32_t i = 0; i < n; i++) {
			if (r[2 * i] > next) {
				out[2 * k] = next;
				out[2 * k + 1] = r[2 * i] - 1;
				k++;
			}
			next = r[2 * i + 1] + 1;
		}
		if (next <= 0x10ffff) {
			out[2 * k] = next;
			out[2 * k + 1] = 0x10ffff;
			k++;
		}
	} else {
		memcpy(out, r, 2 * (size_t)n * sizeof *r);
		k = n;
	}
	struct gast *a = new_node(s, GAST_CLASS, start);
	if (!a) {
		perr(s, start, HEARTH_ENOMEM, "out of memory");
		return NULL;
	}
	a->u.ranges = out;
	a->n = k;
	return a;
}

static struct gast *parse_class(struct pstate *s)
{
	size_t start = s->pos;
	s->pos++; /* [ */
	bool neg = false;
	if (peek(s) == '^') {
		neg = true;
		s->pos++;
	}
	size_t cap = 16, n = 0;
	uint32_t *r = malloc(cap * 2 * sizeof *r);
	if (!r) {
		perr(s, start, HEARTH_ENOMEM, "out of memory");
		return NULL;
	}
	for (;;) {
		int c = peek(s);
		if (c < 0 || c == '\n') {
			free(r);
			perr(s, start, HEARTH_EFORMAT, "unterminated character class");
			return NULL;
		}
		if (c == ']') {
			s->pos++;
			break;
		}
		uint32_t lo, hi;
		if (read_char(s, &lo)) {
			free(r);
			return NULL;
		}
		hi = lo;
		if (peek(s) == '-' && s->pos + 1 < s->p->len && s->p->src[s->pos + 1] != ']') {
			size_t at = s->pos;
			s->pos++;
			if (read_char(s, &hi)) {
				free(r);
				return NULL;
			}
			if (hi < lo) {
				free(r);
				perr(s, at, HEARTH_EFORMAT, "character range ends before it starts");
				return NULL;
			}
		}
		if (n == cap) {
			cap *= 2;
			uint32_t *g = realloc(r, cap * 2 * sizeof *g);
			if (!g) {
				free(r);
				perr(s, start, HEARTH_ENOMEM, "out of memory");
				return NULL;
			}
			r = g;
		}
		r[2 * n] = lo;
		r[2 * n + 1] = hi;
		n++;
	}
	struct gast *a = make_class(s, start, r, (uint32_t)n, neg);
	free(r);
	return a;
}

static struct gast *parse_alternates(struct pstate *s, bool nested);

static int parse_uint(struct pstate *s, uint32_t *v, bool *present)
{
	*present = false;
	uint64_t x = 0;
	while (peek(s) >= '0' && peek(s) <= '9') {
		x = x * 10 + (uint64_t)(peek(s) - '0');
		if (x > GRAMMAR_MAX_REPEAT)
			return perr(s, s->pos, HEARTH_ERANGE, "repetition count above 100000");
		s->pos++;
		*present = true;
	}
	*v = (uint32_t)x;
	return 0;
}

static struct gast *wrap_rep(struct pstate *s, struct gast *kid, size_t off, uint32_t min, uint32_t max)
{
	struct gast *a = new_node(s, GAST_REP, off);
	struct gast **k = palloc(s, sizeof *k);
	if (!a || !k) {
		perr(s, off, HEARTH_ENOMEM, "out of memory");
		return NULL;
	}
	k[0] = kid;
	a->u.kids = k;
	a->n = 1;
	a->min = min;
	a->max = max;
	return a;
}

static struct gast *parse_sequence(struct pstate *s, bool nested)
{
	size_t start = s->pos;
	size_t cap = 8, n = 0;
	struct gast **items = malloc(cap * sizeof *items);
	if (!items) {
		perr(s, start, HEARTH_ENOMEM, "out of memory");
		return NULL;
	}
	for (;;) {
		int c = peek(s);
		size_t at = s->pos;
		struct gast *el = NULL;
		if (c == '"') {
			el = parse_literal(s);
		} else if (c == '[') {
			el = parse_class(s);
		} else if (c == '.') {
			s->pos++;
			uint32_t r[2] = { 0, 0x10ffff };
			el = make_class(s, at, r, 1, false);
		} else if (c == '(') {
			if (++s->depth > GRAMMAR_MAX_DEPTH) {
				perr(s, at, HEARTH_ERANGE, "parentheses nested deeper than 128");
				goto fail;
			}
			s->pos++;
			skip_space(s, true);
			el = parse_alternates(s, true);
			if (el && peek(s) != ')') {
				perr(s, s->pos, HEARTH_EFORMAT, "expected ')'");
				goto fail;
			}
			s->pos++;
			s->depth--;
		} else if (c >= 0 && is_word(c)) {
			size_t b = s->pos;
			while (is_word(peek(s)))
				s->pos++;
			uint32_t id;
			if (rule_lookup(s, s->p->src + b, s->pos - b, b, &id))
				goto fail;
			el = new_node(s, GAST_REF, b);
			if (!el) {
				perr(s, b, HEARTH_ENOMEM, "out of memory");
				goto fail;
			}
			el->u.rule = id;
		} else if (c == '*' || c == '+' || c == '?' || c == '{') {
			perr(s, at, HEARTH_EFORMAT, "repetition operator without an element before it");
			goto fail;
		} else if (c == '<') {
			perr(s, at, HEARTH_EUNSUPPORTED, "token references (<...>) are not supported");
			goto fail;
		} else {
			break;
		}
		if (!el)
			goto fail;
		skip_space(s, nested);
		/* postfix operators, possibly several */
		for (;;) {
			c = peek(s);
			size_t op = s->pos;
			if (c == '*') {
				el = wrap_rep(s, el, op, 0, GAST_INF);
				s->pos++;
			} else if (c == '+') {
				el = wrap_rep(s, el, op, 1, GAST_INF);
				s->pos++;
			} else if (c == '?') {
				el = wrap_rep(s, el, op, 0, 1);
				s->pos++;
			} else if (c == '{') {
				s->pos++;
				skip_space(s, nested);
				uint32_t lo, hi;
				bool has_lo, has_hi;
				if (parse_uint(s, &lo, &has_lo))
					goto fail;
				skip_space(s, nested);
				hi = lo;
				if (peek(s) == ',') {
					s->pos++;
					skip_space(s, nested);
					if (parse_uint(s, &hi, &has_hi))
						goto fail;
					if (!has_hi)
						hi = GAST_INF;
					skip_space(s, nested);
				} else if (!has_lo) {
					perr(s, op, HEARTH_EFORMAT, "expected a count in {}");
					goto fail;
				}
				if (!has_lo)
					lo = 0;
				if (peek(s) != '}') {
					perr(s, s->pos, HEARTH_EFORMAT, "expected '}'");
					goto fail;
				}
				s->pos++;
				if (hi < lo) {
					perr(s, op, HEARTH_EFORMAT, "repetition {m,n} with n < m");
					goto fail;
				}
				el = wrap_rep(s, el, op, lo, hi);
			} else {
				break;
			}
			if (!el)
				goto fail;
			skip_space(s, nested);
		}
		if (n == cap) {
			cap *= 2;
			struct gast **g = realloc(items, cap * sizeof *g);
			if (!g) {
				perr(s, at, HEARTH_ENOMEM, "out of memory");
				goto fail;
			}
			items = g;
		}
		items[n++] = el;
	}
	struct gast *seq = new_node(s, GAST_SEQ, start);
	struct gast **kids = palloc(s, n * sizeof *kids);
	if (!seq || !kids) {
		perr(s, start, HEARTH_ENOMEM, "out of memory");
		goto fail;
	}
	memcpy(kids, items, n * sizeof *kids);
	free(items);
	seq->u.kids = kids;
	seq->n = (uint32_t)n;
	return seq;
fail:
	free(items);
	return NULL;
}

static struct gast *parse_alternates(struct pstate *s, bool nested)
{
	size_t start = s->pos;
	size_t cap = 4, n = 0;
	struct gast **alts = malloc(cap * sizeof *alts);
	if (!alts) {
		perr(s, start, HEARTH_ENOMEM, "out of memory");
		return NULL;
	}
	for (;;) {
		struct gast *seq = parse_sequence(s, nested);
		if (!seq)
			goto fail;
		if (n == cap) {
			cap *= 2;
			struct gast **g = realloc(alts, cap * sizeof *g);
			if (!g) {
				perr(s, start, HEARTH_ENOMEM, "out of memory");
				goto fail;
			}
			alts = g;
		}
		alts[n++] = seq;
		if (peek(s) != '|')
			break;
		s->pos++;
		skip_space(s, true);
	}
	if (n == 1) {
		struct gast *one = alts[0];
		free(alts);
		return one;
	}
	struct gast *a = new_node(s, GAST_ALT, start);
	struct gast **kids = palloc(s, n * sizeof *kids);
	if (!a || !kids) {
		perr(s, start, HEARTH_ENOMEM, "out of memory");
		goto fail;
	}
	memcpy(kids, alts, n * sizeof *kids);
	free(alts);
	a->u.kids = kids;
	a->n = (uint32_t)n;
	return a;
fail:
	free(alts);
	return NULL;
}

int gparse_run(struct gparse *p, const char *src, size_t len, struct hearth_error *err)
{
	memset(p, 0, sizeof *p);
	p->src = src;
	p->len = len;
	struct pstate s = { .p = p, .err = err };
	if (len > GRAMMAR_MAX_SOURCE)
		return hearth_error_set(err, HEARTH_ERANGE, "grammar: %zu bytes, above the %u-byte limit",
					len, GRAMMAR_MAX_SOURCE);
	if (memchr(src, 0, len))
		return perr(&s, (const char *)memchr(src, 0, len) - src, HEARTH_EFORMAT, "NUL byte");
	skip_space(&s, true);
	while (s.pos < len) {
		size_t at = s.pos;
		if (!is_word(peek(&s)))
			return perr(&s, at, HEARTH_EFORMAT, "expected a rule name");
		while (is_word(peek(&s)))
			s.pos++;
		uint32_t id;
		int rc = rule_lookup(&s, src + at, s.pos - at, at, &id);
		if (rc)
			return rc;
		skip_space(&s, false);
		if (s.pos + 3 > len || memcmp(src + s.pos, "::=", 3) != 0)
			return perr(&s, s.pos, HEARTH_EFORMAT, "expected '::='");
		s.pos += 3;
		skip_space(&s, true);
		struct gparse_rule *r = &p->rules[id];
		if (r->def_off != UINT32_MAX) {
			char first[32], msg[160];
			gparse_where(src, len, r->def_off, first, sizeof first);
			snprintf(msg, sizeof msg, "rule '%.64s' defined again (first at %s)", r->name, first);
			return perr(&s, at, HEARTH_EINVAL, msg);
		}
		struct gast *body = parse_alternates(&s, false);
		if (!body)
			return err ? err->code : HEARTH_EFORMAT;
		r = &p->rules[id];
		r->def_off = (uint32_t)at;
		r->body = body;
		if (peek(&s) == '\r')
			s.pos++;
		if (peek(&s) == '\n')
			s.pos++;
		else if (s.pos < len)
			return perr(&s, s.pos, HEARTH_EFORMAT, "expected newline or end of input");
		skip_space(&s, true);
	}
	for (uint32_t i = 0; i < p->n_rules; i++) {
		if (p->rules[i].def_off == UINT32_MAX) {
			char msg[160];
			snprintf(msg, sizeof msg, "rule '%.64s' is referenced but not defined",
				 p->rules[i].name);
			return perr(&s, p->rules[i].ref_off, HEARTH_EINVAL, msg);
		}
	}
	return 0;
}

void gparse_free(struct gparse *p)
{
	for (size_t i = 0; i < p->n_allocs; i++)
		free(p->allocs[i]);
	free(p->allocs);
	for (uint32_t i = 0; i < p->n_rules; i++)
		free(p->rules[i].name);
	free(p->rules);
	free(p->hash);
	memset(p, 0, sizeof *p);
}
