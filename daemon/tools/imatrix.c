/* `hearthd-tool imatrix`: an importance matrix for a model from calibration text, made the
 * way llama-imatrix makes one (on the int4 engine, or exactly on the f32 reference) and in
 * its GGUF: hearthd's `imatrix` key and llama-quantize --imatrix read the file. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/tools/tools.h"

#include "daemon/engine/gguf.h"
#include "daemon/engine/imatrix.h"
#include "daemon/engine/load.h"
#include "daemon/engine/model_q4.h"
#include "daemon/engine/model.h"
#include "daemon/engine/ref/forward.h"
#include "daemon/engine/tokenizer.h"
#include "protocol/error.h"

#define IMATRIX_DEFAULT_CHUNK 512
#define IMATRIX_TEXT_MAX ((size_t)256 << 20)

struct imatrix_opts {
	const char *model, *text, *out;
	long chunk, chunks;          /* tokens per chunk; chunks to run (0: all) */
	long threads;                /* int4 engine's compute threads (0: hearthd's default) */
	long self;                   /* sequences sampled from the model instead of text (0: text) */
	unsigned long long seed;     /* the first sampled sequence's seed */
	bool ref;                    /* the f32 reference engine instead of the int4 one */
	bool cov;                    /* --cov: each distinct input's covariance too (GPTQ) */
	long cov_block;              /* --cov-block: its blocks' width */
	bool quiet;
};

static void usage(FILE *to)
{
	fprintf(to,
		"usage: hearthd-tool imatrix --model FILE.gguf (--text FILE | --self N) -o OUT.gguf [options]\n"
		"  -m, --model FILE    the model (F32/F16/BF16 or any type hearth reads)\n"
		"  -f, --text FILE     calibration text (UTF-8), tokenized whole with the model's\n"
		"                      BOS, as llama-imatrix -f does\n"
		"      --self N        no text: N sequences of --chunk tokens sampled from the model\n"
		"                      itself (BOS, temperature 1), collected as they are written\n"
		"                      (int4 engine only; --seed S, default 1)\n"
		"  -o, --output FILE   where the imatrix goes (llama-imatrix's GGUF)\n"
		"  -c, --chunk N       tokens per chunk (default %d): each chunk starts a fresh\n"
		"                      sequence at position 0 with BOS first; the text's tail short\n"
		"                      of a chunk is not used\n"
		"      --chunks N      run only the first N chunks (default: all)\n"
		"      --engine int4|ref  int4 (default): the resident engine as hearthd loads it,\n"
		"                      with float activations, at its prefill speed; ref: the f32\n"
		"                      reference engine, exact and slow (about the model's size in\n"
		"                      GFLOP per token), llama-imatrix's figures on an F32 file\n"
		"      --cov           also each distinct matrix input's covariance (NAME.in_cov,\n"
		"                      hearth's own tensor): hearthd then rounds those matrices by\n"
		"                      GPTQ; llama.cpp's tools do not read such a file\n"
		"      --cov-block N   keep it in diagonal blocks of N columns (default %d; an\n"
		"                      input that narrow or narrower: all of it): N doubles a\n"
		"                      column while collecting, at most 2 GiB in all; implies --cov\n"
		"  -t, --threads N     the int4 engine's threads (default: hearthd's)\n"
		"  -q, --quiet         no progress on stderr\n"
		"  -h, --help\n"
		"Every layer matrix's input columns are summed squared over every token, as\n"
		"llama-imatrix sums them.\n",
		IMATRIX_DEFAULT_CHUNK, (int)IMATRIX_COV_BLOCK_DEFAULT);
}

