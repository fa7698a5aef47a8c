/* The imatrix reader against files llama.cpp's llama-imatrix wrote (tests/fixtures/imatrix:
 * its GGUF output and its legacy .dat on the fx-llama fixture) and against hostile files
 * built here: every defect is refused with a message that names the file and what is
 * wrong, and the weights handed out are the file's own values. And the statistics hearth
 * collects itself (imatrix_stats, hearthd-tool imatrix) against llama-imatrix's on the same
 * model and text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/engine/gguf.h"
#include "daemon/engine/imatrix.h"
#include "daemon/engine/load.h"
#include "daemon/engine/model.h"
#include "daemon/engine/model_q4.h"
#include "daemon/engine/ref/forward.h"
#include "daemon/engine/tokenizer.h"
#include "kernels/gptq.h"
#include "kernels/pool.h"
#include "tests/support/gguf_build.h"

static void fixture(const char *name, char *buf, size_t cap)
{
	const char *src = getenv("HEARTH_SRCDIR");
	if (!src)
		fail_msg("HEARTH_SRCDIR is not set: run through make check");
	snprintf(buf, cap, "%s/tests/fixtures/imatrix/%s", src, name);
}

/* A model in the shared fixtures folder (HEARTH_SHARED/fixtures). */
static void shared_model(const char *name, char *buf, size_t cap)
{
	const char *sh = getenv("HEARTH_SHARED");
	if (!sh)
		fail_msg("HEARTH_SHARED is not set: run through make check");
	snprintf(buf, cap, "%s/fixtures/%s", sh, name);
}

static void open_ok(const char *name, struct imatrix **im)
{
	char path[4096];
	struct hearth_error e = { 0 };
	fixture(name, path, sizeof path);
	if (imatrix_open(im, path, &e) < 0)
		fail_msg("imatrix_open %s: %s", name, e.msg);
}

/* llama-imatrix's statistics of fx-llama (2 layers): one entry per layer matrix, each as
 * wide as the matrix's rows; q, k and v read the same normed input, so their sums of
 * squares are the same numbers. */
static void test_imatrix_reads_llama_imatrix_output(void **state)
{
	(void)state;
	struct imatrix *im;
	struct hearth_error e = { 0 };
	open_ok("fx-llama.imatrix.gguf", &im);
	assert_int_equal(imatrix_entries(im), 2 * 7);
	const float *q, *k, *v, *down, *none;
	const char *nq = "blk.1.attn_q.weight", *nk = "blk.1.attn_k.weight", *nv = "blk.1.attn_v.weight";
	assert_int_equal(imatrix_weights(im, nq, strlen(nq), 64, &q, &e), 0);
	assert_int_equal(imatrix_weights(im, nk, strlen(nk), 64, &k, &e), 0);
	assert_int_equal(imatrix_weights(im, nv, strlen(nv), 64, &v, &e), 0);
	assert_non_null(q);
	assert_memory_equal(q, k, 64 * sizeof(float));
	assert_memory_equal(q, v, 64 * sizeof(float));
	double sum = 0;
	for (int i = 0; i < 64; i++) {
		assert_true(q[i] >= 0.0f && isfinite(q[i]));
		sum += q[i];
	}
	assert_true(sum > 0.0);
	/* ffn_down reads the 160-wide gated product: statistics of that width */
	const char *nd = "blk.0.ffn_down.weight";
	assert_int_equal(imatrix_weights(im, nd, strlen(nd), 160, &down, &e), 0);
	assert_non_null(down);
	/* a matrix it has nothing for: no weights, no error (the name is a prefix of one it has) */
	assert_int_equal(imatrix_weights(im, "blk.0.attn_q", 12, 64, &none, &e), 0);
	assert_null(none);
	assert_int_equal(imatrix_weights(im, "token_embd.weight", 17, 64, &none, &e), 0);
	assert_null(none);
	/* another model's row length */
	assert_int_equal(imatrix_weights(im, nd, strlen(nd), 256, &none, &e), HEARTH_EINVAL);
	assert_null(none);
	assert_non_null(strstr(e.msg, "blk.0.ffn_down.weight"));
	assert_non_null(strstr(e.msg, "160 columns"));
	assert_non_null(strstr(e.msg, "256"));
	imatrix_close(im);
}

/* hearth's own statistics (the reference engine's) of fx-llama over bench/spec_passage.txt
 * in chunks of 64, against
 * what `llama-imatrix -m fx-llama.gguf -f bench/spec_passage.txt -c 64` wrote
 * (fx-llama.passage.imatrix.gguf): the same matrices, shapes and token counts, every sum
 * within 0.5 % of its matrix's largest (llama.cpp runs the f16 KV cache and its own kernels;
 * the difference measured is below 0.1 %), the same keys, and a file imatrix_open reads. */
