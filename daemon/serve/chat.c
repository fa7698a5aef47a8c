/* The chat request in the service (chat.h): templates read with the model, a conversation
 * from the wire turned into JSON for the template engine and into prompt tokens, and the
 * reply parsed on the compute thread as tokens come, its deltas handed to the loop thread
 * through the session's private ring. Message text never becomes control tokens: the
 * rendering marks it, and chat_text_tokenize reads special tokens only outside it. */
#include "daemon/serve/chat.h"

#include "daemon/engine/json_schema.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHAT_TEMPLATE_FILE_MAX (1u << 20)
#define DELTA_QUEUE_MAX (8u << 20)      /* bytes of deltas waiting for room in the ring */
#define NAMED_PREFIX "tokenizer.chat_template."

struct serve_chat {
	struct chat_parser *parser;
	bool parse_calls;               /* tools given and tool_choice is not "none" */
	uint32_t next_index;            /* the next token index to feed: each is fed once */
	/* Deltas not yet in the ring, as ready-made record payloads, oldest first. */
	uint8_t *queue;
	size_t queue_len, queue_cap;
	size_t queue_bytes_total;
	/* UTF-8 held back per text kind, so no delta ends inside a character. */
	char carry[2][4];
	size_t n_carry[2];
	/* Deltas the parser produced since the last push: built by the event callback. */
	uint64_t req_id;
	bool oom;
	struct msg_chat_call *calls;    /* done's view of the parsed calls */
	char *tool_grammar;             /* GBNF the calls are held to, or NULL */
	const char *trigger;            /* "" from the first token, else the opener */
};

/* ---- templates ---- */

static int template_take(struct serve_chat_template *t, const char *name, const char *src, size_t len,
			 const char *origin, struct hearth_error *err)
{
	snprintf(t->name, sizeof t->name, "%s", name);
	t->source = malloc(len + 1);
	if (!t->source)
		return hearth_error_set(err, HEARTH_ENOMEM, "%s: out of memory for the chat template", origin);
	memcpy(t->source, src, len);
	t->source[len] = 0;
	int rc = chat_template_new(&t->tmpl, src, len, origin, err);
	if (rc < 0) {
		free(t->source);
		t->source = NULL;
	}
	return rc;
}

static void template_free(struct serve_chat_template *t)
{
	chat_template_free(t->tmpl);
	free(t->source);
	memset(t, 0, sizeof *t);
}

static int read_file(const char *path, char **out, size_t *len, struct hearth_error *err)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return hearth_error_errno(err, HEARTH_EIO, errno, "chat_template %s", path);
	char *buf = malloc(CHAT_TEMPLATE_FILE_MAX + 1);
	size_t n = buf ? fread(buf, 1, CHAT_TEMPLATE_FILE_MAX + 1, f) : 0;
	bool bad = ferror(f);
	fclose(f);
	if (!buf)
		return hearth_error_set(err, HEARTH_ENOMEM, "chat_template %s: out of memory", path);
	if (bad || n > CHAT_TEMPLATE_FILE_MAX) {
		free(buf);
		return hearth_error_set(err, bad ? HEARTH_EIO : HEARTH_ERANGE, "chat_template %s: %s", path,
					bad ? "read failed" : "larger than 1 MiB");
	}
	buf[n] = 0;
	*out = buf;
	*len = n;
	return 0;
}

static void token_text(const struct tok *tok, int32_t id, char *buf, size_t cap)
{
	buf[0] = 0;
	if (id == TOK_NULL)
		return;
	size_t n = tok_piece(tok, id, true, buf, cap - 1);
	buf[n < cap ? n : 0] = 0;
}

