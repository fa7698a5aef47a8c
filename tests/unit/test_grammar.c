/* The grammar engine: every shared GBNF grammar compiles and its random walks are accepted,
 * known strings are judged right, each refusal names the rule and line:column, hostile
 * grammars stay bounded, and token masks on a real 102k vocabulary (deepseek-llm) equal the brute-force
 * answer (every token's bytes tried through the automaton) on random states. The Python
 * recognizer in tests/integration/test_grammar.sh is the independent check of the language. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/engine/gguf.h"
#include "daemon/engine/grammar.h"
#include "daemon/engine/json_schema.h"
#include "daemon/engine/tokenizer.h"
#include "tests/support/grammar_walk.h"

static const char *shared_dir(void)
{
	const char *dir = getenv("HEARTH_SHARED");
	if (!dir || !*dir)
		fail_msg("HEARTH_SHARED is not set (make check sets it)");
	return dir;
}

static char *read_grammar(const char *name, size_t *len)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/grammars/%s", shared_dir(), name);
	FILE *f = fopen(path, "rb");
	if (!f)
		fail_msg("cannot open %s", path);
	static char buf[1 << 16];
	*len = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[*len] = 0;
	return buf;
}

static struct grammar *compile_ok(const char *text)
{
	struct grammar *g = NULL;
	struct hearth_error err = { 0 };
	if (grammar_compile(&g, text, strlen(text), &err))
		fail_msg("compile failed: %s\n%s", err.msg, text);
	return g;
}

static const char *const shared_grammars[] = {
	"arithmetic.gbnf", "c.gbnf", "chess.gbnf", "english.gbnf", "japanese.gbnf",
	"json.gbnf", "json_arr.gbnf", "list.gbnf",
};

static void test_grammar_compiles_every_shared_grammar_and_accepts_its_walks(void **state)
{
	(void)state;
	uint64_t rng = 12345;
	static char out[1 << 16];
	for (size_t i = 0; i < sizeof shared_grammars / sizeof *shared_grammars; i++) {
		size_t len;
		char *text = read_grammar(shared_grammars[i], &len);
		struct grammar *g = NULL;
		struct hearth_error err = { 0 };
		if (grammar_compile(&g, text, len, &err))
			fail_msg("%s: %s", shared_grammars[i], err.msg);
		struct gwalk *w = gwalk_new(g);
		assert_non_null(w);
		for (int k = 0; k < 50; k++) {
			long n = gwalk_sample(w, &rng, (size_t)(gwalk_rand(&rng) % 200), out, sizeof out);
			assert_true(n >= 0);
			if (!grammar_accepts(g, out, (size_t)n))
				fail_msg("%s: own walk rejected: %.*s", shared_grammars[i], (int)n, out);
		}
		gwalk_free(w);
		grammar_free(g);
	}
}

struct known {
	const char *file;
	const char *s;
	bool good;
};

static const struct known known[] = {
	{ "arithmetic.gbnf", "1+2= 3\n", true },
	{ "arithmetic.gbnf", "(a_1 *b)= x\n", true },
	{ "arithmetic.gbnf", "1+2=3", false },
	{ "arithmetic.gbnf", "1++2= 3\n", false },
	{ "c.gbnf", "int main(){return 0;}", true },
	{ "c.gbnf", "int f(int x){while(x<10){x = x+1;}return x;}", true },
	{ "c.gbnf", "int main(){return 0}", false },
	{ "chess.gbnf", "1. e4 e5\n2. Nf3 Nc6\n", true },
	{ "chess.gbnf", "1. O-O-O Qxd8#\n2. a8=Q+ Kh1\n", true },
	{ "chess.gbnf", "1. e4 e5\n", false },
	{ "chess.gbnf", "1. e9 e5\n2. a1 a2\n", false },
	{ "english.gbnf", "Hello, world!", true },
	{ "english.gbnf", "two  spaces", false },
	{ "english.gbnf", "caf\xc3\xa9", false },
	{ "japanese.gbnf", "\xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf", true },
	{ "japanese.gbnf", "hello", false },
	{ "json.gbnf", "{\"a\": [1, 2.5e3, \"x\\u00e9\", true, null, {}]}", true },
	{ "json.gbnf", "{\"a\":\n  {\"b\": -0}}", true },
	{ "json.gbnf", "{\"a\": 01}", false },
	{ "json.gbnf", "[1]", false },
	{ "json.gbnf", "{\"a\": \"\x01\"}", false },
	{ "json.gbnf", "{\"\xe2\x82\xac\": 1}", true },
	{ "json.gbnf", "{\"\xed\xa0\x80\": 1}", false }, /* a surrogate is not a character */
	{ "json.gbnf", "{\"\xc3\": 1}", false },
	{ "json_arr.gbnf", "[\n{\"a\": 1},\n2]", true },
	{ "json_arr.gbnf", "[\n1] ", false },
	{ "list.gbnf", "- one\n- two \xe2\x9c\x93\n", true },
	{ "list.gbnf", "- one\r\n", false },
	{ "list.gbnf", "- \xe2\x80\xa8\n", false },
	{ "list.gbnf", "", false },
};

