/* What every hearthd-tool command needs from its command line and its input files: an
 * integer option checked against its range, and a whole file read into memory, each failing
 * with a message that names the command, the option or the file. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/tools/tools.h"

int tool_parse_long(const char *cmd, const char *name, const char *s, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi) {
		fprintf(stderr, "hearthd-tool %s: %s '%s' is not an integer in %ld..%ld\n", cmd, name, s, lo, hi);
		return -1;
	}
	*out = v;
	return 0;
}

int tool_read_file(const char *path, size_t max, char **out, size_t *len, struct hearth_error *err)
{
	FILE *fp = fopen(path, "rb");
	if (!fp)
		return hearth_error_errno(err, HEARTH_EIO, errno, "cannot read %s", path);
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap);
	int rc = 0;
	while (buf && rc == 0) {
		if (n == cap) {
			char *more = cap < max ? realloc(buf, 2 * cap) : NULL;
			if (!more) {
				rc = cap < max ? hearth_error_set(err, HEARTH_ENOMEM, "out of memory reading %s", path)
					       : hearth_error_set(err, HEARTH_ERANGE, "%s: larger than %zu MiB", path,
								  max >> 20);
				break;
			}
			buf = more;
			cap *= 2;
		}
		size_t k = fread(buf + n, 1, cap - n, fp);
		if (!k)
			break;
		n += k;
	}
	if (!buf)
		rc = hearth_error_set(err, HEARTH_ENOMEM, "out of memory reading %s", path);
	else if (rc == 0 && ferror(fp))
		rc = hearth_error_errno(err, HEARTH_EIO, errno, "cannot read %s", path);
	fclose(fp);
	if (rc < 0) {
		free(buf);
		return rc;
	}
	*out = buf;
	*len = n;
	return 0;
}
