/* The socket path's lock and the live-daemon probe; see sockpath.h. */
#include "daemon/serve/sockpath.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* 1 when something accepts connections on path, 0 when nothing does (a stale file). */
static int sockpath_live(const char *path, struct hearth_error *err)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return hearth_error_errno(err, HEARTH_EIO, errno, "socket");
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
	int rc = connect(fd, (struct sockaddr *)&a, sizeof a);
	int saved = errno;
	close(fd);
	if (rc == 0)
		return 1;
	/* ECONNREFUSED: no listener behind the file. EAGAIN: a listener whose backlog is full
	 * is alive all the same. */
	if (saved == EAGAIN)
		return 1;
	return 0;
}

int sockpath_claim(const char *path, int *lock_fd, struct hearth_error *err)
{
	*lock_fd = -1;
	char lock_path[4200];
	snprintf(lock_path, sizeof lock_path, "%s.lock", path);
	int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return hearth_error_errno(err, HEARTH_EIO, errno, "cannot open the lock file %s",
					  lock_path);
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		int saved = errno;
		close(fd);
		if (saved == EWOULDBLOCK)
			return hearth_error_set(err, HEARTH_EBUSY,
						"another hearthd holds %s: it serves %s", lock_path, path);
		return hearth_error_errno(err, HEARTH_EIO, saved, "cannot lock %s", lock_path);
	}
	struct stat st;
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode)) {
			close(fd);
			return hearth_error_set(err, HEARTH_EINVAL,
						"socket path %s exists and is not a socket", path);
		}
		int live = sockpath_live(path, err);
		if (live != 0) {
			close(fd);
			return live < 0 ? live
					: hearth_error_set(err, HEARTH_EBUSY,
							   "a daemon already answers on %s: not taking it over",
							   path);
		}
		/* Left by a daemon that died: nobody listens, so it is ours to replace. */
		unlink(path);
	}
	*lock_fd = fd;
	return 0;
}
