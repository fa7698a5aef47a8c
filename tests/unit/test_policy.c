/* Access policy: the rules on given credentials, then real connections from forked children
 * that drop to other uids (nobody, or a user the group database lists as a member of a
 * supplementary group) and are checked through SO_PEERCRED; and the per-uid request table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/serve/config.h"
#include "daemon/serve/policy.h"

#define NOBODY 65534

static struct hearth_config config_with(const char *users, const char *groups)
{
	struct hearth_config c;
	struct hearth_error err;
	config_defaults(&c);
	if (users && config_set(&c, "allow_users", users, &err))
		fail_msg("%s", err.msg);
	if (groups && config_set(&c, "allow_groups", groups, &err))
		fail_msg("%s", err.msg);
	return c;
}

static void test_policy_empty_lists_allow_everyone(void **state)
{
	struct hearth_config c = config_with(NULL, NULL);
	struct policy p;
	policy_init(&p, &c);
	assert_true(policy_allows(&p, 1001, 1001, NULL, 0));
	assert_true(policy_allows(&p, NOBODY, NOBODY, NULL, 0));
	policy_free(&p);
}

static void test_policy_matches_uid_primary_gid_or_supplementary_group(void **state)
{
	struct hearth_config c = config_with("1001,1002", "500,600");
	struct policy p;
	policy_init(&p, &c);
	p.self_uid = 999; /* the test runs as root; pretend the daemon is its own user */
	const gid_t other[] = { 7, 8, 600 };
	const gid_t none[] = { 7, 8, 9 };
	assert_true(policy_allows(&p, 1002, 42, NULL, 0));          /* uid listed */
	assert_true(policy_allows(&p, 2000, 500, NULL, 0));         /* primary gid listed */
	assert_true(policy_allows(&p, 2000, 42, other, 3));         /* supplementary listed */
	assert_false(policy_allows(&p, 2000, 42, none, 3));
	assert_false(policy_allows(&p, 2000, 42, NULL, 0));
	assert_true(policy_allows(&p, 0, 0, NULL, 0));              /* root, always */
	assert_true(policy_allows(&p, 999, 999, NULL, 0));          /* the daemon's own uid */
	policy_free(&p);
}

static void test_policy_update_replaces_rules(void **state)
{
	struct hearth_config c = config_with("1001", NULL);
	struct policy p;
	policy_init(&p, &c);
	p.self_uid = 999;
	assert_false(policy_allows(&p, 1002, 1002, NULL, 0));
	c = config_with("1002", NULL);
	policy_update(&p, &c);
	assert_true(policy_allows(&p, 1002, 1002, NULL, 0));
	assert_false(policy_allows(&p, 1001, 1001, NULL, 0));
	policy_free(&p);
}

/* ---- real peers ---- */

static char tmpdir[64];
static char sock_path[100];
static int listen_fd = -1;

static int setup_socket(void **state)
{
	snprintf(tmpdir, sizeof tmpdir, "/tmp/hearth-test-policy-XXXXXX");
	if (!mkdtemp(tmpdir) || chmod(tmpdir, 0711) != 0)
		return -1;
	snprintf(sock_path, sizeof sock_path, "%s/hearth.sock", tmpdir);
	listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof a.sun_path, "%s", sock_path);
	if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
	    listen(listen_fd, 8) != 0 || chmod(sock_path, 0666) != 0)
		return -1;
	return 0;
}

static int teardown_socket(void **state)
{
	close(listen_fd);
	unlink(sock_path);
	return rmdir(tmpdir);
}

static void need_root(void)
{
	if (geteuid() != 0) {
		print_message("# not root: cannot connect as another uid; skipped\n");
		skip();
	}
}

/* Forks a child that becomes uid/gid (no supplementary groups of its own: the kernel's view
 * is only what SO_PEERCRED reports) and connects; the parent accepts and runs policy_check. */