static void test_grammar_judges_known_strings(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof known / sizeof *known; i++) {
		size_t len;
		char *text = read_grammar(known[i].file, &len);
		struct grammar *g = NULL;
		struct hearth_error err = { 0 };
		assert_int_equal(grammar_compile(&g, text, len, &err), 0);
		bool got = grammar_accepts(g, known[i].s, strlen(known[i].s));
		if (got != known[i].good)
			fail_msg("%s: \"%s\" should be %s", known[i].file, known[i].s,
				 known[i].good ? "accepted" : "rejected");
		grammar_free(g);
	}
}

static void test_grammar_syntax_features(void **state)
{
	(void)state;
	struct {
		const char *g, *s;
		bool good;
	} cases[] = {
		{ "root ::= \"a\"{2,3}", "aa", true },
		{ "root ::= \"a\"{2,3}", "aaaa", false },
		{ "root ::= \"a\"{2,}", "aaaaaaa", true },
		{ "root ::= \"a\"{2,}", "a", false },
		{ "root ::= \"a\"{,2}", "", true },
		{ "root ::= \"a\"{3}", "aaa", true },
		{ "root ::= [^a-c] .", "d\xe2\x82\xac", true },
		{ "root ::= [^a-c] .", "b!", false },
		{ "root ::= \"\\x41\\u00e9\\U0001F600\\t\\n\\\\\\\"\"", "A\xc3\xa9\xf0\x9f\x98\x80\t\n\\\"", true },
		{ "root ::= [\\x00-\\x7f]+", "\x01\x7f", true },
		{ "root ::= [\\u0100-\\U0010FFFF]", "\xf4\x8f\xbf\xbf", true },
		{ "root ::= [\\u0100-\\U0010FFFF]", "\xc3\xbf", false },
		{ "root ::= [\\u0100-\\U0010FFFF]", "\xc4\x80", true },
		{ "# c\nroot ::= a | # c\n  b\na ::= \"x\" (\n  \"y\"\n  | \"z\")\nb ::= \"w\"\n", "xz", true },
		{ "root ::= a\na ::= \"(\" a \")\" | \"\"", "((()))", true },
		{ "root ::= a\na ::= \"(\" a \")\" | \"\"", "(()", false },
		{ "root ::= (\"a\" | \"\")* \"b\"", "aab", true },
		{ "root ::= x x\nx ::= \"a\"?", "a", true },
		{ "root   ::=   \"a\"\r\n", "a", true },
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		struct grammar *g = compile_ok(cases[i].g);
		if (grammar_accepts(g, cases[i].s, strlen(cases[i].s)) != cases[i].good)
			fail_msg("grammar %s: \"%s\" should be %s", cases[i].g, cases[i].s,
				 cases[i].good ? "accepted" : "rejected");
		grammar_free(g);
	}
}

static void expect_error(const char *text, int code, const char *const *needles)
{
	struct grammar *g = NULL;
	struct hearth_error err = { 0 };
	clock_t t0 = clock();
	int rc = grammar_compile(&g, text, strlen(text), &err);
	double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
	if (rc != code)
		fail_msg("expected %d, got %d (%s) for:\n%.200s", code, rc, err.msg, text);
	assert_null(g);
	for (const char *const *n = needles; *n; n++)
		if (!strstr(err.msg, *n))
			fail_msg("message \"%s\" lacks \"%s\"", err.msg, *n);
	if (secs > 2.0)
		fail_msg("refusal took %.2f s", secs);
}

