/* bench/fidelity_llama: llama.cpp's own Q4_0 against llama.cpp's run of the unquantized model,
 * over the same corpus and with the same metrics as bench/fidelity, so hearth's int4 figures
 * have a like-for-like yardstick (one engine on both sides of each comparison).
 * libllama is dlopen'ed from the prebuilt CPU build that node-llama-cpp@3.21.1 ships
 * (bench/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64); nothing here needs it to build.
 * usage: bench/fidelity_llama --lib DIR [--q4 FILE | --out FILE] [corpus options] [--json]
 *        MODEL.gguf */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/fidelity_metrics.h"
#include "bench/llama_api.h"
#include "daemon/engine/gguf.h"
#include "daemon/engine/model.h"
#include "daemon/engine/ref/forward.h"
#include "daemon/engine/tokenizer.h"
#include "kernels/quant.h"
#include "protocol/clock.h"

struct fidelity_llama_args {
	const char *corpus;             /* --corpus: one document a line, or NULL */
	const char *path, *lib, *q4, *out;
	const char *label;              /* --label: the quantized build's name in the results */
	uint32_t n_seqs, len, seed, threads;
	uint32_t greedy;                /* --greedy N: prompts for the exact-reproduction count */
	bool text, json, check, pure;
};

/* llama.cpp's logits at every position of each corpus sequence, for one model file, into
 * out (n_seqs x len x n_vocab). */
static int llama_logits(const struct llama_api *api, const char *path,
			const struct fidelity_corpus *c, uint32_t n_vocab, uint32_t threads,
			float *out, double *ms, struct hearth_error *err)
{
	struct llama_model_params_abi mp = api->model_default_params();
	mp.n_gpu_layers = 0;
	void *model = api->model_load_from_file(path, mp);
	if (!model)
		return hearth_error_set(err, HEARTH_EIO, "%s: llama.cpp could not load it", path);
	int rc = 0;
	void *ctx = NULL;
	int32_t nv = api->vocab_n_tokens(api->model_get_vocab(model));
	if (nv != (int32_t)n_vocab) {
		rc = hearth_error_set(err, HEARTH_EFORMAT, "%s: llama.cpp sees %d tokens, hearth %u",
				      path, nv, n_vocab);
		goto out;
	}
	struct llama_context_params_abi cp = api->context_default_params();
	cp.n_ctx = c->len < 256 ? 256 : c->len;
	cp.n_batch = cp.n_ctx;
	cp.n_ubatch = cp.n_ctx;
	cp.n_threads = (int32_t)threads;
	cp.n_threads_batch = (int32_t)threads;
	if (!(ctx = api->init_from_model(model, cp))) {
		rc = hearth_error_set(err, HEARTH_EIO, "%s: llama.cpp could not create a context", path);
		goto out;
	}
	struct llama_batch_abi b = api->batch_init((int32_t)c->len, 0, 1);
	double t0 = ((double)hearth_now_ns() * 1e-6);
	for (uint32_t s = 0; s < c->n_seqs && rc == 0; s++) {
		api->memory_clear(api->get_memory(ctx), true);
		for (uint32_t i = 0; i < c->len; i++) {
			b.token[i] = c->ids[(size_t)s * c->len + i];
			b.pos[i] = (int32_t)i;
			b.n_seq_id[i] = 1;
			b.seq_id[i][0] = 0;
			b.logits[i] = 1;
		}
		b.n_tokens = (int32_t)c->len;
		int32_t d = api->decode(ctx, b);
		if (d != 0) {
			rc = hearth_error_set(err, HEARTH_EIO, "%s: llama_decode returned %d", path, d);
			break;
		}
		for (uint32_t i = 0; i < c->len; i++) {
			const float *l = api->get_logits_ith(ctx, (int32_t)i);
			if (!l) {
				rc = hearth_error_set(err, HEARTH_EIO, "%s: no logits at position %u", path, i);
				break;
			}
			memcpy(out + ((size_t)s * c->len + i) * n_vocab, l, n_vocab * sizeof(float));
		}
	}
	*ms = ((double)hearth_now_ns() * 1e-6) - t0;
	api->batch_free(b);
out:
	if (ctx)
		api->free(ctx);
	api->model_free(model);
	return rc;
}

