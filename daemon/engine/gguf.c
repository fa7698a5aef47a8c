/* GGUF reader: maps the file read-only and walks it with a cursor that checks every read
 * against the mapping's size, so a hostile or truncated file yields an error naming the
 * file, the byte offset and the field, never a crash. Lookups go through hash tables. */
#include "daemon/engine/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "protocol/hash.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader maps little-endian files directly and needs a little-endian host"
#endif

#define GGUF_MAGIC "GGUF"
#define GGUF_HEADER_BYTES 24
/* Smallest possible encodings, used to refuse counts before allocating for them: a kv is a
 * key length (8), a type (4) and at least one value byte; a tensor info is a name length (8),
 * n_dims (4), one dim (8), a type (4) and an offset (8). */
#define GGUF_KV_MIN_BYTES 13
#define GGUF_TENSOR_INFO_MIN_BYTES 32
/* Nested arrays are legal GGUF but nobody writes deep ones; the limit keeps recursion on a
 * hostile file bounded. */
#define GGUF_MAX_ARRAY_DEPTH 8

/* What gguf_open allocates beyond the public struct: the lookup tables. Hash slots hold
 * index + 1 so that 0 means empty. */
struct gguf_file_priv {
	struct gguf_file pub;
	uint32_t *kv_slots;
	size_t kv_mask;
	uint32_t *tensor_slots;
	size_t tensor_mask;
};

struct gguf_cursor {
	const struct gguf_file *f;
	size_t pos;
	struct hearth_error *err;
};

static struct gguf_file_priv *file_priv(const struct gguf_file *f)
{
	return (struct gguf_file_priv *)f;
}

static size_t vtype_size(uint32_t t)
{
	switch (t) {
	case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
	case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
	case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
	case GGUF_VT_UINT64: case GGUF_VT_INT64: case GGUF_VT_FLOAT64: return 8;
	default: return 0; /* string, array, unknown */
	}
}

static bool vtype_is_int(uint32_t t)
{
	switch (t) {
	case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_UINT16: case GGUF_VT_INT16:
	case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_UINT64: case GGUF_VT_INT64:
		return true;
	default:
		return false;
	}
}

static bool vtype_is_signed(uint32_t t)
{
	return t == GGUF_VT_INT8 || t == GGUF_VT_INT16 || t == GGUF_VT_INT32 || t == GGUF_VT_INT64;
}

static const char *vtype_name(uint32_t t)
{
	static const char *const names[] = {
		"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
		"string", "array", "uint64", "int64", "float64",
	};
	return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

/* A key or name for an error message: bounded and without control bytes, since it came
 * from the file. */
static const char *str_print(struct gguf_str s, char *buf, size_t cap)
{
	size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s.ptr[i];
		buf[i] = (ch < 0x20 || ch == 0x7f) ? '?' : (char)ch;
	}
	buf[n] = '\0';
	if (s.len > n && n >= 3)
		memcpy(buf + n - 3, "...", 3);
	return buf;
}

#define NAME_BUF 96

static int cur_need(struct gguf_cursor *c, uint64_t n, const char *what)
{
	size_t left = c->f->map_size - c->pos;
	if (n > left)
		return hearth_error_set(c->err, HEARTH_EFORMAT,
					"%s: offset %zu: %s (%" PRIu64 " bytes) runs past the end of the file (size %zu)",
					c->f->path, c->pos, what, n, c->f->map_size);
	return 0;
}

static int cur_u32(struct gguf_cursor *c, uint32_t *out, const char *what)
{
	int rc = cur_need(c, 4, what);
	if (rc)
		return rc;
	memcpy(out, c->f->map + c->pos, 4);
	c->pos += 4;
	return 0;
}

static int cur_u64(struct gguf_cursor *c, uint64_t *out, const char *what)
{
	int rc = cur_need(c, 8, what);
	if (rc)
		return rc;
	memcpy(out, c->f->map + c->pos, 8);
	c->pos += 8;
	return 0;
}

static int cur_str(struct gguf_cursor *c, struct gguf_str *out, const char *what)
{
	size_t at = c->pos;
	uint64_t len;
	int rc = cur_u64(c, &len, what);
	if (rc)
		return rc;
	if (len > c->f->map_size - c->pos)
		return hearth_error_set(c->err, HEARTH_EFORMAT,
					"%s: offset %zu: %s has length %" PRIu64 ", beyond the end of the file (size %zu)",
					c->f->path, at, what, len, c->f->map_size);
	out->ptr = (const char *)c->f->map + c->pos;
	out->len = len;
	c->pos += (size_t)len;
	return 0;
}

static uint64_t str_hash(const char *p, uint64_t n)
{
	return hearth_fnv1a(HEARTH_FNV1A_SEED, p, (size_t)n);
}

static bool str_same(struct gguf_str a, struct gguf_str b)
{
	return a.len == b.len && memcmp(a.ptr, b.ptr, (size_t)a.len) == 0;
}

