/* The model: architecture and hyperparameters read from a GGUF file, weights as views
 * into its mapping, and the f32 scalar reference forward pass over a batch of tokens with
 * a per-sequence KV state. This is the oracle every fast path is tested against. */
#ifndef HEARTH_DAEMON_MODEL_H
#define HEARTH_DAEMON_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/engine/gguf.h"
#include "kernels/ops.h"
#include "protocol/error.h"

enum model_arch {
	MODEL_ARCH_LLAMA,  /* llama, Llama 3.x, SmolLM, TinyStories */
	MODEL_ARCH_QWEN2,  /* q/k/v biases */
	MODEL_ARCH_QWEN3,  /* per-head RMSNorm of q and k before RoPE */
	MODEL_ARCH_GEMMA3, /* sliding-window and global layers, four norms per layer, GeGLU */
};

/* The gate's activation in the gated feed-forward block: down(act(gate) * up). */
enum model_ffn_act {
	MODEL_FFN_SILU,    /* SwiGLU (llama, qwen) */
	MODEL_FFN_GELU,    /* GeGLU with the tanh approximation of GELU (gemma) */
};

/* Upper bound on a configured context; beyond it the KV arithmetic is not worth trusting. */
#define MODEL_MAX_CTX_LIMIT (1u << 20)

/* How a file says its embeddings are pooled: `<arch>.pooling_type`, numbered as llama.cpp's
 * enum llama_pooling_type so the GGUF value is stored as is. A file without the key is
 * MODEL_POOLING_UNSPECIFIED (a generative model); an embed request then names its pooling. */
enum model_pooling {
	MODEL_POOLING_UNSPECIFIED = -1,
	MODEL_POOLING_NONE = 0,
	MODEL_POOLING_MEAN = 1,
	MODEL_POOLING_CLS = 2,
	MODEL_POOLING_LAST = 3,
	MODEL_POOLING_RANK = 4,   /* a reranker's score head; recognised so the error can say so */
};

struct model_hparams {
	enum model_arch arch;
	uint32_t n_vocab;
	uint32_t n_embd;
	uint32_t n_layer;
	uint32_t n_ctx_train;   /* what the file advertises; informational, never used to size */
	float norm_eps;
	bool tied_output;       /* the head is token_embd (stored once) */
	enum ops_rope_style rope_style;
	enum model_pooling pooling;   /* <arch>.pooling_type, or UNSPECIFIED */
	enum model_ffn_act ffn_act;
	float embd_scale;       /* embedding rows are multiplied by it: sqrt(n_embd) for gemma, else 1 */
	float logit_softcap;    /* > 0: logits become cap * tanh(logits / cap); 0: left alone */
	uint32_t n_swa;         /* the sliding layers' window (positions); 0: every layer is global */
};

/* Everything one layer needs, so layers may differ (sliding-window layers with their own
 * theta, per-layer head counts or ff width). Tensor pointers are views into the GGUF
 * mapping; optional ones are NULL when absent. */
struct model_layer {
	uint32_t n_head;
	uint32_t n_head_kv;
	uint32_t head_dim;      /* of q and k */
	uint32_t head_dim_v;
	uint32_t n_ff;
	uint32_t n_rot;         /* rotated dimensions per head (<= head_dim) */
	float rope_base;
	float rope_scale;       /* linear position scaling: angles are multiplied by this */
	uint32_t window;        /* sliding attention window in positions; 0 = full causal. A
				 * query at p sees keys p - window + 1 .. p, as llama.cpp masks */
	float attn_scale;       /* multiplies q.k */

	const struct gguf_tensor *attn_norm;
	const struct gguf_tensor *wq, *wk, *wv, *wo;
	const struct gguf_tensor *bq, *bk, *bv, *bo;
	const struct gguf_tensor *q_norm, *k_norm;
	const struct gguf_tensor *ffn_norm;
	const struct gguf_tensor *ffn_gate, *ffn_up, *ffn_down;
	/* Gemma's norms of each block's output before it joins the residual stream. */
	const struct gguf_tensor *attn_post_norm, *ffn_post_norm;
};

/* How attention treats its numbers. */
enum model_kv_type {
	/* Exact: K and V kept in f32, scores and weighted sums in f32 and double. */
	MODEL_KV_F32,
	/* llama.cpp's CPU flash attention over its default f16 cache: K, V and q rounded to
	 * f16, V summed into an f16 accumulator with online softmax. Against the fixtures
	 * (made that way) logits agree to ~0.002, where MODEL_KV_F32 is ~0.008 away: nearly
	 * all of the difference is llama.cpp's f16 accumulator. The rounded values are stored
	 * in f32: the oracle matches the arithmetic, its memory does not matter. */
	MODEL_KV_F16,
};

struct model_opts {
	uint32_t max_ctx;       /* largest context any model_ctx may ask for */
	enum model_kv_type kv_type;
};

struct model {
	const struct gguf_file *file;   /* borrowed: must outlive the model */
	struct model_hparams hp;
	struct model_opts opts;
	struct model_layer *layers;     /* hp.n_layer */
	const struct gguf_tensor *tok_embd;
	const struct gguf_tensor *output_norm;
	const struct gguf_tensor *output; /* == tok_embd when tied */
	const float *rope_freqs;        /* Llama 3.x per-pair divisors (n_rot/2), or NULL */
};

/* Reads and validates the architecture, every required key, and every tensor's presence,
 * type and shape. f must stay open while the model lives. opts may be NULL (max_ctx 4096,
 * MODEL_KV_F32). Errors name the file and the key or tensor. */
int model_load(struct model **out, const struct gguf_file *f, const struct model_opts *opts,
	       struct hearth_error *err);
void model_free(struct model *m);

const char *model_arch_name(enum model_arch arch);

#endif
