/* AVX2 int6-weight matmul: each 4-column slice of a row block is rebuilt as two ymm
 * halves of u = q + 32 (0..63). W6A8 uses vpmaddubsw on u (unsigned) and the int8
 * activations (no saturation: 2*63*127 < 32768) and vpmaddwd, then takes 32 * sum(x)
 * back out per (token, group): an exact integer dot. W6A16 widens u to f32 and uses FMA. */
#include "kernels/q6.h"

#include <immintrin.h>
#include <string.h>

#define Q6_NT 2

static inline uint32_t load_u32(const void *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return v;
}

static inline void store_rows(float *y, __m256 lo, __m256 hi, unsigned valid)
{
	if (valid == Q4_ROWS) {
		_mm256_storeu_ps(y, lo);
		_mm256_storeu_ps(y + 8, hi);
		return;
	}
	float tmp[Q4_ROWS];

	_mm256_storeu_ps(tmp, lo);
	_mm256_storeu_ps(tmp + 8, hi);
	memcpy(y, tmp, valid * sizeof(float));
}

/* u of columns 4b..4b+3, rows 8*half..8*half+7, of the group whose codes start at gp. */
static inline __attribute__((always_inline)) __m256i slice_u(const uint8_t *gp, const int b, const int half)
{
	const __m256i m0f = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
	__m256i l = _mm256_load_si256((const __m256i *)(gp + (b >> 1) * Q4_CHUNK_BYTES + 32 * half));
	__m256i h = _mm256_load_si256((const __m256i *)(gp + 4 * Q4_CHUNK_BYTES + (b >> 2) * Q4_CHUNK_BYTES +
							  32 * half));
	const int s = b & 3;

	l = (b & 1) ? _mm256_and_si256(_mm256_srli_epi32(l, 4), m0f) : _mm256_and_si256(l, m0f);
	if (s == 0)
		h = _mm256_slli_epi32(h, 4);
	else if (s == 1)
		h = _mm256_slli_epi32(h, 2);
	else if (s == 3)
		h = _mm256_srli_epi32(h, 2);
	return _mm256_or_si256(_mm256_and_si256(h, m30), l);
}

static inline __attribute__((always_inline)) void
tile_a8(const struct q6_matrix *w, const struct q4_acts *a, const uint8_t *blk, size_t t0, const int NT,
	float *y, size_t ldy, unsigned valid)
{
	const __m256i ones = _mm256_set1_epi16(1);
	const uint8_t *codes = blk + w->scale_bytes;
	const int8_t *act[Q6_NT];
	__m256 f[Q6_NT][2];

#pragma GCC unroll 8
	for (int t = 0; t < NT; t++) {
		act[t] = (const int8_t *)a->codes + (t0 + t) * a->cols;
		f[t][0] = f[t][1] = _mm256_setzero_ps();
	}
	for (size_t g = 0; g < w->n_groups; g++, codes += Q6_GROUP_BYTES) {
		__m256i acc[Q6_NT][2], xs[Q6_NT];

#pragma GCC unroll 8
		for (int t = 0; t < NT; t++) {
			/* The group's code sum, as maddubs of ones with the codes. */
			__m256i x = _mm256_loadu_si256((const __m256i *)(act[t] + g * Q6_GROUP));

			xs[t] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), x), ones);
			acc[t][0] = acc[t][1] = _mm256_setzero_si256();
		}
#pragma GCC unroll 8
		for (int b = 0; b < 8; b++) {
			__m256i u0 = slice_u(codes, b, 0), u1 = slice_u(codes, b, 1);

#pragma GCC unroll 8
			for (int t = 0; t < NT; t++) {
				__m256i x = _mm256_set1_epi32((int)load_u32(act[t] + g * Q6_GROUP + 4 * b));

				acc[t][0] = _mm256_add_epi32(acc[t][0], _mm256_madd_epi16(_mm256_maddubs_epi16(u0, x), ones));
				acc[t][1] = _mm256_add_epi32(acc[t][1], _mm256_madd_epi16(_mm256_maddubs_epi16(u1, x), ones));
			}
		}
#pragma GCC unroll 8
		for (int t = 0; t < NT; t++) {
			/* Horizontal sum of xs: every lane gets 32 * sum(x). */
			__m128i s = _mm_add_epi32(_mm256_castsi256_si128(xs[t]), _mm256_extracti128_si256(xs[t], 1));

			s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
			s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
			xs[t] = _mm256_slli_epi32(_mm256_broadcastd_epi32(s), 5);
		}
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			__m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + g * 32 + h * 16)));

#pragma GCC unroll 8
			for (int t = 0; t < NT; t++) {
				__m256 ds = _mm256_mul_ps(d, _mm256_set1_ps(a->scale[(t0 + t) * a->n_groups + g]));
				__m256i dot = _mm256_sub_epi32(acc[t][h], xs[t]);

				f[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), ds, f[t][h]);
			}
		}
	}
