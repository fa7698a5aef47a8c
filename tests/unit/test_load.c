/* The loader's residency promises on the fixture models: a tied embedding/head stored once,
 * weights in one arena region per packed type, RoPE sized by max_context and never by the
 * file's advertised context (one table per distinct setting), a small load peak that the
 * sampler measures (and a large transient it does see), KV budget errors that say what
 * would fit, the page kind and NUMA placement reported, the file let go after loading, and a
 * draft model loaded into the model's one arena (its regions by name, refused before
 * anything is mapped when its vocabulary or KV budget will not do, freed with the model),
 * and an imatrix steering the scale search (refused before mapping when it cannot serve). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/engine/arena.h"
#include "daemon/engine/gguf.h"
#include "daemon/engine/imatrix.h"
#include "daemon/engine/kv.h"
#include "daemon/engine/ledger.h"
#include "daemon/engine/load.h"
#include "daemon/engine/memstat.h"
#include "daemon/engine/model_q4.h"
#include "daemon/engine/pack_cache.h"
#include "daemon/engine/tokenizer.h"
#include "kernels/dispatch.h"

#define MiB ((size_t)1 << 20)

static void fixture_path(const char *name, char *buf, size_t cap)
{
	const char *sh = getenv("HEARTH_SHARED");
	if (!sh) {
		fprintf(stderr, "HEARTH_SHARED is not set: run through make check\n");
		exit(1);
	}
	snprintf(buf, cap, "%s/fixtures/%s", sh, name);
}

static void small_opts(struct load_opts *o)
{
	load_opts_default(o);
	o->max_context = 128;
	o->kv_budget = 1u << 20;
	o->max_seqs = 2;
	o->step_tokens = 32;
	o->n_threads = 1;
}

static int load_path(const char *path, const struct load_opts *o, struct model_q4 **m,
		     struct hearth_error *e)
{
	struct tok *tok = NULL;
	int rc = load_q4(m, &tok, path, o, e);
	tok_free(tok);
	return rc;
}

static struct model_q4 *load_fixture(const char *name, const struct load_opts *o)
{
	char path[4096];
	fixture_path(name, path, sizeof path);
	struct model_q4 *m;
	struct hearth_error e;
	if (load_path(path, o, &m, &e) < 0)
		fail_msg("load_q4 %s: %s", name, e.msg);
	return m;
}

static const struct arena_region *region(const struct model_q4 *m, const char *name)
{
	return arena_region_find(m->arena, name);
}

/* Bytes of the int4 layout for rows x cols at group 32, asymmetric (the fixtures' F32
 * tensors are 64 wide, so group 128 does not divide them), from kernels/q4.h's description:
 * per 16-row block, an fp16 d and m for each group and row (padded to 64 bytes), then the
 * codes at 4 bits: 16 rows x cols / 2 bytes. */
static size_t q4_bytes_g32_asym(size_t rows, size_t cols)
{
	size_t groups = cols / 32;
	size_t scales = groups * 16 * 2 * 2;
	scales = (scales + 63) / 64 * 64;
	return (rows + 15) / 16 * (scales + 16 * cols / 2);
}

static void test_load_stores_tied_embedding_once(void **state)
{
	(void)state;
	struct load_opts o;
	small_opts(&o);
	/* fx-qwen3: tied, vocab 50257 x 64. */
	struct model_q4 *m = load_fixture("fx-qwen3.gguf", &o);
	const struct arena_region *r = region(m, ARENA_REGION_EMBED_HEAD);
	assert_non_null(r);
	assert_null(m->output.data);
	assert_int_equal(r->size, q4_bytes_g32_asym(50257, 64));
	assert_int_equal(r->used, r->size);
	assert_int_equal(m->bytes_embed_head, r->size);
	model_q4_free(m);

	/* fx-llama: untied, vocab 32000 x 64, embedding and head each stored. */
	m = load_fixture("fx-llama.gguf", &o);
	r = region(m, ARENA_REGION_EMBED_HEAD);
	assert_non_null(r);
	assert_non_null(m->output.data);
	assert_int_equal(r->size, 2 * q4_bytes_g32_asym(32000, 64));
	assert_int_equal(r->used, r->size);
	model_q4_free(m);
}

/* One region per packed type: F32/BF16 rows are quantized at group 64 row8 by default, at
 * group 128 with weights_group 128 (at group 32 where rows do not divide), at group 32 with
 * weights_group 32; carried-over Q4_0/Q4_K codes stay at group 32; Q4_K_M mixes both
 * unless its Q6_K matrices go to group 32 too. */
static void test_load_puts_weights_in_one_region_per_type(void **state)
{
	(void)state;
	struct load_opts o;
	small_opts(&o);
	static const struct {
		const char *file;
		uint32_t group;
		bool g128, g32, g64;
	} cases[] = {
		{ "fx-quant-bf16.gguf", LOAD_GROUP_64, false, false, true }, /* the default: row8 */
		{ "fx-llama.gguf", LOAD_GROUP_64, false, true, true },       /* ffn_down 160 wide */
		{ "fx-quant-q4_0.gguf", LOAD_GROUP_64, false, true, false }, /* carried over */
		{ "fx-quant-bf16.gguf", LOAD_GROUP_128, true, false, false },  /* 256 / 512 wide */
		{ "fx-quant-q4_0.gguf", LOAD_GROUP_128, false, true, false },  /* carried over */
		{ "fx-quant-q4_k_m.gguf", LOAD_GROUP_128, true, true, false }, /* Q6_K requantized */
		{ "fx-llama.gguf", LOAD_GROUP_128, false, true, false },       /* 64 wide: group 32 */
		{ "fx-quant-bf16.gguf", 0, false, false, true },               /* 0: the default */
		{ "fx-quant-bf16.gguf", LOAD_GROUP_32, false, true, false },
		{ "fx-quant-q4_k_m.gguf", LOAD_GROUP_32, false, true, false },
		{ "fx-quant-q4_0.gguf", LOAD_GROUP_32, false, true, false },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		o.weights_group = cases[i].group;
		struct model_q4 *m = load_fixture(cases[i].file, &o);
		const struct arena_region *a = region(m, LOAD_REGION_WEIGHTS_G128);
		const struct arena_region *b = region(m, LOAD_REGION_WEIGHTS_G32);
		const struct arena_region *c = region(m, LOAD_REGION_WEIGHTS_G64);
		assert_true((a != NULL) == cases[i].g128);
		assert_true((b != NULL) == cases[i].g32);
		assert_true((c != NULL) == cases[i].g64);
		assert_null(region(m, ARENA_REGION_WEIGHTS));
		size_t sum = (a ? a->size : 0) + (b ? b->size : 0) + (c ? c->size : 0);
		assert_int_equal(sum, m->bytes_weights);
		/* every planned byte was carved: the plan was exact */
		assert_true(!a || a->used == a->size);
		assert_true(!b || b->used == b->size);
		assert_true(!c || c->used == c->size);
		/* each layer matrix sits in its type's region */
		for (uint32_t l = 0; l < m->n_layer; l++) {
			const struct q4_matrix *q = &m->layers[l].wq;
			const struct arena_region *want = q->group == 128 ? a : q->group == 64 ? c : b;
			assert_non_null(want);
			assert_true(q->data >= want->base && q->data < want->base + want->size);
		}
		model_q4_free(m);
	}
}

/* weights_group 32 on a BF16 file: every layer matrix symmetric group 32, sized as
 * kernels/q4.h describes it (per 16-row block: one fp16 d per group and row, padded to
 * 64 bytes, then cols/2 code bytes per row), i.e. 4.5 bits per weight for these widths;
 * the embedding symmetric group 32 too (load_head_group) in embed_head. A group the
 * layout does not have is refused. */
static void test_load_weights_group_32_packs_layers_sym_group_32(void **state)
{
	(void)state;
	struct load_opts o;
	small_opts(&o);
	o.weights_group = LOAD_GROUP_32;
	struct model_q4 *m = load_fixture("fx-quant-bf16.gguf", &o);
	size_t bytes = 0;
	for (uint32_t l = 0; l < m->n_layer; l++) {
		const struct mq4_layer *L = &m->layers[l];
		const struct q4_matrix *ws[7] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down };
		for (int i = 0; i < 7; i++) {
			const struct q4_matrix *q = ws[i];
			assert_int_equal(q->group, 32);
			assert_false(q->asym);
			size_t scales = (q->cols / 32 * 16 * 2 + 63) / 64 * 64;
			size_t want = (q->rows + 15) / 16 * (scales + q->cols * 8);
			assert_int_equal(q4_matrix_bytes(q), want);
			assert_true(q4_matrix_bpw(q) == 4.5);
			bytes += (want + 63) / 64 * 64;
		}
	}
	assert_int_equal(bytes, m->bytes_weights);
	assert_int_equal(region(m, LOAD_REGION_WEIGHTS_G32)->size, bytes);
	assert_int_equal(m->embd.group, load_head_group(LOAD_GROUP_32));
	assert_true(m->embd.asym == (m->embd.group == 128));
	const struct arena_region *eh = region(m, ARENA_REGION_EMBED_HEAD);
	assert_true(m->embd.data >= eh->base && m->embd.data < eh->base + eh->size);
	model_q4_free(m);

	char path[4096];
	fixture_path("fx-quant-bf16.gguf", path, sizeof path);
	struct hearth_error e;
	o.weights_group = 96;
	assert_int_equal(load_path(path, &o, &m, &e), HEARTH_EINVAL);
	assert_non_null(strstr(e.msg, "use 128, 64 or 32"));
	assert_null(m);
}

