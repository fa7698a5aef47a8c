/* The model's description: reads a GGUF file's architecture, hyperparameters, per-layer
 * settings and weight views (model_load), validated against the file. Both engines start
 * from it: the f32 oracle (ref/forward.c) and the int4 loader (load.c). */
#include "daemon/engine/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "kernels/quant.h"

#define MODEL_MAX_LAYERS 4096
#define MODEL_DEFAULT_MAX_CTX 4096

/* ------------------------------------------------------------------------------------ */
/* Loading                                                                               */

struct arch_info {
	const char *name;
	enum model_arch arch;
	enum ops_rope_style rope;
};

static const struct arch_info arch_table[] = {
	{ "llama", MODEL_ARCH_LLAMA, OPS_ROPE_NORM },
	{ "qwen2", MODEL_ARCH_QWEN2, OPS_ROPE_NEOX },
	{ "qwen3", MODEL_ARCH_QWEN3, OPS_ROPE_NEOX },
	{ "gemma3", MODEL_ARCH_GEMMA3, OPS_ROPE_NEOX },
};

const char *model_arch_name(enum model_arch arch)
{
	for (size_t i = 0; i < sizeof(arch_table) / sizeof(arch_table[0]); i++)
		if (arch_table[i].arch == arch)
			return arch_table[i].name;
	return "?";
}

/* Loader state shared by the helpers below: the file, the architecture's key prefix. */
struct loader {
	const struct gguf_file *f;
	const char *arch;
	struct hearth_error *err;
};

static const char *ld_key(const struct loader *ld, char *buf, size_t size, const char *suffix)
{
	snprintf(buf, size, "%s.%s", ld->arch, suffix);
	return buf;
}

static int ld_u32(const struct loader *ld, const char *suffix, uint32_t *out)
{
	char key[128];
	return gguf_get_u32(ld->f, ld_key(ld, key, sizeof(key), suffix), out, ld->err);
}

/* An optional key: *out keeps dflt when the key is absent; a present key of the wrong
 * type is still an error. */
static int ld_u32_opt(const struct loader *ld, const char *suffix, uint32_t dflt, uint32_t *out)
{
	char key[128];
	ld_key(ld, key, sizeof(key), suffix);
	*out = dflt;
	if (!gguf_kv_find(ld->f, key))
		return 0;
	return gguf_get_u32(ld->f, key, out, ld->err);
}

static int ld_f32_opt(const struct loader *ld, const char *suffix, float dflt, float *out)
{
	char key[128];
	ld_key(ld, key, sizeof(key), suffix);
	*out = dflt;
	if (!gguf_kv_find(ld->f, key))
		return 0;
	return gguf_get_f32(ld->f, key, out, ld->err);
}

/* A per-layer count that GGUF stores either as one number for all layers or as an array
 * with one entry per layer (llama.cpp accepts both). Absent: dflt for every layer, or an
 * error when dflt is 0. */
static int ld_layer_u32(const struct loader *ld, const char *suffix, uint32_t n_layer,
			uint32_t dflt, uint32_t *vals)
{
	char key[128];
	const struct gguf_kv *kv;

	ld_key(ld, key, sizeof(key), suffix);
	kv = gguf_kv_find(ld->f, key);
	if (!kv) {
		if (dflt == 0)
			return hearth_error_set(ld->err, HEARTH_ENOTFOUND, "%s: missing key %s",
						ld->f->path, key);
		for (uint32_t l = 0; l < n_layer; l++)
			vals[l] = dflt;
		return 0;
	}
	if (kv->type == GGUF_VT_ARRAY) {
		int rc = gguf_get_arr(ld->f, key, GGUF_VT_UINT32, &kv, ld->err);
		if (rc < 0)
			return rc;
		if (kv->arr_n != n_layer)
			return hearth_error_set(ld->err, HEARTH_EFORMAT,
						"%s: key %s has %llu entries for %u layers", ld->f->path,
						key, (unsigned long long)kv->arr_n, n_layer);
		for (uint32_t l = 0; l < n_layer; l++) {
			int64_t v = gguf_arr_int(kv, l);
			if (v < 0 || v > UINT32_MAX)
				return hearth_error_set(ld->err, HEARTH_EFORMAT,
							"%s: key %s[%u] = %lld out of range",
							ld->f->path, key, l, (long long)v);
			vals[l] = (uint32_t)v;
		}
		return 0;
	}
	uint32_t v;
	int rc = gguf_get_u32(ld->f, key, &v, ld->err);
	if (rc < 0)
		return rc;
	for (uint32_t l = 0; l < n_layer; l++)
		vals[l] = v;
	return 0;
}

