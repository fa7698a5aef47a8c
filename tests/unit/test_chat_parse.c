/* The chat reply parser on recorded replies of each tool-call family: whole and streamed a
 * byte at a time (the message must not depend on how the text was split, and a streamed
 * content delta never carries a piece of a marker), malformed calls kept as content, the
 * format detected from the real templates of shared/chat. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/engine/chat_parse.h"

struct seen {
	char content[4096];
	size_t content_len;
	char reasoning[4096];
	size_t reasoning_len;
	size_t n_calls;
	char names[8][64];
	char args[8][512];
};

static int on_event(void *ctx, const struct chat_event *ev)
{
	struct seen *s = ctx;
	if (ev->kind == CHAT_EVENT_CONTENT) {
		assert_true(s->content_len + ev->len < sizeof s->content);
		memcpy(s->content + s->content_len, ev->text, ev->len);
		s->content_len += ev->len;
	} else if (ev->kind == CHAT_EVENT_REASONING) {
		assert_true(s->reasoning_len + ev->len < sizeof s->reasoning);
		memcpy(s->reasoning + s->reasoning_len, ev->text, ev->len);
		s->reasoning_len += ev->len;
	} else {
		assert_int_equal(ev->index, s->n_calls);
		assert_true(s->n_calls < 8);
		snprintf(s->names[s->n_calls], sizeof s->names[0], "%s", ev->call->name);
		snprintf(s->args[s->n_calls], sizeof s->args[0], "%s", ev->call->arguments);
		s->n_calls++;
	}
	return 0;
}

struct want {
	const char *content;
	const char *reasoning;
	size_t n_calls;
	const char *names[4];
	const char *args[4];
};

static struct chat_syntax syntax_of(enum chat_format f, bool think, bool in_reasoning)
{
	struct chat_syntax s;
	memset(&s, 0, sizeof s);
	s.format = f;
	if (think) {
		strcpy(s.think_open, "<think>");
		strcpy(s.think_close, "</think>");
	}
	s.in_reasoning = in_reasoning;
	return s;
}

/* Parses reply split into pieces of `chunk` bytes (0: whole) and checks the message and the
 * events against want. */
static void check_split(const struct chat_syntax *syn, const char *reply, size_t chunk, const struct want *w)
{
	struct chat_parser *p;
	struct hearth_error err = { 0 };
	struct seen s;
	memset(&s, 0, sizeof s);
	assert_int_equal(chat_parser_new(&p, syn, &err), 0);
	size_t n = strlen(reply);
	size_t step = chunk ? chunk : n;
	for (size_t off = 0; off < n; off += step) {
		size_t k = n - off < step ? n - off : step;
		assert_int_equal(chat_parser_feed(p, reply + off, k, on_event, &s, &err), 0);
		/* Nothing streamed so far may hold a piece of a marker. */
		s.content[s.content_len] = 0;
		if (!strstr(w->content, "<tool_call"))
			assert_null(strstr(s.content, "<tool_call"));
		if (!strstr(w->content, "<think"))
			assert_null(strstr(s.content, "<think"));
	}
	assert_int_equal(chat_parser_finish(p, on_event, &s, &err), 0);

	size_t len;
	const char *c = chat_parser_content(p, &len);
	assert_int_equal(len, strlen(w->content));
	assert_memory_equal(c, w->content, len);
	/* The streamed deltas add up to the message (its trailing whitespace is trimmed). */
	assert_true(s.content_len >= len);
	assert_memory_equal(s.content, w->content, len);
	const char *r = chat_parser_reasoning(p, &len);
	const char *wr = w->reasoning ? w->reasoning : "";
	assert_int_equal(len, strlen(wr));
	assert_memory_equal(r, wr, len);
	assert_int_equal(chat_parser_n_calls(p), w->n_calls);
	assert_int_equal(s.n_calls, w->n_calls);
	for (size_t i = 0; i < w->n_calls; i++) {
		const struct chat_tool_call *call = chat_parser_call(p, i);
		assert_string_equal(call->name, w->names[i]);
		assert_string_equal(call->arguments, w->args[i]);
		assert_string_equal(s.names[i], w->names[i]);
		assert_non_null(call->id);
		assert_true(strlen(call->id) > 0);
	}
	chat_parser_free(p);
}

