/* Continuous batching on the compute thread: requests from many clients become sequences;
 * every step gathers one decode token from each decoding sequence and bounded prefill
 * chunks, round-robin by client, into one engine forward pass. The loop thread talks to it
 * only through two SPSC queues of struct sched_msg and an eventfd doorbell. */
#ifndef HEARTH_DAEMON_SCHED_H
#define HEARTH_DAEMON_SCHED_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "daemon/engine/engine.h"
#include "daemon/engine/grammar.h"
#include "daemon/serve/queue.h"
#include "daemon/serve/spec.h"
#include "daemon/engine/sampler.h"
#include "protocol/error.h"
#include "protocol/msg.h"

struct tok;

/* The protocol's limits (protocol/msg.h, quoted by doc/protocol.md), so whatever the
 * decoder accepts the scheduler can hold. */
#define SCHED_MAX_STOP_TOKENS MSG_STOP_TOKENS_MAX
#define SCHED_MAX_STOP_STRINGS MSG_STOP_MAX
#define SCHED_MAX_STOP_LEN MSG_STOP_LEN_MAX
#define SCHED_MAX_TOP MSG_TOP_MAX

enum sched_finish {
	SCHED_FINISH_NONE = 0,
	SCHED_FINISH_LENGTH,    /* max_tokens reached */
	SCHED_FINISH_STOP,      /* end-of-generation token, stop token or stop string */
	SCHED_FINISH_CONTEXT,   /* the sequence reached max_context */
	SCHED_FINISH_CANCELED,
	SCHED_FINISH_ERROR,     /* err holds the reason (kv_full, shutting_down, ...) */
};

/* What a token event carries to the client's ring. text is the UTF-8 released with this
 * token: bytes of an incomplete character or of a possible stop string are held back and
 * come with a later event. */
struct sched_token {
	uint64_t req_id;
	int32_t token;
	uint32_t index;         /* 0-based position in the generation */
	const char *text;
	uint32_t text_len;
	float logprob;          /* log-softmax of the sampled token (when asked) */
	uint32_t n_top;
	const int32_t *top_ids;
	const float *top_logprobs;
	const float *logits;    /* the full row (n_vocab) when asked, else NULL */
	uint32_t n_vocab;
	uint64_t t_sampled_ns;  /* CLOCK_MONOTONIC right after sampling (IPC latency) */
	bool to_socket;         /* the request asked for token frames on the socket */
	void *user;             /* the request's sched_request.user */
};

/* A client as the scheduler sees it. The loop thread creates it and sets emit/sink; the
 * compute thread owns the rest from the first message naming it until it returns the
 * client's SCHED_MSG_CLIENT_GONE message. */
struct sched_client {
	void *sink;
	/* Puts a token event into the client's ring; false when the ring is full (the
	 * sequence then waits, alone, until there is room). Runs on the compute thread. */
	bool (*emit)(void *sink, const struct sched_token *t);
	/* compute-thread state */
	struct sched_msg *waiting;      /* FIFO of requests not yet admitted */
	struct sched_msg *waiting_tail;
	uint32_t n_running;
	struct sched_client *rr_next;   /* ring of clients with waiting requests */
	bool in_rr;
	bool gone;
	uint32_t uid;                   /* the peer's user: admission is fair between users */
};

#define SCHED_TRIGGER_MAX 32

struct sched_request {
	uint64_t id;
	int32_t *prompt;                /* owned by the message */
	uint32_t n_prompt;
	uint32_t max_tokens;
	struct sampler_params sampling;
	uint64_t seed;
	int32_t stop_tokens[SCHED_MAX_STOP_TOKENS];
	uint32_t n_stop_tokens;
	char stop_strings[SCHED_MAX_STOP_STRINGS][SCHED_MAX_STOP_LEN + 1];
	uint32_t n_stop_strings;
	bool logprobs;
	uint32_t top_logprobs;          /* 0..SCHED_MAX_TOP */
	bool full_logits;
	bool ignore_eos;
	bool to_socket;                 /* token events as socket frames (copied to each event) */
	/* Constrained decoding: the matcher of the request's grammar (owned by the message; the
	 * session frees it), active from the first token, or once the output shows trigger
	 * (a tool-call opener: free text until the model starts a call). */
	struct grammar_matcher *grammar;
	char grammar_trigger[SCHED_TRIGGER_MAX];
	/* Jump-forward: bytes the grammar forces are fed as tokens without sampling (one event
	 * each, logprob 0). Not with logprobs or logits: a jumped position has no distribution. */
	bool jump_forward;
	uint64_t prefix_share;          /* prefix-sharing domain (config prefix_share) */
	bool special_text;              /* special tokens' text is part of the output (a chat's
					 * reply parser reads the family's markers in it) */
	uint32_t speculate;             /* draft tokens a step may verify (prompt lookup or
					 * the draft model, daemon/serve/spec.h); 0 = off */
	enum spec_source draft_source;  /* where the drafts may come from */
	/* Embedding, a prefill-only request: prompt holds n_inputs inputs back to back, input
	 * i ending at input_end[i]. They run one after another in one sequence (a batch takes
	 * one place, as a generate does), each with its own KV, freed when it is pooled into
	 * embd_out[i * n_embd ..] (n_inputs x engine n_embd floats), unit length. Nothing is
	 * sampled; max_tokens and the sampling fields are unused. */
	bool embed;
	int pooling;                    /* enum model_pooling: MEAN, CLS or LAST */
	uint32_t n_inputs;
	uint32_t *input_end;            /* owned by the message */
	float *embd_out;                /* owned by the message */
	void *user;                     /* the session's per-request state, handed to emit */
};