/* The checks every weight gets beyond its shape: a type the dequantizer handles, whole
 * blocks per row, and data exactly rows x row bytes. Vectors (norms, biases) are read
 * directly as floats, so they must be F32. */
static int ld_check_tensor(const struct loader *ld, const struct gguf_tensor *t, bool vector)
{
	size_t row_bytes, total;

	if (vector && t->type != QTYPE_F32)
		return hearth_error_set(ld->err, HEARTH_EUNSUPPORTED,
					"%s: tensor %.*s is %s; norm and bias vectors must be F32",
					ld->f->path, (int)t->name.len, t->name.ptr, qtype_name(t->type));
	if (!qtype_known(t->type))
		return hearth_error_set(ld->err, HEARTH_EUNSUPPORTED, "%s: tensor %.*s has type %u",
					ld->f->path, (int)t->name.len, t->name.ptr, (unsigned)t->type);
	if (!qtype_row_bytes(t->type, t->ne[0], &row_bytes))
		return hearth_error_set(ld->err, HEARTH_EFORMAT,
					"%s: tensor %.*s: row of %llu is not whole %s blocks",
					ld->f->path, (int)t->name.len, t->name.ptr,
					(unsigned long long)t->ne[0], qtype_name(t->type));
	if (__builtin_mul_overflow(row_bytes, (size_t)(t->n_elems / t->ne[0]), &total) ||
	    total != t->size)
		return hearth_error_set(ld->err, HEARTH_EFORMAT,
					"%s: tensor %.*s: %zu data bytes for its shape", ld->f->path,
					(int)t->name.len, t->name.ptr, t->size);
	return 0;
}

/* A required tensor of shape ne0 (x ne1; 0 for a vector). name is a printf format taking
 * the layer index. */
static int ld_tensor(const struct loader *ld, const char *name, uint32_t layer, uint64_t ne0,
		     uint64_t ne1, const struct gguf_tensor **out)
{
	char buf[96];
	int rc;

	snprintf(buf, sizeof(buf), name, layer);
	rc = gguf_tensor_require(ld->f, buf, ne0, ne1, out, ld->err);
	if (rc < 0)
		return rc;
	return ld_check_tensor(ld, *out, ne1 == 0);
}

/* An optional tensor: *out is NULL when absent, validated like a required one otherwise. */
static int ld_tensor_opt(const struct loader *ld, const char *name, uint32_t layer, uint64_t ne0,
			 uint64_t ne1, const struct gguf_tensor **out)
{
	char buf[96];

	snprintf(buf, sizeof(buf), name, layer);
	*out = NULL;
	if (!gguf_tensor_find(ld->f, buf))
		return 0;
	return ld_tensor(ld, name, layer, ne0, ne1, out);
}

static int ld_arch(struct loader *ld, struct model *m)
{
	struct gguf_str s;
	int rc = gguf_get_str(ld->f, "general.architecture", &s, ld->err);

	if (rc < 0)
		return rc;
	for (size_t i = 0; i < sizeof(arch_table) / sizeof(arch_table[0]); i++) {
		if (gguf_str_eq(s, arch_table[i].name)) {
			ld->arch = arch_table[i].name;
			m->hp.arch = arch_table[i].arch;
			m->hp.rope_style = arch_table[i].rope;
			return 0;
		}
	}
	return hearth_error_set(ld->err, HEARTH_EUNSUPPORTED,
				"%s: unsupported architecture '%.*s' (supported: llama, qwen2, qwen3, gemma3)",
				ld->f->path, (int)(s.len > 64 ? 64 : s.len), s.ptr);
}

/* Linear RoPE scaling divides positions by the factor; other kinds (yarn, longrope) change
 * the angles in ways this engine does not implement, so they are refused, not ignored. */
