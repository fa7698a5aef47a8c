/* libhearth: the client library of hearthd. Connect to the daemon's Unix socket, generate
 * text (a token callback or a pull iterator), cancel, tokenize, read stats and the memory
 * ledger. This header is installed and self-contained; link with `pkg-config --libs hearth`.
 *
 * Threading model. A `struct hearth` (one connection) may be used from many threads at
 * once: several generations can run concurrently on one connection, each driven by its own
 * thread. Socket writes are serialised by a lock. There is no background thread: whichever
 * caller is waiting takes the reader role, reads the socket and the shared-memory ring and
 * sorts every frame and token event to the request it belongs to (by request id); other
 * waiters sleep until their request has something or the reader role frees up. Callbacks
 * therefore run on the thread that called hearth_generate, never on another one. A
 * `struct hearth_gen` is driven by one thread at a time (hearth_gen_next/_finish);
 * hearth_cancel may be called on it from any other thread until hearth_gen_finish starts.
 * hearth_close must be the last call on a connection, after every generation on it was
 * finished. Token events are queued per generation as they are read, so a generation
 * whose tokens nobody takes grows its queue (the shared ring's backpressure only holds
 * while no thread is reading the connection at all).
 *
 * Errors. Every function returns 0 (or a documented positive value) on success and a
 * negative HEARTH_E* code on failure, with a message in the caller's struct hearth_err
 * (which may be NULL). A daemon that dies closes the socket: every waiting call then fails
 * with HEARTH_ECLOSED at once. A daemon that hangs is caught by the idle timeout
 * (struct hearth_connect_opts.timeout_ms): a wait that sees nothing for its request in that
 * long fails with HEARTH_ETIMEDOUT. */
#ifndef HEARTH_H
#define HEARTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HEARTH_SOCKET_ENV "HEARTH_SOCKET"
#define HEARTH_SOCKET_DEFAULT "/run/hearth/hearth.sock"
#define HEARTH_TIMEOUT_DEFAULT_MS 120000

/* The same values as hearthd's own error codes (protocol/error.h inside the hearth tree,
 * which defines them first when both headers are seen). */
#ifndef HEARTH_PROTOCOL_ERROR_H
enum {
	HEARTH_OK = 0,
	HEARTH_EINVAL = -1,      /* a bad argument, or a request field the daemon refused */
	HEARTH_ENOMEM = -2,
	HEARTH_EIO = -3,         /* a system call failed (connect, read, write) */
	HEARTH_EFORMAT = -4,     /* malformed data from the daemon */
	HEARTH_EUNSUPPORTED = -5,/* the daemon does not know the request or protocol version */
	HEARTH_ERANGE = -6,      /* a size beyond a limit (prompt longer than the context...) */
	HEARTH_ENOTFOUND = -7,
	HEARTH_EBUSY = -8,       /* the daemon's limit on concurrent work was reached */
	HEARTH_EKVFULL = -9,     /* the KV cache budget cannot hold the request */
	HEARTH_ECLOSED = -10,    /* the daemon closed the connection (it died or stopped) */
	HEARTH_EPROTO = -11,     /* protocol violation (by either side) */
	HEARTH_EPERM = -12,      /* refused by the daemon's policy */
	HEARTH_ETIMEDOUT = -13,
	HEARTH_ECANCELED = -14,
	HEARTH_ESHUTDOWN = -15,  /* the daemon is stopping */
};
#endif

struct hearth_err {
	int code;
	char msg[512];
};

/* The stable short name of a code ("kv_full", "closed"); never NULL. */
const char *hearth_strerror(int code);

struct hearth;
struct hearth_gen;

/* ---- connecting ---- */

/* The draft model the daemon drafts with (hearthd.conf draft_model); arch[0] == 0: none. */
struct hearth_draft_model {
	char arch[65];
	char name[257];
	char quant[65];
	uint64_t n_params;
	uint32_t n_ctx;          /* the context it is loaded for */
	uint32_t n_layer;
	uint32_t n_embd;
};

/* What the daemon's welcome said about itself and its model. */
struct hearth_model {
	char daemon_version[65];
	uint32_t proto_major;
	uint32_t proto_minor;
	char arch[65];           /* "llama", "qwen2", ... */
	char name[257];          /* general.name, may be empty */
	char quant[65];          /* weight layout, e.g. "q4_g128" */
	uint64_t n_params;
	uint32_t n_ctx;          /* the configured context length */
	uint32_t n_ctx_train;
	uint32_t n_vocab;
	uint32_t n_layer;
	uint32_t n_embd;
	char chat_template[65];  /* chat's template: "model", "file", or "chatml" (built in,
				  * the model has none); empty from a protocol 1.0 daemon */
	struct hearth_draft_model draft; /* all zero without a draft model (or from a daemon
					  * that does not say) */
};

