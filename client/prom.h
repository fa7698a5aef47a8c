/* hearthd's figures in Prometheus' text exposition format, shared by `hearth stats
 * --prometheus` (node_exporter's textfile collector) and hearth-openai's /metrics. */
#ifndef HEARTH_CLIENT_PROM_H
#define HEARTH_CLIENT_PROM_H

#include <stdio.h>

#include "client/hearth.h"

/* Writes the daemon's stats and (when ledger is not NULL) its memory ledger by region. */
void prom_write_daemon(FILE *out, const struct hearth_stats *st, const struct hearth_ledger *ledger);

/* One metric's HELP and TYPE lines. */
void prom_header(FILE *out, const char *name, const char *type, const char *help);

#endif
