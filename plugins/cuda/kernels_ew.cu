/* kernels_ew.cu: the elementwise ops of ABI 2.1 (device.h's ew_*), the building blocks of
 * optimizers written outside the device plugins.
 *
 * Each is a grid-stride loop computing device.h's f32 expression, the CPU plugin's
 * (plugins/cpu/kernels_impl.h) operation for operation, so both devices give the same bits:
 * nvcc would fuse a * x + b * y into an FMA (one rounding fewer than C), so axpby rounds each
 * product with __fmul_rn/__fadd_rn; division and sqrtf are IEEE-rounded at nvcc's defaults
 * (-prec-div, -prec-sqrt). `out` may alias any input: each element is read, then written, by
 * the same thread.
 */
#include "kernels_common.cuh"

static __global__ void ew_axpby_k(float *out, float alpha, const float *x, float beta, const float *y, int64_t n)
{
    CUK_FOR(i, n) out[i] = __fadd_rn(__fmul_rn(alpha, x[i]), __fmul_rn(beta, y[i]));
}

static __global__ void ew_mul_k(float *out, const float *x, const float *y, int64_t n)
{
    CUK_FOR(i, n) out[i] = x[i] * y[i];
}

static __global__ void ew_div_k(float *out, const float *x, const float *y, float eps, int64_t n)
{
    CUK_FOR(i, n) out[i] = x[i] / (y[i] + eps);
}

static __global__ void ew_sqrt_k(float *out, const float *x, int64_t n)
{
    CUK_FOR(i, n) out[i] = sqrtf(x[i]);
}

/* 1, -1, or x itself: a zero keeps its sign, a NaN passes */
static __global__ void ew_sign_k(float *out, const float *x, int64_t n)
{
    CUK_FOR(i, n) {
        float v = x[i];
        out[i] = v > 0.0f ? 1.0f : v < 0.0f ? -1.0f : v;
    }
}

/* comparisons, not fminf/fmaxf: those would turn a NaN into a bound */
static __global__ void ew_clamp_k(float *out, const float *x, float lo, float hi, int64_t n)
{
    CUK_FOR(i, n) {
        float v = x[i];
        out[i] = v < lo ? lo : v > hi ? hi : v;
    }
}

static __global__ void ew_greater_k(float *out, const float *x, const float *y, int64_t n)
{
    CUK_FOR(i, n) out[i] = x[i] > y[i] ? 1.0f : 0.0f;
}

extern "C" cudaError_t cuk_ew_axpby(const cuk_env *e, float *out, float alpha, const float *x, float beta,
                                    const float *y, int64_t n)
{
    ew_axpby_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(out, alpha, x, beta, y, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_ew_mul(const cuk_env *e, float *out, const float *x, const float *y, int64_t n)
{
    ew_mul_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(out, x, y, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_ew_div(const cuk_env *e, float *out, const float *x, const float *y, float eps,
                                  int64_t n)
{
    ew_div_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(out, x, y, eps, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_ew_sqrt(const cuk_env *e, float *out, const float *x, int64_t n)
{
    ew_sqrt_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(out, x, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_ew_sign(const cuk_env *e, float *out, const float *x, int64_t n)
{
    ew_sign_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(out, x, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_ew_clamp(const cuk_env *e, float *out, const float *x, float lo, float hi, int64_t n)
{
    ew_clamp_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(out, x, lo, hi, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_ew_greater(const cuk_env *e, float *out, const float *x, const float *y, int64_t n)
{
    ew_greater_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(out, x, y, n);
    return cudaGetLastError();
}
