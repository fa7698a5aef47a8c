/* The file targets' shared part (fuzz_file.h). */
#include "tests/fuzz/fuzz_file.h"

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/fuzz/fuzz.h"

int fuzz_file(const uint8_t *data, size_t size, char *path, size_t cap)
{
	int fd = memfd_create("fuzz.file", MFD_CLOEXEC);
	FUZZ_CHECK(fd >= 0);
	for (size_t at = 0; at < size;) {
		ssize_t k = write(fd, data + at, size - at);
		FUZZ_CHECK(k > 0);
		at += (size_t)k;
	}
	snprintf(path, cap, "/proc/self/fd/%d", fd);
	return fd;
}

void fuzz_check_named(int rc, const struct hearth_error *err, const char *path)
{
	FUZZ_CHECK(rc < 0);
	FUZZ_CHECK(err->msg[0] != '\0');
	FUZZ_CHECK(strstr(err->msg, path) != NULL);
}
