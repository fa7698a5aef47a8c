/* The model's one memory arena: sized once from a plan of named regions (weights, norms,
 * RoPE tables, KV pool, scratch, rings), mapped once with the best page size the machine
 * gives (hugetlb, THP, normal), bound to one NUMA node, optionally locked, never grown.
 * Regions are carved by bump allocation and never freed one by one; arena_destroy unmaps all. */
#ifndef HEARTH_DAEMON_ARENA_H
#define HEARTH_DAEMON_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/error.h"

#define ARENA_MAX_REGIONS 32
#define ARENA_NAME_MAX 32
#define ARENA_MAX_NODES 64
#define ARENA_NOTE_MAX 384
#define ARENA_HUGE_PAGE ((size_t)2 << 20)

/* Region names the loader, kv and ledger agree on. The ledger groups regions by these:
 * "weights" or "weights.<type>" (one region per packed type, e.g. "weights.q4g128"),
 * "embed_head" (token embedding and output head; the tied tensor lives here once), "norms",
 * "rope", "kv_pool" (and "kv_pool.sliding": the sliding-window layers' rings), "scratch" or
 * "scratch.<what>", "rings" or "rings.<what>". A draft model loaded with the model (load.h)
 * has its own regions of the same names under ARENA_DRAFT_PREFIX ("draft.weights.q4g32",
 * "draft.kv_pool", ...), which the ledger shows as the draft's. Any other name is counted
 * as "arena other". */
#define ARENA_REGION_WEIGHTS "weights"
#define ARENA_REGION_EMBED_HEAD "embed_head"
#define ARENA_REGION_NORMS "norms"
#define ARENA_REGION_ROPE "rope"
#define ARENA_REGION_KV "kv_pool"
#define ARENA_REGION_KV_SLIDING "kv_pool.sliding"
#define ARENA_REGION_SCRATCH "scratch"
#define ARENA_REGION_RINGS "rings"
#define ARENA_DRAFT_PREFIX "draft."

struct arena_plan_region {
	char name[ARENA_NAME_MAX];
	size_t size;
	size_t align;       /* power of two; regions start at least page-aligned (4 KiB) */
};

/* What the loader computes before it maps anything. */
struct arena_plan {
	struct arena_plan_region regions[ARENA_MAX_REGIONS];
	size_t n_regions;
};

void arena_plan_init(struct arena_plan *plan);
/* Adds a region; a name already in the plan, a name longer than ARENA_NAME_MAX-1, an align
 * that is not a power of two, or a full plan is HEARTH_EINVAL. size 0 is allowed (an
 * empty region that exists by name). */
int arena_plan_add(struct arena_plan *plan, const char *name, size_t size, size_t align,
		   struct hearth_error *err);
/* Bytes the plan needs: region sizes plus alignment padding, before rounding to the page
 * size (the arena rounds up to 2 MiB when hugepage-backed). HEARTH_ERANGE on overflow. */
int arena_plan_size(const struct arena_plan *plan, size_t *bytes, struct hearth_error *err);

enum arena_pages {
	ARENA_PAGES_AUTO,     /* hugetlb, else THP, else normal: the first that works */
	ARENA_PAGES_HUGETLB,  /* 2 MiB hugetlbfs pages or fail */
	ARENA_PAGES_THP,      /* transparent hugepages (madvise) or fail */
	ARENA_PAGES_NONE,     /* normal pages, THP explicitly refused (MADV_NOHUGEPAGE) */
};

enum arena_backing {
	ARENA_BACKING_HUGETLB,
	ARENA_BACKING_THP,
	ARENA_BACKING_NORMAL,
};

const char *arena_pages_name(enum arena_pages p);       /* "auto", "hugetlb", "thp", "none" */
/* Parses the config spelling (the names above); HEARTH_EINVAL names the accepted words. */
int arena_pages_parse(const char *text, enum arena_pages *out, struct hearth_error *err);
const char *arena_backing_name(enum arena_backing b);   /* "hugetlb", "thp", "normal" */

struct arena_config {
	enum arena_pages pages;
	/* -1: the node of the first CPU this thread may run on (with systemd CPUAffinity= or a
	 * pinned main thread, that is the worker cores' node). >= 0: that node. */
	int numa_node;
	bool lock_memory;     /* mlock the whole arena; fails naming RLIMIT_MEMLOCK */
};

