/* The resident model the daemon serves: every matrix in the kernels' one int4 layout inside
 * the arena (the embedding/head optionally int8), norms and RoPE tables beside them, the
 * paged KV cache, and a forward pass that runs one step for many sequences at once on the
 * pinned thread pool, so the weights stream from memory once per step for everyone. Built
 * by load_q4 (daemon/load.h). */
#ifndef HEARTH_DAEMON_MODEL_Q4_H
#define HEARTH_DAEMON_MODEL_Q4_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/engine/arena.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/kv.h"
#include "daemon/engine/model.h"
#include "kernels/dispatch.h"
#include "kernels/pool.h"
#include "kernels/q4.h"
#include "kernels/q6.h"
#include "kernels/q8.h"

/* The int4 matrices of one layer: wq, wk, wv, wo, gate, up, down (struct mq4_layer). */
#define MQ4_LAYER_MATRICES 7
enum { MQ4_WQ, MQ4_WK, MQ4_WV, MQ4_WO, MQ4_GATE, MQ4_UP, MQ4_DOWN };
/* model_q4_observe's ids past the layers': the head's input (the final norm's output, the
 * rows whose logits are wanted) under layer n_layer, as an untied output matrix's or as the
 * tied embedding's, whose rows the head reads. */
enum { MQ4_OBSERVE_OUTPUT = MQ4_LAYER_MATRICES, MQ4_OBSERVE_TIED_HEAD };
/* Beyond the layers: the embedding and an untied output head. */
#define MQ4_HEAD_MATRICES 2
/* Compute threads a model's pool may have; cpus[] is sized by it, and so is every
 * per-thread scratch the loader plans. */
#define MQ4_THREADS_MAX 256
/* Distinct RoPE settings among the layers (one cos/sin table each). */
#define MQ4_ROPES_MAX 8

/* A distinct (theta, rotary dims, scale) among the layers: one cos/sin table each,
 * max_context rows. */
struct mq4_rope {
	float base, scale;
	uint32_t n_rot;
	float *cos, *sin;          /* max_context x n_rot/2, in the arena */
};

/* The weight groups a step prepares activations for, one slot each: 32 (carried-over codes,
 * the int4/int6 head), 64 and 128 (layers requantized at load). */
#define MQ4_GROUP_SLOTS 3
static inline int mq4_group_slot(size_t group)
{
	return group == 32 ? 0 : group == 64 ? 1 : 2;
}

static inline size_t mq4_slot_group(int slot)
{
	return (size_t)32 << slot;
}

struct mq4_layer {
	uint32_t n_head, n_head_kv, head_dim, head_dim_v, n_ff, n_rot;
	uint32_t window;
	float attn_scale;
	const struct mq4_rope *rope;
	struct q4_matrix wq, wk, wv, wo, gate, up, down;
	/* The same matrices in that order (MQ4_WQ ..) where the loader's mix rule made them
	 * int8 (kernels/q8.h); data NULL where the int4 one above is used. */
	struct q8_matrix w8[MQ4_LAYER_MATRICES];
	const float *attn_norm, *ffn_norm, *q_norm, *k_norm;   /* NULL when absent */
	/* Gemma's norms of each block's output before the residual add; NULL when absent */
	const float *attn_post_norm, *ffn_post_norm;
	const float *bq, *bk, *bv;
};

/* How each source tensor reached the layout, for the loader's report. */
struct mq4_tensor_note {
	char name[64];
	enum qtype src;
	uint32_t group;
	bool carried;              /* codes taken over without re-rounding */
	bool asym;
	uint8_t bits;              /* 4, 6 for an int6 head or 8 for an int8 matrix */
};

struct model_q4 {
	struct model_hparams hp;
	char arch_name[16];
	char name[64];
	uint64_t n_params;
	uint32_t n_layer;
	struct mq4_layer *layers;
	/* The embedding and head are int4 (embd, output), with head_bits 6 int6 (embd6,
	 * output6) or with head_bits 8 int8 (embd8, output8); the other pairs are unused (data
	 * NULL). */
	uint32_t head_bits;
	struct q4_matrix embd;     /* token_embd: also the head when tied */
	struct q4_matrix output;   /* untied head; data NULL when tied */
	struct q6_matrix embd6, output6;
	struct q8_matrix embd8, output8;
	const float *output_norm;
	struct mq4_rope ropes[MQ4_ROPES_MAX];
	uint32_t n_ropes;

