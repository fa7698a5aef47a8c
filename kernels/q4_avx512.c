/* AVX-512 q4 kernels (F/BW/VL + VNNI + BF16): one 64-byte chunk is 16 rows x 8 codes,
 * so a single load feeds 16 output lanes. W4A8 multiplies codes (u8) by int8
 * activations with vpdpbusd; W4A16 turns nibbles into bf16 128+q with one vpternlogd and
 * multiplies with vdpbf16ps, taking 128*sum(x) back out per group. Built with AVX-512
 * target flags; only called when cpuid says the machine has them (kernels/dispatch.c). */
#include "kernels/q4.h"
#include "kernels/dot_avx512.h"

#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#define GEMM_NT 8 /* tokens per register tile: 8 int + 8 float accumulators */

/* GEMV (and the W4A8 GEMM tile) read this far ahead of themselves. W4A16 spends ~16 uops
 * per 64-byte chunk, so the out-of-order window alone keeps too few cache lines in flight
 * to cover DRAM latency; 4 KiB ahead is ~10% faster from DRAM (the W4A8 GEMV, at ~7 uops
 * a chunk, gains nothing from it). */
#define GEMV_PREFETCH 4096

static inline uint32_t load_u32(const void *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return v;
}

static inline __m512 load_ph16(const uint8_t *p)
{
	return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* d and m of 16 rows for group g; sym matrices carry m = -8d (exact in float); row8 ones
 * are the rows' fp16 scales times the group's 8-bit codes, one product each as in
 * q4_scale_d/m, so W4A8 stays bit for bit the reference's. */
static inline void group_scales(const struct q4_matrix *w, const uint8_t *blk, size_t g, __m512 *d,
				__m512 *m)
{
	if (w->row8) {
		const uint8_t *c = blk + Q4_ROW8_HEAD + g * Q4_ROWS;
		__m128i dc = _mm_loadu_si128((const __m128i *)c);
		__m128i mc = _mm_loadu_si128((const __m128i *)(c + w->n_groups * Q4_ROWS));

		*d = _mm512_mul_ps(load_ph16(blk), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(dc)));
		*m = _mm512_mul_ps(load_ph16(blk + 32), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(mc)));
		return;
	}
	*d = load_ph16(blk + g * 32);
	*m = w->asym ? load_ph16(blk + (w->n_groups + g) * 32) : _mm512_mul_ps(*d, _mm512_set1_ps(-8.0f));
}

static inline void store_rows(float *y, __m512 v, unsigned valid)
{
	if (valid == Q4_ROWS)
		_mm512_storeu_ps(y, v);
	else
		_mm512_mask_storeu_ps(y, (__mmask16)((1u << valid) - 1), v);
}

/* ---- activation preparation ---- */

static void prepare_a8(struct q4_acts *a, const float *x, size_t t)
{
	int8_t *dst = (int8_t *)a->codes + t * a->cols;

	for (size_t g = 0; g < a->n_groups; g++) {
		const float *xg = x + g * a->group;
		__m512 vmax = _mm512_setzero_ps();

		for (size_t i = 0; i < a->group; i += 16)
			vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(xg + i)));
		float amax = _mm512_reduce_max_ps(vmax);
		/* The same float steps as the reference, so the codes match it exactly. */
		float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
		float scale = amax / 127.0f;
		__m512 vinv = _mm512_set1_ps(inv);
		__m512i isum = _mm512_setzero_si512();

		for (size_t i = 0; i < a->group; i += 16) {
			__m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xg + i), vinv));

			isum = _mm512_add_epi32(isum, q);
			_mm_storeu_si128((__m128i *)(dst + g * a->group + i), _mm512_cvtsepi32_epi8(q));
		}
		a->scale[t * a->n_groups + g] = scale;
		a->sum[t * a->n_groups + g] = scale * (float)_mm512_reduce_add_epi32(isum);
	}
}

