/* jinja2's built-in filters and tests, Python's str/dict/list methods as the immutable
 * sandbox exposes them (mutating methods are refused with SecurityError), attribute lookup,
 * and the globals transformers adds (raise_exception, strftime_now) beside range, dict and
 * namespace. Filters keep taint: every output byte comes from an input byte or a literal. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/engine/jinja.h"

enum {
	F_RANGE = 1, F_NAMESPACE, F_DICT, F_RAISE, F_STRFTIME,
};

enum {
	M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_STARTSWITH, M_ENDSWITH, M_REPLACE,
	M_UPPER, M_LOWER, M_TITLE, M_CAPITALIZE, M_FIND, M_RFIND, M_COUNT, M_JOIN, M_SPLITLINES,
	M_ISDIGIT, M_ISALPHA, M_ISSPACE, M_ISUPPER, M_ISLOWER, M_ISALNUM, M_INDEX,
	M_GET, M_ITEMS, M_KEYS, M_VALUES, M_COPY,
	M_POP, M_LCOUNT, M_LINDEX,
	M_CYCLE,
};

struct name_id {
	const char *name;
	int id;
};

static const struct name_id str_methods[] = {
	{ "strip", M_STRIP }, { "lstrip", M_LSTRIP }, { "rstrip", M_RSTRIP }, { "split", M_SPLIT },
	{ "rsplit", M_RSPLIT }, { "startswith", M_STARTSWITH }, { "endswith", M_ENDSWITH },
	{ "replace", M_REPLACE }, { "upper", M_UPPER }, { "lower", M_LOWER }, { "title", M_TITLE },
	{ "capitalize", M_CAPITALIZE }, { "find", M_FIND }, { "rfind", M_RFIND }, { "count", M_COUNT },
	{ "join", M_JOIN }, { "splitlines", M_SPLITLINES }, { "isdigit", M_ISDIGIT },
	{ "isalpha", M_ISALPHA }, { "isspace", M_ISSPACE }, { "isupper", M_ISUPPER },
	{ "islower", M_ISLOWER }, { "isalnum", M_ISALNUM }, { "index", M_INDEX }, { NULL, 0 },
};
static const struct name_id dict_methods[] = {
	{ "get", M_GET }, { "items", M_ITEMS }, { "keys", M_KEYS }, { "values", M_VALUES },
	{ "copy", M_COPY }, { NULL, 0 },
};
static const struct name_id list_methods[] = {
	{ "pop", M_POP }, { "count", M_LCOUNT }, { "index", M_LINDEX }, { "copy", M_COPY }, { NULL, 0 },
};
/* what ImmutableSandboxedEnvironment refuses (jinja2.sandbox's _mutable_spec) */
static const char *const dict_mutators[] = { "clear", "pop", "popitem", "setdefault", "update", NULL };
static const char *const list_mutators[] = { "append", "reverse", "insert", "sort", "extend", "remove", NULL };

static int find_id(const struct name_id *t, const struct jstr *name)
{
	for (; t->name; t++)
		if (jstr_is(name, t->name))
			return t->id;
	return -1;
}

static bool in_names(const char *const *t, const struct jstr *name)
{
	for (; *t; t++)
		if (jstr_is(name, *t))
			return true;
	return false;
}

static struct jv method(struct jctx *c, struct jv self, int id)
{
	struct jmethod *m = ja_alloc(c, sizeof *m);
	m->self = self;
	m->id = id;
	return (struct jv){ .t = JV_METHOD, .u.me = m };
}

static struct jv no_attr(struct jctx *c, struct jv obj, const struct jstr *name)
{
	const char *tn = obj.t == JV_NS ? "jinja2.utils.Namespace" : obj.t == JV_LOOP ? "jinja2.runtime.LoopContext" :
			 jv_type_name(obj);
	if (obj.t == JV_NONE)
		return jv_undef(c, JX_UNDEFINED, "'None' has no attribute '%.*s'", (int)name->len, name->s);
	return jv_undef(c, JX_UNDEFINED, "'%s object' has no attribute '%.*s'", tn, (int)name->len, name->s);
}

static struct jv unsafe(struct jctx *c, struct jv obj, const struct jstr *name)
{
	return jv_undef(c, JX_SECURITY, "access to attribute '%.*s' of '%s' object is unsafe.", (int)name->len,
			name->s, jv_type_name(obj));
}

struct jv jinja_getattr(struct jctx *c, const struct jnode *at, struct jv obj, const struct jstr *name)
{
	int id;
	if (name->len && name->s[0] == '_')
		return unsafe(c, obj, name);
	switch (obj.t) {
	case JV_DICT: {
		if ((id = find_id(dict_methods, name)) >= 0)
			return method(c, obj, id);
		if (in_names(dict_mutators, name))
			return unsafe(c, obj, name);
		const struct jv *v = jd_get(obj.u.d, jv_str(name));
		return v ? *v : no_attr(c, obj, name);
	}
	case JV_NS: {
		const struct jv *v = jd_get(obj.u.d, jv_str(name));
		return v ? *v : no_attr(c, obj, name);
	}
	case JV_STR:
		if ((id = find_id(str_methods, name)) >= 0)
			return method(c, obj, id);
		return no_attr(c, obj, name);
	case JV_LIST:
		if (obj.u.l->kind != JL_GEN) {
			if ((id = find_id(list_methods, name)) >= 0 && (obj.u.l->kind == JL_LIST || id != M_POP))
				return method(c, obj, id);
			if (obj.u.l->kind == JL_LIST && in_names(list_mutators, name))
				return unsafe(c, obj, name);
		}
		return no_attr(c, obj, name);
	case JV_LOOP: {
		const struct jloop *lp = obj.u.lp;
		int64_t n = (int64_t)lp->items->n, i = (int64_t)lp->i;
		if (jstr_is(name, "index")) return jv_int(i + 1);
		if (jstr_is(name, "index0")) return jv_int(i);
		if (jstr_is(name, "revindex")) return jv_int(n - i);
		if (jstr_is(name, "revindex0")) return jv_int(n - i - 1);
		if (jstr_is(name, "first")) return jv_bool(i == 0);
		if (jstr_is(name, "last")) return jv_bool(i == n - 1);
		if (jstr_is(name, "length")) return jv_int(n);
		if (jstr_is(name, "depth")) return jv_int(lp->depth);
		if (jstr_is(name, "depth0")) return jv_int(lp->depth - 1);
		if (jstr_is(name, "previtem"))
			return i > 0 ? lp->items->v[i - 1] : jv_undef(c, JX_UNDEFINED, "there is no previous item");
		if (jstr_is(name, "nextitem"))
			return i + 1 < n ? lp->items->v[i + 1] : jv_undef(c, JX_UNDEFINED, "there is no next item");
		if (jstr_is(name, "cycle"))
			return method(c, obj, M_CYCLE);
		return no_attr(c, obj, name);
	}
	default:
		(void)at;
		return no_attr(c, obj, name);
	}
}

/* ---- argument helpers */

struct args {
	struct jv *pos;
	size_t n;
	const struct jstr **kw_names;
	struct jv *kw_vals;
	size_t n_kw;
};

/* The argument at position i or named name; false when neither was given. */
static bool arg(const struct args *a, size_t i, const char *name, struct jv *out)
{
	if (i < a->n) {
		*out = a->pos[i];
		return true;
	}
	for (size_t k = 0; name && k < a->n_kw; k++)
		if (jstr_is(a->kw_names[k], name)) {
			*out = a->kw_vals[k];
			return true;
		}
	return false;
}

