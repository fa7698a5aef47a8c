/* Ledger: the load sampler must see a deliberate 64 MiB transient that is gone by the end;
 * the entries must add up to the kernel's RSS (+ hugetlb) within 2%; regions land in their
 * groups with the residency we caused; each byte is counted once; output is well-formed,
 * and the wire reply carries it through the protocol's decoder. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/engine/arena.h"
#include "daemon/engine/ledger.h"
#include "daemon/serve/ledger_reply.h"
#include "daemon/engine/memstat.h"
#include "protocol/msg.h"

#define MiB ((size_t)1 << 20)

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/* Waits until the sampler has taken n more samples (bounded: 5 s). */
static void wait_samples(struct ledger_sampler *s, uint64_t n)
{
	uint64_t until = ledger_sampler_samples(s) + n;
	for (int i = 0; i < 5000 && ledger_sampler_samples(s) < until; i++)
		sleep_ms(1);
	assert_true(ledger_sampler_samples(s) >= until);
}

static void test_memstat_statm_anon_agrees_with_status(void **state)
{
	(void)state;
	struct hearth_error err;
	int fd = memstat_statm_open(&err);
	assert_true(fd >= 0);
	size_t anon;
	assert_int_equal(memstat_statm_anon(fd, &anon), 0);
	struct memstat_status st;
	assert_int_equal(memstat_read_status(&st, &err), 0);
	close(fd);
	assert_true(st.vm_rss > 0);
	assert_true(st.vm_rss >= st.rss_anon);
	/* both are the same kernel counters read a moment apart */
	size_t d = anon > st.rss_anon ? anon - st.rss_anon : st.rss_anon - anon;
	assert_true(d <= 256 * 1024);
}

static void test_ledger_sampler_sees_the_load_transient(void **state)
{
	(void)state;
	struct ledger_sampler s;
	struct hearth_error err;
	assert_int_equal(ledger_sampler_start(&s, 10, &err), 0);
	wait_samples(&s, 1);
	/* a load-time transient: 64 MiB expanded, used, given back (glibc maps it, frees it) */
	size_t big = 64 * MiB;
	unsigned char *p = malloc(big);
	assert_non_null(p);
	memset(p, 1, big);
	wait_samples(&s, 2);
	free(p);
	wait_samples(&s, 2);
	struct ledger_load load;
	assert_int_equal(ledger_sampler_stop(&s, &load, &err), 0);
	assert_true(load.valid);
	assert_true(load.samples >= 5);
	assert_true(load.peak_anon >= load.baseline_anon + 60 * MiB);
	assert_true(load.transient >= 60 * MiB);
	assert_int_equal(load.transient, load.peak_anon - load.settled_anon);
	assert_true(load.settled_anon < load.baseline_anon + 4 * MiB);
	assert_true(load.kernel_peak_rss >= 60 * MiB);
	print_message("# baseline %zu KiB, peak %zu KiB at %llu ms, settled %zu KiB, %llu samples\n",
		      load.baseline_anon / 1024, load.peak_anon / 1024,
		      (unsigned long long)load.peak_at_ms, load.settled_anon / 1024,
		      (unsigned long long)load.samples);
	assert_int_equal(ledger_sampler_stop(&s, &load, &err), HEARTH_EINVAL);
}

struct world {
	struct arena arena;
	void *ring;         /* a memfd mapping, as a client ring is */
	size_t ring_len;
};

