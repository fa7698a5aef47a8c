/* Evaluator of the Jinja subset: walks the syntax tree with jinja2's scoping (a for loop's
 * body is a fresh scope each iteration, macros see the scope they were defined in, if
 * blocks share their parent's), Python's operators, and the render limits (steps, nesting,
 * macro depth, string size) checked as it goes. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "daemon/engine/jinja.h"

/* Expression, statement and macro nesting share one bound, so the deepest render stays
 * within 256 KiB of stack (measured at -O2: ~220 bytes a level) on any thread. */
#define EVAL_MAX_NEST 1000

void jx_step(struct jctx *c, const struct jnode *at)
{
	/* errors raised without a node (memory, string size) name the last place stepped */
	c->line = at->line;
	c->col = at->col;
	if (++c->steps > c->lim.steps)
		jx_fail(c, at, JX_LIMIT, "the render took more than %llu steps (limit)",
			(unsigned long long)c->lim.steps);
}

struct jframe *jf_new(struct jctx *c, struct jframe *parent)
{
	struct jframe *f = ja_alloc(c, sizeof *f);
	memset(f, 0, sizeof *f);
	f->parent = parent;
	return f;
}

void jf_set(struct jctx *c, struct jframe *f, const struct jstr *name, struct jv v)
{
	for (size_t i = 0; i < f->n; i++)
		if (jstr_eq(f->names[i], name)) {
			f->vals[i] = v;
			return;
		}
	if (f->n == f->cap) {
		size_t cap = f->cap ? f->cap * 2 : 4;
		f->names = ja_grow(c, f->names, f->n * sizeof *f->names, cap * sizeof *f->names);
		f->vals = ja_grow(c, f->vals, f->n * sizeof *f->vals, cap * sizeof *f->vals);
		f->cap = cap;
	}
	f->names[f->n] = name;
	f->vals[f->n++] = v;
}

static const struct jv *jf_lookup(const struct jframe *f, const struct jstr *name)
{
	for (; f; f = f->parent)
		for (size_t i = f->n; i-- > 0;)
			if (jstr_eq(f->names[i], name))
				return &f->vals[i];
	return NULL;
}

static struct jv eval(struct jctx *c, struct jframe *f, const struct jnode *n);
static void exec(struct jctx *c, struct jframe *f, const struct jnode *n);

static void need_defined(struct jctx *c, const struct jnode *at, struct jv v)
{
	if (v.t == JV_UNDEF)
		jx_raise_undef(c, at, v.u.u);
}

/* ---- operators */

static struct jv op_add(struct jctx *c, const struct jnode *at, struct jv a, struct jv b)
{
	need_defined(c, at, a);
	need_defined(c, at, b);
	if ((a.t == JV_INT || a.t == JV_BOOL) && (b.t == JV_INT || b.t == JV_BOOL)) {
		int64_t x = a.t == JV_INT ? a.u.i : a.u.b, y = b.t == JV_INT ? b.u.i : b.u.b, r;
		if (__builtin_add_overflow(x, y, &r))
			jx_fail(c, at, JX_LIMIT, "integer overflow in +");
		return jv_int(r);
	}
	if ((a.t == JV_INT || a.t == JV_FLOAT || a.t == JV_BOOL) &&
	    (b.t == JV_INT || b.t == JV_FLOAT || b.t == JV_BOOL)) {
		double x = a.t == JV_FLOAT ? a.u.f : a.t == JV_INT ? (double)a.u.i : a.u.b;
		double y = b.t == JV_FLOAT ? b.u.f : b.t == JV_INT ? (double)b.u.i : b.u.b;
		return jv_float(x + y);
	}
	if (a.t == JV_STR && b.t == JV_STR) {
		bool markup = a.u.s->markup || b.u.s->markup;
		const struct jstr *x = a.u.s, *y = b.u.s;
		if (markup && !x->markup)
			x = jstr_html_escape(c, x);
		if (markup && !y->markup)
			y = jstr_html_escape(c, y);
		a.u.s = x;
		b.u.s = y;
		struct jbuf buf;
		jb_init(c, &buf, a.u.s->len + b.u.s->len);
		jb_put_str(c, &buf, a.u.s);
		jb_put_str(c, &buf, b.u.s);
		struct jstr *r = (struct jstr *)jb_finish(c, &buf);
		r->markup = markup;
		return jv_str(r);
	}
	if (a.t == JV_LIST && b.t == JV_LIST && a.u.l->kind == b.u.l->kind && a.u.l->kind != JL_GEN) {
		struct jlist *l = jl_new(c, a.u.l->n + b.u.l->n, a.u.l->kind);
		memcpy(l->v, a.u.l->v, a.u.l->n * sizeof *l->v);
		memcpy(l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof *l->v);
		l->n = a.u.l->n + b.u.l->n;
		return jv_list(l);
	}
	if (a.t == JV_STR || (a.t == JV_LIST && a.u.l->kind != JL_GEN))
		jx_fail(c, at, JX_TYPE, "can only concatenate %s (not \"%s\") to %s", jv_type_name(a),
			jv_type_name(b), jv_type_name(a));
	jx_fail(c, at, JX_TYPE, "unsupported operand type(s) for +: '%s' and '%s'", jv_type_name(a),
		jv_type_name(b));
}

