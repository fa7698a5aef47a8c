/* AVX2 q4 kernels (with FMA and F16C): a 64-byte chunk is two ymm halves (rows 0-7 and
 * 8-15). W4A8 multiplies u8 codes by int8 activations with vpmaddubsw + vpmaddwd (no
 * saturation: |2*15*127| fits int16), so its integer dots equal the reference's. W4A16
 * converts nibbles to f32 and uses FMA. Built with AVX2 target flags; only called when
 * cpuid says so (kernels/dispatch.c). */
#include "kernels/q4.h"

#include <immintrin.h>
#include <string.h>

#define GEMM_NT 2 /* tokens per register tile: 16 ymm registers run out beyond this */

static inline uint32_t load_u32(const void *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return v;
}

static inline __m256 load_ph8(const uint8_t *p)
{
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* d and m of rows 8h..8h+7 for group g (row8: the rows' fp16 scales times the group's
 * 8-bit codes, one product each as in q4_scale_d/m). */
static inline void group_scales(const struct q4_matrix *w, const uint8_t *blk, size_t g, int h,
				__m256 *d, __m256 *m)
{
	if (w->row8) {
		const uint8_t *c = blk + Q4_ROW8_HEAD + g * Q4_ROWS + h * 8;
		__m128i dc = _mm_loadl_epi64((const __m128i *)c);
		__m128i mc = _mm_loadl_epi64((const __m128i *)(c + w->n_groups * Q4_ROWS));

		*d = _mm256_mul_ps(load_ph8(blk + h * 16), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(dc)));
		*m = _mm256_mul_ps(load_ph8(blk + 32 + h * 16), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(mc)));
		return;
	}
	*d = load_ph8(blk + g * 32 + h * 16);
	*m = w->asym ? load_ph8(blk + (w->n_groups + g) * 32 + h * 16)
		     : _mm256_mul_ps(*d, _mm256_set1_ps(-8.0f));
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

static inline float hsum_ps(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

static inline int hsum_epi32(__m256i v)
{
	__m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));

	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
	return _mm_cvtsi128_si32(s);
}

static inline float hmax_ps(__m256 v)
{
	__m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_max_ps(s, _mm_movehl_ps(s, s));
	s = _mm_max_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* ---- activation preparation ---- */

static void prepare_a8(struct q4_acts *a, const float *x, size_t t)
{
	int8_t *dst = (int8_t *)a->codes + t * a->cols;
	const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));

	for (size_t g = 0; g < a->n_groups; g++) {
		const float *xg = x + g * a->group;
		__m256 vmax = _mm256_setzero_ps();

		for (size_t i = 0; i < a->group; i += 8)
			vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(xg + i), absmask));
		float amax = hmax_ps(vmax);
		/* The reference's float steps, so codes and scales match it exactly. */
		float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
		float scale = amax / 127.0f;
		__m256 vinv = _mm256_set1_ps(inv);
		__m256i isum = _mm256_setzero_si256();

		for (size_t i = 0; i < a->group; i += 8) {
			__m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + i), vinv));
			__m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
			__m128i q8 = _mm_packs_epi16(q16, q16);

			isum = _mm256_add_epi32(isum, q);
			_mm_storel_epi64((__m128i *)(dst + g * a->group + i), q8);
		}
		a->scale[t * a->n_groups + g] = scale;
		a->sum[t * a->n_groups + g] = scale * (float)hsum_epi32(isum);
	}
}

