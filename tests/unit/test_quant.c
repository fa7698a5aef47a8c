/* Unit tests for kernels/quant: block sizes, fp16/bf16 conversions against their IEEE
 * definitions, hand-packed blocks of every type with values known in advance, the two
 * reference quantizers, and llama.cpp's own quantized fixtures against their F16 twin. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/gguf.h"
#include "kernels/quant.h"

static uint32_t fbits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	return u;
}

static float bitsf(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

/* A deterministic generator for test data; xorshift64* and Box-Muller. */
static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * UINT64_C(2685821657736338717);
}

static float rng_normal(uint64_t *s)
{
	double u1 = ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
	double u2 = (double)(rng_next(s) >> 11) / 9007199254740992.0;
	return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

/* The value of an IEEE binary16 from its fields, written from the standard. */
static double half_value(uint16_t h)
{
	const int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
	double v;

	if (exp == 0)
		v = ldexp(mant, -24);
	else if (exp == 31)
		v = mant ? NAN : INFINITY;
	else
		v = ldexp(1024 + mant, exp - 25);
	return sign ? -v : v;
}

/* ---- sizes and names */

static void test_qtype_sizes_match_ggml(void **state)
{
	static const struct { uint32_t type; const char *name; size_t elems, bytes; } t[] = {
		{ 0, "F32", 1, 4 },     { 1, "F16", 1, 2 },     { 30, "BF16", 1, 2 },
		{ 2, "Q4_0", 32, 18 },  { 3, "Q4_1", 32, 20 },  { 6, "Q5_0", 32, 22 },
		{ 7, "Q5_1", 32, 24 },  { 8, "Q8_0", 32, 34 },  { 12, "Q4_K", 256, 144 },
		{ 13, "Q5_K", 256, 176 }, { 14, "Q6_K", 256, 210 },
	};
	(void)state;
	for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
		assert_true(qtype_known(t[i].type));
		assert_string_equal(qtype_name(t[i].type), t[i].name);
		assert_int_equal(qtype_block_elems((enum qtype)t[i].type), t[i].elems);
		assert_int_equal(qtype_block_bytes((enum qtype)t[i].type), t[i].bytes);
	}
}

static void test_qtype_rejects_unknown_ids(void **state)
{
	/* 4 and 5 were Q4_2/Q4_3 (removed), 9 is Q8_1, 10/11 Q2_K/Q3_K, 15 Q8_K, 16+ IQ types. */
	static const uint32_t bad[] = { 4, 5, 9, 10, 11, 15, 16, 29, 31, 39, 1000, UINT32_MAX };
	size_t out;
	(void)state;
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		assert_false(qtype_known(bad[i]));
		assert_string_equal(qtype_name(bad[i]), "?");
		assert_false(qtype_row_bytes((enum qtype)bad[i], 256, &out));
	}
}

static void test_qtype_row_bytes_checks_blocks_and_overflow(void **state)
{
	size_t out = 0;
	(void)state;
	assert_true(qtype_row_bytes(QTYPE_Q4_K, 4096, &out));
	assert_int_equal(out, 16 * 144);
	assert_true(qtype_row_bytes(QTYPE_Q4_0, 1024, &out));
	assert_int_equal(out, 32 * 18);
	assert_true(qtype_row_bytes(QTYPE_BF16, 3, &out));
	assert_int_equal(out, 6);
	assert_true(qtype_row_bytes(QTYPE_F32, 0, &out));
	assert_int_equal(out, 0);
	assert_false(qtype_row_bytes(QTYPE_Q4_0, 33, &out));
	assert_false(qtype_row_bytes(QTYPE_Q6_K, 128, &out));
	assert_false(qtype_row_bytes(QTYPE_F32, UINT64_MAX, &out));
	assert_false(qtype_row_bytes(QTYPE_Q8_0, UINT64_MAX - 31, &out)); /* 2^59-1 blocks of 34 */
}

/* ---- fp16 */

static void test_fp16_to_f32_matches_ieee_for_every_half(void **state)
{
	(void)state;
	for (uint32_t h = 0; h < 65536; h++) {
		const float got = quant_fp16_to_f32((qfp16)h);
		const double want = half_value((uint16_t)h);

		if (isnan(want)) {
			assert_true(isnan(got));
			assert_int_equal(!!signbit(got), h >> 15);
		} else {
			if ((double)got != want || !signbit(got) != !signbit(want))
				fail_msg("half 0x%04x: got %a want %a", h, (double)got, want);
		}
	}
}

static void test_f32_to_fp16_round_trips_every_half(void **state)
{
	(void)state;
	for (uint32_t h = 0; h < 65536; h++) {
		if (((h >> 10) & 31) == 31 && (h & 1023))
			continue; /* NaNs: checked below */
		const qfp16 back = quant_f32_to_fp16(quant_fp16_to_f32((qfp16)h));
		if (back != h)
			fail_msg("half 0x%04x came back as 0x%04x", h, back);
	}
}

/* Between every two neighbouring finite halves (subnormals included) the exact midpoint
 * goes to the one with an even mantissa, and the floats just beside it go to the nearer. */
static void test_f32_to_fp16_rounds_to_nearest_even(void **state)
{
	(void)state;
	for (uint32_t h = 0; h < 0x7BFF; h++) {
		for (int neg = 0; neg < 2; neg++) {
			const uint16_t s = neg ? 0x8000 : 0;
			const float a = (float)half_value((uint16_t)h), b = (float)half_value((uint16_t)(h + 1));
			float mid = (a + b) / 2; /* exact: 12 significant bits */
			const uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
			float lo = nextafterf(mid, 0.0f), hi = nextafterf(mid, INFINITY);

			if (neg) {
				mid = -mid;
				lo = -lo;
				hi = -hi;
			}
			assert_int_equal(quant_f32_to_fp16(mid), even | s);
			assert_int_equal(quant_f32_to_fp16(lo), h | s);
			assert_int_equal(quant_f32_to_fp16(hi), (h + 1) | s);
		}
	}
}

static void test_f32_to_fp16_handles_overflow_underflow_inf_nan(void **state)
{
	(void)state;
	assert_int_equal(quant_f32_to_fp16(65504.0f), 0x7BFF);
	assert_int_equal(quant_f32_to_fp16(nextafterf(65520.0f, 0.0f)), 0x7BFF);
	assert_int_equal(quant_f32_to_fp16(65520.0f), 0x7C00); /* tie with "65536": even = inf */
	assert_int_equal(quant_f32_to_fp16(1e10f), 0x7C00);
	assert_int_equal(quant_f32_to_fp16(-1e10f), 0xFC00);
	assert_int_equal(quant_f32_to_fp16(INFINITY), 0x7C00);
	assert_int_equal(quant_f32_to_fp16(-INFINITY), 0xFC00);
	assert_int_equal(quant_f32_to_fp16(FLT_MAX), 0x7C00);
	assert_int_equal(quant_f32_to_fp16(0x1p-25f), 0x0000);             /* half of 2^-24: tie, even = 0 */
	assert_int_equal(quant_f32_to_fp16(nextafterf(0x1p-25f, 1.0f)), 0x0001);
	assert_int_equal(quant_f32_to_fp16(0x1.8p-24f), 0x0002);           /* 1.5 ulp: tie to 2 */
	assert_int_equal(quant_f32_to_fp16(1e-30f), 0x0000);
	assert_int_equal(quant_f32_to_fp16(-1e-30f), 0x8000);
	assert_int_equal(quant_f32_to_fp16(bitsf(0x00000001)), 0x0000);    /* f32 subnormal */
	assert_int_equal(quant_f32_to_fp16(bitsf(0x80400000)), 0x8000);
	assert_int_equal(quant_f32_to_fp16(0.0f), 0x0000);
	assert_int_equal(quant_f32_to_fp16(-0.0f), 0x8000);
	assert_int_equal(quant_f32_to_fp16(1.0f), 0x3C00);
	assert_int_equal(quant_f32_to_fp16(-2.0f), 0xC000);
	assert_int_equal(quant_f32_to_fp16(0x1p-14f), 0x0400);             /* smallest normal */
	/* ggml makes every NaN the canonical quiet NaN, keeping only the sign. */
	assert_int_equal(quant_f32_to_fp16(bitsf(0x7FC00000)), 0x7E00);
	assert_int_equal(quant_f32_to_fp16(bitsf(0x7F800001)), 0x7E00);
	assert_int_equal(quant_f32_to_fp16(bitsf(0xFFFFFFFF)), 0xFE00);
}

