/* bench/fidelity: how far hearth's int4 paths (W4A16, W4A8) move the next-token distribution
 * away from the unquantized model, measured against the f32 scalar reference over a corpus
 * of positions (top-1 agreement, mean / p99 / max KL), with the bits per weight each spends.
 * usage: bench/fidelity [--seqs N] [--len L] [--seed S] [--no-text] [--corpus FILE] [--threads T]
 *                       [--act a16|a8|both] [--weights-group 128|64|32] [--head-group 128|32|32a]
 *                       [--head int4|int6|int8] [--kv f16|bf16|q8] [--imatrix FILE]
 *                       [--ablate[=MATCH]] [--calib FILE] [--json] MODEL.gguf   (F32/F16/BF16)
 * The int4 builds come from the daemon's loader with the same options (weights_group).
 * --ablate also runs the f32 reference on the int4 model's own weights, part by part, to
 * show where the distance comes from (layers or the embedding/head) and what an 8-bit head
 * or other int4 layouts (simulated in f32) would buy; --calib gives the simulated layouts an
 * activation-weighted scale search (the f32 engine's statistics over that text). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/fidelity_metrics.h"
#include "daemon/engine/gguf.h"
#include "daemon/engine/imatrix.h"
#include "daemon/engine/load.h"
#include "daemon/engine/model.h"
#include "daemon/engine/ref/forward.h"
#include "daemon/engine/model_q4.h"
#include "daemon/engine/tokenizer.h"
#include "kernels/dispatch.h"
#include "kernels/q6.h"
#include "kernels/quant.h"
#include "protocol/clock.h"

struct fidelity_args {
	const char *corpus;             /* --corpus: one document a line, or NULL */
	const char *calib;              /* --calib: text for the activation statistics, or NULL */
	const char *ablate_match;       /* --ablate=TEXT: only the ablations whose label has it */
	const char *imatrix;            /* --imatrix: the loader's imatrix for the int4 builds */
	const char *label;              /* --label: a note for the table's row, or NULL */
	const char *path;
	uint32_t n_seqs, len, seed, threads;
	uint32_t group, head_group;     /* load_opts weights_group / head_group (0: default) */
	uint32_t head_bits;             /* load_opts head_bits: 0 (the mix rule's), 4, 6 or 8 */
	uint32_t mix;                   /* load_opts mix: LOAD_MIX_AUTO or LOAD_MIX_OFF */
	bool sensitivity;               /* --sensitivity: each matrix alone int4 */
	enum qtype kv_type;             /* load_opts kv_type: QTYPE_F16, QTYPE_BF16, QTYPE_KV_Q8 */
	uint32_t greedy;                /* --greedy N: prompts for the exact-reproduction count */
	bool text, json, a16, a8, ablate;
};

/* Greedy reproduction: each prompt is a corpus sequence's first GREEDY_PROMPT tokens, and a
 * build reproduces it when its GREEDY_GEN greedy tokens equal the f32 reference's exactly. */
enum { GREEDY_PROMPT = 16, GREEDY_GEN = 64 };

/* One int4 build's results. */
struct fidelity_build {
	const char *label;
	char quant[48];
	struct fidelity_bpw bpw;
	struct fidelity_summary sum;
	double ms;
	uint32_t greedy_exact;          /* prompts whose greedy continuation equals the reference's */
	double greedy_prefix;           /* mean tokens equal before the first difference */
};

static void usage(FILE *to)
{
	fprintf(to, "usage: bench/fidelity [--seqs N] [--len L] [--seed S] [--no-text] [--corpus FILE] [--threads T]\n"
		    "                      [--act a16|a8|both] [--weights-group 128|64|32] [--head-group 128|32|32a]\n"
		    "                      [--head int4|int6|int8] [--mix auto|off] [--kv f16|bf16|q8] [--imatrix FILE]\n"
		    "                      [--ablate[=MATCH]] [--calib FILE] [--sensitivity] [--label TEXT] [--json]\n"
		    "                      MODEL.gguf\n"
		    "  MODEL is an unquantized GGUF (F32, F16 or BF16 matrices).\n"
		    "  --weights-group is the daemon's weights_group key (the loader's layout for it);\n"
		    "  --head-group overrides the loader's choice for the embedding/head (128 asymmetric,\n"
		    "  32 symmetric, 32a asymmetric);\n"
		    "  --head int4|int6|int8 forces the embedding/head's type (the daemon's head key;\n"
		    "  default: the mix rule's); --mix off turns the mix rule off (the daemon's\n"
		    "  weights_mix key).\n"
		    "  --sensitivity: each matrix alone int4 (mix off) in the f32 engine, the rest exact,\n"
		    "  with what an int8 copy of it would cost in bits (the mix rule's inputs).\n"
		    "  --label TEXT: a note the JSON carries for the table's row (\"default\").\n"
		    "  --kv is the int4 builds' KV cache type (the daemon's kv_type key; default f16).\n"
		    "  --imatrix FILE: an imatrix's statistics steer the int4 builds' scale search, and\n"
		    "  its covariances (hearthd-tool imatrix --cov) round them by GPTQ (the daemon's\n"
		    "  imatrix key).\n"
		    "  --ablate=MATCH runs only the ablations whose label contains MATCH (and the first);\n"
		    "  --calib FILE (text, one document a line) gives the simulated layouts of the\n"
		    "  'calib' rows their activation statistics, collected by the f32 engine.\n"
		    "  Defaults: 4 sequences x 64 positions (the built-in paragraph, then random ids\n"
		    "  from seed 1), 2 threads, both activation paths.\n"
		    "  --greedy N: also count, over the first N sequences' first 16 tokens as prompts,\n"
		    "  the builds whose 64 greedy tokens equal the f32 reference's exactly.\n"
		    "  --corpus FILE: real text instead, one document a line (a trained model's held-out\n"
		    "  chapters); each sequence is one line's first --len tokens.\n");
}

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || *end || end == s || v < lo || v > hi)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

static int parse_args(int argc, char **argv, struct fidelity_args *a)
{
	*a = (struct fidelity_args){ .n_seqs = 4, .len = 64, .seed = 1, .threads = 2,
				     .text = true, .a16 = true, .a8 = true, .head_bits = 0,
				     .kv_type = QTYPE_F16 };
	for (int i = 1; i < argc; i++) {
		const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(o, "--json"))
			a->json = true;
		else if (!strcmp(o, "--no-text"))
			a->text = false;
		else if (!strcmp(o, "--corpus") && v)
			a->corpus = argv[++i];
		else if (!strcmp(o, "--calib") && v)
			a->calib = argv[++i];
		else if (!strcmp(o, "--imatrix") && v)
			a->imatrix = argv[++i];
		else if (!strcmp(o, "--label") && v)
			a->label = argv[++i];
		else if (!strcmp(o, "--greedy") && v && !parse_u32(v, 1, 1024, &a->greedy))
			i++;
		else if (!strcmp(o, "--ablate"))
			a->ablate = true;
		else if (!strncmp(o, "--ablate=", 9)) {
			a->ablate = true;
			a->ablate_match = o + 9;
		}
		else if (!strcmp(o, "--sensitivity"))
			a->sensitivity = true;
		else if (!strcmp(o, "--mix") && v && (!strcmp(v, "auto") || !strcmp(v, "off"))) {
			a->mix = !strcmp(v, "off") ? LOAD_MIX_OFF : LOAD_MIX_AUTO;
			i++;
		}
		else if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
			usage(stdout);
			exit(0);
		} else if (!strcmp(o, "--seqs") && v && !parse_u32(v, 1, 1024, &a->n_seqs))
			i++;
		else if (!strcmp(o, "--len") && v && !parse_u32(v, 1, 4096, &a->len))
			i++;
		else if (!strcmp(o, "--seed") && v && !parse_u32(v, 0, UINT32_MAX, &a->seed))
			i++;
		else if (!strcmp(o, "--threads") && v && !parse_u32(v, 1, 256, &a->threads))
			i++;
		else if (!strcmp(o, "--weights-group") && v && !parse_u32(v, 32, 128, &a->group) &&
			 (a->group == 32 || a->group == 64 || a->group == 128))
			i++;
		else if (!strcmp(o, "--head-group") && v && !strcmp(v, "32a")) {
			a->head_group = LOAD_GROUP_32_ASYM;
			i++;
		} else if (!strcmp(o, "--head-group") && v && !parse_u32(v, 32, 128, &a->head_group) &&
			   (a->head_group == 32 || a->head_group == 128))
			i++;
		else if (!strcmp(o, "--head") && v &&
			 (!strcmp(v, "int4") || !strcmp(v, "int6") || !strcmp(v, "int8"))) {
			a->head_bits = !strcmp(v, "int8")   ? LOAD_HEAD_INT8
				       : !strcmp(v, "int6") ? LOAD_HEAD_INT6
							    : LOAD_HEAD_INT4;
			i++;
		} else if (!strcmp(o, "--kv") && v &&
			   (!strcmp(v, "f16") || !strcmp(v, "bf16") || !strcmp(v, "q8"))) {
			a->kv_type = !strcmp(v, "q8") ? QTYPE_KV_Q8 : !strcmp(v, "bf16") ? QTYPE_BF16 : QTYPE_F16;
			i++;
		} else if (!strcmp(o, "--act") && v) {
			a->a16 = !strcmp(v, "a16") || !strcmp(v, "both");
			a->a8 = !strcmp(v, "a8") || !strcmp(v, "both");
			if (!a->a16 && !a->a8)
				return -1;
			i++;
		} else if (o[0] != '-' && !a->path)
			a->path = o;
		else
			return -1;
	}
	return a->path ? 0 : -1;
}

