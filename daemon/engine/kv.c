/* Paged KV cache: block accounting, the prefix hash, and the sequences' block tables.
 * A full block is identified by (keyed chain hash, its token ids, its parent block), so a
 * hash collision or a client crafting token ids cannot make one prompt read another's KV.
 * Released shared blocks stay findable (LRU, leaves first) until their memory is needed. */
#include "daemon/engine/kv.h"
#include "protocol/assert.h"
#include "protocol/clock.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define KV_MAX_BLOCK_TOKENS 4096u
#define KV_MAX_SEQS 65536u
#define KV_MAX_CONTEXT (1u << 24)
#define HASH_EMPTY UINT32_MAX

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

/* The per-cache key enters every step, so chains are not predictable from outside. */
static uint64_t chain_hash(uint64_t key, uint64_t parent, const int32_t *tokens, uint32_t n)
{
	uint64_t h = mix64(parent ^ key);
	for (uint32_t i = 0; i < n; i++)
		h = mix64(h + key + (uint32_t)tokens[i]);
	return h;
}

static uint64_t root_hash(const struct kv_cache *kv)
{
	return mix64(kv->hash_key ^ 0x6a09e667f3bcc909ull);
}

/* A domain's chains start from their own root, so no block hash of one domain can equal
 * one of another's. */
static uint64_t seq_root_hash(const struct kv_cache *kv, const struct kv_seq *seq)
{
	return seq->share ? mix64(root_hash(kv) ^ mix64(seq->share ^ 0xbb67ae8584caa73bull)) : root_hash(kv);
}

void kv_seq_set_share(struct kv_seq *seq, uint64_t share)
{
	seq->share = share;
}

static bool elem_bytes_of(enum qtype t, size_t *out)
{
	switch (t) {
	case QTYPE_F32: *out = 4; return true;
	case QTYPE_F16: *out = 2; return true;
	case QTYPE_BF16: *out = 2; return true;
	case QTYPE_KV_Q8: *out = 1; return true;   /* plus the row's scale: kv_row_bytes */
	default: return false;
	}
}

static bool chunk_bytes(uint32_t block_tokens, uint32_t n_head, uint32_t dim, size_t elem,
			size_t extra, size_t *out)
{
	size_t v, row;
	if (__builtin_mul_overflow((size_t)dim, elem, &row) || __builtin_add_overflow(row, extra, &row) ||
	    __builtin_mul_overflow((size_t)block_tokens, (size_t)n_head, &v) ||
	    __builtin_mul_overflow(v, row, &v) ||
	    __builtin_add_overflow(v, (size_t)KV_CHUNK_ALIGN - 1, &v))
		return false;
	*out = v & ~((size_t)KV_CHUNK_ALIGN - 1);
	return true;
}

static struct kv_layer_shape layer_shape(const struct kv_config *cfg, uint32_t l)
{
	if (cfg->layer_shapes)
		return cfg->layer_shapes[l];
	return (struct kv_layer_shape){ cfg->n_head_kv, cfg->head_dim, cfg->head_dim, 0 };
}

/* Lays out the chunks of one kind of layer (sliding or not) in a page: their offsets
 * (k_off/v_off may be NULL) and the page's size. false on overflow. */
static bool page_layout(const struct kv_config *cfg, uint32_t bt, size_t elem, size_t extra,
			bool sliding, size_t *k_off, size_t *v_off, size_t *bytes)
{
	size_t off = 0;
	for (uint32_t l = 0; l < cfg->n_layer; l++) {
		struct kv_layer_shape s = layer_shape(cfg, l);
		if ((s.window != 0) != sliding)
			continue;
		size_t k, v;
		if (!chunk_bytes(bt, s.n_head_kv, s.head_dim_k, elem, extra, &k) ||
		    !chunk_bytes(bt, s.n_head_kv, s.head_dim_v, elem, extra, &v))
			return false;
		if (k_off) {
			k_off[l] = off;
			v_off[l] = off + k;
		}
		if (__builtin_add_overflow(off, k, &off) || __builtin_add_overflow(off, v, &off))
			return false;
	}
	*bytes = off;
	return true;
}

