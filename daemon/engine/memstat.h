/* What the kernel says about this process's memory and the machine's page pools: the
 * /proc/self status, statm and smaps files and the hugepage/THP knobs in /sys, parsed into
 * plain structs. The arena reports what it got from these, the ledger adds them up. */
#ifndef HEARTH_DAEMON_MEMSTAT_H
#define HEARTH_DAEMON_MEMSTAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/error.h"

/* /proc/self/status, in bytes. hugetlb pages are not part of vm_rss: the kernel counts them
 * apart (HugetlbPages), so "everything resident" is vm_rss + hugetlb. */
struct memstat_status {
	size_t vm_rss;
	size_t vm_hwm;       /* peak of vm_rss since start or the last memstat_reset_peak */
	size_t rss_anon;
	size_t rss_file;
	size_t rss_shmem;
	size_t vm_lck;
	size_t hugetlb;
};

int memstat_read_status(struct memstat_status *st, struct hearth_error *err);

/* /proc/self/smaps_rollup, in bytes: totals over every mapping. */
struct memstat_rollup {
	size_t rss;
	size_t pss;
	size_t anonymous;
	size_t anon_huge;        /* THP-backed anonymous bytes */
	size_t private_hugetlb;
	size_t shared_hugetlb;
	size_t locked;
};

int memstat_read_rollup(struct memstat_rollup *r, struct hearth_error *err);

/* RssAnon from /proc/self/statm (resident minus file and shmem pages), read with pread on an
 * fd the caller opened once, so a 10 ms sampler allocates nothing and parses one line. */
int memstat_statm_open(struct hearth_error *err);  /* returns the fd, or a negative code */
int memstat_statm_anon(int fd, size_t *bytes);     /* 0, or -1 with errno set */

/* One mapping of /proc/self/smaps. path is "" for anonymous memory, "[heap]", "[stack]",
 * or the file (possibly "/memfd:name (deleted)"). */
struct memstat_vma {
	uintptr_t start, end;
	char perms[5];
	uint64_t inode;
	char path[256];
	size_t rss;
	size_t anonymous;
	size_t anon_huge;
	size_t private_hugetlb;
	size_t shared_hugetlb;
	size_t locked;
};

/* Calls fn for every mapping, in address order; a non-zero return from fn stops the walk
 * and is returned. */
typedef int (*memstat_vma_fn)(const struct memstat_vma *vma, void *ctx);
int memstat_smaps_foreach(memstat_vma_fn fn, void *ctx, struct hearth_error *err);

/* Sums of the smaps fields over the mappings that intersect [start, start+len). */
int memstat_range_smaps(const void *start, size_t len, struct memstat_vma *sum,
			struct hearth_error *err);

/* The 2 MiB hugetlb pool (/sys/kernel/mm/hugepages/hugepages-2048kB). available is what a
 * new mapping can reserve: free minus already reserved. */
struct memstat_hugepages {
	uint64_t nr, free, resv, surplus;
	uint64_t available;
};

int memstat_hugepages_2m(struct memstat_hugepages *h, struct hearth_error *err);

/* The kernel's estimate of memory a new allocation can have without swapping (MemAvailable
 * in /proc/meminfo), in bytes. */
int memstat_mem_available(uint64_t *bytes, struct hearth_error *err);

/* Transparent hugepage mode: "always", "madvise" or "never" (copied into buf). */
int memstat_thp_mode(char *buf, size_t size, struct hearth_error *err);

/* Resets the kernel's VmHWM to the current RSS (writes 5 to /proc/self/clear_refs), so a
 * later VmHWM is the peak of what came after. */
int memstat_reset_peak(struct hearth_error *err);

#endif