static void prepare_a16(struct q4_acts *a, const float *x, size_t t)
{
	uint16_t *dst = (uint16_t *)a->codes + t * a->cols;
	/* Within each 8 columns: k0,k2,k4,k6,k1,k3,k5,k7 (see q4_a16_index). */
	const __m256i perm = _mm256_setr_epi16(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
	const __m512i round = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1);

	for (size_t g = 0; g < a->n_groups; g++) {
		__m512 vsum = _mm512_setzero_ps();

		for (size_t i = g * a->group; i < (g + 1) * a->group; i += 16) {
			/* Round to nearest even in integers: bit-identical to quant_f32_to_bf16
			 * (vcvtneps2bf16 would flush denormals). */
			__m512 xv = _mm512_loadu_ps(x + i);
			__m512i b = _mm512_castps_si512(xv);
			__m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), one);
			__m512i h = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(round, lsb)), 16);
			/* NaN stays a (quiet) NaN instead of rounding into infinity. */
			__mmask16 nan = _mm512_cmp_ps_mask(xv, xv, _CMP_UNORD_Q);

			h = _mm512_mask_or_epi32(h, nan, _mm512_srli_epi32(b, 16), _mm512_set1_epi32(64));

			vsum = _mm512_add_ps(vsum, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
			__m256i w16 = _mm512_cvtepi32_epi16(h);

			_mm256_storeu_si256((__m256i *)(dst + i), _mm256_permutexvar_epi16(perm, w16));
		}
		a->sum[t * a->n_groups + g] = _mm512_reduce_add_ps(vsum);
	}
}

void q4_acts_prepare_avx512(struct q4_acts *a, const float *x, size_t ldx, size_t tok_begin, size_t tok_end)
{
	for (size_t t = tok_begin; t < tok_end; t++) {
		if (a->kind == Q4_ACT_A8)
			prepare_a8(a, x + t * ldx, t);
		else
			prepare_a16(a, x + t * ldx, t);
	}
}

/* ---- W4A8 ---- */

/* NB (1 or 2) adjacent row blocks, one token: the decode GEMV. Two blocks at once are
 * two independent load streams, which keeps more cache lines in flight than one
 * (+13-17% from DRAM on one core); two integer accumulators per block and group
 * keep the vpdpbusd chains short. Only the last block may be ragged (valid rows). */
static inline __attribute__((always_inline)) void
gemv_a8(const struct q4_matrix *w, const struct q4_acts *a, const uint8_t *blk, float *y, const int NB,
	unsigned valid)
{
	const __m512i low = _mm512_set1_epi8(0x0F);
	const int8_t *act = (const int8_t *)a->codes;
	const size_t chunks = w->group / Q4_CHUNK_COLS;
	const uint8_t *codes[2];
	__m512 f[2];

#pragma GCC unroll 2
	for (int b = 0; b < NB; b++) {
		codes[b] = blk + b * w->block_bytes + w->scale_bytes;
		f[b] = _mm512_setzero_ps();
	}
	for (size_t g = 0; g < w->n_groups; g++) {
		__m512i acc0[2], acc1[2];
		const int8_t *ag = act + g * w->group;

#pragma GCC unroll 2
		for (int b = 0; b < NB; b++)
			acc0[b] = acc1[b] = _mm512_setzero_si512();
		for (size_t c = 0; c < chunks; c++) {
			__m512i alo = _mm512_set1_epi32((int)load_u32(ag + 8 * c));
			__m512i ahi = _mm512_set1_epi32((int)load_u32(ag + 8 * c + 4));

#pragma GCC unroll 2
			for (int b = 0; b < NB; b++) {
				__m512i v = _mm512_load_si512(codes[b] + c * Q4_CHUNK_BYTES);

				/* The same chunk of the next pass's block, into L2: every new
				 * block otherwise starts its streams cold, ~0.5 us per block,
				 * which short rows (cols 1024-2048) pay every 8-16 KiB, about
				 * a third of their one-thread bandwidth. Past the last block it
				 * is a harmless prefetch. */
				_mm_prefetch((const char *)codes[b] + c * Q4_CHUNK_BYTES + NB * w->block_bytes, _MM_HINT_T1);
				acc0[b] = dot_dpbusd(acc0[b], _mm512_and_si512(v, low), alo);
				acc1[b] = dot_dpbusd(acc1[b], _mm512_and_si512(_mm512_srli_epi16(v, 4), low), ahi);
			}
		}
		__m512 vs = _mm512_set1_ps(a->scale[g]), vsum = _mm512_set1_ps(a->sum[g]);

#pragma GCC unroll 2
		for (int b = 0; b < NB; b++) {
			__m512 d, m;

			codes[b] += chunks * Q4_CHUNK_BYTES;
			group_scales(w, blk + b * w->block_bytes, g, &d, &m);
			__m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(acc0[b], acc1[b]));
			f[b] = _mm512_fmadd_ps(dot, _mm512_mul_ps(d, vs), f[b]);
			f[b] = _mm512_fmadd_ps(m, vsum, f[b]);
		}
	}
