/* The compute thread's scheduler: admits queued requests round-robin by client, builds one
 * batch per step from every running sequence (a decode token each, plus bounded prefill
 * chunks), runs the engine once, samples, and streams tokens into the clients' rings.
 * Nothing here blocks on a client: a full ring parks only its own sequence. */
#include "daemon/serve/sched.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "daemon/engine/embed.h"
#include "daemon/engine/load.h"
#include "daemon/engine/tokenizer.h"
#include "daemon/serve/draft.h"
#include "daemon/serve/spec.h"
#include "protocol/assert.h"
#include "protocol/clock.h"

#define SCHED_PIECE_MAX 1024
#define SCHED_HOLD_MAX (SCHED_MAX_STOP_LEN * 2)
#define SCHED_TEXT_MAX (SCHED_HOLD_MAX + SCHED_PIECE_MAX + 16)

/* A token event built but not yet accepted by the client's ring. */
struct sched_event {
	int32_t token;
	uint32_t index;
	char text[SCHED_TEXT_MAX];
	uint32_t text_len;
	float logprob;
	uint32_t n_top;
	int32_t top_ids[SCHED_MAX_TOP];
	float top_logprobs[SCHED_MAX_TOP];
	bool with_logits;
	uint64_t t_sampled_ns;
};

struct sched_seq {
	struct sched_msg *msg;          /* NULL when the slot is free */
	struct engine_seq *eseq;
	uint32_t n_fed;                 /* tokens already in the KV */
	uint32_t n_tokens;              /* prompt + generated tokens in tokens[] */
	int32_t *tokens;                /* max_context */
	float *logits;                  /* n_vocab */
	struct sampler *sampler;
	struct tok_stream stream;
	char held[SCHED_HOLD_MAX];      /* text that may be the start of a stop string */
	uint32_t n_held;
	bool has_event;
	struct sched_event ev;
	uint64_t blocked_since;
	enum sched_finish finish;       /* set: the sequence ends once its event is out */
	struct hearth_error err;
	bool cancel;
	uint32_t *mask;                 /* the grammar's allowed tokens, one bit each */
	bool grammar_on;                /* the request's grammar constrains the next token */
	char tail[2 * SCHED_TRIGGER_MAX]; /* the output's last bytes, while a trigger is awaited */
	uint32_t n_tail;
	struct spec_seq spec;           /* speculative decoding: drafting state */
	int32_t draft[SPEC_K_MAX];      /* the draft the step verifies (also at tokens[n_tokens..]) */
	bool draft_from_model;          /* that draft is the draft model's proposal */
	struct draft_seq dseq;          /* the sequence in the draft model */
	uint32_t n_forced_pending;      /* the last tokens of tokens[]: forced by the grammar
					 * (jump-forward), their events not yet built */
	uint32_t prefill_end;           /* tokens[0..prefill_end) are fed as prefill: the prompt,
					 * or after a preemption everything up to now */
	/* An embed request (req.embed): the input being run, fed from embed_tokens (its
	 * prompt, not tokens[]) up to prefill_end, and the pooling of its rows so far. */
	uint32_t embed_input;
	const int32_t *embed_tokens;
	struct embed_pooler pooler;
	double *pool_acc;               /* n_embd, made with the entry's first embed request */
};

struct sched {
	struct sched_params p;
	struct engine eng;
	const struct tok *tok;
	struct queue in, out;
	int doorbell;
	void (*notify)(void *);
	void *notify_ctx;
	pthread_t thread;
	bool thread_started;
	_Atomic bool quit;
	size_t in_flight;               /* loop thread only: posted and not yet taken back */

	struct sched_seq *seqs;         /* n_slots entries; at most max_seqs hold KV */
	uint32_t n_slots;               /* max_seqs, and as many for preempted sequences */
	struct engine_span *spans;
	struct sched_seq **span_seq;
	float *spec_rows;               /* n_spec_rows x n_vocab: logits of verifying spans */
	float *embd_rows;               /* step_tokens x n_embd: hidden states of embed spans,
					 * made with the first embed request */
	uint32_t n_spec_rows;
	struct drafter *drafter;        /* the draft model's side, or NULL */
	struct draft_job *draft_jobs;   /* max_seqs */
	struct sched_client *rr;        /* next client whose waiting request is admitted */
	uint32_t last_uid;              /* the user admitted last */
	uint32_t prefill_cursor;
	uint64_t step_no;
	struct sched_msg *shutdown;
	uint64_t shutdown_deadline;
	uint32_t n_waiting;
	uint64_t tps_window_start, tps_window_tokens;

	struct sched_stats stats;
};

void sched_params_default(struct sched_params *p)
{
	/* The loader plans the arena for these two; they are its defaults, stated there once. */
	p->max_seqs = LOAD_DEFAULT_MAX_SEQS;
	p->step_tokens = LOAD_DEFAULT_STEP_TOKENS;
	p->prefill_chunk = 256;
	p->kv_wait_ns = 30ull * 1000000000ull;
	p->stall_ns = 30ull * 1000000000ull;
	p->preempt_ns = 250ull * 1000000ull;
	p->queue_cap = 4096;
	p->draft = NULL;
}

/* ---- messages back to the loop thread ---- */

static void sched_hand_back(struct sched *s, struct sched_msg *m)
{
	/* The loop never has more than queue_cap messages in flight, so this cannot fail;
	 * spinning here would only hide a broken invariant. */
	while (!queue_push(&s->out, m))
		sched_yield();
	if (s->notify)
		s->notify(s->notify_ctx);
}

static void sched_finish_msg(struct sched *s, struct sched_msg *m, enum sched_finish f,
			     const struct hearth_error *err)
{
	m->result.finish = f;
	if (err && f == SCHED_FINISH_ERROR)
		m->result.err = *err;
	m->result.t_end = hearth_now_ns();
	sched_hand_back(s, m);
}

static void sched_fail_msg(struct sched *s, struct sched_msg *m, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void sched_fail_msg(struct sched *s, struct sched_msg *m, int code, const char *fmt, ...)
{
	struct hearth_error e;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e.msg, sizeof e.msg, fmt, ap);
	va_end(ap);
	e.code = code;
	sched_finish_msg(s, m, SCHED_FINISH_ERROR, &e);
}

/* ---- the round-robin ring of clients with waiting requests ---- */

static void rr_insert(struct sched *s, struct sched_client *c)
{
	if (c->in_rr)
		return;
	c->in_rr = true;
	if (!s->rr) {
		c->rr_next = c;
		s->rr = c;
		return;
	}
	/* Newcomers go just before the current turn: they wait one full round at most. */
	struct sched_client *prev = s->rr;
	while (prev->rr_next != s->rr)
		prev = prev->rr_next;
	prev->rr_next = c;
	c->rr_next = s->rr;
}

static void rr_remove(struct sched *s, struct sched_client *c)
{
	if (!c->in_rr)
		return;
	c->in_rr = false;
	if (c->rr_next == c) {
		s->rr = NULL;
		return;
	}
	struct sched_client *prev = c;
	while (prev->rr_next != c)
		prev = prev->rr_next;
	prev->rr_next = c->rr_next;
	if (s->rr == c)
		s->rr = c->rr_next;
	c->rr_next = NULL;
}

static struct sched_msg *waiting_pop(struct sched *s, struct sched_client *c)
{
	struct sched_msg *m = c->waiting;
	if (!m)
		return NULL;
	c->waiting = m->link;
	if (!c->waiting)
		c->waiting_tail = NULL;
	m->link = NULL;
	s->n_waiting--;
	return m;
}

static void waiting_push(struct sched *s, struct sched_client *c, struct sched_msg *m)
{
	m->link = NULL;
	if (c->waiting_tail)
		c->waiting_tail->link = m;
	else
		c->waiting = m;
	c->waiting_tail = m;
	s->n_waiting++;
	rr_insert(s, c);
}

/* ---- sequences ---- */

static void seq_release(struct sched *s, struct sched_seq *q)
{
	if (q->eseq)
		s->eng.seq_close(s->eng.impl, q->eseq);
	q->eseq = NULL;
	if (q->msg)
		q->msg->client->n_running--;
	q->msg = NULL;
	q->has_event = false;
	q->finish = SCHED_FINISH_NONE;
	q->cancel = false;
	q->blocked_since = 0;
	sampler_free(q->sampler);
	q->sampler = NULL;
	if (s->drafter)
		drafter_seq_close(s->drafter, &q->dseq);
}

/* Ends a running sequence now and hands its message back. */
static void seq_end(struct sched *s, struct sched_seq *q, enum sched_finish f,
		    const struct hearth_error *err)
{
	struct sched_msg *m = q->msg;
	m->result.n_generated = m->req.embed ? 0 : q->n_tokens - m->req.n_prompt;
	seq_release(s, q);
	sched_finish_msg(s, m, f, err);
}

/* KV positions a request reserves: its prompt and max_tokens, within max_context. */
static uint32_t seq_reserve(const struct sched *s, const struct sched_request *r)
{
	uint32_t n = r->n_prompt + r->max_tokens;
	return n > s->eng.max_context || n < r->n_prompt ? s->eng.max_context : n;
}

