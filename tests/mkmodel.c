/* mkmodel: writes GGUF models that llama.cpp also loads (llama, qwen2, qwen3, gemma3 at any
 * shape, weights F32/F16/BF16/Q8_0/Q4_0): seeded synthetic ones for tests and benchmarks, written
 * one row block at a time, or trained ones (--weights, --spm-vocab from bench/train/train.py). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/engine/gguf.h"
#include "kernels/quant.h"
#include "protocol/error.h"
#include "tests/support/gguf_build.h"

enum mk_arch { MK_LLAMA, MK_QWEN2, MK_QWEN3, MK_GEMMA3 };
static const char *const mk_arch_names[] = { "llama", "qwen2", "qwen3", "gemma3" };
#define MK_N_ARCH (sizeof mk_arch_names / sizeof mk_arch_names[0])

struct mk_shape {
	uint32_t n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_ctx;
	uint64_t n_vocab;    /* 0: the vocabulary's own size */
	float rope_theta, rms_eps;
	bool tied;
};

/* gemma3's attention settings: the sliding window (0: the key is not written), the period of
 * global layers (0: the key is not written and llama.cpp assumes 6, as for every converted
 * Gemma 3), linear RoPE scaling of the global layers (0: none), the final logit softcap
 * (0: none). */
struct mk_swa {
	uint32_t n_swa, swa_period;
	float rope_scale, softcap;
};

/* The presets' windows (config.json's sliding_window), by preset name. */
static const struct {
	const char *preset;
	uint32_t n_swa;
} mk_preset_windows[] = {
	{ "gemma-3-270m", 512 },
	{ "gemma-3-1b", 512 },
};

struct mk_preset {
	const char *name;
	enum mk_arch arch;
	struct mk_shape shape;
};

/* The real models' shapes (their config.json); head_dim 0 means n_embd / n_head. Llama 3.2's
 * rope scaling is in mk_preset_rope_freqs below. */
static const struct mk_preset mk_presets[] = {
	{ "tiny", MK_LLAMA, { 64, 2, 4, 2, 0, 192, 2048, 0, 10000.0f, 1e-5f, true } },
	{ "qwen3-0.6b", MK_QWEN3, { 1024, 28, 16, 8, 128, 3072, 40960, 151936, 1e6f, 1e-6f, true } },
	{ "qwen3-1.7b", MK_QWEN3, { 2048, 28, 16, 8, 128, 6144, 40960, 151936, 1e6f, 1e-6f, true } },
	{ "llama-3.2-1b", MK_LLAMA, { 2048, 16, 32, 8, 64, 8192, 131072, 128256, 500000.0f, 1e-5f, true } },
	/* Gemma 3: one KV head of 256, a 512-position window on five of every six layers. */
	{ "gemma-3-270m", MK_GEMMA3, { 640, 18, 4, 1, 256, 2048, 32768, 262144, 1e6f, 1e-6f, true } },
	{ "gemma-3-1b", MK_GEMMA3, { 1152, 26, 4, 1, 256, 6912, 32768, 262144, 1e6f, 1e-6f, true } },
};

/* Llama 3's RoPE frequency correction (config.json's rope_scaling with rope_type "llama3"),
 * factor 0 for none. llama.cpp's converter writes it as the tensor rope_freqs.weight, one
 * divisor per rotated pair, and no rope.scaling keys; rope_freqs_llama3 has the rule. */
struct mk_rope_freqs {
	float factor, low_freq_factor, high_freq_factor;
	uint32_t orig_ctx; /* original_max_position_embeddings */
};

struct mk_opts {
	const char *out;
	const char *vocab_path;
	const char *chat_template_path; /* tokenizer.chat_template from this file */
	const char *spm_vocab_path;     /* a SentencePiece vocabulary as train.py writes it */
	const char *weights_path;       /* trained weights (.hkw) instead of seeded ones */
	const char *name;
	const struct mk_preset *preset;
	int arch;            /* -1: the preset's */
	enum qtype type;
	uint64_t seed;
	struct mk_rope_freqs rope_freqs;
	bool rope_freqs_given; /* --rope-freqs (perhaps none) instead of the preset's */
	struct mk_shape shape;
	struct mk_shape set; /* nonzero fields: given on the command line */
	int tied;            /* -1: the preset's */
	int pooling;         /* <arch>.pooling_type (llama.cpp's numbering); -1: none written */
	bool add_eos;        /* tokenizer.ggml.add_eos_token: true (Qwen3-Embedding's files) */
	bool no_bos;         /* tokenizer.ggml.add_bos_token: false, whatever the vocabulary's own */
	struct mk_swa swa;
};

/* ---- deterministic numbers: splitmix64 seeds a xorshift64* stream per tensor */

static uint64_t splitmix64(uint64_t x)
{
	x += UINT64_C(0x9E3779B97F4A7C15);
	x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
	x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
	return x ^ (x >> 31);
}

static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * UINT64_C(2685821657736338717);
}

/* Sum of four uniform 16-bit draws, centred and scaled to unit variance: close enough to a
 * normal for weights, and one generator step per value (Box-Muller's log and cos would
 * dominate writing a 1.7B model). */
static float rng_normalish(uint64_t *s)
{
	const uint64_t r = rng_next(s);
	const uint32_t sum = (uint32_t)(r & 0xFFFF) + (uint32_t)((r >> 16) & 0xFFFF) +
			     (uint32_t)((r >> 32) & 0xFFFF) + (uint32_t)(r >> 48);
	return ((float)sum - 131070.0f) * (1.0f / 37837.23f); /* 65536 / sqrt(3) */
}

static uint64_t name_seed(uint64_t seed, const char *name)
{
	uint64_t h = UINT64_C(1469598103934665603); /* FNV-1a */
	for (const char *p = name; *p; p++)
		h = (h ^ (uint8_t)*p) * UINT64_C(1099511628211);
	uint64_t s = splitmix64(seed ^ h);
	return s ? s : 1; /* xorshift must not start at 0 */
}

/* ---- an own byte-level BPE vocabulary, GPT-2 style */

struct mk_vocab {
	char **tokens;
	int32_t *types;     /* llama.cpp token types: 1 normal, 2 unknown, 3 control, 5 unused, 6 byte */
	float *scores;      /* SentencePiece vocabularies only: merge priority, higher first */
	uint64_t n_tokens;
	char **merges;
	uint64_t n_merges;
	uint32_t bos, eos;
};

enum { TOK_NORMAL = 1, TOK_CONTROL = 3, TOK_UNUSED = 5 };

/* Text the merges are learned from; any prose works, it only has to be fixed. */
static const char mk_corpus[] =
	"The lighthouse keeper wrote in the log every evening. The wind came from the west and "
	"the sea was calm; three ships passed the point before night, and one of them stopped "
	"to ask for water. In the morning the keeper walked down to the harbour, where the "
	"fishermen were mending their nets and talking about the weather. Some said the storm "
	"would come on Tuesday, others that it would not come at all. The keeper listened, "
	"then went back to the tower to clean the lamp, as he had done for twenty-seven years.\n"
	"A model reads tokens and writes tokens. It is given a prompt, it computes the logits "
	"for the next token, and a sampler chooses one. Then the new token is appended and the "
	"model runs again, one step at a time, until it writes the end of the text or reaches "
	"the limit. The keys and values of every layer are kept in a cache so that the earlier "
	"tokens are not computed again. Memory is the main cost: 1024 tokens of context take "
	"more than 100 MB in a large model, and 40960 tokens take forty times as much.\n"
	"She opened the window, counted the birds on the wire (there were 12, then 13), and "
	"wrote the numbers 2, 3, 5, 7, 11 and 13 on the board. \"These are primes,\" she said. "
	"\"Can you tell me the next one?\" Nobody answered. The clock on the wall said 10:45.\n";

/* GPT-2 shows each byte as one printable character: bytes that are printable Latin-1 stand
 * for themselves, the other 68 are moved to U+0100 onwards in byte order. */
static uint32_t byte_codepoint(uint8_t b)
{
	if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE))
		return b;
	uint32_t n = 0;
	for (uint32_t c = 0; c < b; c++)
		if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE)))
			n++;
	return 256 + n;
}

/* Allocation helpers return NULL on failure (never 0 bytes); callers report ENOMEM. */
static void *zalloc(size_t n, size_t size)
{
	return calloc(n ? n : 1, size ? size : 1);
}

/* Grows *p to n elements; on failure *p is left as it was. */
static bool grow(void *p, size_t n, size_t size)
{
	size_t bytes;
	void *q;
	if (__builtin_mul_overflow(n ? n : 1, size, &bytes) || !(q = realloc(*(void **)p, bytes)))
		return false;
	*(void **)p = q;
	return true;
}

static int oom(void)
{
	fprintf(stderr, "mkmodel: out of memory\n");
	return HEARTH_ENOMEM;
}

