/* The ledger adds up the process's memory from two sides that must agree: what hearth
 * knows it owns (arena regions and registered ranges, by mincore) and what the kernel maps
 * (smaps). Whatever smaps shows outside the known ranges becomes "code and libraries" or
 * "other heap/stacks", so the entries sum to RSS (+ hugetlb) by construction, and a large
 * "other" line is itself the finding. */
#include "daemon/engine/ledger.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "protocol/clock.h"

#define MINCORE_CHUNK 4096  /* pages per mincore call: a 4 KiB vector on the stack */


static const char *const group_names[LEDGER_N_GROUPS] = {
	[LEDGER_WEIGHTS] = "weights",         [LEDGER_EMBED_HEAD] = "embed_head",
	[LEDGER_NORMS] = "norms",             [LEDGER_ROPE] = "rope",
	[LEDGER_KV] = "kv",                   [LEDGER_SCRATCH] = "scratch",
	[LEDGER_RINGS] = "rings",             [LEDGER_DRAFT] = "draft",
	[LEDGER_ARENA_OTHER] = "arena_other",
	[LEDGER_MODEL_FILE] = "model_file",   [LEDGER_CODE] = "code",
	[LEDGER_OTHER] = "other",
};

static const char *const group_titles[LEDGER_N_GROUPS] = {
	[LEDGER_WEIGHTS] = "packed weights",
	[LEDGER_EMBED_HEAD] = "embedding / output head",
	[LEDGER_NORMS] = "norms",
	[LEDGER_ROPE] = "RoPE tables",
	[LEDGER_KV] = "KV pool",
	[LEDGER_SCRATCH] = "scratch",
	[LEDGER_RINGS] = "client rings",
	[LEDGER_DRAFT] = "draft model (in the arena)",
	[LEDGER_ARENA_OTHER] = "arena other",
	[LEDGER_MODEL_FILE] = "model file mapping",
	[LEDGER_CODE] = "code and libraries",
	[LEDGER_OTHER] = "other heap/stacks",
};

const char *ledger_group_name(enum ledger_group g)
{
	return (unsigned)g < LEDGER_N_GROUPS ? group_names[g] : "?";
}

static size_t page_size(void)
{
	long p = sysconf(_SC_PAGESIZE);
	return p > 0 ? (size_t)p : 4096;
}

/* "weights" matches "weights" and "weights.q4g128", not "weightsx". */
static bool name_is(const char *name, const char *base)
{
	size_t n = strlen(base);
	return strncmp(name, base, n) == 0 && (name[n] == '\0' || name[n] == '.');
}

static enum ledger_group region_group(const char *name)
{
	/* A draft's regions are its model's names under the prefix: the draft's lines, so its
	 * cost reads as one group beside the model's. */
	if (strncmp(name, ARENA_DRAFT_PREFIX, strlen(ARENA_DRAFT_PREFIX)) == 0 &&
	    region_group(name + strlen(ARENA_DRAFT_PREFIX)) != LEDGER_ARENA_OTHER)
		return LEDGER_DRAFT;
	if (name_is(name, ARENA_REGION_WEIGHTS))
		return LEDGER_WEIGHTS;
	if (name_is(name, ARENA_REGION_EMBED_HEAD))
		return LEDGER_EMBED_HEAD;
	if (name_is(name, ARENA_REGION_NORMS))
		return LEDGER_NORMS;
	if (name_is(name, ARENA_REGION_ROPE))
		return LEDGER_ROPE;
	if (name_is(name, ARENA_REGION_KV))
		return LEDGER_KV;
	if (name_is(name, ARENA_REGION_SCRATCH))
		return LEDGER_SCRATCH;
	if (name_is(name, ARENA_REGION_RINGS))
		return LEDGER_RINGS;
	return LEDGER_ARENA_OTHER;
}

