/* `imatrix = self`: the file a self-calibrated load reads. Made once per model file and
 * calibration settings by sampling the model itself, kept in a cache directory so later
 * starts only read it. */
#ifndef HEARTH_SERVE_CALIB_H
#define HEARTH_SERVE_CALIB_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/serve/cache_dir.h"
#include "protocol/error.h"

struct hearth_config;
struct load_opts;

#define CALIB_LEN 256u  /* tokens a sampled sequence (fewer when max_context is less) */
#define CALIB_SEED 1u   /* sequence i's sampler seed is CALIB_SEED + i */

struct calib {
	char path[PATH_MAX];       /* the imatrix file the load reads */
	struct cache_dir where;    /* the cache directory ("" when there is none) and this model's
				    * files' prefix, "<model file>-<model hash>" */
	bool cached;               /* path is in the cache (kept), else a temporary file */
	bool made;                 /* made by this start: a load that refuses it is not retried */
	size_t n_seqs, len;        /* what calib_make samples */
};

/* Where cfg's model's self-calibration lives: cfg->imatrix_cache, else $CACHE_DIRECTORY
 * (systemd's CacheDirectory=), as DIR/<model file>-<model hash>-<settings hash>.imatrix.gguf;
 * with neither, a temporary file in $TMPDIR or /var/tmp for this load only. The model hash
 * covers the file's device, inode, size and modification time; the settings hash the
 * samples, their length and seed, the covariance blocks and the int4 layout options of o. */
int calib_locate(struct calib *c, const struct hearth_config *cfg, const struct load_opts *o,
		 struct hearth_error *err);
/* c made a temporary file for this load only (a cache directory that cannot be written). */
int calib_temporary(struct calib *c, struct hearth_error *err);
/* True when c->path is a readable file already (an earlier start made it). */
bool calib_ready(const struct calib *c);
/* Samples the model as o loads it (imatrix_self_make) into c->path, through a temporary
 * name renamed into place so a crash never leaves half a file under the real name; then
 * removes this model's files made for another version of it (same file name, other model
 * hash), and this file's parts a killed daemon left. progress (may be NULL): tokens
 * sampled so far and in all; false stops it (HEARTH_ECANCELED, nothing left behind). */
int calib_make(const struct calib *c, const char *model, const struct load_opts *o,
	       bool (*progress)(void *arg, size_t done, size_t total), void *progress_arg,
	       struct hearth_error *err);
/* What calib_make will hold at its peak (the calibration load's arena and the covariance
 * sums: imatrix_self_plan), for a model swap's room check; the model and o as calib_make's. */
int calib_plan(const struct calib *c, const char *model, const struct load_opts *o, uint64_t *bytes,
	       struct hearth_error *err);
/* Whether cfg's imatrix asks a load with o to self-calibrate: "self" always; "auto" (the
 * default) when what it makes can be kept (a cache directory for the calibration, and
 * weights_cache not off with a directory of its own, so only the first start pays for the
 * sampling and for GPTQ's rounding) and either the model's calibration was made at an
 * earlier start or its plan (calib_plan) fits in what the machine has available now; else
 * why (cap bytes, may be NULL) says what kept it off. */
bool calib_wanted(const struct hearth_config *cfg, const struct load_opts *o, char *why, size_t cap);
/* Removes c->path unless it is cached: after the load, or a cached file the load refused. */
void calib_drop(const struct calib *c, bool even_cached);

#endif