static void prepare_a16(struct q4_acts *a, const float *x, size_t t)
{
	uint16_t *dst = (uint16_t *)a->codes + t * a->cols;
	/* 32-bit lanes 0,2,4,6,1,3,5,7: the pair order of q4_a16_index. */
	const __m256i perm = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
	const __m256i round = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1);

	for (size_t g = 0; g < a->n_groups; g++) {
		__m256 vsum = _mm256_setzero_ps();

		for (size_t i = g * a->group; i < (g + 1) * a->group; i += 8) {
			/* Round to nearest even in integers, as quant_f32_to_bf16. */
			__m256 xv = _mm256_loadu_ps(x + i);
			__m256i b = _mm256_castps_si256(xv);
			__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), one);
			__m256i h = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(round, lsb)), 16);
			/* NaN stays a (quiet) NaN instead of rounding into infinity. */
			__m256i nan = _mm256_castps_si256(_mm256_cmp_ps(xv, xv, _CMP_UNORD_Q));
			__m256i qnan = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(64));

			h = _mm256_blendv_epi8(h, qnan, nan);

			vsum = _mm256_add_ps(vsum, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
			h = _mm256_permutevar8x32_epi32(h, perm);
			__m128i w16 = _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));

			_mm_storeu_si128((__m128i *)(dst + i), w16);
		}
		a->sum[t * a->n_groups + g] = hsum_ps(vsum);
	}
}

void q4_acts_prepare_avx2(struct q4_acts *a, const float *x, size_t ldx, size_t tok_begin, size_t tok_end)
{
	for (size_t t = tok_begin; t < tok_end; t++) {
		if (a->kind == Q4_ACT_A8)
			prepare_a8(a, x + t * ldx, t);
		else
			prepare_a16(a, x + t * ldx, t);
	}
}

/* ---- W4A8 ---- */

/* sum over each 32-bit lane of 4 u8 x s8 products (two vpmaddubsw, one vpmaddwd). */
static inline __m256i dot8(__m256i lo, __m256i hi, __m256i alo, __m256i ahi, __m256i ones)
{
	__m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, alo), _mm256_maddubs_epi16(hi, ahi));

	return _mm256_madd_epi16(s, ones);
}

/* NT tokens from t0 against one row block; NT = 1 is the decode GEMV. */
static inline __attribute__((always_inline)) void
tile_a8(const struct q4_matrix *w, const struct q4_acts *a, const uint8_t *blk, size_t t0, const int NT,
	float *y, size_t ldy, unsigned valid)
{
	const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
	const uint8_t *codes = blk + w->scale_bytes;
	const size_t chunks = w->group / Q4_CHUNK_COLS;
	const int8_t *act[GEMM_NT];
	__m256 f[GEMM_NT][2];

#pragma GCC unroll 8
	for (int t = 0; t < NT; t++) {
		act[t] = (const int8_t *)a->codes + (t0 + t) * a->cols;
		f[t][0] = f[t][1] = _mm256_setzero_ps();
	}
	for (size_t g = 0; g < w->n_groups; g++) {
		__m256i acc[GEMM_NT][2];

#pragma GCC unroll 8
		for (int t = 0; t < NT; t++)
			acc[t][0] = acc[t][1] = _mm256_setzero_si256();
		for (size_t c = 0; c < chunks; c++) {
			const uint8_t *p = codes + c * Q4_CHUNK_BYTES;
			__m256i v0 = _mm256_load_si256((const __m256i *)p);
			__m256i v1 = _mm256_load_si256((const __m256i *)(p + 32));
			__m256i lo0 = _mm256_and_si256(v0, low), hi0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), low);
			__m256i lo1 = _mm256_and_si256(v1, low), hi1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), low);
			size_t k = g * w->group + 8 * c;

#pragma GCC unroll 8
			for (int t = 0; t < NT; t++) {
				__m256i alo = _mm256_set1_epi32((int)load_u32(act[t] + k));
				__m256i ahi = _mm256_set1_epi32((int)load_u32(act[t] + k + 4));

				acc[t][0] = _mm256_add_epi32(acc[t][0], dot8(lo0, hi0, alo, ahi, ones));
				acc[t][1] = _mm256_add_epi32(acc[t][1], dot8(lo1, hi1, alo, ahi, ones));
			}
		}
		codes += chunks * Q4_CHUNK_BYTES;
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			__m256 d, m;

			group_scales(w, blk, g, h, &d, &m);