static void test_imatrix_stats_equal_llama_imatrix_on_the_same_text(void **state)
{
	(void)state;
	char path[4096], text_path[4096], out[4096];
	struct hearth_error e = { 0 };
	const char *sh = getenv("HEARTH_SHARED"), *src = getenv("HEARTH_SRCDIR");
	if (!sh || !src)
		fail_msg("HEARTH_SHARED and HEARTH_SRCDIR must be set: run through make check");
	snprintf(path, sizeof path, "%s/fixtures/fx-llama.gguf", sh);
	snprintf(text_path, sizeof text_path, "%s/bench/spec_passage.txt", src);
	snprintf(out, sizeof out, "%s/hearth-test-imatrix-stats-%d.gguf", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
		 (int)getpid());

	struct gguf_file *f;
	struct model *m;
	struct tok *t;
	struct model_ctx *ctx;
	struct imatrix_stats *s;
	struct model_opts mo = { .max_ctx = 64, .kv_type = MODEL_KV_F16 };
	if (gguf_open(&f, path, &e) < 0 || model_load(&m, f, &mo, &e) < 0 || tok_load(&t, f, &e) < 0 ||
	    model_ctx_new(&ctx, m, 64, &e) < 0 || imatrix_stats_new(&s, &e) < 0)
		fail_msg("%s", e.msg);
	FILE *fp = fopen(text_path, "rb");
	assert_non_null(fp);
	static char text[1 << 16];
	size_t len = fread(text, 1, sizeof text, fp);
	fclose(fp);
	float *logits = malloc(m->hp.n_vocab * sizeof *logits);
	size_t n_chunks = 0;
	assert_non_null(logits);
	struct imatrix_ref_run run = { .s = s, .m = m, .ctx = ctx, .logits = logits };
	if (imatrix_stats_text(t, text, len, 64, 0, imatrix_run_ref, &run, NULL, NULL, &n_chunks, &e) < 0)
		fail_msg("%s", e.msg);
	assert_int_equal(n_chunks, 5);
	assert_int_equal(imatrix_stats_entries(s), 2 * 7);
	if (imatrix_stats_write(s, out, "bench/spec_passage.txt", 64, (uint32_t)n_chunks, &e) < 0)
		fail_msg("%s", e.msg);

	struct gguf_file *ours, *theirs;
	char ref[4096];
	fixture("fx-llama.passage.imatrix.gguf", ref, sizeof ref);
	if (gguf_open(&ours, out, &e) < 0 || gguf_open(&theirs, ref, &e) < 0)
		fail_msg("%s", e.msg);
	assert_int_equal(ours->n_tensors, theirs->n_tensors);
	for (uint64_t i = 0; i < theirs->n_tensors; i++) {
		const struct gguf_tensor *b = &theirs->tensors[i];
		char name[128];
		snprintf(name, sizeof name, "%.*s", (int)b->name.len, b->name.ptr);
		const struct gguf_tensor *a = gguf_tensor_find(ours, name);
		if (!a)
			fail_msg("%s: llama-imatrix has it, hearth does not", name);
		assert_int_equal(a->type, QTYPE_F32);
		assert_int_equal(a->n_dims, b->n_dims);
		assert_int_equal(a->n_elems, b->n_elems);
		const float *x = a->data, *y = b->data;
		float top = 0.0f;
		for (uint64_t k = 0; k < b->n_elems; k++)
			top = fabsf(y[k]) > top ? fabsf(y[k]) : top;
		assert_true(top > 0.0f);
		for (uint64_t k = 0; k < b->n_elems; k++)
			if (!(fabsf(x[k] - y[k]) <= 5e-3f * top))
				fail_msg("%s[%llu]: hearth %g, llama-imatrix %g", name, (unsigned long long)k, x[k], y[k]);
	}
	const char *keys[] = { "imatrix.chunk_count", "imatrix.chunk_size" };
	for (int k = 0; k < 2; k++) {
		uint32_t va, vb;
		assert_int_equal(gguf_get_u32(ours, keys[k], &va, &e), 0);
		assert_int_equal(gguf_get_u32(theirs, keys[k], &vb, &e), 0);
		assert_int_equal(va, vb);
	}
	struct gguf_str ta, tb;
	assert_int_equal(gguf_get_str(ours, "general.type", &ta, &e), 0);
	assert_int_equal(gguf_get_str(theirs, "general.type", &tb, &e), 0);
	assert_true(ta.len == tb.len && !memcmp(ta.ptr, tb.ptr, ta.len));
	gguf_close(ours);
	gguf_close(theirs);

	struct imatrix *im;
	if (imatrix_open(&im, out, &e) < 0)
		fail_msg("hearth's own imatrix refused: %s", e.msg);
	assert_int_equal(imatrix_entries(im), 2 * 7);
	imatrix_close(im);

	/* Too little text for a chunk: refused with the counts, nothing collected. */
	struct imatrix_stats *s2;
	assert_int_equal(imatrix_stats_new(&s2, &e), 0);
	struct imatrix_ref_run run2 = { .s = s2, .m = m, .ctx = ctx, .logits = logits };
	assert_int_equal(imatrix_stats_text(t, "In the beginning", 16, 64, 0, imatrix_run_ref, &run2, NULL, NULL,
					    &n_chunks, &e),
			 HEARTH_EINVAL);
	assert_non_null(strstr(e.msg, "fewer than one chunk of 64"));
	assert_int_equal(imatrix_stats_entries(s2), 0);
	assert_int_equal(imatrix_stats_write(s2, out, "x", 64, 0, &e), HEARTH_EINVAL);
	/* A matrix whose input changes width: the stats fail naming it, and stay failed. */
	const float x[4] = { 1, 2, 3, 4 };
	imatrix_stats_add(s2, "blk.0.attn_q.weight", 19, x, 1, 4);
	assert_true(imatrix_stats_ok(s2, &e));
	imatrix_stats_add(s2, "blk.0.attn_q.weight", 19, x, 2, 2);
	imatrix_stats_add(s2, "blk.0.attn_k.weight", 19, x, 1, 4);
	assert_false(imatrix_stats_ok(s2, &e));
	assert_int_equal(e.code, HEARTH_EINVAL);
	assert_non_null(strstr(e.msg, "blk.0.attn_q.weight: its input changed width"));
	uint64_t cnt;
	const double *sums = imatrix_stats_sums(s2, "blk.0.attn_q.weight", 19, &cnt);
	assert_non_null(sums);
	assert_int_equal(cnt, 1);
	assert_true(sums[3] == 16.0);
	assert_null(imatrix_stats_sums(s2, "blk.0.attn_k.weight", 19, &cnt));
	imatrix_stats_free(s2);

	remove(out);
	free(logits);
	imatrix_stats_free(s);
	model_ctx_free(ctx);
	tok_free(t);
	model_free(m);
	gguf_close(f);
}

