/* hearthd's side of the systemd contract (sd-daemon): readiness, status text, reload and
 * stop notifications, the watchdog, and the listening socket of socket activation. Each call
 * is a no-op returning 0 when the daemon was not started by systemd, so the same code runs
 * under systemd and by hand. The daemon decides when to call; nothing here logs. */
#ifndef HEARTH_DAEMON_SYSTEMD_H
#define HEARTH_DAEMON_SYSTEMD_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "protocol/error.h"

/* Every notify call returns 1 when the message was sent, 0 when $NOTIFY_SOCKET is unset
 * (not under systemd, or not Type=notify), or HEARTH_EIO. A failed notification is worth a
 * warning in the log, never a reason to stop serving.
 *
 * status, where a call takes one, may be NULL; otherwise it goes out as STATUS= in the same
 * datagram, so `systemctl status` never shows READY without the words that go with it.
 * Control characters in status text become spaces: a newline would start another
 * notification field (a model name from a GGUF file must not be able to send READY=1). */

/* READY=1: start-up is complete (model loaded, repacked, warmed up) and after a reload. */
int systemd_notify_ready(const char *status, struct hearth_error *err);

/* STATUS=<text>, printf-style: "loading blk.12 (43%)", "repacking", "warming up",
 * "3 clients, 2 running, 41 tok/s". Texts longer than 256 bytes are cut. */
int systemd_notify_status(struct hearth_error *err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* STOPPING=1: shutdown has begun (SIGTERM); send before draining clients. */
int systemd_notify_stopping(const char *status, struct hearth_error *err);

/* RELOADING=1 with MONOTONIC_USEC=<CLOCK_MONOTONIC now> (systemd >= 253 matches the two to
 * tell this reload from an earlier one; older versions ignore the field). Follow with
 * systemd_notify_ready once the new configuration is in force, even if it was rejected. */
int systemd_notify_reloading(const char *status, struct hearth_error *err);

/* MAINPID=<pid>. Only needed if the serving process is not the one systemd started. */
int systemd_notify_mainpid(pid_t pid, struct hearth_error *err);

/* EXTEND_TIMEOUT_USEC=<usec>: during a long load, pushes the start timeout usec ahead of
 * now. Send with each load-progress status so TimeoutStartSec= can stay short for a hang
 * while a large model that keeps making progress still gets to finish. */
int systemd_notify_extend_timeout(uint64_t usec, struct hearth_error *err);

/* WATCHDOG=1. Call from the loop thread, only when systemd_progress_check says the
 * compute side is healthy (see below for the timing). */
int systemd_watchdog_ping(struct hearth_error *err);

/* The interval of WatchdogSec= for this process: returns 1 and sets *usec when
 * $WATCHDOG_USEC is set (and $WATCHDOG_PID, if set, is this process), 0 when there is no
 * watchdog, HEARTH_EINVAL when the variables are malformed. */
int systemd_watchdog_interval(uint64_t *usec, struct hearth_error *err);

/* Progress gate for the watchdog. The compute side already counts finished forward steps
 * (sched's `steps`); the loop thread feeds that count and whether there is work the compute
 * side could be doing, and pings only when this returns true:
 *   - no work pending: healthy (an idle daemon makes no steps and is fine);
 *   - the step count moved since the previous check: healthy;
 *   - work pending, first seen this check after an idle one: healthy, stall clock starts;
 *   - work pending and the count unchanged for stall_usec since it last moved (or since the
 *     work was first seen): stalled, do not ping.
 * With a timer every interval/4 and stall_usec = interval/2, one step may take up to half
 * of WatchdogSec=; a real hang stops the pings and systemd kills and restarts the daemon
 * at most stall_usec + WatchdogSec= after the last step.
 * "Work pending" must exclude sequences that wait only on a client (a full ring): a slow
 * reader is not a hang. The struct is loop-thread state; it holds no atomics because it
 * sees only the values the caller read (e.g. atomic loads of sched's counters). */
struct systemd_progress {
	uint64_t steps;         /* step count at the previous check */
	uint64_t since_usec;    /* when the count last moved, or work was first seen */
	bool busy;              /* work was pending at the previous check */
};

/* now_usec: any monotonic clock in microseconds (uv_hrtime() / 1000 will do). */
void systemd_progress_init(struct systemd_progress *p, uint64_t steps, uint64_t now_usec);
bool systemd_progress_check(struct systemd_progress *p, uint64_t steps, bool work_pending,
			    uint64_t now_usec, uint64_t stall_usec);

/* The listening socket systemd passed (hearthd.socket). Returns 1 and sets *fd (close-on-exec
 * already set) when exactly one AF_UNIX SOCK_STREAM listening socket was passed; 0 when none
 * was passed ($LISTEN_FDS unset or meant for another process): the server then creates the
 * socket from the config. HEARTH_EINVAL when more than one fd or a socket of another kind was
 * passed (a misconfigured hearthd.socket). Clears $LISTEN_FDS, $LISTEN_PID, $LISTEN_FDNAMES,
 * so call once, at start-up, before any thread exists (setenv/unsetenv are not thread-safe). */
int systemd_listen_fd(int *fd, struct hearth_error *err);

#endif
