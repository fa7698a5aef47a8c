/* Tokenizer against llama.cpp's own test vectors ($HEARTH_SHARED/vocab: real vocabularies
 * with NAME.gguf.inp strings and NAME.gguf.out ids), plus hand-derived cases for special
 * tokens, BOS, end-of-generation ids, streaming decode and hostile input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/engine/gguf.h"
#include "daemon/engine/tokenizer.h"
#include "tests/support/gguf_build.h"

#define MAX_IDS 4096

static const char *shared_dir(void)
{
	const char *dir = getenv("HEARTH_SHARED");
	if (!dir || !*dir)
		fail_msg("HEARTH_SHARED is not set: point it at the shared folder holding vocab/ "
			 "(make check sets it)");
	return dir;
}

static struct tok *load_vocab(const char *name)
{
	char path[1024];
	struct gguf_file *f;
	struct tok *t;
	struct hearth_error err = { 0 };
	snprintf(path, sizeof(path), "%s/vocab/%s.gguf", shared_dir(), name);
	if (gguf_open(&f, path, &err))
		fail_msg("%s", err.msg);
	if (tok_load(&t, f, &err))
		fail_msg("%s", err.msg);
	gguf_close(f); /* the tokenizer must not point into the mapping */
	return t;
}

static char *read_file(const char *path, size_t *len)
{
	FILE *fp = fopen(path, "rb");
	if (!fp)
		fail_msg("cannot open %s", path);
	fseek(fp, 0, SEEK_END);
	long n = ftell(fp);
	fseek(fp, 0, SEEK_SET);
	char *buf = malloc((size_t)n + 1);
	assert_non_null(buf);
	assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
	buf[n] = 0;
	fclose(fp);
	*len = (size_t)n;
	return buf;
}

static size_t encode(const struct tok *t, const char *s, size_t len, bool bos, bool special, int32_t *ids)
{
	size_t n;
	struct hearth_error err = { 0 };
	if (tok_encode(t, s, len, bos, special, ids, MAX_IDS, &n, &err))
		fail_msg("encode: %s", err.msg);
	return n;
}

static size_t encode_str(const struct tok *t, const char *s, bool bos, bool special, int32_t *ids)
{
	return encode(t, s, strlen(s), bos, special, ids);
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
	fprintf(stderr, "#   %s:", what);
	for (size_t i = 0; i < n; i++)
		fprintf(stderr, " %d", ids[i]);
	fprintf(stderr, "\n");
}

/* Splits the .inp as llama.cpp's test-tokenizer-0 does: on "\n__ggml_vocab_test__\n",
 * nothing after the last separator; one .out line of ids per string. */
