/* The bounds of the sampling parameters a generate request carries, in one table: the
 * daemon's decoder refuses what lies outside them, and every command line that reads them
 * (`hearth generate`, `hearthd-tool run`) checks the same numbers with the same words.
 * Header-only, because the CLI links only libhearth's exported API. */
#ifndef HEARTH_PROTOCOL_SAMPLING_H
#define HEARTH_PROTOCOL_SAMPLING_H

#include <errno.h>
#include <math.h> /* isfinite, a macro: no libm */
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

/* Named so the decoder's field table (a static initializer) can use them. */
#define MSG_TEMPERATURE_MAX 100.0
#define MSG_TOP_K_MAX (1u << 20)
#define MSG_REPEAT_PENALTY_MAX 100.0
#define MSG_REPEAT_LAST_N_MAX (1u << 20)

enum msg_sampling_param {
	MSG_SAMPLING_TEMPERATURE,
	MSG_SAMPLING_TOP_K,
	MSG_SAMPLING_TOP_P,
	MSG_SAMPLING_MIN_P,
	MSG_SAMPLING_REPEAT_PENALTY,
	MSG_SAMPLING_REPEAT_LAST_N,
	MSG_SAMPLING_N,
};

struct msg_sampling_bound {
	const char *key;      /* the generate request's field */
	const char *flag;     /* the command-line option both front ends spell the same */
	double min, max;
	bool min_open;        /* min itself is refused: (min, max] */
	bool integer;         /* a count: digits only */
};

static inline const struct msg_sampling_bound *msg_sampling_bound(enum msg_sampling_param p)
{
	static const struct msg_sampling_bound bounds[MSG_SAMPLING_N] = {
		[MSG_SAMPLING_TEMPERATURE] = { "temperature", "--temp", 0, MSG_TEMPERATURE_MAX,
					       false, false },
		[MSG_SAMPLING_TOP_K] = { "top_k", "--top-k", 0, MSG_TOP_K_MAX, false, true },
		[MSG_SAMPLING_TOP_P] = { "top_p", "--top-p", 0, 1, true, false },
		[MSG_SAMPLING_MIN_P] = { "min_p", "--min-p", 0, 1, false, false },
		[MSG_SAMPLING_REPEAT_PENALTY] = { "repeat_penalty", "--repeat-penalty", 0,
						  MSG_REPEAT_PENALTY_MAX, true, false },
		[MSG_SAMPLING_REPEAT_LAST_N] = { "repeat_last_n", "--repeat-last-n", 0,
						 MSG_REPEAT_LAST_N_MAX, false, true },
	};
	return &bounds[p];
}

/* Whether x lies inside p's bounds (and is whole, for the counts). */
static inline bool msg_sampling_in_bounds(enum msg_sampling_param p, double x)
{
	const struct msg_sampling_bound *b = msg_sampling_bound(p);
	if (!isfinite(x) || x > b->max || x < b->min || (b->min_open && x == b->min))
		return false;
	return !b->integer || x == (double)(long long)x; /* x is bounded, so the cast is exact */
}

/* Reads text as p's value. On failure returns false and writes a message naming the flag,
 * the bounds and the text ("--temp wants a number in [0, 100], not \"150\"") into why. */
static inline bool msg_sampling_parse(enum msg_sampling_param p, const char *text, double *out,
				      char *why, size_t size)
{
	const struct msg_sampling_bound *b = msg_sampling_bound(p);
	char *end = NULL;
	double x = 0;
	bool ok = text && *text;
	if (ok && b->integer)
		for (const char *c = text; *c; c++)
			ok &= *c >= '0' && *c <= '9';
	if (ok) {
		errno = 0;
		x = strtod(text, &end);
		ok = errno == 0 && *end == '\0' && msg_sampling_in_bounds(p, x);
	}
	if (!ok) {
		if (b->integer)
			snprintf(why, size, "%s wants a whole number in [%.0f, %.0f], not \"%s\"",
				 b->flag, b->min, b->max, text ? text : "");
		else
			snprintf(why, size, "%s wants a number in %c%g, %g], not \"%s\"", b->flag,
				 b->min_open ? '(' : '[', b->min, b->max, text ? text : "");
		return false;
	}
	*out = x;
	return true;
}

#endif