static void expect_refused(const char *path, int code, const char *words)
{
	struct imatrix *im = (struct imatrix *)1;
	struct hearth_error e = { 0 };
	int rc = imatrix_open(&im, path, &e);
	if (rc != code || !strstr(e.msg, words) || !strstr(e.msg, path))
		fail_msg("%s: rc %d (want %d), message '%s' (want '%s' and the path)", path, rc, code, e.msg, words);
	assert_null(im);
}

static void test_imatrix_refuses_legacy_model_and_missing_files(void **state)
{
	(void)state;
	char path[4096];
	fixture("fx-llama.imatrix.dat", path, sizeof path);
	expect_refused(path, HEARTH_EFORMAT, "--in-file");
	shared_model("fx-llama.gguf", path, sizeof path);
	expect_refused(path, HEARTH_EFORMAT, "a model file, not an imatrix");
	expect_refused("/nonexistent/hearth.imatrix.gguf", HEARTH_ENOTFOUND, "/nonexistent/hearth.imatrix.gguf");
}

/* One hostile imatrix: a base entry (blk.0.attn_q.weight, 64 columns) changed by `kind`. */
enum bad { BAD_NAN, BAD_NEGATIVE, BAD_NO_COUNTS, BAD_COUNTS_SHAPE, BAD_F16, BAD_STRAY, BAD_EMPTY,
	   BAD_TYPE, BAD_TRUNCATED, GOOD_EXPERTS, BAD_COV_ASYM, BAD_COV_DIAG, BAD_COV_SHAPE, BAD_COV_INF,
	   BAD_COV_ALONE, BAD_COV_PAD, BAD_COV_WIDE, GOOD_COV, GOOD_COV_BLOCKS };

static void write_imatrix(const char *path, enum bad kind)
{
	struct gguf_build *b;
	struct hearth_error e = { 0 };
	assert_int_equal(gguf_build_new(&b, 3, &e), 0);
	assert_int_equal(gguf_build_kv_str(b, "general.type", kind == BAD_TYPE ? "model" : "imatrix"), 0);
	uint64_t experts = kind == GOOD_EXPERTS ? 2 : 1;
	uint64_t ne_sum[2] = { 64, experts }, ne_cnt[2] = { 1, experts }, ne_bad[2] = { 2, experts };
	int s = -1, c = -1, x = -1;
	if (kind != BAD_EMPTY)
		s = gguf_build_tensor(b, "blk.0.attn_q.weight.in_sum2", kind == BAD_F16 ? QTYPE_F16 : QTYPE_F32, 2,
				      ne_sum);
	if (kind != BAD_EMPTY && kind != BAD_NO_COUNTS)
		c = gguf_build_tensor(b, "blk.0.attn_q.weight.counts", QTYPE_F32, 2,
				      kind == BAD_COUNTS_SHAPE ? ne_bad : ne_cnt);
	if (kind == BAD_STRAY)
		x = gguf_build_tensor(b, "blk.0.attn_q.weight", QTYPE_F32, 2, ne_sum);
	/* the covariance of its input (hearth's NAME.in_cov): 64 x 64 (blocks of 24: 24 x 64),
	 * its diagonal in_sum2's */
	int v = -1;
	size_t nb = kind == GOOD_COV_BLOCKS || kind == BAD_COV_PAD ? 24 : kind == BAD_COV_WIDE ? 65 : 64;
	uint64_t ne_cov[2] = { nb, kind == BAD_COV_SHAPE ? 32 : 64 };
	if (kind >= BAD_COV_ASYM)
		v = gguf_build_tensor(b, kind == BAD_COV_ALONE ? "blk.0.attn_output.weight.in_cov"
							      : "blk.0.attn_q.weight.in_cov",
				      QTYPE_F32, 2, ne_cov);
	FILE *fp = fopen(path, "wb");
	assert_non_null(fp);
	assert_int_equal(gguf_build_write_header(b, fp, &e), 0);
	float vals[128], cnt[4] = { 100, 100, 100, 100 };
	for (int i = 0; i < 128; i++)
		vals[i] = (float)(i % 64) + 1.0f;
	if (kind == BAD_NAN)
		vals[37] = NAN;
	if (kind == BAD_NEGATIVE)
		vals[5] = -2.0f;
	if (s >= 0)
		assert_int_equal(gguf_build_write_tensor(b, fp, s, vals, gguf_build_tensor_size(b, s), &e), 0);
	if (c >= 0)
		assert_int_equal(gguf_build_write_tensor(b, fp, c, cnt, gguf_build_tensor_size(b, c), &e), 0);
	if (x >= 0)
		assert_int_equal(gguf_build_write_tensor(b, fp, x, vals, gguf_build_tensor_size(b, x), &e), 0);
	if (v >= 0) {
		static float h[65 * 64];
		for (size_t i = 0; i < 64; i++)
			for (size_t k = 0; k < nb; k++) {
				size_t j = i / nb * nb + k;
				h[i * nb + k] = j >= 64 ? 0.0f : i == j ? vals[i] : 0.01f * (float)((i + j) % 7);
			}
		if (kind == BAD_COV_ASYM)
			h[2 * 64 + 9] = 0.5f;
		if (kind == BAD_COV_DIAG)
			h[7 * 64 + 7] = 99.0f;
		if (kind == BAD_COV_INF)
			h[3 * 64 + 60] = h[60 * 64 + 3] = INFINITY;
		if (kind == BAD_COV_PAD) /* row 50 is in the last block, 48..71: column 70 is past 64 */
			h[50 * 24 + 22] = 1.0f;
		assert_int_equal(gguf_build_write_tensor(b, fp, v, h, gguf_build_tensor_size(b, v), &e), 0);
	}
	fclose(fp);
	gguf_build_free(b);
	if (kind == BAD_TRUNCATED)
		assert_int_equal(truncate(path, 200), 0);
}