#pragma GCC unroll 8
			for (int t = 0; t < NT; t++) {
				size_t i = (t0 + t) * a->n_groups + g;
				__m256 ds = _mm256_mul_ps(d, _mm256_set1_ps(a->scale[i]));

				f[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[t][h]), ds, f[t][h]);
				f[t][h] = _mm256_fmadd_ps(m, _mm256_set1_ps(a->sum[i]), f[t][h]);
			}
		}
	}
#pragma GCC unroll 8
	for (int t = 0; t < NT; t++)
		store_rows(y + (t0 + t) * ldy, f[t][0], f[t][1], valid);
}

/* Decode (one token) over two adjacent row blocks side by side: two load streams keep
 * more cache lines in flight than one. valid is the second block's row count. */
static void gemv_a8_pair(const struct q4_matrix *w, const struct q4_acts *a, const uint8_t *blk, float *y,
			 unsigned valid)
{
	const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
	const int8_t *act = (const int8_t *)a->codes;
	const size_t chunks = w->group / Q4_CHUNK_COLS;
	const uint8_t *codes[2] = { blk + w->scale_bytes, blk + w->block_bytes + w->scale_bytes };
	__m256 f[2][2];

	f[0][0] = f[0][1] = f[1][0] = f[1][1] = _mm256_setzero_ps();
	for (size_t g = 0; g < w->n_groups; g++) {
		__m256i acc[2][2];

		acc[0][0] = acc[0][1] = acc[1][0] = acc[1][1] = _mm256_setzero_si256();
		for (size_t c = 0; c < chunks; c++) {
			size_t k = g * w->group + 8 * c;
			__m256i alo = _mm256_set1_epi32((int)load_u32(act + k));
			__m256i ahi = _mm256_set1_epi32((int)load_u32(act + k + 4));

#pragma GCC unroll 2
			for (int b = 0; b < 2; b++) {
				const uint8_t *p = codes[b] + c * Q4_CHUNK_BYTES;
				__m256i v0 = _mm256_load_si256((const __m256i *)p);
				__m256i v1 = _mm256_load_si256((const __m256i *)(p + 32));

				acc[b][0] = _mm256_add_epi32(acc[b][0], dot8(_mm256_and_si256(v0, low),
					_mm256_and_si256(_mm256_srli_epi16(v0, 4), low), alo, ahi, ones));
				acc[b][1] = _mm256_add_epi32(acc[b][1], dot8(_mm256_and_si256(v1, low),
					_mm256_and_si256(_mm256_srli_epi16(v1, 4), low), alo, ahi, ones));
			}
		}
		__m256 vs = _mm256_set1_ps(a->scale[g]), vsum = _mm256_set1_ps(a->sum[g]);

#pragma GCC unroll 2
		for (int b = 0; b < 2; b++) {
			codes[b] += chunks * Q4_CHUNK_BYTES;
#pragma GCC unroll 2
			for (int h = 0; h < 2; h++) {
				__m256 d, m;

				group_scales(w, blk + (size_t)b * w->block_bytes, g, h, &d, &m);
				f[b][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[b][h]), _mm256_mul_ps(d, vs), f[b][h]);
				f[b][h] = _mm256_fmadd_ps(m, vsum, f[b][h]);
			}
		}
	}
	store_rows(y, f[0][0], f[0][1], Q4_ROWS);
	store_rows(y + Q4_ROWS, f[1][0], f[1][1], valid);
}

/* ---- W4A16 ---- */

/* Nibble p of each lane (shift 4p) holds column k0 + {0,4,1,5,2,6,3,7}[p], whose bf16 sits
 * at A16 index {0,2,4,6,1,3,5,7}[p] of the 8-column block. */
static const unsigned char a16_of_nibble[8] = { 0, 2, 4, 6, 1, 3, 5, 7 };

static inline __m256 bf16_bcast(const uint16_t *p)
{
	return _mm256_castsi256_ps(_mm256_set1_epi32((int)((uint32_t)*p << 16)));
}

