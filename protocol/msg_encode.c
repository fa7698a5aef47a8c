/* Encoding a struct msg into one frame. The top map is written with a map32 header whose
 * count is patched at the end, so optional fields need no counting pass; the finished
 * payload is then run through msg_decode, so a sender can never emit a frame its peer
 * must refuse (the cost is one decode per control frame; bulk data uses the ring). */
#include "protocol/msg.h"

#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/frame.h"

struct enc {
	msgpack_packer pk;
	struct msg_buf *b;
	uint32_t n;    /* entries written into the top map */
	bool failed;   /* out of memory */
};

static int buf_write(void *data, const char *p, size_t len)
{
	struct enc *e = data;
	struct msg_buf *b = e->b;
	if (len > b->cap - b->len) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap - b->len < len) {
			if (cap > SIZE_MAX / 2) {
				e->failed = true;
				return -1;
			}
			cap *= 2;
		}
		uint8_t *nd = realloc(b->data, cap);
		if (!nd) {
			e->failed = true;
			return -1;
		}
		b->data = nd;
		b->cap = cap;
	}
	memcpy(b->data + b->len, p, len);
	b->len += len;
	return 0;
}

static void put_str(struct enc *e, const char *s, size_t n)
{
	msgpack_pack_str(&e->pk, n);
	msgpack_pack_str_body(&e->pk, s, n);
}

static void key(struct enc *e, const char *k)
{
	put_str(e, k, strlen(k));
	e->n++;
}

static void kv_u64(struct enc *e, const char *k, uint64_t v)
{
	key(e, k);
	msgpack_pack_uint64(&e->pk, v);
}

static void kv_f64(struct enc *e, const char *k, double v)
{
	key(e, k);
	msgpack_pack_double(&e->pk, v);
}

static void kv_bool(struct enc *e, const char *k, bool v)
{
	key(e, k);
	if (v)
		msgpack_pack_true(&e->pk);
	else
		msgpack_pack_false(&e->pk);
}

static void kv_bytes(struct enc *e, const char *k, struct msg_bytes v)
{
	key(e, k);
	put_str(e, v.ptr ? v.ptr : "", v.ptr ? v.len : 0);
}

static void kv_u32s(struct enc *e, const char *k, const uint32_t *v, size_t n)
{
	key(e, k);
	msgpack_pack_array(&e->pk, n);
	for (size_t i = 0; i < n; i++)
		msgpack_pack_uint32(&e->pk, v[i]);
}

/* A nested map's entries are counted by hand; only the top map is patched. */
static void sub_u64(struct enc *e, const char *k, uint64_t v)
{
	put_str(e, k, strlen(k));
	msgpack_pack_uint64(&e->pk, v);
}

static void sub_bytes(struct enc *e, const char *k, struct msg_bytes v)
{
	put_str(e, k, strlen(k));
	put_str(e, v.ptr ? v.ptr : "", v.ptr ? v.len : 0);
}

