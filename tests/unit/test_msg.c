/* Tests of message encode/decode: every message survives a round trip field by field, and
 * each kind of malformed or hostile frame gets its own stable error code (with the request
 * id when one could be read) instead of a crash, a hang or a silently wrong value. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <msgpack.h>

#include "protocol/frame.h"
#include "protocol/msg.h"
#include "protocol/msg_fields.h"
#include "protocol/sampling.h"

/* ---- helpers ---- */

/* Encodes m and decodes it back from the frame, checking the length prefix on the way. */
static void roundtrip(const struct msg *m, enum msg_from from, struct msg *out)
{
	struct msg_buf b = { 0 };
	struct hearth_error err = { 0 };
	int rc = msg_encode(m, &b, &err);
	if (rc)
		fail_msg("encode %s: %s", msg_type_name(m->type), err.msg);
	assert_true(b.len > 4);
	assert_int_equal(frame_header_read(b.data), b.len - 4);
	struct msg_reject rej;
	rc = msg_decode(b.data + 4, b.len - 4, from, out, &rej, &err);
	if (rc)
		fail_msg("decode %s: %s", msg_type_name(m->type), err.msg);
	assert_int_equal(out->type, m->type);
	assert_int_equal(out->id, m->id);
	msg_buf_free(&b);
}

static struct msg_bytes B(const char *s)
{
	return (struct msg_bytes){ s, strlen(s) };
}

static void assert_bytes(struct msg_bytes a, const char *s)
{
	assert_int_equal(a.len, strlen(s));
	assert_memory_equal(a.ptr, s, a.len);
	assert_int_equal(a.ptr[a.len], '\0');
}

/* A packer writing into an sbuffer, for crafting frames the encoder would never make. */
struct raw {
	msgpack_sbuffer sb;
	msgpack_packer pk;
};

static void raw_init(struct raw *r)
{
	msgpack_sbuffer_init(&r->sb);
	msgpack_packer_init(&r->pk, &r->sb, msgpack_sbuffer_write);
}

static void raw_str(struct raw *r, const char *s)
{
	msgpack_pack_str(&r->pk, strlen(s));
	msgpack_pack_str_body(&r->pk, s, strlen(s));
}

static void raw_kv_str(struct raw *r, const char *k, const char *v)
{
	raw_str(r, k);
	raw_str(r, v);
}

static void raw_kv_uint(struct raw *r, const char *k, uint64_t v)
{
	raw_str(r, k);
	msgpack_pack_uint64(&r->pk, v);
}

/* Starts a request map of n_extra fields besides t and id. */
static void raw_request(struct raw *r, const char *type, uint64_t id, size_t n_extra)
{
	raw_init(r);
	msgpack_pack_map(&r->pk, 2 + n_extra);
	raw_kv_str(r, "t", type);
	raw_kv_uint(r, "id", id);
}

/* Decodes raw bytes as the daemon would and checks the refusal. Returns the hearth code. */
static int expect_reject(const void *p, size_t n, enum msg_from from, enum msg_errcode code,
			 uint64_t id)
{
	struct msg m;
	struct msg_reject rej;
	struct hearth_error err = { 0 };
	int rc = msg_decode(p, n, from, &m, &rej, &err);
	if (rc == 0)
		fail_msg("expected %s, frame was accepted as %s", msg_errcode_name(code),
			 msg_type_name(m.type));
	if (rej.code != code)
		fail_msg("expected %s, got %s: %s", msg_errcode_name(code),
			 msg_errcode_name(rej.code), err.msg);
	assert_int_equal(rej.id, id);
	assert_int_equal(m.type, MSG_NONE);
	assert_null(m.arena);
	assert_true(strlen(err.msg) > 0);
	return rc;
}

static int raw_expect(struct raw *r, enum msg_from from, enum msg_errcode code, uint64_t id)
{
	int rc = expect_reject(r->sb.data, r->sb.size, from, code, id);
	msgpack_sbuffer_destroy(&r->sb);
	return rc;
}

static void raw_accept(struct raw *r, enum msg_from from, struct msg *out)
{
	struct msg_reject rej;
	struct hearth_error err = { 0 };
	int rc = msg_decode(r->sb.data, r->sb.size, from, out, &rej, &err);
	if (rc)
		fail_msg("refused (%s): %s", msg_errcode_name(rej.code), err.msg);
	msgpack_sbuffer_destroy(&r->sb);
}

/* ---- round trips ---- */

static void test_msg_roundtrips_hello_and_welcome(void **state)
{
	(void)state;
	struct msg m, d;
	msg_init(&m, MSG_HELLO, 1);
	m.u.hello.proto_minor = 3;
	m.u.hello.name = B("hearth-cli \xc3\xa9");
	m.u.hello.ring = false;
	roundtrip(&m, MSG_FROM_CLIENT, &d);
	assert_int_equal(d.u.hello.proto_major, MSG_PROTO_MAJOR);
	assert_int_equal(d.u.hello.proto_minor, 3);
	assert_bytes(d.u.hello.name, "hearth-cli \xc3\xa9");
	assert_false(d.u.hello.ring);
	msg_free(&d);

	msg_init(&m, MSG_WELCOME, 1);
	struct msg_welcome *w = &m.u.welcome;
	w->daemon = B("0.1.0");
	w->model = (struct msg_model_info){ .arch = B("qwen2"), .name = B("Qwen2.5 1.5B"),
		.quant = B("q4_g128"), .n_params = 1543714304ull, .n_ctx = 4096,
		.n_ctx_train = 32768, .n_vocab = 151936, .n_layer = 28, .n_embd = 1536 };
	w->max_frame = FRAME_MAX_DEFAULT;
	w->ring = true;
	w->ring_d2c = 1u << 20;
	w->ring_c2d = 1u << 21;
	roundtrip(&m, MSG_FROM_DAEMON, &d);
	const struct msg_welcome *dw = &d.u.welcome;
	assert_bytes(dw->daemon, "0.1.0");
	assert_bytes(dw->model.arch, "qwen2");
	assert_bytes(dw->model.name, "Qwen2.5 1.5B");
	assert_bytes(dw->model.quant, "q4_g128");
	assert_int_equal(dw->model.n_params, 1543714304ull);
	assert_int_equal(dw->model.n_ctx, 4096);
	assert_int_equal(dw->model.n_ctx_train, 32768);
	assert_int_equal(dw->model.n_vocab, 151936);
	assert_int_equal(dw->model.n_layer, 28);
	assert_int_equal(dw->model.n_embd, 1536);
	assert_int_equal(dw->max_frame, FRAME_MAX_DEFAULT);
	assert_true(dw->ring);
	assert_int_equal(dw->ring_d2c, 1u << 20);
	assert_int_equal(dw->ring_c2d, 1u << 21);
	assert_false(dw->model.has_draft); /* no draft model: the field is left out */
	msg_free(&d);

	/* welcome.model.draft names the draft model when there is one. */
	w->model.has_draft = true;
	w->model.draft = (struct msg_draft_info){ .arch = B("llama"), .name = B("KJV small"), .quant = B("q4_g32"),
						  .n_params = 2890000, .n_ctx = 256, .n_layer = 4, .n_embd = 128 };
	roundtrip(&m, MSG_FROM_DAEMON, &d);
	assert_true(d.u.welcome.model.has_draft);
	assert_bytes(d.u.welcome.model.draft.arch, "llama");
	assert_bytes(d.u.welcome.model.draft.name, "KJV small");
	assert_bytes(d.u.welcome.model.draft.quant, "q4_g32");
	assert_int_equal(d.u.welcome.model.draft.n_params, 2890000);
	assert_int_equal(d.u.welcome.model.draft.n_ctx, 256);
	assert_int_equal(d.u.welcome.model.draft.n_layer, 4);
	assert_int_equal(d.u.welcome.model.draft.n_embd, 128);
	assert_bytes(d.u.welcome.model.arch, "qwen2"); /* the model's own facts unchanged */
	msg_free(&d);
}

