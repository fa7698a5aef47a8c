/* The memory ledger: every byte the daemon holds, counted once and grouped (packed weights
 * by type, embedding/head, norms, RoPE, KV pool, scratch, rings, code and libraries, other
 * heap and stacks), each with its residency, checked against the kernel's RSS; and the load
 * peak, from a sampler thread, next to the settled size. */
#ifndef HEARTH_DAEMON_LEDGER_H
#define HEARTH_DAEMON_LEDGER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/engine/arena.h"
#include "daemon/engine/memstat.h"
#include "protocol/error.h"

enum ledger_group {
	LEDGER_WEIGHTS,      /* packed weights, one entry per type (regions "weights.<type>") */
	LEDGER_EMBED_HEAD,   /* token embedding and output head; the tied tensor once */
	LEDGER_NORMS,
	LEDGER_ROPE,
	LEDGER_KV,
	LEDGER_SCRATCH,
	LEDGER_RINGS,
	LEDGER_DRAFT,        /* the draft model's regions in the arena ("draft.<region>") */
	LEDGER_ARENA_OTHER,  /* arena regions of other names, alignment, page rounding */
	LEDGER_MODEL_FILE,   /* the GGUF mapping while it is mapped */
	LEDGER_CODE,         /* file-backed mappings: the executable and shared libraries */
	LEDGER_OTHER,        /* heap, stacks, anonymous and shared memory nobody registered */
	LEDGER_N_GROUPS
};

/* Stable names, used as JSON keys: "weights", "embed_head", "norms", "rope", "kv",
 * "scratch", "rings", "draft", "arena_other", "model_file", "code", "other". */
const char *ledger_group_name(enum ledger_group g);

#define LEDGER_MAX_ENTRIES 48
#define LEDGER_MAX_RANGES 8
#define LEDGER_NAME_MAX 48

struct ledger_entry {
	char name[LEDGER_NAME_MAX];
	enum ledger_group group;
	size_t bytes;        /* reserved: a region's planned size, a range's length */
	size_t used;         /* filled: an arena region's bump offset; = bytes otherwise */
	size_t resident;     /* in RAM now (mincore, or smaps Rss for whole mappings) */
};

/* Memory the caller owns outside the arena that belongs in the ledger under a name: the
 * per-client ring mappings, the GGUF mapping while loading, a large scratch buffer.
 * Ranges must not overlap each other or the arena (HEARTH_EINVAL): each byte once. */
struct ledger_range {
	const char *name;
	enum ledger_group group;
	const void *addr;
	size_t len;
};

/* What the sampler saw between start and stop (bytes of RssAnon). */
struct ledger_load {
	bool valid;
	size_t baseline_anon;    /* at start */
	size_t peak_anon;        /* highest sample */
	size_t settled_anon;     /* at stop, after load gave its transients back */
	size_t transient;        /* peak_anon - settled_anon */
	size_t kernel_peak_rss;  /* VmHWM at stop (reset at start): catches spikes between samples */
	uint64_t peak_at_ms;     /* since start */
	uint64_t duration_ms;
	uint64_t samples;
};

struct ledger {
	struct ledger_entry entries[LEDGER_MAX_ENTRIES];
	size_t n_entries;
	size_t group_bytes[LEDGER_N_GROUPS];
	size_t group_resident[LEDGER_N_GROUPS];
	size_t total_resident;       /* sum of entries */

	struct memstat_status status;
	struct memstat_rollup rollup;
	/* vm_rss + hugetlb: RSS leaves hugetlb pages out, the ledger counts them. */
	size_t process_resident;
	double diff_pct;             /* (total_resident - process_resident) / process_resident */

	bool have_arena;
	enum arena_backing backing;
	size_t arena_size;
	size_t arena_page_size;
	size_t arena_huge_bytes;     /* arena bytes backed by huge pages now */
	int numa_node;
	bool numa_bound;
	bool locked;
	struct arena_placement placement;

	struct ledger_load load;
};

/* Measures now. arena may be NULL; ranges (at most LEDGER_MAX_RANGES) as above; load is the
 * sampler's result (NULL: none). Reads /proc/self/{smaps,status,smaps_rollup}, calls
 * mincore(2) and move_pages(2); allocates nothing larger than stdio's buffers, so it does
 * not disturb what it measures. */
int ledger_collect(struct ledger *l, const struct arena *arena, const struct ledger_range *ranges,
		   size_t n_ranges, const struct ledger_load *load, struct hearth_error *err);

/* A human table / one JSON object. Both return the length the whole text needs (like
 * snprintf): if it is >= size, buf holds a truncated, NUL-terminated prefix. */
size_t ledger_format_table(const struct ledger *l, char *buf, size_t size);
size_t ledger_format_json(const struct ledger *l, char *buf, size_t size);


/* Samples RssAnon every interval_ms (10 for loading) on its own thread, from an fd opened
 * once: no allocation per sample. Start before mapping the model, stop after the load
 * released its transients. start also resets the kernel's VmHWM (best effort). */
struct ledger_sampler {
	pthread_t thread;
	int statm_fd;
	unsigned interval_ms;
	bool running;
	atomic_bool stop;
	atomic_size_t peak_anon;
	atomic_uint_fast64_t peak_at_ns;
	atomic_uint_fast64_t samples;
	size_t baseline_anon;
	uint64_t t0_ns;
};

int ledger_sampler_start(struct ledger_sampler *s, unsigned interval_ms, struct hearth_error *err);
/* Samples taken so far (any thread may ask). */
uint64_t ledger_sampler_samples(struct ledger_sampler *s);
/* Joins the thread, takes the settled sample, fills out. */
int ledger_sampler_stop(struct ledger_sampler *s, struct ledger_load *out, struct hearth_error *err);

#endif
