/* The `hearth` command: talks to hearthd through libhearth's public API only (this file
 * includes nothing but hearth.h and the bench's own header), so it doubles as the
 * library's first real user.
 * Exit codes: 0 ok, 1 an error (its message on stderr), 2 a usage error. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/bench.h"
#include "client/cli.h"
#include "client/prom.h"
#include "client/hearth.h"
#include "protocol/sampling.h"

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif


volatile sig_atomic_t interrupted;

void on_sigint(int sig)
{
	(void)sig;
	interrupted = 1;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: hearth [--socket PATH] [--timeout SECONDS] [-v] COMMAND [ARGS]\n"
		"       hearth --help | --version\n"
		"\n"
		"  generate [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]\n"
		"           [--repeat-penalty R] [--repeat-last-n N] [--seed S] [--stop STR]...\n"
		"           [--grammar FILE|--json-schema FILE|--json-object] [--no-jump-forward]\n"
		"           [--speculate K] [--draft auto|lookup|model]\n"
		"           [--json] PROMPT|-      stream the continuation of PROMPT (- reads stdin)\n"
		"  chat [--system S] [--messages FILE] [--tools FILE] [--tool-choice C] [--var KEY=JSON]...\n"
		"       [--no-think]\n"
		"       [--grammar FILE] [--json-schema FILE] [sampling options of generate] [--json]\n"
		"       [MESSAGE|-]                 talk with the model in its own chat template:\n"
		"                                   one turn, or an interactive session on a terminal\n"
		"  tokenize [--no-bos] [--special] [--json] TEXT|-\n"
		"                                   print the token ids of TEXT\n"
		"  detokenize [--json] ID...|-      print the text of token ids\n"
		"  embed [--pooling mean|cls|last] [--json|--raw] [TEXT...|-]\n"
		"                                   the unit-length embedding of each TEXT (or stdin\n"
		"                                   line) as JSON, or --raw float32 rows\n"
		"  stats [--json|--prometheus]      the daemon's load and memory (--prometheus: the text\n"
		"                                   format node_exporter's textfile collector reads)\n"
		"  ledger [--json]                  where the daemon's memory went\n"
		"  ping [-c N]                      round trip to the daemon, in microseconds\n"
		"  bench [--clients LIST] [--prompt-tokens N] [--tokens N] [--seed S] [--json]\n"
		"        [--spin-us N]\n"
		"                                   N concurrent client processes (LIST default\n"
		"                                   1,2,4,8,16; 128 + 128 tokens): tokens/s, time\n"
		"                                   to first token, IPC latency per token\n"
		"\n"
		"The socket is --socket, else $%s, else %s.\n"
		"--timeout gives up when hearthd is silent that long (default %d s; 0 = never).\n"
		"-v prints loading progress and, for generate, a timing summary on stderr.\n"
		"Exit status: 0 ok, 1 an error, 2 a usage error.\n",
		HEARTH_SOCKET_ENV, HEARTH_SOCKET_DEFAULT, HEARTH_TIMEOUT_DEFAULT_MS / 1000);
}

int fail(const struct hearth_err *e)
{
	fprintf(stderr, "hearth: %s\n", e->msg[0] ? e->msg : hearth_strerror(e->code));
	return 1;
}

int usage_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("hearth: ", stderr);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\n(hearth --help for usage)\n", stderr);
	return EXIT_USAGE;
}

/* ---- parsing numbers strictly ---- */

bool parse_u64(const char *s, uint64_t max, uint64_t *out)
{
	char *end;
	if (!s || !*s || *s == '-')
		return false;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end || v > max)
		return false;
	*out = v;
	return true;
}

bool parse_double(const char *s, double *out)
{
	char *end;
	if (!s || !*s)
		return false;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || *end)
		return false;
	*out = v;
	return true;
}

/* ---- output helpers ---- */

static void human_bytes(char *buf, size_t cap, uint64_t b)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double v = (double)b;
	int u = 0;
	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, cap, "%" PRIu64 " B", b);
	else
		snprintf(buf, cap, "%.2f %s", v, unit[u]);
}

