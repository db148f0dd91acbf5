/* kernels_elementwise.cu: validation, vector algebra, sums, RoPE, activations, AdamW, bf16 and
 * fp8 casts, transpose.
 *
 * Elementwise kernels are grid-stride loops (int64 indices: a tensor may pass 2^31 elements).
 * The numerics follow the CPU plugin's kernels (plugins/cpu/kernels_impl.h, cpu_math.h) formula
 * by formula; the bf16 and fp8 encoders are the CPU's bit-level code, so casts give the same
 * bits on both devices. Sums run in double over a fixed number of blocks chosen from n alone.
 */
#include "kernels_common.cuh"

/* ---------------------------------------------------------------- validation */

static __global__ void set_u64_k(unsigned long long *p, unsigned long long v)
{
    *p = v;
}

/* atomicMin over integers: the smallest bad index wins whatever the order. */
static __global__ void find_bad_id_k(unsigned long long *bad, const int32_t *ids, int64_t n, int64_t limit,
                                     int use_skip, int32_t skip)
{
    CUK_FOR(i, n) {
        int32_t id = ids[i];
        if (use_skip && id == skip)
            continue;
        if (id < 0 || (int64_t)id >= limit)
            atomicMin(bad, (unsigned long long)i);
    }
}

extern "C" cudaError_t cuk_find_bad_id(const cuk_env *e, unsigned long long *bad, const int32_t *ids,
                                       int64_t n, int64_t limit, int use_skip, int32_t skip)
{
    set_u64_k<<<1, 1, 0, e->stream>>>(bad, (unsigned long long)n);
    if (n > 0)
        find_bad_id_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(bad, ids, n, limit,
                                                                                  use_skip, skip);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- dense algebra */

/* x[i] = base + step * (i % period): deterministic test data (the peak-FLOP/s measurement). */
static __global__ void fill_k(float *x, int64_t n, float base, float step, int period)
{
    CUK_FOR(i, n) x[i] = base + step * (float)(i % period);
}

extern "C" cudaError_t cuk_fill(const cuk_env *e, float *x, int64_t n, float base, float step, int period)
{
    fill_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(x, n, base, step,
                                                                        period > 0 ? period : 1);
    return cudaGetLastError();
}

static __global__ void axpy_k(float *y, const float *x, float alpha, int64_t n)
{
    CUK_FOR(i, n) y[i] += alpha * x[i];
}

extern "C" cudaError_t cuk_axpy(const cuk_env *e, float *y, const float *x, float alpha, int64_t n)
{
    axpy_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(y, x, alpha, n);
    return cudaGetLastError();
}

/* out may alias a or b: each element is read before it is written, by the same thread. */
static __global__ void add_k(float *out, const float *a, const float *b, int64_t n)
{
    CUK_FOR(i, n) out[i] = a[i] + b[i];
}

extern "C" cudaError_t cuk_add(const cuk_env *e, float *out, const float *a, const float *b, int64_t n)
{
    add_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(out, a, b, n);
    return cudaGetLastError();
}

static __global__ void scale_k(float *x, float alpha, int64_t n)
{
    CUK_FOR(i, n) x[i] *= alpha;
}

extern "C" cudaError_t cuk_scale(const cuk_env *e, float *x, float alpha, int64_t n)
{
    scale_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(x, alpha, n);
    return cudaGetLastError();
}

/* Blocks of the first pass of a sum; their partials are added in block order by the second. */
#define CUK_SUM_BLOCKS 1024

static __global__ void sum_partial_k(double *partial, const float *x, int64_t n, int squares)
{
    __shared__ double red[32];
    double s = 0;
    CUK_FOR(i, n) {
        double v = (double)x[i];
        s += squares ? v * v : v;
    }
    s = cuk_block_sum(s, red);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = s;
}

/* *out, or *out_f32 (the double rounded once) when out is NULL */
static __global__ void sum_final_k(double *out, float *out_f32, const double *partial, int np)
{
    __shared__ double red[32];
    double s = 0;
    for (int i = threadIdx.x; i < np; i += blockDim.x)
        s += partial[i];
    s = cuk_block_sum(s, red);
    if (threadIdx.x == 0) {
        if (out)
            *out = s;
        else
            *out_f32 = (float)s;
    }
}

/* The block count depends on n only (not on the GPU), so the bits do not depend on the SMs. */
extern "C" cudaError_t cuk_sum(const cuk_env *e, double *out, float *out_f32, const float *x, int64_t n,
                               int squares)
{
    int64_t blocks = (n + CUK_THREADS - 1) / CUK_THREADS;
    if (blocks > CUK_SUM_BLOCKS)
        blocks = CUK_SUM_BLOCKS;
    if (blocks < 1)
        blocks = 1;
    double *partial = (double *)cuda_scratch_get(e->dev, sizeof(double) * (size_t)blocks);
    if (!partial)
        return cudaErrorMemoryAllocation;
    sum_partial_k<<<(unsigned)blocks, CUK_THREADS, 0, e->stream>>>(partial, x, n, squares);
    sum_final_k<<<1, 1024, 0, e->stream>>>(out, out_f32, partial, (int)blocks);
    cudaError_t err = cudaGetLastError();
    cuda_scratch_put(e->dev, partial);
    return err;
}

/* ---------------------------------------------------------------- rope */

/* cs (t, d/2) = (cos, sin) of p * freq_i, p = pos[row] (the row when pos is NULL), freq_i the
 * model's table inv (ABI 2.4, device memory) or theta^(-2i/d) when inv is NULL, computed as the CPU
 * plugin does: the frequency and the angle in float, the cosine and sine of that float angle in
 * double. */
static __global__ void rope_table_k(float2 *cs, const int32_t *pos, const float *inv, int64_t t, int64_t half,
                                    int64_t d, float theta)
{
    CUK_FOR(idx, t * half) {
        int64_t p = idx / half, i = idx % half;
        float freq = inv ? inv[i] : 1.0f / powf(theta, (float)(2 * i) / (float)d);
        float angle = (float)(pos ? (int64_t)pos[p] : p) * freq;
        double sn, cn;
        sincos((double)angle, &sn, &cn);
        cs[idx] = make_float2((float)cn, (float)sn);
    }
}

/* Pair idx of x (b,t,h,d) is elements 2 idx and 2 idx + 1; its row (b t h) gives the position.
 * Forward out = R x (out may alias x); backward dx += R^T dout. */
static __global__ void rope_apply_k(float *out, const float *x, const float2 *cs, int64_t npairs,
                                    int64_t half, int64_t h, int64_t t, int backward)
{
    CUK_FOR(idx, npairs) {
        int64_t i = idx % half, row = idx / half;
        int64_t p = (row / h) % t;
        float2 c = cs[p * half + i];
        float x0 = x[2 * idx], x1 = x[2 * idx + 1];
        if (!backward) {
            out[2 * idx] = x0 * c.x - x1 * c.y;
            out[2 * idx + 1] = x0 * c.y + x1 * c.x;
        } else {
            out[2 * idx] += x0 * c.x + x1 * c.y;
            out[2 * idx + 1] += x1 * c.x - x0 * c.y;
        }
    }
}

extern "C" cudaError_t cuk_rope(const cuk_env *e, float *out, const float *x, const int32_t *pos,
                                const float *inv_freq, int64_t b, int64_t t, int64_t h, int64_t d, float theta,
                                int backward)
{
    int64_t half = d / 2, npairs = b * t * h * half;
    float2 *cs = (float2 *)cuda_scratch_get(e->dev, sizeof(float2) * (size_t)(t * half));
    if (!cs)
        return cudaErrorMemoryAllocation;
    rope_table_k<<<cuk_grid(e, t * half, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(cs, pos, inv_freq, t, half, d, theta);
    rope_apply_k<<<cuk_grid(e, npairs, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(out, x, cs, npairs, half,
                                                                                   h, t, backward);
    cudaError_t err = cudaGetLastError();
    cuda_scratch_put(e->dev, cs);
    return err;
}

/* ---------------------------------------------------------------- activations */

static __global__ void swiglu_forward_k(float *out, const float *a, const float *g, int64_t n)
{
    CUK_FOR(i, n) {
        float sig = 1.0f / (1.0f + expf(-a[i]));
        out[i] = a[i] * sig * g[i];
    }
}

/* da += dout g silu'(a);  dg += dout silu(a);  silu'(a) = sig (1 + a (1 - sig)) */
static __global__ void swiglu_backward_k(float *da, float *dg, const float *dout, const float *a,
                                         const float *g, int64_t n)
{
    CUK_FOR(i, n) {
        float ai = a[i], sig = 1.0f / (1.0f + expf(-ai));
        da[i] += dout[i] * g[i] * sig * (1.0f + ai * (1.0f - sig));
        dg[i] += dout[i] * ai * sig;
    }
}

extern "C" cudaError_t cuk_swiglu_forward(const cuk_env *e, float *out, const float *a, const float *g,
                                          int64_t n)
{
    swiglu_forward_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(out, a, g, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_swiglu_backward(const cuk_env *e, float *da, float *dg, const float *dout,
                                           const float *a, const float *g, int64_t n)
{
    swiglu_backward_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(da, dg, dout, a, g, n);
    return cudaGetLastError();
}

#define CUK_GELU_K0 0.7978845608028654f /* sqrt(2/pi) */
#define CUK_GELU_K1 0.044715f

static __global__ void gelu_forward_k(float *out, const float *x, int64_t n)
{
    CUK_FOR(i, n) {
        float xi = x[i], u = CUK_GELU_K0 * (xi + CUK_GELU_K1 * xi * xi * xi);
        out[i] = 0.5f * xi * (1.0f + tanhf(u));
    }
}

static __global__ void gelu_backward_k(float *dx, const float *dout, const float *x, int64_t n)
{
    CUK_FOR(i, n) {
        float xi = x[i], u = CUK_GELU_K0 * (xi + CUK_GELU_K1 * xi * xi * xi);
        float th = tanhf(u), du = CUK_GELU_K0 * (1.0f + 3.0f * CUK_GELU_K1 * xi * xi);
        dx[i] += dout[i] * (0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * du);
    }
}

extern "C" cudaError_t cuk_gelu_forward(const cuk_env *e, float *out, const float *x, int64_t n)
{
    gelu_forward_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(out, x, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_gelu_backward(const cuk_env *e, float *dx, const float *dout, const float *x,
                                         int64_t n)
{
    gelu_backward_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(dx, dout, x, n);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- optimizer */

/* PyTorch's AdamW as the CPU plugin arranges it: p *= 1 - lr wd; m, v updated;
 * p -= step_size m / (sqrt(v) / sqrt(bc2) + eps), step_size = lr / bc1. */
static __global__ void adamw_k(float *param, const float *grad, float *m, float *v, int64_t n, float beta1,
                               float beta2, float eps, float step_size, float bc2_sqrt, float decay)
{
    CUK_FOR(i, n) {
        float g = grad[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        param[i] = param[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    }
}

extern "C" cudaError_t cuk_adamw(const cuk_env *e, float *param, const float *grad, float *m, float *v,
                                 int64_t n, float beta1, float beta2, float eps, float step_size,
                                 float bc2_sqrt, float decay)
{
    adamw_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(param, grad, m, v, n, beta1, beta2,
                                                                         eps, step_size, bc2_sqrt, decay);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- bf16 */

/* Round to nearest even on the bits; a NaN keeps its sign and top payload and is made quiet. */
static __device__ __forceinline__ uint16_t f32_to_bf16(float x)
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u); /* ties to even; overflow carries into inf */
    return (uint16_t)(u >> 16);
}

static __device__ __forceinline__ float bf16_to_f32(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

/* AdamW with bf16 moments (ABI 2.10): adamw_k's arithmetic on the moments widened from mv's halves;
 * the step reads the f32 values, the moments are stored rounded to nearest even. */
static __global__ void adamw_bf16_moments_k(float *param, const float *grad, uint32_t *mv, int64_t n, float beta1,
                                            float beta2, float eps, float step_size, float bc2_sqrt, float decay)
{
    CUK_FOR(i, n) {
        float g = grad[i];
        uint32_t w = mv[i];
        float mi = beta1 * bf16_to_f32((uint16_t)(w & 0xFFFFu)) + (1.0f - beta1) * g;
        float vi = beta2 * bf16_to_f32((uint16_t)(w >> 16)) + (1.0f - beta2) * g * g;
        mv[i] = (uint32_t)f32_to_bf16(mi) | (uint32_t)f32_to_bf16(vi) << 16;
        param[i] = param[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    }
}

extern "C" cudaError_t cuk_adamw_bf16_moments(const cuk_env *e, float *param, const float *grad, uint32_t *mv,
                                              int64_t n, float beta1, float beta2, float eps, float step_size,
                                              float bc2_sqrt, float decay)
{
    adamw_bf16_moments_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(param, grad, mv, n, beta1, beta2,
                                                                                      eps, step_size, bc2_sqrt, decay);
    return cudaGetLastError();
}

static __global__ void cast_f32_to_bf16_k(uint16_t *dst, const float *src, int64_t n)
{
    CUK_FOR(i, n) dst[i] = f32_to_bf16(src[i]);
}

static __global__ void cast_bf16_to_f32_k(float *dst, const uint16_t *src, int64_t n)
{
    CUK_FOR(i, n) dst[i] = bf16_to_f32(src[i]);
}

static __global__ void round_bf16_k(float *x, int64_t n)
{
    CUK_FOR(i, n) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
}

extern "C" cudaError_t cuk_cast_f32_to_bf16(const cuk_env *e, uint16_t *dst, const float *src, int64_t n)
{
    cast_f32_to_bf16_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(dst, src, n);
    return cudaGetLastError();
}

static __global__ void reciprocal2_k(float *out, const float *a, const float *b)
{
    if (threadIdx.x == 0)
        out[0] = 1.0f / *a;
    else if (threadIdx.x == 1)
        out[1] = 1.0f / *b;
}

extern "C" cudaError_t cuk_reciprocal2(const cuk_env *e, float *out, const float *a, const float *b)
{
    reciprocal2_k<<<1, 32, 0, e->stream>>>(out, a, b);
    return cudaGetLastError();
}

static __global__ void reciprocal_k(float *out, const float *x, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = 1.0f / x[i];
}

extern "C" cudaError_t cuk_reciprocal(const cuk_env *e, float *out, const float *x, int64_t n)
{
    reciprocal_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(out, x, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_cast_bf16_to_f32(const cuk_env *e, float *dst, const uint16_t *src, int64_t n)
{
    cast_bf16_to_f32_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(dst, src, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_round_bf16(const cuk_env *e, float *x, int64_t n)
{
    round_bf16_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(x, n);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- fp8 */

#define CUK_E4M3_MAX 448.0f
#define CUK_E5M2_MAX 57344.0f

/* cpu_f32_to_f8 of plugins/cpu/cpu_math.h, bit for bit: saturating round to nearest even with
 * `mbits` mantissa bits and exponent bias `bias`; NaN becomes S.1111111. The subnormal branch
 * lets the FPU round (adding 2^k whose ulp is the fp8 subnormal step): this file is compiled
 * without flush-to-zero (no --use_fast_math), as that branch needs. */
static __device__ __forceinline__ uint8_t f32_to_f8(float x, int mbits, int bias, float maxv)
{
    uint32_t u = __float_as_uint(x), sign = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu;
    float ax = __uint_as_float(a);
    ax = ax < maxv ? ax : maxv; /* saturate (inf included); NaN is replaced below */
    uint32_t c = __float_as_uint(ax);
    int shift = 23 - mbits;
    uint32_t magic = (uint32_t)(127 + 24 - bias - mbits) << 23;
    uint32_t sub = __float_as_uint(__fadd_rn(ax, __uint_as_float(magic))) - magic;
    uint32_t nrm =
        (c - ((uint32_t)(127 - bias) << 23) + ((1u << (shift - 1)) - 1u) + ((c >> shift) & 1u)) >> shift;
    uint32_t r = c < (uint32_t)(128 - bias) << 23 ? sub : nrm;
    r = a > 0x7F800000u ? 0x7Fu : r;
    return (uint8_t)(sign | r);
}

/* cpu_f8_to_f32: exact. `ieee`: the top exponent holds inf and NaN (e5m2); else only S.1111.111
 * is NaN (e4m3). */
static __device__ __forceinline__ float f8_to_f32(uint8_t b, int mbits, int bias, int ieee)
{
    uint32_t sign = (uint32_t)(b & 0x80u) << 24, ex = (uint32_t)(b & 0x7Fu) >> mbits,
             m = b & ((1u << mbits) - 1u), emax = (1u << (7 - mbits)) - 1u;
    uint32_t bits;
    if (ex == 0)
        bits = __float_as_uint((float)m * __uint_as_float((uint32_t)(128 - bias - mbits) << 23));
    else if (ieee && ex == emax)
        bits = m ? 0x7FC00000u : 0x7F800000u;
    else if (!ieee && ex == emax && m == (1u << mbits) - 1u)
        bits = 0x7FC00000u;
    else
        bits = (ex + 127u - (uint32_t)bias) << 23 | m << (23 - mbits);
    return __uint_as_float(sign | bits);
}

/* Groups up to this size get one thread each; larger ones are split into chunks of this size,
 * one block per chunk, combined with an integer atomicMax (exact in any order). */
#define CUK_AMAX_CHUNK 8192

static __global__ void amax_small_k(float *amax, const float *src, int64_t ngroups, int64_t group)
{
    CUK_FOR(g, ngroups) {
        unsigned m = 0;
        for (int64_t i = g * group; i < (g + 1) * group; i++)
            m = max(m, __float_as_uint(src[i]) & 0x7FFFFFFFu);
        amax[g] = m > 0x7F800000u ? __uint_as_float(0x7FC00000u) : __uint_as_float(m);
    }
}

static __global__ void amax_chunks_k(unsigned *bits, const float *src, int64_t group, int64_t per_group,
                                     int64_t nchunks)
{
    __shared__ unsigned red[32];
    for (int64_t ch = blockIdx.x; ch < nchunks; ch += gridDim.x) {
        int64_t g = ch / per_group;
        int64_t i0 = g * group + (ch % per_group) * CUK_AMAX_CHUNK, end = (g + 1) * group;
        int64_t i1 = end - i0 < CUK_AMAX_CHUNK ? end : i0 + CUK_AMAX_CHUNK;
        unsigned m = 0;
        for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x)
            m = max(m, __float_as_uint(src[i]) & 0x7FFFFFFFu);
        m = cuk_block_max_u32(m, red);
        if (threadIdx.x == 0)
            atomicMax(&bits[g], m);
    }
}

/* |x| bits above inf's are a NaN: the group's amax is NaN. */
static __global__ void amax_finish_k(float *amax, const unsigned *bits, int64_t ngroups)
{
    CUK_FOR(g, ngroups) {
        unsigned m = bits[g];
        amax[g] = m > 0x7F800000u ? __uint_as_float(0x7FC00000u) : __uint_as_float(m);
    }
}

extern "C" cudaError_t cuk_amax(const cuk_env *e, float *amax, const float *src, int64_t n, int64_t group)
{
    int64_t ngroups = n / group;
    if (group <= 1024) {
        amax_small_k<<<cuk_grid(e, ngroups, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(amax, src, ngroups,
                                                                                        group);
        return cudaGetLastError();
    }
    unsigned *bits = (unsigned *)cuda_scratch_get(e->dev, sizeof(unsigned) * (size_t)ngroups);
    if (!bits)
        return cudaErrorMemoryAllocation;
    int64_t per_group = (group + CUK_AMAX_CHUNK - 1) / CUK_AMAX_CHUNK, nchunks = ngroups * per_group;
    int64_t blocks = nchunks < 65536 ? nchunks : 65536;
    cudaError_t err = cudaMemsetAsync(bits, 0, sizeof(unsigned) * (size_t)ngroups, e->stream);
    if (err == cudaSuccess) {
        amax_chunks_k<<<(unsigned)blocks, CUK_THREADS, 0, e->stream>>>(bits, src, group, per_group, nchunks);
        amax_finish_k<<<cuk_grid(e, ngroups, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(amax, bits, ngroups);
        err = cudaGetLastError();
    }
    cuda_scratch_put(e->dev, bits);
    return err;
}

static __global__ void quantize_fp8_k(uint8_t *dst, const float *src, const float *scale, int64_t n,
                                      int64_t group, int e5m2)
{
    CUK_FOR(i, n) {
        float y = src[i] * scale[i / group];
        dst[i] = e5m2 ? f32_to_f8(y, 2, 15, CUK_E5M2_MAX) : f32_to_f8(y, 3, 7, CUK_E4M3_MAX);
    }
}

static __global__ void dequantize_fp8_k(float *dst, const uint8_t *src, const float *scale, int64_t n,
                                        int64_t group, int e5m2)
{
    CUK_FOR(i, n) {
        float value = e5m2 ? f8_to_f32(src[i], 2, 15, 1) : f8_to_f32(src[i], 3, 7, 0);
        dst[i] = value / scale[i / group];
    }
}

extern "C" cudaError_t cuk_quantize_fp8(const cuk_env *e, uint8_t *dst, const float *src, const float *scale,
                                        int64_t n, int64_t group, int e5m2)
{
    quantize_fp8_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(dst, src, scale, n, group, e5m2);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_dequantize_fp8(const cuk_env *e, float *dst, const uint8_t *src, const float *scale,
                                          int64_t n, int64_t group, int e5m2)
{
    dequantize_fp8_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(dst, src, scale, n, group,
                                                                                  e5m2);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- transpose */

#define CUK_TILE 32

/* dst (cols, rows) = src (rows, cols) through a 32 x 33 shared tile (the pad column keeps the
 * transposed reads off one bank). Blocks are 32 x 8 threads; tiles loop over grid strides, so
 * any shape fits the grid limits. */
static __global__ void transpose_k(float *dst, const float *src, int64_t rows, int64_t cols)
{
    __shared__ float tile[CUK_TILE][CUK_TILE + 1];
    int64_t tiles_r = (rows + CUK_TILE - 1) / CUK_TILE, tiles_c = (cols + CUK_TILE - 1) / CUK_TILE;
    for (int64_t tr = blockIdx.y; tr < tiles_r; tr += gridDim.y)
        for (int64_t tc = blockIdx.x; tc < tiles_c; tc += gridDim.x) {
            int64_t r0 = tr * CUK_TILE, c0 = tc * CUK_TILE;
            for (int k = threadIdx.y; k < CUK_TILE; k += blockDim.y) {
                int64_t r = r0 + k, c = c0 + threadIdx.x;
                if (r < rows && c < cols)
                    tile[k][threadIdx.x] = src[r * cols + c];
            }
            __syncthreads();
            for (int k = threadIdx.y; k < CUK_TILE; k += blockDim.y) {
                int64_t c = c0 + k, r = r0 + threadIdx.x; /* dst row c, column r */
                if (r < rows && c < cols)
                    dst[c * rows + r] = tile[threadIdx.x][k];
            }
            __syncthreads();
        }
}

extern "C" cudaError_t cuk_transpose(const cuk_env *e, float *dst, const float *src, int64_t rows, int64_t cols)
{
    int64_t tiles_r = (rows + CUK_TILE - 1) / CUK_TILE, tiles_c = (cols + CUK_TILE - 1) / CUK_TILE;
    dim3 grid((unsigned)(tiles_c < 65535 ? tiles_c : 65535), (unsigned)(tiles_r < 65535 ? tiles_r : 65535));
    transpose_k<<<grid, dim3(CUK_TILE, 8), 0, e->stream>>>(dst, src, rows, cols);
    return cudaGetLastError();
}