static void test_msg_roundtrips_generate_with_every_field(void **state)
{
	(void)state;
	struct msg m, d;
	uint32_t stop_tokens[] = { 2, 151643 };
	struct msg_bytes stops[] = { B("\n\n"), B("User:") };
	msg_init(&m, MSG_GENERATE, 77);
	struct msg_generate *g = &m.u.generate;
	g->has_prompt = true;
	g->prompt = B("Once upon a time");
	g->max_tokens = 128;
	g->sampling = (struct msg_sampling){ .temperature = 0.7, .top_k = 20, .top_p = 0.9,
		.min_p = 0.1, .repeat_penalty = 1.1, .repeat_last_n = 32, .has_seed = true,
		.seed = 0xfedcba9876543210ull };
	g->stop = stops;
	g->n_stop = 2;
	g->stop_tokens = stop_tokens;
	g->n_stop_tokens = 2;
	g->logprobs = true;
	g->top_logprobs = 5;
	g->logits = true;
	g->ignore_eos = true;
	g->has_speculate = true;
	g->speculate = MSG_SPECULATE_MAX;
	g->has_draft = true;
	g->draft = (struct msg_bytes){ "model", 5 };
	roundtrip(&m, MSG_FROM_CLIENT, &d);
	const struct msg_generate *dg = &d.u.generate;
	assert_true(dg->has_prompt);
	assert_bytes(dg->prompt, "Once upon a time");
	assert_null(dg->tokens);
	assert_false(dg->has_prompt_ref);
	assert_int_equal(dg->max_tokens, 128);
	assert_true(dg->sampling.temperature == 0.7);
	assert_int_equal(dg->sampling.top_k, 20);
	assert_true(dg->sampling.top_p == 0.9);
	assert_true(dg->sampling.min_p == 0.1);
	assert_true(dg->sampling.repeat_penalty == 1.1);
	assert_int_equal(dg->sampling.repeat_last_n, 32);
	assert_true(dg->sampling.has_seed);
	assert_true(dg->sampling.seed == 0xfedcba9876543210ull);
	assert_int_equal(dg->n_stop, 2);
	assert_bytes(dg->stop[0], "\n\n");
	assert_bytes(dg->stop[1], "User:");
	assert_int_equal(dg->n_stop_tokens, 2);
	assert_int_equal(dg->stop_tokens[1], 151643);
	assert_true(dg->logprobs);
	assert_int_equal(dg->top_logprobs, 5);
	assert_true(dg->logits);
	assert_false(dg->stream_socket);
	assert_true(dg->ignore_eos);
	assert_true(dg->has_speculate);
	assert_int_equal(dg->speculate, MSG_SPECULATE_MAX);
	assert_true(dg->has_draft);
	assert_int_equal(dg->draft.len, 5);
	assert_memory_equal(dg->draft.ptr, "model", 5);
	msg_free(&d);

	/* token-id prompt, streamed on the socket */
	uint32_t toks[] = { 1, 15043, 0, MSG_TOKEN_MAX };
	msg_init(&m, MSG_GENERATE, MSG_ID_MAX);
	m.u.generate.tokens = toks;
	m.u.generate.n_tokens = 4;
	m.u.generate.stream_socket = true;
	roundtrip(&m, MSG_FROM_CLIENT, &d);
	assert_int_equal(d.u.generate.n_tokens, 4);
	assert_memory_equal(d.u.generate.tokens, toks, sizeof toks);
	assert_true(d.u.generate.stream_socket);
	assert_false(d.u.generate.has_prompt);
	msg_free(&d);

	/* prompt in the ring */
	msg_init(&m, MSG_GENERATE, 5);
	m.u.generate.has_prompt_ref = true;
	m.u.generate.prompt_ref = 42;
	roundtrip(&m, MSG_FROM_CLIENT, &d);
	assert_true(d.u.generate.has_prompt_ref);
	assert_int_equal(d.u.generate.prompt_ref, 42);
	assert_false(d.u.generate.sampling.has_seed);
	msg_free(&d);
}

static void test_msg_roundtrips_small_requests(void **state)
{
	(void)state;
	struct msg m, d;
	msg_init(&m, MSG_CANCEL, 9);
	m.u.cancel.target = 77;
	roundtrip(&m, MSG_FROM_CLIENT, &d);
	assert_int_equal(d.u.cancel.target, 77);
	msg_free(&d);

	msg_init(&m, MSG_TOKENIZE, 10);
	m.u.tokenize.has_text = true;
	m.u.tokenize.text = B("<|im_start|>hi");
	m.u.tokenize.add_bos = false;
	m.u.tokenize.special = true;
	roundtrip(&m, MSG_FROM_CLIENT, &d);
	assert_bytes(d.u.tokenize.text, "<|im_start|>hi");
	assert_false(d.u.tokenize.add_bos);
	assert_true(d.u.tokenize.special);
	msg_free(&d);

	uint32_t toks[] = { 9906, 1917 };
	msg_init(&m, MSG_DETOKENIZE, 11);
	m.u.detokenize.tokens = toks;
	m.u.detokenize.n_tokens = 2;
	roundtrip(&m, MSG_FROM_CLIENT, &d);
	assert_int_equal(d.u.detokenize.n_tokens, 2);
	assert_int_equal(d.u.detokenize.tokens[0], 9906);
	msg_free(&d);

	enum msg_type bare[] = { MSG_STATS, MSG_LEDGER, MSG_PING };
	for (size_t i = 0; i < 3; i++) {
		msg_init(&m, bare[i], 100 + i);
		roundtrip(&m, MSG_FROM_CLIENT, &d);
		msg_free(&d);
	}
	msg_init(&m, MSG_PONG, 102);
	roundtrip(&m, MSG_FROM_DAEMON, &d);
	msg_free(&d);
}