/* Resident bytes of the pages covering [start, start+len). */
static int mincore_bytes(const void *start, size_t len, size_t *out, struct hearth_error *err)
{
	*out = 0;
	if (len == 0)
		return 0;
	size_t page = page_size();
	uintptr_t lo = (uintptr_t)start & ~(uintptr_t)(page - 1);
	uintptr_t hi = ((uintptr_t)start + len + page - 1) & ~(uintptr_t)(page - 1);
	unsigned char vec[MINCORE_CHUNK];
	for (uintptr_t p = lo; p < hi;) {
		size_t n = (hi - p) / page;
		if (n > MINCORE_CHUNK)
			n = MINCORE_CHUNK;
		if (mincore((void *)p, n * page, vec) != 0)
			return hearth_error_errno(err, HEARTH_EIO, errno, "mincore(%p, %zu)", (void *)p,
						  n * page);
		for (size_t i = 0; i < n; i++)
			*out += (vec[i] & 1) ? page : 0;
		p += n * page;
	}
	return 0;
}

struct span {
	uintptr_t lo, hi;
	size_t resident;
};

struct walk {
	struct span spans[1 + LEDGER_MAX_RANGES];
	size_t n_spans;
	size_t code, other_anon, other_shared;
	struct hearth_error *err;
};

static bool is_shared_memory(const char *path)
{
	return strncmp(path, "/memfd:", 7) == 0 || strncmp(path, "/dev/shm/", 9) == 0 ||
	       strncmp(path, "/SYSV", 5) == 0 || strncmp(path, "/dev/zero", 9) == 0;
}

static int walk_vma(const struct memstat_vma *v, void *ctx)
{
	struct walk *w = ctx;
	size_t vma_res = v->rss + v->private_hugetlb + v->shared_hugetlb;
	size_t known = 0;
	for (size_t i = 0; i < w->n_spans; i++) {
		struct span *s = &w->spans[i];
		uintptr_t lo = v->start > s->lo ? v->start : s->lo;
		uintptr_t hi = v->end < s->hi ? v->end : s->hi;
		if (lo >= hi)
			continue;
		size_t r;
		if (v->start >= s->lo && v->end <= s->hi) {
			/* the whole mapping is ours: smaps is exact (mincore would report page
			 * cache for a file mapping, not what this process has mapped) */
			r = vma_res;
		} else {
			int rc = mincore_bytes((void *)lo, hi - lo, &r, w->err);
			if (rc)
				return rc;
		}
		s->resident += r;
		known += r;
	}
	size_t rest = vma_res > known ? vma_res - known : 0;
	if (v->path[0] == '/' && is_shared_memory(v->path))
		w->other_shared += rest;
	else if (v->path[0] == '/' || strcmp(v->path, "[vdso]") == 0 ||
		 strcmp(v->path, "[vsyscall]") == 0)
		w->code += rest;
	else
		w->other_anon += rest;
	return 0;
}

static int add_entry(struct ledger *l, const char *name, enum ledger_group g, size_t bytes,
		     size_t used, size_t resident, struct hearth_error *err)
{
	if (l->n_entries >= LEDGER_MAX_ENTRIES)
		return hearth_error_set(err, HEARTH_ERANGE, "ledger: more than %d entries",
					LEDGER_MAX_ENTRIES);
	struct ledger_entry *e = &l->entries[l->n_entries++];
	snprintf(e->name, sizeof e->name, "%s", name);
	e->group = g;
	e->bytes = bytes;
	e->used = used;
	e->resident = resident;
	l->group_bytes[g] += bytes;
	l->group_resident[g] += resident;
	l->total_resident += resident;
	return 0;
}