/* The default layout on a BF16 file whose rows are multiples of 128: every layer matrix at
 * group 64 in the row8 encoding (weights_group 128: group 128 with fp16 scales), the tied
 * embedding/head at group 32 asymmetric (load_head_group, 5.0 bits per weight); head_group
 * puts it back at group 128 or at group 32 symmetric. */
static void test_load_default_packs_the_head_at_group_32_asym(void **state)
{
	(void)state;
	struct load_opts o;
	small_opts(&o);
	o.mix = LOAD_MIX_OFF; /* with the head at group 128 the mix rule would take layer matrices */
	assert_int_equal(load_head_group(LOAD_GROUP_128), LOAD_GROUP_32_ASYM);
	static const struct {
		uint32_t head_group, group;
		bool asym;
		double bpw;
	} cases[] = {
		{ 0, 32, true, 5.0 },
		{ LOAD_GROUP_32_ASYM, 32, true, 5.0 },
		{ LOAD_GROUP_32, 32, false, 4.5 },
		{ LOAD_GROUP_128, 128, true, 4.25 },
	};
	assert_int_equal(load_head_group(LOAD_GROUP_64), LOAD_GROUP_32_ASYM);
	struct load_opts d;
	load_opts_default(&d);
	assert_int_equal(d.weights_group, LOAD_GROUP_64);
	for (size_t i = 0; i < 2 * sizeof cases / sizeof cases[0]; i++) {
		size_t c = i % (sizeof cases / sizeof cases[0]);
		bool g128 = i >= sizeof cases / sizeof cases[0];
		o.head_group = cases[c].head_group;
		o.weights_group = g128 ? LOAD_GROUP_128 : LOAD_GROUP_64;
		struct model_q4 *m = load_fixture("fx-quant-bf16.gguf", &o);
		for (uint32_t l = 0; l < m->n_layer; l++) {
			const struct mq4_layer *L = &m->layers[l];
			const struct q4_matrix *ws[7] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down };
			for (int k = 0; k < 7; k++) {
				assert_int_equal(ws[k]->group, g128 ? 128 : 64);
				assert_true(ws[k]->asym);
				assert_true(ws[k]->row8 == !g128);
			}
		}
		assert_int_equal(m->embd.group, cases[c].group);
		assert_true(m->embd.asym == cases[c].asym);
		assert_false(m->embd.row8);
		assert_true(q4_matrix_bpw(&m->embd) == cases[c].bpw);
		assert_null(region(m, LOAD_REGION_WEIGHTS_G32));
		size_t eh = (q4_matrix_bytes(&m->embd) + 63) / 64 * 64;
		if (m->output.data)
			eh += (q4_matrix_bytes(&m->output) + 63) / 64 * 64;
		assert_int_equal(region(m, ARENA_REGION_EMBED_HEAD)->size, eh);
		model_q4_free(m);
	}
}

/* Bytes of the int8 layout for rows x cols at group g, from kernels/q8.h's description: per
 * 16-row block, an fp16 d and an int16 code sum for each group and row (64 bytes a group),
 * then the codes at 8 bits: 16 rows x cols bytes. */
static size_t q8_bytes(size_t rows, size_t cols, size_t g)
{
	return (rows + 15) / 16 * (cols / g * 64 + 16 * cols);
}

/* head_bits 8: the embedding (and an untied head) as int8 in embed_head, sized exactly as
 * the layout says and planned exactly (the region is full), the tied tensor once; group 128
 * from BF16, group 32 where rows are 64 wide and for a carried-over Q8_0 tensor; int4 head
 * fields left empty. Bits other than 4 or 8 are refused. */
static void test_load_int8_head_sizes_embed_head_exactly(void **state)
{
	(void)state;
	static const struct {
		const char *file;
		size_t rows, cols, group, copies;
	} cases[] = {
		{ "fx-quant-bf16.gguf", 32000, 256, 128, 1 },
		{ "fx-quant-q8_0.gguf", 32000, 256, 32, 1 },
		{ "fx-qwen3.gguf", 50257, 64, 32, 1 },
		{ "fx-llama.gguf", 32000, 64, 32, 2 },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		struct load_opts o;
		small_opts(&o);
		o.head_bits = LOAD_HEAD_INT8;
		struct model_q4 *m = load_fixture(cases[i].file, &o);
		const struct arena_region *r = region(m, ARENA_REGION_EMBED_HEAD);
		size_t want = cases[i].copies * q8_bytes(cases[i].rows, cases[i].cols, cases[i].group);
		assert_int_equal(m->head_bits, 8);
		assert_null(m->embd.data);
		assert_null(m->output.data);
		assert_int_equal(m->embd8.group, cases[i].group);
		assert_true((m->output8.data != NULL) == (cases[i].copies == 2));
		assert_int_equal(r->size, want);
		assert_int_equal(r->used, r->size);
		assert_int_equal(m->bytes_embed_head, r->size);
		assert_true(m->embd8.data >= r->base && m->embd8.data < r->base + r->size);
		assert_int_equal(m->notes[m->n_notes - 1].bits, 8);
		assert_true(m->notes[m->n_notes - 1].carried == (cases[i].group == 32 && cases[i].cols == 256));
		model_q4_free(m);
	}

	char path[4096];
	fixture_path("fx-qwen3.gguf", path, sizeof path);
	struct load_opts o;
	small_opts(&o);
	o.head_bits = 5;
	struct model_q4 *m;
	struct hearth_error e;
	assert_int_equal(load_path(path, &o, &m, &e), HEARTH_EINVAL);
	assert_non_null(strstr(e.msg, "use 4, 6 or 8"));
	assert_null(m);
}

/* Bytes of the int6 layout for rows x cols, from kernels/q6.h's description: per 16-row
 * block, an fp16 d for each group and row (padded to 64 bytes), then 6 bits a code: 16
 * rows x cols x 6 / 8 bytes. No code sums. */
static size_t q6_bytes(size_t rows, size_t cols)
{
	return (rows + 15) / 16 * ((cols / 32 * 32 + 63) / 64 * 64 + 16 * cols * 6 / 8);
}

/* head_bits 6: the embedding (and an untied head) as int6 in embed_head, sized exactly as
 * the layout says and planned exactly, the tied tensor once, always group 32 and packed
 * from f32 rows (a Q8_0 tensor too: nothing is carried over); the other heads' fields
 * left empty; "+head_q6" in the name. */
static void test_load_int6_head_sizes_embed_head_exactly(void **state)
{
	(void)state;
	static const struct {
		const char *file;
		size_t rows, cols, copies;
	} cases[] = {
		{ "fx-quant-bf16.gguf", 32000, 256, 1 },
		{ "fx-quant-q8_0.gguf", 32000, 256, 1 },
		{ "fx-qwen3.gguf", 50257, 64, 1 },
		{ "fx-llama.gguf", 32000, 64, 2 },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		struct load_opts o;
		small_opts(&o);
		o.head_bits = LOAD_HEAD_INT6;
		struct model_q4 *m = load_fixture(cases[i].file, &o);
		const struct arena_region *r = region(m, ARENA_REGION_EMBED_HEAD);
		size_t want = cases[i].copies * q6_bytes(cases[i].rows, cases[i].cols);
		assert_int_equal(m->head_bits, 6);
		assert_null(m->embd.data);
		assert_null(m->output.data);
		assert_null(m->embd8.data);
		assert_null(m->output8.data);
		assert_int_equal(m->embd6.rows, cases[i].rows);
		assert_true((m->output6.data != NULL) == (cases[i].copies == 2));
		assert_int_equal(r->size, want);
		assert_int_equal(r->used, r->size);
		assert_int_equal(m->bytes_embed_head, r->size);
		assert_true(m->embd6.data >= r->base && m->embd6.data < r->base + r->size);
		assert_int_equal(m->notes[m->n_notes - 1].bits, 6);
		assert_int_equal(m->notes[m->n_notes - 1].group, 32);
		assert_false(m->notes[m->n_notes - 1].carried);
		assert_non_null(strstr(m->quant_name, "+head_q6"));
		model_q4_free(m);
	}
}