static void human_duration(char *buf, size_t cap, uint64_t ms)
{
	uint64_t s = ms / 1000;
	if (s >= 86400)
		snprintf(buf, cap, "%" PRIu64 "d %02" PRIu64 "h %02" PRIu64 "m", s / 86400,
			 s / 3600 % 24, s / 60 % 60);
	else if (s >= 3600)
		snprintf(buf, cap, "%" PRIu64 "h %02" PRIu64 "m %02" PRIu64 "s", s / 3600,
			 s / 60 % 60, s % 60);
	else if (s >= 60)
		snprintf(buf, cap, "%" PRIu64 "m %02" PRIu64 "s", s / 60, s % 60);
	else
		snprintf(buf, cap, "%.1fs", (double)ms / 1000);
}

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if none starts there. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
	unsigned char c = s[0];
	size_t k;
	uint32_t cp, min;
	if (c < 0x80)
		return 1;
	if ((c & 0xe0) == 0xc0) { k = 1; cp = c & 0x1f; min = 0x80; }
	else if ((c & 0xf0) == 0xe0) { k = 2; cp = c & 0x0f; min = 0x800; }
	else if ((c & 0xf8) == 0xf0) { k = 3; cp = c & 0x07; min = 0x10000; }
	else return 0;
	if (n <= k)
		return 0;
	for (size_t j = 1; j <= k; j++) {
		if ((s[j] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[j] & 0x3f);
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return k + 1;
}

/* A JSON string of raw bytes; bytes that are not UTF-8 become U+FFFD. */
void cli_json_string(FILE *f, const char *text, size_t len)
{
	const unsigned char *s = (const unsigned char *)text;
	fputc('"', f);
	for (size_t i = 0; i < len;) {
		size_t k = utf8_seq(s + i, len - i);
		if (k == 0) {
			fputs("\\ufffd", f);
			i++;
			continue;
		}
		unsigned char c = s[i];
		if (k > 1)
			fwrite(s + i, 1, k, f);
		else if (c == '"')
			fputs("\\\"", f);
		else if (c == '\\')
			fputs("\\\\", f);
		else if (c == '\n')
			fputs("\\n", f);
		else if (c == '\t')
			fputs("\\t", f);
		else if (c == '\r')
			fputs("\\r", f);
		else if (c < 0x20 || c == 0x7f)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
		i += k;
	}
	fputc('"', f);
}

char *read_stdin(size_t *len, struct hearth_err *e)
{
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap + 1);
	if (!buf) {
		e->code = HEARTH_ENOMEM;
		snprintf(e->msg, sizeof e->msg, "out of memory reading stdin");
		return NULL;
	}
	for (;;) {
		if (n == cap) {
			char *nb = cap > SIZE_MAX / 4 ? NULL : realloc(buf, cap * 2 + 1);
			if (!nb) {
				free(buf);
				e->code = HEARTH_ENOMEM;
				snprintf(e->msg, sizeof e->msg, "out of memory reading stdin");
				return NULL;
			}
			buf = nb;
			cap *= 2;
		}
		size_t got = fread(buf + n, 1, cap - n, stdin);
		n += got;
		if (got == 0) {
			if (ferror(stdin)) {
				free(buf);
				e->code = HEARTH_EIO;
				snprintf(e->msg, sizeof e->msg, "reading stdin: %s", strerror(errno));
				return NULL;
			}
			break;
		}
	}
	buf[n] = '\0';
	*len = n;
	return buf;
}

/* ---- connecting ---- */

static void on_loading(void *user, const char *phase, uint64_t done, uint64_t total)
{
	const struct cli *c = user;
	if (!c->verbose)
		return;
	if (total)
		fprintf(stderr, "hearth: hearthd is loading its model: %s %" PRIu64 "/%" PRIu64
			" (%.0f%%)\n", phase, done, total, 100.0 * (double)done / (double)total);
	else
		fprintf(stderr, "hearth: hearthd is loading its model: %s\n", phase);
}

int cli_connect(struct cli *c, bool hello, struct hearth **h, struct hearth_err *e)
{
	struct hearth_connect_opts o = {
		.socket_path = c->socket,
		.client_name = "hearth-cli",
		.timeout_ms = c->timeout_ms,
		.no_hello = !hello,
		.on_loading = on_loading,
		.user = c,
	};
	return hearth_connect_with(h, &o, e);
}

/* ---- options shared by every command ---- */



/* Handles an option every command takes; 1 if it was one, 0 if not, EXIT_USAGE+? if bad. */
int common_option(struct cli *c, int opt, const char *arg, int *rc)
{
	*rc = 0;
	switch (opt) {
	case OPT_SOCKET:
		c->socket = arg;
		return 1;
	case OPT_TIMEOUT: {
		double s;
		if (!parse_double(arg, &s) || s < 0 || s > 86400 * 7) {
			*rc = usage_error("--timeout wants seconds (0 = wait forever), not \"%s\"", arg);
			return 1;
		}
		c->timeout_ms = s == 0 ? -1 : (int)(s * 1000 + 0.5);
		if (c->timeout_ms == 0)
			c->timeout_ms = 1;
		return 1;
	}
	case 'v':
		c->verbose++;
		return 1;
	case 'h':
		usage(stdout);
		*rc = -1;
		return 1;
	case 'V':
		printf("hearth %s\n", PACKAGE_VERSION);
		*rc = -1;
		return 1;
	case '?':
		*rc = usage_error("unknown option or missing argument");
		return 1;
	}
	return 0;
}

/* ---- generate ---- */

struct gen_out {
	bool json;
	char *text;               /* the whole generation, for the final JSON line */
	size_t len;
	size_t cap;
};

static int gen_print(struct gen_out *o, const struct hearth_token *t)
{
	if (o->json) {
		if (o->len + t->text_len + 1 > o->cap) {
			size_t cap = (o->cap ? o->cap * 2 : 4096) + t->text_len;
			char *nt = realloc(o->text, cap);
			if (!nt)
				return -1;
			o->text = nt;
			o->cap = cap;
		}
		memcpy(o->text + o->len, t->text, t->text_len);
		o->len += t->text_len;
		printf("{\"index\":%u,\"token\":%u,\"text\":", t->index, t->token);
		cli_json_string(stdout, t->text, t->text_len);
		if (t->has_logprob)
			printf(",\"logprob\":%.6g", t->logprob);
		fputs("}\n", stdout);
	} else {
		fwrite(t->text, 1, t->text_len, stdout);
	}
	fflush(stdout);
	return 0;
}