int ledger_collect(struct ledger *l, const struct arena *arena, const struct ledger_range *ranges,
		   size_t n_ranges, const struct ledger_load *load, struct hearth_error *err)
{
	memset(l, 0, sizeof *l);
	if (n_ranges > LEDGER_MAX_RANGES)
		return hearth_error_set(err, HEARTH_EINVAL, "ledger: %zu ranges, at most %d", n_ranges,
					LEDGER_MAX_RANGES);
	size_t page = page_size();
	struct walk w;
	memset(&w, 0, sizeof w);
	w.err = err;
	if (arena && arena->base) {
		w.spans[w.n_spans++] = (struct span){ (uintptr_t)arena->base,
						      (uintptr_t)arena->base + arena->size, 0 };
	}
	size_t first_range = w.n_spans;
	for (size_t i = 0; i < n_ranges; i++) {
		uintptr_t lo = (uintptr_t)ranges[i].addr & ~(uintptr_t)(page - 1);
		uintptr_t hi = ((uintptr_t)ranges[i].addr + ranges[i].len + page - 1) &
			       ~(uintptr_t)(page - 1);
		for (size_t j = 0; j < w.n_spans; j++)
			if (lo < w.spans[j].hi && w.spans[j].lo < hi)
				return hearth_error_set(err, HEARTH_EINVAL,
							"ledger: range '%s' overlaps %s '%s': each byte is "
							"counted once",
							ranges[i].name, j < first_range ? "the" : "range",
							j < first_range ? "arena" : ranges[j - first_range].name);
		w.spans[w.n_spans++] = (struct span){ lo, hi, 0 };
	}
	int rc = memstat_smaps_foreach(walk_vma, &w, err);
	if (rc)
		return rc;

	if (arena && arena->base) {
		size_t sum_res = 0, sum_bytes = 0;
		for (size_t i = 0; i < arena->n_regions; i++) {
			const struct arena_region *r = &arena->regions[i];
			size_t res;
			if ((rc = mincore_bytes(r->base, r->size, &res, err)))
				return rc;
			if ((rc = add_entry(l, r->name, region_group(r->name), r->size, r->used, res, err)))
				return rc;
			sum_res += res;
			sum_bytes += r->size;
		}
		size_t total = w.spans[0].resident;
		if ((rc = add_entry(l, "arena padding and rounding", LEDGER_ARENA_OTHER,
				    arena->size > sum_bytes ? arena->size - sum_bytes : 0, 0,
				    total > sum_res ? total - sum_res : 0, err)))
			return rc;
		struct arena_stats st;
		if ((rc = arena_stats(arena, &st, err)))
			return rc;
		l->have_arena = true;
		l->backing = arena->backing;
		l->arena_size = arena->size;
		l->arena_page_size = arena->page_size;
		l->arena_huge_bytes = st.huge_bytes;
		l->numa_node = arena->numa_node;
		l->numa_bound = arena->numa_bound;
		l->locked = arena->locked;
		l->placement = st.placement;
	}
	for (size_t i = 0; i < n_ranges; i++) {
		const struct span *s = &w.spans[first_range + i];
		if ((rc = add_entry(l, ranges[i].name, ranges[i].group, ranges[i].len, ranges[i].len,
				    s->resident, err)))
			return rc;
	}
	if ((rc = add_entry(l, "code and libraries", LEDGER_CODE, w.code, w.code, w.code, err)) ||
	    (rc = add_entry(l, "other heap/stacks", LEDGER_OTHER, w.other_anon, w.other_anon,
			    w.other_anon, err)) ||
	    (rc = add_entry(l, "other shared memory", LEDGER_OTHER, w.other_shared, w.other_shared,
			    w.other_shared, err)))
		return rc;

	if ((rc = memstat_read_status(&l->status, err)) || (rc = memstat_read_rollup(&l->rollup, err)))
		return rc;
	l->process_resident = l->status.vm_rss + l->status.hugetlb;
	if (l->process_resident)
		l->diff_pct = ((double)l->total_resident - (double)l->process_resident) * 100.0 /
			      (double)l->process_resident;
	if (load)
		l->load = *load;
	return 0;
}

/* ---- output ---- */

struct out {
	char *buf;
	size_t size;
	size_t len;      /* what the whole text needs */
};