static void test_imatrix_refuses_hostile_files_by_name(void **state)
{
	(void)state;
	static const struct {
		enum bad kind;
		int code;
		const char *words;
	} cases[] = {
		{ BAD_NAN, HEARTH_EFORMAT, "blk.0.attn_q.weight.in_sum2[37] is nan" },
		{ BAD_NEGATIVE, HEARTH_EFORMAT, "blk.0.attn_q.weight.in_sum2[5] is -2" },
		{ BAD_NO_COUNTS, HEARTH_EFORMAT, "has no blk.0.attn_q.weight.counts beside it" },
		{ BAD_COUNTS_SHAPE, HEARTH_EFORMAT, "blk.0.attn_q.weight.counts holds 2 values for 1 experts" },
		{ BAD_F16, HEARTH_EFORMAT, "blk.0.attn_q.weight.in_sum2 is not an F32 matrix" },
		{ BAD_STRAY, HEARTH_EFORMAT, "tensor blk.0.attn_q.weight is neither" },
		{ BAD_EMPTY, HEARTH_EFORMAT, "holds no statistics" },
		{ BAD_TYPE, HEARTH_EFORMAT, "general.type is not 'imatrix'" },
		{ BAD_TRUNCATED, HEARTH_EFORMAT, "imatrix" },
		{ BAD_COV_ASYM, HEARTH_EFORMAT, "blk.0.attn_q.weight.in_cov[2][9] is 0.5, [9][2] 0.04 (a covariance is symmetric)" },
		{ BAD_COV_DIAG, HEARTH_EFORMAT, "blk.0.attn_q.weight.in_cov[7][7] is 99, its in_sum2 says 8" },
		{ BAD_COV_SHAPE, HEARTH_EFORMAT, "blk.0.attn_q.weight.in_cov has no blk.0.attn_q.weight.in_sum2 of its width" },
		{ BAD_COV_PAD, HEARTH_EFORMAT, "blk.0.attn_q.weight.in_cov[50][70] is 1 (past the last column: 0)" },
		{ BAD_COV_WIDE, HEARTH_EFORMAT, "blk.0.attn_q.weight.in_cov has blocks of 65 columns for 64 (1 to 64)" },
		{ BAD_COV_INF, HEARTH_EFORMAT, "blk.0.attn_q.weight.in_cov[3][60] is inf" },
		{ BAD_COV_ALONE, HEARTH_EFORMAT, "blk.0.attn_output.weight.in_cov has no blk.0.attn_output.weight.in_sum2" },
	};
	char path[256];
	snprintf(path, sizeof path, "%s/hearth-test-imatrix-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	close(fd);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		write_imatrix(path, cases[i].kind);
		expect_refused(path, cases[i].code, cases[i].words);
	}
	/* Statistics per expert are a valid file, but not for a dense matrix. */
	write_imatrix(path, GOOD_EXPERTS);
	struct imatrix *im;
	struct hearth_error e = { 0 };
	assert_int_equal(imatrix_open(&im, path, &e), 0);
	const float *w = (const float *)1;
	assert_int_equal(imatrix_weights(im, "blk.0.attn_q.weight", 19, 64, &w, &e), HEARTH_EINVAL);
	assert_null(w);
	assert_non_null(strstr(e.msg, "2 experts"));
	imatrix_close(im);
	/* A covariance serves its matrix and the ones that share its input (k, v); a model
	 * whose matrix is another width is refused naming both. */
	write_imatrix(path, GOOD_COV);
	assert_int_equal(imatrix_open(&im, path, &e), 0);
	assert_int_equal(imatrix_covs(im), 1);
	struct imatrix_cov cq, ck, co;
	assert_int_equal(imatrix_cov(im, "blk.0.attn_q.weight", 19, 64, &cq, &e), 0);
	assert_int_equal(imatrix_cov(im, "blk.0.attn_k.weight", 19, 64, &ck, &e), 0);
	assert_int_equal(imatrix_cov(im, "blk.0.attn_output.weight", 24, 64, &co, &e), 0);
	assert_non_null(cq.h);
	assert_ptr_equal(cq.h, ck.h);
	assert_true(cq.block == 64 && ck.block == 64 && co.block == 0 && cq.tokens == 100.0);
	assert_null(co.h);
	assert_true(cq.h[7 * 64 + 7] == 8.0f && cq.h[1 * 64 + 2] == 0.03f);
	assert_int_equal(imatrix_cov(im, "blk.0.attn_v.weight", 19, 128, &ck, &e), HEARTH_EINVAL);
	assert_null(ck.h);
	assert_non_null(strstr(e.msg, "blk.0.attn_q.weight.in_cov covers 64 columns, the model's blk.0.attn_v.weight has 128"));
	imatrix_close(im);
	write_imatrix(path, GOOD_COV_BLOCKS); /* blocks of 24: 0..23, 24..47, 48..63 */
	assert_int_equal(imatrix_open(&im, path, &e), 0);
	assert_int_equal(imatrix_cov(im, "blk.0.attn_q.weight", 19, 64, &cq, &e), 0);
	assert_true(cq.block == 24 && cq.h[50 * 24 + 2] == 51.0f && cq.h[50 * 24 + 3] == 0.03f &&
		    cq.h[50 * 24 + 20] == 0.0f);
	imatrix_close(im);
	unlink(path);
}