int kv_plan(const struct kv_config *cfg, struct kv_geometry *geo, struct hearth_error *err)
{
	memset(geo, 0, sizeof *geo);
	size_t budget = cfg->budget_bytes ? cfg->budget_bytes : KV_DEFAULT_BUDGET;
	uint32_t bt = cfg->block_tokens ? cfg->block_tokens : KV_DEFAULT_BLOCK_TOKENS;
	if (!elem_bytes_of(cfg->elem_type, &geo->elem_bytes))
		return hearth_error_set(err, HEARTH_EINVAL,
					"kv element type %s: expected F16, BF16, F32 or KV_Q8",
					qtype_name(cfg->elem_type));
	geo->row_extra_bytes = cfg->elem_type == QTYPE_KV_Q8 ? KV_Q8_SCALE_BYTES : 0;
	if (bt > KV_MAX_BLOCK_TOKENS)
		return hearth_error_set(err, HEARTH_EINVAL, "kv block_tokens %u: at most %u", bt,
					KV_MAX_BLOCK_TOKENS);
	if (cfg->n_layer == 0)
		return hearth_error_set(err, HEARTH_EINVAL, "kv n_layer is 0");
	if (cfg->max_seqs == 0 || cfg->max_seqs > KV_MAX_SEQS)
		return hearth_error_set(err, HEARTH_EINVAL, "kv max_seqs %u: expected 1..%u",
					cfg->max_seqs, KV_MAX_SEQS);
	if (cfg->max_context == 0 || cfg->max_context > KV_MAX_CONTEXT)
		return hearth_error_set(err, HEARTH_EINVAL, "kv max_context %u: expected 1..%u",
					cfg->max_context, KV_MAX_CONTEXT);
	uint32_t window = 0;
	for (uint32_t l = 0; l < cfg->n_layer; l++) {
		struct kv_layer_shape s = layer_shape(cfg, l);
		if (s.n_head_kv == 0 || s.head_dim_k == 0 || s.head_dim_v == 0)
			return hearth_error_set(err, HEARTH_EINVAL,
						"kv layer %u: n_head_kv %u, head_dim k %u v %u must be > 0",
						l, s.n_head_kv, s.head_dim_k, s.head_dim_v);
		if (s.window && window && s.window != window)
			return hearth_error_set(err, HEARTH_EINVAL,
						"kv layer %u: window %u, another layer's is %u: the rings "
						"are sized for one window", l, s.window, window);
		if (s.window) {
			window = s.window;
			geo->n_sliding++;
		}
	}
	size_t block, page;
	if (!page_layout(cfg, bt, geo->elem_bytes, geo->row_extra_bytes, false, NULL, NULL, &block) ||
	    !page_layout(cfg, bt, geo->elem_bytes, geo->row_extra_bytes, true, NULL, NULL, &page))
		return hearth_error_set(err, HEARTH_ERANGE, "kv block size overflows");
	/* A model whose every layer slides still counts its positions in (empty) blocks: one
	 * cache line each keeps the reservation arithmetic one code path. */
	geo->block_bytes = block ? block : KV_CHUNK_ALIGN;
	geo->max_blocks_per_seq = (uint32_t)((cfg->max_context + (uint64_t)bt - 1) / bt);
	if (window) {
		uint64_t step = cfg->step_tokens ? cfg->step_tokens : cfg->max_context;
		uint64_t pages = (window + step - 1 + bt - 1) / bt + 1;
		geo->ring_page_bytes = page;
		geo->ring_pages = pages < geo->max_blocks_per_seq ? (uint32_t)pages : geo->max_blocks_per_seq;
		if (__builtin_mul_overflow((size_t)cfg->max_seqs * geo->ring_pages, page, &geo->ring_bytes))
			return hearth_error_set(err, HEARTH_ERANGE, "kv rings overflow");
	}
	/* The rings come out of the budget first (every slot owns its window whatever it
	 * holds), unless the caller put them beside it. */
	size_t rings_paid = cfg->rings_outside_budget ? 0 : geo->ring_bytes;
	size_t n_blocks = budget > rings_paid ? (budget - rings_paid) / geo->block_bytes : 0;
	if (n_blocks == 0 && rings_paid)
		return hearth_error_set(err, HEARTH_EINVAL,
					"kv_budget of %zu bytes holds no block after the sliding layers' "
					"rings: %u sequences x %u positions (window %u + a step of %llu) of "
					"%u layers take %zu bytes, one block of %u tokens of the %u global "
					"layers %zu more: kv_budget must be at least %zu bytes",
					budget, cfg->max_seqs, geo->ring_pages * bt, window,
					(unsigned long long)(cfg->step_tokens ? cfg->step_tokens : cfg->max_context),
					geo->n_sliding, geo->ring_bytes, bt, cfg->n_layer - geo->n_sliding,
					geo->block_bytes, geo->ring_bytes + geo->block_bytes);
	if (n_blocks == 0)
		return hearth_error_set(err, HEARTH_EINVAL,
					"kv_budget of %zu bytes holds no block: one block of %u tokens is "
					"%zu bytes (%u layers, K+V, %s elements)",
					budget, bt, geo->block_bytes, cfg->n_layer, qtype_name(cfg->elem_type));
	if (n_blocks > UINT32_MAX - 1)
		n_blocks = UINT32_MAX - 1;
	geo->n_blocks = (uint32_t)n_blocks;
	geo->pool_bytes = n_blocks * geo->block_bytes;
	return 0;
}