struct hearth_connect_opts {
	const char *socket_path; /* NULL: $HEARTH_SOCKET, else HEARTH_SOCKET_DEFAULT */
	const char *client_name; /* shown in the daemon's log; NULL: "libhearth" */
	int timeout_ms;          /* idle timeout of every wait: 0 = HEARTH_TIMEOUT_DEFAULT_MS,
	                          * negative = none (only a closed socket ends a wait) */
	bool no_hello;           /* skip hello: only ping and stats work, also while the model
	                          * loads (a liveness probe) */
	/* Called during hearth_connect for each `loading` progress frame, if set. */
	void (*on_loading)(void *user, const char *phase, uint64_t done, uint64_t total);
	void *user;
	/* Before sleeping for the next event, watch the shared-memory ring for up to this
	 * many microseconds (0: never). A token then reaches the callback without a wake-up
	 * (the machine's eventfd wake-up floor is what `hearth bench` prints), at the price
	 * of a core that spins while it waits: for clients with a core to spare. */
	unsigned spin_us;
};

/* Connects, says hello and waits for the welcome (through the model's load, if it is still
 * loading), attaching the shared-memory ring the daemon passes along. */
int hearth_connect_with(struct hearth **out, const struct hearth_connect_opts *opts,
			struct hearth_err *err);

/* The same with default options. socket_path and client_name may be NULL. */
int hearth_connect(struct hearth **out, const char *socket_path, const char *client_name,
		   struct hearth_err *err);

/* Closes the socket and unmaps the ring; the daemon then ends this connection's requests.
 * NULL is fine. */
void hearth_close(struct hearth *h);

/* The welcome's facts. HEARTH_EINVAL when connected with no_hello. */
int hearth_model_info(struct hearth *h, struct hearth_model *out, struct hearth_err *err);

/* The socket path hearth_connect uses for NULL: $HEARTH_SOCKET or the default. */
const char *hearth_socket_path_default(void);

/* ---- generating ---- */

/* A prompt: UTF-8 text (text != NULL, len bytes) or token ids (tokens != NULL). Prompts
 * too large for one frame (about 900 KiB) go through the shared-memory ring on their own;
 * the ring's client->daemon capacity (1 MiB in hearthd today) bounds them, beyond it the
 * call fails with HEARTH_ERANGE before anything is sent. */
struct hearth_prompt {
	const char *text;
	size_t len;
	const uint32_t *tokens;
	size_t n_tokens;
};

/* The most draft tokens a generation may have verified per step (hearth_gen_params). */
#define HEARTH_SPECULATE_MAX 16

struct hearth_gen_params {
	uint32_t max_tokens;      /* default 256 */
	double temperature;       /* 0 = greedy; default 0.8 */
	uint32_t top_k;           /* 0 = off; default 40 */
	double top_p;             /* (0, 1]; default 0.95 */
	double min_p;             /* [0, 1]; default 0.05 */
	double repeat_penalty;    /* 1 = off (default) */
	uint32_t repeat_last_n;   /* default 64 */
	bool has_seed;            /* false: the daemon picks a seed */
	uint64_t seed;
	const char *const *stop;  /* n_stop NUL-terminated stop strings (at most 16) */
	size_t n_stop;
	const uint32_t *stop_tokens;
	size_t n_stop_tokens;
	bool logprobs;            /* the logprob of each sampled token */
	uint32_t top_logprobs;    /* 0..64 alternatives per token; needs logprobs */
	bool logits;              /* the full logits row of each step */
	bool ignore_eos;          /* end-of-generation tokens do not stop the generation
	                           * (benchmarks: exactly max_tokens tokens) */
	/* Structured output (protocol 1.1; at most one of the three): the output must match a
	 * GBNF grammar (llama.cpp's syntax), a JSON Schema (JSON text), or be any JSON object. */
	const char *grammar;
	const char *json_schema;
	bool json_object;
	/* Jump-forward (protocol 1.2): text the grammar forces is fed to the model without
	 * sampling it token by token. Default true; it never applies with logprobs or logits. */
	bool jump_forward;
	/* Speculative decoding (protocol 1.3): draft tokens (prompt lookup, or the daemon's
	 * draft model: see draft) verified per step, 1..16 at most; -1 = off; 0 = the daemon's
	 * default (the field is not sent, so a 1.2 daemon is served too). Outputs are the same
	 * either way; only speed differs. */
	int32_t speculate;
	/* (protocol 1.4) where drafts come from: "auto" (NULL: not sent; prompt lookup where it
	 * finds a match, else the daemon's draft model), "lookup" or "model". */
	const char *draft;
};

