/* The resident int4 model against the f32 reference on the fixture models: fidelity (top-1
 * agreement and KL divergence of the next-token distribution) must stay close, prefill in
 * one batch must equal feeding tokens one at a time, several sequences in one step must
 * equal each alone, and a shared prompt prefix must give the same logits as a fresh one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fixture_gen.h"
#include "tests/support/prompt.h"
#include "tests/support/ref_txt.h"
#include "daemon/engine/gguf.h"
#include "daemon/engine/ledger.h"
#include "daemon/engine/load.h"
#include "daemon/engine/model.h"
#include "daemon/engine/ref/forward.h"
#include "daemon/engine/tokenizer.h"
#include "kernels/dispatch.h"

#define N_POS 24

/* name in the shared fixtures folder, or an absolute path as it is (the gemma3 models
 * fixture_gen writes). */
static void fixture_path(const char *name, char *buf, size_t cap)
{
	if (name[0] == '/') {
		snprintf(buf, cap, "%s", name);
		return;
	}
	const char *sh = getenv("HEARTH_SHARED");
	if (!sh) {
		fprintf(stderr, "HEARTH_SHARED is not set: run through make check\n");
		exit(1);
	}
	snprintf(buf, cap, "%s/fixtures/%s", sh, name);
}

/* The KV cache type every load below uses: f16 (load_opts' default) unless a test of the
 * int8 cache sets QTYPE_KV_Q8 for its duration (with_kv_type). */
static enum qtype kv_type_for_tests = QTYPE_F16;
/* The mix rule for every load below: off (the int4 layouts these tests hold) unless a test
 * of int8 layer matrices sets it and a budget for its duration (with_mix). */
static uint32_t mix_for_tests = LOAD_MIX_OFF, mix_budget_for_tests;

/* group: load_opts.weights_group (0: the default); head_bits: load_opts.head_bits. */
static struct model_q4 *load_head(const char *file, enum q4_act_kind act, uint32_t max_seqs,
				  uint32_t step_tokens, uint32_t group, uint32_t head_bits)
{
	char path[4096];
	fixture_path(file, path, sizeof path);
	struct load_opts o;
	load_opts_default(&o);
	o.max_context = 128;
	o.kv_budget = 2u << 20;
	o.max_seqs = max_seqs;
	o.step_tokens = step_tokens;
	o.act = act;
	o.n_threads = 2;
	o.weights_group = group;
	o.head_bits = head_bits;
	o.kv_type = kv_type_for_tests;
	o.mix = mix_for_tests;
	o.mix_budget_cbpw = mix_budget_for_tests;
	struct model_q4 *m;
	struct tok *tok;
	struct hearth_error e;
	if (load_q4(&m, &tok, path, &o, &e) < 0)
		fail_msg("load_q4 %s: %s", file, e.msg);
	tok_free(tok);
	if (head_bits || mix_for_tests == LOAD_MIX_OFF)
		assert_int_equal(m->head_bits, head_bits ? head_bits : LOAD_HEAD_INT4);
	assert_int_equal(m->kv.elem_type, kv_type_for_tests);
	return m;
}

static struct model_q4 *load_group(const char *file, enum q4_act_kind act, uint32_t max_seqs,
				   uint32_t step_tokens, uint32_t group)
{
	return load_head(file, act, max_seqs, step_tokens, group, 0);
}

static struct model_q4 *load(const char *file, enum q4_act_kind act, uint32_t max_seqs,
			     uint32_t step_tokens)
{
	return load_group(file, act, max_seqs, step_tokens, 0);
}

/* The reference's logits at every position of prompt (n x n_vocab). */
static float *reference_logits(const char *file, const int32_t *prompt, uint32_t n)
{
	char path[4096];
	fixture_path(file, path, sizeof path);
	struct gguf_file *f;
	struct model *ref;
	struct model_ctx *c;
	struct hearth_error e;
	assert_int_equal(gguf_open(&f, path, &e), 0);
	assert_int_equal(model_load(&ref, f, &(struct model_opts){ .max_ctx = 128 }, &e), 0);
	assert_int_equal(model_ctx_new(&c, ref, 128, &e), 0);
	float *out = malloc((size_t)n * ref->hp.n_vocab * sizeof(float));
	assert_int_equal(model_forward(ref, c, prompt, n, MODEL_LOGITS_ALL, out, &e), 0);
	model_ctx_free(c);
	model_free(ref);
	gguf_close(f);
	return out;
}

/* The int4 model's logits at every position, one token per step. */
static float *q4_logits_stepwise(struct model_q4 *m, const int32_t *prompt, uint32_t n)
{
	struct engine eng;
	model_q4_engine(m, &eng);
	struct engine_seq *s;
	uint32_t cached;
	struct hearth_error e;
	assert_int_equal(eng.seq_open(eng.impl, prompt, n, n, 0, &s, &cached, &e), 0);
	assert_int_equal(cached, 0);
	float *out = malloc((size_t)n * eng.n_vocab * sizeof(float));
	for (uint32_t i = 0; i < n; i++) {
		struct engine_span sp = { s, &prompt[i], 1, out + (size_t)i * eng.n_vocab, 0, NULL };
		assert_int_equal(eng.forward(eng.impl, &sp, 1, &e), 0);
	}
	eng.seq_close(eng.impl, s);
	return out;
}

struct fidelity {
	double top1;     /* fraction of positions with the same argmax */
	double kl_mean;  /* mean KL(reference || int4) in nats */
	double kl_max;
	double abs_max;  /* largest |logit difference| anywhere */
};

static struct fidelity compare(const float *ref, const float *q, uint32_t n, uint32_t n_vocab)
{
	struct fidelity f = { 0, 0, 0, 0 };
	for (uint32_t t = 0; t < n; t++) {
		const float *a = ref + (size_t)t * n_vocab, *b = q + (size_t)t * n_vocab;
		uint32_t ia = 0, ib = 0;
		double ma = a[0], mb = b[0];
		for (uint32_t i = 1; i < n_vocab; i++) {
			if (a[i] > ma) {
				ma = a[i];
				ia = i;
			}
			if (b[i] > mb) {
				mb = b[i];
				ib = i;
			}
		}
		double za = 0, zb = 0;
		for (uint32_t i = 0; i < n_vocab; i++) {
			za += exp(a[i] - ma);
			zb += exp(b[i] - mb);
		}
		double kl = 0;
		for (uint32_t i = 0; i < n_vocab; i++) {
			double la = a[i] - ma - log(za), lb = b[i] - mb - log(zb);
			kl += exp(la) * (la - lb);
		}
		for (uint32_t i = 0; i < n_vocab; i++)
			if (fabs((double)a[i] - b[i]) > f.abs_max)
				f.abs_max = fabs((double)a[i] - b[i]);
		f.top1 += ia == ib;
		f.kl_mean += kl;
		if (kl > f.kl_max)
			f.kl_max = kl;
	}
	f.top1 /= n;
	f.kl_mean /= n;
	return f;
}

static struct fidelity check_fidelity_head(const char *file, enum q4_act_kind act, uint32_t group,
					   uint32_t head_bits, double min_top1, double max_kl)
{
	struct model_q4 *m = load_head(file, act, 4, 64, group, head_bits);
	int32_t prompt[N_POS];
	test_prompt(1, prompt, N_POS, m->hp.n_vocab);
	float *ref = reference_logits(file, prompt, N_POS);
	float *q = q4_logits_stepwise(m, prompt, N_POS);
	struct fidelity f = compare(ref, q, N_POS, m->hp.n_vocab);
	print_message("%-24s %s (%s) KV %s: top-1 %.3f, KL mean %.5f max %.5f nats, logits within %.4f\n",
		      file, act == Q4_ACT_A8 ? "W4A8 " : "W4A16", m->quant_name, qtype_name(m->kv.elem_type),
		      f.top1, f.kl_mean, f.kl_max, f.abs_max);
	assert_true(f.top1 >= min_top1);
	assert_true(f.kl_mean <= max_kl);
	free(ref);
	free(q);
	model_q4_free(m);
	return f;
}

