/* Importance statistics made here: calibration text runs through the int4 engine or the f32
 * reference and every layer matrix's input columns are summed squared, as llama-imatrix sums
 * them, then written in its GGUF so that hearth (imatrix =) and llama-quantize read the file. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/imatrix.h"
#include "daemon/engine/model_q4.h"
#include "daemon/engine/sampler.h"
#include "daemon/engine/tokenizer.h"
#include "kernels/dispatch.h"
#include "kernels/gptq.h"
#include "protocol/assert.h"

struct imatrix_entry {
	char *name;                    /* the weight's tensor name */
	size_t cols;
	double *sum;                   /* cols sums of x^2 */
	double *cov;                   /* with imatrix_stats_keep_cov: cols x cov_block sums of
					* x x^T (kernels/gptq.h's blocked layout, upper triangles),
					* NULL for inputs another entry holds */
	size_t cov_block;
	float *pending;                /* imatrix_stats_defer: n_pending inputs (up to
					* pending_cap, at gptq_cov_ld's stride) whose covariance
					* sums imatrix_stats_flush has still to add */
	size_t n_pending, pending_cap;
	uint64_t count;                /* tokens (matrix input rows) behind them */
};

struct imatrix_stats {
	struct imatrix_entry *e;
	size_t n, cap;
	size_t cov_block;              /* imatrix_stats_keep_cov's; 0: no covariances */
	size_t defer;                  /* imatrix_stats_defer's tokens; 0: off */
	size_t batch;                  /* and its batches (gptq_cov_add_part) */
	uint64_t cov_bytes, cov_cap;   /* what the covariances hold, and may */
	bool failed;                   /* an add failed: code and why say how */
	int code;
	char why[160];
};

int imatrix_stats_new(struct imatrix_stats **out, struct hearth_error *err)
{
	*out = calloc(1, sizeof **out);
	return *out ? 0 : hearth_error_set(err, HEARTH_ENOMEM, "imatrix: out of memory");
}

void imatrix_stats_free(struct imatrix_stats *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->n; i++) {
		free(s->e[i].name);
		free(s->e[i].sum);
		free(s->e[i].cov);
		free(s->e[i].pending);
	}
	free(s->e);
	free(s);
}

void imatrix_stats_keep_cov(struct imatrix_stats *s, size_t block, uint64_t max_bytes)
{
	s->cov_block = block;
	s->cov_cap = max_bytes;
}

static struct imatrix_entry *stats_find(const struct imatrix_stats *s, const char *name, size_t len)
{
	for (size_t i = 0; i < s->n; i++)
		if (strlen(s->e[i].name) == len && !memcmp(s->e[i].name, name, len))
			return &s->e[i];
	return NULL;
}

static struct imatrix_entry *stats_fail(struct imatrix_stats *s, const char *name, size_t len, int code,
					 const char *what)
{
	s->failed = true;
	s->code = code;
	snprintf(s->why, sizeof s->why, "imatrix: %.*s: %s", (int)(len > 80 ? 80 : len), name, what);
	return NULL;
}

