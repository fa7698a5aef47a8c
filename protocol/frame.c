/* The incremental frame reader: accumulates socket bytes, hands out whole frames, and drops
 * the bytes of an oversized frame as they arrive instead of buffering them. */
#include "protocol/frame.h"

#include <stdlib.h>
#include <string.h>

int frame_reader_init(struct frame_reader *r, size_t max_payload, struct hearth_error *err)
{
	memset(r, 0, sizeof *r);
	if (max_payload == 0)
		max_payload = FRAME_MAX_DEFAULT;
	if (max_payload > FRAME_SKIP_LIMIT)
		return hearth_error_set(err, HEARTH_EINVAL,
					"frame: maximum payload %zu above the limit %u",
					max_payload, FRAME_SKIP_LIMIT);
	r->max_payload = max_payload;
	return 0;
}

void frame_reader_free(struct frame_reader *r)
{
	free(r->buf);
	memset(r, 0, sizeof *r);
}

void frame_reader_trim(struct frame_reader *r, size_t keep)
{
	if (r->len == 0 && r->cap > keep) {
		free(r->buf);
		r->buf = NULL;
		r->cap = 0;
		r->start = 0;
	}
}

static int frame_lost(struct frame_reader *r, struct hearth_error *err)
{
	r->broken = 1;
	return hearth_error_set(err, HEARTH_EPROTO, "frame: stream framing already lost");
}

int frame_reader_feed(struct frame_reader *r, const void *data, size_t n,
		      struct hearth_error *err)
{
	const uint8_t *p = data;
	if (r->broken)
		return frame_lost(r, err);
	if (r->skip > 0) {
		/* Only reached with nothing buffered: next() drains buffered bytes first. */
		size_t drop = r->skip < n ? (size_t)r->skip : n;
		r->skip -= drop;
		p += drop;
		n -= drop;
	}
	if (n == 0)
		return 0;
	if (r->start > 0) {
		memmove(r->buf, r->buf + r->start, r->len);
		r->start = 0;
	}
	if (n > r->cap - r->len) {
		size_t want;
		if (__builtin_add_overflow(r->len, n, &want))
			return hearth_error_set(err, HEARTH_ERANGE, "frame: %zu bytes fed at once", n);
		size_t cap = r->cap ? r->cap : 4096;
		while (cap < want)
			cap = cap > SIZE_MAX / 2 ? want : cap * 2;
		uint8_t *nb = realloc(r->buf, cap);
		if (!nb)
			return hearth_error_set(err, HEARTH_ENOMEM, "frame: cannot grow buffer to %zu bytes",
						cap);
		r->buf = nb;
		r->cap = cap;
	}
	memcpy(r->buf + r->len, p, n);
	r->len += n;
	return 0;
}

uint32_t frame_header_read(const uint8_t in[FRAME_HEADER_SIZE])
{
	return (uint32_t)in[0] << 24 | (uint32_t)in[1] << 16 | (uint32_t)in[2] << 8 | in[3];
}

int frame_header_write(uint8_t out[FRAME_HEADER_SIZE], size_t len)
{
	if (len > UINT32_MAX)
		return HEARTH_ERANGE;
	out[0] = (uint8_t)(len >> 24);
	out[1] = (uint8_t)(len >> 16);
	out[2] = (uint8_t)(len >> 8);
	out[3] = (uint8_t)len;
	return 0;
}

int frame_reader_next(struct frame_reader *r, const uint8_t **payload, size_t *len,
		      struct hearth_error *err)
{
	*payload = NULL;
	*len = 0;
	if (r->broken)
		return frame_lost(r, err);
	if (r->skip > 0) {
		size_t drop = r->skip < r->len ? (size_t)r->skip : r->len;
		r->skip -= drop;
		r->start += drop;
		r->len -= drop;
		if (r->skip > 0)
			return FRAME_NEED_MORE;
	}
	if (r->len < FRAME_HEADER_SIZE)
		return FRAME_NEED_MORE;
	uint32_t n = frame_header_read(r->buf + r->start);
	if (n > FRAME_SKIP_LIMIT) {
		r->broken = 1;
		return hearth_error_set(err, HEARTH_EPROTO,
					"frame: declared length %u is beyond any frame (limit %u): "
					"framing lost", n, FRAME_SKIP_LIMIT);
	}
	if (n > r->max_payload) {
		r->start += FRAME_HEADER_SIZE;
		r->len -= FRAME_HEADER_SIZE;
		r->skip = n;
		size_t drop = r->skip < r->len ? (size_t)r->skip : r->len;
		r->skip -= drop;
		r->start += drop;
		r->len -= drop;
		hearth_error_set(err, HEARTH_ERANGE, "frame: length %u above the maximum %zu",
				 n, r->max_payload);
		return FRAME_OVERSIZED;
	}
	if (r->len - FRAME_HEADER_SIZE < n)
		return FRAME_NEED_MORE;
	*payload = r->buf + r->start + FRAME_HEADER_SIZE;
	*len = n;
	r->start += FRAME_HEADER_SIZE + (size_t)n;
	r->len -= FRAME_HEADER_SIZE + (size_t)n;
	if (r->len == 0)
		r->start = 0;
	return FRAME_READY;
}