static struct jv arg_or(const struct args *a, size_t i, const char *name, struct jv dflt)
{
	struct jv v;
	return arg(a, i, name, &v) ? v : dflt;
}

static const struct jstr *need_str(struct jctx *c, const struct jnode *at, struct jv v, const char *what)
{
	if (v.t != JV_STR)
		jx_fail(c, at, JX_TYPE, "%s must be str, not %s", what, jv_type_name(v));
	return v.u.s;
}

static int64_t need_int(struct jctx *c, const struct jnode *at, struct jv v, const char *what)
{
	if (v.t == JV_INT)
		return v.u.i;
	if (v.t == JV_BOOL)
		return v.u.b;
	jx_fail(c, at, JX_TYPE, "%s must be an integer, not %s", what, jv_type_name(v));
}

/* str() of a value where jinja2 uses soft_str (undefined gives "") */
static const struct jstr *soft_str(struct jctx *c, struct jv v)
{
	return jv_to_str(c, v);
}

/* ---- unicode helpers for strip/split/case */

static uint32_t cp_at(const char *s, size_t n, size_t i, size_t *len)
{
	unsigned char b = (unsigned char)s[i];
	size_t k = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
	if (i + k > n)
		k = 1;
	uint32_t cp = k == 1 ? b : (uint32_t)(b & (0x3F >> (k - 1)));
	for (size_t j = 1; j < k; j++)
		cp = cp << 6 | ((unsigned char)s[i + j] & 0x3F);
	*len = k;
	return cp;
}

static size_t cp_start_before(const char *s, size_t i)
{
	size_t j = i - 1;
	while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80 && i - j < 4)
		j--;
	return j;
}