static bool numeric(struct jv v)
{
	return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
}

static double dbl(struct jv v)
{
	return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : (double)v.u.b;
}

static int64_t ival(struct jv v)
{
	return v.t == JV_INT ? v.u.i : (int64_t)v.u.b;
}

static const char *op_sym(int op)
{
	static const char *const s[] = { "+", "-", "*", "/", "//", "%", "**", "~" };
	return s[op];
}

static struct jv repeat(struct jctx *c, const struct jnode *at, struct jv seq, int64_t k)
{
	if (k < 0)
		k = 0;
	/* An empty operand repeats to nothing however large k is: answer at once rather than loop k times. */
	if (k == 0 || (seq.t == JV_STR ? seq.u.s->len == 0 : seq.u.l->n == 0))
		k = 0;
	if (seq.t == JV_STR) {
		size_t total = jmul(c, at, seq.u.s->len, (size_t)k);
		if (total > c->lim.string)
			jx_fail(c, at, JX_LIMIT, "string repetition would make %zu bytes, over the limit of %zu",
				total, c->lim.string);
		struct jbuf b;
		jb_init(c, &b, total);
		for (int64_t i = 0; i < k; i++)
			jb_put_str(c, &b, seq.u.s);
		return jv_str(jb_finish(c, &b));
	}
	size_t total = jmul(c, at, seq.u.l->n, (size_t)k);
	if (total > c->lim.range)
		jx_fail(c, at, JX_LIMIT, "list repetition would make %zu items, over the limit of %zu", total,
			c->lim.range);
	struct jlist *l = jl_new(c, total, seq.u.l->kind);
	for (int64_t i = 0; i < k; i++)
		for (size_t j = 0; j < seq.u.l->n; j++)
			l->v[l->n++] = seq.u.l->v[j];
	return jv_list(l);
}

/* Python's printf-style str % args for %s, %d, %i, %r, %f, %% (what templates use). */
static struct jv str_format(struct jctx *c, const struct jnode *at, const struct jstr *fmt, struct jv args)
{
	struct jbuf b;
	jb_init(c, &b, fmt->len + 16);
	size_t ai = 0, run = 0;
	const struct jlist *al = args.t == JV_LIST && args.u.l->kind == JL_TUPLE ? args.u.l : NULL;
	for (size_t i = 0; i < fmt->len; i++) {
		if (fmt->s[i] != '%')
			continue;
		jb_put_range(c, &b, fmt, run, i - run);
		if (i + 1 >= fmt->len)
			jx_fail(c, at, JX_VALUE, "incomplete format");
		char k = fmt->s[++i];
		run = i + 1;
		if (k == '%') {
			jb_putc(c, &b, '%');
			continue;
		}
		struct jv v;
		if (al) {
			if (ai >= al->n)
				jx_fail(c, at, JX_TYPE, "not enough arguments for format string");
			v = al->v[ai++];
		} else {
			if (ai++)
				jx_fail(c, at, JX_TYPE, "not enough arguments for format string");
			v = args;
		}
		if (k == 's')
			jv_str_into(c, &b, v);
		else if (k == 'r')
			jv_repr_into(c, &b, v);
		else if ((k == 'd' || k == 'i') && numeric(v))
			jb_printf(c, &b, "%lld", (long long)(v.t == JV_FLOAT ? (int64_t)v.u.f : ival(v)));
		else if (k == 'f' && numeric(v))
			jb_printf(c, &b, "%f", dbl(v));
		else
			jx_fail(c, at, JX_TYPE, "unsupported format character '%c' or argument type", k);
	}
	jb_put_range(c, &b, fmt, run, fmt->len - run);
	if (al ? ai < al->n : ai == 0)
		jx_fail(c, at, JX_TYPE, "not all arguments converted during string formatting");
	return jv_str(jb_finish(c, &b));
}

