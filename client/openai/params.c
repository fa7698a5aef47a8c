/* Request fields shared by /v1/chat/completions and /v1/completions: sampling, stop,
 * logprobs, structured output. OpenAI's rules on the way in (a field hearth cannot honour is
 * a 400 naming it, never silently dropped), libhearth's parameters on the way out. */
#include "client/openai/params.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool gw_check_fields(json_t *body, const char *const *known, struct gw_reply *r)
{
	const char *key;
	json_t *v;
	json_object_foreach(body, key, v) {
		bool ok = false;
		for (size_t i = 0; known[i] && !ok; i++)
			ok = !strcmp(key, known[i]);
		if (!ok) {
			gw_reply_error(r, 400, "invalid_request_error", key, "unsupported_parameter",
				       "Unsupported parameter: '%s' is not supported by hearth.", key);
			return false;
		}
	}
	return true;
}

static bool get_number(json_t *body, const char *key, double lo, double hi, double *out, struct gw_reply *r)
{
	json_t *v = json_object_get(body, key);
	if (!v || json_is_null(v))
		return true;
	if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < lo ||
	    json_number_value(v) > hi) {
		gw_reply_error(r, 400, "invalid_request_error", key, "invalid_value",
			       "'%s' must be a number in [%g, %g]", key, lo, hi);
		return false;
	}
	*out = json_number_value(v);
	return true;
}

static bool get_uint(json_t *body, const char *key, uint64_t hi, uint64_t *out, bool *set, struct gw_reply *r)
{
	json_t *v = json_object_get(body, key);
	if (!v || json_is_null(v))
		return true;
	if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > hi) {
		gw_reply_error(r, 400, "invalid_request_error", key, "invalid_value",
			       "'%s' must be an integer in [0, %llu]", key, (unsigned long long)hi);
		return false;
	}
	*out = (uint64_t)json_integer_value(v);
	if (set)
		*set = true;
	return true;
}

