/* sd-daemon glue over libsystemd: notifications as single datagrams, the watchdog interval
 * and progress gate, and the socket-activation listening fd. */
#include "daemon/serve/systemd.h"
#include "protocol/clock.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <systemd/sd-daemon.h>
#include <time.h>

/* sd_notify's contract: >0 sent, 0 no $NOTIFY_SOCKET, <0 -errno. */
static int notify_send(const char *msg, const char *what, struct hearth_error *err)
{
	int r = sd_notify(0, msg);
	if (r < 0)
		return hearth_error_errno(err, HEARTH_EIO, -r, "sd_notify %s", what);
	return r > 0 ? 1 : 0;
}

/* Appends "\nSTATUS=<text>" with control characters blanked (see the header). */
static void append_status(char *buf, size_t size, const char *status)
{
	if (!status)
		return;
	size_t n = strlen(buf);
	int w = snprintf(buf + n, size - n, "%sSTATUS=", n ? "\n" : "");
	if (w < 0 || (size_t)w >= size - n)
		return;
	n += (size_t)w;
	for (const char *s = status; *s && n + 1 < size; s++)
		buf[n++] = ((unsigned char)*s < 0x20 || *s == 0x7f) ? ' ' : *s;
	buf[n] = '\0';
}

#define NOTIFY_MAX 320   /* a state word plus a 256-byte status */

static int notify_state(const char *state, const char *status, struct hearth_error *err)
{
	char msg[NOTIFY_MAX];
	snprintf(msg, sizeof msg, "%s", state);
	append_status(msg, sizeof msg, status);
	return notify_send(msg, state, err);
}

int systemd_notify_ready(const char *status, struct hearth_error *err)
{
	return notify_state("READY=1", status, err);
}

int systemd_notify_stopping(const char *status, struct hearth_error *err)
{
	return notify_state("STOPPING=1", status, err);
}

int systemd_notify_reloading(const char *status, struct hearth_error *err)
{
	uint64_t usec = hearth_now_ns() / 1000u;
	char state[64];
	snprintf(state, sizeof state, "RELOADING=1\nMONOTONIC_USEC=%llu", (unsigned long long)usec);
	return notify_state(state, status, err);
}

int systemd_notify_status(struct hearth_error *err, const char *fmt, ...)
{
	char text[257];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	char msg[NOTIFY_MAX] = "";
	append_status(msg, sizeof msg, text);
	return notify_send(msg, "STATUS", err);
}

int systemd_notify_mainpid(pid_t pid, struct hearth_error *err)
{
	char msg[48];
	snprintf(msg, sizeof msg, "MAINPID=%ld", (long)pid);
	return notify_send(msg, "MAINPID", err);
}

int systemd_notify_extend_timeout(uint64_t usec, struct hearth_error *err)
{
	char msg[64];
	snprintf(msg, sizeof msg, "EXTEND_TIMEOUT_USEC=%llu", (unsigned long long)usec);
	return notify_send(msg, "EXTEND_TIMEOUT_USEC", err);
}

int systemd_watchdog_ping(struct hearth_error *err)
{
	return notify_send("WATCHDOG=1", "WATCHDOG", err);
}

int systemd_watchdog_interval(uint64_t *usec, struct hearth_error *err)
{
	uint64_t u = 0;
	int r = sd_watchdog_enabled(0, &u);
	if (r < 0)
		return hearth_error_errno(err, HEARTH_EINVAL, -r,
					  "bad $WATCHDOG_USEC/$WATCHDOG_PID from systemd");
	if (r == 0)
		return 0;
	*usec = u;
	return 1;
}

void systemd_progress_init(struct systemd_progress *p, uint64_t steps, uint64_t now_usec)
{
	p->steps = steps;
	p->since_usec = now_usec;
	p->busy = false;
}

bool systemd_progress_check(struct systemd_progress *p, uint64_t steps, bool work_pending,
			    uint64_t now_usec, uint64_t stall_usec)
{
	/* The stall clock restarts whenever the compute side is seen moving, and when work is
	 * first seen after an idle spell: that work gets a full stall_usec for its first step
	 * however long the daemon sat idle before. */
	if (!work_pending || steps != p->steps || !p->busy) {
		p->steps = steps;
		p->since_usec = now_usec;
		p->busy = work_pending;
		return true;
	}
	return now_usec - p->since_usec < stall_usec;
}

int systemd_listen_fd(int *fd, struct hearth_error *err)
{
	int n = sd_listen_fds(1);
	if (n < 0)
		return hearth_error_errno(err, HEARTH_EINVAL, -n, "bad $LISTEN_FDS/$LISTEN_PID from systemd");
	if (n == 0)
		return 0;
	if (n > 1)
		return hearth_error_set(err, HEARTH_EINVAL,
					"systemd passed %d sockets, hearthd takes one "
					"(hearthd.socket must have a single ListenStream=)", n);
	int r = sd_is_socket_unix(SD_LISTEN_FDS_START, SOCK_STREAM, 1, NULL, 0);
	if (r < 0)
		return hearth_error_errno(err, HEARTH_EINVAL, -r, "fd %d passed by systemd",
					  SD_LISTEN_FDS_START);
	if (r == 0)
		return hearth_error_set(err, HEARTH_EINVAL,
					"fd %d passed by systemd is not a listening AF_UNIX stream socket "
					"(hearthd.socket must use ListenStream=/path)", SD_LISTEN_FDS_START);
	*fd = SD_LISTEN_FDS_START;
	return 1;
}
