/* hearth_embed: a batch of any size as embed requests that each fit the daemon's frames
 * (inputs of one kind, at most MSG_EMBED_INPUTS_MAX, their vectors within one reply), sent
 * one after another; the vectors come back in input order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/conn.h"

/* Bytes of a reply frame besides its vectors, and of a request besides its inputs. */
#define EMBED_REPLY_OVERHEAD 256u
#define EMBED_REQUEST_OVERHEAD 64u

static const char *embed_pooling_wire(enum hearth_pooling p)
{
	switch (p) {
	case HEARTH_POOLING_MEAN: return "mean";
	case HEARTH_POOLING_CLS: return "cls";
	case HEARTH_POOLING_LAST: return "last";
	default: return NULL;
	}
}

/* Encoded bytes of input in at most (a str header, or an array of up to 5-byte ids). */
static size_t embed_input_bytes(const struct hearth_embed_input *in)
{
	return in->text ? in->len + 5 : in->n_tokens * 5 + 5;
}

/* One request of inputs[0..n), all texts or all token arrays, into out from row `at`. */
static int embed_chunk(struct hearth *h, const struct hearth_embed_input *inputs, size_t n, const char *pooling,
		       struct hearth_embeddings *out, size_t at, struct hearth_err *err)
{
	struct msg m, reply;
	struct msg_bytes *texts = NULL;
	struct msg_u32s *toks = NULL;
	msg_init(&m, MSG_EMBED, 0);
	if (inputs[0].text) {
		texts = calloc(n, sizeof *texts);
		for (size_t i = 0; texts && i < n; i++)
			texts[i] = (struct msg_bytes){ inputs[i].text, inputs[i].len };
		m.u.embed.input = texts;
		m.u.embed.n_input = n;
	} else {
		toks = calloc(n, sizeof *toks);
		for (size_t i = 0; toks && i < n; i++)
			toks[i] = (struct msg_u32s){ (uint32_t *)inputs[i].tokens, inputs[i].n_tokens };
		m.u.embed.tokens = toks;
		m.u.embed.n_tokens = n;
	}
	if (!texts && !toks)
		return conn_err_set(err, HEARTH_ENOMEM, "out of memory for %zu inputs", n);
	if (pooling) {
		m.u.embed.has_pooling = true;
		m.u.embed.pooling = (struct msg_bytes){ pooling, strlen(pooling) };
	}
	int rc = conn_call(h, &m, NULL, MSG_EMBEDDINGS, &reply, err);
	free(texts);
	free(toks);
	if (rc < 0)
		return rc;
	const struct msg_embeddings *e = &reply.u.embeddings;
	if (e->n_inputs != n || (out->n_embd && e->n_embd != out->n_embd)) {
		msg_free(&reply);
		return conn_err_set(err, HEARTH_EPROTO, "hearthd sent %zu vectors of %u for %zu inputs", e->n_inputs,
				    e->n_embd, n);
	}
	if (!out->data) {
		out->n_embd = e->n_embd;
		out->data = malloc(out->n * e->n_embd * sizeof *out->data);
		if (!out->data) {
			msg_free(&reply);
			return conn_err_set(err, HEARTH_ENOMEM, "out of memory for %zu vectors", out->n);
		}
	}
	memcpy(out->data + at * out->n_embd, e->data.ptr, e->data.len);
	for (size_t i = 0; i < n; i++) {
		out->n_tokens[at + i] = e->n_tokens[i];
		out->total_tokens += e->n_tokens[i];
	}
	size_t pl = e->pooling.len < sizeof out->pooling - 1 ? e->pooling.len : sizeof out->pooling - 1;
	memcpy(out->pooling, e->pooling.ptr, pl);
	out->pooling[pl] = 0;
	msg_free(&reply);
	return 0;
}

int hearth_embed(struct hearth *h, const struct hearth_embed_input *inputs, size_t n, enum hearth_pooling pooling,
		 struct hearth_embeddings *out, struct hearth_err *err)
{
	memset(out, 0, sizeof *out);
	if (h->model.proto_minor < 4)
		return conn_err_set(err, HEARTH_EUNSUPPORTED, "hearthd speaks protocol %u.%u; embed needs 1.4",
				    h->model.proto_major, h->model.proto_minor);
	if (n == 0 || !inputs)
		return conn_err_set(err, HEARTH_EINVAL, "hearth_embed: no input");
	const char *pn = embed_pooling_wire(pooling);
	if (pooling != HEARTH_POOLING_MODEL && !pn)
		return conn_err_set(err, HEARTH_EINVAL, "hearth_embed: unknown pooling %d", (int)pooling);
	for (size_t i = 0; i < n; i++) {
		const struct hearth_embed_input *in = &inputs[i];
		if (!in->text == !in->tokens)
			return conn_err_set(err, HEARTH_EINVAL, "input %zu: exactly one of text and tokens", i);
		if (in->text ? in->len == 0 : in->n_tokens == 0)
			return conn_err_set(err, HEARTH_EINVAL, "input %zu is empty", i);
		if (in->text && !msg_utf8_valid(in->text, in->len))
			return conn_err_set(err, HEARTH_EINVAL, "input %zu is not valid UTF-8", i);
		if (embed_input_bytes(in) + EMBED_REQUEST_OVERHEAD > h->inline_max)
			return conn_err_set(err, HEARTH_ERANGE, "input %zu is %zu bytes; one frame carries %zu", i,
					    embed_input_bytes(in), h->inline_max - EMBED_REQUEST_OVERHEAD);
	}
	out->n = n;
	out->n_tokens = calloc(n, sizeof *out->n_tokens);
	if (!out->n_tokens)
		return conn_err_set(err, HEARTH_ENOMEM, "out of memory for %zu inputs", n);
	/* Vectors per reply: the welcome's width, within one frame (the daemon checks the same). */
	size_t per_reply = (FRAME_MAX_DEFAULT - EMBED_REPLY_OVERHEAD) / ((size_t)h->model.n_embd * sizeof(float) + 5);
	if (per_reply > MSG_EMBED_INPUTS_MAX)
		per_reply = MSG_EMBED_INPUTS_MAX;
	if (per_reply == 0)
		per_reply = 1;
	for (size_t at = 0; at < n;) {
		size_t k = 0, bytes = EMBED_REQUEST_OVERHEAD;
		bool text = inputs[at].text != NULL;
		while (at + k < n && k < per_reply && (inputs[at + k].text != NULL) == text &&
		       bytes + embed_input_bytes(&inputs[at + k]) <= h->inline_max)
			bytes += embed_input_bytes(&inputs[at + k++]);
		int rc = embed_chunk(h, inputs + at, k, pn, out, at, err);
		if (rc < 0) {
			if (n > k && err) { /* which request of the batch failed */
				char head[64];
				int hn = snprintf(head, sizeof head, "inputs %zu..%zu: ", at, at + k - 1);
				size_t keep = sizeof err->msg - 1 - (size_t)hn;
				memmove(err->msg + hn, err->msg, keep);
				err->msg[sizeof err->msg - 1] = 0;
				memcpy(err->msg, head, (size_t)hn);
			}
			hearth_embeddings_free(out);
			return rc;
		}
		at += k;
	}
	return 0;
}

void hearth_embeddings_free(struct hearth_embeddings *e)
{
	if (!e)
		return;
	free(e->data);
	free(e->n_tokens);
	memset(e, 0, sizeof *e);
}