/* ---- LRU of cached blocks (ref 0, still hashed) ---- */

static void lru_remove(struct kv_cache *kv, uint32_t b)
{
	uint32_t p = kv->lru_prev[b], n = kv->lru_next[b];
	if (p != KV_NO_BLOCK)
		kv->lru_next[p] = n;
	else
		kv->lru_head = n;
	if (n != KV_NO_BLOCK)
		kv->lru_prev[n] = p;
	else
		kv->lru_tail = p;
	kv->lru_prev[b] = kv->lru_next[b] = KV_NO_BLOCK;
	hearth_assert(kv->n_cached > 0);
	kv->n_cached--;
}

static void lru_append(struct kv_cache *kv, uint32_t b)
{
	kv->lru_prev[b] = kv->lru_tail;
	kv->lru_next[b] = KV_NO_BLOCK;
	if (kv->lru_tail != KV_NO_BLOCK)
		kv->lru_next[kv->lru_tail] = b;
	else
		kv->lru_head = b;
	kv->lru_tail = b;
	kv->n_cached++;
}

/* ---- the prefix hash table: linear probing over block ids ---- */

static void table_insert(struct kv_cache *kv, uint32_t b)
{
	uint32_t i = (uint32_t)kv->hash[b] & kv->table_mask;
	while (kv->table[i] != HASH_EMPTY)
		i = (i + 1) & kv->table_mask;
	kv->table[i] = b;
}

/* Backward-shift deletion keeps probe runs unbroken without tombstones. */
static void table_remove(struct kv_cache *kv, uint32_t b)
{
	uint32_t mask = kv->table_mask;
	uint32_t i = (uint32_t)kv->hash[b] & mask;
	while (kv->table[i] != b) {
		if (kv->table[i] == HASH_EMPTY)
			return;
		i = (i + 1) & mask;
	}
	uint32_t j = i;
	for (;;) {
		kv->table[i] = HASH_EMPTY;
		for (;;) {
			j = (j + 1) & mask;
			if (kv->table[j] == HASH_EMPTY)
				return;
			uint32_t home = (uint32_t)kv->hash[kv->table[j]] & mask;
			/* entry at j may move to i only if its home is not in (i, j] cyclically */
			bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
			if (!stays)
				break;
		}
		kv->table[i] = kv->table[j];
		i = j;
	}
}

static uint32_t table_find(const struct kv_cache *kv, uint64_t h, const int32_t *tokens,
			   uint32_t parent)
{
	size_t tb = (size_t)kv->block_tokens * sizeof(int32_t);
	for (uint32_t i = (uint32_t)h & kv->table_mask; kv->table[i] != HASH_EMPTY;
	     i = (i + 1) & kv->table_mask) {
		uint32_t b = kv->table[i];
		if (kv->hash[b] == h && kv->parent[b] == parent &&
		    memcmp(kv->tokens + (size_t)b * kv->block_tokens, tokens, tb) == 0)
			return b;
	}
	return KV_NO_BLOCK;
}

/* ---- block ownership ---- */

