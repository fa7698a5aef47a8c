/* `hearthd-tool run`: in-process generation with the f32 reference engine,
 * `hearthd-tool run --model M --prompt TEXT [-n N]`, which prints the continuation as it is
 * sampled. The oracle's own front door, with no daemon in between. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/tools/tools.h"

#include "daemon/engine/gguf.h"
#include "daemon/engine/model.h"
#include "daemon/engine/ref/forward.h"
#include "daemon/engine/sampler.h"
#include "daemon/engine/tokenizer.h"
#include "protocol/error.h"
#include "protocol/clock.h"
#include "protocol/sampling.h"

#define DEFAULT_MAX_CONTEXT 2048
#define DEFAULT_N_PREDICT 128

struct run_opts {
	const char *model;
	const char *prompt;
	long n_predict;
	uint32_t max_context;        /* 0: DEFAULT_MAX_CONTEXT, capped by the model's own */
	enum model_kv_type kv_type;
	bool verbose;
	struct sampler_params sp;
};

static void usage(FILE *to)
{
	fprintf(to,
		"usage: hearthd-tool run --model FILE.gguf --prompt TEXT [options]\n"
		"  -m, --model FILE         GGUF model (llama, qwen2, qwen3, gemma3)\n"
		"  -p, --prompt TEXT        text to continue; the continuation goes to stdout\n"
		"  -n, --n-predict N        tokens to generate (default %d; stops early at end of text)\n"
		"      --max-context N      positions the KV cache holds (default %d, or the\n"
		"                           model's trained context when that is smaller)\n"
		"      --temp T             temperature; 0 = greedy (default 0.8)\n"
		"      --top-k K            0 = off (default 40)\n"
		"      --top-p P            1 = off (default 0.95)\n"
		"      --min-p P            0 = off (default 0.05)\n"
		"      --repeat-penalty R   1 = off (default 1.0)\n"
		"      --repeat-last-n N    tokens the penalty looks back (default 64)\n"
		"      --seed S             sampling seed (default 0)\n"
		"      --kv f32|f16         attention arithmetic: exact, or as llama.cpp's f16 cache\n"
		"  -v, --verbose            timings on stderr\n"
		"  -h, --help\n",
		DEFAULT_N_PREDICT, DEFAULT_MAX_CONTEXT);
}

enum {
	OPT_MAX_CONTEXT = 256, OPT_TEMP, OPT_TOP_K, OPT_TOP_P, OPT_MIN_P, OPT_REPEAT_PENALTY,
	OPT_REPEAT_LAST_N, OPT_SEED, OPT_KV,
};

/* The sampling options, read and bounded by protocol/sampling.h as the daemon bounds a
 * request, so a setting that runs here is one hearthd accepts. */
static int run_sampling_option(struct sampler_params *sp, int opt, const char *text)
{
	static const struct { int opt; enum msg_sampling_param param; } map[] = {
		{ OPT_TEMP, MSG_SAMPLING_TEMPERATURE },
		{ OPT_TOP_K, MSG_SAMPLING_TOP_K },
		{ OPT_TOP_P, MSG_SAMPLING_TOP_P },
		{ OPT_MIN_P, MSG_SAMPLING_MIN_P },
		{ OPT_REPEAT_PENALTY, MSG_SAMPLING_REPEAT_PENALTY },
		{ OPT_REPEAT_LAST_N, MSG_SAMPLING_REPEAT_LAST_N },
	};
	for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
		if (map[i].opt != opt)
			continue;
		char why[160];
		double x;
		if (!msg_sampling_parse(map[i].param, text, &x, why, sizeof why)) {
			fprintf(stderr, "hearthd-tool run: %s\n", why);
			return -1;
		}
		switch (map[i].param) {
		case MSG_SAMPLING_TEMPERATURE: sp->temperature = (float)x; break;
		case MSG_SAMPLING_TOP_K: sp->top_k = (int32_t)x; break;
		case MSG_SAMPLING_TOP_P: sp->top_p = (float)x; break;
		case MSG_SAMPLING_MIN_P: sp->min_p = (float)x; break;
		case MSG_SAMPLING_REPEAT_PENALTY: sp->repeat_penalty = (float)x; break;
		case MSG_SAMPLING_REPEAT_LAST_N: sp->repeat_last_n = (uint32_t)x; break;
		case MSG_SAMPLING_N: break;
		}
		return 0;
	}
	return -1;
}

