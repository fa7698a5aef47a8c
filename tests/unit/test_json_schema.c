/* JSON Schema to grammar: integer ranges against arithmetic (every integer in a window is
 * accepted exactly when in range), property order and optional subsets as llama.cpp's
 * converter has them, string lengths, patterns, enums, recursion through $ref, json_object
 * mode, and refusals naming the keyword and the JSON pointer, hostile schemas bounded.
 * Validity over random schemas is tests/integration/test_json_schema.sh's job. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "daemon/engine/grammar.h"
#include "daemon/engine/json_schema.h"

static struct grammar *schema_grammar(const char *schema)
{
	json_error_t je;
	json_t *j = json_loads(schema, JSON_DECODE_ANY, &je);
	if (!j)
		fail_msg("bad test schema: %s", je.text);
	char *gbnf = NULL;
	struct hearth_error err = { 0 };
	if (json_schema_to_gbnf(j, &gbnf, &err))
		fail_msg("convert: %s", err.msg);
	json_decref(j);
	struct grammar *g = NULL;
	if (grammar_compile(&g, gbnf, strlen(gbnf), &err))
		fail_msg("compile: %s\n%s", err.msg, gbnf);
	free(gbnf);
	return g;
}

static void expect(const struct grammar *g, const char *s, bool good)
{
	if (grammar_accepts(g, s, strlen(s)) != good)
		fail_msg("\"%s\" should be %s", s, good ? "accepted" : "rejected");
}

static void check_int_range(const char *bounds, long long lo, long long hi)
{
	char schema[256];
	snprintf(schema, sizeof schema, "{\"type\":\"integer\",%s}", bounds);
	struct grammar *g = schema_grammar(schema);
	for (long long v = -1300; v <= 1300; v++) {
		char s[32];
		snprintf(s, sizeof s, "%lld", v);
		bool in = v >= lo && v <= hi;
		if (grammar_accepts(g, s, strlen(s)) != in)
			fail_msg("%s: %lld should be %s", bounds, v, in ? "accepted" : "rejected");
	}
	/* no leading zeros, no negative zero */
	expect(g, "007", false);
	expect(g, "-0", false);
	grammar_free(g);
}

static void test_json_schema_integer_bounds_are_exact(void **state)
{
	(void)state;
	check_int_range("\"minimum\":0,\"maximum\":150", 0, 150);
	check_int_range("\"minimum\":-37,\"maximum\":1000", -37, 1000);
	check_int_range("\"minimum\":-1000,\"maximum\":-37", -1000, -37);
	check_int_range("\"minimum\":7", 7, 1LL << 60);
	check_int_range("\"maximum\":-12", -(1LL << 60), -12);
	check_int_range("\"exclusiveMinimum\":-1,\"exclusiveMaximum\":100", 0, 99);
	check_int_range("\"minimum\":99,\"maximum\":1001", 99, 1001);
	check_int_range("\"minimum\":1.5,\"maximum\":9.5", 2, 9);
	check_int_range("\"minimum\":123,\"maximum\":123", 123, 123);
	struct grammar *g = schema_grammar("{\"type\":\"integer\",\"minimum\":5}");
	expect(g, "123456789012345", true);
	grammar_free(g);
}

