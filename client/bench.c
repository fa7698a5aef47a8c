/* `hearth bench`: forks N client processes, each with its own connection, that generate at
 * once (greedy, EOS ignored, exactly --tokens tokens after a --prompt-tokens prompt), and
 * reports throughput, time to first token and per-token IPC latency. Processes, not
 * threads, because that is how clients really share a daemon: separate address spaces,
 * separate rings, the kernel scheduling them against the daemon's compute threads. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/bench.h"
#include "client/hearth.h"
#include "protocol/clock.h"

/* What one client process reports back, in memory shared with the parent. */
struct bench_slot {
	int rc;                   /* 0, or the failing call's code */
	int finish;               /* enum hearth_finish */
	uint32_t n_gen;           /* tokens delivered to the callback (one sample each) */
	uint64_t t_send;          /* CLOCK_MONOTONIC before the generate request */
	uint64_t t_first;         /* at the first token's callback */
	uint64_t t_done;          /* when hearth_generate returned */
	double decode_tps;        /* as the daemon's `done` reported them */
	double queue_ms, prefill_ms;
	char msg[600];
};

/* One token as the callback saw it. */
struct bench_sample {
	uint64_t t_cb;            /* CLOCK_MONOTONIC in the callback */
	uint64_t t_sampled;       /* the daemon's sampling time (0: not sent) */
};

/* One level's results, computed by the parent. */
struct bench_level {
	uint32_t clients;
	bool ok;
	double wall_s;            /* first request sent .. last generation done */
	double agg_tps;
	double client_tps_mean, client_tps_min;
	double decode_tps_mean;   /* client side: tokens after the first / their time */
	double steady_tps;        /* all clients past their prefill: tokens / that window */
	double ttft_p50_ms, ttft_p99_ms;
	double ipc_p50_us, ipc_p99_us, ipc_max_us;
	size_t n_ipc;
};

struct bench_cb {
	struct bench_slot *slot;
	struct bench_sample *samp; /* per token */
	uint32_t cap;
};

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* A prompt of ordinary token ids, different per client so no two sequences are alike.
 * The low ids of a byte-level BPE vocabulary are bytes and the top ones special tokens;
 * the middle is plain words. */
static void bench_prompt(uint32_t *ids, uint32_t n, uint32_t n_vocab, uint64_t seed,
			 uint32_t client)
{
	uint32_t lo = n_vocab > 4096 ? 256 : 0;
	uint32_t hi = n_vocab > 32768 ? 32768 : n_vocab;
	uint64_t st = seed ^ ((uint64_t)(client + 1) << 32);
	for (uint32_t i = 0; i < n; i++)
		ids[i] = lo + (uint32_t)(splitmix64(&st) % (hi - lo));
}

static int bench_on_token(void *user, const struct hearth_token *tok)
{
	uint64_t t = hearth_now_ns();
	struct bench_cb *cb = user;
	struct bench_slot *s = cb->slot;
	if (s->n_gen == 0)
		s->t_first = t;
	if (s->n_gen < cb->cap)
		cb->samp[s->n_gen] = (struct bench_sample){ t, tok->t_sampled_ns };
	s->n_gen++;
	return 0;
}

static struct hearth_gen_params bench_params(const struct bench_opts *o)
{
	struct hearth_gen_params p = hearth_gen_params_default();
	p.max_tokens = o->tokens;
	p.temperature = 0;
	p.has_seed = true;
	p.seed = o->seed;
	p.ignore_eos = true;
	return p;
}

static void slot_fail(struct bench_slot *s, const struct hearth_err *e, const char *what)
{
	s->rc = e->code ? e->code : HEARTH_EIO;
	snprintf(s->msg, sizeof s->msg, "%s: %s", what,
		 e->msg[0] ? e->msg : hearth_strerror(e->code));
}

/* The body of one client process: connect, report ready, wait for the start signal (EOF
 * on go_fd), generate, record. Never returns. */