static int parse_args(int argc, char **argv, struct imatrix_opts *o)
{
	static const struct option longopts[] = {
		{ "model", required_argument, NULL, 'm' },  { "text", required_argument, NULL, 'f' },
		{ "output", required_argument, NULL, 'o' }, { "chunk", required_argument, NULL, 'c' },
		{ "chunks", required_argument, NULL, 'C' }, { "quiet", no_argument, NULL, 'q' },
		{ "engine", required_argument, NULL, 'E' }, { "threads", required_argument, NULL, 't' },
		{ "self", required_argument, NULL, 'S' },   { "seed", required_argument, NULL, 'D' },
		{ "cov", no_argument, NULL, 'V' },          { "cov-block", required_argument, NULL, 'B' },
		{ "help", no_argument, NULL, 'h' },         { NULL, 0, NULL, 0 },
	};
	int c;
	memset(o, 0, sizeof *o);
	o->chunk = IMATRIX_DEFAULT_CHUNK;
	o->cov_block = IMATRIX_COV_BLOCK_DEFAULT;
	o->seed = 1;
	while ((c = getopt_long(argc, argv, "m:f:o:c:t:qh", longopts, NULL)) != -1) {
		switch (c) {
		case 'm': o->model = optarg; break;
		case 'f': o->text = optarg; break;
		case 'o': o->out = optarg; break;
		case 'c':
			/* llama-imatrix leaves out products of fewer than 16 rows. */
			if (tool_parse_long("imatrix", "--chunk", optarg, 16, MODEL_MAX_CTX_LIMIT, &o->chunk) < 0)
				return -1;
			break;
		case 'C':
			if (tool_parse_long("imatrix", "--chunks", optarg, 1, 1L << 30, &o->chunks) < 0)
				return -1;
			break;
		case 'E':
			if (strcmp(optarg, "int4") && strcmp(optarg, "ref")) {
				fprintf(stderr, "hearthd-tool imatrix: --engine '%s' is not int4 or ref\n", optarg);
				return -1;
			}
			o->ref = !strcmp(optarg, "ref");
			break;
		case 't':
			if (tool_parse_long("imatrix", "--threads", optarg, 1, MQ4_THREADS_MAX, &o->threads) < 0)
				return -1;
			break;
		case 'V': o->cov = true; break;
		case 'B':
			if (tool_parse_long("imatrix", "--cov-block", optarg, 8, 65536, &o->cov_block) < 0)
				return -1;
			o->cov = true;
			break;
		case 'S':
			if (tool_parse_long("imatrix", "--self", optarg, 1, 4096, &o->self) < 0)
				return -1;
			break;
		case 'D': {
			long v;
			if (tool_parse_long("imatrix", "--seed", optarg, 0, 0x7fffffffL, &v) < 0)
				return -1;
			o->seed = (unsigned long long)v;
			break;
		}
		case 'q': o->quiet = true; break;
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "hearthd-tool imatrix: unexpected argument '%s'\n", argv[optind]);
		return -1;
	}
	if (!o->model || !(o->text || o->self) || !o->out) {
		fprintf(stderr, "hearthd-tool imatrix: needs --model FILE, --text FILE or --self N, and -o OUT.gguf\n");
		usage(stderr);
		return -1;
	}
	if (o->text && o->self) {
		fprintf(stderr, "hearthd-tool imatrix: --text and --self are two sources: give one\n");
		return -1;
	}
	if (o->self && o->ref) {
		fprintf(stderr, "hearthd-tool imatrix: --self samples on the int4 engine, not --engine ref\n");
		return -1;
	}
	return 0;
}

static void progress(void *arg, size_t done, size_t total)
{
	(void)arg;
	fprintf(stderr, "hearthd-tool imatrix: chunk %zu of %zu\n", done, total);
}

/* Called every step: a line at each tenth (arg: the last tenth told). */
static bool progress_self(void *arg, size_t done, size_t total)
{
	size_t *told = arg, tenth = done * 10 / total;
	if (tenth != *told) {
		*told = tenth;
		fprintf(stderr, "hearthd-tool imatrix: sampled %zu of %zu tokens\n", done, total);
	}
	return true;
}

/* The chunks on the f32 reference engine. */
static int run_ref(const struct imatrix_opts *o, struct imatrix_stats *s, const char *text, size_t len,
		   size_t *n_chunks, struct hearth_error *err)
{
	struct gguf_file *f = NULL;
	struct model *m = NULL;
	struct tok *t = NULL;
	struct model_ctx *ctx = NULL;
	float *logits = NULL;
	struct model_opts mo = { .max_ctx = (uint32_t)o->chunk, .kv_type = MODEL_KV_F16 };
	int rc;
	if ((rc = gguf_open(&f, o->model, err)) < 0 || (rc = model_load(&m, f, &mo, err)) < 0 ||
	    (rc = tok_load(&t, f, err)) < 0 || (rc = model_ctx_new(&ctx, m, (uint32_t)o->chunk, err)) < 0)
		goto out;
	if (tok_n_vocab(t) > (int32_t)m->hp.n_vocab) {
		rc = hearth_error_set(err, HEARTH_EFORMAT, "%s: tokenizer has %d tokens, the model %u", o->model,
				      tok_n_vocab(t), m->hp.n_vocab);
		goto out;
	}
	if (!(logits = malloc((size_t)m->hp.n_vocab * sizeof *logits))) {
		rc = hearth_error_set(err, HEARTH_ENOMEM, "out of memory for the logits");
		goto out;
	}
	struct imatrix_ref_run r = { .s = s, .m = m, .ctx = ctx, .logits = logits };
	rc = imatrix_stats_text(t, text, len, (size_t)o->chunk, (size_t)o->chunks, imatrix_run_ref, &r,
				o->quiet ? NULL : progress, NULL, n_chunks, err);
out:
	free(logits);
	model_ctx_free(ctx);
	tok_free(t);
	model_free(m);
	gguf_close(f);
	return rc;
}