static struct imatrix_entry *stats_entry(struct imatrix_stats *s, const char *name, size_t len, size_t cols)
{
	struct imatrix_entry *e = stats_find(s, name, len);
	if (e)
		return e->cols == cols ? e : stats_fail(s, name, len, HEARTH_EINVAL, "its input changed width between tokens");
	if (len > 255)
		return stats_fail(s, name, len, HEARTH_EINVAL, "name longer than 255 bytes");
	if (s->n == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 64;
		struct imatrix_entry *grown = realloc(s->e, cap * sizeof *grown);
		if (!grown)
			return stats_fail(s, name, len, HEARTH_ENOMEM, "out of memory for the statistics");
		s->e = grown;
		s->cap = cap;
	}
	double *sum = calloc(cols, sizeof *sum), *cov = NULL;
	char *copy = malloc(len + 1);
	if (copy) {
		memcpy(copy, name, len);
		copy[len] = '\0';
	}
	/* One covariance per distinct input: k and v read q's, up reads gate's. */
	size_t block = s->cov_block < cols ? s->cov_block : cols;
	if (s->cov_block && copy && !imatrix_cov_shared(copy, NULL, 0)) {
		uint64_t bytes = (uint64_t)cols * block * sizeof *cov;
		if (s->cov_bytes + bytes > s->cov_cap) {
			free(sum);
			free(copy);
			char why[120];
			snprintf(why, sizeof why, "the covariances would pass %llu MiB (blocks of %zu columns: narrower ones fit)",
				 (unsigned long long)(s->cov_cap >> 20), block);
			return stats_fail(s, name, len, HEARTH_ENOMEM, why);
		}
		if (!(cov = calloc(cols * block, sizeof *cov))) {
			free(sum);
			free(copy);
			return stats_fail(s, name, len, HEARTH_ENOMEM, "out of memory for the covariance");
		}
		s->cov_bytes += bytes;
	}
	if (!sum || !copy) {
		free(sum);
		free(copy);
		free(cov);
		return stats_fail(s, name, len, HEARTH_ENOMEM, "out of memory for the statistics");
	}
	s->e[s->n] = (struct imatrix_entry){ .name = copy, .cols = cols, .sum = sum, .cov = cov,
					     .cov_block = cov ? block : 0 };
	return &s->e[s->n++];
}

/* The waiting inputs' covariance sums, rows of part `part` of n_parts (gptq_cov_add_part). */
static void pending_add(const struct imatrix_entry *e, size_t batch, size_t part, size_t n_parts,
			vec_cov_rows_fn rows)
{
	gptq_cov_add_part(e->cov, e->cols, e->cov_block, e->pending, gptq_cov_ld(e->cols), e->n_pending, batch, part,
			  n_parts, rows);
}

void imatrix_stats_add(struct imatrix_stats *s, const char *name, size_t len, const float *x, size_t n_tok,
		       size_t cols)
{
	if (s->failed)
		return;
	struct imatrix_entry *e = stats_entry(s, name, len, cols);
	if (!e)
		return;
	for (size_t t = 0; t < n_tok; t++)
		for (size_t k = 0; k < cols; k++)
			e->sum[k] += (double)x[t * cols + k] * x[t * cols + k];
	e->count += n_tok;
	if (!e->cov)
		return;
	vec_cov_rows_fn rows = kern_active()->cov_rows;
	/* Added at once: off (0), more than waits, or an add that waiting would batch otherwise
	 * than adding it at once does (gptq_cov_add's batches are GPTQ_COV_TOKENS long). */
	bool direct = n_tok > s->defer || (n_tok > s->batch && s->batch != GPTQ_COV_TOKENS);
	/* What waits came first: it is added now, alone, unless this add joins it, which it
	 * does where its batches come out as its own would (what waits is whole batches and
	 * it fits). */
	if (e->n_pending && (direct || e->n_pending % s->batch || e->n_pending + n_tok > s->defer)) {
		pending_add(e, s->batch, 0, 1, rows);
		e->n_pending = 0;
	}
	if (direct) {
		if (gptq_cov_add(e->cov, cols, e->cov_block, x, n_tok, rows) < 0)
			stats_fail(s, name, len, HEARTH_ENOMEM, "out of memory for the covariance");
		return;
	}
	size_t ld = gptq_cov_ld(cols);
	if (e->pending_cap < s->defer) {
		free(e->pending);
		e->pending_cap = 0;
		if (!(e->pending = malloc(s->defer * ld * sizeof *e->pending))) {
			stats_fail(s, name, len, HEARTH_ENOMEM, "out of memory for the covariance");
			return;
		}
		e->pending_cap = s->defer;
	}
	for (size_t t = 0; t < n_tok; t++)
		memcpy(e->pending + (e->n_pending + t) * ld, x + t * cols, cols * sizeof *x);
	e->n_pending += n_tok;
}

struct flush_job {
	struct imatrix_stats *s;
	vec_cov_rows_fn rows;
};