static struct jv op_arith(struct jctx *c, const struct jnode *at, int op, struct jv a, struct jv b)
{
	need_defined(c, at, a);
	need_defined(c, at, b);
	if (op == OP_MUL) {
		if ((a.t == JV_STR || (a.t == JV_LIST && a.u.l->kind != JL_GEN)) && (b.t == JV_INT || b.t == JV_BOOL))
			return repeat(c, at, a, ival(b));
		if ((b.t == JV_STR || (b.t == JV_LIST && b.u.l->kind != JL_GEN)) && (a.t == JV_INT || a.t == JV_BOOL))
			return repeat(c, at, b, ival(a));
	}
	if (op == OP_MOD && a.t == JV_STR)
		return str_format(c, at, a.u.s, b);
	if (!numeric(a) || !numeric(b))
		jx_fail(c, at, JX_TYPE, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op),
			jv_type_name(a), jv_type_name(b));
	bool ints = a.t != JV_FLOAT && b.t != JV_FLOAT;
	if ((op == OP_DIV || op == OP_FLOORDIV || op == OP_MOD) && dbl(b) == 0)
		jx_fail(c, at, JX_RUNTIME, "ZeroDivisionError: %s",
			op == OP_MOD ? (ints ? "integer modulo by zero" : "float modulo") :
			op == OP_DIV ? "division by zero" : (ints ? "integer division or modulo by zero" :
								"float floor division by zero"));
	if (ints && op != OP_DIV) {
		int64_t x = ival(a), y = ival(b), r;
		switch (op) {
		case OP_SUB:
			if (__builtin_sub_overflow(x, y, &r))
				jx_fail(c, at, JX_LIMIT, "integer overflow in -");
			return jv_int(r);
		case OP_MUL:
			if (__builtin_mul_overflow(x, y, &r))
				jx_fail(c, at, JX_LIMIT, "integer overflow in *");
			return jv_int(r);
		case OP_FLOORDIV:
			if (x == INT64_MIN && y == -1)
				jx_fail(c, at, JX_LIMIT, "integer overflow in //");
			r = x / y;
			if ((x % y != 0) && ((x < 0) != (y < 0)))
				r--;
			return jv_int(r);
		case OP_MOD:
			if (y == -1)
				return jv_int(0);
			r = x % y;
			if (r != 0 && ((r < 0) != (y < 0)))
				r += y;
			return jv_int(r);
		case OP_POW:
			if (y >= 0) {
				int64_t acc = 1;
				for (int64_t k = 0; k < y; k++) {
					if (__builtin_mul_overflow(acc, x, &acc))
						jx_fail(c, at, JX_LIMIT, "integer overflow in **");
					if (acc == 0 || acc == 1)
						break;
					if (acc == -1 && k + 1 < y) {
						acc = ((y - k - 1) % 2) ? 1 : -1;
						break;
					}
				}
				return jv_int(acc);
			}
			return jv_float(pow((double)x, (double)y));
		}
	}
	double x = dbl(a), y = dbl(b);
	switch (op) {
	case OP_SUB: return jv_float(x - y);
	case OP_MUL: return jv_float(x * y);
	case OP_DIV: return jv_float(x / y);
	case OP_FLOORDIV: return jv_float(floor(x / y));
	case OP_MOD: {
		double r = fmod(x, y);
		if (r != 0 && ((r < 0) != (y < 0)))
			r += y;
		return jv_float(r);
	}
	default: return jv_float(pow(x, y));
	}
}