static void out_printf(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out_printf(struct out *o, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *at = o->len < o->size ? o->buf + o->len : NULL;
	size_t room = o->len < o->size ? o->size - o->len : 0;
	int n = vsnprintf(at, room, fmt, ap);
	va_end(ap);
	if (n > 0)
		o->len += (size_t)n;
}

static void out_init(struct out *o, char *buf, size_t size)
{
	o->buf = buf;
	o->size = size;
	o->len = 0;
	if (size)
		buf[0] = '\0';
}

static double mib(size_t b)
{
	return (double)b / (1024.0 * 1024.0);
}

/* "812.0 MiB", "1.25 GiB", "64 KiB": one decimal is enough to see what matters. */
struct size_text {
	char s[24];
};

static struct size_text human(size_t b)
{
	struct size_text t;
	if (b >= ((size_t)1 << 30))
		snprintf(t.s, sizeof t.s, "%.2f GiB", (double)b / (double)(1u << 30));
	else if (b >= ((size_t)1 << 20))
		snprintf(t.s, sizeof t.s, "%.1f MiB", mib(b));
	else
		snprintf(t.s, sizeof t.s, "%.0f KiB", (double)b / 1024.0);
	return t;
}

size_t ledger_format_table(const struct ledger *l, char *buf, size_t size)
{
	struct out o;
	out_init(&o, buf, size);
	out_printf(&o, "%-34s %12s %12s %12s\n", "memory ledger", "reserved", "used", "resident");
	for (int g = 0; g < LEDGER_N_GROUPS; g++) {
		bool any = false;
		for (size_t i = 0; i < l->n_entries; i++)
			any |= l->entries[i].group == (enum ledger_group)g;
		if (!any)
			continue;
		out_printf(&o, "%-34s %12s %12s %12s\n", group_titles[g], "", "",
			   human(l->group_resident[g]).s);
		for (size_t i = 0; i < l->n_entries; i++) {
			const struct ledger_entry *e = &l->entries[i];
			if (e->group != (enum ledger_group)g)
				continue;
			out_printf(&o, "  %-32s %12s %12s %12s\n", e->name, human(e->bytes).s,
				   human(e->used).s, human(e->resident).s);
		}
	}
	out_printf(&o, "%-34s %12s %12s %12s\n", "total (ledger)", "", "",
		   human(l->total_resident).s);
	out_printf(&o, "%-34s %12s %12s %12s  (ledger %+.2f%%)\n", "process VmRSS + hugetlb", "", "",
		   human(l->process_resident).s, l->diff_pct);
	out_printf(&o,
		   "process: VmRSS %s, RssAnon %s, RssFile %s, RssShmem %s, VmHWM %s, hugetlb %s, "
		   "AnonHugePages %s, locked %s\n",
		   human(l->status.vm_rss).s, human(l->status.rss_anon).s, human(l->status.rss_file).s,
		   human(l->status.rss_shmem).s, human(l->status.vm_hwm).s, human(l->status.hugetlb).s,
		   human(l->rollup.anon_huge).s, human(l->status.vm_lck).s);
	if (l->load.valid)
		out_printf(&o,
			   "load: RssAnon %s before, peak %s at %" PRIu64 " ms, settled %s, transient "
			   "%s; kernel peak RSS %s; %" PRIu64 " samples over %" PRIu64 " ms\n",
			   human(l->load.baseline_anon).s, human(l->load.peak_anon).s, l->load.peak_at_ms,
			   human(l->load.settled_anon).s, human(l->load.transient).s,
			   human(l->load.kernel_peak_rss).s, l->load.samples, l->load.duration_ms);
	if (l->have_arena) {
		out_printf(&o, "arena: %s on %s pages (%s), %s hugepage-backed, %s",
			   human(l->arena_size).s, arena_backing_name(l->backing),
			   human(l->arena_page_size).s, human(l->arena_huge_bytes).s,
			   l->locked ? "locked" : "not locked");
		if (l->numa_bound)
			out_printf(&o, ", bound to node %d", l->numa_node);
		else
			out_printf(&o, ", not NUMA-bound");
		if (l->placement.numa_known) {
			for (int n = 0; n < l->placement.n_nodes; n++)
				out_printf(&o, "; node %d: %s", n, human(l->placement.node_bytes[n]).s);
			out_printf(&o, "; not present: %s", human(l->placement.bytes_not_present).s);
		}
		out_printf(&o, "\n");
	}
	return o.len;
}

static void json_string(struct out *o, const char *s)
{
	out_printf(o, "\"");
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			out_printf(o, "\\%c", c);
		else if (c < 0x20)
			out_printf(o, "\\u%04x", c);
		else
			out_printf(o, "%c", c);
	}
	out_printf(o, "\"");
}

