/* Tests for the GGUF reader: files written by tests/support/gguf_build round-trip every
 * value type; each kind of malformed file is refused with a message naming the file and the
 * offset or field; every real fixture and vocabulary opens; truncation anywhere fails cleanly. */
#include <dirent.h>
#include <glob.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/engine/gguf.h"
#include "tests/support/gguf_build.h"

static char tmp_dir[64];
static unsigned file_counter;

static int group_setup(void **state)
{
	strcpy(tmp_dir, "/tmp/hearth-test-gguf-XXXXXX");
	return mkdtemp(tmp_dir) ? 0 : -1;
}

static int group_teardown(void **state)
{
	DIR *d = opendir(tmp_dir);
	if (d) {
		struct dirent *e;
		char p[PATH_MAX];
		while ((e = readdir(d)))
			if (e->d_name[0] != '.') {
				snprintf(p, sizeof p, "%s/%s", tmp_dir, e->d_name);
				unlink(p);
			}
		closedir(d);
	}
	rmdir(tmp_dir);
	return 0;
}

/* Test files get distinct names so a failing message can be traced to its case. */
static void tmp_path(char *out, size_t cap, const char *tag)
{
	snprintf(out, cap, "%s/%s-%u.gguf", tmp_dir, tag, file_counter++);
}

static uint8_t pattern_byte(int tensor, size_t k)
{
	return (uint8_t)(tensor * 37 + k * 13 + 1);
}

/* Writes header and every tensor with a recognisable byte pattern. */
static void write_file(struct gguf_build *b, const char *path)
{
	struct hearth_error err = { 0 };
	FILE *fp = fopen(path, "wb");
	assert_non_null(fp);
	assert_int_equal(gguf_build_write_header(b, fp, &err), 0);
	for (int i = 0; i < gguf_build_n_tensors(b); i++) {
		size_t n = gguf_build_tensor_size(b, i);
		if (!n)
			continue; /* raw tensor */
		uint8_t *data = malloc(n);
		assert_non_null(data);
		for (size_t k = 0; k < n; k++)
			data[k] = pattern_byte(i, k);
		assert_int_equal(gguf_build_write_tensor(b, fp, i, data, n, &err), 0);
		free(data);
	}
	assert_int_equal(fclose(fp), 0);
}

static void patch(const char *path, uint64_t off, const void *bytes, size_t n)
{
	FILE *fp = fopen(path, "r+b");
	assert_non_null(fp);
	assert_int_equal(fseeko(fp, (off_t)off, SEEK_SET), 0);
	assert_int_equal(fwrite(bytes, 1, n, fp), n);
	assert_int_equal(fclose(fp), 0);
}

static void patch_u32(const char *path, uint64_t off, uint32_t v)
{
	patch(path, off, &v, 4);
}

static void patch_u64(const char *path, uint64_t off, uint64_t v)
{
	patch(path, off, &v, 8);
}

/* Opening must fail with code, and the message must name the file and each fragment. */
static void expect_fail(const char *path, int code, int n_frag, ...)
{
	struct gguf_file *f = (struct gguf_file *)1;
	struct hearth_error err = { 0 };
	int rc = gguf_open(&f, path, &err);
	if (rc != code)
		fail_msg("%s: expected code %d, got %d (%s)", path, code, rc, err.msg);
	assert_null(f);
	assert_int_equal(err.code, code);
	if (!strstr(err.msg, path))
		fail_msg("message does not name the file: %s", err.msg);
	va_list ap;
	va_start(ap, n_frag);
	for (int i = 0; i < n_frag; i++) {
		const char *frag = va_arg(ap, const char *);
		if (!strstr(err.msg, frag))
			fail_msg("message lacks '%s': %s", frag, err.msg);
	}
	va_end(ap);
}

static const char *offset_str(char *buf, size_t cap, uint64_t off)
{
	snprintf(buf, cap, "offset %" PRIu64 ":", off);
	return buf;
}

static struct gguf_build *new_build(uint32_t version)
{
	struct gguf_build *b;
	struct hearth_error err = { 0 };
	assert_int_equal(gguf_build_new(&b, version, &err), 0);
	return b;
}

/* A small valid model: a few kvs and two tensors. */
static struct gguf_build *small_model(void)
{
	struct gguf_build *b = new_build(3);
	static const char *const toks[] = { "<s>", "", "hello", "\xe2\x96\x81world" };
	static const int32_t types[] = { 3, 1, 1, 1 };
	assert_int_equal(gguf_build_kv_str(b, "general.architecture", "llama"), 0);
	assert_int_equal(gguf_build_kv_u32(b, "llama.embedding_length", 64), 0);
	assert_int_equal(gguf_build_kv_arr_str(b, "tokenizer.ggml.tokens", toks, 4), 0);
	assert_int_equal(gguf_build_kv_arr(b, "tokenizer.ggml.token_type", GGUF_VT_INT32, types, 4), 0);
	uint64_t ne_a[2] = { 64, 3 }, ne_b[1] = { 64 };
	assert_int_equal(gguf_build_tensor(b, "token_embd.weight", QTYPE_Q8_0, 2, ne_a), 0);
	assert_int_equal(gguf_build_tensor(b, "output_norm.weight", QTYPE_F32, 1, ne_b), 1);
	return b;
}

static void check_pattern(const struct gguf_tensor *t, int index)
{
	const uint8_t *p = t->data;
	for (size_t k = 0; k < t->size; k++)
		if (p[k] != pattern_byte(index, k))
			fail_msg("tensor %d byte %zu differs", index, k);
}

/* ---- round trips ---- */

