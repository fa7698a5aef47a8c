/* GGUF writer for tests and tools. Metadata is encoded into one byte buffer as it is added;
 * tensor infos are kept as structs and laid out when the header is written; tensor data is
 * never held here: the caller streams it in, tensor by tensor. */
#include "tests/support/gguf_build.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define BUILD_MAX_RAW_DIMS 8

struct build_tensor {
	char *name;
	uint32_t type;
	uint32_t n_dims;
	uint64_t ne[BUILD_MAX_RAW_DIMS];
	bool raw;            /* written verbatim, no data */
	bool offset_forced;
	uint64_t offset;     /* as written in the info */
	uint64_t layout_off; /* where its data really goes, relative to the data section */
	size_t size;
};

struct gguf_build {
	uint32_t version;
	size_t alignment;
	long align_kv;       /* index of the general.alignment kv, or -1 */

	uint8_t *kv_buf;
	size_t kv_len, kv_cap;
	size_t *kv_start;    /* per kv: where its key length starts in kv_buf */
	size_t *kv_value;    /* per kv: where its value starts */
	size_t n_kv, kv_slots;

	struct build_tensor *tensors;
	size_t n_tensors, tensor_cap;

	bool header_written;
	size_t next_write;   /* the tensor whose data comes next */
	size_t part_written; /* bytes of it written so far */
};

int gguf_build_new(struct gguf_build **out, uint32_t version, struct hearth_error *err)
{
	*out = NULL;
	if (version != 2 && version != 3)
		return hearth_error_set(err, HEARTH_EINVAL, "gguf_build: version %" PRIu32 " is not 2 or 3", version);
	struct gguf_build *b = calloc(1, sizeof *b);
	if (!b)
		return hearth_error_set(err, HEARTH_ENOMEM, "gguf_build: no memory");
	b->version = version;
	b->alignment = GGUF_DEFAULT_ALIGNMENT;
	b->align_kv = -1;
	*out = b;
	return 0;
}

void gguf_build_free(struct gguf_build *b)
{
	if (!b)
		return;
	for (size_t i = 0; i < b->n_tensors; i++)
		free(b->tensors[i].name);
	free(b->tensors);
	free(b->kv_buf);
	free(b->kv_start);
	free(b->kv_value);
	free(b);
}

static int buf_put(struct gguf_build *b, const void *p, size_t n)
{
	if (n > SIZE_MAX - b->kv_len)
		return HEARTH_ERANGE;
	if (b->kv_len + n > b->kv_cap) {
		size_t cap = b->kv_cap ? b->kv_cap : 4096;
		while (cap < b->kv_len + n)
			cap *= 2;
		uint8_t *nb = realloc(b->kv_buf, cap);
		if (!nb)
			return HEARTH_ENOMEM;
		b->kv_buf = nb;
		b->kv_cap = cap;
	}
	if (n)
		memcpy(b->kv_buf + b->kv_len, p, n);
	b->kv_len += n;
	return 0;
}

static int buf_put_u32(struct gguf_build *b, uint32_t v)
{
	return buf_put(b, &v, 4);
}

static int buf_put_u64(struct gguf_build *b, uint64_t v)
{
	return buf_put(b, &v, 8);
}

static int buf_put_str(struct gguf_build *b, const char *s)
{
	size_t n = strlen(s);
	int rc = buf_put_u64(b, n);
	return rc ? rc : buf_put(b, s, n);
}

/* Starts a kv: key and type; the caller appends the value. */
static int kv_begin(struct gguf_build *b, const char *key, uint32_t type)
{
	if (!key || b->header_written)
		return HEARTH_EINVAL;
	if (b->n_kv == b->kv_slots) {
		size_t cap = b->kv_slots ? 2 * b->kv_slots : 32;
		size_t *s = realloc(b->kv_start, cap * sizeof *s);
		if (!s)
			return HEARTH_ENOMEM;
		b->kv_start = s;
		size_t *v = realloc(b->kv_value, cap * sizeof *v);
		if (!v)
			return HEARTH_ENOMEM;
		b->kv_value = v;
		b->kv_slots = cap;
	}
	size_t start = b->kv_len;
	int rc;
	if ((rc = buf_put_str(b, key)) || (rc = buf_put_u32(b, type))) {
		b->kv_len = start;
		return rc;
	}
	b->kv_start[b->n_kv] = start;
	b->kv_value[b->n_kv] = b->kv_len;
	b->n_kv++;
	return 0;
}