static bool py_space(uint32_t cp)
{
	return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
	       cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
	       cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static bool in_chars(const struct jstr *chars, uint32_t cp)
{
	for (size_t i = 0; i < chars->len;) {
		size_t k;
		if (cp_at(chars->s, chars->len, i, &k) == cp)
			return true;
		i += k;
	}
	return false;
}

static bool strip_match(const struct jstr *chars, uint32_t cp)
{
	return chars ? in_chars(chars, cp) : py_space(cp);
}

static struct jv do_strip(struct jctx *c, const struct jstr *s, const struct jstr *chars, bool left, bool right)
{
	size_t lo = 0, hi = s->len, k;
	if (left)
		while (lo < hi && strip_match(chars, cp_at(s->s, hi, lo, &k)))
			lo += k;
	if (right)
		while (hi > lo) {
			size_t b = cp_start_before(s->s, hi);
			if (b < lo || !strip_match(chars, cp_at(s->s, hi, b, &k)))
				break;
			hi = b;
		}
	return jv_str(jstr_sub(c, s, lo, hi - lo));
}

static uint32_t cp_upper(uint32_t cp)
{
	if (cp >= 'a' && cp <= 'z')
		return cp - 32;
	if ((cp >= 0xE0 && cp <= 0xFE && cp != 0xF7))
		return cp - 32;
	if (cp >= 0x3B1 && cp <= 0x3C9 && cp != 0x3C2)
		return cp - 32;
	if (cp >= 0x430 && cp <= 0x44F)
		return cp - 32;
	if (cp >= 0x450 && cp <= 0x45F)
		return cp - 80;
	return cp;
}

static uint32_t cp_lower(uint32_t cp)
{
	if (cp >= 'A' && cp <= 'Z')
		return cp + 32;
	if ((cp >= 0xC0 && cp <= 0xDE && cp != 0xD7))
		return cp + 32;
	if (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2)
		return cp + 32;
	if (cp >= 0x410 && cp <= 0x42F)
		return cp + 32;
	if (cp >= 0x400 && cp <= 0x40F)
		return cp + 80;
	return cp;
}

static void put_cp(struct jctx *c, struct jbuf *b, uint32_t cp, bool taint)
{
	char u[4];
	size_t n;
	if (cp < 0x80) {
		u[0] = (char)cp;
		n = 1;
	} else if (cp < 0x800) {
		u[0] = (char)(0xC0 | cp >> 6);
		u[1] = (char)(0x80 | (cp & 0x3F));
		n = 2;
	} else if (cp < 0x10000) {
		u[0] = (char)(0xE0 | cp >> 12);
		u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
		u[2] = (char)(0x80 | (cp & 0x3F));
		n = 3;
	} else {
		u[0] = (char)(0xF0 | cp >> 18);
		u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
		u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
		u[3] = (char)(0x80 | (cp & 0x3F));
		n = 4;
	}
	jb_put(c, b, u, n, taint);
}

/* mode 0 upper, 1 lower, 2 title, 3 capitalize */
static struct jv do_case(struct jctx *c, const struct jstr *s, int mode)
{
	struct jbuf b;
	jb_init(c, &b, s->len);
	bool prev_cased = false, first = true;
	for (size_t i = 0; i < s->len;) {
		size_t k;
		uint32_t cp = cp_at(s->s, s->len, i, &k);
		if (k == 1 && cp >= 0x80) { /* invalid byte: copied as is */
			jb_put_range(c, &b, s, i, 1);
			i++;
			continue;
		}
		uint32_t o;
		bool cased = cp_upper(cp) != cp || cp_lower(cp) != cp;
		if (mode == 0)
			o = cp_upper(cp);
		else if (mode == 1)
			o = cp_lower(cp);
		else if (mode == 2)
			o = prev_cased ? cp_lower(cp) : cp_upper(cp);
		else
			o = first ? cp_upper(cp) : cp_lower(cp);
		prev_cased = cased;
		first = false;
		if (o == cp)
			jb_put_range(c, &b, s, i, k);
		else
			put_cp(c, &b, o, jstr_tainted_at(s, i));
		i += k;
	}
	return jv_str(jb_finish(c, &b));
}

static const char *find_sub(const struct jstr *s, size_t from, const struct jstr *sub)
{
	if (from > s->len)
		return NULL;
	if (!sub->len)
		return s->s + from;
	return memmem(s->s + from, s->len - from, sub->s, sub->len);
}

static struct jv do_split(struct jctx *c, const struct jnode *at, const struct jstr *s, struct jv sepv,
			  int64_t maxsplit, bool from_right)
{
	struct jlist *l = jl_new(c, 0, JL_LIST);
	if (sepv.t == JV_NONE || sepv.t == JV_UNDEF) {
		/* whitespace runs, empties dropped */
		size_t i = 0, k;
		int64_t splits = 0;
		if (!from_right) {
			while (i < s->len) {
				while (i < s->len && py_space(cp_at(s->s, s->len, i, &k)))
					i += k;
				if (i >= s->len)
					break;
				size_t st = i;
				if (maxsplit >= 0 && splits >= maxsplit) {
					size_t e = s->len;
					while (e > st) {
						size_t bpos = cp_start_before(s->s, e);
						if (!py_space(cp_at(s->s, e, bpos, &k)))
							break;
						e = bpos;
					}
					jl_push(c, l, jv_str(jstr_sub(c, s, st, e - st)));
					break;
				}
				while (i < s->len && !py_space(cp_at(s->s, s->len, i, &k)))
					i += k;
				jl_push(c, l, jv_str(jstr_sub(c, s, st, i - st)));
				splits++;
			}
			return jv_list(l);
		}
		/* rsplit without sep: only the no-maxsplit case matters in practice */
		return do_split(c, at, s, jv_none(), -1, false);
	}
	const struct jstr *sep = need_str(c, at, sepv, "separator");
	if (!sep->len)
		jx_fail(c, at, JX_VALUE, "empty separator");
	if (!from_right || maxsplit < 0) {
		size_t i = 0;
		int64_t splits = 0;
		for (;;) {
			const char *m = (maxsplit < 0 || splits < maxsplit) ? find_sub(s, i, sep) : NULL;
			if (!m) {
				jl_push(c, l, jv_str(jstr_sub(c, s, i, s->len - i)));
				break;
			}
			size_t at_ = (size_t)(m - s->s);
			jl_push(c, l, jv_str(jstr_sub(c, s, i, at_ - i)));
			i = at_ + sep->len;
			splits++;
			jx_step(c, at);
		}
		return jv_list(l);
	}
	/* rsplit with maxsplit: split from the right, then reverse */
	struct jlist *r = jl_new(c, 0, JL_LIST);
	size_t end = s->len;
	int64_t splits = 0;
	while (splits < maxsplit) {
		const char *m = NULL;
		for (size_t j = end; j >= sep->len; j--)
			if (!memcmp(s->s + j - sep->len, sep->s, sep->len)) {
				m = s->s + j - sep->len;
				break;
			}
		if (!m)
			break;
		size_t p = (size_t)(m - s->s);
		jl_push(c, r, jv_str(jstr_sub(c, s, p + sep->len, end - p - sep->len)));
		end = p;
		splits++;
	}
	jl_push(c, r, jv_str(jstr_sub(c, s, 0, end)));
	for (size_t i = r->n; i-- > 0;)
		jl_push(c, l, r->v[i]);
	return jv_list(l);
}

static struct jv do_replace(struct jctx *c, const struct jnode *at, const struct jstr *s, const struct jstr *old,
			    const struct jstr *new, int64_t count)
{
	struct jbuf b;
	jb_init(c, &b, s->len);
	size_t i = 0;
	int64_t done = 0;
	if (!old->len) {
		/* Python inserts new before every character and at the end */
		for (; i <= s->len; done++) {
			if (count >= 0 && done >= count) {
				jb_put_range(c, &b, s, i, s->len - i);
				break;
			}
			jb_put_str(c, &b, new);
			if (i == s->len)
				break;
			size_t k;
			cp_at(s->s, s->len, i, &k);
			jb_put_range(c, &b, s, i, k);
			i += k;
			jx_step(c, at);
		}
		return jv_str(jb_finish(c, &b));
	}
	for (;;) {
		const char *m = (count < 0 || done < count) ? find_sub(s, i, old) : NULL;
		if (!m) {
			jb_put_range(c, &b, s, i, s->len - i);
			break;
		}
		size_t p = (size_t)(m - s->s);
		jb_put_range(c, &b, s, i, p - i);
		jb_put_str(c, &b, new);
		i = p + old->len;
		done++;
		jx_step(c, at);
	}
	return jv_str(jb_finish(c, &b));
}

static bool prefix_test(struct jctx *c, const struct jnode *at, const struct jstr *s, struct jv p, bool end)
{
	if (p.t == JV_LIST && p.u.l->kind == JL_TUPLE) {
		for (size_t i = 0; i < p.u.l->n; i++)
			if (prefix_test(c, at, s, p.u.l->v[i], end))
				return true;
		return false;
	}
	const struct jstr *x = need_str(c, at, p, end ? "endswith first arg" : "startswith first arg");
	if (x->len > s->len)
		return false;
	return !memcmp(end ? s->s + s->len - x->len : s->s, x->s, x->len);
}

static struct jv join_items(struct jctx *c, const struct jnode *at, const struct jstr *sep, struct jlist *l,
			    bool strict)
{
	struct jbuf b;
	jb_init(c, &b, 64);
	for (size_t i = 0; i < l->n; i++) {
		if (i)
			jb_put_str(c, &b, sep);
		if (strict && l->v[i].t != JV_STR)
			jx_fail(c, at, JX_TYPE, "sequence item %zu: expected str instance, %s found", i,
				jv_type_name(l->v[i]));
		jv_str_into(c, &b, l->v[i]);
	}
	return jv_str(jb_finish(c, &b));
}

static struct jv dict_items(struct jctx *c, const struct jdict *d, uint8_t kind)
{
	struct jlist *l = jl_new(c, d->n, kind);
	for (size_t i = 0; i < d->n; i++) {
		struct jlist *t = jl_new(c, 2, JL_TUPLE);
		t->v[0] = d->k[i];
		t->v[1] = d->v[i];
		t->n = 2;
		l->v[l->n++] = jv_list(t);
	}
	return jv_list(l);
}

static bool str_class(const struct jstr *s, int id)
{
	if (!s->len)
		return false;
	bool any_cased = false;
	for (size_t i = 0; i < s->len;) {
		size_t k;
		uint32_t cp = cp_at(s->s, s->len, i, &k);
		i += k;
		bool digit = cp >= '0' && cp <= '9';
		bool alpha = cp_upper(cp) != cp || cp_lower(cp) != cp || cp >= 0x80;
		switch (id) {
		case M_ISDIGIT: if (!digit) return false; break;
		case M_ISALPHA: if (!alpha) return false; break;
		case M_ISALNUM: if (!alpha && !digit) return false; break;
		case M_ISSPACE: if (!py_space(cp)) return false; break;
		case M_ISUPPER:
			if (cp_upper(cp) != cp)
				return false;
			any_cased |= cp_lower(cp) != cp;
			break;
		case M_ISLOWER:
			if (cp_lower(cp) != cp)
				return false;
			any_cased |= cp_upper(cp) != cp;
			break;
		}
	}
	return id == M_ISUPPER || id == M_ISLOWER ? any_cased : true;
}

static struct jv call_method(struct jctx *c, const struct jnode *at, struct jmethod *m, const struct args *a)
{
	struct jv self = m->self, v;
	if (self.t == JV_STR) {
		const struct jstr *s = self.u.s;
		switch (m->id) {
		case M_STRIP:
		case M_LSTRIP:
		case M_RSTRIP: {
			const struct jstr *chars = NULL;
			if (arg(a, 0, NULL, &v) && v.t != JV_NONE)
				chars = need_str(c, at, v, "strip arg");
			return do_strip(c, s, chars, m->id != M_RSTRIP, m->id != M_LSTRIP);
		}
		case M_SPLIT:
		case M_RSPLIT: {
			struct jv sep = arg_or(a, 0, "sep", jv_none());
			int64_t maxs = need_int(c, at, arg_or(a, 1, "maxsplit", jv_int(-1)), "maxsplit");
			return do_split(c, at, s, sep, maxs, m->id == M_RSPLIT);
		}
		case M_STARTSWITH:
		case M_ENDSWITH:
			if (!arg(a, 0, NULL, &v))
				jx_fail(c, at, JX_TYPE, "startswith() takes at least 1 argument (0 given)");
			return jv_bool(prefix_test(c, at, s, v, m->id == M_ENDSWITH));
		case M_REPLACE: {
			struct jv o, n;
			if (!arg(a, 0, NULL, &o) || !arg(a, 1, NULL, &n))
				jx_fail(c, at, JX_TYPE, "replace expected at least 2 arguments");
			int64_t cnt = need_int(c, at, arg_or(a, 2, "count", jv_int(-1)), "count");
			return do_replace(c, at, s, need_str(c, at, o, "replace arg 1"),
					  need_str(c, at, n, "replace arg 2"), cnt);
		}
		case M_UPPER: return do_case(c, s, 0);
		case M_LOWER: return do_case(c, s, 1);
		case M_TITLE: return do_case(c, s, 2);
		case M_CAPITALIZE: return do_case(c, s, 3);
		case M_FIND:
		case M_RFIND:
		case M_INDEX:
		case M_COUNT: {
			if (!arg(a, 0, NULL, &v))
				jx_fail(c, at, JX_TYPE, "method takes at least 1 argument (0 given)");
			const struct jstr *sub = need_str(c, at, v, "substring");
			if (m->id == M_COUNT) {
				if (!sub->len)
					return jv_int((int64_t)utf8_count(s->s, s->len) + 1);
				int64_t k = 0;
				for (const char *p = find_sub(s, 0, sub); p; p = find_sub(s, (size_t)(p - s->s) + sub->len, sub))
					k++;
				return jv_int(k);
			}
			const char *p = NULL;
			if (m->id == M_RFIND) {
				for (size_t j = s->len + 1; j-- > sub->len;)
					if (!memcmp(s->s + j - sub->len, sub->s, sub->len)) {
						p = s->s + j - sub->len;
						break;
					}
				if (!sub->len)
					p = s->s + s->len;
			} else
				p = find_sub(s, 0, sub);
			if (!p && m->id == M_INDEX)
				jx_fail(c, at, JX_VALUE, "substring not found");
			return jv_int(p ? (int64_t)utf8_count(s->s, (size_t)(p - s->s)) : -1);
		}
		case M_JOIN:
			if (!arg(a, 0, NULL, &v))
				jx_fail(c, at, JX_TYPE, "str.join() takes exactly one argument (0 given)");
			return join_items(c, at, s, jv_iterate(c, at, v), true);
		case M_SPLITLINES: {
			struct jlist *l = jl_new(c, 0, JL_LIST);
			size_t i = 0, st = 0;
			while (i < s->len) {
				if (s->s[i] == '\n' || s->s[i] == '\r') {
					jl_push(c, l, jv_str(jstr_sub(c, s, st, i - st)));
					if (s->s[i] == '\r' && i + 1 < s->len && s->s[i + 1] == '\n')
						i++;
					st = ++i;
				} else
					i++;
			}
			if (st < s->len)
				jl_push(c, l, jv_str(jstr_sub(c, s, st, s->len - st)));
			return jv_list(l);
		}
		default:
			return jv_bool(str_class(s, m->id));
		}
	}
	if (self.t == JV_DICT) {
		const struct jdict *d = self.u.d;
		switch (m->id) {
		case M_GET: {
			if (!arg(a, 0, NULL, &v))
				jx_fail(c, at, JX_TYPE, "get expected at least 1 argument, got 0");
			const struct jv *r = jd_get(d, v);
			return r ? *r : arg_or(a, 1, "default", jv_none());
		}
		case M_ITEMS: return dict_items(c, d, JL_LIST);
		case M_KEYS:
		case M_VALUES: {
			struct jlist *l = jl_new(c, d->n, JL_LIST);
			for (size_t i = 0; i < d->n; i++)
				l->v[l->n++] = m->id == M_KEYS ? d->k[i] : d->v[i];
			return jv_list(l);
		}
		default: {
			struct jdict *n = jd_new(c, d->n);
			for (size_t i = 0; i < d->n; i++)
				jd_set(c, n, d->k[i], d->v[i]);
			return jv_dict(n);
		}
		}
	}
	if (self.t == JV_LIST) {
		struct jlist *l = self.u.l;
		switch (m->id) {
		case M_POP: {
			if (!l->n)
				jx_fail(c, at, JX_RUNTIME, "IndexError: pop from empty list");
			int64_t i = need_int(c, at, arg_or(a, 0, NULL, jv_int(-1)), "index");
			if (i < 0)
				i += (int64_t)l->n;
			if (i < 0 || i >= (int64_t)l->n)
				jx_fail(c, at, JX_RUNTIME, "IndexError: pop index out of range");
			struct jv r = l->v[i];
			memmove(l->v + i, l->v + i + 1, (l->n - (size_t)i - 1) * sizeof *l->v);
			l->n--;
			return r;
		}
		case M_LCOUNT:
		case M_LINDEX: {
			if (!arg(a, 0, NULL, &v))
				jx_fail(c, at, JX_TYPE, "method takes exactly one argument (0 given)");
			int64_t k = 0;
			for (size_t i = 0; i < l->n; i++)
				if (jv_equal(l->v[i], v)) {
					if (m->id == M_LINDEX)
						return jv_int((int64_t)i);
					k++;
				}
			if (m->id == M_LINDEX)
				jx_fail(c, at, JX_VALUE, "value is not in list");
			return jv_int(k);
		}
		default: {
			struct jlist *n = jl_new(c, l->n, JL_LIST);
			memcpy(n->v, l->v, l->n * sizeof *l->v);
			n->n = l->n;
			return jv_list(n);
		}
		}
	}
	if (self.t == JV_LOOP && m->id == M_CYCLE) {
		if (!a->n)
			jx_fail(c, at, JX_TYPE, "no items for cycling given");
		return a->pos[self.u.lp->i % a->n];
	}
	jx_fail(c, at, JX_RUNTIME, "internal: bad method");
}

/* ---- globals */

struct jv jinja_global(struct jctx *c, const struct jstr *name)
{
	(void)c;
	static const struct name_id g[] = {
		{ "range", F_RANGE }, { "namespace", F_NAMESPACE }, { "dict", F_DICT },
		{ "raise_exception", F_RAISE }, { "strftime_now", F_STRFTIME }, { NULL, 0 },
	};
	int id = find_id(g, name);
	if (id < 0)
		return jv_missing();
	return (struct jv){ .t = JV_FUNC, .u.fn = id };
}

static struct jv do_range(struct jctx *c, const struct jnode *at, const struct args *a)
{
	int64_t lo = 0, hi, st = 1;
	if (a->n == 0 || a->n > 3)
		jx_fail(c, at, JX_TYPE, "range expected 1 to 3 arguments, got %zu", a->n);
	if (a->n == 1)
		hi = need_int(c, at, a->pos[0], "range() argument");
	else {
		lo = need_int(c, at, a->pos[0], "range() argument");
		hi = need_int(c, at, a->pos[1], "range() argument");
		if (a->n == 3)
			st = need_int(c, at, a->pos[2], "range() argument");
	}
	if (st == 0)
		jx_fail(c, at, JX_VALUE, "range() arg 3 must not be zero");
	uint64_t count = 0;
	if (st > 0 && hi > lo)
		count = ((uint64_t)hi - (uint64_t)lo - 1) / (uint64_t)st + 1;
	else if (st < 0 && lo > hi)
		count = ((uint64_t)lo - (uint64_t)hi - 1) / ((uint64_t)(-(st + 1)) + 1) + 1;
	if (count > c->lim.range)
		jx_fail(c, at, JX_LIMIT, "range of %llu items is over the limit of %zu",
			(unsigned long long)count, c->lim.range);
	struct jlist *l = jl_new(c, (size_t)count, JL_LIST);
	for (uint64_t i = 0; i < count; i++)
		l->v[l->n++] = jv_int((int64_t)((uint64_t)lo + i * (uint64_t)st)); /* wraps, never UB */
	return jv_list(l);
}

struct jv jinja_call_builtin(struct jctx *c, const struct jnode *at, struct jv fn, struct jv *pos, size_t n,
			     const struct jstr **kw_names, struct jv *kw_vals, size_t n_kw)
{
	struct args a = { pos, n, kw_names, kw_vals, n_kw };
	if (fn.t == JV_METHOD)
		return call_method(c, at, fn.u.me, &a);
	switch (fn.u.fn) {
	case F_RANGE:
		return do_range(c, at, &a);
	case F_NAMESPACE:
	case F_DICT: {
		struct jdict *d = jd_new(c, n_kw);
		for (size_t i = 0; i < n; i++) {
			if (pos[i].t != JV_DICT)
				jx_fail(c, at, JX_TYPE, "%s() takes a mapping as positional argument",
					fn.u.fn == F_DICT ? "dict" : "namespace");
			for (size_t k = 0; k < pos[i].u.d->n; k++)
				jd_set(c, d, pos[i].u.d->k[k], pos[i].u.d->v[k]);
		}
		for (size_t i = 0; i < n_kw; i++)
			jd_set(c, d, jv_str(kw_names[i]), kw_vals[i]);
		return (struct jv){ .t = fn.u.fn == F_DICT ? JV_DICT : JV_NS, .u.d = d };
	}
	case F_RAISE: {
		const struct jstr *msg = n ? jv_to_str(c, pos[0]) : jstr_cstr(c, "");
		jx_fail(c, at, JX_TEMPLATE, "%.*s", (int)(msg->len > 300 ? 300 : msg->len), msg->s);
	}
	case F_STRFTIME: {
		if (!n)
			jx_fail(c, at, JX_TYPE, "strftime_now() missing 1 required positional argument: 'format'");
		const struct jstr *fmt = need_str(c, at, pos[0], "strftime format");
		time_t t = c->now >= 0 ? (time_t)c->now : time(NULL);
		struct tm tm;
		if (c->now >= 0)
			gmtime_r(&t, &tm);
		else
			localtime_r(&t, &tm);
		char out[512];
		size_t k = fmt->len ? strftime(out, sizeof out, jstr_z(c, fmt), &tm) : 0;
		return jv_str(jstr_new(c, out, k, fmt->taint != JT_CLEAN));
	}
	default:
		jx_fail(c, at, JX_RUNTIME, "internal: bad builtin");
	}
}

/* ---- tests */

static bool test_by_name(struct jctx *c, const struct jnode *at, const char *name, struct jv v,
			 struct jv *args, size_t n);

bool jinja_test(struct jctx *c, const struct jnode *at, const struct jstr *name, struct jv in,
		struct jv *args, size_t n)
{
	char tmp[32];
	if (name->len >= sizeof tmp)
		jx_fail(c, at, JX_RUNTIME, "No test named '%.*s'.", 40, name->s);
	memcpy(tmp, name->s, name->len);
	tmp[name->len] = 0;
	return test_by_name(c, at, tmp, in, args, n);
}

static bool test_by_name(struct jctx *c, const struct jnode *at, const char *name, struct jv v,
			 struct jv *args, size_t n)
{
#define IS(s) (!strcmp(name, s))
	struct jv o = n ? args[0] : jv_missing();
	if (IS("defined")) return v.t != JV_UNDEF;
	if (IS("undefined")) return v.t == JV_UNDEF;
	if (IS("none")) return v.t == JV_NONE;
	if (IS("string")) return v.t == JV_STR;
	if (IS("number")) return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
	if (IS("integer")) return v.t == JV_INT;
	if (IS("float")) return v.t == JV_FLOAT;
	if (IS("boolean")) return v.t == JV_BOOL;
	if (IS("true")) return v.t == JV_BOOL && v.u.b;
	if (IS("false")) return v.t == JV_BOOL && !v.u.b;
	if (IS("mapping")) return v.t == JV_DICT;
	if (IS("iterable")) return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
	if (IS("sequence"))
		return v.t == JV_STR || (v.t == JV_LIST && v.u.l->kind != JL_GEN) || v.t == JV_DICT || v.t == JV_UNDEF;
	if (IS("callable")) return v.t == JV_MACRO || v.t == JV_FUNC || v.t == JV_METHOD;
	if (IS("odd") || IS("even") || IS("divisibleby")) {
		int64_t x = need_int(c, at, v, "value");
		if (IS("divisibleby")) {
			int64_t d = need_int(c, at, o, "divisor");
			if (!d)
				jx_fail(c, at, JX_RUNTIME, "ZeroDivisionError: integer division or modulo by zero");
			return x % d == 0;
		}
		return (x % 2 != 0) == IS("odd");
	}
	if (IS("eq") || IS("equalto") || IS("==")) return jv_equal(v, o);
	if (IS("ne") || IS("!=")) return !jv_equal(v, o);
	if (IS("lt") || IS("lessthan") || IS("<")) return jv_compare(c, at, v, o, "<") < 0;
	if (IS("le") || IS("<=")) return jv_compare(c, at, v, o, "<=") <= 0;
	if (IS("gt") || IS("greaterthan") || IS(">")) return jv_compare(c, at, v, o, ">") > 0;
	if (IS("ge") || IS(">=")) return jv_compare(c, at, v, o, ">=") >= 0;
	if (IS("in")) {
		if (o.t == JV_STR && v.t == JV_STR)
			return !v.u.s->len || memmem(o.u.s->s, o.u.s->len, v.u.s->s, v.u.s->len);
		struct jlist *l = o.t == JV_DICT ? NULL : jv_iterate(c, at, o);
		if (!l)
			return jd_get(o.u.d, v) != NULL;
		for (size_t i = 0; i < l->n; i++)
			if (jv_equal(l->v[i], v))
				return true;
		return false;
	}
	if (IS("sameas")) {
		if (v.t != o.t)
			return false;
		if (v.t == JV_LIST || v.t == JV_DICT || v.t == JV_NS)
			return v.u.l == o.u.l;
		return jv_equal(v, o);
	}
	if (IS("lower") || IS("upper")) {
		const struct jstr *s = jv_to_str(c, v);
		return str_class(s, IS("lower") ? M_ISLOWER : M_ISUPPER);
	}
	if (IS("escaped")) return false;
	jx_fail(c, at, JX_RUNTIME, "No test named '%s'.", name);
#undef IS
}

/* ---- filters */

/* environment.getitem along "a.b.0" as jinja2's make_attrgetter does */
static struct jv attr_path(struct jctx *c, const struct jnode *at, struct jv item, const struct jstr *path)
{
	size_t i = 0;
	while (i <= path->len) {
		size_t j = i;
		while (j < path->len && path->s[j] != '.')
			j++;
		const struct jstr *part = jstr_sub(c, path, i, j - i);
		bool digits = part->len > 0;
		int64_t num = 0;
		for (size_t k = 0; k < part->len; k++) {
			if (part->s[k] < '0' || part->s[k] > '9' || num > INT64_MAX / 10 - 10) {
				digits = false;
				break;
			}
			num = num * 10 + (part->s[k] - '0');
		}
		if (item.t == JV_UNDEF)
			return item;
		if (digits)
			item = jinja_getitem(c, at, item, jv_int(num));
		else if (item.t == JV_DICT) {
			const struct jv *v = jd_get(item.u.d, jv_str(part));
			item = v ? *v : jinja_getattr(c, at, item, part);
		} else
			item = jinja_getattr(c, at, item, part);
		if (j >= path->len)
			break;
		i = j + 1;
	}
	return item;
}

static struct jv sort_key(struct jctx *c, struct jv v, bool case_sensitive)
{
	if (!case_sensitive && v.t == JV_STR)
		return do_case(c, v.u.s, 1);
	return v;
}

struct sort_item {
	struct jv key, val;
};

struct sort_ctx {
	struct jctx *c;
	const struct jnode *at;
	bool reverse;
};

static int sort_cmp(const struct sort_ctx *sc, const struct sort_item *a, const struct sort_item *b)
{
	int r = jv_compare(sc->c, sc->at, a->key, b->key, "<");
	return sc->reverse ? -r : r;
}

/* a bottom-up merge sort: stable, as Python's sort is */
static void stable_sort(struct jctx *c, const struct jnode *at, struct sort_item *items, size_t n, bool reverse)
{
	if (n < 2)
		return;
	struct sort_ctx sc = { c, at, reverse };
	struct sort_item *tmp = ja_alloc(c, jmul(c, at, n, sizeof *tmp));
	for (size_t width = 1; width < n; width *= 2) {
		for (size_t lo = 0; lo < n; lo += 2 * width) {
			size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
			size_t i = lo, j = mid, k = lo;
			while (i < mid && j < hi)
				tmp[k++] = sort_cmp(&sc, &items[j], &items[i]) < 0 ? items[j++] : items[i++];
			while (i < mid)
				tmp[k++] = items[i++];
			while (j < hi)
				tmp[k++] = items[j++];
		}
		memcpy(items, tmp, n * sizeof *items);
		jx_step(c, at);
	}
}

static struct jv filter_select(struct jctx *c, const struct jnode *at, struct jv in, const struct args *a,
			       bool by_attr, bool reject)
{
	struct jlist *src = jv_truthy(in) ? jv_iterate(c, at, in) : jl_new(c, 0, JL_LIST);
	struct jlist *out = jl_new(c, 0, JL_GEN);
	size_t first_test = by_attr ? 1 : 0;
	struct jv attr = jv_missing(), test = jv_missing();
	if (by_attr && !arg(a, 0, NULL, &attr))
		jx_fail(c, at, JX_RUNTIME, "Missing parameter for attribute name");
	bool has_test = arg(a, first_test, NULL, &test);
	char tname[32] = "";
	if (has_test) {
		const struct jstr *t = need_str(c, at, test, "test name");
		if (t->len >= sizeof tname)
			jx_fail(c, at, JX_RUNTIME, "No test named '%.*s'.", 40, t->s);
		memcpy(tname, t->s, t->len);
		tname[t->len] = 0;
	}
	size_t n_extra = a->n > first_test + 1 ? a->n - first_test - 1 : 0;
	for (size_t i = 0; i < src->n; i++) {
		jx_step(c, at);
		struct jv v = src->v[i];
		if (by_attr)
			v = attr_path(c, at, v, need_str(c, at, attr, "attribute"));
		bool ok = has_test ? test_by_name(c, at, tname, v, a->pos + first_test + 1, n_extra) : jv_truthy(v);
		if (ok != reject)
			jl_push(c, out, src->v[i]);
	}
	return jv_list(out);
}

static struct jv apply_filter(struct jctx *c, const struct jnode *at, const char *name, struct jv in,
			      const struct args *a);

static struct jv filter_map(struct jctx *c, const struct jnode *at, struct jv in, const struct args *a)
{
	struct jlist *src = jv_truthy(in) ? jv_iterate(c, at, in) : jl_new(c, 0, JL_LIST);
	struct jlist *out = jl_new(c, src->n, JL_GEN);
	struct jv attr;
	if (arg(a, 99, "attribute", &attr)) {
		struct jv dflt;
		bool has_dflt = arg(a, 99, "default", &dflt);
		for (size_t i = 0; i < src->n; i++) {
			struct jv v = attr_path(c, at, src->v[i], need_str(c, at, attr, "attribute"));
			if (v.t == JV_UNDEF && has_dflt)
				v = dflt;
			out->v[out->n++] = v;
		}
		return jv_list(out);
	}
	struct jv fname;
	if (!arg(a, 0, NULL, &fname))
		jx_fail(c, at, JX_RUNTIME, "map requires a filter argument");
	const struct jstr *f = need_str(c, at, fname, "filter name");
	char tmp[32];
	if (f->len >= sizeof tmp)
		jx_fail(c, at, JX_RUNTIME, "No filter named '%.*s'.", 40, f->s);
	memcpy(tmp, f->s, f->len);
	tmp[f->len] = 0;
	struct args rest = { a->pos + 1, a->n - 1, a->kw_names, a->kw_vals, a->n_kw };
	for (size_t i = 0; i < src->n; i++) {
		jx_step(c, at);
		out->v[out->n++] = apply_filter(c, at, tmp, src->v[i], &rest);
	}
	return jv_list(out);
}

static struct jv filter_indent(struct jctx *c, const struct jnode *at, struct jv in, const struct args *a)
{
	const struct jstr *s = soft_str(c, in);
	struct jv w = arg_or(a, 0, "width", jv_int(4));
	bool first = jv_truthy(arg_or(a, 1, "first", jv_bool(false)));
	bool blank = jv_truthy(arg_or(a, 2, "blank", jv_bool(false)));
	const struct jstr *ind;
	if (w.t == JV_STR)
		ind = w.u.s;
	else {
		int64_t k = need_int(c, at, w, "indent width");
		if (k < 0)
			k = 0;
		if ((uint64_t)k > c->lim.string)
			jx_fail(c, at, JX_LIMIT, "indent width %lld is over the string limit", (long long)k);
		char *sp = ja_alloc(c, (size_t)k + 1);
		memset(sp, ' ', (size_t)k);
		ind = jstr_new(c, sp, (size_t)k, false);
	}
	/* s + "\n" split into lines (keepends=False) */
	struct jbuf t;
	jb_init(c, &t, s->len + 1);
	jb_put_str(c, &t, s);
	jb_putc(c, &t, '\n');
	const struct jstr *sn = jb_finish(c, &t);
	struct jlist *lines = jl_new(c, 0, JL_LIST);
	size_t st = 0;
	for (size_t i = 0; i < sn->len; i++)
		if (sn->s[i] == '\n' || sn->s[i] == '\r') {
			jl_push(c, lines, jv_str(jstr_sub(c, sn, st, i - st)));
			if (sn->s[i] == '\r' && i + 1 < sn->len && sn->s[i + 1] == '\n')
				i++;
			st = i + 1;
		}
	struct jbuf b;
	jb_init(c, &b, s->len + 16);
	if (first)
		jb_put_str(c, &b, ind);
	for (size_t i = 0; i < lines->n; i++) {
		const struct jstr *ln = lines->v[i].u.s;
		if (i) {
			jb_putc(c, &b, '\n');
			if (blank || ln->len)
				jb_put_str(c, &b, ind);
		}
		jb_put_str(c, &b, ln);
	}
	return jv_str(jb_finish(c, &b));
}

static struct jv filter_tojson(struct jctx *c, const struct jnode *at, struct jv in, const struct args *a)
{
	struct jtojson o = { 0 };
	o.ensure_ascii = jv_truthy(arg_or(a, 0, "ensure_ascii", jv_bool(false)));
	struct jv ind = arg_or(a, 1, "indent", jv_none());
	struct jv seps = arg_or(a, 2, "separators", jv_none());
	o.sort_keys = jv_truthy(arg_or(a, 3, "sort_keys", jv_bool(false)));
	if (ind.t == JV_INT) {
		int64_t k = ind.u.i < 0 ? 0 : ind.u.i;
		if (k > 64)
			jx_fail(c, at, JX_LIMIT, "tojson indent %lld is over 64", (long long)k);
		char sp[65];
		memset(sp, ' ', (size_t)k);
		o.indent = jstr_new(c, sp, (size_t)k, false);
	} else if (ind.t == JV_STR)
		o.indent = ind.u.s;
	else if (ind.t != JV_NONE)
		jx_fail(c, at, JX_TYPE, "tojson indent must be an int or a str");
	o.item_sep = jstr_cstr(c, o.indent ? "," : ", ");
	o.key_sep = jstr_cstr(c, ": ");
	if (seps.t == JV_LIST && seps.u.l->kind != JL_GEN) {
		if (seps.u.l->n != 2 || seps.u.l->v[0].t != JV_STR || seps.u.l->v[1].t != JV_STR)
			jx_fail(c, at, JX_VALUE, "separators must be a pair of strings");
		o.item_sep = seps.u.l->v[0].u.s;
		o.key_sep = seps.u.l->v[1].u.s;
	}
	struct jbuf b;
	jb_init(c, &b, 128);
	jv_tojson(c, at, &b, in, &o, 0);
	return jv_str(jb_finish(c, &b));
}

static bool parse_int_str(const struct jstr *s, int64_t base, int64_t *out)
{
	size_t i = 0, n = s->len;
	while (i < n && py_space((unsigned char)s->s[i]))
		i++;
	while (n > i && py_space((unsigned char)s->s[n - 1]))
		n--;
	bool neg = false;
	if (i < n && (s->s[i] == '+' || s->s[i] == '-'))
		neg = s->s[i++] == '-';
	if (i >= n)
		return false;
	int64_t v = 0;
	for (; i < n; i++) {
		char ch = s->s[i];
		int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'z' ? ch - 'a' + 10 :
			ch >= 'A' && ch <= 'Z' ? ch - 'A' + 10 : ch == '_' ? -2 : -1;
		if (d == -2)
			continue;
		if (d < 0 || d >= base)
			return false;
		if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v))
			return false;
	}
	*out = neg ? -v : v;
	return true;
}

