/* The continuous-batching scheduler on the real reference engine and a fixture model:
 * batched generations must equal each request run alone (computed independently with
 * model_forward and argmax), and cancel, KV exhaustion, a full ring, a vanished client,
 * stop strings and client fairness must behave as sched.h promises. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/prompt.h"
#include "tests/support/ref_fixture.h"
#include "tests/support/sched_doorbell.h"
#include "daemon/engine/embed.h"
#include "daemon/engine/ref/engine_ref.h"
#include "daemon/engine/gguf.h"
#include "daemon/engine/model.h"
#include "daemon/engine/ref/forward.h"
#include "daemon/serve/sched.h"
#include "daemon/engine/tokenizer.h"

#define MAX_GEN 256

struct fixture {
	struct gguf_file *f;
	struct model *m;
	struct tok *tok;
	uint32_t n_vocab;
};

/* What the emit callback saw for one client, per request id (ids are small). */
struct sink {
	_Atomic int refuse;             /* > 0: the ring is "full" */
	int32_t tokens[16][MAX_GEN];
	uint32_t n[16];
	char text[16][1024];
	size_t text_len[16];
	_Atomic uint32_t emitted;
};

static int g_efd = -1;

static bool sink_emit(void *p, const struct sched_token *t)
{
	struct sink *s = p;
	if (atomic_load(&s->refuse) > 0)
		return false;
	uint64_t id = t->req_id;
	if (id < 16 && s->n[id] < MAX_GEN)
		s->tokens[id][s->n[id]++] = t->token;
	if (id < 16 && s->text_len[id] + t->text_len < sizeof s->text[id]) {
		memcpy(s->text[id] + s->text_len[id], t->text, t->text_len);
		s->text_len[id] += t->text_len;
	}
	atomic_fetch_add(&s->emitted, 1);
	return true;
}

static int setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof *fx);
	if (ref_fixture_open("fx-qwen3.gguf", &fx->f, &fx->m, &fx->tok) < 0)
		return -1;
	fx->n_vocab = fx->m->hp.n_vocab;
	g_efd = eventfd(0, EFD_CLOEXEC);
	*state = fx;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *fx = *state;
	ref_fixture_close(fx->f, fx->m, fx->tok);
	close(g_efd);
	free(fx);
	return 0;
}

struct harness {
	struct engine eng;
	struct engine_ref *er;
	struct sched *s;
};

static void harness_start(struct harness *h, const struct fixture *fx, uint64_t kv_tokens,
			  const struct sched_params *p)
{
	struct hearth_error e;
	uint64_t budget = kv_tokens * engine_ref_kv_bytes_per_token(fx->m);
	assert_int_equal(engine_ref_new(&h->er, fx->m, 256, budget, &h->eng, &e), 0);
	struct sched_params dp;
	if (!p) {
		sched_params_default(&dp);
		p = &dp;
	}
	assert_int_equal(sched_start(&h->s, p, &h->eng, fx->tok, sched_doorbell_ring, &g_efd, &e), 0);
}

static void harness_stop(struct harness *h)
{
	sched_stop(h->s);
	struct sched_msg *m;
	while ((m = sched_take(h->s))) {
		free(m->req.prompt);
		free(m);
	}
	sched_destroy(h->s);
	engine_ref_free(h->er);
}

/* Waits for the next message handed back (10 s at most). */
static struct sched_msg *take(struct harness *h)
{
	return sched_doorbell_take(h->s, g_efd, 10);
}

static struct sched_msg *submit_msg(struct sched_client *c, uint64_t id, const int32_t *prompt,
				    uint32_t n, uint32_t max_tokens, float temp, uint64_t seed)
{
	struct sched_msg *m = calloc(1, sizeof *m);
	m->type = SCHED_MSG_SUBMIT;
	m->client = c;
	m->req.id = id;
	m->req.prompt = malloc(n * sizeof(int32_t));
	memcpy(m->req.prompt, prompt, n * sizeof(int32_t));
	m->req.n_prompt = n;
	m->req.max_tokens = max_tokens;
	sampler_params_default(&m->req.sampling);
	m->req.sampling.temperature = temp;
	m->req.seed = seed;
	m->req.ignore_eos = true;
	return m;
}

static struct sched_msg *submit(struct harness *h, struct sched_client *c, uint64_t id,
				const int32_t *prompt, uint32_t n, uint32_t max_tokens, float temp,
				uint64_t seed)
{
	struct sched_msg *m = submit_msg(c, id, prompt, n, max_tokens, temp, seed);
	assert_true(sched_post(h->s, m));
	return m;
}