/* A whole small file (a grammar, a schema), NUL-terminated; NULL with e filled. */
static char *read_small_file(const char *path, struct hearth_err *e)
{
	FILE *f = fopen(path, "re");
	if (!f) {
		snprintf(e->msg, sizeof e->msg, "%s: %s", path, strerror(errno));
		return NULL;
	}
	size_t cap = 1u << 20;
	char *buf = malloc(cap + 1);
	size_t n = buf ? fread(buf, 1, cap + 1, f) : 0;
	fclose(f);
	if (!buf || n > cap) {
		free(buf);
		snprintf(e->msg, sizeof e->msg, "%s: %s", path, buf ? "larger than 1 MiB" : "out of memory");
		return NULL;
	}
	buf[n] = 0;
	return buf;
}

/* The sampling options, read and bounded by protocol/sampling.h as the daemon bounds them.
 * 0, or the usage exit status after printing why. */
static int cli_sampling_option(struct hearth_gen_params *p, int opt, const char *text)
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
		if (!msg_sampling_parse(map[i].param, text, &x, why, sizeof why))
			return usage_error("%s", why);
		switch (map[i].param) {
		case MSG_SAMPLING_TEMPERATURE: p->temperature = x; break;
		case MSG_SAMPLING_TOP_K: p->top_k = (uint32_t)x; break;
		case MSG_SAMPLING_TOP_P: p->top_p = x; break;
		case MSG_SAMPLING_MIN_P: p->min_p = x; break;
		case MSG_SAMPLING_REPEAT_PENALTY: p->repeat_penalty = x; break;
		case MSG_SAMPLING_REPEAT_LAST_N: p->repeat_last_n = (uint32_t)x; break;
		case MSG_SAMPLING_N: break;
		}
		return 0;
	}
	return usage_error("unknown sampling option");
}

/* One sampling or output option of generate into a; 0, or the usage error's exit code. */
int gen_option(struct cli *c, struct gen_args *a, int opt, const char *arg)
{
	struct hearth_gen_params *p = &a->p;
	uint64_t u;
	switch (opt) {
	case 'n':
		if (!parse_u64(arg, 1u << 20, &u))
			return usage_error("-n wants a token count up to 1048576, not \"%s\"", arg);
		p->max_tokens = (uint32_t)u;
		return 0;
	case OPT_TEMP:
	case OPT_TOP_K:
	case OPT_TOP_P:
	case OPT_MIN_P:
	case OPT_REPEAT_PENALTY:
	case OPT_REPEAT_LAST_N:
		return cli_sampling_option(p, opt, arg);
	case OPT_SEED:
		if (!parse_u64(arg, UINT64_MAX, &u))
			return usage_error("--seed wants an unsigned integer, not \"%s\"", arg);
		p->has_seed = true;
		p->seed = u;
		return 0;
	case OPT_STOP:
		if (a->n_stop == GEN_STOP_MAX)
			return usage_error("at most %d --stop strings", GEN_STOP_MAX);
		if (!*arg)
			return usage_error("--stop wants a non-empty string");
		a->stop[a->n_stop++] = arg;
		return 0;
	case OPT_JSON:
		c->json = true;
		return 0;
	case OPT_GRAMMAR:
	case OPT_JSON_SCHEMA: {
		struct hearth_err e = { 0 };
		char **dst = opt == OPT_GRAMMAR ? &a->grammar : &a->json_schema;
		free(*dst);
		if (!(*dst = read_small_file(arg, &e)))
			return usage_error("%s: %s", opt == OPT_GRAMMAR ? "--grammar" : "--json-schema", e.msg);
		return 0;
	}
	case OPT_JSON_OBJECT:
		p->json_object = true;
		return 0;
	case OPT_NO_JUMP_FORWARD:
		p->jump_forward = false;
		return 0;
	case OPT_SPECULATE:
		if (!parse_u64(arg, HEARTH_SPECULATE_MAX, &u))
			return usage_error("--speculate wants 0 (off) to %u draft tokens, not \"%s\"",
					   HEARTH_SPECULATE_MAX, arg);
		p->speculate = u ? (int32_t)u : -1;
		return 0;
	case OPT_DRAFT:
		if (strcmp(arg, "auto") && strcmp(arg, "lookup") && strcmp(arg, "model"))
			return usage_error("--draft wants auto, lookup or model, not \"%s\"", arg);
		p->draft = arg;
		return 0;
	default:
		return usage_error("unknown option for generate");
	}
}

/* Parses generate's command line into a. Returns 0 to go on, -1 when done (--help), or a
 * usage error's exit code. */
static int gen_parse(struct cli *c, int argc, char **argv, struct gen_args *a)
{
	static const struct option opts[] = {
		COMMON_OPTIONS,
		GEN_OPTIONS,
		{ 0 },
	};
	memset(a, 0, sizeof *a);
	a->p = hearth_gen_params_default();
	int opt, rc;
	while ((opt = getopt_long(argc, argv, "+n:vhV", opts, NULL)) != -1) {
		if (common_option(c, opt, optarg, &rc)) {
			if (rc)
				return rc;
			continue;
		}
		if ((rc = gen_option(c, a, opt, optarg)))
			return rc;
	}
	if (argc - optind != 1)
		return usage_error("generate wants exactly one PROMPT argument (quote it; - reads "
				   "stdin)");
	gen_args_finish(a);
	return 0;
}

