/* The request/reply half of libhearth: tokenize, detokenize, stats, ledger, ping and the
 * welcome's model facts. Each is one frame out and one final frame back (conn_call);
 * texts too large for a frame go through the ring like generate prompts. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/conn.h"
#include "protocol/clock.h"

void hearth_free(void *p)
{
	free(p);
}

int hearth_model_info(struct hearth *h, struct hearth_model *out, struct hearth_err *err)
{
	if (!h->welcomed) {
		memset(out, 0, sizeof *out);
		return conn_err_set(err, HEARTH_EINVAL,
				    "this connection skipped hello: hearthd said nothing of its model");
	}
	*out = h->model;
	return 0;
}

int hearth_tokenize(struct hearth *h, const char *text, size_t len, unsigned flags,
		    uint32_t **tokens, size_t *n_tokens, struct hearth_err *err)
{
	*tokens = NULL;
	*n_tokens = 0;
	if (!text && len)
		return conn_err_set(err, HEARTH_EINVAL, "hearth_tokenize: text is NULL");
	if (!msg_utf8_valid(text, len))
		return conn_err_set(err, HEARTH_EINVAL, "the text to tokenize is not valid UTF-8");
	struct msg m;
	msg_init(&m, MSG_TOKENIZE, 0);
	m.u.tokenize.add_bos = !(flags & HEARTH_TOKENIZE_NO_BOS);
	m.u.tokenize.special = (flags & HEARTH_TOKENIZE_SPECIAL) != 0;
	struct conn_bulk bulk = { RING_REC_BULK_TEXT, 0, text, len };
	bool use_bulk = len > h->inline_max;
	if (use_bulk) {
		/* conn_call makes the ref the request id; the frame must name the same. */
		m.u.tokenize.has_text_ref = true;
	} else {
		m.u.tokenize.has_text = true;
		m.u.tokenize.text = (struct msg_bytes){ text ? text : "", len };
	}
	struct msg reply;
	int rc = conn_call(h, &m, use_bulk ? &bulk : NULL, MSG_TOKENS, &reply, err);
	if (rc < 0)
		return rc;
	size_t n = reply.u.tokens.n_tokens;
	uint32_t *ids = malloc((n ? n : 1) * sizeof *ids);
	if (!ids) {
		msg_free(&reply);
		return conn_err_set(err, HEARTH_ENOMEM, "out of memory for %zu tokens", n);
	}
	if (n)
		memcpy(ids, reply.u.tokens.tokens, n * sizeof *ids);
	msg_free(&reply);
	*tokens = ids;
	*n_tokens = n;
	return 0;
}

int hearth_detokenize(struct hearth *h, const uint32_t *tokens, size_t n_tokens, char **text,
		      size_t *len, struct hearth_err *err)
{
	*text = NULL;
	if (len)
		*len = 0;
	if (!tokens && n_tokens)
		return conn_err_set(err, HEARTH_EINVAL, "hearth_detokenize: tokens is NULL");
	if (n_tokens > MSG_ARRAY_MAX)
		return conn_err_set(err, HEARTH_ERANGE, "%zu tokens to detokenize; at most %u",
				    n_tokens, MSG_ARRAY_MAX);
	static const uint32_t none[1];
	struct msg m;
	msg_init(&m, MSG_DETOKENIZE, 0);
	m.u.detokenize.tokens = (uint32_t *)(tokens ? tokens : none);
	m.u.detokenize.n_tokens = n_tokens;
	struct msg reply;
	int rc = conn_call(h, &m, NULL, MSG_TEXT, &reply, err);
	if (rc < 0)
		return rc;
	size_t n = reply.u.text.text.len;
	char *s = malloc(n + 1);
	if (!s) {
		msg_free(&reply);
		return conn_err_set(err, HEARTH_ENOMEM, "out of memory for %zu bytes of text", n);
	}
	if (n)
		memcpy(s, reply.u.text.text.ptr, n);
	s[n] = '\0';
	msg_free(&reply);
	*text = s;
	if (len)
		*len = n;
	return 0;
}

int hearth_stats(struct hearth *h, struct hearth_stats *out, struct hearth_err *err)
{
	memset(out, 0, sizeof *out);
	struct msg m;
	msg_init(&m, MSG_STATS, 0);
	struct msg reply;
	int rc = conn_call(h, &m, NULL, MSG_STATS_REPLY, &reply, err);
	if (rc < 0)
		return rc;
	const struct msg_stats_reply *s = &reply.u.stats;
	out->uptime_ms = s->uptime_ms;
	out->clients = s->clients;
	out->running = s->running;
	out->queued = s->queued;
	out->prompt_tokens = s->prompt_tokens;
	out->gen_tokens = s->gen_tokens;
	out->kv_used = s->kv_used;
	out->kv_total = s->kv_total;
	out->rss = s->rss;
	out->draft_tokens = s->draft_tokens;
	out->draft_accepted = s->draft_accepted;
	out->draft_model_tokens = s->draft_model_tokens;
	out->draft_model_accepted = s->draft_model_accepted;
	out->draft_kv_used = s->draft_kv_used;
	out->draft_kv_total = s->draft_kv_total;
	out->prefix_lookup_tokens = s->prefix_lookup_tokens;
	out->prefix_hit_tokens = s->prefix_hit_tokens;
	size_t n = s->phase.len < sizeof out->phase - 1 ? s->phase.len : sizeof out->phase - 1;
	memcpy(out->phase, s->phase.ptr, n);
	out->phase[n] = 0;
	msg_free(&reply);
	return 0;
}

int hearth_ledger(struct hearth *h, struct hearth_ledger *out, struct hearth_err *err)
{
	memset(out, 0, sizeof *out);
	struct msg m;
	msg_init(&m, MSG_LEDGER, 0);
	struct msg reply;
	int rc = conn_call(h, &m, NULL, MSG_LEDGER_REPLY, &reply, err);
	if (rc < 0)
		return rc;
	const struct msg_ledger_reply *l = &reply.u.ledger;
	size_t n = l->n_entries < HEARTH_LEDGER_MAX ? l->n_entries : HEARTH_LEDGER_MAX;
	for (size_t i = 0; i < n; i++) {
		struct hearth_ledger_entry *e = &out->entries[i];
		size_t k = l->entries[i].name.len;
		if (k > sizeof e->name - 1)
			k = sizeof e->name - 1;
		if (k)
			memcpy(e->name, l->entries[i].name.ptr, k);
		e->name[k] = '\0';
		e->bytes = l->entries[i].bytes;
	}
	out->n_entries = n;
	out->total = l->total;
	out->peak = l->peak;
	msg_free(&reply);
	return 0;
}

int hearth_ping(struct hearth *h, uint64_t *rtt_us, struct hearth_err *err)
{
	struct msg m;
	msg_init(&m, MSG_PING, 0);
	struct msg reply;
	uint64_t a = hearth_now_ns();
	int rc = conn_call(h, &m, NULL, MSG_PONG, &reply, err);
	uint64_t b = hearth_now_ns();
	if (rc < 0)
		return rc;
	msg_free(&reply);
	if (rtt_us)
		*rtt_us = (b - a) / 1000;
	return 0;
}
