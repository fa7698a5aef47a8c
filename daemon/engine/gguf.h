/* Read-only GGUF reader: maps a model file, validates every count, offset and size against
 * the file before anything is used, and gives typed access to metadata and tensors. All
 * pointers it returns point into the mapping and live until gguf_close. */
#ifndef HEARTH_DAEMON_GGUF_H
#define HEARTH_DAEMON_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/quant.h"
#include "protocol/error.h"

enum gguf_vtype {
	GGUF_VT_UINT8 = 0,
	GGUF_VT_INT8 = 1,
	GGUF_VT_UINT16 = 2,
	GGUF_VT_INT16 = 3,
	GGUF_VT_UINT32 = 4,
	GGUF_VT_INT32 = 5,
	GGUF_VT_FLOAT32 = 6,
	GGUF_VT_BOOL = 7,
	GGUF_VT_STRING = 8,
	GGUF_VT_ARRAY = 9,
	GGUF_VT_UINT64 = 10,
	GGUF_VT_INT64 = 11,
	GGUF_VT_FLOAT64 = 12,
};

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

/* A string inside the mapping: not NUL-terminated. */
struct gguf_str {
	const char *ptr;
	uint64_t len;
};

struct gguf_kv {
	struct gguf_str key;
	enum gguf_vtype type;
	union {               /* scalars, widened; valid when type is not STRING/ARRAY */
		uint64_t u;
		int64_t i;
		double f;
		bool b;
	} v;
	struct gguf_str str;  /* type == STRING */
	/* type == ARRAY: element type and count; numeric elements start at arr_data
	 * (unaligned, little-endian); string elements are in arr_strs (an index the reader
	 * builds). Nested arrays are bounds-checked and exposed raw: arr_type is GGUF_VT_ARRAY,
	 * arr_data points at the first nested array and there is no string index. */
	enum gguf_vtype arr_type;
	uint64_t arr_n;
	const uint8_t *arr_data;
	struct gguf_str *arr_strs;
};

struct gguf_tensor {
	struct gguf_str name;
	enum qtype type;
	uint32_t n_dims;
	uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the row length (contiguous); unused dims are 1 */
	uint64_t n_elems;
	uint64_t offset;            /* from the start of the tensor data section */
	size_t size;                /* bytes */
	const void *data;           /* inside the mapping */
};

struct gguf_file {
	char *path;
	int fd;
	const uint8_t *map;
	size_t map_size;
	uint32_t version;
	uint64_t n_kv;
	struct gguf_kv *kv;
	uint64_t n_tensors;
	struct gguf_tensor *tensors;
	size_t alignment;
	uint64_t data_offset;       /* start of the tensor data section in the file */
};

/* Maps and validates path. On failure *out is NULL and err names the file, the byte
 * offset and what is wrong. */
int gguf_open(struct gguf_file **out, const char *path, struct hearth_error *err);
/* Gives back f's pages of [from, to) (a stretch already read): out of this process
 * (MADV_DONTNEED) and, unless keep_cached, out of the page cache (POSIX_FADV_DONTNEED).
 * inward: only the pages wholly inside; else every page the stretch touches. A page read
 * again later is faulted back in, from the page cache if it was kept, else from the file:
 * this costs no correctness, only time. */
void gguf_release(const struct gguf_file *f, const void *from, const void *to, bool inward, bool keep_cached);

/* Unmaps, drops the file's pages from the page cache (POSIX_FADV_DONTNEED) and frees
 * everything the reader allocated. NULL is fine. */
void gguf_close(struct gguf_file *f);

const struct gguf_kv *gguf_kv_find(const struct gguf_file *f, const char *key);
const struct gguf_tensor *gguf_tensor_find(const struct gguf_file *f, const char *name);

/* Typed getters. Missing keys are HEARTH_ENOTFOUND, a value of the wrong type or out of
 * range is HEARTH_EFORMAT; the message names the file and the key. Integers of any GGUF
 * integer type are accepted where they fit. */
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out, struct hearth_error *err);
int gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out, struct hearth_error *err);
int gguf_get_f32(const struct gguf_file *f, const char *key, float *out, struct hearth_error *err);
int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out, struct hearth_error *err);
int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out, struct hearth_error *err);
/* An array whose elements are of elem_type (for integer element types, any integer type
 * of the same width is accepted). */
int gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype elem_type,
		 const struct gguf_kv **out, struct hearth_error *err);

/* Element i of a numeric array, widened; the caller has checked i < arr_n. */
int64_t gguf_arr_int(const struct gguf_kv *kv, uint64_t i);
double gguf_arr_float(const struct gguf_kv *kv, uint64_t i);

/* True when s equals the NUL-terminated c string. */
bool gguf_str_eq(struct gguf_str s, const char *c);

/* A tensor that must exist with the given type-independent shape (ne0, ne1; ne1 = 0 for
 * a vector). HEARTH_ENOTFOUND or HEARTH_EFORMAT with the tensor's name otherwise. */
int gguf_tensor_require(const struct gguf_file *f, const char *name, uint64_t ne0, uint64_t ne1,
			const struct gguf_tensor **out, struct hearth_error *err);

#endif