static void run_vectors(const char *name)
{
	char path[1024];
	size_t inp_len, out_len;
	snprintf(path, sizeof(path), "%s/vocab/%s.gguf.inp", shared_dir(), name);
	char *inp = read_file(path, &inp_len);
	snprintf(path, sizeof(path), "%s/vocab/%s.gguf.out", shared_dir(), name);
	char *out = read_file(path, &out_len);
	struct tok *t = load_vocab(name);

	static const char sep[] = "\n__ggml_vocab_test__\n";
	size_t pos = 0, line = 0, cases = 0, enc_fail = 0, dec_fail = 0;
	char *outp = out;
	static int32_t ids[MAX_IDS], want[MAX_IDS];
	static char text[65536];
	while (pos < inp_len) {
		const char *next = memmem(inp + pos, inp_len - pos, sep, sizeof(sep) - 1);
		size_t len = next ? (size_t)(next - (inp + pos)) : inp_len - pos;
		const char *s = inp + pos;
		pos = next ? (size_t)(next - inp) + sizeof(sep) - 1 : inp_len;

		char *eol = strchr(outp, '\n');
		if (!eol)
			fail_msg("%s: .out has fewer lines than .inp has strings", name);
		*eol = 0;
		size_t nw = 0;
		for (char *p = outp; *p;) {
			char *end;
			long v = strtol(p, &end, 10);
			if (end == p)
				break;
			want[nw++] = (int32_t)v;
			p = end;
		}
		outp = eol + 1;
		line++;
		cases++;

		size_t n = encode(t, s, len, false, false, ids);
		if (n != nw || memcmp(ids, want, n * sizeof(*ids)) != 0) {
			enc_fail++;
			fprintf(stderr, "# %s case %zu (%.*s): ids differ\n", name, line, (int)(len > 60 ? 60 : len), s);
			print_ids("llama.cpp", want, nw);
			print_ids("hearth   ", ids, n);
		}
		size_t dn;
		struct hearth_error err = { 0 };
		if (tok_decode(t, want, nw, false, text, sizeof(text), &dn, &err))
			fail_msg("%s: %s", name, err.msg);
		if (dn != len || memcmp(text, s, len) != 0) {
			dec_fail++;
			fprintf(stderr, "# %s case %zu: decode gives '%.*s', input was '%.*s'\n", name, line,
				(int)dn, text, (int)len, s);
		}
	}
	fprintf(stderr, "# %s: %zu cases, %zu encode and %zu decode mismatches\n", name, cases,
		enc_fail, dec_fail);
	assert_int_equal(*outp, 0); /* every .out line used */
	assert_true(cases > 40);
	assert_int_equal(enc_fail, 0);
	assert_int_equal(dec_fail, 0);
	tok_free(t);
	free(inp);
	free(out);
}

static void test_tokenizer_matches_llama_spm_vectors(void **state) { run_vectors("ggml-vocab-llama-spm"); }
static void test_tokenizer_matches_phi3_vectors(void **state) { run_vectors("ggml-vocab-phi-3"); }
static void test_tokenizer_matches_gpt2_vectors(void **state) { run_vectors("ggml-vocab-gpt-2"); }
static void test_tokenizer_matches_deepseek_llm_vectors(void **state) { run_vectors("ggml-vocab-deepseek-llm"); }
static void test_tokenizer_matches_qwen2_split_vectors(void **state) { run_vectors("ggml-vocab-gpt-2-pre-qwen2"); }
static void test_tokenizer_matches_llama3_split_vectors(void **state) { run_vectors("ggml-vocab-gpt-2-pre-llama-bpe"); }

/* " this is 🦙.cpp" in Llama 2: the llama has no token, so its four bytes come as
 * <0xF0><0x9F><0xA6><0x99> (243 162 169 156 in llama.cpp's vector). Streaming must hold
 * the first three back and release the emoji whole. */
static void test_tokenizer_stream_holds_split_emoji(void **state)
{
	struct tok *t = load_vocab("ggml-vocab-llama-spm");
	static const int32_t ids[] = { 445, 338, 29871, 243, 162, 169, 156, 29889, 8223 };
	struct tok_stream st;
	char out[256], all[256];
	size_t total = 0;
	tok_stream_init(&st);
	for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
		size_t n = tok_stream_push(t, &st, ids[i], false, out, sizeof(out));
		assert_true(n <= tok_stream_bound(t));
		if (i >= 3 && i <= 5)
			assert_int_equal(n, 0); /* incomplete emoji: nothing yet */
		if (i == 6) {
			assert_int_equal(n, 4);
			assert_memory_equal(out, "\xf0\x9f\xa6\x99", 4);
		}
		memcpy(all + total, out, n);
		total += n;
	}
	total += tok_stream_flush(&st, all + total, sizeof(all) - total);
	assert_int_equal(total, strlen(" this is \xf0\x9f\xa6\x99.cpp"));
	assert_memory_equal(all, " this is \xf0\x9f\xa6\x99.cpp", total);

	/* raw pieces of the byte tokens really are single bytes */
	char b[8];
	assert_int_equal(tok_piece(t, 243, false, b, sizeof(b)), 1);
	assert_int_equal((unsigned char)b[0], 0xF0);
	tok_free(t);
}

