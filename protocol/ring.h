/* The shared-memory ring between the daemon and one client: one sealed memfd holding two
 * single-producer/single-consumer byte rings (daemon->client: token events and logits rows;
 * client->daemon: bulk payloads referenced from frames) and two eventfd doorbells. Each side
 * keeps its own index privately and treats every byte the peer can write as hostile: peer
 * indices are validated on every read, record headers are read once, payloads are copied
 * out before they are parsed. Layout diagram: doc/protocol.md "Ring". */
#ifndef HEARTH_PROTOCOL_RING_H
#define HEARTH_PROTOCOL_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/error.h"

#define RING_MAGIC 0x474e5248u      /* "HRNG" little-endian */
#define RING_VERSION 1u
#define RING_HEADER_SIZE 4096u      /* control page before the two data areas */
#define RING_CAP_MIN 4096u          /* each direction: a power of two in [MIN, MAX] */
#define RING_CAP_MAX (1ull << 30)
#define RING_REC_HEADER 8u          /* u32 payload length, u32 type; native byte order */
#define RING_ALIGN 8u               /* every record starts 8-byte aligned */

/* Offsets in the control page. Each index has its own 128-byte block so the producer's
 * and consumer's writes never share a cache line (nor an adjacent-line prefetch pair). */
#define RING_OFF_D2C_HEAD 128u      /* written by the daemon */
#define RING_OFF_D2C_TAIL 256u      /* written by the client */
#define RING_OFF_C2D_HEAD 384u      /* written by the client */
#define RING_OFF_C2D_TAIL 512u      /* written by the daemon */

enum ring_rec_type {
	RING_REC_PAD = 0,           /* fills the end of the area; skipped by ring_pop/peek */
	RING_REC_TOKEN = 1,         /* daemon->client: struct ring_token */
	RING_REC_LOGITS = 2,        /* daemon->client: struct ring_logits */
	RING_REC_BULK_TEXT = 16,    /* client->daemon: u64 ref + UTF-8 bytes */
	RING_REC_BULK_TOKENS = 17,  /* client->daemon: u64 ref + u32 token ids */
};

enum ring_side {
	RING_SIDE_DAEMON,           /* produces d2c, consumes c2d */
	RING_SIDE_CLIENT,           /* produces c2d, consumes d2c */
};

/* One direction as one side sees it. pos is this side's own index (head when producing,
 * tail when consuming), kept here and only ever written to shared memory, never read back
 * from it. peer is the last validated value of the other side's index. */
struct ring_lane {
	uint8_t *data;
	uint64_t cap;
	uint64_t *head;             /* in shared memory */
	uint64_t *tail;             /* in shared memory */
	uint64_t pos;
	uint64_t peer;
	uint64_t pending;           /* producer: bytes reserved but not committed */
	uint64_t peeked;            /* consumer: bytes of the record ring_peek returned */
};

struct ring {
	enum ring_side side;
	int memfd;
	int efd_client;             /* the client waits on it; the daemon rings it */
	int efd_daemon;             /* the daemon waits on it; the client rings it */
	void *map;
	size_t map_size;
	struct ring_lane tx;        /* the direction this side produces */
	struct ring_lane rx;        /* the direction this side consumes */
	bool broken;                /* the peer broke the rules: every call fails */
};

/* Threads: all tx calls (push/reserve/commit) from one thread and all rx calls (pop/peek/
 * consume) from one thread, which may be another; notify and the doorbell from any. */

/* Daemon side: memfd_create, size, seal against shrinking/growing/re-sealing, map, and make
 * both eventfds (non-blocking, close-on-exec). Capacities are rounded up to a power of two
 * within [RING_CAP_MIN, RING_CAP_MAX]. */
int ring_create(struct ring *r, size_t d2c_cap, size_t c2d_cap, struct hearth_error *err);

/* Client side: checks the memfd's seals and size and the control page, then maps it. Takes
 * ownership of the three fds, also on failure (they are closed then). */
int ring_attach(struct ring *r, int memfd, int efd_client, int efd_daemon,
		struct hearth_error *err);

/* Unmaps and closes all fds. Safe on a zeroed ring and twice. */
void ring_close(struct ring *r);

/* The three fds to pass with SCM_RIGHTS, in the order ring_attach takes them. */
void ring_fds(const struct ring *r, int fds[3]);

/* Largest payload ring_push accepts on this side's tx lane. */
size_t ring_max_payload(const struct ring *r);

/* Appends one record to tx and publishes it. Returns 0; HEARTH_EBUSY when there is no room
 * now (backpressure: retry once the peer rings this side's doorbell); HEARTH_ERANGE when
 * the payload can never fit; HEARTH_EPROTO when the peer's index is impossible (the ring is
 * then broken). Does not ring the doorbell: call ring_notify after a batch. */