static int table_alloc(uint64_t n, uint32_t **slots, size_t *mask)
{
	size_t cap = 16;
	while (cap < 2 * n)
		cap <<= 1;
	*slots = calloc(cap, sizeof **slots);
	if (!*slots)
		return HEARTH_ENOMEM;
	*mask = cap - 1;
	return 0;
}

/* Inserts index i under name; returns the index of an earlier entry with the same name, or
 * -1 when it was new. */
static int64_t table_insert(uint32_t *slots, size_t mask, struct gguf_str name, uint32_t i,
			    struct gguf_str (*name_of)(const struct gguf_file *, uint32_t),
			    const struct gguf_file *f)
{
	size_t s = (size_t)str_hash(name.ptr, name.len) & mask;
	while (slots[s]) {
		if (str_same(name_of(f, slots[s] - 1), name))
			return slots[s] - 1;
		s = (s + 1) & mask;
	}
	slots[s] = i + 1;
	return -1;
}

static int64_t table_find(const uint32_t *slots, size_t mask, const char *name,
			  struct gguf_str (*name_of)(const struct gguf_file *, uint32_t),
			  const struct gguf_file *f)
{
	if (!slots)
		return -1;
	struct gguf_str key = { name, strlen(name) };
	size_t s = (size_t)str_hash(key.ptr, key.len) & mask;
	while (slots[s]) {
		if (str_same(name_of(f, slots[s] - 1), key))
			return slots[s] - 1;
		s = (s + 1) & mask;
	}
	return -1;
}

static struct gguf_str kv_name(const struct gguf_file *f, uint32_t i)
{
	return f->kv[i].key;
}

static struct gguf_str tensor_name(const struct gguf_file *f, uint32_t i)
{
	return f->tensors[i].name;
}

/* Skips one array body (element type, count, elements) for nested arrays, which are
 * exposed raw rather than indexed. */
static int skip_array(struct gguf_cursor *c, const char *key, unsigned depth)
{
	size_t at = c->pos;
	uint32_t et;
	uint64_t n;
	int rc;
	if (depth > GGUF_MAX_ARRAY_DEPTH)
		return hearth_error_set(c->err, HEARTH_EFORMAT,
					"%s: offset %zu: key '%s': arrays nested deeper than %d",
					c->f->path, at, key, GGUF_MAX_ARRAY_DEPTH);
	if ((rc = cur_u32(c, &et, "nested array element type")) ||
	    (rc = cur_u64(c, &n, "nested array count")))
		return rc;
	size_t es = vtype_size(et);
	if (es) {
		uint64_t bytes;
		if (__builtin_mul_overflow(n, (uint64_t)es, &bytes))
			return hearth_error_set(c->err, HEARTH_EFORMAT,
						"%s: offset %zu: key '%s': nested array of %" PRIu64 " elements overflows",
						c->f->path, at, key, n);
		if ((rc = cur_need(c, bytes, "nested array data")))
			return rc;
		c->pos += (size_t)bytes;
		return 0;
	}
	if (et != GGUF_VT_STRING && et != GGUF_VT_ARRAY)
		return hearth_error_set(c->err, HEARTH_EFORMAT,
					"%s: offset %zu: key '%s': nested array has unknown element type %" PRIu32,
					c->f->path, at, key, et);
	for (uint64_t k = 0; k < n; k++) {
		struct gguf_str s;
		if (et == GGUF_VT_STRING)
			rc = cur_str(c, &s, "nested array string");
		else
			rc = skip_array(c, key, depth + 1);
		if (rc)
			return rc;
	}
	return 0;
}

