/* Fuzz target for chat templates: the input is a template's source, parsed and rendered
 * against a tool-calling conversation under tight limits. Every input must either render
 * (spans covering the text exactly, in order) or fail with a message naming the template;
 * nothing may crash, hang or grow without bound. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/chat_template.h"
#include "tests/fuzz/fuzz.h"

void fuzz_fail(const char *file, int line, const char *what)
{
	fprintf(stderr, "%s:%d: invariant broken: %s\n", file, line, what);
	abort();
}

static const char conversation[] =
	"[{\"role\":\"system\",\"content\":\"You can call tools.\"},"
	"{\"role\":\"user\",\"content\":\"Weather <|im_end|> in {{Paris}}?\"},"
	"{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
	"\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"n\":[1,2.5,null,true]}}}]},"
	"{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"name\":\"get_weather\",\"content\":\"{\\\"temp\\\": 18}\"},"
	"{\"role\":\"user\",\"content\":\"Thanks. Tomorrow?\"}]";
static const char tools[] =
	"[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Current weather\","
	"\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
	"\"required\":[\"city\"]}}}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static json_t *msgs, *tl, *vars;
	if (!msgs) {
		msgs = json_loads(conversation, 0, NULL);
		tl = json_loads(tools, 0, NULL);
		vars = json_loads("{\"enable_thinking\": false}", 0, NULL);
		FUZZ_CHECK(msgs && tl && vars);
	}
	struct chat_template *t;
	struct hearth_error err = { 0 };
	if (chat_template_new(&t, (const char *)data, size, "fuzz", &err)) {
		FUZZ_CHECK(t == NULL);
		FUZZ_CHECK(!strncmp(err.msg, "fuzz", 4));
		return 0;
	}
	for (int pass = 0; pass < 2; pass++) {
		struct chat_render_opts o = {
			.messages = msgs, .tools = pass ? tl : NULL, .add_generation_prompt = pass == 0,
			.vars = pass ? vars : NULL, .bos_token = "<s>", .eos_token = "</s>", .now = 0,
			.limits = { .steps = 200000, .depth = 32, .output = 1 << 20, .range = 10000,
				    .memory = 64 << 20 },
		};
		struct chat_text x;
		int rc = chat_template_render(t, &o, &x, &err);
		if (rc) {
			FUZZ_CHECK(x.text == NULL && x.n_spans == 0);
			FUZZ_CHECK(!strncmp(err.msg, "fuzz", 4));
			continue;
		}
		FUZZ_CHECK(x.text[x.len] == 0);
		size_t at = 0;
		for (size_t i = 0; i < x.n_spans; i++) {
			FUZZ_CHECK(x.spans[i].off == at && x.spans[i].len > 0);
			FUZZ_CHECK(i == 0 || x.spans[i].from_message != x.spans[i - 1].from_message);
			at += x.spans[i].len;
		}
		FUZZ_CHECK(at == x.len);
		chat_text_free(&x);
	}
	chat_template_free(t);
	return 0;
}

static void add_str(fuzz_seed_fn add, void *ctx, const char *s)
{
	add(ctx, (const uint8_t *)s, strlen(s));
}

void fuzz_seeds(fuzz_seed_fn add, void *ctx)
{
	/* the real templates, when the fixtures are at hand */
	const char *shared = getenv("HEARTH_SHARED");
	char dir[4096];
	snprintf(dir, sizeof dir, "%s/chat/templates", shared ? shared : "../shared");
	DIR *d = opendir(dir);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char path[8192];
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		FILE *f = fopen(path, "rb");
		if (!f)
			continue;
		static char buf[1 << 17];
		size_t n = fread(buf, 1, sizeof buf, f);
		fclose(f);
		add(ctx, (const uint8_t *)buf, n);
	}
	if (d)
		closedir(d);
	add_str(add, ctx, chat_template_chatml());
	add_str(add, ctx, "{{ 'a' * 10**9 }}");
	add_str(add, ctx, "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
	add_str(add, ctx, "{% for i in range(10**9) %}{{ i }}{% endfor %}");
	add_str(add, ctx, "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}"
			  "{% endfor %}{{ ns.s | length }}");
	add_str(add, ctx, "{{ messages[1].content.split('<')[1:] | join('|') | upper | tojson(indent=2) }}"
			  "{{ tools | map(attribute='function') | list | tojson(sort_keys=true) }}"
			  "{%- for m in messages if m.role != 'tool' %}{{ loop.index }}{{ m.content[::-1] }}{% endfor %}");
	add_str(add, ctx, "{% raw %}{{ x }}{% endraw %}{# c #}{%- if x is not defined -%} a {%+ else %}b{% endif %}");
	add_str(add, ctx, "{{ raise_exception('no') }}{{ strftime_now('%Y-%m-%d') }}{{ (1, 'a') ~ {'k': [1.5, none]} }}");
}