static uint32_t block_take(struct kv_cache *kv)
{
	uint32_t b;
	if (kv->n_free) {
		b = kv->free_stack[--kv->n_free];
	} else {
		b = kv->lru_head; /* the caller checked that free + cached suffices */
		hearth_assert(b != KV_NO_BLOCK);
		lru_remove(kv, b);
		table_remove(kv, b);
		kv->hashed[b] = 0;
	}
	hearth_assert(kv->ref[b] == 0);
	kv->ref[b] = 1;
	return b;
}

static void block_attach(struct kv_cache *kv, uint32_t b)
{
	if (kv->ref[b] == 0)
		lru_remove(kv, b);
	kv->ref[b]++;
}

static void block_release(struct kv_cache *kv, uint32_t b)
{
	hearth_assert(b < kv->geo.n_blocks && kv->ref[b] > 0);
	if (--kv->ref[b] != 0)
		return;
	if (kv->hashed[b]) {
		lru_append(kv, b);
	} else {
		hearth_assert(kv->n_free < kv->geo.n_blocks);
		kv->free_stack[kv->n_free++] = b;
	}
}

/* ---- lifecycle ---- */

static void *alloc_array(size_t n, size_t size, bool *ok)
{
	void *p = calloc(n ? n : 1, size);
	if (!p)
		*ok = false;
	return p;
}

int kv_create(struct kv_cache *kv, const struct kv_config *cfg, struct arena *arena,
	      struct hearth_error *err)
{
	memset(kv, 0, sizeof *kv);
	int rc = kv_plan(cfg, &kv->geo, err);
	if (rc)
		return rc;
	kv->block_tokens = cfg->block_tokens ? cfg->block_tokens : KV_DEFAULT_BLOCK_TOKENS;
	kv->n_layer = cfg->n_layer;
	kv->max_seqs = cfg->max_seqs;
	kv->max_context = cfg->max_context;
	kv->elem_type = cfg->elem_type;
	kv->budget_bytes = cfg->budget_bytes ? cfg->budget_bytes : KV_DEFAULT_BUDGET;

	const char *region = cfg->region ? cfg->region : ARENA_REGION_KV;
	char sliding[ARENA_NAME_MAX];
	if ((size_t)snprintf(sliding, sizeof sliding, "%s.sliding", region) >= sizeof sliding)
		return hearth_error_set(err, HEARTH_EINVAL, "kv: region name '%s' is too long", region);
	struct arena_region *r = arena_region_find(arena, region);
	if (!r)
		return hearth_error_set(err, HEARTH_ENOTFOUND,
					"kv: the arena plan has no '%s' region (plan it with kv_plan's "
					"pool_bytes = %zu)", region, kv->geo.pool_bytes);
	void *pool;
	if ((rc = arena_alloc(arena, region, kv->geo.pool_bytes, 4096, &pool, err)))
		return rc;
	if ((rc = arena_prefault(arena, pool, kv->geo.pool_bytes, err))) {
		hearth_error_prefix(err, "kv pool");
		return rc;
	}
	kv->pool = pool;
	if (kv->geo.ring_bytes) {
		if ((rc = arena_alloc(arena, sliding, kv->geo.ring_bytes, 4096, &pool, err)))
			return rc;
		if ((rc = arena_prefault(arena, pool, kv->geo.ring_bytes, err))) {
			hearth_error_prefix(err, "kv rings");
			return rc;
		}
		kv->ring_pool = pool;
	}