static bool op_in(struct jctx *c, const struct jnode *at, struct jv item, struct jv seq)
{
	switch (seq.t) {
	case JV_STR:
		if (item.t != JV_STR)
			jx_fail(c, at, JX_TYPE, "'in <string>' requires string as left operand, not %s",
				jv_type_name(item));
		return item.u.s->len == 0 || memmem(seq.u.s->s, seq.u.s->len, item.u.s->s, item.u.s->len);
	case JV_LIST:
		for (size_t i = 0; i < seq.u.l->n; i++)
			if (jv_equal(seq.u.l->v[i], item))
				return true;
		return false;
	case JV_DICT:
		return jd_get(seq.u.d, item) != NULL;
	case JV_UNDEF:
		return false;
	default:
		jx_fail(c, at, JX_TYPE, "argument of type '%s' is not iterable", jv_type_name(seq));
	}
}

/* ---- subscripts */

struct jv jinja_getitem(struct jctx *c, const struct jnode *at, struct jv obj, struct jv key)
{
	need_defined(c, at, obj);
	if (obj.t == JV_DICT) {
		const struct jv *v = jd_get(obj.u.d, key);
		if (v)
			return *v;
	} else if ((obj.t == JV_LIST && obj.u.l->kind != JL_GEN) || obj.t == JV_STR) {
		if (key.t == JV_INT || key.t == JV_BOOL) {
			int64_t i = ival(key);
			if (obj.t == JV_LIST) {
				int64_t n = (int64_t)obj.u.l->n;
				if (i < 0)
					i += n;
				if (i >= 0 && i < n)
					return obj.u.l->v[i];
			} else {
				const struct jstr *s = obj.u.s;
				int64_t n = (int64_t)utf8_count(s->s, s->len);
				if (i < 0)
					i += n;
				if (i >= 0 && i < n) {
					size_t o = utf8_offset(s->s, s->len, (size_t)i);
					size_t e = utf8_offset(s->s, s->len, (size_t)i + 1);
					return jv_str(jstr_sub(c, s, o, e - o));
				}
			}
		}
	}
	if (key.t == JV_STR) {
		struct jv v = jinja_getattr(c, at, obj, key.u.s);
		if (v.t != JV_UNDEF || obj.t != JV_DICT)
			return v;
	}
	struct jbuf b;
	jb_init(c, &b, 32);
	jv_repr_into(c, &b, key);
	const struct jstr *k = jb_finish(c, &b);
	if (key.t == JV_STR)
		return jv_undef(c, JX_UNDEFINED, "'%s object' has no attribute %.*s", jv_type_name(obj),
				(int)(k->len > 200 ? 200 : k->len), k->s);
	return jv_undef(c, JX_UNDEFINED, "%s object has no element %.*s", jv_type_name(obj),
			(int)(k->len > 200 ? 200 : k->len), k->s);
}

static int64_t clamp_index(int64_t i, int64_t n, bool neg_step)
{
	if (i < 0) {
		i += n;
		if (i < 0)
			i = neg_step ? -1 : 0;
	} else if (i >= n)
		i = neg_step ? n - 1 : n;
	return i;
}

static struct jv get_slice(struct jctx *c, const struct jnode *at, struct jv obj, struct jv start,
			   struct jv stop, struct jv step)
{
	need_defined(c, at, obj);
	int64_t st = 1;
	if (step.t != JV_NONE && step.t != JV_UNDEF) {
		if (step.t != JV_INT)
			jx_fail(c, at, JX_TYPE, "slice indices must be integers or None");
		st = step.u.i;
		if (st == 0)
			jx_fail(c, at, JX_VALUE, "slice step cannot be zero");
	}
	bool is_str = obj.t == JV_STR;
	if (!is_str && !(obj.t == JV_LIST && obj.u.l->kind != JL_GEN))
		jx_fail(c, at, JX_TYPE, "'%s' object is not subscriptable", jv_type_name(obj));
	const struct jstr *s = is_str ? obj.u.s : NULL;
	int64_t n = is_str ? (int64_t)utf8_count(s->s, s->len) : (int64_t)obj.u.l->n;
	int64_t lo, hi;
	if (start.t == JV_NONE || start.t == JV_UNDEF)
		lo = st > 0 ? 0 : n - 1;
	else if (start.t == JV_INT)
		lo = clamp_index(start.u.i, n, st < 0);
	else
		jx_fail(c, at, JX_TYPE, "slice indices must be integers or None");
	if (stop.t == JV_NONE || stop.t == JV_UNDEF)
		hi = st > 0 ? n : -1;
	else if (stop.t == JV_INT)
		hi = clamp_index(stop.u.i, n, st < 0);
	else
		jx_fail(c, at, JX_TYPE, "slice indices must be integers or None");
	if (is_str && st == 1) {
		if (hi <= lo)
			return jv_str(jstr_sub(c, s, 0, 0));
		size_t o = utf8_offset(s->s, s->len, (size_t)lo), e = utf8_offset(s->s, s->len, (size_t)hi);
		return jv_str(jstr_sub(c, s, o, e - o));
	}
	struct jlist *chars = is_str ? jv_iterate(c, at, obj) : obj.u.l;
	struct jlist *l = jl_new(c, 0, is_str ? JL_LIST : obj.u.l->kind);
	for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st)
		jl_push(c, l, chars->v[i]);
	if (!is_str)
		return jv_list(l);
	struct jbuf b;
	jb_init(c, &b, s->len);
	for (size_t i = 0; i < l->n; i++)
		jb_put_str(c, &b, l->v[i].u.s);
	return jv_str(jb_finish(c, &b));
}

