/* Kernel-level A/B against llama.cpp (not a test): ggml's Q4_0 x Q8_0 vec_dot, loaded at
 * run time from a libggml-cpu build (node-llama-cpp ships one per x86 level), against
 * hearth's W4A8 GEMV on the same weights (Q4_0 carried over, and g128 asym from the same
 * f32), cold, interleaved runs, 1 and 2 threads.
 * Usage: bench_kernels_ggml [DIR-with-libggml-base.so-and-libggml-cpu-zen4.so]. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/dispatch.h"
#include "kernels/pool.h"
#include "protocol/clock.h"

#define GGML_TYPE_Q4_0 2
#define GGML_TYPE_Q8_0 8
#define COPIES_BYTES (160u << 20)

/* ggml-cpu.h's struct ggml_type_traits_cpu, as of the ggml in node-llama-cpp 3.21. */
typedef void (*ggml_vec_dot)(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by,
			     int nrc);
typedef void (*ggml_from_float)(const float *x, void *y, int64_t k);
struct ggml_traits {
	ggml_from_float from_float;
	ggml_vec_dot vec_dot;
	int vec_dot_type;
	int64_t nrows;
};

struct ggml_job {
	ggml_vec_dot dot;
	const uint8_t *w;
	size_t rows, cols, row_bytes;
	const void *xq;
	float *y;
};

struct hearth_job {
	const struct kern_table *k;
	const struct q4_matrix *m;
	const struct q4_acts *a;
	float *y;
};

/* llama.cpp's row loop: one vec_dot per output row (its non-repacked CPU path). */
static void run_ggml(void *arg, size_t t, size_t n)
{
	struct ggml_job *j = arg;
	size_t b, e;

	pool_split(j->rows, Q4_ROWS, t, n, &b, &e);
	for (size_t r = b; r < e; r++)
		j->dot((int)j->cols, &j->y[r], 0, j->w + r * j->row_bytes, 0, j->xq, 0, 1);
}

static void run_hearth(void *arg, size_t t, size_t n)
{
	struct hearth_job *j = arg;
	size_t b, e;

	pool_split(j->m->rows, Q4_ROWS, t, n, &b, &e);
	if (b < e)
		j->k->matmul(j->m, j->a, j->y, j->m->rows, b, e);
}

static double now(void)
{
	return (double)hearth_now_ns() * 1e-9;
}