static int load_int4(struct model_q4 **m, const struct fidelity_args *a, enum q4_act_kind act,
		     struct hearth_error *err)
{
	struct load_opts o;
	load_opts_default(&o);
	o.max_context = a->len;
	o.kv_budget = 256ull << 20;
	o.max_seqs = 1;
	o.step_tokens = 16;
	o.act = act;
	o.n_threads = a->threads;
	if (a->group)
		o.weights_group = a->group;
	o.head_group = a->head_group;
	o.head_bits = a->head_bits;
	o.mix = a->mix;
	o.kv_type = a->kv_type;
	o.imatrix = a->imatrix;
	struct tok *tok;
	int rc = load_q4(m, &tok, a->path, &o, err);
	if (rc == 0)
		tok_free(tok);
	return rc;
}

/* The int4 model's logits at every position of one sequence: one token per step, because
 * a step returns the logits of each span's last token only. */
static int int4_logits(struct model_q4 *m, const int32_t *ids, uint32_t n, float *out,
		       struct hearth_error *err)
{
	struct engine eng;
	model_q4_engine(m, &eng);
	struct engine_seq *s;
	uint32_t cached;
	int rc = eng.seq_open(eng.impl, ids, n, n, 0, &s, &cached, err);
	if (rc < 0)
		return rc;
	if (cached) {
		eng.seq_close(eng.impl, s);
		return hearth_error_set(err, HEARTH_EINVAL,
					"fidelity: %u positions came from the prefix cache; "
					"corpus sequences must differ", cached);
	}
	for (uint32_t i = 0; i < n && rc == 0; i++) {
		struct engine_span sp = { s, &ids[i], 1, out + (size_t)i * eng.n_vocab, 0, NULL };
		rc = eng.forward(eng.impl, &sp, 1, err);
	}
	eng.seq_close(eng.impl, s);
	return rc;
}

static int32_t argmax_of(const float *x, uint32_t n)
{
	uint32_t best = 0;
	for (uint32_t i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return (int32_t)best;
}

/* The f32 reference's greedy continuation of prompt: GREEDY_GEN ids into out. */
static int ref_greedy(const struct model *m, struct model_ctx *c, const int32_t *prompt, float *logits,
		      int32_t *out, struct hearth_error *err)
{
	model_ctx_reset(c);
	int rc = model_forward(m, c, prompt, GREEDY_PROMPT, MODEL_LOGITS_LAST, logits, err);
	for (uint32_t i = 0; i < GREEDY_GEN && rc == 0; i++) {
		out[i] = argmax_of(logits, m->hp.n_vocab);
		if (i + 1 < GREEDY_GEN)
			rc = model_forward(m, c, &out[i], 1, MODEL_LOGITS_LAST, logits, err);
	}
	return rc;
}

/* The same through the int4 engine's interface, one token a step as the daemon decodes. A
 * sharing domain of its own per prompt, so no prompt is served from another's prefix. */
static int int4_greedy(struct model_q4 *m, const int32_t *prompt, uint32_t domain, float *logits,
		       int32_t *out, struct hearth_error *err)
{
	struct engine eng;
	model_q4_engine(m, &eng);
	struct engine_seq *s;
	uint32_t cached;
	int rc = eng.seq_open(eng.impl, prompt, GREEDY_PROMPT, GREEDY_PROMPT + GREEDY_GEN, domain, &s, &cached,
			      err);
	if (rc < 0)
		return rc;
	if (cached)
		rc = hearth_error_set(err, HEARTH_EINVAL, "fidelity: greedy prompt came from the prefix cache");
	for (uint32_t i = 0; i < GREEDY_PROMPT && rc == 0; i++) {
		struct engine_span sp = { s, &prompt[i], 1, logits, 0, NULL };
		rc = eng.forward(eng.impl, &sp, 1, err);
	}
	for (uint32_t i = 0; i < GREEDY_GEN && rc == 0; i++) {
		out[i] = argmax_of(logits, eng.n_vocab);
		if (i + 1 < GREEDY_GEN) {
			struct engine_span sp = { s, &out[i], 1, logits, 0, NULL };
			rc = eng.forward(eng.impl, &sp, 1, err);
		}
	}
	eng.seq_close(eng.impl, s);
	return rc;
}

/* Bytes the int4 model keeps resident for its parameters: packed codes with their scales
 * (row-block padding included), norms and biases; and the matrices alone. */
static void int4_bpw(const struct model_q4 *m, struct fidelity_bpw *b)
{
	memset(b, 0, sizeof *b);
	b->bytes_all = m->bytes_weights + m->bytes_embed_head + m->bytes_norms;
	b->params_all = m->n_params;
	const struct q4_matrix *mats[2 + 7 * 256];
	size_t n = 0;
	if (m->head_bits == LOAD_HEAD_INT8) {
		const struct q8_matrix *h8[2] = { &m->embd8, &m->output8 };
		for (int k = 0; k < 2 && h8[k]->data; k++) {
			b->bytes_mat += q8_matrix_bytes(h8[k]);
			b->params_mat += (uint64_t)h8[k]->rows * h8[k]->cols;
		}
	} else if (m->head_bits == LOAD_HEAD_INT6) {
		const struct q6_matrix *h6[2] = { &m->embd6, &m->output6 };
		for (int k = 0; k < 2 && h6[k]->data; k++) {
			b->bytes_mat += q6_matrix_bytes(h6[k]);
			b->params_mat += (uint64_t)h6[k]->rows * h6[k]->cols;
		}
	} else {
		mats[n++] = &m->embd;
		if (m->output.data)
			mats[n++] = &m->output;
	}
	for (uint32_t l = 0; l < m->n_layer && l < 256; l++) {
		const struct mq4_layer *L = &m->layers[l];
		const struct q4_matrix *lm[7] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down };
		for (int k = 0; k < 7; k++) {
			if (!L->w8[k].data) {
				mats[n++] = lm[k];
				continue;
			}
			b->bytes_mat += q8_matrix_bytes(&L->w8[k]);
			b->params_mat += (uint64_t)L->w8[k].rows * L->w8[k].cols;
		}
	}
	for (size_t i = 0; i < n; i++) {
		b->bytes_mat += q4_matrix_bytes(mats[i]);
		b->params_mat += (uint64_t)mats[i]->rows * mats[i]->cols;
	}
}

/* Ablations: the reference engine with some of its matrices swapped for what the int4 model
 * multiplies by (q4_unpack_rows), activations left in f32. */
