/* Speculative decoding (prompt lookup and a draft model, verified in the scheduler): the
 * lookup's drafts, the draft model's proposals (grammar-masked, its KV in step with the
 * sequence), and the promise that drafts change speed only. Generations with drafts must
 * equal plain decoding token for token (greedy against the model run alone; seeded
 * sampling against the scheduler without drafts), sampled outputs must follow the model's
 * exact distribution (chi-square), grammars must cut drafts, and the int4 engine must take
 * a rejected draft's K/V back without ever publishing it to the prefix cache. Logprobs and
 * top_logprobs of a token accepted from a draft must be those plain decoding reports. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "tests/support/prompt.h"
#include "tests/support/ref_fixture.h"
#include "tests/support/sched_doorbell.h"
#include "daemon/engine/gguf.h"
#include "daemon/engine/grammar.h"
#include "daemon/engine/load.h"
#include "daemon/engine/model.h"
#include "daemon/engine/ref/engine_ref.h"
#include "daemon/engine/ref/forward.h"
#include "daemon/engine/tokenizer.h"
#include "daemon/serve/draft.h"
#include "daemon/serve/sched.h"
#include "daemon/serve/spec.h"

#define MAX_GEN 48
#define MAX_REQ 64

/* ---- the lookup ---- */

static void test_spec_lookup_takes_the_longest_latest_ngram(void **state)
{
	(void)state;
	int32_t d[8];
	/* "1 2 3" occurs at 0 (then 9) and at 5 (then 7); the 4-gram "0 1 2 3" only at 4. */
	const int32_t t[] = { 1, 2, 3, 9, 0, 1, 2, 3, 7, 5, 0, 1, 2, 3 };
	assert_int_equal(spec_lookup(t, 14, d, 3), 3);
	assert_int_equal(d[0], 7);
	assert_int_equal(d[1], 5);
	assert_int_equal(d[2], 0);
	/* No n-gram of 2 or more recurs: no draft (a 1-gram is not enough). */
	const int32_t u[] = { 4, 5, 6, 7, 4 };
	assert_int_equal(spec_lookup(u, 5, d, 4), 0);
	/* Too short to hold an n-gram and what followed it. */
	assert_int_equal(spec_lookup(t, 2, d, 4), 0);
	assert_int_equal(spec_lookup(t, 14, d, 0), 0);
}

static void test_spec_lookup_extends_a_repeating_span_past_its_period(void **state)
{
	(void)state;
	int32_t d[8];
	/* Period 3: the latest "a b" is 3 back and only 1 token followed it in the text; the
	 * draft goes on copying itself. */
	const int32_t t[] = { 8, 1, 2, 3, 1, 2, 3, 1, 2 };
	assert_int_equal(spec_lookup(t, 9, d, 7), 7);
	const int32_t want[] = { 3, 1, 2, 3, 1, 2, 3 };
	assert_memory_equal(d, want, sizeof want);
}

static void test_spec_draft_length_adapts_to_acceptance(void **state)
{
	(void)state;
	struct spec_seq s;
	spec_seq_init(&s, 0);
	int32_t t[] = { 1, 2, 1, 2, 1, 2 }, d[SPEC_K_MAX];
	assert_int_equal(spec_draft(&s, t, 6, 8, d), 0);   /* off */
	spec_seq_init(&s, 100);
	assert_int_equal(s.k_max, SPEC_K_MAX);
	uint32_t k = spec_draft(&s, t, 6, SPEC_K_MAX, d);
	assert_true(k > 0 && k < SPEC_K_MAX);
	spec_seq_update(&s, k, k);                          /* all accepted: longer */
	assert_true(spec_draft(&s, t, 6, SPEC_K_MAX, d) > k);
	spec_seq_update(&s, 6, 0);                          /* none: one token */
	assert_int_equal(spec_draft(&s, t, 6, SPEC_K_MAX, d), 1);
	spec_seq_update(&s, 1, 1);
	assert_int_equal(spec_draft(&s, t, 6, 2, d), 2);    /* the caller's limit holds */
	assert_int_equal(s.drafted, k + 7);
	assert_int_equal(s.accepted, k + 1);
}

/* ---- the scheduler on the reference engine ---- */

struct fixture {
	struct gguf_file *f;
	struct model *m;
	struct tok *tok;
	/* Another model with the same vocabulary (GPT-2 BPE): a draft that is not the model. */
	struct gguf_file *f2;
	struct model *m2;
	struct tok *tok2;
	struct grammar_vocab *gv;
	uint32_t n_vocab;
};

#define SINK_TOP 4

struct sink {
	int32_t tokens[MAX_REQ][MAX_GEN];
	uint32_t n[MAX_REQ];
	/* What a request for logprobs got with each token (zero when it did not ask). */
	float logprob[MAX_REQ][MAX_GEN];
	uint32_t n_top[MAX_REQ][MAX_GEN];
	int32_t top_ids[MAX_REQ][MAX_GEN][SINK_TOP];
	float top_logprobs[MAX_REQ][MAX_GEN][SINK_TOP];
};

static int g_efd = -1;

static bool sink_emit(void *p, const struct sched_token *t)
{
	struct sink *s = p;
	if (t->req_id >= MAX_REQ || s->n[t->req_id] >= MAX_GEN)
		return true;
	uint64_t r = t->req_id;
	uint32_t k = s->n[r]++;
	s->tokens[r][k] = t->token;
	s->logprob[r][k] = t->logprob;
	s->n_top[r][k] = t->n_top < SINK_TOP ? t->n_top : SINK_TOP;
	for (uint32_t i = 0; i < s->n_top[r][k]; i++) {
		s->top_ids[r][k][i] = t->top_ids[i];
		s->top_logprobs[r][k][i] = t->top_logprobs[i];
	}
	return true;
}

static int setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof *fx);
	if (ref_fixture_open("fx-qwen3.gguf", &fx->f, &fx->m, &fx->tok) < 0 ||
	    ref_fixture_open("fx-qwen2.gguf", &fx->f2, &fx->m2, &fx->tok2) < 0)
		return -1;
	struct hearth_error e;
	if (grammar_vocab_new(&fx->gv, fx->tok, &e) < 0) {
		fprintf(stderr, "grammar vocabulary: %s\n", e.msg);
		return -1;
	}
	fx->n_vocab = fx->m->hp.n_vocab;
	g_efd = eventfd(0, EFD_CLOEXEC);
	*state = fx;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *fx = *state;
	grammar_vocab_free(fx->gv);
	ref_fixture_close(fx->f, fx->m, fx->tok);
	ref_fixture_close(fx->f2, fx->m2, fx->tok2);
	close(g_efd);
	free(fx);
	return 0;
}

/* One batch of requests through a scheduler over eng, all submitted at once (they share
 * steps), each waited for; returns the scheduler's draft counters. */
struct job {
	const int32_t *prompt;
	uint32_t n_prompt, max_tokens, speculate;
	struct sampler_params sampling;
	uint32_t step_tokens;           /* the engine's, when below the scheduler's default */
	uint64_t seed;
	struct grammar_matcher *grammar;
	bool jump_forward;
	bool logprobs;
	uint32_t top_logprobs;
	enum spec_source draft_source;
};

/* Tokens the last run_jobs fed by jump-forward. */
static uint64_t g_forced;
/* The draft model the next run_jobs gives its scheduler (NULL: lookup only), and what the
 * last one counted of the draft model's drafts. */
static const struct engine *g_draft;
static uint64_t g_model_drafted, g_model_accepted;

static struct sched_msg *take(struct sched *s)
{
	return sched_doorbell_take(s, g_efd, 60);
}