void gen_args_finish(struct gen_args *a)
{
	a->p.stop = a->stop;
	a->p.n_stop = a->n_stop;
	a->p.grammar = a->grammar;
	a->p.json_schema = a->json_schema;
}

void gen_args_free(struct gen_args *a)
{
	free(a->grammar);
	free(a->json_schema);
	a->grammar = a->json_schema = NULL;
}


/* Prints tokens as they come until the generation ends. The first ^C cancels (the daemon
 * stops computing) and the stream goes on to its done frame; waits are short slices so ^C
 * is noticed during a long prefill, and the idle timeout is counted across them. Returns
 * 0, or 1 with e filled. */
static int gen_stream(struct cli *c, struct hearth_gen *g, struct gen_out *out, bool *canceled,
		      struct hearth_err *e)
{
	int idle_ms = 0;
	int idle_max = c->timeout_ms == 0 ? HEARTH_TIMEOUT_DEFAULT_MS : c->timeout_ms;
	for (;;) {
		const struct hearth_token *t;
		if (interrupted && !*canceled) {
			*canceled = true;
			hearth_cancel(g, NULL);
		}
		int rc = hearth_gen_next(g, &t, GEN_SLICE_MS, e);
		if (rc == 1) {
			idle_ms = 0;
			if (gen_print(out, t) < 0) {
				snprintf(e->msg, sizeof e->msg, "out of memory");
				return 1;
			}
			continue;
		}
		if (rc == HEARTH_ETIMEDOUT) {
			idle_ms += GEN_SLICE_MS;
			if (idle_max > 0 && idle_ms >= idle_max) {
				snprintf(e->msg, sizeof e->msg, "no token from hearthd for %d ms: giving "
					 "up (--timeout)", idle_max);
				return 1;
			}
			continue;
		}
		return rc < 0 ? 1 : 0;
	}
}

/* The end of a generation: the final JSON line (with the whole text) or a newline, and the
 * timings under -v. */
static void gen_report(const struct cli *c, const struct hearth_result *res,
		       const struct gen_out *out)
{
	if (c->json) {
		printf("{\"finish\":\"%s\",\"n_prompt\":%u,\"n_gen\":%u,\"queue_ms\":%.3f,"
		       "\"prefill_ms\":%.3f,\"decode_ms\":%.3f,\"prefill_tps\":%.2f,"
		       "\"decode_tps\":%.2f,\"n_forced\":%u,\"text\":", hearth_finish_name(res->finish),
		       res->n_prompt, res->n_gen, res->queue_ms, res->prefill_ms, res->decode_ms,
		       res->prefill_tps, res->decode_tps, res->n_forced);
		cli_json_string(stdout, out->text ? out->text : "", out->len);
		fputs("}\n", stdout);
	} else {
		fputc('\n', stdout);
	}
	fflush(stdout);
	if (c->verbose)
		fprintf(stderr, "hearth: %s; prompt %u tokens in %.1f ms (%.1f tok/s), generated %u "
			"tokens in %.1f ms (%.1f tok/s), queued %.1f ms\n",
			hearth_finish_name(res->finish), res->n_prompt, res->prefill_ms,
			res->prefill_tps, res->n_gen, res->decode_ms, res->decode_tps, res->queue_ms);
}

static int cmd_generate(struct cli *c, int argc, char **argv)
{
	struct gen_args a;
	int rc = gen_parse(c, argc, argv, &a);
	if (rc) {
		gen_args_free(&a);
		return rc < 0 ? 0 : rc;
	}

	struct hearth_err e = { 0 };
	char *stdin_text = NULL;
	struct hearth_prompt prompt = { .text = argv[optind], .len = strlen(argv[optind]) };
	if (strcmp(argv[optind], "-") == 0) {
		stdin_text = read_stdin(&prompt.len, &e);
		if (!stdin_text) {
			gen_args_free(&a);
			return fail(&e);
		}
		prompt.text = stdin_text;
	}
	struct hearth *h;
	if (cli_connect(c, true, &h, &e) < 0) {
		free(stdin_text);
		gen_args_free(&a);
		return fail(&e);
	}
	/* The first ^C cancels; a second one kills. */
	struct sigaction sa = { .sa_handler = on_sigint, .sa_flags = SA_RESETHAND };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	struct hearth_gen *g;
	rc = hearth_gen_start(h, &prompt, &a.p, &g, &e);
	free(stdin_text);
	gen_args_free(&a); /* sent with the request */
	if (rc < 0) {
		hearth_close(h);
		return fail(&e);
	}
	struct gen_out out = { .json = c->json };
	bool canceled = false;
	int status = gen_stream(c, g, &out, &canceled, &e);
	struct hearth_result res;
	struct hearth_err fe;
	int frc = hearth_gen_finish(g, &res, &fe);
	hearth_close(h);
	if (status) {
		if (!c->json)
			fputc('\n', stdout);
		free(out.text);
		return fail(&e);
	}
	if (frc < 0) {
		free(out.text);
		return fail(&fe);
	}
	gen_report(c, &res, &out);
	free(out.text);
	if (canceled) {
		fprintf(stderr, "hearth: canceled\n");
		return 1;
	}
	return 0;
}

