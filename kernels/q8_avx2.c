/* AVX2 int8-weight matmul: each 64-byte chunk (16 rows x 4 int8) is two ymm halves.
 * W8A8 uses vpmaddubsw on |w| and sign(x, w) (no saturation: 2*128*127 < 32768) and
 * vpmaddwd, an exact integer dot; W8A16 sign-extends codes to f32 and uses FMA. */
#include "kernels/q8.h"

#include <immintrin.h>
#include <string.h>

#define Q8_NT 2

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

static inline __m256i dot4(__m256i w, __m256i x, __m256i ones)
{
	return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)), ones);
}

static inline __attribute__((always_inline)) void
tile_a8(const struct q8_matrix *w, const struct q4_acts *a, const uint8_t *blk, size_t t0, const int NT,
	float *y, size_t ldy, unsigned valid)
{
	const __m256i ones = _mm256_set1_epi16(1);
	const uint8_t *codes = blk + w->scale_bytes;
	const size_t chunks = w->group / Q8_CHUNK_COLS;
	const int8_t *act[Q8_NT];
	__m256 f[Q8_NT][2];

#pragma GCC unroll 8
	for (int t = 0; t < NT; t++) {
		act[t] = (const int8_t *)a->codes + (t0 + t) * a->cols;
		f[t][0] = f[t][1] = _mm256_setzero_ps();
	}
	for (size_t g = 0; g < w->n_groups; g++) {
		__m256i acc[Q8_NT][2];

#pragma GCC unroll 8
		for (int t = 0; t < NT; t++)
			acc[t][0] = acc[t][1] = _mm256_setzero_si256();
		for (size_t c = 0; c < chunks; c++) {
			const uint8_t *p = codes + c * Q4_CHUNK_BYTES;
			__m256i v0 = _mm256_load_si256((const __m256i *)p);
			__m256i v1 = _mm256_load_si256((const __m256i *)(p + 32));
			size_t k = g * w->group + 4 * c;

#pragma GCC unroll 8
			for (int t = 0; t < NT; t++) {
				__m256i x = _mm256_set1_epi32((int)load_u32(act[t] + k));

				acc[t][0] = _mm256_add_epi32(acc[t][0], dot4(v0, x, ones));
				acc[t][1] = _mm256_add_epi32(acc[t][1], dot4(v1, x, ones));
			}
		}
		codes += chunks * Q4_CHUNK_BYTES;
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			__m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + g * 32 + h * 16)));

#pragma GCC unroll 8
			for (int t = 0; t < NT; t++) {
				__m256 ds = _mm256_mul_ps(d, _mm256_set1_ps(a->scale[(t0 + t) * a->n_groups + g]));

				f[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[t][h]), ds, f[t][h]);
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
	return _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 24 - 8 * j), 24));
}

static inline __attribute__((always_inline)) void
tile_a16(const struct q8_matrix *w, const struct q4_acts *a, const uint8_t *blk, size_t t0, const int NT,
	 float *y, size_t ldy, unsigned valid)
{
	const uint8_t *codes = blk + w->scale_bytes;
	const size_t chunks = w->group / Q8_CHUNK_COLS;
	const uint16_t *x[Q8_NT];
	__m256 f[Q8_NT][2];

#pragma GCC unroll 8
	for (int t = 0; t < NT; t++) {
		x[t] = (const uint16_t *)a->codes + (t0 + t) * a->cols;
		f[t][0] = f[t][1] = _mm256_setzero_ps();
	}
	for (size_t g = 0; g < w->n_groups; g++) {
		__m256 acc[Q8_NT][2];

#pragma GCC unroll 8
		for (int t = 0; t < NT; t++)
			acc[t][0] = acc[t][1] = _mm256_setzero_ps();
		for (size_t c = 0; c < chunks; c++) {
			const uint8_t *p = codes + c * Q4_CHUNK_BYTES;
			__m256i v0 = _mm256_load_si256((const __m256i *)p);
			__m256i v1 = _mm256_load_si256((const __m256i *)(p + 32));
			size_t k = g * w->group + 4 * c;

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
		codes += chunks * Q4_CHUNK_BYTES;
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			__m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + g * 32 + h * 16)));

#pragma GCC unroll 8
			for (int t = 0; t < NT; t++)
				f[t][h] = _mm256_fmadd_ps(d, acc[t][h], f[t][h]);
		}
	}
#pragma GCC unroll 8
	for (int t = 0; t < NT; t++)
		store_rows(y + (t0 + t) * ldy, f[t][0], f[t][1], valid);
}

void q8_matmul_avx2(const struct q8_matrix *w, const struct q4_acts *a, float *y, size_t ldy,
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

			for (size_t t0 = tc; t0 < tc_end; t0 += Q8_NT) {
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
