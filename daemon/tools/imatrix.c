/* `hearthd-tool imatrix`: an importance matrix for a model from calibration text, made by the
 * f32 reference engine the way llama-imatrix makes one, in its GGUF: hearthd's `imatrix` key
 * and llama-quantize --imatrix read the file, and no llama.cpp build is needed. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/tools/tools.h"

#include "daemon/engine/gguf.h"
#include "daemon/engine/imatrix.h"
#include "daemon/engine/model.h"
#include "daemon/engine/ref/forward.h"
#include "daemon/engine/tokenizer.h"
#include "protocol/error.h"

#define IMATRIX_DEFAULT_CHUNK 512
#define IMATRIX_TEXT_MAX (256u << 20)

struct imatrix_opts {
	const char *model, *text, *out;
	long chunk, chunks;          /* tokens per chunk; chunks to run (0: all) */
	bool quiet;
};

static void usage(FILE *to)
{
	fprintf(to,
		"usage: hearthd-tool imatrix --model FILE.gguf --text FILE -o OUT.gguf [options]\n"
		"  -m, --model FILE    the model (F32/F16/BF16 or any type hearth reads)\n"
		"  -f, --text FILE     calibration text (UTF-8), tokenized whole with the model's\n"
		"                      BOS, as llama-imatrix -f does\n"
		"  -o, --output FILE   where the imatrix goes (llama-imatrix's GGUF)\n"
		"  -c, --chunk N       tokens per chunk (default %d): each chunk starts a fresh\n"
		"                      sequence at position 0 with BOS first; the text's tail short\n"
		"                      of a chunk is not used\n"
		"      --chunks N      run only the first N chunks (default: all)\n"
		"  -q, --quiet         no progress on stderr\n"
		"  -h, --help\n"
		"Every layer matrix's input columns are summed squared over every token, as\n"
		"llama-imatrix sums them; the f32 reference engine runs the text (exact, and slow\n"
		"on large models: about the model's size in GFLOP per token).\n",
		IMATRIX_DEFAULT_CHUNK);
}

static int parse_args(int argc, char **argv, struct imatrix_opts *o)
{
	static const struct option longopts[] = {
		{ "model", required_argument, NULL, 'm' },  { "text", required_argument, NULL, 'f' },
		{ "output", required_argument, NULL, 'o' }, { "chunk", required_argument, NULL, 'c' },
		{ "chunks", required_argument, NULL, 'C' }, { "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },         { NULL, 0, NULL, 0 },
	};
	int c;
	memset(o, 0, sizeof *o);
	o->chunk = IMATRIX_DEFAULT_CHUNK;
	while ((c = getopt_long(argc, argv, "m:f:o:c:qh", longopts, NULL)) != -1) {
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
		case 'q': o->quiet = true; break;
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "hearthd-tool imatrix: unexpected argument '%s'\n", argv[optind]);
		return -1;
	}
	if (!o->model || !o->text || !o->out) {
		fprintf(stderr, "hearthd-tool imatrix: needs --model FILE, --text FILE and -o OUT.gguf\n");
		usage(stderr);
		return -1;
	}
	return 0;
}

static void progress(void *arg, size_t done, size_t total)
{
	(void)arg;
	fprintf(stderr, "hearthd-tool imatrix: chunk %zu of %zu\n", done, total);
}

static int make_imatrix(const struct imatrix_opts *o, struct hearth_error *err)
{
	struct gguf_file *f = NULL;
	struct model *m = NULL;
	struct tok *t = NULL;
	struct model_ctx *ctx = NULL;
	struct imatrix_stats *s = NULL;
	char *text = NULL;
	float *logits = NULL;
	size_t len = 0, n_chunks = 0;
	bool probed = false;
	int rc;
	struct model_opts mo = { .max_ctx = (uint32_t)o->chunk, .kv_type = MODEL_KV_F16 };

	if ((rc = gguf_open(&f, o->model, err)) < 0 || (rc = model_load(&m, f, &mo, err)) < 0 ||
	    (rc = tok_load(&t, f, err)) < 0 || (rc = tool_read_file(o->text, IMATRIX_TEXT_MAX, &text, &len, err)) < 0)
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
	/* A path that cannot be written fails now, not after the whole text has run. */
	FILE *probe = fopen(o->out, "wb");
	if (!probe) {
		rc = hearth_error_errno(err, HEARTH_EIO, errno, "cannot write %s", o->out);
		goto out;
	}
	fclose(probe);
	probed = true;
	if ((rc = model_ctx_new(&ctx, m, (uint32_t)o->chunk, err)) < 0 || (rc = imatrix_stats_new(&s, err)) < 0)
		goto out;
	if ((rc = imatrix_stats_text(s, m, ctx, t, text, len, (size_t)o->chunk, (size_t)o->chunks, logits,
				     o->quiet ? NULL : progress, NULL, &n_chunks, err)) < 0) {
		hearth_error_prefix(err, "%s", o->text);
		goto out;
	}
	rc = imatrix_stats_write(s, o->out, o->text, (uint32_t)o->chunk, (uint32_t)n_chunks, err);
	if (rc == 0 && !o->quiet)
		fprintf(stderr, "hearthd-tool imatrix: %zu matrices over %zu tokens written to %s\n",
			imatrix_stats_entries(s), n_chunks * (size_t)o->chunk, o->out);
out:
	if (rc < 0 && probed)
		remove(o->out);
	imatrix_stats_free(s);
	model_ctx_free(ctx);
	free(logits);
	free(text);
	tok_free(t);
	model_free(m);
	gguf_close(f);
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