static void check(const struct chat_syntax *syn, const char *reply, const struct want *w)
{
	check_split(syn, reply, 0, w);
	check_split(syn, reply, 1, w);
	check_split(syn, reply, 5, w);
}

static void test_chat_parse_hermes_reasoning_content_and_call(void **state)
{
	(void)state;
	struct chat_syntax syn = syntax_of(CHAT_FORMAT_HERMES, true, false);
	struct want w = {
		.content = "I will look it up.",
		.reasoning = "The user wants the weather.",
		.n_calls = 1,
		.names = { "get_weather" },
		.args = { "{\"city\":\"Paris\",\"unit\":\"celsius\"}" },
	};
	check(&syn,
	      "<think>\nThe user wants the weather.\n</think>\n\nI will look it up.\n<tool_call>\n"
	      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n"
	      "</tool_call>",
	      &w);
}

static void test_chat_parse_hermes_two_calls_and_no_tag_in_content(void **state)
{
	(void)state;
	struct chat_syntax syn = syntax_of(CHAT_FORMAT_HERMES, true, false);
	struct want w = {
		.content = "",
		.n_calls = 2,
		.names = { "a", "b" },
		.args = { "{}", "{\"x\":[1,\"}\"]}" },
	};
	check(&syn,
	      "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
	      "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, \"}\"]}}\n</tool_call>",
	      &w);
}

static void test_chat_parse_hermes_malformed_call_stays_content(void **state)
{
	(void)state;
	struct chat_syntax syn = syntax_of(CHAT_FORMAT_HERMES, false, false);
	struct want w = { .content = "Sure <tool_call>{\"name\": oops}</tool_call> done" };
	check_split(&syn, "Sure <tool_call>{\"name\": oops}</tool_call> done", 0, &w);
}

