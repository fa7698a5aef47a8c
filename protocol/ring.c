/* The shared-memory ring: creation and sealing (daemon), verified attach (client), and
 * the SPSC push/pop with acquire/release indices. Every index the peer writes is checked
 * against the values this side keeps privately before it is used for any address. */
#include "protocol/ring.h"
#include "protocol/assert.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "protocol/msg.h"

#define RING_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

/* The first bytes of the control page, written once by the daemon at creation. The daemon
 * never reads them back; the client validates them at attach. */
struct ring_geometry {
	uint32_t magic;
	uint32_t version;
	uint32_t header_size;
	uint32_t flags;
	uint64_t d2c_offset;
	uint64_t d2c_cap;
	uint64_t c2d_offset;
	uint64_t c2d_cap;
};

_Static_assert(sizeof(struct ring_geometry) <= RING_OFF_D2C_HEAD, "geometry overlaps indices");
_Static_assert(RING_OFF_C2D_TAIL + 8 <= RING_HEADER_SIZE, "indices outside the control page");

static bool is_pow2(uint64_t x)
{
	return x && !(x & (x - 1));
}

static uint64_t align8(uint64_t x)
{
	return (x + RING_ALIGN - 1) & ~(uint64_t)(RING_ALIGN - 1);
}

static int round_cap(size_t want, uint64_t *out, const char *which, struct hearth_error *err)
{
	if (want > RING_CAP_MAX)
		return hearth_error_set(err, HEARTH_ERANGE, "ring: %s capacity %zu above %llu",
					which, want, (unsigned long long)RING_CAP_MAX);
	uint64_t c = RING_CAP_MIN;
	while (c < want)
		c <<= 1;
	*out = c;
	return 0;
}

static void lanes_setup(struct ring *r, uint64_t d2c_cap, uint64_t c2d_cap)
{
	uint8_t *base = r->map;
	struct ring_lane d2c = {
		.data = base + RING_HEADER_SIZE, .cap = d2c_cap,
		.head = (uint64_t *)(base + RING_OFF_D2C_HEAD),
		.tail = (uint64_t *)(base + RING_OFF_D2C_TAIL),
	};
	struct ring_lane c2d = {
		.data = base + RING_HEADER_SIZE + d2c_cap, .cap = c2d_cap,
		.head = (uint64_t *)(base + RING_OFF_C2D_HEAD),
		.tail = (uint64_t *)(base + RING_OFF_C2D_TAIL),
	};
	r->tx = r->side == RING_SIDE_DAEMON ? d2c : c2d;
	r->rx = r->side == RING_SIDE_DAEMON ? c2d : d2c;
}

static void ring_reset(struct ring *r)
{
	memset(r, 0, sizeof *r);
	r->memfd = r->efd_client = r->efd_daemon = -1;
}

int ring_create(struct ring *r, size_t d2c_cap, size_t c2d_cap, struct hearth_error *err)
{
	ring_reset(r);
	r->side = RING_SIDE_DAEMON;
	uint64_t d2c = 0, c2d = 0;
	int rc;
	if ((rc = round_cap(d2c_cap, &d2c, "daemon->client", err)) ||
	    (rc = round_cap(c2d_cap, &c2d, "client->daemon", err)))
		return rc;
	size_t size = RING_HEADER_SIZE + d2c + c2d;

	r->memfd = memfd_create("hearth-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (r->memfd < 0) {
		rc = hearth_error_errno(err, HEARTH_EIO, errno, "ring: memfd_create");
		goto fail;
	}
	if (ftruncate(r->memfd, (off_t)size) < 0) {
		rc = hearth_error_errno(err, HEARTH_EIO, errno, "ring: ftruncate to %zu", size);
		goto fail;
	}
	/* With the size sealed, no client can truncate the file under the daemon's mapping and
	 * turn a daemon store into SIGBUS. F_SEAL_SEAL keeps it that way. */
	if (fcntl(r->memfd, F_ADD_SEALS, RING_SEALS) < 0) {
		rc = hearth_error_errno(err, HEARTH_EIO, errno, "ring: sealing the memfd");
		goto fail;
	}
	r->map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, r->memfd, 0);
	if (r->map == MAP_FAILED) {
		r->map = NULL;
		rc = hearth_error_errno(err, HEARTH_EIO, errno, "ring: mmap of %zu bytes", size);
		goto fail;
	}
	r->map_size = size;
	struct ring_geometry g = {
		.magic = RING_MAGIC, .version = RING_VERSION, .header_size = RING_HEADER_SIZE,
		.d2c_offset = RING_HEADER_SIZE, .d2c_cap = d2c,
		.c2d_offset = RING_HEADER_SIZE + d2c, .c2d_cap = c2d,
	};
	memcpy(r->map, &g, sizeof g);

	r->efd_client = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	r->efd_daemon = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (r->efd_client < 0 || r->efd_daemon < 0) {
		rc = hearth_error_errno(err, HEARTH_EIO, errno, "ring: eventfd");
		goto fail;
	}
	lanes_setup(r, d2c, c2d);
	return 0;
