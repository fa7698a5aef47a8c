/* The arena: one mapping per model, chosen page kind, one NUMA node, carved by bump
 * allocation. Everything that decides "what did we get" lives here so the daemon logs one
 * note and the ledger reads one struct; nothing here prints. */
#include "daemon/engine/arena.h"

#include <errno.h>
#include <inttypes.h>
#include <numa.h>
#include <numaif.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "daemon/engine/memstat.h"

#ifndef MAP_HUGE_SHIFT
#define MAP_HUGE_SHIFT 26
#endif
#ifndef MAP_HUGE_2MB
#define MAP_HUGE_2MB (21 << MAP_HUGE_SHIFT)
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* Regions start at least page-aligned so each one's residency (mincore) and placement
 * (move_pages) is its own; the cost is under 4 KiB per region. */
#define REGION_MIN_ALIGN ((size_t)4096)
#define PLACEMENT_BATCH 512

static size_t base_page_size(void)
{
	long p = sysconf(_SC_PAGESIZE);
	return p > 0 ? (size_t)p : 4096;
}

static bool round_up(size_t v, size_t align, size_t *out)
{
	size_t r;
	if (__builtin_add_overflow(v, align - 1, &r))
		return false;
	*out = r & ~(align - 1);
	return true;
}

static bool is_pow2(size_t v)
{
	return v && (v & (v - 1)) == 0;
}

