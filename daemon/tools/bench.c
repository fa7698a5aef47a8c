/* `hearthd-tool bench`: the resident int4 engine measured in-process, loaded by the daemon's own
 * loader and stepped on its pinned pool: pp (one prompt in one step) and tg (decode after that
 * prompt), per activation path, plus a streaming-read probe on the same threads, so decode can
 * be judged as a fraction of what the cores can stream. Output: a table, or JSON (bench/run.sh). */
#include "daemon/tools/tools.h"

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "daemon/engine/engine.h"
#include "daemon/engine/load.h"
#include "daemon/engine/model_q4.h"
#include "daemon/engine/tokenizer.h"
#include "kernels/dispatch.h"
#include "kernels/pool.h"
#include "protocol/error.h"
#include "protocol/clock.h"

#define BENCH_MAX_REPS 100
#define BENCH_PROBE_RUNS 5
#define BENCH_WARM_TOKENS 64
/* The probe slice read after every decode token: 4x the L3, so it streams from memory. */
#define BENCH_PROBE_SLICE (128u << 20)
/* KV bytes per position the bench budgets for: above any model it runs (an 8B model at
 * f16 needs 128 KiB). */
#define BENCH_KV_POS_BYTES (256u << 10)
/* uint64_t sums in a cache line: each probe thread writes its own line. */
#define BENCH_SUMS_PER_LINE 8

struct bench_opts {
	const char *model;
	const char *kernels;
	size_t threads;             /* 0: the loader's choice (every CPU of the node) */
	int reps;
	uint32_t pp, tg;
	bool act_a16, act_a8;
	size_t probe_mib;           /* 0: no probe */
	enum qtype kv_type;
	uint32_t weights_group;     /* load_opts.weights_group: 128, 64 or 32 */
	uint32_t head_bits;         /* load_opts.head_bits: 0 (the mix rule's), 4, 6 or 8 */
	uint32_t mix;               /* load_opts.mix: LOAD_MIX_AUTO or LOAD_MIX_OFF */
	uint32_t head_group;        /* load_opts.head_group: 0 (the loader's choice) or a layout */
	const char *imatrix;        /* load_opts.imatrix, or NULL */
	bool json;
};

/* Median and spread of one measurement over the repetitions. */
struct bench_stat {
	double med, min, max;
};

struct bench_run {
	enum q4_act_kind act;
	double load_s;
	struct bench_stat pp_tps, tg_tps, tg_gbs;
	/* With the probe: a probe slice read after every decode token of a repetition, their
	 * bytes over their time, and that repetition's decode GB/s as a percentage of it. A
	 * shared machine's bandwidth can change by half from one 30 ms pass to the next
	 * (doc/benchmarks.md), so decode is judged against the probe of its own moments, not
	 * only against the passes measured at start-up or a pass on either side. */
	struct bench_stat probe_paired, pct_paired;
	uint64_t tg_bytes;          /* weights + KV read by all tg tokens of one repetition */
};

/* Facts of the loaded model that do not depend on the activation path. */
struct bench_model {
	char arch[16], name[64], quant[48], backing[16];
	const char *isa;
	uint64_t n_params, matrix_params, matrix_bytes, decode_weight_bytes, kv_bytes_per_pos;
	uint64_t kv_sliding_bytes_per_pos; /* sliding layers: read for the last `window` only */
	uint32_t window;
	uint32_t n_vocab, n_layer;
	size_t n_threads;
	int cpus[MQ4_THREADS_MAX];
};

static int bench_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static struct bench_stat bench_stat_of(double *v, size_t n)
{
	struct bench_stat s = { 0, 0, 0 };
	if (n == 0)
		return s;
	qsort(v, n, sizeof *v, bench_cmp_double);
	s.min = v[0];
	s.max = v[n - 1];
	s.med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
	return s;
}

/* ---- streaming-read probe ---- */

struct bench_probe {
	const uint8_t *buf;
	size_t bytes;
	size_t win_off, win_len;    /* the window the next run reads */
	vec_sum_u64_fn sum_u64;
	uint64_t sums[MQ4_THREADS_MAX * BENCH_SUMS_PER_LINE]; /* a line per thread: no false sharing */
};

/* Each pool thread reads its own contiguous slice, the way the matmuls split row blocks. */
static void probe_run(void *arg, size_t t, size_t nt)
{
	struct bench_probe *p = arg;
	size_t b, e;
	pool_split(p->win_len / 4096, 1, t, nt, &b, &e);
	const uint8_t *s = p->buf + p->win_off + b * 4096;
	size_t n = (e - b) * 4096;
	p->sums[t * BENCH_SUMS_PER_LINE] = p->sum_u64(s, n);
}