static void flush_part(void *arg, size_t t, size_t n_threads)
{
	const struct flush_job *j = arg;
	for (size_t k = 0; k < j->s->n; k++)
		if (j->s->e[k].n_pending)
			pending_add(&j->s->e[k], j->s->batch, t, n_threads, j->rows);
}

void imatrix_stats_flush(struct imatrix_stats *s, struct pool *pool)
{
	struct flush_job j = { s, kern_active()->cov_rows };
	if (pool)
		pool_run(pool, flush_part, &j);
	else
		flush_part(&j, 0, 1);
	for (size_t k = 0; k < s->n; k++)
		s->e[k].n_pending = 0;
}

void imatrix_stats_defer(struct imatrix_stats *s, size_t tokens, size_t batch)
{
	imatrix_stats_flush(s, NULL);
	s->defer = tokens;
	s->batch = batch == 0 || batch > GPTQ_COV_TOKENS ? GPTQ_COV_TOKENS : batch;
}

/* Layer matrices only ("blk."), as llama-imatrix collects by default: the embedding is a
 * lookup and the head's input is one token's here. */
void imatrix_stats_observe(void *arg, const struct gguf_tensor *w, const float *x, size_t n_tok)
{
	if (w->name.len > 4 && !memcmp(w->name.ptr, "blk.", 4) && w->n_dims == 2)
		imatrix_stats_add(arg, w->name.ptr, (size_t)w->name.len, x, n_tok, (size_t)w->ne[0]);
}

bool imatrix_stats_ok(const struct imatrix_stats *s, struct hearth_error *err)
{
	if (!s->failed)
		return true;
	hearth_error_set(err, s->code, "%s", s->why);
	return false;
}

int imatrix_stats_run(struct imatrix_stats *s, const struct model *m, struct model_ctx *ctx, const int32_t *ids,
		      size_t n, float *logits, struct hearth_error *err)
{
	model_ctx_reset(ctx);
	model_ctx_observe(ctx, imatrix_stats_observe, s);
	int rc = model_forward(m, ctx, ids, n, MODEL_LOGITS_LAST, logits, err);
	model_ctx_observe(ctx, NULL, NULL);
	if (rc == 0 && !imatrix_stats_ok(s, err))
		rc = s->code;
	return rc;
}

int imatrix_stats_text(const struct tok *t, const char *text, size_t len, size_t chunk, size_t max_chunks,
		       imatrix_run_fn run, void *run_arg, void (*progress)(void *arg, size_t done, size_t total),
		       void *progress_arg, size_t *n_chunks, struct hearth_error *err)
{
	int32_t *ids = NULL;
	size_t n = 0;
	/* As llama-imatrix tokenizes: the model's BOS first, no special tokens parsed. */
	int rc = tok_encode_alloc(t, text, len, tok_add_bos(t), false, &ids, &n, err);
	if (rc < 0)
		return rc;
	if (chunk == 0 || n < chunk) {
		free(ids);
		return hearth_error_set(err, HEARTH_EINVAL, "%zu tokens, fewer than one chunk of %zu", n, chunk);
	}
	size_t total = n / chunk;
	if (max_chunks && max_chunks < total)
		total = max_chunks;
	int32_t bos = tok_bos(t);
	for (size_t c = 0; c < total && rc == 0; c++) {
		int32_t *ck = ids + c * chunk;
		/* As llama-imatrix: every chunk a document of its own, BOS in its first token's place. */
		if (tok_add_bos(t) && bos != TOK_NULL)
			ck[0] = bos;
		rc = run(run_arg, ck, chunk, err);
		if (rc == 0 && progress)
			progress(progress_arg, c + 1, total);
	}
	free(ids);
	*n_chunks = rc == 0 ? total : 0;
	return rc;
}

int imatrix_run_ref(void *arg, const int32_t *ids, size_t n, struct hearth_error *err)
{
	struct imatrix_ref_run *r = arg;
	return imatrix_stats_run(r->s, r->m, r->ctx, ids, n, r->logits, err);
}