static void note_add(struct arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_add(struct arena *a, const char *fmt, ...)
{
	size_t n = strlen(a->note);
	if (n + 1 >= sizeof a->note)
		return;
	if (n) {
		snprintf(a->note + n, sizeof a->note - n, "; ");
		n = strlen(a->note);
	}
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(a->note + n, sizeof a->note - n, fmt, ap);
	va_end(ap);
}

void arena_plan_init(struct arena_plan *plan)
{
	memset(plan, 0, sizeof *plan);
}

int arena_plan_add(struct arena_plan *plan, const char *name, size_t size, size_t align,
		   struct hearth_error *err)
{
	size_t len = strlen(name);
	if (len == 0 || len >= ARENA_NAME_MAX)
		return hearth_error_set(err, HEARTH_EINVAL,
					"arena region name '%s': must be 1..%d characters", name,
					ARENA_NAME_MAX - 1);
	if (!is_pow2(align))
		return hearth_error_set(err, HEARTH_EINVAL,
					"arena region '%s': alignment %zu is not a power of two", name, align);
	for (size_t i = 0; i < plan->n_regions; i++)
		if (strcmp(plan->regions[i].name, name) == 0)
			return hearth_error_set(err, HEARTH_EINVAL,
						"arena region '%s' is already in the plan", name);
	if (plan->n_regions >= ARENA_MAX_REGIONS)
		return hearth_error_set(err, HEARTH_EINVAL,
					"arena region '%s': the plan already has the maximum of %d regions",
					name, ARENA_MAX_REGIONS);
	struct arena_plan_region *r = &plan->regions[plan->n_regions++];
	memcpy(r->name, name, len + 1);
	r->size = size;
	r->align = align;
	return 0;
}

/* Offsets of each region from the arena base, and the end of the last one. */
static int plan_layout(const struct arena_plan *plan, size_t *offsets, size_t *end,
		       struct hearth_error *err)
{
	size_t off = 0;
	for (size_t i = 0; i < plan->n_regions; i++) {
		const struct arena_plan_region *r = &plan->regions[i];
		size_t align = r->align > REGION_MIN_ALIGN ? r->align : REGION_MIN_ALIGN;
		if (!round_up(off, align, &off) || __builtin_add_overflow(off, r->size, &off))
			return hearth_error_set(err, HEARTH_ERANGE,
						"arena plan: region '%s' (%zu bytes) overflows the address space",
						r->name, r->size);
		if (offsets)
			offsets[i] = off - r->size;
	}
	*end = off;
	return 0;
}

int arena_plan_size(const struct arena_plan *plan, size_t *bytes, struct hearth_error *err)
{
	return plan_layout(plan, NULL, bytes, err);
}

static const char *const pages_names[] = { "auto", "hugetlb", "thp", "none" };

const char *arena_pages_name(enum arena_pages p)
{
	return (unsigned)p < sizeof pages_names / sizeof pages_names[0] ? pages_names[p] : "?";
}

int arena_pages_parse(const char *text, enum arena_pages *out, struct hearth_error *err)
{
	for (size_t i = 0; i < sizeof pages_names / sizeof pages_names[0]; i++)
		if (strcmp(text, pages_names[i]) == 0) {
			*out = (enum arena_pages)i;
			return 0;
		}
	return hearth_error_set(err, HEARTH_EINVAL,
				"bad pages value '%s': expected auto, hugetlb, thp or none", text);
}

const char *arena_backing_name(enum arena_backing b)
{
	switch (b) {
	case ARENA_BACKING_HUGETLB: return "hugetlb";
	case ARENA_BACKING_THP: return "thp";
	case ARENA_BACKING_NORMAL: return "normal";
	}
	return "?";
}

static int map_hugetlb(struct arena *a, size_t planned, size_t base_align,
		       struct hearth_error *err)
{
	if (base_align > ARENA_HUGE_PAGE)
		return hearth_error_set(err, HEARTH_EINVAL,
					"hugetlb: a region asks for %zu-byte alignment, more than the "
					"2 MiB a hugetlb mapping guarantees", base_align);
	size_t size;
	if (!round_up(planned, ARENA_HUGE_PAGE, &size))
		return hearth_error_set(err, HEARTH_ERANGE, "arena: %zu bytes overflow", planned);
	size_t need = size / ARENA_HUGE_PAGE;
	struct memstat_hugepages hp;
	struct hearth_error e2;
	bool pool_known = memstat_hugepages_2m(&hp, &e2) == 0;
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_HUGE_2MB, -1, 0);
	if (p == MAP_FAILED) {
		int e = errno;
		if (pool_known)
			return hearth_error_set(err, HEARTH_ENOMEM,
						"hugetlb: need %zu free 2 MiB pages for %zu bytes, %" PRIu64
						" available (nr_hugepages=%" PRIu64 " free=%" PRIu64
						" resv=%" PRIu64 "; raise vm.nr_hugepages): %s",
						need, size, hp.available, hp.nr, hp.free, hp.resv,
						strerror(e));
		return hearth_error_errno(err, HEARTH_ENOMEM, e,
					  "hugetlb: cannot map %zu bytes of 2 MiB pages (%s)", size,
					  e2.msg);
	}
	a->base = p;
	a->size = size;
	a->backing = ARENA_BACKING_HUGETLB;
	a->page_size = ARENA_HUGE_PAGE;
	return 0;
}

/* Anonymous memory whose base is aligned to base_align (2 MiB for THP, so huge pages can
 * back all of it and not just the middle; more when a region asks for it) and whose size
 * is a multiple of unit. */
static int map_aligned(struct arena *a, size_t planned, size_t unit, size_t base_align,
		       struct hearth_error *err)
{
	size_t align = base_align > unit ? base_align : unit;
	size_t size, span;
	if (!round_up(planned, unit, &size) || __builtin_add_overflow(size, align, &span))
		return hearth_error_set(err, HEARTH_ERANGE, "arena: %zu bytes overflow", planned);
	uint8_t *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return hearth_error_errno(err, HEARTH_ENOMEM, errno, "arena: cannot map %zu bytes",
					  size);
	uintptr_t start = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
	size_t head = start - (uintptr_t)p;
	if (head)
		munmap(p, head);
	size_t tail = span - head - size;
	if (tail)
		munmap((uint8_t *)start + size, tail);
	a->base = (uint8_t *)start;
	a->size = size;
	return 0;
}

