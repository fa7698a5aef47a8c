/* `imatrix = self`: locating, making and dropping a model's self-calibration file. The name
 * carries a hash of the model file's identity and one of the settings, so a changed model
 * or setting finds no file and makes a new one instead of reading a stale one. */
#include "daemon/serve/calib.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/engine/imatrix.h"
#include "daemon/engine/load.h"
#include "daemon/engine/memstat.h"
#include "daemon/serve/cache_dir.h"
#include "daemon/serve/config.h"
#include "protocol/hash.h"

/* Bumped when the file made for the same model and settings would differ (the sampler, the
 * collector, the file's contents): old caches then miss instead of being read. */
#define CALIB_FORMAT 3u /* 2: the head's input too; 3: sampled on W4A8 */
#define CALIB_SUFFIX ".imatrix.gguf"

int calib_locate(struct calib *c, const struct hearth_config *cfg, const struct load_opts *o,
		 struct hearth_error *err)
{
	memset(c, 0, sizeof *c);
	int rc = cache_dir_locate(&c->where, cfg->imatrix_cache, cfg->model, "imatrix = self", err);
	if (rc < 0)
		return rc;
	c->n_seqs = cfg->imatrix_samples;
	c->len = CALIB_LEN < o->max_context ? CALIB_LEN : o->max_context;
	uint64_t settings[] = { CALIB_FORMAT, c->n_seqs, c->len, CALIB_SEED, IMATRIX_COV_BLOCK_DEFAULT,
				o->weights_group, o->head_bits, o->mix, o->mix_budget_cbpw };
	uint64_t sh = hearth_fnv1a(HEARTH_FNV1A_SEED, settings, sizeof settings);
	if (!c->where.dir[0])
		return calib_temporary(c, err);
	c->cached = true;
	if (snprintf(c->path, sizeof c->path, "%s/%s-%016llx" CALIB_SUFFIX, c->where.dir, c->where.stem,
		     (unsigned long long)sh) >= (int)sizeof c->path)
		return hearth_error_set(err, HEARTH_ERANGE, "imatrix_cache: %s: path too long", c->where.dir);
	return 0;
}

int calib_temporary(struct calib *c, struct hearth_error *err)
{
	const char *tmp = getenv("TMPDIR");
	if (!tmp || !tmp[0])
		tmp = "/var/tmp";
	c->cached = false;
	if (snprintf(c->path, sizeof c->path, "%s/hearth-%s-%ld.imatrix.gguf", tmp, c->where.stem, (long)getpid()) >=
	    (int)sizeof c->path)
		return hearth_error_set(err, HEARTH_ERANGE, "imatrix = self: TMPDIR %s: path too long", tmp);
	return 0;
}

bool calib_ready(const struct calib *c)
{
	return c->cached && access(c->path, R_OK) == 0;
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
		cache_dir_drop_parts(c->path);
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
	if (c->cached) /* "<model file>-<model hash>" then "-<settings hash>.imatrix.gguf" */
		cache_dir_drop_stale(&c->where, 1 + 16 + strlen(CALIB_SUFFIX), CALIB_SUFFIX);
	return 0;
}

void calib_drop(const struct calib *c, bool even_cached)
{
	if (c->path[0] && (!c->cached || even_cached))
		unlink(c->path);
}

/* What the machine must keep free beside a calibration's plan (the sampling's own
 * bookkeeping, the tokenizer, the page cache the files pass through). */
#define CALIB_MARGIN ((uint64_t)256 << 20)

bool calib_wanted(const struct hearth_config *cfg, const struct load_opts *o, char *why, size_t cap)
{
	char scratch[HEARTH_ERROR_MSG_MAX];
	if (!why) {
		why = scratch;
		cap = sizeof scratch;
	}
	why[0] = '\0';
	if (!strcmp(cfg->imatrix, CONFIG_IMATRIX_SELF))
		return true;
	if (strcmp(cfg->imatrix, CONFIG_IMATRIX_AUTO))
		return false;
	struct hearth_error e;
	struct cache_dir wd;
	if (cache_dir_weights(&wd, cfg->weights_cache, cfg->model, why, cap) <= 0)
		return false; /* every start would round the model by GPTQ again */
	struct calib c;
	if (calib_locate(&c, cfg, o, &e) < 0) {
		snprintf(why, cap, "%s", e.msg);
		return false;
	}
	if (!c.cached) {
		snprintf(why, cap, "no directory to keep its calibration in (imatrix_cache, $CACHE_DIRECTORY)");
		return false;
	}
	if (calib_ready(&c))
		return true;
	if (access(c.where.dir, W_OK) < 0) {
		snprintf(why, cap, "cannot write %s: %s", c.where.dir, strerror(errno));
		return false;
	}
	uint64_t need, avail;
	if (calib_plan(&c, cfg->model, o, &need, &e) < 0 || memstat_mem_available(&avail, &e) < 0) {
		snprintf(why, cap, "%s", e.msg);
		return false;
	}
	if (need + CALIB_MARGIN > avail) {
		snprintf(why, cap, "its calibration plans %llu MiB and %llu MiB are available",
			 (unsigned long long)((need + CALIB_MARGIN) >> 20), (unsigned long long)(avail >> 20));
		return false;
	}
	return true;
}