/* The covariances hearth collects (--cov): one per distinct input (q/k/v and gate/up share
 * theirs), each block of 48 columns the sum of x x^T computed here independently, in
 * double, over the inputs the same forward passes show an observer, and zero past the
 * last column; their diagonals are the sums of squares held to llama-imatrix's above. A
 * cap on their memory fails the collection naming the matrix. */
struct cov_truth {
	const char *name;
	size_t cols;
	double *h;
};

static void cov_truth_observe(void *arg, const struct gguf_tensor *w, const float *x, size_t n_tok)
{
	struct cov_truth *c = arg;
	if ((size_t)w->name.len != strlen(c->name) || memcmp(w->name.ptr, c->name, w->name.len))
		return;
	for (size_t t = 0; t < n_tok; t++)
		for (size_t i = 0; i < c->cols; i++)
			for (size_t j = 0; j < c->cols; j++)
				c->h[i * c->cols + j] += (double)x[t * c->cols + i] * (double)x[t * c->cols + j];
}

static void test_imatrix_cov_is_the_inputs_covariance(void **state)
{
	(void)state;
	char path[4096], out[4096];
	struct hearth_error e = { 0 };
	shared_model("fx-llama.gguf", path, sizeof path);
	snprintf(out, sizeof out, "%s/hearth-test-imatrix-cov-%d.gguf", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
		 (int)getpid());
	struct gguf_file *f;
	struct model *m;
	struct model_ctx *ctx;
	struct imatrix_stats *s;
	struct model_opts mo = { .max_ctx = 64, .kv_type = MODEL_KV_F16 };
	if (gguf_open(&f, path, &e) < 0 || model_load(&m, f, &mo, &e) < 0 || model_ctx_new(&ctx, m, 64, &e) < 0 ||
	    imatrix_stats_new(&s, &e) < 0)
		fail_msg("%s", e.msg);
	imatrix_stats_keep_cov(s, 48, (uint64_t)1 << 30); /* blocks of 48: 64 = 48 + 16 */
	float *logits = malloc(m->hp.n_vocab * sizeof *logits);
	assert_non_null(logits);
	const char *probe[] = { "blk.1.attn_q.weight", "blk.0.ffn_down.weight" };
	struct cov_truth truth[2];
	for (int k = 0; k < 2; k++) {
		const struct gguf_tensor *w = gguf_tensor_find(f, probe[k]);
		assert_non_null(w);
		truth[k] = (struct cov_truth){ .name = probe[k], .cols = (size_t)w->ne[0] };
		truth[k].h = calloc(truth[k].cols * truth[k].cols, sizeof(double));
		assert_non_null(truth[k].h);
	}
	/* 3 chunks of 50 and 37 tokens (not multiples of the collector's block) */
	int32_t ids[64];
	for (int c = 0; c < 3; c++) {
		size_t n = c == 2 ? 37 : 50;
		for (size_t i = 0; i < n; i++)
			ids[i] = (int32_t)((i * 7 + (size_t)c * 13 + 1) % m->hp.n_vocab);
		if (imatrix_stats_run(s, m, ctx, ids, n, logits, &e) < 0)
			fail_msg("%s", e.msg);
		for (int k = 0; k < 2; k++) {
			model_ctx_reset(ctx);
			model_ctx_observe(ctx, cov_truth_observe, &truth[k]);
			assert_int_equal(model_forward(m, ctx, ids, n, MODEL_LOGITS_LAST, logits, &e), 0);
			model_ctx_observe(ctx, NULL, NULL);
		}
	}
	if (imatrix_stats_write(s, out, "test", 64, 3, &e) < 0)
		fail_msg("%s", e.msg);
	struct imatrix *im;
	if (imatrix_open(&im, out, &e) < 0)
		fail_msg("hearth's own covariances refused: %s", e.msg);
	assert_int_equal(imatrix_entries(im), 2 * 7);
	assert_int_equal(imatrix_covs(im), 2 * 4); /* attn_q, attn_output, ffn_gate, ffn_down */
	for (int k = 0; k < 2; k++) {
		const float *w = NULL;
		size_t d = truth[k].cols;
		struct imatrix_cov cv;
		assert_int_equal(imatrix_cov(im, probe[k], strlen(probe[k]), d, &cv, &e), 0);
		assert_int_equal(imatrix_weights(im, probe[k], strlen(probe[k]), d, &w, &e), 0);
		const float *h = cv.h;
		size_t nb = cv.block;
		assert_non_null(h);
		assert_int_equal(nb, 48);
		assert_true(cv.tokens == 50 + 50 + 37);
		double top = 0;
		for (size_t i = 0; i < d * d; i++)
			top = fabs(truth[k].h[i]) > top ? fabs(truth[k].h[i]) : top;
		assert_true(top > 0);
		for (size_t i = 0; i < d; i++) {
			size_t bs = i / nb * nb;
			assert_true(fabsf(h[i * nb + i - bs] - w[i]) <= 1e-5f * w[i]);
			for (size_t j = bs; j < bs + nb; j++) {
				double want = j < d ? truth[k].h[i * d + j] : 0.0;
				if (!(fabs(h[i * nb + j - bs] - want) <= 1e-5 * top))
					fail_msg("%s cov[%zu][%zu]: %g, truth %g", probe[k], i, j, (double)h[i * nb + j - bs],
						 want);
			}
		}
		free(truth[k].h);
	}
	struct imatrix_cov q, v, g, u;
	assert_int_equal(imatrix_cov(im, "blk.0.attn_q.weight", 19, (size_t)m->hp.n_embd, &q, &e), 0);
	assert_int_equal(imatrix_cov(im, "blk.0.attn_v.weight", 19, (size_t)m->hp.n_embd, &v, &e), 0);
	assert_int_equal(imatrix_cov(im, "blk.0.ffn_gate.weight", 21, (size_t)m->hp.n_embd, &g, &e), 0);
	assert_int_equal(imatrix_cov(im, "blk.0.ffn_up.weight", 19, (size_t)m->hp.n_embd, &u, &e), 0);
	assert_true(q.h && q.h == v.h && g.h && g.h == u.h && q.h != g.h);
	imatrix_close(im);

	/* capped below one input's covariance: fails naming the matrix */
	struct imatrix_stats *s2;
	assert_int_equal(imatrix_stats_new(&s2, &e), 0);
	imatrix_stats_keep_cov(s2, 48, 1000);
	assert_int_equal(imatrix_stats_run(s2, m, ctx, ids, 8, logits, &e), HEARTH_ENOMEM);
	assert_non_null(strstr(e.msg, "blk.0.attn_q.weight: the covariances would pass 0 MiB (blocks of 48 columns"));
	imatrix_stats_free(s2);

	remove(out);
	free(logits);
	imatrix_stats_free(s);
	model_ctx_free(ctx);
	model_free(m);
	gguf_close(f);
}

