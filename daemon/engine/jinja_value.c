/* Values of the Jinja subset: the render arena, tainted strings and their builder, lists
 * and ordered dicts, and the Python behaviours templates rely on (str(), repr(), ==, <,
 * truthiness, json.dumps). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/jinja.h"

/* ---- arena */

struct jchunk {
	struct jchunk *next;
	size_t used, cap;
	_Alignas(16) unsigned char data[];
};

void ja_init(struct jarena *a, size_t limit)
{
	a->head = NULL;
	a->total = 0;
	a->limit = limit;
}

void ja_free(struct jarena *a)
{
	struct jchunk *k = a->head;
	while (k) {
		struct jchunk *next = k->next;
		free(k);
		k = next;
	}
	a->head = NULL;
	a->total = 0;
}

void *ja_alloc(struct jctx *c, size_t n)
{
	struct jarena *a = c->arena;
	n = (n + 15) & ~(size_t)15;
	if (n == 0)
		n = 16;
	struct jchunk *k = a->head;
	if (!k || k->cap - k->used < n) {
		size_t cap = n > 60000 ? n : 65536 - sizeof(struct jchunk);
		if (a->limit && a->total + cap > a->limit)
			jx_fail(c, NULL, JX_LIMIT, "the render needs more than %zu bytes of memory (limit)",
				a->limit);
		k = malloc(sizeof *k + cap);
		if (!k)
			jx_fail(c, NULL, JX_LIMIT, "out of memory");
		k->cap = cap;
		k->used = 0;
		a->total += cap;
		/* a big block goes behind the current chunk so the chunk's space stays usable */
		if (a->head && cap != 65536 - sizeof(struct jchunk)) {
			k->next = a->head->next;
			a->head->next = k;
		} else {
			k->next = a->head;
			a->head = k;
		}
	}
	void *p = k->data + k->used;
	k->used += n;
	return p;
}

void *ja_grow(struct jctx *c, void *p, size_t old, size_t n)
{
	void *q = ja_alloc(c, n);
	if (old)
		memcpy(q, p, old < n ? old : n);
	return q;
}

size_t jmul(struct jctx *c, const struct jnode *at, size_t a, size_t b)
{
	if (b && a > SIZE_MAX / b)
		jx_fail(c, at, JX_LIMIT, "size overflow");
	return a * b;
}

/* ---- errors */

const char *jx_name(int exc)
{
	switch (exc) {
	case JX_UNDEFINED: return "UndefinedError";
	case JX_SECURITY: return "SecurityError";
	case JX_TYPE: return "TypeError";
	case JX_TEMPLATE: return "TemplateError";
	case JX_VALUE: return "ValueError";
	case JX_LIMIT: return "LimitError";
	case JX_SYNTAX: return "TemplateSyntaxError";
	default: return "TemplateRuntimeError";
	}
}

void jx_fail(struct jctx *c, const struct jnode *at, int exc, const char *fmt, ...)
{
	int n = snprintf(c->msg, sizeof c->msg, "%s: ", jx_name(exc));
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->msg + n, sizeof c->msg - (size_t)n, fmt, ap);
	va_end(ap);
	if (at) {
		c->line = at->line;
		c->col = at->col;
	}
	c->code = exc;
	longjmp(c->jb, 1);
}

void jx_raise_undef(struct jctx *c, const struct jnode *at, const struct jundef *u)
{
	jx_fail(c, at, u ? u->exc : JX_UNDEFINED, "%s", u && u->msg ? u->msg : "value is undefined");
}

/* ---- strings */

const struct jstr *jstr_new(struct jctx *c, const char *s, size_t n, bool taint)
{
	struct jstr *r = ja_alloc(c, sizeof *r + n + 1);
	char *d = (char *)(r + 1);
	if (n)
		memcpy(d, s, n);
	d[n] = 0;
	r->s = d;
	r->len = n;
	r->mask = NULL;
	r->taint = taint && n ? JT_ALL : JT_CLEAN;
	r->markup = 0;
	return r;
}

const struct jstr *jstr_cstr(struct jctx *c, const char *s)
{
	return jstr_new(c, s, strlen(s), false);
}

bool jstr_tainted_at(const struct jstr *s, size_t i)
{
	return s->taint == JT_ALL || (s->taint == JT_MIXED && s->mask[i]);
}