/* Submits job j as request id of client c. */
static void post_job(struct sched *s, struct sched_client *c, uint64_t id, const struct job *j)
{
	struct sched_msg *m = calloc(1, sizeof *m);
	m->type = SCHED_MSG_SUBMIT;
	m->client = c;
	m->req.id = id;
	m->req.prompt = malloc(j->n_prompt * sizeof(int32_t));
	memcpy(m->req.prompt, j->prompt, j->n_prompt * sizeof(int32_t));
	m->req.n_prompt = j->n_prompt;
	m->req.max_tokens = j->max_tokens;
	m->req.sampling = j->sampling;
	m->req.seed = j->seed;
	m->req.ignore_eos = true;
	m->req.speculate = j->speculate;
	m->req.grammar = j->grammar;
	m->req.jump_forward = j->jump_forward;
	m->req.logprobs = j->logprobs;
	m->req.top_logprobs = j->top_logprobs;
	m->req.draft_source = j->draft_source;
	assert_true(sched_post(s, m));
}

static void run_jobs(const struct engine *eng, const struct tok *tok, const struct job *jobs, size_t n,
		     struct sink *sink, uint64_t *drafted, uint64_t *accepted)
{
	struct hearth_error e;
	struct sched_params p;
	sched_params_default(&p);
	if (n && jobs[0].step_tokens)
		p.step_tokens = jobs[0].step_tokens;
	p.draft = g_draft;
	struct sched *s;
	assert_int_equal(sched_start(&s, &p, eng, tok, sched_doorbell_ring, &g_efd, &e), 0);
	struct sched_client c = { .sink = sink, .emit = sink_emit };
	memset(sink, 0, sizeof *sink);
	for (size_t done = 0, next = 0; done < n;) {
		/* At most max_seqs in flight, so a request never waits long in the queue. */
		while (next < n && next - done < p.max_seqs) {
			post_job(s, &c, next, &jobs[next]);
			next++;
		}
		struct sched_msg *m = take(s);
		if (m->result.finish != SCHED_FINISH_LENGTH && m->result.finish != SCHED_FINISH_STOP)
			fail_msg("request %llu finished %d: %s", (unsigned long long)m->req.id,
				 (int)m->result.finish, m->result.err.msg);
		free(m->req.prompt);
		free(m);
		done++;
	}
	*drafted = atomic_load(&sched_stats(s)->spec_drafted);
	*accepted = atomic_load(&sched_stats(s)->spec_accepted);
	g_forced = atomic_load(&sched_stats(s)->tokens_forced);
	g_model_drafted = atomic_load(&sched_stats(s)->spec_model_drafted);
	g_model_accepted = atomic_load(&sched_stats(s)->spec_model_accepted);
	sched_stop(s);
	sched_destroy(s);
}

static struct engine_ref *ref_engine_of(const struct model *m, struct engine *eng)
{
	struct engine_ref *er;
	struct hearth_error e;
	assert_int_equal(engine_ref_new(&er, m, 256, 1u << 26, eng, &e), 0);
	return er;
}

static struct engine_ref *ref_engine(const struct fixture *fx, struct engine *eng)
{
	return ref_engine_of(fx->m, eng);
}

/* A prompt that repeats a span, as text to summarise or extract from does: lookups find
 * matches in it. */
static void repeating_prompt(uint32_t seed, int32_t *p, uint32_t n, uint32_t period, uint32_t n_vocab)
{
	test_prompt(seed, p, period, n_vocab);
	for (uint32_t i = period; i < n; i++)
		p[i] = p[i - period];
}

static void greedy_params(struct sampler_params *sp)
{
	sampler_params_default(sp);
	sp->temperature = 0;
}

static void test_spec_greedy_equals_the_model_alone_in_one_batch(void **state)
{
	struct fixture *fx = *state;
	struct engine eng;
	struct engine_ref *er = ref_engine(fx, &eng);
	enum { N = 6, GEN = 40 };
	int32_t prompts[N][40];
	uint32_t lens[N] = { 30, 12, 40, 21, 9, 33 };
	struct job jobs[N];
	for (int i = 0; i < N; i++) {
		repeating_prompt(50u + (uint32_t)i, prompts[i], lens[i], 3u + (uint32_t)i, fx->n_vocab);
		jobs[i] = (struct job){ prompts[i], lens[i], GEN, 8, .seed = 1 };
		greedy_params(&jobs[i].sampling);
	}
	static struct sink sink;
	uint64_t drafted, accepted;
	run_jobs(&eng, fx->tok, jobs, N, &sink, &drafted, &accepted);
	for (int i = 0; i < N; i++) {
		int32_t want[GEN];
		ref_solo_greedy(fx->m, prompts[i], lens[i], GEN, want);
		assert_int_equal(sink.n[i], GEN);
		assert_memory_equal(sink.tokens[i], want, GEN * sizeof(int32_t));
	}
	/* Random weights, yet greedy output falls into loops the lookup predicts: both
	 * verdicts were exercised. */
	fprintf(stderr, "greedy: %llu drafted, %llu accepted\n", (unsigned long long)drafted,
		(unsigned long long)accepted);
	assert_true(accepted > 0);
	assert_true(accepted < drafted);
	engine_ref_free(er);
}

static void sampled_params(struct sampler_params *sp)
{
	sampler_params_default(sp);
	sp->temperature = 0.2f;
	sp->top_k = 40;
	sp->top_p = 0.95f;
	sp->min_p = 0.05f;
	sp->repeat_penalty = 1.1f;
	sp->repeat_last_n = 16;
}

/* Runs jobs with their drafts (g_draft as set), then with speculate 0 and no draft model,
 * and holds every request's n_gen tokens to be the same; the counters (the draft* out
 * parameters, g_model_*) are the first run's. */
static void check_drafts_change_no_token(const struct engine *eng, const struct tok *tok, struct job *jobs,
					 size_t n, uint32_t n_gen, uint64_t *drafted, uint64_t *accepted)
{
	static struct sink with, without;
	uint64_t d0, a0;
	run_jobs(eng, tok, jobs, n, &with, drafted, accepted);
	uint64_t md = g_model_drafted, ma = g_model_accepted;
	const struct engine *draft = g_draft;
	g_draft = NULL;
	for (size_t i = 0; i < n; i++)
		jobs[i].speculate = 0;
	run_jobs(eng, tok, jobs, n, &without, &d0, &a0);
	g_draft = draft;
	g_model_drafted = md;
	g_model_accepted = ma;
	assert_int_equal(d0, 0);
	for (size_t i = 0; i < n; i++) {
		assert_int_equal(with.n[i], n_gen);
		assert_memory_equal(with.tokens[i], without.tokens[i], n_gen * sizeof(int32_t));
	}
}

static void test_spec_seeded_sampling_equals_plain_decoding_for_every_seed(void **state)
{
	struct fixture *fx = *state;
	struct engine eng;
	struct engine_ref *er = ref_engine(fx, &eng);
	enum { N = 24, GEN = 32 };
	int32_t prompts[N][24];
	struct job jobs[N];
	for (int i = 0; i < N; i++) {
		repeating_prompt(70u + (uint32_t)i % 4, prompts[i], 24, 4, fx->n_vocab);
		jobs[i] = (struct job){ prompts[i], 24, GEN, 8, .seed = 9000u + (uint64_t)i };
		sampled_params(&jobs[i].sampling);
	}
	uint64_t drafted, accepted;
	check_drafts_change_no_token(&eng, fx->tok, jobs, N, GEN, &drafted, &accepted);
	fprintf(stderr, "sampled: %llu drafted, %llu accepted\n", (unsigned long long)drafted,
		(unsigned long long)accepted);
	assert_true(accepted > 0 && accepted < drafted);
	engine_ref_free(er);
}

/* The sampler's distribution for the chi-square test: top_k 3 at temperature 1.5 (no
 * top_p, min_p or penalty), from the model's logits; ids[3] and p[3], best first. */
#define CHI_TOP 3
#define CHI_TEMP 1.5f

static void chi_params(struct sampler_params *sp)
{
	sampler_params_default(sp);
	sp->temperature = CHI_TEMP;
	sp->top_k = CHI_TOP;
	sp->top_p = 1.0f;
	sp->min_p = 0.0f;
}