/* ---- bf16 */

static void test_bf16_to_f32_is_the_top_half(void **state)
{
	(void)state;
	assert_true(quant_bf16_to_f32(0x3F80) == 1.0f);
	assert_true(quant_bf16_to_f32(0xC000) == -2.0f);
	assert_true(quant_bf16_to_f32(0x3E20) == 0.15625f);
	assert_true(quant_bf16_to_f32(0x0001) == 0x1p-133f);
	assert_true(isinf(quant_bf16_to_f32(0x7F80)));
	assert_true(isnan(quant_bf16_to_f32(0xFFC1)));
	for (uint32_t h = 0; h < 65536; h++)
		assert_int_equal(fbits(quant_bf16_to_f32((uint16_t)h)), h << 16);
}

static void test_f32_to_bf16_rounds_to_nearest_even(void **state)
{
	(void)state;
	assert_int_equal(quant_f32_to_bf16(1.0f), 0x3F80);
	assert_int_equal(quant_f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);             /* tie, even below */
	assert_int_equal(quant_f32_to_bf16(nextafterf(1.0f + 0x1p-8f, 2.0f)), 0x3F81);
	assert_int_equal(quant_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);         /* tie, even above */
	assert_int_equal(quant_f32_to_bf16(nextafterf(1.0f + 3 * 0x1p-8f, 0.0f)), 0x3F81);
	assert_int_equal(quant_f32_to_bf16(-(1.0f + 3 * 0x1p-8f)), 0xBF82);
	/* Subnormals are rounded like anything else, not flushed. */
	assert_int_equal(quant_f32_to_bf16(bitsf(0x00010000)), 0x0001);
	assert_int_equal(quant_f32_to_bf16(bitsf(0x00008000)), 0x0000);
	assert_int_equal(quant_f32_to_bf16(bitsf(0x00018000)), 0x0002);
	assert_int_equal(quant_f32_to_bf16(bitsf(0x80008001)), 0x8001);
	/* The largest float rounds up to infinity; infinities stay. */
	assert_int_equal(quant_f32_to_bf16(FLT_MAX), 0x7F80);
	assert_int_equal(quant_f32_to_bf16(bitsf(0x7F7F7FFF)), 0x7F7F);
	assert_int_equal(quant_f32_to_bf16(INFINITY), 0x7F80);
	assert_int_equal(quant_f32_to_bf16(-INFINITY), 0xFF80);
}

static void test_f32_to_bf16_keeps_nan_a_quiet_nan(void **state)
{
	(void)state;
	/* A signalling NaN whose payload sits below bit 16 would become infinity if rounded. */
	assert_int_equal(quant_f32_to_bf16(bitsf(0x7F800001)), 0x7FC0);
	assert_int_equal(quant_f32_to_bf16(bitsf(0x7FC00000)), 0x7FC0);
	assert_int_equal(quant_f32_to_bf16(bitsf(0xFF810000)), 0xFFC1);
	assert_int_equal(quant_f32_to_bf16(bitsf(0x7FFFFFFF)), 0x7FFF);
}

/* The value of float bits, except that the all-ones exponent counts as 2^128: the next
 * step after the largest finite bf16, where rounding overflows to infinity. */
static double value_or_overflow(uint32_t bits)
{
	if (((bits >> 23) & 255) == 255)
		return (bits >> 31) ? -ldexp(1, 128) : ldexp(1, 128);
	return (double)bitsf(bits);
}

/* Nearest of the two bf16 neighbours by exact (double) distance, even on a tie. */
static void test_f32_to_bf16_matches_nearest_on_random_floats(void **state)
{
	uint64_t s = 0x9E3779B97F4A7C15u;
	(void)state;
	for (int i = 0; i < 1000000; i++) {
		const uint32_t u = (uint32_t)rng_next(&s);
		const float f = bitsf(u);
		if (isnan(f) || isinf(f))
			continue;
		const uint32_t lo = u & 0xFFFF0000u;
		const double dlo = fabs((double)f - value_or_overflow(lo));
		const double dhi = fabs(value_or_overflow(lo + 0x10000u) - (double)f);
		uint16_t want;

		if (dlo < dhi || (dlo == dhi && !((lo >> 16) & 1)))
			want = (uint16_t)(lo >> 16);
		else
			want = (uint16_t)((lo >> 16) + 1);
		if (quant_f32_to_bf16(f) != want)
			fail_msg("f32 0x%08x: got 0x%04x want 0x%04x", u, quant_f32_to_bf16(f), want);
	}
}

/* ---- dequantization of hand-packed blocks. Each test chooses the integer codes, packs
 * them as the format describes, and expects code * scale (+ or - offset). */

static void put_half(void *p, uint16_t h)
{
	memcpy(p, &h, 2);
}

static void test_dequant_f32_f16_bf16_rows(void **state)
{
	const float f32[3] = { 1.5f, -0.0f, 1e-40f };
	const uint16_t f16[4] = { 0x3C00, 0xC500, 0x0001, 0x7C00 };
	const uint16_t b16[3] = { 0x3F80, 0xBFC0, 0x4049 };
	float out[4];
	(void)state;

	quant_dequant_row(QTYPE_F32, f32, out, 3);
	assert_memory_equal(out, f32, sizeof f32);
	quant_dequant_row(QTYPE_F16, f16, out, 4);
	assert_true(out[0] == 1.0f && out[1] == -5.0f && out[2] == 0x1p-24f && isinf(out[3]));
	quant_dequant_row(QTYPE_BF16, b16, out, 3);
	assert_true(out[0] == 1.0f && out[1] == -1.5f && out[2] == 3.140625f);
}

static void test_dequant_q4_0_centres_nibbles_on_8(void **state)
{
	struct block_q4_0 b[2];
	float out[64];
	(void)state;

	put_half(&b[0].d, 0x3C00); /* 1.0 */
	put_half(&b[1].d, 0xB800); /* -0.5 */
	for (int j = 0; j < 16; j++) {
		b[0].qs[j] = (uint8_t)(j | (15 - j) << 4); /* element j = j, element 16+j = 15-j */
		b[1].qs[j] = 0xF0;                         /* low nibble 0, high nibble 15 */
	}
	quant_dequant_row(QTYPE_Q4_0, b, out, 64);
	for (int j = 0; j < 16; j++) {
		assert_true(out[j] == (float)(j - 8));
		assert_true(out[16 + j] == (float)(7 - j));
		assert_true(out[32 + j] == 4.0f);      /* (0-8) * -0.5 */
		assert_true(out[48 + j] == -3.5f);     /* (15-8) * -0.5 */
	}
}

