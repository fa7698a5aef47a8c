/* Memory benchmark (not a test): loads a model the way hearthd does (load_q4 with the
 * service's options), with the ledger sampler around the load, prints the ledger and checks
 * the residency targets of doc/memory.md ("Measured"), one PASS/FAIL line each.
 * Usage: bench_memory MODEL.gguf [--kv-budget SIZE] [--max-context N] [--hugepages P]
 *        [--head int4|int6|int8] [--json] [--smaps]. Exit status 0 when every target passes, 1 when one fails, 2 on error. */
#include <getopt.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "daemon/engine/arena.h"
#include "daemon/engine/ledger.h"
#include "daemon/engine/load.h"
#include "daemon/engine/memstat.h"
#include "daemon/engine/model_q4.h"
#include "daemon/engine/tokenizer.h"
#include "kernels/dispatch.h"
#include "protocol/clock.h"
#include "protocol/units.h"

#define MIB ((size_t)1 << 20)

/* The targets. "MB" there is read as MiB, like every size in hearth's config. */
#define TARGET_SETTLED_SLACK (48 * MIB)   /* settled <= packed weights + KV budget + this */
#define TARGET_TRANSIENT (32 * MIB)       /* load peak - settled */
#define TARGET_ROPE (2 * MIB)
#define TARGET_LEDGER_PCT 2.0

static double mib(size_t b)
{
	return (double)b / (double)MIB;
}

static int failures;

