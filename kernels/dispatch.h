/* One table of kernel entry points per ISA (scalar reference, AVX2, AVX-512), chosen
 * once at start-up from cpuid or forced by name for tests and A/B runs. The chosen
 * table is the one piece of global state kernels/ keeps; it is written only by
 * kern_select, before any compute thread starts. */
#ifndef HEARTH_KERNELS_DISPATCH_H
#define HEARTH_KERNELS_DISPATCH_H

#include "kernels/q4.h"
#include "kernels/q6.h"
#include "kernels/q8.h"
#include "kernels/vec.h"

enum kern_isa { KERN_REF = 0, KERN_AVX2 = 1, KERN_AVX512 = 2 };

struct kern_table {
	enum kern_isa isa;
	const char *name;               /* "ref", "avx2", "avx512": what stats report */
	q4_acts_fn acts_prepare;
	q4_matmul_fn matmul;
	q6_matmul_fn q6_matmul;         /* int6 embedding/head matrices */
	q8_matmul_fn q8_matmul;         /* int8 embedding/head matrices */
	vec_rmsnorm_fn rmsnorm;
	vec_rope_fn rope;
	vec_silu_mul_fn silu_mul;
	vec_gelu_mul_fn gelu_mul;
	vec_attn_fn attn;
	vec_to_kv_fn to_kv;
	vec_argmax_fn argmax;
	vec_sum_u64_fn sum_u64;         /* the streaming-read probe */
	vec_cov_rows_fn cov_rows;       /* GPTQ's covariance sums (imatrix collection) */
	const struct vec_gptq *gptq;    /* GPTQ's corrections (the loader's rounding) */
	const struct q4_search *search; /* the int4 scale search's steps (the loader's packing) */
};

/* The table for isa, or NULL when this CPU cannot run it. Tests and A/B runs use this
 * to call every variant side by side without touching the selection. */
const struct kern_table *kern_table_for(enum kern_isa isa);

/* The best table this CPU can run. */
const struct kern_table *kern_best(void);

/* Selects the table the daemon uses: name NULL, "" or "auto" picks kern_best();
 * "ref", "avx2", "avx512" force one. Returns 0, HEARTH_EINVAL for an unknown name, HEARTH_EUNSUPPORTED
 * when the CPU lacks the forced ISA. Call once at start-up, before threads run. */
int kern_select(const char *name);

/* The selected table (kern_best() when kern_select was never called). */
const struct kern_table *kern_active(void);

#endif
