/* A model's files in hearthd's cache directory: where they are, what they are named, and
 * removing the ones a changed model file or a killed daemon left behind. */
#include "daemon/serve/cache_dir.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/serve/config.h"
#include "protocol/hash.h"

#define CACHE_HASH_DIGITS 16

int cache_dir_locate(struct cache_dir *cd, const char *configured, const char *model, const char *what,
		     struct hearth_error *err)
{
	struct stat st;
	memset(cd, 0, sizeof *cd);
	if (stat(model, &st) < 0)
		return hearth_error_errno(err, HEARTH_EIO, errno, "%s: cannot stat %s", what, model);
	uint64_t ident[] = { st.st_dev, st.st_ino, (uint64_t)st.st_size, (uint64_t)st.st_mtim.tv_sec,
			     (uint64_t)st.st_mtim.tv_nsec };
	uint64_t mh = hearth_fnv1a(HEARTH_FNV1A_SEED, ident, sizeof ident);
	const char *base = strrchr(model, '/');
	base = base ? base + 1 : model;
	size_t bn = strlen(base);
	if (bn > 5 && !strcmp(base + bn - 5, ".gguf"))
		bn -= 5;
	if (bn > 128)
		bn = 128;
	snprintf(cd->stem, sizeof cd->stem, "%.*s-%016llx", (int)bn, base, (unsigned long long)mh);

	const char *dir = configured && configured[0] ? configured : getenv("CACHE_DIRECTORY");
	/* systemd passes every CacheDirectory= colon-separated: the first is ours. */
	size_t dn = dir ? strcspn(dir, ":") : 0;
	if (dn >= sizeof cd->dir)
		return hearth_error_set(err, HEARTH_ERANGE, "%s: path longer than %zu bytes", what, sizeof cd->dir - 1);
	memcpy(cd->dir, dir, dn);
	cd->dir[dn] = '\0';
	return 0;
}

int cache_dir_weights(struct cache_dir *cd, const char *configured, const char *model, char *why, size_t cap)
{
	struct hearth_error e;
	if (!strcmp(configured, CONFIG_WEIGHTS_CACHE_OFF)) {
		memset(cd, 0, sizeof *cd);
		snprintf(why, cap, "weights_cache = off");
		return 0;
	}
	int rc = cache_dir_locate(cd, configured, model, "weights_cache", &e);
	if (rc < 0) {
		snprintf(why, cap, "%s", e.msg);
		return rc;
	}
	if (!cd->dir[0]) {
		snprintf(why, cap, "no directory to keep the rounded weights in (weights_cache, $CACHE_DIRECTORY)");
		return 0;
	}
	return 1;
}

void cache_dir_drop_stale(const struct cache_dir *cd, size_t rest_len, const char *suffix)
{
	DIR *d = cd->dir[0] ? opendir(cd->dir) : NULL;
	if (!d)
		return;
	const char *dash = strrchr(cd->stem, '-');
	size_t keep = (size_t)(dash - cd->stem) + 1; /* "<model file>-" */
	size_t sn = strlen(suffix);
	struct dirent *e;
	while ((e = readdir(d))) {
		size_t n = strlen(e->d_name);
		if (n != keep + CACHE_HASH_DIGITS + rest_len || rest_len < sn || strncmp(e->d_name, cd->stem, keep) ||
		    strcmp(e->d_name + n - sn, suffix) || !strncmp(e->d_name, cd->stem, keep + CACHE_HASH_DIGITS))
			continue;
		char p[PATH_MAX];
		if (snprintf(p, sizeof p, "%s/%s", cd->dir, e->d_name) < (int)sizeof p)
			unlink(p);
	}
	closedir(d);
}

void cache_dir_drop_parts(const char *path)
{
	const char *slash = strrchr(path, '/');
	if (!slash)
		return;
	char dir[PATH_MAX];
	snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
	DIR *d = opendir(dir[0] ? dir : "/");
	if (!d)
		return;
	const char *base = slash + 1;
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
		if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) < (int)sizeof p)
			unlink(p);
	}
	closedir(d);
}