/* Sequences holding KV and a place in the steps: at most max_seqs. A preempted one (a
 * message, no engine sequence) holds neither. */
static uint32_t sched_n_active(const struct sched *s)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < s->n_slots; i++)
		n += s->seqs[i].msg && s->seqs[i].eseq;
	return n;
}

/* Sequences of user uid holding KV and a place in the steps. */
static uint32_t sched_uid_active(const struct sched *s, uint32_t uid)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < s->n_slots; i++)
		n += s->seqs[i].msg && s->seqs[i].eseq && s->seqs[i].msg->client->uid == uid;
	return n;
}

/* Adds uid to the set uids[0..*n) of at most cap; false when it is full. */
static bool uid_set_add(uint32_t *uids, uint32_t *n, uint32_t cap, uint32_t uid)
{
	for (uint32_t j = 0; j < *n; j++)
		if (uids[j] == uid)
			return true;
	if (*n == cap)
		return false;
	uids[(*n)++] = uid;
	return true;
}

/* Each user's fair share of the sequence places: max_seqs over the users with a sequence
 * or a waiting request, rounded up (1 beyond USERS_MAX users). */
static uint32_t sched_fair_share(const struct sched *s)
{
	enum { USERS_MAX = 64 };
	uint32_t uids[USERS_MAX], n = 0;
	bool ok = true;
	for (uint32_t i = 0; i < s->n_slots && ok; i++)
		if (s->seqs[i].msg)
			ok = uid_set_add(uids, &n, USERS_MAX, s->seqs[i].msg->client->uid);
	const struct sched_client *c = s->rr;
	if (c) {
		do {
			ok = ok && uid_set_add(uids, &n, USERS_MAX, c->uid);
			c = c->rr_next;
		} while (ok && c != s->rr);
	}
	if (!ok)
		return 1;
	return n ? (s->p.max_seqs + n - 1) / n : s->p.max_seqs;
}

/* The buffers of an entry beyond the first max_seqs are made when a preemption first needs
 * it, so a daemon whose clients all read pays for max_seqs only. */
static bool seq_buffers(struct sched *s, struct sched_seq *q)
{
	if (q->tokens)
		return true;
	q->tokens = malloc((size_t)s->eng.max_context * sizeof(int32_t));
	q->logits = malloc((size_t)s->eng.n_vocab * sizeof(float));
	q->mask = malloc(((size_t)s->eng.n_vocab + 31) / 32 * sizeof(uint32_t));
	if (q->tokens && q->logits && q->mask)
		return true;
	free(q->tokens);
	free(q->logits);
	free(q->mask);
	q->tokens = NULL;
	q->logits = NULL;
	q->mask = NULL;
	return false;
}

static struct sched_seq *seq_free_slot(struct sched *s)
{
	if (sched_n_active(s) >= s->p.max_seqs)
		return NULL;
	for (uint32_t i = 0; i < s->n_slots; i++)
		if (!s->seqs[i].msg && seq_buffers(s, &s->seqs[i]))
			return &s->seqs[i];
	return NULL;
}

/* Takes q's KV and place back; its tokens and sampling state stay for sched_resume. */
static void seq_preempt(struct sched *s, struct sched_seq *q)
{
	s->eng.seq_close(s->eng.impl, q->eseq);
	q->eseq = NULL;
	q->n_fed = 0;
	if (s->drafter)
		drafter_seq_close(s->drafter, &q->dseq);
	atomic_fetch_add_explicit(&s->stats.preempted, 1, memory_order_relaxed);
}

/* A sequence parked on a full ring for preempt_ns while others wait gives back its KV
 * and its place: its tokens, sampler, grammar and text state stay, and it resumes
 * (sched_resume) once its reader has taken the parked event. Only a sequence between
 * steps in the plain state (one unfed token, no forced tokens pending) is taken, the one
 * parked longest. Returns whether one was. */
static bool sched_preempt_parked(struct sched *s, uint64_t now)
{
	struct sched_seq *best = NULL;
	bool spare_entry = false;
	for (uint32_t i = 0; i < s->n_slots; i++) {
		struct sched_seq *q = &s->seqs[i];
		spare_entry |= !q->msg;
		if (!q->msg || !q->eseq || !q->has_event || !q->blocked_since || q->finish || q->cancel ||
		    q->n_forced_pending || q->n_tokens - q->n_fed != 1 || now - q->blocked_since < s->p.preempt_ns)
			continue;
		if (!best || q->blocked_since < best->blocked_since)
			best = q;
	}
	if (!best || !spare_entry)
		return false;
	seq_preempt(s, best);
	return true;
}

/* Client c's user is below its fair share and nothing is free: the user furthest above
 * its share gives back one running sequence, between steps and in the plain state, the
 * one with the fewest tokens to recompute. It resumes (sched_resume) once a place is free
 * and no one else waits while its user is at its share. Returns whether one was taken. */
static bool sched_preempt_over_share(struct sched *s, const struct sched_client *c)
{
	uint32_t share = sched_fair_share(s);
	if (sched_uid_active(s, c->uid) >= share)
		return false;
	struct sched_seq *best = NULL;
	uint32_t best_n = share;
	bool spare_entry = false;
	for (uint32_t i = 0; i < s->n_slots; i++) {
		struct sched_seq *q = &s->seqs[i];
		spare_entry |= !q->msg;
		if (!q->msg || !q->eseq || q->has_event || q->finish || q->cancel || q->n_forced_pending ||
		    q->msg->req.embed || q->n_fed < q->prefill_end || q->n_tokens - q->n_fed != 1 ||
		    q->msg->client->uid == c->uid)
			continue;
		uint32_t n = sched_uid_active(s, q->msg->client->uid);
		if (n > best_n || (best && n == best_n && q->n_tokens < best->n_tokens)) {
			best = q;
			best_n = n;
		}
	}
	if (!best || !spare_entry)
		return false;
	seq_preempt(s, best);
	return true;
}

/* Gives preempted sequence q its KV back once its parked event is out: everything up to
 * the unfed token is prefilled again (from the prefix cache as far as it still holds it),
 * then decoding goes on as if nothing happened. Later when the KV budget is full. */
static void sched_resume(struct sched *s, struct sched_seq *q)
{
	if (sched_n_active(s) >= s->p.max_seqs)
		return;
	/* Requests wait while this user holds its share: they go first. */
	if (s->rr && sched_uid_active(s, q->msg->client->uid) >= sched_fair_share(s))
		return;
	const struct sched_request *r = &q->msg->req;
	uint32_t n_reserve = seq_reserve(s, r);
	uint32_t n_cached = 0;
	struct hearth_error e;
	int rc = s->eng.seq_open(s->eng.impl, q->tokens, q->n_tokens, n_reserve, r->prefix_share, &q->eseq,
				 &n_cached, &e);
	if (rc < 0) {
		q->eseq = NULL;
		if (rc != HEARTH_EKVFULL)
			seq_end(s, q, SCHED_FINISH_ERROR, &e);
		return;
	}
	/* The unfed token is fed again with the replay, and its logits come from that step. */
	if (n_cached >= q->n_tokens)
		n_cached = q->n_tokens - 1;
	q->n_fed = n_cached;
	q->prefill_end = q->n_tokens;
}

static int seq_embed_start(struct sched *s, struct sched_seq *q, struct sched_msg *m, uint64_t now);

/* Tries to start m in a free slot. 0 on success, HEARTH_EKVFULL when the KV budget cannot
 * hold it now, another code (the reason in *e) for a request that can never run. m is still
 * at the head of its client's queue, so it is not handed back here: the caller takes it out
 * of the queue first, as the loop may free a message from its hand-back on. */
static int seq_start(struct sched *s, struct sched_seq *q, struct sched_msg *m, uint64_t now,
		     struct hearth_error *e)
{
	if (m->req.embed)
		return seq_embed_start(s, q, m, now);
	const struct sched_request *r = &m->req;
	uint32_t n_reserve = seq_reserve(s, r);
	uint32_t n_cached = 0;
	int rc = s->eng.seq_open(s->eng.impl, r->prompt, r->n_prompt, n_reserve, r->prefix_share, &q->eseq,
				 &n_cached, e);
	if (rc < 0) {
		q->eseq = NULL;
		return rc;
	}
	/* The last prompt token is always fed, so its logits exist even when the whole
	 * prompt is a cached prefix. */
	if (n_cached >= r->n_prompt)
		n_cached = r->n_prompt - 1;
	struct sampler_params sp = r->sampling;
	sp.seed = r->seed;
	rc = sampler_new(&q->sampler, &sp, s->eng.n_vocab, e);
	if (rc < 0) {
		s->eng.seq_close(s->eng.impl, q->eseq);
		q->eseq = NULL;
		return rc;
	}
	for (uint32_t i = 0; i < r->n_prompt; i++)
		sampler_accept(q->sampler, r->prompt[i]);
	q->msg = m;
	m->client->n_running++;
	memcpy(q->tokens, r->prompt, (size_t)r->n_prompt * sizeof *q->tokens);
	q->n_tokens = r->n_prompt;
	q->n_fed = n_cached;
	q->n_held = 0;
	q->has_event = false;
	q->finish = SCHED_FINISH_NONE;
	q->cancel = false;
	q->grammar_on = r->grammar && !r->grammar_trigger[0];
	q->n_tail = 0;
	spec_seq_init(&q->spec, s->spec_rows ? r->speculate : 0);
	q->spec.source = s->drafter ? r->draft_source : SPEC_SOURCE_LOOKUP;
	q->n_forced_pending = 0;
	q->prefill_end = r->n_prompt;
	m->result.n_forced = 0;
	tok_stream_init(&q->stream);
	m->result.n_prompt = r->n_prompt;
	m->result.n_cached = n_cached;
	m->result.t_admit = now;
	atomic_fetch_add_explicit(&s->stats.prefix_lookup_tokens, r->n_prompt, memory_order_relaxed);
	atomic_fetch_add_explicit(&s->stats.prefix_hit_tokens, n_cached, memory_order_relaxed);
	return 0;
}