static int check_peer_as(const struct policy *p, uid_t uid, gid_t gid, struct ucred *cred,
			 struct hearth_error *err, pid_t *child)
{
	pid_t pid = fork();
	if (pid == 0) {
		if (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0)
			_exit(1);
		int s = socket(AF_UNIX, SOCK_STREAM, 0);
		struct sockaddr_un a = { .sun_family = AF_UNIX };
		snprintf(a.sun_path, sizeof a.sun_path, "%s", sock_path);
		if (connect(s, (struct sockaddr *)&a, sizeof a) != 0)
			_exit(2);
		char b;
		(void)read(s, &b, 1); /* until the parent has checked and closed */
		_exit(0);
	}
	int c = accept(listen_fd, NULL, NULL);
	assert_true(c >= 0);
	int rc = policy_check(p, c, cred, err);
	close(c);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	*child = pid;
	return rc;
}

static void test_policy_refuses_other_uid_naming_uid_and_pid(void **state)
{
	need_root();
	struct hearth_config c = config_with("1", NULL);
	struct policy p;
	policy_init(&p, &c);
	struct ucred cred;
	struct hearth_error err;
	pid_t child;
	assert_int_equal(check_peer_as(&p, NOBODY, NOBODY, &cred, &err, &child), HEARTH_EPERM);
	assert_int_equal(cred.uid, NOBODY);
	assert_int_equal(cred.gid, NOBODY);
	assert_int_equal(cred.pid, child);
	char want[200];
	snprintf(want, sizeof want,
		 "uid 65534 (pid %ld) is not allowed: not in allow_users and no group in allow_groups",
		 (long)child);
	assert_string_equal(err.msg, want);
	policy_free(&p);
}

static void test_policy_allows_listed_user_and_primary_group(void **state)
{
	need_root();
	struct ucred cred;
	struct hearth_error err;
	pid_t child;
	struct policy p;

	struct hearth_config c = config_with("nobody", NULL);
	policy_init(&p, &c);
	assert_int_equal(check_peer_as(&p, NOBODY, NOBODY, &cred, &err, &child), 0);
	policy_free(&p);

	/* gid 4321 has no group entry: the match is on the gid the peer connected with. */
	c = config_with("1", "4321");
	policy_init(&p, &c);
	assert_int_equal(check_peer_as(&p, NOBODY, 4321, &cred, &err, &child), 0);
	assert_int_equal(check_peer_as(&p, NOBODY, NOBODY, &cred, &err, &child), HEARTH_EPERM);
	policy_free(&p);
}

/* A non-root user that /etc/group lists as a member of a group other than its primary one
 * (on Debian with PostgreSQL: postgres in ssl-cert). */
static bool find_supplementary_member(uid_t *uid, gid_t *primary, gid_t *group)
{
	bool found = false;
	setgrent();
	struct group *g;
	while (!found && (g = getgrent()))
		for (char **m = g->gr_mem; *m && !found; m++) {
			struct passwd *pw = getpwnam(*m);
			if (pw && pw->pw_uid != 0 && pw->pw_gid != g->gr_gid) {
				*uid = pw->pw_uid;
				*primary = pw->pw_gid;
				*group = g->gr_gid;
				found = true;
			}
		}
	endgrent();
	return found;
}

static void test_policy_allows_supplementary_group_from_database(void **state)
{
	need_root();
	uid_t uid = 0;
	gid_t primary = 0, group = 0;
	if (!find_supplementary_member(&uid, &primary, &group)) {
		print_message("# no user with a supplementary group in the group database; skipped\n");
		skip();
	}
	char groups[32];
	snprintf(groups, sizeof groups, "%lu", (unsigned long)group);
	struct hearth_config c = config_with("1", groups);
	struct policy p;
	policy_init(&p, &c);
	struct ucred cred;
	struct hearth_error err;
	pid_t child;
	/* The child drops every supplementary group, so only getgrouplist can find it. */
	assert_int_equal(check_peer_as(&p, uid, primary, &cred, &err, &child), 0);
	assert_int_equal(cred.uid, uid);
	/* And the same user is refused once the group is not listed. */
	c = config_with("1", "4321");
	policy_update(&p, &c);
	assert_int_equal(check_peer_as(&p, uid, primary, &cred, &err, &child), HEARTH_EPERM);
	policy_free(&p);
}

static void test_policy_check_fails_on_non_socket(void **state)
{
	struct hearth_config c = config_with(NULL, NULL);
	struct policy p;
	policy_init(&p, &c);
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	struct ucred cred;
	struct hearth_error err;
	assert_int_equal(policy_check(&p, fds[0], &cred, &err), HEARTH_EIO);
	assert_non_null(strstr(err.msg, "SO_PEERCRED"));
	close(fds[0]);
	close(fds[1]);
	policy_free(&p);
}