/* imatrix_stats_defer: the int4 engine's sampling (up to 32 tokens a step) and a text run
 * (up to 128) add each step's inputs on thread 0 and flush their covariance sums over the
 * pool's threads; written out, the statistics are the bytes of adding them at once:
 * flushed through a 2-thread pool after every add, with two adds between flushes (the
 * first then added alone), and an add too large to wait; and the sampling's several steps
 * (batches of their sequences) waiting together, each step its own batch, an add that does
 * not fit or would batch otherwise added apart. */
static void deferred_matches_direct(size_t cap, size_t batch, const size_t *adds, const bool *flush_after,
				    size_t n_adds, size_t max_add)
{
	const size_t cols = 200, block = 64; /* 64 + 64 + 64 + 8: a narrow last block */
	struct hearth_error e = { 0 };
	struct imatrix_stats *direct, *deferred;
	struct pool *pool;
	assert_int_equal(imatrix_stats_new(&direct, &e), 0);
	assert_int_equal(imatrix_stats_new(&deferred, &e), 0);
	assert_int_equal(pool_create(&pool, 2, NULL, 0, 0), 0);
	imatrix_stats_keep_cov(direct, block, (uint64_t)1 << 30);
	imatrix_stats_keep_cov(deferred, block, (uint64_t)1 << 30);
	imatrix_stats_defer(deferred, cap, batch);
	float *x = malloc(max_add * cols * sizeof *x);
	assert_non_null(x);
	uint64_t r = 12345;
	for (size_t a = 0; a < n_adds; a++) {
		for (size_t i = 0; i < adds[a] * cols; i++) {
			r = r * 6364136223846793005ull + 1442695040888963407ull;
			x[i] = (float)((int64_t)(r >> 33) - (1ll << 30)) / (float)(1 << 28) + (i % cols == 3 ? 40.0f : 0.0f);
		}
		imatrix_stats_add(direct, "blk.0.attn_q.weight", 19, x, adds[a], cols);
		imatrix_stats_add(deferred, "blk.0.attn_q.weight", 19, x, adds[a], cols);
		if (flush_after[a])
			imatrix_stats_flush(deferred, pool);
	}
	imatrix_stats_defer(deferred, 0, 0);
	assert_true(imatrix_stats_ok(direct, &e) && imatrix_stats_ok(deferred, &e));
	char a_path[4096], b_path[4096];
	const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	snprintf(a_path, sizeof a_path, "%s/hearth-test-imatrix-direct-%d.gguf", tmp, (int)getpid());
	snprintf(b_path, sizeof b_path, "%s/hearth-test-imatrix-deferred-%d.gguf", tmp, (int)getpid());
	assert_int_equal(imatrix_stats_write(direct, a_path, "x", 32, 1, &e), 0);
	assert_int_equal(imatrix_stats_write(deferred, b_path, "x", 32, 1, &e), 0);
	FILE *fa = fopen(a_path, "rb"), *fb = fopen(b_path, "rb");
	assert_true(fa && fb);
	size_t n = 0;
	int ca, cb;
	do {
		ca = fgetc(fa);
		cb = fgetc(fb);
		n++;
	} while (ca == cb && ca != EOF);
	if (ca != cb)
		fail_msg("deferred covariance file differs from the direct one at byte %zu", n);
	assert_true(n > cols * block * sizeof(float)); /* the covariance is in it */
	fclose(fa);
	fclose(fb);
	remove(a_path);
	remove(b_path);
	free(x);
	pool_destroy(pool);
	imatrix_stats_free(direct);
	imatrix_stats_free(deferred);
}