fail:
	ring_close(r);
	return rc;
}

int ring_attach(struct ring *r, int memfd, int efd_client, int efd_daemon,
		struct hearth_error *err)
{
	ring_reset(r);
	r->side = RING_SIDE_CLIENT;
	r->memfd = memfd;
	r->efd_client = efd_client;
	r->efd_daemon = efd_daemon;
	int rc;
	struct stat st;
	if (memfd < 0 || efd_client < 0 || efd_daemon < 0) {
		rc = hearth_error_set(err, HEARTH_EINVAL, "ring: attach needs three fds");
		goto fail;
	}
	if (fstat(memfd, &st) < 0) {
		rc = hearth_error_errno(err, HEARTH_EIO, errno, "ring: fstat");
		goto fail;
	}
	int seals = fcntl(memfd, F_GET_SEALS);
	if (seals < 0 || (seals & RING_SEALS) != RING_SEALS) {
		rc = hearth_error_set(err, HEARTH_EPROTO,
				      "ring: the memfd is not sealed against resizing (seals 0x%x)",
				      seals);
		goto fail;
	}
	if (st.st_size < (off_t)RING_HEADER_SIZE + 2 * (off_t)RING_CAP_MIN ||
	    (uint64_t)st.st_size > RING_HEADER_SIZE + 2 * RING_CAP_MAX) {
		rc = hearth_error_set(err, HEARTH_EPROTO, "ring: memfd size %lld out of range",
				      (long long)st.st_size);
		goto fail;
	}
	size_t size = (size_t)st.st_size;
	r->map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (r->map == MAP_FAILED) {
		r->map = NULL;
		rc = hearth_error_errno(err, HEARTH_EIO, errno, "ring: mmap of %zu bytes", size);
		goto fail;
	}
	r->map_size = size;
	struct ring_geometry g;
	memcpy(&g, r->map, sizeof g);
	if (g.magic != RING_MAGIC || g.version != RING_VERSION ||
	    g.header_size != RING_HEADER_SIZE) {
		rc = hearth_error_set(err, HEARTH_EPROTO,
				      "ring: control page magic 0x%08x version %u header %u "
				      "(expected 0x%08x, %u, %u)", g.magic, g.version, g.header_size,
				      RING_MAGIC, RING_VERSION, RING_HEADER_SIZE);
		goto fail;
	}
	if (!is_pow2(g.d2c_cap) || g.d2c_cap < RING_CAP_MIN || g.d2c_cap > RING_CAP_MAX ||
	    !is_pow2(g.c2d_cap) || g.c2d_cap < RING_CAP_MIN || g.c2d_cap > RING_CAP_MAX ||
	    g.d2c_offset != RING_HEADER_SIZE || g.c2d_offset != RING_HEADER_SIZE + g.d2c_cap ||
	    RING_HEADER_SIZE + g.d2c_cap + g.c2d_cap != size) {
		rc = hearth_error_set(err, HEARTH_EPROTO,
				      "ring: geometry d2c %llu@%llu c2d %llu@%llu does not match "
				      "a %zu-byte memfd",
				      (unsigned long long)g.d2c_cap, (unsigned long long)g.d2c_offset,
				      (unsigned long long)g.c2d_cap, (unsigned long long)g.c2d_offset,
				      size);
		goto fail;
	}
	lanes_setup(r, g.d2c_cap, g.c2d_cap);
	/* Attach happens before any record is exchanged; start from the published indices so
	 * a later attach (a reconnecting helper) still lines up. */
	r->rx.pos = r->rx.peer = __atomic_load_n(r->rx.tail, __ATOMIC_ACQUIRE);
	r->tx.pos = r->tx.peer = __atomic_load_n(r->tx.head, __ATOMIC_ACQUIRE);
	uint64_t peer_tail = __atomic_load_n(r->tx.tail, __ATOMIC_ACQUIRE);
	if (peer_tail > r->tx.pos || r->tx.pos - peer_tail > r->tx.cap || peer_tail % RING_ALIGN) {
		rc = hearth_error_set(err, HEARTH_EPROTO, "ring: indices inconsistent at attach");
		goto fail;
	}
	r->tx.peer = peer_tail;
	return 0;
fail:
	ring_close(r);
	return rc;
}

