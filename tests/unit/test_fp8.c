/* test_fp8: the CPU plugin's float8 ops (ABI 1.2) against CUDA's cuda_fp8.h and ml_dtypes.
 *
 * tests/golden/fp8/cuda_fp8_table.txt and ml_dtypes_table.txt (made by the generators beside them;
 * nothing of CUDA or Python runs here) hold the value of every e4m3 / e5m2 code and the encoding
 * of a sweep of f32 inputs: every fp8 value, the ties between neighbours and 1 ulp either side,
 * overflow, underflow, inf, NaN. The plugin (build/plugins/ctitan-cpu.so, or $BUILD/...) must
 *   - decode every code to the value both tables give (any NaN for a NaN);
 *   - encode every sweep input to the tables' code where the two agree, and where they differ
 *     (overflow, inf, NaN: ml_dtypes' numpy cast does not saturate, CUDA's SATFINITE does) to the
 *     saturating contract of device.h: +-max for finite overflow and inf (as SATFINITE), S.1111111
 *     for NaN. The two may only differ there: a finite in-range difference fails the test;
 *   - apply group scales (tensorwise, rowwise, blocks of 32) in quantize and dequantize, checked
 *     against a by-value reference (nearest fp8 value of the decoded table, ties to the even code);
 *   - compute amax per group, NaN propagating; transpose; reject bad arguments (behind the host's
 *     argument checks, core/host/devcheck.c, as a run has them);
 *   - never make NaN or inf from finite inputs with a positive finite scale;
 *   - give the same bits with 1 and 2 threads.
 * It also prints the speed of the ops on 16M floats with 2 threads.
 */
#include "ctitan/abi.h"
#include "ctitan/device.h"
#include "ctitan/host.h"
#include "ctitan/util.h"
#include "host/devcheck.h"

#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define CUDA_TABLE "tests/golden/fp8/cuda_fp8_table.txt"
#define ML_TABLE "tests/golden/fp8/ml_dtypes_table.txt"
#define MAX_SWEEP 4096

/* ---------------------------------------------------------------- a minimal host */

static char last_error[1024];
static int64_t host_threads = 2; /* the `threads` option the next create reads */

static void host_log(const ct_host *h, ct_log_level level, const char *fmt, ...)
{
    (void)h;
    (void)level;
    (void)fmt;
}

static void host_set_error(const ct_host *h, const char *fmt, ...)
{
    (void)h;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
}

static ct_status host_opt_int(const ct_host *h, const char *key, int64_t *out)
{
    (void)h;
    if (strcmp(key, "threads") != 0)
        return CT_ERR_INVALID;
    *out = host_threads;
    return CT_OK;
}

static const ct_host test_host = {
    .struct_size = sizeof(ct_host),
    .abi_major = CT_ABI_MAJOR,
    .abi_minor = CT_ABI_MINOR,
    .log = host_log,
    .set_error = host_set_error,
    .opt_int = host_opt_int,
};

/* ---------------------------------------------------------------- the golden tables */

typedef struct fp8_format {
    const char *name;
    ct_dtype dtype;
    unsigned max_code; /* largest finite positive code */
} fp8_format;

static const fp8_format formats[2] = {{"e4m3", CT_F8_E4M3, 0x7E}, {"e5m2", CT_F8_E5M2, 0x7B}};

typedef struct sweep_entry {
    uint32_t x;    /* f32 bits */
    unsigned cuda; /* __NV_SATFINITE */
    unsigned cuda_nosat;
    unsigned ml; /* ml_dtypes astype */
} sweep_entry;

typedef struct golden {
    uint32_t cuda_decode[2][256], ml_decode[2][256]; /* f32 bits */
    float value[2][256];                             /* the decoded values both agree on */
    sweep_entry sweep[2][MAX_SWEEP];
    int nsweep[2];
} golden;

static golden *gold;

static int format_index(const char *name)
{
    for (int f = 0; f < 2; f++)
        if (strcmp(name, formats[f].name) == 0)
            return f;
    return -1;
}

/* Reads one table: `decode FMT CODE F32` and `encode FMT F32 CODE [CODE]` lines. For the CUDA
 * table the sweep is filled in; for ml_dtypes each input must be the CUDA table's, in order.
 * Returns 0, or -1 after printing what is wrong. */
