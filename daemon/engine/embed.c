/* Embedding pooling (embed.h): mean, first or last of the final hidden states, then the L2
 * normalisation. Sums run in double so a long mean does not drift from llama.cpp's by more
 * than the f32 rounding of its own sum. */
#include "daemon/engine/embed.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int embed_pooler_init(struct embed_pooler *p, enum model_pooling pooling, size_t n_embd, double *acc,
		      struct hearth_error *err)
{
	if (pooling != MODEL_POOLING_MEAN && pooling != MODEL_POOLING_CLS && pooling != MODEL_POOLING_LAST)
		return hearth_error_set(err, HEARTH_EINVAL, "embed: pooling %s gives no single vector "
					"(mean, cls or last do)", embed_pooling_name(pooling));
	*p = (struct embed_pooler){ .pooling = pooling, .n_embd = n_embd, .acc = acc };
	memset(acc, 0, n_embd * sizeof *acc);
	return 0;
}

void embed_pooler_add(struct embed_pooler *p, const float *rows, size_t n_rows)
{
	const size_t E = p->n_embd;
	if (n_rows == 0)
		return;
	switch (p->pooling) {
	case MODEL_POOLING_MEAN:
		for (size_t i = 0; i < n_rows; i++)
			for (size_t e = 0; e < E; e++)
				p->acc[e] += rows[i * E + e];
		break;
	case MODEL_POOLING_CLS:
		if (p->n_pos == 0)
			for (size_t e = 0; e < E; e++)
				p->acc[e] = rows[e];
		break;
	default: /* LAST: init admits no other */
		for (size_t e = 0; e < E; e++)
			p->acc[e] = rows[(n_rows - 1) * E + e];
		break;
	}
	p->n_pos += n_rows;
}

int embed_pooler_finish(const struct embed_pooler *p, bool normalize, float *out, struct hearth_error *err)
{
	if (p->n_pos == 0 || p->n_embd == 0)
		return hearth_error_set(err, HEARTH_EINVAL, "embed: empty input (%zu positions, "
					"width %zu)", p->n_pos, p->n_embd);
	double scale = p->pooling == MODEL_POOLING_MEAN ? 1.0 / (double)p->n_pos : 1.0;
	for (size_t e = 0; e < p->n_embd; e++)
		out[e] = (float)(p->acc[e] * scale);
	if (normalize) {
		double ss = 0.0;
		for (size_t e = 0; e < p->n_embd; e++)
			ss += (double)out[e] * out[e];
		if (ss > 0.0) {
			float inv = (float)(1.0 / sqrt(ss));
			for (size_t e = 0; e < p->n_embd; e++)
				out[e] *= inv;
		}
	}
	return 0;
}

const char *embed_pooling_name(enum model_pooling pooling)
{
	switch (pooling) {
	case MODEL_POOLING_NONE: return "none";
	case MODEL_POOLING_MEAN: return "mean";
	case MODEL_POOLING_CLS: return "cls";
	case MODEL_POOLING_LAST: return "last";
	case MODEL_POOLING_RANK: return "rank";
	default: return "unspecified";
	}
}

bool embed_pooling_parse(const char *name, size_t len, enum model_pooling *out)
{
	static const enum model_pooling vec[] = { MODEL_POOLING_MEAN, MODEL_POOLING_CLS, MODEL_POOLING_LAST };
	for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++) {
		const char *n = embed_pooling_name(vec[i]);
		if (strlen(n) == len && !memcmp(n, name, len)) {
			*out = vec[i];
			return true;
		}
	}
	return false;
}

int embed_pool(const float *hidden, size_t n_pos, size_t n_embd, enum model_pooling pooling,
	       bool normalize, float *out, struct hearth_error *err)
{
	struct embed_pooler p;
	double *acc = calloc(n_embd ? n_embd : 1, sizeof *acc);
	if (!acc)
		return hearth_error_set(err, HEARTH_ENOMEM, "embed: out of memory for %zu sums", n_embd);
	int rc = embed_pooler_init(&p, pooling, n_embd, acc, err);
	if (rc == 0) {
		embed_pooler_add(&p, hidden, n_pos);
		rc = embed_pooler_finish(&p, normalize, out, err);
	}
	free(acc);
	return rc;
}