void ring_close(struct ring *r)
{
	if (r->map)
		munmap(r->map, r->map_size);
	if (r->memfd >= 0)
		close(r->memfd);
	if (r->efd_client >= 0)
		close(r->efd_client);
	if (r->efd_daemon >= 0)
		close(r->efd_daemon);
	ring_reset(r);
}

void ring_fds(const struct ring *r, int fds[3])
{
	fds[0] = r->memfd;
	fds[1] = r->efd_client;
	fds[2] = r->efd_daemon;
}

size_t ring_max_payload(const struct ring *r)
{
	return r->tx.cap ? (size_t)(r->tx.cap - RING_REC_HEADER) : 0;
}

/* tx and rx may be driven from two threads (compute pushes, loop pops); the flag is the
 * only state they share. */
static bool ring_is_broken(const struct ring *r)
{
	return __atomic_load_n(&r->broken, __ATOMIC_RELAXED);
}

static int ring_fail(struct ring *r, struct hearth_error *err, const char *what,
		     unsigned long long a, unsigned long long b)
{
	__atomic_store_n(&r->broken, true, __ATOMIC_RELAXED);
	return hearth_error_set(err, HEARTH_EPROTO, "ring: peer broke the %s ring: %s (%llu, %llu)",
				r->side == RING_SIDE_DAEMON ? "client's" : "daemon's", what, a, b);
}

static int broken(struct ring *r, struct hearth_error *err)
{
	return hearth_error_set(err, HEARTH_EPROTO, "ring: already broken by the peer");
}

/* The consumer's tail may only move forward and never past what was produced. */
static int tx_refresh(struct ring *r, struct hearth_error *err)
{
	struct ring_lane *l = &r->tx;
	uint64_t tail = __atomic_load_n(l->tail, __ATOMIC_ACQUIRE);
	if (tail < l->peer || tail > l->pos || tail % RING_ALIGN)
		return ring_fail(r, err, "consumer index moved backwards, past the producer or "
				 "off a record boundary", tail, l->pos);
	l->peer = tail;
	return 0;
}

static void put_header(uint8_t *at, uint32_t len, uint32_t type)
{
	memcpy(at, &len, 4);
	memcpy(at + 4, &type, 4);
}

/* Reserves len bytes of payload (returned in *payload, 8-byte aligned) for one record, so
 * the pushers below write in place; ring_commit publishes it. One reservation at a time,
 * committed by the same caller before it returns. Same returns as ring_push. */
