/* sendmsg/recvmsg with SCM_RIGHTS, kept apart from the ring so socket code and shared
 * memory code can be read (and tested) on their own. */
#include "protocol/fdpass.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

int fdpass_send(int sock, const void *data, size_t len, const int *fds, size_t nfds,
		size_t *sent, struct hearth_error *err)
{
	*sent = 0;
	if (nfds > FDPASS_MAX || len == 0)
		return hearth_error_set(err, HEARTH_EINVAL,
					"fdpass: %zu fds with %zu bytes (at most %d fds, at least 1 byte)",
					nfds, len, FDPASS_MAX);
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * FDPASS_MAX)];
	} ctl;
	memset(&ctl, 0, sizeof ctl);
	struct iovec iov = { .iov_base = (void *)data, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (nfds) {
		mh.msg_control = ctl.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	ssize_t n;
	do
		n = sendmsg(sock, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return hearth_error_set(err, HEARTH_EBUSY, "fdpass: socket full");
		if (errno == EPIPE || errno == ECONNRESET)
			return hearth_error_errno(err, HEARTH_ECLOSED, errno, "fdpass: sendmsg");
		return hearth_error_errno(err, HEARTH_EIO, errno, "fdpass: sendmsg");
	}
	*sent = (size_t)n;
	return 0;
}

int fdpass_recv(int sock, void *buf, size_t cap, size_t *got, int *fds, size_t max_fds,
		size_t *nfds, struct hearth_error *err)
{
	*got = 0;
	*nfds = 0;
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * FDPASS_MAX)];
	} ctl;
	struct iovec iov = { .iov_base = buf, .iov_len = cap };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
			     .msg_controllen = sizeof ctl.buf };
	ssize_t n;
	do
		n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return hearth_error_set(err, HEARTH_EBUSY, "fdpass: nothing to read");
		if (errno == ECONNRESET)
			return hearth_error_errno(err, HEARTH_ECLOSED, errno, "fdpass: recvmsg");
		return hearth_error_errno(err, HEARTH_EIO, errno, "fdpass: recvmsg");
	}
	/* Collect every descriptor first, so that on any refusal all of them get closed. */
	int recv_fds[FDPASS_MAX * 2];
	size_t count = 0;
	bool bad = (mh.msg_flags & MSG_CTRUNC) != 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
			bad = true;
			continue;
		}
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
			if (count < sizeof recv_fds / sizeof recv_fds[0])
				recv_fds[count++] = fd;
			else
				close(fd);
		}
	}
	if (bad || count > max_fds) {
		for (size_t i = 0; i < count; i++)
			close(recv_fds[i]);
		return hearth_error_set(err, HEARTH_EPROTO,
					"fdpass: %zu descriptors received (at most %zu expected)%s",
					count, max_fds, bad ? ", control data truncated" : "");
	}
	memcpy(fds, recv_fds, count * sizeof(int));
	*nfds = count;
	*got = (size_t)n;
	return 0;
}
