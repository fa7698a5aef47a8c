/* Prints random strings of grammars for the integration tests' independent checkers:
 *   grammar_sample gbnf N SEED FILE...     (GBNF files)
 *   grammar_sample schema N SEED FILE...   (JSON Schema files, through json_schema.c)
 * One line per sample: FILE <tab> the sample's bytes in hex. A file that fails to compile
 * gives one line FILE <tab> "error:" and the message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "daemon/engine/grammar.h"
#include "daemon/engine/json_schema.h"
#include "tests/support/grammar_walk.h"

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = malloc((size_t)n + 1);
	if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
		free(b);
		b = NULL;
	}
	fclose(f);
	if (b)
		b[n] = 0;
	*len = (size_t)n;
	return b;
}

int main(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: %s gbnf|schema N SEED FILE...\n", argv[0]);
		return 2;
	}
	bool schema = strcmp(argv[1], "schema") == 0;
	long count = strtol(argv[2], NULL, 10);
	uint64_t rng = strtoull(argv[3], NULL, 10) | 1;
	static char out[1 << 16];
	for (int a = 4; a < argc; a++) {
		size_t len;
		char *text = slurp(argv[a], &len);
		struct hearth_error err = { 0 };
		char *gbnf = NULL;
		struct grammar *g = NULL;
		int rc = text ? 0 : HEARTH_EIO;
		if (!text)
			snprintf(err.msg, sizeof err.msg, "cannot read");
		if (!rc && schema) {
			json_error_t je;
			json_t *j = json_loadb(text, len, JSON_DECODE_ANY, &je);
			rc = j ? json_schema_to_gbnf(j, &gbnf, &err) : HEARTH_EFORMAT;
			json_decref(j);
			if (!rc)
				len = strlen(gbnf);
		}
		if (!rc)
			rc = grammar_compile(&g, schema ? gbnf : text, len, &err);
		if (rc) {
			printf("%s\terror:%s\n", argv[a], err.msg);
		} else {
			struct gwalk *w = gwalk_new(g);
			for (long i = 0; w && i < count; i++) {
				size_t budget = (size_t)(gwalk_rand(&rng) % 160);
				long n = gwalk_sample(w, &rng, budget, out, sizeof out);
				if (n < 0) {
					printf("%s\terror:walk failed\n", argv[a]);
					break;
				}
				printf("%s\t", argv[a]);
				for (long k = 0; k < n; k++)
					printf("%02x", (unsigned char)out[k]);
				printf("\t1\n");
				if (schema)
					continue;
				/* a mutant with the engine's verdict, for the recognizer to agree with */
				uint64_t r = gwalk_rand(&rng);
				size_t at = n ? (size_t)(r >> 8) % (size_t)n : 0;
				if (r % 3 == 0 && n) {
					memmove(out + at, out + at + 1, (size_t)n - at - 1);
					n--;
				} else if (r % 3 == 1 && n + 1 < (long)sizeof out) {
					memmove(out + at + 1, out + at, (size_t)n - at);
					out[at] = (char)(r >> 40);
					n++;
				} else if (n) {
					out[at] = (char)(r >> 40);
				}
				if (r % 5 == 0)
					out[at < (size_t)n ? at : 0] = "(){}[]\",:; \n-"[(r >> 20) % 12];
				printf("%s\t", argv[a]);
				for (long k = 0; k < n; k++)
					printf("%02x", (unsigned char)out[k]);
				printf("\t%d\n", grammar_accepts(g, out, (size_t)n));
			}
			gwalk_free(w);
		}
		grammar_free(g);
		free(gbnf);
		free(text);
	}
	return 0;
}
