/* The field tables of every message: what msg_encode writes and msg_decode accepts, in one
 * place. Keys, types and bounds follow doc/protocol.md; FF_OMIT_ZERO marks the fields a
 * sender leaves out when they hold their default, which keeps control frames small. */
#include "protocol/msg_fields.h"

#include <stddef.h>

#include "protocol/sampling.h"

/* F: a plain field; FH: one with a presence flag; FA: an array with its count; FM: a nested
 * map; FMA: an array of nested maps. */
#define F(key, kind, flags, st, member, min, max) \
	{ key, kind, flags, offsetof(st, member), FIELD_NO_OFF, FIELD_NO_OFF, min, max, 0, NULL }
#define FH(key, kind, flags, st, member, has, min, max) \
	{ key, kind, flags, offsetof(st, member), FIELD_NO_OFF, offsetof(st, has), min, max, 0, NULL }
#define FA(key, kind, flags, st, member, n, max, elem_max) \
	{ key, kind, flags, offsetof(st, member), offsetof(st, n), FIELD_NO_OFF, 0, max, elem_max, NULL }
#define FM(key, flags, st, member, sub) \
	{ key, FK_MAP, flags, offsetof(st, member), FIELD_NO_OFF, FIELD_NO_OFF, 0, 0, 0, &sub }
#define FMA(key, flags, st, member, n, max, sub) \
	{ key, FK_MAPS, flags, offsetof(st, member), offsetof(st, n), FIELD_NO_OFF, 0, max, 0, &sub }
#define TABLE(tab, st) { tab, sizeof tab / sizeof tab[0], sizeof(st) }

#define U32MAX FIELD_U32MAX
#define U64MAX FIELD_U64MAX

static const struct field hello_fields[] = {
	F("proto", FK_U32, FF_REQUIRED, struct msg_hello, proto_major, 0, U32MAX),
	F("proto_minor", FK_U32, 0, struct msg_hello, proto_minor, 0, U32MAX),
	F("name", FK_STR, FF_REQUIRED | FF_UTF8 | FF_NONEMPTY, struct msg_hello, name, 0,
	  MSG_NAME_MAX),
	F("ring", FK_BOOL, 0, struct msg_hello, ring, 0, 0),
};

/* The generation parameters generate and chat share; g is the member path to the
 * struct msg_generate inside st ("" for generate itself). */
#define GEN_FIELDS(st, g) \
	F("max_tokens", FK_U32, 0, st, g max_tokens, 0, MSG_MAX_TOKENS_LIMIT), \
	F("temperature", FK_F64, 0, st, g sampling.temperature, 0, MSG_TEMPERATURE_MAX), \
	F("top_k", FK_U32, 0, st, g sampling.top_k, 0, MSG_TOP_K_MAX), \
	F("top_p", FK_F64, FF_MIN_OPEN, st, g sampling.top_p, 0, 1), \
	F("min_p", FK_F64, 0, st, g sampling.min_p, 0, 1), \
	F("repeat_penalty", FK_F64, FF_MIN_OPEN, st, g sampling.repeat_penalty, 0, MSG_REPEAT_PENALTY_MAX), \
	F("repeat_last_n", FK_U32, 0, st, g sampling.repeat_last_n, 0, MSG_REPEAT_LAST_N_MAX), \
	FH("seed", FK_U64, 0, st, g sampling.seed, g sampling.has_seed, 0, U64MAX), \
	FA("stop", FK_STRS, FF_OMIT_ZERO, st, g stop, g n_stop, MSG_STOP_MAX, MSG_STOP_LEN_MAX), \
	FA("stop_tokens", FK_U32S, FF_OMIT_ZERO, st, g stop_tokens, g n_stop_tokens, MSG_STOP_TOKENS_MAX, \
	   MSG_TOKEN_MAX), \
	F("logprobs", FK_BOOL, FF_OMIT_ZERO, st, g logprobs, 0, 0), \
	F("top_logprobs", FK_U32, FF_OMIT_ZERO, st, g top_logprobs, 0, MSG_TOP_MAX), \
	F("logits", FK_BOOL, FF_OMIT_ZERO, st, g logits, 0, 0), \
	F("socket", FK_BOOL, FF_OMIT_ZERO, st, g stream_socket, 0, 0), \
	F("ignore_eos", FK_BOOL, FF_OMIT_ZERO, st, g ignore_eos, 0, 0), \
	FH("grammar", FK_STR, FF_UTF8 | FF_NONEMPTY, st, g grammar, g has_grammar, 0, MSG_GRAMMAR_MAX), \
	FH("json_schema", FK_STR, FF_UTF8 | FF_NONEMPTY, st, g json_schema, g has_json_schema, 0, MSG_GRAMMAR_MAX), \
	F("json_object", FK_BOOL, FF_OMIT_ZERO, st, g json_object, 0, 0), \
	FH("jump_forward", FK_BOOL, 0, st, g jump_forward, g has_jump_forward, 0, 0), \
	FH("speculate", FK_U32, 0, st, g speculate, g has_speculate, 0, MSG_SPECULATE_MAX), \
	FH("draft", FK_STR, FF_UTF8 | FF_NONEMPTY, st, g draft, g has_draft, 0, MSG_DRAFT_SOURCE_MAX)

