/* Chat-template render time: a 20-message conversation with tools (user, assistant with a
 * tool call, tool result, assistant answer, repeated) through a template file, default the
 * Qwen3 one from shared/chat. Prints the median and best of N renders in microseconds, plus
 * the parse time. Usage: bench/bench_chat [TEMPLATE.jinja] [N]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/engine/chat_template.h"

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	char def[1024];
	const char *shared = getenv("HEARTH_SHARED");
	snprintf(def, sizeof def, "%s/chat/templates/Qwen-Qwen3-0.6B.jinja", shared ? shared : "../shared");
	const char *path = argc > 1 ? argv[1] : def;
	int reps = argc > 2 ? atoi(argv[2]) : 2000;
	if (reps < 1)
		reps = 1;
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "bench_chat: cannot open %s\n", path);
		return 1;
	}
	static char src[1 << 20];
	size_t len = fread(src, 1, sizeof src, f);
	fclose(f);

	json_t *msgs = json_array();
	json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content",
					      "You are a helpful assistant with tools."));
	for (int i = 0; json_array_size(msgs) < 20; i++) {
		json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content",
						      "What is the weather in Paris today, and should I take an umbrella?"));
		json_array_append_new(msgs, json_pack("{s:s, s:s, s:[{s:s, s:s, s:{s:s, s:{s:s, s:s}}}]}", "role",
						      "assistant", "content", "", "tool_calls", "id", "call_1", "type",
						      "function", "function", "name", "get_weather", "arguments", "city",
						      "Paris", "unit", "celsius"));
		json_array_append_new(msgs, json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id", "call_1",
						      "content", "{\"temp\": 18, \"sky\": \"rain\"}"));
		json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "assistant", "content",
						      "It is 18 degrees with rain in Paris: take an umbrella."));
	}
	while (json_array_size(msgs) > 20)
		json_array_remove(msgs, json_array_size(msgs) - 1);
	json_t *tools = json_loads(
		"[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Current weather in a city\","
		"\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"description\":\"City name\"},"
		"\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]}},\"required\":[\"city\"]}}},"
		"{\"type\":\"function\",\"function\":{\"name\":\"search\",\"description\":\"Web search\","
		"\"parameters\":{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\"}},\"required\":[\"q\"]}}}]",
		0, NULL);

	struct chat_template *t;
	struct hearth_error err;
	double t0 = now_us();
	if (chat_template_new(&t, src, len, path, &err)) {
		fprintf(stderr, "%s\n", err.msg);
		return 1;
	}
	double parse_us = now_us() - t0;
	struct chat_render_opts o = { .messages = msgs, .tools = tools, .add_generation_prompt = true,
				      .bos_token = "<s>", .eos_token = "</s>", .now = -1 };
	double *us = malloc(sizeof *us * (size_t)reps);
	size_t out_len = 0, spans = 0;
	for (int r = 0; r < reps; r++) {
		struct chat_text x;
		double a = now_us();
		if (chat_template_render(t, &o, &x, &err)) {
			fprintf(stderr, "%s\n", err.msg);
			return 1;
		}
		us[r] = now_us() - a;
		out_len = x.len;
		spans = x.n_spans;
		chat_text_free(&x);
	}
	qsort(us, (size_t)reps, sizeof *us, cmp_double);
	printf("template %s\nparse %.1f us; render of 20 messages + 2 tools (%zu bytes, %zu spans): "
	       "median %.1f us, best %.1f us over %d renders\n",
	       path, parse_us, out_len, spans, us[reps / 2], us[0], reps);
	free(us);
	chat_template_free(t);
	json_decref(msgs);
	json_decref(tools);
	return 0;
}