static void round_trip(uint32_t version)
{
	struct gguf_build *b = new_build(version);
	char path[PATH_MAX];
	tmp_path(path, sizeof path, "roundtrip");
	assert_int_equal(gguf_build_kv_u8(b, "t.u8", 250), 0);
	assert_int_equal(gguf_build_kv_i8(b, "t.i8", -128), 0);
	assert_int_equal(gguf_build_kv_u16(b, "t.u16", 65535), 0);
	assert_int_equal(gguf_build_kv_i16(b, "t.i16", -32768), 0);
	assert_int_equal(gguf_build_kv_u32(b, "t.u32", 4000000000u), 0);
	assert_int_equal(gguf_build_kv_i32(b, "t.i32", -2000000000), 0);
	assert_int_equal(gguf_build_kv_u64(b, "t.u64", UINT64_MAX), 0);
	assert_int_equal(gguf_build_kv_i64(b, "t.i64", INT64_MIN), 0);
	assert_int_equal(gguf_build_kv_f32(b, "t.f32", 1e-5f), 0);
	assert_int_equal(gguf_build_kv_f64(b, "t.f64", 1e300), 0);
	assert_int_equal(gguf_build_kv_bool(b, "t.true", true), 0);
	assert_int_equal(gguf_build_kv_bool(b, "t.false", false), 0);
	assert_int_equal(gguf_build_kv_str(b, "t.str", "llama"), 0);
	assert_int_equal(gguf_build_kv_str(b, "t.empty", ""), 0);
	static const uint8_t a_u8[] = { 0, 255, 7 };
	static const int8_t a_i8[] = { -128, 127 };
	static const uint16_t a_u16[] = { 65535, 1 };
	static const int16_t a_i16[] = { -32768, 5 };
	static const uint32_t a_u32[] = { 4000000000u, 2 };
	static const int32_t a_i32[] = { -7, 2147483647 };
	static const uint64_t a_u64[] = { UINT64_MAX - 1, 3 };
	static const int64_t a_i64[] = { INT64_MIN, -1 };
	static const float a_f32[] = { 0.5f, -3.25f };
	static const double a_f64[] = { 1e-300, -2.5 };
	static const uint8_t a_bool[] = { 1, 0, 1 };
	static const char *const a_str[] = { "a", "", "h\xc3\xa9llo" };
	assert_int_equal(gguf_build_kv_arr(b, "a.u8", GGUF_VT_UINT8, a_u8, 3), 0);
	assert_int_equal(gguf_build_kv_arr(b, "a.i8", GGUF_VT_INT8, a_i8, 2), 0);
	assert_int_equal(gguf_build_kv_arr(b, "a.u16", GGUF_VT_UINT16, a_u16, 2), 0);
	assert_int_equal(gguf_build_kv_arr(b, "a.i16", GGUF_VT_INT16, a_i16, 2), 0);
	assert_int_equal(gguf_build_kv_arr(b, "a.u32", GGUF_VT_UINT32, a_u32, 2), 0);
	assert_int_equal(gguf_build_kv_arr(b, "a.i32", GGUF_VT_INT32, a_i32, 2), 0);
	assert_int_equal(gguf_build_kv_arr(b, "a.u64", GGUF_VT_UINT64, a_u64, 2), 0);
	assert_int_equal(gguf_build_kv_arr(b, "a.i64", GGUF_VT_INT64, a_i64, 2), 0);
	assert_int_equal(gguf_build_kv_arr(b, "a.f32", GGUF_VT_FLOAT32, a_f32, 2), 0);
	assert_int_equal(gguf_build_kv_arr(b, "a.f64", GGUF_VT_FLOAT64, a_f64, 2), 0);
	assert_int_equal(gguf_build_kv_arr(b, "a.bool", GGUF_VT_BOOL, a_bool, 3), 0);
	assert_int_equal(gguf_build_kv_arr_str(b, "a.str", a_str, 3), 0);
	assert_int_equal(gguf_build_kv_arr(b, "a.empty", GGUF_VT_INT32, NULL, 0), 0);
	assert_int_equal(gguf_build_kv_arr_str(b, "a.empty_str", NULL, 0), 0);
	uint64_t ne0[2] = { 64, 3 }, ne1[3] = { 256, 2, 2 }, ne2[1] = { 5 };
	assert_int_equal(gguf_build_tensor(b, "w.q4_0", QTYPE_Q4_0, 2, ne0), 0);
	assert_int_equal(gguf_build_tensor(b, "w.q6_k", QTYPE_Q6_K, 3, ne1), 1);
	assert_int_equal(gguf_build_tensor(b, "w.f16", QTYPE_F16, 1, ne2), 2);
	write_file(b, path);

	struct gguf_file *f;
	struct hearth_error err = { 0 };
	assert_int_equal(gguf_open(&f, path, &err), 0);
	assert_int_equal(f->version, version);
	assert_int_equal(f->n_kv, 28);
	assert_int_equal(f->n_tensors, 3);
	assert_int_equal(f->alignment, GGUF_DEFAULT_ALIGNMENT);
	assert_int_equal(f->data_offset, gguf_build_data_offset(b));
	assert_int_equal(f->map_size, gguf_build_file_size(b));

	const struct gguf_kv *kv;
	assert_non_null(kv = gguf_kv_find(f, "t.u8"));
	assert_int_equal(kv->type, GGUF_VT_UINT8);
	assert_int_equal(kv->v.u, 250);
	assert_int_equal(gguf_kv_find(f, "t.i8")->v.i, -128);
	assert_int_equal(gguf_kv_find(f, "t.u16")->v.u, 65535);
	assert_int_equal(gguf_kv_find(f, "t.i16")->v.i, -32768);
	assert_int_equal(gguf_kv_find(f, "t.u32")->v.u, 4000000000u);
	assert_int_equal(gguf_kv_find(f, "t.i32")->v.i, -2000000000);
	assert_true(gguf_kv_find(f, "t.u64")->v.u == UINT64_MAX);
	assert_true(gguf_kv_find(f, "t.i64")->v.i == INT64_MIN);
	assert_true(gguf_kv_find(f, "t.f32")->v.f == (double)1e-5f);
	assert_true(gguf_kv_find(f, "t.f64")->v.f == 1e300);
	assert_true(gguf_kv_find(f, "t.true")->v.b);
	assert_false(gguf_kv_find(f, "t.false")->v.b);
	assert_int_equal(gguf_kv_find(f, "t.f64")->type, GGUF_VT_FLOAT64);
	assert_null(gguf_kv_find(f, "t.missing"));
	assert_null(gguf_kv_find(f, "t.u"));

	/* typed getters */
	uint32_t u32;
	uint64_t u64;
	float f32;
	bool bv;
	struct gguf_str s;
	assert_int_equal(gguf_get_u32(f, "t.u8", &u32, &err), 0);
	assert_int_equal(u32, 250);
	assert_int_equal(gguf_get_u32(f, "t.u32", &u32, &err), 0);
	assert_int_equal(u32, 4000000000u);
	assert_int_equal(gguf_get_u32(f, "t.u64", &u32, &err), HEARTH_EFORMAT);
	assert_non_null(strstr(err.msg, "t.u64"));
	assert_non_null(strstr(err.msg, path));
	assert_int_equal(gguf_get_u32(f, "t.i32", &u32, &err), HEARTH_EFORMAT);
	assert_non_null(strstr(err.msg, "negative"));
	assert_int_equal(gguf_get_u64(f, "t.u64", &u64, &err), 0);
	assert_true(u64 == UINT64_MAX);
	assert_int_equal(gguf_get_u32(f, "t.str", &u32, &err), HEARTH_EFORMAT);
	assert_int_equal(gguf_get_u32(f, "t.missing", &u32, &err), HEARTH_ENOTFOUND);
	assert_non_null(strstr(err.msg, "t.missing"));
	assert_non_null(strstr(err.msg, path));
	assert_int_equal(gguf_get_f32(f, "t.f32", &f32, &err), 0);
	assert_true(f32 == 1e-5f);
	assert_int_equal(gguf_get_f32(f, "t.u32", &f32, &err), HEARTH_EFORMAT);
	assert_int_equal(gguf_get_bool(f, "t.true", &bv, &err), 0);
	assert_true(bv);
	assert_int_equal(gguf_get_bool(f, "t.u8", &bv, &err), HEARTH_EFORMAT);
	assert_int_equal(gguf_get_str(f, "t.str", &s, &err), 0);
	assert_true(gguf_str_eq(s, "llama"));
	assert_false(gguf_str_eq(s, "llam"));
	assert_false(gguf_str_eq(s, "llamas"));
	assert_int_equal(gguf_get_str(f, "t.empty", &s, &err), 0);
	assert_int_equal(s.len, 0);
	assert_int_equal(gguf_get_str(f, "t.u8", &s, &err), HEARTH_EFORMAT);

	/* arrays */
	assert_int_equal(gguf_get_arr(f, "a.u8", GGUF_VT_UINT8, &kv, &err), 0);
	assert_int_equal(kv->arr_n, 3);
	assert_int_equal(gguf_arr_int(kv, 1), 255);
	assert_int_equal(gguf_get_arr(f, "a.i8", GGUF_VT_INT8, &kv, &err), 0);
	assert_int_equal(gguf_arr_int(kv, 0), -128);
	assert_int_equal(gguf_get_arr(f, "a.u16", GGUF_VT_UINT16, &kv, &err), 0);
	assert_int_equal(gguf_arr_int(kv, 0), 65535);
	assert_int_equal(gguf_get_arr(f, "a.i16", GGUF_VT_INT16, &kv, &err), 0);
	assert_int_equal(gguf_arr_int(kv, 0), -32768);
	assert_int_equal(gguf_get_arr(f, "a.u32", GGUF_VT_UINT32, &kv, &err), 0);
	assert_int_equal(gguf_arr_int(kv, 0), 4000000000u);
	/* same width, other signedness: accepted, read with the stored type */
	assert_int_equal(gguf_get_arr(f, "a.u32", GGUF_VT_INT32, &kv, &err), 0);
	assert_int_equal(gguf_arr_int(kv, 0), 4000000000u);
	assert_int_equal(gguf_get_arr(f, "a.i32", GGUF_VT_INT32, &kv, &err), 0);
	assert_int_equal(gguf_arr_int(kv, 0), -7);
	assert_int_equal(gguf_arr_int(kv, 1), 2147483647);
	assert_int_equal(gguf_get_arr(f, "a.i32", GGUF_VT_INT64, &kv, &err), HEARTH_EFORMAT);
	assert_non_null(strstr(err.msg, "a.i32"));
	assert_int_equal(gguf_get_arr(f, "a.u64", GGUF_VT_UINT64, &kv, &err), 0);
	assert_true((uint64_t)gguf_arr_int(kv, 0) == UINT64_MAX - 1);
	assert_int_equal(gguf_get_arr(f, "a.i64", GGUF_VT_INT64, &kv, &err), 0);
	assert_true(gguf_arr_int(kv, 0) == INT64_MIN);
	assert_int_equal(gguf_arr_int(kv, 1), -1);
	assert_int_equal(gguf_get_arr(f, "a.f32", GGUF_VT_FLOAT32, &kv, &err), 0);
	assert_true(gguf_arr_float(kv, 1) == -3.25);
	assert_int_equal(gguf_get_arr(f, "a.f32", GGUF_VT_INT32, &kv, &err), HEARTH_EFORMAT);
	assert_int_equal(gguf_get_arr(f, "a.f64", GGUF_VT_FLOAT64, &kv, &err), 0);
	assert_true(gguf_arr_float(kv, 0) == 1e-300);
	assert_int_equal(gguf_get_arr(f, "a.bool", GGUF_VT_BOOL, &kv, &err), 0);
	assert_int_equal(gguf_arr_int(kv, 0), 1);
	assert_int_equal(gguf_arr_int(kv, 1), 0);
	assert_int_equal(gguf_get_arr(f, "a.str", GGUF_VT_STRING, &kv, &err), 0);
	assert_int_equal(kv->arr_n, 3);
	assert_true(gguf_str_eq(kv->arr_strs[0], "a"));
	assert_int_equal(kv->arr_strs[1].len, 0);
	assert_true(gguf_str_eq(kv->arr_strs[2], "h\xc3\xa9llo"));
	assert_int_equal(gguf_get_arr(f, "a.empty", GGUF_VT_INT32, &kv, &err), 0);
	assert_int_equal(kv->arr_n, 0);
	assert_int_equal(gguf_get_arr(f, "a.empty_str", GGUF_VT_STRING, &kv, &err), 0);
	assert_int_equal(kv->arr_n, 0);
	assert_int_equal(gguf_get_arr(f, "t.u8", GGUF_VT_UINT8, &kv, &err), HEARTH_EFORMAT);
	assert_int_equal(gguf_get_arr(f, "a.none", GGUF_VT_UINT8, &kv, &err), HEARTH_ENOTFOUND);

	/* tensors: shapes, sizes by hand from the block formats, data where it was written */
	const struct gguf_tensor *t;
	assert_non_null(t = gguf_tensor_find(f, "w.q4_0"));
	assert_int_equal(t->type, QTYPE_Q4_0);
	assert_int_equal(t->n_dims, 2);
	assert_int_equal(t->ne[0], 64);
	assert_int_equal(t->ne[1], 3);
	assert_int_equal(t->ne[2], 1);
	assert_int_equal(t->n_elems, 192);
	assert_int_equal(t->size, 3 * 2 * 18);
	assert_int_equal(t->offset, 0);
	check_pattern(t, 0);
	assert_non_null(t = gguf_tensor_find(f, "w.q6_k"));
	assert_int_equal(t->size, 4 * 210);
	assert_int_equal(t->offset, 128); /* 108 bytes padded to 32 */
	assert_int_equal(t->ne[2], 2);
	check_pattern(t, 1);
	assert_non_null(t = gguf_tensor_find(f, "w.f16"));
	assert_int_equal(t->size, 10);
	assert_int_equal(t->offset, 128 + 864);
	assert_ptr_equal(t->data, f->map + f->data_offset + t->offset);
	check_pattern(t, 2);
	assert_null(gguf_tensor_find(f, "w"));
	assert_int_equal(f->data_offset % 32, 0);
	gguf_close(f);
	gguf_build_free(b);
}

