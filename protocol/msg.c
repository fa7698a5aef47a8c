/* What encoder and decoder share: the wire names of types, error codes and finish reasons,
 * the defaults a fresh message starts from, and the frame buffer. */
#include "protocol/msg.h"

#include <stdlib.h>
#include <string.h>

static const char *const type_names[MSG_TYPE_COUNT] = {
	[MSG_NONE] = "?",
	[MSG_HELLO] = "hello",
	[MSG_GENERATE] = "generate",
	[MSG_CANCEL] = "cancel",
	[MSG_TOKENIZE] = "tokenize",
	[MSG_DETOKENIZE] = "detokenize",
	[MSG_STATS] = "stats",
	[MSG_LEDGER] = "ledger",
	[MSG_PING] = "ping",
	[MSG_CHAT] = "chat",
	[MSG_WELCOME] = "welcome",
	[MSG_LOADING] = "loading",
	[MSG_TOKEN] = "token",
	[MSG_DONE] = "done",
	[MSG_TOKENS] = "tokens",
	[MSG_TEXT] = "text",
	[MSG_STATS_REPLY] = "stats_reply",
	[MSG_LEDGER_REPLY] = "ledger_reply",
	[MSG_PONG] = "pong",
	[MSG_ERROR] = "error",
	[MSG_DELTA] = "delta",
	[MSG_EMBED] = "embed",
	[MSG_EMBEDDINGS] = "embeddings",
};

static const char *const errcode_names[MSG_ERR_COUNT] = {
	[MSG_ERR_NONE] = "none",
	[MSG_ERR_BAD_FRAME] = "bad_frame",
	[MSG_ERR_TOO_LARGE] = "too_large",
	[MSG_ERR_UNKNOWN_TYPE] = "unknown_type",
	[MSG_ERR_BAD_FIELD] = "bad_field",
	[MSG_ERR_BAD_STATE] = "bad_state",
	[MSG_ERR_BAD_VERSION] = "bad_version",
	[MSG_ERR_DUPLICATE_ID] = "duplicate_id",
	[MSG_ERR_BUSY] = "busy",
	[MSG_ERR_KV_FULL] = "kv_full",
	[MSG_ERR_FORBIDDEN] = "forbidden",
	[MSG_ERR_CONTEXT] = "context",
	[MSG_ERR_BAD_TOKEN] = "bad_token",
	[MSG_ERR_RING] = "ring",
	[MSG_ERR_LOADING] = "loading",
	[MSG_ERR_SHUTTING_DOWN] = "shutting_down",
	[MSG_ERR_INTERNAL] = "internal",
};

static const char *const finish_names[MSG_FINISH_COUNT] = {
	[MSG_FINISH_OK] = "ok",
	[MSG_FINISH_STOP] = "stop",
	[MSG_FINISH_LENGTH] = "length",
	[MSG_FINISH_CONTEXT] = "context",
	[MSG_FINISH_CANCEL] = "cancel",
	[MSG_FINISH_TOOL_CALLS] = "tool_calls",
};

const char *msg_type_name(enum msg_type t)
{
	if ((unsigned)t >= MSG_TYPE_COUNT)
		return "?";
	return type_names[t];
}

const char *msg_errcode_name(enum msg_errcode c)
{
	if ((unsigned)c >= MSG_ERR_COUNT)
		return "internal";
	return errcode_names[c];
}

const char *msg_finish_name(enum msg_finish f)
{
	if ((unsigned)f >= MSG_FINISH_COUNT)
		return "ok";
	return finish_names[f];
}

enum msg_errcode msg_errcode_from_hearth(int code)
{
	switch (code) {
	case HEARTH_OK: return MSG_ERR_NONE;
	case HEARTH_EINVAL: return MSG_ERR_BAD_FIELD;
	case HEARTH_EFORMAT: return MSG_ERR_BAD_FRAME;
	case HEARTH_ERANGE: return MSG_ERR_TOO_LARGE;
	case HEARTH_EBUSY: return MSG_ERR_BUSY;
	case HEARTH_EKVFULL: return MSG_ERR_KV_FULL;
	case HEARTH_EPROTO: return MSG_ERR_BAD_STATE;
	case HEARTH_ESHUTDOWN: return MSG_ERR_SHUTTING_DOWN;
	case HEARTH_EPERM: return MSG_ERR_FORBIDDEN;
	default: return MSG_ERR_INTERNAL;
	}
}

