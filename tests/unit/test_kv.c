/* KV cache: block geometry against hand-computed sizes, block accounting and exhaustion,
 * prefix sharing (refcounts, data kept when one sharer leaves), and a randomized run that
 * checks every shared block really holds the prefix the sequence asked for. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/engine/arena.h"
#include "daemon/engine/kv.h"

/* 2 layers, 2 kv heads, head_dim 8, f16, 4 tokens per block:
 * a K chunk is 4 * 2 * 8 * 2 = 128 bytes, a block 2 layers * (K + V) = 512 bytes. */
#define BT 4
#define BLOCK_BYTES 512
#define N_BLOCKS 16

struct fixture {
	struct arena arena;
	struct kv_cache kv;
};

static struct kv_config small_config(void)
{
	struct kv_config c;
	memset(&c, 0, sizeof c);
	c.budget_bytes = N_BLOCKS * BLOCK_BYTES + 100; /* the 100 bytes hold no block */
	c.block_tokens = BT;
	c.elem_type = QTYPE_F16;
	c.n_layer = 2;
	c.n_head_kv = 2;
	c.head_dim = 8;
	c.max_seqs = 4;
	c.max_context = 64;
	return c;
}

static int fixture_make(struct fixture *f, const struct kv_config *cfg)
{
	struct hearth_error err;
	struct kv_geometry geo;
	if (kv_plan(cfg, &geo, &err))
		return -1;
	struct arena_plan plan;
	arena_plan_init(&plan);
	if (arena_plan_add(&plan, ARENA_REGION_KV, geo.pool_bytes, 4096, &err) ||
	    (geo.ring_bytes && arena_plan_add(&plan, ARENA_REGION_KV_SLIDING, geo.ring_bytes, 4096, &err)))
		return -1;
	struct arena_config ac = ARENA_CONFIG_DEFAULT;
	ac.pages = ARENA_PAGES_NONE;
	if (arena_create(&f->arena, &plan, &ac, &err))
		return -1;
	if (kv_create(&f->kv, cfg, &f->arena, &err)) {
		print_message("kv_create: %s\n", err.msg);
		arena_destroy(&f->arena);
		return -1;
	}
	return 0;
}

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof *f);
	struct kv_config cfg = small_config();
	if (!f || fixture_make(f, &cfg)) {
		free(f);
		return -1;
	}
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	kv_destroy(&f->kv);
	arena_destroy(&f->arena);
	free(f);
	return 0;
}

static void test_kv_plan_computes_block_geometry(void **state)
{
	(void)state;
	struct kv_config c = small_config();
	struct kv_geometry g;
	struct hearth_error err;
	assert_int_equal(kv_plan(&c, &g, &err), 0);
	assert_int_equal(g.elem_bytes, 2);
	assert_int_equal(g.block_bytes, BLOCK_BYTES);
	assert_int_equal(g.n_blocks, N_BLOCKS);
	assert_int_equal(g.pool_bytes, N_BLOCKS * BLOCK_BYTES);
	assert_int_equal(g.max_blocks_per_seq, 16); /* 64 / 4 */

	/* per-layer shapes, f32, 3 tokens: layer 0 K 3*1*5*4 = 60 -> 64, V 3*1*7*4 = 84 -> 128;
	 * layer 1 K 3*2*5*4 = 120 -> 128, V 3*2*5*4 -> 128: block 448 bytes */
	struct kv_layer_shape shapes[2] = { { 1, 5, 7, 0 }, { 2, 5, 5, 0 } };
	c.elem_type = QTYPE_F32;
	c.block_tokens = 3;
	c.layer_shapes = shapes;
	c.budget_bytes = 448 * 10 + 447;
	c.max_context = 10;
	assert_int_equal(kv_plan(&c, &g, &err), 0);
	assert_int_equal(g.block_bytes, 448);
	assert_int_equal(g.n_blocks, 10);
	assert_int_equal(g.max_blocks_per_seq, 4); /* ceil(10 / 3) */

	c = small_config();
	c.budget_bytes = 0;
	c.block_tokens = 0;
	assert_int_equal(kv_plan(&c, &g, &err), 0);
	/* defaults: 16 tokens per block (4x the 512 bytes), 256 MiB */
	assert_int_equal(g.block_bytes, 4 * BLOCK_BYTES);
	assert_int_equal(g.n_blocks, (256u << 20) / (4 * BLOCK_BYTES));
}

/* int8 rows: head_dim codes + a 4-byte scale, in the plan's sizes and in the position
 * helpers; every (layer, K|V, head, position) row of a q8 cache is filled with its own
 * stamp, and all read back intact (no row overlaps another or its neighbour's scale). */
