/* Importance statistics for the int4 packer, read from llama.cpp's imatrix files (the GGUF
 * llama-imatrix writes: for each weight matrix NAME, NAME.in_sum2 holds the sum of each
 * input column's squares over calibration text and NAME.counts the tokens behind it). */
#ifndef HEARTH_ENGINE_IMATRIX_H
#define HEARTH_ENGINE_IMATRIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/engine/ref/forward.h"
#include "protocol/error.h"

struct imatrix;

/* Maps and validates path: a GGUF whose general.type (when present) is "imatrix", with at
 * least one NAME.in_sum2 / NAME.counts pair, each F32, of matching expert counts, every
 * value finite and >= 0. Anything else fails naming the file and what is wrong (a legacy
 * .dat imatrix gets the command that converts it). */
int imatrix_open(struct imatrix **out, const char *path, struct hearth_error *err);
/* imatrix_open's checks of the file's structure alone (names, types, shapes, pairs), no
 * value read: for a load that may not need the values (its packed weights kept from an
 * earlier start), which calls imatrix_check before it uses one. */
int imatrix_open_shapes(struct imatrix **out, const char *path, struct hearth_error *err);
/* The values imatrix_open_shapes left unread: every statistic finite and >= 0, every
 * covariance finite, symmetric and on its in_sum2's diagonal; an error names the first that
 * is not. */
int imatrix_check(struct imatrix *im, struct hearth_error *err);
void imatrix_close(struct imatrix *im);

/* The column weights of matrix `name` (name_len bytes) with cols columns: *w points at cols
 * floats inside the file (valid until imatrix_close), or is NULL when the file has no
 * statistics for it (the packer then weighs every column alike, as llama-quantize does).
 * A row length that disagrees with the model's, or statistics of several experts for a
 * dense matrix, is HEARTH_EINVAL naming the matrix. */
int imatrix_weights(const struct imatrix *im, const char *name, size_t name_len, size_t cols,
		    const float **w, struct hearth_error *err);

/* How many matrices the file has statistics for. */
size_t imatrix_entries(const struct imatrix *im);

/* ---- input covariances (hearth's own addition to the format) ----
 * A file hearthd-tool imatrix --cov wrote also holds, for each distinct matrix input,
 * NAME.in_cov: the sum of x x^T over the calibration tokens, F32, block-diagonal in
 * kernels/gptq.h's layout (ne = { B, cols }: blocks of B columns; B = cols: all of it),
 * each block symmetric, finite, its diagonal NAME.in_sum2. The int4 packer rounds by GPTQ
 * against it. llama.cpp's tools do not know the tensor. */
#define IMATRIX_COV ".in_cov"
/* Whether matrix `name`'s input is another's (attn_k and attn_v read attn_q's, ffn_up reads
 * ffn_gate's, in the same layer): true, with that matrix's name in owner when owner_cap is
 * not 0. */
bool imatrix_cov_shared(const char *name, char *owner, size_t owner_cap);
/* The covariance of matrix `name`'s input (its own or its owner's): h points at cols x
 * block floats inside the file (valid until imatrix_close), tokens is how many tokens it
 * was summed over (its NAME.counts); h is NULL (and block 0) when the file has none. A
 * width that disagrees with the model's is HEARTH_EINVAL naming the matrix. */
struct imatrix_cov {
	const float *h;
	size_t block;
	double tokens;
};
int imatrix_cov(const struct imatrix *im, const char *name, size_t name_len, size_t cols, struct imatrix_cov *out,
		struct hearth_error *err);
/* Gives back the pages of cov (cols columns) once its user is done with it (GPTQ needs a
 * covariance only while it factors it): a covariance file is most of a model's size. */
void imatrix_release(const struct imatrix *im, const struct imatrix_cov *cov, size_t cols);
/* How many covariances the file holds. */
size_t imatrix_covs(const struct imatrix *im);

/* ---- making one (imatrix_stats.c) ----
 * Statistics collected as llama-imatrix collects them: every layer matrix ("blk.*"), for
 * every token of every calibration chunk, adds each input column's square to its sums (in
 * double) and one to its count, keyed by the matrix's tensor name, whichever engine ran
 * the chunk. Matrices appear in the order the forward pass first multiplies by them. */
struct imatrix_stats;

