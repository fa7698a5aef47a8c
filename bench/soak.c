/* The soak: N requests from C concurrent client processes against a running hearthd,
 * mixing fresh and reused connections, generations of random length, cancels part-way,
 * and clients killed with SIGKILL mid-generation (respawned), while the parent samples
 * the daemon's RSS and open descriptors once a second. Prints one CSV line per sample
 * on stdout and a summary on stderr; exits 1 if a request failed in a way a healthy
 * daemon would not cause or memory/fds did not come back flat.
 * usage: soak SOCKET DAEMON_PID [--requests N] [--clients C] [--seed S] */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/hearth.h"

struct shared {
	_Atomic uint64_t next;         /* requests handed out */
	_Atomic uint64_t done, canceled, killed, fresh, reused, failed, tokens;
	char last_error[256];
};

static uint64_t rng_next(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void note_failure(struct shared *sh, const char *what, const struct hearth_err *e)
{
	atomic_fetch_add(&sh->failed, 1);
	snprintf(sh->last_error, sizeof sh->last_error, "%s: %.200s", what, e->msg);
}

/* One client process: takes request numbers until the total is reached. */
static void worker(struct shared *sh, const char *sock, uint64_t total, uint64_t seed)
{
	struct hearth *h = NULL;
	struct hearth_err e;
	for (;;) {
		uint64_t n = atomic_fetch_add(&sh->next, 1);
		if (n >= total)
			break;
		uint64_t r = rng_next(&seed);
		/* 1 in 3 requests on a fresh connection, the rest reuse the one open. */
		if (!h || r % 3 == 0) {
			hearth_close(h);
			h = NULL;
			if (hearth_connect(&h, sock, "soak", &e) < 0) {
				note_failure(sh, "connect", &e);
				h = NULL;
				continue;
			}
			atomic_fetch_add(&sh->fresh, 1);
		} else {
			atomic_fetch_add(&sh->reused, 1);
		}
		uint32_t prompt[24];
		uint32_t np = 4 + (uint32_t)(rng_next(&seed) % 20);
		for (uint32_t i = 0; i < np; i++)
			prompt[i] = 10 + (uint32_t)(rng_next(&seed) % 30000);
		struct hearth_prompt p = { .tokens = prompt, .n_tokens = np };
		struct hearth_gen_params gp = hearth_gen_params_default();
		gp.max_tokens = 1 + (uint32_t)(rng_next(&seed) % 24);
		gp.has_seed = true;
		gp.seed = n;
		gp.ignore_eos = true;
		unsigned kind = (unsigned)(rng_next(&seed) % 100);
		struct hearth_gen *g;
		if (hearth_gen_start(h, &p, &gp, &g, &e) < 0) {
			note_failure(sh, "gen_start", &e);
			hearth_close(h);
			h = NULL;
			continue;
		}
		/* kind < 2: killed mid-generation; < 17: canceled after a few tokens. */
		uint32_t stop_at = kind < 17 ? (uint32_t)(rng_next(&seed) % 4) : UINT32_MAX;
		uint32_t got = 0;
		int rc;
		const struct hearth_token *t;
		while ((rc = hearth_gen_next(g, &t, 30000, &e)) == 1) {
			got++;
			if (got == stop_at + 1) {
				if (kind < 2) {
					atomic_fetch_add(&sh->killed, 1);
					atomic_fetch_add(&sh->done, 1);
					raise(SIGKILL);
				}
				hearth_cancel(g, &e);
			}
		}
		if (rc < 0) {
			note_failure(sh, "gen_next", &e);
			hearth_gen_finish(g, NULL, &e);
			hearth_close(h);
			h = NULL;
			continue;
		}
		struct hearth_result res;
		if (hearth_gen_finish(g, &res, &e) < 0) {
			note_failure(sh, "gen_finish", &e);
			continue;
		}
		if (res.finish == HEARTH_FINISH_CANCEL)
			atomic_fetch_add(&sh->canceled, 1);
		else if (res.n_gen != gp.max_tokens)
			note_failure(sh, "length", &(struct hearth_err){ .msg = "a generation fell short" });
		atomic_fetch_add(&sh->tokens, got);
		atomic_fetch_add(&sh->done, 1);
	}
	hearth_close(h);
}

static long rss_kib(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	long kb = -1;
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

static int fd_count(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
	DIR *d = opendir(path);
	if (!d)
		return -1;
	int n = 0;
	struct dirent *de;
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: soak SOCKET DAEMON_PID [--requests N] [--clients C] [--seed S]\n");
		return 2;
	}
	const char *sock = argv[1];
	pid_t daemon = (pid_t)atoi(argv[2]);
	uint64_t total = 10000, seed = 1;
	int clients = 8;
	for (int i = 3; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--requests"))
			total = strtoull(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--clients"))
			clients = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--seed"))
			seed = strtoull(argv[i + 1], NULL, 10);
	}
	if (clients < 1 || clients > 64) {
		fprintf(stderr, "soak: --clients 1..64\n");
		return 2;
	}
	struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
				 -1, 0);
	if (sh == MAP_FAILED)
		return 1;
	memset(sh, 0, sizeof *sh);
	pid_t kids[64];
	uint64_t spawned = 0;
	for (int i = 0; i < clients; i++) {
		kids[i] = fork();
		if (kids[i] == 0) {
			worker(sh, sock, total, seed * 7919 + ++spawned);
			_exit(0);
		}
		spawned++;
	}
	printf("t_s,requests_done,rss_kib,fds\n");
	uint64_t t0 = now_ms(), last = 0;
	long rss_first = -1, rss_min = -1, rss_max = -1;
	int fd_min = -1, fd_max = -1;
	int live = clients;
	while (live > 0) {
		int st;
		pid_t p = waitpid(-1, &st, WNOHANG);
		if (p > 0) {
			for (int i = 0; i < clients; i++) {
				if (kids[i] != p)
					continue;
				if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL &&
				    atomic_load(&sh->next) < total) {
					/* A killed client: another takes its place. */
					kids[i] = fork();
					if (kids[i] == 0) {
						worker(sh, sock, total, seed * 7919 + spawned + 1000);
						_exit(0);
					}
					spawned++;
				} else {
					kids[i] = -1;
					live--;
				}
			}
			continue;
		}
		uint64_t t = now_ms() - t0;
		if (t - last >= 1000 || last == 0) {
			last = t ? t : 1;
			long rss = rss_kib(daemon);
			int fds = fd_count(daemon);
			if (rss < 0) {
				fprintf(stderr, "soak: hearthd (pid %d) is gone\n", (int)daemon);
				return 1;
			}
			printf("%.1f,%llu,%ld,%d\n", t / 1000.0,
			       (unsigned long long)atomic_load(&sh->done), rss, fds);
			fflush(stdout);
			/* Flatness is judged after the first tenth of the run (warm-up). */
			if (atomic_load(&sh->done) >= total / 10) {
				if (rss_first < 0)
					rss_first = rss;
				if (rss_min < 0 || rss < rss_min)
					rss_min = rss;
				if (rss > rss_max)
					rss_max = rss;
				if (fd_min < 0 || fds < fd_min)
					fd_min = fds;
				if (fds > fd_max)
					fd_max = fds;
			}
		}
		usleep(20000);
	}
	/* Every client gone: the daemon must be back to its idle descriptors. */
	usleep(1500000);
	long rss_end = rss_kib(daemon);
	int fds_end = fd_count(daemon);
	printf("%.1f,%llu,%ld,%d\n", (now_ms() - t0) / 1000.0,
	       (unsigned long long)atomic_load(&sh->done), rss_end, fds_end);
	double secs = (now_ms() - t0) / 1000.0;
	fprintf(stderr,
		"soak: %llu requests by %d clients (%llu processes) in %.0f s: %llu fresh connections, %llu reused, %llu canceled, %llu clients killed mid-generation, %llu tokens, %llu failed%s%s\n",
		(unsigned long long)atomic_load(&sh->done), clients, (unsigned long long)spawned, secs,
		(unsigned long long)atomic_load(&sh->fresh), (unsigned long long)atomic_load(&sh->reused),
		(unsigned long long)atomic_load(&sh->canceled), (unsigned long long)atomic_load(&sh->killed),
		(unsigned long long)atomic_load(&sh->tokens), (unsigned long long)atomic_load(&sh->failed),
		atomic_load(&sh->failed) ? "; last: " : "", sh->last_error);
	fprintf(stderr,
		"soak: hearthd RSS after warm-up %ld KiB, min %ld, max %ld, at the end %ld (max - first %+ld KiB); fds min %d max %d, at the end %d\n",
		rss_first, rss_min, rss_max, rss_end, rss_max - rss_first, fd_min, fd_max, fds_end);
	return atomic_load(&sh->failed) ? 1 : 0;
}
