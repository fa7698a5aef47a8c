/* Strict decoding of one frame payload into a struct msg. A bounds pre-scan walks the raw
 * msgpack iteratively (no recursion, no allocation) so depth, sizes and element counts are
 * known to be sane before msgpack-c builds objects; then a table per message type checks
 * every field's type and range and copies it into memory the msg owns. */
#include "protocol/msg.h"
#include "protocol/msg_fields.h"

#include <math.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/sampling.h"

/* msgpack-c allocates one msgpack_object (24 bytes) per array element before we see it;
 * a bound on all elements of a frame bounds that transient. */
#define MSG_OBJECTS_MAX (MSG_ARRAY_MAX + 4096u)

/* ---- arena: every pointer of a decoded msg, freed at once by msg_free ---- */

struct msg_arena_block {
	struct msg_arena_block *next;
	size_t used;
	size_t cap;
	max_align_t data[];
};

static void *msg_arena_take(struct msg *m, size_t size)
{
	size = (size + 15) & ~(size_t)15;
	struct msg_arena_block *b = m->arena;
	if (!b || b->cap - b->used < size) {
		size_t cap = size > 4096 ? size : 4096;
		b = malloc(sizeof *b + cap);
		if (!b)
			return NULL;
		b->used = 0;
		b->cap = cap;
		b->next = m->arena;
		m->arena = b;
	}
	void *p = (char *)b->data + b->used;
	b->used += size;
	return p;
}

void msg_free(struct msg *m)
{
	struct msg_arena_block *b = m->arena;
	while (b) {
		struct msg_arena_block *next = b->next;
		free(b);
		b = next;
	}
	memset(m, 0, sizeof *m);
}

/* ---- UTF-8: strict (no overlongs, no surrogates, nothing above U+10FFFF) ---- */