static void test_sched_batched_greedy_equals_each_request_alone(void **state)
{
	struct fixture *fx = *state;
	struct harness h;
	struct sched_params p;
	sched_params_default(&p);
	p.step_tokens = 24;             /* small steps: prompts are split into chunks */
	p.prefill_chunk = 7;
	harness_start(&h, fx, 4096, &p);
	struct sink sink = { 0 };
	struct sched_client c = { .sink = &sink, .emit = sink_emit };
	enum { N = 6 };
	int32_t prompts[N][48];
	uint32_t lens[N] = { 3, 17, 40, 1, 9, 26 };
	for (int i = 0; i < N; i++) {
		test_prompt((uint32_t)i, prompts[i], lens[i], fx->n_vocab);
		submit(&h, &c, (uint64_t)i, prompts[i], lens[i], 12, 0.0f, 1);
	}
	for (int i = 0; i < N; i++) {
		struct sched_msg *m = take(&h);
		assert_int_equal(m->result.finish, SCHED_FINISH_LENGTH);
		assert_int_equal(m->result.n_generated, 12);
		free(m->req.prompt);
		free(m);
	}
	for (int i = 0; i < N; i++) {
		int32_t want[MAX_GEN];
		uint32_t n = ref_solo_greedy(fx->m, prompts[i], lens[i], 12, want);
		assert_int_equal(sink.n[i], n);
		assert_memory_equal(sink.tokens[i], want, n * sizeof(int32_t));
	}
	harness_stop(&h);
}

static void test_sched_seeded_sampling_is_independent_of_batching(void **state)
{
	struct fixture *fx = *state;
	int32_t prompts[4][20];
	for (int i = 0; i < 4; i++)
		test_prompt(100u + (uint32_t)i, prompts[i], 20, fx->n_vocab);
	struct sink alone = { 0 }, together = { 0 };
	struct harness h;
	harness_start(&h, fx, 4096, NULL);
	struct sched_client ca = { .sink = &alone, .emit = sink_emit };
	for (int i = 0; i < 4; i++) {
		submit(&h, &ca, (uint64_t)i, prompts[i], 20, 10, 0.9f, 1000u + (uint64_t)i);
		struct sched_msg *m = take(&h);
		free(m->req.prompt);
		free(m);
	}
	struct sched_client ct = { .sink = &together, .emit = sink_emit };
	for (int i = 0; i < 4; i++)
		submit(&h, &ct, (uint64_t)i, prompts[i], 20, 10, 0.9f, 1000u + (uint64_t)i);
	for (int i = 0; i < 4; i++) {
		struct sched_msg *m = take(&h);
		free(m->req.prompt);
		free(m);
	}
	for (int i = 0; i < 4; i++) {
		assert_int_equal(alone.n[i], 10);
		assert_memory_equal(alone.tokens[i], together.tokens[i], 10 * sizeof(int32_t));
	}
	harness_stop(&h);
}

static void test_sched_cancel_ends_a_running_request(void **state)
{
	struct fixture *fx = *state;
	struct harness h;
	harness_start(&h, fx, 4096, NULL);
	struct sink sink = { 0 };
	struct sched_client c = { .sink = &sink, .emit = sink_emit };
	int32_t prompt[8];
	test_prompt(7, prompt, 8, fx->n_vocab);
	submit(&h, &c, 1, prompt, 8, 200, 0.0f, 1);
	while (atomic_load(&sink.emitted) < 3)
		usleep(1000);
	struct sched_msg *cm = calloc(1, sizeof *cm);
	cm->type = SCHED_MSG_CANCEL;
	cm->client = &c;
	cm->req_id = 1;
	assert_true(sched_post(h.s, cm));
	bool saw_cancel_ack = false, saw_done = false;
	for (int i = 0; i < 2; i++) {
		struct sched_msg *m = take(&h);
		if (m->type == SCHED_MSG_CANCEL) {
			saw_cancel_ack = true;
		} else {
			assert_int_equal(m->result.finish, SCHED_FINISH_CANCELED);
			assert_true(m->result.n_generated < 200);
			saw_done = true;
			free(m->req.prompt);
		}
		free(m);
	}
	assert_true(saw_cancel_ack && saw_done);
	uint64_t used, total;
	h.eng.kv_usage(h.eng.impl, &used, &total);
	assert_int_equal(used, 0);
	harness_stop(&h);
}

/* The KV counters are published before sched_start returns: a stats request that comes
 * right after the model is announced reads the pool's size, not 0 (a race before). */
static void test_sched_publishes_kv_totals_at_start(void **state)
{
	struct fixture *fx = *state;
	for (int round = 0; round < 20; round++) {
		struct harness h;
		harness_start(&h, fx, 64, NULL);
		uint64_t used, total;
		h.eng.kv_usage(h.eng.impl, &used, &total);
		assert_true(total > 0);
		assert_int_equal(atomic_load(&sched_stats(h.s)->kv_total), total);
		assert_int_equal(atomic_load(&sched_stats(h.s)->kv_used), 0);
		harness_stop(&h);
	}
}

