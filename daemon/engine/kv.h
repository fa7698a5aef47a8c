/* The paged KV cache: fixed-size blocks of block_tokens positions carved from the arena's
 * "kv_pool" region under one byte budget and made resident at start. Sequences own lists of
 * blocks; full blocks are published by a content hash chain so prompts that start alike
 * (the same system prompt from many apps) share them, refcounted and never written again.
 * Sliding-window layers (Gemma 3) are the second kind: they keep only their window, in a
 * ring of pages per sequence slot ("kv_pool.sliding"), so only global layers cost KV per
 * position. Owned by the compute thread: no locks; nothing allocates after kv_create. */
#ifndef HEARTH_DAEMON_KV_H
#define HEARTH_DAEMON_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/engine/arena.h"
#include "kernels/quant.h"
#include "kernels/vec.h"
#include "protocol/error.h"

#define KV_DEFAULT_BUDGET ((size_t)256 << 20)
#define KV_DEFAULT_BLOCK_TOKENS 16
#define KV_CHUNK_ALIGN 64       /* every (block, layer, K|V) chunk starts on a cache line */
#define KV_NO_BLOCK UINT32_MAX
#define KV_Q8_SCALE_BYTES 4     /* a QTYPE_KV_Q8 row: head_dim int8 codes, then an f32 scale */

/* One layer's cached shape; layers may differ (per-layer KV heads, a V head size unlike K,
 * a sliding window). */
struct kv_layer_shape {
	uint32_t n_head_kv;
	uint32_t head_dim_k;
	uint32_t head_dim_v;
	uint32_t window;              /* 0: global, in the blocks; > 0: sliding, in the rings */
};

struct kv_config {
	size_t budget_bytes;          /* the pool: whole blocks that fit; 0 = KV_DEFAULT_BUDGET */
	uint32_t block_tokens;        /* 0 = KV_DEFAULT_BLOCK_TOKENS */
	enum qtype elem_type;         /* QTYPE_F16, QTYPE_BF16, QTYPE_F32 or QTYPE_KV_Q8 */
	uint32_t n_layer;
	/* Uniform shape (head_dim for K and V) unless layer_shapes is set: then n_layer entries
	 * of it are used and these two are ignored. Copied by kv_create. */
	uint32_t n_head_kv;
	uint32_t head_dim;
	const struct kv_layer_shape *layer_shapes;
	uint32_t max_seqs;            /* sequence slots, preallocated */
	uint32_t max_context;         /* positions one sequence may hold */
	/* Most positions one sequence adds in one step (0: max_context). A sliding layer's
	 * ring holds window + step_tokens - 1 positions: a chunk's first query still sees its
	 * whole window while the chunk's own keys go in. */
	uint32_t step_tokens;
	/* The rings are allocated beside budget_bytes, not out of it (the blocks get all of
	 * it): for a budget chosen without the model in mind. */
	bool rings_outside_budget;
	/* The arena region the pool is carved from: NULL reads as ARENA_REGION_KV; the rings
	 * go in the region of that name plus ".sliding". A draft model in its model's arena
	 * names its own ("draft.kv_pool"). */
	const char *region;
};

/* Sizes that follow from a config; what the loader puts in the arena plan as "kv_pool".
 *
 * Block layout (block-major so one block is one contiguous run; see doc/memory.md):
 *   block b at pool + b * block_bytes, then for each layer l:
 *     K chunk at layer_k_off[l]: [n_head_kv][block_tokens] rows of head_dim_k elements
 *     V chunk at layer_v_off[l]: [n_head_kv][block_tokens] rows of head_dim_v elements
 *   each row head_dim * elem_bytes + row_extra_bytes (QTYPE_KV_Q8: its scale) bytes,
 *   each chunk padded to KV_CHUNK_ALIGN bytes. */
struct kv_geometry {
	size_t elem_bytes;            /* 1 for QTYPE_KV_Q8 (the codes) */
	size_t row_extra_bytes;       /* bytes after a row's elements: KV_Q8_SCALE_BYTES or 0 */
	size_t block_bytes;           /* the global layers' chunks (one cache line if none) */
	uint32_t n_blocks;            /* floor((budget - ring_bytes) / block_bytes) */
	size_t pool_bytes;            /* n_blocks * block_bytes: the arena region's size */
	uint32_t max_blocks_per_seq;  /* ceil(max_context / block_tokens) */
	/* Sliding layers, laid out like a block over their own chunks: a ring page of
	 * block_tokens positions; ring_pages per sequence slot, position p in page
	 * (p / block_tokens) % ring_pages of its slot. 0 when no layer slides. */
	uint32_t n_sliding;           /* layers with a window */
	size_t ring_page_bytes;
	uint32_t ring_pages;          /* min(max_blocks_per_seq, ceil((window + step - 1) / bt) + 1) */
	size_t ring_bytes;            /* max_seqs * ring_pages * ring_page_bytes: "kv_pool.sliding" */
};