const struct jstr *jstr_sub(struct jctx *c, const struct jstr *s, size_t off, size_t n)
{
	if (off == 0 && n == s->len)
		return s;
	struct jstr *r = ja_alloc(c, sizeof *r);
	r->markup = 0;
	r->s = s->s + off;
	r->len = n;
	r->taint = n ? s->taint : JT_CLEAN;
	r->mask = s->taint == JT_MIXED ? s->mask + off : NULL;
	if (r->taint == JT_MIXED) {
		size_t t = 0;
		for (size_t i = 0; i < n; i++)
			t += r->mask[i];
		r->taint = t == 0 ? JT_CLEAN : t == n ? JT_ALL : JT_MIXED;
		if (r->taint != JT_MIXED)
			r->mask = NULL;
	}
	return r;
}

bool jstr_eq(const struct jstr *a, const struct jstr *b)
{
	return a->len == b->len && (a->len == 0 || !memcmp(a->s, b->s, a->len));
}

bool jstr_is(const struct jstr *a, const char *lit)
{
	size_t n = strlen(lit);
	return a->len == n && !memcmp(a->s, lit, n);
}

char *jstr_z(struct jctx *c, const struct jstr *s)
{
	char *z = ja_alloc(c, s->len + 1);
	memcpy(z, s->s, s->len);
	z[s->len] = 0;
	return z;
}

size_t utf8_count(const char *s, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		k += ((unsigned char)s[i] & 0xC0) != 0x80;
	return k;
}

size_t utf8_offset(const char *s, size_t n, size_t cps)
{
	size_t i = 0, k = 0;
	while (i < n) {
		if (((unsigned char)s[i] & 0xC0) != 0x80) {
			if (k == cps)
				return i;
			k++;
		}
		i++;
	}
	return n;
}

/* ---- builder */

void jb_init(struct jctx *c, struct jbuf *b, size_t cap)
{
	if (cap < 64)
		cap = 64;
	b->s = ja_alloc(c, cap);
	b->m = ja_alloc(c, cap);
	b->len = 0;
	b->cap = cap;
	b->n_taint = 0;
}

static void jb_reserve(struct jctx *c, struct jbuf *b, size_t n)
{
	if (n > c->lim.string)
		jx_fail(c, NULL, JX_LIMIT, "a string would be %zu bytes, over the limit of %zu", n,
			c->lim.string);
	if (n <= b->cap)
		return;
	size_t cap = b->cap * 2 > n ? b->cap * 2 : n;
	b->s = ja_grow(c, b->s, b->len, cap);
	b->m = ja_grow(c, b->m, b->len, cap);
	b->cap = cap;
}

void jb_put(struct jctx *c, struct jbuf *b, const char *s, size_t n, bool taint)
{
	if (!n)
		return;
	if (n > SIZE_MAX / 2 - b->len)
		jx_fail(c, NULL, JX_LIMIT, "string size overflow");
	jb_reserve(c, b, b->len + n);
	memcpy(b->s + b->len, s, n);
	memset(b->m + b->len, taint, n);
	b->len += n;
	if (taint)
		b->n_taint += n;
}

void jb_putc(struct jctx *c, struct jbuf *b, char ch)
{
	jb_put(c, b, &ch, 1, false);
}

void jb_puts(struct jctx *c, struct jbuf *b, const char *s)
{
	jb_put(c, b, s, strlen(s), false);
}

void jb_put_range(struct jctx *c, struct jbuf *b, const struct jstr *s, size_t off, size_t n)
{
	if (!n)
		return;
	if (s->taint != JT_MIXED) {
		jb_put(c, b, s->s + off, n, s->taint == JT_ALL);
		return;
	}
	jb_reserve(c, b, b->len + n);
	memcpy(b->s + b->len, s->s + off, n);
	memcpy(b->m + b->len, s->mask + off, n);
	for (size_t i = 0; i < n; i++)
		b->n_taint += s->mask[off + i];
	b->len += n;
}

void jb_put_str(struct jctx *c, struct jbuf *b, const struct jstr *s)
{
	jb_put_range(c, b, s, 0, s->len);
}