static int ring_reserve(struct ring *r, uint32_t type, size_t len, void **payload,
			struct hearth_error *err)
{
	*payload = NULL;
	if (ring_is_broken(r))
		return broken(r, err);
	struct ring_lane *l = &r->tx;
	if (!l->data)
		return hearth_error_set(err, HEARTH_EINVAL, "ring: not created or attached");
	if (l->pending)
		return hearth_error_set(err, HEARTH_EINVAL, "ring: a reservation is already open");
	if (type == RING_REC_PAD)
		return hearth_error_set(err, HEARTH_EINVAL, "ring: type 0 is reserved for padding");
	if (len > l->cap - RING_REC_HEADER)
		return hearth_error_set(err, HEARTH_ERANGE, "ring: record of %zu bytes, ring holds %llu",
					len, (unsigned long long)(l->cap - RING_REC_HEADER));
	int rc = tx_refresh(r, err);
	if (rc)
		return rc;
	uint64_t need = RING_REC_HEADER + align8(len);
	uint64_t free_bytes = l->cap - (l->pos - l->peer);
	uint64_t off = l->pos & (l->cap - 1);
	uint64_t to_end = l->cap - off;
	if (need > to_end) {
		/* Records never wrap: fill the tail end with padding and start over at 0. The pad
		 * is published at once, so the next attempt finds offset 0 even if the record
		 * itself must wait. */
		if (free_bytes < to_end)
			return hearth_error_set(err, HEARTH_EBUSY, "ring: full");
		put_header(l->data + off, (uint32_t)(to_end - RING_REC_HEADER), RING_REC_PAD);
		l->pos += to_end;
		__atomic_store_n(l->head, l->pos, __ATOMIC_RELEASE);
		free_bytes -= to_end;
		off = 0;
	}
	if (need > free_bytes)
		return hearth_error_set(err, HEARTH_EBUSY, "ring: full");
	put_header(l->data + off, (uint32_t)len, type);
	l->pending = need;
	*payload = l->data + off + RING_REC_HEADER;
	return 0;
}

static void ring_commit(struct ring *r)
{
	struct ring_lane *l = &r->tx;
	if (!l->pending)
		return;
	l->pos += l->pending;
	l->pending = 0;
	/* ring_reserve granted no more than the free space, on a record boundary. */
	hearth_assert(l->pos - l->peer <= l->cap && l->pos % RING_ALIGN == 0);
	__atomic_store_n(l->head, l->pos, __ATOMIC_RELEASE);
}

int ring_push(struct ring *r, uint32_t type, const void *payload, size_t len,
	      struct hearth_error *err)
{
	void *dst;
	int rc = ring_reserve(r, type, len, &dst, err);
	if (rc)
		return rc;
	if (len)
		memcpy(dst, payload, len);
	ring_commit(r);
	return 0;
}

/* The producer's head may only move forward and never more than a ring ahead of us. */
static int rx_refresh(struct ring *r, struct hearth_error *err)
{
	struct ring_lane *l = &r->rx;
	uint64_t head = __atomic_load_n(l->head, __ATOMIC_ACQUIRE);
	if (head < l->peer || head - l->pos > l->cap || head % RING_ALIGN)
		return ring_fail(r, err, "producer index moved backwards, over the consumer or "
				 "off a record boundary", head, l->pos);
	l->peer = head;
	return 0;
}

/* Finds the next record, skipping padding. Each header word is loaded exactly once into a
 * local, so a peer rewriting it concurrently cannot make the checks and the use disagree. */