struct sched_result {
	enum sched_finish finish;
	struct hearth_error err;        /* when finish == SCHED_FINISH_ERROR */
	uint32_t n_prompt, n_cached, n_generated;
	uint32_t n_forced;              /* of n_generated, fed by jump-forward (not sampled) */
	uint64_t t_submit, t_admit, t_first, t_end;  /* CLOCK_MONOTONIC ns */
};

enum sched_msg_type {
	SCHED_MSG_SUBMIT,        /* -> comes back when the request has finished, result filled */
	SCHED_MSG_CANCEL,        /* -> comes back at once; the request finishes as canceled */
	SCHED_MSG_CLIENT_GONE,   /* -> comes back when no sequence of the client remains */
	SCHED_MSG_SHUTDOWN,      /* -> comes back when every sequence is done or canceled */
	SCHED_MSG_DRAIN,         /* -> comes back when every request, running or queued, has
				  *    finished normally (a model swap retires a scheduler) */
};

/* The only thing that crosses threads. Allocated and freed by the loop thread; the
 * compute thread hands every message back exactly once. */
struct sched_msg {
	enum sched_msg_type type;
	struct sched_client *client;
	uint64_t req_id;                /* CANCEL: which request */
	uint64_t grace_ns;              /* SHUTDOWN: how long running requests may finish */
	struct sched_request req;       /* SUBMIT */
	struct sched_result result;     /* SUBMIT */
	void *user;                     /* loop-thread context, untouched by the scheduler */
	/* scheduler-private */
	struct sched_msg *link;
	uint64_t kv_deadline;
};

struct sched_params {
	uint32_t max_seqs;              /* sequences running at once */
	uint32_t step_tokens;           /* tokens in one forward step, decode + prefill */
	uint32_t prefill_chunk;         /* prompt tokens one sequence adds per step */
	uint64_t kv_wait_ns;            /* how long a request may queue for KV before kv_full */
	uint64_t stall_ns;              /* how long a full ring may stall a sequence before it
					 * is ended (the client stopped reading) */
	uint64_t preempt_ns;            /* how long a sequence may stay parked on a full ring
					 * while other requests wait for its place or its KV */
	uint32_t queue_cap;             /* messages in flight between the threads */
	/* The draft model for speculative decoding (same vocabulary, daemon/serve/draft.h), or
	 * NULL: prompt lookup only. Its model must outlive the scheduler. */
	const struct engine *draft;
};

void sched_params_default(struct sched_params *p);

/* Counters the loop thread may read at any time (stats, STATUS=, watchdog). */
struct sched_stats {
	_Atomic uint64_t steps;         /* forward steps done: the watchdog's progress mark */
	_Atomic uint64_t tokens_generated;
	_Atomic uint64_t tokens_prefilled;
	_Atomic uint64_t tokens_forced; /* generated tokens jump-forward fed without sampling */
	_Atomic uint32_t running;
	_Atomic uint32_t waiting;
	_Atomic uint32_t parked;        /* running but waiting for room in a client's ring */
	_Atomic uint64_t kv_used, kv_total; /* bytes */
	_Atomic uint64_t draft_kv_used, draft_kv_total; /* the draft model's; 0 without one */
	_Atomic uint64_t busy_ns;       /* time spent in forward steps */
	_Atomic uint32_t decode_tps_x100; /* decode tokens/s over the last second, x100 */
	_Atomic uint64_t spec_drafted;  /* draft tokens verified */
	_Atomic uint64_t spec_accepted; /* of them, accepted (output without a step of its own) */
	_Atomic uint64_t spec_model_drafted;  /* of spec_drafted, the draft model's */
	_Atomic uint64_t spec_model_accepted; /* of spec_accepted, the draft model's */
	_Atomic uint64_t draft_rounds;  /* steps the draft model proposed for (each one batched
					 * draft step per proposed token) */
	_Atomic uint64_t preempted;     /* sequences that gave their KV and place back */
	/* Prefix cache: prompt tokens of every admitted sequence (looked up), and those found
	 * cached and not computed again (hits: exactly the sum of the done frames' n_cached). */
	_Atomic uint64_t prefix_lookup_tokens, prefix_hit_tokens;
};

struct sched;

/* Starts the compute thread. notify(notify_ctx) is called from the compute thread after it
 * has put messages into the outgoing queue (libuv: uv_async_send). */
int sched_start(struct sched **out, const struct sched_params *p, const struct engine *eng,
		const struct tok *tok, void (*notify)(void *), void *notify_ctx,
		struct hearth_error *err);

/* Loop thread: hands a message to the compute thread. False when the queue is full
 * (the caller answers busy). */
bool sched_post(struct sched *s, struct sched_msg *m);

/* Loop thread: a zeroed message of `type` from `client`, carrying the loop thread's `user`
 * context (either may be NULL), or NULL when out of memory. */
struct sched_msg *sched_msg_new(enum sched_msg_type type, struct sched_client *client, void *user);

/* Loop thread: posts m (from sched_msg_new, possibly NULL), or frees it when it cannot go,
 * so the caller has one result to check and nothing to clean up. 0: the scheduler owns m
 * until sched_take hands it back; HEARTH_ENOMEM: m was NULL; HEARTH_EBUSY: s is NULL
 * (nothing is being served) or its queue is full. */
int sched_msg_send(struct sched *s, struct sched_msg *m);

/* Loop thread: the next message handed back, or NULL. */
struct sched_msg *sched_take(struct sched *s);

const struct sched_stats *sched_stats(const struct sched *s);

/* Stops the compute thread (after SHUTDOWN came back, or at once). Every message still
 * inside comes back (canceled) through sched_take; then sched_destroy frees the scheduler.
 * Engine sequences are closed before sched_stop returns. */
void sched_stop(struct sched *s);
void sched_destroy(struct sched *s);

#endif