static struct fidelity check_fidelity_group(const char *file, enum q4_act_kind act, uint32_t group,
					    double min_top1, double max_kl)
{
	return check_fidelity_head(file, act, group, 0, min_top1, max_kl);
}

static void check_fidelity(const char *file, enum q4_act_kind act, double min_top1, double max_kl)
{
	check_fidelity_group(file, act, 0, min_top1, max_kl);
}

/* The fixtures have random weights: their next-token distributions are nearly flat, so
 * any 4-bit quantization flips the argmax often. llama.cpp's own Q4_0 of the fx-quant model
 * agrees with the exact model at 0.40 of positions (fx-quant-q4_0.ref.txt against
 * fx-quant-f16.deq.ref.txt). These bounds sit in that band and fail for a broken pipeline
 * (top-1 near 1/n_vocab, KL of several nats); exactness is held by the test after them. */
static void test_q4_qwen3_f32_stays_within_int4_fidelity(void **state)
{
	(void)state;
	check_fidelity("fx-qwen3.gguf", Q4_ACT_A16, 0.2, 0.25);
	check_fidelity("fx-qwen3.gguf", Q4_ACT_A8, 0.2, 0.25);
}

static void test_q4_llama_untied_head_stays_within_int4_fidelity(void **state)
{
	(void)state;
	check_fidelity("fx-llama.gguf", Q4_ACT_A16, 0.2, 0.25);
}

static void test_q4_qwen2_biases_stay_within_int4_fidelity(void **state)
{
	(void)state;
	check_fidelity("fx-qwen2.gguf", Q4_ACT_A16, 0.3, 0.25);
}

static void test_q4_carried_over_quants_stay_within_int4_fidelity(void **state)
{
	(void)state;
	check_fidelity("fx-quant-q4_0.gguf", Q4_ACT_A16, 0.4, 0.1);
	check_fidelity("fx-quant-q4_k_m.gguf", Q4_ACT_A8, 0.4, 0.1);
}

/* A view of an int4 matrix as the f32 tensor it stands for (q4_unpack_rows: the exact
 * values every kernel multiplies by). */
static struct gguf_tensor *f32_like(const struct gguf_tensor *like, size_t rows, size_t cols, float **w)
{
	struct gguf_tensor *t = malloc(sizeof *t);
	*t = *like;
	*w = malloc(rows * cols * sizeof(float));
	t->type = QTYPE_F32;
	t->size = rows * cols * sizeof(float);
	t->data = *w;
	return t;
}

static struct gguf_tensor *unpacked(const struct q4_matrix *q, const struct gguf_tensor *like)
{
	float *w;
	struct gguf_tensor *t = f32_like(like, q->rows, q->cols, &w);
	q4_unpack_rows(q, 0, q->rows, w, q->cols);
	return t;
}

/* The same for an int8 embedding/head (q8_unpack_rows). */
static struct gguf_tensor *unpacked8(const struct q8_matrix *q, const struct gguf_tensor *like)
{
	float *w;
	struct gguf_tensor *t = f32_like(like, q->rows, q->cols, &w);
	q8_unpack_rows(q, 0, q->rows, w, q->cols);
	return t;
}

/* The same for an int6 embedding/head (q6_unpack_rows). */
static struct gguf_tensor *unpacked6(const struct q6_matrix *q, const struct gguf_tensor *like)
{
	float *w;
	struct gguf_tensor *t = f32_like(like, q->rows, q->cols, &w);
	q6_unpack_rows(q, 0, q->rows, w, q->cols);
	return t;
}

static void free_unpacked(const struct gguf_tensor *t)
{
	free((void *)t->data);
	free((void *)t);
}

/* The f32 reference with its matrices replaced by the int4 model's own dequantized
 * weights computes what the int4 forward should: only activation rounding (bf16 for W4A16,
 * int8 for W4A8) and the f16 KV cache separate them. This holds every piece of the batched
 * forward (embedding, norms, RoPE tables, GQA attention over paged KV, head) to the oracle. */
static void check_exact_head(const char *file, enum q4_act_kind act, uint32_t group, uint32_t head_bits,
			     double min_top1, double max_kl)
{
	struct model_q4 *m = load_head(file, act, 4, 64, group, head_bits);
	char path[4096];
	fixture_path(file, path, sizeof path);
	struct gguf_file *f;
	struct model *ref;
	struct hearth_error e;
	assert_int_equal(gguf_open(&f, path, &e), 0);
	assert_int_equal(model_load(&ref, f, &(struct model_opts){ .max_ctx = 128 }, &e), 0);
	for (uint32_t l = 0; l < ref->hp.n_layer; l++) {
		struct model_layer *R = &ref->layers[l];
		const struct mq4_layer *L = &m->layers[l];
		const struct gguf_tensor **rs[7] = { &R->wq, &R->wk, &R->wv, &R->wo, &R->ffn_gate, &R->ffn_up,
						     &R->ffn_down };
		const struct q4_matrix *w4[7] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down };
		/* int8 where the mix rule chose it (its int4 twin then holds nothing) */
		for (int i = 0; i < 7; i++) {
			if (L->w8[i].data)
				assert_null(w4[i]->data);
			*rs[i] = L->w8[i].data ? unpacked8(&L->w8[i], *rs[i]) : unpacked(w4[i], *rs[i]);
		}
	}
	bool tied = ref->output == ref->tok_embd;
	if (m->head_bits == LOAD_HEAD_INT8) {
		assert_null(m->embd.data);
		ref->tok_embd = unpacked8(&m->embd8, ref->tok_embd);
		ref->output = tied ? ref->tok_embd : unpacked8(&m->output8, ref->output);
	} else if (m->head_bits == LOAD_HEAD_INT6) {
		assert_null(m->embd.data);
		assert_null(m->embd8.data);
		ref->tok_embd = unpacked6(&m->embd6, ref->tok_embd);
		ref->output = tied ? ref->tok_embd : unpacked6(&m->output6, ref->output);
	} else {
		ref->tok_embd = unpacked(&m->embd, ref->tok_embd);
		ref->output = tied ? ref->tok_embd : unpacked(&m->output, ref->output);
	}

	int32_t prompt[N_POS];
	test_prompt(4, prompt, N_POS, m->hp.n_vocab);
	struct model_ctx *c;
	assert_int_equal(model_ctx_new(&c, ref, 128, &e), 0);
	float *want = malloc((size_t)N_POS * ref->hp.n_vocab * sizeof(float));
	assert_int_equal(model_forward(ref, c, prompt, N_POS, MODEL_LOGITS_ALL, want, &e), 0);
	float *got = q4_logits_stepwise(m, prompt, N_POS);
	struct fidelity fd = compare(want, got, N_POS, m->hp.n_vocab);
	print_message("%-24s %s %s exact weights: top-1 %.3f, KL mean %.6f max %.6f nats\n", file,
		      act == Q4_ACT_A8 ? "W4A8 " : "W4A16", m->quant_name, fd.top1, fd.kl_mean, fd.kl_max);
	assert_true(fd.top1 >= min_top1);
	assert_true(fd.kl_mean <= max_kl);

	model_ctx_free(c);
	for (uint32_t l = 0; l < ref->hp.n_layer; l++) {
		struct model_layer *R = &ref->layers[l];
		free_unpacked(R->wq);
		free_unpacked(R->wk);
		free_unpacked(R->wv);
		free_unpacked(R->wo);
		free_unpacked(R->ffn_gate);
		free_unpacked(R->ffn_up);
		free_unpacked(R->ffn_down);
	}
	if (!tied)
		free_unpacked(ref->output);
	free_unpacked(ref->tok_embd);
	free(want);
	free(got);
	model_free(ref);
	gguf_close(f);
	model_q4_free(m);
}