/* ---- embeddings: prefill-only sequences ---- */

/* Opens the engine sequence of q's current input. Mean and cls pool every position, and a
 * cached prefix has K/V but no hidden states, so they open without a prompt to match and
 * compute everything; last needs only the last position, which the engine always computes
 * (it never reports a whole prompt cached), so it shares prefixes like a generate. */
static int seq_embed_open(struct sched *s, struct sched_seq *q, struct hearth_error *e)
{
	struct sched_msg *m = q->msg;
	const struct sched_request *r = &m->req;
	uint32_t i = q->embed_input, start = i ? r->input_end[i - 1] : 0, len = r->input_end[i] - start;
	const int32_t *toks = r->prompt + start;
	bool share = r->pooling == MODEL_POOLING_LAST;
	uint32_t n_cached = 0;
	int rc = s->eng.seq_open(s->eng.impl, share ? toks : NULL, share ? len : 0, len, r->prefix_share,
				 &q->eseq, &n_cached, e);
	if (rc < 0) {
		q->eseq = NULL;
		return rc;
	}
	if (n_cached >= len)
		n_cached = len - 1;
	q->embed_tokens = toks;
	q->n_fed = n_cached;
	q->prefill_end = len;
	q->n_tokens = len;
	embed_pooler_init(&q->pooler, (enum model_pooling)r->pooling, s->eng.n_embd, q->pool_acc, NULL);
	m->result.n_cached += n_cached;
	atomic_fetch_add_explicit(&s->stats.prefix_lookup_tokens, len, memory_order_relaxed);
	atomic_fetch_add_explicit(&s->stats.prefix_hit_tokens, n_cached, memory_order_relaxed);
	return 0;
}

/* seq_start of an embed request: its first input. The scratch is made here, once, so a
 * daemon that never embeds pays nothing for it. */
static int seq_embed_start(struct sched *s, struct sched_seq *q, struct sched_msg *m, uint64_t now)
{
	size_t E = s->eng.n_embd;
	if (!s->embd_rows)
		s->embd_rows = malloc((size_t)s->p.step_tokens * E * sizeof(float));
	if (!q->pool_acc)
		q->pool_acc = malloc(E * sizeof(double));
	if (!s->embd_rows || !q->pool_acc) {
		sched_fail_msg(s, m, HEARTH_ENOMEM, "scheduler: out of memory for embeddings (%zu wide)", E);
		return HEARTH_ENOMEM;
	}
	q->msg = m;
	q->embed_input = 0;
	struct hearth_error e;
	int rc = seq_embed_open(s, q, &e);
	if (rc < 0) {
		q->msg = NULL;
		if (rc != HEARTH_EKVFULL)
			sched_finish_msg(s, m, SCHED_FINISH_ERROR, &e);
		return rc;
	}
	m->client->n_running++;
	q->has_event = false;
	q->finish = SCHED_FINISH_NONE;
	q->cancel = false;
	q->grammar_on = false;
	q->n_forced_pending = 0;
	spec_seq_init(&q->spec, 0);
	m->result.n_prompt = m->req.n_prompt;
	m->result.n_forced = 0;
	m->result.t_admit = now;
	return 0;
}

/* After a step fed the last token of q's current input: its vector goes out, its KV goes
 * back at once, and the next input opens (or waits in sched_settle for KV: the place stays
 * the request's). The last input finishes the request. */
static void seq_embed_input_done(struct sched *s, struct sched_seq *q, uint64_t now)
{
	struct sched_msg *m = q->msg;
	const struct sched_request *r = &m->req;
	struct hearth_error e;
	if (!m->result.t_first)
		m->result.t_first = now;
	embed_pooler_finish(&q->pooler, true, r->embd_out + (size_t)q->embed_input * s->eng.n_embd, NULL);
	s->eng.seq_close(s->eng.impl, q->eseq);
	q->eseq = NULL;
	if (++q->embed_input == r->n_inputs) {
		q->finish = SCHED_FINISH_STOP;
		return;
	}
	int rc = seq_embed_open(s, q, &e);
	if (rc < 0 && rc != HEARTH_EKVFULL) {
		q->finish = SCHED_FINISH_ERROR;
		q->err = e;
	}
}

/* sched_settle: an embed request between inputs, waiting for KV for the next. */
static void seq_embed_resume(struct sched *s, struct sched_seq *q)
{
	struct hearth_error e;
	if (sched_n_active(s) >= s->p.max_seqs)
		return;
	int rc = seq_embed_open(s, q, &e);
	if (rc < 0 && rc != HEARTH_EKVFULL)
		seq_end(s, q, SCHED_FINISH_ERROR, &e);
}

/* ---- incoming messages ---- */

static void sched_on_submit(struct sched *s, struct sched_msg *m, uint64_t now)
{
	const struct sched_request *r = &m->req;
	if (s->shutdown) {
		sched_fail_msg(s, m, HEARTH_ESHUTDOWN, "the daemon is shutting down");
		return;
	}
	if (r->embed) {
		/* The session checked all this with the client's words; here it guards the
		 * invariants the embed path relies on. */
		uint32_t prev = 0;
		enum model_pooling pl = (enum model_pooling)r->pooling;
		if (!s->eng.n_embd || r->n_inputs == 0 || r->input_end[r->n_inputs - 1] != r->n_prompt ||
		    (pl != MODEL_POOLING_MEAN && pl != MODEL_POOLING_CLS && pl != MODEL_POOLING_LAST)) {
			sched_fail_msg(s, m, HEARTH_EINVAL, "embed: a malformed request (%u inputs, pooling %d)",
				       r->n_inputs, r->pooling);
			return;
		}
		for (uint32_t i = 0; i < r->n_inputs; prev = r->input_end[i++]) {
			uint32_t len = r->input_end[i] - prev;
			if (r->input_end[i] <= prev || len > s->eng.max_context || len > s->eng.kv_tokens) {
				sched_fail_msg(s, m, r->input_end[i] <= prev ? HEARTH_EINVAL : HEARTH_ERANGE,
					       "embed: input %u has %u tokens; 1..%u fit (max_context, kv_budget)",
					       i, r->input_end[i] <= prev ? 0 : len,
					       s->eng.max_context < s->eng.kv_tokens ? s->eng.max_context
										      : (uint32_t)s->eng.kv_tokens);
				return;
			}
		}
		m->kv_deadline = now + s->p.kv_wait_ns;
		waiting_push(s, m->client, m);
		return;
	}
	if (r->n_prompt == 0) {
		sched_fail_msg(s, m, HEARTH_EINVAL, "the prompt is empty");
		return;
	}
	if (r->n_prompt >= s->eng.max_context) {
		sched_fail_msg(s, m, HEARTH_ERANGE,
			       "the prompt has %u tokens; max_context is %u and one more is needed to generate",
			       r->n_prompt, s->eng.max_context);
		return;
	}
	uint64_t need = (uint64_t)r->n_prompt + r->max_tokens;
	if (need > s->eng.max_context)
		need = s->eng.max_context;
	if (need > s->eng.kv_tokens) {
		sched_fail_msg(s, m, HEARTH_EKVFULL,
			       "the request needs KV for %llu tokens but the whole kv_budget holds %llu",
			       (unsigned long long)need, (unsigned long long)s->eng.kv_tokens);
		return;
	}
	m->kv_deadline = now + s->p.kv_wait_ns;
	waiting_push(s, m->client, m);
}

static bool sched_cancel_waiting(struct sched *s, struct sched_client *c, uint64_t id)
{
	struct sched_msg **pp = &c->waiting, *prev = NULL;
	for (struct sched_msg *m = c->waiting; m; prev = m, m = m->link) {
		if (m->req.id != id) {
			pp = &m->link;
			continue;
		}
		*pp = m->link;
		if (c->waiting_tail == m)
			c->waiting_tail = prev;
		s->n_waiting--;
		if (!c->waiting)
			rr_remove(s, c);
		sched_finish_msg(s, m, SCHED_FINISH_CANCELED, NULL);
		return true;
	}
	return false;
}

static void sched_on_cancel(struct sched *s, struct sched_msg *m)
{
	if (!sched_cancel_waiting(s, m->client, m->req_id)) {
		for (uint32_t i = 0; i < s->n_slots; i++) {
			struct sched_seq *q = &s->seqs[i];
			if (q->msg && q->msg->client == m->client && q->msg->req.id == m->req_id)
				q->cancel = true;
		}
	}
	sched_hand_back(s, m);
}