/* Validates cfg and computes the geometry. HEARTH_EINVAL names the bad field; a budget
 * smaller than one block is HEARTH_EINVAL naming both sizes; HEARTH_ERANGE on overflow. */
int kv_plan(const struct kv_config *cfg, struct kv_geometry *geo, struct hearth_error *err);

struct kv_seq {
	uint32_t id;                  /* slot index, < max_seqs */
	bool live;
	uint32_t n_tokens;            /* positions reserved (and, by the caller, being filled) */
	uint32_t n_blocks;            /* blocks[0..n_blocks) back positions [0, n_blocks*bt) */
	uint32_t n_committed;         /* leading full blocks published to the prefix hash */
	uint32_t *blocks;             /* max_blocks_per_seq entries, owned by the cache */
	uint64_t *hashes;             /* chain hash of each committed block */
	uint64_t share;               /* prefix-sharing domain: blocks match only within it */
};

struct kv_cache {
	struct kv_geometry geo;
	uint32_t block_tokens;
	uint32_t n_layer;
	uint32_t max_seqs;
	uint32_t max_context;
	enum qtype elem_type;
	size_t budget_bytes;
	uint8_t *pool;                /* in the arena's kv_pool region */
	uint8_t *ring_pool;           /* in "kv_pool.sliding"; NULL when no layer slides */
	size_t *layer_k_off;          /* n_layer byte offsets within a block (global layers) or */
	size_t *layer_v_off;          /* a ring page (sliding layers) */
	struct kv_layer_shape *shapes;/* n_layer */
	/* Per slot, max_blocks_per_seq ring page ids (slot * ring_pages + i % ring_pages): the
	 * page table a sliding layer's span reads, fixed at kv_create. */
	uint32_t *ring_table;

	/* Block state, all preallocated. A block is in use (ref > 0), cached (ref == 0 but
	 * still findable by hash, on the LRU list, reused last) or free (on the free stack). */
	uint32_t *ref;
	uint8_t *hashed;
	uint64_t *hash;
	uint32_t *parent;             /* the block before it in its chain, or KV_NO_BLOCK */
	int32_t *tokens;              /* block_tokens ids per hashed block, to confirm a match */
	uint32_t *free_stack;
	uint32_t n_free;
	uint32_t *lru_prev, *lru_next;
	uint32_t lru_head, lru_tail;  /* head = least recently released */
	uint32_t n_cached;

	uint32_t *table;              /* open addressing, linear probing: block ids */
	uint32_t table_mask;
	uint64_t hash_key;            /* random per cache: chains are not predictable */

	struct kv_seq *seqs;
	uint32_t *seq_free;           /* stack of free slot ids */
	uint32_t n_seq_free;
	uint32_t *seq_block_store;    /* max_seqs * max_blocks_per_seq */
	uint64_t *seq_hash_store;

	uint64_t prefix_queries, prefix_query_tokens, prefix_hit_tokens;
};


/* Builds the cache over the arena's "kv_pool" region (cfg->region, planned with
 * kv_plan's pool_bytes): carves the pool from it and prefaults it, so the whole budget is
 * resident before the first request. Bookkeeping (block tables for max_seqs sequences,
 * the hash table) is allocated here, once. */
int kv_create(struct kv_cache *kv, const struct kv_config *cfg, struct arena *arena,
	      struct hearth_error *err);
void kv_destroy(struct kv_cache *kv);

/* A fresh sequence with no blocks. HEARTH_EBUSY when all max_seqs slots are live. */
int kv_seq_new(struct kv_cache *kv, struct kv_seq **out, struct hearth_error *err);

/* Ensures blocks back positions [0, n_tokens) (n_tokens is a total, not an increment;
 * smaller than what is held is a no-op). All or nothing: HEARTH_EKVFULL, with the blocks
 * needed, free and in all, when the budget cannot hold it now; HEARTH_ERANGE past
 * max_context. New blocks are always private, so the caller may write them. */
int kv_seq_reserve(struct kv_cache *kv, struct kv_seq *seq, uint32_t n_tokens,
		   struct hearth_error *err);