static int parse_args(int argc, char **argv, struct run_opts *o)
{
	static const struct option longopts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "prompt", required_argument, NULL, 'p' },
		{ "n-predict", required_argument, NULL, 'n' },
		{ "max-context", required_argument, NULL, OPT_MAX_CONTEXT },
		{ "temp", required_argument, NULL, OPT_TEMP },
		{ "top-k", required_argument, NULL, OPT_TOP_K },
		{ "top-p", required_argument, NULL, OPT_TOP_P },
		{ "min-p", required_argument, NULL, OPT_MIN_P },
		{ "repeat-penalty", required_argument, NULL, OPT_REPEAT_PENALTY },
		{ "repeat-last-n", required_argument, NULL, OPT_REPEAT_LAST_N },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "kv", required_argument, NULL, OPT_KV },
		{ "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	long v;
	int c;

	memset(o, 0, sizeof(*o));
	o->n_predict = DEFAULT_N_PREDICT;
	o->kv_type = MODEL_KV_F32;
	sampler_params_default(&o->sp);

	while ((c = getopt_long(argc, argv, "m:p:n:vh", longopts, NULL)) != -1) {
		switch (c) {
		case 'm': o->model = optarg; break;
		case 'p': o->prompt = optarg; break;
		case 'n':
			if (tool_parse_long("run", "-n", optarg, 0, MODEL_MAX_CTX_LIMIT, &o->n_predict) < 0)
				return -1;
			break;
		case OPT_MAX_CONTEXT:
			if (tool_parse_long("run", "--max-context", optarg, 1, MODEL_MAX_CTX_LIMIT, &v) < 0)
				return -1;
			o->max_context = (uint32_t)v;
			break;
		case OPT_TEMP:
		case OPT_TOP_K:
		case OPT_TOP_P:
		case OPT_MIN_P:
		case OPT_REPEAT_PENALTY:
		case OPT_REPEAT_LAST_N:
			if (run_sampling_option(&o->sp, c, optarg) < 0)
				return -1;
			break;
		case OPT_SEED: {
			char *end;
			errno = 0;
			unsigned long long s = strtoull(optarg, &end, 10);
			if (errno || end == optarg || *end || optarg[0] == '-') {
				fprintf(stderr, "hearthd-tool run: --seed '%s' is not a non-negative integer\n", optarg);
				return -1;
			}
			o->sp.seed = (uint64_t)s;
			break;
		}
		case OPT_KV:
			if (strcmp(optarg, "f32") == 0) {
				o->kv_type = MODEL_KV_F32;
			} else if (strcmp(optarg, "f16") == 0) {
				o->kv_type = MODEL_KV_F16;
			} else {
				fprintf(stderr, "hearthd-tool run: --kv '%s' is not f32 or f16\n", optarg);
				return -1;
			}
			break;
		case 'v': o->verbose = true; break;
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "hearthd-tool run: unexpected argument '%s'\n", argv[optind]);
		return -1;
	}
	if (!o->model || !o->prompt) {
		fprintf(stderr, "hearthd-tool run: needs --model FILE and --prompt TEXT\n");
		usage(stderr);
		return -1;
	}
	return 0;
}

/* Writes a streamed piece to stdout, growing buf when the stream asks for more room. */
static int emit(const struct tok *t, struct tok_stream *ts, int32_t id, char **buf, size_t *cap)
{
	size_t n = tok_stream_push(t, ts, id, false, *buf, *cap);

	if (n > *cap) {
		char *bigger = realloc(*buf, n);
		if (!bigger)
			return -1;
		*buf = bigger;
		*cap = n;
		n = tok_stream_push(t, ts, id, false, *buf, *cap);
	}
	if (n && fwrite(*buf, 1, n, stdout) != n)
		return -1;
	fflush(stdout);
	return 0;
}