static void test_gguf_round_trips_every_value_type_v3(void **state)
{
	round_trip(3);
}

static void test_gguf_round_trips_every_value_type_v2(void **state)
{
	round_trip(2);
}

static void test_gguf_honours_custom_alignment(void **state)
{
	static const size_t aligns[] = { 1, 8, 64, 4096 };
	for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
		struct gguf_build *b = new_build(3);
		char path[PATH_MAX];
		tmp_path(path, sizeof path, "align");
		uint64_t ne_odd[1] = { 3 }, ne_row[2] = { 7, 2 };
		assert_int_equal(gguf_build_kv_str(b, "general.architecture", "llama"), 0);
		assert_int_equal(gguf_build_tensor(b, "a", QTYPE_F16, 1, ne_odd), 0);
		assert_int_equal(gguf_build_tensor(b, "b", QTYPE_F32, 2, ne_row), 1);
		/* set after the tensors: the layout must follow */
		assert_int_equal(gguf_build_set_alignment(b, aligns[a]), 0);
		write_file(b, path);
		struct gguf_file *f;
		struct hearth_error err = { 0 };
		assert_int_equal(gguf_open(&f, path, &err), 0);
		assert_int_equal(f->alignment, aligns[a]);
		uint32_t v;
		assert_int_equal(gguf_get_u32(f, "general.alignment", &v, &err), 0);
		assert_int_equal(v, aligns[a]);
		assert_int_equal(f->data_offset % aligns[a], 0);
		assert_int_equal(f->data_offset, gguf_build_data_offset(b));
		const struct gguf_tensor *t = gguf_tensor_find(f, "b");
		assert_non_null(t);
		size_t expect_off = (6 + aligns[a] - 1) / aligns[a] * aligns[a];
		assert_int_equal(t->offset, expect_off);
		check_pattern(gguf_tensor_find(f, "a"), 0);
		check_pattern(t, 1);
		gguf_close(f);
		gguf_build_free(b);
	}
	struct gguf_build *b = new_build(3);
	assert_int_equal(gguf_build_set_alignment(b, 24), HEARTH_EINVAL);
	assert_int_equal(gguf_build_set_alignment(b, 0), HEARTH_EINVAL);
	gguf_build_free(b);
}

