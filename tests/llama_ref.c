/* tests/llama_ref: llama.cpp's answers on a model, in the format of the shared fixtures'
 * NAME.ref.txt (fixtures/README.md): two token sequences, per position the mean and rms of
 * all logits and the 16 highest, then 24 greedy tokens. It makes the references hearth keeps
 * for models it writes itself with mkmodel (tests/fixtures/make_refs.sh); --dequant writes the
 * model's weights dequantized to F32 first (llama-quantize --allow-requantize IN OUT F32),
 * for the .deq.ref.txt of a quantized file. libllama is dlopen'ed from node-llama-cpp's
 * prebuilt CPU build (bench/node_modules, `make bench-deps`), as bench/fidelity_llama does.
 * usage: tests/llama_ref --lib DIR [--dequant TMP.gguf] [--seed S] MODEL.gguf > NAME.ref.txt */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REF_TOP 16
#define REF_GREEDY 24
#define REF_THREADS 2
#define REF_CTX 256

#include "bench/llama_api.h"

static int die(const char *fmt, const char *what)
{
	fprintf(stderr, "llama_ref: ");
	fprintf(stderr, fmt, what);
	fputc('\n', stderr);
	return 1;
}

/* libllama of dir, checked against the mirrored structs: 0, or 1 with the reason said. */
static int api_open(struct llama_api *a, const char *dir)
{
	struct hearth_error e;
	if (llama_open(a, dir, &e) < 0 || llama_check_abi(a, &e) < 0)
		return die("%s", e.msg);
	return 0;
}

static uint32_t lcg_next(uint32_t *s)
{
	*s = *s * 1103515245u + 12345u;
	return *s >> 8;
}

