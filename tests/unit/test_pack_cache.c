/* The packed-weights file (daemon/engine/pack_cache.h) on its own: its checksum does not
 * depend on how the stream is cut, a file reads back what was written, a header for other
 * weights, another format or a wrong size is refused with what is wrong, a write never
 * leaves half a file under the real name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/engine/pack_cache.h"

#define N 100000

static uint8_t *random_bytes(size_t n, unsigned seed)
{
	uint8_t *p = malloc(n);
	assert_non_null(p);
	srand(seed);
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)rand();
	return p;
}

static uint64_t hash_all(const void *p, size_t n)
{
	struct pack_hash h;
	pack_hash_init(&h);
	pack_hash_add(&h, p, n);
	return pack_hash_end(&h);
}

static void test_pack_hash_is_the_same_however_the_stream_is_cut(void **state)
{
	(void)state;
	uint8_t *p = random_bytes(N, 1);
	for (size_t n = 0; n < 100; n++) {
		/* every length up to three blocks, cut byte by byte */
		struct pack_hash h;
		pack_hash_init(&h);
		for (size_t i = 0; i < n; i++)
			pack_hash_add(&h, p + i, 1);
		assert_true(pack_hash_end(&h) == hash_all(p, n));
	}
	uint64_t whole = hash_all(p, N);
	for (unsigned round = 0; round < 20; round++) {
		struct pack_hash h;
		pack_hash_init(&h);
		srand(round);
		for (size_t i = 0; i < N;) {
			size_t k = (size_t)rand() % 200;
			k = k < N - i ? k : N - i;
			pack_hash_add(&h, p + i, k);
			i += k;
		}
		assert_true(pack_hash_end(&h) == whole);
	}
	/* one flipped bit anywhere, or one zero byte more, is another sum */
	for (size_t i = 0; i < N; i += 997) {
		p[i] ^= 4;
		assert_true(hash_all(p, N) != whole);
		p[i] ^= 4;
	}
	uint8_t zeros[65] = { 0 };
	for (size_t n = 0; n < 64; n++)
		assert_true(hash_all(zeros, n) != hash_all(zeros, n + 1));
	free(p);
}

struct dir {
	char path[64];
	char file[128];
};

static void dir_make(struct dir *d)
{
	snprintf(d->path, sizeof d->path, "/tmp/test_pack_cache.XXXXXX");
	assert_non_null(mkdtemp(d->path));
	snprintf(d->file, sizeof d->file, "%s/m.weights", d->path);
}

static void dir_remove(struct dir *d)
{
	unlink(d->file);
	assert_int_equal(rmdir(d->path), 0); /* nothing else left: no .part */
}

static void write_file(const char *path, const uint8_t *p, size_t n, uint64_t key, uint64_t items)
{
	struct pack_cache *pc;
	struct hearth_error e;
	assert_int_equal(pack_cache_create(&pc, path, key, n, items, &e), 0);
	for (size_t i = 0; i < n; i += 4096)
		assert_int_equal(pack_cache_write(pc, p + i, n - i < 4096 ? n - i : 4096, &e), 0);
	assert_int_equal(pack_cache_commit(pc, &e), 0);
	pack_cache_close(pc);
}

static void test_pack_cache_reads_back_what_was_written(void **state)
{
	(void)state;
	struct dir d;
	dir_make(&d);
	uint8_t *p = random_bytes(N, 2), *q = malloc(N);
	assert_non_null(q);
	write_file(d.file, p, N, 42, 7);
	struct pack_cache *pc;
	struct hearth_error e;
	assert_int_equal(pack_cache_open(&pc, d.file, 42, N, 7, &e), 0);
	for (size_t i = 0; i < N; i += 333)
		assert_int_equal(pack_cache_read(pc, q + i, N - i < 333 ? N - i : 333, &e), 0);
	assert_memory_equal(p, q, N);
	assert_int_equal(pack_cache_read(pc, q, 1, &e), HEARTH_EINVAL);
	assert_non_null(strstr(e.msg, "a read past its 100000 bytes"));
	assert_int_equal(pack_cache_verify(pc, &e), 0);
	pack_cache_close(pc);

	/* verified only once it is all read */
	assert_int_equal(pack_cache_open(&pc, d.file, 42, N, 7, &e), 0);
	assert_int_equal(pack_cache_read(pc, q, 10, &e), 0);
	assert_int_equal(pack_cache_verify(pc, &e), HEARTH_EINVAL);
	assert_non_null(strstr(e.msg, "10 of its 100000 bytes read"));
	pack_cache_close(pc);
	free(p);
	free(q);
	dir_remove(&d);
}

static void expect_refused(const char *path, uint64_t key, uint64_t payload, uint64_t items, int code,
			   const char *words)
{
	struct pack_cache *pc = (struct pack_cache *)1;
	struct hearth_error e;
	assert_int_equal(pack_cache_open(&pc, path, key, payload, items, &e), code);
	assert_null(pc);
	if (!strstr(e.msg, words))
		fail_msg("'%s' does not say '%s'", e.msg, words);
	assert_non_null(strstr(e.msg, path));
}

