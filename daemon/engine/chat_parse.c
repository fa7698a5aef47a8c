/* The reply parser of chat_parse.h: a small state machine over the text as it is sampled.
 * Text that might still be the start of a marker is held back, never emitted and then taken
 * back, so a streaming client sees a tool call only as a tool-call event. JSON bodies are
 * checked with jansson; anything that does not parse as a call stays the model's content. */
#include "daemon/engine/chat_parse.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define MISTRAL_OPEN "[TOOL_CALLS]"
#define MISTRAL_ARGS "[ARGS]"
#define LLAMA3_PYTHON_TAG "<|python_tag|>"

enum parse_state {
	ST_START,       /* a new stretch of content: leading whitespace, then what begins it */
	ST_CONTENT,
	ST_REASONING,
	ST_HERMES,      /* inside <tool_call> ... </tool_call> */
	ST_MISTRAL,     /* after [TOOL_CALLS] */
	ST_JSON,        /* a reply that is one JSON value (Llama 3, generic) */
	ST_PYTHON,      /* after <|python_tag|>: JSON, or code for the built-in python tool */
	ST_TEXT,        /* settled: the rest is content, markers included */
};

struct strbuf {
	char *p;
	size_t len, cap;
};

struct chat_parser {
	struct chat_syntax syn;
	enum parse_state st;
	struct strbuf pend;             /* received, not yet settled */
	struct strbuf content, reasoning;
	struct chat_tool_call calls[CHAT_PARSE_MAX_CALLS];
	size_t n_calls;
	bool reasoning_started;         /* leading whitespace of reasoning is dropped */
	char id_prefix[24];
	size_t total;                   /* bytes fed, against CHAT_PARSE_MAX_BYTES */
};

const char *chat_format_name(enum chat_format f)
{
	switch (f) {
	case CHAT_FORMAT_PLAIN: return "plain";
	case CHAT_FORMAT_HERMES: return "hermes";
	case CHAT_FORMAT_LLAMA3: return "llama3";
	case CHAT_FORMAT_MISTRAL: return "mistral";
	case CHAT_FORMAT_GENERIC: return "generic";
	}
	return "unknown";
}

enum chat_format chat_format_detect(const char *src)
{
	if (!src || !*src)
		return CHAT_FORMAT_PLAIN;
	if (strstr(src, HERMES_OPEN))
		return CHAT_FORMAT_HERMES;
	if (strstr(src, MISTRAL_OPEN))
		return CHAT_FORMAT_MISTRAL;
	/* Llama 3.1/3.2 write a past call as {"name": ..., "parameters": ...} after an
	 * assistant header, and built-in tools after <|python_tag|>. */
	if (strstr(src, LLAMA3_PYTHON_TAG) ||
	    (strstr(src, "<|start_header_id|>") && strstr(src, "\"parameters\"")))
		return CHAT_FORMAT_LLAMA3;
	if (strstr(src, "tools"))
		return CHAT_FORMAT_GENERIC;
	return CHAT_FORMAT_PLAIN;
}

static bool is_space(char c)
{
	return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

void chat_syntax_init(struct chat_syntax *s, const char *template_src, const char *prompt,
		      size_t prompt_len)
{
	memset(s, 0, sizeof *s);
	s->format = chat_format_detect(template_src);
	if (template_src && strstr(template_src, "<think>")) {
		strcpy(s->think_open, "<think>");
		strcpy(s->think_close, "</think>");
	}
	if (!s->think_open[0] || !prompt)
		return;
	size_t n = prompt_len;
	while (n && is_space(prompt[n - 1]))
		n--;
	size_t ol = strlen(s->think_open);
	s->in_reasoning = n >= ol && !memcmp(prompt + n - ol, s->think_open, ol);
}

/* ---- buffers ---- */

static int sb_append(struct strbuf *b, const char *s, size_t n, struct hearth_error *err)
{
	if (n > CHAT_PARSE_MAX_BYTES || b->len > CHAT_PARSE_MAX_BYTES - n)
		return hearth_error_set(err, HEARTH_ERANGE, "chat reply: more than %u bytes",
					CHAT_PARSE_MAX_BYTES);
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + n + 1)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p)
			return hearth_error_set(err, HEARTH_ENOMEM, "chat reply: out of memory");
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = 0;
	return 0;
}