static void test_grammar_refuses_with_rule_and_position(void **state)
{
	(void)state;
	expect_error("root ::= a\n", HEARTH_EINVAL, (const char *[]){ "'a'", "1:10", "not defined", NULL });
	expect_error("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"\n", HEARTH_EINVAL,
		     (const char *[]){ "'expr'", "2:1", "left-recursive", NULL });
	expect_error("root ::= a\na ::= b \"x\"\nb ::= \"\"? a | \"y\"\n", HEARTH_EINVAL,
		     (const char *[]){ "left-recursive", "a -> b -> a", NULL });
	expect_error("root ::= \"a\" root\n", HEARTH_EINVAL,
		     (const char *[]){ "'root'", "1:1", "matches no finite string", "empty", NULL });
	expect_error("root ::= \"a\" | b\nb ::= \"x\" c\nc ::= [^\\x00-\\U0010FFFF]\n", HEARTH_EINVAL,
		     (const char *[]){ "3:7", "'c'", "matches no character", NULL });
	expect_error("root ::= \"a\" | b\nb ::= \"x\" b\n", HEARTH_EINVAL,
		     (const char *[]){ "2:1", "'b'", "matches no finite string", NULL });
	expect_error("a ::= \"x\"\n", HEARTH_EINVAL, (const char *[]){ "root", NULL });
	expect_error("root ::= \"a\"\nroot ::= \"b\"\n", HEARTH_EINVAL,
		     (const char *[]){ "'root'", "2:1", "defined again", "1:1", NULL });
	expect_error("root ::= \"abc\n", HEARTH_EFORMAT, (const char *[]){ "1:10", "unterminated", NULL });
	expect_error("root ::= [a-\n", HEARTH_EFORMAT, (const char *[]){ "1:12", NULL });
	expect_error("root ::= [ab\n", HEARTH_EFORMAT, (const char *[]){ "1:10", "unterminated", NULL });
	expect_error("root ::= (\"a\"\n", HEARTH_EFORMAT, (const char *[]){ "')'", NULL });
	expect_error("root ::= \"a\" )\n", HEARTH_EFORMAT, (const char *[]){ "1:14", NULL });
	expect_error("root = \"a\"\n", HEARTH_EFORMAT, (const char *[]){ "1:6", "::=", NULL });
	expect_error("root ::= [z-a]\n", HEARTH_EFORMAT, (const char *[]){ "1:12", NULL });
	expect_error("root ::= \"\\q\"\n", HEARTH_EFORMAT, (const char *[]){ "1:11", "escape", NULL });
	expect_error("root ::= \"a\"{3,2}\n", HEARTH_EFORMAT, (const char *[]){ "1:13", NULL });
	expect_error("root ::= *\n", HEARTH_EFORMAT, (const char *[]){ "1:10", NULL });
	expect_error("root ::= \"\xff\"\n", HEARTH_EFORMAT, (const char *[]){ "UTF-8", NULL });
	expect_error("root ::= \"a\"{200000}\n", HEARTH_ERANGE, (const char *[]){ "100000", NULL });
}

static void test_grammar_hostile_inputs_are_bounded(void **state)
{
	(void)state;
	/* exponential repetition */
	expect_error("root ::= (\"x\"{1000}){1000}\n", HEARTH_ERANGE,
		     (const char *[]){ "'root'", "automaton nodes", NULL });
	expect_error("root ::= x{1000}\nx ::= (y{1000}){1000}\ny ::= \"ab\"\n", HEARTH_ERANGE,
		     (const char *[]){ "'x'", "automaton nodes", NULL });
	/* nested counts through rules stay calls: a small automaton for a huge language */
	{
		struct grammar *g = compile_ok("root ::= x{1000}\nx ::= y{1000}\ny ::= \"ab\"\n");
		assert_false(grammar_accepts(g, "ab", 2));
		grammar_free(g);
	}
	/* deep parentheses */
	{
		static char buf[4096];
		size_t n = (size_t)snprintf(buf, sizeof buf, "root ::= ");
		for (int i = 0; i < 300; i++)
			buf[n++] = '(';
		buf[n++] = '"';
		buf[n++] = 'a';
		buf[n++] = '"';
		for (int i = 0; i < 300; i++)
			buf[n++] = ')';
		buf[n] = 0;
		expect_error(buf, HEARTH_ERANGE, (const char *[]){ "nested deeper", NULL });
	}
	/* a long chain of rules, each inlined into the one before: compiles, bounded */
	{
		size_t cap = 1 << 20, n = 0;
		char *buf = malloc(cap);
		n += (size_t)snprintf(buf + n, cap - n, "root ::= r0\n");
		for (int i = 0; i < 3000; i++)
			n += (size_t)snprintf(buf + n, cap - n, "r%d ::= \"a\" r%d | \"b\"\n", i, i + 1);
		n += (size_t)snprintf(buf + n, cap - n, "r3000 ::= \"c\"\n");
		struct grammar *g = NULL;
		struct hearth_error err = { 0 };
		clock_t t0 = clock();
		int rc = grammar_compile(&g, buf, n, &err);
		assert_true((double)(clock() - t0) / CLOCKS_PER_SEC < 2.0);
		assert_int_equal(rc, 0);
		assert_true(grammar_accepts(g, "aab", 3));
		assert_false(grammar_accepts(g, "aa", 2));
		grammar_free(g);
		free(buf);
	}
	/* doubling rules: 2^40 strings' worth of inlining falls back to calls */
	{
		char buf[4096];
		size_t n = (size_t)snprintf(buf, sizeof buf, "root ::= d0\n");
		for (int i = 0; i < 40; i++)
			n += (size_t)snprintf(buf + n, sizeof buf - n, "d%d ::= d%d d%d\n", i, i + 1, i + 1);
		n += (size_t)snprintf(buf + n, sizeof buf - n, "d40 ::= \"x\" | \"y\"\n");
		struct grammar *g = NULL;
		struct hearth_error err = { 0 };
		clock_t t0 = clock();
		int rc = grammar_compile(&g, buf, n, &err);
		assert_true((double)(clock() - t0) / CLOCKS_PER_SEC < 5.0);
		if (rc == 0) {
			assert_false(grammar_accepts(g, "xy", 2));
			grammar_free(g);
		} else {
			assert_int_equal(rc, HEARTH_ERANGE);
		}
	}
	/* nested unbounded repetitions stay linear; many interleaved .* stay bounded (both
	 * found by the fuzzer as timeouts) */
	{
		clock_t t0 = clock();
		struct grammar *g = compile_ok("root ::= .+++++++++++++++ .+++ .+++ .\n");
		assert_true(grammar_accepts(g, "abcd", 4));
		assert_false(grammar_accepts(g, "abc", 3));
		grammar_free(g);
		char buf[1024];
		size_t n = (size_t)snprintf(buf, sizeof buf, "root ::= ");
		for (int i = 0; i < 200; i++)
			n += (size_t)snprintf(buf + n, sizeof buf - n, i % 40 == 39 ? ".* " : ".");
		snprintf(buf + n, sizeof buf - n, "\n");
		g = compile_ok(buf);
		char s[400];
		memset(s, 'x', sizeof s);
		assert_true(grammar_accepts(g, s, sizeof s));
		assert_false(grammar_accepts(g, s, 150));
		grammar_free(g);
		assert_true((double)(clock() - t0) / CLOCKS_PER_SEC < 5.0);
	}
	/* a huge ambiguous grammar: many parallel parses are bounded, not a hang */
	{
		struct grammar *g = compile_ok("root ::= x*\nx ::= \"a\" | \"a\" \"a\" | \"a\" \"a\" \"a\"\n");
		char s[4000];
		memset(s, 'a', sizeof s);
		assert_true(grammar_accepts(g, s, sizeof s));
		grammar_free(g);
	}
}