static int rx_next(struct ring *r, uint64_t *off_out, uint32_t *type_out, uint32_t *len_out,
		   struct hearth_error *err)
{
	struct ring_lane *l = &r->rx;
	if (ring_is_broken(r))
		return broken(r, err);
	if (!l->data)
		return hearth_error_set(err, HEARTH_EINVAL, "ring: not created or attached");
	int rc = rx_refresh(r, err);
	if (rc)
		return rc;
	for (;;) {
		uint64_t avail = l->peer - l->pos;
		if (avail == 0)
			return 0;
		uint64_t off = l->pos & (l->cap - 1);
		uint64_t to_end = l->cap - off;
		if (avail < RING_REC_HEADER)
			return ring_fail(r, err, "partial record header published", avail, off);
		uint32_t len = __atomic_load_n((uint32_t *)(l->data + off), __ATOMIC_RELAXED);
		uint32_t type = __atomic_load_n((uint32_t *)(l->data + off + 4), __ATOMIC_RELAXED);
		if (type == RING_REC_PAD) {
			if (len != to_end - RING_REC_HEADER || avail < to_end)
				return ring_fail(r, err, "padding record of a wrong length", len, to_end);
			l->pos += to_end;
			__atomic_store_n(l->tail, l->pos, __ATOMIC_RELEASE);
			continue;
		}
		if (len > to_end - RING_REC_HEADER || RING_REC_HEADER + align8(len) > avail)
			return ring_fail(r, err, "record longer than the published bytes", len, avail);
		*off_out = off;
		*type_out = type;
		*len_out = len;
		return 1;
	}
}

int ring_pop(struct ring *r, uint32_t *type, void *buf, size_t cap, size_t *len,
	     struct hearth_error *err)
{
	uint64_t off;
	uint32_t t, n;
	*len = 0;
	int rc = rx_next(r, &off, &t, &n, err);
	if (rc <= 0)
		return rc;
	if (n > cap)
		return hearth_error_set(err, HEARTH_ERANGE, "ring: record of %u bytes, buffer of %zu",
					n, cap);
	struct ring_lane *l = &r->rx;
	if (n)
		memcpy(buf, l->data + off + RING_REC_HEADER, n);
	/* Release the space only after the copy is complete. */
	l->pos += RING_REC_HEADER + align8(n);
	l->peeked = 0;
	__atomic_store_n(l->tail, l->pos, __ATOMIC_RELEASE);
	*type = t;
	*len = n;
	return 1;
}

int ring_peek(struct ring *r, uint32_t *type, const void **payload, size_t *len,
	      struct hearth_error *err)
{
	uint64_t off;
	uint32_t t, n;
	*payload = NULL;
	*len = 0;
	int rc = rx_next(r, &off, &t, &n, err);
	if (rc <= 0)
		return rc;
	r->rx.peeked = RING_REC_HEADER + align8(n);
	*type = t;
	*payload = r->rx.data + off + RING_REC_HEADER;
	*len = n;
	return 1;
}

void ring_consume(struct ring *r)
{
	struct ring_lane *l = &r->rx;
	if (!l->peeked)
		return;
	l->pos += l->peeked;
	l->peeked = 0;
	__atomic_store_n(l->tail, l->pos, __ATOMIC_RELEASE);
}

uint64_t ring_rx_pending(struct ring *r)
{
	if (ring_is_broken(r) || !r->rx.data || rx_refresh(r, NULL))
		return 0;
	return r->rx.peer - r->rx.pos;
}

uint64_t ring_tx_used(struct ring *r)
{
	if (ring_is_broken(r) || !r->tx.data || tx_refresh(r, NULL))
		return 0;
	return r->tx.pos - r->tx.peer;
}

int ring_notify(struct ring *r, struct hearth_error *err)
{
	int fd = r->side == RING_SIDE_DAEMON ? r->efd_client : r->efd_daemon;
	uint64_t one = 1;
	/* EAGAIN means the counter is saturated: the peer has a wake-up pending anyway. */
	if (write(fd, &one, sizeof one) < 0 && errno != EAGAIN)
		return hearth_error_errno(err, HEARTH_EIO, errno, "ring: doorbell write");
	return 0;
}

int ring_wait_fd(const struct ring *r)
{
	return r->side == RING_SIDE_DAEMON ? r->efd_daemon : r->efd_client;
}

int ring_doorbell_clear(struct ring *r, struct hearth_error *err)
{
	uint64_t v;
	if (read(ring_wait_fd(r), &v, sizeof v) < 0 && errno != EAGAIN)
		return hearth_error_errno(err, HEARTH_EIO, errno, "ring: doorbell read");
	return 0;
}

/* ---- records ---- */

#define TOKEN_FIXED 32u