enum {
	ABLATE_LAYERS = 1, ABLATE_HEAD = 2, ABLATE_HEAD_Q8 = 4, ABLATE_LAYERS_G32 = 8,
	ABLATE_LAYERS_SIM = 16, ABLATE_HEAD_SIM = 32, ABLATE_HEAD_Q6 = 64,
	ABLATE_FIRST_VK_Q8 = 128   /* the first layer's attn_v and attn_k through Q8_0 */
};
/* A simulated rule beside enum q4_rule: asymmetric groups whose scales and offsets are
 * themselves quantized to 6 bits against one fp16 scale each per super-block of 256
 * weights (narrower where rows do not hold one): at group 32 llama.cpp's Q4_K, 4.5 bits a
 * weight; at group 64, 4.31. */
#define SIM_RULE_SUPER6 100u
/* Asymmetric groups whose d and m are 8-bit multiples of one fp16 scale each per row
 * (4.25 bits a weight at group 64, as group 128's fp16 pairs). */
#define SIM_RULE_ROW8 101u
#define SIM_BOTH (ABLATE_LAYERS_SIM | ABLATE_HEAD_SIM)

static const struct fidelity_ablation {
	const char *label;
	unsigned parts;
	unsigned lg, lrule, hg, hrule;  /* ABLATE_*_SIM: group and rule of layers / head */
	unsigned calib;   /* 1: the layers' scale search weighted by --calib's statistics */
} fidelity_ablations[] = {
	{ "int4 all, f32 act", ABLATE_LAYERS | ABLATE_HEAD, 0, 0, 0, 0, 0 },
	{ "int4 layers only", ABLATE_LAYERS, 0, 0, 0, 0, 0 },
	{ "int4 embd/head only", ABLATE_HEAD, 0, 0, 0, 0, 0 },
	{ "int4 layers+q8 head", ABLATE_LAYERS | ABLATE_HEAD_Q8, 0, 0, 0, 0, 0 },
	/* the same layout at group 32 (4.5 / 5 bits): what finer groups would buy */
	{ "int4 g32 layers+q8 head", ABLATE_LAYERS_G32 | ABLATE_HEAD_Q8, 0, 0, 0, 0, 0 },
	/* Layouts with no kernel, simulated in f32 (q4_quantize_group_f32): what group 64
	 * asym (4.5 bpw) or sym group 32 with a scale search (4.5 bpw, Q4_0's bits) would buy */
	{ "sim g64a L, g128a H", SIM_BOTH, 64, Q4_RULE_ASYM, 128, Q4_RULE_ASYM, 0 },
	{ "sim g64a L+H", SIM_BOTH, 64, Q4_RULE_ASYM, 64, Q4_RULE_ASYM, 0 },
	{ "sim g32 Q4_0 rule L+H", SIM_BOTH, 32, Q4_RULE_SYM_Q4_0, 32, Q4_RULE_SYM_Q4_0, 0 },
	{ "sim g32 sym search L+H", SIM_BOTH, 32, Q4_RULE_SYM_SEARCH, 32, Q4_RULE_SYM_SEARCH, 0 },
	{ "sim g64a L, q8 H", ABLATE_LAYERS_SIM | ABLATE_HEAD_Q8, 64, Q4_RULE_ASYM, 0, 0, 0 },
	/* The int6 head with today's layers, and with layers at Q4_K's granularity and bits
	 * (no kernel): how far a layer layout of 4.5 bpw would go. */
	{ "int4 layers+q6 head", ABLATE_LAYERS | ABLATE_HEAD_Q6, 0, 0, 0, 0, 0 },
	{ "sim Q4_K L, g32a H", SIM_BOTH, 32, SIM_RULE_SUPER6, 32, Q4_RULE_ASYM, 0 },
	{ "sim Q4_K L, q6 H", ABLATE_LAYERS_SIM | ABLATE_HEAD_Q6, 32, SIM_RULE_SUPER6, 0, 0, 0 },
	{ "sim Q4_K g64 L, q6 H", ABLATE_LAYERS_SIM | ABLATE_HEAD_Q6, 64, SIM_RULE_SUPER6, 0, 0, 0 },
	/* ... with what 4.5 bpw leaves on the larger trained model: its first layer's attn_v
	 * and attn_k at 8 bits, as the mix rule would take them */
	{ "sim Q4_K g64 L, q6 H, mix", ABLATE_LAYERS_SIM | ABLATE_HEAD_Q6 | ABLATE_FIRST_VK_Q8, 64,
	  SIM_RULE_SUPER6, 0, 0, 0 },
	/* Layer layouts side by side with the int6 head: group 128 and 64 with fp16 scales, 64
	 * with row8's 8-bit codes (the default's encoding, here without its d-code choice), and
	 * with --calib, each weighted by activation statistics as an imatrix would */
	{ "sim g128a L, q6 H", ABLATE_LAYERS_SIM | ABLATE_HEAD_Q6, 128, Q4_RULE_ASYM, 0, 0, 0 },
	{ "sim g64a L, q6 H", ABLATE_LAYERS_SIM | ABLATE_HEAD_Q6, 64, Q4_RULE_ASYM, 0, 0, 0 },
	{ "sim g64 row8 L, q6 H", ABLATE_LAYERS_SIM | ABLATE_HEAD_Q6, 64, SIM_RULE_ROW8, 0, 0, 0 },
	{ "sim g128a L calib, q6 H", ABLATE_LAYERS_SIM | ABLATE_HEAD_Q6, 128, Q4_RULE_ASYM, 0, 0, 1 },
	{ "sim g64 row8 L calib, q6 H", ABLATE_LAYERS_SIM | ABLATE_HEAD_Q6, 64, SIM_RULE_ROW8, 0, 0, 1 },
	{ "sim Q4_K g64 L calib, q6 H", ABLATE_LAYERS_SIM | ABLATE_HEAD_Q6, 64, SIM_RULE_SUPER6, 0, 0, 1 },
};
#define N_ABLATIONS (sizeof fidelity_ablations / sizeof fidelity_ablations[0])

/* Owned f32 tensors standing in for the file's; freed together. */
struct fidelity_views {
	struct gguf_tensor *t[2 + 7 * 256];
	size_t n;
};

static struct gguf_tensor *view_new(struct fidelity_views *v, const struct gguf_tensor *like,
				    struct hearth_error *err)
{
	size_t n = (size_t)like->n_elems;
	struct gguf_tensor *t = malloc(sizeof *t);
	float *w = n <= SIZE_MAX / sizeof(float) ? malloc(n * sizeof(float)) : NULL;
	if (!t || !w || v->n == sizeof v->t / sizeof v->t[0]) {
		free(t);
		free(w);
		hearth_error_set(err, HEARTH_ENOMEM, "ablation: f32 copy of %.*s", (int)like->name.len,
				 like->name.ptr);
		return NULL;
	}
	*t = *like;
	t->type = QTYPE_F32;
	t->size = n * sizeof(float);
	t->data = w;
	v->t[v->n++] = t;
	return t;
}

static void views_free(struct fidelity_views *v)
{
	for (size_t i = 0; i < v->n; i++) {
		free((void *)v->t[i]->data);
		free(v->t[i]);
	}
	v->n = 0;
}

static const struct gguf_tensor *view_int4(struct fidelity_views *v, const struct q4_matrix *q,
					   const struct gguf_tensor *like, struct hearth_error *err)
{
	struct gguf_tensor *t = view_new(v, like, err);
	if (t)
		q4_unpack_rows(q, 0, q->rows, (float *)t->data, q->cols);
	return t;
}

static const struct gguf_tensor *view_int8(struct fidelity_views *v, const struct q8_matrix *q,
					   const struct gguf_tensor *like, struct hearth_error *err)
{
	struct gguf_tensor *t = view_new(v, like, err);
	if (t)
		q8_unpack_rows(q, 0, q->rows, (float *)t->data, q->cols);
	return t;
}

/* Layer matrix i (MQ4_WQ ..) as the int4 model multiplies by it: int4, or int8 where the
 * mix rule chose it. */
static const struct gguf_tensor *view_layer(struct fidelity_views *v, const struct mq4_layer *L, int i,
					    const struct gguf_tensor *like, struct hearth_error *err)
{
	const struct q4_matrix *w4[7] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down };
	return L->w8[i].data ? view_int8(v, &L->w8[i], like, err) : view_int4(v, w4[i], like, err);
}

