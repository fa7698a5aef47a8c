/* `hearth embed`: the pooled, unit-length vector of each TEXT argument or stdin line, as
 * JSON (numbers printed to round-trip a float exactly) or as raw float32 rows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/cli.h"

enum { OPT_POOLING = 2000, OPT_RAW };

/* Splits text into its non-empty lines (in place: newlines become NULs). */
static size_t split_lines(char *text, size_t len, struct hearth_embed_input **out)
{
	size_t n = 0, cap = 0;
	struct hearth_embed_input *v = NULL;
	for (size_t at = 0; at < len;) {
		char *nl = memchr(text + at, '\n', len - at);
		size_t end = nl ? (size_t)(nl - text) : len, l = end - at;
		if (l && text[at + l - 1] == '\r')
			l--;
		if (l) {
			if (n == cap) {
				cap = cap ? 2 * cap : 64;
				struct hearth_embed_input *w = realloc(v, cap * sizeof *w);
				if (!w) {
					free(v);
					return (size_t)-1;
				}
				v = w;
			}
			v[n++] = (struct hearth_embed_input){ .text = text + at, .len = l };
		}
		at = end + 1;
	}
	*out = v;
	return n;
}

int cmd_embed(struct cli *c, int argc, char **argv)
{
	static const struct option opts[] = {
		COMMON_OPTIONS,
		{ "pooling", required_argument, NULL, OPT_POOLING },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "raw", no_argument, NULL, OPT_RAW },
		{ 0 },
	};
	enum hearth_pooling pooling = HEARTH_POOLING_MODEL;
	bool raw = false;
	int opt, rc;
	while ((opt = getopt_long(argc, argv, "+vhV", opts, NULL)) != -1) {
		if (common_option(c, opt, optarg, &rc)) {
			if (rc)
				return rc < 0 ? 0 : rc;
			continue;
		}
		if (opt == OPT_POOLING) {
			if (!strcmp(optarg, "mean"))
				pooling = HEARTH_POOLING_MEAN;
			else if (!strcmp(optarg, "cls"))
				pooling = HEARTH_POOLING_CLS;
			else if (!strcmp(optarg, "last"))
				pooling = HEARTH_POOLING_LAST;
			else
				return usage_error("--pooling wants mean, cls or last, not \"%s\"", optarg);
		} else if (opt == OPT_RAW) {
			raw = true;
		} else if (opt == OPT_JSON) {
			c->json = true;
		} else {
			return usage_error("unknown option for embed");
		}
	}
	if (raw && c->json)
		return usage_error("--raw and --json exclude each other");
	struct hearth_err e = { 0 };
	struct hearth_embed_input *in = NULL;
	size_t n = 0;
	char *owned = NULL;
	if (optind == argc || (argc - optind == 1 && !strcmp(argv[optind], "-"))) {
		size_t len;
		if (!(owned = read_stdin(&len, &e)))
			return fail(&e);
		n = split_lines(owned, len, &in);
		if (n == (size_t)-1) {
			free(owned);
			fputs("hearth: out of memory\n", stderr);
			return 1;
		}
		if (n == 0) {
			free(owned);
			return usage_error("embed read no input: give TEXT arguments or non-empty lines on stdin");
		}
	} else {
		n = (size_t)(argc - optind);
		in = calloc(n, sizeof *in);
		if (!in) {
			fputs("hearth: out of memory\n", stderr);
			return 1;
		}
		for (size_t i = 0; i < n; i++) {
			in[i] = (struct hearth_embed_input){ .text = argv[optind + i], .len = strlen(argv[optind + i]) };
			if (!in[i].len) {
				free(in);
				return usage_error("embed: argument %zu is empty", i + 1);
			}
		}
	}
	struct hearth *h;
	struct hearth_embeddings out;
	rc = cli_connect(c, true, &h, &e);
	if (rc == 0) {
		rc = hearth_embed(h, in, n, pooling, &out, &e);
		hearth_close(h);
	}
	free(in);
	free(owned);
	if (rc < 0)
		return fail(&e);
	if (raw) {
		fwrite(out.data, sizeof(float), out.n * out.n_embd, stdout);
	} else {
		/* Shaped like one OpenAI embeddings response, so tools that read those read this. */
		printf("{\"object\":\"list\",\"pooling\":\"%s\",\"n_embd\":%u,\"data\":[", out.pooling, out.n_embd);
		for (size_t i = 0; i < out.n; i++) {
			printf("%s{\"object\":\"embedding\",\"index\":%zu,\"n_tokens\":%u,\"embedding\":[", i ? "," : "", i,
			       out.n_tokens[i]);
			for (uint32_t j = 0; j < out.n_embd; j++)
				printf(j ? ",%.9g" : "%.9g", (double)out.data[i * out.n_embd + j]);
			fputs("]}", stdout);
		}
		printf("],\"usage\":{\"prompt_tokens\":%llu,\"total_tokens\":%llu}}\n",
		       (unsigned long long)out.total_tokens, (unsigned long long)out.total_tokens);
	}
	hearth_embeddings_free(&out);
	return fflush(stdout) == 0 ? 0 : 1;
}