/* llama.cpp's sampling defaults, as the daemon applies them. */
struct hearth_gen_params hearth_gen_params_default(void);

struct hearth_top {
	uint32_t token;
	float logprob;
};

/* One generated token. Every pointer stays valid only until the callback returns, or
 * until the next hearth_gen_next/hearth_gen_finish on the same generation. */
struct hearth_token {
	uint32_t token;
	uint32_t index;           /* 0 for the first generated token */
	const char *text;         /* text_len raw bytes, NUL-terminated for convenience; a
	                           * multi-byte character may be split over two tokens */
	size_t text_len;
	bool has_logprob;
	float logprob;
	const struct hearth_top *top;   /* n_top alternatives (top_logprobs) */
	size_t n_top;
	const float *logits;      /* n_vocab floats when params.logits, else NULL */
	uint32_t n_vocab;
	uint64_t t_sampled_ns;    /* CLOCK_MONOTONIC when hearthd sampled this token (same
	                           * host, same clock); 0 when unknown */
};

enum hearth_finish {
	HEARTH_FINISH_NONE = 0,
	HEARTH_FINISH_STOP = 1,   /* end-of-generation token, a stop token or stop string */
	HEARTH_FINISH_LENGTH = 2, /* max_tokens reached */
	HEARTH_FINISH_CONTEXT = 3,/* the context filled up */
	HEARTH_FINISH_CANCEL = 4, /* hearth_cancel, or the callback asked to stop */
	HEARTH_FINISH_TOOL_CALLS = 5, /* a chat reply that called tools */
};

/* "stop", "length", "context", "cancel", "tool_calls" ("none" before the end). */
const char *hearth_finish_name(enum hearth_finish f);

struct hearth_result {
	enum hearth_finish finish;
	uint32_t n_prompt;        /* prompt tokens */
	uint32_t n_gen;           /* generated tokens (as counted by the daemon) */
	double queue_ms;          /* waiting for a slot */
	double prefill_ms;
	double decode_ms;
	double prefill_tps;       /* prompt tokens per second */
	double decode_tps;        /* generated tokens per second */
	uint32_t n_cached;        /* prompt tokens the daemon's prefix cache already held */
	uint32_t n_forced;        /* of n_gen, tokens a grammar forced (jump-forward, 1.2) */
};

/* Return 0 to go on, non-zero to cancel the generation: no more tokens are delivered
 * and it ends with HEARTH_FINISH_CANCEL (or its natural finish, if the daemon got there
 * before it saw the cancel). */
typedef int (*hearth_token_fn)(void *user, const struct hearth_token *tok);

/* Runs one generation to its end, calling cb for each token in order on this thread.
 * params NULL means the defaults; cb and result may be NULL. */
int hearth_generate(struct hearth *h, const struct hearth_prompt *prompt,
		    const struct hearth_gen_params *params, hearth_token_fn cb, void *user,
		    struct hearth_result *result, struct hearth_err *err);

/* The pull iterator: start a generation, then take tokens one by one. */
int hearth_gen_start(struct hearth *h, const struct hearth_prompt *prompt,
		     const struct hearth_gen_params *params, struct hearth_gen **out,
		     struct hearth_err *err);

/* Waits for the next token: 1 with *tok set; 0 when the generation ended (no more tokens;
 * hearth_gen_finish gives the result); HEARTH_ETIMEDOUT when nothing came within
 * timeout_ms (the generation goes on: call again or cancel); another negative code when
 * the generation failed. timeout_ms: negative = the connection's idle timeout, 0 = poll. */
int hearth_gen_next(struct hearth_gen *g, const struct hearth_token **tok, int timeout_ms,
		    struct hearth_err *err);

/* Asks the daemon to stop the generation early; does not wait. Tokens already produced
 * are still delivered by hearth_gen_next before it returns 0. May be called from any
 * thread while another drives g. */