static void test_chat_parse_hermes_unclosed_call_at_the_end_is_taken(void **state)
{
	(void)state;
	struct chat_syntax syn = syntax_of(CHAT_FORMAT_HERMES, false, false);
	struct want w = { .content = "", .n_calls = 1, .names = { "f" }, .args = { "{\"a\":1}" } };
	check(&syn, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n", &w);
}

static void test_chat_parse_text_that_looks_like_a_marker_start_is_content(void **state)
{
	(void)state;
	struct chat_syntax syn = syntax_of(CHAT_FORMAT_HERMES, true, false);
	struct want w = { .content = "a < b and <tool is not a call <thin" };
	check_split(&syn, "a < b and <tool is not a call <thin", 1, &w);
	check_split(&syn, "a < b and <tool is not a call <thin", 0, &w);
}

static void test_chat_parse_llama3_json_reply_is_a_call(void **state)
{
	(void)state;
	struct chat_syntax syn = syntax_of(CHAT_FORMAT_LLAMA3, false, false);
	struct want w = { .content = "", .n_calls = 1, .names = { "get_weather" }, .args = { "{\"city\":\"Paris\"}" } };
	check(&syn, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", &w);
	struct want two = { .content = "", .n_calls = 2, .names = { "f", "g" }, .args = { "{}", "{\"q\":\"x;y\"}" } };
	check(&syn, "{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", \"parameters\": {\"q\": \"x;y\"}}", &two);
}

static void test_chat_parse_llama3_plain_text_and_non_call_json_stay_content(void **state)
{
	(void)state;
	struct chat_syntax syn = syntax_of(CHAT_FORMAT_LLAMA3, false, false);
	struct want w = { .content = "Paris is {sunny} today." };
	check(&syn, "Paris is {sunny} today.", &w);
	struct want j = { .content = "{\"city\": \"Paris\"}" };
	check(&syn, "{\"city\": \"Paris\"}", &j);
}

static void test_chat_parse_llama3_python_tag(void **state)
{
	(void)state;
	struct chat_syntax syn = syntax_of(CHAT_FORMAT_LLAMA3, false, false);
	struct want j = { .content = "", .n_calls = 1, .names = { "search" }, .args = { "{\"q\":\"llama\"}" } };
	check(&syn, "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"llama\"}}", &j);
	struct want code = { .content = "", .n_calls = 1, .names = { "python" }, .args = { "{\"code\":\"print(1+1)\"}" } };
	check(&syn, "<|python_tag|>print(1+1)", &code);
}

static void test_chat_parse_mistral_both_forms(void **state)
{
	(void)state;
	struct chat_syntax syn = syntax_of(CHAT_FORMAT_MISTRAL, false, false);
	struct want arr = { .content = "", .n_calls = 2, .names = { "get_weather", "time" },
			    .args = { "{\"city\":\"Paris\"}", "{}" } };
	check(&syn,
	      "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcdefghi\"},"
	      " {\"name\": \"time\", \"arguments\": {}}]",
	      &arr);
	struct want args = { .content = "Checking.", .n_calls = 2, .names = { "get_weather", "time" },
			     .args = { "{\"city\":\"Paris\",\"unit\":\"celsius\"}", "{}" } };
	check(&syn,
	      "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"unit\": \"celsius\"}"
	      "[TOOL_CALLS]time[ARGS]{}",
	      &args);
}

static void test_chat_parse_mistral_keeps_the_models_call_id(void **state)
{
	(void)state;
	struct chat_syntax syn = syntax_of(CHAT_FORMAT_MISTRAL, false, false);
	struct chat_parser *p;
	struct hearth_error err = { 0 };
	const char *r = "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}, \"id\": \"abcdefghi\"}]";
	assert_int_equal(chat_parser_new(&p, &syn, &err), 0);
	assert_int_equal(chat_parser_feed(p, r, strlen(r), NULL, NULL, &err), 0);
	assert_int_equal(chat_parser_finish(p, NULL, NULL, &err), 0);
	assert_int_equal(chat_parser_n_calls(p), 1);
	assert_string_equal(chat_parser_call(p, 0)->id, "abcdefghi");
	chat_parser_free(p);
}

static void test_chat_parse_generic_json_forms(void **state)
{
	(void)state;
	struct chat_syntax syn = syntax_of(CHAT_FORMAT_GENERIC, false, false);
	struct want one = { .content = "", .n_calls = 1, .names = { "f" }, .args = { "{\"a\":1}" } };
	check(&syn, "{\"tool_call\": {\"name\": \"f\", \"arguments\": {\"a\": 1}}}", &one);
	struct want many = { .content = "", .n_calls = 2, .names = { "f", "g" }, .args = { "{}", "{}" } };
	check(&syn, "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": {}}]}",
	      &many);
	struct want resp = { .content = "Hello there" };
	check(&syn, "{\"response\": \"Hello there\"}", &resp);
}

static void test_chat_parse_prompt_that_opened_reasoning(void **state)
{
	(void)state;
	struct chat_syntax syn;
	const char *tmpl = "{{ '<think>' }}{% if tools %}<tool_call>{% endif %}";
	const char *prompt = "<|User|>Hi<|Assistant|><think>\n";
	chat_syntax_init(&syn, tmpl, prompt, strlen(prompt));
	assert_true(syn.in_reasoning);
	struct want w = { .content = "Hello!", .reasoning = "Greet back." };
	check(&syn, "Greet back.\n</think>\n\nHello!", &w);

	/* Qwen3 with thinking off closes the block in the prompt. */
	const char *closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
	chat_syntax_init(&syn, tmpl, closed, strlen(closed));
	assert_false(syn.in_reasoning);
}