/* ---- tokenize / detokenize ---- */

static int cmd_tokenize(struct cli *c, int argc, char **argv)
{
	static const struct option opts[] = {
		COMMON_OPTIONS,
		{ "no-bos", no_argument, NULL, OPT_NO_BOS },
		{ "special", no_argument, NULL, OPT_SPECIAL },
		{ "json", no_argument, NULL, OPT_JSON },
		{ 0 },
	};
	unsigned flags = 0;
	int opt, rc;
	while ((opt = getopt_long(argc, argv, "+vhV", opts, NULL)) != -1) {
		if (common_option(c, opt, optarg, &rc)) {
			if (rc)
				return rc < 0 ? 0 : rc;
			continue;
		}
		if (opt == OPT_NO_BOS)
			flags |= HEARTH_TOKENIZE_NO_BOS;
		else if (opt == OPT_SPECIAL)
			flags |= HEARTH_TOKENIZE_SPECIAL;
		else if (opt == OPT_JSON)
			c->json = true;
	}
	if (argc - optind != 1)
		return usage_error("tokenize wants exactly one TEXT argument (- reads stdin)");
	struct hearth_err e = { 0 };
	const char *text = argv[optind];
	size_t len = strlen(text);
	char *owned = NULL;
	if (strcmp(text, "-") == 0) {
		owned = read_stdin(&len, &e);
		if (!owned)
			return fail(&e);
		text = owned;
	}
	struct hearth *h;
	if (cli_connect(c, true, &h, &e) < 0) {
		free(owned);
		return fail(&e);
	}
	uint32_t *ids;
	size_t n;
	rc = hearth_tokenize(h, text, len, flags, &ids, &n, &e);
	hearth_close(h);
	free(owned);
	if (rc < 0)
		return fail(&e);
	if (c->json)
		fputc('[', stdout);
	for (size_t i = 0; i < n; i++)
		printf(i ? (c->json ? ",%u" : " %u") : "%u", ids[i]);
	puts(c->json ? "]" : "");
	hearth_free(ids);
	return 0;
}

static int cmd_detokenize(struct cli *c, int argc, char **argv)
{
	static const struct option opts[] = {
		COMMON_OPTIONS,
		{ "json", no_argument, NULL, OPT_JSON },
		{ 0 },
	};
	int opt, rc;
	while ((opt = getopt_long(argc, argv, "+vhV", opts, NULL)) != -1) {
		if (common_option(c, opt, optarg, &rc)) {
			if (rc)
				return rc < 0 ? 0 : rc;
			continue;
		}
		if (opt == OPT_JSON)
			c->json = true;
	}
	if (optind >= argc)
		return usage_error("detokenize wants token ids (or - to read them from stdin)");
	struct hearth_err e = { 0 };
	char *owned = NULL;
	size_t n = 0, cap = 0;
	uint32_t *ids = NULL;
	/* Ids come as arguments, or whitespace-separated on stdin. */
	char **words = argv + optind;
	int n_words = argc - optind;
	char *saveptr = NULL, *tok = NULL;
	if (n_words == 1 && strcmp(words[0], "-") == 0) {
		size_t len;
		owned = read_stdin(&len, &e);
		if (!owned)
			return fail(&e);
		tok = strtok_r(owned, " \t\r\n,[]", &saveptr);
	}
	for (int i = 0;; i++) {
		const char *w;
		if (owned) {
			if (i > 0)
				tok = strtok_r(NULL, " \t\r\n,[]", &saveptr);
			if (!tok)
				break;
			w = tok;
		} else {
			if (i >= n_words)
				break;
			w = words[i];
		}
		uint64_t v;
		if (!parse_u64(w, 0x7fffffff, &v)) {
			free(owned);
			free(ids);
			return usage_error("\"%s\" is not a token id", w);
		}
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			uint32_t *ni = realloc(ids, cap * sizeof *ids);
			if (!ni) {
				free(owned);
				free(ids);
				fprintf(stderr, "hearth: out of memory\n");
				return 1;
			}
			ids = ni;
		}
		ids[n++] = (uint32_t)v;
	}
	free(owned);
	struct hearth *h;
	if (cli_connect(c, true, &h, &e) < 0) {
		free(ids);
		return fail(&e);
	}
	char *text;
	size_t len;
	rc = hearth_detokenize(h, ids, n, &text, &len, &e);
	hearth_close(h);
	free(ids);
	if (rc < 0)
		return fail(&e);
	if (c->json) {
		fputs("{\"text\":", stdout);
		cli_json_string(stdout, text, len);
		fputs("}\n", stdout);
	} else {
		fwrite(text, 1, len, stdout);
		fputc('\n', stdout);
	}
	hearth_free(text);
	return 0;
}

/* ---- stats / ledger / ping ---- */

static int parse_json_only(struct cli *c, int argc, char **argv, const char *what)
{
	static const struct option opts[] = {
		COMMON_OPTIONS,
		{ "json", no_argument, NULL, OPT_JSON },
		{ "prometheus", no_argument, NULL, OPT_PROMETHEUS },
		{ 0 },
	};
	int opt, rc;
	while ((opt = getopt_long(argc, argv, "+vhV", opts, NULL)) != -1) {
		if (common_option(c, opt, optarg, &rc)) {
			if (rc)
				return rc < 0 ? -1 : rc;
			continue;
		}
		if (opt == OPT_JSON)
			c->json = true;
		else if (opt == OPT_PROMETHEUS && !strcmp(what, "stats"))
			c->prometheus = true;
		else if (opt == OPT_PROMETHEUS)
			return usage_error("--prometheus is for stats");
	}
	if (optind != argc)
		return usage_error("%s takes no arguments", what);
	return 0;
}

