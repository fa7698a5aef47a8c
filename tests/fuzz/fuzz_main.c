/* A standalone driver for the fuzz targets, for builds without libFuzzer (gcc, make
 * check): replays files and directories given as arguments, then mutates the target's
 * seeds for HEARTH_FUZZ_RUNS inputs (default 2000) from HEARTH_FUZZ_SEED. Prints TAP.
 * HEARTH_FUZZ_DUMP=DIR writes the seeds there as files, a starting corpus for libFuzzer. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz.h"

struct corpus {
	uint8_t **data;
	size_t *size;
	size_t n, cap;
};

static void corpus_add(void *ctx, const uint8_t *data, size_t size)
{
	struct corpus *c = ctx;
	if (c->n == c->cap) {
		size_t cap = c->cap ? c->cap * 2 : 16;
		uint8_t **d = realloc(c->data, cap * sizeof *d);
		size_t *s = realloc(c->size, cap * sizeof *s);
		if (!d || !s) {
			fprintf(stderr, "fuzz: out of memory\n");
			exit(1);
		}
		c->data = d;
		c->size = s;
		c->cap = cap;
	}
	c->data[c->n] = malloc(size ? size : 1);
	if (!c->data[c->n]) {
		fprintf(stderr, "fuzz: out of memory\n");
		exit(1);
	}
	memcpy(c->data[c->n], data, size);
	c->size[c->n++] = size;
}

static void replay_file(struct corpus *c, const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return;
	static uint8_t buf[1 << 20];
	size_t n = fread(buf, 1, sizeof buf, f);
	fclose(f);
	LLVMFuzzerTestOneInput(buf, n);
	corpus_add(c, buf, n);
}

static void replay(struct corpus *c, const char *path)
{
	struct stat st;
	if (stat(path, &st) < 0) {
		fprintf(stderr, "fuzz: %s: no such file or directory\n", path);
		exit(1);
	}
	if (!S_ISDIR(st.st_mode)) {
		replay_file(c, path);
		return;
	}
	DIR *d = opendir(path);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char full[4096];
		snprintf(full, sizeof full, "%s/%s", path, e->d_name);
		replay_file(c, full);
	}
	if (d)
		closedir(d);
}

static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Byte flips, interesting values, inserts, deletes, truncation and splices: a small
 * subset of libFuzzer's mutators, enough to walk past the seeds' structure. */
static size_t mutate(uint8_t *buf, size_t n, size_t cap, const struct corpus *c, uint64_t *s)
{
	static const uint8_t interesting[] = { 0x00, 0x01, 0x7f, 0x80, 0xc0, 0xc1, 0xcc, 0xcf,
		0xd3, 0xd9, 0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0xff, 0x8f, 0x9f, 0xbf };
	int rounds = 1 + (int)(rng_next(s) % 4);
	for (int r = 0; r < rounds; r++) {
		size_t at = n ? (size_t)(rng_next(s) % n) : 0;
		switch (rng_next(s) % 7) {
		case 0:
			if (n) buf[at] ^= (uint8_t)(1u << (rng_next(s) % 8));
			break;
		case 1:
			if (n) buf[at] = interesting[rng_next(s) % sizeof interesting];
			break;
		case 2:
			if (n) buf[at] = (uint8_t)rng_next(s);
			break;
		case 3:
			if (n < cap) {
				memmove(buf + at + 1, buf + at, n - at);
				buf[at] = (uint8_t)rng_next(s);
				n++;
			}
			break;
		case 4:
			if (n) {
				memmove(buf + at, buf + at + 1, n - at - 1);
				n--;
			}
			break;
		case 5:
			n = at;
			break;
		case 6: {
			size_t k = (size_t)(rng_next(s) % c->n);
			size_t take = c->size[k] < cap - at ? c->size[k] : cap - at;
			memcpy(buf + at, c->data[k], take);
			if (at + take > n)
				n = at + take;
			break;
		}
		}
	}
	return n;
}

int main(int argc, char **argv)
{
	struct corpus c = { 0 };
	fuzz_seeds(corpus_add, &c);
	const char *dump = getenv("HEARTH_FUZZ_DUMP");
	for (size_t i = 0; dump && i < c.n; i++) {
		char path[4096];
		snprintf(path, sizeof path, "%s/seed-%03zu", dump, i);
		FILE *f = fopen(path, "wb");
		if (!f || fwrite(c.data[i], 1, c.size[i], f) != c.size[i]) {
			fprintf(stderr, "fuzz: cannot write %s\n", path);
			return 1;
		}
		fclose(f);
	}
	for (size_t i = 0; i < c.n; i++)
		LLVMFuzzerTestOneInput(c.data[i], c.size[i]);
	for (int i = 1; i < argc; i++)
		replay(&c, argv[i]);
	const char *e = getenv("HEARTH_FUZZ_RUNS");
	long runs = e ? strtol(e, NULL, 10) : 2000;
	e = getenv("HEARTH_FUZZ_SEED");
	uint64_t seed = e ? strtoull(e, NULL, 10) : 1;
	if (seed == 0)
		seed = 1;
	static uint8_t buf[1 << 16];
	for (long r = 0; r < runs && c.n; r++) {
		size_t k = (size_t)(rng_next(&seed) % c.n);
		size_t n = c.size[k] < sizeof buf ? c.size[k] : sizeof buf;
		memcpy(buf, c.data[k], n);
		n = mutate(buf, n, sizeof buf, &c, &seed);
		/* an exact-size copy lets ASan see any read past the end */
		uint8_t *in = malloc(n ? n : 1);
		memcpy(in, buf, n);
		LLVMFuzzerTestOneInput(in, n);
		/* keep some mutants as parents, so mutations compound */
		if (r % 64 == 0 && c.n < 512)
			corpus_add(&c, in, n);
		free(in);
	}
	printf("1..1\nok 1 - %s: %zu seeds and %ld mutated inputs without a finding\n",
	       argv[0], c.n, runs);
	for (size_t i = 0; i < c.n; i++)
		free(c.data[i]);
	free(c.data);
	free(c.size);
	return 0;
}
