/* Plan, map, repack, release. The reference model (daemon/model.c) reads and validates the
 * file's structure; this file turns its tensor views into the int4 layout (the embedding/head
 * int6 or int8 with head_bits 6 or 8) inside the arena, 16 rows at a time, and then lets the
 * file go so the settled process holds only the arena. */
#include "daemon/engine/load.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/engine/gguf.h"
#include "daemon/engine/imatrix.h"
#include "daemon/engine/ledger.h"
#include "daemon/engine/model.h"
#include "daemon/engine/pack_cache.h"
#include "daemon/engine/tokenizer.h"
#include "protocol/assert.h"
#include "protocol/hash.h"
#include "kernels/dispatch.h"
#include "kernels/gptq.h"
#include "kernels/pool.h"

#define LOAD_ROWS Q4_ROWS          /* rows one thread dequantizes and packs per step */
/* Threads the repack uses at most: each holds LOAD_ROWS rows of f32 scratch, and two to
 * eight of them already turn the repack from compute into reading the file. */
#define LOAD_REPACK_THREADS_MAX 8
/* Source bytes read between two releases of the file's pages. The repack reads each tensor
 * once, front to back; giving its pages back every few MiB (rather than per tensor) keeps
 * the file's share of RSS and of the page cache at a few MiB even for the 600 MB bf16
 * embedding of a 1.7B model. */
#define LOAD_RELEASE_BYTES ((size_t)8 << 20)
#define LOAD_SAMPLE_MS 10          /* the ledger sampler's interval while loading */

void load_opts_default(struct load_opts *o)
{
	memset(o, 0, sizeof *o);
	o->max_context = LOAD_DEFAULT_MAX_CONTEXT;
	o->kv_budget = (uint64_t)LOAD_DEFAULT_KV_BUDGET_MIB << 20;
	o->kv_type = QTYPE_F16;
	o->max_seqs = LOAD_DEFAULT_MAX_SEQS;
	o->step_tokens = LOAD_DEFAULT_STEP_TOKENS;
	o->arena = (struct arena_config)ARENA_CONFIG_DEFAULT;
	o->act = Q4_ACT_A16;
	o->weights_group = LOAD_GROUP_64;
}

/* The embedding/head is where 4 bits cost the most (a tied one serves as both, and its
 * error reaches the logits directly): at group 32 it takes a quarter of group 128's mean KL
 * off on the trained models (doc/benchmarks.md, Fidelity on a trained model) for 0.75 bits
 * more on its own weights, a few percent of a model's. Beside group-128 layers it is
 * asymmetric (as they are, 5.0 bits); with group-32 layers symmetric, Q4_0's bits. */
uint32_t load_head_group(uint32_t weights_group)
{
	return weights_group == LOAD_GROUP_32 ? LOAD_GROUP_32 : LOAD_GROUP_32_ASYM;
}

/* The group matrices of cols columns are quantized at for want: 32 for either group-32
 * layout, else want's group where it divides the rows, else 32. */
static uint32_t load_fit_group(uint32_t want, size_t cols)
{
	return (want == LOAD_GROUP_64 || want == LOAD_GROUP_128) && cols % want == 0 ? want : 32;
}

/* How a source tensor enters the layout: carried-over codes where the layout holds them
 * exactly (or, for Q4_K, with only its scales rounded to fp16), else quantized afresh at
 * `want`: group 128 asymmetric, group 64 asymmetric with 8-bit scale codes (row8; either
 * at group 32 asymmetric where rows are not a multiple of the group), group 32 symmetric,
 * or group 32 asymmetric (LOAD_GROUP_32_ASYM). */
static void load_choose(enum qtype src, size_t cols, uint32_t want, uint32_t *group, bool *asym,
			bool *carry, bool *row8)
{
	*carry = false;
	*asym = true;
	*row8 = false;
	switch (src) {
	case QTYPE_Q4_0:
		*group = 32;
		*asym = false;
		*carry = true;
		return;
	case QTYPE_Q4_1:
	case QTYPE_Q4_K:
		*group = 32;
		*carry = true;
		return;
	default:
		*group = load_fit_group(want, cols);
		*asym = want != LOAD_GROUP_32;
		*row8 = *group == 64;
		return;
	}
}

/* Plans dst for t as load_choose said. */
static int load_plan_q4(struct q4_matrix *dst, const struct gguf_tensor *t, uint32_t group, bool asym, bool row8)
{
	size_t rows = (size_t)(t->n_elems / t->ne[0]), cols = (size_t)t->ne[0];
	return row8 ? q4_matrix_plan_row8(dst, rows, cols, group) : q4_matrix_plan(dst, rows, cols, group, asym);
}

/* How a source tensor enters the int8 layout (an int8 embedding/head or a layer matrix the
 * mix rule upgrades): Q8_0 carried over exactly at group 32; anything else dequantized and
 * packed at `want` (group 32 where rows are not a multiple of it). */
static void load_choose8(enum qtype src, size_t cols, uint32_t want, uint32_t *group, bool *carry)
{
	*carry = src == QTYPE_Q8_0;
	*group = *carry ? 32 : load_fit_group(want, cols);
}

/* The group of the mix rule's int8 layer copies beside layers at weights group want: the
 * layers' own group 64, so one activation buffer serves both (a third would cost a step's
 * worth of scratch), else 128. */
static uint32_t load_group8(uint32_t want)
{
	return want == LOAD_GROUP_64 ? LOAD_GROUP_64 : LOAD_GROUP_128;
}

/* What one matrix will need, before the arena exists: dst for the int4 layout, dst6 for
 * the int6 one or dst8 for the int8 one (the others NULL). */
struct load_mat {
	const struct gguf_tensor *t;
	struct q4_matrix *dst;
	struct q6_matrix *dst6;
	struct q8_matrix *dst8;
	const char *region;
	uint32_t group;
	bool asym, carry, row8;
	const float *col_w;     /* importance of each column (the imatrix), or NULL */
	struct imatrix_cov cov; /* its input's covariance (the imatrix's NAME.in_cov): GPTQ */
};

static size_t load_mat_rows(const struct load_mat *lm)
{
	return lm->dst8 ? lm->dst8->rows : lm->dst6 ? lm->dst6->rows : lm->dst->rows;
}

static size_t load_mat_blocks(const struct load_mat *lm)
{
	return lm->dst8 ? lm->dst8->n_row_blocks : lm->dst6 ? lm->dst6->n_row_blocks : lm->dst->n_row_blocks;
}

/* One model being loaded (the model, or the draft loaded into its arena): its file, the
 * reference view and tokenizer read from it, the options it is loaded with, its plan's
 * matrices and KV configuration, and where its regions go. */
struct load_ctx {
	const struct load_opts *o;      /* &opts */
	struct load_opts opts;          /* a draft's follow the model's (load_draft_ctx_init) */
	struct gguf_file *file;
	struct model *ref;
	struct tok *tok;
	struct model_q4 *m;
	struct kv_config kvc;           /* owns layer_shapes until the fill */
	struct arena *arena;            /* the one arena, once mapped */
	const char *prefix;             /* of its region names: "" or ARENA_DRAFT_PREFIX */
	const char *phase;              /* the progress callback's phase while repacking */
	char kv_region[ARENA_NAME_MAX]; /* kvc.region */
	const struct model_q4 *pool_of; /* a draft steps on its model's pool; NULL: its own */
	struct load_mat *mats;
	size_t n_mats, cap_mats;
	uint64_t total_bytes, done_bytes;
	float *rows;                    /* per repack thread, LOAD_ROWS x widest row: the only
					 * big transient */
	size_t rows_cap;
	size_t repack_threads;          /* pool threads that take part in the repack */
	size_t acts_total;              /* every group's activation buffer (model_q4.h acts_off) */
	bool *mix8;                     /* n_layer x MQ4_LAYER_MATRICES: int8 by the mix rule */
	struct imatrix *imat;           /* opts.imatrix while the model is planned and filled */
	const float *gptq_of;           /* the covariance gptq_u was factored from */
	float *gptq_u;                  /* its GPTQ factor (cols x block): the repack's transient,
					 * kept while consecutive matrices share the input */
	size_t threads_max;             /* compute threads the scratch is planned for */
	uint64_t cache_key;             /* the packed-weights file's key and payload bytes, */
	uint64_t cache_bytes;           /* set (cache_keyed) when opts.weights_cache names one */
	bool cache_keyed;
	struct pack_cache *cache_in;    /* that file, open when its header matched the plan */
	struct load_cache_report cache; /* what became of it, for opts.cache_report */
	bool imat_checked;              /* imat's values checked (imatrix_check) */
};

/* Threads the pool may have: what the caller asked for, else every CPU the machine has
 * (the node's CPUs are a subset), so the per-thread scratch is not planned for
 * MQ4_THREADS_MAX. */
static size_t load_threads_max(const struct load_opts *o)
{
	long cpus = sysconf(_SC_NPROCESSORS_CONF);
	size_t n = o->n_threads ? o->n_threads : cpus > 0 ? (size_t)cpus : 1;
	return n > MQ4_THREADS_MAX ? MQ4_THREADS_MAX : n;
}

static struct load_mat *load_mat_new(struct load_ctx *c, const struct gguf_tensor *t,
				     struct hearth_error *err)
{
	if (c->n_mats == c->cap_mats) {
		size_t cap = c->cap_mats ? c->cap_mats * 2 : 64;
		struct load_mat *n = realloc(c->mats, cap * sizeof *n);
		if (!n) {
			hearth_error_set(err, HEARTH_ENOMEM, "loader: out of memory");
			return NULL;
		}
		c->mats = n;
		c->cap_mats = cap;
	}
	struct load_mat *lm = &c->mats[c->n_mats++];
	memset(lm, 0, sizeof *lm);
	lm->t = t;
	c->total_bytes += t->size;
	if (t->ne[0] > c->rows_cap)
		c->rows_cap = t->ne[0];
	return lm;
}