/* First touch from the pool threads, so each slice's pages sit where its reader runs. Every
 * word differs: pages of one repeated byte let something below us (a hypervisor merging
 * same-content pages) serve the probe from a few cached pages, at rates far above what the
 * memory delivers, in some runs and not others. */
static void probe_touch(void *arg, size_t t, size_t nt)
{
	struct bench_probe *p = arg;
	size_t b, e;
	pool_split(p->bytes / 4096, 1, t, nt, &b, &e);
	uint64_t *w = (uint64_t *)(void *)((uint8_t *)p->buf + b * 4096);
	for (size_t i = 0; i < (e - b) * 512; i++)
		w[i] = (b * 512 + i + 1) * 0x9E3779B97F4A7C15ull;
}

/* Maps and first-touches the probe's buffer from the pool's threads (so its pages sit where
 * theirs do) and runs one untimed pass: page tables, frequency. */
static int probe_open(struct pool *pool, size_t mib, struct bench_probe **out, struct hearth_error *err)
{
	struct bench_probe *p = calloc(1, sizeof *p);
	*out = NULL;
	if (!p)
		return hearth_error_set(err, HEARTH_ENOMEM, "bench: out of memory for the probe");
	p->bytes = mib << 20;
	void *buf = mmap(NULL, p->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) {
		free(p);
		return hearth_error_errno(err, HEARTH_ENOMEM, errno, "bench: cannot map %zu MiB for the probe",
					  mib);
	}
	/* Same page size as the arena usually gets (THP), so TLB misses cost both the same. */
	madvise(buf, p->bytes, MADV_HUGEPAGE);
	p->buf = buf;
	p->sum_u64 = kern_active()->sum_u64;
	p->win_len = p->bytes;
	pool_run(pool, probe_touch, p);
	pool_run(pool, probe_run, p);
	*out = p;
	return 0;
}

/* One timed pass over the buffer on the pool's threads: GB/s. */
static double probe_pass(struct pool *pool, struct bench_probe *p)
{
	p->win_off = 0;
	p->win_len = p->bytes;
	double t0 = ((double)hearth_now_ns() * 1e-9);
	pool_run(pool, probe_run, p);
	return (double)p->bytes / (((double)hearth_now_ns() * 1e-9) - t0) * 1e-9;
}

/* The next slice of the buffer (the whole of a small one), so consecutive slices never
 * find each other's lines in cache; adds its bytes and seconds to *bytes and *secs. */
static void probe_slice(struct pool *pool, struct bench_probe *p, double *bytes, double *secs)
{
	size_t len = p->bytes < BENCH_PROBE_SLICE ? p->bytes : BENCH_PROBE_SLICE;
	if (p->win_off + p->win_len + len > p->bytes)
		p->win_off = 0;
	else
		p->win_off += p->win_len;
	p->win_len = len;
	double t0 = ((double)hearth_now_ns() * 1e-9);
	pool_run(pool, probe_run, p);
	*secs += ((double)hearth_now_ns() * 1e-9) - t0;
	*bytes += (double)len;
}

static void probe_close(struct bench_probe *p)
{
	if (!p)
		return;
	munmap((void *)p->buf, p->bytes);
	free(p);
}

/* ---- the model runs ---- */

static uint64_t bench_rng(uint64_t *s)
{
	/* xorshift64*: prompts only need to differ between repetitions */
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545F4914F6CDD1Dull;
}

