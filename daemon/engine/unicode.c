/* Code point flags by binary search over the generated ranges, llama.cpp-compatible UTF-8
 * decoding, and the GPT-2 byte <-> code point mapping. Stateless: every table is const. */
#include "daemon/engine/unicode.h"

uint16_t unicode_flags(uint32_t cpt)
{
	if (cpt >= UNICODE_MAX_CPT)
		return UNICODE_UNDEFINED;
	/* largest i with start_i <= cpt; entry 0 starts at 0 */
	size_t lo = 0, hi = unicode_n_ranges;
	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;
		if (unicode_ranges[mid].start <= cpt)
			lo = mid;
		else
			hi = mid;
	}
	return unicode_ranges[lo].flags;
}

size_t unicode_len_utf8(unsigned char lead)
{
	static const unsigned char len[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4 };
	return len[lead >> 4];
}

static int is_cont(const char *s, size_t len, size_t i)
{
	return i < len && ((unsigned char)s[i] & 0xC0) == 0x80;
}

uint32_t unicode_decode_utf8(const char *s, size_t len, size_t *pos)
{
	size_t i = *pos;
	unsigned char c = (unsigned char)s[i];
	uint32_t cpt;

	if (c < 0x80) {
		*pos = i + 1;
		return c;
	}
	if ((c & 0xE0) == 0xC0 && is_cont(s, len, i + 1)) {
		cpt = ((uint32_t)(c & 0x1F) << 6) | ((unsigned char)s[i + 1] & 0x3F);
		*pos = i + 2;
		return cpt;
	}
	if ((c & 0xF0) == 0xE0 && is_cont(s, len, i + 1) && is_cont(s, len, i + 2)) {
		cpt = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)((unsigned char)s[i + 1] & 0x3F) << 6) |
		      ((unsigned char)s[i + 2] & 0x3F);
		*pos = i + 3;
		return cpt;
	}
	if ((c & 0xF8) == 0xF0 && is_cont(s, len, i + 1) && is_cont(s, len, i + 2) &&
	    is_cont(s, len, i + 3)) {
		cpt = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)((unsigned char)s[i + 1] & 0x3F) << 12) |
		      ((uint32_t)((unsigned char)s[i + 2] & 0x3F) << 6) | ((unsigned char)s[i + 3] & 0x3F);
		*pos = i + 4;
		/* llama.cpp would throw re-encoding these; one replacement is the sane reading */
		return cpt < UNICODE_MAX_CPT ? cpt : UNICODE_REPLACEMENT;
	}
	*pos = i + 1;
	return UNICODE_REPLACEMENT;
}

size_t unicode_encode_utf8(uint32_t cpt, char out[4])
{
	if (cpt < 0x80) {
		out[0] = (char)cpt;
		return 1;
	}
	if (cpt < 0x800) {
		out[0] = (char)(0xC0 | (cpt >> 6));
		out[1] = (char)(0x80 | (cpt & 0x3F));
		return 2;
	}
	if (cpt >= UNICODE_MAX_CPT)
		cpt = UNICODE_REPLACEMENT;
	if (cpt < 0x10000) {
		out[0] = (char)(0xE0 | (cpt >> 12));
		out[1] = (char)(0x80 | ((cpt >> 6) & 0x3F));
		out[2] = (char)(0x80 | (cpt & 0x3F));
		return 3;
	}
	out[0] = (char)(0xF0 | (cpt >> 18));
	out[1] = (char)(0x80 | ((cpt >> 12) & 0x3F));
	out[2] = (char)(0x80 | ((cpt >> 6) & 0x3F));
	out[3] = (char)(0x80 | (cpt & 0x3F));
	return 4;
}

/* GPT-2 keeps the printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) as themselves and
 * numbers the other 68 bytes, in byte order, from U+0100. */
static int byte_is_printable(unsigned b)
{
	return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* the 68 others are 0x00..0x20 (33), 0x7F..0xA0 (34) and 0xAD */
uint32_t unicode_byte_to_cpt(uint8_t byte)
{
	if (byte_is_printable(byte))
		return byte;
	if (byte <= 0x20)
		return 0x100u + byte;
	if (byte >= 0x7F && byte <= 0xA0)
		return 0x100u + 33 + (byte - 0x7Fu);
	return 0x100u + 67; /* 0xAD */
}

int unicode_cpt_to_byte(uint32_t cpt)
{
	if (cpt < 0x100)
		return byte_is_printable(cpt) ? (int)cpt : -1;
	uint32_t n = cpt - 0x100;
	if (n < 33)
		return (int)n;
	if (n < 67)
		return (int)(0x7F + n - 33);
	return n == 67 ? 0xAD : -1;
}
