/* What the file targets (fuzz_gguf, fuzz_pack_cache) share: the input as a file, opened as
 * hearthd opens one (from a memfd, by its /proc/self/fd path), and the rule every refusal of
 * it keeps: a message that names the file. */
#ifndef HEARTH_TESTS_FUZZ_FILE_H
#define HEARTH_TESTS_FUZZ_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "protocol/error.h"

/* The input's bytes in a new memfd; its path (cap bytes) in path. Returns the fd. */
int fuzz_file(const uint8_t *data, size_t size, char *path, size_t cap);
/* rc a failure whose message is there and names path (FUZZ_CHECK). */
void fuzz_check_named(int rc, const struct hearth_error *err, const char *path);

#endif
