/* The chat request in the service: the model's templates (loaded with the model), a chat
 * turned into prompt tokens (template text with special tokens, message text without), and
 * the reply parsed as it streams into `delta` frames and done's assistant message. */
#ifndef HEARTH_SERVE_CHAT_H
#define HEARTH_SERVE_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/engine/chat_parse.h"
#include "daemon/engine/chat_template.h"
#include "daemon/engine/gguf.h"
#include "daemon/engine/tokenizer.h"
#include "protocol/msg.h"
#include "protocol/ring.h"

#define SERVE_CHAT_NAMED_MAX 8

struct serve_chat_template {
	char name[MSG_NAME_MAX + 1];     /* "" for the default */
	struct chat_template *tmpl;
	char *source;                    /* the Jinja text: the reply format is read from it */
};

/* What a loaded model offers chat: its default template and named ones, and the text of
 * its BOS and EOS tokens for the templates' bos_token/eos_token. */
struct serve_chat_model {
	struct serve_chat_template def;
	struct serve_chat_template named[SERVE_CHAT_NAMED_MAX];
	size_t n_named;
	const char *origin;              /* "model", "file" or "chatml" (built in) */
	char bos[64], eos[64];
};

/* Reads tokenizer.chat_template (and tokenizer.chat_template.NAME) from f, or the template
 * in file_path when it is set (the chat_template config key), else the built-in ChatML.
 * Errors name the file and the template line. */
int serve_chat_model_load(struct serve_chat_model *cm, const struct gguf_file *f, const struct tok *tok,
			  const char *file_path, struct hearth_error *err);
void serve_chat_model_free(struct serve_chat_model *cm);

/* One chat request's state. Built on the loop thread with the prompt; fed on the compute
 * thread while the request runs (serve_chat_feed); read and freed on the loop thread after the
 * scheduler handed the request back. */
struct serve_chat;

/* Renders c's conversation with the model's template and tokenizes it (at most max_ctx - 1
 * tokens). On failure *code is the wire error to answer with. */
int serve_chat_prepare(const struct serve_chat_model *cm, const struct tok *tok, const struct msg_chat *c,
		       uint32_t max_ctx, int32_t **prompt, uint32_t *n_prompt, struct serve_chat **out,
		       enum msg_errcode *code, struct hearth_error *e);

/* The grammar a chat's tool calls are held to, or NULL: the calls of the family's format with
 * each tool's name and its parameters' schema, from the first token (tool_choice required
 * or a name) or, with a trigger, from the family's tool-call opener on (auto: free text
 * until the model starts a call). */
const char *serve_chat_tool_grammar(const struct serve_chat *sc, const char **trigger);

/* Compute thread: the text of generated token `index` (fed once per index) goes through the
 * reply parser; the deltas it yields are pushed into r (the session's private ring) as
 * SERVE_CHAT_DELTA_REC records, or kept for the next call when r is full. */
void serve_chat_feed(struct serve_chat *sc, struct ring *r, uint64_t req_id, uint32_t index, const char *text,
		     size_t len);

#define SERVE_CHAT_DELTA_REC 200u       /* private ring record: a delta for the loop thread */

/* Loop thread: a SERVE_CHAT_DELTA_REC payload as a `delta` message (pointing into payload). */
int serve_chat_delta_decode(const void *payload, size_t len, struct msg *out, struct hearth_error *e);

/* Loop thread, when the request came back: settles the parser, calls send for every delta
 * not yet sent (in order), and fills d's message and finish (tool_calls when it called one).
 * Pointers in d stay valid until serve_chat_free. */
void serve_chat_finish(struct serve_chat *sc, uint64_t req_id, void (*send)(void *ctx, const struct msg *m),
		       void *ctx, struct msg_done *d);
void serve_chat_free(struct serve_chat *sc);

#endif
