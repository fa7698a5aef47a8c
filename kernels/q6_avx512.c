/* AVX-512 int6-weight matmul. Each 4-column slice of a row block is rebuilt as 16 rows x
 * 4 bytes of u = q + 32 (0..63) from the two planes (mask, shift, vpternlogd). W6A8 feeds
 * vpdpbusd with u as the unsigned side and the int8 activations as the signed side, so no
 * flip is needed, and takes 32 * sum(x) back out per (token, group): an exact integer dot.
 * W6A16 turns each plane's pairs into exact bf16 for vdpbf16ps as q4_avx512.c does. */
#include "kernels/q6.h"
#include "kernels/dot_avx512.h"

#include <immintrin.h>
#include <string.h>

#define Q6_NT 8
#define GEMV_PREFETCH 4096

static inline void store_rows(float *y, __m512 v, unsigned valid)
{
	if (valid == Q4_ROWS)
		_mm512_storeu_ps(y, v);
	else
		_mm512_mask_storeu_ps(y, (__mmask16)((1u << valid) - 1), v);
}

/* u of columns 4b..4b+3 of the group whose codes start at gp (b a constant once unrolled). */
static inline __attribute__((always_inline)) __m512i slice_u(const uint8_t *gp, const int b)
{
	const __m512i m0f = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
	__m512i l = _mm512_load_si512(gp + (b >> 1) * Q4_CHUNK_BYTES);
	__m512i h = _mm512_load_si512(gp + 4 * Q4_CHUNK_BYTES + (b >> 2) * Q4_CHUNK_BYTES);
	const int s = b & 3;

	l = (b & 1) ? _mm512_and_si512(_mm512_srli_epi32(l, 4), m0f) : _mm512_and_si512(l, m0f);
	if (s == 0)
		h = _mm512_slli_epi32(h, 4);
	else if (s == 1)
		h = _mm512_slli_epi32(h, 2);
	else if (s == 3)
		h = _mm512_srli_epi32(h, 2);
	return _mm512_ternarylogic_epi32(h, l, m30, 0xEC); /* (h & 0x30) | l */
}

static inline __attribute__((always_inline)) void
tile_a8(const struct q6_matrix *w, const struct q4_acts *a, const int32_t *isum, const uint8_t *blk,
	size_t t0, const int NT, float *y, size_t ldy, unsigned valid)
{
	const uint8_t *codes = blk + w->scale_bytes;
	const int8_t *act[Q6_NT];
	__m512 f[Q6_NT];

#pragma GCC unroll 8
	for (int t = 0; t < NT; t++) {
		act[t] = (const int8_t *)a->codes + (t0 + t) * a->cols;
		f[t] = _mm512_setzero_ps();
	}
	for (size_t g = 0; g < w->n_groups; g++, codes += Q6_GROUP_BYTES) {
		__m512i acc[Q6_NT];

		if (NT == 1)
			_mm_prefetch((const char *)codes + GEMV_PREFETCH, _MM_HINT_T0);
#pragma GCC unroll 8
		for (int t = 0; t < NT; t++)
			acc[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
		for (int b = 0; b < 8; b++) {
			__m512i u = slice_u(codes, b);

#pragma GCC unroll 8
			for (int t = 0; t < NT; t++)
				acc[t] = dot_dpbusd_bcast(acc[t], u, act[t] + g * Q6_GROUP + 4 * b);
		}
		__m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + g * 32)));

#pragma GCC unroll 8
		for (int t = 0; t < NT; t++) {
			__m512i bias = _mm512_set1_epi32(32 * isum[t * w->n_groups + g]);
			__m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[t], bias));
			__m512 ds = _mm512_mul_ps(d, _mm512_set1_ps(a->scale[(t0 + t) * a->n_groups + g]));

			f[t] = _mm512_fmadd_ps(dot, ds, f[t]);
		}
	}
#pragma GCC unroll 8
	for (int t = 0; t < NT; t++)
		store_rows(y + (t0 + t) * ldy, f[t], valid);
}

/* Decode (one token, W6A8) over two adjacent row blocks side by side, each with two
 * accumulators (even and odd slices): one chain of eight vpdpbusd per group would wait on
 * their latency, and two load streams keep more lines in flight (as q8's GEMV). The sums
 * are exact integers, so splitting them changes no bit. valid is the last block's rows. */
