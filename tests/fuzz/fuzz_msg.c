/* Fuzz target for the message codec alone: the input is one payload, decoded strictly from
 * both directions. A payload that decodes must re-encode, and encoding what that decodes
 * to must give the same bytes again (the encoder is a fixed point after one round), so no
 * field is lost, invented or reinterpreted on the way through. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/frame.h"
#include "protocol/msg.h"
#include "tests/fuzz/fuzz.h"

void fuzz_fail(const char *file, int line, const char *what)
{
	fprintf(stderr, "%s:%d: invariant broken: %s\n", file, line, what);
	abort();
}

static void check(const uint8_t *p, size_t n, enum msg_from from)
{
	struct msg m;
	struct msg_reject rej;
	struct hearth_error err;
	if (msg_decode(p, n, from, &m, &rej, &err) < 0) {
		FUZZ_CHECK(rej.code > MSG_ERR_NONE && rej.code < MSG_ERR_COUNT);
		FUZZ_CHECK(m.type == MSG_NONE && m.arena == NULL);
		FUZZ_CHECK(memchr(err.msg, '\0', sizeof err.msg) != NULL);
		return;
	}
	struct msg_buf b1 = { 0 }, b2 = { 0 };
	int rc = msg_encode(&m, &b1, &err);
	if (rc < 0) {
		/* Only growth past the frame maximum may stop a decoded message re-encoding. */
		FUZZ_CHECK(rc == HEARTH_ERANGE);
		msg_buf_free(&b1);
		msg_free(&m);
		return;
	}
	FUZZ_CHECK(b1.len >= FRAME_HEADER_SIZE &&
		   frame_header_read(b1.data) == b1.len - FRAME_HEADER_SIZE);
	struct msg again;
	FUZZ_CHECK(msg_decode(b1.data + 4, b1.len - 4, from, &again, NULL, NULL) == 0);
	FUZZ_CHECK(again.type == m.type && again.id == m.id);
	FUZZ_CHECK(msg_encode(&again, &b2, NULL) == 0);
	FUZZ_CHECK(b2.len == b1.len && memcmp(b1.data, b2.data, b1.len) == 0);
	msg_free(&again);
	msg_buf_free(&b1);
	msg_buf_free(&b2);
	msg_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	check(data, size, MSG_FROM_CLIENT);
	check(data, size, MSG_FROM_DAEMON);
	return 0;
}

static void add_payload(fuzz_seed_fn add, void *ctx, const struct msg *m)
{
	struct msg_buf b = { 0 };
	if (msg_encode(m, &b, NULL) == 0)
		add(ctx, b.data + FRAME_HEADER_SIZE, b.len - FRAME_HEADER_SIZE);
	msg_buf_free(&b);
}

void fuzz_seeds(fuzz_seed_fn add, void *ctx)
{
	struct msg m;
	msg_init(&m, MSG_HELLO, 1);
	m.u.hello.name = (struct msg_bytes){ "fuzz", 4 };
	m.u.hello.ring = true;
	add_payload(add, ctx, &m);
	static uint32_t toks[] = { 1, 2, 300, 70000 };
	static struct msg_bytes stop[] = { { "\n", 1 }, { "END", 3 } };
	msg_init(&m, MSG_GENERATE, 2);
	m.u.generate.tokens = toks;
	m.u.generate.n_tokens = 4;
	m.u.generate.stop = stop;
	m.u.generate.n_stop = 2;
	m.u.generate.stop_tokens = toks;
	m.u.generate.n_stop_tokens = 2;
	m.u.generate.logprobs = true;
	m.u.generate.top_logprobs = 3;
	m.u.generate.sampling.temperature = 0.7;
	m.u.generate.sampling.has_seed = true;
	m.u.generate.sampling.seed = 42;
	m.u.generate.max_tokens = 0;
	add_payload(add, ctx, &m);
	msg_init(&m, MSG_GENERATE, 3);
	m.u.generate.has_prompt = true;
	m.u.generate.prompt = (struct msg_bytes){ "Hello \xc3\xa9", 8 };
	m.u.generate.stream_socket = true;
	add_payload(add, ctx, &m);
	msg_init(&m, MSG_CANCEL, 5);
	m.u.cancel.target = 2;
	add_payload(add, ctx, &m);
	msg_init(&m, MSG_WELCOME, 1);
	m.u.welcome.daemon = (struct msg_bytes){ "0.1.0", 5 };
	m.u.welcome.model.arch = (struct msg_bytes){ "llama", 5 };
	m.u.welcome.model.n_vocab = 32000;
	m.u.welcome.max_frame = FRAME_MAX_DEFAULT;
	add_payload(add, ctx, &m);
	static struct msg_top top[] = { { 1, -0.5f }, { 7, -2.25f } };
	msg_init(&m, MSG_TOKEN, 2);
	m.u.token.text = (struct msg_bytes){ "x", 1 };
	m.u.token.has_logprob = true;
	m.u.token.logprob = -0.5;
	m.u.token.top = top;
	m.u.token.n_top = 2;
	add_payload(add, ctx, &m);
	msg_init(&m, MSG_DONE, 2);
	m.u.done.finish = MSG_FINISH_LENGTH;
	m.u.done.n_prompt = 5;
	add_payload(add, ctx, &m);
	struct msg_buf b = { 0 };
	if (msg_encode_error(&b, 9, MSG_ERR_BUSY, true, NULL, "max_clients") == 0)
		add(ctx, b.data + FRAME_HEADER_SIZE, b.len - FRAME_HEADER_SIZE);
	msg_buf_free(&b);
}