void jb_printf(struct jctx *c, struct jbuf *b, const char *fmt, ...)
{
	char tmp[128];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
	va_end(ap);
	if (n > 0)
		jb_put(c, b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1, false);
}

const struct jstr *jb_finish(struct jctx *c, struct jbuf *b)
{
	struct jstr *r = ja_alloc(c, sizeof *r);
	r->markup = 0;
	r->s = b->s;
	r->len = b->len;
	if (b->n_taint == 0) {
		r->taint = JT_CLEAN;
		r->mask = NULL;
	} else if (b->n_taint == b->len) {
		r->taint = JT_ALL;
		r->mask = NULL;
	} else {
		r->taint = JT_MIXED;
		r->mask = b->m;
	}
	return r;
}

/* ---- constructors */

struct jv jv_undef(struct jctx *c, int exc, const char *fmt, ...)
{
	struct jundef *u = ja_alloc(c, sizeof *u);
	char tmp[300];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(tmp, sizeof tmp, fmt, ap);
	va_end(ap);
	size_t n = strlen(tmp);
	char *m = ja_alloc(c, n + 1);
	memcpy(m, tmp, n + 1);
	u->msg = m;
	u->exc = (uint8_t)exc;
	return (struct jv){ .t = JV_UNDEF, .u.u = u };
}

struct jv jv_missing(void) { return (struct jv){ .t = JV_UNDEF, .u.u = NULL }; }
struct jv jv_none(void) { return (struct jv){ .t = JV_NONE }; }
struct jv jv_bool(bool b) { return (struct jv){ .t = JV_BOOL, .u.b = b }; }
struct jv jv_int(int64_t i) { return (struct jv){ .t = JV_INT, .u.i = i }; }
struct jv jv_float(double f) { return (struct jv){ .t = JV_FLOAT, .u.f = f }; }
struct jv jv_str(const struct jstr *s) { return (struct jv){ .t = JV_STR, .u.s = s }; }
struct jv jv_cstr(struct jctx *c, const char *s) { return jv_str(jstr_cstr(c, s)); }
struct jv jv_list(struct jlist *l) { return (struct jv){ .t = JV_LIST, .u.l = l }; }
struct jv jv_dict(struct jdict *d) { return (struct jv){ .t = JV_DICT, .u.d = d }; }

struct jlist *jl_new(struct jctx *c, size_t cap, uint8_t kind)
{
	struct jlist *l = ja_alloc(c, sizeof *l);
	l->n = 0;
	l->cap = cap;
	l->kind = kind;
	l->v = cap ? ja_alloc(c, jmul(c, NULL, cap, sizeof *l->v)) : NULL;
	return l;
}

void jl_push(struct jctx *c, struct jlist *l, struct jv v)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 8;
		l->v = ja_grow(c, l->v, l->n * sizeof *l->v, jmul(c, NULL, cap, sizeof *l->v));
		l->cap = cap;
	}
	l->v[l->n++] = v;
}

struct jdict *jd_new(struct jctx *c, size_t cap)
{
	struct jdict *d = ja_alloc(c, sizeof *d);
	d->n = 0;
	d->cap = cap;
	d->k = cap ? ja_alloc(c, jmul(c, NULL, cap, sizeof *d->k)) : NULL;
	d->v = cap ? ja_alloc(c, jmul(c, NULL, cap, sizeof *d->v)) : NULL;
	return d;
}

static bool key_eq(struct jv a, struct jv b)
{
	if (a.t == JV_STR && b.t == JV_STR)
		return jstr_eq(a.u.s, b.u.s);
	return jv_equal(a, b);
}

const struct jv *jd_get(const struct jdict *d, struct jv k)
{
	for (size_t i = 0; i < d->n; i++)
		if (key_eq(d->k[i], k))
			return &d->v[i];
	return NULL;
}

const struct jv *jd_get_s(const struct jdict *d, const char *key)
{
	size_t n = strlen(key);
	for (size_t i = 0; i < d->n; i++)
		if (d->k[i].t == JV_STR && d->k[i].u.s->len == n && !memcmp(d->k[i].u.s->s, key, n))
			return &d->v[i];
	return NULL;
}

