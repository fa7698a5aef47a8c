/* Micro-benchmark that steers kernel work (not a test): GEMV GB/s for 2048x6144 and
 * 6144x2048 q4 matrices with 1 and 2 threads against a plain streaming read, and GEMM
 * GOP/s at 512 tokens (from cache) and at 8 (weights from memory), for W4A8 and W4A16.
 * Usage: bench_kernels [ref|avx2|avx512] [ms] [g128|g64r8] (the layout: group 128 with fp16
 * scales, the default, or group 64 with row8's 8-bit scale codes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

#include <immintrin.h>

#include "kernels/dispatch.h"
#include "kernels/pool.h"
#include "protocol/clock.h"

/* Enough copies of a matrix that one pass over them leaves the 32 MiB L3: decode streams
 * weights from memory, so the cache must not serve them. */
#define COPIES_BYTES (160u << 20)
#define SMALL_TOK 8 /* tokens of the small-batch GEMM */

struct job {
	const struct kern_table *k;
	struct q4_matrix *mats;
	size_t n_mats, cur;
	struct q4_acts *acts;
	float *y;
	const float *x;
	size_t n_tok;
};

static double clock_s(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double now(void)
{
	return (double)hearth_now_ns() * 1e-9;
}

/* Process CPU seconds: on a machine shared with other jobs, wall time counts the time
 * our threads were not scheduled; CPU time per thread does not (waits spin, so they
 * still count). Both are printed. */
static double cpu_now(void)
{
	return clock_s(CLOCK_PROCESS_CPUTIME_ID);
}

static void run_matmul(void *arg, size_t t, size_t n)
{
	struct job *j = arg;
	const struct q4_matrix *m = &j->mats[j->cur];
	size_t b, e;

	pool_split(m->rows, Q4_ROWS, t, n, &b, &e);
	if (b < e)
		j->k->matmul(m, j->acts, j->y, m->rows, b, e);
}

/* Runs the matmul over the rotating copies (so the weights come from memory) until the
 * budget is spent from t0; returns the end time and the count in *reps. */
static double time_rotating(struct pool *p, struct job *j, double t0, double budget, int *reps)
{
	double t1;

	do {
		j->cur = (size_t)*reps % j->n_mats;
		pool_run(p, run_matmul, j);
		(*reps)++;
		t1 = now();
	} while (t1 - t0 < budget);
	return t1;
}

static void run_prepare(void *arg, size_t t, size_t n)
{
	struct job *j = arg;
	size_t b, e;

	pool_split(j->n_tok, 1, t, n, &b, &e);
	if (b < e)
		j->k->acts_prepare(j->acts, j->x, j->acts->cols, b, e);
}

struct stream {
	const __m256i *buf;
	size_t n;
	__m256i sink[2][2];
};

__attribute__((target("avx2"))) static void run_stream(void *arg, size_t t, size_t n)
{
	struct stream *s = arg;
	size_t b, e;
	__m256i a0 = _mm256_setzero_si256(), a1 = a0;

	pool_split(s->n, 64, t, n, &b, &e);
	for (size_t i = b; i < e; i += 2) {
		a0 = _mm256_xor_si256(a0, _mm256_load_si256(s->buf + i));
		a1 = _mm256_xor_si256(a1, _mm256_load_si256(s->buf + i + 1));
	}
	s->sink[t & 1][0] = a0;
	s->sink[t & 1][1] = a1;
}

static double bench_stream(struct pool *p, double budget, double *cpu_gbs)
{
	size_t bytes = COPIES_BYTES;
	struct stream s = { .n = bytes / 32 };
	void *buf = aligned_alloc(64, bytes);
	int reps = 0;

	/* Every word different: pages of one repeated byte can be merged below us and then
	 * read far faster than memory (hearthd-tool bench's probe saw 49-57 GB/s that way). */
	for (size_t i = 0; i < bytes / 8; i++)
		((uint64_t *)buf)[i] = (i + 1) * 0x9E3779B97F4A7C15ull;
	s.buf = buf;
	pool_run(p, run_stream, &s);
	double t0 = now(), c0 = cpu_now(), t1;

	do {
		pool_run(p, run_stream, &s);
		reps++;
		t1 = now();
	} while (t1 - t0 < budget);
	*cpu_gbs = (double)bytes * reps / ((cpu_now() - c0) / (double)pool_threads(p)) / 1e9;
	free(buf);
	return (double)bytes * reps / (t1 - t0) / 1e9;
}

/* Weights as the daemon holds them: on huge pages (THP here; the arena prefers hugetlb),
 * so a prefetch or a stream never pays a 4 KiB page walk the daemon would not. */
static void *huge_alloc(size_t bytes)
{
	size_t huge = 2u << 20, n = (bytes + huge - 1) / huge * huge;
	void *p = aligned_alloc(huge, n);

	if (p)
		madvise(p, n, MADV_HUGEPAGE);
	return p;
}

static float frand(void)
{
	return (float)rand() / (float)RAND_MAX * 2.0f - 1.0f;
}

int main(int argc, char **argv)
{
	const char *isa = argc > 1 ? argv[1] : "auto";
	double budget = (argc > 2 ? atof(argv[2]) : 300.0) / 1000.0;
	static const size_t shapes[][2] = { { 2048, 6144 }, { 6144, 2048 } };
	const bool row8 = argc > 3 && !strcmp(argv[3], "g64r8");
	const size_t group = row8 ? 64 : 128, gemm_tok = 512;
	struct pool *pools[2];
	int cpus[2] = { 0, 1 };

	if (kern_select(isa) != 0) {
		fprintf(stderr, "bench_kernels: cannot use kernels '%s' on this cpu\n", isa);
		return 1;
	}
	const struct kern_table *k = kern_active();

	if (pool_create(&pools[0], 1, NULL, 0, 0) != 0 || pool_create(&pools[1], 2, cpus, 0, 0) != 0) {
		fprintf(stderr, "bench_kernels: pool_create failed\n");
		return 1;
	}
	printf("kernels %s, group %zu asym%s, budget %.0f ms per number (shared machine: noisy)\n", k->name,
	       group, row8 ? " row8" : "", budget * 1000);
	for (int th = 0; th < 2; th++) {
		double cpu_gbs, gbs = bench_stream(pools[th], budget, &cpu_gbs);

		printf("stream read       %d thr: %6.1f GB/s wall, %6.1f GB/s per cpu-time\n", th + 1, gbs, cpu_gbs);
	}

	for (size_t si = 0; si < 2; si++) {
		size_t rows = shapes[si][0], cols = shapes[si][1];
		struct q4_matrix proto;

		if (row8)
			q4_matrix_plan_row8(&proto, rows, cols, group);
		else
			q4_matrix_plan(&proto, rows, cols, group, true);
		size_t mbytes = q4_matrix_bytes(&proto);
		size_t n_mats = COPIES_BYTES / mbytes + 1;
		struct q4_matrix *mats = calloc(n_mats, sizeof(*mats));
		float *w = malloc(16 * cols * sizeof(float));
		size_t xn = gemm_tok * cols;
		float *x = malloc(xn * sizeof(float));
		float *y = aligned_alloc(64, gemm_tok * rows * sizeof(float));

		for (size_t i = 0; i < 16 * cols; i++)
			w[i] = frand();
		for (size_t i = 0; i < xn; i++)
			x[i] = frand();
		for (size_t i = 0; i < n_mats; i++) {
			mats[i] = proto;
			mats[i].data = huge_alloc(mbytes);
			for (size_t r = 0; r < rows; r += 16)
				q4_pack_rows_f32(&mats[i], w, cols, NULL, r, rows - r < 16 ? rows - r : 16);
		}
		printf("%zux%zu (%.2f MB, %.3f bpw, %zu copies)\n", rows, cols, mbytes / 1e6,
		       q4_matrix_bpw(&proto), n_mats);
		for (int kind = Q4_ACT_A8; kind <= Q4_ACT_A16; kind += 8) {
			const char *kn = kind == Q4_ACT_A8 ? "W4A8 " : "W4A16";
			void *amem = aligned_alloc(64, q4_acts_bytes(kind, gemm_tok, cols, group));
			struct q4_acts a1, an;
			struct job j = { .k = k, .mats = mats, .n_mats = n_mats, .y = y, .x = x };

			q4_acts_init(&a1, kind, 1, cols, group, amem);
			k->acts_prepare(&a1, x, cols, 0, 1);
			for (int th = 0; th < 2; th++) {
				int reps = 0;

				j.acts = &a1;
				double t0 = now(), c0 = cpu_now(), t1 = time_rotating(pools[th], &j, t0, budget, &reps);
				double c = (cpu_now() - c0) / (th + 1);

				printf("  gemv %s %d thr: %6.1f GB/s wall, %6.1f GB/s per cpu-time (%.1f us/matvec)\n",
				       kn, th + 1, (double)mbytes * reps / (t1 - t0) / 1e9, (double)mbytes * reps / c / 1e9,
				       (t1 - t0) / reps * 1e6);
			}
			q4_acts_init(&an, kind, gemm_tok, cols, group, amem);
			j.acts = &an;
			j.n_tok = gemm_tok;
			j.cur = 0;
			for (int th = 0; th < 2; th++) {
				int reps = 0;
				double t0 = now(), c0 = cpu_now(), t1;

				do {
					pool_run(pools[th], run_prepare, &j);
					pool_run(pools[th], run_matmul, &j);
					reps++;
					t1 = now();
				} while (t1 - t0 < budget);
				double c = (cpu_now() - c0) / (th + 1), ops = 2.0 * rows * cols * gemm_tok * reps;

				printf("  gemm %s %d thr: %6.1f GOP/s wall, %6.1f GOP/s per cpu-time (%zu tokens, %.1f ms)\n",
				       kn, th + 1, ops / (t1 - t0) / 1e9, ops / c / 1e9, gemm_tok, (t1 - t0) / reps * 1e3);
			}
			/* A continuous-batching decode step: a few tokens against weights that come
			 * from memory (the copies rotate, as for the GEMV), where streaming and
			 * int8 compute cost about the same and must overlap. */
			struct q4_acts as;

			q4_acts_init(&as, kind, SMALL_TOK, cols, group, amem);
			k->acts_prepare(&as, x, cols, 0, SMALL_TOK);
			j.acts = &as;
			for (int th = 0; th < 2; th++) {
				int reps = 0;
				double t0 = now(), t1 = time_rotating(pools[th], &j, t0, budget, &reps);
				double ops = 2.0 * rows * cols * SMALL_TOK * reps;

				printf("  gemm %s %d thr: %6.1f GOP/s wall, %6.1f GB/s of weights (%d tokens from memory, %.1f us)\n",
				       kn, th + 1, ops / (t1 - t0) / 1e9, (double)mbytes * reps / (t1 - t0) / 1e9,
				       SMALL_TOK, (t1 - t0) / reps * 1e6);
			}
			free(amem);
		}
		for (size_t i = 0; i < n_mats; i++)
			free(mats[i].data);
		free(mats);
		free(w);
		free(x);
		free(y);
	}
	pool_destroy(pools[0]);
	pool_destroy(pools[1]);
	return 0;
}
