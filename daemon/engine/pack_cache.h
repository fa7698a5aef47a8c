/* A file of packed weights kept between starts: the bytes the repack wrote into the arena,
 * in the plan's order, behind a header naming what they were made from (a key the loader
 * computes) and followed by a checksum of them. Reading it replaces the repack; the file
 * is only ever trusted as far as its header, size and checksum agree. */
#ifndef HEARTH_DAEMON_PACK_CACHE_H
#define HEARTH_DAEMON_PACK_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/error.h"

/* Bumped whenever a packer would write other bytes for the same matrix and options (a
 * change of rounding, of a layout, of the key's fields): every older file then misses.
 * tests/unit/test_load holds the packers' bytes on two fixtures to hashes recorded with it,
 * so a change of bytes without a bump fails there. */
#define PACK_CACHE_FORMAT 1u

struct pack_cache;

/* A running checksum of a byte stream, however it is cut into pieces (four 64-bit lanes
 * of multiply-rotate rounds: about 10 GB/s on one core, so a gigabyte of weights costs a
 * tenth of a second; it finds damage and truncation, it is no defence against a writer
 * who means harm, and the file sits in the daemon's own cache directory). */
struct pack_hash {
	uint64_t lane[4];
	uint64_t total;
	uint8_t buf[32];
	size_t n_buf;
};

void pack_hash_init(struct pack_hash *h);
void pack_hash_add(struct pack_hash *h, const void *p, size_t n);
uint64_t pack_hash_end(const struct pack_hash *h);

/* Opens path for reading when its header says it holds payload bytes in n_items pieces
 * made under key, and its size agrees. HEARTH_ENOTFOUND: no such file (the usual first
 * start); HEARTH_EINVAL: a file that is not one, of another format, made for another key
 * or of the wrong size, the message saying which. */
int pack_cache_open(struct pack_cache **out, const char *path, uint64_t key, uint64_t payload,
		    uint64_t n_items, struct hearth_error *err);
/* The next n bytes of the payload into dst, the file's pages given back as they are read
 * (it is read once). */
int pack_cache_read(struct pack_cache *pc, void *dst, size_t n, struct hearth_error *err);
/* After the whole payload: HEARTH_EINVAL unless its checksum is the file's. */
int pack_cache_verify(struct pack_cache *pc, struct hearth_error *err);

/* Starts path's replacement as path.<pid>.part (mode 0640), a header for key, payload
 * bytes and n_items. */
int pack_cache_create(struct pack_cache **out, const char *path, uint64_t key, uint64_t payload,
		      uint64_t n_items, struct hearth_error *err);
/* Appends n bytes of the payload; the written pages leave the page cache as they reach the
 * disk, so a gigabyte written does not sit there. */
int pack_cache_write(struct pack_cache *pc, const void *src, size_t n, struct hearth_error *err);
/* After exactly payload bytes: the checksum, then flushed and renamed over path, so a crash
 * at any point leaves either the old file or the new one, never half of one. */
int pack_cache_commit(struct pack_cache *pc, struct hearth_error *err);

/* Closes pc (NULL is fine); a replacement not committed is removed. */
void pack_cache_close(struct pack_cache *pc);

#endif