static int load_table(const char *path, int is_cuda)
{
    FILE *fp = fopen(path, "r");
    if (!fp) {
        fprintf(stderr, "cannot open %s (run the test from the repository root)\n", path);
        return -1;
    }
    char line[256];
    int lineno = 0, ndecode[2] = {0, 0}, nencode[2] = {0, 0}, bad = 0;
    while (!bad && fgets(line, sizeof line, fp)) {
        lineno++;
        if (line[0] == '#' || line[0] == '\n')
            continue;
        char kind[16], fmt[16];
        unsigned a, b, c = 0;
        int got = sscanf(line, "%15s %15s %x %x %x", kind, fmt, &a, &b, &c);
        int f = got >= 4 ? format_index(fmt) : -1, k = f >= 0 ? nencode[f] : 0;
        if (f >= 0 && strcmp(kind, "decode") == 0 && got == 4 && a < 256) {
            (is_cuda ? gold->cuda_decode : gold->ml_decode)[f][a] = b;
            ndecode[f]++;
        } else if (f >= 0 && strcmp(kind, "encode") == 0 && got == (is_cuda ? 5 : 4) && b < 256 &&
                   c < 256 && k < MAX_SWEEP) {
            sweep_entry *e = &gold->sweep[f][nencode[f]++];
            if (is_cuda) {
                e->x = a;
                e->cuda = b;
                e->cuda_nosat = c;
            } else if (k < gold->nsweep[f] && e->x == a) {
                e->ml = b;
            } else {
                fprintf(stderr, "%s:%d: input %08x is not the CUDA table's input %d\n", path,
                        lineno, a, k);
                bad = 1;
            }
        } else {
            fprintf(stderr, "%s:%d: cannot parse '%s'\n", path, lineno, line);
            bad = 1;
        }
    }
    fclose(fp);
    for (int f = 0; f < 2 && !bad; f++) {
        if (ndecode[f] != 256) {
            fprintf(stderr, "%s: %d %s decode lines, expected 256\n", path, ndecode[f],
                    formats[f].name);
            bad = 1;
        } else if (!is_cuda && nencode[f] != gold->nsweep[f]) {
            fprintf(stderr, "%s: %d %s inputs, the CUDA table has %d\n", path, nencode[f],
                    formats[f].name, gold->nsweep[f]);
            bad = 1;
        } else if (nencode[f] < 500) {
            fprintf(stderr, "%s: only %d %s inputs\n", path, nencode[f], formats[f].name);
            bad = 1;
        }
        if (is_cuda)
            gold->nsweep[f] = nencode[f];
    }
    return bad ? -1 : 0;
}

static float f32_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static int is_nan_code(unsigned code, int f)
{
    return f == 0 ? (code & 0x7F) == 0x7F : (code & 0x7F) > 0x7C;
}

/* ---------------------------------------------------------------- the plugin */

static void *so;
static const ct_device_api *api;
static ct_device *dev, *dev1; /* 2 threads, 1 thread */

static int setup(void **state)
{
    (void)state;
    const char *build = getenv("BUILD");
    char path[4096];
    snprintf(path, sizeof path, "%s/plugins/ctitan-cpu.so", build && *build ? build : "build");
    so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        fprintf(stderr, "cannot load %s: %s\n", path, dlerror());
        return -1;
    }
    ct_plugin_entry_fn entry;
    *(void **)&entry = dlsym(so, CT_PLUGIN_ENTRY_NAME);
    ct_plugin_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (!entry || entry(&test_host, &info) != CT_OK || !info.api) {
        fprintf(stderr, "%s: no device api\n", path);
        return -1;
    }
    api = devcheck_wrap(info.api, &test_host); /* as the host runs a device: behind its argument checks */
    if (api->struct_size < offsetof(ct_device_api, transpose) + sizeof(void *) || !api->amax ||
        !api->quantize_fp8 || !api->dequantize_fp8 || !api->transpose) {
        fprintf(stderr, "%s: the float8 ops (ABI 1.2) are missing\n", path);
        return -1;
    }
    host_threads = 2;
    if (api->create(&test_host, &dev) != CT_OK)
        return -1;
    host_threads = 1;
    if (api->create(&test_host, &dev1) != CT_OK)
        return -1;
    gold = calloc(1, sizeof *gold);
    if (!gold || load_table(CUDA_TABLE, 1) != 0 || load_table(ML_TABLE, 0) != 0)
        return -1;
    for (int f = 0; f < 2; f++)
        for (int c = 0; c < 256; c++)
            gold->value[f][c] = f32_of(gold->cuda_decode[f][c]);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (dev)
        api->destroy(dev);
    if (dev1)
        api->destroy(dev1);
    free(gold);
    if (so)
        dlclose(so);
    return 0;
}