int ring_push(struct ring *r, uint32_t type, const void *payload, size_t len,
	      struct hearth_error *err);

/* Takes the next record from rx, copying its payload into buf (cap bytes) before anything
 * looks at it. Returns 1 with *type and *len set; 0 when empty; HEARTH_ERANGE when the
 * record is larger than cap (nothing consumed; ring_max_payload of the peer's lane, i.e.
 * rx.cap - RING_REC_HEADER, always suffices); HEARTH_EPROTO when the peer broke the ring.
 * Use this on the daemon side: every client byte is copied once, then validated. */
int ring_pop(struct ring *r, uint32_t *type, void *buf, size_t cap, size_t *len,
	     struct hearth_error *err);

/* Zero-copy read for a side that trusts the mapping's contents enough to parse in place
 * (the client reading logits rows). Returns 1 with a pointer into shared memory whose
 * bounds were validated, 0 when empty, negative on a broken ring. The record stays until
 * ring_consume. A hostile peer can still change the bytes under the pointer: copy first if
 * the content matters for memory safety. */
int ring_peek(struct ring *r, uint32_t *type, const void **payload, size_t *len,
	      struct hearth_error *err);
void ring_consume(struct ring *r);

/* Doorbells. ring_notify wakes the peer (data pushed or space freed); ring_wait_fd is the
 * eventfd this side polls; ring_doorbell_clear reads it to zero after a wake-up. Protocol:
 * a producer notifies after pushing a batch; a consumer notifies after popping a batch, so
 * a producer that got HEARTH_EBUSY is woken when space frees up. */
int ring_notify(struct ring *r, struct hearth_error *err);
int ring_wait_fd(const struct ring *r);
int ring_doorbell_clear(struct ring *r, struct hearth_error *err);

/* Bytes queued in rx (validated), or in tx not yet consumed by the peer. */
uint64_t ring_rx_pending(struct ring *r);
uint64_t ring_tx_used(struct ring *r);

/* ---- records ---- */

#define RING_TOKEN_TEXT_MAX 1024u
#define RING_TOKEN_TOP_MAX 64u
#define RING_LOGITS_MAX (1u << 22)  /* vocabulary entries in one logits row */

struct ring_top {
	uint32_t token;
	float logprob;
};

/* RING_REC_TOKEN payload (native byte order):
 *   0 u64 request_id | 8 u32 token | 12 u32 flags (bit 0: has logprob) | 16 f32 logprob
 *   20 u16 text_len | 22 u16 n_top | 24 u64 t_sampled_ns | 32 text bytes | pad to 4
 *   | n_top x {u32 token, f32 lp} */
struct ring_token {
	uint64_t request_id;
	uint32_t token;
	bool has_logprob;
	float logprob;
	/* CLOCK_MONOTONIC when the daemon sampled the token (0: unknown). Both ends share the
	 * host's clock, so a client can measure the token's trip through the ring. */
	uint64_t t_sampled_ns;
	const uint8_t *text;        /* raw bytes; may split a UTF-8 sequence */
	size_t text_len;
	const struct ring_top *top; /* decode: points into the (copied) payload */
	size_t n_top;
};

/* RING_REC_LOGITS payload: 0 u64 request_id | 8 u32 index | 12 u32 n_vocab | 16 f32[n_vocab] */
struct ring_logits {
	uint64_t request_id;
	uint32_t index;             /* step within the request, from 0 */
	uint32_t n_vocab;
	const float *logits;
};

size_t ring_token_size(const struct ring_token *t);
int ring_push_token(struct ring *r, const struct ring_token *t, struct hearth_error *err);
int ring_token_decode(const void *payload, size_t len, struct ring_token *out,
		      struct hearth_error *err);

/* Writes the row straight into the ring (no staging copy). */
int ring_push_logits(struct ring *r, uint64_t request_id, uint32_t index, const float *row,
		     uint32_t n_vocab, struct hearth_error *err);
int ring_logits_decode(const void *payload, size_t len, struct ring_logits *out,
		       struct hearth_error *err);

/* Bulk payloads (client->daemon). ref is the number a frame names in prompt_ref/text_ref.
 * Token payloads are u32 ids, so their byte length is a multiple of 4. */
int ring_push_bulk(struct ring *r, uint32_t type, uint64_t ref, const void *data, size_t len,
		   struct hearth_error *err);
int ring_bulk_decode(uint32_t type, const void *payload, size_t len, uint64_t *ref,
		     const void **data, size_t *data_len, struct hearth_error *err);

#endif
