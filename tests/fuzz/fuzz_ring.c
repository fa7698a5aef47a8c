/* Fuzz target for the shared-memory ring as the daemon sees it: the input is a script of
 * legitimate pushes and pops mixed with a hostile client's raw writes to the indices and
 * record bytes it can reach. The daemon must never read or write out of bounds, never
 * hand out a record larger than its buffer, and stay broken once it saw a lie. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "protocol/ring.h"
#include "tests/fuzz/fuzz.h"

void fuzz_fail(const char *file, int line, const char *what)
{
	fprintf(stderr, "%s:%d: invariant broken: %s\n", file, line, what);
	abort();
}

struct script {
	const uint8_t *p;
	size_t n;
	size_t at;
};

static uint64_t take(struct script *s, size_t bytes)
{
	uint64_t v = 0;
	for (size_t i = 0; i < bytes; i++)
		v = v << 8 | (s->at < s->n ? s->p[s->at++] : 0);
	return v;
}

static void shared_store(struct ring *c, unsigned off, uint64_t v)
{
	__atomic_store_n((uint64_t *)((uint8_t *)c->map + off), v, __ATOMIC_RELEASE);
}

static uint64_t shared_load(struct ring *c, unsigned off)
{
	return __atomic_load_n((uint64_t *)((uint8_t *)c->map + off), __ATOMIC_ACQUIRE);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ring d, c;
	if (ring_create(&d, 4096, 4096, NULL))
		return 0;
	int fds[3];
	ring_fds(&d, fds);
	if (ring_attach(&c, dup(fds[0]), dup(fds[1]), dup(fds[2]), NULL)) {
		ring_close(&d);
		return 0;
	}
	static _Alignas(8) uint8_t buf[8192], payload[4096];
	for (size_t i = 0; i < sizeof payload; i++)
		payload[i] = (uint8_t)(i * 7);
	struct script s = { data, size, 0 };
	bool was_broken = false;
	for (int steps = 0; s.at < s.n && steps < 4096; steps++) {
		uint8_t op = (uint8_t)take(&s, 1);
		uint32_t type;
		size_t len;
		int rc;
		switch (op % 9) {
		case 0: /* client pushes a legitimate record */
			len = (size_t)take(&s, 2) % 3000;
			ring_push(&c, op & 0x10 ? RING_REC_BULK_TEXT : RING_REC_BULK_TOKENS, payload, len,
				  NULL);
			break;
		case 1: /* hostile: any head */
			shared_store(&c, RING_OFF_C2D_HEAD, take(&s, 8));
			break;
		case 2: /* hostile: any tail for the daemon's own lane */
			shared_store(&c, RING_OFF_D2C_TAIL, take(&s, 8));
			break;
		case 3: { /* hostile: rewrite record bytes, headers included */
			size_t off = (size_t)take(&s, 2) % c.tx.cap;
			uint64_t v = take(&s, 8);
			size_t n = c.tx.cap - off < 8 ? c.tx.cap - off : 8;
			memcpy(c.tx.data + off, &v, n);
			break;
		}
		case 4: /* daemon consumes: the path every client byte takes */
			rc = ring_pop(&d, &type, buf, sizeof buf, &len, NULL);
			FUZZ_CHECK(rc == 0 || rc == 1 || rc == HEARTH_EPROTO || rc == HEARTH_ERANGE);
			if (rc == 1) {
				FUZZ_CHECK(len <= d.rx.cap - RING_REC_HEADER);
				uint64_t ref;
				const void *p;
				size_t n;
				if (ring_bulk_decode(type, buf, len, &ref, &p, &n, NULL) == 0)
					FUZZ_CHECK((const uint8_t *)p + n <= buf + len);
				struct ring_token t;
				if (ring_token_decode(buf, len, &t, NULL) == 0)
					FUZZ_CHECK(t.text + t.text_len <= buf + len);
			}
			if (rc == HEARTH_EPROTO)
				FUZZ_CHECK(d.broken);
			break;
		case 5: { /* daemon produces */
			struct ring_token t = { .request_id = 1, .token = op, .text = payload,
						.text_len = (size_t)take(&s, 1) };
			rc = ring_push_token(&d, &t, NULL);
			FUZZ_CHECK(rc == 0 || rc == HEARTH_EBUSY || rc == HEARTH_EPROTO);
			break;
		}
		case 6: /* client consumes (keeps the daemon's lane moving) */
			ring_pop(&c, &type, buf, sizeof buf, &len, NULL);
			break;
		case 7: { /* hostile: a small lie about the head, the kind a buggy client tells */
			int8_t delta = (int8_t)take(&s, 1);
			shared_store(&c, RING_OFF_C2D_HEAD,
				     shared_load(&c, RING_OFF_C2D_HEAD) + (uint64_t)(int64_t)delta);
			break;
		}
		case 8: /* daemon peeks then consumes */
		{
			const void *p;
			rc = ring_peek(&d, &type, &p, &len, NULL);
			if (rc == 1) {
				FUZZ_CHECK((const uint8_t *)p >= d.rx.data &&
					   (const uint8_t *)p + len <= d.rx.data + d.rx.cap);
				ring_consume(&d);
			}
			break;
		}
		}
		/* the daemon's private indices stay coherent whatever was written */
		FUZZ_CHECK(d.rx.pos <= d.rx.peer && d.rx.peer - d.rx.pos <= d.rx.cap);
		FUZZ_CHECK(d.tx.peer <= d.tx.pos && d.tx.pos - d.tx.peer <= d.tx.cap);
		if (was_broken)
			FUZZ_CHECK(d.broken);
		was_broken = d.broken;
	}
	ring_close(&c);
	ring_close(&d);
	return 0;
}

void fuzz_seeds(fuzz_seed_fn add, void *ctx)
{
	/* legit traffic both ways, with wrap-around */
	static const uint8_t legit[] = {
		0, 0x01, 0x00, 4, 0x10, 0x07, 0xd0, 4, 5, 40, 6, 0, 0x0f, 0xa0, 4, 4, 5, 200,
		6, 0x10, 0x0b, 0xb8, 4, 0, 0x02, 0x00, 8, 8, 5, 10, 6, 5, 0, 6,
	};
	add(ctx, legit, sizeof legit);
	/* a head lie, a forged header, a tail lie */
	static const uint8_t lies[] = {
		0, 0x00, 0x40, 7, 0x08, 4, 3, 0x00, 0x00, 0xff, 0xff, 0x00, 0x00, 0x10, 0x00, 0x00,
		0x00, 4, 5, 3, 2, 0, 0, 0, 0, 0, 0, 0x01, 0x00, 5, 1, 1, 0, 0, 0, 0, 0, 0, 0x10,
		0x00, 4,
	};
	add(ctx, lies, sizeof lies);
}