/* check_exact_head over the fixtures every wider head is held on: tied and untied heads,
 * float, Q8_0 and Q4_K_M sources, group 128 and 32 layers, A16 and A8. */
static void check_exact_heads(uint32_t head_bits)
{
	check_exact_head("fx-quant-f16.gguf", Q4_ACT_A16, 0, head_bits, 0.9, 0.002);
	check_exact_head("fx-quant-f16.gguf", Q4_ACT_A8, 0, head_bits, 0.8, 0.02);
	check_exact_head("fx-quant-f16.gguf", Q4_ACT_A8, LOAD_GROUP_32, head_bits, 0.8, 0.02);
	check_exact_head("fx-qwen3.gguf", Q4_ACT_A16, 0, head_bits, 0.9, 0.002);
	check_exact_head("fx-llama.gguf", Q4_ACT_A16, 0, head_bits, 0.9, 0.002);
	check_exact_head("fx-llama.gguf", Q4_ACT_A8, 0, head_bits, 0.8, 0.02);
	check_exact_head("fx-quant-q8_0.gguf", Q4_ACT_A16, 0, head_bits, 0.9, 0.002);
	check_exact_head("fx-quant-q4_k_m.gguf", Q4_ACT_A16, 0, head_bits, 0.9, 0.002);
}

static void check_exact_group(const char *file, enum q4_act_kind act, uint32_t group,
			      double min_top1, double max_kl)
{
	check_exact_head(file, act, group, 0, min_top1, max_kl);
}

static void check_exact(const char *file, enum q4_act_kind act, double min_top1, double max_kl)
{
	check_exact_group(file, act, 0, min_top1, max_kl);
}

static void test_q4_forward_equals_the_reference_on_its_own_weights(void **state)
{
	(void)state;
	check_exact("fx-qwen3.gguf", Q4_ACT_A16, 0.95, 0.002);
	check_exact("fx-llama.gguf", Q4_ACT_A16, 0.95, 0.002);
	check_exact("fx-qwen2.gguf", Q4_ACT_A16, 0.95, 0.002);
	check_exact("fx-quant-q4_k_m.gguf", Q4_ACT_A16, 0.95, 0.002);
	check_exact("fx-qwen3.gguf", Q4_ACT_A8, 0.8, 0.02);
}

/* weights_group 32: every layer matrix of an F16/F32 file is symmetric group 32 (even where
 * rows of 256 would take group 128), the embedding/head as load_head_group() says, and the
 * forward still computes exactly what its own weights say. */
static void test_q4_weights_group_32_forward_equals_the_reference_on_its_own_weights(void **state)
{
	(void)state;
	struct model_q4 *m = load_group("fx-quant-f16.gguf", Q4_ACT_A16, 4, 64, LOAD_GROUP_32);
	uint32_t hg = load_head_group(LOAD_GROUP_32);
	for (uint32_t l = 0; l < m->n_layer; l++) {
		const struct mq4_layer *L = &m->layers[l];
		const struct q4_matrix *ws[7] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down };
		for (int i = 0; i < 7; i++) {
			assert_int_equal(ws[i]->group, 32);
			assert_false(ws[i]->asym);
		}
	}
	assert_int_equal(m->embd.group, hg);
	assert_true(m->embd.asym == (hg == 128));
	model_q4_free(m);
	check_exact_group("fx-quant-f16.gguf", Q4_ACT_A16, LOAD_GROUP_32, 0.95, 0.002);
	check_exact_group("fx-quant-f16.gguf", Q4_ACT_A8, LOAD_GROUP_32, 0.8, 0.02);
	check_exact_group("fx-qwen3.gguf", Q4_ACT_A8, LOAD_GROUP_32, 0.8, 0.02);
	/* Carried-over codes keep their layout whatever the option says. */
	check_exact_group("fx-quant-q4_k_m.gguf", Q4_ACT_A16, LOAD_GROUP_32, 0.95, 0.002);
}

/* Against the unquantized model, group 32 with searched scales keeps fx-quant closer than
 * group 128 on the same positions (doc/benchmarks.md: 0.130 against 0.152 mean KL over 256
 * positions), within the band of llama.cpp's Q4_0; so does the default, group 64 with row8's
 * 8-bit scale codes, at group 128's bytes. */
static void test_q4_weights_group_32_is_closer_than_group_128(void **state)
{
	(void)state;
	struct fidelity g128 = check_fidelity_group("fx-quant-f16.gguf", Q4_ACT_A8, LOAD_GROUP_128, 0.2, 0.25);
	struct fidelity g32 = check_fidelity_group("fx-quant-f16.gguf", Q4_ACT_A8, LOAD_GROUP_32, 0.2, 0.25);
	struct fidelity g64 = check_fidelity_group("fx-quant-f16.gguf", Q4_ACT_A8, 0, 0.2, 0.25);
	assert_true(g32.kl_mean < g128.kl_mean);
	assert_true(g64.kl_mean < g128.kl_mean);
}

/* An int8 embedding/head (head_bits 8): the lookup (q8_unpack_rows) and the head
 * (q8_matmul) compute what the model's own int8 weights say, for tied and untied heads, at
 * group 128 (256-wide rows) and 32 (64-wide rows, or weights_group 32 layers with a
 * group-128 head: both activation buffers), packed from F32/F16, carried over from Q8_0,
 * or requantized from Q6_K. */
static void test_q4_int8_head_forward_equals_the_reference_on_its_own_weights(void **state)
{
	(void)state;
	struct model_q4 *m = load_head("fx-quant-f16.gguf", Q4_ACT_A8, 4, 64, 0, LOAD_HEAD_INT8);
	assert_int_equal(m->embd8.group, 128);
	assert_string_equal(m->quant_name, "q4_g64+head_q8");
	model_q4_free(m);
	m = load_head("fx-qwen3.gguf", Q4_ACT_A8, 4, 64, 0, LOAD_HEAD_INT8);
	assert_int_equal(m->embd8.group, 32);
	model_q4_free(m);
	check_exact_heads(LOAD_HEAD_INT8);
}

/* A Q8_0 embedding is carried over exactly: the int8 layout unpacks to the file's own
 * dequantized rows, bit for bit. */
static void test_q4_int8_head_carries_q8_0_over_exactly(void **state)
{
	(void)state;
	struct model_q4 *m = load_head("fx-quant-q8_0.gguf", Q4_ACT_A8, 4, 64, 0, LOAD_HEAD_INT8);
	assert_int_equal(m->embd8.group, 32);
	assert_string_equal(m->quant_name, "q4_g64+head_q8_g32");
	char path[4096];
	fixture_path("fx-quant-q8_0.gguf", path, sizeof path);
	struct gguf_file *f;
	struct hearth_error e;
	assert_int_equal(gguf_open(&f, path, &e), 0);
	const struct gguf_tensor *t = gguf_tensor_find(f, "token_embd.weight");
	assert_non_null(t);
	assert_int_equal(t->type, QTYPE_Q8_0);
	size_t cols = (size_t)t->ne[0], rb;
	assert_true(qtype_row_bytes(t->type, cols, &rb));
	float *want = malloc(cols * sizeof(float)), *got = malloc(cols * sizeof(float));
	for (size_t r = 0; r < m->embd8.rows; r += 97) {
		quant_dequant_row(t->type, (const uint8_t *)t->data + r * rb, want, cols);
		q8_unpack_rows(&m->embd8, r, 1, got, cols);
		assert_memory_equal(got, want, cols * sizeof(float));
	}
	free(want);
	free(got);
	gguf_close(f);
	model_q4_free(m);
}