static void top_dist(const struct fixture *fx, const int32_t *toks, uint32_t n, int32_t *ids, double *p)
{
	struct model_ctx *c;
	struct hearth_error e;
	float *l = malloc(fx->n_vocab * sizeof *l);
	assert_int_equal(model_ctx_new(&c, fx->m, 64, &e), 0);
	assert_int_equal(model_forward(fx->m, c, toks, n, MODEL_LOGITS_LAST, l, &e), 0);
	for (int k = 0; k < CHI_TOP; k++) {
		int32_t best = -1;
		for (uint32_t i = 0; i < fx->n_vocab; i++) {
			bool taken = false;
			for (int j = 0; j < k; j++)
				taken |= ids[j] == (int32_t)i;
			if (!taken && (best < 0 || l[i] > l[best]))
				best = (int32_t)i;
		}
		ids[k] = best;
	}
	double sum = 0;
	for (int k = 0; k < CHI_TOP; k++)
		sum += p[k] = exp(((double)l[ids[k]] - l[ids[0]]) / CHI_TEMP);
	for (int k = 0; k < CHI_TOP; k++)
		p[k] /= sum;
	model_ctx_free(c);
	free(l);
}

/* A token accepted from a draft was sampled from a row of the verifying step, not from a
 * step of its own: its logprob and top_logprobs must still be the distribution plain
 * decoding reports at that position (the row of that position, not its neighbour's, and
 * the model's own row, not one the sampler or the grammar rewrote). Greedy and sampled,
 * several sequences drafting in one step. */
static void test_spec_logprobs_of_draft_tokens_equal_plain_decoding(void **state)
{
	struct fixture *fx = *state;
	struct engine eng;
	struct engine_ref *er = ref_engine(fx, &eng);
	enum { N = 6, GEN = 32 };
	int32_t prompts[N][36];
	struct job jobs[N];
	for (int i = 0; i < N; i++) {
		repeating_prompt(300u + (uint32_t)i, prompts[i], 36, 4u + (uint32_t)i % 3, fx->n_vocab);
		jobs[i] = (struct job){ prompts[i], 36, GEN, 0, .seed = 7u + (uint64_t)i,
					.logprobs = true, .top_logprobs = SINK_TOP };
		if (i % 2)
			sampled_params(&jobs[i].sampling);
		else
			greedy_params(&jobs[i].sampling);
	}
	static struct sink off, on;
	uint64_t drafted, accepted;
	run_jobs(&eng, fx->tok, jobs, N, &off, &drafted, &accepted);
	for (int i = 0; i < N; i++)
		jobs[i].speculate = 8;
	run_jobs(&eng, fx->tok, jobs, N, &on, &drafted, &accepted);
	fprintf(stderr, "logprobs: %llu drafted, %llu accepted\n", (unsigned long long)drafted,
		(unsigned long long)accepted);
	assert_true(accepted > 0);
	for (int i = 0; i < N; i++) {
		assert_int_equal(on.n[i], GEN);
		assert_memory_equal(on.tokens[i], off.tokens[i], GEN * sizeof(int32_t));
		for (int k = 0; k < GEN; k++) {
			/* A batched row may differ from a one-token step in the last bits. */
			assert_true(off.logprob[i][k] < 0.0f);
			assert_float_equal(on.logprob[i][k], off.logprob[i][k], 1e-4);
			assert_int_equal(on.n_top[i][k], SINK_TOP);
			assert_int_equal(off.n_top[i][k], SINK_TOP);
			for (int j = 0; j < SINK_TOP; j++) {
				assert_int_equal(on.top_ids[i][k][j], off.top_ids[i][k][j]);
				assert_float_equal(on.top_logprobs[i][k][j], off.top_logprobs[i][k][j], 1e-4);
			}
		}
	}
	engine_ref_free(er);
}

/* Draft tokens must not change what is sampled: over many seeds, the first two tokens
 * after a prompt whose lookup drafts w (kept when the first sample is w, the second then
 * sampled from the draft's own row; rejected otherwise) must follow the joint distribution
 * computed from the model's logits, with and without drafts. Seeds are fixed, so the
 * verdict is too; the bound is chi-square's 0.1% point at 8 degrees of freedom.
 *
 * model: the drafts come from a draft model (the model itself, so its greedy proposal is
 * the top token, kept with probability p1[0]) instead of the lookup. */
static void check_sampled_tokens_follow_the_model_distribution(struct fixture *fx, bool model)
{
	/* A prompt "x y z w x y z": the lookup drafts w. Pick w among the sampler's top 3
	 * after that very prompt, so the draft is kept often and rejected often. */
	int32_t prompt[7], w = -1;
	int32_t id1[CHI_TOP];
	double p1[CHI_TOP];
	for (uint32_t seed = 0; seed < 20 && w < 0; seed++) {
		test_prompt(300 + seed, prompt, 3, fx->n_vocab);
		int32_t cand = 0;
		for (int it = 0; it < 12 && w < 0; it++) {
			prompt[3] = cand;
			memcpy(prompt + 4, prompt, 3 * sizeof *prompt);
			top_dist(fx, prompt, 7, id1, p1);
			for (int k = 0; k < CHI_TOP; k++)
				if (id1[k] == cand && p1[k] > 0.2 && p1[k] < 0.8)
					w = cand;
			cand = id1[it % CHI_TOP];
		}
	}
	assert_true(w >= 0);
	double pj[CHI_TOP][CHI_TOP];
	int32_t id2[CHI_TOP][CHI_TOP];
	for (int a = 0; a < CHI_TOP; a++) {
		int32_t t[8];
		double p2[CHI_TOP];
		memcpy(t, prompt, sizeof prompt);
		t[7] = id1[a];
		top_dist(fx, t, 8, id2[a], p2);
		for (int b = 0; b < CHI_TOP; b++)
			pj[a][b] = p1[a] * p2[b];
	}

	enum { N = 1200 };
	static struct job jobs[N];
	for (int i = 0; i < N; i++) {
		jobs[i] = (struct job){ prompt, 7, 2, 1, .seed = 1u + (uint64_t)i,
					.draft_source = model ? SPEC_SOURCE_MODEL : SPEC_SOURCE_AUTO };
		chi_params(&jobs[i].sampling);
	}
	struct engine eng, deng;
	struct engine_ref *er = ref_engine(fx, &eng), *der = ref_engine(fx, &deng);
	g_draft = model ? &deng : NULL;
	static int32_t out[2][N][2];
	uint64_t drafted[2] = { 0 }, accepted[2] = { 0 };
	for (int r = 0; r < 2; r++) {
		static struct sink part;
		for (int i = 0; i < N; i++)
			jobs[i].speculate = r == 0 ? 1 : 0;
		/* The sink keeps MAX_REQ requests: one scheduler run per slice. */
		for (int base = 0; base < N; base += MAX_REQ) {
			uint64_t d, a;
			int n = N - base < MAX_REQ ? N - base : MAX_REQ;
			run_jobs(&eng, fx->tok, jobs + base, (size_t)n, &part, &d, &a);
			drafted[r] += d;
			accepted[r] += a;
			for (int i = 0; i < n; i++) {
				assert_int_equal(part.n[i], 2);
				memcpy(out[r][base + i], part.tokens[i], 2 * sizeof(int32_t));
			}
		}
		double count[CHI_TOP][CHI_TOP] = { { 0 } }, chi2 = 0;
		for (int i = 0; i < N; i++) {
			int a = -1, b = -1;
			for (int k = 0; k < CHI_TOP; k++)
				if (out[r][i][0] == id1[k])
					a = k;
			assert_true(a >= 0); /* top_k 3: nothing else can come */
			for (int k = 0; k < CHI_TOP; k++)
				if (out[r][i][1] == id2[a][k])
					b = k;
			assert_true(b >= 0);
			count[a][b]++;
		}
		for (int a = 0; a < CHI_TOP; a++)
			for (int b = 0; b < CHI_TOP; b++) {
				double e = pj[a][b] * N, d = count[a][b] - e;
				chi2 += d * d / e;
			}
		fprintf(stderr, "chi-square %s %s drafts: %.2f (8 dof), %llu drafted, %llu accepted\n",
			r == 0 ? "with" : "without", model ? "model" : "lookup", chi2, (unsigned long long)drafted[r],
			(unsigned long long)accepted[r]);
		assert_true(chi2 < 26.12);
	}
	/* Every request drafted w once; it was kept about as often as p(w) says. */
	assert_int_equal(drafted[0], N);
	assert_int_equal(drafted[1], 0);
	double pw = 0;
	for (int k = 0; k < CHI_TOP; k++)
		if (id1[k] == (model ? id1[0] : w))
			pw = p1[k];
	double sd = sqrt(N * pw * (1 - pw));
	assert_true(fabs((double)accepted[0] - N * pw) < 4 * sd);
	/* And the same seed gave the same tokens. */
	assert_memory_equal(out[0], out[1], sizeof out[0]);
	g_draft = NULL;
	engine_ref_free(der);
	engine_ref_free(er);
}

