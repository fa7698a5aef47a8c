/* Fuzz target for the packed-weights file (daemon/engine/pack_cache.h): the input is such
 * a file, opened from a memfd under the key its own header names (so mutations reach past
 * the header) and under another key, its payload read in input-chosen pieces and verified.
 * Every input must either pass or fail with a message naming the file; a file that passes
 * holds exactly the bytes its checksum says; nothing may crash or read past the file. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/engine/pack_cache.h"
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzz_file.h"

#define PACK_HEADER 64u

void fuzz_fail(const char *file, int line, const char *what)
{
	fprintf(stderr, "%s:%d: invariant broken: %s\n", file, line, what);
	abort();
}

static uint64_t le64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[64];
	int fd = fuzz_file(data, size, path, sizeof path);
	/* The key, payload and pieces the header claims (zeros for a short input). */
	uint64_t key = size >= PACK_HEADER ? le64(data + 16) : 0;
	uint64_t payload = size >= PACK_HEADER ? le64(data + 24) : 0;
	uint64_t items = size >= PACK_HEADER ? le64(data + 32) : 0;
	struct pack_cache *pc = NULL;
	struct hearth_error err = { 0 };

	int rc = pack_cache_open(&pc, path, key + 1, payload, items, &err);
	if (rc == 0) /* a key that differs never opens */
		pack_cache_close(pc);
	FUZZ_CHECK(rc < 0 && pc == NULL);
	fuzz_check_named(rc, &err, path);

	memset(&err, 0, sizeof err);
	rc = pack_cache_open(&pc, path, key, payload, items, &err);
	if (rc < 0) {
		FUZZ_CHECK(pc == NULL);
		fuzz_check_named(rc, &err, path);
		close(fd);
		return 0;
	}
	/* Opened: the file is the header, the payload and the checksum, nothing else. */
	FUZZ_CHECK(size >= PACK_HEADER + 8 && size - PACK_HEADER - 8 == payload);
	uint8_t *buf = malloc(payload + 1);
	FUZZ_CHECK(buf != NULL);
	uint64_t done = 0;
	for (size_t i = 0; done < payload; i++) {
		uint64_t piece = 1 + (data[(i * 7) % size] * 131u + i) % 4096;
		piece = piece < payload - done ? piece : payload - done;
		FUZZ_CHECK(pack_cache_read(pc, buf + done, piece, &err) == 0);
		done += piece;
	}
	FUZZ_CHECK(memcmp(buf, data + PACK_HEADER, payload) == 0);
	memset(&err, 0, sizeof err);
	FUZZ_CHECK(pack_cache_read(pc, buf, 1, &err) < 0 && err.msg[0]); /* past the payload */
	struct pack_hash h;
	pack_hash_init(&h);
	pack_hash_add(&h, data + PACK_HEADER, payload);
	bool sum_ok = pack_hash_end(&h) == le64(data + PACK_HEADER + payload);
	memset(&err, 0, sizeof err);
	rc = pack_cache_verify(pc, &err);
	FUZZ_CHECK((rc == 0) == sum_ok);
	if (rc < 0)
		fuzz_check_named(rc, &err, path);
	pack_cache_close(pc);
	free(buf);
	close(fd);
	return 0;
}

/* Files the writer makes: empty, small, and a few thousand bytes. */
static void seed_written(fuzz_seed_fn add, void *ctx, size_t n, uint64_t key)
{
	char path[] = "/tmp/fuzz_pack_cache.XXXXXX";
	int tfd = mkstemp(path);
	FUZZ_CHECK(tfd >= 0);
	close(tfd);
	uint8_t *p = malloc(n + 1);
	FUZZ_CHECK(p != NULL);
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 37 + 11);
	struct pack_cache *pc;
	struct hearth_error err;
	FUZZ_CHECK(pack_cache_create(&pc, path, key, n, 3, &err) == 0);
	FUZZ_CHECK(pack_cache_write(pc, p, n, &err) == 0);
	FUZZ_CHECK(pack_cache_commit(pc, &err) == 0);
	pack_cache_close(pc);
	FILE *f = fopen(path, "rb");
	FUZZ_CHECK(f != NULL);
	uint8_t *file = malloc(PACK_HEADER + n + 8);
	FUZZ_CHECK(file && fread(file, 1, PACK_HEADER + n + 8, f) == PACK_HEADER + n + 8);
	fclose(f);
	unlink(path);
	add(ctx, file, PACK_HEADER + n + 8);
	free(file);
	free(p);
}

void fuzz_seeds(fuzz_seed_fn add, void *ctx)
{
	seed_written(add, ctx, 0, 1);
	seed_written(add, ctx, 100, 0x0123456789abcdefull);
	seed_written(add, ctx, 5000, 42);
}