static const char *const q4_mat_names[MQ4_LAYER_MATRICES] = {
	[MQ4_WQ] = "attn_q", [MQ4_WK] = "attn_k", [MQ4_WV] = "attn_v", [MQ4_WO] = "attn_output",
	[MQ4_GATE] = "ffn_gate", [MQ4_UP] = "ffn_up", [MQ4_DOWN] = "ffn_down",
};

const char *imatrix_head_name(bool tied)
{
	return tied ? "token_embd.weight" : "output.weight";
}

/* model_q4_observe's callback: the input under the GGUF name of the matrix it feeds. */
static void q4_observe(void *arg, uint32_t layer, int mat, const float *x, size_t n_tok, size_t cols)
{
	char name[64];
	int len = mat >= MQ4_LAYER_MATRICES ? snprintf(name, sizeof name, "%s", imatrix_head_name(mat == MQ4_OBSERVE_TIED_HEAD))
					    : snprintf(name, sizeof name, "blk.%u.%s.weight", layer, q4_mat_names[mat]);
	imatrix_stats_add(arg, name, (size_t)len, x, n_tok, cols);
}

/* imatrix_run_q4's step with covariances: a step's inputs wait, tokens x cols floats for
 * each distinct input (about 176 MB for the Qwen3-1.7B shape at 128), and most of a
 * prefill's speed is there by 128 tokens. */
#define IMATRIX_TEXT_DEFER 128

int imatrix_run_q4(void *arg, const int32_t *ids, size_t n, struct hearth_error *err)
{
	struct imatrix_q4_run *r = arg;
	struct engine eng;
	struct engine_seq *seq;
	uint32_t cached;
	model_q4_engine(r->m, &eng);
	float *embd = NULL;
	const char *head = imatrix_head_name(r->m->hp.tied_output);
	if (r->head && !(embd = malloc((size_t)r->m->step_tokens * eng.n_embd * sizeof *embd)))
		return hearth_error_set(err, HEARTH_ENOMEM, "imatrix: out of memory for the head's inputs");
	int rc = eng.seq_open(eng.impl, ids, (uint32_t)n, (uint32_t)n, ENGINE_SHARE_PRIVATE, &seq, &cached, err);
	if (rc < 0) {
		free(embd);
		return rc;
	}
	/* With covariances, steps of at most IMATRIX_TEXT_DEFER tokens whose sums wait for the
	 * step's end and then run on every thread (added inside the step they took thread 0
	 * alone while the others waited at its barrier). */
	size_t step = r->m->step_tokens;
	if (r->s->cov_block) {
		step = step < IMATRIX_TEXT_DEFER ? step : IMATRIX_TEXT_DEFER;
		imatrix_stats_defer(r->s, step, GPTQ_COV_TOKENS);
	}
	model_q4_observe(r->m, q4_observe, r->s);
	for (size_t at = 0; rc == 0 && at < n; at += step) {
		size_t k = n - at < step ? n - at : step;
		struct engine_span sp = { .seq = seq, .tokens = ids + at, .n = (uint32_t)k, .embd = embd };
		if ((rc = eng.forward(eng.impl, &sp, 1, err)) == 0 && embd)
			imatrix_stats_add(r->s, head, strlen(head), embd, k, eng.n_embd);
		if (rc == 0 && r->s->defer)
			imatrix_stats_flush(r->s, r->m->pool);
	}
	model_q4_observe(r->m, NULL, NULL);
	imatrix_stats_defer(r->s, 0, 0);
	eng.seq_close(eng.impl, seq);
	free(embd);
	if (rc == 0 && !imatrix_stats_ok(r->s, err))
		rc = r->s->code;
	return rc;
}

/* One round of imatrix_stats_self: sequences first..first+n-1, n at most what the engine
 * holds at once. */
struct self_progress {
	bool (*fn)(void *arg, size_t done, size_t total);
	void *arg;
	size_t total;                  /* tokens sampled in all */
};