void jd_set(struct jctx *c, struct jdict *d, struct jv k, struct jv v)
{
	for (size_t i = 0; i < d->n; i++)
		if (key_eq(d->k[i], k)) {
			d->v[i] = v;
			return;
		}
	if (d->n == d->cap) {
		size_t cap = d->cap ? d->cap * 2 : 8;
		d->k = ja_grow(c, d->k, d->n * sizeof *d->k, jmul(c, NULL, cap, sizeof *d->k));
		d->v = ja_grow(c, d->v, d->n * sizeof *d->v, jmul(c, NULL, cap, sizeof *d->v));
		d->cap = cap;
	}
	d->k[d->n] = k;
	d->v[d->n++] = v;
}

struct jv jv_from_json(struct jctx *c, const json_t *j, bool taint)
{
	switch (json_typeof(j)) {
	case JSON_OBJECT: {
		struct jdict *d = jd_new(c, json_object_size(j));
		const char *k;
		json_t *v;
		json_object_foreach((json_t *)j, k, v) {
			d->k[d->n] = jv_str(jstr_new(c, k, strlen(k), taint));
			d->v[d->n++] = jv_from_json(c, v, taint);
		}
		return jv_dict(d);
	}
	case JSON_ARRAY: {
		struct jlist *l = jl_new(c, json_array_size(j), JL_LIST);
		for (size_t i = 0; i < json_array_size(j); i++)
			l->v[l->n++] = jv_from_json(c, json_array_get(j, i), taint);
		return jv_list(l);
	}
	case JSON_STRING:
		return jv_str(jstr_new(c, json_string_value(j), json_string_length(j), taint));
	case JSON_INTEGER:
		return jv_int(json_integer_value(j));
	case JSON_REAL:
		return jv_float(json_real_value(j));
	case JSON_TRUE:
		return jv_bool(true);
	case JSON_FALSE:
		return jv_bool(false);
	default:
		return jv_none();
	}
}

/* ---- Python semantics */

bool jv_truthy(struct jv v)
{
	switch (v.t) {
	case JV_UNDEF:
	case JV_NONE: return false;
	case JV_BOOL: return v.u.b;
	case JV_INT: return v.u.i != 0;
	case JV_FLOAT: return v.u.f != 0;
	case JV_STR: return v.u.s->len != 0;
	case JV_LIST: return v.u.l->kind == JL_GEN || v.u.l->n != 0;
	case JV_DICT: return v.u.d->n != 0;
	default: return true;
	}
}

static bool is_num(struct jv v)
{
	return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
}

static double num_of(struct jv v)
{
	return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : (double)v.u.b;
}

bool jv_equal(struct jv a, struct jv b)
{
	if (is_num(a) && is_num(b)) {
		if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
			int64_t x = a.t == JV_INT ? a.u.i : a.u.b, y = b.t == JV_INT ? b.u.i : b.u.b;
			return x == y;
		}
		return num_of(a) == num_of(b);
	}
	if (a.t != b.t)
		return false;
	switch (a.t) {
	case JV_UNDEF:
	case JV_NONE: return true;
	case JV_STR: return jstr_eq(a.u.s, b.u.s);
	case JV_LIST:
		if (a.u.l == b.u.l)
			return true;
		if (a.u.l->n != b.u.l->n || (a.u.l->kind == JL_TUPLE) != (b.u.l->kind == JL_TUPLE) ||
		    a.u.l->kind == JL_GEN)
			return false;
		for (size_t i = 0; i < a.u.l->n; i++)
			if (!jv_equal(a.u.l->v[i], b.u.l->v[i]))
				return false;
		return true;
	case JV_DICT:
		if (a.u.d->n != b.u.d->n)
			return false;
		for (size_t i = 0; i < a.u.d->n; i++) {
			const struct jv *o = jd_get(b.u.d, a.u.d->k[i]);
			if (!o || !jv_equal(a.u.d->v[i], *o))
				return false;
		}
		return true;
	case JV_NS: return a.u.d == b.u.d;
	case JV_MACRO: return a.u.m == b.u.m;
	case JV_FUNC: return a.u.fn == b.u.fn;
	default: return false;
	}
}

