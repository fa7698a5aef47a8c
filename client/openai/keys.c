/* API keys of hearth-openai: a file of "name:key" lines (or bare keys, named key1, key2...),
 * checked against `Authorization: Bearer KEY` in constant time over every key, so a reply's
 * timing says nothing about how much of a guess was right, nor which key it was close to. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "client/openai/gw.h"

int gw_keys_load(struct gw *g, const char *path, char *msg, size_t cap)
{
	FILE *f = fopen(path, "re");
	if (!f) {
		snprintf(msg, cap, "%s: %s", path, strerror(errno));
		return -1;
	}
	struct stat st;
	if (fstat(fileno(f), &st) == 0 && (st.st_mode & 0004)) {
		snprintf(msg, cap, "%s: the key file is readable by everyone (chmod o-r)", path);
		fclose(f);
		return -1;
	}
	char line[512];
	unsigned lineno = 0;
	g->n_keys = 0;
	while (fgets(line, sizeof line, f)) {
		lineno++;
		size_t n = strcspn(line, "\r\n");
		if (line[n] == 0 && !feof(f)) {
			snprintf(msg, cap, "%s:%u: line longer than %zu bytes", path, lineno, sizeof line - 2);
			fclose(f);
			return -1;
		}
		line[n] = 0;
		char *s = line;
		while (*s == ' ' || *s == '\t')
			s++;
		if (!*s || *s == '#')
			continue;
		if (g->n_keys == GW_KEYS_MAX) {
			snprintf(msg, cap, "%s:%u: more than %d keys", path, lineno, GW_KEYS_MAX);
			fclose(f);
			return -1;
		}
		struct gw_key *k = &g->keys[g->n_keys];
		char *colon = strchr(s, ':');
		const char *key = colon ? colon + 1 : s;
		if (colon) {
			*colon = 0;
			if (!*s || strlen(s) >= sizeof k->name) {
				snprintf(msg, cap, "%s:%u: a key name must be 1..%zu bytes", path, lineno, sizeof k->name - 1);
				fclose(f);
				return -1;
			}
			snprintf(k->name, sizeof k->name, "%s", s);
		} else {
			snprintf(k->name, sizeof k->name, "key%zu", g->n_keys + 1);
		}
		k->len = strlen(key);
		if (k->len < 8 || k->len >= sizeof k->key) {
			snprintf(msg, cap, "%s:%u: a key must be 8..%zu bytes", path, lineno, sizeof k->key - 1);
			fclose(f);
			return -1;
		}
		memcpy(k->key, key, k->len + 1);
		g->n_keys++;
	}
	fclose(f);
	if (!g->n_keys) {
		snprintf(msg, cap, "%s: no keys", path);
		return -1;
	}
	return 0;
}

/* Equal length and bytes, with time that depends only on the key's length. */
static int ct_equal(const char *a, size_t alen, const struct gw_key *k)
{
	unsigned char d = (unsigned char)(alen != k->len);
	for (size_t i = 0; i < k->len; i++)
		d |= (unsigned char)(k->key[i] ^ (i < alen ? a[i] : 0));
	return d == 0;
}

const char *gw_keys_check(const struct gw *g, const char *auth)
{
	if (strncmp(auth, "Bearer ", 7))
		return NULL;
	const char *tok = auth + 7;
	size_t len = strlen(tok);
	const char *found = NULL;
	for (size_t i = 0; i < g->n_keys; i++)
		if (ct_equal(tok, len, &g->keys[i]) && !found)
			found = g->keys[i].name;
	return found;
}