static void test_kv_q8_rows_are_codes_plus_scale(void **state)
{
	(void)state;
	struct kv_config c = small_config();
	struct kv_geometry g;
	struct hearth_error err;
	c.elem_type = QTYPE_KV_Q8;
	/* K chunk 4 tokens * 2 heads * (8 + 4) = 96 -> 128; V the same; 2 layers: 512 */
	assert_int_equal(kv_plan(&c, &g, &err), 0);
	assert_int_equal(g.elem_bytes, 1);
	assert_int_equal(g.row_extra_bytes, 4);
	assert_int_equal(g.block_bytes, 512);

	/* per-layer shapes, 3 tokens: layer 0 K 3*1*(16+4) = 60 -> 64, V 3*1*(32+4) = 108 -> 128;
	 * layer 1 K and V 3*2*(16+4) = 120 -> 128: block 448; f16 would take 128+256+256+256 */
	struct kv_layer_shape shapes[2] = { { 1, 16, 32, 0 }, { 2, 16, 16, 0 } };
	c.block_tokens = 3;
	c.layer_shapes = shapes;
	c.budget_bytes = 448 * 10 + 447;
	c.max_context = 10;
	assert_int_equal(kv_plan(&c, &g, &err), 0);
	assert_int_equal(g.block_bytes, 448);
	assert_int_equal(g.n_blocks, 10);
	assert_int_equal(g.pool_bytes, 4480);

	struct fixture *f = calloc(1, sizeof *f);
	assert_non_null(f);
	c.layer_shapes = NULL;
	c.n_head_kv = 3;
	c.head_dim = 32;
	c.block_tokens = BT;
	c.max_context = 3 * BT;
	c.budget_bytes = 0;
	assert_int_equal(fixture_make(f, &c), 0);
	struct kv_cache *kv = &f->kv;
	size_t row = 32 + 4;
	assert_int_equal(kv_row_bytes(kv, 32), row);
	struct kv_seq *seq;
	assert_int_equal(kv_seq_new(kv, &seq, &err), 0);
	assert_int_equal(kv_seq_reserve(kv, seq, 3 * BT, &err), 0);
	/* head-major with the q8 row as the stride */
	assert_ptr_equal(kv_seq_k(kv, seq, 1, BT + 1, 2),
			 (uint8_t *)kv_block_k(kv, seq->blocks[1], 1) + (2 * BT + 1) * row);
	assert_ptr_equal((uint8_t *)kv_seq_v(kv, seq, 0, 2, 1) + row, kv_seq_v(kv, seq, 0, 3, 1));
	uint8_t stamp = 1;
	for (uint32_t l = 0; l < 2; l++)
		for (int v = 0; v < 2; v++)
			for (uint32_t h = 0; h < 3; h++)
				for (uint32_t p = 0; p < 3 * BT; p++, stamp++) {
					uint8_t *r = v ? kv_seq_v(kv, seq, l, p, h) : kv_seq_k(kv, seq, l, p, h);
					assert_true(r >= kv->pool && r + row <= kv->pool + kv->geo.pool_bytes);
					memset(r, stamp, row);
				}
	stamp = 1;
	for (uint32_t l = 0; l < 2; l++)
		for (int v = 0; v < 2; v++)
			for (uint32_t h = 0; h < 3; h++)
				for (uint32_t p = 0; p < 3 * BT; p++, stamp++) {
					const uint8_t *r = v ? kv_seq_v(kv, seq, l, p, h) : kv_seq_k(kv, seq, l, p, h);
					for (size_t i = 0; i < row; i++)
						assert_int_equal(r[i], stamp);
				}
	kv_seq_free(kv, seq);
	kv_destroy(kv);
	arena_destroy(&f->arena);
	free(f);
}

static void test_kv_plan_rejects_bad_config(void **state)
{
	(void)state;
	struct kv_geometry g;
	struct hearth_error err;
	struct kv_config c = small_config();
	c.budget_bytes = BLOCK_BYTES - 1;
	assert_int_equal(kv_plan(&c, &g, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "holds no block"));
	assert_non_null(strstr(err.msg, "512 bytes"));
	c = small_config();
	c.elem_type = QTYPE_Q4_0;
	assert_int_equal(kv_plan(&c, &g, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "Q4_0"));
	c = small_config();
	c.head_dim = 0;
	assert_int_equal(kv_plan(&c, &g, &err), HEARTH_EINVAL);
	c = small_config();
	c.max_seqs = 0;
	assert_int_equal(kv_plan(&c, &g, &err), HEARTH_EINVAL);
	c = small_config();
	c.head_dim = UINT32_MAX;
	c.n_head_kv = UINT32_MAX;
	c.block_tokens = 4096;
	assert_int_equal(kv_plan(&c, &g, &err), HEARTH_ERANGE);
}

static void test_kv_create_needs_the_pool_region(void **state)
{
	(void)state;
	struct arena_plan plan;
	arena_plan_init(&plan);
	struct hearth_error err;
	assert_int_equal(arena_plan_add(&plan, "scratch", 4096, 64, &err), 0);
	struct arena_config ac = ARENA_CONFIG_DEFAULT;
	ac.pages = ARENA_PAGES_NONE;
	struct arena a;
	assert_int_equal(arena_create(&a, &plan, &ac, &err), 0);
	struct kv_cache kv;
	struct kv_config c = small_config();
	assert_int_equal(kv_create(&kv, &c, &a, &err), HEARTH_ENOTFOUND);
	assert_non_null(strstr(err.msg, "kv_pool"));
	arena_destroy(&a);
}

static void test_kv_pool_is_fully_resident_after_create(void **state)
{
	struct fixture *f = *state;
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t n = (f->kv.geo.pool_bytes + page - 1) / page;
	unsigned char vec[64];
	assert_true(n <= sizeof vec);
	assert_int_equal(mincore(f->kv.pool, n * page, vec), 0);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(vec[i] & 1, 1);
}

static void test_kv_block_addresses_are_disjoint_and_inside_the_pool(void **state)
{
	struct fixture *f = *state;
	struct kv_cache *kv = &f->kv;
	/* stamp every (block, layer, K|V, slot) row with a distinct value, then read all back */
	size_t row = 2 * 8 * 2; /* n_head_kv * head_dim * f16 */
	uint32_t id = 0;
	for (uint32_t b = 0; b < N_BLOCKS; b++)
		for (uint32_t l = 0; l < 2; l++)
			for (int v = 0; v < 2; v++)
				for (uint32_t s = 0; s < BT; s++, id++) {
					uint8_t *p = (uint8_t *)(v ? kv_block_v(kv, b, l) : kv_block_k(kv, b, l)) +
						     s * row;
					assert_true(p >= kv->pool &&
						    p + row <= kv->pool + kv->geo.pool_bytes);
					memset(p, 0, row);
					memcpy(p, &id, sizeof id);
				}
	id = 0;
	for (uint32_t b = 0; b < N_BLOCKS; b++)
		for (uint32_t l = 0; l < 2; l++)
			for (int v = 0; v < 2; v++)
				for (uint32_t s = 0; s < BT; s++, id++) {
					uint8_t *p = (uint8_t *)(v ? kv_block_v(kv, b, l) : kv_block_k(kv, b, l)) +
						     s * row;
					uint32_t got;
					memcpy(&got, p, sizeof got);
					assert_int_equal(got, id);
				}
	/* the position helpers land on the same rows */
	struct kv_seq *seq;
	struct hearth_error err;
	assert_int_equal(kv_seq_new(kv, &seq, &err), 0);
	assert_int_equal(kv_seq_reserve(kv, seq, 6, &err), 0);
	/* head-major: head h's rows of a block follow each other, BT of them per head */
	size_t head_row = 8 * 2;
	assert_ptr_equal(kv_seq_k(kv, seq, 1, 5, 0),
			 (uint8_t *)kv_block_k(kv, seq->blocks[1], 1) + 1 * head_row);
	assert_ptr_equal(kv_seq_k(kv, seq, 1, 5, 1),
			 (uint8_t *)kv_block_k(kv, seq->blocks[1], 1) + (BT + 1) * head_row);
	assert_ptr_equal(kv_seq_v(kv, seq, 0, 3, 1),
			 (uint8_t *)kv_block_v(kv, seq->blocks[0], 0) + (BT + 3) * head_row);
	assert_ptr_equal((uint8_t *)kv_seq_v(kv, seq, 0, 2, 1) + head_row, kv_seq_v(kv, seq, 0, 3, 1));
	kv_seq_free(kv, seq);
}

