/* The Jinja subset behind chat templates (internal to the engine): values, the lexer,
 * the parser's syntax tree and the evaluator, shared by the jinja_*.c files. The public
 * face is chat_template.h; nothing outside daemon/engine includes this header. */
#ifndef HEARTH_DAEMON_JINJA_H
#define HEARTH_DAEMON_JINJA_H

#include <jansson.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- memory: every value of a render, and every node of a parse, lives in one arena that
 * is dropped at once. Errors unwind with longjmp, which is safe because nothing else owns
 * memory while a render or a parse runs. */
struct jchunk;
struct jarena {
	struct jchunk *head;
	size_t total, limit; /* bytes taken from malloc; limit 0 = none */
};

/* ---- strings carry taint: bytes that came from the caller's data (messages, tools,
 * variables) are marked, so the tokenizer can refuse to read special tokens in them. */
enum { JT_CLEAN = 0, JT_ALL = 1, JT_MIXED = 2 };
struct jstr {
	size_t len;
	const char *s;       /* not NUL-terminated in general */
	const uint8_t *mask; /* JT_MIXED: one 0/1 byte per byte of s */
	uint8_t taint;
	uint8_t markup; /* jinja2's Markup: '+' with a plain str HTML-escapes the other side */
};

enum jtype {
	JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_NS,
	JV_MACRO, JV_FUNC, JV_METHOD, JV_LOOP,
};

/* An undefined value remembers why it is undefined, for the error raised when it is used. */
enum { JX_UNDEFINED, JX_SECURITY, JX_TYPE, JX_TEMPLATE, JX_RUNTIME, JX_VALUE, JX_LIMIT,
       JX_SYNTAX };
struct jundef {
	const char *msg; /* NULL: a plain missing value with nothing to say */
	uint8_t exc;
};

enum { JL_LIST, JL_TUPLE, JL_GEN };
struct jlist {
	size_t n, cap;
	struct jv *v;
	uint8_t kind;
};
struct jdict {
	size_t n, cap;
	struct jv *k, *v;
};

struct jv {
	uint8_t t;
	union {
		bool b;
		int64_t i;
		double f;
		const struct jstr *s;
		struct jlist *l;
		struct jdict *d;
		const struct jundef *u;
		struct jmacro *m;
		int fn;
		struct jmethod *me;
		struct jloop *lp;
	} u;
};

struct jmethod {
	struct jv self;
	int id;
};

/* ---- lexer */
enum jtok {
	TK_EOF, TK_TEXT, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END,
	TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP,
};
struct jtoken {
	uint8_t type;
	uint16_t op;          /* TK_OP: the operator's characters packed, see JOP() */
	uint32_t line, col;
	const struct jstr *str; /* TEXT, NAME, STRING */
	int64_t i;
	double f;
};
#define JOP(a, b) ((uint16_t)((unsigned char)(a) | (unsigned char)(b) << 8))

/* ---- syntax tree */
enum jnk {
	N_BODY, N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_FILTERBLOCK, N_WITH,
	N_BREAK, N_CONTINUE, N_CALLBLOCK,
	E_CONST, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_BIN, E_CMP,
	E_AND, E_OR, E_NOT, E_NEG, E_POS, E_COND, E_LIST, E_TUPLE, E_DICT, E_CAPTURED,
};
struct jnode {
	uint8_t kind, op;
	bool neg;
	uint32_t line, col;
	const struct jstr *name;
	struct jv cval;
	struct jnode *a, *b, *c, *d, *e;
	struct jnode **kids;
	size_t n_kids;
	const struct jstr **kw_names;
	struct jnode **kw_vals;
	size_t n_kw;
};

/* binary operators (E_BIN) and comparisons (E_CMP) */
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT };
enum { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN };

struct jlimits {
	uint64_t steps;
	uint32_t depth;
	size_t output, string, range, memory;
};

/* A parse or render in progress. */
struct jctx {
	jmp_buf jb;
	struct jarena *arena;
	const char *origin;
	struct jlimits lim;
	uint64_t steps;
	uint32_t depth;
	/* the error, filled before longjmp */
	int code;
	char msg[400];
	uint32_t line, col;
	/* render state */
	struct jbuf *out;
	struct jframe *root;
	const struct jstr *captured; /* E_CAPTURED's value in filter/set blocks */
	int64_t now;
	int loop_ctl; /* 1 break, 2 continue */
	uint32_t nest; /* expression and data nesting, bounded against stack exhaustion */
};

struct jbuf {
	char *s;
	uint8_t *m;
	size_t len, cap, n_taint;
};

struct jframe {
	struct jframe *parent;
	size_t n, cap;
	const struct jstr **names;
	struct jv *vals;
};

struct jmacro {
	const struct jnode *def;
	struct jframe *scope;
};

struct jloop {
	struct jlist *items;
	size_t i;
	uint32_t depth;
};