static int parse_array(struct gguf_cursor *c, struct gguf_kv *kv, const char *key)
{
	size_t at = c->pos;
	uint32_t et;
	uint64_t n;
	int rc;
	if ((rc = cur_u32(c, &et, "array element type")) || (rc = cur_u64(c, &n, "array count")))
		return rc;
	if (et > GGUF_VT_FLOAT64)
		return hearth_error_set(c->err, HEARTH_EFORMAT,
					"%s: offset %zu: key '%s': unknown array element type %" PRIu32,
					c->f->path, at, key, et);
	kv->arr_type = (enum gguf_vtype)et;
	kv->arr_n = n;
	kv->arr_data = c->f->map + c->pos;
	size_t left = c->f->map_size - c->pos;
	size_t es = vtype_size(et);
	if (es) {
		uint64_t bytes;
		if (__builtin_mul_overflow(n, (uint64_t)es, &bytes) || bytes > left)
			return hearth_error_set(c->err, HEARTH_EFORMAT,
						"%s: offset %zu: key '%s': array of %" PRIu64 " %s elements runs past the end of the file (size %zu)",
						c->f->path, at, key, n, vtype_name(et), c->f->map_size);
		if (et == GGUF_VT_BOOL) {
			for (uint64_t k = 0; k < n; k++)
				if (kv->arr_data[k] > 1)
					return hearth_error_set(c->err, HEARTH_EFORMAT,
								"%s: offset %zu: key '%s': bool element %" PRIu64 " is %u, not 0 or 1",
								c->f->path, c->pos + (size_t)k, key, k, kv->arr_data[k]);
		}
		c->pos += (size_t)bytes;
		return 0;
	}
	/* Every string needs at least its 8-byte length and every nested array 12 bytes:
	 * refuse impossible counts before allocating an index for them. */
	uint64_t min_each = et == GGUF_VT_STRING ? 8 : 12;
	if (n > left / min_each)
		return hearth_error_set(c->err, HEARTH_EFORMAT,
					"%s: offset %zu: key '%s': array of %" PRIu64 " %s elements cannot fit in the %zu bytes left in the file",
					c->f->path, at, key, n, vtype_name(et), left);
	if (et == GGUF_VT_ARRAY) {
		for (uint64_t k = 0; k < n; k++)
			if ((rc = skip_array(c, key, 2)))
				return rc;
		return 0;
	}
	if (n) {
		kv->arr_strs = malloc((size_t)n * sizeof *kv->arr_strs);
		if (!kv->arr_strs)
			return hearth_error_set(c->err, HEARTH_ENOMEM,
						"%s: key '%s': no memory for an index of %" PRIu64 " strings",
						c->f->path, key, n);
	}
	for (uint64_t k = 0; k < n; k++) {
		size_t str_at = c->pos;
		if (cur_str(c, &kv->arr_strs[k], "array string"))
			return hearth_error_set(c->err, HEARTH_EFORMAT,
						"%s: offset %zu: key '%s': array string %" PRIu64 " of %" PRIu64 " runs past the end of the file (size %zu)",
						c->f->path, str_at, key, k, n, c->f->map_size);
	}
	return 0;
}

static int parse_kv(struct gguf_cursor *c, struct gguf_kv *kv, uint64_t index)
{
	size_t at = c->pos;
	uint32_t t;
	int rc;
	char name[NAME_BUF];
	if ((rc = cur_str(c, &kv->key, "key")))
		return rc;
	if (kv->key.len == 0)
		return hearth_error_set(c->err, HEARTH_EFORMAT, "%s: offset %zu: key %" PRIu64 " is empty",
					c->f->path, at, index);
	str_print(kv->key, name, sizeof name);
	size_t type_at = c->pos;
	if ((rc = cur_u32(c, &t, "value type")))
		return rc;
	if (t > GGUF_VT_FLOAT64)
		return hearth_error_set(c->err, HEARTH_EFORMAT,
					"%s: offset %zu: key '%s': unknown value type %" PRIu32,
					c->f->path, type_at, name, t);
	kv->type = (enum gguf_vtype)t;
	size_t es = vtype_size(t);
	if (es) {
		const uint8_t *p = c->f->map + c->pos;
		if ((rc = cur_need(c, es, "value")))
			return rc;
		union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
			uint64_t u64; int64_t i64; float f32; double f64; } v;
		memcpy(&v, p, es);
		switch (t) {
		case GGUF_VT_UINT8: kv->v.u = v.u8; break;
		case GGUF_VT_INT8: kv->v.i = v.i8; break;
		case GGUF_VT_UINT16: kv->v.u = v.u16; break;
		case GGUF_VT_INT16: kv->v.i = v.i16; break;
		case GGUF_VT_UINT32: kv->v.u = v.u32; break;
		case GGUF_VT_INT32: kv->v.i = v.i32; break;
		case GGUF_VT_UINT64: kv->v.u = v.u64; break;
		case GGUF_VT_INT64: kv->v.i = v.i64; break;
		case GGUF_VT_FLOAT32: kv->v.f = v.f32; break;
		case GGUF_VT_FLOAT64: kv->v.f = v.f64; break;
		case GGUF_VT_BOOL:
			if (v.u8 > 1)
				return hearth_error_set(c->err, HEARTH_EFORMAT,
							"%s: offset %zu: key '%s': bool value is %u, not 0 or 1",
							c->f->path, c->pos, name, v.u8);
			kv->v.b = v.u8 != 0;
			break;
		}
		c->pos += es;
		return 0;
	}
	if (t == GGUF_VT_STRING)
		return cur_str(c, &kv->str, "string value");
	return parse_array(c, kv, name);
}

