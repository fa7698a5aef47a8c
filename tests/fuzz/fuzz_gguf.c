/* Fuzz target for model files: the input is a GGUF file, opened as hearthd opens one (from a
 * memfd), then its tokenizer read, the loader's whole plan made (load_plan_size: every
 * hyperparameter, tensor shape and type checked, nothing allocated for the weights) and read
 * as an imatrix. Every input must either pass or fail with a message naming the file;
 * nothing may crash, read outside the file or allocate without bound. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/engine/gguf.h"
#include "daemon/engine/imatrix.h"
#include "daemon/engine/load.h"
#include "daemon/engine/tokenizer.h"
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzz_file.h"
#include "tests/support/gguf_build.h"

void fuzz_fail(const char *file, int line, const char *what)
{
	fprintf(stderr, "%s:%d: invariant broken: %s\n", file, line, what);
	abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[64];
	int fd = fuzz_file(data, size, path, sizeof path);

	struct gguf_file *f = NULL;
	struct hearth_error err = { 0 };
	int rc = gguf_open(&f, path, &err);
	if (rc < 0) {
		FUZZ_CHECK(f == NULL);
		fuzz_check_named(rc, &err, path);
	} else {
		/* Everything the reader hands out lies inside the mapping. */
		for (uint64_t i = 0; i < f->n_tensors; i++) {
			const struct gguf_tensor *t = &f->tensors[i];
			FUZZ_CHECK(t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS);
			FUZZ_CHECK((const uint8_t *)t->data >= f->map);
			FUZZ_CHECK(t->size <= f->map_size && (size_t)((const uint8_t *)t->data - f->map) <= f->map_size - t->size);
		}
		struct tok *t = NULL;
		memset(&err, 0, sizeof err);
		if (tok_load(&t, f, &err) == 0) {
			int32_t ids[64];
			size_t n = 0;
			tok_encode(t, "In the beginning <s>", 20, true, true, ids, 64, &n, &err);
			tok_free(t);
		} else {
			FUZZ_CHECK(t == NULL && err.msg[0] != '\0');
		}
		gguf_close(f);
	}

	struct load_opts lo;
	size_t bytes = 0;
	load_opts_default(&lo);
	lo.max_context = 256;
	lo.kv_budget = 4u << 20;
	memset(&err, 0, sizeof err);
	rc = load_plan_size(path, &lo, &bytes, &err);
	if (rc < 0)
		FUZZ_CHECK(err.msg[0] != '\0');
	else
		FUZZ_CHECK(bytes > 0);

	struct imatrix *im = NULL;
	memset(&err, 0, sizeof err);
	rc = imatrix_open(&im, path, &err);
	if (rc < 0) {
		FUZZ_CHECK(im == NULL);
		fuzz_check_named(rc, &err, path);
	} else {
		imatrix_close(im);
	}
	close(fd);
	return 0;
}

/* A whole model in little room: 32 wide, 1 layer, 2 heads of 16 over 1 KV head, a
 * SentencePiece vocabulary of 8, as llama, qwen3 (q/k norms) or gemma3 (q/k norms, post
 * norms, a sliding window). */
static void seed_tiny_model(fuzz_seed_fn add, void *ctx, const char *arch)
{
	static const char *const tokens[8] = { "<unk>", "<s>", "</s>", "\xe2\x96\x81In", "\xe2\x96\x81the", "a",
					       "b", "\xe2\x96\x81" };
	static const float scores[8] = { 0, 0, 0, -1, -2, -3, -4, -5 };
	static const int32_t types[8] = { 2, 3, 3, 1, 1, 1, 1, 1 };
	static const struct {
		const char *name;
		uint64_t ne0, ne1;
		unsigned archs;          /* bit 0 llama, 1 qwen3, 2 gemma3 */
	} ts[] = {
		{ "token_embd.weight", 32, 8, 7 },	       { "blk.0.attn_norm.weight", 32, 0, 7 },
		{ "blk.0.attn_q.weight", 32, 32, 7 },	       { "blk.0.attn_k.weight", 32, 16, 7 },
		{ "blk.0.attn_v.weight", 32, 16, 7 },	       { "blk.0.attn_output.weight", 32, 32, 7 },
		{ "blk.0.attn_q_norm.weight", 16, 0, 6 },      { "blk.0.attn_k_norm.weight", 16, 0, 6 },
		{ "blk.0.post_attention_norm.weight", 32, 0, 4 }, { "blk.0.ffn_norm.weight", 32, 0, 7 },
		{ "blk.0.ffn_gate.weight", 32, 64, 7 },	       { "blk.0.ffn_up.weight", 32, 64, 7 },
		{ "blk.0.ffn_down.weight", 64, 32, 7 },	       { "blk.0.post_ffw_norm.weight", 32, 0, 4 },
		{ "output_norm.weight", 32, 0, 7 },
	};
	unsigned bit = !strcmp(arch, "qwen3") ? 2 : !strcmp(arch, "gemma3") ? 4 : 1;
	struct hearth_error err = { 0 };
	struct gguf_build *b;
	char *buf = NULL, key[96];
	size_t len = 0;
	FUZZ_CHECK(gguf_build_new(&b, 3, &err) == 0);
	gguf_build_kv_str(b, "general.architecture", arch);
#define KEY(s) (snprintf(key, sizeof key, "%s.%s", arch, s), key)
	gguf_build_kv_u32(b, KEY("embedding_length"), 32);
	gguf_build_kv_u32(b, KEY("block_count"), 1);
	gguf_build_kv_u32(b, KEY("feed_forward_length"), 64);
	gguf_build_kv_u32(b, KEY("context_length"), 256);
	gguf_build_kv_u32(b, KEY("attention.head_count"), 2);
	gguf_build_kv_u32(b, KEY("attention.head_count_kv"), 1);
	gguf_build_kv_f32(b, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
	if (bit == 4)
		gguf_build_kv_u32(b, KEY("attention.sliding_window"), 64);
#undef KEY
	gguf_build_kv_str(b, "tokenizer.ggml.model", "llama");
	gguf_build_kv_arr_str(b, "tokenizer.ggml.tokens", tokens, 8);
	gguf_build_kv_arr(b, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, scores, 8);
	gguf_build_kv_arr(b, "tokenizer.ggml.token_type", GGUF_VT_INT32, types, 8);
	gguf_build_kv_u32(b, "tokenizer.ggml.bos_token_id", 1);
	gguf_build_kv_u32(b, "tokenizer.ggml.eos_token_id", 2);
	int idx[sizeof ts / sizeof ts[0]];
	size_t n_idx = 0;
	for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
		if (!(ts[i].archs & bit))
			continue;
		uint64_t ne[2] = { ts[i].ne0, ts[i].ne1 };
		idx[n_idx] = gguf_build_tensor(b, ts[i].name, QTYPE_F32, ts[i].ne1 ? 2 : 1, ne);
		FUZZ_CHECK(idx[n_idx] >= 0);
		n_idx++;
	}
	FILE *fp = open_memstream(&buf, &len);
	FUZZ_CHECK(fp != NULL);
	FUZZ_CHECK(gguf_build_write_header(b, fp, &err) == 0);
	for (size_t i = 0; i < n_idx; i++) {
		size_t n = gguf_build_tensor_size(b, idx[i]);
		float *w = malloc(n);
		FUZZ_CHECK(w != NULL);
		for (size_t j = 0; j < n / sizeof *w; j++)
			w[j] = (float)((j * 37 + i * 11) % 17) / 17.0f - 0.5f;
		FUZZ_CHECK(gguf_build_write_tensor(b, fp, idx[i], w, n, &err) == 0);
		free(w);
	}
	FUZZ_CHECK(fclose(fp) == 0);
	gguf_build_free(b);
	add(ctx, (const uint8_t *)buf, len);
	free(buf);
}