/* ---- masks on a real vocabulary ---- */
static struct tok *vocab_tok;
static struct grammar_vocab *vocab;

static int load_vocab(void **state)
{
	(void)state;
	char path[1024];
	struct gguf_file *f;
	struct hearth_error err = { 0 };
	snprintf(path, sizeof path, "%s/vocab/ggml-vocab-deepseek-llm.gguf", shared_dir());
	if (gguf_open(&f, path, &err) || tok_load(&vocab_tok, f, &err))
		fail_msg("%s", err.msg);
	gguf_close(f);
	if (grammar_vocab_new(&vocab, vocab_tok, &err))
		fail_msg("%s", err.msg);
	return 0;
}

static int free_vocab(void **state)
{
	(void)state;
	grammar_vocab_free(vocab);
	tok_free(vocab_tok);
	return 0;
}

static bool bit(const uint32_t *b, int32_t i)
{
	return b[i >> 5] >> (i & 31) & 1;
}

/* Walks a grammar with random allowed tokens; at each visited state the mask must equal
 * accept_token's verdict on every token of the vocabulary. */
static void masks_match_brute_force(const char *text, int steps, uint64_t seed)
{
	struct grammar *g = compile_ok(text);
	struct grammar_index *ix;
	struct grammar_matcher *m;
	struct hearth_error err = { 0 };
	assert_int_equal(grammar_index_new(&ix, g, vocab, &err), 0);
	assert_int_equal(grammar_matcher_new(&m, ix, &err), 0);
	int32_t n = grammar_vocab_n(vocab);
	uint32_t *bits = calloc(((size_t)n + 31) / 32, 4);
	int32_t *allowed = malloc((size_t)n * sizeof *allowed);
	uint64_t rng = seed;
	for (int step = 0; step < steps; step++) {
		assert_int_equal(grammar_matcher_fill_mask(m, bits, &err), 0);
		int32_t n_allowed = 0;
		for (int32_t id = 0; id < n; id++) {
			int rc = grammar_matcher_accept_token(m, id, NULL);
			bool ok = rc == 0;
			if (ok)
				assert_int_equal(grammar_matcher_rollback(m, 1, NULL), 0);
			if (ok != bit(bits, id)) {
				char piece[256];
				size_t l = tok_piece(vocab_tok, id, true, piece, sizeof piece - 1);
				piece[l < sizeof piece ? l : 0] = 0;
				fail_msg("step %d: token %d \"%s\": mask %d, brute force %d (grammar %.60s)", step,
					 id, piece, bit(bits, id), ok, text);
			}
			if (ok)
				allowed[n_allowed++] = id;
		}
		assert_true(n_allowed > 0);
		if (getenv("GRAMMAR_TEST_VERBOSE"))
			printf("# step %d: %d of %d tokens allowed\n", step, n_allowed, n);
		/* eos only when the grammar can end */
		assert_int_equal(bit(bits, tok_eos(vocab_tok)), grammar_matcher_can_end(m));
		/* half the time a short token: structure (quotes, commas, brackets) comes in
		 * short pieces, and the walk should reach many kinds of state */
		int32_t pick = allowed[gwalk_rand(&rng) % (uint64_t)n_allowed];
		bool structural = gwalk_rand(&rng) % 2;
		for (int tries = 0; structural && tries < 400; tries++) {
			int32_t c = allowed[gwalk_rand(&rng) % (uint64_t)n_allowed];
			char piece[64];
			size_t pl = tok_piece(vocab_tok, c, false, piece, sizeof piece);
			if (pl <= 2 || (pl < sizeof piece && memchr(piece, '"', pl))) {
				pick = c;
				break;
			}
		}
		if (tok_is_eog(vocab_tok, pick))
			break;
		assert_int_equal(grammar_matcher_accept_token(m, pick, &err), 0);
	}
	free(bits);
	free(allowed);
	grammar_matcher_free(m);
	grammar_index_unref(ix);
}