static int run_prompt(const struct run_opts *o)
{
	struct hearth_error err = { 0 };
	struct gguf_file *f = NULL;
	struct model *m = NULL;
	struct model_ctx *c = NULL;
	struct tok *t = NULL;
	struct sampler *s = NULL;
	struct tok_stream ts;
	int32_t *prompt = NULL;
	size_t n_prompt = 0, out_cap = 0;
	float *logits = NULL;
	char *out = NULL;
	uint32_t max_ctx;
	long n_gen = 0;
	double t0, t1, t2;
	int rc;

	t0 = ((double)hearth_now_ns() * 1e-9);
	if ((rc = gguf_open(&f, o->model, &err)) < 0)
		goto fail;

	/* Size the cache by what was asked, never by what the file advertises; only refuse to
	 * go past the trained context when no size was asked for. */
	{
		uint32_t n_ctx_train = 0;
		char key[128];
		struct gguf_str arch;
		max_ctx = o->max_context ? o->max_context : DEFAULT_MAX_CONTEXT;
		if (!o->max_context && gguf_get_str(f, "general.architecture", &arch, NULL) == 0) {
			snprintf(key, sizeof(key), "%.*s.context_length", (int)(arch.len > 64 ? 64 : arch.len),
				 arch.ptr);
			if (gguf_kv_find(f, key) && gguf_get_u32(f, key, &n_ctx_train, NULL) == 0 &&
			    n_ctx_train > 0 && n_ctx_train < max_ctx)
				max_ctx = n_ctx_train;
		}
	}
	{
		struct model_opts mo = { .max_ctx = max_ctx, .kv_type = o->kv_type };
		if ((rc = model_load(&m, f, &mo, &err)) < 0)
			goto fail;
	}
	if ((rc = tok_load(&t, f, &err)) < 0)
		goto fail;
	/* A tokenizer id the model has no row for would be refused mid-prompt; say so now. */
	if (tok_n_vocab(t) > (int32_t)m->hp.n_vocab) {
		rc = hearth_error_set(&err, HEARTH_EFORMAT, "%s: tokenizer has %d tokens, the model %u",
				      o->model, tok_n_vocab(t), m->hp.n_vocab);
		goto fail;
	}
	if ((rc = tok_encode_alloc(t, o->prompt, strlen(o->prompt), tok_add_bos(t), true, &prompt, &n_prompt,
				   &err)) < 0)
		goto fail;
	if (n_prompt == 0) {
		rc = hearth_error_set(&err, HEARTH_EINVAL, "the prompt is empty and the model adds no BOS");
		goto fail;
	}
	if (n_prompt + (size_t)o->n_predict > max_ctx) {
		rc = hearth_error_set(&err, HEARTH_ERANGE,
				      "prompt of %zu tokens + %ld to generate exceed the context of %u "
				      "(--max-context)", n_prompt, o->n_predict, max_ctx);
		goto fail;
	}
	if ((rc = model_ctx_new(&c, m, max_ctx, &err)) < 0 ||
	    (rc = sampler_new(&s, &o->sp, m->hp.n_vocab, &err)) < 0)
		goto fail;
	logits = malloc(m->hp.n_vocab * sizeof(*logits));
	out_cap = tok_stream_bound(t);
	out = malloc(out_cap ? out_cap : 1);
	if (!logits || !out) {
		rc = hearth_error_set(&err, HEARTH_ENOMEM, "out of memory");
		goto fail;
	}

	t1 = ((double)hearth_now_ns() * 1e-9);
	for (size_t i = 0; i < n_prompt; i++)
		sampler_accept(s, prompt[i]);
	if ((rc = model_forward(m, c, prompt, n_prompt, MODEL_LOGITS_LAST, logits, &err)) < 0)
		goto fail;
	t2 = ((double)hearth_now_ns() * 1e-9);

	tok_stream_init(&ts);
	for (n_gen = 0; n_gen < o->n_predict; n_gen++) {
		int32_t id = sampler_sample(s, logits);

		if (tok_is_eog(t, id))
			break;
		sampler_accept(s, id);
		if (emit(t, &ts, id, &out, &out_cap) < 0) {
			rc = hearth_error_errno(&err, HEARTH_EIO, errno, "writing to stdout");
			goto fail;
		}
		if (n_gen + 1 < o->n_predict &&
		    (rc = model_forward(m, c, &id, 1, MODEL_LOGITS_LAST, logits, &err)) < 0)
			goto fail;
	}
	{
		size_t n = tok_stream_flush(&ts, out, out_cap);
		if (n <= out_cap && n)
			fwrite(out, 1, n, stdout);
		fputc('\n', stdout);
		fflush(stdout);
	}
	if (o->verbose) {
		double t3 = ((double)hearth_now_ns() * 1e-9);
		fprintf(stderr, "hearthd-tool run: load %.2f s; prompt %zu tokens in %.2f s (%.1f tok/s); "
			"generated %ld tokens in %.2f s (%.2f tok/s)\n", t1 - t0, n_prompt, t2 - t1,
			(double)n_prompt / (t2 - t1), n_gen, t3 - t2,
			n_gen ? (double)n_gen / (t3 - t2) : 0.0);
	}
	rc = 0;
	goto done;
fail:
	fflush(stdout);
	fprintf(stderr, "hearthd-tool run: %s\n", err.msg[0] ? err.msg : hearth_strerror(rc));
done:
	free(out);
	free(logits);
	free(prompt);
	sampler_free(s);
	model_ctx_free(c);
	tok_free(t);
	model_free(m);
	gguf_close(f);
	return rc < 0 ? 1 : 0;
}

/* --prompt selects the in-process mode; anything else is the service. */

int tool_run(int argc, char **argv)
{
	struct run_opts o;

	if (parse_args(argc, argv, &o) < 0)
		return 1;
	return run_prompt(&o);
}