const char *jv_type_name(struct jv v)
{
	switch (v.t) {
	case JV_UNDEF: return "Undefined";
	case JV_NONE: return "NoneType";
	case JV_BOOL: return "bool";
	case JV_INT: return "int";
	case JV_FLOAT: return "float";
	case JV_STR: return "str";
	case JV_LIST: return v.u.l->kind == JL_TUPLE ? "tuple" : v.u.l->kind == JL_GEN ? "generator" : "list";
	case JV_DICT: return "dict";
	case JV_NS: return "Namespace";
	case JV_MACRO: return "Macro";
	case JV_LOOP: return "LoopContext";
	default: return "builtin_function_or_method";
	}
}

int jv_compare(struct jctx *c, const struct jnode *at, struct jv a, struct jv b, const char *op)
{
	if (is_num(a) && is_num(b)) {
		if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
			int64_t x = a.t == JV_INT ? a.u.i : a.u.b, y = b.t == JV_INT ? b.u.i : b.u.b;
			return x < y ? -1 : x > y;
		}
		double x = num_of(a), y = num_of(b);
		return x < y ? -1 : x > y;
	}
	if (a.t == JV_STR && b.t == JV_STR) {
		size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
		int r = n ? memcmp(a.u.s->s, b.u.s->s, n) : 0;
		if (r)
			return r < 0 ? -1 : 1;
		return a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len;
	}
	if (a.t == JV_LIST && b.t == JV_LIST && a.u.l->kind == b.u.l->kind && a.u.l->kind != JL_GEN) {
		size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
		for (size_t i = 0; i < n; i++) {
			if (jv_equal(a.u.l->v[i], b.u.l->v[i]))
				continue;
			return jv_compare(c, at, a.u.l->v[i], b.u.l->v[i], op);
		}
		return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
	}
	if (a.t == JV_UNDEF)
		jx_raise_undef(c, at, a.u.u);
	if (b.t == JV_UNDEF)
		jx_raise_undef(c, at, b.u.u);
	jx_fail(c, at, JX_TYPE, "'%s' not supported between instances of '%s' and '%s'", op,
		jv_type_name(a), jv_type_name(b));
}

void jv_float_repr(double f, char out[40])
{
	if (isnan(f)) {
		strcpy(out, "nan");
		return;
	}
	if (isinf(f)) {
		strcpy(out, f < 0 ? "-inf" : "inf");
		return;
	}
	char buf[40];
	int p;
	for (p = 1; p <= 17; p++) {
		snprintf(buf, sizeof buf, "%.*e", p - 1, f);
		if (strtod(buf, NULL) == f)
			break;
	}
	/* buf: [-]D[.DDD]e[+-]XX -> Python's repr: fixed for -4 <= exp < 16, else D.DDDe+XX */
	char digits[24];
	size_t nd = 0;
	const char *q = buf;
	bool neg = *q == '-';
	if (neg)
		q++;
	for (; *q && *q != 'e'; q++)
		if (*q >= '0' && *q <= '9')
			digits[nd++] = *q;
	int exp = atoi(q + 1);
	while (nd > 1 && digits[nd - 1] == '0')
		nd--;
	char *o = out;
	if (neg)
		*o++ = '-';
	if (exp >= -4 && exp < 16) {
		if (exp >= 0) {
			for (int i = 0; i <= exp; i++)
				*o++ = (size_t)i < nd ? digits[i] : '0';
			*o++ = '.';
			if ((size_t)exp + 1 < nd)
				for (size_t i = (size_t)exp + 1; i < nd; i++)
					*o++ = digits[i];
			else
				*o++ = '0';
		} else {
			*o++ = '0';
			*o++ = '.';
			for (int i = 0; i < -exp - 1; i++)
				*o++ = '0';
			for (size_t i = 0; i < nd; i++)
				*o++ = digits[i];
		}
		*o = 0;
	} else {
		*o++ = digits[0];
		if (nd > 1) {
			*o++ = '.';
			for (size_t i = 1; i < nd; i++)
				*o++ = digits[i];
		}
		snprintf(o, 12, "e%c%02d", exp < 0 ? '-' : '+', (exp < 0 ? -exp : exp) % 1000);
	}
}

static void repr_seq_inner(struct jctx *c, struct jbuf *b, struct jv v);

