/* AVX-512 int8-weight matmul: a 64-byte chunk is 16 rows x 4 int8. W8A8 feeds vpdpbusd
 * with x+128 (u8) against the signed codes and takes 128*sum(codes), stored per
 * (row, group), back out, so the integer dot is exact. W8A16 splits codes into nibbles
 * and uses vdpbf16ps like the q4 kernels. */
#include "kernels/q8.h"
#include "kernels/dot_avx512.h"

#include <immintrin.h>
#include <string.h>

#define Q8_NT 8
#define GEMV_PREFETCH 4096 /* W8A16 decode reads ahead, as q4_avx512.c's W4A16 GEMV */

static inline uint32_t load_u32(const void *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return v;
}

static inline void store_rows(float *y, __m512 v, unsigned valid)
{
	if (valid == Q4_ROWS)
		_mm512_storeu_ps(y, v);
	else
		_mm512_mask_storeu_ps(y, (__mmask16)((1u << valid) - 1), v);
}

static inline __attribute__((always_inline)) void
tile_a8(const struct q8_matrix *w, const struct q4_acts *a, const uint8_t *blk, size_t t0, const int NT,
	float *y, size_t ldy, unsigned valid)
{
	const __m512i flip = _mm512_set1_epi8((char)0x80);
	const uint8_t *codes = blk + w->scale_bytes;
	const size_t chunks = w->group / Q8_CHUNK_COLS;
	const int8_t *act[Q8_NT];
	__m512 f[Q8_NT];

#pragma GCC unroll 8
	for (int t = 0; t < NT; t++) {
		act[t] = (const int8_t *)a->codes + (t0 + t) * a->cols;
		f[t] = _mm512_setzero_ps();
	}
	for (size_t g = 0; g < w->n_groups; g++) {
		__m512i acc[Q8_NT];

#pragma GCC unroll 8
		for (int t = 0; t < NT; t++)
			acc[t] = _mm512_setzero_si512();
		for (size_t c = 0; c < chunks; c++) {
			__m512i v = _mm512_load_si512(codes + c * Q4_CHUNK_BYTES);
			size_t k = g * w->group + 4 * c;

#pragma GCC unroll 8
			for (int t = 0; t < NT; t++) {
				__m512i x = _mm512_xor_si512(_mm512_set1_epi32((int)load_u32(act[t] + k)), flip);

				acc[t] = dot_dpbusd(acc[t], x, v);
			}
		}
		codes += chunks * Q4_CHUNK_BYTES;
		__m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + g * 32)));
		__m512i wsum = _mm512_cvtepi16_epi32(
			_mm256_loadu_si256((const __m256i *)(blk + (w->n_groups + g) * 32)));
		__m512i bias = _mm512_slli_epi32(wsum, 7);

#pragma GCC unroll 8
		for (int t = 0; t < NT; t++) {
			__m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[t], bias));
			__m512 ds = _mm512_mul_ps(d, _mm512_set1_ps(a->scale[(t0 + t) * a->n_groups + g]));

			f[t] = _mm512_fmadd_ps(dot, ds, f[t]);
		}
	}
#pragma GCC unroll 8
	for (int t = 0; t < NT; t++)
		store_rows(y + (t0 + t) * ldy, f[t], valid);
}

/* W8A16 on vdpbf16ps: u = q + 128 (q ^ 0x80) splits into nibbles u = 16h + l, and each
 * nibble pair becomes two exact bf16 128+n with one vpternlogd, as in q4_avx512.c. Lane r
 * holds columns k..k+3: (l0,l2), (l1,l3), (h0,h2), (h1,h3) pair with the A16 x pairs
 * (x0,x2) and (x1,x3). Per group: sum(q*x) = 16*accH + accL - (16*128 + 128 + 128)*sum(x). */
