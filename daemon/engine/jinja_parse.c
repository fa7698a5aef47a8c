/* Parser of the Jinja subset: tokens into a syntax tree, with jinja2's statement set (if,
 * for, set, macro, filter, with, generation, break, continue) and its expression grammar
 * and precedence (condexpr, or, and, not, compare, + -, ~, * / // %, **, unary, postfix,
 * filters and tests). Nesting is bounded so hostile input cannot exhaust the stack. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "daemon/engine/jinja.h"

#define PARSE_MAX_DEPTH 200

struct parser {
	struct jctx *c;
	const struct jtoken *t;
	size_t n, i;
	uint32_t depth, loops;
};

static const struct jtoken *cur(struct parser *p)
{
	return &p->t[p->i];
}

static const struct jtoken *peek(struct parser *p, size_t k)
{
	return p->i + k < p->n ? &p->t[p->i + k] : &p->t[p->n - 1];
}

static void advance(struct parser *p)
{
	if (p->i + 1 < p->n)
		p->i++;
}

_Noreturn static void pfail(struct parser *p, const struct jtoken *t, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void pfail(struct parser *p, const struct jtoken *t, const char *fmt, ...)
{
	struct jctx *c = p->c;
	int k = snprintf(c->msg, sizeof c->msg, "%s: ", jx_name(JX_SYNTAX));
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->msg + k, sizeof c->msg - (size_t)k, fmt, ap);
	va_end(ap);
	c->line = t->line;
	c->col = t->col;
	c->code = JX_SYNTAX;
	longjmp(c->jb, 1);
}

static const char *tok_desc(const struct jtoken *t, char *buf, size_t cap)
{
	switch (t->type) {
	case TK_EOF: return "end of template";
	case TK_TEXT: return "template data";
	case TK_VAR_BEGIN: return "'{{'";
	case TK_VAR_END: return "'}}'";
	case TK_BLOCK_BEGIN: return "'{%'";
	case TK_BLOCK_END: return "'%}'";
	case TK_NAME:
		snprintf(buf, cap, "'%.*s'", (int)(t->str->len > 40 ? 40 : t->str->len), t->str->s);
		return buf;
	case TK_STRING: return "string";
	case TK_INT: return "integer";
	case TK_FLOAT: return "float";
	default:
		snprintf(buf, cap, "'%c%c'", t->op & 0xFF, t->op >> 8 ? t->op >> 8 : ' ');
		if (!(t->op >> 8))
			buf[2] = '\'', buf[3] = 0;
		return buf;
	}
}

static bool is_op(struct parser *p, char a, char b)
{
	return cur(p)->type == TK_OP && cur(p)->op == JOP(a, b);
}

static bool is_name(struct parser *p, const char *lit)
{
	return cur(p)->type == TK_NAME && jstr_is(cur(p)->str, lit);
}

static void expect_op(struct parser *p, char a, char b)
{
	if (!is_op(p, a, b)) {
		char buf[64];
		pfail(p, cur(p), "expected '%c%s', got %s", a, b ? (char[]){ b, 0 } : "",
		      tok_desc(cur(p), buf, sizeof buf));
	}
	advance(p);
}

static void expect_type(struct parser *p, uint8_t type, const char *what)
{
	if (cur(p)->type != type) {
		char buf[64];
		pfail(p, cur(p), "expected %s, got %s", what, tok_desc(cur(p), buf, sizeof buf));
	}
	advance(p);
}

static const struct jstr *expect_name(struct parser *p)
{
	if (cur(p)->type != TK_NAME) {
		char buf[64];
		pfail(p, cur(p), "expected a name, got %s", tok_desc(cur(p), buf, sizeof buf));
	}
	const struct jstr *s = cur(p)->str;
	advance(p);
	return s;
}

static struct jnode *node(struct parser *p, uint8_t kind, const struct jtoken *at)
{
	struct jnode *n = ja_alloc(p->c, sizeof *n);
	memset(n, 0, sizeof *n);
	n->kind = kind;
	n->line = at->line;
	n->col = at->col;
	return n;
}

struct nvec {
	struct jnode **v;
	const struct jstr **names;
	size_t n, cap;
};

static void nv_push(struct parser *p, struct nvec *v, struct jnode *x, const struct jstr *name)
{
	if (v->n == v->cap) {
		size_t cap = v->cap ? v->cap * 2 : 4;
		v->v = ja_grow(p->c, v->v, v->n * sizeof *v->v, cap * sizeof *v->v);
		v->names = ja_grow(p->c, v->names, v->n * sizeof *v->names, cap * sizeof *v->names);
		v->cap = cap;
	}
	v->names[v->n] = name;
	v->v[v->n++] = x;
}

static void enter(struct parser *p)
{
	if (++p->depth > PARSE_MAX_DEPTH)
		pfail(p, cur(p), "nesting deeper than %d levels (limit)", PARSE_MAX_DEPTH);
}

static struct jnode *parse_expr(struct parser *p);
static struct jnode *parse_or(struct parser *p);
static struct jnode *parse_unary(struct parser *p, bool with_filter);
static struct jnode *parse_body(struct parser *p, const char *const *ends, int *which);

static struct jnode *parse_tuple(struct parser *p, bool condexpr)
{
	const struct jtoken *at = cur(p);
	struct jnode *first = condexpr ? parse_expr(p) : parse_or(p);
	if (!is_op(p, ',', 0))
		return first;
	struct nvec v = { 0 };
	nv_push(p, &v, first, NULL);
	while (is_op(p, ',', 0)) {
		advance(p);
		uint8_t ty = cur(p)->type;
		if (ty == TK_BLOCK_END || ty == TK_VAR_END || is_op(p, ')', 0) || is_op(p, '=', 0) ||
		    is_name(p, "in"))
			break;
		nv_push(p, &v, condexpr ? parse_expr(p) : parse_or(p), NULL);
	}
	struct jnode *t = node(p, E_TUPLE, at);
	t->kids = v.v;
	t->n_kids = v.n;
	return t;
}

/* (args, name=value) after '(' was consumed; up to and including ')'. */
static void parse_args(struct parser *p, struct jnode *n)
{
	struct nvec pos = { 0 }, kw = { 0 };
	while (!is_op(p, ')', 0)) {
		if (pos.n + kw.n)
			expect_op(p, ',', 0);
		if (is_op(p, ')', 0))
			break;
		if (is_op(p, '*', 0) || is_op(p, '*', '*'))
			pfail(p, cur(p), "*args and **kwargs in calls are not supported");
		if (cur(p)->type == TK_NAME && peek(p, 1)->type == TK_OP && peek(p, 1)->op == JOP('=', 0)) {
			const struct jstr *name = cur(p)->str;
			advance(p);
			advance(p);
			nv_push(p, &kw, parse_expr(p), name);
		} else {
			if (kw.n)
				pfail(p, cur(p), "a positional argument follows keyword arguments");
			nv_push(p, &pos, parse_expr(p), NULL);
		}
	}
	advance(p);
	n->kids = pos.v;
	n->n_kids = pos.n;
	n->kw_vals = kw.v;
	n->kw_names = kw.names;
	n->n_kw = kw.n;
}