#pragma GCC unroll 2
	for (int b = 0; b < NB; b++)
		store_rows(y + b * Q4_ROWS, f[b], b == NB - 1 ? valid : Q4_ROWS);
}

/* One row block, NT tokens from t0: codes are unpacked once per chunk and reused by NT
 * tokens, whose activations stay in L1/L2 across the row blocks of a token chunk. */
static inline __attribute__((always_inline)) void
gemm_a8_tile(const struct q4_matrix *w, const struct q4_acts *a, const uint8_t *blk, size_t t0,
	     const int NT, float *y, size_t ldy, unsigned valid)
{
	const __m512i low = _mm512_set1_epi8(0x0F);
	const uint8_t *codes = blk + w->scale_bytes;
	const size_t chunks = w->group / Q4_CHUNK_COLS;
	const int8_t *act[GEMM_NT];
	__m512 f[GEMM_NT];

#pragma GCC unroll 8
	for (int t = 0; t < NT; t++) {
		act[t] = (const int8_t *)a->codes + (t0 + t) * a->cols;
		f[t] = _mm512_setzero_ps();
	}
	for (size_t g = 0; g < w->n_groups; g++) {
		__m512i acc[GEMM_NT];

#pragma GCC unroll 8
		for (int t = 0; t < NT; t++)
			acc[t] = _mm512_setzero_si512();
		for (size_t c = 0; c < chunks; c++) {
			__m512i v = _mm512_load_si512(codes + c * Q4_CHUNK_BYTES);
			__m512i lo = _mm512_and_si512(v, low);
			__m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
			size_t k = g * w->group + 8 * c;

			/* A few tokens (a decode batch) spend about as long on a chunk as memory
			 * takes to deliver it: without reading ahead the two alternate instead of
			 * overlapping (8 tokens from memory: 330-400 GOP/s without, 570-715 with,
			 * bench/bench_kernels). Extra tiles of the same block hit L1. */
			_mm_prefetch((const char *)codes + c * Q4_CHUNK_BYTES + GEMV_PREFETCH, _MM_HINT_T0);

#pragma GCC unroll 8
			for (int t = 0; t < NT; t++) {
				acc[t] = dot_dpbusd_bcast(acc[t], lo, act[t] + k);
				acc[t] = dot_dpbusd_bcast(acc[t], hi, act[t] + k + 4);
			}
		}
		codes += chunks * Q4_CHUNK_BYTES;
		__m512 d, m;

		group_scales(w, blk, g, &d, &m);
#pragma GCC unroll 8
		for (int t = 0; t < NT; t++) {
			size_t i = (t0 + t) * a->n_groups + g;

			f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t]), _mm512_mul_ps(d, _mm512_set1_ps(a->scale[i])),
					       f[t]);
			f[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(a->sum[i]), f[t]);
		}
	}
#pragma GCC unroll 8
	for (int t = 0; t < NT; t++)
		store_rows(y + (t0 + t) * ldy, f[t], valid);
}

/* ---- W4A16 ---- */

/* Nibble pair (shift s) of each 32-bit lane as two bf16 128+q: (v >> s) & 0x000F000F |
 * 0x43004300 in one vpternlogd. bf16 0x4300 is 128 with 7 zero mantissa bits, so
 * 0x4300|q is exactly 128+q. */
static inline __m512i nib_bf16(__m512i v, const __m512i mask, const __m512i bias)
{
	return _mm512_ternarylogic_epi32(v, mask, bias, 0xEA);
}

