/* Lexer of the Jinja subset: template text with jinja2's whitespace control as transformers
 * configures it (trim_blocks, lstrip_blocks, "-" and "+" markers, one trailing newline
 * dropped), comments removed, raw blocks, and the tokens inside {{ }} and {% %}. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/jinja.h"

struct lexer {
	struct jctx *c;
	const char *s;
	size_t n, pos;
	/* line bookkeeping, advanced monotonically */
	size_t at;
	uint32_t line;
	size_t line_start;
	struct jtoken *t;
	size_t nt, cap;
};

static void where(struct lexer *lx, size_t pos, uint32_t *line, uint32_t *col)
{
	if (pos < lx->at) { /* rare: restart */
		lx->at = 0;
		lx->line = 1;
		lx->line_start = 0;
	}
	for (; lx->at < pos && lx->at < lx->n; lx->at++)
		if (lx->s[lx->at] == '\n') {
			lx->line++;
			lx->line_start = lx->at + 1;
		}
	*line = lx->line;
	*col = (uint32_t)(pos - lx->line_start + 1);
}

_Noreturn static void lex_fail(struct lexer *lx, size_t pos, const char *what)
{
	struct jctx *c = lx->c;
	where(lx, pos, &c->line, &c->col);
	snprintf(c->msg, sizeof c->msg, "%s: %s", jx_name(JX_SYNTAX), what);
	c->code = JX_SYNTAX;
	longjmp(c->jb, 1);
}

static struct jtoken *push(struct lexer *lx, uint8_t type, size_t pos)
{
	if (lx->nt == lx->cap) {
		size_t cap = lx->cap ? lx->cap * 2 : 256;
		lx->t = ja_grow(lx->c, lx->t, lx->nt * sizeof *lx->t, jmul(lx->c, NULL, cap, sizeof *lx->t));
		lx->cap = cap;
	}
	struct jtoken *t = &lx->t[lx->nt++];
	memset(t, 0, sizeof *t);
	t->type = type;
	where(lx, pos, &t->line, &t->col);
	return t;
}

static bool is_ws(char ch)
{
	return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

static bool is_name_start(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
}

static bool is_digit(char ch)
{
	return ch >= '0' && ch <= '9';
}

static int hexval(char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

static void put_utf8(struct jctx *c, struct jbuf *b, uint32_t cp)
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
		if (cp > 0x10FFFF)
			cp = 0xFFFD;
		u[0] = (char)(0xF0 | cp >> 18);
		u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
		u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
		u[3] = (char)(0x80 | (cp & 0x3F));
		n = 4;
	}
	jb_put(c, b, u, n, false);
}

/* A string literal at lx->pos (on its quote): Python's unicode-escape rules. */
static const struct jstr *lex_string(struct lexer *lx)
{
	struct jctx *c = lx->c;
	size_t start = lx->pos;
	char q = lx->s[lx->pos++];
	struct jbuf b;
	jb_init(c, &b, 32);
	for (;;) {
		if (lx->pos >= lx->n)
			lex_fail(lx, start, "unterminated string");
		char ch = lx->s[lx->pos++];
		if (ch == q)
			break;
		if (ch != '\\') {
			jb_putc(c, &b, ch);
			continue;
		}
		if (lx->pos >= lx->n)
			lex_fail(lx, start, "unterminated string");
		char e = lx->s[lx->pos++];
		int digits = 0;
		switch (e) {
		case 'n': jb_putc(c, &b, '\n'); break;
		case 't': jb_putc(c, &b, '\t'); break;
		case 'r': jb_putc(c, &b, '\r'); break;
		case 'b': jb_putc(c, &b, '\b'); break;
		case 'f': jb_putc(c, &b, '\f'); break;
		case 'v': jb_putc(c, &b, '\v'); break;
		case 'a': jb_putc(c, &b, '\a'); break;
		case '\\': jb_putc(c, &b, '\\'); break;
		case '\'': jb_putc(c, &b, '\''); break;
		case '"': jb_putc(c, &b, '"'); break;
		case '\n': break;
		case 'x': digits = 2; break;
		case 'u': digits = 4; break;
		case 'U': digits = 8; break;
		default:
			if (e >= '0' && e <= '7') {
				uint32_t v = (uint32_t)(e - '0');
				for (int k = 0; k < 2 && lx->pos < lx->n && lx->s[lx->pos] >= '0' &&
						lx->s[lx->pos] <= '7'; k++)
					v = v * 8 + (uint32_t)(lx->s[lx->pos++] - '0');
				put_utf8(c, &b, v);
			} else {
				jb_putc(c, &b, '\\');
				jb_putc(c, &b, e);
			}
		}
		if (digits) {
			uint32_t v = 0;
			for (int k = 0; k < digits; k++) {
				int h = lx->pos < lx->n ? hexval(lx->s[lx->pos]) : -1;
				if (h < 0)
					lex_fail(lx, lx->pos, "truncated \\x, \\u or \\U escape in a string");
				v = v * 16 + (uint32_t)h;
				lx->pos++;
			}
			put_utf8(c, &b, v);
		}
	}
	return jb_finish(c, &b);
}