static struct jnode *parse_primary(struct parser *p)
{
	const struct jtoken *t = cur(p);
	struct jnode *n;
	char buf[64];
	switch (t->type) {
	case TK_NAME:
		advance(p);
		n = node(p, E_CONST, t);
		if (jstr_is(t->str, "true") || jstr_is(t->str, "True"))
			n->cval = jv_bool(true);
		else if (jstr_is(t->str, "false") || jstr_is(t->str, "False"))
			n->cval = jv_bool(false);
		else if (jstr_is(t->str, "none") || jstr_is(t->str, "None"))
			n->cval = jv_none();
		else {
			n->kind = E_NAME;
			n->name = t->str;
		}
		return n;
	case TK_STRING: {
		advance(p);
		n = node(p, E_CONST, t);
		if (cur(p)->type != TK_STRING) {
			n->cval = jv_str(t->str);
			return n;
		}
		struct jbuf b;
		jb_init(p->c, &b, 64);
		jb_put_str(p->c, &b, t->str);
		while (cur(p)->type == TK_STRING) {
			jb_put_str(p->c, &b, cur(p)->str);
			advance(p);
		}
		n->cval = jv_str(jb_finish(p->c, &b));
		return n;
	}
	case TK_INT:
		advance(p);
		n = node(p, E_CONST, t);
		n->cval = jv_int(t->i);
		return n;
	case TK_FLOAT:
		advance(p);
		n = node(p, E_CONST, t);
		n->cval = jv_float(t->f);
		return n;
	case TK_OP:
		if (t->op == JOP('(', 0)) {
			advance(p);
			if (is_op(p, ')', 0)) {
				advance(p);
				return node(p, E_TUPLE, t);
			}
			struct jnode *e = parse_expr(p);
			if (is_op(p, ',', 0)) {
				struct nvec v = { 0 };
				nv_push(p, &v, e, NULL);
				while (is_op(p, ',', 0)) {
					advance(p);
					if (is_op(p, ')', 0))
						break;
					nv_push(p, &v, parse_expr(p), NULL);
				}
				e = node(p, E_TUPLE, t);
				e->kids = v.v;
				e->n_kids = v.n;
			}
			expect_op(p, ')', 0);
			return e;
		}
		if (t->op == JOP('[', 0)) {
			advance(p);
			struct nvec v = { 0 };
			while (!is_op(p, ']', 0)) {
				if (v.n)
					expect_op(p, ',', 0);
				if (is_op(p, ']', 0))
					break;
				nv_push(p, &v, parse_expr(p), NULL);
			}
			advance(p);
			n = node(p, E_LIST, t);
			n->kids = v.v;
			n->n_kids = v.n;
			return n;
		}
		if (t->op == JOP('{', 0)) {
			advance(p);
			struct nvec v = { 0 };
			while (!is_op(p, '}', 0)) {
				if (v.n)
					expect_op(p, ',', 0);
				if (is_op(p, '}', 0))
					break;
				nv_push(p, &v, parse_expr(p), NULL);
				expect_op(p, ':', 0);
				nv_push(p, &v, parse_expr(p), NULL);
			}
			advance(p);
			n = node(p, E_DICT, t);
			n->kids = v.v;
			n->n_kids = v.n;
			return n;
		}
		break;
	default:
		break;
	}
	pfail(p, t, "unexpected %s", tok_desc(t, buf, sizeof buf));
}