static void expect_invalid(ct_status st, const char *what)
{
    if (st != CT_ERR_INVALID)
        fail_msg("%s: status %d, expected CT_ERR_INVALID", what, (int)st);
    if (!last_error[0])
        fail_msg("%s: no message through set_error", what);
    last_error[0] = '\0';
}

/* ---------------------------------------------------------------- a by-value reference */

/* The saturating round-to-nearest-even cast by value: the nearest finite fp8 value (of the
 * golden decode table), ties to the even code; beyond max (inf included) that is +-max; NaN is
 * S.1111111. */
static unsigned ref_encode(float y, int f)
{
    unsigned sign = signbit(y) ? 0x80 : 0;
    if (isnan(y))
        return sign | 0x7F;
    double a = fabs((double)y);
    if (a >= gold->value[f][formats[f].max_code]) /* the nearest finite value is max */
        return sign | formats[f].max_code;
    unsigned best = 0;
    double best_d = INFINITY;
    for (unsigned c = 0; c <= formats[f].max_code; c++) {
        double d = fabs(a - (double)gold->value[f][c]); /* exact: both have few bits */
        if (d < best_d || (d == best_d && (c & 1) == 0)) {
            best = c;
            best_d = d;
        }
    }
    return sign | best;
}

/* ---------------------------------------------------------------- tests */

static void test_every_code_decodes_to_the_ocp_value(void **state)
{
    (void)state;
    uint8_t codes[256];
    for (int c = 0; c < 256; c++)
        codes[c] = (uint8_t)c;
    float one = 1.0f, out[256];
    for (int f = 0; f < 2; f++) {
        int nans = 0;
        for (int c = 0; c < 256; c++) {
            uint32_t cu = gold->cuda_decode[f][c], ml = gold->ml_decode[f][c];
            int cu_nan = isnan(f32_of(cu)), ml_nan = isnan(f32_of(ml));
            if (cu != ml && !(cu_nan && ml_nan))
                fail_msg("%s %02x: CUDA decodes %08x, ml_dtypes %08x", formats[f].name, c, cu, ml);
            if (cu_nan != is_nan_code((unsigned)c, f))
                fail_msg("%s %02x: NaN in the tables is %d, by the OCP layout %d", formats[f].name,
                         c, cu_nan, is_nan_code((unsigned)c, f));
            nans += cu_nan;
        }
        assert_int_equal(nans, f == 0 ? 2 : 6);
        assert_int_equal(api->dequantize_fp8(dev, out, codes, &one, 256, 256, formats[f].dtype),
                         CT_OK);
        for (int c = 0; c < 256; c++) {
            uint32_t want = gold->cuda_decode[f][c], got = bits_of(out[c]);
            if (isnan(f32_of(want)) ? !isnan(out[c]) : got != want)
                fail_msg("dequantize_fp8 %s %02x = %08x, expected %08x", formats[f].name, c, got,
                         want);
        }
    }
}