static void repr_str(struct jctx *c, struct jbuf *b, const struct jstr *s)
{
	bool has_sq = memchr(s->s, '\'', s->len) != NULL, has_dq = memchr(s->s, '"', s->len) != NULL;
	char q = has_sq && !has_dq ? '"' : '\'';
	jb_putc(c, b, q);
	size_t run = 0;
	for (size_t i = 0; i < s->len; i++) {
		unsigned char ch = (unsigned char)s->s[i];
		const char *esc = NULL;
		char hex[8];
		if (ch == '\\')
			esc = "\\\\";
		else if (ch == (unsigned char)q)
			esc = q == '\'' ? "\\'" : "\\\"";
		else if (ch == '\n')
			esc = "\\n";
		else if (ch == '\r')
			esc = "\\r";
		else if (ch == '\t')
			esc = "\\t";
		else if (ch < 0x20 || ch == 0x7f) {
			snprintf(hex, sizeof hex, "\\x%02x", ch);
			esc = hex;
		}
		if (!esc)
			continue;
		jb_put_range(c, b, s, run, i - run);
		jb_put(c, b, esc, strlen(esc), jstr_tainted_at(s, i));
		run = i + 1;
	}
	jb_put_range(c, b, s, run, s->len - run);
	jb_putc(c, b, q);
}

static void repr_seq(struct jctx *c, struct jbuf *b, struct jv v)
{
	/* a namespace can hold itself: bound the walk as Python bounds its recursion */
	if (++c->nest > 2000)
		jx_fail(c, NULL, JX_LIMIT, "a value nests deeper than 2000 levels (limit)");
	struct jv saved = v;
	repr_seq_inner(c, b, saved);
	c->nest--;
}

static void repr_seq_inner(struct jctx *c, struct jbuf *b, struct jv v)
{
	if (v.t == JV_LIST) {
		if (v.u.l->kind == JL_GEN) {
			jb_puts(c, b, "<generator object>");
			return;
		}
		bool tup = v.u.l->kind == JL_TUPLE;
		jb_putc(c, b, tup ? '(' : '[');
		for (size_t i = 0; i < v.u.l->n; i++) {
			if (i)
				jb_puts(c, b, ", ");
			jv_repr_into(c, b, v.u.l->v[i]);
		}
		if (tup && v.u.l->n == 1)
			jb_putc(c, b, ',');
		jb_putc(c, b, tup ? ')' : ']');
		return;
	}
	if (v.t == JV_NS)
		jb_puts(c, b, "<Namespace ");
	jb_putc(c, b, '{');
	for (size_t i = 0; i < v.u.d->n; i++) {
		if (i)
			jb_puts(c, b, ", ");
		jv_repr_into(c, b, v.u.d->k[i]);
		jb_puts(c, b, ": ");
		jv_repr_into(c, b, v.u.d->v[i]);
	}
	jb_putc(c, b, '}');
	if (v.t == JV_NS)
		jb_putc(c, b, '>');
}

void jv_str_into(struct jctx *c, struct jbuf *b, struct jv v)
{
	char tmp[40];
	switch (v.t) {
	case JV_UNDEF: return;
	case JV_NONE: jb_puts(c, b, "None"); return;
	case JV_BOOL: jb_puts(c, b, v.u.b ? "True" : "False"); return;
	case JV_INT: jb_printf(c, b, "%lld", (long long)v.u.i); return;
	case JV_FLOAT: jv_float_repr(v.u.f, tmp); jb_puts(c, b, tmp); return;
	case JV_STR: jb_put_str(c, b, v.u.s); return;
	case JV_LIST:
	case JV_DICT:
	case JV_NS: repr_seq(c, b, v); return;
	case JV_MACRO: jb_puts(c, b, "<Macro>"); return;
	case JV_LOOP: jb_puts(c, b, "<LoopContext>"); return;
	default: jb_puts(c, b, "<built-in function>"); return;
	}
}

void jv_repr_into(struct jctx *c, struct jbuf *b, struct jv v)
{
	if (v.t == JV_STR)
		repr_str(c, b, v.u.s);
	else if (v.t == JV_UNDEF)
		jb_puts(c, b, "Undefined");
	else
		jv_str_into(c, b, v);
}

const struct jstr *jv_to_str(struct jctx *c, struct jv v)
{
	if (v.t == JV_STR)
		return v.u.s;
	struct jbuf b;
	jb_init(c, &b, 32);
	jv_str_into(c, &b, v);
	return jb_finish(c, &b);
}