static const struct gguf_tensor *view_int6(struct fidelity_views *v, const struct q6_matrix *q,
					   const struct gguf_tensor *like, struct hearth_error *err)
{
	struct gguf_tensor *t = view_new(v, like, err);
	if (t)
		q6_unpack_rows(q, 0, q->rows, (float *)t->data, q->cols);
	return t;
}

/* The model's embedding or head as f32, int4, int6 or int8 (head_bits). */
static const struct gguf_tensor *view_head(struct fidelity_views *v, const struct model_q4 *q,
					   bool output, const struct gguf_tensor *like,
					   struct hearth_error *err)
{
	if (q->head_bits == LOAD_HEAD_INT6)
		return view_int6(v, output ? &q->output6 : &q->embd6, like, err);
	if (q->head_bits == LOAD_HEAD_INT8)
		return view_int8(v, output ? &q->output8 : &q->embd8, like, err);
	return view_int4(v, output ? &q->output : &q->embd, like, err);
}

/* The source matrix rounded through Q8_0 (llama.cpp's 8.5-bit rows), as f32. */
static const struct gguf_tensor *view_q8(struct fidelity_views *v, const struct gguf_tensor *src,
					 struct hearth_error *err)
{
	size_t cols = (size_t)src->ne[0], rows = (size_t)(src->n_elems / src->ne[0]), rb;
	if (cols % 32 || !qtype_row_bytes(src->type, cols, &rb)) {
		hearth_error_set(err, HEARTH_EINVAL, "ablation: %zu columns do not make Q8_0 blocks", cols);
		return NULL;
	}
	struct gguf_tensor *t = view_new(v, src, err);
	struct block_q8_0 *blk = t ? malloc(cols / 32 * sizeof *blk) : NULL;
	if (!blk) {
		if (t)
			hearth_error_set(err, HEARTH_ENOMEM, "ablation: q8 row");
		return NULL;
	}
	float *w = (float *)t->data;
	for (size_t r = 0; r < rows; r++) {
		quant_dequant_row(src->type, (const uint8_t *)src->data + r * rb, w + r * cols, cols);
		quant_quantize_row(QTYPE_Q8_0, w + r * cols, blk, cols);
		quant_dequant_row(QTYPE_Q8_0, blk, w + r * cols, cols);
	}
	free(blk);
	return t;
}

/* The source matrix packed afresh into the int4 layout at group 32 (asymmetric, as the
 * loader quantizes F32/F16/BF16), as f32. */
static const struct gguf_tensor *view_g32(struct fidelity_views *v, const struct gguf_tensor *src,
					  struct hearth_error *err)
{
	size_t cols = (size_t)src->ne[0], rows = (size_t)(src->n_elems / src->ne[0]), rb;
	struct q4_matrix m;
	if (!qtype_row_bytes(src->type, cols, &rb) || q4_matrix_plan(&m, rows, cols, 32, true) < 0) {
		hearth_error_set(err, HEARTH_EINVAL, "ablation: %zu x %zu at group 32", rows, cols);
		return NULL;
	}
	struct gguf_tensor *t = view_new(v, src, err);
	size_t bytes = (q4_matrix_bytes(&m) + Q4_ALIGN - 1) / Q4_ALIGN * Q4_ALIGN;
	m.data = t ? aligned_alloc(Q4_ALIGN, bytes) : NULL;
	if (!m.data) {
		if (t)
			hearth_error_set(err, HEARTH_ENOMEM, "ablation: group-32 copy");
		return NULL;
	}
	float *w = (float *)t->data;
	for (size_t r = 0; r < rows; r++)
		quant_dequant_row(src->type, (const uint8_t *)src->data + r * rb, w + r * cols, cols);
	q4_pack_rows_f32(&m, w, cols, NULL, 0, rows);
	q4_unpack_rows(&m, 0, rows, w, cols);
	free(m.data);
	return t;
}

/* One super-block of n weights in a layout whose group scales are themselves quantized,
 * in place, at groups of g. bits 6 is Q4_K's (g 32: Q4_K itself; 64: the same at half the
 * scales): per group the asymmetric search's scale d and offset m (an offset above 0 is
 * moved to 0, as Q4_K can only subtract), then d and -m as 6-bit multiples of the block's
 * largest (each an fp16 scale over 63 steps). bits 8: d as an 8-bit multiple of the
 * block's largest d, m signed (-127..127 steps of the largest |m|), so nothing is moved.
 * Then every code is chosen again against the rounded d and m. */
static void sim_super(float *x, const float *w, size_t n, size_t g, unsigned bits)
{
	float d[256], m[256], dmax = 0.0f, mmax = 0.0f;
	uint8_t q[256];
	size_t ng = n / g;
	float dl = bits == 8 ? 255.0f : 63.0f, ml = bits == 8 ? 127.0f : 63.0f;
	for (size_t j = 0; j < ng; j++) {
		float *v = x + g * j, hi = v[0];
		q4_quantize_group_f32(v, w ? w + g * j : NULL, g, Q4_RULE_ASYM, q, &d[j], &m[j]);
		for (size_t k = 1; k < g; k++)
			hi = v[k] > hi ? v[k] : hi;
		if (bits != 8 && m[j] > 0.0f) {
			m[j] = 0.0f;
			d[j] = hi / 15.0f;
		}
		dmax = d[j] > dmax ? d[j] : dmax;
		mmax = fabsf(m[j]) > mmax ? fabsf(m[j]) : mmax;
	}
	float sd = quant_fp16_to_f32(quant_f32_to_fp16(dmax / dl));
	float sm = quant_fp16_to_f32(quant_f32_to_fp16(mmax / ml));
	for (size_t j = 0; j < ng; j++) {
		float qd = sd > 0.0f ? roundf(d[j] / sd) : 0.0f, qm = sm > 0.0f ? roundf(m[j] / sm) : 0.0f;
		qd = qd < dl ? qd : dl;
		qm = qm < -ml ? -ml : qm > ml ? ml : qm;
		float dj = sd * qd, mj = sm * qm;
		for (size_t k = 0; k < g; k++) {
			float c = dj > 0.0f ? roundf((x[g * j + k] - mj) / dj) : 0.0f;
			c = c < 0.0f ? 0.0f : c > 15.0f ? 15.0f : c;
			x[g * j + k] = dj * c + mj;
		}
	}
}

/* The source matrix in the int6 layout's rounding (q6_quantize_group_f32), as f32. */
static const struct gguf_tensor *view_q6(struct fidelity_views *v, const struct gguf_tensor *src,
					 struct hearth_error *err)
{
	size_t cols = (size_t)src->ne[0], rows = (size_t)(src->n_elems / src->ne[0]), rb;
	if (cols % Q6_GROUP || !qtype_row_bytes(src->type, cols, &rb)) {
		hearth_error_set(err, HEARTH_EINVAL, "ablation: %zu columns do not make int6 groups", cols);
		return NULL;
	}
	struct gguf_tensor *t = view_new(v, src, err);
	if (!t)
		return NULL;
	float *w = (float *)t->data;
	int8_t q[Q6_GROUP];
	for (size_t r = 0; r < rows; r++) {
		float *x = w + r * cols;
		quant_dequant_row(src->type, (const uint8_t *)src->data + r * rb, x, cols);
		for (size_t g = 0; g < cols; g += Q6_GROUP) {
			float d;
			q6_quantize_group_f32(x + g, q, &d);
			for (size_t k = 0; k < Q6_GROUP; k++)
				x[g + k] = d * (float)q[k];
		}
	}
	return t;
}

/* The source matrix quantized by `rule` at `group` (halved while rows do not divide), as
 * f32: a layout the kernels may not have, for comparison only. */
