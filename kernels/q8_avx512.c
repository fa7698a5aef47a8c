/* AVX-512 int8-weight matmul: a 64-byte chunk is 16 rows x 4 int8. W8A8 feeds vpdpbusd
 * with x+128 (u8) against the signed codes and takes 128*sum(codes), stored per
 * (row, group), back out, so the integer dot is exact. W8A16 sign-extends codes to f32. */
#include "kernels/q8.h"

#include <immintrin.h>
#include <string.h>

#define Q8_NT 8

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

				acc[t] = _mm512_dpbusd_epi32(acc[t], x, v);
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

static inline __m512 bf16_bcast(const uint16_t *p)
{
	return _mm512_castsi512_ps(_mm512_set1_epi32((int)((uint32_t)*p << 16)));
}

static inline __attribute__((always_inline)) void
tile_a16(const struct q8_matrix *w, const struct q4_acts *a, const uint8_t *blk, size_t t0, const int NT,
	 float *y, size_t ldy, unsigned valid)
{
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
		__m512 acc[Q8_NT];

#pragma GCC unroll 8
		for (int t = 0; t < NT; t++)
			acc[t] = _mm512_setzero_ps();
		for (size_t c = 0; c < chunks; c++) {
			__m512i v = _mm512_load_si512(codes + c * Q4_CHUNK_BYTES);
			/* Byte j of each lane, sign-extended: shift it to the top, then back. */
			__m512 w0 = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 24), 24));
			__m512 w1 = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 16), 24));
			__m512 w2 = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 8), 24));
			__m512 w3 = _mm512_cvtepi32_ps(_mm512_srai_epi32(v, 24));
			size_t k = g * w->group + 4 * c;

#pragma GCC unroll 8
			for (int t = 0; t < NT; t++) {
				acc[t] = _mm512_fmadd_ps(w0, bf16_bcast(x[t] + q4_a16_index(k)), acc[t]);
				acc[t] = _mm512_fmadd_ps(w1, bf16_bcast(x[t] + q4_a16_index(k + 1)), acc[t]);
				acc[t] = _mm512_fmadd_ps(w2, bf16_bcast(x[t] + q4_a16_index(k + 2)), acc[t]);
				acc[t] = _mm512_fmadd_ps(w3, bf16_bcast(x[t] + q4_a16_index(k + 3)), acc[t]);
			}
		}
		codes += chunks * Q4_CHUNK_BYTES;
		__m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + g * 32)));

#pragma GCC unroll 8
		for (int t = 0; t < NT; t++)
			f[t] = _mm512_fmadd_ps(d, acc[t], f[t]);
	}
#pragma GCC unroll 8
	for (int t = 0; t < NT; t++)
		store_rows(y + (t0 + t) * ldy, f[t], valid);
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
