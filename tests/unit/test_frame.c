/* Tests of the incremental frame reader: reassembly from arbitrary pieces, oversized frames
 * skipped without being buffered, and framing declared lost on an impossible length. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "protocol/frame.h"

/* Appends one frame (header + payload) to buf; returns the new length. */
static size_t put_frame(uint8_t *buf, size_t at, const char *payload, size_t n)
{
	assert_int_equal(frame_header_write(buf + at, n), 0);
	memcpy(buf + at + 4, payload, n);
	return at + 4 + n;
}

static void test_frame_header_is_big_endian(void **state)
{
	(void)state;
	uint8_t h[4];
	assert_int_equal(frame_header_write(h, 0x01020304), 0);
	assert_int_equal(h[0], 1);
	assert_int_equal(h[1], 2);
	assert_int_equal(h[2], 3);
	assert_int_equal(h[3], 4);
	assert_int_equal(frame_header_read(h), 0x01020304u);
	assert_int_equal(frame_header_write(h, (size_t)UINT32_MAX + 1), HEARTH_ERANGE);
}

static void test_frame_reassembles_frames_fed_byte_by_byte(void **state)
{
	(void)state;
	uint8_t wire[256];
	size_t n = put_frame(wire, 0, "alpha", 5);
	n = put_frame(wire, n, "", 0);
	n = put_frame(wire, n, "gamma-gamma", 11);
	struct frame_reader r;
	struct hearth_error err;
	assert_int_equal(frame_reader_init(&r, 64, &err), 0);
	const char *expect[] = { "alpha", "", "gamma-gamma" };
	size_t got = 0;
	for (size_t i = 0; i < n; i++) {
		assert_int_equal(frame_reader_feed(&r, wire + i, 1, &err), 0);
		const uint8_t *p;
		size_t len;
		int rc;
		while ((rc = frame_reader_next(&r, &p, &len, &err)) == FRAME_READY) {
			assert_true(got < 3);
			assert_int_equal(len, strlen(expect[got]));
			assert_memory_equal(p, expect[got], len);
			got++;
		}
		assert_int_equal(rc, FRAME_NEED_MORE);
	}
	assert_int_equal(got, 3);
	frame_reader_free(&r);
}

static void test_frame_returns_every_frame_of_one_chunk(void **state)
{
	(void)state;
	uint8_t wire[1024];
	size_t n = 0;
	char payload[16];
	for (int i = 0; i < 50; i++) {
		snprintf(payload, sizeof payload, "f%02d", i);
		n = put_frame(wire, n, payload, 3);
	}
	struct frame_reader r;
	assert_int_equal(frame_reader_init(&r, 0, NULL), 0);
	assert_int_equal(r.max_payload, FRAME_MAX_DEFAULT);
	assert_int_equal(frame_reader_feed(&r, wire, n - 2, NULL), 0);
	const uint8_t *p;
	size_t len;
	for (int i = 0; i < 49; i++) {
		assert_int_equal(frame_reader_next(&r, &p, &len, NULL), FRAME_READY);
		snprintf(payload, sizeof payload, "f%02d", i);
		assert_memory_equal(p, payload, 3);
	}
	assert_int_equal(frame_reader_next(&r, &p, &len, NULL), FRAME_NEED_MORE);
	assert_int_equal(frame_reader_feed(&r, wire + n - 2, 2, NULL), 0);
	assert_int_equal(frame_reader_next(&r, &p, &len, NULL), FRAME_READY);
	assert_memory_equal(p, "f49", 3);
	frame_reader_free(&r);
}