static void test_tokenizer_stream_replaces_invalid_utf8(void **state)
{
	struct tok *t = load_vocab("ggml-vocab-llama-spm");
	struct tok_stream st;
	char out[64];
	/* <0xFF> (id 3 + 0xFF) can never start UTF-8 */
	tok_stream_init(&st);
	assert_int_equal(tok_stream_push(t, &st, 3 + 0xFF, false, out, sizeof(out)), 3);
	assert_memory_equal(out, "\xef\xbf\xbd", 3);
	/* <0xF0><0x9F> then 'a' (id 29874 is "a"): the broken prefix becomes one U+FFFD */
	assert_int_equal(tok_stream_push(t, &st, 3 + 0xF0, false, out, sizeof(out)), 0);
	assert_int_equal(tok_stream_push(t, &st, 3 + 0x9F, false, out, sizeof(out)), 0);
	size_t n = tok_stream_push(t, &st, 29874, false, out, sizeof(out));
	assert_int_equal(n, 4);
	assert_memory_equal(out, "\xef\xbf\xbd" "a", 4);
	/* an incomplete tail at the end is flushed as U+FFFD */
	assert_int_equal(tok_stream_push(t, &st, 3 + 0xE2, false, out, sizeof(out)), 0);
	assert_int_equal(tok_stream_flush(&st, out, sizeof(out)), 3);
	assert_memory_equal(out, "\xef\xbf\xbd", 3);
	assert_int_equal(tok_stream_flush(&st, out, sizeof(out)), 0);
	/* too small a buffer: nothing consumed, the needed size returned */
	tok_stream_init(&st);
	assert_int_equal(tok_stream_push(t, &st, 3 + 0xFF, false, out, 2), 3);
	assert_int_equal(st.n_pend, 0);
	tok_free(t);
}

static void test_tokenizer_parses_special_tokens_on_request(void **state)
{
	static int32_t ids[MAX_IDS], hi[MAX_IDS];
	struct tok *t = load_vocab("ggml-vocab-phi-3");
	/* Phi-3 marks its special tokens rstrip (llama.cpp, by model name): the "\n" after
	 * <|user|> goes, and "Hi" is encoded as text that starts the input (leading space). */
	size_t nh = encode_str(t, "Hi", false, false, hi);
	size_t n = encode_str(t, "<|user|>\nHi<|end|>", false, true, ids);
	assert_int_equal(n, nh + 2);
	assert_int_equal(ids[0], 32010);
	assert_memory_equal(ids + 1, hi, nh * sizeof(*ids));
	assert_int_equal(ids[n - 1], 32007);
	/* without parse_special control tokens are plain text */
	n = encode_str(t, "<|user|>", false, false, ids);
	assert_true(n > 1);
	for (size_t i = 0; i < n; i++)
		assert_true(ids[i] != 32010);
	/* Phi-3 stores "</s>" as user-defined, but llama.cpp's end-of-generation list makes it
	 * a control token: matched only with parse_special */
	n = encode_str(t, "a</s>", false, true, ids);
	assert_int_equal(ids[n - 1], 2);
	assert_true(tok_is_eog(t, 2));
	n = encode_str(t, "a</s>", false, false, ids);
	assert_true(ids[n - 1] != 2);
	char buf[64];
	size_t dn;
	struct hearth_error err;
	assert_int_equal(tok_decode(t, (int32_t[]){ 32010 }, 1, true, buf, sizeof(buf), &dn, &err), 0);
	assert_int_equal(dn, 8);
	assert_memory_equal(buf, "<|user|>", 8);
	assert_int_equal(tok_decode(t, (int32_t[]){ 32010 }, 1, false, buf, sizeof(buf), &dn, &err), 0);
	assert_int_equal(dn, 0);
	tok_free(t);

	t = load_vocab("ggml-vocab-gpt-2");
	n = encode_str(t, "a<|endoftext|>b", false, true, ids);
	assert_int_equal(n, 3);
	assert_int_equal(ids[1], 50256);
	n = encode_str(t, "a<|endoftext|>b", false, false, ids);
	assert_true(n > 3);
	for (size_t i = 0; i < n; i++)
		assert_true(ids[i] != 50256);
	tok_free(t);

	/* DeepSeek's added "ø" (user-defined, raw UTF-8) wins over byte-level BPE */
	t = load_vocab("ggml-vocab-deepseek-llm");
	n = encode_str(t, "\xc3\xb8", false, false, ids);
	assert_int_equal(n, 1);
	assert_int_equal(ids[0], 100002);
	tok_free(t);
}

