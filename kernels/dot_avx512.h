/* The AVX-512 kernels' dot-product instructions (vpdpbusd, vdpbf16ps), written as asm.
 * GCC 12 keeps these intrinsics' results in a fresh register and copies them back to the
 * accumulator: one extra zmm move per instruction, which cost the int8 GEMM tile ~8% and
 * the decode GEMV ~15% from memory (bench/bench_kernels). */
#ifndef HEARTH_KERNELS_DOT_AVX512_H
#define HEARTH_KERNELS_DOT_AVX512_H

#include <immintrin.h>
#include <stdint.h>

/* acc += dot of unsigned bytes u and signed bytes s, 4 bytes per 32-bit lane. */
static inline __m512i dot_dpbusd(__m512i acc, __m512i u, __m512i s)
{
	__asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
	return acc;
}

/* The same with s the 4 signed bytes at p in every lane (an embedded broadcast: no
 * separate broadcast instruction). */
static inline __m512i dot_dpbusd_bcast(__m512i acc, __m512i u, const int8_t *p)
{
	__asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)p));
	return acc;
}

/* acc += w.even * x.even + w.odd * x.odd per 32-bit lane, bf16 pairs, x the pair at p in
 * every lane. */
static inline __m512 dot_dpbf16_bcast(__m512 acc, __m512i w, const uint16_t *p)
{
	__asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)p));
	return acc;
}

/* The bf16 pair at p in every lane, for a pair several dot_dpbf16 calls share. */
static inline __m512 dot_bcast_pair(const uint16_t *p)
{
	int32_t v;

	__builtin_memcpy(&v, p, 4);
	return _mm512_castsi512_ps(_mm512_set1_epi32(v));
}

/* The same with x a register (a pair already broadcast, shared by several blocks). */
static inline __m512 dot_dpbf16(__m512 acc, __m512i w, __m512 x)
{
	__asm__("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x));
	return acc;
}

#endif