/* sum((128+q)*x) - 128*sum(x) = sum(q*x); 128*sx is exact (a power of two). */
static inline __m512 finish_a16(__m512 f, __m512 acc, __m512 d, __m512 m, float sx)
{
	__m512 dot = _mm512_sub_ps(acc, _mm512_set1_ps(128.0f * sx));

	f = _mm512_fmadd_ps(d, dot, f);
	return _mm512_fmadd_ps(m, _mm512_set1_ps(sx), f);
}

/* NB row blocks, one token, as gemv_a8 (called with NB = 1, see q4_matmul_avx512). Two
 * accumulator chains per block and group, fed in exactly gemm_a16_tile's order: a token's
 * result must not depend on how many tokens share the step, so batching changes nothing
 * (bit for bit). Decode is bound by memory, not by the chains' vdpbf16ps latency. */
static inline __attribute__((always_inline)) void
gemv_a16(const struct q4_matrix *w, const struct q4_acts *a, const uint8_t *blk, float *y, const int NB,
	 unsigned valid)
{
	const __m512i mask = _mm512_set1_epi32(0x000F000F), bias = _mm512_set1_epi32(0x43004300);
	const uint16_t *x = (const uint16_t *)a->codes;
	const size_t chunks = w->group / Q4_CHUNK_COLS;
	const uint8_t *codes[2];
	__m512 f[2];

#pragma GCC unroll 2
	for (int b = 0; b < NB; b++) {
		codes[b] = blk + b * w->block_bytes + w->scale_bytes;
		f[b] = _mm512_setzero_ps();
	}
	for (size_t g = 0; g < w->n_groups; g++) {
		__m512 acc0[2], acc1[2];
		const uint16_t *xg = x + g * w->group;

#pragma GCC unroll 2
		for (int b = 0; b < NB; b++)
			acc0[b] = acc1[b] = _mm512_setzero_ps();
		for (size_t c = 0; c < chunks; c++) {
			const uint16_t *xc = xg + 8 * c;
			__m512 x0 = dot_bcast_pair(xc), x1 = dot_bcast_pair(xc + 2), x2 = dot_bcast_pair(xc + 4), x3 = dot_bcast_pair(xc + 6);

#pragma GCC unroll 2
			for (int b = 0; b < NB; b++) {
				__m512i v = _mm512_load_si512(codes[b] + c * Q4_CHUNK_BYTES);

				_mm_prefetch((const char *)codes[b] + c * Q4_CHUNK_BYTES + GEMV_PREFETCH, _MM_HINT_T0);
				acc0[b] = dot_dpbf16(acc0[b], nib_bf16(v, mask, bias), x0);
				acc1[b] = dot_dpbf16(acc1[b], nib_bf16(_mm512_srli_epi32(v, 8), mask, bias), x2);
				acc0[b] = dot_dpbf16(acc0[b], nib_bf16(_mm512_srli_epi32(v, 4), mask, bias), x1);
				acc1[b] = dot_dpbf16(acc1[b], nib_bf16(_mm512_srli_epi32(v, 12), mask, bias), x3);
			}
		}
#pragma GCC unroll 2
		for (int b = 0; b < NB; b++) {
			__m512 d, m;

			codes[b] += chunks * Q4_CHUNK_BYTES;
			group_scales(w, blk + b * w->block_bytes, g, &d, &m);
			f[b] = finish_a16(f[b], _mm512_add_ps(acc0[b], acc1[b]), d, m, a->sum[g]);
		}
	}
#pragma GCC unroll 2
	for (int b = 0; b < NB; b++)
		store_rows(y + b * Q4_ROWS, f[b], b == NB - 1 ? valid : Q4_ROWS);
}

