/* `hearth chat`: a conversation with the model through hearthd's chat request (the model's
 * own template). One turn from the command line or stdin, or an interactive session on a
 * terminal: line editing and history (libedit), multi-line input, streaming replies, ^C to
 * stop a reply, /system /reset /save /load. The conversation is kept here as JSON (jansson),
 * in OpenAI's message shape, so /save files are what other tools read. */
#include <errno.h>
#include <histedit.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/cli.h"

#define CHAT_LINE_MAX (1u << 20)

enum { OPT_SYSTEM = 2000, OPT_MESSAGES, OPT_TOOLS, OPT_TOOL_CHOICE, OPT_VAR, OPT_NO_THINK };

struct chat_cli {
	struct cli *c;
	struct gen_args a;
	json_t *messages;         /* the conversation (OpenAI shape) */
	char *system;             /* the system prompt, or NULL */
	char *tools;              /* JSON text of the tools, or NULL */
	const char *tool_choice;
	json_t *vars;             /* template variables (object) */
	char *vars_text;
	bool tty;                 /* replies go to a terminal: reasoning is shown dimmed */
};

static char *slurp(const char *path, struct hearth_err *e)
{
	FILE *f = fopen(path, "re");
	if (!f) {
		snprintf(e->msg, sizeof e->msg, "%s: %s", path, strerror(errno));
		return NULL;
	}
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap);
	for (;;) {
		if (!buf)
			break;
		n += fread(buf + n, 1, cap - n - 1, f);
		if (n < cap - 1 || cap >= (64u << 20))
			break;
		char *nb = realloc(buf, cap * 2);
		if (!nb) {
			free(buf);
			buf = NULL;
			break;
		}
		buf = nb;
		cap *= 2;
	}
	fclose(f);
	if (!buf)
		snprintf(e->msg, sizeof e->msg, "%s: out of memory", path);
	else
		buf[n] = 0;
	return buf;
}

/* ---- the conversation ---- */

static void conv_reset(struct chat_cli *cc)
{
	json_array_clear(cc->messages);
	if (cc->system)
		json_array_append_new(cc->messages, json_pack("{s:s,s:s}", "role", "system", "content", cc->system));
}

static void conv_set_system(struct chat_cli *cc, const char *text)
{
	free(cc->system);
	cc->system = text && *text ? strdup(text) : NULL;
	json_t *first = json_array_get(cc->messages, 0);
	const char *role = json_string_value(json_object_get(first, "role"));
	if (role && !strcmp(role, "system"))
		json_array_remove(cc->messages, 0);
	if (cc->system)
		json_array_insert_new(cc->messages, 0, json_pack("{s:s,s:s}", "role", "system", "content", cc->system));
}

/* The conversation as libhearth takes it; strings borrowed from cc->messages. */
struct wire {
	struct hearth_message *m;
	struct hearth_tool_call *calls;
	char **args;              /* arguments objects written as JSON text */
	size_t n, n_calls;
};

static void wire_free(struct wire *w)
{
	for (size_t i = 0; i < w->n_calls; i++)
		free(w->args[i]);
	free(w->m);
	free(w->calls);
	free(w->args);
}

static int wire_of(json_t *msgs, struct wire *w)
{
	size_t n = json_array_size(msgs), total = 0, i;
	json_t *m;
	json_array_foreach(msgs, i, m)
		total += json_array_size(json_object_get(m, "tool_calls"));
	memset(w, 0, sizeof *w);
	w->m = calloc(n ? n : 1, sizeof *w->m);
	w->calls = calloc(total ? total : 1, sizeof *w->calls);
	w->args = calloc(total ? total : 1, sizeof *w->args);
	if (!w->m || !w->calls || !w->args)
		return -1;
	json_array_foreach(msgs, i, m) {
		struct hearth_message *hm = &w->m[w->n++];
		hm->role = json_string_value(json_object_get(m, "role"));
		hm->content = json_string_value(json_object_get(m, "content"));
		hm->name = json_string_value(json_object_get(m, "name"));
		hm->tool_call_id = json_string_value(json_object_get(m, "tool_call_id"));
		hm->reasoning_content = json_string_value(json_object_get(m, "reasoning_content"));
		json_t *tc = json_object_get(m, "tool_calls");
		size_t k;
		json_t *call;
		hm->tool_calls = w->calls + w->n_calls;
		json_array_foreach(tc, k, call) {
			json_t *fn = json_object_get(call, "function");
			json_t *args = json_object_get(fn, "arguments");
			struct hearth_tool_call *c = &w->calls[w->n_calls];
			c->id = json_string_value(json_object_get(call, "id"));
			c->name = json_string_value(json_object_get(fn, "name"));
			w->args[w->n_calls] = json_is_string(args) ? strdup(json_string_value(args))
								   : json_dumps(args ? args : json_object(), JSON_COMPACT);
			c->arguments = w->args[w->n_calls];
			w->n_calls++;
			hm->n_tool_calls++;
		}
	}
	return 0;
}