	uint32_t nb = kv->geo.n_blocks;
	uint32_t mb = kv->geo.max_blocks_per_seq;
	size_t seq_slots = (size_t)cfg->max_seqs * mb; /* <= 2^16 * 2^24: no overflow */
	size_t cap = 16;
	while (cap < (size_t)nb * 2)
		cap *= 2;
	bool ok = true;
	kv->layer_k_off = alloc_array(cfg->n_layer, sizeof *kv->layer_k_off, &ok);
	kv->layer_v_off = alloc_array(cfg->n_layer, sizeof *kv->layer_v_off, &ok);
	kv->shapes = alloc_array(cfg->n_layer, sizeof *kv->shapes, &ok);
	kv->ref = alloc_array(nb, sizeof *kv->ref, &ok);
	kv->hashed = alloc_array(nb, sizeof *kv->hashed, &ok);
	kv->hash = alloc_array(nb, sizeof *kv->hash, &ok);
	kv->parent = alloc_array(nb, sizeof *kv->parent, &ok);
	kv->tokens = alloc_array((size_t)nb * kv->block_tokens, sizeof *kv->tokens, &ok);
	kv->free_stack = alloc_array(nb, sizeof *kv->free_stack, &ok);
	kv->lru_prev = alloc_array(nb, sizeof *kv->lru_prev, &ok);
	kv->lru_next = alloc_array(nb, sizeof *kv->lru_next, &ok);
	kv->table = alloc_array(cap, sizeof *kv->table, &ok);
	kv->seqs = alloc_array(cfg->max_seqs, sizeof *kv->seqs, &ok);
	kv->seq_free = alloc_array(cfg->max_seqs, sizeof *kv->seq_free, &ok);
	kv->seq_block_store = alloc_array(seq_slots, sizeof *kv->seq_block_store, &ok);
	kv->seq_hash_store = alloc_array(seq_slots, sizeof *kv->seq_hash_store, &ok);
	if (kv->geo.ring_bytes)
		kv->ring_table = alloc_array(seq_slots, sizeof *kv->ring_table, &ok);
	if (!ok) {
		kv_destroy(kv);
		return hearth_error_set(err, HEARTH_ENOMEM,
					"kv: cannot allocate bookkeeping for %u blocks and %u sequences",
					nb, cfg->max_seqs);
	}

	size_t bytes;
	for (uint32_t l = 0; l < cfg->n_layer; l++)
		kv->shapes[l] = layer_shape(cfg, l);
	/* kv_plan checked both layouts for overflow */
	page_layout(cfg, kv->block_tokens, kv->geo.elem_bytes, kv->geo.row_extra_bytes, false,
		    kv->layer_k_off, kv->layer_v_off, &bytes);
	page_layout(cfg, kv->block_tokens, kv->geo.elem_bytes, kv->geo.row_extra_bytes, true,
		    kv->layer_k_off, kv->layer_v_off, &bytes);
	for (size_t s = 0; kv->ring_table && s < cfg->max_seqs; s++)
		for (uint32_t i = 0; i < mb; i++)
			kv->ring_table[s * mb + i] = (uint32_t)(s * kv->geo.ring_pages + i % kv->geo.ring_pages);
	/* Blocks are handed out lowest id first: the stack holds them in reverse. */
	for (uint32_t b = 0; b < nb; b++) {
		kv->free_stack[b] = nb - 1 - b;
		kv->lru_prev[b] = kv->lru_next[b] = KV_NO_BLOCK;
		kv->parent[b] = KV_NO_BLOCK;
	}
	kv->n_free = nb;
	kv->lru_head = kv->lru_tail = KV_NO_BLOCK;
	for (size_t i = 0; i < cap; i++)
		kv->table[i] = HASH_EMPTY;
	kv->table_mask = (uint32_t)(cap - 1);
	for (uint32_t s = 0; s < cfg->max_seqs; s++) {
		kv->seqs[s].id = s;
		kv->seqs[s].blocks = kv->seq_block_store + (size_t)s * mb;
		kv->seqs[s].hashes = kv->seq_hash_store + (size_t)s * mb;
		kv->seq_free[s] = cfg->max_seqs - 1 - s;
	}
	kv->n_seq_free = cfg->max_seqs;

	if (getrandom(&kv->hash_key, sizeof kv->hash_key, GRND_NONBLOCK) != sizeof kv->hash_key)
		kv->hash_key = mix64(hearth_now_ns() ^ (uint64_t)(uintptr_t)kv);
	return 0;
}

void kv_destroy(struct kv_cache *kv)
{
	/* The pool belongs to the arena and goes with it. */
	free(kv->layer_k_off);
	free(kv->layer_v_off);
	free(kv->shapes);
	free(kv->ref);
	free(kv->hashed);
	free(kv->hash);
	free(kv->parent);
	free(kv->tokens);
	free(kv->free_stack);
	free(kv->lru_prev);
	free(kv->lru_next);
	free(kv->table);
	free(kv->seqs);
	free(kv->seq_free);
	free(kv->seq_block_store);
	free(kv->seq_hash_store);
	free(kv->ring_table);
	memset(kv, 0, sizeof *kv);
}