/* Against the unquantized model an int8 embedding/head is measurably closer than the int4
 * one on the same positions: a lower mean KL and a smaller largest logit error, for a tied
 * head at group 128 (fx-quant) and an untied one at group 32 (fx-llama). */
static void test_q4_int8_head_is_closer_than_int4(void **state)
{
	(void)state;
	static const char *const files[] = { "fx-quant-f16.gguf", "fx-llama.gguf" };
	for (int i = 0; i < 2; i++) {
		struct fidelity h4 = check_fidelity_head(files[i], Q4_ACT_A8, 0, 0, 0.2, 0.25);
		struct fidelity h8 = check_fidelity_head(files[i], Q4_ACT_A8, 0, LOAD_HEAD_INT8, 0.2, 0.25);
		assert_true(h8.kl_mean < 0.9 * h4.kl_mean);
		assert_true(h8.abs_max < h4.abs_max);
	}
}

/* An int6 embedding/head (head_bits 6): the lookup (q6_unpack_rows) and the head
 * (q6_matmul) compute what the model's own int6 weights say, for tied and untied heads,
 * 256- and 64-wide rows, beside group-128 and group-32 layers, packed from F32/F16 and
 * requantized from Q8_0 and Q6_K. */
static void test_q4_int6_head_forward_equals_the_reference_on_its_own_weights(void **state)
{
	(void)state;
	struct model_q4 *m = load_head("fx-quant-f16.gguf", Q4_ACT_A8, 4, 64, 0, LOAD_HEAD_INT6);
	assert_string_equal(m->quant_name, "q4_g64+head_q6");
	model_q4_free(m);
	check_exact_heads(LOAD_HEAD_INT6);
}

/* Against the unquantized model an int6 embedding/head sits between the int4 (group 32
 * asymmetric) one and int8: a clearly lower mean KL and a smaller largest logit error than
 * int4, and not far from int8's (its rounding step is 4x int8's, a quarter of int4's), for
 * a tied head (fx-quant) and an untied one (fx-llama). */
static void test_q4_int6_head_is_closer_than_int4(void **state)
{
	(void)state;
	static const char *const files[] = { "fx-quant-f16.gguf", "fx-llama.gguf" };
	for (int i = 0; i < 2; i++) {
		struct fidelity h4 = check_fidelity_head(files[i], Q4_ACT_A8, 0, LOAD_HEAD_INT4, 0.2, 0.25);
		struct fidelity h6 = check_fidelity_head(files[i], Q4_ACT_A8, 0, LOAD_HEAD_INT6, 0.2, 0.25);
		struct fidelity h8 = check_fidelity_head(files[i], Q4_ACT_A8, 0, LOAD_HEAD_INT8, 0.2, 0.25);
		assert_true(h6.kl_mean < 0.9 * h4.kl_mean);
		assert_true(h6.abs_max < h4.abs_max);
		assert_true(h6.kl_mean - h8.kl_mean < 0.5 * (h4.kl_mean - h8.kl_mean));
	}
}

/* What model_q4_observe reports for the head: the rows it saw under their id and layer. */
struct head_seen {
	uint32_t n_layer, n_embd;
	int want;             /* MQ4_OBSERVE_OUTPUT or _TIED_HEAD */
	float *rows;          /* N_POS x n_embd, in the order they came */
	uint32_t n;
	uint32_t layer_calls; /* the layer matrices' calls, to tell the head's apart */
};

static void head_observe(void *arg, uint32_t layer, int mat, const float *x, size_t n_tok, size_t cols)
{
	struct head_seen *h = arg;
	if (mat < MQ4_LAYER_MATRICES) {
		assert_true(layer < h->n_layer);
		h->layer_calls++;
		return;
	}
	assert_int_equal(mat, h->want);
	assert_int_equal(layer, h->n_layer);
	assert_int_equal(cols, h->n_embd);
	assert_true(h->n + n_tok <= N_POS);
	memcpy(h->rows + (size_t)h->n * cols, x, n_tok * cols * sizeof *x);
	h->n += (uint32_t)n_tok;
}

/* The head's input the observer sees (what imatrix = self collects for GPTQ on the head) is
 * the final norm's output at every position whose logits were wanted: the same floats the
 * engine returns as that position's embedding, under the matrix the head reads (the tied
 * embedding or the output matrix), and nothing for a prefill chunk that wants no logits. */
static void check_observe_head(const char *file, bool tied)
{
	struct model_q4 *m = load(file, Q4_ACT_A8, 2, 64);
	assert_int_equal(m->hp.tied_output, tied);
	struct engine eng;
	model_q4_engine(m, &eng);
	int32_t prompt[N_POS];
	test_prompt(5, prompt, N_POS, m->hp.n_vocab);
	struct head_seen h = { m->n_layer, m->hp.n_embd, tied ? MQ4_OBSERVE_TIED_HEAD : MQ4_OBSERVE_OUTPUT,
			       malloc((size_t)N_POS * m->hp.n_embd * sizeof(float)), 0, 0 };
	float *embd = malloc((size_t)N_POS * m->hp.n_embd * sizeof(float));
	float *logits = malloc(eng.n_vocab * sizeof(float));
	struct hearth_error e;
	struct engine_seq *s;
	uint32_t cached;
	model_q4_observe(m, head_observe, &h);
	/* A prefill chunk without logits: the layers are seen, the head is not. */
	assert_int_equal(eng.seq_open(eng.impl, prompt, N_POS, N_POS, ENGINE_SHARE_PRIVATE, &s, &cached, &e), 0);
	struct engine_span chunk = { s, prompt, N_POS / 2, NULL, 0, NULL };
	assert_int_equal(eng.forward(eng.impl, &chunk, 1, &e), 0);
	assert_int_equal(h.n, 0);
	assert_int_equal(h.layer_calls, m->n_layer * MQ4_LAYER_MATRICES);
	eng.seq_close(eng.impl, s);
	/* One token a step with its logits: a head row each, in order. */
	assert_int_equal(eng.seq_open(eng.impl, prompt, N_POS, N_POS, ENGINE_SHARE_PRIVATE, &s, &cached, &e), 0);
	for (uint32_t i = 0; i < N_POS; i++) {
		struct engine_span sp = { s, &prompt[i], 1, logits, 0, NULL };
		assert_int_equal(eng.forward(eng.impl, &sp, 1, &e), 0);
		assert_int_equal(h.n, i + 1);
	}
	eng.seq_close(eng.impl, s);
	model_q4_observe(m, NULL, NULL);
	/* The same positions' embeddings (W4A8: the same bits however the steps ran). */
	assert_int_equal(eng.seq_open(eng.impl, prompt, N_POS, N_POS, ENGINE_SHARE_PRIVATE, &s, &cached, &e), 0);
	for (uint32_t i = 0; i < N_POS; i++) {
		struct engine_span sp = { .seq = s, .tokens = &prompt[i], .n = 1, .embd = embd + (size_t)i * m->hp.n_embd };
		assert_int_equal(eng.forward(eng.impl, &sp, 1, &e), 0);
	}
	eng.seq_close(eng.impl, s);
	assert_memory_equal(h.rows, embd, (size_t)N_POS * m->hp.n_embd * sizeof(float));
	free(h.rows);
	free(embd);
	free(logits);
	model_q4_free(m);
}

static void test_q4_observe_sees_the_head_input(void **state)
{
	(void)state;
	check_observe_head("fx-qwen3.gguf", true);
	check_observe_head("fx-llama.gguf", false);
}