static void test_spec_sampled_tokens_follow_the_model_distribution(void **state)
{
	check_sampled_tokens_follow_the_model_distribution(*state, false);
}

static void test_draft_model_sampled_tokens_follow_the_model_distribution(void **state)
{
	check_sampled_tokens_follow_the_model_distribution(*state, true);
}

/* ---- grammars ---- */

static struct grammar_matcher *matcher_for(const struct fixture *fx, const char *gbnf)
{
	struct hearth_error e;
	struct grammar *g;
	struct grammar_index *ix;
	struct grammar_matcher *m;
	assert_int_equal(grammar_compile(&g, gbnf, strlen(gbnf), &e), 0);
	assert_int_equal(grammar_index_new(&ix, g, fx->gv, &e), 0);
	assert_int_equal(grammar_matcher_new(&m, ix, &e), 0);
	grammar_index_unref(ix); /* the matcher holds its own reference */
	return m;
}

/* The prompt's lookup drafts " x" "1": a grammar of digits refuses the draft's first token,
 * so nothing is drafted at all (no row is spent on it); a grammar of " x1" takes it. */
static void test_spec_grammar_cuts_drafts_it_would_refuse(void **state)
{
	struct fixture *fx = *state;
	struct engine eng;
	struct engine_ref *er = ref_engine(fx, &eng);
	struct hearth_error e;
	int32_t prompt[32];
	size_t n;
	assert_int_equal(tok_encode(fx->tok, "x1 x1 x1 x1 x1", 14, false, false, prompt, 32, &n, &e), 0);
	assert_true(n > 4);
	struct job j = { prompt, (uint32_t)n, 2, 8, .seed = 5 };
	greedy_params(&j.sampling);
	static struct sink sink;
	uint64_t drafted, accepted;
	run_jobs(&eng, fx->tok, &j, 1, &sink, &drafted, &accepted);
	assert_int_equal(drafted, 1);     /* max_tokens 2: one draft token at most */
	j.grammar = matcher_for(fx, "root ::= [0-9]+");
	run_jobs(&eng, fx->tok, &j, 1, &sink, &drafted, &accepted);
	assert_int_equal(drafted, 0);
	grammar_matcher_free(j.grammar);
	j.grammar = matcher_for(fx, "root ::= (\" x1\")+");
	run_jobs(&eng, fx->tok, &j, 1, &sink, &drafted, &accepted);
	assert_int_equal(drafted, 1);
	grammar_matcher_free(j.grammar);
	engine_ref_free(er);
}

/* Under a grammar, sampled output with drafts equals output without, seed for seed; with
 * model, the drafts come from a draft model (the model itself) only. */
static void check_grammar_output_equals_plain_decoding(struct fixture *fx, bool model)
{
	struct engine eng, deng;
	struct engine_ref *er = ref_engine(fx, &eng), *der = ref_engine(fx, &deng);
	struct hearth_error e;
	int32_t prompt[32];
	size_t n;
	assert_int_equal(tok_encode(fx->tok, "12 12 12 12 12 12", 17, false, false, prompt, 32, &n, &e), 0);
	assert_true(n > 4);
	static struct sink with, without;
	uint64_t drafted = 0, accepted = 0, model_drafted = 0;
	for (uint64_t seed = 0; seed < 6; seed++) {
		struct job j = { prompt, (uint32_t)n, 24, 8, .seed = seed,
				 .draft_source = model ? SPEC_SOURCE_MODEL : SPEC_SOURCE_AUTO };
		sampled_params(&j.sampling);
		j.sampling.temperature = seed < 2 ? 0.0f : 0.7f;
		uint64_t d, a;
		j.grammar = matcher_for(fx, "root ::= (\" \" [0-9] [0-9]?)+");
		g_draft = model ? &deng : NULL;
		run_jobs(&eng, fx->tok, &j, 1, &with, &d, &a);
		g_draft = NULL;
		drafted += d;
		accepted += a;
		model_drafted += g_model_drafted;
		grammar_matcher_free(j.grammar);
		j.grammar = matcher_for(fx, "root ::= (\" \" [0-9] [0-9]?)+");
		j.speculate = 0;
		run_jobs(&eng, fx->tok, &j, 1, &without, &d, &a);
		grammar_matcher_free(j.grammar);
		assert_int_equal(with.n[0], without.n[0]);
		assert_memory_equal(with.tokens[0], without.tokens[0], with.n[0] * sizeof(int32_t));
	}
	fprintf(stderr, "grammar, %s drafts: %llu drafted, %llu accepted\n", model ? "model" : "lookup",
		(unsigned long long)drafted, (unsigned long long)accepted);
	assert_true(drafted > 0);
	assert_int_equal(model_drafted, model ? drafted : 0);
	engine_ref_free(der);
	engine_ref_free(er);
}

static void test_spec_grammar_output_equals_plain_decoding(void **state)
{
	check_grammar_output_equals_plain_decoding(*state, false);
}

/* Jump-forward and drafts in one sequence: the grammar forces the keys and punctuation
 * (fed as spans of forced tokens, no draft beside them) and leaves the values to sampling,
 * where the prompt's earlier records give the lookup its drafts. Output with drafts equals
 * output without, seed for seed, and both kinds of step happened. */
static void test_spec_with_jump_forward_equals_plain_decoding(void **state)
{
	struct fixture *fx = *state;
	struct engine eng;
	struct engine_ref *er = ref_engine(fx, &eng);
	struct hearth_error e;
	static const char text[] = "{\"id\": 12}\n{\"id\": 12}\n{\"id\": 12}\n";
	static const char gbnf[] = "root ::= (\"{\\\"id\\\": \" [0-9] [0-9] \"}\\n\")+";
	int32_t prompt[64];
	size_t n;
	assert_int_equal(tok_encode(fx->tok, text, sizeof text - 1, false, false, prompt, 64, &n, &e), 0);
	static struct sink with, without;
	uint64_t drafted = 0, accepted = 0, forced = 0;
	for (uint64_t seed = 0; seed < 6; seed++) {
		struct job j = { prompt, (uint32_t)n, 60, 8, .seed = seed, .jump_forward = true };
		sampled_params(&j.sampling);
		j.sampling.temperature = seed < 2 ? 0.0f : 0.8f;
		uint64_t d, a;
		j.grammar = matcher_for(fx, gbnf);
		run_jobs(&eng, fx->tok, &j, 1, &with, &d, &a);
		drafted += d;
		accepted += a;
		forced += g_forced;
		grammar_matcher_free(j.grammar);
		j.grammar = matcher_for(fx, gbnf);
		j.speculate = 0;
		run_jobs(&eng, fx->tok, &j, 1, &without, &d, &a);
		grammar_matcher_free(j.grammar);
		assert_int_equal(with.n[0], without.n[0]);
		assert_memory_equal(with.tokens[0], without.tokens[0], with.n[0] * sizeof(int32_t));
	}
	fprintf(stderr, "grammar with jump-forward: %llu forced, %llu drafted, %llu accepted\n",
		(unsigned long long)forced, (unsigned long long)drafted, (unsigned long long)accepted);
	assert_true(forced > 0);
	assert_true(drafted > 0);
	engine_ref_free(er);
}