int msg_errcode_to_hearth(enum msg_errcode code)
{
	switch (code) {
	case MSG_ERR_BAD_FRAME: return HEARTH_EPROTO;
	case MSG_ERR_TOO_LARGE: return HEARTH_ERANGE;
	case MSG_ERR_UNKNOWN_TYPE: return HEARTH_EUNSUPPORTED;
	case MSG_ERR_BAD_FIELD: return HEARTH_EINVAL;
	case MSG_ERR_BAD_STATE: return HEARTH_EPROTO;
	case MSG_ERR_BAD_VERSION: return HEARTH_EUNSUPPORTED;
	case MSG_ERR_DUPLICATE_ID: return HEARTH_EINVAL;
	case MSG_ERR_BUSY: return HEARTH_EBUSY;
	case MSG_ERR_KV_FULL: return HEARTH_EKVFULL;
	case MSG_ERR_CONTEXT: return HEARTH_ERANGE;
	case MSG_ERR_BAD_TOKEN: return HEARTH_EINVAL;
	case MSG_ERR_RING: return HEARTH_EPROTO;
	case MSG_ERR_LOADING: return HEARTH_EBUSY;
	case MSG_ERR_SHUTTING_DOWN: return HEARTH_ESHUTDOWN;
	case MSG_ERR_FORBIDDEN: return HEARTH_EPERM;
	default: return HEARTH_EIO;
	}
}

bool msg_type_is_final(enum msg_type t)
{
	switch (t) {
	case MSG_WELCOME: case MSG_DONE: case MSG_TOKENS: case MSG_TEXT:
	case MSG_STATS_REPLY: case MSG_LEDGER_REPLY: case MSG_PONG: case MSG_ERROR:
	case MSG_EMBEDDINGS:
		return true;
	default:
		return false;
	}
}

void msg_init(struct msg *m, enum msg_type type, uint64_t id)
{
	memset(m, 0, sizeof *m);
	m->type = type;
	m->id = id;
	switch (type) {
	case MSG_HELLO:
		m->u.hello.proto_major = MSG_PROTO_MAJOR;
		m->u.hello.proto_minor = MSG_PROTO_MINOR;
		m->u.hello.ring = true;
		break;
	case MSG_WELCOME:
		m->u.welcome.proto_major = MSG_PROTO_MAJOR;
		m->u.welcome.proto_minor = MSG_PROTO_MINOR;
		break;
	case MSG_GENERATE:
	case MSG_CHAT: {
		/* a chat's generation parameters come first in struct msg_chat */
		struct msg_generate *g = type == MSG_CHAT ? &m->u.chat.gen : &m->u.generate;
		if (type == MSG_CHAT)
			m->u.chat.add_generation_prompt = true;
		g->max_tokens = MSG_DEFAULT_MAX_TOKENS;
		g->sampling.temperature = MSG_DEFAULT_TEMPERATURE;
		g->sampling.top_k = MSG_DEFAULT_TOP_K;
		g->sampling.top_p = MSG_DEFAULT_TOP_P;
		g->sampling.min_p = MSG_DEFAULT_MIN_P;
		g->sampling.repeat_penalty = MSG_DEFAULT_REPEAT_PENALTY;
		g->sampling.repeat_last_n = MSG_DEFAULT_REPEAT_LAST_N;
		break;
	}
	case MSG_TOKENIZE:
		m->u.tokenize.add_bos = true;
		break;
	default:
		break;
	}
}

void msg_buf_free(struct msg_buf *b)
{
	free(b->data);
	memset(b, 0, sizeof *b);
}
