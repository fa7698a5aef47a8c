/* The reference engine: reads a GGUF model's architecture, hyperparameters and weight views
 * (model_load), and runs the plain f32 forward pass over a batch of tokens with a KV cache
 * (model_forward). Written to be read top to bottom, like llama2.c's run.c; speed is the
 * job of the kernels and the loader, correctness is the job of this file. */
#include "daemon/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "kernels/quant.h"

/* Tokens per internal forward chunk: bounds the scratch; a longer batch is run in chunks,
 * which gives the same result because attention is causal. */
#define MODEL_CHUNK 64
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
				"%s: unsupported architecture '%.*s' (supported: llama, qwen2, qwen3)",
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

static int ld_layers(const struct loader *ld, struct model *m)
{
	const uint32_t n_layer = m->hp.n_layer;
	const uint32_t n_embd = m->hp.n_embd;
	uint32_t *n_head, *n_head_kv, *n_ff;
	uint32_t key_len, val_len, n_rot;
	float rope_base, rope_scale;
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

		if (m->hp.arch == MODEL_ARCH_QWEN3 &&
		    ((rc = ld_tensor(ld, "blk.%u.attn_q_norm.weight", l, L->head_dim, 0, &L->q_norm)) < 0 ||
		     (rc = ld_tensor(ld, "blk.%u.attn_k_norm.weight", l, L->head_dim, 0, &L->k_norm)) < 0))
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

/* ------------------------------------------------------------------------------------ */
/* Sequence state: KV cache and scratch                                                  */

struct model_ctx {
	const struct model *m;
	uint32_t max_ctx;
	uint32_t n_past;
	uint32_t n_chunk;       /* tokens per internal forward chunk */

	/* The KV cache: per layer, max_ctx positions of n_head_kv x head_dim floats (K) and
	 * n_head_kv x head_dim_v floats (V), contiguous. Only kv_k/kv_v know this layout, so
	 * the paged pool can replace it. */
	float *k_cache, *v_cache;
	size_t *k_off, *v_off;  /* per layer, in floats */

	/* Scratch for one chunk of n_chunk tokens; widths are the maxima over layers. */
	float *x;               /* residual stream    n_chunk x n_embd */
	float *xb;              /* normed input       n_chunk x n_embd */
	float *xb2;             /* a block's output   n_chunk x n_embd */
	float *q;               /*                    n_chunk x max n_head*head_dim */
	float *k;               /*                    n_chunk x max n_head_kv*head_dim */
	float *v;               /*                    n_chunk x max n_head_kv*head_dim_v */
	float *att;             /* attention output   n_chunk x max n_head*head_dim_v */
	float *hb, *hb2;        /* ffn gate and up    n_chunk x max n_ff */
	float *scores;          /* one head's scores  max_ctx */
	float *head_q;          /* one query head     max head_dim */
	float *head_acc;        /* one head's output  max head_dim_v */
	float *row;             /* one dequantized weight row: max row length */
};

static float to_f16(float x)
{
	return quant_fp16_to_f32(quant_f32_to_fp16(x));
}

static float *kv_k(struct model_ctx *c, uint32_t layer, uint32_t pos)
{
	const struct model_layer *L = &c->m->layers[layer];
	return c->k_cache + c->k_off[layer] + (size_t)pos * L->n_head_kv * L->head_dim;
}

static float *kv_v(struct model_ctx *c, uint32_t layer, uint32_t pos)
{
	const struct model_layer *L = &c->m->layers[layer];
	return c->v_cache + c->v_off[layer] + (size_t)pos * L->n_head_kv * L->head_dim_v;
}

/* Writes one position's keys and values (n_head_kv heads each) into the cache. */
static void kv_store(struct model_ctx *c, uint32_t layer, uint32_t pos, const float *k,
		     const float *v)
{
	const struct model_layer *L = &c->m->layers[layer];
	const size_t w_k = (size_t)L->n_head_kv * L->head_dim;
	const size_t w_v = (size_t)L->n_head_kv * L->head_dim_v;
	float *kd = kv_k(c, layer, pos), *vd = kv_v(c, layer, pos);

	for (size_t i = 0; i < w_k; i++)
		kd[i] = c->m->opts.kv_type == MODEL_KV_F16 ? to_f16(k[i]) : k[i];
	for (size_t i = 0; i < w_v; i++)
		vd[i] = c->m->opts.kv_type == MODEL_KV_F16 ? to_f16(v[i]) : v[i];
}

/* calloc of a x b floats, overflow-checked. */
static float *floats_new(size_t a, size_t b)
{
	size_t n;
	if (__builtin_mul_overflow(a, b, &n) || n > SIZE_MAX / sizeof(float))
		return NULL;
	return calloc(n ? n : 1, sizeof(float));
}

static size_t max_sz(size_t a, size_t b)
{
	return a > b ? a : b;
}

void model_ctx_free(struct model_ctx *c)
{
	if (!c)
		return;
	free(c->k_cache);
	free(c->v_cache);
	free(c->k_off);
	free(c->v_off);
	free(c->x);
	free(c->xb);
	free(c->xb2);
	free(c->q);
	free(c->k);
	free(c->v);
	free(c->att);
	free(c->hb);
	free(c->hb2);
	free(c->scores);
	free(c->head_q);
	free(c->head_acc);
	free(c->row);
	free(c);
}

int model_ctx_new(struct model_ctx **out, const struct model *m, uint32_t max_ctx,
		  struct hearth_error *err)
{
	const struct model_hparams *hp = &m->hp;
	size_t w_q = 0, w_k = 0, w_v = 0, w_att = 0, w_ff = 0, k_total = 0, v_total = 0;
	size_t hd = 0, hd_v = 0;
	struct model_ctx *c;

	*out = NULL;
	if (max_ctx == 0 || max_ctx > m->opts.max_ctx)
		return hearth_error_set(err, HEARTH_EINVAL,
					"model: context of %u positions outside 1..%u (max_ctx)",
					max_ctx, m->opts.max_ctx);
	c = calloc(1, sizeof(*c));
	if (!c)
		return hearth_error_set(err, HEARTH_ENOMEM, "model: out of memory");
	c->m = m;
	c->max_ctx = max_ctx;
	c->n_chunk = max_ctx < MODEL_CHUNK ? max_ctx : MODEL_CHUNK;
	c->k_off = calloc(hp->n_layer, sizeof(*c->k_off));
	c->v_off = calloc(hp->n_layer, sizeof(*c->v_off));
	if (!c->k_off || !c->v_off)
		goto nomem;

	for (uint32_t l = 0; l < hp->n_layer; l++) {
		const struct model_layer *L = &m->layers[l];
		size_t k_layer, v_layer;

		w_q = max_sz(w_q, (size_t)L->n_head * L->head_dim);
		w_k = max_sz(w_k, (size_t)L->n_head_kv * L->head_dim);
		w_v = max_sz(w_v, (size_t)L->n_head_kv * L->head_dim_v);
		w_att = max_sz(w_att, (size_t)L->n_head * L->head_dim_v);
		w_ff = max_sz(w_ff, L->n_ff);
		hd = max_sz(hd, L->head_dim);
		hd_v = max_sz(hd_v, L->head_dim_v);
		c->k_off[l] = k_total;
		c->v_off[l] = v_total;
		if (__builtin_mul_overflow((size_t)L->n_head_kv * L->head_dim, (size_t)max_ctx, &k_layer) ||
		    __builtin_mul_overflow((size_t)L->n_head_kv * L->head_dim_v, (size_t)max_ctx, &v_layer) ||
		    __builtin_add_overflow(k_total, k_layer, &k_total) ||
		    __builtin_add_overflow(v_total, v_layer, &v_total))
			goto nomem;
	}

	c->k_cache = floats_new(k_total, 1);
	c->v_cache = floats_new(v_total, 1);
	c->x = floats_new(c->n_chunk, hp->n_embd);
	c->xb = floats_new(c->n_chunk, hp->n_embd);
	c->xb2 = floats_new(c->n_chunk, hp->n_embd);
	c->q = floats_new(c->n_chunk, w_q);
	c->k = floats_new(c->n_chunk, w_k);
	c->v = floats_new(c->n_chunk, w_v);
	c->att = floats_new(c->n_chunk, w_att);
	c->hb = floats_new(c->n_chunk, w_ff);
	c->hb2 = floats_new(c->n_chunk, w_ff);
	c->scores = floats_new(max_ctx, 1);
	c->head_q = floats_new(hd, 1);
	c->head_acc = floats_new(hd_v, 1);
	c->row = floats_new(max_sz(max_sz(hp->n_embd, w_att), w_ff), 1);
	if (!c->k_cache || !c->v_cache || !c->x || !c->xb || !c->xb2 || !c->q || !c->k || !c->v ||
	    !c->att || !c->hb || !c->hb2 || !c->scores || !c->head_q || !c->head_acc || !c->row)
		goto nomem;
	*out = c;
	return 0;
nomem:
	model_ctx_free(c);
	return hearth_error_set(err, HEARTH_ENOMEM,
				"model: out of memory for a context of %u positions", max_ctx);
}

void model_ctx_reset(struct model_ctx *c)
{
	c->n_past = 0;
}

uint32_t model_ctx_n_past(const struct model_ctx *c)
{
	return c->n_past;
}

uint32_t model_ctx_max(const struct model_ctx *c)
{
	return c->max_ctx;
}

/* ------------------------------------------------------------------------------------ */
/* Forward pass                                                                          */

static size_t row_bytes_of(const struct gguf_tensor *t)
{
	size_t bytes = 0;
	qtype_row_bytes(t->type, t->ne[0], &bytes); /* validated at load */
	return bytes;
}

/* y (n_tok x rows of W) = x (n_tok x W's row length) times W transposed. */
static void matmul(struct model_ctx *c, const struct gguf_tensor *w, const float *x, size_t n_tok,
		   float *y)
{
	ops_ref_matmul(w->type, w->data, row_bytes_of(w), w->ne[0], w->ne[1], x, n_tok, y, c->row);
}

static void add_bias(const struct gguf_tensor *b, float *y, size_t n_tok, size_t width)
{
	if (!b)
		return;
	for (size_t t = 0; t < n_tok; t++)
		ops_ref_add(y + t * width, b->data, width);
}

/* One query head over cache positions first..first+n_seen-1 of KV head kvh, exactly:
 * out = softmax(scale * q.K) V. */
static void attend_f32(struct model_ctx *c, uint32_t layer, const float *q, size_t kvh,
		       uint32_t first, size_t n_seen, float *out)
{
	const struct model_layer *L = &c->m->layers[layer];

	for (size_t i = 0; i < n_seen; i++) {
		const float *k = kv_k(c, layer, first + (uint32_t)i) + kvh * L->head_dim;
		c->scores[i] = (float)ops_ref_dot(q, k, L->head_dim) * L->attn_scale;
	}
	ops_ref_softmax(c->scores, n_seen);
	for (size_t d = 0; d < L->head_dim_v; d++) {
		double sum = 0.0;
		for (size_t i = 0; i < n_seen; i++)
			sum += (double)c->scores[i] *
			       kv_v(c, layer, first + (uint32_t)i)[kvh * L->head_dim_v + d];
		out[d] = (float)sum;
	}
}

/* The same, as llama.cpp's CPU flash attention computes it over an f16 cache (K and V were
 * rounded when stored): q rounded to f16; one pass over the positions keeping the running
 * maximum M and sum S of exp(score - M), the weighted V sum held in f16 and rescaled
 * whenever M grows; out = acc / S. */
static void attend_f16(struct model_ctx *c, uint32_t layer, const float *q, size_t kvh,
		       uint32_t first, size_t n_seen, float *out)
{
	const struct model_layer *L = &c->m->layers[layer];
	float *q16 = c->head_q, *acc = c->head_acc;
	float max = -INFINITY, sum = 0.0f;

	for (size_t d = 0; d < L->head_dim; d++)
		q16[d] = to_f16(q[d]);
	for (size_t d = 0; d < L->head_dim_v; d++)
		acc[d] = 0.0f;
	for (size_t i = 0; i < n_seen; i++) {
		const float *k = kv_k(c, layer, first + (uint32_t)i) + kvh * L->head_dim;
		const float *v = kv_v(c, layer, first + (uint32_t)i) + kvh * L->head_dim_v;
		const float s = (float)ops_ref_dot(q16, k, L->head_dim) * L->attn_scale;
		float rescale = 1.0f, weight = 1.0f;

		if (s > max) {
			rescale = expf(max - s);
			max = s;
			for (size_t d = 0; d < L->head_dim_v; d++)
				acc[d] = to_f16(acc[d] * rescale);
		} else {
			weight = expf(s - max);
		}
		for (size_t d = 0; d < L->head_dim_v; d++)
			acc[d] = to_f16(acc[d] + v[d] * weight);
		sum = sum * rescale + weight;
	}
	for (size_t d = 0; d < L->head_dim_v; d++)
		out[d] = acc[d] / sum;
}

/* Causal attention of the chunk's n_tok queries (at positions pos0..) over the cache,
 * which already holds their own keys and values. GQA: query head h reads KV head
 * h / (n_head / n_head_kv). A sliding-window layer sees its last `window` positions. */
static void attention(struct model_ctx *c, uint32_t layer, uint32_t pos0, size_t n_tok)
{
	const struct model_layer *L = &c->m->layers[layer];
	const size_t group = L->n_head / L->n_head_kv;
	const size_t w_q = (size_t)L->n_head * L->head_dim;
	const size_t w_att = (size_t)L->n_head * L->head_dim_v;

	for (size_t t = 0; t < n_tok; t++) {
		const uint32_t pos = pos0 + (uint32_t)t;
		const uint32_t first = (L->window && pos + 1 > L->window) ? pos + 1 - L->window : 0;
		const size_t n_seen = pos + 1 - first;

		for (size_t h = 0; h < L->n_head; h++) {
			const float *q = c->q + t * w_q + h * L->head_dim;
			float *out = c->att + t * w_att + h * L->head_dim_v;

			if (c->m->opts.kv_type == MODEL_KV_F16)
				attend_f16(c, layer, q, h / group, first, n_seen, out);
			else
				attend_f32(c, layer, q, h / group, first, n_seen, out);
		}
	}
}

/* One chunk of at most n_chunk tokens at positions n_past..; logits for every token
 * (which == ALL: n_tok x n_vocab), for the last one only, or none (logits NULL). */
static void forward_chunk(const struct model *m, struct model_ctx *c, const int32_t *tokens,
			  size_t n_tok, enum model_logits which, float *logits)
{
	const struct model_hparams *hp = &m->hp;
	const size_t n_embd = hp->n_embd;
	const uint32_t pos0 = c->n_past;

	/* Embeddings: the file's rows, dequantized. */
	for (size_t t = 0; t < n_tok; t++)
		ops_ref_get_row(m->tok_embd->type, m->tok_embd->data, row_bytes_of(m->tok_embd),
				n_embd, (size_t)tokens[t], c->x + t * n_embd);

	for (uint32_t l = 0; l < hp->n_layer; l++) {
		const struct model_layer *L = &m->layers[l];
		const size_t w_q = (size_t)L->n_head * L->head_dim;
		const size_t w_k = (size_t)L->n_head_kv * L->head_dim;
		const size_t w_v = (size_t)L->n_head_kv * L->head_dim_v;

		/* Attention block: x += Wo * attention(rope(q), rope(k), v) of rmsnorm(x). */
		for (size_t t = 0; t < n_tok; t++)
			ops_ref_rmsnorm(c->xb + t * n_embd, c->x + t * n_embd, L->attn_norm->data,
					n_embd, hp->norm_eps);
		matmul(c, L->wq, c->xb, n_tok, c->q);
		matmul(c, L->wk, c->xb, n_tok, c->k);
		matmul(c, L->wv, c->xb, n_tok, c->v);
		add_bias(L->bq, c->q, n_tok, w_q);
		add_bias(L->bk, c->k, n_tok, w_k);
		add_bias(L->bv, c->v, n_tok, w_v);

		for (size_t t = 0; t < n_tok; t++) {
			float *qt = c->q + t * w_q, *kt = c->k + t * w_k;

			if (L->q_norm)
				for (size_t h = 0; h < L->n_head; h++)
					ops_ref_rmsnorm(qt + h * L->head_dim, qt + h * L->head_dim,
							L->q_norm->data, L->head_dim, hp->norm_eps);
			if (L->k_norm)
				for (size_t h = 0; h < L->n_head_kv; h++)
					ops_ref_rmsnorm(kt + h * L->head_dim, kt + h * L->head_dim,
							L->k_norm->data, L->head_dim, hp->norm_eps);
			ops_ref_rope(qt, L->n_head, L->head_dim, L->n_rot, hp->rope_style,
				     (int)(pos0 + t), L->rope_base, L->rope_scale, m->rope_freqs);
			ops_ref_rope(kt, L->n_head_kv, L->head_dim, L->n_rot, hp->rope_style,
				     (int)(pos0 + t), L->rope_base, L->rope_scale, m->rope_freqs);

			kv_store(c, l, pos0 + (uint32_t)t, kt, c->v + t * w_v);
		}

		attention(c, l, pos0, n_tok);
		matmul(c, L->wo, c->att, n_tok, c->xb2);
		add_bias(L->bo, c->xb2, n_tok, n_embd);
		ops_ref_add(c->x, c->xb2, n_tok * n_embd);

		/* Feed-forward block: x += down(silu(gate(h)) * up(h)), h = rmsnorm(x). */
		for (size_t t = 0; t < n_tok; t++)
			ops_ref_rmsnorm(c->xb + t * n_embd, c->x + t * n_embd, L->ffn_norm->data,
					n_embd, hp->norm_eps);
		matmul(c, L->ffn_gate, c->xb, n_tok, c->hb);
		matmul(c, L->ffn_up, c->xb, n_tok, c->hb2);
		ops_ref_silu_mul(c->hb, c->hb2, n_tok * L->n_ff);
		matmul(c, L->ffn_down, c->hb, n_tok, c->xb2);
		ops_ref_add(c->x, c->xb2, n_tok * n_embd);
	}
	c->n_past += (uint32_t)n_tok;

	if (!logits)
		return;
	/* Head: only the rows whose logits are wanted. */
	size_t first = which == MODEL_LOGITS_ALL ? 0 : n_tok - 1;
	for (size_t t = first; t < n_tok; t++)
		ops_ref_rmsnorm(c->xb + t * n_embd, c->x + t * n_embd, m->output_norm->data, n_embd,
				hp->norm_eps);
	matmul(c, m->output, c->xb + first * n_embd, n_tok - first, logits);
}

int model_forward(const struct model *m, struct model_ctx *c, const int32_t *tokens, size_t n,
		  enum model_logits which, float *logits_out, struct hearth_error *err)
{
	if (n == 0)
		return hearth_error_set(err, HEARTH_EINVAL, "model: forward of zero tokens");
	if (n > (size_t)(c->max_ctx - c->n_past))
		return hearth_error_set(err, HEARTH_EKVFULL,
					"model: %zu tokens do not fit: %u of %u positions used", n,
					c->n_past, c->max_ctx);
	for (size_t i = 0; i < n; i++)
		if (tokens[i] < 0 || (uint32_t)tokens[i] >= m->hp.n_vocab)
			return hearth_error_set(err, HEARTH_EINVAL,
						"model: token %d at %zu outside the vocabulary of %u",
						tokens[i], i, m->hp.n_vocab);

	for (size_t start = 0; start < n; start += c->n_chunk) {
		size_t n_tok = n - start < c->n_chunk ? n - start : c->n_chunk;
		bool last = start + n_tok == n;
		float *logits = NULL;

		if (which == MODEL_LOGITS_ALL)
			logits = logits_out + start * m->hp.n_vocab;
		else if (last)
			logits = logits_out;
		forward_chunk(m, c, tokens + start, n_tok, which, logits);
	}
	return 0;
}
