/* Arena: plan layout and carving (hand-computed offsets), the never-grow rule, which page
 * kind it got (checked against the kernel's own smaps and hugepage pool), NUMA placement
 * (move_pages against the node list in /sys), and the mlock error under a low RLIMIT_MEMLOCK. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/capability.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/engine/arena.h"
#include "daemon/engine/memstat.h"

#define MiB ((size_t)1 << 20)
/* Tests of several build trees may run at once; the hugepage pool is machine-wide. */
#define HUGEPAGE_LOCK "/tmp/hearth-test-hugepages.lock"
#define NR_HUGEPAGES_2M "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"

/* Held for the whole run (group setup), so a failing test cannot leave it taken. */
static int group_lock_hugepages(void **state)
{
	int fd = open(HUGEPAGE_LOCK, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
	if (fd < 0 || flock(fd, LOCK_EX) != 0) {
		print_message("# cannot lock %s: %s\n", HUGEPAGE_LOCK, strerror(errno));
		return -1;
	}
	*state = (void *)(intptr_t)fd;
	return 0;
}

static int write_nr_hugepages(uint64_t n);

/* Set while the hugetlb test has raised the pool, so a failed assertion still restores it. */
static bool pool_raised;
static uint64_t pool_nr_before;

static int group_unlock_hugepages(void **state)
{
	if (pool_raised && write_nr_hugepages(pool_nr_before) == 0)
		pool_raised = false;
	close((int)(intptr_t)*state);
	return pool_raised ? -1 : 0;
}

static size_t resident_bytes(const void *p, size_t len)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t n = (len + page - 1) / page;
	unsigned char *vec = malloc(n);
	assert_non_null(vec);
	assert_int_equal(mincore((void *)p, n * page, vec), 0);
	size_t r = 0;
	for (size_t i = 0; i < n; i++)
		r += (vec[i] & 1) ? page : 0;
	free(vec);
	return r;
}

static void test_arena_plan_size_includes_alignment_padding(void **state)
{
	(void)state;
	struct arena_plan plan;
	arena_plan_init(&plan);
	struct hearth_error err;
	assert_int_equal(arena_plan_add(&plan, "norms", 100, 64, &err), 0);
	assert_int_equal(arena_plan_add(&plan, "rope", 5000, 8192, &err), 0);
	assert_int_equal(arena_plan_add(&plan, "scratch", 10, 16, &err), 0);
	size_t bytes;
	assert_int_equal(arena_plan_size(&plan, &bytes, &err), 0);
	/* norms 0..100, rope at 8192..13192, scratch at 16384..16394 (regions are page-aligned) */
	assert_int_equal(bytes, 16394);
}

static void test_arena_plan_rejects_duplicates_and_bad_alignment(void **state)
{
	(void)state;
	struct arena_plan plan;
	arena_plan_init(&plan);
	struct hearth_error err;
	assert_int_equal(arena_plan_add(&plan, "kv_pool", 4096, 64, &err), 0);
	assert_int_equal(arena_plan_add(&plan, "kv_pool", 4096, 64, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "already in the plan"));
	assert_int_equal(arena_plan_add(&plan, "x", 4096, 48, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "power of two"));
	assert_int_equal(arena_plan_add(&plan, "", 1, 1, &err), HEARTH_EINVAL);
	char longname[ARENA_NAME_MAX + 1];
	memset(longname, 'a', sizeof longname - 1);
	longname[sizeof longname - 1] = '\0';
	assert_int_equal(arena_plan_add(&plan, longname, 1, 1, &err), HEARTH_EINVAL);
	for (int i = 1; i < ARENA_MAX_REGIONS; i++) {
		char name[16];
		snprintf(name, sizeof name, "r%d", i);
		assert_int_equal(arena_plan_add(&plan, name, 1, 1, &err), 0);
	}
	assert_int_equal(arena_plan_add(&plan, "one_too_many", 1, 1, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "maximum"));
}