int hearth_cancel(struct hearth_gen *g, struct hearth_err *err);

/* Ends the iterator and frees g, whatever its state: a generation still running is
 * canceled and its remaining tokens discarded. Returns the generation's outcome (0 with
 * *result filled, or its error). Call exactly once per hearth_gen_start that succeeded. */
int hearth_gen_finish(struct hearth_gen *g, struct hearth_result *result,
		      struct hearth_err *err);

/* ---- chat (protocol 1.1) ---- */

/* A tool call: arguments is JSON text of an object, as OpenAI's API carries it. */
struct hearth_tool_call {
	const char *id;
	const char *name;
	const char *arguments;
};

/* One message of a conversation; NULL fields are absent. role: "system", "user",
 * "assistant", "tool" (or any role the model's template knows). */
struct hearth_message {
	const char *role;
	const char *content;
	const char *name;
	const char *tool_call_id;         /* a tool result: the call it answers */
	const char *reasoning_content;    /* an assistant turn's reasoning, for templates that keep it */
	const struct hearth_tool_call *tool_calls;
	size_t n_tool_calls;
};

/* A chat request: the daemon renders the model's own chat template over the messages
 * (message text can never become control tokens), generates, and parses the reply back
 * into content, reasoning and tool calls. */
struct hearth_chat {
	const struct hearth_message *messages;
	size_t n_messages;
	const char *tools;            /* JSON array of OpenAI function tools, or NULL */
	const char *tool_choice;      /* NULL or "auto", "none", "required", or a function's name */
	bool no_generation_prompt;    /* true: do not end the prompt with the assistant's opener */
	const char *vars;             /* JSON object of extra template variables, or NULL */
	const char *template_name;    /* a named template of the model, or NULL for the default */
};

enum hearth_delta_kind {
	HEARTH_DELTA_CONTENT = 1,
	HEARTH_DELTA_REASONING = 2,
	HEARTH_DELTA_TOOL_CALL = 3,
};

/* A piece of the parsed reply as it streams: text for content and reasoning, a whole tool
 * call (never raw text of one) for TOOL_CALL. Valid like a hearth_token. */
struct hearth_delta {
	enum hearth_delta_kind kind;
	const char *text;
	size_t len;
	struct hearth_tool_call call;
	uint32_t index;               /* the tool call's index in the message */
};

enum hearth_event_kind { HEARTH_EVENT_TOKEN = 1, HEARTH_EVENT_DELTA = 2 };

struct hearth_event {
	enum hearth_event_kind kind;
	const struct hearth_token *token;
	const struct hearth_delta *delta;
};

/* The assistant message and the generation's figures; release with hearth_chat_result_free. */
struct hearth_chat_result {
	struct hearth_result gen;     /* finish is HEARTH_FINISH_TOOL_CALLS when it called tools */
	char *content;
	char *reasoning_content;
	struct hearth_tool_call *tool_calls;
	size_t n_tool_calls;
};

void hearth_chat_result_free(struct hearth_chat_result *r);

typedef int (*hearth_event_fn)(void *user, const struct hearth_event *ev);

/* Runs one chat turn to its end; cb (may be NULL) sees tokens and deltas in order. */
int hearth_chat_run(struct hearth *h, const struct hearth_chat *chat, const struct hearth_gen_params *params,
		    hearth_event_fn cb, void *user, struct hearth_chat_result *result, struct hearth_err *err);

/* The pull iterator for chat: start, take events (1 with *ev set, 0 at the end, negative on
 * error or timeout as hearth_gen_next), then hearth_chat_finish (once; frees g). hearth_cancel
 * works on a chat's g. */
int hearth_chat_start(struct hearth *h, const struct hearth_chat *chat, const struct hearth_gen_params *params,
		      struct hearth_gen **out, struct hearth_err *err);
int hearth_chat_next(struct hearth_gen *g, struct hearth_event *ev, int timeout_ms, struct hearth_err *err);
int hearth_chat_finish(struct hearth_gen *g, struct hearth_chat_result *result, struct hearth_err *err);

/* ---- other requests ---- */

/* Without NO_BOS the model's beginning-of-sequence token comes first when its file's
 * tokenizer.ggml.add_bos_token asks for one (as prompts are tokenized), else never. */
#define HEARTH_TOKENIZE_NO_BOS 1u   /* do not add the model's beginning-of-sequence token */
#define HEARTH_TOKENIZE_SPECIAL 2u  /* parse special-token text such as "<|im_start|>" */