int imatrix_stats_new(struct imatrix_stats **out, struct hearth_error *err);
void imatrix_stats_free(struct imatrix_stats *s);
/* From now on each new matrix whose input is its own (not imatrix_cov_shared) also sums
 * x x^T over its tokens in blocks of `block` columns (narrower inputs: one block), written
 * as NAME.in_cov: cols x block doubles each while collecting, at most max_bytes of them
 * in all (past that the add fails naming the matrix). */
void imatrix_stats_keep_cov(struct imatrix_stats *s, size_t block, uint64_t max_bytes);
/* One chunk: ctx is reset, ids[0..n) run from position 0 (logits: n_vocab floats of
 * scratch), and their matrix inputs are added. */
int imatrix_stats_run(struct imatrix_stats *s, const struct model *m, struct model_ctx *ctx, const int32_t *ids,
		      size_t n, float *logits, struct hearth_error *err);
/* Calibration text run as llama-imatrix -f runs it: tokenized whole with the model's BOS
 * (special tokens not parsed), cut into chunks of `chunk` tokens (the tail short of one is
 * left out; at most max_chunks of them, 0: all), each handed to run as a sequence of its
 * own with BOS in its first token's place; progress (may be NULL) is called after each
 * chunk. *n_chunks is how many ran. Fewer tokens than one chunk is HEARTH_EINVAL. */
struct tok;
typedef int (*imatrix_run_fn)(void *arg, const int32_t *ids, size_t n, struct hearth_error *err);
int imatrix_stats_text(const struct tok *t, const char *text, size_t len, size_t chunk, size_t max_chunks,
		       imatrix_run_fn run, void *run_arg, void (*progress)(void *arg, size_t done, size_t total),
		       void *progress_arg, size_t *n_chunks, struct hearth_error *err);
/* The two engines a chunk runs on: the f32 reference (exact, slow: ctx holds a chunk,
 * logits n_vocab floats of scratch) and the resident int4 engine (its float activations,
 * at its prefill speed; a model of one sequence of at least a chunk). */
struct imatrix_ref_run {
	struct imatrix_stats *s;
	const struct model *m;
	struct model_ctx *ctx;
	float *logits;
};
int imatrix_run_ref(void *arg, const int32_t *ids, size_t n, struct hearth_error *err);
struct model_q4;
struct imatrix_q4_run {
	struct imatrix_stats *s;
	struct model_q4 *m;
	/* Also the head's input at every token (the final norm's output, which the engine
	 * hands back as the span's embeddings) under the matrix the head reads, as --self
	 * collects it: for GPTQ on the head (hearthd-tool imatrix -f --cov). */
	bool head;
};
int imatrix_run_q4(void *arg, const int32_t *ids, size_t n, struct hearth_error *err);
/* Calibration without text: n_seqs sequences of len tokens sampled from the int4 model
 * itself (BOS, then temperature 1 without truncation, sequence i seeded seed + i), every
 * step's matrix inputs added: (len - 1) x n_seqs tokens. As many run at once as the
 * model's sequences, step rows and KV allow; progress (may be NULL) after each step with
 * the tokens sampled so far and in all, and false from it stops with HEARTH_ECANCELED. */
int imatrix_stats_self(struct imatrix_stats *s, struct model_q4 *m, const struct tok *t, size_t n_seqs, size_t len,
		       uint64_t seed, bool (*progress)(void *arg, size_t done, size_t total), void *progress_arg,
		       struct hearth_error *err);
/* ---- self-calibration (imatrix_self.c) ---- */
/* Covariance blocks: on the larger trained model (before the loader's guards) 512 keeps nine
 * tenths of the whole covariance's gain (KL 0.00043 against 0.00038; 256: 0.00056, the
 * plain imatrix 0.00111), at 512 floats a column: a Qwen3-1.7B shape's in 0.7 GB. */
#define IMATRIX_COV_BLOCK_DEFAULT 512
struct load_opts;
/* lo, whatever else it says, set to run calibration chunks of `chunk` tokens (W4A16, no
 * imatrix, no draft, KV for a chunk, n_seqs of them side by side up to 32; 0 reads as 1). */
void imatrix_load_opts(struct load_opts *lo, size_t chunk, size_t n_seqs);
/* The covariances' memory cap: 2 GiB, or half the machine's memory if that is less. */
uint64_t imatrix_cov_max(void);
struct imatrix_self_opts {
	size_t n_seqs, len;            /* sequences sampled, tokens each (BOS included) */
	uint64_t seed;                 /* sequence i's sampler seed is seed + i */
	size_t cov_block;              /* covariances in blocks of it (GPTQ); 0: none */
	/* tokens sampled so far and in all, after every step; false stops the sampling
	 * (HEARTH_ECANCELED). May be NULL. */
	bool (*progress)(void *arg, size_t done, size_t total);
	void *progress_arg;
};
/* Loads `model` as base says (made a calibration load by imatrix_load_opts, W4A8, with KV for
 * all the sequences it samples side by side, up to 32, whatever base's kv_budget), samples from
 * it as imatrix_stats_self does, frees it and writes the statistics to `out` (dataset
 * "self: N sequences, seed S"); *n_entries (may be NULL): the matrices in it. The calling
 * thread steps the engine and gets its CPU affinity back. */
