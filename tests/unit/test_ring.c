/* Tests of the shared-memory ring: sealing and attach checks, records across wrap-around,
 * backpressure, a real second process exchanging 100k checksummed records each way, fd
 * passing, and hostile indices and record headers written into the shared page, each of
 * which must be detected without a crash or an out-of-bounds access. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "protocol/fdpass.h"
#include "protocol/ring.h"

/* ---- helpers ---- */

/* A daemon ring and a client view of the same memfd, as after SCM_RIGHTS in one process. */
static void pair_create(struct ring *d, struct ring *c, size_t d2c, size_t c2d)
{
	struct hearth_error err;
	if (ring_create(d, d2c, c2d, &err))
		fail_msg("ring_create: %s", err.msg);
	int fds[3];
	ring_fds(d, fds);
	if (ring_attach(c, dup(fds[0]), dup(fds[1]), dup(fds[2]), &err))
		fail_msg("ring_attach: %s", err.msg);
}

static uint64_t xorshift(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

/* Record i of a stream: its length and bytes follow from (seed, i) alone, so the consumer
 * can check each one without seeing what the producer did. */
static size_t record_fill(uint64_t seed, uint64_t i, uint8_t *out, size_t max)
{
	uint64_t s = seed ^ (i * 0x9e3779b97f4a7c15ull) ^ 0x1234567ull;
	xorshift(&s);
	size_t n = (size_t)(xorshift(&s) % max);
	for (size_t k = 0; k < n; k++)
		out[k] = (uint8_t)(xorshift(&s) >> 24);
	if (n >= 8)
		memcpy(out, &i, 8);
	return n;
}

static uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

static int count_open_fds(void)
{
	int n = 0;
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return -1;
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

/* ---- sealing and attach ---- */

static void test_ring_create_seals_the_memfd_against_resizing(void **state)
{
	(void)state;
	struct ring d;
	struct hearth_error err;
	assert_int_equal(ring_create(&d, 5000, 0, &err), 0);
	assert_int_equal(d.tx.cap, 8192);          /* rounded up to a power of two */
	assert_int_equal(d.rx.cap, RING_CAP_MIN);
	int seals = fcntl(d.memfd, F_GET_SEALS);
	assert_int_equal(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
			 F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	/* what a hostile client would try */
	assert_int_equal(ftruncate(d.memfd, 4096), -1);
	assert_int_equal(errno, EPERM);
	assert_int_equal(ftruncate(d.memfd, 1 << 24), -1);
	assert_int_equal(fcntl(d.memfd, F_ADD_SEALS, F_SEAL_WRITE), -1);
	assert_int_equal(ring_create(&d, (size_t)RING_CAP_MAX + 1, 0, &err), HEARTH_ERANGE);
	ring_close(&d);
	ring_close(&d);  /* twice is harmless */
}

/* A memfd laid out like a ring, with seals and header chosen by the test. */
static int fake_memfd(unsigned seals, uint32_t magic, uint64_t d2c_cap, uint64_t size)
{
	int fd = memfd_create("fake-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	uint64_t hdr[6] = { (uint64_t)RING_VERSION << 32 | magic, RING_HEADER_SIZE,
			    RING_HEADER_SIZE, d2c_cap, RING_HEADER_SIZE + d2c_cap, RING_CAP_MIN };
	assert_int_equal(pwrite(fd, hdr, sizeof hdr, 0), (ssize_t)sizeof hdr);
	if (seals)
		assert_int_equal(fcntl(fd, F_ADD_SEALS, seals), 0);
	return fd;
}

static int attach_fake(int memfd, struct hearth_error *err)
{
	struct ring c;
	int before = count_open_fds();
	int rc = ring_attach(&c, memfd, eventfd(0, EFD_CLOEXEC), eventfd(0, EFD_CLOEXEC), err);
	if (rc == 0)
		ring_close(&c);
	/* attach owns the fds whatever happens: none may leak */
	assert_int_equal(count_open_fds(), before - 1);
	return rc;
}

static void test_ring_attach_refuses_unsealed_or_malformed_memfd(void **state)
{
	(void)state;
	struct hearth_error err;
	const unsigned seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
	const uint64_t good = RING_HEADER_SIZE + 2 * RING_CAP_MIN;
	assert_int_equal(attach_fake(fake_memfd(seals, RING_MAGIC, RING_CAP_MIN, good), &err), 0);
	/* a memfd the peer could shrink under our mapping */
	assert_int_equal(attach_fake(fake_memfd(0, RING_MAGIC, RING_CAP_MIN, good), &err),
			 HEARTH_EPROTO);
	assert_non_null(strstr(err.msg, "sealed"));
	assert_int_equal(attach_fake(fake_memfd(F_SEAL_SHRINK, RING_MAGIC, RING_CAP_MIN, good),
				     &err), HEARTH_EPROTO);
	assert_int_equal(attach_fake(fake_memfd(seals, 0xdeadbeef, RING_CAP_MIN, good), &err),
			 HEARTH_EPROTO);
	/* geometry that does not add up to the file size, or is not a power of two */
	assert_int_equal(attach_fake(fake_memfd(seals, RING_MAGIC, 2 * RING_CAP_MIN, good), &err),
			 HEARTH_EPROTO);
	assert_int_equal(attach_fake(fake_memfd(seals, RING_MAGIC, RING_CAP_MIN + 8, good + 8),
				     &err), HEARTH_EPROTO);
	assert_int_equal(attach_fake(fake_memfd(seals, RING_MAGIC, RING_CAP_MIN, 4096), &err),
			 HEARTH_EPROTO);
	struct ring c;
	assert_int_equal(ring_attach(&c, -1, -1, -1, &err), HEARTH_EINVAL);
}

/* ---- records in one process ---- */

static void test_ring_push_pop_both_directions(void **state)
{
	(void)state;
	struct ring d, c;
	pair_create(&d, &c, 4096, 4096);
	struct hearth_error err;
	uint8_t buf[4096];
	uint32_t type;
	size_t len;
	assert_int_equal(ring_pop(&c, &type, buf, sizeof buf, &len, &err), 0);
	assert_int_equal(ring_push(&d, RING_REC_TOKEN, "hello", 5, &err), 0);
	assert_int_equal(ring_push(&d, 99, "", 0, &err), 0);
	assert_int_equal(ring_pop(&c, &type, buf, sizeof buf, &len, &err), 1);
	assert_int_equal(type, RING_REC_TOKEN);
	assert_int_equal(len, 5);
	assert_memory_equal(buf, "hello", 5);
	assert_int_equal(ring_pop(&c, &type, buf, sizeof buf, &len, &err), 1);
	assert_int_equal(type, 99);
	assert_int_equal(len, 0);
	assert_int_equal(ring_pop(&c, &type, buf, sizeof buf, &len, &err), 0);

	assert_int_equal(ring_push(&c, RING_REC_BULK_TEXT, "abcdefgh", 8, &err), 0);
	assert_int_equal(ring_rx_pending(&d), 16);
	/* a buffer too small leaves the record in place */
	assert_int_equal(ring_pop(&d, &type, buf, 4, &len, &err), HEARTH_ERANGE);
	assert_int_equal(ring_pop(&d, &type, buf, sizeof buf, &len, &err), 1);
	assert_memory_equal(buf, "abcdefgh", 8);
	assert_int_equal(ring_push(&d, RING_REC_PAD, "x", 1, &err), HEARTH_EINVAL);
	assert_int_equal(ring_push(&d, 1, buf, 4096, &err), HEARTH_ERANGE);
	assert_int_equal(ring_max_payload(&d), 4096 - RING_REC_HEADER);
	ring_close(&d);
	ring_close(&c);
}

static void test_ring_wraps_with_padding_and_pushes_back_when_full(void **state)
{
	(void)state;
	struct ring d, c;
	pair_create(&d, &c, 4096, 4096);
	struct hearth_error err;
	uint8_t rec[4096], got[4096];
	uint64_t next_push = 0, next_pop = 0, busy = 0;
	/* records of 0..1500 bytes through a 4 KiB ring: it wraps hundreds of times, is often
	 * full, and every record still arrives whole and in order */
	while (next_pop < 3000) {
		for (;;) {
			size_t n = record_fill(7, next_push, rec, 1500);
			int rc = ring_push(&d, 5, rec, n, &err);
			if (rc == HEARTH_EBUSY) {
				busy++;
				break;
			}
			assert_int_equal(rc, 0);
			next_push++;
		}
		uint32_t type;
		size_t len;
		int pops = 0;
		while (pops < 2 && ring_pop(&c, &type, got, sizeof got, &len, &err) == 1) {
			size_t n = record_fill(7, next_pop, rec, 1500);
			assert_int_equal(type, 5);
			assert_int_equal(len, n);
			assert_memory_equal(got, rec, n);
			next_pop++;
			pops++;
		}
	}
	assert_true(busy > 100);
	assert_true(d.tx.pos > 100 * 4096);  /* wrapped many times */
	assert_false(d.broken || c.broken);
	ring_close(&d);
	ring_close(&c);
}

static void test_ring_peek_reads_logits_in_place(void **state)
{
	(void)state;
	struct ring d, c;
	pair_create(&d, &c, 1 << 16, 4096);
	struct hearth_error err;
	float row[1000];
	for (int i = 0; i < 1000; i++)
		row[i] = (float)i * 0.5f - 100.0f;
	assert_int_equal(ring_push_logits(&d, 77, 3, row, 1000, &err), 0);
	uint32_t type;
	const void *p;
	size_t len;
	assert_int_equal(ring_peek(&c, &type, &p, &len, &err), 1);
	assert_int_equal(type, RING_REC_LOGITS);
	struct ring_logits l;
	assert_int_equal(ring_logits_decode(p, len, &l, &err), 0);
	assert_int_equal(l.request_id, 77);
	assert_int_equal(l.index, 3);
	assert_int_equal(l.n_vocab, 1000);
	assert_memory_equal(l.logits, row, sizeof row);
	/* still there until consumed */
	assert_int_equal(ring_peek(&c, &type, &p, &len, &err), 1);
	ring_consume(&c);
	assert_int_equal(ring_peek(&c, &type, &p, &len, &err), 0);
	assert_int_equal(ring_logits_decode(p, 15, &l, &err), HEARTH_EFORMAT);
	ring_close(&d);
	ring_close(&c);
}

static void test_ring_token_records_roundtrip_and_reject_inconsistency(void **state)
{
	(void)state;
	struct ring d, c;
	pair_create(&d, &c, 4096, 4096);
	struct hearth_error err;
	struct ring_top top[3] = { { 10, -0.1f }, { 11, -2.0f }, { 12, -3.0f } };
	struct ring_token t = { .request_id = 5, .token = 10, .has_logprob = true,
		.logprob = -0.1f, .t_sampled_ns = 0x0123456789abcdefull,
		.text = (const uint8_t *)" wor", .text_len = 4, .top = top, .n_top = 3 };
	assert_int_equal(ring_push_token(&d, &t, &err), 0);
	struct ring_token bare = { .request_id = 6, .token = 0 };
	assert_int_equal(ring_push_token(&d, &bare, &err), 0);
	_Alignas(8) uint8_t buf[256];
	uint32_t type;
	size_t len;
	assert_int_equal(ring_pop(&c, &type, buf, sizeof buf, &len, &err), 1);
	assert_int_equal(type, RING_REC_TOKEN);
	assert_int_equal(len, 32 + 4 + 3 * 8);
	uint64_t at24;
	memcpy(&at24, buf + 24, 8);
	assert_true(at24 == 0x0123456789abcdefull);     /* the documented offset */
	struct ring_token o;
	assert_int_equal(ring_token_decode(buf, len, &o, &err), 0);
	assert_int_equal(o.request_id, 5);
	assert_true(o.t_sampled_ns == 0x0123456789abcdefull);
	assert_int_equal(o.token, 10);
	assert_true(o.has_logprob);
	assert_true(o.logprob == -0.1f);
	assert_int_equal(o.text_len, 4);
	assert_memory_equal(o.text, " wor", 4);
	assert_int_equal(o.n_top, 3);
	assert_int_equal(o.top[2].token, 12);
	assert_true(o.top[1].logprob == -2.0f);
	/* a length that disagrees with the counts inside, unknown flags, too-long text */
	assert_int_equal(ring_token_decode(buf, len - 1, &o, &err), HEARTH_EFORMAT);
	buf[12] = 3;
	assert_int_equal(ring_token_decode(buf, len, &o, &err), HEARTH_EFORMAT);
	buf[12] = 1;
	uint16_t huge = 60000;
	memcpy(buf + 20, &huge, 2);
	assert_int_equal(ring_token_decode(buf, len, &o, &err), HEARTH_EFORMAT);
	assert_int_equal(ring_token_decode(buf, 10, &o, &err), HEARTH_EFORMAT);
	assert_int_equal(ring_pop(&c, &type, buf, sizeof buf, &len, &err), 1);
	assert_int_equal(ring_token_decode(buf, len, &o, &err), 0);
	assert_int_equal(o.request_id, 6);
	assert_true(o.t_sampled_ns == 0);
	assert_false(o.has_logprob);
	assert_null(o.top);
	t.text_len = RING_TOKEN_TEXT_MAX + 1;
	assert_int_equal(ring_push_token(&d, &t, &err), HEARTH_ERANGE);
	ring_close(&d);
	ring_close(&c);
}

static void test_ring_bulk_records_are_validated(void **state)
{
	(void)state;
	struct ring d, c;
	pair_create(&d, &c, 4096, 4096);
	struct hearth_error err;
	uint32_t toks[] = { 1, 2, 3 };
	assert_int_equal(ring_push_bulk(&c, RING_REC_BULK_TOKENS, 9, toks, sizeof toks, &err), 0);
	assert_int_equal(ring_push_bulk(&c, RING_REC_BULK_TEXT, 10, "h\xc3\xa9", 3, &err), 0);
	assert_int_equal(ring_push_bulk(&c, RING_REC_BULK_TOKENS, 9, toks, 5, &err), HEARTH_EINVAL);
	assert_int_equal(ring_push_bulk(&c, RING_REC_TOKEN, 9, toks, 4, &err), HEARTH_EINVAL);
	_Alignas(8) uint8_t buf[256];
	uint32_t type;
	size_t len;
	uint64_t ref;
	const void *data;
	size_t n;
	assert_int_equal(ring_pop(&d, &type, buf, sizeof buf, &len, &err), 1);
	assert_int_equal(ring_bulk_decode(type, buf, len, &ref, &data, &n, &err), 0);
	assert_int_equal(ref, 9);
	assert_int_equal(n, sizeof toks);
	assert_memory_equal(data, toks, sizeof toks);
	assert_int_equal(ring_pop(&d, &type, buf, sizeof buf, &len, &err), 1);
	assert_int_equal(ring_bulk_decode(type, buf, len, &ref, &data, &n, &err), 0);
	assert_int_equal(ref, 10);
	assert_memory_equal(data, "h\xc3\xa9", 3);
	/* what a hostile client could put in the same records */
	buf[8] = 0xff;
	assert_int_equal(ring_bulk_decode(RING_REC_BULK_TEXT, buf, len, &ref, &data, &n, &err),
			 HEARTH_EFORMAT);
	assert_int_equal(ring_bulk_decode(RING_REC_BULK_TOKENS, buf, 8 + 6, &ref, &data, &n, &err),
			 HEARTH_EFORMAT);
	uint32_t bad_tok = 0x80000000u;
	memcpy(buf + 8, &bad_tok, 4);
	assert_int_equal(ring_bulk_decode(RING_REC_BULK_TOKENS, buf, 12, &ref, &data, &n, &err),
			 HEARTH_EFORMAT);
	assert_int_equal(ring_bulk_decode(RING_REC_LOGITS, buf, 12, &ref, &data, &n, &err),
			 HEARTH_EFORMAT);
	assert_int_equal(ring_bulk_decode(RING_REC_BULK_TEXT, buf, 7, &ref, &data, &n, &err),
			 HEARTH_EFORMAT);
	ring_close(&d);
	ring_close(&c);
}

/* ---- hostile shared memory ---- */

static uint64_t *shared_u64(struct ring *r, unsigned off)
{
	return (uint64_t *)((uint8_t *)r->map + off);
}

static void test_ring_daemon_detects_hostile_client_head(void **state)
{
	(void)state;
	const uint64_t bad_heads[] = { 4096 * 10, UINT64_MAX, 4097 };
	for (size_t i = 0; i < 3; i++) {
		struct ring d, c;
		pair_create(&d, &c, 4096, 4096);
		struct hearth_error err;
		uint8_t buf[4096];
		uint32_t type;
		size_t len;
		/* the client claims more bytes than the ring holds */
		*shared_u64(&c, RING_OFF_C2D_HEAD) = bad_heads[i];
		assert_int_equal(ring_pop(&d, &type, buf, sizeof buf, &len, &err), HEARTH_EPROTO);
		assert_true(d.broken);
		assert_non_null(strstr(err.msg, "client"));
		/* once broken, always broken, even if the index is put back */
		*shared_u64(&c, RING_OFF_C2D_HEAD) = 0;
		assert_int_equal(ring_pop(&d, &type, buf, sizeof buf, &len, &err), HEARTH_EPROTO);
		assert_int_equal(ring_push(&d, 1, "x", 1, &err), HEARTH_EPROTO);
		ring_close(&d);
		ring_close(&c);
	}
}

static void test_ring_daemon_detects_head_moving_backwards(void **state)
{
	(void)state;
	struct ring d, c;
	pair_create(&d, &c, 4096, 4096);
	struct hearth_error err;
	uint8_t buf[64];
	uint32_t type;
	size_t len;
	assert_int_equal(ring_push(&c, RING_REC_BULK_TEXT, "12345678", 8, &err), 0);
	assert_int_equal(ring_push(&c, RING_REC_BULK_TEXT, "12345678", 8, &err), 0);
	assert_int_equal(ring_pop(&d, &type, buf, sizeof buf, &len, &err), 1);
	*shared_u64(&c, RING_OFF_C2D_HEAD) = 8;  /* behind what the daemon already consumed */
	assert_int_equal(ring_pop(&d, &type, buf, sizeof buf, &len, &err), HEARTH_EPROTO);
	ring_close(&d);
	ring_close(&c);
}

static void test_ring_daemon_detects_hostile_client_tail(void **state)
{
	(void)state;
	const uint64_t bad_tails[] = { 1, 4096, UINT64_MAX };
	for (size_t i = 0; i < 3; i++) {
		struct ring d, c;
		pair_create(&d, &c, 4096, 4096);
		struct hearth_error err;
		assert_int_equal(ring_push(&d, 1, "ab", 2, &err), 0);  /* head = 16 */
		/* the client claims to have consumed more than was produced */
		*shared_u64(&c, RING_OFF_D2C_TAIL) = 16 + bad_tails[i];
		assert_int_equal(ring_push(&d, 1, "x", 1, &err), HEARTH_EPROTO);
		assert_int_equal(ring_tx_used(&d), 0);
		ring_close(&d);
		ring_close(&c);
	}
	/* and a tail that moves backwards after a valid advance */
	struct ring d, c;
	pair_create(&d, &c, 4096, 4096);
	struct hearth_error err;
	assert_int_equal(ring_push(&d, 1, "ab", 2, &err), 0);
	*shared_u64(&c, RING_OFF_D2C_TAIL) = 16;
	assert_int_equal(ring_push(&d, 1, "ab", 2, &err), 0);
	*shared_u64(&c, RING_OFF_D2C_TAIL) = 0;
	assert_int_equal(ring_push(&d, 1, "x", 1, &err), HEARTH_EPROTO);
	ring_close(&d);
	ring_close(&c);
}

/* Writes a raw record header into the client->daemon area and publishes it. */
static void forge(struct ring *c, uint64_t off, uint32_t len, uint32_t type, uint64_t head)
{
	uint8_t *area = c->tx.data;
	memcpy(area + off, &len, 4);
	memcpy(area + off + 4, &type, 4);
	*shared_u64(c, RING_OFF_C2D_HEAD) = head;
}

static void test_ring_daemon_detects_forged_record_headers(void **state)
{
	(void)state;
	struct {
		const char *what;
		uint64_t off;
		uint32_t len, type;
		uint64_t head;
	} cases[] = {
		{ "length past the end of the area", 0, 5000, 16, 4096 },
		{ "length past the published bytes", 0, 100, 16, 64 },
		{ "length of 4 GB", 0, UINT32_MAX, 16, 4096 },
		{ "partial header published", 0, 0, 16, 4 },
		{ "padding that does not reach the end", 0, 100, RING_REC_PAD, 4096 },
		{ "padding longer than published", 0, 4096 - 8, RING_REC_PAD, 64 },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		struct ring d, c;
		pair_create(&d, &c, 4096, 4096);
		struct hearth_error err;
		static uint8_t buf[8192];
		uint32_t type;
		size_t len;
		forge(&c, cases[i].off, cases[i].len, cases[i].type, cases[i].head);
		int rc = ring_pop(&d, &type, buf, sizeof buf, &len, &err);
		if (rc != HEARTH_EPROTO)
			fail_msg("%s: pop returned %d", cases[i].what, rc);
		const void *p;
		assert_int_equal(ring_peek(&d, &type, &p, &len, &err), HEARTH_EPROTO);
		ring_close(&d);
		ring_close(&c);
	}
}

static void test_ring_daemon_ignores_client_writes_to_its_own_indices(void **state)
{
	(void)state;
	struct ring d, c;
	pair_create(&d, &c, 4096, 4096);
	struct hearth_error err;
	uint8_t buf[64];
	uint32_t type;
	size_t len;
	/* The client scribbles over the geometry and the daemon's own indices. The daemon uses
	 * its private copies, so its view stays correct; only the client's view suffers. */
	memset(c.map, 0xff, 64);
	assert_int_equal(ring_push(&d, 1, "abc", 3, &err), 0);
	assert_int_equal(ring_push(&c, RING_REC_BULK_TEXT, "12345678", 8, &err), 0);
	*shared_u64(&c, RING_OFF_D2C_HEAD) = 123456789;
	*shared_u64(&c, RING_OFF_C2D_TAIL) = 987654321;
	assert_int_equal(ring_pop(&d, &type, buf, sizeof buf, &len, &err), 1);
	assert_memory_equal(buf, "12345678", 8);
	assert_int_equal(*shared_u64(&d, RING_OFF_C2D_TAIL), 16);  /* rewritten from private */
	assert_int_equal(ring_push(&d, 1, "def", 3, &err), 0);
	assert_int_equal(*shared_u64(&d, RING_OFF_D2C_HEAD), 32);  /* rewritten from private */
	assert_false(d.broken);
	/* the client, reading the head it forged, is the one that finds the ring broken */
	*shared_u64(&c, RING_OFF_D2C_HEAD) = 123456789;
	assert_int_equal(ring_pop(&c, &type, buf, sizeof buf, &len, &err), HEARTH_EPROTO);
	ring_close(&d);
	ring_close(&c);
}

/* ---- two processes ---- */

#define XPROC_RECORDS 100000u
#define XPROC_MAX 600u

/* Pushes XPROC_RECORDS records and pops as many, interleaved, sleeping on the doorbell when
 * neither can progress. Returns the checksum of everything received, or 0 on a mismatch. */
static uint64_t xproc_run(struct ring *r, uint64_t tx_seed, uint64_t rx_seed)
{
	static uint8_t rec[XPROC_MAX], got[XPROC_MAX], want[XPROC_MAX];
	uint64_t pushed = 0, popped = 0, sum = 0xcbf29ce484222325ull;
	struct hearth_error err;
	while (pushed < XPROC_RECORDS || popped < XPROC_RECORDS) {
		bool progress = false;
		while (pushed < XPROC_RECORDS) {
			size_t n = record_fill(tx_seed, pushed, rec, XPROC_MAX);
			int rc = ring_push(r, 3, rec, n, &err);
			if (rc == HEARTH_EBUSY)
				break;
			if (rc)
				return 0;
			pushed++;
			progress = true;
		}
		if (progress)
			ring_notify(r, NULL);
		bool freed = false;
		for (;;) {
			uint32_t type;
			size_t len;
			int rc = ring_pop(r, &type, got, sizeof got, &len, &err);
			if (rc == 0)
				break;
			if (rc < 0 || type != 3)
				return 0;
			size_t n = record_fill(rx_seed, popped, want, XPROC_MAX);
			if (len != n || memcmp(got, want, n) != 0)
				return 0;
			sum = fnv1a(sum, got, len);
			popped++;
			freed = progress = true;
		}
		if (freed)
			ring_notify(r, NULL);
		if (!progress) {
			struct pollfd pfd = { .fd = ring_wait_fd(r), .events = POLLIN };
			if (poll(&pfd, 1, 5000) <= 0)
				return 0;  /* a lost wake-up would hang here: fail instead */
			ring_doorbell_clear(r, NULL);
		}
	}
	return sum;
}

static uint64_t expected_sum(uint64_t seed)
{
	static uint8_t rec[XPROC_MAX];
	uint64_t sum = 0xcbf29ce484222325ull;
	for (uint64_t i = 0; i < XPROC_RECORDS; i++) {
		size_t n = record_fill(seed, i, rec, XPROC_MAX);
		sum = fnv1a(sum, rec, n);
	}
	return sum;
}

static void test_ring_two_processes_exchange_100k_records_each_way(void **state)
{
	(void)state;
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* the client: receives the fds exactly as a real client would, over the socket */
		close(sv[0]);
		char byte[64];
		int fds[FDPASS_MAX];
		size_t got, nfds;
		if (fdpass_recv(sv[1], byte, sizeof byte, &got, fds, 3, &nfds, NULL) || nfds != 3)
			_exit(2);
		struct ring c;
		if (ring_attach(&c, fds[0], fds[1], fds[2], NULL))
			_exit(3);
		uint64_t sum = xproc_run(&c, 0xc2d, 0xd2c);
		ssize_t w = write(sv[1], &sum, sizeof sum);
		ring_close(&c);
		_exit(w == (ssize_t)sizeof sum && sum ? 0 : 4);
	}
	close(sv[1]);
	struct ring d;
	struct hearth_error err;
	/* 16 KiB rings carry ~30 MB each way: ~2000 wrap-arounds, constant backpressure */
	assert_int_equal(ring_create(&d, 1 << 14, 1 << 14, &err), 0);
	int fds[3];
	ring_fds(&d, fds);
	size_t sent;
	assert_int_equal(fdpass_send(sv[0], "W", 1, fds, 3, &sent, &err), 0);
	assert_int_equal(sent, 1);
	uint64_t sum = xproc_run(&d, 0xd2c, 0xc2d);
	(void)sum;
	uint64_t child_sum = 0;
	assert_int_equal(read(sv[0], &child_sum, sizeof child_sum), (ssize_t)sizeof child_sum);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_true(child_sum == expected_sum(0xd2c));
	assert_true(sum == expected_sum(0xc2d));
	assert_false(d.broken);
	assert_true(d.tx.pos > 1000ull * d.tx.cap);  /* wrapped over a thousand times */
	ring_close(&d);
	close(sv[0]);
}

/* ---- fd passing ---- */

static void test_fdpass_refuses_and_closes_surplus_descriptors(void **state)
{
	(void)state;
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	int extra[4];
	for (int i = 0; i < 4; i++)
		extra[i] = eventfd(0, EFD_CLOEXEC);
	size_t sent;
	struct hearth_error err;
	assert_int_equal(fdpass_send(sv[0], "abc", 3, extra, 4, &sent, &err), 0);
	for (int i = 0; i < 4; i++)
		close(extra[i]);
	int before = count_open_fds();
	char buf[8];
	int fds[FDPASS_MAX];
	size_t got, nfds;
	assert_int_equal(fdpass_recv(sv[1], buf, sizeof buf, &got, fds, 3, &nfds, &err),
			 HEARTH_EPROTO);
	assert_int_equal(count_open_fds(), before);  /* all four closed again */
	/* plain bytes with no descriptors are fine */
	assert_int_equal(fdpass_send(sv[0], "xy", 2, NULL, 0, &sent, &err), 0);
	assert_int_equal(fdpass_recv(sv[1], buf, sizeof buf, &got, fds, 3, &nfds, &err), 0);
	assert_int_equal(got, 2);
	assert_int_equal(nfds, 0);
	close(sv[0]);
	assert_int_equal(fdpass_recv(sv[1], buf, sizeof buf, &got, fds, 3, &nfds, &err), 0);
	assert_int_equal(got, 0);  /* end of stream */
	close(sv[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ring_create_seals_the_memfd_against_resizing),
		cmocka_unit_test(test_ring_attach_refuses_unsealed_or_malformed_memfd),
		cmocka_unit_test(test_ring_push_pop_both_directions),
		cmocka_unit_test(test_ring_wraps_with_padding_and_pushes_back_when_full),
		cmocka_unit_test(test_ring_peek_reads_logits_in_place),
		cmocka_unit_test(test_ring_token_records_roundtrip_and_reject_inconsistency),
		cmocka_unit_test(test_ring_bulk_records_are_validated),
		cmocka_unit_test(test_ring_daemon_detects_hostile_client_head),
		cmocka_unit_test(test_ring_daemon_detects_head_moving_backwards),
		cmocka_unit_test(test_ring_daemon_detects_hostile_client_tail),
		cmocka_unit_test(test_ring_daemon_detects_forged_record_headers),
		cmocka_unit_test(test_ring_daemon_ignores_client_writes_to_its_own_indices),
		cmocka_unit_test(test_ring_two_processes_exchange_100k_records_each_way),
		cmocka_unit_test(test_fdpass_refuses_and_closes_surplus_descriptors),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