/* Whether the imatrix's entry for t, if it has one, is about t's input: not for an untied
 * model's embedding, which is only looked up (no input), whatever a file says of it. */
static bool load_imat_applies(const struct load_ctx *c, const struct gguf_tensor *t)
{
	return c->imat && (t != c->ref->tok_embd || c->ref->hp.tied_output);
}

static int load_add_mat(struct load_ctx *c, const struct gguf_tensor *t, struct q4_matrix *dst,
			const char *region, uint32_t want, struct hearth_error *err)
{
	struct load_mat *lm = load_mat_new(c, t, err);
	if (!lm)
		return HEARTH_ENOMEM;
	lm->dst = dst;
	load_choose(t->type, t->ne[0], want, &lm->group, &lm->asym, &lm->carry, &lm->row8);
	/* Layer matrices go to one region per packed type, so the ledger shows them apart. */
	lm->region = region                ? region
		     : lm->group == 128 ? LOAD_REGION_WEIGHTS_G128
		     : lm->group == 64  ? LOAD_REGION_WEIGHTS_G64
					: LOAD_REGION_WEIGHTS_G32;
	if (t->ne[0] % lm->group)
		return hearth_error_set(err, HEARTH_EUNSUPPORTED,
					"tensor '%.*s': rows of %llu are not a multiple of 32, which the int4 layout needs",
					(int)t->name.len, t->name.ptr, (unsigned long long)t->ne[0]);
	int rc = load_plan_q4(dst, t, lm->group, lm->asym, lm->row8);
	if (rc < 0)
		return hearth_error_set(err, rc, "tensor '%.*s': cannot plan its int4 layout (%s)",
					(int)t->name.len, t->name.ptr, hearth_strerror(rc));
	/* Only a requantized asymmetric matrix has a scale search to steer. */
	if (load_imat_applies(c, t) && lm->asym && !lm->carry) {
		if ((rc = imatrix_weights(c->imat, t->name.ptr, t->name.len, t->ne[0], &lm->col_w, err)) < 0)
			return rc;
		c->m->n_imatrix += lm->col_w != NULL;
	}
	/* GPTQ rounds any requantized int4 matrix, sym or asym, whose input it has. */
	if (load_imat_applies(c, t) && !lm->carry) {
		if ((rc = imatrix_cov(c->imat, t->name.ptr, t->name.len, t->ne[0], &lm->cov, err)) < 0)
			return rc;
		c->m->n_gptq += lm->cov.h != NULL;
	}
	return 0;
}

/* A matrix in the int8 layout: the embedding/head (ARENA_REGION_EMBED_HEAD) or a layer
 * matrix the mix rule chose (LOAD_REGION_WEIGHTS_Q8). */
static int load_add_mat8(struct load_ctx *c, const struct gguf_tensor *t, struct q8_matrix *dst,
			 const char *region, uint32_t want, struct hearth_error *err)
{
	struct load_mat *lm = load_mat_new(c, t, err);
	if (!lm)
		return HEARTH_ENOMEM;
	lm->dst8 = dst;
	lm->region = region;
	load_choose8(t->type, t->ne[0], want, &lm->group, &lm->carry);
	if (t->ne[0] % lm->group)
		return hearth_error_set(err, HEARTH_EUNSUPPORTED,
					"tensor '%.*s': rows of %llu are not a multiple of 32, which the int8 layout needs",
					(int)t->name.len, t->name.ptr, (unsigned long long)t->ne[0]);
	int rc = q8_matrix_plan(dst, t->ne[1] * t->ne[2] * t->ne[3], t->ne[0], lm->group);
	if (rc < 0)
		return hearth_error_set(err, rc, "tensor '%.*s': cannot plan its int8 layout (%s)",
					(int)t->name.len, t->name.ptr, hearth_strerror(rc));
	return 0;
}

/* The embedding/head in the int6 layout (ARENA_REGION_EMBED_HEAD): always quantized from
 * f32 rows at group 32, whatever the file's type (no 6-bit type is carried over), by GPTQ
 * when the imatrix holds its input's covariance. */
static int load_add_mat6(struct load_ctx *c, const struct gguf_tensor *t, struct q6_matrix *dst,
			 struct hearth_error *err)
{
	struct load_mat *lm = load_mat_new(c, t, err);
	if (!lm)
		return HEARTH_ENOMEM;
	lm->dst6 = dst;
	lm->region = ARENA_REGION_EMBED_HEAD;
	lm->group = Q6_GROUP;
	if (t->ne[0] % Q6_GROUP)
		return hearth_error_set(err, HEARTH_EUNSUPPORTED,
					"tensor '%.*s': rows of %llu are not a multiple of 32, which the int6 layout needs",
					(int)t->name.len, t->name.ptr, (unsigned long long)t->ne[0]);
	int rc = q6_matrix_plan(dst, t->ne[1] * t->ne[2] * t->ne[3], t->ne[0]);
	if (rc < 0)
		return hearth_error_set(err, rc, "tensor '%.*s': cannot plan its int6 layout (%s)",
					(int)t->name.len, t->name.ptr, hearth_strerror(rc));
	/* GPTQ rounds it too when the imatrix has its input (a self-sampled file has the head's). */
	if (load_imat_applies(c, t)) {
		if ((rc = imatrix_cov(c->imat, t->name.ptr, t->name.len, t->ne[0], &lm->cov, err)) < 0)
			return rc;
		c->m->n_gptq += lm->cov.h != NULL;
	}
	return 0;
}

static size_t align64(size_t n)
{
	return (n + 63) & ~(size_t)63;
}

static size_t vec_bytes(const struct gguf_tensor *t)
{
	return t ? align64((size_t)t->n_elems * sizeof(float)) : 0;
}

/* A region's name in the arena: base itself for the model, under ARENA_DRAFT_PREFIX for
 * its draft ("draft.norms"), so one arena holds both and the ledger tells them apart. */
struct load_region_name {
	char s[ARENA_NAME_MAX];
};

static struct load_region_name load_region(const struct load_ctx *c, const char *base)
{
	struct load_region_name n;
	snprintf(n.s, sizeof n.s, "%s%s", c->prefix, base);
	return n;
}

/* The file's pages of [from, to), a stretch already consumed (gguf_release). */
static void load_release(const struct load_ctx *c, const void *from, const void *to, bool inward)
{
	gguf_release(c->file, from, to, inward, false);
}

/* A small f32 vector (norm weight, bias) copied into the arena's norms region. */
static int load_vec(struct load_ctx *c, const struct gguf_tensor *t, const float **out,
		    struct hearth_error *err)
{
	*out = NULL;
	if (!t)
		return 0;
	void *p;
	int rc = arena_alloc(c->arena, load_region(c, ARENA_REGION_NORMS).s, vec_bytes(t), 64, &p, err);
	if (rc < 0)
		return rc;
	quant_dequant_row(t->type, t->data, p, (size_t)t->n_elems);
	/* The fault that read it may have mapped a whole large folio of neighbours (Linux
	 * maps entire page-cache folios on fault-around); vectors go before the repack, so
	 * the matrices' streaming releases those neighbours, and this releases the rest. */
	load_release(c, t->data, (const uint8_t *)t->data + t->size, false);
	*out = p;
	return 0;
}

/* One step of the repack: row blocks [blk0, blk0 + n_blk) of one matrix, one block per
 * thread, each dequantized into that thread's own scratch rows. Blocks own whole cache
 * lines of the packed matrix, so the threads never write the same bytes. */
struct load_step {
	struct load_ctx *c;
	const struct load_mat *lm;
	size_t row_bytes, blk0, n_blk;
	int rc;                         /* set by a thread whose carry-over failed */
};

static void load_step_run(void *arg, size_t t, size_t nt)
{
	struct load_step *st = arg;
	const struct load_mat *lm = st->lm;
	struct q4_matrix *q = lm->dst;
	const struct gguf_tensor *tn = lm->t;
	size_t n_rows = load_mat_rows(lm), cols = (size_t)tn->ne[0];
	for (size_t b = st->blk0 + t; b < st->blk0 + st->n_blk; b += nt) {
		size_t r0 = b * LOAD_ROWS;
		size_t n = n_rows - r0 < LOAD_ROWS ? n_rows - r0 : LOAD_ROWS;
		const uint8_t *s = (const uint8_t *)tn->data + r0 * st->row_bytes;
		int rc = 0;
		if (lm->carry) {
			if (lm->dst8)
				rc = q8_pack_rows_q8_0(lm->dst8, s, r0, n);
			else if (tn->type == QTYPE_Q4_0)
				rc = q4_pack_rows_q4_0(q, s, r0, n);
			else if (tn->type == QTYPE_Q4_1)
				rc = q4_pack_rows_q4_1(q, s, r0, n);
			else
				rc = q4_pack_rows_q4_k(q, s, r0, n);
		} else {
			/* Each thread owns LOAD_ROWS scratch rows, planned for repack_threads. */
			hearth_assert(t < st->c->repack_threads);
			float *rows = st->c->rows + t * LOAD_ROWS * st->c->rows_cap;
			for (size_t i = 0; i < n; i++)
				quant_dequant_row(tn->type, s + i * st->row_bytes, rows + i * cols, cols);
			if (lm->dst8)
				q8_pack_rows_f32(lm->dst8, rows, cols, r0, n);
			else if (lm->dst6 && lm->cov.h)
				q6_pack_rows_gptq(lm->dst6, rows, cols, st->c->gptq_u, lm->cov.block, r0, n,
						  kern_active()->gptq);
			else if (lm->dst6)
				q6_pack_rows_f32(lm->dst6, rows, cols, r0, n);
			else if (lm->cov.h)
				q4_pack_rows_gptq(q, rows, cols, lm->col_w, st->c->gptq_u, lm->cov.block, r0, n,
						  kern_active()->gptq, kern_active()->search);
			else
				q4_pack_rows_f32_k(q, rows, cols, lm->col_w, r0, n, kern_active()->search);
		}
		if (rc < 0)
			__atomic_store_n(&st->rc, rc, __ATOMIC_RELAXED);
	}
}