static void test_json_schema_objects_follow_llama_cpp_order(void **state)
{
	(void)state;
	struct grammar *g = schema_grammar(
		"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"},"
		"\"c\":{\"type\":\"boolean\"},\"d\":{\"type\":\"null\"}},\"required\":[\"c\",\"a\"]}");
	/* required first, in schema order; then any ordered subset of the optional ones */
	expect(g, "{\"a\": 1, \"c\": true}", true);
	expect(g, "{\"a\":1,\"c\":true,\"b\":\"x\",\"d\":null}", true);
	expect(g, "{\"a\":1,\"c\":true,\"d\":null}", true);
	expect(g, "{\"c\":true,\"a\":1}", false);
	expect(g, "{\"a\":1,\"c\":true,\"d\":null,\"b\":\"x\"}", false);
	expect(g, "{\"a\":1}", false);
	expect(g, "{\"a\":1,\"c\":true,\"e\":1}", false);
	/* whitespace as llama.cpp's converter allows it */
	expect(g, "{\n  \"a\" : 1 ,\n\t\"c\":true }", true);
	expect(g, "{  \"a\":1,\"c\":true}", false);
	grammar_free(g);

	g = schema_grammar("{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},"
			   "\"additionalProperties\":{\"type\":\"number\"}}");
	expect(g, "{\"id\":1,\"x\":2.5,\"y\":3}", true);
	expect(g, "{\"x\":2.5}", true);
	expect(g, "{\"id\":1,\"id\":2}", false); /* extra keys never repeat a named one */
	expect(g, "{\"idx\":2,\"i\":3}", true);
	expect(g, "{\"x\":\"s\"}", false);
	grammar_free(g);

	g = schema_grammar("{\"type\":\"object\"}");
	expect(g, "{\"any\": [1, {\"b\": null}]}", true);
	grammar_free(g);
}

static void test_json_schema_strings_arrays_enums(void **state)
{
	(void)state;
	struct grammar *g = schema_grammar("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}");
	expect(g, "\"ab\"", true);
	expect(g, "\"\\u00e9\\n\\\"\"", true); /* three characters, escaped */
	expect(g, "\"\xe2\x82\xac\xe2\x82\xac\"", true);
	expect(g, "\"a\"", false);
	expect(g, "\"abcd\"", false);
	expect(g, "\"\\ud83d\\ude00\"", false); /* surrogate escapes would miscount */
	grammar_free(g);

	g = schema_grammar("{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3}(x|yz)?$\"}");
	expect(g, "\"AB-123\"", true);
	expect(g, "\"AB-123yz\"", true);
	expect(g, "\"AB-12\"", false);
	expect(g, "\"ab-123\"", false);
	grammar_free(g);

	g = schema_grammar("{\"type\":\"string\",\"pattern\":\"^a\\\"b\\\\\\\\c$\"}");
	expect(g, "\"a\\\"b\\\\c\"", true); /* quote and backslash come out escaped */
	grammar_free(g);

	g = schema_grammar("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}");
	expect(g, "[1,2]", true);
	expect(g, "[1, 2, 3]", true);
	expect(g, "[1]", false);
	expect(g, "[1,2,3,4]", false);
	grammar_free(g);

	g = schema_grammar("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"boolean\"}],\"items\":false}");
	expect(g, "[\"a\",true]", true);
	expect(g, "[\"a\",true,1]", false);
	grammar_free(g);

	g = schema_grammar("{\"enum\":[\"red\",1,null,{\"k\":[true]}]}");
	expect(g, "\"red\"", true);
	expect(g, "{\"k\":[true]}", true);
	expect(g, "null", true);
	expect(g, "\"blue\"", false);
	grammar_free(g);

	g = schema_grammar("{\"type\":\"string\",\"format\":\"date\"}");
	expect(g, "\"2024-02-28\"", true);
	expect(g, "\"2024-02-30\"", false);
	expect(g, "\"2024-13-01\"", false);
	grammar_free(g);

	g = schema_grammar("{\"type\":[\"integer\",\"null\"]}");
	expect(g, "null", true);
	expect(g, "-5", true);
	expect(g, "1.5", false);
	grammar_free(g);
}

