/* GGUF writer for tests and tools: collects metadata and tensor shapes, then streams the
 * header and each tensor's data in order, so files larger than memory can be written. Also
 * writes deliberately malformed files (raw kvs and tensor infos, field offsets to patch). */
#ifndef HEARTH_TESTS_GGUF_BUILD_H
#define HEARTH_TESTS_GGUF_BUILD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "daemon/engine/gguf.h"
#include "kernels/quant.h"
#include "protocol/error.h"

struct gguf_build;

/* version is 2 or 3 (the layouts are the same; 3 marks a little-endian file). */
int gguf_build_new(struct gguf_build **out, uint32_t version, struct hearth_error *err);
void gguf_build_free(struct gguf_build *b);

/* Sets the data alignment (a nonzero power of two) and emits general.alignment as a uint32
 * kv (updated in place when called again). Call before gguf_build_write_header. */
int gguf_build_set_alignment(struct gguf_build *b, size_t alignment);

/* Metadata, written in the order added. Keys and strings are copied. Duplicate keys are
 * not refused here, so that tests can write them. */
int gguf_build_kv_u8(struct gguf_build *b, const char *key, uint8_t v);
int gguf_build_kv_i8(struct gguf_build *b, const char *key, int8_t v);
int gguf_build_kv_u16(struct gguf_build *b, const char *key, uint16_t v);
int gguf_build_kv_i16(struct gguf_build *b, const char *key, int16_t v);
int gguf_build_kv_u32(struct gguf_build *b, const char *key, uint32_t v);
int gguf_build_kv_i32(struct gguf_build *b, const char *key, int32_t v);
int gguf_build_kv_u64(struct gguf_build *b, const char *key, uint64_t v);
int gguf_build_kv_i64(struct gguf_build *b, const char *key, int64_t v);
int gguf_build_kv_f32(struct gguf_build *b, const char *key, float v);
int gguf_build_kv_f64(struct gguf_build *b, const char *key, double v);
int gguf_build_kv_bool(struct gguf_build *b, const char *key, bool v);
int gguf_build_kv_str(struct gguf_build *b, const char *key, const char *v);
/* A numeric (or bool) array; elems are n native little-endian values of elem's width. */
int gguf_build_kv_arr(struct gguf_build *b, const char *key, enum gguf_vtype elem, const void *elems,
		      uint64_t n);
int gguf_build_kv_arr_str(struct gguf_build *b, const char *key, const char *const *strs, uint64_t n);

/* Declares a tensor; its size and data offset follow from type and shape, and its data is
 * written later with gguf_build_write_tensor. Returns its index (>= 0) or a negative code. */
int gguf_build_tensor(struct gguf_build *b, const char *name, enum qtype type, uint32_t n_dims,
		      const uint64_t *ne);

/* Writes the header, the kvs, the tensor infos and the padding up to the data section. */
int gguf_build_write_header(struct gguf_build *b, FILE *fp, struct hearth_error *err);

/* Writes tensor index's data (size must be its full size) and the padding after it. Tensors
 * are written in index order, each once. */
int gguf_build_write_tensor(struct gguf_build *b, FILE *fp, int index, const void *data, size_t size,
			    struct hearth_error *err);

/* Like gguf_build_write_tensor for a tensor written in consecutive pieces (row blocks):
 * the padding follows the piece that completes it. */
int gguf_build_write_tensor_part(struct gguf_build *b, FILE *fp, int index, const void *data,
				 size_t size, struct hearth_error *err);

/* Number of tensors declared (normal and raw). */
int gguf_build_n_tensors(const struct gguf_build *b);

/* Size in bytes of tensor index's data, or 0 for a bad index or a raw tensor. */
size_t gguf_build_tensor_size(const struct gguf_build *b, int index);

/* ---- For tests that corrupt files on purpose. ---- */

/* A kv written verbatim: key, then the 4-byte type (any value), then payload bytes as given. */
int gguf_build_kv_raw(struct gguf_build *b, const char *key, uint32_t type, const void *payload,
		      size_t payload_size);

/* A tensor info written verbatim (any type id, n_dims up to 8 with that many dims, any
 * offset). It takes no space in the data section and has no data to write. */
int gguf_build_tensor_raw(struct gguf_build *b, const char *name, uint32_t type, uint32_t n_dims,
			  const uint64_t *ne, uint64_t offset);

/* Overrides the data offset written for tensor index (the layout of the others is kept). */
int gguf_build_tensor_set_offset(struct gguf_build *b, int index, uint64_t offset);

enum gguf_build_field {
	GGUF_BUILD_FIELD_NAME,    /* the 8-byte name length */
	GGUF_BUILD_FIELD_N_DIMS,
	GGUF_BUILD_FIELD_NE0,     /* ne[k] is at NE0 + 8 * k */
	GGUF_BUILD_FIELD_TYPE,
	GGUF_BUILD_FIELD_OFFSET,
};

/* Byte offsets in the written file. The header's fields are at fixed places. */
#define GGUF_BUILD_OFF_VERSION 4
#define GGUF_BUILD_OFF_N_TENSORS 8
#define GGUF_BUILD_OFF_N_KV 16
uint64_t gguf_build_kv_offset(const struct gguf_build *b, int kv_index);      /* its key length */
uint64_t gguf_build_kv_value_offset(const struct gguf_build *b, int kv_index);/* after the type */
uint64_t gguf_build_tensor_field_offset(const struct gguf_build *b, int index, enum gguf_build_field field);
uint64_t gguf_build_infos_end(const struct gguf_build *b);  /* end of the last tensor info */
uint64_t gguf_build_data_offset(const struct gguf_build *b);/* start of the data section */
/* Absolute file offset of tensor index's data, and the total file size once all is written. */
uint64_t gguf_build_tensor_data_offset(const struct gguf_build *b, int index);
uint64_t gguf_build_file_size(const struct gguf_build *b);

#endif