/* The mix rule (load.h) against its own statement, simulated here from the sizes of the
 * all-int4 model (weights_mix off) on fx-quant-bf16 (2 layers, 256-wide rows, the tied
 * embedding/head 87% of the weights): the embedding/head int6 first when it fits whole,
 * then layer by layer from the outside in, in each attn_v, ffn_down, attn_k, attn_q,
 * attn_output, ffn_gate, ffn_up, skipping what would pass the budget. Budgets where nothing fits (the default
 * 4.5 here, 4.4 and 1.0), some layer matrices, all of them, the head with some, and
 * everything. The model
 * stays within each budget it could meet, and the int8 matrices sit in weights.q8, sized
 * exactly. */
static void test_load_mix_rule_spends_the_budget_in_its_order(void **state)
{
	(void)state;
	struct load_opts o;
	small_opts(&o);
	o.mix = LOAD_MIX_OFF;
	struct model_q4 *off = load_fixture("fx-quant-bf16.gguf", &o);
	assert_int_equal(off->n_mix8, 0);
	uint64_t base = 8 * (off->bytes_weights + off->bytes_embed_head + off->bytes_norms);
	uint64_t h4 = off->bytes_embed_head, h6 = q6_bytes(32000, 256);
	static const int order[7] = { MQ4_WV, MQ4_DOWN, MQ4_WK, MQ4_WQ, MQ4_WO, MQ4_GATE, MQ4_UP };
	static const uint32_t budgets[] = { 0, 100, 440, 520, 600, 640, 800, 900 };
	bool some_layers_only = false, head_and_some = false;
	for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
		uint32_t cbpw = budgets[b] ? budgets[b] : LOAD_MIX_BUDGET_CBPW;
		uint64_t budget = off->n_params * cbpw / 100, bits = base, q8_region = 0;
		bool head6 = bits + 8 * (h6 - h4) <= budget, want[2][7] = { { false } };
		uint32_t n_want = 0;
		if (head6)
			bits += 8 * (h6 - h4);
		for (uint32_t k = 0; k < off->n_layer; k++)
			for (int j = 0; j < 7; j++) {
				uint32_t l = k % 2 ? off->n_layer - 1 - k / 2 : k / 2;
				const struct mq4_layer *L = &off->layers[l];
				const struct q4_matrix *w4[7] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down };
				const struct q4_matrix *w = w4[order[j]];
				/* int8 copies at the layers' own group 64 (one activation buffer) */
				uint64_t c4 = (q4_matrix_bytes(w) + 63) / 64 * 64, c8 = q8_bytes(w->rows, w->cols, 64);
				if (bits + 8 * (c8 - c4) <= budget) {
					bits += 8 * (c8 - c4);
					want[l][order[j]] = true;
					q8_region += c8;
					n_want++;
				}
			}
		o.mix = LOAD_MIX_AUTO;
		o.mix_budget_cbpw = budgets[b];
		struct model_q4 *m = load_fixture("fx-quant-bf16.gguf", &o);
		print_message("budget %.2f bpw: head int%u, %u of 14 layer matrices int8, %.3f bpw (%s)\n",
			      cbpw / 100.0, m->head_bits, m->n_mix8,
			      8.0 * (double)(m->bytes_weights + m->bytes_embed_head + m->bytes_norms) / (double)m->n_params,
			      m->quant_name);
		assert_int_equal(m->head_bits, head6 ? LOAD_HEAD_INT6 : LOAD_HEAD_INT4);
		assert_true((m->embd6.data != NULL) == head6);
		assert_null(m->embd8.data);
		assert_int_equal(m->n_mix8, n_want);
		for (uint32_t l = 0; l < m->n_layer; l++)
			for (int i = 0; i < 7; i++) {
				assert_true((m->layers[l].w8[i].data != NULL) == want[l][i]);
				if (want[l][i])
					assert_int_equal(m->layers[l].w8[i].group, 64);
			}
		uint64_t used = 8 * (m->bytes_weights + m->bytes_embed_head + m->bytes_norms);
		assert_int_equal(used, bits);
		if (head6 || n_want)
			assert_true(used <= budget);
		const struct arena_region *r = region(m, LOAD_REGION_WEIGHTS_Q8);
		if (n_want) {
			assert_non_null(r);
			assert_int_equal(r->size, q8_region);
			assert_int_equal(r->used, r->size);
			assert_non_null(strstr(m->quant_name, "+mix"));
		} else {
			assert_null(r);
			assert_null(strstr(m->quant_name, "+mix"));
		}
		if (budgets[b] == 0 || budgets[b] == 100) /* nothing fits: the layout of mix off */
			assert_true(!head6 && n_want == 0 && !strcmp(m->quant_name, off->quant_name));
		if (budgets[b] == 900) { /* everything fits */
			assert_true(head6 && n_want == 14);
			assert_string_equal(m->quant_name, "q8+head_q6+mix");
		}
		some_layers_only |= !head6 && n_want > 0 && n_want < 14;
		head_and_some |= head6 && n_want > 0 && n_want < 14;
		model_q4_free(m);
	}
	assert_true(some_layers_only);
	assert_true(head_and_some);
	model_q4_free(off);

	/* A forced int4, int6 or int8 head is kept and counted; the layers fill what is left
	 * (none at 4.5; at 9.0 all of them beside int4 or int6, fewer beside int8, which
	 * holds the budget). */
	small_opts(&o);
	o.head_bits = LOAD_HEAD_INT4;
	o.mix_budget_cbpw = 900;
	struct model_q4 *m = load_fixture("fx-quant-bf16.gguf", &o);
	assert_int_equal(m->head_bits, LOAD_HEAD_INT4);
	assert_int_equal(m->n_mix8, 14);
	model_q4_free(m);
	static const uint32_t forced[] = { LOAD_HEAD_INT6, LOAD_HEAD_INT8 };
	for (size_t f = 0; f < 2; f++) {
		small_opts(&o);
		o.head_bits = forced[f];
		m = load_fixture("fx-quant-bf16.gguf", &o);
		assert_int_equal(m->head_bits, forced[f]);
		assert_int_equal(m->n_mix8, 0);
		model_q4_free(m);
		o.mix_budget_cbpw = 900;
		m = load_fixture("fx-quant-bf16.gguf", &o);
		uint64_t used = 8 * (m->bytes_weights + m->bytes_embed_head + m->bytes_norms);
		print_message("forced int%u head at 9.00 bpw: %u of 14 layer matrices int8, %.3f bpw (%s)\n",
			      forced[f], m->n_mix8, (double)used / (double)m->n_params, m->quant_name);
		assert_int_equal(m->head_bits, forced[f]);
		assert_true(used <= m->n_params * 9);
		if (forced[f] == LOAD_HEAD_INT6)
			assert_int_equal(m->n_mix8, 14);
		model_q4_free(m);
	}

	/* Carried-over 4-bit codes are never upgraded, whatever the budget. */
	small_opts(&o);
	o.mix_budget_cbpw = 900;
	m = load_fixture("fx-quant-q4_0.gguf", &o);
	for (uint32_t l = 0; l < m->n_layer; l++)
		for (int i = 0; i < 7; i++)
			if (m->layers[l].w8[i].data)
				assert_int_not_equal(m->notes[l * 7 + i].src, QTYPE_Q4_0);
	model_q4_free(m);

	char path[4096];
	fixture_path("fx-qwen3.gguf", path, sizeof path);
	small_opts(&o);
	o.mix = 2;
	struct hearth_error e;
	assert_int_equal(load_path(path, &o, &m, &e), HEARTH_EINVAL);
	assert_non_null(strstr(e.msg, "use auto or off"));
}

/* The repack splits row blocks over the pool's threads: the packed bytes are the same as
 * one thread's, for both layouts (and an int8 or int6 head). */
static void test_load_repack_on_threads_gives_the_same_bytes(void **state)
{
	(void)state;
	static const uint32_t groups[4] = { LOAD_GROUP_128, LOAD_GROUP_32, LOAD_GROUP_128, LOAD_GROUP_128 };
	static const uint32_t heads[4] = { LOAD_HEAD_INT4, LOAD_HEAD_INT4, LOAD_HEAD_INT8, LOAD_HEAD_INT6 };
	for (int g = 0; g < 4; g++) {
		struct load_opts o;
		small_opts(&o);
		o.weights_group = groups[g];
		o.head_bits = heads[g];
		o.n_threads = 1;
		struct model_q4 *one = load_fixture("fx-quant-bf16.gguf", &o);
		o.n_threads = 2;
		struct model_q4 *two = load_fixture("fx-quant-bf16.gguf", &o);
		const char *names[3] = { LOAD_REGION_WEIGHTS_G128, LOAD_REGION_WEIGHTS_G32, ARENA_REGION_EMBED_HEAD };
		for (int i = 0; i < 3; i++) {
			const struct arena_region *a = region(one, names[i]), *b = region(two, names[i]);
			assert_true((a == NULL) == (b == NULL));
			if (!a)
				continue;
			assert_int_equal(a->used, b->used);
			assert_memory_equal(a->base, b->base, a->used);
		}
		model_q4_free(one);
		model_q4_free(two);
	}
}