static void sb_consume(struct strbuf *b, size_t n)
{
	memmove(b->p, b->p + n, b->len - n);
	b->len -= n;
	if (b->p)
		b->p[b->len] = 0;
}

/* ---- events ---- */

static int emit_text(struct chat_parser *p, enum chat_event_kind kind, const char *s, size_t n,
		     chat_event_fn fn, void *ctx, struct hearth_error *err)
{
	struct strbuf *acc = kind == CHAT_EVENT_REASONING ? &p->reasoning : &p->content;
	/* Whitespace that opens content or reasoning is layout, not text. */
	if (acc->len == 0)
		while (n && is_space(*s))
			s++, n--;
	if (!n)
		return 0;
	int rc = sb_append(acc, s, n, err);
	if (rc < 0)
		return rc;
	if (!fn)
		return 0;
	struct chat_event ev = { .kind = kind, .text = s, .len = n };
	rc = fn(ctx, &ev);
	return rc < 0 ? hearth_error_set(err, rc, "chat reply: the event consumer stopped") : 0;
}

static int add_call(struct chat_parser *p, const char *name, json_t *args, const char *id,
		    chat_event_fn fn, void *ctx, struct hearth_error *err)
{
	if (p->n_calls == CHAT_PARSE_MAX_CALLS)
		return hearth_error_set(err, HEARTH_ERANGE, "chat reply: more than %d tool calls",
					CHAT_PARSE_MAX_CALLS);
	char idbuf[48];
	if (!id) {
		snprintf(idbuf, sizeof idbuf, "%s%zu", p->id_prefix, p->n_calls);
		id = idbuf;
	}
	struct chat_tool_call *c = &p->calls[p->n_calls];
	c->name = strdup(name);
	c->id = strdup(id);
	c->arguments = json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY);
	if (!c->name || !c->id || !c->arguments) {
		free(c->name);
		free(c->id);
		free(c->arguments);
		memset(c, 0, sizeof *c);
		return hearth_error_set(err, HEARTH_ENOMEM, "chat reply: out of memory for a tool call");
	}
	p->n_calls++;
	if (!fn)
		return 0;
	struct chat_event ev = { .kind = CHAT_EVENT_TOOL_CALL, .call = c, .index = p->n_calls - 1 };
	int rc = fn(ctx, &ev);
	return rc < 0 ? hearth_error_set(err, rc, "chat reply: the event consumer stopped") : 0;
}

/* ---- JSON pieces ---- */

/* Length of the JSON object or array at s[0], or 0 while it is incomplete (strings and their
 * escapes are respected, so a brace inside a string does not count). */
static size_t json_value_end(const char *s, size_t n)
{
	int depth = 0;
	bool in_str = false, esc = false;

	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (in_str) {
			if (esc)
				esc = false;
			else if (c == '\\')
				esc = true;
			else if (c == '"')
				in_str = false;
			continue;
		}
		if (c == '"')
			in_str = true;
		else if (c == '{' || c == '[')
			depth++;
		else if (c == '}' || c == ']') {
			if (--depth == 0)
				return i + 1;
			if (depth < 0)
				return 0;
		}
	}
	return 0;
}