/* The next token of every sequence, sequences split among the pool's threads: each has its
 * own sampler and seed, so the split changes nothing, and the softmax over the whole
 * vocabulary a sequence costs (151,936 exps for Qwen3) no longer leaves the other threads
 * waiting between steps. */
struct sample_job {
	struct sampler **smp;
	const float *logits;
	int32_t *next;
	size_t n;
	uint32_t n_vocab;
};

static void sample_part(void *arg, size_t t, size_t nt)
{
	const struct sample_job *j = arg;
	for (size_t i = t; i < j->n; i += nt)
		j->next[i] = sampler_sample(j->smp[i], j->logits + i * (size_t)j->n_vocab);
}

static int self_round(struct imatrix_stats *s, struct model_q4 *m, struct engine *eng, int32_t bos, size_t first,
		      size_t n, size_t len, uint64_t seed, const struct self_progress *pr, struct hearth_error *err)
{
	struct engine_seq **seq = calloc(n, sizeof *seq);
	struct sampler **smp = calloc(n, sizeof *smp);
	struct engine_span *sp = calloc(n, sizeof *sp);
	int32_t *next = calloc(n, sizeof *next);
	float *logits = malloc(n * (size_t)eng->n_vocab * sizeof *logits);
	int rc = 0;
	if (!seq || !smp || !sp || !next || !logits) {
		rc = hearth_error_set(err, HEARTH_ENOMEM, "imatrix: out of memory for the sampled sequences");
		goto out;
	}
	/* Plain sampling at temperature 1 (no truncation): the model's own distribution, so the
	 * text covers what the model writes, not only its likeliest words. */
	struct sampler_params par;
	sampler_params_default(&par);
	par.temperature = 1.0f;
	par.top_k = 0;
	par.top_p = 1.0f;
	par.min_p = 0.0f;
	par.repeat_penalty = 1.0f;
	for (size_t i = 0; i < n && rc == 0; i++) {
		uint32_t cached;
		par.seed = seed + first + i;
		next[i] = bos;
		if ((rc = sampler_new(&smp[i], &par, eng->n_vocab, err)) == 0)
			rc = eng->seq_open(eng->impl, &next[i], 1, (uint32_t)len, ENGINE_SHARE_PRIVATE, &seq[i], &cached,
					   err);
	}
	model_q4_observe(m, q4_observe, s);
	/* A step adds its n sequences' tokens, a batch of n: the sums of several steps wait
	 * together and are added on every thread (gptq_cov_add_part reads the doubles once for
	 * all of them: a flush a step read them once a step), the same batches, the same bytes. */
	size_t steps = IMATRIX_SELF_DEFER / n ? IMATRIX_SELF_DEFER / n : 1;
	imatrix_stats_defer(s, steps * n, n);
	/* Each step feeds every sequence its last token; the observer sees all of them. */
	for (size_t pos = 0; rc == 0 && pos + 1 < len; pos++) {
		for (size_t i = 0; i < n; i++)
			sp[i] = (struct engine_span){ .seq = seq[i], .tokens = &next[i], .n = 1,
						      .logits = logits + i * (size_t)eng->n_vocab };
		if ((rc = eng->forward(eng->impl, sp, n, err)) < 0)
			break;
		if ((pos + 1) % steps == 0 || pos + 2 == len)
			imatrix_stats_flush(s, m->pool);
		struct sample_job job = { smp, logits, next, n, eng->n_vocab };
		if (m->pool)
			pool_run(m->pool, sample_part, &job);
		else
			sample_part(&job, 0, 1);
		if (pr->fn && !pr->fn(pr->arg, first * (len - 1) + (pos + 1) * n, pr->total)) {
			rc = hearth_error_set(err, HEARTH_ECANCELED, "imatrix: the sampling was stopped");
			break;
		}
	}
	model_q4_observe(m, NULL, NULL);
	imatrix_stats_defer(s, 0, 0);
	if (rc == 0 && !imatrix_stats_ok(s, err))
		rc = s->code;
out:
	for (size_t i = 0; seq && i < n; i++)
		if (seq[i])
			eng->seq_close(eng->impl, seq[i]);
	for (size_t i = 0; smp && i < n; i++)
		sampler_free(smp[i]);
	free(seq);
	free(smp);
	free(sp);
	free(next);
	free(logits);
	return rc;
}