#define ARENA_CONFIG_DEFAULT { ARENA_PAGES_AUTO, -1, false }

struct arena_region {
	char name[ARENA_NAME_MAX];
	uint8_t *base;
	size_t size;        /* as planned: the region never grows past it */
	size_t used;        /* bump offset */
};

struct arena {
	uint8_t *base;
	size_t size;                  /* mapped bytes (plan rounded up to the page size) */
	size_t planned;               /* arena_plan_size of the plan */
	enum arena_backing backing;
	size_t page_size;             /* 2 MiB for hugetlb and THP, else the base page size */
	int numa_node;                /* the node bound to, or -1 when not bound */
	bool numa_bound;
	bool locked;
	/* How the backing and node were chosen, for the daemon to log: "hugetlb: need 8 free 2
	 * MiB pages, 0 available (nr_hugepages=0); THP (madvise): ok; numa: bound to node 0". */
	char note[ARENA_NOTE_MAX];
	struct arena_region regions[ARENA_MAX_REGIONS];
	size_t n_regions;
};

/* Maps the arena for plan (copied; the plan may be freed after). Nothing is touched yet
 * except with lock_memory (mlock faults every page in on the bound node). Errors:
 * HEARTH_ENOMEM when a required page kind cannot be had or the mapping fails (message names
 * the pool counts and the knob to turn), HEARTH_EINVAL for a bad numa_node, HEARTH_EPERM
 * when lock_memory exceeds RLIMIT_MEMLOCK (message names its value). On error a is left
 * empty (arena_destroy on it is a no-op). */
int arena_create(struct arena *a, const struct arena_plan *plan, const struct arena_config *cfg,
		 struct hearth_error *err);
/* Unmaps everything; a is zeroed. Safe on a zeroed or failed arena. */
void arena_destroy(struct arena *a);

/* The region named name, or NULL. */
struct arena_region *arena_region_find(struct arena *a, const char *name);

/* Carves size bytes aligned to align (power of two) from region `region`. Never grows: a
 * request past the planned size is HEARTH_ENOMEM naming the region, the request and what
 * is left. HEARTH_ENOTFOUND for an unknown region. */
int arena_alloc(struct arena *a, const char *region, size_t size, size_t align, void **out,
		struct hearth_error *err);

/* Makes every page of [start, start+len) resident and writable now (MADV_POPULATE_WRITE,
 * else a write per page that keeps the contents), so no request later pays a fault.
 * The range must lie inside the arena. */
int arena_prefault(struct arena *a, void *start, size_t len, struct hearth_error *err);

/* Where the pages of [start, start+len) are: move_pages(2) with NULL nodes, one query per
 * backing page. bytes_not_present counts pages never touched. With NUMA unavailable the
 * query is skipped and numa_known is false. */
struct arena_placement {
	bool numa_known;
	int n_nodes;                          /* entries of node_bytes that are meaningful */
	size_t node_bytes[ARENA_MAX_NODES];
	size_t bytes_not_present;
	size_t bytes_other_node;              /* present, but not on the bound node */
};

int arena_placement(const struct arena *a, const void *start, size_t len,
		    struct arena_placement *out, struct hearth_error *err);
/* arena_placement over the whole arena, then HEARTH_EINVAL if any present page sits on a
 * node other than the bound one (the message gives the counts per node). */
int arena_verify_placement(const struct arena *a, struct arena_placement *out,
			   struct hearth_error *err);

/* The CPUs of node (for pinning workers), ascending, at most max of them; *n gets the count.
 * With NUMA unavailable, the CPUs this thread may run on. HEARTH_EINVAL for a bad node. */
int arena_node_cpus(int node, int *cpus, size_t max, size_t *n, struct hearth_error *err);

struct arena_stats {
	enum arena_backing backing;
	size_t page_size;
	size_t size;
	size_t used;                  /* sum of the regions' bump offsets */
	int numa_node;
	bool numa_bound;
	bool locked;
	size_t huge_bytes;            /* backed by huge pages now: AnonHugePages + *_Hugetlb */
	struct arena_placement placement;
};

/* Backing, fill, hugepage-backed bytes (smaps) and pages per node (move_pages). */
int arena_stats(const struct arena *a, struct arena_stats *st, struct hearth_error *err);

#endif