static int ld_rope_scale(const struct loader *ld, float *scale)
{
	char key[128];
	struct gguf_str type;
	float factor;
	int rc;

	*scale = 1.0f;
	ld_key(ld, key, sizeof(key), "rope.scaling.type");
	if (gguf_kv_find(ld->f, key)) {
		rc = gguf_get_str(ld->f, key, &type, ld->err);
		if (rc < 0)
			return rc;
		if (gguf_str_eq(type, "none"))
			return 0;
		if (!gguf_str_eq(type, "linear"))
			return hearth_error_set(ld->err, HEARTH_EUNSUPPORTED,
						"%s: %s '%.*s' is not supported (none, linear)",
						ld->f->path, key, (int)(type.len > 32 ? 32 : type.len),
						type.ptr);
	}
	rc = ld_f32_opt(ld, "rope.scaling.factor", 0.0f, &factor);
	if (rc < 0)
		return rc;
	if (factor != 0.0f) {
		if (!(factor > 0.0f) || !isfinite(factor))
			return hearth_error_set(ld->err, HEARTH_EFORMAT,
						"%s: %s.rope.scaling.factor %g is not positive",
						ld->f->path, ld->arch, (double)factor);
		*scale = 1.0f / factor;
	}
	return 0;
}

/* Which layers slide and how, as llama.cpp's gemma3 decides: with a nonzero
 * ARCH.attention.sliding_window, layer l is a sliding layer unless l % period == period - 1
 * (period: ARCH.attention.sliding_window_pattern, 6 when absent: five local layers, then a
 * global one). Sliding layers turn RoPE at ARCH.rope.freq_base_swa (10000 when absent) with
 * no position scaling; global layers keep the file's base and linear scaling. */
struct ld_swa {
	uint32_t window;        /* 0: no sliding layers */
	uint32_t period;
	float rope_base;
};

#define LD_SWA_DEFAULT_PERIOD 6
#define LD_SWA_DEFAULT_BASE 10000.0f

static bool ld_swa_layer(const struct ld_swa *swa, uint32_t l)
{
	return swa->window && l % swa->period < swa->period - 1;
}

/* Refuses what llama.cpp would read differently or not at all rather than run a model it
 * does not describe: no window (every converted Gemma 3 has one; llama.cpp would silently
 * make every layer global, which is a different model past the window), a window of 0 or
 * beyond any context, a period given per layer, a period of 0, or a per-kind head size
 * (gemma3's q/k norms are one size for every layer). */
static int ld_gemma3_swa(const struct loader *ld, struct ld_swa *swa)
{
	char key[128];
	const struct gguf_kv *kv;
	int rc;

	*swa = (struct ld_swa){ 0, LD_SWA_DEFAULT_PERIOD, LD_SWA_DEFAULT_BASE };
	ld_key(ld, key, sizeof(key), "attention.sliding_window");
	if (!gguf_kv_find(ld->f, key))
		return hearth_error_set(ld->err, HEARTH_EFORMAT,
					"%s: %s is missing: gemma3 alternates sliding-window and global "
					"layers, and without the window they cannot be told apart",
					ld->f->path, key);
	if ((rc = gguf_get_u32(ld->f, key, &swa->window, ld->err)) < 0)
		return rc;
	if (swa->window == 0 || swa->window > MODEL_MAX_CTX_LIMIT)
		return hearth_error_set(ld->err, HEARTH_EFORMAT,
					"%s: %s is %u: a sliding window must be 1..%u positions",
					ld->f->path, key, swa->window, MODEL_MAX_CTX_LIMIT);
	ld_key(ld, key, sizeof(key), "attention.sliding_window_pattern");
	kv = gguf_kv_find(ld->f, key);
	if (kv && kv->type == GGUF_VT_ARRAY)
		return hearth_error_set(ld->err, HEARTH_EFORMAT,
					"%s: %s is an array of %llu; gemma3 takes one period (every "
					"period-th layer global)", ld->f->path, key,
					(unsigned long long)kv->arr_n);
	if ((rc = ld_u32_opt(ld, "attention.sliding_window_pattern", LD_SWA_DEFAULT_PERIOD,
			     &swa->period)) < 0)
		return rc;
	if (swa->period == 0)
		return hearth_error_set(ld->err, HEARTH_EFORMAT,
					"%s: %s is 0: the period of global layers must be at least 1",
					ld->f->path, key);
	if ((rc = ld_f32_opt(ld, "rope.freq_base_swa", LD_SWA_DEFAULT_BASE, &swa->rope_base)) < 0)
		return rc;
	if (!(swa->rope_base > 0.0f) || !isfinite(swa->rope_base))
		return hearth_error_set(ld->err, HEARTH_EFORMAT, "%s: %s.rope.freq_base_swa %g is "
					"not positive", ld->f->path, ld->arch, (double)swa->rope_base);
	static const char *const per_kind[] = { "attention.key_length_swa",
						"attention.value_length_swa",
						"rope.dimension_count_swa" };
	for (size_t i = 0; i < sizeof(per_kind) / sizeof(per_kind[0]); i++) {
		ld_key(ld, key, sizeof(key), per_kind[i]);
		if (gguf_kv_find(ld->f, key))
			return hearth_error_set(ld->err, HEARTH_EUNSUPPORTED,
						"%s: %s: sliding layers with their own head size are "
						"not supported", ld->f->path, key);
	}
	return 0;
}