size_t ledger_format_json(const struct ledger *l, char *buf, size_t size)
{
	struct out o;
	out_init(&o, buf, size);
	out_printf(&o, "{\"entries\":[");
	for (size_t i = 0; i < l->n_entries; i++) {
		const struct ledger_entry *e = &l->entries[i];
		out_printf(&o, "%s{\"name\":", i ? "," : "");
		json_string(&o, e->name);
		out_printf(&o, ",\"group\":\"%s\",\"bytes\":%zu,\"used\":%zu,\"resident\":%zu}",
			   ledger_group_name(e->group), e->bytes, e->used, e->resident);
	}
	out_printf(&o, "],\"groups\":{");
	for (int g = 0; g < LEDGER_N_GROUPS; g++)
		out_printf(&o, "%s\"%s\":{\"bytes\":%zu,\"resident\":%zu}", g ? "," : "",
			   group_names[g], l->group_bytes[g], l->group_resident[g]);
	out_printf(&o, "},\"total_resident\":%zu,\"process_resident\":%zu,\"diff_pct\":%.3f",
		   l->total_resident, l->process_resident, l->diff_pct);
	out_printf(&o,
		   ",\"process\":{\"vm_rss\":%zu,\"rss_anon\":%zu,\"rss_file\":%zu,\"rss_shmem\":%zu,"
		   "\"vm_hwm\":%zu,\"hugetlb\":%zu,\"anon_huge\":%zu,\"locked\":%zu}",
		   l->status.vm_rss, l->status.rss_anon, l->status.rss_file, l->status.rss_shmem,
		   l->status.vm_hwm, l->status.hugetlb, l->rollup.anon_huge, l->status.vm_lck);
	if (l->load.valid)
		out_printf(&o,
			   ",\"load\":{\"baseline_anon\":%zu,\"peak_anon\":%zu,\"settled_anon\":%zu,"
			   "\"transient\":%zu,\"kernel_peak_rss\":%zu,\"peak_at_ms\":%" PRIu64
			   ",\"duration_ms\":%" PRIu64 ",\"samples\":%" PRIu64 "}",
			   l->load.baseline_anon, l->load.peak_anon, l->load.settled_anon,
			   l->load.transient, l->load.kernel_peak_rss, l->load.peak_at_ms,
			   l->load.duration_ms, l->load.samples);
	if (l->have_arena) {
		out_printf(&o,
			   ",\"arena\":{\"size\":%zu,\"backing\":\"%s\",\"page_size\":%zu,"
			   "\"huge_bytes\":%zu,\"locked\":%s,\"numa_bound\":%s,\"numa_node\":%d",
			   l->arena_size, arena_backing_name(l->backing), l->arena_page_size,
			   l->arena_huge_bytes, l->locked ? "true" : "false",
			   l->numa_bound ? "true" : "false", l->numa_node);
		if (l->placement.numa_known) {
			out_printf(&o, ",\"node_bytes\":[");
			for (int n = 0; n < l->placement.n_nodes; n++)
				out_printf(&o, "%s%zu", n ? "," : "", l->placement.node_bytes[n]);
			out_printf(&o, "],\"not_present\":%zu", l->placement.bytes_not_present);
		}
		out_printf(&o, "}");
	}
	out_printf(&o, "}");
	return o.len;
}


/* ---- load sampler ---- */

/* Only the sampler thread writes peak while it runs; stop writes after the join. */
static void sampler_take(struct ledger_sampler *s)
{
	size_t anon;
	if (memstat_statm_anon(s->statm_fd, &anon) == 0 &&
	    anon > atomic_load_explicit(&s->peak_anon, memory_order_relaxed)) {
		atomic_store_explicit(&s->peak_anon, anon, memory_order_relaxed);
		atomic_store_explicit(&s->peak_at_ns, hearth_now_ns() - s->t0_ns, memory_order_relaxed);
	}
	atomic_fetch_add_explicit(&s->samples, 1, memory_order_release);
}