static void test_msg_roundtrips_replies(void **state)
{
	(void)state;
	struct msg m, d;
	msg_init(&m, MSG_LOADING, 1);
	m.u.loading = (struct msg_loading){ B("repack"), 12, 340 };
	roundtrip(&m, MSG_FROM_DAEMON, &d);
	assert_bytes(d.u.loading.phase, "repack");
	assert_int_equal(d.u.loading.done, 12);
	assert_int_equal(d.u.loading.total, 340);
	msg_free(&d);

	struct msg_top top[] = { { 5, -0.25f }, { 7, -3.5f } };
	msg_init(&m, MSG_TOKEN, 77);
	m.u.token.token = 5;
	m.u.token.text = (struct msg_bytes){ "\xe2\x82", 2 }; /* half a UTF-8 sequence */
	m.u.token.has_logprob = true;
	m.u.token.logprob = -0.25f;
	m.u.token.top = top;
	m.u.token.n_top = 2;
	roundtrip(&m, MSG_FROM_DAEMON, &d);
	assert_int_equal(d.u.token.token, 5);
	assert_int_equal(d.u.token.text.len, 2);
	assert_memory_equal(d.u.token.text.ptr, "\xe2\x82", 2);
	assert_true(d.u.token.has_logprob);
	assert_true(d.u.token.logprob == -0.25f);
	assert_int_equal(d.u.token.n_top, 2);
	assert_int_equal(d.u.token.top[1].token, 7);
	assert_true(d.u.token.top[1].logprob == -3.5f);
	msg_free(&d);

	msg_init(&m, MSG_DONE, 77);
	m.u.done = (struct msg_done){ MSG_FINISH_LENGTH, 12, 128, 0.5, 20.25, 1000.0, 592.5,
				      128.0 };
	roundtrip(&m, MSG_FROM_DAEMON, &d);
	assert_int_equal(d.u.done.finish, MSG_FINISH_LENGTH);
	assert_int_equal(d.u.done.n_prompt, 12);
	assert_int_equal(d.u.done.n_gen, 128);
	assert_true(d.u.done.queue_ms == 0.5);
	assert_true(d.u.done.prefill_ms == 20.25);
	assert_true(d.u.done.decode_ms == 1000.0);
	assert_true(d.u.done.prefill_tps == 592.5);
	assert_true(d.u.done.decode_tps == 128.0);
	msg_free(&d);

	uint32_t toks[] = { 1, 2, 3 };
	msg_init(&m, MSG_TOKENS, 10);
	m.u.tokens.tokens = toks;
	m.u.tokens.n_tokens = 3;
	roundtrip(&m, MSG_FROM_DAEMON, &d);
	assert_int_equal(d.u.tokens.n_tokens, 3);
	assert_memory_equal(d.u.tokens.tokens, toks, sizeof toks);
	msg_free(&d);

	/* an empty tokenization is a valid answer */
	msg_init(&m, MSG_TOKENS, 10);
	m.u.tokens.tokens = toks;
	roundtrip(&m, MSG_FROM_DAEMON, &d);
	assert_int_equal(d.u.tokens.n_tokens, 0);
	msg_free(&d);

	msg_init(&m, MSG_TEXT, 11);
	m.u.text.text = (struct msg_bytes){ "a\0b\xff", 4 };
	roundtrip(&m, MSG_FROM_DAEMON, &d);
	assert_int_equal(d.u.text.text.len, 4);
	assert_memory_equal(d.u.text.text.ptr, "a\0b\xff", 4);
	msg_free(&d);

	msg_init(&m, MSG_STATS_REPLY, 12);
	m.u.stats = (struct msg_stats_reply){ 123456, 3, 2, 1, 1000, 2000, 1u << 20, 1u << 30,
					      987654321, 0, 0 };
	roundtrip(&m, MSG_FROM_DAEMON, &d);
	assert_int_equal(d.u.stats.uptime_ms, 123456);
	assert_int_equal(d.u.stats.clients, 3);
	assert_int_equal(d.u.stats.running, 2);
	assert_int_equal(d.u.stats.queued, 1);
	assert_int_equal(d.u.stats.prompt_tokens, 1000);
	assert_int_equal(d.u.stats.gen_tokens, 2000);
	assert_int_equal(d.u.stats.kv_used, 1u << 20);
	assert_int_equal(d.u.stats.kv_total, 1u << 30);
	assert_int_equal(d.u.stats.rss, 987654321);
	assert_false(d.u.stats.has_draft_kv); /* no draft model: both fields left out */
	msg_free(&d);
	m.u.stats.has_draft_kv = true;
	m.u.stats.draft_kv_used = 0; /* an idle draft still says its total, and used 0 */
	m.u.stats.draft_kv_total = 64u << 20;
	roundtrip(&m, MSG_FROM_DAEMON, &d);
	assert_true(d.u.stats.has_draft_kv);
	assert_int_equal(d.u.stats.draft_kv_used, 0);
	assert_int_equal(d.u.stats.draft_kv_total, 64u << 20);
	assert_int_equal(d.u.stats.kv_total, 1u << 30);
	msg_free(&d);

	struct msg_ledger_entry ent[] = { { B("weights"), 900000000ull }, { B("kv"), 1ull << 28 } };
	msg_init(&m, MSG_LEDGER_REPLY, 13);
	m.u.ledger = (struct msg_ledger_reply){ ent, 2, 900000000ull + (1ull << 28), 1ull << 31 };
	roundtrip(&m, MSG_FROM_DAEMON, &d);
	assert_int_equal(d.u.ledger.n_entries, 2);
	assert_bytes(d.u.ledger.entries[0].name, "weights");
	assert_int_equal(d.u.ledger.entries[1].bytes, 1ull << 28);
	assert_int_equal(d.u.ledger.total, 900000000ull + (1ull << 28));
	assert_int_equal(d.u.ledger.peak, 1ull << 31);
	msg_free(&d);

	struct msg_buf b = { 0 };
	assert_int_equal(msg_encode_error(&b, 0, MSG_ERR_BAD_FRAME, true, NULL,
					  "framing lost at byte %d", 17), 0);
	struct msg_reject rej;
	assert_int_equal(msg_decode(b.data + 4, b.len - 4, MSG_FROM_DAEMON, &d, &rej, NULL), 0);
	assert_int_equal(d.type, MSG_ERROR);
	assert_int_equal(d.id, 0);
	assert_int_equal(d.u.error.code, MSG_ERR_BAD_FRAME);
	assert_true(d.u.error.fatal);
	assert_bytes(d.u.error.message, "framing lost at byte 17");
	msg_free(&d);
	msg_buf_free(&b);
}

/* ---- every field of every table reaches the wire and comes back ---- */

/* Messages with every field away from its default, several per type where cross-field rules
 * exclude each other (one prompt source, logits only through the ring). Built by hand, not
 * from the tables, so a table field no message sets shows up as missing below. */
static uint32_t full_toks[] = { 1, 300, 70000 };
static struct msg_bytes full_stops[] = { { "ab", 2 }, { "\n", 1 } };
static struct msg_top full_top[] = { { 5, -0.5f }, { 6, -1.25f } };
static struct msg_ledger_entry full_ledger[] = { { { "kv", 2 }, 100 }, { { "weights", 7 }, 1ull << 32 } };
static struct msg_chat_call full_calls[] = {
	{ { "call_1", 6 }, { "get_weather", 11 }, { "{\"city\":\"Paris\"}", 16 } },
	{ { "call_2", 6 }, { "now", 3 }, { "{}", 2 } },
};
static struct msg_chat_message full_chat_messages[] = {
	{ { "assistant", 9 }, true, true, true, true, { "c", 1 }, { "n", 1 }, { "call_0", 6 }, { "r", 1 },
	  full_calls, 2 },
	{ { "tool", 4 }, true, true, true, true, { "18C", 3 }, { "get_weather", 11 }, { "call_1", 6 }, { "-", 1 },
	  full_calls + 1, 1 },
};