static void test_json_schema_recursive_refs(void **state)
{
	(void)state;
	struct grammar *g = schema_grammar(
		"{\"$ref\":\"#/$defs/t\",\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
		"\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/t\"}}},\"required\":[\"v\"]}}}");
	expect(g, "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[{\"v\":4,\"kids\":[]}]}]}", true);
	expect(g, "{\"v\":1,\"kids\":[{}]}", false);
	grammar_free(g);

	g = schema_grammar("{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#\"}}}");
	expect(g, "{\"next\":{\"next\":{}}}", true);
	grammar_free(g);

	g = schema_grammar(grammar_json_object_gbnf() ? "{\"type\":\"object\"}" : "{}");
	grammar_free(g);
	struct grammar *o = NULL;
	struct hearth_error err = { 0 };
	const char *jo = grammar_json_object_gbnf();
	assert_int_equal(grammar_compile(&o, jo, strlen(jo), &err), 0);
	expect(o, "{\"a\": [1, -2.5e3, \"\\u00e9\", {\"b\": null}], \"c\": false}", true);
	expect(o, "[1]", false);
	expect(o, "\"s\"", false);
	grammar_free(o);
}

static void expect_refusal(const char *schema, int code, const char *const *needles)
{
	json_error_t je;
	json_t *j = json_loads(schema, JSON_DECODE_ANY, &je);
	assert_non_null(j);
	char *gbnf = NULL;
	struct hearth_error err = { 0 };
	clock_t t0 = clock();
	int rc = json_schema_to_gbnf(j, &gbnf, &err);
	json_decref(j);
	if (rc == 0) {
		/* some refusals come from the grammar compiler (self-reference, size) */
		struct grammar *g = NULL;
		rc = grammar_compile(&g, gbnf, strlen(gbnf), &err);
		grammar_free(g);
		free(gbnf);
	}
	if ((double)(clock() - t0) / CLOCKS_PER_SEC > 2.0)
		fail_msg("refusal of %.80s took too long", schema);
	if (rc != code)
		fail_msg("%s: expected %d, got %d (%s)", schema, code, rc, err.msg);
	for (const char *const *n = needles; *n; n++)
		if (!strstr(err.msg, *n))
			fail_msg("message \"%s\" lacks \"%s\"", err.msg, *n);
}

static void test_json_schema_refuses_unsupported_keywords_with_pointer(void **state)
{
	(void)state;
	expect_refusal("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"not\":{\"const\":\"x\"}}}}",
		       HEARTH_EUNSUPPORTED, (const char *[]){ "'not'", "/properties/a", NULL });
	expect_refusal("{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"multipleOf\":3}}",
		       HEARTH_EUNSUPPORTED, (const char *[]){ "'multipleOf'", "/items", NULL });
	expect_refusal("{\"type\":\"array\",\"uniqueItems\":true}", HEARTH_EUNSUPPORTED,
		       (const char *[]){ "'uniqueItems'", NULL });
	expect_refusal("{\"type\":\"object\",\"patternProperties\":{\"^x\":{}}}", HEARTH_EUNSUPPORTED,
		       (const char *[]){ "'patternProperties'", NULL });
	expect_refusal("{\"type\":\"string\",\"format\":\"hostname\"}", HEARTH_EUNSUPPORTED,
		       (const char *[]){ "format 'hostname'", NULL });
	expect_refusal("{\"type\":\"string\",\"pattern\":\"abc\"}", HEARTH_EUNSUPPORTED,
		       (const char *[]){ "anchored", NULL });
	expect_refusal("{\"type\":\"string\",\"pattern\":\"^(?=a)b$\"}", HEARTH_EUNSUPPORTED,
		       (const char *[]){ "lookaround", NULL });
	expect_refusal("{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", HEARTH_EUNSUPPORTED,
		       (const char *[]){ "/oneOf", "may both match", NULL });
	expect_refusal("{\"$ref\":\"https://example.com/s.json\"}", HEARTH_EUNSUPPORTED,
		       (const char *[]){ "$ref", NULL });
	expect_refusal("{\"$ref\":\"#/$defs/missing\"}", HEARTH_EUNSUPPORTED, (const char *[]){ "missing", NULL });
	expect_refusal("{\"type\":\"number\",\"maximum\":3}", HEARTH_EUNSUPPORTED,
		       (const char *[]){ "'maximum'", NULL });
	expect_refusal("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", HEARTH_EINVAL,
		       (const char *[]){ "no value", NULL });
	expect_refusal("{\"properties\":{\"a\":false},\"required\":[\"a\"]}", HEARTH_EINVAL,
		       (const char *[]){ "/properties/a", "false", NULL });
	expect_refusal("{\"type\":\"object\",\"required\":[\"zz\"]}", HEARTH_EUNSUPPORTED,
		       (const char *[]){ "'zz'", NULL });
	expect_refusal("{\"type\":\"strin\"}", HEARTH_EUNSUPPORTED, (const char *[]){ "'strin'", NULL });
}