static void *sampler_main(void *arg)
{
	struct ledger_sampler *s = arg;
	uint64_t step = (uint64_t)s->interval_ms * 1000000ull;
	uint64_t next = hearth_now_ns();
	while (!atomic_load_explicit(&s->stop, memory_order_acquire)) {
		sampler_take(s);
		next += step;
		uint64_t now = hearth_now_ns();
		if (next < now)
			next = now; /* fell behind (a busy machine): do not burst to catch up */
		struct timespec ts = { (time_t)(next / 1000000000ull), (long)(next % 1000000000ull) };
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
			;
	}
	return NULL;
}

int ledger_sampler_start(struct ledger_sampler *s, unsigned interval_ms, struct hearth_error *err)
{
	memset(s, 0, sizeof *s);
	s->statm_fd = -1;
	if (interval_ms == 0)
		return hearth_error_set(err, HEARTH_EINVAL, "ledger sampler: interval 0 ms");
	int fd = memstat_statm_open(err);
	if (fd < 0)
		return fd;
	s->statm_fd = fd;
	s->interval_ms = interval_ms;
	memstat_reset_peak(NULL); /* best effort: without it VmHWM includes the time before */
	s->t0_ns = hearth_now_ns();
	size_t anon = 0;
	if (memstat_statm_anon(fd, &anon) != 0) {
		int e = errno;
		close(fd);
		s->statm_fd = -1;
		return hearth_error_errno(err, HEARTH_EIO, e, "/proc/self/statm: cannot read");
	}
	s->baseline_anon = anon;
	atomic_init(&s->peak_anon, anon);
	atomic_init(&s->peak_at_ns, 0);
	atomic_init(&s->samples, 0);
	atomic_init(&s->stop, false);
	/* The sampler must not take the daemon's signals (signalfd, SIGTERM handling). */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	int rc = pthread_create(&s->thread, NULL, sampler_main, s);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		close(fd);
		s->statm_fd = -1;
		return hearth_error_errno(err, HEARTH_EIO, rc, "ledger sampler: pthread_create");
	}
	pthread_setname_np(s->thread, "hearth-ledger");
	s->running = true;
	return 0;
}

uint64_t ledger_sampler_samples(struct ledger_sampler *s)
{
	return atomic_load_explicit(&s->samples, memory_order_acquire);
}

int ledger_sampler_stop(struct ledger_sampler *s, struct ledger_load *out, struct hearth_error *err)
{
	memset(out, 0, sizeof *out);
	if (!s->running)
		return hearth_error_set(err, HEARTH_EINVAL, "ledger sampler: not running");
	atomic_store_explicit(&s->stop, true, memory_order_release);
	pthread_join(s->thread, NULL);
	s->running = false;
	size_t settled = 0;
	int rc = 0;
	if (memstat_statm_anon(s->statm_fd, &settled) != 0)
		rc = hearth_error_errno(err, HEARTH_EIO, errno, "/proc/self/statm: cannot read");
	sampler_take(s);
	close(s->statm_fd);
	s->statm_fd = -1;
	if (rc)
		return rc;
	struct memstat_status st;
	if (memstat_read_status(&st, NULL) == 0)
		out->kernel_peak_rss = st.vm_hwm;
	out->valid = true;
	out->baseline_anon = s->baseline_anon;
	out->peak_anon = atomic_load(&s->peak_anon);
	out->settled_anon = settled;
	out->transient = out->peak_anon > settled ? out->peak_anon - settled : 0;
	out->peak_at_ms = atomic_load(&s->peak_at_ns) / 1000000ull;
	out->duration_ms = (hearth_now_ns() - s->t0_ns) / 1000000ull;
	out->samples = atomic_load(&s->samples);
	return 0;
}