static void test_dequant_q4_1_adds_the_minimum(void **state)
{
	struct block_q4_1 b;
	float out[32];
	(void)state;

	put_half(&b.d, 0x3800); /* 0.5 */
	put_half(&b.m, 0xBC00); /* -1.0 */
	for (int j = 0; j < 16; j++)
		b.qs[j] = (uint8_t)((15 - j) | j << 4);
	quant_dequant_row(QTYPE_Q4_1, &b, out, 32);
	for (int j = 0; j < 16; j++) {
		assert_true(out[j] == (float)(15 - j) * 0.5f - 1.0f);
		assert_true(out[16 + j] == (float)j * 0.5f - 1.0f);
	}
	assert_true(out[0] == 6.5f && out[16] == -1.0f);
}

/* Q5_0/Q5_1: element e < 16 takes the low nibble of qs[e], e >= 16 the high nibble of
 * qs[e-16]; its fifth bit is bit e of the little-endian 32-bit qh. */
static void pack_q5(const int q[32], uint8_t qs[16], uint8_t qh[4])
{
	uint32_t h = 0;

	for (int j = 0; j < 16; j++) {
		qs[j] = (uint8_t)((q[j] & 15) | (q[j + 16] & 15) << 4);
		h |= (uint32_t)(q[j] >> 4) << j;
		h |= (uint32_t)(q[j + 16] >> 4) << (j + 16);
	}
	qh[0] = (uint8_t)h;
	qh[1] = (uint8_t)(h >> 8);
	qh[2] = (uint8_t)(h >> 16);
	qh[3] = (uint8_t)(h >> 24);
}

static void test_dequant_q5_0_uses_the_fifth_bit(void **state)
{
	struct block_q5_0 b;
	int q[32];
	float out[32];
	(void)state;

	for (int e = 0; e < 32; e++)
		q[e] = (e * 7 + 3) % 32; /* every code 0..31 once */
	put_half(&b.d, 0x4000); /* 2.0 */
	pack_q5(q, b.qs, b.qh);
	quant_dequant_row(QTYPE_Q5_0, &b, out, 32);
	for (int e = 0; e < 32; e++)
		assert_true(out[e] == (float)(q[e] - 16) * 2.0f);

	/* A literal block: qh = 0x80000001 sets the fifth bit of elements 0 and 31 only. */
	memset(&b, 0, sizeof b);
	put_half(&b.d, 0x3C00);
	b.qh[0] = 0x01;
	b.qh[3] = 0x80;
	b.qs[15] = 0xF0;
	quant_dequant_row(QTYPE_Q5_0, &b, out, 32);
	assert_true(out[0] == 0.0f);   /* 16 - 16 */
	assert_true(out[1] == -16.0f);
	assert_true(out[15] == -16.0f);
	assert_true(out[31] == 15.0f); /* 31 - 16 */
	assert_true(out[30] == -16.0f);
}

static void test_dequant_q5_1_uses_the_fifth_bit_and_minimum(void **state)
{
	struct block_q5_1 b;
	int q[32];
	float out[32];
	(void)state;

	for (int e = 0; e < 32; e++)
		q[e] = (e * 13 + 5) % 32;
	put_half(&b.d, 0x3400); /* 0.25 */
	put_half(&b.m, 0x4200); /* 3.0 */
	pack_q5(q, b.qs, b.qh);
	quant_dequant_row(QTYPE_Q5_1, &b, out, 32);
	for (int e = 0; e < 32; e++)
		assert_true(out[e] == (float)q[e] * 0.25f + 3.0f);
}

static void test_dequant_q8_0_scales_signed_bytes(void **state)
{
	struct block_q8_0 b[2];
	float out[64];
	(void)state;

	put_half(&b[0].d, 0x3400); /* 0.25 */
	put_half(&b[1].d, 0x0001); /* 2^-24, a subnormal scale */
	for (int j = 0; j < 32; j++) {
		b[0].qs[j] = (int8_t)(j * 8 - 128);
		b[1].qs[j] = (int8_t)(127 - j);
	}
	quant_dequant_row(QTYPE_Q8_0, b, out, 64);
	for (int j = 0; j < 32; j++) {
		assert_true(out[j] == (float)(j * 8 - 128) * 0.25f);
		assert_true(out[32 + j] == ldexpf((float)(127 - j), -24));
	}
}

/* K-quant scales: eight 6-bit (scale, min) pairs in 12 bytes. Pair j < 4: scale in the low
 * six bits of byte j, min in byte j+4. Pair j >= 4: low four bits in byte j+4 (scale low
 * nibble, min high nibble), top two bits in the top two bits of byte j-4 (scale) and byte j
 * (min). */