static void check(bool ok, const char *what, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void check(bool ok, const char *what, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("%s  %-44s ", ok ? "PASS" : "FAIL", what);
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	failures += !ok;
}

static const struct ledger_entry *entry_find(const struct ledger *l, const char *name)
{
	for (size_t i = 0; i < l->n_entries; i++)
		if (strcmp(l->entries[i].name, name) == 0)
			return &l->entries[i];
	return NULL;
}

struct smaps_ctx {
	const struct arena *arena;
};

/* Every mapping outside the arena holding 256 KiB or more: what "code" and "other" are. */
static int smaps_print(const struct memstat_vma *v, void *ctx)
{
	const struct smaps_ctx *c = ctx;
	uintptr_t lo = (uintptr_t)c->arena->base, hi = lo + c->arena->size;
	if (v->start < hi && lo < v->end)
		return 0;
	if (v->rss < 256 * 1024)
		return 0;
	printf("  %012" PRIxPTR "-%012" PRIxPTR " %s %8.1f MiB rss %8.1f MiB anon  %s\n", v->start,
	       v->end, v->perms, mib(v->rss), mib(v->anonymous), v->path[0] ? v->path : "(anonymous)");
	return 0;
}

static void usage(FILE *to)
{
	fprintf(to, "usage: bench_memory MODEL.gguf [--kv-budget SIZE] [--max-context N]\n"
		    "                    [--hugepages auto|hugetlb|thp|none] [--head int4|int6|int8]\n"
		    "                    [--json] [--smaps]\n"
		    "defaults: --kv-budget 192MiB --max-context 2048 --hugepages auto, the head as the mix rule decides\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "kv-budget", required_argument, NULL, 'k' },
		{ "max-context", required_argument, NULL, 'c' },
		{ "hugepages", required_argument, NULL, 'p' },
		{ "head", required_argument, NULL, 'H' },
		{ "json", no_argument, NULL, 'j' },
		{ "smaps", no_argument, NULL, 's' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	uint64_t kv_budget = 192 * MIB;
	unsigned long max_context = 2048;
	enum arena_pages pages = ARENA_PAGES_AUTO;
	uint32_t head_bits = 0; /* the loader's (mix rule's) choice unless --head says */
	bool json = false, smaps = false;
	struct hearth_error e;
	int ch;
	while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (ch) {
		case 'k':
			if (units_parse_size(optarg, &kv_budget, &e) < 0) {
				fprintf(stderr, "bench_memory: --kv-budget: %s\n", e.msg);
				return 2;
			}
			break;
		case 'c':
			max_context = strtoul(optarg, NULL, 10);
			if (max_context == 0 || max_context > UINT32_MAX) {
				fprintf(stderr, "bench_memory: --max-context: '%s' is not a count\n", optarg);
				return 2;
			}
			break;
		case 'p':
			if (arena_pages_parse(optarg, &pages, &e) < 0) {
				fprintf(stderr, "bench_memory: --hugepages: %s\n", e.msg);
				return 2;
			}
			break;
		case 'H':
			if (strcmp(optarg, "int4") && strcmp(optarg, "int6") && strcmp(optarg, "int8")) {
				fprintf(stderr, "bench_memory: --head: '%s' is not int4, int6 or int8\n", optarg);
				return 2;
			}
			head_bits = !strcmp(optarg, "int8")   ? LOAD_HEAD_INT8
				    : !strcmp(optarg, "int6") ? LOAD_HEAD_INT6
							      : LOAD_HEAD_INT4;
			break;
		case 'j':
			json = true;
			break;
		case 's':
			smaps = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc - 1) {
		usage(stderr);
		return 2;
	}
	const char *path = argv[optind];
	if (kern_select(getenv("HEARTH_KERNELS")) < 0) {
		fprintf(stderr, "bench_memory: HEARTH_KERNELS names no usable kernel set\n");
		return 2;
	}

	/* The options hearthd's loader thread passes (daemon/serve/main_serve.c), with the
	 * loader's defaults (which the scheduler's max_seqs and step_tokens are) for what this
	 * benchmark does not set. */
	struct load_opts o;
	load_opts_default(&o);
	o.max_context = (uint32_t)max_context;
	o.kv_budget = kv_budget;
	o.kv_type = QTYPE_F16;
	o.act = Q4_ACT_A16;
	o.arena.pages = pages;
	o.head_bits = head_bits;
	struct ledger_load rec;
	struct arena_placement placement;
	o.load_record = &rec;
	o.placement = &placement;

	struct model_q4 *m;
	struct tok *tok;
	uint64_t t0 = hearth_now_ns();
	if (load_q4(&m, &tok, path, &o, &e) < 0) {
		fprintf(stderr, "bench_memory: %s\n", e.msg);
		return 2;
	}
	double load_s = (double)(hearth_now_ns() - t0) * 1e-9;
	/* On a shared machine wall time says little; CPU time says what the load costs. */
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	double cpu_s = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
		       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;

	struct ledger *l = malloc(sizeof *l);
	size_t cap = 16384;
	char *text = malloc(cap);
	if (!l || !text) {
		fprintf(stderr, "bench_memory: out of memory\n");
		return 2;
	}
	/* Measured after the buffers above exist, so they are part of what is counted. */
	t0 = hearth_now_ns();
	if (ledger_collect(l, m->arena, NULL, 0, &rec, &e) < 0) {
		fprintf(stderr, "bench_memory: ledger: %s\n", e.msg);
		return 2;
	}
	/* what a `hearth ledger` request costs the daemon's loop thread */
	double collect_ms = (double)(hearth_now_ns() - t0) * 1e-6;
	if (json) {
		ledger_format_json(l, text, cap);
		printf("%s\n", text);
	}
	ledger_format_table(l, text, cap);
	printf("%s", text);
	printf("model: %s (%s), %u layers, n_embd %u, vocab %u, %s, tied head: %s\n", m->name,
	       m->arch_name, m->n_layer, m->hp.n_embd, m->hp.n_vocab, m->quant_name,
	       m->output.data ? "no" : "yes");
	printf("options: max_context %u, kv_budget %.0f MiB (f16), max_seqs %u, step_tokens %u, "
	       "pages %s; load %.2f s wall, %.2f s CPU\n",
	       o.max_context, mib(o.kv_budget), o.max_seqs, o.step_tokens, arena_pages_name(pages),
	       load_s, cpu_s);
	printf("arena note: %s\n", m->arena->note);
	printf("ledger_collect: %.1f ms\n", collect_ms);
	printf("placement: ");
	if (!placement.numa_known)
		printf("unknown (no NUMA)");
	for (int n = 0; placement.numa_known && n < placement.n_nodes; n++)
		printf("node %d %.1f MiB; ", n, mib(placement.node_bytes[n]));
	if (placement.numa_known)
		printf("not present %.1f MiB; off the bound node %.1f MiB",
		       mib(placement.bytes_not_present), mib(placement.bytes_other_node));
	printf("\n");
	if (smaps) {
		printf("mappings outside the arena with >= 256 KiB resident:\n");
		struct smaps_ctx sc = { m->arena };
		if (memstat_smaps_foreach(smaps_print, &sc, &e) < 0)
			fprintf(stderr, "bench_memory: smaps: %s\n", e.msg);
	}
	printf("\n");

	size_t packed = l->group_bytes[LEDGER_WEIGHTS] + l->group_bytes[LEDGER_EMBED_HEAD];
	size_t settled = l->process_resident;
	size_t limit = packed + (size_t)o.kv_budget + TARGET_SETTLED_SLACK;
	check(settled <= limit, "settled RSS <= packed + KV budget + 48 MiB",
	      "%.1f MiB <= %.1f + %.1f + 48 = %.1f MiB (margin %+.1f MiB)", mib(settled), mib(packed),
	      mib(o.kv_budget), mib(limit), mib(limit) - mib(settled));
	check(rec.valid && rec.transient <= TARGET_TRANSIENT, "load peak - settled <= 32 MiB (RssAnon)",
	      "peak %.1f - settled %.1f = %.1f MiB (%" PRIu64 " samples, peak at %" PRIu64 " ms of %" PRIu64 ")",
	      mib(rec.peak_anon), mib(rec.settled_anon), mib(rec.transient), rec.samples, rec.peak_at_ms,
	      rec.duration_ms);
	/* VmHWM sees what 10 ms samples can miss, and file pages, which RssAnon leaves out;
	 * hugetlb pages are in neither VmHWM nor VmRSS, so the comparison is like for like. */
	size_t hwm_transient = rec.kernel_peak_rss > l->status.vm_rss ? rec.kernel_peak_rss - l->status.vm_rss : 0;
	check(hwm_transient <= TARGET_TRANSIENT, "kernel peak RSS - settled RSS <= 32 MiB",
	      "VmHWM %.1f - VmRSS %.1f = %.1f MiB (includes file pages)", mib(rec.kernel_peak_rss),
	      mib(l->status.vm_rss), mib(hwm_transient));
	check(l->group_bytes[LEDGER_ROPE] <= TARGET_ROPE, "RoPE tables <= 2 MiB",
	      "%.2f MiB for max_context %u (%u table(s))", mib(l->group_bytes[LEDGER_ROPE]),
	      o.max_context, m->n_ropes);
	const struct ledger_entry *kv = entry_find(l, ARENA_REGION_KV);
	check(kv && kv->bytes && kv->resident == kv->bytes, "KV pool 100% resident (mincore)",
	      "%.1f of %.1f MiB resident (%u blocks of %zu bytes)", kv ? mib(kv->resident) : 0.0,
	      kv ? mib(kv->bytes) : 0.0, m->kv.geo.n_blocks, m->kv.geo.block_bytes);
	double pct = l->diff_pct < 0 ? -l->diff_pct : l->diff_pct;
	check(pct <= TARGET_LEDGER_PCT, "ledger sums to RSS within 2%",
	      "ledger %.1f MiB vs VmRSS + hugetlb %.1f MiB (%+.3f%%)", mib(l->total_resident),
	      mib(l->process_resident), l->diff_pct);
	printf("%s\n", failures ? "some targets missed" : "all targets met");

	free(text);
	free(l);
	tok_free(tok);
	model_q4_free(m);
	return failures ? 1 : 0;
}
