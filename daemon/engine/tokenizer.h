/* Text <-> token ids from a GGUF's tokenizer metadata, matching llama.cpp: SentencePiece-style
 * (tokenizer.ggml.model "llama": score-ranked merges, <0xNN> byte fallback, leading space)
 * and GPT-2 byte-level BPE ("gpt2": merge ranks after a pre-tokenizer split chosen by
 * tokenizer.ggml.pre: default, gpt-2, llama-bpe (Llama 3), qwen2, deepseek-llm, and aliases). */
#ifndef HEARTH_DAEMON_TOKENIZER_H
#define HEARTH_DAEMON_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/engine/gguf.h"
#include "protocol/error.h"

#define TOK_NULL (-1)

/* Immutable after tok_load; every function below may be called from many threads at once. */
struct tok;

/* Copies everything it needs out of f (f may be closed afterwards). HEARTH_EUNSUPPORTED for
 * tokenizer models or pre-tokenizers it does not implement, HEARTH_EFORMAT for malformed
 * metadata (missing token list, wrong types, duplicate tokens). */
int tok_load(struct tok **out, const struct gguf_file *f, struct hearth_error *err);
void tok_free(struct tok *t);

/* Encodes len bytes of text (any bytes: invalid UTF-8 is read as U+FFFD the way llama.cpp
 * does). add_bos puts the BOS token first (pass tok_add_bos(t) for the model's default);
 * parse_special turns control-token text such as "<|im_end|>" into that token (user-defined
 * tokens are always matched, as in llama.cpp). Writes at most cap ids; when they do not fit
 * it returns HEARTH_ERANGE with the needed count in *n_out. */
int tok_encode(const struct tok *t, const char *text, size_t len, bool add_bos, bool parse_special,
	       int32_t *out, size_t cap, size_t *n_out, struct hearth_error *err);
/* tok_encode into a fresh array of the size it needs: *out is the caller's to free. */
int tok_encode_alloc(const struct tok *t, const char *text, size_t len, bool add_bos, bool parse_special,
		     int32_t **out, size_t *n_out, struct hearth_error *err);

/* Encodes consecutive pieces of one text, each with its own parse_special, as if they were
 * one input (one BOS, SentencePiece's leading space only at the start or after a special
 * token) except that no token spans two pieces: chat prompts use this so that message data
 * can never produce a control token, even joined with the template's text. */
struct tok_segment {
	const char *text;
	size_t len;
	bool parse_special;
};
int tok_encode_segments(const struct tok *t, const struct tok_segment *seg, size_t n_seg, bool add_bos,
			int32_t *out, size_t cap, size_t *n_out, struct hearth_error *err);

/* The bytes of one token: byte tokens and byte-level BPE decoded, SentencePiece's U+2581
 * turned back into spaces. Control and unknown tokens give their text only when special
 * is true (else nothing). Returns the length; copies only when it is <= cap. Ids out of
 * range give 0. A piece can be an incomplete UTF-8 sequence: use tok_stream for output. */
size_t tok_piece(const struct tok *t, int32_t id, bool special, char *buf, size_t cap);

/* The longest piece in bytes (for sizing buffers: the grammar's token trie). */
size_t tok_piece_max(const struct tok *t);

/* Concatenated pieces as llama_detokenize(remove_special=false, unparse_special=special)
 * gives them, including dropping one leading space of the first piece when the model adds
 * a space prefix (SentencePiece), so tok_decode(tok_encode(s)) == s for valid UTF-8 s. It
 * does not apply llama.cpp's lossy clean_spaces step. HEARTH_EINVAL for an id out of range,
 * HEARTH_ERANGE (needed size in *n_out) when cap is too small. */
int tok_decode(const struct tok *t, const int32_t *ids, size_t n, bool special, char *buf,
	       size_t cap, size_t *n_out, struct hearth_error *err);

/* Streaming decode for generated tokens: holds back a UTF-8 sequence split across tokens
 * until it completes and replaces invalid bytes with U+FFFD, so the concatenated output is
 * always valid UTF-8 (and equals tok_decode's bytes when those are valid and have no
 * stripped leading space). Caller-owned; one per sequence. */
struct tok_stream {
	unsigned char pend[4];
	uint8_t n_pend;
};

/* Bytes that one tok_stream_push (or flush) may produce at most. */
size_t tok_stream_bound(const struct tok *t);

void tok_stream_init(struct tok_stream *s);
/* Returns the bytes written; when cap is smaller than needed it writes nothing, leaves s as
 * it was and returns the needed size (> cap) so the caller can retry. */
size_t tok_stream_push(const struct tok *t, struct tok_stream *s, int32_t id, bool special,
		       char *out, size_t cap);
/* Emits U+FFFD for a sequence left incomplete at the end; same return rules as push. */
size_t tok_stream_flush(struct tok_stream *s, char *out, size_t cap);

int32_t tok_n_vocab(const struct tok *t);
int32_t tok_bos(const struct tok *t);  /* TOK_NULL when the model has none */
int32_t tok_eos(const struct tok *t);
int32_t tok_eot(const struct tok *t);
bool tok_add_bos(const struct tok *t); /* tokenizer.ggml.add_bos_token, or the model's default */
/* tokenizer.ggml.add_eos_token (false without an EOS token): llama.cpp appends EOS to what it
 * tokenizes with special tokens added, which an embedding model's last pooling relies on. */
bool tok_add_eos(const struct tok *t);
bool tok_is_eog(const struct tok *t, int32_t id); /* end of generation: EOS, EOT, EOM, ... */
bool tok_is_control(const struct tok *t, int32_t id);

#endif