/* ---- the int4 engine: rollback in the paged, prefix-shared cache ---- */

/* file, and draft_file (NULL: none) as its draft in the same arena, as hearthd loads them
 * (the draft is then m->draft, freed with m). */
static struct model_q4 *load_q4_fixture_with(const char *file, const char *draft_file, struct tok **tok)
{
	char rel[256], path[4096], drel[256], dpath[4096];
	struct load_opts o;
	load_opts_default(&o);
	o.max_context = 128;
	o.kv_budget = 2u << 20;
	o.max_seqs = 8;
	o.step_tokens = 64;
	o.n_threads = 2;
	if (draft_file) {
		snprintf(drel, sizeof drel, "fixtures/%s", draft_file);
		o.draft = (struct load_draft_opts){ ref_fixture_path(drel, dpath, sizeof dpath), 2u << 20, false,
						    draft_vocab_check };
	}
	struct model_q4 *m;
	struct hearth_error e;
	snprintf(rel, sizeof rel, "fixtures/%s", file);
	if (load_q4(&m, tok, ref_fixture_path(rel, path, sizeof path), &o, &e) < 0)
		fail_msg("load_q4 %s: %s", file, e.msg);
	assert_true((m->draft != NULL) == (draft_file != NULL));
	return m;
}

static struct model_q4 *load_q4_fixture(const char *file, struct tok **tok)
{
	return load_q4_fixture_with(file, NULL, tok);
}

/* Logits after every token of t, one token a step, in a prefix domain of its own (nothing
 * it publishes is found by the sequences under test, in domain 0, or by another call). */
static float *stepwise(struct engine *eng, const int32_t *t, uint32_t n, uint64_t domain)
{
	struct engine_seq *s;
	uint32_t cached;
	struct hearth_error e;
	assert_int_equal(eng->seq_open(eng->impl, t, n, n, domain, &s, &cached, &e), 0);
	assert_int_equal(cached, 0);
	float *out = malloc((size_t)n * eng->n_vocab * sizeof(float));
	for (uint32_t i = 0; i < n; i++) {
		struct engine_span sp = { s, &t[i], 1, out + (size_t)i * eng->n_vocab, 0, NULL };
		assert_int_equal(eng->forward(eng->impl, &sp, 1, &e), 0);
	}
	eng->seq_close(eng->impl, s);
	return out;
}

static void test_spec_q4_rejected_draft_is_rolled_back_and_never_shared(void **state)
{
	(void)state;
	struct tok *tok;
	struct model_q4 *m = load_q4_fixture("fx-quant-q4_0.gguf", &tok);
	struct engine eng;
	model_q4_engine(m, &eng);
	assert_int_equal(kv_block_tokens(&m->kv), 16);
	struct hearth_error e;
	size_t V = eng.n_vocab;
	/* a: 16 prompt tokens (block 0), then a span of 16 (block 1) whose last 8 rows verify
	 * a draft of 7: the first 10 of the span are kept, then 6 others fill block 1 again. */
	int32_t prompt[16], draft[16], real[32], drafted_text[33], real_text[33];
	test_prompt(41, prompt, 16, (uint32_t)V);
	test_prompt(42, draft, 16, (uint32_t)V);
	test_prompt(43, real, 32, (uint32_t)V);
	memcpy(real, draft, 10 * sizeof(int32_t));
	memcpy(drafted_text, prompt, sizeof prompt);
	memcpy(drafted_text + 16, draft, sizeof draft);
	memcpy(real_text, prompt, sizeof prompt);
	memcpy(real_text + 16, real, 16 * sizeof(int32_t));
	drafted_text[32] = real_text[32] = 5;
	float *want_draft = stepwise(&eng, drafted_text, 32, 7);
	float *want_real = stepwise(&eng, real_text, 32, 8);

	struct engine_seq *a, *b;
	uint32_t cached;
	float *rows = malloc(16 * V * sizeof(float));
	assert_int_equal(eng.max_logit_rows, 8);
	assert_int_equal(eng.seq_open(eng.impl, prompt, 16, 64, 0, &a, &cached, &e), 0);
	struct engine_span sp = { a, prompt, 16, rows, 0, NULL };
	assert_int_equal(eng.forward(eng.impl, &sp, 1, &e), 0);
	/* Every row of the verifying span is the logits after its token, as decoded alone
	 * (W4A8: the same bits however rows are batched). */
	sp = (struct engine_span){ a, draft, 16, rows, 9, NULL };
	assert_int_equal(eng.forward(eng.impl, &sp, 1, &e), HEARTH_ERANGE); /* > max_logit_rows */
	sp.n_logits = 8;
	assert_int_equal(eng.forward(eng.impl, &sp, 1, &e), 0);
	assert_memory_equal(rows, want_draft + 24 * V, 8 * V * sizeof(float));
	/* Only the draft's tentative positions (25..31) may go back. */
	assert_int_equal(eng.seq_truncate(eng.impl, a, 24, &e), HEARTH_EINVAL);
	assert_int_equal(eng.seq_truncate(eng.impl, a, 26, &e), 0);
	/* The rejected tokens were never published: block 1 as drafted is not found. */
	assert_int_equal(eng.seq_open(eng.impl, drafted_text, 33, 40, 0, &b, &cached, &e), 0);
	assert_int_equal(cached, 16);
	eng.seq_close(eng.impl, b);
	/* The rest of block 1, over the rejected positions: logits as if never drafted. */
	sp = (struct engine_span){ a, real + 10, 6, rows, 0, NULL };
	assert_int_equal(eng.forward(eng.impl, &sp, 1, &e), 0);
	assert_memory_equal(rows, want_real + 31 * V, V * sizeof(float));
	/* Now block 1 holds accepted tokens only and is shared. */
	assert_int_equal(eng.seq_open(eng.impl, real_text, 33, 40, 0, &b, &cached, &e), 0);
	assert_int_equal(cached, 32);
	eng.seq_close(eng.impl, b);
	eng.seq_close(eng.impl, a);
	free(rows);
	free(want_draft);
	free(want_real);
	tok_free(tok);
	model_q4_free(m);
}

/* A private sequence (a draft model's, ENGINE_SHARE_PRIVATE): any of its positions, of
 * plain spans too, can be taken back and computed again with the logits of a sequence that
 * never had them, and nothing it computed stays in the prefix cache once it is closed. */
static void test_spec_q4_private_sequence_truncates_anywhere_and_publishes_nothing(void **state)
{
	(void)state;
	struct tok *tok;
	struct model_q4 *m = load_q4_fixture("fx-quant-q4_0.gguf", &tok);
	struct engine eng;
	model_q4_engine(m, &eng);
	size_t V = eng.n_vocab;
	int32_t t[40];
	test_prompt(61, t, 40, (uint32_t)V);
	float *want = stepwise(&eng, t, 40, 9);
	struct kv_stats st;
	kv_stats(&m->kv, &st);
	uint32_t cached_before = st.blocks_cached;
	struct engine_seq *a;
	uint32_t cached;
	struct hearth_error e;
	float *row = malloc(V * sizeof(float));
	assert_int_equal(eng.seq_open(eng.impl, t, 40, 48, ENGINE_SHARE_PRIVATE, &a, &cached, &e), 0);
	assert_int_equal(cached, 0);
	struct engine_span sp = { a, t, 32, NULL, 0, NULL };
	assert_int_equal(eng.forward(eng.impl, &sp, 1, &e), 0);
	for (uint32_t i = 32; i < 40; i++) {
		sp = (struct engine_span){ a, &t[i], 1, row, 0, NULL };
		assert_int_equal(eng.forward(eng.impl, &sp, 1, &e), 0);
	}
	assert_memory_equal(row, want + 39 * V, V * sizeof(float));
	/* Back to 20: two full blocks and part of a third, none of them a draft's. */
	assert_int_equal(eng.seq_truncate(eng.impl, a, 20, &e), 0);
	sp = (struct engine_span){ a, &t[20], 20, row, 0, NULL };
	assert_int_equal(eng.forward(eng.impl, &sp, 1, &e), 0);
	assert_memory_equal(row, want + 39 * V, V * sizeof(float));
	eng.seq_close(eng.impl, a);
	kv_stats(&m->kv, &st);
	assert_int_equal(st.blocks_cached, cached_before);
	assert_int_equal(st.blocks_used, 0);
	free(row);
	free(want);
	tok_free(tok);
	model_q4_free(m);
}