static void test_gguf_streams_tensor_data_in_parts(void **state)
{
	struct gguf_build *b = new_build(3);
	struct hearth_error err = { 0 };
	char path[PATH_MAX];
	tmp_path(path, sizeof path, "parts");
	uint64_t ne[2] = { 32, 4 };
	assert_int_equal(gguf_build_tensor(b, "x", QTYPE_Q8_0, 2, ne), 0);
	assert_int_equal(gguf_build_tensor(b, "y", QTYPE_Q8_0, 2, ne), 1);
	FILE *fp = fopen(path, "wb");
	assert_non_null(fp);
	uint8_t row[34];
	assert_int_equal(gguf_build_write_tensor(b, fp, 0, row, 34, &err), HEARTH_EINVAL); /* header first */
	assert_int_equal(gguf_build_write_header(b, fp, &err), 0);
	assert_int_equal(gguf_build_write_tensor(b, fp, 1, row, 136, &err), HEARTH_EINVAL); /* order */
	assert_int_equal(gguf_build_write_tensor(b, fp, 0, row, 34, &err), HEARTH_EINVAL);  /* size */
	for (int i = 0; i < 2; i++)
		for (int r = 0; r < 4; r++) {
			for (size_t k = 0; k < 34; k++)
				row[k] = pattern_byte(i, (size_t)r * 34 + k);
			assert_int_equal(gguf_build_write_tensor_part(b, fp, i, row, 34, &err), 0);
		}
	assert_int_equal(gguf_build_write_tensor_part(b, fp, 1, row, 1, &err), HEARTH_EINVAL);
	assert_int_equal(fclose(fp), 0);
	struct gguf_file *f;
	assert_int_equal(gguf_open(&f, path, &err), 0);
	check_pattern(gguf_tensor_find(f, "x"), 0);
	check_pattern(gguf_tensor_find(f, "y"), 1);
	assert_int_equal(gguf_tensor_find(f, "y")->offset, 160);
	gguf_close(f);
	gguf_build_free(b);
}

static void test_gguf_tensor_require_checks_name_and_shape(void **state)
{
	struct gguf_build *b = small_model();
	char path[PATH_MAX];
	tmp_path(path, sizeof path, "require");
	write_file(b, path);
	struct gguf_file *f;
	struct hearth_error err = { 0 };
	const struct gguf_tensor *t = NULL;
	assert_int_equal(gguf_open(&f, path, &err), 0);
	assert_int_equal(gguf_tensor_require(f, "token_embd.weight", 64, 3, &t, &err), 0);
	assert_ptr_equal(t, gguf_tensor_find(f, "token_embd.weight"));
	assert_int_equal(gguf_tensor_require(f, "output_norm.weight", 64, 0, &t, &err), 0);
	assert_int_equal(gguf_tensor_require(f, "token_embd.weight", 64, 4, &t, &err), HEARTH_EFORMAT);
	assert_non_null(strstr(err.msg, "token_embd.weight"));
	assert_non_null(strstr(err.msg, path));
	assert_int_equal(gguf_tensor_require(f, "token_embd.weight", 64, 0, &t, &err), HEARTH_EFORMAT);
	assert_int_equal(gguf_tensor_require(f, "output_norm.weight", 32, 0, &t, &err), HEARTH_EFORMAT);
	assert_int_equal(gguf_tensor_require(f, "output.weight", 64, 3, &t, &err), HEARTH_ENOTFOUND);
	assert_non_null(strstr(err.msg, "output.weight"));
	assert_non_null(strstr(err.msg, path));
	/* missing required key */
	uint32_t v;
	assert_int_equal(gguf_get_u32(f, "llama.block_count", &v, &err), HEARTH_ENOTFOUND);
	assert_non_null(strstr(err.msg, "llama.block_count"));
	assert_non_null(strstr(err.msg, path));
	gguf_close(f);
	gguf_build_free(b);
}

/* Nested array payload: outer element type ARRAY, 2 elements: [u16 x2], [string "ab"]. */
static size_t nested_payload(uint8_t *p, uint64_t inner_n)
{
	size_t n = 0;
	uint32_t u32;
	uint64_t u64;
	u32 = GGUF_VT_ARRAY; memcpy(p + n, &u32, 4); n += 4;
	u64 = 2; memcpy(p + n, &u64, 8); n += 8;
	u32 = GGUF_VT_UINT16; memcpy(p + n, &u32, 4); n += 4;
	u64 = inner_n; memcpy(p + n, &u64, 8); n += 8;
	uint16_t v[2] = { 1, 2 };
	memcpy(p + n, v, 4); n += 4;
	u32 = GGUF_VT_STRING; memcpy(p + n, &u32, 4); n += 4;
	u64 = 1; memcpy(p + n, &u64, 8); n += 8;
	u64 = 2; memcpy(p + n, &u64, 8); n += 8;
	memcpy(p + n, "ab", 2); n += 2;
	return n;
}

static void test_gguf_parses_nested_arrays_within_bounds(void **state)
{
	uint8_t payload[128];
	char path[PATH_MAX];
	struct gguf_build *b = new_build(3);
	size_t n = nested_payload(payload, 2);
	assert_int_equal(gguf_build_kv_raw(b, "nested", GGUF_VT_ARRAY, payload, n), 0);
	assert_int_equal(gguf_build_kv_u32(b, "after", 99), 0);
	tmp_path(path, sizeof path, "nested");
	write_file(b, path);
	struct gguf_file *f;
	struct hearth_error err = { 0 };
	assert_int_equal(gguf_open(&f, path, &err), 0);
	const struct gguf_kv *kv = gguf_kv_find(f, "nested");
	assert_non_null(kv);
	assert_int_equal(kv->arr_type, GGUF_VT_ARRAY);
	assert_int_equal(kv->arr_n, 2);
	assert_null(kv->arr_strs);
	assert_int_equal(gguf_kv_find(f, "after")->v.u, 99);
	gguf_close(f);
	gguf_build_free(b);

	/* an inner count beyond the file */
	b = new_build(3);
	n = nested_payload(payload, UINT64_MAX / 2);
	assert_int_equal(gguf_build_kv_raw(b, "nested", GGUF_VT_ARRAY, payload, n), 0);
	tmp_path(path, sizeof path, "nested-bad");
	write_file(b, path);
	expect_fail(path, HEARTH_EFORMAT, 1, "nested");
	gguf_build_free(b);
}

/* ---- malformed headers ---- */