static void test_kv_reserve_counts_blocks_and_free_returns_them(void **state)
{
	struct fixture *f = *state;
	struct kv_cache *kv = &f->kv;
	struct hearth_error err;
	struct kv_seq *a;
	assert_int_equal(kv_seq_new(kv, &a, &err), 0);
	assert_int_equal(kv_seq_reserve(kv, a, 10, &err), 0);
	assert_int_equal(a->n_blocks, 3);
	assert_int_equal(kv_seq_reserve(kv, a, 12, &err), 0);
	assert_int_equal(a->n_blocks, 3);
	assert_int_equal(kv_seq_reserve(kv, a, 5, &err), 0); /* shrinking is a no-op */
	assert_int_equal(a->n_tokens, 12);
	assert_int_equal(kv_seq_reserve(kv, a, 13, &err), 0);
	assert_int_equal(a->n_blocks, 4);
	struct kv_stats st;
	kv_stats(kv, &st);
	assert_int_equal(st.blocks_total, N_BLOCKS);
	assert_int_equal(st.blocks_used, 4);
	assert_int_equal(st.blocks_free, N_BLOCKS - 4);
	assert_int_equal(st.seqs_live, 1);
	assert_int_equal(st.tokens_capacity, N_BLOCKS * BT);
	assert_int_equal(st.seqs_at_max_context, 1); /* 16 blocks / 16 per 64-token sequence */
	for (uint32_t i = 0; i < 4; i++)
		assert_int_equal(kv_block_refcount(kv, a->blocks[i]), 1);
	kv_seq_free(kv, a);
	kv_stats(kv, &st);
	assert_int_equal(st.blocks_used, 0);
	assert_int_equal(st.blocks_free, N_BLOCKS);
	assert_int_equal(st.seqs_live, 0);
}

static void test_kv_exhaustion_is_ekvfull_and_changes_nothing(void **state)
{
	struct fixture *f = *state;
	struct kv_cache *kv = &f->kv;
	struct hearth_error err;
	struct kv_seq *a, *b;
	assert_int_equal(kv_seq_new(kv, &a, &err), 0);
	assert_int_equal(kv_seq_new(kv, &b, &err), 0);
	assert_int_equal(kv_seq_reserve(kv, a, 40, &err), 0); /* 10 blocks */
	assert_int_equal(kv_seq_reserve(kv, b, 20, &err), 0); /* 5 blocks: 1 left */
	assert_int_equal(kv_seq_reserve(kv, b, 28, &err), HEARTH_EKVFULL);
	assert_non_null(strstr(err.msg, "kv budget full"));
	assert_non_null(strstr(err.msg, "need 2 more blocks"));
	assert_non_null(strstr(err.msg, "1 of 16 blocks free"));
	assert_int_equal(b->n_blocks, 5);
	assert_int_equal(b->n_tokens, 20);
	struct kv_stats st;
	kv_stats(kv, &st);
	assert_int_equal(st.blocks_used, 15);
	assert_int_equal(kv_seq_reserve(kv, b, 24, &err), 0); /* the last block still fits */
	kv_seq_free(kv, a);
	assert_int_equal(kv_seq_reserve(kv, b, 28, &err), 0); /* freed blocks are usable at once */
	kv_seq_free(kv, b);
}

static void test_kv_limits_context_and_sequence_slots(void **state)
{
	struct fixture *f = *state;
	struct kv_cache *kv = &f->kv;
	struct hearth_error err;
	struct kv_seq *s[4], *extra;
	for (int i = 0; i < 4; i++)
		assert_int_equal(kv_seq_new(kv, &s[i], &err), 0);
	assert_int_equal(kv_seq_new(kv, &extra, &err), HEARTH_EBUSY);
	assert_non_null(strstr(err.msg, "max_seqs"));
	assert_int_equal(kv_seq_reserve(kv, s[0], 65, &err), HEARTH_ERANGE);
	assert_non_null(strstr(err.msg, "max_context 64"));
	kv_seq_free(kv, s[2]);
	kv_seq_free(kv, s[2]); /* a second free of a dead sequence is ignored */
	assert_int_equal(kv_seq_new(kv, &extra, &err), 0);
	assert_ptr_equal(extra, s[2]);
	kv_seq_free(kv, s[0]);
	kv_seq_free(kv, s[1]);
	kv_seq_free(kv, extra);
	kv_seq_free(kv, s[3]);
}

/* What position p holds depends on the whole prefix tok[0..p], as real K/V does, so a
 * block shared under the wrong prefix shows up even when its own tokens agree. */
