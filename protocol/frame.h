/* Socket framing shared by daemon and client: a 4-byte big-endian length, then that many
 * bytes of msgpack. The reader is incremental (bytes arrive in arbitrary pieces from the
 * event loop) and never buffers more than one frame of the configured maximum. */
#ifndef HEARTH_PROTOCOL_FRAME_H
#define HEARTH_PROTOCOL_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "protocol/error.h"

#define FRAME_HEADER_SIZE 4
/* Default largest payload (bytes after the length prefix). Bulk data goes through the ring. */
#define FRAME_MAX_DEFAULT (1u << 20)
/* A declared length above this is not an honest oversized request but a peer that lost or
 * never had framing (text typed into the socket, a desynchronised writer): give up. */
#define FRAME_SKIP_LIMIT (64u << 20)

/* frame_reader_next results (negative values are HEARTH_E* codes: framing is lost). */
enum {
	FRAME_NEED_MORE = 0, /* no complete frame buffered: feed more bytes */
	FRAME_READY = 1,     /* payload and len hold one frame, valid until the next call */
	FRAME_OVERSIZED = 2, /* a frame above the maximum was announced; its bytes are being
	                      * discarded as they arrive and the stream stays usable */
};

struct frame_reader {
	uint8_t *buf;        /* owned; holds at most one frame plus its header */
	size_t cap;
	size_t start;        /* first unconsumed byte */
	size_t len;          /* bytes buffered from start */
	size_t max_payload;
	uint64_t skip;       /* bytes of an oversized payload still to discard */
	int broken;          /* framing lost: every later call fails */
};

/* max_payload 0 means FRAME_MAX_DEFAULT; it must not exceed FRAME_SKIP_LIMIT. */
int frame_reader_init(struct frame_reader *r, size_t max_payload, struct hearth_error *err);
void frame_reader_free(struct frame_reader *r);

/* Takes n bytes from the socket. Bytes of an oversized payload are dropped here without
 * being stored. Returns 0, HEARTH_ENOMEM, or HEARTH_EPROTO once framing is lost. Feeding
 * invalidates a payload pointer returned earlier. */
int frame_reader_feed(struct frame_reader *r, const void *data, size_t n,
		      struct hearth_error *err);

/* Frees the buffer when it holds nothing and is larger than keep bytes, so one large frame
 * does not pin its memory for the rest of a connection. */
void frame_reader_trim(struct frame_reader *r, size_t keep);

/* Extracts the next complete frame. Call in a loop after each feed until it returns
 * FRAME_NEED_MORE. FRAME_OVERSIZED is returned once per oversized frame, at the moment its
 * header is seen (the reply is the error `too_large`; the connection survives). A negative
 * return (HEARTH_EPROTO) means framing is lost: send `bad_frame` and close. */
int frame_reader_next(struct frame_reader *r, const uint8_t **payload, size_t *len,
		      struct hearth_error *err);

/* Writes the 4-byte header for a payload of len bytes; HEARTH_ERANGE if len > UINT32_MAX. */
int frame_header_write(uint8_t out[FRAME_HEADER_SIZE], size_t len);
uint32_t frame_header_read(const uint8_t in[FRAME_HEADER_SIZE]);

#endif