static void test_imatrix_deferred_cov_is_the_direct_one(void **state)
{
	(void)state;
	const size_t adds[] = { 7, 32, 1, 17, 20, 40, 5 };
	const bool flush_after[] = { true, true, true, false, true, true, true };
	deferred_matches_direct(GPTQ_COV_TOKENS, 0, adds, flush_after, 7, 40);
	const size_t text[] = { 128, 70, 33, 1, 40, 129, 128 };
	const bool text_flush[] = { true, true, false, true, true, true, true };
	deferred_matches_direct(128, 0, text, text_flush, 7, 129);
	/* the sampling's: steps of 8 sequences, 4 steps waiting together; a short step, a
	 * longer one (added at once) and one that does not fit between */
	const size_t steps[] = { 8, 8, 8, 8, 8, 8, 3, 8, 8, 12, 8, 8, 8, 8, 8 };
	const bool step_flush[] = { false, false, false, true, false, false, false, false, false, false, false, false,
				    true, false, true };
	deferred_matches_direct(32, 8, steps, step_flush, 15, 12);
	const size_t many[] = { 32, 32, 32, 32, 32, 7, 32, 32 };
	const bool many_flush[] = { false, false, false, true, false, false, false, true };
	deferred_matches_direct(128, 32, many, many_flush, 8, 32);
}

/* imatrix_self_plan's covariance part is what the collector really holds: a plan with
 * blocks less one without is twice the covariance floats imatrix_self_make writes (doubles
 * while collecting) and the inputs that wait to be added (IMATRIX_SELF_DEFER tokens each), with an untied head (fx-llama) and a tied one (fx-qwen3), whose
 * sampled inputs include the head's under the matrix it reads. */
static void check_self_plan(const char *model_name, const char *head_cov)
{
	char model[4096], out[4096];
	shared_model(model_name, model, sizeof model);
	const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	snprintf(out, sizeof out, "%s/hearth-test-self-plan-%d.gguf", tmp, (int)getpid());
	struct load_opts o;
	load_opts_default(&o);
	o.n_threads = 2;
	struct imatrix_self_opts so = { .n_seqs = 2, .len = 32, .seed = 1, .cov_block = 512 };
	struct hearth_error e = { 0 };
	uint64_t with, without;
	if (imatrix_self_plan(model, &o, &so, &with, &e) < 0)
		fail_msg("imatrix_self_plan %s: %s", model_name, e.msg);
	so.cov_block = 0;
	assert_int_equal(imatrix_self_plan(model, &o, &so, &without, &e), 0);
	so.cov_block = 512;
	if (imatrix_self_make(model, &o, &so, out, NULL, &e) < 0)
		fail_msg("imatrix_self_make %s: %s", model_name, e.msg);
	struct gguf_file *f;
	assert_int_equal(gguf_open(&f, out, &e), 0);
	uint64_t cov_floats = 0, waiting = 0;
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		if (t->name.len > 7 && !memcmp(t->name.ptr + t->name.len - 7, ".in_cov", 7)) {
			cov_floats += t->ne[0] * t->ne[1];
			waiting += (uint64_t)IMATRIX_SELF_DEFER * gptq_cov_ld((size_t)t->ne[1]) * sizeof(float);
		}
	}
	assert_non_null(gguf_tensor_find(f, head_cov));
	assert_true(cov_floats > 0 && without > 0);
	/* the sums in doubles, and each input's tokens that wait to be added */
	assert_int_equal(with - without, cov_floats * sizeof(double) + waiting);
	gguf_close(f);
	remove(out);
}