static void test_tokenizer_adds_bos_and_knows_eog(void **state)
{
	static int32_t ids[MAX_IDS], plain[MAX_IDS];
	struct tok *t = load_vocab("ggml-vocab-llama-spm");
	assert_true(tok_add_bos(t));
	assert_int_equal(tok_bos(t), 1);
	assert_int_equal(tok_eos(t), 2);
	assert_int_equal(tok_n_vocab(t), 32000);
	size_t np = encode_str(t, "Hello world", false, false, plain);
	size_t n = encode_str(t, "Hello world", true, false, ids);
	assert_int_equal(n, np + 1);
	assert_int_equal(ids[0], 1);
	assert_memory_equal(ids + 1, plain, np * sizeof(*ids));
	assert_true(tok_is_eog(t, 2));
	assert_false(tok_is_eog(t, 1));
	assert_true(tok_is_control(t, 1));
	tok_free(t);

	t = load_vocab("ggml-vocab-phi-3");
	assert_true(tok_is_eog(t, 32000)); /* eos <|endoftext|> */
	assert_true(tok_is_eog(t, 32007)); /* <|end|> */
	assert_int_equal(tok_eot(t), 32007);
	assert_false(tok_is_eog(t, 32010));
	tok_free(t);

	t = load_vocab("ggml-vocab-gpt-2");
	assert_false(tok_add_bos(t)); /* no add_bos_token key, gpt-2 default */
	assert_int_equal(tok_bos(t), 50256);
	assert_true(tok_is_eog(t, 50256));
	tok_free(t);

	t = load_vocab("ggml-vocab-gpt-2-pre-llama-bpe");
	assert_true(tok_add_bos(t)); /* the Llama 3 pre-tokenizer defaults to a BOS */
	tok_free(t);
}

static void test_tokenizer_reports_needed_capacity(void **state)
{
	struct tok *t = load_vocab("ggml-vocab-gpt-2");
	int32_t ids[2];
	size_t n;
	struct hearth_error err = { 0 };
	/* "Hello world" -> 15496 995 */
	assert_int_equal(tok_encode(t, "Hello world", 11, false, false, ids, 1, &n, &err), HEARTH_ERANGE);
	assert_int_equal(n, 2);
	assert_int_equal(tok_encode(t, "Hello world", 11, false, false, ids, 2, &n, &err), 0);
	assert_int_equal(ids[0], 15496);
	assert_int_equal(ids[1], 995);
	char buf[4];
	assert_int_equal(tok_decode(t, ids, 2, false, buf, sizeof(buf), &n, &err), HEARTH_ERANGE);
	assert_int_equal(n, 11);
	assert_int_equal(tok_decode(t, (int32_t[]){ 50257 }, 1, false, buf, sizeof(buf), &n, &err),
			 HEARTH_EINVAL);
	tok_free(t);
}

/* Invalid UTF-8 must not crash. Byte-level BPE reads each bad byte as U+FFFD (llama.cpp's
 * unicode_cpts_from_utf8); SentencePiece keeps the bytes through <0xNN> fallback, except
 * that it cuts symbols by the lead byte alone: the truncated E2 82 swallows the first byte
 * of the following space's U+2581, which then comes back as E2 96 81, not ' ' (llama.cpp
 * does the same). */