static void pack_k_scales(const int sc[8], const int mn[8], uint8_t s[12])
{
	for (int j = 0; j < 4; j++) {
		s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
		s[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
		s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
	}
}

static const int k_scales[8] = { 1, 63, 17, 32, 5, 48, 63, 33 };
static const int k_mins[8] = { 0, 2, 63, 16, 47, 15, 31, 1 };

/* Sub-blocks of 32; byte l of each 32-byte run of qs holds element l of sub-block 2k in its
 * low nibble and element l of sub-block 2k+1 in its high nibble. */
static void test_dequant_q4_k_applies_sub_block_scales_and_mins(void **state)
{
	struct block_q4_K b;
	int q[256];
	float out[256];
	(void)state;

	for (int e = 0; e < 256; e++)
		q[e] = (e * 5 + e / 32) % 16;
	put_half(&b.d, 0x3C00);    /* 1.0 */
	put_half(&b.dmin, 0x3800); /* 0.5 */
	pack_k_scales(k_scales, k_mins, b.scales);
	for (int k = 0; k < 4; k++)
		for (int l = 0; l < 32; l++)
			b.qs[32 * k + l] = (uint8_t)(q[64 * k + l] | q[64 * k + 32 + l] << 4);
	quant_dequant_row(QTYPE_Q4_K, &b, out, 256);
	for (int e = 0; e < 256; e++) {
		const float want = (float)(k_scales[e / 32] * q[e]) - 0.5f * (float)k_mins[e / 32];
		if (out[e] != want)
			fail_msg("element %d: got %g want %g", e, (double)out[e], (double)want);
	}
}

/* The same layout written as literal bytes, so a packing mistake shared by the test and
 * the code cannot hide: sub-block 4's scale is 5 | 3<<4 = 53 and its min is 2 | 1<<4 = 18. */
static void test_dequant_q4_k_literal_high_scale_bits(void **state)
{
	struct block_q4_K b;
	float out[256];
	(void)state;

	memset(&b, 0, sizeof b);
	put_half(&b.d, 0x3C00);
	put_half(&b.dmin, 0x3C00);
	b.scales[0] = 0xC1;  /* pair 0 scale 1; top bits 3 belong to pair 4's scale */
	b.scales[4] = 0x47;  /* pair 0 min 7; top bits 1 belong to pair 4's min */
	b.scales[8] = 0x25;  /* pair 4: scale low nibble 5, min low nibble 2 */
	b.qs[0] = 0x3A;      /* element 0: 10 (sub-block 0), element 32: 3 (sub-block 1) */
	b.qs[64] = 0x09;     /* element 128: 9 (sub-block 4) */
	quant_dequant_row(QTYPE_Q4_K, &b, out, 256);
	assert_true(out[0] == 1.0f * 10 - 7);
	assert_true(out[1] == -7.0f);
	assert_true(out[32] == 0.0f);   /* pair 1: scale 0, min 0 */
	assert_true(out[128] == 53.0f * 9 - 18);
	assert_true(out[129] == -18.0f);
	assert_true(out[160] == 0.0f);
}

/* Q5_K: as Q4_K, and bit k of qh[l] is the fifth bit of element l of sub-block k. */
static void test_dequant_q5_k_applies_high_bits(void **state)
{
	struct block_q5_K b;
	int q[256];
	float out[256];
	(void)state;

	for (int e = 0; e < 256; e++)
		q[e] = (e * 11 + e / 32 * 3) % 32;
	put_half(&b.d, 0x3800);    /* 0.5 */
	put_half(&b.dmin, 0x4000); /* 2.0 */
	pack_k_scales(k_scales, k_mins, b.scales);
	memset(b.qh, 0, sizeof b.qh);
	for (int k = 0; k < 4; k++)
		for (int l = 0; l < 32; l++)
			b.qs[32 * k + l] = (uint8_t)((q[64 * k + l] & 15) | (q[64 * k + 32 + l] & 15) << 4);
	for (int e = 0; e < 256; e++)
		b.qh[e % 32] |= (uint8_t)((q[e] >> 4) << (e / 32));
	quant_dequant_row(QTYPE_Q5_K, &b, out, 256);
	for (int e = 0; e < 256; e++) {
		const float want = 0.5f * (float)(k_scales[e / 32] * q[e]) - 2.0f * (float)k_mins[e / 32];
		if (out[e] != want)
			fail_msg("element %d: got %g want %g", e, (double)out[e], (double)want);
	}
}

/* Q6_K: two halves of 128. In half h, element h*128 + 32*k + l (k = 0..3) has its low
 * four bits in ql[64h + l + 32*(k&1)] (low nibble for k < 2, high for k >= 2) and its top
 * two bits in bits 2k..2k+1 of qh[32h + l]; code - 32 times the signed scale of its 16. */
static void test_dequant_q6_k_unpacks_six_bit_codes(void **state)
{
	struct block_q6_K b;
	int q[256];
	float out[256];
	(void)state;

	for (int e = 0; e < 256; e++)
		q[e] = (e * 37 + 11) % 64;
	for (int g = 0; g < 16; g++)
		b.scales[g] = (int8_t)(g * 17 - 128); /* -128 .. 127 */
	put_half(&b.d, 0x3800); /* 0.5 */
	memset(b.ql, 0, sizeof b.ql);
	memset(b.qh, 0, sizeof b.qh);
	for (int e = 0; e < 256; e++) {
		const int h = e / 128, k = (e % 128) / 32, l = e % 32;
		const int qli = 64 * h + l + 32 * (k & 1);
		b.ql[qli] |= (uint8_t)((q[e] & 15) << (k >= 2 ? 4 : 0));
		b.qh[32 * h + l] |= (uint8_t)((q[e] >> 4) << (2 * k));
	}
	quant_dequant_row(QTYPE_Q6_K, &b, out, 256);
	for (int e = 0; e < 256; e++) {
		const float want = 0.5f * (float)(b.scales[e / 16] * (q[e] - 32));
		if (out[e] != want)
			fail_msg("element %d: got %g want %g", e, (double)out[e], (double)want);
	}
}

static void test_dequant_q6_k_literal_bytes(void **state)
{
	struct block_q6_K b;
	float out[256];
	(void)state;

	memset(&b, 0, sizeof b);
	put_half(&b.d, 0x3C00);
	for (int g = 0; g < 16; g++)
		b.scales[g] = 1;
	b.scales[4] = -3;  /* elements 64..79 */
	b.ql[0] = 0x5F;    /* element 0 low bits 15, element 64 low bits 5 */
	b.qh[0] = 0x23;    /* element 0 top 3, element 32 top 0, element 64 top 2 */
	b.ql[64] = 0x01;   /* second half: element 128 low bits 1 */
	b.qh[32] = 0x02;   /* element 128 top 2 */
	quant_dequant_row(QTYPE_Q6_K, &b, out, 256);
	assert_true(out[0] == 63 - 32);
	assert_true(out[32] == -32.0f);
	assert_true(out[64] == -3.0f * (37 - 32));
	assert_true(out[128] == 33 - 32);
	assert_true(out[255] == -32.0f);
}

/* ---- quantization */

static void test_quantize_q8_0_rounds_half_away_from_zero(void **state)
{
	float x[32] = { 127.0f, -3.5f, 2.5f, 0.49f, -0.5f, 0.5f, -127.0f, 100.2f };
	struct block_q8_0 b;
	const int8_t want[8] = { 127, -4, 3, 0, -1, 1, -127, 100 };
	(void)state;

	assert_true(quant_quantize_row(QTYPE_Q8_0, x, &b, 32)); /* amax 127: d = 1 exactly */
	assert_int_equal(b.d, 0x3C00);
	for (int j = 0; j < 8; j++)
		assert_int_equal(b.qs[j], want[j]);
	for (int j = 8; j < 32; j++)
		assert_int_equal(b.qs[j], 0);
}

static void test_quantize_q4_0_maps_the_extreme_to_minus_8(void **state)
{
	float x[32] = { -8.0f, 7.0f, 7.6f, 0.49f, 0.5f, -0.5f, -0.51f, 3.0f };
	float y[32] = { 8.0f, -8.0f, 1.0f, -1.49f };
	struct block_q4_0 b;
	(void)state;

	/* max magnitude -8: d = 1, code = trunc(x + 8.5) clamped to 15 */
	assert_true(quant_quantize_row(QTYPE_Q4_0, x, &b, 32));
	assert_int_equal(b.d, 0x3C00);
	assert_int_equal(b.qs[0], 0x80 | 0);   /* element 16 is 0 -> code 8 */
	assert_int_equal(b.qs[1] & 15, 15);
	assert_int_equal(b.qs[2] & 15, 15);    /* 16.1 clamped */
	assert_int_equal(b.qs[3] & 15, 8);
	assert_int_equal(b.qs[4] & 15, 9);
	assert_int_equal(b.qs[5] & 15, 8);
	assert_int_equal(b.qs[6] & 15, 7);
	assert_int_equal(b.qs[7] & 15, 11);
	/* first extreme +8 wins over -8: d = -1, so +8 -> code 0 and -8 -> 16 -> clamped 15 */
	assert_true(quant_quantize_row(QTYPE_Q4_0, y, &b, 32));
	assert_int_equal(b.d, 0xBC00);
	assert_int_equal(b.qs[0] & 15, 0);
	assert_int_equal(b.qs[1] & 15, 15);
	assert_int_equal(b.qs[2] & 15, 7);     /* -1 + 8.5 */
	assert_int_equal(b.qs[3] & 15, 9);     /* 1.49 + 8.5 */
}

static void test_quantize_zero_block_gives_zero_scale(void **state)
{
	float x[32] = { 0 };
	struct block_q8_0 b8;
	struct block_q4_0 b4;
	float out[32];
	(void)state;

	assert_true(quant_quantize_row(QTYPE_Q8_0, x, &b8, 32));
	assert_int_equal(b8.d, 0);
	for (int j = 0; j < 32; j++)
		assert_int_equal(b8.qs[j], 0);
	assert_true(quant_quantize_row(QTYPE_Q4_0, x, &b4, 32));
	assert_int_equal(b4.d, 0x8000); /* ggml's d = max / -8 is -0.0 */
	for (int j = 0; j < 16; j++)
		assert_int_equal(b4.qs[j], 0x88);
	quant_dequant_row(QTYPE_Q4_0, &b4, out, 32);
	for (int j = 0; j < 32; j++)
		assert_true(out[j] == 0.0f);
}

static void test_quantize_rejects_other_types_and_ragged_rows(void **state)
{
	float x[64] = { 0 };
	uint8_t buf[512];
	(void)state;

	assert_false(quant_quantize_row(QTYPE_Q4_1, x, buf, 32));
	assert_false(quant_quantize_row(QTYPE_Q5_0, x, buf, 32));
	assert_false(quant_quantize_row(QTYPE_Q4_K, x, buf, 64));
	assert_false(quant_quantize_row(QTYPE_Q6_K, x, buf, 64));
	assert_false(quant_quantize_row(QTYPE_Q8_0, x, buf, 48));
	assert_false(quant_quantize_row(QTYPE_Q4_0, x, buf, 31));
}

static float scale_of(const uint8_t *block)
{
	qfp16 h;
	memcpy(&h, block, sizeof h);
	return quant_fp16_to_f32(h);
}

/* Random normal rows through each quantizer and back stay within the format's bound:
 * half a step for Q8_0, a whole step for Q4_0 (whose top code clamps), half an ulp for
 * F16/BF16. Some blocks are small enough for the fp16 scale to be subnormal. */
static void test_quantize_round_trips_within_format_error(void **state)
{
	enum { N = 4096 };
	float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
	uint8_t *buf = malloc(N * 4);
	uint64_t s = 42;
	(void)state;
	assert_non_null(x);
	assert_non_null(y);
	assert_non_null(buf);

	for (int i = 0; i < N; i++)
		x[i] = rng_normal(&s) * ((i / 32) % 7 == 3 ? 1e-3f : 1.0f);

	assert_true(quant_quantize_row(QTYPE_Q8_0, x, buf, N));
	quant_dequant_row(QTYPE_Q8_0, buf, y, N);
	for (int b = 0; b < N / 32; b++) {
		float amax = 0;
		for (int j = 0; j < 32; j++)
			amax = fmaxf(amax, fabsf(x[32 * b + j]));
		/* Codes are rounded against the exact scale, values rebuilt with its fp16
		 * rounding (coarser where subnormal): half a step plus 127 times that rounding. */
		const float d = amax / 127.0f, d16 = scale_of(buf + b * sizeof(struct block_q8_0));
		assert_true(fabsf(d16 - d) <= fmaxf(d * 0x1p-11f, 0x1p-25f));
		const float bound = d * 0.50001f + 127.0f * fabsf(d16 - d);
		for (int j = 0; j < 32; j++)
			assert_true(fabsf(y[32 * b + j] - x[32 * b + j]) <= bound);
	}

	assert_true(quant_quantize_row(QTYPE_Q4_0, x, buf, N));
	quant_dequant_row(QTYPE_Q4_0, buf, y, N);
	double err2 = 0, ref2 = 0;
	for (int b = 0; b < N / 32; b++) {
		float amax = 0;
		for (int j = 0; j < 32; j++)
			amax = fmaxf(amax, fabsf(x[32 * b + j]));
		const float d = amax / 8.0f, d16 = fabsf(scale_of(buf + b * sizeof(struct block_q4_0)));
		assert_true(fabsf(d16 - d) <= fmaxf(d * 0x1p-11f, 0x1p-25f));
		/* a whole step where the top code clamps */
		const float bound = d * 1.0001f + 8.0f * fabsf(d16 - d);
		for (int j = 0; j < 32; j++) {
			const float e = fabsf(y[32 * b + j] - x[32 * b + j]);
			assert_true(e <= bound);
			err2 += (double)e * e / ((double)amax * amax);
			ref2 += 1;
		}
	}
	/* Uniform rounding error of a step amax/8 has rms amax/8/sqrt(12) = 0.036 amax. */
	assert_true(sqrt(err2 / ref2) < 0.045);

	assert_true(quant_quantize_row(QTYPE_F16, x, buf, N));
	quant_dequant_row(QTYPE_F16, buf, y, N);
	for (int i = 0; i < N; i++)
		assert_true(fabsf(y[i] - x[i]) <= fmaxf(fabsf(x[i]) * 0x1p-11f, 0x1p-25f));
	assert_true(quant_quantize_row(QTYPE_BF16, x, buf, N));
	quant_dequant_row(QTYPE_BF16, buf, y, N);
	for (int i = 0; i < N; i++)
		assert_true(fabsf(y[i] - x[i]) <= fabsf(x[i]) * 0x1p-8f);
	assert_true(quant_quantize_row(QTYPE_F32, x, buf, N));
	assert_memory_equal(buf, x, N * sizeof *x);

	free(x);
	free(y);
	free(buf);
}

/* ---- llama.cpp's quantized fixtures against the F16 file made from the same F32 model */

static const char *shared_dir(void)
{
	const char *d = getenv("HEARTH_SHARED");
	if (!d || !*d)
		fail_msg("HEARTH_SHARED is not set: point it at the shared fixtures directory "
			 "(make check sets it)");
	return d;
}

static struct gguf_file *open_fixture(const char *name)
{
	char path[4096];
	struct hearth_error err = { 0 };
	struct gguf_file *f = NULL;

	snprintf(path, sizeof path, "%s/fixtures/%s", shared_dir(), name);
	if (gguf_open(&f, path, &err) != 0)
		fail_msg("gguf_open %s: %s", path, err.msg);
	return f;
}

static float *dequant_tensor(const struct gguf_tensor *t)
{
	const uint64_t rows = t->n_elems / t->ne[0];
	size_t row_bytes;
	float *out = malloc(t->n_elems * sizeof *out);

	assert_non_null(out);
	assert_true(qtype_row_bytes(t->type, t->ne[0], &row_bytes));
	assert_int_equal(row_bytes * rows, t->size);
	for (uint64_t r = 0; r < rows; r++)
		quant_dequant_row(t->type, (const uint8_t *)t->data + r * row_bytes,
				  out + r * t->ne[0], t->ne[0]);
	return out;
}

/* Largest tolerated rms error of a tensor relative to its own rms, per type: about 1.5x
 * the rms of uniform rounding over the format's step for Gaussian-like weights. */
static double rel_rms_bound(enum qtype type)
{
	switch (type) {
	case QTYPE_F16: return 0.0;
	case QTYPE_BF16: return 0.003;
	case QTYPE_Q8_0: return 0.012;
	case QTYPE_Q6_K: return 0.03;
	case QTYPE_Q5_0: case QTYPE_Q5_1: case QTYPE_Q5_K: return 0.06;
	default: return 0.12; /* 4-bit */
	}
}

struct fixture_case {
	const char *file;
	int n_types;
	enum qtype types[2]; /* the non-F32 types the file must contain */
};

static void check_fixture_against_f16(const struct fixture_case *fc, int *seen)
{
	struct gguf_file *q = open_fixture(fc->file);
	struct gguf_file *r = open_fixture("fx-quant-f16.gguf");
	int checked = 0;

	for (uint64_t i = 0; i < q->n_tensors; i++) {
		const struct gguf_tensor *t = &q->tensors[i];
		char name[256];

		if (t->type == QTYPE_F32)
			continue;
		snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
		const struct gguf_tensor *ref = gguf_tensor_find(r, name);
		assert_non_null(ref);
		assert_int_equal(ref->n_elems, t->n_elems);
		assert_int_equal(ref->ne[0], t->ne[0]);

		float *a = dequant_tensor(t), *b = dequant_tensor(ref);
		double err2 = 0, ref2 = 0;
		for (uint64_t k = 0; k < t->n_elems; k++) {
			const double e = (double)a[k] - b[k];
			err2 += e * e;
			ref2 += (double)b[k] * b[k];
		}
		const double rel = sqrt(err2 / ref2);
		if (!(rel <= rel_rms_bound(t->type)))
			fail_msg("%s %s (%s): rms error %.4f of rms, bound %.4f", fc->file, name,
				 qtype_name(t->type), rel, rel_rms_bound(t->type));
		/* the error must come from rounding, not from a misplaced block: it is small
		 * next to the values in every block of 32 */
		for (uint64_t k0 = 0; k0 < t->n_elems; k0 += 32) {
			float amax = 0, emax = 0;
			for (int j = 0; j < 32; j++) {
				amax = fmaxf(amax, fabsf(b[k0 + j]));
				emax = fmaxf(emax, fabsf(a[k0 + j] - b[k0 + j]));
			}
			if (emax > amax * 0.35f + 1e-6f)
				fail_msg("%s %s: block at %llu error %g of max %g", fc->file, name,
					 (unsigned long long)k0, (double)emax, (double)amax);
		}
		free(a);
		free(b);
		seen[t->type] = 1;
		checked++;
	}
	assert_int_equal(checked, 15);
	for (int k = 0; k < fc->n_types; k++)
		if (!seen[fc->types[k]])
			fail_msg("%s has no %s tensor", fc->file, qtype_name(fc->types[k]));
	gguf_close(q);
	gguf_close(r);
}

static void test_dequant_matches_llama_cpp_fixtures(void **state)
{
	static const struct fixture_case cases[] = {
		{ "fx-quant-bf16.gguf", 1, { QTYPE_BF16 } },
		{ "fx-quant-q8_0.gguf", 1, { QTYPE_Q8_0 } },
		{ "fx-quant-q4_0.gguf", 2, { QTYPE_Q4_0, QTYPE_Q6_K } },
		{ "fx-quant-q4_1.gguf", 2, { QTYPE_Q4_1, QTYPE_Q6_K } },
		{ "fx-quant-q5_0.gguf", 2, { QTYPE_Q5_0, QTYPE_Q6_K } },
		{ "fx-quant-q5_1.gguf", 2, { QTYPE_Q5_1, QTYPE_Q6_K } },
		{ "fx-quant-q4_k_m.gguf", 2, { QTYPE_Q4_K, QTYPE_Q6_K } },
		{ "fx-quant-q5_k_m.gguf", 2, { QTYPE_Q5_K, QTYPE_Q6_K } },
		{ "fx-quant-q6_k.gguf", 1, { QTYPE_Q6_K } },
	};
	int seen[64] = { 0 };
	(void)state;

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		check_fixture_against_f16(&cases[i], seen);
}

/* BF16 and F16 were both rounded from the same f32 weights, so rounding the F16 value to
 * bf16 must give the file's bf16 value, except where the F16 value sits exactly on a bf16
 * tie (the f32 value was on either side) or is subnormal (then F16 is the coarser). */
static void test_f16_and_bf16_fixtures_agree_after_rounding(void **state)
{
	struct gguf_file *h = open_fixture("fx-quant-f16.gguf");
	struct gguf_file *b = open_fixture("fx-quant-bf16.gguf");
	uint64_t total = 0, ties = 0;
	(void)state;

	for (uint64_t i = 0; i < h->n_tensors; i++) {
		const struct gguf_tensor *th = &h->tensors[i];
		char name[256];

		if (th->type != QTYPE_F16)
			continue;
		snprintf(name, sizeof name, "%.*s", (int)th->name.len, th->name.ptr);
		const struct gguf_tensor *tb = gguf_tensor_find(b, name);
		assert_non_null(tb);
		assert_int_equal(tb->type, QTYPE_BF16);
		assert_int_equal(tb->n_elems, th->n_elems);
		const uint8_t *ph = th->data, *pb = tb->data;
		for (uint64_t k = 0; k < th->n_elems; k++) {
			uint16_t vh, vb;
			memcpy(&vh, ph + 2 * k, 2);
			memcpy(&vb, pb + 2 * k, 2);
			const uint16_t again = quant_f32_to_bf16(quant_fp16_to_f32(vh));
			const bool subnormal = (vh & 0x7C00) == 0;
			const bool on_tie = (vh & 7) == 4; /* the 3 bits bf16 drops are exactly half */

			if (subnormal) {
				/* both are within half their own step of the f32 value */
				const float fb = quant_bf16_to_f32(vb), fh = quant_fp16_to_f32(vh);
				if (!(fabsf(fb - fh) <= 0x1p-25f + fabsf(fb) * 0x1p-8f))
					fail_msg("%s[%llu]: f16 0x%04x (%g) bf16 0x%04x (%g)", name, (unsigned long long)k, vh, (double)fh, vb, (double)fb);
			} else if (on_tie) {
				/* the f32 value was on one side or the other of the tie */
				assert_true(abs((int)again - (int)vb) <= 1);
				ties++;
			} else if (again != vb) {
				fail_msg("%s[%llu]: f16 0x%04x rounds to bf16 0x%04x, file has 0x%04x", name,
					 (unsigned long long)k, vh, again, vb);
			}
			total++;
		}
	}
	assert_true(total > 1000000);
	assert_true(ties * 6 < total); /* about 1 in 8 */
	gguf_close(h);
	gguf_close(b);
}

/* llama-quantize wrote Q8_0 and Q4_0 with quantize_row_q8_0_ref / q4_0_ref from the f32
 * weights; quantizing the F16 copy with ours must give the same bytes except where the
 * fp16 rounding of the input moved a value across a rounding boundary: then a scale moves
 * by one fp16 ulp, a code by one. */
static void check_requantize(const char *file, enum qtype type, double max_scale_diff,
			     double max_code_diff)
{
	struct gguf_file *q = open_fixture(file);
	struct gguf_file *r = open_fixture("fx-quant-f16.gguf");
	const size_t bb = qtype_block_bytes(type);
	uint64_t blocks = 0, scale_diff = 0, codes = 0, code_diff = 0;

	for (uint64_t i = 0; i < q->n_tensors; i++) {
		const struct gguf_tensor *t = &q->tensors[i];
		char name[256];

		if (t->type != type)
			continue;
		snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
		const struct gguf_tensor *ref = gguf_tensor_find(r, name);
		assert_non_null(ref);
		float *x = dequant_tensor(ref);
		uint8_t *mine = malloc(t->size);
		assert_non_null(mine);
		assert_true(quant_quantize_row(type, x, mine, t->n_elems));
		for (uint64_t k = 0; k < t->size / bb; k++) {
			const uint8_t *pa = mine + k * bb, *pb = (const uint8_t *)t->data + k * bb;
			if (memcmp(pa, pb, 2) != 0) {
				uint16_t ha, hb;
				memcpy(&ha, pa, 2);
				memcpy(&hb, pb, 2);
				/* Q4_0's scale carries the sign of the extreme element: when two
				 * elements of nearly equal magnitude trade places it flips sign and
				 * the codes mirror, so compare magnitudes and skip the codes. */
				if (type == QTYPE_Q4_0 && (ha ^ hb) == 0x8000) {
					scale_diff++;
					blocks++;
					continue;
				}
				if (abs((int)(ha & 0x7FFF) - (int)(hb & 0x7FFF)) > 1 || ((ha ^ hb) & 0x8000))
					fail_msg("%s %s block %llu: scale 0x%04x vs 0x%04x", file, name,
						 (unsigned long long)k, ha, hb);
				scale_diff++;
			}
			for (size_t j = 0; j < 32; j++) {
				int ca, cb;
				if (type == QTYPE_Q8_0) {
					ca = (int8_t)pa[2 + j];
					cb = (int8_t)pb[2 + j];
				} else {
					ca = (pa[2 + j % 16] >> (j < 16 ? 0 : 4)) & 15;
					cb = (pb[2 + j % 16] >> (j < 16 ? 0 : 4)) & 15;
				}
				if (ca != cb) {
					if (abs(ca - cb) > 1)
						fail_msg("%s %s block %llu element %zu: %d vs %d", file,
							 name, (unsigned long long)k, j, ca, cb);
					code_diff++;
				}
				codes++;
			}
			blocks++;
		}
		free(mine);
		free(x);
	}
	assert_true(blocks > 10000);
	if ((double)scale_diff > (double)blocks * max_scale_diff ||
	    (double)code_diff > (double)codes * max_code_diff)
		fail_msg("%s: scales differ in %llu of %llu blocks, codes in %llu of %llu", file,
			 (unsigned long long)scale_diff, (unsigned long long)blocks,
			 (unsigned long long)code_diff, (unsigned long long)codes);
	gguf_close(q);
	gguf_close(r);
}

static void test_quantize_q8_0_reproduces_llama_quantize(void **state)
{
	(void)state;
	/* amax/127 is re-rounded to 11 bits from an input already rounded to 11 bits, so a
	 * quarter of the scales land one ulp away (measured 25.2%); codes: 0.96%. */
	check_requantize("fx-quant-q8_0.gguf", QTYPE_Q8_0, 0.30, 0.015);
}

static void test_quantize_q4_0_reproduces_llama_quantize(void **state)
{
	(void)state;
	/* max/-8 is exact, so the scale only moves when another element becomes the max
	 * (measured 0.03% of blocks); codes: 0.09%. */
	check_requantize("fx-quant-q4_0.gguf", QTYPE_Q4_0, 0.002, 0.003);
}

/* ---- bit for bit against llama.cpp's own ggml-base: the prebuilt library that the npm
 * package node-llama-cpp ships (installed in bench/ for the llama.cpp load checks). When it
 * is not installed these two tests are left out of the run (cmocka 1.1.5 reports skip() as
 * "not ok # SKIP", which automake's TAP driver counts as a failure); HEARTH_GGML_BASE may
 * name another libggml-base.so. */

typedef void (*ggml_dequant_fn)(const void *x, float *y, int64_t k);
typedef void (*ggml_quant_fn)(const float *x, void *y, int64_t k);
typedef void (*ggml_f32_to_16_fn)(const float *x, uint16_t *y, int64_t n);

static void *ggml_base_open(void)
{
	const char *env = getenv("HEARTH_GGML_BASE");
	const char *src = getenv("HEARTH_SRCDIR");
	char path[4096];
	void *h;

	if (env && *env)
		snprintf(path, sizeof path, "%s", env);
	else if (src && *src)
		snprintf(path, sizeof path, "%s/bench/node_modules/@node-llama-cpp/linux-x64/bins/"
			 "linux-x64/libggml-base.so", src);
	else
		return NULL;
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h && env && *env)
		fail_msg("HEARTH_GGML_BASE=%s: %s", env, dlerror());
	return h;
}

