/* The ledger as a `ledger_reply` (ledger_reply.h). */
#include "daemon/serve/ledger_reply.h"

#include <string.h>

_Static_assert(LEDGER_NAME_MAX - 1 <= MSG_NAME_MAX, "ledger names must fit the wire's");
_Static_assert(LEDGER_MAX_ENTRIES <= MSG_LEDGER_MAX, "a whole ledger must fit one reply");

void ledger_to_reply(const struct ledger *l, struct msg_ledger_entry *entries, size_t cap,
		     struct msg_ledger_reply *out)
{
	memset(out, 0, sizeof *out);
	out->entries = entries;
	for (size_t i = 0; i < l->n_entries && out->n_entries < cap; i++) {
		const struct ledger_entry *e = &l->entries[i];
		if (e->bytes == 0 && e->resident == 0)
			continue;
		size_t len = strnlen(e->name, sizeof e->name);
		entries[out->n_entries++] = (struct msg_ledger_entry){ { e->name, len }, e->resident };
		out->total += e->resident;
	}
	/* hugetlb pages are outside VmRSS and so outside VmHWM; they are constant after the
	 * arena is mapped, so adding today's count gives the peak in the ledger's terms */
	uint64_t peak = (uint64_t)l->status.vm_hwm + l->status.hugetlb;
	out->peak = peak > out->total ? peak : out->total;
}