static size_t full_messages(enum msg_type type, struct msg *v)
{
	size_t n = 0;
	struct msg *m = &v[n++];
	msg_init(m, type, 7);
	switch (type) {
	case MSG_HELLO:
		m->u.hello = (struct msg_hello){ MSG_PROTO_MAJOR, 3, B("cli"), false };
		break;
	case MSG_GENERATE: {
		struct msg_generate *g = &m->u.generate;
		g->has_prompt = true;
		g->prompt = B("hi");
		g->max_tokens = 9;
		g->sampling = (struct msg_sampling){ 0.5, 7, 0.75, 0.125, 1.5, 32, true, 99 };
		g->stop = full_stops;
		g->n_stop = 2;
		g->stop_tokens = full_toks;
		g->n_stop_tokens = 3;
		g->logprobs = true;
		g->top_logprobs = 3;
		g->logits = true;
		g->ignore_eos = true;
		g->has_speculate = true;
		g->speculate = 4;
		g->has_draft = true;
		g->draft = B("model");
		m = &v[n++];
		msg_init(m, type, 8);
		m->u.generate.tokens = full_toks;
		m->u.generate.n_tokens = 3;
		m->u.generate.stream_socket = true;
		m = &v[n++];
		msg_init(m, type, 9);
		m->u.generate.has_prompt_ref = true;
		m->u.generate.prompt_ref = 5;
		m->u.generate.has_grammar = true;
		m->u.generate.grammar = B("root ::= \"a\"");
		m = &v[n++];
		msg_init(m, type, 10);
		m->u.generate.has_prompt = true;
		m->u.generate.prompt = B("x");
		m->u.generate.has_json_schema = true;
		m->u.generate.json_schema = B("{\"type\":\"object\"}");
		m = &v[n++];
		msg_init(m, type, 11);
		m->u.generate.has_prompt = true;
		m->u.generate.prompt = B("x");
		m->u.generate.json_object = true;
		m->u.generate.has_jump_forward = true;
		m->u.generate.jump_forward = false;
		break;
	}
	case MSG_CHAT: {
		struct msg_chat *c = &m->u.chat;
		c->messages = full_chat_messages;
		c->n_messages = 2;
		c->has_tools = true;
		c->tools = B("[]");
		c->has_tool_choice = true;
		c->tool_choice = B("required");
		c->add_generation_prompt = false;
		c->has_vars = true;
		c->vars = B("{\"enable_thinking\":false}");
		c->has_template = true;
		c->template_name = B("tool_use");
		c->gen.max_tokens = 5;
		c->gen.stop = full_stops;
		c->gen.n_stop = 2;
		c->gen.stop_tokens = full_toks;
		c->gen.n_stop_tokens = 3;
		c->gen.sampling.has_seed = true;
		c->gen.logprobs = true;
		c->gen.top_logprobs = 2;
		c->gen.logits = true;
		c->gen.ignore_eos = true;
		c->gen.json_object = true;
		c->gen.has_jump_forward = true;
		c->gen.jump_forward = false;
		c->gen.has_speculate = true;
		c->gen.has_draft = true;
		c->gen.draft = B("lookup");
		m = &v[n++];
		msg_init(m, type, 8);
		m->u.chat.messages = full_chat_messages;
		m->u.chat.n_messages = 1;
		m->u.chat.gen.stream_socket = true;
		m->u.chat.gen.has_grammar = true;
		m->u.chat.gen.grammar = B("root ::= \"a\"");
		m = &v[n++];
		msg_init(m, type, 9);
		m->u.chat.messages = full_chat_messages;
		m->u.chat.n_messages = 1;
		m->u.chat.gen.has_json_schema = true;
		m->u.chat.gen.json_schema = B("{}");
		break;
	}
	case MSG_DELTA:
		m->u.delta = (struct msg_delta){ B("content"), B("Hel"), 0, false, { { 0 } } };
		m = &v[n++];
		msg_init(m, type, 8);
		m->u.delta = (struct msg_delta){ B("tool_call"), { 0 }, 2, true, full_calls[0] };
		break;
	case MSG_CANCEL:
		m->u.cancel.target = 3;
		break;
	case MSG_TOKENIZE:
		m->u.tokenize = (struct msg_tokenize){ true, B("x"), false, 0, false, true };
		m = &v[n++];
		msg_init(m, type, 8);
		m->u.tokenize.has_text_ref = true;
		m->u.tokenize.text_ref = 6;
		break;
	case MSG_DETOKENIZE:
		m->u.detokenize = (struct msg_detokenize){ full_toks, 3 };
		break;
	case MSG_EMBED: {
		static struct msg_bytes inputs[2];
		static uint32_t t0[] = { 5, 6, 7 }, t1[] = { 0 };
		static struct msg_u32s toks[2] = { { t0, 3 }, { t1, 1 } };
		inputs[0] = B("hello");
		inputs[1] = B("caf\xc3\xa9");
		m->u.embed = (struct msg_embed){ .input = inputs, .n_input = 2, .has_pooling = true, .pooling = B("cls") };
		m = &v[n++];
		msg_init(m, type, 8);
		m->u.embed = (struct msg_embed){ .tokens = toks, .n_tokens = 2 };
		break;
	}
	case MSG_EMBEDDINGS: {
		static const float vec[2][3] = { { 1.0f, 0.0f, 0.0f }, { 0.6f, -0.8f, 0.0f } };
		static uint32_t ntok[2] = { 4, 9 };
		m->u.embeddings = (struct msg_embeddings){ 3, { (const char *)vec, sizeof vec }, ntok, 2, B("last"), 2,
							   0.25, 1.5 };
		break;
	}
	case MSG_WELCOME:
		m->u.welcome = (struct msg_welcome){ MSG_PROTO_MAJOR, 2, B("0.1"),
			{ B("llama"), B("tiny"), B("q4_g128"), 123456789012ull, 4096, 8192, 32000,
			  22, 2048, B("model"), B("last"), true,
			  { B("llama"), B("tinier"), B("q4_g32"), 2890000, 2048, 4, 256 } },
			1u << 20, true, 1u << 22, 1u << 21 };
		break;
	case MSG_LOADING:
		m->u.loading = (struct msg_loading){ B("map"), 5, 10 };
		break;
	case MSG_TOKEN:
		m->u.token = (struct msg_token){ 42, B("a"), true, -0.125f, full_top, 2 };
		break;
	case MSG_DONE:
		m->u.done = (struct msg_done){ MSG_FINISH_LENGTH, 3, 4, 1.5, 2.5, 3.5, 4.5, 5.5 };
		m = &v[n++];
		msg_init(m, type, 8);
		m->u.done = (struct msg_done){ MSG_FINISH_TOOL_CALLS, 3, 4, 1.5, 2.5, 3.5, 4.5, 5.5, 2, 1, true,
					       { B("ok"), B("hmm"), full_calls, 2 } };
		break;
	case MSG_TOKENS:
		m->u.tokens = (struct msg_tokens){ full_toks, 3 };
		break;
	case MSG_TEXT:
		m->u.text.text = B("hey");
		break;
	case MSG_STATS_REPLY:
		m->u.stats = (struct msg_stats_reply){ 1000, 2, 3, 4, 5, 6, 7, 8, 1ull << 33, 40, 30 };
		m->u.stats.draft_tokens = 50;
		m->u.stats.draft_accepted = 20;
		m->u.stats.draft_model_tokens = 30;
		m->u.stats.draft_model_accepted = 10;
		m->u.stats.has_draft_kv = true;
		m->u.stats.draft_kv_used = 3u << 20;
		m->u.stats.draft_kv_total = 64u << 20;
		break;
	case MSG_LEDGER_REPLY:
		m->u.ledger = (struct msg_ledger_reply){ full_ledger, 2, 9, 10 };
		break;
	case MSG_ERROR:
		m->u.error = (struct msg_error){ MSG_ERR_BUSY, B("no"), true };
		break;
	default: /* stats, ledger, ping, pong: no fields */
		break;
	}
	return n;
}

/* Whether a msgpack object has the wire type of a table field's kind. */
static bool wire_type_fits(const struct field *f, const msgpack_object *o)
{
	switch (f->kind) {
	case FK_U32: case FK_U64: return o->type == MSGPACK_OBJECT_POSITIVE_INTEGER;
	case FK_F64: case FK_F32: return o->type == MSGPACK_OBJECT_FLOAT64;
	case FK_BOOL: return o->type == MSGPACK_OBJECT_BOOLEAN;
	case FK_STR: case FK_ERRCODE: case FK_FINISH: return o->type == MSGPACK_OBJECT_STR;
	case FK_MAP: return o->type == MSGPACK_OBJECT_MAP;
	case FK_BIN: return o->type == MSGPACK_OBJECT_BIN;
	default: return o->type == MSGPACK_OBJECT_ARRAY;
	}
}

static const msgpack_object *map_get(const msgpack_object *map, const char *key)
{
	for (uint32_t i = 0; i < map->via.map.size; i++) {
		const msgpack_object *k = &map->via.map.ptr[i].key;
		if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(key) &&
		    memcmp(k->via.str.ptr, key, k->via.str.size) == 0)
			return &map->via.map.ptr[i].val;
	}
	return NULL;
}

/* Marks in *seen (bit j for field j) the table fields present in map with their wire type,
 * and checks nested tables fully: each nested map must carry every field of its table. */
static void mark_fields(const struct field_table *t, const msgpack_object *map, uint64_t *seen,
			const char *where)
{
	assert_int_equal(map->type, MSGPACK_OBJECT_MAP);
	for (size_t j = 0; j < t->n_fields; j++) {
		const struct field *f = &t->fields[j];
		const msgpack_object *o = map_get(map, f->key);
		if (!o)
			continue;
		if (!wire_type_fits(f, o))
			fail_msg("%s.%s: wrong msgpack type %d", where, f->key, (int)o->type);
		*seen |= 1ull << j;
		const msgpack_object *sub[MSG_LEDGER_MAX];
		size_t n_sub = 0;
		if (f->kind == FK_MAP)
			sub[n_sub++] = o;
		else if (f->kind == FK_MAPS)
			for (uint32_t i = 0; i < o->via.array.size && n_sub < MSG_LEDGER_MAX; i++)
				sub[n_sub++] = &o->via.array.ptr[i];
		for (size_t i = 0; i < n_sub; i++) {
			uint64_t sub_seen = 0;
			mark_fields(f->sub, sub[i], &sub_seen, f->key);
			for (size_t k = 0; k < f->sub->n_fields; k++)
				if (!(sub_seen & (1ull << k)))
					fail_msg("%s.%s.%s never reaches the wire", where, f->key,
						 f->sub->fields[k].key);
		}
		if (f->kind == FK_MAPS)
			assert_true(n_sub > 0); /* an empty array would prove nothing of its table */
	}
}

static void encode_or_fail(const struct msg *m, struct msg_buf *b)
{
	struct hearth_error err = { 0 };
	if (msg_encode(m, b, &err))
		fail_msg("encode %s: %s", msg_type_name(m->type), err.msg);
}

static void test_msg_every_table_field_reaches_the_wire_and_comes_back(void **state)
{
	(void)state;
	for (int type = MSG_HELLO; type < MSG_TYPE_COUNT; type++) {
		const struct msg_type_desc *desc = &msg_types[type];
		struct msg v[8];
		size_t n = full_messages((enum msg_type)type, v);
		uint64_t seen = 0;
		for (size_t i = 0; i < n; i++) {
			struct msg_buf b = { 0 }, again = { 0 };
			encode_or_fail(&v[i], &b);

			msgpack_unpacked up;
			msgpack_unpacked_init(&up);
			size_t off = 0;
			assert_int_equal(msgpack_unpack_next(&up, (const char *)b.data + 4, b.len - 4,
							     &off), MSGPACK_UNPACK_SUCCESS);
			mark_fields(&desc->body, &up.data, &seen, msg_type_name((enum msg_type)type));
			msgpack_unpacked_destroy(&up);

			/* Decoding and encoding again gives the same bytes: no field is lost or
			 * altered on the way through the decoder. */
			struct msg d;
			struct hearth_error err = { 0 };
			if (msg_decode(b.data + 4, b.len - 4, desc->from, &d, NULL, &err))
				fail_msg("decode %s: %s", msg_type_name((enum msg_type)type), err.msg);
			encode_or_fail(&d, &again);
			assert_int_equal(again.len, b.len);
			assert_memory_equal(again.data, b.data, b.len);
			msg_free(&d);
			msg_buf_free(&b);
			msg_buf_free(&again);
		}
		for (size_t j = 0; j < desc->body.n_fields; j++)
			if (!(seen & (1ull << j)))
				fail_msg("%s.%s never reaches the wire", msg_type_name((enum msg_type)type),
					 desc->body.fields[j].key);
	}
}