static uint64_t prefix_print(const int32_t *tok, uint32_t p, uint32_t layer, int is_v)
{
	uint64_t h = 0x9e3779b97f4a7c15ull * (layer + 1) + (uint64_t)is_v;
	for (uint32_t i = 0; i <= p; i++) {
		h ^= (uint64_t)(uint32_t)tok[i] + 0x632be59bd9b4e019ull;
		h *= 0xff51afd7ed558ccdull;
		h ^= h >> 29;
	}
	return h;
}

static void write_positions(struct kv_cache *kv, struct kv_seq *seq, const int32_t *tok,
			    uint32_t from, uint32_t to)
{
	for (uint32_t p = from; p < to; p++)
		for (uint32_t l = 0; l < kv->n_layer; l++)
			for (int v = 0; v < 2; v++) {
				uint64_t h = prefix_print(tok, p, l, v);
				for (uint32_t hd = 0; hd < 2; hd++) {
					uint8_t *row = v ? kv_seq_v(kv, seq, l, p, hd) : kv_seq_k(kv, seq, l, p, hd);
					for (int i = 0; i < 16; i += 8)
						memcpy(row + i, &h, 8);
				}
			}
}

static bool positions_hold(struct kv_cache *kv, struct kv_seq *seq, const int32_t *tok,
			   uint32_t from, uint32_t to)
{
	for (uint32_t p = from; p < to; p++)
		for (uint32_t l = 0; l < kv->n_layer; l++)
			for (int v = 0; v < 2; v++) {
				uint64_t h = prefix_print(tok, p, l, v);
				for (uint32_t hd = 0; hd < 2; hd++) {
					const uint8_t *row = v ? kv_seq_v(kv, seq, l, p, hd) : kv_seq_k(kv, seq, l, p, hd);
					for (int i = 0; i < 16; i += 8)
						if (memcmp(row + i, &h, 8) != 0)
							return false;
				}
			}
	return true;
}

static void test_kv_prefix_sharing_stores_common_blocks_once(void **state)
{
	struct fixture *f = *state;
	struct kv_cache *kv = &f->kv;
	struct hearth_error err;
	/* 3 full blocks of a common "system prompt", then different tails */
	int32_t ta[14] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 40, 41 };
	int32_t tb[15] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 50, 51, 52 };
	struct kv_seq *a, *b;
	assert_int_equal(kv_seq_new(kv, &a, &err), 0);
	assert_int_equal(kv_seq_match_prefix(kv, a, ta, 14, &err), 0); /* cold cache */
	assert_int_equal(kv_seq_reserve(kv, a, 14, &err), 0);
	write_positions(kv, a, ta, 0, 14);
	for (uint32_t i = 0; i < 3; i++)
		assert_int_equal(kv_seq_commit_block(kv, a, i, ta + i * BT, &err), 0);

	assert_int_equal(kv_seq_new(kv, &b, &err), 0);
	assert_int_equal(kv_seq_match_prefix(kv, b, tb, 15, &err), 12);
	assert_int_equal(b->n_blocks, 3);
	assert_int_equal(b->n_tokens, 12);
	for (uint32_t i = 0; i < 3; i++) {
		assert_int_equal(b->blocks[i], a->blocks[i]);
		assert_int_equal(kv_block_refcount(kv, a->blocks[i]), 2);
	}
	assert_true(positions_hold(kv, b, tb, 0, 12)); /* b reads a's K/V */
	assert_int_equal(kv_seq_reserve(kv, b, 15, &err), 0);
	assert_true(b->blocks[3] != a->blocks[3]); /* the tails are private */
	assert_int_equal(kv_block_refcount(kv, b->blocks[3]), 1);
	write_positions(kv, b, tb, 12, 15);
	struct kv_stats st;
	kv_stats(kv, &st);
	assert_int_equal(st.blocks_used, 5);   /* 4 + 1, not 4 + 4 */
	assert_int_equal(st.blocks_shared, 3);
	assert_int_equal(st.prefix_hit_tokens, 12);

	uint32_t shared[3] = { a->blocks[0], a->blocks[1], a->blocks[2] };
	kv_seq_free(kv, a);
	for (uint32_t i = 0; i < 3; i++)
		assert_int_equal(kv_block_refcount(kv, shared[i]), 1);
	assert_true(positions_hold(kv, b, tb, 0, 15));
	kv_stats(kv, &st);
	assert_int_equal(st.blocks_used, 4);
	assert_int_equal(st.blocks_shared, 0);

	kv_seq_free(kv, b);
	kv_stats(kv, &st);
	assert_int_equal(st.blocks_used, 0);
	assert_int_equal(st.blocks_cached, 3); /* still findable for the next app */
	assert_int_equal(st.blocks_free, N_BLOCKS);
}

static void test_kv_prefix_match_leaves_a_token_to_compute(void **state)
{
	struct fixture *f = *state;
	struct kv_cache *kv = &f->kv;
	struct hearth_error err;
	int32_t t[12] = { 7, 7, 7, 7, 8, 8, 8, 8, 9, 9, 9, 9 };
	struct kv_seq *a, *b;
	assert_int_equal(kv_seq_new(kv, &a, &err), 0);
	assert_int_equal(kv_seq_reserve(kv, a, 12, &err), 0);
	for (uint32_t i = 0; i < 3; i++)
		assert_int_equal(kv_seq_commit_block(kv, a, i, t + i * BT, &err), 0);
	assert_int_equal(kv_seq_new(kv, &b, &err), 0);
	/* all 12 tokens are cached, but the last one must be run for its logits */
	assert_int_equal(kv_seq_match_prefix(kv, b, t, 12, &err), 8);
	assert_int_equal(kv_seq_match_prefix(kv, b, t, 12, &err), HEARTH_EINVAL);
	kv_seq_free(kv, b);
	assert_int_equal(kv_seq_new(kv, &b, &err), 0);
	int32_t longer[13];
	memcpy(longer, t, sizeof t);
	longer[12] = 1;
	assert_int_equal(kv_seq_match_prefix(kv, b, longer, 13, &err), 12);
	kv_seq_free(kv, b);
	assert_int_equal(kv_seq_new(kv, &b, &err), 0);
	assert_int_equal(kv_seq_match_prefix(kv, b, t, 4, &err), 0);
	assert_int_equal(kv_seq_match_prefix(kv, b, t, 0, &err), 0);
	kv_seq_free(kv, b);
	kv_seq_free(kv, a);
}

