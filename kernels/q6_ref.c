/* Scalar reference of the int6-weight matmul (kernels/q6.h), spelled out so the SIMD
 * variants can match its W6A8 results bit for bit. */
#include "kernels/q6.h"

#include <math.h>

void q6_matmul_ref(const struct q6_matrix *w, const struct q4_acts *a, float *y, size_t ldy,
		   size_t row_begin, size_t row_end)
{
	for (size_t r = row_begin; r < row_end; r++) {
		for (size_t t = 0; t < a->n_tok; t++) {
			float acc = 0.0f;

			for (size_t g = 0; g < w->n_groups; g++) {
				float d = q6_scale_d(w, r, g);
				size_t k0 = g * Q6_GROUP;

				if (a->kind == Q4_ACT_A8) {
					const int8_t *q = (const int8_t *)a->codes + t * a->cols;
					int32_t dot = 0;

					for (size_t k = k0; k < k0 + Q6_GROUP; k++)
						dot += q6_code(w, r, k) * q[k];
					acc = fmaf((float)dot, d * a->scale[t * a->n_groups + g], acc);
				} else {
					const uint16_t *x = (const uint16_t *)a->codes + t * a->cols;
					float dot = 0.0f;

					for (size_t k = k0; k < k0 + Q6_GROUP; k++)
						dot += (float)q6_code(w, r, k) * quant_bf16_to_f32(x[q4_a16_index(k)]);
					acc = fmaf(d, dot, acc);
				}
			}
			y[t * ldy + r] = acc;
		}
	}
}