/* hearth's imatrix with a covariance (hearthd-tool imatrix --cov): one 16-wide entry, its
 * in_sum2, counts and in_cov in blocks of 8 (diagonal the sums, each block symmetric). */
static void seed_cov_imatrix(fuzz_seed_fn add, void *ctx)
{
	struct gguf_build *b;
	struct hearth_error err = { 0 };
	char *buf = NULL;
	size_t len = 0;
	FUZZ_CHECK(gguf_build_new(&b, 3, &err) == 0);
	FUZZ_CHECK(gguf_build_kv_str(b, "general.type", "imatrix") == 0);
	uint64_t ne_s[1] = { 16 }, ne_c[1] = { 1 }, ne_h[2] = { 8, 16 };
	int s = gguf_build_tensor(b, "blk.0.attn_q.weight.in_sum2", QTYPE_F32, 1, ne_s);
	int c = gguf_build_tensor(b, "blk.0.attn_q.weight.counts", QTYPE_F32, 1, ne_c);
	int h = gguf_build_tensor(b, "blk.0.attn_q.weight.in_cov", QTYPE_F32, 2, ne_h);
	FUZZ_CHECK(s >= 0 && c >= 0 && h >= 0);
	float sums[16], count = 40.0f, cov[16 * 8];
	for (int i = 0; i < 16; i++)
		sums[i] = 1.0f + (float)i;
	for (int i = 0; i < 16; i++)
		for (int k = 0; k < 8; k++) {
			int j = i / 8 * 8 + k;
			cov[i * 8 + k] = i == j ? sums[i] : 0.05f * (float)((i + j) % 5);
		}
	FILE *fp = open_memstream(&buf, &len);
	FUZZ_CHECK(fp != NULL);
	FUZZ_CHECK(gguf_build_write_header(b, fp, &err) == 0);
	FUZZ_CHECK(gguf_build_write_tensor(b, fp, s, sums, sizeof sums, &err) == 0);
	FUZZ_CHECK(gguf_build_write_tensor(b, fp, c, &count, sizeof count, &err) == 0);
	FUZZ_CHECK(gguf_build_write_tensor(b, fp, h, cov, sizeof cov, &err) == 0);
	FUZZ_CHECK(fclose(fp) == 0);
	gguf_build_free(b);
	add(ctx, (const uint8_t *)buf, len);
	free(buf);
}

static void seed_file(fuzz_seed_fn add, void *ctx, const char *dir, const char *name)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(path, "rb");
	if (!f)
		return;
	static uint8_t buf[1 << 16];
	size_t n = fread(buf, 1, sizeof buf, f);
	fclose(f);
	add(ctx, buf, n);
}

void fuzz_seeds(fuzz_seed_fn add, void *ctx)
{
	seed_tiny_model(add, ctx, "llama");
	seed_tiny_model(add, ctx, "qwen3");
	seed_tiny_model(add, ctx, "gemma3");
	seed_cov_imatrix(add, ctx);
	/* llama-imatrix's own files, when the sources are at hand */
	const char *src = getenv("HEARTH_SRCDIR");
	char dir[4096];
	snprintf(dir, sizeof dir, "%s/tests/fixtures/imatrix", src ? src : ".");
	seed_file(add, ctx, dir, "fx-llama.imatrix.gguf");
	seed_file(add, ctx, dir, "fx-llama.passage.imatrix.gguf");
}