/* Greedy reproduction as bench/fidelity counts it: the first n_prompts corpus sequences'
 * first GREEDY_PROMPT ids as prompts, GREEDY_GEN greedy ids each into out. */
enum { GREEDY_PROMPT = 16, GREEDY_GEN = 64 };

static int llama_greedy(const struct llama_api *api, const char *path, const struct fidelity_corpus *c,
			uint32_t n_prompts, uint32_t n_vocab, uint32_t threads, int32_t *out,
			struct hearth_error *err)
{
	struct llama_model_params_abi mp = api->model_default_params();
	mp.n_gpu_layers = 0;
	void *model = api->model_load_from_file(path, mp);
	if (!model)
		return hearth_error_set(err, HEARTH_EIO, "%s: llama.cpp could not load it", path);
	int rc = 0;
	struct llama_context_params_abi cp = api->context_default_params();
	cp.n_ctx = 256;
	cp.n_batch = cp.n_ubatch = 256;
	cp.n_threads = cp.n_threads_batch = (int32_t)threads;
	void *ctx = api->init_from_model(model, cp);
	if (!ctx) {
		api->model_free(model);
		return hearth_error_set(err, HEARTH_EIO, "%s: llama.cpp could not create a context", path);
	}
	struct llama_batch_abi b = api->batch_init(GREEDY_PROMPT, 0, 1);
	for (uint32_t p = 0; p < n_prompts && rc == 0; p++) {
		api->memory_clear(api->get_memory(ctx), true);
		int32_t pos = 0, n = GREEDY_PROMPT;
		const int32_t *feed = c->ids + (size_t)p * c->len;
		for (uint32_t g = 0; g < GREEDY_GEN && rc == 0; g++) {
			for (int32_t i = 0; i < n; i++) {
				b.token[i] = feed[i];
				b.pos[i] = pos + i;
				b.n_seq_id[i] = 1;
				b.seq_id[i][0] = 0;
				b.logits[i] = i == n - 1;
			}
			b.n_tokens = n;
			int32_t d = api->decode(ctx, b);
			const float *l = d == 0 ? api->get_logits_ith(ctx, n - 1) : NULL;
			if (!l) {
				rc = hearth_error_set(err, HEARTH_EIO, "%s: greedy decode failed (%d)", path, d);
				break;
			}
			int32_t best = 0;
			for (uint32_t v = 1; v < n_vocab; v++)
				if (l[v] > l[best])
					best = (int32_t)v;
			out[(size_t)p * GREEDY_GEN + g] = best;
			pos += n;
			feed = &out[(size_t)p * GREEDY_GEN + g];
			n = 1;
		}
	}
	api->batch_free(b);
	api->free(ctx);
	api->model_free(model);
	return rc;
}

/* hearth's f32 reference over the same corpus, compared with llama.cpp's unquantized logits:
 * proof that both tools see the same ids and positions. */