static void encode_body(struct enc *e, const struct msg *m)
{
	switch (m->type) {
	case MSG_HELLO:
		kv_u64(e, "proto", m->u.hello.proto_major);
		kv_u64(e, "proto_minor", m->u.hello.proto_minor);
		kv_bytes(e, "name", m->u.hello.name);
		kv_bool(e, "ring", m->u.hello.ring);
		break;
	case MSG_GENERATE: {
		const struct msg_generate *g = &m->u.generate;
		const struct msg_sampling *s = &g->sampling;
		if (g->has_prompt)
			kv_bytes(e, "prompt", g->prompt);
		if (g->tokens)
			kv_u32s(e, "tokens", g->tokens, g->n_tokens);
		if (g->has_prompt_ref)
			kv_u64(e, "prompt_ref", g->prompt_ref);
		kv_u64(e, "max_tokens", g->max_tokens);
		kv_f64(e, "temperature", s->temperature);
		kv_u64(e, "top_k", s->top_k);
		kv_f64(e, "top_p", s->top_p);
		kv_f64(e, "min_p", s->min_p);
		kv_f64(e, "repeat_penalty", s->repeat_penalty);
		kv_u64(e, "repeat_last_n", s->repeat_last_n);
		if (s->has_seed)
			kv_u64(e, "seed", s->seed);
		if (g->n_stop) {
			key(e, "stop");
			msgpack_pack_array(&e->pk, g->n_stop);
			for (size_t i = 0; i < g->n_stop; i++)
				put_str(e, g->stop[i].ptr ? g->stop[i].ptr : "",
					g->stop[i].ptr ? g->stop[i].len : 0);
		}
		if (g->n_stop_tokens)
			kv_u32s(e, "stop_tokens", g->stop_tokens, g->n_stop_tokens);
		if (g->logprobs)
			kv_bool(e, "logprobs", true);
		if (g->top_logprobs)
			kv_u64(e, "top_logprobs", g->top_logprobs);
		if (g->logits)
			kv_bool(e, "logits", true);
		if (g->stream_socket)
			kv_bool(e, "socket", true);
		if (g->ignore_eos)
			kv_bool(e, "ignore_eos", true);
		break;
	}
	case MSG_CANCEL:
		kv_u64(e, "target", m->u.cancel.target);
		break;
	case MSG_TOKENIZE:
		if (m->u.tokenize.has_text)
			kv_bytes(e, "text", m->u.tokenize.text);
		if (m->u.tokenize.has_text_ref)
			kv_u64(e, "text_ref", m->u.tokenize.text_ref);
		kv_bool(e, "add_bos", m->u.tokenize.add_bos);
		kv_bool(e, "special", m->u.tokenize.special);
		break;
	case MSG_DETOKENIZE:
		kv_u32s(e, "tokens", m->u.detokenize.tokens, m->u.detokenize.n_tokens);
		break;
	case MSG_STATS: case MSG_LEDGER: case MSG_PING: case MSG_PONG:
		break;
	case MSG_WELCOME: {
		const struct msg_welcome *w = &m->u.welcome;
		kv_u64(e, "proto", w->proto_major);
		kv_u64(e, "proto_minor", w->proto_minor);
		kv_bytes(e, "daemon", w->daemon);
		key(e, "model");
		msgpack_pack_map(&e->pk, 9);
		sub_bytes(e, "arch", w->model.arch);
		sub_bytes(e, "name", w->model.name);
		sub_bytes(e, "quant", w->model.quant);
		sub_u64(e, "n_params", w->model.n_params);
		sub_u64(e, "n_ctx", w->model.n_ctx);
		sub_u64(e, "n_ctx_train", w->model.n_ctx_train);
		sub_u64(e, "n_vocab", w->model.n_vocab);
		sub_u64(e, "n_layer", w->model.n_layer);
		sub_u64(e, "n_embd", w->model.n_embd);
		kv_u64(e, "max_frame", w->max_frame);
		kv_bool(e, "ring", w->ring);
		kv_u64(e, "ring_d2c", w->ring_d2c);
		kv_u64(e, "ring_c2d", w->ring_c2d);
		break;
	}
	case MSG_LOADING:
		kv_bytes(e, "phase", m->u.loading.phase);
		kv_u64(e, "done", m->u.loading.done);
		kv_u64(e, "total", m->u.loading.total);
		break;
	case MSG_TOKEN: {
		const struct msg_token *t = &m->u.token;
		kv_u64(e, "token", t->token);
		kv_bytes(e, "text", t->text);
		if (t->has_logprob)
			kv_f64(e, "logprob", t->logprob);
		if (t->n_top) {
			key(e, "top");
			msgpack_pack_array(&e->pk, t->n_top);
			for (size_t i = 0; i < t->n_top; i++) {
				msgpack_pack_array(&e->pk, 2);
				msgpack_pack_uint32(&e->pk, t->top[i].token);
				msgpack_pack_double(&e->pk, t->top[i].logprob);
			}
		}
		break;
	}
	case MSG_DONE: {
		const struct msg_done *d = &m->u.done;
		const char *f = msg_finish_name(d->finish);
		key(e, "finish");
		put_str(e, f, strlen(f));
		kv_u64(e, "n_prompt", d->n_prompt);
		kv_u64(e, "n_gen", d->n_gen);
		kv_f64(e, "queue_ms", d->queue_ms);
		kv_f64(e, "prefill_ms", d->prefill_ms);
		kv_f64(e, "decode_ms", d->decode_ms);
		kv_f64(e, "prefill_tps", d->prefill_tps);
		kv_f64(e, "decode_tps", d->decode_tps);
		break;
	}
	case MSG_TOKENS:
		kv_u32s(e, "tokens", m->u.tokens.tokens, m->u.tokens.n_tokens);
		break;
	case MSG_TEXT:
		kv_bytes(e, "text", m->u.text.text);
		break;
	case MSG_STATS_REPLY: {
		const struct msg_stats_reply *s = &m->u.stats;
		kv_u64(e, "uptime_ms", s->uptime_ms);
		kv_u64(e, "clients", s->clients);
		kv_u64(e, "running", s->running);
		kv_u64(e, "queued", s->queued);
		kv_u64(e, "prompt_tokens", s->prompt_tokens);
		kv_u64(e, "gen_tokens", s->gen_tokens);
		kv_u64(e, "kv_used", s->kv_used);
		kv_u64(e, "kv_total", s->kv_total);
		kv_u64(e, "rss", s->rss);
		break;
	}
	case MSG_LEDGER_REPLY: {
		const struct msg_ledger_reply *l = &m->u.ledger;
		key(e, "entries");
		msgpack_pack_array(&e->pk, l->n_entries);
		for (size_t i = 0; i < l->n_entries; i++) {
			msgpack_pack_map(&e->pk, 2);
			sub_bytes(e, "name", l->entries[i].name);
			sub_u64(e, "bytes", l->entries[i].bytes);
		}
		kv_u64(e, "total", l->total);
		kv_u64(e, "peak", l->peak);
		break;
	}
	case MSG_ERROR: {
		const char *c = msg_errcode_name(m->u.error.code);
		key(e, "code");
		put_str(e, c, strlen(c));
		kv_bytes(e, "message", m->u.error.message);
		kv_bool(e, "fatal", m->u.error.fatal);
		break;
	}
	default:
		break;
	}
}