/* A copy of src in a temporary file with the u32 value of key replaced: GGUF stores a kv
 * as its key string, a u32 type, then the value. */
static void copy_with_u32(const char *src, const char *key, uint32_t value, char *out, size_t cap)
{
	FILE *in = fopen(src, "rb");
	assert_non_null(in);
	fseek(in, 0, SEEK_END);
	long n = ftell(in);
	fseek(in, 0, SEEK_SET);
	char *buf = malloc((size_t)n);
	assert_non_null(buf);
	assert_int_equal(fread(buf, 1, (size_t)n, in), (size_t)n);
	fclose(in);
	size_t klen = strlen(key);
	char *at = memmem(buf, (size_t)n, key, klen);
	assert_non_null(at);
	uint32_t type;
	memcpy(&type, at + klen, 4);
	assert_int_equal(type, 4); /* GGUF_TYPE_UINT32 */
	memcpy(at + klen + 4, &value, 4);
	snprintf(out, cap, "%s/hearth-test-load-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	int fd = mkstemp(out);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, buf, (size_t)n), n);
	close(fd);
	free(buf);
}

static void test_load_sizes_rope_by_max_context(void **state)
{
	(void)state;
	struct load_opts o;
	small_opts(&o);
	/* fx-qwen3: 3 layers, head size 32 = n_rot, one theta: one cos and one sin table of
	 * max_context x 16 floats, shared by every layer. */
	o.max_context = 64;
	struct model_q4 *m = load_fixture("fx-qwen3.gguf", &o);
	assert_int_equal(m->n_ropes, 1);
	for (uint32_t l = 0; l < m->n_layer; l++)
		assert_ptr_equal(m->layers[l].rope, &m->ropes[0]);
	size_t at64 = region(m, ARENA_REGION_ROPE)->size;
	assert_int_equal(at64, 2 * 64 * 16 * sizeof(float));
	uint32_t trained = m->hp.n_ctx_train;
	model_q4_free(m);

	o.max_context = 128;
	m = load_fixture("fx-qwen3.gguf", &o);
	size_t at128 = region(m, ARENA_REGION_ROPE)->size;
	assert_int_equal(at128, 2 * at64);
	model_q4_free(m);

	/* The same model advertising 1,048,576 positions: the tables do not change. */
	char src[4096], path[4096];
	fixture_path("fx-qwen3.gguf", src, sizeof src);
	copy_with_u32(src, "qwen3.context_length", 1u << 20, path, sizeof path);
	struct hearth_error e;
	int rc = load_path(path, &o, &m, &e);
	unlink(path);
	if (rc < 0)
		fail_msg("load_q4 (patched context): %s", e.msg);
	assert_int_equal(m->hp.n_ctx_train, 1u << 20);
	assert_true(trained != m->hp.n_ctx_train);
	assert_int_equal(region(m, ARENA_REGION_ROPE)->size, at128);
	model_q4_free(m);
}

struct spike {
	size_t bytes;
	bool done;
};

/* Holds a touched 64 MiB buffer for 300 ms inside the loader's last progress call: long
 * enough that a 10 ms sampler sees it even on a busy machine. */
static void spike_progress(void *ctx, const char *phase, const char *what, uint64_t done,
			   uint64_t total)
{
	(void)what;
	struct spike *s = ctx;
	if (s->done || strcmp(phase, "repacking") != 0 || done != total)
		return;
	char *p = malloc(s->bytes);
	assert_non_null(p);
	memset(p, 0x5a, s->bytes);
	struct timespec ts = { 0, 300 * 1000000L };
	nanosleep(&ts, NULL);
	free(p);
	s->done = true;
}

static void test_load_peak_is_small_and_the_sampler_sees_a_transient(void **state)
{
	(void)state;
	char path[4096];
	fixture_path("fx-quant-bf16.gguf", path, sizeof path);
	struct load_opts o;
	small_opts(&o);
	/* RssAnon leaves hugetlb pages out: normal pages, so the arena is part of what the
	 * sampler sees on any machine. */
	o.arena.pages = ARENA_PAGES_NONE;
	struct ledger_load rec;
	o.load_record = &rec;
	struct model_q4 *m = load_fixture("fx-quant-bf16.gguf", &o);
	assert_true(rec.valid);
	assert_true(rec.samples >= 1);
	assert_true(rec.settled_anon >= m->arena->size);  /* the arena is all touched */
	/* The file is 19 MB; the blocked repack's scratch is 16 rows of 512 floats. Expanding
	 * one whole matrix (token_embd, 32000 x 256 f32) would be 32 MiB above the settled
	 * size; what is seen is the tokenizer's and the reader's short-lived tables, 2-5 MiB
	 * depending on when the 10 ms sampler looks. */
	assert_true(rec.transient < 8 * MiB);
	assert_true(rec.peak_anon - rec.baseline_anon < m->arena->size + 8 * MiB);
	model_q4_free(m);

	struct spike sp = { 64 * MiB, false };
	o.progress = spike_progress;
	o.progress_ctx = &sp;
	m = load_fixture("fx-quant-bf16.gguf", &o);
	assert_true(sp.done);
	assert_true(rec.valid);
	assert_true(rec.peak_anon - rec.baseline_anon >= 64 * MiB);
	/* After the spike only norms, RoPE, the KV pool (1 MiB) and scratch are added. */
	assert_true(rec.transient >= 56 * MiB);
	assert_true(rec.kernel_peak_rss >= 64 * MiB);
	/* and it was given back: settled is the arena plus the process, not the spike */
	assert_true(rec.settled_anon < rec.peak_anon - 56 * MiB);
	model_q4_free(m);
}

static void test_load_reports_a_kv_budget_too_small_for_one_block(void **state)
{
	(void)state;
	char path[4096];
	fixture_path("fx-qwen3.gguf", path, sizeof path);
	struct load_opts o;
	small_opts(&o);
	/* fx-qwen3: 3 layers x (K + V) x 16 tokens x 2 KV heads x 32 dims x 2 bytes (f16). */
	const size_t block = 3 * 2 * 16 * 2 * 32 * 2;
	struct model_q4 *m = NULL;
	struct hearth_error e;
	struct ledger_load rec;
	o.load_record = &rec;
	o.kv_budget = block - 1;
	assert_int_equal(load_path(path, &o, &m, &e), HEARTH_EINVAL);
	assert_null(m);
	assert_false(rec.valid);
	assert_non_null(strstr(e.msg, "kv_budget"));
	char num[32];
	snprintf(num, sizeof num, "%zu", block);
	assert_non_null(strstr(e.msg, num));    /* names the size one block needs */

	/* Exactly one block loads, and a 17th token is refused with the budget named. */
	o.kv_budget = block;
	assert_int_equal(load_path(path, &o, &m, &e), 0);
	assert_true(rec.valid);
	assert_int_equal(m->kv.geo.n_blocks, 1);
	assert_int_equal(m->kv.geo.block_bytes, block);
	struct kv_seq *s;
	assert_int_equal(kv_seq_new(&m->kv, &s, &e), 0);
	assert_int_equal(kv_seq_reserve(&m->kv, s, 16, &e), 0);
	assert_int_equal(kv_seq_reserve(&m->kv, s, 17, &e), HEARTH_EKVFULL);
	assert_non_null(strstr(e.msg, "kv_budget"));
	kv_seq_free(&m->kv, s);
	model_q4_free(m);
}

static void test_load_reports_the_page_kind_it_got(void **state)
{
	(void)state;
	char path[4096];
	fixture_path("fx-qwen3.gguf", path, sizeof path);
	struct load_opts o;
	small_opts(&o);
	struct hearth_error e;
	struct model_q4 *m;

	/* auto: whatever it fell back to is named, with the reason for each step */
	o.arena.pages = ARENA_PAGES_AUTO;
	assert_int_equal(load_path(path, &o, &m, &e), 0);
	assert_true(m->arena->note[0] != '\0');
	assert_non_null(strstr(m->arena->note, arena_backing_name(m->arena->backing)));
	struct memstat_hugepages hp;
	if (memstat_hugepages_2m(&hp, NULL) == 0 && hp.available * ARENA_HUGE_PAGE < m->arena->size) {
		assert_int_not_equal(m->arena->backing, ARENA_BACKING_HUGETLB);
		assert_non_null(strstr(m->arena->note, "hugetlb"));
	}
	model_q4_free(m);

	o.arena.pages = ARENA_PAGES_NONE;
	assert_int_equal(load_path(path, &o, &m, &e), 0);
	assert_int_equal(m->arena->backing, ARENA_BACKING_NORMAL);
	assert_non_null(strstr(m->arena->note, "normal"));
	model_q4_free(m);

	/* hugetlb demanded without a pool: the error names the knob, nothing is left loaded */
	if (memstat_hugepages_2m(&hp, NULL) == 0 && hp.available == 0) {
		o.arena.pages = ARENA_PAGES_HUGETLB;
		m = NULL;
		assert_int_equal(load_path(path, &o, &m, &e), HEARTH_ENOMEM);
		assert_null(m);
		assert_non_null(strstr(e.msg, "nr_hugepages"));
	}
}

static void test_load_reports_numa_placement(void **state)
{
	(void)state;
	struct load_opts o;
	small_opts(&o);
	struct arena_placement pl;
	o.placement = &pl;
	o.arena.numa_node = 0;    /* required: a page elsewhere would fail the load */
	struct model_q4 *m = load_fixture("fx-qwen3.gguf", &o);
	if (!pl.numa_known) {
		model_q4_free(m);
		skip();
	}
	assert_true(m->arena->numa_bound);
	assert_int_equal(pl.bytes_other_node, 0);
	size_t sum = pl.bytes_not_present;
	for (int n = 0; n < pl.n_nodes; n++)
		sum += pl.node_bytes[n];
	assert_int_equal(sum, m->arena->size);
	/* everything the loader wrote is present, on node 0 */
	assert_true(pl.node_bytes[0] >= m->bytes_weights + m->bytes_embed_head + m->kv.geo.pool_bytes);
	model_q4_free(m);
}

/* After load_q4 returns, no mapping of the model file remains. */
static void test_load_lets_the_file_go(void **state)
{
	(void)state;
	char path[4096];
	fixture_path("fx-quant-bf16.gguf", path, sizeof path);
	char real[4096];
	assert_non_null(realpath(path, real));
	struct load_opts o;
	small_opts(&o);
	struct model_q4 *m = load_fixture("fx-quant-bf16.gguf", &o);
	FILE *maps = fopen("/proc/self/maps", "r");
	assert_non_null(maps);
	char line[8192];
	bool mapped = false;
	while (fgets(line, sizeof line, maps))
		mapped |= strstr(line, real) != NULL;
	fclose(maps);
	assert_false(mapped);
	model_q4_free(m);
}

/* The mappings marked MADV_NOHUGEPAGE ("nh" in smaps' VmFlags: an arena with pages = none,
 * but also thread stacks with this glibc, so tests count differences), and whether one of
 * them holds [p, p + n) whole. */
static int arena_mappings_holding(const void *p, size_t n, bool *holds)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	assert_non_null(f);
	char line[1024];
	unsigned long a = 0, b = 0;
	int count = 0;
	if (holds)
		*holds = false;
	while (fgets(line, sizeof line, f)) {
		unsigned long x, y;
		if (sscanf(line, "%lx-%lx ", &x, &y) == 2) {
			a = x;
			b = y;
		} else if (strncmp(line, "VmFlags:", 8) == 0) {
			for (char *t = strtok(line + 8, " \n"); t; t = strtok(NULL, " \n"))
				if (strcmp(t, "nh") == 0) {
					count++;
					if (holds && a <= (uintptr_t)p && (uintptr_t)p + n <= b)
						*holds = true;
				}
		}
	}
	fclose(f);
	return count;
}