static void test_gguf_rejects_bad_magic(void **state)
{
	struct gguf_build *b = small_model();
	char path[PATH_MAX];
	tmp_path(path, sizeof path, "magic");
	write_file(b, path);
	patch(path, 0, "GGML", 4);
	expect_fail(path, HEARTH_EFORMAT, 2, "offset 0:", "magic");
	gguf_build_free(b);
}

static void test_gguf_rejects_short_and_empty_files(void **state)
{
	char path[PATH_MAX];
	tmp_path(path, sizeof path, "empty");
	FILE *fp = fopen(path, "wb");
	assert_non_null(fp);
	fclose(fp);
	expect_fail(path, HEARTH_EFORMAT, 1, "offset 0:");
	tmp_path(path, sizeof path, "short");
	fp = fopen(path, "wb");
	assert_non_null(fp);
	fwrite("GGUF\3\0\0\0", 1, 8, fp);
	fclose(fp);
	expect_fail(path, HEARTH_EFORMAT, 1, "header");
	struct gguf_file *f = (struct gguf_file *)1;
	struct hearth_error err = { 0 };
	snprintf(path, sizeof path, "%s/does-not-exist.gguf", tmp_dir);
	assert_int_equal(gguf_open(&f, path, &err), HEARTH_ENOTFOUND);
	assert_null(f);
	assert_non_null(strstr(err.msg, path));
}

static void test_gguf_rejects_unsupported_versions(void **state)
{
	struct gguf_build *b = small_model();
	char path[PATH_MAX];
	tmp_path(path, sizeof path, "version");
	write_file(b, path);
	patch_u32(path, GGUF_BUILD_OFF_VERSION, 1);
	expect_fail(path, HEARTH_EUNSUPPORTED, 2, "offset 4:", "version 1 is not supported");
	patch_u32(path, GGUF_BUILD_OFF_VERSION, 4);
	expect_fail(path, HEARTH_EFORMAT, 2, "offset 4:", "version 4");
	patch_u32(path, GGUF_BUILD_OFF_VERSION, 0x03000000); /* a big-endian file */
	expect_fail(path, HEARTH_EFORMAT, 2, "offset 4:", "big-endian");
	gguf_build_free(b);
}

static void test_gguf_rejects_counts_beyond_the_file(void **state)
{
	struct gguf_build *b = small_model();
	char path[PATH_MAX];
	tmp_path(path, sizeof path, "counts");
	write_file(b, path);
	/* Huge counts must be refused before any allocation for them (valgrind/ASan would
	 * show an attempt). */
	patch_u64(path, GGUF_BUILD_OFF_N_KV, UINT64_MAX);
	expect_fail(path, HEARTH_EFORMAT, 2, "offset 16:", "n_kv");
	patch_u64(path, GGUF_BUILD_OFF_N_KV, 1ull << 40);
	expect_fail(path, HEARTH_EFORMAT, 2, "offset 16:", "n_kv");
	patch_u64(path, GGUF_BUILD_OFF_N_KV, 4);
	patch_u64(path, GGUF_BUILD_OFF_N_TENSORS, UINT64_MAX / 2);
	expect_fail(path, HEARTH_EFORMAT, 2, "offset 8:", "n_tensors");
	/* a count that fits the bytes but claims one tensor too many: the infos run into the
	 * data section and fail on some field, still cleanly */
	patch_u64(path, GGUF_BUILD_OFF_N_TENSORS, 3);
	struct gguf_file *f = NULL;
	struct hearth_error err = { 0 };
	int rc = gguf_open(&f, path, &err);
	assert_true(rc < 0);
	assert_null(f);
	assert_non_null(strstr(err.msg, path));
	gguf_build_free(b);
}

/* ---- malformed metadata ---- */

static void test_gguf_rejects_key_length_beyond_the_file(void **state)
{
	struct gguf_build *b = small_model();
	char path[PATH_MAX], frag[64];
	tmp_path(path, sizeof path, "keylen");
	write_file(b, path);
	uint64_t at = gguf_build_kv_offset(b, 1);
	patch_u64(path, at, 1ull << 62);
	expect_fail(path, HEARTH_EFORMAT, 2, offset_str(frag, sizeof frag, at), "key has length");
	patch_u64(path, at, UINT64_MAX);
	expect_fail(path, HEARTH_EFORMAT, 2, offset_str(frag, sizeof frag, at), "key has length");
	gguf_build_free(b);
}

static void test_gguf_rejects_string_value_beyond_the_file(void **state)
{
	struct gguf_build *b = small_model();
	char path[PATH_MAX], frag[64];
	tmp_path(path, sizeof path, "strlen");
	write_file(b, path);
	uint64_t at = gguf_build_kv_value_offset(b, 0); /* general.architecture's string */
	patch_u64(path, at, gguf_build_file_size(b));
	expect_fail(path, HEARTH_EFORMAT, 2, offset_str(frag, sizeof frag, at), "string value");
	gguf_build_free(b);
}

static void test_gguf_rejects_unknown_value_type(void **state)
{
	struct gguf_build *b = new_build(3);
	char path[PATH_MAX], frag[64];
	uint32_t payload = 7;
	assert_int_equal(gguf_build_kv_str(b, "general.architecture", "llama"), 0);
	assert_int_equal(gguf_build_kv_raw(b, "weird", 13, &payload, 4), 0);
	tmp_path(path, sizeof path, "vtype");
	write_file(b, path);
	uint64_t at = gguf_build_kv_value_offset(b, 1) - 4;
	expect_fail(path, HEARTH_EFORMAT, 3, offset_str(frag, sizeof frag, at), "weird", "unknown value type 13");
	gguf_build_free(b);
}

static void test_gguf_rejects_unknown_array_element_type(void **state)
{
	struct gguf_build *b = new_build(3);
	char path[PATH_MAX], frag[64];
	uint8_t payload[12] = { 0 };
	uint32_t et = 42;
	memcpy(payload, &et, 4);
	assert_int_equal(gguf_build_kv_raw(b, "arr", GGUF_VT_ARRAY, payload, 12), 0);
	tmp_path(path, sizeof path, "arrtype");
	write_file(b, path);
	expect_fail(path, HEARTH_EFORMAT, 3, offset_str(frag, sizeof frag, gguf_build_kv_value_offset(b, 0)),
		    "arr", "element type 42");
	gguf_build_free(b);
}

static void test_gguf_rejects_array_counts_that_overflow(void **state)
{
	struct gguf_build *b = small_model();
	char path[PATH_MAX], frag[64];
	tmp_path(path, sizeof path, "arrcount");
	write_file(b, path);
	/* string array (kv 2): count field after the 4-byte element type */
	uint64_t at = gguf_build_kv_value_offset(b, 2);
	patch_u64(path, at + 4, UINT64_MAX / 8 + 1);
	expect_fail(path, HEARTH_EFORMAT, 2, offset_str(frag, sizeof frag, at), "tokenizer.ggml.tokens");
	gguf_build_free(b);
	/* int32 array (kv 3): n * 4 overflows 64 bits */
	b = small_model();
	tmp_path(path, sizeof path, "arrcount");
	write_file(b, path);
	at = gguf_build_kv_value_offset(b, 3);
	patch_u64(path, at + 4, (UINT64_MAX / 4) + 2);
	expect_fail(path, HEARTH_EFORMAT, 2, offset_str(frag, sizeof frag, at), "tokenizer.ggml.token_type");
	patch_u64(path, at + 4, 1000);
	expect_fail(path, HEARTH_EFORMAT, 2, offset_str(frag, sizeof frag, at), "runs past the end");
	gguf_build_free(b);
}