static void bench_child(const struct bench_opts *o, uint32_t idx, uint32_t n_vocab,
			struct bench_slot *s, struct bench_sample *samp, int ready_fd,
			int go_fd)
{
	struct hearth_err e = { 0 };
	struct hearth *h = NULL;
	char name[32];
	snprintf(name, sizeof name, "bench-%u", idx);
	struct hearth_connect_opts co = { .socket_path = o->socket, .client_name = name,
					  .timeout_ms = o->timeout_ms, .spin_us = o->spin_us };
	uint32_t *ids = malloc((size_t)o->prompt_tokens * sizeof *ids);
	if (!ids) {
		s->rc = HEARTH_ENOMEM;
		snprintf(s->msg, sizeof s->msg, "out of memory for the prompt");
	} else if (hearth_connect_with(&h, &co, &e) < 0) {
		slot_fail(s, &e, "connect");
	}
	/* Report ready even after a failure, so the parent does not wait for us forever. */
	char c = 1;
	ssize_t w = write(ready_fd, &c, 1);
	(void)w;
	while (read(go_fd, &c, 1) < 0 && errno == EINTR)
		;
	if (s->rc == 0) {
		bench_prompt(ids, o->prompt_tokens, n_vocab, o->seed, idx);
		struct hearth_prompt pr = { .tokens = ids, .n_tokens = o->prompt_tokens };
		struct hearth_gen_params p = bench_params(o);
		struct bench_cb cb = { s, samp, o->tokens };
		struct hearth_result res = { 0 };
		s->t_send = hearth_now_ns();
		int rc = hearth_generate(h, &pr, &p, bench_on_token, &cb, &res, &e);
		s->t_done = hearth_now_ns();
		if (rc < 0) {
			slot_fail(s, &e, "generate");
		} else {
			s->finish = (int)res.finish;
			s->decode_tps = res.decode_tps;
			s->queue_ms = res.queue_ms;
			s->prefill_ms = res.prefill_ms;
		}
	}
	hearth_close(h);
	free(ids);
	_exit(s->rc ? 1 : 0);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Nearest-rank percentile of n sorted values. */
static double pct(const double *v, size_t n, double p)
{
	if (n == 0)
		return NAN;
	size_t k = (size_t)ceil(p / 100.0 * (double)n);
	return v[k ? k - 1 : 0];
}

/* The memory a level's clients write into, shared across fork: k slots, then o->tokens
 * samples per client. Returns 0 or 1 (message on stderr). */
static int bench_map(const struct bench_opts *o, uint32_t k, struct bench_slot **slots,
		     struct bench_sample **samp, size_t *map_size)
{
	size_t slots_size = (((size_t)k * sizeof(struct bench_slot)) + 63) & ~(size_t)63;
	size_t n_samples;
	if (__builtin_mul_overflow((size_t)k, (size_t)o->tokens, &n_samples) ||
	    n_samples > (SIZE_MAX - slots_size) / sizeof(struct bench_sample)) {
		fprintf(stderr, "hearth: bench: %u clients x %u tokens is too many samples\n", k,
			o->tokens);
		return 1;
	}
	*map_size = slots_size + n_samples * sizeof(struct bench_sample);
	void *map = mmap(NULL, *map_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
			 -1, 0);
	if (map == MAP_FAILED) {
		fprintf(stderr, "hearth: bench: mmap of %zu bytes: %s\n", *map_size, strerror(errno));
		return 1;
	}
	*slots = map;
	*samp = (struct bench_sample *)((char *)map + slots_size);
	return 0;
}

/* Forks up to k clients into pids; each reports on ready and starts at EOF on go. Returns
 * how many started. */
static uint32_t bench_fork(const struct bench_opts *o, uint32_t k, uint32_t n_vocab,
			   struct bench_slot *slots, struct bench_sample *samp, pid_t *pids,
			   const int ready[2], const int go[2])
{
	fflush(stdout);
	fflush(stderr);
	uint32_t started = 0;
	for (; started < k; started++) {
		pid_t pid = fork();
		if (pid < 0) {
			fprintf(stderr, "hearth: bench: fork: %s\n", strerror(errno));
			break;
		}
		if (pid == 0) {
			close(ready[0]);
			close(go[1]);
			bench_child(o, started, n_vocab, &slots[started],
				    samp + (size_t)started * o->tokens, ready[1], go[0]);
		}
		pids[started] = pid;
	}
	return started;
}

/* Waits for every started client and checks it generated all its tokens. Returns 0, or 1
 * when one failed (message on stderr). */
static int bench_reap(const struct bench_opts *o, uint32_t k, uint32_t started,
		      const pid_t *pids, struct bench_slot *slots)
{
	int failed = started < k;
	for (uint32_t i = 0; i < started; i++) {
		int st;
		while (waitpid(pids[i], &st, 0) < 0 && errno == EINTR)
			;
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			if (slots[i].rc == 0)
				snprintf(slots[i].msg, sizeof slots[i].msg, "client process died");
			fprintf(stderr, "hearth: bench: %u clients: client %u: %s\n", k, i,
				slots[i].msg);
			failed = 1;
		} else if (slots[i].n_gen != o->tokens) {
			fprintf(stderr, "hearth: bench: %u clients: client %u got %u tokens of %u "
				"(finish %s)\n", k, i, slots[i].n_gen, o->tokens,
				hearth_finish_name((enum hearth_finish)slots[i].finish));
			failed = 1;
		}
	}
	return failed;
}

