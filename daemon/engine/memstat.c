/* Parsers for the kernel's memory reports (/proc/self/{status,statm,smaps,smaps_rollup} and
 * the hugepage/THP files in /sys). The formats are line-oriented "Key:  N kB"; keys we do
 * not know are skipped so newer kernels with more fields still parse. */
#include "daemon/engine/memstat.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HUGEPAGES_2M_DIR "/sys/kernel/mm/hugepages/hugepages-2048kB"
#define THP_ENABLED_PATH "/sys/kernel/mm/transparent_hugepage/enabled"

struct kb_field {
	const char *key;     /* with the colon: "VmRSS:" */
	size_t *dst;
};

/* If line starts with one of the keys, stores its "N kB" value in bytes. */
static bool kb_field_match(const char *line, const struct kb_field *fields, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		size_t kl = strlen(fields[i].key);
		if (strncmp(line, fields[i].key, kl) != 0)
			continue;
		unsigned long long kb = strtoull(line + kl, NULL, 10);
		*fields[i].dst = (size_t)kb * 1024;
		return true;
	}
	return false;
}

static int read_kb_file(const char *path, const struct kb_field *fields, size_t n,
			struct hearth_error *err)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return hearth_error_errno(err, HEARTH_EIO, errno, "%s: cannot open", path);
	char line[512];
	while (fgets(line, sizeof line, f))
		kb_field_match(line, fields, n);
	fclose(f);
	return 0;
}

int memstat_read_status(struct memstat_status *st, struct hearth_error *err)
{
	memset(st, 0, sizeof *st);
	const struct kb_field fields[] = {
		{ "VmRSS:", &st->vm_rss },       { "VmHWM:", &st->vm_hwm },
		{ "RssAnon:", &st->rss_anon },   { "RssFile:", &st->rss_file },
		{ "RssShmem:", &st->rss_shmem }, { "VmLck:", &st->vm_lck },
		{ "HugetlbPages:", &st->hugetlb },
	};
	return read_kb_file("/proc/self/status", fields, sizeof fields / sizeof fields[0], err);
}

int memstat_read_rollup(struct memstat_rollup *r, struct hearth_error *err)
{
	memset(r, 0, sizeof *r);
	const struct kb_field fields[] = {
		{ "Rss:", &r->rss },
		{ "Pss:", &r->pss },
		{ "Anonymous:", &r->anonymous },
		{ "AnonHugePages:", &r->anon_huge },
		{ "Private_Hugetlb:", &r->private_hugetlb },
		{ "Shared_Hugetlb:", &r->shared_hugetlb },
		{ "Locked:", &r->locked },
	};
	return read_kb_file("/proc/self/smaps_rollup", fields, sizeof fields / sizeof fields[0], err);
}

int memstat_statm_open(struct hearth_error *err)
{
	int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return hearth_error_errno(err, HEARTH_EIO, errno, "/proc/self/statm: cannot open");
	return fd;
}

int memstat_statm_anon(int fd, size_t *bytes)
{
	char buf[160];
	ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
	if (n <= 0) {
		if (n == 0)
			errno = EIO;
		return -1;
	}
	buf[n] = '\0';
	/* size resident shared text lib data dt, in pages; shared = file + shmem */
	unsigned long long size, resident, shared;
	if (sscanf(buf, "%llu %llu %llu", &size, &resident, &shared) != 3) {
		errno = EIO;
		return -1;
	}
	long page = sysconf(_SC_PAGESIZE);
	*bytes = resident > shared ? (size_t)(resident - shared) * (size_t)page : 0;
	return 0;
}

/* "7f..-7f.. rw-p 00000000 00:00 0    [heap]" */
static bool parse_vma_header(const char *line, struct memstat_vma *v)
{
	unsigned long long start, end, inode;
	char perms[8];
	int path_at = 0;
	if (sscanf(line, "%llx-%llx %7s %*x %*x:%*x %llu %n", &start, &end, perms, &inode,
		   &path_at) != 4)
		return false;
	memset(v, 0, sizeof *v);
	v->start = (uintptr_t)start;
	v->end = (uintptr_t)end;
	memcpy(v->perms, perms, 4);
	v->perms[4] = '\0';
	v->inode = inode;
	const char *p = line + path_at;
	size_t n = strcspn(p, "\n");
	if (n >= sizeof v->path)
		n = sizeof v->path - 1;
	memcpy(v->path, p, n);
	v->path[n] = '\0';
	return true;
}

/* A header line starts with a hex address range; field lines start with a capitalized key. */
static bool is_vma_header(const char *line)
{
	const char *p = line;
	while ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))
		p++;
	return p != line && *p == '-';
}