static void sched_on_client_gone(struct sched *s, struct sched_msg *m)
{
	struct sched_client *c = m->client;
	c->gone = true;
	struct sched_msg *w;
	while ((w = waiting_pop(s, c)))
		sched_finish_msg(s, w, SCHED_FINISH_CANCELED, NULL);
	rr_remove(s, c);
	for (uint32_t i = 0; i < s->n_slots; i++) {
		struct sched_seq *q = &s->seqs[i];
		if (q->msg && q->msg->client == c)
			seq_end(s, q, SCHED_FINISH_CANCELED, NULL);
	}
	/* Handed back last: after it the loop may free the client and unmap its ring. */
	sched_hand_back(s, m);
}

/* Ends every request still queued, of every client, with the same outcome. */
static void sched_end_waiting(struct sched *s, enum sched_finish f, const struct hearth_error *err)
{
	while (s->rr) {
		struct sched_client *c = s->rr;
		struct sched_msg *w;
		while ((w = waiting_pop(s, c)))
			sched_finish_msg(s, w, f, err);
		rr_remove(s, c);
	}
}

/* A shutdown or drain: m comes back once no sequence is left (or at once when one is
 * already under way). Returns true when m now owns the ending. */
static bool sched_begin_end(struct sched *s, struct sched_msg *m, uint64_t deadline)
{
	if (s->shutdown) {
		sched_hand_back(s, m);
		return false;
	}
	s->shutdown = m;
	s->shutdown_deadline = deadline;
	return true;
}

static void sched_drain_inbox(struct sched *s, uint64_t now)
{
	struct sched_msg *m;
	while ((m = queue_pop(&s->in))) {
		switch (m->type) {
		case SCHED_MSG_SUBMIT:
			sched_on_submit(s, m, now);
			break;
		case SCHED_MSG_CANCEL:
			sched_on_cancel(s, m);
			break;
		case SCHED_MSG_CLIENT_GONE:
			sched_on_client_gone(s, m);
			break;
		case SCHED_MSG_DRAIN:
			/* Like a shutdown without a deadline: nothing new arrives (the loop posts
			 * to the new scheduler), and what is here runs to its end. */
			sched_begin_end(s, m, UINT64_MAX);
			break;
		case SCHED_MSG_SHUTDOWN:
			/* Queued requests have not started: they are told at once. */
			if (sched_begin_end(s, m, now + m->grace_ns)) {
				struct hearth_error e;
				hearth_error_set(&e, HEARTH_ESHUTDOWN, "the daemon is shutting down");
				sched_end_waiting(s, SCHED_FINISH_ERROR, &e);
			}
			break;
		}
	}
}

/* ---- admission ---- */

static void sched_expire_waiting(struct sched *s, uint64_t now)
{
	struct sched_client *c = s->rr;
	if (!c)
		return;
	size_t n = 1;
	for (struct sched_client *p = c->rr_next; p != c; p = p->rr_next)
		n++;
	/* Per client the FIFO is in submit order and every request waits as long, so only
	 * heads can have expired. next is taken first: removing c leaves it in the ring. */
	for (size_t i = 0; i < n; i++) {
		struct sched_client *next = c->rr_next;
		while (c->waiting && c->waiting->kv_deadline <= now) {
			struct sched_msg *m = waiting_pop(s, c);
			sched_fail_msg(s, m, HEARTH_EKVFULL,
				       "the KV budget stayed full for %llu ms while this request waited",
				       (unsigned long long)(s->p.kv_wait_ns / 1000000));
		}
		if (!c->waiting)
			rr_remove(s, c);
		c = next;
	}
}

/* The client whose waiting request is admitted next: in ring order from s->rr, the first of
 * the user with the fewest sequences running, and of another user than the one admitted
 * last where two tie. Round robin over connections alone would give a user with ten
 * connections ten turns for another user's one. */
static struct sched_client *sched_pick(struct sched *s)
{
	struct sched_client *best = NULL, *c = s->rr;
	uint32_t best_n = 0;
	bool best_last = false;
	do {
		uint32_t n = sched_uid_active(s, c->uid);
		bool last = c->uid == s->last_uid;
		if (!best || n < best_n || (n == best_n && best_last && !last)) {
			best = c;
			best_n = n;
			best_last = last;
		}
		c = c->rr_next;
	} while (c != s->rr);
	return best;
}

/* No place or no KV for client c's next request: a sequence parked on a full ring gives
 * its own back first, else the user furthest above its fair share gives one back. */
static bool sched_make_room(struct sched *s, const struct sched_client *c, uint64_t now)
{
	return sched_preempt_parked(s, now) || sched_preempt_over_share(s, c);
}

static void sched_admit(struct sched *s, uint64_t now)
{
	sched_expire_waiting(s, now);
	while (s->rr) {
		struct sched_client *c = sched_pick(s);
		struct sched_seq *q = seq_free_slot(s);
		if (!q) {
			if (sched_make_room(s, c, now))
				continue;
			return;
		}
		struct sched_msg *m = c->waiting;
		struct hearth_error e;
		int rc = seq_start(s, q, m, now, &e);
		if (rc == HEARTH_EKVFULL) {
			if (sched_make_room(s, c, now))
				continue;
			return;     /* head of line waits for KV; fairness keeps its turn */
		}
		waiting_pop(s, c); /* m, out of the queue before a failure hands it back */
		/* Only a request that runs takes its user's turn: one that can never run leaves
		 * the rotation where it was, so the same client's next request goes first. */
		if (rc == 0) {
			s->rr = c->rr_next;
			s->last_uid = c->uid;
		}
		if (!c->waiting)
			rr_remove(s, c);
		if (rc < 0)
			sched_finish_msg(s, m, SCHED_FINISH_ERROR, &e);
	}
}

/* ---- token output ---- */

static bool seq_try_emit(struct sched *s, struct sched_seq *q)
{
	const struct sched_event *ev = &q->ev;
	struct sched_msg *m = q->msg;
	struct sched_token t = {
		.req_id = m->req.id,
		.token = ev->token,
		.index = ev->index,
		.text = ev->text,
		.text_len = ev->text_len,
		.logprob = ev->logprob,
		.n_top = ev->n_top,
		.top_ids = ev->top_ids,
		.top_logprobs = ev->top_logprobs,
		.logits = ev->with_logits ? q->logits : NULL,
		.n_vocab = s->eng.n_vocab,
		.to_socket = m->req.to_socket,
		.user = m->req.user,
		.t_sampled_ns = ev->t_sampled_ns,
	};
	if (!m->client->emit(m->client->sink, &t))
		return false;
	q->has_event = false;
	return true;
}

/* Log-softmax of the sampled token and the top-k, computed only when the request asked. */
static void seq_fill_logprobs(struct sched *s, struct sched_seq *q, const float *logits,
			      int32_t token)
{
	const struct sched_request *r = &q->msg->req;
	uint32_t n = s->eng.n_vocab;
	float mx = logits[0];
	for (uint32_t i = 1; i < n; i++)
		if (logits[i] > mx)
			mx = logits[i];
	double sum = 0;
	for (uint32_t i = 0; i < n; i++)
		sum += exp((double)(logits[i] - mx));
	float lse = mx + (float)log(sum);
	q->ev.logprob = logits[token] - lse;
	uint32_t k = r->top_logprobs < SCHED_MAX_TOP ? r->top_logprobs : SCHED_MAX_TOP;
	q->ev.n_top = 0;
	for (uint32_t i = 0; i < n && k; i++) {
		float v = logits[i];
		uint32_t j = q->ev.n_top;
		if (j == k && v <= logits[q->ev.top_ids[k - 1]])
			continue;
		if (j < k)
			q->ev.n_top++;
		else
			j = k - 1;
		while (j > 0 && logits[q->ev.top_ids[j - 1]] < v) {
			q->ev.top_ids[j] = q->ev.top_ids[j - 1];
			j--;
		}
		q->ev.top_ids[j] = (int32_t)i;
	}
	for (uint32_t j = 0; j < q->ev.n_top; j++)
		q->ev.top_logprobs[j] = logits[q->ev.top_ids[j]] - lse;
}

/* Moves held text plus the new piece into the event, keeping back any tail that could
 * still become a stop string; returns true when a stop string is complete (the text
 * before it is released, the stop string itself is not). */
static bool seq_release_text(struct sched_seq *q, const char *piece, size_t n_piece)
{
	const struct sched_request *r = &q->msg->req;
	char buf[SCHED_HOLD_MAX + SCHED_PIECE_MAX];
	size_t n = q->n_held;
	memcpy(buf, q->held, n);
	memcpy(buf + n, piece, n_piece);
	n += n_piece;
	q->n_held = 0;

	size_t stop_at = n;
	for (uint32_t i = 0; i < r->n_stop_strings; i++) {
		const char *ss = r->stop_strings[i];
		size_t sl = strlen(ss);
		if (!sl || sl > n)
			continue;
		for (size_t j = 0; j + sl <= n; j++)
			if (memcmp(buf + j, ss, sl) == 0 && j < stop_at) {
				stop_at = j;
				break;
			}
	}
	if (stop_at < n) {
		memcpy(q->ev.text, buf, stop_at);
		q->ev.text_len = (uint32_t)stop_at;
		return true;
	}
	/* Longest suffix that is a proper prefix of some stop string stays held. */
	size_t keep = 0;
	for (uint32_t i = 0; i < r->n_stop_strings; i++) {
		const char *ss = r->stop_strings[i];
		size_t sl = strlen(ss);
		for (size_t k = sl - 1 < n ? sl - 1 : n; k > keep; k--)
			if (memcmp(buf + n - k, ss, k) == 0) {
				keep = k;
				break;
			}
	}
	memcpy(q->ev.text, buf, n - keep);
	q->ev.text_len = (uint32_t)(n - keep);
	memcpy(q->held, buf + n - keep, keep);
	q->n_held = (uint32_t)keep;
	return false;
}