/* The GPTQ factor's blocks shared among the pool's threads (single-threaded it was an
 * eighth of a GPTQ load of the Qwen3-1.7B shape). */
struct load_factor {
	const struct load_mat *lm;
	float *u;
	double add;
	int rc;                         /* set by a thread whose blocks failed */
};

static void load_factor_run(void *arg, size_t t, size_t nt)
{
	struct load_factor *f = arg;
	const struct load_mat *lm = f->lm;
	if (gptq_factor_blocks_part(lm->cov.h, (size_t)lm->t->ne[0], lm->cov.block, f->add, lm->cov.tokens, f->u, t,
				    nt) < 0)
		__atomic_store_n(&f->rc, -1, __ATOMIC_RELAXED);
}

/* The GPTQ factor of lm's input, unless the previous matrix's was the same input (q, k and
 * v; gate and up are planned one after the other). */
static int load_gptq_factor(struct load_ctx *c, const struct load_mat *lm, struct hearth_error *err)
{
	size_t cols = (size_t)lm->t->ne[0], block = lm->cov.block;
	if (!lm->cov.h || lm->cov.h == c->gptq_of)
		return 0;
	free(c->gptq_u);
	c->gptq_of = NULL;
	c->gptq_u = malloc(cols * block * sizeof *c->gptq_u);
	if (!c->gptq_u)
		return hearth_error_set(err, HEARTH_ENOMEM, "tensor '%.*s': out of memory for its GPTQ factor (%zu x %zu)",
					(int)lm->t->name.len, lm->t->name.ptr, cols, block);
	struct load_factor f = { lm, c->gptq_u, gptq_damping(lm->cov.h, cols, block, lm->cov.tokens), 0 };
	if (c->m->pool && cols > block)
		pool_run(c->m->pool, load_factor_run, &f);
	else
		load_factor_run(&f, 0, 1);
	if (f.rc < 0)
		return hearth_error_set(err, HEARTH_EINVAL,
					"imatrix %s: the covariance of '%.*s''s input is not positive definite (or no memory to factor it)",
					c->opts.imatrix, (int)lm->t->name.len, lm->t->name.ptr);
	c->gptq_of = lm->cov.h;
	/* The factor is all the packing reads of it. */
	imatrix_release(c->imat, &lm->cov, cols);
	return 0;
}

/* Where lm's packed bytes go, and how many. */
static uint8_t **load_mat_data(const struct load_mat *lm, size_t *bytes)
{
	if (lm->dst8) {
		*bytes = q8_matrix_bytes(lm->dst8);
		return &lm->dst8->data;
	}
	if (lm->dst6) {
		*bytes = q6_matrix_bytes(lm->dst6);
		return &lm->dst6->data;
	}
	*bytes = q4_matrix_bytes(lm->dst);
	return &lm->dst->data;
}

/* lm's place in the arena, and its note for the model's facts. */
static int load_mat_place(struct load_ctx *c, const struct load_mat *lm, struct hearth_error *err)
{
	size_t bytes;
	uint8_t **data = load_mat_data(lm, &bytes);
	int rc = arena_alloc(c->arena, load_region(c, lm->region).s, bytes, Q4_ALIGN, (void **)data, err);
	if (rc < 0)
		return rc;
	struct model_q4 *m = c->m;
	const struct gguf_tensor *t = lm->t;
	/* load_model_new sized the notes for every matrix load_plan can add. */
	hearth_assert(m->notes && m->n_notes < c->n_mats);
	struct mq4_tensor_note *nt = &m->notes[m->n_notes++];
	snprintf(nt->name, sizeof nt->name, "%.*s", (int)t->name.len, t->name.ptr);
	nt->src = t->type;
	nt->group = lm->group;
	nt->carried = lm->carry;
	nt->asym = lm->asym;
	nt->bits = lm->dst8 ? 8 : lm->dst6 ? 6 : 4;
	return 0;
}

/* One more matrix's source bytes done, for the progress callback. */
static void load_mat_done(struct load_ctx *c, const struct load_mat *lm, const char *phase)
{
	c->done_bytes += lm->t->size;
	if (c->o->progress)
		c->o->progress(c->o->progress_ctx, phase, c->m->notes[lm - c->mats].name, c->done_bytes,
			       c->total_bytes);
}

static int load_repack(struct load_ctx *c, struct load_mat *lm, struct hearth_error *err)
{
	int rc;
	if ((rc = load_gptq_factor(c, lm, err)) < 0)
		return rc;
	size_t n_blocks = load_mat_blocks(lm), rows = load_mat_rows(lm);
	const struct gguf_tensor *t = lm->t;
	size_t row_bytes;
	qtype_row_bytes(t->type, t->ne[0], &row_bytes);
	const uint8_t *src = t->data;
	const uint8_t *released = src;
	struct load_step st = { .c = c, .lm = lm, .row_bytes = row_bytes };
	/* A step is one row block per repack thread; the file's pages are given back between
	 * steps, so what is mapped at once stays LOAD_RELEASE_BYTES plus one step. */
	for (size_t b0 = 0; b0 < n_blocks; b0 += c->repack_threads) {
		st.blk0 = b0;
		st.n_blk = n_blocks - b0 < c->repack_threads ? n_blocks - b0 : c->repack_threads;
		if (st.n_blk > 1 && c->m->pool)
			pool_run(c->m->pool, load_step_run, &st);
		else
			load_step_run(&st, 0, 1);
		if (st.rc < 0)
			return hearth_error_set(err, HEARTH_EINVAL, "tensor '%.*s': carry-over failed",
						(int)t->name.len, t->name.ptr);
		size_t r_end = (b0 + st.n_blk) * LOAD_ROWS;
		r_end = r_end < rows ? r_end : rows;
		const uint8_t *done = src + r_end * row_bytes;
		if ((size_t)(done - released) >= LOAD_RELEASE_BYTES) {
			load_release(c, released, done, true);
			released = done;
		}
	}
	load_release(c, released, src + t->size, false);
	load_mat_done(c, lm, c->phase);
	return 0;
}

static struct mq4_rope *load_rope_slot(struct model_q4 *m, float base, float scale, uint32_t n_rot)
{
	for (uint32_t i = 0; i < m->n_ropes; i++)
		if (m->ropes[i].base == base && m->ropes[i].scale == scale && m->ropes[i].n_rot == n_rot)
			return &m->ropes[i];
	if (m->n_ropes == MQ4_ROPES_MAX)
		return NULL;
	struct mq4_rope *r = &m->ropes[m->n_ropes++];
	r->base = base;
	r->scale = scale;
	r->n_rot = n_rot;
	return r;
}

/* The widest row of each kind of step buffer over all layers (layers may differ), which
 * the plan sizes the scratch by and load_scratch carves it by. */
struct load_widths {
	size_t q, k, v, a, ff;     /* q, k, v, attention output, ffn hidden */
	size_t heads;              /* query heads: the attention state per thread */
};

static void load_widths(const struct model_q4 *m, struct load_widths *w)
{
	*w = (struct load_widths){ 0 };
	for (uint32_t l = 0; l < m->n_layer; l++) {
		const struct mq4_layer *L = &m->layers[l];
		size_t q = (size_t)L->n_head * L->head_dim, k = (size_t)L->n_head_kv * L->head_dim;
		size_t v = (size_t)L->n_head_kv * L->head_dim_v, a = (size_t)L->n_head * L->head_dim_v;
		w->q = q > w->q ? q : w->q;
		w->k = k > w->k ? k : w->k;
		w->v = v > w->v ? v : w->v;
		w->a = a > w->a ? a : w->a;
		w->ff = L->n_ff > w->ff ? L->n_ff : w->ff;
		w->heads = L->n_head > w->heads ? L->n_head : w->heads;
	}
}

/* Bytes each arena region will hold, summed while the plan walks the model. */
struct load_sizes {
	size_t w_g128, w_g64, w_g32, w_q8; /* layer matrices, by packed type */
	size_t embed_head, norms, rope, scratch;
};

static size_t load_layer_vec_bytes(const struct model_layer *R)
{
	const struct gguf_tensor *vs[10] = { R->attn_norm, R->ffn_norm, R->q_norm, R->k_norm,
					     R->bq, R->bk, R->bv, R->bo, R->attn_post_norm,
					     R->ffn_post_norm };
	size_t n = 0;
	for (int i = 0; i < 10; i++)
		n += vec_bytes(vs[i]);
	return n;
}

/* A layer's matrices in the order MQ4_WQ .. MQ4_DOWN (model_q4.h). */
static void load_layer_tensors(const struct model_layer *R, const struct gguf_tensor *ts[MQ4_LAYER_MATRICES])
{
	const struct gguf_tensor *all[MQ4_LAYER_MATRICES] = { R->wq, R->wk, R->wv, R->wo,
							       R->ffn_gate, R->ffn_up, R->ffn_down };
	memcpy(ts, all, sizeof all);
}

/* The layers' matrices, vectors and shapes: each matrix planned at `want`, each layer's
 * RoPE setting given a table slot. */
