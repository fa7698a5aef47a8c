/* Fixture models hearth writes itself: tests/fixtures/DIR/NAME.args holds mkmodel's
 * arguments, NAME.sha256 the file's checksum, and the .ref.txt files beside them what
 * llama.cpp computed on it (tests/fixtures/make_refs.sh). The test regenerates the model
 * (mkmodel is deterministic from its seed) instead of keeping megabytes of GGUF in git, and
 * refuses to compare against references made from other bytes. */
#ifndef HEARTH_TESTS_SUPPORT_FIXTURE_GEN_H
#define HEARTH_TESTS_SUPPORT_FIXTURE_GEN_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Where NAME.* of fixture directory dir live in the source tree. */
static inline int fixture_gen_src(char *buf, size_t cap, const char *dir, const char *file)
{
	const char *src = getenv("HEARTH_SRCDIR");
	if (!src || !*src)
		return -1;
	int n = snprintf(buf, cap, "%s/tests/fixtures/%s/%s", src, dir, file);
	return n > 0 && (size_t)n < cap ? 0 : -1;
}

/* Writes fixture dir/name into out (a path of cap bytes, in a directory made once per
 * process under $TMPDIR) unless it is already there, and checks its sha256. 0, or -1 with
 * the reason in why (cap_why bytes). Needs HEARTH_SRCDIR, HEARTH_BUILDDIR (mkmodel) and
 * HEARTH_SHARED (the vocabulary); make check sets all three. */
static inline int fixture_gen(const char *dir, const char *name, char *out, size_t cap, char *why,
			      size_t cap_why)
{
	static char tmp[256];
	const char *build = getenv("HEARTH_BUILDDIR");
	char args_path[2048], sum_path[2048], cmd[8192], args[2048], want[80] = "", got[80] = "";
	FILE *fp;

	if (!build || !getenv("HEARTH_SHARED")) {
		snprintf(why, cap_why, "HEARTH_BUILDDIR and HEARTH_SHARED must be set (make check does)");
		return -1;
	}
	if (!tmp[0]) {
		const char *t = getenv("TMPDIR");
		snprintf(tmp, sizeof tmp, "%s/hearth-fixtures-XXXXXX", t && *t ? t : "/tmp");
		if (!mkdtemp(tmp)) {
			snprintf(why, cap_why, "cannot make a directory under %s", tmp);
			tmp[0] = 0;
			return -1;
		}
	}
	snprintf(out, cap, "%s/%s.gguf", tmp, name);
	char file[256];
	snprintf(file, sizeof file, "%s.args", name);
	if (fixture_gen_src(args_path, sizeof args_path, dir, file) < 0) {
		snprintf(why, cap_why, "HEARTH_SRCDIR is not set (make check sets it)");
		return -1;
	}
	snprintf(file, sizeof file, "%s.sha256", name);
	fixture_gen_src(sum_path, sizeof sum_path, dir, file);
	if (!(fp = fopen(args_path, "r")) || !fgets(args, sizeof args, fp)) {
		snprintf(why, cap_why, "cannot read %.400s", args_path);
		if (fp)
			fclose(fp);
		return -1;
	}
	fclose(fp);
	args[strcspn(args, "\n")] = 0;
	if (access(out, R_OK) != 0) {
		/* the arguments name $HEARTH_SHARED: the shell expands it */
		snprintf(cmd, sizeof cmd, "'%s/tests/mkmodel' -o '%s' %s >/dev/null", build, out, args);
		if (system(cmd) != 0) {
			snprintf(why, cap_why, "mkmodel failed: %.200s", cmd);
			return -1;
		}
	}
	if ((fp = fopen(sum_path, "r"))) {
		if (!fgets(want, sizeof want, fp))
			want[0] = 0;
		fclose(fp);
	}
	snprintf(cmd, sizeof cmd, "sha256sum '%s'", out);
	if ((fp = popen(cmd, "r"))) {
		if (!fgets(got, sizeof got, fp))
			got[0] = 0;
		pclose(fp);
	}
	if (strlen(want) < 64 || strncmp(want, got, 64) != 0) {
		snprintf(why, cap_why, "%.200s has sha256 %.64s, the references were made from %.64s: "
			 "mkmodel changed; regenerate them (tests/fixtures/make_refs.sh %s)", out, got,
			 want, dir);
		return -1;
	}
	return 0;
}

#endif