static void *ggml_sym(void *h, const char *name)
{
	void *f = dlsym(h, name);
	if (!f)
		fail_msg("libggml-base.so has no %s", name);
	return f;
}

static const char *ggml_dequant_name(enum qtype t)
{
	switch (t) {
	case QTYPE_Q4_0: return "dequantize_row_q4_0";
	case QTYPE_Q4_1: return "dequantize_row_q4_1";
	case QTYPE_Q5_0: return "dequantize_row_q5_0";
	case QTYPE_Q5_1: return "dequantize_row_q5_1";
	case QTYPE_Q8_0: return "dequantize_row_q8_0";
	case QTYPE_Q4_K: return "dequantize_row_q4_K";
	case QTYPE_Q5_K: return "dequantize_row_q5_K";
	case QTYPE_Q6_K: return "dequantize_row_q6_K";
	case QTYPE_F16: return "ggml_fp16_to_fp32_row";
	case QTYPE_BF16: return "ggml_bf16_to_fp32_row";
	default: return NULL;
	}
}

static void assert_same_floats(const float *a, const float *b, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++)
		if (fbits(a[i]) != fbits(b[i]) && !(isnan(a[i]) && isnan(b[i])))
			fail_msg("%s[%zu]: ours %a (0x%08x), ggml %a (0x%08x)", what, i, (double)a[i],
				 fbits(a[i]), (double)b[i], fbits(b[i]));
}