static int load_plan_layers(struct load_ctx *c, uint32_t want, struct load_sizes *sz,
			    struct hearth_error *err)
{
	const struct model *ref = c->ref;
	struct model_q4 *m = c->m;
	int rc;
	for (uint32_t l = 0; l < m->n_layer; l++) {
		const struct model_layer *R = &ref->layers[l];
		struct mq4_layer *L = &m->layers[l];
		const struct gguf_tensor *ts[MQ4_LAYER_MATRICES];
		load_layer_tensors(R, ts);
		struct q4_matrix *ds[MQ4_LAYER_MATRICES] = { &L->wq, &L->wk, &L->wv, &L->wo,
							     &L->gate, &L->up, &L->down };
		for (int i = 0; i < MQ4_LAYER_MATRICES; i++) {
			if (c->mix8 && c->mix8[(size_t)l * MQ4_LAYER_MATRICES + i]) {
				if ((rc = load_add_mat8(c, ts[i], &L->w8[i], LOAD_REGION_WEIGHTS_Q8, load_group8(want),
							err)) < 0)
					return rc;
				sz->w_q8 += align64(q8_matrix_bytes(&L->w8[i]));
				continue;
			}
			if ((rc = load_add_mat(c, ts[i], ds[i], NULL, want, err)) < 0)
				return rc;
			*(ds[i]->group == 128 ? &sz->w_g128 : ds[i]->group == 64 ? &sz->w_g64 : &sz->w_g32) +=
				align64(q4_matrix_bytes(ds[i]));
		}
		sz->norms += load_layer_vec_bytes(R);
		if (R->bo)
			return hearth_error_set(err, HEARTH_EUNSUPPORTED, "layer %u: an output bias is not supported", l);
		L->n_head = R->n_head;
		L->n_head_kv = R->n_head_kv;
		L->head_dim = R->head_dim;
		L->head_dim_v = R->head_dim_v;
		L->n_ff = R->n_ff;
		L->n_rot = R->n_rot;
		L->window = R->window;
		L->attn_scale = R->attn_scale;
		if (L->head_dim % 16 || L->head_dim_v % 16)
			return hearth_error_set(err, HEARTH_EUNSUPPORTED,
						"layer %u: head size %u is not a multiple of 16, which the attention kernels need",
						l, L->head_dim);
		struct mq4_rope *r = load_rope_slot(m, R->rope_base, R->rope_scale, R->n_rot);
		if (!r)
			return hearth_error_set(err, HEARTH_EUNSUPPORTED, "layer %u: more than %d distinct RoPE settings",
						l, MQ4_ROPES_MAX);
		L->rope = r;
	}
	return 0;
}

/* The embedding and an untied head: int8 (head_bits 8), int6 (head_bits 6) or int4 at
 * want_head. */
static int load_plan_head(struct load_ctx *c, uint32_t want_head, struct load_sizes *sz,
			  struct hearth_error *err)
{
	const struct model *ref = c->ref;
	struct model_q4 *m = c->m;
	int rc;
	if (m->head_bits == LOAD_HEAD_INT8) {
		/* int8 keeps group 128 whatever the layers use (8 bits leave little for a finer
		 * group to win) unless head_group asks for 32. */
		uint32_t want8 = c->o->head_group ? c->o->head_group : LOAD_GROUP_128;
		if ((rc = load_add_mat8(c, ref->tok_embd, &m->embd8, ARENA_REGION_EMBED_HEAD, want8, err)) < 0)
			return rc;
		sz->embed_head += align64(q8_matrix_bytes(&m->embd8));
		if (!ref->hp.tied_output) {
			if ((rc = load_add_mat8(c, ref->output, &m->output8, ARENA_REGION_EMBED_HEAD, want8, err)) < 0)
				return rc;
			sz->embed_head += align64(q8_matrix_bytes(&m->output8));
		}
		return 0;
	}
	if (m->head_bits == LOAD_HEAD_INT6) {
		if ((rc = load_add_mat6(c, ref->tok_embd, &m->embd6, err)) < 0)
			return rc;
		sz->embed_head += align64(q6_matrix_bytes(&m->embd6));
		if (!ref->hp.tied_output) {
			if ((rc = load_add_mat6(c, ref->output, &m->output6, err)) < 0)
				return rc;
			sz->embed_head += align64(q6_matrix_bytes(&m->output6));
		}
		return 0;
	}
	if ((rc = load_add_mat(c, ref->tok_embd, &m->embd, ARENA_REGION_EMBED_HEAD, want_head, err)) < 0)
		return rc;
	sz->embed_head += align64(q4_matrix_bytes(&m->embd));
	if (!ref->hp.tied_output) {
		if ((rc = load_add_mat(c, ref->output, &m->output, ARENA_REGION_EMBED_HEAD, want_head,
				       err)) < 0)
			return rc;
		sz->embed_head += align64(q4_matrix_bytes(&m->output));
	}
	return 0;
}

/* The KV cache's configuration, one shape per layer, in the ctx's own KV region; *kvc owns
 * the shapes array, which the caller frees. */
static int load_plan_kv(struct load_ctx *c, struct kv_config *kvc, struct kv_geometry *geo,
			struct hearth_error *err)
{
	const struct model_q4 *m = c->m;
	snprintf(c->kv_region, sizeof c->kv_region, "%s", load_region(c, ARENA_REGION_KV).s);
	struct kv_layer_shape *shapes = calloc(m->n_layer, sizeof *shapes);
	if (!shapes)
		return hearth_error_set(err, HEARTH_ENOMEM, "loader: out of memory");
	for (uint32_t l = 0; l < m->n_layer; l++)
		shapes[l] = (struct kv_layer_shape){ m->layers[l].n_head_kv, m->layers[l].head_dim,
						     m->layers[l].head_dim_v, m->layers[l].window };
	*kvc = (struct kv_config){
		.budget_bytes = c->o->kv_budget,
		.block_tokens = 16,
		.elem_type = c->o->kv_type,
		.n_layer = m->n_layer,
		.layer_shapes = shapes,
		.max_seqs = c->o->max_seqs,
		.max_context = c->o->max_context,
		.step_tokens = c->o->step_tokens,
		.rings_outside_budget = c->o->kv_rings_extra,
		.region = c->kv_region,
	};
	int rc = kv_plan(kvc, geo, err);
	if (rc < 0 && c->prefix[0])
		hearth_error_prefix(err, "draft_kv_budget (region %s of the model's arena)", c->kv_region);
	return rc;
}

/* Scratch for one step of step_tokens tokens: activations, attention state, logits rows;
 * load_scratch carves the same list. */
static int load_plan_scratch(struct load_ctx *c, struct load_sizes *sz, struct hearth_error *err)
{
	struct model_q4 *m = c->m;
	const struct load_opts *o = c->o;
	size_t T = o->step_tokens, E = m->hp.n_embd;
	struct load_widths w;
	load_widths(m, &w);
	size_t nq = w.q, nk = w.k, nv = w.v, na = w.a, ff = w.ff, widest = E;
	widest = ff > widest ? ff : widest;
	widest = na > widest ? na : widest;
	/* Activations are quantized once per group size the matrices use, one buffer each in
	 * acts_mem (at m->acts_off[mq4_group_slot(group)]). A buffer no matrix reads is not
	 * planned (3 MiB for a 1.7B model at 256 tokens). The head reads only the rows whose
	 * logits are wanted, at most max_seqs (the logits buffer's rows), so a group only the
	 * head uses is sized for those (the default layout's group-32 head). Each buffer is
	 * sized for the widest row rounded up to its group, which bounds every row a matrix of
	 * that group can have. */
	size_t head_rows = o->max_seqs < T ? o->max_seqs : T;
	size_t rows_of[MQ4_GROUP_SLOTS] = { 0 };
	for (size_t i = 0; i < c->n_mats; i++) {
		size_t rows = strcmp(c->mats[i].region, ARENA_REGION_EMBED_HEAD) == 0 ? head_rows : T;
		size_t *r = &rows_of[mq4_group_slot(c->mats[i].group)];
		*r = rows > *r ? rows : *r;
	}
	c->acts_total = 0;
	for (int g = 0; g < MQ4_GROUP_SLOTS; g++) {
		size_t group = mq4_slot_group(g), cols = (widest + group - 1) / group * group;
		size_t bytes = rows_of[g] ? q4_acts_bytes(o->act, rows_of[g], cols, group) : 0;
		if (rows_of[g] && !bytes)
			return hearth_error_set(err, HEARTH_ERANGE, "scratch for %zu tokens overflows", T);
		m->acts_off[g] = c->acts_total;
		c->acts_total += align64(bytes);
	}
	m->attn_state_stride = align64(2 * w.heads * sizeof(float)) / sizeof(float);
	c->threads_max = load_threads_max(o);
	size_t scratch = 0;
	scratch += 2 * align64(T * E * sizeof(float));                     /* x, xb */
	scratch += align64(T * nq * sizeof(float)) + align64(T * nk * sizeof(float)) +
		   align64(T * nv * sizeof(float)) + align64(T * na * sizeof(float));
	scratch += 2 * align64(T * ff * sizeof(float));                    /* hb, hb2 */
	scratch += align64((size_t)o->max_seqs * m->hp.n_vocab * sizeof(float)); /* logits */
	scratch += align64(c->acts_total);
	scratch += c->threads_max * m->attn_state_stride * sizeof(float);
	sz->scratch = scratch;
	return 0;
}

/* ---- the mix rule (load.h, weights_mix) ---- */

/* The mix rule's order, from bench/fidelity --sensitivity on both trained models
 * (doc/benchmarks.md): the first layer's matrices cost the most KL per bit at int4 (10 to 100
 * times a middle layer's), the last layer's come next, so layers are visited from the
 * outside in (first, last, second, second to last, ...) and within a layer the classes in
 * this order (attn_v and ffn_down first, as llama.cpp's Q4_K_M gives them more bits). */