static void test_tokenizer_survives_invalid_utf8(void **state)
{
	static const char bad[] = "\xff" "ab\xc3 \xe2\x82 \xed\xa0\x80z\xf8\x80";
	static const char *const names[] = { "ggml-vocab-llama-spm", "ggml-vocab-phi-3",
		"ggml-vocab-gpt-2", "ggml-vocab-deepseek-llm", "ggml-vocab-gpt-2-pre-qwen2",
		"ggml-vocab-gpt-2-pre-llama-bpe" };
	static int32_t ids[MAX_IDS];
	char out[256];
	for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
		struct tok *t = load_vocab(names[k]);
		size_t n = encode(t, bad, sizeof(bad) - 1, false, false, ids), dn;
		struct hearth_error err;
		assert_int_equal(tok_decode(t, ids, n, false, out, sizeof(out), &dn, &err), 0);
		if (k < 2) {
			static const char want[] = "\xff" "ab\xc3 \xe2\x82\xe2\x96\x81\xed\xa0\x80z\xf8\x80";
			assert_int_equal(dn, sizeof(want) - 1);
			assert_memory_equal(out, want, dn);
		} else {
			/* FF -> FFFD; C3 (no continuation) -> FFFD; E2 82 (truncated) -> FFFD FFFD
			 * (one per byte, as llama.cpp); the surrogate ED A0 80 decodes as written;
			 * F8 and 80 -> FFFD each */
			static const char want[] = "\xef\xbf\xbd" "ab" "\xef\xbf\xbd" " "
						   "\xef\xbf\xbd\xef\xbf\xbd" " " "\xed\xa0\x80" "z"
						   "\xef\xbf\xbd\xef\xbf\xbd";
			assert_int_equal(dn, sizeof(want) - 1);
			assert_memory_equal(out, want, dn);
		}
		tok_free(t);
	}
}

/* 102,400 tokens and 99,757 merges: hash tables, so loading takes milliseconds. CPU time,
 * not wall time: the test machine is shared. */
static void test_tokenizer_loads_large_vocab_fast(void **state)
{
	char path[1024];
	struct gguf_file *f;
	struct tok *t;
	struct hearth_error err = { 0 };
	snprintf(path, sizeof(path), "%s/vocab/ggml-vocab-deepseek-llm.gguf", shared_dir());
	if (gguf_open(&f, path, &err))
		fail_msg("%s", err.msg);
	struct timespec a, b;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
	if (tok_load(&t, f, &err))
		fail_msg("%s", err.msg);
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
	double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
	fprintf(stderr, "# deepseek-llm vocabulary loaded in %.1f ms of CPU\n", ms);
	assert_true(ms < 250); /* ~80M instructions: 20-40 ms */
	tok_free(t);
	gguf_close(f);
}

/* ---- synthetic vocabularies, written with tests/support/gguf_build ---- */

struct synth {
	const char *model, *pre;
	const char *const *tokens;
	size_t n_tokens;
	const char *const *merges;
	size_t n_merges;
	bool float_types;      /* token_type as float32: malformed */
	size_t n_scores;       /* SPM scores given (0: none) */
	int64_t bos;           /* < 0: no key */
	bool add_bos;
};

