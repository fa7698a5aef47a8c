/* Self-calibration: an imatrix (with covariances, for GPTQ) made from sequences the int4
 * model samples itself, no text needed. hearthd-tool imatrix --self and hearthd's
 * `imatrix = self` both make theirs here, so the two files are the same bytes. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <unistd.h>

#include "daemon/engine/gguf.h"
#include "daemon/engine/imatrix.h"
#include "daemon/engine/load.h"
#include "daemon/engine/model.h"
#include "daemon/engine/model_q4.h"
#include "daemon/engine/tokenizer.h"
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
 * shape is read from its header (the reference loader maps, it does not copy). */
static int self_kv_budget(const char *model, struct load_opts *lo, size_t len, struct hearth_error *err)
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
	model_free(m);
	gguf_close(f);
	return 0;
}

int imatrix_self_make(const char *model, const struct load_opts *base, const struct imatrix_self_opts *so,
		      const char *out, size_t *n_entries, struct hearth_error *err)
{
	struct load_opts lo = *base;
	struct model_q4 *m = NULL;
	struct tok *t = NULL;
	struct imatrix_stats *s = NULL;
	imatrix_load_opts(&lo, so->len, so->n_seqs);
	int rc = self_kv_budget(model, &lo, so->len, err);
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