static const struct field generate_fields[] = {
	FH("prompt", FK_STR, FF_UTF8, struct msg_generate, prompt, has_prompt, 0, MSG_STR_MAX),
	FA("tokens", FK_U32S, FF_NONEMPTY | FF_OMIT_ZERO, struct msg_generate, tokens, n_tokens, MSG_ARRAY_MAX,
	   MSG_TOKEN_MAX),
	FH("prompt_ref", FK_U64, 0, struct msg_generate, prompt_ref, has_prompt_ref, 0, U64MAX),
	GEN_FIELDS(struct msg_generate, ),
};

static const struct field chat_call_fields[] = {
	F("id", FK_STR, FF_UTF8 | FF_OMIT_ZERO, struct msg_chat_call, id, 0, MSG_TOOL_NAME_MAX),
	F("name", FK_STR, FF_REQUIRED | FF_UTF8 | FF_NONEMPTY, struct msg_chat_call, name, 0, MSG_TOOL_NAME_MAX),
	F("arguments", FK_STR, FF_UTF8, struct msg_chat_call, arguments, 0, MSG_STR_MAX),
};

static const struct field_table chat_call_table = TABLE(chat_call_fields, struct msg_chat_call);

static const struct field chat_message_fields[] = {
	F("role", FK_STR, FF_REQUIRED | FF_UTF8 | FF_NONEMPTY, struct msg_chat_message, role, 0, MSG_ROLE_MAX),
	FH("content", FK_STR, FF_UTF8, struct msg_chat_message, content, has_content, 0, MSG_STR_MAX),
	FH("name", FK_STR, FF_UTF8, struct msg_chat_message, name, has_name, 0, MSG_TOOL_NAME_MAX),
	FH("tool_call_id", FK_STR, FF_UTF8, struct msg_chat_message, tool_call_id, has_tool_call_id, 0,
	   MSG_TOOL_NAME_MAX),
	FH("reasoning_content", FK_STR, FF_UTF8, struct msg_chat_message, reasoning_content, has_reasoning, 0,
	   MSG_STR_MAX),
	FMA("tool_calls", FF_OMIT_ZERO, struct msg_chat_message, tool_calls, n_tool_calls, MSG_CHAT_CALLS_MAX,
	    chat_call_table),
};

static const struct field_table chat_message_table = TABLE(chat_message_fields, struct msg_chat_message);