/* ---- calls */

static void capture_begin(struct jctx *c, struct jbuf *save, struct jbuf **prev)
{
	*prev = c->out;
	jb_init(c, save, 256);
	c->out = save;
}

static struct jv call_macro(struct jctx *c, const struct jnode *at, struct jmacro *m, struct jv *args,
			    size_t n, const struct jstr **kw_names, struct jv *kw_vals, size_t n_kw)
{
	const struct jnode *def = m->def;
	if (++c->depth > c->lim.depth)
		jx_fail(c, at, JX_LIMIT, "macro calls nest deeper than %u (limit)", c->lim.depth);
	struct jframe *f = jf_new(c, m->scope);
	struct jlist *varargs = jl_new(c, 0, JL_TUPLE);
	struct jdict *kwargs = jd_new(c, 0);
	for (size_t i = 0; i < n; i++) {
		if (i < def->n_kw)
			jf_set(c, f, def->kw_names[i], args[i]);
		else
			jl_push(c, varargs, args[i]);
	}
	for (size_t k = 0; k < n_kw; k++) {
		size_t i;
		for (i = 0; i < def->n_kw; i++)
			if (jstr_eq(def->kw_names[i], kw_names[k]))
				break;
		if (i == def->n_kw) {
			jd_set(c, kwargs, jv_str(kw_names[k]), kw_vals[k]);
			continue;
		}
		if (i < n)
			jx_fail(c, at, JX_TYPE, "macro '%.*s' got multiple values for argument '%.*s'",
				(int)def->name->len, def->name->s, (int)kw_names[k]->len, kw_names[k]->s);
		jf_set(c, f, def->kw_names[i], kw_vals[k]);
	}
	for (size_t i = n; i < def->n_kw; i++) {
		bool given = false;
		for (size_t k = 0; k < n_kw; k++)
			if (jstr_eq(def->kw_names[i], kw_names[k]))
				given = true;
		if (given)
			continue;
		if (def->kw_vals[i])
			jf_set(c, f, def->kw_names[i], eval(c, f, def->kw_vals[i]));
		else
			jf_set(c, f, def->kw_names[i],
			       jv_undef(c, JX_UNDEFINED, "parameter '%.*s' was not provided",
					(int)def->kw_names[i]->len, def->kw_names[i]->s));
	}
	static const struct jstr s_varargs = { 7, "varargs", NULL, 0, 0 }, s_kwargs = { 6, "kwargs", NULL, 0, 0 };
	jf_set(c, f, &s_varargs, jv_list(varargs));
	jf_set(c, f, &s_kwargs, jv_dict(kwargs));
	struct jbuf buf, *prev;
	capture_begin(c, &buf, &prev);
	int ctl = c->loop_ctl;
	exec(c, f, def->c);
	c->loop_ctl = ctl;
	c->out = prev;
	c->depth--;
	return jv_str(jb_finish(c, &buf));
}