static int arena_mappings(void)
{
	return arena_mappings_holding(NULL, 0, NULL);
}

/* The draft's vocabulary check as the loader sees it (the service's draft_vocab_check
 * compares every token; here the sizes, which tell the fixtures' vocabularies apart), and
 * what was mapped when it ran. */
static int g_vocab_calls, g_vocab_mappings;

static int vocab_same_size(const struct tok *model, const struct tok *draft, struct hearth_error *err)
{
	g_vocab_calls++;
	g_vocab_mappings = arena_mappings();
	if (tok_n_vocab(model) != tok_n_vocab(draft))
		return hearth_error_set(err, HEARTH_EINVAL, "the vocabularies have %d and %d tokens",
					tok_n_vocab(model), tok_n_vocab(draft));
	return 0;
}

static void assert_inside(const void *p, const struct arena_region *r)
{
	assert_non_null(r);
	assert_true((const uint8_t *)p >= r->base && (const uint8_t *)p < r->base + r->size);
}

/* A draft (fx-qwen2, the same GPT-2 vocabulary) loaded with fx-qwen3 lives in the model's
 * one arena: one mapping, its regions named "draft.*" inside it and holding its matrices,
 * norms, KV and scratch, planned as load_plan_size says, stepping on the model's threads,
 * and unmapped with the model by one model_q4_free. */
static void test_load_puts_the_draft_in_the_models_one_arena(void **state)
{
	(void)state;
	char path[4096], dpath[4096];
	fixture_path("fx-qwen3.gguf", path, sizeof path);
	fixture_path("fx-qwen2.gguf", dpath, sizeof dpath);
	struct load_opts o;
	small_opts(&o);
	o.arena.pages = ARENA_PAGES_NONE;
	int before = arena_mappings();
	struct model_q4 *alone = load_fixture("fx-qwen3.gguf", &o);
	assert_int_equal(arena_mappings(), before + 1);
	size_t alone_planned = alone->arena->planned;
	model_q4_free(alone);
	assert_int_equal(arena_mappings(), before);

	o.draft = (struct load_draft_opts){ dpath, 1u << 20, false, vocab_same_size };
	struct hearth_error e;
	size_t planned = 0;
	g_vocab_calls = 0;
	assert_int_equal(load_plan_size(path, &o, &planned, &e), 0);
	assert_int_equal(g_vocab_calls, 1);
	assert_int_equal(arena_mappings(), before); /* the estimate maps nothing */
	struct model_q4 *m = load_fixture("fx-qwen3.gguf", &o);
	assert_int_equal(g_vocab_calls, 2);
	assert_int_equal(g_vocab_mappings, before); /* checked before the arena was mapped */
	assert_non_null(m->draft);
	bool holds;
	assert_int_equal(arena_mappings_holding(m->arena->base, m->arena->size, &holds), before + 1);
	assert_true(holds);
	assert_ptr_equal(m->draft->arena, m->arena);
	assert_null(m->draft->arena_own.base);
	assert_null(m->draft->draft);

	/* the draft's regions, by the model's names under the prefix, inside the one mapping */
	size_t draft_bytes = 0, n_draft = 0;
	for (size_t i = 0; i < m->arena->n_regions; i++) {
		const struct arena_region *r = &m->arena->regions[i];
		if (strncmp(r->name, ARENA_DRAFT_PREFIX, strlen(ARENA_DRAFT_PREFIX)) != 0)
			continue;
		assert_non_null(region(m, r->name + strlen(ARENA_DRAFT_PREFIX))); /* the model has one too */
		assert_true(r->base >= m->arena->base && r->base + r->size <= m->arena->base + m->arena->size);
		draft_bytes += r->size;
		n_draft++;
	}
	assert_true(n_draft >= 6);
	assert_true(region(m, "draft.weights.q4g32") || region(m, "draft.weights.q4g64") ||
		    region(m, "draft.weights.q4g128"));
	assert_inside(m->draft->embd.data, region(m, "draft.embed_head"));
	assert_inside(m->draft->layers[0].attn_norm, region(m, "draft.norms"));
	assert_inside(m->draft->ropes[0].cos, region(m, "draft.rope"));
	assert_inside(m->draft->kv.pool, region(m, "draft.kv_pool"));
	assert_inside(m->draft->x, region(m, "draft.scratch"));
	assert_inside(m->embd.data, region(m, ARENA_REGION_EMBED_HEAD));
	assert_inside(m->kv.pool, region(m, ARENA_REGION_KV));
	assert_int_equal(m->draft->bytes_embed_head, region(m, "draft.embed_head")->size);
	/* its own KV budget: the model's 1 MiB pool and the draft's are apart */
	assert_true(region(m, "draft.kv_pool")->size <= (1u << 20));
	assert_int_equal(region(m, "draft.kv_pool")->used, m->draft->kv.geo.pool_bytes);
	/* planned once for both, as the estimate said */
	assert_true(m->arena->planned >= alone_planned + draft_bytes);
	assert_int_equal(planned, (m->arena->planned + ARENA_HUGE_PAGE - 1) / ARENA_HUGE_PAGE * ARENA_HUGE_PAGE);
	/* one pool of compute threads, and the draft steps */
	assert_ptr_equal(m->draft->pool, m->pool);
	assert_true(m->draft->pool_borrowed);
	struct engine de;
	model_q4_engine(m->draft, &de);
	assert_int_equal(engine_warm_up(&de, 1, &e), 0);
	model_q4_free(m);
	assert_int_equal(arena_mappings(), before); /* both gone, with one free */
}

