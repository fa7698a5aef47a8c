/* Every message of the hearth socket protocol as a plain C struct, and their msgpack encode
 * and strict decode. A decoded message owns its strings and arrays (msg_free releases them);
 * nothing points into the frame buffer. doc/protocol.md is the wire spec this implements. */
#ifndef HEARTH_PROTOCOL_MSG_H
#define HEARTH_PROTOCOL_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/error.h"

#define MSG_PROTO_MAJOR 1
#define MSG_PROTO_MINOR 4

/* Bounds checked before msgpack builds any object; see doc/protocol.md "Limits". */
#define MSG_DEPTH_MAX 8            /* nesting of maps/arrays, the top map being depth 1 */
#define MSG_MAP_MAX 64             /* entries in any map */
#define MSG_ARRAY_MAX (1u << 18)   /* elements in any array (token ids) */
#define MSG_STR_MAX (1u << 20)     /* bytes in any string */
#define MSG_KEY_MAX 32             /* bytes in a map key */
#define MSG_NAME_MAX 64            /* client name, phase, arch, quant, ledger entry names */
#define MSG_STOP_MAX 16            /* stop strings */
#define MSG_STOP_LEN_MAX 256       /* bytes per stop string */
#define MSG_STOP_TOKENS_MAX 64
#define MSG_TOP_MAX 64             /* top_logprobs */
#define MSG_MAX_TOKENS_LIMIT (1u << 20)
#define MSG_TOKEN_MAX 0x7fffffffu  /* largest token id accepted on the wire */
#define MSG_LEDGER_MAX 64          /* ledger entries */
#define MSG_MESSAGE_MAX 1024       /* error message bytes */
#define MSG_ID_MAX ((1ull << 53) - 1) /* request ids stay exact in a double (JS clients) */
#define MSG_CHAT_MESSAGES_MAX 1024 /* messages of one chat */
#define MSG_CHAT_CALLS_MAX 64      /* tool calls of one message */
#define MSG_ROLE_MAX 64            /* bytes of a role */
#define MSG_TOOL_NAME_MAX 256      /* bytes of a tool (function) name or call id */
#define MSG_GRAMMAR_MAX (256u << 10) /* bytes of a grammar or JSON schema */
#define MSG_SPECULATE_MAX 16       /* draft tokens verified per step (speculative decoding) */
#define MSG_EMBED_INPUTS_MAX 256   /* inputs of one embed request (1.4) */
#define MSG_POOLING_MAX 16         /* bytes of embed.pooling */
#define MSG_DRAFT_SOURCE_MAX 16    /* bytes of generate.draft ("auto", "lookup", "model") */

/* Sampling defaults applied by the decoder when a generate omits a field (llama.cpp's). */
#define MSG_DEFAULT_MAX_TOKENS 256
#define MSG_DEFAULT_TEMPERATURE 0.8
#define MSG_DEFAULT_TOP_K 40
#define MSG_DEFAULT_TOP_P 0.95
#define MSG_DEFAULT_MIN_P 0.05
#define MSG_DEFAULT_REPEAT_PENALTY 1.0
#define MSG_DEFAULT_REPEAT_LAST_N 64

enum msg_type {
	MSG_NONE = 0,
	/* client -> daemon (requests) */
	MSG_HELLO,
	MSG_GENERATE,
	MSG_CANCEL,
	MSG_TOKENIZE,
	MSG_DETOKENIZE,
	MSG_STATS,
	MSG_LEDGER,
	MSG_PING,
	MSG_CHAT,         /* protocol 1.1 */
	/* daemon -> client */
	MSG_WELCOME,      /* final for hello */
	MSG_LOADING,      /* progress for hello while the model loads (not final) */
	MSG_TOKEN,        /* a token of a generate streamed on the socket (not final) */
	MSG_DONE,         /* final for generate and cancel */
	MSG_TOKENS,       /* final for tokenize */
	MSG_TEXT,         /* final for detokenize */
	MSG_STATS_REPLY,  /* final for stats */
	MSG_LEDGER_REPLY, /* final for ledger */
	MSG_PONG,         /* final for ping */
	MSG_ERROR,        /* final for any request, or id 0: about the connection */
	MSG_DELTA,        /* a piece of a chat's parsed reply (not final; protocol 1.1) */
	MSG_EMBED,        /* client -> daemon: pooled embeddings of inputs (protocol 1.4) */
	MSG_EMBEDDINGS,   /* final for embed */
	MSG_TYPE_COUNT
};