/* "1.72B", "2.9M", "812": a parameter count as a person reads it. */
static void human_count(char *buf, size_t size, uint64_t n)
{
	if (n >= 1000000000)
		snprintf(buf, size, "%.2fB", (double)n / 1e9);
	else if (n >= 1000000)
		snprintf(buf, size, "%.1fM", (double)n / 1e6);
	else
		snprintf(buf, size, "%" PRIu64, n);
}

static int cmd_stats(struct cli *c, int argc, char **argv)
{
	int rc = parse_json_only(c, argc, argv, "stats");
	if (rc)
		return rc < 0 ? 0 : rc;
	struct hearth_err e = { 0 };
	struct hearth *h;
	if (cli_connect(c, true, &h, &e) < 0)
		return fail(&e);
	struct hearth_stats s;
	struct hearth_model m;
	struct hearth_ledger ledger;
	hearth_model_info(h, &m, NULL);
	rc = hearth_stats(h, &s, &e);
	bool have_ledger = rc == 0 && c->prometheus && hearth_ledger(h, &ledger, NULL) == 0;
	hearth_close(h);
	if (rc < 0)
		return fail(&e);
	if (c->prometheus) {
		/* For node_exporter's textfile collector: write to a temporary file, then rename. */
		prom_write_daemon(stdout, &s, have_ledger ? &ledger : NULL);
		return 0;
	}
	if (c->json) {
		printf("{\"uptime_ms\":%" PRIu64 ",\"clients\":%u,\"running\":%u,\"queued\":%u,"
		       "\"prompt_tokens\":%" PRIu64 ",\"gen_tokens\":%" PRIu64 ",\"kv_used\":%" PRIu64
		       ",\"kv_total\":%" PRIu64 ",\"rss\":%" PRIu64 ",\"prefix_lookup_tokens\":%" PRIu64
		       ",\"prefix_hit_tokens\":%" PRIu64 ",\"draft_tokens\":%" PRIu64
		       ",\"draft_accepted\":%" PRIu64 ",\"draft_model_tokens\":%" PRIu64
		       ",\"draft_model_accepted\":%" PRIu64 ",\"draft_kv_used\":%" PRIu64
		       ",\"draft_kv_total\":%" PRIu64 ",\"phase\":",
		       s.uptime_ms, s.clients, s.running, s.queued, s.prompt_tokens, s.gen_tokens,
		       s.kv_used, s.kv_total, s.rss, s.prefix_lookup_tokens, s.prefix_hit_tokens,
		       s.draft_tokens, s.draft_accepted, s.draft_model_tokens, s.draft_model_accepted,
		       s.draft_kv_used, s.draft_kv_total);
		cli_json_string(stdout, s.phase, strlen(s.phase));
		fputs(",\"model\":{\"name\":", stdout);
		cli_json_string(stdout, m.name, strlen(m.name));
		fputs(",\"arch\":", stdout);
		cli_json_string(stdout, m.arch, strlen(m.arch));
		fputs(",\"quant\":", stdout);
		cli_json_string(stdout, m.quant, strlen(m.quant));
		printf(",\"n_params\":%" PRIu64 ",\"n_ctx\":%u,\"n_vocab\":%u", m.n_params, m.n_ctx, m.n_vocab);
		if (m.draft.arch[0]) {
			fputs(",\"draft\":{\"name\":", stdout);
			cli_json_string(stdout, m.draft.name, strlen(m.draft.name));
			fputs(",\"arch\":", stdout);
			cli_json_string(stdout, m.draft.arch, strlen(m.draft.arch));
			fputs(",\"quant\":", stdout);
			cli_json_string(stdout, m.draft.quant, strlen(m.draft.quant));
			printf(",\"n_params\":%" PRIu64 ",\"n_ctx\":%u,\"n_layer\":%u,\"n_embd\":%u}", m.draft.n_params,
			       m.draft.n_ctx, m.draft.n_layer, m.draft.n_embd);
		}
		fputs("},\"daemon\":", stdout);
		cli_json_string(stdout, m.daemon_version, strlen(m.daemon_version));
		fputs("}\n", stdout);
		return 0;
	}
	char up[64], kvu[32], kvt[32], rss[32];
	human_duration(up, sizeof up, s.uptime_ms);
	human_bytes(kvu, sizeof kvu, s.kv_used);
	human_bytes(kvt, sizeof kvt, s.kv_total);
	human_bytes(rss, sizeof rss, s.rss);
	char params[32];
	human_count(params, sizeof params, m.n_params);
	printf("%-16s %s (%s, %s, %s parameters)\n", "model", m.name[0] ? m.name : "?", m.arch,
	       m.quant, params);
	if (m.draft.arch[0]) {
		human_count(params, sizeof params, m.draft.n_params);
		printf("%-16s %s (%s, %s, %s parameters, %u tokens)\n", "draft model",
		       m.draft.name[0] ? m.draft.name : "?", m.draft.arch, m.draft.quant, params, m.draft.n_ctx);
	}
	printf("%-16s %u tokens\n", "context", m.n_ctx);
	printf("%-16s hearthd %s\n", "daemon", m.daemon_version);
	printf("%-16s %s\n", "uptime", up);
	printf("%-16s %u\n", "clients", s.clients);
	printf("%-16s %u\n", "running", s.running);
	printf("%-16s %u\n", "queued", s.queued);
	printf("%-16s %" PRIu64 "\n", "prompt tokens", s.prompt_tokens);
	printf("%-16s %" PRIu64 "\n", "generated tokens", s.gen_tokens);
	if (s.draft_tokens)
		printf("%-16s %" PRIu64 " of %" PRIu64 " accepted (%.1f%%)\n", "draft tokens",
		       s.draft_accepted, s.draft_tokens, 100.0 * (double)s.draft_accepted / (double)s.draft_tokens);
	if (s.draft_model_tokens)
		printf("%-16s %" PRIu64 " of %" PRIu64 " accepted (%.1f%%)\n", "  draft model",
		       s.draft_model_accepted, s.draft_model_tokens,
		       100.0 * (double)s.draft_model_accepted / (double)s.draft_model_tokens);
	printf("%-16s %s / %s (%.1f%%)\n", "kv cache", kvu, kvt,
	       s.kv_total ? 100.0 * (double)s.kv_used / (double)s.kv_total : 0.0);
	if (s.draft_kv_total) {
		human_bytes(kvu, sizeof kvu, s.draft_kv_used);
		human_bytes(kvt, sizeof kvt, s.draft_kv_total);
		printf("%-16s %s / %s (%.1f%%)\n", "  draft kv cache", kvu, kvt,
		       100.0 * (double)s.draft_kv_used / (double)s.draft_kv_total);
	}
	printf("%-16s %s\n", "rss", rss);
	printf("%-16s %" PRIu64 " of %" PRIu64 " prompt tokens (%.1f%%)\n", "prefix cache", s.prefix_hit_tokens,
	       s.prefix_lookup_tokens,
	       s.prefix_lookup_tokens ? 100.0 * (double)s.prefix_hit_tokens / (double)s.prefix_lookup_tokens : 0.0);
	if (s.phase[0])
		printf("%-16s %s\n", "phase", s.phase);
	return 0;
}

