/* cpuid and xgetbv, read directly: a feature counts only when the OS also saves the
 * register state it needs (XCR0), which is what decides whether the kernels may run. */
#include "kernels/cpu.h"

#include <cpuid.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static uint64_t xgetbv0(void)
{
	uint32_t lo, hi;

	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return ((uint64_t)hi << 32) | lo;
}

void cpu_detect(struct cpu_features *f)
{
	unsigned a, b, c, d, max;
	bool ymm = false, zmm = false;

	memset(f, 0, sizeof(*f));
	max = __get_cpuid_max(0, NULL);
	if (max < 1 || !__get_cpuid(1, &a, &b, &c, &d))
		return;
	bool osxsave = c & bit_OSXSAVE, fma = c & bit_FMA, f16c = c & bit_F16C, avx = c & bit_AVX;

	if (osxsave && avx) {
		uint64_t xcr0 = xgetbv0();

		ymm = (xcr0 & 0x6) == 0x6;           /* SSE + AVX state */
		zmm = ymm && (xcr0 & 0xE0) == 0xE0;  /* opmask + both zmm halves */
	}
	if (!ymm || max < 7)
		return;
	__cpuid_count(7, 0, a, b, c, d);
	f->avx2 = b & bit_AVX2;
	f->fma = fma;
	f->f16c = f16c;
	if (zmm) {
		f->avx512f = b & bit_AVX512F;
		f->avx512bw = b & bit_AVX512BW;
		f->avx512dq = b & bit_AVX512DQ;
		f->avx512vl = b & bit_AVX512VL;
		f->avx512vnni = c & bit_AVX512VNNI;
		__cpuid_count(7, 1, a, b, c, d);
		f->avx512bf16 = a & bit_AVX512BF16;
	}
}

bool cpu_has_avx2_set(const struct cpu_features *f)
{
	return f->avx2 && f->fma && f->f16c;
}

bool cpu_has_avx512_set(const struct cpu_features *f)
{
	return cpu_has_avx2_set(f) && f->avx512f && f->avx512bw && f->avx512dq && f->avx512vl &&
	       f->avx512vnni && f->avx512bf16;
}

const char *cpu_describe(const struct cpu_features *f, char *buf, size_t len)
{
	static const struct { size_t off; const char *name; } names[] = {
		{ offsetof(struct cpu_features, avx2), "avx2" },
		{ offsetof(struct cpu_features, fma), "fma" },
		{ offsetof(struct cpu_features, f16c), "f16c" },
		{ offsetof(struct cpu_features, avx512f), "avx512f" },
		{ offsetof(struct cpu_features, avx512bw), "avx512bw" },
		{ offsetof(struct cpu_features, avx512dq), "avx512dq" },
		{ offsetof(struct cpu_features, avx512vl), "avx512vl" },
		{ offsetof(struct cpu_features, avx512vnni), "avx512vnni" },
		{ offsetof(struct cpu_features, avx512bf16), "avx512bf16" },
	};
	size_t used = 0;

	if (len == 0)
		return buf;
	buf[0] = '\0';
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (!*(const bool *)((const char *)f + names[i].off))
			continue;
		int n = snprintf(buf + used, len - used, "%s%s", used ? " " : "", names[i].name);

		if (n < 0 || (size_t)n >= len - used)
			break;
		used += (size_t)n;
	}
	return buf;
}