static void test_sched_reports_kv_full_and_queues_within_budget(void **state)
{
	struct fixture *fx = *state;
	struct harness h;
	struct sched_params p;
	sched_params_default(&p);
	p.kv_wait_ns = 200ull * 1000000ull;
	harness_start(&h, fx, 64, &p);  /* the whole budget: 64 tokens */
	struct sink sink = { 0 };
	struct sched_client c = { .sink = &sink, .emit = sink_emit };
	int32_t prompt[40];
	test_prompt(3, prompt, 40, fx->n_vocab);

	/* Needs 40 + 40 = 80 > 64: refused at once, naming both numbers. */
	submit(&h, &c, 1, prompt, 40, 40, 0.0f, 1);
	struct sched_msg *m = take(&h);
	assert_int_equal(m->result.finish, SCHED_FINISH_ERROR);
	assert_int_equal(m->result.err.code, HEARTH_EKVFULL);
	assert_non_null(strstr(m->result.err.msg, "80"));
	assert_non_null(strstr(m->result.err.msg, "64"));
	free(m->req.prompt);
	free(m);

	/* Two that need 40 each: the second waits for the first, then runs. */
	submit(&h, &c, 2, prompt, 30, 10, 0.0f, 1);
	submit(&h, &c, 3, prompt, 30, 10, 0.0f, 1);
	for (int i = 0; i < 2; i++) {
		m = take(&h);
		assert_int_equal(m->result.finish, SCHED_FINISH_LENGTH);
		free(m->req.prompt);
		free(m);
	}
	assert_int_equal(sink.n[2], 10);
	assert_int_equal(sink.n[3], 10);
	assert_memory_equal(sink.tokens[2], sink.tokens[3], 10 * sizeof(int32_t));
	harness_stop(&h);
}

static void test_sched_full_ring_stalls_only_its_own_sequence(void **state)
{
	struct fixture *fx = *state;
	struct harness h;
	harness_start(&h, fx, 4096, NULL);
	struct sink slow = { 0 }, fast = { 0 };
	atomic_store(&slow.refuse, 1);
	struct sched_client cs = { .sink = &slow, .emit = sink_emit };
	struct sched_client cf = { .sink = &fast, .emit = sink_emit };
	int32_t prompt[10];
	test_prompt(11, prompt, 10, fx->n_vocab);
	submit(&h, &cs, 1, prompt, 10, 8, 0.0f, 1);
	submit(&h, &cf, 2, prompt, 10, 8, 0.0f, 1);
	struct sched_msg *m = take(&h);
	assert_ptr_equal(m->client, &cf);       /* the fast client finishes while slow is stuck */
	assert_int_equal(m->result.finish, SCHED_FINISH_LENGTH);
	free(m->req.prompt);
	free(m);
	assert_int_equal(slow.n[1], 0);
	atomic_store(&slow.refuse, 0);
	m = take(&h);
	assert_ptr_equal(m->client, &cs);
	assert_int_equal(m->result.finish, SCHED_FINISH_LENGTH);
	free(m->req.prompt);
	free(m);
	assert_int_equal(slow.n[1], 8);
	assert_memory_equal(slow.tokens[1], fast.tokens[2], 8 * sizeof(int32_t));
	harness_stop(&h);
}

static void test_sched_client_gone_returns_its_kv_at_once(void **state)
{
	struct fixture *fx = *state;
	struct harness h;
	harness_start(&h, fx, 4096, NULL);
	struct sink sink = { 0 };
	atomic_store(&sink.refuse, 1);         /* stuck mid-stream, holding KV */
	struct sched_client c = { .sink = &sink, .emit = sink_emit };
	int32_t prompt[30];
	test_prompt(5, prompt, 30, fx->n_vocab);
	submit(&h, &c, 1, prompt, 30, 100, 0.0f, 1);
	submit(&h, &c, 2, prompt, 30, 100, 0.0f, 1);
	uint64_t used = 0, total;
	for (int i = 0; i < 500 && used == 0; i++) {
		usleep(2000);
		h.eng.kv_usage(h.eng.impl, &used, &total);
	}
	assert_true(used > 0);
	struct sched_msg *g = calloc(1, sizeof *g);
	g->type = SCHED_MSG_CLIENT_GONE;
	g->client = &c;
	assert_true(sched_post(h.s, g));
	int n_req = 0;
	for (;;) {
		struct sched_msg *m = take(&h);
		if (m->type == SCHED_MSG_CLIENT_GONE) {
			free(m);
			break;
		}
		assert_int_equal(m->result.finish, SCHED_FINISH_CANCELED);
		n_req++;
		free(m->req.prompt);
		free(m);
	}
	assert_int_equal(n_req, 2);            /* every request came back before the gone ack */
	h.eng.kv_usage(h.eng.impl, &used, &total);
	assert_int_equal(used, 0);
	harness_stop(&h);
}