/* Token ids of text (len bytes of UTF-8) into *tokens (release with hearth_free). */
int hearth_tokenize(struct hearth *h, const char *text, size_t len, unsigned flags,
		    uint32_t **tokens, size_t *n_tokens, struct hearth_err *err);

/* The text of token ids into *text (*len bytes plus a NUL; release with hearth_free). */
int hearth_detokenize(struct hearth *h, const uint32_t *tokens, size_t n_tokens, char **text,
		      size_t *len, struct hearth_err *err);

void hearth_free(void *p);

/* ---- embeddings (protocol 1.4) ---- */

enum hearth_pooling {
	HEARTH_POOLING_MODEL = 0, /* the model file's pooling_type */
	HEARTH_POOLING_MEAN,      /* the average over the input's positions */
	HEARTH_POOLING_CLS,       /* the first position */
	HEARTH_POOLING_LAST,      /* the last position (Qwen3-Embedding) */
};

/* One input: UTF-8 text (text != NULL, len bytes; tokenized as llama.cpp's embedding tool
 * does, with the model's BOS/EOS and special-token text parsed) or token ids. */
struct hearth_embed_input {
	const char *text;
	size_t len;
	const uint32_t *tokens;
	size_t n_tokens;
};

/* The vectors, one per input in order, each of unit L2 norm: the final hidden state after
 * the model's output norm, pooled. Release with hearth_embeddings_free. */
struct hearth_embeddings {
	size_t n;                 /* inputs */
	uint32_t n_embd;
	float *data;              /* n x n_embd */
	uint32_t *n_tokens;       /* tokens of each input */
	uint64_t total_tokens;
	char pooling[17];         /* the pooling used: "mean", "cls" or "last" */
};

/* Embeds n inputs (any n: the call sends them in as many requests as the daemon's frame
 * limits need, texts and token arrays each in their own). Each input must fit the model's
 * context and one frame (about 900 KiB of text). HEARTH_EUNSUPPORTED before protocol 1.4. */
int hearth_embed(struct hearth *h, const struct hearth_embed_input *inputs, size_t n, enum hearth_pooling pooling,
		 struct hearth_embeddings *out, struct hearth_err *err);
void hearth_embeddings_free(struct hearth_embeddings *e);

struct hearth_stats {
	uint64_t uptime_ms;
	uint32_t clients;
	uint32_t running;         /* sequences being computed */
	uint32_t queued;          /* requests waiting for a slot */
	uint64_t prompt_tokens;   /* since start */
	uint64_t gen_tokens;
	uint64_t kv_used;         /* bytes */
	uint64_t kv_total;
	uint64_t rss;             /* the daemon's resident set, bytes */
	/* Prefix cache since start: prompt tokens of admitted requests, and of those the ones
	 * found cached (the sum of hearth_done.n_cached); hit ratio = hit / lookup. */
	uint64_t prefix_lookup_tokens;
	uint64_t prefix_hit_tokens;
	char phase[64];           /* "ready", "failed", the load phase ("map", "repack", ...),
				   * or "" from a daemon that does not say */
	uint64_t draft_tokens;    /* speculative decoding: draft tokens verified since start */
	uint64_t draft_accepted;  /* of them, accepted */
	uint64_t draft_model_tokens;   /* of draft_tokens, the draft model's (0 without one) */
	uint64_t draft_model_accepted; /* of draft_accepted, the draft model's */
	uint64_t draft_kv_used;   /* the draft model's KV cache, bytes (0 and 0 without one) */
	uint64_t draft_kv_total;
};

int hearth_stats(struct hearth *h, struct hearth_stats *out, struct hearth_err *err);

#define HEARTH_LEDGER_MAX 64

struct hearth_ledger_entry {
	char name[65];
	uint64_t bytes;
};

/* Where the daemon's memory went, by owner. */
struct hearth_ledger {
	size_t n_entries;
	struct hearth_ledger_entry entries[HEARTH_LEDGER_MAX];
	uint64_t total;
	uint64_t peak;
};

int hearth_ledger(struct hearth *h, struct hearth_ledger *out, struct hearth_err *err);

/* One ping/pong; *rtt_us (may be NULL) is the round trip in microseconds. */
int hearth_ping(struct hearth *h, uint64_t *rtt_us, struct hearth_err *err);

#ifdef __cplusplus
}
#endif

#endif