/* Through the scheduler on the int4 engine (quantized files, several sequences drafting
 * in the same steps): greedy output with drafts equals output without, token for token.
 * With draft_file, the drafts come from that file as draft model (int4 too) and at least
 * min_rate of them are accepted. Returns how many were accepted. */
static uint64_t check_q4_greedy_with_drafts_equals_without(const char *file, const char *draft_file,
							    double min_rate)
{
	struct tok *tok;
	struct model_q4 *m = load_q4_fixture_with(file, draft_file, &tok), *dm = m->draft;
	struct engine eng, deng;
	model_q4_engine(m, &eng);
	if (dm)
		model_q4_engine(dm, &deng);
	enum { N = 4, GEN = 40 };
	int32_t prompts[N][30];
	struct job jobs[N];
	for (int i = 0; i < N; i++) {
		repeating_prompt(90u + (uint32_t)i, prompts[i], 30, 5u + (uint32_t)i, eng.n_vocab);
		jobs[i] = (struct job){ prompts[i], 30, GEN, 8, .seed = 1, .step_tokens = 64,
					.draft_source = dm ? SPEC_SOURCE_MODEL : SPEC_SOURCE_AUTO };
		greedy_params(&jobs[i].sampling);
	}
	uint64_t drafted, accepted;
	g_draft = dm ? &deng : NULL;
	check_drafts_change_no_token(&eng, tok, jobs, N, GEN, &drafted, &accepted);
	g_draft = NULL;
	fprintf(stderr, "%s greedy, drafts from %s: %llu drafted, %llu accepted\n", file,
		draft_file ? draft_file : "the lookup", (unsigned long long)drafted, (unsigned long long)accepted);
	assert_true((double)accepted >= min_rate * (double)drafted);
	assert_int_equal(g_model_drafted, dm ? drafted : 0);
	tok_free(tok);
	model_q4_free(m); /* and its draft */
	return accepted;
}

static void test_spec_q4_greedy_with_drafts_equals_without(void **state)
{
	(void)state;
	/* Random weights loop by chance, so whether one file's lookups find a continuation the
	 * model repeats depends on its rounding; over the three files some must, or the
	 * accepting path would go untested. */
	uint64_t accepted = check_q4_greedy_with_drafts_equals_without("fx-quant-q4_0.gguf", NULL, 0.0);
	accepted += check_q4_greedy_with_drafts_equals_without("fx-quant-q4_k_m.gguf", NULL, 0.0);
	accepted += check_q4_greedy_with_drafts_equals_without("fx-quant-f16.gguf", NULL, 0.0);
	assert_true(accepted > 0);
}

/* A client that stops reading after park_at tokens: its ring is full from then on, so the
 * sequence parks with the rest of a verified draft undelivered. */
struct park_sink {
	_Atomic uint32_t n;
	uint32_t park_at;
};

static bool park_emit(void *p, const struct sched_token *t)
{
	(void)t;
	struct park_sink *ps = p;
	if (atomic_load(&ps->n) >= ps->park_at)
		return false;
	atomic_fetch_add(&ps->n, 1);
	return true;
}

/* Cancel in the middle of a draft: a request parks on its full ring inside a verifying
 * step (tokens of an accepted draft still to deliver, the rejected rest taken back) and
 * is canceled there. It must finish canceled at once, and another request drafting in the
 * same steps must go on to exactly its output without drafts. */
static void check_cancel_mid_draft(const char *draft_file)
{
	struct tok *tok;
	struct model_q4 *m = load_q4_fixture_with("fx-quant-q4_0.gguf", draft_file, &tok), *dm = m->draft;
	struct engine eng, deng;
	model_q4_engine(m, &eng);
	if (dm)
		model_q4_engine(dm, &deng);
	enum { GEN = 40 };
	int32_t pa[30], pb[30];
	repeating_prompt(400u, pa, 30, 3, eng.n_vocab);
	repeating_prompt(401u, pb, 30, 5, eng.n_vocab);

	/* B alone without drafts: the truth. */
	struct job jb = { pb, 30, GEN, 0, .seed = 1, .step_tokens = 64 };
	greedy_params(&jb.sampling);
	static struct sink alone, with;
	uint64_t d0, a0;
	run_jobs(&eng, tok, &jb, 1, &alone, &d0, &a0);

	struct hearth_error e;
	struct sched_params p;
	sched_params_default(&p);
	p.step_tokens = 64;
	p.draft = dm ? &deng : NULL;
	struct sched *s;
	assert_int_equal(sched_start(&s, &p, &eng, tok, sched_doorbell_ring, &g_efd, &e), 0);
	struct park_sink ps = { .park_at = 6 };
	struct sched_client ca = { .sink = &ps, .emit = park_emit };
	struct sched_client cb = { .sink = &with, .emit = sink_emit };
	memset(&with, 0, sizeof with);
	struct job ja = { pa, 30, GEN, 8, .seed = 1 };
	greedy_params(&ja.sampling);
	jb.speculate = 8;
	ja.draft_source = jb.draft_source = dm ? SPEC_SOURCE_MODEL : SPEC_SOURCE_AUTO;
	post_job(s, &ca, 0, &ja);
	post_job(s, &cb, 0, &jb);
	for (int i = 0; i < 6000 && atomic_load(&ps.n) < ps.park_at; i++)
		usleep(1000);
	assert_int_equal(atomic_load(&ps.n), ps.park_at);
	struct sched_msg *cm = calloc(1, sizeof *cm);
	cm->type = SCHED_MSG_CANCEL;
	cm->client = &ca;
	cm->req_id = 0;
	assert_true(sched_post(s, cm));
	bool acked = false, a_done = false, b_done = false;
	while (!(acked && a_done && b_done)) {
		struct sched_msg *r = take(s);
		if (r->type == SCHED_MSG_CANCEL) {
			acked = true;
		} else if (r->client == &ca) {
			assert_int_equal(r->result.finish, SCHED_FINISH_CANCELED);
			assert_true(r->result.n_generated < GEN);
			a_done = true;
			free(r->req.prompt);
		} else {
			assert_int_equal(r->result.finish, SCHED_FINISH_LENGTH);
			b_done = true;
			free(r->req.prompt);
		}
		free(r);
	}
	uint64_t drafted = atomic_load(&sched_stats(s)->spec_drafted);
	uint64_t accepted = atomic_load(&sched_stats(s)->spec_accepted);
	uint64_t model_drafted = atomic_load(&sched_stats(s)->spec_model_drafted);
	fprintf(stderr, "cancel mid-draft (%s): %llu drafted, %llu accepted\n",
		draft_file ? draft_file : "lookup", (unsigned long long)drafted, (unsigned long long)accepted);
	assert_true(accepted > 0);
	assert_int_equal(model_drafted, draft_file ? drafted : 0);
	sched_stop(s);
	sched_destroy(s);
	assert_int_equal(with.n[0], GEN);
	assert_memory_equal(with.tokens[0], alone.tokens[0], GEN * sizeof(int32_t));
	tok_free(tok);
	model_q4_free(m); /* and its draft */
}

static void test_spec_cancel_mid_draft_leaves_the_batch_exact(void **state)
{
	(void)state;
	check_cancel_mid_draft(NULL);
}

/* ---- drafts from a draft model ---- */

/* The draft must speak the model's vocabulary: the same GPT-2 BPE passes, Llama 2's
 * SentencePiece (another size) is refused by name. */
