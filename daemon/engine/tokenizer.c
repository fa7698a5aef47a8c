/* The tokenizer: loads vocabulary, scores, merges and special-token facts out of GGUF
 * metadata into flat arrays and hash tables, then encodes (special-token partition,
 * pre-tokenizer split, SentencePiece or BPE merging) and decodes exactly as llama.cpp does.
 * Regexes of the pre-tokenizers are hand-written splitters; see the comment on each. */
#include "daemon/engine/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/unicode.h"
#include "protocol/hash.h"

enum tok_model { MODEL_SPM, MODEL_BPE };
enum tok_pre { PRE_DEFAULT, PRE_GPT2, PRE_LLAMA3, PRE_QWEN2, PRE_DEEPSEEK_LLM };

/* token attributes, as llama.cpp's llama_token_attr */
enum {
	ATTR_UNKNOWN = 1 << 0,
	ATTR_UNUSED = 1 << 1,
	ATTR_NORMAL = 1 << 2,
	ATTR_CONTROL = 1 << 3,
	ATTR_USER_DEFINED = 1 << 4,
	ATTR_BYTE = 1 << 5,
	ATTR_LSTRIP = 1 << 7,
	ATTR_RSTRIP = 1 << 8,
};

#define TOK_MAX_EOG 32

struct tok {
	enum tok_model model;
	enum tok_pre pre;
	uint32_t n_vocab;
	char *text;          /* all token texts back to back */
	size_t *text_off;    /* n_vocab + 1 */
	float *score;
	uint16_t *attr;
	uint64_t *hash;      /* text -> id + 1 (low half; 0 is empty), hash bits (high half) */
	size_t hash_mask;
	char *mtext;         /* BPE merges "left right", back to back, in rank order */
	size_t *moff;        /* n_merges + 1 */
	uint64_t *mhash;     /* "left right" -> rank + 1 (low half), hash bits (high half) */
	size_t mhash_mask;
	char *piece;         /* decoded bytes of every token (special tokens' text included) */
	size_t *piece_off;
	size_t piece_max;
	int32_t *special;    /* control/user-defined/unknown ids, longest text first */
	size_t n_special;
	int32_t byte_tok[256];          /* SPM: byte -> <0xNN> token (or the byte's own text) */
	char byte_utf8[256][2];         /* BPE: byte -> UTF-8 of its GPT-2 code point */
	uint8_t byte_utf8_len[256];
	int32_t bos, eos, eot, eom, unk;
	int32_t eog[TOK_MAX_EOG];
	size_t n_eog;
	bool add_bos, add_space_prefix, ignore_merges;
	bool add_eos;           /* tokenizer.ggml.add_eos_token: embedding models (Qwen3-Embedding) */
};

/* ---- growable arrays for encoding's scratch (element size fixed at creation) ---- */

struct array {
	void *p;
	size_t n, cap, elem;
};

static int array_reserve(struct array *v, size_t need)
{
	if (need <= v->cap)
		return 0;
	size_t cap = v->cap ? v->cap : 64, bytes;
	while (cap < need)
		cap *= 2;
	if (__builtin_mul_overflow(cap, v->elem, &bytes))
		return HEARTH_ENOMEM;
	void *p = realloc(v->p, bytes);
	if (!p)
		return HEARTH_ENOMEM;
	v->p = p;
	v->cap = cap;
	return 0;
}

static int array_push(struct array *v, const void *x)
{
	if (array_reserve(v, v->n + 1))
		return HEARTH_ENOMEM;
	memcpy((char *)v->p + v->n * v->elem, x, v->elem);
	v->n++;
	return 0;
}

/* ---- hashing ---- */

/* FNV-1a, continued from h (HEARTH_FNV1A_SEED to start), then mixed by hash_end */
static uint64_t hash_more(uint64_t h, const char *s, size_t n)
{
	return hearth_fnv1a(h, s, n);
}

static uint64_t hash_end(uint64_t h)
{
	return h ^ (h >> 29);
}

static uint64_t hash_bytes(const char *s, size_t n)
{
	return hash_end(hash_more(HEARTH_FNV1A_SEED, s, n));
}

static size_t table_size_for(size_t n)
{
	size_t size = 16;
	while (size < n * 2)
		size *= 2;
	return size;
}

static const char *tok_text(const struct tok *t, int32_t id, size_t *len)
{
	*len = t->text_off[id + 1] - t->text_off[id];
	return t->text + t->text_off[id];
}

/* Slots carry the upper hash bits so a probe rarely has to touch the texts (cache misses
 * dominate loading and encoding). */
static int32_t tok_find(const struct tok *t, const char *s, size_t n)
{
	uint64_t h = hash_bytes(s, n);
	uint32_t fp = (uint32_t)(h >> 32);
	for (size_t i = h & t->hash_mask;; i = (i + 1) & t->hash_mask) {
		uint64_t v = t->hash[i];
		if (!v)
			return TOK_NULL;
		if ((uint32_t)(v >> 32) != fp)
			continue;
		int32_t id = (int32_t)(uint32_t)v - 1;
		size_t len;
		const char *txt = tok_text(t, id, &len);
		if (len == n && memcmp(txt, s, n) == 0)
			return id;
	}
}

/* Rank of merging the symbols l and r, or -1. llama.cpp keys its merges by the pair
 * (left, right), split at the first space after the first byte; as a string "l r" the
 * same pair is found unless l itself holds such a space, which no pair key can. */
static int64_t merge_rank(const struct tok *t, const char *l, size_t ln, const char *r, size_t rn)
{
	if (!t->mhash || (ln > 1 && memchr(l + 1, ' ', ln - 1)))
		return -1;
	uint64_t h = hash_end(hash_more(hash_more(hash_more(HEARTH_FNV1A_SEED, l, ln), " ", 1), r, rn));
	uint32_t fp = (uint32_t)(h >> 32);
	for (size_t i = h & t->mhash_mask;; i = (i + 1) & t->mhash_mask) {
		uint64_t v = t->mhash[i];
		if (!v)
			return -1;
		if ((uint32_t)(v >> 32) != fp)
			continue;
		uint32_t rank = (uint32_t)v - 1;
		const char *m = t->mtext + t->moff[rank];
		if (t->moff[rank + 1] - t->moff[rank] == ln + 1 + rn && memcmp(m, l, ln) == 0 &&
		    m[ln] == ' ' && memcmp(m + ln + 1, r, rn) == 0)
			return rank;
	}
}

/* ---- loading ---- */

static int get_str_opt(const struct gguf_file *f, const char *key, struct gguf_str *out,
		       struct hearth_error *err)
{
	int rc = gguf_get_str(f, key, out, err);
	if (rc == HEARTH_ENOTFOUND) {
		hearth_error_clear(err);
		out->ptr = "";
		out->len = 0;
		return 0;
	}
	return rc;
}

/* Optional bool: *out keeps its default when the key is missing. */
static int get_bool_opt(const struct gguf_file *f, const char *key, bool *out, struct hearth_error *err)
{
	bool v;
	int rc = gguf_get_bool(f, key, &v, err);
	if (rc == HEARTH_ENOTFOUND) {
		hearth_error_clear(err);
		return 0;
	}
	if (rc == 0)
		*out = v;
	return rc;
}

/* Special token ids: like llama.cpp, a missing, malformed or out-of-range id keeps the
 * default (which itself is dropped when out of range). */
static void get_id_opt(const struct gguf_file *f, const char *key, uint32_t n_vocab, int32_t *id)
{
	uint32_t v;
	struct hearth_error e;
	if (*id >= 0 && (uint32_t)*id >= n_vocab)
		*id = TOK_NULL;
	if (gguf_get_u32(f, key, &v, &e) == 0 && v < n_vocab)
		*id = (int32_t)v;
}

static bool str_is(struct gguf_str s, const char *const *names)
{
	for (; *names; names++)
		if (gguf_str_eq(s, *names))
			return true;
	return false;
}

static int pick_pre(struct tok *t, struct gguf_str pre, const char *path, struct hearth_error *err)
{
	static const char *const gpt2[] = { "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat",
		"jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "exaone4", "mpt",
		"olmo", "jais", "trillion", "granite-docling", "jina-v1-en", "jina-v2-code",
		"roberta-bpe", NULL };
	static const char *const llama3[] = { "llama3", "llama-v3", "llama-bpe", "falcon3",
		"falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano", NULL };
	/* same split as Llama 3 but without ignore_merges and the add_bos default */
	static const char *const llama3_plain[] = { "dbrx", "smaug-bpe", "glm4", "chatglm-bpe", NULL };
	static const char *const qwen2[] = { "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2",
		"megrez", "stablelm2", "hunyuan", "solar-open", "grok-2", NULL };

	if (pre.len == 0 || gguf_str_eq(pre, "default")) {
		t->pre = PRE_DEFAULT;
	} else if (str_is(pre, gpt2)) {
		t->pre = PRE_GPT2;
	} else if (str_is(pre, llama3)) {
		t->pre = PRE_LLAMA3;
		t->ignore_merges = true;
		t->add_bos = true;
	} else if (str_is(pre, llama3_plain)) {
		t->pre = PRE_LLAMA3;
		if (gguf_str_eq(pre, "glm4") || gguf_str_eq(pre, "chatglm-bpe"))
			t->bos = TOK_NULL;
	} else if (str_is(pre, qwen2)) {
		t->pre = PRE_QWEN2;
	} else if (gguf_str_eq(pre, "deepseek-llm")) {
		t->pre = PRE_DEEPSEEK_LLM;
	} else {
		return hearth_error_set(err, HEARTH_EUNSUPPORTED,
					"%s: tokenizer.ggml.pre '%.*s' is not supported", path,
					(int)(pre.len > 64 ? 64 : pre.len), pre.ptr);
	}
	return 0;
}