static void test_pack_cache_refuses_a_file_for_other_weights(void **state)
{
	(void)state;
	struct dir d;
	dir_make(&d);
	expect_refused(d.file, 42, N, 7, HEARTH_ENOTFOUND, "No such file");
	uint8_t *p = random_bytes(N, 3);
	write_file(d.file, p, N, 42, 7);
	expect_refused(d.file, 43, N, 7, HEARTH_EINVAL, "made for another model file");
	expect_refused(d.file, 42, N - 1, 7, HEARTH_EINVAL, "made for another model file");
	expect_refused(d.file, 42, N, 8, HEARTH_EINVAL, "made for another model file");
	expect_refused(d.path, 42, N, 7, HEARTH_EINVAL, "not a regular file");

	/* another format: the word after the magic */
	FILE *f = fopen(d.file, "r+b");
	assert_non_null(f);
	fseek(f, 8, SEEK_SET);
	fputc(PACK_CACHE_FORMAT + 1, f);
	fclose(f);
	expect_refused(d.file, 42, N, 7, HEARTH_EINVAL, "format 2, this hearthd writes 1");
	/* not one at all, and shorter than a header */
	f = fopen(d.file, "wb");
	fwrite(p, 1, 100, f);
	fclose(f);
	expect_refused(d.file, 42, N, 7, HEARTH_EINVAL, "not a packed-weights file");
	assert_int_equal(truncate(d.file, 10), 0);
	expect_refused(d.file, 42, N, 7, HEARTH_EINVAL, "10 bytes, shorter than its header");
	/* the right header on a file one byte long or short */
	write_file(d.file, p, N, 42, 7);
	assert_int_equal(truncate(d.file, 64 + N + 8 - 1), 0);
	expect_refused(d.file, 42, N, 7, HEARTH_EINVAL, "100071 bytes where its header says 100072");
	assert_int_equal(truncate(d.file, 64 + N + 8 + 1), 0);
	expect_refused(d.file, 42, N, 7, HEARTH_EINVAL, "100073 bytes where its header says 100072");
	/* a payload byte changed: only the checksum can tell */
	write_file(d.file, p, N, 42, 7);
	f = fopen(d.file, "r+b");
	fseek(f, 64 + N / 3, SEEK_SET);
	fputc(p[N / 3] ^ 1, f);
	fclose(f);
	struct pack_cache *pc;
	struct hearth_error e;
	uint8_t *q = malloc(N);
	assert_non_null(q);
	assert_int_equal(pack_cache_open(&pc, d.file, 42, N, 7, &e), 0);
	assert_int_equal(pack_cache_read(pc, q, N, &e), 0);
	assert_int_equal(pack_cache_verify(pc, &e), HEARTH_EINVAL);
	assert_non_null(strstr(e.msg, "its contents do not match their checksum"));
	pack_cache_close(pc);
	free(q);
	free(p);
	dir_remove(&d);
}

/* The old file stays whole until the commit; a write given up, or one short of its payload,
 * leaves nothing (its part removed); a directory that is not there is named. */
static void test_pack_cache_never_leaves_half_a_file(void **state)
{
	(void)state;
	struct dir d;
	dir_make(&d);
	uint8_t *p = random_bytes(N, 4), *q = random_bytes(N, 5);
	write_file(d.file, p, N, 1, 1);
	struct pack_cache *pc, *rd;
	struct hearth_error e;
	assert_int_equal(pack_cache_create(&pc, d.file, 2, N, 1, &e), 0);
	assert_int_equal(pack_cache_write(pc, q, N / 2, &e), 0);
	assert_int_equal(pack_cache_open(&rd, d.file, 1, N, 1, &e), 0); /* still the old one */
	pack_cache_close(rd);
	pack_cache_close(pc); /* given up */
	assert_int_equal(pack_cache_open(&rd, d.file, 1, N, 1, &e), 0);
	pack_cache_close(rd);

	assert_int_equal(pack_cache_create(&pc, d.file, 2, N, 1, &e), 0);
	assert_int_equal(pack_cache_write(pc, q, N - 1, &e), 0);
	assert_int_equal(pack_cache_write(pc, q, 2, &e), HEARTH_EINVAL);
	assert_non_null(strstr(e.msg, "a write past its 100000 bytes"));
	assert_int_equal(pack_cache_commit(pc, &e), HEARTH_EINVAL);
	assert_non_null(strstr(e.msg, "99999 of its 100000 bytes written"));
	pack_cache_close(pc);
	assert_int_equal(pack_cache_open(&rd, d.file, 1, N, 1, &e), 0);
	pack_cache_close(rd);

	write_file(d.file, q, N, 2, 1); /* committed: the new one */
	expect_refused(d.file, 1, N, 1, HEARTH_EINVAL, "made for another model file");
	assert_int_equal(pack_cache_open(&rd, d.file, 2, N, 1, &e), 0);
	pack_cache_close(rd);

	char missing[200];
	snprintf(missing, sizeof missing, "%s/none/m.weights", d.path);
	pc = (struct pack_cache *)1;
	assert_int_equal(pack_cache_create(&pc, missing, 2, N, 1, &e), HEARTH_EIO);
	assert_null(pc);
	assert_non_null(strstr(e.msg, missing));
	assert_non_null(strstr(e.msg, "No such file or directory"));
	free(p);
	free(q);
	dir_remove(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pack_hash_is_the_same_however_the_stream_is_cut),
		cmocka_unit_test(test_pack_cache_reads_back_what_was_written),
		cmocka_unit_test(test_pack_cache_refuses_a_file_for_other_weights),
		cmocka_unit_test(test_pack_cache_never_leaves_half_a_file),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