/* Undoes a kv whose value could not be appended. */
static int kv_abort(struct gguf_build *b, int rc)
{
	b->n_kv--;
	b->kv_len = b->kv_start[b->n_kv];
	return rc;
}

static int kv_scalar(struct gguf_build *b, const char *key, uint32_t type, const void *v, size_t n)
{
	int rc = kv_begin(b, key, type);
	if (rc)
		return rc;
	rc = buf_put(b, v, n);
	return rc ? kv_abort(b, rc) : 0;
}

int gguf_build_kv_u8(struct gguf_build *b, const char *key, uint8_t v) { return kv_scalar(b, key, GGUF_VT_UINT8, &v, 1); }
int gguf_build_kv_i8(struct gguf_build *b, const char *key, int8_t v) { return kv_scalar(b, key, GGUF_VT_INT8, &v, 1); }
int gguf_build_kv_u16(struct gguf_build *b, const char *key, uint16_t v) { return kv_scalar(b, key, GGUF_VT_UINT16, &v, 2); }
int gguf_build_kv_i16(struct gguf_build *b, const char *key, int16_t v) { return kv_scalar(b, key, GGUF_VT_INT16, &v, 2); }
int gguf_build_kv_u32(struct gguf_build *b, const char *key, uint32_t v) { return kv_scalar(b, key, GGUF_VT_UINT32, &v, 4); }
int gguf_build_kv_i32(struct gguf_build *b, const char *key, int32_t v) { return kv_scalar(b, key, GGUF_VT_INT32, &v, 4); }
int gguf_build_kv_u64(struct gguf_build *b, const char *key, uint64_t v) { return kv_scalar(b, key, GGUF_VT_UINT64, &v, 8); }
int gguf_build_kv_i64(struct gguf_build *b, const char *key, int64_t v) { return kv_scalar(b, key, GGUF_VT_INT64, &v, 8); }
int gguf_build_kv_f32(struct gguf_build *b, const char *key, float v) { return kv_scalar(b, key, GGUF_VT_FLOAT32, &v, 4); }
int gguf_build_kv_f64(struct gguf_build *b, const char *key, double v) { return kv_scalar(b, key, GGUF_VT_FLOAT64, &v, 8); }

int gguf_build_kv_bool(struct gguf_build *b, const char *key, bool v)
{
	uint8_t byte = v ? 1 : 0;
	return kv_scalar(b, key, GGUF_VT_BOOL, &byte, 1);
}

int gguf_build_kv_str(struct gguf_build *b, const char *key, const char *v)
{
	if (!v)
		return HEARTH_EINVAL;
	int rc = kv_begin(b, key, GGUF_VT_STRING);
	if (rc)
		return rc;
	rc = buf_put_str(b, v);
	return rc ? kv_abort(b, rc) : 0;
}

static size_t elem_size(enum gguf_vtype t)
{
	switch (t) {
	case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
	case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
	case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
	case GGUF_VT_UINT64: case GGUF_VT_INT64: case GGUF_VT_FLOAT64: return 8;
	default: return 0;
	}
}

int gguf_build_kv_arr(struct gguf_build *b, const char *key, enum gguf_vtype elem, const void *elems,
		      uint64_t n)
{
	size_t es = elem_size(elem);
	size_t bytes;
	if (!es || (n && !elems) || n > SIZE_MAX || __builtin_mul_overflow((size_t)n, es, &bytes))
		return HEARTH_EINVAL;
	int rc = kv_begin(b, key, GGUF_VT_ARRAY);
	if (rc)
		return rc;
	if ((rc = buf_put_u32(b, elem)) || (rc = buf_put_u64(b, n)) || (rc = buf_put(b, elems, bytes)))
		return kv_abort(b, rc);
	return 0;
}