static struct jnode *parse_subscript(struct parser *p, struct jnode *obj)
{
	const struct jtoken *at = cur(p);
	advance(p); /* '[' */
	struct jnode *parts[3] = { 0 };
	int np = 0;
	bool slice = false;
	for (;;) {
		if (is_op(p, ':', 0)) {
			slice = true;
			advance(p);
			if (++np > 2)
				pfail(p, cur(p), "a slice takes at most three parts");
			continue;
		}
		if (is_op(p, ']', 0))
			break;
		if (parts[np])
			pfail(p, cur(p), "expected ':' or ']' in a subscript");
		parts[np] = parse_expr(p);
	}
	advance(p);
	struct jnode *n = node(p, slice ? E_SLICE : E_ITEM, at);
	n->a = obj;
	if (!slice) {
		if (!parts[0])
			pfail(p, at, "empty subscript");
		n->b = parts[0];
	} else {
		n->b = parts[0];
		n->c = parts[1];
		n->d = parts[2];
	}
	return n;
}

static struct jnode *parse_postfix(struct parser *p, struct jnode *n)
{
	for (;;) {
		const struct jtoken *at = cur(p);
		if (is_op(p, '.', 0)) {
			advance(p);
			if (cur(p)->type == TK_INT) {
				struct jnode *k = node(p, E_CONST, cur(p));
				k->cval = jv_int(cur(p)->i);
				advance(p);
				struct jnode *g = node(p, E_ITEM, at);
				g->a = n;
				g->b = k;
				n = g;
				continue;
			}
			struct jnode *g = node(p, E_ATTR, at);
			g->a = n;
			g->name = expect_name(p);
			n = g;
		} else if (is_op(p, '[', 0)) {
			n = parse_subscript(p, n);
		} else if (is_op(p, '(', 0)) {
			advance(p);
			struct jnode *call = node(p, E_CALL, at);
			/* a call's errors point at what is called */
			call->line = n->line;
			call->col = n->col;
			call->a = n;
			parse_args(p, call);
			n = call;
		} else
			return n;
	}
}

static const struct jstr *dotted_name(struct parser *p)
{
	const struct jstr *name = expect_name(p);
	while (is_op(p, '.', 0) && peek(p, 1)->type == TK_NAME) {
		advance(p);
		struct jbuf b;
		jb_init(p->c, &b, 32);
		jb_put_str(p->c, &b, name);
		jb_putc(p->c, &b, '.');
		jb_put_str(p->c, &b, expect_name(p));
		name = jb_finish(p->c, &b);
	}
	return name;
}