static int parse_kvs(struct gguf_cursor *c)
{
	struct gguf_file *f = (struct gguf_file *)c->f;
	struct gguf_file_priv *fp = file_priv(f);
	int rc;
	if (f->n_kv) {
		f->kv = calloc((size_t)f->n_kv, sizeof *f->kv);
		if (!f->kv)
			return hearth_error_set(c->err, HEARTH_ENOMEM, "%s: no memory for %" PRIu64 " keys",
						f->path, f->n_kv);
	}
	if (table_alloc(f->n_kv, &fp->kv_slots, &fp->kv_mask))
		return hearth_error_set(c->err, HEARTH_ENOMEM, "%s: no memory for the key table", f->path);
	for (uint64_t i = 0; i < f->n_kv; i++) {
		size_t at = c->pos;
		if ((rc = parse_kv(c, &f->kv[i], i)))
			return rc;
		int64_t prev = table_insert(fp->kv_slots, fp->kv_mask, f->kv[i].key, (uint32_t)i, kv_name, f);
		if (prev >= 0) {
			char name[NAME_BUF];
			return hearth_error_set(c->err, HEARTH_EFORMAT,
						"%s: offset %zu: duplicate key '%s' (first at offset %zu)",
						f->path, at, str_print(f->kv[i].key, name, sizeof name),
						(size_t)((const uint8_t *)f->kv[prev].key.ptr - f->map) - 8);
		}
	}
	f->alignment = GGUF_DEFAULT_ALIGNMENT;
	const struct gguf_kv *al = gguf_kv_find(f, "general.alignment");
	if (al) {
		size_t at = (size_t)((const uint8_t *)al->key.ptr - f->map) - 8;
		if (al->type != GGUF_VT_UINT32)
			return hearth_error_set(c->err, HEARTH_EFORMAT,
						"%s: offset %zu: general.alignment is %s, must be uint32",
						f->path, at, vtype_name(al->type));
		if (al->v.u == 0 || (al->v.u & (al->v.u - 1)))
			return hearth_error_set(c->err, HEARTH_EFORMAT,
						"%s: offset %zu: general.alignment %" PRIu64 " is not a nonzero power of two",
						f->path, at, al->v.u);
		f->alignment = (size_t)al->v.u;
	}
	return 0;
}

static int parse_tensor_info(struct gguf_cursor *c, struct gguf_tensor *t, uint64_t index)
{
	const struct gguf_file *f = c->f;
	size_t at = c->pos;
	char name[NAME_BUF];
	uint32_t n_dims, type;
	int rc;
	if ((rc = cur_str(c, &t->name, "tensor name")))
		return rc;
	if (t->name.len == 0)
		return hearth_error_set(c->err, HEARTH_EFORMAT, "%s: offset %zu: tensor %" PRIu64 " has an empty name",
					f->path, at, index);
	str_print(t->name, name, sizeof name);
	size_t dims_at = c->pos;
	if ((rc = cur_u32(c, &n_dims, "tensor n_dims")))
		return rc;
	if (n_dims == 0 || n_dims > GGUF_MAX_DIMS)
		return hearth_error_set(c->err, HEARTH_EFORMAT,
					"%s: offset %zu: tensor '%s': n_dims %" PRIu32 " is not in 1..%d",
					f->path, dims_at, name, n_dims, GGUF_MAX_DIMS);
	t->n_dims = n_dims;
	uint64_t n_elems = 1;
	for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
		t->ne[d] = 1;
		if (d >= n_dims)
			continue;
		size_t ne_at = c->pos;
		if ((rc = cur_u64(c, &t->ne[d], "tensor dimension")))
			return rc;
		if (t->ne[d] == 0)
			return hearth_error_set(c->err, HEARTH_EFORMAT, "%s: offset %zu: tensor '%s': ne[%" PRIu32 "] is 0",
						f->path, ne_at, name, d);
		if (__builtin_mul_overflow(n_elems, t->ne[d], &n_elems) || n_elems > (uint64_t)INT64_MAX)
			return hearth_error_set(c->err, HEARTH_EFORMAT,
						"%s: offset %zu: tensor '%s': element count overflows at ne[%" PRIu32 "] = %" PRIu64,
						f->path, ne_at, name, d, t->ne[d]);
	}
	t->n_elems = n_elems;
	size_t type_at = c->pos;
	if ((rc = cur_u32(c, &type, "tensor type")))
		return rc;
	if (!qtype_known(type))
		return hearth_error_set(c->err, HEARTH_EUNSUPPORTED,
					"%s: offset %zu: tensor '%s': unsupported tensor type id %" PRIu32,
					f->path, type_at, name, type);
	t->type = (enum qtype)type;
	size_t block = qtype_block_elems(t->type);
	if (t->ne[0] % block)
		return hearth_error_set(c->err, HEARTH_EFORMAT,
					"%s: offset %zu: tensor '%s': ne[0] = %" PRIu64 " is not a multiple of the %s block size %zu",
					f->path, dims_at + 4, name, t->ne[0], qtype_name(type), block);
	size_t row;
	size_t size;
	if (!qtype_row_bytes(t->type, t->ne[0], &row) ||
	    n_elems / t->ne[0] > SIZE_MAX ||
	    __builtin_mul_overflow(row, (size_t)(n_elems / t->ne[0]), &size))
		return hearth_error_set(c->err, HEARTH_EFORMAT,
					"%s: offset %zu: tensor '%s': byte size of %" PRIu64 " %s elements overflows",
					f->path, dims_at, name, n_elems, qtype_name(type));
	t->size = size;
	size_t off_at = c->pos;
	if ((rc = cur_u64(c, &t->offset, "tensor offset")))
		return rc;
	if (t->offset % f->alignment)
		return hearth_error_set(c->err, HEARTH_EFORMAT,
					"%s: offset %zu: tensor '%s': data offset %" PRIu64 " is not a multiple of the alignment %zu",
					f->path, off_at, name, t->offset, f->alignment);
	return 0;
}