static int map_thp(struct arena *a, size_t planned, size_t base_align, struct hearth_error *err)
{
	char mode[32];
	struct hearth_error why;
	if (memstat_thp_mode(mode, sizeof mode, &why) != 0)
		return hearth_error_set(err, HEARTH_ENOMEM, "thp: unavailable (%s)", why.msg);
	if (strcmp(mode, "never") == 0)
		return hearth_error_set(err, HEARTH_ENOMEM,
					"thp: transparent hugepages are disabled (enabled=[never]; set "
					"/sys/kernel/mm/transparent_hugepage/enabled to madvise)");
	int rc = map_aligned(a, planned, ARENA_HUGE_PAGE, base_align, err);
	if (rc)
		return rc;
	if (madvise(a->base, a->size, MADV_HUGEPAGE) != 0) {
		int e = errno;
		munmap(a->base, a->size);
		a->base = NULL;
		a->size = 0;
		return hearth_error_errno(err, HEARTH_ENOMEM, e, "thp: madvise(MADV_HUGEPAGE)");
	}
	a->backing = ARENA_BACKING_THP;
	a->page_size = ARENA_HUGE_PAGE;
	return 0;
}

static int map_normal(struct arena *a, size_t planned, size_t base_align, bool refuse_thp,
		      struct hearth_error *err)
{
	size_t page = base_page_size();
	int rc = map_aligned(a, planned, page, base_align, err);
	if (rc)
		return rc;
	/* With THP "always", normal pages must be asked for, or the kernel picks for us. */
	if (refuse_thp)
		madvise(a->base, a->size, MADV_NOHUGEPAGE);
	a->backing = ARENA_BACKING_NORMAL;
	a->page_size = page;
	return 0;
}

static int map_pages(struct arena *a, size_t planned, size_t base_align, enum arena_pages pages,
		     struct hearth_error *err)
{
	struct hearth_error e;
	hearth_error_clear(&e);
	switch (pages) {
	case ARENA_PAGES_HUGETLB:
		return map_hugetlb(a, planned, base_align, err);
	case ARENA_PAGES_THP:
		return map_thp(a, planned, base_align, err);
	case ARENA_PAGES_NONE:
		return map_normal(a, planned, base_align, true, err);
	case ARENA_PAGES_AUTO:
		break;
	default:
		return hearth_error_set(err, HEARTH_EINVAL, "arena: unknown pages policy %d", pages);
	}
	if (map_hugetlb(a, planned, base_align, &e) == 0)
		return 0;
	note_add(a, "pages=auto: %s", e.msg);
	if (map_thp(a, planned, base_align, &e) == 0)
		return 0;
	note_add(a, "%s", e.msg);
	return map_normal(a, planned, base_align, false, err);
}

/* The node of the first CPU this thread may run on. */
static int affinity_node(void)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	if (sched_getaffinity(0, sizeof set, &set) != 0)
		return 0;
	for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
		if (CPU_ISSET(cpu, &set)) {
			int node = numa_node_of_cpu(cpu);
			return node >= 0 ? node : 0;
		}
	return 0;
}

/* Decides the node before anything is mapped, so a bad override fails cheaply. *node is -1
 * when NUMA is unavailable and binding is skipped. */
static int choose_node(struct arena *a, int want, int *node, struct hearth_error *err)
{
	if (numa_available() < 0) {
		if (want > 0)
			return hearth_error_set(err, HEARTH_EINVAL,
						"numa_node=%d: NUMA is not available on this machine "
						"(numa_available() < 0); use -1 or 0", want);
		note_add(a, "numa: unavailable, arena not bound");
		*node = -1;
		return 0;
	}
	int max = numa_max_node();
	int n = want >= 0 ? want : affinity_node();
	if (n > max || n >= ARENA_MAX_NODES)
		return hearth_error_set(err, HEARTH_EINVAL,
					"numa_node=%d: this machine has nodes 0-%d", n, max);
	struct bitmask *mems = numa_get_mems_allowed();
	bool allowed = mems && numa_bitmask_isbitset(mems, (unsigned)n);
	if (mems)
		numa_bitmask_free(mems);
	if (!allowed)
		return hearth_error_set(err, HEARTH_EINVAL,
					"numa_node=%d: node has no memory this process may use "
					"(cpuset mems or memoryless node)", n);
	*node = n;
	return 0;
}

