/* kernels_fp8.c: the float8 kernels (ABI 1.2): amax, quantize and dequantize with group scales.
 *
 * f32 only, so not part of the float/double template (kernels_impl.h); the conversions are the
 * scalar helpers of cpu_math.h. Groups: element i belongs to group i / group, and group divides n
 * (device.c checks). The work is split into blocks of at most CPU_F8_BLOCK elements that never
 * cross a group boundary, so each block reads one scale and its inner loop vectorises; tensorwise
 * (one group), rowwise (group = cols) and 1x32 blocks all split the same way.
 *
 * Threads: OpenMP, schedule(static). Quantize and dequantize are elementwise; amax is a max of
 * |x| taken on the f32 bits as unsigned integers, which is exact in any order (and makes a NaN
 * win: its bits lie above inf's), so every result is bit-identical across runs and thread counts.
 */
#include "kernels.h"

#include <omp.h>

#include "cpu_math.h"

/* Below this many elements a parallel region costs more than it saves (as in kernels_impl.h). */
#define CPU_F8_PAR_MIN 16384
/* Largest block of elements one task converts. */
#define CPU_F8_BLOCK 4096

/* AVX2+FMA and baseline builds, picked by the loader (see kernels_impl.h's CPU_CLONES). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(CT_NO_CLONES)
#define CPU_F8_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CPU_F8_CLONES
#endif

/* max over x (n) of the |x| bits; above 0x7f800000 means a NaN was seen */
static inline __attribute__((always_inline)) uint32_t amax_bits(const float *x, int64_t n)
{
    uint32_t m = 0;
#pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < n; i++) {
        uint32_t a = cpu_f32_bits(x[i]) & 0x7FFFFFFFu;
        m = a > m ? a : m;
    }
    return m;
}

static inline float amax_value(uint32_t bits)
{
    return bits > 0x7F800000u ? cpu_f32_from_bits(0x7FC00000u) : cpu_f32_from_bits(bits);
}

/* amax (n / group) = max |src| per group, NaN if the group holds one. Many groups: one task per
 * group; few large groups: each group's blocks are reduced in parallel. */
CPU_F8_CLONES void amax_f32(float *amax, const float *src, int64_t n, int64_t group)
{
    int64_t ngroups = n / group;
    if (ngroups >= omp_get_max_threads() || group < CPU_F8_PAR_MIN) {
#pragma omp parallel for schedule(static) if (n >= CPU_F8_PAR_MIN)
        for (int64_t g = 0; g < ngroups; g++)
            amax[g] = amax_value(amax_bits(src + g * group, group));
        return;
    }
    int64_t nblocks = (group + CPU_F8_BLOCK - 1) / CPU_F8_BLOCK;
    for (int64_t g = 0; g < ngroups; g++) {
        const float *x = src + g * group;
        uint32_t m = 0;
#pragma omp parallel for schedule(static) reduction(max : m)
        for (int64_t b = 0; b < nblocks; b++) {
            int64_t i0 = b * CPU_F8_BLOCK;
            int64_t len = group - i0 < CPU_F8_BLOCK ? group - i0 : CPU_F8_BLOCK;
            uint32_t mb = amax_bits(x + i0, len);
            m = mb > m ? mb : m;
        }
        amax[g] = amax_value(m);
    }
}

/* One block of a group op: elements [i0, i1) of group g. */
typedef struct f8_block {
    int64_t g, i0, i1;
} f8_block;

static inline f8_block f8_block_at(int64_t task, int64_t group, int64_t blocks_per_group)
{
    f8_block b;
    b.g = task / blocks_per_group;
    b.i0 = b.g * group + (task % blocks_per_group) * CPU_F8_BLOCK;
    int64_t end = (b.g + 1) * group;
    b.i1 = end - b.i0 < CPU_F8_BLOCK ? end : b.i0 + CPU_F8_BLOCK;
    return b;
}

/* dst (n) = fp8(src * scale[i / group]), saturating, round to nearest even */
CPU_F8_CLONES void quantize_fp8_f32(uint8_t *dst, const float *src, const float *scale, int64_t n,
                                    int64_t group, int e5m2)
{
    int64_t per = (group + CPU_F8_BLOCK - 1) / CPU_F8_BLOCK, ntasks = n / group * per;
#pragma omp parallel for schedule(static) if (n >= CPU_F8_PAR_MIN)
    for (int64_t t = 0; t < ntasks; t++) {
        f8_block b = f8_block_at(t, group, per);
        float s = scale[b.g];
        if (e5m2) {
#pragma omp simd
            for (int64_t i = b.i0; i < b.i1; i++)
                dst[i] = cpu_f32_to_e5m2(src[i] * s);
        } else {
#pragma omp simd
            for (int64_t i = b.i0; i < b.i1; i++)
                dst[i] = cpu_f32_to_e4m3(src[i] * s);
        }
    }
}

/* dst (n) = value(src) / scale[i / group], through a 256-entry table of the format's values */
CPU_F8_CLONES void dequantize_fp8_f32(float *dst, const uint8_t *src, const float *scale,
                                      int64_t n, int64_t group, int e5m2)
{
    float value[256];
    for (int c = 0; c < 256; c++)
        value[c] = e5m2 ? cpu_e5m2_to_f32((uint8_t)c) : cpu_e4m3_to_f32((uint8_t)c);
    int64_t per = (group + CPU_F8_BLOCK - 1) / CPU_F8_BLOCK, ntasks = n / group * per;
#pragma omp parallel for schedule(static) if (n >= CPU_F8_PAR_MIN)
    for (int64_t t = 0; t < ntasks; t++) {
        f8_block b = f8_block_at(t, group, per);
        float s = scale[b.g];
#pragma omp simd
        for (int64_t i = b.i0; i < b.i1; i++)
            dst[i] = value[src[i]] / s;
    }
}