/* An embed request of inputs back to back (the session's layout). */
static struct sched_msg *embed_msg(struct sched_client *c, uint64_t id, int32_t *const inputs[], const uint32_t *lens,
				   uint32_t n_in, enum model_pooling pooling, uint32_t n_embd)
{
	struct sched_msg *m = calloc(1, sizeof *m);
	uint32_t total = 0;
	for (uint32_t i = 0; i < n_in; i++)
		total += lens[i];
	m->type = SCHED_MSG_SUBMIT;
	m->client = c;
	m->req.id = id;
	m->req.embed = true;
	m->req.pooling = pooling;
	m->req.n_inputs = n_in;
	m->req.prompt = malloc(total * sizeof(int32_t));
	m->req.input_end = malloc(n_in * sizeof(uint32_t));
	m->req.embd_out = malloc((size_t)n_in * n_embd * sizeof(float));
	for (uint32_t i = 0, at = 0; i < n_in; at += lens[i++]) {
		memcpy(m->req.prompt + at, inputs[i], lens[i] * sizeof(int32_t));
		m->req.input_end[i] = at + lens[i];
	}
	m->req.n_prompt = total;
	return m;
}

/* The truth for one input: the model alone over it, every final hidden state, pooled. */
static void solo_embed(const struct model *m, const int32_t *toks, uint32_t n, enum model_pooling pooling, float *out)
{
	struct model_ctx *c;
	struct hearth_error e;
	float *rows = malloc((size_t)n * m->hp.n_embd * sizeof(float));
	assert_int_equal(model_ctx_new(&c, m, n, &e), 0);
	assert_int_equal(model_forward(m, c, toks, n, MODEL_EMBD_ALL, rows, &e), 0);
	assert_int_equal(embed_pool(rows, n, m->hp.n_embd, pooling, true, out, &e), 0);
	model_ctx_free(c);
	free(rows);
}

/* Embed requests are prefill-only sequences in the same steps as a generate: with small
 * steps their inputs are split into chunks beside the generate's decode tokens, and every
 * vector equals its input pooled alone, the generate equals its solo greedy run, and no KV
 * is left behind. */
static void test_sched_embeds_beside_a_generate_equal_each_alone(void **state)
{
	struct fixture *fx = *state;
	struct harness h;
	struct sched_params p;
	sched_params_default(&p);
	p.step_tokens = 24;
	p.prefill_chunk = 7;
	harness_start(&h, fx, 4096, &p);
	struct sink sink = { 0 };
	struct sched_client c = { .sink = &sink, .emit = sink_emit };
	uint32_t E = fx->m->hp.n_embd;
	int32_t gen[17], in0[40], in1[1], in2[23];
	int32_t *inputs[3] = { in0, in1, in2 };
	uint32_t lens[3] = { 40, 1, 23 };
	test_prompt(1, gen, 17, fx->n_vocab);
	for (uint32_t i = 0; i < 3; i++)
		test_prompt(10 + i, inputs[i], lens[i], fx->n_vocab);
	submit(&h, &c, 1, gen, 17, 12, 0.0f, 1);
	const enum model_pooling kinds[3] = { MODEL_POOLING_MEAN, MODEL_POOLING_CLS, MODEL_POOLING_LAST };
	for (uint32_t k = 0; k < 3; k++)
		assert_true(sched_post(h.s, embed_msg(&c, 2 + k, inputs, lens, 3, kinds[k], E)));
	float *want = malloc(E * sizeof(float));
	for (int r = 0; r < 4; r++) {
		struct sched_msg *m = take(&h);
		if (m->req.embed) {
			assert_int_equal(m->result.finish, SCHED_FINISH_STOP);
			assert_int_equal(m->result.n_prompt, 64);
			assert_int_equal(m->result.n_generated, 0);
			for (uint32_t i = 0; i < 3; i++) {
				solo_embed(fx->m, inputs[i], lens[i], (enum model_pooling)m->req.pooling, want);
				for (uint32_t e = 0; e < E; e++)
					assert_float_equal(m->req.embd_out[(size_t)i * E + e], want[e], 1e-6);
			}
			free(m->req.input_end);
			free(m->req.embd_out);
		} else {
			assert_int_equal(m->result.finish, SCHED_FINISH_LENGTH);
		}
		free(m->req.prompt);
		free(m);
	}
	int32_t greedy[MAX_GEN];
	uint32_t n = ref_solo_greedy(fx->m, gen, 17, 12, greedy);
	assert_int_equal(sink.n[1], n);
	assert_memory_equal(sink.tokens[1], greedy, n * sizeof(int32_t));
	uint64_t used, total;
	h.eng.kv_usage(h.eng.impl, &used, &total);
	assert_int_equal(used, 0);
	free(want);
	harness_stop(&h);
}

