/* Encoding a struct msg into one frame, driven by the same field tables as the decoder
 * (msg_fields.c), so both sides always agree on keys and types. The finished payload is run
 * through msg_decode, so a sender can never emit a frame its peer must refuse (the cost is
 * one decode per control frame; bulk data uses the ring). */
#include "protocol/msg.h"

#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/frame.h"
#include "protocol/msg_fields.h"

struct enc {
	msgpack_packer pk;
	struct msg_buf *b;
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

/* ---- msgpack values (mp_*) ---- */

static void mp_str(struct enc *e, const char *s, size_t n)
{
	msgpack_pack_str(&e->pk, n);
	msgpack_pack_str_body(&e->pk, s, n);
}

static void mp_cstr(struct enc *e, const char *s)
{
	mp_str(e, s, strlen(s));
}

static void mp_bytes(struct enc *e, struct msg_bytes v)
{
	mp_str(e, v.ptr ? v.ptr : "", v.ptr ? v.len : 0);
}

static void mp_bool(struct enc *e, bool v)
{
	if (v)
		msgpack_pack_true(&e->pk);
	else
		msgpack_pack_false(&e->pk);
}

/* The top map always has a map32 header, whatever its size. */
static void mp_map32(struct enc *e, uint32_t n)
{
	const char h[5] = { (char)0xdf, (char)(n >> 24), (char)(n >> 16), (char)(n >> 8), (char)n };
	buf_write(e, h, sizeof h);
}

/* ---- fields, through the tables of msg_fields.c ---- */

static size_t field_count(const struct field *f, const void *base)
{
	return *(const size_t *)((const char *)base + f->off_n);
}

/* False for a field the encoder leaves out: an absent optional (off_has false) or, under
 * FF_OMIT_ZERO, a false, zero or empty value. */
static bool field_present(const struct field *f, const void *base)
{
	const char *at = (const char *)base + f->off;
	if (f->off_has != FIELD_NO_OFF && !*(const bool *)((const char *)base + f->off_has))
		return false;
	if (!(f->flags & FF_OMIT_ZERO))
		return true;
	switch (f->kind) {
	case FK_U32: return *(const uint32_t *)at != 0;
	case FK_U64: return *(const uint64_t *)at != 0;
	case FK_F64: return *(const double *)at != 0;
	case FK_F32: return *(const float *)at != 0;
	case FK_BOOL: return *(const bool *)at;
	case FK_STR: return ((const struct msg_bytes *)at)->len != 0;
	case FK_U32S: case FK_STRS: case FK_U32SS: case FK_MAPS: case FK_TOP: return field_count(f, base) != 0;
	case FK_BIN: return ((const struct msg_bytes *)at)->len != 0;
	default: return true;
	}
}

static void encode_map(struct enc *e, const struct field_table *t, const void *base);

static void encode_array(struct enc *e, const struct field *f, const void *base)
{
	size_t n = field_count(f, base);
	const void *v = *(const void *const *)((const char *)base + f->off);
	msgpack_pack_array(&e->pk, n);
	for (size_t i = 0; i < n; i++) {
		switch (f->kind) {
		case FK_U32S:
			msgpack_pack_uint32(&e->pk, ((const uint32_t *)v)[i]);
			break;
		case FK_STRS:
			mp_bytes(e, ((const struct msg_bytes *)v)[i]);
			break;
		case FK_U32SS: {
			const struct msg_u32s *a = &((const struct msg_u32s *)v)[i];
			msgpack_pack_array(&e->pk, a->n);
			for (size_t j = 0; j < a->n; j++)
				msgpack_pack_uint32(&e->pk, a->v[j]);
			break;
		}
		case FK_TOP: {
			const struct msg_top *top = &((const struct msg_top *)v)[i];
			msgpack_pack_array(&e->pk, 2);
			msgpack_pack_uint32(&e->pk, top->token);
			msgpack_pack_double(&e->pk, top->logprob);
			break;
		}
		case FK_MAPS:
			encode_map(e, f->sub, (const char *)v + i * f->sub->size);
			break;
		}
	}
}

static void encode_field(struct enc *e, const struct field *f, const void *base)
{
	const char *at = (const char *)base + f->off;
	mp_cstr(e, f->key);
	switch (f->kind) {
	case FK_U32: msgpack_pack_uint64(&e->pk, *(const uint32_t *)at); break;
	case FK_U64: msgpack_pack_uint64(&e->pk, *(const uint64_t *)at); break;
	case FK_F64: msgpack_pack_double(&e->pk, *(const double *)at); break;
	case FK_F32: msgpack_pack_double(&e->pk, *(const float *)at); break;
	case FK_BOOL: mp_bool(e, *(const bool *)at); break;
	case FK_STR: mp_bytes(e, *(const struct msg_bytes *)at); break;
	case FK_U32S: case FK_STRS: case FK_U32SS: case FK_MAPS: case FK_TOP: encode_array(e, f, base); break;
	case FK_BIN: {
		const struct msg_bytes *b = (const struct msg_bytes *)at;
		msgpack_pack_bin(&e->pk, b->len);
		if (b->len)
			msgpack_pack_bin_body(&e->pk, b->ptr, b->len);
		break;
	}
	case FK_MAP: encode_map(e, f->sub, at); break;
	case FK_ERRCODE: mp_cstr(e, msg_errcode_name(*(const enum msg_errcode *)at)); break;
	case FK_FINISH: mp_cstr(e, msg_finish_name(*(const enum msg_finish *)at)); break;
	}
}

static size_t count_present(const struct field_table *t, const void *base)
{
	size_t n = 0;
	for (size_t i = 0; i < t->n_fields; i++)
		n += field_present(&t->fields[i], base);
	return n;
}

/* A nested map: its header counts the fields present. */
static void encode_map(struct enc *e, const struct field_table *t, const void *base)
{
	msgpack_pack_map(&e->pk, count_present(t, base));
	for (size_t i = 0; i < t->n_fields; i++)
		if (field_present(&t->fields[i], base))
			encode_field(e, &t->fields[i], base);
}

/* The top map: `t` and `id`, then the body's fields. */
static void encode_top(struct enc *e, const struct msg *m)
{
	const struct field_table *body = &msg_types[m->type].body;
	mp_map32(e, 2 + (uint32_t)count_present(body, &m->u));
	mp_cstr(e, "t");
	mp_cstr(e, msg_type_name(m->type));
	mp_cstr(e, "id");
	msgpack_pack_uint64(&e->pk, m->id);
	for (size_t i = 0; i < body->n_fields; i++)
		if (field_present(&body->fields[i], &m->u))
			encode_field(e, &body->fields[i], &m->u);
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
	buf_write(&e, header, sizeof header);
	encode_top(&e, m);
	const char *tn = msg_type_name(m->type);
	if (e.failed) {
		out->len = start;
		return hearth_error_set(err, HEARTH_ENOMEM, "msg_encode: %s: out of memory", tn);
	}
	uint8_t *map = out->data + start + FRAME_HEADER_SIZE;
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
	int rc = msg_decode(map, payload, msg_types[m->type].from, &check, &rej, err);
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
