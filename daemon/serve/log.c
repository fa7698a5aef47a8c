/* The log line writer: journald priority prefix or timestamped plain text, one write(2) per
 * line so concurrent threads never interleave within a line. */
#include "daemon/serve/log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *const level_names[8] = {
	[LOG_LEVEL_ERROR] = "error",
	[LOG_LEVEL_WARNING] = "warning",
	[LOG_LEVEL_NOTICE] = "notice",
	[LOG_LEVEL_INFO] = "info",
	[LOG_LEVEL_DEBUG] = "debug",
};

/* JOURNAL_STREAM is "DEV:INODE" in decimal; anything else means "not the journal". */
static bool fd_is_journal_stream(int fd, const char *journal_stream)
{
	if (!journal_stream)
		return false;
	uintmax_t dev, ino;
	int end = 0;
	if (sscanf(journal_stream, "%ju:%ju%n", &dev, &ino, &end) != 2 || journal_stream[end])
		return false;
	struct stat st;
	if (fstat(fd, &st) != 0)
		return false;
	return (uintmax_t)st.st_dev == dev && (uintmax_t)st.st_ino == ino;
}

void log_open(struct log *lg, int fd, enum log_level level, const char *journal_stream)
{
	lg->fd = fd;
	lg->journal = fd_is_journal_stream(fd, journal_stream);
	atomic_init(&lg->level, (int)level);
}

void log_set_level(struct log *lg, enum log_level level)
{
	atomic_store_explicit(&lg->level, (int)level, memory_order_relaxed);
}

bool log_enabled(const struct log *lg, enum log_level level)
{
	return (int)level <= atomic_load_explicit(&lg->level, memory_order_relaxed);
}

static void write_all(int fd, const char *buf, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, buf, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return;
		}
		buf += w;
		n -= (size_t)w;
	}
}

void log_write(struct log *lg, enum log_level level, const char *fmt, ...)
{
	if (!log_enabled(lg, level))
		return;
	char line[LOG_LINE_MAX];
	size_t head;
	if (lg->journal) {
		head = (size_t)snprintf(line, sizeof line, "<%d>", (int)level);
	} else {
		struct timespec ts;
		struct tm tm;
		clock_gettime(CLOCK_REALTIME, &ts);
		localtime_r(&ts.tv_sec, &tm);
		size_t n = strftime(line, sizeof line, "%Y-%m-%d %H:%M:%S", &tm);
		n += (size_t)snprintf(line + n, sizeof line - n, ".%03ld %s: ", ts.tv_nsec / 1000000L,
				      log_level_name(level));
		head = n;
	}
	/* Room for the newline is kept back so a long message is cut, not its line end. */
	size_t room = sizeof line - head - 1;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line + head, room, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	size_t len = (size_t)n < room ? (size_t)n : room - 1;
	if ((size_t)n >= room && room > 4)
		memcpy(line + head + len - 3, "...", 3);
	for (size_t i = head; i < head + len; i++)
		if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f)
			line[i] = '?';
	line[head + len] = '\n';
	write_all(lg->fd, line, head + len + 1);
}

int log_level_parse(const char *text, enum log_level *out, struct hearth_error *err)
{
	for (int l = LOG_LEVEL_ERROR; l <= LOG_LEVEL_DEBUG; l++)
		if (strcmp(text, level_names[l]) == 0) {
			*out = (enum log_level)l;
			return 0;
		}
	return hearth_error_set(err, HEARTH_EINVAL,
				"bad log level '%s' (use error, warning, notice, info or debug)", text);
}

const char *log_level_name(enum log_level level)
{
	if ((int)level < LOG_LEVEL_ERROR || (int)level > LOG_LEVEL_DEBUG)
		return "unknown";
	return level_names[level];
}