int imatrix_stats_self(struct imatrix_stats *s, struct model_q4 *m, const struct tok *t, size_t n_seqs, size_t len,
		       uint64_t seed, bool (*progress)(void *arg, size_t done, size_t total), void *progress_arg,
		       struct hearth_error *err)
{
	struct engine eng;
	model_q4_engine(m, &eng);
	int32_t bos = tok_bos(t) == TOK_NULL ? 0 : tok_bos(t);
	/* As many sequences at once as the engine holds: a row each per step, KV for len. */
	size_t at_once = m->max_seqs < m->step_tokens ? m->max_seqs : m->step_tokens;
	if (len >= 2 && len <= m->max_context && eng.kv_tokens / len < at_once)
		at_once = (size_t)(eng.kv_tokens / len);
	if (n_seqs == 0 || len < 2 || len > m->max_context || at_once == 0)
		return hearth_error_set(err, HEARTH_EINVAL,
					"imatrix: %zu sampled sequences of %zu tokens do not fit the engine (%u positions a "
					"sequence, KV for %llu tokens)", n_seqs, len, m->max_context,
					(unsigned long long)eng.kv_tokens);
	int rc = 0;
	struct self_progress pr = { progress, progress_arg, n_seqs * (len - 1) };
	for (size_t first = 0; first < n_seqs && rc == 0; first += at_once) {
		size_t n = n_seqs - first < at_once ? n_seqs - first : at_once;
		rc = self_round(s, m, &eng, bos, first, n, len, seed, &pr, err);
	}
	return rc;
}

const double *imatrix_stats_sums(const struct imatrix_stats *s, const char *name, size_t len, uint64_t *count)
{
	const struct imatrix_entry *e = stats_find(s, name, len);
	*count = e ? e->count : 0;
	return e ? e->sum : NULL;
}

size_t imatrix_stats_entries(const struct imatrix_stats *s)
{
	return s->n;
}

/* ---- the GGUF llama-imatrix writes (version 3, little-endian, alignment 32) ---- */

#define IMATRIX_ALIGN 32

struct gguf_out {
	FILE *fp;
	uint64_t at;                   /* bytes written: where the next padding counts from */
	bool bad;
};

static void out_bytes(struct gguf_out *o, const void *p, size_t n)
{
	if (!o->bad && n && fwrite(p, 1, n, o->fp) != n)
		o->bad = true;
	o->at += n;
}

static void out_u32(struct gguf_out *o, uint32_t v)
{
	uint8_t b[4] = { (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24) };
	out_bytes(o, b, 4);
}

static void out_u64(struct gguf_out *o, uint64_t v)
{
	out_u32(o, (uint32_t)v);
	out_u32(o, (uint32_t)(v >> 32));
}

static void out_str(struct gguf_out *o, const char *p, size_t n)
{
	out_u64(o, n);
	out_bytes(o, p, n);
}

static void out_key(struct gguf_out *o, const char *key, enum gguf_vtype type)
{
	out_str(o, key, strlen(key));
	out_u32(o, (uint32_t)type);
}

static void out_f32(struct gguf_out *o, float f)
{
	uint32_t v;
	memcpy(&v, &f, sizeof v);
	out_u32(o, v);
}

static void out_pad(struct gguf_out *o)
{
	static const uint8_t zero[IMATRIX_ALIGN];
	out_bytes(o, zero, (size_t)((IMATRIX_ALIGN - o->at % IMATRIX_ALIGN) % IMATRIX_ALIGN));
}

/* Bytes of a tensor's data with its padding: in_sum2 (cols floats) or counts (one). */
static uint64_t padded(uint64_t bytes)
{
	return (bytes + IMATRIX_ALIGN - 1) / IMATRIX_ALIGN * IMATRIX_ALIGN;
}