static void test_arena_carves_aligned_and_never_grows(void **state)
{
	(void)state;
	struct arena_plan plan;
	arena_plan_init(&plan);
	struct hearth_error err;
	assert_int_equal(arena_plan_add(&plan, "weights.q4g128", 10000, 64, &err), 0);
	assert_int_equal(arena_plan_add(&plan, "kv_pool", MiB, 2 * MiB, &err), 0);
	struct arena_config cfg = ARENA_CONFIG_DEFAULT;
	cfg.pages = ARENA_PAGES_NONE;
	struct arena a;
	assert_int_equal(arena_create(&a, &plan, &cfg, &err), 0);
	assert_int_equal(a.backing, ARENA_BACKING_NORMAL);
	assert_int_equal(a.n_regions, 2);
	struct arena_region *w = arena_region_find(&a, "weights.q4g128");
	struct arena_region *kv = arena_region_find(&a, "kv_pool");
	assert_non_null(w);
	assert_non_null(kv);
	assert_null(arena_region_find(&a, "weights"));
	assert_int_equal((uintptr_t)w->base % 4096, 0);
	assert_int_equal((uintptr_t)kv->base % (2 * MiB), 0);
	assert_true(kv->base >= w->base + w->size);
	assert_true(kv->base + kv->size <= a.base + a.size);

	void *p1, *p2, *p3;
	assert_int_equal(arena_alloc(&a, "weights.q4g128", 3, 1, &p1, &err), 0);
	assert_int_equal(arena_alloc(&a, "weights.q4g128", 100, 64, &p2, &err), 0);
	assert_ptr_equal(p1, w->base);
	assert_ptr_equal(p2, w->base + 64);
	assert_int_equal(w->used, 164);
	/* 9836 left: 9837 must fail and leave everything as it was */
	uint8_t *base = a.base;
	size_t size = a.size;
	assert_int_equal(arena_alloc(&a, "weights.q4g128", 9837, 1, &p3, &err), HEARTH_ENOMEM);
	assert_non_null(strstr(err.msg, "weights.q4g128"));
	assert_non_null(strstr(err.msg, "9836 of 10000 left"));
	assert_int_equal(w->used, 164);
	assert_ptr_equal(a.base, base);
	assert_int_equal(a.size, size);
	assert_int_equal(arena_alloc(&a, "weights.q4g128", 9836, 1, &p3, &err), 0);
	assert_ptr_equal(p3, w->base + 164);
	assert_int_equal(arena_alloc(&a, "weights.q4g128", 1, 1, &p3, &err), HEARTH_ENOMEM);
	/* a full region does not spill into the next one */
	assert_int_equal(kv->used, 0);
	assert_int_equal(arena_alloc(&a, "nope", 1, 1, &p3, &err), HEARTH_ENOTFOUND);
	assert_non_null(strstr(err.msg, "nope"));
	assert_int_equal(arena_alloc(&a, "kv_pool", 1, 3, &p3, &err), HEARTH_EINVAL);
	/* the memory is real and writable */
	memset(w->base, 0xab, w->size);
	memset(kv->base, 0xcd, kv->size);
	assert_int_equal(w->base[w->size - 1], 0xab);
	arena_destroy(&a);
	assert_null(a.base);
	arena_destroy(&a); /* twice is harmless */
}

static void test_arena_prefault_makes_range_resident(void **state)
{
	(void)state;
	struct arena_plan plan;
	arena_plan_init(&plan);
	struct hearth_error err;
	assert_int_equal(arena_plan_add(&plan, "kv_pool", 4 * MiB, 4096, &err), 0);
	struct arena_config cfg = ARENA_CONFIG_DEFAULT;
	cfg.pages = ARENA_PAGES_NONE;
	struct arena a;
	assert_int_equal(arena_create(&a, &plan, &cfg, &err), 0);
	struct arena_region *kv = arena_region_find(&a, "kv_pool");
	assert_int_equal(resident_bytes(kv->base, kv->size), 0);
	kv->base[5] = 42; /* prefault must keep what is there */
	assert_int_equal(arena_prefault(&a, kv->base, kv->size, &err), 0);
	assert_int_equal(resident_bytes(kv->base, kv->size), kv->size);
	assert_int_equal(kv->base[5], 42);
	assert_int_equal(arena_prefault(&a, kv->base, a.size + 1, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "outside the arena"));
	arena_destroy(&a);
}