static int ld_layers(const struct loader *ld, struct model *m)
{
	const uint32_t n_layer = m->hp.n_layer;
	const uint32_t n_embd = m->hp.n_embd;
	uint32_t *n_head, *n_head_kv, *n_ff;
	uint32_t key_len, val_len, n_rot;
	float rope_base, rope_scale;
	struct ld_swa swa = { 0, LD_SWA_DEFAULT_PERIOD, LD_SWA_DEFAULT_BASE };
	const bool gemma = m->hp.arch == MODEL_ARCH_GEMMA3;
	int rc = HEARTH_ENOMEM;

	n_head = calloc(n_layer, sizeof(*n_head));
	n_head_kv = calloc(n_layer, sizeof(*n_head_kv));
	n_ff = calloc(n_layer, sizeof(*n_ff));
	if (!n_head || !n_head_kv || !n_ff) {
		hearth_error_set(ld->err, HEARTH_ENOMEM, "model: out of memory for %u layers", n_layer);
		goto out;
	}
	if ((rc = ld_layer_u32(ld, "attention.head_count", n_layer, 0, n_head)) < 0 ||
	    (rc = ld_layer_u32(ld, "feed_forward_length", n_layer, 0, n_ff)) < 0)
		goto out;
	/* head_count_kv defaults to head_count (no GQA): fill per layer. */
	if ((rc = ld_layer_u32(ld, "attention.head_count_kv", n_layer, UINT32_MAX, n_head_kv)) < 0)
		goto out;
	for (uint32_t l = 0; l < n_layer; l++)
		if (n_head_kv[l] == UINT32_MAX)
			n_head_kv[l] = n_head[l];

	/* Head size: stated (qwen3 makes it differ from n_embd / n_head) or derived. */
	if (n_head[0] == 0 || n_embd % n_head[0] != 0) {
		rc = ld_u32(ld, "attention.key_length", &key_len);
		if (rc < 0) {
			hearth_error_prefix(ld->err, "%s: head size not derivable from width %u and "
					    "%u heads", ld->f->path, n_embd, n_head[0]);
			goto out;
		}
	} else if ((rc = ld_u32_opt(ld, "attention.key_length", n_embd / n_head[0], &key_len)) < 0) {
		goto out;
	}
	if ((rc = ld_u32_opt(ld, "attention.value_length", key_len, &val_len)) < 0 ||
	    (rc = ld_u32_opt(ld, "rope.dimension_count", key_len, &n_rot)) < 0 ||
	    (rc = ld_f32_opt(ld, "rope.freq_base", 10000.0f, &rope_base)) < 0 ||
	    (rc = ld_rope_scale(ld, &rope_scale)) < 0)
		goto out;
	if (gemma && (rc = ld_gemma3_swa(ld, &swa)) < 0)
		goto out;
	m->hp.n_swa = swa.window;

	rc = HEARTH_EFORMAT;
	if (key_len == 0 || val_len == 0 || key_len > 65536 || val_len > 65536) {
		hearth_error_set(ld->err, rc, "%s: head sizes %u/%u out of range", ld->f->path,
				 key_len, val_len);
		goto out;
	}
	if (n_rot == 0 || n_rot % 2 != 0 || n_rot > key_len) {
		hearth_error_set(ld->err, rc, "%s: %s.rope.dimension_count %u must be even and at "
				 "most the head size %u", ld->f->path, ld->arch, n_rot, key_len);
		goto out;
	}
	if (!(rope_base > 0.0f) || !isfinite(rope_base)) {
		hearth_error_set(ld->err, rc, "%s: %s.rope.freq_base %g is not positive",
				 ld->f->path, ld->arch, (double)rope_base);
		goto out;
	}

	for (uint32_t l = 0; l < n_layer; l++) {
		struct model_layer *L = &m->layers[l];
		uint64_t n_q, n_k, n_v, n_att;

		if (n_head[l] == 0 || n_head_kv[l] == 0 || n_head[l] % n_head_kv[l] != 0 ||
		    n_head[l] > 4096 || n_ff[l] == 0 || n_ff[l] > (1u << 24)) {
			rc = hearth_error_set(ld->err, HEARTH_EFORMAT,
					      "%s: layer %u: %u heads, %u KV heads, ff %u: heads must "
					      "be a positive multiple of KV heads, ff positive",
					      ld->f->path, l, n_head[l], n_head_kv[l], n_ff[l]);
			goto out;
		}
		L->n_head = n_head[l];
		L->n_head_kv = n_head_kv[l];
		L->head_dim = key_len;
		L->head_dim_v = val_len;
		L->n_ff = n_ff[l];
		L->n_rot = n_rot;
		L->rope_base = rope_base;
		L->rope_scale = rope_scale;
		L->window = 0;
		L->attn_scale = 1.0f / sqrtf((float)key_len);
		if (ld_swa_layer(&swa, l)) {
			L->window = swa.window;
			L->rope_base = swa.rope_base;
			L->rope_scale = 1.0f;
		}
		/* Gemma 3 scales q by query_pre_attn_scalar^-1/2, which llama.cpp takes to be the
		 * head size except for the 27B (62 layers), where it is n_embd / n_head. */
		if (gemma && n_layer == 62)
			L->attn_scale = 1.0f / sqrtf((float)(n_embd / n_head[l]));

		/* Products of values below 2^16 and 2^12: no overflow in 64 bits. */
		n_q = (uint64_t)L->n_head * L->head_dim;
		n_k = (uint64_t)L->n_head_kv * L->head_dim;
		n_v = (uint64_t)L->n_head_kv * L->head_dim_v;
		n_att = (uint64_t)L->n_head * L->head_dim_v;

		/* GGUF shapes are (row length, rows): wq maps n_embd -> n_q. */
		if ((rc = ld_tensor(ld, "blk.%u.attn_norm.weight", l, n_embd, 0, &L->attn_norm)) < 0 ||
		    (rc = ld_tensor(ld, "blk.%u.attn_q.weight", l, n_embd, n_q, &L->wq)) < 0 ||
		    (rc = ld_tensor(ld, "blk.%u.attn_k.weight", l, n_embd, n_k, &L->wk)) < 0 ||
		    (rc = ld_tensor(ld, "blk.%u.attn_v.weight", l, n_embd, n_v, &L->wv)) < 0 ||
		    (rc = ld_tensor(ld, "blk.%u.attn_output.weight", l, n_att, n_embd, &L->wo)) < 0 ||
		    (rc = ld_tensor(ld, "blk.%u.ffn_norm.weight", l, n_embd, 0, &L->ffn_norm)) < 0 ||
		    (rc = ld_tensor(ld, "blk.%u.ffn_gate.weight", l, n_embd, L->n_ff, &L->ffn_gate)) < 0 ||
		    (rc = ld_tensor(ld, "blk.%u.ffn_up.weight", l, n_embd, L->n_ff, &L->ffn_up)) < 0 ||
		    (rc = ld_tensor(ld, "blk.%u.ffn_down.weight", l, L->n_ff, n_embd, &L->ffn_down)) < 0)
			goto out;

		/* Biases: qwen2 has q/k/v biases; llama files may carry any of them. */
		if (m->hp.arch == MODEL_ARCH_QWEN2) {
			if ((rc = ld_tensor(ld, "blk.%u.attn_q.bias", l, n_q, 0, &L->bq)) < 0 ||
			    (rc = ld_tensor(ld, "blk.%u.attn_k.bias", l, n_k, 0, &L->bk)) < 0 ||
			    (rc = ld_tensor(ld, "blk.%u.attn_v.bias", l, n_v, 0, &L->bv)) < 0)
				goto out;
		} else if ((rc = ld_tensor_opt(ld, "blk.%u.attn_q.bias", l, n_q, 0, &L->bq)) < 0 ||
			   (rc = ld_tensor_opt(ld, "blk.%u.attn_k.bias", l, n_k, 0, &L->bk)) < 0 ||
			   (rc = ld_tensor_opt(ld, "blk.%u.attn_v.bias", l, n_v, 0, &L->bv)) < 0) {
			goto out;
		}
		if ((rc = ld_tensor_opt(ld, "blk.%u.attn_output.bias", l, n_embd, 0, &L->bo)) < 0)
			goto out;

		if ((m->hp.arch == MODEL_ARCH_QWEN3 || gemma) &&
		    ((rc = ld_tensor(ld, "blk.%u.attn_q_norm.weight", l, L->head_dim, 0, &L->q_norm)) < 0 ||
		     (rc = ld_tensor(ld, "blk.%u.attn_k_norm.weight", l, L->head_dim, 0, &L->k_norm)) < 0))
			goto out;
		/* Gemma's RMSNorm multiplies by (1 + w); llama.cpp's converter stores 1 + w, so
		 * every norm here is a plain RMSNorm by the stored vector. */
		if (gemma &&
		    ((rc = ld_tensor(ld, "blk.%u.post_attention_norm.weight", l, n_embd, 0,
				     &L->attn_post_norm)) < 0 ||
		     (rc = ld_tensor(ld, "blk.%u.post_ffw_norm.weight", l, n_embd, 0,
				     &L->ffn_post_norm)) < 0))
			goto out;
	}
	rc = 0;
out:
	free(n_head);
	free(n_head_kv);
	free(n_ff);
	return rc;
}

