/* `hearthd-tool render-template`: renders a chat template over a conversation the way the
 * daemon will (same engine code), to check a model's template or a template file by hand
 * and in tests. The rendering goes to stdout; a template error to stderr with exit 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/engine/chat_template.h"
#include "daemon/engine/gguf.h"
#include "daemon/engine/tokenizer.h"
#include "daemon/tools/tools.h"

static void usage(FILE *to)
{
	fprintf(to,
		"usage: hearthd-tool render-template [--model M.gguf [--template-name NAME] | --template FILE]\n"
		"         --messages FILE.json [--tools FILE.json] [--no-generation-prompt]\n"
		"         [--var KEY=JSON]... [--now YYYY-MM-DDTHH:MM:SS[Z]]\n"
		"Renders the chat template (the model's tokenizer.chat_template[.NAME], or FILE) over the\n"
		"messages. bos_token/eos_token come from the model's vocabulary (empty with --template);\n"
		"--var sets any template variable, those two included. --now fixes strftime_now (UTC).\n");
}

static json_t *load_json(const char *path, const char *what)
{
	json_error_t je;
	json_t *j = json_load_file(path, 0, &je);
	if (!j)
		fprintf(stderr, "render-template: %s %s:%d: %s\n", what, path, je.line, je.text);
	return j;
}

/* The text of a special token of the vocabulary, or NULL. */
static char *token_text(const struct gguf_file *f, const char *id_key)
{
	uint32_t id;
	const struct gguf_kv *toks = gguf_kv_find(f, "tokenizer.ggml.tokens");
	if (!toks || gguf_get_u32(f, id_key, &id, NULL))
		return NULL;
	struct tok *t;
	if (tok_load(&t, f, NULL))
		return NULL;
	char buf[256];
	size_t n = tok_piece(t, (int32_t)id, true, buf, sizeof buf - 1);
	tok_free(t);
	if (n >= sizeof buf)
		return NULL;
	buf[n] = 0;
	return strdup(buf);
}

static int parse_now(const char *s, int64_t *out)
{
	struct tm tm = { 0 };
	const char *e = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
	if (!e)
		e = strptime(s, "%Y-%m-%d %H:%M:%S", &tm);
	if (!e || (*e && strcmp(e, "Z")))
		return -1;
	*out = (int64_t)timegm(&tm);
	return 0;
}

int tool_render(int argc, char **argv)
{
	const char *model = NULL, *name = NULL, *tpl_path = NULL, *msg_path = NULL, *tools_path = NULL;
	struct chat_render_opts o = { .add_generation_prompt = true, .now = -1 };
	json_t *vars = json_object(), *messages = NULL, *tools = NULL;
	char *src = NULL, *bos = NULL, *eos = NULL, origin[1024];
	size_t src_len = 0;
	int status = 2;
	struct chat_template *t = NULL;
	struct gguf_file *f = NULL;
	struct hearth_error err;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			status = 0;
			goto out;
		} else if (!strcmp(a, "--no-generation-prompt")) {
			o.add_generation_prompt = false;
			continue;
		}
		if (!v) {
			fprintf(stderr, "render-template: %s needs a value (or is unknown)\n", a);
			usage(stderr);
			goto out;
		}
		i++;
		if (!strcmp(a, "--model"))
			model = v;
		else if (!strcmp(a, "--template-name"))
			name = v;
		else if (!strcmp(a, "--template"))
			tpl_path = v;
		else if (!strcmp(a, "--messages"))
			msg_path = v;
		else if (!strcmp(a, "--tools"))
			tools_path = v;
		else if (!strcmp(a, "--now")) {
			if (parse_now(v, &o.now)) {
				fprintf(stderr, "render-template: --now '%s' is not YYYY-MM-DDTHH:MM:SS\n", v);
				goto out;
			}
		} else if (!strcmp(a, "--var")) {
			const char *eq = strchr(v, '=');
			json_error_t je;
			json_t *val = eq ? json_loads(eq + 1, JSON_DECODE_ANY, &je) : NULL;
			if (!val) {
				fprintf(stderr, "render-template: --var '%s' is not KEY=JSON\n", v);
				goto out;
			}
			char key[256];
			snprintf(key, sizeof key, "%.*s", (int)(eq - v), v);
			json_object_set_new(vars, key, val);
		} else {
			fprintf(stderr, "render-template: unknown option %s\n", a);
			usage(stderr);
			goto out;
		}
	}
	if (!msg_path || !!model == !!tpl_path) {
		fprintf(stderr, "render-template: give --messages and one of --model or --template\n");
		usage(stderr);
		goto out;
	}
	status = 1;
	if (!(messages = load_json(msg_path, "messages")))
		goto out;
	if (tools_path && !(tools = load_json(tools_path, "tools")))
		goto out;
	if (tpl_path) {
		if (tool_read_file(tpl_path, (size_t)64 << 20, &src, &src_len, &err) < 0) {
			fprintf(stderr, "render-template: %s\n", err.msg);
			goto out;
		}
		snprintf(origin, sizeof origin, "%s", tpl_path);
	} else {
		if (gguf_open(&f, model, &err)) {
			fprintf(stderr, "render-template: %s\n", err.msg);
			goto out;
		}
		char key[512];
		snprintf(key, sizeof key, name ? "tokenizer.chat_template.%s" : "tokenizer.chat_template", name);
		struct gguf_str s;
		if (gguf_get_str(f, key, &s, &err)) {
			fprintf(stderr, "render-template: %s: no %s\n", model, key);
			goto out;
		}
		src = malloc(s.len + 1);
		if (!src)
			goto out;
		memcpy(src, s.ptr, s.len);
		src_len = s.len;
		snprintf(origin, sizeof origin, "%s:%s", model, key);
		bos = token_text(f, "tokenizer.ggml.bos_token_id");
		eos = token_text(f, "tokenizer.ggml.eos_token_id");
	}
	if (chat_template_new(&t, src, src_len, origin, &err)) {
		fprintf(stderr, "%s\n", err.msg);
		goto out;
	}
	o.messages = messages;
	o.tools = tools;
	o.vars = vars;
	o.bos_token = bos ? bos : "";
	o.eos_token = eos ? eos : "";
	struct chat_text x;
	if (chat_template_render(t, &o, &x, &err)) {
		fprintf(stderr, "%s\n", err.msg);
		goto out;
	}
	fwrite(x.text, 1, x.len, stdout);
	chat_text_free(&x);
	status = fflush(stdout) ? 1 : 0;
out:
	chat_template_free(t);
	if (f)
		gguf_close(f);
	json_decref(vars);
	json_decref(messages);
	json_decref(tools);
	free(src);
	free(bos);
	free(eos);
	return status;
}