static void test_arena_auto_falls_back_and_reports_what_it_got(void **state)
{
	(void)state;
	struct hearth_error err;
	struct memstat_hugepages hp;
	assert_int_equal(memstat_hugepages_2m(&hp, &err), 0);
	/* more 2 MiB pages than the pool can give, so hugetlb must fail */
	size_t size = (size_t)(hp.available + 2) * ARENA_HUGE_PAGE;
	struct arena_plan plan;
	arena_plan_init(&plan);
	assert_int_equal(arena_plan_add(&plan, "kv_pool", size, 4096, &err), 0);
	struct arena_config cfg = ARENA_CONFIG_DEFAULT;
	struct arena a;
	assert_int_equal(arena_create(&a, &plan, &cfg, &err), 0);
	char mode[32];
	assert_int_equal(memstat_thp_mode(mode, sizeof mode, &err), 0);
	enum arena_backing want = strcmp(mode, "never") ? ARENA_BACKING_THP : ARENA_BACKING_NORMAL;
	assert_int_equal(a.backing, want);
	assert_non_null(strstr(a.note, "hugetlb: need"));
	assert_non_null(strstr(a.note, arena_backing_name(want)));
	print_message("# pages=auto with %" PRIu64 " hugetlb pages available: %s\n", hp.available,
		      a.note);
	struct arena_region *kv = arena_region_find(&a, "kv_pool");
	assert_int_equal(arena_prefault(&a, kv->base, 2 * ARENA_HUGE_PAGE, &err), 0);
	struct arena_stats st;
	assert_int_equal(arena_stats(&a, &st, &err), 0);
	assert_int_equal(st.backing, want);
	/* what the arena reports is what the kernel's smaps says about its range */
	struct memstat_vma sum;
	assert_int_equal(memstat_range_smaps(a.base, a.size, &sum, &err), 0);
	assert_int_equal(st.huge_bytes, sum.anon_huge);
	assert_int_equal(sum.private_hugetlb, 0);
	print_message("# thp-backed after touching 4 MiB: %zu KiB\n", st.huge_bytes / 1024);
	arena_destroy(&a);
}

static void test_arena_required_hugetlb_without_pages_is_a_clear_error(void **state)
{
	(void)state;
	struct hearth_error err;
	struct memstat_hugepages hp;
	assert_int_equal(memstat_hugepages_2m(&hp, &err), 0);
	struct arena_plan plan;
	arena_plan_init(&plan);
	assert_int_equal(arena_plan_add(&plan, "kv_pool", (size_t)(hp.available + 1) * ARENA_HUGE_PAGE,
					4096, &err), 0);
	struct arena_config cfg = ARENA_CONFIG_DEFAULT;
	cfg.pages = ARENA_PAGES_HUGETLB;
	struct arena a;
	assert_int_equal(arena_create(&a, &plan, &cfg, &err), HEARTH_ENOMEM);
	assert_non_null(strstr(err.msg, "hugetlb: need"));
	assert_non_null(strstr(err.msg, "nr_hugepages"));
	assert_null(a.base);
}

static int write_nr_hugepages(uint64_t n)
{
	FILE *f = fopen(NR_HUGEPAGES_2M, "w");
	if (!f)
		return -1;
	int rc = fprintf(f, "%" PRIu64 "\n", n) > 0 ? 0 : -1;
	if (fclose(f) != 0)
		rc = -1;
	return rc;
}

static void test_arena_hugetlb_used_when_pages_exist(void **state)
{
	(void)state;
	if (geteuid() != 0) {
		print_message("# SKIP: not root, cannot raise vm.nr_hugepages for this test\n");
		skip();
	}
	struct hearth_error err;
	struct memstat_hugepages before;
	assert_int_equal(memstat_hugepages_2m(&before, &err), 0);
	const uint64_t want = 3;
	if (write_nr_hugepages(before.nr + want) != 0) {
		print_message("# SKIP: cannot write %s: %s\n", NR_HUGEPAGES_2M, strerror(errno));
		skip();
	}
	pool_nr_before = before.nr;
	pool_raised = true;
	struct memstat_hugepages hp;
	assert_int_equal(memstat_hugepages_2m(&hp, &err), 0);
	if (hp.available < want) {
		if (write_nr_hugepages(before.nr) == 0)
			pool_raised = false;
		print_message("# SKIP: kernel gave only %" PRIu64 " of %" PRIu64
			      " 2 MiB pages (fragmented memory)\n", hp.available, want);
		skip();
	}
	struct arena_plan plan;
	arena_plan_init(&plan);
	assert_int_equal(arena_plan_add(&plan, "weights.q4g128", 3 * MiB, 64, &err), 0);
	assert_int_equal(arena_plan_add(&plan, "kv_pool", 2 * MiB, 4096, &err), 0);
	struct arena_config cfg = ARENA_CONFIG_DEFAULT;
	cfg.pages = ARENA_PAGES_HUGETLB;
	struct arena a;
	int rc = arena_create(&a, &plan, &cfg, &err);
	if (rc == 0) {
		assert_int_equal(a.backing, ARENA_BACKING_HUGETLB);
		assert_int_equal(a.page_size, ARENA_HUGE_PAGE);
		assert_int_equal(a.size, 6 * MiB); /* 3 MiB + page-aligned 2 MiB, rounded to 2 MiB */
		assert_int_equal((uintptr_t)a.base % ARENA_HUGE_PAGE, 0);
		assert_int_equal(arena_prefault(&a, a.base, a.size, &err), 0);
		struct arena_stats st;
		assert_int_equal(arena_stats(&a, &st, &err), 0);
		assert_int_equal(st.huge_bytes, a.size);
		struct memstat_status ps;
		assert_int_equal(memstat_read_status(&ps, &err), 0);
		assert_true(ps.hugetlb >= a.size);
		if (st.placement.numa_known)
			assert_int_equal(st.placement.node_bytes[a.numa_node], a.size);
		arena_destroy(&a);
	}
	assert_int_equal(write_nr_hugepages(before.nr), 0);
	pool_raised = false;
	if (rc != 0)
		fail_msg("hugetlb arena with %" PRIu64 " pages available failed: %s", hp.available,
			 err.msg);
}