static void test_kv_prefix_match_follows_the_whole_chain(void **state)
{
	struct fixture *f = *state;
	struct kv_cache *kv = &f->kv;
	struct hearth_error err;
	int32_t t[9] = { 1, 2, 3, 4, 5, 6, 7, 8, 0 };
	int32_t other_first[9] = { 9, 2, 3, 4, 5, 6, 7, 8, 0 };  /* same 2nd block, other 1st */
	int32_t other_second[9] = { 1, 2, 3, 4, 5, 6, 7, 9, 0 }; /* same 1st, other 2nd */
	struct kv_seq *a, *b;
	assert_int_equal(kv_seq_new(kv, &a, &err), 0);
	assert_int_equal(kv_seq_reserve(kv, a, 9, &err), 0);
	assert_int_equal(kv_seq_commit_block(kv, a, 0, t, &err), 0);
	assert_int_equal(kv_seq_commit_block(kv, a, 1, t + 4, &err), 0);
	assert_int_equal(kv_seq_new(kv, &b, &err), 0);
	assert_int_equal(kv_seq_match_prefix(kv, b, other_first, 9, &err), 0);
	kv_seq_free(kv, b);
	assert_int_equal(kv_seq_new(kv, &b, &err), 0);
	assert_int_equal(kv_seq_match_prefix(kv, b, other_second, 9, &err), 4);
	assert_int_equal(b->blocks[0], a->blocks[0]);
	kv_seq_free(kv, b);
	assert_int_equal(kv_seq_new(kv, &b, &err), 0);
	assert_int_equal(kv_seq_match_prefix(kv, b, t, 9, &err), 8);
	kv_seq_free(kv, b);
	/* a second chain whose 2nd block has the same tokens: each query gets its own */
	struct kv_seq *c;
	assert_int_equal(kv_seq_new(kv, &c, &err), 0);
	assert_int_equal(kv_seq_reserve(kv, c, 9, &err), 0);
	assert_int_equal(kv_seq_commit_block(kv, c, 0, other_first, &err), 0);
	assert_int_equal(kv_seq_commit_block(kv, c, 1, other_first + 4, &err), 0);
	assert_true(c->blocks[1] != a->blocks[1]);
	for (int round = 0; round < 2; round++) {
		assert_int_equal(kv_seq_new(kv, &b, &err), 0);
		assert_int_equal(kv_seq_match_prefix(kv, b, round ? other_first : t, 9, &err), 8);
		assert_int_equal(b->blocks[1], round ? c->blocks[1] : a->blocks[1]);
		kv_seq_free(kv, b);
	}
	kv_seq_free(kv, c);
	kv_seq_free(kv, a);
}