static bool seq_is_stop_token(const struct sched *s, const struct sched_seq *q, int32_t t)
{
	const struct sched_request *r = &q->msg->req;
	if (!r->ignore_eos && tok_is_eog(s->tok, t))
		return true;
	for (uint32_t i = 0; i < r->n_stop_tokens; i++)
		if (r->stop_tokens[i] == t)
			return true;
	return false;
}

/* A grammar that cannot go on (no token allowed, or an internal refusal) ends the request
 * with the reason; the client sees it as the request's error. */
static void seq_grammar_fail(struct sched_seq *q, const struct hearth_error *ge)
{
	hearth_error_set(&q->err, HEARTH_EINVAL, "grammar: %s", ge->msg);
	q->finish = SCHED_FINISH_ERROR;
	q->ev.text_len = 0;
	q->has_event = false;
}

/* A lazy grammar waits for its trigger in the output; the bytes after it are the first the
 * grammar sees. */
static void seq_grammar_watch(struct sched_seq *q, const char *piece, size_t n)
{
	const struct sched_request *r = &q->msg->req;
	size_t tl = strlen(r->grammar_trigger);
	for (size_t i = 0; i < n; i++) {
		if (q->n_tail == sizeof q->tail) {
			memmove(q->tail, q->tail + SCHED_TRIGGER_MAX, sizeof q->tail - SCHED_TRIGGER_MAX);
			q->n_tail -= SCHED_TRIGGER_MAX;
		}
		q->tail[q->n_tail++] = piece[i];
		if (q->n_tail >= tl && !memcmp(q->tail + q->n_tail - tl, r->grammar_trigger, tl)) {
			struct hearth_error ge;
			q->grammar_on = true;
			if (i + 1 < n && grammar_matcher_accept_bytes(r->grammar, piece + i + 1, n - i - 1, &ge) < 0)
				seq_grammar_fail(q, &ge);
			return;
		}
	}
}

static void seq_token_out(struct sched *s, struct sched_seq *q, int32_t t, uint32_t n_gen);
static void seq_jump(struct sched *s, struct sched_seq *q);

/* The logits of q's last fed token are in q->logits: sample, decide whether the sequence
 * ends, and build the token event. */
static void seq_sample(struct sched *s, struct sched_seq *q, uint64_t now)
{
	struct sched_msg *m = q->msg;
	const struct sched_request *r = &m->req;
	uint32_t n_gen = q->n_tokens - r->n_prompt;
	if (n_gen == 0)
		m->result.t_first = now;

	/* The sampler may rewrite logits in place (penalties, temperature); a request for
	 * logprobs or the full row sees them as the model produced them. */
	bool want_raw = r->logprobs || r->top_logprobs || r->full_logits;
	q->ev.with_logits = r->full_logits;
	q->ev.n_top = 0;
	q->ev.logprob = 0;
	/* A grammar removes what it does not allow before sampling; logprobs then describe
	 * the distribution the token was drawn from. */
	struct hearth_error ge;
	if (q->grammar_on && (grammar_matcher_fill_mask(r->grammar, q->mask, &ge) < 0 ||
			      (grammar_mask_apply(q->logits, q->mask, (int32_t)s->eng.n_vocab), false))) {
		seq_grammar_fail(q, &ge);
		return;
	}
	/* The sampler leaves the row as the model produced it, so logprobs and the full
	 * row report the model's own distribution. */
	int32_t t = sampler_sample(q->sampler, q->logits);
	q->ev.t_sampled_ns = hearth_now_ns();
	sampler_accept(q->sampler, t);
	if (q->grammar_on && grammar_matcher_accept_token(r->grammar, t, &ge) < 0) {
		seq_grammar_fail(q, &ge);
		return;
	}
	if (want_raw)
		seq_fill_logprobs(s, q, q->logits, t);

	q->tokens[q->n_tokens++] = t;
	seq_token_out(s, q, t, n_gen);
	if (!q->finish && q->grammar_on && r->jump_forward)
		seq_jump(s, q);
}

/* The event of generated token t (the n_gen-th): its text, and whether the sequence ends
 * with it. Sampled and forced tokens alike. */
static void seq_token_out(struct sched *s, struct sched_seq *q, int32_t t, uint32_t n_gen)
{
	const struct sched_request *r = &q->msg->req;
	q->ev.token = t;
	q->ev.index = n_gen;
	q->ev.text_len = 0;
	atomic_fetch_add_explicit(&s->stats.tokens_generated, 1, memory_order_relaxed);
	s->tps_window_tokens++;

	if (seq_is_stop_token(s, q, t)) {
		/* The end token is reported (the client sees why it stopped) with whatever text
		 * was held back; its own text is not part of the output. */
		memcpy(q->ev.text, q->held, q->n_held);
		q->ev.text_len = q->n_held;
		q->n_held = 0;
		q->finish = SCHED_FINISH_STOP;
		q->has_event = true;
		return;
	}
	char piece[SCHED_PIECE_MAX];
	size_t np = tok_stream_push(s->tok, &q->stream, t, r->special_text, piece, sizeof piece);
	if (np > sizeof piece)
		np = 0; /* no vocabulary has a 1 KiB token; if one did, its text is dropped */
	if (r->grammar && !q->grammar_on)
		seq_grammar_watch(q, piece, np);
	if (seq_release_text(q, piece, np)) {
		q->finish = SCHED_FINISH_STOP;
	} else if (q->grammar_on && grammar_matcher_is_done(r->grammar)) {
		q->finish = SCHED_FINISH_STOP; /* the grammar is complete: nothing may follow */
	} else if (n_gen + 1 >= r->max_tokens) {
		q->finish = SCHED_FINISH_LENGTH;
	} else if (q->n_tokens >= s->eng.max_context) {
		q->finish = SCHED_FINISH_CONTEXT;
	}
	if (q->finish == SCHED_FINISH_LENGTH || q->finish == SCHED_FINISH_CONTEXT) {
		/* Nothing more will come: release held-back text and any partial character. */
		size_t room = sizeof q->ev.text - q->ev.text_len;
		memcpy(q->ev.text + q->ev.text_len, q->held, q->n_held < room ? q->n_held : room);
		q->ev.text_len += q->n_held < room ? q->n_held : (uint32_t)room;
		q->n_held = 0;
		size_t nf = tok_stream_flush(&q->stream, q->ev.text + q->ev.text_len,
					     sizeof q->ev.text - q->ev.text_len);
		if (nf <= sizeof q->ev.text - q->ev.text_len)
			q->ev.text_len += (uint32_t)nf;
	}
	q->has_event = true;
}

/* Jump-forward: the tokens the grammar forces after the one just sampled go into tokens[]
 * now, so the next step feeds them with it in one span (grammar_jump_tokens says which
 * tokens; forced tokens count towards max_tokens like sampled ones). Their events follow
 * the sampled token's, one each, built as the ring takes them. */
static void seq_jump(struct sched *s, struct sched_seq *q)
{
	const struct sched_request *r = &q->msg->req;
	uint32_t n_gen = q->n_tokens - r->n_prompt;
	uint32_t room = r->max_tokens > n_gen ? r->max_tokens - n_gen : 0;
	if (s->eng.max_context - q->n_tokens < room)
		room = s->eng.max_context - q->n_tokens;
	size_t n = 0;
	struct hearth_error ge;
	if (room == 0 || grammar_jump_tokens(r->grammar, s->tok, &q->tokens[q->n_tokens], room, &n, &ge) < 0)
		return; /* a failed jump only means the bytes are sampled instead */
	for (size_t i = 0; i < n; i++)
		sampler_accept(q->sampler, q->tokens[q->n_tokens + i]);
	q->n_tokens += (uint32_t)n;
	q->n_forced_pending = (uint32_t)n;
}

/* Builds the event of the next forced token. One the sequence ends with (a stop string in
 * the forced text, max_tokens) drops the forced tokens after it, which no one will see. */
static void seq_forced_event(struct sched *s, struct sched_seq *q)
{
	struct sched_msg *m = q->msg;
	uint32_t at = q->n_tokens - q->n_forced_pending--;
	q->ev.with_logits = false;
	q->ev.n_top = 0;
	q->ev.logprob = 0;
	q->ev.t_sampled_ns = hearth_now_ns();
	seq_token_out(s, q, q->tokens[at], at - m->req.n_prompt);
	m->result.n_forced++;
	atomic_fetch_add_explicit(&s->stats.tokens_forced, 1, memory_order_relaxed);
	if (q->finish) {
		q->n_tokens = at + 1;
		q->n_forced_pending = 0;
	}
}