static int cmp_by_offset(const void *a, const void *b, void *arg)
{
	const struct gguf_tensor *t = arg;
	uint64_t x = t[*(const uint32_t *)a].offset, y = t[*(const uint32_t *)b].offset;
	return x < y ? -1 : x > y;
}

/* The info offsets are kept only to name where a bad tensor was declared. */
static int check_tensor_data(struct gguf_cursor *c, const size_t *info_at)
{
	struct gguf_file *f = (struct gguf_file *)c->f;
	char name[NAME_BUF], other[NAME_BUF];
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		struct gguf_tensor *t = &f->tensors[i];
		uint64_t start, end;
		if (__builtin_add_overflow(f->data_offset, t->offset, &start) ||
		    __builtin_add_overflow(start, (uint64_t)t->size, &end))
			return hearth_error_set(c->err, HEARTH_EFORMAT,
						"%s: offset %zu: tensor '%s' data offset %" PRIu64 " (+%zu bytes) overflows",
						f->path, info_at[i], str_print(t->name, name, sizeof name),
						t->offset, t->size);
		if (end > f->map_size)
			return hearth_error_set(c->err, HEARTH_EFORMAT,
						"%s: offset %zu: tensor '%s' data [%" PRIu64 ", %" PRIu64 ") lies outside the file (size %zu)",
						f->path, info_at[i], str_print(t->name, name, sizeof name),
						start, end, f->map_size);
		t->data = f->map + start;
	}
	if (f->n_tensors < 2)
		return 0;
	uint32_t *order = malloc((size_t)f->n_tensors * sizeof *order);
	if (!order)
		return hearth_error_set(c->err, HEARTH_ENOMEM, "%s: no memory to sort tensors", f->path);
	for (uint64_t i = 0; i < f->n_tensors; i++)
		order[i] = (uint32_t)i;
	qsort_r(order, (size_t)f->n_tensors, sizeof *order, cmp_by_offset, f->tensors);
	int rc = 0;
	for (uint64_t k = 0; k + 1 < f->n_tensors; k++) {
		const struct gguf_tensor *a = &f->tensors[order[k]], *b = &f->tensors[order[k + 1]];
		if (a->offset + a->size > b->offset) {
			rc = hearth_error_set(c->err, HEARTH_EFORMAT,
					      "%s: offset %zu: tensor '%s' data [%" PRIu64 ", %" PRIu64 ") overlaps tensor '%s' at data offset %" PRIu64,
					      f->path, info_at[order[k + 1]], str_print(a->name, name, sizeof name),
					      a->offset, a->offset + a->size, str_print(b->name, other, sizeof other),
					      b->offset);
			break;
		}
	}
	free(order);
	return rc;
}

static int parse_tensors(struct gguf_cursor *c)
{
	struct gguf_file *f = (struct gguf_file *)c->f;
	struct gguf_file_priv *fp = file_priv(f);
	int rc = 0;
	size_t *info_at = NULL;
	if (f->n_tensors) {
		f->tensors = calloc((size_t)f->n_tensors, sizeof *f->tensors);
		info_at = malloc((size_t)f->n_tensors * sizeof *info_at);
		if (!f->tensors || !info_at) {
			free(info_at);
			return hearth_error_set(c->err, HEARTH_ENOMEM, "%s: no memory for %" PRIu64 " tensors",
						f->path, f->n_tensors);
		}
	}
	if (table_alloc(f->n_tensors, &fp->tensor_slots, &fp->tensor_mask)) {
		free(info_at);
		return hearth_error_set(c->err, HEARTH_ENOMEM, "%s: no memory for the tensor table", f->path);
	}
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		info_at[i] = c->pos;
		if ((rc = parse_tensor_info(c, &f->tensors[i], i)))
			goto out;
		int64_t prev = table_insert(fp->tensor_slots, fp->tensor_mask, f->tensors[i].name,
					    (uint32_t)i, tensor_name, f);
		if (prev >= 0) {
			char name[NAME_BUF];
			rc = hearth_error_set(c->err, HEARTH_EFORMAT,
					      "%s: offset %zu: duplicate tensor name '%s' (first at offset %zu)",
					      f->path, info_at[i], str_print(f->tensors[i].name, name, sizeof name),
					      info_at[prev]);
			goto out;
		}
	}
	/* The data section starts at the next multiple of the alignment after the infos; a
	 * file without tensors may end before that point. */
	uint64_t pad = (f->alignment - c->pos % f->alignment) % f->alignment;
	f->data_offset = (uint64_t)c->pos + pad;
	if (f->n_tensors && f->data_offset > f->map_size) {
		rc = hearth_error_set(c->err, HEARTH_EFORMAT,
				      "%s: offset %zu: tensor data section at %" PRIu64 " starts past the end of the file (size %zu)",
				      f->path, c->pos, f->data_offset, f->map_size);
		goto out;
	}
	rc = check_tensor_data(c, info_at);
