/* `imatrix = self`: locating, making and dropping a model's self-calibration file. The name
 * carries a hash of the model file's identity and one of the settings, so a changed model
 * or setting finds no file and makes a new one instead of reading a stale one. */
#include "daemon/serve/calib.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/engine/imatrix.h"
#include "daemon/engine/load.h"
#include "daemon/serve/config.h"
#include "protocol/hash.h"

/* Bumped when the file made for the same model and settings would differ (the sampler, the
 * collector, the file's contents): old caches then miss instead of being read. */
#define CALIB_FORMAT 3u /* 2: the head's input too; 3: sampled on W4A8 */

int calib_locate(struct calib *c, const struct hearth_config *cfg, const struct load_opts *o,
		 struct hearth_error *err)
{
	struct stat st;
	memset(c, 0, sizeof *c);
	if (stat(cfg->model, &st) < 0)
		return hearth_error_errno(err, HEARTH_EIO, errno, "imatrix = self: cannot stat %s", cfg->model);
	c->n_seqs = cfg->imatrix_samples;
	c->len = CALIB_LEN < o->max_context ? CALIB_LEN : o->max_context;

	uint64_t ident[] = { st.st_dev, st.st_ino, (uint64_t)st.st_size, (uint64_t)st.st_mtim.tv_sec,
			     (uint64_t)st.st_mtim.tv_nsec };
	uint64_t settings[] = { CALIB_FORMAT, c->n_seqs, c->len, CALIB_SEED, IMATRIX_COV_BLOCK_DEFAULT,
				o->weights_group, o->head_bits, o->mix, o->mix_budget_cbpw };
	uint64_t mh = hearth_fnv1a(HEARTH_FNV1A_SEED, ident, sizeof ident);
	uint64_t sh = hearth_fnv1a(HEARTH_FNV1A_SEED, settings, sizeof settings);

	const char *dir = cfg->imatrix_cache[0] ? cfg->imatrix_cache : getenv("CACHE_DIRECTORY");
	/* systemd passes every CacheDirectory= colon-separated: the first is ours. */
	size_t dn = dir ? strcspn(dir, ":") : 0;
	const char *base = strrchr(cfg->model, '/');
	base = base ? base + 1 : cfg->model;
	size_t bn = strlen(base);
	if (bn > 5 && !strcmp(base + bn - 5, ".gguf"))
		bn -= 5;
	if (bn > 128)
		bn = 128;
	snprintf(c->stem, sizeof c->stem, "%.*s-%016llx", (int)bn, base, (unsigned long long)mh);
	if (!dn)
		return calib_temporary(c, err);
	if (dn >= sizeof c->dir)
		return hearth_error_set(err, HEARTH_ERANGE, "imatrix_cache: path longer than %zu bytes", sizeof c->dir - 1);
	memcpy(c->dir, dir, dn);
	c->cached = true;
	if (snprintf(c->path, sizeof c->path, "%s/%s-%016llx.imatrix.gguf", c->dir, c->stem, (unsigned long long)sh) >=
	    (int)sizeof c->path)
		return hearth_error_set(err, HEARTH_ERANGE, "imatrix_cache: %s: path too long", c->dir);
	return 0;
}

int calib_temporary(struct calib *c, struct hearth_error *err)
{
	const char *tmp = getenv("TMPDIR");
	if (!tmp || !tmp[0])
		tmp = "/var/tmp";
	c->cached = false;
	if (snprintf(c->path, sizeof c->path, "%s/hearth-%s-%ld.imatrix.gguf", tmp, c->stem, (long)getpid()) >=
	    (int)sizeof c->path)
		return hearth_error_set(err, HEARTH_ERANGE, "imatrix = self: TMPDIR %s: path too long", tmp);
	return 0;
}

bool calib_ready(const struct calib *c)
{
	return c->cached && access(c->path, R_OK) == 0;
}