static void test_sweep_encodes_like_both_references(void **state)
{
    (void)state;
    static float x[MAX_SWEEP];
    static uint8_t got[MAX_SWEEP];
    float one = 1.0f;
    for (int f = 0; f < 2; f++) {
        int n = gold->nsweep[f], agree = 0, saturated = 0, nans = 0;
        float max = gold->value[f][formats[f].max_code];
        for (int i = 0; i < n; i++)
            x[i] = f32_of(gold->sweep[f][i].x);
        assert_int_equal(api->quantize_fp8(dev, got, x, &one, n, n, formats[f].dtype), CT_OK);
        for (int i = 0; i < n; i++) {
            const sweep_entry *e = &gold->sweep[f][i];
            unsigned want, sign = e->x >> 31 ? 0x80 : 0;
            if (isnan(x[i])) { /* CUDA drops the sign; e5m2: CUDA 0x7f, ml_dtypes 0x7e */
                if (!is_nan_code(e->cuda, f) || !is_nan_code(e->ml, f))
                    fail_msg("%s NaN %08x: a reference gives %02x / %02x", formats[f].name, e->x,
                             e->cuda, e->ml);
                want = sign | 0x7F;
                nans++;
            } else if (e->cuda == e->ml) {
                want = e->cuda;
                agree++;
            } else if (fabsf(x[i]) > max) { /* ml_dtypes: NaN (e4m3fn) or inf (e5m2) */
                want = sign | formats[f].max_code;
                if (e->cuda != want)
                    fail_msg("%s %08x: CUDA SATFINITE gives %02x, not +-max", formats[f].name,
                             e->x, e->cuda);
                saturated++;
            } else {
                fail_msg("%s %08x (%.9g) is in range but CUDA gives %02x, ml_dtypes %02x",
                         formats[f].name, e->x, (double)x[i], e->cuda, e->ml);
            }
            if (got[i] != want)
                fail_msg("quantize_fp8 %s %08x (%.9g) = %02x, expected %02x (CUDA %02x, "
                         "ml_dtypes %02x)",
                         formats[f].name, e->x, (double)x[i], got[i], want, e->cuda, e->ml);
            if (ref_encode(x[i], f) != want) /* the test's own reference agrees too */
                fail_msg("by-value reference %s %08x = %02x, tables say %02x", formats[f].name,
                         e->x, ref_encode(x[i], f), want);
            if (!isnan(x[i]) && e->cuda_nosat != e->ml) /* no saturation: CUDA is ml_dtypes */
                fail_msg("%s %08x: CUDA NOSAT %02x, ml_dtypes %02x", formats[f].name, e->x,
                         e->cuda_nosat, e->ml);
        }
        print_message("%s: %d inputs: %d where CUDA and ml_dtypes agree, %d saturated where "
                      "they differ (overflow, inf), %d NaN\n",
                      formats[f].name, n, agree, saturated, nans);
        assert_true(saturated >= 14 && nans == 4 && agree > n - 40);
    }
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rnd_u64(void) /* splitmix64 */
{
    return ct_util_splitmix64_next(&rng_state);
}

/* uniform in [-1, 1) times 2^e, e uniform in [lo, hi] */
static float rnd_float(int lo, int hi)
{
    double u = (double)(rnd_u64() >> 11) / 4503599627370496.0 - 1.0;
    return (float)ldexp(u, lo + (int)(rnd_u64() % (uint64_t)(hi - lo + 1)));
}

static float ref_amax(const float *x, int64_t n)
{
    float m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i]))
            return NAN;
        m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    }
    return m;
}

/* rows x cols with a different magnitude per row, quantised with scale = max / amax per group,
 * for group = n (tensorwise), cols (rowwise) and 32 (blocks); then dequantised. */