static void test_grammar_masks_equal_brute_force_json(void **state)
{
	(void)state;
	size_t len;
	masks_match_brute_force(read_grammar("json.gbnf", &len), 40, 7);
	masks_match_brute_force(read_grammar("json_arr.gbnf", &len), 20, 8);
}

static void test_grammar_masks_equal_brute_force_c_and_arithmetic(void **state)
{
	(void)state;
	size_t len;
	masks_match_brute_force(read_grammar("c.gbnf", &len), 25, 11);
	masks_match_brute_force(read_grammar("arithmetic.gbnf", &len), 20, 3);
	masks_match_brute_force(read_grammar("chess.gbnf", &len), 20, 4);
	masks_match_brute_force(read_grammar("english.gbnf", &len), 10, 4);
}

static void test_grammar_masks_equal_brute_force_unicode_and_small(void **state)
{
	(void)state;
	size_t len;
	masks_match_brute_force(read_grammar("japanese.gbnf", &len), 10, 5);
	masks_match_brute_force(read_grammar("list.gbnf", &len), 10, 5);
	masks_match_brute_force("root ::= \"yes\" | \"no\" | \"maybe so\"\n", 3, 1);
	/* the root called from inside itself, and a small rule shared by many places */
	masks_match_brute_force("root ::= \"(\" sp root sp \")\" | [a-z]+ | \"[\" sp (root (\",\" sp root)*)? \"]\"\n"
				"sp ::= \" \"?\n", 25, 2);
	masks_match_brute_force("root ::= item (\", \" item){0,3}\nitem ::= [a-z]{1,4} | \"\\\"\" [^\"]* \"\\\"\"\n", 5, 9);
}

/* Schema grammars call shared rules (string, space) from many places: the tokens that
 * leave such a rule are the uncertain ones, checked against the real stack. */
static void test_grammar_masks_equal_brute_force_schema(void **state)
{
	(void)state;
	static const char *const schemas[] = {
		"{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":99},"
		"\"name\":{\"type\":\"string\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":3},"
		"\"ok\":{\"type\":\"boolean\"},\"role\":{\"enum\":[\"admin\",\"user\"]},\"note\":{\"type\":[\"string\",\"null\"]}},"
		"\"required\":[\"id\",\"name\",\"tags\"]}",
		"{\"$ref\":\"#/$defs/t\",\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"number\"},"
		"\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/t\"}}},\"required\":[\"v\",\"kids\"]}}}",
	};
	for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++) {
		json_t *j = json_loads(schemas[i], 0, NULL);
		char *gbnf = NULL;
		struct hearth_error err = { 0 };
		assert_non_null(j);
		assert_int_equal(json_schema_to_gbnf(j, &gbnf, &err), 0);
		json_decref(j);
		masks_match_brute_force(gbnf, 40, 100 + i);
		free(gbnf);
	}
}

/* A grammar whose index would take minutes: refused by the step budget, or built, quickly. */
/* SentencePiece: byte-fallback tokens carry single bytes (partial UTF-8), pieces start with
 * a space; the same equality must hold. */
static void test_grammar_masks_equal_brute_force_sentencepiece(void **state)
{
	(void)state;
	struct tok *saved_tok = vocab_tok;
	struct grammar_vocab *saved = vocab;
	char path[1024];
	struct gguf_file *f;
	struct hearth_error err = { 0 };
	snprintf(path, sizeof path, "%s/vocab/ggml-vocab-llama-spm.gguf", shared_dir());
	if (gguf_open(&f, path, &err) || tok_load(&vocab_tok, f, &err))
		fail_msg("%s", err.msg);
	gguf_close(f);
	assert_int_equal(grammar_vocab_new(&vocab, vocab_tok, &err), 0);
	size_t len;
	masks_match_brute_force(read_grammar("json.gbnf", &len), 20, 21);
	masks_match_brute_force(read_grammar("japanese.gbnf", &len), 10, 22);
	grammar_vocab_free(vocab);
	tok_free(vocab_tok);
	vocab = saved;
	vocab_tok = saved_tok;
}

