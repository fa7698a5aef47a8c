/* The per-ISA kernel tables and the start-up choice between them. cpuid is read once per
 * process (in a VM each cpuid is a trap to the hypervisor, so never on a hot path). */
#include "kernels/dispatch.h"

#include <pthread.h>
#include <string.h>

#include "kernels/cpu.h"

static const struct kern_table table_ref = {
	.isa = KERN_REF, .name = "ref",
	.acts_prepare = q4_acts_prepare_ref, .matmul = q4_matmul_ref,
	.q6_matmul = q6_matmul_ref, .q8_matmul = q8_matmul_ref,
	.rmsnorm = vec_rmsnorm_ref, .rope = vec_rope_ref, .silu_mul = vec_silu_mul_ref,
	.gelu_mul = vec_gelu_mul_ref,
	.attn = vec_attn_ref, .to_kv = vec_to_kv_ref, .argmax = vec_argmax_ref,
	.sum_u64 = vec_sum_u64_ref, .cov_rows = vec_cov_rows_ref,
	.gptq = &vec_gptq_ref, .search = &q4_search_ref,
};

static const struct kern_table table_avx2 = {
	.isa = KERN_AVX2, .name = "avx2",
	.acts_prepare = q4_acts_prepare_avx2, .matmul = q4_matmul_avx2,
	.q6_matmul = q6_matmul_avx2, .q8_matmul = q8_matmul_avx2,
	.rmsnorm = vec_rmsnorm_avx2, .rope = vec_rope_avx2, .silu_mul = vec_silu_mul_avx2,
	.gelu_mul = vec_gelu_mul_avx2,
	.attn = vec_attn_avx2, .to_kv = vec_to_kv_avx2, .argmax = vec_argmax_avx2,
	.sum_u64 = vec_sum_u64_avx2, .cov_rows = vec_cov_rows_avx2,
	.gptq = &vec_gptq_avx2, .search = &q4_search_avx2,
};

static const struct kern_table table_avx512 = {
	.isa = KERN_AVX512, .name = "avx512",
	.acts_prepare = q4_acts_prepare_avx512, .matmul = q4_matmul_avx512,
	.q6_matmul = q6_matmul_avx512, .q8_matmul = q8_matmul_avx512,
	.rmsnorm = vec_rmsnorm_avx512, .rope = vec_rope_avx512, .silu_mul = vec_silu_mul_avx512,
	.gelu_mul = vec_gelu_mul_avx512,
	.attn = vec_attn_avx512, .to_kv = vec_to_kv_avx512, .argmax = vec_argmax_avx512,
	.sum_u64 = vec_sum_u64_avx512, .cov_rows = vec_cov_rows_avx512,
	.gptq = &vec_gptq_avx512, .search = &q4_search_avx512,
};

static const struct kern_table *active;
static struct cpu_features features;
static pthread_once_t features_once = PTHREAD_ONCE_INIT;

static void features_read(void)
{
	cpu_detect(&features);
}

const struct kern_table *kern_table_for(enum kern_isa isa)
{
	pthread_once(&features_once, features_read);
	switch (isa) {
	case KERN_REF:
		return &table_ref;
	case KERN_AVX2:
		return cpu_has_avx2_set(&features) ? &table_avx2 : NULL;
	case KERN_AVX512:
		return cpu_has_avx512_set(&features) ? &table_avx512 : NULL;
	}
	return NULL;
}

const struct kern_table *kern_best(void)
{
	const struct kern_table *t = kern_table_for(KERN_AVX512);

	if (t == NULL)
		t = kern_table_for(KERN_AVX2);
	return t ? t : &table_ref;
}

int kern_select(const char *name)
{
	static const struct { const char *name; enum kern_isa isa; } names[] = {
		{ "ref", KERN_REF }, { "avx2", KERN_AVX2 }, { "avx512", KERN_AVX512 },
	};

	if (name == NULL || name[0] == '\0' || strcmp(name, "auto") == 0) {
		active = kern_best();
		return 0;
	}
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (strcmp(name, names[i].name) != 0)
			continue;
		const struct kern_table *t = kern_table_for(names[i].isa);

		if (t == NULL)
			return HEARTH_EUNSUPPORTED;
		active = t;
		return 0;
	}
	return HEARTH_EINVAL;
}

const struct kern_table *kern_active(void)
{
	return active ? active : kern_best();
}