static void bench_describe(const struct model_q4 *m, struct bench_model *d)
{
	memset(d, 0, sizeof *d);
	snprintf(d->arch, sizeof d->arch, "%s", m->arch_name);
	snprintf(d->name, sizeof d->name, "%s", m->name);
	snprintf(d->quant, sizeof d->quant, "%s", m->quant_name);
	snprintf(d->backing, sizeof d->backing, "%s", arena_backing_name(m->arena->backing));
	d->isa = m->kern->name;
	d->n_params = m->n_params;
	d->n_vocab = m->hp.n_vocab;
	d->n_layer = m->n_layer;
	d->n_threads = m->n_threads;
	memcpy(d->cpus, m->cpus, sizeof d->cpus);
	for (uint32_t l = 0; l < m->n_layer; l++) {
		const struct mq4_layer *L = &m->layers[l];
		const struct q4_matrix *ws[MQ4_LAYER_MATRICES] = { &L->wq, &L->wk, &L->wv, &L->wo,
								   &L->gate, &L->up, &L->down };
		for (size_t i = 0; i < MQ4_LAYER_MATRICES; i++) {
			/* int8 where the mix rule chose it */
			const struct q8_matrix *w8 = L->w8[i].data ? &L->w8[i] : NULL;
			d->decode_weight_bytes += w8 ? q8_matrix_bytes(w8) : q4_matrix_bytes(ws[i]);
			d->matrix_params += w8 ? (uint64_t)w8->rows * w8->cols : (uint64_t)ws[i]->rows * ws[i]->cols;
		}
		/* The cache's own row sizes (q8: codes + scale), so the figure is what attention reads. */
		uint64_t row = (uint64_t)L->n_head_kv *
			       (kv_row_bytes(&m->kv, L->head_dim) + kv_row_bytes(&m->kv, L->head_dim_v));
		if (L->window) {
			d->kv_sliding_bytes_per_pos += row;
			d->window = L->window;
		} else {
			d->kv_bytes_per_pos += row;
		}
	}
	/* The embedding and an untied head, int4, int6 or int8 (head_bits). */
	uint64_t embd_bytes, head_bytes;
	if (m->head_bits == LOAD_HEAD_INT6) {
		const struct q6_matrix *head = m->output6.data ? &m->output6 : &m->embd6;
		embd_bytes = q6_matrix_bytes(&m->embd6);
		head_bytes = q6_matrix_bytes(head);
		d->matrix_params += (uint64_t)m->embd6.rows * m->embd6.cols;
		if (m->output6.data)
			d->matrix_params += (uint64_t)head->rows * head->cols;
	} else if (m->head_bits == LOAD_HEAD_INT8) {
		const struct q8_matrix *head = m->output8.data ? &m->output8 : &m->embd8;
		embd_bytes = q8_matrix_bytes(&m->embd8);
		head_bytes = q8_matrix_bytes(head);
		d->matrix_params += (uint64_t)m->embd8.rows * m->embd8.cols;
		if (m->output8.data)
			d->matrix_params += (uint64_t)head->rows * head->cols;
	} else {
		const struct q4_matrix *head = m->output.data ? &m->output : &m->embd;
		embd_bytes = q4_matrix_bytes(&m->embd);
		head_bytes = q4_matrix_bytes(head);
		d->matrix_params += (uint64_t)m->embd.rows * m->embd.cols;
		if (m->output.data)
			d->matrix_params += (uint64_t)head->rows * head->cols;
	}
	bool untied = m->output.data || m->output6.data || m->output8.data;
	d->matrix_bytes = d->decode_weight_bytes + embd_bytes + (untied ? head_bytes : 0);
	/* Decode streams every layer matrix and the head once per step; the embedding lookup
	 * reads one row (counted as nothing). */
	d->decode_weight_bytes += head_bytes;
}

static void bench_prompt(int32_t *ids, uint32_t n, uint32_t n_vocab, uint64_t seed)
{
	uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
	for (uint32_t i = 0; i < n; i++)
		ids[i] = (int32_t)(bench_rng(&s) % n_vocab);
}

/* One prompt of pp tokens in one step, then tg greedy decode steps; seconds of each. */
/* One prompt and tg decode tokens. With a probe, a probe slice follows every token, outside
 * the token's time, and *probe_gbs gets the slices' bytes over their time. */
static int bench_once(struct engine *eng, uint32_t pp, uint32_t tg, uint64_t seed, int32_t *ids,
		      float *logits, struct pool *pool, struct bench_probe *pb, double *pp_s, double *tg_s,
		      double *probe_gbs, struct hearth_error *err)
{
	struct engine_seq *seq;
	uint32_t cached;
	int rc;

	bench_prompt(ids, pp, eng->n_vocab, seed);
	rc = eng->seq_open(eng->impl, ids, pp, pp + tg, 0, &seq, &cached, err);
	if (rc < 0)
		return rc;
	if (cached) {
		/* A prefix-cache hit would time less than pp tokens of work. */
		eng->seq_close(eng->impl, seq);
		return hearth_error_set(err, HEARTH_EINVAL, "bench: prompt %llu hit the prefix cache",
					(unsigned long long)seed);
	}
	struct engine_span sp = { .seq = seq, .tokens = ids, .n = pp, .logits = logits };
	double t0 = ((double)hearth_now_ns() * 1e-9);
	rc = eng->forward(eng->impl, &sp, 1, err);
	double t1 = ((double)hearth_now_ns() * 1e-9), tg_sum = 0, p_bytes = 0, p_secs = 0;
	for (uint32_t i = 0; rc == 0 && i < tg; i++) {
		double ta = ((double)hearth_now_ns() * 1e-9);
		/* Greedy, with the kernel the daemon's sampler uses. */
		int32_t next = (int32_t)kern_active()->argmax(logits, eng->n_vocab);
		sp = (struct engine_span){ .seq = seq, .tokens = &next, .n = 1, .logits = logits };
		rc = eng->forward(eng->impl, &sp, 1, err);
		tg_sum += ((double)hearth_now_ns() * 1e-9) - ta;
		if (pb)
			probe_slice(pool, pb, &p_bytes, &p_secs);
	}
	eng->seq_close(eng->impl, seq);
	*pp_s = t1 - t0;
	*tg_s = tg_sum;
	if (probe_gbs)
		*probe_gbs = p_secs > 0 ? p_bytes / p_secs * 1e-9 : 0;
	return rc;
}