/* Which side sent the bytes being decoded. The daemon decodes MSG_FROM_CLIENT strictly
 * (unknown fields are errors); a client decodes MSG_FROM_DAEMON leniently (unknown fields
 * of a newer daemon are ignored). Messages of the other direction are unknown_type. */
enum msg_from {
	MSG_FROM_CLIENT,
	MSG_FROM_DAEMON,
};

/* Stable error codes of the `error` frame; msg_errcode_name gives the wire string. */
enum msg_errcode {
	MSG_ERR_NONE = 0,
	MSG_ERR_BAD_FRAME,      /* not one msgpack map, trailing bytes, framing lost */
	MSG_ERR_TOO_LARGE,      /* frame, string, array, map or nesting above its bound */
	MSG_ERR_UNKNOWN_TYPE,   /* `t` missing, not a string, or no such request */
	MSG_ERR_BAD_FIELD,      /* missing, duplicate, unknown, wrong type or out of range */
	MSG_ERR_BAD_STATE,      /* request not valid now (generate before hello, hello twice) */
	MSG_ERR_BAD_VERSION,    /* protocol major not supported */
	MSG_ERR_DUPLICATE_ID,   /* id of a request still running */
	MSG_ERR_BUSY,           /* a limit on concurrent work was reached */
	MSG_ERR_KV_FULL,        /* the KV budget cannot hold the request */
	MSG_ERR_CONTEXT,        /* prompt longer than the context */
	MSG_ERR_BAD_TOKEN,      /* a token id beyond the vocabulary */
	MSG_ERR_RING,           /* the shared ring broke its rules; the connection closes */
	MSG_ERR_LOADING,        /* the model is not loaded yet */
	MSG_ERR_SHUTTING_DOWN,
	MSG_ERR_FORBIDDEN,      /* the peer's uid/groups are not allowed (SO_PEERCRED policy) */
	MSG_ERR_INTERNAL,
	MSG_ERR_COUNT
};

enum msg_finish {
	MSG_FINISH_OK = 0,    /* a request other than generate completed */
	MSG_FINISH_STOP,      /* end-of-generation token, stop token or stop string */
	MSG_FINISH_LENGTH,    /* max_tokens reached */
	MSG_FINISH_CONTEXT,   /* the context filled up */
	MSG_FINISH_CANCEL,    /* canceled by a cancel request */
	MSG_FINISH_TOOL_CALLS,/* a chat reply that called tools (protocol 1.1) */
	MSG_FINISH_COUNT
};

/* Bytes that are not NUL-terminated on the wire; decoded copies do get a trailing NUL
 * (not counted in len) so text can be printed, but may contain NULs of their own. */
struct msg_bytes {
	const char *ptr;
	size_t len;
};

struct msg_hello {
	uint32_t proto_major;      /* required; must be MSG_PROTO_MAJOR */
	uint32_t proto_minor;      /* default 0 */
	struct msg_bytes name;     /* required, 1..MSG_NAME_MAX bytes of UTF-8 */
	bool ring;                 /* default true: ask for the shared-memory ring */
};

/* The draft model the daemon drafts with (hearthd.conf draft_model), in the model's arena. */
struct msg_draft_info {
	struct msg_bytes arch;
	struct msg_bytes name;
	struct msg_bytes quant;
	uint64_t n_params;
	uint32_t n_ctx;            /* the context it is loaded for (<= the model's) */
	uint32_t n_layer;
	uint32_t n_embd;
};

struct msg_model_info {
	struct msg_bytes arch;     /* "llama", "qwen2", ... */
	struct msg_bytes name;     /* general.name, may be empty */
	struct msg_bytes quant;    /* weight layout, e.g. "q4_g128" */
	uint64_t n_params;
	uint32_t n_ctx;            /* configured context length */
	uint32_t n_ctx_train;
	uint32_t n_vocab;
	uint32_t n_layer;
	uint32_t n_embd;
	struct msg_bytes chat_template; /* where chat's template comes from: "model", "file",
					 * or "chatml" (built in: the model has none); 1.1 */
	struct msg_bytes pooling;  /* the file's pooling_type ("mean", "cls", "last", "none",
				    * "rank"); empty when it declares none (1.4) */
	bool has_draft;            /* optional, no minor of its own: a draft model is loaded */
	struct msg_draft_info draft;
};