static int check_against_reference(const char *path, const struct fidelity_corpus *c,
				   const float *llama_ref, uint32_t n_vocab, struct fidelity_summary *out,
				   struct hearth_error *err)
{
	struct gguf_file *f = NULL;
	struct model *m = NULL;
	struct model_ctx *ctx = NULL;
	struct fidelity_acc acc;
	float *logits = malloc((size_t)c->len * n_vocab * sizeof(float));
	fidelity_acc_init(&acc);
	int rc = logits ? 0 : hearth_error_set(err, HEARTH_ENOMEM, "check: logits");
	if (rc == 0 && (rc = gguf_open(&f, path, err)) == 0 &&
	    (rc = model_load(&m, f, &(struct model_opts){ .max_ctx = c->len }, err)) == 0)
		rc = model_ctx_new(&ctx, m, c->len, err);
	for (uint32_t s = 0; rc == 0 && s < c->n_seqs; s++) {
		model_ctx_reset(ctx);
		rc = model_forward(m, ctx, c->ids + (size_t)s * c->len, c->len, MODEL_LOGITS_ALL, logits, err);
		if (rc == 0)
			rc = fidelity_acc_add(&acc, logits, llama_ref + (size_t)s * c->len * n_vocab, c->len,
					      n_vocab, err);
	}
	if (rc == 0)
		*out = fidelity_acc_summary(&acc);
	fidelity_acc_free(&acc);
	model_ctx_free(ctx);
	model_free(m);
	gguf_close(f);
	free(logits);
	return rc;
}

static void usage(FILE *to)
{
	fprintf(to, "usage: bench/fidelity_llama --lib DIR [--q4 FILE | --out FILE | --pure] [--seqs N] [--len L]\n"
		    "                            [--seed S] [--no-text] [--corpus FILE] [--threads T] [--check]\n"
		    "                            [--label NAME] [--json]\n"
		    "                            MODEL.gguf\n"
		    "  DIR holds libllama*.so and libggml*.so (default $HEARTH_LLAMA_LIB), e.g.\n"
		    "  bench/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64.\n"
		    "  --q4 FILE: llama.cpp's Q4_0 of MODEL; without it MODEL is quantized with\n"
		    "  llama_model_quantize (Q4_0, llama.cpp's default per-tensor choices) to --out\n"
		    "  (default /tmp/fidelity-q4_0-PID.gguf, removed afterwards). --pure: every matrix\n"
		    "  Q4_0, the tied embedding/head too (llama-quantize --pure), for equal bits.\n"
		    "  Corpus options and defaults as bench/fidelity's, so the corpora are identical.\n"
		    "  --greedy N: as bench/fidelity's, the quantized build against llama.cpp unquantized.\n"
		    "  --label NAME: the quantized build's name (default llama.cpp q4_0), for a --q4 file\n"
		    "  of another type (Q4_K_M, IQ4_XS from llama-quantize).\n"
		    "  --check: also run hearth's f32 reference over the corpus and compare llama.cpp's\n"
		    "  unquantized logits with it (both engines exact: top-1 ~1, KL ~0 if the harness\n"
		    "  feeds both the same ids).\n");
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

static int parse_args(int argc, char **argv, struct fidelity_llama_args *a)
{
	*a = (struct fidelity_llama_args){ .n_seqs = 4, .len = 64, .seed = 1, .threads = 2, .text = true,
					   .lib = getenv("HEARTH_LLAMA_LIB") };
	for (int i = 1; i < argc; i++) {
		const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(o, "--json"))
			a->json = true;
		else if (!strcmp(o, "--no-text"))
			a->text = false;
		else if (!strcmp(o, "--corpus") && v)
			a->corpus = argv[++i];
		else if (!strcmp(o, "--label") && v)
			a->label = argv[++i];
		else if (!strcmp(o, "--greedy") && v && !parse_u32(v, 1, 1024, &a->greedy))
			i++;
		else if (!strcmp(o, "--check"))
			a->check = true;
		else if (!strcmp(o, "--pure"))
			a->pure = true;
		else if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
			usage(stdout);
			exit(0);
		} else if (!strcmp(o, "--lib") && v)
			a->lib = argv[++i];
		else if (!strcmp(o, "--q4") && v)
			a->q4 = argv[++i];
		else if (!strcmp(o, "--out") && v)
			a->out = argv[++i];
		else if (!strcmp(o, "--seqs") && v && !parse_u32(v, 1, 1024, &a->n_seqs))
			i++;
		else if (!strcmp(o, "--len") && v && !parse_u32(v, 1, 4096, &a->len))
			i++;
		else if (!strcmp(o, "--seed") && v && !parse_u32(v, 0, UINT32_MAX, &a->seed))
			i++;
		else if (!strcmp(o, "--threads") && v && !parse_u32(v, 1, 256, &a->threads))
			i++;
		else if (o[0] != '-' && !a->path)
			a->path = o;
		else
			return -1;
	}
	return a->path && a->lib && !(a->q4 && (a->out || a->pure)) ? 0 : -1;
}

