/* Scalar reference of the q4 kernels: activation preparation and the W4A16 / W4A8
 * matmul, written to be read, not to be fast. The AVX2 and AVX-512 files are tested
 * against it; W4A8 must match it bit for bit, so its float steps are spelled out. */
#include "kernels/q4.h"

#include <math.h>

void q4_acts_prepare_ref(struct q4_acts *a, const float *x, size_t ldx, size_t tok_begin, size_t tok_end)
{
	for (size_t t = tok_begin; t < tok_end; t++) {
		const float *xt = x + t * ldx;

		for (size_t g = 0; g < a->n_groups; g++) {
			const float *xg = xt + g * a->group;
			size_t k0 = g * a->group;

			if (a->kind == Q4_ACT_A16) {
				uint16_t *dst = (uint16_t *)a->codes + t * a->cols;
				float sum = 0.0f;

				for (size_t i = 0; i < a->group; i++) {
					uint16_t h = quant_f32_to_bf16(xg[i]);

					dst[q4_a16_index(k0 + i)] = h;
					sum += quant_bf16_to_f32(h);
				}
				a->sum[t * a->n_groups + g] = sum;
			} else {
				int8_t *dst = (int8_t *)a->codes + t * a->cols + k0;
				float amax = 0.0f;
				int isum = 0;

				for (size_t i = 0; i < a->group; i++)
					amax = fmaxf(amax, fabsf(xg[i]));
				float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
				float scale = amax / 127.0f;

				for (size_t i = 0; i < a->group; i++) {
					int q = (int)nearbyintf(xg[i] * inv);

					dst[i] = (int8_t)q;
					isum += q;
				}
				a->scale[t * a->n_groups + g] = scale;
				a->sum[t * a->n_groups + g] = scale * (float)isum;
			}
		}
	}
}

void q4_matmul_ref(const struct q4_matrix *w, const struct q4_acts *a, float *y, size_t ldy,
		   size_t row_begin, size_t row_end)
{
	for (size_t r = row_begin; r < row_end; r++) {
		for (size_t t = 0; t < a->n_tok; t++) {
			float acc = 0.0f;

			for (size_t g = 0; g < w->n_groups; g++) {
				float d = q4_scale_d(w, r, g), m = q4_scale_m(w, r, g);
				float sum = a->sum[t * a->n_groups + g];
				size_t k0 = g * w->group;

				if (a->kind == Q4_ACT_A8) {
					const int8_t *q = (const int8_t *)a->codes + t * a->cols;
					int32_t dot = 0;

					for (size_t k = k0; k < k0 + w->group; k++)
						dot += (int32_t)q4_code(w, r, k) * q[k];
					acc = fmaf((float)dot, d * a->scale[t * a->n_groups + g], acc);
					acc = fmaf(m, sum, acc);
				} else {
					const uint16_t *x = (const uint16_t *)a->codes + t * a->cols;
					float dot = 0.0f;

					for (size_t k = k0; k < k0 + w->group; k++)
						dot += (float)q4_code(w, r, k) *
						       quant_bf16_to_f32(x[q4_a16_index(k)]);
					acc = fmaf(d, dot, acc);
					acc = fmaf(m, sum, acc);
				}
			}
			y[t * ldy + r] = acc;
		}
	}
}