/* Loads the model for one activation path, warms it up, and times o->reps repetitions. The
 * first load (*pb still NULL) opens the probe on its pool and measures it BENCH_PROBE_RUNS
 * times into *probe; every repetition reads a slice of it after each decode token. */
static int bench_act(const struct bench_opts *o, enum q4_act_kind act, struct bench_run *run,
		     struct bench_model *desc, struct bench_probe **pb, struct bench_stat *probe,
		     struct hearth_error *err)
{
	struct load_opts lo;
	struct model_q4 *m = NULL;
	struct tok *tok = NULL;
	struct engine eng;
	int32_t *ids = NULL;
	float *logits = NULL;
	double pp_tps[BENCH_MAX_REPS], tg_tps[BENCH_MAX_REPS], tg_gbs[BENCH_MAX_REPS];
	double paired[BENCH_MAX_REPS], pct[BENCH_MAX_REPS];
	int rc;

	load_opts_default(&lo);
	lo.act = act;
	lo.n_threads = o->threads;
	lo.kv_type = o->kv_type;
	lo.weights_group = o->weights_group;
	lo.head_bits = o->head_bits;
	lo.mix = o->mix;
	lo.head_group = o->head_group;
	lo.imatrix = o->imatrix;
	lo.max_seqs = 2;
	lo.step_tokens = o->pp > BENCH_WARM_TOKENS ? o->pp : BENCH_WARM_TOKENS;
	lo.max_context = (o->pp + o->tg + 15) / 16 * 16;
	if (lo.max_context < 2 * BENCH_WARM_TOKENS)
		lo.max_context = 2 * BENCH_WARM_TOKENS;
	/* Room for two full sequences at BENCH_KV_POS_BYTES each position, so a long --pp does
	 * not run out of blocks. */
	uint64_t kv = (uint64_t)lo.max_context * 2 * BENCH_KV_POS_BYTES;
	if (kv > lo.kv_budget)
		lo.kv_budget = kv;

	memset(run, 0, sizeof *run);
	run->act = act;
	double t0 = ((double)hearth_now_ns() * 1e-9);
	if ((rc = load_q4(&m, &tok, o->model, &lo, err)) < 0)
		return rc;
	run->load_s = ((double)hearth_now_ns() * 1e-9) - t0;
	model_q4_engine(m, &eng);
	/* The bench thread is the step thread: pinned to cpus[0] like the daemon's. */
	if (eng.thread_init)
		eng.thread_init(eng.impl);
	bench_describe(m, desc);

	ids = malloc((size_t)lo.step_tokens * sizeof *ids);
	logits = malloc((size_t)eng.n_vocab * sizeof *logits);
	if (!ids || !logits) {
		rc = hearth_error_set(err, HEARTH_ENOMEM, "bench: out of memory");
		goto done;
	}
	if (o->probe_mib && !*pb) {
		double gbs[BENCH_PROBE_RUNS];
		if ((rc = probe_open(m->pool, o->probe_mib, pb, err)) < 0)
			goto done;
		for (int r = 0; r < BENCH_PROBE_RUNS; r++)
			gbs[r] = probe_pass(m->pool, *pb);
		*probe = bench_stat_of(gbs, BENCH_PROBE_RUNS);
	}