static int cmd_ledger(struct cli *c, int argc, char **argv)
{
	int rc = parse_json_only(c, argc, argv, "ledger");
	if (rc)
		return rc < 0 ? 0 : rc;
	struct hearth_err e = { 0 };
	struct hearth *h;
	if (cli_connect(c, true, &h, &e) < 0)
		return fail(&e);
	struct hearth_ledger *l = malloc(sizeof *l);
	if (!l) {
		hearth_close(h);
		fprintf(stderr, "hearth: out of memory\n");
		return 1;
	}
	rc = hearth_ledger(h, l, &e);
	hearth_close(h);
	if (rc < 0) {
		free(l);
		return fail(&e);
	}
	if (c->json) {
		fputs("{\"entries\":[", stdout);
		for (size_t i = 0; i < l->n_entries; i++) {
			fputs(i ? ",{\"name\":" : "{\"name\":", stdout);
			cli_json_string(stdout, l->entries[i].name, strlen(l->entries[i].name));
			printf(",\"bytes\":%" PRIu64 "}", l->entries[i].bytes);
		}
		printf("],\"total\":%" PRIu64 ",\"peak\":%" PRIu64 "}\n", l->total, l->peak);
		free(l);
		return 0;
	}
	char hb[32];
	printf("%-24s %14s  %10s\n", "owner", "bytes", "size");
	for (size_t i = 0; i < l->n_entries; i++) {
		human_bytes(hb, sizeof hb, l->entries[i].bytes);
		printf("%-24s %14" PRIu64 "  %10s\n", l->entries[i].name, l->entries[i].bytes, hb);
	}
	human_bytes(hb, sizeof hb, l->total);
	printf("%-24s %14" PRIu64 "  %10s\n", "total", l->total, hb);
	human_bytes(hb, sizeof hb, l->peak);
	printf("%-24s %14" PRIu64 "  %10s\n", "peak", l->peak, hb);
	free(l);
	return 0;
}

static int cmd_ping(struct cli *c, int argc, char **argv)
{
	static const struct option opts[] = {
		COMMON_OPTIONS,
		{ "count", required_argument, NULL, 'c' },
		{ 0 },
	};
	uint64_t count = 1;
	int opt, rc;
	while ((opt = getopt_long(argc, argv, "+c:vhV", opts, NULL)) != -1) {
		if (common_option(c, opt, optarg, &rc)) {
			if (rc)
				return rc < 0 ? 0 : rc;
			continue;
		}
		if (opt == 'c' && (!parse_u64(optarg, 1000000, &count) || count == 0))
			return usage_error("-c wants a count in 1..1000000, not \"%s\"", optarg);
	}
	if (optind != argc)
		return usage_error("ping takes no arguments");
	struct hearth_err e = { 0 };
	struct hearth *h;
	/* No hello: a ping answers while the model is still loading. */
	if (cli_connect(c, false, &h, &e) < 0)
		return fail(&e);
	for (uint64_t i = 0; i < count; i++) {
		uint64_t us;
		if (hearth_ping(h, &us, &e) < 0) {
			hearth_close(h);
			return fail(&e);
		}
		printf("pong: %" PRIu64 " µs\n", us);
		fflush(stdout);
	}
	hearth_close(h);
	return 0;
}