static void test_kv_commit_checks_order_and_fullness(void **state)
{
	struct fixture *f = *state;
	struct kv_cache *kv = &f->kv;
	struct hearth_error err;
	int32_t t[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	struct kv_seq *a;
	assert_int_equal(kv_seq_new(kv, &a, &err), 0);
	assert_int_equal(kv_seq_reserve(kv, a, 7, &err), 0);
	assert_int_equal(kv_seq_commit_block(kv, a, 1, t + 4, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "out of order"));
	assert_int_equal(kv_seq_commit_block(kv, a, 0, t, &err), 0);
	assert_int_equal(kv_seq_commit_block(kv, a, 1, t + 4, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "not full"));
	kv_seq_free(kv, a);
}

static void test_kv_commit_filled_publishes_only_full_blocks(void **state)
{
	struct fixture *f = *state;
	struct kv_cache *kv = &f->kv;
	struct hearth_error err;
	int32_t t[10] = { 9, 8, 7, 6, 5, 4, 3, 2, 1, 0 };
	struct kv_seq *a, *b;
	assert_int_equal(kv_block_tokens(kv), BT);
	assert_int_equal(kv_elem_type(kv), QTYPE_F16);
	assert_int_equal(kv_seq_new(kv, &a, &err), 0);
	assert_int_equal(kv_seq_reserve(kv, a, 10, &err), 0);
	assert_int_equal(kv_seq_reserved(a), 10);
	write_positions(kv, a, t, 0, 10);
	/* 9 filled positions: blocks 0 and 1 are full, block 2 holds one token */
	assert_int_equal(kv_seq_commit_filled(kv, a, t, 9, &err), 0);
	assert_int_equal(kv_seq_committed(a), 2);
	/* again with the same count: nothing new to publish */
	assert_int_equal(kv_seq_commit_filled(kv, a, t, 9, &err), 0);
	assert_int_equal(kv_seq_committed(a), 2);
	assert_int_equal(kv_seq_commit_filled(kv, a, t, 11, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "reserved"));
	assert_int_equal(kv_seq_committed(a), 2);

	/* a later sequence with the same prompt finds both published blocks */
	assert_int_equal(kv_seq_new(kv, &b, &err), 0);
	assert_true(kv_seq_slot(a) != kv_seq_slot(b));
	assert_true(kv_seq_slot(a) < 4 && kv_seq_slot(b) < 4);
	assert_int_equal(kv_seq_match_prefix(kv, b, t, 10, &err), 2 * BT);
	assert_true(positions_hold(kv, b, t, 0, 2 * BT));
	kv_seq_free(kv, a);
	kv_seq_free(kv, b);
}

static void test_kv_commit_of_a_block_computed_twice_keeps_one(void **state)
{
	struct fixture *f = *state;
	struct kv_cache *kv = &f->kv;
	struct hearth_error err;
	int32_t t[6] = { 3, 1, 4, 1, 5, 9 };
	struct kv_seq *a, *b;
	/* both prefill the same prompt before either published it */
	assert_int_equal(kv_seq_new(kv, &a, &err), 0);
	assert_int_equal(kv_seq_new(kv, &b, &err), 0);
	assert_int_equal(kv_seq_reserve(kv, a, 6, &err), 0);
	assert_int_equal(kv_seq_reserve(kv, b, 6, &err), 0);
	write_positions(kv, a, t, 0, 6);
	write_positions(kv, b, t, 0, 6);
	struct kv_stats st;
	kv_stats(kv, &st);
	assert_int_equal(st.blocks_used, 4);
	assert_int_equal(kv_seq_commit_block(kv, a, 0, t, &err), 0);
	uint32_t b_own = b->blocks[0];
	assert_int_equal(kv_seq_commit_block(kv, b, 0, t, &err), 0);
	assert_int_equal(b->blocks[0], a->blocks[0]);
	assert_int_equal(kv_block_refcount(kv, a->blocks[0]), 2);
	assert_int_equal(kv_block_refcount(kv, b_own), 0);
	kv_stats(kv, &st);
	assert_int_equal(st.blocks_used, 3);
	assert_true(positions_hold(kv, b, t, 0, 6));
	kv_seq_free(kv, a);
	kv_seq_free(kv, b);
}

static void test_kv_cached_blocks_are_reused_last(void **state)
{
	struct fixture *f = *state;
	struct kv_cache *kv = &f->kv;
	struct hearth_error err;
	int32_t t[13] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13 };
	struct kv_seq *a, *big;
	assert_int_equal(kv_seq_new(kv, &a, &err), 0);
	assert_int_equal(kv_seq_reserve(kv, a, 12, &err), 0);
	for (uint32_t i = 0; i < 3; i++)
		assert_int_equal(kv_seq_commit_block(kv, a, i, t + i * BT, &err), 0);
	kv_seq_free(kv, a);
	/* 13 truly free blocks go first: the cached prefix survives */
	assert_int_equal(kv_seq_new(kv, &big, &err), 0);
	assert_int_equal(kv_seq_reserve(kv, big, 13 * BT, &err), 0);
	assert_int_equal(kv_seq_new(kv, &a, &err), 0);
	assert_int_equal(kv_seq_match_prefix(kv, a, t, 13, &err), 12);
	kv_seq_free(kv, a);
	/* the whole budget: the cached blocks are taken, leaves first, and forgotten */
	assert_int_equal(kv_seq_reserve(kv, big, 15 * BT, &err), 0);
	assert_int_equal(kv_seq_new(kv, &a, &err), 0);
	assert_int_equal(kv_seq_match_prefix(kv, a, t, 13, &err), 4);
	kv_seq_free(kv, a);
	assert_int_equal(kv_seq_reserve(kv, big, 16 * BT, &err), 0);
	assert_int_equal(kv_seq_new(kv, &a, &err), 0);
	assert_int_equal(kv_seq_match_prefix(kv, a, t, 13, &err), 0);
	kv_seq_free(kv, a);
	kv_seq_free(kv, big);
	struct kv_stats st;
	kv_stats(kv, &st);
	assert_int_equal(st.blocks_free, N_BLOCKS);
	assert_int_equal(st.blocks_cached, 0);
}

/* Random prompts over a 2-token alphabet (so prefixes collide a lot), random frees: every
 * attached block must hold exactly the prefix asked for, refcounts must equal the number of
 * live sequences holding a block, and used + free must equal the total. */
/* ---- sliding-window layers: a ring per sequence slot ---- */

/* The small shape with a third layer; layers 0 and 1 slide over 6 positions, layer 2 is
 * global. Steps of at most 3 positions: a ring is ceil((6 + 3 - 1) / 4) + 1 = 3 pages of
 * 4 positions. A global block is one layer's K+V (256 bytes), a ring page two (512). */
static const struct kv_layer_shape sliding_shapes[3] = { { 2, 8, 8, 6 }, { 2, 8, 8, 6 }, { 2, 8, 8, 0 } };

static struct kv_config sliding_config(void)
{
	struct kv_config c = small_config();
	c.n_layer = 3;
	c.layer_shapes = sliding_shapes;
	c.max_seqs = 2;
	c.step_tokens = 3;
	c.budget_bytes = 2 * 3 * 512 + 20 * 256;
	return c;
}

