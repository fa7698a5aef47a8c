/* llama.cpp's imatrix files as column weights for the int4 packer: the file is mapped
 * once, every statistic validated before a weight is handed out, and the weights point
 * into the mapping, so a load holds nothing but the map while it repacks. */
#include "daemon/engine/imatrix.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/engine/gguf.h"

#define IMATRIX_SUM2 ".in_sum2"
#define IMATRIX_COUNTS ".counts"
#define IMATRIX_NAME_MAX 256

struct imatrix {
	struct gguf_file *file;
	size_t n_entries, n_covs;
};

static bool str_ends(const struct gguf_str *s, const char *suffix)
{
	size_t n = strlen(suffix);
	return s->len >= n && memcmp(s->ptr + s->len - n, suffix, n) == 0;
}

/* Every value finite and >= 0: a NaN or negative square sum would steer the scale search
 * anywhere, so a file holding one is refused rather than trusted. */
static int check_values(const struct gguf_file *f, const struct gguf_tensor *t, struct hearth_error *err)
{
	const float *v = t->data;
	for (uint64_t i = 0; i < t->n_elems; i++)
		if (!(v[i] >= 0.0f) || !isfinite(v[i]))
			return hearth_error_set(err, HEARTH_EFORMAT, "imatrix %s: %.*s[%llu] is %g (sums of squares are finite and >= 0)",
						f->path, (int)t->name.len, t->name.ptr, (unsigned long long)i, (double)v[i]);
	return 0;
}

/* name + suffix as a C string in buf; false when it does not fit. */
static bool entry_name(char *buf, const char *name, size_t len, const char *suffix)
{
	size_t n = strlen(suffix);
	if (len + n + 1 > IMATRIX_NAME_MAX)
		return false;
	memcpy(buf, name, len);
	memcpy(buf + len, suffix, n + 1);
	return true;
}

/* NAME.in_sum2 and its NAME.counts: F32, counts one value per expert, in_sum2 that many rows. */
static int check_entry(const struct gguf_file *f, const struct gguf_tensor *sum2, bool values, struct hearth_error *err)
{
	char name[IMATRIX_NAME_MAX];
	size_t base = (size_t)(sum2->name.len - strlen(IMATRIX_SUM2));
	const struct gguf_tensor *counts =
		entry_name(name, sum2->name.ptr, base, IMATRIX_COUNTS) ? gguf_tensor_find(f, name) : NULL;
	if (sum2->type != QTYPE_F32 || sum2->n_dims > 2)
		return hearth_error_set(err, HEARTH_EFORMAT, "imatrix %s: %.*s is not an F32 matrix", f->path,
					(int)sum2->name.len, sum2->name.ptr);
	if (!counts)
		return hearth_error_set(err, HEARTH_EFORMAT, "imatrix %s: %.*s has no %.*s%s beside it", f->path,
					(int)sum2->name.len, sum2->name.ptr, (int)base, sum2->name.ptr, IMATRIX_COUNTS);
	if (counts->type != QTYPE_F32 || counts->ne[0] != 1 || counts->ne[1] != sum2->ne[1] || counts->n_dims > 2)
		return hearth_error_set(err, HEARTH_EFORMAT,
					"imatrix %s: %.*s holds %llu values for %llu experts (one per expert)", f->path,
					(int)counts->name.len, counts->name.ptr, (unsigned long long)counts->n_elems,
					(unsigned long long)sum2->ne[1]);
	if (!values)
		return 0;
	int rc = check_values(f, sum2, err);
	return rc < 0 ? rc : check_values(f, counts, err);
}

/* NAME.in_cov: F32, B x d in the blocked layout (kernels/gptq.h: row i holds its block's
 * columns, 1 <= B <= d), beside a NAME.in_sum2 of width d; every entry finite, each block
 * symmetric, the entries past d zero, the diagonal in_sum2's values (to float rounding): a
 * covariance GPTQ can trust. */