/* ---- bench ---- */

/* "1,2,4,8,16": each level 1..1024 clients. */
static bool parse_levels(const char *s, struct bench_opts *o)
{
	o->n_levels = 0;
	char buf[256];
	if (strlen(s) >= sizeof buf)
		return false;
	strcpy(buf, s);
	char *save = NULL;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		uint64_t v;
		if (o->n_levels == BENCH_LEVELS_MAX || !parse_u64(tok, 1024, &v) || v == 0)
			return false;
		o->clients[o->n_levels++] = (uint32_t)v;
	}
	return o->n_levels > 0;
}

static int cmd_bench(struct cli *c, int argc, char **argv)
{
	static const struct option opts[] = {
		COMMON_OPTIONS,
		{ "clients", required_argument, NULL, OPT_CLIENTS },
		{ "prompt-tokens", required_argument, NULL, OPT_PROMPT_TOKENS },
		{ "tokens", required_argument, NULL, OPT_TOKENS },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "spin-us", required_argument, NULL, OPT_SPIN_US },
		{ 0 },
	};
	struct bench_opts o = { .prompt_tokens = 128, .tokens = 128, .seed = 1 };
	parse_levels("1,2,4,8,16", &o);
	int opt, rc;
	uint64_t v;
	while ((opt = getopt_long(argc, argv, "+vhV", opts, NULL)) != -1) {
		if (common_option(c, opt, optarg, &rc)) {
			if (rc)
				return rc < 0 ? 0 : rc;
			continue;
		}
		switch (opt) {
		case OPT_CLIENTS:
			if (!parse_levels(optarg, &o))
				return usage_error("--clients wants a list like 1,2,4,8,16 (each "
						   "1..1024, at most %d), not \"%s\"",
						   BENCH_LEVELS_MAX, optarg);
			break;
		case OPT_PROMPT_TOKENS:
			if (!parse_u64(optarg, 1u << 20, &v) || v == 0)
				return usage_error("--prompt-tokens wants 1..%u, not \"%s\"", 1u << 20,
						   optarg);
			o.prompt_tokens = (uint32_t)v;
			break;
		case OPT_TOKENS:
			if (!parse_u64(optarg, 1u << 20, &v) || v == 0)
				return usage_error("--tokens wants 1..%u, not \"%s\"", 1u << 20, optarg);
			o.tokens = (uint32_t)v;
			break;
		case OPT_SEED:
			if (!parse_u64(optarg, UINT64_MAX, &o.seed))
				return usage_error("--seed wants an unsigned integer, not \"%s\"", optarg);
			break;
		case OPT_JSON:
			o.json = true;
			break;
		case OPT_SPIN_US:
			if (!parse_u64(optarg, 1000000, &v))
				return usage_error("--spin-us wants 0..1000000 microseconds, not \"%s\"",
						   optarg);
			o.spin_us = (unsigned)v;
			break;
		}
	}
	if (optind != argc)
		return usage_error("bench takes no arguments");
	o.socket = c->socket;
	o.timeout_ms = c->timeout_ms;
	o.verbose = c->verbose;
	return bench_run(&o);
}

int main(int argc, char **argv)
{
	struct cli c = { .timeout_ms = 0 };
	static const struct option opts[] = { COMMON_OPTIONS, { 0 } };
	int opt, rc;
	while ((opt = getopt_long(argc, argv, "+vhV", opts, NULL)) != -1) {
		if (common_option(&c, opt, optarg, &rc) && rc)
			return rc < 0 ? 0 : rc;
	}
	if (optind >= argc) {
		usage(stderr);
		return EXIT_USAGE;
	}
	const char *cmd = argv[optind];
	int sub_argc = argc - optind;
	char **sub_argv = argv + optind;
	optind = 0; /* glibc: start over on the command's own arguments */
	if (strcmp(cmd, "generate") == 0)
		return cmd_generate(&c, sub_argc, sub_argv);
	if (strcmp(cmd, "chat") == 0)
		return cmd_chat(&c, sub_argc, sub_argv);
	if (strcmp(cmd, "tokenize") == 0)
		return cmd_tokenize(&c, sub_argc, sub_argv);
	if (strcmp(cmd, "embed") == 0)
		return cmd_embed(&c, sub_argc, sub_argv);
	if (strcmp(cmd, "detokenize") == 0)
		return cmd_detokenize(&c, sub_argc, sub_argv);
	if (strcmp(cmd, "stats") == 0)
		return cmd_stats(&c, sub_argc, sub_argv);
	if (strcmp(cmd, "ledger") == 0)
		return cmd_ledger(&c, sub_argc, sub_argv);
	if (strcmp(cmd, "ping") == 0)
		return cmd_ping(&c, sub_argc, sub_argv);
	if (strcmp(cmd, "bench") == 0)
		return cmd_bench(&c, sub_argc, sub_argv);
	if (strcmp(cmd, "help") == 0) {
		usage(stdout);
		return 0;
	}
	return usage_error("unknown command \"%s\"", cmd);
}