static void test_chat_parse_reply_limit_is_refused(void **state)
{
	(void)state;
	struct chat_syntax syn = syntax_of(CHAT_FORMAT_HERMES, false, false);
	struct chat_parser *p;
	struct hearth_error err = { 0 };
	assert_int_equal(chat_parser_new(&p, &syn, &err), 0);
	assert_int_equal(chat_parser_feed(p, "<tool_call>", 11, NULL, NULL, &err), 0);
	size_t big = 1 << 20;
	char *junk = malloc(big);
	assert_non_null(junk);
	memset(junk, 'x', big);
	int rc = 0;
	for (int i = 0; i < 8 && rc == 0; i++)
		rc = chat_parser_feed(p, junk, big, NULL, NULL, &err);
	assert_int_equal(rc, HEARTH_ERANGE);
	assert_non_null(strstr(err.msg, "bytes"));
	free(junk);
	chat_parser_free(p);
}

static char *read_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *s = malloc((size_t)n + 1);
	if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
		free(s);
		s = NULL;
	}
	if (s)
		s[n] = 0;
	fclose(f);
	return s;
}

static void test_chat_format_detected_from_real_templates(void **state)
{
	(void)state;
	const char *shared = getenv("HEARTH_SHARED");
	assert_non_null(shared);
	static const struct {
		const char *file;
		enum chat_format want;
		bool think;
	} cases[] = {
		{ "Qwen-Qwen3-0.6B.jinja", CHAT_FORMAT_HERMES, true },
		{ "Qwen-Qwen2.5-7B-Instruct.jinja", CHAT_FORMAT_HERMES, false },
		{ "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", CHAT_FORMAT_HERMES, false },
		{ "meta-llama-Llama-3.1-8B-Instruct.jinja", CHAT_FORMAT_LLAMA3, false },
		{ "meta-llama-Llama-3.2-3B-Instruct.jinja", CHAT_FORMAT_LLAMA3, false },
		{ "mistralai-Mistral-Nemo-Instruct-2407.jinja", CHAT_FORMAT_MISTRAL, false },
		{ "unsloth-mistral-Devstral-Small-2507.jinja", CHAT_FORMAT_MISTRAL, false },
		{ "google-gemma-2-2b-it.jinja", CHAT_FORMAT_PLAIN, false },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char path[1024];
		snprintf(path, sizeof path, "%s/chat/templates/%s", shared, cases[i].file);
		char *src = read_file(path);
		assert_non_null(src);
		struct chat_syntax syn;
		chat_syntax_init(&syn, src, "", 0);
		if (syn.format != cases[i].want)
			fail_msg("%s: detected %s, want %s", cases[i].file, chat_format_name(syn.format),
				 chat_format_name(cases[i].want));
		assert_int_equal(syn.think_open[0] != 0, cases[i].think);
		free(src);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_chat_parse_hermes_reasoning_content_and_call),
		cmocka_unit_test(test_chat_parse_hermes_two_calls_and_no_tag_in_content),
		cmocka_unit_test(test_chat_parse_hermes_malformed_call_stays_content),
		cmocka_unit_test(test_chat_parse_hermes_unclosed_call_at_the_end_is_taken),
		cmocka_unit_test(test_chat_parse_text_that_looks_like_a_marker_start_is_content),
		cmocka_unit_test(test_chat_parse_llama3_json_reply_is_a_call),
		cmocka_unit_test(test_chat_parse_llama3_plain_text_and_non_call_json_stay_content),
		cmocka_unit_test(test_chat_parse_llama3_python_tag),
		cmocka_unit_test(test_chat_parse_mistral_both_forms),
		cmocka_unit_test(test_chat_parse_mistral_keeps_the_models_call_id),
		cmocka_unit_test(test_chat_parse_generic_json_forms),
		cmocka_unit_test(test_chat_parse_prompt_that_opened_reasoning),
		cmocka_unit_test(test_chat_parse_reply_limit_is_refused),
		cmocka_unit_test(test_chat_format_detected_from_real_templates),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