struct jv jinja_call(struct jctx *c, const struct jnode *at, struct jv fn, struct jv *args, size_t n,
		     const struct jstr **kw_names, struct jv *kw_vals, size_t n_kw)
{
	switch (fn.t) {
	case JV_UNDEF: jx_raise_undef(c, at, fn.u.u);
	case JV_MACRO: return call_macro(c, at, fn.u.m, args, n, kw_names, kw_vals, n_kw);
	case JV_FUNC:
	case JV_METHOD: return jinja_call_builtin(c, at, fn, args, n, kw_names, kw_vals, n_kw);
	default: jx_fail(c, at, JX_TYPE, "'%s' object is not callable", jv_type_name(fn));
	}
}

static void eval_args(struct jctx *c, struct jframe *f, const struct jnode *n, struct jv **args,
		      struct jv **kw)
{
	*args = n->n_kids ? ja_alloc(c, n->n_kids * sizeof **args) : NULL;
	*kw = n->n_kw ? ja_alloc(c, n->n_kw * sizeof **kw) : NULL;
	for (size_t i = 0; i < n->n_kids; i++)
		(*args)[i] = eval(c, f, n->kids[i]);
	for (size_t i = 0; i < n->n_kw; i++)
		(*kw)[i] = eval(c, f, n->kw_vals[i]);
}

/* ---- expressions */

static struct jv eval_inner(struct jctx *c, struct jframe *f, const struct jnode *n)
{
	struct jv a, b, *args, *kw;
	switch (n->kind) {
	case E_CONST:
		return n->cval;
	case E_NAME: {
		const struct jv *v = jf_lookup(f, n->name);
		if (v)
			return *v;
		a = jinja_global(c, n->name);
		if (a.t != JV_UNDEF)
			return a;
		return jv_undef(c, JX_UNDEFINED, "'%.*s' is undefined", (int)n->name->len, n->name->s);
	}
	case E_ATTR:
		a = eval(c, f, n->a);
		need_defined(c, n, a);
		return jinja_getattr(c, n, a, n->name);
	case E_ITEM:
		a = eval(c, f, n->a);
		return jinja_getitem(c, n, a, eval(c, f, n->b));
	case E_SLICE: {
		a = eval(c, f, n->a);
		struct jv lo = n->b ? eval(c, f, n->b) : jv_none();
		struct jv hi = n->c ? eval(c, f, n->c) : jv_none();
		struct jv st = n->d ? eval(c, f, n->d) : jv_none();
		return get_slice(c, n, a, lo, hi, st);
	}
	case E_CALL:
		a = eval(c, f, n->a);
		eval_args(c, f, n, &args, &kw);
		return jinja_call(c, n, a, args, n->n_kids, n->kw_names, kw, n->n_kw);
	case E_FILTER:
		a = eval(c, f, n->a);
		eval_args(c, f, n, &args, &kw);
		return jinja_filter(c, n, n->name, a, args, n->n_kids, n->kw_names, kw, n->n_kw);
	case E_TEST: {
		a = eval(c, f, n->a);
		eval_args(c, f, n, &args, &kw);
		bool r = jinja_test(c, n, n->name, a, args, n->n_kids);
		return jv_bool(r != n->neg);
	}
	case E_BIN:
		a = eval(c, f, n->a);
		b = eval(c, f, n->b);
		if (n->op == OP_CONCAT) {
			struct jbuf buf;
			jb_init(c, &buf, 64);
			jv_str_into(c, &buf, a);
			jv_str_into(c, &buf, b);
			return jv_str(jb_finish(c, &buf));
		}
		if (n->op == OP_ADD)
			return op_add(c, n, a, b);
		return op_arith(c, n, n->op, a, b);
	case E_CMP:
		a = eval(c, f, n->a);
		b = eval(c, f, n->b);
		switch (n->op) {
		case CMP_EQ: return jv_bool(jv_equal(a, b));
		case CMP_NE: return jv_bool(!jv_equal(a, b));
		case CMP_LT: return jv_bool(jv_compare(c, n, a, b, "<") < 0);
		case CMP_LE: return jv_bool(jv_compare(c, n, a, b, "<=") <= 0);
		case CMP_GT: return jv_bool(jv_compare(c, n, a, b, ">") > 0);
		case CMP_GE: return jv_bool(jv_compare(c, n, a, b, ">=") >= 0);
		case CMP_IN: return jv_bool(op_in(c, n, a, b));
		default: return jv_bool(!op_in(c, n, a, b));
		}
	case E_AND:
		a = eval(c, f, n->a);
		return jv_truthy(a) ? eval(c, f, n->b) : a;
	case E_OR:
		a = eval(c, f, n->a);
		return jv_truthy(a) ? a : eval(c, f, n->b);
	case E_NOT:
		return jv_bool(!jv_truthy(eval(c, f, n->a)));
	case E_NEG:
	case E_POS:
		a = eval(c, f, n->a);
		need_defined(c, n, a);
		if (a.t == JV_FLOAT)
			return jv_float(n->kind == E_NEG ? -a.u.f : a.u.f);
		if (a.t == JV_INT || a.t == JV_BOOL) {
			int64_t i = ival(a);
			if (n->kind == E_NEG && i == INT64_MIN)
				jx_fail(c, n, JX_LIMIT, "integer overflow in unary -");
			return jv_int(n->kind == E_NEG ? -i : i);
		}
		jx_fail(c, n, JX_TYPE, "bad operand type for unary %c: '%s'", n->kind == E_NEG ? '-' : '+',
			jv_type_name(a));
	case E_COND:
		if (jv_truthy(eval(c, f, n->a)))
			return eval(c, f, n->b);
		if (n->c)
			return eval(c, f, n->c);
		return jv_undef(c, JX_UNDEFINED,
				"the inline if-expression on line %u evaluated to false and no else section was defined.",
				n->line);
	case E_LIST:
	case E_TUPLE: {
		struct jlist *l = jl_new(c, n->n_kids, n->kind == E_LIST ? JL_LIST : JL_TUPLE);
		for (size_t i = 0; i < n->n_kids; i++)
			l->v[l->n++] = eval(c, f, n->kids[i]);
		return jv_list(l);
	}
	case E_DICT: {
		struct jdict *d = jd_new(c, n->n_kids / 2);
		for (size_t i = 0; i + 1 < n->n_kids; i += 2) {
			struct jv k = eval(c, f, n->kids[i]);
			if (k.t == JV_LIST && k.u.l->kind != JL_TUPLE)
				jx_fail(c, n, JX_TYPE, "unhashable type: 'list'");
			if (k.t == JV_DICT)
				jx_fail(c, n, JX_TYPE, "unhashable type: 'dict'");
			jd_set(c, d, k, eval(c, f, n->kids[i + 1]));
		}
		return jv_dict(d);
	}
	case E_CAPTURED:
		return jv_str(c->captured);
	default:
		jx_fail(c, n, JX_RUNTIME, "internal: node %d is not an expression", n->kind);
	}
}