	double pp_s, tg_s;
	uint64_t seed = (uint64_t)act << 32;
	if ((rc = bench_once(&eng, BENCH_WARM_TOKENS, 8, seed++, ids, logits, m->pool, NULL, &pp_s, &tg_s, NULL,
			     err)) < 0)
		goto done;
	/* KV bytes the tg tokens read: the token at position p attends to p + 1 positions, on a
	 * sliding layer to at most its window. */
	uint64_t kv_read = 0;
	for (uint32_t i = 0; i < o->tg; i++) {
		uint64_t seen = (uint64_t)o->pp + i + 1;
		kv_read += seen * desc->kv_bytes_per_pos +
			   (seen < desc->window ? seen : desc->window) * desc->kv_sliding_bytes_per_pos;
	}
	run->tg_bytes = (uint64_t)o->tg * desc->decode_weight_bytes + kv_read;
	for (int r = 0; r < o->reps; r++) {
		if ((rc = bench_once(&eng, o->pp, o->tg, seed++, ids, logits, m->pool, *pb, &pp_s, &tg_s,
				     &paired[r], err)) < 0)
			goto done;
		pp_tps[r] = o->pp / pp_s;
		tg_tps[r] = o->tg / tg_s;
		tg_gbs[r] = (double)run->tg_bytes / tg_s * 1e-9;
		pct[r] = paired[r] > 0 ? 100.0 * tg_gbs[r] / paired[r] : 0;
	}
	run->pp_tps = bench_stat_of(pp_tps, (size_t)o->reps);
	run->tg_tps = bench_stat_of(tg_tps, (size_t)o->reps);
	run->tg_gbs = bench_stat_of(tg_gbs, (size_t)o->reps);
	run->probe_paired = bench_stat_of(paired, (size_t)o->reps);
	run->pct_paired = bench_stat_of(pct, (size_t)o->reps);
	rc = 0;
done:
	free(ids);
	free(logits);
	tok_free(tok);
	model_q4_free(m);
	return rc;
}

/* ---- output ---- */

static const char *bench_act_name(enum q4_act_kind a)
{
	return a == Q4_ACT_A8 ? "W4A8" : "W4A16";
}

static const char *bench_kv_name(enum qtype t)
{
	return t == QTYPE_BF16 ? "bf16" : t == QTYPE_KV_Q8 ? "q8" : "f16";
}

static void bench_print_table(const struct bench_opts *o, const struct bench_model *d,
			      const struct bench_stat *probe, const struct bench_run *runs, size_t n)
{
	printf("hearthd-tool bench  %s  (%s \"%s\", %.3f B params, %u layers, vocab %u)\n", o->model,
	       d->arch, d->name, (double)d->n_params * 1e-9, d->n_layer, d->n_vocab);
	printf("kernels %s, %zu threads on cpus", d->isa, d->n_threads);
	for (size_t i = 0; i < d->n_threads; i++)
		printf("%s%d", i ? "," : " ", d->cpus[i]);
	printf(", arena %s, KV %s\n", d->backing, bench_kv_name(o->kv_type));
	printf("layout %s: %.1f MB of packed matrices, %.3f bits/weight over %.3f B matrix "
	       "params; decode reads %.1f MB of weights per token + %.1f KB KV per position\n",
	       d->quant, (double)d->matrix_bytes * 1e-6,
	       8.0 * (double)d->matrix_bytes / (double)d->matrix_params,
	       (double)d->matrix_params * 1e-9, (double)d->decode_weight_bytes * 1e-6,
	       (double)d->kv_bytes_per_pos * 1e-3);
	if (d->window)
		printf("sliding layers: %.1f KB KV per position, of the last %u positions only\n",
		       (double)d->kv_sliding_bytes_per_pos * 1e-3, d->window);
	if (o->probe_mib)
		printf("stream probe (%zu MiB, %zu threads): median %.1f GB/s (min %.1f, max %.1f), "
		       "%d runs\n", o->probe_mib, d->n_threads, probe->med, probe->min, probe->max,
		       BENCH_PROBE_RUNS);
	char h1[32], h2[32];
	snprintf(h1, sizeof h1, "pp%u tok/s", o->pp);
	snprintf(h2, sizeof h2, "tg%u tok/s", o->tg);
	printf("\n%-6s %6s  %-30s %-30s %-24s %-8s %s\n", "act", "load s", h1, h2, "decode GB/s",
	       "% probe", "% paired (probe GB/s)");
	for (size_t i = 0; i < n; i++) {
		const struct bench_run *r = &runs[i];
		char pp[48], tg[48], gbs[48], pct[16] = "-", paired[64] = "-";
		snprintf(pp, sizeof pp, "%.1f (%.1f-%.1f)", r->pp_tps.med, r->pp_tps.min, r->pp_tps.max);
		snprintf(tg, sizeof tg, "%.2f (%.2f-%.2f)", r->tg_tps.med, r->tg_tps.min, r->tg_tps.max);
		snprintf(gbs, sizeof gbs, "%.1f (%.1f-%.1f)", r->tg_gbs.med, r->tg_gbs.min, r->tg_gbs.max);
		if (o->probe_mib && probe->med > 0) {
			snprintf(pct, sizeof pct, "%.0f%%", 100.0 * r->tg_gbs.med / probe->med);
			snprintf(paired, sizeof paired, "%.0f%% (%.0f-%.0f%%) (%.1f)", r->pct_paired.med,
				 r->pct_paired.min, r->pct_paired.max, r->probe_paired.med);
		}
		printf("%-6s %6.1f  %-30s %-30s %-24s %-8s %s\n", bench_act_name(r->act), r->load_s, pp,
		       tg, gbs, pct, paired);
	}
	printf("(medians of %d repetitions, (min-max); tg: decode after a %u-token prompt; decode "
	       "GB/s = (weights + KV read per token) / time; %% probe: against the start-up probe; "
	       "%% paired: each repetition against probe slices read between its tokens)\n", o->reps,
	       o->pp);
}