/* The nodes in /sys that have CPUs: independent of libnuma. */
static int sys_node_cpulist(int node, char *buf, size_t size)
{
	char path[128];
	snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpulist", node);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	char *ok = fgets(buf, (int)size, f);
	fclose(f);
	if (!ok)
		return -1;
	buf[strcspn(buf, "\n")] = '\0';
	return 0;
}

static void test_arena_placement_reports_pages_on_node0(void **state)
{
	(void)state;
	struct arena_plan plan;
	arena_plan_init(&plan);
	struct hearth_error err;
	assert_int_equal(arena_plan_add(&plan, "kv_pool", 2 * MiB, 4096, &err), 0);
	struct arena_config cfg = ARENA_CONFIG_DEFAULT;
	cfg.pages = ARENA_PAGES_NONE;
	struct arena a;
	assert_int_equal(arena_create(&a, &plan, &cfg, &err), 0);
	char cpus[64];
	bool numa_machine = sys_node_cpulist(0, cpus, sizeof cpus) == 0;
	if (numa_machine) {
		assert_true(a.numa_bound);
		assert_int_equal(a.numa_node, 0);
		assert_non_null(strstr(a.note, "bound to node 0"));
	}
	struct arena_region *kv = arena_region_find(&a, "kv_pool");
	assert_int_equal(arena_prefault(&a, kv->base, MiB, &err), 0);
	struct arena_placement pl;
	assert_int_equal(arena_placement(&a, kv->base, kv->size, &pl, &err), 0);
	if (!numa_machine) {
		assert_false(pl.numa_known);
		return;
	}
	assert_true(pl.numa_known);
	assert_true(pl.n_nodes >= 1);
	assert_int_equal(pl.node_bytes[0], MiB);
	assert_int_equal(pl.bytes_not_present, MiB);
	assert_int_equal(pl.bytes_other_node, 0);
	assert_int_equal(arena_verify_placement(&a, &pl, &err), 0);
	assert_int_equal(pl.node_bytes[0], MiB);
	arena_destroy(&a);
}

static void test_arena_node_cpus_match_sysfs(void **state)
{
	(void)state;
	char list[64];
	if (sys_node_cpulist(0, list, sizeof list) != 0) {
		print_message("# SKIP: no /sys/devices/system/node/node0 (no NUMA sysfs)\n");
		skip();
	}
	int cpus[256];
	size_t n;
	struct hearth_error err;
	assert_int_equal(arena_node_cpus(0, cpus, 256, &n, &err), 0);
	/* print our list in the kernel's range form and compare */
	char mine[64] = "";
	size_t len = 0;
	for (size_t i = 0; i < n;) {
		size_t j = i;
		while (j + 1 < n && cpus[j + 1] == cpus[j] + 1)
			j++;
		if (j == i)
			len += (size_t)snprintf(mine + len, sizeof mine - len, "%s%d", i ? "," : "", cpus[i]);
		else
			len += (size_t)snprintf(mine + len, sizeof mine - len, "%s%d-%d", i ? "," : "",
						cpus[i], cpus[j]);
		i = j + 1;
	}
	assert_string_equal(mine, list);
	assert_int_equal(arena_node_cpus(9999, cpus, 256, &n, &err), HEARTH_EINVAL);
}

static void test_arena_rejects_numa_node_beyond_machine(void **state)
{
	(void)state;
	struct arena_plan plan;
	arena_plan_init(&plan);
	struct hearth_error err;
	assert_int_equal(arena_plan_add(&plan, "kv_pool", 4096, 64, &err), 0);
	struct arena_config cfg = ARENA_CONFIG_DEFAULT;
	cfg.numa_node = 63;
	struct arena a;
	assert_int_equal(arena_create(&a, &plan, &cfg, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "numa_node=63"));
	assert_null(a.base);
}