/* For a fresh sequence about to hold tokens[0..n): attaches every leading full block
 * already in the cache (refcount + 1) and returns how many tokens they cover, a multiple
 * of block_tokens and at most n - 1, so at least one token is left to compute (its logits
 * are needed, and the block it lands in is private). Returns a negative code for a
 * sequence that already holds blocks. With sliding layers it always returns 0: their K/V
 * of the window before the match lives in another sequence's ring, gone or being
 * overwritten (llama.cpp likewise reprocesses such prompts unless --swa-full). */
int kv_seq_match_prefix(struct kv_cache *kv, struct kv_seq *seq, const int32_t *tokens,
			uint32_t n, struct hearth_error *err);

/* Publishes block i of seq, now completely filled with K/V for tokens[0..block_tokens)
 * (the ids of that block's positions), so later sequences can share it. Blocks must be
 * committed in order (i == seq->n_committed) and lie within n_tokens. If an equal block is
 * already cached, seq switches to it and its own copy is freed: read block ids from
 * seq->blocks again after this call. After commit the block is never written again. */
int kv_seq_commit_block(struct kv_cache *kv, struct kv_seq *seq, uint32_t i,
			const int32_t *tokens, struct hearth_error *err);

/* Returns the sequence's blocks at once (shared ones when their last user leaves: they
 * stay findable by hash until their memory is reused) and frees its slot. */
void kv_seq_free(struct kv_cache *kv, struct kv_seq *seq);

uint32_t kv_block_refcount(const struct kv_cache *kv, uint32_t block);

/* Puts a new sequence (before kv_seq_match_prefix) in a prefix-sharing domain: its blocks
 * are found only by sequences of the same domain, so whether a prompt is cached says
 * nothing across domains (0, the default, is one domain for all). */
void kv_seq_set_share(struct kv_seq *seq, uint64_t share);

/* Publishes every full block of tokens[0..n_filled) not yet committed, in order: the
 * positions [0, n_filled) hold K/V and tokens are their ids. Same contract per block as
 * kv_seq_commit_block; n_filled must lie within the reservation. With sliding layers
 * nothing is published (no match could use it: kv_seq_match_prefix). */
int kv_seq_commit_filled(struct kv_cache *kv, struct kv_seq *seq, const int32_t *tokens,
			 uint32_t n_filled, struct hearth_error *err);

/* Read-only facts about a sequence and the cache, so callers never read the structs'
 * fields: the slot index (< max_seqs, stable while the sequence lives), the positions
 * reserved, the leading blocks committed, the tokens per block and the element type. */
static inline uint32_t kv_seq_slot(const struct kv_seq *seq) { return seq->id; }
static inline uint32_t kv_seq_reserved(const struct kv_seq *seq) { return seq->n_tokens; }
static inline uint32_t kv_seq_committed(const struct kv_seq *seq) { return seq->n_committed; }
static inline uint32_t kv_block_tokens(const struct kv_cache *kv) { return kv->block_tokens; }
static inline enum qtype kv_elem_type(const struct kv_cache *kv) { return kv->elem_type; }

struct kv_stats {
	size_t budget_bytes;
	size_t pool_bytes;
	size_t block_bytes;
	uint32_t block_tokens;
	uint32_t blocks_total;
	uint32_t blocks_used;         /* ref > 0 */
	uint32_t blocks_shared;       /* ref > 1 */
	uint32_t blocks_cached;       /* ref == 0 but reusable by a prefix match */
	uint32_t blocks_free;         /* free + cached: what a reserve can take */
	uint32_t seqs_live;
	uint32_t max_seqs;
	uint32_t max_context;
	uint64_t tokens_capacity;     /* blocks_total * block_tokens */
	uint64_t tokens_free;         /* blocks_free * block_tokens */
	/* How many sequences at the full max_context the budget holds (prefix sharing aside). */
	uint32_t seqs_at_max_context;
	uint64_t prefix_queries;
	uint64_t prefix_query_tokens;
	uint64_t prefix_hit_tokens;
	/* The two kinds: global layers pay per position (block_bytes / block_tokens each),
	 * sliding ones a fixed ring per sequence slot. */
	uint32_t layers_global, layers_sliding;
	size_t ring_bytes;            /* all slots' rings */
	size_t ring_bytes_per_seq;
	uint32_t ring_tokens;         /* positions one ring holds */
};

void kv_stats(const struct kv_cache *kv, struct kv_stats *st);

/* Where the engine reads and writes: the K (or V) chunk of global layer l in block b, laid
 * out [head][slot][dim]. Position p of a sequence is slot p % block_tokens of block
 * seq->blocks[p / block_tokens]. Head-major, so one head's rows of a block are one
 * contiguous run: decode splits a sequence's heads across threads, and each then
 * streams whole runs instead of a 256-byte slice of every 2 KiB row. */
