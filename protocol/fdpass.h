/* Passing file descriptors over the Unix socket with SCM_RIGHTS: the daemon sends the
 * ring's memfd and eventfds along with the bytes of the `welcome` frame; the client reads
 * every chunk with fdpass_recv so descriptors are never lost or leaked. */
#ifndef HEARTH_PROTOCOL_FDPASS_H
#define HEARTH_PROTOCOL_FDPASS_H

#include <stddef.h>

#include "protocol/error.h"

#define FDPASS_MAX 4

/* One sendmsg of len bytes with nfds (<= FDPASS_MAX) descriptors attached to the first byte.
 * Returns 0 and *sent (possibly < len: the caller writes the rest normally, without fds);
 * HEARTH_EBUSY when the socket would block and nothing was sent; HEARTH_ECLOSED on EPIPE;
 * HEARTH_EIO otherwise. Never raises SIGPIPE. */
int fdpass_send(int sock, const void *data, size_t len, const int *fds, size_t nfds,
		size_t *sent, struct hearth_error *err);

/* One recvmsg into buf. Returns 0 with *got bytes (0 = the peer closed) and the descriptors
 * that came with them in fds[0..*nfds) (close-on-exec; the caller owns them). More than
 * max_fds descriptors, or a truncated control message, closes every received descriptor
 * and returns HEARTH_EPROTO. HEARTH_EBUSY when nothing is ready (non-blocking socket). */
int fdpass_recv(int sock, void *buf, size_t cap, size_t *got, int *fds, size_t max_fds,
		size_t *nfds, struct hearth_error *err);

#endif
