/* Prometheus text format for hearthd's stats and ledger: metric names follow Prometheus'
 * conventions (hearth_ prefix, base units, _total for counters), so dashboards built for
 * one exporter read the other. */
#include "client/prom.h"

#include <ctype.h>
#include <inttypes.h>
#include <string.h>

void prom_header(FILE *out, const char *name, const char *type, const char *help)
{
	fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void metric(FILE *out, const char *name, const char *type, const char *help, double v)
{
	prom_header(out, name, type, help);
	fprintf(out, "%s %.10g\n", name, v);
}

void prom_write_daemon(FILE *out, const struct hearth_stats *st, const struct hearth_ledger *ledger)
{
	metric(out, "hearth_up", "gauge", "1 when hearthd answered.", 1);
	metric(out, "hearth_uptime_seconds", "gauge", "Time since hearthd started.", (double)st->uptime_ms / 1e3);
	metric(out, "hearth_clients", "gauge", "Connected clients.", st->clients);
	metric(out, "hearth_running_sequences", "gauge", "Sequences being computed.", st->running);
	metric(out, "hearth_queued_requests", "gauge", "Requests waiting for a sequence slot.", st->queued);
	metric(out, "hearth_prompt_tokens_total", "counter", "Prompt tokens processed since start.",
	       (double)st->prompt_tokens);
	metric(out, "hearth_generated_tokens_total", "counter", "Tokens generated since start.",
	       (double)st->gen_tokens);
	metric(out, "hearth_kv_used_bytes", "gauge", "KV cache bytes in use.", (double)st->kv_used);
	metric(out, "hearth_kv_total_bytes", "gauge", "KV cache budget in bytes.", (double)st->kv_total);
	if (st->draft_kv_total) {
		metric(out, "hearth_draft_kv_used_bytes", "gauge", "The draft model's KV cache bytes in use.",
		       (double)st->draft_kv_used);
		metric(out, "hearth_draft_kv_total_bytes", "gauge", "The draft model's KV cache in bytes.",
		       (double)st->draft_kv_total);
	}
	metric(out, "hearth_resident_memory_bytes", "gauge", "hearthd's resident set.", (double)st->rss);
	metric(out, "hearth_prefix_cache_lookup_tokens_total", "counter",
	       "Prompt tokens of admitted requests, looked up in the prefix cache.", (double)st->prefix_lookup_tokens);
	metric(out, "hearth_prefix_cache_hit_tokens_total", "counter",
	       "Prompt tokens found in the prefix cache and not computed again (hit ratio: over lookup_tokens_total).",
	       (double)st->prefix_hit_tokens);
	metric(out, "hearth_draft_tokens_total", "counter",
	       "Speculative decoding: draft tokens verified since start (prompt lookup and draft model).",
	       (double)st->draft_tokens);
	metric(out, "hearth_draft_accepted_tokens_total", "counter", "Of the draft tokens, those accepted.",
	       (double)st->draft_accepted);
	metric(out, "hearth_draft_model_tokens_total", "counter", "Of the draft tokens, the draft model's.",
	       (double)st->draft_model_tokens);
	metric(out, "hearth_draft_model_accepted_tokens_total", "counter",
	       "Of the draft model's tokens, those accepted (its acceptance: over draft_model_tokens_total).",
	       (double)st->draft_model_accepted);
	if (st->phase[0]) {
		/* One series, the current phase: a label value the loader names, kept printable. */
		char phase[sizeof st->phase];
		size_t k = 0;
		for (const char *p = st->phase; *p && k + 1 < sizeof phase; p++)
			phase[k++] = isalnum((unsigned char)*p) || *p == '_' || *p == '-' ? *p : '_';
		phase[k] = 0;
		prom_header(out, "hearth_load_phase", "gauge", "1 for hearthd's current phase (ready, failed, or a load phase).");
		fprintf(out, "hearth_load_phase{phase=\"%s\"} 1\n", phase);
	}
	if (!ledger)
		return;
	prom_header(out, "hearth_memory_bytes", "gauge", "hearthd's memory by owner (the ledger).");
	for (size_t i = 0; i < ledger->n_entries; i++) {
		char region[sizeof ledger->entries[i].name];
		size_t k = 0;
		/* Label values may hold anything but a quote, backslash or newline unescaped. */
		for (const char *p = ledger->entries[i].name; *p && k + 1 < sizeof region; p++)
			region[k++] = (*p == '"' || *p == '\\' || *p == '\n') ? '_' : *p;
		region[k] = 0;
		fprintf(out, "hearth_memory_bytes{region=\"%s\"} %" PRIu64 "\n", region, ledger->entries[i].bytes);
	}
	metric(out, "hearth_memory_ledger_total_bytes", "gauge", "Sum of the ledger.", (double)ledger->total);
	metric(out, "hearth_memory_ledger_peak_bytes", "gauge", "Largest ledger total seen.", (double)ledger->peak);
}