static void test_kv_sliding_layers_keep_a_ring_per_slot(void **state)
{
	(void)state;
	struct kv_config cfg = sliding_config();
	struct kv_geometry g;
	struct hearth_error err;
	assert_int_equal(kv_plan(&cfg, &g, &err), 0);
	assert_int_equal(g.n_sliding, 2);
	assert_int_equal(g.block_bytes, 256);
	assert_int_equal(g.ring_page_bytes, 512);
	assert_int_equal(g.ring_pages, 3);
	assert_int_equal(g.ring_bytes, 2 * 3 * 512);
	assert_int_equal(g.n_blocks, 20); /* the rings came out of the budget first */

	struct fixture f;
	assert_int_equal(fixture_make(&f, &cfg), 0);
	struct kv_cache *kv = &f.kv;
	struct kv_seq *a, *b;
	int32_t ta[40], tb[40];
	for (int i = 0; i < 40; i++) {
		ta[i] = i + 1;
		tb[i] = 100 + i;
	}
	assert_int_equal(kv_seq_new(kv, &a, &err), 0);
	assert_int_equal(kv_seq_new(kv, &b, &err), 0);
	assert_int_equal(kv_seq_reserve(kv, a, 40, &err), 0);
	assert_int_equal(kv_seq_reserve(kv, b, 40, &err), 0);
	struct kv_stats st;
	kv_stats(kv, &st);
	assert_int_equal(st.blocks_used, 20); /* 40 positions of the global layer each */
	assert_int_equal(st.ring_tokens, 12);
	assert_int_equal(st.layers_sliding, 2);
	assert_int_equal(st.layers_global, 1);
	const uint8_t *ring0 = kv->ring_pool, *ring_end = ring0 + g.ring_bytes;
	for (uint32_t p = 0; p + 12 < 40; p++) {
		/* a sliding layer's position p and p + 12 share a row; the global one's never */
		assert_ptr_equal(kv_seq_k(kv, a, 0, p, 1), kv_seq_k(kv, a, 0, p + 12, 1));
		assert_ptr_equal(kv_seq_v(kv, a, 1, p, 0), kv_seq_v(kv, a, 1, p + 12, 0));
		assert_ptr_not_equal(kv_seq_k(kv, a, 2, p, 1), kv_seq_k(kv, a, 2, p + 12, 1));
		const uint8_t *ka = kv_seq_k(kv, a, 0, p, 0), *kb = kv_seq_k(kv, b, 0, p, 0);
		assert_true(ka >= ring0 && ka < ring_end && kb >= ring0 && kb < ring_end);
		assert_ptr_not_equal(ka, kb);
	}
	/* Steps of 3 positions: after each, every position of the window of every query of
	 * the step still holds its own K/V, in both sequences, whatever the other wrote. */
	for (uint32_t p = 0; p < 40; p += 3) {
		uint32_t end = p + 3 < 40 ? p + 3 : 40, from = p + 1 > 6 ? p + 1 - 6 : 0;
		write_positions(kv, a, ta, p, end);
		write_positions(kv, b, tb, p, end);
		assert_true(positions_hold(kv, a, ta, from, end));
		assert_true(positions_hold(kv, b, tb, from, end));
	}
	/* the global layer keeps every position (positions_hold above reads all layers only
	 * within the window; here layer 2 alone, from 0) */
	for (uint32_t p = 0; p < 40; p++) {
		const uint8_t *row = kv_seq_k(kv, a, 2, p, 0);
		uint64_t h = prefix_print(ta, p, 2, 0);
		assert_memory_equal(row, &h, 8);
	}
	kv_seq_free(kv, a);
	kv_seq_free(kv, b);
	kv_destroy(kv);
	arena_destroy(&f.arena);
}

/* A prefix computed by one sequence cannot be taken over by another: the sliding layers'
 * K/V of the window before the match is in the first one's ring. Nothing is published,
 * and a match finds nothing (as llama.cpp reprocesses such prompts without --swa-full). */
static void test_kv_sliding_layers_refuse_prefix_sharing(void **state)
{
	(void)state;
	struct kv_config cfg = sliding_config();
	struct fixture f;
	struct hearth_error err;
	assert_int_equal(fixture_make(&f, &cfg), 0);
	struct kv_cache *kv = &f.kv;
	int32_t t[12] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 };
	struct kv_seq *a, *b;
	assert_int_equal(kv_seq_new(kv, &a, &err), 0);
	assert_int_equal(kv_seq_reserve(kv, a, 12, &err), 0);
	assert_int_equal(kv_seq_commit_filled(kv, a, t, 12, &err), 0);
	assert_int_equal(kv_seq_committed(a), 0);
	assert_int_equal(kv_seq_new(kv, &b, &err), 0);
	assert_int_equal(kv_seq_match_prefix(kv, b, t, 12, &err), 0);
	kv_seq_free(kv, a);
	kv_seq_free(kv, b);
	kv_destroy(kv);
	arena_destroy(&f.arena);
}

/* A budget that cannot hold every slot's ring and one block says what the rings take and
 * the budget that would do. */
static void test_kv_plan_budget_pays_the_rings_first(void **state)
{
	(void)state;
	struct kv_config cfg = sliding_config();
	struct kv_geometry g;
	struct hearth_error err;
	cfg.budget_bytes = 2 * 3 * 512 + 255;
	assert_int_equal(kv_plan(&cfg, &g, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "rings"));
	assert_non_null(strstr(err.msg, "3072 bytes"));
	assert_non_null(strstr(err.msg, "kv_budget must be at least 3328 bytes"));
	cfg.budget_bytes += 1;
	assert_int_equal(kv_plan(&cfg, &g, &err), 0);
	assert_int_equal(g.n_blocks, 1);
	/* rings beside the budget (the daemon's default kv_budget): the blocks get all of it */
	cfg.rings_outside_budget = true;
	assert_int_equal(kv_plan(&cfg, &g, &err), 0);
	assert_int_equal(g.ring_bytes, 3072);
	assert_int_equal(g.n_blocks, (2 * 3 * 512 + 256) / g.block_bytes);
	cfg.budget_bytes = 255;
	assert_int_equal(kv_plan(&cfg, &g, &err), HEARTH_EINVAL);
	assert_null(strstr(err.msg, "rings"));
	cfg.rings_outside_budget = false;
	/* two windows differing cannot share one ring size */
	struct kv_layer_shape two[3] = { { 2, 8, 8, 6 }, { 2, 8, 8, 5 }, { 2, 8, 8, 0 } };
	cfg.layer_shapes = two;
	assert_int_equal(kv_plan(&cfg, &g, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "window"));
}

/* KV bytes per position of the Gemma-3-1B shape (26 layers, 22 sliding over 512 positions,
 * 4 global; one KV head of 256; f16) for one sequence of 8192 positions in steps of 512,
 * against what llama.cpp allocates for the same (llama_kv_cache_iswa: the global layers
 * n_ctx cells, the sliding ones GGML_PAD(min(n_ctx, n_swa + n_ubatch), 256) cells, or n_ctx
 * with --swa-full; its log on this shape: 32 + 22 MiB, and 32 + 176 MiB). */