/* Writes s to a temporary file and loads it; returns tok_load's code. */
static int synth_load(const struct synth *sy, struct tok **t, struct hearth_error *err)
{
	char path[] = "/tmp/hearth-test-tok-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	FILE *fp = fdopen(fd, "wb");
	assert_non_null(fp);
	struct gguf_build *b;
	assert_int_equal(gguf_build_new(&b, 3, err), 0);
	assert_int_equal(gguf_build_kv_str(b, "tokenizer.ggml.model", sy->model), 0);
	if (sy->pre)
		assert_int_equal(gguf_build_kv_str(b, "tokenizer.ggml.pre", sy->pre), 0);
	assert_int_equal(gguf_build_kv_arr_str(b, "tokenizer.ggml.tokens", sy->tokens, sy->n_tokens), 0);
	if (sy->merges)
		assert_int_equal(gguf_build_kv_arr_str(b, "tokenizer.ggml.merges", sy->merges, sy->n_merges), 0);
	if (sy->float_types) {
		float ty[64] = { 0 };
		assert_int_equal(gguf_build_kv_arr(b, "tokenizer.ggml.token_type", GGUF_VT_FLOAT32, ty,
						   sy->n_tokens), 0);
	}
	if (sy->n_scores) {
		float sc[64] = { 0 };
		assert_int_equal(gguf_build_kv_arr(b, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, sc,
						   sy->n_scores), 0);
	}
	if (sy->bos >= 0)
		assert_int_equal(gguf_build_kv_u32(b, "tokenizer.ggml.bos_token_id", (uint32_t)sy->bos), 0);
	assert_int_equal(gguf_build_kv_bool(b, "tokenizer.ggml.add_bos_token", sy->add_bos), 0);
	assert_int_equal(gguf_build_write_header(b, fp, err), 0);
	gguf_build_free(b);
	fclose(fp);

	struct gguf_file *f;
	if (gguf_open(&f, path, err))
		fail_msg("%s", err->msg);
	int rc = tok_load(t, f, err);
	gguf_close(f);
	unlink(path);
	return rc;
}

/* "Ġ" is GPT-2's code point for the byte ' ' */
static const char *const bpe_tokens[] = { "a", ",", "\xc4\xa0", "1", "2", "3", "4", "5",
	"a,", "\xc4\xa0" "1", "12", "34", "123", "45" };
static const char *const bpe_merges[] = { "a ,", "\xc4\xa0 1", "3 4", "1 2", "12 3", "4 5" };

#define SYNTH_BPE(pre_) { "gpt2", pre_, bpe_tokens, 14, bpe_merges, 6, false, 0, -1, false }

/* llama.cpp's default BPE pre-tokenizer (no or "default" tokenizer.ggml.pre) runs four
 * regexes in turn: punctuation runs, the GPT-2 split, \p{N}+, then [0-9]{3}. Each split
 * keeps a merge from firing: "a ," (rank 0) cannot join across the punctuation split,
 * "Ġ 1" (rank 1) not across the number split, "3 4" (rank 2) not across the 3-digit
 * split, so "a, 12345" must come out as a , Ġ 123 45 (ids 0 1 2 12 13). */
static void test_tokenizer_default_bpe_splits_like_llama_cpp(void **state)
{
	struct tok *t;
	struct hearth_error err = { 0 };
	int32_t ids[16];
	struct synth sy = SYNTH_BPE("default");
	if (synth_load(&sy, &t, &err))
		fail_msg("%s", err.msg);
	size_t n = encode_str(t, "a, 12345", false, false, ids);
	static const int32_t want[] = { 0, 1, 2, 12, 13 };
	assert_int_equal(n, 5);
	assert_memory_equal(ids, want, sizeof(want));
	tok_free(t);

	/* the plain GPT-2 split keeps " 12345" whole, so Ġ1 2 34 5 (rank 1, then 2; "12" never
	 * forms), while "a" (letters) and "," (punctuation) are still apart */
	sy.pre = "gpt-2";
	if (synth_load(&sy, &t, &err))
		fail_msg("%s", err.msg);
	n = encode_str(t, "a, 12345", false, false, ids);
	static const int32_t want_gpt2[] = { 0, 1, 9, 4, 11, 7 };
	assert_int_equal(n, 6);
	assert_memory_equal(ids, want_gpt2, sizeof(want_gpt2));
	tok_free(t);
}