static const int load_mix_order[] = { MQ4_WV, MQ4_DOWN, MQ4_WK, MQ4_WQ, MQ4_WO, MQ4_GATE, MQ4_UP };

static uint32_t load_mix_layer(uint32_t n_layer, uint32_t k)
{
	return k % 2 ? n_layer - 1 - k / 2 : k / 2;
}

/* Bytes t takes in the int4 layout at want, or in the int8 one (eight); 0 when it does
 * not plan (the real plan reports why). */
static uint64_t load_mat_cost(const struct gguf_tensor *t, uint32_t want, bool eight)
{
	uint32_t g;
	bool asym, carry;
	size_t rows = (size_t)(t->n_elems / t->ne[0]), cols = (size_t)t->ne[0];
	if (eight) {
		struct q8_matrix q;
		load_choose8(t->type, cols, want, &g, &carry);
		return cols % g == 0 && q8_matrix_plan(&q, rows, cols, g) == 0 ? align64(q8_matrix_bytes(&q)) : 0;
	}
	struct q4_matrix q;
	bool row8;
	load_choose(t->type, cols, want, &g, &asym, &carry, &row8);
	return cols % g == 0 && load_plan_q4(&q, t, g, asym, row8) == 0 ? align64(q4_matrix_bytes(&q)) : 0;
}

/* Bytes t takes in the int6 layout; 0 when it does not plan. */
static uint64_t load_mat_cost6(const struct gguf_tensor *t)
{
	struct q6_matrix q;
	size_t rows = (size_t)(t->n_elems / t->ne[0]), cols = (size_t)t->ne[0];
	return cols % Q6_GROUP == 0 && q6_matrix_plan(&q, rows, cols) == 0 ? align64(q6_matrix_bytes(&q)) : 0;
}

/* Whether upgrading t (to int6 or int8) adds precision: not for codes carried over from
 * a 4-bit file, which more bits would only hold at a larger size. */
static bool load_mix_candidate(const struct gguf_tensor *t)
{
	uint32_t g;
	bool asym, carry, row8;
	load_choose(t->type, (size_t)t->ne[0], LOAD_GROUP_128, &g, &asym, &carry, &row8);
	return !carry;
}

/* Takes the upgrade of a matrix of int4 bytes to int8 bytes when the model's bits (*bits,
 * counted as bench/fidelity counts them) stay within budget. */
static bool load_mix_take(uint64_t *bits, uint64_t budget, uint64_t int4, uint64_t int8)
{
	if (!int4 || !int8 || int8 < int4 || *bits + 8 * (int8 - int4) > budget)
		return false;
	*bits += 8 * (int8 - int4);
	return true;
}

/* Decides, before the plan, which matrices get more bits: the embedding/head first, to
 * int6, when head_bits leaves it to the rule (its error reaches the logits directly, and
 * it is where most of the distance is on both trained models; int6 rounds to a quarter of
 * int4's step for less than half int8's extra bits, and what it saves buys the first
 * layer's matrices at int8), then layer matrices to int8 layer by layer from the outside
 * in, each layer's in load_mix_order; an upgrade that does not fit is skipped and smaller
 * ones after it may still be taken. A forced head (4, 6 or 8) is kept and counted. Sets
 * m->head_bits and c->mix8. */
static int load_mix(struct load_ctx *c, uint32_t want, uint32_t want_head, struct hearth_error *err)
{
	struct model_q4 *m = c->m;
	const struct model *ref = c->ref;
	const struct load_opts *o = c->o;
	uint32_t want8 = o->head_group ? o->head_group : LOAD_GROUP_128;
	m->head_bits = o->head_bits ? o->head_bits : LOAD_HEAD_INT4;
	if (o->mix == LOAD_MIX_OFF)
		return 0;
	c->mix8 = calloc((size_t)m->n_layer * MQ4_LAYER_MATRICES, sizeof *c->mix8);
	if (!c->mix8)
		return hearth_error_set(err, HEARTH_ENOMEM, "loader: out of memory");
	/* What the model takes all int4 (the head as head_bits says), in the bits per weight
	 * bench/fidelity reports: matrices, norms and biases over every parameter. */
	uint64_t cbpw = o->mix_budget_cbpw ? o->mix_budget_cbpw : LOAD_MIX_BUDGET_CBPW;
	uint64_t budget = m->n_params * cbpw / 100, bits = 0;
	const struct gguf_tensor *heads[2] = { ref->tok_embd, ref->hp.tied_output ? NULL : ref->output };
	uint64_t h4 = 0, h6 = 0, h8 = 0;
	bool head_ok = true;
	for (int k = 0; k < 2 && heads[k]; k++) {
		uint64_t c4 = load_mat_cost(heads[k], want_head, false), c8 = load_mat_cost(heads[k], want8, true);
		uint64_t c6 = load_mat_cost6(heads[k]);
		h4 += c4;
		h6 += c6;
		h8 += c8;
		head_ok &= load_mix_candidate(heads[k]) && c4 && c6;
	}
	bits += 8 * (m->head_bits == LOAD_HEAD_INT8 ? h8 : m->head_bits == LOAD_HEAD_INT6 ? h6 : h4);
	bits += 8 * vec_bytes(ref->output_norm);
	for (uint32_t l = 0; l < m->n_layer; l++) {
		const struct model_layer *R = &ref->layers[l];
		const struct gguf_tensor *ts[MQ4_LAYER_MATRICES];
		load_layer_tensors(R, ts);
		bits += 8 * load_layer_vec_bytes(R);
		for (int i = 0; i < MQ4_LAYER_MATRICES; i++)
			bits += 8 * load_mat_cost(ts[i], want, false);
	}
	if (o->head_bits == 0 && head_ok && load_mix_take(&bits, budget, h4, h6))
		m->head_bits = LOAD_HEAD_INT6;
	for (uint32_t k = 0; k < m->n_layer; k++) {
		uint32_t l = load_mix_layer(m->n_layer, k);
		const struct model_layer *R = &ref->layers[l];
		const struct gguf_tensor *ts[MQ4_LAYER_MATRICES];
		load_layer_tensors(R, ts);
		for (size_t j = 0; j < sizeof load_mix_order / sizeof load_mix_order[0]; j++) {
			int i = load_mix_order[j];
			if (load_mix_candidate(ts[i]) &&
			    load_mix_take(&bits, budget, load_mat_cost(ts[i], want, false),
					  load_mat_cost(ts[i], load_group8(want), true))) {
				c->mix8[(size_t)l * MQ4_LAYER_MATRICES + i] = true;
				m->n_mix8++;
			}
		}
	}
	return 0;
}

/* Everything the arena will hold for c's model, region by region, added to plan before
 * the arena exists: the matrices' layouts (c->mats), the KV configuration (c->kvc) and the
 * model's byte counts. */
static int load_plan(struct load_ctx *c, struct arena_plan *plan, struct hearth_error *err)
{
	struct kv_config *kvc = &c->kvc;
	struct model_q4 *m = c->m;
	const struct load_opts *o = c->o;
	struct load_sizes sz = { 0 };
	uint32_t want = o->weights_group ? o->weights_group : LOAD_GROUP_64;
	uint32_t want_head = o->head_group ? o->head_group : load_head_group(want);
	struct kv_geometry geo;
	int rc;
	if ((rc = load_mix(c, want, want_head, err)) < 0 ||
	    (rc = load_plan_layers(c, want, &sz, err)) < 0 ||
	    (rc = load_plan_head(c, want_head, &sz, err)) < 0)
		return rc;
	/* Every matrix gets a note (load_repack): the notes array was sized for this many. */
	hearth_assert(c->n_mats <= (size_t)m->n_layer * MQ4_LAYER_MATRICES + MQ4_HEAD_MATRICES);
	sz.norms += vec_bytes(c->ref->output_norm);
	for (uint32_t i = 0; i < m->n_ropes; i++)
		sz.rope += 2 * align64((size_t)o->max_context * (m->ropes[i].n_rot / 2) * sizeof(float));
	if ((rc = load_plan_kv(c, kvc, &geo, err)) < 0 || (rc = load_plan_scratch(c, &sz, err)) < 0)
		return rc;
	m->bytes_weights = sz.w_g128 + sz.w_g64 + sz.w_g32 + sz.w_q8;
	m->bytes_embed_head = sz.embed_head;
	m->bytes_norms = sz.norms;
	m->bytes_rope = sz.rope;
	m->bytes_scratch = sz.scratch;

	const struct {
		const char *name;
		size_t size, align;
		bool planned;
	} regions[] = {
		{ LOAD_REGION_WEIGHTS_G128, sz.w_g128, Q4_ALIGN, sz.w_g128 > 0 },
		{ LOAD_REGION_WEIGHTS_G64, sz.w_g64, Q4_ALIGN, sz.w_g64 > 0 },
		{ LOAD_REGION_WEIGHTS_G32, sz.w_g32, Q4_ALIGN, sz.w_g32 > 0 },
		{ LOAD_REGION_WEIGHTS_Q8, sz.w_q8, Q4_ALIGN, sz.w_q8 > 0 },
		{ ARENA_REGION_EMBED_HEAD, sz.embed_head, Q4_ALIGN, true },
		{ ARENA_REGION_NORMS, sz.norms, 64, true },
		{ ARENA_REGION_ROPE, sz.rope, 64, true },
		{ ARENA_REGION_KV, geo.pool_bytes, 4096, true },
		{ ARENA_REGION_KV_SLIDING, geo.ring_bytes, 4096, geo.ring_bytes > 0 },
		{ ARENA_REGION_SCRATCH, sz.scratch, 64, true },
	};
	for (size_t i = 0; i < sizeof regions / sizeof regions[0]; i++)
		if (regions[i].planned &&
		    (rc = arena_plan_add(plan, load_region(c, regions[i].name).s, regions[i].size, regions[i].align,
					 err)) < 0)
			return rc;
	return 0;
}