/* What is mapped of path (the model files after a load): nothing, once a load returned. */
static bool file_mapped(const char *path)
{
	char real[4096];
	assert_non_null(realpath(path, real));
	FILE *maps = fopen("/proc/self/maps", "r");
	assert_non_null(maps);
	char line[8192];
	bool mapped = false;
	while (fgets(line, sizeof line, maps))
		mapped |= strstr(line, real) != NULL;
	fclose(maps);
	return mapped;
}

/* load_q4 of path with o must fail with code, leaving nothing mapped (before: the arena
 * mappings there were) and path let go; e holds the message. */
static void load_refused(const char *path, const struct load_opts *o, int code, int before, struct hearth_error *e)
{
	struct model_q4 *m = NULL;
	assert_int_equal(load_path(path, o, &m, e), code);
	assert_null(m);
	assert_int_equal(arena_mappings(), before);
	assert_false(file_mapped(path));
}

/* load_plan_size refuses alike, planning nothing. */
static void plan_refused(const char *path, const struct load_opts *o, int code, struct hearth_error *e)
{
	size_t planned = 1;
	assert_int_equal(load_plan_size(path, o, &planned, e), code);
	assert_int_equal(planned, 0);
}

/* A draft of another vocabulary (fx-llama's SentencePiece against GPT-2 BPE) is refused
 * before the arena is mapped, naming both files; so is a draft KV budget that holds no
 * block (naming the draft's budget and region); nothing is left mapped either way, and the
 * estimate refuses alike. */
static void test_load_refuses_a_draft_before_mapping_anything(void **state)
{
	(void)state;
	char path[4096], dpath[4096];
	fixture_path("fx-qwen3.gguf", path, sizeof path);
	fixture_path("fx-llama.gguf", dpath, sizeof dpath);
	struct load_opts o;
	small_opts(&o);
	o.arena.pages = ARENA_PAGES_NONE;
	o.draft = (struct load_draft_opts){ dpath, 1u << 20, false, vocab_same_size };
	struct ledger_load rec;
	o.load_record = &rec;
	int before = arena_mappings();
	struct hearth_error e;
	g_vocab_calls = 0;
	g_vocab_mappings = -1;
	load_refused(path, &o, HEARTH_EINVAL, before, &e);
	assert_false(rec.valid);
	assert_int_equal(g_vocab_calls, 1);
	assert_int_equal(g_vocab_mappings, before);
	assert_false(file_mapped(dpath));
	assert_non_null(strstr(e.msg, "draft_model"));
	assert_non_null(strstr(e.msg, "cannot draft for"));
	assert_non_null(strstr(e.msg, "32000"));
	plan_refused(path, &o, HEARTH_EINVAL, &e);
	assert_non_null(strstr(e.msg, "cannot draft for"));

	/* the same vocabulary, but a draft KV budget below one of its blocks */
	fixture_path("fx-qwen2.gguf", dpath, sizeof dpath);
	o.draft.kv_budget = 100;
	load_refused(path, &o, HEARTH_EINVAL, before, &e);
	assert_non_null(strstr(e.msg, "draft_kv_budget"));
	assert_non_null(strstr(e.msg, "draft.kv_pool"));
	assert_false(file_mapped(dpath));
}

static void imatrix_fixture(const char *name, char *buf, size_t cap)
{
	const char *src = getenv("HEARTH_SRCDIR");
	if (!src)
		fail_msg("HEARTH_SRCDIR is not set: run through make check");
	snprintf(buf, cap, "%s/tests/fixtures/imatrix/%s", src, name);
}

/* Sum over rows and columns of w[k] * (x - x')^2: the error an imatrix asks the search to
 * make small, of the int4 matrix q against the file's f32 rows. */
static double weighted_error(const struct q4_matrix *q, const float *x, const float *w)
{
	float *row = malloc(q->cols * sizeof *row);
	assert_non_null(row);
	double e = 0;
	for (size_t r = 0; r < q->rows; r++) {
		q4_unpack_rows(q, r, 1, row, q->cols);
		for (size_t k = 0; k < q->cols; k++) {
			double d = (double)x[r * q->cols + k] - row[k];
			e += w[k] * d * d;
		}
	}
	free(row);
	return e;
}

/* llama.cpp's imatrix of fx-llama (llama-imatrix's own file) steers the scale search of
 * every layer matrix: the layout is named for it, each matrix comes out closer to the
 * file's weights in the error the imatrix weighs (the search minimizes it; without the
 * imatrix it minimizes the plain one), the file is let go after the load, and the draft
 * (the same file here) is packed without it. */
static void test_load_imatrix_steers_the_scale_search(void **state)
{
	(void)state;
	char path[4096], ipath[4096];
	fixture_path("fx-llama.gguf", path, sizeof path);
	imatrix_fixture("fx-llama.imatrix.gguf", ipath, sizeof ipath);
	struct load_opts o;
	small_opts(&o);
	o.mix = LOAD_MIX_OFF;
	struct model_q4 *plain = load_fixture("fx-llama.gguf", &o);
	o.imatrix = ipath;
	o.draft = (struct load_draft_opts){ path, 1u << 20, false, NULL };
	struct model_q4 *m = load_fixture("fx-llama.gguf", &o);
	assert_false(file_mapped(ipath));
	/* 64 wide but ffn_down (160): group 64 row8 and group 32 */
	assert_string_equal(plain->quant_name, "q4_mixed");
	assert_string_equal(m->quant_name, "q4_mixed+imatrix");
	assert_true(m->layers[0].wq.row8 && !m->layers[0].down.row8);
	assert_int_equal(m->n_imatrix, m->n_layer * MQ4_LAYER_MATRICES);
	assert_int_equal(plain->n_imatrix, 0);
	assert_non_null(m->draft);
	assert_int_equal(m->draft->n_imatrix, 0);
	assert_string_equal(m->draft->quant_name, "q4_mixed");

	struct gguf_file *f;
	struct imatrix *im;
	struct hearth_error e;
	assert_int_equal(gguf_open(&f, path, &e), 0);
	assert_int_equal(imatrix_open(&im, ipath, &e), 0);
	static const char *const names[MQ4_LAYER_MATRICES] = { "attn_q", "attn_k", "attn_v", "attn_output",
								"ffn_gate", "ffn_up", "ffn_down" };
	int better = 0, n = 0;
	for (uint32_t l = 0; l < m->n_layer; l++) {
		const struct q4_matrix *a[MQ4_LAYER_MATRICES] = { &plain->layers[l].wq, &plain->layers[l].wk,
			&plain->layers[l].wv, &plain->layers[l].wo, &plain->layers[l].gate, &plain->layers[l].up,
			&plain->layers[l].down };
		const struct q4_matrix *b[MQ4_LAYER_MATRICES] = { &m->layers[l].wq, &m->layers[l].wk,
			&m->layers[l].wv, &m->layers[l].wo, &m->layers[l].gate, &m->layers[l].up,
			&m->layers[l].down };
		for (int i = 0; i < MQ4_LAYER_MATRICES; i++) {
			char name[64];
			snprintf(name, sizeof name, "blk.%u.%s.weight", l, names[i]);
			const struct gguf_tensor *t = gguf_tensor_find(f, name);
			const float *w;
			assert_non_null(t);
			assert_int_equal(t->type, QTYPE_F32);
			assert_int_equal(imatrix_weights(im, name, strlen(name), a[i]->cols, &w, &e), 0);
			assert_non_null(w);
			double ea = weighted_error(a[i], t->data, w), eb = weighted_error(b[i], t->data, w);
			better += eb < ea;
			n++;
			/* never much worse on any one matrix, and (below) better on nearly all */
			if (!(eb <= ea * 1.02))
				fail_msg("%s: weighted error %g with the imatrix, %g without", name, eb, ea);
		}
	}
	if (better < n - 1)
		fail_msg("the imatrix lowered the weighted error of only %d of %d matrices", better, n);
	imatrix_close(im);
	gguf_close(f);
	model_q4_free(m);
	model_q4_free(plain);
}

/* An imatrix that cannot serve the model fails the load before anything is mapped, and a
 * swap's plan says the same: a legacy file, and another model's statistics (fx-llama's
 * 64-wide rows against fx-quant-bf16's 256). */