bool msg_utf8_valid(const void *text, size_t n)
{
	const uint8_t *s = text;
	size_t i = 0;
	while (i < n) {
		uint8_t c = s[i];
		if (c < 0x80) {
			i++;
			continue;
		}
		size_t k;
		uint32_t cp, min;
		if ((c & 0xe0) == 0xc0) { k = 1; cp = c & 0x1f; min = 0x80; }
		else if ((c & 0xf0) == 0xe0) { k = 2; cp = c & 0x0f; min = 0x800; }
		else if ((c & 0xf8) == 0xf0) { k = 3; cp = c & 0x07; min = 0x10000; }
		else return false;
		if (n - i <= k)
			return false;
		for (size_t j = 1; j <= k; j++) {
			if ((s[i + j] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (s[i + j] & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += k + 1;
	}
	return true;
}

/* ---- pre-scan ---- */

/* The caller has filled err; this records the wire code that goes with it. */
static int reject(struct msg_reject *rej, enum msg_errcode code, int hcode)
{
	rej->code = code;
	return hcode;
}

/* Marks a remaining[] entry as an array's (item counts stay far below this bit). */
#define SCAN_ARRAY (1ull << 63)

static uint64_t be_read(const uint8_t *p, size_t n)
{
	uint64_t v = 0;
	for (size_t i = 0; i < n; i++)
		v = v << 8 | p[i];
	return v;
}

/* One msgpack object's header, as scan_header reads it. */
struct scan_obj {
	size_t at;         /* byte offset of the header, for messages */
	int container;     /* 0 scalar, 1 array, 2 map */
	int is_str;        /* 0, 1 str, 2 bin */
	bool is_uint;
	uint64_t count;    /* container entries, or payload bytes of a str/bin */
	uint64_t value;    /* an unsigned integer's value */
};

static int scan_truncated(size_t pos, struct msg_reject *rej, struct hearth_error *err)
{
	hearth_error_set(err, HEARTH_EFORMAT, "frame: msgpack truncated at byte %zu", pos);
	return reject(rej, MSG_ERR_BAD_FRAME, HEARTH_EFORMAT);
}

/* Reads the header at *pos and moves *pos past it and past a scalar's fixed-size value (a
 * str/bin payload and a container's items stay for the caller). Refuses ext types and 0xc1. */
static int scan_header(const uint8_t *p, size_t n, size_t *pos, struct scan_obj *o,
		       struct msg_reject *rej, struct hearth_error *err)
{
	if (*pos >= n)
		return scan_truncated(*pos, rej, err);
	memset(o, 0, sizeof *o);
	o->at = *pos;
	uint8_t b = p[(*pos)++];
	size_t lenbytes = 0, fixed = 0;

	if (b <= 0x7f) { o->is_uint = true; }
	else if (b <= 0x8f) { o->container = 2; o->count = b & 0x0f; }
	else if (b <= 0x9f) { o->container = 1; o->count = b & 0x0f; }
	else if (b <= 0xbf) { o->is_str = 1; o->count = b & 0x1f; }
	else if (b >= 0xe0) { /* negative fixint */ }
	else switch (b) {
	case 0xc0: case 0xc2: case 0xc3: break;
	case 0xc4: o->is_str = 2; lenbytes = 1; break;
	case 0xc5: o->is_str = 2; lenbytes = 2; break;
	case 0xc6: o->is_str = 2; lenbytes = 4; break;
	case 0xca: fixed = 4; break;
	case 0xcb: fixed = 8; break;
	case 0xcc: fixed = 1; o->is_uint = true; break;
	case 0xcd: fixed = 2; o->is_uint = true; break;
	case 0xce: fixed = 4; o->is_uint = true; break;
	case 0xcf: fixed = 8; o->is_uint = true; break;
	case 0xd0: fixed = 1; break;
	case 0xd1: fixed = 2; break;
	case 0xd2: fixed = 4; break;
	case 0xd3: fixed = 8; break;
	case 0xd9: o->is_str = 1; lenbytes = 1; break;
	case 0xda: o->is_str = 1; lenbytes = 2; break;
	case 0xdb: o->is_str = 1; lenbytes = 4; break;
	case 0xdc: o->container = 1; lenbytes = 2; break;
	case 0xdd: o->container = 1; lenbytes = 4; break;
	case 0xde: o->container = 2; lenbytes = 2; break;
	case 0xdf: o->container = 2; lenbytes = 4; break;
	case 0xc1:
		hearth_error_set(err, HEARTH_EFORMAT, "frame: byte 0xc1 (never used) at %zu", o->at);
		return reject(rej, MSG_ERR_BAD_FRAME, HEARTH_EFORMAT);
	default: /* 0xc7-0xc9, 0xd4-0xd8: ext types */
		hearth_error_set(err, HEARTH_EFORMAT,
				 "frame: msgpack ext type 0x%02x at byte %zu is not used by "
				 "this protocol", b, o->at);
		return reject(rej, MSG_ERR_BAD_FRAME, HEARTH_EFORMAT);
	}
	if (lenbytes + fixed > n - *pos)
		return scan_truncated(*pos, rej, err);
	if (lenbytes) {
		o->count = be_read(p + *pos, lenbytes);
		*pos += lenbytes;
	}
	if (o->is_uint)
		o->value = fixed ? be_read(p + *pos, fixed) : b;
	*pos += fixed;
	return 0;
}

/* A container's entry count against its bound, the nesting depth, and the bytes left
 * (every item takes at least one byte). *items is what the container counts down. */
static int scan_container(const struct scan_obj *o, size_t depth, size_t left, uint64_t *items,
			  struct msg_reject *rej, struct hearth_error *err)
{
	uint64_t limit = o->container == 2 ? MSG_MAP_MAX : MSG_ARRAY_MAX;
	if (o->count > limit) {
		hearth_error_set(err, HEARTH_ERANGE, "frame: %s of %llu entries at byte %zu (limit %llu)",
				 o->container == 2 ? "map" : "array", (unsigned long long)o->count,
				 o->at, (unsigned long long)limit);
		return reject(rej, MSG_ERR_TOO_LARGE, HEARTH_ERANGE);
	}
	if (depth >= MSG_DEPTH_MAX) {
		hearth_error_set(err, HEARTH_ERANGE, "frame: nesting deeper than %d at byte %zu",
				 MSG_DEPTH_MAX, o->at);
		return reject(rej, MSG_ERR_TOO_LARGE, HEARTH_ERANGE);
	}
	*items = o->container == 2 ? o->count * 2 : o->count;
	if (*items > left) {
		hearth_error_set(err, HEARTH_EFORMAT,
				 "frame: %llu items announced at byte %zu, %zu bytes left",
				 (unsigned long long)*items, o->at, left);
		return reject(rej, MSG_ERR_BAD_FRAME, HEARTH_EFORMAT);
	}
	return 0;
}

/* A str/bin payload against MSG_STR_MAX and the bytes left. */
static int scan_payload(const struct scan_obj *o, size_t left, struct msg_reject *rej,
			struct hearth_error *err)
{
	if (o->is_str && o->count > MSG_STR_MAX) {
		hearth_error_set(err, HEARTH_ERANGE, "frame: string of %llu bytes at byte %zu (limit %u)",
				 (unsigned long long)o->count, o->at, MSG_STR_MAX);
		return reject(rej, MSG_ERR_TOO_LARGE, HEARTH_ERANGE);
	}
	if (o->count > left) {
		hearth_error_set(err, HEARTH_EFORMAT, "frame: %llu bytes announced at byte %zu, %zu left",
				 (unsigned long long)o->count, o->at, left);
		return reject(rej, MSG_ERR_BAD_FRAME, HEARTH_EFORMAT);
	}
	return 0;
}

/* Walks the msgpack bytes once. Checks: one top-level map, nothing after it, no container
 * deeper than MSG_DEPTH_MAX, counts and lengths within bounds and within the bytes that
 * remain, no ext types. Also picks up the top map's "id" so even a refused frame can be
 * answered with its request's id. */
static int scan_frame(const uint8_t *p, size_t n, struct msg_reject *rej,
		      struct hearth_error *err)
{
	uint64_t remaining[MSG_DEPTH_MAX];
	size_t depth = 0, pos = 0, objects = 0;
	bool top_seen = false, id_key = false;
	int rc;

	while (!(depth == 0 && top_seen)) {
		struct scan_obj o;
		if ((rc = scan_header(p, n, &pos, &o, rej, err)))
			return rc;
		if (depth == 0 && o.container != 2) {
			hearth_error_set(err, HEARTH_EFORMAT, "frame: payload is not a msgpack map");
			return reject(rej, MSG_ERR_BAD_FRAME, HEARTH_EFORMAT);
		}
		/* A map counts down 2n items, so an even count left means a key comes next. */
		bool is_key = depth > 0 && !(remaining[depth - 1] & SCAN_ARRAY) &&
			      remaining[depth - 1] % 2 == 0;
		if (depth > 0)
			remaining[depth - 1]--;
		if (++objects > MSG_OBJECTS_MAX) {
			hearth_error_set(err, HEARTH_ERANGE, "frame: more than %u objects",
					 MSG_OBJECTS_MAX);
			return reject(rej, MSG_ERR_TOO_LARGE, HEARTH_ERANGE);
		}
		/* The top map's "id": the key is a str at depth 1, the next object its value. */
		if (depth == 1) {
			if (id_key && o.is_uint && rej->id == 0 && o.value <= MSG_ID_MAX)
				rej->id = o.value;
			id_key = false;
		}

		if (o.container) {
			uint64_t items;
			if ((rc = scan_container(&o, depth, n - pos, &items, rej, err)))
				return rc;
			if (depth == 0)
				top_seen = true;
			remaining[depth++] = items | (o.container == 2 ? 0 : SCAN_ARRAY);
		} else {
			if ((rc = scan_payload(&o, n - pos, rej, err)))
				return rc;
			if (depth == 1 && is_key && o.is_str == 1 && o.count == 2 &&
			    memcmp(p + pos, "id", 2) == 0)
				id_key = true;
			pos += o.count;
		}
		while (depth > 0 && (remaining[depth - 1] & ~SCAN_ARRAY) == 0)
			depth--;
	}
	if (pos != n) {
		hearth_error_set(err, HEARTH_EFORMAT, "frame: %zu bytes after the top-level map",
				 n - pos);
		return reject(rej, MSG_ERR_BAD_FRAME, HEARTH_EFORMAT);
	}
	return 0;
}

/* ---- decoding values ---- */

struct dec {
	struct msg *m;
	bool strict;                 /* unknown fields are errors */
	const char *tname;           /* for messages: "generate" */
	struct msg_reject *rej;
	struct hearth_error *err;
};

/* problem and detail are joined: ("expected a string, got ", "a map"). */
static int bad_field(struct dec *d, const char *key, const char *problem, const char *detail)
{
	hearth_error_set(d->err, HEARTH_EINVAL, "%s.%s: %s%s", d->tname, key, problem, detail);
	d->rej->code = MSG_ERR_BAD_FIELD;
	return HEARTH_EINVAL;
}

static int no_memory(struct dec *d, const char *key)
{
	hearth_error_set(d->err, HEARTH_ENOMEM, "%s.%s: out of memory", d->tname, key);
	d->rej->code = MSG_ERR_INTERNAL;
	return HEARTH_ENOMEM;
}

static const char *kind_name(msgpack_object_type t)
{
	switch (t) {
	case MSGPACK_OBJECT_NIL: return "nil";
	case MSGPACK_OBJECT_BOOLEAN: return "a boolean";
	case MSGPACK_OBJECT_POSITIVE_INTEGER: return "an unsigned integer";
	case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "a negative integer";
	case MSGPACK_OBJECT_FLOAT32: case MSGPACK_OBJECT_FLOAT64: return "a float";
	case MSGPACK_OBJECT_STR: return "a string";
	case MSGPACK_OBJECT_BIN: return "bin";
	case MSGPACK_OBJECT_ARRAY: return "an array";
	case MSGPACK_OBJECT_MAP: return "a map";
	default: return "ext";
	}
}

static int get_uint(struct dec *d, const char *key, const msgpack_object *o, double min,
		    double max, unsigned flags, uint64_t *out)
{
	if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		return bad_field(d, key, "expected an unsigned integer, got ", kind_name(o->type));
	uint64_t v = o->via.u64;
	/* Compare in integers where the bound is exact, so FIELD_U64MAX rounding cannot leak. */
	if (max < FIELD_U64MAX && (double)v > max)
		return bad_field(d, key, "value above the limit", "");
	if ((double)v < min || ((flags & FF_MIN_OPEN) && (double)v <= min))
		return bad_field(d, key, "value below the limit", "");
	*out = v;
	return 0;
}

static int get_double(struct dec *d, const char *key, const msgpack_object *o, double min,
		      double max, unsigned flags, double *out)
{
	double v;
	switch (o->type) {
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64: v = o->via.f64; break;
	case MSGPACK_OBJECT_POSITIVE_INTEGER: v = (double)o->via.u64; break;
	case MSGPACK_OBJECT_NEGATIVE_INTEGER: v = (double)o->via.i64; break;
	default: return bad_field(d, key, "expected a number, got ", kind_name(o->type));
	}
	if (!isfinite(v))
		return bad_field(d, key, "not a finite number", "");
	if (v > max || v < min || ((flags & FF_MIN_OPEN) && v <= min))
		return bad_field(d, key, "value out of range", "");
	*out = v;
	return 0;
}

/* n bytes at p copied into the message's memory (NUL-terminated, 16-byte aligned). */
static int copy_bytes(struct dec *d, const char *key, const char *p, size_t n, struct msg_bytes *out)
{
	char *s = msg_arena_take(d->m, n + 1);
	if (!s)
		return no_memory(d, key);
	memcpy(s, p, n);
	s[n] = '\0';
	out->ptr = s;
	out->len = n;
	return 0;
}

static int get_bytes(struct dec *d, const char *key, const msgpack_object *o, size_t max,
		     unsigned flags, struct msg_bytes *out)
{
	if (o->type != MSGPACK_OBJECT_STR)
		return bad_field(d, key, "expected a string, got ", kind_name(o->type));
	size_t n = o->via.str.size;
	if (n > max) {
		hearth_error_set(d->err, HEARTH_ERANGE, "%s.%s: string of %zu bytes (limit %zu)",
				 d->tname, key, n, max);
		d->rej->code = MSG_ERR_TOO_LARGE;
		return HEARTH_ERANGE;
	}
	if ((flags & FF_NONEMPTY) && n == 0)
		return bad_field(d, key, "must not be empty", "");
	if ((flags & FF_UTF8) && !msg_utf8_valid(o->via.str.ptr, n))
		return bad_field(d, key, "not valid UTF-8", "");
	return copy_bytes(d, key, o->via.str.ptr, n, out);
}

/* Binary data (msgpack bin), copied aligned so a reader may cast it to floats. */
static int get_bin(struct dec *d, const char *key, const msgpack_object *o, size_t max, struct msg_bytes *out)
{
	if (o->type != MSGPACK_OBJECT_BIN)
		return bad_field(d, key, "expected binary data, got ", kind_name(o->type));
	size_t n = o->via.bin.size;
	if (n > max) {
		hearth_error_set(d->err, HEARTH_ERANGE, "%s.%s: %zu bytes (limit %zu)", d->tname, key, n, max);
		d->rej->code = MSG_ERR_TOO_LARGE;
		return HEARTH_ERANGE;
	}
	return copy_bytes(d, key, o->via.bin.ptr, n, out);
}

static int get_array(struct dec *d, const char *key, const msgpack_object *o, size_t max,
		     unsigned flags)
{
	if (o->type != MSGPACK_OBJECT_ARRAY)
		return bad_field(d, key, "expected an array, got ", kind_name(o->type));
	if (o->via.array.size > max) {
		hearth_error_set(d->err, HEARTH_ERANGE, "%s.%s: array of %u elements (limit %zu)",
				 d->tname, key, o->via.array.size, max);
		d->rej->code = MSG_ERR_TOO_LARGE;
		return HEARTH_ERANGE;
	}
	if ((flags & FF_NONEMPTY) && o->via.array.size == 0)
		return bad_field(d, key, "must not be empty", "");
	return 0;
}

static int decode_map(struct dec *d, const msgpack_object *o, const struct field_table *t,
		      void *base, bool top);

/* Bytes of one element of an array field. */
static size_t elem_size(const struct field *f)
{
	switch (f->kind) {
	case FK_U32S: return sizeof(uint32_t);
	case FK_STRS: return sizeof(struct msg_bytes);
	case FK_U32SS: return sizeof(struct msg_u32s);
	case FK_TOP: return sizeof(struct msg_top);
	default: return f->sub->size; /* FK_MAPS */
	}
}

/* One element of an array field into at. */
static int decode_elem(struct dec *d, const struct field *f, const msgpack_object *e, void *at)
{
	int rc;
	switch (f->kind) {
	case FK_U32S: {
		uint64_t x;
		if ((rc = get_uint(d, f->key, e, 0, f->elem_max, 0, &x)))
			return rc;
		*(uint32_t *)at = (uint32_t)x;
		return 0;
	}
	case FK_STRS:
		return get_bytes(d, f->key, e, (size_t)f->elem_max, FF_UTF8 | FF_NONEMPTY, at);
	case FK_U32SS: {
		struct msg_u32s *a = at;
		if ((rc = get_array(d, f->key, e, MSG_ARRAY_MAX, FF_NONEMPTY)))
			return rc;
		a->n = e->via.array.size;
		a->v = msg_arena_take(d->m, a->n * sizeof *a->v);
		if (!a->v)
			return no_memory(d, f->key);
		for (size_t i = 0; i < a->n; i++) {
			uint64_t x;
			if ((rc = get_uint(d, f->key, &e->via.array.ptr[i], 0, f->elem_max, 0, &x)))
				return rc;
			a->v[i] = (uint32_t)x;
		}
		return 0;
	}
	case FK_TOP: {
		if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size != 2)
			return bad_field(d, f->key, "entries must be [token, logprob]", "");
		uint64_t tok;
		double lp;
		if ((rc = get_uint(d, f->key, &e->via.array.ptr[0], 0, MSG_TOKEN_MAX, 0, &tok)) ||
		    (rc = get_double(d, f->key, &e->via.array.ptr[1], -1e30, 0, 0, &lp)))
			return rc;
		((struct msg_top *)at)->token = (uint32_t)tok;
		((struct msg_top *)at)->logprob = (float)lp;
		return 0;
	}
	default: /* FK_MAPS */
		return decode_map(d, e, f->sub, at, false);
	}
}

/* An array field: its bounds, then each element into memory the msg owns. */
static int decode_array(struct dec *d, const struct field *f, const msgpack_object *o,
			void *base)
{
	int rc = get_array(d, f->key, o, (size_t)f->max, f->flags);
	if (rc)
		return rc;
	size_t n = o->via.array.size, size = elem_size(f);  /* n <= MSG_ARRAY_MAX */
	char *v = msg_arena_take(d->m, n ? n * size : 1);
	if (!v)
		return no_memory(d, f->key);
	memset(v, 0, n * size);
	for (size_t i = 0; i < n; i++)
		if ((rc = decode_elem(d, f, &o->via.array.ptr[i], v + i * size)))
			return rc;
	*(void **)((char *)base + f->off) = v;
	*(size_t *)((char *)base + f->off_n) = n;
	return 0;
}

/* An error code or finish reason by its wire name. */
static int decode_name(struct dec *d, const struct field *f, const msgpack_object *o, int *at)
{
	if (o->type != MSGPACK_OBJECT_STR)
		return bad_field(d, f->key, "expected a string, got ", kind_name(o->type));
	size_t count = f->kind == FK_ERRCODE ? MSG_ERR_COUNT : MSG_FINISH_COUNT;
	for (size_t i = 0; i < count; i++) {
		const char *name = f->kind == FK_ERRCODE ? msg_errcode_name((enum msg_errcode)i)
						       : msg_finish_name((enum msg_finish)i);
		if (strlen(name) == o->via.str.size &&
		    memcmp(name, o->via.str.ptr, o->via.str.size) == 0) {
			*at = (int)i;
			return 0;
		}
	}
	/* A newer daemon's code or reason: keep the frame, degrade to the generic one. */
	if (d->strict)
		return bad_field(d, f->key, "unknown value", "");
	*at = f->kind == FK_ERRCODE ? MSG_ERR_INTERNAL : MSG_FINISH_OK;
	return 0;
}

static int decode_field(struct dec *d, const struct field *f, const msgpack_object *o,
			void *base)
{
	char *at = (char *)base + f->off;
	int rc;
	switch (f->kind) {
	case FK_U32: {
		uint64_t v;
		if ((rc = get_uint(d, f->key, o, f->min, f->max, f->flags, &v)))
			return rc;
		*(uint32_t *)at = (uint32_t)v;
		return 0;
	}
	case FK_U64:
		return get_uint(d, f->key, o, f->min, f->max, f->flags, (uint64_t *)at);
	case FK_F64:
		return get_double(d, f->key, o, f->min, f->max, f->flags, (double *)at);
	case FK_F32: {
		double v;
		if ((rc = get_double(d, f->key, o, f->min, f->max, f->flags, &v)))
			return rc;
		*(float *)at = (float)v;
		return 0;
	}
	case FK_BOOL:
		if (o->type != MSGPACK_OBJECT_BOOLEAN)
			return bad_field(d, f->key, "expected a boolean, got ", kind_name(o->type));
		*(bool *)at = o->via.boolean;
		return 0;
	case FK_STR:
		return get_bytes(d, f->key, o, (size_t)f->max, f->flags, (struct msg_bytes *)at);
	case FK_BIN:
		return get_bin(d, f->key, o, (size_t)f->max, (struct msg_bytes *)at);
	case FK_MAP:
		return decode_map(d, o, f->sub, at, false);
	case FK_ERRCODE:
	case FK_FINISH:
		return decode_name(d, f, o, (int *)at);
	default: /* FK_U32S, FK_STRS, FK_U32SS, FK_TOP, FK_MAPS */
		return decode_array(d, f, o, base);
	}
}

static bool key_is(const msgpack_object *k, const char *s)
{
	size_t n = strlen(s);
	return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
	       memcmp(k->via.str.ptr, s, n) == 0;
}

/* Decodes a map through a table. Keys must be strings of at most MSG_KEY_MAX bytes and
 * appear once; nil counts as absent. At the top, `t` and `id` were handled already. */
static int decode_map(struct dec *d, const msgpack_object *o, const struct field_table *t,
		      void *base, bool top)
{
	const struct field *tab = t->fields;
	size_t n_tab = t->n_fields;
	if (o->type != MSGPACK_OBJECT_MAP)
		return bad_field(d, "?", "expected a map, got ", kind_name(o->type));
	uint64_t seen = 0;  /* tables have fewer than 64 fields */
	const msgpack_object_kv *kv = o->via.map.ptr;
	for (uint32_t i = 0; i < o->via.map.size; i++) {
		const msgpack_object *k = &kv[i].key, *v = &kv[i].val;
		if (k->type != MSGPACK_OBJECT_STR || k->via.str.size > MSG_KEY_MAX ||
		    k->via.str.size == 0)
			return bad_field(d, "?", "keys must be strings of 1..32 bytes", "");
		if (top && (key_is(k, "t") || key_is(k, "id")))
			continue;
		size_t j;
		for (j = 0; j < n_tab; j++)
			if (key_is(k, tab[j].key))
				break;
		if (j == n_tab) {
			if (!d->strict)
				continue;
			char key[MSG_KEY_MAX + 1];
			memcpy(key, k->via.str.ptr, k->via.str.size);
			key[k->via.str.size] = '\0';
			for (char *c = key; *c; c++)
				if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e)
					*c = '?';
			return bad_field(d, key, "unknown field", "");
		}
		if (seen & (1ull << j))
			return bad_field(d, tab[j].key, "field appears twice", "");
		seen |= 1ull << j;
		if (v->type == MSGPACK_OBJECT_NIL)
			continue;
		int rc = decode_field(d, &tab[j], v, base);
		if (rc)
			return rc;
		if (tab[j].off_has != FIELD_NO_OFF)
			*(bool *)((char *)base + tab[j].off_has) = true;
	}
	for (size_t j = 0; j < n_tab; j++) {
		bool present = seen & (1ull << j);
		if ((tab[j].flags & FF_REQUIRED) && present) {
			/* nil on a required field is as good as missing */
			for (uint32_t i = 0; i < o->via.map.size; i++)
				if (key_is(&kv[i].key, tab[j].key) && kv[i].val.type == MSGPACK_OBJECT_NIL)
					present = false;
		}
		if ((tab[j].flags & FF_REQUIRED) && !present)
			return bad_field(d, tab[j].key, "required field missing", "");
	}
	return 0;
}

/* The rules generate and chat share. */
static int check_generation(struct dec *d, const struct msg_generate *g)
{
	if (g->top_logprobs > 0 && !g->logprobs)
		return bad_field(d, "top_logprobs", "needs logprobs: true", "");
	if (g->logits && g->stream_socket)
		return bad_field(d, "logits", "logits rows travel only through the ring", "");
	if (g->has_grammar + g->has_json_schema + g->json_object > 1)
		return bad_field(d, "grammar", "at most one of grammar, json_schema, json_object", "");
	return 0;
}

/* Rules that span fields. */
static int check_message(struct dec *d)
{
	struct msg *m = d->m;
	switch (m->type) {
	case MSG_HELLO:
		if (m->u.hello.proto_major != MSG_PROTO_MAJOR) {
			hearth_error_set(d->err, HEARTH_EUNSUPPORTED,
					 "hello.proto: protocol %u not supported (this side speaks %d.%d)",
					 m->u.hello.proto_major, MSG_PROTO_MAJOR, MSG_PROTO_MINOR);
			d->rej->code = MSG_ERR_BAD_VERSION;
			return HEARTH_EUNSUPPORTED;
		}
		break;
	case MSG_GENERATE: {
		const struct msg_generate *g = &m->u.generate;
		int sources = g->has_prompt + (g->tokens != NULL) + g->has_prompt_ref;
		if (sources != 1)
			return bad_field(d, "prompt",
					 "exactly one of prompt, tokens, prompt_ref is required", "");
		return check_generation(d, g);
	}
	case MSG_CHAT:
		return check_generation(d, &m->u.chat.gen);
	case MSG_TOKENIZE:
		if (m->u.tokenize.has_text + m->u.tokenize.has_text_ref != 1)
			return bad_field(d, "text", "exactly one of text, text_ref is required", "");
		break;
	case MSG_EMBED: {
		const struct msg_embed *e = &m->u.embed;
		if ((e->n_input > 0) + (e->n_tokens > 0) != 1)
			return bad_field(d, "input", "exactly one of input, tokens is required", "");
		if (e->has_pooling && strcmp(e->pooling.ptr, "mean") && strcmp(e->pooling.ptr, "cls") &&
		    strcmp(e->pooling.ptr, "last"))
			return bad_field(d, "pooling", "must be mean, cls or last", "");
		break;
	}
	case MSG_EMBEDDINGS: {
		const struct msg_embeddings *e = &m->u.embeddings;
		if (e->n_embd == 0 || e->data.len / 4 / e->n_embd != e->n_inputs || e->data.len % (4ull * e->n_embd))
			return bad_field(d, "data", "must hold n_inputs x n_embd float32", "");
		break;
	}
	default:
		break;
	}
	return 0;
}

int msg_decode(const void *payload, size_t len, enum msg_from from, struct msg *out,
	       struct msg_reject *rej, struct hearth_error *err)
{
	struct msg_reject rej_local;
	if (!rej)
		rej = &rej_local;
	rej->code = MSG_ERR_NONE;
	rej->id = 0;
	memset(out, 0, sizeof *out);

	int rc = scan_frame(payload, len, rej, err);
	if (rc)
		return rc;

	msgpack_unpacked up;
	msgpack_unpacked_init(&up);
	size_t off = 0;
	msgpack_unpack_return ur = msgpack_unpack_next(&up, payload, len, &off);
	if (ur != MSGPACK_UNPACK_SUCCESS || off != len) {
		msgpack_unpacked_destroy(&up);
		rej->code = ur == MSGPACK_UNPACK_NOMEM_ERROR ? MSG_ERR_INTERNAL : MSG_ERR_BAD_FRAME;
		return hearth_error_set(err, HEARTH_EFORMAT, "frame: msgpack refused the payload (%d)",
					(int)ur);
	}
	const msgpack_object *top = &up.data;
	const msgpack_object *t = NULL, *id = NULL;
	int n_t = 0, n_id = 0;
	for (uint32_t i = 0; i < top->via.map.size; i++) {
		const msgpack_object_kv *kv = &top->via.map.ptr[i];
		if (key_is(&kv->key, "t")) { t = &kv->val; n_t++; }
		else if (key_is(&kv->key, "id")) { id = &kv->val; n_id++; }
	}
	struct dec d = { .m = out, .strict = from == MSG_FROM_CLIENT, .tname = "frame",
			 .rej = rej, .err = err };
	if (n_id > 1 || n_t > 1) {
		rc = bad_field(&d, n_id > 1 ? "id" : "t", "field appears twice", "");
		goto fail;
	}
	/* The id first, so that every later refusal can name the request. */
	if (!id || id->type != MSGPACK_OBJECT_POSITIVE_INTEGER || id->via.u64 > MSG_ID_MAX ||
	    (from == MSG_FROM_CLIENT && id->via.u64 == 0)) {
		rej->id = 0;
		rc = bad_field(&d, "id", !id ? "required field missing"
					      : "must be an unsigned integer in 1..2^53-1", "");
		goto fail;
	}
	rej->id = out->id = id->via.u64;
	if (!t || t->type != MSGPACK_OBJECT_STR) {
		rej->code = MSG_ERR_UNKNOWN_TYPE;
		rc = hearth_error_set(err, HEARTH_EINVAL, "frame: `t` %s", !t ? "missing"
								: "is not a string");
		goto fail;
	}
	enum msg_type type = MSG_NONE;
	for (int i = 1; i < MSG_TYPE_COUNT; i++)
		if (key_is(t, msg_type_name((enum msg_type)i)))
			type = (enum msg_type)i;
	if (type == MSG_NONE || msg_types[type].from != from) {
		char name[MSG_KEY_MAX + 1];
		size_t n = t->via.str.size < MSG_KEY_MAX ? t->via.str.size : MSG_KEY_MAX;
		memcpy(name, t->via.str.ptr, n);
		name[n] = '\0';
		for (char *c = name; *c; c++)
			if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e)
				*c = '?';
		rej->code = MSG_ERR_UNKNOWN_TYPE;
		rc = hearth_error_set(err, HEARTH_EINVAL, "frame: type \"%s\" %s", name,
				      type == MSG_NONE ? "is not known"
				      : from == MSG_FROM_CLIENT ? "is sent by the daemon, not a client"
				      : "is sent by a client, not the daemon");
		goto fail;
	}
	uint64_t keep_id = out->id;
	msg_init(out, type, keep_id);
	d.tname = msg_type_name(type);
	rc = decode_map(&d, top, &msg_types[type].body, &out->u, true);
	if (rc == 0)
		rc = check_message(&d);
	if (rc)
		goto fail;
	msgpack_unpacked_destroy(&up);
	return 0;
fail:
	msgpack_unpacked_destroy(&up);
	msg_free(out);
	return rc;
}