bool jv_is_str(struct jv v, const char *lit)
{
	return v.t == JV_STR && jstr_is(v.u.s, lit);
}

struct jlist *jv_iterate(struct jctx *c, const struct jnode *at, struct jv v)
{
	switch (v.t) {
	case JV_LIST: return v.u.l;
	case JV_UNDEF: return jl_new(c, 0, JL_LIST);
	case JV_DICT:
	case JV_NS: {
		struct jlist *l = jl_new(c, v.u.d->n, JL_LIST);
		for (size_t i = 0; i < v.u.d->n; i++)
			l->v[l->n++] = v.u.d->k[i];
		return l;
	}
	case JV_STR: {
		const struct jstr *s = v.u.s;
		struct jlist *l = jl_new(c, utf8_count(s->s, s->len), JL_LIST);
		size_t i = 0;
		while (i < s->len) {
			size_t j = i + 1;
			while (j < s->len && ((unsigned char)s->s[j] & 0xC0) == 0x80)
				j++;
			l->v[l->n++] = jv_str(jstr_sub(c, s, i, j - i));
			i = j;
		}
		return l;
	}
	default:
		jx_fail(c, at, JX_TYPE, "'%s' object is not iterable", jv_type_name(v));
	}
}

/* ---- json.dumps(ensure_ascii=False, indent, separators, sort_keys) */

static void json_str(struct jctx *c, struct jbuf *b, const struct jstr *s, bool ascii)
{
	jb_putc(c, b, '"');
	size_t run = 0;
	for (size_t i = 0; i < s->len; i++) {
		unsigned char ch = (unsigned char)s->s[i];
		char esc[16];
		esc[0] = 0;
		if (ch == '"')
			strcpy(esc, "\\\"");
		else if (ch == '\\')
			strcpy(esc, "\\\\");
		else if (ch == '\n')
			strcpy(esc, "\\n");
		else if (ch == '\r')
			strcpy(esc, "\\r");
		else if (ch == '\t')
			strcpy(esc, "\\t");
		else if (ch == '\b')
			strcpy(esc, "\\b");
		else if (ch == '\f')
			strcpy(esc, "\\f");
		else if (ch < 0x20)
			snprintf(esc, sizeof esc, "\\u%04x", ch);
		if (!esc[0] && ascii && ch >= 0x80) {
			/* decode one code point; invalid bytes pass through */
			size_t n = ch >= 0xF0 ? 4 : ch >= 0xE0 ? 3 : ch >= 0xC0 ? 2 : 1;
			if (n > 1 && i + n <= s->len) {
				uint32_t cp = ch & (0x3F >> (n - 1));
				for (size_t k = 1; k < n; k++)
					cp = cp << 6 | ((unsigned char)s->s[i + k] & 0x3F);
				if (cp >= 0x10000)
					snprintf(esc, sizeof esc, "\\u%04x\\u%04x",
						 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF));
				else
					snprintf(esc, sizeof esc, "\\u%04x", cp);
				jb_put_range(c, b, s, run, i - run);
				jb_put(c, b, esc, strlen(esc), jstr_tainted_at(s, i));
				i += n - 1;
				run = i + 1;
				continue;
			}
		}
		if (!esc[0])
			continue;
		jb_put_range(c, b, s, run, i - run);
		jb_put(c, b, esc, strlen(esc), jstr_tainted_at(s, i));
		run = i + 1;
	}
	jb_put_range(c, b, s, run, s->len - run);
	jb_putc(c, b, '"');
}

static void json_newline(struct jctx *c, struct jbuf *b, const struct jtojson *o, int level)
{
	jb_putc(c, b, '\n');
	for (int i = 0; i < level; i++)
		jb_put_str(c, b, o->indent);
}

static int key_cmp(const void *x, const void *y)
{
	const struct jv *a = *(const struct jv *const *)x, *b = *(const struct jv *const *)y;
	if (a->t == JV_STR && b->t == JV_STR) {
		size_t n = a->u.s->len < b->u.s->len ? a->u.s->len : b->u.s->len;
		int r = n ? memcmp(a->u.s->s, b->u.s->s, n) : 0;
		return r ? r : (a->u.s->len > b->u.s->len) - (a->u.s->len < b->u.s->len);
	}
	return 0;
}