static void test_msg_encoder_leaves_out_defaults_marked_omittable(void **state)
{
	(void)state;
	/* A bare generate carries the always-written sampling fields but none of the
	 * FF_OMIT_ZERO ones (stop, logprobs, socket ...), as doc/protocol.md's example shows. */
	struct msg m;
	msg_init(&m, MSG_GENERATE, 4);
	m.u.generate.has_prompt = true;
	m.u.generate.prompt = B("hi");
	struct msg_buf b = { 0 };
	encode_or_fail(&m, &b);
	msgpack_unpacked up;
	msgpack_unpacked_init(&up);
	size_t off = 0;
	assert_int_equal(msgpack_unpack_next(&up, (const char *)b.data + 4, b.len - 4, &off),
			 MSGPACK_UNPACK_SUCCESS);
	const char *written[] = { "t", "id", "prompt", "max_tokens", "temperature", "top_k", "top_p",
				  "min_p", "repeat_penalty", "repeat_last_n" };
	assert_int_equal(up.data.via.map.size, sizeof written / sizeof written[0]);
	for (size_t i = 0; i < sizeof written / sizeof written[0]; i++)
		assert_non_null(map_get(&up.data, written[i]));
	msgpack_unpacked_destroy(&up);
	msg_buf_free(&b);
}

static void test_msg_encode_appends_frames_back_to_back(void **state)
{
	(void)state;
	struct msg_buf b = { 0 };
	struct msg m;
	for (uint64_t id = 1; id <= 3; id++) {
		msg_init(&m, MSG_PING, id);
		assert_int_equal(msg_encode(&m, &b, NULL), 0);
	}
	struct frame_reader r;
	frame_reader_init(&r, 0, NULL);
	frame_reader_feed(&r, b.data, b.len, NULL);
	const uint8_t *p;
	size_t n;
	for (uint64_t id = 1; id <= 3; id++) {
		assert_int_equal(frame_reader_next(&r, &p, &n, NULL), FRAME_READY);
		struct msg d;
		assert_int_equal(msg_decode(p, n, MSG_FROM_CLIENT, &d, NULL, NULL), 0);
		assert_int_equal(d.type, MSG_PING);
		assert_int_equal(d.id, id);
		msg_free(&d);
	}
	frame_reader_free(&r);
	msg_buf_free(&b);
}

/* embed: one source, a known pooling, no empty input or empty token array, at most
 * MSG_EMBED_INPUTS_MAX inputs; embeddings: data must be n_inputs x n_embd floats. */
static void test_msg_embed_refuses_what_it_cannot_pool(void **state)
{
	(void)state;
	struct raw r;
	struct msg m;
	raw_request(&r, "embed", 4, 0);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 4); /* no input */
	raw_request(&r, "embed", 4, 2);
	raw_str(&r, "input");
	msgpack_pack_array(&r.pk, 1);
	raw_str(&r, "a");
	raw_str(&r, "tokens");
	msgpack_pack_array(&r.pk, 1);
	msgpack_pack_array(&r.pk, 1);
	msgpack_pack_uint32(&r.pk, 3);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 4); /* both */
	raw_request(&r, "embed", 4, 1);
	raw_str(&r, "input");
	msgpack_pack_array(&r.pk, 2);
	raw_str(&r, "a");
	raw_str(&r, "");
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 4); /* an empty input */
	raw_request(&r, "embed", 4, 1);
	raw_str(&r, "tokens");
	msgpack_pack_array(&r.pk, 1);
	msgpack_pack_array(&r.pk, 0);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 4); /* an empty token array */
	raw_request(&r, "embed", 4, 1);
	raw_str(&r, "tokens");
	msgpack_pack_array(&r.pk, 1);
	msgpack_pack_array(&r.pk, 1);
	msgpack_pack_uint64(&r.pk, (uint64_t)MSG_TOKEN_MAX + 1);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 4); /* an id beyond the wire's */
	raw_request(&r, "embed", 4, 2);
	raw_str(&r, "input");
	msgpack_pack_array(&r.pk, 1);
	raw_str(&r, "a");
	raw_kv_str(&r, "pooling", "none");
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 4); /* no single vector */
	raw_request(&r, "embed", 4, 1);
	raw_str(&r, "input");
	msgpack_pack_array(&r.pk, MSG_EMBED_INPUTS_MAX + 1);
	for (int i = 0; i <= MSG_EMBED_INPUTS_MAX; i++)
		raw_str(&r, "a");
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_TOO_LARGE, 4);
	raw_request(&r, "embed", 4, 1);
	raw_str(&r, "input");
	msgpack_pack_array(&r.pk, MSG_EMBED_INPUTS_MAX);
	for (int i = 0; i < MSG_EMBED_INPUTS_MAX; i++)
		raw_str(&r, "a");
	raw_accept(&r, MSG_FROM_CLIENT, &m);
	assert_int_equal(m.u.embed.n_input, MSG_EMBED_INPUTS_MAX);
	msg_free(&m);

	/* A reply whose data does not match its counts. */
	raw_init(&r);
	msgpack_pack_map(&r.pk, 5);
	raw_kv_str(&r, "t", "embeddings");
	raw_kv_uint(&r, "id", 4);
	raw_kv_uint(&r, "n_embd", 3);
	raw_str(&r, "data");
	msgpack_pack_bin(&r.pk, 8);
	msgpack_pack_bin_body(&r.pk, "12345678", 8);
	raw_str(&r, "n_tokens");
	msgpack_pack_array(&r.pk, 1);
	msgpack_pack_uint32(&r.pk, 2);
	raw_expect(&r, MSG_FROM_DAEMON, MSG_ERR_BAD_FIELD, 4);
}

static void test_msg_rejects_speculate_beyond_its_bound(void **state)
{
	(void)state;
	struct raw r;
	raw_request(&r, "generate", 4, 2);
	raw_kv_str(&r, "prompt", "hi");
	raw_kv_uint(&r, "speculate", MSG_SPECULATE_MAX + 1);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 4);
}

static void test_msg_decode_fills_generate_defaults(void **state)
{
	(void)state;
	struct raw r;
	struct msg d;
	raw_request(&r, "generate", 3, 1);
	raw_kv_str(&r, "prompt", "hi");
	raw_accept(&r, MSG_FROM_CLIENT, &d);
	assert_int_equal(d.u.generate.max_tokens, MSG_DEFAULT_MAX_TOKENS);
	assert_true(d.u.generate.sampling.temperature == MSG_DEFAULT_TEMPERATURE);
	assert_int_equal(d.u.generate.sampling.top_k, MSG_DEFAULT_TOP_K);
	assert_true(d.u.generate.sampling.top_p == MSG_DEFAULT_TOP_P);
	assert_true(d.u.generate.sampling.min_p == MSG_DEFAULT_MIN_P);
	assert_true(d.u.generate.sampling.repeat_penalty == MSG_DEFAULT_REPEAT_PENALTY);
	assert_false(d.u.generate.has_speculate); /* absent: the daemon's default */
	assert_int_equal(d.u.generate.sampling.repeat_last_n, MSG_DEFAULT_REPEAT_LAST_N);
	assert_false(d.u.generate.sampling.has_seed);
	assert_int_equal(d.u.generate.n_stop, 0);
	msg_free(&d);
}

static void test_msg_accepts_integer_for_float_and_nil_as_absent(void **state)
{
	(void)state;
	struct raw r;
	struct msg d;
	raw_request(&r, "generate", 3, 3);
	raw_kv_str(&r, "prompt", "hi");
	raw_kv_uint(&r, "temperature", 1);
	raw_str(&r, "seed");
	msgpack_pack_nil(&r.pk);
	raw_accept(&r, MSG_FROM_CLIENT, &d);
	assert_true(d.u.generate.sampling.temperature == 1.0);
	assert_false(d.u.generate.sampling.has_seed);
	msg_free(&d);
}