/* Forks k clients, releases them together once all are connected, and waits for them.
 * Returns 0, or 1 when a client failed (message on stderr). */
static int bench_clients_run(const struct bench_opts *o, uint32_t k, uint32_t n_vocab,
			     struct bench_slot *slots, struct bench_sample *samp)
{
	int ready[2], go[2];
	if (pipe(ready) < 0) {
		fprintf(stderr, "hearth: bench: pipe: %s\n", strerror(errno));
		return 1;
	}
	if (pipe(go) < 0) {
		fprintf(stderr, "hearth: bench: pipe: %s\n", strerror(errno));
		close(ready[0]);
		close(ready[1]);
		return 1;
	}
	pid_t *pids = calloc(k, sizeof *pids);
	if (!pids) {
		fprintf(stderr, "hearth: bench: out of memory\n");
		close(ready[0]);
		close(ready[1]);
		close(go[0]);
		close(go[1]);
		return 1;
	}
	uint32_t started = bench_fork(o, k, n_vocab, slots, samp, pids, ready, go);
	close(ready[1]);
	close(go[0]);
	/* Every client connected (or failed to): start them all at once by closing go. */
	for (uint32_t n = 0; n < started;) {
		char c;
		ssize_t r = read(ready[0], &c, 1);
		if (r == 1)
			n++;
		else if (r == 0 || errno != EINTR)
			break;
	}
	close(go[1]);
	close(ready[0]);
	int failed = bench_reap(o, k, started, pids, slots);
	free(pids);
	return failed;
}

/* Tokens per second in the window in which every client was decoding (after the last first
 * token, before the first done), so each step was one batch of k decode tokens with no
 * prefill in it. NAN when the window is empty. */
static double bench_steady_tps(const struct bench_opts *o, uint32_t k,
			       const struct bench_slot *slots, const struct bench_sample *samp)
{
	uint64_t w0 = 0, w1 = UINT64_MAX;
	for (uint32_t i = 0; i < k; i++) {
		w0 = slots[i].t_first > w0 ? slots[i].t_first : w0;
		w1 = slots[i].t_done < w1 ? slots[i].t_done : w1;
	}
	if (w1 <= w0)
		return NAN;
	uint64_t n_in = 0;
	for (uint32_t i = 0; i < k; i++) {
		const struct bench_sample *sp = samp + (size_t)i * o->tokens;
		for (uint32_t j = 0; j < slots[i].n_gen && j < o->tokens; j++)
			n_in += sp[j].t_cb > w0 && sp[j].t_cb <= w1;
	}
	return (double)n_in / ((double)(w1 - w0) / 1e9);
}