static void test_gguf_rejects_string_in_array_beyond_the_file(void **state)
{
	struct gguf_build *b = small_model();
	char path[PATH_MAX], frag[64];
	tmp_path(path, sizeof path, "arrstr");
	write_file(b, path);
	/* tokens: type(4) n(8) then "<s>" length at +12, "" at +12+8+3 */
	uint64_t at = gguf_build_kv_value_offset(b, 2) + 12 + 8 + 3;
	patch_u64(path, at, 1ull << 50);
	expect_fail(path, HEARTH_EFORMAT, 2, offset_str(frag, sizeof frag, at), "tokenizer.ggml.tokens': array string 1 of 4");
	gguf_build_free(b);
}

static void test_gguf_rejects_bool_other_than_0_or_1(void **state)
{
	struct gguf_build *b = new_build(3);
	char path[PATH_MAX], frag[64];
	uint8_t two = 2;
	assert_int_equal(gguf_build_kv_raw(b, "flag", GGUF_VT_BOOL, &two, 1), 0);
	tmp_path(path, sizeof path, "bool");
	write_file(b, path);
	expect_fail(path, HEARTH_EFORMAT, 3, offset_str(frag, sizeof frag, gguf_build_kv_value_offset(b, 0)),
		    "flag", "bool");
	gguf_build_free(b);
}

static void test_gguf_rejects_duplicate_keys(void **state)
{
	struct gguf_build *b = small_model();
	char path[PATH_MAX], frag[64];
	assert_int_equal(gguf_build_kv_u32(b, "llama.embedding_length", 128), 0);
	tmp_path(path, sizeof path, "dupkey");
	write_file(b, path);
	expect_fail(path, HEARTH_EFORMAT, 3, offset_str(frag, sizeof frag, gguf_build_kv_offset(b, 4)),
		    "duplicate key 'llama.embedding_length'", "first at offset");
	gguf_build_free(b);
}

static void test_gguf_rejects_bad_general_alignment(void **state)
{
	static const uint32_t bad[] = { 0, 3, 48 };
	char path[PATH_MAX], frag[64];
	for (size_t i = 0; i < 3; i++) {
		struct gguf_build *b = new_build(3);
		assert_int_equal(gguf_build_kv_str(b, "general.architecture", "llama"), 0);
		assert_int_equal(gguf_build_kv_u32(b, "general.alignment", bad[i]), 0);
		tmp_path(path, sizeof path, "badalign");
		write_file(b, path);
		expect_fail(path, HEARTH_EFORMAT, 2, offset_str(frag, sizeof frag, gguf_build_kv_offset(b, 1)),
			    "power of two");
		gguf_build_free(b);
	}
	struct gguf_build *b = new_build(3);
	assert_int_equal(gguf_build_kv_u64(b, "general.alignment", 32), 0);
	tmp_path(path, sizeof path, "badalign");
	write_file(b, path);
	expect_fail(path, HEARTH_EFORMAT, 3, offset_str(frag, sizeof frag, gguf_build_kv_offset(b, 0)),
		    "general.alignment", "uint32");
	gguf_build_free(b);
}

static void test_gguf_rejects_empty_key(void **state)
{
	struct gguf_build *b = new_build(3);
	char path[PATH_MAX], frag[64];
	assert_int_equal(gguf_build_kv_u32(b, "", 1), 0);
	tmp_path(path, sizeof path, "emptykey");
	write_file(b, path);
	expect_fail(path, HEARTH_EFORMAT, 2, offset_str(frag, sizeof frag, 24), "empty");
	gguf_build_free(b);
}

/* ---- malformed tensor infos ---- */

static void test_gguf_rejects_bad_n_dims(void **state)
{
	static const uint32_t bad[] = { 0, 5 };
	uint64_t ne[5] = { 32, 1, 1, 1, 1 };
	char path[PATH_MAX], frag[64];
	for (size_t i = 0; i < 2; i++) {
		struct gguf_build *b = new_build(3);
		assert_int_equal(gguf_build_tensor_raw(b, "t.bad", QTYPE_F32, bad[i], ne, 0), 0);
		tmp_path(path, sizeof path, "ndims");
		write_file(b, path);
		expect_fail(path, HEARTH_EFORMAT, 3,
			    offset_str(frag, sizeof frag, gguf_build_tensor_field_offset(b, 0, GGUF_BUILD_FIELD_N_DIMS)),
			    "t.bad", "n_dims");
		gguf_build_free(b);
	}
}

static void test_gguf_rejects_zero_dimension(void **state)
{
	uint64_t ne[3] = { 32, 0, 2 };
	char path[PATH_MAX], frag[64];
	struct gguf_build *b = small_model();
	assert_int_equal(gguf_build_tensor_raw(b, "t.zero", QTYPE_F32, 3, ne, 0), 2);
	tmp_path(path, sizeof path, "zerodim");
	write_file(b, path);
	expect_fail(path, HEARTH_EFORMAT, 3,
		    offset_str(frag, sizeof frag, gguf_build_tensor_field_offset(b, 2, GGUF_BUILD_FIELD_NE0) + 8),
		    "t.zero", "ne[1] is 0");
	gguf_build_free(b);
}

static void test_gguf_rejects_element_count_overflow(void **state)
{
	uint64_t ne[3] = { 1ull << 32, 1ull << 30, 4 };
	char path[PATH_MAX], frag[64];
	struct gguf_build *b = new_build(3);
	assert_int_equal(gguf_build_tensor_raw(b, "t.huge", QTYPE_F32, 3, ne, 0), 0);
	tmp_path(path, sizeof path, "overflow");
	write_file(b, path);
	expect_fail(path, HEARTH_EFORMAT, 3,
		    offset_str(frag, sizeof frag, gguf_build_tensor_field_offset(b, 0, GGUF_BUILD_FIELD_NE0) + 16),
		    "t.huge", "overflows");
	gguf_build_free(b);
}

static void test_gguf_rejects_byte_size_overflow(void **state)
{
	/* 2^62 elements fit int64, but as F32 they are 2^64 bytes */
	uint64_t ne[1] = { 1ull << 62 };
	char path[PATH_MAX];
	struct gguf_build *b = new_build(3);
	assert_int_equal(gguf_build_tensor_raw(b, "t.big", QTYPE_F32, 1, ne, 0), 0);
	tmp_path(path, sizeof path, "sizeoverflow");
	write_file(b, path);
	expect_fail(path, HEARTH_EFORMAT, 2, "t.big", "byte size");
	gguf_build_free(b);
}

