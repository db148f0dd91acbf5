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
 *
 * The fp8 helpers do the same for OCP FP8 (e4m3: bias 7, 3 mantissa bits, max 448, no inf, NaN
 * S.1111.111; e5m2: bias 15, 2 mantissa bits, max 57344, IEEE inf and NaN). f32 -> fp8 rounds to
 * nearest, ties to even, and saturates: anything beyond max, infinities included, becomes +-max
 * (CUDA's __NV_SATFINITE does the same); a NaN becomes S.1111111 (0x7f / 0xff, a NaN in both
 * formats). The encoders are branch-free so the quantize loops vectorise. tests/unit/test_fp8.c
 * checks them against tables from CUDA's cuda_fp8.h and from ml_dtypes (tests/golden/fp8/).
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

/* f32 -> fp8 with `mbits` mantissa bits, exponent bias `bias`, largest finite value `max`.
 * Normal results round on the f32 bits (add half an fp8 ulp minus one, plus the bit that makes
 * ties go to even, then shift). Subnormal results let the FPU round: adding 2^k, whose f32 ulp is
 * the fp8 subnormal step, leaves round(|x| / step) in the low bits; the count may reach the
 * smallest normal, whose code follows the subnormals. Flush-to-zero / denormals-are-zero modes
 * do not change the result: only f32 subnormals, which encode to +-0 anyway, are affected. */
static inline uint8_t cpu_f32_to_f8(float x, int mbits, int bias, float max)
{
    uint32_t u = cpu_f32_bits(x), sign = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu;
    float ax = cpu_f32_from_bits(a);
    ax = ax < max ? ax : max; /* saturate (inf included); NaN is replaced below */
    uint32_t c = cpu_f32_bits(ax);
    int shift = 23 - mbits;
    uint32_t magic = (uint32_t)(127 + 24 - bias - mbits) << 23; /* 2^(24-bias-mbits) */
    uint32_t sub = cpu_f32_bits(ax + cpu_f32_from_bits(magic)) - magic;
    uint32_t nrm = (c - ((uint32_t)(127 - bias) << 23) + ((1u << (shift - 1)) - 1u) +
                    ((c >> shift) & 1u)) >> shift;
    uint32_t r = c < (uint32_t)(128 - bias) << 23 ? sub : nrm; /* below 2^(1-bias): subnormal */
    r = a > 0x7F800000u ? 0x7Fu : r;
    return (uint8_t)(sign | r);
}

/* fp8 -> f32, exact. `ieee`: the top exponent holds inf and NaN (e5m2); otherwise only
 * S.1111.111 is NaN and the top exponent holds normal values (e4m3). */
static inline float cpu_f8_to_f32(uint8_t b, int mbits, int bias, int ieee)
{
    uint32_t sign = (uint32_t)(b & 0x80u) << 24, e = (uint32_t)(b & 0x7Fu) >> mbits,
             m = b & ((1u << mbits) - 1u), emax = (1u << (7 - mbits)) - 1u;
    uint32_t bits;
    if (e == 0) /* subnormal: m * 2^(1-bias-mbits) */
        bits = cpu_f32_bits((float)m * cpu_f32_from_bits((uint32_t)(128 - bias - mbits) << 23));
    else if (ieee && e == emax)
        bits = m ? 0x7FC00000u : 0x7F800000u;
    else if (!ieee && e == emax && m == (1u << mbits) - 1u)
        bits = 0x7FC00000u;
    else
        bits = (e + 127u - (uint32_t)bias) << 23 | m << (23 - mbits);
    return cpu_f32_from_bits(sign | bits);
}

#define CPU_E4M3_MAX 448.0f
#define CPU_E5M2_MAX 57344.0f

static inline uint8_t cpu_f32_to_e4m3(float x)
{
    return cpu_f32_to_f8(x, 3, 7, CPU_E4M3_MAX);
}
static inline uint8_t cpu_f32_to_e5m2(float x)
{
    return cpu_f32_to_f8(x, 2, 15, CPU_E5M2_MAX);
}
static inline float cpu_e4m3_to_f32(uint8_t b)
{
    return cpu_f8_to_f32(b, 3, 7, 0);
}
static inline float cpu_e5m2_to_f32(uint8_t b)
{
    return cpu_f8_to_f32(b, 2, 15, 1);
}

#endif