static void check_prefill_batch_equals_one_token_at_a_time(uint32_t head_bits)
{
	struct model_q4 *m = load_head("fx-qwen3.gguf", Q4_ACT_A8, 4, 64, 0, head_bits);
	struct engine eng;
	model_q4_engine(m, &eng);
	int32_t prompt[N_POS];
	test_prompt(2, prompt, N_POS, m->hp.n_vocab);
	float *step = q4_logits_stepwise(m, prompt, N_POS);
	struct engine_seq *s;
	uint32_t cached;
	struct hearth_error e;
	float *last = malloc(eng.n_vocab * sizeof(float));
	assert_int_equal(eng.seq_open(eng.impl, prompt, N_POS, N_POS, 0, &s, &cached, &e), 0);
	/* The stepwise run published its full blocks: this one starts after them. */
	assert_int_equal(cached, 16);
	struct engine_span sp = { s, prompt + cached, N_POS - cached, last, 0, NULL };
	assert_int_equal(eng.forward(eng.impl, &sp, 1, &e), 0);
	/* W4A8: integer dot products, fixed order: the same bits however rows are batched. */
	assert_memory_equal(last, step + (size_t)(N_POS - 1) * eng.n_vocab, eng.n_vocab * sizeof(float));
	eng.seq_close(eng.impl, s);
	free(last);
	free(step);
	model_q4_free(m);
}

static void test_q4_prefill_batch_equals_one_token_at_a_time(void **state)
{
	(void)state;
	check_prefill_batch_equals_one_token_at_a_time(0);
}

static void check_sequences_in_one_step_equal_each_alone(uint32_t head_bits)
{
	struct model_q4 *m = load_head("fx-qwen2.gguf", Q4_ACT_A8, 4, 64, 0, head_bits);
	struct engine eng;
	model_q4_engine(m, &eng);
	struct hearth_error e;
	int32_t p[3][10];
	uint32_t len[3] = { 10, 4, 7 };
	float *alone[3], *together[3];
	for (int i = 0; i < 3; i++) {
		test_prompt(10u + (uint32_t)i, p[i], len[i], m->hp.n_vocab);
		alone[i] = q4_logits_stepwise(m, p[i], len[i]);
		together[i] = malloc(eng.n_vocab * sizeof(float));
	}
	struct engine_seq *s[3];
	struct engine_span sp[3];
	for (int i = 0; i < 3; i++) {
		uint32_t cached;
		assert_int_equal(eng.seq_open(eng.impl, p[i], len[i], len[i], 0, &s[i], &cached, &e), 0);
		sp[i] = (struct engine_span){ s[i], p[i], len[i], together[i], 0, NULL };
	}
	assert_int_equal(eng.forward(eng.impl, sp, 3, &e), 0);
	for (int i = 0; i < 3; i++) {
		assert_memory_equal(together[i], alone[i] + (size_t)(len[i] - 1) * eng.n_vocab,
				    eng.n_vocab * sizeof(float));
		eng.seq_close(eng.impl, s[i]);
		free(alone[i]);
		free(together[i]);
	}
	model_q4_free(m);
}

static void test_q4_sequences_in_one_step_equal_each_alone(void **state)
{
	(void)state;
	check_sequences_in_one_step_equal_each_alone(0);
}

/* Decode steps of one row per sequence skip barriers: each (row, KV head group) does its
 * own q/k post-processing and K/V store, and whole rows prepare the o matmul's input
 * themselves. Steps of 5, 3 and 1 rows on 2 threads take both ways (heads split across
 * threads and not); every row must equal its sequence run alone, bit for bit. */
static void check_decode_rows_equal_each_alone(const char *file, uint32_t head_bits)
{
	struct model_q4 *m = load_head(file, Q4_ACT_A8, 5, 64, 0, head_bits);
	struct engine eng;
	model_q4_engine(m, &eng);
	struct hearth_error e;
	enum { N = 5 };
	int32_t p[N][16];
	uint32_t len[N];
	float *alone[N], *got = malloc(N * eng.n_vocab * sizeof(float));
	struct engine_seq *s[N];
	struct engine_span sp[N];
	for (int i = 0; i < N; i++) {
		len[i] = 9u + (uint32_t)i;
		test_prompt(20u + (uint32_t)i, p[i], len[i], m->hp.n_vocab);
		alone[i] = q4_logits_stepwise(m, p[i], len[i]);
	}
	for (int i = 0; i < N; i++) {
		uint32_t cached;
		assert_int_equal(eng.seq_open(eng.impl, p[i], len[i], len[i], 0, &s[i], &cached, &e), 0);
		sp[i] = (struct engine_span){ s[i], p[i], len[i] - 3, NULL, 0, NULL };
	}
	assert_int_equal(eng.forward(eng.impl, sp, N, &e), 0);
	static const int rows[3] = { 5, 3, 1 };
	for (int k = 0; k < 3; k++) {
		for (int i = 0; i < rows[k]; i++)
			sp[i] = (struct engine_span){ s[i], p[i] + len[i] - 3 + k, 1,
						      got + (size_t)i * eng.n_vocab, 0, NULL };
		assert_int_equal(eng.forward(eng.impl, sp, (size_t)rows[k], &e), 0);
		for (int i = 0; i < rows[k]; i++)
			assert_memory_equal(got + (size_t)i * eng.n_vocab,
					    alone[i] + (size_t)(len[i] - 3 + k) * eng.n_vocab,
					    eng.n_vocab * sizeof(float));
	}
	for (int i = 0; i < N; i++) {
		eng.seq_close(eng.impl, s[i]);
		free(alone[i]);
	}
	free(got);
	model_q4_free(m);
}

static void test_q4_decode_rows_equal_each_alone(void **state)
{
	(void)state;
	check_decode_rows_equal_each_alone("fx-qwen2.gguf", 0); /* q/k/v biases */
	check_decode_rows_equal_each_alone("fx-qwen3.gguf", 0); /* q/k norms */
}

/* With an int8 embedding/head, W8A8's integer dots keep batching exact: a prefill in one
 * step, several sequences in one step and decode steps of several rows each equal the
 * tokens run one at a time, bit for bit (group 32 heads here, and group 128 for
 * fx-quant's 256-wide rows). */
static void test_q4_int8_head_batches_equal_one_at_a_time(void **state)
{
	(void)state;
	check_prefill_batch_equals_one_token_at_a_time(LOAD_HEAD_INT8);
	check_sequences_in_one_step_equal_each_alone(LOAD_HEAD_INT8);
	check_decode_rows_equal_each_alone("fx-qwen3.gguf", LOAD_HEAD_INT8);
	check_decode_rows_equal_each_alone("fx-quant-f16.gguf", LOAD_HEAD_INT8);
}

/* The same for an int6 embedding/head: W6A8's integer dots keep batching exact. */
static void test_q4_int6_head_batches_equal_one_at_a_time(void **state)
{
	(void)state;
	check_prefill_batch_equals_one_token_at_a_time(LOAD_HEAD_INT6);
	check_sequences_in_one_step_equal_each_alone(LOAD_HEAD_INT6);
	check_decode_rows_equal_each_alone("fx-qwen3.gguf", LOAD_HEAD_INT6);
	check_decode_rows_equal_each_alone("fx-quant-f16.gguf", LOAD_HEAD_INT6);
}

static void with_mix(uint32_t cbpw)
{
	mix_for_tests = cbpw ? LOAD_MIX_AUTO : LOAD_MIX_OFF;
	mix_budget_for_tests = cbpw;
}

static uint32_t count_int8_layers(const char *file, enum q4_act_kind act, uint32_t *head_bits)
{
	struct model_q4 *m = load_head(file, act, 4, 64, 0, 0);
	uint32_t n = m->n_mix8;
	*head_bits = m->head_bits;
	print_message("%-24s %s: %u int8 layer matrices\n", file, m->quant_name, n);
	model_q4_free(m);
	return n;
}

/* Layer matrices the mix rule made int8 (q8_matmul inside the layers' matmul phases, beside
 * int4 ones reading the same activations): the forward computes what the model's own
 * weights say, with the tolerances of the int8-head tests, W4A16 and W4A8, at budgets that
 * upgrade some layer matrices (fx-quant: group 128; fx-qwen3's 64-wide rows: group 32) and
 * every matrix with the head at int6 (tied and untied). */