struct msg_welcome {
	uint32_t proto_major;
	uint32_t proto_minor;
	struct msg_bytes daemon;   /* daemon version string */
	struct msg_model_info model;
	uint32_t max_frame;        /* largest payload the daemon accepts */
	bool ring;                 /* true: memfd + 2 eventfds came with this frame */
	uint64_t ring_d2c;         /* capacity in bytes of each ring (0 without ring) */
	uint64_t ring_c2d;
};

struct msg_loading {
	struct msg_bytes phase;    /* "map", "repack", "warmup" ... */
	uint64_t done;
	uint64_t total;
};

struct msg_sampling {
	double temperature;        /* 0 = greedy; [0, 100] */
	uint32_t top_k;            /* 0 = off */
	double top_p;              /* (0, 1] */
	double min_p;              /* [0, 1] */
	double repeat_penalty;     /* (0, 100] ; 1 = off */
	uint32_t repeat_last_n;    /* 0 = off */
	bool has_seed;             /* false: the daemon picks one */
	uint64_t seed;
};

struct msg_generate {
	/* Exactly one prompt source: text, token ids, or a bulk record in the ring. */
	bool has_prompt;
	struct msg_bytes prompt;   /* UTF-8 text */
	uint32_t *tokens;
	size_t n_tokens;           /* tokens != NULL when the prompt is token ids */
	bool has_prompt_ref;
	uint64_t prompt_ref;       /* ref of a RING_REC_BULK_* record pushed before the frame */
	uint32_t max_tokens;
	struct msg_sampling sampling;
	struct msg_bytes *stop;    /* n_stop strings, each 1..MSG_STOP_LEN_MAX bytes */
	size_t n_stop;
	uint32_t *stop_tokens;
	size_t n_stop_tokens;
	bool logprobs;             /* logprob of each sampled token */
	uint32_t top_logprobs;     /* 0..MSG_TOP_MAX alternatives per token */
	bool logits;               /* the full logits row of each step, through the ring */
	bool stream_socket;        /* token events as `token` frames instead of the ring */
	bool ignore_eos;           /* end-of-generation tokens do not stop (benchmarks) */
	/* Structured output (protocol 1.1), at most one: a GBNF grammar, a JSON Schema (JSON
	 * text), or any JSON object. */
	bool has_grammar;
	struct msg_bytes grammar;
	bool has_json_schema;
	struct msg_bytes json_schema;
	bool json_object;
	/* (1.2) false: every token of a constrained output is sampled, none jumped forward */
	bool has_jump_forward;
	bool jump_forward;
	/* Speculative decoding (1.3): at most this many draft tokens a step; 0 = off;
	 * absent = the daemon's default. */
	bool has_speculate;
	uint32_t speculate;
	/* (1.4) where drafts come from: "auto" (absent), "lookup" or "model" */
	bool has_draft;
	struct msg_bytes draft;
};

/* A tool call as the wire carries it: arguments is JSON text of an object. */
struct msg_chat_call {
	struct msg_bytes id;
	struct msg_bytes name;
	struct msg_bytes arguments;
};

struct msg_chat_message {
	struct msg_bytes role;
	bool has_content, has_name, has_tool_call_id, has_reasoning;
	struct msg_bytes content;
	struct msg_bytes name;
	struct msg_bytes tool_call_id;
	struct msg_bytes reasoning_content;
	struct msg_chat_call *tool_calls;
	size_t n_tool_calls;
};

/* A chat turn: the daemon renders the model's template over the messages and generates
 * with gen's parameters (gen has no prompt source on the wire: the rendering is it). */
struct msg_chat {
	struct msg_generate gen;
	struct msg_chat_message *messages;
	size_t n_messages;
	bool has_tools;
	struct msg_bytes tools;        /* JSON text: an array of OpenAI function tools */
	bool has_tool_choice;
	struct msg_bytes tool_choice;  /* "auto", "none", "required" or a function's name */
	bool add_generation_prompt;    /* default true */
	bool has_vars;
	struct msg_bytes vars;         /* JSON text of an object: extra template variables */
	bool has_template;
	struct msg_bytes template_name;/* a named template of the model */
};