static int check_cov(const struct gguf_file *f, const struct gguf_tensor *t, bool values, struct hearth_error *err)
{
	char name[IMATRIX_NAME_MAX];
	size_t base = (size_t)(t->name.len - strlen(IMATRIX_COV));
	const struct gguf_tensor *sum2 = entry_name(name, t->name.ptr, base, IMATRIX_SUM2) ? gguf_tensor_find(f, name)
											   : NULL;
	if (t->type != QTYPE_F32 || t->n_dims != 2)
		return hearth_error_set(err, HEARTH_EFORMAT, "imatrix %s: %.*s is not an F32 matrix", f->path,
					(int)t->name.len, t->name.ptr);
	if (!sum2 || sum2->ne[0] != t->ne[1])
		return hearth_error_set(err, HEARTH_EFORMAT, "imatrix %s: %.*s has no %.*s%s of its width beside it",
					f->path, (int)t->name.len, t->name.ptr, (int)base, t->name.ptr, IMATRIX_SUM2);
	size_t d = (size_t)t->ne[1], nb = (size_t)t->ne[0];
	if (nb == 0 || nb > d)
		return hearth_error_set(err, HEARTH_EFORMAT, "imatrix %s: %.*s has blocks of %zu columns for %zu (1 to %zu)",
					f->path, (int)t->name.len, t->name.ptr, nb, d, d);
	if (!values)
		return 0;
	const float *h = t->data, *diag = sum2->data;
	for (size_t i = 0; i < d; i++) {
		size_t bs = i / nb * nb;
		const float *hi = h + i * nb - bs; /* hi[j]: H[i][j] for j in i's block */
		if (!(fabsf(hi[i] - diag[i]) <= 1e-3f * diag[i] + 1e-30f))
			return hearth_error_set(err, HEARTH_EFORMAT, "imatrix %s: %.*s[%zu][%zu] is %g, its in_sum2 says %g",
						f->path, (int)t->name.len, t->name.ptr, i, i, (double)hi[i], (double)diag[i]);
		for (size_t j = bs; j < bs + nb; j++) {
			float v = hi[j];
			if (j >= d ? v != 0.0f : !isfinite(v))
				return hearth_error_set(err, HEARTH_EFORMAT, "imatrix %s: %.*s[%zu][%zu] is %g (%s)", f->path,
							(int)t->name.len, t->name.ptr, i, j, (double)v,
							j >= d ? "past the last column: 0" : "a covariance is finite");
			float vt = j > i && j < d ? h[j * nb + (i - bs)] : v; /* H[j][i] */
			if (v != vt)
				return hearth_error_set(err, HEARTH_EFORMAT,
							"imatrix %s: %.*s[%zu][%zu] is %g, [%zu][%zu] %g (a covariance is symmetric)",
							f->path, (int)t->name.len, t->name.ptr, i, j, (double)v, j, i, (double)vt);
		}
	}
	return 0;
}

/* A legacy imatrix starts with its entry count, not GGUF's magic: say how to convert it. */
static bool is_gguf(const char *path)
{
	char magic[4] = { 0 };
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return true; /* gguf_open names the open error */
	ssize_t n = read(fd, magic, sizeof magic);
	close(fd);
	return n != (ssize_t)sizeof magic || memcmp(magic, "GGUF", 4) == 0;
}

/* Every tensor's structure, and with values its values. */
static int imatrix_scan(struct imatrix *im, bool values, struct hearth_error *err)
{
	const struct gguf_file *f = im->file;
	int rc;
	im->n_entries = im->n_covs = 0;
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		if (str_ends(&t->name, IMATRIX_SUM2)) {
			if ((rc = check_entry(f, t, values, err)) < 0)
				return rc;
			im->n_entries++;
		} else if (str_ends(&t->name, IMATRIX_COV)) {
			if ((rc = check_cov(f, t, values, err)) < 0)
				return rc;
			/* Checked now, factored later: not in this process in between (the page
			 * cache keeps them for the factoring, or gives them up under pressure). */
			if (values)
				gguf_release(f, t->data, (const uint8_t *)t->data + t->size, false, true);
			im->n_covs++;
		} else if (!str_ends(&t->name, IMATRIX_COUNTS)) {
			return hearth_error_set(err, HEARTH_EFORMAT, "imatrix %s: tensor %.*s is neither NAME%s, NAME%s nor NAME%s",
						f->path, (int)t->name.len, t->name.ptr, IMATRIX_SUM2, IMATRIX_COUNTS,
						IMATRIX_COV);
		}
	}
	return 0;
}

int imatrix_check(struct imatrix *im, struct hearth_error *err)
{
	return imatrix_scan(im, true, err);
}

static int imatrix_open_as(struct imatrix **out, const char *path, bool values, struct hearth_error *err)
{
	*out = NULL;
	if (!is_gguf(path))
		return hearth_error_set(err, HEARTH_EFORMAT,
					"imatrix %s: not a GGUF file; a legacy .dat imatrix converts with "
					"`llama-imatrix -m MODEL.gguf --in-file %s -o FILE.gguf`", path, path);
	struct imatrix *im = calloc(1, sizeof *im);
	if (!im)
		return hearth_error_set(err, HEARTH_ENOMEM, "imatrix %s: out of memory", path);
	int rc = gguf_open(&im->file, path, err);
	if (rc < 0) {
		hearth_error_prefix(err, "imatrix");
		free(im);
		return rc;
	}
	const struct gguf_file *f = im->file;
	const struct gguf_kv *type = gguf_kv_find(f, "general.type");
	if (type && (type->type != GGUF_VT_STRING || type->str.len != 7 || memcmp(type->str.ptr, "imatrix", 7))) {
		rc = hearth_error_set(err, HEARTH_EFORMAT, "imatrix %s: general.type is not 'imatrix' (a model file?)", path);
		goto fail;
	}
	if (!type && gguf_kv_find(f, "general.architecture")) {
		rc = hearth_error_set(err, HEARTH_EFORMAT, "imatrix %s: a model file, not an imatrix", path);
		goto fail;
	}
	if ((rc = imatrix_scan(im, values, err)) < 0)
		goto fail;
	if (im->n_entries == 0) {
		rc = hearth_error_set(err, HEARTH_EFORMAT, "imatrix %s: holds no statistics (no NAME%s tensor)", path,
				      IMATRIX_SUM2);
		goto fail;
	}
	*out = im;
	return 0;
fail:
	imatrix_close(im);
	return rc;
}