/* A cancel ends an embed between its chunks (its KV given back at once), and an embed of a
 * client that goes away comes back canceled before the gone message. */
static void test_sched_cancel_and_client_gone_end_an_embed(void **state)
{
	struct fixture *fx = *state;
	struct harness h;
	struct sched_params p;
	sched_params_default(&p);
	p.max_seqs = 2;
	p.step_tokens = 8;              /* many steps per input: the cancel lands mid-way */
	p.prefill_chunk = 4;
	harness_start(&h, fx, 4096, &p);
	struct sched_client c = { .sink = NULL, .emit = sink_emit };
	uint32_t E = fx->m->hp.n_embd;
	enum { N_IN = 8, LEN = 200 };
	static int32_t toks[N_IN][LEN];
	int32_t *inputs[N_IN];
	uint32_t lens[N_IN];
	for (int i = 0; i < N_IN; i++) {
		test_prompt(20 + (uint32_t)i, toks[i], LEN, fx->n_vocab);
		inputs[i] = toks[i];
		lens[i] = LEN;
	}
	assert_true(sched_post(h.s, embed_msg(&c, 1, inputs, lens, N_IN, MODEL_POOLING_MEAN, E)));
	uint64_t used = 0, total;
	for (int i = 0; i < 500 && used == 0; i++) {
		usleep(2000);
		h.eng.kv_usage(h.eng.impl, &used, &total);
	}
	assert_true(used > 0);
	struct sched_msg *cm = calloc(1, sizeof *cm);
	cm->type = SCHED_MSG_CANCEL;
	cm->client = &c;
	cm->req_id = 1;
	assert_true(sched_post(h.s, cm));
	assert_true(sched_post(h.s, embed_msg(&c, 2, inputs, lens, N_IN, MODEL_POOLING_CLS, E)));
	struct sched_msg *g = calloc(1, sizeof *g);
	g->type = SCHED_MSG_CLIENT_GONE;
	g->client = &c;
	assert_true(sched_post(h.s, g));
	int canceled = 0;
	for (;;) {
		struct sched_msg *m = take(&h);
		if (m->type == SCHED_MSG_CLIENT_GONE) {
			free(m);
			break;
		}
		if (m->type == SCHED_MSG_SUBMIT) {
			assert_int_equal(m->result.finish, SCHED_FINISH_CANCELED);
			canceled++;
			free(m->req.prompt);
			free(m->req.input_end);
			free(m->req.embd_out);
		}
		free(m);
	}
	assert_int_equal(canceled, 2);
	h.eng.kv_usage(h.eng.impl, &used, &total);
	assert_int_equal(used, 0);
	harness_stop(&h);
}

/* What the scheduler refuses of an embed request itself (the session words it for clients
 * first): an input beyond max_context, a pooling with no single vector. */
static void test_sched_refuses_an_embed_it_cannot_run(void **state)
{
	struct fixture *fx = *state;
	struct harness h;
	harness_start(&h, fx, 4096, NULL);
	struct sched_client c = { .sink = NULL, .emit = sink_emit };
	uint32_t E = fx->m->hp.n_embd;
	int32_t big[300], one[1] = { 5 };
	test_prompt(3, big, 300, fx->n_vocab);
	int32_t *inputs[2] = { one, big };
	uint32_t lens[2] = { 1, 300 };
	assert_true(sched_post(h.s, embed_msg(&c, 1, inputs, lens, 2, MODEL_POOLING_MEAN, E)));
	assert_true(sched_post(h.s, embed_msg(&c, 2, inputs, lens, 1, MODEL_POOLING_NONE, E)));
	for (int r = 0; r < 2; r++) {
		struct sched_msg *m = take(&h);
		assert_int_equal(m->result.finish, SCHED_FINISH_ERROR);
		assert_non_null(strstr(m->result.err.msg, m->req.id == 1 ? "input 1 has 300 tokens" : "pooling"));
		free(m->req.prompt);
		free(m->req.input_end);
		free(m->req.embd_out);
		free(m);
	}
	harness_stop(&h);
}