	/* The arena this model's regions are in. The model load_q4 returns owns it
	 * (arena_own) and frees it once, in model_q4_free; a draft loaded with it borrows
	 * it (its regions named under ARENA_DRAFT_PREFIX) and its arena_own stays empty. */
	struct arena *arena;
	struct arena arena_own;
	/* The draft model loaded into this model's arena (load_opts.draft), owned: freed
	 * with this model, before the arena it lives in. NULL: none. */
	struct model_q4 *draft;
	struct kv_cache kv;
	uint32_t max_context, max_seqs, step_tokens;
	enum q4_act_kind act;
	const struct kern_table *kern;
	struct pool *pool;
	bool pool_borrowed;        /* a draft steps on its model's pool: not freed here */
	size_t n_threads;
	int cpus[MQ4_THREADS_MAX]; /* the pool's CPUs; cpus[0] is the stepping thread's */

	/* scratch for one step of step_tokens tokens (in the arena's scratch region) */
	float *x, *xb, *q, *k, *v, *att, *hb, *hb2, *logits;
	void *acts_mem;
	/* where each weight group's activations start in acts_mem (mq4_group_slot order: 32,
	 * 64, 128); a group no matrix reads gets no bytes */
	size_t acts_off[MQ4_GROUP_SLOTS];
	float *attn_state;         /* per thread: max[n_head], sum[n_head] of the online softmax */
	size_t attn_state_stride;
	int32_t *step_tokens_buf;  /* token, position and sequence of every batch row */
	uint32_t *step_pos;
	struct engine_seq **step_seq;
	uint32_t *logit_rows;      /* batch rows whose logits are wanted */
	struct engine_seq *seqs;   /* max_seqs slots, indexed by KV sequence id */

	/* Optional (model_q4_observe): called with every layer matrix's input before the
	 * product, as the reference engine's model_ctx_observe. NULL: off. */
	void (*observe)(void *arg, uint32_t layer, int mat, const float *x, size_t n_tok, size_t cols);
	void *observe_arg;

	struct mq4_tensor_note *notes;
	uint32_t n_notes;
	uint64_t bytes_weights, bytes_embed_head, bytes_norms, bytes_rope, bytes_scratch;
	uint32_t n_mix8;           /* layer matrices the mix rule made int8 (load.h) */
	uint32_t n_imatrix;        /* int4 matrices whose scale search an imatrix steered */
	uint32_t n_gptq;           /* matrices rounded by GPTQ (the imatrix's covariances): int4, or an int6 head */
	char quant_name[48];       /* "q4_g128", "q4_g32", "q4_mixed", "q4_g128+head_q6",
				    * "q4_g128+mix" ... */
};

/* Allocates the per-step bookkeeping (rows, positions, sequence slots) once the loader
 * has set max_seqs, step_tokens and max_context. */
int model_q4_prepare(struct model_q4 *m, struct hearth_error *err);

/* The scheduler's view. Sequences are KV sequences with their token history (the prefix
 * cache needs each full block's ids). */
void model_q4_engine(struct model_q4 *m, struct engine *out);

/* What the service reports about a loaded model (its log lines, the welcome, the ledger),
 * read through one call instead of the struct's fields. Strings point into m. */
struct model_q4_facts {
	const char *arch, *name, *quant;
	uint64_t n_params;
	uint32_t max_context, n_ctx_train, n_vocab, n_layer, n_embd;
	const struct arena *arena;
	size_t arena_bytes;
	const char *arena_backing, *arena_note;
	uint32_t n_matrices, n_carried;  /* matrices repacked; of them, carried without re-rounding */
	uint32_t n_int8;                 /* of them, int8 (the head, the mix rule's choices) */
	uint32_t n_int6;                 /* of them, int6 (the head) */
	uint32_t n_imatrix;              /* int4 matrices an imatrix steered */
	uint32_t n_gptq;                 /* matrices rounded by GPTQ (int4, or an int6 head) */
	const char *kernels;
	size_t n_threads;
};
void model_q4_facts(const struct model_q4 *m, struct model_q4_facts *out);

/* Calls fn(arg, layer, MQ4_WQ.., x, n_tok, cols) with every layer matrix's float input
 * (n_tok rows of cols, the step's rows of every span) before each product, and with the
 * head's (MQ4_OBSERVE_OUTPUT or _TIED_HEAD: the rows whose logits a span wants), on the stepping
 * thread, while the other threads multiply: how a calibration pass (hearthd-tool imatrix)
 * measures the columns the activations lean on at the int4 engine's speed. NULL turns it
 * off; off by default, and a step without it costs nothing more. */
void model_q4_observe(struct model_q4 *m,
		      void (*fn)(void *arg, uint32_t layer, int mat, const float *x, size_t n_tok, size_t cols),
		      void *arg);

/* Runs spans (several sequences, prefill chunks and decode tokens) as one batched step.
 * Total tokens must not exceed step_tokens. */
int model_q4_forward(struct model_q4 *m, const struct engine_span *spans, size_t n_spans,
		     struct hearth_error *err);

/* Frees everything: the draft (first: it lives in this model's arena), KV bookkeeping,
 * the pool (unless borrowed), the arena (unless borrowed). NULL is fine. */
void model_q4_free(struct model_q4 *m);

#endif