static void test_frame_skips_oversized_payload_without_buffering(void **state)
{
	(void)state;
	struct frame_reader r;
	struct hearth_error err;
	assert_int_equal(frame_reader_init(&r, 1000, &err), 0);
	/* A 10 MB frame announced, its bytes arriving in 64 KiB reads, then a good frame. */
	const size_t big = 10u << 20;
	uint8_t hdr[4];
	frame_header_write(hdr, big);
	assert_int_equal(frame_reader_feed(&r, hdr, 4, &err), 0);
	const uint8_t *p;
	size_t len;
	assert_int_equal(frame_reader_next(&r, &p, &len, &err), FRAME_OVERSIZED);
	assert_int_equal(err.code, HEARTH_ERANGE);
	static uint8_t chunk[65536];
	memset(chunk, 0xAB, sizeof chunk);
	size_t left = big;
	int oversized = 0;
	while (left > 0) {
		size_t n = left < sizeof chunk ? left : sizeof chunk;
		assert_int_equal(frame_reader_feed(&r, chunk, n, &err), 0);
		left -= n;
		int rc;
		while ((rc = frame_reader_next(&r, &p, &len, &err)) != FRAME_NEED_MORE)
			oversized += rc == FRAME_OVERSIZED;
	}
	assert_int_equal(oversized, 0);
	assert_true(r.cap <= 4096);   /* nothing of the big payload was stored */
	uint8_t wire[16];
	size_t n = put_frame(wire, 0, "ok", 2);
	assert_int_equal(frame_reader_feed(&r, wire, n, &err), 0);
	assert_int_equal(frame_reader_next(&r, &p, &len, &err), FRAME_READY);
	assert_int_equal(len, 2);
	assert_memory_equal(p, "ok", 2);
	frame_reader_free(&r);
}

static void test_frame_oversized_then_good_frame_in_same_chunk(void **state)
{
	(void)state;
	struct frame_reader r;
	assert_int_equal(frame_reader_init(&r, 8, NULL), 0);
	uint8_t wire[64];
	size_t n = put_frame(wire, 0, "0123456789abcdef", 16);
	n = put_frame(wire, n, "small", 5);
	assert_int_equal(frame_reader_feed(&r, wire, n, NULL), 0);
	const uint8_t *p;
	size_t len;
	assert_int_equal(frame_reader_next(&r, &p, &len, NULL), FRAME_OVERSIZED);
	assert_int_equal(frame_reader_next(&r, &p, &len, NULL), FRAME_READY);
	assert_int_equal(len, 5);
	assert_memory_equal(p, "small", 5);
	assert_int_equal(frame_reader_next(&r, &p, &len, NULL), FRAME_NEED_MORE);
	frame_reader_free(&r);
}

static void test_frame_loses_framing_on_impossible_length(void **state)
{
	(void)state;
	struct frame_reader r;
	struct hearth_error err;
	assert_int_equal(frame_reader_init(&r, 0, &err), 0);
	/* Text typed into the socket: "GET " reads as a 1.2 GB length. */
	assert_int_equal(frame_reader_feed(&r, "GET / HTTP/1.1\r\n", 16, &err), 0);
	const uint8_t *p;
	size_t len;
	assert_int_equal(frame_reader_next(&r, &p, &len, &err), HEARTH_EPROTO);
	assert_non_null(strstr(err.msg, "framing lost"));
	assert_int_equal(frame_reader_feed(&r, "x", 1, &err), HEARTH_EPROTO);
	assert_int_equal(frame_reader_next(&r, &p, &len, &err), HEARTH_EPROTO);
	frame_reader_free(&r);
}

static void test_frame_reader_refuses_maximum_above_skip_limit(void **state)
{
	(void)state;
	struct frame_reader r;
	struct hearth_error err;
	assert_int_equal(frame_reader_init(&r, (size_t)FRAME_SKIP_LIMIT + 1, &err), HEARTH_EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_frame_header_is_big_endian),
		cmocka_unit_test(test_frame_reassembles_frames_fed_byte_by_byte),
		cmocka_unit_test(test_frame_returns_every_frame_of_one_chunk),
		cmocka_unit_test(test_frame_skips_oversized_payload_without_buffering),
		cmocka_unit_test(test_frame_oversized_then_good_frame_in_same_chunk),
		cmocka_unit_test(test_frame_loses_framing_on_impossible_length),
		cmocka_unit_test(test_frame_reader_refuses_maximum_above_skip_limit),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