static void test_load_refuses_a_bad_imatrix_before_mapping(void **state)
{
	(void)state;
	char path[4096], ipath[4096];
	struct load_opts o;
	small_opts(&o);
	o.arena.pages = ARENA_PAGES_NONE;
	int before = arena_mappings();
	struct hearth_error e;

	fixture_path("fx-llama.gguf", path, sizeof path);
	imatrix_fixture("fx-llama.imatrix.dat", ipath, sizeof ipath);
	o.imatrix = ipath;
	load_refused(path, &o, HEARTH_EFORMAT, before, &e);
	assert_non_null(strstr(e.msg, "fx-llama.imatrix.dat"));
	assert_non_null(strstr(e.msg, "--in-file"));

	fixture_path("fx-quant-bf16.gguf", path, sizeof path);
	imatrix_fixture("fx-llama.imatrix.gguf", ipath, sizeof ipath);
	load_refused(path, &o, HEARTH_EINVAL, before, &e);
	assert_non_null(strstr(e.msg, "blk.0.attn_q.weight"));
	assert_non_null(strstr(e.msg, "64 columns"));
	assert_non_null(strstr(e.msg, "256"));
	assert_false(file_mapped(ipath));
	plan_refused(path, &o, HEARTH_EINVAL, &e);
	assert_non_null(strstr(e.msg, "64 columns"));
}

/* fx-quant-f16 is 256 wide: its layers pack at group 128 and the default embedding/head at
 * group 32, so the group-32 activations are the head's alone, and the head reads only the
 * rows whose logits are wanted (at most max_seqs): that buffer holds max_seqs rows, not a
 * step's, and a head at group 128 plans none. */
static void test_load_sizes_the_heads_activations_for_the_logit_rows(void **state)
{
	(void)state;
	struct load_opts o;
	small_opts(&o);
	o.max_seqs = 2;
	o.step_tokens = 64;
	o.act = Q4_ACT_A8;
	o.weights_group = LOAD_GROUP_128;
	struct model_q4 *m = load_fixture("fx-quant-f16.gguf", &o);
	size_t E = m->hp.n_embd;
	assert_int_equal(E % 128, 0);
	assert_int_equal(m->layers[0].wq.group, 128);
	assert_int_equal(m->embd.group, 32);
	size_t g32 = m->acts_off[1] - m->acts_off[0]; /* the group-32 slot's bytes */
	assert_true(g32 > 0);
	assert_true(g32 < q4_acts_bytes(o.act, o.step_tokens, E, 32));
	assert_int_equal(m->acts_off[2], m->acts_off[1]); /* no group-64 matrix: no bytes */
	uint64_t scratch = m->bytes_scratch;
	model_q4_free(m);

	o.head_group = LOAD_GROUP_128;
	m = load_fixture("fx-quant-f16.gguf", &o);
	assert_int_equal(m->embd.group, 128);
	assert_int_equal(m->acts_off[1] - m->acts_off[0], 0);
	assert_int_equal(scratch - m->bytes_scratch, g32);
	model_q4_free(m);
}

/* The packed matrices of two loads are the same bytes: every weights and embed_head region
 * the same size, with the same contents. */
static void assert_same_weights(const struct model_q4 *a, const struct model_q4 *b)
{
	size_t seen = 0;
	for (size_t i = 0; i < a->arena->n_regions; i++) {
		const struct arena_region *ra = &a->arena->regions[i];
		if (strncmp(ra->name, ARENA_REGION_WEIGHTS, strlen(ARENA_REGION_WEIGHTS)) &&
		    strcmp(ra->name, ARENA_REGION_EMBED_HEAD))
			continue;
		const struct arena_region *rb = arena_region_find(b->arena, ra->name);
		assert_non_null(rb);
		assert_int_equal(ra->used, rb->used);
		if (memcmp(ra->base, rb->base, ra->used))
			fail_msg("region %s differs", ra->name);
		seen += ra->used;
	}
	assert_true(seen > 0);
	assert_string_equal(a->quant_name, b->quant_name);
	assert_int_equal(a->n_notes, b->n_notes);
	assert_int_equal(a->n_imatrix, b->n_imatrix);
}

static struct model_q4 *load_cached(const char *path, struct load_opts *o, struct load_cache_report *r)
{
	struct model_q4 *m;
	struct hearth_error e;
	o->cache_report = r;
	if (load_path(path, o, &m, &e) < 0)
		fail_msg("load_q4 %s: %s", path, e.msg);
	o->cache_report = NULL;
	return m;
}

/* weights_cache: the first load repacks and writes the file, the second reads it and gets
 * the very bytes of a load without it (an imatrix steering the search, a tied head: fx-llama
 * is untied, fx-qwen3 tied); the draft keeps no file of its own. */
static void test_load_weights_cache_gives_the_repacks_bytes(void **state)
{
	(void)state;
	const char *names[] = { "fx-llama.gguf", "fx-qwen3.gguf" };
	char dir[] = "/tmp/test_load_wc.XXXXXX";
	assert_non_null(mkdtemp(dir));
	for (size_t k = 0; k < 2; k++) {
		char path[4096], ipath[4096], cache[4200];
		fixture_path(names[k], path, sizeof path);
		imatrix_fixture("fx-llama.imatrix.gguf", ipath, sizeof ipath);
		snprintf(cache, sizeof cache, "%s/%zu.weights", dir, k);
		struct load_opts o;
		small_opts(&o);
		if (k == 0) {
			o.imatrix = ipath;
			o.draft = (struct load_draft_opts){ path, 1u << 20, false, NULL };
		}
		struct model_q4 *plain = load_fixture(names[k], &o);
		struct load_cache_report r;
		o.weights_cache = cache;
		struct model_q4 *first = load_cached(path, &o, &r);
		assert_int_equal(r.outcome, LOAD_CACHE_WRITTEN);
		assert_string_equal(r.refused, "");
		assert_true(r.bytes > 0);
		assert_same_weights(plain, first);
		struct model_q4 *second = load_cached(path, &o, &r);
		assert_int_equal(r.outcome, LOAD_CACHE_READ);
		assert_string_equal(r.refused, "");
		assert_same_weights(plain, second);
		if (k == 0) {
			assert_non_null(second->draft);
			assert_same_weights(plain->draft, second->draft);
		}
		model_q4_free(plain);
		model_q4_free(first);
		model_q4_free(second);
		unlink(cache);
	}
	assert_int_equal(rmdir(dir), 0); /* nothing else was left there: no parts, no draft file */
}

/* A file that will not do costs a repack, never the load, and is written anew: its payload
 * overwritten (read whole, then refused by the checksum: the matrices must come out as a
 * fresh repack's, padding included), another layout's file, a cut one; a directory
 * that does not exist leaves the load whole and says why nothing was written. */
static void test_load_weights_cache_refuses_what_will_not_do(void **state)
{
	(void)state;
	char path[4096], cache[4200], bad[4200];
	fixture_path("fx-llama.gguf", path, sizeof path);
	char dir[] = "/tmp/test_load_wc.XXXXXX";
	assert_non_null(mkdtemp(dir));
	snprintf(cache, sizeof cache, "%s/m.weights", dir);
	struct load_opts o;
	small_opts(&o);
	struct model_q4 *plain = load_fixture("fx-llama.gguf", &o);
	struct load_cache_report r;
	o.weights_cache = cache;
	model_q4_free(load_cached(path, &o, &r));
	assert_int_equal(r.outcome, LOAD_CACHE_WRITTEN);

	FILE *f = fopen(cache, "r+b");
	assert_non_null(f);
	assert_int_equal(fseek(f, 0, SEEK_END), 0);
	long size = ftell(f);
	/* every payload byte (the header's 64 bytes and the 8 of the checksum kept) */
	assert_int_equal(fseek(f, 64, SEEK_SET), 0);
	for (long i = 64; i < size - 8; i++)
		fputc(0xa5, f);
	fclose(f);
	struct model_q4 *m = load_cached(path, &o, &r);
	assert_int_equal(r.outcome, LOAD_CACHE_WRITTEN);
	assert_non_null(strstr(r.refused, "its contents do not match their checksum"));
	assert_non_null(strstr(r.refused, cache));
	assert_same_weights(plain, m);
	model_q4_free(m);
	m = load_cached(path, &o, &r);
	assert_int_equal(r.outcome, LOAD_CACHE_READ);
	model_q4_free(m);

	/* group 128: the key differs */
	o.weights_group = LOAD_GROUP_128;
	o.weights_cache = NULL;
	struct model_q4 *plain128 = load_fixture("fx-llama.gguf", &o);
	o.weights_cache = cache;
	m = load_cached(path, &o, &r);
	assert_int_equal(r.outcome, LOAD_CACHE_WRITTEN);
	assert_non_null(strstr(r.refused, "made for another model file, imatrix, layout or hearthd version"));
	assert_same_weights(plain128, m);
	model_q4_free(m);
	model_q4_free(plain128);
	o.weights_group = LOAD_GROUP_64;
	model_q4_free(load_cached(path, &o, &r));
	assert_int_equal(r.outcome, LOAD_CACHE_WRITTEN);

	/* cut by one byte */
	assert_int_equal(truncate(cache, size - 1), 0);
	m = load_cached(path, &o, &r);
	assert_int_equal(r.outcome, LOAD_CACHE_WRITTEN);
	assert_non_null(strstr(r.refused, "bytes where its header says"));
	assert_same_weights(plain, m);
	model_q4_free(m);

	/* not a packed-weights file at all */
	f = fopen(cache, "wb");
	assert_non_null(f);
	for (int i = 0; i < 4096; i++)
		fputc(i * 7, f);
	fclose(f);
	m = load_cached(path, &o, &r);
	assert_int_equal(r.outcome, LOAD_CACHE_WRITTEN);
	assert_non_null(strstr(r.refused, "not a packed-weights file"));
	model_q4_free(m);

	snprintf(bad, sizeof bad, "%s/no/such/dir/m.weights", dir);
	o.weights_cache = bad;
	m = load_cached(path, &o, &r);
	assert_int_equal(r.outcome, LOAD_CACHE_UNWRITTEN);
	assert_string_equal(r.refused, "");
	assert_non_null(strstr(r.unwritten, bad));
	assert_same_weights(plain, m);
	model_q4_free(m);
	model_q4_free(plain);
	unlink(cache);
	assert_int_equal(rmdir(dir), 0);
}