static int load_scratch(struct load_ctx *c, struct hearth_error *err)
{
	struct model_q4 *m = c->m;
	size_t T = m->step_tokens, E = m->hp.n_embd;
	struct load_widths w;
	load_widths(m, &w);
	size_t nq = w.q, nk = w.k, nv = w.v, na = w.a, ff = w.ff;
	struct {
		void **p;
		size_t bytes;
	} parts[] = {
		{ (void **)&m->x, T * E * sizeof(float) },
		{ (void **)&m->xb, T * E * sizeof(float) },
		{ (void **)&m->q, T * nq * sizeof(float) },
		{ (void **)&m->k, T * nk * sizeof(float) },
		{ (void **)&m->v, T * nv * sizeof(float) },
		{ (void **)&m->att, T * na * sizeof(float) },
		{ (void **)&m->hb, T * ff * sizeof(float) },
		{ (void **)&m->hb2, T * ff * sizeof(float) },
		{ (void **)&m->logits, (size_t)m->max_seqs * m->hp.n_vocab * sizeof(float) },
		{ &m->acts_mem, c->acts_total },
		{ (void **)&m->attn_state, c->threads_max * m->attn_state_stride * sizeof(float) },
	};
	struct load_region_name region = load_region(c, ARENA_REGION_SCRATCH);
	for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
		int rc = arena_alloc(c->arena, region.s, align64(parts[i].bytes), 64, parts[i].p, err);
		if (rc < 0)
			return rc;
	}
	struct arena_region *r = arena_region_find(c->arena, region.s);
	return arena_prefault(c->arena, r->base, r->size, err);
}

static int load_threads(struct model_q4 *m, const struct load_opts *o, struct hearth_error *err)
{
	int cpus[MQ4_THREADS_MAX];
	size_t n = 0;
	int rc = arena_node_cpus(m->arena->numa_node >= 0 ? m->arena->numa_node : 0, cpus,
				 MQ4_THREADS_MAX, &n, err);
	if (rc < 0)
		return rc;
	if (o->n_threads && o->n_threads < n)
		n = o->n_threads;
	if (n > load_threads_max(o))
		n = load_threads_max(o); /* the per-thread scratch was planned for no more */
	if (n == 0)
		n = 1;
	m->n_threads = n;
	memcpy(m->cpus, cpus, n * sizeof *cpus);
	/* The caller is not pinned here: the loader thread goes away, and the compute thread
	 * that steps the model pins itself to cpus[0] (engine thread_init). */
	rc = pool_create(&m->pool, n, cpus, 0, POOL_YIELD_IDLE);
	if (rc == HEARTH_EIO)
		return hearth_error_errno(err, rc, errno, "cannot start %zu compute threads", n);
	if (rc < 0)
		return hearth_error_set(err, rc, "cannot start %zu compute threads (%s)", n,
					hearth_strerror(rc));
	return 0;
}

/* A draft steps on its model's compute thread, so it takes the model's pool (the same
 * threads on the same CPUs) instead of starting workers that would spin on those CPUs
 * while the model steps. */
static void load_borrow_threads(struct model_q4 *d, const struct model_q4 *m)
{
	d->pool = m->pool;
	d->pool_borrowed = true;
	d->n_threads = m->n_threads;
	memcpy(d->cpus, m->cpus, m->n_threads * sizeof *m->cpus);
}

/* "q4_g128", "q4_g64", "q4_g32" or "q4_mixed" for the int4 layer matrices, then
 * "+head_gN" when they are all at one group and an int4 embedding/head (the notes after the
 * layers') is at another, "+head_q6" for an int6 one, or "+head_q8" for an int8 one
 * ("+head_q8_g32" when it is at group 32), then "+mix" when the mix rule made layer matrices
 * int8, then "+gptq" when an imatrix's covariances rounded any matrix, else "+imatrix" when
 * its statistics steered the scale search of any. */
static void load_quant_name(struct model_q4 *m)
{
	uint32_t n_layer_notes = m->n_layer * MQ4_LAYER_MATRICES;
	unsigned layer_groups = 0, head_groups = 0;
	for (uint32_t i = 0; i < m->n_notes; i++) {
		bool head = i >= n_layer_notes;
		if (!head && m->notes[i].bits == 8)
			continue;
		*(head ? &head_groups : &layer_groups) |= 1u << mq4_group_slot(m->notes[i].group);
	}
	int lg = layer_groups ? __builtin_ctz(layer_groups) : -1, hg = head_groups ? __builtin_ctz(head_groups) : 2;
	char layers[16], head[24] = "";
	if (layer_groups & (layer_groups - 1))
		snprintf(layers, sizeof layers, "q4_mixed");
	else if (lg < 0) /* every layer matrix int8 */
		snprintf(layers, sizeof layers, "q8");
	else
		snprintf(layers, sizeof layers, "q4_g%zu", mq4_slot_group(lg));
	if (m->head_bits == LOAD_HEAD_INT8)
		snprintf(head, sizeof head, "+head_q8%s", hg == 0 ? "_g32" : "");
	else if (m->head_bits == LOAD_HEAD_INT6)
		snprintf(head, sizeof head, "+head_q6");
	else if (lg < 0 || (!(layer_groups & (layer_groups - 1)) && hg != lg))
		snprintf(head, sizeof head, "+head_g%zu", mq4_slot_group(hg));
	snprintf(m->quant_name, sizeof m->quant_name, "%s%s%s%s", layers, head, m->n_mix8 ? "+mix" : "",
		 m->n_gptq ? "+gptq" : m->n_imatrix ? "+imatrix" : "");
}

static uint64_t load_count_params(const struct model *ref)
{
	uint64_t n = 0;
	for (uint64_t i = 0; i < ref->file->n_tensors; i++)
		n += ref->file->tensors[i].n_elems;
	return n;
}

/* What load_q4 refuses before it touches the file. */
static int load_check_opts(const struct load_opts *o, struct hearth_error *err)
{
	if (o->kv_type != QTYPE_F16 && o->kv_type != QTYPE_BF16 && o->kv_type != QTYPE_KV_Q8)
		return hearth_error_set(err, HEARTH_EINVAL,
					"kv_type must be f16, bf16 or q8 for the int4 engine");
	if ((o->weights_group && o->weights_group != LOAD_GROUP_128 && o->weights_group != LOAD_GROUP_64 &&
	     o->weights_group != LOAD_GROUP_32) ||
	    (o->head_group && o->head_group != LOAD_GROUP_128 && o->head_group != LOAD_GROUP_32 &&
	     o->head_group != LOAD_GROUP_32_ASYM))
		return hearth_error_set(err, HEARTH_EINVAL, "weights group %u / head group %u: use 128, 64 or 32",
					o->weights_group, o->head_group);
	if (o->head_bits && o->head_bits != LOAD_HEAD_INT4 && o->head_bits != LOAD_HEAD_INT6 &&
	    o->head_bits != LOAD_HEAD_INT8)
		return hearth_error_set(err, HEARTH_EINVAL, "head bits %u: use 4, 6 or 8", o->head_bits);
	if (o->mix != LOAD_MIX_AUTO && o->mix != LOAD_MIX_OFF)
		return hearth_error_set(err, HEARTH_EINVAL, "weights mix %u: use auto or off", o->mix);
	return 0;
}

/* The model without its arena: shapes, names and run options from the reference model and
 * o, and the per-layer and per-matrix arrays the plan fills. */
static int load_model_new(struct model_q4 **out, const struct model *ref, const struct gguf_file *f,
			  const struct load_opts *o, struct hearth_error *err)
{
	struct model_q4 *m = calloc(1, sizeof *m);
	*out = m;
	if (!m)
		return hearth_error_set(err, HEARTH_ENOMEM, "loader: out of memory");
	m->hp = ref->hp;
	m->n_layer = ref->hp.n_layer;
	m->max_context = o->max_context;
	m->max_seqs = o->max_seqs;
	m->step_tokens = o->step_tokens;
	m->act = o->act;
	m->kern = kern_active();
	snprintf(m->arch_name, sizeof m->arch_name, "%s", model_arch_name(ref->hp.arch));
	struct gguf_str gname;
	if (gguf_get_str(f, "general.name", &gname, NULL) == 0)
		snprintf(m->name, sizeof m->name, "%.*s", (int)gname.len, gname.ptr);
	m->n_params = load_count_params(ref);
	m->layers = calloc(m->n_layer, sizeof *m->layers);
	m->notes = calloc((size_t)m->n_layer * MQ4_LAYER_MATRICES + MQ4_HEAD_MATRICES, sizeof *m->notes);
	if (!m->layers || !m->notes)
		return hearth_error_set(err, HEARTH_ENOMEM, "loader: out of memory");
	return 0;
}

static bool load_cache_wanted(const struct load_ctx *c)
{
	return c->o->weights_cache && c->o->weights_cache[0];
}

/* The packed-weights file's key: what the packed bytes depend on (load.h, weights_cache),
 * and their length. A model read from memory (no descriptor) has no identity to key. */
