/* Chat templates: Hugging Face Jinja chat templates rendered as transformers'
 * apply_chat_template does (jinja2 sandbox, trim_blocks, lstrip_blocks), with every output
 * byte marked as template text or message data so the prompt can be tokenized with special
 * tokens recognised only in the template's own text. */
#ifndef HEARTH_DAEMON_CHAT_TEMPLATE_H
#define HEARTH_DAEMON_CHAT_TEMPLATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/engine/tokenizer.h"
#include "protocol/error.h"

/* A parsed template: immutable after chat_template_new, shareable across threads. */
struct chat_template;

/* Parses len bytes of Jinja source. origin names the template in messages
 * ("model.gguf:tokenizer.chat_template"); syntax errors name its line and column
 * (HEARTH_EFORMAT), resource limits give HEARTH_ERANGE. */
int chat_template_new(struct chat_template **out, const char *source, size_t len, const char *origin,
		      struct hearth_error *err);
void chat_template_free(struct chat_template *t);

/* Render limits; 0 takes the default in brackets. */
struct chat_limits {
	uint64_t steps;     /* evaluation steps [10,000,000] */
	uint32_t depth;     /* macro call nesting and tojson nesting [64] */
	size_t output;      /* bytes of output, and of any one string [8 MiB] */
	size_t range;       /* items of range() and list repetition [100,000] */
	size_t memory;      /* bytes the render may allocate in all [256 MiB] */
};

struct chat_render_opts {
	const json_t *messages;  /* array of {role, content, name, tool_calls, tool_call_id, ...} */
	const json_t *tools;     /* array, or NULL (then tools is undefined in the template) */
	bool add_generation_prompt;
	const json_t *vars;      /* object of extra template variables, or NULL */
	const char *bos_token, *eos_token; /* from the vocab (NULL = ""); vars override */
	int64_t now;             /* unix seconds for strftime_now (formatted in UTC); -1 = the clock */
	struct chat_limits limits;
};

/* A run of output bytes: from_message marks data that came from messages, tools or vars
 * (never to be read as special tokens); the rest is the template's own text. The spans
 * cover the text in order, without gaps. */
struct chat_span {
	size_t off, len;
	bool from_message;
};
struct chat_text {
	char *text; /* NUL-terminated, len bytes */
	size_t len;
	struct chat_span *spans;
	size_t n_spans;
};

/* Renders into *out (caller frees with chat_text_free). A template's raise_exception and
 * Python errors (undefined values, type errors, the sandbox's refusals) fail with
 * HEARTH_EINVAL and a message "ORIGIN:LINE:COL: KindError: text"; a limit with
 * HEARTH_ERANGE; out is zeroed on failure. */
int chat_template_render(const struct chat_template *t, const struct chat_render_opts *o,
			 struct chat_text *out, struct hearth_error *err);
void chat_text_free(struct chat_text *out);

/* The ChatML template used when a model ships none. */
const char *chat_template_chatml(void);

/* Tokenizes rendered text span by span: special-token text is recognised only in the
 * template's spans, and no BPE merge crosses a span boundary. Same buffer contract as
 * tok_encode (HEARTH_ERANGE with the needed count in *n when cap is too small). */
int chat_text_tokenize(const struct tok *t, const struct chat_text *x, bool add_bos, int32_t *ids, size_t cap,
		       size_t *n, struct hearth_error *err);

#endif