static int32_t argmax(const float *x, int32_t n)
{
	int32_t best = 0;
	for (int32_t i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

/* One position's line: mean, rms and the 16 largest logits (highest first). */
static void print_pos(uint32_t pos, const float *l, int32_t n_vocab)
{
	double sum = 0, sq = 0;
	int32_t top[REF_TOP];
	int n_top = 0;

	for (int32_t i = 0; i < n_vocab; i++) {
		sum += l[i];
		sq += (double)l[i] * l[i];
		/* insertion into the sorted top list; ties keep the lower id first */
		int j;
		if (n_top < REF_TOP)
			j = n_top++;
		else if (l[i] > l[top[REF_TOP - 1]])
			j = REF_TOP - 1;
		else
			continue;
		while (j > 0 && l[i] > l[top[j - 1]]) {
			top[j] = top[j - 1];
			j--;
		}
		top[j] = i;
	}
	printf("pos %u mean %f rms %f top16", pos, sum / n_vocab, sqrt(sq / n_vocab));
	for (int k = 0; k < REF_TOP; k++)
		printf(" %d:%f", top[k], l[top[k]]);
	printf("\n");
}

/* Sequence `name` of n ids: the batch at once with every position's logits, then greedy
 * decoding one token at a time. */
static int run_seq(const struct llama_api *a, void *ctx, struct llama_batch_abi *b, const char *name,
		   const int32_t *ids, uint32_t n, int32_t n_vocab)
{
	a->memory_clear(a->get_memory(ctx), true);
	printf("seq %s ids", name);
	for (uint32_t i = 0; i < n; i++) {
		printf("%s%d", i ? "," : " ", ids[i]);
		b->token[i] = ids[i];
		b->pos[i] = (int32_t)i;
		b->n_seq_id[i] = 1;
		b->seq_id[i][0] = 0;
		b->logits[i] = 1;
	}
	printf("\n");
	b->n_tokens = (int32_t)n;
	if (a->decode(ctx, *b) != 0)
		return die("llama_decode failed on sequence %s", name);
	for (uint32_t i = 0; i < n; i++) {
		const float *l = a->get_logits_ith(ctx, (int32_t)i);
		if (!l)
			return die("no logits on sequence %s", name);
		print_pos(i, l, n_vocab);
	}
	int32_t tok = argmax(a->get_logits_ith(ctx, (int32_t)n - 1), n_vocab);
	printf("greedy");
	for (int g = 0; g < REF_GREEDY; g++) {
		printf(" %d", tok);
		if (g == REF_GREEDY - 1)
			break;
		b->n_tokens = 1;
		b->token[0] = tok;
		b->pos[0] = (int32_t)(n + (uint32_t)g);
		b->logits[0] = 1;
		if (a->decode(ctx, *b) != 0)
			return die("llama_decode failed while decoding sequence %s", name);
		tok = argmax(a->get_logits_ith(ctx, 0), n_vocab);
	}
	printf("\n");
	return 0;
}

int main(int argc, char **argv)
{
	const char *lib = getenv("HEARTH_LLAMA_LIB"), *dequant = NULL, *path = NULL;
	uint32_t seed = 7;
	struct llama_api a = { 0 };

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--lib") && i + 1 < argc)
			lib = argv[++i];
		else if (!strcmp(argv[i], "--dequant") && i + 1 < argc)
			dequant = argv[++i];
		else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
			seed = (uint32_t)strtoul(argv[++i], NULL, 10);
		else if (argv[i][0] != '-' && !path)
			path = argv[i];
		else
			return die("usage: llama_ref --lib DIR [--dequant TMP.gguf] [--seed S] MODEL.gguf%s", "");
	}
	if (!lib || !path)
		return die("usage: llama_ref --lib DIR [--dequant TMP.gguf] [--seed S] MODEL.gguf%s", "");
	if (api_open(&a, lib))
		return 1;
	const char *model_path = path;
	if (dequant) {
		struct llama_quantize_params_abi qp = a.quantize_default_params();
		qp.ftype = LLAMA_FTYPE_ALL_F32;
		qp.allow_requantize = true;
		qp.nthread = REF_THREADS;
		if (a.model_quantize(path, dequant, &qp) != 0)
			return die("llama_model_quantize to F32 failed for %s", path);
		model_path = dequant;
	}

	struct llama_model_params_abi mp = a.model_default_params();
	mp.n_gpu_layers = 0;
	void *model = a.model_load_from_file(model_path, mp);
	if (!model)
		return die("llama.cpp cannot load %s", model_path);
	int32_t n_vocab = a.vocab_n_tokens(a.model_get_vocab(model));
	struct llama_context_params_abi cp = a.context_default_params();
	cp.n_ctx = REF_CTX;
	cp.n_batch = REF_CTX;
	cp.n_ubatch = REF_CTX;
	cp.n_threads = REF_THREADS;
	cp.n_threads_batch = REF_THREADS;
	void *ctx = a.init_from_model(model, cp);
	if (!ctx)
		return die("llama.cpp cannot make a context for %s", model_path);

	/* The shared fixtures' lengths: 20 ids, then 48 (longer than a small window). */
	int32_t ids_a[20], ids_b[48];
	for (int i = 0; i < 20; i++)
		ids_a[i] = (int32_t)(1 + lcg_next(&seed) % (uint32_t)(n_vocab - 1));
	for (int i = 0; i < 48; i++)
		ids_b[i] = (int32_t)(1 + lcg_next(&seed) % (uint32_t)(n_vocab - 1));

	const char *base = strrchr(path, '/');
	printf("# llama.cpp reference for %s (%s%d threads, CPU, f16 KV cache, node-llama-cpp 3.21.1). "
	       "Each block: the input ids, then per position the mean and rms of all logits and the "
	       "top 16 (id:logit), then the greedy continuation of 24 tokens.\n",
	       base ? base + 1 : path, dequant ? "weights dequantized to F32, " : "", REF_THREADS);
	struct llama_batch_abi b = a.batch_init(REF_CTX, 0, 1);
	int rc = run_seq(&a, ctx, &b, "A", ids_a, 20, n_vocab);
	if (!rc)
		rc = run_seq(&a, ctx, &b, "B", ids_b, 48, n_vocab);
	a.batch_free(b);
	a.free(ctx);
	a.model_free(model);
	return rc;
}