static char *concat(const char *a, const char *sep, const char *b)
{
	const size_t la = strlen(a), ls = strlen(sep), lb = strlen(b);
	char *s = zalloc(la + ls + lb + 1, 1);
	if (!s)
		return NULL;
	memcpy(s, a, la);
	memcpy(s + la, sep, ls);
	memcpy(s + la + ls, b, lb);
	return s;
}

struct mk_word {
	int *sym;
	int n;
	int count;
};

/* Splits like GPT-2's pre-tokenizer, simplified: an optional space followed by a run of
 * letters, of digits, or of other non-space characters; whitespace on its own. */
static void words_free(struct mk_word *w, int n)
{
	for (int i = 0; i < n; i++)
		free(w[i].sym);
	free(w);
}

/* Returns the number of distinct words, or -1 when out of memory. */
static int corpus_words(struct mk_word **out)
{
	struct mk_word *w = NULL;
	int n = 0;
	const char *p = mk_corpus;

	while (*p) {
		const char *start = p;
		if (*p == ' ' && p[1] && p[1] != ' ' && p[1] != '\n')
			p++;
		if (*p == ' ' || *p == '\n') {
			while (*p == ' ' || *p == '\n')
				p++;
		} else if ((*p | 32) >= 'a' && (*p | 32) <= 'z') {
			while ((*p | 32) >= 'a' && (*p | 32) <= 'z')
				p++;
		} else if (*p >= '0' && *p <= '9') {
			while (*p >= '0' && *p <= '9')
				p++;
		} else {
			while (*p && *p != ' ' && *p != '\n' && !((*p | 32) >= 'a' && (*p | 32) <= 'z') &&
			       !(*p >= '0' && *p <= '9'))
				p++;
		}
		const int len = (int)(p - start);
		int k;
		for (k = 0; k < n; k++) {
			int same = w[k].n == len;
			for (int j = 0; same && j < len; j++)
				same = w[k].sym[j] == (uint8_t)start[j];
			if (same)
				break;
		}
		if (k < n) {
			w[k].count++;
			continue;
		}
		if (!grow(&w, (size_t)n + 1, sizeof *w) || !(w[n].sym = zalloc((size_t)len, sizeof(int)))) {
			words_free(w, n);
			return -1;
		}
		for (int j = 0; j < len; j++)
			w[n].sym[j] = (uint8_t)start[j];
		w[n].n = len;
		w[n].count = 1;
		n++;
	}
	*out = w;
	return n;
}

struct mk_pair {
	uint64_t key; /* left symbol << 32 | right symbol */
	long count;
};

static int cmp_pair(const void *a, const void *b)
{
	const uint64_t x = ((const struct mk_pair *)a)->key, y = ((const struct mk_pair *)b)->key;
	return x < y ? -1 : x > y;
}

static int64_t token_find(char **tokens, uint64_t n, const char *s)
{
	for (uint64_t i = 0; i < n; i++)
		if (!strcmp(tokens[i], s))
			return (int64_t)i;
	return -1;
}

/* Learns merges from the corpus the way BPE training does: always the most frequent
 * adjacent pair (ties to the lowest ids, so the result is fixed). Without n_vocab it stops
 * when no pair occurs twice; with n_vocab it goes on (pairs seen once) until the vocabulary
 * is full or every word is one token. Then 3 special tokens, then "[PADn]" up to n_vocab. */
static int vocab_build(struct mk_vocab *v, uint64_t n_vocab)
{
	static const char *const specials[] = { "<|endoftext|>", "<|im_start|>", "<|im_end|>" };
	struct mk_word *words = NULL;
	struct mk_pair *pairs = NULL;
	uint64_t max_merges = UINT64_MAX;
	uint64_t cap = 512;
	long min_count = 2;
	int n_words;

	memset(v, 0, sizeof *v);
	if (n_vocab) {
		if (n_vocab < 256 + 3) {
			fprintf(stderr, "mkmodel: --n-vocab %" PRIu64 " is below the 259 byte and special tokens\n",
				n_vocab);
			return HEARTH_EINVAL;
		}
		max_merges = n_vocab - 256 - 3;
		min_count = 1;
	}
	if ((n_words = corpus_words(&words)) < 0)
		return oom();
	v->tokens = zalloc(256 + 3 + cap, sizeof *v->tokens);
	v->merges = zalloc(cap, sizeof *v->merges);
	if (!v->tokens || !v->merges)
		goto nomem;
	for (int b = 0; b < 256; b++) {
		const uint32_t cp = byte_codepoint((uint8_t)b);
		char s[3] = { 0 };
		if (cp < 0x80) {
			s[0] = (char)cp;
		} else {
			s[0] = (char)(0xC0 | (cp >> 6));
			s[1] = (char)(0x80 | (cp & 0x3F));
		}
		if (!(v->tokens[v->n_tokens] = strdup(s)))
			goto nomem;
		v->n_tokens++;
	}

	size_t n_pairs_max = 0;
	for (int i = 0; i < n_words; i++)
		n_pairs_max += (size_t)words[i].n;
	if (!(pairs = zalloc(n_pairs_max, sizeof *pairs)))
		goto nomem;

	while (v->n_merges < max_merges) {
		/* one entry per occurrence, weighted by how often its word occurs */
		size_t np = 0;
		for (int i = 0; i < n_words; i++)
			for (int j = 0; j + 1 < words[i].n; j++) {
				pairs[np].key = (uint64_t)words[i].sym[j] << 32 | (uint32_t)words[i].sym[j + 1];
				pairs[np++].count = words[i].count;
			}
		qsort(pairs, np, sizeof *pairs, cmp_pair);
		uint64_t best = 0;
		long best_count = 0;
		for (size_t a = 0; a < np;) {
			long c = 0;
			size_t e = a;
			for (; e < np && pairs[e].key == pairs[a].key; e++)
				c += pairs[e].count;
			if (c > best_count) { /* strict: the lowest key wins a tie */
				best_count = c;
				best = pairs[a].key;
			}
			a = e;
		}
		if (best_count < min_count)
			break;

		const int x = (int)(best >> 32), y = (int)(uint32_t)best;
		if (v->n_merges == cap) {
			cap *= 2;
			if (!grow(&v->tokens, 256 + 3 + cap, sizeof *v->tokens) ||
			    !grow(&v->merges, cap, sizeof *v->merges))
				goto nomem;
		}
		char *joined = concat(v->tokens[x], "", v->tokens[y]);
		char *merge = concat(v->tokens[x], " ", v->tokens[y]);
		if (!joined || !merge) {
			free(joined);
			free(merge);
			goto nomem;
		}
		v->merges[v->n_merges++] = merge;
		int64_t id = token_find(v->tokens, v->n_tokens, joined);
		if (id < 0) {
			/* the same text can come from two merge paths; the token exists once */
			id = (int64_t)v->n_tokens;
			v->tokens[v->n_tokens++] = joined;
		} else {
			free(joined);
		}
		for (int i = 0; i < n_words; i++) {
			int o = 0;
			for (int j = 0; j < words[i].n; j++) {
				if (j + 1 < words[i].n && words[i].sym[j] == x && words[i].sym[j + 1] == y) {
					words[i].sym[o++] = (int)id;
					j++;
				} else {
					words[i].sym[o++] = words[i].sym[j];
				}
			}
			words[i].n = o;
		}
	}
	free(pairs);
	pairs = NULL;
	words_free(words, n_words);
	words = NULL;

	const uint64_t n_regular = v->n_tokens;
	const uint64_t total = n_vocab ? n_vocab : n_regular + 3;
	if (!grow(&v->tokens, total, sizeof *v->tokens) || !(v->types = zalloc(total, sizeof *v->types)))
		goto nomem;
	for (uint64_t i = 0; i < n_regular; i++)
		v->types[i] = TOK_NORMAL;
	for (int k = 0; k < 3; k++) {
		if (!(v->tokens[v->n_tokens] = strdup(specials[k])))
			goto nomem;
		v->types[v->n_tokens++] = TOK_CONTROL;
	}
	v->bos = v->eos = (uint32_t)n_regular; /* <|endoftext|>, as Qwen does */
	while (v->n_tokens < total) {
		char pad[32];
		snprintf(pad, sizeof pad, "[PAD%" PRIu64 "]", v->n_tokens - n_regular - 3);
		if (!(v->tokens[v->n_tokens] = strdup(pad)))
			goto nomem;
		v->types[v->n_tokens++] = TOK_UNUSED;
	}
	return 0;

nomem:
	free(pairs);
	if (words)
		words_free(words, n_words);
	return oom(); /* the caller's vocab_free releases what v holds */
}

static void vocab_free(struct mk_vocab *v)
{
	for (uint64_t i = 0; i < v->n_tokens; i++)
		free(v->tokens[i]);
	for (uint64_t i = 0; i < v->n_merges; i++)
		free(v->merges[i]);
	free(v->tokens);
	free(v->types);
	free(v->scores);
	free(v->merges);
}