static void check_groups(int64_t rows, int64_t cols)
{
    int64_t n = rows * cols;
    float *x = malloc((size_t)n * sizeof *x), *back = malloc((size_t)n * sizeof *back);
    float *amax = malloc((size_t)n * sizeof *amax), *scale = malloc((size_t)n * sizeof *scale);
    uint8_t *q = malloc((size_t)n), *q1 = malloc((size_t)n);
    assert_true(x && back && amax && scale && q && q1);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            x[i * cols + j] = rnd_float(-8, 2) * ldexpf(1.0f, (int)(i % 40) - 20);
    x[cols / 2] = -1e9f; /* the largest magnitude of the tensor, negative */
    const int64_t groups[3] = {n, cols, 32};
    for (int f = 0; f < 2; f++)
        for (int gi = 0; gi < 3; gi++) {
            int64_t group = groups[gi], ng = n / group;
            float max = gold->value[f][formats[f].max_code];
            assert_int_equal(api->amax(dev, amax, x, n, group), CT_OK);
            for (int64_t g = 0; g < ng; g++) {
                float want = ref_amax(x + g * group, group);
                if (bits_of(amax[g]) != bits_of(want))
                    fail_msg("amax group %lld of %lld = %.9g, expected %.9g", (long long)g,
                             (long long)group, (double)amax[g], (double)want);
                scale[g] = max / amax[g];
            }
            assert_int_equal(api->quantize_fp8(dev, q, x, scale, n, group, formats[f].dtype),
                             CT_OK);
            assert_int_equal(api->quantize_fp8(dev1, q1, x, scale, n, group, formats[f].dtype),
                             CT_OK);
            assert_memory_equal(q, q1, (size_t)n);
            assert_int_equal(api->dequantize_fp8(dev, back, q, scale, n, group, formats[f].dtype),
                             CT_OK);
            int saw_max = 0;
            for (int64_t i = 0; i < n; i++) {
                float s = scale[i / group], y = x[i] * s;
                unsigned want = ref_encode(y, f);
                if (q[i] != want)
                    fail_msg("quantize_fp8 %s group %lld [%lld]: %.9g * %.9g -> %02x, expected "
                             "%02x",
                             formats[f].name, (long long)group, (long long)i, (double)x[i],
                             (double)s, q[i], want);
                float dq = gold->value[f][q[i]] / s;
                if (bits_of(back[i]) != bits_of(dq))
                    fail_msg("dequantize_fp8 %s group %lld [%lld] = %.9g, expected %.9g",
                             formats[f].name, (long long)group, (long long)i, (double)back[i],
                             (double)dq);
                /* the round trip is within half an fp8 ulp: 2^-(mbits+1) relative for normal
                 * values, plus the subnormal step scaled back */
                double tol = ldexp(fabs((double)x[i]), f == 0 ? -4 : -3) +
                             ldexp(1.0, f == 0 ? -10 : -17) / s;
                if (!(fabs((double)back[i] - (double)x[i]) <= tol * 1.000001))
                    fail_msg("round trip %s group %lld [%lld]: %.9g -> %.9g", formats[f].name,
                             (long long)group, (long long)i, (double)x[i], (double)back[i]);
                saw_max |= (q[i] & 0x7F) == formats[f].max_code;
            }
            assert_true(saw_max); /* each scale maps its group's amax to (about) max */
        }
    free(x);
    free(back);
    free(amax);
    free(scale);
    free(q);
    free(q1);
}

static void test_group_scales_tensorwise_rowwise_and_blocks(void **state)
{
    (void)state;
    check_groups(24, 96);    /* below the parallel threshold */
    check_groups(130, 1024); /* parallel; rowwise groups of 1024 */
    check_groups(4, 40960);  /* few groups larger than a work block */
}

static void test_amax_negatives_nan_inf_and_zeros(void **state)
{
    (void)state;
    enum { G = 64, NG = 6 };
    float x[G * NG], amax[NG];
    for (int i = 0; i < G * NG; i++)
        x[i] = rnd_float(-3, 3);
    for (int i = 0; i < G; i++)
        x[i] = -fabsf(x[i]);        /* group 0: all negative */
    x[G + 17] = NAN;                /* group 1: NaN in the middle */
    x[2 * G + G - 1] = -INFINITY;   /* group 2: -inf, last */
    for (int i = 3 * G; i < 4 * G; i++)
        x[i] = (i & 1) ? -0.0f : 0.0f; /* group 3: zeros */
    x[4 * G] = -NAN;                /* group 4: NaN first, then larger values */
    x[4 * G + 1] = 1e30f;
    x[5 * G + 5] = -3e38f;          /* group 5: a huge negative */
    assert_int_equal(api->amax(dev, amax, x, G * NG, G), CT_OK);
    assert_true(bits_of(amax[0]) == bits_of(ref_amax(x, G)) && amax[0] > 0);
    assert_true(isnan(amax[1]));
    assert_true(isinf(amax[2]) && amax[2] > 0);
    assert_int_equal(bits_of(amax[3]), 0); /* +0, also from -0 */
    assert_true(isnan(amax[4]));
    assert_true(amax[5] == 3e38f);

    /* one large group (the parallel reduction) with its max, negative and growing, put at each
     * place where a split into blocks or threads could start or end; the same with 1 thread */
    const int64_t n = 1 << 20;
    float *big = malloc((size_t)n * sizeof *big), a2, a1;
    assert_non_null(big);
    for (int64_t i = 0; i < n; i++)
        big[i] = rnd_float(-10, 10);
    const int64_t places[] = {0,    1,     255,   256,   1023,  1024,  4095,  4096,
                              4097, 8191,  8192,  65535, 65536, n / 2 - 1, n / 2, n - 2,
                              n - 1, (int64_t)(rnd_u64() % (uint64_t)n)};
    for (size_t p = 0; p < sizeof places / sizeof places[0]; p++) {
        float peak = -5000.0f * (float)(p + 1);
        big[places[p]] = peak;
        assert_int_equal(api->amax(dev, &a2, big, n, n), CT_OK);
        assert_int_equal(api->amax(dev1, &a1, big, n, n), CT_OK);
        if (a2 != -peak || a1 != -peak)
            fail_msg("amax with %g at %lld: %g (2 threads), %g (1 thread)", (double)peak,
                     (long long)places[p], (double)a2, (double)a1);
    }
    big[n - 3] = NAN;
    assert_int_equal(api->amax(dev, &a2, big, n, n), CT_OK);
    assert_true(isnan(a2));
    free(big);
}