static void test_draft_vocab_check_refuses_another_vocabulary(void **state)
{
	struct fixture *fx = *state;
	struct hearth_error e;
	assert_int_equal(draft_vocab_check(fx->tok, fx->tok2, &e), 0);
	struct gguf_file *f;
	struct model *m;
	struct tok *t;
	assert_int_equal(ref_fixture_open("fx-llama.gguf", &f, &m, &t), 0);
	assert_int_equal(draft_vocab_check(fx->tok, t, &e), HEARTH_EINVAL);
	assert_non_null(strstr(e.msg, "32000"));
	ref_fixture_close(f, m, t);
}

/* Greedy through the scheduler, six sequences drafting from the draft model in the same
 * steps (no lookup): the output is the model's alone, token for token. The model as its
 * own draft must be accepted nearly always (a batched row may differ from a one-token step
 * in the last bits); another model of the same vocabulary is accepted rarely, so both
 * verdicts occur. */
static void check_draft_greedy(struct fixture *fx, const struct model *draft, double min_rate)
{
	struct engine eng, deng;
	struct engine_ref *er = ref_engine(fx, &eng), *der = ref_engine_of(draft, &deng);
	enum { N = 6, GEN = 32 };
	int32_t prompts[N][24];
	uint32_t lens[N] = { 20, 9, 24, 13, 5, 17 };
	struct job jobs[N];
	for (int i = 0; i < N; i++) {
		test_prompt(600u + (uint32_t)i, prompts[i], lens[i], fx->n_vocab);
		jobs[i] = (struct job){ prompts[i], lens[i], GEN, 8, .seed = 1, .draft_source = SPEC_SOURCE_MODEL };
		greedy_params(&jobs[i].sampling);
	}
	static struct sink sink;
	uint64_t drafted, accepted;
	g_draft = &deng;
	run_jobs(&eng, fx->tok, jobs, N, &sink, &drafted, &accepted);
	g_draft = NULL;
	for (int i = 0; i < N; i++) {
		int32_t want[GEN];
		ref_solo_greedy(fx->m, prompts[i], lens[i], GEN, want);
		assert_int_equal(sink.n[i], GEN);
		assert_memory_equal(sink.tokens[i], want, GEN * sizeof(int32_t));
	}
	fprintf(stderr, "draft model greedy: %llu drafted, %llu accepted\n", (unsigned long long)g_model_drafted,
		(unsigned long long)g_model_accepted);
	assert_int_equal(g_model_drafted, drafted);
	assert_int_equal(g_model_accepted, accepted);
	assert_true(drafted > 0);
	assert_true((double)accepted >= min_rate * (double)drafted);
	engine_ref_free(der);
	engine_ref_free(er);
}

static void test_draft_model_greedy_equals_the_model_alone_in_one_batch(void **state)
{
	struct fixture *fx = *state;
	check_draft_greedy(fx, fx->m, 0.9);
	check_draft_greedy(fx, fx->m2, 0.0);
}

/* Seeded sampling with the model as its own draft, half the requests drafting from the
 * model only and half choosing (lookup where it matches): seed for seed the tokens of
 * plain decoding, with drafts both kept and refused. */
static void test_draft_model_seeded_sampling_equals_plain_decoding(void **state)
{
	struct fixture *fx = *state;
	struct engine eng, deng;
	struct engine_ref *er = ref_engine(fx, &eng), *der = ref_engine(fx, &deng);
	enum { N = 24, GEN = 32 };
	int32_t prompts[N][24];
	struct job jobs[N];
	for (int i = 0; i < N; i++) {
		repeating_prompt(700u + (uint32_t)i % 6, prompts[i], 24, 4 + (uint32_t)i % 5, fx->n_vocab);
		jobs[i] = (struct job){ prompts[i], 24, GEN, 8, .seed = 4000u + (uint64_t)i,
					.draft_source = i % 2 ? SPEC_SOURCE_MODEL : SPEC_SOURCE_AUTO };
		sampled_params(&jobs[i].sampling);
	}
	uint64_t drafted, accepted;
	g_draft = &deng;
	check_drafts_change_no_token(&eng, fx->tok, jobs, N, GEN, &drafted, &accepted);
	g_draft = NULL;
	uint64_t md = g_model_drafted, ma = g_model_accepted;
	fprintf(stderr, "draft model sampled: %llu drafted (%llu by the model), %llu accepted (%llu)\n",
		(unsigned long long)drafted, (unsigned long long)md, (unsigned long long)accepted,
		(unsigned long long)ma);
	assert_true(ma > 0 && ma < md);
	assert_true(drafted > md); /* the auto half used the lookup too */
	engine_ref_free(der);
	engine_ref_free(er);
}

/* The draft model's proposals under a grammar of digits: every proposed token is one the
 * grammar takes in turn (the model alone would propose others), and the matcher is left
 * where it was. Then the draft KV follows the sequence: after one proposed token was
 * accepted and another token came instead of the second, the next proposal equals that of
 * a draft that saw the new text from scratch (the refused positions were taken back). */
static void test_draft_model_proposals_follow_the_grammar_and_the_sequence(void **state)
{
	struct fixture *fx = *state;
	struct engine deng;
	struct engine_ref *der = ref_engine(fx, &deng);
	struct hearth_error e;
	struct drafter *d, *fresh;
	assert_int_equal(drafter_new(&d, &deng, 4, 64, &e), 0);
	assert_int_equal(drafter_new(&fresh, &deng, 4, 64, &e), 0);
	int32_t prompt[40];
	size_t n;
	assert_int_equal(tok_encode(fx->tok, "x1 y2 x1 z", 10, false, false, prompt, 32, &n, &e), 0);
	/* Unconstrained: some proposed token is not a digit. */
	struct draft_seq ds = { 0 }, fs = { 0 };
	struct draft_job j = { &ds, prompt, (uint32_t)n, 6, (uint32_t)n + 16, NULL };
	assert_int_equal(drafter_propose(d, &j, 1, &e), 0);
	assert_int_equal(ds.n_out, 6);
	struct grammar_matcher *g = matcher_for(fx, "root ::= [0-9]+");
	size_t refused = 0;
	for (uint32_t i = 0; i < ds.n_out; i++)
		if (grammar_matcher_accept_token(g, ds.out[i], &e) < 0)
			refused++;
		else
			assert_int_equal(grammar_matcher_rollback(g, 1, &e), 0);
	assert_true(refused > 0);
	drafter_seq_close(d, &ds);
	/* Constrained. */
	size_t h0 = grammar_matcher_history(g);
	j.grammar = g;
	assert_int_equal(drafter_propose(d, &j, 1, &e), 0);
	assert_true(ds.n_out > 0);
	assert_int_equal(grammar_matcher_history(g), h0);
	for (uint32_t i = 0; i < ds.n_out; i++)
		assert_int_equal(grammar_matcher_accept_token(g, ds.out[i], &e), 0);
	grammar_matcher_free(g);
	drafter_seq_close(d, &ds);

	/* In step with the sequence: propose, keep the first token, then a token of the
	 * model's choosing that differs from the second. */
	j.grammar = NULL;
	assert_int_equal(drafter_propose(d, &j, 1, &e), 0);
	assert_int_equal(ds.n_out, 6);
	int32_t *more = prompt;
	more[n] = ds.out[0];
	more[n + 1] = ds.out[1] == 7 ? 8 : 7;
	j.n_tokens = (uint32_t)n + 2;
	assert_int_equal(drafter_propose(d, &j, 1, &e), 0);
	struct draft_job fj = { &fs, more, (uint32_t)n + 2, 6, (uint32_t)n + 16, NULL };
	assert_int_equal(drafter_propose(fresh, &fj, 1, &e), 0);
	assert_int_equal(ds.n_out, 6);
	assert_int_equal(fs.n_out, 6);
	assert_memory_equal(ds.out, fs.out, 6 * sizeof(int32_t));
	/* A sequence that did not move keeps its proposal. */
	int32_t same[6];
	memcpy(same, ds.out, sizeof same);
	assert_int_equal(drafter_propose(d, &j, 1, &e), 0);
	assert_memory_equal(ds.out, same, sizeof same);
	/* A sequence past the draft's context gets no proposal, and no error: the lookup
	 * drafts for it alone. */
	static int32_t longer[REF_FIXTURE_CTX + 1];
	test_prompt(5, longer, REF_FIXTURE_CTX + 1, fx->n_vocab);
	struct draft_job lj = { &ds, longer, REF_FIXTURE_CTX, 6, REF_FIXTURE_CTX + 8, NULL };
	assert_int_equal(drafter_propose(d, &lj, 1, &e), 0);
	assert_int_equal(ds.n_out, 0);
	assert_null(ds.eseq);
	drafter_seq_close(d, &ds);
	drafter_seq_close(fresh, &fs);
	drafter_free(d);
	drafter_free(fresh);
	engine_ref_free(der);
}

