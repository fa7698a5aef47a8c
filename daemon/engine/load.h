/* The loader: from a GGUF file (and optionally a draft model's) to the resident int4 model.
 * It plans the one arena before it maps anything (packed weights, norms, RoPE tables sized
 * by max_context, the KV pool, scratch; then the draft's, under ARENA_DRAFT_PREFIX),
 * repacks each matrix a row block at a time through a small scratch (no step expands a whole
 * matrix; the file's pages are given back every few MiB as they are consumed), then unmaps
 * the file, drops its page cache and trims the heap. */
#ifndef HEARTH_DAEMON_LOAD_H
#define HEARTH_DAEMON_LOAD_H

#include <stdint.h>

#include "daemon/engine/arena.h"
#include "daemon/engine/model_q4.h"
#include "kernels/q4.h"
#include "protocol/error.h"

struct tok;
struct ledger_load;

/* The layer matrices' arena regions, one per packed type (arena.h's "weights.<type>"):
 * group 64 (row8) or 128 for weights quantized at load (weights_group 64, 128), group 32
 * for weights quantized at load with weights_group 32, for codes carried over from Q4_0,
 * Q4_1 and Q4_K files, and for rows whose width is not a multiple of the group; "q8" for
 * the layer matrices the mix rule made int8. The token embedding and an untied head live in
 * ARENA_REGION_EMBED_HEAD whatever their type (int4, int6 or int8). */
#define LOAD_REGION_WEIGHTS_G128 ARENA_REGION_WEIGHTS ".q4g128"
#define LOAD_REGION_WEIGHTS_G32 ARENA_REGION_WEIGHTS ".q4g32"
#define LOAD_REGION_WEIGHTS_G64 ARENA_REGION_WEIGHTS ".q4g64"
#define LOAD_REGION_WEIGHTS_Q8 ARENA_REGION_WEIGHTS ".q8"

/* Speculative decoding's draft model, loaded with the model into the model's arena: the
 * same weight layout, threads (it steps on the model's pool), NUMA node, page kind and
 * lock; its regions are the model's names under ARENA_DRAFT_PREFIX ("draft.weights.q4g32",
 * "draft.kv_pool", ...). The loaded model owns it (model_q4.draft) and frees it with the
 * arena, so a swap that frees the model frees both. */
struct load_draft_opts {
	const char *path;              /* NULL or "": no draft */
	uint64_t kv_budget;            /* bytes for the draft's KV pool */
	bool kv_rings_extra;           /* as load_opts.kv_rings_extra, for the draft's budget */
	/* Called with both tokenizers once both files are read and before anything is mapped:
	 * a negative return refuses the draft, and the load fails with its error (prefixed
	 * with both paths). NULL: no check. The draft's tokenizer is freed after the load. */
	int (*vocab_check)(const struct tok *model, const struct tok *draft, struct hearth_error *err);
};

/* What became of load_opts.weights_cache. */
enum load_cache_outcome {
	LOAD_CACHE_NONE,        /* no weights_cache asked for */
	LOAD_CACHE_READ,        /* the packed matrices were read from it: nothing repacked */
	LOAD_CACHE_WRITTEN,     /* repacked, and the file written for the next load */
	LOAD_CACHE_UNWRITTEN,   /* repacked; writing the file failed */
};

struct load_cache_report {
	enum load_cache_outcome outcome;
	uint64_t bytes;                  /* of packed matrices read or written */
	/* A file that was there and not used (another model or settings, damaged): why, with
	 * its path; "" when there was none or it was read. */
	char refused[HEARTH_ERROR_MSG_MAX];
	char unwritten[HEARTH_ERROR_MSG_MAX]; /* LOAD_CACHE_UNWRITTEN: the write's error */
};