static int load_cache_key(struct load_ctx *c, struct hearth_error *err)
{
	struct stat st, ist;
	if (c->file->fd < 0 || fstat(c->file->fd, &st) < 0)
		return hearth_error_set(err, HEARTH_EIO, "weights cache: the model file has no identity to key it by");
	memset(&ist, 0, sizeof ist);
	if (c->imat && stat(c->opts.imatrix, &ist) < 0)
		return hearth_error_errno(err, HEARTH_EIO, errno, "weights cache: stat %s", c->opts.imatrix);
	uint64_t files[] = { PACK_CACHE_FORMAT,
			     st.st_dev, st.st_ino, (uint64_t)st.st_size, (uint64_t)st.st_mtim.tv_sec,
			     (uint64_t)st.st_mtim.tv_nsec, ist.st_dev, ist.st_ino, (uint64_t)ist.st_size,
			     (uint64_t)ist.st_mtim.tv_sec, (uint64_t)ist.st_mtim.tv_nsec };
	uint64_t h = hearth_fnv1a(HEARTH_FNV1A_SEED, PACKAGE_VERSION, strlen(PACKAGE_VERSION));
	h = hearth_fnv1a(h, files, sizeof files);
	c->cache_bytes = 0;
	for (size_t i = 0; i < c->n_mats; i++) {
		const struct load_mat *lm = &c->mats[i];
		const struct gguf_tensor *t = lm->t;
		size_t n;
		load_mat_data(lm, &n);
		uint64_t f[] = { t->type, t->ne[0], t->ne[1], lm->group, lm->asym, lm->carry, lm->row8,
				 lm->dst8 ? 8 : lm->dst6 ? 6 : 4, n, lm->col_w != NULL, lm->cov.h != NULL,
				 lm->cov.block, (uint64_t)lm->cov.tokens };
		h = hearth_fnv1a(h, t->name.ptr, t->name.len);
		h = hearth_fnv1a(h, lm->region, strlen(lm->region) + 1);
		h = hearth_fnv1a(h, f, sizeof f);
		c->cache_bytes += n;
	}
	c->cache_key = h;
	return 0;
}

/* The imatrix's values, checked before the first is used (opened for its shapes alone when
 * the packed weights may come from the cache). */
static int load_check_imatrix(struct load_ctx *c, struct hearth_error *err)
{
	if (!c->imat || c->imat_checked)
		return 0;
	int rc = imatrix_check(c->imat, err);
	c->imat_checked = rc == 0;
	return rc;
}

/* Before the arena is mapped: whether opts.weights_cache holds this plan's matrices (its
 * header and size; the checksum waits for the read). When it does not, an imatrix opened
 * for its shapes has its values checked now, so a bad one still fails the load before
 * anything is mapped; when it does, they are never read. */
static int load_cache_probe(struct load_ctx *c, struct hearth_error *err)
{
	if (!load_cache_wanted(c))
		return 0;
	struct hearth_error e;
	c->cache_keyed = load_cache_key(c, &e) == 0;
	if (!c->cache_keyed) {
		c->cache.outcome = LOAD_CACHE_UNWRITTEN;
		snprintf(c->cache.unwritten, sizeof c->cache.unwritten, "%s", e.msg);
	} else {
		int rc = pack_cache_open(&c->cache_in, c->o->weights_cache, c->cache_key, c->cache_bytes, c->n_mats, &e);
		if (rc < 0 && rc != HEARTH_ENOTFOUND)
			snprintf(c->cache.refused, sizeof c->cache.refused, "%s", e.msg);
	}
	return c->cache_in ? 0 : load_check_imatrix(c, err);
}

/* The packed matrices read from the file load_cache_probe opened instead of repacked: true
 * when every byte came from it and its checksum agreed. A file refused leaves the matrices
 * zeroed for the repack, the reason in c->cache. */
static bool load_cache_read(struct load_ctx *c)
{
	struct hearth_error e;
	int rc = 0;
	uint64_t done0 = c->done_bytes;
	for (size_t i = 0; rc == 0 && i < c->n_mats; i++) {
		size_t n;
		uint8_t **data = load_mat_data(&c->mats[i], &n);
		if ((rc = pack_cache_read(c->cache_in, *data, n, &e)) == 0)
			load_mat_done(c, &c->mats[i], "reading packed weights");
	}
	if (rc == 0)
		rc = pack_cache_verify(c->cache_in, &e);
	pack_cache_close(c->cache_in);
	c->cache_in = NULL;
	if (rc == 0) {
		c->cache.outcome = LOAD_CACHE_READ;
		c->cache.bytes = c->cache_bytes;
		return true;
	}
	snprintf(c->cache.refused, sizeof c->cache.refused, "%s", e.msg);
	c->done_bytes = done0;
	/* The packers write every byte they own, not their padding: as a fresh arena's. */
	for (size_t i = 0; i < c->n_mats; i++) {
		size_t n;
		uint8_t **data = load_mat_data(&c->mats[i], &n);
		memset(*data, 0, n);
	}
	return false;
}

/* The repacked matrices written to opts.weights_cache for the next load; a failure is
 * reported, never the load's. */
static void load_cache_write(struct load_ctx *c)
{
	struct pack_cache *pc = NULL;
	struct hearth_error e;
	int rc = pack_cache_create(&pc, c->o->weights_cache, c->cache_key, c->cache_bytes, c->n_mats, &e);
	for (size_t i = 0; rc == 0 && i < c->n_mats; i++) {
		size_t n;
		uint8_t **data = load_mat_data(&c->mats[i], &n);
		rc = pack_cache_write(pc, *data, n, &e);
	}
	if (rc == 0)
		rc = pack_cache_commit(pc, &e);
	pack_cache_close(pc);
	c->cache.outcome = rc == 0 ? LOAD_CACHE_WRITTEN : LOAD_CACHE_UNWRITTEN;
	c->cache.bytes = rc == 0 ? c->cache_bytes : 0;
	if (rc < 0)
		snprintf(c->cache.unwritten, sizeof c->cache.unwritten, "%s", e.msg);
}

/* Fills c's planned regions of the arena: vectors, then the compute threads (so the repack
 * can use them; a draft borrows its model's), the matrices (read from the weights cache
 * load_cache_probe opened, else repacked and then written to it), RoPE tables, the KV
 * cache and the step scratch. */
static int load_fill(struct load_ctx *c, struct hearth_error *err)
{
	const struct model *ref = c->ref;
	struct model_q4 *m = c->m;
	const struct load_opts *o = c->o;
	int rc;
	for (uint32_t l = 0; l < m->n_layer; l++) {
		const struct model_layer *R = &ref->layers[l];
		struct mq4_layer *L = &m->layers[l];
		if ((rc = load_vec(c, R->attn_norm, &L->attn_norm, err)) < 0 ||
		    (rc = load_vec(c, R->ffn_norm, &L->ffn_norm, err)) < 0 ||
		    (rc = load_vec(c, R->q_norm, &L->q_norm, err)) < 0 ||
		    (rc = load_vec(c, R->k_norm, &L->k_norm, err)) < 0 ||
		    (rc = load_vec(c, R->bq, &L->bq, err)) < 0 ||
		    (rc = load_vec(c, R->bk, &L->bk, err)) < 0 ||
		    (rc = load_vec(c, R->bv, &L->bv, err)) < 0 ||
		    (rc = load_vec(c, R->attn_post_norm, &L->attn_post_norm, err)) < 0 ||
		    (rc = load_vec(c, R->ffn_post_norm, &L->ffn_post_norm, err)) < 0)
			return rc;
	}
	if ((rc = load_vec(c, ref->output_norm, &m->output_norm, err)) < 0)
		return rc;
	if (c->pool_of)
		load_borrow_threads(m, c->pool_of);
	else if ((rc = load_threads(m, o, err)) < 0)
		return rc;
	/* The attention state was planned per thread for threads_max threads. */
	hearth_assert(m->n_threads <= c->threads_max);
	c->repack_threads = m->n_threads < LOAD_REPACK_THREADS_MAX ? m->n_threads : LOAD_REPACK_THREADS_MAX;
	for (size_t i = 0; i < c->n_mats; i++)
		if ((rc = load_mat_place(c, &c->mats[i], err)) < 0)
			return rc;
	if (!c->cache_in || !load_cache_read(c)) {
		if ((rc = load_check_imatrix(c, err)) < 0)
			return rc;
		c->rows = malloc(c->repack_threads * LOAD_ROWS * c->rows_cap * sizeof(float));
		if (!c->rows)
			return hearth_error_set(err, HEARTH_ENOMEM, "loader: out of memory for the repack scratch");
		for (size_t i = 0; i < c->n_mats; i++)
			if ((rc = load_repack(c, &c->mats[i], err)) < 0)
				return rc;
		free(c->rows);
		c->rows = NULL;
		if (c->cache_keyed)
			load_cache_write(c);
	}
	for (uint32_t i = 0; i < m->n_ropes; i++) {
		struct mq4_rope *r = &m->ropes[i];
		size_t n = align64((size_t)o->max_context * (r->n_rot / 2) * sizeof(float));
		struct load_region_name region = load_region(c, ARENA_REGION_ROPE);
		if ((rc = arena_alloc(c->arena, region.s, n, 64, (void **)&r->cos, err)) < 0 ||
		    (rc = arena_alloc(c->arena, region.s, n, 64, (void **)&r->sin, err)) < 0)
			return rc;
		vec_rope_table(r->cos, r->sin, o->max_context, r->n_rot, r->base, r->scale, ref->rope_freqs);
	}
	if ((rc = kv_create(&m->kv, &c->kvc, c->arena, err)) < 0)
		return rc;
	if ((rc = load_scratch(c, err)) < 0 || (rc = model_q4_prepare(m, err)) < 0)
		return rc;
	return 0;
}

/* Pages land on the bound node unless memory there ran out (the policy is MPOL_BIND, but a
 * preferred fallback or a kernel without NUMA can say otherwise): an error only when the
 * configuration named the node. */
static int load_check_placement(struct model_q4 *m, const char *path, const struct load_opts *o,
				struct hearth_error *err)
{
	struct arena_placement pl;
	struct hearth_error perr;
	int rc = arena_verify_placement(m->arena, &pl, &perr);
	if (o->placement)
		*o->placement = pl;
	if (rc < 0 && o->arena.numa_node >= 0)
		return hearth_error_set(err, rc, "%s: %s", path, perr.msg);
	return 0;
}