static void test_q4_int8_layer_matrices_forward_equals_the_reference_on_its_own_weights(void **state)
{
	(void)state;
	static const struct {
		const char *file;
		uint32_t cbpw;
		bool all;
	} cases[] = {
		{ "fx-quant-f16.gguf", 520, false },
		{ "fx-quant-f16.gguf", 900, true },
		{ "fx-qwen3.gguf", 560, false },
		{ "fx-llama.gguf", 900, true },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		with_mix(cases[i].cbpw);
		uint32_t head_bits;
		uint32_t n = count_int8_layers(cases[i].file, Q4_ACT_A8, &head_bits);
		if (cases[i].all) {
			assert_int_equal(head_bits, LOAD_HEAD_INT6);
		} else {
			assert_true(n > 0);
			assert_int_equal(head_bits, LOAD_HEAD_INT4);
		}
		check_exact_head(cases[i].file, Q4_ACT_A16, 0, 0, 0.9, 0.002);
		check_exact_head(cases[i].file, Q4_ACT_A8, 0, 0, 0.8, 0.02);
	}
	with_mix(0);
}

/* W8A8 integer dots in the layers keep batching exact too: a prefill in one step, several
 * sequences in one step and decode rows equal the tokens run one at a time, bit for bit. */
static void test_q4_int8_layer_matrices_batch_equal_one_at_a_time(void **state)
{
	(void)state;
	with_mix(600);
	check_prefill_batch_equals_one_token_at_a_time(0);
	check_sequences_in_one_step_equal_each_alone(0);
	check_decode_rows_equal_each_alone("fx-qwen3.gguf", 0);
	check_decode_rows_equal_each_alone("fx-quant-f16.gguf", 0);
	with_mix(900);
	check_decode_rows_equal_each_alone("fx-quant-f16.gguf", 0);
	with_mix(0);
}

/* Against the unquantized model, int8 layer matrices bring fx-quant closer than all-int4
 * layers with the same head. */
static void test_q4_int8_layer_matrices_are_closer_than_int4(void **state)
{
	(void)state;
	struct fidelity off = check_fidelity_head("fx-quant-f16.gguf", Q4_ACT_A8, 0, LOAD_HEAD_INT4, 0.2, 0.25);
	with_mix(900);
	struct fidelity mix = check_fidelity_head("fx-quant-f16.gguf", Q4_ACT_A8, 0, LOAD_HEAD_INT4, 0.2, 0.25);
	with_mix(0);
	assert_true(mix.kl_mean < 0.9 * off.kl_mean);
}

/* An int8 KV cache (kv_type = q8) on top of int4 weights, against the f32 reference,
 * beside the same model with an f16 cache. On these fixtures (24 positions) per-row int8
 * moves the mean KL by under 0.0005 nats, within the int4 weights' own noise. So q8 must
 * stay in the f16 tests' bands and within 0.005 nats (10x that) of f16 KV; a lost scale or
 * a wrong row stride costs whole nats. */
static void check_q8_kv_fidelity(const char *file, enum q4_act_kind act, double min_top1, double max_kl)
{
	kv_type_for_tests = QTYPE_F16;
	struct fidelity f16 = check_fidelity_group(file, act, 0, min_top1, max_kl);
	kv_type_for_tests = QTYPE_KV_Q8;
	struct fidelity q8 = check_fidelity_group(file, act, 0, min_top1, max_kl);
	kv_type_for_tests = QTYPE_F16;
	if (!(q8.kl_mean <= f16.kl_mean + 0.005))
		fail_msg("%s: q8 KV KL mean %.5f vs f16 KV %.5f", file, q8.kl_mean, f16.kl_mean);
}

static void test_q4_q8_kv_stays_within_int4_fidelity(void **state)
{
	(void)state;
	check_q8_kv_fidelity("fx-qwen3.gguf", Q4_ACT_A8, 0.2, 0.25);
	check_q8_kv_fidelity("fx-qwen2.gguf", Q4_ACT_A16, 0.3, 0.25);
	check_q8_kv_fidelity("fx-quant-q4_0.gguf", Q4_ACT_A16, 0.4, 0.1);
	check_q8_kv_fidelity("fx-quant-q4_k_m.gguf", Q4_ACT_A8, 0.4, 0.1);
}

/* The int8 cache keeps batching exact: a row is quantized on its own (its own scale), so
 * a prefill in one step, several sequences in one step and decode steps of several rows
 * store the same bytes and read them the same way as tokens run one at a time. */
static void test_q4_q8_kv_batches_equal_one_at_a_time(void **state)
{
	(void)state;
	kv_type_for_tests = QTYPE_KV_Q8;
	check_prefill_batch_equals_one_token_at_a_time(0);
	check_sequences_in_one_step_equal_each_alone(0);
	check_decode_rows_equal_each_alone("fx-qwen2.gguf", 0);
	check_decode_rows_equal_each_alone("fx-qwen3.gguf", 0);
	kv_type_for_tests = QTYPE_F16;
}

static void test_q4_shared_prefix_gives_the_same_logits(void **state)
{
	(void)state;
	struct model_q4 *m = load("fx-qwen3.gguf", Q4_ACT_A8, 4, 64);
	struct engine eng;
	model_q4_engine(m, &eng);
	struct hearth_error e;
	int32_t prompt[40];
	test_prompt(3, prompt, 40, m->hp.n_vocab);
	float *a = malloc(eng.n_vocab * sizeof(float)), *b = malloc(eng.n_vocab * sizeof(float));
	struct engine_seq *s1, *s2;
	uint32_t c1, c2;
	assert_int_equal(eng.seq_open(eng.impl, prompt, 40, 41, 0, &s1, &c1, &e), 0);
	assert_int_equal(c1, 0);
	struct engine_span sp = { s1, prompt, 40, a, 0, NULL };
	assert_int_equal(eng.forward(eng.impl, &sp, 1, &e), 0);
	/* The second sequence with the same prompt finds its two full blocks cached. */
	assert_int_equal(eng.seq_open(eng.impl, prompt, 40, 41, 0, &s2, &c2, &e), 0);
	assert_int_equal(c2, 32);
	sp = (struct engine_span){ s2, prompt + c2, 40 - c2, b, 0, NULL };
	assert_int_equal(eng.forward(eng.impl, &sp, 1, &e), 0);
	assert_memory_equal(a, b, eng.n_vocab * sizeof(float));
	eng.seq_close(eng.impl, s1);
	eng.seq_close(eng.impl, s2);
	free(a);
	free(b);
	model_q4_free(m);
}

/* ---- gemma3 against llama.cpp (tests/fixtures/gemma3, README.md there) ---- */

struct ref_agreement {
	double max_err;            /* worst |logit - llama.cpp| over every position's top 16 */
	uint32_t top1, positions;  /* positions whose argmax is llama.cpp's top 1 */
	uint32_t greedy_min;       /* tokens of llama.cpp's greedy run matched (fewer of the two) */
};

/* Both reference sequences through the engine: the sequence one token per step (logits at
 * every position compared), then its greedy continuation from a second sequence that
 * prefills it in spans of step_tokens, as the scheduler does. */