size_t ring_token_size(const struct ring_token *t)
{
	return ((TOKEN_FIXED + t->text_len + 3) & ~(size_t)3) + t->n_top * sizeof(struct ring_top);
}

int ring_push_token(struct ring *r, const struct ring_token *t, struct hearth_error *err)
{
	if (t->text_len > RING_TOKEN_TEXT_MAX || t->n_top > RING_TOKEN_TOP_MAX)
		return hearth_error_set(err, HEARTH_ERANGE,
					"ring: token event with %zu text bytes, %zu top entries "
					"(limits %u, %u)", t->text_len, t->n_top, RING_TOKEN_TEXT_MAX,
					RING_TOKEN_TOP_MAX);
	size_t size = ring_token_size(t);
	uint8_t *p;
	int rc = ring_reserve(r, RING_REC_TOKEN, size, (void **)&p, err);
	if (rc)
		return rc;
	uint32_t flags = t->has_logprob ? 1u : 0u;
	float lp = t->has_logprob ? t->logprob : 0.0f;
	uint16_t tl = (uint16_t)t->text_len, nt = (uint16_t)t->n_top;
	memcpy(p, &t->request_id, 8);
	memcpy(p + 8, &t->token, 4);
	memcpy(p + 12, &flags, 4);
	memcpy(p + 16, &lp, 4);
	memcpy(p + 20, &tl, 2);
	memcpy(p + 22, &nt, 2);
	memcpy(p + 24, &t->t_sampled_ns, 8);
	if (t->text_len)
		memcpy(p + TOKEN_FIXED, t->text, t->text_len);
	size_t top_at = (TOKEN_FIXED + t->text_len + 3) & ~(size_t)3;
	memset(p + TOKEN_FIXED + t->text_len, 0, top_at - TOKEN_FIXED - t->text_len);
	if (t->n_top)
		memcpy(p + top_at, t->top, t->n_top * sizeof(struct ring_top));
	ring_commit(r);
	return 0;
}

int ring_token_decode(const void *payload, size_t len, struct ring_token *out,
		      struct hearth_error *err)
{
	const uint8_t *p = payload;
	memset(out, 0, sizeof *out);
	if ((uintptr_t)p % 4)
		return hearth_error_set(err, HEARTH_EINVAL, "ring: token payload not 4-byte aligned");
	if (len < TOKEN_FIXED)
		return hearth_error_set(err, HEARTH_EFORMAT, "ring: token record of %zu bytes", len);
	uint32_t flags;
	uint16_t tl, nt;
	memcpy(&out->request_id, p, 8);
	memcpy(&out->token, p + 8, 4);
	memcpy(&flags, p + 12, 4);
	memcpy(&out->logprob, p + 16, 4);
	memcpy(&tl, p + 20, 2);
	memcpy(&nt, p + 22, 2);
	memcpy(&out->t_sampled_ns, p + 24, 8);
	if (flags & ~1u)
		return hearth_error_set(err, HEARTH_EFORMAT, "ring: token flags 0x%x unknown", flags);
	if (tl > RING_TOKEN_TEXT_MAX || nt > RING_TOKEN_TOP_MAX)
		return hearth_error_set(err, HEARTH_EFORMAT,
					"ring: token with %u text bytes, %u top entries", tl, nt);
	out->has_logprob = flags & 1u;
	out->text_len = tl;
	out->n_top = nt;
	if (ring_token_size(out) != len)
		return hearth_error_set(err, HEARTH_EFORMAT,
					"ring: token record of %zu bytes, its fields need %zu",
					len, ring_token_size(out));
	out->text = p + TOKEN_FIXED;
	out->top = nt ? (const struct ring_top *)(p + ((TOKEN_FIXED + tl + 3) & ~(size_t)3))
		      : NULL;
	return 0;
}