/* A ctx for the model, loaded with o. */
static void load_ctx_init(struct load_ctx *c, const struct load_opts *o)
{
	memset(c, 0, sizeof *c);
	c->opts = *o;
	c->o = &c->opts;
	c->prefix = "";
	c->phase = "repacking";
}

/* A ctx for o's draft: the model's layout, threads, node and page kind, its own KV budget;
 * the load's record and placement are the model's to report. */
static void load_draft_ctx_init(struct load_ctx *c, const struct load_opts *o)
{
	load_ctx_init(c, o);
	c->opts.kv_budget = o->draft.kv_budget;
	c->opts.kv_rings_extra = o->draft.kv_rings_extra;
	c->opts.load_record = NULL;
	c->opts.placement = NULL;
	memset(&c->opts.draft, 0, sizeof c->opts.draft);
	c->opts.imatrix = NULL; /* statistics of the model's matrices, not the draft's */
	c->opts.weights_cache = NULL;
	c->opts.cache_report = NULL;
	c->prefix = ARENA_DRAFT_PREFIX;
	c->phase = "repacking the draft";
}

/* Frees what c still holds; a model already handed out is NULL here. */
static void load_ctx_close(struct load_ctx *c)
{
	free(c->rows);
	free(c->mats);
	free(c->mix8);
	free(c->gptq_u);
	imatrix_close(c->imat);
	pack_cache_close(c->cache_in);
	free((void *)c->kvc.layer_shapes);
	model_q4_free(c->m);
	tok_free(c->tok);
	model_free(c->ref);
	gguf_close(c->file);
	memset(c, 0, sizeof *c);
}

/* After the fill: the model no longer needs its file, the reference view or the plan. */
static void load_ctx_settle(struct load_ctx *c)
{
	free((void *)c->kvc.layer_shapes);
	c->kvc.layer_shapes = NULL;
	load_quant_name(c->m);
	model_free(c->ref);
	c->ref = NULL;
	gguf_close(c->file);
	c->file = NULL;
	free(c->mats);
	c->mats = NULL;
	free(c->mix8);
	c->mix8 = NULL;
	free(c->gptq_u);
	c->gptq_u = NULL;
	c->gptq_of = NULL;
	imatrix_close(c->imat);
	c->imat = NULL;
}

/* Reads path's structure and tokenizer and makes its model, without an arena. A draft is
 * loaded for the shorter of max_context and the context it was trained for (sequences
 * longer than that draft by lookup); the model must hold max_context. */
static int load_open(struct load_ctx *c, const char *path, bool draft, struct hearth_error *err)
{
	int rc;
	if ((rc = gguf_open(&c->file, path, err)) < 0)
		return rc;
	struct model_opts mo = { .max_ctx = c->opts.max_context };
	if ((rc = model_load(&c->ref, c->file, &mo, err)) < 0)
		return rc;
	uint32_t trained = c->ref->hp.n_ctx_train;
	if (trained && c->opts.max_context > trained) {
		if (!draft)
			return hearth_error_set(err, HEARTH_EINVAL,
						"%s: max_context %u is above the %u tokens the model was trained for",
						path, c->opts.max_context, trained);
		c->opts.max_context = trained;
	}
	if ((rc = tok_load(&c->tok, c->file, err)) < 0)
		return rc;
	/* With a weights cache the values wait for load_cache_probe: a start that reads the
	 * packed weights never needs them (a GPTQ file's covariances are most of a model's
	 * size). */
	if (c->opts.imatrix && c->opts.imatrix[0] &&
	    (rc = load_cache_wanted(c) ? imatrix_open_shapes(&c->imat, c->opts.imatrix, err)
				       : imatrix_open(&c->imat, c->opts.imatrix, err)) < 0)
		return rc;
	c->imat_checked = !load_cache_wanted(c);
	return load_model_new(&c->m, c->ref, c->file, c->o, err);
}

/* Everything before the arena is mapped: both files read, the draft's vocabulary checked
 * against the model's (so a draft that cannot draft costs no mapping), and one plan that
 * holds the model's regions and then the draft's. dc NULL: no draft. */
static int load_prepare(struct load_ctx *mc, struct load_ctx *dc, const char *path,
			const struct load_opts *o, struct arena_plan *plan, struct hearth_error *err)
{
	int rc;
	arena_plan_init(plan);
	if ((rc = load_open(mc, path, false, err)) < 0 || (rc = load_plan(mc, plan, err)) < 0 ||
	    (rc = load_cache_probe(mc, err)) < 0)
		return rc;
	if (!dc)
		return 0;
	if ((rc = load_open(dc, o->draft.path, true, err)) < 0) {
		hearth_error_prefix(err, "draft_model");
		return rc;
	}
	if (o->draft.vocab_check && (rc = o->draft.vocab_check(mc->tok, dc->tok, err)) < 0) {
		hearth_error_prefix(err, "draft_model %s cannot draft for %s", o->draft.path, path);
		return rc;
	}
	if ((rc = load_plan(dc, plan, err)) < 0) {
		hearth_error_prefix(err, "draft_model %s", o->draft.path);
		return rc;
	}
	return 0;
}

static bool load_has_draft(const struct load_opts *o)
{
	return o->draft.path && o->draft.path[0];
}

int load_q4(struct model_q4 **out, struct tok **tok_out, const char *path,
	    const struct load_opts *o, struct hearth_error *err)
{
	*out = NULL;
	*tok_out = NULL;
	bool with_draft = load_has_draft(o);
	struct load_ctx mc, dc;
	struct arena_plan plan;
	struct ledger_sampler sampler;
	bool sampling = false;
	int rc;

	load_ctx_init(&mc, o);
	load_draft_ctx_init(&dc, o);
	if (o->load_record)
		memset(o->load_record, 0, sizeof *o->load_record);
	if (o->placement)
		memset(o->placement, 0, sizeof *o->placement);
	if (o->cache_report)
		memset(o->cache_report, 0, sizeof *o->cache_report);
	if ((rc = load_check_opts(o, err)) < 0)
		return rc;
	/* The peak is what a small machine must hold to reach the settled size, so it is
	 * measured from before the files are mapped to after every transient is given back. */
	if (o->load_record) {
		if ((rc = ledger_sampler_start(&sampler, LOAD_SAMPLE_MS, err)) < 0)
			return rc;
		sampling = true;
	}
	if (o->progress)
		o->progress(o->progress_ctx, "mapping", path, 0, 1);
	if ((rc = load_prepare(&mc, with_draft ? &dc : NULL, path, o, &plan, err)) < 0)
		goto fail;
	/* One mapping for the model and its draft, owned by the model. */
	struct model_q4 *m = mc.m;
	if ((rc = arena_create(&m->arena_own, &plan, &o->arena, err)) < 0)
		goto fail;
	m->arena = mc.arena = &m->arena_own;
	/* The metadata (vocabulary, merges: megabytes for a large vocabulary) has been read
	 * into the tokenizers and the plan; a later lookup faults it back in. */
	load_release(&mc, mc.file->map, mc.file->map + mc.file->data_offset, true);
	if (with_draft) {
		dc.m->arena = dc.arena = &m->arena_own;
		dc.pool_of = m;
		load_release(&dc, dc.file->map, dc.file->map + dc.file->data_offset, true);
	}
	if ((rc = load_fill(&mc, err)) < 0)
		goto fail;
	if (with_draft && (rc = load_fill(&dc, err)) < 0) {
		hearth_error_prefix(err, "draft_model %s", o->draft.path);
		goto fail;
	}
	/* The models no longer need their files. */
	load_ctx_settle(&mc);
	if (with_draft) {
		load_ctx_settle(&dc);
		m->draft = dc.m;
		dc.m = NULL;
	}
	load_ctx_close(&dc); /* the draft's tokenizer: the same as the model's */
	malloc_trim(0);
	if ((rc = load_check_placement(m, path, o, err)) < 0)
		goto fail;
	if (sampling) {
		sampling = false;
		if ((rc = ledger_sampler_stop(&sampler, o->load_record, err)) < 0)
			goto fail;
	}
	if (o->cache_report)
		*o->cache_report = mc.cache;
	*out = m;
	*tok_out = mc.tok;
	mc.m = NULL;
	mc.tok = NULL;
	return 0;
fail:
	if (sampling) {
		struct ledger_load discard;
		ledger_sampler_stop(&sampler, &discard, NULL);
	}
	if (o->load_record)
		o->load_record->valid = false;
	load_ctx_close(&dc); /* first: it lives in the model's arena */
	load_ctx_close(&mc);
	return rc;
}

int load_plan_size(const char *path, const struct load_opts *o, size_t *bytes, struct hearth_error *err)
{
	*bytes = 0;
	struct load_ctx mc, dc;
	struct arena_plan plan;
	load_ctx_init(&mc, o);
	load_draft_ctx_init(&dc, o);
	int rc = load_check_opts(o, err);
	if (rc == 0)
		rc = load_prepare(&mc, load_has_draft(o) ? &dc : NULL, path, o, &plan, err);
	if (rc == 0)
		rc = arena_plan_size(&plan, bytes, err);
	load_ctx_close(&dc);
	load_ctx_close(&mc);
	if (rc < 0)
		return rc;
	/* As the arena maps it: up to a whole huge page, whatever the page kind turns out. */
	if (*bytes > SIZE_MAX - ARENA_HUGE_PAGE)
		return hearth_error_set(err, HEARTH_ERANGE, "%s: the arena's size overflows", path);
	*bytes = (*bytes + ARENA_HUGE_PAGE - 1) / ARENA_HUGE_PAGE * ARENA_HUGE_PAGE;
	return 0;
}