int imatrix_stats_write(const struct imatrix_stats *s, const char *path, const char *dataset, uint32_t chunk_size,
			uint32_t n_chunks, struct hearth_error *err)
{
	if (s->n == 0)
		return hearth_error_set(err, HEARTH_EINVAL, "imatrix: no statistics to write (no layer matrix ran)");
	for (size_t k = 0; k < s->n; k++)
		hearth_assert(s->e[k].n_pending == 0); /* imatrix_stats_defer(s, 0) first */
	FILE *fp = fopen(path, "wb");
	if (!fp)
		return hearth_error_errno(err, HEARTH_EIO, errno, "cannot write %s", path);
	struct gguf_out o = { .fp = fp };
	uint64_t n_cov = 0;
	for (size_t i = 0; i < s->n; i++)
		n_cov += s->e[i].cov != NULL;
	out_u32(&o, 0x46554747u); /* "GGUF" */
	out_u32(&o, 3);
	out_u64(&o, 2 * (uint64_t)s->n + n_cov);
	out_u64(&o, 4);
	out_key(&o, "general.type", GGUF_VT_STRING);
	out_str(&o, "imatrix", 7);
	out_key(&o, "imatrix.datasets", GGUF_VT_ARRAY);
	out_u32(&o, GGUF_VT_STRING);
	out_u64(&o, 1);
	out_str(&o, dataset, strlen(dataset));
	out_key(&o, "imatrix.chunk_count", GGUF_VT_UINT32);
	out_u32(&o, n_chunks);
	out_key(&o, "imatrix.chunk_size", GGUF_VT_UINT32);
	out_u32(&o, chunk_size);
	uint64_t off = 0;
	for (size_t i = 0; i < s->n; i++) {
		const struct imatrix_entry *e = &s->e[i];
		char name[288];
		for (int k = 0; k < 2; k++) {
			int len = snprintf(name, sizeof name, "%s.%s", e->name, k ? "counts" : "in_sum2");
			out_str(&o, name, (size_t)len);
			/* One dimension: ggml drops the trailing 1 of cols x 1 and 1 x 1. */
			out_u32(&o, 1);
			out_u64(&o, k ? 1 : e->cols);
			out_u32(&o, QTYPE_F32);
			out_u64(&o, off);
			off += padded(k ? 4 : 4 * e->cols);
		}
		if (e->cov) { /* hearth's own: blocked (kernels/gptq.h), both halves of each block */
			int len = snprintf(name, sizeof name, "%s%s", e->name, IMATRIX_COV);
			out_str(&o, name, (size_t)len);
			out_u32(&o, 2);
			out_u64(&o, e->cov_block);
			out_u64(&o, e->cols);
			out_u32(&o, QTYPE_F32);
			out_u64(&o, off);
			off += padded(4 * (uint64_t)e->cols * e->cov_block);
		}
	}
	/* The data section starts aligned, and so does every tensor in it. */
	out_pad(&o);
	for (size_t i = 0; i < s->n; i++) {
		const struct imatrix_entry *e = &s->e[i];
		for (size_t k = 0; k < e->cols; k++)
			out_f32(&o, (float)e->sum[k]);
		out_pad(&o);
		out_f32(&o, (float)e->count);
		out_pad(&o);
		for (size_t r = 0, nb = e->cov_block; e->cov && r < e->cols; r++)
			for (size_t c = r / nb * nb; c < r / nb * nb + nb; c++) {
				size_t bs = r / nb * nb;
				out_f32(&o, (float)(c >= e->cols ? 0.0
						    : c >= r ? e->cov[r * nb + (c - bs)] : e->cov[c * nb + (r - bs)]));
			}
		out_pad(&o);
	}
	if (fclose(fp) != 0)
		o.bad = true;
	if (o.bad) {
		remove(path);
		return hearth_error_set(err, HEARTH_EIO, "cannot write %s (disk full?)", path);
	}
	return 0;
}