bool gw_params_parse(json_t *body, bool chat, struct gw_params *p, struct gw_reply *r)
{
	memset(p, 0, sizeof *p);
	p->gen = hearth_gen_params_default();
	/* OpenAI's defaults where they differ from llama.cpp's: temperature and top_p 1, no
	 * top-k or min-p cut, and no token limit but the context for chat (16 for completions). */
	p->gen.temperature = 1.0;
	p->gen.top_p = 1.0;
	p->gen.top_k = 0;
	p->gen.min_p = 0.0;
	p->gen.max_tokens = chat ? 0 : 16;

	uint64_t u;
	bool set = false;
	double d;
	if (!get_uint(body, "max_tokens", 1u << 20, &u, &set, r))
		return false;
	if (!get_uint(body, chat ? "max_completion_tokens" : "max_tokens", 1u << 20, &u, &set, r))
		return false;
	if (set)
		p->gen.max_tokens = (uint32_t)u;
	if (!get_number(body, "temperature", 0, 2, &p->gen.temperature, r) ||
	    !get_number(body, "top_p", 0, 1, &p->gen.top_p, r) ||
	    !get_number(body, "min_p", 0, 1, &p->gen.min_p, r) ||
	    !get_number(body, "repeat_penalty", 0.01, 100, &p->gen.repeat_penalty, r))
		return false;
	if (p->gen.top_p == 0) /* OpenAI allows 0: only the most likely token */
		p->gen.temperature = 0;
	if (p->gen.top_p <= 0)
		p->gen.top_p = 1;
	u = 0;
	if (!get_uint(body, "top_k", 1u << 20, &u, NULL, r))
		return false;
	p->gen.top_k = (uint32_t)u;
	/* hearth's own: draft tokens per step (0 = off), passed through to the daemon. */
	set = false;
	if (!get_uint(body, "speculate", HEARTH_SPECULATE_MAX, &u, &set, r))
		return false;
	if (set)
		p->gen.speculate = u ? (int32_t)u : -1;
	/* hearth's own: where drafts come from (protocol `draft`), borrowed from the body. */
	json_t *draft = json_object_get(body, "draft");
	if (draft) {
		const char *ds = json_string_value(draft);
		if (!ds || (strcmp(ds, "auto") && strcmp(ds, "lookup") && strcmp(ds, "model"))) {
			gw_reply_error(r, 400, "invalid_request_error", "draft", "invalid_value",
				       "'draft' must be \"auto\", \"lookup\" or \"model\"");
			return false;
		}
		p->gen.draft = ds;
	}
	for (const char *const *k = (const char *const[]){ "frequency_penalty", "presence_penalty", NULL }; *k; k++) {
		d = 0;
		if (!get_number(body, *k, -2, 2, &d, r))
			return false;
		if (d != 0) {
			gw_reply_error(r, 400, "invalid_request_error", *k, "unsupported_value",
				       "'%s' other than 0 is not supported (hearth has repeat_penalty)", *k);
			return false;
		}
	}
	/* ignore_eos: llama-server's and vLLM's extension, so a benchmark can ask every server
	 * for the same number of tokens. */
	json_t *ie = json_object_get(body, "ignore_eos");
	if (ie && !json_is_null(ie)) {
		if (!json_is_boolean(ie)) {
			gw_reply_error(r, 400, "invalid_request_error", "ignore_eos", "invalid_value",
				       "'ignore_eos' must be a boolean");
			return false;
		}
		p->gen.ignore_eos = json_is_true(ie);
	}
	json_t *seed = json_object_get(body, "seed");
	if (seed && !json_is_null(seed)) {
		if (!json_is_integer(seed)) {
			gw_reply_error(r, 400, "invalid_request_error", "seed", "invalid_value", "'seed' must be an integer");
			return false;
		}
		p->gen.has_seed = true;
		p->gen.seed = (uint64_t)json_integer_value(seed);
	}
	u = 1;
	if (!get_uint(body, "n", 128, &u, NULL, r))
		return false;
	if (u != 1) {
		gw_reply_error(r, 400, "invalid_request_error", "n", "unsupported_value", "only n = 1 is supported");
		return false;
	}

	json_t *stop = json_object_get(body, "stop");
	if (json_is_string(stop)) {
		p->stop[p->gen.n_stop++] = json_string_value(stop);
	} else if (json_is_array(stop)) {
		size_t i;
		json_t *s;
		if (json_array_size(stop) > GW_STOP_MAX) {
			gw_reply_error(r, 400, "invalid_request_error", "stop", "invalid_value",
				       "at most %d stop sequences", GW_STOP_MAX);
			return false;
		}
		json_array_foreach(stop, i, s) {
			if (!json_is_string(s) || json_string_length(s) == 0) {
				gw_reply_error(r, 400, "invalid_request_error", "stop", "invalid_value",
					       "stop sequences must be non-empty strings");
				return false;
			}
			p->stop[p->gen.n_stop++] = json_string_value(s);
		}
	} else if (stop && !json_is_null(stop)) {
		gw_reply_error(r, 400, "invalid_request_error", "stop", "invalid_value",
			       "'stop' must be a string or an array of strings");
		return false;
	}
	p->gen.stop = p->stop;

	if (chat) {
		json_t *lp = json_object_get(body, "logprobs");
		if (lp && !json_is_null(lp) && !json_is_boolean(lp)) {
			gw_reply_error(r, 400, "invalid_request_error", "logprobs", "invalid_value", "'logprobs' must be a boolean");
			return false;
		}
		p->gen.logprobs = json_is_true(lp);
		u = 0;
		if (!get_uint(body, "top_logprobs", 20, &u, NULL, r))
			return false;
		if (u && !p->gen.logprobs) {
			gw_reply_error(r, 400, "invalid_request_error", "top_logprobs", "invalid_value",
				       "'top_logprobs' needs 'logprobs': true");
			return false;
		}
		p->gen.top_logprobs = (uint32_t)u;
	} else {
		u = 0;
		json_t *lp = json_object_get(body, "logprobs");
		if (lp && !json_is_null(lp) && !get_uint(body, "logprobs", 5, &u, NULL, r))
			return false;
		p->gen.logprobs = lp && !json_is_null(lp);
		p->gen.top_logprobs = (uint32_t)u;
	}

	json_t *st = json_object_get(body, "stream");
	if (st && !json_is_null(st) && !json_is_boolean(st)) {
		gw_reply_error(r, 400, "invalid_request_error", "stream", "invalid_value", "'stream' must be a boolean");
		return false;
	}
	p->stream = json_is_true(st);
	json_t *so = json_object_get(body, "stream_options");
	if (so && !json_is_null(so)) {
		json_t *iu = json_object_get(so, "include_usage");
		if (!json_is_object(so) || (iu && !json_is_boolean(iu)) || json_object_size(so) > (iu ? 1u : 0u)) {
			gw_reply_error(r, 400, "invalid_request_error", "stream_options", "invalid_value",
				       "'stream_options' takes only 'include_usage' (a boolean)");
			return false;
		}
		if (!p->stream) {
			gw_reply_error(r, 400, "invalid_request_error", "stream_options", "invalid_value",
				       "'stream_options' needs 'stream': true");
			return false;
		}
		p->include_usage = json_is_true(iu);
	}
	return true;
}

bool gw_response_format(json_t *body, struct gw_params *p, struct gw_reply *r)
{
	json_t *rf = json_object_get(body, "response_format");
	if (!rf || json_is_null(rf))
		return true;
	const char *type = json_string_value(json_object_get(rf, "type"));
	if (!json_is_object(rf) || !type) {
		gw_reply_error(r, 400, "invalid_request_error", "response_format", "invalid_value",
			       "'response_format' must be an object with a 'type'");
		return false;
	}
	if (!strcmp(type, "text"))
		return true;
	if (!strcmp(type, "json_object")) {
		p->gen.json_object = true;
		return true;
	}
	if (!strcmp(type, "json_schema")) {
		json_t *js = json_object_get(rf, "json_schema");
		json_t *schema = json_object_get(js, "schema");
		if (!json_is_object(js) || !json_is_object(schema)) {
			gw_reply_error(r, 400, "invalid_request_error", "response_format.json_schema.schema", "invalid_value",
				       "'json_schema' needs a 'schema' object");
			return false;
		}
		p->schema_text = json_dumps(schema, JSON_COMPACT);
		p->gen.json_schema = p->schema_text;
		return p->schema_text != NULL;
	}
	gw_reply_error(r, 400, "invalid_request_error", "response_format.type", "invalid_value",
		       "'response_format.type' must be text, json_object or json_schema, not '%s'", type);
	return false;
}

void gw_params_free(struct gw_params *p)
{
	free(p->schema_text);
}
