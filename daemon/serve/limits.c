/* Per-peer bounds on the loop thread: admission by count, the hello and frame clocks, and
 * the unread-reply queue with its pause and close. Every refusal or close is logged with
 * the key that decided it, so an operator can tell a limit from a fault. */
#include "daemon/serve/limits.h"

#include "protocol/clock.h"

#include <stdlib.h>

#include "daemon/serve/serve.h"

int limits_admit(struct server *srv, struct session *ss, struct hearth_error *err)
{
	/* n_sessions already counts ss. */
	if (srv->n_sessions > srv->cfg.max_clients)
		return hearth_error_set(err, HEARTH_EBUSY,
					"%u clients are connected (max_clients = %u)",
					srv->n_sessions - 1, srv->cfg.max_clients);
	uint32_t same = 0;
	for (struct session *o = srv->sessions; o; o = o->next)
		if (o != ss && !o->closing && o->cred.uid == ss->cred.uid)
			same++;
	if (same >= srv->cfg.max_clients_per_uid)
		return hearth_error_set(err, HEARTH_EBUSY,
					"uid %lu already has %u connections (max_clients_per_uid = %u)",
					(unsigned long)ss->cred.uid, same, srv->cfg.max_clients_per_uid);
	return 0;
}

bool limits_over(const struct session *ss)
{
	return ss->lim.queued > ss->srv->cfg.client_send_queue;
}

void limits_queued(struct session *ss, size_t len)
{
	ss->lim.queued += len + LIMITS_WRITE_OVERHEAD;
	if (!limits_over(ss) || ss->lim.paused)
		return;
	/* Stop taking requests from a peer that does not take its answers. */
	ss->lim.over_since_ns = hearth_now_ns();
	ss->lim.paused = true;
	if (!ss->closing)
		uv_read_stop((uv_stream_t *)&ss->pipe);
	log_write(ss->srv->log, ss->lim.pauses++ ? LOG_LEVEL_DEBUG : LOG_LEVEL_INFO, "client %s (pid %d): %llu bytes of replies unread (client_send_queue = %llu): not reading its requests until it catches up",
		 ss->name, (int)ss->cred.pid, (unsigned long long)ss->lim.queued,
		 (unsigned long long)ss->srv->cfg.client_send_queue);
}

void limits_sent(struct session *ss, size_t len)
{
	uint64_t cost = len + LIMITS_WRITE_OVERHEAD;
	ss->lim.queued = ss->lim.queued > cost ? ss->lim.queued - cost : 0;
	if (!ss->lim.paused || ss->lim.queued > ss->srv->cfg.client_send_queue / 2)
		return;
	ss->lim.paused = false;
	ss->lim.over_since_ns = 0;
	if (!ss->closing && !ss->handle_closed)
		session_resume_reading(ss);
}

void limits_after_read(struct session *ss)
{
	bool partial = ss->reader.len > 0 || ss->reader.skip > 0;
	if (!partial) {
		if (ss->lim.since_ns && (ss->welcomed || ss->hello_pending || ss->welcome_deferred))
			ss->lim.since_ns = 0;
		frame_reader_trim(&ss->reader, LIMITS_READ_KEEP);
	} else if (!ss->lim.since_ns) {
		ss->lim.since_ns = hearth_now_ns();
	}
}

/* Why ss must go now, or NULL. */
static const char *limits_expired(const struct session *ss, uint64_t now, uint64_t timeout_ns)
{
	bool said_hello = ss->welcomed || ss->hello_pending || ss->welcome_deferred;
	/* While paused the daemon is not reading: a frame left half-read is its doing. */
	if (ss->lim.over_since_ns)
		return now - ss->lim.over_since_ns > timeout_ns
			       ? "its unread replies stayed over client_send_queue for client_timeout"
			       : NULL;
	if (ss->lim.since_ns && now - ss->lim.since_ns > timeout_ns)
		return said_hello ? "one frame took longer than client_timeout to arrive"
				  : "no hello within client_timeout";
	return NULL;
}

void limits_sweep(struct server *srv)
{
	uint64_t now = hearth_now_ns();
	uint64_t timeout_ns = srv->cfg.client_timeout_usec * 1000ull;
	for (struct session *ss = srv->sessions, *next; ss; ss = next) {
		next = ss->next;
		if (ss->closing)
			continue;
		const char *why = limits_expired(ss, now, timeout_ns);
		if (!why)
			continue;
		log_warning(srv->log, "client %s (uid %u, pid %d): closing: %s (%llu ms)", ss->name,
			    (unsigned)ss->cred.uid, (int)ss->cred.pid, why,
			    (unsigned long long)(srv->cfg.client_timeout_usec / 1000));
		session_close(ss);
	}
}
