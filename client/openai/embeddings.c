/* POST /v1/embeddings: OpenAI's shape (input a string, strings, token ids or arrays of
 * them; encoding_format float or base64; usage.prompt_tokens) onto hearth_embed, plus
 * hearth's `pooling` to override the model's. */
#include <stdlib.h>
#include <string.h>

#include "client/openai/gw.h"
#include "client/openai/params.h"

static const char *const embeddings_fields[] = { "model", "input", "encoding_format", "dimensions", "user",
						  "pooling", NULL };

static bool embed_bad_input(struct gw_reply *r, const char *why, size_t i)
{
	gw_reply_error(r, 400, "invalid_request_error", "input", "invalid_value",
		       "'input' must be a string, an array of strings, an array of token ids or an array of "
		       "them: %s (input %zu)", why, i);
	return false;
}

/* Token ids of a JSON array into *ids (owned); false with the reply set when it is not one. */
static bool embed_ids(json_t *a, size_t index, uint32_t **ids, struct gw_reply *r)
{
	size_t i, n = json_array_size(a);
	json_t *v;
	if (n == 0)
		return embed_bad_input(r, "an empty token array", index);
	*ids = malloc(n * sizeof **ids);
	if (!*ids) {
		gw_reply_error(r, 500, "server_error", NULL, NULL, "out of memory");
		return false;
	}
	json_array_foreach(a, i, v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 0x7fffffff) {
			free(*ids);
			*ids = NULL;
			return embed_bad_input(r, "a token id that is not an integer in [0, 2^31)", index);
		}
		(*ids)[i] = (uint32_t)json_integer_value(v);
	}
	return true;
}

/* The request's inputs; *owned holds token arrays to free (one per input, NULL for text). */
static bool embed_inputs(json_t *body, struct hearth_embed_input **in, uint32_t ***owned, size_t *n,
			 struct gw_reply *r)
{
	json_t *p = json_object_get(body, "input");
	*in = NULL;
	*owned = NULL;
	*n = 0;
	if (!p || json_is_null(p)) {
		gw_reply_error(r, 400, "invalid_request_error", "input", "missing_required_parameter",
			       "'input' is required");
		return false;
	}
	bool one_array = json_is_array(p) && json_array_size(p) > 0 && json_is_integer(json_array_get(p, 0));
	size_t count = json_is_string(p) || one_array ? 1 : json_array_size(p);
	if (!json_is_string(p) && !json_is_array(p))
		return embed_bad_input(r, "neither", 0);
	if (count == 0)
		return embed_bad_input(r, "an empty array", 0);
	*in = calloc(count, sizeof **in);
	*owned = calloc(count, sizeof **owned);
	if (!*in || !*owned) {
		gw_reply_error(r, 500, "server_error", NULL, NULL, "out of memory");
		return false;
	}
	*n = count;
	for (size_t i = 0; i < count; i++) {
		json_t *v = json_is_string(p) || one_array ? p : json_array_get(p, i);
		if (json_is_string(v)) {
			if (json_string_length(v) == 0)
				return embed_bad_input(r, "an empty string", i);
			(*in)[i].text = json_string_value(v);
			(*in)[i].len = json_string_length(v);
		} else if (json_is_array(v)) {
			if (!embed_ids(v, i, &(*owned)[i], r))
				return false;
			(*in)[i].tokens = (*owned)[i];
			(*in)[i].n_tokens = json_array_size(v);
		} else {
			return embed_bad_input(r, "an element that is neither a string nor token ids", i);
		}
	}
	return true;
}

/* OpenAI's base64 embeddings: the float32 values little-endian, base64 (RFC 4648). */
static json_t *embed_base64(const float *v, size_t n)
{
	static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t len = n * 4, out_len = (len + 2) / 3 * 4;
	unsigned char *b = malloc(len ? len : 1);
	char *s = malloc(out_len + 1);
	json_t *j = NULL;
	if (b && s) {
		for (size_t i = 0; i < n; i++) {
			uint32_t u;
			memcpy(&u, &v[i], 4);
			for (int k = 0; k < 4; k++)
				b[4 * i + (size_t)k] = (unsigned char)(u >> (8 * k));
		}
		size_t o = 0;
		for (size_t i = 0; i < len; i += 3) {
			uint32_t w = (uint32_t)b[i] << 16 | (i + 1 < len ? (uint32_t)b[i + 1] << 8 : 0) |
				     (i + 2 < len ? b[i + 2] : 0);
			s[o++] = tab[w >> 18 & 63];
			s[o++] = tab[w >> 12 & 63];
			s[o++] = i + 1 < len ? tab[w >> 6 & 63] : '=';
			s[o++] = i + 2 < len ? tab[w & 63] : '=';
		}
		j = json_stringn(s, o);
	}
	free(b);
	free(s);
	return j;
}