static void test_kv_gemma3_1b_bytes_per_token_against_llama_cpp(void **state)
{
	(void)state;
	struct kv_layer_shape shapes[26];
	for (int l = 0; l < 26; l++)
		shapes[l] = (struct kv_layer_shape){ 1, 256, 256, l % 6 < 5 ? 512 : 0 };
	struct kv_config cfg = { .budget_bytes = (size_t)64 << 20, .block_tokens = 16,
				 .elem_type = QTYPE_F16, .n_layer = 26, .layer_shapes = shapes,
				 .max_seqs = 1, .max_context = 8192, .step_tokens = 512 };
	struct kv_geometry g;
	struct hearth_error err;
	assert_int_equal(kv_plan(&cfg, &g, &err), 0);
	const double ctx = 8192, row = 256 * 2 * 2; /* K and V of one head, f16 */
	double hearth = (ctx / 16 * g.block_bytes + g.ring_bytes) / ctx;
	double swa_cells = 512 + 512 < ctx ? 512 + 512 : ctx;
	swa_cells = (double)(((uint64_t)swa_cells + 255) / 256 * 256);
	double llama_off = (4 * ctx * row + 22 * swa_cells * row) / ctx;
	double llama_full = 26 * ctx * row / ctx;
	print_message("# Gemma-3-1B shape, 8192 positions, f16: hearth %.0f bytes/token "
		      "(ring %u positions), llama.cpp %.0f (--swa-full off), %.0f (on)\n", hearth,
		      g.ring_pages * 16, llama_off, llama_full);
	assert_int_equal(g.n_sliding, 22);
	assert_true(hearth <= 1.02 * llama_off);
	assert_true(hearth < 0.3 * llama_full);
}

static void test_kv_random_sharing_never_serves_another_prefix(void **state)
{
	(void)state;
	struct fixture fx;
	struct kv_config cfg = small_config();
	cfg.max_seqs = 6;
	cfg.budget_bytes = 40 * BLOCK_BYTES;
	assert_int_equal(fixture_make(&fx, &cfg), 0);
	struct kv_cache *kv = &fx.kv;
	struct hearth_error err;
	struct kv_seq *live[6] = { 0 };
	int32_t toks[6][24];
	uint32_t len[6] = { 0 };
	srand(12345);
	for (int step = 0; step < 3000; step++) {
		int s = rand() % 6;
		if (live[s] && rand() % 3 == 0) {
			kv_seq_free(kv, live[s]);
			live[s] = NULL;
			continue;
		}
		if (live[s])
			continue;
		uint32_t n = 1 + (uint32_t)(rand() % 24);
		for (uint32_t i = 0; i < n; i++)
			toks[s][i] = rand() % 2;
		struct kv_seq *q;
		assert_int_equal(kv_seq_new(kv, &q, &err), 0);
		int m = kv_seq_match_prefix(kv, q, toks[s], n, &err);
		assert_true(m >= 0 && (uint32_t)m < n && m % BT == 0);
		/* what the matched blocks hold must be this prompt's tokens */
		assert_true(positions_hold(kv, q, toks[s], 0, (uint32_t)m));
		if (kv_seq_reserve(kv, q, n, &err) != 0) {
			assert_int_equal(err.code, HEARTH_EKVFULL);
			kv_seq_free(kv, q);
			continue;
		}
		write_positions(kv, q, toks[s], (uint32_t)m, n);
		for (uint32_t i = (uint32_t)m / BT; i < n / BT; i++)
			assert_int_equal(kv_seq_commit_block(kv, q, i, toks[s] + i * BT, &err), 0);
		live[s] = q;
		len[s] = n;
		/* every live sequence still reads its own prompt */
		for (int j = 0; j < 6; j++)
			if (live[j])
				assert_true(positions_hold(kv, live[j], toks[j], 0, len[j]));
		uint32_t refs[40] = { 0 };
		for (int j = 0; j < 6; j++)
			if (live[j])
				for (uint32_t i = 0; i < live[j]->n_blocks; i++)
					refs[live[j]->blocks[i]]++;
		uint32_t used = 0;
		for (uint32_t b = 0; b < 40; b++) {
			assert_int_equal(kv_block_refcount(kv, b), refs[b]);
			used += refs[b] > 0;
		}
		struct kv_stats st;
		kv_stats(kv, &st);
		assert_int_equal(st.blocks_used, used);
		assert_int_equal(st.blocks_used + st.blocks_free, 40);
	}
	struct kv_stats st;
	kv_stats(kv, &st);
	assert_true(st.prefix_hit_tokens > 0);
	for (int j = 0; j < 6; j++)
		if (live[j])
			kv_seq_free(kv, live[j]);
	kv_destroy(kv);
	arena_destroy(&fx.arena);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kv_plan_computes_block_geometry),
		cmocka_unit_test(test_kv_q8_rows_are_codes_plus_scale),
		cmocka_unit_test(test_kv_plan_rejects_bad_config),
		cmocka_unit_test(test_kv_create_needs_the_pool_region),
		cmocka_unit_test(test_kv_sliding_layers_keep_a_ring_per_slot),
		cmocka_unit_test(test_kv_sliding_layers_refuse_prefix_sharing),
		cmocka_unit_test(test_kv_plan_budget_pays_the_rings_first),
		cmocka_unit_test(test_kv_gemma3_1b_bytes_per_token_against_llama_cpp),
		cmocka_unit_test_setup_teardown(test_kv_pool_is_fully_resident_after_create, setup, teardown),
		cmocka_unit_test_setup_teardown(test_kv_block_addresses_are_disjoint_and_inside_the_pool,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_kv_reserve_counts_blocks_and_free_returns_them, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_kv_exhaustion_is_ekvfull_and_changes_nothing, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_kv_limits_context_and_sequence_slots, setup, teardown),
		cmocka_unit_test_setup_teardown(test_kv_prefix_sharing_stores_common_blocks_once, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_kv_prefix_match_leaves_a_token_to_compute, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_kv_prefix_match_follows_the_whole_chain, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_kv_commit_checks_order_and_fullness, setup, teardown),
		cmocka_unit_test_setup_teardown(test_kv_commit_filled_publishes_only_full_blocks, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_kv_commit_of_a_block_computed_twice_keeps_one, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_kv_cached_blocks_are_reused_last, setup, teardown),
		cmocka_unit_test(test_kv_random_sharing_never_serves_another_prefix),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
