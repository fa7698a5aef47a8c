/* Fuzz target for the socket side: bytes go through the incremental frame reader in
 * input-chosen pieces and every frame through the strict decoder from both directions.
 * A frame that decodes must re-encode and decode to the same type and id. */
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

static void check_payload(const uint8_t *p, size_t n, enum msg_from from)
{
	struct msg m;
	struct msg_reject rej;
	struct hearth_error err;
	int rc = msg_decode(p, n, from, &m, &rej, &err);
	if (rc) {
		FUZZ_CHECK(rej.code > MSG_ERR_NONE && rej.code < MSG_ERR_COUNT);
		FUZZ_CHECK(m.type == MSG_NONE && m.arena == NULL);
		FUZZ_CHECK(strlen(err.msg) < sizeof err.msg);
		/* the refusal itself must be encodable as an error frame */
		struct msg_buf b = { 0 };
		FUZZ_CHECK(msg_encode_error(&b, rej.id, rej.code, false, NULL, "%s", err.msg) == 0);
		msg_buf_free(&b);
		return;
	}
	FUZZ_CHECK(m.type > MSG_NONE && m.type < MSG_TYPE_COUNT);
	struct msg_buf b = { 0 };
	rc = msg_encode(&m, &b, &err);
	/* A decoded message may only fail to re-encode by growing past the frame maximum
	 * (map32 headers and float64 make the encoding larger than a compact input). */
	if (rc == 0) {
		struct msg again;
		FUZZ_CHECK(msg_decode(b.data + 4, b.len - 4, from, &again, NULL, NULL) == 0);
		FUZZ_CHECK(again.type == m.type && again.id == m.id);
		msg_free(&again);
	} else {
		FUZZ_CHECK(rc == HEARTH_ERANGE);
	}
	msg_buf_free(&b);
	msg_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* The whole input as one payload: the decoder's own attack surface. */
	check_payload(data, size, MSG_FROM_CLIENT);
	check_payload(data, size, MSG_FROM_DAEMON);

	/* The input as a byte stream: first byte picks the read size, as a socket would. */
	if (size == 0)
		return 0;
	size_t piece = (size_t)data[0] % 17 + 1;
	struct frame_reader r;
	if (frame_reader_init(&r, 4096, NULL))
		return 0;
	for (size_t at = 1; at < size; at += piece) {
		size_t n = size - at < piece ? size - at : piece;
		if (frame_reader_feed(&r, data + at, n, NULL))
			break;
		const uint8_t *p;
		size_t len;
		int rc;
		while ((rc = frame_reader_next(&r, &p, &len, NULL)) == FRAME_READY ||
		       rc == FRAME_OVERSIZED) {
			FUZZ_CHECK(rc == FRAME_OVERSIZED || len <= r.max_payload);
			if (rc == FRAME_READY)
				check_payload(p, len, MSG_FROM_CLIENT);
		}
		if (rc < 0) {
			FUZZ_CHECK(r.broken);
			break;
		}
		/* Giving an empty buffer back must leave the reader usable. */
		if (data[0] & 0x80)
			frame_reader_trim(&r, 64);
		/* never more than one frame plus one read buffered */
		FUZZ_CHECK(r.len <= FRAME_HEADER_SIZE + r.max_payload + piece);
	}
	frame_reader_free(&r);
	return 0;
}

static void add_msg(fuzz_seed_fn add, void *ctx, const struct msg *m)
{
	struct msg_buf b = { 0 };
	if (msg_encode(m, &b, NULL) == 0) {
		/* seed = piece-size byte + the frame; the payload alone is decoded too */
		uint8_t *s = malloc(b.len + 1);
		if (s) {
			s[0] = 3;
			memcpy(s + 1, b.data, b.len);
			add(ctx, s, b.len + 1);
			free(s);
		}
	}
	msg_buf_free(&b);
}

void fuzz_seeds(fuzz_seed_fn add, void *ctx)
{
	struct msg m;
	msg_init(&m, MSG_HELLO, 1);
	m.u.hello.name = (struct msg_bytes){ "fuzz", 4 };
	add_msg(add, ctx, &m);
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
	m.u.generate.sampling.has_seed = true;
	m.u.generate.sampling.seed = 42;
	add_msg(add, ctx, &m);
	msg_init(&m, MSG_GENERATE, 3);
	m.u.generate.has_prompt = true;
	m.u.generate.prompt = (struct msg_bytes){ "Hello \xc3\xa9", 8 };
	add_msg(add, ctx, &m);
	msg_init(&m, MSG_TOKENIZE, 4);
	m.u.tokenize.has_text = true;
	m.u.tokenize.text = (struct msg_bytes){ "abc", 3 };
	add_msg(add, ctx, &m);
	msg_init(&m, MSG_CANCEL, 5);
	m.u.cancel.target = 2;
	add_msg(add, ctx, &m);
	msg_init(&m, MSG_DETOKENIZE, 6);
	m.u.detokenize.tokens = toks;
	m.u.detokenize.n_tokens = 4;
	add_msg(add, ctx, &m);
	msg_init(&m, MSG_WELCOME, 1);
	m.u.welcome.daemon = (struct msg_bytes){ "0.1.0", 5 };
	m.u.welcome.model.arch = (struct msg_bytes){ "llama", 5 };
	m.u.welcome.model.n_vocab = 32000;
	add_msg(add, ctx, &m);
	static struct msg_ledger_entry ent[] = { { { "weights", 7 }, 1000 } };
	msg_init(&m, MSG_LEDGER_REPLY, 7);
	m.u.ledger.entries = ent;
	m.u.ledger.n_entries = 1;
	add_msg(add, ctx, &m);
	static struct msg_top top[] = { { 1, -0.5f } };
	msg_init(&m, MSG_TOKEN, 2);
	m.u.token.text = (struct msg_bytes){ "x", 1 };
	m.u.token.top = top;
	m.u.token.n_top = 1;
	add_msg(add, ctx, &m);
	msg_init(&m, MSG_DONE, 2);
	m.u.done.finish = MSG_FINISH_STOP;
	add_msg(add, ctx, &m);
	msg_init(&m, MSG_PING, 8);
	add_msg(add, ctx, &m);
}
