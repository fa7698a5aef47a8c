/* GET /metrics: the gateway's own counters and latency histograms, then hearthd's stats and
 * memory ledger, in Prometheus' text format. A scrape costs one short hearthd connection. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/openai/gw.h"
#include "client/prom.h"

static const char *const ep_names[GW_EP_COUNT] = { "chat_completions", "completions", "models", "embeddings",
						    "health", "metrics", "other" };
static const char *const class_names[6] = { "2xx", "4xx", "429", "5xx", "503", "client_gone" };

static void hist(FILE *f, const char *name, const char *help, struct gw_hist *h)
{
	static const char *const le[GW_HIST_BUCKETS] = { "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1",
							 "0.25",  "0.5",    "1",     "2.5",  "5",     "10",   "30" };
	uint64_t cum = 0;
	prom_header(f, name, "histogram", help);
	for (size_t i = 0; i < GW_HIST_BUCKETS; i++) {
		cum += atomic_load(&h->count[i]);
		fprintf(f, "%s_bucket{le=\"%s\"} %llu\n", name, le[i], (unsigned long long)cum);
	}
	cum += atomic_load(&h->count[GW_HIST_BUCKETS]);
	fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
	fprintf(f, "%s_sum %.6f\n%s_count %llu\n", name, (double)atomic_load(&h->sum_us) / 1e6, name,
		(unsigned long long)atomic_load(&h->n));
}

void gw_metrics_reply(struct gw *g, struct gw_reply *r)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f) {
		gw_reply_error(r, 500, "server_error", NULL, NULL, "out of memory");
		return;
	}
	struct gw_metrics *m = &g->metrics;
	prom_header(f, "hearth_openai_requests_total", "counter", "HTTP requests by endpoint and outcome.");
	for (int e = 0; e < GW_EP_COUNT; e++)
		for (int k = 0; k < 6; k++) {
			uint64_t v = atomic_load(&m->requests[e][k]);
			if (v)
				fprintf(f, "hearth_openai_requests_total{endpoint=\"%s\",outcome=\"%s\"} %llu\n", ep_names[e],
					class_names[k], (unsigned long long)v);
		}
	prom_header(f, "hearth_openai_in_flight_requests", "gauge", "Requests being answered.");
	fprintf(f, "hearth_openai_in_flight_requests %llu\n", (unsigned long long)atomic_load(&m->in_flight));
	prom_header(f, "hearth_openai_prompt_tokens_total", "counter", "Prompt tokens of answered requests.");
	fprintf(f, "hearth_openai_prompt_tokens_total %llu\n", (unsigned long long)atomic_load(&m->prompt_tokens));
	prom_header(f, "hearth_openai_prompt_cached_tokens_total", "counter",
		    "Prompt tokens found in hearthd's prefix cache (hit ratio: over prompt_tokens_total).");
	fprintf(f, "hearth_openai_prompt_cached_tokens_total %llu\n", (unsigned long long)atomic_load(&m->cached_tokens));
	prom_header(f, "hearth_openai_generated_tokens_total", "counter", "Tokens generated for answered requests.");
	fprintf(f, "hearth_openai_generated_tokens_total %llu\n", (unsigned long long)atomic_load(&m->gen_tokens));
	hist(f, "hearth_openai_time_to_first_token_seconds", "Time from the request to its first token.", &m->ttft);
	hist(f, "hearth_openai_time_per_output_token_seconds", "Time between consecutive tokens.", &m->tpot);

	struct hearth_connect_opts o = { .socket_path = g->cfg.hearth_socket, .client_name = "openai/metrics",
					 .no_hello = true, .timeout_ms = 2000 };
	struct hearth *h = NULL;
	struct hearth_err err;
	struct hearth_stats st;
	struct hearth_ledger ledger;
	if (hearth_connect_with(&h, &o, &err) == 0 && hearth_stats(h, &st, &err) == 0) {
		prom_write_daemon(f, &st, hearth_ledger(h, &ledger, &err) == 0 ? &ledger : NULL);
	} else {
		prom_header(f, "hearth_up", "gauge", "1 when hearthd answered.");
		fprintf(f, "hearth_up 0\n");
	}
	hearth_close(h);
	fclose(f);
	r->status = 200;
	r->text = text;
	r->content_type = "text/plain; version=0.0.4; charset=utf-8";
}
