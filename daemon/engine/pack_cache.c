/* Reading and writing the packed-weights file (pack_cache.h): a 64-byte header, the
 * payload, an 8-byte checksum. Both directions stream in pieces and give the file's pages
 * back behind them, as the loader does with the model file. */
#include "daemon/engine/pack_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PACK_MAGIC "HEARTHPW"
#define PACK_HEADER 64u
#define PACK_TRAILER 8u
/* Bytes between two returns of the file's pages to the kernel. */
#define PACK_RELEASE_BYTES ((uint64_t)64 << 20)

struct pack_header {
	char magic[8];
	uint32_t format;
	uint32_t header_bytes;
	uint64_t key;
	uint64_t payload;
	uint64_t n_items;
	uint8_t reserved[PACK_HEADER - 40];
};
_Static_assert(sizeof(struct pack_header) == PACK_HEADER, "the header is 64 bytes");

struct pack_cache {
	int fd;
	bool writing, committed;
	uint64_t payload, done;         /* payload bytes in all, and read or written so far */
	uint64_t released;              /* payload offset up to which the pages went back */
	struct pack_hash h;
	char path[PATH_MAX];
	char part[PATH_MAX + 32];
};

#define PACK_P1 0x9e3779b185ebca87ull
#define PACK_P2 0xc2b2ae3d27d4eb4full
#define PACK_P3 0x165667b19e3779f9ull

static inline uint64_t rotl64(uint64_t x, int r)
{
	return (x << r) | (x >> (64 - r));
}

static inline uint64_t pack_round(uint64_t acc, uint64_t v)
{
	return rotl64(acc + v * PACK_P2, 31) * PACK_P1;
}

static void pack_hash_block(struct pack_hash *h, const uint8_t *p)
{
	for (int i = 0; i < 4; i++) {
		uint64_t v;
		memcpy(&v, p + 8 * i, 8);
		h->lane[i] = pack_round(h->lane[i], v);
	}
}

void pack_hash_init(struct pack_hash *h)
{
	memset(h, 0, sizeof *h);
	for (int i = 0; i < 4; i++)
		h->lane[i] = PACK_P3 * (uint64_t)(i + 1);
}

void pack_hash_add(struct pack_hash *h, const void *src, size_t n)
{
	const uint8_t *p = src;
	h->total += n;
	if (h->n_buf) {
		size_t take = 32 - h->n_buf < n ? 32 - h->n_buf : n;
		memcpy(h->buf + h->n_buf, p, take);
		h->n_buf += take;
		p += take;
		n -= take;
		if (h->n_buf < 32)
			return;
		pack_hash_block(h, h->buf);
		h->n_buf = 0;
	}
	for (; n >= 32; p += 32, n -= 32)
		pack_hash_block(h, p);
	memcpy(h->buf, p, n);
	h->n_buf = n;
}

uint64_t pack_hash_end(const struct pack_hash *h)
{
	uint64_t r = h->total * PACK_P1;
	for (int i = 0; i < 4; i++)
		r = pack_round(r ^ h->lane[i], (uint64_t)i);
	for (size_t i = 0; i < h->n_buf; i++)
		r = pack_round(r, h->buf[i]);
	r ^= r >> 33;
	r *= PACK_P2;
	r ^= r >> 29;
	return r;
}

static void pack_release(struct pack_cache *pc, bool all)
{
	if (!all && pc->done - pc->released < PACK_RELEASE_BYTES)
		return;
	off_t from = (off_t)(PACK_HEADER + pc->released), len = (off_t)(pc->done - pc->released);
	if (pc->writing)
		/* Dirty pages cannot be dropped: have them written first. */
		sync_file_range(pc->fd, from, len, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
						  SYNC_FILE_RANGE_WAIT_AFTER);
	posix_fadvise(pc->fd, from, len, POSIX_FADV_DONTNEED);
	pc->released = pc->done;
}

