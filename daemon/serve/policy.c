/* Peer credential checks and the per-uid request table. The kernel's SO_PEERCRED answer is
 * the only identity trusted: nothing a client sends about itself is. */
#include "daemon/serve/policy.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void policy_rules_set(struct policy *p, const struct hearth_config *cfg)
{
	memcpy(p->allow_uids, cfg->allow_uids, sizeof p->allow_uids);
	p->n_allow_uids = cfg->n_allow_uids;
	memcpy(p->allow_gids, cfg->allow_gids, sizeof p->allow_gids);
	p->n_allow_gids = cfg->n_allow_gids;
	p->max_per_uid = cfg->max_requests_per_uid;
}

void policy_init(struct policy *p, const struct hearth_config *cfg)
{
	memset(p, 0, sizeof *p);
	p->self_uid = geteuid();
	policy_rules_set(p, cfg);
}

void policy_update(struct policy *p, const struct hearth_config *cfg)
{
	policy_rules_set(p, cfg);
}

void policy_free(struct policy *p)
{
	free(p->counts);
	p->counts = NULL;
	p->n_counts = p->cap_counts = 0;
}

static bool gid_listed(const struct policy *p, gid_t gid)
{
	for (size_t i = 0; i < p->n_allow_gids; i++)
		if (p->allow_gids[i] == gid)
			return true;
	return false;
}

bool policy_allows(const struct policy *p, uid_t uid, gid_t gid, const gid_t *groups,
		   size_t n_groups)
{
	if (uid == 0 || uid == p->self_uid)
		return true;
	if (p->n_allow_uids == 0 && p->n_allow_gids == 0)
		return true;
	for (size_t i = 0; i < p->n_allow_uids; i++)
		if (p->allow_uids[i] == uid)
			return true;
	if (gid_listed(p, gid))
		return true;
	for (size_t i = 0; i < n_groups; i++)
		if (gid_listed(p, groups[i]))
			return true;
	return false;
}

/* The user database's groups for uid, into a malloc'd array (*groups, NULL when the uid has
 * no passwd entry or memory ran out: the check then falls back to uid and primary gid,
 * which can only refuse more, never allow more). */
static size_t user_groups(uid_t uid, gid_t **groups)
{
	*groups = NULL;
	char buf[16384];
	struct passwd pw, *res = NULL;
	if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) != 0 || !res)
		return 0;
	int n = 32;
	for (int tries = 0; tries < 8; tries++) {
		gid_t *g = malloc((size_t)n * sizeof *g);
		if (!g)
			return 0;
		int want = n;
		if (getgrouplist(pw.pw_name, pw.pw_gid, g, &want) >= 0) {
			*groups = g;
			return (size_t)want;
		}
		free(g);
		/* -1 with want set to the number needed; grow and ask again (the database may
		 * have grown in between, hence the loop). */
		n = want > n ? want : n * 2;
	}
	return 0;
}

int policy_check(const struct policy *p, int fd, struct ucred *cred, struct hearth_error *err)
{
	socklen_t len = sizeof *cred;
	memset(cred, 0, sizeof *cred);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cred, &len) != 0)
		return hearth_error_errno(err, HEARTH_EIO, errno, "reading peer credentials (SO_PEERCRED)");
	if (len != sizeof *cred)
		return hearth_error_set(err, HEARTH_EIO, "reading peer credentials: short answer");
	/* Decide without the database first: most peers are allowed by uid, root or an empty
	 * policy, and those should not pay for an NSS lookup. */
	if (policy_allows(p, cred->uid, cred->gid, NULL, 0))
		return 0;
	gid_t *groups;
	size_t n = p->n_allow_gids ? user_groups(cred->uid, &groups) : (groups = NULL, 0);
	bool ok = policy_allows(p, cred->uid, cred->gid, groups, n);
	free(groups);
	if (ok)
		return 0;
	return hearth_error_set(err, HEARTH_EPERM,
				"uid %lu (pid %ld) is not allowed: not in allow_users and no group in allow_groups",
				(unsigned long)cred->uid, (long)cred->pid);
}

static struct policy_uid_count *count_find(const struct policy *p, uid_t uid)
{
	for (size_t i = 0; i < p->n_counts; i++)
		if (p->counts[i].uid == uid)
			return &p->counts[i];
	return NULL;
}

int policy_uid_acquire(struct policy *p, uid_t uid, struct hearth_error *err)
{
	struct policy_uid_count *c = count_find(p, uid);
	uint32_t n = c ? c->n : 0;
	if (n >= p->max_per_uid)
		return hearth_error_set(err, HEARTH_EBUSY,
					"uid %lu already has %u requests running (max_requests_per_uid = %u)",
					(unsigned long)uid, n, p->max_per_uid);
	if (c) {
		c->n++;
		return 0;
	}
	if (p->n_counts == p->cap_counts) {
		size_t cap = p->cap_counts ? p->cap_counts * 2 : 16;
		struct policy_uid_count *t = realloc(p->counts, cap * sizeof *t);
		if (!t)
			return hearth_error_set(err, HEARTH_ENOMEM, "out of memory counting requests of uid %lu",
						(unsigned long)uid);
		p->counts = t;
		p->cap_counts = cap;
	}
	p->counts[p->n_counts++] = (struct policy_uid_count){ .uid = uid, .n = 1 };
	return 0;
}

void policy_uid_release(struct policy *p, uid_t uid)
{
	struct policy_uid_count *c = count_find(p, uid);
	if (!c)
		return; /* unmatched release: a caller bug, but counting below zero would be worse */
	if (--c->n == 0)
		*c = p->counts[--p->n_counts];
}

uint32_t policy_uid_running(const struct policy *p, uid_t uid)
{
	const struct policy_uid_count *c = count_find(p, uid);
	return c ? c->n : 0;
}