static struct jv apply_filter(struct jctx *c, const struct jnode *at, const char *name, struct jv in,
			      const struct args *a)
{
#define IS(s) (!strcmp(name, s))
	struct jv v;
	if (IS("default") || IS("d")) {
		struct jv dflt = arg_or(a, 0, "default_value", jv_str(jstr_cstr(c, "")));
		bool boolean = jv_truthy(arg_or(a, 1, "boolean", jv_bool(false)));
		if (in.t == JV_UNDEF || (boolean && !jv_truthy(in)))
			return dflt;
		return in;
	}
	if (IS("safe")) {
		const struct jstr *src = soft_str(c, in);
		struct jstr *m = ja_alloc(c, sizeof *m);
		*m = *src;
		m->markup = 1;
		return jv_str(m);
	}
	if (IS("tojson"))
		return filter_tojson(c, at, in, a);
	if (IS("length") || IS("count")) {
		switch (in.t) {
		case JV_UNDEF: return jv_int(0);
		case JV_STR: return jv_int((int64_t)utf8_count(in.u.s->s, in.u.s->len));
		case JV_LIST:
			if (in.u.l->kind != JL_GEN)
				return jv_int((int64_t)in.u.l->n);
			break;
		case JV_DICT: return jv_int((int64_t)in.u.d->n);
		default: break;
		}
		jx_fail(c, at, JX_TYPE, "object of type '%s' has no len()", jv_type_name(in));
	}
	if (IS("string"))
		return jv_str(soft_str(c, in));
	if (IS("trim")) {
		struct jv ch = arg_or(a, 0, "chars", jv_none());
		return do_strip(c, soft_str(c, in), ch.t == JV_STR ? ch.u.s : NULL, true, true);
	}
	if (IS("upper")) return do_case(c, soft_str(c, in), 0);
	if (IS("lower")) return do_case(c, soft_str(c, in), 1);
	if (IS("title")) return do_case(c, soft_str(c, in), 2);
	if (IS("capitalize")) return do_case(c, soft_str(c, in), 3);
	if (IS("escape") || IS("e"))
		return in.t == JV_STR && in.u.s->markup ? in : jv_str(jstr_html_escape(c, soft_str(c, in)));
	if (IS("replace")) {
		struct jv o, n;
		if (!arg(a, 0, "old", &o) || !arg(a, 1, "new", &n))
			jx_fail(c, at, JX_TYPE, "replace filter needs old and new");
		int64_t cnt = -1;
		if (arg(a, 2, "count", &v) && v.t != JV_NONE)
			cnt = need_int(c, at, v, "count");
		return do_replace(c, at, soft_str(c, in), soft_str(c, o), soft_str(c, n), cnt);
	}
	if (IS("join")) {
		struct jv sep = arg_or(a, 0, "d", jv_str(jstr_cstr(c, "")));
		struct jlist *l = jv_iterate(c, at, in);
		if (arg(a, 1, "attribute", &v)) {
			struct jlist *m = jl_new(c, l->n, JL_LIST);
			for (size_t i = 0; i < l->n; i++)
				m->v[m->n++] = attr_path(c, at, l->v[i], soft_str(c, v));
			l = m;
		}
		return join_items(c, at, soft_str(c, sep), l, false);
	}
	if (IS("items")) {
		if (in.t == JV_UNDEF)
			return jv_list(jl_new(c, 0, JL_GEN));
		if (in.t != JV_DICT)
			jx_fail(c, at, JX_TYPE, "Can only get item pairs from a mapping.");
		return dict_items(c, in.u.d, JL_GEN);
	}
	if (IS("list")) {
		struct jlist *src = jv_iterate(c, at, in);
		struct jlist *l = jl_new(c, src->n, JL_LIST);
		memcpy(l->v, src->v, src->n * sizeof *l->v);
		l->n = src->n;
		return jv_list(l);
	}
	if (IS("first") || IS("last")) {
		struct jlist *l = jv_iterate(c, at, in);
		if (!l->n)
			return jv_undef(c, JX_UNDEFINED, "No %s item, sequence was empty.", IS("first") ? "first" : "last");
		return IS("first") ? l->v[0] : l->v[l->n - 1];
	}
	if (IS("reverse")) {
		if (in.t == JV_STR) {
			struct jlist *ch = jv_iterate(c, at, in);
			struct jbuf b;
			jb_init(c, &b, in.u.s->len);
			for (size_t i = ch->n; i-- > 0;)
				jb_put_str(c, &b, ch->v[i].u.s);
			return jv_str(jb_finish(c, &b));
		}
		struct jlist *src = jv_iterate(c, at, in);
		struct jlist *l = jl_new(c, src->n, JL_LIST);
		for (size_t i = src->n; i-- > 0;)
			l->v[l->n++] = src->v[i];
		return jv_list(l);
	}
	if (IS("selectattr")) return filter_select(c, at, in, a, true, false);
	if (IS("rejectattr")) return filter_select(c, at, in, a, true, true);
	if (IS("select")) return filter_select(c, at, in, a, false, false);
	if (IS("reject")) return filter_select(c, at, in, a, false, true);
	if (IS("map")) return filter_map(c, at, in, a);
	if (IS("indent")) return filter_indent(c, at, in, a);
	if (IS("int")) {
		struct jv dflt = arg_or(a, 0, "default", jv_int(0));
		int64_t base = need_int(c, at, arg_or(a, 1, "base", jv_int(10)), "base");
		if (base < 2 || base > 36)
			base = 10;
		if (in.t == JV_INT) return in;
		if (in.t == JV_BOOL) return jv_int(in.u.b);
		if (in.t == JV_FLOAT) {
			if (in.u.f != in.u.f || in.u.f >= 9.2e18 || in.u.f <= -9.2e18)
				return dflt;
			return jv_int((int64_t)in.u.f);
		}
		if (in.t == JV_STR) {
			int64_t r;
			if (parse_int_str(in.u.s, base, &r))
				return jv_int(r);
			char *z = jstr_z(c, in.u.s), *end;
			double d = strtod(z, &end);
			if (end != z && *end == 0 && d == d && d < 9.2e18 && d > -9.2e18)
				return jv_int((int64_t)d);
		}
		return dflt;
	}
	if (IS("float")) {
		struct jv dflt = arg_or(a, 0, "default", jv_float(0));
		if (in.t == JV_FLOAT) return in;
		if (in.t == JV_INT) return jv_float((double)in.u.i);
		if (in.t == JV_BOOL) return jv_float(in.u.b);
		if (in.t == JV_STR) {
			char *z = jstr_z(c, in.u.s), *end;
			double d = strtod(z, &end);
			if (end != z && *end == 0)
				return jv_float(d);
		}
		return dflt;
	}
	if (IS("abs")) {
		if (in.t == JV_INT) {
			if (in.u.i == INT64_MIN)
				jx_fail(c, at, JX_LIMIT, "integer overflow in abs");
			return jv_int(in.u.i < 0 ? -in.u.i : in.u.i);
		}
		if (in.t == JV_FLOAT) return jv_float(in.u.f < 0 ? -in.u.f : in.u.f);
		jx_fail(c, at, JX_TYPE, "bad operand type for abs(): '%s'", jv_type_name(in));
	}
	if (IS("round")) {
		int64_t prec = need_int(c, at, arg_or(a, 0, "precision", jv_int(0)), "precision");
		double x = in.t == JV_FLOAT ? in.u.f : in.t == JV_INT ? (double)in.u.i : 0;
		double p = 1;
		for (int64_t i = 0; i < prec && i < 20; i++)
			p *= 10;
		struct jv m = arg_or(a, 1, "method", jv_missing());
		double r = x * p;
		if (jv_is_str(m, "floor"))
			r = __builtin_floor(r);
		else if (jv_is_str(m, "ceil"))
			r = __builtin_ceil(r);
		else
			r = __builtin_round(r);
		return jv_float(r / p);
	}
	if (IS("sum")) {
		struct jlist *l = jv_iterate(c, at, in);
		struct jv acc = arg_or(a, 1, "start", jv_int(0));
		struct jv attr;
		bool by = arg(a, 0, "attribute", &attr);
		for (size_t i = 0; i < l->n; i++) {
			struct jv x = by ? attr_path(c, at, l->v[i], soft_str(c, attr)) : l->v[i];
			if (acc.t == JV_INT && x.t == JV_INT) {
				if (__builtin_add_overflow(acc.u.i, x.u.i, &acc.u.i))
					jx_fail(c, at, JX_LIMIT, "integer overflow in sum");
			} else if ((acc.t == JV_INT || acc.t == JV_FLOAT) && (x.t == JV_INT || x.t == JV_FLOAT))
				acc = jv_float((acc.t == JV_INT ? (double)acc.u.i : acc.u.f) +
					       (x.t == JV_INT ? (double)x.u.i : x.u.f));
			else
				jx_fail(c, at, JX_TYPE, "unsupported operand type(s) for +: '%s' and '%s'",
					jv_type_name(acc), jv_type_name(x));
		}
		return acc;
	}
	if (IS("unique") || IS("sort") || IS("dictsort") || IS("min") || IS("max")) {
		bool dictsort = IS("dictsort");
		bool cs = jv_truthy(arg_or(a, dictsort ? 0 : IS("sort") ? 1 : 0, "case_sensitive", jv_bool(false)));
		bool reverse = jv_truthy(arg_or(a, dictsort ? 2 : 0, "reverse", jv_bool(false))) && !IS("unique") &&
			       !IS("min") && !IS("max");
		struct jv attr;
		bool by_attr = !dictsort && arg(a, IS("sort") ? 2 : IS("unique") ? 1 : 1, "attribute", &attr);
		struct jlist *src;
		bool by_value = false;
		if (dictsort) {
			if (in.t != JV_DICT)
				jx_fail(c, at, JX_RUNTIME, "You can only sort by either \"key\" or \"value\"");
			src = dict_items(c, in.u.d, JL_LIST).u.l;
			by_value = jv_is_str(arg_or(a, 1, "by", jv_missing()), "value");
		} else
			src = jv_iterate(c, at, in);
		struct sort_item *it = ja_alloc(c, jmul(c, at, src->n + 1, sizeof *it));
		for (size_t i = 0; i < src->n; i++) {
			struct jv k = src->v[i];
			if (dictsort)
				k = k.u.l->v[by_value ? 1 : 0];
			else if (by_attr)
				k = attr_path(c, at, k, soft_str(c, attr));
			it[i].key = sort_key(c, k, cs);
			it[i].val = src->v[i];
		}
		if (IS("unique")) {
			struct jlist *out = jl_new(c, 0, JL_GEN);
			for (size_t i = 0; i < src->n; i++) {
				bool seen = false;
				for (size_t j = 0; j < i && !seen; j++)
					seen = jv_equal(it[j].key, it[i].key);
				if (!seen)
					jl_push(c, out, it[i].val);
				jx_step(c, at);
			}
			return jv_list(out);
		}
		stable_sort(c, at, it, src->n, reverse);
		if (IS("min") || IS("max")) {
			if (!src->n)
				return jv_undef(c, JX_UNDEFINED, "No aggregated item, sequence was empty.");
			return IS("min") ? it[0].val : it[src->n - 1].val;
		}
		struct jlist *out = jl_new(c, src->n, JL_LIST);
		for (size_t i = 0; i < src->n; i++)
			out->v[out->n++] = it[i].val;
		return jv_list(out);
	}
	if (IS("attr")) {
		if (!arg(a, 0, "name", &v))
			jx_fail(c, at, JX_TYPE, "attr filter needs a name");
		return jinja_getattr(c, at, in, soft_str(c, v));
	}
	if (IS("wordcount")) {
		struct jv parts = do_split(c, at, soft_str(c, in), jv_none(), -1, false);
		return jv_int((int64_t)parts.u.l->n);
	}
	if (IS("center")) {
		const struct jstr *s = soft_str(c, in);
		int64_t w = need_int(c, at, arg_or(a, 0, "width", jv_int(80)), "width");
		int64_t n = (int64_t)utf8_count(s->s, s->len);
		if (w <= n)
			return jv_str(s);
		if ((uint64_t)w > c->lim.string)
			jx_fail(c, at, JX_LIMIT, "center width %lld is over the string limit", (long long)w);
		int64_t pad = w - n, left = pad / 2 + (pad & w & 1);
		struct jbuf b;
		jb_init(c, &b, (size_t)w + s->len);
		for (int64_t i = 0; i < left; i++)
			jb_putc(c, &b, ' ');
		jb_put_str(c, &b, s);
		for (int64_t i = 0; i < pad - left; i++)
			jb_putc(c, &b, ' ');
		return jv_str(jb_finish(c, &b));
	}
	jx_fail(c, at, JX_RUNTIME, "No filter named '%s'.", name);
#undef IS
}

struct jv jinja_filter(struct jctx *c, const struct jnode *at, const struct jstr *name, struct jv in,
		       struct jv *pos, size_t n, const struct jstr **kw_names, struct jv *kw_vals, size_t n_kw)
{
	char tmp[32];
	if (name->len >= sizeof tmp)
		jx_fail(c, at, JX_RUNTIME, "No filter named '%.*s'.", 40, name->s);
	memcpy(tmp, name->s, name->len);
	tmp[name->len] = 0;
	struct args a = { pos, n, kw_names, kw_vals, n_kw };
	return apply_filter(c, at, tmp, in, &a);
}
