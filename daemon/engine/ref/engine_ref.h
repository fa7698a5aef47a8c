/* The scheduler's engine interface over the f32 reference model: every sequence gets its
 * own model_ctx, and KV is accounted against a byte budget so admission behaves as it
 * will with the paged int4 engine. Slow by design: it is the oracle, served. */
#ifndef HEARTH_DAEMON_ENGINE_REF_H
#define HEARTH_DAEMON_ENGINE_REF_H

#include "daemon/engine/engine.h"
#include "daemon/engine/model.h"
#include "daemon/engine/ref/forward.h"

struct engine_ref;

/* kv_budget: bytes of KV all sequences together may hold (f32 K and V per layer). */
int engine_ref_new(struct engine_ref **out, const struct model *m, uint32_t max_context,
		   uint64_t kv_budget, struct engine *eng, struct hearth_error *err);
void engine_ref_free(struct engine_ref *e);

/* Bytes of KV one token costs in this engine. */
uint64_t engine_ref_kv_bytes_per_token(const struct model *m);

#endif
