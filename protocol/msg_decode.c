/* Strict decoding of one frame payload into a struct msg. A bounds pre-scan walks the raw
 * msgpack iteratively (no recursion, no allocation) so depth, sizes and element counts are
 * known to be sane before msgpack-c builds objects; then a table per message type checks
 * every field's type and range and copies it into memory the msg owns. */
#include "protocol/msg.h"

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

static void *arena_alloc(struct msg *m, size_t size)
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

	while (!(depth == 0 && top_seen)) {
		if (pos >= n) {
			hearth_error_set(err, HEARTH_EFORMAT, "frame: msgpack truncated at byte %zu", pos);
			return reject(rej, MSG_ERR_BAD_FRAME, HEARTH_EFORMAT);
		}
		size_t at = pos;
		uint8_t b = p[pos++];
		uint64_t count = 0;   /* container items, or payload bytes of a scalar */
		int container = 0;    /* 1 array, 2 map */
		size_t lenbytes = 0, fixed = 0;
		int is_str = 0;       /* 1 str, 2 bin */
		bool is_uint = false;

		if (b <= 0x7f) { is_uint = true; }
		else if (b <= 0x8f) { container = 2; count = b & 0x0f; }
		else if (b <= 0x9f) { container = 1; count = b & 0x0f; }
		else if (b <= 0xbf) { is_str = 1; count = b & 0x1f; }
		else if (b >= 0xe0) { /* negative fixint */ }
		else switch (b) {
		case 0xc0: case 0xc2: case 0xc3: break;
		case 0xc4: is_str = 2; lenbytes = 1; break;
		case 0xc5: is_str = 2; lenbytes = 2; break;
		case 0xc6: is_str = 2; lenbytes = 4; break;
		case 0xca: fixed = 4; break;
		case 0xcb: fixed = 8; break;
		case 0xcc: fixed = 1; is_uint = true; break;
		case 0xcd: fixed = 2; is_uint = true; break;
		case 0xce: fixed = 4; is_uint = true; break;
		case 0xcf: fixed = 8; is_uint = true; break;
		case 0xd0: fixed = 1; break;
		case 0xd1: fixed = 2; break;
		case 0xd2: fixed = 4; break;
		case 0xd3: fixed = 8; break;
		case 0xd9: is_str = 1; lenbytes = 1; break;
		case 0xda: is_str = 1; lenbytes = 2; break;
		case 0xdb: is_str = 1; lenbytes = 4; break;
		case 0xdc: container = 1; lenbytes = 2; break;
		case 0xdd: container = 1; lenbytes = 4; break;
		case 0xde: container = 2; lenbytes = 2; break;
		case 0xdf: container = 2; lenbytes = 4; break;
		case 0xc1:
			hearth_error_set(err, HEARTH_EFORMAT, "frame: byte 0xc1 (never used) at %zu", at);
			return reject(rej, MSG_ERR_BAD_FRAME, HEARTH_EFORMAT);
		default: /* 0xc7-0xc9, 0xd4-0xd8: ext types */
			hearth_error_set(err, HEARTH_EFORMAT,
					 "frame: msgpack ext type 0x%02x at byte %zu is not used by "
					 "this protocol", b, at);
			return reject(rej, MSG_ERR_BAD_FRAME, HEARTH_EFORMAT);
		}
		if (lenbytes + fixed > n - pos) {
			hearth_error_set(err, HEARTH_EFORMAT, "frame: msgpack truncated at byte %zu", pos);
			return reject(rej, MSG_ERR_BAD_FRAME, HEARTH_EFORMAT);
		}
		if (lenbytes) {
			count = be_read(p + pos, lenbytes);
			pos += lenbytes;
		}
		uint64_t value = 0;
		if (is_uint)
			value = fixed ? be_read(p + pos, fixed) : b;
		pos += fixed;

		if (depth == 0 && container != 2) {
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
			if (id_key && is_uint && rej->id == 0 && value <= MSG_ID_MAX)
				rej->id = value;
			id_key = false;
		}

		if (container) {
			uint64_t limit = container == 2 ? MSG_MAP_MAX : MSG_ARRAY_MAX;
			if (count > limit) {
				hearth_error_set(err, HEARTH_ERANGE,
						 "frame: %s of %llu entries at byte %zu (limit %llu)",
						 container == 2 ? "map" : "array",
						 (unsigned long long)count, at, (unsigned long long)limit);
				return reject(rej, MSG_ERR_TOO_LARGE, HEARTH_ERANGE);
			}
			if (depth >= MSG_DEPTH_MAX) {
				hearth_error_set(err, HEARTH_ERANGE,
						 "frame: nesting deeper than %d at byte %zu",
						 MSG_DEPTH_MAX, at);
				return reject(rej, MSG_ERR_TOO_LARGE, HEARTH_ERANGE);
			}
			uint64_t items = container == 2 ? count * 2 : count;
			if (items > n - pos) {
				hearth_error_set(err, HEARTH_EFORMAT,
						 "frame: %llu items announced at byte %zu, %zu bytes left",
						 (unsigned long long)items, at, n - pos);
				return reject(rej, MSG_ERR_BAD_FRAME, HEARTH_EFORMAT);
			}
			if (depth == 0)
				top_seen = true;
			remaining[depth++] = items | (container == 2 ? 0 : SCAN_ARRAY);
		} else {
			if (is_str && count > MSG_STR_MAX) {
				hearth_error_set(err, HEARTH_ERANGE,
						 "frame: string of %llu bytes at byte %zu (limit %u)",
						 (unsigned long long)count, at, MSG_STR_MAX);
				return reject(rej, MSG_ERR_TOO_LARGE, HEARTH_ERANGE);
			}
			if (count > n - pos) {
				hearth_error_set(err, HEARTH_EFORMAT,
						 "frame: %llu bytes announced at byte %zu, %zu left",
						 (unsigned long long)count, at, n - pos);
				return reject(rej, MSG_ERR_BAD_FRAME, HEARTH_EFORMAT);
			}
			if (depth == 1 && is_key && is_str == 1 && count == 2 &&
			    memcmp(p + pos, "id", 2) == 0)
				id_key = true;
			pos += count;
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

/* ---- field tables ---- */

enum field_kind {
	FK_U32, FK_U64, FK_F64, FK_F32, FK_BOOL, FK_STR, FK_U32S, FK_STRS,
	FK_MODEL, FK_TOP, FK_LEDGER, FK_ERRCODE, FK_FINISH,
};

#define FF_REQUIRED 1u
#define FF_UTF8 2u      /* strings: must be valid UTF-8 */
#define FF_NONEMPTY 4u  /* strings and arrays: at least one byte/element */
#define FF_MIN_OPEN 8u  /* numbers: strictly above min */
#define NO_OFF UINT32_MAX

/* off: the value, relative to the table's base struct; off_n: element count for arrays;
 * off_has: a bool set when the field is present. min/max bound a number, or the bytes of
 * a string, or the elements of an array; elem_max bounds array elements (bytes of each
 * string, value of each integer). */
struct field {
	const char *key;
	uint8_t kind;
	uint8_t flags;
	uint32_t off;
	uint32_t off_n;
	uint32_t off_has;
	double min;
	double max;
	double elem_max;
};

#define F(key, kind, flags, st, member, min, max) \
	{ key, kind, flags, offsetof(st, member), NO_OFF, NO_OFF, min, max, 0 }
#define FH(key, kind, flags, st, member, has, min, max) \
	{ key, kind, flags, offsetof(st, member), NO_OFF, offsetof(st, has), min, max, 0 }
#define FA(key, kind, flags, st, member, n, max, elem_max) \
	{ key, kind, flags, offsetof(st, member), offsetof(st, n), NO_OFF, 0, max, elem_max }

#define U32MAX 4294967295.0
#define U64MAX 18446744073709551615.0

static const struct field hello_fields[] = {
	F("proto", FK_U32, FF_REQUIRED, struct msg_hello, proto_major, 0, U32MAX),
	F("proto_minor", FK_U32, 0, struct msg_hello, proto_minor, 0, U32MAX),
	F("name", FK_STR, FF_REQUIRED | FF_UTF8 | FF_NONEMPTY, struct msg_hello, name, 0,
	  MSG_NAME_MAX),
	F("ring", FK_BOOL, 0, struct msg_hello, ring, 0, 0),
};

static const struct field generate_fields[] = {
	FH("prompt", FK_STR, FF_UTF8, struct msg_generate, prompt, has_prompt, 0, MSG_STR_MAX),
	FA("tokens", FK_U32S, FF_NONEMPTY, struct msg_generate, tokens, n_tokens, MSG_ARRAY_MAX,
	   MSG_TOKEN_MAX),
	FH("prompt_ref", FK_U64, 0, struct msg_generate, prompt_ref, has_prompt_ref, 0, U64MAX),
	F("max_tokens", FK_U32, 0, struct msg_generate, max_tokens, 0, MSG_MAX_TOKENS_LIMIT),
	F("temperature", FK_F64, 0, struct msg_generate, sampling.temperature, 0,
	  MSG_TEMPERATURE_MAX),
	F("top_k", FK_U32, 0, struct msg_generate, sampling.top_k, 0, MSG_TOP_K_MAX),
	F("top_p", FK_F64, FF_MIN_OPEN, struct msg_generate, sampling.top_p, 0, 1),
	F("min_p", FK_F64, 0, struct msg_generate, sampling.min_p, 0, 1),
	F("repeat_penalty", FK_F64, FF_MIN_OPEN, struct msg_generate, sampling.repeat_penalty, 0,
	  MSG_REPEAT_PENALTY_MAX),
	F("repeat_last_n", FK_U32, 0, struct msg_generate, sampling.repeat_last_n, 0,
	  MSG_REPEAT_LAST_N_MAX),
	FH("seed", FK_U64, 0, struct msg_generate, sampling.seed, sampling.has_seed, 0, U64MAX),
	FA("stop", FK_STRS, 0, struct msg_generate, stop, n_stop, MSG_STOP_MAX,
	   MSG_STOP_LEN_MAX),
	FA("stop_tokens", FK_U32S, 0, struct msg_generate, stop_tokens, n_stop_tokens,
	   MSG_STOP_TOKENS_MAX, MSG_TOKEN_MAX),
	F("logprobs", FK_BOOL, 0, struct msg_generate, logprobs, 0, 0),
	F("top_logprobs", FK_U32, 0, struct msg_generate, top_logprobs, 0, MSG_TOP_MAX),
	F("logits", FK_BOOL, 0, struct msg_generate, logits, 0, 0),
	F("socket", FK_BOOL, 0, struct msg_generate, stream_socket, 0, 0),
	F("ignore_eos", FK_BOOL, 0, struct msg_generate, ignore_eos, 0, 0),
};

static const struct field cancel_fields[] = {
	F("target", FK_U64, FF_REQUIRED | FF_MIN_OPEN, struct msg_cancel, target, 0, MSG_ID_MAX),
};

static const struct field tokenize_fields[] = {
	FH("text", FK_STR, FF_UTF8, struct msg_tokenize, text, has_text, 0, MSG_STR_MAX),
	FH("text_ref", FK_U64, 0, struct msg_tokenize, text_ref, has_text_ref, 0, U64MAX),
	F("add_bos", FK_BOOL, 0, struct msg_tokenize, add_bos, 0, 0),
	F("special", FK_BOOL, 0, struct msg_tokenize, special, 0, 0),
};

static const struct field detokenize_fields[] = {
	FA("tokens", FK_U32S, FF_REQUIRED, struct msg_detokenize, tokens, n_tokens,
	   MSG_ARRAY_MAX, MSG_TOKEN_MAX),
};

static const struct field model_fields[] = {
	F("arch", FK_STR, 0, struct msg_model_info, arch, 0, MSG_NAME_MAX),
	F("name", FK_STR, 0, struct msg_model_info, name, 0, 256),
	F("quant", FK_STR, 0, struct msg_model_info, quant, 0, MSG_NAME_MAX),
	F("n_params", FK_U64, 0, struct msg_model_info, n_params, 0, U64MAX),
	F("n_ctx", FK_U32, 0, struct msg_model_info, n_ctx, 0, U32MAX),
	F("n_ctx_train", FK_U32, 0, struct msg_model_info, n_ctx_train, 0, U32MAX),
	F("n_vocab", FK_U32, 0, struct msg_model_info, n_vocab, 0, U32MAX),
	F("n_layer", FK_U32, 0, struct msg_model_info, n_layer, 0, U32MAX),
	F("n_embd", FK_U32, 0, struct msg_model_info, n_embd, 0, U32MAX),
};

static const struct field welcome_fields[] = {
	F("proto", FK_U32, FF_REQUIRED, struct msg_welcome, proto_major, 0, U32MAX),
	F("proto_minor", FK_U32, 0, struct msg_welcome, proto_minor, 0, U32MAX),
	F("daemon", FK_STR, 0, struct msg_welcome, daemon, 0, MSG_NAME_MAX),
	F("model", FK_MODEL, 0, struct msg_welcome, model, 0, 0),
	F("max_frame", FK_U32, 0, struct msg_welcome, max_frame, 0, U32MAX),
	F("ring", FK_BOOL, 0, struct msg_welcome, ring, 0, 0),
	F("ring_d2c", FK_U64, 0, struct msg_welcome, ring_d2c, 0, U64MAX),
	F("ring_c2d", FK_U64, 0, struct msg_welcome, ring_c2d, 0, U64MAX),
};

static const struct field loading_fields[] = {
	F("phase", FK_STR, 0, struct msg_loading, phase, 0, MSG_NAME_MAX),
	F("done", FK_U64, 0, struct msg_loading, done, 0, U64MAX),
	F("total", FK_U64, 0, struct msg_loading, total, 0, U64MAX),
};

static const struct field token_fields[] = {
	F("token", FK_U32, FF_REQUIRED, struct msg_token, token, 0, MSG_TOKEN_MAX),
	F("text", FK_STR, 0, struct msg_token, text, 0, MSG_STR_MAX),
	FH("logprob", FK_F32, 0, struct msg_token, logprob, has_logprob, -1e30, 0),
	FA("top", FK_TOP, 0, struct msg_token, top, n_top, MSG_TOP_MAX, 0),
};

static const struct field done_fields[] = {
	F("finish", FK_FINISH, FF_REQUIRED, struct msg_done, finish, 0, 0),
	F("n_prompt", FK_U32, 0, struct msg_done, n_prompt, 0, U32MAX),
	F("n_gen", FK_U32, 0, struct msg_done, n_gen, 0, U32MAX),
	F("queue_ms", FK_F64, 0, struct msg_done, queue_ms, 0, 1e15),
	F("prefill_ms", FK_F64, 0, struct msg_done, prefill_ms, 0, 1e15),
	F("decode_ms", FK_F64, 0, struct msg_done, decode_ms, 0, 1e15),
	F("prefill_tps", FK_F64, 0, struct msg_done, prefill_tps, 0, 1e15),
	F("decode_tps", FK_F64, 0, struct msg_done, decode_tps, 0, 1e15),
};

static const struct field tokens_fields[] = {
	FA("tokens", FK_U32S, FF_REQUIRED, struct msg_tokens, tokens, n_tokens, MSG_ARRAY_MAX,
	   MSG_TOKEN_MAX),
};

static const struct field text_fields[] = {
	F("text", FK_STR, FF_REQUIRED, struct msg_text, text, 0, MSG_STR_MAX),
};

static const struct field stats_fields[] = {
	F("uptime_ms", FK_U64, 0, struct msg_stats_reply, uptime_ms, 0, U64MAX),
	F("clients", FK_U32, 0, struct msg_stats_reply, clients, 0, U32MAX),
	F("running", FK_U32, 0, struct msg_stats_reply, running, 0, U32MAX),
	F("queued", FK_U32, 0, struct msg_stats_reply, queued, 0, U32MAX),
	F("prompt_tokens", FK_U64, 0, struct msg_stats_reply, prompt_tokens, 0, U64MAX),
	F("gen_tokens", FK_U64, 0, struct msg_stats_reply, gen_tokens, 0, U64MAX),
	F("kv_used", FK_U64, 0, struct msg_stats_reply, kv_used, 0, U64MAX),
	F("kv_total", FK_U64, 0, struct msg_stats_reply, kv_total, 0, U64MAX),
	F("rss", FK_U64, 0, struct msg_stats_reply, rss, 0, U64MAX),
};

static const struct field ledger_entry_fields[] = {
	F("name", FK_STR, FF_REQUIRED, struct msg_ledger_entry, name, 0, MSG_NAME_MAX),
	F("bytes", FK_U64, FF_REQUIRED, struct msg_ledger_entry, bytes, 0, U64MAX),
};

static const struct field ledger_fields[] = {
	FA("entries", FK_LEDGER, 0, struct msg_ledger_reply, entries, n_entries,
	   MSG_LEDGER_MAX, 0),
	F("total", FK_U64, 0, struct msg_ledger_reply, total, 0, U64MAX),
	F("peak", FK_U64, 0, struct msg_ledger_reply, peak, 0, U64MAX),
};

static const struct field error_fields[] = {
	F("code", FK_ERRCODE, FF_REQUIRED, struct msg_error, code, 0, 0),
	F("message", FK_STR, 0, struct msg_error, message, 0, MSG_MESSAGE_MAX),
	F("fatal", FK_BOOL, 0, struct msg_error, fatal, 0, 0),
};

struct type_desc {
	enum msg_from from;
	const struct field *fields;
	size_t n_fields;
};

#define T(from, tab) { from, tab, sizeof tab / sizeof tab[0] }
#define T0(from) { from, NULL, 0 }

static const struct type_desc types[MSG_TYPE_COUNT] = {
	[MSG_HELLO] = T(MSG_FROM_CLIENT, hello_fields),
	[MSG_GENERATE] = T(MSG_FROM_CLIENT, generate_fields),
	[MSG_CANCEL] = T(MSG_FROM_CLIENT, cancel_fields),
	[MSG_TOKENIZE] = T(MSG_FROM_CLIENT, tokenize_fields),
	[MSG_DETOKENIZE] = T(MSG_FROM_CLIENT, detokenize_fields),
	[MSG_STATS] = T0(MSG_FROM_CLIENT),
	[MSG_LEDGER] = T0(MSG_FROM_CLIENT),
	[MSG_PING] = T0(MSG_FROM_CLIENT),
	[MSG_WELCOME] = T(MSG_FROM_DAEMON, welcome_fields),
	[MSG_LOADING] = T(MSG_FROM_DAEMON, loading_fields),
	[MSG_TOKEN] = T(MSG_FROM_DAEMON, token_fields),
	[MSG_DONE] = T(MSG_FROM_DAEMON, done_fields),
	[MSG_TOKENS] = T(MSG_FROM_DAEMON, tokens_fields),
	[MSG_TEXT] = T(MSG_FROM_DAEMON, text_fields),
	[MSG_STATS_REPLY] = T(MSG_FROM_DAEMON, stats_fields),
	[MSG_LEDGER_REPLY] = T(MSG_FROM_DAEMON, ledger_fields),
	[MSG_PONG] = T0(MSG_FROM_DAEMON),
	[MSG_ERROR] = T(MSG_FROM_DAEMON, error_fields),
};

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
	/* Compare in integers where the bound is exact, so U64MAX rounding cannot leak. */
	if (max < U64MAX && (double)v > max)
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
	char *s = arena_alloc(d->m, n + 1);
	if (!s)
		return no_memory(d, key);
	memcpy(s, o->via.str.ptr, n);
	s[n] = '\0';
	out->ptr = s;
	out->len = n;
	return 0;
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

static int decode_map(struct dec *d, const msgpack_object *o, const struct field *tab,
		      size_t n_tab, void *base, bool top);

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
		break;
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
		break;
	}
	case FK_BOOL:
		if (o->type != MSGPACK_OBJECT_BOOLEAN)
			return bad_field(d, f->key, "expected a boolean, got ", kind_name(o->type));
		*(bool *)at = o->via.boolean;
		break;
	case FK_STR:
		return get_bytes(d, f->key, o, (size_t)f->max, f->flags, (struct msg_bytes *)at);
	case FK_U32S: {
		if ((rc = get_array(d, f->key, o, (size_t)f->max, f->flags)))
			return rc;
		size_t n = o->via.array.size;
		uint32_t *v = arena_alloc(d->m, n ? n * sizeof *v : 1);
		if (!v)
			return no_memory(d, f->key);
		for (size_t i = 0; i < n; i++) {
			uint64_t x;
			if ((rc = get_uint(d, f->key, &o->via.array.ptr[i], 0, f->elem_max, 0, &x)))
				return rc;
			v[i] = (uint32_t)x;
		}
		*(uint32_t **)at = v;
		*(size_t *)((char *)base + f->off_n) = n;
		break;
	}
	case FK_STRS: {
		if ((rc = get_array(d, f->key, o, (size_t)f->max, f->flags)))
			return rc;
		size_t n = o->via.array.size;
		struct msg_bytes *v = arena_alloc(d->m, n ? n * sizeof *v : 1);
		if (!v)
			return no_memory(d, f->key);
		for (size_t i = 0; i < n; i++)
			if ((rc = get_bytes(d, f->key, &o->via.array.ptr[i], (size_t)f->elem_max,
					    FF_UTF8 | FF_NONEMPTY, &v[i])))
				return rc;
		*(struct msg_bytes **)at = v;
		*(size_t *)((char *)base + f->off_n) = n;
		break;
	}
	case FK_MODEL:
		return decode_map(d, o, model_fields, sizeof model_fields / sizeof model_fields[0],
				  at, false);
	case FK_TOP: {
		if ((rc = get_array(d, f->key, o, (size_t)f->max, 0)))
			return rc;
		size_t n = o->via.array.size;
		struct msg_top *v = arena_alloc(d->m, n ? n * sizeof *v : 1);
		if (!v)
			return no_memory(d, f->key);
		for (size_t i = 0; i < n; i++) {
			const msgpack_object *e = &o->via.array.ptr[i];
			if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size != 2)
				return bad_field(d, f->key, "entries must be [token, logprob]", "");
			uint64_t tok;
			double lp;
			if ((rc = get_uint(d, f->key, &e->via.array.ptr[0], 0, MSG_TOKEN_MAX, 0, &tok)) ||
			    (rc = get_double(d, f->key, &e->via.array.ptr[1], -1e30, 0, 0, &lp)))
				return rc;
			v[i].token = (uint32_t)tok;
			v[i].logprob = (float)lp;
		}
		*(struct msg_top **)at = v;
		*(size_t *)((char *)base + f->off_n) = n;
		break;
	}
	case FK_LEDGER: {
		if ((rc = get_array(d, f->key, o, (size_t)f->max, 0)))
			return rc;
		size_t n = o->via.array.size;
		struct msg_ledger_entry *v = arena_alloc(d->m, n ? n * sizeof *v : 1);
		if (!v)
			return no_memory(d, f->key);
		memset(v, 0, n * sizeof *v);
		for (size_t i = 0; i < n; i++)
			if ((rc = decode_map(d, &o->via.array.ptr[i], ledger_entry_fields,
					     sizeof ledger_entry_fields / sizeof ledger_entry_fields[0],
					     &v[i], false)))
				return rc;
		*(struct msg_ledger_entry **)at = v;
		*(size_t *)((char *)base + f->off_n) = n;
		break;
	}
	case FK_ERRCODE:
	case FK_FINISH: {
		if (o->type != MSGPACK_OBJECT_STR)
			return bad_field(d, f->key, "expected a string, got ", kind_name(o->type));
		size_t count = f->kind == FK_ERRCODE ? MSG_ERR_COUNT : MSG_FINISH_COUNT;
		for (size_t i = 0; i < count; i++) {
			const char *name = f->kind == FK_ERRCODE ? msg_errcode_name((enum msg_errcode)i)
							       : msg_finish_name((enum msg_finish)i);
			if (strlen(name) == o->via.str.size &&
			    memcmp(name, o->via.str.ptr, o->via.str.size) == 0) {
				*(int *)at = (int)i;
				return 0;
			}
		}
		/* A newer daemon's code or reason: keep the frame, degrade to the generic one. */
		if (d->strict)
			return bad_field(d, f->key, "unknown value", "");
		*(int *)at = f->kind == FK_ERRCODE ? MSG_ERR_INTERNAL : MSG_FINISH_OK;
		break;
	}
	}
	return 0;
}

static bool key_is(const msgpack_object *k, const char *s)
{
	size_t n = strlen(s);
	return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
	       memcmp(k->via.str.ptr, s, n) == 0;
}

/* Decodes a map through a table. Keys must be strings of at most MSG_KEY_MAX bytes and
 * appear once; nil counts as absent. At the top, `t` and `id` were handled already. */
static int decode_map(struct dec *d, const msgpack_object *o, const struct field *tab,
		      size_t n_tab, void *base, bool top)
{
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
		if (tab[j].off_has != NO_OFF)
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
		if (g->top_logprobs > 0 && !g->logprobs)
			return bad_field(d, "top_logprobs", "needs logprobs: true", "");
		if (g->logits && g->stream_socket)
			return bad_field(d, "logits", "logits rows travel only through the ring", "");
		break;
	}
	case MSG_TOKENIZE:
		if (m->u.tokenize.has_text + m->u.tokenize.has_text_ref != 1)
			return bad_field(d, "text", "exactly one of text, text_ref is required", "");
		break;
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
	if (type == MSG_NONE || types[type].from != from) {
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
	rc = decode_map(&d, top, types[type].fields, types[type].n_fields, &out->u, true);
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