int model_load(struct model **out, const struct gguf_file *f, const struct model_opts *opts,
	       struct hearth_error *err)
{
	struct loader ld = { .f = f, .arch = NULL, .err = err };
	struct model *m;
	const struct gguf_tensor *rope_freqs;
	int rc;

	*out = NULL;
	m = calloc(1, sizeof(*m));
	if (!m)
		return hearth_error_set(err, HEARTH_ENOMEM, "model: out of memory");
	m->file = f;
	m->opts.max_ctx = MODEL_DEFAULT_MAX_CTX;
	if (opts)
		m->opts = *opts;
	if (m->opts.kv_type != MODEL_KV_F32 && m->opts.kv_type != MODEL_KV_F16) {
		rc = hearth_error_set(err, HEARTH_EINVAL, "model: unknown KV type %d",
				      (int)m->opts.kv_type);
		goto fail;
	}
	if (m->opts.max_ctx == 0 || m->opts.max_ctx > MODEL_MAX_CTX_LIMIT) {
		rc = hearth_error_set(err, HEARTH_EINVAL, "model: max context %u out of range 1..%u",
				      m->opts.max_ctx, MODEL_MAX_CTX_LIMIT);
		goto fail;
	}

	m->hp.ffn_act = MODEL_FFN_SILU;
	m->hp.embd_scale = 1.0f;
	if ((rc = ld_arch(&ld, m)) < 0 ||
	    (rc = ld_u32(&ld, "embedding_length", &m->hp.n_embd)) < 0 ||
	    (rc = ld_u32(&ld, "block_count", &m->hp.n_layer)) < 0 ||
	    (rc = ld_u32_opt(&ld, "context_length", 0, &m->hp.n_ctx_train)) < 0)
		goto fail;
	{
		char key[128];
		rc = gguf_get_f32(f, ld_key(&ld, key, sizeof(key), "attention.layer_norm_rms_epsilon"),
				  &m->hp.norm_eps, err);
		if (rc < 0)
			goto fail;
	}
	if (m->hp.n_embd == 0 || m->hp.n_embd > (1u << 20) || m->hp.n_layer == 0 ||
	    m->hp.n_layer > MODEL_MAX_LAYERS) {
		rc = hearth_error_set(err, HEARTH_EFORMAT, "%s: width %u / %u layers out of range",
				      f->path, m->hp.n_embd, m->hp.n_layer);
		goto fail;
	}
	if (!(m->hp.norm_eps >= 0.0f) || !isfinite(m->hp.norm_eps)) {
		rc = hearth_error_set(err, HEARTH_EFORMAT, "%s: %s.attention.layer_norm_rms_epsilon "
				      "%g is not a small non-negative number", f->path, ld.arch,
				      (double)m->hp.norm_eps);
		goto fail;
	}

