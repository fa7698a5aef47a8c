/* Parsing and printing of the quantities people write in config files and flags: byte sizes
 * ("192MiB", "1GiB") and durations ("10s", "500ms"). In protocol/, the library every
 * program links, so hearthd's config, the tools and the benchmarks accept and print the same
 * spellings without linking the daemon. */
#ifndef HEARTH_PROTOCOL_UNITS_H
#define HEARTH_PROTOCOL_UNITS_H

#include <stddef.h>
#include <stdint.h>

#include "protocol/error.h"

/* A byte size: digits, optional blanks, optional suffix B, K/KiB, M/MiB, G/GiB, T/TiB (all
 * powers of 1024; a bare number is bytes). Decimal suffixes (kB, MB, GB) and fractions are
 * refused rather than guessed at: "1.5GB" could mean three different numbers. Returns 0,
 * or HEARTH_EINVAL / HEARTH_ERANGE with a message that quotes the text. */
int units_parse_size(const char *text, uint64_t *out, struct hearth_error *err);

/* A duration in microseconds: digits with suffix us, ms, s, min, h; a bare number is seconds
 * (the unit a person means when writing "shutdown_grace = 10"). */
int units_parse_duration(const char *text, uint64_t *out_usec, struct hearth_error *err);

/* The exact, shortest spelling that units_parse_size reads back to the same value: "256MiB",
 * "1536KiB", "1000" (bytes). Returns buf. A 16-byte buffer always suffices. */
char *units_format_size(uint64_t bytes, char *buf, size_t size);

/* Likewise for durations: "10s", "1500ms", "250us". */
char *units_format_duration(uint64_t usec, char *buf, size_t size);

#endif