/* The level's figures from what the clients recorded. Returns 0 or 1 (out of memory). */
static int bench_summarise(const struct bench_opts *o, uint32_t k, const struct bench_slot *slots,
			   const struct bench_sample *samp, struct bench_level *lv)
{
	size_t n_samples = (size_t)k * o->tokens; /* bench_map checked the product */
	double *ttft = calloc(k, sizeof *ttft);
	double *ipc = malloc((n_samples ? n_samples : 1) * sizeof *ipc);
	if (!ttft || !ipc) {
		free(ttft);
		free(ipc);
		fprintf(stderr, "hearth: bench: out of memory\n");
		return 1;
	}
	uint64_t t0 = UINT64_MAX, t1 = 0, total = 0;
	size_t ns = 0;
	lv->client_tps_min = INFINITY;
	for (uint32_t i = 0; i < k; i++) {
		const struct bench_slot *s = &slots[i];
		t0 = s->t_send < t0 ? s->t_send : t0;
		t1 = s->t_done > t1 ? s->t_done : t1;
		total += s->n_gen;
		double tps = s->n_gen / ((double)(s->t_done - s->t_send) / 1e9);
		lv->client_tps_mean += tps / k;
		lv->client_tps_min = tps < lv->client_tps_min ? tps : lv->client_tps_min;
		if (s->n_gen > 1)
			lv->decode_tps_mean += (s->n_gen - 1) /
					       ((double)(s->t_done - s->t_first) / 1e9) / k;
		ttft[i] = (double)(s->t_first - s->t_send) / 1e6;
		const struct bench_sample *sp = samp + (size_t)i * o->tokens;
		for (uint32_t j = 0; j < s->n_gen && j < o->tokens; j++)
			if (sp[j].t_sampled)
				ipc[ns++] = ((double)sp[j].t_cb - (double)sp[j].t_sampled) / 1e3;
	}
	lv->steady_tps = bench_steady_tps(o, k, slots, samp);
	lv->wall_s = (double)(t1 - t0) / 1e9;
	lv->agg_tps = (double)total / lv->wall_s;
	qsort(ttft, k, sizeof *ttft, cmp_double);
	lv->ttft_p50_ms = pct(ttft, k, 50);
	lv->ttft_p99_ms = pct(ttft, k, 99);
	qsort(ipc, ns, sizeof *ipc, cmp_double);
	lv->n_ipc = ns;  /* tokens with a daemon timestamp */
	lv->ipc_p50_us = pct(ipc, ns, 50);
	lv->ipc_p99_us = pct(ipc, ns, 99);
	lv->ipc_max_us = ns ? ipc[ns - 1] : NAN;
	free(ttft);
	free(ipc);
	return 0;
}

/* Runs one level: forks k clients, releases them together, waits, and summarises. The
 * shared memory goes to *slots_out / *map_size_out for the caller to print and unmap. */
static int bench_level_run(const struct bench_opts *o, uint32_t k, uint32_t n_vocab,
			   struct bench_level *lv, struct bench_slot **slots_out,
			   size_t *map_size_out)
{
	memset(lv, 0, sizeof *lv);
	lv->clients = k;
	struct bench_sample *samp;
	if (bench_map(o, k, slots_out, &samp, map_size_out))
		return 1;
	if (bench_clients_run(o, k, n_vocab, *slots_out, samp) ||
	    bench_summarise(o, k, *slots_out, samp, lv))
		return 1;
	lv->ok = true;
	return 0;
}