static inline __attribute__((always_inline)) void
tile_a16(const struct q8_matrix *w, const struct q4_acts *a, const uint8_t *blk, size_t t0, const int NT,
	 float *y, size_t ldy, unsigned valid)
{
	const __m512i mask = _mm512_set1_epi32(0x000F000F), bias = _mm512_set1_epi32(0x43004300);
	const __m512i flip = _mm512_set1_epi8((char)0x80);
	const uint8_t *codes = blk + w->scale_bytes;
	const size_t chunks = w->group / Q8_CHUNK_COLS;
	const uint16_t *x[Q8_NT];
	__m512 f[Q8_NT];

#pragma GCC unroll 8
	for (int t = 0; t < NT; t++) {
		x[t] = (const uint16_t *)a->codes + (t0 + t) * a->cols;
		f[t] = _mm512_setzero_ps();
	}
	for (size_t g = 0; g < w->n_groups; g++) {
		/* accl2/acch2 give a single token (decode) four independent chains: one chain
		 * would wait on vdpbf16ps latency, not throughput. */
		__m512 accl[Q8_NT], acch[Q8_NT], accl2 = _mm512_setzero_ps(), acch2 = accl2;

#pragma GCC unroll 8
		for (int t = 0; t < NT; t++)
			accl[t] = acch[t] = _mm512_setzero_ps();
		for (size_t c = 0; c < chunks; c++) {
			__m512i u = _mm512_xor_si512(_mm512_load_si512(codes + c * Q4_CHUNK_BYTES), flip);

			if (NT == 1)
				_mm_prefetch((const char *)codes + c * Q4_CHUNK_BYTES + GEMV_PREFETCH, _MM_HINT_T0);
			__m512i l02 = _mm512_ternarylogic_epi32(u, mask, bias, 0xEA);
			__m512i l13 = _mm512_ternarylogic_epi32(_mm512_srli_epi32(u, 8), mask, bias, 0xEA);
			__m512i h02 = _mm512_ternarylogic_epi32(_mm512_srli_epi32(u, 4), mask, bias, 0xEA);
			__m512i h13 = _mm512_ternarylogic_epi32(_mm512_srli_epi32(u, 12), mask, bias, 0xEA);
			/* Columns 4c..4c+3: pairs at A16 offsets (0, 4) or (2, 6) of their 8-block. */
			size_t k = g * w->group + 4 * c;
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
		codes += chunks * Q4_CHUNK_BYTES;
		__m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + g * 32)));

#pragma GCC unroll 8
		for (int t = 0; t < NT; t++) {
			float sx = a->sum[(t0 + t) * a->n_groups + g];
			__m512 dot = _mm512_fmadd_ps(acch[t], _mm512_set1_ps(16.0f), accl[t]);

			dot = _mm512_sub_ps(dot, _mm512_set1_ps(2304.0f * sx));
			f[t] = _mm512_fmadd_ps(d, dot, f[t]);
		}
	}
#pragma GCC unroll 8
	for (int t = 0; t < NT; t++)
		store_rows(y + (t0 + t) * ldy, f[t], valid);
}

/* Decode (one token, W8A8) over two adjacent row blocks side by side: two load streams
 * keep more cache lines in flight than one, as the q4 W4A8 GEMV does. valid is the last
 * block's row count. */
static void gemv_a8_pair(const struct q8_matrix *w, const struct q4_acts *a, const uint8_t *blk, float *y,
			 unsigned valid)
{
	const __m512i flip = _mm512_set1_epi8((char)0x80);
	const int8_t *act = (const int8_t *)a->codes;
	const uint8_t *blk2 = blk + w->block_bytes;
	const uint8_t *c0 = blk + w->scale_bytes, *c1 = blk2 + w->scale_bytes;
	const size_t chunks = w->group / Q8_CHUNK_COLS;
	__m512 f0 = _mm512_setzero_ps(), f1 = f0;

	for (size_t g = 0; g < w->n_groups; g++) {
		__m512i acc0 = _mm512_setzero_si512(), acc1 = acc0;

		for (size_t c = 0; c < chunks; c++) {
			__m512i x = _mm512_xor_si512(_mm512_set1_epi32((int)load_u32(act + g * w->group + 4 * c)), flip);

			acc0 = dot_dpbusd(acc0, x, _mm512_load_si512(c0 + c * Q4_CHUNK_BYTES));
			acc1 = dot_dpbusd(acc1, x, _mm512_load_si512(c1 + c * Q4_CHUNK_BYTES));
		}
		c0 += chunks * Q4_CHUNK_BYTES;
		c1 += chunks * Q4_CHUNK_BYTES;
		__m512 vs = _mm512_set1_ps(a->scale[g]);
		__m512 d0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + g * 32)));
		__m512 d1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk2 + g * 32)));
		__m512i b0 = _mm512_slli_epi32(_mm512_cvtepi16_epi32(
			_mm256_loadu_si256((const __m256i *)(blk + (w->n_groups + g) * 32))), 7);
		__m512i b1 = _mm512_slli_epi32(_mm512_cvtepi16_epi32(
			_mm256_loadu_si256((const __m256i *)(blk2 + (w->n_groups + g) * 32))), 7);

		f0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc0, b0)), _mm512_mul_ps(d0, vs), f0);
		f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc1, b1)), _mm512_mul_ps(d1, vs), f1);
	}
	store_rows(y, f0, Q4_ROWS);
	store_rows(y + Q4_ROWS, f1, valid);
}