	/* Optional, as in llama.cpp: only embedding models carry it. A value beyond the enum
	 * is a file this build cannot pool correctly, so it is refused rather than guessed. */
	{
		uint32_t pooling;
		if ((rc = ld_u32_opt(&ld, "pooling_type", UINT32_MAX, &pooling)) < 0)
			goto fail;
		if (pooling != UINT32_MAX && pooling > MODEL_POOLING_RANK) {
			rc = hearth_error_set(err, HEARTH_EFORMAT, "%s: %s.pooling_type %u is not one "
					      "of 0 none, 1 mean, 2 cls, 3 last, 4 rank", f->path,
					      ld.arch, pooling);
			goto fail;
		}
		m->hp.pooling = pooling == UINT32_MAX ? MODEL_POOLING_UNSPECIFIED
						      : (enum model_pooling)pooling;
	}

	/* Gemma 3: GeGLU, embeddings scaled by sqrt(n_embd) (in f32, as llama.cpp does, not
	 * the bf16-rounded normalizer of the reference PyTorch code) and an optional final
	 * softcap (the released models have none; llama.cpp applies it when the key is there). */
	if (m->hp.arch == MODEL_ARCH_GEMMA3) {
		m->hp.ffn_act = MODEL_FFN_GELU;
		m->hp.embd_scale = sqrtf((float)m->hp.n_embd);
		if ((rc = ld_f32_opt(&ld, "final_logit_softcapping", 0.0f, &m->hp.logit_softcap)) < 0)
			goto fail;
		if (!(m->hp.logit_softcap >= 0.0f) || !isfinite(m->hp.logit_softcap)) {
			rc = hearth_error_set(err, HEARTH_EFORMAT, "%s: %s.final_logit_softcapping %g "
					      "is not a non-negative number", f->path, ld.arch,
					      (double)m->hp.logit_softcap);
			goto fail;
		}
	}