static enum msg_from type_from(enum msg_type t)
{
	return t >= MSG_HELLO && t <= MSG_PING ? MSG_FROM_CLIENT : MSG_FROM_DAEMON;
}

int msg_encode(const struct msg *m, struct msg_buf *out, struct hearth_error *err)
{
	if ((unsigned)m->type >= MSG_TYPE_COUNT || m->type == MSG_NONE)
		return hearth_error_set(err, HEARTH_EINVAL, "msg_encode: no message type %d",
					(int)m->type);
	size_t start = out->len;
	struct enc e = { .b = out };
	msgpack_packer_init(&e.pk, &e, buf_write);
	static const char header[FRAME_HEADER_SIZE] = { 0 };
	static const char map32[5] = { (char)0xdf, 0, 0, 0, 0 };
	buf_write(&e, header, sizeof header);
	buf_write(&e, map32, sizeof map32);
	key(&e, "t");
	const char *tn = msg_type_name(m->type);
	put_str(&e, tn, strlen(tn));
	kv_u64(&e, "id", m->id);
	encode_body(&e, m);
	if (e.failed) {
		out->len = start;
		return hearth_error_set(err, HEARTH_ENOMEM, "msg_encode: %s: out of memory", tn);
	}
	uint8_t *map = out->data + start + FRAME_HEADER_SIZE;
	map[1] = (uint8_t)(e.n >> 24);
	map[2] = (uint8_t)(e.n >> 16);
	map[3] = (uint8_t)(e.n >> 8);
	map[4] = (uint8_t)e.n;
	size_t payload = out->len - start - FRAME_HEADER_SIZE;
	if (payload > FRAME_MAX_DEFAULT) {
		out->len = start;
		return hearth_error_set(err, HEARTH_ERANGE,
					"msg_encode: %s frame of %zu bytes above the maximum %u: "
					"send bulk data through the ring", tn, payload, FRAME_MAX_DEFAULT);
	}
	frame_header_write(out->data + start, payload);

	struct msg check;
	struct msg_reject rej;
	int rc = msg_decode(map, payload, type_from(m->type), &check, &rej, err);
	msg_free(&check);
	if (rc) {
		out->len = start;
		hearth_error_prefix(err, "msg_encode: would be refused as %s", msg_errcode_name(rej.code));
		return rc;
	}
	return 0;
}

int msg_encode_error(struct msg_buf *out, uint64_t id, enum msg_errcode code, bool fatal,
		     struct hearth_error *err, const char *fmt, ...)
{
	char text[MSG_MESSAGE_MAX + 1];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	size_t len = (size_t)n < MSG_MESSAGE_MAX ? (size_t)n : MSG_MESSAGE_MAX;
	struct msg m;
	msg_init(&m, MSG_ERROR, id);
	m.u.error.code = code;
	m.u.error.fatal = fatal;
	m.u.error.message.ptr = text;
	m.u.error.message.len = len;
	return msg_encode(&m, out, err);
}