/* ---- per-uid limits ---- */

static void test_policy_uid_limit_refuses_beyond_max(void **state)
{
	struct hearth_config c = config_with(NULL, NULL);
	struct hearth_error err;
	assert_int_equal(config_set(&c, "max_requests_per_uid", "3", &err), 0);
	struct policy p;
	policy_init(&p, &c);
	for (int i = 0; i < 3; i++)
		assert_int_equal(policy_uid_acquire(&p, 1001, &err), 0);
	assert_int_equal(policy_uid_acquire(&p, 1001, &err), HEARTH_EBUSY);
	assert_string_equal(err.msg,
			    "uid 1001 already has 3 requests running (max_requests_per_uid = 3)");
	/* Other uids are counted apart. */
	assert_int_equal(policy_uid_acquire(&p, 1002, &err), 0);
	assert_int_equal(policy_uid_running(&p, 1001), 3);
	assert_int_equal(policy_uid_running(&p, 1002), 1);
	policy_uid_release(&p, 1001);
	assert_int_equal(policy_uid_acquire(&p, 1001, &err), 0);
	assert_int_equal(policy_uid_acquire(&p, 1001, &err), HEARTH_EBUSY);
	policy_free(&p);
}

static void test_policy_uid_table_grows_and_drops_idle_uids(void **state)
{
	struct hearth_config c = config_with(NULL, NULL);
	struct policy p;
	policy_init(&p, &c);
	struct hearth_error err;
	for (uid_t u = 1000; u < 1100; u++) {
		assert_int_equal(policy_uid_acquire(&p, u, &err), 0);
		assert_int_equal(policy_uid_acquire(&p, u, &err), 0);
	}
	assert_int_equal(p.n_counts, 100);
	for (uid_t u = 1000; u < 1100; u++)
		assert_int_equal(policy_uid_running(&p, u), 2);
	for (uid_t u = 1000; u < 1100; u += 2) {
		policy_uid_release(&p, u);
		policy_uid_release(&p, u);
	}
	assert_int_equal(p.n_counts, 50);
	for (uid_t u = 1000; u < 1100; u++)
		assert_int_equal(policy_uid_running(&p, u), u % 2 ? 2 : 0);
	/* An unmatched release is ignored rather than wrapping a count. */
	policy_uid_release(&p, 1000);
	assert_int_equal(policy_uid_running(&p, 1000), 0);
	policy_free(&p);
}

static void test_policy_update_keeps_running_counts(void **state)
{
	struct hearth_config c = config_with(NULL, NULL);
	struct hearth_error err;
	struct policy p;
	policy_init(&p, &c);
	for (int i = 0; i < 5; i++)
		assert_int_equal(policy_uid_acquire(&p, 1001, &err), 0);
	assert_int_equal(config_set(&c, "max_requests_per_uid", "2", &err), 0);
	policy_update(&p, &c);
	assert_int_equal(policy_uid_running(&p, 1001), 5);
	assert_int_equal(policy_uid_acquire(&p, 1001, &err), HEARTH_EBUSY);
	for (int i = 0; i < 4; i++)
		policy_uid_release(&p, 1001);
	assert_int_equal(policy_uid_acquire(&p, 1001, &err), 0);
	policy_free(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_policy_empty_lists_allow_everyone),
		cmocka_unit_test(test_policy_matches_uid_primary_gid_or_supplementary_group),
		cmocka_unit_test(test_policy_update_replaces_rules),
		cmocka_unit_test(test_policy_refuses_other_uid_naming_uid_and_pid),
		cmocka_unit_test(test_policy_allows_listed_user_and_primary_group),
		cmocka_unit_test(test_policy_allows_supplementary_group_from_database),
		cmocka_unit_test(test_policy_check_fails_on_non_socket),
		cmocka_unit_test(test_policy_uid_limit_refuses_beyond_max),
		cmocka_unit_test(test_policy_uid_table_grows_and_drops_idle_uids),
		cmocka_unit_test(test_policy_update_keeps_running_counts),
	};
	return cmocka_run_group_tests(tests, setup_socket, teardown_socket);
}