/* The assistant message a chat's done carries. */
struct msg_chat_reply {
	struct msg_bytes content;
	struct msg_bytes reasoning_content;
	struct msg_chat_call *tool_calls;
	size_t n_tool_calls;
};

/* kind: "content" or "reasoning" with text, or "tool_call" with call and index. */
struct msg_delta {
	struct msg_bytes kind;
	struct msg_bytes text;
	uint32_t index;
	bool has_call;
	struct msg_chat_call call;
};

/* An array of token ids, one element of an array of them (embed.tokens). */
struct msg_u32s {
	uint32_t *v;
	size_t n;
};

/* Embeddings of a batch (1.4): exactly one of input (texts, tokenized as llama.cpp's
 * embedding tool does: the model's BOS, no special-token parsing) and tokens. */
struct msg_embed {
	struct msg_bytes *input;   /* n_input strings, each 1..MSG_STR_MAX bytes of UTF-8 */
	size_t n_input;
	struct msg_u32s *tokens;   /* n_tokens arrays of 1..MSG_ARRAY_MAX ids */
	size_t n_tokens;
	bool has_pooling;
	struct msg_bytes pooling;  /* "mean", "cls" or "last"; absent: the model's */
};

/* The vectors: data holds n_inputs x n_embd float32 in the host's byte order (both ends
 * share it, as for the ring), each of unit L2 norm; n_tokens[i] counts input i's tokens. */
struct msg_embeddings {
	uint32_t n_embd;
	struct msg_bytes data;
	uint32_t *n_tokens;
	size_t n_inputs;
	struct msg_bytes pooling;  /* the pooling used */
	uint32_t n_cached;         /* tokens found in the prefix cache (last pooling only) */
	double queue_ms;           /* waiting for a place */
	double compute_ms;         /* from admission to the reply */
};

struct msg_cancel {
	uint64_t target;           /* id of the generate to cancel */
};

struct msg_tokenize {
	bool has_text;
	struct msg_bytes text;
	bool has_text_ref;
	uint64_t text_ref;         /* RING_REC_BULK_TEXT record */
	bool add_bos;              /* default true */
	bool special;              /* parse special-token text; default false */
};

struct msg_detokenize {
	uint32_t *tokens;
	size_t n_tokens;
};

struct msg_top {
	uint32_t token;
	float logprob;
};

struct msg_token {
	uint32_t token;
	struct msg_bytes text;     /* raw bytes: may split a UTF-8 sequence */
	bool has_logprob;
	float logprob;
	struct msg_top *top;
	size_t n_top;
};

struct msg_done {
	enum msg_finish finish;
	uint32_t n_prompt;
	uint32_t n_gen;
	double queue_ms;
	double prefill_ms;
	double decode_ms;
	double prefill_tps;        /* prompt tokens per second */
	double decode_tps;         /* generated tokens per second */
	uint32_t n_cached;         /* prompt tokens found in the prefix cache (1.1) */
	uint32_t n_forced;         /* of n_gen, tokens a grammar forced (jump-forward; 1.2) */
	bool has_message;          /* a chat's done: the parsed assistant message */
	struct msg_chat_reply message;
};

struct msg_tokens {
	uint32_t *tokens;
	size_t n_tokens;
};

struct msg_text {
	struct msg_bytes text;     /* raw bytes: may hold invalid UTF-8 from byte tokens */
};

struct msg_stats_reply {
	uint64_t uptime_ms;
	uint32_t clients;
	uint32_t running;
	uint32_t queued;
	uint64_t prompt_tokens;    /* since start */
	uint64_t gen_tokens;
	uint64_t kv_used;          /* bytes */
	uint64_t kv_total;
	uint64_t rss;
	/* Optional, added without a version bump (a client knows them by their presence): */
	uint64_t prefix_lookup_tokens; /* prompt tokens of admitted requests, since start */
	uint64_t prefix_hit_tokens;    /* of those, found in the prefix cache */
	struct msg_bytes phase;        /* "ready", "failed", or the loader's phase ("map", ...) */
	uint64_t draft_tokens;     /* speculative decoding since start: draft tokens verified */
	uint64_t draft_accepted;   /* of them, accepted (1.3) */
	uint64_t draft_model_tokens;   /* of draft_tokens, the draft model's (1.4) */
	uint64_t draft_model_accepted; /* of draft_accepted, the draft model's */
	/* Optional, no minor of their own: the draft model's KV in bytes, sent (both) while
	 * a draft model is loaded. */
	bool has_draft_kv;
	uint64_t draft_kv_used;
	uint64_t draft_kv_total;
};