struct load_opts {
	uint32_t max_context;          /* sizes RoPE and per-sequence KV; <= the trained length */
	uint64_t kv_budget;            /* bytes for the whole KV pool */
	/* The sliding-window layers' rings come on top of kv_budget instead of out of it: a
	 * default budget that knows nothing of the model still leaves room for its blocks. */
	bool kv_rings_extra;
	enum qtype kv_type;            /* QTYPE_F16, QTYPE_BF16 or QTYPE_KV_Q8 (int8 rows) */
	uint32_t max_seqs;             /* sequences running at once */
	uint32_t step_tokens;          /* tokens in one batched step */
	struct arena_config arena;
	enum q4_act_kind act;          /* Q4_ACT_A16 (W4A16) or Q4_ACT_A8 (W4A8) */
	size_t n_threads;              /* 0: every CPU of the arena's NUMA node */
	/* How matrices read from F32/F16/BF16 are quantized (carried-over Q4_0/Q4_1/Q4_K codes
	 * keep their own layout): LOAD_GROUP_64 (load_opts_default's), asymmetric group 64
	 * with the scale search and its d and m as 8-bit codes per row (kernels/q4.h row8,
	 * 4.27 bpw at 2048 columns: a fifth less KL than group 128 on the trained models, at
	 * group 128's decode speed; doc/benchmarks.md), LOAD_GROUP_128, asymmetric group 128
	 * with fp16 d and m (4.25 bpw), or LOAD_GROUP_32, symmetric group 32 (4.5 bpw, Q4_0's
	 * format). Rows not a multiple of the group go to group 32 asymmetric. 0 reads as
	 * LOAD_GROUP_64. The embedding/head follows load_head_group(). */
	uint32_t weights_group;
	/* 0: the embedding/head as load_head_group() says; LOAD_GROUP_128 (asymmetric),
	 * LOAD_GROUP_32 (symmetric) or LOAD_GROUP_32_ASYM forces that layout for it
	 * (bench/fidelity measures the alternatives with this). */
	uint32_t head_group;
	/* 0: as the mix rule decides (int4 with mix off, int6 when it fits the budget);
	 * LOAD_HEAD_INT4, LOAD_HEAD_INT6 or LOAD_HEAD_INT8 forces it, and the mix rule keeps
	 * a forced choice and counts it. The token embedding and the head (once when tied) are
	 * where 4 bits cost the most quality. int6 (kernels/q6.h, 6.5 bits a weight) rounds to
	 * a quarter of int4's step, nearly int8's accuracy, and packs every type hearth reads
	 * from f32 rows at group 32 with a scale search. int8 (kernels/q8.h, 8.25 bits) packs
	 * F32/F16/BF16 and types it cannot carry over at group 128 (head_group 32, or rows not
	 * a multiple of 128: group 32) and carries Q8_0 over exactly at group 32. */
	uint32_t head_bits;
	/* LOAD_MIX_AUTO (0) or LOAD_MIX_OFF. The mix rule spends what the int4 layout leaves of
	 * a budget of LOAD_MIX_BUDGET_CBPW / 100 bits per parameter (the bits bench/fidelity
	 * reports: matrices with their scales, norms, over every parameter of the file) on int8
	 * copies of the matrices where 4 bits cost the most KL per bit, as bench/fidelity
	 * --sensitivity measured on the trained models (doc/benchmarks.md): the embedding/head
	 * at int6 when head_bits is 0 and it fits whole, then layer matrices at int8 layer by
	 * layer from the outside in (the first layer, the last, the second, ...), in each layer
	 * attn_v, ffn_down, attn_k, attn_q, attn_output, ffn_gate, ffn_up, skipping any that
	 * would pass the budget. The head is int6, not int8: an int8 head took the whole budget
	 * of the larger trained model and left its layers int4, where int6 keeps most of int8's
	 * gain for less than half its extra bits and the bits saved buy the first layer's most
	 * sensitive matrices. Carried-over 4-bit codes are never upgraded. A model already over
	 * the budget (a forced int8 head on a small model) gets nothing; with room for every
	 * matrix, all. */
	uint32_t mix;
	/* The mix rule's budget in hundredths of a bit per parameter; 0 reads as
	 * LOAD_MIX_BUDGET_CBPW (tests and benches move it to see the rule at its edges). */
	uint32_t mix_budget_cbpw;
	/* Optional (NULL or ""): an imatrix file (llama-imatrix's GGUF; daemon/engine/imatrix.h)
	 * whose per-column activation statistics weigh the scale search of every int4 matrix
	 * requantized from F32/F16/BF16/Q8_0..., so each group's scale and offset fit the
	 * columns the activations lean on. Matrices it has no statistics for are packed as
	 * without it; a file that is not an imatrix, or whose row lengths disagree with the
	 * model's, fails the load before anything is mapped. The draft does not use it. */
	const char *imatrix;
	/* Optional (NULL or ""): a file of packed weights (daemon/engine/pack_cache.h) kept
	 * between loads. When it holds this model's matrices as this load would pack them (its
	 * key: the model file's and imatrix file's identity, device, inode, size and
	 * modification time; every matrix's layout as planned; PACK_CACHE_FORMAT and the
	 * hearthd version) and its checksum agrees, the matrices are read from it instead of
	 * repacked; otherwise they are repacked and the file written (through a .part renamed
	 * into place) for the next load. The file is only ever a copy: anything wrong with it
	 * costs a repack, never the load. The draft does not use it. */
	const char *weights_cache;
	/* Optional: what became of weights_cache (filled on success). */
	struct load_cache_report *cache_report;
	/* Called between tensors; phase is "repacking" etc., what names the tensor. */
	void (*progress)(void *ctx, const char *phase, const char *what, uint64_t done,
			 uint64_t total);
	void *progress_ctx;
	/* Optional: the load's memory as the ledger sampler saw it (RssAnon every 10 ms from
	 * before the file is mapped until after it is released; daemon/ledger.h). Filled on
	 * success; on failure its valid is false. */
	struct ledger_load *load_record;
	/* Optional: where the arena's pages are once loaded (bytes per NUMA node). A page off
	 * the bound node fails the load only when arena.numa_node names a node (>= 0); with
	 * auto (-1) it is only reported here, bytes_other_node counting it. */
	struct arena_placement *placement;
	/* Optional (path NULL: none). The draft is loaded for max_context or the context it
	 * was trained for, whichever is shorter; every other option is the model's. */
	struct load_draft_opts draft;
};

