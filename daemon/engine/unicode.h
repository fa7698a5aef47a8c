/* Unicode facts the tokenizer needs: per code point category flags (the \p{..} classes and
 * \s of the pre-tokenizer regexes), lenient UTF-8 decoding that matches llama.cpp's (so the
 * same bytes split the same way), and GPT-2's byte <-> code point mapping. */
#ifndef HEARTH_DAEMON_UNICODE_H
#define HEARTH_DAEMON_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* One category bit per code point (as llama.cpp's unicode_cpt_flags), plus WHITESPACE. */
enum {
	UNICODE_UNDEFINED = 0x0001,  /* unassigned (Cn) */
	UNICODE_NUMBER = 0x0002,     /* \p{N} */
	UNICODE_LETTER = 0x0004,     /* \p{L} */
	UNICODE_SEPARATOR = 0x0008,  /* \p{Z} */
	UNICODE_MARK = 0x0010,       /* \p{M} */
	UNICODE_PUNCT = 0x0020,      /* \p{P} */
	UNICODE_SYMBOL = 0x0040,     /* \p{S} */
	UNICODE_CONTROL = 0x0080,    /* \p{C} except Cn: Cc, Cf, Cs, Co */
	UNICODE_CATEGORY_MASK = 0x00FF,
	UNICODE_WHITESPACE = 0x0100, /* White_Space property: regex \s */
};

#define UNICODE_MAX_CPT 0x110000u
#define UNICODE_REPLACEMENT 0xFFFDu

/* The generated table (daemon/unicode_tables.c): range i covers [start_i, start_{i+1}). */
struct unicode_range {
	uint32_t start;
	uint16_t flags;
};
extern const struct unicode_range unicode_ranges[];
extern const size_t unicode_n_ranges;

/* Flags of cpt; UNICODE_UNDEFINED beyond U+10FFFF. */
uint16_t unicode_flags(uint32_t cpt);

/* Length of the UTF-8 sequence a lead byte announces, from its high nibble alone
 * (continuation bytes count as 1), as SentencePiece and llama.cpp split text. */
size_t unicode_len_utf8(unsigned char lead);

/* Decodes one code point at s[*pos] and advances *pos. Like llama.cpp, a lead byte whose
 * continuation bytes are missing or wrong yields U+FFFD and advances by one byte; overlong
 * forms and surrogates are decoded as written; values above U+10FFFF become U+FFFD. */
uint32_t unicode_decode_utf8(const char *s, size_t len, size_t *pos);

/* Writes cpt as UTF-8 (surrogates encoded as written) and returns 1-4 bytes; values above
 * U+10FFFF are written as U+FFFD. */
size_t unicode_encode_utf8(uint32_t cpt, char out[4]);

/* GPT-2 byte-level BPE maps every byte to a printable code point and back. */
uint32_t unicode_byte_to_cpt(uint8_t byte);
int unicode_cpt_to_byte(uint32_t cpt); /* -1 when cpt is not one of the 256 */

#endif
