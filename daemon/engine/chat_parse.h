/* Reads a chat model's reply back into an assistant message: content, reasoning (the text
 * inside the family's think markers) and tool calls, in the format the model's template
 * implies. Streaming: text goes in as it is sampled and comes out as typed events, with any
 * text that could still turn into a marker held back until it cannot. */
#ifndef HEARTH_ENGINE_CHAT_PARSE_H
#define HEARTH_ENGINE_CHAT_PARSE_H

#include <stdbool.h>
#include <stddef.h>

#include "protocol/error.h"

/* How a model family writes a tool call. */
enum chat_format {
	CHAT_FORMAT_PLAIN,      /* no tool calls: everything outside think markers is content */
	CHAT_FORMAT_HERMES,     /* Hermes, Qwen 2.5/3: <tool_call>{"name", "arguments"}</tool_call> */
	CHAT_FORMAT_LLAMA3,     /* Llama 3.x: a reply that is {"name", "parameters"}, or <|python_tag|>{...} */
	CHAT_FORMAT_MISTRAL,    /* [TOOL_CALLS][{...}, ...] or [TOOL_CALLS]name[ARGS]{...} */
	CHAT_FORMAT_GENERIC,    /* a reply that is {"tool_call": {...}}, {"tool_calls": [...]} or {"response": ...} */
};

const char *chat_format_name(enum chat_format f);

/* The format a template's own text implies (the markers it writes for past tool calls),
 * as llama.cpp's chat code decides from the template. NULL or "" gives PLAIN. */
enum chat_format chat_format_detect(const char *template_src);

#define CHAT_MARKER_MAX 32

struct chat_syntax {
	enum chat_format format;
	char think_open[CHAT_MARKER_MAX];   /* "" when the family has no reasoning markers */
	char think_close[CHAT_MARKER_MAX];
	bool in_reasoning;                  /* the prompt leaves a think block open */
};

/* The syntax for a template and the prompt it rendered: think markers when the template
 * writes them, and whether the prompt's tail opened one the reply continues (DeepSeek-R1
 * ends its prompt with "<think>\n"; Qwen3 with thinking off closes the block itself). */
void chat_syntax_init(struct chat_syntax *s, const char *template_src, const char *prompt,
		      size_t prompt_len);

struct chat_tool_call {
	char *id;               /* the model's own id (Mistral's), else "call_<index>" */
	char *name;
	char *arguments;        /* compact JSON text of the arguments object */
};

enum chat_event_kind { CHAT_EVENT_CONTENT, CHAT_EVENT_REASONING, CHAT_EVENT_TOOL_CALL };

struct chat_event {
	enum chat_event_kind kind;
	const char *text;       /* CONTENT/REASONING: a delta, not NUL-terminated */
	size_t len;
	const struct chat_tool_call *call;  /* TOOL_CALL: valid during the callback */
	size_t index;           /* TOOL_CALL: 0, 1, ... within the message */
};

/* Returns 0 to go on, or a negative HEARTH_E* that the feeding call then returns. */
typedef int (*chat_event_fn)(void *ctx, const struct chat_event *ev);

/* Bounds what one reply may hold back or accumulate: a model that never closes a tool
 * call cannot grow the parser without limit. */
#define CHAT_PARSE_MAX_BYTES (4u << 20)
#define CHAT_PARSE_MAX_CALLS 64

struct chat_parser;

int chat_parser_new(struct chat_parser **out, const struct chat_syntax *s, struct hearth_error *err);
void chat_parser_free(struct chat_parser *p);

/* Feeds the next piece of the reply (special tokens rendered as their text). fn may be NULL
 * when only the final message is wanted. */
int chat_parser_feed(struct chat_parser *p, const char *text, size_t len, chat_event_fn fn, void *ctx,
		     struct hearth_error *err);

/* The reply ended: whatever was held back is settled (an unfinished or malformed tool call
 * becomes content, as the model wrote it). */
int chat_parser_finish(struct chat_parser *p, chat_event_fn fn, void *ctx, struct hearth_error *err);

/* The message as parsed so far: content and reasoning with surrounding whitespace trimmed,
 * and the tool calls in order. Pointers stay valid until the next feed/finish/free. */
const char *chat_parser_content(const struct chat_parser *p, size_t *len);
const char *chat_parser_reasoning(const struct chat_parser *p, size_t *len);
size_t chat_parser_n_calls(const struct chat_parser *p);
const struct chat_tool_call *chat_parser_call(const struct chat_parser *p, size_t i);

#endif