static const char *const ops2[] = { "//", "**", "==", "!=", "<=", ">=" };
static const char ops1[] = "+-*/%~<>=()[]{},.:|;";

/* Tokens inside {{ }} or {% %}; returns the position just after the closing marker and
 * whether it carried "-" (strip) or "+" (keep) in *sign. */
static size_t lex_tag(struct lexer *lx, bool block, char *sign)
{
	struct jctx *c = lx->c;
	int balance = 0;
	size_t open = lx->pos;
	for (;;) {
		while (lx->pos < lx->n && is_ws(lx->s[lx->pos]))
			lx->pos++;
		if (lx->pos >= lx->n)
			lex_fail(lx, open, block ? "unclosed block tag: missing '%}'" :
						  "unclosed expression: missing '}}'");
		const char *p = lx->s + lx->pos;
		size_t rem = lx->n - lx->pos;
		const char *end = block ? "%}" : "}}";
		if (balance == 0) {
			if ((p[0] == '-' || (block && p[0] == '+')) && rem >= 3 && !memcmp(p + 1, end, 2)) {
				*sign = p[0];
				push(lx, block ? TK_BLOCK_END : TK_VAR_END, lx->pos);
				return lx->pos + 3;
			}
			if (rem >= 2 && !memcmp(p, end, 2)) {
				*sign = 0;
				push(lx, block ? TK_BLOCK_END : TK_VAR_END, lx->pos);
				return lx->pos + 2;
			}
		}
		if (is_name_start(p[0])) {
			size_t k = 1;
			while (k < rem && (is_name_start(p[k]) || is_digit(p[k])))
				k++;
			struct jtoken *t = push(lx, TK_NAME, lx->pos);
			t->str = jstr_new(c, p, k, false);
			lx->pos += k;
			continue;
		}
		if (is_digit(p[0])) {
			size_t k = 0;
			bool flt = false;
			char num[64];
			size_t nn = 0;
			while (k < rem && (is_digit(p[k]) || (p[k] == '_' && k + 1 < rem && is_digit(p[k + 1])))) {
				if (p[k] != '_' && nn < sizeof num - 1)
					num[nn++] = p[k];
				k++;
			}
			if (k + 1 < rem && p[k] == '.' && is_digit(p[k + 1])) {
				flt = true;
				if (nn < sizeof num - 1)
					num[nn++] = '.';
				k++;
				while (k < rem && (is_digit(p[k]) || p[k] == '_')) {
					if (p[k] != '_' && nn < sizeof num - 1)
						num[nn++] = p[k];
					k++;
				}
			}
			if (k < rem && (p[k] == 'e' || p[k] == 'E')) {
				size_t e = k + 1;
				if (e < rem && (p[e] == '+' || p[e] == '-'))
					e++;
				if (e < rem && is_digit(p[e])) {
					flt = true;
					if (nn < sizeof num - 1)
						num[nn++] = 'e';
					for (size_t j = k + 1; j < e; j++)
						if (nn < sizeof num - 1)
							num[nn++] = p[j];
					k = e;
					while (k < rem && is_digit(p[k])) {
						if (nn < sizeof num - 1)
							num[nn++] = p[k];
						k++;
					}
				}
			}
			num[nn] = 0;
			struct jtoken *t = push(lx, flt ? TK_FLOAT : TK_INT, lx->pos);
			if (flt) {
				t->f = strtod(num, NULL);
			} else {
				int64_t v = 0;
				for (size_t j = 0; j < nn; j++) {
					int d = num[j] - '0';
					if (v > (INT64_MAX - d) / 10)
						lex_fail(lx, lx->pos, "integer literal too large");
					v = v * 10 + d;
				}
				t->i = v;
			}
			lx->pos += k;
			continue;
		}
		if (p[0] == '\'' || p[0] == '"') {
			size_t at = lx->pos;
			const struct jstr *s = lex_string(lx);
			struct jtoken *t = push(lx, TK_STRING, at);
			t->str = s;
			continue;
		}
		bool done = false;
		for (size_t k = 0; k < sizeof ops2 / sizeof ops2[0] && rem >= 2; k++)
			if (p[0] == ops2[k][0] && p[1] == ops2[k][1]) {
				struct jtoken *t = push(lx, TK_OP, lx->pos);
				t->op = JOP(p[0], p[1]);
				lx->pos += 2;
				done = true;
				break;
			}
		if (done)
			continue;
		if (p[0] && strchr(ops1, p[0])) {
			struct jtoken *t = push(lx, TK_OP, lx->pos);
			t->op = JOP(p[0], 0);
			if (p[0] == '(' || p[0] == '[' || p[0] == '{')
				balance++;
			else if ((p[0] == ')' || p[0] == ']' || p[0] == '}') && balance > 0)
				balance--;
			lx->pos++;
			continue;
		}
		char what[64];
		snprintf(what, sizeof what, "unexpected character '%c' (0x%02x)",
			 p[0] >= 0x20 && p[0] < 0x7f ? p[0] : '?', (unsigned char)p[0]);
		lex_fail(lx, lx->pos, what);
	}
}