static inline __attribute__((always_inline)) void
gemm_a16_tile(const struct q4_matrix *w, const struct q4_acts *a, const uint8_t *blk, size_t t0,
	      const int NT, float *y, size_t ldy, unsigned valid)
{
	const __m512i mask = _mm512_set1_epi32(0x000F000F), bias = _mm512_set1_epi32(0x43004300);
	const uint8_t *codes = blk + w->scale_bytes;
	const size_t chunks = w->group / Q4_CHUNK_COLS;
	const uint16_t *x[GEMM_NT];
	__m512 f[GEMM_NT];

#pragma GCC unroll 8
	for (int t = 0; t < NT; t++) {
		x[t] = (const uint16_t *)a->codes + (t0 + t) * a->cols;
		f[t] = _mm512_setzero_ps();
	}
	for (size_t g = 0; g < w->n_groups; g++) {
		/* Two chains per token: vdpbf16ps latency, not throughput, bounds one chain. */
		__m512 acc0[GEMM_NT], acc1[GEMM_NT];

#pragma GCC unroll 8
		for (int t = 0; t < NT; t++)
			acc0[t] = acc1[t] = _mm512_setzero_ps();
		for (size_t c = 0; c < chunks; c++) {
			__m512i v = _mm512_load_si512(codes + c * Q4_CHUNK_BYTES);
			__m512i w0 = nib_bf16(v, mask, bias);
			__m512i w1 = nib_bf16(_mm512_srli_epi32(v, 4), mask, bias);
			__m512i w2 = nib_bf16(_mm512_srli_epi32(v, 8), mask, bias);
			__m512i w3 = nib_bf16(_mm512_srli_epi32(v, 12), mask, bias);
			size_t k = g * w->group + 8 * c;

#pragma GCC unroll 8
			for (int t = 0; t < NT; t++) {
				acc0[t] = dot_dpbf16_bcast(acc0[t], w0, x[t] + k);
				acc1[t] = dot_dpbf16_bcast(acc1[t], w2, x[t] + k + 4);
				acc0[t] = dot_dpbf16_bcast(acc0[t], w1, x[t] + k + 2);
				acc1[t] = dot_dpbf16_bcast(acc1[t], w3, x[t] + k + 6);
			}
		}
		codes += chunks * Q4_CHUNK_BYTES;
		__m512 d, m;

		group_scales(w, blk, g, &d, &m);
#pragma GCC unroll 8
		for (int t = 0; t < NT; t++)
			f[t] = finish_a16(f[t], _mm512_add_ps(acc0[t], acc1[t]), d, m,
					  a->sum[(t0 + t) * a->n_groups + g]);
	}
#pragma GCC unroll 8
	for (int t = 0; t < NT; t++)
		store_rows(y + (t0 + t) * ldy, f[t], valid);
}

/* ---- driver ---- */

#define TILE_CASES(fn, w, a, blk, t0, nt, y, ldy, valid)                     \
	switch (nt) {                                                        \
	case 8: fn(w, a, blk, t0, 8, y, ldy, valid); break;                  \
	case 7: fn(w, a, blk, t0, 7, y, ldy, valid); break;                  \
	case 6: fn(w, a, blk, t0, 6, y, ldy, valid); break;                  \
	case 5: fn(w, a, blk, t0, 5, y, ldy, valid); break;                  \
	case 4: fn(w, a, blk, t0, 4, y, ldy, valid); break;                  \
	case 3: fn(w, a, blk, t0, 3, y, ldy, valid); break;                  \
	case 2: fn(w, a, blk, t0, 2, y, ldy, valid); break;                  \
	default: fn(w, a, blk, t0, 1, y, ldy, valid); break;                 \
	}

static void gemm_a8_any(const struct q4_matrix *w, const struct q4_acts *a, const uint8_t *blk, size_t t0,
			size_t nt, float *y, size_t ldy, unsigned valid)
{
	TILE_CASES(gemm_a8_tile, w, a, blk, t0, nt, y, ldy, valid)
}

static void gemm_a16_any(const struct q4_matrix *w, const struct q4_acts *a, const uint8_t *blk, size_t t0,
			 size_t nt, float *y, size_t ldy, unsigned valid)
{
	TILE_CASES(gemm_a16_tile, w, a, blk, t0, nt, y, ldy, valid)
}