static int vocab_write(struct gguf_build *b, const struct mk_vocab *v, enum mk_arch arch, bool no_bos)
{
	int rc = 0;
	rc |= gguf_build_kv_str(b, "tokenizer.ggml.model", "gpt2");
	rc |= gguf_build_kv_str(b, "tokenizer.ggml.pre", arch == MK_LLAMA ? "llama-bpe" : "qwen2");
	rc |= gguf_build_kv_arr_str(b, "tokenizer.ggml.tokens", (const char *const *)v->tokens, v->n_tokens);
	rc |= gguf_build_kv_arr(b, "tokenizer.ggml.token_type", GGUF_VT_INT32, v->types, v->n_tokens);
	rc |= gguf_build_kv_arr_str(b, "tokenizer.ggml.merges", (const char *const *)v->merges, v->n_merges);
	rc |= gguf_build_kv_u32(b, "tokenizer.ggml.bos_token_id", v->bos);
	rc |= gguf_build_kv_u32(b, "tokenizer.ggml.eos_token_id", v->eos);
	rc |= gguf_build_kv_u32(b, "tokenizer.ggml.padding_token_id", v->eos);
	rc |= gguf_build_kv_bool(b, "tokenizer.ggml.add_bos_token", arch == MK_LLAMA && !no_bos);
	return rc ? HEARTH_ENOMEM : 0;
}

/* ---- a SentencePiece vocabulary, as bench/train/train.py writes it from its .model */

/* One token a line, in id order: piece TAB score TAB llama.cpp token type. Pieces never
 * hold a tab or newline (train.py checks), so no escaping is needed. */
static int spm_vocab_read(struct mk_vocab *v, const char *path)
{
	FILE *f = fopen(path, "rb");
	char line[512];
	uint64_t lineno = 0;
	int rc = 0;

	if (!f) {
		fprintf(stderr, "mkmodel: %s: %s\n", path, strerror(errno));
		return HEARTH_EIO;
	}
	while (fgets(line, sizeof line, f)) {
		char *tab1, *tab2, *end;
		size_t len = strlen(line);

		lineno++;
		if (len == 0 || line[len - 1] != '\n' || !(tab1 = strchr(line, '\t')) ||
		    !(tab2 = strchr(tab1 + 1, '\t'))) {
			fprintf(stderr, "mkmodel: %s:%" PRIu64 ": not 'piece<TAB>score<TAB>type'\n", path, lineno);
			rc = HEARTH_EFORMAT;
			break;
		}
		line[len - 1] = '\0';
		*tab1 = *tab2 = '\0';
		const float score = strtof(tab1 + 1, &end);
		const bool score_ok = end != tab1 + 1 && *end == '\0';
		const long type = strtol(tab2 + 1, &end, 10);
		if (!score_ok || *end || type < 1 || type > 6) {
			fprintf(stderr, "mkmodel: %s:%" PRIu64 ": bad score or token type\n", path, lineno);
			rc = HEARTH_EFORMAT;
			break;
		}
		if (!grow(&v->tokens, v->n_tokens + 1, sizeof *v->tokens) ||
		    !grow(&v->types, v->n_tokens + 1, sizeof *v->types) ||
		    !grow(&v->scores, v->n_tokens + 1, sizeof *v->scores) ||
		    !(v->tokens[v->n_tokens] = strdup(line))) {
			rc = oom();
			break;
		}
		v->types[v->n_tokens] = (int32_t)type;
		v->scores[v->n_tokens++] = score;
	}
	if (!rc && (ferror(f) || v->n_tokens < 3)) {
		fprintf(stderr, "mkmodel: %s: unreadable or fewer than 3 tokens\n", path);
		rc = HEARTH_EFORMAT;
	}
	fclose(f);
	/* SentencePiece's llama convention, which train.py keeps: <unk> 0, <s> 1, </s> 2 */
	v->bos = 1;
	v->eos = 2;
	return rc;
}

static int spm_vocab_write(struct gguf_build *b, const struct mk_vocab *v, bool no_bos)
{
	int rc = 0;
	rc |= gguf_build_kv_str(b, "tokenizer.ggml.model", "llama");
	rc |= gguf_build_kv_str(b, "tokenizer.ggml.pre", "default");
	rc |= gguf_build_kv_arr_str(b, "tokenizer.ggml.tokens", (const char *const *)v->tokens, v->n_tokens);
	rc |= gguf_build_kv_arr(b, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, v->scores, v->n_tokens);
	rc |= gguf_build_kv_arr(b, "tokenizer.ggml.token_type", GGUF_VT_INT32, v->types, v->n_tokens);
	rc |= gguf_build_kv_u32(b, "tokenizer.ggml.bos_token_id", v->bos);
	rc |= gguf_build_kv_u32(b, "tokenizer.ggml.eos_token_id", v->eos);
	rc |= gguf_build_kv_u32(b, "tokenizer.ggml.unknown_token_id", 0);
	rc |= gguf_build_kv_bool(b, "tokenizer.ggml.add_bos_token", !no_bos);
	rc |= gguf_build_kv_bool(b, "tokenizer.ggml.add_eos_token", false);
	rc |= gguf_build_kv_bool(b, "tokenizer.ggml.add_space_prefix", true);
	return rc ? HEARTH_ENOMEM : 0;
}

/* ---- trained weights: the .hkw file bench/train/train.py writes */

struct mk_weight {
	char name[96];
	uint32_t rows, cols; /* GGUF's ne[1], ne[0]; cols is 1 for a vector */
	float *data;         /* rows * cols, row-major */
};

struct mk_weights {
	struct mk_weight *w;
	uint32_t n;
};

static void weights_free(struct mk_weights *ws)
{
	for (uint32_t i = 0; i < ws->n; i++)
		free(ws->w[i].data);
	free(ws->w);
}

static bool read_u32(FILE *f, uint32_t *v)
{
	uint8_t b[4];
	if (fread(b, 1, 4, f) != 4)
		return false;
	*v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
	return true;
}

/* 'HKW1', u32 count, then per tensor: u32 name length, name, u32 rows, u32 cols, f32 data
 * (little-endian, as on every machine hearth runs on). Read whole: trained models here are
 * small, and the writer wants tensors in its own order. */
static int weights_read(struct mk_weights *ws, const char *path)
{
	FILE *f = fopen(path, "rb");
	char magic[4];
	uint32_t n = 0;
	int rc = HEARTH_EFORMAT;

	if (!f) {
		fprintf(stderr, "mkmodel: %s: %s\n", path, strerror(errno));
		return HEARTH_EIO;
	}
	if (fread(magic, 1, 4, f) != 4 || memcmp(magic, "HKW1", 4) || !read_u32(f, &n) || n > 4096) {
		fprintf(stderr, "mkmodel: %s: not a .hkw weights file\n", path);
		goto out;
	}
	if (!(ws->w = zalloc(n, sizeof *ws->w))) {
		rc = oom();
		goto out;
	}
	for (; ws->n < n; ws->n++) {
		struct mk_weight *w = &ws->w[ws->n];
		uint32_t len;
		if (!read_u32(f, &len) || len == 0 || len >= sizeof w->name || fread(w->name, 1, len, f) != len ||
		    !read_u32(f, &w->rows) || !read_u32(f, &w->cols) || !w->rows || !w->cols) {
			fprintf(stderr, "mkmodel: %s: tensor %" PRIu32 ": bad header\n", path, ws->n);
			goto out;
		}
		if (!(w->data = zalloc((size_t)w->rows * w->cols, sizeof *w->data))) {
			rc = oom();
			goto out;
		}
		if (fread(w->data, sizeof *w->data, (size_t)w->rows * w->cols, f) != (size_t)w->rows * w->cols) {
			fprintf(stderr, "mkmodel: %s: %s: truncated data\n", path, w->name);
			goto out;
		}
	}
	rc = 0;
out:
	fclose(f);
	return rc;
}

static const struct mk_weight *weights_find(const struct mk_weights *ws, const char *name)
{
	for (uint32_t i = 0; i < ws->n; i++)
		if (!strcmp(ws->w[i].name, name))
			return &ws->w[i];
	return NULL;
}

/* ---- a vocabulary copied from another GGUF: every tokenizer.* key, padded on request */

/* A NUL-terminated copy, or NULL when out of memory or when s holds a NUL byte (which the
 * writer's C strings could not carry); *nul tells the two apart. */
static char *str_dup(struct gguf_str s, bool *nul)
{
	char *d;

	*nul = memchr(s.ptr, 0, s.len) != NULL;
	if (*nul || !(d = zalloc(s.len + 1, 1)))
		return NULL;
	memcpy(d, s.ptr, s.len);
	return d;
}

static bool is_key(const struct gguf_kv *kv, const char *key)
{
	return gguf_str_eq(kv->key, key);
}

