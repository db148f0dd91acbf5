/* ops_ext.c: the CUDA plugin's optional ops: float8 (ABI 1.2: amax, quantize and dequantize
 * with group scales, transpose) and tensor parallel (ABI 1.3: a vocabulary shard's cross-entropy
 * stats, copy_2d; the shard's embedding and backward are ops.c's 2.23 general ops). The host checked their arguments (core/host/devcheck.c); what is
 * left here are the GPU's limits.
 */
#include "cuda_device.h"

#include <stdint.h>

/* ---------------------------------------------------------------- float8 (ABI 1.2) */

ct_status cuda_amax(ct_device *dev, float *amax, const float *src, int64_t n, int64_t group)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "amax");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_amax(&d->env, amax, src, n, group);
    if (e != cudaSuccess)
        return cuda_error(d, "amax", "kernel launch", e);
    return CT_OK;
}

/* Scales are not checked (they may come from a device-side amax), as on the CPU. */
ct_status cuda_quantize_fp8(ct_device *dev, uint8_t *dst, const float *src, const float *scale, int64_t n,
                            int64_t group, ct_dtype fmt)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "quantize_fp8");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_quantize_fp8(&d->env, dst, src, scale, n, group, fmt == CT_F8_E5M2);
    if (e != cudaSuccess)
        return cuda_error(d, "quantize_fp8", "kernel launch", e);
    return CT_OK;
}

ct_status cuda_dequantize_fp8(ct_device *dev, float *dst, const uint8_t *src, const float *scale, int64_t n,
                              int64_t group, ct_dtype fmt)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "dequantize_fp8");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_dequantize_fp8(&d->env, dst, src, scale, n, group, fmt == CT_F8_E5M2);
    if (e != cudaSuccess)
        return cuda_error(d, "dequantize_fp8", "kernel launch", e);
    return CT_OK;
}

/* Not in place: dst and src must not overlap. */
ct_status cuda_transpose(ct_device *dev, float *dst, const float *src, int64_t rows, int64_t cols)
{
    cuda_device *d = dev;
    if (rows == 0 || cols == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "transpose");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_transpose(&d->env, dst, src, rows, cols);
    if (e != cudaSuccess)
        return cuda_error(d, "transpose", "kernel launch", e);
    return CT_OK;
}

/* ---------------------------------------------------------------- tensor parallel (ABI 1.3) */

/* Targets are not checked: an id outside this shard's columns is simply not here. */
ct_status cuda_cross_entropy_stats(ct_device *dev, float *stats, const float *logits, const int32_t *targets,
                                   int64_t n, int64_t v, int64_t begin, int32_t ignore_index)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    if (n > INT32_MAX)
        return cuda_fail(d, CT_ERR_UNSUPPORTED, "cross_entropy_stats",
                         "%lld rows exceed the CUDA grid (2^31 - 1 blocks)", (long long)n);
    ct_status st = cuda_enter(d, "cross_entropy_stats");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_cross_entropy_stats(&d->env, stats, logits, targets, n, v, begin, ignore_index);
    if (e != cudaSuccess)
        return cuda_error(d, "cross_entropy_stats", "kernel launch", e);
    return CT_OK;
}

/* dst[r * dst_stride + j] = src[r * src_stride + j]: one 2D copy on the stream. Overlapping spans
 * go through a scratch block, so the result is src as it was before the call (which is what the
 * CPU plugin's memmove gives for the overlaps it defines: whole rows moved within one buffer). */
ct_status cuda_copy_2d(ct_device *dev, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                       int64_t rows, int64_t cols)
{
    cuda_device *d = dev;
    if (rows == 0 || cols == 0)
        return CT_OK;
    int64_t stride = dst_stride > src_stride ? dst_stride : src_stride;
    if (stride > INT32_MAX / (int64_t)sizeof(float))
        return cuda_fail(d, CT_ERR_UNSUPPORTED, "copy_2d", "stride %lld floats exceeds cudaMemcpy2D's pitch limit",
                         (long long)stride);
    ct_status st = cuda_enter(d, "copy_2d");
    if (st != CT_OK)
        return st;
    size_t width = sizeof(float) * (size_t)cols, dpitch = sizeof(float) * (size_t)dst_stride,
           spitch = sizeof(float) * (size_t)src_stride;
    uintptr_t d0 = (uintptr_t)dst, s0 = (uintptr_t)src;
    uintptr_t d1 = d0 + (uintptr_t)((rows - 1) * dst_stride + cols) * sizeof(float);
    uintptr_t s1 = s0 + (uintptr_t)((rows - 1) * src_stride + cols) * sizeof(float);
    cudaError_t e;
    if (!(d0 < s1 && s0 < d1)) {
        e = cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, (size_t)rows, cudaMemcpyDeviceToDevice, d->stream);
        return e == cudaSuccess ? CT_OK : cuda_error(d, "copy_2d", "cudaMemcpy2DAsync", e);
    }
    void *tmp = cuda_scratch_get(d, width * (size_t)rows);
    if (!tmp)
        return cuda_fail(d, CT_ERR_NOMEM, "copy_2d", "cannot allocate %zu bytes of scratch for an overlapping copy",
                         width * (size_t)rows);
    e = cudaMemcpy2DAsync(tmp, width, src, spitch, width, (size_t)rows, cudaMemcpyDeviceToDevice, d->stream);
    if (e == cudaSuccess)
        e = cudaMemcpy2DAsync(dst, dpitch, tmp, width, width, (size_t)rows, cudaMemcpyDeviceToDevice, d->stream);
    cuda_scratch_put(d, tmp);
    return e == cudaSuccess ? CT_OK : cuda_error(d, "copy_2d", "cudaMemcpy2DAsync (overlapping spans)", e);
}