int imatrix_self_make(const char *model, const struct load_opts *base, const struct imatrix_self_opts *so,
		      const char *out, size_t *n_entries, struct hearth_error *err);
/* What imatrix_self_make will hold at its peak, in *bytes: the calibration load's arena as
 * load_plan_size plans it plus the covariance sums (cols x block doubles for each distinct
 * input, up to imatrix_cov_max), from the files' headers alone. The file is written after
 * the model is freed, so it is not on top. For a model swap's room check. */
int imatrix_self_plan(const char *model, const struct load_opts *base, const struct imatrix_self_opts *so,
		      uint64_t *bytes, struct hearth_error *err);

/* The name the head's input is kept under: the matrix the head reads, the embedding's when
 * tied (the loader rounds that one for the head), else output.weight. */
const char *imatrix_head_name(bool tied);

/* The model_observe_fn behind imatrix_stats_run (arg: the stats): a "blk.*" matrix's input
 * added under its tensor name. */
void imatrix_stats_observe(void *arg, const struct gguf_tensor *w, const float *x, size_t n_tok);
/* n_tok rows of cols floats added to matrix `name` (len bytes), for callers that run
 * another engine (the int4 engine's model_q4_observe). A name seen before with another
 * width, a name over 255 bytes or memory that runs out marks the stats failed, and later
 * adds do nothing: imatrix_stats_ok says which matrix and why. */
void imatrix_stats_add(struct imatrix_stats *s, const char *name, size_t len, const float *x, size_t n_tok,
		       size_t cols);
/* tokens > 0: the covariance sums of adds of at most that many tokens wait in the stats
 * (tokens x cols floats for each distinct input) until imatrix_stats_flush, which spreads
 * them over a pool's threads (the int4 engine's observer runs on thread 0 inside a step
 * while the others wait: flushed between steps, the sums take every thread) and reads the
 * doubles once for all that waits. batch (1 to GPTQ_COV_TOKENS; 0 reads as that) is the
 * batch of tokens whose float sums go into the doubles (kernels/gptq.h): several adds of
 * `batch` tokens each wait together, each its own batch; an add that waiting would batch
 * otherwise than adding it at once (longer than a batch shorter than GPTQ_COV_TOKENS), or
 * that does not fit, is not made to: the statistics are always the bytes of adding each
 * add at once. 0 tokens: off. Whatever waits is added on the calling thread first. Off
 * before imatrix_stats_write. */
void imatrix_stats_defer(struct imatrix_stats *s, size_t tokens, size_t batch);
/* Tokens whose covariance sums the self-sampling lets wait between flushes: a few steps of
 * its sequences (on the Qwen3-1.7B shape 1.4 MB of inputs a token, 177 MB in all). */
#define IMATRIX_SELF_DEFER 128
struct pool;
/* Adds what waits on every thread of pool (NULL: the calling thread alone); the caller
 * runs the pool (kernels/pool.h: not inside one of its steps). */
void imatrix_stats_flush(struct imatrix_stats *s, struct pool *pool);
/* False, with the error set, when an add failed. */
bool imatrix_stats_ok(const struct imatrix_stats *s, struct hearth_error *err);
/* Matrix name's column sums and *count, or NULL (count 0) when it never ran. */
const double *imatrix_stats_sums(const struct imatrix_stats *s, const char *name, size_t len, uint64_t *count);
size_t imatrix_stats_entries(const struct imatrix_stats *s);
/* Writes llama-imatrix's GGUF: general.type "imatrix", imatrix.datasets [dataset],
 * imatrix.chunk_count, imatrix.chunk_size, then per matrix NAME.in_sum2 (F32, cols)
 * and NAME.counts (F32, 1), data aligned to 32. A failed write removes the file. */
int imatrix_stats_write(const struct imatrix_stats *s, const char *path, const char *dataset, uint32_t chunk_size,
			uint32_t n_chunks, struct hearth_error *err);

#endif