/* The size a copied vocabulary will have: its own, or n_vocab when that is larger. */
static int vocab_size_of(const char *path, uint64_t n_vocab, uint64_t *out)
{
	struct hearth_error err = { 0 };
	struct gguf_file *f = NULL;
	const struct gguf_kv *tokens;
	int rc;

	if ((rc = gguf_open(&f, path, &err)) ||
	    (rc = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &tokens, &err))) {
		fprintf(stderr, "mkmodel: %s\n", err.msg);
		gguf_close(f);
		return rc;
	}
	if (n_vocab && n_vocab < tokens->arr_n) {
		fprintf(stderr, "mkmodel: --n-vocab %" PRIu64 " is smaller than %s's %" PRIu64 " tokens\n",
			n_vocab, path, tokens->arr_n);
		gguf_close(f);
		return HEARTH_EINVAL;
	}
	*out = n_vocab > tokens->arr_n ? n_vocab : tokens->arr_n;
	gguf_close(f);
	return 0;
}

/* A string array, extended with "[PADn]" up to n elements. */
static int copy_str_array(struct gguf_build *b, const char *path, const char *key,
			  const struct gguf_kv *kv, uint64_t n)
{
	char **strs = zalloc(n, sizeof *strs);
	bool nul = false;
	int rc = 0;

	if (!strs)
		return oom();
	for (uint64_t k = 0; k < n && !rc; k++) {
		if (k < kv->arr_n) {
			strs[k] = str_dup(kv->arr_strs[k], &nul);
		} else {
			char pad[32];
			snprintf(pad, sizeof pad, "[PAD%" PRIu64 "]", k - kv->arr_n);
			strs[k] = strdup(pad);
		}
		if (nul) {
			fprintf(stderr, "mkmodel: %s: %s[%" PRIu64 "] holds a NUL byte\n", path, key, k);
			rc = HEARTH_EUNSUPPORTED;
		} else if (!strs[k]) {
			rc = oom();
		}
	}
	if (!rc)
		rc = gguf_build_kv_arr_str(b, key, (const char *const *)strs, n);
	for (uint64_t k = 0; k < n; k++)
		free(strs[k]);
	free(strs);
	return rc;
}

/* A numeric array, extended to n elements: token types with 5 (unused), scores with 0. */
static int copy_num_array(struct gguf_build *b, const char *path, const char *key,
			  const struct gguf_kv *kv, uint64_t n)
{
	uint8_t *data;
	int rc;

	if (n == kv->arr_n)
		return gguf_build_kv_arr(b, key, kv->arr_type, kv->arr_data, n);
	if (kv->arr_type != GGUF_VT_INT32 && kv->arr_type != GGUF_VT_FLOAT32) {
		fprintf(stderr, "mkmodel: %s: cannot pad %s of element type %d\n", path, key,
			(int)kv->arr_type);
		return HEARTH_EUNSUPPORTED;
	}
	if (!(data = zalloc(n, 4)))
		return oom();
	memcpy(data, kv->arr_data, kv->arr_n * 4);
	if (kv->arr_type == GGUF_VT_INT32) {
		const int32_t unused = TOK_UNUSED;
		for (uint64_t k = kv->arr_n; k < n; k++)
			memcpy(data + 4 * k, &unused, 4);
	}
	rc = gguf_build_kv_arr(b, key, kv->arr_type, data, n);
	free(data);
	return rc;
}

static int copy_kv(struct gguf_build *b, const char *path, const char *key, const struct gguf_kv *kv,
		   uint64_t n_array)
{
	switch (kv->type) {
	case GGUF_VT_UINT8: return gguf_build_kv_u8(b, key, (uint8_t)kv->v.u);
	case GGUF_VT_INT8: return gguf_build_kv_i8(b, key, (int8_t)kv->v.i);
	case GGUF_VT_UINT16: return gguf_build_kv_u16(b, key, (uint16_t)kv->v.u);
	case GGUF_VT_INT16: return gguf_build_kv_i16(b, key, (int16_t)kv->v.i);
	case GGUF_VT_UINT32: return gguf_build_kv_u32(b, key, (uint32_t)kv->v.u);
	case GGUF_VT_INT32: return gguf_build_kv_i32(b, key, (int32_t)kv->v.i);
	case GGUF_VT_UINT64: return gguf_build_kv_u64(b, key, kv->v.u);
	case GGUF_VT_INT64: return gguf_build_kv_i64(b, key, kv->v.i);
	case GGUF_VT_FLOAT32: return gguf_build_kv_f32(b, key, (float)kv->v.f);
	case GGUF_VT_FLOAT64: return gguf_build_kv_f64(b, key, kv->v.f);
	case GGUF_VT_BOOL: return gguf_build_kv_bool(b, key, kv->v.b);
	case GGUF_VT_STRING: {
		bool nul;
		char *s = str_dup(kv->str, &nul);
		int rc;
		if (nul) {
			fprintf(stderr, "mkmodel: %s: %s holds a NUL byte\n", path, key);
			return HEARTH_EUNSUPPORTED;
		}
		if (!s)
			return oom();
		rc = gguf_build_kv_str(b, key, s);
		free(s);
		return rc;
	}
	case GGUF_VT_ARRAY:
		if (kv->arr_type == GGUF_VT_STRING)
			return copy_str_array(b, path, key, kv, n_array);
		return copy_num_array(b, path, key, kv, n_array);
	}
	return HEARTH_EUNSUPPORTED;
}

/* Copies every tokenizer.* key of path; the per-token arrays are padded to n_vocab tokens
 * (n_vocab from vocab_size_of). no_bos writes add_bos_token false in place of the file's. */
static int vocab_copy(struct gguf_build *b, const char *path, uint64_t n_vocab, bool no_bos)
{
	struct hearth_error err = { 0 };
	struct gguf_file *f = NULL;
	const struct gguf_kv *tokens;
	int rc;

	if ((rc = gguf_open(&f, path, &err)) ||
	    (rc = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &tokens, &err))) {
		fprintf(stderr, "mkmodel: %s\n", err.msg);
		gguf_close(f);
		return rc;
	}
	const uint64_t have = tokens->arr_n;
	for (uint64_t i = 0; i < f->n_kv && !rc; i++) {
		const struct gguf_kv *kv = &f->kv[i];
		bool nul;
		char *key;

		if (kv->key.len < 10 || memcmp(kv->key.ptr, "tokenizer.", 10) != 0 ||
		    (no_bos && is_key(kv, "tokenizer.ggml.add_bos_token")))
			continue;
		if (!(key = str_dup(kv->key, &nul))) {
			rc = nul ? HEARTH_EUNSUPPORTED : oom();
			break;
		}
		const bool per_token = is_key(kv, "tokenizer.ggml.tokens") ||
				       is_key(kv, "tokenizer.ggml.token_type") ||
				       is_key(kv, "tokenizer.ggml.scores");
		rc = copy_kv(b, path, key, kv, per_token && kv->arr_n == have ? n_vocab : kv->arr_n);
		free(key);
	}
	gguf_close(f);
	if (!rc && no_bos && gguf_build_kv_bool(b, "tokenizer.ggml.add_bos_token", false))
		rc = oom();
	return rc;
}

/* ---- tensors */

enum mk_init { INIT_WEIGHT, INIT_NORM, INIT_BIAS };

struct mk_tensor {
	char name[96];
	enum qtype type;
	uint32_t n_dims;
	uint64_t ne[2];
	enum mk_init init;
	int index;
	const float *data; /* fixed values (ne[0] x ne[1]) instead of seeded or trained ones */
};

struct mk_plan {
	struct mk_tensor *t;
	int n;
};

static int plan_add(struct gguf_build *b, struct mk_plan *p, const char *name, enum qtype type2d,
		    uint64_t ne0, uint64_t ne1, enum mk_init init)
{
	struct mk_tensor *t;

	if (!grow(&p->t, (size_t)p->n + 1, sizeof *p->t))
		return oom();
	t = &p->t[p->n];
	memset(t, 0, sizeof *t);
	snprintf(t->name, sizeof t->name, "%s", name);
	t->n_dims = ne1 ? 2 : 1;
	t->ne[0] = ne0;
	t->ne[1] = ne1 ? ne1 : 1;
	t->type = ne1 ? type2d : QTYPE_F32; /* norms and biases stay F32, as in llama.cpp files */
	t->init = init;
	if (t->type != QTYPE_F32 && ne0 % qtype_block_elems(t->type) != 0) {
		fprintf(stderr, "mkmodel: %s has rows of %" PRIu64 ", not a multiple of %s's block of %zu\n",
			name, ne0, qtype_name(t->type), qtype_block_elems(t->type));
		return HEARTH_EINVAL;
	}
	t->index = gguf_build_tensor(b, t->name, t->type, t->n_dims, t->ne);
	if (t->index < 0) {
		fprintf(stderr, "mkmodel: cannot declare %s (%d)\n", name, t->index);
		return t->index;
	}
	p->n++;
	return 0;
}