int gguf_build_kv_arr_str(struct gguf_build *b, const char *key, const char *const *strs, uint64_t n)
{
	if (n && !strs)
		return HEARTH_EINVAL;
	int rc = kv_begin(b, key, GGUF_VT_ARRAY);
	if (rc)
		return rc;
	if ((rc = buf_put_u32(b, GGUF_VT_STRING)) || (rc = buf_put_u64(b, n)))
		return kv_abort(b, rc);
	for (uint64_t i = 0; i < n; i++) {
		if (!strs[i])
			return kv_abort(b, HEARTH_EINVAL);
		if ((rc = buf_put_str(b, strs[i])))
			return kv_abort(b, rc);
	}
	return 0;
}

int gguf_build_kv_raw(struct gguf_build *b, const char *key, uint32_t type, const void *payload,
		      size_t payload_size)
{
	if (payload_size && !payload)
		return HEARTH_EINVAL;
	return kv_scalar(b, key, type, payload, payload_size);
}

int gguf_build_set_alignment(struct gguf_build *b, size_t alignment)
{
	if (alignment == 0 || (alignment & (alignment - 1)) || alignment > UINT32_MAX || b->header_written)
		return HEARTH_EINVAL;
	uint32_t v = (uint32_t)alignment;
	if (b->align_kv >= 0) {
		memcpy(b->kv_buf + b->kv_value[b->align_kv], &v, 4);
	} else {
		int rc = gguf_build_kv_u32(b, "general.alignment", v);
		if (rc)
			return rc;
		b->align_kv = (long)b->n_kv - 1;
	}
	b->alignment = alignment;
	return 0;
}

static int tensor_add(struct gguf_build *b, const char *name, struct build_tensor **out)
{
	if (!name || b->header_written || b->n_tensors >= INT32_MAX)
		return HEARTH_EINVAL;
	if (b->n_tensors == b->tensor_cap) {
		size_t cap = b->tensor_cap ? 2 * b->tensor_cap : 64;
		struct build_tensor *t = realloc(b->tensors, cap * sizeof *t);
		if (!t)
			return HEARTH_ENOMEM;
		b->tensors = t;
		b->tensor_cap = cap;
	}
	struct build_tensor *t = &b->tensors[b->n_tensors];
	memset(t, 0, sizeof *t);
	t->name = strdup(name);
	if (!t->name)
		return HEARTH_ENOMEM;
	*out = t;
	return (int)b->n_tensors++;
}

int gguf_build_tensor(struct gguf_build *b, const char *name, enum qtype type, uint32_t n_dims,
		      const uint64_t *ne)
{
	if (n_dims == 0 || n_dims > GGUF_MAX_DIMS || !ne || !qtype_known(type))
		return HEARTH_EINVAL;
	uint64_t rows = 1;
	for (uint32_t d = 1; d < n_dims; d++)
		if (ne[d] == 0 || __builtin_mul_overflow(rows, ne[d], &rows))
			return HEARTH_EINVAL;
	size_t row, size;
	if (ne[0] == 0 || !qtype_row_bytes(type, ne[0], &row) || rows > SIZE_MAX ||
	    __builtin_mul_overflow(row, (size_t)rows, &size))
		return HEARTH_EINVAL;
	struct build_tensor *t;
	int idx = tensor_add(b, name, &t);
	if (idx < 0)
		return idx;
	t->type = type;
	t->n_dims = n_dims;
	for (uint32_t d = 0; d < n_dims; d++)
		t->ne[d] = ne[d];
	t->size = size;
	return idx;
}

int gguf_build_tensor_raw(struct gguf_build *b, const char *name, uint32_t type, uint32_t n_dims,
			  const uint64_t *ne, uint64_t offset)
{
	if (n_dims > BUILD_MAX_RAW_DIMS || (n_dims && !ne))
		return HEARTH_EINVAL;
	struct build_tensor *t;
	int idx = tensor_add(b, name, &t);
	if (idx < 0)
		return idx;
	t->raw = true;
	t->type = type;
	t->n_dims = n_dims;
	for (uint32_t d = 0; d < n_dims; d++)
		t->ne[d] = ne[d];
	t->offset = offset;
	t->offset_forced = true;
	return idx;
}

