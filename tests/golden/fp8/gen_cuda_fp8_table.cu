/* gen_cuda_fp8_table.cu: the OCP FP8 reference table from CUDA's cuda_fp8.h (host code only).
 *
 * Writes tests/golden/fp8/cuda_fp8_table.txt, which tests/unit/test_fp8.c reads. No GPU and no
 * driver are needed: there is no kernel and no runtime call, and cuda_fp8.h's conversions are
 * __host__ __device__ functions whose host path is a software emulation (on sm_89+ devices the
 * same SATFINITE conversion is the cvt.rn.satfinite.{e4m3,e5m2}x2.f32 instruction).
 *
 *     g++ -std=c++17 -O2 -Wall -x c++ -I/usr/local/cuda/include -o /tmp/gen_cuda_fp8_table \
 *         tests/golden/fp8/gen_cuda_fp8_table.cu
 *     /tmp/gen_cuda_fp8_table > tests/golden/fp8/cuda_fp8_table.txt
 *
 * g++ makes a plain host program that links nothing of CUDA; nvcc (`nvcc -O2 -o ... FILE.cu`)
 * builds the same program with the CUDA runtime linked in but never called, and writes the same
 * bytes.
 *
 * Lines (hex, no 0x):
 *     decode FMT CODE F32            fp8 code -> float: __nv_cvt_fp8_to_halfraw, __half2float
 *                                    (the __nv_fp8_e4m3 / _e5m2 classes' float() must agree)
 *     encode FMT F32 SATFINITE NOSAT __nv_cvt_float_to_fp8(x, __NV_SATFINITE / __NV_NOSAT, FMT)
 *                                    (the classes' float constructor must equal SATFINITE)
 * FMT is e4m3 or e5m2. The sweep of encoded inputs is the one gen_ml_dtypes_table.py makes (the
 * README in this folder describes it); the test checks that both tables list the same inputs.
 */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h> /* CUDART_VERSION only */

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

static uint32_t bits_of(float x)
{
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
}

static int fail(const char *what, unsigned a, unsigned b, unsigned c)
{
    std::fprintf(stderr, "gen_cuda_fp8_table: %s (%x, %x, %x)\n", what, a, b, c);
    return 1;
}

struct format {
    const char *name;
    __nv_fp8_interpretation_t kind;
    unsigned max_code; /* largest finite positive code */
};

static float decode(unsigned code, const format &f)
{
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)code, f.kind);
    return __half2float(__half(h));
}

static float decode_class(unsigned code, const format &f)
{
    if (f.kind == __NV_E4M3) {
        __nv_fp8_e4m3 v;
        v.__x = (__nv_fp8_storage_t)code;
        return float(v);
    }
    __nv_fp8_e5m2 v;
    v.__x = (__nv_fp8_storage_t)code;
    return float(v);
}

static unsigned encode_class(float x, const format &f)
{
    return f.kind == __NV_E4M3 ? __nv_fp8_e4m3(x).__x : __nv_fp8_e5m2(x).__x;
}

/* The sweep: every finite fp8 value, the midpoints between neighbours (ties) and 1 f32 ulp either
 * side of them, the same around the overflow tie (max + half an ulp of max) and the underflow tie
 * (half the smallest subnormal), some values past max and below the smallest subnormal; then all
 * of them negated; then inf, NaN. Sorted by bits, duplicates removed. */
static std::vector<uint32_t> sweep(const format &f)
{
    std::vector<float> v;
    for (unsigned c = 0; c <= f.max_code; c++)
        v.push_back(decode(c, f));
    std::vector<uint32_t> pos;
    auto around = [&pos](float m) {
        pos.push_back(bits_of(m));
        pos.push_back(bits_of(std::nextafterf(m, 0.0f)));
        pos.push_back(bits_of(std::nextafterf(m, INFINITY)));
    };
    for (size_t k = 0; k < v.size(); k++) {
        pos.push_back(bits_of(v[k]));
        if (k + 1 < v.size())
            around((v[k] + v[k + 1]) / 2);
    }
    float max = v.back(), ulp_max = v.back() - v[v.size() - 2];
    around(max + ulp_max / 2);
    for (float x : {max * 1.0001f, max + ulp_max, max * 2, 1e6f, 1e30f, FLT_MAX})
        pos.push_back(bits_of(x));
    around(v[1] / 2);
    for (float x : {v[1] / 4, float_of(1), FLT_MIN})
        pos.push_back(bits_of(x));
    std::sort(pos.begin(), pos.end());
    pos.erase(std::unique(pos.begin(), pos.end()), pos.end());
    std::vector<uint32_t> all(pos);
    for (uint32_t u : pos)
        all.push_back(u | 0x80000000u);
    const uint32_t specials[] = {0x7F800000u, 0xFF800000u, 0x7FC00000u,
                                 0xFFC00000u, 0x7F800001u, 0x7FFFFFFFu};
    for (uint32_t u : specials)
        all.push_back(u);
    return all;
}

int main(void)
{
    const format formats[] = {{"e4m3", __NV_E4M3, 0x7E}, {"e5m2", __NV_E5M2, 0x7B}};
    std::printf("# OCP FP8 reference from CUDA %d.%d cuda_fp8.h, host conversions "
                "(made by gen_cuda_fp8_table.cu)\n",
                CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
    std::printf("# decode FMT CODE F32_BITS\n# encode FMT F32_BITS SATFINITE NOSAT\n");
    for (const format &f : formats)
        for (unsigned c = 0; c < 256; c++) {
            float a = decode(c, f), b = decode_class(c, f);
            if (bits_of(a) != bits_of(b) && !(std::isnan(a) && std::isnan(b)))
                return fail("decode: halfraw and class differ", c, bits_of(a), bits_of(b));
            std::printf("decode %s %02x %08x\n", f.name, c, bits_of(a));
        }
    for (const format &f : formats)
        for (uint32_t u : sweep(f)) {
            float x = float_of(u);
            unsigned sat = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, f.kind);
            unsigned nosat = __nv_cvt_float_to_fp8(x, __NV_NOSAT, f.kind);
            if (encode_class(x, f) != sat)
                return fail("encode: class and SATFINITE differ", u, encode_class(x, f), sat);
            std::printf("encode %s %08x %02x %02x\n", f.name, u, sat, nosat);
        }
    return 0;
}