static void world_make(struct world *w, enum arena_pages pages)
{
	struct arena_plan plan;
	arena_plan_init(&plan);
	struct hearth_error err;
	assert_int_equal(arena_plan_add(&plan, "weights.q4g128", 6 * MiB, 64, &err), 0);
	assert_int_equal(arena_plan_add(&plan, "weights.q8_0", MiB, 64, &err), 0);
	assert_int_equal(arena_plan_add(&plan, ARENA_REGION_EMBED_HEAD, 2 * MiB, 64, &err), 0);
	assert_int_equal(arena_plan_add(&plan, ARENA_REGION_NORMS, 8192, 64, &err), 0);
	assert_int_equal(arena_plan_add(&plan, ARENA_REGION_ROPE, 64 * 1024, 64, &err), 0);
	assert_int_equal(arena_plan_add(&plan, ARENA_REGION_KV, 4 * MiB, 4096, &err), 0);
	assert_int_equal(arena_plan_add(&plan, "scratch.act", MiB, 64, &err), 0);
	struct arena_config cfg = ARENA_CONFIG_DEFAULT;
	cfg.pages = pages;
	assert_int_equal(arena_create(&w->arena, &plan, &cfg, &err), 0);
	/* fill what a loader would fill; leave the scratch untouched */
	const char *fill[] = { "weights.q4g128", "weights.q8_0", ARENA_REGION_EMBED_HEAD,
			       ARENA_REGION_NORMS, ARENA_REGION_ROPE };
	for (size_t i = 0; i < sizeof fill / sizeof fill[0]; i++) {
		struct arena_region *r = arena_region_find(&w->arena, fill[i]);
		void *p;
		assert_int_equal(arena_alloc(&w->arena, fill[i], r->size, 64, &p, &err), 0);
		memset(p, 0x5a, r->size);
	}
	struct arena_region *kv = arena_region_find(&w->arena, ARENA_REGION_KV);
	assert_int_equal(arena_prefault(&w->arena, kv->base, kv->size, &err), 0);

	w->ring_len = 2 * MiB;
	int fd = memfd_create("hearth-test-ring", MFD_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)w->ring_len), 0);
	w->ring = mmap(NULL, w->ring_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	assert_true(w->ring != MAP_FAILED);
	memset(w->ring, 1, MiB); /* half of it touched */
}

static void world_free(struct world *w)
{
	munmap(w->ring, w->ring_len);
	arena_destroy(&w->arena);
}

static const struct ledger_entry *entry(const struct ledger *l, const char *name)
{
	for (size_t i = 0; i < l->n_entries; i++)
		if (strcmp(l->entries[i].name, name) == 0)
			return &l->entries[i];
	fail_msg("no ledger entry '%s'", name);
	return NULL;
}

static void check_world_ledger(enum arena_pages pages)
{
	struct world w;
	world_make(&w, pages);
	struct ledger_range ranges[] = {
		{ "rings", LEDGER_RINGS, w.ring, w.ring_len },
	};
	struct ledger *l = malloc(sizeof *l);
	assert_non_null(l);
	struct hearth_error err;
	assert_int_equal(ledger_collect(l, &w.arena, ranges, 1, NULL, &err), 0);

	/* the residency we caused, region by region (pages rounded: sizes are page multiples) */
	assert_int_equal(entry(l, "weights.q4g128")->resident, 6 * MiB);
	assert_int_equal(entry(l, "weights.q4g128")->used, 6 * MiB);
	assert_int_equal(entry(l, "weights.q8_0")->resident, MiB);
	assert_int_equal(entry(l, "embed_head")->resident, 2 * MiB);
	assert_int_equal(entry(l, "norms")->resident, 8192);
	assert_int_equal(entry(l, "rope")->resident, 64 * 1024);
	assert_int_equal(entry(l, "kv_pool")->resident, 4 * MiB);
	assert_int_equal(entry(l, "rings")->resident, MiB);
	assert_int_equal(entry(l, "rings")->bytes, 2 * MiB);
	if (pages == ARENA_PAGES_NONE)
		assert_int_equal(entry(l, "scratch.act")->resident, 0);
	if (pages == ARENA_PAGES_HUGETLB) {
		assert_int_equal(w.arena.backing, ARENA_BACKING_HUGETLB);
		assert_int_equal(l->arena_huge_bytes, l->status.hugetlb);
		assert_true(l->status.hugetlb > 0);
	}
	assert_int_equal(entry(l, "scratch.act")->used, 0);
	assert_int_equal(l->group_resident[LEDGER_WEIGHTS], 7 * MiB);
	assert_int_equal(l->group_resident[LEDGER_EMBED_HEAD], 2 * MiB);
	assert_int_equal(l->group_resident[LEDGER_KV], 4 * MiB);
	assert_int_equal(l->group_resident[LEDGER_RINGS], MiB);
	assert_true(l->group_resident[LEDGER_CODE] > 0);   /* this test binary, libc, cmocka */
	assert_true(l->group_resident[LEDGER_OTHER] > 0);  /* heap, stack */

	/* the point of the ledger: it adds up to what the kernel says we hold */
	size_t sum = 0;
	for (size_t i = 0; i < l->n_entries; i++)
		sum += l->entries[i].resident;
	assert_int_equal(sum, l->total_resident);
	struct memstat_status st;
	assert_int_equal(memstat_read_status(&st, &err), 0);
	double truth = (double)(st.vm_rss + st.hugetlb);
	double diff = ((double)sum - truth) / truth * 100.0;
	print_message("# pages=%s: ledger %zu KiB, VmRSS+hugetlb %.0f KiB, diff %+.2f%%\n",
		      arena_pages_name(pages), sum / 1024, truth / 1024, diff);
	assert_true(diff <= 2.0 && diff >= -2.0);
	assert_true(l->diff_pct <= 2.0 && l->diff_pct >= -2.0);
	assert_true(l->have_arena);
	assert_int_equal(l->backing, w.arena.backing);
	if (l->placement.numa_known)
		assert_int_equal(l->placement.node_bytes[0] + l->placement.bytes_not_present,
				 w.arena.size);
	free(l);
	world_free(&w);
}

