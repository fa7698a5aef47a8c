/* The OpenAI request fields hearth-openai maps onto libhearth's parameters (params.c). */
#ifndef HEARTH_OPENAI_PARAMS_H
#define HEARTH_OPENAI_PARAMS_H

#include "client/openai/gw.h"

#define GW_STOP_MAX 16

struct gw_params {
	struct hearth_gen_params gen;   /* max_tokens 0: up to the context (chat's default) */
	const char *stop[GW_STOP_MAX];  /* borrowed from the request body */
	bool stream;
	bool include_usage;
	char *schema_text;              /* owned: response_format's schema as JSON text */
};

/* false with a 400 in r when body has a field not in known (NULL-terminated). */
bool gw_check_fields(json_t *body, const char *const *known, struct gw_reply *r);
/* Sampling, stop, n, logprobs, stream: chat's or completions' rules. */
bool gw_params_parse(json_t *body, bool chat, struct gw_params *p, struct gw_reply *r);
/* response_format: text, json_object, json_schema. */
bool gw_response_format(json_t *body, struct gw_params *p, struct gw_reply *r);
void gw_params_free(struct gw_params *p);

#endif