int gguf_build_tensor_set_offset(struct gguf_build *b, int index, uint64_t offset)
{
	if (index < 0 || (size_t)index >= b->n_tensors || b->header_written)
		return HEARTH_EINVAL;
	b->tensors[index].offset = offset;
	b->tensors[index].offset_forced = true;
	return 0;
}

int gguf_build_n_tensors(const struct gguf_build *b)
{
	return (int)b->n_tensors;
}

size_t gguf_build_tensor_size(const struct gguf_build *b, int index)
{
	if (index < 0 || (size_t)index >= b->n_tensors || b->tensors[index].raw)
		return 0;
	return b->tensors[index].size;
}

static uint64_t align_up(uint64_t x, size_t a)
{
	return (x + a - 1) / a * a;
}

/* Data offsets follow the declaration order, each tensor padded to the alignment; computed
 * on demand because the alignment may be set after tensors are declared. Returns the size
 * of the data section. */
static uint64_t layout(const struct gguf_build *b)
{
	struct gguf_build *mb = (struct gguf_build *)b;
	uint64_t off = 0;
	for (size_t i = 0; i < b->n_tensors; i++) {
		struct build_tensor *t = &mb->tensors[i];
		if (t->raw)
			continue;
		t->layout_off = off;
		if (!t->offset_forced)
			t->offset = off;
		off = align_up(off + t->size, b->alignment);
	}
	return off;
}

static uint64_t info_bytes(const struct build_tensor *t)
{
	return 8 + strlen(t->name) + 4 + 8 * (uint64_t)t->n_dims + 4 + 8;
}

uint64_t gguf_build_kv_offset(const struct gguf_build *b, int kv_index)
{
	if (kv_index < 0 || (size_t)kv_index >= b->n_kv)
		return 0;
	return 24 + b->kv_start[kv_index];
}

uint64_t gguf_build_kv_value_offset(const struct gguf_build *b, int kv_index)
{
	if (kv_index < 0 || (size_t)kv_index >= b->n_kv)
		return 0;
	return 24 + b->kv_value[kv_index];
}

uint64_t gguf_build_tensor_field_offset(const struct gguf_build *b, int index, enum gguf_build_field field)
{
	if (index < 0 || (size_t)index >= b->n_tensors)
		return 0;
	uint64_t off = 24 + b->kv_len;
	for (int i = 0; i < index; i++)
		off += info_bytes(&b->tensors[i]);
	const struct build_tensor *t = &b->tensors[index];
	uint64_t dims = off + 8 + strlen(t->name);
	switch (field) {
	case GGUF_BUILD_FIELD_NAME: return off;
	case GGUF_BUILD_FIELD_N_DIMS: return dims;
	case GGUF_BUILD_FIELD_NE0: return dims + 4;
	case GGUF_BUILD_FIELD_TYPE: return dims + 4 + 8 * (uint64_t)t->n_dims;
	case GGUF_BUILD_FIELD_OFFSET: return dims + 4 + 8 * (uint64_t)t->n_dims + 4;
	}
	return 0;
}

uint64_t gguf_build_infos_end(const struct gguf_build *b)
{
	uint64_t off = 24 + b->kv_len;
	for (size_t i = 0; i < b->n_tensors; i++)
		off += info_bytes(&b->tensors[i]);
	return off;
}

uint64_t gguf_build_data_offset(const struct gguf_build *b)
{
	return align_up(gguf_build_infos_end(b), b->alignment);
}

uint64_t gguf_build_tensor_data_offset(const struct gguf_build *b, int index)
{
	if (index < 0 || (size_t)index >= b->n_tensors || b->tensors[index].raw)
		return 0;
	layout(b);
	return gguf_build_data_offset(b) + b->tensors[index].layout_off;
}

uint64_t gguf_build_file_size(const struct gguf_build *b)
{
	return gguf_build_data_offset(b) + layout(b);
}

