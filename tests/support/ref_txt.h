/* llama.cpp's references in the fixtures' NAME.ref.txt format (fixtures/README.md): two token
 * sequences, per position the mean and rms of all logits and the 16 highest, then 24 greedy
 * tokens; parsed with every field checked, so a misread file fails loudly. Include after
 * cmocka.h. */
#ifndef HEARTH_TESTS_SUPPORT_REF_TXT_H
#define HEARTH_TESTS_SUPPORT_REF_TXT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REF_MAX_IDS 64
#define REF_TOP 16
#define REF_GREEDY 24

struct ref_pos {
	double mean, rms;
	int32_t top_id[REF_TOP];
	double top_logit[REF_TOP];
};

struct ref_seq {
	size_t n;
	int32_t ids[REF_MAX_IDS];
	struct ref_pos pos[REF_MAX_IDS];
	int32_t greedy[REF_GREEDY];
};

struct ref {
	struct ref_seq seq[2];
};

/* Parses the .ref.txt at path: "seq X ids a,b,...", "pos P mean M rms R top16 id:logit ...",
 * "greedy t t ...". Every field is checked, so a misread file fails loudly. */
static inline void ref_parse(const char *path, struct ref *r)
{
	char line[8192];
	FILE *fp;
	int s = -1;

	memset(r, 0, sizeof(*r));
	fp = fopen(path, "r");
	if (!fp)
		fail_msg("cannot open %s", path);
	while (fgets(line, sizeof(line), fp)) {
		char *p = line, *end;

		if (line[0] == '#' || line[0] == '\n')
			continue;
		if (strncmp(line, "seq ", 4) == 0) {
			s++;
			assert_true(s < 2);
			p = strstr(line, " ids ");
			assert_non_null(p);
			p += 5;
			while (*p && *p != '\n') {
				long v = strtol(p, &end, 10);
				assert_true(end != p);
				assert_true(r->seq[s].n < REF_MAX_IDS);
				r->seq[s].ids[r->seq[s].n++] = (int32_t)v;
				p = *end == ',' ? end + 1 : end;
			}
		} else if (strncmp(line, "pos ", 4) == 0) {
			long pos = strtol(line + 4, &end, 10);
			struct ref_pos *rp;

			assert_true(s >= 0 && pos >= 0 && (size_t)pos < r->seq[s].n);
			rp = &r->seq[s].pos[pos];
			assert_int_equal(sscanf(end, " mean %lf rms %lf", &rp->mean, &rp->rms), 2);
			p = strstr(end, "top16 ");
			assert_non_null(p);
			p += 6;
			for (int i = 0; i < REF_TOP; i++) {
				rp->top_id[i] = (int32_t)strtol(p, &end, 10);
				assert_true(end != p && *end == ':');
				p = end + 1;
				rp->top_logit[i] = strtod(p, &end);
				assert_true(end != p);
				p = end;
			}
		} else if (strncmp(line, "greedy ", 7) == 0) {
			p = line + 7;
			for (int i = 0; i < REF_GREEDY; i++) {
				r->seq[s].greedy[i] = (int32_t)strtol(p, &end, 10);
				assert_true(end != p);
				p = end;
			}
		} else {
			fail_msg("%s: unexpected line: %.40s", path, line);
		}
	}
	fclose(fp);
	assert_int_equal(s, 1);
}

#endif