static const struct field chat_fields[] = {
	FMA("messages", FF_REQUIRED | FF_NONEMPTY, struct msg_chat, messages, n_messages, MSG_CHAT_MESSAGES_MAX,
	    chat_message_table),
	FH("tools", FK_STR, FF_UTF8 | FF_NONEMPTY, struct msg_chat, tools, has_tools, 0, MSG_STR_MAX),
	FH("tool_choice", FK_STR, FF_UTF8 | FF_NONEMPTY, struct msg_chat, tool_choice, has_tool_choice, 0,
	   MSG_TOOL_NAME_MAX),
	F("add_generation_prompt", FK_BOOL, 0, struct msg_chat, add_generation_prompt, 0, 0),
	FH("vars", FK_STR, FF_UTF8 | FF_NONEMPTY, struct msg_chat, vars, has_vars, 0, MSG_STR_MAX),
	FH("template", FK_STR, FF_UTF8 | FF_NONEMPTY, struct msg_chat, template_name, has_template, 0,
	   MSG_NAME_MAX),
	GEN_FIELDS(struct msg_chat, gen.),
};

static const struct field delta_fields[] = {
	F("kind", FK_STR, FF_REQUIRED | FF_NONEMPTY, struct msg_delta, kind, 0, MSG_NAME_MAX),
	F("text", FK_STR, FF_OMIT_ZERO, struct msg_delta, text, 0, MSG_STR_MAX),
	F("index", FK_U32, FF_OMIT_ZERO, struct msg_delta, index, 0, MSG_CHAT_CALLS_MAX * MSG_CHAT_MESSAGES_MAX),
	{ "call", FK_MAP, 0, offsetof(struct msg_delta, call), FIELD_NO_OFF, offsetof(struct msg_delta, has_call), 0,
	  0, 0, &chat_call_table },
};

static const struct field chat_reply_fields[] = {
	F("content", FK_STR, 0, struct msg_chat_reply, content, 0, MSG_STR_MAX),
	F("reasoning_content", FK_STR, FF_OMIT_ZERO, struct msg_chat_reply, reasoning_content, 0, MSG_STR_MAX),
	FMA("tool_calls", FF_OMIT_ZERO, struct msg_chat_reply, tool_calls, n_tool_calls, MSG_CHAT_CALLS_MAX,
	    chat_call_table),
};

static const struct field_table chat_reply_table = TABLE(chat_reply_fields, struct msg_chat_reply);

static const struct field embed_fields[] = {
	FA("input", FK_STRS, FF_NONEMPTY | FF_OMIT_ZERO, struct msg_embed, input, n_input, MSG_EMBED_INPUTS_MAX,
	   MSG_STR_MAX),
	FA("tokens", FK_U32SS, FF_NONEMPTY | FF_OMIT_ZERO, struct msg_embed, tokens, n_tokens, MSG_EMBED_INPUTS_MAX,
	   MSG_TOKEN_MAX),
	FH("pooling", FK_STR, FF_UTF8 | FF_NONEMPTY, struct msg_embed, pooling, has_pooling, 0, MSG_POOLING_MAX),
};

static const struct field embeddings_fields[] = {
	F("n_embd", FK_U32, FF_REQUIRED, struct msg_embeddings, n_embd, 0, U32MAX),
	F("data", FK_BIN, FF_REQUIRED, struct msg_embeddings, data, 0, MSG_STR_MAX),
	FA("n_tokens", FK_U32S, FF_REQUIRED, struct msg_embeddings, n_tokens, n_inputs, MSG_EMBED_INPUTS_MAX,
	   U32MAX),
	F("pooling", FK_STR, 0, struct msg_embeddings, pooling, 0, MSG_POOLING_MAX),
	F("n_cached", FK_U32, FF_OMIT_ZERO, struct msg_embeddings, n_cached, 0, U32MAX),
	F("queue_ms", FK_F64, 0, struct msg_embeddings, queue_ms, 0, 1e15),
	F("compute_ms", FK_F64, 0, struct msg_embeddings, compute_ms, 0, 1e15),
};

static const struct field cancel_fields[] = {
	F("target", FK_U64, FF_REQUIRED | FF_MIN_OPEN, struct msg_cancel, target, 0, MSG_ID_MAX),
};

static const struct field tokenize_fields[] = {
	FH("text", FK_STR, FF_UTF8, struct msg_tokenize, text, has_text, 0, MSG_STR_MAX),
	FH("text_ref", FK_U64, 0, struct msg_tokenize, text_ref, has_text_ref, 0, U64MAX),
	F("add_bos", FK_BOOL, 0, struct msg_tokenize, add_bos, 0, 0),
	F("special", FK_BOOL, 0, struct msg_tokenize, special, 0, 0),
};

