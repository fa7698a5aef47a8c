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
	if (type == QTYPE_KV_Q8)
		return "KV_Q8";
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

/* ggml computes x*d + m and d*q - m as separate multiply and add; a fused multiply-add
 * (which GCC would emit under -mfma with its default -ffp-contract=fast) rounds once and
 * differs in the last bit. Exactness is the point of this file, so contraction is off. */
#define QUANT_EXACT __attribute__((optimize("fp-contract=off")))

static float bits_to_f32(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

static uint32_t f32_to_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	return u;
}

/* The branch-free conversion ggml uses (after Maratyszcza's FP16 library): subnormal halves
 * come out of a float subtraction of a magic bias, normal ones from re-biasing the exponent
 * with one multiply, so infinities and NaNs fall out of the same path. */
float quant_fp16_to_f32(qfp16 h)
{
	const uint32_t w = (uint32_t)h << 16;
	const uint32_t sign = w & UINT32_C(0x80000000);
	const uint32_t two_w = w + w;
	const float normalized = bits_to_f32((two_w >> 4) + (UINT32_C(0xE0) << 23)) * 0x1.0p-112f;
	const float denormalized = bits_to_f32((two_w >> 17) | (UINT32_C(126) << 23)) - 0.5f;
	const uint32_t result = sign |
		(two_w < (UINT32_C(1) << 27) ? f32_to_bits(denormalized) : f32_to_bits(normalized));

	return bits_to_f32(result);
}

/* Rounding is done by the FPU: adding a power of two chosen from the input's exponent
 * pushes the bits below half precision out of the float's mantissa with round-to-nearest-
 * even; the two scalings first saturate overflow to infinity. Every NaN becomes 0x7E00
 * with the input's sign, as in ggml. */
QUANT_EXACT qfp16 quant_f32_to_fp16(float f)
{
	float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
	const uint32_t w = f32_to_bits(f);
	const uint32_t shl1_w = w + w;
	const uint32_t sign = w & UINT32_C(0x80000000);
	uint32_t bias = shl1_w & UINT32_C(0xFF000000);
	uint32_t bits, nonsign;

	if (bias < UINT32_C(0x71000000))
		bias = UINT32_C(0x71000000);
	base = bits_to_f32((bias >> 1) + UINT32_C(0x07800000)) + base;
	bits = f32_to_bits(base);
	nonsign = ((bits >> 13) & UINT32_C(0x00007C00)) + (bits & UINT32_C(0x00000FFF));
	return (qfp16)((sign >> 16) | (shl1_w > UINT32_C(0xFF000000) ? UINT32_C(0x7E00) : nonsign));
}

float quant_bf16_to_f32(uint16_t h)
{
	return bits_to_f32((uint32_t)h << 16);
}

/* Subnormals are kept (not flushed), NaNs are made quiet by setting the top mantissa bit. */
uint16_t quant_f32_to_bf16(float f)
{
	const uint32_t u = f32_to_bits(f);

	if ((u & UINT32_C(0x7fffffff)) > UINT32_C(0x7f800000))
		return (uint16_t)((u >> 16) | 64);
	return (uint16_t)((u + (UINT32_C(0x7fff) + ((u >> 16) & 1))) >> 16);
}

/* Rows arrive as byte pointers (a GGUF mapping, a scratch buffer); fp16 fields are copied
 * out rather than dereferenced so a row need not be 2-byte aligned. */
static float half_at(const void *p)
{
	qfp16 h;
	memcpy(&h, p, sizeof h);
	return quant_fp16_to_f32(h);
}

static void dequant_q4_0(const uint8_t *src, float *y, size_t nb)
{
	for (size_t i = 0; i < nb; i++, src += sizeof(struct block_q4_0), y += QK4_0) {
		const struct block_q4_0 *b = (const void *)src;
		const float d = half_at(&b->d);

		for (int j = 0; j < QK4_0 / 2; j++) {
			y[j] = (float)((b->qs[j] & 0x0F) - 8) * d;
			y[j + QK4_0 / 2] = (float)((b->qs[j] >> 4) - 8) * d;
		}
	}
}