/* Files of this model made for an earlier version of its file: same name, other hash. */
static void drop_stale(const struct calib *c)
{
	DIR *d = opendir(c->dir);
	if (!d)
		return;
	const char *dash = strrchr(c->stem, '-');
	size_t keep = (size_t)(dash - c->stem) + 1; /* "<model file>-" */
	struct dirent *e;
	while ((e = readdir(d))) {
		size_t n = strlen(e->d_name);
		/* <model file>-<16 hex>-<16 hex>.imatrix.gguf, the model hash not ours */
		if (n != keep + 16 + 1 + 16 + 13 || strncmp(e->d_name, c->stem, keep) ||
		    strcmp(e->d_name + n - 13, ".imatrix.gguf") || !strncmp(e->d_name, c->stem, keep + 16))
			continue;
		char p[PATH_MAX];
		if (snprintf(p, sizeof p, "%s/%s", c->dir, e->d_name) < (int)sizeof p)
			unlink(p);
	}
	closedir(d);
}

/* c->path's parts left by a daemon that died making it (its pid gone): up to a model's
 * covariances each. */
static void drop_parts(const struct calib *c)
{
	DIR *d = opendir(c->dir);
	if (!d)
		return;
	const char *base = strrchr(c->path, '/') + 1;
	size_t bn = strlen(base);
	struct dirent *e;
	while ((e = readdir(d))) {
		char *end;
		if (strncmp(e->d_name, base, bn) || e->d_name[bn] != '.')
			continue;
		long pid = strtol(e->d_name + bn + 1, &end, 10);
		if (pid <= 0 || strcmp(end, ".part") || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		char p[PATH_MAX];
		if (snprintf(p, sizeof p, "%s/%s", c->dir, e->d_name) < (int)sizeof p)
			unlink(p);
	}
	closedir(d);
}

/* What calib_make samples for c. */
static struct imatrix_self_opts calib_self_opts(const struct calib *c)
{
	return (struct imatrix_self_opts){
		.n_seqs = c->n_seqs,
		.len = c->len,
		.seed = CALIB_SEED,
		.cov_block = IMATRIX_COV_BLOCK_DEFAULT,
	};
}

int calib_plan(const struct calib *c, const char *model, const struct load_opts *o, uint64_t *bytes,
	       struct hearth_error *err)
{
	struct imatrix_self_opts so = calib_self_opts(c);
	return imatrix_self_plan(model, o, &so, bytes, err);
}

int calib_make(const struct calib *c, const char *model, const struct load_opts *o,
	       bool (*progress)(void *arg, size_t done, size_t total), void *progress_arg,
	       struct hearth_error *err)
{
	char tmp[PATH_MAX + 32];
	if (c->cached)
		drop_parts(c);
	snprintf(tmp, sizeof tmp, "%s.%ld.part", c->path, (long)getpid());
	/* A cache directory that cannot be written fails now, not after the sampling. */
	FILE *probe = fopen(tmp, "wb");
	if (!probe)
		return hearth_error_errno(err, HEARTH_EIO, errno, "imatrix = self: cannot write %s", tmp);
	fclose(probe);
	struct load_opts lo = *o;
	lo.load_record = NULL; /* the record is the served load's, not this one's */
	struct imatrix_self_opts so = calib_self_opts(c);
	so.progress = progress;
	so.progress_arg = progress_arg;
	int rc = imatrix_self_make(model, &lo, &so, tmp, NULL, err);
	if (rc == 0 && rename(tmp, c->path) < 0)
		rc = hearth_error_errno(err, HEARTH_EIO, errno, "imatrix = self: cannot rename %s to %s", tmp, c->path);
	if (rc < 0) {
		unlink(tmp);
		return rc;
	}
	if (c->cached)
		drop_stale(c);
	return 0;
}

void calib_drop(const struct calib *c, bool even_cached)
{
	if (c->path[0] && (!c->cached || even_cached))
		unlink(c->path);
}