static void *open_lib(const char *dir, const char *name, int flags)
{
	char path[1024];
	void *h;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	h = dlopen(path, flags);
	if (h == NULL)
		fprintf(stderr, "bench_kernels_ggml: %s\n", dlerror());
	return h;
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : "bench/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64";
	static const size_t shapes[][2] = { { 2048, 6144 }, { 6144, 2048 } };
	int cpus[2] = { 0, 1 };
	struct pool *pools[2];

	if (!open_lib(dir, "libggml-base.so", RTLD_NOW | RTLD_GLOBAL))
		return 1;
	void *cpu = open_lib(dir, "libggml-cpu-zen4.so", RTLD_NOW);

	if (cpu == NULL)
		return 1;
	void (*cpu_init)(void) = (void (*)(void))dlsym(cpu, "ggml_cpu_init");
	const struct ggml_traits *(*traits)(int) = (const struct ggml_traits *(*)(int))dlsym(cpu, "ggml_get_type_traits_cpu");

	if (cpu_init == NULL || traits == NULL) {
		fprintf(stderr, "bench_kernels_ggml: ggml symbols missing\n");
		return 1;
	}
	cpu_init();
	const struct ggml_traits *q4 = traits(GGML_TYPE_Q4_0), *q8 = traits(GGML_TYPE_Q8_0);
	const struct kern_table *k = kern_active();

	if (pool_create(&pools[0], 1, NULL, 0, 0) != 0 || pool_create(&pools[1], 2, cpus, 0, 0) != 0)
		return 1;
	printf("ggml Q4_0 vec_dot vs hearth %s W4A8 GEMV; best of 8 interleaved passes over %u MiB of copies\n",
	       k->name, COPIES_BYTES >> 20);
	for (size_t si = 0; si < 2; si++) {
		size_t rows = shapes[si][0], cols = shapes[si][1], row_bytes = cols / 32 * 18;
		size_t gbytes = rows * row_bytes, n_copies = COPIES_BYTES / gbytes + 1;
		float *w = malloc(rows * cols * sizeof(float)), *x = malloc(cols * sizeof(float));
		float *y = malloc(rows * sizeof(float));
		uint8_t **gw = calloc(n_copies, sizeof(*gw));
		struct q4_matrix *hq = calloc(n_copies, sizeof(*hq)), *hg = calloc(n_copies, sizeof(*hg));
		void *xq = aligned_alloc(64, (cols / 32 * 34 + 63) & ~(size_t)63);
		struct q4_acts a32, a128;

		for (size_t i = 0; i < rows * cols; i++)
			w[i] = (float)rand() / (float)RAND_MAX - 0.5f;
		for (size_t i = 0; i < cols; i++)
			x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
		for (size_t c = 0; c < n_copies; c++) {
			gw[c] = aligned_alloc(64, (gbytes + 63) & ~(size_t)63);
			q4->from_float(w, gw[c], (int64_t)(rows * cols));
			q4_matrix_plan(&hq[c], rows, cols, 32, false);
			hq[c].data = aligned_alloc(64, q4_matrix_bytes(&hq[c]));
			q4_pack_rows_q4_0(&hq[c], gw[c], 0, rows);
			q4_matrix_plan(&hg[c], rows, cols, 128, true);
			hg[c].data = aligned_alloc(64, q4_matrix_bytes(&hg[c]));
			q4_pack_rows_f32(&hg[c], w, cols, NULL, 0, rows);
		}
		q8->from_float(x, xq, (int64_t)cols);
		q4_acts_init(&a32, Q4_ACT_A8, 1, cols, 32, aligned_alloc(64, q4_acts_bytes(Q4_ACT_A8, 1, cols, 32)));
		q4_acts_init(&a128, Q4_ACT_A8, 1, cols, 128, aligned_alloc(64, q4_acts_bytes(Q4_ACT_A8, 1, cols, 128)));
		k->acts_prepare(&a32, x, cols, 0, 1);
		k->acts_prepare(&a128, x, cols, 0, 1);
		printf("%zux%zu: ggml Q4_0 %.2f MB (4.5 bpw), hearth g128 asym %.2f MB (%.3f bpw)\n", rows, cols,
		       gbytes / 1e6, q4_matrix_bytes(&hg[0]) / 1e6, q4_matrix_bpw(&hg[0]));
		for (int th = 0; th < 2; th++) {
			double best[3] = { 1e9, 1e9, 1e9 };

			for (int pass = 0; pass < 8; pass++) {
				for (int v = 0; v < 3; v++) {
					double t0 = now();

					for (size_t c = 0; c < n_copies; c++) {
						struct ggml_job gj = { q4->vec_dot, gw[c], rows, cols, row_bytes, xq, y };
						struct hearth_job hj = { k, v == 1 ? &hq[c] : &hg[c], v == 1 ? &a32 : &a128, y };

						if (v == 0)
							pool_run(pools[th], run_ggml, &gj);
						else
							pool_run(pools[th], run_hearth, &hj);
					}
					double dt = (now() - t0) / (double)n_copies;

					best[v] = dt < best[v] ? dt : best[v];
				}
			}
			printf("  %d thr: ggml %.0f us | hearth Q4_0 carried over %.0f us (%.2fx) | hearth g128 %.0f us (%.2fx)\n",
			       th + 1, best[0] * 1e6, best[1] * 1e6, best[0] / best[1], best[2] * 1e6, best[0] / best[2]);
		}
		for (size_t c = 0; c < n_copies; c++) {
			free(gw[c]);
			free(hq[c].data);
			free(hg[c].data);
		}
		free(gw);
		free(hq);
		free(hg);
		free(w);
		free(x);
		free(y);
		free(xq);
		free(a32.codes);
		free(a128.codes);
	}
	pool_destroy(pools[0]);
	pool_destroy(pools[1]);
	return 0;
}