/* With weights_cache the imatrix's values wait until the packed weights are known not to
 * come from the file: a start that reads them never reads the values (here one is made NaN
 * in place, the file's identity kept), and one that must repack checks them before
 * anything is mapped, as without the cache. */
static void test_load_weights_cache_defers_the_imatrix_values(void **state)
{
	(void)state;
	char path[4096], src[4096], dir[] = "/tmp/test_load_wc.XXXXXX", ipath[4200], cache[4200];
	fixture_path("fx-llama.gguf", path, sizeof path);
	imatrix_fixture("fx-llama.imatrix.gguf", src, sizeof src);
	assert_non_null(mkdtemp(dir));
	snprintf(ipath, sizeof ipath, "%s/m.imatrix.gguf", dir);
	snprintf(cache, sizeof cache, "%s/m.weights", dir);
	char cmd[9000];
	snprintf(cmd, sizeof cmd, "cp '%s' '%s'", src, ipath);
	assert_int_equal(system(cmd), 0);
	struct load_opts o;
	small_opts(&o);
	o.arena.pages = ARENA_PAGES_NONE;
	o.imatrix = ipath;
	o.weights_cache = cache;
	struct load_cache_report r;
	struct model_q4 *good = load_cached(path, &o, &r);
	assert_int_equal(r.outcome, LOAD_CACHE_WRITTEN);

	/* a NaN in the first statistic, the modification time put back */
	struct stat st;
	assert_int_equal(stat(ipath, &st), 0);
	struct gguf_file *f;
	struct hearth_error e;
	assert_int_equal(gguf_open(&f, ipath, &e), 0);
	const struct gguf_tensor *t = NULL;
	for (uint64_t i = 0; i < f->n_tensors && !t; i++)
		if (strstr(f->tensors[i].name.ptr, ".in_sum2"))
			t = &f->tensors[i];
	assert_non_null(t);
	long off = (long)((const uint8_t *)t->data - f->map);
	gguf_close(f);
	FILE *fp = fopen(ipath, "r+b");
	assert_non_null(fp);
	float nan = NAN;
	assert_int_equal(fseek(fp, off, SEEK_SET), 0);
	assert_int_equal(fwrite(&nan, sizeof nan, 1, fp), 1);
	fclose(fp);
	struct timespec times[2] = { st.st_atim, st.st_mtim };
	assert_int_equal(utimensat(AT_FDCWD, ipath, times, 0), 0);

	struct model_q4 *m = load_cached(path, &o, &r);
	assert_int_equal(r.outcome, LOAD_CACHE_READ);
	assert_same_weights(good, m);
	model_q4_free(m);

	int before = arena_mappings();
	unlink(cache);
	load_refused(path, &o, HEARTH_EFORMAT, before, &e);
	assert_non_null(strstr(e.msg, "in_sum2[0] is nan"));
	assert_non_null(strstr(e.msg, ipath));
	assert_true(access(cache, F_OK) < 0);
	/* refused by the plan, which maps nothing: before the arena */
	plan_refused(path, &o, HEARTH_EFORMAT, &e);
	assert_non_null(strstr(e.msg, "in_sum2[0] is nan"));
	model_q4_free(good);
	unlink(ipath);
	assert_int_equal(rmdir(dir), 0);
}

/* The packers' bytes and PACK_CACHE_FORMAT move together: a weights_cache file is keyed by
 * the format and the hearthd version, not by the code that rounded it, so a packer that
 * writes other bytes for the same model and options must bump the format, or a daemon built
 * from it would serve an older build's rounding from its cache. This holds the packed bytes
 * of two fixtures (every layout the default plan gives them: row8 group 64, group 32, int6
 * and int8 by the mix rule, the head) to the hashes recorded with the format. */
static void test_load_packed_bytes_move_with_the_cache_format(void **state)
{
	(void)state;
	const struct {
		unsigned format;
		const char *fixture;
		uint64_t hash;
	} known[] = {
		{ 1, "fx-llama.gguf", 0xa48652a7325ad0d8ull },
		{ 1, "fx-qwen3.gguf", 0x70579a4a9ac6e542ull },
	};
	for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) {
		struct load_opts o;
		small_opts(&o);
		struct model_q4 *m = load_fixture(known[k].fixture, &o);
		struct pack_hash h;
		pack_hash_init(&h);
		for (size_t i = 0; i < m->arena->n_regions; i++) {
			const struct arena_region *r = &m->arena->regions[i];
			if (!strncmp(r->name, ARENA_REGION_WEIGHTS, strlen(ARENA_REGION_WEIGHTS)) ||
			    !strcmp(r->name, ARENA_REGION_EMBED_HEAD))
				pack_hash_add(&h, r->base, r->used);
		}
		uint64_t got = pack_hash_end(&h);
		if (known[k].format != PACK_CACHE_FORMAT || got != known[k].hash)
			fail_msg("%s packs to %016llx under PACK_CACHE_FORMAT %u (recorded: %016llx under %u): a packer "
				 "that changes its bytes bumps PACK_CACHE_FORMAT (daemon/engine/pack_cache.h) and records "
				 "the new hashes here",
				 known[k].fixture, (unsigned long long)got, PACK_CACHE_FORMAT,
				 (unsigned long long)known[k].hash, known[k].format);
		model_q4_free(m);
	}
}

int main(void)
{
	if (kern_select(getenv("HEARTH_KERNELS")) < 0) {
		fprintf(stderr, "HEARTH_KERNELS names no usable kernel set\n");
		return 1;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_load_stores_tied_embedding_once),
		cmocka_unit_test(test_load_puts_weights_in_one_region_per_type),
		cmocka_unit_test(test_load_weights_group_32_packs_layers_sym_group_32),
		cmocka_unit_test(test_load_default_packs_the_head_at_group_32_asym),
		cmocka_unit_test(test_load_int8_head_sizes_embed_head_exactly),
		cmocka_unit_test(test_load_int6_head_sizes_embed_head_exactly),
		cmocka_unit_test(test_load_repack_on_threads_gives_the_same_bytes),
		cmocka_unit_test(test_load_sizes_rope_by_max_context),
		cmocka_unit_test(test_load_peak_is_small_and_the_sampler_sees_a_transient),
		cmocka_unit_test(test_load_reports_a_kv_budget_too_small_for_one_block),
		cmocka_unit_test(test_load_reports_the_page_kind_it_got),
		cmocka_unit_test(test_load_reports_numa_placement),
		cmocka_unit_test(test_load_lets_the_file_go),
		cmocka_unit_test(test_load_puts_the_draft_in_the_models_one_arena),
		cmocka_unit_test(test_load_refuses_a_draft_before_mapping_anything),
		cmocka_unit_test(test_load_sizes_the_heads_activations_for_the_logit_rows),
		cmocka_unit_test(test_load_mix_rule_spends_the_budget_in_its_order),
		cmocka_unit_test(test_load_imatrix_steers_the_scale_search),
		cmocka_unit_test(test_load_refuses_a_bad_imatrix_before_mapping),
		cmocka_unit_test(test_load_weights_cache_gives_the_repacks_bytes),
		cmocka_unit_test(test_load_weights_cache_refuses_what_will_not_do),
		cmocka_unit_test(test_load_weights_cache_defers_the_imatrix_values),
		cmocka_unit_test(test_load_packed_bytes_move_with_the_cache_format),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