/* Sends the events of forced tokens while the ring takes them; false when one is parked
 * on a full ring. */
static bool seq_emit_forced(struct sched *s, struct sched_seq *q)
{
	while (q->n_forced_pending && !q->has_event && !q->cancel) {
		seq_forced_event(s, q);
		if (!seq_try_emit(s, q))
			return false;
	}
	return !q->has_event;
}

/* ---- speculative decoding ---- */

/* Drafts for decoding sequence q (prompt lookup, spec.c), at most max_rows tokens and what
 * its KV reservation, max_tokens and max_context leave; a draft is cut before the first
 * token its grammar would refuse, since that row could never be accepted. The draft goes
 * to q->draft and after the unfed token in q->tokens, where the step reads it. */
static uint32_t seq_draft(struct sched *s, struct sched_seq *q, uint32_t max_rows)
{
	const struct sched_request *r = &q->msg->req;
	uint32_t n_gen = q->n_tokens - r->n_prompt;
	/* One step yields up to k + 1 tokens: k + 1 <= max_tokens - n_gen keeps the KV
	 * reservation (n_prompt + max_tokens) and the request's length. */
	uint32_t limit = r->max_tokens > n_gen + 1 ? r->max_tokens - n_gen - 1 : 0;
	if (limit > max_rows)
		limit = max_rows;
	if (q->n_tokens + limit > s->eng.max_context)
		limit = s->eng.max_context - q->n_tokens;
	uint32_t k = spec_draft(&q->spec, q->tokens, q->n_tokens, limit, q->draft);
	q->draft_from_model = false;
	if (k == 0 && q->dseq.n_out && q->dseq.base == q->n_tokens) {
		k = q->dseq.n_out < limit ? q->dseq.n_out : limit;
		memcpy(q->draft, q->dseq.out, (size_t)k * sizeof *q->draft);
		q->draft_from_model = k > 0;
	}
	if (k && q->grammar_on) {
		struct hearth_error ge;
		uint32_t ok = 0;
		while (ok < k && !grammar_matcher_is_done(r->grammar) &&
		       grammar_matcher_accept_token(r->grammar, q->draft[ok], &ge) == 0)
			ok++;
		if (ok && grammar_matcher_rollback(r->grammar, ok, &ge) < 0) {
			seq_grammar_fail(q, &ge);
			return 0;
		}
		k = ok;
	}
	memcpy(q->tokens + q->n_tokens, q->draft, (size_t)k * sizeof *q->draft);
	return k;
}

/* Before a step: the draft model proposes for every decoding sequence that will want a
 * model draft (draft_source model, or auto and the lookup finds nothing), all in the same
 * batched draft steps; seq_draft then takes the proposal. Sequences with prompt chunks
 * still to come or feeding forced tokens have no draft this step, as with the lookup. A draft model whose step
 * fails is dropped: drafts change no output, so every sequence decodes on without it. */
static void sched_model_drafts(struct sched *s)
{
	if (!s->drafter)
		return;
	uint32_t n = 0, running = 0;
	for (uint32_t i = 0; i < s->n_slots; i++)
		running += s->seqs[i].msg && s->seqs[i].eseq;
	if (running >= s->n_spec_rows)
		return; /* no spare rows: no draft of any kind this step */
	for (uint32_t i = 0; i < s->n_slots && n < s->p.max_seqs; i++) {
		struct sched_seq *q = &s->seqs[i];
		/* Decoding (one unfed token), or the prompt's last chunk is next: the answer's
		 * first tokens are drafted with it, as the lookup does. */
		bool decoding = q->n_fed >= q->prefill_end && q->n_tokens - q->n_fed == 1;
		bool last_chunk = q->n_fed < q->prefill_end && q->n_tokens == q->prefill_end &&
				  q->prefill_end - q->n_fed <= s->p.prefill_chunk;
		if (!q->msg || !q->eseq || q->has_event || q->finish || q->cancel || !(decoding || last_chunk) ||
		    !q->spec.k_max || q->spec.source == SPEC_SOURCE_LOOKUP)
			continue;
		int32_t probe;
		if (q->spec.source == SPEC_SOURCE_AUTO && spec_lookup(q->tokens, q->n_tokens, &probe, 1))
			continue;
		const struct sched_request *r = &q->msg->req;
		uint32_t n_gen = q->n_tokens - r->n_prompt;
		uint32_t k = r->max_tokens > n_gen + 1 ? r->max_tokens - n_gen - 1 : 0;
		if (k > q->spec.k_model)
			k = q->spec.k_model;
		if (q->n_tokens + k > s->eng.max_context)
			k = s->eng.max_context - q->n_tokens;
		if (k == 0)
			continue;
		s->draft_jobs[n++] = (struct draft_job){ &q->dseq, q->tokens, q->n_tokens, k, seq_reserve(s, r),
							 q->grammar_on ? r->grammar : NULL };
	}
	if (n == 0)
		return;
	struct hearth_error e;
	if (drafter_propose(s->drafter, s->draft_jobs, n, &e) < 0) {
		/* Drafts change no output: without them every sequence decodes as before. */
		for (uint32_t i = 0; i < s->n_slots; i++)
			drafter_seq_close(s->drafter, &s->seqs[i].dseq);
		drafter_free(s->drafter);
		s->drafter = NULL;
		return;
	}
	atomic_fetch_add_explicit(&s->stats.draft_rounds, 1, memory_order_relaxed);
}

/* The step verified q's draft: sp->logits holds a row after the unfed token and after each
 * draft token. Each row is sampled exactly as a plain decode step samples (grammar mask,
 * penalties, top-k/top-p/min-p, temperature, the same draw from the sequence's PRNG), and
 * drafting goes on while the sample equals the draft. With a draft that is one token for
 * sure (prompt lookup), that is speculative sampling's rejection rule: draft x is kept with
 * probability p(x), and otherwise the token is a draw from p without x, renormalised, since
 * a draw from p that is not x is just that. So the output is plain decoding's, token for
 * token for every seed, not only in distribution. The rejected draft's positions go back. */
static void seq_verify(struct sched *s, struct sched_seq *q, const struct engine_span *sp, uint64_t now)
{
	uint32_t n_draft = sp->n_logits - 1, i = 0;
	size_t row = s->eng.n_vocab * sizeof(float);
	bool emitted = false;
	for (;;) {
		memcpy(q->logits, sp->logits + (size_t)i * s->eng.n_vocab, row);
		uint32_t at = q->n_tokens;
		seq_sample(s, q, now);
		/* Tokens the grammar forced after the sample (jump-forward) end the draft: the
		 * next rows were computed after draft tokens, not after them; they are fed next
		 * step. (Their events may be out before the check, so it looks at n_tokens.) */
		bool jumped = q->n_tokens > at + 1;
		if (q->has_event && !q->cancel && seq_try_emit(s, q)) {
			q->blocked_since = 0;
			emitted = true;
			seq_emit_forced(s, q);
		}
		/* The sample at row i is accepted (its K/V, as draft[i], are in the cache) only
		 * when another row follows; else it is the next unfed token. */
		if (i == n_draft || q->has_event || q->finish || q->cancel || jumped ||
		    q->tokens[at] != q->draft[i])
			break;
		i++;
	}
	if (q->draft_from_model) {
		spec_seq_update_model(&q->spec, n_draft, i);
		atomic_fetch_add_explicit(&s->stats.spec_model_drafted, n_draft, memory_order_relaxed);
		atomic_fetch_add_explicit(&s->stats.spec_model_accepted, i, memory_order_relaxed);
	} else {
		spec_seq_update(&q->spec, n_draft, i);
	}
	atomic_fetch_add_explicit(&s->stats.spec_drafted, n_draft, memory_order_relaxed);
	atomic_fetch_add_explicit(&s->stats.spec_accepted, i, memory_order_relaxed);
	/* The unfed token and the i accepted draft tokens stay. */
	q->n_fed += 1 + i;
	struct hearth_error e;
	if (i < n_draft && s->eng.seq_truncate(s->eng.impl, q->eseq, q->n_fed, &e) < 0) {
		q->finish = SCHED_FINISH_ERROR;
		q->err = e;
	}
	if (emitted)
		sched_yield(); /* as sched_step does after an emit */
}