static void test_sched_stop_string_ends_and_is_withheld(void **state)
{
	struct fixture *fx = *state;
	int32_t prompt[12], want[MAX_GEN];
	char piece[256], before[1024];
	size_t pl = 0, bl = 0;
	/* Find a prompt whose 5th generated token has text that does not occur earlier in the
	 * output: its text is then an unambiguous stop string. */
	bool found = false;
	for (uint32_t seed = 21; seed < 121 && !found; seed++) {
		test_prompt(seed, prompt, 12, fx->n_vocab);
		ref_solo_greedy(fx->m, prompt, 12, 20, want);
		pl = tok_piece(fx->tok, want[4], false, piece, sizeof piece);
		bl = 0;
		for (int i = 0; i < 4; i++)
			bl += tok_piece(fx->tok, want[i], false, before + bl, sizeof before - bl);
		found = pl > 0 && pl <= SCHED_MAX_STOP_LEN && !memmem(before, bl, piece, pl);
	}
	assert_true(found);
	struct harness h;
	harness_start(&h, fx, 4096, NULL);
	struct sink sink = { 0 };
	struct sched_client c = { .sink = &sink, .emit = sink_emit };
	struct sched_msg *sm = calloc(1, sizeof *sm);
	sm->type = SCHED_MSG_SUBMIT;
	sm->client = &c;
	sm->req.id = 1;
	sm->req.prompt = malloc(sizeof prompt);
	memcpy(sm->req.prompt, prompt, sizeof prompt);
	sm->req.n_prompt = 12;
	sm->req.max_tokens = 20;
	sampler_params_default(&sm->req.sampling);
	sm->req.sampling.temperature = 0;
	sm->req.ignore_eos = true;
	memcpy(sm->req.stop_strings[0], piece, pl < SCHED_MAX_STOP_LEN ? pl : SCHED_MAX_STOP_LEN);
	sm->req.n_stop_strings = 1;
	assert_true(sched_post(h.s, sm));
	struct sched_msg *m = take(&h);
	assert_int_equal(m->result.finish, SCHED_FINISH_STOP);
	assert_int_equal(m->result.n_generated, 5);
	/* The text released is exactly what came before the stop string. */
	assert_int_equal(sink.text_len[1], bl);
	assert_memory_equal(sink.text[1], before, bl);
	free(m->req.prompt);
	free(m);
	harness_stop(&h);
}

/* Runs one request of each of first[0..2] (16 tokens each) and then one of second, one
 * at a time (max_seqs 1, so admission order is completion order), and says where
 * second's came. Built first and posted back to back, each of the first three long
 * enough that the scheduler cannot finish two of them between two posts: a test thread
 * preempted between building and posting would let the third in before second exists. */
static int admission_place(const struct fixture *fx, struct sched_client *const first[3],
			   struct sched_client *second)
{
	struct harness h;
	struct sched_params p;
	sched_params_default(&p);
	p.max_seqs = 1;
	harness_start(&h, fx, 4096, &p);
	int32_t prompt[4];
	test_prompt(1, prompt, 4, fx->n_vocab);
	struct sched_msg *ms[4];
	for (uint64_t i = 0; i < 3; i++)
		ms[i] = submit_msg(first[i], i, prompt, 4, 16, 0.0f, 1);
	ms[3] = submit_msg(second, 9, prompt, 4, 2, 0.0f, 1);
	for (int i = 0; i < 4; i++)
		assert_true(sched_post(h.s, ms[i]));
	int place = -1;
	for (int i = 0; i < 4; i++) {
		struct sched_msg *m = take(&h);
		if (m->client == second)
			place = i;
		free(m->req.prompt);
		free(m);
	}
	harness_stop(&h);
	return place;
}

static void test_sched_admits_clients_round_robin(void **state)
{
	struct sink sa = { 0 }, sb = { 0 };
	struct sched_client a = { .sink = &sa, .emit = sink_emit };
	struct sched_client b = { .sink = &sb, .emit = sink_emit };
	struct sched_client *const first[3] = { &a, &a, &a };
	/* A's first request may already run when B arrives; B must not wait behind all of A. */
	int place = admission_place(*state, first, &b);
	assert_true(place == 1 || place == 2);
}

/* Admission is fair between users, not connections: one user's three connections with
 * a request each do not all go before another user's one request. */
static void test_sched_admits_users_round_robin(void **state)
{
	struct sink sa[3] = { 0 }, sb = { 0 };
	struct sched_client a[3], b = { .sink = &sb, .emit = sink_emit, .uid = 2000 };
	for (int i = 0; i < 3; i++)
		a[i] = (struct sched_client){ .sink = &sa[i], .emit = sink_emit, .uid = 1000 };
	struct sched_client *const first[3] = { &a[0], &a[1], &a[2] };
	/* User 1000's first request may already run when user 2000's arrives. */
	assert_true(admission_place(*state, first, &b) <= 1);
}