int ring_push_logits(struct ring *r, uint64_t request_id, uint32_t index, const float *row,
		     uint32_t n_vocab, struct hearth_error *err)
{
	if (n_vocab > RING_LOGITS_MAX)
		return hearth_error_set(err, HEARTH_ERANGE, "ring: logits row of %u entries (limit %u)",
					n_vocab, RING_LOGITS_MAX);
	uint8_t *p;
	size_t size = 16 + (size_t)n_vocab * sizeof(float);
	int rc = ring_reserve(r, RING_REC_LOGITS, size, (void **)&p, err);
	if (rc)
		return rc;
	memcpy(p, &request_id, 8);
	memcpy(p + 8, &index, 4);
	memcpy(p + 12, &n_vocab, 4);
	memcpy(p + 16, row, (size_t)n_vocab * sizeof(float));
	ring_commit(r);
	return 0;
}

int ring_logits_decode(const void *payload, size_t len, struct ring_logits *out,
		       struct hearth_error *err)
{
	const uint8_t *p = payload;
	memset(out, 0, sizeof *out);
	if ((uintptr_t)p % 4)
		return hearth_error_set(err, HEARTH_EINVAL, "ring: logits payload not 4-byte aligned");
	if (len < 16)
		return hearth_error_set(err, HEARTH_EFORMAT, "ring: logits record of %zu bytes", len);
	memcpy(&out->request_id, p, 8);
	memcpy(&out->index, p + 8, 4);
	memcpy(&out->n_vocab, p + 12, 4);
	if (out->n_vocab > RING_LOGITS_MAX || 16 + (size_t)out->n_vocab * 4 != len)
		return hearth_error_set(err, HEARTH_EFORMAT,
					"ring: logits record of %zu bytes claims %u entries",
					len, out->n_vocab);
	out->logits = (const float *)(p + 16);
	return 0;
}

int ring_push_bulk(struct ring *r, uint32_t type, uint64_t ref, const void *data, size_t len,
		   struct hearth_error *err)
{
	if (type != RING_REC_BULK_TEXT && type != RING_REC_BULK_TOKENS)
		return hearth_error_set(err, HEARTH_EINVAL, "ring: %u is not a bulk record type", type);
	if (type == RING_REC_BULK_TOKENS && len % 4)
		return hearth_error_set(err, HEARTH_EINVAL, "ring: token payload of %zu bytes", len);
	if (len > SIZE_MAX - 8)
		return hearth_error_set(err, HEARTH_ERANGE, "ring: bulk payload too large");
	uint8_t *p;
	int rc = ring_reserve(r, type, 8 + len, (void **)&p, err);
	if (rc)
		return rc;
	memcpy(p, &ref, 8);
	if (len)
		memcpy(p + 8, data, len);
	ring_commit(r);
	return 0;
}

int ring_bulk_decode(uint32_t type, const void *payload, size_t len, uint64_t *ref,
		     const void **data, size_t *data_len, struct hearth_error *err)
{
	const uint8_t *p = payload;
	*data = NULL;
	*data_len = 0;
	if (type != RING_REC_BULK_TEXT && type != RING_REC_BULK_TOKENS)
		return hearth_error_set(err, HEARTH_EFORMAT, "ring: record type %u is not bulk data",
					type);
	if (len < 8)
		return hearth_error_set(err, HEARTH_EFORMAT, "ring: bulk record of %zu bytes", len);
	memcpy(ref, p, 8);
	size_t n = len - 8;
	if (type == RING_REC_BULK_TOKENS) {
		if (n % 4 || (uintptr_t)(p + 8) % 4)
			return hearth_error_set(err, HEARTH_EFORMAT,
						"ring: token payload of %zu bytes (not whole u32s)", n);
		const uint8_t *t = p + 8;
		for (size_t i = 0; i < n; i += 4) {
			uint32_t id;
			memcpy(&id, t + i, 4);
			if (id > MSG_TOKEN_MAX)
				return hearth_error_set(err, HEARTH_EFORMAT,
							"ring: token id %u at index %zu", id, i / 4);
		}
	} else if (!msg_utf8_valid(p + 8, n)) {
		return hearth_error_set(err, HEARTH_EFORMAT, "ring: bulk text is not valid UTF-8");
	}
	*data = p + 8;
	*data_len = n;
	return 0;
}
