/* Embedding pooling (embed.h): mean, first or last of the final hidden states, then the L2
 * normalisation. Sums run in double so a long mean does not drift from llama.cpp's by more
 * than the f32 rounding of its own sum. */
#include "daemon/engine/embed.h"

#include <math.h>
#include <string.h>

int embed_pool(const float *hidden, size_t n_pos, size_t n_embd, enum model_pooling pooling,
		   bool normalize, float *out, struct hearth_error *err)
{
	if (n_pos == 0 || n_embd == 0)
		return hearth_error_set(err, HEARTH_EINVAL, "embed: empty input (%zu positions, "
					"width %zu)", n_pos, n_embd);
	switch (pooling) {
	case MODEL_POOLING_MEAN:
		for (size_t e = 0; e < n_embd; e++) {
			double s = 0.0;
			for (size_t i = 0; i < n_pos; i++)
				s += hidden[i * n_embd + e];
			out[e] = (float)(s / (double)n_pos);
		}
		break;
	case MODEL_POOLING_CLS:
		memcpy(out, hidden, n_embd * sizeof(*out));
		break;
	case MODEL_POOLING_LAST:
		memcpy(out, hidden + (n_pos - 1) * n_embd, n_embd * sizeof(*out));
		break;
	default:
		return hearth_error_set(err, HEARTH_EINVAL, "embed: pooling %d gives no single "
					"vector (mean, cls or last do)", (int)pooling);
	}
	if (normalize) {
		double ss = 0.0;
		for (size_t e = 0; e < n_embd; e++)
			ss += (double)out[e] * out[e];
		if (ss > 0.0) {
			float inv = (float)(1.0 / sqrt(ss));
			for (size_t e = 0; e < n_embd; e++)
				out[e] *= inv;
		}
	}
	return 0;
}