void gw_embeddings(struct gw *g, const struct gw_caller *who, json_t *body, struct gw_reply *r)
{
	struct hearth_embed_input *in = NULL;
	uint32_t **owned = NULL;
	size_t n = 0;
	struct hearth *h = NULL;
	struct hearth_err err = { 0 };
	struct hearth_embeddings out = { 0 };
	enum hearth_pooling pooling = HEARTH_POOLING_MODEL;
	bool base64 = false;

	if (!gw_check_fields(body, embeddings_fields, r) || !embed_inputs(body, &in, &owned, &n, r))
		goto out;
	json_t *fmt = json_object_get(body, "encoding_format");
	if (fmt && !json_is_null(fmt)) {
		if (json_is_string(fmt) && !strcmp(json_string_value(fmt), "base64")) {
			base64 = true;
		} else if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "float")) {
			gw_reply_error(r, 400, "invalid_request_error", "encoding_format", "invalid_value",
				       "'encoding_format' must be \"float\" or \"base64\"");
			goto out;
		}
	}
	json_t *pl = json_object_get(body, "pooling");
	if (pl && !json_is_null(pl)) {
		const char *s = json_is_string(pl) ? json_string_value(pl) : "";
		pooling = !strcmp(s, "mean") ? HEARTH_POOLING_MEAN : !strcmp(s, "cls") ? HEARTH_POOLING_CLS
				: !strcmp(s, "last") ? HEARTH_POOLING_LAST : HEARTH_POOLING_MODEL;
		if (pooling == HEARTH_POOLING_MODEL) {
			gw_reply_error(r, 400, "invalid_request_error", "pooling", "invalid_value",
				       "'pooling' must be \"mean\", \"cls\" or \"last\"");
			goto out;
		}
	}
	if (gw_connect(g, who, &h, &err) < 0 || hearth_embed(h, in, n, pooling, &out, &err) < 0) {
		gw_reply_hearth_error(r, &err);
		goto out;
	}
	/* Vectors are not truncated: a model gives its own width or nothing. */
	json_t *dim = json_object_get(body, "dimensions");
	if (dim && !json_is_null(dim) && (!json_is_integer(dim) || json_integer_value(dim) != (json_int_t)out.n_embd)) {
		gw_reply_error(r, 400, "invalid_request_error", "dimensions", "unsupported_value",
			       "'dimensions' can only be this model's width, %u", out.n_embd);
		goto out;
	}
	json_t *data = json_array();
	for (size_t i = 0; data && i < n; i++) {
		const float *v = out.data + i * out.n_embd;
		json_t *e;
		if (base64) {
			e = embed_base64(v, out.n_embd);
		} else {
			e = json_array();
			for (uint32_t k = 0; e && k < out.n_embd; k++)
				json_array_append_new(e, json_real(v[k]));
		}
		json_array_append_new(data, json_pack("{s:s,s:I,s:o}", "object", "embedding", "index", (json_int_t)i,
						      "embedding", e ? e : json_null()));
	}
	r->status = 200;
	r->body = json_pack("{s:s,s:o,s:s,s:{s:I,s:I}}", "object", "list", "data", data ? data : json_array(),
			    "model", g->model_id, "usage", "prompt_tokens", (json_int_t)out.total_tokens,
			    "total_tokens", (json_int_t)out.total_tokens);
	atomic_fetch_add(&g->metrics.prompt_tokens, out.total_tokens);
out:
	hearth_embeddings_free(&out);
	hearth_close(h);
	for (size_t i = 0; owned && i < n; i++)
		free(owned[i]);
	free(owned);
	free(in);
}
