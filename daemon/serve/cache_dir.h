/* The directory hearthd keeps files in from one start to the next (imatrix = self's
 * calibration, the packed weights), and how a model's files there are named and tidied:
 * each name starts "<model file>-<hash of its identity>", so a changed model file finds
 * none of its old files and they are removed when its new ones are made. */
#ifndef HEARTH_SERVE_CACHE_DIR_H
#define HEARTH_SERVE_CACHE_DIR_H

#include <limits.h>
#include <stddef.h>

#include "protocol/error.h"

struct cache_dir {
	char dir[PATH_MAX];        /* "" when there is none */
	char stem[PATH_MAX];       /* "<model file>-<model hash>" */
};

/* configured, else $CACHE_DIRECTORY (systemd's CacheDirectory=; the first of several), else
 * none; the stem of model's files: its file name (without .gguf, at most 128 bytes) and a
 * hash of its device, inode, size and modification time. what names the key in errors. */
int cache_dir_locate(struct cache_dir *cd, const char *configured, const char *model, const char *what,
		     struct hearth_error *err);
/* Where weights_cache (configured: a directory, "off", or "" for $CACHE_DIRECTORY) keeps
 * model's packed weights: 1 with cd filled; 0 when they are not kept (off, no directory),
 * why (cap bytes) saying so; a negative code when the model file cannot be located, why
 * the error. */
int cache_dir_weights(struct cache_dir *cd, const char *configured, const char *model, char *why, size_t cap);
/* Removes this model file's earlier versions' files of one kind: in cd->dir, names of
 * "<model file>-<16 hex digits>" and then rest_len bytes ending in suffix, whose hash is not
 * cd->stem's. */
void cache_dir_drop_stale(const struct cache_dir *cd, size_t rest_len, const char *suffix);
/* Removes path's parts (path.<pid>.part) left by daemons that died making it. */
void cache_dir_drop_parts(const char *path);

#endif