static void test_json_schema_hostile_schemas_are_bounded(void **state)
{
	(void)state;
	/* self-reference without progress: left recursion, refused by the compiler */
	expect_refusal("{\"$ref\":\"#\"}", HEARTH_EINVAL, (const char *[]){ "left-recursive", NULL });
	expect_refusal("{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"}]}},\"$ref\":\"#/$defs/a\"}",
		       HEARTH_EINVAL, (const char *[]){ "left-recursive", NULL });
	/* deep nesting */
	{
		size_t cap = 1 << 16, n = 0;
		char *buf = malloc(cap);
		for (int i = 0; i < 200; i++)
			n += (size_t)snprintf(buf + n, cap - n, "{\"type\":\"array\",\"items\":");
		n += (size_t)snprintf(buf + n, cap - n, "{\"type\":\"null\"}");
		for (int i = 0; i < 200; i++)
			buf[n++] = '}';
		buf[n] = 0;
		expect_refusal(buf, HEARTH_ERANGE, (const char *[]){ "nested deeper", NULL });
		free(buf);
	}
	/* huge counts */
	expect_refusal("{\"type\":\"array\",\"minItems\":100000}", HEARTH_ERANGE, (const char *[]){ "1000", NULL });
	expect_refusal("{\"type\":\"string\",\"maxLength\":1000000}", HEARTH_ERANGE, (const char *[]){ "1000", NULL });
	/* exponential: each level doubles the text through repeated references */
	{
		size_t cap = 1 << 16, n = 0;
		char *buf = malloc(cap);
		n += (size_t)snprintf(buf + n, cap - n, "{\"$defs\":{");
		for (int i = 0; i < 30; i++)
			n += (size_t)snprintf(buf + n, cap - n,
					      "\"d%d\":{\"type\":\"array\",\"prefixItems\":[{\"$ref\":\"#/$defs/d%d\"},{\"$ref\":\"#/$defs/d%d\"}],\"items\":false},",
					      i, i + 1, i + 1);
		n += (size_t)snprintf(buf + n, cap - n, "\"d30\":{\"type\":\"integer\"}},\"$ref\":\"#/$defs/d0\"}");
		json_error_t je;
		json_t *j = json_loads(buf, 0, &je);
		char *gbnf = NULL;
		struct hearth_error err = { 0 };
		clock_t t0 = clock();
		int rc = json_schema_to_gbnf(j, &gbnf, &err);
		struct grammar *g = NULL;
		if (!rc)
			rc = grammar_compile(&g, gbnf, strlen(gbnf), &err);
		assert_true((double)(clock() - t0) / CLOCKS_PER_SEC < 5.0);
		assert_true(rc == 0 || rc == HEARTH_ERANGE);
		grammar_free(g);
		free(gbnf);
		json_decref(j);
		free(buf);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_json_schema_integer_bounds_are_exact),
		cmocka_unit_test(test_json_schema_objects_follow_llama_cpp_order),
		cmocka_unit_test(test_json_schema_strings_arrays_enums),
		cmocka_unit_test(test_json_schema_recursive_refs),
		cmocka_unit_test(test_json_schema_refuses_unsupported_keywords_with_pointer),
		cmocka_unit_test(test_json_schema_hostile_schemas_are_bounded),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
