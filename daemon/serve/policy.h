/* Who may use hearthd, and how much of it at once: the peer credentials of each connection
 * (SO_PEERCRED) checked against allow_users / allow_groups, and a per-uid count of
 * concurrent requests. Owned and called by the loop thread only. */
#ifndef HEARTH_DAEMON_POLICY_H
#define HEARTH_DAEMON_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "daemon/serve/config.h"
#include "protocol/error.h"

/* The rules, in the order they are applied:
 *   1. uid 0 and the daemon's own uid are always allowed. Root can read the daemon's memory
 *      and replace its binary anyway, so refusing it protects nothing and only breaks
 *      `hearth stats` for the administrator; the daemon's own uid covers health checks run
 *      as the service user.
 *   2. If allow_users and allow_groups are both empty, every peer is allowed: whoever can
 *      open the socket (its mode and group, SocketMode=0660 SocketGroup=hearth) may use it.
 *   3. Else a peer is allowed when its uid is in allow_users, or its primary gid (from
 *      SO_PEERCRED, the gid it connected with), or any group the user database gives it
 *      (getgrouplist on the uid's passwd entry) is in allow_groups.
 * The group database is read on every check, so adding a user to a group takes effect on
 * its next connection without a reload; a uid with no passwd entry is matched by uid and
 * primary gid only. The lookup is a blocking NSS call on the loop thread: fine for files
 * and sssd caches, slow with a remote directory (then list uids instead of groups). */
struct policy {
	uid_t self_uid;
	uid_t allow_uids[CONFIG_LIST_MAX];
	size_t n_allow_uids;
	gid_t allow_gids[CONFIG_LIST_MAX];
	size_t n_allow_gids;
	uint32_t max_per_uid;          /* concurrent requests per uid (max_requests_per_uid) */
	/* Running requests per uid. Entries exist only while the count is non-zero, so the
	 * table is as long as the number of distinct uids with work in flight: a linear scan. */
	struct policy_uid_count {
		uid_t uid;
		uint32_t n;
	} *counts;
	size_t n_counts, cap_counts;
};

/* Takes allow_uids, allow_gids and max_requests_per_uid from cfg; self_uid = geteuid(). */
void policy_init(struct policy *p, const struct hearth_config *cfg);

/* Reload: new rules and limit, running counts kept. A lower limit does not cancel running
 * requests; it refuses new ones until the uid drops below it. */
void policy_update(struct policy *p, const struct hearth_config *cfg);

void policy_free(struct policy *p);

/* Reads the peer's credentials from a connected AF_UNIX socket into *cred (always, so the
 * caller can log who was refused) and applies the rules. HEARTH_EPERM with
 * "uid 1001 (pid 4242) is not allowed: ..." when refused; HEARTH_EIO when the
 * credentials cannot be read. */
int policy_check(const struct policy *p, int fd, struct ucred *cred, struct hearth_error *err);

/* The rules on credentials already read; groups are the supplementary groups to consider
 * (policy_check passes getgrouplist's answer). For tests and for callers that hold
 * credentials from elsewhere (SCM_CREDENTIALS). */
bool policy_allows(const struct policy *p, uid_t uid, gid_t gid, const gid_t *groups,
		   size_t n_groups);

/* One more running request for uid: 0, or HEARTH_EBUSY "uid 1001 already has 16 requests
 * running (max_requests_per_uid = 16)", or HEARTH_ENOMEM. Every successful acquire is
 * paired with one policy_uid_release when that request ends, however it ends. */
int policy_uid_acquire(struct policy *p, uid_t uid, struct hearth_error *err);
void policy_uid_release(struct policy *p, uid_t uid);

/* Requests running for uid now (0 when none). */
uint32_t policy_uid_running(const struct policy *p, uid_t uid);

#endif
