/* Scalar reference for ggml's tensor element types: sizes, fp16/bf16 conversions, and
 * dequantize/quantize of rows, bit for bit as llama.cpp's ggml-quants.c computes them.
 * Every faster kernel and the loader's repack are checked against this file. */
#include "kernels/quant.h"

#include <math.h>
#include <string.h>

struct qtype_info {
	const char *name;
	size_t block_elems;
	size_t block_bytes;
};

static const struct qtype_info *qtype_info(uint32_t type)
{
	static const struct qtype_info f32 = { "F32", 1, 4 };
	static const struct qtype_info f16 = { "F16", 1, 2 };
	static const struct qtype_info bf16 = { "BF16", 1, 2 };
	static const struct qtype_info q4_0 = { "Q4_0", QK4_0, sizeof(struct block_q4_0) };
	static const struct qtype_info q4_1 = { "Q4_1", QK4_1, sizeof(struct block_q4_1) };
	static const struct qtype_info q5_0 = { "Q5_0", QK5_0, sizeof(struct block_q5_0) };
	static const struct qtype_info q5_1 = { "Q5_1", QK5_1, sizeof(struct block_q5_1) };
	static const struct qtype_info q8_0 = { "Q8_0", QK8_0, sizeof(struct block_q8_0) };
	static const struct qtype_info q4_k = { "Q4_K", QK_K, sizeof(struct block_q4_K) };
	static const struct qtype_info q5_k = { "Q5_K", QK_K, sizeof(struct block_q5_K) };
	static const struct qtype_info q6_k = { "Q6_K", QK_K, sizeof(struct block_q6_K) };

	switch (type) {
	case QTYPE_F32: return &f32;
	case QTYPE_F16: return &f16;
	case QTYPE_BF16: return &bf16;
	case QTYPE_Q4_0: return &q4_0;
	case QTYPE_Q4_1: return &q4_1;
	case QTYPE_Q5_0: return &q5_0;
	case QTYPE_Q5_1: return &q5_1;
	case QTYPE_Q8_0: return &q8_0;
	case QTYPE_Q4_K: return &q4_k;
	case QTYPE_Q5_K: return &q5_k;
	case QTYPE_Q6_K: return &q6_k;
	default: return NULL;
	}
}

bool qtype_known(uint32_t type)
{
	return qtype_info(type) != NULL;
}

const char *qtype_name(uint32_t type)
{
	const struct qtype_info *info = qtype_info(type);
	return info ? info->name : "?";
}

size_t qtype_block_elems(enum qtype type)
{
	const struct qtype_info *info = qtype_info(type);
	return info ? info->block_elems : 0;
}

size_t qtype_block_bytes(enum qtype type)
{
	const struct qtype_info *info = qtype_info(type);
	return info ? info->block_bytes : 0;
}

bool qtype_row_bytes(enum qtype type, uint64_t n, size_t *out)
{
	const struct qtype_info *info = qtype_info(type);
	size_t bytes;

	if (!info || n % info->block_elems != 0)
		return false;
	/* The builtin checks the product against size_t, whatever uint64_t's width. */
	if (__builtin_mul_overflow(n / info->block_elems, (uint64_t)info->block_bytes, &bytes))
		return false;
	*out = bytes;
	return true;
}
