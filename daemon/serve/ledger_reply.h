/* The memory ledger (daemon/engine/ledger.h) as the wire's `ledger_reply`: the engine's
 * ledger knows no wire types, the service translates. */
#ifndef HEARTH_SERVE_LEDGER_REPLY_H
#define HEARTH_SERVE_LEDGER_REPLY_H

#include "daemon/engine/ledger.h"
#include "protocol/msg.h"

/* The ledger as the wire's `ledger_reply` (protocol/msg.h), for `hearth ledger`: one entry
 * per ledger line with its resident bytes, in ledger order, named as in the table (arena
 * regions by region name: "weights.q4g128", "embed_head", "kv_pool", ..., a draft model's
 * "draft.weights.q4g32", "draft.kv_pool", ...; then "code and libraries", "other
 * heap/stacks"); lines that neither reserve nor hold anything are left out. entries (cap of them; LEDGER_MAX_ENTRIES always suffice, and fit MSG_LEDGER_MAX)
 * is the caller's array, names point into l: keep both alive until the reply is encoded.
 * out->total is the sum of the entries sent (l->total_resident when none is cut), out->peak
 * the most the process has held: VmHWM (reset when the load sampler started) plus hugetlb
 * pages, never below total. */
void ledger_to_reply(const struct ledger *l, struct msg_ledger_entry *entries, size_t cap,
		     struct msg_ledger_reply *out);

#endif