struct msg_ledger_entry {
	struct msg_bytes name;
	uint64_t bytes;
};

struct msg_ledger_reply {
	struct msg_ledger_entry *entries;
	size_t n_entries;
	uint64_t total;
	uint64_t peak;
};

struct msg_error {
	enum msg_errcode code;
	struct msg_bytes message;
	bool fatal;                /* the daemon closes the connection after this frame */
};

struct msg_arena_block;

struct msg {
	enum msg_type type;
	uint64_t id;               /* 1..MSG_ID_MAX for requests and their replies; 0 = none */
	union {
		struct msg_hello hello;
		struct msg_generate generate;
		struct msg_chat chat;
		struct msg_delta delta;
		struct msg_embed embed;
		struct msg_embeddings embeddings;
		struct msg_cancel cancel;
		struct msg_tokenize tokenize;
		struct msg_detokenize detokenize;
		struct msg_welcome welcome;
		struct msg_loading loading;
		struct msg_token token;
		struct msg_done done;
		struct msg_tokens tokens;
		struct msg_text text;
		struct msg_stats_reply stats;
		struct msg_ledger_reply ledger;
		struct msg_error error;
	} u;
	struct msg_arena_block *arena; /* owns every pointer above after msg_decode */
};

/* Why a frame was refused, ready to become an `error` reply: the wire code and the request
 * id when it could be read (0 otherwise). */
struct msg_reject {
	enum msg_errcode code;
	uint64_t id;
};

/* A growable byte buffer for encoded frames. data is malloc'd; a caller may take it
 * (then zero the struct) or reuse the buffer after setting len = 0. */
struct msg_buf {
	uint8_t *data;
	size_t len;
	size_t cap;
};

void msg_buf_free(struct msg_buf *b);

/* Zeroes m and fills the defaults of its type (sampling defaults for generate, ring and
 * add_bos true...). Use before filling a message to encode. */
void msg_init(struct msg *m, enum msg_type type, uint64_t id);

/* Releases what msg_decode allocated; m is left as MSG_NONE. Safe on an initialised or
 * zeroed msg. Messages built by hand point at caller memory and need no msg_free. */
void msg_free(struct msg *m);

/* Decodes one frame payload (the bytes after the length prefix). On success returns 0 and
 * *out owns its memory. On failure returns a negative HEARTH_E* code, *rej says which error
 * frame to answer with (the connection survives: framing is intact), err has the words,
 * and *out is MSG_NONE with nothing to free. Bounds nesting and sizes before msgpack
 * allocates anything. */
int msg_decode(const void *payload, size_t len, enum msg_from from, struct msg *out,
	       struct msg_reject *rej, struct hearth_error *err);

/* Appends one complete frame (length prefix + msgpack map) for m to out. Validates what
 * the decoder would reject (limits, ranges, one prompt source) so neither side can send
 * a frame its peer must refuse; returns HEARTH_EINVAL/HEARTH_ERANGE then, out unchanged. */
int msg_encode(const struct msg *m, struct msg_buf *out, struct hearth_error *err);

/* Shorthand: an error frame for id (0 = connection) with a printf-style message. */
int msg_encode_error(struct msg_buf *out, uint64_t id, enum msg_errcode code, bool fatal,
		     struct hearth_error *err, const char *fmt, ...)
	__attribute__((format(printf, 6, 7)));

const char *msg_type_name(enum msg_type t);           /* wire string, "?" if none */
const char *msg_errcode_name(enum msg_errcode c);     /* wire string, "internal" if none */
const char *msg_finish_name(enum msg_finish f);
/* Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF. */
bool msg_utf8_valid(const void *s, size_t n);
/* Maps a HEARTH_E* code from the engine to the closest wire code. */
enum msg_errcode msg_errcode_from_hearth(int code);
/* Maps a wire code from the daemon to the HEARTH_E* a client returns (HEARTH_EIO for
 * internal and codes this side does not know). */
int msg_errcode_to_hearth(enum msg_errcode code);
/* True for the types whose frame ends a request (welcome, done, tokens, ..., error). */
bool msg_type_is_final(enum msg_type t);

#endif
