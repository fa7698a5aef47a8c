/* Prompt-lookup drafting and the adaptive draft length (spec.h). A draft costs only rows
 * of the verifying step, never a second model; the lookup is a backward scan of the
 * sequence's own tokens, microseconds against a forward step. */
#include "daemon/serve/spec.h"

#include <string.h>

/* The first draft after a match is found: long enough to pay off on a copied span, short
 * enough that a wrong guess costs few rows; it then adapts (spec_seq_update). */
#define SPEC_K_START 4

int spec_source_parse(const char *text, size_t n, enum spec_source *out)
{
	static const char *const names[] = { "auto", "lookup", "model" };
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (strlen(names[i]) == n && !memcmp(text, names[i], n)) {
			*out = (enum spec_source)i;
			return 0;
		}
	return -1;
}

void spec_seq_init(struct spec_seq *s, uint32_t k_max)
{
	if (k_max > SPEC_K_MAX)
		k_max = SPEC_K_MAX;
	uint32_t k = k_max < SPEC_K_START ? k_max : SPEC_K_START;
	*s = (struct spec_seq){ .k_max = k_max, .k = k, .k_model = k };
}

uint32_t spec_lookup(const int32_t *tokens, uint32_t n, int32_t *draft, uint32_t k_max)
{
	if (k_max == 0)
		return 0;
	for (uint32_t g = SPEC_NGRAM_MAX; g >= SPEC_NGRAM_MIN; g--) {
		if (n < g + 1)
			continue;
		const int32_t *tail = tokens + n - g;
		/* Occurrences starting at i < n - g, so at least the token at i + g follows
		 * them; the latest first (what the text did most recently is the best guess). */
		for (uint32_t i = n - g; i-- > 0;) {
			if (tokens[i] != tail[0] || memcmp(tokens + i, tail, g * sizeof *tokens) != 0)
				continue;
			uint32_t k = 0;
			for (uint32_t j = i + g; k < k_max; j++)
				draft[k++] = j < n ? tokens[j] : draft[j - n];
			return k;
		}
	}
	return 0;
}

uint32_t spec_draft(struct spec_seq *s, const int32_t *tokens, uint32_t n, uint32_t limit,
		    int32_t *draft)
{
	uint32_t k = s->k < limit ? s->k : limit;
	return s->k_max && s->source != SPEC_SOURCE_MODEL ? spec_lookup(tokens, n, draft, k) : 0;
}

/* Grows after a fully accepted draft, else one more than was accepted. */
static uint32_t spec_next_k(const struct spec_seq *s, uint32_t k, uint32_t n_draft, uint32_t n_accepted)
{
	k = n_accepted == n_draft ? k + 2 : n_accepted + 1;
	return k > s->k_max ? s->k_max : k;
}

void spec_seq_update(struct spec_seq *s, uint32_t n_draft, uint32_t n_accepted)
{
	s->drafted += n_draft;
	s->accepted += n_accepted;
	if (n_draft)
		s->k = spec_next_k(s, s->k, n_draft, n_accepted);
}

void spec_seq_update_model(struct spec_seq *s, uint32_t n_draft, uint32_t n_accepted)
{
	s->drafted += n_draft;
	s->accepted += n_accepted;
	s->model_drafted += n_draft;
	s->model_accepted += n_accepted;
	if (n_draft)
		s->k_model = spec_next_k(s, s->k_model, n_draft, n_accepted);
}
