/* tests/llama_ref: llama.cpp's answers on a model, in the format of the shared fixtures'
 * NAME.ref.txt (fixtures/README.md): two token sequences, per position the mean and rms of
 * all logits and the 16 highest, then 24 greedy tokens. It makes the references hearth keeps
 * for models it writes itself with mkmodel (tests/fixtures/gemma3/make_refs.sh); --dequant writes the
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

/* The few llama.h structs that cross the ABI, as bench/fidelity_llama.c mirrors them for the
 * llama.cpp node-llama-cpp 3.21.1 bundles (v0.4.0); main() checks the library's defaults
 * against known values before trusting them. */
struct llama_model_params_abi {
	void *devices;
	const void *tensor_buft_overrides;
	int32_t n_gpu_layers;
	int split_mode, load_mode, lazy_mode;
	int32_t main_gpu;
	const float *tensor_split;
	void *progress_callback;
	void *progress_callback_user_data;
	const void *kv_overrides;
	bool vocab_only, check_tensors, use_extra_bufts, no_host, no_alloc, load_mtp;
};

struct llama_context_params_abi {
	uint32_t n_ctx, n_batch, n_ubatch, n_seq_max, n_rs_seq, n_outputs_max, n_outputs_max_per_seq;
	int32_t n_threads, n_threads_batch;
	int ctx_type, rope_scaling_type, pooling_type, attention_type, flash_attn_type;
	float rope_freq_base, rope_freq_scale, yarn_ext_factor, yarn_attn_factor, yarn_beta_fast,
		yarn_beta_slow;
	uint32_t yarn_orig_ctx;
	float defrag_thold;
	void *cb_eval, *cb_eval_user_data;
	int type_k, type_v;
	void *abort_callback, *abort_callback_data;
	bool embeddings, offload_kqv, no_perf, op_offload, swa_full, kv_unified;
	void *samplers;
	size_t n_samplers;
	void *ctx_other;
};

struct llama_batch_abi {
	int32_t n_tokens;
	int32_t *token;
	float *embd;
	int32_t *pos;
	int32_t *n_seq_id;
	int32_t **seq_id;
	int8_t *logits;
};

struct llama_quantize_params_abi {
	int32_t nthread;
	int ftype, output_tensor_type, token_embedding_type;
	bool allow_requantize, quantize_output_tensor, only_copy, pure, keep_split, dry_run;
	const void *imatrix, *kv_overrides, *tt_overrides;
	const int32_t *prune_layers;
	size_t max_buf_size;
};

#define LLAMA_FTYPE_ALL_F32 0
#define LLAMA_FTYPE_MOSTLY_Q8_0 7
#define GGML_TYPE_F16_ID 1

struct api {
	void *ggml, *llama;
	void (*backend_load_all_from_path)(const char *dir);
	void (*log_set)(void (*cb)(int level, const char *text, void *ud), void *ud);
	void (*backend_init)(void);
	struct llama_model_params_abi (*model_default_params)(void);
	struct llama_context_params_abi (*context_default_params)(void);
	struct llama_quantize_params_abi (*quantize_default_params)(void);
	uint32_t (*model_quantize)(const char *in, const char *out, const struct llama_quantize_params_abi *p);
	void *(*model_load_from_file)(const char *path, struct llama_model_params_abi p);
	void (*model_free)(void *model);
	void *(*init_from_model)(void *model, struct llama_context_params_abi p);
	void (*free)(void *ctx);
	const void *(*model_get_vocab)(const void *model);
	int32_t (*vocab_n_tokens)(const void *vocab);
	struct llama_batch_abi (*batch_init)(int32_t n_tokens, int32_t embd, int32_t n_seq_max);
	void (*batch_free)(struct llama_batch_abi batch);
	int32_t (*decode)(void *ctx, struct llama_batch_abi batch);
	float *(*get_logits_ith)(void *ctx, int32_t i);
	void *(*get_memory)(const void *ctx);
	void (*memory_clear)(void *mem, bool data);
};