static void test_arena_lock_memory_locks_within_limit(void **state)
{
	(void)state;
	struct arena_plan plan;
	arena_plan_init(&plan);
	struct hearth_error err;
	assert_int_equal(arena_plan_add(&plan, "kv_pool", MiB, 4096, &err), 0);
	struct arena_config cfg = ARENA_CONFIG_DEFAULT;
	cfg.pages = ARENA_PAGES_NONE;
	cfg.lock_memory = true;
	struct memstat_status before, after;
	assert_int_equal(memstat_read_status(&before, &err), 0);
	struct arena a;
	assert_int_equal(arena_create(&a, &plan, &cfg, &err), 0);
	assert_true(a.locked);
	assert_int_equal(memstat_read_status(&after, &err), 0);
	assert_true(after.vm_lck >= before.vm_lck + a.size);
	/* mlock faulted it all in */
	assert_int_equal(resident_bytes(a.base, a.size), a.size);
	arena_destroy(&a);
}

/* Without CAP_IPC_LOCK the kernel enforces RLIMIT_MEMLOCK even for root. */
static int drop_cap_ipc_lock(void)
{
	struct __user_cap_header_struct hdr = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct data[2];
	if (syscall(SYS_capget, &hdr, data) != 0)
		return -1;
	data[0].effective &= ~(1u << CAP_IPC_LOCK);
	return (int)syscall(SYS_capset, &hdr, data);
}

static void test_arena_lock_memory_error_names_rlimit_memlock(void **state)
{
	(void)state;
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(fds[0]);
		struct rlimit rl = { 65536, 65536 };
		if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0 || drop_cap_ipc_lock() != 0)
			_exit(2);
		struct arena_plan plan;
		arena_plan_init(&plan);
		struct hearth_error err;
		hearth_error_clear(&err);
		if (arena_plan_add(&plan, "kv_pool", 4 * MiB, 4096, &err) != 0)
			_exit(3);
		struct arena_config cfg = ARENA_CONFIG_DEFAULT;
		cfg.pages = ARENA_PAGES_NONE;
		cfg.lock_memory = true;
		struct arena a;
		int rc = arena_create(&a, &plan, &cfg, &err);
		ssize_t w = write(fds[1], err.msg, strlen(err.msg) + 1);
		(void)w;
		_exit(rc == HEARTH_EPERM && a.base == NULL ? 0 : 1);
	}
	close(fds[1]);
	char msg[HEARTH_ERROR_MSG_MAX] = "";
	ssize_t got = read(fds[0], msg, sizeof msg - 1);
	close(fds[0]);
	if (got > 0)
		msg[got] = '\0';
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	if (WEXITSTATUS(status) != 0)
		fail_msg("child exit %d, message '%s'", WEXITSTATUS(status), msg);
	assert_non_null(strstr(msg, "RLIMIT_MEMLOCK is 65536 bytes"));
	assert_non_null(strstr(msg, "lock_memory"));
}

static void test_arena_pages_names_round_trip(void **state)
{
	(void)state;
	struct hearth_error err;
	enum arena_pages p;
	for (int i = ARENA_PAGES_AUTO; i <= ARENA_PAGES_NONE; i++) {
		assert_int_equal(arena_pages_parse(arena_pages_name((enum arena_pages)i), &p, &err), 0);
		assert_int_equal(p, i);
	}
	assert_int_equal(arena_pages_parse("huge", &p, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "'huge'"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_arena_plan_size_includes_alignment_padding),
		cmocka_unit_test(test_arena_plan_rejects_duplicates_and_bad_alignment),
		cmocka_unit_test(test_arena_carves_aligned_and_never_grows),
		cmocka_unit_test(test_arena_prefault_makes_range_resident),
		cmocka_unit_test(test_arena_auto_falls_back_and_reports_what_it_got),
		cmocka_unit_test(test_arena_required_hugetlb_without_pages_is_a_clear_error),
		cmocka_unit_test(test_arena_hugetlb_used_when_pages_exist),
		cmocka_unit_test(test_arena_placement_reports_pages_on_node0),
		cmocka_unit_test(test_arena_node_cpus_match_sysfs),
		cmocka_unit_test(test_arena_rejects_numa_node_beyond_machine),
		cmocka_unit_test(test_arena_lock_memory_locks_within_limit),
		cmocka_unit_test(test_arena_lock_memory_error_names_rlimit_memlock),
		cmocka_unit_test(test_arena_pages_names_round_trip),
	};
	return cmocka_run_group_tests(tests, group_lock_hugepages, group_unlock_hugepages);
}