static void bench_print_stat(const char *key, const struct bench_stat *s)
{
	printf("\"%s\":{\"median\":%.4f,\"min\":%.4f,\"max\":%.4f}", key, s->med, s->min, s->max);
}

static void bench_json_string(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

static void bench_print_json(const struct bench_opts *o, const struct bench_model *d,
			     const struct bench_stat *probe, const struct bench_run *runs, size_t n)
{
	printf("{\"engine\":\"hearth\",\"model\":");
	bench_json_string(o->model);
	printf(",\"arch\":");
	bench_json_string(d->arch);
	printf(",\"layout\":");
	bench_json_string(d->quant);
	printf(",\"kernels\":");
	bench_json_string(d->isa);
	printf(",\"arena\":");
	bench_json_string(d->backing);
	printf(",\"kv\":\"%s\"", bench_kv_name(o->kv_type));
	printf(",\"threads\":%zu,\"cpus\":[", d->n_threads);
	for (size_t i = 0; i < d->n_threads; i++)
		printf("%s%d", i ? "," : "", d->cpus[i]);
	printf("],\"n_params\":%llu,\"matrix_params\":%llu,\"matrix_bytes\":%llu,\"bpw\":%.4f,"
	       "\"decode_weight_bytes\":%llu,\"kv_bytes_per_pos\":%llu,\"kv_sliding_bytes_per_pos\":%llu,"
	       "\"window\":%u,\"reps\":%d,\"pp\":%u,\"tg\":%u,",
	       (unsigned long long)d->n_params, (unsigned long long)d->matrix_params,
	       (unsigned long long)d->matrix_bytes,
	       8.0 * (double)d->matrix_bytes / (double)d->matrix_params,
	       (unsigned long long)d->decode_weight_bytes, (unsigned long long)d->kv_bytes_per_pos,
	       (unsigned long long)d->kv_sliding_bytes_per_pos, d->window,
	       o->reps, o->pp, o->tg);
	if (o->probe_mib) {
		printf("\"probe_mib\":%zu,", o->probe_mib);
		bench_print_stat("probe_gbs", probe);
		putchar(',');
	}
	printf("\"runs\":[");
	for (size_t i = 0; i < n; i++) {
		const struct bench_run *r = &runs[i];
		printf("%s{\"act\":\"%s\",\"load_s\":%.3f,", i ? "," : "", r->act == Q4_ACT_A8 ? "a8" : "a16",
		       r->load_s);
		bench_print_stat("pp_tps", &r->pp_tps);
		putchar(',');
		bench_print_stat("tg_tps", &r->tg_tps);
		putchar(',');
		bench_print_stat("tg_gbs", &r->tg_gbs);
		printf(",\"tg_bytes\":%llu", (unsigned long long)r->tg_bytes);
		if (o->probe_mib && probe->med > 0) {
			printf(",\"tg_pct_probe\":%.2f,", 100.0 * r->tg_gbs.med / probe->med);
			bench_print_stat("probe_paired_gbs", &r->probe_paired);
			putchar(',');
			bench_print_stat("tg_pct_paired", &r->pct_paired);
		}
		putchar('}');
	}
	printf("]}\n");
}

/* ---- options ---- */

static void bench_usage(FILE *to)
{
	fprintf(to,
		"usage: hearthd-tool bench --model FILE.gguf [options]\n"
		"  -m, --model FILE      GGUF model, loaded as the daemon loads it\n"
		"  -t, --threads N       compute threads (default: every CPU of the NUMA node)\n"
		"  -r, --reps N          repetitions of each measurement (default 3)\n"
		"      --pp N            prompt tokens, run as one step (default 512)\n"
		"      --tg N            tokens decoded after the prompt (default 128)\n"
		"      --act a16|a8|both activation path(s) (default both)\n"
		"      --probe-mib N     streaming-read probe buffer, 0 = no probe (default 1024)\n"
		"      --kv f16|bf16|q8  KV cache type (default f16, as llama.cpp's; q8: int8 rows\n"
		"                        with one f32 scale each)\n"
		"      --weights-group 128|64|32  layout of matrices quantized at load, as the\n"
		"                        weights_group key of hearthd.conf(5) (default 64)\n"
		"      --head auto|int4|int6|int8  embedding/head weights, as the head key of\n"
		"                        hearthd.conf(5) (default auto)\n"
		"      --mix auto|off    more bits for the most sensitive matrices (an int6 head,\n"
		"                        int8 layer matrices) within 4.5 bits per weight, as\n"
		"                        weights_mix of hearthd.conf(5)\n"
		"                        (default auto)\n"
		"      --head-group 128|32|32a  the int4 embedding/head's layout instead of the\n"
		"                        loader's (group 128 asym, 32 sym, 32 asym): A/B runs\n"
		"      --imatrix FILE    llama-imatrix statistics for the int4 scale search, as the\n"
		"                        imatrix key of hearthd.conf(5)\n"
		"      --kernels NAME    auto|ref|avx2|avx512 (default auto)\n"
		"      --json            one JSON object instead of the table\n");
}

/* One of n words (words[i] gives values[i]); else says which words the option takes. */
static int bench_parse_word(const char *name, const char *s, const char *const *words, const int *values,
			    size_t n, int *out)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(s, words[i])) {
			*out = values[i];
			return 0;
		}
	fprintf(stderr, "hearthd-tool bench: %s '%s' is not ", name, s);
	for (size_t i = 0; i < n; i++)
		fprintf(stderr, "%s%s", words[i], i + 2 < n ? ", " : i + 1 < n ? " or " : "\n");
	return -1;
}