	/* Mixtral-style files say "llama" too; their expert tensors are not handled here. */
	{
		uint32_t n_expert;
		if ((rc = ld_u32_opt(&ld, "expert_count", 0, &n_expert)) < 0)
			goto fail;
		if (n_expert > 0) {
			rc = hearth_error_set(err, HEARTH_EUNSUPPORTED, "%s: %s.expert_count is %u: "
					      "mixture-of-experts models are not supported", f->path,
					      ld.arch, n_expert);
			goto fail;
		}
	}

	/* The vocabulary size is the embedding's row count. */
	m->tok_embd = gguf_tensor_find(f, "token_embd.weight");
	if (!m->tok_embd) {
		rc = hearth_error_set(err, HEARTH_ENOTFOUND, "%s: missing tensor token_embd.weight",
				      f->path);
		goto fail;
	}
	if (m->tok_embd->n_dims != 2 || m->tok_embd->ne[0] != m->hp.n_embd ||
	    m->tok_embd->ne[1] == 0 || m->tok_embd->ne[1] > INT32_MAX) {
		rc = hearth_error_set(err, HEARTH_EFORMAT, "%s: tensor token_embd.weight has shape "
				      "[%llu, %llu], expected [%u, n_vocab]", f->path,
				      (unsigned long long)m->tok_embd->ne[0],
				      (unsigned long long)m->tok_embd->ne[1], m->hp.n_embd);
		goto fail;
	}
	m->hp.n_vocab = (uint32_t)m->tok_embd->ne[1];
	if ((rc = ld_check_tensor(&ld, m->tok_embd, false)) < 0)
		goto fail;

	m->layers = calloc(m->hp.n_layer, sizeof(*m->layers));
	if (!m->layers) {
		rc = hearth_error_set(err, HEARTH_ENOMEM, "model: out of memory for %u layers",
				      m->hp.n_layer);
		goto fail;
	}
	if ((rc = ld_layers(&ld, m)) < 0)
		goto fail;

	if ((rc = ld_tensor(&ld, "output_norm.weight", 0, m->hp.n_embd, 0, &m->output_norm)) < 0 ||
	    (rc = ld_tensor_opt(&ld, "output.weight", 0, m->hp.n_embd, m->hp.n_vocab, &m->output)) < 0)
		goto fail;
	m->hp.tied_output = m->output == NULL;
	if (!m->output)
		m->output = m->tok_embd;

	/* Llama 3.x stores its RoPE frequency correction as one divisor per rotated pair. */
	if ((rc = ld_tensor_opt(&ld, "rope_freqs.weight", 0, m->layers[0].n_rot / 2, 0,
				&rope_freqs)) < 0)
		goto fail;
	m->rope_freqs = rope_freqs ? rope_freqs->data : NULL;

	*out = m;
	return 0;
fail:
	model_free(m);
	return rc;
}

void model_free(struct model *m)
{
	if (!m)
		return;
	free(m->layers);
	free(m);
}