static void test_grammar_index_of_hostile_grammar_is_bounded(void **state)
{
	(void)state;
	struct grammar *g = compile_ok("root ::= [^\"]{0,3000} \"!\"\n");
	struct grammar_index *ix = NULL;
	struct hearth_error err = { 0 };
	time_t t0 = time(NULL);
	int rc = grammar_index_new(&ix, g, vocab, &err);
	assert_true(time(NULL) - t0 < 20);
	assert_int_equal(rc, HEARTH_ERANGE);
	assert_non_null(strstr(err.msg, "trie steps"));
	assert_null(ix);
}

static void test_grammar_forced_bytes_and_rollback(void **state)
{
	(void)state;
	struct grammar *g = compile_ok("root ::= \"{\\\"name\\\": \\\"\" [a-z]+ \"\\\", \\\"age\\\": \" [0-9]+ \"}\"\n");
	struct grammar_index *ix;
	struct grammar_matcher *m;
	struct hearth_error err = { 0 };
	assert_int_equal(grammar_index_new(&ix, g, vocab, &err), 0);
	assert_int_equal(grammar_matcher_new(&m, ix, &err), 0);
	char buf[64];
	size_t n = grammar_matcher_forced_bytes(m, buf, sizeof buf);
	assert_int_equal(n, 10);
	assert_memory_equal(buf, "{\"name\": \"", 10);
	assert_int_equal(grammar_matcher_forced_bytes(m, buf, 3), 3);
	assert_int_equal(grammar_matcher_accept_bytes(m, buf, 3, &err), 0);
	assert_int_equal(grammar_matcher_accept_bytes(m, "ame\": \"bob", 10, &err), 0);
	assert_int_equal(grammar_matcher_forced_bytes(m, buf, sizeof buf), 0);
	assert_int_equal(grammar_matcher_accept_bytes(m, "\"", 1, &err), 0);
	n = grammar_matcher_forced_bytes(m, buf, sizeof buf);
	assert_int_equal(n, 9);
	assert_memory_equal(buf, ", \"age\": ", 9);
	assert_false(grammar_matcher_can_end(m));
	assert_int_equal(grammar_matcher_accept_bytes(m, "x", 1, &err), HEARTH_EINVAL);
	assert_int_equal(grammar_matcher_history(m), 3);
	assert_int_equal(grammar_matcher_rollback(m, 2, &err), 0);
	assert_int_equal(grammar_matcher_history(m), 1);
	assert_int_equal(grammar_matcher_forced_bytes(m, buf, sizeof buf), 7);
	assert_int_equal(grammar_matcher_rollback(m, 5, &err), HEARTH_ERANGE);
	const char *rest = "ame\": \"al\", \"age\": 42}";
	assert_int_equal(grammar_matcher_accept_bytes(m, rest, strlen(rest), &err), 0);
	assert_true(grammar_matcher_can_end(m));
	assert_true(grammar_matcher_is_done(m));
	/* a reset matcher starts over */
	{
		struct grammar_matcher *r;
		assert_int_equal(grammar_matcher_new(&r, ix, &err), 0);
		assert_int_equal(grammar_matcher_accept_bytes(r, "{\"name\": \"x", 11, &err), 0);
		assert_int_equal(grammar_matcher_reset(r, &err), 0);
		assert_int_equal(grammar_matcher_history(r), 0);
		assert_int_equal(grammar_matcher_forced_bytes(r, buf, sizeof buf), 10);
		assert_int_equal(grammar_matcher_accept_bytes(r, "x", 1, &err), HEARTH_EINVAL);
		grammar_matcher_free(r);
	}
	/* end of generation then nothing more */
	assert_int_equal(grammar_matcher_accept_token(m, tok_eos(vocab_tok), &err), 0);
	assert_true(grammar_matcher_is_done(m));
	uint32_t *bits = calloc(((size_t)grammar_vocab_n(vocab) + 31) / 32, 4);
	assert_int_equal(grammar_matcher_fill_mask(m, bits, &err), 0);
	for (int32_t i = 0; i < grammar_vocab_n(vocab); i++)
		assert_false(bit(bits, i));
	free(bits);
	grammar_matcher_free(m);
	grammar_index_unref(ix);
}

/* ---- jump-forward ---- */

/* Runs grammar_jump_tokens on a fresh matcher of text after accepting `before`; checks what
 * every jump must hold whatever the tokenizer: the ids spell a prefix of the forced bytes,
 * the matcher moved over exactly them, and the tokenizer itself (the independent truth)
 * starts its tokenization of the forced bytes followed by each continuation in conts with
 * those same ids. Returns how many ids were jumped. */