static void test_gguf_rejects_unknown_tensor_type(void **state)
{
	static const uint32_t bad[] = { 10 /* Q2_K: ggml's, not ours */, 99, 0xffffffffu };
	uint64_t ne[1] = { 256 };
	char path[PATH_MAX], frag[64];
	for (size_t i = 0; i < 3; i++) {
		struct gguf_build *b = new_build(3);
		assert_int_equal(gguf_build_tensor_raw(b, "t.type", bad[i], 1, ne, 0), 0);
		tmp_path(path, sizeof path, "ttype");
		write_file(b, path);
		expect_fail(path, HEARTH_EUNSUPPORTED, 3,
			    offset_str(frag, sizeof frag, gguf_build_tensor_field_offset(b, 0, GGUF_BUILD_FIELD_TYPE)),
			    "t.type", "type id");
		gguf_build_free(b);
	}
}

static void test_gguf_rejects_row_not_a_whole_number_of_blocks(void **state)
{
	uint64_t ne[2] = { 48, 2 };
	char path[PATH_MAX];
	struct gguf_build *b = new_build(3);
	assert_int_equal(gguf_build_tensor_raw(b, "t.q4", QTYPE_Q4_0, 2, ne, 0), 0);
	tmp_path(path, sizeof path, "block");
	write_file(b, path);
	expect_fail(path, HEARTH_EFORMAT, 3, "t.q4", "ne[0] = 48", "Q4_0 block size 32");
	gguf_build_free(b);
	b = new_build(3);
	ne[0] = 512 + 32;
	assert_int_equal(gguf_build_tensor_raw(b, "t.q6k", QTYPE_Q6_K, 2, ne, 0), 0);
	tmp_path(path, sizeof path, "block");
	write_file(b, path);
	expect_fail(path, HEARTH_EFORMAT, 2, "t.q6k", "Q6_K block size 256");
	gguf_build_free(b);
}

static void test_gguf_rejects_misaligned_tensor_offset(void **state)
{
	struct gguf_build *b = small_model();
	char path[PATH_MAX], frag[64];
	assert_int_equal(gguf_build_tensor_set_offset(b, 1, 8), 0);
	tmp_path(path, sizeof path, "misaligned");
	write_file(b, path);
	expect_fail(path, HEARTH_EFORMAT, 3,
		    offset_str(frag, sizeof frag, gguf_build_tensor_field_offset(b, 1, GGUF_BUILD_FIELD_OFFSET)),
		    "output_norm.weight", "alignment 32");
	gguf_build_free(b);
}

static void test_gguf_rejects_tensor_data_outside_the_file(void **state)
{
	struct gguf_build *b = small_model();
	char path[PATH_MAX], frag[64];
	tmp_path(path, sizeof path, "outside");
	write_file(b, path);
	uint64_t at = gguf_build_tensor_field_offset(b, 1, GGUF_BUILD_FIELD_OFFSET);
	patch_u64(path, at, 1ull << 20);
	expect_fail(path, HEARTH_EFORMAT, 3, offset_str(frag, sizeof frag, gguf_build_tensor_field_offset(b, 1, GGUF_BUILD_FIELD_NAME)),
		    "tensor 'output_norm.weight' data [", "lies outside the file");
	patch_u64(path, at, UINT64_MAX - 31); /* aligned, and offset + size wraps */
	expect_fail(path, HEARTH_EFORMAT, 2, "output_norm.weight", "overflows");
	gguf_build_free(b);
	/* truncated inside the last tensor's data */
	b = small_model();
	tmp_path(path, sizeof path, "outside");
	write_file(b, path);
	assert_int_equal(truncate(path, (off_t)(gguf_build_tensor_data_offset(b, 1) + 100)), 0);
	expect_fail(path, HEARTH_EFORMAT, 2, "output_norm.weight", "lies outside the file");
	gguf_build_free(b);
}

static void test_gguf_rejects_overlapping_tensors(void **state)
{
	struct gguf_build *b = small_model();
	char path[PATH_MAX];
	uint64_t ne[1] = { 32 };
	assert_int_equal(gguf_build_tensor(b, "third", QTYPE_F32, 1, ne), 2);
	assert_int_equal(gguf_build_tensor_set_offset(b, 2, 96), 0); /* inside token_embd's 204 bytes */
	tmp_path(path, sizeof path, "overlap");
	write_file(b, path);
	expect_fail(path, HEARTH_EFORMAT, 3, "token_embd.weight", "third", "overlaps");
	gguf_build_free(b);
}

static void test_gguf_rejects_duplicate_tensor_names(void **state)
{
	struct gguf_build *b = small_model();
	char path[PATH_MAX], frag[64];
	uint64_t ne[1] = { 32 };
	assert_int_equal(gguf_build_tensor(b, "output_norm.weight", QTYPE_F32, 1, ne), 2);
	tmp_path(path, sizeof path, "duptensor");
	write_file(b, path);
	expect_fail(path, HEARTH_EFORMAT, 3,
		    offset_str(frag, sizeof frag, gguf_build_tensor_field_offset(b, 2, GGUF_BUILD_FIELD_NAME)),
		    "duplicate tensor name 'output_norm.weight'", "first at offset");
	gguf_build_free(b);
}

static void test_gguf_rejects_tensor_name_beyond_the_file(void **state)
{
	struct gguf_build *b = small_model();
	char path[PATH_MAX], frag[64];
	tmp_path(path, sizeof path, "tname");
	write_file(b, path);
	uint64_t at = gguf_build_tensor_field_offset(b, 1, GGUF_BUILD_FIELD_NAME);
	patch_u64(path, at, UINT64_MAX - 3);
	expect_fail(path, HEARTH_EFORMAT, 2, offset_str(frag, sizeof frag, at), "tensor name");
	gguf_build_free(b);
}

/* ---- truncation anywhere ---- */

static void test_gguf_rejects_truncation_at_every_byte(void **state)
{
	struct gguf_build *b = small_model();
	char path[PATH_MAX], cut[PATH_MAX];
	tmp_path(path, sizeof path, "whole");
	tmp_path(cut, sizeof cut, "cut");
	write_file(b, path);
	uint64_t size = gguf_build_file_size(b);
	uint8_t *bytes = malloc(size);
	assert_non_null(bytes);
	FILE *fp = fopen(path, "rb");
	assert_non_null(fp);
	assert_int_equal(fread(bytes, 1, size, fp), size);
	fclose(fp);

	uint64_t data = gguf_build_data_offset(b);
	uint64_t t0 = gguf_build_tensor_data_offset(b, 0), t1 = gguf_build_tensor_data_offset(b, 1);
	uint64_t t1_end = t1 + gguf_build_tensor_size(b, 1);
	uint64_t extra[] = { data + 1, t0 + 100, t1 - 1, t1 + 1, t1_end - 1 };
	size_t n_cuts = (size_t)data + sizeof extra / sizeof extra[0];
	for (size_t k = 0; k < n_cuts; k++) {
		uint64_t len = k < data ? k : extra[k - data];
		fp = fopen(cut, "wb");
		assert_non_null(fp);
		assert_int_equal(fwrite(bytes, 1, (size_t)len, fp), len);
		fclose(fp);
		struct gguf_file *f = (struct gguf_file *)1;
		struct hearth_error err = { 0 };
		int rc = gguf_open(&f, cut, &err);
		if (rc != HEARTH_EFORMAT)
			fail_msg("cut at %" PRIu64 " of %" PRIu64 ": rc %d (%s)", len, size, rc, err.msg);
		assert_null(f);
		assert_non_null(strstr(err.msg, cut));
		assert_non_null(strstr(err.msg, "offset "));
	}
	/* and the whole file opens */
	struct gguf_file *f;
	struct hearth_error err = { 0 };
	assert_int_equal(gguf_open(&f, path, &err), 0);
	gguf_close(f);
	free(bytes);
	gguf_build_free(b);
}