static inline void *kv_block_k(const struct kv_cache *kv, uint32_t block, uint32_t layer)
{
	return kv->pool + (size_t)block * kv->geo.block_bytes + kv->layer_k_off[layer];
}

static inline void *kv_block_v(const struct kv_cache *kv, uint32_t block, uint32_t layer)
{
	return kv->pool + (size_t)block * kv->geo.block_bytes + kv->layer_v_off[layer];
}

/* A layer's pages for one sequence, by kind: the sequence's blocks (global layers) or its
 * slot's ring (sliding layers); each page holds block_tokens positions at page_bytes apart
 * from base. */
static inline bool kv_layer_slides(const struct kv_cache *kv, uint32_t layer)
{
	return kv->shapes[layer].window != 0;
}

static inline const uint32_t *kv_seq_pages(const struct kv_cache *kv, const struct kv_seq *seq,
					   uint32_t layer)
{
	return kv_layer_slides(kv, layer)
		       ? kv->ring_table + (size_t)seq->id * kv->geo.max_blocks_per_seq
		       : seq->blocks;
}

static inline uint8_t *kv_layer_base(const struct kv_cache *kv, uint32_t layer)
{
	return kv_layer_slides(kv, layer) ? kv->ring_pool : kv->pool;
}

static inline size_t kv_layer_page_bytes(const struct kv_cache *kv, uint32_t layer)
{
	return kv_layer_slides(kv, layer) ? kv->geo.ring_page_bytes : kv->geo.block_bytes;
}

/* Bytes of one stored row of dim values (kv_plan checked every layer's for overflow). */
static inline size_t kv_row_bytes(const struct kv_cache *kv, uint32_t dim)
{
	return (size_t)dim * kv->geo.elem_bytes + kv->geo.row_extra_bytes;
}

/* The K (or V) row of one kv head at one position (kv_row_bytes of head_dim); the head's
 * next position in the same block follows it directly. */
static inline void *kv_seq_k(const struct kv_cache *kv, const struct kv_seq *seq, uint32_t layer,
			     uint32_t pos, uint32_t head)
{
	uint32_t b = kv_seq_pages(kv, seq, layer)[pos / kv->block_tokens];
	size_t row = kv_row_bytes(kv, kv->shapes[layer].head_dim_k);
	return kv_layer_base(kv, layer) + (size_t)b * kv_layer_page_bytes(kv, layer) +
	       kv->layer_k_off[layer] + ((size_t)head * kv->block_tokens + pos % kv->block_tokens) * row;
}

static inline void *kv_seq_v(const struct kv_cache *kv, const struct kv_seq *seq, uint32_t layer,
			     uint32_t pos, uint32_t head)
{
	uint32_t b = kv_seq_pages(kv, seq, layer)[pos / kv->block_tokens];
	size_t row = kv_row_bytes(kv, kv->shapes[layer].head_dim_v);
	return kv_layer_base(kv, layer) + (size_t)b * kv_layer_page_bytes(kv, layer) +
	       kv->layer_v_off[layer] + ((size_t)head * kv->block_tokens + pos % kv->block_tokens) * row;
}

/* One sequence's rows [first, first + n) of KV heads [h0, h1) of a layer, described the way
 * the attention kernels walk them (kernels/vec.h): the cache's blocks are the pages. */
static inline struct vec_kv_span kv_seq_span(const struct kv_cache *kv, const struct kv_seq *seq,
					     uint32_t layer, uint32_t h0, uint32_t h1, uint32_t first,
					     uint32_t n, enum vec_kv_type type)
{
	size_t k_row = kv_row_bytes(kv, kv->shapes[layer].head_dim_k);
	size_t v_row = kv_row_bytes(kv, kv->shapes[layer].head_dim_v);
	size_t bt = kv->block_tokens;
	return (struct vec_kv_span){
		.base = kv_layer_base(kv, layer),
		.pages = kv_seq_pages(kv, seq, layer),
		.page_bytes = kv_layer_page_bytes(kv, layer),
		.page_rows = bt,
		.k_off = kv->layer_k_off[layer] + h0 * bt * k_row,
		.v_off = kv->layer_v_off[layer] + h0 * bt * v_row,
		.k_stride = k_row,
		.v_stride = v_row,
		.n_heads = h1 - h0,
		.k_head_bytes = bt * k_row,
		.v_head_bytes = bt * v_row,
		.first = first,
		.n = n,
		.type = type,
	};
}

#endif