/* jinja2 strips "-" text with str.rstrip(): all whitespace, newlines included. */
static size_t rstrip_len(const char *s, size_t n)
{
	while (n && is_ws(s[n - 1]))
		n--;
	return n;
}

/* At "{%": is this "{% raw %}"? Returns the position after its "%}" or 0. */
static size_t raw_open(const char *s, size_t n, size_t p, char *sign_out)
{
	size_t i = p + 2;
	if (i < n && (s[i] == '-' || s[i] == '+'))
		i++;
	while (i < n && is_ws(s[i]))
		i++;
	if (n - i < 3 || memcmp(s + i, "raw", 3))
		return 0;
	i += 3;
	if (i < n && (is_name_start(s[i]) || is_digit(s[i])))
		return 0;
	while (i < n && is_ws(s[i]))
		i++;
	*sign_out = 0;
	if (i < n && s[i] == '-') {
		*sign_out = '-';
		i++;
	}
	if (n - i < 2 || memcmp(s + i, "%}", 2))
		return 0;
	return i + 2;
}

/* Finds "{% endraw %}" from p: its start in *tag, the text end (before any "-" strip) and
 * the position after it. */
static bool raw_close(const char *s, size_t n, size_t p, size_t *tag, char *sign_open, char *sign_close,
		      size_t *after)
{
	for (size_t i = p; i + 1 < n; i++) {
		if (s[i] != '{' || s[i + 1] != '%')
			continue;
		size_t j = i + 2;
		*sign_open = 0;
		if (j < n && (s[j] == '-' || s[j] == '+'))
			*sign_open = s[j++];
		while (j < n && is_ws(s[j]))
			j++;
		if (n - j < 6 || memcmp(s + j, "endraw", 6))
			continue;
		j += 6;
		while (j < n && is_ws(s[j]))
			j++;
		*sign_close = 0;
		if (j < n && (s[j] == '-' || s[j] == '+'))
			*sign_close = s[j++];
		if (n - j < 2 || memcmp(s + j, "%}", 2))
			continue;
		*tag = i;
		*after = j + 2;
		return true;
	}
	return false;
}