/* Every quantized tensor of every fixture, and random blocks of every type (scales kept
 * finite), dequantized by both. */
static void test_dequant_is_bit_exact_with_ggml(void **state)
{
	static const char *const files[] = {
		"fx-quant-f16.gguf", "fx-quant-bf16.gguf", "fx-quant-q8_0.gguf", "fx-quant-q4_0.gguf",
		"fx-quant-q4_1.gguf", "fx-quant-q5_0.gguf", "fx-quant-q5_1.gguf",
		"fx-quant-q4_k_m.gguf", "fx-quant-q5_k_m.gguf", "fx-quant-q6_k.gguf",
	};
	static const enum qtype types[] = {
		QTYPE_F16, QTYPE_BF16, QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q5_0, QTYPE_Q5_1, QTYPE_Q8_0,
		QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K,
	};
	void *h = ggml_base_open();
	uint64_t checked = 0;
	(void)state;
	assert_non_null(h);

	for (size_t fi = 0; fi < sizeof files / sizeof files[0]; fi++) {
		struct gguf_file *f = open_fixture(files[fi]);
		for (uint64_t i = 0; i < f->n_tensors; i++) {
			const struct gguf_tensor *t = &f->tensors[i];
			const char *fn = ggml_dequant_name(t->type);
			if (!fn)
				continue;
			ggml_dequant_fn theirs = (ggml_dequant_fn)ggml_sym(h, fn);
			float *a = dequant_tensor(t);
			float *b = malloc(t->n_elems * sizeof *b);
			assert_non_null(b);
			theirs(t->data, b, (int64_t)t->n_elems);
			assert_same_floats(a, b, t->n_elems, files[fi]);
			checked += t->n_elems;
			free(a);
			free(b);
		}
		gguf_close(f);
	}
	assert_true(checked > 10000000);

	uint64_t s = 7;
	for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
		enum { N = 256 * 64 };
		const enum qtype t = types[ti];
		size_t bytes;
		assert_true(qtype_row_bytes(t, N, &bytes));
		uint8_t *raw = malloc(bytes);
		float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
		assert_non_null(raw);
		assert_non_null(a);
		assert_non_null(b);
		for (size_t k = 0; k < bytes; k++)
			raw[k] = (uint8_t)rng_next(&s);
		/* keep every fp16 scale finite and moderate: exponent field 1..29 */
		const size_t bb = qtype_block_bytes(t);
		size_t scale_at[2] = { 0, 2 };
		int n_scales = (t == QTYPE_Q4_1 || t == QTYPE_Q5_1 || t == QTYPE_Q4_K || t == QTYPE_Q5_K) ? 2 : 1;
		if (t == QTYPE_Q6_K)
			scale_at[0] = 208;
		if (t != QTYPE_F16 && t != QTYPE_BF16) {
			for (size_t blk = 0; blk < bytes / bb; blk++)
				for (int k = 0; k < n_scales; k++) {
					uint8_t *hi = raw + blk * bb + scale_at[k] + 1;
					*hi = (uint8_t)((*hi & 0x83) | ((1 + *hi % 29) << 2));
				}
		}
		quant_dequant_row(t, raw, a, N);
		((ggml_dequant_fn)ggml_sym(h, ggml_dequant_name(t)))(raw, b, N);
		assert_same_floats(a, b, N, qtype_name(t));
		free(raw);
		free(a);
		free(b);
	}
	dlclose(h);
}