static const struct gguf_tensor *view_sim(struct fidelity_views *v, const struct gguf_tensor *src,
					  unsigned group, unsigned rule, const float *col_w,
					  struct hearth_error *err)
{
	size_t cols = (size_t)src->ne[0], rows = (size_t)(src->n_elems / src->ne[0]), rb;
	while (group > 32 && cols % group) /* as the loader: narrower groups where rows do not fit */
		group /= 2;
	if (!qtype_row_bytes(src->type, cols, &rb) || cols % group) {
		hearth_error_set(err, HEARTH_EINVAL, "ablation: %zu x %zu at group %u", rows, cols, group);
		return NULL;
	}
	struct gguf_tensor *t = view_new(v, src, err);
	if (!t)
		return NULL;
	float *w = (float *)t->data;
	uint8_t q[256];
	for (size_t r = 0; r < rows; r++) {
		float *x = w + r * cols;
		quant_dequant_row(src->type, (const uint8_t *)src->data + r * rb, x, cols);
		if (rule == SIM_RULE_SUPER6) {
			size_t sb = 256; /* Q4_K's super-block, narrower where rows do not hold one */
			while (sb > group && cols % sb)
				sb /= 2;
			for (size_t k = 0; k + sb <= cols; k += sb)
				sim_super(x + k, col_w ? col_w + k : NULL, sb, group, 6);
			continue;
		}
		if (rule == SIM_RULE_ROW8) {
			sim_super(x, col_w, cols, group, 8);
			continue;
		}
		for (size_t g = 0; g < cols; g += group) {
			float d, m;
			q4_quantize_group_f32(x + g, col_w ? col_w + g : NULL, group, (enum q4_rule)rule, q, &d, &m);
			for (size_t k = 0; k < group; k++)
				x[g + k] = rule != Q4_RULE_ASYM ? ((float)q[k] - 8.0f) * d : d * (float)q[k] + m;
		}
	}
	return t;
}

/* Activation statistics from calibration text: every layer matrix's input columns summed
 * squared over the calibration windows (the engine's imatrix collector, as hearthd-tool
 * imatrix and llama-imatrix collect them). *out is the caller's to free. */
static int calib_run(struct imatrix_stats **out, const struct model *m, const struct fidelity_corpus *c,
		     float *scratch, struct hearth_error *err)
{
	struct model_ctx *ctx = NULL;
	int rc = imatrix_stats_new(out, err);
	if (rc == 0)
		rc = model_ctx_new(&ctx, m, c->len, err);
	for (uint32_t i = 0; rc == 0 && i < c->n_seqs; i++)
		rc = imatrix_stats_run(*out, m, ctx, c->ids + (size_t)i * c->len, c->len, scratch, err);
	model_ctx_free(ctx);
	return rc;
}

/* Per-column weights of one layer's matrices for a weighted scale search (MQ4_WQ order),
 * each NULL when unweighted. */
struct sim_weights {
	float *w[7];
};

static void sim_weights_free(struct sim_weights *sw)
{
	for (int i = 0; i < 7; i++)
		free(sw->w[i]);
	memset(sw, 0, sizeof *sw);
}

/* The calibrated weights of layer L as sim_weights (mean x^2 per column). */
static int calib_weights(const struct imatrix_stats *cs, const struct model_layer *L, struct sim_weights *sw)
{
	memset(sw, 0, sizeof *sw);
	const struct gguf_tensor *ts[7] = { L->wq, L->wk, L->wv, L->wo, L->ffn_gate, L->ffn_up, L->ffn_down };
	for (int i = 0; i < 7; i++) {
		size_t cols = (size_t)ts[i]->ne[0];
		if (!(sw->w[i] = malloc(cols * sizeof(float)))) {
			sim_weights_free(sw);
			return HEARTH_ENOMEM;
		}
		uint64_t n;
		const double *sum = imatrix_stats_sums(cs, ts[i]->name.ptr, (size_t)ts[i]->name.len, &n);
		for (size_t k = 0; k < cols; k++)
			sw->w[i][k] = sum ? (float)(sum[k] / (double)(n ? n : 1)) : 0.0f;
	}
	return 0;
}

/* Runs the variant v over the corpus and adds its distance from ref_logits to acc; with
 * act_acc, also its distance to each build that ran (builds[k]). Frees v's views and
 * layers whatever rc says: on entry rc is what building the variant returned. */
static int variant_score(struct model *v, struct fidelity_views *views, int rc,
			 const struct fidelity_corpus *c, const float *ref_logits, float *scratch,
			 struct fidelity_acc *acc, float *const builds[2], struct fidelity_acc *act_acc,
			 struct hearth_error *err)
{
	struct model_ctx *ctx = NULL;
	if (rc == 0)
		rc = model_ctx_new(&ctx, v, c->len, err);
	size_t per_seq = (size_t)c->len * v->hp.n_vocab;
	for (uint32_t s = 0; rc == 0 && s < c->n_seqs; s++) {
		model_ctx_reset(ctx);
		rc = model_forward(v, ctx, c->ids + (size_t)s * c->len, c->len, MODEL_LOGITS_ALL, scratch, err);
		if (rc == 0)
			rc = fidelity_acc_add(acc, ref_logits + s * per_seq, scratch, c->len, v->hp.n_vocab, err);
		for (int k = 0; k < 2 && act_acc && rc == 0; k++)
			if (builds[k])
				rc = fidelity_acc_add(&act_acc[k], scratch, builds[k] + s * per_seq, c->len,
						      v->hp.n_vocab, err);
	}
	model_ctx_free(ctx);
	views_free(views);
	free(v->layers);
	return rc;
}

/* builds[k] (NULL when not run) are the int4 engine's logits over the corpus; with
 * act_acc they are compared with this variant's, which isolates activation rounding when
 * the variant holds exactly the int4 weights. */
static int ablate_run(const struct model *ref, const struct model_q4 *q,
		      const struct fidelity_ablation *sim, const struct imatrix_stats *calib,
		      const struct fidelity_corpus *c, const float *ref_logits, float *scratch,
		      struct fidelity_acc *acc, float *const builds[2], struct fidelity_acc *act_acc,
		      struct hearth_error *err)
{
	unsigned parts = sim->parts;
	struct model v = *ref;
	struct fidelity_views views = { .n = 0 };
	int rc = 0;
	v.layers = malloc(ref->hp.n_layer * sizeof *v.layers);
	if (!v.layers)
		return hearth_error_set(err, HEARTH_ENOMEM, "ablation: layers");
	memcpy(v.layers, ref->layers, ref->hp.n_layer * sizeof *v.layers);
	bool tied = ref->output == ref->tok_embd;
	for (uint32_t l = 0; (parts & ABLATE_LAYERS) && l < ref->hp.n_layer && rc == 0; l++) {
		struct model_layer *R = &v.layers[l];
		const struct mq4_layer *L = &q->layers[l];
		const struct gguf_tensor **rs[7] = { &R->wq, &R->wk, &R->wv, &R->wo, &R->ffn_gate, &R->ffn_up,
						     &R->ffn_down };
		for (int i = 0; i < 7 && rc == 0; i++)
			if (!(*rs[i] = view_layer(&views, L, i, *rs[i], err)))
				rc = err->code ? err->code : HEARTH_ENOMEM;
	}
	for (uint32_t l = 0; (parts & ABLATE_LAYERS_G32) && l < ref->hp.n_layer && rc == 0; l++) {
		struct model_layer *R = &v.layers[l];
		if (!(R->wq = view_g32(&views, R->wq, err)) || !(R->wk = view_g32(&views, R->wk, err)) ||
		    !(R->wv = view_g32(&views, R->wv, err)) || !(R->wo = view_g32(&views, R->wo, err)) ||
		    !(R->ffn_gate = view_g32(&views, R->ffn_gate, err)) ||
		    !(R->ffn_up = view_g32(&views, R->ffn_up, err)) ||
		    !(R->ffn_down = view_g32(&views, R->ffn_down, err)))
			rc = err->code ? err->code : HEARTH_ENOMEM;
	}
	for (uint32_t l = 0; (parts & ABLATE_LAYERS_SIM) && l < ref->hp.n_layer && rc == 0; l++) {
		struct model_layer *R = &v.layers[l];
		const struct gguf_tensor **rs[7] = { &R->wq, &R->wk, &R->wv, &R->wo, &R->ffn_gate, &R->ffn_up,
						     &R->ffn_down };
		struct sim_weights sw = { { NULL } };
		if (sim->calib && (rc = calib_weights(calib, &ref->layers[l], &sw)) < 0)
			break;
		for (int i = 0; i < 7 && rc == 0; i++)
			if (!(*rs[i] = view_sim(&views, *rs[i], sim->lg, sim->lrule, sw.w[i], err)))
				rc = err->code ? err->code : HEARTH_ENOMEM;
		sim_weights_free(&sw);
	}
	if (rc == 0 && (parts & ABLATE_FIRST_VK_Q8) && ref->hp.n_layer) {
		struct model_layer *R = &v.layers[0];
		if (!(R->wv = view_q8(&views, ref->layers[0].wv, err)) ||
		    !(R->wk = view_q8(&views, ref->layers[0].wk, err)))
			rc = HEARTH_EINVAL;
	}
	if (rc == 0 && (parts & ABLATE_HEAD_SIM)) {
		if (!(v.tok_embd = view_sim(&views, ref->tok_embd, sim->hg, sim->hrule, NULL, err)) ||
		    !(v.output = tied ? v.tok_embd : view_sim(&views, ref->output, sim->hg, sim->hrule, NULL, err)))
			rc = HEARTH_EINVAL;
	}
	if (rc == 0 && (parts & ABLATE_HEAD)) {
		if (!(v.tok_embd = view_head(&views, q, false, ref->tok_embd, err)) ||
		    !(v.output = tied ? v.tok_embd : view_head(&views, q, true, ref->output, err)))
			rc = HEARTH_ENOMEM;
	}
	if (rc == 0 && (parts & ABLATE_HEAD_Q6)) {
		if (!(v.tok_embd = view_q6(&views, ref->tok_embd, err)) ||
		    !(v.output = tied ? v.tok_embd : view_q6(&views, ref->output, err)))
			rc = HEARTH_EINVAL;
	}
	if (rc == 0 && (parts & ABLATE_HEAD_Q8)) {
		if (!(v.tok_embd = view_q8(&views, ref->tok_embd, err)) ||
		    !(v.output = tied ? v.tok_embd : view_q8(&views, ref->output, err)))
			rc = HEARTH_EINVAL;
	}
	return variant_score(&v, &views, rc, c, ref_logits, scratch, acc, builds, act_acc, err);
}