/* Emits parked events and ends sequences whose last event is out or that were canceled. */
static void sched_settle(struct sched *s, uint64_t now)
{
	for (uint32_t i = 0; i < s->n_slots; i++) {
		struct sched_seq *q = &s->seqs[i];
		if (!q->msg)
			continue;
		if (q->cancel) {
			seq_end(s, q, SCHED_FINISH_CANCELED, NULL);
			continue;
		}
		if (q->has_event) {
			if (!seq_try_emit(s, q)) {
				if (!q->blocked_since)
					q->blocked_since = now;
				else if (now - q->blocked_since > s->p.stall_ns) {
					struct hearth_error e;
					hearth_error_set(&e, HEARTH_ETIMEDOUT,
							 "the client did not read its ring for %llu ms",
							 (unsigned long long)(s->p.stall_ns / 1000000));
					seq_end(s, q, SCHED_FINISH_ERROR, &e);
				}
				continue;
			}
			q->blocked_since = 0;
		}
		if (!seq_emit_forced(s, q)) {
			if (!q->blocked_since)
				q->blocked_since = now;
			continue;
		}
		if (q->finish != SCHED_FINISH_NONE)
			seq_end(s, q, q->finish, &q->err);
		else if (!q->eseq && q->msg->req.embed)
			seq_embed_resume(s, q);
		else if (!q->eseq)
			sched_resume(s, q);
	}
	if (s->shutdown && now >= s->shutdown_deadline) {
		for (uint32_t i = 0; i < s->n_slots; i++) {
			struct sched_seq *q = &s->seqs[i];
			if (!q->msg)
				continue;
			struct hearth_error e;
			hearth_error_set(&e, HEARTH_ESHUTDOWN,
					 "the daemon is shutting down and the grace period ended");
			seq_end(s, q, SCHED_FINISH_ERROR, &e);
		}
	}
}

/* ---- one step ---- */

static size_t sched_build_batch(struct sched *s)
{
	size_t n = 0;
	uint32_t budget = s->p.step_tokens;
	s->step_no++;
	uint32_t embd_row = 0;          /* rows of s->embd_rows taken by this step's spans */
	/* Decode tokens first: they are one each and keep every stream moving. A sequence
	 * with forced tokens (jump-forward) feeds them too, as far as the budget goes after
	 * one token for every other decoding sequence; the rest waits for the next step. Rows
	 * of logits beyond one per sequence go to drafts (speculative decoding), whoever asks
	 * first, and so do the tokens beyond one for each decoding sequence. */
	uint32_t running = 0, n_decoding = 0, spare_rows = 0, spec_row = 0;
	for (uint32_t i = 0; i < s->n_slots; i++) {
		struct sched_seq *q = &s->seqs[i];
		running += q->msg && q->eseq;
		n_decoding += q->msg && q->eseq && !q->has_event && !q->finish && !q->cancel &&
			      q->n_fed >= q->prefill_end;
	}
	if (s->spec_rows && s->n_spec_rows > running)
		spare_rows = s->n_spec_rows - running;
	for (uint32_t i = 0; i < s->n_slots; i++) {
		struct sched_seq *q = &s->seqs[i];
		if (!q->msg || !q->eseq || q->has_event || q->finish || q->cancel)
			continue;
		if (q->n_fed < q->prefill_end)
			continue;
		uint32_t want = q->n_tokens - q->n_fed, room = budget > n_decoding ? budget - n_decoding + 1 : 1;
		uint32_t take = want < room ? want : room;
		n_decoding--;
		/* Forced tokens are certain already: a draft waits until they are fed. */
		uint32_t k = 0;
		if (want == 1 && q->spec.k_max && spare_rows && room > 1)
			k = seq_draft(s, q, spare_rows < room - 1 ? spare_rows : room - 1);
		if (q->finish)
			continue; /* the grammar failed while the draft was checked */
		if (k > 0) {
			take = 1 + k;
			s->spans[n] = (struct engine_span){ q->eseq, &q->tokens[q->n_fed], take,
							    s->spec_rows + (size_t)spec_row * s->eng.n_vocab,
							    take, NULL };
			spec_row += take;
			spare_rows -= k;
		} else {
			s->spans[n] = (struct engine_span){ q->eseq, &q->tokens[q->n_fed], take,
							    take == want ? q->logits : NULL, 0, NULL };
		}
		s->span_seq[n++] = q;
		budget = budget > take ? budget - take : 0;
	}
	/* Prefill chunks, starting from a rotating slot; first pass one chunk per client so a
	 * client with many prompts cannot starve one with a single prompt. */
	for (int pass = 0; pass < 2 && budget > 0; pass++) {
		for (uint32_t k = 0; k < s->n_slots && budget > 0; k++) {
			struct sched_seq *q = &s->seqs[(s->prefill_cursor + k) % s->n_slots];
			if (!q->msg || !q->eseq || q->finish || q->cancel)
				continue;
			uint32_t n_prompt = q->prefill_end;
			if (q->n_fed >= n_prompt)
				continue;
			bool seen = false;
			for (size_t j = 0; j < n; j++)
				if (s->span_seq[j] == q ||
				    (pass == 0 && s->span_seq[j]->msg->client == q->msg->client &&
				     s->span_seq[j]->n_fed < s->span_seq[j]->prefill_end))
					seen = true;
			if (seen)
				continue;
			uint32_t chunk = n_prompt - q->n_fed;
			if (chunk > s->p.prefill_chunk)
				chunk = s->p.prefill_chunk;
			if (chunk > budget)
				chunk = budget;
			bool last = q->n_fed + chunk == n_prompt;
			/* The prompt's last chunk may carry a draft too: the first tokens of
			 * an answer that quotes its prompt come from the lookup. */
			uint32_t nd = 0;
			if (last && q->spec.k_max && spare_rows && budget > chunk) {
				uint32_t room = budget - chunk;
				nd = seq_draft(s, q, spare_rows < room ? spare_rows : room);
				if (q->finish)
					continue;
			}
			if (nd > 0) {
				s->spans[n] = (struct engine_span){ q->eseq, &q->tokens[q->n_fed], chunk + nd,
								    s->spec_rows + (size_t)spec_row * s->eng.n_vocab,
								    1 + nd, NULL };
				spec_row += 1 + nd;
				spare_rows -= nd;
			} else if (q->msg->req.embed) {
				s->spans[n] = (struct engine_span){ q->eseq, q->embed_tokens + q->n_fed, chunk,
								    NULL, 0,
								    s->embd_rows + (size_t)embd_row * s->eng.n_embd };
				embd_row += chunk;
			} else {
				s->spans[n] = (struct engine_span){ q->eseq, &q->tokens[q->n_fed], chunk,
								    last ? q->logits : NULL, 0, NULL };
			}
			s->span_seq[n++] = q;
			budget -= chunk + nd;
		}
	}
	s->prefill_cursor = (s->prefill_cursor + 1) % s->n_slots;
	return n;
}

static void sched_step(struct sched *s, size_t n_spans)
{
	struct hearth_error e;
	uint64_t t0 = hearth_now_ns();
	int rc = s->eng.forward(s->eng.impl, s->spans, n_spans, &e);
	uint64_t t1 = hearth_now_ns();
	atomic_fetch_add_explicit(&s->stats.busy_ns, t1 - t0, memory_order_relaxed);
	for (size_t i = 0; i < n_spans; i++) {
		struct sched_seq *q = s->span_seq[i];
		if (rc < 0) {
			seq_end(s, q, SCHED_FINISH_ERROR, &e);
			continue;
		}
		bool prefill = q->n_fed < q->prefill_end;
		/* A draft's tokens are not the prompt's, and stay unfed until verified. */
		uint32_t n_draft = s->spans[i].n_logits > 1 ? s->spans[i].n_logits - 1 : 0;
		q->n_fed += s->spans[i].n - n_draft;
		if (prefill)
			atomic_fetch_add_explicit(&s->stats.tokens_prefilled, s->spans[i].n - n_draft,
						  memory_order_relaxed);
		if (s->spans[i].embd) {
			embed_pooler_add(&q->pooler, s->spans[i].embd, s->spans[i].n);
			if (q->n_fed == q->prefill_end)
				seq_embed_input_done(s, q, t1);
		} else if (n_draft) {
			q->n_fed--; /* the token before the draft: fed, its sample still to come */
			seq_verify(s, q, &s->spans[i], t1);
		} else if (s->spans[i].logits) {
			seq_sample(s, q, t1);
			/* Out at once, not after every other sequence of the batch was sampled:
			 * greedy sampling of a 152k vocabulary takes ~0.2 ms, which a client at
			 * the end of a 16-sequence batch would otherwise wait 15 times over.
			 * A full ring leaves the event parked for sched_settle. */
			if (q->has_event && !q->cancel && seq_try_emit(s, q)) {
				q->blocked_since = 0;
				seq_emit_forced(s, q);
				/* The doorbell just woke the client, often onto this CPU, where
				 * the compute threads would hold it off for the rest of their time
				 * slice, milliseconds of token-to-callback latency: give it the CPU
				 * now (doc/benchmarks.md, Serving). */
				sched_yield();
			}
		}
	}
	atomic_fetch_add_explicit(&s->stats.steps, 1, memory_order_release);
}

static void sched_update_stats(struct sched *s, uint64_t now)
{
	uint32_t running = 0, parked = 0;
	for (uint32_t i = 0; i < s->n_slots; i++) {
		running += s->seqs[i].msg != NULL;
		parked += s->seqs[i].msg && s->seqs[i].has_event;
	}
	atomic_store_explicit(&s->stats.running, running, memory_order_relaxed);
	atomic_store_explicit(&s->stats.parked, parked, memory_order_relaxed);
	atomic_store_explicit(&s->stats.waiting, s->n_waiting, memory_order_relaxed);
	uint64_t used = 0, total = 0;
	if (s->eng.kv_usage)
		s->eng.kv_usage(s->eng.impl, &used, &total);
	atomic_store_explicit(&s->stats.kv_used, used, memory_order_relaxed);
	atomic_store_explicit(&s->stats.kv_total, total, memory_order_relaxed);
	used = total = 0;
	if (s->drafter)
		drafter_kv_usage(s->drafter, &used, &total);
	atomic_store_explicit(&s->stats.draft_kv_used, used, memory_order_relaxed);
	atomic_store_explicit(&s->stats.draft_kv_total, total, memory_order_relaxed);
	if (now - s->tps_window_start >= 1000000000ull) {
		uint64_t dt = now - s->tps_window_start;
		uint64_t tps100 = s->tps_window_tokens * 100ull * 1000000000ull / dt;
		atomic_store_explicit(&s->stats.decode_tps_x100, (uint32_t)tps100,
				      memory_order_relaxed);
		s->tps_window_start = now;
		s->tps_window_tokens = 0;
	}
}