static int plan_model(struct gguf_build *b, struct mk_plan *p, enum mk_arch arch,
		      const struct mk_shape *s, enum qtype type, uint64_t n_vocab)
{
	const uint64_t q_dim = (uint64_t)s->n_head * s->head_dim;
	const uint64_t kv_dim = (uint64_t)s->n_head_kv * s->head_dim;
	char name[96];
	int rc;

	if ((rc = plan_add(b, p, "token_embd.weight", type, s->n_embd, n_vocab, INIT_WEIGHT)))
		return rc;
	for (uint32_t l = 0; l < s->n_layer; l++) {
#define ADD(suffix, ne0, ne1, init)                                                   \
	do {                                                                          \
		snprintf(name, sizeof name, "blk.%" PRIu32 ".%s", l, suffix);         \
		if ((rc = plan_add(b, p, name, type, (ne0), (ne1), (init))))          \
			return rc;                                                    \
	} while (0)
		ADD("attn_norm.weight", s->n_embd, 0, INIT_NORM);
		ADD("attn_q.weight", s->n_embd, q_dim, INIT_WEIGHT);
		ADD("attn_k.weight", s->n_embd, kv_dim, INIT_WEIGHT);
		ADD("attn_v.weight", s->n_embd, kv_dim, INIT_WEIGHT);
		if (arch == MK_QWEN2) {
			ADD("attn_q.bias", q_dim, 0, INIT_BIAS);
			ADD("attn_k.bias", kv_dim, 0, INIT_BIAS);
			ADD("attn_v.bias", kv_dim, 0, INIT_BIAS);
		}
		if (arch == MK_QWEN3 || arch == MK_GEMMA3) {
			ADD("attn_q_norm.weight", s->head_dim, 0, INIT_NORM);
			ADD("attn_k_norm.weight", s->head_dim, 0, INIT_NORM);
		}
		ADD("attn_output.weight", q_dim, s->n_embd, INIT_WEIGHT);
		if (arch == MK_GEMMA3) /* norms are stored as 1 + w, as llama.cpp's converter does */
			ADD("post_attention_norm.weight", s->n_embd, 0, INIT_NORM);
		ADD("ffn_norm.weight", s->n_embd, 0, INIT_NORM);
		ADD("ffn_gate.weight", s->n_embd, s->n_ff, INIT_WEIGHT);
		ADD("ffn_up.weight", s->n_embd, s->n_ff, INIT_WEIGHT);
		ADD("ffn_down.weight", s->n_ff, s->n_embd, INIT_WEIGHT);
		if (arch == MK_GEMMA3)
			ADD("post_ffw_norm.weight", s->n_embd, 0, INIT_NORM);
#undef ADD
	}
	if ((rc = plan_add(b, p, "output_norm.weight", type, s->n_embd, 0, INIT_NORM)))
		return rc;
	if (!s->tied && (rc = plan_add(b, p, "output.weight", type, s->n_embd, n_vocab, INIT_WEIGHT)))
		return rc;
	return 0;
}

/* Values: weights ~ N(0, 1/fan_in) with fan_in the row length, so every matmul keeps its
 * input's scale and tied logits come out near unit variance; norms ~ 1 + N(0, 0.1^2);
 * biases ~ N(0, 0.1^2). */
static void fill_row(const struct mk_tensor *t, uint64_t *rng, float *row)
{
	const float scale = t->init == INIT_WEIGHT ? 1.0f / sqrtf((float)t->ne[0]) : 0.1f;
	const float base = t->init == INIT_NORM ? 1.0f : 0.0f;

	for (uint64_t i = 0; i < t->ne[0]; i++)
		row[i] = base + scale * rng_normalish(rng);
}

/* Seeded rows, or with ws the trained tensor of the same name (its shape must be planned). */
static int write_tensor(struct gguf_build *b, FILE *fp, const struct mk_tensor *t, uint64_t seed,
			const struct mk_weights *ws, struct hearth_error *err)
{
	size_t row_bytes;
	uint64_t rng = name_seed(seed, t->name);
	const struct mk_weight *w = NULL;

	if (!qtype_row_bytes(t->type, t->ne[0], &row_bytes))
		return hearth_error_set(err, HEARTH_EINVAL, "%s: bad row", t->name);
	if (ws && !t->data) {
		if (!(w = weights_find(ws, t->name)))
			return hearth_error_set(err, HEARTH_EFORMAT, "weights have no tensor %s", t->name);
		/* a vector is rows x 1 in the file, ne[0] x 1 here */
		const bool same = t->n_dims == 1 ? w->cols == 1 && w->rows == t->ne[0]
						 : w->cols == t->ne[0] && w->rows == t->ne[1];
		if (!same)
			return hearth_error_set(err, HEARTH_EFORMAT,
						"weights' %s is %" PRIu32 " x %" PRIu32 ", the shape asks %" PRIu64
						" x %" PRIu64, t->name, w->rows, w->cols, t->ne[1], t->ne[0]);
	}
	/* about 1 MiB of output per write */
	uint64_t rows_per_chunk = (UINT64_C(1) << 20) / row_bytes;
	if (rows_per_chunk == 0)
		rows_per_chunk = 1;
	if (rows_per_chunk > t->ne[1])
		rows_per_chunk = t->ne[1];
	float *row = zalloc(t->ne[0], sizeof *row);
	uint8_t *chunk = zalloc(rows_per_chunk, row_bytes);
	int rc = 0;

	if (!row || !chunk)
		rc = hearth_error_set(err, HEARTH_ENOMEM, "%s: no memory for a row block", t->name);

	for (uint64_t r = 0; r < t->ne[1] && !rc;) {
		uint64_t n = 0;
		for (; n < rows_per_chunk && r < t->ne[1]; n++, r++) {
			if (t->data)
				memcpy(row, t->data + r * t->ne[0], t->ne[0] * sizeof *row);
			else if (w)
				memcpy(row, w->data + r * t->ne[0], t->ne[0] * sizeof *row);
			else
				fill_row(t, &rng, row);
			if (!quant_quantize_row(t->type, row, chunk + n * row_bytes, t->ne[0]))
				rc = hearth_error_set(err, HEARTH_EUNSUPPORTED, "%s: cannot write %s",
						      t->name, qtype_name(t->type));
		}
		if (!rc)
			rc = gguf_build_write_tensor_part(b, fp, t->index, chunk, n * row_bytes, err);
	}
	free(chunk);
	free(row);
	return rc;
}

/* tokenizer.chat_template, as a model's own template travels. */
static int write_chat_template(struct gguf_build *b, const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "mkmodel: %s: %s\n", path, strerror(errno));
		return HEARTH_EIO;
	}
	char *text = zalloc(1u << 20, 1);
	size_t n = text ? fread(text, 1, (1u << 20) - 1, f) : 0;
	fclose(f);
	if (!text)
		return oom();
	int rc = gguf_build_kv_str(b, "tokenizer.chat_template", text) ? HEARTH_ENOMEM : 0;
	(void)n;
	free(text);
	return rc;
}

/* ---- Llama 3.x RoPE frequency factors (rope_freqs.weight) */

/* The presets whose models carry them (config.json's rope_scaling), by preset name. */
static const struct {
	const char *preset;
	struct mk_rope_freqs rope_freqs;
} mk_preset_rope_freqs[] = {
	{ "llama-3.2-1b", { 32.0f, 1.0f, 4.0f, 8192 } },
};

/* Llama 3's rule as llama.cpp's convert_hf_to_gguf.py applies it, in float as there: pair i
 * turns at freq = theta^(-2i/n_rot); a wavelength 2*pi/freq shorter than
 * orig_ctx/high_freq_factor keeps its frequency (divisor 1), one longer than
 * orig_ctx/low_freq_factor is slowed by factor, and between the two the divisor blends from
 * factor to 1 as orig_ctx/wavelength goes from low_freq_factor to high_freq_factor.
 * out gets n_rot/2 divisors. */
static void rope_freqs_llama3(const struct mk_rope_freqs *r, float theta, uint32_t n_rot, float *out)
{
	const float low_freq_wavelen = (float)r->orig_ctx / r->low_freq_factor;
	const float high_freq_wavelen = (float)r->orig_ctx / r->high_freq_factor;

	for (uint32_t i = 0; i < n_rot / 2; i++) {
		const float freq = 1.0f / powf(theta, (float)(2 * i) / (float)n_rot);
		const float wavelen = 6.28318530717958647692f / freq; /* 2 pi */
		if (wavelen < high_freq_wavelen) {
			out[i] = 1.0f;
		} else if (wavelen > low_freq_wavelen) {
			out[i] = r->factor;
		} else {
			const float smooth = ((float)r->orig_ctx / wavelen - r->low_freq_factor) /
					     (r->high_freq_factor - r->low_freq_factor);
			out[i] = 1.0f / ((1.0f - smooth) / r->factor + smooth);
		}
	}
}