/* ---- one turn ---- */

struct turn {
	struct chat_cli *cc;
	bool in_reasoning;
	uint32_t n_tokens;
	double t0, t_first;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void show_delta(struct turn *t, const struct hearth_delta *d)
{
	struct chat_cli *cc = t->cc;
	if (cc->c->json)
		return;
	if (d->kind == HEARTH_DELTA_REASONING) {
		if (!cc->tty && !cc->c->verbose)
			return;
		if (!t->in_reasoning)
			fputs(cc->tty ? "\x1b[2m" : "[reasoning] ", stdout);
		t->in_reasoning = true;
		fwrite(d->text, 1, d->len, stdout);
	} else {
		if (t->in_reasoning)
			fputs(cc->tty ? "\x1b[0m\n" : "\n", stdout);
		t->in_reasoning = false;
		if (d->kind == HEARTH_DELTA_TOOL_CALL)
			printf("[tool call %s] %s(%s)\n", d->call.id, d->call.name, d->call.arguments);
		else
			fwrite(d->text, 1, d->len, stdout);
	}
	fflush(stdout);
}

static void print_json_reply(const struct hearth_chat_result *r)
{
	json_t *calls = json_array();
	for (size_t i = 0; i < r->n_tool_calls; i++)
		json_array_append_new(calls, json_pack("{s:s,s:s,s:s}", "id", r->tool_calls[i].id, "name",
						       r->tool_calls[i].name, "arguments", r->tool_calls[i].arguments));
	json_t *o = json_pack("{s:s?,s:s?,s:o,s:s,s:i,s:i,s:i,s:i,s:f,s:f}", "content", r->content, "reasoning_content",
			      r->reasoning_content, "tool_calls", calls, "finish", hearth_finish_name(r->gen.finish),
			      "n_prompt", (int)r->gen.n_prompt, "n_cached", (int)r->gen.n_cached, "n_gen",
			      (int)r->gen.n_gen, "n_forced", (int)r->gen.n_forced, "prefill_tps", r->gen.prefill_tps,
			      "decode_tps", r->gen.decode_tps);
	char *s = json_dumps(o, JSON_COMPACT);
	if (s)
		puts(s);
	free(s);
	json_decref(o);
}

/* Runs one assistant turn over the conversation and appends the reply to it. Returns 0, 1 on
 * an error (printed), or 130 when ^C stopped it (the partial reply is kept). */
static int turn_run(struct chat_cli *cc, struct hearth *h)
{
	struct wire w;
	struct hearth_err e = { 0 };
	if (wire_of(cc->messages, &w) < 0) {
		wire_free(&w);
		fprintf(stderr, "hearth: out of memory\n");
		return 1;
	}
	struct hearth_chat chat = { .messages = w.m, .n_messages = w.n, .tools = cc->tools,
				    .tool_choice = cc->tool_choice, .vars = cc->vars_text };
	struct hearth_gen *g;
	interrupted = 0;
	int rc = hearth_chat_start(h, &chat, &cc->a.p, &g, &e);
	wire_free(&w);
	if (rc < 0)
		return fail(&e);
	struct turn t = { .cc = cc, .t0 = now_s() };
	bool canceled = false;
	int status = 0;
	for (;;) {
		if (interrupted && !canceled) {
			canceled = true;
			hearth_cancel(g, NULL);
		}
		struct hearth_event ev;
		rc = hearth_chat_next(g, &ev, 200, &e);
		if (rc == HEARTH_ETIMEDOUT)
			continue;
		if (rc != 1) {
			status = rc < 0;
			break;
		}
		if (ev.kind == HEARTH_EVENT_TOKEN) {
			if (!t.n_tokens++)
				t.t_first = now_s();
		} else {
			show_delta(&t, ev.delta);
		}
	}
	struct hearth_chat_result res;
	struct hearth_err fe;
	int frc = hearth_chat_finish(g, &res, &fe);
	if (t.in_reasoning && cc->tty && !cc->c->json)
		fputs("\x1b[0m", stdout);
	if (status || frc < 0) {
		if (!cc->c->json)
			fputc('\n', stdout);
		return fail(status ? &e : &fe);
	}
	if (cc->c->json)
		print_json_reply(&res);
	else
		fputc('\n', stdout);
	fflush(stdout);
	json_t *reply = json_pack("{s:s,s:s}", "role", "assistant", "content", res.content ? res.content : "");
	if (res.reasoning_content && *res.reasoning_content)
		json_object_set_new(reply, "reasoning_content", json_string(res.reasoning_content));
	if (res.n_tool_calls) {
		json_t *calls = json_array();
		for (size_t i = 0; i < res.n_tool_calls; i++)
			json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", res.tool_calls[i].id, "type",
							       "function", "function", "name", res.tool_calls[i].name,
							       "arguments", res.tool_calls[i].arguments));
		json_object_set_new(reply, "tool_calls", calls);
	}
	json_array_append_new(cc->messages, reply);
	if (cc->c->verbose) {
		double dt = now_s() - (t.t_first ? t.t_first : t.t0);
		fprintf(stderr, "hearth: %s; prompt %u tokens at %.1f tok/s, %u tokens at %.1f tok/s (%.2f s to the "
			"first)\n", hearth_finish_name(res.gen.finish), res.gen.n_prompt, res.gen.prefill_tps,
			res.gen.n_gen, res.gen.n_gen > 1 && dt > 0 ? (res.gen.n_gen - 1) / dt : 0.0,
			t.t_first ? t.t_first - t.t0 : 0.0);
	}
	hearth_chat_result_free(&res);
	/* The ^C was for this reply; what the next read sees of it is handled there once. */
	if (!canceled)
		interrupted = 0;
	return canceled ? 130 : 0;
}