#define TILE_CASES(fn, w, a, blk, t0, nt, y, ldy, valid)      \
	switch (nt) {                                         \
	case 8: fn(w, a, blk, t0, 8, y, ldy, valid); break;   \
	case 7: fn(w, a, blk, t0, 7, y, ldy, valid); break;   \
	case 6: fn(w, a, blk, t0, 6, y, ldy, valid); break;   \
	case 5: fn(w, a, blk, t0, 5, y, ldy, valid); break;   \
	case 4: fn(w, a, blk, t0, 4, y, ldy, valid); break;   \
	case 3: fn(w, a, blk, t0, 3, y, ldy, valid); break;   \
	case 2: fn(w, a, blk, t0, 2, y, ldy, valid); break;   \
	default: fn(w, a, blk, t0, 1, y, ldy, valid); break;  \
	}

static void tile_any(const struct q8_matrix *w, const struct q4_acts *a, const uint8_t *blk, size_t t0,
		     size_t nt, float *y, size_t ldy, unsigned valid)
{
	if (a->kind == Q4_ACT_A8) {
		TILE_CASES(tile_a8, w, a, blk, t0, nt, y, ldy, valid)
	} else {
		TILE_CASES(tile_a16, w, a, blk, t0, nt, y, ldy, valid)
	}
}

void q8_matmul_avx512(const struct q8_matrix *w, const struct q4_acts *a, float *y, size_t ldy,
		      size_t row_begin, size_t row_end)
{
	size_t rb0 = row_begin / Q4_ROWS, rb1 = (row_end + Q4_ROWS - 1) / Q4_ROWS;
	size_t elem = a->kind == Q4_ACT_A8 ? 1 : 2;
	size_t chunk = (256u << 10) / (a->cols * elem);

	chunk = chunk < Q8_NT ? Q8_NT : chunk / Q8_NT * Q8_NT;
	if (a->n_tok == 1 && a->kind == Q4_ACT_A8) {
		for (size_t rb = rb0; rb < rb1; rb += 2) {
			const uint8_t *blk = w->data + rb * w->block_bytes;
			size_t r0 = rb * Q4_ROWS, last = rb + 1 < rb1 ? r0 + Q4_ROWS : r0;
			unsigned valid = (unsigned)(row_end - last < Q4_ROWS ? row_end - last : Q4_ROWS);

			if (rb + 1 < rb1)
				gemv_a8_pair(w, a, blk, y + r0, valid);
			else
				tile_a8(w, a, blk, 0, 1, y + r0, ldy, valid);
		}
		return;
	}
	for (size_t tc = 0; tc < a->n_tok; tc += chunk) {
		size_t tc_end = tc + chunk < a->n_tok ? tc + chunk : a->n_tok;

		for (size_t rb = rb0; rb < rb1; rb++) {
			const uint8_t *blk = w->data + rb * w->block_bytes;
			size_t r0 = rb * Q4_ROWS;
			unsigned valid = (unsigned)(row_end - r0 < Q4_ROWS ? row_end - r0 : Q4_ROWS);

			for (size_t t0 = tc; t0 < tc_end; t0 += Q8_NT)
				tile_any(w, a, blk, t0, tc_end - t0 < Q8_NT ? tc_end - t0 : Q8_NT, y + r0, ldy, valid);
		}
	}
}