/* jinja_value.c */
void ja_init(struct jarena *a, size_t limit);
void ja_free(struct jarena *a);
void *ja_alloc(struct jctx *c, size_t n);
void *ja_grow(struct jctx *c, void *p, size_t old, size_t n);
_Noreturn void jx_fail(struct jctx *c, const struct jnode *at, int exc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
_Noreturn void jx_raise_undef(struct jctx *c, const struct jnode *at, const struct jundef *u);
const char *jx_name(int exc);
size_t jmul(struct jctx *c, const struct jnode *at, size_t a, size_t b);

const struct jstr *jstr_new(struct jctx *c, const char *s, size_t n, bool taint);
const struct jstr *jstr_cstr(struct jctx *c, const char *s);
const struct jstr *jstr_sub(struct jctx *c, const struct jstr *s, size_t off, size_t n);
bool jstr_eq(const struct jstr *a, const struct jstr *b);
bool jstr_is(const struct jstr *a, const char *lit);
bool jstr_tainted_at(const struct jstr *s, size_t i);
size_t utf8_count(const char *s, size_t n);
size_t utf8_offset(const char *s, size_t n, size_t cps); /* byte offset of code point cps */
char *jstr_z(struct jctx *c, const struct jstr *s);

void jb_init(struct jctx *c, struct jbuf *b, size_t cap);
void jb_put(struct jctx *c, struct jbuf *b, const char *s, size_t n, bool taint);
void jb_putc(struct jctx *c, struct jbuf *b, char ch);
void jb_puts(struct jctx *c, struct jbuf *b, const char *s);
void jb_put_str(struct jctx *c, struct jbuf *b, const struct jstr *s);
void jb_put_range(struct jctx *c, struct jbuf *b, const struct jstr *s, size_t off, size_t n);
void jb_printf(struct jctx *c, struct jbuf *b, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
const struct jstr *jb_finish(struct jctx *c, struct jbuf *b);
const struct jstr *jstr_html_escape(struct jctx *c, const struct jstr *s);

struct jv jv_undef(struct jctx *c, int exc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
struct jv jv_missing(void);
struct jv jv_none(void);
struct jv jv_bool(bool b);
struct jv jv_int(int64_t i);
struct jv jv_float(double f);
struct jv jv_str(const struct jstr *s);
struct jv jv_cstr(struct jctx *c, const char *s);
struct jlist *jl_new(struct jctx *c, size_t cap, uint8_t kind);
void jl_push(struct jctx *c, struct jlist *l, struct jv v);
struct jv jv_list(struct jlist *l);
struct jdict *jd_new(struct jctx *c, size_t cap);
void jd_set(struct jctx *c, struct jdict *d, struct jv k, struct jv v);
const struct jv *jd_get(const struct jdict *d, struct jv k);
const struct jv *jd_get_s(const struct jdict *d, const char *key);
struct jv jv_dict(struct jdict *d);

struct jv jv_from_json(struct jctx *c, const json_t *j, bool taint);
bool jv_truthy(struct jv v);
bool jv_equal(struct jv a, struct jv b);
int jv_compare(struct jctx *c, const struct jnode *at, struct jv a, struct jv b, const char *op);
const char *jv_type_name(struct jv v); /* Python's type name: str, int, dict, ... */
void jv_str_into(struct jctx *c, struct jbuf *b, struct jv v);  /* Python str() */
void jv_repr_into(struct jctx *c, struct jbuf *b, struct jv v); /* Python repr() */
const struct jstr *jv_to_str(struct jctx *c, struct jv v);
void jv_float_repr(double f, char out[40]);
struct jtojson {
	const struct jstr *indent; /* NULL: none */
	const struct jstr *item_sep, *key_sep;
	bool sort_keys, ensure_ascii;
};
void jv_tojson(struct jctx *c, const struct jnode *at, struct jbuf *b, struct jv v,
	       const struct jtojson *o, int level);
struct jlist *jv_iterate(struct jctx *c, const struct jnode *at, struct jv v);
bool jv_is_str(struct jv v, const char *lit);

/* jinja_lex.c: the whole source into tokens (text with whitespace control applied). */
struct jtoken *jinja_lex(struct jctx *c, const char *src, size_t len, size_t *n_out);

/* jinja_parse.c */
struct jnode *jinja_parse(struct jctx *c, const struct jtoken *toks, size_t n);

/* jinja_eval.c */
void jinja_render(struct jctx *c, const struct jnode *body, struct jframe *root, struct jbuf *out);
struct jframe *jf_new(struct jctx *c, struct jframe *parent);
void jf_set(struct jctx *c, struct jframe *f, const struct jstr *name, struct jv v);
struct jv jinja_call(struct jctx *c, const struct jnode *at, struct jv fn, struct jv *args, size_t n,
		     const struct jstr **kw_names, struct jv *kw_vals, size_t n_kw);
void jx_step(struct jctx *c, const struct jnode *at);
struct jv jinja_getitem(struct jctx *c, const struct jnode *at, struct jv obj, struct jv key);

/* jinja_filters.c */
struct jv jinja_filter(struct jctx *c, const struct jnode *at, const struct jstr *name, struct jv in,
		       struct jv *args, size_t n, const struct jstr **kw_names, struct jv *kw_vals,
		       size_t n_kw);
bool jinja_test(struct jctx *c, const struct jnode *at, const struct jstr *name, struct jv in,
		struct jv *args, size_t n);
struct jv jinja_getattr(struct jctx *c, const struct jnode *at, struct jv obj, const struct jstr *name);
struct jv jinja_global(struct jctx *c, const struct jstr *name); /* builtins: range, namespace ... */
struct jv jinja_call_builtin(struct jctx *c, const struct jnode *at, struct jv fn, struct jv *args,
			     size_t n, const struct jstr **kw_names, struct jv *kw_vals, size_t n_kw);

#endif