static struct jnode *parse_filter(struct parser *p, struct jnode *in)
{
	const struct jtoken *at = cur(p);
	struct jnode *f = node(p, E_FILTER, at);
	f->a = in;
	f->name = dotted_name(p);
	if (is_op(p, '(', 0)) {
		advance(p);
		parse_args(p, f);
	}
	return f;
}

static struct jnode *parse_filter_expr(struct parser *p, struct jnode *n)
{
	for (;;) {
		if (is_op(p, '|', 0)) {
			advance(p);
			n = parse_filter(p, n);
		} else if (is_name(p, "is")) {
			const struct jtoken *at = cur(p);
			advance(p);
			bool neg = false;
			if (is_name(p, "not")) {
				neg = true;
				advance(p);
			}
			struct jnode *t = node(p, E_TEST, at);
			t->a = n;
			t->neg = neg;
			t->name = dotted_name(p);
			const struct jtoken *c = cur(p);
			if (is_op(p, '(', 0)) {
				advance(p);
				parse_args(p, t);
			} else if ((c->type == TK_NAME || c->type == TK_STRING || c->type == TK_INT ||
				    c->type == TK_FLOAT || is_op(p, '[', 0) || is_op(p, '{', 0)) &&
				   !is_name(p, "else") && !is_name(p, "or") && !is_name(p, "and")) {
				if (is_name(p, "is"))
					pfail(p, c, "You cannot chain multiple tests with is");
				struct jnode *arg = parse_postfix(p, parse_primary(p));
				t->kids = ja_alloc(p->c, sizeof *t->kids);
				t->kids[0] = arg;
				t->n_kids = 1;
			}
			n = t;
		} else if (is_op(p, '(', 0)) {
			const struct jtoken *at = cur(p);
			advance(p);
			struct jnode *call = node(p, E_CALL, at);
			call->a = n;
			parse_args(p, call);
			n = call;
		} else
			return n;
	}
}

static struct jnode *parse_unary(struct parser *p, bool with_filter)
{
	const struct jtoken *at = cur(p);
	struct jnode *n;
	enter(p);
	if (is_op(p, '-', 0) || is_op(p, '+', 0)) {
		advance(p);
		n = node(p, at->op == JOP('-', 0) ? E_NEG : E_POS, at);
		n->a = parse_unary(p, false);
	} else
		n = parse_primary(p);
	n = parse_postfix(p, n);
	if (with_filter)
		n = parse_filter_expr(p, n);
	p->depth--;
	return n;
}

static struct jnode *binary(struct parser *p, uint8_t kind, uint8_t op, const struct jtoken *at,
			    struct jnode *a, struct jnode *b)
{
	struct jnode *n = node(p, kind, at);
	n->op = op;
	n->a = a;
	n->b = b;
	return n;
}

static struct jnode *parse_pow(struct parser *p)
{
	struct jnode *n = parse_unary(p, true);
	while (is_op(p, '*', '*')) {
		const struct jtoken *at = cur(p);
		advance(p);
		n = binary(p, E_BIN, OP_POW, at, n, parse_unary(p, true));
	}
	return n;
}

static struct jnode *parse_math2(struct parser *p)
{
	struct jnode *n = parse_pow(p);
	for (;;) {
		const struct jtoken *at = cur(p);
		uint8_t op;
		if (is_op(p, '*', 0))
			op = OP_MUL;
		else if (is_op(p, '/', 0))
			op = OP_DIV;
		else if (is_op(p, '/', '/'))
			op = OP_FLOORDIV;
		else if (is_op(p, '%', 0))
			op = OP_MOD;
		else
			return n;
		advance(p);
		n = binary(p, E_BIN, op, at, n, parse_pow(p));
	}
}

static struct jnode *parse_concat(struct parser *p)
{
	struct jnode *n = parse_math2(p);
	while (is_op(p, '~', 0)) {
		const struct jtoken *at = cur(p);
		advance(p);
		n = binary(p, E_BIN, OP_CONCAT, at, n, parse_math2(p));
	}
	return n;
}