/* The chunks on the resident int4 engine, loaded as hearthd loads it (its defaults, W4A16:
 * float activations, the closest to the reference's), one sequence of a chunk. */
static int run_q4(const struct imatrix_opts *o, struct imatrix_stats *s, const char *text, size_t len,
		  size_t *n_chunks, struct hearth_error *err)
{
	struct load_opts lo;
	struct model_q4 *m = NULL;
	struct tok *t = NULL;
	load_opts_default(&lo);
	imatrix_load_opts(&lo, (size_t)o->chunk, 1);
	if (o->threads)
		lo.n_threads = (size_t)o->threads;
	int rc = load_q4(&m, &t, o->model, &lo, err);
	if (rc < 0)
		return rc;
	struct engine eng;
	model_q4_engine(m, &eng);
	/* This thread steps the pool, as the daemon's compute thread does. */
	if (eng.thread_init)
		eng.thread_init(eng.impl);
	struct imatrix_q4_run r = { .s = s, .m = m, .head = o->cov };
	rc = imatrix_stats_text(t, text, len, (size_t)o->chunk, (size_t)o->chunks, imatrix_run_q4, &r,
				o->quiet ? NULL : progress, NULL, n_chunks, err);
	tok_free(t);
	model_q4_free(m);
	return rc;
}

/* --self: the model's own samples, made as hearthd's `imatrix = self` makes them. */
static int make_self(const struct imatrix_opts *o, size_t *n_entries, struct hearth_error *err)
{
	struct load_opts lo;
	size_t told = 0;
	load_opts_default(&lo);
	if (o->threads)
		lo.n_threads = (size_t)o->threads;
	struct imatrix_self_opts so = {
		.n_seqs = (size_t)o->self,
		.len = (size_t)o->chunk,
		.seed = o->seed,
		.cov_block = o->cov ? (size_t)o->cov_block : 0,
		.progress = o->quiet ? NULL : progress_self,
		.progress_arg = &told,
	};
	return imatrix_self_make(o->model, &lo, &so, o->out, n_entries, err);
}

static int make_imatrix(const struct imatrix_opts *o, struct hearth_error *err)
{
	struct imatrix_stats *s = NULL;
	char *text = NULL;
	size_t len = 0, n_chunks = 0;
	bool probed = false;
	int rc;

	if (o->text && (rc = tool_read_file(o->text, IMATRIX_TEXT_MAX, &text, &len, err)) < 0)
		goto out;
	/* A path that cannot be written fails now, not after the whole text has run. */
	FILE *probe = fopen(o->out, "wb");
	if (!probe) {
		rc = hearth_error_errno(err, HEARTH_EIO, errno, "cannot write %s", o->out);
		goto out;
	}
	fclose(probe);
	probed = true;
	if (o->self) {
		size_t n_entries = 0;
		rc = make_self(o, &n_entries, err);
		if (rc == 0 && !o->quiet)
			fprintf(stderr, "hearthd-tool imatrix: %zu matrices over %zu tokens written to %s\n", n_entries,
				(size_t)o->self * (size_t)(o->chunk - 1), o->out);
		goto out;
	}
	if ((rc = imatrix_stats_new(&s, err)) < 0)
		goto out;
	if (o->cov)
		imatrix_stats_keep_cov(s, (size_t)o->cov_block, imatrix_cov_max());
	rc = o->ref ? run_ref(o, s, text, len, &n_chunks, err) : run_q4(o, s, text, len, &n_chunks, err);
	/* The collector counts tokens but knows no file: the message gets the text's name. */
	if (o->text && rc == HEARTH_EINVAL && strstr(err->msg, "fewer than one chunk"))
		hearth_error_prefix(err, "%s", o->text);
	if (rc < 0)
		goto out;
	rc = imatrix_stats_write(s, o->out, o->text, (uint32_t)o->chunk, (uint32_t)n_chunks, err);
	if (rc == 0 && !o->quiet)
		fprintf(stderr, "hearthd-tool imatrix: %zu matrices over %zu tokens written to %s\n",
			imatrix_stats_entries(s), n_chunks * (size_t)o->chunk, o->out);
out:
	if (rc < 0 && probed)
		remove(o->out);
	imatrix_stats_free(s);
	free(text);
	return rc;
}

int tool_imatrix(int argc, char **argv)
{
	struct imatrix_opts o;
	struct hearth_error err = { 0 };
	if (parse_args(argc, argv, &o) < 0)
		return 2;
	if (make_imatrix(&o, &err) < 0) {
		fprintf(stderr, "hearthd-tool imatrix: %s\n", err.msg);
		return 1;
	}
	return 0;
}