static inline __attribute__((always_inline)) void
tile_a16(const struct q4_matrix *w, const struct q4_acts *a, const uint8_t *blk, size_t t0, const int NT,
	 float *y, size_t ldy, unsigned valid)
{
	const __m256i low = _mm256_set1_epi32(0x0F);
	const uint8_t *codes = blk + w->scale_bytes;
	const size_t chunks = w->group / Q4_CHUNK_COLS;
	const uint16_t *x[GEMM_NT];
	__m256 f[GEMM_NT][2];

#pragma GCC unroll 8
	for (int t = 0; t < NT; t++) {
		x[t] = (const uint16_t *)a->codes + (t0 + t) * a->cols;
		f[t][0] = f[t][1] = _mm256_setzero_ps();
	}
	for (size_t g = 0; g < w->n_groups; g++) {
		__m256 acc[GEMM_NT][2];

#pragma GCC unroll 8
		for (int t = 0; t < NT; t++)
			acc[t][0] = acc[t][1] = _mm256_setzero_ps();
		for (size_t c = 0; c < chunks; c++) {
			const uint8_t *p = codes + c * Q4_CHUNK_BYTES;
			__m256i v0 = _mm256_load_si256((const __m256i *)p);
			__m256i v1 = _mm256_load_si256((const __m256i *)(p + 32));
			size_t k = g * w->group + 8 * c;

#pragma GCC unroll 8
			for (int n = 0; n < 8; n++) {
				__m256 w0 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v0, 4 * n), low));
				__m256 w1 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v1, 4 * n), low));

#pragma GCC unroll 8
				for (int t = 0; t < NT; t++) {
					__m256 xb = bf16_bcast(x[t] + k + a16_of_nibble[n]);

					acc[t][0] = _mm256_fmadd_ps(w0, xb, acc[t][0]);
					acc[t][1] = _mm256_fmadd_ps(w1, xb, acc[t][1]);
				}
			}
		}
		codes += chunks * Q4_CHUNK_BYTES;
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			__m256 d, m;

			group_scales(w, blk, g, h, &d, &m);
#pragma GCC unroll 8
			for (int t = 0; t < NT; t++) {
				float sx = a->sum[(t0 + t) * a->n_groups + g];

				f[t][h] = _mm256_fmadd_ps(d, acc[t][h], f[t][h]);
				f[t][h] = _mm256_fmadd_ps(m, _mm256_set1_ps(sx), f[t][h]);
			}
		}
	}
#pragma GCC unroll 8
	for (int t = 0; t < NT; t++)
		store_rows(y + (t0 + t) * ldy, f[t][0], f[t][1], valid);
}

