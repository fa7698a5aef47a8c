/* Grammar engine speed on a Qwen3-sized vocabulary (151936 tokens: deepseek-llm's 102400
 * pieces plus GPT-2's, real byte distributions): JSON Schema -> grammar -> index compile time
 * (goal < 50 ms for 10 properties), and the per-token mask cost along random walks (goal:
 * well under 1 ms, so constrained decode keeps >= 0.95x of unconstrained speed).
 * usage: bench/bench_grammar [SCHEMA.json] (needs HEARTH_SHARED for the vocabularies;
 * BENCH_GRAMMAR_CPU=1 adds per-call CPU time, BENCH_GRAMMAR_REUSE=1 resets one matcher) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/engine/gguf.h"
#include "daemon/engine/grammar.h"
#include "daemon/engine/grammar_impl.h"
#include "daemon/engine/json_schema.h"
#include "daemon/engine/tokenizer.h"

#define N_VOCAB 151936

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static struct tok *load(const char *dir, const char *name)
{
	char path[1024];
	struct gguf_file *f;
	struct tok *t;
	struct hearth_error err = { 0 };
	snprintf(path, sizeof path, "%s/vocab/%s", dir, name);
	if (gguf_open(&f, path, &err) || tok_load(&t, f, &err)) {
		fprintf(stderr, "bench_grammar: %s\n", err.msg);
		exit(1);
	}
	gguf_close(f);
	return t;
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "bench_grammar: cannot open %s\n", path);
		exit(1);
	}
	static char buf[1 << 20];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	return buf;
}

static double cpu_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	const char *dir = getenv("HEARTH_SHARED");
	const char *src = getenv("HEARTH_SRCDIR");
	if (!dir) {
		fprintf(stderr, "bench_grammar: set HEARTH_SHARED\n");
		return 1;
	}
	char schema_path[1024];
	snprintf(schema_path, sizeof schema_path, "%s/tests/support/schemas/ten_properties.json", src ? src : ".");
	const char *schema = slurp(argc > 1 ? argv[1] : schema_path);

	struct tok *a = load(dir, "ggml-vocab-deepseek-llm.gguf"), *b = load(dir, "ggml-vocab-gpt-2.gguf");
	char **pieces = malloc(N_VOCAB * sizeof *pieces);
	size_t *lens = malloc(N_VOCAB * sizeof *lens);
	int32_t eog = tok_eos(a);
	for (int32_t id = 0; id < N_VOCAB; id++) {
		const struct tok *t = id < tok_n_vocab(a) ? a : b;
		int32_t tid = id < tok_n_vocab(a) ? id : id - tok_n_vocab(a);
		char buf[1024];
		size_t n = tok_piece(t, tid, false, buf, sizeof buf);
		if (n > sizeof buf)
			n = 0;
		pieces[id] = malloc(n + 1);
		memcpy(pieces[id], buf, n);
		lens[id] = n;
	}
	struct hearth_error err = { 0 };
	struct grammar_vocab *v;
	double t0 = now_ms();
	if (grammar_vocab_new_pieces(&v, (const char *const *)pieces, lens, N_VOCAB, &eog, 1, &err)) {
		fprintf(stderr, "bench_grammar: %s\n", err.msg);
		return 1;
	}
	printf("vocabulary: %d tokens, trie built once in %.1f ms\n", N_VOCAB, now_ms() - t0);

	/* compile + precompute, cold each time (a fresh cache per run) */
	double best = 1e30, total = 0, cpu_best = 1e30;
	struct grammar_index *ix = NULL;
	const int runs = 5;
	for (int r = 0; r < runs; r++) {
		struct grammar_cache *c;
		grammar_cache_new(&c, v, 4, &err);
		double s = now_ms(), sc = cpu_ms();
		if (grammar_cache_get(c, GRAMMAR_JSON_SCHEMA, schema, strlen(schema), &ix, &err)) {
			fprintf(stderr, "bench_grammar: %s\n", err.msg);
			return 1;
		}
		double e = now_ms() - s, ec = cpu_ms() - sc;
		if (ec < cpu_best)
			cpu_best = ec;
		total += e;
		if (e < best)
			best = e;
		double s2 = now_ms();
		struct grammar_index *again;
		grammar_cache_get(c, GRAMMAR_JSON_SCHEMA, schema, strlen(schema), &again, &err);
		double hit = now_ms() - s2;
		grammar_index_unref(again);
		if (r == runs - 1)
			printf("cache hit: %.4f ms\n", hit);
		grammar_cache_free(c);
		if (r < runs - 1)
			grammar_index_unref(ix);
	}
	printf("schema -> grammar -> token index: best %.1f ms, mean %.1f ms over %d cold runs, best CPU time %.1f ms "
	       "(goal < 50 ms)\n", best, total / runs, runs, cpu_best);
	{
		/* the parts: schema to GBNF to automaton, then the token index */
		json_t *j = json_loads(schema, 0, NULL);
		char *gbnf = NULL;
		struct grammar *g = NULL;
		struct grammar_index *ix2 = NULL;
		double s = now_ms();
		json_schema_to_gbnf(j, &gbnf, &err);
		double s1 = now_ms();
		grammar_compile(&g, gbnf, strlen(gbnf), &err);
		double s2 = now_ms();
		grammar_index_new(&ix2, g, v, &err);
		double s3 = now_ms();
		printf("  of which: schema -> GBNF %.2f ms, GBNF -> automaton %.2f ms (%u nodes), token index %.1f ms\n",
		       s1 - s, s2 - s1, grammar_index_grammar(ix2)->n_nodes, s3 - s2);
		grammar_index_unref(ix2);
		free(gbnf);
		json_decref(j);
	}

	/* per-token mask cost along random walks */
	uint32_t words = (N_VOCAB + 31) / 32;
	uint32_t *bits = malloc(words * 4);
	int32_t *allowed = malloc(N_VOCAB * sizeof *allowed);
	float *logits = malloc(N_VOCAB * sizeof *logits);
	size_t cap = 1 << 16, n_t = 0, forced_total = 0, steps_total = 0;
	double *times = malloc(cap * sizeof *times), apply_total = 0, cpu_fill = 0;
	uint64_t seed = 42;
	bool reuse = getenv("BENCH_GRAMMAR_REUSE") != NULL;
	bool cpu_clock = getenv("BENCH_GRAMMAR_CPU") != NULL;
	struct grammar_matcher *warm = NULL;
	if (reuse)
		grammar_matcher_new(&warm, ix, &err);
	for (int walk = 0; walk < 20; walk++) {
		struct grammar_matcher *m = warm;
		if (reuse)
			grammar_matcher_reset(m, &err);
		else
			grammar_matcher_new(&m, ix, &err);
		static char text[1 << 16];
		size_t tlen = 0;
		for (int step = 0; step < 400; step++) {
			/* CPU time per call only on request: the clock is a system call, and on a
			 * loaded machine each one is a chance to be descheduled */
			double sc = cpu_clock ? cpu_ms() : 0, s = now_ms();
			if (grammar_matcher_fill_mask(m, bits, &err)) {
				fprintf(stderr, "bench_grammar: %s\n", err.msg);
				return 1;
			}
			double e = now_ms() - s;
			if (cpu_clock)
				cpu_fill += cpu_ms() - sc;
			if (e > 3 && getenv("BENCH_GRAMMAR_VERBOSE"))
				printf("  slow mask %.1f ms after: %.*s\n", e, (int)(tlen < 300 ? tlen : 300),
				       tlen < 300 ? text : text + tlen - 300);
			if (n_t < cap)
				times[n_t++] = e;
			for (int32_t i = 0; i < N_VOCAB; i++)
				logits[i] = (float)(i % 7);
			s = now_ms();
			grammar_mask_apply(logits, bits, N_VOCAB);
			apply_total += now_ms() - s;
			int32_t na = 0;
			for (int32_t i = 0; i < N_VOCAB; i++)
				if (bits[i >> 5] >> (i & 31) & 1)
					allowed[na++] = i;
			if (na == 0)
				break;
			/* a model would mostly continue in place; structure comes in short pieces */
			int32_t pick = allowed[rnd(&seed) % (uint64_t)na];
			bool structural = rnd(&seed) % 3 == 0;
			for (int tries = 0; structural && tries < 400; tries++) {
				int32_t c = allowed[rnd(&seed) % (uint64_t)na];
				if (c == eog || (lens[c] > 0 && lens[c] <= 2) || memchr(pieces[c], '"', lens[c])) {
					pick = c;
					break;
				}
			}
			if (grammar_matcher_accept_token(m, pick, &err)) {
				fprintf(stderr, "bench_grammar: %s\n", err.msg);
				return 1;
			}
			steps_total++;
			if (tlen + lens[pick] < sizeof text) {
				memcpy(text + tlen, pieces[pick], lens[pick]);
				tlen += lens[pick];
			}
			char fb[256];
			forced_total += grammar_matcher_forced_bytes(m, fb, sizeof fb);
			if (grammar_matcher_is_done(m))
				break;
		}
		if (!reuse)
			grammar_matcher_free(m);
	}
	grammar_matcher_free(warm);
	qsort(times, n_t, sizeof *times, cmp_d);
	double sum = 0;
	for (size_t i = 0; i < n_t; i++)
		sum += times[i];
	printf("fill_mask (%s matcher per walk) over %zu steps of 20 random walks: mean %.4f ms, p50 %.4f, p90 %.4f, p99 %.4f, max %.3f ms\n",
	       reuse ? "one reset" : "a new", n_t, sum / (double)n_t, times[n_t / 2], times[n_t * 9 / 10], times[n_t * 99 / 100], times[n_t - 1]);
	if (cpu_clock)
		printf("fill_mask CPU time: mean %.4f ms\n", cpu_fill / (double)n_t);
	printf("mask apply on %d logits: mean %.4f ms\n", N_VOCAB, apply_total / (double)n_t);
	printf("jump-forward: %.2f forced bytes per step on average\n", (double)forced_total / (double)steps_total);
	grammar_index_unref(ix);
	grammar_vocab_free(v);
	for (int32_t id = 0; id < N_VOCAB; id++)
		free(pieces[id]);
	free(pieces);
	free(lens);
	free(bits);
	free(allowed);
	free(logits);
	free(times);
	tok_free(a);
	tok_free(b);
	return 0;
}