static int user_turn(struct chat_cli *cc, struct hearth *h, const char *text)
{
	json_array_append_new(cc->messages, json_pack("{s:s,s:s}", "role", "user", "content", text));
	return turn_run(cc, h);
}

/* ---- the interactive session ---- */

static const char *prompt_fn(EditLine *el)
{
	(void)el;
	return "> ";
}

static const char *cont_fn(EditLine *el)
{
	(void)el;
	return ". ";
}

static void repl_help(void)
{
	puts("Type a message and Enter to send it. End a line with \\ to go on to the next one, or type\n"
	     "\"\"\" to start and end a block of several lines. ^C stops a reply; ^D leaves.\n"
	     "  /system TEXT   set the system prompt (empty: none) and keep the conversation\n"
	     "  /reset         start over (the system prompt stays)\n"
	     "  /save FILE     write the conversation as JSON (OpenAI's message shape)\n"
	     "  /load FILE     read a conversation written by /save\n"
	     "  /help, /quit");
}

static void repl_command(struct chat_cli *cc, const char *line)
{
	struct hearth_err e = { 0 };
	if (!strncmp(line, "/system", 7) && (line[7] == 0 || line[7] == ' ')) {
		conv_set_system(cc, line[7] ? line + 8 : "");
		printf("(system prompt %s)\n", cc->system ? "set" : "cleared");
	} else if (!strcmp(line, "/reset")) {
		conv_reset(cc);
		puts("(conversation cleared)");
	} else if (!strncmp(line, "/save ", 6)) {
		if (json_dump_file(cc->messages, line + 6, JSON_INDENT(2)) < 0)
			fprintf(stderr, "hearth: cannot write %s: %s\n", line + 6, strerror(errno));
		else
			printf("(%zu messages saved to %s)\n", json_array_size(cc->messages), line + 6);
	} else if (!strncmp(line, "/load ", 6)) {
		char *text = slurp(line + 6, &e);
		json_error_t je;
		json_t *v = text ? json_loads(text, 0, &je) : NULL;
		free(text);
		if (!v || !json_is_array(v)) {
			fprintf(stderr, "hearth: %s: %s\n", line + 6, !text ? e.msg : v ? "not a JSON array" : je.text);
		} else {
			json_decref(cc->messages);
			cc->messages = json_incref(v);
			printf("(%zu messages loaded)\n", json_array_size(v));
		}
		json_decref(v);
	} else if (!strcmp(line, "/help")) {
		repl_help();
	} else {
		fprintf(stderr, "hearth: unknown command %s (/help lists them)\n", line);
	}
}