static const struct field detokenize_fields[] = {
	FA("tokens", FK_U32S, FF_REQUIRED, struct msg_detokenize, tokens, n_tokens,
	   MSG_ARRAY_MAX, MSG_TOKEN_MAX),
};

static const struct field draft_fields[] = {
	F("arch", FK_STR, 0, struct msg_draft_info, arch, 0, MSG_NAME_MAX),
	F("name", FK_STR, 0, struct msg_draft_info, name, 0, 256),
	F("quant", FK_STR, 0, struct msg_draft_info, quant, 0, MSG_NAME_MAX),
	F("n_params", FK_U64, 0, struct msg_draft_info, n_params, 0, U64MAX),
	F("n_ctx", FK_U32, 0, struct msg_draft_info, n_ctx, 0, U32MAX),
	F("n_layer", FK_U32, 0, struct msg_draft_info, n_layer, 0, U32MAX),
	F("n_embd", FK_U32, 0, struct msg_draft_info, n_embd, 0, U32MAX),
};

static const struct field_table draft_table = TABLE(draft_fields, struct msg_draft_info);

static const struct field model_fields[] = {
	F("arch", FK_STR, 0, struct msg_model_info, arch, 0, MSG_NAME_MAX),
	F("name", FK_STR, 0, struct msg_model_info, name, 0, 256),
	F("quant", FK_STR, 0, struct msg_model_info, quant, 0, MSG_NAME_MAX),
	F("n_params", FK_U64, 0, struct msg_model_info, n_params, 0, U64MAX),
	F("n_ctx", FK_U32, 0, struct msg_model_info, n_ctx, 0, U32MAX),
	F("n_ctx_train", FK_U32, 0, struct msg_model_info, n_ctx_train, 0, U32MAX),
	F("n_vocab", FK_U32, 0, struct msg_model_info, n_vocab, 0, U32MAX),
	F("n_layer", FK_U32, 0, struct msg_model_info, n_layer, 0, U32MAX),
	F("n_embd", FK_U32, 0, struct msg_model_info, n_embd, 0, U32MAX),
	F("chat_template", FK_STR, FF_OMIT_ZERO, struct msg_model_info, chat_template, 0, MSG_NAME_MAX),
	F("pooling", FK_STR, FF_OMIT_ZERO, struct msg_model_info, pooling, 0, MSG_POOLING_MAX),
	{ "draft", FK_MAP, 0, offsetof(struct msg_model_info, draft), FIELD_NO_OFF,
	  offsetof(struct msg_model_info, has_draft), 0, 0, 0, &draft_table },
};

static const struct field_table model_table = TABLE(model_fields, struct msg_model_info);

static const struct field welcome_fields[] = {
	F("proto", FK_U32, FF_REQUIRED, struct msg_welcome, proto_major, 0, U32MAX),
	F("proto_minor", FK_U32, 0, struct msg_welcome, proto_minor, 0, U32MAX),
	F("daemon", FK_STR, 0, struct msg_welcome, daemon, 0, MSG_NAME_MAX),
	FM("model", 0, struct msg_welcome, model, model_table),
	F("max_frame", FK_U32, 0, struct msg_welcome, max_frame, 0, U32MAX),
	F("ring", FK_BOOL, 0, struct msg_welcome, ring, 0, 0),
	F("ring_d2c", FK_U64, 0, struct msg_welcome, ring_d2c, 0, U64MAX),
	F("ring_c2d", FK_U64, 0, struct msg_welcome, ring_c2d, 0, U64MAX),
};

static const struct field loading_fields[] = {
	F("phase", FK_STR, 0, struct msg_loading, phase, 0, MSG_NAME_MAX),
	F("done", FK_U64, 0, struct msg_loading, done, 0, U64MAX),
	F("total", FK_U64, 0, struct msg_loading, total, 0, U64MAX),
};