static struct jnode *parse_math1(struct parser *p)
{
	struct jnode *n = parse_concat(p);
	for (;;) {
		const struct jtoken *at = cur(p);
		uint8_t op;
		if (is_op(p, '+', 0))
			op = OP_ADD;
		else if (is_op(p, '-', 0))
			op = OP_SUB;
		else
			return n;
		advance(p);
		n = binary(p, E_BIN, op, at, n, parse_concat(p));
	}
}

static struct jnode *parse_compare(struct parser *p)
{
	struct jnode *left = parse_math1(p), *result = NULL;
	for (;;) {
		const struct jtoken *at = cur(p);
		int op = -1;
		if (is_op(p, '=', '='))
			op = CMP_EQ;
		else if (is_op(p, '!', '='))
			op = CMP_NE;
		else if (is_op(p, '<', 0))
			op = CMP_LT;
		else if (is_op(p, '<', '='))
			op = CMP_LE;
		else if (is_op(p, '>', 0))
			op = CMP_GT;
		else if (is_op(p, '>', '='))
			op = CMP_GE;
		else if (is_name(p, "in"))
			op = CMP_IN;
		else if (is_name(p, "not") && peek(p, 1)->type == TK_NAME && jstr_is(peek(p, 1)->str, "in")) {
			op = CMP_NOTIN;
			advance(p);
		}
		if (op < 0)
			return result ? result : left;
		advance(p);
		struct jnode *right = parse_math1(p);
		struct jnode *cmp = binary(p, E_CMP, (uint8_t)op, at, left, right);
		/* a < b < c is (a < b) and (b < c) */
		result = result ? binary(p, E_AND, 0, at, result, cmp) : cmp;
		left = right;
	}
}

static struct jnode *parse_not(struct parser *p)
{
	if (is_name(p, "not")) {
		const struct jtoken *at = cur(p);
		advance(p);
		enter(p);
		struct jnode *n = node(p, E_NOT, at);
		n->a = parse_not(p);
		p->depth--;
		return n;
	}
	return parse_compare(p);
}

static struct jnode *parse_and(struct parser *p)
{
	struct jnode *n = parse_not(p);
	while (is_name(p, "and")) {
		const struct jtoken *at = cur(p);
		advance(p);
		n = binary(p, E_AND, 0, at, n, parse_not(p));
	}
	return n;
}

static struct jnode *parse_or(struct parser *p)
{
	struct jnode *n = parse_and(p);
	while (is_name(p, "or")) {
		const struct jtoken *at = cur(p);
		advance(p);
		n = binary(p, E_OR, 0, at, n, parse_and(p));
	}
	return n;
}

static struct jnode *parse_expr(struct parser *p)
{
	enter(p);
	struct jnode *n = parse_or(p);
	while (is_name(p, "if")) {
		const struct jtoken *at = cur(p);
		advance(p);
		struct jnode *cond = node(p, E_COND, at);
		cond->b = n;
		cond->a = parse_or(p);
		if (is_name(p, "else")) {
			advance(p);
			cond->c = parse_expr(p);
		}
		n = cond;
	}
	p->depth--;
	return n;
}

/* Targets of set and for: a name, ns.attr (set only), or a tuple of names. */
static struct jnode *parse_target(struct parser *p, bool allow_attr)
{
	const struct jtoken *at = cur(p);
	struct nvec v = { 0 };
	bool paren = is_op(p, '(', 0);
	if (paren)
		advance(p);
	for (;;) {
		const struct jtoken *nt = cur(p);
		struct jnode *n = node(p, E_NAME, nt);
		n->name = expect_name(p);
		if (allow_attr && is_op(p, '.', 0)) {
			advance(p);
			struct jnode *g = node(p, E_ATTR, nt);
			g->a = n;
			g->name = expect_name(p);
			n = g;
		}
		nv_push(p, &v, n, NULL);
		if (!is_op(p, ',', 0))
			break;
		advance(p);
		if (paren && is_op(p, ')', 0))
			break;
	}
	if (paren)
		expect_op(p, ')', 0);
	if (v.n == 1 && !paren)
		return v.v[0];
	struct jnode *t = node(p, E_TUPLE, at);
	t->kids = v.v;
	t->n_kids = v.n;
	return t;
}

/* a filter chain applied to the captured body of {% filter %} or {% set x | f %} */
static struct jnode *parse_block_filters(struct parser *p, struct jnode *in)
{
	struct jnode *n = parse_filter(p, in);
	while (is_op(p, '|', 0)) {
		advance(p);
		n = parse_filter(p, n);
	}
	return n;
}