int serve_chat_model_load(struct serve_chat_model *cm, const struct gguf_file *f, const struct tok *tok,
			  const char *file_path, struct hearth_error *err)
{
	memset(cm, 0, sizeof *cm);
	token_text(tok, tok_bos(tok), cm->bos, sizeof cm->bos);
	token_text(tok, tok_eos(tok), cm->eos, sizeof cm->eos);
	int rc;
	if (file_path && *file_path) {
		char *src = NULL;
		size_t len = 0;
		if ((rc = read_file(file_path, &src, &len, err)) < 0)
			return rc;
		rc = template_take(&cm->def, "", src, len, file_path, err);
		free(src);
		cm->origin = "file";
		return rc;
	}
	const struct gguf_kv *kv = f ? gguf_kv_find(f, "tokenizer.chat_template") : NULL;
	char origin[512];
	if (kv && kv->type == GGUF_VT_STRING && kv->str.len) {
		snprintf(origin, sizeof origin, "%s:tokenizer.chat_template", f->path);
		if ((rc = template_take(&cm->def, "", kv->str.ptr, kv->str.len, origin, err)) < 0)
			return rc;
		cm->origin = "model";
	} else {
		const char *src = chat_template_chatml();
		if ((rc = template_take(&cm->def, "", src, strlen(src), "built-in ChatML", err)) < 0)
			return rc;
		cm->origin = "chatml";
	}
	/* Named templates (tool_use, rag, ...) beside the default. */
	size_t plen = strlen(NAMED_PREFIX);
	for (uint64_t i = 0; f && i < f->n_kv && cm->n_named < SERVE_CHAT_NAMED_MAX; i++) {
		const struct gguf_kv *k = &f->kv[i];
		if (k->type != GGUF_VT_STRING || k->key.len <= plen || k->key.len - plen > MSG_NAME_MAX ||
		    memcmp(k->key.ptr, NAMED_PREFIX, plen))
			continue;
		char name[MSG_NAME_MAX + 1];
		memcpy(name, k->key.ptr + plen, k->key.len - plen);
		name[k->key.len - plen] = 0;
		snprintf(origin, sizeof origin, "%s:" NAMED_PREFIX "%s", f->path, name);
		if ((rc = template_take(&cm->named[cm->n_named], name, k->str.ptr, k->str.len, origin, err)) < 0) {
			serve_chat_model_free(cm);
			return rc;
		}
		cm->n_named++;
	}
	return 0;
}

void serve_chat_model_free(struct serve_chat_model *cm)
{
	template_free(&cm->def);
	for (size_t i = 0; i < cm->n_named; i++)
		template_free(&cm->named[i]);
	cm->n_named = 0;
}

/* ---- tool-call grammars ---- */

/* One call as JSON Schema: {"name": const, args_key: the tool's parameters}. */
static json_t *call_schema(json_t *tool, const char *args_key)
{
	json_t *fn = json_object_get(tool, "function");
	json_t *params = json_object_get(fn, "parameters");
	json_t *args = json_is_object(params) ? json_deep_copy(params) : json_pack("{s:s}", "type", "object");
	return json_pack("{s:s,s:{s:{s:O},s:o},s:[s,s],s:b}", "type", "object", "properties", "name", "const",
			 json_object_get(fn, "name"), args_key, args, "required", "name", args_key,
			 "additionalProperties", 0);
}

