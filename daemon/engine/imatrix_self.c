/* Self-calibration: an imatrix (with covariances, for GPTQ) made from sequences the int4
 * model samples itself, no text needed. hearthd-tool imatrix --self and hearthd's
 * `imatrix = self` both make theirs here, so the two files are the same bytes. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "daemon/engine/gguf.h"
#include "daemon/engine/imatrix.h"
#include "daemon/engine/load.h"
#include "daemon/engine/model.h"
#include "daemon/engine/model_q4.h"
#include "daemon/engine/tokenizer.h"
#include "kernels/gptq.h"
#include "protocol/error.h"

#define IMATRIX_STEP_TOKENS 512u        /* tokens per int4 step: a chunk runs in steps of it */
#define IMATRIX_SELF_AT_ONCE 32u        /* sequences sampled side by side, at most */
#define IMATRIX_COV_MAX ((uint64_t)2 << 30)

void imatrix_load_opts(struct load_opts *lo, size_t chunk, size_t n_seqs)
{
	lo->act = Q4_ACT_A16; /* float activations, the closest to the reference's */
	lo->imatrix = NULL;
	lo->draft.path = NULL;
	lo->max_seqs = n_seqs == 0 ? 1 : n_seqs < IMATRIX_SELF_AT_ONCE ? (uint32_t)n_seqs : IMATRIX_SELF_AT_ONCE;
	lo->max_context = (uint32_t)(chunk + 15) / 16 * 16;
	lo->step_tokens = chunk < IMATRIX_STEP_TOKENS ? (uint32_t)chunk : IMATRIX_STEP_TOKENS;
	if (lo->step_tokens < lo->max_seqs)
		lo->step_tokens = lo->max_seqs;
	/* Room for a whole chunk at a generous 256 KiB a position (a long chunk on a large
	 * model would not fit the daemon's default budget); imatrix_self_make then sizes it
	 * for every sequence it samples side by side. */
	uint64_t kv = (uint64_t)chunk * (256u << 10);
	if (kv > lo->kv_budget)
		lo->kv_budget = kv;
}

uint64_t imatrix_cov_max(void)
{
	/* IMATRIX_COV_MAX, or half the machine's memory if that is less: the model and its
	 * run need the rest. */
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	uint64_t half = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 2 : IMATRIX_COV_MAX;
	return half < IMATRIX_COV_MAX ? half : IMATRIX_COV_MAX;
}

/* KV for every sequence sampled side by side, whole (f16, every layer as if global: more
 * than sliding layers need): a budget that held fewer would sample fewer at once, slower
 * and with other batches in the sums, so the file would depend on kv_budget. The model's
 * shape is read from its header (the reference loader maps, it does not copy). With
 * cov_bytes (may be NULL): what the covariance sums in blocks of `block` will take, a
 * cols x block array of doubles for each distinct input the collector meets (the layer
 * matrices' but k, v and up, which share q's and gate's, and the head's). */
static int self_size(const char *model, struct load_opts *lo, size_t len, size_t block, uint64_t *cov_bytes,
		     struct hearth_error *err)
{
	struct gguf_file *f = NULL;
	struct model *m = NULL;
	struct model_opts mo = { .max_ctx = (uint32_t)len, .kv_type = MODEL_KV_F16 };
	int rc;
	if ((rc = gguf_open(&f, model, err)) < 0 || (rc = model_load(&m, f, &mo, err)) < 0) {
		gguf_close(f);
		return rc;
	}
	uint64_t per_pos = 0;
	for (uint32_t l = 0; l < m->hp.n_layer; l++)
		per_pos += (uint64_t)m->layers[l].n_head_kv * (m->layers[l].head_dim + m->layers[l].head_dim_v) * 2;
	uint64_t want = per_pos * len * lo->max_seqs;
	want += want / 8 + ((uint64_t)1 << 20); /* the pool's pages and rounding */
	if (want > lo->kv_budget)
		lo->kv_budget = want;
	if (cov_bytes)
		*cov_bytes = 0;
	for (uint64_t i = 0; cov_bytes && i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		char name[256];
		if (t->n_dims != 2 || t->name.len >= sizeof name)
			continue;
		memcpy(name, t->name.ptr, t->name.len);
		name[t->name.len] = '\0';
		bool layer = !strncmp(name, "blk.", 4) && !imatrix_cov_shared(name, NULL, 0);
		bool head = !strcmp(name, imatrix_head_name(m->hp.tied_output));
		size_t cols = (size_t)t->ne[0];
		if (layer || head) /* its sums, and its inputs waiting to be added */
			*cov_bytes += (uint64_t)cols * (block < cols ? block : cols) * sizeof(double) +
				      (uint64_t)IMATRIX_SELF_DEFER * gptq_cov_ld(cols) * sizeof(float);
	}
	model_free(m);
	gguf_close(f);
	return 0;
}

