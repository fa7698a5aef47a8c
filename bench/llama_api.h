/* llama.cpp's C API as the tools that dlopen it see it (bench/fidelity_llama, tests/llama_ref):
 * mirrors of the llama.h structs that cross the ABI, the function table, opening the
 * libraries of a directory and checking that their structs are the mirrored ones. */
#ifndef HEARTH_BENCH_LLAMA_API_H
#define HEARTH_BENCH_LLAMA_API_H

#include <dirent.h>
#include <dlfcn.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "protocol/error.h"

/* Mirrors of the few llama.h structs that cross the ABI, as in the llama.cpp that
 * node-llama-cpp 3.21.1 bundles (tag v0.4.0, llama/gitRelease.bundle, commit 80fb11ac).
 * Two are passed by value, so their sizes must match exactly; llama_check_abi compares the
 * library's defaults with known values and refuses a library that does not fit. */
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
#define LLAMA_FTYPE_MOSTLY_Q4_0 2
#define GGML_TYPE_F16_ID 1
#define LLAMA_FTYPE_MOSTLY_Q8_0 7

struct llama_api {
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
	uint32_t (*n_ctx)(const void *ctx);
	struct llama_batch_abi (*batch_init)(int32_t n_tokens, int32_t embd, int32_t n_seq_max);
	void (*batch_free)(struct llama_batch_abi batch);
	int32_t (*decode)(void *ctx, struct llama_batch_abi batch);
	float *(*get_logits_ith)(void *ctx, int32_t i);
	void *(*get_memory)(const void *ctx);
	void (*memory_clear)(void *mem, bool data);
};

static inline void llama_quiet_log(int level, const char *text, void *ud)
{
	(void)ud;
	if (level == 4) /* GGML_LOG_LEVEL_ERROR */
		fputs(text, stderr);
}

/* The library file in dir: libllama.so, or the versioned name the npm build uses. */
static inline int llama_find(const char *dir, const char *prefix, char *buf, size_t cap)
{
	DIR *d = opendir(dir);
	if (!d)
		return -1;
	struct dirent *de;
	int rc = -1;
	size_t pl = strlen(prefix);
	while ((de = readdir(d))) {
		const char *n = de->d_name;
		size_t l = strlen(n);
		if (!strncmp(n, prefix, pl) && n[pl] == '.' && l > 3 && !strcmp(n + l - 3, ".so")) {
			snprintf(buf, cap, "%s/%s", dir, n);
			rc = 0;
			break;
		}
	}
	closedir(d);
	return rc;
}

#define LLAMA_SYM(lib, field, name)                                                          \
	do {                                                                                 \
		*(void **)&api->field = dlsym(api->lib, name);                               \
		if (!api->field)                                                             \
			return hearth_error_set(err, HEARTH_ENOTFOUND, "libllama: no symbol %s", name); \
	} while (0)

static inline int llama_open(struct llama_api *api, const char *dir, struct hearth_error *err)
{
	char path[4096];
	memset(api, 0, sizeof *api);
	if (llama_find(dir, "libggml", path, sizeof path) < 0)
		return hearth_error_set(err, HEARTH_ENOTFOUND, "%s: no libggml*.so here", dir);
	if (!(api->ggml = dlopen(path, RTLD_NOW | RTLD_GLOBAL)))
		return hearth_error_set(err, HEARTH_EIO, "dlopen: %s", dlerror());
	if (llama_find(dir, "libllama", path, sizeof path) < 0)
		return hearth_error_set(err, HEARTH_ENOTFOUND, "%s: no libllama*.so here", dir);
	if (!(api->llama = dlopen(path, RTLD_NOW | RTLD_GLOBAL)))
		return hearth_error_set(err, HEARTH_EIO, "dlopen: %s", dlerror());
	LLAMA_SYM(ggml, backend_load_all_from_path, "ggml_backend_load_all_from_path");
	LLAMA_SYM(llama, log_set, "llama_log_set");
	LLAMA_SYM(llama, backend_init, "llama_backend_init");
	LLAMA_SYM(llama, model_default_params, "llama_model_default_params");
	LLAMA_SYM(llama, context_default_params, "llama_context_default_params");
	LLAMA_SYM(llama, quantize_default_params, "llama_model_quantize_default_params");
	LLAMA_SYM(llama, model_quantize, "llama_model_quantize");
	LLAMA_SYM(llama, model_load_from_file, "llama_model_load_from_file");
	LLAMA_SYM(llama, model_free, "llama_model_free");
	LLAMA_SYM(llama, init_from_model, "llama_init_from_model");
	LLAMA_SYM(llama, free, "llama_free");
	LLAMA_SYM(llama, model_get_vocab, "llama_model_get_vocab");
	LLAMA_SYM(llama, vocab_n_tokens, "llama_vocab_n_tokens");
	LLAMA_SYM(llama, n_ctx, "llama_n_ctx");
	LLAMA_SYM(llama, batch_init, "llama_batch_init");
	LLAMA_SYM(llama, batch_free, "llama_batch_free");
	LLAMA_SYM(llama, decode, "llama_decode");
	LLAMA_SYM(llama, get_logits_ith, "llama_get_logits_ith");
	LLAMA_SYM(llama, get_memory, "llama_get_memory");
	LLAMA_SYM(llama, memory_clear, "llama_memory_clear");
	api->log_set(llama_quiet_log, NULL);
	api->backend_load_all_from_path(dir);
	api->backend_init();
	return 0;
}

/* The defaults the mirrored llama.cpp sets: a library whose structs differ shows other
 * values here instead of crashing later. */
static inline int llama_check_abi(const struct llama_api *api, struct hearth_error *err)
{
	struct llama_model_params_abi mp = api->model_default_params();
	struct llama_context_params_abi cp = api->context_default_params();
	struct llama_quantize_params_abi qp = api->quantize_default_params();
	if (mp.n_gpu_layers != -1 || !mp.use_extra_bufts || mp.load_mtp ||
	    cp.n_ctx != 512 || cp.n_batch != 2048 || cp.n_ubatch != 512 || cp.n_seq_max != 1 ||
	    cp.n_outputs_max_per_seq != 1 || cp.type_k != GGML_TYPE_F16_ID ||
	    cp.type_v != GGML_TYPE_F16_ID || !cp.offload_kqv || cp.ctx_other ||
	    qp.ftype != LLAMA_FTYPE_MOSTLY_Q8_0 || !qp.quantize_output_tensor || !qp.max_buf_size)
		return hearth_error_set(err, HEARTH_EUNSUPPORTED,
					"libllama's parameter structs do not match this tool's mirror "
					"(written for node-llama-cpp 3.21.1 / llama.cpp v0.4.0)");
	return 0;
}

#endif