#define LOAD_GROUP_128 128u
#define LOAD_GROUP_64 64u
#define LOAD_GROUP_32 32u
/* Not a weights_group: group 32 asymmetric (Q4_1's format, 5.0 bits per weight), the
 * embedding/head's layout when the layers are at group 128. */
#define LOAD_GROUP_32_ASYM 33u
#define LOAD_HEAD_INT4 4u
#define LOAD_HEAD_INT6 6u
#define LOAD_HEAD_INT8 8u
#define LOAD_MIX_AUTO 0u
#define LOAD_MIX_OFF 1u
#define LOAD_MIX_BUDGET_CBPW 450u   /* 4.50 bits per parameter */

/* The defaults every user of the loader shares: hearthd's config table reads the first two
 * (as text, hence plain literals and the budget in MiB) and the scheduler the last two, so
 * the arena is planned for the sequences and step the scheduler runs. */
#define LOAD_DEFAULT_MAX_CONTEXT 4096
#define LOAD_DEFAULT_KV_BUDGET_MIB 256
#define LOAD_DEFAULT_MAX_SEQS 16
#define LOAD_DEFAULT_STEP_TOKENS 256

void load_opts_default(struct load_opts *o);

/* The layout the embedding/head is quantized at for a weights_group: LOAD_GROUP_32_ASYM
 * for 128, LOAD_GROUP_32 for 32 (doc/benchmarks.md has the measurements behind the
 * choice). */
uint32_t load_head_group(uint32_t weights_group);

/* Loads path into a resident model and its tokenizer, and o->draft's model into the same
 * arena ((*out)->draft). Errors name the file and what was wrong (a draft's start with
 * "draft_model"); nothing is left allocated or mapped on failure. */
int load_q4(struct model_q4 **out, struct tok **tok_out, const char *path,
	    const struct load_opts *o, struct hearth_error *err);

/* The bytes of the arena load_q4 would map for path and o->draft (rounded up to a huge
 * page), from the files' metadata and the same plan, without mapping it or reading a
 * weight: what a second model beside the first would cost. Fails as load_q4 would before
 * mapping (a file that does not parse, a draft of another vocabulary, a KV budget that
 * holds no block). */
int load_plan_size(const char *path, const struct load_opts *o, size_t *bytes, struct hearth_error *err);

#endif