out:
	free(info_at);
	return rc;
}

static int parse_file(struct gguf_file *f, struct hearth_error *err)
{
	struct gguf_cursor c = { f, 0, err };
	uint32_t version;
	int rc;
	if (f->map_size < 4 || memcmp(f->map, GGUF_MAGIC, 4) != 0)
		return hearth_error_set(err, HEARTH_EFORMAT, "%s: offset 0: bad magic, not a GGUF file", f->path);
	c.pos = 4;
	if ((rc = cur_u32(&c, &version, "version")))
		return rc;
	if (version == 1)
		return hearth_error_set(err, HEARTH_EUNSUPPORTED,
					"%s: offset 4: GGUF version 1 is not supported (32-bit counts; convert to version 3)",
					f->path);
	if (version != 2 && version != 3)
		return hearth_error_set(err, HEARTH_EFORMAT,
					"%s: offset 4: unknown GGUF version %" PRIu32 "%s", f->path, version,
					(version & 0xffff) == 0 ? " (a big-endian file?)" : "");
	f->version = version;
	if ((rc = cur_u64(&c, &f->n_tensors, "n_tensors")) || (rc = cur_u64(&c, &f->n_kv, "n_kv")))
		return rc;
	/* Refuse counts the rest of the file cannot hold before allocating anything for them. */
	size_t left = f->map_size - c.pos;
	if (f->n_kv > left / GGUF_KV_MIN_BYTES)
		return hearth_error_set(err, HEARTH_EFORMAT,
					"%s: offset 16: n_kv %" PRIu64 " cannot fit in the %zu bytes after the header",
					f->path, f->n_kv, left);
	if (f->n_tensors > left / GGUF_TENSOR_INFO_MIN_BYTES ||
	    f->n_kv * GGUF_KV_MIN_BYTES + f->n_tensors * GGUF_TENSOR_INFO_MIN_BYTES > left)
		return hearth_error_set(err, HEARTH_EFORMAT,
					"%s: offset 8: n_tensors %" PRIu64 " (with n_kv %" PRIu64 ") cannot fit in the %zu bytes after the header",
					f->path, f->n_tensors, f->n_kv, left);
	if (f->n_kv > UINT32_MAX - 1 || f->n_tensors > UINT32_MAX - 1)
		return hearth_error_set(err, HEARTH_EFORMAT, "%s: offset 8: more than 2^32 tensors or keys",
					f->path);
	if ((rc = parse_kvs(&c)))
		return rc;
	return parse_tensors(&c);
}

int gguf_open(struct gguf_file **out, const char *path, struct hearth_error *err)
{
	*out = NULL;
	struct gguf_file_priv *fp = calloc(1, sizeof *fp);
	char *copy = strdup(path);
	if (!fp || !copy) {
		free(fp);
		free(copy);
		return hearth_error_set(err, HEARTH_ENOMEM, "%s: no memory", path);
	}
	struct gguf_file *f = &fp->pub;
	f->path = copy;
	f->map = MAP_FAILED;
	f->fd = open(path, O_RDONLY | O_CLOEXEC);
	int rc;
	if (f->fd < 0) {
		rc = hearth_error_errno(err, errno == ENOENT ? HEARTH_ENOTFOUND : HEARTH_EIO, errno,
					"%s: cannot open", path);
		goto fail;
	}
	struct stat st;
	if (fstat(f->fd, &st) != 0) {
		rc = hearth_error_errno(err, HEARTH_EIO, errno, "%s: cannot stat", path);
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = hearth_error_set(err, HEARTH_EINVAL, "%s: not a regular file", path);
		goto fail;
	}
	if ((uint64_t)st.st_size < GGUF_HEADER_BYTES) {
		rc = hearth_error_set(err, HEARTH_EFORMAT,
				      "%s: offset 0: file is %jd bytes, shorter than the %d-byte GGUF header",
				      path, (intmax_t)st.st_size, GGUF_HEADER_BYTES);
		goto fail;
	}
	if ((uint64_t)st.st_size > SIZE_MAX) {
		rc = hearth_error_set(err, HEARTH_ERANGE, "%s: file too large to map", path);
		goto fail;
	}
	f->map_size = (size_t)st.st_size;
	void *m = mmap(NULL, f->map_size, PROT_READ, MAP_PRIVATE, f->fd, 0);
	if (m == MAP_FAILED) {
		rc = hearth_error_errno(err, HEARTH_EIO, errno, "%s: cannot map %zu bytes", path, f->map_size);
		goto fail;
	}
	f->map = m;
	if ((rc = parse_file(f, err)))
		goto fail;
	*out = f;
	return 0;
fail:
	gguf_close(f);
	return rc;
}