/* ---- refusals ---- */

static void test_msg_rejects_truncated_payload(void **state)
{
	(void)state;
	struct msg m;
	msg_init(&m, MSG_TOKENIZE, 4);
	m.u.tokenize.has_text = true;
	m.u.tokenize.text = B("some text to cut");
	struct msg_buf b = { 0 };
	assert_int_equal(msg_encode(&m, &b, NULL), 0);
	/* every proper prefix of the payload is refused as bad_frame, none crashes */
	for (size_t n = 0; n < b.len - 4; n++) {
		struct msg d;
		struct msg_reject rej;
		assert_int_equal(msg_decode(b.data + 4, n, MSG_FROM_CLIENT, &d, &rej, NULL),
				 HEARTH_EFORMAT);
		assert_int_equal(rej.code, MSG_ERR_BAD_FRAME);
	}
	msg_buf_free(&b);
}

static void test_msg_rejects_payload_that_is_not_one_map(void **state)
{
	(void)state;
	const uint8_t array[] = { 0x91, 0x01 };
	expect_reject(array, sizeof array, MSG_FROM_CLIENT, MSG_ERR_BAD_FRAME, 0);
	const uint8_t two_maps[] = { 0x80, 0x80 };
	expect_reject(two_maps, sizeof two_maps, MSG_FROM_CLIENT, MSG_ERR_BAD_FRAME, 0);
	const uint8_t never_used[] = { 0x81, 0xc1, 0x01 };
	expect_reject(never_used, sizeof never_used, MSG_FROM_CLIENT, MSG_ERR_BAD_FRAME, 0);
	const uint8_t ext[] = { 0x81, 0xa1, 'x', 0xd4, 0x01, 0x00 };
	expect_reject(ext, sizeof ext, MSG_FROM_CLIENT, MSG_ERR_BAD_FRAME, 0);
	expect_reject("", 0, MSG_FROM_CLIENT, MSG_ERR_BAD_FRAME, 0);
}

static void test_msg_rejects_10k_levels_of_nesting_without_recursing(void **state)
{
	(void)state;
	/* {"t":"ping","id":8,"x":[[[[...10000 deep...]]]]} */
	size_t depth = 10000;
	struct raw r;
	raw_request(&r, "ping", 8, 1);
	raw_str(&r, "x");
	for (size_t i = 0; i < depth; i++)
		msgpack_pack_array(&r.pk, 1);
	msgpack_pack_nil(&r.pk);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_TOO_LARGE, 8);

	/* maps nested as values, deep enough to exhaust msgpack-c's own stack too */
	raw_request(&r, "ping", 9, 1);
	for (size_t i = 0; i < depth; i++) {
		raw_str(&r, "k");
		msgpack_pack_map(&r.pk, 1);
	}
	raw_str(&r, "k");
	msgpack_pack_nil(&r.pk);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_TOO_LARGE, 9);

	/* nesting exactly at the limit is fine for the scanner; the field is then unknown */
	raw_request(&r, "ping", 10, 1);
	raw_str(&r, "x");
	for (size_t i = 0; i < MSG_DEPTH_MAX - 1; i++)
		msgpack_pack_array(&r.pk, 1);
	msgpack_pack_nil(&r.pk);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 10);
}

static void test_msg_rejects_unknown_and_missing_type(void **state)
{
	(void)state;
	struct raw r;
	raw_request(&r, "teleport", 21, 0);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_UNKNOWN_TYPE, 21);

	raw_init(&r);
	msgpack_pack_map(&r.pk, 1);
	raw_kv_uint(&r, "id", 22);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_UNKNOWN_TYPE, 22);

	raw_init(&r);
	msgpack_pack_map(&r.pk, 2);
	raw_kv_uint(&r, "t", 5);
	raw_kv_uint(&r, "id", 23);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_UNKNOWN_TYPE, 23);

	/* a daemon-only type sent by a client, and the reverse */
	raw_request(&r, "welcome", 24, 1);
	raw_kv_uint(&r, "proto", 1);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_UNKNOWN_TYPE, 24);
	raw_request(&r, "ping", 25, 0);
	raw_expect(&r, MSG_FROM_DAEMON, MSG_ERR_UNKNOWN_TYPE, 25);
}

static void test_msg_rejects_missing_or_bad_id(void **state)
{
	(void)state;
	struct raw r;
	raw_init(&r);
	msgpack_pack_map(&r.pk, 1);
	raw_kv_str(&r, "t", "ping");
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 0);

	raw_request(&r, "ping", 0, 0);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 0);

	raw_request(&r, "ping", MSG_ID_MAX + 1, 0);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 0);

	raw_init(&r);
	msgpack_pack_map(&r.pk, 2);
	raw_kv_str(&r, "t", "ping");
	raw_str(&r, "id");
	msgpack_pack_int64(&r.pk, -4);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 0);

	raw_init(&r);
	msgpack_pack_map(&r.pk, 3);
	raw_kv_str(&r, "t", "ping");
	raw_kv_uint(&r, "id", 5);
	raw_kv_uint(&r, "id", 6);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 5);
}

static void test_msg_rejects_bad_integers(void **state)
{
	(void)state;
	struct raw r;
	raw_request(&r, "generate", 31, 2);
	raw_kv_str(&r, "prompt", "x");
	raw_str(&r, "max_tokens");
	msgpack_pack_int64(&r.pk, -1);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 31);

	raw_request(&r, "generate", 32, 2);
	raw_kv_str(&r, "prompt", "x");
	raw_kv_uint(&r, "max_tokens", (uint64_t)MSG_MAX_TOKENS_LIMIT + 1);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 32);

	raw_request(&r, "generate", 33, 2);
	raw_kv_str(&r, "prompt", "x");
	raw_str(&r, "max_tokens");
	msgpack_pack_double(&r.pk, 16.0);  /* integers must be integers */
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 33);

	raw_request(&r, "generate", 34, 1);
	raw_str(&r, "tokens");
	msgpack_pack_array(&r.pk, 2);
	msgpack_pack_uint32(&r.pk, 1);
	msgpack_pack_uint64(&r.pk, 1ull << 32);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 34);

	raw_request(&r, "cancel", 35, 1);
	raw_kv_uint(&r, "target", 0);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 35);
}

static void test_msg_rejects_bad_floats(void **state)
{
	(void)state;
	const struct { const char *key; double v; } bad[] = {
		{ "temperature", NAN }, { "temperature", INFINITY }, { "temperature", -0.5 },
		{ "temperature", 101 }, { "top_p", 0.0 }, { "top_p", 1.5 }, { "min_p", -0.1 },
		{ "repeat_penalty", 0.0 },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct raw r;
		raw_request(&r, "generate", 40 + i, 2);
		raw_kv_str(&r, "prompt", "x");
		raw_str(&r, bad[i].key);
		msgpack_pack_double(&r.pk, bad[i].v);
		raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 40 + i);
	}
}

/* One generate frame with prompt "x" and key = v, packed as a count or a double. */
static void raw_sampling(struct raw *r, uint64_t id, const struct msg_sampling_bound *b,
			 double v)
{
	raw_request(r, "generate", id, 2);
	raw_kv_str(r, "prompt", "x");
	raw_str(r, b->key);
	if (b->integer && v >= 0)
		msgpack_pack_uint64(&r->pk, (uint64_t)v);
	else if (b->integer)
		msgpack_pack_int64(&r->pk, (int64_t)v);
	else
		msgpack_pack_double(&r->pk, v);
}

/* protocol/sampling.h's table is what the command lines check; the decoder must draw the
 * same line, at both ends of every parameter. */
static void test_msg_sampling_bounds_match_the_decoder(void **state)
{
	(void)state;
	for (int p = 0; p < MSG_SAMPLING_N; p++) {
		const struct msg_sampling_bound *b = msg_sampling_bound(p);
		double step = b->integer ? 1 : 1e-6;
		struct raw r;
		struct msg m;
		raw_sampling(&r, 60, b, b->max);
		raw_accept(&r, MSG_FROM_CLIENT, &m);
		msg_free(&m);
		raw_sampling(&r, 61, b, b->max + step);
		raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 61);
		raw_sampling(&r, 62, b, b->min);
		if (b->min_open) {
			raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 62);
		} else {
			raw_accept(&r, MSG_FROM_CLIENT, &m);
			msg_free(&m);
		}
		raw_sampling(&r, 63, b, b->min - step);
		raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 63);
	}
}