static struct ref_agreement q4_against_ref(struct model_q4 *m, const struct ref *r)
{
	struct engine eng;
	struct hearth_error e;
	struct ref_agreement ag = { 0, 0, 0, REF_GREEDY };
	model_q4_engine(m, &eng);
	float *logits = malloc(eng.n_vocab * sizeof(float));
	assert_non_null(logits);
	for (int si = 0; si < 2; si++) {
		const struct ref_seq *rs = &r->seq[si];
		float *all = q4_logits_stepwise(m, rs->ids, (uint32_t)rs->n);
		for (size_t p = 0; p < rs->n; p++) {
			const float *lp = all + p * eng.n_vocab;
			for (int i = 0; i < REF_TOP; i++) {
				double d = fabs(lp[rs->pos[p].top_id[i]] - rs->pos[p].top_logit[i]);
				ag.max_err = d > ag.max_err ? d : ag.max_err;
			}
			ag.top1 += (int32_t)vec_argmax_ref(lp, eng.n_vocab) == rs->pos[p].top_id[0];
			ag.positions++;
		}
		free(all);

		struct engine_seq *s;
		uint32_t cached, g = 0;
		assert_int_equal(eng.seq_open(eng.impl, rs->ids, (uint32_t)rs->n, (uint32_t)rs->n + REF_GREEDY,
					      0, &s, &cached, &e), 0);
		struct engine_span sp;
		for (uint32_t p = cached; p < rs->n; p += m->step_tokens) {
			uint32_t n = (uint32_t)rs->n - p < m->step_tokens ? (uint32_t)rs->n - p : m->step_tokens;
			sp = (struct engine_span){ s, rs->ids + p, n, logits, 0, NULL };
			assert_int_equal(eng.forward(eng.impl, &sp, 1, &e), 0);
		}
		for (; g < REF_GREEDY; g++) {
			int32_t tok = (int32_t)vec_argmax_ref(logits, eng.n_vocab);
			if (tok != rs->greedy[g])
				break;
			sp = (struct engine_span){ s, &tok, 1, logits, 0, NULL };
			assert_int_equal(eng.forward(eng.impl, &sp, 1, &e), 0);
		}
		ag.greedy_min = g < ag.greedy_min ? g : ag.greedy_min;
		eng.seq_close(eng.impl, s);
	}
	free(logits);
	return ag;
}

static void gemma3_fixture(const char *name, char *model, size_t cap)
{
	char why[512];
	if (fixture_gen("gemma3", name, model, cap, why, sizeof why) < 0)
		fail_msg("%s", why);
}

static struct ref_agreement gemma3_q4_agreement_step(const char *name, const char *ref_file,
						     enum q4_act_kind act, uint32_t step_tokens)
{
	char model[2048], ref_path[2048];
	struct ref *r = malloc(sizeof *r);
	assert_non_null(r);
	gemma3_fixture(name, model, sizeof model);
	assert_int_equal(fixture_gen_src(ref_path, sizeof ref_path, "gemma3", ref_file), 0);
	ref_parse(ref_path, r);
	struct model_q4 *m = load_head(model, act, 4, step_tokens, 0, 0);
	/* Q4_0 codes carried over as they are: the engine's weights are the file's */
	assert_string_equal(m->quant_name, "q4_g32");
	struct ref_agreement ag = q4_against_ref(m, r);
	print_message("# %s %s against %s: max |logit err| %.4f, top-1 %u/%u, greedy %u/%d\n", name,
		      act == Q4_ACT_A8 ? "W4A8" : "W4A16", ref_file, ag.max_err, ag.top1, ag.positions,
		      ag.greedy_min, REF_GREEDY);
	model_q4_free(m);
	free(r);
	return ag;
}

static struct ref_agreement gemma3_q4_agreement(const char *name, const char *ref_file,
						enum q4_act_kind act)
{
	return gemma3_q4_agreement_step(name, ref_file, act, 64);
}

/* How far llama.cpp's own int8-activation run (.ref.txt) is from its exact one
 * (.deq.ref.txt): the largest difference of a logit both list, and top-1 agreement. */
static void llama_cpp_int8_band(const char *ref, const char *deq, double *max_err, uint32_t *top1)
{
	char pa[2048], pb[2048];
	struct ref *a = malloc(sizeof *a), *b = malloc(sizeof *b);
	assert_true(a && b);
	assert_int_equal(fixture_gen_src(pa, sizeof pa, "gemma3", ref), 0);
	assert_int_equal(fixture_gen_src(pb, sizeof pb, "gemma3", deq), 0);
	ref_parse(pa, a);
	ref_parse(pb, b);
	*max_err = 0;
	*top1 = 0;
	for (int s = 0; s < 2; s++)
		for (size_t p = 0; p < a->seq[s].n; p++) {
			const struct ref_pos *x = &a->seq[s].pos[p], *y = &b->seq[s].pos[p];
			*top1 += x->top_id[0] == y->top_id[0];
			for (int i = 0; i < REF_TOP; i++)
				for (int j = 0; j < REF_TOP; j++)
					if (x->top_id[i] == y->top_id[j] &&
					    fabs(x->top_logit[i] - y->top_logit[j]) > *max_err)
						*max_err = fabs(x->top_logit[i] - y->top_logit[j]);
		}
	free(a);
	free(b);
}

/* The int4 engine on fx-gemma3-q4_0 (window 8, every other layer global, softcap), whose
 * Q4_0 codes it carries over: what separates it from llama.cpp's exact run is only the
 * rounding of activations. W4A16 (bf16 activations) stays within 0.03 of every top-16
 * logit (measured 0.017); W4A8 within 1.5 times the distance llama.cpp's own int8
 * activations put between its two references (measured 0.070 against 0.059). Both agree
 * on the argmax at least as often as llama.cpp's two runs agree with each other, and both
 * greedy continuations (past the window) are llama.cpp's, token for token. */
static void test_q4_gemma3_matches_llama_cpp(void **state)
{
	(void)state;
	double band;
	uint32_t band_top1;
	llama_cpp_int8_band("fx-gemma3-q4_0.ref.txt", "fx-gemma3-q4_0.deq.ref.txt", &band, &band_top1);
	print_message("# llama.cpp int8 activations against exact: max |logit err| %.4f, top-1 %u/68\n",
		      band, band_top1);
	struct ref_agreement a16 =
		gemma3_q4_agreement("fx-gemma3-q4_0", "fx-gemma3-q4_0.deq.ref.txt", Q4_ACT_A16);
	assert_true(a16.max_err <= 0.03);
	assert_true(a16.top1 >= band_top1);
	assert_int_equal(a16.greedy_min, REF_GREEDY);
	struct ref_agreement a8 =
		gemma3_q4_agreement("fx-gemma3-q4_0", "fx-gemma3-q4_0.deq.ref.txt", Q4_ACT_A8);
	assert_true(a8.max_err <= 1.5 * band);
	assert_true(a8.top1 >= band_top1);
	assert_int_equal(a8.greedy_min, REF_GREEDY);
	/* and against llama.cpp's int8-activation run itself */
	struct ref_agreement a8l = gemma3_q4_agreement("fx-gemma3-q4_0", "fx-gemma3-q4_0.ref.txt", Q4_ACT_A8);
	assert_true(a8l.max_err <= 1.5 * band);
	assert_int_equal(a8l.greedy_min, REF_GREEDY);
}

/* The sliding layers keep only their ring: with steps of 8 tokens a ring of fx-gemma3-q4_0
 * (window 8) is two pages of 16 positions, which the 72 positions of a sequence and its
 * greedy run wrap twice, while the global layers keep every position in their blocks. The
 * logits are the same as with the large ring of the test above: still llama.cpp's. */