static void test_draft_model_grammar_output_equals_plain_decoding(void **state)
{
	check_grammar_output_equals_plain_decoding(*state, true);
}

/* The int4 engine with an int4 draft in its arena, as hearthd loads it: the same file as
 * its own draft (a second resident copy, on the same pool) is accepted nearly always; the same weights from another file (F16 and Q4_0 of one
 * model) agree less, as random weights give flat distributions whose top token rounding
 * flips. */
static void test_draft_model_q4_greedy_with_drafts_equals_without(void **state)
{
	(void)state;
	assert_true(check_q4_greedy_with_drafts_equals_without("fx-quant-f16.gguf", "fx-quant-f16.gguf", 0.9) > 0);
	assert_true(check_q4_greedy_with_drafts_equals_without("fx-quant-f16.gguf", "fx-quant-q4_0.gguf", 0.0) > 0);
}

/* A client whose ring is full while its gate is shut (after shut_at tokens); it records
 * the tokens it takes. */
struct gate_sink {
	_Atomic bool open;
	_Atomic uint32_t n;
	uint32_t shut_at;
	int32_t tokens[MAX_GEN];
};

static bool gate_emit(void *p, const struct sched_token *t)
{
	struct gate_sink *g = p;
	uint32_t n = atomic_load(&g->n);
	if (n >= g->shut_at && !atomic_load(&g->open))
		return false;
	if (n < MAX_GEN)
		g->tokens[n] = t->token;
	atomic_store(&g->n, n + 1);
	return true;
}

/* One place (max_seqs 1), both requests drafting from the draft model: A parks on its full
 * ring, gives its place and KV (the model's and the draft's) to B, and resumes once its
 * reader takes tokens again. Both outputs are the model's alone. */
static void test_draft_model_preempted_sequence_resumes_exactly(void **state)
{
	struct fixture *fx = *state;
	struct engine eng, deng;
	struct engine_ref *er = ref_engine(fx, &eng), *der = ref_engine(fx, &deng);
	enum { GEN = 40 };
	int32_t pa[24], pb[20], want_a[GEN], want_b[GEN];
	test_prompt(810, pa, 24, fx->n_vocab);
	test_prompt(811, pb, 20, fx->n_vocab);
	ref_solo_greedy(fx->m, pa, 24, GEN, want_a);
	ref_solo_greedy(fx->m, pb, 20, GEN, want_b);
	struct hearth_error e;
	struct sched_params p;
	sched_params_default(&p);
	p.max_seqs = 1;
	p.preempt_ns = 20ull * 1000000ull;
	p.draft = &deng;
	struct sched *s;
	assert_int_equal(sched_start(&s, &p, &eng, fx->tok, sched_doorbell_ring, &g_efd, &e), 0);
	static struct gate_sink ga;
	memset(&ga, 0, sizeof ga);
	ga.shut_at = 6;
	static struct sink sb;
	memset(&sb, 0, sizeof sb);
	struct sched_client ca = { .sink = &ga, .emit = gate_emit }, cb = { .sink = &sb, .emit = sink_emit };
	struct job ja = { pa, 24, GEN, 8, .seed = 1, .draft_source = SPEC_SOURCE_MODEL };
	struct job jb = { pb, 20, GEN, 8, .seed = 1, .draft_source = SPEC_SOURCE_MODEL };
	greedy_params(&ja.sampling);
	greedy_params(&jb.sampling);
	post_job(s, &ca, 0, &ja);
	for (int i = 0; i < 6000 && atomic_load(&ga.n) < ga.shut_at; i++)
		usleep(1000);
	assert_int_equal(atomic_load(&ga.n), ga.shut_at);
	post_job(s, &cb, 1, &jb);
	struct sched_msg *m = take(s);
	assert_ptr_equal(m->client, &cb);
	assert_int_equal(m->result.finish, SCHED_FINISH_LENGTH);
	free(m->req.prompt);
	free(m);
	assert_true(atomic_load(&sched_stats(s)->preempted) >= 1);
	atomic_store(&ga.open, true);
	m = take(s);
	assert_ptr_equal(m->client, &ca);
	assert_int_equal(m->result.finish, SCHED_FINISH_LENGTH);
	free(m->req.prompt);
	free(m);
	uint64_t md = atomic_load(&sched_stats(s)->spec_model_drafted);
	uint64_t ma = atomic_load(&sched_stats(s)->spec_model_accepted);
	fprintf(stderr, "preempted with model drafts: %llu drafted, %llu accepted\n", (unsigned long long)md,
		(unsigned long long)ma);
	assert_true(ma > 0);
	sched_stop(s);
	sched_destroy(s);
	assert_int_equal(atomic_load(&ga.n), GEN);
	assert_memory_equal(ga.tokens, want_a, GEN * sizeof(int32_t));
	assert_int_equal(sb.n[1], GEN);
	assert_memory_equal(sb.tokens[1], want_b, GEN * sizeof(int32_t));
	engine_ref_free(der);
	engine_ref_free(er);
}

static void test_draft_model_cancel_mid_draft_leaves_the_batch_exact(void **state)
{
	(void)state;
	check_cancel_mid_draft("fx-quant-q4_0.gguf");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_spec_lookup_takes_the_longest_latest_ngram),
		cmocka_unit_test(test_spec_lookup_extends_a_repeating_span_past_its_period),
		cmocka_unit_test(test_spec_draft_length_adapts_to_acceptance),
		cmocka_unit_test(test_spec_greedy_equals_the_model_alone_in_one_batch),
		cmocka_unit_test(test_spec_seeded_sampling_equals_plain_decoding_for_every_seed),
		cmocka_unit_test(test_spec_sampled_tokens_follow_the_model_distribution),
		cmocka_unit_test(test_draft_model_sampled_tokens_follow_the_model_distribution),
		cmocka_unit_test(test_spec_logprobs_of_draft_tokens_equal_plain_decoding),
		cmocka_unit_test(test_spec_grammar_cuts_drafts_it_would_refuse),
		cmocka_unit_test(test_spec_grammar_output_equals_plain_decoding),
		cmocka_unit_test(test_spec_with_jump_forward_equals_plain_decoding),
		cmocka_unit_test(test_spec_q4_rejected_draft_is_rolled_back_and_never_shared),
		cmocka_unit_test(test_spec_q4_private_sequence_truncates_anywhere_and_publishes_nothing),
		cmocka_unit_test(test_spec_q4_greedy_with_drafts_equals_without),
		cmocka_unit_test(test_spec_cancel_mid_draft_leaves_the_batch_exact),
		cmocka_unit_test(test_draft_vocab_check_refuses_another_vocabulary),
		cmocka_unit_test(test_draft_model_greedy_equals_the_model_alone_in_one_batch),
		cmocka_unit_test(test_draft_model_seeded_sampling_equals_plain_decoding),
		cmocka_unit_test(test_draft_model_proposals_follow_the_grammar_and_the_sequence),
		cmocka_unit_test(test_draft_model_grammar_output_equals_plain_decoding),
		cmocka_unit_test(test_draft_model_q4_greedy_with_drafts_equals_without),
		cmocka_unit_test(test_draft_model_cancel_mid_draft_leaves_the_batch_exact),
		cmocka_unit_test(test_draft_model_preempted_sequence_resumes_exactly),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
