/* cpu_math.h: scalar helpers the CPU kernels inline into their loops.
 *
 * cpu_expf / cpu_tanhf are branch-free so that `#pragma omp simd` loops calling them vectorise
 * (libm's expf does not, and softmax, cross-entropy, SiLU and GELU are dominated by exp).
 * cpu_expf is Cephes' single-precision exp: within 2 ulp of exp on [-87.3, 88]; below that it
 * returns 0, above it a large finite value (callers only feed it max-subtracted or bounded
 * arguments); NaN gives NaN.
 *
 * The bf16 helpers work on bit patterns: f32 -> bf16 rounds to nearest, ties to even; a NaN
 * stays a NaN (made quiet) and infinities stay infinite.
 */
#ifndef CTITAN_CPU_MATH_H
#define CTITAN_CPU_MATH_H

#include <stdint.h>
#include <string.h>

static inline uint32_t cpu_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float cpu_f32_from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline float cpu_expf(float x)
{
    const float hi = 88.0f, lo = -87.3365447504f; /* keeps 2^n a normal float */
    const float log2e = 1.44269504088896341f;
    const float round_magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float xc = x > hi ? hi : x;
    xc = xc < lo ? lo : xc;

    /* x = n ln2 + r, |r| <= ln2/2; n read from the mantissa of the rounded sum (no float->int
     * conversion, so a NaN cannot make undefined behaviour). */
    float t = xc * log2e + round_magic;
    uint32_t n_biased = cpu_f32_bits(t) - 0x4B400000u + 127u;
    float n = t - round_magic;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;

    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;

    float y = p * cpu_f32_from_bits(n_biased << 23);
    return x < lo ? 0.0f : y;
}

/* tanh(u) = 1 - 2 / (exp(2u) + 1): absolute error ~1e-7, which is what GELU needs. */
static inline float cpu_tanhf(float u)
{
    return 1.0f - 2.0f / (cpu_expf(2.0f * u) + 1.0f);
}

static inline uint16_t cpu_f32_to_bf16(float x)
{
    uint32_t u = cpu_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) /* NaN: keep sign and top payload, force quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u); /* ties to even; overflow carries into inf */
    return (uint16_t)(u >> 16);
}

static inline float cpu_bf16_to_f32(uint16_t h)
{
    return cpu_f32_from_bits((uint32_t)h << 16);
}

#endif