/* Same pool lock as test_arena: the 2 MiB hugepage pool is machine-wide. */
#define HUGEPAGE_LOCK "/tmp/hearth-test-hugepages.lock"
#define NR_HUGEPAGES_2M "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"

static int write_nr_hugepages(uint64_t n)
{
	FILE *f = fopen(NR_HUGEPAGES_2M, "w");
	if (!f)
		return -1;
	int rc = fprintf(f, "%llu\n", (unsigned long long)n) > 0 ? 0 : -1;
	if (fclose(f) != 0)
		rc = -1;
	return rc;
}

struct pool_state {
	int lock_fd;
	bool raised;
	uint64_t nr_before;
};

static int pool_teardown(void **state)
{
	struct pool_state *ps = *state;
	int rc = 0;
	if (ps->raised && write_nr_hugepages(ps->nr_before) != 0)
		rc = -1;
	close(ps->lock_fd);
	free(ps);
	return rc;
}

static int pool_setup(void **state)
{
	struct pool_state *ps = calloc(1, sizeof *ps);
	if (!ps)
		return -1;
	ps->lock_fd = open(HUGEPAGE_LOCK, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
	if (ps->lock_fd < 0 || flock(ps->lock_fd, LOCK_EX) != 0) {
		free(ps);
		return -1;
	}
	*state = ps;
	return 0;
}

static void test_ledger_entries_add_up_to_rss_normal_pages(void **state)
{
	(void)state;
	check_world_ledger(ARENA_PAGES_NONE);
}

static void test_ledger_entries_add_up_to_rss_auto_pages(void **state)
{
	(void)state;
	check_world_ledger(ARENA_PAGES_AUTO);
}

/* hugetlb pages are outside VmRSS; the ledger counts them and still adds up. */
static void test_ledger_entries_add_up_with_a_hugetlb_arena(void **state)
{
	struct pool_state *ps = *state;
	struct hearth_error err;
	struct memstat_hugepages hp;
	assert_int_equal(memstat_hugepages_2m(&hp, &err), 0);
	const uint64_t want = 8; /* the world's 14.1 MiB arena */
	if (geteuid() != 0 || write_nr_hugepages(hp.nr + want) != 0) {
		print_message("# SKIP: cannot raise vm.nr_hugepages (needs root)\n");
		skip();
	}
	ps->raised = true;
	ps->nr_before = hp.nr;
	assert_int_equal(memstat_hugepages_2m(&hp, &err), 0);
	if (hp.available < want) {
		print_message("# SKIP: kernel gave only %llu of %llu 2 MiB pages\n",
			      (unsigned long long)hp.available, (unsigned long long)want);
		skip();
	}
	check_world_ledger(ARENA_PAGES_HUGETLB);
}

static void test_ledger_counts_each_byte_once(void **state)
{
	(void)state;
	struct world w;
	world_make(&w, ARENA_PAGES_NONE);
	struct ledger *l = malloc(sizeof *l);
	assert_non_null(l);
	struct hearth_error err;
	/* a tied embedding registered twice, as the head and as the embedding */
	struct arena_region *emb = arena_region_find(&w.arena, ARENA_REGION_EMBED_HEAD);
	struct ledger_range twice[] = {
		{ "rings", LEDGER_RINGS, w.ring, w.ring_len },
		{ "rings again", LEDGER_RINGS, (uint8_t *)w.ring + 4096, 4096 },
	};
	assert_int_equal(ledger_collect(l, &w.arena, twice, 2, NULL, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "counted once"));
	struct ledger_range in_arena[] = {
		{ "output head", LEDGER_EMBED_HEAD, emb->base, emb->size },
	};
	assert_int_equal(ledger_collect(l, &w.arena, in_arena, 1, NULL, &err), HEARTH_EINVAL);
	assert_non_null(strstr(err.msg, "arena"));
	free(l);
	world_free(&w);
}

static void test_ledger_formats_table_and_json(void **state)
{
	(void)state;
	struct world w;
	world_make(&w, ARENA_PAGES_NONE);
	struct ledger *l = malloc(sizeof *l);
	assert_non_null(l);
	struct hearth_error err;
	struct ledger_range ranges[] = { { "rings", LEDGER_RINGS, w.ring, w.ring_len } };
	struct ledger_load load = { .valid = true, .baseline_anon = MiB, .peak_anon = 9 * MiB,
				    .settled_anon = 5 * MiB, .transient = 4 * MiB, .samples = 7 };
	assert_int_equal(ledger_collect(l, &w.arena, ranges, 1, &load, &err), 0);
	char *buf = malloc(16384);
	assert_non_null(buf);
	size_t n = ledger_format_table(l, buf, 16384);
	assert_true(n > 0 && n < 16384);
	assert_int_equal(strlen(buf), n);
	assert_non_null(strstr(buf, "packed weights"));
	assert_non_null(strstr(buf, "weights.q4g128"));
	assert_non_null(strstr(buf, "KV pool"));
	assert_non_null(strstr(buf, "code and libraries"));
	assert_non_null(strstr(buf, "other heap/stacks"));
	assert_non_null(strstr(buf, "transient 4.0 MiB"));
	assert_non_null(strstr(buf, "  norms "));
	assert_non_null(strstr(buf, "8 KiB"));
	assert_non_null(strstr(buf, "on normal pages"));
	/* a short buffer is truncated but says how much it needed */
	char small[32];
	assert_int_equal(ledger_format_table(l, small, sizeof small), n);
	assert_int_equal(strlen(small), sizeof small - 1);

	n = ledger_format_json(l, buf, 16384);
	assert_true(n > 0 && n < 16384);
	assert_int_equal(buf[0], '{');
	assert_int_equal(buf[n - 1], '}');
	assert_non_null(strstr(buf, "\"name\":\"kv_pool\",\"group\":\"kv\",\"bytes\":4194304"));
	assert_non_null(strstr(buf, "\"transient\":4194304"));
	assert_non_null(strstr(buf, "\"backing\":\"normal\""));
	int depth = 0;
	bool in_str = false;
	for (size_t i = 0; i < n; i++) {
		if (buf[i] == '"' && (i == 0 || buf[i - 1] != '\\'))
			in_str = !in_str;
		else if (!in_str && (buf[i] == '{' || buf[i] == '['))
			depth++;
		else if (!in_str && (buf[i] == '}' || buf[i] == ']'))
			depth--;
		assert_true(depth >= 0);
	}
	assert_int_equal(depth, 0);
	assert_false(in_str);
	/* show the table in the test log, as TAP comments */
	ledger_format_table(l, buf, 16384);
	for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
		print_message("# %s\n", line);
	free(buf);
	free(l);
	world_free(&w);
}

/* A draft model's regions in the model's arena ("draft.<region>", load.h) are the draft's
 * lines: their own group, counted once, not "arena other" and not the model's weights or
 * KV; a name under the prefix that is no region kind stays "arena other". */
static void test_ledger_groups_the_draft_regions_apart(void **state)
{
	(void)state;
	struct arena a;
	struct arena_plan plan;
	struct hearth_error err;
	arena_plan_init(&plan);
	const struct {
		const char *name;
		size_t size;
		enum ledger_group group;
		bool touch;
	} regions[] = {
		{ "weights.q4g128", MiB, LEDGER_WEIGHTS, true },
		{ ARENA_REGION_KV, MiB, LEDGER_KV, true },
		{ ARENA_DRAFT_PREFIX "weights.q4g32", 2 * MiB, LEDGER_DRAFT, true },
		{ ARENA_DRAFT_PREFIX ARENA_REGION_EMBED_HEAD, MiB, LEDGER_DRAFT, true },
		{ ARENA_DRAFT_PREFIX ARENA_REGION_KV, MiB, LEDGER_DRAFT, true },
		{ ARENA_DRAFT_PREFIX ARENA_REGION_KV_SLIDING, 64 * 1024, LEDGER_DRAFT, false },
		{ ARENA_DRAFT_PREFIX ARENA_REGION_SCRATCH, 64 * 1024, LEDGER_DRAFT, false },
		{ ARENA_DRAFT_PREFIX "bogus", 64 * 1024, LEDGER_ARENA_OTHER, false },
	};
	size_t n = sizeof regions / sizeof regions[0];
	for (size_t i = 0; i < n; i++)
		assert_int_equal(arena_plan_add(&plan, regions[i].name, regions[i].size, 4096, &err), 0);
	struct arena_config cfg = ARENA_CONFIG_DEFAULT;
	cfg.pages = ARENA_PAGES_NONE;
	assert_int_equal(arena_create(&a, &plan, &cfg, &err), 0);
	for (size_t i = 0; i < n; i++) {
		if (!regions[i].touch)
			continue;
		void *p;
		assert_int_equal(arena_alloc(&a, regions[i].name, regions[i].size, 64, &p, &err), 0);
		memset(p, 0x33, regions[i].size);
	}
	struct ledger *l = malloc(sizeof *l);
	assert_non_null(l);
	assert_int_equal(ledger_collect(l, &a, NULL, 0, NULL, &err), 0);
	for (size_t i = 0; i < n; i++) {
		const struct ledger_entry *e = entry(l, regions[i].name);
		assert_int_equal(e->group, regions[i].group);
		assert_int_equal(e->bytes, regions[i].size);
		assert_int_equal(e->resident, regions[i].touch ? regions[i].size : 0);
	}
	assert_int_equal(l->group_resident[LEDGER_DRAFT], 4 * MiB);
	assert_int_equal(l->group_bytes[LEDGER_DRAFT], 4 * MiB + 2 * 64 * 1024);
	assert_int_equal(l->group_resident[LEDGER_WEIGHTS], MiB);
	assert_int_equal(l->group_resident[LEDGER_KV], MiB);
	assert_string_equal(ledger_group_name(LEDGER_DRAFT), "draft");

	char *buf = malloc(16384);
	assert_non_null(buf);
	size_t len = ledger_format_table(l, buf, 16384);
	assert_true(len > 0 && len < 16384);
	const char *title = strstr(buf, "draft model (in the arena)");
	assert_non_null(title);
	/* the draft's lines follow their title, after the model's groups */
	assert_true(strstr(buf, "draft.weights.q4g32") > title);
	assert_true(strstr(buf, "draft.kv_pool ") > title);
	assert_true(strstr(buf, "KV pool") < title);
	len = ledger_format_json(l, buf, 16384);
	assert_true(len > 0 && len < 16384);
	assert_non_null(strstr(buf, "\"name\":\"draft.kv_pool\",\"group\":\"draft\""));
	assert_non_null(strstr(buf, "\"name\":\"draft.bogus\",\"group\":\"arena_other\""));
	assert_non_null(strstr(buf, "\"draft\":{\"bytes\":4325376,\"resident\":4194304}"));
	free(buf);
	free(l);
	arena_destroy(&a);
}

/* The wire reply carries every line that holds something, sums to the ledger's total,
 * and survives the protocol's own strict decoder (names and counts within its limits). */
static void test_ledger_reply_carries_every_line_and_decodes(void **state)
{
	(void)state;
	struct world w;
	world_make(&w, ARENA_PAGES_NONE);
	struct ledger_range ranges[] = {
		{ "rings", LEDGER_RINGS, w.ring, w.ring_len },
	};
	struct ledger *l = malloc(sizeof *l);
	assert_non_null(l);
	struct hearth_error err;
	assert_int_equal(ledger_collect(l, &w.arena, ranges, 1, NULL, &err), 0);

	struct msg_ledger_entry ents[LEDGER_MAX_ENTRIES];
	struct msg r;
	msg_init(&r, MSG_LEDGER_REPLY, 7);
	ledger_to_reply(l, ents, LEDGER_MAX_ENTRIES, &r.u.ledger);
	size_t want = 0;
	for (size_t i = 0; i < l->n_entries; i++)
		want += l->entries[i].bytes || l->entries[i].resident;
	assert_int_equal(r.u.ledger.n_entries, want);
	assert_true(want < l->n_entries); /* "other shared memory" holds nothing here */
	assert_int_equal(r.u.ledger.total, l->total_resident);
	assert_true(r.u.ledger.peak >= r.u.ledger.total);
	assert_true(r.u.ledger.peak >= l->status.vm_hwm);
	bool saw_kv = false, saw_scratch = false;
	for (size_t i = 0; i < r.u.ledger.n_entries; i++) {
		const struct msg_ledger_entry *e = &r.u.ledger.entries[i];
		char name[LEDGER_NAME_MAX + 1];
		snprintf(name, sizeof name, "%.*s", (int)e->name.len, e->name.ptr);
		assert_int_equal(e->bytes, entry(l, name)->resident);
		saw_kv |= strcmp(name, "kv_pool") == 0 && e->bytes == 4 * MiB;
		saw_scratch |= strcmp(name, "scratch.act") == 0 && e->bytes == 0; /* reserved, idle */
	}
	assert_true(saw_kv);
	assert_true(saw_scratch);

	struct msg_buf buf = { 0 };
	assert_int_equal(msg_encode(&r, &buf, &err), 0);
	struct msg d;
	struct msg_reject rej;
	assert_true(buf.len > 4);
	assert_int_equal(msg_decode(buf.data + 4, buf.len - 4, MSG_FROM_DAEMON, &d, &rej, &err), 0);
	assert_int_equal(d.type, MSG_LEDGER_REPLY);
	assert_int_equal(d.u.ledger.n_entries, r.u.ledger.n_entries);
	assert_int_equal(d.u.ledger.total, r.u.ledger.total);
	assert_int_equal(d.u.ledger.peak, r.u.ledger.peak);
	msg_free(&d);
	msg_buf_free(&buf);

	/* a short array: the first lines, and a total that is theirs */
	ledger_to_reply(l, ents, 2, &r.u.ledger);
	assert_int_equal(r.u.ledger.n_entries, 2);
	assert_int_equal(r.u.ledger.total, ents[0].bytes + ents[1].bytes);
	free(l);
	world_free(&w);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_memstat_statm_anon_agrees_with_status),
		cmocka_unit_test(test_ledger_sampler_sees_the_load_transient),
		cmocka_unit_test(test_ledger_entries_add_up_to_rss_normal_pages),
		cmocka_unit_test_setup_teardown(test_ledger_entries_add_up_to_rss_auto_pages, pool_setup,
						pool_teardown),
		cmocka_unit_test_setup_teardown(test_ledger_entries_add_up_with_a_hugetlb_arena, pool_setup,
						pool_teardown),
		cmocka_unit_test(test_ledger_counts_each_byte_once),
		cmocka_unit_test(test_ledger_formats_table_and_json),
		cmocka_unit_test(test_ledger_groups_the_draft_regions_apart),
		cmocka_unit_test(test_ledger_reply_carries_every_line_and_decodes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