/* The command-line reading of the same table: the bounds themselves are in, a step past
 * them is out, and the refusal names the flag, the interval and the text. */
static void test_msg_sampling_parse_holds_the_bounds(void **state)
{
	(void)state;
	char why[160];
	double x = -1;
	assert_true(msg_sampling_parse(MSG_SAMPLING_TEMPERATURE, "100", &x, why, sizeof why));
	assert_true(x == 100.0);
	assert_true(msg_sampling_parse(MSG_SAMPLING_TEMPERATURE, "0", &x, why, sizeof why));
	assert_true(x == 0.0);
	assert_false(msg_sampling_parse(MSG_SAMPLING_TEMPERATURE, "100.01", &x, why, sizeof why));
	assert_string_equal(why, "--temp wants a number in [0, 100], not \"100.01\"");
	assert_false(msg_sampling_parse(MSG_SAMPLING_TOP_P, "0", &x, why, sizeof why));
	assert_string_equal(why, "--top-p wants a number in (0, 1], not \"0\"");
	assert_true(msg_sampling_parse(MSG_SAMPLING_TOP_P, "1", &x, why, sizeof why));
	assert_false(msg_sampling_parse(MSG_SAMPLING_MIN_P, "-0.1", &x, why, sizeof why));
	assert_false(msg_sampling_parse(MSG_SAMPLING_REPEAT_PENALTY, "nan", &x, why, sizeof why));
	assert_true(msg_sampling_parse(MSG_SAMPLING_TOP_K, "1048576", &x, why, sizeof why));
	assert_true(x == 1048576.0);
	assert_false(msg_sampling_parse(MSG_SAMPLING_TOP_K, "1048577", &x, why, sizeof why));
	assert_string_equal(why, "--top-k wants a whole number in [0, 1048576], not \"1048577\"");
	assert_false(msg_sampling_parse(MSG_SAMPLING_REPEAT_LAST_N, "1.5", &x, why, sizeof why));
	assert_false(msg_sampling_parse(MSG_SAMPLING_REPEAT_LAST_N, "", &x, why, sizeof why));
}

static void test_msg_rejects_huge_arrays_and_strings(void **state)
{
	(void)state;
	/* array32 claiming 4 billion elements in a 30-byte frame: refused before any allocation */
	struct raw r;
	raw_request(&r, "detokenize", 51, 1);
	raw_str(&r, "tokens");
	const uint8_t a32[] = { 0xdd, 0xff, 0xff, 0xff, 0xff };
	msgpack_sbuffer_write(&r.sb, (const char *)a32, sizeof a32);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_TOO_LARGE, 51);

	/* within the array limit but more elements than bytes left */
	raw_request(&r, "detokenize", 52, 1);
	raw_str(&r, "tokens");
	const uint8_t a16[] = { 0xdc, 0x03, 0xe8, 0x01, 0x02 };
	msgpack_sbuffer_write(&r.sb, (const char *)a16, sizeof a16);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FRAME, 52);

	/* a real array one past the limit */
	raw_request(&r, "detokenize", 53, 1);
	raw_str(&r, "tokens");
	msgpack_pack_array(&r.pk, MSG_ARRAY_MAX + 1);
	for (size_t i = 0; i <= MSG_ARRAY_MAX; i++)
		msgpack_pack_uint32(&r.pk, 1);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_TOO_LARGE, 53);

	/* str32 claiming 4 GB */
	raw_request(&r, "tokenize", 54, 1);
	raw_str(&r, "text");
	const uint8_t s32[] = { 0xdb, 0xff, 0xff, 0xff, 0xff, 'a' };
	msgpack_sbuffer_write(&r.sb, (const char *)s32, sizeof s32);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_TOO_LARGE, 54);

	/* a field-specific bound: a stop string of 257 bytes, too many stop strings */
	char longstop[MSG_STOP_LEN_MAX + 2];
	memset(longstop, 's', sizeof longstop - 1);
	longstop[sizeof longstop - 1] = '\0';
	raw_request(&r, "generate", 55, 2);
	raw_kv_str(&r, "prompt", "x");
	raw_str(&r, "stop");
	msgpack_pack_array(&r.pk, 1);
	raw_str(&r, longstop);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_TOO_LARGE, 55);

	raw_request(&r, "generate", 56, 2);
	raw_kv_str(&r, "prompt", "x");
	raw_str(&r, "stop");
	msgpack_pack_array(&r.pk, MSG_STOP_MAX + 1);
	for (int i = 0; i <= MSG_STOP_MAX; i++)
		raw_str(&r, "s");
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_TOO_LARGE, 56);

	/* a top map with more entries than any message has: refused at its header, before the
	 * id inside could be read */
	raw_request(&r, "ping", 57, MSG_MAP_MAX);
	for (int i = 0; i < MSG_MAP_MAX; i++) {
		char k[16];
		snprintf(k, sizeof k, "k%d", i);
		raw_kv_uint(&r, k, 1);
	}
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_TOO_LARGE, 0);
}

static void test_msg_rejects_invalid_utf8(void **state)
{
	(void)state;
	const char *bad[] = { "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "ab\xe2\x82", "\xff" };
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct raw r;
		raw_request(&r, "generate", 60 + i, 1);
		raw_kv_str(&r, "prompt", bad[i]);
		raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 60 + i);
	}
	assert_true(msg_utf8_valid("\xf0\x9f\x94\xa5 \xe2\x82\xac \xc3\xa9", 11));
	assert_true(msg_utf8_valid("\xf4\x8f\xbf\xbf", 4));
	assert_false(msg_utf8_valid("\xe0\x80\xaf", 3)); /* overlong '/' */
}

static void test_msg_unknown_fields_are_errors_from_clients_only(void **state)
{
	(void)state;
	struct raw r;
	raw_request(&r, "generate", 70, 2);
	raw_kv_str(&r, "prompt", "x");
	raw_kv_uint(&r, "temprature", 1);  /* a typo must not be silently ignored */
	struct msg d;
	struct msg_reject rej;
	struct hearth_error err;
	assert_int_equal(msg_decode(r.sb.data, r.sb.size, MSG_FROM_CLIENT, &d, &rej, &err),
			 HEARTH_EINVAL);
	assert_int_equal(rej.code, MSG_ERR_BAD_FIELD);
	assert_non_null(strstr(err.msg, "temprature"));
	msgpack_sbuffer_destroy(&r.sb);

	/* a newer daemon's extra fields, and its newer error codes, are tolerated */
	raw_request(&r, "error", 71, 3);
	raw_kv_str(&r, "code", "quota_exceeded");
	raw_kv_str(&r, "message", "later versions may say this");
	raw_kv_uint(&r, "retry_after_ms", 100);
	raw_accept(&r, MSG_FROM_DAEMON, &d);
	assert_int_equal(d.u.error.code, MSG_ERR_INTERNAL);
	assert_bytes(d.u.error.message, "later versions may say this");
	msg_free(&d);

	/* but a known field of the wrong type is an error from either side */
	raw_request(&r, "done", 72, 2);
	raw_kv_str(&r, "finish", "stop");
	raw_kv_str(&r, "n_gen", "many");
	raw_expect(&r, MSG_FROM_DAEMON, MSG_ERR_BAD_FIELD, 72);
}

static void test_msg_rejects_duplicate_and_mistyped_fields(void **state)
{
	(void)state;
	struct raw r;
	raw_request(&r, "generate", 80, 2);
	raw_kv_str(&r, "prompt", "x");
	raw_kv_str(&r, "prompt", "y");
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 80);

	raw_request(&r, "generate", 81, 2);
	raw_kv_str(&r, "prompt", "x");
	raw_kv_uint(&r, "logprobs", 1);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 81);

	raw_request(&r, "generate", 82, 2);
	raw_kv_str(&r, "prompt", "x");
	raw_kv_str(&r, "temperature", "hot");
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 82);

	raw_request(&r, "generate", 83, 1);
	msgpack_pack_uint32(&r.pk, 7);  /* a non-string key */
	msgpack_pack_uint32(&r.pk, 7);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 83);

	raw_request(&r, "hello", 84, 1);  /* name missing */
	raw_kv_uint(&r, "proto", 1);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 84);

	raw_request(&r, "hello", 85, 2);
	raw_kv_uint(&r, "proto", 2);
	raw_kv_str(&r, "name", "future");
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_VERSION, 85);
}