static json_t *json_parse(const char *s, size_t n)
{
	return json_loadb(s, n, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
}

/* {"name": "...", "<args_key>": {...}} with args an object (or a JSON string holding one, as
 * some models write it). Returns the name, and args in *args (a new reference). */
static const char *call_fields(json_t *obj, const char *args_key, json_t **args)
{
	*args = NULL;
	if (!json_is_object(obj))
		return NULL;
	const char *name = json_string_value(json_object_get(obj, "name"));
	json_t *a = json_object_get(obj, args_key);
	if (!name || !*name)
		return NULL;
	if (json_is_string(a)) {
		json_t *inner = json_parse(json_string_value(a), json_string_length(a));
		if (!json_is_object(inner)) {
			json_decref(inner);
			return NULL;
		}
		*args = inner;
		return name;
	}
	if (!a)
		a = json_object(); /* a call of a function without parameters */
	else if (!json_is_object(a))
		return NULL;
	else
		json_incref(a);
	*args = a;
	return name;
}

/* One call object in the family's key names; 1 when it was one, 0 when it was not, <0 on error. */
static int take_call(struct chat_parser *p, json_t *obj, const char *args_key, chat_event_fn fn, void *ctx,
		     struct hearth_error *err)
{
	json_t *args;
	const char *name = call_fields(obj, args_key, &args);
	if (!name)
		return 0;
	const char *id = json_string_value(json_object_get(obj, "id"));
	int rc = add_call(p, name, args, id, fn, ctx, err);
	json_decref(args);
	return rc < 0 ? rc : 1;
}

/* Every element of an array must be a call, or none of it is taken. */
static int take_call_array(struct chat_parser *p, json_t *arr, const char *args_key, chat_event_fn fn,
			   void *ctx, struct hearth_error *err)
{
	size_t i;
	json_t *v;

	if (!json_is_array(arr) || json_array_size(arr) == 0)
		return 0;
	json_array_foreach(arr, i, v) {
		json_t *args;
		if (!call_fields(v, args_key, &args))
			return 0;
		json_decref(args);
	}
	json_array_foreach(arr, i, v) {
		int rc = take_call(p, v, args_key, fn, ctx, err);
		if (rc < 0)
			return rc;
	}
	return 1;
}

/* A whole reply that is one JSON value, read by the family's rules. 1 taken, 0 not. */
static int take_json_reply(struct chat_parser *p, json_t *v, chat_event_fn fn, void *ctx,
			   struct hearth_error *err)
{
	if (p->syn.format == CHAT_FORMAT_LLAMA3) {
		int rc = take_call(p, v, "parameters", fn, ctx, err);
		return rc != 0 ? rc : take_call(p, v, "arguments", fn, ctx, err);
	}
	/* generic: llama.cpp's generic schema */
	json_t *one = json_object_get(v, "tool_call");
	if (one)
		return take_call(p, one, "arguments", fn, ctx, err);
	json_t *many = json_object_get(v, "tool_calls");
	if (many)
		return take_call_array(p, many, "arguments", fn, ctx, err);
	json_t *resp = json_object_get(v, "response");
	if (json_is_string(resp)) {
		int rc = emit_text(p, CHAT_EVENT_CONTENT, json_string_value(resp), json_string_length(resp), fn,
				   ctx, err);
		return rc < 0 ? rc : 1;
	}
	return 0;
}

/* ---- the state machine ---- */

/* Longest suffix of s[0..n) that is a proper prefix of marker. */
static size_t partial_suffix(const char *s, size_t n, const char *marker)
{
	size_t m = strlen(marker);
	for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
		if (!memcmp(s + n - k, marker, k))
			return k;
	return 0;
}

static const char *find(const char *s, size_t n, const char *marker)
{
	return memmem(s, n, marker, strlen(marker));
}

/* The markers that end a stretch of content in this format, and the state each opens. */
static size_t content_markers(const struct chat_parser *p, const char *out[2], enum parse_state next[2])
{
	size_t k = 0;
	if (p->syn.think_open[0]) {
		out[k] = p->syn.think_open;
		next[k++] = ST_REASONING;
	}
	if (p->syn.format == CHAT_FORMAT_HERMES) {
		out[k] = HERMES_OPEN;
		next[k++] = ST_HERMES;
	} else if (p->syn.format == CHAT_FORMAT_MISTRAL) {
		out[k] = MISTRAL_OPEN;
		next[k++] = ST_MISTRAL;
	} else if (p->syn.format == CHAT_FORMAT_LLAMA3) {
		out[k] = LLAMA3_PYTHON_TAG;
		next[k++] = ST_PYTHON;
	}
	return k;
}

/* Each step settles a prefix of pend or says it must wait (returns 1 progress, 0 wait). */
static int step_content(struct chat_parser *p, bool final, chat_event_fn fn, void *ctx,
			struct hearth_error *err)
{
	const char *mk[2];
	enum parse_state next[2];
	size_t nm = content_markers(p, mk, next);
	const char *best = NULL;
	size_t which = 0;
	for (size_t i = 0; i < nm; i++) {
		const char *at = find(p->pend.p, p->pend.len, mk[i]);
		if (at && (!best || at < best)) {
			best = at;
			which = i;
		}
	}
	if (best) {
		size_t pre = (size_t)(best - p->pend.p);
		int rc = emit_text(p, CHAT_EVENT_CONTENT, p->pend.p, pre, fn, ctx, err);
		if (rc < 0)
			return rc;
		sb_consume(&p->pend, pre + strlen(mk[which]));
		p->st = next[which];
		return 1;
	}
	size_t hold = 0;
	if (!final)
		for (size_t i = 0; i < nm; i++) {
			size_t h = partial_suffix(p->pend.p, p->pend.len, mk[i]);
			hold = h > hold ? h : hold;
		}
	size_t n = p->pend.len - hold;
	if (!n)
		return 0;
	int rc = emit_text(p, CHAT_EVENT_CONTENT, p->pend.p, n, fn, ctx, err);
	if (rc < 0)
		return rc;
	sb_consume(&p->pend, n);
	return 0;
}

static int step_reasoning(struct chat_parser *p, bool final, chat_event_fn fn, void *ctx,
			  struct hearth_error *err)
{
	const char *at = find(p->pend.p, p->pend.len, p->syn.think_close);
	size_t n, skip = 0;
	if (at) {
		n = (size_t)(at - p->pend.p);
		skip = strlen(p->syn.think_close);
	} else {
		n = p->pend.len - (final ? 0 : partial_suffix(p->pend.p, p->pend.len, p->syn.think_close));
	}
	int rc = emit_text(p, CHAT_EVENT_REASONING, p->pend.p, n, fn, ctx, err);
	if (rc < 0)
		return rc;
	sb_consume(&p->pend, n + skip);
	if (at) {
		p->st = ST_START;
		return 1;
	}
	return 0;
}

/* Gives back an opener and what followed it as content: the model wrote something that only
 * looked like a call. */
static int settle_as_text(struct chat_parser *p, const char *opener, chat_event_fn fn, void *ctx,
			  struct hearth_error *err)
{
	int rc = emit_text(p, CHAT_EVENT_CONTENT, opener, strlen(opener), fn, ctx, err);
	if (rc < 0)
		return rc;
	rc = emit_text(p, CHAT_EVENT_CONTENT, p->pend.p, p->pend.len, fn, ctx, err);
	if (rc < 0)
		return rc;
	sb_consume(&p->pend, p->pend.len);
	p->st = ST_TEXT;
	return 0;
}

static int step_hermes(struct chat_parser *p, bool final, chat_event_fn fn, void *ctx,
		       struct hearth_error *err)
{
	const char *at = find(p->pend.p, p->pend.len, HERMES_CLOSE);
	if (!at && !final)
		return 0;
	size_t body = at ? (size_t)(at - p->pend.p) : p->pend.len;
	json_t *v = json_parse(p->pend.p, body);
	int rc = v ? take_call(p, v, "arguments", fn, ctx, err) : 0;
	json_decref(v);
	if (rc < 0)
		return rc;
	if (rc == 0)
		return settle_as_text(p, HERMES_OPEN, fn, ctx, err);
	sb_consume(&p->pend, at ? body + strlen(HERMES_CLOSE) : body);
	p->st = ST_START;
	return 1;
}

/* Skips leading whitespace of pend; false when nothing else is there yet. */
static bool skip_space(struct chat_parser *p)
{
	size_t i = 0;
	while (i < p->pend.len && is_space(p->pend.p[i]))
		i++;
	sb_consume(&p->pend, i);
	return p->pend.len > 0;
}

static int step_mistral(struct chat_parser *p, bool final, chat_event_fn fn, void *ctx,
			struct hearth_error *err)
{
	if (!skip_space(p))
		return 0;
	if (p->pend.p[0] == '[') {      /* [TOOL_CALLS][{"name", "arguments", "id"}, ...] */
		size_t end = json_value_end(p->pend.p, p->pend.len);
		if (!end)
			return final ? settle_as_text(p, MISTRAL_OPEN, fn, ctx, err) : 0;
		json_t *v = json_parse(p->pend.p, end);
		int rc = v ? take_call_array(p, v, "arguments", fn, ctx, err) : 0;
		json_decref(v);
		if (rc <= 0)
			return rc < 0 ? rc : settle_as_text(p, MISTRAL_OPEN, fn, ctx, err);
		sb_consume(&p->pend, end);
		p->st = ST_START;
		return 1;
	}
	/* [TOOL_CALLS]name[ARGS]{...} */
	const char *args = find(p->pend.p, p->pend.len, MISTRAL_ARGS);
	if (!args)
		return final || p->pend.len > 256 ? settle_as_text(p, MISTRAL_OPEN, fn, ctx, err) : 0;
	size_t nlen = (size_t)(args - p->pend.p);
	size_t off = nlen + strlen(MISTRAL_ARGS);
	while (off < p->pend.len && is_space(p->pend.p[off]))
		off++;
	size_t end = off < p->pend.len ? json_value_end(p->pend.p + off, p->pend.len - off) : 0;
	if (!end)
		return final ? settle_as_text(p, MISTRAL_OPEN, fn, ctx, err) : 0;
	json_t *a = json_parse(p->pend.p + off, end);
	char name[256];
	int rc = 0;
	if (json_is_object(a) && nlen > 0 && nlen < sizeof name) {
		memcpy(name, p->pend.p, nlen);
		name[nlen] = 0;
		rc = add_call(p, name, a, NULL, fn, ctx, err);
		rc = rc < 0 ? rc : 1;
	}
	json_decref(a);
	if (rc <= 0)
		return rc < 0 ? rc : settle_as_text(p, MISTRAL_OPEN, fn, ctx, err);
	sb_consume(&p->pend, off + end);
	p->st = ST_START;
	return 1;
}

static int step_json(struct chat_parser *p, bool final, chat_event_fn fn, void *ctx,
		     struct hearth_error *err)
{
	size_t end = json_value_end(p->pend.p, p->pend.len);
	if (!end) {
		if (!final)
			return 0;
		return settle_as_text(p, "", fn, ctx, err);
	}
	json_t *v = json_parse(p->pend.p, end);
	int rc = v ? take_json_reply(p, v, fn, ctx, err) : 0;
	json_decref(v);
	if (rc < 0)
		return rc;
	if (rc == 0)
		return settle_as_text(p, "", fn, ctx, err);
	sb_consume(&p->pend, end);
	p->st = ST_START;
	return 1;
}

/* <|python_tag|> then a JSON call, or code for the built-in python tool. */
static int step_python(struct chat_parser *p, bool final, chat_event_fn fn, void *ctx,
		       struct hearth_error *err)
{
	if (!skip_space(p))
		return final ? settle_as_text(p, LLAMA3_PYTHON_TAG, fn, ctx, err) : 0;
	if (p->pend.p[0] == '{') {
		p->st = ST_JSON;
		return 1;
	}
	if (!final)
		return 0;
	json_t *args = json_pack("{s:s%}", "code", p->pend.p, p->pend.len);
	int rc = args ? add_call(p, "python", args, NULL, fn, ctx, err)
		      : hearth_error_set(err, HEARTH_ENOMEM, "chat reply: out of memory");
	json_decref(args);
	if (rc < 0)
		return rc;
	sb_consume(&p->pend, p->pend.len);
	p->st = ST_TEXT;
	return 0;
}

static int step_start(struct chat_parser *p, bool final)
{
	if (!skip_space(p))
		return 0;
	const char *o = p->syn.think_open;
	size_t ol = strlen(o);
	if (ol && p->reasoning.len == 0 && p->content.len == 0) {
		size_t k = p->pend.len < ol ? p->pend.len : ol;
		if (!memcmp(p->pend.p, o, k)) {
			if (k < ol && !final)
				return 0;       /* might still be the opener */
			if (k == ol) {
				sb_consume(&p->pend, ol);
				p->st = ST_REASONING;
				return 1;
			}
		}
	}
	bool whole_json = p->syn.format == CHAT_FORMAT_LLAMA3 || p->syn.format == CHAT_FORMAT_GENERIC;
	/* Llama 3 separates several calls with ';'. */
	if (p->syn.format == CHAT_FORMAT_LLAMA3 && p->n_calls > 0 && p->pend.p[0] == ';') {
		sb_consume(&p->pend, 1);
		return 1;
	}
	p->st = whole_json && p->content.len == 0 && p->n_calls == 0 && p->pend.p[0] == '{' ? ST_JSON
											 : ST_CONTENT;
	/* After a call, a second one may follow in the same form. */
	if (whole_json && p->n_calls > 0 && p->pend.p[0] == '{')
		p->st = ST_JSON;
	return 1;
}

static int run(struct chat_parser *p, bool final, chat_event_fn fn, void *ctx, struct hearth_error *err)
{
	for (;;) {
		int rc;
		switch (p->st) {
		case ST_START: rc = step_start(p, final); break;
		case ST_CONTENT: rc = step_content(p, final, fn, ctx, err); break;
		case ST_REASONING: rc = step_reasoning(p, final, fn, ctx, err); break;
		case ST_HERMES: rc = step_hermes(p, final, fn, ctx, err); break;
		case ST_MISTRAL: rc = step_mistral(p, final, fn, ctx, err); break;
		case ST_JSON: rc = step_json(p, final, fn, ctx, err); break;
		case ST_PYTHON: rc = step_python(p, final, fn, ctx, err); break;
		case ST_TEXT:
			rc = emit_text(p, CHAT_EVENT_CONTENT, p->pend.p, p->pend.len, fn, ctx, err);
			if (rc == 0)
				sb_consume(&p->pend, p->pend.len);
			break;
		default: rc = 0;
		}
		if (rc <= 0)
			return rc;
	}
}

int chat_parser_new(struct chat_parser **out, const struct chat_syntax *s, struct hearth_error *err)
{
	struct chat_parser *p = calloc(1, sizeof *p);
	*out = NULL;
	if (!p)
		return hearth_error_set(err, HEARTH_ENOMEM, "chat reply: out of memory");
	p->syn = *s;
	p->st = s->in_reasoning && s->think_open[0] ? ST_REASONING : ST_START;
	/* Ids unique across a conversation's turns, as OpenAI's are: a tool result names the
	 * call it answers. */
	uint32_t r = 0;
	if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
		r = (uint32_t)(uintptr_t)p;
	snprintf(p->id_prefix, sizeof p->id_prefix, "call_%08x_", r);
	*out = p;
	return 0;
}

void chat_parser_free(struct chat_parser *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->n_calls; i++) {
		free(p->calls[i].id);
		free(p->calls[i].name);
		free(p->calls[i].arguments);
	}
	free(p->pend.p);
	free(p->content.p);
	free(p->reasoning.p);
	free(p);
}