/* The GBNF of the calls a family writes, with the call rule from the tools' schemas. */
static int tool_grammar_build(struct serve_chat *sc, const json_t *tools, const char *choice,
			      enum chat_format fmt, struct hearth_error *e)
{
	bool required = strcmp(choice, "auto") != 0;
	bool named = required && strcmp(choice, "required") != 0;
	const char *args_key = fmt == CHAT_FORMAT_LLAMA3 ? "parameters" : "arguments";
	json_t *any = json_array();
	size_t i;
	json_t *t;
	json_array_foreach(tools, i, t) {
		const char *name = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
		if (!named || (name && !strcmp(name, choice)))
			json_array_append_new(any, call_schema(t, args_key));
	}
	json_t *schema = json_array_size(any) == 1 ? json_incref(json_array_get(any, 0)) : json_pack("{s:O}", "anyOf", any);
	json_decref(any);
	char *call = NULL;
	int rc = json_schema_to_gbnf(schema, &call, e);
	json_decref(schema);
	if (rc < 0) {
		hearth_error_prefix(e, "tools: a parameters schema");
		return rc;
	}
	/* The converter's root is the call; the family's wrapping becomes the root. */
	char *at = strstr(call, "root ::=");
	if (!at || (at != call && at[-1] != '\n')) {
		free(call);
		return hearth_error_set(e, HEARTH_EINVAL, "tools: the call grammar has no root rule");
	}
	memcpy(at, "call", 4); /* "root ::=" and "call ::=" have one length */
	const char *root, *trigger = "";
	switch (fmt) {
	case CHAT_FORMAT_HERMES:
		root = required ? "root ::= \"<tool_call>\\n\" call \"\\n</tool_call>\" (\"\\n<tool_call>\\n\" call \"\\n</tool_call>\")*\n"
				: "root ::= \"\\n\"? call \"\\n</tool_call>\" (\"\\n<tool_call>\\n\" call \"\\n</tool_call>\")*\n";
		trigger = required ? "" : "<tool_call>";
		break;
	case CHAT_FORMAT_MISTRAL:
		root = required ? "root ::= \"[TOOL_CALLS][\" call (\", \" call)* \"]\"\n"
				: "root ::= \"[\" call (\", \" call)* \"]\"\n";
		trigger = required ? "" : "[TOOL_CALLS]";
		break;
	case CHAT_FORMAT_LLAMA3:
		root = "root ::= call\n";
		break;
	default:
		root = "root ::= \"{\\\"tool_call\\\": \" call \"}\"\n";
		break;
	}
	/* Without a trigger, free text comes first: only a required call can be held to from
	 * the start in families that write a call as bare JSON. */
	if (!required && !*trigger) {
		free(call);
		return 0;
	}
	size_t n = strlen(root) + strlen(call) + 1;
	sc->tool_grammar = malloc(n);
	if (!sc->tool_grammar) {
		free(call);
		return hearth_error_set(e, HEARTH_ENOMEM, "out of memory for the tools' grammar");
	}
	snprintf(sc->tool_grammar, n, "%s%s", root, call);
	sc->trigger = trigger;
	free(call);
	return 0;
}

const char *serve_chat_tool_grammar(const struct serve_chat *sc, const char **trigger)
{
	*trigger = sc->trigger ? sc->trigger : "";
	return sc->tool_grammar;
}

/* ---- the conversation as the template sees it ---- */

static json_t *str_json(struct msg_bytes b)
{
	return json_stringn(b.ptr ? b.ptr : "", b.len);
}