void jv_tojson(struct jctx *c, const struct jnode *at, struct jbuf *b, struct jv v,
	       const struct jtojson *o, int level)
{
	char tmp[40];
	if (level > (int)c->lim.depth)
		jx_fail(c, at, JX_LIMIT, "tojson nests deeper than %u levels", c->lim.depth);
	switch (v.t) {
	case JV_NONE: jb_puts(c, b, "null"); return;
	case JV_BOOL: jb_puts(c, b, v.u.b ? "true" : "false"); return;
	case JV_INT: jb_printf(c, b, "%lld", (long long)v.u.i); return;
	case JV_FLOAT:
		if (isnan(v.u.f))
			jb_puts(c, b, "NaN");
		else if (isinf(v.u.f))
			jb_puts(c, b, v.u.f < 0 ? "-Infinity" : "Infinity");
		else {
			jv_float_repr(v.u.f, tmp);
			jb_puts(c, b, tmp);
		}
		return;
	case JV_STR: json_str(c, b, v.u.s, o->ensure_ascii); return;
	case JV_LIST:
		if (v.u.l->kind != JL_GEN) {
			if (!v.u.l->n) {
				jb_puts(c, b, "[]");
				return;
			}
			jb_putc(c, b, '[');
			for (size_t i = 0; i < v.u.l->n; i++) {
				if (i)
					jb_put_str(c, b, o->item_sep);
				if (o->indent)
					json_newline(c, b, o, level + 1);
				jv_tojson(c, at, b, v.u.l->v[i], o, level + 1);
			}
			if (o->indent)
				json_newline(c, b, o, level);
			jb_putc(c, b, ']');
			return;
		}
		break;
	case JV_DICT: {
		const struct jdict *d = v.u.d;
		if (!d->n) {
			jb_puts(c, b, "{}");
			return;
		}
		const struct jv **keys = ja_alloc(c, jmul(c, at, d->n, sizeof *keys));
		for (size_t i = 0; i < d->n; i++)
			keys[i] = &d->k[i];
		if (o->sort_keys)
			qsort(keys, d->n, sizeof *keys, key_cmp);
		jb_putc(c, b, '{');
		for (size_t i = 0; i < d->n; i++) {
			struct jv k = *keys[i];
			struct jv val = d->v[keys[i] - d->k];
			if (i)
				jb_put_str(c, b, o->item_sep);
			if (o->indent)
				json_newline(c, b, o, level + 1);
			if (k.t == JV_STR)
				json_str(c, b, k.u.s, o->ensure_ascii);
			else if (k.t == JV_INT || k.t == JV_FLOAT || k.t == JV_BOOL || k.t == JV_NONE) {
				jb_putc(c, b, '"');
				jv_tojson(c, at, b, k, o, level + 1);
				jb_putc(c, b, '"');
			} else
				jx_fail(c, at, JX_TYPE, "keys must be str, int, float, bool or None, not %s",
					jv_type_name(k));
			jb_put_str(c, b, o->key_sep);
			jv_tojson(c, at, b, val, o, level + 1);
		}
		if (o->indent)
			json_newline(c, b, o, level);
		jb_putc(c, b, '}');
		return;
	}
	default:
		break;
	}
	jx_fail(c, at, JX_TYPE, "Object of type %s is not JSON serializable", jv_type_name(v));
}

const struct jstr *jstr_html_escape(struct jctx *c, const struct jstr *s)
{
	struct jbuf b;
	jb_init(c, &b, s->len + 8);
	for (size_t i = 0; i < s->len; i++) {
		const char *e = NULL;
		switch (s->s[i]) {
		case '&': e = "&amp;"; break;
		case '<': e = "&lt;"; break;
		case '>': e = "&gt;"; break;
		case '"': e = "&#34;"; break;
		case '\'': e = "&#39;"; break;
		}
		if (e)
			jb_put(c, &b, e, strlen(e), jstr_tainted_at(s, i));
		else
			jb_put_range(c, &b, s, i, 1);
	}
	struct jstr *r = (struct jstr *)jb_finish(c, &b);
	r->markup = 1;
	return r;
}