/* ---- sequences ---- */

int kv_seq_new(struct kv_cache *kv, struct kv_seq **out, struct hearth_error *err)
{
	if (kv->n_seq_free == 0)
		return hearth_error_set(err, HEARTH_EBUSY,
					"kv: all %u sequence slots are in use (max_seqs)", kv->max_seqs);
	struct kv_seq *seq = &kv->seqs[kv->seq_free[--kv->n_seq_free]];
	seq->live = true;
	seq->n_tokens = seq->n_blocks = seq->n_committed = 0;
	seq->share = 0;
	*out = seq;
	return 0;
}

int kv_seq_reserve(struct kv_cache *kv, struct kv_seq *seq, uint32_t n_tokens,
		   struct hearth_error *err)
{
	if (n_tokens > kv->max_context)
		return hearth_error_set(err, HEARTH_ERANGE,
					"kv: sequence of %u tokens exceeds max_context %u", n_tokens,
					kv->max_context);
	if (n_tokens <= seq->n_tokens)
		return 0;
	uint32_t want = (uint32_t)(((uint64_t)n_tokens + kv->block_tokens - 1) / kv->block_tokens);
	if (want > seq->n_blocks) {
		uint32_t need = want - seq->n_blocks;
		uint32_t avail = kv->n_free + kv->n_cached;
		if (need > avail)
			return hearth_error_set(err, HEARTH_EKVFULL,
						"kv budget full: %u tokens need %u more blocks of %u tokens "
						"(%zu bytes each), %u of %u blocks free (kv_budget %zu bytes); "
						"retry when other sequences finish, or raise kv_budget",
						n_tokens, need, kv->block_tokens, kv->geo.block_bytes, avail,
						kv->geo.n_blocks, kv->budget_bytes);
		for (uint32_t i = seq->n_blocks; i < want; i++)
			seq->blocks[i] = block_take(kv);
		seq->n_blocks = want;
	}
	seq->n_tokens = n_tokens;
	return 0;
}

int kv_seq_match_prefix(struct kv_cache *kv, struct kv_seq *seq, const int32_t *tokens,
			uint32_t n, struct hearth_error *err)
{
	if (seq->n_blocks != 0)
		return hearth_error_set(err, HEARTH_EINVAL,
					"kv: prefix match on sequence %u that already holds %u blocks",
					seq->id, seq->n_blocks);
	kv->prefix_queries++;
	kv->prefix_query_tokens += n;
	if (n == 0 || kv->geo.n_sliding)
		return 0;
	uint32_t bt = kv->block_tokens;
	uint32_t max_full = (n - 1) / bt;
	if (max_full > kv->geo.max_blocks_per_seq)
		max_full = kv->geo.max_blocks_per_seq;
	uint64_t h = seq_root_hash(kv, seq);
	uint32_t parent = KV_NO_BLOCK;
	uint32_t i = 0;
	for (; i < max_full; i++) {
		const int32_t *t = tokens + (size_t)i * bt;
		h = chain_hash(kv->hash_key, h, t, bt);
		uint32_t b = table_find(kv, h, t, parent);
		if (b == KV_NO_BLOCK)
			break;
		block_attach(kv, b);
		seq->blocks[i] = b;
		seq->hashes[i] = h;
		parent = b;
	}
	seq->n_blocks = seq->n_committed = i;
	seq->n_tokens = i * bt;
	kv->prefix_hit_tokens += (uint64_t)i * bt;
	return (int)(i * bt);
}