int imatrix_open(struct imatrix **out, const char *path, struct hearth_error *err)
{
	return imatrix_open_as(out, path, true, err);
}

int imatrix_open_shapes(struct imatrix **out, const char *path, struct hearth_error *err)
{
	return imatrix_open_as(out, path, false, err);
}

void imatrix_close(struct imatrix *im)
{
	if (!im)
		return;
	gguf_close(im->file);
	free(im);
}

size_t imatrix_entries(const struct imatrix *im)
{
	return im->n_entries;
}

int imatrix_weights(const struct imatrix *im, const char *name, size_t name_len, size_t cols,
		    const float **w, struct hearth_error *err)
{
	char buf[IMATRIX_NAME_MAX];
	*w = NULL;
	const struct gguf_tensor *t = entry_name(buf, name, name_len, IMATRIX_SUM2) ? gguf_tensor_find(im->file, buf)
										     : NULL;
	if (!t)
		return 0;
	if (t->ne[1] != 1)
		return hearth_error_set(err, HEARTH_EINVAL, "imatrix %s: %.*s holds %llu experts' statistics; the model's matrix is dense",
					im->file->path, (int)name_len, name, (unsigned long long)t->ne[1]);
	if (t->ne[0] != cols)
		return hearth_error_set(err, HEARTH_EINVAL,
					"imatrix %s: %.*s has statistics for %llu columns, the model's matrix has %zu (an imatrix of another model?)",
					im->file->path, (int)name_len, name, (unsigned long long)t->ne[0], cols);
	*w = t->data;
	return 0;
}

size_t imatrix_covs(const struct imatrix *im)
{
	return im->n_covs;
}

bool imatrix_cov_shared(const char *name, char *owner, size_t owner_cap)
{
	static const char *const shared[][2] = {
		{ ".attn_k.weight", ".attn_q.weight" },
		{ ".attn_v.weight", ".attn_q.weight" },
		{ ".ffn_up.weight", ".ffn_gate.weight" },
	};
	size_t len = strlen(name);
	for (size_t i = 0; i < sizeof shared / sizeof shared[0]; i++) {
		size_t n = strlen(shared[i][0]);
		if (len <= n || memcmp(name + len - n, shared[i][0], n))
			continue;
		if (owner_cap) {
			if (len - n + strlen(shared[i][1]) + 1 > owner_cap)
				return false;
			memcpy(owner, name, len - n);
			strcpy(owner + len - n, shared[i][1]);
		}
		return true;
	}
	return false;
}

int imatrix_cov(const struct imatrix *im, const char *name, size_t name_len, size_t cols, struct imatrix_cov *out,
		struct hearth_error *err)
{
	char own[IMATRIX_NAME_MAX], owner[IMATRIX_NAME_MAX], buf[IMATRIX_NAME_MAX];
	*out = (struct imatrix_cov){ .h = NULL };
	if (name_len >= sizeof own)
		return 0;
	memcpy(own, name, name_len);
	own[name_len] = '\0';
	const char *key = imatrix_cov_shared(own, owner, sizeof owner) ? owner : own;
	const struct gguf_tensor *t = entry_name(buf, key, strlen(key), IMATRIX_COV) ? gguf_tensor_find(im->file, buf)
										      : NULL;
	if (!t)
		return 0;
	if (t->ne[1] != cols)
		return hearth_error_set(err, HEARTH_EINVAL,
					"imatrix %s: %s covers %llu columns, the model's %.*s has %zu (an imatrix of another model?)",
					im->file->path, buf, (unsigned long long)t->ne[1], (int)name_len, name, cols);
	/* check_cov found its in_sum2, and check_entry that one's counts */
	const struct gguf_tensor *counts = entry_name(buf, key, strlen(key), IMATRIX_COUNTS)
						   ? gguf_tensor_find(im->file, buf)
						   : NULL;
	out->h = t->data;
	out->block = (size_t)t->ne[0];
	out->tokens = counts ? (double)((const float *)counts->data)[0] : 0.0;
	return 0;
}

void imatrix_release(const struct imatrix *im, const struct imatrix_cov *cov, size_t cols)
{
	if (cov->h)
		gguf_release(im->file, cov->h, cov->h + cols * cov->block, false, false);
}