static struct jv eval(struct jctx *c, struct jframe *f, const struct jnode *n)
{
	jx_step(c, n);
	if (++c->nest > EVAL_MAX_NEST)
		jx_fail(c, n, JX_LIMIT, "statements and expressions nest deeper than %d (limit)", EVAL_MAX_NEST);
	struct jv v = eval_inner(c, f, n);
	c->nest--;
	return v;
}

/* ---- statements */

static void assign(struct jctx *c, struct jframe *f, const struct jnode *target, struct jv v)
{
	if (target->kind == E_NAME) {
		jf_set(c, f, target->name, v);
		return;
	}
	if (target->kind == E_ATTR) {
		struct jv ns = eval(c, f, target->a);
		if (ns.t != JV_NS)
			jx_fail(c, target, JX_RUNTIME, "cannot assign attribute on non-namespace object");
		jd_set(c, ns.u.d, jv_str(target->name), v);
		return;
	}
	/* tuple unpacking */
	struct jlist *items = jv_iterate(c, target, v);
	if (items->n != target->n_kids)
		jx_fail(c, target, JX_VALUE, items->n > target->n_kids ? "too many values to unpack (expected %zu)" :
			"not enough values to unpack (expected %zu, got %zu)", target->n_kids, items->n);
	for (size_t i = 0; i < target->n_kids; i++)
		assign(c, f, target->kids[i], items->v[i]);
}