/* ---- real files ---- */

static const char *shared_dir(void)
{
	const char *s = getenv("HEARTH_SHARED");
	if (!s || !*s)
		fail_msg("HEARTH_SHARED is not set: run through `make check` or point it at the shared fixtures");
	return s;
}

static size_t open_all(const char *pattern, bool want_tensors)
{
	char pat[PATH_MAX];
	snprintf(pat, sizeof pat, "%s/%s", shared_dir(), pattern);
	glob_t g;
	if (glob(pat, 0, NULL, &g) != 0)
		fail_msg("no files match %s", pat);
	for (size_t i = 0; i < g.gl_pathc; i++) {
		struct gguf_file *f;
		struct hearth_error err = { 0 };
		if (gguf_open(&f, g.gl_pathv[i], &err) != 0)
			fail_msg("%s", err.msg);
		struct gguf_str arch;
		if (gguf_get_str(f, "general.architecture", &arch, &err) != 0)
			fail_msg("%s", err.msg);
		assert_true(arch.len > 0);
		const struct gguf_kv *toks;
		if (gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &toks, &err) != 0)
			fail_msg("%s", err.msg);
		assert_true(toks->arr_n >= 32000);
		if (want_tensors) {
			assert_true(f->n_tensors > 0);
			for (uint64_t t = 0; t < f->n_tensors; t++) {
				const struct gguf_tensor *ti = &f->tensors[t];
				assert_true((const uint8_t *)ti->data + ti->size <= f->map + f->map_size);
				assert_int_equal((f->data_offset + ti->offset) % f->alignment, 0);
			}
		} else {
			assert_int_equal(f->n_tensors, 0);
		}
		gguf_close(f);
	}
	size_t n = g.gl_pathc;
	globfree(&g);
	return n;
}

static void test_gguf_opens_every_fixture_model(void **state)
{
	assert_true(open_all("fixtures/*.gguf", true) >= 13);
}

static void test_gguf_opens_every_vocabulary(void **state)
{
	assert_true(open_all("vocab/*.gguf", false) >= 6);
}

/* Facts from fixtures/README.md: llama, 64 wide, 2 layers, vocabulary 32000, untied head. */
static void test_gguf_reads_fixture_llama_shapes(void **state)
{
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%s/fixtures/fx-llama.gguf", shared_dir());
	struct gguf_file *f;
	struct hearth_error err = { 0 };
	if (gguf_open(&f, path, &err) != 0)
		fail_msg("%s", err.msg);
	struct gguf_str arch;
	assert_int_equal(gguf_get_str(f, "general.architecture", &arch, &err), 0);
	assert_true(gguf_str_eq(arch, "llama"));
	uint32_t v;
	assert_int_equal(gguf_get_u32(f, "llama.embedding_length", &v, &err), 0);
	assert_int_equal(v, 64);
	assert_int_equal(gguf_get_u32(f, "llama.block_count", &v, &err), 0);
	assert_int_equal(v, 2);
	assert_int_equal(gguf_get_u32(f, "llama.feed_forward_length", &v, &err), 0);
	assert_int_equal(v, 160);
	const struct gguf_tensor *t;
	assert_int_equal(gguf_tensor_require(f, "token_embd.weight", 64, 32000, &t, &err), 0);
	assert_int_equal(t->type, QTYPE_F32);
	assert_int_equal(t->size, 64 * 32000 * 4);
	assert_int_equal(gguf_tensor_require(f, "output.weight", 64, 32000, &t, &err), 0);
	assert_int_equal(gguf_tensor_require(f, "blk.1.ffn_down.weight", 160, 64, &t, &err), 0);
	assert_int_equal(gguf_tensor_require(f, "output_norm.weight", 64, 0, &t, &err), 0);
	/* 2 layers x 9 tensors + token_embd, output_norm, output */
	assert_int_equal(f->n_tensors, 21);
	gguf_close(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gguf_round_trips_every_value_type_v3),
		cmocka_unit_test(test_gguf_round_trips_every_value_type_v2),
		cmocka_unit_test(test_gguf_honours_custom_alignment),
		cmocka_unit_test(test_gguf_streams_tensor_data_in_parts),
		cmocka_unit_test(test_gguf_tensor_require_checks_name_and_shape),
		cmocka_unit_test(test_gguf_parses_nested_arrays_within_bounds),
		cmocka_unit_test(test_gguf_rejects_bad_magic),
		cmocka_unit_test(test_gguf_rejects_short_and_empty_files),
		cmocka_unit_test(test_gguf_rejects_unsupported_versions),
		cmocka_unit_test(test_gguf_rejects_counts_beyond_the_file),
		cmocka_unit_test(test_gguf_rejects_key_length_beyond_the_file),
		cmocka_unit_test(test_gguf_rejects_string_value_beyond_the_file),
		cmocka_unit_test(test_gguf_rejects_unknown_value_type),
		cmocka_unit_test(test_gguf_rejects_unknown_array_element_type),
		cmocka_unit_test(test_gguf_rejects_array_counts_that_overflow),
		cmocka_unit_test(test_gguf_rejects_string_in_array_beyond_the_file),
		cmocka_unit_test(test_gguf_rejects_bool_other_than_0_or_1),
		cmocka_unit_test(test_gguf_rejects_duplicate_keys),
		cmocka_unit_test(test_gguf_rejects_bad_general_alignment),
		cmocka_unit_test(test_gguf_rejects_empty_key),
		cmocka_unit_test(test_gguf_rejects_bad_n_dims),
		cmocka_unit_test(test_gguf_rejects_zero_dimension),
		cmocka_unit_test(test_gguf_rejects_element_count_overflow),
		cmocka_unit_test(test_gguf_rejects_byte_size_overflow),
		cmocka_unit_test(test_gguf_rejects_unknown_tensor_type),
		cmocka_unit_test(test_gguf_rejects_row_not_a_whole_number_of_blocks),
		cmocka_unit_test(test_gguf_rejects_misaligned_tensor_offset),
		cmocka_unit_test(test_gguf_rejects_tensor_data_outside_the_file),
		cmocka_unit_test(test_gguf_rejects_overlapping_tensors),
		cmocka_unit_test(test_gguf_rejects_duplicate_tensor_names),
		cmocka_unit_test(test_gguf_rejects_tensor_name_beyond_the_file),
		cmocka_unit_test(test_gguf_rejects_truncation_at_every_byte),
		cmocka_unit_test(test_gguf_opens_every_fixture_model),
		cmocka_unit_test(test_gguf_opens_every_vocabulary),
		cmocka_unit_test(test_gguf_reads_fixture_llama_shapes),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