void q4_matmul_avx2(const struct q4_matrix *w, const struct q4_acts *a, float *y, size_t ldy,
		    size_t row_begin, size_t row_end)
{
	size_t rb0 = row_begin / Q4_ROWS, rb1 = (row_end + Q4_ROWS - 1) / Q4_ROWS;
	size_t elem = a->kind == Q4_ACT_A8 ? 1 : 2;
	/* Token chunks whose activations stay in L2 while the row blocks stream past. */
	size_t chunk = (256u << 10) / (a->cols * elem);

	chunk = chunk < GEMM_NT ? GEMM_NT : chunk / GEMM_NT * GEMM_NT;
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

			for (size_t t0 = tc; t0 < tc_end; t0 += GEMM_NT) {
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

/* q4_group_codes (kernels/q4.h): the reference's operations, 8 values a step, each in the
 * reference's order: float (x - m) * id rounded by the same trick, the codes clamped as
 * integers, d*q + m in float and the weighted squared error in 8 double lanes. No fused
 * multiply-add (contraction off), so the codes and the error are the reference's bits. A
 * range outside the rounding trick's goes to the reference. */
__attribute__((optimize("fp-contract=off"))) double q4_group_codes_avx2(const float *x, const float *w, size_t n,
									 float lo, float hi, float d, float m,
									 uint8_t *q)
{
	float id = d != 0.0f ? 1.0f / d : 0.0f;
	float vlo = (lo - m) * id, vhi = (hi - m) * id;

	if (!(vlo > -0x1p20f && vhi < 0x1p20f))
		return q4_group_codes_ref(x, w, n, lo, hi, d, m, q);
	const __m256 vm = _mm256_set1_ps(m), vid = _mm256_set1_ps(id), vd = _mm256_set1_ps(d);
	const __m256 magic = _mm256_set1_ps(0x1.8p23f);
	const __m256i zero = _mm256_setzero_si256(), fifteen = _mm256_set1_epi32(15);
	__m256d e0 = _mm256_setzero_pd(), e1 = _mm256_setzero_pd();
	for (size_t i = 0; i < n; i += 8) {
		__m256 xv = _mm256_loadu_ps(x + i);
		__m256 v = _mm256_mul_ps(_mm256_sub_ps(xv, vm), vid);
		v = _mm256_sub_ps(_mm256_add_ps(v, magic), magic);
		__m256i c = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvttps_epi32(v), zero), fifteen);
		__m128i c16 = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
		_mm_storel_epi64((__m128i *)(q + i), _mm_packus_epi16(c16, c16));
		__m256 val = _mm256_add_ps(_mm256_mul_ps(vd, _mm256_cvtepi32_ps(c)), vm);
		__m256 wv = _mm256_loadu_ps(w + i);
		__m256d t0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(xv)),
					   _mm256_cvtps_pd(_mm256_castps256_ps128(val)));
		__m256d t1 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(xv, 1)),
					   _mm256_cvtps_pd(_mm256_extractf128_ps(val, 1)));
		e0 = _mm256_add_pd(e0, _mm256_mul_pd(_mm256_mul_pd(t0, t0), _mm256_cvtps_pd(_mm256_castps256_ps128(wv))));
		e1 = _mm256_add_pd(e1, _mm256_mul_pd(_mm256_mul_pd(t1, t1), _mm256_cvtps_pd(_mm256_extractf128_ps(wv, 1))));
	}
	double e[8];
	_mm256_storeu_pd(e, e0);
	_mm256_storeu_pd(e + 4, e1);
	return ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
}

/* q4_grid_sums (kernels/q4.h): one grid's codes and the weighted sums of l, l^2 and x*l,
 * lane j holding values j, j+8, ... as the reference's lanes do, each lane the reference's
 * operations in its order (contraction off): the same float bits. */
__attribute__((optimize("fp-contract=off"))) void q4_grid_sums_avx2(const float *x, const float *w, size_t n,
								      float lo, float is, float ll[8], float lll[8],
								      float lxl[8])
{
	const __m256 vlo = _mm256_set1_ps(lo), vis = _mm256_set1_ps(is), half = _mm256_set1_ps(0.5f);
	const __m256i fifteen = _mm256_set1_epi32(15);
	__m256 sl = _mm256_setzero_ps(), sll = _mm256_setzero_ps(), sxl = _mm256_setzero_ps();
	for (size_t i = 0; i < n; i += 8) {
		__m256 xv = _mm256_loadu_ps(x + i), wv = _mm256_loadu_ps(w + i);
		__m256i c = _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(xv, vlo), vis), half));
		__m256 l = _mm256_cvtepi32_ps(_mm256_min_epi32(c, fifteen));
		sl = _mm256_add_ps(sl, _mm256_mul_ps(l, wv));
		sll = _mm256_add_ps(sll, _mm256_mul_ps(_mm256_mul_ps(l, l), wv));
		sxl = _mm256_add_ps(sxl, _mm256_mul_ps(_mm256_mul_ps(xv, l), wv));
	}
	_mm256_storeu_ps(ll, sl);
	_mm256_storeu_ps(lll, sll);
	_mm256_storeu_ps(lxl, sxl);
}

const struct q4_search q4_search_avx2 = { q4_group_codes_avx2, q4_grid_sums_avx2 };
