/* What the CPU (and the OS, through XSAVE state) lets the kernels use, read once from
 * cpuid/xgetbv. kernels/dispatch.c turns it into one kernel table; stats report it. */
#ifndef HEARTH_KERNELS_CPU_H
#define HEARTH_KERNELS_CPU_H

#include <stdbool.h>
#include <stddef.h>

struct cpu_features {
	bool avx2, fma, f16c;                   /* with OS support for ymm state */
	bool avx512f, avx512bw, avx512dq, avx512vl, avx512vnni, avx512bf16; /* with zmm state */
};

void cpu_detect(struct cpu_features *f);
/* The AVX2 kernels need AVX2+FMA+F16C; the AVX-512 ones F/BW/DQ/VL/VNNI/BF16 too. */
bool cpu_has_avx2_set(const struct cpu_features *f);
bool cpu_has_avx512_set(const struct cpu_features *f);
/* "avx2 fma f16c avx512f ..." into buf (always NUL-terminated); returns buf. */
const char *cpu_describe(const struct cpu_features *f, char *buf, size_t len);

#endif
