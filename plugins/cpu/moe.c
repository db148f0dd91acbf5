/* moe.c: the CPU plugin's mixture-of-experts ops (ABI 2.14): the f32 instance of moe_impl.h and
 * the op entry points. Device memory is host memory here, so the plugin reads what a GPU could
 * not check without a round trip (grouped GEMM offsets) and refuses bad values with a message. */
#include "moe.h"

#include <stdint.h>

#include "kernels.h"

#define CT_REAL_DOUBLE 0
#include "moe_impl.h"

ct_status cpu_moe_scores_forward(ct_device *dev, float *scores, const float *logits, int64_t n, int64_t e, int func)
{
    if (n == 0 || e == 0)
        return CT_OK;
    cpu_device_enter(dev);
    moe_scores_forward_f32(scores, logits, n, e, func == CT_MOE_SIGMOID);
    return CT_OK;
}

ct_status cpu_moe_scores_backward(ct_device *dev, float *dlogits, const float *dscores, const float *scores,
                                  int64_t n, int64_t e, int func)
{
    if (n == 0 || e == 0)
        return CT_OK;
    cpu_device_enter(dev);
    moe_scores_backward_f32(dlogits, dscores, scores, n, e, func == CT_MOE_SIGMOID);
    return CT_OK;
}

ct_status cpu_moe_topk_forward(ct_device *dev, int32_t *idx, float *weights, const float *scores, const float *bias,
                               int64_t n, int64_t e, int64_t k, int64_t n_groups, int64_t topk_groups,
                               int normalize, float route_scale)
{
    if (n == 0)
        return CT_OK;
    cpu_device_enter(dev);
    if (moe_topk_forward_f32(idx, weights, scores, bias, n, e, k, n_groups, topk_groups, normalize,
                             route_scale) != 0)
        return cpu_device_fail(dev, CT_ERR_NOMEM, "moe_topk_forward", "cannot allocate the group scores");
    return CT_OK;
}

ct_status cpu_moe_topk_backward(ct_device *dev, float *dscores, const float *dweights, const float *scores,
                                const int32_t *idx, int64_t n, int64_t e, int64_t k, int normalize,
                                float route_scale)
{
    if (n == 0)
        return CT_OK;
    cpu_device_enter(dev);
    moe_topk_backward_f32(dscores, dweights, scores, idx, n, e, k, normalize, route_scale);
    return CT_OK;
}

/* A counting sort: count per expert (bucket e: indices out of range), prefix sums, then place each
 * pair in flat order, which keeps the sort stable. */
ct_status cpu_moe_permute(ct_device *dev, int32_t *order, int32_t *inv, int32_t *offsets, const int32_t *idx,
                          int64_t nk, int64_t e)
{
    int64_t *next = calloc((size_t)e + 2, sizeof *next);
    if (!next)
        return cpu_device_fail(dev, CT_ERR_NOMEM, "moe_permute", "cannot allocate %lld counters", (long long)e + 2);
    for (int64_t j = 0; j < nk; j++) {
        int64_t g = idx[j] >= 0 && idx[j] < e ? idx[j] : e;
        next[g + 1]++;
    }
    for (int64_t g = 0; g <= e; g++) {
        next[g + 1] += next[g];
        offsets[g] = (int32_t)next[g];
    }
    for (int64_t j = 0; j < nk; j++) {
        int64_t g = idx[j] >= 0 && idx[j] < e ? idx[j] : e;
        int64_t p = next[g]++;
        order[p] = (int32_t)j;
        inv[j] = (int32_t)p;
    }
    free(next);
    return CT_OK;
}

ct_status cpu_moe_gather_forward(ct_device *dev, float *out, const float *x, const int32_t *order, int64_t n,
                                 int64_t k, int64_t d)
{
    if (n == 0 || d == 0)
        return CT_OK;
    cpu_device_enter(dev);
    moe_gather_forward_f32(out, x, order, n, k, d);
    return CT_OK;
}

ct_status cpu_moe_gather_backward(ct_device *dev, float *dx, const float *dout, const int32_t *inv, int64_t n,
                                  int64_t k, int64_t d)
{
    if (n == 0 || d == 0)
        return CT_OK;
    cpu_device_enter(dev);
    moe_gather_backward_f32(dx, dout, inv, n, k, d);
    return CT_OK;
}

/* offsets must be non-decreasing from offsets[0] >= 0 to offsets[e] <= m */
static ct_status grouped_offsets(ct_device *dev, const char *op, const int32_t *offsets, int64_t m, int64_t e)
{
    if (offsets[0] < 0)
        return cpu_device_fail(dev, CT_ERR_INVALID, op, "offsets[0] is %d, expected >= 0", offsets[0]);
    for (int64_t g = 0; g < e; g++)
        if (offsets[g + 1] < offsets[g])
            return cpu_device_fail(dev, CT_ERR_INVALID, op, "offsets[%lld] = %d is below offsets[%lld] = %d",
                                   (long long)g + 1, offsets[g + 1], (long long)g, offsets[g]);
    if (offsets[e] > m)
        return cpu_device_fail(dev, CT_ERR_INVALID, op, "offsets[%lld] = %d is past the %lld rows", (long long)e,
                               offsets[e], (long long)m);
    return CT_OK;
}

static ct_status grouped(ct_device *dev, const char *op, int which, float *out, const float *a, const float *b,
                         const int32_t *offsets, int64_t m, int64_t e, int64_t o, int64_t i)
{
    if (e == 0 || o == 0 || (which != 0 && i == 0))
        return CT_OK;
    ct_status st = grouped_offsets(dev, op, offsets, m, e);
    if (st != CT_OK)
        return st;
    cpu_device_enter(dev);
    grouped_matmul_f32(which, out, a, b, offsets, e, o, i);
    return CT_OK;
}

ct_status cpu_grouped_matmul_forward(ct_device *dev, float *y, const float *x, const float *w,
                                     const int32_t *offsets, int64_t m, int64_t e, int64_t o, int64_t i)
{
    return grouped(dev, "grouped_matmul_forward", 0, y, x, w, offsets, m, e, o, i);
}

ct_status cpu_grouped_matmul_backward_input(ct_device *dev, float *dx, const float *dy, const float *w,
                                            const int32_t *offsets, int64_t m, int64_t e, int64_t o, int64_t i)
{
    return grouped(dev, "grouped_matmul_backward_input", 1, dx, dy, w, offsets, m, e, o, i);
}

ct_status cpu_grouped_matmul_backward_weight(ct_device *dev, float *dw, const float *dy, const float *x,
                                             const int32_t *offsets, int64_t m, int64_t e, int64_t o, int64_t i)
{
    return grouped(dev, "grouped_matmul_backward_weight", 2, dw, dy, x, offsets, m, e, o, i);
}

ct_status cpu_moe_combine_forward(ct_device *dev, float *out, const float *y, const float *weights,
                                  const int32_t *inv, int64_t n, int64_t k, int64_t d)
{
    if (n == 0 || d == 0)
        return CT_OK;
    cpu_device_enter(dev);
    moe_combine_forward_f32(out, y, weights, inv, n, k, d);
    return CT_OK;
}

ct_status cpu_moe_combine_backward(ct_device *dev, float *dy, float *dweights, const float *dout, const float *y,
                                   const float *weights, const int32_t *inv, int64_t n, int64_t k, int64_t d)
{
    if (n == 0)
        return CT_OK;
    cpu_device_enter(dev);
    moe_combine_backward_f32(dy, dweights, dout, y, weights, inv, n, k, d);
    return CT_OK;
}