static void gemv_a8_pair(const struct q6_matrix *w, const struct q4_acts *a, const int32_t *isum,
			 const uint8_t *blk, float *y, unsigned valid)
{
	const int8_t *act = (const int8_t *)a->codes;
	const uint8_t *blk2 = blk + w->block_bytes;
	const uint8_t *c0 = blk + w->scale_bytes, *c1 = blk2 + w->scale_bytes;
	__m512 f0 = _mm512_setzero_ps(), f1 = f0;

	for (size_t g = 0; g < w->n_groups; g++, c0 += Q6_GROUP_BYTES, c1 += Q6_GROUP_BYTES) {
		__m512i a0 = _mm512_setzero_si512(), b0 = a0, a1 = a0, b1 = a0;
		const int8_t *x = act + g * Q6_GROUP;

#pragma GCC unroll 8
		for (int b = 0; b < 8; b += 2) {
			a0 = dot_dpbusd_bcast(a0, slice_u(c0, b), x + 4 * b);
			a1 = dot_dpbusd_bcast(a1, slice_u(c1, b), x + 4 * b);
			b0 = dot_dpbusd_bcast(b0, slice_u(c0, b + 1), x + 4 * b + 4);
			b1 = dot_dpbusd_bcast(b1, slice_u(c1, b + 1), x + 4 * b + 4);
		}
		__m512i bias = _mm512_set1_epi32(32 * isum[g]);
		__m512 vs = _mm512_set1_ps(a->scale[g]);
		__m512 d0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + g * 32)));
		__m512 d1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk2 + g * 32)));
		__m512i s0 = _mm512_sub_epi32(_mm512_add_epi32(a0, b0), bias);
		__m512i s1 = _mm512_sub_epi32(_mm512_add_epi32(a1, b1), bias);

		f0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(d0, vs), f0);
		f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(d1, vs), f1);
	}
	store_rows(y, f0, Q4_ROWS);
	store_rows(y + Q4_ROWS, f1, valid);
}

/* W6A16: u = 16h + l, and each pair of l (or h) becomes two exact bf16 128+n with one
 * vpternlogd, as in q4_avx512.c, read straight from the planes.
 * Per group: sum(q*x) = 16*accH + accL - (16*128 + 128 + 32)*sum(x). */
static inline __attribute__((always_inline)) void
tile_a16(const struct q6_matrix *w, const struct q4_acts *a, const uint8_t *blk, size_t t0, const int NT,
	 float *y, size_t ldy, unsigned valid)
{
	const __m512i mask = _mm512_set1_epi32(0x000F000F), bias = _mm512_set1_epi32(0x43004300);
	const __m512i mask2 = _mm512_set1_epi32(0x00030003);
	const uint8_t *codes = blk + w->scale_bytes;
	const uint16_t *x[Q6_NT];
	__m512 f[Q6_NT];

#pragma GCC unroll 8
	for (int t = 0; t < NT; t++) {
		x[t] = (const uint16_t *)a->codes + (t0 + t) * a->cols;
		f[t] = _mm512_setzero_ps();
	}
	for (size_t g = 0; g < w->n_groups; g++, codes += Q6_GROUP_BYTES) {
		__m512 accl[Q6_NT], acch[Q6_NT], accl2 = _mm512_setzero_ps(), acch2 = accl2;

		if (NT == 1)
			_mm_prefetch((const char *)codes + GEMV_PREFETCH, _MM_HINT_T0);
#pragma GCC unroll 8
		for (int t = 0; t < NT; t++)
			accl[t] = acch[t] = _mm512_setzero_ps();
#pragma GCC unroll 8
		for (int b = 0; b < 8; b++) {
			/* Straight from the planes: l's nibble pairs as in q4, h's 2-bit pairs
			 * the same way with a 2-bit mask. */
			__m512i l = _mm512_load_si512(codes + (b >> 1) * Q4_CHUNK_BYTES);
			__m512i h = _mm512_load_si512(codes + 4 * Q4_CHUNK_BYTES + (b >> 2) * Q4_CHUNK_BYTES);
			const int ls = (b & 1) * 4, hs = (b & 3) * 2;
			__m512i l02 = _mm512_ternarylogic_epi32(ls ? _mm512_srli_epi32(l, ls) : l, mask, bias, 0xEA);
			__m512i l13 = _mm512_ternarylogic_epi32(_mm512_srli_epi32(l, ls + 8), mask, bias, 0xEA);
			__m512i h02 = _mm512_ternarylogic_epi32(hs ? _mm512_srli_epi32(h, hs) : h, mask2, bias, 0xEA);
			__m512i h13 = _mm512_ternarylogic_epi32(_mm512_srli_epi32(h, hs + 8), mask2, bias, 0xEA);
			size_t k = g * Q6_GROUP + 4 * (size_t)b;
			size_t p = (k & ~(size_t)7) + ((k & 4) ? 2 : 0);

#pragma GCC unroll 8
			for (int t = 0; t < NT; t++) {
				__m512 x02 = dot_bcast_pair(x[t] + p), x13 = dot_bcast_pair(x[t] + p + 4);

				accl[t] = dot_dpbf16(accl[t], l02, x02);
				acch[t] = dot_dpbf16(acch[t], h02, x02);
				if (NT == 1) {
					accl2 = dot_dpbf16(accl2, l13, x13);
					acch2 = dot_dpbf16(acch2, h13, x13);
				} else {
					accl[t] = dot_dpbf16(accl[t], l13, x13);
					acch[t] = dot_dpbf16(acch[t], h13, x13);
				}
			}
		}
		if (NT == 1) {
			accl[0] = _mm512_add_ps(accl[0], accl2);
			acch[0] = _mm512_add_ps(acch[0], acch2);
		}
		__m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + g * 32)));