static size_t jump_check(const char *text, const char *before, const char *const *conts, size_t n_conts,
			 size_t max_ids, int32_t *ids)
{
	struct grammar_index *ix;
	struct grammar_matcher *m;
	struct hearth_error err = { 0 };
	assert_int_equal(grammar_index_new(&ix, compile_ok(text), vocab, &err), 0);
	assert_int_equal(grammar_matcher_new(&m, ix, &err), 0);
	assert_int_equal(grammar_matcher_accept_bytes(m, before, strlen(before), &err), 0);
	char forced[GRAMMAR_JUMP_MAX_BYTES];
	size_t nf = grammar_matcher_forced_bytes(m, forced, sizeof forced);
	size_t hist = grammar_matcher_history(m), n = 0;
	assert_int_equal(grammar_jump_tokens(m, vocab_tok, ids, max_ids, &n, &err), 0);
	assert_true(n <= max_ids);
	assert_int_equal(grammar_matcher_history(m), hist + n);
	char spelt[GRAMMAR_JUMP_MAX_BYTES + 64];
	size_t off = 0;
	for (size_t i = 0; i < n; i++) {
		size_t l = tok_piece(vocab_tok, ids[i], false, spelt + off, sizeof spelt - off);
		assert_true(l > 0 && off + l <= nf);
		off += l;
	}
	assert_memory_equal(spelt, forced, off);
	/* the rest of the forced bytes is what the matcher still forces */
	char rest[GRAMMAR_JUMP_MAX_BYTES];
	size_t nr = grammar_matcher_forced_bytes(m, rest, sizeof rest);
	assert_int_equal(nr, nf - off);
	assert_memory_equal(rest, forced + off, nr);
	for (size_t c = 0; c < n_conts; c++) {
		char full[GRAMMAR_JUMP_MAX_BYTES + 64];
		memcpy(full, forced, nf);
		size_t fl = nf + strlen(conts[c]);
		memcpy(full + nf, conts[c], strlen(conts[c]));
		int32_t want[GRAMMAR_JUMP_MAX_BYTES + 64];
		size_t nw;
		assert_int_equal(tok_encode(vocab_tok, full, fl, false, false, want, 320, &nw, &err), 0);
		assert_true(nw >= n);
		for (size_t i = 0; i < n; i++)
			assert_int_equal(ids[i], want[i]);
	}
	grammar_matcher_free(m);
	grammar_index_unref(ix);
	return n;
}

static void test_grammar_jump_takes_only_the_stable_tokens_of_forced_text(void **state)
{
	(void)state;
	int32_t ids[GRAMMAR_JUMP_MAX_BYTES];
	/* a fixed key, then a string: the quote that opens the value may merge with the
	 * value's first letters, so the jump stops before it can */
	static const char *const words[] = { "alice", "Bob", "x y", "42", "\"", "-" };
	const char *person = "root ::= \"{\\\"customer_identifier\\\": \\\"\" [a-zA-Z0-9 \"-]+ \"}\"\n";
	size_t n = jump_check(person, "", words, 6, 64, ids);
	assert_true(n >= 3); /* `{"`, `customer`, `_identifier`, ... at least */
	/* numbers after a forced `": ` */
	static const char *const nums[] = { "7", "123", "-5" };
	n = jump_check("root ::= \"{\\\"count_of_items\\\": \" \"-\"? [0-9]+ \"}\"\n", "", nums, 3, 64, ids);
	assert_true(n >= 3);
	/* the whole output forced: everything is taken, the grammar can end at once */
	n = jump_check("root ::= \"hello world, all forced\"\n", "", NULL, 0, 64, ids);
	{
		int32_t want[64];
		size_t nw;
		struct hearth_error err;
		const char *t = "hello world, all forced";
		assert_int_equal(tok_encode(vocab_tok, t, strlen(t), false, false, want, 64, &nw, &err), 0);
		assert_int_equal(n, nw);
		assert_memory_equal(ids, want, nw * sizeof *ids);
	}
	/* max_ids bounds the jump; nothing forced, nothing jumped */
	assert_int_equal(jump_check(person, "", words, 6, 2, ids), 2);
	assert_int_equal(jump_check("root ::= [a-z]+\n", "", NULL, 0, 64, ids), 0);
	assert_int_equal(jump_check(person, "{\"customer_identifier\": \"ab", NULL, 0, 64, ids), 0);
}

static void test_grammar_jump_on_sentencepiece_spells_the_forced_bytes(void **state)
{
	(void)state;
	struct tok *saved_tok = vocab_tok;
	struct grammar_vocab *saved = vocab;
	char path[1024];
	struct gguf_file *f;
	struct hearth_error err = { 0 };
	snprintf(path, sizeof path, "%s/vocab/ggml-vocab-llama-spm.gguf", shared_dir());
	if (gguf_open(&f, path, &err) || tok_load(&vocab_tok, f, &err))
		fail_msg("%s", err.msg);
	gguf_close(f);
	assert_int_equal(grammar_vocab_new(&vocab, vocab_tok, &err), 0);
	int32_t ids[GRAMMAR_JUMP_MAX_BYTES];
	/* SentencePiece puts a space before the text it encodes: a token spelling " {" is not
	 * the forced "{", so only tokens that spell the forced bytes exactly are taken */
	static const char *const words[] = { "alice", "Bob" };
	jump_check("root ::= \"{\\\"name\\\": \\\"\" [a-zA-Z]+ \"}\"\n", "", words, 0, 64, ids);
	jump_check("root ::= \"{\\\"name\\\": \\\"\" [a-zA-Z]+ \"\\\", \\\"kind\\\": \\\"\" [a-z]+ \"}\"\n",
		   "{\"name\": \"Al\"", NULL, 0, 64, ids);
	grammar_vocab_free(vocab);
	tok_free(vocab_tok);
	vocab = saved;
	vocab_tok = saved_tok;
}