void q4_matmul_avx512(const struct q4_matrix *w, const struct q4_acts *a, float *y, size_t ldy,
		      size_t row_begin, size_t row_end)
{
	size_t rb0 = row_begin / Q4_ROWS, rb1 = (row_end + Q4_ROWS - 1) / Q4_ROWS;

	if (a->n_tok == 1) {
		/* W4A8 takes row blocks in pairs; W4A16, with twice the uops per byte, gains
		 * nothing from pairs and relies on its prefetch instead. */
		size_t step = a->kind == Q4_ACT_A8 ? 2 : 1;

		for (size_t rb = rb0; rb < rb1; rb += step) {
			const uint8_t *blk = w->data + rb * w->block_bytes;
			bool pair = step == 2 && rb + 1 < rb1;
			size_t r0 = rb * Q4_ROWS, last = pair ? r0 + Q4_ROWS : r0;
			unsigned valid = (unsigned)(row_end - last < Q4_ROWS ? row_end - last : Q4_ROWS);

			if (a->kind == Q4_ACT_A16)
				gemv_a16(w, a, blk, y + r0, 1, valid);
			else if (pair)
				gemv_a8(w, a, blk, y + r0, 2, valid);
			else
				gemv_a8(w, a, blk, y + r0, 1, valid);
		}
		return;
	}
	/* Token chunks sized so their activations stay in L2 (~256 KiB) while every row
	 * block of this thread's range streams past them. */
	size_t elem = a->kind == Q4_ACT_A8 ? 1 : 2;
	size_t chunk = (256u << 10) / (a->cols * elem);

	chunk = chunk < GEMM_NT ? GEMM_NT : chunk / GEMM_NT * GEMM_NT;
	for (size_t tc = 0; tc < a->n_tok; tc += chunk) {
		size_t tc_end = tc + chunk < a->n_tok ? tc + chunk : a->n_tok;

		for (size_t rb = rb0; rb < rb1; rb++) {
			const uint8_t *blk = w->data + rb * w->block_bytes;
			size_t r0 = rb * Q4_ROWS;
			unsigned valid = (unsigned)(row_end - r0 < Q4_ROWS ? row_end - r0 : Q4_ROWS);

			for (size_t t0 = tc; t0 < tc_end; t0 += GEMM_NT) {
				size_t nt = tc_end - t0 < GEMM_NT ? tc_end - t0 : GEMM_NT;

				if (a->kind == Q4_ACT_A8)
					gemm_a8_any(w, a, blk, t0, nt, y + r0, ldy, valid);
				else
					gemm_a16_any(w, a, blk, t0, nt, y + r0, ldy, valid);
			}
		}
	}
}

/* q4_group_codes (kernels/q4.h): as q4_group_codes_avx2, the 8 error lanes in one vector.
 * The reference's bits; a range outside the rounding trick's goes to the reference. */
__attribute__((optimize("fp-contract=off"))) double q4_group_codes_avx512(const float *x, const float *w, size_t n,
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
	__m512d e = _mm512_setzero_pd();
	for (size_t i = 0; i < n; i += 8) {
		__m256 xv = _mm256_loadu_ps(x + i);
		__m256 v = _mm256_mul_ps(_mm256_sub_ps(xv, vm), vid);
		v = _mm256_sub_ps(_mm256_add_ps(v, magic), magic);
		__m256i c = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvttps_epi32(v), zero), fifteen);
		_mm_storel_epi64((__m128i *)(q + i), _mm256_cvtepi32_epi8(c));
		__m256 val = _mm256_add_ps(_mm256_mul_ps(vd, _mm256_cvtepi32_ps(c)), vm);
		__m512d t = _mm512_sub_pd(_mm512_cvtps_pd(xv), _mm512_cvtps_pd(val));
		e = _mm512_add_pd(e, _mm512_mul_pd(_mm512_mul_pd(t, t), _mm512_cvtps_pd(_mm256_loadu_ps(w + i))));
	}
	double l[8];
	_mm512_storeu_pd(l, e);
	return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* The grid's sums are eight float lanes, one 256-bit vector: AVX2's kernel is the whole
 * of it, so the AVX-512 table shares it. */
const struct q4_search q4_search_avx512 = { q4_group_codes_avx512, q4_grid_sums_avx2 };