/* Reads one message: a line, lines joined by a trailing backslash, or a """ block. NULL at
 * the end of input. */
static char *repl_read(EditLine *el, History *hist)
{
	HistEvent he;
	char *msg = NULL;
	size_t len = 0;
	bool block = false, more = false;
	for (;;) {
		el_set(el, EL_PROMPT, (block || more) ? cont_fn : prompt_fn);
		int n;
		errno = 0;
		const char *line = el_gets(el, &n);
		if (!line && (n < 0 || errno == EINTR || interrupted)) {
			/* A ^C that stopped the last reply (its signal can still end the next read),
			 * or one at the prompt: not the end of input. Once only: ^D still leaves. */
			interrupted = 0;
			el_reset(el);
			continue;
		}
		interrupted = 0; /* a line came: an earlier ^C is spent */
		if (!line) {
			if (msg && len)
				return msg;
			free(msg);
			return NULL;
		}
		size_t l = strlen(line);
		while (l && (line[l - 1] == '\n' || line[l - 1] == '\r'))
			l--;
		if (l == 3 && !memcmp(line, "\"\"\"", 3)) {
			if (block)
				break;
			block = true;
			continue;
		}
		more = !block && l && line[l - 1] == '\\';
		if (more)
			l--;
		if (len + l + 2 > CHAT_LINE_MAX) {
			fprintf(stderr, "hearth: message longer than %u bytes\n", CHAT_LINE_MAX);
			free(msg);
			return strdup("");
		}
		char *nm = realloc(msg, len + l + 2);
		if (!nm) {
			free(msg);
			return NULL;
		}
		msg = nm;
		if (len)
			msg[len++] = '\n';
		memcpy(msg + len, line, l);
		len += l;
		msg[len] = 0;
		if (!block && !more)
			break;
	}
	if (msg && *msg)
		history(hist, &he, H_ENTER, msg);
	return msg ? msg : strdup("");
}

static int repl(struct chat_cli *cc, struct hearth *h)
{
	EditLine *el = el_init("hearth", stdin, stdout, stderr);
	History *hist = history_init();
	HistEvent he;
	char path[4096] = "";
	const char *home = getenv("HOME");
	if (home)
		snprintf(path, sizeof path, "%s/.hearth_history", home);
	history(hist, &he, H_SETSIZE, 1000);
	if (path[0])
		history(hist, &he, H_LOAD, path);
	el_set(el, EL_HIST, history, hist);
	el_set(el, EL_EDITOR, "emacs");
	el_set(el, EL_SIGNAL, 1);
	struct hearth_model mi;
	if (hearth_model_info(h, &mi, NULL) == 0)
		printf("hearth chat with %s (%s template). /help for commands, ^D to leave.\n",
		       mi.name[0] ? mi.name : mi.arch, mi.chat_template[0] ? mi.chat_template : "model");
	for (;;) {
		char *msg = repl_read(el, hist);
		if (!msg)
			break;
		if (*msg == '/')
			repl_command(cc, msg);
		else if (*msg)
			user_turn(cc, h, msg);
		free(msg);
	}
	fputc('\n', stdout);
	if (path[0])
		history(hist, &he, H_SAVE, path);
	history_end(hist);
	el_end(el);
	return 0;
}

/* ---- the command ---- */