/* A request that fails at admission (its sampler refuses a NaN temperature) takes no turn:
 * the rotation stays where it was, so the user's next request goes first, as it would have
 * without the failed one. One place, held by user 3000 while the rest queue: client A (user
 * 1000) with the failing request then a good one, client B (user 2000) with a good one, A
 * first in the ring. Were the failure to count as A's admission (B's user then not the one
 * admitted last, and the ring moved on to B), B would run before A's good request. */
static void test_sched_failed_admission_does_not_move_the_rotation(void **state)
{
	struct fixture *fx = *state;
	struct harness h;
	struct sched_params p;
	sched_params_default(&p);
	p.max_seqs = 1;
	harness_start(&h, fx, 4096, &p);
	struct sink sa = { 0 }, sb = { 0 }, sc = { 0 };
	struct sched_client a = { .sink = &sa, .emit = sink_emit, .uid = 1000 };
	struct sched_client b = { .sink = &sb, .emit = sink_emit, .uid = 2000 };
	struct sched_client c = { .sink = &sc, .emit = sink_emit, .uid = 3000 };
	int32_t prompt[4];
	test_prompt(7, prompt, 4, fx->n_vocab);
	submit(&h, &c, 0, prompt, 4, 200, 0.0f, 1);
	for (int i = 0; i < 1000 && atomic_load(&sched_stats(h.s)->running) < 1; i++)
		usleep(1000);
	assert_int_equal(atomic_load(&sched_stats(h.s)->running), 1);
	/* Built first, posted back to back while user 3000's 200 tokens hold the place. */
	struct sched_msg *ms[3] = { submit_msg(&a, 1, prompt, 4, 2, 0.0f, 1),
				    submit_msg(&a, 2, prompt, 4, 2, 0.0f, 1),
				    submit_msg(&b, 3, prompt, 4, 2, 0.0f, 1) };
	ms[0]->req.sampling.temperature = NAN;
	for (int i = 0; i < 3; i++)
		assert_true(sched_post(h.s, ms[i]));
	int place[4] = { -1, -1, -1, -1 }; /* by request id: when it was handed back */
	for (int i = 0; i < 4; i++) {
		struct sched_msg *m = take(&h);
		assert_true(m->req.id < 4 && place[m->req.id] < 0);
		place[m->req.id] = i;
		assert_int_equal(m->result.finish, m->req.id == 1 ? SCHED_FINISH_ERROR : SCHED_FINISH_LENGTH);
		free(m->req.prompt);
		free(m);
	}
	/* user 3000's first; A's good request before B's */
	assert_int_equal(place[0], 0);
	assert_true(place[2] < place[3]);
	harness_stop(&h);
}

/* A user's running sequences beyond its fair share give way to another user's request:
 * with two places both running user 1000's long requests, user 2000's short one arrives
 * and finishes first (before: after one of them), and user 1000's two then finish with
 * the tokens each gives alone, the one preempted recomputed from its tokens. */
static void test_sched_running_sequences_give_way_to_another_users_share(void **state)
{
	struct fixture *fx = *state;
	struct harness h;
	struct sched_params p;
	sched_params_default(&p);
	p.max_seqs = 2;
	harness_start(&h, fx, 4096, &p);
	struct sink sa = { 0 }, sb = { 0 };
	struct sched_client a = { .sink = &sa, .emit = sink_emit, .uid = 1000 };
	struct sched_client b = { .sink = &sb, .emit = sink_emit, .uid = 2000 };
	enum { LONG = 240 };
	int32_t prompt[4];
	test_prompt(4, prompt, 4, fx->n_vocab);
	submit(&h, &a, 0, prompt, 4, LONG, 0.0f, 1);
	submit(&h, &a, 1, prompt, 4, LONG, 0.0f, 1);
	for (int i = 0; i < 1000 && atomic_load(&sched_stats(h.s)->running) < 2; i++)
		usleep(1000);
	assert_int_equal(atomic_load(&sched_stats(h.s)->running), 2);
	submit(&h, &b, 2, prompt, 4, 2, 0.0f, 1);
	struct sched_client *first = NULL;
	for (int i = 0; i < 3; i++) {
		struct sched_msg *m = take(&h);
		assert_int_equal(m->result.finish, SCHED_FINISH_LENGTH);
		if (!first)
			first = m->client;
		free(m->req.prompt);
		free(m);
	}
	assert_ptr_equal(first, &b);
	assert_true(atomic_load(&sched_stats(h.s)->preempted) >= 1);
	int32_t want[MAX_GEN];
	assert_int_equal(ref_solo_greedy(fx->m, prompt, 4, LONG, want), LONG);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(sa.n[i], LONG);
		assert_memory_equal(sa.tokens[i], want, LONG * sizeof(int32_t));
	}
	harness_stop(&h);
}

