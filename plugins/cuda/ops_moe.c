/* ops_moe.c: the CUDA plugin's mixture-of-experts ops (ABI 2.14). The host checked shapes, groups
 * and pointers (core/host/devcheck.c); what is left here are the grid's limits. Nothing is read
 * back: expert indices and offsets stay on the GPU, and kernels skip (or clamp) values out of range
 * instead of refusing them, so every op can be captured in a graph. */
#include "cuda_device.h"

#include <stdint.h>

/* Enters the device; launch errors become "op: kernel launch: ..." */
#define MOE_LAUNCH(op, call)                                                                                           \
    do {                                                                                                               \
        ct_status st_ = cuda_enter(d, op);                                                                             \
        if (st_ != CT_OK)                                                                                              \
            return st_;                                                                                                \
        cudaError_t e_ = (call);                                                                                       \
        return e_ == cudaSuccess ? CT_OK : cuda_error(d, op, "kernel launch", e_);                                     \
    } while (0)

/* The grids' second and third dimensions hold at most 65535 blocks. */
static ct_status moe_grid_limit(cuda_device *d, const char *op, int64_t tiles, const char *what)
{
    if (tiles > 65535)
        return cuda_fail(d, CT_ERR_UNSUPPORTED, op, "%s needs %lld tiles of 16 columns, past the grid's 65535", what,
                         (long long)tiles);
    return CT_OK;
}

ct_status cuda_moe_scores_forward(ct_device *dev, float *scores, const float *logits, int64_t n, int64_t e, int func)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    MOE_LAUNCH("moe_scores_forward", cuk_moe_scores(&d->env, scores, NULL, logits, n, e, func == CT_MOE_SIGMOID, 0));
}

ct_status cuda_moe_scores_backward(ct_device *dev, float *dlogits, const float *dscores, const float *scores,
                                   int64_t n, int64_t e, int func)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    MOE_LAUNCH("moe_scores_backward",
               cuk_moe_scores(&d->env, dlogits, dscores, scores, n, e, func == CT_MOE_SIGMOID, 1));
}

ct_status cuda_moe_topk_forward(ct_device *dev, int32_t *idx, float *weights, const float *scores, const float *bias,
                                int64_t n, int64_t e, int64_t k, int64_t n_groups, int64_t topk_groups, int normalize,
                                float route_scale)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    MOE_LAUNCH("moe_topk_forward", cuk_moe_topk(&d->env, idx, weights, scores, bias, n, e, k, n_groups, topk_groups,
                                                normalize, route_scale));
}

ct_status cuda_moe_topk_backward(ct_device *dev, float *dscores, const float *dweights, const float *scores,
                                 const int32_t *idx, int64_t n, int64_t e, int64_t k, int normalize, float route_scale)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    MOE_LAUNCH("moe_topk_backward",
               cuk_moe_topk_backward(&d->env, dscores, dweights, scores, idx, n, e, k, normalize, route_scale));
}

ct_status cuda_moe_permute(ct_device *dev, int32_t *order, int32_t *inv, int32_t *offsets, const int32_t *idx,
                           int64_t nk, int64_t e)
{
    cuda_device *d = dev;
    MOE_LAUNCH("moe_permute", cuk_moe_permute(&d->env, order, inv, offsets, idx, nk, e));
}

ct_status cuda_moe_gather_forward(ct_device *dev, float *out, const float *x, const int32_t *order, int64_t n,
                                  int64_t k, int64_t d_)
{
    cuda_device *d = dev;
    if (n == 0 || d_ == 0)
        return CT_OK;
    MOE_LAUNCH("moe_gather_forward", cuk_moe_gather(&d->env, out, x, order, n, k, d_, 0));
}

ct_status cuda_moe_gather_backward(ct_device *dev, float *dx, const float *dout, const int32_t *inv, int64_t n,
                                   int64_t k, int64_t d_)
{
    cuda_device *d = dev;
    if (n == 0 || d_ == 0)
        return CT_OK;
    MOE_LAUNCH("moe_gather_backward", cuk_moe_gather(&d->env, dx, dout, inv, n, k, d_, 1));
}

/* which: 0 forward, 1 backward_input, 2 backward_weight (cuk_grouped_matmul) */
static ct_status grouped(cuda_device *d, const char *op, int which, float *out, const float *a, const float *b,
                         const int32_t *offsets, int64_t m, int64_t e, int64_t o, int64_t i)
{
    if (m == 0 || o == 0 || (which != 0 && i == 0))
        return CT_OK;
    ct_status st = which == 1 ? moe_grid_limit(d, op, (i + 15) / 16, "i") : moe_grid_limit(d, op, (o + 15) / 16, "o");
    if (st == CT_OK && which == 2 && e > 65535)
        st = cuda_fail(d, CT_ERR_UNSUPPORTED, op, "%lld experts, past the grid's 65535", (long long)e);
    if (st != CT_OK)
        return st;
    MOE_LAUNCH(op, cuk_grouped_matmul(&d->env, which, out, a, b, offsets, m, e, o, i));
}

ct_status cuda_grouped_matmul_forward(ct_device *dev, float *y, const float *x, const float *w, const int32_t *offsets,
                                      int64_t m, int64_t e, int64_t o, int64_t i)
{
    return grouped(dev, "grouped_matmul_forward", 0, y, x, w, offsets, m, e, o, i);
}

ct_status cuda_grouped_matmul_backward_input(ct_device *dev, float *dx, const float *dy, const float *w,
                                             const int32_t *offsets, int64_t m, int64_t e, int64_t o, int64_t i)
{
    return grouped(dev, "grouped_matmul_backward_input", 1, dx, dy, w, offsets, m, e, o, i);
}

ct_status cuda_grouped_matmul_backward_weight(ct_device *dev, float *dw, const float *dy, const float *x,
                                              const int32_t *offsets, int64_t m, int64_t e, int64_t o, int64_t i)
{
    return grouped(dev, "grouped_matmul_backward_weight", 2, dw, dy, x, offsets, m, e, o, i);
}

ct_status cuda_moe_combine_forward(ct_device *dev, float *out, const float *y, const float *weights,
                                   const int32_t *inv, int64_t n, int64_t k, int64_t d_)
{
    cuda_device *d = dev;
    if (n == 0 || d_ == 0)
        return CT_OK;
    MOE_LAUNCH("moe_combine_forward", cuk_moe_combine(&d->env, out, y, weights, inv, n, k, d_));
}

ct_status cuda_moe_combine_backward(ct_device *dev, float *dy, float *dweights, const float *dout, const float *y,
                                    const float *weights, const int32_t *inv, int64_t n, int64_t k, int64_t d_)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    MOE_LAUNCH("moe_combine_backward", cuk_moe_combine_backward(&d->env, dy, dweights, dout, y, weights, inv, n, k, d_));
}