static int chat_parse(struct chat_cli *cc, int argc, char **argv)
{
	static const struct option opts[] = {
		COMMON_OPTIONS,
		GEN_OPTIONS,
		{ "system", required_argument, NULL, OPT_SYSTEM },
		{ "messages", required_argument, NULL, OPT_MESSAGES },
		{ "tools", required_argument, NULL, OPT_TOOLS },
		{ "tool-choice", required_argument, NULL, OPT_TOOL_CHOICE },
		{ "var", required_argument, NULL, OPT_VAR },
		{ "no-think", no_argument, NULL, OPT_NO_THINK },
		{ 0 },
	};
	struct hearth_err e = { 0 };
	int opt, rc;
	memset(&cc->a, 0, sizeof cc->a);
	cc->a.p = hearth_gen_params_default();
	cc->a.p.max_tokens = 0; /* up to the context: a reply ends where the model ends it */
	while ((opt = getopt_long(argc, argv, "+n:vhV", opts, NULL)) != -1) {
		if (common_option(cc->c, opt, optarg, &rc)) {
			if (rc)
				return rc;
			continue;
		}
		switch (opt) {
		case OPT_SYSTEM:
			conv_set_system(cc, optarg);
			break;
		case OPT_MESSAGES: {
			json_error_t je;
			json_t *v = json_load_file(optarg, 0, &je);
			if (!json_is_array(v)) {
				json_decref(v);
				return usage_error("--messages %s: not a JSON array of messages (%s)", optarg,
						   v ? "" : je.text);
			}
			json_t *sys = json_incref(json_array_get(cc->messages, 0));
			json_decref(cc->messages);
			cc->messages = v;
			/* a --system given before keeps its place in front */
			if (sys && cc->system)
				json_array_insert(cc->messages, 0, sys);
			json_decref(sys);
			break;
		}
		case OPT_TOOLS: {
			free(cc->tools);
			if (!(cc->tools = slurp(optarg, &e)))
				return usage_error("--tools: %s", e.msg);
			json_error_t je;
			json_t *v = json_loads(cc->tools, 0, &je);
			bool ok = json_is_array(v);
			json_decref(v);
			if (!ok)
				return usage_error("--tools %s: not a JSON array of tools (%s)", optarg, v ? "" : je.text);
			break;
		}
		case OPT_TOOL_CHOICE:
			cc->tool_choice = optarg;
			break;
		case OPT_VAR: {
			const char *eq = strchr(optarg, '=');
			json_error_t je;
			json_t *v = eq ? json_loads(eq + 1, JSON_DECODE_ANY, &je) : NULL;
			if (!eq || eq == optarg || !v)
				return usage_error("--var wants KEY=JSON (e.g. enable_thinking=false), not \"%s\"", optarg);
			json_object_setn_new(cc->vars, optarg, (size_t)(eq - optarg), v);
			break;
		}
		case OPT_NO_THINK:
			json_object_set_new(cc->vars, "enable_thinking", json_false());
			break;
		default:
			if ((rc = gen_option(cc->c, &cc->a, opt, optarg)))
				return rc;
		}
	}
	gen_args_finish(&cc->a);
	if (json_object_size(cc->vars))
		cc->vars_text = json_dumps(cc->vars, JSON_COMPACT);
	return 0;
}

int cmd_chat(struct cli *c, int argc, char **argv)
{
	struct chat_cli cc = { .c = c, .messages = json_array(), .vars = json_object() };
	int rc = chat_parse(&cc, argc, argv);
	struct hearth *h = NULL;
	struct hearth_err e = { 0 };
	char *text = NULL;
	if (rc)
		goto out;
	if (argc - optind > 1) {
		rc = usage_error("chat takes at most one MESSAGE (quote it; - reads stdin)");
		goto out;
	}
	bool one_shot = argc - optind == 1 || !isatty(STDIN_FILENO);
	if (one_shot) {
		const char *arg = argc - optind == 1 ? argv[optind] : "-";
		size_t len;
		text = strcmp(arg, "-") ? strdup(arg) : read_stdin(&len, &e);
		if (!text) {
			rc = fail(&e);
			goto out;
		}
	}
	cc.tty = isatty(STDOUT_FILENO);
	if (cli_connect(c, true, &h, &e) < 0) {
		rc = fail(&e);
		goto out;
	}
	struct hearth_model mi;
	if (cc.a.p.max_tokens == 0)
		cc.a.p.max_tokens = hearth_model_info(h, &mi, NULL) == 0 && mi.n_ctx ? mi.n_ctx : 4096;
	/* ^C stops the reply being written, not the program (a second one, outside a reply,
	 * leaves the interactive session through libedit). */
	struct sigaction sa = { .sa_handler = on_sigint };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	rc = one_shot ? user_turn(&cc, h, text) : repl(&cc, h);
	if (one_shot && rc == 130)
		rc = 1;
out:
	hearth_close(h);
	free(text);
	free(cc.system);
	free(cc.tools);
	free(cc.vars_text);
	gen_args_free(&cc.a);
	json_decref(cc.messages);
	json_decref(cc.vars);
	return rc < 0 ? 0 : rc;
}