int memstat_smaps_foreach(memstat_vma_fn fn, void *ctx, struct hearth_error *err)
{
	FILE *f = fopen("/proc/self/smaps", "re");
	if (!f)
		return hearth_error_errno(err, HEARTH_EIO, errno, "/proc/self/smaps: cannot open");
	struct memstat_vma v;
	bool have = false;
	int rc = 0;
	char line[4352]; /* a header line carries a path of up to PATH_MAX */
	while (fgets(line, sizeof line, f)) {
		if (is_vma_header(line)) {
			if (have && (rc = fn(&v, ctx)) != 0)
				break;
			have = parse_vma_header(line, &v);
			continue;
		}
		if (!have)
			continue;
		const struct kb_field fields[] = {
			{ "Rss:", &v.rss },
			{ "Anonymous:", &v.anonymous },
			{ "AnonHugePages:", &v.anon_huge },
			{ "Private_Hugetlb:", &v.private_hugetlb },
			{ "Shared_Hugetlb:", &v.shared_hugetlb },
			{ "Locked:", &v.locked },
		};
		kb_field_match(line, fields, sizeof fields / sizeof fields[0]);
	}
	if (rc == 0 && have)
		rc = fn(&v, ctx);
	fclose(f);
	return rc;
}

struct range_sum {
	uintptr_t start, end;
	struct memstat_vma *sum;
};

static int range_sum_add(const struct memstat_vma *v, void *ctx)
{
	struct range_sum *rs = ctx;
	if (v->end <= rs->start || v->start >= rs->end)
		return 0;
	rs->sum->rss += v->rss;
	rs->sum->anonymous += v->anonymous;
	rs->sum->anon_huge += v->anon_huge;
	rs->sum->private_hugetlb += v->private_hugetlb;
	rs->sum->shared_hugetlb += v->shared_hugetlb;
	rs->sum->locked += v->locked;
	return 0;
}

int memstat_range_smaps(const void *start, size_t len, struct memstat_vma *sum,
			struct hearth_error *err)
{
	memset(sum, 0, sizeof *sum);
	sum->start = (uintptr_t)start;
	sum->end = (uintptr_t)start + len;
	struct range_sum rs = { sum->start, sum->end, sum };
	return memstat_smaps_foreach(range_sum_add, &rs, err);
}

static int read_u64_file(const char *path, uint64_t *out, struct hearth_error *err)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return hearth_error_errno(err, HEARTH_EIO, errno, "%s: cannot open", path);
	unsigned long long v;
	int n = fscanf(f, "%llu", &v);
	fclose(f);
	if (n != 1)
		return hearth_error_set(err, HEARTH_EFORMAT, "%s: expected a number", path);
	*out = v;
	return 0;
}

int memstat_hugepages_2m(struct memstat_hugepages *h, struct hearth_error *err)
{
	memset(h, 0, sizeof *h);
	int rc;
	if ((rc = read_u64_file(HUGEPAGES_2M_DIR "/nr_hugepages", &h->nr, err)) ||
	    (rc = read_u64_file(HUGEPAGES_2M_DIR "/free_hugepages", &h->free, err)) ||
	    (rc = read_u64_file(HUGEPAGES_2M_DIR "/resv_hugepages", &h->resv, err)) ||
	    (rc = read_u64_file(HUGEPAGES_2M_DIR "/surplus_hugepages", &h->surplus, err)))
		return rc;
	h->available = h->free > h->resv ? h->free - h->resv : 0;
	return 0;
}

int memstat_mem_available(uint64_t *bytes, struct hearth_error *err)
{
	*bytes = 0;
	FILE *f = fopen("/proc/meminfo", "re");
	if (!f)
		return hearth_error_errno(err, HEARTH_EIO, errno, "/proc/meminfo: cannot open");
	char line[256];
	unsigned long long kb;
	bool found = false;
	while (!found && fgets(line, sizeof line, f))
		found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
	fclose(f);
	if (!found)
		return hearth_error_set(err, HEARTH_EFORMAT, "/proc/meminfo: no MemAvailable line");
	*bytes = (uint64_t)kb * 1024;
	return 0;
}

int memstat_thp_mode(char *buf, size_t size, struct hearth_error *err)
{
	FILE *f = fopen(THP_ENABLED_PATH, "re");
	if (!f)
		return hearth_error_errno(err, HEARTH_EIO, errno, "%s: cannot open", THP_ENABLED_PATH);
	char line[128];
	bool ok = fgets(line, sizeof line, f) != NULL;
	fclose(f);
	/* "always [madvise] never": the bracketed word is the mode */
	const char *open = ok ? strchr(line, '[') : NULL;
	const char *close = open ? strchr(open, ']') : NULL;
	if (!close)
		return hearth_error_set(err, HEARTH_EFORMAT, "%s: no [mode] in '%s'", THP_ENABLED_PATH,
					ok ? line : "");
	snprintf(buf, size, "%.*s", (int)(close - open - 1), open + 1);
	return 0;
}

int memstat_reset_peak(struct hearth_error *err)
{
	int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return hearth_error_errno(err, HEARTH_EIO, errno, "/proc/self/clear_refs: cannot open");
	ssize_t n = write(fd, "5", 1);
	int e = errno;
	close(fd);
	if (n != 1)
		return hearth_error_errno(err, HEARTH_EIO, e, "/proc/self/clear_refs: cannot write");
	return 0;
}
