/* What the `hearth` command's files share (client/cli.c and its commands): options,
 * parsing helpers, the connection, and the sampling options of generate and chat. */
#ifndef HEARTH_CLIENT_CLI_H
#define HEARTH_CLIENT_CLI_H

#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "client/hearth.h"

#define EXIT_USAGE 2

struct cli {
	const char *socket;
	int timeout_ms;
	int verbose;
	bool json;
	bool prometheus;
};

/* Set by on_sigint; the running command decides what a ^C means. */
extern volatile sig_atomic_t interrupted;
void on_sigint(int sig);

enum {
	OPT_SOCKET = 1000, OPT_TIMEOUT, OPT_JSON, OPT_TEMP, OPT_TOP_K, OPT_TOP_P, OPT_MIN_P,
	OPT_REPEAT_PENALTY, OPT_REPEAT_LAST_N, OPT_SEED,
	OPT_SPIN_US, OPT_STOP, OPT_NO_BOS, OPT_SPECIAL,
	OPT_CLIENTS, OPT_PROMPT_TOKENS, OPT_TOKENS, OPT_PROMETHEUS,
	OPT_GRAMMAR, OPT_JSON_SCHEMA, OPT_JSON_OBJECT, OPT_NO_JUMP_FORWARD, OPT_SPECULATE, OPT_DRAFT,
};

#define COMMON_OPTIONS \
	{ "socket", required_argument, NULL, OPT_SOCKET }, \
	{ "timeout", required_argument, NULL, OPT_TIMEOUT }, \
	{ "verbose", no_argument, NULL, 'v' }, \
	{ "help", no_argument, NULL, 'h' }, \
	{ "version", no_argument, NULL, 'V' }

#define GEN_STOP_MAX 16
#define GEN_SLICE_MS 200  /* waits between ^C checks during a long prefill */

struct gen_args {
	struct hearth_gen_params p;
	const char *stop[GEN_STOP_MAX];
	size_t n_stop;
	char *grammar;            /* owned: the --grammar / --json-schema file's text */
	char *json_schema;
};

/* The options generate and chat share (sampling, stop, structured output). */
#define GEN_OPTIONS \
	{ "max-tokens", required_argument, NULL, 'n' }, \
	{ "temp", required_argument, NULL, OPT_TEMP }, \
	{ "temperature", required_argument, NULL, OPT_TEMP }, \
	{ "top-k", required_argument, NULL, OPT_TOP_K }, \
	{ "top-p", required_argument, NULL, OPT_TOP_P }, \
	{ "min-p", required_argument, NULL, OPT_MIN_P }, \
	{ "repeat-penalty", required_argument, NULL, OPT_REPEAT_PENALTY }, \
	{ "repeat-last-n", required_argument, NULL, OPT_REPEAT_LAST_N }, \
	{ "seed", required_argument, NULL, OPT_SEED }, \
	{ "stop", required_argument, NULL, OPT_STOP }, \
	{ "grammar", required_argument, NULL, OPT_GRAMMAR }, \
	{ "json-schema", required_argument, NULL, OPT_JSON_SCHEMA }, \
	{ "json-object", no_argument, NULL, OPT_JSON_OBJECT }, \
	{ "speculate", required_argument, NULL, OPT_SPECULATE }, \
	{ "draft", required_argument, NULL, OPT_DRAFT }, \
	{ "no-jump-forward", no_argument, NULL, OPT_NO_JUMP_FORWARD }, \
	{ "json", no_argument, NULL, OPT_JSON }

/* Points a's parameters at what the options collected (stop strings, grammar). */
void gen_args_finish(struct gen_args *a);
void gen_args_free(struct gen_args *a);

int fail(const struct hearth_err *e);
int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
bool parse_u64(const char *s, uint64_t max, uint64_t *out);
bool parse_double(const char *s, double *out);
/* A JSON string of raw bytes; bytes that are not UTF-8 become U+FFFD. */
void cli_json_string(FILE *f, const char *text, size_t len);
char *read_stdin(size_t *len, struct hearth_err *e);
int cli_connect(struct cli *c, bool hello, struct hearth **h, struct hearth_err *e);
/* An option every command takes: 1 if it was one (with *rc: 0, -1 done, or a usage error's
 * exit code), 0 if not. */
int common_option(struct cli *c, int opt, const char *arg, int *rc);
/* One sampling option of generate or chat into a; 0, or the usage error's exit code. */
int gen_option(struct cli *c, struct gen_args *a, int opt, const char *arg);

/* `hearth chat` (client/cli_chat.c). */
int cmd_chat(struct cli *c, int argc, char **argv);
/* `hearth embed` (client/cli_embed.c). */
int cmd_embed(struct cli *c, int argc, char **argv);

#endif