/* The daemon's strings in JSON: quotes, backslashes and control bytes escaped. */
static void json_str(const char *key, const char *v)
{
	printf("\"%s\":\"", key);
	for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
		if (*p == '"' || *p == '\\')
			printf("\\%c", *p);
		else if (*p < 0x20)
			printf("\\u%04x", *p);
		else
			putchar(*p);
	}
	printf("\",");
}

/* JSON has no NaN: levels without timestamps print null. */
static void json_num(const char *key, double v, bool comma)
{
	if (isnan(v))
		printf("\"%s\":null", key);
	else
		printf("\"%s\":%.3f", key, v);
	if (comma)
		putchar(',');
}

static void print_clients(const struct bench_opts *o, const struct bench_level *lv,
			  const struct bench_slot *slots)
{
	for (uint32_t i = 0; i < lv->clients; i++) {
		const struct bench_slot *s = &slots[i];
		double tps = s->n_gen / ((double)(s->t_done - s->t_send) / 1e9);
		double ttft = (double)(s->t_first - s->t_send) / 1e6;
		if (o->json) {
			printf("%s{", i ? "," : "");
			json_num("tps", tps, true);
			json_num("ttft_ms", ttft, true);
			json_num("daemon_decode_tps", s->decode_tps, true);
			json_num("daemon_queue_ms", s->queue_ms, true);
			json_num("daemon_prefill_ms", s->prefill_ms, true);
			printf("\"n_gen\":%u}", s->n_gen);
		} else {
			printf("         client %2u: %8.2f tok/s  TTFT %8.1f ms (daemon: queue %.1f, "
			       "prefill %.1f ms)  daemon decode %7.2f tok/s\n", i, tps, ttft,
			       s->queue_ms, s->prefill_ms, s->decode_tps);
		}
	}
}

#define WAKE_SAMPLES 400

/* The machine's floor under the IPC figure: how long a process sleeping in poll() on an
 * eventfd takes to run after another process writes it, with nothing else in the path.
 * A client that blocks for its tokens can do no better than this. Ping-pong (the child
 * acks each wake) so no two writes coalesce; 1 ms apart so the sleeper really sleeps. */
static void pin_to(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	sched_setaffinity(0, sizeof set, &set); /* best effort: unpinned still measures */
}

static int bench_wake_floor(int cpu_waker, int cpu_sleeper, double *p50, double *p99)
{
	int ping = eventfd(0, EFD_CLOEXEC), pong = eventfd(0, EFD_CLOEXEC);
	size_t size = (WAKE_SAMPLES + 1) * sizeof(uint64_t);
	uint64_t *t = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	int rc = -1;
	if (ping < 0 || pong < 0 || t == MAP_FAILED)
		goto out;
	pid_t pid = fork();
	if (pid < 0)
		goto out;
	if (pid == 0) {
		pin_to(cpu_sleeper);
		for (int i = 0; i < WAKE_SAMPLES; i++) {
			struct pollfd pf = { .fd = ping, .events = POLLIN };
			uint64_t v = 1;
			if (poll(&pf, 1, 5000) != 1)
				_exit(1);
			t[i] = hearth_now_ns() - t[i];
			if (read(ping, &v, sizeof v) != sizeof v || write(pong, &v, sizeof v) != sizeof v)
				_exit(1);
		}
		_exit(0);
	}
	cpu_set_t saved;
	sched_getaffinity(0, sizeof saved, &saved);
	pin_to(cpu_waker);
	double lat[WAKE_SAMPLES];
	int n = 0;
	for (; n < WAKE_SAMPLES; n++) {
		uint64_t v = 1;
		struct timespec gap = { 0, 1000000 };
		nanosleep(&gap, NULL);
		t[n] = hearth_now_ns();
		if (write(ping, &v, sizeof v) != sizeof v || read(pong, &v, sizeof v) != sizeof v)
			break;
		lat[n] = (double)t[n] / 1e3;
	}
	sched_setaffinity(0, sizeof saved, &saved);
	int status;
	waitpid(pid, &status, 0);
	if (n == WAKE_SAMPLES && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
		qsort(lat, n, sizeof lat[0], cmp_double);
		*p50 = pct(lat, n, 50);
		*p99 = pct(lat, n, 99);
		rc = 0;
	}
out:
	if (t != MAP_FAILED)
		munmap(t, size);
	if (ping >= 0)
		close(ping);
	if (pong >= 0)
		close(pong);
	return rc;
}