static const struct field token_fields[] = {
	F("token", FK_U32, FF_REQUIRED, struct msg_token, token, 0, MSG_TOKEN_MAX),
	F("text", FK_STR, 0, struct msg_token, text, 0, MSG_STR_MAX),
	FH("logprob", FK_F32, 0, struct msg_token, logprob, has_logprob, -1e30, 0),
	FA("top", FK_TOP, FF_OMIT_ZERO, struct msg_token, top, n_top, MSG_TOP_MAX, 0),
};

static const struct field done_fields[] = {
	F("finish", FK_FINISH, FF_REQUIRED, struct msg_done, finish, 0, 0),
	F("n_prompt", FK_U32, 0, struct msg_done, n_prompt, 0, U32MAX),
	F("n_gen", FK_U32, 0, struct msg_done, n_gen, 0, U32MAX),
	F("queue_ms", FK_F64, 0, struct msg_done, queue_ms, 0, 1e15),
	F("prefill_ms", FK_F64, 0, struct msg_done, prefill_ms, 0, 1e15),
	F("decode_ms", FK_F64, 0, struct msg_done, decode_ms, 0, 1e15),
	F("prefill_tps", FK_F64, 0, struct msg_done, prefill_tps, 0, 1e15),
	F("decode_tps", FK_F64, 0, struct msg_done, decode_tps, 0, 1e15),
	F("n_cached", FK_U32, FF_OMIT_ZERO, struct msg_done, n_cached, 0, U32MAX),
	F("n_forced", FK_U32, FF_OMIT_ZERO, struct msg_done, n_forced, 0, U32MAX),
	{ "message", FK_MAP, 0, offsetof(struct msg_done, message), FIELD_NO_OFF, offsetof(struct msg_done, has_message),
	  0, 0, 0, &chat_reply_table },
};

static const struct field tokens_fields[] = {
	FA("tokens", FK_U32S, FF_REQUIRED, struct msg_tokens, tokens, n_tokens, MSG_ARRAY_MAX,
	   MSG_TOKEN_MAX),
};

static const struct field text_fields[] = {
	F("text", FK_STR, FF_REQUIRED, struct msg_text, text, 0, MSG_STR_MAX),
};

static const struct field stats_fields[] = {
	F("uptime_ms", FK_U64, 0, struct msg_stats_reply, uptime_ms, 0, U64MAX),
	F("clients", FK_U32, 0, struct msg_stats_reply, clients, 0, U32MAX),
	F("running", FK_U32, 0, struct msg_stats_reply, running, 0, U32MAX),
	F("queued", FK_U32, 0, struct msg_stats_reply, queued, 0, U32MAX),
	F("prompt_tokens", FK_U64, 0, struct msg_stats_reply, prompt_tokens, 0, U64MAX),
	F("gen_tokens", FK_U64, 0, struct msg_stats_reply, gen_tokens, 0, U64MAX),
	F("kv_used", FK_U64, 0, struct msg_stats_reply, kv_used, 0, U64MAX),
	F("kv_total", FK_U64, 0, struct msg_stats_reply, kv_total, 0, U64MAX),
	F("rss", FK_U64, 0, struct msg_stats_reply, rss, 0, U64MAX),
	F("prefix_lookup_tokens", FK_U64, 0, struct msg_stats_reply, prefix_lookup_tokens, 0, U64MAX),
	F("prefix_hit_tokens", FK_U64, 0, struct msg_stats_reply, prefix_hit_tokens, 0, U64MAX),
	F("phase", FK_STR, 0, struct msg_stats_reply, phase, 0, MSG_NAME_MAX),
	F("draft_tokens", FK_U64, FF_OMIT_ZERO, struct msg_stats_reply, draft_tokens, 0, U64MAX),
	F("draft_accepted", FK_U64, FF_OMIT_ZERO, struct msg_stats_reply, draft_accepted, 0, U64MAX),
	F("draft_model_tokens", FK_U64, FF_OMIT_ZERO, struct msg_stats_reply, draft_model_tokens, 0, U64MAX),
	F("draft_model_accepted", FK_U64, FF_OMIT_ZERO, struct msg_stats_reply, draft_model_accepted, 0, U64MAX),
	FH("draft_kv_used", FK_U64, 0, struct msg_stats_reply, draft_kv_used, has_draft_kv, 0, U64MAX),
	FH("draft_kv_total", FK_U64, 0, struct msg_stats_reply, draft_kv_total, has_draft_kv, 0, U64MAX),
};