/* JSON text from the wire, parsed; what must be (object, array) is checked. */
static json_t *parse_json(struct msg_bytes b, const char *what, bool want_array, struct hearth_error *e)
{
	json_error_t je;
	json_t *v = json_loadb(b.ptr, b.len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
	if (!v) {
		hearth_error_set(e, HEARTH_EINVAL, "%s is not JSON: %s (column %d)", what, je.text, je.column);
		return NULL;
	}
	if (want_array ? !json_is_array(v) : !json_is_object(v)) {
		hearth_error_set(e, HEARTH_EINVAL, "%s must be a JSON %s", what, want_array ? "array" : "object");
		json_decref(v);
		return NULL;
	}
	return v;
}

/* A wire call as OpenAI-style JSON: {"id", "type": "function", "function": {"name",
 * "arguments"}} with arguments an object, as templates index into them. */
static json_t *call_json(const struct msg_chat_call *c, size_t mi, size_t ci, struct hearth_error *e)
{
	char what[96];
	snprintf(what, sizeof what, "messages[%zu].tool_calls[%zu].arguments", mi, ci);
	json_t *args = c->arguments.len ? parse_json(c->arguments, what, false, e) : json_object();
	if (!args)
		return NULL;
	json_t *j = json_pack("{s:s,s:{s:o,s:o}}", "type", "function", "function", "name", str_json(c->name),
			      "arguments", args);
	if (j && c->id.len)
		json_object_set_new(j, "id", str_json(c->id));
	return j;
}

static json_t *messages_json(const struct msg_chat *c, struct hearth_error *e)
{
	json_t *arr = json_array();
	for (size_t i = 0; arr && i < c->n_messages; i++) {
		const struct msg_chat_message *m = &c->messages[i];
		json_t *o = json_pack("{s:o}", "role", str_json(m->role));
		if (!o)
			goto oom;
		/* An assistant turn with only tool calls has content null, as OpenAI clients send it. */
		json_object_set_new(o, "content", m->has_content ? str_json(m->content) : json_null());
		if (m->has_name)
			json_object_set_new(o, "name", str_json(m->name));
		if (m->has_tool_call_id)
			json_object_set_new(o, "tool_call_id", str_json(m->tool_call_id));
		if (m->has_reasoning)
			json_object_set_new(o, "reasoning_content", str_json(m->reasoning_content));
		if (m->n_tool_calls) {
			json_t *calls = json_array();
			for (size_t k = 0; k < m->n_tool_calls; k++) {
				json_t *cj = call_json(&m->tool_calls[k], i, k, e);
				if (!cj) {
					json_decref(calls);
					json_decref(o);
					json_decref(arr);
					return NULL;
				}
				json_array_append_new(calls, cj);
			}
			json_object_set_new(o, "tool_calls", calls);
		}
		json_array_append_new(arr, o);
	}
	if (arr)
		return arr;
oom:
	json_decref(arr);
	hearth_error_set(e, HEARTH_ENOMEM, "out of memory for the conversation");
	return NULL;
}

/* tools: an array of {"type": "function", "function": {"name", ...}}; tool_choice names one. */
static int tools_check(const json_t *tools, const struct msg_chat *c, struct hearth_error *e)
{
	size_t i;
	json_t *t;
	bool named_found = false;
	const char *choice = c->has_tool_choice ? c->tool_choice.ptr : "auto";
	bool named = strcmp(choice, "auto") && strcmp(choice, "none") && strcmp(choice, "required");
	json_array_foreach(tools, i, t) {
		const char *name = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
		if (!json_is_object(t) || !name || !*name)
			return hearth_error_set(e, HEARTH_EINVAL,
						"tools[%zu] must be {\"type\": \"function\", \"function\": {\"name\", ...}}", i);
		if (named && !strcmp(name, choice))
			named_found = true;
	}
	if (named && !named_found)
		return hearth_error_set(e, HEARTH_EINVAL, "tool_choice names '%s', which is not one of the tools", choice);
	return 0;
}

static const struct serve_chat_template *template_for(const struct serve_chat_model *cm, const struct msg_chat *c,
						      struct hearth_error *e)
{
	if (!c->has_template)
		return &cm->def;
	for (size_t i = 0; i < cm->n_named; i++)
		if (strlen(cm->named[i].name) == c->template_name.len &&
		    !memcmp(cm->named[i].name, c->template_name.ptr, c->template_name.len))
			return &cm->named[i];
	hearth_error_set(e, HEARTH_EINVAL, "template '%.*s': the model has no such named template",
			 (int)c->template_name.len, c->template_name.ptr);
	return NULL;
}

int serve_chat_prepare(const struct serve_chat_model *cm, const struct tok *tok, const struct msg_chat *c,
		       uint32_t max_ctx, int32_t **prompt, uint32_t *n_prompt, struct serve_chat **out,
		       enum msg_errcode *code, struct hearth_error *e)
{
	*code = MSG_ERR_BAD_FIELD;
	*out = NULL;
	*prompt = NULL;
	const struct serve_chat_template *st = template_for(cm, c, e);
	if (!st)
		return HEARTH_EINVAL;
	json_t *messages = NULL, *tools = NULL, *vars = NULL;
	int rc = HEARTH_EINVAL;
	struct chat_text text = { 0 };
	struct serve_chat *sc = NULL;
	int32_t *ids = NULL;
	if (!(messages = messages_json(c, e)))
		goto out;
	if (c->has_tools && (!(tools = parse_json(c->tools, "tools", true, e)) || tools_check(tools, c, e) < 0))
		goto out;
	if (c->has_vars && !(vars = parse_json(c->vars, "vars", false, e)))
		goto out;
	struct chat_render_opts ro = { .messages = messages, .tools = tools && json_array_size(tools) ? tools : NULL,
				       .add_generation_prompt = c->add_generation_prompt, .vars = vars,
				       .bos_token = cm->bos, .eos_token = cm->eos, .now = -1 };
	if ((rc = chat_template_render(st->tmpl, &ro, &text, e)) < 0)
		goto out;
	size_t cap = text.len + 8 < (size_t)max_ctx + 8 ? text.len + 8 : (size_t)max_ctx + 8;
	size_t n = 0;
	ids = malloc(cap * sizeof *ids);
	if (!ids) {
		rc = hearth_error_set(e, HEARTH_ENOMEM, "out of memory for the prompt");
		*code = MSG_ERR_INTERNAL;
		goto out;
	}
	rc = chat_text_tokenize(tok, &text, false, ids, cap, &n, e);
	if (rc == HEARTH_ERANGE || (rc == 0 && n >= max_ctx)) {
		*code = MSG_ERR_CONTEXT;
		rc = hearth_error_set(e, HEARTH_ERANGE, "the rendered conversation is longer than max_context (%u tokens)",
				      max_ctx);
		goto out;
	}
	if (rc < 0)
		goto out;
	if (n == 0) {
		rc = hearth_error_set(e, HEARTH_EINVAL, "the rendered conversation is empty");
		goto out;
	}
	sc = calloc(1, sizeof *sc);
	if (!sc) {
		rc = hearth_error_set(e, HEARTH_ENOMEM, "out of memory for a chat");
		*code = MSG_ERR_INTERNAL;
		goto out;
	}
	struct chat_syntax syn;
	chat_syntax_init(&syn, st->source, text.text, text.len);
	sc->parse_calls = tools && json_array_size(tools) &&
			  !(c->has_tool_choice && c->tool_choice.len == 4 && !memcmp(c->tool_choice.ptr, "none", 4));
	if (!sc->parse_calls)
		syn.format = CHAT_FORMAT_PLAIN;
	else if (syn.format == CHAT_FORMAT_PLAIN)
		syn.format = CHAT_FORMAT_GENERIC; /* a template without tool markers: calls as JSON */
	if (sc->parse_calls && !c->gen.has_grammar && !c->gen.has_json_schema && !c->gen.json_object &&
	    (rc = tool_grammar_build(sc, tools, c->has_tool_choice ? c->tool_choice.ptr : "auto", syn.format, e)) < 0)
		goto out;
	if ((rc = chat_parser_new(&sc->parser, &syn, e)) < 0) {
		*code = MSG_ERR_INTERNAL;
		goto out;
	}
	*out = sc;
	sc = NULL;
	*prompt = ids;
	ids = NULL;
	*n_prompt = (uint32_t)n;
	rc = 0;
out:
	serve_chat_free(sc);
	free(ids);
	chat_text_free(&text);
	json_decref(messages);
	json_decref(tools);
	json_decref(vars);
	return rc;
}

/* ---- deltas ---- */

/* Record payload: u64 req_id | u32 kind (1 content, 2 reasoning, 3 tool_call) | u32 index |
 * u32 len0 | u32 len1 | u32 len2 | u32 len3 | text, id, name, arguments. */
#define DELTA_HEADER 32u

static void queue_delta(struct serve_chat *sc, uint32_t kind, uint32_t index, const char *s[4], const size_t n[4])
{
	size_t total = DELTA_HEADER + n[0] + n[1] + n[2] + n[3];
	if (sc->queue_bytes_total + total > DELTA_QUEUE_MAX) {
		sc->oom = true; /* the reply's text is still in done's message */
		return;
	}
	size_t need = sc->queue_len + 4 + total;
	if (need > sc->queue_cap) {
		size_t cap = sc->queue_cap ? sc->queue_cap * 2 : 4096;
		while (cap < need)
			cap *= 2;
		uint8_t *q = realloc(sc->queue, cap);
		if (!q) {
			sc->oom = true;
			return;
		}
		sc->queue = q;
		sc->queue_cap = cap;
	}
	uint8_t *p = sc->queue + sc->queue_len;
	uint32_t t32 = (uint32_t)total;
	memcpy(p, &t32, 4);
	p += 4;
	uint32_t hdr[6] = { kind, index, (uint32_t)n[0], (uint32_t)n[1], (uint32_t)n[2], (uint32_t)n[3] };
	memcpy(p, &sc->req_id, 8);
	memcpy(p + 8, hdr, sizeof hdr);
	p += DELTA_HEADER;
	for (int i = 0; i < 4; i++) {
		if (n[i])
			memcpy(p, s[i], n[i]);
		p += n[i];
	}
	sc->queue_len += 4 + total;
	sc->queue_bytes_total += total;
}

/* Bytes of s that end on a character boundary: an incomplete trailing sequence waits. */
static size_t utf8_complete(const char *s, size_t n)
{
	size_t i = n, back = 0;
	while (i > 0 && back < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) {
		i--;
		back++;
	}
	if (i == 0)
		return n;
	unsigned char lead = (unsigned char)s[i - 1];
	size_t want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
	return back + 1 < want ? i - 1 : n;
}

static void queue_text(struct serve_chat *sc, int k, uint32_t kind, const char *text, size_t len, bool flush)
{
	char buf[4096 + 4];
	while (len || (flush && sc->n_carry[k])) {
		size_t take = len < 4096 ? len : 4096;
		size_t m = sc->n_carry[k];
		memcpy(buf, sc->carry[k], m);
		memcpy(buf + m, text, take);
		m += take;
		text += take;
		len -= take;
		size_t ok = flush && !len ? m : utf8_complete(buf, m);
		sc->n_carry[k] = m - ok;
		memcpy(sc->carry[k], buf + ok, m - ok);
		if (ok) {
			const char *s[4] = { buf, "", "", "" };
			const size_t n[4] = { ok, 0, 0, 0 };
			queue_delta(sc, kind, 0, s, n);
		}
		if (!len)
			break;
	}
}

static int on_event(void *ctx, const struct chat_event *ev)
{
	struct serve_chat *sc = ctx;
	if (ev->kind == CHAT_EVENT_TOOL_CALL) {
		const struct chat_tool_call *c = ev->call;
		const char *s[4] = { "", c->id, c->name, c->arguments };
		const size_t n[4] = { 0, strlen(c->id), strlen(c->name), strlen(c->arguments) };
		queue_delta(sc, 3, (uint32_t)ev->index, s, n);
	} else {
		int k = ev->kind == CHAT_EVENT_REASONING;
		queue_text(sc, k, k ? 2 : 1, ev->text, ev->len, false);
	}
	return 0;
}

/* Moves queued deltas into the ring while they fit. */
static void push_queue(struct serve_chat *sc, struct ring *r)
{
	size_t off = 0;
	bool pushed = false;
	while (off < sc->queue_len) {
		uint32_t len;
		memcpy(&len, sc->queue + off, 4);
		if (ring_push(r, SERVE_CHAT_DELTA_REC, sc->queue + off + 4, len, NULL) < 0)
			break;
		off += 4 + len;
		pushed = true;
	}
	memmove(sc->queue, sc->queue + off, sc->queue_len - off);
	sc->queue_len -= off;
	if (pushed)
		ring_notify(r, NULL);
}

void serve_chat_feed(struct serve_chat *sc, struct ring *r, uint64_t req_id, uint32_t index, const char *text,
		     size_t len)
{
	sc->req_id = req_id;
	if (index + 1 > sc->next_index && !sc->oom) {
		sc->next_index = index + 1;
		struct hearth_error e;
		if (chat_parser_feed(sc->parser, text, len, on_event, sc, &e) < 0)
			sc->oom = true;
	}
	if (r)
		push_queue(sc, r);
}

int serve_chat_delta_decode(const void *payload, size_t len, struct msg *out, struct hearth_error *e)
{
	const uint8_t *p = payload;
	uint64_t id;
	uint32_t h[6];
	if (len < DELTA_HEADER)
		return hearth_error_set(e, HEARTH_EFORMAT, "chat delta record of %zu bytes", len);
	memcpy(&id, p, 8);
	memcpy(h, p + 8, sizeof h);
	if ((size_t)h[2] + h[3] + h[4] + h[5] != len - DELTA_HEADER || h[0] < 1 || h[0] > 3)
		return hearth_error_set(e, HEARTH_EFORMAT, "chat delta record does not add up");
	msg_init(out, MSG_DELTA, id);
	struct msg_delta *d = &out->u.delta;
	static const char *const kinds[] = { "", "content", "reasoning", "tool_call" };
	d->kind = (struct msg_bytes){ kinds[h[0]], strlen(kinds[h[0]]) };
	d->index = h[1];
	const char *s = (const char *)p + DELTA_HEADER;
	struct msg_bytes parts[4];
	for (int i = 0; i < 4; i++) {
		parts[i] = (struct msg_bytes){ s, h[2 + i] };
		s += h[2 + i];
	}
	d->text = parts[0];
	if (h[0] == 3) {
		d->has_call = true;
		d->call = (struct msg_chat_call){ parts[1], parts[2], parts[3] };
	}
	return 0;
}

void serve_chat_finish(struct serve_chat *sc, uint64_t req_id, void (*send)(void *ctx, const struct msg *m),
		       void *ctx, struct msg_done *d)
{
	struct hearth_error e;
	sc->req_id = req_id;
	chat_parser_finish(sc->parser, on_event, sc, &e);
	queue_text(sc, 0, 1, "", 0, true);
	queue_text(sc, 1, 2, "", 0, true);
	for (size_t off = 0; off < sc->queue_len;) {
		uint32_t len;
		memcpy(&len, sc->queue + off, 4);
		struct msg m;
		if (serve_chat_delta_decode(sc->queue + off + 4, len, &m, &e) == 0)
			send(ctx, &m);
		off += 4 + len;
	}
	sc->queue_len = 0;
	size_t n;
	d->has_message = true;
	const char *content = chat_parser_content(sc->parser, &n);
	d->message.content = (struct msg_bytes){ content, n };
	const char *reasoning = chat_parser_reasoning(sc->parser, &n);
	d->message.reasoning_content = (struct msg_bytes){ reasoning, n };
	size_t nc = chat_parser_n_calls(sc->parser);
	if (nc) {
		struct msg_chat_call *calls = calloc(nc, sizeof *calls);
		if (calls) {
			for (size_t i = 0; i < nc; i++) {
				const struct chat_tool_call *c = chat_parser_call(sc->parser, i);
				calls[i] = (struct msg_chat_call){ { c->id, strlen(c->id) }, { c->name, strlen(c->name) },
								  { c->arguments, strlen(c->arguments) } };
			}
			free(sc->calls);
			sc->calls = calls;
			d->message.tool_calls = calls;
			d->message.n_tool_calls = nc;
		}
		if (d->finish == MSG_FINISH_STOP)
			d->finish = MSG_FINISH_TOOL_CALLS;
	}
}

void serve_chat_free(struct serve_chat *sc)
{
	if (!sc)
		return;
	chat_parser_free(sc->parser);
	free(sc->queue);
	free(sc->calls);
	free(sc->tool_grammar);
	free(sc);
}