/* --rope-freqs none | llama3 | llama3:FACTOR,LOW,HIGH,ORIG_CTX ("llama3" alone: Llama
 * 3.2's 32,1,4,8192). Small test models want a small ORIG_CTX, so that positions a test
 * reaches fall in the slowed and blended wavelengths. */
static bool rope_freqs_parse(const char *s, struct mk_opts *o)
{
	struct mk_rope_freqs *r = &o->rope_freqs;
	char *end;

	o->rope_freqs_given = true;
	if (!strcmp(s, "none")) {
		memset(r, 0, sizeof *r);
		return true;
	}
	if (strncmp(s, "llama3", 6) != 0)
		return false;
	*r = mk_preset_rope_freqs[0].rope_freqs;
	if (!s[6])
		return true;
	if (s[6] != ':')
		return false;
	float v[4];
	const char *p = s + 7;
	for (int k = 0; k < 4; k++) {
		errno = 0;
		v[k] = strtof(p, &end);
		if (errno || end == p || *end != (k < 3 ? ',' : '\0') || !(v[k] > 0.0f) || isinf(v[k]))
			return false;
		p = end + 1;
	}
	if (v[3] != floorf(v[3]) || v[3] > (float)UINT32_MAX || !(v[2] > v[1]))
		return false; /* ORIG_CTX whole; HIGH above LOW, or the blend divides by zero */
	*r = (struct mk_rope_freqs){ v[0], v[1], v[2], (uint32_t)v[3] };
	return true;
}

/* The preset's factors unless --rope-freqs was given; llama arch only, where llama.cpp
 * reads the tensor. 0, or -1 after reporting. */
static int rope_freqs_resolve(struct mk_opts *o)
{
	for (size_t i = 0; !o->rope_freqs_given && o->arch == MK_LLAMA &&
			   i < sizeof mk_preset_rope_freqs / sizeof mk_preset_rope_freqs[0]; i++)
		if (!strcmp(o->preset->name, mk_preset_rope_freqs[i].preset))
			o->rope_freqs = mk_preset_rope_freqs[i].rope_freqs;
	if (o->rope_freqs.factor && o->arch != MK_LLAMA) {
		fprintf(stderr, "mkmodel: --rope-freqs is for --arch llama\n");
		return -1;
	}
	return 0;
}

/* Plans rope_freqs.weight (n_rot/2 F32, n_rot being head_dim here) first, where llama.cpp's
 * converter puts it, with its values in *values (the caller frees them). */
static int plan_rope_freqs(struct gguf_build *b, struct mk_plan *p, const struct mk_opts *o,
			   float **values)
{
	const uint32_t half = o->shape.head_dim / 2;
	int rc;

	*values = NULL;
	if (!o->rope_freqs.factor)
		return 0;
	if (!(*values = zalloc(half, sizeof **values)))
		return oom();
	rope_freqs_llama3(&o->rope_freqs, o->shape.rope_theta, o->shape.head_dim, *values);
	if ((rc = plan_add(b, p, "rope_freqs.weight", QTYPE_F32, half, 0, INIT_WEIGHT)))
		return rc;
	p->t[p->n - 1].data = *values;
	return 0;
}

/* ---- command line */

static void usage(FILE *fp)
{
	fprintf(fp,
		"usage: mkmodel -o OUT.gguf [--preset tiny|qwen3-0.6b|qwen3-1.7b|llama-3.2-1b|\n"
		"               gemma-3-270m|gemma-3-1b]\n"
		"               [--arch llama|qwen2|qwen3|gemma3] [--type f32|f16|bf16|q8_0|q4_0] [--seed N]\n"
		"               [--vocab VOCAB.gguf] [--n-vocab N] [--name NAME]\n"
		"               [--n-embd N] [--n-layer N] [--n-head N] [--n-head-kv N] [--head-dim N]\n"
		"               [--n-ff N] [--ctx N] [--rope-theta F] [--rms-eps F] [--tied|--untied]\n"
		"               [--chat-template FILE.jinja] [--spm-vocab FILE.tsv] [--weights FILE.hkw]\n"
		"               [--rope-freqs none|llama3[:FACTOR,LOW,HIGH,ORIG_CTX]]\n"
		"               [--pooling mean|cls|last] [--add-eos] [--no-bos]\n"
		"               [--sliding-window N] [--swa-pattern N] [--rope-scale F] [--softcap F]\n"
		"Writes a synthetic model with seeded weights that llama.cpp loads. Without --vocab the\n"
		"vocabulary is a small byte-level BPE of its own, padded with [PADn] to --n-vocab;\n"
		"with --vocab every tokenizer.* key of that file is copied (and padded likewise);\n"
		"with --spm-vocab a SentencePiece vocabulary from bench/train/train.py is written as\n"
		"a llama (SPM) tokenizer. --weights writes trained weights (train.py's .hkw) instead\n"
		"of seeded ones; every planned tensor must be there with the planned shape.\n"
		"--rope-freqs writes rope_freqs.weight by Llama 3's rule (llama arch; llama3 alone:\n"
		"Llama 3.2's factor 32, low 1, high 4, original context 8192; llama-3.2-1b has it).\n"
		"--pooling writes <arch>.pooling_type: an embedding model's pooling, as llama.cpp reads it;\n"
		"--add-eos tokenizer.ggml.add_eos_token = true, as embedding models that pool the last\n"
		"token set it (with the built-in vocabulary only).\n"
		"--no-bos tokenizer.ggml.add_bos_token = false, whichever vocabulary (a file whose\n"
		"tokenizer adds no BOS, though its vocabulary's default would).\n"
		"Default preset: tiny (llama arch, 64 wide, 2 layers). gemma3 only: --sliding-window\n"
		"(0: the key is left out, which llama.cpp reads as all layers global and hearth\n"
		"refuses), --swa-pattern (every Nth layer global; unwritten: 6),\n"
		"--rope-scale (linear factor of the global layers), --softcap (final logits).\n");
}

static bool parse_u64(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	const unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *end || *s == '-')
		return false;
	*out = v;
	return true;
}

static bool parse_u32(const char *s, uint32_t *out)
{
	uint64_t v;
	if (!parse_u64(s, &v) || v == 0 || v > UINT32_MAX)
		return false;
	*out = (uint32_t)v;
	return true;
}

static bool parse_float(const char *s, float *out)
{
	char *end;
	errno = 0;
	const float v = strtof(s, &end);
	if (errno || end == s || *end || !(v > 0.0f) || isinf(v))
		return false;
	*out = v;
	return true;
}

enum {
	OPT_PRESET = 256, OPT_ARCH, OPT_TYPE, OPT_SEED, OPT_VOCAB, OPT_N_VOCAB, OPT_NAME,
	OPT_N_EMBD, OPT_N_LAYER, OPT_N_HEAD, OPT_N_HEAD_KV, OPT_HEAD_DIM, OPT_N_FF, OPT_CTX,
	OPT_ROPE_THETA, OPT_RMS_EPS, OPT_TIED, OPT_UNTIED, OPT_CHAT_TEMPLATE, OPT_SPM_VOCAB,
	OPT_WEIGHTS, OPT_ROPE_FREQS, OPT_POOLING, OPT_ADD_EOS, OPT_NO_BOS, OPT_SWA, OPT_SWA_PATTERN,
	OPT_ROPE_SCALE, OPT_SOFTCAP,
};