static const struct field ledger_entry_fields[] = {
	F("name", FK_STR, FF_REQUIRED, struct msg_ledger_entry, name, 0, MSG_NAME_MAX),
	F("bytes", FK_U64, FF_REQUIRED, struct msg_ledger_entry, bytes, 0, U64MAX),
};

static const struct field_table ledger_entry_table =
	TABLE(ledger_entry_fields, struct msg_ledger_entry);

static const struct field ledger_fields[] = {
	FMA("entries", 0, struct msg_ledger_reply, entries, n_entries, MSG_LEDGER_MAX,
	    ledger_entry_table),
	F("total", FK_U64, 0, struct msg_ledger_reply, total, 0, U64MAX),
	F("peak", FK_U64, 0, struct msg_ledger_reply, peak, 0, U64MAX),
};

static const struct field error_fields[] = {
	F("code", FK_ERRCODE, FF_REQUIRED, struct msg_error, code, 0, 0),
	F("message", FK_STR, 0, struct msg_error, message, 0, MSG_MESSAGE_MAX),
	F("fatal", FK_BOOL, 0, struct msg_error, fatal, 0, 0),
};

#define T(from, tab, st) { from, TABLE(tab, st) }
#define T0(from) { from, { NULL, 0, 0 } }

const struct msg_type_desc msg_types[MSG_TYPE_COUNT] = {
	[MSG_HELLO] = T(MSG_FROM_CLIENT, hello_fields, struct msg_hello),
	[MSG_GENERATE] = T(MSG_FROM_CLIENT, generate_fields, struct msg_generate),
	[MSG_CANCEL] = T(MSG_FROM_CLIENT, cancel_fields, struct msg_cancel),
	[MSG_TOKENIZE] = T(MSG_FROM_CLIENT, tokenize_fields, struct msg_tokenize),
	[MSG_DETOKENIZE] = T(MSG_FROM_CLIENT, detokenize_fields, struct msg_detokenize),
	[MSG_STATS] = T0(MSG_FROM_CLIENT),
	[MSG_LEDGER] = T0(MSG_FROM_CLIENT),
	[MSG_PING] = T0(MSG_FROM_CLIENT),
	[MSG_CHAT] = T(MSG_FROM_CLIENT, chat_fields, struct msg_chat),
	[MSG_WELCOME] = T(MSG_FROM_DAEMON, welcome_fields, struct msg_welcome),
	[MSG_LOADING] = T(MSG_FROM_DAEMON, loading_fields, struct msg_loading),
	[MSG_TOKEN] = T(MSG_FROM_DAEMON, token_fields, struct msg_token),
	[MSG_DONE] = T(MSG_FROM_DAEMON, done_fields, struct msg_done),
	[MSG_TOKENS] = T(MSG_FROM_DAEMON, tokens_fields, struct msg_tokens),
	[MSG_TEXT] = T(MSG_FROM_DAEMON, text_fields, struct msg_text),
	[MSG_STATS_REPLY] = T(MSG_FROM_DAEMON, stats_fields, struct msg_stats_reply),
	[MSG_LEDGER_REPLY] = T(MSG_FROM_DAEMON, ledger_fields, struct msg_ledger_reply),
	[MSG_PONG] = T0(MSG_FROM_DAEMON),
	[MSG_ERROR] = T(MSG_FROM_DAEMON, error_fields, struct msg_error),
	[MSG_DELTA] = T(MSG_FROM_DAEMON, delta_fields, struct msg_delta),
	[MSG_EMBED] = T(MSG_FROM_CLIENT, embed_fields, struct msg_embed),
	[MSG_EMBEDDINGS] = T(MSG_FROM_DAEMON, embeddings_fields, struct msg_embeddings),
};