static void exec_for(struct jctx *c, struct jframe *f, const struct jnode *n)
{
	struct jlist *src = jv_iterate(c, n->b, eval(c, f, n->b));
	struct jlist *items = src;
	if (n->e) {
		items = jl_new(c, 0, JL_LIST);
		for (size_t i = 0; i < src->n; i++) {
			struct jframe *g = jf_new(c, f);
			assign(c, g, n->a, src->v[i]);
			if (jv_truthy(eval(c, g, n->e)))
				jl_push(c, items, src->v[i]);
		}
	}
	if (!items->n) {
		if (n->d)
			exec(c, f, n->d);
		return;
	}
	struct jloop *lp = ja_alloc(c, sizeof *lp);
	lp->items = items;
	static const struct jstr s_loop = { 4, "loop", NULL, 0, 0 };
	const struct jv *outer = jf_lookup(f, &s_loop);
	lp->depth = outer && outer->t == JV_LOOP ? outer->u.lp->depth + 1 : 1;
	/* One scope and one loop object serve every iteration (reset, not reallocated), so a
	 * long loop costs no memory per pass. */
	struct jframe *g = jf_new(c, f);
	for (size_t i = 0; i < items->n; i++) {
		jx_step(c, n);
		lp->i = i;
		g->n = 0;
		jf_set(c, g, &s_loop, (struct jv){ .t = JV_LOOP, .u.lp = lp });
		assign(c, g, n->a, items->v[i]);
		exec(c, g, n->c);
		if (c->loop_ctl == 1) {
			c->loop_ctl = 0;
			break;
		}
		c->loop_ctl = 0;
	}
}

static void exec_inner(struct jctx *c, struct jframe *f, const struct jnode *n)
{
	switch (n->kind) {
	case N_BODY:
		for (size_t i = 0; i < n->n_kids && !c->loop_ctl; i++)
			exec(c, f, n->kids[i]);
		return;
	case N_TEXT:
		jb_put_str(c, c->out, n->name);
		break;
	case N_OUT:
		jv_str_into(c, c->out, eval(c, f, n->a));
		break;
	case N_IF:
		if (jv_truthy(eval(c, f, n->a)))
			exec(c, f, n->b);
		else if (n->c)
			exec(c, f, n->c);
		return;
	case N_FOR:
		exec_for(c, f, n);
		return;
	case N_SET:
		assign(c, f, n->a, eval(c, f, n->b));
		return;
	case N_SETBLOCK:
	case N_FILTERBLOCK: {
		struct jbuf buf, *prev;
		capture_begin(c, &buf, &prev);
		exec(c, f, n->c);
		c->out = prev;
		struct jv v = jv_str(jb_finish(c, &buf));
		if (n->b) {
			const struct jstr *saved = c->captured;
			c->captured = v.u.s;
			v = eval(c, f, n->b);
			c->captured = saved;
		}
		if (n->kind == N_SETBLOCK)
			assign(c, f, n->a, v);
		else
			jv_str_into(c, c->out, v);
		return;
	}
	case N_MACRO: {
		struct jmacro *m = ja_alloc(c, sizeof *m);
		m->def = n;
		m->scope = f;
		jf_set(c, f, n->name, (struct jv){ .t = JV_MACRO, .u.m = m });
		return;
	}
	case N_WITH: {
		struct jframe *g = jf_new(c, f);
		for (size_t i = 0; i < n->n_kw; i++)
			jf_set(c, g, n->kw_names[i], eval(c, f, n->kw_vals[i]));
		exec(c, g, n->c);
		return;
	}
	case N_BREAK:
		c->loop_ctl = 1;
		return;
	case N_CONTINUE:
		c->loop_ctl = 2;
		return;
	default:
		jx_fail(c, n, JX_RUNTIME, "internal: node %d is not a statement", n->kind);
	}
	if (c->out->len > c->lim.output)
		jx_fail(c, n, JX_LIMIT, "the output passed %zu bytes (limit)", c->lim.output);
}

static void exec(struct jctx *c, struct jframe *f, const struct jnode *n)
{
	jx_step(c, n);
	if (++c->nest > EVAL_MAX_NEST)
		jx_fail(c, n, JX_LIMIT, "statements and expressions nest deeper than %d (limit)", EVAL_MAX_NEST);
	exec_inner(c, f, n);
	c->nest--;
}

void jinja_render(struct jctx *c, const struct jnode *body, struct jframe *root, struct jbuf *out)
{
	c->out = out;
	c->root = root;
	exec(c, root, body);
}