static void test_msg_requires_exactly_one_prompt_source(void **state)
{
	(void)state;
	struct raw r;
	raw_request(&r, "generate", 90, 0);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 90);

	raw_request(&r, "generate", 91, 2);
	raw_kv_str(&r, "prompt", "x");
	raw_kv_uint(&r, "prompt_ref", 3);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 91);

	raw_request(&r, "generate", 92, 1);
	raw_str(&r, "tokens");
	msgpack_pack_array(&r.pk, 0);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 92);

	raw_request(&r, "tokenize", 93, 0);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 93);
}

/* chat: messages are required, each needs a role, unknown keys inside a message are refused
 * like anywhere else, and structured output takes one form at a time. */
static void test_msg_chat_rules(void **state)
{
	(void)state;
	struct raw r;
	raw_request(&r, "chat", 100, 0);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 100);

	raw_request(&r, "chat", 101, 1);
	raw_str(&r, "messages");
	msgpack_pack_array(&r.pk, 0);
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 101);

	raw_request(&r, "chat", 102, 1);
	raw_str(&r, "messages");
	msgpack_pack_array(&r.pk, 1);
	msgpack_pack_map(&r.pk, 1);
	raw_kv_str(&r, "content", "no role");
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 102);

	raw_request(&r, "chat", 103, 1);
	raw_str(&r, "messages");
	msgpack_pack_array(&r.pk, 1);
	msgpack_pack_map(&r.pk, 2);
	raw_kv_str(&r, "role", "user");
	raw_kv_str(&r, "contnet", "typo");
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 103);

	raw_request(&r, "chat", 104, 3);
	raw_str(&r, "messages");
	msgpack_pack_array(&r.pk, 1);
	msgpack_pack_map(&r.pk, 1);
	raw_kv_str(&r, "role", "user");
	raw_kv_str(&r, "grammar", "root ::= \"a\"");
	raw_kv_str(&r, "json_schema", "{}");
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 104);

	/* prompt belongs to generate: the rendering is a chat's prompt */
	raw_request(&r, "chat", 105, 2);
	raw_str(&r, "messages");
	msgpack_pack_array(&r.pk, 1);
	msgpack_pack_map(&r.pk, 1);
	raw_kv_str(&r, "role", "user");
	raw_kv_str(&r, "prompt", "x");
	raw_expect(&r, MSG_FROM_CLIENT, MSG_ERR_BAD_FIELD, 105);

	/* a chat is a request: a daemon never sends one */
	raw_request(&r, "chat", 106, 1);
	raw_str(&r, "messages");
	msgpack_pack_array(&r.pk, 1);
	msgpack_pack_map(&r.pk, 1);
	raw_kv_str(&r, "role", "user");
	raw_expect(&r, MSG_FROM_DAEMON, MSG_ERR_UNKNOWN_TYPE, 106);
}

static void test_msg_encode_refuses_what_the_peer_would_refuse(void **state)
{
	(void)state;
	struct msg_buf b = { 0 };
	struct msg m;
	struct hearth_error err;
	struct msg ok;
	msg_init(&ok, MSG_PING, 1);
	assert_int_equal(msg_encode(&ok, &b, NULL), 0);
	size_t before = b.len;

	msg_init(&m, MSG_GENERATE, 2);
	m.u.generate.has_prompt = true;
	m.u.generate.prompt = B("x");
	m.u.generate.max_tokens = MSG_MAX_TOKENS_LIMIT + 1;
	assert_int_equal(msg_encode(&m, &b, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "max_tokens"));
	assert_int_equal(b.len, before);

	msg_init(&m, MSG_GENERATE, 0);  /* requests need an id */
	m.u.generate.has_prompt = true;
	m.u.generate.prompt = B("x");
	assert_int_equal(msg_encode(&m, &b, &err), HEARTH_EINVAL);
	assert_int_equal(b.len, before);

	static uint32_t many[MSG_ARRAY_MAX];
	msg_init(&m, MSG_DETOKENIZE, 3);  /* 256k five-byte ints: above the frame maximum */
	for (size_t i = 0; i < MSG_ARRAY_MAX; i++)
		many[i] = 100000;
	m.u.detokenize.tokens = many;
	m.u.detokenize.n_tokens = MSG_ARRAY_MAX;
	assert_int_equal(msg_encode(&m, &b, &err), HEARTH_ERANGE);
	assert_int_equal(b.len, before);
	msg_buf_free(&b);
}

static void test_msg_wire_names_are_stable(void **state)
{
	(void)state;
	/* These strings are the protocol; changing one breaks every deployed client. */
	const char *codes[MSG_ERR_COUNT] = { "none", "bad_frame", "too_large", "unknown_type",
		"bad_field", "bad_state", "bad_version", "duplicate_id", "busy", "kv_full",
		"context", "bad_token", "ring", "loading", "shutting_down", "forbidden", "internal" };
	for (int i = 0; i < MSG_ERR_COUNT; i++)
		assert_string_equal(msg_errcode_name((enum msg_errcode)i), codes[i]);
	assert_string_equal(msg_finish_name(MSG_FINISH_CANCEL), "cancel");
	assert_string_equal(msg_type_name(MSG_LEDGER_REPLY), "ledger_reply");
	assert_int_equal(msg_errcode_from_hearth(HEARTH_EKVFULL), MSG_ERR_KV_FULL);
	assert_int_equal(msg_errcode_from_hearth(HEARTH_EPERM), MSG_ERR_FORBIDDEN);
	/* A client turns every wire code into a code of the one error space. */
	for (int i = 0; i < MSG_ERR_COUNT; i++)
		assert_string_not_equal(hearth_strerror(msg_errcode_to_hearth((enum msg_errcode)i)),
					"unknown_error");
	assert_int_equal(msg_errcode_to_hearth(MSG_ERR_KV_FULL), HEARTH_EKVFULL);
	assert_int_equal(msg_errcode_to_hearth(MSG_ERR_FORBIDDEN), HEARTH_EPERM);
	assert_int_equal(msg_errcode_to_hearth(MSG_ERR_SHUTTING_DOWN), HEARTH_ESHUTDOWN);
	assert_true(msg_type_is_final(MSG_ERROR));
	assert_false(msg_type_is_final(MSG_TOKEN));
	assert_false(msg_type_is_final(MSG_LOADING));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_msg_roundtrips_hello_and_welcome),
		cmocka_unit_test(test_msg_roundtrips_generate_with_every_field),
		cmocka_unit_test(test_msg_roundtrips_small_requests),
		cmocka_unit_test(test_msg_roundtrips_replies),
		cmocka_unit_test(test_msg_every_table_field_reaches_the_wire_and_comes_back),
		cmocka_unit_test(test_msg_encoder_leaves_out_defaults_marked_omittable),
		cmocka_unit_test(test_msg_encode_appends_frames_back_to_back),
		cmocka_unit_test(test_msg_decode_fills_generate_defaults),
		cmocka_unit_test(test_msg_embed_refuses_what_it_cannot_pool),
		cmocka_unit_test(test_msg_rejects_speculate_beyond_its_bound),
		cmocka_unit_test(test_msg_accepts_integer_for_float_and_nil_as_absent),
		cmocka_unit_test(test_msg_rejects_truncated_payload),
		cmocka_unit_test(test_msg_rejects_payload_that_is_not_one_map),
		cmocka_unit_test(test_msg_rejects_10k_levels_of_nesting_without_recursing),
		cmocka_unit_test(test_msg_rejects_unknown_and_missing_type),
		cmocka_unit_test(test_msg_rejects_missing_or_bad_id),
		cmocka_unit_test(test_msg_rejects_bad_integers),
		cmocka_unit_test(test_msg_rejects_bad_floats),
		cmocka_unit_test(test_msg_sampling_bounds_match_the_decoder),
		cmocka_unit_test(test_msg_sampling_parse_holds_the_bounds),
		cmocka_unit_test(test_msg_rejects_huge_arrays_and_strings),
		cmocka_unit_test(test_msg_rejects_invalid_utf8),
		cmocka_unit_test(test_msg_unknown_fields_are_errors_from_clients_only),
		cmocka_unit_test(test_msg_rejects_duplicate_and_mistyped_fields),
		cmocka_unit_test(test_msg_requires_exactly_one_prompt_source),
		cmocka_unit_test(test_msg_chat_rules),
		cmocka_unit_test(test_msg_encode_refuses_what_the_peer_would_refuse),
		cmocka_unit_test(test_msg_wire_names_are_stable),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