QUANT_EXACT static void dequant_q4_1(const uint8_t *src, float *y, size_t nb)
{
	for (size_t i = 0; i < nb; i++, src += sizeof(struct block_q4_1), y += QK4_1) {
		const struct block_q4_1 *b = (const void *)src;
		const float d = half_at(&b->d);
		const float m = half_at(&b->m);

		for (int j = 0; j < QK4_1 / 2; j++) {
			y[j] = (float)(b->qs[j] & 0x0F) * d + m;
			y[j + QK4_1 / 2] = (float)(b->qs[j] >> 4) * d + m;
		}
	}
}

/* Q5: bit j of the 32-bit qh is the fifth bit of element j (low nibbles hold elements
 * 0..15, high nibbles 16..31). */
static uint32_t q5_high_bits(const uint8_t qh[4])
{
	return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

static void dequant_q5_0(const uint8_t *src, float *y, size_t nb)
{
	for (size_t i = 0; i < nb; i++, src += sizeof(struct block_q5_0), y += QK5_0) {
		const struct block_q5_0 *b = (const void *)src;
		const float d = half_at(&b->d);
		const uint32_t qh = q5_high_bits(b->qh);

		for (int j = 0; j < QK5_0 / 2; j++) {
			const int x0 = (int)((b->qs[j] & 0x0F) | (((qh >> j) & 1) << 4)) - 16;
			const int x1 = (int)((b->qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;

			y[j] = (float)x0 * d;
			y[j + QK5_0 / 2] = (float)x1 * d;
		}
	}
}

QUANT_EXACT static void dequant_q5_1(const uint8_t *src, float *y, size_t nb)
{
	for (size_t i = 0; i < nb; i++, src += sizeof(struct block_q5_1), y += QK5_1) {
		const struct block_q5_1 *b = (const void *)src;
		const float d = half_at(&b->d);
		const float m = half_at(&b->m);
		const uint32_t qh = q5_high_bits(b->qh);

		for (int j = 0; j < QK5_1 / 2; j++) {
			const int x0 = (int)((b->qs[j] & 0x0F) | (((qh >> j) & 1) << 4));
			const int x1 = (int)((b->qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));

			y[j] = (float)x0 * d + m;
			y[j + QK5_1 / 2] = (float)x1 * d + m;
		}
	}
}

static void dequant_q8_0(const uint8_t *src, float *y, size_t nb)
{
	for (size_t i = 0; i < nb; i++, src += sizeof(struct block_q8_0), y += QK8_0) {
		const struct block_q8_0 *b = (const void *)src;
		const float d = half_at(&b->d);

		for (int j = 0; j < QK8_0; j++)
			y[j] = (float)b->qs[j] * d;
	}
}

/* K-quants pack eight 6-bit (scale, min) pairs into 12 bytes: pairs 0..3 sit in the low six
 * bits of bytes 0..3 (scales) and 4..7 (mins); pairs 4..7 keep their low four bits in the
 * nibbles of bytes 8..11 and their top two bits in the spare top bits of bytes 0..7. */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
	if (j < 4) {
		*sc = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*sc = (uint8_t)((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
		*m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
	}
}

QUANT_EXACT static void dequant_q4_K(const uint8_t *src, float *y, size_t nb)
{
	for (size_t i = 0; i < nb; i++, src += sizeof(struct block_q4_K)) {
		const struct block_q4_K *b = (const void *)src;
		const float d = half_at(&b->d);
		const float dmin = half_at(&b->dmin);
		const uint8_t *q = b->qs;

		/* Each 32-byte run of qs holds two 32-element sub-blocks: low nibbles first. */
		for (int is = 0; is < QK_K / 32; is += 2, q += 32) {
			uint8_t sc, m;
			scale_min_k4(is, b->scales, &sc, &m);
			const float d1 = d * (float)sc, m1 = dmin * (float)m;
			scale_min_k4(is + 1, b->scales, &sc, &m);
			const float d2 = d * (float)sc, m2 = dmin * (float)m;

			for (int l = 0; l < 32; l++)
				*y++ = d1 * (float)(q[l] & 0x0F) - m1;
			for (int l = 0; l < 32; l++)
				*y++ = d2 * (float)(q[l] >> 4) - m2;
		}
	}
}

/* Q5_K: like Q4_K, plus qh[l] bit 2k (2k+1) is the fifth bit of element l of sub-block 2k
 * (2k+1). */
QUANT_EXACT static void dequant_q5_K(const uint8_t *src, float *y, size_t nb)
{
	for (size_t i = 0; i < nb; i++, src += sizeof(struct block_q5_K)) {
		const struct block_q5_K *b = (const void *)src;
		const float d = half_at(&b->d);
		const float dmin = half_at(&b->dmin);
		const uint8_t *ql = b->qs;
		const uint8_t *qh = b->qh;
		unsigned u1 = 1, u2 = 2;

		for (int is = 0; is < QK_K / 32; is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
			uint8_t sc, m;
			scale_min_k4(is, b->scales, &sc, &m);
			const float d1 = d * (float)sc, m1 = dmin * (float)m;
			scale_min_k4(is + 1, b->scales, &sc, &m);
			const float d2 = d * (float)sc, m2 = dmin * (float)m;

			for (int l = 0; l < 32; l++)
				*y++ = d1 * (float)((ql[l] & 0x0F) + (qh[l] & u1 ? 16 : 0)) - m1;
			for (int l = 0; l < 32; l++)
				*y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
		}
	}
}

/* Q6_K: each half-block of 128 elements uses 64 bytes of ql (low nibbles: elements 0..31
 * and 32..63; high nibbles: 64..95 and 96..127) and 32 bytes of qh (two bits per element,
 * bit pairs 0,2,4,6 for the four quarters); one signed 8-bit scale per 16 elements. */
static void dequant_q6_K(const uint8_t *src, float *y, size_t nb)
{
	for (size_t i = 0; i < nb; i++, src += sizeof(struct block_q6_K)) {
		const struct block_q6_K *b = (const void *)src;
		const float d = half_at(&b->d);
		const uint8_t *ql = b->ql;
		const uint8_t *qh = b->qh;
		const int8_t *sc = b->scales;

		for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
			for (int l = 0; l < 32; l++) {
				const int is = l / 16;
				const int q1 = (int)((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
				const int q2 = (int)((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
				const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
				const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;

				y[l] = d * (float)sc[is] * (float)q1;
				y[l + 32] = d * (float)sc[is + 2] * (float)q2;
				y[l + 64] = d * (float)sc[is + 4] * (float)q3;
				y[l + 96] = d * (float)sc[is + 6] * (float)q4;
			}
		}
	}
}

void quant_dequant_row(enum qtype type, const void *src, float *dst, size_t n)
{
	const uint8_t *s = src;
	const size_t be = qtype_block_elems(type);
	const size_t nb = be ? n / be : 0;

	switch (type) {
	case QTYPE_F32:
		memcpy(dst, src, n * sizeof(float));
		break;
	case QTYPE_F16:
		for (size_t i = 0; i < n; i++)
			dst[i] = half_at(s + 2 * i);
		break;
	case QTYPE_BF16:
		for (size_t i = 0; i < n; i++) {
			uint16_t h;
			memcpy(&h, s + 2 * i, sizeof h);
			dst[i] = quant_bf16_to_f32(h);
		}
		break;
	case QTYPE_Q4_0: dequant_q4_0(s, dst, nb); break;
	case QTYPE_Q4_1: dequant_q4_1(s, dst, nb); break;
	case QTYPE_Q5_0: dequant_q5_0(s, dst, nb); break;
	case QTYPE_Q5_1: dequant_q5_1(s, dst, nb); break;
	case QTYPE_Q8_0: dequant_q8_0(s, dst, nb); break;
	case QTYPE_Q4_K: dequant_q4_K(s, dst, nb); break;
	case QTYPE_Q5_K: dequant_q5_K(s, dst, nb); break;
	case QTYPE_Q6_K: dequant_q6_K(s, dst, nb); break;
	case QTYPE_KV_Q8: break;  /* a KV cache row, never a tensor: kernels/vec.h reads it */
	}
}

/* Q8_0: d = amax/127, q = round-half-away(x/d). */
QUANT_EXACT static void quantize_q8_0(const float *x, uint8_t *dst, size_t nb)
{
	for (size_t i = 0; i < nb; i++, x += QK8_0, dst += sizeof(struct block_q8_0)) {
		struct block_q8_0 b;
		float amax = 0.0f;

		for (int j = 0; j < QK8_0; j++)
			amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]); /* ggml's MAX, NaN included */
		const float d = amax / 127.0f;
		const float id = d != 0.0f ? 1.0f / d : 0.0f;

		b.d = quant_f32_to_fp16(d);
		for (int j = 0; j < QK8_0; j++)
			b.qs[j] = (int8_t)roundf(x[j] * id);
		memcpy(dst, &b, sizeof b);
	}
}

/* Q4_0: the scale is signed so that the value of largest magnitude maps exactly to -8
 * (the one level that has no positive twin); others round half up after the +8 offset. */
QUANT_EXACT static void quantize_q4_0(const float *x, uint8_t *dst, size_t nb)
{
	for (size_t i = 0; i < nb; i++, x += QK4_0, dst += sizeof(struct block_q4_0)) {
		struct block_q4_0 b;
		float amax = 0.0f, max = 0.0f;

		for (int j = 0; j < QK4_0; j++) {
			if (amax < fabsf(x[j])) {
				amax = fabsf(x[j]);
				max = x[j];
			}
		}
		const float d = max / -8.0f;
		const float id = d != 0.0f ? 1.0f / d : 0.0f;

		b.d = quant_f32_to_fp16(d);
		for (int j = 0; j < QK4_0 / 2; j++) {
			/* ggml truncates through int8_t before clamping; same here, so that the
			 * float-to-int conversion and its edge cases match. */
			int8_t t0 = (int8_t)(x[j] * id + 8.5f);
			int8_t t1 = (int8_t)(x[j + QK4_0 / 2] * id + 8.5f);
			const uint8_t q0 = (uint8_t)(t0 < 15 ? t0 : 15);
			const uint8_t q1 = (uint8_t)(t1 < 15 ? t1 : 15);

			b.qs[j] = (uint8_t)(q0 | (q1 << 4));
		}
		memcpy(dst, &b, sizeof b);
	}
}

bool quant_quantize_row(enum qtype type, const float *src, void *dst, size_t n)
{
	uint8_t *d = dst;

	switch (type) {
	case QTYPE_F32:
		memcpy(dst, src, n * sizeof(float));
		return true;
	case QTYPE_F16:
		for (size_t i = 0; i < n; i++) {
			const qfp16 h = quant_f32_to_fp16(src[i]);
			memcpy(d + 2 * i, &h, sizeof h);
		}
		return true;
	case QTYPE_BF16:
		for (size_t i = 0; i < n; i++) {
			const uint16_t h = quant_f32_to_bf16(src[i]);
			memcpy(d + 2 * i, &h, sizeof h);
		}
		return true;
	case QTYPE_Q8_0:
		if (n % QK8_0)
			return false;
		quantize_q8_0(src, d, n / QK8_0);
		return true;
	case QTYPE_Q4_0:
		if (n % QK4_0)
			return false;
		quantize_q4_0(src, d, n / QK4_0);
		return true;
	default:
		return false;
	}
}
