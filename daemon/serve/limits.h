/* What one peer may cost the daemon, enforced on the loop thread: connections in all and
 * per uid (max_clients, max_clients_per_uid), how long a peer may take over its hello or
 * over one frame (client_timeout), and the bytes of replies it leaves unread
 * (client_send_queue). A peer over a bound is refused, paused or closed with a log line
 * that names the bound; hearthd.conf(5) documents each key. */
#ifndef HEARTH_DAEMON_LIMITS_H
#define HEARTH_DAEMON_LIMITS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/error.h"

struct server;
struct session;

/* Largest frame accepted before the welcome: a hello is well under 1 KiB, so a peer that
 * has not said who it is cannot make the daemon buffer a 1 MiB frame. */
#define LIMITS_HELLO_FRAME_MAX (16u << 10)
/* What one queued reply costs besides its bytes (the write request and the allocator's
 * headers), counted against client_send_queue so that a flood of tiny replies is bounded
 * by memory rather than by payload bytes alone. */
#define LIMITS_WRITE_OVERHEAD 256u
/* A frame reader's buffer above this is given back once it is empty. */
#define LIMITS_READ_KEEP (64u << 10)

/* Per-session state, zeroed with the session. */
struct limits_peer {
	uint64_t since_ns;        /* accepted at; then when the current partial frame began */
	uint64_t queued;          /* reply bytes (plus overhead) written to libuv, not yet sent */
	uint64_t over_since_ns;   /* when reading paused; 0 while reading */
	uint32_t pauses;          /* times reading paused (the first is logged at info) */
	uint32_t offloaded;       /* requests on the thread pool (offload.c) */
	bool paused;              /* reading stopped: queued went over the bound and has not
	                           * yet fallen to half of it */
};

/* At accept, after the peer's credentials are known: HEARTH_EBUSY with the bound's name
 * when max_clients or max_clients_per_uid is reached (the new session is already listed,
 * and is not counted against itself). */
int limits_admit(struct server *srv, struct session *ss, struct hearth_error *err);

/* A reply of len bytes went to libuv / one finished. Reading pauses when the queue goes
 * over client_send_queue and resumes once it is down to half (so a peer reading slowly
 * does not flap between the two at every reply). */
void limits_queued(struct session *ss, size_t len);
void limits_sent(struct session *ss, size_t len);
bool limits_over(const struct session *ss);

/* After each read: starts or clears the partial-frame clock, and gives back a large read
 * buffer once it is empty. */
void limits_after_read(struct session *ss);

/* From the server's tick: closes peers still without a hello, or inside one frame, after
 * client_timeout, and peers whose reply queue stayed over its bound for client_timeout. */
void limits_sweep(struct server *srv);

#endif