/* --sensitivity: the reference engine with one matrix class of one layer (layer < 0: of
 * every layer; cls 7: the embedding/head) swapped for q's int4 weights (q loaded with the
 * mix rule off), the rest exact. Its KL is what an int8 copy of those weights would win
 * back, near enough (int8's rounding is a sixteenth of int4's). *extra_bits: what the int8
 * copies would cost over int4, in the layouts the loader would use. */
static const char *const sens_names[8] = { "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
					   "ffn_up", "ffn_down", "embd/head" };

static uint64_t sens_q8_bits(const struct q4_matrix *w)
{
	struct q8_matrix q;
	if (q8_matrix_plan(&q, w->rows, w->cols, w->cols % 128 ? 32 : 128) < 0)
		return 0;
	return 8 * ((uint64_t)q8_matrix_bytes(&q) - q4_matrix_bytes(w));
}

static int sens_run(const struct model *ref, const struct model_q4 *q, int cls, int layer,
		    const struct fidelity_corpus *c, const float *ref_logits, float *scratch,
		    struct fidelity_acc *acc, uint64_t *extra_bits, struct hearth_error *err)
{
	struct model v = *ref;
	struct fidelity_views views = { .n = 0 };
	int rc = 0;
	*extra_bits = 0;
	v.layers = malloc(ref->hp.n_layer * sizeof *v.layers);
	if (!v.layers)
		return hearth_error_set(err, HEARTH_ENOMEM, "sensitivity: layers");
	memcpy(v.layers, ref->layers, ref->hp.n_layer * sizeof *v.layers);
	if (cls == 7) {
		bool tied = ref->output == ref->tok_embd;
		if (!(v.tok_embd = view_int4(&views, &q->embd, ref->tok_embd, err)) ||
		    !(v.output = tied ? v.tok_embd : view_int4(&views, &q->output, ref->output, err)))
			rc = HEARTH_ENOMEM;
		*extra_bits = sens_q8_bits(&q->embd) + (tied ? 0 : sens_q8_bits(&q->output));
	}
	for (uint32_t l = 0; cls < 7 && l < ref->hp.n_layer && rc == 0; l++) {
		if (layer >= 0 && (uint32_t)layer != l)
			continue;
		struct model_layer *R = &v.layers[l];
		const struct mq4_layer *L = &q->layers[l];
		const struct gguf_tensor **rs[7] = { &R->wq, &R->wk, &R->wv, &R->wo, &R->ffn_gate, &R->ffn_up,
						     &R->ffn_down };
		const struct q4_matrix *w4[7] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down };
		if (!(*rs[cls] = view_int4(&views, w4[cls], *rs[cls], err)))
			rc = HEARTH_ENOMEM;
		*extra_bits += sens_q8_bits(w4[cls]);
	}
	return variant_score(&v, &views, rc, c, ref_logits, scratch, acc, NULL, NULL, err);
}

/* Every class alone (all layers), then every (class, layer), then the embedding/head: one
 * line each, KL mean and top-1, the int8 copy's extra bits and KL per extra Mbit. */
static int sens_all(const struct fidelity_args *a, const struct model *ref, const struct fidelity_corpus *c,
		    const float *ref_logits, float *scratch, struct hearth_error *err)
{
	struct fidelity_args as = *a;
	struct model_q4 *q = NULL;
	as.mix = LOAD_MIX_OFF;
	as.head_bits = LOAD_HEAD_INT4;
	int rc = load_int4(&q, &as, Q4_ACT_A16, err);
	if (rc < 0)
		return rc;
	uint64_t params = q->n_params;
	if (a->json)
		printf("{\"sensitivity\":[");
	else
		printf("sensitivity (f32 engine; one matrix class / layer int4 as %s, the rest exact; "
		       "%llu parameters):\n%-12s %5s  %9s  %6s  %12s  %10s  %12s\n", q->quant_name,
		       (unsigned long long)params, "matrix", "layer", "KL mean", "top-1", "int8 +bits", "+bpw",
		       "KL per Mbit");
	bool first = true;
	for (int cls = 0; cls < 8 && rc == 0; cls++) {
		for (int layer = -1; layer < (cls == 7 ? 0 : (int)ref->hp.n_layer) && rc == 0; layer++) {
			struct fidelity_acc acc;
			uint64_t bits;
			fidelity_acc_init(&acc);
			rc = sens_run(ref, q, cls, layer, c, ref_logits, scratch, &acc, &bits, err);
			if (rc == 0) {
				struct fidelity_summary sm = fidelity_acc_summary(&acc);
				double per = bits ? sm.kl_mean / ((double)bits / 1e6) : 0;
				if (a->json)
					printf("%s{\"matrix\":\"%s\",\"layer\":%d,\"kl_mean\":%.8f,\"top1\":%.6f,"
					       "\"extra_bits\":%llu,\"params\":%llu}", first ? "" : ",",
					       sens_names[cls], layer, sm.kl_mean, sm.top1, (unsigned long long)bits,
					       (unsigned long long)params);
				else {
					char lname[12] = "all";
					if (layer >= 0)
						snprintf(lname, sizeof lname, "%d", layer);
					printf("%-12s %5s  %9.6f  %6.4f  %12llu  %10.4f  %12.6f\n", sens_names[cls], lname,
					       sm.kl_mean, sm.top1, (unsigned long long)bits, (double)bits / (double)params,
					       per);
				}
				fflush(stdout);
				first = false;
			}
			fidelity_acc_free(&acc);
		}
	}
	if (a->json)
		printf("]}\n");
	model_q4_free(q);
	return rc;
}

static void print_row(const char *label, const char *quant, const struct fidelity_bpw *b,
		      const struct fidelity_summary *s)
{
	printf("%-16s %-17s %8.3f %8.3f", label, quant, fidelity_bpw_of(b->bytes_all, b->params_all),
	       fidelity_bpw_of(b->bytes_mat, b->params_mat));
	if (s)
		printf("  %6.4f  %9.6f  %9.6f  %9.6f\n", s->top1, s->kl_mean, s->kl_p99, s->kl_max);
	else
		printf("  %6s  %9s  %9s  %9s\n", "-", "-", "-", "-");
}