struct jtoken *jinja_lex(struct jctx *c, const char *src, size_t len, size_t *n_out)
{
	/* newlines normalised to \n and one trailing newline dropped, as jinja2 does */
	char *s = ja_alloc(c, len + 1);
	size_t n = 0;
	for (size_t i = 0; i < len; i++) {
		if (src[i] == '\r') {
			s[n++] = '\n';
			if (i + 1 < len && src[i + 1] == '\n')
				i++;
		} else
			s[n++] = src[i];
	}
	if (n && s[n - 1] == '\n')
		n--;
	s[n] = 0;

	struct lexer lx = { .c = c, .s = s, .n = n, .line = 1 };
	bool line_starting = true;
	size_t pos = 0;
	while (pos < n) {
		/* the next tag opening */
		size_t open = pos;
		int kind = 0; /* '{', '%', '#' */
		while (open + 1 < n) {
			if (s[open] == '{' && (s[open + 1] == '{' || s[open + 1] == '%' || s[open + 1] == '#')) {
				kind = s[open + 1];
				break;
			}
			open++;
		}
		if (!kind)
			open = n;
		size_t tlen = open - pos;
		char sign = 0;
		if (kind && open + 2 < n && (s[open + 2] == '-' || s[open + 2] == '+'))
			sign = s[open + 2];
		if (kind) {
			if (sign == '-') {
				tlen = rstrip_len(s + pos, tlen);
			} else if (sign != '+' && kind != '{') {
				/* lstrip_blocks: only spaces and tabs between the line start and the tag */
				size_t l_pos = tlen;
				while (l_pos > 0 && s[pos + l_pos - 1] != '\n')
					l_pos--;
				if (l_pos > 0 || line_starting) {
					bool blank = true;
					for (size_t k = l_pos; k < tlen; k++)
						if (s[pos + k] != ' ' && s[pos + k] != '\t')
							blank = false;
					if (blank)
						tlen = l_pos;
				}
			}
		}
		if (tlen) {
			struct jtoken *t = push(&lx, TK_TEXT, pos);
			t->str = jstr_new(c, s + pos, tlen, false);
		}
		if (!kind)
			break;
		size_t body = open + 2 + (sign ? 1 : 0);
		if (kind == '#') {
			size_t e = body;
			while (e + 1 < n && !(s[e] == '#' && s[e + 1] == '}'))
				e++;
			if (e + 1 >= n)
				lex_fail(&lx, open, "unclosed comment: missing '#}'");
			size_t after = e + 2;
			if (e > body && s[e - 1] == '-') {
				while (after < n && is_ws(s[after]))
					after++;
			} else if (!(e > body && s[e - 1] == '+') && after < n && s[after] == '\n')
				after++;
			line_starting = s[after - 1] == '\n';
			pos = after;
			continue;
		}
		char rsign;
		size_t raw_body = kind == '%' ? raw_open(s, n, open, &rsign) : 0;
		if (raw_body) {
			size_t tag, after;
			char so, sc;
			if (rsign == '-')
				while (raw_body < n && is_ws(s[raw_body]))
					raw_body++;
			if (!raw_close(s, n, raw_body, &tag, &so, &sc, &after))
				lex_fail(&lx, open, "missing {% endraw %}");
			size_t rl = tag - raw_body;
			if (so == '-')
				rl = rstrip_len(s + raw_body, rl);
			if (rl) {
				struct jtoken *t = push(&lx, TK_TEXT, raw_body);
				t->str = jstr_new(c, s + raw_body, rl, false);
			}
			if (sc == '-')
				while (after < n && is_ws(s[after]))
					after++;
			else if (sc != '+' && after < n && s[after] == '\n')
				after++;
			line_starting = s[after - 1] == '\n';
			pos = after;
			continue;
		}
		push(&lx, kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, open);
		lx.pos = body;
		char esign;
		size_t after = lex_tag(&lx, kind == '%', &esign);
		if (esign == '-') {
			while (after < n && is_ws(s[after]))
				after++;
		} else if (kind == '%' && esign != '+' && after < n && s[after] == '\n')
			after++;
		line_starting = s[after - 1] == '\n';
		pos = after;
	}
	push(&lx, TK_EOF, n);
	*n_out = lx.nt;
	return lx.t;
}