#pragma GCC unroll 8
	for (int t = 0; t < NT; t++)
		store_rows(y + (t0 + t) * ldy, f[t][0], f[t][1], valid);
}

static inline __m256 bf16_bcast(const uint16_t *p)
{
	return _mm256_castsi256_ps(_mm256_set1_epi32((int)((uint32_t)*p << 16)));
}

static inline __m256 byte_f32(__m256i v, const int j)
{
	return _mm256_cvtepi32_ps(_mm256_srli_epi32(_mm256_slli_epi32(v, 24 - 8 * j), 24));
}

static inline __attribute__((always_inline)) void
tile_a16(const struct q6_matrix *w, const struct q4_acts *a, const uint8_t *blk, size_t t0, const int NT,
	 float *y, size_t ldy, unsigned valid)
{
	const uint8_t *codes = blk + w->scale_bytes;
	const uint16_t *x[Q6_NT];
	__m256 f[Q6_NT][2];

#pragma GCC unroll 8
	for (int t = 0; t < NT; t++) {
		x[t] = (const uint16_t *)a->codes + (t0 + t) * a->cols;
		f[t][0] = f[t][1] = _mm256_setzero_ps();
	}
	for (size_t g = 0; g < w->n_groups; g++, codes += Q6_GROUP_BYTES) {
		__m256 acc[Q6_NT][2];

#pragma GCC unroll 8
		for (int t = 0; t < NT; t++)
			acc[t][0] = acc[t][1] = _mm256_setzero_ps();
#pragma GCC unroll 8
		for (int b = 0; b < 8; b++) {
			__m256i v0 = slice_u(codes, b, 0), v1 = slice_u(codes, b, 1);
			size_t k = g * Q6_GROUP + 4 * (size_t)b;

#pragma GCC unroll 4
			for (int j = 0; j < 4; j++) {
				__m256 w0 = byte_f32(v0, j), w1 = byte_f32(v1, j);

#pragma GCC unroll 8
				for (int t = 0; t < NT; t++) {
					__m256 xb = bf16_bcast(x[t] + q4_a16_index(k + (size_t)j));

					acc[t][0] = _mm256_fmadd_ps(w0, xb, acc[t][0]);
					acc[t][1] = _mm256_fmadd_ps(w1, xb, acc[t][1]);
				}
			}
		}
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			__m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + g * 32 + h * 16)));

#pragma GCC unroll 8
			for (int t = 0; t < NT; t++) {
				/* sum(q x) = sum(u x) - 32 sum(x) */
				__m256 sx = _mm256_set1_ps(32.0f * a->sum[(t0 + t) * a->n_groups + g]);

				f[t][h] = _mm256_fmadd_ps(d, _mm256_sub_ps(acc[t][h], sx), f[t][h]);
			}
		}
	}
#pragma GCC unroll 8
	for (int t = 0; t < NT; t++)
		store_rows(y + (t0 + t) * ldy, f[t][0], f[t][1], valid);
}

void q6_matmul_avx2(const struct q6_matrix *w, const struct q4_acts *a, float *y, size_t ldy,
		    size_t row_begin, size_t row_end)
{
	size_t rb0 = row_begin / Q4_ROWS, rb1 = (row_end + Q4_ROWS - 1) / Q4_ROWS;
	size_t elem = a->kind == Q4_ACT_A8 ? 1 : 2;
	size_t chunk = (256u << 10) / (a->cols * elem);

	chunk = chunk < Q6_NT ? Q6_NT : chunk / Q6_NT * Q6_NT;
	for (size_t tc = 0; tc < a->n_tok; tc += chunk) {
		size_t tc_end = tc + chunk < a->n_tok ? tc + chunk : a->n_tok;

		for (size_t rb = rb0; rb < rb1; rb++) {
			const uint8_t *blk = w->data + rb * w->block_bytes;
			size_t r0 = rb * Q4_ROWS;
			unsigned valid = (unsigned)(row_end - r0 < Q4_ROWS ? row_end - r0 : Q4_ROWS);

			for (size_t t0 = tc; t0 < tc_end; t0 += Q6_NT) {
				bool two = tc_end - t0 >= 2;

				if (a->kind == Q4_ACT_A8) {
					if (two)
						tile_a8(w, a, blk, t0, 2, y + r0, ldy, valid);
					else
						tile_a8(w, a, blk, t0, 1, y + r0, ldy, valid);
				} else {
					if (two)
						tile_a16(w, a, blk, t0, 2, y + r0, ldy, valid);
					else
						tile_a16(w, a, blk, t0, 1, y + r0, ldy, valid);
				}
			}
		}
	}
}