static void json_bpw(const struct fidelity_bpw *b)
{
	printf("\"bpw\":%.4f,\"bpw_matrices\":%.4f,\"bytes\":%llu,\"params\":%llu",
	       fidelity_bpw_of(b->bytes_all, b->params_all), fidelity_bpw_of(b->bytes_mat, b->params_mat),
	       (unsigned long long)b->bytes_all, (unsigned long long)b->params_all);
}

int main(int argc, char **argv)
{
	struct fidelity_args a;
	if (parse_args(argc, argv, &a) < 0) {
		usage(stderr);
		return 2;
	}
	if (kern_select(getenv("HEARTH_KERNELS")) < 0) {
		fprintf(stderr, "fidelity: HEARTH_KERNELS=%s is not available here\n", getenv("HEARTH_KERNELS"));
		return 1;
	}
	struct hearth_error e = { 0 };
	struct gguf_file *f = NULL;
	struct model *ref = NULL;
	struct tok *tok = NULL;
	struct model_q4 *q[2] = { NULL, NULL };
	struct fidelity_corpus corpus = { 0 };
	struct fidelity_acc acc[2];
	struct fidelity_build builds[2] = { { .label = "hearth W4A16" }, { .label = "hearth W4A8" } };
	bool want[2] = { a.a16 && !a.sensitivity, a.a8 && !a.sensitivity };
	float *ref_logits = NULL, *q_logits = NULL, *q_all[2] = { NULL, NULL };
	struct imatrix_stats *calib = NULL;     /* --calib's statistics */
	struct fidelity_acc act_acc[2];
	struct fidelity_summary act_sum[2];
	struct fidelity_acc abl_acc[N_ABLATIONS];
	struct fidelity_summary abl_sum[N_ABLATIONS];
	bool abl_ran[N_ABLATIONS] = { false };
	double abl_ms = 0;
	struct model_ctx *ctx = NULL;
	struct fidelity_bpw src_bpw;
	int rc;
	fidelity_acc_init(&acc[0]);
	fidelity_acc_init(&acc[1]);
	for (size_t i = 0; i < N_ABLATIONS; i++)
		fidelity_acc_init(&abl_acc[i]);
	fidelity_acc_init(&act_acc[0]);
	fidelity_acc_init(&act_acc[1]);

	if ((rc = fidelity_gguf_bpw(a.path, &src_bpw, &e)) < 0 || (rc = gguf_open(&f, a.path, &e)) < 0)
		goto out;
	if ((rc = model_load(&ref, f, &(struct model_opts){ .max_ctx = a.len, .kv_type = MODEL_KV_F32 },
			     &e)) < 0)
		goto out;
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		enum qtype t = f->tensors[i].type;
		if (f->tensors[i].n_dims >= 2 && t != QTYPE_F32 && t != QTYPE_F16 && t != QTYPE_BF16) {
			rc = hearth_error_set(&e, HEARTH_EINVAL,
					      "%s: tensor %.*s is %s; fidelity needs the unquantized model "
					      "as its reference", a.path, (int)f->tensors[i].name.len,
					      f->tensors[i].name.ptr, qtype_name(t));
			goto out;
		}
	}
	if ((rc = tok_load(&tok, f, &e)) < 0)
		goto out;
	uint32_t n_vocab = ref->hp.n_vocab;
	if (a.corpus)
		rc = fidelity_corpus_read(&corpus, tok, a.corpus, a.n_seqs, a.len, &e);
	else
		rc = fidelity_corpus_build(&corpus, tok, n_vocab, a.n_seqs, a.len, a.seed, a.text, &e);
	if (rc < 0)
		goto out;
	for (int k = 0; k < 2; k++) {
		if (!want[k])
			continue;
		if ((rc = load_int4(&q[k], &a, k ? Q4_ACT_A8 : Q4_ACT_A16, &e)) < 0)
			goto out;
		snprintf(builds[k].quant, sizeof builds[k].quant, "%s", q[k]->quant_name);
		int4_bpw(q[k], &builds[k].bpw);
	}
	/* The reference's logits are kept for the whole corpus, so ablations need not rerun it. */
	size_t per_seq = (size_t)a.len * n_vocab, all;
	if (__builtin_mul_overflow(per_seq, (size_t)a.n_seqs, &all) || all > SIZE_MAX / sizeof(float)) {
		rc = hearth_error_set(&e, HEARTH_ERANGE, "fidelity: corpus logits overflow");
		goto out;
	}
	ref_logits = malloc(all * sizeof(float));
	q_logits = malloc(per_seq * sizeof(float));
	/* With --ablate each build's logits are kept too, for the activation-only comparison. */
	bool kept = true;
	for (int k = 0; k < 2 && a.ablate; k++)
		if (want[k] && !(q_all[k] = malloc(all * sizeof(float))))
			kept = false;
	if (!ref_logits || !q_logits || !kept) {
		rc = hearth_error_set(&e, HEARTH_ENOMEM, "fidelity: logits for %u x %u x %u", a.n_seqs,
				      a.len, n_vocab);
		goto out;
	}
	if ((rc = model_ctx_new(&ctx, ref, a.len, &e)) < 0)
		goto out;
	double ref_ms = 0;
	for (uint32_t s = 0; s < corpus.n_seqs; s++) {
		const int32_t *ids = corpus.ids + (size_t)s * a.len;
		double t0 = ((double)hearth_now_ns() * 1e-6);
		model_ctx_reset(ctx);
		float *rl = ref_logits + (size_t)s * per_seq;
		if ((rc = model_forward(ref, ctx, ids, a.len, MODEL_LOGITS_ALL, rl, &e)) < 0)
			goto out;
		ref_ms += ((double)hearth_now_ns() * 1e-6) - t0;
		for (int k = 0; k < 2; k++) {
			if (!want[k])
				continue;
			t0 = ((double)hearth_now_ns() * 1e-6);
			float *ql = q_all[k] ? q_all[k] + (size_t)s * per_seq : q_logits;
			if ((rc = int4_logits(q[k], ids, a.len, ql, &e)) < 0)
				goto out;
			builds[k].ms += ((double)hearth_now_ns() * 1e-6) - t0;
			if ((rc = fidelity_acc_add(&acc[k], rl, ql, a.len, n_vocab, &e)) < 0)
				goto out;
		}
		fprintf(stderr, "fidelity: sequence %u/%u done (reference %.0f ms so far)\n", s + 1,
			corpus.n_seqs, ref_ms);
	}
	for (int k = 0; k < 2; k++)
		builds[k].sum = fidelity_acc_summary(&acc[k]);
	if (a.greedy) {
		if (a.greedy > corpus.n_seqs || a.len < GREEDY_PROMPT + GREEDY_GEN) {
			rc = hearth_error_set(&e, HEARTH_EINVAL, "fidelity: --greedy %u needs as many sequences "
					      "and --len >= %d", a.greedy, GREEDY_PROMPT + GREEDY_GEN);
			goto out;
		}
		int32_t want_ids[GREEDY_GEN], got_ids[GREEDY_GEN];
		for (uint32_t p = 0; p < a.greedy; p++) {
			const int32_t *prompt = corpus.ids + (size_t)p * a.len;
			if ((rc = ref_greedy(ref, ctx, prompt, q_logits, want_ids, &e)) < 0)
				goto out;
			for (int k = 0; k < 2; k++) {
				if (!want[k])
					continue;
				if ((rc = int4_greedy(q[k], prompt, 1000 + p, q_logits, got_ids, &e)) < 0)
					goto out;
				uint32_t same = 0;
				while (same < GREEDY_GEN && got_ids[same] == want_ids[same])
					same++;
				builds[k].greedy_exact += same == GREEDY_GEN;
				builds[k].greedy_prefix += (double)same / a.greedy;
			}
		}
	}
	if (a.sensitivity) {
		rc = sens_all(&a, ref, &corpus, ref_logits, q_logits, &e);
		goto out;
	}
	if (a.ablate && a.calib) {
		struct fidelity_corpus cc = { 0 };
		rc = fidelity_corpus_read(&cc, tok, a.calib, a.n_seqs, a.len, &e);
		if (rc == 0)
			rc = calib_run(&calib, ref, &cc, q_logits, &e);
		fidelity_corpus_free(&cc);
		if (rc < 0)
			goto out;
	}
	if (a.ablate) {
		double t0 = ((double)hearth_now_ns() * 1e-6);
		for (size_t i = 0; i < N_ABLATIONS; i++) {
			if (a.ablate_match && i && !strstr(fidelity_ablations[i].label, a.ablate_match))
				continue;
			if (fidelity_ablations[i].calib && !calib)
				continue; /* needs --calib: left out of the table */
			if ((rc = ablate_run(ref, q[0] ? q[0] : q[1], &fidelity_ablations[i], calib, &corpus,
					     ref_logits, q_logits, &abl_acc[i], q_all, i == 0 ? act_acc : NULL,
					     &e)) < 0)
				goto out;
			abl_sum[i] = fidelity_acc_summary(&abl_acc[i]);
			abl_ran[i] = true;
			if (i == 0)
				for (int k = 0; k < 2; k++)
					act_sum[k] = fidelity_acc_summary(&act_acc[k]);
			fprintf(stderr, "fidelity: ablation %s done\n", fidelity_ablations[i].label);
		}
		abl_ms = ((double)hearth_now_ns() * 1e-6) - t0;
	}

	const char *name = strrchr(a.path, '/') ? strrchr(a.path, '/') + 1 : a.path;
	uint32_t n_text = a.corpus ? a.n_seqs : a.text ? 1 : 0;
	const char *kv_name = a.kv_type == QTYPE_KV_Q8 ? "q8" : a.kv_type == QTYPE_BF16 ? "bf16" : "f16";
	if (a.json) {
		if (a.label)
			printf("{\"label\":\"%s\",", a.label);
		else
			printf("{");
		printf("\"model\":\"%s\",\"arch\":\"%s\",\"n_vocab\":%u,\"seqs\":%u,\"len\":%u,"
		       "\"text_seqs\":%u,\"seed\":%u,\"positions\":%zu,\"kv\":\"%s\",\"source\":{",
		       name, model_arch_name(ref->hp.arch), n_vocab, a.n_seqs, a.len, n_text, a.seed,
		       (size_t)a.n_seqs * a.len, kv_name);
		json_bpw(&src_bpw);
		printf("},\"builds\":[");
		bool first = true;
		for (int k = 0; k < 2; k++) {
			if (!want[k])
				continue;
			const struct fidelity_summary *s = &builds[k].sum;
			printf("%s{\"build\":\"%s\",\"quant\":\"%s\",", first ? "" : ",", k ? "w4a8" : "w4a16",
			       builds[k].quant);
			json_bpw(&builds[k].bpw);
			printf(",\"top1\":%.6f,\"kl_mean\":%.8f,\"kl_p99\":%.8f,\"kl_max\":%.8f,\"ms\":%.0f",
			       s->top1, s->kl_mean, s->kl_p99, s->kl_max, builds[k].ms);
			if (a.greedy)
				printf(",\"greedy_prompts\":%u,\"greedy_len\":%d,\"greedy_exact\":%u,"
				       "\"greedy_prefix\":%.2f", a.greedy, GREEDY_GEN, builds[k].greedy_exact,
				       builds[k].greedy_prefix);
			printf("}");
			first = false;
		}
		printf("]");
		if (a.ablate) {
			printf(",\"ablations\":[");
			for (size_t i = 0, n = 0; i < N_ABLATIONS; i++)
				if (abl_ran[i])
					printf("%s{\"weights\":\"%s\",\"top1\":%.6f,\"kl_mean\":%.8f,\"kl_p99\":%.8f,"
					       "\"kl_max\":%.8f}", n++ ? "," : "", fidelity_ablations[i].label,
					       abl_sum[i].top1, abl_sum[i].kl_mean, abl_sum[i].kl_p99, abl_sum[i].kl_max);
			printf("],\"activation_only\":[");
			bool first_a = true;
			for (int k = 0; k < 2; k++) {
				if (!want[k])
					continue;
				printf("%s{\"build\":\"%s\",\"top1\":%.6f,\"kl_mean\":%.8f,\"kl_p99\":%.8f,"
				       "\"kl_max\":%.8f}", first_a ? "" : ",", k ? "w4a8" : "w4a16", act_sum[k].top1,
				       act_sum[k].kl_mean, act_sum[k].kl_p99, act_sum[k].kl_max);
				first_a = false;
			}
			printf("]");
		}
		printf(",\"reference_ms\":%.0f}\n", ref_ms);
	} else {
		printf("model %s (%s, %llu parameters, n_vocab %u)\n", name, model_arch_name(ref->hp.arch),
		       (unsigned long long)src_bpw.params_all, n_vocab);
		printf("corpus: %u sequences x %u positions = %zu positions (%u text, %u random from seed %u)\n",
		       a.n_seqs, a.len, (size_t)a.n_seqs * a.len, n_text, a.n_seqs - n_text, a.seed);
		printf("KL(reference || build) in nats over the full vocabulary; reference: f32 scalar engine;"
		       " builds' KV cache %s\n\n", kv_name);
		printf("%-16s %-17s %8s %8s  %6s  %9s  %9s  %9s\n", "build", "quant", "bpw", "bpw-mat",
		       "top-1", "KL mean", "KL p99", "KL max");
		print_row("source", "f32/f16", &src_bpw, NULL);
		for (int k = 0; k < 2; k++)
			if (want[k])
				print_row(builds[k].label, builds[k].quant, &builds[k].bpw, &builds[k].sum);
		for (int k = 0; k < 2 && a.greedy; k++)
			if (want[k])
				printf("%s greedy: %u of %u prompts reproduce the reference's %d tokens exactly "
				       "(mean %.1f tokens before the first difference)\n", builds[k].label,
				       builds[k].greedy_exact, a.greedy, GREEDY_GEN, builds[k].greedy_prefix);
		if (a.ablate) {
			printf("\nablation (f32 reference engine, f32 activations, weights swapped):\n");
			for (size_t i = 0; i < N_ABLATIONS; i++)
				if (abl_ran[i])
					printf("%-27s %24s  %6.4f  %9.6f  %9.6f  %9.6f\n", fidelity_ablations[i].label, "",
					       abl_sum[i].top1, abl_sum[i].kl_mean, abl_sum[i].kl_p99, abl_sum[i].kl_max);
			printf("activation rounding alone (build vs the f32 engine on the same int4 weights):\n");
			for (int k = 0; k < 2; k++)
				if (want[k])
					printf("%-27s %24s  %6.4f  %9.6f  %9.6f  %9.6f\n", builds[k].label, "",
					       act_sum[k].top1, act_sum[k].kl_mean, act_sum[k].kl_p99, act_sum[k].kl_max);
		}
		printf("\ntime: reference %.0f ms", ref_ms);
		for (int k = 0; k < 2; k++)
			if (want[k])
				printf(", %s %.0f ms", builds[k].label, builds[k].ms);
		if (a.ablate)
			printf(", ablations %.0f ms", abl_ms);
		printf("\n");
	}

out:
	if (rc < 0)
		fprintf(stderr, "fidelity: %s\n", e.msg);
	imatrix_stats_free(calib);
	free(ref_logits);
	free(q_logits);
	free(q_all[0]);
	free(q_all[1]);
	fidelity_acc_free(&act_acc[0]);
	fidelity_acc_free(&act_acc[1]);
	model_ctx_free(ctx);
	for (int k = 0; k < 2; k++) {
		model_q4_free(q[k]);
		fidelity_acc_free(&acc[k]);
	}
	for (size_t i = 0; i < N_ABLATIONS; i++)
		fidelity_acc_free(&abl_acc[i]);
	fidelity_corpus_free(&corpus);
	tok_free(tok);
	model_free(ref);
	gguf_close(f);
	return rc < 0 ? 1 : 0;
}