static void test_imatrix_self_plan_counts_the_covariances(void **state)
{
	(void)state;
	check_self_plan("fx-llama.gguf", "output.weight.in_cov");
	check_self_plan("fx-qwen3.gguf", "token_embd.weight.in_cov");
}

/* An imatrix entry for token_embd.weight (its in_sum2, counts and covariance, cols wide)
 * is about the head's input: a tied model's head reads that matrix, so GPTQ rounds it; an
 * untied model only looks rows of it up, so the loader leaves it alone whatever the file
 * says (it would otherwise round a lookup against another matrix's inputs). */
static void write_embd_imatrix(const char *path, size_t cols)
{
	struct gguf_build *b;
	struct hearth_error e = { 0 };
	uint64_t ne_sum[2] = { cols, 1 }, ne_cnt[2] = { 1, 1 }, ne_cov[2] = { cols, cols };
	assert_int_equal(gguf_build_new(&b, 3, &e), 0);
	assert_int_equal(gguf_build_kv_str(b, "general.type", "imatrix"), 0);
	int s = gguf_build_tensor(b, "token_embd.weight.in_sum2", QTYPE_F32, 2, ne_sum);
	int c = gguf_build_tensor(b, "token_embd.weight.counts", QTYPE_F32, 2, ne_cnt);
	int v = gguf_build_tensor(b, "token_embd.weight.in_cov", QTYPE_F32, 2, ne_cov);
	float *sum = calloc(cols, sizeof *sum), *h = calloc(cols * cols, sizeof *h), cnt = 1000.0f;
	assert_true(sum && h);
	for (size_t i = 0; i < cols; i++)
		for (size_t j = 0; j < cols; j++)
			h[i * cols + j] = i == j ? (sum[i] = 50.0f + (float)(i % 5)) : 2.0f * (float)((i + j) % 3);
	FILE *fp = fopen(path, "wb");
	assert_non_null(fp);
	assert_int_equal(gguf_build_write_header(b, fp, &e), 0);
	assert_int_equal(gguf_build_write_tensor(b, fp, s, sum, gguf_build_tensor_size(b, s), &e), 0);
	assert_int_equal(gguf_build_write_tensor(b, fp, c, &cnt, gguf_build_tensor_size(b, c), &e), 0);
	assert_int_equal(gguf_build_write_tensor(b, fp, v, h, gguf_build_tensor_size(b, v), &e), 0);
	fclose(fp);
	gguf_build_free(b);
	free(sum);
	free(h);
}

static void check_embd_entry(const char *model_name, bool tied)
{
	char model[4096], path[4096];
	shared_model(model_name, model, sizeof model);
	snprintf(path, sizeof path, "%s/hearth-test-embd-imatrix-%d.gguf", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
		 (int)getpid());
	struct hearth_error e = { 0 };
	struct gguf_file *f;
	assert_int_equal(gguf_open(&f, model, &e), 0);
	const struct gguf_tensor *embd = gguf_tensor_find(f, "token_embd.weight");
	assert_non_null(embd);
	assert_int_equal(gguf_tensor_find(f, "output.weight") == NULL, tied);
	write_embd_imatrix(path, (size_t)embd->ne[0]);
	gguf_close(f);
	struct load_opts o;
	load_opts_default(&o);
	o.n_threads = 2;
	o.max_context = 64;
	o.kv_budget = 2u << 20;
	o.imatrix = path;
	struct model_q4 *m;
	struct tok *t;
	if (load_q4(&m, &t, model, &o, &e) < 0)
		fail_msg("load_q4 %s with an embedding-only imatrix: %s", model_name, e.msg);
	assert_int_equal(m->n_gptq, tied ? 1 : 0);
	if (!tied)
		assert_int_equal(m->n_imatrix, 0);
	model_q4_free(m);
	tok_free(t);
	remove(path);
}

static void test_imatrix_embedding_entry_is_the_tied_heads_only(void **state)
{
	(void)state;
	check_embd_entry("fx-qwen3.gguf", true);
	check_embd_entry("fx-llama.gguf", false);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_imatrix_reads_llama_imatrix_output),
		cmocka_unit_test(test_imatrix_refuses_legacy_model_and_missing_files),
		cmocka_unit_test(test_imatrix_refuses_hostile_files_by_name),
		cmocka_unit_test(test_imatrix_stats_equal_llama_imatrix_on_the_same_text),
		cmocka_unit_test(test_imatrix_cov_is_the_inputs_covariance),
		cmocka_unit_test(test_imatrix_deferred_cov_is_the_direct_one),
		cmocka_unit_test(test_imatrix_self_plan_counts_the_covariances),
		cmocka_unit_test(test_imatrix_embedding_entry_is_the_tied_heads_only),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