static int pack_new(struct pack_cache **out, const char *path, uint64_t payload, bool writing,
		    struct hearth_error *err)
{
	struct pack_cache *pc = calloc(1, sizeof *pc);
	if (!pc)
		return hearth_error_set(err, HEARTH_ENOMEM, "weights cache: out of memory");
	pc->fd = -1;
	pc->payload = payload;
	pc->writing = writing;
	if (snprintf(pc->path, sizeof pc->path, "%s", path) >= (int)sizeof pc->path) {
		free(pc);
		return hearth_error_set(err, HEARTH_ERANGE, "weights cache %.64s...: path too long", path);
	}
	pack_hash_init(&pc->h);
	*out = pc;
	return 0;
}

/* n bytes at off, all of them, read or written as pc goes, or an error naming what came
 * short. */
static int pack_io(struct pack_cache *pc, void *buf, size_t n, uint64_t off, struct hearth_error *err)
{
	uint8_t *p = buf;
	while (n) {
		ssize_t r = pc->writing ? pwrite(pc->fd, p, n, (off_t)off) : pread(pc->fd, p, n, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return hearth_error_errno(err, HEARTH_EIO, errno, "weights cache %s: %s",
						  pc->writing ? pc->part : pc->path, pc->writing ? "write" : "read");
		if (r == 0)
			return hearth_error_set(err, HEARTH_EINVAL, "weights cache %s: ends early at byte %llu", pc->path,
						(unsigned long long)off);
		p += r;
		n -= (size_t)r;
		off += (uint64_t)r;
	}
	return 0;
}

/* The payload's next n bytes through buf, read or written as pc goes, into the checksum. */
static int pack_stream(struct pack_cache *pc, void *buf, size_t n, struct hearth_error *err)
{
	if (n > pc->payload - pc->done)
		return hearth_error_set(err, HEARTH_EINVAL, "weights cache %s: a %s past its %llu bytes",
					pc->writing ? pc->part : pc->path, pc->writing ? "write" : "read",
					(unsigned long long)pc->payload);
	int rc = pack_io(pc, buf, n, PACK_HEADER + pc->done, err);
	if (rc < 0)
		return rc;
	pack_hash_add(&pc->h, buf, n);
	pc->done += n;
	pack_release(pc, !pc->writing && pc->done == pc->payload);
	return 0;
}

int pack_cache_open(struct pack_cache **out, const char *path, uint64_t key, uint64_t payload,
		    uint64_t n_items, struct hearth_error *err)
{
	struct pack_cache *pc;
	*out = NULL;
	int rc = pack_new(&pc, path, payload, false, err);
	if (rc < 0)
		return rc;
	pc->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (pc->fd < 0) {
		int e = errno;
		pack_cache_close(pc);
		return hearth_error_errno(err, e == ENOENT ? HEARTH_ENOTFOUND : HEARTH_EIO, e, "weights cache %s", path);
	}
	struct stat st;
	struct pack_header hd;
	if (fstat(pc->fd, &st) < 0) {
		rc = hearth_error_errno(err, HEARTH_EIO, errno, "weights cache %s: stat", path);
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = hearth_error_set(err, HEARTH_EINVAL, "weights cache %s: not a regular file", path);
		goto fail;
	}
	if ((uint64_t)st.st_size < PACK_HEADER) {
		rc = hearth_error_set(err, HEARTH_EINVAL, "weights cache %s: %lld bytes, shorter than its header", path,
				      (long long)st.st_size);
		goto fail;
	}
	if ((rc = pack_io(pc, &hd, sizeof hd, 0, err)) < 0)
		goto fail;
	if (memcmp(hd.magic, PACK_MAGIC, sizeof hd.magic) || hd.header_bytes != PACK_HEADER) {
		rc = hearth_error_set(err, HEARTH_EINVAL, "weights cache %s: not a packed-weights file", path);
		goto fail;
	}
	if (hd.format != PACK_CACHE_FORMAT) {
		rc = hearth_error_set(err, HEARTH_EINVAL, "weights cache %s: format %u, this hearthd writes %u", path,
				      hd.format, PACK_CACHE_FORMAT);
		goto fail;
	}
	if (hd.key != key || hd.payload != payload || hd.n_items != n_items) {
		rc = hearth_error_set(err, HEARTH_EINVAL,
				      "weights cache %s: made for another model file, imatrix, layout or hearthd version", path);
		goto fail;
	}
	if ((uint64_t)st.st_size != PACK_HEADER + payload + PACK_TRAILER) {
		rc = hearth_error_set(err, HEARTH_EINVAL, "weights cache %s: %lld bytes where its header says %llu", path,
				      (long long)st.st_size, (unsigned long long)(PACK_HEADER + payload + PACK_TRAILER));
		goto fail;
	}
	posix_fadvise(pc->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	*out = pc;
	return 0;
fail:
	pack_cache_close(pc);
	return rc;
}

int pack_cache_read(struct pack_cache *pc, void *dst, size_t n, struct hearth_error *err)
{
	return pack_stream(pc, dst, n, err);
}

int pack_cache_verify(struct pack_cache *pc, struct hearth_error *err)
{
	uint64_t sum;
	if (pc->done != pc->payload)
		return hearth_error_set(err, HEARTH_EINVAL, "weights cache %s: %llu of its %llu bytes read", pc->path,
					(unsigned long long)pc->done, (unsigned long long)pc->payload);
	int rc = pack_io(pc, &sum, sizeof sum, PACK_HEADER + pc->payload, err);
	if (rc < 0)
		return rc;
	posix_fadvise(pc->fd, 0, 0, POSIX_FADV_DONTNEED);
	if (sum != pack_hash_end(&pc->h))
		return hearth_error_set(err, HEARTH_EINVAL, "weights cache %s: its contents do not match their checksum",
					pc->path);
	return 0;
}

int pack_cache_create(struct pack_cache **out, const char *path, uint64_t key, uint64_t payload,
		      uint64_t n_items, struct hearth_error *err)
{
	struct pack_cache *pc;
	*out = NULL;
	int rc = pack_new(&pc, path, payload, true, err);
	if (rc < 0)
		return rc;
	snprintf(pc->part, sizeof pc->part, "%s.%ld.part", path, (long)getpid());
	pc->fd = open(pc->part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0640);
	if (pc->fd < 0) {
		rc = hearth_error_errno(err, HEARTH_EIO, errno, "weights cache %s", pc->part);
		pc->part[0] = '\0'; /* nothing of ours to remove */
		pack_cache_close(pc);
		return rc;
	}
	struct pack_header hd = { .format = PACK_CACHE_FORMAT, .header_bytes = PACK_HEADER, .key = key,
				  .payload = payload, .n_items = n_items };
	memcpy(hd.magic, PACK_MAGIC, sizeof hd.magic);
	if ((rc = pack_io(pc, &hd, sizeof hd, 0, err)) < 0) {
		pack_cache_close(pc);
		return rc;
	}
	*out = pc;
	return 0;
}

int pack_cache_write(struct pack_cache *pc, const void *src, size_t n, struct hearth_error *err)
{
	return pack_stream(pc, (void *)src, n, err);
}

int pack_cache_commit(struct pack_cache *pc, struct hearth_error *err)
{
	if (pc->done != pc->payload)
		return hearth_error_set(err, HEARTH_EINVAL, "weights cache %s: %llu of its %llu bytes written", pc->part,
					(unsigned long long)pc->done, (unsigned long long)pc->payload);
	uint64_t sum = pack_hash_end(&pc->h);
	int rc = pack_io(pc, &sum, sizeof sum, PACK_HEADER + pc->payload, err);
	if (rc < 0)
		return rc;
	if (fdatasync(pc->fd) < 0)
		return hearth_error_errno(err, HEARTH_EIO, errno, "weights cache %s: flush", pc->part);
	pack_release(pc, true);
	if (rename(pc->part, pc->path) < 0)
		return hearth_error_errno(err, HEARTH_EIO, errno, "weights cache: rename %s to %s", pc->part, pc->path);
	pc->committed = true;
	return 0;
}

void pack_cache_close(struct pack_cache *pc)
{
	if (!pc)
		return;
	if (pc->fd >= 0)
		close(pc->fd);
	if (pc->writing && !pc->committed && pc->part[0])
		unlink(pc->part);
	free(pc);
}
