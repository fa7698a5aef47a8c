/* hearthd's log: one line per message on a file descriptor (stderr), in journald's "<N>"
 * priority-prefix form when stderr is the journal's stream, else plain text with a local
 * timestamp. Library modules never log (errors are values); main, server, session and sched
 * do, through a struct log the caller owns and passes down. */
#ifndef HEARTH_DAEMON_LOG_H
#define HEARTH_DAEMON_LOG_H

#include <stdatomic.h>
#include <stdbool.h>

#include "protocol/error.h"

/* Values are syslog priorities, which is what journald's "<N>" prefix carries. */
enum log_level {
	LOG_LEVEL_ERROR = 3,
	LOG_LEVEL_WARNING = 4,
	LOG_LEVEL_NOTICE = 5,
	LOG_LEVEL_INFO = 6,
	LOG_LEVEL_DEBUG = 7,
};

/* Why not a process-wide logger: the codebase has no hidden mutable globals, and the only
 * code that logs (main, server, session, sched) already shares one context struct, so the
 * pointer costs nothing to carry and tests can capture output on a pipe per test.
 *
 * Threads: after log_open, any thread may call log_write on the same struct; each message
 * is formatted on the stack and leaves in one write(2), so lines from the loop thread and
 * the compute threads do not interleave (lines are capped at LOG_LINE_MAX bytes). The
 * level is atomic so a reload on the loop thread may change it while others log. */
struct log {
	int fd;
	bool journal;            /* "<N>" prefix, no timestamp: journald adds its own */
	_Atomic int level;       /* messages above it are dropped */
};

#define LOG_LINE_MAX 2048

/* Sets up lg to write to fd. journal_stream is the value of $JOURNAL_STREAM (NULL when
 * unset): systemd sets it to "DEV:INODE" of the stream it connected to stdout/stderr, and
 * the prefix form is used only when fd really is that stream, because a daemon started by
 * hand from a unit's shell inherits the variable with stderr pointing elsewhere. */
void log_open(struct log *lg, int fd, enum log_level level, const char *journal_stream);

void log_set_level(struct log *lg, enum log_level level);

/* Cheap test for callers that would otherwise build an expensive message for nothing. */
bool log_enabled(const struct log *lg, enum log_level level);

/* Writes one line. Control characters in the text (a newline in a model name, an escape
 * sequence from a client's string) become '?', so no message can forge a second line or
 * another entry's priority. Failures to write are ignored: there is nowhere to report them. */
void log_write(struct log *lg, enum log_level level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#define log_error(lg, ...) log_write((lg), LOG_LEVEL_ERROR, __VA_ARGS__)
#define log_warning(lg, ...) log_write((lg), LOG_LEVEL_WARNING, __VA_ARGS__)
#define log_notice(lg, ...) log_write((lg), LOG_LEVEL_NOTICE, __VA_ARGS__)
#define log_info(lg, ...) log_write((lg), LOG_LEVEL_INFO, __VA_ARGS__)
#define log_debug(lg, ...) log_write((lg), LOG_LEVEL_DEBUG, __VA_ARGS__)

/* "error", "warning", "notice", "info", "debug"; HEARTH_EINVAL for anything else
 * (the message lists the accepted words). */
int log_level_parse(const char *text, enum log_level *out, struct hearth_error *err);
const char *log_level_name(enum log_level level);

#endif