static void test_tokenizer_rejects_malformed_vocab(void **state)
{
	struct tok *t = NULL;
	struct hearth_error err = { 0 };
	static const char *const dup[] = { "a", "b", "a" };

	struct synth sy = SYNTH_BPE("default");
	sy.model = "bert";
	assert_int_equal(synth_load(&sy, &t, &err), HEARTH_EUNSUPPORTED);
	assert_null(t);
	assert_non_null(strstr(err.msg, "bert"));

	sy = (struct synth)SYNTH_BPE("no-such-pre");
	assert_int_equal(synth_load(&sy, &t, &err), HEARTH_EUNSUPPORTED);
	assert_non_null(strstr(err.msg, "no-such-pre"));

	sy = (struct synth)SYNTH_BPE("gpt-2");
	sy.merges = NULL; /* BPE without merges */
	assert_int_equal(synth_load(&sy, &t, &err), HEARTH_ENOTFOUND);
	assert_non_null(strstr(err.msg, "merges"));

	sy = (struct synth)SYNTH_BPE("gpt-2");
	sy.tokens = dup;
	sy.n_tokens = 3;
	assert_int_equal(synth_load(&sy, &t, &err), HEARTH_EFORMAT);
	assert_non_null(strstr(err.msg, "duplicate"));

	sy = (struct synth)SYNTH_BPE("gpt-2");
	sy.float_types = true;
	assert_int_equal(synth_load(&sy, &t, &err), HEARTH_EFORMAT);
	assert_non_null(strstr(err.msg, "token_type"));

	sy = (struct synth){ "llama", NULL, bpe_tokens, 14, NULL, 0, false, 13, -1, false };
	assert_int_equal(synth_load(&sy, &t, &err), HEARTH_EFORMAT); /* 13 scores for 14 tokens */
	assert_non_null(strstr(err.msg, "scores"));

	/* add_bos_token needs a BOS: ids out of range fall back to the default, and that
	 * must exist too */
	sy = (struct synth)SYNTH_BPE("gpt-2");
	sy.add_bos = true; /* BPE's default BOS id 11 exists here: fine */
	if (synth_load(&sy, &t, &err))
		fail_msg("%s", err.msg);
	assert_int_equal(tok_bos(t), 11);
	tok_free(t);
	sy.tokens = dup;
	sy.n_tokens = 1; /* SPM's default BOS 1 and the given 7 are both out of range */
	sy.merges = NULL;
	sy.model = "llama";
	sy.bos = 7;
	assert_int_equal(synth_load(&sy, &t, &err), HEARTH_EFORMAT);
	assert_non_null(strstr(err.msg, "BOS"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tokenizer_matches_llama_spm_vectors),
		cmocka_unit_test(test_tokenizer_matches_phi3_vectors),
		cmocka_unit_test(test_tokenizer_matches_gpt2_vectors),
		cmocka_unit_test(test_tokenizer_matches_deepseek_llm_vectors),
		cmocka_unit_test(test_tokenizer_matches_qwen2_split_vectors),
		cmocka_unit_test(test_tokenizer_matches_llama3_split_vectors),
		cmocka_unit_test(test_tokenizer_stream_holds_split_emoji),
		cmocka_unit_test(test_tokenizer_stream_replaces_invalid_utf8),
		cmocka_unit_test(test_tokenizer_parses_special_tokens_on_request),
		cmocka_unit_test(test_tokenizer_adds_bos_and_knows_eog),
		cmocka_unit_test(test_tokenizer_reports_needed_capacity),
		cmocka_unit_test(test_tokenizer_survives_invalid_utf8),
		cmocka_unit_test(test_tokenizer_loads_large_vocab_fast),
		cmocka_unit_test(test_tokenizer_default_bpe_splits_like_llama_cpp),
		cmocka_unit_test(test_tokenizer_rejects_malformed_vocab),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