static int bind_node(struct arena *a, int node, struct hearth_error *err)
{
	struct bitmask *mask = numa_allocate_nodemask();
	if (!mask)
		return hearth_error_set(err, HEARTH_ENOMEM, "numa: cannot allocate a node mask");
	numa_bitmask_setbit(mask, (unsigned)node);
	long rc = mbind(a->base, a->size, MPOL_BIND, mask->maskp, mask->size + 1, 0);
	int e = errno;
	numa_bitmask_free(mask);
	if (rc != 0)
		return hearth_error_errno(err, HEARTH_EIO, e, "numa: mbind of %zu bytes to node %d",
					  a->size, node);
	return 0;
}

static int lock_arena(struct arena *a, struct hearth_error *err)
{
	if (mlock(a->base, a->size) == 0)
		return 0;
	int e = errno;
	struct rlimit rl;
	char cur[32] = "?", max[32] = "?";
	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
		if (rl.rlim_cur == RLIM_INFINITY)
			snprintf(cur, sizeof cur, "unlimited");
		else
			snprintf(cur, sizeof cur, "%llu", (unsigned long long)rl.rlim_cur);
		if (rl.rlim_max == RLIM_INFINITY)
			snprintf(max, sizeof max, "unlimited");
		else
			snprintf(max, sizeof max, "%llu", (unsigned long long)rl.rlim_max);
	}
	return hearth_error_set(err, HEARTH_EPERM,
				"lock_memory: cannot mlock the %zu-byte arena: RLIMIT_MEMLOCK is %s "
				"bytes (hard limit %s); raise it (systemd LimitMEMLOCK=, shell ulimit -l) "
				"or set lock_memory=false (%s)",
				a->size, cur, max, strerror(e));
}

int arena_create(struct arena *a, const struct arena_plan *plan, const struct arena_config *cfg,
		 struct hearth_error *err)
{
	memset(a, 0, sizeof *a);
	size_t offsets[ARENA_MAX_REGIONS];
	size_t planned;
	int rc = plan_layout(plan, offsets, &planned, err);
	if (rc)
		return rc;
	if (planned == 0)
		planned = 1; /* an empty plan still maps one page: base is never NULL */
	int node = -1;
	if ((rc = choose_node(a, cfg->numa_node, &node, err)))
		goto fail;
	/* offsets are aligned relative to the base, so the base carries the largest alignment */
	size_t base_align = REGION_MIN_ALIGN;
	for (size_t i = 0; i < plan->n_regions; i++)
		if (plan->regions[i].align > base_align)
			base_align = plan->regions[i].align;
	if ((rc = map_pages(a, planned, base_align, cfg->pages, err)))
		goto fail;
	a->planned = planned;
	note_add(a, "arena: %zu bytes on %s pages", a->size, arena_backing_name(a->backing));
	if (node >= 0) {
		if ((rc = bind_node(a, node, err)))
			goto fail;
		a->numa_node = node;
		a->numa_bound = true;
		note_add(a, "numa: bound to node %d", node);
	} else {
		a->numa_node = -1;
	}
	if (cfg->lock_memory) {
		if ((rc = lock_arena(a, err)))
			goto fail;
		a->locked = true;
	}
	for (size_t i = 0; i < plan->n_regions; i++) {
		struct arena_region *r = &a->regions[i];
		memcpy(r->name, plan->regions[i].name, sizeof r->name);
		r->base = a->base + offsets[i];
		r->size = plan->regions[i].size;
		r->used = 0;
	}
	a->n_regions = plan->n_regions;
	return 0;
fail:
	arena_destroy(a);
	return rc;
}

void arena_destroy(struct arena *a)
{
	if (a->base)
		munmap(a->base, a->size);
	memset(a, 0, sizeof *a);
}

struct arena_region *arena_region_find(struct arena *a, const char *name)
{
	for (size_t i = 0; i < a->n_regions; i++)
		if (strcmp(a->regions[i].name, name) == 0)
			return &a->regions[i];
	return NULL;
}

