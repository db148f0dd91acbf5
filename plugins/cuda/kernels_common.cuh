/* kernels_common.cuh: what the CUDA plugin's kernel files share: grid sizes, grid-stride loops
 * and block reductions with a fixed summation order.
 *
 * Reductions: a warp reduces with an xor butterfly (every lane ends with the same bits, since
 * each step adds the same two values in either order), then every thread adds the warps'
 * partials in warp order. Nothing depends on timing, so results are bit-identical run to run.
 * Blocks must be a multiple of 32 threads, at most 1024.
 */
#ifndef CTITAN_CUDA_KERNELS_COMMON_CUH
#define CTITAN_CUDA_KERNELS_COMMON_CUH

#include "kernels.h"

#include <math.h>
#include <stdint.h>

/* Threads per block of the elementwise and row kernels. */
#define CUK_THREADS 256

/* Blocks for a grid-stride loop over n items: enough to fill the device (32 blocks per SM),
 * never more than the items need. */
static inline unsigned cuk_grid(const cuk_env *e, int64_t n, int threads)
{
    int64_t blocks = (n + threads - 1) / threads;
    int64_t cap = (int64_t)(e->sms > 0 ? e->sms : 132) * 32;
    if (blocks > cap)
        blocks = cap;
    return (unsigned)(blocks < 1 ? 1 : blocks);
}

/* for i in [0, n) over every thread of the grid */
#define CUK_FOR(i, n)                                                                              \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

/* True when cuk_find_bad_id found a bad id for an op of n items: its kernels do nothing. */
static __device__ __forceinline__ bool cuk_is_bad(const unsigned long long *bad, int64_t n)
{
    return bad && *bad < (unsigned long long)n;
}

template <typename T> static __device__ __forceinline__ T cuk_warp_sum(T v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float cuk_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ __forceinline__ unsigned cuk_warp_max_u32(unsigned v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The block's sum, returned to every thread. `red` holds at least 32 values; the call begins
 * with a barrier, so the same buffer may serve consecutive reductions. */
template <typename T> static __device__ __forceinline__ T cuk_block_sum(T v, T *red)
{
    v = cuk_warp_sum(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    T total = 0;
    for (int i = 0; i < nwarps; i++)
        total += red[i];
    return total;
}

static __device__ __forceinline__ float cuk_block_max(float v, float *red)
{
    v = cuk_warp_max(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    float m = red[0];
    for (int i = 1; i < nwarps; i++)
        m = fmaxf(m, red[i]);
    return m;
}

static __device__ __forceinline__ unsigned cuk_block_max_u32(unsigned v, unsigned *red)
{
    v = cuk_warp_max_u32(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    unsigned m = red[0];
    for (int i = 1; i < nwarps; i++)
        m = max(m, red[i]);
    return m;
}

#endif