/* The doorbell of the test below: it rings, and once armed it holds the compute thread in
 * the hand-back that rings it until the test has taken that message and scribbled over it,
 * as a loop thread that freed the message and reused the memory would have. */
struct held_doorbell {
	int efd;
	_Atomic bool armed;
	sem_t reused;
};

static void held_doorbell_ring(void *ctx)
{
	struct held_doorbell *d = ctx;
	sched_doorbell_ring(&d->efd);
	if (atomic_exchange(&d->armed, false)) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 10;
		while (sem_timedwait(&d->reused, &ts) < 0 && errno == EINTR)
			;
	}
}

/* A waiting request that cannot start (its sampler is refused) is out of its client's queue
 * before it is handed back: the loop owns a message from the hand-back on and may free it,
 * so the scheduler must not unlink it afterwards. The request behind it then runs. */
static void test_sched_request_that_cannot_start_leaves_the_queue_before_it_is_handed_back(void **state)
{
	struct fixture *fx = *state;
	struct harness h;
	struct hearth_error e;
	struct held_doorbell d = { .efd = g_efd };
	struct sched_params p;
	assert_int_equal(sem_init(&d.reused, 0, 0), 0);
	atomic_store(&d.armed, true);
	sched_params_default(&p);
	assert_int_equal(engine_ref_new(&h.er, fx->m, 256, 4096 * engine_ref_kv_bytes_per_token(fx->m),
					&h.eng, &e), 0);
	assert_int_equal(sched_start(&h.s, &p, &h.eng, fx->tok, held_doorbell_ring, &d, &e), 0);
	struct sink sink = { 0 };
	struct sched_client c = { .sink = &sink, .emit = sink_emit };
	int32_t prompt[12];
	test_prompt(31, prompt, 12, fx->n_vocab);
	struct sched_msg *bad = submit_msg(&c, 1, prompt, 12, 8, 0.0f, 1);
	bad->req.sampling.temperature = NAN;
	assert_true(sched_post(h.s, bad));
	submit(&h, &c, 2, prompt, 12, 8, 0.0f, 1);

	struct sched_msg *m = take(&h);
	assert_ptr_equal(m, bad);
	assert_int_equal(m->result.finish, SCHED_FINISH_ERROR);
	assert_int_equal(m->result.err.code, HEARTH_EINVAL);
	int32_t *bad_prompt = m->req.prompt;
	memset(m, 0xA5, sizeof *m); /* the loop's now; the scheduler must not read it again */
	sem_post(&d.reused);

	m = take(&h);
	assert_int_equal(m->req.id, 2);
	assert_int_equal(m->result.finish, SCHED_FINISH_LENGTH);
	free(m->req.prompt);
	free(m);
	int32_t want[MAX_GEN];
	assert_int_equal(ref_solo_greedy(fx->m, prompt, 12, 8, want), 8);
	assert_int_equal(sink.n[2], 8);
	assert_memory_equal(sink.tokens[2], want, 8 * sizeof(int32_t));
	harness_stop(&h);
	free(bad_prompt);
	free(bad);
	sem_destroy(&d.reused);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sched_batched_greedy_equals_each_request_alone),
		cmocka_unit_test(test_sched_seeded_sampling_is_independent_of_batching),
		cmocka_unit_test(test_sched_cancel_ends_a_running_request),
		cmocka_unit_test(test_sched_publishes_kv_totals_at_start),
		cmocka_unit_test(test_sched_reports_kv_full_and_queues_within_budget),
		cmocka_unit_test(test_sched_full_ring_stalls_only_its_own_sequence),
		cmocka_unit_test(test_sched_client_gone_returns_its_kv_at_once),
		cmocka_unit_test(test_sched_stop_string_ends_and_is_withheld),
		cmocka_unit_test(test_sched_embeds_beside_a_generate_equal_each_alone),
		cmocka_unit_test(test_sched_refuses_an_embed_it_cannot_run),
		cmocka_unit_test(test_sched_cancel_and_client_gone_end_an_embed),
		cmocka_unit_test(test_sched_admits_clients_round_robin),
		cmocka_unit_test(test_sched_admits_users_round_robin),
		cmocka_unit_test(test_sched_running_sequences_give_way_to_another_users_share),
		cmocka_unit_test(test_sched_failed_admission_does_not_move_the_rotation),
		cmocka_unit_test(test_sched_request_that_cannot_start_leaves_the_queue_before_it_is_handed_back),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