int arena_alloc(struct arena *a, const char *region, size_t size, size_t align, void **out,
		struct hearth_error *err)
{
	struct arena_region *r = arena_region_find(a, region);
	if (!r)
		return hearth_error_set(err, HEARTH_ENOTFOUND, "arena: no region '%s' in the plan",
					region);
	if (!is_pow2(align))
		return hearth_error_set(err, HEARTH_EINVAL,
					"arena region '%s': alignment %zu is not a power of two", region,
					align);
	/* align the address, not the offset: the region base is only page-aligned */
	uintptr_t base = (uintptr_t)r->base;
	uintptr_t at = (base + r->used + align - 1) & ~(uintptr_t)(align - 1);
	size_t off = (size_t)(at - base);
	size_t end;
	if (at < base || __builtin_add_overflow(off, size, &end) || end > r->size)
		return hearth_error_set(err, HEARTH_ENOMEM,
					"arena region '%s' is full: %zu bytes (align %zu) asked, %zu of %zu "
					"left; the plan under-sized it",
					region, size, align, r->size - r->used, r->size);
	r->used = end;
	*out = r->base + off;
	return 0;
}

int arena_prefault(struct arena *a, void *start, size_t len, struct hearth_error *err)
{
	uintptr_t s = (uintptr_t)start, base = (uintptr_t)a->base;
	if (s < base || s - base > a->size || len > a->size - (s - base))
		return hearth_error_set(err, HEARTH_EINVAL,
					"arena_prefault: range %p+%zu is outside the arena %p+%zu", start,
					len, (void *)a->base, a->size);
	if (len == 0)
		return 0;
	size_t page = base_page_size();
	uintptr_t lo = s & ~(uintptr_t)(page - 1);
	uintptr_t hi = (s + len + page - 1) & ~(uintptr_t)(page - 1);
	if (madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE) == 0)
		return 0;
	int e = errno;
	if (e != EINVAL)
		return hearth_error_errno(err, HEARTH_ENOMEM, e,
					  "arena_prefault: cannot make %zu bytes resident", (size_t)(hi - lo));
	/* Kernels before 5.14: a write per page, keeping whatever is there. A fault here with
	 * no memory left is SIGBUS/OOM, which is why the populate path is preferred. */
	for (uintptr_t p = lo; p < hi; p += page) {
		volatile uint8_t *b = (volatile uint8_t *)p;
		*b = *b;
	}
	return 0;
}

int arena_placement(const struct arena *a, const void *start, size_t len,
		    struct arena_placement *out, struct hearth_error *err)
{
	memset(out, 0, sizeof *out);
	uintptr_t s = (uintptr_t)start, base = (uintptr_t)a->base;
	if (s < base || s - base > a->size || len > a->size - (s - base))
		return hearth_error_set(err, HEARTH_EINVAL,
					"arena_placement: range %p+%zu is outside the arena", start, len);
	if (numa_available() < 0)
		return 0;
	/* hugetlb pages are indivisible: one query per 2 MiB. THP may be split, so 4 KiB. */
	size_t step = a->backing == ARENA_BACKING_HUGETLB ? ARENA_HUGE_PAGE : base_page_size();
	uintptr_t lo = s & ~(uintptr_t)(step - 1);
	uintptr_t hi = s + len;
	void *pages[PLACEMENT_BATCH];
	int status[PLACEMENT_BATCH];
	int max_node = -1;
	for (uintptr_t p = lo; p < hi;) {
		unsigned long n = 0;
		for (; n < PLACEMENT_BATCH && p < hi; n++, p += step)
			pages[n] = (void *)p;
		if (move_pages(0, n, pages, NULL, status, 0) != 0) {
			int e = errno;
			if (e == ENOSYS) /* kernel without NUMA: placement is unknowable */
				return 0;
			return hearth_error_errno(err, HEARTH_EIO, e, "arena_placement: move_pages");
		}
		for (unsigned long i = 0; i < n; i++) {
			/* the first and last step may be partly outside [start, start+len) */
			uintptr_t ps = (uintptr_t)pages[i], pe = ps + step;
			size_t bytes = (size_t)((pe < hi ? pe : hi) - (ps > s ? ps : s));
			int st = status[i];
			if (st >= 0 && st < ARENA_MAX_NODES) {
				out->node_bytes[st] += bytes;
				if (st > max_node)
					max_node = st;
				if (a->numa_bound && st != a->numa_node)
					out->bytes_other_node += bytes;
			} else {
				/* -ENOENT: never touched; -EFAULT: the shared zero page */
				out->bytes_not_present += bytes;
			}
		}
	}
	out->numa_known = true;
	int machine_nodes = numa_max_node() + 1;
	out->n_nodes = machine_nodes > max_node + 1 ? machine_nodes : max_node + 1;
	if (out->n_nodes > ARENA_MAX_NODES)
		out->n_nodes = ARENA_MAX_NODES;
	return 0;
}