static void json_bpw(const struct fidelity_bpw *b)
{
	printf("\"bpw\":%.4f,\"bpw_matrices\":%.4f,\"bytes\":%llu,\"params\":%llu",
	       fidelity_bpw_of(b->bytes_all, b->params_all), fidelity_bpw_of(b->bytes_mat, b->params_mat),
	       (unsigned long long)b->bytes_all, (unsigned long long)b->params_all);
}

/* "14 q4_0, 1 q6_k" style census of a file's matrix types, for the report. */
static int census(const char *path, struct fidelity_bpw *bpw, char *buf, size_t cap, struct hearth_error *err)
{
	unsigned count[64];
	int rc = fidelity_gguf_census(path, bpw, count, err);
	if (rc < 0)
		return rc;
	size_t o = 0;
	buf[0] = 0;
	for (unsigned t = 0; t < 64; t++)
		if (count[t] && o < cap)
			o += (size_t)snprintf(buf + o, cap - o, "%s%u %s", o ? ", " : "", count[t],
					      fidelity_type_name(t));
	return 0;
}

int main(int argc, char **argv)
{
	struct fidelity_llama_args a;
	if (parse_args(argc, argv, &a) < 0) {
		usage(stderr);
		return 2;
	}
	struct hearth_error e = { 0 };
	struct llama_api api;
	struct gguf_file *f = NULL;
	struct tok *tok = NULL;
	struct fidelity_corpus corpus = { 0 };
	struct fidelity_acc acc;
	struct fidelity_bpw src_bpw, q_bpw;
	float *ref = NULL, *q = NULL;
	char tmp[256] = "", types[256] = "";
	const char *q4 = a.q4;
	double ms_ref = 0, ms_q = 0, ms_quant = 0;
	int32_t *g_ref = NULL, *g_q = NULL;
	int rc;
	fidelity_acc_init(&acc);

	if ((rc = llama_open(&api, a.lib, &e)) < 0 || (rc = llama_check_abi(&api, &e)) < 0)
		goto out;
	if ((rc = gguf_open(&f, a.path, &e)) < 0 || (rc = tok_load(&tok, f, &e)) < 0)
		goto out;
	uint32_t n_vocab = (uint32_t)tok_n_vocab(tok);
	gguf_close(f);
	f = NULL;
	if (!q4) {
		if (a.out)
			snprintf(tmp, sizeof tmp, "%s", a.out);
		else
			snprintf(tmp, sizeof tmp, "/tmp/fidelity-q4_0-%ld.gguf", (long)getpid());
		struct llama_quantize_params_abi qp = api.quantize_default_params();
		qp.ftype = LLAMA_FTYPE_MOSTLY_Q4_0;
		qp.nthread = (int32_t)a.threads;
		qp.pure = a.pure;
		double t0 = ((double)hearth_now_ns() * 1e-6);
		uint32_t qr = api.model_quantize(a.path, tmp, &qp);
		ms_quant = ((double)hearth_now_ns() * 1e-6) - t0;
		if (qr != 0) {
			rc = hearth_error_set(&e, HEARTH_EIO, "llama_model_quantize %s -> %s failed (%u)",
					      a.path, tmp, qr);
			goto out;
		}
		q4 = tmp;
	}
	if ((rc = fidelity_gguf_bpw(a.path, &src_bpw, &e)) < 0 ||
	    (rc = census(q4, &q_bpw, types, sizeof types, &e)) < 0)
		goto out;
	if (a.corpus)
		rc = fidelity_corpus_read(&corpus, tok, a.corpus, a.n_seqs, a.len, &e);
	else
		rc = fidelity_corpus_build(&corpus, tok, n_vocab, a.n_seqs, a.len, a.seed, a.text, &e);
	if (rc < 0)
		goto out;
	size_t n_logits;
	if (__builtin_mul_overflow((size_t)a.n_seqs * a.len, (size_t)n_vocab, &n_logits)) {
		rc = hearth_error_set(&e, HEARTH_ERANGE, "logits for the corpus overflow");
		goto out;
	}
	ref = malloc(n_logits * sizeof(float));
	q = malloc(n_logits * sizeof(float));
	if (!ref || !q) {
		rc = hearth_error_set(&e, HEARTH_ENOMEM, "logits: %zu floats twice", n_logits);
		goto out;
	}
	if ((rc = llama_logits(&api, a.path, &corpus, n_vocab, a.threads, ref, &ms_ref, &e)) < 0 ||
	    (rc = llama_logits(&api, q4, &corpus, n_vocab, a.threads, q, &ms_q, &e)) < 0)
		goto out;
	if ((rc = fidelity_acc_add(&acc, ref, q, (size_t)a.n_seqs * a.len, n_vocab, &e)) < 0)
		goto out;
	uint32_t greedy_exact = 0;
	double greedy_prefix = 0;
	if (a.greedy) {
		if (a.greedy > corpus.n_seqs || a.len < GREEDY_PROMPT) {
			rc = hearth_error_set(&e, HEARTH_EINVAL, "--greedy %u needs as many sequences", a.greedy);
			goto out;
		}
		if (!(g_ref = malloc((size_t)a.greedy * GREEDY_GEN * sizeof *g_ref)) ||
		    !(g_q = malloc((size_t)a.greedy * GREEDY_GEN * sizeof *g_q))) {
			rc = hearth_error_set(&e, HEARTH_ENOMEM, "greedy ids");
			goto out;
		}
		if ((rc = llama_greedy(&api, a.path, &corpus, a.greedy, n_vocab, a.threads, g_ref, &e)) < 0 ||
		    (rc = llama_greedy(&api, q4, &corpus, a.greedy, n_vocab, a.threads, g_q, &e)) < 0)
			goto out;
		for (uint32_t p = 0; p < a.greedy; p++) {
			uint32_t same = 0;
			while (same < GREEDY_GEN && g_q[p * GREEDY_GEN + same] == g_ref[p * GREEDY_GEN + same])
				same++;
			greedy_exact += same == GREEDY_GEN;
			greedy_prefix += (double)same / a.greedy;
		}
	}
	struct fidelity_summary s = fidelity_acc_summary(&acc), chk = { 0 };
	if (a.check && (rc = check_against_reference(a.path, &corpus, ref, n_vocab, &chk, &e)) < 0)
		goto out;
	const char *name = strrchr(a.path, '/') ? strrchr(a.path, '/') + 1 : a.path;
	const char *qname = strrchr(q4, '/') ? strrchr(q4, '/') + 1 : q4;
	uint32_t n_text = a.corpus ? a.n_seqs : a.text ? 1 : 0;
	if (a.json) {
		printf("{\"model\":\"%s\",\"q4_0\":\"%s\",\"q4_0_source\":\"%s\",\"n_vocab\":%u,\"seqs\":%u,"
		       "\"len\":%u,\"text_seqs\":%u,\"seed\":%u,\"positions\":%zu,\"source\":{",
		       name, a.q4 ? qname : "llama_model_quantize", a.q4 ? "given" : a.pure ? "quantized here, pure" : "quantized here",
		       n_vocab, a.n_seqs, a.len, n_text, a.seed, s.positions);
		json_bpw(&src_bpw);
		printf("},\"builds\":[{\"build\":\"%s\",\"types\":\"%s\",", a.label ? a.label : "llama.cpp q4_0",
		       types);
		json_bpw(&q_bpw);
		printf(",\"top1\":%.6f,\"kl_mean\":%.8f,\"kl_p99\":%.8f,\"kl_max\":%.8f",
		       s.top1, s.kl_mean, s.kl_p99, s.kl_max);
		if (a.greedy)
			printf(",\"greedy_prompts\":%u,\"greedy_len\":%d,\"greedy_exact\":%u,\"greedy_prefix\":%.2f",
			       a.greedy, GREEDY_GEN, greedy_exact, greedy_prefix);
		printf("}],");
		if (a.check)
			printf("\"check_vs_hearth_f32\":{\"top1\":%.6f,\"kl_mean\":%.8f,\"kl_max\":%.8f},",
			       chk.top1, chk.kl_mean, chk.kl_max);
		printf("\"ms_reference\":%.0f,\"ms_q4_0\":%.0f,\"ms_quantize\":%.0f}\n", ms_ref, ms_q,
		       ms_quant);
	} else {
		printf("model %s, n_vocab %u; %s: %s (%s)\n", name, n_vocab, a.label ? a.label : "llama.cpp Q4_0",
		       a.q4 ? qname : a.pure ? "llama_model_quantize --pure of the model" :
		       "llama_model_quantize of the model", types);
		printf("corpus: %u sequences x %u positions = %zu positions (%u text, %u random from seed %u)\n",
		       a.n_seqs, a.len, s.positions, n_text, a.n_seqs - n_text, a.seed);
		printf("KL(llama.cpp unquantized || %s) in nats over the full vocabulary\n\n",
		       a.label ? a.label : "llama.cpp Q4_0");
		printf("%-16s %8s %8s  %6s  %9s  %9s  %9s\n", "build", "bpw", "bpw-mat", "top-1", "KL mean",
		       "KL p99", "KL max");
		printf("%-16s %8.3f %8.3f  %6s  %9s  %9s  %9s\n", "source", fidelity_bpw_of(src_bpw.bytes_all,
		       src_bpw.params_all), fidelity_bpw_of(src_bpw.bytes_mat, src_bpw.params_mat), "-", "-",
		       "-", "-");
		printf("%-16s %8.3f %8.3f  %6.4f  %9.6f  %9.6f  %9.6f\n", a.label ? a.label : "llama.cpp Q4_0",
		       fidelity_bpw_of(q_bpw.bytes_all, q_bpw.params_all),
		       fidelity_bpw_of(q_bpw.bytes_mat, q_bpw.params_mat), s.top1, s.kl_mean, s.kl_p99, s.kl_max);
		if (a.greedy)
			printf("greedy: %u of %u prompts reproduce llama.cpp unquantized's %d tokens exactly "
			       "(mean %.1f tokens before the first difference)\n", greedy_exact, a.greedy,
			       GREEDY_GEN, greedy_prefix);
		if (a.check)
			printf("\ncheck: llama.cpp unquantized vs hearth f32 reference: top-1 %.4f, "
			       "KL mean %.6f, max %.6f\n", chk.top1, chk.kl_mean, chk.kl_max);
		printf("\ntime: quantize %.0f ms, unquantized %.0f ms, Q4_0 %.0f ms\n", ms_quant, ms_ref, ms_q);
	}

out:
	if (rc < 0)
		fprintf(stderr, "fidelity_llama: %s\n", e.msg);
	if (tmp[0] && !a.out)
		unlink(tmp);
	free(ref);
	free(q);
	free(g_ref);
	free(g_q);
	fidelity_acc_free(&acc);
	fidelity_corpus_free(&corpus);
	tok_free(tok);
	gguf_close(f);
	return rc < 0 ? 1 : 0;
}