static int load_tokens(struct tok *t, const struct gguf_file *f, struct hearth_error *err)
{
	const struct gguf_kv *toks;
	int rc = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &toks, err);
	if (rc)
		return rc;
	if (toks->arr_n == 0 || toks->arr_n > INT32_MAX - 1)
		return hearth_error_set(err, HEARTH_EFORMAT, "%s: tokenizer.ggml.tokens has %llu entries",
					f->path, (unsigned long long)toks->arr_n);
	uint32_t n = (uint32_t)toks->arr_n;
	t->n_vocab = n;

	const struct gguf_kv *scores = gguf_kv_find(f, "tokenizer.ggml.scores");
	if (scores && (scores->type != GGUF_VT_ARRAY ||
		       (scores->arr_type != GGUF_VT_FLOAT32 && scores->arr_type != GGUF_VT_INT32) ||
		       scores->arr_n < n))
		return hearth_error_set(err, HEARTH_EFORMAT,
					"%s: tokenizer.ggml.scores must be a float32/int32 array of >= %u",
					f->path, n);
	const struct gguf_kv *types = gguf_kv_find(f, "tokenizer.ggml.token_type");
	if (types && (types->type != GGUF_VT_ARRAY || types->arr_type == GGUF_VT_STRING ||
		      types->arr_type == GGUF_VT_FLOAT32 || types->arr_type == GGUF_VT_FLOAT64 ||
		      types->arr_type == GGUF_VT_BOOL || types->arr_type == GGUF_VT_ARRAY ||
		      types->arr_n < n))
		return hearth_error_set(err, HEARTH_EFORMAT,
					"%s: tokenizer.ggml.token_type must be an integer array of >= %u",
					f->path, n);

	/* empty texts become "[EMPTY_<id>]" as in llama.cpp: at most 20 bytes each */
	size_t total = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t len = toks->arr_strs[i].len ? toks->arr_strs[i].len : 20;
		if (__builtin_add_overflow(total, (size_t)len, &total))
			return hearth_error_set(err, HEARTH_ERANGE, "%s: token texts too large", f->path);
	}
	size_t hsize = table_size_for(n);
	t->text = malloc(total ? total : 1);
	t->text_off = calloc((size_t)n + 1, sizeof(*t->text_off));
	t->score = calloc(n, sizeof(*t->score));
	t->attr = calloc(n, sizeof(*t->attr));
	t->hash = calloc(hsize, sizeof(*t->hash));
	if (!t->text || !t->text_off || !t->score || !t->attr || !t->hash)
		return hearth_error_set(err, HEARTH_ENOMEM, "%s: no memory for %u tokens", f->path, n);
	t->hash_mask = hsize - 1;

	size_t off = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct gguf_str s = toks->arr_strs[i];
		t->text_off[i] = off;
		if (s.len) {
			memcpy(t->text + off, s.ptr, s.len);
			off += s.len;
		} else {
			char tmp[24];
			int k = snprintf(tmp, sizeof(tmp), "[EMPTY_%u]", i);
			memcpy(t->text + off, tmp, (size_t)k);
			off += (size_t)k;
		}
		t->text_off[i + 1] = off;

		size_t len;
		const char *txt = tok_text(t, (int32_t)i, &len);
		uint64_t hv = hash_bytes(txt, len);
		size_t h = hv & t->hash_mask;
		for (; t->hash[h]; h = (h + 1) & t->hash_mask) {
			uint64_t v = t->hash[h];
			if ((v >> 32) != (hv >> 32))
				continue;
			size_t olen;
			const char *other = tok_text(t, (int32_t)(uint32_t)v - 1, &olen);
			if (olen == len && memcmp(other, txt, len) == 0)
				return hearth_error_set(err, HEARTH_EFORMAT,
							"%s: duplicate token in vocabulary: ids %u and %u",
							f->path, (uint32_t)v - 1, i);
		}
		t->hash[h] = (hv >> 32) << 32 | (i + 1);

		if (scores)
			t->score[i] = scores->arr_type == GGUF_VT_FLOAT32 ? (float)gguf_arr_float(scores, i)
									: (float)gguf_arr_int(scores, i);
		uint16_t attr = ATTR_NORMAL;
		if (types) {
			switch (gguf_arr_int(types, i)) {
			case 1: attr = ATTR_NORMAL; break;
			case 2: attr = ATTR_UNKNOWN; break;
			case 3: attr = ATTR_CONTROL; break;
			case 4: attr = ATTR_USER_DEFINED; break;
			case 5: attr = ATTR_UNUSED; break;
			case 6: attr = ATTR_BYTE; break;
			default: attr = 0; break; /* undefined */
			}
		}
		t->attr[i] = attr;
	}
	return 0;
}

static int load_merges(struct tok *t, const struct gguf_file *f, struct hearth_error *err)
{
	const struct gguf_kv *m;
	int rc = gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_VT_STRING, &m, err);
	if (rc)
		return rc;
	if (m->arr_n >= UINT32_MAX / 4)
		return hearth_error_set(err, HEARTH_ERANGE, "%s: %llu merges", f->path,
					(unsigned long long)m->arr_n);
	size_t n = (size_t)m->arr_n, total = 0;
	for (size_t i = 0; i < n; i++)
		if (__builtin_add_overflow(total, (size_t)m->arr_strs[i].len, &total))
			return hearth_error_set(err, HEARTH_ERANGE, "%s: merges too large", f->path);
	size_t size = table_size_for(n);
	t->mtext = malloc(total ? total : 1);
	t->moff = malloc((n + 1) * sizeof(*t->moff));
	t->mhash = calloc(size, sizeof(*t->mhash));
	if (!t->mtext || !t->moff || !t->mhash)
		return hearth_error_set(err, HEARTH_ENOMEM, "%s: no memory for %zu merges", f->path, n);
	t->mhash_mask = size - 1;

	size_t off = 0;
	for (size_t r = 0; r < n; r++) {
		struct gguf_str s = m->arr_strs[r];
		t->moff[r] = off;
		/* a merge without a space after its first byte becomes the pair ("", ""): inert */
		const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
		if (!sp)
			continue;
		memcpy(t->mtext + off, s.ptr, s.len);
		off += s.len;
		uint64_t h = hash_bytes(s.ptr, s.len);
		size_t i = h & t->mhash_mask;
		bool dup = false;
		for (; t->mhash[i]; i = (i + 1) & t->mhash_mask) {
			uint64_t v = t->mhash[i];
			uint32_t o = (uint32_t)v - 1;
			if ((v >> 32) == (h >> 32) && t->moff[o + 1] - t->moff[o] == s.len &&
			    memcmp(t->mtext + t->moff[o], s.ptr, s.len) == 0) {
				dup = true; /* the first (best) rank wins, as std::map::emplace */
				break;
			}
		}
		if (!dup)
			t->mhash[i] = (h >> 32) << 32 | (uint64_t)(r + 1);
		t->moff[r + 1] = off;
	}
	t->moff[n] = off;
	return 0;
}

static bool text_is(const struct tok *t, int32_t id, const char *s)
{
	size_t len;
	const char *txt = tok_text(t, id, &len);
	return len == strlen(s) && memcmp(txt, s, len) == 0;
}

static int32_t find_cstr(const struct tok *t, const char *s)
{
	return tok_find(t, s, strlen(s));
}

static void eog_add(struct tok *t, int32_t id)
{
	if (id < 0)
		return;
	for (size_t i = 0; i < t->n_eog; i++)
		if (t->eog[i] == id)
			return;
	if (t->n_eog < TOK_MAX_EOG)
		t->eog[t->n_eog++] = id;
}

static void eog_remove(struct tok *t, int32_t id)
{
	for (size_t i = 0; i < t->n_eog; i++)
		if (t->eog[i] == id)
			t->eog[i] = t->eog[--t->n_eog];
}