/* Returns 0, 1 for --help (exit 0), or -1. */
static int bench_parse(int argc, char **argv, struct bench_opts *o)
{
	enum { OPT_BENCH = 256, OPT_PP, OPT_TG, OPT_ACT, OPT_PROBE, OPT_KV, OPT_KERNELS, OPT_JSON, OPT_GROUP,
	       OPT_HEAD, OPT_HEAD_GROUP, OPT_MIX, OPT_IMATRIX };
	static const struct option longopts[] = {
		{ "bench", no_argument, NULL, OPT_BENCH },
		{ "model", required_argument, NULL, 'm' },
		{ "threads", required_argument, NULL, 't' },
		{ "reps", required_argument, NULL, 'r' },
		{ "pp", required_argument, NULL, OPT_PP },
		{ "tg", required_argument, NULL, OPT_TG },
		{ "act", required_argument, NULL, OPT_ACT },
		{ "probe-mib", required_argument, NULL, OPT_PROBE },
		{ "kv", required_argument, NULL, OPT_KV },
		{ "kernels", required_argument, NULL, OPT_KERNELS },
		{ "weights-group", required_argument, NULL, OPT_GROUP },
		{ "head", required_argument, NULL, OPT_HEAD },
		{ "head-group", required_argument, NULL, OPT_HEAD_GROUP },
		{ "imatrix", required_argument, NULL, OPT_IMATRIX },
		{ "mix", required_argument, NULL, OPT_MIX },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	long v;
	int c;

	memset(o, 0, sizeof *o);
	o->reps = 3;
	o->pp = 512;
	o->tg = 128;
	o->act_a16 = o->act_a8 = true;
	o->probe_mib = 1024;
	o->kv_type = QTYPE_F16;
	o->weights_group = LOAD_GROUP_64;
	optind = 1;
	while ((c = getopt_long(argc, argv, "m:t:r:h", longopts, NULL)) != -1) {
		switch (c) {
		case OPT_BENCH: break;
		case 'm': o->model = optarg; break;
		case 't':
			if (tool_parse_long("bench", "--threads", optarg, 1, MQ4_THREADS_MAX, &v) < 0)
				return -1;
			o->threads = (size_t)v;
			break;
		case 'r':
			if (tool_parse_long("bench", "--reps", optarg, 1, BENCH_MAX_REPS, &v) < 0)
				return -1;
			o->reps = (int)v;
			break;
		case OPT_PP:
			if (tool_parse_long("bench", "--pp", optarg, 1, 1 << 16, &v) < 0)
				return -1;
			o->pp = (uint32_t)v;
			break;
		case OPT_TG:
			if (tool_parse_long("bench", "--tg", optarg, 1, 1 << 16, &v) < 0)
				return -1;
			o->tg = (uint32_t)v;
			break;
		case OPT_ACT:
			o->act_a16 = !strcmp(optarg, "a16") || !strcmp(optarg, "both");
			o->act_a8 = !strcmp(optarg, "a8") || !strcmp(optarg, "both");
			if (!o->act_a16 && !o->act_a8) {
				fprintf(stderr, "hearthd-tool bench: --act '%s' is not a16, a8 or both\n", optarg);
				return -1;
			}
			break;
		case OPT_PROBE:
			if (tool_parse_long("bench", "--probe-mib", optarg, 0, 1 << 16, &v) < 0)
				return -1;
			o->probe_mib = (size_t)v;
			break;
		case OPT_KV: {
			static const char *const w[] = { "f16", "bf16", "q8" };
			static const int val[] = { QTYPE_F16, QTYPE_BF16, QTYPE_KV_Q8 };
			int x;
			if (bench_parse_word("--kv", optarg, w, val, 3, &x) < 0)
				return -1;
			o->kv_type = (enum qtype)x;
			break;
		}
		case OPT_KERNELS: o->kernels = optarg; break;
		case OPT_GROUP: {
			static const char *const w[] = { "128", "64", "32" };
			static const int val[] = { LOAD_GROUP_128, LOAD_GROUP_64, LOAD_GROUP_32 };
			int x;
			if (bench_parse_word("--weights-group", optarg, w, val, 3, &x) < 0)
				return -1;
			o->weights_group = (uint32_t)x;
			break;
		}
		case OPT_HEAD: {
			static const char *const w[] = { "auto", "int4", "int6", "int8" };
			static const int val[] = { 0, LOAD_HEAD_INT4, LOAD_HEAD_INT6, LOAD_HEAD_INT8 };
			int x;
			if (bench_parse_word("--head", optarg, w, val, 4, &x) < 0)
				return -1;
			o->head_bits = (uint32_t)x;
			break;
		}
		case OPT_MIX: {
			static const char *const w[] = { "auto", "off" };
			static const int val[] = { LOAD_MIX_AUTO, LOAD_MIX_OFF };
			int x;
			if (bench_parse_word("--mix", optarg, w, val, 2, &x) < 0)
				return -1;
			o->mix = (uint32_t)x;
			break;
		}
		case OPT_HEAD_GROUP: {
			static const char *const w[] = { "128", "32", "32a" };
			static const int val[] = { LOAD_GROUP_128, LOAD_GROUP_32, LOAD_GROUP_32_ASYM };
			int x;
			if (bench_parse_word("--head-group", optarg, w, val, 3, &x) < 0)
				return -1;
			o->head_group = (uint32_t)x;
			break;
		}
		case OPT_IMATRIX: o->imatrix = optarg; break;
		case OPT_JSON: o->json = true; break;
		case 'h': bench_usage(stdout); return 1;
		default: bench_usage(stderr); return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "hearthd-tool bench: unexpected argument '%s'\n", argv[optind]);
		return -1;
	}
	if (!o->model) {
		fprintf(stderr, "hearthd-tool bench: needs --model FILE\n");
		bench_usage(stderr);
		return -1;
	}
	return 0;
}

int tool_bench(int argc, char **argv)
{
	struct bench_opts o;
	struct bench_model desc;
	struct bench_stat probe = { 0, 0, 0 };
	struct bench_probe *pb = NULL;
	struct bench_run runs[2];
	struct hearth_error err = { 0 };
	size_t n = 0;
	int rc;

	rc = bench_parse(argc, argv, &o);
	if (rc)
		return rc > 0 ? 0 : 2;
	rc = kern_select(o.kernels);
	if (rc < 0) {
		fprintf(stderr, "hearthd-tool bench: --kernels '%s': %s\n", o.kernels,
			rc == HEARTH_EUNSUPPORTED ? "this CPU cannot run it" : "unknown (auto, ref, avx2, avx512)");
		return 2;
	}
	const enum q4_act_kind acts[2] = { Q4_ACT_A16, Q4_ACT_A8 };
	for (size_t i = 0; i < 2; i++) {
		if ((acts[i] == Q4_ACT_A16 && !o.act_a16) || (acts[i] == Q4_ACT_A8 && !o.act_a8))
			continue;
		if (!o.json)
			fprintf(stderr, "hearthd-tool bench %s: loading %s\n", bench_act_name(acts[i]), o.model);
		rc = bench_act(&o, acts[i], &runs[n], &desc, &pb, &probe, &err);
		if (rc < 0) {
			fprintf(stderr, "hearthd-tool bench: %s\n", err.msg[0] ? err.msg : hearth_strerror(rc));
			probe_close(pb);
			return 1;
		}
		n++;
	}
	probe_close(pb);
	if (o.json)
		bench_print_json(&o, &desc, &probe, runs, n);
	else
		bench_print_table(&o, &desc, &probe, runs, n);
	return 0;
}