static const char *const ends_if[] = { "elif", "else", "endif", NULL };
static const char *const ends_endif[] = { "endif", NULL };
static const char *const ends_for[] = { "endfor", "else", NULL };
static const char *const ends_endfor[] = { "endfor", NULL };

static struct jnode *parse_if(struct parser *p, const struct jtoken *at)
{
	struct jnode *n = node(p, N_IF, at);
	n->a = parse_tuple(p, true);
	expect_type(p, TK_BLOCK_END, "'%}'");
	int which;
	n->b = parse_body(p, ends_if, &which);
	if (which == 0) {
		const struct jtoken *e = &p->t[p->i - 1];
		n->c = parse_if(p, e);
		return n;
	}
	expect_type(p, TK_BLOCK_END, "'%}'");
	if (which == 1) {
		n->c = parse_body(p, ends_endif, &which);
		expect_type(p, TK_BLOCK_END, "'%}'");
	}
	return n;
}

static struct jnode *parse_statement(struct parser *p)
{
	const struct jtoken *at = cur(p);
	const struct jstr *kw = at->str;
	int which;
	struct jnode *n;
	enter(p);
	advance(p);
	if (jstr_is(kw, "if")) {
		n = parse_if(p, at);
	} else if (jstr_is(kw, "for")) {
		n = node(p, N_FOR, at);
		n->a = parse_target(p, false);
		if (!is_name(p, "in"))
			pfail(p, cur(p), "expected 'in' in a for loop");
		advance(p);
		n->b = parse_tuple(p, false);
		if (is_name(p, "if")) {
			advance(p);
			n->e = parse_expr(p);
		}
		if (is_name(p, "recursive"))
			pfail(p, cur(p), "recursive for loops are not supported");
		expect_type(p, TK_BLOCK_END, "'%}'");
		p->loops++;
		n->c = parse_body(p, ends_for, &which);
		p->loops--;
		expect_type(p, TK_BLOCK_END, "'%}'");
		if (which == 1) {
			n->d = parse_body(p, ends_endfor, &which);
			expect_type(p, TK_BLOCK_END, "'%}'");
		}
	} else if (jstr_is(kw, "set")) {
		struct jnode *target = parse_target(p, true);
		if (is_op(p, '=', 0)) {
			advance(p);
			n = node(p, N_SET, at);
			n->a = target;
			n->b = parse_tuple(p, true);
			expect_type(p, TK_BLOCK_END, "'%}'");
		} else {
			if (target->kind == E_TUPLE)
				pfail(p, at, "a block set takes one target");
			n = node(p, N_SETBLOCK, at);
			n->a = target;
			if (is_op(p, '|', 0)) {
				advance(p);
				n->b = parse_block_filters(p, node(p, E_CAPTURED, at));
			}
			expect_type(p, TK_BLOCK_END, "'%}'");
			static const char *const ends[] = { "endset", NULL };
			n->c = parse_body(p, ends, &which);
			expect_type(p, TK_BLOCK_END, "'%}'");
		}
	} else if (jstr_is(kw, "macro")) {
		n = node(p, N_MACRO, at);
		n->name = expect_name(p);
		expect_op(p, '(', 0);
		struct nvec params = { 0 };
		while (!is_op(p, ')', 0)) {
			if (params.n)
				expect_op(p, ',', 0);
			const struct jstr *name = expect_name(p);
			struct jnode *def = NULL;
			if (is_op(p, '=', 0)) {
				advance(p);
				def = parse_expr(p);
			}
			nv_push(p, &params, def, name);
		}
		advance(p);
		n->kw_names = params.names;
		n->kw_vals = params.v;
		n->n_kw = params.n;
		expect_type(p, TK_BLOCK_END, "'%}'");
		static const char *const ends[] = { "endmacro", NULL };
		uint32_t loops = p->loops;
		p->loops = 0;
		n->c = parse_body(p, ends, &which);
		p->loops = loops;
		if (cur(p)->type == TK_NAME)
			advance(p);
		expect_type(p, TK_BLOCK_END, "'%}'");
	} else if (jstr_is(kw, "filter")) {
		n = node(p, N_FILTERBLOCK, at);
		n->b = parse_block_filters(p, node(p, E_CAPTURED, at));
		expect_type(p, TK_BLOCK_END, "'%}'");
		static const char *const ends[] = { "endfilter", NULL };
		n->c = parse_body(p, ends, &which);
		expect_type(p, TK_BLOCK_END, "'%}'");
	} else if (jstr_is(kw, "with")) {
		n = node(p, N_WITH, at);
		struct nvec v = { 0 };
		while (cur(p)->type != TK_BLOCK_END) {
			if (v.n)
				expect_op(p, ',', 0);
			const struct jstr *name = expect_name(p);
			expect_op(p, '=', 0);
			nv_push(p, &v, parse_expr(p), name);
		}
		n->kw_names = v.names;
		n->kw_vals = v.v;
		n->n_kw = v.n;
		expect_type(p, TK_BLOCK_END, "'%}'");
		static const char *const ends[] = { "endwith", NULL };
		n->c = parse_body(p, ends, &which);
		expect_type(p, TK_BLOCK_END, "'%}'");
	} else if (jstr_is(kw, "generation")) {
		expect_type(p, TK_BLOCK_END, "'%}'");
		static const char *const ends[] = { "endgeneration", NULL };
		n = parse_body(p, ends, &which);
		expect_type(p, TK_BLOCK_END, "'%}'");
	} else if (jstr_is(kw, "break") || jstr_is(kw, "continue")) {
		if (!p->loops)
			pfail(p, at, "'%s' outside a for loop", jstr_is(kw, "break") ? "break" : "continue");
		n = node(p, jstr_is(kw, "break") ? N_BREAK : N_CONTINUE, at);
		expect_type(p, TK_BLOCK_END, "'%}'");
	} else {
		pfail(p, at, "Encountered unknown tag '%.*s'.", (int)(kw->len > 40 ? 40 : kw->len), kw->s);
	}
	p->depth--;
	return n;
}