/* The sampling's load: a calibration load (imatrix_load_opts) with W4A8's integer products,
 * as hearthd serves by default, so the samples are the served model's. The collector sees
 * the float inputs either way; on the trained models the files give the same fidelity
 * (KL 0.000325 against 0.000327 from W4A16 samples) and on the Qwen3-1.7B shape the
 * sampling runs about 1.4 times as fast. */
static void self_load_opts(struct load_opts *lo, const struct imatrix_self_opts *so)
{
	imatrix_load_opts(lo, so->len, so->n_seqs);
	lo->act = Q4_ACT_A8;
}

int imatrix_self_plan(const char *model, const struct load_opts *base, const struct imatrix_self_opts *so,
		      uint64_t *bytes, struct hearth_error *err)
{
	struct load_opts lo = *base;
	uint64_t cov = 0;
	size_t arena;
	self_load_opts(&lo, so);
	int rc = self_size(model, &lo, so->len, so->cov_block, so->cov_block ? &cov : NULL, err);
	if (rc < 0 || (rc = load_plan_size(model, &lo, &arena, err)) < 0)
		return rc;
	/* Past the cap the run fails instead of growing. */
	uint64_t cap = imatrix_cov_max();
	*bytes = (uint64_t)arena + (cov < cap ? cov : cap);
	return 0;
}

int imatrix_self_make(const char *model, const struct load_opts *base, const struct imatrix_self_opts *so,
		      const char *out, size_t *n_entries, struct hearth_error *err)
{
	struct load_opts lo = *base;
	struct model_q4 *m = NULL;
	struct tok *t = NULL;
	struct imatrix_stats *s = NULL;
	self_load_opts(&lo, so);
	int rc = self_size(model, &lo, so->len, 0, NULL, err);
	if (rc < 0 || (rc = imatrix_stats_new(&s, err)) < 0)
		return rc;
	if (so->cov_block)
		imatrix_stats_keep_cov(s, so->cov_block, imatrix_cov_max());
	if ((rc = load_q4(&m, &t, model, &lo, err)) < 0)
		goto out;
	struct engine eng;
	model_q4_engine(m, &eng);
	/* This thread steps the pool, as the daemon's compute thread does, pinned as it is
	 * for the run and given its own CPUs back after (hearthd's loader goes on loading). */
	cpu_set_t cpus;
	bool pinned = pthread_getaffinity_np(pthread_self(), sizeof cpus, &cpus) == 0;
	if (eng.thread_init)
		eng.thread_init(eng.impl);
	rc = imatrix_stats_self(s, m, t, so->n_seqs, so->len, so->seed, so->progress, so->progress_arg, err);
	if (pinned)
		pthread_setaffinity_np(pthread_self(), sizeof cpus, &cpus);
	/* The model goes before the file is written: the covariances are the big part then. */
	tok_free(t);
	model_q4_free(m);
	if (rc < 0)
		goto out;
	char dataset[64];
	snprintf(dataset, sizeof dataset, "self: %zu sequences, seed %llu", so->n_seqs, (unsigned long long)so->seed);
	rc = imatrix_stats_write(s, out, dataset, (uint32_t)so->len, (uint32_t)so->n_seqs, err);
	if (rc == 0 && n_entries)
		*n_entries = imatrix_stats_entries(s);
out:
	imatrix_stats_free(s);
	return rc;
}