int arena_verify_placement(const struct arena *a, struct arena_placement *out,
			   struct hearth_error *err)
{
	int rc = arena_placement(a, a->base, a->size, out, err);
	if (rc)
		return rc;
	if (!out->numa_known || !a->numa_bound || out->bytes_other_node == 0)
		return 0;
	char list[256] = "";
	size_t n = 0;
	for (int i = 0; i < out->n_nodes && n < sizeof list; i++)
		if (out->node_bytes[i]) {
			int w = snprintf(list + n, sizeof list - n, "%snode %d: %zu bytes", n ? ", " : "",
					 i, out->node_bytes[i]);
			if (w > 0)
				n += (size_t)w;
		}
	return hearth_error_set(err, HEARTH_EINVAL,
				"numa: %zu arena bytes are off the bound node %d (%s)",
				out->bytes_other_node, a->numa_node, list);
}

int arena_node_cpus(int node, int *cpus, size_t max, size_t *n, struct hearth_error *err)
{
	*n = 0;
	if (numa_available() < 0) {
		cpu_set_t set;
		CPU_ZERO(&set);
		if (sched_getaffinity(0, sizeof set, &set) != 0)
			return hearth_error_errno(err, HEARTH_EIO, errno, "sched_getaffinity");
		for (int c = 0; c < CPU_SETSIZE && *n < max; c++)
			if (CPU_ISSET(c, &set))
				cpus[(*n)++] = c;
		return 0;
	}
	if (node < 0 || node > numa_max_node())
		return hearth_error_set(err, HEARTH_EINVAL, "numa node %d: this machine has nodes 0-%d",
					node, numa_max_node());
	struct bitmask *mask = numa_allocate_cpumask();
	if (!mask)
		return hearth_error_set(err, HEARTH_ENOMEM, "numa: cannot allocate a cpu mask");
	if (numa_node_to_cpus(node, mask) != 0) {
		int e = errno;
		numa_bitmask_free(mask);
		return hearth_error_errno(err, HEARTH_EIO, e, "numa: cpus of node %d", node);
	}
	for (unsigned c = 0; c < mask->size && *n < max; c++)
		if (numa_bitmask_isbitset(mask, c))
			cpus[(*n)++] = (int)c;
	numa_bitmask_free(mask);
	return 0;
}

int arena_stats(const struct arena *a, struct arena_stats *st, struct hearth_error *err)
{
	memset(st, 0, sizeof *st);
	st->backing = a->backing;
	st->page_size = a->page_size;
	st->size = a->size;
	for (size_t i = 0; i < a->n_regions; i++)
		st->used += a->regions[i].used;
	st->numa_node = a->numa_node;
	st->numa_bound = a->numa_bound;
	st->locked = a->locked;
	if (!a->base)
		return 0;
	struct memstat_vma sum;
	int rc = memstat_range_smaps(a->base, a->size, &sum, err);
	if (rc)
		return rc;
	st->huge_bytes = sum.anon_huge + sum.private_hugetlb + sum.shared_hugetlb;
	return arena_placement(a, a->base, a->size, &st->placement, err);
}