/* 0: options in o; 1: --help was printed; -1: bad usage (already reported). */
static int parse_args(int argc, char **argv, struct mk_opts *o)
{
	static const struct option longopts[] = {
		{ "out", required_argument, NULL, 'o' },
		{ "preset", required_argument, NULL, OPT_PRESET },
		{ "arch", required_argument, NULL, OPT_ARCH },
		{ "type", required_argument, NULL, OPT_TYPE },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "vocab", required_argument, NULL, OPT_VOCAB },
		{ "n-vocab", required_argument, NULL, OPT_N_VOCAB },
		{ "name", required_argument, NULL, OPT_NAME },
		{ "n-embd", required_argument, NULL, OPT_N_EMBD },
		{ "n-layer", required_argument, NULL, OPT_N_LAYER },
		{ "n-head", required_argument, NULL, OPT_N_HEAD },
		{ "n-head-kv", required_argument, NULL, OPT_N_HEAD_KV },
		{ "head-dim", required_argument, NULL, OPT_HEAD_DIM },
		{ "n-ff", required_argument, NULL, OPT_N_FF },
		{ "ctx", required_argument, NULL, OPT_CTX },
		{ "rope-theta", required_argument, NULL, OPT_ROPE_THETA },
		{ "rms-eps", required_argument, NULL, OPT_RMS_EPS },
		{ "tied", no_argument, NULL, OPT_TIED },
		{ "untied", no_argument, NULL, OPT_UNTIED },
		{ "chat-template", required_argument, NULL, OPT_CHAT_TEMPLATE },
		{ "spm-vocab", required_argument, NULL, OPT_SPM_VOCAB },
		{ "weights", required_argument, NULL, OPT_WEIGHTS },
		{ "rope-freqs", required_argument, NULL, OPT_ROPE_FREQS },
		{ "pooling", required_argument, NULL, OPT_POOLING },
		{ "add-eos", no_argument, NULL, OPT_ADD_EOS },
		{ "no-bos", no_argument, NULL, OPT_NO_BOS },
		{ "sliding-window", required_argument, NULL, OPT_SWA },
		{ "swa-pattern", required_argument, NULL, OPT_SWA_PATTERN },
		{ "rope-scale", required_argument, NULL, OPT_ROPE_SCALE },
		{ "softcap", required_argument, NULL, OPT_SOFTCAP },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;
	uint64_t v64 = 0;
	bool swa_given = false;

	memset(o, 0, sizeof *o);
	o->preset = &mk_presets[0];
	o->arch = -1;
	o->tied = -1;
	o->pooling = -1;
	o->type = QTYPE_F32;
	o->seed = 1;
	while ((c = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
		bool ok = true;
		switch (c) {
		case 'o': o->out = optarg; break;
		case 'h': usage(stdout); return 1;
		case OPT_PRESET:
			o->preset = NULL;
			for (size_t i = 0; i < sizeof mk_presets / sizeof mk_presets[0]; i++)
				if (!strcmp(optarg, mk_presets[i].name))
					o->preset = &mk_presets[i];
			ok = o->preset != NULL;
			break;
		case OPT_ARCH:
			for (int i = 0; i < (int)MK_N_ARCH; i++)
				if (!strcmp(optarg, mk_arch_names[i]))
					o->arch = i;
			ok = o->arch >= 0;
			break;
		case OPT_TYPE:
			if (!strcmp(optarg, "f32")) o->type = QTYPE_F32;
			else if (!strcmp(optarg, "f16")) o->type = QTYPE_F16;
			else if (!strcmp(optarg, "bf16")) o->type = QTYPE_BF16;
			else if (!strcmp(optarg, "q8_0")) o->type = QTYPE_Q8_0;
			else if (!strcmp(optarg, "q4_0")) o->type = QTYPE_Q4_0;
			else ok = false;
			break;
		case OPT_SEED: ok = parse_u64(optarg, &o->seed); break;
		case OPT_VOCAB: o->vocab_path = optarg; break;
		case OPT_CHAT_TEMPLATE: o->chat_template_path = optarg; break;
		case OPT_SPM_VOCAB: o->spm_vocab_path = optarg; break;
		case OPT_WEIGHTS: o->weights_path = optarg; break;
		case OPT_ROPE_FREQS: ok = rope_freqs_parse(optarg, o); break;
		case OPT_N_VOCAB: ok = parse_u64(optarg, &o->set.n_vocab) && o->set.n_vocab > 0; break;
		case OPT_NAME: o->name = optarg; break;
		case OPT_N_EMBD: ok = parse_u32(optarg, &o->set.n_embd); break;
		case OPT_N_LAYER: ok = parse_u32(optarg, &o->set.n_layer); break;
		case OPT_N_HEAD: ok = parse_u32(optarg, &o->set.n_head); break;
		case OPT_N_HEAD_KV: ok = parse_u32(optarg, &o->set.n_head_kv); break;
		case OPT_HEAD_DIM: ok = parse_u32(optarg, &o->set.head_dim); break;
		case OPT_N_FF: ok = parse_u32(optarg, &o->set.n_ff); break;
		case OPT_CTX: ok = parse_u32(optarg, &o->set.n_ctx); break;
		case OPT_ROPE_THETA: ok = parse_float(optarg, &o->set.rope_theta); break;
		case OPT_RMS_EPS: ok = parse_float(optarg, &o->set.rms_eps); break;
		case OPT_TIED: o->tied = 1; break;
		case OPT_UNTIED: o->tied = 0; break;
		case OPT_POOLING: /* llama.cpp's enum llama_pooling_type */
			if (!strcmp(optarg, "mean")) o->pooling = 1;
			else if (!strcmp(optarg, "cls")) o->pooling = 2;
			else if (!strcmp(optarg, "last")) o->pooling = 3;
			else ok = false;
			break;
		case OPT_ADD_EOS: o->add_eos = true; break;
		case OPT_NO_BOS: o->no_bos = true; break;
		case OPT_SWA: ok = parse_u64(optarg, &v64) && v64 <= UINT32_MAX; swa_given = true;
			o->swa.n_swa = (uint32_t)v64; break;
		case OPT_SWA_PATTERN: ok = parse_u32(optarg, &o->swa.swa_period); break;
		case OPT_ROPE_SCALE: ok = parse_float(optarg, &o->swa.rope_scale); break;
		case OPT_SOFTCAP: ok = parse_float(optarg, &o->swa.softcap); break;
		default: usage(stderr); return -1;
		}
		if (!ok) {
			fprintf(stderr, "mkmodel: bad value '%s' for %s\n", optarg, argv[optind - 1]);
			return -1;
		}
	}
	if (optind < argc || !o->out) {
		usage(stderr);
		return -1;
	}
	if (o->add_eos && (o->vocab_path || o->spm_vocab_path)) {
		fprintf(stderr, "mkmodel: --add-eos is for the built-in vocabulary; a copied one says its own\n");
		return -1;
	}
	if (o->spm_vocab_path && (o->vocab_path || o->set.n_vocab)) {
		fprintf(stderr, "mkmodel: --spm-vocab takes its size from the file; no --vocab or --n-vocab\n");
		return -1;
	}

	/* the preset, then whatever was given */
	struct mk_shape *s = &o->shape;
	*s = o->preset->shape;
	if (o->arch < 0)
		o->arch = (int)o->preset->arch;
#define OVERRIDE(f) if (o->set.f) s->f = o->set.f
	OVERRIDE(n_embd); OVERRIDE(n_layer); OVERRIDE(n_head); OVERRIDE(n_head_kv);
	OVERRIDE(head_dim); OVERRIDE(n_ff); OVERRIDE(n_ctx); OVERRIDE(n_vocab);
	OVERRIDE(rope_theta); OVERRIDE(rms_eps);
#undef OVERRIDE
	for (size_t i = 0; !swa_given && i < sizeof mk_preset_windows / sizeof mk_preset_windows[0]; i++)
		if (!strcmp(o->preset->name, mk_preset_windows[i].preset))
			o->swa.n_swa = mk_preset_windows[i].n_swa; /* --sliding-window 0 turns it off */
	const struct mk_swa *w = &o->swa;
	if (o->arch != MK_GEMMA3 && (w->n_swa || w->swa_period || w->rope_scale || w->softcap)) {
		fprintf(stderr, "mkmodel: --sliding-window, --swa-pattern, --rope-scale and --softcap "
			"are for --arch gemma3\n");
		return -1;
	}
	if (w->swa_period && !w->n_swa) {
		fprintf(stderr, "mkmodel: --swa-pattern needs a --sliding-window\n");
		return -1;
	}
	if (o->vocab_path && !o->set.n_vocab)
		s->n_vocab = 0; /* the copied vocabulary's own size */
	if (o->tied >= 0)
		s->tied = o->tied;
	if (o->set.n_head_kv == 0 && s->n_head_kv > s->n_head)
		s->n_head_kv = s->n_head;
	if (!s->head_dim) {
		if (s->n_embd % s->n_head) {
			fprintf(stderr, "mkmodel: n_embd %u is not a multiple of n_head %u; give --head-dim\n",
				s->n_embd, s->n_head);
			return -1;
		}
		s->head_dim = s->n_embd / s->n_head;
	}
	if (o->arch == MK_QWEN2 && (uint64_t)s->n_head * s->head_dim != s->n_embd) {
		/* llama.cpp builds qwen2's attn_q as n_embd x n_embd and rejects anything else */
		fprintf(stderr, "mkmodel: qwen2 needs head_dim * n_head == n_embd (llama.cpp has no "
			"key_length for it)\n");
		return -1;
	}
	if (s->n_head % s->n_head_kv) {
		fprintf(stderr, "mkmodel: n_head %u is not a multiple of n_head_kv %u\n", s->n_head,
			s->n_head_kv);
		return -1;
	}
	if (s->head_dim % 2) {
		fprintf(stderr, "mkmodel: head_dim %u must be even for RoPE\n", s->head_dim);
		return -1;
	}
	return rope_freqs_resolve(o);
}

static uint32_t file_type_of(enum qtype t)
{
	switch (t) { /* llama_ftype */
	case QTYPE_F16: return 1;
	case QTYPE_Q4_0: return 2;
	case QTYPE_Q8_0: return 7;
	case QTYPE_BF16: return 32;
	default: return 0;
	}
}

static int write_metadata(struct gguf_build *b, const struct mk_opts *o, uint64_t n_vocab)
{
	const struct mk_shape *s = &o->shape;
	const char *a = mk_arch_names[o->arch];
	char key[128], name[128];
	int rc = 0;

	snprintf(name, sizeof name, "mkmodel-%s-%s-seed%" PRIu64, o->preset->name, a, o->seed);
	rc |= gguf_build_kv_str(b, "general.architecture", a);
	rc |= gguf_build_kv_str(b, "general.name", o->name ? o->name : name);
	rc |= gguf_build_kv_u32(b, "general.file_type", file_type_of(o->type));
	rc |= gguf_build_kv_u32(b, "general.quantization_version", 2);
#define KV_U32(suffix, v) (snprintf(key, sizeof key, "%s." suffix, a), gguf_build_kv_u32(b, key, (v)))
#define KV_F32(suffix, v) (snprintf(key, sizeof key, "%s." suffix, a), gguf_build_kv_f32(b, key, (v)))
	rc |= KV_U32("vocab_size", (uint32_t)n_vocab);
	rc |= KV_U32("context_length", s->n_ctx);
	rc |= KV_U32("embedding_length", s->n_embd);
	rc |= KV_U32("block_count", s->n_layer);
	rc |= KV_U32("feed_forward_length", s->n_ff);
	rc |= KV_U32("attention.head_count", s->n_head);
	rc |= KV_U32("attention.head_count_kv", s->n_head_kv);
	rc |= KV_F32("attention.layer_norm_rms_epsilon", s->rms_eps);
	rc |= KV_F32("rope.freq_base", s->rope_theta);
	rc |= KV_U32("rope.dimension_count", s->head_dim);
	if (o->pooling >= 0)
		rc |= KV_U32("pooling_type", (uint32_t)o->pooling);
	if (o->add_eos)
		rc |= gguf_build_kv_bool(b, "tokenizer.ggml.add_eos_token", true);
	/* llama.cpp derives the head size from n_embd / n_head unless told; Qwen3 and Gemma 3
	 * files always say it, and so does every file converted from a config.json with a
	 * head_dim (the presets that have one: Llama 3.2's) */
	if (s->head_dim * s->n_head != s->n_embd || o->arch == MK_QWEN3 || o->arch == MK_GEMMA3 ||
	    o->preset->shape.head_dim) {
		rc |= KV_U32("attention.key_length", s->head_dim);
		rc |= KV_U32("attention.value_length", s->head_dim);
	}
	/* What llama.cpp's converter writes for Gemma 3 (rope.freq_base_swa never: 10000) */
	const struct mk_swa *w = &o->swa;
	if (w->n_swa)
		rc |= KV_U32("attention.sliding_window", w->n_swa);
	if (w->swa_period)
		rc |= KV_U32("attention.sliding_window_pattern", w->swa_period);
	if (w->rope_scale) {
		snprintf(key, sizeof key, "%s.rope.scaling.type", a);
		rc |= gguf_build_kv_str(b, key, "linear");
		rc |= KV_F32("rope.scaling.factor", w->rope_scale);
	}
	if (w->softcap)
		rc |= KV_F32("final_logit_softcapping", w->softcap);
#undef KV_U32
#undef KV_F32
	return rc ? HEARTH_ENOMEM : 0;
}

/* Reopens the written file with hearth's reader and checks what was planned is there. */
static int verify(const char *path, const struct mk_plan *p, const struct mk_opts *o, uint64_t n_vocab)
{
	struct hearth_error err = { 0 };
	struct gguf_file *f = NULL;
	uint32_t v = 0;
	int rc;

	if ((rc = gguf_open(&f, path, &err))) {
		fprintf(stderr, "mkmodel: reading back: %s\n", err.msg);
		return rc;
	}
	if (f->n_tensors != (uint64_t)p->n) {
		fprintf(stderr, "mkmodel: reading back: %" PRIu64 " tensors, wrote %d\n", f->n_tensors, p->n);
		rc = HEARTH_EFORMAT;
	}
	for (int i = 0; i < p->n && !rc; i++) {
		const struct gguf_tensor *t = gguf_tensor_find(f, p->t[i].name);
		if (!t || t->type != p->t[i].type || t->ne[0] != p->t[i].ne[0] || t->ne[1] != p->t[i].ne[1]) {
			fprintf(stderr, "mkmodel: reading back: tensor %s differs\n", p->t[i].name);
			rc = HEARTH_EFORMAT;
		}
	}
	char key[128];
	snprintf(key, sizeof key, "%s.block_count", mk_arch_names[o->arch]);
	if (!rc && (gguf_get_u32(f, key, &v, &err) || v != o->shape.n_layer)) {
		fprintf(stderr, "mkmodel: reading back: %s\n", key);
		rc = HEARTH_EFORMAT;
	}
	const struct gguf_kv *tokens;
	if (!rc && (gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &tokens, &err) ||
		    tokens->arr_n != n_vocab)) {
		fprintf(stderr, "mkmodel: reading back: tokenizer.ggml.tokens\n");
		rc = HEARTH_EFORMAT;
	}
	gguf_close(f);
	return rc;
}