static void test_grammar_mask_apply_sets_disallowed_to_minus_infinity(void **state)
{
	(void)state;
	float logits[70];
	uint32_t bits[3] = { 0x5, 0xffffffffu, 0x20 };
	for (int i = 0; i < 70; i++)
		logits[i] = (float)i;
	grammar_mask_apply(logits, bits, 70);
	for (int i = 0; i < 70; i++) {
		bool keep = i == 0 || i == 2 || (i >= 32 && i < 64) || i == 69;
		if (keep)
			assert_true(logits[i] == (float)i);
		else
			assert_true(isinf(logits[i]) && logits[i] < 0);
	}
}

static void test_grammar_cache_shares_by_text(void **state)
{
	(void)state;
	struct grammar_cache *c;
	struct hearth_error err = { 0 };
	assert_int_equal(grammar_cache_new(&c, vocab, 2, &err), 0);
	struct grammar_index *a, *b, *d, *e;
	const char *t1 = "root ::= \"a\"+\n", *t2 = "root ::= \"b\"+\n";
	assert_int_equal(grammar_cache_get(c, GRAMMAR_GBNF, t1, strlen(t1), &a, &err), 0);
	assert_int_equal(grammar_cache_get(c, GRAMMAR_GBNF, t1, strlen(t1), &b, &err), 0);
	assert_ptr_equal(a, b);
	assert_int_equal(grammar_cache_get(c, GRAMMAR_JSON_OBJECT, NULL, 0, &d, &err), 0);
	assert_int_equal(grammar_cache_get(c, GRAMMAR_GBNF, t2, strlen(t2), &e, &err), 0);
	assert_ptr_not_equal(a, e);
	assert_int_equal(grammar_cache_get(c, GRAMMAR_GBNF, "root ::= x\n", 11, &e, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "'x'"));
	const char *schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}";
	struct grammar_index *s1, *s2;
	assert_int_equal(grammar_cache_get(c, GRAMMAR_JSON_SCHEMA, schema, strlen(schema), &s1, &err), 0);
	assert_int_equal(grammar_cache_get(c, GRAMMAR_JSON_SCHEMA, schema, strlen(schema), &s2, &err), 0);
	assert_ptr_equal(s1, s2);
	assert_true(grammar_accepts(grammar_index_grammar(s1), "{\"a\": 5}", 8));
	assert_false(grammar_accepts(grammar_index_grammar(s1), "{}", 2));
	/* entries evicted from the cache live on while referenced */
	assert_true(grammar_accepts(grammar_index_grammar(a), "aaa", 3));
	grammar_index_unref(a);
	grammar_index_unref(b);
	grammar_index_unref(d);
	grammar_index_unref(s1);
	grammar_index_unref(s2);
	grammar_cache_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_grammar_compiles_every_shared_grammar_and_accepts_its_walks),
		cmocka_unit_test(test_grammar_judges_known_strings),
		cmocka_unit_test(test_grammar_syntax_features),
		cmocka_unit_test(test_grammar_refuses_with_rule_and_position),
		cmocka_unit_test(test_grammar_hostile_inputs_are_bounded),
		cmocka_unit_test(test_grammar_mask_apply_sets_disallowed_to_minus_infinity),
		cmocka_unit_test(test_grammar_masks_equal_brute_force_json),
		cmocka_unit_test(test_grammar_masks_equal_brute_force_c_and_arithmetic),
		cmocka_unit_test(test_grammar_masks_equal_brute_force_unicode_and_small),
		cmocka_unit_test(test_grammar_masks_equal_brute_force_schema),
		cmocka_unit_test(test_grammar_masks_equal_brute_force_sentencepiece),
		cmocka_unit_test(test_grammar_index_of_hostile_grammar_is_bounded),
		cmocka_unit_test(test_grammar_forced_bytes_and_rollback),
		cmocka_unit_test(test_grammar_jump_takes_only_the_stable_tokens_of_forced_text),
		cmocka_unit_test(test_grammar_jump_on_sentencepiece_spells_the_forced_bytes),
		cmocka_unit_test(test_grammar_cache_shares_by_text),
	};
	return cmocka_run_group_tests(tests, load_vocab, free_vocab);
}