/* Connects once for the model's facts, and runs a short generation that touches the paths
 * once (page faults, first-use lazy state) so the first level does not pay for them.
 * Returns 0 or 1 (message on stderr). */
static int bench_warm_up(const struct bench_opts *o, struct hearth_model *m)
{
	struct hearth_err e = { 0 };
	struct hearth *h;
	struct hearth_connect_opts co = { .socket_path = o->socket, .client_name = "bench",
					  .timeout_ms = o->timeout_ms, .spin_us = o->spin_us };
	if (hearth_connect_with(&h, &co, &e) < 0) {
		fprintf(stderr, "hearth: %s\n", e.msg[0] ? e.msg : hearth_strerror(e.code));
		return 1;
	}
	if (hearth_model_info(h, m, &e) < 0 || m->n_vocab == 0) {
		fprintf(stderr, "hearth: bench: no model facts: %s\n", e.msg);
		hearth_close(h);
		return 1;
	}
	uint32_t warm[16];
	bench_prompt(warm, 16, m->n_vocab, o->seed, 1000);
	struct hearth_prompt wp = { .tokens = warm, .n_tokens = 16 };
	struct hearth_gen_params wpar = bench_params(o);
	wpar.max_tokens = 4;
	int rc = hearth_generate(h, &wp, &wpar, NULL, NULL, NULL, &e);
	hearth_close(h);
	if (rc < 0) {
		fprintf(stderr, "hearth: bench: warm-up generation: %s\n", e.msg);
		return 1;
	}
	return 0;
}

/* The wake floor's p50/p99 on one cpu and across two: wake[0..1] same cpu, wake[2..3] other
 * cpu (NAN when this process may use one cpu only, or the probe failed). */
static void bench_wake(double wake[4])
{
	/* Waker and sleeper on the first two cpus this process may use (one cpu: the same). */
	cpu_set_t mine;
	int cpus[2] = { 0, 0 }, n_cpus = 0;
	if (sched_getaffinity(0, sizeof mine, &mine) == 0)
		for (int c = 0; c < CPU_SETSIZE && n_cpus < 2; c++)
			if (CPU_ISSET(c, &mine))
				cpus[n_cpus++] = c;
	for (int i = 0; i < 4; i++)
		wake[i] = NAN;
	if (bench_wake_floor(cpus[0], cpus[0], &wake[0], &wake[1]) < 0 ||
	    (n_cpus > 1 && bench_wake_floor(cpus[0], cpus[1], &wake[2], &wake[3]) < 0))
		fprintf(stderr, "hearth: bench: the wake-latency probe failed; its figures are left out\n");
}