int kv_seq_commit_block(struct kv_cache *kv, struct kv_seq *seq, uint32_t i,
			const int32_t *tokens, struct hearth_error *err)
{
	uint32_t bt = kv->block_tokens;
	if (i != seq->n_committed)
		return hearth_error_set(err, HEARTH_EINVAL,
					"kv: commit of block %u of sequence %u out of order (next is %u)",
					i, seq->id, seq->n_committed);
	if (i >= seq->n_blocks || (uint64_t)(i + 1) * bt > seq->n_tokens)
		return hearth_error_set(err, HEARTH_EINVAL,
					"kv: block %u of sequence %u is not full (%u tokens reserved)", i,
					seq->id, seq->n_tokens);
	uint64_t h = chain_hash(kv->hash_key, i ? seq->hashes[i - 1] : seq_root_hash(kv, seq), tokens, bt);
	uint32_t parent = i ? seq->blocks[i - 1] : KV_NO_BLOCK;
	uint32_t own = seq->blocks[i];
	uint32_t found = table_find(kv, h, tokens, parent);
	if (found != KV_NO_BLOCK && found != own) {
		/* Same prefix computed twice (two sequences prefilled it at once): keep one. */
		block_attach(kv, found);
		seq->blocks[i] = found;
		block_release(kv, own);
	} else if (found == KV_NO_BLOCK) {
		kv->hashed[own] = 1;
		kv->hash[own] = h;
		kv->parent[own] = parent;
		memcpy(kv->tokens + (size_t)own * bt, tokens, (size_t)bt * sizeof *tokens);
		table_insert(kv, own);
	}
	seq->hashes[i] = h;
	seq->n_committed = i + 1;
	return 0;
}

int kv_seq_commit_filled(struct kv_cache *kv, struct kv_seq *seq, const int32_t *tokens,
			 uint32_t n_filled, struct hearth_error *err)
{
	uint32_t bt = kv->block_tokens;
	if (n_filled > seq->n_tokens)
		return hearth_error_set(err, HEARTH_EINVAL,
					"kv: %u positions of sequence %u filled; %u are reserved",
					n_filled, seq->id, seq->n_tokens);
	while (!kv->geo.n_sliding &&(uint64_t)(seq->n_committed + 1) * bt <= n_filled) {
		uint32_t i = seq->n_committed;
		int rc = kv_seq_commit_block(kv, seq, i, tokens + (size_t)i * bt, err);
		if (rc < 0)
			return rc;
	}
	return 0;
}

void kv_seq_free(struct kv_cache *kv, struct kv_seq *seq)
{
	if (!seq->live)
		return;
	/* Last block first, so the LRU evicts leaves before the prefixes they hang from. */
	for (uint32_t i = seq->n_blocks; i-- > 0;)
		block_release(kv, seq->blocks[i]);
	seq->live = false;
	seq->n_tokens = seq->n_blocks = seq->n_committed = 0;
	hearth_assert(kv->n_seq_free < kv->max_seqs);
	kv->seq_free[kv->n_seq_free++] = seq->id;
}

uint32_t kv_block_refcount(const struct kv_cache *kv, uint32_t block)
{
	return block < kv->geo.n_blocks ? kv->ref[block] : 0;
}

void kv_stats(const struct kv_cache *kv, struct kv_stats *st)
{
	memset(st, 0, sizeof *st);
	st->budget_bytes = kv->budget_bytes;
	st->pool_bytes = kv->geo.pool_bytes;
	st->block_bytes = kv->geo.block_bytes;
	st->block_tokens = kv->block_tokens;
	st->blocks_total = kv->geo.n_blocks;
	st->blocks_free = kv->n_free + kv->n_cached;
	st->blocks_cached = kv->n_cached;
	st->blocks_used = st->blocks_total - st->blocks_free;
	for (uint32_t b = 0; b < kv->geo.n_blocks; b++)
		if (kv->ref[b] > 1)
			st->blocks_shared++;
	st->seqs_live = kv->max_seqs - kv->n_seq_free;
	st->max_seqs = kv->max_seqs;
	st->max_context = kv->max_context;
	st->tokens_capacity = (uint64_t)st->blocks_total * kv->block_tokens;
	st->tokens_free = (uint64_t)st->blocks_free * kv->block_tokens;
	st->seqs_at_max_context =
		kv->geo.max_blocks_per_seq ? st->blocks_total / kv->geo.max_blocks_per_seq : 0;
	st->prefix_queries = kv->prefix_queries;
	st->prefix_query_tokens = kv->prefix_query_tokens;
	st->prefix_hit_tokens = kv->prefix_hit_tokens;
	st->layers_sliding = kv->geo.n_sliding;
	st->layers_global = kv->n_layer - kv->geo.n_sliding;
	st->ring_bytes = kv->geo.ring_bytes;
	st->ring_bytes_per_seq = (size_t)kv->geo.ring_pages * kv->geo.ring_page_bytes;
	st->ring_tokens = kv->geo.ring_pages * kv->block_tokens;
}
