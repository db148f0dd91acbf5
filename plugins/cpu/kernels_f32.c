/* kernels_f32.c: the plugin's numerics, the f32 instance of kernels_impl.h. */
#include "kernels.h"

#define CT_REAL_DOUBLE 0
#include "kernels_impl.h"

/* AdamW with bf16 moments (ABI 2.10): adamw's arithmetic, in f32, on the moments widened from mv's
 * halves (m low, v high); the step reads the f32 values, the moments are stored rounded to nearest
 * even. */
void adamw_bf16_moments_f32(float *param, const float *grad, uint32_t *mv, int64_t n, float lr, float beta1,
                            float beta2, float eps, float weight_decay, int64_t step)
{
    double bc1 = 1.0 - pow((double)beta1, (double)step);
    double bc2 = 1.0 - pow((double)beta2, (double)step);
    float step_size = (float)((double)lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    float decay = 1 - lr * weight_decay;
#pragma omp parallel for schedule(static) if (n >= CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float g = grad[i];
        float mi = beta1 * cpu_bf16_to_f32((uint16_t)(mv[i] & 0xFFFFu)) + (1 - beta1) * g;
        float vi = beta2 * cpu_bf16_to_f32((uint16_t)(mv[i] >> 16)) + (1 - beta2) * g * g;
        mv[i] = (uint32_t)cpu_f32_to_bf16(mi) | (uint32_t)cpu_f32_to_bf16(vi) << 16;
        param[i] = param[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    }
}