static void print_header(const struct bench_opts *o, const struct hearth_model *m,
			 const double wake[4])
{
	if (o->json) {
		printf("{\"model\":{");
		json_str("arch", m->arch);
		json_str("quant", m->quant);
		printf("\"n_params\":%" PRIu64 ",\"n_vocab\":%u},\"prompt_tokens\":%u,"
		       "\"tokens\":%u,\"seed\":%" PRIu64 ",", m->n_params, m->n_vocab,
		       o->prompt_tokens, o->tokens, o->seed);
		json_num("wake_same_cpu_us_p50", wake[0], true);
		json_num("wake_same_cpu_us_p99", wake[1], true);
		json_num("wake_other_cpu_us_p50", wake[2], true);
		json_num("wake_other_cpu_us_p99", wake[3], true);
		printf("\"levels\":[");
	} else {
		printf("hearth bench: %s (%s, %.2fB params), prompt %u tokens, %u generated per "
		       "client, greedy, seed %" PRIu64 "\n"
		       "wake floor (eventfd write -> a sleeping process runs; idle daemon): same cpu "
		       "p50 %.1f / p99 %.1f us, other cpu p50 %.1f / p99 %.1f us\n"
		       "clients   agg tok/s  client tok/s (mean/min)  decode tok/s  steady tok/s  "
		       "TTFT p50/p99 ms   IPC p50/p99/max us\n",
		       m->arch, m->quant, (double)m->n_params / 1e9, o->prompt_tokens, o->tokens,
		       o->seed, wake[0], wake[1], wake[2], wake[3]);
	}
	fflush(stdout);
}

/* One level's line (or JSON object; first: no comma before it). */
static void print_level(const struct bench_opts *o, bool first, const struct bench_level *lv,
			const struct bench_slot *slots)
{
	if (o->json) {
		printf("%s{\"clients\":%u,", first ? "" : ",", lv->clients);
		json_num("wall_s", lv->wall_s, true);
		json_num("aggregate_tps", lv->agg_tps, true);
		json_num("client_tps_mean", lv->client_tps_mean, true);
		json_num("client_tps_min", lv->client_tps_min, true);
		json_num("decode_tps_mean", lv->decode_tps_mean, true);
		json_num("steady_tps", lv->steady_tps, true);
		json_num("ttft_ms_p50", lv->ttft_p50_ms, true);
		json_num("ttft_ms_p99", lv->ttft_p99_ms, true);
		json_num("ipc_us_p50", lv->ipc_p50_us, true);
		json_num("ipc_us_p99", lv->ipc_p99_us, true);
		json_num("ipc_us_max", lv->ipc_max_us, true);
		printf("\"ipc_samples\":%zu,\"per_client\":[", lv->n_ipc);
		print_clients(o, lv, slots);
		printf("]}");
	} else {
		printf("%7u  %10.2f  %12.2f / %-9.2f  %12.2f  %12.2f  %7.1f / %-7.1f  "
		       "%6.1f / %.1f / %.1f\n", lv->clients, lv->agg_tps,
		       lv->client_tps_mean, lv->client_tps_min, lv->decode_tps_mean,
		       lv->steady_tps, lv->ttft_p50_ms, lv->ttft_p99_ms, lv->ipc_p50_us, lv->ipc_p99_us,
		       lv->ipc_max_us);
		if (o->verbose)
			print_clients(o, lv, slots);
	}
	fflush(stdout);
}

int bench_run(const struct bench_opts *o)
{
	struct hearth_model m;
	if (bench_warm_up(o, &m))
		return 1;
	double wake[4];
	bench_wake(wake);
	print_header(o, &m, wake);

	int status = 0;
	double agg1 = NAN, agg8 = NAN;
	for (size_t li = 0; li < o->n_levels; li++) {
		struct bench_level lv;
		struct bench_slot *slots = NULL;
		size_t map_size = 0;
		if (bench_level_run(o, o->clients[li], m.n_vocab, &lv, &slots, &map_size)) {
			status = 1;
		} else {
			if (lv.clients == 1)
				agg1 = lv.agg_tps;
			if (lv.clients == 8)
				agg8 = lv.agg_tps;
			print_level(o, li == 0, &lv, slots);
		}
		if (slots)
			munmap(slots, map_size);
	}
	double ratio = agg8 / agg1;
	if (o->json) {
		printf("],");
		json_num("ratio_8_1", ratio, false);
		printf("}\n");
	} else if (!isnan(ratio)) {
		printf("aggregate(8 clients) / aggregate(1 client) = %.2fx\n", ratio);
	}
	return status;
}