static void test_finite_inputs_never_become_nan_or_inf(void **state)
{
    (void)state;
    enum { N = 1 << 16 };
    static float x[N];
    static uint8_t q[N];
    for (int i = 0; i < N; i++) {
        uint32_t u;
        do
            u = (uint32_t)rnd_u64();
        while ((u & 0x7F800000u) == 0x7F800000u); /* any finite f32, subnormals included */
        x[i] = f32_of(u);
    }
    x[0] = FLT_MAX;
    x[1] = -FLT_MAX;
    const float scales[] = {1.4e-45f, 1e-30f, 1e-3f, 1.0f, 448.0f, 1e10f, 1e30f, FLT_MAX};
    for (int f = 0; f < 2; f++)
        for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
            float sc[2] = {scales[s], scales[s]};
            assert_int_equal(api->quantize_fp8(dev, q, x, sc, N, N / 2, formats[f].dtype), CT_OK);
            for (int i = 0; i < N; i++)
                if (is_nan_code(q[i], f) || (f == 1 && (q[i] & 0x7F) == 0x7C))
                    fail_msg("%s: %.9g * scale %.9g -> %02x (NaN or inf)", formats[f].name,
                             (double)x[i], (double)scales[s], q[i]);
        }
}

static void test_transpose(void **state)
{
    (void)state;
    const int64_t shapes[][2] = {{1, 77}, {77, 1}, {37, 53}, {300, 257}, {64, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t r = shapes[s][0], c = shapes[s][1];
        float *a = malloc((size_t)(r * c) * sizeof *a), *t = malloc((size_t)(r * c) * sizeof *t);
        assert_true(a && t);
        for (int64_t i = 0; i < r * c; i++)
            a[i] = (float)i;
        assert_int_equal(api->transpose(dev, t, a, r, c), CT_OK);
        for (int64_t i = 0; i < r; i++)
            for (int64_t j = 0; j < c; j++)
                if (t[j * r + i] != a[i * c + j])
                    fail_msg("transpose %lldx%lld: [%lld][%lld] = %g, expected %g", (long long)r,
                             (long long)c, (long long)j, (long long)i, (double)t[j * r + i],
                             (double)a[i * c + j]);
        free(a);
        free(t);
    }
}

static void test_bad_arguments_are_errors(void **state)
{
    (void)state;
    float buf[64] = {0}, one = 1;
    uint8_t q[64];
    expect_invalid(api->amax(dev, buf, buf, 64, 0), "amax group 0");
    expect_invalid(api->amax(dev, buf, buf, 64, 30), "amax group 30 of 64");
    expect_invalid(api->amax(dev, buf, buf, -1, 1), "amax n -1");
    expect_invalid(api->quantize_fp8(dev, q, buf, &one, 64, 64, CT_BF16), "quantize to bf16");
    expect_invalid(api->quantize_fp8(dev, q, buf, &one, 64, 48, CT_F8_E4M3), "quantize group 48");
    expect_invalid(api->quantize_fp8(dev, NULL, buf, &one, 64, 64, CT_F8_E4M3), "quantize NULL");
    expect_invalid(api->dequantize_fp8(dev, buf, q, &one, 64, 64, CT_F32), "dequantize f32");
    expect_invalid(api->dequantize_fp8(dev, buf, q, NULL, 64, 64, CT_F8_E5M2), "dequantize NULL");
    expect_invalid(api->transpose(dev, buf, buf, 8, 8), "transpose in place");
    expect_invalid(api->transpose(dev, buf + 4, buf, 4, 8), "transpose overlapping");
    expect_invalid(api->transpose(dev, buf, buf, -2, 8), "transpose rows -2");
    /* empty is fine */
    assert_int_equal(api->quantize_fp8(dev, NULL, NULL, NULL, 0, 1, CT_F8_E4M3), CT_OK);
    assert_int_equal(api->transpose(dev, NULL, NULL, 0, 5), CT_OK);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best of 3 runs of `op` on 16M floats, 2 threads; prints the rate. The bits must not depend on
 * the thread count (1 thread is run once for that). */
static void test_speed_16m_floats_2_threads(void **state)
{
    (void)state;
    const int64_t n = 1 << 24, cols = 4096;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    uint8_t *q = malloc((size_t)n), *q1 = malloc((size_t)n);
    float *scale = malloc((size_t)(n / 32) * sizeof *scale), amax;
    assert_true(x && y && q && q1 && scale);
    for (int64_t i = 0; i < n; i++)
        x[i] = rnd_float(-6, 4);
    for (int64_t g = 0; g < n / 32; g++)
        scale[g] = 448.0f / (float)(1 + g % 7);
    const struct {
        const char *what;
        int64_t group;
        int op; /* 0 quantize e4m3, 1 quantize e5m2, 2 dequantize, 3 amax, 4 transpose */
    } runs[] = {{"quantize_fp8 e4m3 tensorwise", n, 0}, {"quantize_fp8 e4m3 blocks of 32", 32, 0},
                {"quantize_fp8 e5m2 rowwise", cols, 1}, {"dequantize_fp8 e4m3 rowwise", cols, 2},
                {"amax tensorwise", n, 3},              {"amax rowwise", cols, 3},
                {"transpose 4096 x 4096", n, 4}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        double best = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            double t0 = now_s();
            ct_status st = CT_OK;
            switch (runs[r].op) {
            case 0:
            case 1:
                st = api->quantize_fp8(dev, q, x, scale, n, runs[r].group,
                                       runs[r].op ? CT_F8_E5M2 : CT_F8_E4M3);
                break;
            case 2:
                st = api->dequantize_fp8(dev, y, q, scale, n, runs[r].group, CT_F8_E4M3);
                break;
            case 3:
                st = api->amax(dev, y, x, n, runs[r].group);
                break;
            default:
                st = api->transpose(dev, y, x, n / cols, cols);
            }
            assert_int_equal(st, CT_OK);
            double dt = now_s() - t0;
            best = dt < best ? dt : best;
        }
        print_message("%-32s %6.1f ms  %6.2f ns/element  %5.0f M elements/s\n", runs[r].what,
                      best * 1e3, best * 1e9 / (double)n, (double)n / best / 1e6);
    }
    assert_int_equal(api->quantize_fp8(dev, q, x, scale, n, 32, CT_F8_E4M3), CT_OK);
    assert_int_equal(api->quantize_fp8(dev1, q1, x, scale, n, 32, CT_F8_E4M3), CT_OK);
    assert_memory_equal(q, q1, (size_t)n);
    assert_int_equal(api->amax(dev1, &amax, x, n, n), CT_OK);
    assert_true(amax == ref_amax(x, n));
    free(x);
    free(y);
    free(q);
    free(q1);
    free(scale);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_code_decodes_to_the_ocp_value),
        cmocka_unit_test(test_sweep_encodes_like_both_references),
        cmocka_unit_test(test_group_scales_tensorwise_rowwise_and_blocks),
        cmocka_unit_test(test_amax_negatives_nan_inf_and_zeros),
        cmocka_unit_test(test_finite_inputs_never_become_nan_or_inf),
        cmocka_unit_test(test_transpose),
        cmocka_unit_test(test_bad_arguments_are_errors),
        cmocka_unit_test(test_speed_16m_floats_2_threads),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