/* End-of-generation tokens and control-looking texts, as llama.cpp detects them by text. */
static void load_eog(struct tok *t, const struct gguf_file *f)
{
	static const char *const eot_texts[] = { "<|eot_id|>", "<|im_end|>", "<|end|>",
		"<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
		"<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
		"<end_of_utterance>", NULL };
	static const char *const eog_texts[] = { "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>",
		"<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>",
		"<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
		"<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
		"<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "[e~[", NULL };
	static const char *const fim_pad[] = { "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL };
	static const char *const fim_rep[] = { "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL };
	static const char *const fim_sep[] = { "<|file_sep|>", NULL };
	int32_t pad = TOK_NULL, rep = TOK_NULL, sep = TOK_NULL;
	uint32_t n = t->n_vocab;

	get_id_opt(f, "tokenizer.ggml.eot_token_id", n, &t->eot);
	get_id_opt(f, "tokenizer.ggml.eom_token_id", n, &t->eom);
	get_id_opt(f, "tokenizer.ggml.fim_pad_token_id", n, &pad);
	get_id_opt(f, "tokenizer.ggml.fim_rep_token_id", n, &rep);
	get_id_opt(f, "tokenizer.ggml.fim_sep_token_id", n, &sep);

	/* llama.cpp takes whichever matching text its hash map yields first; list order here */
	const char *const *lists[] = { eot_texts, fim_pad, fim_rep, fim_sep };
	int32_t *ids[] = { &t->eot, &pad, &rep, &sep };
	for (size_t l = 0; l < 4; l++) {
		for (const char *const *s = lists[l]; *s && *ids[l] == TOK_NULL; s++) {
			int32_t id = find_cstr(t, *s);
			if (id >= 0) {
				*ids[l] = id;
				t->attr[id] |= ATTR_CONTROL;
			}
		}
	}
	if (t->eom == TOK_NULL && (t->eom = find_cstr(t, "<|eom_id|>")) >= 0)
		t->attr[t->eom] |= ATTR_CONTROL;

	eog_add(t, pad);
	eog_add(t, rep);
	eog_add(t, sep);
	for (const char *const *s = eog_texts; *s; s++) {
		int32_t id = find_cstr(t, *s);
		if (id >= 0) {
			eog_add(t, id);
			t->attr[id] |= ATTR_CONTROL;
		}
	}
	eog_add(t, t->eos);
	eog_add(t, t->eot);
	eog_add(t, t->eom);

	/* gpt-oss / solar-open: "<|end|>" ends a message, not the generation */
	bool has_return = false, has_call = false, has_flush = false, has_tool = false;
	int32_t end_id = TOK_NULL, s_id = TOK_NULL;
	for (size_t i = 0; i < t->n_eog; i++) {
		int32_t id = t->eog[i];
		has_return |= text_is(t, id, "<|return|>");
		has_call |= text_is(t, id, "<|call|>") || text_is(t, id, "<|calls|>");
		has_flush |= text_is(t, id, "<|flush|>");
		has_tool |= text_is(t, id, "<|tool_response>");
		if (text_is(t, id, "<|end|>"))
			end_id = id;
		if (text_is(t, id, "</s>"))
			s_id = id;
	}
	if (end_id >= 0 && ((has_return && has_call) || (has_call && has_flush))) {
		eog_remove(t, end_id);
		t->attr[end_id] = ATTR_USER_DEFINED;
	}
	if (has_tool && s_id >= 0) {
		eog_remove(t, s_id);
		t->attr[s_id] = ATTR_NORMAL;
	}
}

/* Phi-3's converter leaves its special tokens without strip flags; llama.cpp sets them by
 * model name (general.name containing phi-3/phi3). */
static void load_strip_attrs(struct tok *t, const struct gguf_file *f)
{
	struct gguf_str name;
	struct hearth_error e;
	if (gguf_get_str(f, "general.name", &name, &e) != 0)
		return;
	char low[256];
	size_t n = name.len < sizeof(low) - 1 ? (size_t)name.len : sizeof(low) - 1;
	for (size_t i = 0; i < n; i++) {
		char c = name.ptr[i];
		low[i] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
	}
	low[n] = 0;
	if (!strstr(low, "phi-3") && !strstr(low, "phi3"))
		return;
	for (size_t i = 0; i < t->n_special; i++)
		t->attr[t->special[i]] |= ATTR_RSTRIP;
	int32_t id = find_cstr(t, "</s>");
	if (id >= 0)
		t->attr[id] |= ATTR_RSTRIP;
	static const char *const keep[] = { "<unk>", "<s>", "<|endoftext|>" };
	for (size_t i = 0; i < 3; i++)
		if ((id = find_cstr(t, keep[i])) >= 0)
			t->attr[id] &= (uint16_t)~ATTR_RSTRIP;
}

static int special_cmp(const void *a, const void *b, void *ctx)
{
	const struct tok *t = ctx;
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	size_t lx = t->text_off[x + 1] - t->text_off[x], ly = t->text_off[y + 1] - t->text_off[y];
	if (lx != ly)
		return lx > ly ? -1 : 1;
	return x < y ? -1 : x > y;
}

static int build_special(struct tok *t, struct hearth_error *err)
{
	size_t n = 0;
	for (uint32_t i = 0; i < t->n_vocab; i++)
		n += (t->attr[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) != 0;
	t->special = malloc((n ? n : 1) * sizeof(*t->special));
	if (!t->special)
		return hearth_error_set(err, HEARTH_ENOMEM, "no memory for special tokens");
	t->n_special = 0;
	for (uint32_t i = 0; i < t->n_vocab; i++)
		if (t->attr[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN))
			t->special[t->n_special++] = (int32_t)i;
	/* longest first, so "<|im_end|>" wins over "<|im"; ties by id (llama.cpp leaves them to std::sort) */
	qsort_r(t->special, t->n_special, sizeof(*t->special), special_cmp, t);
	return 0;
}

/* Decoded bytes of token id into out (room for the token's text length); returns the count. */
static size_t piece_build(const struct tok *t, int32_t id, char *out)
{
	size_t len, n = 0;
	const char *txt = tok_text(t, id, &len);
	uint16_t attr = t->attr[id];

	if (attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED)) {
		memcpy(out, txt, len);
		return len;
	}
	if ((attr & ATTR_NORMAL) && t->model == MODEL_SPM) {
		for (size_t i = 0; i < len; i++) {
			if (i + 2 < len && memcmp(txt + i, "\xe2\x96\x81", 3) == 0) {
				out[n++] = ' ';
				i += 2;
			} else {
				out[n++] = txt[i];
			}
		}
		return n;
	}
	if (attr & ATTR_NORMAL) {
		for (size_t pos = 0; pos < len;) {
			size_t start = pos;
			int b = unicode_cpt_to_byte(unicode_decode_utf8(txt, len, &pos));
			if (b >= 0) {
				out[n++] = (char)b;
			} else {
				/* not a byte-level character: kept raw (llama.cpp writes [UNK_BYTE_..]) */
				memcpy(out + n, txt + start, pos - start);
				n += pos - start;
			}
		}
		return n;
	}
	if (attr & ATTR_BYTE) {
		/* "<0xNN>" */
		unsigned v = 0;
		for (size_t i = 3; i < 5 && i < len; i++) {
			char c = txt[i];
			v = v * 16 + (unsigned)(c >= '0' && c <= '9' ? c - '0'
						: c >= 'A' && c <= 'F' ? c - 'A' + 10
						: c >= 'a' && c <= 'f' ? c - 'a' + 10 : 0);
		}
		out[0] = (char)v;
		return 1;
	}
	return 0; /* unused and undefined tokens render as nothing */
}

/* One pass: a piece is never longer than its token's text, so the texts' size bounds all. */
static int build_pieces(struct tok *t, struct hearth_error *err)
{
	size_t total = 0;
	t->piece_off = calloc((size_t)t->n_vocab + 1, sizeof(*t->piece_off));
	t->piece = malloc(t->text_off[t->n_vocab] ? t->text_off[t->n_vocab] : 1);
	if (!t->piece_off || !t->piece)
		return hearth_error_set(err, HEARTH_ENOMEM, "no memory for token pieces");
	for (uint32_t i = 0; i < t->n_vocab; i++) {
		size_t n = piece_build(t, (int32_t)i, t->piece + total);
		t->piece_off[i] = total;
		total += n;
		if (n > t->piece_max)
			t->piece_max = n;
	}
	t->piece_off[t->n_vocab] = total;
	return 0;
}

static void build_bytes(struct tok *t)
{
	static const char hex[] = "0123456789ABCDEF";
	for (unsigned b = 0; b < 256; b++) {
		char buf[6] = { '<', '0', 'x', hex[b >> 4], hex[b & 15], '>' };
		char raw = (char)b;
		int32_t id = tok_find(t, buf, 6);
		t->byte_tok[b] = id >= 0 ? id : tok_find(t, &raw, 1);
		char u[4];
		size_t n = unicode_encode_utf8(unicode_byte_to_cpt((uint8_t)b), u);
		memcpy(t->byte_utf8[b], u, 2); /* GPT-2's code points are all below U+0800 */
		t->byte_utf8_len[b] = (uint8_t)n;
	}
}

int tok_load(struct tok **out, const struct gguf_file *f, struct hearth_error *err)
{
	*out = NULL;
	struct tok *t = calloc(1, sizeof(*t));
	if (!t)
		return hearth_error_set(err, HEARTH_ENOMEM, "%s: no memory for tokenizer", f->path);
	t->eot = t->eom = TOK_NULL;

	struct gguf_str model, pre;
	int rc = gguf_get_str(f, "tokenizer.ggml.model", &model, err);
	if (rc)
		goto fail;
	if ((rc = get_str_opt(f, "tokenizer.ggml.pre", &pre, err)))
		goto fail;
	if ((rc = load_tokens(t, f, err)))
		goto fail;

	if (gguf_str_eq(model, "llama")) {
		t->model = MODEL_SPM;
		t->pre = PRE_DEFAULT;
		t->bos = 1;
		t->eos = 2;
		t->unk = 0;
		t->add_space_prefix = true;
		t->add_bos = true;
	} else if (gguf_str_eq(model, "gpt2")) {
		t->model = MODEL_BPE;
		t->bos = 11; /* llama.cpp's defaults for BPE vocabularies without ids */
		t->eos = 11;
		t->unk = TOK_NULL;
		if ((rc = pick_pre(t, pre, f->path, err)))
			goto fail;
		if ((rc = load_merges(t, f, err)))
			goto fail;
	} else {
		rc = hearth_error_set(err, HEARTH_EUNSUPPORTED, "%s: tokenizer.ggml.model '%.*s' is not supported",
				      f->path, (int)(model.len > 64 ? 64 : model.len), model.ptr);
		goto fail;
	}
	if ((rc = get_bool_opt(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err)))
		goto fail;
	get_id_opt(f, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos);
	get_id_opt(f, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos);
	get_id_opt(f, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk);
	if ((rc = get_bool_opt(f, "tokenizer.ggml.add_bos_token", &t->add_bos, err)))
		goto fail;
	if (t->add_bos && t->bos == TOK_NULL) {
		rc = hearth_error_set(err, HEARTH_EFORMAT,
				      "%s: tokenizer.ggml.add_bos_token is true but there is no BOS token", f->path);
		goto fail;
	}
	if ((rc = get_bool_opt(f, "tokenizer.ggml.add_eos_token", &t->add_eos, err)))
		goto fail;
	t->add_eos = t->add_eos && t->eos != TOK_NULL;

	load_eog(t, f);
	if ((rc = build_special(t, err)))
		goto fail;
	load_strip_attrs(t, f);
	if ((rc = build_pieces(t, err)))
		goto fail;
	build_bytes(t);
	*out = t;
	return 0;
fail:
	tok_free(t);
	return rc;
}

void tok_free(struct tok *t)
{
	if (!t)
		return;
	free(t->text);
	free(t->text_off);
	free(t->score);
	free(t->attr);
	free(t->hash);
	free(t->mtext);
	free(t->moff);
	free(t->mhash);
	free(t->piece);
	free(t->piece_off);
	free(t->special);
	free(t);
}

/* ---- special-token partition ---- */

struct frag {
	size_t off, len; /* raw text, when id < 0 */
	int32_t id;      /* a special token */
};

static bool ascii_space(char c)
{
	return c == ' ' || (c >= '\t' && c <= '\r');
}

/* Splits text into raw fragments and special tokens the way llama.cpp's
 * tokenizer_st_partition does: tokens longest first, every occurrence left to right, with
 * the lstrip/rstrip attributes trimming ASCII whitespace next to a match. */
static int partition(const struct tok *t, const char *text, size_t len, bool parse_special,
		     struct array *frags)
{
	struct frag whole = { 0, len, TOK_NULL };
	frags->n = 0;
	if (len == 0)
		return 0;
	if (array_push(frags, &whole))
		return HEARTH_ENOMEM;

	/* byte pairs present in the text: most special tokens can be ruled out at once */
	static const size_t nbits = 65536;
	uint64_t *pairs = calloc(nbits / 64, sizeof(uint64_t));
	if (!pairs)
		return HEARTH_ENOMEM;
	for (size_t i = 0; i + 1 < len; i++) {
		unsigned k = (unsigned)(unsigned char)text[i] << 8 | (unsigned char)text[i + 1];
		pairs[k / 64] |= 1ull << (k % 64);
	}

	struct array next = { .elem = sizeof(struct frag) };
	int rc = 0;
	for (size_t s = 0; s < t->n_special; s++) {
		int32_t id = t->special[s];
		uint16_t attr = t->attr[id];
		if (!parse_special && (attr & (ATTR_CONTROL | ATTR_UNKNOWN)))
			continue;
		size_t tlen;
		const char *tt = tok_text(t, id, &tlen);
		if (tlen > len)
			continue;
		if (tlen >= 2) {
			unsigned k = (unsigned)(unsigned char)tt[0] << 8 | (unsigned char)tt[1];
			if (!(pairs[k / 64] & (1ull << (k % 64))))
				continue;
		}
		if (!memmem(text, len, tt, tlen))
			continue;

		next.n = 0;
		const struct frag *fr = frags->p;
		for (size_t i = 0; i < frags->n && !rc; i++) {
			struct frag cur = fr[i];
			if (cur.id >= 0) {
				rc = array_push(&next, &cur);
				continue;
			}
			size_t off = cur.off, rem = cur.len;
			for (;;) {
				const char *m = memmem(text + off, rem, tt, tlen);
				if (!m) {
					if (rem && (rc = array_push(&next, &(struct frag){ off, rem, TOK_NULL })))
						break;
					break;
				}
				size_t at = (size_t)(m - text);
				size_t left = at - off;
				if (attr & ATTR_LSTRIP)
					while (left > 0 && ascii_space(text[off + left - 1]))
						left--;
				if (left && (rc = array_push(&next, &(struct frag){ off, left, TOK_NULL })))
					break;
				if ((rc = array_push(&next, &(struct frag){ 0, 0, id })))
					break;
				size_t roff = at + tlen, rlen = off + rem - roff;
				if (attr & ATTR_RSTRIP)
					while (rlen > 0 && ascii_space(text[roff])) {
						roff++;
						rlen--;
					}
				off = roff;
				rem = rlen;
				if (!rem)
					break;
			}
		}
		if (rc)
			break;
		struct array tmp = *frags;
		*frags = next;
		next = tmp;
	}
	free(next.p);
	free(pairs);
	return rc;
}

/* ---- encode scratch ---- */

struct sym {
	int32_t prev, next;
	uint32_t off, n; /* bytes of the word */
};

struct bigram {
	float score;    /* SPM: higher first */
	uint32_t rank;  /* BPE: lower first */
	int32_t left, right;
	uint32_t size;
};

struct scratch {
	struct array frags;  /* struct frag */
	struct array cpts;   /* uint32_t */
	struct array flags;  /* uint16_t */
	struct array lens;   /* size_t: pre-tokenizer pieces, in code points */
	struct array lens2;
	struct array word;   /* char */
	struct array syms;   /* struct sym */
	struct array heap;   /* struct bigram */
	int32_t *out;
	size_t cap, n;
	int rc;
};

static void scratch_free(struct scratch *s)
{
	free(s->frags.p);
	free(s->cpts.p);
	free(s->flags.p);
	free(s->lens.p);
	free(s->lens2.p);
	free(s->word.p);
	free(s->syms.p);
	free(s->heap.p);
}

static void emit(struct scratch *s, int32_t id)
{
	if (s->n < s->cap)
		s->out[s->n] = id;
	s->n++;
}

static bool bigram_before(const struct bigram *a, const struct bigram *b, bool spm)
{
	if (spm) {
		if (a->score != b->score)
			return a->score > b->score;
	} else if (a->rank != b->rank) {
		return a->rank < b->rank;
	}
	return a->left < b->left;
}

static int heap_push(struct array *h, const struct bigram *b, bool spm)
{
	if (array_push(h, b))
		return HEARTH_ENOMEM;
	struct bigram *a = h->p;
	size_t i = h->n - 1;
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!bigram_before(&a[i], &a[p], spm))
			break;
		struct bigram tmp = a[i];
		a[i] = a[p];
		a[p] = tmp;
		i = p;
	}
	return 0;
}

static struct bigram heap_pop(struct array *h, bool spm)
{
	struct bigram *a = h->p, top = a[0];
	a[0] = a[--h->n];
	size_t i = 0;
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < h->n && bigram_before(&a[l], &a[m], spm))
			m = l;
		if (r < h->n && bigram_before(&a[r], &a[m], spm))
			m = r;
		if (m == i)
			break;
		struct bigram tmp = a[i];
		a[i] = a[m];
		a[m] = tmp;
		i = m;
	}
	return top;
}

/* Splits word into symbols of one UTF-8 sequence each (by the lead byte, as llama.cpp). */
static int word_symbols(struct scratch *s, const char *w, size_t len)
{
	s->syms.n = 0;
	for (size_t off = 0; off < len;) {
		size_t n = unicode_len_utf8((unsigned char)w[off]);
		if (n > len - off)
			n = len - off;
		struct sym sy = { (int32_t)s->syms.n - 1, off + n == len ? -1 : (int32_t)s->syms.n + 1,
				  (uint32_t)off, (uint32_t)n };
		if (array_push(&s->syms, &sy))
			return HEARTH_ENOMEM;
		off += n;
	}
	return 0;
}

/* ---- SentencePiece ---- */

static int spm_try_bigram(const struct tok *t, struct scratch *s, const char *w, int32_t left, int32_t right)
{
	if (left < 0 || right < 0)
		return 0;
	struct sym *sy = s->syms.p;
	uint32_t size = sy[left].n + sy[right].n;
	int32_t id = tok_find(t, w + sy[left].off, size);
	if (id < 0)
		return 0;
	struct bigram b = { t->score[id], 0, left, right, size };
	return heap_push(&s->heap, &b, true);
}

static int spm_encode(const struct tok *t, struct scratch *s, const char *text, size_t len, bool prefix)
{
	/* the text with a leading space, every ' ' written as U+2581 */
	s->word.n = 0;
	size_t spaces = prefix;
	for (size_t i = 0; i < len; i++)
		spaces += text[i] == ' ';
	if (array_reserve(&s->word, len + 2 * spaces + 3))
		return HEARTH_ENOMEM;
	char *w = s->word.p;
	size_t n = 0;
	if (prefix) {
		memcpy(w, "\xe2\x96\x81", 3);
		n = 3;
	}
	for (size_t i = 0; i < len; i++) {
		if (text[i] == ' ') {
			memcpy(w + n, "\xe2\x96\x81", 3);
			n += 3;
		} else {
			w[n++] = text[i];
		}
	}
	if (word_symbols(s, w, n))
		return HEARTH_ENOMEM;
	s->heap.n = 0;
	for (size_t i = 1; i < s->syms.n; i++)
		if (spm_try_bigram(t, s, w, (int32_t)i - 1, (int32_t)i))
			return HEARTH_ENOMEM;
	while (s->heap.n) {
		struct bigram b = heap_pop(&s->heap, true);
		struct sym *sy = s->syms.p;
		struct sym *l = &sy[b.left], *r = &sy[b.right];
		if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
			continue; /* one side already merged elsewhere */
		l->n += r->n;
		r->n = 0;
		l->next = r->next;
		if (r->next >= 0)
			sy[r->next].prev = b.left;
		if (spm_try_bigram(t, s, w, l->prev, b.left) || spm_try_bigram(t, s, w, b.left, sy[b.left].next))
			return HEARTH_ENOMEM;
	}
	const struct sym *sy = s->syms.p;
	for (int32_t i = s->syms.n ? 0 : -1; i >= 0; i = sy[i].next) {
		int32_t id = tok_find(t, w + sy[i].off, sy[i].n);
		if (id >= 0) {
			emit(s, id);
			continue;
		}
		/* not in the vocabulary: byte fallback, one <0xNN> per byte */
		for (uint32_t k = 0; k < sy[i].n; k++) {
			int32_t b = t->byte_tok[(unsigned char)w[sy[i].off + k]];
			if (b < 0)
				b = t->unk; /* llama.cpp aborts here; a vocabulary without bytes */
			if (b >= 0)
				emit(s, b);
		}
	}
	return 0;
}

/* ---- pre-tokenizer splitters ---- */

#define OOR 0xFFFFFFFFu

struct span {
	const uint32_t *c;
	const uint16_t *f;
	size_t a, b; /* the piece being split: [a, b) */
};

static uint32_t sp_cpt(const struct span *sp, size_t i)
{
	return i >= sp->a && i < sp->b ? sp->c[i] : OOR;
}

static uint16_t sp_flags(const struct span *sp, size_t i)
{
	return i >= sp->a && i < sp->b ? sp->f[i] : 0;
}

#define F_LNW (UNICODE_LETTER | UNICODE_NUMBER | UNICODE_WHITESPACE)

static int push_len(struct array *o, size_t *prev, size_t end)
{
	size_t len = end - *prev;
	*prev = end;
	return len ? array_push(o, &len) : 0;
}

static uint32_t ascii_lower(uint32_t c)
{
	return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* 's|'t|'re|'ve|'m|'ll|'d and their case-insensitive (?i:...) form: the length or 0. */
static size_t contraction(const struct span *sp, size_t pos, bool nocase)
{
	if (sp_cpt(sp, pos) != '\'' || pos + 1 >= sp->b)
		return 0;
	uint32_t n1 = sp_cpt(sp, pos + 1);
	if (nocase)
		n1 = ascii_lower(n1);
	if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd')
		return 2;
	if (pos + 2 >= sp->b)
		return 0;
	uint32_t n2 = sp_cpt(sp, pos + 2);
	if (nocase)
		n2 = ascii_lower(n2);
	if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l'))
		return 3;
	return 0;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (llama.cpp's unicode_regex_split_custom_gpt2, which its gpt-2 pre-tokenizer uses). */
static int split_gpt2(const struct span *sp, struct array *o)
{
	size_t prev = sp->a;
	for (size_t pos = sp->a; pos < sp->b;) {
		uint32_t c = sp_cpt(sp, pos);
		uint16_t f = sp_flags(sp, pos);
		size_t k = contraction(sp, pos, false);
		if (k) {
			pos += k;
			if (push_len(o, &prev, pos))
				return HEARTH_ENOMEM;
			continue;
		}
		uint16_t f2 = c == ' ' ? sp_flags(sp, pos + 1) : f;
		uint16_t cls = f2 & UNICODE_LETTER ? UNICODE_LETTER : f2 & UNICODE_NUMBER ? UNICODE_NUMBER : 0;
		if (cls) {
			pos += c == ' ';
			while (f2 & cls)
				f2 = sp_flags(sp, ++pos);
			if (push_len(o, &prev, pos))
				return HEARTH_ENOMEM;
			continue;
		}
		if (!(f2 & F_LNW) && f2) {
			pos += c == ' ';
			while (!(f2 & F_LNW) && f2)
				f2 = sp_flags(sp, ++pos);
			if (push_len(o, &prev, pos))
				return HEARTH_ENOMEM;
			continue;
		}
		size_t ws = 0;
		while (sp_flags(sp, pos + ws) & UNICODE_WHITESPACE)
			ws++;
		if (ws > 1 && sp_cpt(sp, pos + ws) != OOR)
			pos += ws - 1; /* \s+(?!\S): leave the last space to the next word */
		else if (ws > 0)
			pos += ws;
		else
			pos++;
		if (push_len(o, &prev, pos))
			return HEARTH_ENOMEM;
	}
	return 0;
}

/* Llama 3 (digits = 3) and Qwen2 (digits = 1):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,digits}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * Port of llama.cpp's unicode_regex_split_custom_llama3. For Qwen2 llama.cpp runs the
 * regex through std::regex instead; on these classes that gives the same splits. */
static int split_llama3(const struct span *sp, size_t digits, struct array *o)
{
	size_t prev = sp->a;
	for (size_t pos = sp->a; pos < sp->b;) {
		uint32_t c = sp_cpt(sp, pos);
		uint16_t f = sp_flags(sp, pos);
		size_t k = contraction(sp, pos, true);
		if (k) {
			pos += k;
			if (push_len(o, &prev, pos))
				return HEARTH_ENOMEM;
			continue;
		}
		if (!(c == '\r' || c == '\n' || (f & UNICODE_NUMBER)) &&
		    ((f & UNICODE_LETTER) || (sp_flags(sp, pos + 1) & UNICODE_LETTER))) {
			pos++;
			while (sp_flags(sp, pos) & UNICODE_LETTER)
				pos++;
			if (push_len(o, &prev, pos))
				return HEARTH_ENOMEM;
			continue;
		}
		if (f & UNICODE_NUMBER) {
			size_t ini = pos;
			while (sp_flags(sp, pos) & UNICODE_NUMBER) {
				if (++pos - ini >= digits) {
					if (push_len(o, &prev, pos))
						return HEARTH_ENOMEM;
					ini = pos;
				}
			}
			if (push_len(o, &prev, pos))
				return HEARTH_ENOMEM;
			continue;
		}
		uint16_t f2 = c == ' ' ? sp_flags(sp, pos + 1) : f;
		if (!(f2 & F_LNW) && f) {
			pos += c == ' ';
			while (!(f2 & F_LNW) && f2)
				f2 = sp_flags(sp, ++pos);
			uint32_t c2 = sp_cpt(sp, pos);
			while (c2 == '\r' || c2 == '\n')
				c2 = sp_cpt(sp, ++pos);
			if (push_len(o, &prev, pos))
				return HEARTH_ENOMEM;
			continue;
		}
		size_t ws = 0, last_nl = 0;
		while (sp_flags(sp, pos + ws) & UNICODE_WHITESPACE) {
			uint32_t c2 = sp_cpt(sp, pos + ws);
			if (c2 == '\r' || c2 == '\n')
				last_nl = pos + ws + 1;
			ws++;
		}
		if (last_nl > 0)
			pos = last_nl;  /* \s*[\r\n]+ */
		else if (ws > 1 && sp_cpt(sp, pos + ws) != OOR)
			pos += ws - 1;  /* \s+(?!\S) */
		else if (ws > 0)
			pos += ws;
		else
			pos++;
		if (push_len(o, &prev, pos))
			return HEARTH_ENOMEM;
	}
	return 0;
}

/* For regexes llama.cpp runs through std::regex: each match becomes a piece and so does
 * each stretch between matches. match() gives the length of the leftmost-first match
 * starting exactly at pos, or 0. None of these regexes can match the empty string. */
typedef size_t (*match_fn)(const struct span *sp, size_t pos);

static int split_isolated(const struct span *sp, match_fn match, struct array *o)
{
	size_t prev = sp->a;
	for (size_t pos = sp->a; pos < sp->b;) {
		size_t n = match(sp, pos);
		if (!n) {
			pos++;
			continue;
		}
		if (push_len(o, &prev, pos) || push_len(o, &prev, pos + n))
			return HEARTH_ENOMEM;
		pos += n;
	}
	return push_len(o, &prev, sp->b);
}

struct cpt_range {
	uint32_t lo, hi;
};

static bool in_ranges(uint32_t c, const struct cpt_range *r, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (c >= r[i].lo && c <= r[i].hi)
			return true;
	return false;
}

/* std::wregex sees non-ASCII whitespace as \v (llama.cpp substitutes it), so such code
 * points never match a bracket range even when they lie inside it. */
static bool sp_in(const struct span *sp, size_t i, const struct cpt_range *r, size_t n)
{
	uint32_t c = sp_cpt(sp, i);
	if (c == OOR || (c > 0x7F && (sp_flags(sp, i) & UNICODE_WHITESPACE)))
		return false;
	return in_ranges(c, r, n);
}

/* \s?[set]+ */
static size_t match_ws_set(const struct span *sp, size_t pos, const struct cpt_range *r, size_t n)
{
	size_t p = pos;
	if ((sp_flags(sp, p) & UNICODE_WHITESPACE) && sp_in(sp, p + 1, r, n))
		p++;
	size_t start = p;
	while (sp_in(sp, p, r, n))
		p++;
	return p > start ? p - pos : 0;
}

/* DeepSeek LLM's cased-letter class, as written in its tokenizer.json */
static const struct cpt_range dsl_letters[] = {
	{0x00041, 0x0005A}, {0x00061, 0x0007A}, {0x000B5, 0x000B5}, {0x000C0, 0x000D6}, {0x000D8, 0x000F6}, {0x000F8, 0x001BA},
	{0x001BC, 0x001BF}, {0x001C4, 0x00293}, {0x00295, 0x002AF}, {0x00370, 0x00373}, {0x00376, 0x00377},
	{0x0037B, 0x0037D}, {0x0037F, 0x0037F}, {0x00386, 0x00386}, {0x00388, 0x0038A}, {0x0038C, 0x0038C}, {0x0038E, 0x003A1},
	{0x003A3, 0x003F5}, {0x003F7, 0x00481}, {0x0048A, 0x0052F}, {0x00531, 0x00556}, {0x010A0, 0x010C5}, {0x013A0, 0x013F5},
	{0x013F8, 0x013FD}, {0x01C90, 0x01CBA}, {0x01CBD, 0x01CBF}, {0x01D00, 0x01D2B}, {0x01D6B, 0x01D77}, {0x01D79, 0x01D9A},
	{0x01E00, 0x01F15}, {0x01F18, 0x01F1D}, {0x01F20, 0x01F45}, {0x01F48, 0x01F4D}, {0x01F50, 0x01F57}, {0x01F59, 0x01F59},
	{0x01F5B, 0x01F5B}, {0x01F5D, 0x01F5D}, {0x01F5F, 0x01F7D}, {0x01F80, 0x01FB4}, {0x01FB6, 0x01FBC}, {0x01FBE, 0x01FBE},
	{0x01FC2, 0x01FC4}, {0x01FC6, 0x01FCC}, {0x01FD0, 0x01FD3}, {0x01FD6, 0x01FDB}, {0x01FE0, 0x01FEC}, {0x01FF2, 0x01FF4},
	{0x01FF6, 0x01FFC}, {0x02102, 0x02102}, {0x02107, 0x02107}, {0x0210A, 0x02113}, {0x02115, 0x02115}, {0x02119, 0x0211D},
	{0x02124, 0x02124}, {0x02126, 0x02126}, {0x02128, 0x02128}, {0x0212A, 0x0212D}, {0x0212F, 0x02134}, {0x02139, 0x02139},
	{0x0213C, 0x0213F}, {0x02145, 0x02149}, {0x0214E, 0x0214E}, {0x02183, 0x02184},
	{0x02C00, 0x02C7B}, {0x02C7E, 0x02CE4}, {0x02CEB, 0x02CEE}, {0x02CF2, 0x02CF3}, {0x0A640, 0x0A66D}, {0x0A680, 0x0A69B},
	{0x0A722, 0x0A76F}, {0x0A771, 0x0A787}, {0x0A78B, 0x0A78E}, {0x0AB70, 0x0ABBF}, {0x0FB00, 0x0FB06}, {0x0FB13, 0x0FB17},
	{0x0FF21, 0x0FF3A}, {0x0FF41, 0x0FF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB}, {0x10C80, 0x10CB2},
	{0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};

/* [!-/:-~！-／：-～‘-‟　-。] */
static const struct cpt_range dsl_punct[] = {
	{0x21, 0x2F}, {0x3A, 0x7E}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E}, {0x2018, 0x201F}, {0x3000, 0x3002},
};

/* [一-龥ࠀ-一가-퟿] */
static const struct cpt_range dsl_cjk[] = {
	{0x4E00, 0x9FA5}, {0x0800, 0x4E00}, {0xAC00, 0xD7FF},
};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static size_t match_newline(const struct span *sp, size_t pos)
{
	uint32_t c = sp_cpt(sp, pos);
	return c == '\r' || c == '\n';
}

static size_t match_dsl_letters(const struct span *sp, size_t pos)
{
	return match_ws_set(sp, pos, dsl_letters, N_OF(dsl_letters));
}

static size_t match_dsl_punct(const struct span *sp, size_t pos)
{
	return match_ws_set(sp, pos, dsl_punct, N_OF(dsl_punct));
}

static size_t match_dsl_cjk(const struct span *sp, size_t pos)
{
	size_t p = pos;
	while (sp_in(sp, p, dsl_cjk, N_OF(dsl_cjk)))
		p++;
	return p - pos;
}

/* \p{N} through llama.cpp's "collapsed" text: ASCII digits, and non-ASCII code points
 * whose only category is number (whitespace is collapsed first). */
static bool sp_number(const struct span *sp, size_t i)
{
	uint32_t c = sp_cpt(sp, i);
	if (c == OOR)
		return false;
	if (c < 0x80)
		return c >= '0' && c <= '9';
	uint16_t f = sp_flags(sp, i);
	return !(f & UNICODE_WHITESPACE) && (f & UNICODE_CATEGORY_MASK) == UNICODE_NUMBER;
}

static size_t match_number_run(const struct span *sp, size_t pos)
{
	size_t p = pos;
	while (sp_number(sp, p))
		p++;
	return p - pos;
}

/* [\p{P}\$\+<=>\^~\|]+ (collapsed: ASCII by the fixed list llama.cpp uses) */
static size_t match_punct_run(const struct span *sp, size_t pos)
{
	size_t p = pos;
	for (;; p++) {
		uint32_t c = sp_cpt(sp, p);
		if (c == OOR)
			break;
		bool ok;
		if (c < 0x80) {
			ok = c != '`' && ((c >= '!' && c <= '/') || (c >= ':' && c <= '@') ||
					  (c >= '[' && c <= '_') || (c >= '{' && c <= '~'));
		} else {
			uint16_t f = sp_flags(sp, p);
			ok = !(f & UNICODE_WHITESPACE) && (f & UNICODE_CATEGORY_MASK) == UNICODE_PUNCT;
		}
		if (!ok)
			break;
	}
	return p - pos;
}

/* [0-9][0-9][0-9] */
static size_t match_digits3(const struct span *sp, size_t pos)
{
	for (size_t i = 0; i < 3; i++) {
		uint32_t c = sp_cpt(sp, pos + i);
		if (c < '0' || c > '9')
			return 0;
	}
	return 3;
}

/* \s+$ : the whitespace run that ends the piece */
static int split_trailing_ws(const struct span *sp, struct array *o)
{
	size_t t = sp->b;
	while (t > sp->a && (sp->f[t - 1] & UNICODE_WHITESPACE))
		t--;
	size_t prev = sp->a;
	if (push_len(o, &prev, t) || push_len(o, &prev, sp->b))
		return HEARTH_ENOMEM;
	return 0;
}

enum pass_kind { PASS_GPT2, PASS_LLAMA3, PASS_QWEN2, PASS_MATCH, PASS_TRAILING_WS };

struct pass {
	enum pass_kind kind;
	match_fn match;
};

static const struct pass passes_default[] = {
	{ PASS_MATCH, match_punct_run }, { PASS_GPT2, NULL },
	{ PASS_MATCH, match_number_run }, { PASS_MATCH, match_digits3 },
};
static const struct pass passes_gpt2[] = { { PASS_GPT2, NULL } };
static const struct pass passes_llama3[] = { { PASS_LLAMA3, NULL } };
static const struct pass passes_qwen2[] = { { PASS_QWEN2, NULL } };
static const struct pass passes_deepseek_llm[] = {
	{ PASS_MATCH, match_newline }, { PASS_MATCH, match_dsl_letters },
	{ PASS_MATCH, match_dsl_punct }, { PASS_TRAILING_WS, NULL },
	{ PASS_MATCH, match_dsl_cjk }, { PASS_MATCH, match_number_run },
};

/* Runs the pre-tokenizer's passes over s->cpts; each pass refines the pieces of the last. */
static int pre_split(const struct tok *t, struct scratch *s)
{
	const struct pass *p;
	size_t np;
	switch (t->pre) {
	case PRE_GPT2: p = passes_gpt2; np = N_OF(passes_gpt2); break;
	case PRE_LLAMA3: p = passes_llama3; np = N_OF(passes_llama3); break;
	case PRE_QWEN2: p = passes_qwen2; np = N_OF(passes_qwen2); break;
	case PRE_DEEPSEEK_LLM: p = passes_deepseek_llm; np = N_OF(passes_deepseek_llm); break;
	default: p = passes_default; np = N_OF(passes_default); break;
	}
	s->lens.n = 0;
	if (s->cpts.n && array_push(&s->lens, &s->cpts.n))
		return HEARTH_ENOMEM;
	for (size_t k = 0; k < np; k++) {
		s->lens2.n = 0;
		size_t start = 0;
		for (size_t i = 0; i < s->lens.n; i++) {
			size_t len = ((size_t *)s->lens.p)[i];
			struct span sp = { s->cpts.p, s->flags.p, start, start + len };
			int rc;
			switch (p[k].kind) {
			case PASS_GPT2: rc = split_gpt2(&sp, &s->lens2); break;
			case PASS_LLAMA3: rc = split_llama3(&sp, 3, &s->lens2); break;
			case PASS_QWEN2: rc = split_llama3(&sp, 1, &s->lens2); break;
			case PASS_TRAILING_WS: rc = split_trailing_ws(&sp, &s->lens2); break;
			default: rc = split_isolated(&sp, p[k].match, &s->lens2); break;
			}
			if (rc)
				return rc;
			start += len;
		}
		struct array tmp = s->lens;
		s->lens = s->lens2;
		s->lens2 = tmp;
	}
	return 0;
}

/* ---- byte-level BPE ---- */

static int bpe_try_bigram(const struct tok *t, struct scratch *s, const char *w, int32_t left,
			  int32_t right)
{
	if (left < 0 || right < 0)
		return 0;
	const struct sym *sy = s->syms.p;
	int64_t rank = merge_rank(t, w + sy[left].off, sy[left].n, w + sy[right].off, sy[right].n);
	if (rank < 0)
		return 0;
	struct bigram b = { 0, (uint32_t)rank, left, right, sy[left].n + sy[right].n };
	return heap_push(&s->heap, &b, false);
}

static int bpe_word(const struct tok *t, struct scratch *s, const char *w, size_t len)
{
	int32_t whole;
	if (t->ignore_merges && (whole = tok_find(t, w, len)) >= 0) {
		emit(s, whole);
		return 0;
	}
	if (word_symbols(s, w, len))
		return HEARTH_ENOMEM;
	struct sym *sy;
	s->heap.n = 0;
	for (size_t i = 1; i < s->syms.n; i++)
		if (bpe_try_bigram(t, s, w, (int32_t)i - 1, (int32_t)i))
			return HEARTH_ENOMEM;
	while (s->heap.n) {
		struct bigram b = heap_pop(&s->heap, false);
		sy = s->syms.p;
		struct sym *l = &sy[b.left], *r = &sy[b.right];
		if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
			continue; /* outdated: a side merged with something else first */
		l->n += r->n;
		r->n = 0;
		l->next = r->next;
		if (r->next >= 0)
			sy[r->next].prev = b.left;
		if (bpe_try_bigram(t, s, w, l->prev, b.left) || bpe_try_bigram(t, s, w, b.left, sy[b.left].next))
			return HEARTH_ENOMEM;
	}
	sy = s->syms.p;
	for (int32_t i = s->syms.n ? 0 : -1; i >= 0; i = sy[i].next) {
		int32_t id = tok_find(t, w + sy[i].off, sy[i].n);
		if (id >= 0) {
			emit(s, id);
			continue;
		}
		/* llama.cpp tries each byte of the symbol's text as a token and drops misses */
		for (uint32_t k = 0; k < sy[i].n; k++)
			if ((id = tok_find(t, w + sy[i].off + k, 1)) >= 0)
				emit(s, id);
	}
	return 0;
}

static int bpe_encode(const struct tok *t, struct scratch *s, const char *text, size_t len)
{
	s->cpts.n = 0;
	s->flags.n = 0;
	if (array_reserve(&s->cpts, len) || array_reserve(&s->flags, len))
		return HEARTH_ENOMEM;
	uint32_t *c = s->cpts.p;
	uint16_t *f = s->flags.p;
	for (size_t pos = 0; pos < len;) {
		uint32_t cpt = unicode_decode_utf8(text, len, &pos);
		c[s->cpts.n] = cpt;
		f[s->cpts.n] = unicode_flags(cpt);
		s->cpts.n++;
	}
	s->flags.n = s->cpts.n;
	int rc = pre_split(t, s);
	if (rc)
		return rc;

	size_t start = 0;
	for (size_t i = 0; i < s->lens.n; i++) {
		size_t n = ((size_t *)s->lens.p)[i];
		/* the piece's UTF-8, every byte written as its GPT-2 code point */
		s->word.n = 0;
		if (array_reserve(&s->word, n * 8))
			return HEARTH_ENOMEM;
		char *w = s->word.p;
		size_t wn = 0;
		for (size_t k = start; k < start + n; k++) {
			char u[4];
			size_t ul = unicode_encode_utf8(((uint32_t *)s->cpts.p)[k], u);
			for (size_t j = 0; j < ul; j++) {
				unsigned char b = (unsigned char)u[j];
				memcpy(w + wn, t->byte_utf8[b], t->byte_utf8_len[b]);
				wn += t->byte_utf8_len[b];
			}
		}
		if ((rc = bpe_word(t, s, w, wn)))
			return rc;
		start += n;
	}
	return 0;
}

int tok_encode_segments(const struct tok *t, const struct tok_segment *seg, size_t n_seg, bool add_bos,
			int32_t *out, size_t cap, size_t *n_out, struct hearth_error *err)
{
	struct scratch s = { .frags = { .elem = sizeof(struct frag) }, .cpts = { .elem = sizeof(uint32_t) },
			     .flags = { .elem = sizeof(uint16_t) }, .lens = { .elem = sizeof(size_t) },
			     .lens2 = { .elem = sizeof(size_t) }, .word = { .elem = 1 },
			     .syms = { .elem = sizeof(struct sym) }, .heap = { .elem = sizeof(struct bigram) },
			     .out = out, .cap = cap };
	*n_out = 0;
	size_t total = 0;
	for (size_t k = 0; k < n_seg; k++) {
		if (seg[k].len && !seg[k].text)
			return hearth_error_set(err, HEARTH_EINVAL, "tok_encode: NULL text of %zu bytes", seg[k].len);
		if (seg[k].len >= UINT32_MAX / 8)
			return hearth_error_set(err, HEARTH_ERANGE, "tok_encode: text of %zu bytes is too long",
						seg[k].len);
		total += seg[k].len;
	}
	if (add_bos) {
		if (t->bos < 0)
			return hearth_error_set(err, HEARTH_ENOTFOUND, "tok_encode: the model has no BOS token");
		emit(&s, t->bos);
	}
	int rc = 0;
	bool prev_special = true; /* SPM: a space goes in front of text that starts the input */
	/* Each segment is partitioned on its own: special-token text is matched only where the
	 * segment allows it, and raw text never merges across a segment boundary. */
	for (size_t k = 0; !rc && k < n_seg; k++) {
		const char *text = seg[k].text;
		rc = partition(t, text, seg[k].len, seg[k].parse_special, &s.frags);
		for (size_t i = 0; !rc && i < s.frags.n; i++) {
			const struct frag *fr = &((const struct frag *)s.frags.p)[i];
			if (fr->id >= 0) {
				emit(&s, fr->id);
				prev_special = true;
				continue;
			}
			if (t->model == MODEL_SPM)
				rc = spm_encode(t, &s, text + fr->off, fr->len, t->add_space_prefix && prev_special);
			else
				rc = bpe_encode(t, &s, text + fr->off, fr->len);
			prev_special = false;
		}
	}
	scratch_free(&s);
	if (rc)
		return hearth_error_set(err, rc, "tok_encode: no memory for %zu bytes of text", total);
	*n_out = s.n;
	if (s.n > cap)
		return hearth_error_set(err, HEARTH_ERANGE, "tok_encode: %zu tokens do not fit in %zu",
					s.n, cap);
	return 0;
}

int tok_encode(const struct tok *t, const char *text, size_t len, bool add_bos, bool parse_special,
	       int32_t *out, size_t cap, size_t *n_out, struct hearth_error *err)
{
	struct tok_segment one = { text, len, parse_special };
	return tok_encode_segments(t, &one, 1, add_bos, out, cap, n_out, err);
}

int tok_encode_alloc(const struct tok *t, const char *text, size_t len, bool add_bos, bool parse_special,
		     int32_t **out, size_t *n_out, struct hearth_error *err)
{
	/* A token per byte and the BOS is enough but for byte fallback of invalid UTF-8, where
	 * the one retry at the count tok_encode names takes over. */
	size_t cap = len + 2;
	int32_t *ids = malloc(cap * sizeof *ids);
	*out = NULL;
	if (!ids)
		return hearth_error_set(err, HEARTH_ENOMEM, "out of memory for %zu tokens", cap);
	int rc = tok_encode(t, text, len, add_bos, parse_special, ids, cap, n_out, err);
	if (rc == HEARTH_ERANGE) {
		int32_t *more = realloc(ids, *n_out * sizeof *ids);
		if (!more) {
			free(ids);
			return hearth_error_set(err, HEARTH_ENOMEM, "out of memory for %zu tokens", *n_out);
		}
		ids = more;
		rc = tok_encode(t, text, len, add_bos, parse_special, ids, *n_out, n_out, err);
	}
	if (rc < 0) {
		free(ids);
		return rc;
	}
	*out = ids;
	return 0;
}

/* ---- decode ---- */

static const char *piece_of(const struct tok *t, int32_t id, bool special, size_t *len)
{
	if (id < 0 || (uint32_t)id >= t->n_vocab ||
	    (!special && (t->attr[id] & (ATTR_CONTROL | ATTR_UNKNOWN)))) {
		*len = 0;
		return "";
	}
	*len = t->piece_off[id + 1] - t->piece_off[id];
	return t->piece + t->piece_off[id];
}

size_t tok_piece(const struct tok *t, int32_t id, bool special, char *buf, size_t cap)
{
	size_t len;
	const char *p = piece_of(t, id, special, &len);
	if (len <= cap && len)
		memcpy(buf, p, len);
	return len;
}

size_t tok_piece_max(const struct tok *t)
{
	return t->piece_max;
}

int tok_decode(const struct tok *t, const int32_t *ids, size_t n, bool special, char *buf,
	       size_t cap, size_t *n_out, struct hearth_error *err)
{
	size_t total = 0;
	*n_out = 0;
	for (size_t i = 0; i < n; i++) {
		if (ids[i] < 0 || (uint32_t)ids[i] >= t->n_vocab)
			return hearth_error_set(err, HEARTH_EINVAL, "tok_decode: id %d at %zu is outside 0..%u",
						ids[i], i, t->n_vocab - 1);
		size_t len;
		const char *p = piece_of(t, ids[i], special, &len);
		if (i == 0 && t->add_space_prefix && len && p[0] == ' ') {
			p++;
			len--;
		}
		if (total + len <= cap && len)
			memcpy(buf + total, p, len);
		total += len;
	}
	*n_out = total;
	if (total > cap)
		return hearth_error_set(err, HEARTH_ERANGE, "tok_decode: %zu bytes do not fit in %zu",
					total, cap);
	return 0;
}

size_t tok_stream_bound(const struct tok *t)
{
	return 3 * (t->piece_max + 4);
}

void tok_stream_init(struct tok_stream *s)
{
	s->n_pend = 0;
}

/* Length of the valid UTF-8 sequence at p (RFC 3629: no overlongs, surrogates or values
 * above U+10FFFF), 0 if the bytes are invalid, or -need if they are a valid but
 * incomplete start. */
static int utf8_seq(const unsigned char *p, size_t n)
{
	unsigned char c = p[0];
	size_t want;
	unsigned char lo = 0x80, hi = 0xBF;
	if (c < 0x80)
		return 1;
	if (c >= 0xC2 && c <= 0xDF)
		want = 2;
	else if (c >= 0xE0 && c <= 0xEF) {
		want = 3;
		if (c == 0xE0)
			lo = 0xA0;
		if (c == 0xED)
			hi = 0x9F;
	} else if (c >= 0xF0 && c <= 0xF4) {
		want = 4;
		if (c == 0xF0)
			lo = 0x90;
		if (c == 0xF4)
			hi = 0x8F;
	} else
		return 0;
	for (size_t i = 1; i < want; i++) {
		if (i >= n)
			return -(int)want;
		unsigned char b = p[i];
		if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF))
			return 0;
	}
	return (int)want;
}

/* Valid UTF-8 of in[0..n) into out (NULL: only measure); an incomplete tail is kept in
 * *keep when keep is non-NULL (else replaced). Invalid maximal subparts -> U+FFFD. */
static size_t utf8_clean(const unsigned char *in, size_t n, char *out, size_t *keep)
{
	size_t o = 0;
	for (size_t i = 0; i < n;) {
		int k = utf8_seq(in + i, n - i);
		if (k > 0) {
			if (out)
				memcpy(out + o, in + i, (size_t)k);
			o += (size_t)k;
			i += (size_t)k;
			continue;
		}
		if (k < 0 && keep) {
			*keep = n - i;
			return o;
		}
		/* skip the maximal subpart: the lead plus the continuation bytes that were valid */
		size_t skip = 1;
		while (i + skip < n && skip < 4 && utf8_seq(in + i, skip + 1) < 0)
			skip++;
		if (k < 0)
			skip = n - i;
		if (out)
			memcpy(out + o, "\xef\xbf\xbd", 3);
		o += 3;
		i += skip;
	}
	if (keep)
		*keep = 0;
	return o;
}

size_t tok_stream_push(const struct tok *t, struct tok_stream *s, int32_t id, bool special,
		       char *out, size_t cap)
{
	size_t len;
	const char *p = piece_of(t, id, special, &len);
	unsigned char small[64];
	unsigned char *buf = small;
	if (s->n_pend + len > sizeof(small)) {
		buf = malloc(s->n_pend + len);
		if (!buf)
			return (size_t)-1; /* cannot happen for sane pieces; reads as "too small" */
	}
	memcpy(buf, s->pend, s->n_pend);
	memcpy(buf + s->n_pend, p, len);
	size_t n = s->n_pend + len, keep;
	size_t need = utf8_clean(buf, n, NULL, &keep);
	if (need <= cap) {
		utf8_clean(buf, n, out, &keep);
		memcpy(s->pend, buf + n - keep, keep);
		s->n_pend = (uint8_t)keep;
	}
	if (buf != small)
		free(buf);
	return need;
}

size_t tok_stream_flush(struct tok_stream *s, char *out, size_t cap)
{
	size_t need = utf8_clean(s->pend, s->n_pend, NULL, NULL);
	if (need <= cap) {
		utf8_clean(s->pend, s->n_pend, out, NULL);
		s->n_pend = 0;
	}
	return need;
}

int32_t tok_n_vocab(const struct tok *t) { return (int32_t)t->n_vocab; }
int32_t tok_bos(const struct tok *t) { return t->bos; }
int32_t tok_eos(const struct tok *t) { return t->eos; }
int32_t tok_eot(const struct tok *t) { return t->eot; }
bool tok_add_bos(const struct tok *t) { return t->add_bos; }

bool tok_add_eos(const struct tok *t) { return t->add_eos; }

bool tok_is_eog(const struct tok *t, int32_t id)
{
	for (size_t i = 0; i < t->n_eog; i++)
		if (t->eog[i] == id)
			return true;
	return false;
}

bool tok_is_control(const struct tok *t, int32_t id)
{
	return id >= 0 && (uint32_t)id < t->n_vocab && (t->attr[id] & ATTR_CONTROL);
}