/* The reference quantizers and the fp16/bf16 rows on random data (scaled over a wide range
 * of magnitudes, with exact ties and zero blocks mixed in) give identical bytes. */
static void test_quantize_is_bit_exact_with_ggml(void **state)
{
	enum { N = 32 * 4096 };
	void *h = ggml_base_open();
	uint64_t s = 99;
	(void)state;
	assert_non_null(h);
	float *x = malloc(N * sizeof *x);
	uint8_t *a = malloc(N * 4), *b = malloc(N * 4);
	assert_non_null(x);
	assert_non_null(a);
	assert_non_null(b);
	for (int i = 0; i < N; i++) {
		const int blk = i / 32;
		const float scale = ldexpf(1.0f, blk % 60 - 40);
		switch (blk % 5) {
		case 0: x[i] = rng_normal(&s) * scale; break;
		case 1: x[i] = (float)((int)(rng_next(&s) % 33) - 16) * 0.5f * scale; break; /* ties */
		case 2: x[i] = blk % 10 == 2 ? 0.0f : rng_normal(&s); break;
		case 3: x[i] = bitsf((uint32_t)rng_next(&s) & 0x807FFFFFu); break; /* f32 subnormals */
		default: x[i] = rng_normal(&s) * 1e4f; break;
		}
	}

	static const struct { enum qtype type; const char *fn; size_t out; } q[] = {
		{ QTYPE_Q8_0, "quantize_row_q8_0_ref", N / 32 * 34 },
		{ QTYPE_Q4_0, "quantize_row_q4_0_ref", N / 32 * 18 },
	};
	for (size_t k = 0; k < 2; k++) {
		assert_true(quant_quantize_row(q[k].type, x, a, N));
		((ggml_quant_fn)ggml_sym(h, q[k].fn))(x, b, N);
		for (size_t j = 0; j < q[k].out; j++)
			if (a[j] != b[j])
				fail_msg("%s: byte %zu differs (0x%02x vs 0x%02x)", q[k].fn, j, a[j], b[j]);
	}
	assert_true(quant_quantize_row(QTYPE_F16, x, a, N));
	((ggml_f32_to_16_fn)ggml_sym(h, "ggml_fp32_to_fp16_row"))(x, (uint16_t *)b, N);
	assert_memory_equal(a, b, N * 2);
	assert_true(quant_quantize_row(QTYPE_BF16, x, a, N));
	((ggml_f32_to_16_fn)ggml_sym(h, "ggml_fp32_to_bf16_row_ref"))(x, (uint16_t *)b, N);
	assert_memory_equal(a, b, N * 2);
	free(x);
	free(a);
	free(b);
	dlclose(h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_qtype_sizes_match_ggml),
		cmocka_unit_test(test_qtype_rejects_unknown_ids),
		cmocka_unit_test(test_qtype_row_bytes_checks_blocks_and_overflow),
		cmocka_unit_test(test_fp16_to_f32_matches_ieee_for_every_half),
		cmocka_unit_test(test_f32_to_fp16_round_trips_every_half),
		cmocka_unit_test(test_f32_to_fp16_rounds_to_nearest_even),
		cmocka_unit_test(test_f32_to_fp16_handles_overflow_underflow_inf_nan),
		cmocka_unit_test(test_bf16_to_f32_is_the_top_half),
		cmocka_unit_test(test_f32_to_bf16_rounds_to_nearest_even),
		cmocka_unit_test(test_f32_to_bf16_keeps_nan_a_quiet_nan),
		cmocka_unit_test(test_f32_to_bf16_matches_nearest_on_random_floats),
		cmocka_unit_test(test_dequant_f32_f16_bf16_rows),
		cmocka_unit_test(test_dequant_q4_0_centres_nibbles_on_8),
		cmocka_unit_test(test_dequant_q4_1_adds_the_minimum),
		cmocka_unit_test(test_dequant_q5_0_uses_the_fifth_bit),
		cmocka_unit_test(test_dequant_q5_1_uses_the_fifth_bit_and_minimum),
		cmocka_unit_test(test_dequant_q8_0_scales_signed_bytes),
		cmocka_unit_test(test_dequant_q4_k_applies_sub_block_scales_and_mins),
		cmocka_unit_test(test_dequant_q4_k_literal_high_scale_bits),
		cmocka_unit_test(test_dequant_q5_k_applies_high_bits),
		cmocka_unit_test(test_dequant_q6_k_unpacks_six_bit_codes),
		cmocka_unit_test(test_dequant_q6_k_literal_bytes),
		cmocka_unit_test(test_quantize_q8_0_rounds_half_away_from_zero),
		cmocka_unit_test(test_quantize_q4_0_maps_the_extreme_to_minus_8),
		cmocka_unit_test(test_quantize_zero_block_gives_zero_scale),
		cmocka_unit_test(test_quantize_rejects_other_types_and_ragged_rows),
		cmocka_unit_test(test_quantize_round_trips_within_format_error),
		cmocka_unit_test(test_dequant_matches_llama_cpp_fixtures),
		cmocka_unit_test(test_f16_and_bf16_fixtures_agree_after_rounding),
		cmocka_unit_test(test_quantize_q8_0_reproduces_llama_quantize),
		cmocka_unit_test(test_quantize_q4_0_reproduces_llama_quantize),
		/* these two last: left out when libggml-base.so is not there */
		cmocka_unit_test(test_dequant_is_bit_exact_with_ggml),
		cmocka_unit_test(test_quantize_is_bit_exact_with_ggml),
	};
	size_t n = sizeof tests / sizeof tests[0];
	void *h = ggml_base_open();

	if (h) {
		dlclose(h);
	} else {
		n -= 2;
		fprintf(stderr, "# libggml-base.so of node-llama-cpp not found under "
			"$HEARTH_SRCDIR/bench: the bit-exact comparisons with ggml are not run\n");
	}
	return _cmocka_run_group_tests("test_quant", tests, n, NULL, NULL);
}