static void quiet_log(int level, const char *text, void *ud)
{
	(void)ud;
	if (level == 4) /* GGML_LOG_LEVEL_ERROR */
		fputs(text, stderr);
}

static int die(const char *fmt, const char *what)
{
	fprintf(stderr, "llama_ref: ");
	fprintf(stderr, fmt, what);
	fputc('\n', stderr);
	return 1;
}

/* dir/PREFIX*.so: the npm build names its libraries libllama.v0.4.0.so and the like. */
static int lib_find(const char *dir, const char *prefix, char *buf, size_t cap)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	size_t pl = strlen(prefix);
	int rc = -1;

	if (!d)
		return -1;
	while ((de = readdir(d))) {
		size_t l = strlen(de->d_name);
		if (!strncmp(de->d_name, prefix, pl) && de->d_name[pl] == '.' && l > 3 &&
		    !strcmp(de->d_name + l - 3, ".so")) {
			snprintf(buf, cap, "%s/%s", dir, de->d_name);
			rc = 0;
			break;
		}
	}
	closedir(d);
	return rc;
}

#define SYM(lib, field, name)                                              \
	do {                                                               \
		*(void **)&a->field = dlsym(a->lib, name);                 \
		if (!a->field)                                             \
			return die("libllama has no symbol %s", name);     \
	} while (0)

static int api_open(struct api *a, const char *dir)
{
	char path[4096];

	if (lib_find(dir, "libggml", path, sizeof path) < 0 ||
	    !(a->ggml = dlopen(path, RTLD_NOW | RTLD_GLOBAL)))
		return die("no loadable libggml*.so in %s", dir);
	if (lib_find(dir, "libllama", path, sizeof path) < 0 ||
	    !(a->llama = dlopen(path, RTLD_NOW | RTLD_GLOBAL)))
		return die("no loadable libllama*.so in %s", dir);
	SYM(ggml, backend_load_all_from_path, "ggml_backend_load_all_from_path");
	SYM(llama, log_set, "llama_log_set");
	SYM(llama, backend_init, "llama_backend_init");
	SYM(llama, model_default_params, "llama_model_default_params");
	SYM(llama, context_default_params, "llama_context_default_params");
	SYM(llama, quantize_default_params, "llama_model_quantize_default_params");
	SYM(llama, model_quantize, "llama_model_quantize");
	SYM(llama, model_load_from_file, "llama_model_load_from_file");
	SYM(llama, model_free, "llama_model_free");
	SYM(llama, init_from_model, "llama_init_from_model");
	SYM(llama, free, "llama_free");
	SYM(llama, model_get_vocab, "llama_model_get_vocab");
	SYM(llama, vocab_n_tokens, "llama_vocab_n_tokens");
	SYM(llama, batch_init, "llama_batch_init");
	SYM(llama, batch_free, "llama_batch_free");
	SYM(llama, decode, "llama_decode");
	SYM(llama, get_logits_ith, "llama_get_logits_ith");
	SYM(llama, get_memory, "llama_get_memory");
	SYM(llama, memory_clear, "llama_memory_clear");
	a->log_set(quiet_log, NULL);
	a->backend_load_all_from_path(dir);
	a->backend_init();

	struct llama_model_params_abi mp = a->model_default_params();
	struct llama_context_params_abi cp = a->context_default_params();
	struct llama_quantize_params_abi qp = a->quantize_default_params();
	if (mp.n_gpu_layers != -1 || !mp.use_extra_bufts || cp.n_ctx != 512 || cp.n_batch != 2048 ||
	    cp.n_ubatch != 512 || cp.n_seq_max != 1 || cp.type_k != GGML_TYPE_F16_ID ||
	    cp.type_v != GGML_TYPE_F16_ID || qp.ftype != LLAMA_FTYPE_MOSTLY_Q8_0 || !qp.max_buf_size)
		return die("%s: the parameter structs do not match this tool's mirror "
			   "(node-llama-cpp 3.21.1)", path);
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
static int run_seq(const struct api *a, void *ctx, struct llama_batch_abi *b, const char *name,
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
	struct api a = { 0 };

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