void gguf_release(const struct gguf_file *f, const void *from, const void *to, bool inward, bool keep_cached)
{
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t a = inward ? ((uintptr_t)from + pg - 1) & ~(pg - 1) : (uintptr_t)from & ~(pg - 1);
	uintptr_t b = inward ? (uintptr_t)to & ~(pg - 1) : ((uintptr_t)to + pg - 1) & ~(pg - 1);
	uintptr_t lo = (uintptr_t)f->map, hi = lo + f->map_size;
	a = a < lo ? lo : a;
	b = b > hi ? hi : b;
	if (b <= a)
		return;
	madvise((void *)a, b - a, MADV_DONTNEED);
	if (f->fd >= 0 && !keep_cached)
		posix_fadvise(f->fd, (off_t)(a - lo), (off_t)(b - a), POSIX_FADV_DONTNEED);
}

void gguf_close(struct gguf_file *f)
{
	if (!f)
		return;
	struct gguf_file_priv *fp = file_priv(f);
	if (f->map && f->map != MAP_FAILED)
		munmap((void *)f->map, f->map_size);
	if (f->fd >= 0) {
		/* The weights now live in the arena; the file's pages would only crowd it. */
		posix_fadvise(f->fd, 0, 0, POSIX_FADV_DONTNEED);
		close(f->fd);
	}
	if (f->kv)
		for (uint64_t i = 0; i < f->n_kv; i++)
			free(f->kv[i].arr_strs);
	free(f->kv);
	free(f->tensors);
	free(fp->kv_slots);
	free(fp->tensor_slots);
	free(f->path);
	free(fp);
}

const struct gguf_kv *gguf_kv_find(const struct gguf_file *f, const char *key)
{
	const struct gguf_file_priv *fp = file_priv(f);
	int64_t i = table_find(fp->kv_slots, fp->kv_mask, key, kv_name, f);
	return i < 0 ? NULL : &f->kv[i];
}

const struct gguf_tensor *gguf_tensor_find(const struct gguf_file *f, const char *name)
{
	const struct gguf_file_priv *fp = file_priv(f);
	int64_t i = table_find(fp->tensor_slots, fp->tensor_mask, name, tensor_name, f);
	return i < 0 ? NULL : &f->tensors[i];
}

static int kv_lookup(const struct gguf_file *f, const char *key, const struct gguf_kv **out,
		     struct hearth_error *err)
{
	*out = gguf_kv_find(f, key);
	if (!*out)
		return hearth_error_set(err, HEARTH_ENOTFOUND, "%s: required key '%s' is missing", f->path, key);
	return 0;
}

static int wrong_type(const struct gguf_file *f, const char *key, const struct gguf_kv *kv,
		      const char *want, struct hearth_error *err)
{
	return hearth_error_set(err, HEARTH_EFORMAT, "%s: key '%s' is %s, expected %s", f->path, key,
				vtype_name(kv->type), want);
}

/* Any integer kv as an unsigned value, refusing negatives. */
static int get_uint(const struct gguf_file *f, const char *key, uint64_t max, uint64_t *out,
		    struct hearth_error *err)
{
	const struct gguf_kv *kv;
	int rc = kv_lookup(f, key, &kv, err);
	if (rc)
		return rc;
	if (!vtype_is_int(kv->type))
		return wrong_type(f, key, kv, "an integer", err);
	if (vtype_is_signed(kv->type) && kv->v.i < 0)
		return hearth_error_set(err, HEARTH_EFORMAT, "%s: key '%s' is %" PRId64 ", must not be negative",
					f->path, key, kv->v.i);
	if (kv->v.u > max)
		return hearth_error_set(err, HEARTH_EFORMAT, "%s: key '%s' is %" PRIu64 ", above the limit %" PRIu64,
					f->path, key, kv->v.u, max);
	*out = kv->v.u;
	return 0;
}

int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out, struct hearth_error *err)
{
	uint64_t v;
	int rc = get_uint(f, key, UINT32_MAX, &v, err);
	if (rc == 0)
		*out = (uint32_t)v;
	return rc;
}

int gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out, struct hearth_error *err)
{
	return get_uint(f, key, UINT64_MAX, out, err);
}