static struct jnode *parse_body(struct parser *p, const char *const *ends, int *which)
{
	const struct jtoken *start = cur(p);
	struct nvec v = { 0 };
	enter(p);
	for (;;) {
		const struct jtoken *t = cur(p);
		if (t->type == TK_EOF) {
			if (ends)
				pfail(p, start, "unexpected end of template: missing '{%% %s %%}'",
				      ends[0][0] == 'e' && ends[1] == NULL ? ends[0] :
				      ends == ends_if ? "endif" : ends == ends_for ? "endfor" : ends[0]);
			break;
		}
		if (t->type == TK_TEXT) {
			struct jnode *n = node(p, N_TEXT, t);
			n->name = t->str;
			nv_push(p, &v, n, NULL);
			advance(p);
			continue;
		}
		if (t->type == TK_VAR_BEGIN) {
			advance(p);
			struct jnode *n = node(p, N_OUT, t);
			n->a = parse_tuple(p, true);
			expect_type(p, TK_VAR_END, "'}}'");
			nv_push(p, &v, n, NULL);
			continue;
		}
		if (t->type == TK_BLOCK_BEGIN) {
			advance(p);
			if (cur(p)->type != TK_NAME)
				pfail(p, cur(p), "expected a tag name after '{%%'");
			int k = -1;
			for (int i = 0; ends && ends[i]; i++)
				if (jstr_is(cur(p)->str, ends[i]))
					k = i;
			if (k >= 0) {
				advance(p);
				*which = k;
				break;
			}
			const struct jstr *kw = cur(p)->str;
			if (kw->len > 3 && !memcmp(kw->s, "end", 3))
				pfail(p, cur(p), "unexpected '%.*s'", (int)(kw->len > 40 ? 40 : kw->len), kw->s);
			if (jstr_is(kw, "elif") || jstr_is(kw, "else"))
				pfail(p, cur(p), "unexpected '%.*s'", (int)kw->len, kw->s);
			nv_push(p, &v, parse_statement(p), NULL);
			continue;
		}
		char buf[64];
		pfail(p, t, "unexpected %s", tok_desc(t, buf, sizeof buf));
	}
	p->depth--;
	struct jnode *body = node(p, N_BODY, start);
	body->kids = v.v;
	body->n_kids = v.n;
	return body;
}

struct jnode *jinja_parse(struct jctx *c, const struct jtoken *toks, size_t n)
{
	struct parser p = { .c = c, .t = toks, .n = n };
	int which;
	return parse_body(&p, NULL, &which);
}