int main(int argc, char **argv)
{
	struct mk_opts o;
	struct hearth_error err = { 0 };
	struct gguf_build *b = NULL;
	struct mk_plan plan = { 0 };
	struct mk_vocab vocab = { 0 };
	struct mk_weights weights = { 0 };
	float *rope_freqs = NULL;
	uint64_t n_vocab = 0;
	char *tmp = NULL;
	FILE *fp = NULL;
	int rc;

	if ((rc = parse_args(argc, argv, &o)))
		return rc > 0 ? 0 : 2; /* 1: --help was answered */
	if ((rc = gguf_build_new(&b, 3, &err))) {
		fprintf(stderr, "mkmodel: %s\n", err.msg);
		return 1;
	}

	/* metadata first: the vocabulary decides n_vocab, which shapes the embedding */
	if (o.weights_path && (rc = weights_read(&weights, o.weights_path)))
		goto out;
	if (o.spm_vocab_path) {
		if ((rc = spm_vocab_read(&vocab, o.spm_vocab_path)))
			goto out;
		n_vocab = vocab.n_tokens;
		if ((rc = write_metadata(b, &o, n_vocab)) || (rc = spm_vocab_write(b, &vocab, o.no_bos)))
			goto out;
	} else if (o.vocab_path) {
		/* the model's keys go first, as in llama.cpp's files */
		if ((rc = vocab_size_of(o.vocab_path, o.shape.n_vocab, &n_vocab)) ||
		    (rc = write_metadata(b, &o, n_vocab)) || (rc = vocab_copy(b, o.vocab_path, n_vocab, o.no_bos)))
			goto out;
	} else {
		if ((rc = vocab_build(&vocab, o.shape.n_vocab)))
			goto out;
		n_vocab = vocab.n_tokens;
		if ((rc = write_metadata(b, &o, n_vocab)) || (rc = vocab_write(b, &vocab, (enum mk_arch)o.arch, o.no_bos)))
			goto out;
	}
	if (o.chat_template_path && (rc = write_chat_template(b, o.chat_template_path)))
		goto out;
	if ((rc = plan_rope_freqs(b, &plan, &o, &rope_freqs)) ||
	    (rc = plan_model(b, &plan, (enum mk_arch)o.arch, &o.shape, o.type, n_vocab)))
		goto out;

	/* write next to the target and rename, so a failed run leaves no half file behind */
	if (!(tmp = zalloc(strlen(o.out) + 8, 1))) {
		rc = oom();
		goto out;
	}
	sprintf(tmp, "%s.tmp", o.out);
	if (!(fp = fopen(tmp, "wb"))) {
		fprintf(stderr, "mkmodel: %s: %s\n", tmp, strerror(errno));
		rc = HEARTH_EIO;
		goto out;
	}
	if ((rc = gguf_build_write_header(b, fp, &err)))
		goto out_err;
	for (int i = 0; i < plan.n; i++)
		if ((rc = write_tensor(b, fp, &plan.t[i], o.seed, o.weights_path ? &weights : NULL, &err)))
			goto out_err;
	if (fflush(fp) || ferror(fp)) {
		fprintf(stderr, "mkmodel: %s: %s\n", tmp, strerror(errno));
		rc = HEARTH_EIO;
		goto out;
	}
	rc = fclose(fp);
	fp = NULL;
	if (rc || rename(tmp, o.out)) {
		fprintf(stderr, "mkmodel: %s: %s\n", o.out, strerror(errno));
		rc = HEARTH_EIO;
		goto out;
	}
	rc = verify(o.out, &plan, &o, n_vocab);
	goto out;

out_err:
	fprintf(stderr, "mkmodel: %s\n", err.msg);
out:
	if (fp) {
		fclose(fp);
		unlink(tmp);
	}
	free(tmp);
	free(plan.t);
	free(rope_freqs);
	vocab_free(&vocab);
	weights_free(&weights);
	gguf_build_free(b);
	return rc ? 1 : 0;
}
