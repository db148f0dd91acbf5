/* moe.h: the CPU plugin's mixture-of-experts ops (ABI 2.14, moe.c) and the two device.c helpers
 * they use. Signatures and contracts are ctitan/device.h's; the host checked the shapes and
 * pointers (core/host/devcheck.c). */
#ifndef CTITAN_CPU_MOE_H
#define CTITAN_CPU_MOE_H

#include "ctitan/device.h"

/* device.c: sets the calling thread's OpenMP count to the device's */
void cpu_device_enter(const ct_device *d);
/* device.c: reports "op: message" through the device's host and returns `status` */
__attribute__((format(printf, 4, 5))) ct_status cpu_device_fail(const ct_device *d, ct_status status,
                                                                 const char *op, const char *fmt, ...);

ct_status cpu_moe_scores_forward(ct_device *dev, float *scores, const float *logits, int64_t n, int64_t e, int func);
ct_status cpu_moe_scores_backward(ct_device *dev, float *dlogits, const float *dscores, const float *scores,
                                  int64_t n, int64_t e, int func);
ct_status cpu_moe_topk_forward(ct_device *dev, int32_t *idx, float *weights, const float *scores, const float *bias,
                               int64_t n, int64_t e, int64_t k, int64_t n_groups, int64_t topk_groups,
                               int normalize, float route_scale);
ct_status cpu_moe_topk_backward(ct_device *dev, float *dscores, const float *dweights, const float *scores,
                                const int32_t *idx, int64_t n, int64_t e, int64_t k, int normalize,
                                float route_scale);
ct_status cpu_moe_permute(ct_device *dev, int32_t *order, int32_t *inv, int32_t *offsets, const int32_t *idx,
                          int64_t nk, int64_t e);
ct_status cpu_moe_gather_forward(ct_device *dev, float *out, const float *x, const int32_t *order, int64_t n,
                                 int64_t k, int64_t d);
ct_status cpu_moe_gather_backward(ct_device *dev, float *dx, const float *dout, const int32_t *inv, int64_t n,
                                  int64_t k, int64_t d);
ct_status cpu_grouped_matmul_forward(ct_device *dev, float *y, const float *x, const float *w,
                                     const int32_t *offsets, int64_t m, int64_t e, int64_t o, int64_t i);
ct_status cpu_grouped_matmul_backward_input(ct_device *dev, float *dx, const float *dy, const float *w,
                                            const int32_t *offsets, int64_t m, int64_t e, int64_t o, int64_t i);
ct_status cpu_grouped_matmul_backward_weight(ct_device *dev, float *dw, const float *dy, const float *x,
                                             const int32_t *offsets, int64_t m, int64_t e, int64_t o, int64_t i);
ct_status cpu_moe_combine_forward(ct_device *dev, float *out, const float *y, const float *weights,
                                  const int32_t *inv, int64_t n, int64_t k, int64_t d);
ct_status cpu_moe_combine_backward(ct_device *dev, float *dy, float *dweights, const float *dout, const float *y,
                                   const float *weights, const int32_t *inv, int64_t n, int64_t k, int64_t d);

#endif