static int put(FILE *fp, const void *p, size_t n, struct hearth_error *err, const char *what)
{
	if (n && fwrite(p, 1, n, fp) != n)
		return hearth_error_set(err, HEARTH_EIO, "gguf_build: writing %s failed", what);
	return 0;
}

static int put_zeros(FILE *fp, uint64_t n, struct hearth_error *err)
{
	static const uint8_t zeros[256];
	while (n) {
		size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
		int rc = put(fp, zeros, k, err, "padding");
		if (rc)
			return rc;
		n -= k;
	}
	return 0;
}

int gguf_build_write_header(struct gguf_build *b, FILE *fp, struct hearth_error *err)
{
	if (b->header_written)
		return hearth_error_set(err, HEARTH_EINVAL, "gguf_build: header already written");
	layout(b);
	uint64_t n_tensors = b->n_tensors, n_kv = b->n_kv;
	int rc;
	if ((rc = put(fp, "GGUF", 4, err, "magic")) || (rc = put(fp, &b->version, 4, err, "version")) ||
	    (rc = put(fp, &n_tensors, 8, err, "n_tensors")) || (rc = put(fp, &n_kv, 8, err, "n_kv")) ||
	    (rc = put(fp, b->kv_buf, b->kv_len, err, "metadata")))
		return rc;
	for (size_t i = 0; i < b->n_tensors; i++) {
		const struct build_tensor *t = &b->tensors[i];
		uint64_t len = strlen(t->name);
		if ((rc = put(fp, &len, 8, err, "tensor name")) || (rc = put(fp, t->name, len, err, "tensor name")) ||
		    (rc = put(fp, &t->n_dims, 4, err, "tensor n_dims")) ||
		    (rc = put(fp, t->ne, 8 * (size_t)t->n_dims, err, "tensor dims")) ||
		    (rc = put(fp, &t->type, 4, err, "tensor type")) ||
		    (rc = put(fp, &t->offset, 8, err, "tensor offset")))
			return rc;
	}
	if ((rc = put_zeros(fp, gguf_build_data_offset(b) - gguf_build_infos_end(b), err)))
		return rc;
	b->header_written = true;
	b->next_write = 0;
	while (b->next_write < b->n_tensors && b->tensors[b->next_write].raw)
		b->next_write++;
	b->part_written = 0;
	return 0;
}

int gguf_build_write_tensor_part(struct gguf_build *b, FILE *fp, int index, const void *data,
				 size_t size, struct hearth_error *err)
{
	if (!b->header_written)
		return hearth_error_set(err, HEARTH_EINVAL, "gguf_build: tensor data before the header");
	if (index < 0 || (size_t)index != b->next_write)
		return hearth_error_set(err, HEARTH_EINVAL,
					"gguf_build: tensor %d written out of order (expected %zu)", index, b->next_write);
	struct build_tensor *t = &b->tensors[index];
	if (size > t->size - b->part_written)
		return hearth_error_set(err, HEARTH_EINVAL,
					"gguf_build: tensor '%s': %zu more bytes exceed its size %zu (%zu written)",
					t->name, size, t->size, b->part_written);
	int rc = put(fp, data, size, err, t->name);
	if (rc)
		return rc;
	b->part_written += size;
	if (b->part_written < t->size)
		return 0;
	if ((rc = put_zeros(fp, align_up(t->size, b->alignment) - t->size, err)))
		return rc;
	b->part_written = 0;
	b->next_write++;
	while (b->next_write < b->n_tensors && b->tensors[b->next_write].raw)
		b->next_write++;
	return 0;
}

int gguf_build_write_tensor(struct gguf_build *b, FILE *fp, int index, const void *data, size_t size,
			    struct hearth_error *err)
{
	if (index >= 0 && (size_t)index < b->n_tensors && !b->tensors[index].raw &&
	    (size != b->tensors[index].size || b->part_written))
		return hearth_error_set(err, HEARTH_EINVAL,
					"gguf_build: tensor '%s' is %zu bytes, given %zu", b->tensors[index].name,
					b->tensors[index].size, size);
	return gguf_build_write_tensor_part(b, fp, index, data, size, err);
}