static bool sched_has_work(const struct sched *s)
{
	for (uint32_t i = 0; i < s->n_slots; i++)
		if (s->seqs[i].msg)
			return true;
	return s->n_waiting > 0;
}

static void sched_wait(struct sched *s, int timeout_ms)
{
	struct pollfd pfd = { .fd = s->doorbell, .events = POLLIN };
	if (poll(&pfd, 1, timeout_ms) > 0) {
		uint64_t v;
		ssize_t r = read(s->doorbell, &v, sizeof v);
		(void)r;
	}
}

static void *sched_main(void *arg)
{
	struct sched *s = arg;
	if (s->eng.thread_init)
		s->eng.thread_init(s->eng.impl);
	s->tps_window_start = hearth_now_ns();
	while (!atomic_load_explicit(&s->quit, memory_order_acquire)) {
		uint64_t now = hearth_now_ns();
		sched_drain_inbox(s, now);
		sched_settle(s, now);
		sched_admit(s, now);
		sched_model_drafts(s);
		size_t n = sched_build_batch(s);
		if (n > 0)
			sched_step(s, n);
		now = hearth_now_ns();
		sched_settle(s, now);
		sched_update_stats(s, now);
		if (s->shutdown && !sched_has_work(s)) {
			struct sched_msg *m = s->shutdown;
			s->shutdown = NULL;
			sched_hand_back(s, m);
		}
		if (n == 0) {
			/* Idle, or every sequence is parked on a full ring or waiting for KV:
			 * sleep until a message arrives, polling now and then for ring room. */
			int timeout = sched_has_work(s) || s->shutdown ? 2 : -1;
			sched_wait(s, timeout);
		}
	}
	return NULL;
}

/* ---- setup and the loop thread's side ---- */

static void sched_free(struct sched *s)
{
	if (!s)
		return;
	if (s->seqs) {
		for (uint32_t i = 0; i < s->n_slots; i++) {
			free(s->seqs[i].tokens);
			free(s->seqs[i].logits);
			free(s->seqs[i].mask);
			free(s->seqs[i].pool_acc);
		}
	}
	free(s->seqs);
	free(s->spans);
	free(s->span_seq);
	free(s->spec_rows);
	free(s->embd_rows);
	drafter_free(s->drafter);
	free(s->draft_jobs);
	queue_destroy(&s->in);
	queue_destroy(&s->out);
	if (s->doorbell >= 0)
		close(s->doorbell);
	free(s);
}

int sched_start(struct sched **out, const struct sched_params *p, const struct engine *eng,
		const struct tok *tok, void (*notify)(void *), void *notify_ctx,
		struct hearth_error *err)
{
	*out = NULL;
	if (!p->max_seqs || !p->step_tokens || !p->prefill_chunk || p->step_tokens < p->max_seqs)
		return hearth_error_set(err, HEARTH_EINVAL,
					"scheduler: max_seqs (%u) and prefill_chunk (%u) must be > 0 and step_tokens (%u) >= max_seqs",
					p->max_seqs, p->prefill_chunk, p->step_tokens);
	struct sched *s = calloc(1, sizeof *s);
	if (!s)
		return hearth_error_set(err, HEARTH_ENOMEM, "scheduler: out of memory");
	s->doorbell = -1;
	s->p = *p;
	s->eng = *eng;
	s->tok = tok;
	s->notify = notify;
	s->notify_ctx = notify_ctx;
	int rc;
	if ((rc = queue_init(&s->in, p->queue_cap, err)) < 0 ||
	    (rc = queue_init(&s->out, p->queue_cap, err)) < 0)
		goto fail;
	s->n_slots = 2 * p->max_seqs;
	s->seqs = calloc(s->n_slots, sizeof *s->seqs);
	s->spans = calloc(p->max_seqs, sizeof *s->spans);
	s->span_seq = calloc(p->max_seqs, sizeof *s->span_seq);
	if (!s->seqs || !s->spans || !s->span_seq)
		goto oom;
	/* Rows for verifying drafts, only when the engine can take rejected ones back: one
	 * per sequence, and room for two full drafts beyond (the engine may allow fewer). */
	if (eng->seq_truncate && eng->max_logit_rows > 0) {
		s->n_spec_rows = p->max_seqs + 2 * SPEC_K_MAX;
		if (s->n_spec_rows > eng->max_logit_rows)
			s->n_spec_rows = eng->max_logit_rows;
		s->spec_rows = malloc((size_t)s->n_spec_rows * eng->n_vocab * sizeof(float));
		if (!s->spec_rows)
			goto oom;
	}
	if (p->draft && s->spec_rows) {
		if (p->draft->n_vocab != eng->n_vocab || !p->draft->seq_truncate) {
			rc = hearth_error_set(err, HEARTH_EINVAL,
					      "scheduler: the draft model's %u logits are not the model's %u, or it cannot take positions back",
					      p->draft->n_vocab, eng->n_vocab);
			goto fail;
		}
		if ((rc = drafter_new(&s->drafter, p->draft, p->max_seqs, p->step_tokens, err)) < 0)
			goto fail;
		s->draft_jobs = calloc(p->max_seqs, sizeof *s->draft_jobs);
		if (!s->draft_jobs)
			goto oom;
	}
	for (uint32_t i = 0; i < p->max_seqs; i++)
		if (!seq_buffers(s, &s->seqs[i]))
			goto oom;
	s->doorbell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->doorbell < 0) {
		rc = hearth_error_errno(err, HEARTH_EIO, errno, "scheduler: eventfd");
		goto fail;
	}
	/* The counters a client may ask for as soon as the model is announced (kv_total and
	 * the draft's among them), not only after the compute thread's first turn. */
	sched_update_stats(s, hearth_now_ns());
	if ((rc = pthread_create(&s->thread, NULL, sched_main, s)) != 0) {
		rc = hearth_error_errno(err, HEARTH_EIO, rc, "scheduler: cannot start the compute thread");
		goto fail;
	}
	s->thread_started = true;
	*out = s;
	return 0;
oom:
	rc = hearth_error_set(err, HEARTH_ENOMEM, "scheduler: out of memory for %u sequences",
			      p->max_seqs);
fail:
	sched_free(s);
	return rc;
}

bool sched_post(struct sched *s, struct sched_msg *m)
{
	if (s->in_flight >= s->p.queue_cap || !queue_push(&s->in, m))
		return false;
	s->in_flight++;
	uint64_t one = 1;
	ssize_t r = write(s->doorbell, &one, sizeof one);
	(void)r;
	return true;
}

struct sched_msg *sched_msg_new(enum sched_msg_type type, struct sched_client *client, void *user)
{
	struct sched_msg *m = calloc(1, sizeof *m);
	if (m) {
		m->type = type;
		m->client = client;
		m->user = user;
	}
	return m;
}

int sched_msg_send(struct sched *s, struct sched_msg *m)
{
	if (!m)
		return HEARTH_ENOMEM;
	if (!s || !sched_post(s, m)) {
		free(m);
		return HEARTH_EBUSY;
	}
	return 0;
}

struct sched_msg *sched_take(struct sched *s)
{
	struct sched_msg *m = queue_pop(&s->out);
	if (m) {
		/* Every message handed back was posted: more back than out is a double hand-back. */
		hearth_assert(s->in_flight > 0);
		s->in_flight--;
	}
	return m;
}

const struct sched_stats *sched_stats(const struct sched *s)
{
	return &s->stats;
}

void sched_stop(struct sched *s)
{
	if (!s || !s->thread_started)
		return;
	{
		atomic_store_explicit(&s->quit, true, memory_order_release);
		uint64_t one = 1;
		ssize_t r = write(s->doorbell, &one, sizeof one);
		(void)r;
		pthread_join(s->thread, NULL);
	}
	/* The compute thread is gone: this thread may now act for it. Whatever is still
	 * inside goes back as canceled, so the caller's sched_take sees every message once. */
	sched_drain_inbox(s, hearth_now_ns());
	for (uint32_t i = 0; i < s->n_slots; i++)
		if (s->seqs[i].msg)
			seq_end(s, &s->seqs[i], SCHED_FINISH_CANCELED, NULL);
	sched_end_waiting(s, SCHED_FINISH_CANCELED, NULL);
	if (s->shutdown) {
		sched_hand_back(s, s->shutdown);
		s->shutdown = NULL;
	}
	s->notify = NULL;
	s->thread_started = false;
}

void sched_destroy(struct sched *s)
{
	sched_free(s);
}
