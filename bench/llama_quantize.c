/* Makes the llama.cpp comparison files (Q4_0, Q4_K_M, IQ4_XS) from one BF16/F32 GGUF with llama.cpp's own
 * quantizer, so both engines start from the same weights. libllama is dlopen'ed from the
 * node-llama-cpp package (no llama.cpp headers or CLI here); built only by `make bench`.
 * usage: bench/llama_quantize LIBLLAMA.so IN.gguf OUT.gguf q4_0|q4_k_m|iq4_xs [threads] */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* llama_ftype values (llama.h); stable since the GGUF switch. */
#define LQ_FTYPE_Q4_0 2
#define LQ_FTYPE_Q4_K_M 15
#define LQ_FTYPE_IQ4_XS 30

/* llama_model_quantize_params starts with `int32_t nthread; enum llama_ftype ftype;` in every
 * llama.cpp release; the fields after them change between releases. Only those two are touched
 * here, and the whole struct is taken from llama_model_quantize_default_params into a buffer
 * larger than any release's struct. The struct is returned in memory (SysV: > 16 bytes), so the
 * callee writes its own size into this buffer and the rest stays unused. */
struct lq_params {
	int32_t nthread;
	int32_t ftype;
	unsigned char rest[1016];
};

typedef struct lq_params (*lq_default_fn)(void);
typedef uint32_t (*lq_quantize_fn)(const char *in, const char *out, const struct lq_params *p);
typedef void (*lq_void_fn)(void);

int main(int argc, char **argv)
{
	if (argc < 5 || argc > 6) {
		fprintf(stderr, "usage: %s LIBLLAMA.so IN.gguf OUT.gguf q4_0|q4_k_m|iq4_xs [threads]\n",
			argv[0]);
		return 2;
	}
	int ftype;
	if (!strcmp(argv[4], "q4_0")) {
		ftype = LQ_FTYPE_Q4_0;
	} else if (!strcmp(argv[4], "q4_k_m")) {
		ftype = LQ_FTYPE_Q4_K_M;
	} else if (!strcmp(argv[4], "iq4_xs")) {
		ftype = LQ_FTYPE_IQ4_XS; /* no importance matrix: llama.cpp allows it for IQ4_XS */
	} else {
		fprintf(stderr, "llama_quantize: type '%s' is not q4_0, q4_k_m or iq4_xs\n", argv[4]);
		return 2;
	}
	int threads = argc == 6 ? atoi(argv[5]) : 2;

	void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "llama_quantize: %s\n", dlerror());
		return 1;
	}
	lq_default_fn defaults;
	lq_quantize_fn quantize;
	lq_void_fn backend_init;
	*(void **)&defaults = dlsym(lib, "llama_model_quantize_default_params");
	*(void **)&quantize = dlsym(lib, "llama_model_quantize");
	*(void **)&backend_init = dlsym(lib, "llama_backend_init");
	if (!defaults || !quantize || !backend_init) {
		fprintf(stderr, "llama_quantize: %s lacks llama_model_quantize* / llama_backend_init\n",
			argv[1]);
		dlclose(lib);
		return 1;
	}
	backend_init();
	struct lq_params p = defaults();
	p.nthread = threads > 0 ? threads : 2;
	p.ftype = ftype;
	uint32_t rc = quantize(argv[2], argv[3], &p);
	dlclose(lib);
	if (rc != 0) {
		fprintf(stderr, "llama_quantize: llama_model_quantize(%s -> %s, %s) failed (%u)\n",
			argv[2], argv[3], argv[4], rc);
		return 1;
	}
	return 0;
}