static void test_q4_gemma3_ring_wraps_and_still_matches_llama_cpp(void **state)
{
	(void)state;
	char model[2048];
	gemma3_fixture("fx-gemma3-q4_0", model, sizeof model);
	struct model_q4 *m = load_head(model, Q4_ACT_A16, 4, 8, 0, 0);
	struct kv_stats st;
	kv_stats(&m->kv, &st);
	assert_int_equal(st.layers_sliding, 2);
	assert_int_equal(st.layers_global, 2);
	assert_int_equal(st.ring_tokens, 32);
	/* two global layers of 1 KV head of 64, f16, K and V: 512 bytes a position */
	assert_int_equal(st.block_bytes, 16 * 512);
	assert_int_equal(st.ring_bytes, 4 * 2 * 16 * 512);
	model_q4_free(m);
	struct ref_agreement small =
		gemma3_q4_agreement_step("fx-gemma3-q4_0", "fx-gemma3-q4_0.deq.ref.txt", Q4_ACT_A16, 8);
	struct ref_agreement big =
		gemma3_q4_agreement_step("fx-gemma3-q4_0", "fx-gemma3-q4_0.deq.ref.txt", Q4_ACT_A16, 64);
	assert_true(small.max_err <= 0.03);
	assert_int_equal(small.greedy_min, REF_GREEDY);
	assert_true(fabs(small.max_err - big.max_err) < 1e-6);
	assert_int_equal(small.top1, big.top1);
}

/* The ledger shows KV by kind: the global layers' blocks ("kv_pool") and the sliding
 * layers' rings ("kv_pool.sliding"), both in the KV group, each the size kv_plan gave. */
static void test_q4_gemma3_ledger_shows_kv_by_kind(void **state)
{
	(void)state;
	char model[2048];
	gemma3_fixture("fx-gemma3-q4_0", model, sizeof model);
	struct model_q4 *m = load_head(model, Q4_ACT_A16, 4, 8, 0, 0);
	struct ledger *l = calloc(1, sizeof *l);
	struct hearth_error e;
	assert_non_null(l);
	assert_int_equal(ledger_collect(l, m->arena, NULL, 0, NULL, &e), 0);
	const struct ledger_entry *blocks = NULL, *rings = NULL;
	for (size_t i = 0; i < l->n_entries; i++) {
		if (!strcmp(l->entries[i].name, "kv_pool"))
			blocks = &l->entries[i];
		if (!strcmp(l->entries[i].name, "kv_pool.sliding"))
			rings = &l->entries[i];
	}
	assert_non_null(blocks);
	assert_non_null(rings);
	assert_int_equal(blocks->group, LEDGER_KV);
	assert_int_equal(rings->group, LEDGER_KV);
	assert_int_equal(blocks->bytes, m->kv.geo.pool_bytes);
	assert_int_equal(rings->bytes, m->kv.geo.ring_bytes);
	assert_int_equal(rings->resident, rings->bytes); /* prefaulted like the pool */
	free(l);
	model_q4_free(m);
}

/* fx-gemma3 is F32: requantized to int4 it is another model, so the engine is held to the
 * f32 reference (itself held to llama.cpp by test_model) on its own int4 weights, as the
 * other architectures are: GeGLU, the four norms, the scaled embedding, two RoPE tables
 * (local base 10000 unscaled, global 1e6 scaled by 1/8) and the window of 16. */
static void test_q4_gemma3_forward_equals_the_reference_on_its_own_weights(void **state)
{
	(void)state;
	char model[2048];
	gemma3_fixture("fx-gemma3", model, sizeof model);
	struct model_q4 *m = load_head(model, Q4_ACT_A16, 4, 64, 0, 0);
	assert_int_equal(m->n_ropes, 2);
	for (uint32_t l = 0; l < m->n_layer; l++) {
		const struct mq4_layer *L = &m->layers[l];
		assert_int_equal(L->window, l == 5 ? 0 : 16);
		assert_ptr_equal(L->rope, &m->ropes[l == 5 ? 1 : 0]);
		assert_non_null(L->attn_post_norm);
		assert_non_null(L->ffn_post_norm);
	}
	assert_float_equal(m->ropes[0].base, 10000.0, 0);
	assert_float_equal(m->ropes[0].scale, 1.0, 0);
	assert_float_equal(m->ropes[1].base, 1e6, 0);
	assert_float_equal(m->ropes[1].scale, 0.125, 0);
	/* each table is max_context (128) rows of n_rot / 2 (16) cos and as many sin */
	assert_int_equal(m->bytes_rope, 2 * 2 * 128 * 16 * sizeof(float));
	model_q4_free(m);
	/* This model's next-token distributions are flatter than the others' (two of 24
	 * argmaxes flip on near-ties while the KL is a third of theirs), hence top-1 0.9. */
	check_exact(model, Q4_ACT_A16, 0.9, 0.002);
	check_exact(model, Q4_ACT_A8, 0.8, 0.02);
}

static void test_q4_loader_refuses_context_beyond_training(void **state)
{
	(void)state;
	char path[4096];
	fixture_path("fx-qwen3.gguf", path, sizeof path);
	struct load_opts o;
	load_opts_default(&o);
	o.max_context = 1u << 20;
	o.kv_budget = 2u << 20;
	struct model_q4 *m;
	struct tok *tok;
	struct hearth_error e;
	int rc = load_q4(&m, &tok, path, &o, &e);
	assert_true(rc < 0);
	assert_non_null(strstr(e.msg, "max_context"));
	assert_non_null(strstr(e.msg, "trained"));
}

int main(void)
{
	if (kern_select(getenv("HEARTH_KERNELS")) < 0) {
		fprintf(stderr, "HEARTH_KERNELS=%s: not available here\n", getenv("HEARTH_KERNELS"));
		return 1;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_q4_forward_equals_the_reference_on_its_own_weights),
		cmocka_unit_test(test_q4_weights_group_32_forward_equals_the_reference_on_its_own_weights),
		cmocka_unit_test(test_q4_weights_group_32_is_closer_than_group_128),
		cmocka_unit_test(test_q4_qwen3_f32_stays_within_int4_fidelity),
		cmocka_unit_test(test_q4_llama_untied_head_stays_within_int4_fidelity),
		cmocka_unit_test(test_q4_qwen2_biases_stay_within_int4_fidelity),
		cmocka_unit_test(test_q4_carried_over_quants_stay_within_int4_fidelity),
		cmocka_unit_test(test_q4_q8_kv_stays_within_int4_fidelity),
		cmocka_unit_test(test_q4_q8_kv_batches_equal_one_at_a_time),
		cmocka_unit_test(test_q4_prefill_batch_equals_one_token_at_a_time),
		cmocka_unit_test(test_q4_observe_sees_the_head_input),
		cmocka_unit_test(test_q4_sequences_in_one_step_equal_each_alone),
		cmocka_unit_test(test_q4_decode_rows_equal_each_alone),
		cmocka_unit_test(test_q4_shared_prefix_gives_the_same_logits),
		cmocka_unit_test(test_q4_int8_head_forward_equals_the_reference_on_its_own_weights),
		cmocka_unit_test(test_q4_int8_head_carries_q8_0_over_exactly),
		cmocka_unit_test(test_q4_int8_head_is_closer_than_int4),
		cmocka_unit_test(test_q4_int8_head_batches_equal_one_at_a_time),
		cmocka_unit_test(test_q4_int6_head_forward_equals_the_reference_on_its_own_weights),
		cmocka_unit_test(test_q4_int6_head_is_closer_than_int4),
		cmocka_unit_test(test_q4_int6_head_batches_equal_one_at_a_time),
		cmocka_unit_test(test_q4_int8_layer_matrices_forward_equals_the_reference_on_its_own_weights),
		cmocka_unit_test(test_q4_int8_layer_matrices_batch_equal_one_at_a_time),
		cmocka_unit_test(test_q4_int8_layer_matrices_are_closer_than_int4),
		cmocka_unit_test(test_q4_loader_refuses_context_beyond_training),
		cmocka_unit_test(test_q4_gemma3_matches_llama_cpp),
		cmocka_unit_test(test_q4_gemma3_ring_wraps_and_still_matches_llama_cpp),
		cmocka_unit_test(test_q4_gemma3_ledger_shows_kv_by_kind),
		cmocka_unit_test(test_q4_gemma3_forward_equals_the_reference_on_its_own_weights),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