int chat_parser_feed(struct chat_parser *p, const char *text, size_t len, chat_event_fn fn, void *ctx,
		     struct hearth_error *err)
{
	if (len > CHAT_PARSE_MAX_BYTES - p->total)
		return hearth_error_set(err, HEARTH_ERANGE, "chat reply: more than %u bytes",
					CHAT_PARSE_MAX_BYTES);
	p->total += len;
	int rc = sb_append(&p->pend, text, len, err);
	return rc < 0 ? rc : run(p, false, fn, ctx, err);
}

int chat_parser_finish(struct chat_parser *p, chat_event_fn fn, void *ctx, struct hearth_error *err)
{
	return run(p, true, fn, ctx, err);
}

/* Trailing whitespace is trimmed on read: while streaming it may still be followed by text. */
static const char *trimmed(const struct strbuf *b, size_t *len)
{
	size_t n = b->len;
	while (n && is_space(b->p[n - 1]))
		n--;
	*len = n;
	return b->p ? b->p : "";
}

const char *chat_parser_content(const struct chat_parser *p, size_t *len)
{
	return trimmed(&p->content, len);
}

const char *chat_parser_reasoning(const struct chat_parser *p, size_t *len)
{
	return trimmed(&p->reasoning, len);
}

size_t chat_parser_n_calls(const struct chat_parser *p)
{
	return p->n_calls;
}

const struct chat_tool_call *chat_parser_call(const struct chat_parser *p, size_t i)
{
	return i < p->n_calls ? &p->calls[i] : NULL;
}