int gguf_get_f32(const struct gguf_file *f, const char *key, float *out, struct hearth_error *err)
{
	const struct gguf_kv *kv;
	int rc = kv_lookup(f, key, &kv, err);
	if (rc)
		return rc;
	if (kv->type != GGUF_VT_FLOAT32 && kv->type != GGUF_VT_FLOAT64)
		return wrong_type(f, key, kv, "float32", err);
	*out = (float)kv->v.f;
	return 0;
}

int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out, struct hearth_error *err)
{
	const struct gguf_kv *kv;
	int rc = kv_lookup(f, key, &kv, err);
	if (rc)
		return rc;
	if (kv->type != GGUF_VT_BOOL)
		return wrong_type(f, key, kv, "bool", err);
	*out = kv->v.b;
	return 0;
}

int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out, struct hearth_error *err)
{
	const struct gguf_kv *kv;
	int rc = kv_lookup(f, key, &kv, err);
	if (rc)
		return rc;
	if (kv->type != GGUF_VT_STRING)
		return wrong_type(f, key, kv, "string", err);
	*out = kv->str;
	return 0;
}

int gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype elem_type,
		 const struct gguf_kv **out, struct hearth_error *err)
{
	const struct gguf_kv *kv;
	int rc = kv_lookup(f, key, &kv, err);
	if (rc)
		return rc;
	if (kv->type != GGUF_VT_ARRAY)
		return wrong_type(f, key, kv, "an array", err);
	bool ok = kv->arr_type == elem_type ||
		  (vtype_is_int(elem_type) && vtype_is_int(kv->arr_type) &&
		   vtype_size(elem_type) == vtype_size(kv->arr_type));
	if (!ok)
		return hearth_error_set(err, HEARTH_EFORMAT, "%s: key '%s' is an array of %s, expected %s",
					f->path, key, vtype_name(kv->arr_type), vtype_name(elem_type));
	*out = kv;
	return 0;
}

int64_t gguf_arr_int(const struct gguf_kv *kv, uint64_t i)
{
	const uint8_t *p = kv->arr_data + i * vtype_size(kv->arr_type);
	switch (kv->arr_type) {
	case GGUF_VT_UINT8: case GGUF_VT_BOOL: return *p;
	case GGUF_VT_INT8: return (int8_t)*p;
	case GGUF_VT_UINT16: { uint16_t v; memcpy(&v, p, 2); return v; }
	case GGUF_VT_INT16: { int16_t v; memcpy(&v, p, 2); return v; }
	case GGUF_VT_UINT32: { uint32_t v; memcpy(&v, p, 4); return v; }
	case GGUF_VT_INT32: { int32_t v; memcpy(&v, p, 4); return v; }
	case GGUF_VT_UINT64: { uint64_t v; memcpy(&v, p, 8); return (int64_t)v; }
	case GGUF_VT_INT64: { int64_t v; memcpy(&v, p, 8); return v; }
	case GGUF_VT_FLOAT32: { float v; memcpy(&v, p, 4); return (int64_t)v; }
	case GGUF_VT_FLOAT64: { double v; memcpy(&v, p, 8); return (int64_t)v; }
	default: return 0;
	}
}

double gguf_arr_float(const struct gguf_kv *kv, uint64_t i)
{
	const uint8_t *p = kv->arr_data + i * vtype_size(kv->arr_type);
	switch (kv->arr_type) {
	case GGUF_VT_FLOAT32: { float v; memcpy(&v, p, 4); return v; }
	case GGUF_VT_FLOAT64: { double v; memcpy(&v, p, 8); return v; }
	case GGUF_VT_UINT64: { uint64_t v; memcpy(&v, p, 8); return (double)v; }
	default: return (double)gguf_arr_int(kv, i);
	}
}

bool gguf_str_eq(struct gguf_str s, const char *c)
{
	size_t n = strlen(c);
	return s.len == n && memcmp(s.ptr, c, n) == 0;
}

int gguf_tensor_require(const struct gguf_file *f, const char *name, uint64_t ne0, uint64_t ne1,
			const struct gguf_tensor **out, struct hearth_error *err)
{
	const struct gguf_tensor *t = gguf_tensor_find(f, name);
	if (!t)
		return hearth_error_set(err, HEARTH_ENOTFOUND, "%s: required tensor '%s' is missing", f->path, name);
	bool ok = t->ne[0] == ne0 && t->ne[2] == 1 && t->ne[3] == 1 && t->ne[1] == (ne1 ? ne1 : 1);
	if (!ok)
		return hearth_error_set(err, HEARTH_EFORMAT,
					"%s: tensor '%s' has shape [%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64 "], expected [%" PRIu64 ", %" PRIu64 "]",
					f->path, name, t->ne[0], t->ne[1], t->ne[2], t->ne[3], ne0, ne1 ? ne1 : 1);
	*out = t;
	return 0;
}
