/* Fuzz target for the grammar front ends: the first byte picks GBNF (even) or JSON Schema
 * (odd); the rest is the text. Refusals must carry a message; a schema that converts must
 * give GBNF that parses (any refusal then is about meaning or size, never syntax); a
 * grammar that compiles must judge strings and produce walks without breaking. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "daemon/engine/grammar.h"
#include "daemon/engine/json_schema.h"
#include "tests/fuzz/fuzz.h"

void fuzz_fail(const char *file, int line, const char *what)
{
	fprintf(stderr, "%s:%d: invariant broken: %s\n", file, line, what);
	abort();
}

static void exercise(struct grammar *g, const uint8_t *data, size_t size)
{
	/* the input and a suffix as candidate strings: accept mode must not break */
	(void)grammar_accepts(g, (const char *)data, size);
	if (size > 16)
		(void)grammar_accepts(g, (const char *)data + size / 2, size - size / 2);
	(void)grammar_accepts(g, "", 0);
	(void)grammar_accepts(g, "{\"a\": 1}", 8);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size == 0)
		return 0;
	const char *text = (const char *)data + 1;
	size_t len = size - 1;
	struct hearth_error err = { 0 };
	struct grammar *g = NULL;
	if (data[0] % 2 == 0) {
		int rc = grammar_compile(&g, text, len, &err);
		if (rc) {
			FUZZ_CHECK(rc < 0 && g == NULL);
			FUZZ_CHECK(err.msg[0] != 0);
			return 0;
		}
		exercise(g, data, size);
		grammar_free(g);
		return 0;
	}
	json_error_t je;
	json_t *schema = json_loadb(text, len, JSON_DECODE_ANY, &je);
	if (!schema)
		return 0;
	char *gbnf = NULL;
	int rc = json_schema_to_gbnf(schema, &gbnf, &err);
	json_decref(schema);
	if (rc) {
		FUZZ_CHECK(rc < 0 && gbnf == NULL && err.msg[0] != 0);
		return 0;
	}
	rc = grammar_compile(&g, gbnf, strlen(gbnf), &err);
	if (rc) {
		if (rc == HEARTH_EFORMAT)
			fprintf(stderr, "converter wrote bad GBNF: %s\n%s\n", err.msg, gbnf);
		FUZZ_CHECK(rc != HEARTH_EFORMAT);
	} else {
		exercise(g, data, size);
		grammar_free(g);
	}
	free(gbnf);
	return 0;
}

static void add_str(fuzz_seed_fn add, void *ctx, uint8_t mode, const char *s)
{
	size_t n = strlen(s);
	uint8_t *b = malloc(n + 1);
	if (!b)
		return;
	b[0] = mode;
	memcpy(b + 1, s, n);
	add(ctx, b, n + 1);
	free(b);
}

void fuzz_seeds(fuzz_seed_fn add, void *ctx)
{
	add_str(add, ctx, 0, "root ::= (expr \"=\" ws term \"\\n\")+\nexpr ::= term ([-+*/] term)*\n"
			     "term ::= ident | num | \"(\" ws expr \")\" ws\nident ::= [a-z] [a-z0-9_]* ws\n"
			     "num ::= [0-9]+ ws\nws ::= [ \\t\\n]*\n");
	add_str(add, ctx, 0, "root ::= object\nvalue ::= object | array | string\nobject ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
			     "array ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\nstring ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
			     "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n");
	add_str(add, ctx, 0, "root ::= [ぁ-ゟ]+ ([ \\t\\n] [一-鿿]+)* # comment\n");
	add_str(add, ctx, 0, "root ::= \"a\"{2,5} . [^\\u2028\\u2029] x?\nx ::= (\"b\" | \"\")*\n");
	/* former timeouts: nested unbounded repetition, interleaved .* */
	add_str(add, ctx, 0, "root ::= .+++++++++++++++ .+++ .+++ .");
	add_str(add, ctx, 0, "root ::= ........................................* ........................................* ....... x?\nx ::= (\"b\" | \"\")*\n");
	add_str(add, ctx, 1, "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":8},"
			     "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",1,null]},\"maxItems\":3},"
			     "\"when\":{\"type\":\"string\",\"format\":\"date-time\"}},\"required\":[\"name\"]}");
	add_str(add, ctx, 1, "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"number\"},"
			     "\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/node\"}");
	add_str(add, ctx, 1, "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3,5}(x|y)?$\"},"
			     "\"k\":{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"integer\",\"exclusiveMinimum\":-5}]}},\"additionalProperties\":{\"type\":\"boolean\"}}");
	add_str(add, ctx, 1, "{\"type\":\"array\",\"prefixItems\":[{\"const\":\"x\"},{\"type\":\"boolean\"}],\"items\":{\"type\":\"string\",\"format\":\"uuid\"},\"minItems\":3}");
	add_str(add, ctx, 1, "{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}},{\"properties\":{\"b\":{\"type\":\"null\"}},\"required\":[\"b\"]}]}");
}