#pragma GCC unroll 8
		for (int t = 0; t < NT; t++) {
			float sx = a->sum[(t0 + t) * a->n_groups + g];
			__m512 dot = _mm512_fmadd_ps(acch[t], _mm512_set1_ps(16.0f), accl[t]);

			dot = _mm512_sub_ps(dot, _mm512_set1_ps(2208.0f * sx));
			f[t] = _mm512_fmadd_ps(d, dot, f[t]);
		}
	}
#pragma GCC unroll 8
	for (int t = 0; t < NT; t++)
		store_rows(y + (t0 + t) * ldy, f[t], valid);
}

#define TILE_CASES(fn, ...)                      \
	switch (nt) {                            \
	case 8: fn(__VA_ARGS__, 8, y, ldy, valid); break; \
	case 7: fn(__VA_ARGS__, 7, y, ldy, valid); break; \
	case 6: fn(__VA_ARGS__, 6, y, ldy, valid); break; \
	case 5: fn(__VA_ARGS__, 5, y, ldy, valid); break; \
	case 4: fn(__VA_ARGS__, 4, y, ldy, valid); break; \
	case 3: fn(__VA_ARGS__, 3, y, ldy, valid); break; \
	case 2: fn(__VA_ARGS__, 2, y, ldy, valid); break; \
	default: fn(__VA_ARGS__, 1, y, ldy, valid); break; \
	}

static void tile_any(const struct q6_matrix *w, const struct q4_acts *a, const int32_t *isum,
		     const uint8_t *blk, size_t t0, size_t nt, float *y, size_t ldy, unsigned valid)
{
	if (a->kind == Q4_ACT_A8) {
		TILE_CASES(tile_a8, w, a, isum, blk, t0)
	} else {
		TILE_CASES(tile_a16, w, a, blk, t0)
	}
}

/* isum[(t - t_begin) * n_groups + g] = the sum of token t's int8 codes in group g. */
static void act_sums(const struct q6_matrix *w, const struct q4_acts *a, size_t t_begin, size_t t_end,
		     int32_t *isum)
{
	const __m256i flip = _mm256_set1_epi8((char)0x80);

	for (size_t t = t_begin; t < t_end; t++) {
		const int8_t *x = (const int8_t *)a->codes + t * a->cols;

		for (size_t g = 0; g < w->n_groups; g++) {
			__m256i v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(x + g * Q6_GROUP)), flip);
			__m256i s = _mm256_sad_epu8(v, _mm256_setzero_si256());
			__m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));

			h = _mm_add_epi64(h, _mm_unpackhi_epi64(h, h));
			isum[(t - t_begin) * w->n_groups + g] = (int32_t)_mm_cvtsi128_si64(h) - 128 * Q6_GROUP;
		}
	}
}

void q6_matmul_avx512(const struct q6_matrix *w, const struct q4_acts *a, float *y, size_t ldy,
		      size_t row_begin, size_t row_end)
{
	int32_t isum_buf[Q6_MAX_GROUPS];
	size_t rb0 = row_begin / Q4_ROWS, rb1 = (row_end + Q4_ROWS - 1) / Q4_ROWS;
	size_t elem = a->kind == Q4_ACT_A8 ? 1 : 2;
	size_t chunk = (256u << 10) / (a->cols * elem);

	chunk = chunk < Q6_NT ? Q6_NT : chunk / Q6_NT * Q6_NT;
	if (a->kind == Q4_ACT_A8 && chunk * w->n_groups > Q6_MAX_GROUPS)
		chunk = Q6_MAX_GROUPS / w->n_groups; /* >= 1: q6_matrix_plan bounds n_groups */
	if (a->n_tok == 1 && a->kind == Q4_ACT_A8) {
		act_sums(w, a, 0, 1, isum_buf);
		for (size_t rb = rb0; rb < rb1; rb += 2) {
			const uint8_t *blk = w->data + rb * w->block_bytes;
			size_t r0 = rb * Q4_ROWS, last = rb + 1 < rb1 ? r0 + Q4_ROWS : r0;
			unsigned valid = (unsigned)(row_end - last < Q4_ROWS ? row_end - last : Q4_ROWS);

			if (rb + 1 < rb1)
				gemv_a8_pair(w, a, isum_buf, blk, y + r0, valid);
			else
				tile_a8(w, a, isum_buf, blk, 0, 1, y + r0, ldy, valid);
		}
		return;
	}
	for (size_t tc = 0; tc < a->n_tok; tc += chunk) {
		size_t tc_end = tc + chunk < a->n_tok ? tc + chunk : a->n_tok;

		if (a->kind == Q4_ACT_A8)
			act_sums(w, a, tc, tc_end, isum_buf);
		for (size_t rb = rb0; rb < rb1; rb++) {
			const uint8_t *blk = w->data + rb * w->block_bytes;
			size_t r0 = rb * Q4_ROWS;
			unsigned valid = (unsigned)(row_end - r0 < Q4_ROWS ? row_end - r0 : Q4_ROWS);

			for (size_t t0 = tc; t0 < tc_end; t0 += Q6_NT)
				tile_any(w, a, isum_buf + (t0 - tc) * w->n_groups, blk, t0,
					 tc_end - t0 < Q6_NT ? tc_end - t0 : Q6_NT, y + r0, ldy, valid);
		}
	}
}
