/* Claiming the socket path hearthd binds itself (no socket from systemd): one daemon per
 * path. A lock file beside the socket settles two daemons starting at once, and a connect
 * probe catches a live daemon that holds no lock; only a socket nobody answers on is
 * replaced. */
#ifndef HEARTH_DAEMON_SOCKPATH_H
#define HEARTH_DAEMON_SOCKPATH_H

#include "protocol/error.h"

/* Takes PATH.lock (flock, kept in *lock_fd for the daemon's life: close it to let go),
 * then makes path free to bind: nothing there, or a stale socket, which is unlinked.
 * HEARTH_EBUSY when another daemon holds the lock or answers on path, HEARTH_EINVAL when
 * path exists and is not a socket, HEARTH_EIO otherwise; err names the path. */
int sockpath_claim(const char *path, int *lock_fd, struct hearth_error *err);

#endif
