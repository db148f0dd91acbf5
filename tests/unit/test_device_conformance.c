/* test_device_conformance: the contract of ctitan/device.h, run against any device plugin.
 *
 * Usage:
 *     build/tests/test_device_conformance                      # build/plugins/ctitan-cpu.so
 *     BUILD=build-san build/tests/test_device_conformance      # build-san/plugins/ctitan-cpu.so
 *     CT_DEVICE_PLUGIN=path/to/ctitan-mydev.so build/tests/test_device_conformance
 *
 * Environment:
 *     CT_DEVICE_PLUGIN   the .so to test (default $BUILD/plugins/ctitan-cpu.so, BUILD default "build")
 *     CT_DEVICE_OPTIONS  plugin options as key=value,key=value (default: the defaults the plugin's
 *                        option spec declares), e.g. CT_DEVICE_OPTIONS=threads=1
 *     CT_DEVICE_RTOL     tolerance, relative to each tensor's largest magnitude (default 1e-4)
 *     CT_CONFORMANCE_ONLY  GLOB[,GLOB...]: only the tests whose names match one (e.g. '*matmul*')
 *
 * What it checks:
 *   - the entry symbol fills ct_plugin_info: kind CT_KIND_DEVICE, the same ABI major, a name, an
 *     option spec ending in a NULL key, an API table whose struct_size covers ABI 1.0 and whose
 *     required functions are all set;
 *   - create/info/destroy, alloc (64-byte aligned), copy in every direction, zero;
 *   - every op, through the plugin's own memory (alloc + copy, so a GPU plugin is tested the same
 *     way), against naive double-precision references written here; backward ops must ADD into
 *     gradients that already hold values;
 *   - bad arguments (out-of-range ids and targets, GQA head counts) return CT_ERR_INVALID with a
 *     message, and do not crash;
 *   - determinism: the same op run twice on the same inputs gives the same bits;
 *   - the optional float8 ops of ABI 1.2 (amax, quantize_fp8, dequantize_fp8, transpose), when the
 *     table's struct_size covers them and they are not NULL: every code decodes to its OCP FP8
 *     value, casts round to nearest even and saturate, group scales (tensorwise, rowwise, blocks
 *     of 32), amax with NaN, bad groups and formats are errors. (tests/unit/test_fp8.c checks the
 *     CPU plugin's casts against CUDA's and ml_dtypes' tables.)
 *   - the optional tensor-parallel ops of ABI 1.3, each when the table covers it and it is not
 *     NULL: embedding over a table shard (ids below, inside and above it), cross-entropy over
 *     logits split into 1 to 3 column shards (the stats merged here as a host would, the loss
 *     and the side-by-side gradients against the full-row ops), copy_2d of strided blocks;
 *     their bad sizes are errors and their results are deterministic.
 *   - the optional ops of ABI 1.4: matmul_fp8 and matmul_fp8_rows (tensor-wide and per-row scales,
 *     the format pairs of the three training GEMMs against the codes decoded here; what a device
 *     cannot run must say so with CT_ERR_UNSUPPORTED), set_matmul_dtype (bf16 operands against a reference of bf16-rounded
 *     operands, and provably not the f32 result; back to exact f32), share_stream (ops go on).
 *   - the optional ops of ABI 1.5: sum_to_device (the f32 of `sum`), cross_entropy_backward_dev
 *     (the bits of cross_entropy_backward), and graph capture: captured work does not run until
 *     launched, a launch gives the eager bits, again on new inputs; memory allocated after a
 *     capture survives launches (the graph's scratch stays its own); a copy to the host, a sum or
 *     a synchronize during a capture is refused and the capture with it; eager work goes on.
 *   - the optional elementwise ops of ABI 2.1 (ew_axpby, ew_mul, ew_div, ew_sqrt, ew_sign,
 *     ew_clamp, ew_greater): equal to the same f32 expression evaluated here, over inputs with
 *     zeros, infinities and NaNs, with out a separate buffer and out aliasing each input; a NaN
 *     passes through sign and clamp; n = 0 with NULL pointers is a no-op; n < 0 is an error.
 *   - the optional context-parallel ops of ABI 2.3: rope_*_pos at pos = 0..t-1, at an offset and at
 *     context parallel's shuffled chunks equal the rows of a longer rope; attention_block_forward
 *     at positions 0..t-1 is attention_forward (out, lse), and its backward attention_backward;
 *     a sequence split over 2 to 4 ranks in load-balanced chunks (shuffled within a rank too),
 *     blocks merged by attention_merge, equals attention_forward's rows to 1e-5, and the block
 *     backwards summed equal attention_backward's (GQA, b > 1); a query that sees no key gets
 *     out 0 and lse -inf and no gradient; merge with -inf on either side; the same bits twice.
 *   - the optional scaled-RoPE ops of ABI 2.4: rope_freqs_* with the plain table theta^(-2i/d)
 *     equal rope_*; with a Llama 3.1-style scaled table, without and with (shuffled) positions,
 *     they rotate pair i by (float)p * inv_freq[i] (cos/sin in double here), and backward
 *     accumulates R^T dout; odd d and a NULL table are refused.
 *   - the general ops of ABI 2.23 (the narrow ops above reach them through the host's layer): the
 *     cases that agree on their inputs give the same bits (dloss in device memory or by value, for
 *     whole rows and for a shard with its lse; positions 0..t-1 or none; strict or the whole range),
 *     strict embedding refuses an id outside the table and the range zeroes its row.
 *   - the optional mixture-of-experts ops of ABI 2.14: router scores (softmax, sigmoid) and their
 *     backward; top-k against a sort-based reference (ties to the lower index, a bias that moves
 *     the choice but not the weights, group-limited routing, normalised and scaled weights) and its
 *     backward; the stable permutation with an expert nobody chose, n*k prime and indices no
 *     expert owns; gather, combine and the three grouped GEMMs (an empty segment, rows in no
 *     segment, shapes across tiles) with accumulating backwards; the layer composed, twice for bits.
 *
 * The harness brings its own minimal ct_host (log, set_error, memory, option getters answered
 * from the spec) and runs the plugin as the host does, behind the argument checks the host puts in
 * front of every device (core/host/devcheck.c: the bad-argument tests above are answered there or
 * in the plugin, wherever the host's run would answer them). Of the core it needs that one file,
 * which needs only the SDK, so a third party can build and run it alone:
 *     cc -std=c11 -D_GNU_SOURCE -Isdk/include -Icore tests/unit/test_device_conformance.c core/host/devcheck.c \
 *         -lcmocka -ldl -lm
 */
#include "ctitan/abi.h"
#include "ctitan/device.h"
#include "ctitan/host.h"
#include "ctitan/util.h"
#include "host/devcheck.h"

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

/* ---------------------------------------------------------------- the minimal host */

static char last_error[1024];
static const ct_option_spec *plugin_options;

static void host_log(const ct_host *h, ct_log_level level, const char *fmt, ...)
{
    (void)h;
    if (!getenv("CT_CONFORMANCE_VERBOSE") && level < CT_LOG_WARN)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "plugin log: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

static void host_set_error(const ct_host *h, const char *fmt, ...)
{
    (void)h;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
}

static void *host_mem_alloc(const ct_host *h, size_t bytes, ct_mem_category cat)
{
    (void)h;
    (void)cat;
    return aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
}

static void host_mem_free(const ct_host *h, void *p)
{
    (void)h;
    free(p);
}

static void host_mem_account(const ct_host *h, ct_mem_category cat, int64_t delta)
{
    (void)h;
    (void)cat;
    (void)delta;
}

/* The option's text: an override from CT_DEVICE_OPTIONS, else the spec's default. NULL when the
 * key is unset; *known = 0 when the spec does not declare it (a plugin bug). */
static const char *host_option_text(const char *key, ct_opt_type type, int *known)
{
    static char value[256];
    *known = 0;
    const ct_option_spec *spec = NULL;
    for (const ct_option_spec *o = plugin_options; o && o->key; o++)
        if (strcmp(o->key, key) == 0)
            spec = o;
    if (!spec || spec->type != type)
        return NULL;
    *known = 1;
    const char *env = getenv("CT_DEVICE_OPTIONS");
    size_t klen = strlen(key);
    for (const char *p = env; p && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > klen && strncmp(p, key, klen) == 0 && p[klen] == '=' &&
            len - klen - 1 < sizeof value) {
            memcpy(value, p + klen + 1, len - klen - 1);
            value[len - klen - 1] = '\0';
            return value;
        }
        p = end ? end + 1 : NULL;
    }
    return spec->default_value;
}

static ct_status host_opt_int(const ct_host *h, const char *key, int64_t *out)
{
    (void)h;
    int known;
    const char *s = host_option_text(key, CT_OPT_INT, &known);
    if (!known)
        return CT_ERR_INTERNAL;
    if (!s)
        return CT_ERR_INVALID;
    *out = strtoll(s, NULL, 10);
    return CT_OK;
}

static ct_status host_opt_float(const ct_host *h, const char *key, double *out)
{
    (void)h;
    int known;
    const char *s = host_option_text(key, CT_OPT_FLOAT, &known);
    if (!known)
        return CT_ERR_INTERNAL;
    if (!s)
        return CT_ERR_INVALID;
    *out = strtod(s, NULL);
    return CT_OK;
}

static ct_status host_opt_bool(const ct_host *h, const char *key, int *out)
{
    (void)h;
    int known;
    const char *s = host_option_text(key, CT_OPT_BOOL, &known);
    if (!known)
        return CT_ERR_INTERNAL;
    if (!s)
        return CT_ERR_INVALID;
    *out = strcmp(s, "true") == 0 || strcmp(s, "1") == 0;
    return CT_OK;
}

static ct_status host_opt_string(const ct_host *h, const char *key, const char **out)
{
    (void)h;
    int known;
    const char *s = host_option_text(key, CT_OPT_STRING, &known);
    if (!known)
        return CT_ERR_INTERNAL;
    if (!s)
        return CT_ERR_INVALID;
    *out = s;
    return CT_OK;
}

static void host_trace(const ct_host *h, const char *name)
{
    (void)h;
    (void)name;
}

static const ct_host test_host = {
    .struct_size = sizeof(ct_host),
    .abi_major = CT_ABI_MAJOR,
    .abi_minor = CT_ABI_MINOR,
    .log = host_log,
    .set_error = host_set_error,
    .mem_alloc = host_mem_alloc,
    .mem_free = host_mem_free,
    .mem_account = host_mem_account,
    .opt_int = host_opt_int,
    .opt_float = host_opt_float,
    .opt_bool = host_opt_bool,
    .opt_string = host_opt_string,
    .trace_begin = host_trace,
    .trace_end = host_trace,
};

/* ---------------------------------------------------------------- the plugin under test */

static void *so;
static ct_plugin_info info;
static const ct_device_api *api;
static ct_device *dev;
static double rtol = 1e-4;

static int load_plugin(void **state)
{
    (void)state;
    char path[4096];
    const char *env = getenv("CT_DEVICE_PLUGIN"), *build = getenv("BUILD");
    if (env)
        snprintf(path, sizeof path, "%s", env);
    else
        snprintf(path, sizeof path, "%s/plugins/ctitan-cpu.so", build && *build ? build : "build");
    if (getenv("CT_DEVICE_RTOL"))
        rtol = strtod(getenv("CT_DEVICE_RTOL"), NULL);
    so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        fprintf(stderr, "cannot load %s: %s\n", path, dlerror());
        return -1;
    }
    ct_plugin_entry_fn entry;
    *(void **)&entry = dlsym(so, CT_PLUGIN_ENTRY_NAME);
    if (!entry) {
        fprintf(stderr, "%s exports no %s\n", path, CT_PLUGIN_ENTRY_NAME);
        return -1;
    }
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (entry(&test_host, &info) != CT_OK) {
        fprintf(stderr, "%s: entry failed: %s\n", path, last_error);
        return -1;
    }
    if (info.kind != CT_KIND_DEVICE || info.abi_major != CT_ABI_MAJOR || !info.api) {
        fprintf(stderr, "%s: not a device plugin of ABI %d\n", path, CT_ABI_MAJOR);
        return -1;
    }
    plugin_options = info.options;
    api = devcheck_wrap(info.api, &test_host); /* as the host runs a device: behind its argument checks */
    if (!api->create || api->create(&test_host, &dev) != CT_OK || !dev) {
        fprintf(stderr, "%s: create failed: %s\n", path, last_error);
        return -1;
    }
    return 0;
}

static int unload_plugin(void **state)
{
    (void)state;
    if (api && dev)
        api->destroy(dev);
    if (so)
        dlclose(so);
    return 0;
}

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static uint64_t rnd_u64(void) /* splitmix64 */
{
    return ct_util_splitmix64_next(&rng_state);
}

/* uniform in [-scale, scale) */
static float *host_rand(int64_t n, double scale)
{
    float *x = malloc((size_t)n * sizeof *x + 4);
    assert_non_null(x);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(scale * ((double)(rnd_u64() >> 11) / 4503599627370496.0 - 1.0));
    return x;
}

static double *ref_alloc(int64_t n)
{
    double *x = calloc((size_t)n + 1, sizeof *x);
    assert_non_null(x);
    return x;
}

/* device buffer holding a copy of `host` (n bytes); host NULL leaves it zeroed */
static void *dev_upload(const void *host, size_t bytes)
{
    void *p = NULL;
    assert_int_equal(api->alloc(dev, bytes, &p), CT_OK);
    assert_non_null(p);
    if (host && bytes)
        assert_int_equal(api->copy(dev, p, host, bytes, CT_COPY_H2D), CT_OK);
    else if (bytes)
        assert_int_equal(api->zero(dev, p, bytes), CT_OK);
    return p;
}

static float *dev_floats(const float *host, int64_t n)
{
    return dev_upload(host, (size_t)n * sizeof(float));
}

static float *download(const float *d, int64_t n)
{
    float *h = malloc((size_t)n * sizeof *h + 4);
    assert_non_null(h);
    assert_int_equal(api->copy(dev, h, d, (size_t)n * sizeof *h, CT_COPY_D2H), CT_OK);
    assert_int_equal(api->synchronize(dev), CT_OK);
    return h;
}

/* Device result vs reference: |got - ref| <= rtol * max(1e-3, max|ref|) everywhere. */
static void expect_close(const char *what, const float *dgot, const double *ref, int64_t n)
{
    float *got = download(dgot, n);
    double scale = 1e-3;
    for (int64_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - ref[i]) <= rtol * scale)) {
            double g = got[i];
            free(got);
            fail_msg("%s[%lld] = %.9g, reference %.9g (tolerance %.3g)", what, (long long)i, g,
                     ref[i], rtol * scale);
        }
    free(got);
}

/* A gradient buffer that already holds values, to check that backward adds into it. */
typedef struct grad_buf {
    float *init; /* host copy of the starting values */
    float *dev;
    double *ref; /* starts at init; the reference adds into it */
    int64_t n;
} grad_buf;

static grad_buf grad_new(int64_t n)
{
    grad_buf g = {host_rand(n, 0.5), NULL, ref_alloc(n), n};
    g.dev = dev_floats(g.init, n);
    for (int64_t i = 0; i < n; i++)
        g.ref[i] = g.init[i];
    return g;
}

static void grad_check_free(const char *what, grad_buf *g)
{
    expect_close(what, g->dev, g->ref, g->n);
    api->free(dev, g->dev);
    free(g->init);
    free(g->ref);
}

static void expect_error(ct_status got, ct_status want, const char *what)
{
    if (got != want)
        fail_msg("%s: status %d, expected %d", what, (int)got, (int)want);
    if (want != CT_OK && last_error[0] == '\0')
        fail_msg("%s: error %d without a message through host->set_error", what, (int)got);
    last_error[0] = '\0';
}

/* ---------------------------------------------------------------- plugin, lifecycle, memory */

static void test_plugin_info(void **state)
{
    (void)state;
    assert_int_equal(info.kind, CT_KIND_DEVICE);
    assert_int_equal(info.abi_major, CT_ABI_MAJOR);
    assert_non_null(info.name);
    assert_non_null(info.description);
    assert_true(api->struct_size >= offsetof(ct_device_api, round_bf16) + sizeof(void *));
    for (const ct_option_spec *o = info.options; o && o->key; o++) {
        assert_true(o->struct_size >= sizeof(ct_option_spec));
        assert_true(o->type >= CT_OPT_INT && o->type <= CT_OPT_BOOL);
    }
    /* every function but measure_peak_flops is required */
    const void *required[] = {
        (void *)api->create,
        (void *)api->destroy,
        (void *)api->info,
        (void *)api->alloc,
        (void *)api->free,
        (void *)api->copy,
        (void *)api->zero,
        (void *)api->synchronize,
        (void *)api->matmul,
        (void *)api->axpy,
        (void *)api->add,
        (void *)api->scale,
        (void *)api->sum,
        (void *)api->sum_squares,
        (void *)api->embedding_forward,
        (void *)api->embedding_backward,
        (void *)api->rmsnorm_forward,
        (void *)api->rmsnorm_backward_input,
        (void *)api->rmsnorm_backward_weight,
        (void *)api->layernorm_forward,
        (void *)api->layernorm_backward_input,
        (void *)api->layernorm_backward_weight,
        (void *)api->bias_forward,
        (void *)api->bias_backward,
        (void *)api->rope_forward,
        (void *)api->rope_backward,
        (void *)api->attention_forward,
        (void *)api->attention_backward,
        (void *)api->swiglu_forward,
        (void *)api->swiglu_backward,
        (void *)api->gelu_forward,
        (void *)api->gelu_backward,
        (void *)api->cross_entropy_forward,
        (void *)api->cross_entropy_backward,
        (void *)api->adamw,
        (void *)api->cast_f32_to_bf16,
        (void *)api->cast_bf16_to_f32,
        (void *)api->round_bf16,
    };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (!required[i])
            fail_msg("required function %zu of ct_device_api is NULL", i);
}

static void test_info_and_peak_flops(void **state)
{
    (void)state;
    ct_device_info di;
    memset(&di, 0, sizeof di);
    di.struct_size = sizeof di;
    assert_int_equal(api->info(dev, &di), CT_OK);
    assert_non_null(di.name);
    assert_true(di.threads >= 1);
    assert_true(di.memory_bytes >= 0);
    if (api->measure_peak_flops) {
        double flops = 0;
        assert_int_equal(api->measure_peak_flops(dev, &flops), CT_OK);
        assert_true(flops > 1e8 && flops < 1e18);
        fprintf(stderr, "%s: %d threads, peak %.1f GFLOP/s\n", di.name, di.threads, flops / 1e9);
    }
}

static void test_memory_alloc_copy_zero(void **state)
{
    (void)state;
    const size_t sizes[] = {0, 1, 63, 64, 1000, 1 << 20};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        unsigned char *src = malloc(n + 1), *back = malloc(n + 1);
        assert_true(src && back);
        for (size_t i = 0; i < n; i++)
            src[i] = (unsigned char)(rnd_u64() | 1u);
        void *a = NULL, *b = NULL;
        assert_int_equal(api->alloc(dev, n, &a), CT_OK);
        assert_int_equal(api->alloc(dev, n, &b), CT_OK);
        if (n == 0) { /* any pointer (NULL included) that free accepts */
            api->free(dev, a);
            api->free(dev, b);
            free(src);
            free(back);
            continue;
        }
        assert_true(a != NULL && b != NULL);
        assert_int_equal((uintptr_t)a % 64, 0);
        assert_int_equal((uintptr_t)b % 64, 0);
        assert_int_equal(api->copy(dev, a, src, n, CT_COPY_H2D), CT_OK);
        assert_int_equal(api->copy(dev, b, a, n, CT_COPY_D2D), CT_OK);
        assert_int_equal(api->copy(dev, back, b, n, CT_COPY_D2H), CT_OK);
        assert_int_equal(api->synchronize(dev), CT_OK);
        assert_memory_equal(back, src, n);
        assert_int_equal(api->zero(dev, b, n), CT_OK);
        assert_int_equal(api->copy(dev, back, b, n, CT_COPY_D2H), CT_OK);
        assert_int_equal(api->synchronize(dev), CT_OK);
        for (size_t i = 0; i < n; i++)
            assert_int_equal(back[i], 0);
        api->free(dev, a);
        api->free(dev, b);
        free(src);
        free(back);
    }
}

/* ---------------------------------------------------------------- dense algebra */

static void test_matmul_against_reference(void **state)
{
    (void)state;
    const int64_t m = 37, n = 29, k = 53;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int bi = 0; bi < 2; bi++) {
                float alpha = 0.75f, beta = bi ? 0.5f : 0.0f;
                float *a = host_rand(m * k, 1), *b = host_rand(k * n, 1), *c = host_rand(m * n, 1);
                double *ref = ref_alloc(m * n);
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < n; j++) {
                        double s = 0;
                        for (int64_t p = 0; p < k; p++)
                            s += (double)(ta ? a[p * m + i] : a[i * k + p]) *
                                 (double)(tb ? b[j * k + p] : b[p * n + j]);
                        ref[i * n + j] = alpha * s + (bi ? beta * (double)c[i * n + j] : 0.0);
                    }
                if (!bi)
                    c[0] = NAN; /* beta 0 ignores c */
                float *da = dev_floats(a, m * k), *db = dev_floats(b, k * n),
                      *dc = dev_floats(c, m * n);
                assert_int_equal(api->matmul(dev, dc, da, db, m, n, k, ta, tb, alpha, beta), CT_OK);
                expect_close(ta ? (tb ? "matmul TT" : "matmul TN")
                                : (tb ? "matmul NT" : "matmul NN"),
                             dc, ref, m * n);
                api->free(dev, da);
                api->free(dev, db);
                api->free(dev, dc);
                free(a);
                free(b);
                free(c);
                free(ref);
            }
}

static void test_vector_ops(void **state)
{
    (void)state;
    const int64_t n = 100003; /* odd, and past any parallel threshold */
    float *x = host_rand(n, 1), *y = host_rand(n, 1);
    double *ref = ref_alloc(n);
    float *dx = dev_floats(x, n), *dy = dev_floats(y, n);

    for (int64_t i = 0; i < n; i++)
        ref[i] = (double)y[i] + 0.25 * (double)x[i];
    assert_int_equal(api->axpy(dev, dy, dx, 0.25f, n), CT_OK);
    expect_close("axpy", dy, ref, n);

    for (int64_t i = 0; i < n; i++)
        ref[i] = (double)(float)ref[i] + (double)x[i];
    assert_int_equal(api->add(dev, dy, dy, dx, n), CT_OK); /* out aliases a */
    expect_close("add", dy, ref, n);

    for (int64_t i = 0; i < n; i++)
        ref[i] *= -3.0;
    assert_int_equal(api->scale(dev, dy, -3.0f, n), CT_OK);
    expect_close("scale", dy, ref, n);

    double s = 0, ss = 0, got = 0;
    for (int64_t i = 0; i < n; i++) {
        s += x[i];
        ss += (double)x[i] * x[i];
    }
    assert_int_equal(api->sum(dev, &got, dx, n), CT_OK);
    assert_true(fabs(got - s) < 1e-9 * n);
    assert_int_equal(api->sum_squares(dev, &got, dx, n), CT_OK);
    assert_true(fabs(got - ss) < 1e-9 * ss);

    api->free(dev, dx);
    api->free(dev, dy);
    free(x);
    free(y);
    free(ref);
}

/* ---------------------------------------------------------------- embedding */

static void test_embedding(void **state)
{
    (void)state;
    const int64_t n = 50, c = 67, vocab = 13;
    int32_t ids[50];
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)(rnd_u64() % (uint64_t)vocab); /* many repeats */
    float *table = host_rand(vocab * c, 1), *dout = host_rand(n * c, 1);
    int32_t *dids = dev_upload(ids, sizeof ids);
    float *dtable = dev_floats(table, vocab * c), *ddout = dev_floats(dout, n * c);
    float *dout_dev = dev_floats(NULL, n * c);
    double *ref = ref_alloc(n * c);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < c; j++)
            ref[i * c + j] = table[ids[i] * c + j];
    assert_int_equal(api->embedding_forward(dev, dout_dev, dids, dtable, n, c, vocab), CT_OK);
    expect_close("embedding_forward", dout_dev, ref, n * c);

    grad_buf g = grad_new(vocab * c);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < c; j++)
            g.ref[ids[i] * c + j] += dout[i * c + j];
    assert_int_equal(api->embedding_backward(dev, g.dev, dids, ddout, n, c, vocab), CT_OK);
    grad_check_free("embedding_backward dtable", &g);

    /* an id outside [0, vocab) */
    int32_t bad[3] = {0, (int32_t)vocab, 1};
    int32_t *dbad = dev_upload(bad, sizeof bad);
    expect_error(api->embedding_forward(dev, dout_dev, dbad, dtable, 3, c, vocab), CT_ERR_INVALID,
                 "embedding_forward with id == vocab");
    bad[1] = -1;
    assert_int_equal(api->copy(dev, dbad, bad, sizeof bad, CT_COPY_H2D), CT_OK);
    expect_error(api->embedding_backward(dev, dtable, dbad, ddout, 3, c, vocab), CT_ERR_INVALID,
                 "embedding_backward with id -1");

    api->free(dev, dbad);
    api->free(dev, dids);
    api->free(dev, dtable);
    api->free(dev, ddout);
    api->free(dev, dout_dev);
    free(table);
    free(dout);
    free(ref);
}

/* ---------------------------------------------------------------- norms, bias */

static void test_rmsnorm(void **state)
{
    (void)state;
    const int64_t n = 33, c = 96;
    const float eps = 1e-5f;
    float *x = host_rand(n * c, 2), *w = host_rand(c, 1), *dout = host_rand(n * c, 1);
    float *dx_ = dev_floats(x, n * c), *dw_ = dev_floats(w, c), *ddout = dev_floats(dout, n * c);
    float *dout_dev = dev_floats(NULL, n * c), *drstd = dev_floats(NULL, n);
    double *ref = ref_alloc(n * c), *rstd = ref_alloc(n);
    for (int64_t i = 0; i < n; i++) {
        double ms = 0;
        for (int64_t j = 0; j < c; j++)
            ms += (double)x[i * c + j] * x[i * c + j];
        rstd[i] = 1.0 / sqrt(ms / c + eps);
        for (int64_t j = 0; j < c; j++)
            ref[i * c + j] = x[i * c + j] * rstd[i] * w[j];
    }
    assert_int_equal(api->rmsnorm_forward(dev, dout_dev, drstd, dx_, dw_, n, c, eps), CT_OK);
    expect_close("rmsnorm_forward out", dout_dev, ref, n * c);
    expect_close("rmsnorm_forward rstd", drstd, rstd, n);

    grad_buf gx = grad_new(n * c), gw = grad_new(c);
    for (int64_t i = 0; i < n; i++) {
        double dot = 0;
        for (int64_t j = 0; j < c; j++)
            dot += (double)dout[i * c + j] * w[j] * x[i * c + j];
        for (int64_t j = 0; j < c; j++) {
            gx.ref[i * c + j] += rstd[i] * w[j] * dout[i * c + j] -
                                 x[i * c + j] * rstd[i] * rstd[i] * rstd[i] * dot / c;
            gw.ref[j] += (double)dout[i * c + j] * x[i * c + j] * rstd[i];
        }
    }
    assert_int_equal(api->rmsnorm_backward_input(dev, gx.dev, ddout, dx_, dw_, drstd, n, c), CT_OK);
    assert_int_equal(api->rmsnorm_backward_weight(dev, gw.dev, ddout, dx_, drstd, n, c), CT_OK);
    grad_check_free("rmsnorm dx", &gx);
    grad_check_free("rmsnorm dw", &gw);

    api->free(dev, dx_);
    api->free(dev, dw_);
    api->free(dev, ddout);
    api->free(dev, dout_dev);
    api->free(dev, drstd);
    free(x);
    free(w);
    free(dout);
    free(ref);
    free(rstd);
}

static void layernorm_case(int with_bias)
{
    const int64_t n = 21, c = 80;
    const float eps = 1e-5f;
    float *x = host_rand(n * c, 2), *w = host_rand(c, 1), *b = host_rand(c, 1),
          *dout = host_rand(n * c, 1);
    for (int64_t j = 0; j < n * c; j++)
        x[j] += 3.0f; /* a mean far from zero */
    float *dx_ = dev_floats(x, n * c), *dw_ = dev_floats(w, c), *db_ = dev_floats(b, c);
    float *ddout = dev_floats(dout, n * c), *dout_dev = dev_floats(NULL, n * c);
    float *dmean = dev_floats(NULL, n), *drstd = dev_floats(NULL, n);
    double *ref = ref_alloc(n * c), *mean = ref_alloc(n), *rstd = ref_alloc(n);
    for (int64_t i = 0; i < n; i++) {
        double s = 0, v = 0;
        for (int64_t j = 0; j < c; j++)
            s += x[i * c + j];
        mean[i] = s / c;
        for (int64_t j = 0; j < c; j++)
            v += (x[i * c + j] - mean[i]) * (x[i * c + j] - mean[i]);
        rstd[i] = 1.0 / sqrt(v / c + eps);
        for (int64_t j = 0; j < c; j++)
            ref[i * c + j] = (x[i * c + j] - mean[i]) * rstd[i] * w[j] + (with_bias ? b[j] : 0.0);
    }
    assert_int_equal(api->layernorm_forward(dev, dout_dev, dmean, drstd, dx_, dw_,
                                            with_bias ? db_ : NULL, n, c, eps),
                     CT_OK);
    expect_close("layernorm_forward out", dout_dev, ref, n * c);
    expect_close("layernorm_forward mean", dmean, mean, n);
    expect_close("layernorm_forward rstd", drstd, rstd, n);

    grad_buf gx = grad_new(n * c), gw = grad_new(c), gb = grad_new(c);
    for (int64_t i = 0; i < n; i++) {
        double m1 = 0, m2 = 0;
        for (int64_t j = 0; j < c; j++) {
            double xhat = (x[i * c + j] - mean[i]) * rstd[i], gwj = (double)dout[i * c + j] * w[j];
            m1 += gwj / c;
            m2 += gwj * xhat / c;
        }
        for (int64_t j = 0; j < c; j++) {
            double xhat = (x[i * c + j] - mean[i]) * rstd[i];
            gx.ref[i * c + j] += rstd[i] * ((double)dout[i * c + j] * w[j] - m1 - xhat * m2);
            gw.ref[j] += (double)dout[i * c + j] * xhat;
            if (with_bias)
                gb.ref[j] += dout[i * c + j];
        }
    }
    assert_int_equal(
        api->layernorm_backward_input(dev, gx.dev, ddout, dx_, dw_, dmean, drstd, n, c), CT_OK);
    assert_int_equal(api->layernorm_backward_weight(dev, gw.dev, with_bias ? gb.dev : NULL, ddout,
                                                    dx_, dmean, drstd, n, c),
                     CT_OK);
    grad_check_free("layernorm dx", &gx);
    grad_check_free("layernorm dw", &gw);
    grad_check_free("layernorm db", &gb); /* untouched without a bias */

    float *bufs[] = {dx_, dw_, db_, ddout, dout_dev, dmean, drstd};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        api->free(dev, bufs[i]);
    free(x);
    free(w);
    free(b);
    free(dout);
    free(ref);
    free(mean);
    free(rstd);
}

static void test_layernorm_with_bias(void **state)
{
    (void)state;
    layernorm_case(1);
}

static void test_layernorm_without_bias(void **state)
{
    (void)state;
    layernorm_case(0);
}

static void test_bias(void **state)
{
    (void)state;
    const int64_t n = 40, c = 75;
    float *x = host_rand(n * c, 1), *bias = host_rand(c, 1), *dout = host_rand(n * c, 1);
    float *dx_ = dev_floats(x, n * c), *dbias = dev_floats(bias, c),
          *ddout = dev_floats(dout, n * c);
    double *ref = ref_alloc(n * c);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < c; j++)
            ref[i * c + j] = (double)x[i * c + j] + bias[j];
    assert_int_equal(api->bias_forward(dev, dx_, dx_, dbias, n, c), CT_OK); /* in place */
    expect_close("bias_forward", dx_, ref, n * c);

    grad_buf g = grad_new(c);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < c; j++)
            g.ref[j] += dout[i * c + j];
    assert_int_equal(api->bias_backward(dev, g.dev, ddout, n, c), CT_OK);
    grad_check_free("bias_backward", &g);

    api->free(dev, dx_);
    api->free(dev, dbias);
    api->free(dev, ddout);
    free(x);
    free(bias);
    free(dout);
    free(ref);
}

/* ---------------------------------------------------------------- rope */

static void rope_reference(double *out, const float *x, int64_t b, int64_t t, int64_t h, int64_t d,
                           double theta, double sign)
{
    for (int64_t bi = 0; bi < b; bi++)
        for (int64_t p = 0; p < t; p++)
            for (int64_t hh = 0; hh < h; hh++)
                for (int64_t i = 0; i < d / 2; i++) {
                    double a = sign * (double)p * pow(theta, -2.0 * (double)i / (double)d);
                    int64_t o = ((bi * t + p) * h + hh) * d + 2 * i;
                    out[o] = x[o] * cos(a) - x[o + 1] * sin(a);
                    out[o + 1] = x[o] * sin(a) + x[o + 1] * cos(a);
                }
}

static void test_rope(void **state)
{
    (void)state;
    const int64_t b = 2, t = 23, h = 3, d = 16, n = b * t * h * d;
    const float theta = 10000.0f;
    float *x = host_rand(n, 1), *dout = host_rand(n, 1);
    float *dx_ = dev_floats(x, n), *ddout = dev_floats(dout, n);
    double *ref = ref_alloc(n);
    rope_reference(ref, x, b, t, h, d, theta, 1.0);
    assert_int_equal(api->rope_forward(dev, dx_, dx_, b, t, h, d, theta), CT_OK); /* in place */
    expect_close("rope_forward", dx_, ref, n);

    grad_buf g = grad_new(n);
    double *back = ref_alloc(n);
    rope_reference(back, dout, b, t, h, d, theta, -1.0); /* R^T = rotation by -angle */
    for (int64_t i = 0; i < n; i++)
        g.ref[i] += back[i];
    assert_int_equal(api->rope_backward(dev, g.dev, ddout, b, t, h, d, theta), CT_OK);
    grad_check_free("rope_backward", &g);

    expect_error(api->rope_forward(dev, dx_, dx_, b, t, h, 5, theta), CT_ERR_INVALID,
                 "rope with odd d");

    api->free(dev, dx_);
    api->free(dev, ddout);
    free(x);
    free(dout);
    free(ref);
    free(back);
}

/* ---------------------------------------------------------------- attention */

/* Naive causal GQA attention in double: out, lse, and the gradients added into gq/gk/gv. */
static void attention_reference(double *out, double *lse, double *gq, double *gk, double *gv,
                                const float *q, const float *k, const float *v, const float *dout,
                                int64_t b, int64_t t, int64_t h, int64_t kvh, int64_t d)
{
    double scale = 1.0 / sqrt((double)d);
    double *p = ref_alloc(t), *dp = ref_alloc(t);
    for (int64_t bi = 0; bi < b; bi++)
        for (int64_t hi = 0; hi < h; hi++) {
            int64_t kh = hi / (h / kvh);
            for (int64_t i = 0; i < t; i++) {
                const float *qi = q + ((bi * t + i) * h + hi) * d;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const float *kj = k + ((bi * t + j) * kvh + kh) * d;
                    double s = 0;
                    for (int64_t c = 0; c < d; c++)
                        s += (double)qi[c] * kj[c];
                    p[j] = s * scale;
                    mx = fmax(mx, p[j]);
                }
                for (int64_t j = 0; j <= i; j++)
                    sum += exp(p[j] - mx);
                lse[(bi * h + hi) * t + i] = mx + log(sum);
                for (int64_t j = 0; j <= i; j++)
                    p[j] = exp(p[j] - mx) / sum;
                double *oi = out + ((bi * t + i) * h + hi) * d;
                const float *doi = dout + ((bi * t + i) * h + hi) * d;
                for (int64_t c = 0; c < d; c++) {
                    oi[c] = 0;
                    for (int64_t j = 0; j <= i; j++)
                        oi[c] += p[j] * v[((bi * t + j) * kvh + kh) * d + c];
                }
                /* backward of this row */
                double di = 0;
                for (int64_t c = 0; c < d; c++)
                    di += doi[c] * oi[c];
                for (int64_t j = 0; j <= i; j++) {
                    const float *vj = v + ((bi * t + j) * kvh + kh) * d;
                    dp[j] = 0;
                    for (int64_t c = 0; c < d; c++)
                        dp[j] += doi[c] * vj[c];
                    double ds = p[j] * (dp[j] - di) * scale;
                    const float *kj = k + ((bi * t + j) * kvh + kh) * d;
                    for (int64_t c = 0; c < d; c++) {
                        gq[((bi * t + i) * h + hi) * d + c] += ds * kj[c];
                        gk[((bi * t + j) * kvh + kh) * d + c] += ds * qi[c];
                        gv[((bi * t + j) * kvh + kh) * d + c] += p[j] * doi[c];
                    }
                }
            }
        }
    free(p);
    free(dp);
}

static void attention_case(int64_t b, int64_t t, int64_t h, int64_t kvh, int64_t d)
{
    int64_t nq = b * t * h * d, nk = b * t * kvh * d;
    float *q = host_rand(nq, 1.5), *k = host_rand(nk, 1.5), *v = host_rand(nk, 1),
          *dout = host_rand(nq, 1);
    float *dq_ = dev_floats(q, nq), *dk_ = dev_floats(k, nk), *dv_ = dev_floats(v, nk);
    float *ddout = dev_floats(dout, nq), *dout_dev = dev_floats(NULL, nq),
          *dlse = dev_floats(NULL, b * h * t);
    double *out = ref_alloc(nq), *lse = ref_alloc(b * h * t);
    grad_buf gq = grad_new(nq), gk = grad_new(nk), gv = grad_new(nk);
    attention_reference(out, lse, gq.ref, gk.ref, gv.ref, q, k, v, dout, b, t, h, kvh, d);

    assert_int_equal(api->attention_forward(dev, dout_dev, dlse, dq_, dk_, dv_, b, t, h, kvh, d),
                     CT_OK);
    expect_close("attention_forward out", dout_dev, out, nq);
    expect_close("attention_forward lse", dlse, lse, b * h * t);
    assert_int_equal(api->attention_backward(dev, gq.dev, gk.dev, gv.dev, ddout, dq_, dk_, dv_,
                                             dout_dev, dlse, b, t, h, kvh, d),
                     CT_OK);
    grad_check_free("attention dq", &gq);
    grad_check_free("attention dk", &gk);
    grad_check_free("attention dv", &gv);

    float *bufs[] = {dq_, dk_, dv_, ddout, dout_dev, dlse};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        api->free(dev, bufs[i]);
    free(q);
    free(k);
    free(v);
    free(dout);
    free(out);
    free(lse);
}

static void test_attention_gqa(void **state)
{
    (void)state;
    attention_case(2, 5, 4, 2, 6);
    attention_case(2, 77, 4, 2, 16); /* longer than a typical query block */
}

static void test_attention_mha_and_mqa(void **state)
{
    (void)state;
    attention_case(1, 40, 3, 3, 8);
    attention_case(2, 130, 2, 1, 8);
}

static void test_attention_rejects_bad_heads(void **state)
{
    (void)state;
    float *buf = dev_floats(NULL, 4 * 3 * 8);
    expect_error(api->attention_forward(dev, buf, buf, buf, buf, buf, 1, 4, 3, 2, 8),
                 CT_ERR_INVALID, "attention with h % kvh != 0");
    api->free(dev, buf);
}

/* ---------------------------------------------------------------- activations */

static void test_swiglu(void **state)
{
    (void)state;
    const int64_t n = 70001;
    float *a = host_rand(n, 6), *g = host_rand(n, 2), *dout = host_rand(n, 1);
    float *da_ = dev_floats(a, n), *dg_ = dev_floats(g, n), *ddout = dev_floats(dout, n),
          *dout_dev = dev_floats(NULL, n);
    double *ref = ref_alloc(n);
    grad_buf ga = grad_new(n), gg = grad_new(n);
    for (int64_t i = 0; i < n; i++) {
        double sig = 1.0 / (1.0 + exp(-(double)a[i]));
        ref[i] = a[i] * sig * g[i];
        ga.ref[i] += dout[i] * g[i] * sig * (1.0 + a[i] * (1.0 - sig));
        gg.ref[i] += dout[i] * a[i] * sig;
    }
    assert_int_equal(api->swiglu_forward(dev, dout_dev, da_, dg_, n), CT_OK);
    expect_close("swiglu_forward", dout_dev, ref, n);
    assert_int_equal(api->swiglu_backward(dev, ga.dev, gg.dev, ddout, da_, dg_, n), CT_OK);
    grad_check_free("swiglu da", &ga);
    grad_check_free("swiglu dg", &gg);
    api->free(dev, da_);
    api->free(dev, dg_);
    api->free(dev, ddout);
    api->free(dev, dout_dev);
    free(a);
    free(g);
    free(dout);
    free(ref);
}

static void test_gelu(void **state)
{
    (void)state;
    const int64_t n = 70001;
    const double k0 = sqrt(2.0 / 3.14159265358979323846), k1 = 0.044715;
    float *x = host_rand(n, 6), *dout = host_rand(n, 1);
    float *dx_ = dev_floats(x, n), *ddout = dev_floats(dout, n), *dout_dev = dev_floats(NULL, n);
    double *ref = ref_alloc(n);
    grad_buf gx = grad_new(n);
    for (int64_t i = 0; i < n; i++) {
        double xi = x[i], u = k0 * (xi + k1 * xi * xi * xi), th = tanh(u);
        ref[i] = 0.5 * xi * (1 + th);
        gx.ref[i] +=
            dout[i] * (0.5 * (1 + th) + 0.5 * xi * (1 - th * th) * k0 * (1 + 3 * k1 * xi * xi));
    }
    assert_int_equal(api->gelu_forward(dev, dout_dev, dx_, n), CT_OK);
    expect_close("gelu_forward", dout_dev, ref, n);
    assert_int_equal(api->gelu_backward(dev, gx.dev, ddout, dx_, n), CT_OK);
    grad_check_free("gelu dx", &gx);
    api->free(dev, dx_);
    api->free(dev, ddout);
    api->free(dev, dout_dev);
    free(x);
    free(dout);
    free(ref);
}

/* ---------------------------------------------------------------- cross-entropy */

static void test_cross_entropy(void **state)
{
    (void)state;
    const int64_t n = 31, v = 1001;
    const int32_t ignore = -100;
    const float dloss = 0.37f;
    float *logits = host_rand(n * v, 8);
    for (int64_t j = 0; j < v; j++)
        logits[3 * v + j] += 500.0f; /* large logits: the max must be subtracted */
    int32_t targets[31];
    for (int64_t i = 0; i < n; i++)
        targets[i] = i % 5 == 2 ? ignore : (int32_t)(rnd_u64() % (uint64_t)v);
    targets[0] = 0;
    targets[1] = (int32_t)v - 1;
    float *dlogits_in = dev_floats(logits, n * v), *dlosses = dev_floats(NULL, n);
    int32_t *dtargets = dev_upload(targets, sizeof targets);
    double *losses = ref_alloc(n);
    grad_buf g = grad_new(n * v);
    for (int64_t i = 0; i < n; i++) {
        if (targets[i] == ignore)
            continue;
        const float *x = logits + i * v;
        double mx = -INFINITY, s = 0;
        for (int64_t j = 0; j < v; j++)
            mx = fmax(mx, x[j]);
        for (int64_t j = 0; j < v; j++)
            s += exp(x[j] - mx);
        losses[i] = mx + log(s) - x[targets[i]];
        for (int64_t j = 0; j < v; j++)
            g.ref[i * v + j] += dloss * (exp(x[j] - mx) / s - (j == targets[i]));
    }
    assert_int_equal(api->cross_entropy_forward(dev, dlosses, dlogits_in, dtargets, n, v, ignore),
                     CT_OK);
    expect_close("cross_entropy_forward", dlosses, losses, n);
    assert_int_equal(
        api->cross_entropy_backward(dev, g.dev, dlogits_in, dtargets, dloss, n, v, ignore), CT_OK);
    grad_check_free("cross_entropy_backward", &g);

    targets[4] = (int32_t)v; /* out of range and not ignore_index */
    assert_int_equal(api->copy(dev, dtargets, targets, sizeof targets, CT_COPY_H2D), CT_OK);
    expect_error(api->cross_entropy_forward(dev, dlosses, dlogits_in, dtargets, n, v, ignore),
                 CT_ERR_INVALID, "cross_entropy_forward with target == v");
    expect_error(
        api->cross_entropy_backward(dev, dlogits_in, dlogits_in, dtargets, 1.0f, n, v, ignore),
        CT_ERR_INVALID, "cross_entropy_backward with target == v");

    api->free(dev, dlogits_in);
    api->free(dev, dlosses);
    api->free(dev, dtargets);
    free(logits);
    free(losses);
}

/* ---------------------------------------------------------------- optimizer, precision */

static void test_adamw(void **state)
{
    (void)state;
    const int64_t n = 5003;
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float *p = host_rand(n, 1), *m = host_rand(n, 0.1), *v = host_rand(n, 0.1);
    for (int64_t i = 0; i < n; i++)
        v[i] = v[i] * v[i];
    double *rp = ref_alloc(n), *rm = ref_alloc(n), *rv = ref_alloc(n);
    for (int64_t i = 0; i < n; i++) {
        rp[i] = p[i];
        rm[i] = m[i];
        rv[i] = v[i];
    }
    float *dp = dev_floats(p, n), *dm = dev_floats(m, n), *dv = dev_floats(v, n);
    for (int64_t step = 1; step <= 3; step++) {
        float *g = host_rand(n, 1);
        float *dg = dev_floats(g, n);
        for (int64_t i = 0; i < n; i++) {
            rp[i] -= (double)lr * wd * rp[i];
            rm[i] = b1 * rm[i] + (1 - (double)b1) * g[i];
            rv[i] = b2 * rv[i] + (1 - (double)b2) * g[i] * g[i];
            double mhat = rm[i] / (1 - pow(b1, (double)step)),
                   vhat = rv[i] / (1 - pow(b2, (double)step));
            rp[i] -= lr * mhat / (sqrt(vhat) + eps);
        }
        assert_int_equal(api->adamw(dev, dp, dg, dm, dv, n, lr, b1, b2, eps, wd, step), CT_OK);
        api->free(dev, dg);
        free(g);
    }
    expect_close("adamw param", dp, rp, n);
    expect_close("adamw m", dm, rm, n);
    expect_close("adamw v", dv, rv, n);
    api->free(dev, dp);
    api->free(dev, dm);
    api->free(dev, dv);
    free(p);
    free(m);
    free(v);
    free(rp);
    free(rm);
    free(rv);
}

/* bf16 reference by value, not by bits: the nearer of the two bf16 neighbours, ties to even */
static uint16_t bf16_reference(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (isnan(f))
        return 0x7FC0;
    if (isinf(f))
        return (uint16_t)(u >> 16);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    uint32_t ul = (uint32_t)lo << 16, uh = (uint32_t)hi << 16;
    float fl, fh;
    memcpy(&fl, &ul, sizeof fl);
    memcpy(&fh, &uh, sizeof fh);
    double dl = fabs((double)f - fl),
           dh = isinf(fh) ? fabs((double)f - ldexp(1.0, 128) * (f < 0 ? -1 : 1))
                          : fabs((double)f - fh);
    if (dl < dh || (dl == dh && (lo & 1) == 0))
        return lo;
    return hi;
}

static void test_bf16_casts(void **state)
{
    (void)state;
    enum { N = 4096 };
    static const uint32_t special[] = {0x3F808000u, 0x3F818000u, 0x00008000u, 0x00018000u,
                                       0x7F7FFFFFu, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
                                       0x7F800001u, 0x80000000u, 0x00000001u, 0xFF7FFFFFu};
    const int nspecial = (int)(sizeof special / sizeof special[0]);
    float src[N];
    for (int i = 0; i < N; i++) {
        uint32_t u = i < nspecial ? special[i] : (uint32_t)rnd_u64();
        if (i >= nspecial && i % 3 == 0)
            u = (u & 0xFFFF0000u) | 0x8000u; /* exact ties */
        memcpy(&src[i], &u, sizeof u);
    }
    float *dsrc = dev_floats(src, N);
    uint16_t *dbf = dev_upload(NULL, sizeof(uint16_t) * N);
    uint16_t bf[N];
    assert_int_equal(api->cast_f32_to_bf16(dev, dbf, dsrc, N), CT_OK);
    assert_int_equal(api->copy(dev, bf, dbf, sizeof bf, CT_COPY_D2H), CT_OK);
    assert_int_equal(api->synchronize(dev), CT_OK);
    for (int i = 0; i < N; i++) {
        uint16_t want = bf16_reference(src[i]);
        uint32_t bits;
        memcpy(&bits, &src[i], sizeof bits);
        if (isnan(src[i])) {
            if ((bf[i] & 0x7F80) != 0x7F80 || (bf[i] & 0x7F) == 0)
                fail_msg("cast_f32_to_bf16: NaN %08x became %04x, not a NaN", (unsigned)bits,
                         bf[i]);
        } else if (bf[i] != want) {
            fail_msg("cast_f32_to_bf16(%08x) = %04x, expected %04x", (unsigned)bits, bf[i], want);
        }
    }

    /* back to f32 is exact; round_bf16 equals the two casts */
    float *dback = dev_floats(NULL, N);
    assert_int_equal(api->cast_bf16_to_f32(dev, dback, dbf, N), CT_OK);
    assert_int_equal(api->round_bf16(dev, dsrc, N), CT_OK);
    float *back = download(dback, N), *rounded = download(dsrc, N);
    for (int i = 0; i < N; i++) {
        uint32_t u, r;
        memcpy(&u, &back[i], sizeof u);
        memcpy(&r, &rounded[i], sizeof r);
        assert_int_equal(u, (uint32_t)bf[i] << 16);
        if (!isnan(back[i]))
            assert_int_equal(r, u);
        else
            assert_true(isnan(rounded[i]));
    }
    free(back);
    free(rounded);
    api->free(dev, dsrc);
    api->free(dev, dbf);
    api->free(dev, dback);
}

/* ---------------------------------------------------------------- determinism */

/* Runs a set of ops (the ones with reductions or threads) on fixed inputs and returns all outputs
 * concatenated, so two runs can be compared bit for bit. */
static float *determinism_run(int64_t *count)
{
    const int64_t m = 192, b = 2, t = 96, h = 4, kvh = 2, d = 32, n = 64, v = 3001, big = 1 << 20;
    rng_state = 42;
    int64_t nq = b * t * h * d, nk = b * t * kvh * d;
    int64_t total = m * m + nq + b * h * t + nq + 2 * nk + n + n * v + 4 + m + m;
    float *all = malloc((size_t)total * sizeof(float));
    assert_non_null(all);
    float *o = all;

    float *a = host_rand(m * m, 1), *da = dev_floats(a, m * m), *dc = dev_floats(NULL, m * m);
    assert_int_equal(api->matmul(dev, dc, da, da, m, m, m, 0, 1, 1.0f, 0.0f), CT_OK);
    float *r = download(dc, m * m);
    memcpy(o, r, sizeof(float) * m * m), o += m * m;
    free(r);

    float *q = host_rand(nq, 1.5), *k = host_rand(nk, 1.5), *vv = host_rand(nk, 1);
    float *dq_ = dev_floats(q, nq), *dk_ = dev_floats(k, nk), *dv_ = dev_floats(vv, nk);
    float *dout_ = dev_floats(NULL, nq), *dlse = dev_floats(NULL, b * h * t);
    float *gq = dev_floats(NULL, nq), *gk = dev_floats(NULL, nk), *gv = dev_floats(NULL, nk);
    assert_int_equal(api->attention_forward(dev, dout_, dlse, dq_, dk_, dv_, b, t, h, kvh, d),
                     CT_OK);
    assert_int_equal(
        api->attention_backward(dev, gq, gk, gv, dq_, dq_, dk_, dv_, dout_, dlse, b, t, h, kvh, d),
        CT_OK);
    float *outs[] = {dout_, dlse, gq, gk, gv};
    int64_t sizes[] = {nq, b * h * t, nq, nk, nk};
    for (int i = 0; i < 5; i++) {
        r = download(outs[i], sizes[i]);
        memcpy(o, r, sizeof(float) * sizes[i]), o += sizes[i];
        free(r);
    }

    float *logits = host_rand(n * v, 5);
    int32_t targets[64];
    for (int64_t i = 0; i < n; i++)
        targets[i] = (int32_t)((i * 37) % v);
    float *dl = dev_floats(logits, n * v), *dlosses = dev_floats(NULL, n),
          *dgl = dev_floats(NULL, n * v);
    int32_t *dt = dev_upload(targets, sizeof targets);
    assert_int_equal(api->cross_entropy_forward(dev, dlosses, dl, dt, n, v, -100), CT_OK);
    assert_int_equal(api->cross_entropy_backward(dev, dgl, dl, dt, 1.0f / n, n, v, -100), CT_OK);
    r = download(dlosses, n);
    memcpy(o, r, sizeof(float) * n), o += n;
    free(r);
    r = download(dgl, n * v);
    memcpy(o, r, sizeof(float) * n * v), o += n * v;
    free(r);

    float *xb = host_rand(big, 1), *dxb = dev_floats(xb, big);
    double s = 0, ss = 0;
    assert_int_equal(api->sum(dev, &s, dxb, big), CT_OK);
    assert_int_equal(api->sum_squares(dev, &ss, dxb, big), CT_OK);
    memcpy(o, &s, sizeof s), o += 2; /* the two doubles' bytes, as four floats */
    memcpy(o, &ss, sizeof ss), o += 2;

    /* column reductions over many rows: bias and rmsnorm weight gradients */
    float *gb = dev_floats(NULL, m), *gw = dev_floats(NULL, m), *drstd = dev_floats(NULL, big / m);
    float *w = host_rand(m, 1), *dw = dev_floats(w, m), *ytmp = dev_floats(NULL, big / m * m);
    assert_int_equal(api->bias_backward(dev, gb, dxb, big / m, m), CT_OK);
    assert_int_equal(api->rmsnorm_forward(dev, ytmp, drstd, dxb, dw, big / m, m, 1e-5f), CT_OK);
    assert_int_equal(api->rmsnorm_backward_weight(dev, gw, dxb, dxb, drstd, big / m, m), CT_OK);
    r = download(gb, m);
    memcpy(o, r, sizeof(float) * m), o += m;
    free(r);
    r = download(gw, m);
    memcpy(o, r, sizeof(float) * m), o += m;
    free(r);
    assert_true(o - all == total);

    void *dbufs[] = {da, dc,      dq_, dk_, dv_, dout_, dlse, gq,    gk, gv,
                     dl, dlosses, dgl, dt,  dxb, gb,    gw,   drstd, dw, ytmp};
    for (size_t i = 0; i < sizeof dbufs / sizeof dbufs[0]; i++)
        api->free(dev, dbufs[i]);
    free(a);
    free(q);
    free(k);
    free(vv);
    free(logits);
    free(xb);
    free(w);
    *count = total;
    return all;
}

static void test_same_inputs_give_same_bits(void **state)
{
    (void)state;
    int64_t n1, n2;
    float *first = determinism_run(&n1), *second = determinism_run(&n2);
    assert_int_equal(n1, n2);
    for (int64_t i = 0; i < n1; i++)
        if (memcmp(&first[i], &second[i], sizeof(float)) != 0)
            fail_msg("run 2 differs from run 1 at output element %lld: %.9g vs %.9g", (long long)i,
                     (double)first[i], (double)second[i]);
    free(first);
    free(second);
}

/* ---------------------------------------------------------------- float8 (ABI 1.2, optional) */

/* The OCP FP8 value of `code` by the formula: e4m3 (bias 7, 3 mantissa bits, S.1111.111 NaN, no
 * inf) or e5m2 (bias 15, 2 mantissa bits, IEEE inf and NaN). */
static double f8_value(unsigned code, int e5m2)
{
    int mb = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7, emax = e5m2 ? 31 : 15;
    int e = (int)(code & 0x7F) >> mb, m = (int)code & ((1 << mb) - 1);
    double sign = code & 0x80 ? -1 : 1;
    if (e5m2 && e == emax)
        return m ? NAN : sign * INFINITY;
    if (!e5m2 && e == emax && m == 7)
        return NAN;
    if (e == 0)
        return sign * ldexp(m, 1 - bias - mb);
    return sign * ldexp(1 + ldexp(m, -mb), e - bias);
}

/* Saturating round to nearest even by value: the nearest finite value, ties to the even code;
 * NaN is any NaN code. */
static unsigned f8_reference(float y, int e5m2)
{
    unsigned sign = signbit(y) ? 0x80 : 0, max_code = e5m2 ? 0x7B : 0x7E;
    if (isnan(y))
        return sign | 0x7F;
    double a = fabs((double)y), best_d = INFINITY;
    if (a >= f8_value(max_code, e5m2))
        return sign | max_code;
    unsigned best = 0;
    for (unsigned c = 0; c <= max_code; c++) {
        double dist = fabs(a - f8_value(c, e5m2));
        if (dist < best_d || (dist == best_d && (c & 1) == 0)) {
            best = c;
            best_d = dist;
        }
    }
    return sign | best;
}

static int f8_is_nan(unsigned code, int e5m2)
{
    return e5m2 ? (code & 0x7F) > 0x7C : (code & 0x7F) == 0x7F;
}

static void *download_bytes(const void *d, size_t bytes)
{
    void *h = malloc(bytes + 4);
    assert_non_null(h);
    assert_int_equal(api->copy(dev, h, d, bytes, CT_COPY_D2H), CT_OK);
    assert_int_equal(api->synchronize(dev), CT_OK);
    return h;
}

static int float8_ops_present(void)
{
    if (api->struct_size < offsetof(ct_device_api, transpose) + sizeof(void *)) {
        fprintf(stderr, "float8 ops: struct_size %zu predates ABI 1.2, skipped\n",
                api->struct_size);
        return 0;
    }
    if (!api->amax || !api->quantize_fp8 || !api->dequantize_fp8) {
        fprintf(stderr, "float8 ops: not all provided (NULL), skipped\n");
        return 0;
    }
    return 1;
}

static void test_float8_decode_every_code(void **state)
{
    (void)state;
    if (!float8_ops_present())
        skip();
    uint8_t codes[256];
    for (int c = 0; c < 256; c++)
        codes[c] = (uint8_t)c;
    float one = 1.0f;
    uint8_t *dcodes = dev_upload(codes, sizeof codes);
    float *dscale = dev_floats(&one, 1), *dout = dev_floats(NULL, 256);
    for (int e5m2 = 0; e5m2 < 2; e5m2++) {
        ct_dtype fmt = e5m2 ? CT_F8_E5M2 : CT_F8_E4M3;
        assert_int_equal(api->dequantize_fp8(dev, dout, dcodes, dscale, 256, 256, fmt), CT_OK);
        float *got = download(dout, 256);
        for (int c = 0; c < 256; c++) {
            double want = f8_value((unsigned)c, e5m2);
            if (isnan(want) ? !isnan(got[c]) : (double)got[c] != want ||
                                                   !signbit(got[c]) != !signbit(want))
                fail_msg("dequantize_fp8 %s code %02x = %.9g, expected %.9g",
                         e5m2 ? "e5m2" : "e4m3", c, (double)got[c], want);
        }
        free(got);
    }
    api->free(dev, dcodes);
    api->free(dev, dscale);
    api->free(dev, dout);
}

/* rows x cols: values across the whole range (ties between fp8 neighbours, overflow, subnormals,
 * NaN, inf), per-group scales from the device's amax, for group = n, cols and 32. */
static void test_float8_group_scales(void **state)
{
    (void)state;
    if (!float8_ops_present())
        skip();
    const int64_t rows = 48, cols = 128, n = rows * cols;
    float *x = host_rand(n, 1);
    for (int64_t i = 0; i < n; i++) {
        x[i] = (float)ldexp(x[i], (int)(i / cols % 24) - 12); /* a magnitude per row */
        if (i % 7 == 3) { /* an exact tie of e4m3 or e5m2 neighbours, scaled */
            unsigned c = (unsigned)(rnd_u64() % 0x7A);
            int e5m2 = (int)(i % 2);
            x[i] = (float)((f8_value(c, e5m2) + f8_value(c + 1, e5m2)) / 2 *
                           ldexp(1.0, (int)(i / cols % 24) - 12));
        }
    }
    x[5] = NAN;
    x[cols + 9] = -INFINITY;
    x[2 * cols + 1] = -3e38f;
    float *dx = dev_floats(x, n), *damax = dev_floats(NULL, n), *dscale = dev_floats(NULL, n);
    float *dback = dev_floats(NULL, n);
    uint8_t *dq = dev_upload(NULL, (size_t)n);
    const int64_t groups[3] = {n, cols, 32};
    for (int e5m2 = 0; e5m2 < 2; e5m2++)
        for (int gi = 0; gi < 3; gi++) {
            int64_t group = groups[gi], ng = n / group;
            ct_dtype fmt = e5m2 ? CT_F8_E5M2 : CT_F8_E4M3;
            assert_int_equal(api->amax(dev, damax, dx, n, group), CT_OK);
            float *amax = download(damax, ng), *scale = malloc((size_t)ng * sizeof *scale);
            assert_non_null(scale);
            for (int64_t g = 0; g < ng; g++) {
                double want = 0;
                for (int64_t i = g * group; i < (g + 1) * group; i++)
                    want = isnan(x[i]) || isnan(want) ? NAN : fmax(want, fabs((double)x[i]));
                if (isnan(want) ? !isnan(amax[g]) : (double)amax[g] != want)
                    fail_msg("amax group %lld of %lld = %.9g, expected %.9g", (long long)g,
                             (long long)group, (double)amax[g], want);
                /* a finite scale even for the NaN and inf groups; 448 / 2^k otherwise */
                scale[g] = isfinite(amax[g]) && amax[g] > 0
                               ? (float)ldexp(1.0, (int)floor(log2(448.0 / amax[g])))
                               : 1.0f;
            }
            assert_int_equal(api->copy(dev, dscale, scale, (size_t)ng * sizeof(float),
                                       CT_COPY_H2D),
                             CT_OK);
            assert_int_equal(api->quantize_fp8(dev, dq, dx, dscale, n, group, fmt), CT_OK);
            assert_int_equal(api->dequantize_fp8(dev, dback, dq, dscale, n, group, fmt), CT_OK);
            uint8_t *q = download_bytes(dq, (size_t)n);
            float *back = download(dback, n);
            for (int64_t i = 0; i < n; i++) {
                float s = scale[i / group];
                unsigned want = f8_reference(x[i] * s, e5m2);
                int ok = isnan(x[i]) ? f8_is_nan(q[i], e5m2) : q[i] == want;
                if (!ok)
                    fail_msg("quantize_fp8 %s group %lld [%lld]: %.9g * %.9g -> %02x, expected "
                             "%02x",
                             e5m2 ? "e5m2" : "e4m3", (long long)group, (long long)i,
                             (double)x[i], (double)s, q[i], want);
                float dq_want = (float)f8_value(q[i], e5m2) / s;
                if (isnan(x[i]) ? !isnan(back[i]) : back[i] != dq_want)
                    fail_msg("dequantize_fp8 %s [%lld] = %.9g, expected %.9g",
                             e5m2 ? "e5m2" : "e4m3", (long long)i, (double)back[i],
                             (double)dq_want);
            }
            free(amax);
            free(scale);
            free(q);
            free(back);
        }
    expect_error(api->amax(dev, damax, dx, n, 100), CT_ERR_INVALID, "amax group 100 of 6144");
    expect_error(api->quantize_fp8(dev, dq, dx, dscale, n, 0, CT_F8_E4M3), CT_ERR_INVALID,
                 "quantize_fp8 group 0");
    expect_error(api->quantize_fp8(dev, dq, dx, dscale, n, n, CT_F32), CT_ERR_INVALID,
                 "quantize_fp8 to f32");
    expect_error(api->dequantize_fp8(dev, dx, dq, dscale, n, n, CT_BF16), CT_ERR_INVALID,
                 "dequantize_fp8 from bf16");
    api->free(dev, dx);
    api->free(dev, damax);
    api->free(dev, dscale);
    api->free(dev, dback);
    api->free(dev, dq);
    free(x);
}

static void test_float8_transpose(void **state)
{
    (void)state;
    if (api->struct_size < offsetof(ct_device_api, transpose) + sizeof(void *) || !api->transpose)
        skip();
    const int64_t shapes[][2] = {{1, 33}, {33, 1}, {45, 70}, {200, 131}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t r = shapes[s][0], c = shapes[s][1];
        float *a = host_rand(r * c, 1);
        float *da = dev_floats(a, r * c), *dt = dev_floats(NULL, r * c);
        assert_int_equal(api->transpose(dev, dt, da, r, c), CT_OK);
        float *t = download(dt, r * c);
        for (int64_t i = 0; i < r; i++)
            for (int64_t j = 0; j < c; j++)
                if (t[j * r + i] != a[i * c + j])
                    fail_msg("transpose %lldx%lld: [%lld][%lld] = %g, expected %g", (long long)r,
                             (long long)c, (long long)j, (long long)i, (double)t[j * r + i],
                             (double)a[i * c + j]);
        api->free(dev, da);
        api->free(dev, dt);
        free(a);
        free(t);
    }
    float *buf = dev_floats(NULL, 4);
    expect_error(api->transpose(dev, buf, buf, -1, 4), CT_ERR_INVALID, "transpose rows -1");
    api->free(dev, buf);
}

/* ---------------------------------------------------------------- tensor parallel (ABI 1.3) */

/* The op is in the table (struct_size covers it) and set; else the test reports why it skips. */
#define TP_OP_PRESENT(op)                                                                          \
    (api->struct_size >= offsetof(ct_device_api, op) + sizeof(void *) && api->op != NULL)
#define TP_SKIP_UNLESS(op)                                                                         \
    do {                                                                                           \
        if (!TP_OP_PRESENT(op)) {                                                                  \
            fprintf(stderr, "%s: not provided (an older ABI, or NULL), skipped\n", #op);             \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

static void expect_same_bits(const char *what, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("%s: run 2 differs from run 1 at [%lld]: %.9g vs %.9g", what, (long long)i,
                     (double)a[i], (double)b[i]);
}

/* A table shard of rows [begin, begin + rows) of a vocabulary of 20; ids below, inside and above
 * the shard, negative and extreme ones too (any id is valid). */
static void test_embedding_range(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(embedding_forward_range);
    TP_SKIP_UNLESS(embedding_backward_range);
    const int64_t n = 60, c = 45, begin = 7, rows = 6; /* c spans two column blocks */
    int32_t ids[60];
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)(rnd_u64() % 20); /* about 30% inside, with repeats */
    ids[0] = (int32_t)begin - 1;
    ids[1] = (int32_t)begin;
    ids[2] = (int32_t)(begin + rows - 1);
    ids[3] = (int32_t)(begin + rows);
    ids[4] = -1;
    ids[5] = INT32_MAX;
    ids[6] = INT32_MIN;
    ids[7] = (int32_t)begin; /* a repeat of ids[1] */
    float *table = host_rand(rows * c, 1), *dout = host_rand(n * c, 1);
    float *garbage = host_rand(n * c, 9);
    int32_t *dids = dev_upload(ids, sizeof ids);
    float *dtable = dev_floats(table, rows * c), *ddout = dev_floats(dout, n * c);
    float *out = dev_floats(garbage, n * c); /* rows outside the shard must be overwritten by 0 */
    double *ref = ref_alloc(n * c);
    grad_buf g = grad_new(rows * c);
    for (int64_t i = 0; i < n; i++) {
        int64_t r = (int64_t)ids[i] - begin;
        if (r < 0 || r >= rows)
            continue;
        for (int64_t j = 0; j < c; j++) {
            ref[i * c + j] = table[r * c + j];
            g.ref[r * c + j] += dout[i * c + j];
        }
    }
    assert_int_equal(api->embedding_forward_range(dev, out, dids, dtable, n, c, begin, rows),
                     CT_OK);
    expect_close("embedding_forward_range", out, ref, n * c);
    assert_int_equal(api->embedding_backward_range(dev, g.dev, dids, ddout, n, c, begin, rows),
                     CT_OK);
    grad_check_free("embedding_backward_range dtable", &g);

    expect_error(api->embedding_forward_range(dev, out, dids, dtable, -1, c, begin, rows),
                 CT_ERR_INVALID, "embedding_forward_range n = -1");
    expect_error(api->embedding_forward_range(dev, out, dids, dtable, n, c, begin, -2),
                 CT_ERR_INVALID, "embedding_forward_range rows = -2");
    expect_error(api->embedding_backward_range(dev, dtable, dids, ddout, n, c, begin, -1),
                 CT_ERR_INVALID, "embedding_backward_range rows = -1");
    expect_error(api->embedding_backward_range(dev, dtable, dids, ddout, -3, c, begin, rows),
                 CT_ERR_INVALID, "embedding_backward_range n = -3");

    api->free(dev, dids);
    api->free(dev, dtable);
    api->free(dev, ddout);
    api->free(dev, out);
    free(table);
    free(dout);
    free(garbage);
    free(ref);
}

/* embedding_backward_range with many repeated ids, past any parallel threshold: same bits twice. */
static void test_embedding_range_is_deterministic(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(embedding_backward_range);
    const int64_t n = 1024, c = 96, begin = 100, rows = 9;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    assert_non_null(ids);
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)(begin - 3 + (int64_t)(rnd_u64() % (uint64_t)(rows + 6)));
    float *dout = host_rand(n * c, 1);
    int32_t *dids = dev_upload(ids, (size_t)n * sizeof *ids);
    float *ddout = dev_floats(dout, n * c), *g1 = dev_floats(NULL, rows * c),
          *g2 = dev_floats(NULL, rows * c);
    assert_int_equal(api->embedding_backward_range(dev, g1, dids, ddout, n, c, begin, rows), CT_OK);
    assert_int_equal(api->embedding_backward_range(dev, g2, dids, ddout, n, c, begin, rows), CT_OK);
    float *a = download(g1, rows * c), *b = download(g2, rows * c);
    expect_same_bits("embedding_backward_range", a, b, rows * c);
    api->free(dev, dids);
    api->free(dev, ddout);
    api->free(dev, g1);
    api->free(dev, g2);
    free(ids);
    free(dout);
    free(a);
    free(b);
}

/* Columns [b, e) of x (n, v) as a contiguous (n, e - b) array. */
static float *host_columns(const float *x, int64_t n, int64_t v, int64_t b, int64_t e)
{
    float *s = malloc((size_t)(n * (e - b)) * sizeof *s + 4);
    assert_non_null(s);
    for (int64_t i = 0; i < n; i++)
        memcpy(s + i * (e - b), x + i * v + b, (size_t)(e - b) * sizeof *s);
    return s;
}

/* Cross-entropy over logits (n, V) split into column shards at `cuts` (cuts[0] = 0, ..,
 * cuts[nshards] = V): per-shard stats merged here as a tensor-parallel host would, the loss
 * against the double reference and the plugin's own cross_entropy_forward; each shard's
 * backward_lse against the reference (adding into a gradient that holds values), and the shards'
 * gradients put side by side against the plugin's cross_entropy_backward of the full logits. */
static void sharded_cross_entropy_case(const float *logits, const int32_t *targets, int64_t n,
                                       int64_t V, const int64_t *cuts, int nshards, int32_t ignore,
                                       float dloss)
{
    int32_t *dtargets = dev_upload(targets, (size_t)n * sizeof *targets);
    double *m = ref_alloc(n), *s = ref_alloc(n), *tl = ref_alloc(n);
    for (int64_t i = 0; i < n; i++)
        m[i] = -INFINITY;
    /* forward: the stats of each shard, checked, then merged */
    float **shard = calloc((size_t)nshards, sizeof *shard);
    float **dshard = calloc((size_t)nshards, sizeof *dshard);
    assert_true(shard && dshard);
    float *dstats = dev_floats(NULL, n * 3);
    float *stats_all = malloc((size_t)(nshards * n * 3) * sizeof(float));
    assert_non_null(stats_all);
    for (int r = 0; r < nshards; r++) {
        int64_t b = cuts[r], v = cuts[r + 1] - cuts[r];
        shard[r] = host_columns(logits, n, V, b, cuts[r + 1]);
        dshard[r] = dev_floats(shard[r], n * v);
        assert_int_equal(
            api->cross_entropy_stats(dev, dstats, dshard[r], dtargets, n, v, b, ignore), CT_OK);
        float *st = download(dstats, n * 3);
        for (int64_t i = 0; i < n; i++) {
            const float *x = shard[r] + i * v;
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < v; j++)
                mx = fmax(mx, x[j]);
            for (int64_t j = 0; j < v; j++)
                sum += exp(x[j] - mx);
            int64_t t = (int64_t)targets[i] - b;
            double want_t = targets[i] != ignore && t >= 0 && t < v ? x[t] : 0.0;
            if ((double)st[i * 3] != mx || fabs(st[i * 3 + 1] - sum) > 1e-5 * sum ||
                (double)st[i * 3 + 2] != want_t)
                fail_msg("cross_entropy_stats shard [%lld, %lld) row %lld = {%.9g, %.9g, %.9g}, "
                         "expected {%.9g, %.9g, %.9g}",
                         (long long)b, (long long)(b + v), (long long)i, (double)st[i * 3],
                         (double)st[i * 3 + 1], (double)st[i * 3 + 2], mx, sum, want_t);
            memcpy(stats_all + (r * n + i) * 3, st + i * 3, 3 * sizeof(float));
        }
        free(st);
    }
    /* the merge: m = max m_r, s = sum s_r exp(m_r - m), lse = m + log s */
    float *lse = malloc((size_t)n * sizeof *lse + 4);
    double *losses = ref_alloc(n), *want = ref_alloc(n);
    assert_non_null(lse);
    for (int64_t i = 0; i < n; i++) {
        for (int r = 0; r < nshards; r++)
            m[i] = fmax(m[i], stats_all[(r * n + i) * 3]);
        for (int r = 0; r < nshards; r++) {
            const float *st = stats_all + (r * n + i) * 3;
            s[i] += st[1] * exp(st[0] - m[i]);
            tl[i] += st[2];
        }
        double l = m[i] + log(s[i]);
        lse[i] = (float)l;
        losses[i] = targets[i] == ignore ? 0.0 : l - tl[i];
        /* the double reference of the full row */
        if (targets[i] == ignore)
            continue;
        const float *x = logits + i * V;
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < V; j++)
            mx = fmax(mx, x[j]);
        for (int64_t j = 0; j < V; j++)
            sum += exp(x[j] - mx);
        want[i] = mx + log(sum) - x[targets[i]];
    }
    float *dfull = dev_floats(logits, n * V), *dlosses = dev_floats(NULL, n);
    assert_int_equal(api->cross_entropy_forward(dev, dlosses, dfull, dtargets, n, V, ignore),
                     CT_OK);
    float *plugin_losses = download(dlosses, n);
    double scale = 1e-3;
    for (int64_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(want[i]));
    for (int64_t i = 0; i < n; i++)
        if (fabs(losses[i] - want[i]) > rtol * scale ||
            fabs(losses[i] - (double)plugin_losses[i]) > rtol * scale)
            fail_msg("%d-shard cross-entropy row %lld: merged loss %.9g, reference %.9g, "
                     "cross_entropy_forward %.9g",
                     nshards, (long long)i, losses[i], want[i], (double)plugin_losses[i]);

    /* backward: each shard adds into values already there; side by side they are the full op */
    float *dlse = dev_floats(lse, n), *dgfull = dev_floats(NULL, n * V);
    assert_int_equal(api->cross_entropy_backward(dev, dgfull, dfull, dtargets, dloss, n, V, ignore),
                     CT_OK);
    float *gfull = download(dgfull, n * V);
    double *side = ref_alloc(n * V);
    for (int r = 0; r < nshards; r++) {
        int64_t b = cuts[r], v = cuts[r + 1] - cuts[r];
        grad_buf g = grad_new(n * v);
        for (int64_t i = 0; i < n; i++) {
            if (targets[i] == ignore)
                continue;
            for (int64_t j = 0; j < v; j++)
                g.ref[i * v + j] += dloss * (exp((double)shard[r][i * v + j] - (double)lse[i]) -
                                             (targets[i] - b == j));
        }
        assert_int_equal(api->cross_entropy_backward_lse(dev, g.dev, dshard[r], dtargets, dlse,
                                                         dloss, n, v, b, ignore),
                         CT_OK);
        grad_check_free("cross_entropy_backward_lse (adds)", &g);
        float *dz = dev_floats(NULL, n * v);
        assert_int_equal(api->cross_entropy_backward_lse(dev, dz, dshard[r], dtargets, dlse, dloss,
                                                         n, v, b, ignore),
                         CT_OK);
        float *z = download(dz, n * v);
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < v; j++)
                side[i * V + b + j] = z[i * v + j];
        api->free(dev, dz);
        free(z);
    }
    scale = 1e-3;
    for (int64_t i = 0; i < n * V; i++)
        scale = fmax(scale, fabs((double)gfull[i]));
    for (int64_t i = 0; i < n * V; i++)
        if (fabs(side[i] - (double)gfull[i]) > rtol * scale)
            fail_msg("%d-shard cross_entropy_backward_lse [%lld][%lld] = %.9g, "
                     "cross_entropy_backward %.9g",
                     nshards, (long long)(i / V), (long long)(i % V), side[i], (double)gfull[i]);

    for (int r = 0; r < nshards; r++) {
        api->free(dev, dshard[r]);
        free(shard[r]);
    }
    api->free(dev, dtargets);
    api->free(dev, dstats);
    api->free(dev, dfull);
    api->free(dev, dlosses);
    api->free(dev, dlse);
    api->free(dev, dgfull);
    free(shard);
    free(dshard);
    free(stats_all);
    free(lse);
    free(losses);
    free(want);
    free(plugin_losses);
    free(gfull);
    free(side);
    free(m);
    free(s);
    free(tl);
}

static void test_cross_entropy_sharded(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(cross_entropy_stats);
    TP_SKIP_UNLESS(cross_entropy_backward_lse);
    const int64_t n = 37, V = 50;
    const int32_t ignore = -100;
    float *logits = host_rand(n * V, 6);
    for (int64_t j = 0; j < V; j++)
        logits[3 * V + j] += 300.0f; /* large logits: every shard must subtract its max */
    logits[5 * V + 45] = 40.0f;     /* row 5's max in the last shard, its target in the first */
    int32_t targets[37];
    for (int64_t i = 0; i < n; i++)
        targets[i] = i % 6 == 4 ? ignore : (int32_t)(rnd_u64() % (uint64_t)V);
    targets[0] = 0;
    targets[1] = (int32_t)V - 1;
    targets[5] = 2;
    const int64_t one[] = {0, 50}, two[] = {0, 17, 50}, three[] = {0, 9, 31, 50},
                  three_b[] = {0, 30, 31, 50}; /* a one-column shard */
    sharded_cross_entropy_case(logits, targets, n, V, one, 1, ignore, 0.37f);
    sharded_cross_entropy_case(logits, targets, n, V, two, 2, ignore, 0.37f);
    sharded_cross_entropy_case(logits, targets, n, V, three, 3, ignore, 1.0f / 37);
    sharded_cross_entropy_case(logits, targets, n, V, three_b, 3, ignore, 1.0f);

    float *buf = dev_floats(NULL, 64);
    int32_t *dt = dev_upload(targets, sizeof targets);
    /* An empty shard (v == 0) may be refused; if accepted it must drop out of the merge:
     * {-inf, 0, 0}, and its backward does nothing. */
    float *dstats = dev_floats(NULL, 3 * 3);
    ct_status st = api->cross_entropy_stats(dev, dstats, buf, dt, 3, 0, 20, ignore);
    if (st == CT_OK) {
        float *got = download(dstats, 3 * 3);
        for (int i = 0; i < 3; i++)
            if (!(isinf(got[i * 3]) && got[i * 3] < 0) || got[i * 3 + 1] != 0 ||
                got[i * 3 + 2] != 0)
                fail_msg("cross_entropy_stats v = 0 row %d = {%g, %g, %g}, expected {-inf, 0, 0}",
                         i, (double)got[i * 3], (double)got[i * 3 + 1], (double)got[i * 3 + 2]);
        free(got);
        expect_error(
            api->cross_entropy_backward_lse(dev, buf, buf, dt, buf, 1.0f, 3, 0, 20, ignore), CT_OK,
            "cross_entropy_backward_lse v = 0");
    } else {
        expect_error(st, CT_ERR_INVALID, "cross_entropy_stats v = 0 (refused)");
    }
    api->free(dev, dstats);
    expect_error(api->cross_entropy_stats(dev, buf, buf, dt, -1, 4, 0, ignore), CT_ERR_INVALID,
                 "cross_entropy_stats n = -1");
    expect_error(api->cross_entropy_backward_lse(dev, buf, buf, dt, buf, 1.0f, -1, 4, 0, ignore),
                 CT_ERR_INVALID, "cross_entropy_backward_lse n = -1");
    expect_error(api->cross_entropy_stats(dev, buf, buf, dt, 2, -4, 0, ignore), CT_ERR_INVALID,
                 "cross_entropy_stats v = -4");
    api->free(dev, buf);
    api->free(dev, dt);
    free(logits);
}

/* stats and backward_lse on a shard past any parallel threshold: same bits twice. */
static void test_cross_entropy_sharded_is_deterministic(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(cross_entropy_stats);
    TP_SKIP_UNLESS(cross_entropy_backward_lse);
    const int64_t n = 64, v = 1500, begin = 3000;
    float *logits = host_rand(n * v, 8), *lse = host_rand(n, 1);
    int32_t targets[64];
    for (int64_t i = 0; i < n; i++) {
        targets[i] = (int32_t)(begin - 100 + (int64_t)(rnd_u64() % (uint64_t)(v + 200)));
        lse[i] += 12.0f;
    }
    int32_t *dt = dev_upload(targets, sizeof targets);
    float *dl = dev_floats(logits, n * v), *dlse = dev_floats(lse, n);
    float *st[2], *gr[2];
    for (int k = 0; k < 2; k++) {
        float *dst = dev_floats(NULL, n * 3), *dg = dev_floats(NULL, n * v);
        assert_int_equal(api->cross_entropy_stats(dev, dst, dl, dt, n, v, begin, -100), CT_OK);
        assert_int_equal(
            api->cross_entropy_backward_lse(dev, dg, dl, dt, dlse, 0.5f, n, v, begin, -100), CT_OK);
        st[k] = download(dst, n * 3);
        gr[k] = download(dg, n * v);
        api->free(dev, dst);
        api->free(dev, dg);
    }
    expect_same_bits("cross_entropy_stats", st[0], st[1], n * 3);
    expect_same_bits("cross_entropy_backward_lse", gr[0], gr[1], n * v);
    for (int k = 0; k < 2; k++) {
        free(st[k]);
        free(gr[k]);
    }
    api->free(dev, dt);
    api->free(dev, dl);
    api->free(dev, dlse);
    free(logits);
    free(lse);
}

/* A block of src (rows, cols) at (r0, c0) with row stride ss into dst at (q0, d0) with stride ds:
 * inside the block dst is src's bits, outside it keeps what it held. */
static void copy_2d_case(int64_t src_rows, int64_t ss, int64_t r0, int64_t c0, int64_t dst_rows,
                         int64_t ds, int64_t q0, int64_t d0, int64_t rows, int64_t cols)
{
    float *src = host_rand(src_rows * ss, 1), *dst = host_rand(dst_rows * ds, 1);
    float *dsrc = dev_floats(src, src_rows * ss), *ddst = dev_floats(dst, dst_rows * ds);
    assert_int_equal(
        api->copy_2d(dev, ddst + q0 * ds + d0, ds, dsrc + r0 * ss + c0, ss, rows, cols), CT_OK);
    float *got = download(ddst, dst_rows * ds);
    for (int64_t i = 0; i < dst_rows; i++)
        for (int64_t j = 0; j < ds; j++) {
            int inside = i >= q0 && i < q0 + rows && j >= d0 && j < d0 + cols;
            float want = inside ? src[(i - q0 + r0) * ss + (j - d0 + c0)] : dst[i * ds + j];
            if (memcmp(&got[i * ds + j], &want, sizeof want) != 0)
                fail_msg("copy_2d %lldx%lld (strides dst %lld src %lld): dst[%lld][%lld] = %.9g, "
                         "expected %.9g (%s the block)",
                         (long long)rows, (long long)cols, (long long)ds, (long long)ss,
                         (long long)i, (long long)j, (double)got[i * ds + j], (double)want,
                         inside ? "inside" : "outside");
        }
    api->free(dev, dsrc);
    api->free(dev, ddst);
    free(src);
    free(dst);
    free(got);
}

static void test_copy_2d(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(copy_2d);
    copy_2d_case(13, 40, 3, 5, 11, 27, 2, 4, 8, 20); /* a sub-block between two strides */
    copy_2d_case(5, 16, 0, 0, 5, 16, 0, 0, 5, 16);   /* contiguous, stride == cols */
    copy_2d_case(7, 50, 0, 30, 7, 20, 0, 0, 7, 20);  /* a column shard out of a wide matrix */
    copy_2d_case(7, 20, 0, 0, 7, 50, 0, 30, 7, 20);  /* and back in */
    copy_2d_case(300, 130, 0, 10, 300, 100, 0, 0, 300, 100); /* past any parallel threshold */
    copy_2d_case(4, 9, 1, 2, 4, 9, 1, 2, 0, 5);      /* no rows: nothing changes */

    float *buf = dev_floats(NULL, 64);
    expect_error(api->copy_2d(dev, buf, 3, buf + 32, 8, 2, 4), CT_ERR_INVALID,
                 "copy_2d dst_stride 3 < cols 4");
    expect_error(api->copy_2d(dev, buf, 8, buf + 32, 3, 2, 4), CT_ERR_INVALID,
                 "copy_2d src_stride 3 < cols 4");
    expect_error(api->copy_2d(dev, buf, 8, buf + 32, 8, -1, 4), CT_ERR_INVALID,
                 "copy_2d rows = -1");
    expect_error(api->copy_2d(dev, buf, 8, buf + 32, 8, 2, -4), CT_ERR_INVALID,
                 "copy_2d cols = -4");
    api->free(dev, buf);
}

/* ---------------------------------------------------------------- ABI 1.4 */

/* One scaled fp8 GEMM: a (m,k) and b (n,k) quantised on the device, tensor-wide (matmul_fp8) or with
 * one scale per row (rows: matmul_fp8_rows), the GEMM against a double GEMM of the codes decoded
 * here (value / scale). A pair the device does not run must be CT_ERR_UNSUPPORTED with a message,
 * and then c is not checked. Returns 1 when it ran. */
static int matmul_fp8_case(int rows, int64_t m, int64_t n, int64_t k, ct_dtype fa, ct_dtype fb, float beta,
                           int must_run)
{
    float *a = host_rand(m * k, 3), *b = host_rand(n * k, 0.02), *c = host_rand(m * n, 1);
    for (int64_t i = 0; i < m * k; i++)
        a[i] = (float)ldexp(a[i], (int)(i / k % 9) - 4); /* rows of different magnitudes */
    int64_t na = rows ? m : 1, nb = rows ? n : 1, ga = rows ? k : m * k, gb = rows ? k : n * k;
    float *scale = calloc((size_t)(na + nb), sizeof *scale);
    assert_non_null(scale);
    /* torchao's scales: format max / amax (per tensor or per row; not powers of two here) */
    for (int64_t i = 0; i < m * k; i++)
        scale[i / ga] = fmaxf(scale[i / ga], fabsf(a[i]));
    for (int64_t i = 0; i < n * k; i++)
        scale[na + i / gb] = fmaxf(scale[na + i / gb], fabsf(b[i]));
    for (int64_t g = 0; g < na + nb; g++)
        scale[g] = ((g < na ? fa : fb) == CT_F8_E4M3 ? 448.0f : 57344.0f) / fmaxf(scale[g], 1e-12f);
    float *da = dev_floats(a, m * k), *db = dev_floats(b, n * k), *dc = dev_floats(c, m * n);
    float *dscale = dev_floats(scale, na + nb);
    uint8_t *qa = dev_upload(NULL, (size_t)(m * k)), *qb = dev_upload(NULL, (size_t)(n * k));
    assert_int_equal(api->quantize_fp8(dev, qa, da, dscale, m * k, ga, fa), CT_OK);
    assert_int_equal(api->quantize_fp8(dev, qb, db, dscale + na, n * k, gb, fb), CT_OK);
    uint8_t *ha = malloc((size_t)(m * k)), *hb = malloc((size_t)(n * k));
    assert_non_null(ha);
    assert_non_null(hb);
    assert_int_equal(api->copy(dev, ha, qa, (size_t)(m * k), CT_COPY_D2H), CT_OK);
    assert_int_equal(api->copy(dev, hb, qb, (size_t)(n * k), CT_COPY_D2H), CT_OK);
    assert_int_equal(api->synchronize(dev), CT_OK);
    double *ref = ref_alloc(m * n);
    const float alpha = 0.5f;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double sum = 0;
            for (int64_t p = 0; p < k; p++)
                sum += f8_value(ha[i * k + p], fa == CT_F8_E5M2) / scale[rows ? i : 0] *
                       (f8_value(hb[j * k + p], fb == CT_F8_E5M2) / scale[na + (rows ? j : 0)]);
            ref[i * n + j] = alpha * sum + (beta != 0 ? beta * (double)c[i * n + j] : 0.0);
        }
    if (beta == 0)
        assert_int_equal(api->copy(dev, dc, &(float){NAN}, sizeof(float), CT_COPY_H2D), CT_OK); /* ignored */
    last_error[0] = '\0';
    ct_status st = (rows ? api->matmul_fp8_rows : api->matmul_fp8)(dev, dc, qa, dscale, fa, qb, dscale + na, fb, m, n,
                                                                    k, alpha, beta);
    char what[112];
    snprintf(what, sizeof what, "%s %s x %s m=%lld n=%lld k=%lld beta %g", rows ? "matmul_fp8_rows" : "matmul_fp8",
             fa == CT_F8_E4M3 ? "e4m3" : "e5m2", fb == CT_F8_E4M3 ? "e4m3" : "e5m2", (long long)m, (long long)n,
             (long long)k, (double)beta);
    if (st == CT_ERR_UNSUPPORTED && !must_run) {
        if (!last_error[0])
            fail_msg("%s: CT_ERR_UNSUPPORTED without a message", what);
        fprintf(stderr, "%s: unsupported here (%s)\n", what, last_error);
        last_error[0] = '\0';
    } else {
        expect_error(st, CT_OK, what);
        /* per-op tolerance: at least 1e-3 of scale, as Hopper's fp8 tensor cores add in fewer bits
         * than f32 between cuBLASLt's promotions (the CPU's dequantise + sgemm meets 1e-4 anyway) */
        double saved = rtol;
        rtol = fmax(rtol, 1e-3);
        expect_close(what, dc, ref, m * n);
        rtol = saved;
    }
    api->free(dev, da);
    api->free(dev, db);
    api->free(dev, dc);
    api->free(dev, dscale);
    api->free(dev, qa);
    api->free(dev, qb);
    free(a);
    free(b);
    free(c);
    free(ha);
    free(hb);
    free(ref);
    free(scale);
    return st == CT_OK;
}

/* The format pairs of the three training GEMMs: e4m3 x e4m3 (forward), e5m2 x e4m3 and e4m3 x e5m2
 * (the gradients): a device whose first pair runs must run all three; e5m2 x e5m2 and
 * k % 16 != 0 may be unsupported. */
static void fp8_gemm_cases(int rows)
{
    int runs = matmul_fp8_case(rows, 48, 32, 64, CT_F8_E4M3, CT_F8_E4M3, 0.0f, 0);
    matmul_fp8_case(rows, 48, 32, 64, CT_F8_E4M3, CT_F8_E4M3, 1.0f, runs);
    matmul_fp8_case(rows, 40, 16, 96, CT_F8_E5M2, CT_F8_E4M3, 1.0f, runs);
    matmul_fp8_case(rows, 16, 40, 32, CT_F8_E4M3, CT_F8_E5M2, 0.0f, runs);
    matmul_fp8_case(rows, 16, 16, 32, CT_F8_E5M2, CT_F8_E5M2, 0.5f, 0);
    matmul_fp8_case(rows, 24, 8, 24, CT_F8_E4M3, CT_F8_E4M3, 0.0f, 0);
    fprintf(stderr, "%s: %s\n", rows ? "matmul_fp8_rows" : "matmul_fp8",
            runs ? "runs" : "unsupported on this device (the quantizer emulates)");
    float *buf = dev_floats(NULL, 64);
    ct_status (*op)(ct_device *, float *, const uint8_t *, const float *, ct_dtype, const uint8_t *, const float *,
                    ct_dtype, int64_t, int64_t, int64_t, float, float) = rows ? api->matmul_fp8_rows : api->matmul_fp8;
    expect_error(op(dev, buf, (uint8_t *)buf, buf, CT_BF16, (uint8_t *)buf, buf, CT_F8_E4M3, 4, 4, 16, 1, 0),
                 CT_ERR_INVALID, "scaled fp8 matmul with a bf16 operand");
    expect_error(op(dev, buf, (uint8_t *)buf, buf, CT_F8_E4M3, (uint8_t *)buf, buf, CT_F8_E4M3, 4, -4, 16, 1, 0),
                 CT_ERR_INVALID, "scaled fp8 matmul n = -4");
    api->free(dev, buf);
}

static void test_matmul_fp8(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(matmul_fp8);
    if (!float8_ops_present())
        skip();
    fp8_gemm_cases(0);
}

static void test_matmul_fp8_rows(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(matmul_fp8_rows);
    if (!float8_ops_present())
        skip();
    fp8_gemm_cases(1);
}

static float bf16_round_ref(float f)
{
    uint32_t bits = (uint32_t)bf16_reference(f) << 16;
    float r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

/* set_matmul_dtype(CT_BF16): the operands are rounded to bf16 (nearest even), products summed in
 * f32; CT_F32 restores the exact GEMM. */
static void test_matmul_bf16(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(set_matmul_dtype);
    const int64_t m = 33, n = 40, k = 72;
    float *a = host_rand(m * k, 1), *b = host_rand(k * n, 1);
    double *ref16 = ref_alloc(m * n), *ref32 = ref_alloc(m * n);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s16 = 0, s32 = 0;
            for (int64_t p = 0; p < k; p++) {
                s16 += (double)bf16_round_ref(a[i * k + p]) * (double)bf16_round_ref(b[j * k + p]);
                s32 += (double)a[i * k + p] * (double)b[j * k + p];
            }
            ref16[i * n + j] = s16;
            ref32[i * n + j] = s32;
        }
    float *da = dev_floats(a, m * k), *db = dev_floats(b, k * n), *dc = dev_floats(NULL, m * n);
    expect_error(api->set_matmul_dtype(dev, CT_BF16), CT_OK, "set_matmul_dtype bf16");
    assert_int_equal(api->matmul(dev, dc, da, db, m, n, k, 0, 1, 1.0f, 0.0f), CT_OK);
    expect_close("matmul with bf16 operands", dc, ref16, m * n);
    /* the same reference must NOT hold at f32: the rounding is real (differences ~1e-3 of scale) */
    float *got = download(dc, m * n);
    double worst = 0;
    for (int64_t i = 0; i < m * n; i++)
        worst = fmax(worst, fabs((double)got[i] - ref32[i]));
    free(got);
    if (worst < 1e-4)
        fail_msg("bf16 matmul within %.3g of the exact f32 GEMM: the operands were not rounded", worst);
    expect_error(api->set_matmul_dtype(dev, CT_F32), CT_OK, "set_matmul_dtype f32");
    assert_int_equal(api->matmul(dev, dc, da, db, m, n, k, 0, 1, 1.0f, 0.0f), CT_OK);
    expect_close("matmul back at f32", dc, ref32, m * n);
    expect_error(api->set_matmul_dtype(dev, CT_F8_E4M3), CT_ERR_UNSUPPORTED, "set_matmul_dtype e4m3");
    api->free(dev, da);
    api->free(dev, db);
    api->free(dev, dc);
    free(a);
    free(b);
    free(ref16);
    free(ref32);
}

/* share_stream: a stream handle, the same one again, and ops keep working on it. */
static void test_share_stream(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(share_stream);
    ct_stream *s1 = NULL, *s2 = NULL;
    expect_error(api->share_stream(dev, &s1), CT_OK, "share_stream");
    expect_error(api->share_stream(dev, &s2), CT_OK, "share_stream again");
    assert_true(s1 == s2);
    const int64_t n = 1000;
    float *x = host_rand(n, 1);
    double *ref = ref_alloc(n);
    for (int64_t i = 0; i < n; i++)
        ref[i] = 2.5 * (double)x[i];
    float *dx = dev_floats(x, n);
    assert_int_equal(api->scale(dev, dx, 2.5f, n), CT_OK);
    expect_close("scale after share_stream", dx, ref, n);
    api->free(dev, dx);
    free(x);
    free(ref);
}

/* ---------------------------------------------------------------- ABI 2.10: AdamW with bf16 moments */

static double bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ABI 2.10: adamw with its moments in bf16, packed per element (m low, v high): three steps against a
 * double reference that widens the stored moments, updates them, steps the parameter with the
 * updated values and stores them rounded. Moments agree within one bf16 step (a reference rounding
 * from double may fall on the other side of a tie than one from f32), the parameters as adamw's. */
static void test_adamw_bf16_moments(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(adamw_bf16_moments);
    const int64_t n = 5003;
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float *p = host_rand(n, 1), *m = host_rand(n, 0.1);
    uint32_t *mv = malloc((size_t)n * sizeof *mv);
    assert_non_null(mv);
    double *rp = ref_alloc(n), *rm = ref_alloc(n), *rv = ref_alloc(n);
    for (int64_t i = 0; i < n; i++) {
        uint16_t mb = bf16_reference(m[i]), vb = bf16_reference(m[i] * m[i]);
        mv[i] = (uint32_t)mb | (uint32_t)vb << 16;
        rp[i] = p[i];
        rm[i] = bf16_value(mb);
        rv[i] = bf16_value(vb);
    }
    float *dp = dev_floats(p, n);
    uint32_t *dmv = dev_upload(mv, (size_t)n * sizeof *mv);
    for (int64_t step = 1; step <= 3; step++) {
        float *g = host_rand(n, 1);
        float *dg = dev_floats(g, n);
        for (int64_t i = 0; i < n; i++) {
            double mi = b1 * rm[i] + (1 - (double)b1) * g[i], vi = b2 * rv[i] + (1 - (double)b2) * g[i] * g[i];
            rp[i] -= (double)lr * wd * rp[i];
            rp[i] -= lr * (mi / (1 - pow(b1, (double)step))) / (sqrt(vi / (1 - pow(b2, (double)step))) + eps);
            rm[i] = bf16_value(bf16_reference((float)mi));
            rv[i] = bf16_value(bf16_reference((float)vi));
        }
        expect_error(api->adamw_bf16_moments(dev, dp, dg, dmv, n, lr, b1, b2, eps, wd, step), CT_OK,
                     "adamw_bf16_moments");
        api->free(dev, dg);
        free(g);
    }
    expect_close("adamw_bf16_moments param", dp, rp, n);
    uint32_t *got = download_bytes(dmv, (size_t)n * sizeof *got);
    for (int64_t i = 0; i < n; i++) {
        double gm = bf16_value((uint16_t)(got[i] & 0xFFFFu)), gv = bf16_value((uint16_t)(got[i] >> 16));
        if (fabs(gm - rm[i]) > fabs(rm[i]) / 128 + 1e-30 || fabs(gv - rv[i]) > fabs(rv[i]) / 128 + 1e-30)
            fail_msg("adamw_bf16_moments: element %lld's moments (%g, %g), expected (%g, %g) within a bf16 step",
                     (long long)i, gm, gv, rm[i], rv[i]);
    }
    expect_error(api->adamw_bf16_moments(dev, dp, NULL, dmv, n, lr, b1, b2, eps, wd, 1), CT_ERR_INVALID,
                 "adamw_bf16_moments without a gradient");
    expect_error(api->adamw_bf16_moments(dev, dp, dp, dmv, n, lr, b1, b2, eps, wd, 0), CT_ERR_INVALID,
                 "adamw_bf16_moments at step 0");
    free(got);
    api->free(dev, dp);
    api->free(dev, dmv);
    free(p);
    free(m);
    free(mv);
    free(rp);
    free(rm);
    free(rv);
}

/* ---------------------------------------------------------------- ABI 2.9: copies beside the work */

/* copy_async / copy_wait: a copy sees every op queued before it, ops queued after copy_wait see
 * the copy, tickets count up, synchronize waits for the copies, and misuse is refused. */
static void test_copy_async(void **state)
{
    (void)state;
    int present = TP_OP_PRESENT(host_alloc) + TP_OP_PRESENT(host_free) + TP_OP_PRESENT(copy_async) +
                  TP_OP_PRESENT(copy_wait);
    if (present != 0 && present != 4)
        fail_msg("host_alloc, host_free, copy_async and copy_wait: %d of the four provided (all or none)", present);
    TP_SKIP_UNLESS(copy_async);
    const int64_t n = 3001; /* not a multiple of any vector width */
    const size_t bytes = (size_t)n * sizeof(float);
    float *x = host_rand(n, 1);
    double *ref = ref_alloc(n);
    float *dx = dev_floats(x, n), *dy = dev_floats(NULL, n);
    float *h1 = NULL, *h2 = NULL;
    expect_error(api->host_alloc(dev, bytes, (void **)&h1), CT_OK, "host_alloc");
    expect_error(api->host_alloc(dev, bytes, (void **)&h2), CT_OK, "host_alloc");
    assert_true((uintptr_t)h1 % 64 == 0 && (uintptr_t)h2 % 64 == 0);
    /* out: after the scale queued before it */
    assert_int_equal(api->scale(dev, dx, 3.0f, n), CT_OK);
    uint64_t t1 = 0, t2 = 0, t3 = 0;
    expect_error(api->copy_async(dev, h1, dx, bytes, CT_COPY_D2H, &t1), CT_OK, "copy_async D2H");
    assert_true(t1 >= 1);
    expect_error(api->copy_wait(dev, t1), CT_OK, "copy_wait");
    /* the source may be overwritten once the copy is waited for */
    assert_int_equal(api->zero(dev, dx, bytes), CT_OK);
    assert_int_equal(api->synchronize(dev), CT_OK);
    for (int64_t i = 0; i < n; i++)
        ref[i] = 3.0 * (double)x[i];
    for (int64_t i = 0; i < n; i++)
        if ((double)h1[i] != (double)(3.0f * x[i]))
            fail_msg("copy_async D2H: element %lld is %g, expected %g", (long long)i, (double)h1[i], ref[i]);
    /* back in: an op queued after copy_wait reads what the copy wrote */
    expect_error(api->copy_async(dev, dy, h1, bytes, CT_COPY_H2D, &t2), CT_OK, "copy_async H2D");
    assert_true(t2 > t1);
    expect_error(api->copy_wait(dev, t2), CT_OK, "copy_wait");
    assert_int_equal(api->scale(dev, dy, 0.5f, n), CT_OK);
    for (int64_t i = 0; i < n; i++)
        ref[i] = 0.5 * (double)(3.0f * x[i]);
    expect_close("H2D copy, then scale", dy, ref, n);
    /* two in flight, waited for by the later ticket alone */
    expect_error(api->copy_async(dev, h2, dy, bytes, CT_COPY_D2H, &t3), CT_OK, "copy_async D2H");
    uint64_t t4 = 0;
    expect_error(api->copy_async(dev, dx, h1, bytes / 2, CT_COPY_H2D, &t4), CT_OK, "copy_async H2D");
    assert_true(t3 > t2 && t4 > t3);
    expect_error(api->copy_wait(dev, t4), CT_OK, "copy_wait of the later ticket");
    assert_int_equal(api->synchronize(dev), CT_OK);
    for (int64_t i = 0; i < n; i++)
        if ((double)h2[i] != ref[i])
            fail_msg("the earlier of two copies: element %lld is %g, expected %g", (long long)i, (double)h2[i], ref[i]);
    float *y = download(dx, n / 2);
    for (int64_t i = 0; i < n / 2; i++)
        if (y[i] != h1[i])
            fail_msg("the later of two copies: element %lld is %g, expected %g", (long long)i, (double)y[i], (double)h1[i]);
    free(y);
    /* misuse */
    uint64_t t5 = 0;
    expect_error(api->copy_wait(dev, t4 + 1000), CT_ERR_INVALID, "copy_wait of a ticket not issued");
    expect_error(api->copy_async(dev, dy, dx, bytes, CT_COPY_D2D, &t5), CT_ERR_INVALID, "copy_async D2D");
    expect_error(api->copy_async(dev, h1, dx, bytes, CT_COPY_D2H, NULL), CT_ERR_INVALID, "copy_async without a ticket");
    api->host_free(dev, h1);
    api->host_free(dev, h2);
    api->host_free(dev, NULL);
    api->free(dev, dx);
    api->free(dev, dy);
    free(x);
    free(ref);
}

/* ---------------------------------------------------------------- ABI 1.5: no host waits, graphs */

/* sum_to_device: the f32 rounding of what `sum` returns, in device memory; 0 for n == 0. */
static void test_sum_to_device(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(sum_to_device);
    const int64_t ns[] = {0, 1, 257, 100003};
    for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++) {
        const int64_t n = ns[c];
        float *x = host_rand(n > 0 ? n : 1, 3), minus_one = -1.0f;
        float *dx = dev_floats(x, n > 0 ? n : 1), *dout = dev_floats(&minus_one, 1);
        double want = 0;
        assert_int_equal(api->sum(dev, &want, dx, n), CT_OK);
        assert_int_equal(api->sum_to_device(dev, dout, dx, n), CT_OK);
        float *got = download(dout, 1), w = (float)want;
        if (memcmp(got, &w, sizeof w) != 0)
            fail_msg("sum_to_device of %lld floats = %.9g, sum gives %.9g", (long long)n, (double)got[0], (double)w);
        free(got);
        api->free(dev, dx);
        api->free(dev, dout);
        free(x);
    }
    expect_error(api->sum_to_device(dev, NULL, NULL, 4), CT_ERR_INVALID, "sum_to_device with null pointers");
}

/* The 2.23 general ops, called as the host calls them (the narrow ops' tests above reach them too,
 * through the checking layer): the cases that agree on their inputs give the same bits. Cross-entropy:
 * dloss from device memory is the value's bits, for whole rows and for a shard with its lse (a case
 * no narrow op has); RoPE: positions 0..t-1 are NULL's; embedding: strict and a range over the whole
 * table agree where every id is valid, strict refuses an id outside and the range gives its row 0. */
static void test_general_ops(void **state)
{
    (void)state;
    const int64_t n = 23, v = 300, begin = 50;
    const float dloss = 0.0371f;
    float *logits = host_rand(n * v, 5), *init = host_rand(n * v, 0.5), *lse = host_rand(n, 1);
    int32_t targets[23];
    for (int64_t i = 0; i < n; i++) {
        targets[i] = i % 5 == 2 ? -100 : (int32_t)(rnd_u64() % (uint64_t)v);
        lse[i] += 9.0f;
    }
    float *dl = dev_floats(logits, n * v), *dlse = dev_floats(lse, n), *ddloss = dev_floats(&dloss, 1);
    int32_t *dt = dev_upload(targets, sizeof targets);
    for (int shard = 0; shard < 2; shard++) {
        float *g1 = dev_floats(init, n * v), *g2 = dev_floats(init, n * v);
        const float *l = shard ? dlse : NULL;
        int64_t b0 = shard ? begin : 0;
        assert_int_equal(api->cross_entropy_backward_general(dev, g1, dl, dt, l, dloss, NULL, n, v, b0, -100), CT_OK);
        assert_int_equal(api->cross_entropy_backward_general(dev, g2, dl, dt, l, 99.0f, ddloss, n, v, b0, -100),
                         CT_OK);
        float *a = download(g1, n * v), *b = download(g2, n * v);
        expect_same_bits(shard ? "cross_entropy_backward_general (lse): dloss_dev vs dloss"
                               : "cross_entropy_backward_general (rows): dloss_dev vs dloss",
                         a, b, n * v);
        int differs = 0;
        for (int64_t i = 0; i < n * v; i++)
            differs |= a[i] != init[i];
        assert_true(differs); /* the op did add a gradient */
        free(a);
        free(b);
        api->free(dev, g1);
        api->free(dev, g2);
    }
    targets[4] = (int32_t)v;
    assert_int_equal(api->copy(dev, dt, targets, sizeof targets, CT_COPY_H2D), CT_OK);
    expect_error(api->cross_entropy_backward_general(dev, dl, dl, dt, NULL, 1.0f, NULL, n, v, 0, -100), CT_ERR_INVALID,
                 "cross_entropy_backward_general (rows) with target == v");

    /* rope: x (b,t,h,d) */
    const int64_t rb = 2, rt = 9, rh = 3, rd = 16, rn = rb * rt * rh * rd;
    float *x = host_rand(rn, 1);
    int32_t pos[9];
    for (int i = 0; i < rt; i++)
        pos[i] = i;
    float *dx = dev_floats(x, rn), *y1 = dev_floats(NULL, rn), *y2 = dev_floats(NULL, rn);
    int32_t *dpos = dev_upload(pos, sizeof pos);
    assert_int_equal(api->rope_forward_general(dev, y1, dx, NULL, NULL, 500000.0f, rb, rt, rh, rd), CT_OK);
    assert_int_equal(api->rope_forward_general(dev, y2, dx, dpos, NULL, 500000.0f, rb, rt, rh, rd), CT_OK);
    float *ra = download(y1, rn), *rbits = download(y2, rn);
    expect_same_bits("rope_forward_general: positions 0..t-1 vs NULL", ra, rbits, rn);
    free(ra);
    free(rbits);
    assert_int_equal(api->rope_backward_general(dev, y1, dx, NULL, NULL, 500000.0f, rb, rt, rh, rd), CT_OK);
    assert_int_equal(api->rope_backward_general(dev, y2, dx, dpos, NULL, 500000.0f, rb, rt, rh, rd), CT_OK);
    ra = download(y1, rn), rbits = download(y2, rn);
    expect_same_bits("rope_backward_general: positions 0..t-1 vs NULL", ra, rbits, rn);
    free(ra);
    free(rbits);
    expect_error(api->rope_forward_general(dev, y1, dx, NULL, NULL, 0.0f, rb, rt, rh, rd), CT_ERR_INVALID,
                 "rope_forward_general without a table and theta 0");

    /* embedding: table (vocab,c), ids repeating */
    const int64_t en = 40, ec = 70, vocab = 11;
    float *table = host_rand(vocab * ec, 1), *dout = host_rand(en * ec, 1);
    int32_t ids[40];
    for (int i = 0; i < en; i++)
        ids[i] = (int32_t)(rnd_u64() % (uint64_t)vocab);
    int32_t *dids = dev_upload(ids, sizeof ids);
    float *dtab = dev_floats(table, vocab * ec), *ddout = dev_floats(dout, en * ec);
    float *o1 = dev_floats(NULL, en * ec), *o2 = dev_floats(NULL, en * ec);
    float *t1 = dev_floats(table, vocab * ec), *t2 = dev_floats(table, vocab * ec);
    assert_int_equal(api->embedding_forward_general(dev, o1, dids, dtab, en, ec, 0, vocab, 1), CT_OK);
    assert_int_equal(api->embedding_forward_general(dev, o2, dids, dtab, en, ec, 0, vocab, 0), CT_OK);
    assert_int_equal(api->embedding_backward_general(dev, t1, dids, ddout, en, ec, 0, vocab, 1), CT_OK);
    assert_int_equal(api->embedding_backward_general(dev, t2, dids, ddout, en, ec, 0, vocab, 0), CT_OK);
    float *ea = download(o1, en * ec), *eb = download(o2, en * ec);
    expect_same_bits("embedding_forward_general: strict vs the whole range", ea, eb, en * ec);
    assert_memory_equal(ea, table + (int64_t)ids[7] * ec, (size_t)ec * sizeof(float));
    free(ea);
    free(eb);
    ea = download(t1, vocab * ec), eb = download(t2, vocab * ec);
    expect_same_bits("embedding_backward_general: strict vs the whole range", ea, eb, vocab * ec);
    free(ea);
    free(eb);
    ids[3] = (int32_t)vocab;
    assert_int_equal(api->copy(dev, dids, ids, sizeof ids, CT_COPY_H2D), CT_OK);
    expect_error(api->embedding_forward_general(dev, o1, dids, dtab, en, ec, 0, vocab, 1), CT_ERR_INVALID,
                 "embedding_forward_general (strict) with id == vocab");
    assert_int_equal(api->embedding_forward_general(dev, o2, dids, dtab, en, ec, 0, vocab, 0), CT_OK);
    ea = download(o2, en * ec);
    for (int64_t j = 0; j < ec; j++)
        assert_true(ea[3 * ec + j] == 0.0f);
    free(ea);

    float *bufs[] = {dl, dlse, ddloss, (float *)dt, dx, y1, y2, (float *)dpos, (float *)dids, dtab, ddout, o1, o2, t1, t2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        api->free(dev, bufs[i]);
    free(logits);
    free(init);
    free(lse);
    free(x);
    free(table);
    free(dout);
}

/* cross_entropy_backward_dev: bit for bit cross_entropy_backward with the same dloss by value. */
static void test_cross_entropy_backward_dev(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(cross_entropy_backward_dev);
    const int64_t n = 19, v = 517;
    const float dloss = 0.0123f;
    float *logits = host_rand(n * v, 6), *init = host_rand(n * v, 0.5);
    int32_t targets[19];
    for (int64_t i = 0; i < n; i++)
        targets[i] = i % 4 == 1 ? -100 : (int32_t)(rnd_u64() % (uint64_t)v);
    float *dl = dev_floats(logits, n * v), *g1 = dev_floats(init, n * v), *g2 = dev_floats(init, n * v);
    float *ddloss = dev_floats(&dloss, 1);
    int32_t *dt = dev_upload(targets, sizeof targets);
    assert_int_equal(api->cross_entropy_backward(dev, g1, dl, dt, dloss, n, v, -100), CT_OK);
    assert_int_equal(api->cross_entropy_backward_dev(dev, g2, dl, dt, ddloss, n, v, -100), CT_OK);
    float *a = download(g1, n * v), *b = download(g2, n * v);
    expect_same_bits("cross_entropy_backward_dev vs cross_entropy_backward", a, b, n * v);
    expect_error(api->cross_entropy_backward_dev(dev, g2, dl, dt, NULL, n, v, -100), CT_ERR_INVALID,
                 "cross_entropy_backward_dev with a null dloss");
    targets[3] = (int32_t)v;
    assert_int_equal(api->copy(dev, dt, targets, sizeof targets, CT_COPY_H2D), CT_OK);
    expect_error(api->cross_entropy_backward_dev(dev, g2, dl, dt, ddloss, n, v, -100), CT_ERR_INVALID,
                 "cross_entropy_backward_dev with target == v");
    float *dev_bufs[] = {dl, g1, g2, ddloss};
    for (size_t i = 0; i < 4; i++)
        api->free(dev, dev_bufs[i]);
    api->free(dev, dt);
    free(a);
    free(b);
    free(logits);
    free(init);
}

/* The work a graph test captures: h = x w^T (bf16 operands when the device has them: scratch
 * blocks), h += x2, losses = CE(h, targets), *loss = sum losses, dh += dloss * dCE. */
typedef struct graph_bufs {
    float *x, *w, *x2, *h, *losses, *loss, *dloss, *dh;
    int32_t *targets;
} graph_bufs;
enum { GM = 24, GN = 40, GK = 32 };

static ct_status graph_work(const graph_bufs *b)
{
    ct_status st = api->matmul(dev, b->h, b->x, b->w, GM, GN, GK, 0, 1, 1.0f, 0.0f);
    if (st == CT_OK)
        st = api->axpy(dev, b->h, b->x2, 1.0f, GM * GN);
    if (st == CT_OK)
        st = api->cross_entropy_forward(dev, b->losses, b->h, b->targets, GM, GN, -100);
    if (st == CT_OK)
        st = api->sum_to_device(dev, b->loss, b->losses, GM);
    if (st == CT_OK)
        st = api->cross_entropy_backward_dev(dev, b->dh, b->h, b->targets, b->dloss, GM, GN, -100);
    return st;
}

/* New inputs (seeded), outputs zeroed. */
static void graph_inputs(const graph_bufs *b, uint64_t seed)
{
    rng_state = seed;
    float *x = host_rand(GM * GK, 1), *w = host_rand(GN * GK, 1), *x2 = host_rand(GM * GN, 1);
    float dloss = (float)(seed % 7 + 1) / 8.0f;
    int32_t t[GM];
    for (int i = 0; i < GM; i++)
        t[i] = i % 5 == 3 ? -100 : (int32_t)(rnd_u64() % GN);
    assert_int_equal(api->copy(dev, b->x, x, sizeof(float) * GM * GK, CT_COPY_H2D), CT_OK);
    assert_int_equal(api->copy(dev, b->w, w, sizeof(float) * GN * GK, CT_COPY_H2D), CT_OK);
    assert_int_equal(api->copy(dev, b->x2, x2, sizeof(float) * GM * GN, CT_COPY_H2D), CT_OK);
    assert_int_equal(api->copy(dev, b->dloss, &dloss, sizeof dloss, CT_COPY_H2D), CT_OK);
    assert_int_equal(api->copy(dev, b->targets, t, sizeof t, CT_COPY_H2D), CT_OK);
    assert_int_equal(api->zero(dev, b->dh, sizeof(float) * GM * GN), CT_OK);
    assert_int_equal(api->zero(dev, b->loss, sizeof(float)), CT_OK);
    free(x);
    free(w);
    free(x2);
}

static graph_bufs graph_bufs_new(void)
{
    graph_bufs b = {dev_floats(NULL, GM * GK), dev_floats(NULL, GN * GK), dev_floats(NULL, GM * GN),
                    dev_floats(NULL, GM * GN), dev_floats(NULL, GM), dev_floats(NULL, 1), dev_floats(NULL, 1),
                    dev_floats(NULL, GM * GN), dev_upload(NULL, sizeof(int32_t) * GM)};
    return b;
}

static void graph_bufs_free(graph_bufs *b)
{
    float *f[] = {b->x, b->w, b->x2, b->h, b->losses, b->loss, b->dloss, b->dh};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        api->free(dev, f[i]);
    api->free(dev, b->targets);
}

/* The loss and dh after graph_work, downloaded (n + 1 floats: dh, then the loss). */
static float *graph_results(const graph_bufs *b)
{
    float *r = malloc(sizeof(float) * (GM * GN + 1));
    assert_non_null(r);
    assert_int_equal(api->copy(dev, r, b->dh, sizeof(float) * GM * GN, CT_COPY_D2H), CT_OK);
    assert_int_equal(api->copy(dev, r + GM * GN, b->loss, sizeof(float), CT_COPY_D2H), CT_OK);
    return r;
}

/* A captured graph does nothing until launched, then gives the eager bits; launched again on new
 * inputs it gives what eager gives on them; memory allocated after the capture is not the graph's
 * scratch; an op that needs the host fails the capture with a message, and the device goes on. */
static void test_graph_capture(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(graph_free);
    assert_true(api->graph_begin && api->graph_end && api->graph_launch && api->sum_to_device &&
                api->cross_entropy_backward_dev);
    int bf16 = TP_OP_PRESENT(set_matmul_dtype) && api->set_matmul_dtype(dev, CT_BF16) == CT_OK;
    graph_bufs e = graph_bufs_new(), g = graph_bufs_new();
    float *want[2];
    for (int r = 0; r < 2; r++) { /* eager, on the inputs of seeds 11 and 12 */
        graph_inputs(&e, 11 + (uint64_t)r);
        assert_int_equal(graph_work(&e), CT_OK);
        want[r] = graph_results(&e);
    }
    graph_inputs(&g, 11);
    ct_graph *graph = NULL;
    int64_t ops = -1;
    expect_error(api->graph_begin(dev), CT_OK, "graph_begin");
    expect_error(graph_work(&g), CT_OK, "the ops during capture");
    expect_error(api->graph_end(dev, &graph, &ops), CT_OK, "graph_end");
    assert_non_null(graph);
    if (ops < 5)
        fail_msg("graph_end counted %lld operations for at least 5 ops", (long long)ops);
    float *before = graph_results(&g);
    for (int64_t i = 0; i <= GM * GN; i++)
        if (before[i] != 0.0f)
            fail_msg("captured work ran during the capture: result[%lld] = %g", (long long)i, (double)before[i]);
    free(before);
    /* a buffer the size of the bf16 scratch, allocated after the capture, must survive launches */
    const int64_t guard_n = GM * GK / 2;
    float *guard_host = host_rand(guard_n, 1), *guard = dev_floats(guard_host, guard_n);
    for (int r = 0; r < 2; r++) {
        if (r == 1)
            graph_inputs(&g, 12);
        expect_error(api->graph_launch(dev, graph), CT_OK, "graph_launch");
        float *got = graph_results(&g);
        expect_same_bits(r ? "graph launched on new inputs vs eager" : "graph launch vs eager", want[r], got,
                         GM * GN + 1);
        free(got);
    }
    float *guard_after = download(guard, guard_n);
    expect_same_bits("a buffer allocated after the capture, after two launches", guard_host, guard_after, guard_n);
    api->graph_free(dev, graph);

    /* what a graph cannot hold: each refused with a message, and graph_end then refuses too */
    float host_word = 0;
    double sum = 0;
    for (int c = 0; c < 3; c++) {
        expect_error(api->graph_begin(dev), CT_OK, "graph_begin");
        last_error[0] = '\0';
        ct_status st = c == 0   ? api->copy(dev, &host_word, g.loss, sizeof host_word, CT_COPY_D2H)
                       : c == 1 ? api->sum(dev, &sum, g.losses, GM)
                                : api->synchronize(dev);
        expect_error(st, CT_ERR_INVALID, c == 0 ? "copy to the host during a capture"
                                         : c == 1 ? "sum during a capture"
                                                  : "synchronize during a capture");
        graph = (void *)&sum;
        assert_int_not_equal(api->graph_end(dev, &graph, NULL), CT_OK);
        assert_null(graph);
    }
    expect_error(api->graph_end(dev, &graph, NULL), CT_ERR_INVALID, "graph_end without a capture");
    /* and the device still runs eagerly */
    graph_inputs(&e, 12);
    assert_int_equal(graph_work(&e), CT_OK);
    float *again = graph_results(&e);
    expect_same_bits("eager work after refused captures", want[1], again, GM * GN + 1);
    free(again);
    if (bf16)
        assert_int_equal(api->set_matmul_dtype(dev, CT_F32), CT_OK);
    free(want[0]);
    free(want[1]);
    free(guard_host);
    free(guard_after);
    api->free(dev, guard);
    graph_bufs_free(&e);
    graph_bufs_free(&g);
}

/* ---------------------------------------------------------------- bad arguments */

/* ---------------------------------------------------------------- ABI 2.1: elementwise ops */

enum { EW_AXPBY, EW_MUL, EW_DIV, EW_SQRT, EW_SIGN, EW_CLAMP, EW_GREATER, EW_OPS };
static const char *const ew_names[EW_OPS] = {"ew_axpby", "ew_mul", "ew_div", "ew_sqrt",
                                             "ew_sign", "ew_clamp", "ew_greater"};
static const int ew_binary[EW_OPS] = {1, 1, 1, 0, 0, 0, 1};
#define EW_ALPHA 0.75f
#define EW_BETA -1.5f
#define EW_EPS 1e-3f
#define EW_LO -0.25f
#define EW_HI 0.5f

static int ew_present(int op)
{
    switch (op) {
    case EW_AXPBY: return TP_OP_PRESENT(ew_axpby);
    case EW_MUL: return TP_OP_PRESENT(ew_mul);
    case EW_DIV: return TP_OP_PRESENT(ew_div);
    case EW_SQRT: return TP_OP_PRESENT(ew_sqrt);
    case EW_SIGN: return TP_OP_PRESENT(ew_sign);
    case EW_CLAMP: return TP_OP_PRESENT(ew_clamp);
    default: return TP_OP_PRESENT(ew_greater);
    }
}

static ct_status ew_call(int op, float *out, const float *x, const float *y, int64_t n)
{
    switch (op) {
    case EW_AXPBY: return api->ew_axpby(dev, out, EW_ALPHA, x, EW_BETA, y, n);
    case EW_MUL: return api->ew_mul(dev, out, x, y, n);
    case EW_DIV: return api->ew_div(dev, out, x, y, EW_EPS, n);
    case EW_SQRT: return api->ew_sqrt(dev, out, x, n);
    case EW_SIGN: return api->ew_sign(dev, out, x, n);
    case EW_CLAMP: return api->ew_clamp(dev, out, x, EW_LO, EW_HI, n);
    default: return api->ew_greater(dev, out, x, y, n);
    }
}

/* device.h's expression, in f32 as C evaluates it (no contraction under -std=c11) */
static float ew_reference(int op, float x, float y)
{
    switch (op) {
    case EW_AXPBY: return EW_ALPHA * x + EW_BETA * y;
    case EW_MUL: return x * y;
    case EW_DIV: return x / (y + EW_EPS);
    case EW_SQRT: return sqrtf(x);
    case EW_SIGN: return isnan(x) ? x : x > 0 ? 1.0f : x < 0 ? -1.0f : 0.0f;
    case EW_CLAMP: return isnan(x) ? x : fminf(fmaxf(x, EW_LO), EW_HI);
    default: return x > y ? 1.0f : 0.0f;
    }
}

/* Inputs in [-2, 2) with zeros of both signs, infinities and NaNs sprinkled in. */
static float *ew_input(int64_t n)
{
    float *x = host_rand(n, 2);
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-30f, -1e30f};
    for (int64_t i = 0; i < n; i += 97)
        x[i] = special[(i / 97) % (int64_t)(sizeof special / sizeof special[0])];
    return x;
}

/* out: 0 a separate buffer, 1 out == x, 2 out == y */
static void ew_case(int op, int64_t n, const float *x, const float *y, int alias)
{
    float *dx = dev_floats(x, n), *dy = dev_floats(y, n), *dout = alias == 1 ? dx : alias == 2 ? dy : dev_floats(NULL, n);
    expect_error(ew_call(op, dout, dx, dy, n), CT_OK, ew_names[op]);
    float *got = download(dout, n);
    for (int64_t i = 0; i < n; i++) {
        float want = ew_reference(op, x[i], y[i]);
        if (!(got[i] == want || (isnan(got[i]) && isnan(want))))
            fail_msg("%s (out %s) [%lld] of x %.9g, y %.9g = %.9g, expected %.9g", ew_names[op],
                     alias == 1 ? "== x" : alias == 2 ? "== y" : "separate", (long long)i, (double)x[i],
                     (double)y[i], (double)got[i], (double)want);
    }
    free(got);
    api->free(dev, dx);
    api->free(dev, dy);
    if (alias == 0)
        api->free(dev, dout);
}

static void test_elementwise_ops(void **state)
{
    (void)state;
    const int64_t n = 100003; /* odd, and past any parallel threshold */
    float *x = ew_input(n), *y = ew_input(n);
    int tested = 0;
    for (int op = 0; op < EW_OPS; op++) {
        if (!ew_present(op)) {
            fprintf(stderr, "%s: not provided (an older ABI, or NULL)\n", ew_names[op]);
            continue;
        }
        tested++;
        for (int alias = 0; alias <= 1 + ew_binary[op]; alias++) {
            ew_case(op, n, x, y, alias);
            ew_case(op, 5, x + 97 * 4, y + 3, alias); /* a NaN at [0], below any parallel threshold */
        }
        expect_error(ew_call(op, NULL, NULL, NULL, 0), CT_OK, "n = 0 with NULL pointers");
        expect_error(ew_call(op, NULL, NULL, NULL, -1), CT_ERR_INVALID, "n = -1");
    }
    free(x);
    free(y);
    if (tested == 0)
        skip();
}

/* sign: 1, -1, NaN stays NaN; clamp lets a NaN through too (the min/max of C would not). */
static void test_elementwise_nan(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(ew_sign);
    TP_SKIP_UNLESS(ew_clamp);
    const float x[6] = {NAN, -NAN, 3.5f, -1e-38f, 0.0f, -INFINITY};
    float *dx = dev_floats(x, 6), *dout = dev_floats(NULL, 6);
    assert_int_equal(api->ew_sign(dev, dout, dx, 6), CT_OK);
    float *got = download(dout, 6);
    assert_true(isnan(got[0]) && isnan(got[1]));
    assert_true(got[2] == 1.0f && got[3] == -1.0f && got[4] == 0.0f && got[5] == -1.0f);
    free(got);
    assert_int_equal(api->ew_clamp(dev, dout, dx, -1.0f, 1.0f, 6), CT_OK);
    got = download(dout, 6);
    assert_true(isnan(got[0]) && isnan(got[1]));
    assert_true(got[2] == 1.0f && got[3] == -1e-38f && got[4] == 0.0f && got[5] == -1.0f);
    free(got);
    api->free(dev, dx);
    api->free(dev, dout);
}

/* ---------------------------------------------------------------- context parallel (ABI 2.3, optional) */

/* Context parallel's layout: the sequence (t rows) cut into 2 cp chunks, rank r holding chunks r and
 * 2cp-1-r, so every rank has the same causal work. pos gets the rank's t/cp positions in order. */
static void cp_positions(int32_t *pos, int64_t t, int cp, int rank)
{
    int64_t chunk = t / (2 * cp), n = 0;
    for (int64_t i = 0; i < chunk; i++)
        pos[n++] = (int32_t)(rank * chunk + i);
    for (int64_t i = 0; i < chunk; i++)
        pos[n++] = (int32_t)((2 * cp - 1 - rank) * chunk + i);
}

static void shuffle_positions(int32_t *pos, int64_t n)
{
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(rnd_u64() % (uint64_t)(i + 1));
        int32_t tmp = pos[i];
        pos[i] = pos[j];
        pos[j] = tmp;
    }
}

/* dst (b, n, cols) = rows pos[0..n) of src (b, t, cols) */
static void gather_rows(float *dst, const float *src, const int32_t *pos, int64_t b, int64_t t,
                        int64_t n, int64_t cols)
{
    for (int64_t bi = 0; bi < b; bi++)
        for (int64_t i = 0; i < n; i++)
            memcpy(dst + (bi * n + i) * cols, src + (bi * t + pos[i]) * cols,
                   (size_t)cols * sizeof(float));
}

/* A device result gathered as doubles: ref (b, n, cols) = rows pos of the device's (b, t, cols). */
static double *gather_download(const float *d, const int32_t *pos, int64_t b, int64_t t, int64_t n,
                               int64_t cols)
{
    float *h = download(d, b * t * cols), *g = malloc((size_t)(b * n * cols) * sizeof *g + 4);
    double *ref = ref_alloc(b * n * cols);
    assert_non_null(g);
    gather_rows(g, h, pos, b, t, n, cols);
    for (int64_t i = 0; i < b * n * cols; i++)
        ref[i] = g[i];
    free(h);
    free(g);
    return ref;
}

static int32_t *dev_ints(const int32_t *host, int64_t n)
{
    return dev_upload(host, (size_t)n * sizeof(int32_t));
}

static double *download_double(const float *d, int64_t n)
{
    float *h = download(d, n);
    double *ref = ref_alloc(n);
    for (int64_t i = 0; i < n; i++)
        ref[i] = h[i];
    free(h);
    return ref;
}

/* expect_close at tolerance tol, tighter than the suite's, unless CT_DEVICE_RTOL sets one */
static void expect_close_tol(const char *what, const float *dgot, const double *ref, int64_t n,
                             double tol)
{
    double saved = rtol;
    if (!getenv("CT_DEVICE_RTOL"))
        rtol = tol;
    expect_close(what, dgot, ref, n);
    rtol = saved;
}

/* The rotation by (float)p * inv[i] (as device.h says the angle is formed), in double after that. */
static void rope_freqs_reference(double *out, const float *x, const int32_t *pos, const float *inv, int64_t b,
                                 int64_t t, int64_t h, int64_t d, double sign)
{
    for (int64_t bi = 0; bi < b; bi++)
        for (int64_t r = 0; r < t; r++)
            for (int64_t hh = 0; hh < h; hh++)
                for (int64_t i = 0; i < d / 2; i++) {
                    float p = (float)(pos ? pos[r] : r);
                    double a = sign * (double)(p * inv[i]);
                    int64_t o = ((bi * t + r) * h + hh) * d + 2 * i;
                    out[o] = x[o] * cos(a) - x[o + 1] * sin(a);
                    out[o + 1] = x[o] * sin(a) + x[o + 1] * cos(a);
                }
}

static void test_rope_freqs(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(rope_freqs_forward);
    TP_SKIP_UNLESS(rope_freqs_backward);
    const int64_t b = 2, t = 40, h = 3, d = 16, n = b * t * h * d;
    const float theta = 500000.0f;
    float plain[8], scaled[8];
    for (int64_t i = 0; i < d / 2; i++) { /* Llama 3.1's bands, compressed: kept, blended, divided */
        plain[i] = 1.0f / powf(theta, (float)(2 * i) / (float)d);
        scaled[i] = i < 2 ? plain[i] : i < 4 ? plain[i] * (0.5f + 0.1f * (float)i) : plain[i] / 8.0f;
    }
    float *x = host_rand(n, 1), *dout = host_rand(n, 1);
    float *dx_ = dev_floats(x, n), *ddout = dev_floats(dout, n), *dinv = dev_floats(plain, d / 2);
    float *want = dev_floats(NULL, n), *got = dev_floats(NULL, n);

    /* the plain table is rope itself (forward, and backward into a zeroed gradient) */
    assert_int_equal(api->rope_forward(dev, want, dx_, b, t, h, d, theta), CT_OK);
    assert_int_equal(api->rope_freqs_forward(dev, got, dx_, NULL, dinv, b, t, h, d), CT_OK);
    double *ref = download_double(want, n);
    expect_close_tol("rope_freqs_forward (plain table) vs rope_forward", got, ref, n, 1e-6);
    free(ref);
    assert_int_equal(api->zero(dev, want, sizeof(float) * (size_t)n), CT_OK);
    assert_int_equal(api->zero(dev, got, sizeof(float) * (size_t)n), CT_OK);
    assert_int_equal(api->rope_backward(dev, want, ddout, b, t, h, d, theta), CT_OK);
    assert_int_equal(api->rope_freqs_backward(dev, got, ddout, NULL, dinv, b, t, h, d), CT_OK);
    ref = download_double(want, n);
    expect_close_tol("rope_freqs_backward (plain table) vs rope_backward", got, ref, n, 1e-6);
    free(ref);

    /* a scaled table, rows 0..t-1 and context parallel's shuffled positions */
    assert_int_equal(api->copy(dev, dinv, scaled, sizeof scaled, CT_COPY_H2D), CT_OK);
    int32_t pos[40];
    cp_positions(pos, 2 * t, 2, 1);
    shuffle_positions(pos, t);
    int32_t *dpos = dev_ints(pos, t);
    double *back = ref_alloc(n);
    for (int with_pos = 0; with_pos < 2; with_pos++) {
        const int32_t *pp = with_pos ? pos : NULL;
        ref = ref_alloc(n);
        rope_freqs_reference(ref, x, pp, scaled, b, t, h, d, 1.0);
        float *dx = dev_floats(x, n);
        assert_int_equal(api->rope_freqs_forward(dev, dx, dx, with_pos ? dpos : NULL, dinv, b, t, h, d), CT_OK);
        expect_close(with_pos ? "rope_freqs_forward (scaled, positions)" : "rope_freqs_forward (scaled)", dx, ref, n);
        free(ref);
        api->free(dev, dx);
        grad_buf g = grad_new(n);
        rope_freqs_reference(back, dout, pp, scaled, b, t, h, d, -1.0); /* R^T = rotation by -angle */
        for (int64_t i = 0; i < n; i++)
            g.ref[i] += back[i];
        assert_int_equal(api->rope_freqs_backward(dev, g.dev, ddout, with_pos ? dpos : NULL, dinv, b, t, h, d), CT_OK);
        grad_check_free(with_pos ? "rope_freqs_backward (scaled, positions)" : "rope_freqs_backward (scaled)", &g);
    }
    free(back);
    expect_error(api->rope_freqs_forward(dev, got, dx_, NULL, dinv, b, t, h, 5), CT_ERR_INVALID,
                 "rope_freqs_forward with odd d");
    expect_error(api->rope_freqs_backward(dev, got, dx_, NULL, NULL, b, t, h, d), CT_ERR_INVALID,
                 "rope_freqs_backward without a table");
    float *bufs[] = {dx_, ddout, dinv, want, got};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        api->free(dev, bufs[i]);
    api->free(dev, dpos);
    free(x);
    free(dout);
}

static void test_rope_pos(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(rope_forward_pos);
    TP_SKIP_UNLESS(rope_backward_pos);
    const int64_t b = 2, t = 12, h = 3, d = 16, big = 48, rows = h * d;
    const float theta = 10000.0f;
    int32_t pos[48];
    float *x = host_rand(b * big * rows, 1), *dout = host_rand(b * big * rows, 1);
    float *xs = malloc((size_t)(b * big * rows) * sizeof *xs), *ds = malloc((size_t)(b * big * rows) * sizeof *ds);
    assert_non_null(xs);
    assert_non_null(ds);
    /* over the whole long sequence, for the rows to compare with */
    float *dx_long = dev_floats(x, b * big * rows), *ddout_long = dev_floats(dout, b * big * rows);
    float *rot = dev_floats(NULL, b * big * rows), *back = dev_floats(NULL, b * big * rows);
    assert_int_equal(api->rope_forward(dev, rot, dx_long, b, big, h, d, theta), CT_OK);
    assert_int_equal(api->rope_backward(dev, back, ddout_long, b, big, h, d, theta), CT_OK);

    /* pos = 0..n-1 is rope itself; pos = offset + t a later window; context parallel's chunks, in
     * order and shuffled: each the rows of the long rope at those positions */
    for (int kase = 0; kase < 4; kase++) {
        int64_t n = kase < 2 ? t : big / 2;
        for (int64_t i = 0; i < n; i++)
            pos[i] = (int32_t)(kase == 0 ? i : kase == 1 ? 29 + i : 0);
        if (kase >= 2)
            cp_positions(pos, big, 2, 1);
        if (kase == 3)
            shuffle_positions(pos, n);
        gather_rows(xs, x, pos, b, big, n, rows);
        gather_rows(ds, dout, pos, b, big, n, rows);
        float *dx = dev_floats(xs, b * n * rows), *dd = dev_floats(ds, b * n * rows);
        int32_t *dpos = dev_ints(pos, n);
        double *want = gather_download(rot, pos, b, big, n, rows);
        assert_int_equal(api->rope_forward_pos(dev, dx, dx, dpos, b, n, h, d, theta), CT_OK);
        expect_close_tol("rope_forward_pos", dx, want, b * n * rows, 1e-6);
        free(want);
        grad_buf g = grad_new(b * n * rows);
        want = gather_download(back, pos, b, big, n, rows);
        for (int64_t i = 0; i < g.n; i++)
            g.ref[i] += want[i];
        assert_int_equal(api->rope_backward_pos(dev, g.dev, dd, dpos, b, n, h, d, theta), CT_OK);
        grad_check_free("rope_backward_pos", &g);
        free(want);
        api->free(dev, dx);
        api->free(dev, dd);
        api->free(dev, dpos);
    }
    expect_error(api->rope_forward_pos(dev, rot, rot, NULL, b, t, h, 5, theta), CT_ERR_INVALID,
                 "rope_forward_pos with odd d");
    float *bufs[] = {dx_long, ddout_long, rot, back};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        api->free(dev, bufs[i]);
    free(x);
    free(dout);
    free(xs);
    free(ds);
}

/* attention_block_forward with q_pos = k_pos = 0..t-1 is attention_forward, and its backward from
 * that out and lse is attention_backward. */
static void block_as_full_case(int64_t b, int64_t t, int64_t h, int64_t kvh, int64_t d)
{
    int64_t nq = b * t * h * d, nk = b * t * kvh * d, nl = b * h * t;
    float *q = host_rand(nq, 1.5), *k = host_rand(nk, 1.5), *v = host_rand(nk, 1),
          *dout = host_rand(nq, 1);
    int32_t *pos = malloc((size_t)t * sizeof *pos);
    assert_non_null(pos);
    for (int64_t i = 0; i < t; i++)
        pos[i] = (int32_t)i;
    float *dq_ = dev_floats(q, nq), *dk_ = dev_floats(k, nk), *dv_ = dev_floats(v, nk);
    float *ddout = dev_floats(dout, nq), *out = dev_floats(NULL, nq), *lse = dev_floats(NULL, nl);
    float *bout = dev_floats(NULL, nq), *blse = dev_floats(NULL, nl);
    float *fq = dev_floats(NULL, nq), *fk = dev_floats(NULL, nk), *fv = dev_floats(NULL, nk);
    int32_t *dpos = dev_ints(pos, t);
    assert_int_equal(api->attention_forward(dev, out, lse, dq_, dk_, dv_, b, t, h, kvh, d), CT_OK);
    assert_int_equal(api->attention_block_forward(dev, bout, blse, dq_, dk_, dv_, dpos, dpos, b, t, t,
                                                  h, kvh, d),
                     CT_OK);
    double *want = download_double(out, nq);
    expect_close_tol("attention_block_forward out", bout, want, nq, 1e-5);
    free(want);
    want = download_double(lse, nl);
    expect_close_tol("attention_block_forward lse", blse, want, nl, 1e-5);
    free(want);

    assert_int_equal(api->attention_backward(dev, fq, fk, fv, ddout, dq_, dk_, dv_, out, lse, b, t, h,
                                             kvh, d),
                     CT_OK);
    grad_buf gq = grad_new(nq), gk = grad_new(nk), gv = grad_new(nk);
    float *full[] = {fq, fk, fv};
    grad_buf *gs[] = {&gq, &gk, &gv};
    for (int i = 0; i < 3; i++) {
        float *hf = download(full[i], gs[i]->n);
        for (int64_t j = 0; j < gs[i]->n; j++)
            gs[i]->ref[j] += hf[j];
        free(hf);
    }
    assert_int_equal(api->attention_block_backward(dev, gq.dev, gk.dev, gv.dev, ddout, dq_, dk_, dv_,
                                                   out, lse, dpos, dpos, b, t, t, h, kvh, d),
                     CT_OK);
    grad_check_free("attention_block_backward dq", &gq);
    grad_check_free("attention_block_backward dk", &gk);
    grad_check_free("attention_block_backward dv", &gv);

    float *bufs[] = {dq_, dk_, dv_, ddout, out, lse, bout, blse, fq, fk, fv};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        api->free(dev, bufs[i]);
    api->free(dev, dpos);
    free(q);
    free(k);
    free(v);
    free(dout);
    free(pos);
}

static void test_attention_block_is_attention(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(attention_block_forward);
    TP_SKIP_UNLESS(attention_block_backward);
    block_as_full_case(2, 5, 4, 2, 6);
    block_as_full_case(2, 77, 4, 2, 16); /* longer than a typical query block */
    block_as_full_case(1, 40, 3, 3, 8);
}

/* Ring attention as context parallel runs it: the sequence (b, t) split over cp ranks by
 * cp_positions (shuffled within each rank when `shuffle`); each rank's queries against every
 * rank's keys, one block at a time, merged by log-sum-exp, equal attention_forward's rows; the
 * block backwards from the merged out and lse, summed, equal attention_backward's (dk, dv summed
 * over the query ranks into the key rank's rows). */
static void ring_case(int cp, int64_t b, int64_t t, int64_t h, int64_t kvh, int64_t d, int shuffle)
{
    int64_t tl = t / cp, qc = h * d, kc = kvh * d, nq = b * t * qc, nk = b * t * kc;
    float *q = host_rand(nq, 1.5), *k = host_rand(nk, 1.5), *v = host_rand(nk, 1),
          *dout = host_rand(nq, 1);
    float *dq_ = dev_floats(q, nq), *dk_ = dev_floats(k, nk), *dv_ = dev_floats(v, nk);
    float *ddout = dev_floats(dout, nq), *out = dev_floats(NULL, nq), *lse = dev_floats(NULL, b * h * t);
    float *fq = dev_floats(NULL, nq), *fk = dev_floats(NULL, nk), *fv = dev_floats(NULL, nk);
    assert_int_equal(api->attention_forward(dev, out, lse, dq_, dk_, dv_, b, t, h, kvh, d), CT_OK);
    assert_int_equal(api->attention_backward(dev, fq, fk, fv, ddout, dq_, dk_, dv_, out, lse, b, t, h,
                                             kvh, d),
                     CT_OK);
    float *hlse = download(lse, b * h * t);
    int32_t pos[8][512];
    assert_true(cp <= 8 && tl <= 512);
    float *rq[8], *rk[8], *rv[8], *rdo[8], *ro[8], *rl[8];
    int32_t *rpos[8];
    grad_buf gq[8], gk[8], gv[8];
    float *hbuf = malloc((size_t)nq * sizeof *hbuf + 4);
    assert_non_null(hbuf);
    for (int r = 0; r < cp; r++) { /* each rank's rows of q, k, v, dout */
        cp_positions(pos[r], t, cp, r);
        if (shuffle)
            shuffle_positions(pos[r], tl);
        rpos[r] = dev_ints(pos[r], tl);
        gather_rows(hbuf, q, pos[r], b, t, tl, qc);
        rq[r] = dev_floats(hbuf, b * tl * qc);
        gather_rows(hbuf, dout, pos[r], b, t, tl, qc);
        rdo[r] = dev_floats(hbuf, b * tl * qc);
        gather_rows(hbuf, k, pos[r], b, t, tl, kc);
        rk[r] = dev_floats(hbuf, b * tl * kc);
        gather_rows(hbuf, v, pos[r], b, t, tl, kc);
        rv[r] = dev_floats(hbuf, b * tl * kc);
        ro[r] = dev_floats(NULL, b * tl * qc);
        rl[r] = dev_floats(NULL, b * h * tl);
        gq[r] = grad_new(b * tl * qc);
        gk[r] = grad_new(b * tl * kc);
        gv[r] = grad_new(b * tl * kc);
    }
    float *o2 = dev_floats(NULL, b * tl * qc), *l2 = dev_floats(NULL, b * h * tl);
    char what[96];
    for (int r = 0; r < cp; r++) {
        /* the ring: rank r's own keys first, then the others' as they come round */
        for (int step = 0; step < cp; step++) {
            int s = (r - step + cp) % cp;
            float *o = step ? o2 : ro[r], *l = step ? l2 : rl[r];
            assert_int_equal(api->attention_block_forward(dev, o, l, rq[r], rk[s], rv[s], rpos[r],
                                                          rpos[s], b, tl, tl, h, kvh, d),
                             CT_OK);
            if (step)
                assert_int_equal(api->attention_merge(dev, ro[r], rl[r], o2, l2, b, tl, h, d), CT_OK);
        }
        double *want = gather_download(out, pos[r], b, t, tl, qc);
        snprintf(what, sizeof what, "cp=%d rank %d merged out", cp, r);
        expect_close_tol(what, ro[r], want, b * tl * qc, 1e-5);
        free(want);
        want = ref_alloc(b * h * tl);
        for (int64_t bh = 0; bh < b * h; bh++)
            for (int64_t i = 0; i < tl; i++)
                want[bh * tl + i] = hlse[bh * t + pos[r][i]];
        snprintf(what, sizeof what, "cp=%d rank %d merged lse", cp, r);
        expect_close_tol(what, rl[r], want, b * h * tl, 1e-5);
        free(want);
    }
    for (int r = 0; r < cp; r++)
        for (int s = 0; s < cp; s++)
            assert_int_equal(api->attention_block_backward(dev, gq[r].dev, gk[s].dev, gv[s].dev,
                                                           rdo[r], rq[r], rk[s], rv[s], ro[r], rl[r],
                                                           rpos[r], rpos[s], b, tl, tl, h, kvh, d),
                             CT_OK);
    for (int r = 0; r < cp; r++) {
        double *want = gather_download(fq, pos[r], b, t, tl, qc);
        for (int64_t i = 0; i < gq[r].n; i++)
            gq[r].ref[i] += want[i];
        free(want);
        want = gather_download(fk, pos[r], b, t, tl, kc);
        for (int64_t i = 0; i < gk[r].n; i++)
            gk[r].ref[i] += want[i];
        free(want);
        want = gather_download(fv, pos[r], b, t, tl, kc);
        for (int64_t i = 0; i < gv[r].n; i++)
            gv[r].ref[i] += want[i];
        free(want);
        snprintf(what, sizeof what, "cp=%d rank %d summed block dq", cp, r);
        grad_check_free(what, &gq[r]);
        snprintf(what, sizeof what, "cp=%d rank %d summed block dk", cp, r);
        grad_check_free(what, &gk[r]);
        snprintf(what, sizeof what, "cp=%d rank %d summed block dv", cp, r);
        grad_check_free(what, &gv[r]);
        float *bufs[] = {rq[r], rk[r], rv[r], rdo[r], ro[r], rl[r]};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            api->free(dev, bufs[i]);
        api->free(dev, rpos[r]);
    }
    float *bufs[] = {dq_, dk_, dv_, ddout, out, lse, fq, fk, fv, o2, l2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        api->free(dev, bufs[i]);
    free(hbuf);
    free(hlse);
    free(q);
    free(k);
    free(v);
    free(dout);
}

static void test_attention_blocks_merge_to_attention(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(attention_block_forward);
    TP_SKIP_UNLESS(attention_merge);
    TP_SKIP_UNLESS(attention_block_backward);
    ring_case(2, 2, 16, 4, 2, 8, 0);
    ring_case(2, 1, 160, 2, 1, 16, 0); /* a rank's 80 rows: more than one query block */
    ring_case(3, 2, 36, 4, 2, 8, 1);
    ring_case(4, 2, 64, 6, 2, 16, 1);
    ring_case(4, 1, 256, 4, 4, 8, 1);
}

/* Queries that see no key of the block: out 0, lse -inf, and nothing from them in backward. */
/* ---- ABI 2.13: attention over packed documents ---- */

/* The naive reference of attention_doc_forward and its backward, in double: for each (batch row,
 * head, query) the visible keys (same document, position not later), softmax, out, lse; then the
 * gradients from dout through the same P. ro (b,tq,h,d), rl (b,h,tq), rdq (b,tq,h,d), rdk and rdv
 * (b,tk,kvh,d) are ADDED to (the callers pass zeroed or initial values). */
typedef struct {
    int64_t b, tq, tk, h, kvh, d;
    const float *q, *k, *v, *dout;
    const int32_t *qp, *kp, *qd, *kd; /* (b,tq), (b,tk) */
} doc_case;

static void doc_reference(const doc_case *c, double *ro, double *rl, double *rdq, double *rdk, double *rdv)
{
    int64_t h = c->h, d = c->d, kvh = c->kvh, tq = c->tq, tk = c->tk, group = h / kvh;
    double scale = 1.0 / sqrt((double)d), *p = ref_alloc(tk), *o = ref_alloc(d);
    for (int64_t bi = 0; bi < c->b; bi++)
        for (int64_t hi = 0; hi < h; hi++)
            for (int64_t i = 0; i < tq; i++) {
                const float *qi = c->q + ((bi * tq + i) * h + hi) * d;
                const float *doi = c->dout + ((bi * tq + i) * h + hi) * d;
                double mx = -INFINITY, sum = 0, di = 0;
                for (int64_t j = 0; j < tk; j++) {
                    int seen = c->kd[bi * tk + j] == c->qd[bi * tq + i] && c->kp[bi * tk + j] <= c->qp[bi * tq + i];
                    const float *kj = c->k + ((bi * tk + j) * kvh + hi / group) * d;
                    p[j] = -INFINITY;
                    if (!seen)
                        continue;
                    p[j] = 0;
                    for (int64_t x = 0; x < d; x++)
                        p[j] += (double)qi[x] * kj[x] * scale;
                    mx = fmax(mx, p[j]);
                }
                for (int64_t j = 0; j < tk; j++)
                    sum += isinf(p[j]) ? 0 : exp(p[j] - mx);
                rl[(bi * h + hi) * tq + i] += sum > 0 ? mx + log(sum) : -INFINITY;
                memset(o, 0, (size_t)d * sizeof *o);
                for (int64_t j = 0; j < tk; j++) {
                    p[j] = isinf(p[j]) ? 0 : exp(p[j] - mx) / sum;
                    for (int64_t x = 0; x < d; x++)
                        o[x] += p[j] * c->v[((bi * tk + j) * kvh + hi / group) * d + x];
                }
                for (int64_t x = 0; x < d; x++) {
                    ro[((bi * tq + i) * h + hi) * d + x] += o[x];
                    di += (double)doi[x] * o[x];
                }
                for (int64_t j = 0; j < tk; j++) {
                    if (p[j] == 0)
                        continue;
                    int64_t kr = ((bi * tk + j) * kvh + hi / group) * d;
                    double dp = 0;
                    for (int64_t x = 0; x < d; x++)
                        dp += (double)doi[x] * c->v[kr + x];
                    double ds = p[j] * (dp - di) * scale;
                    for (int64_t x = 0; x < d; x++) {
                        rdv[kr + x] += p[j] * doi[x];
                        rdk[kr + x] += ds * qi[x];
                        rdq[((bi * tq + i) * h + hi) * d + x] += ds * c->k[kr + x];
                    }
                }
            }
    free(p);
    free(o);
}

/* Documents of random lengths (1..maxlen) in each of the b rows of t tokens: docs (b,t), positions
 * 0..t-1 in each row. */
static void doc_rows(int32_t *docs, int32_t *pos, int64_t b, int64_t t, int maxlen)
{
    for (int64_t bi = 0; bi < b; bi++) {
        int32_t doc = 0, left = 1 + (int32_t)(rnd_u64() % (uint64_t)maxlen);
        for (int64_t i = 0; i < t; i++) {
            docs[bi * t + i] = doc;
            pos[bi * t + i] = (int32_t)i;
            if (--left == 0) {
                doc++;
                left = 1 + (int32_t)(rnd_u64() % (uint64_t)maxlen);
            }
        }
    }
}

/* One call of attention_doc_forward and attention_doc_backward on queries qsel and keys ksel (row
 * indices into the b x t rows; nq and nk of each per batch row) against the reference. */
static void doc_case_run(const char *what, int64_t b, int64_t t, int64_t h, int64_t kvh, int64_t d,
                         const int32_t *docs, const int32_t *pos, const int32_t *qsel, int64_t tq,
                         const int32_t *ksel, int64_t tk)
{
    int64_t nq = b * tq * h * d, nk = b * tk * kvh * d, nl = b * h * tq;
    float *q = host_rand(nq, 1.5), *k = host_rand(nk, 1.5), *v = host_rand(nk, 1), *dout = host_rand(nq, 1);
    int32_t *qp = malloc(sizeof(int32_t) * (size_t)(2 * b * (tq + tk))), *kp = qp + b * tq;
    int32_t *qd = kp + b * tk, *kd = qd + b * tq;
    assert_non_null(qp);
    (void)t;
    for (int64_t bi = 0; bi < b; bi++) {
        for (int64_t i = 0; i < tq; i++) {
            qp[bi * tq + i] = pos[bi * t + qsel[i]];
            qd[bi * tq + i] = docs[bi * t + qsel[i]];
        }
        for (int64_t j = 0; j < tk; j++) {
            kp[bi * tk + j] = pos[bi * t + ksel[j]];
            kd[bi * tk + j] = docs[bi * t + ksel[j]];
        }
    }
    doc_case c = {b, tq, tk, h, kvh, d, q, k, v, dout, qp, kp, qd, kd};
    double *ro = ref_alloc(nq), *rl = ref_alloc(nl);
    grad_buf gq = grad_new(nq), gk = grad_new(nk), gv = grad_new(nk);
    doc_reference(&c, ro, rl, gq.ref, gk.ref, gv.ref);
    float *dq_ = dev_floats(q, nq), *dk_ = dev_floats(k, nk), *dv_ = dev_floats(v, nk), *ddo = dev_floats(dout, nq);
    float *out = dev_floats(NULL, nq), *lse = dev_floats(NULL, nl);
    int32_t *dqp = dev_ints(qp, b * tq), *dkp = dev_ints(kp, b * tk), *dqd = dev_ints(qd, b * tq),
            *dkd = dev_ints(kd, b * tk);
    assert_int_equal(api->attention_doc_forward(dev, out, lse, dq_, dk_, dv_, dqp, dkp, dqd, dkd, b, tq, tk, h, kvh, d),
                     CT_OK);
    char name[160];
    snprintf(name, sizeof name, "attention_doc_forward out (%s)", what);
    expect_close_tol(name, out, ro, nq, 1e-5);
    float *hl = download(lse, nl);
    for (int64_t i = 0; i < nl; i++) {
        if (isinf(rl[i]) != isinf(hl[i]) || (!isinf(rl[i]) && fabs(hl[i] - rl[i]) > 1e-5 * (1 + fabs(rl[i]))))
            fail_msg("attention_doc_forward lse[%lld] (%s) = %g, expected %g", (long long)i, what, (double)hl[i],
                     rl[i]);
    }
    free(hl);
    assert_int_equal(api->attention_doc_backward(dev, gq.dev, gk.dev, gv.dev, ddo, dq_, dk_, dv_, out, lse, dqp, dkp,
                                                 dqd, dkd, b, tq, tk, h, kvh, d),
                     CT_OK);
    snprintf(name, sizeof name, "attention_doc_backward dq (%s)", what);
    grad_check_free(name, &gq);
    snprintf(name, sizeof name, "attention_doc_backward dk (%s)", what);
    grad_check_free(name, &gk);
    snprintf(name, sizeof name, "attention_doc_backward dv (%s)", what);
    grad_check_free(name, &gv);
    float *bufs[] = {dq_, dk_, dv_, ddo, out, lse};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        api->free(dev, bufs[i]);
    int32_t *ibufs[] = {dqp, dkp, dqd, dkd};
    for (size_t i = 0; i < sizeof ibufs / sizeof ibufs[0]; i++)
        api->free(dev, ibufs[i]);
    free(q);
    free(k);
    free(v);
    free(dout);
    free(qp);
    free(ro);
    free(rl);
}

/* Block-causal attention against the reference: packed rows of short and long documents (one
 * query tile and several), the rows shuffled and a query subset against a key subset (context
 * parallel's chunks), one document over the whole row (causal attention), and queries whose
 * document has no key in the block (lse -inf, out 0, no gradient). */
static void test_attention_doc(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(attention_doc_forward);
    TP_SKIP_UNLESS(attention_doc_backward);
    const int64_t b = 2, t = 150, h = 4, kvh = 2;
    int32_t *docs = malloc(sizeof(int32_t) * (size_t)(2 * b * t)), *pos = docs + b * t;
    int32_t *all = malloc(sizeof(int32_t) * (size_t)t), *perm = malloc(sizeof(int32_t) * (size_t)t);
    assert_non_null(docs);
    assert_non_null(all);
    assert_non_null(perm);
    for (int64_t i = 0; i < t; i++)
        all[i] = perm[i] = (int32_t)i;
    for (int64_t i = t - 1; i > 0; i--) { /* a fixed shuffle */
        int64_t j = (int64_t)(rnd_u64() % (uint64_t)(i + 1));
        int32_t x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    doc_rows(docs, pos, b, 9, 4);
    doc_case_run("9 tokens, short documents", b, 9, h, kvh, 8, docs, pos, all, 9, all, 9);
    doc_rows(docs, pos, b, t, 12);
    doc_case_run("150 tokens, documents up to 12", b, t, h, kvh, 16, docs, pos, all, t, all, t);
    doc_case_run("150 tokens, rows shuffled", b, t, h, kvh, 16, docs, pos, perm, t, perm, t);
    doc_case_run("query and key subsets", b, t, h, kvh, 16, docs, pos, perm, 60, perm + 40, 90);
    { /* context parallel's rank 0 of 2 on 128 tokens: chunks 0 and 3 of 4 against the whole sequence */
        int32_t cprows[64];
        for (int i = 0; i < 32; i++)
            cprows[i] = i, cprows[32 + i] = 96 + i;
        doc_rows(docs, pos, 1, 128, 40);
        doc_case_run("cp rank rows against the whole sequence", 1, 128, h, kvh, 16, docs, pos, cprows, 64, all, 128);
    }
    doc_rows(docs, pos, b, t, 90);
    doc_case_run("150 tokens, documents up to 90", b, t, h, kvh, 32, docs, pos, all, t, all, t);
    for (int64_t i = 0; i < b * t; i++)
        docs[i] = 0;
    doc_case_run("one document: causal", b, t, h, kvh, 16, docs, pos, all, t, all, t);
    free(docs);
    free(all);
    free(perm);
}

/* Two key blocks merged by attention_merge are the whole, and their backwards (from the final out
 * and lse) sum to the whole's: what context parallel does with the documents' ops. */
static void test_attention_doc_blocks_merge(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(attention_doc_forward);
    TP_SKIP_UNLESS(attention_doc_backward);
    TP_SKIP_UNLESS(attention_merge);
    const int64_t b = 2, t = 96, h = 2, kvh = 1, d = 16, half = t / 2;
    int64_t nq = b * t * h * d, nk = b * t * kvh * d, nkh = b * half * kvh * d, nl = b * h * t;
    int32_t *docs = malloc(sizeof(int32_t) * (size_t)(2 * b * t)), *pos = docs + b * t;
    assert_non_null(docs);
    doc_rows(docs, pos, b, t, 30);
    float *q = host_rand(nq, 1.5), *k = host_rand(nk, 1.5), *v = host_rand(nk, 1), *dout = host_rand(nq, 1);
    /* key blocks: the first and second half of each row, as (b, half) tensors */
    float *kh[2], *vh[2];
    int32_t *kp[2], *kd[2];
    for (int s = 0; s < 2; s++) {
        float *hk = malloc(sizeof(float) * (size_t)nkh), *hv = malloc(sizeof(float) * (size_t)nkh);
        int32_t *hp = malloc(sizeof(int32_t) * (size_t)(b * half)), *hd = malloc(sizeof(int32_t) * (size_t)(b * half));
        assert_true(hk && hv && hp && hd);
        for (int64_t bi = 0; bi < b; bi++) {
            memcpy(hk + bi * half * kvh * d, k + (bi * t + s * half) * kvh * d, sizeof(float) * (size_t)(half * kvh * d));
            memcpy(hv + bi * half * kvh * d, v + (bi * t + s * half) * kvh * d, sizeof(float) * (size_t)(half * kvh * d));
            memcpy(hp + bi * half, pos + bi * t + s * half, sizeof(int32_t) * (size_t)half);
            memcpy(hd + bi * half, docs + bi * t + s * half, sizeof(int32_t) * (size_t)half);
        }
        kh[s] = dev_floats(hk, nkh);
        vh[s] = dev_floats(hv, nkh);
        kp[s] = dev_ints(hp, b * half);
        kd[s] = dev_ints(hd, b * half);
        free(hk);
        free(hv);
        free(hp);
        free(hd);
    }
    float *dq_ = dev_floats(q, nq), *dk_ = dev_floats(k, nk), *dv_ = dev_floats(v, nk), *ddo = dev_floats(dout, nq);
    int32_t *dp = dev_ints(pos, b * t), *dd = dev_ints(docs, b * t);
    float *out = dev_floats(NULL, nq), *lse = dev_floats(NULL, nl), *o2 = dev_floats(NULL, nq),
          *l2 = dev_floats(NULL, nl), *wo = dev_floats(NULL, nq), *wl = dev_floats(NULL, nl);
    assert_int_equal(api->attention_doc_forward(dev, wo, wl, dq_, dk_, dv_, dp, dp, dd, dd, b, t, t, h, kvh, d), CT_OK);
    assert_int_equal(api->attention_doc_forward(dev, out, lse, dq_, kh[0], vh[0], dp, kp[0], dd, kd[0], b, t, half, h,
                                                kvh, d),
                     CT_OK);
    assert_int_equal(api->attention_doc_forward(dev, o2, l2, dq_, kh[1], vh[1], dp, kp[1], dd, kd[1], b, t, half, h,
                                                kvh, d),
                     CT_OK);
    assert_int_equal(api->attention_merge(dev, out, lse, o2, l2, b, t, h, d), CT_OK);
    double *want = download_double(wo, nq);
    expect_close_tol("attention_doc_forward merged out", out, want, nq, 1e-5);
    free(want);
    want = download_double(wl, nl);
    expect_close_tol("attention_doc_forward merged lse", lse, want, nl, 1e-5);
    free(want);
    /* backward: the whole, and the two halves (their dk, dv into their own rows) */
    float *fq = dev_floats(NULL, nq), *fk = dev_floats(NULL, nk), *fv = dev_floats(NULL, nk);
    assert_int_equal(api->attention_doc_backward(dev, fq, fk, fv, ddo, dq_, dk_, dv_, wo, wl, dp, dp, dd, dd, b, t, t,
                                                 h, kvh, d),
                     CT_OK);
    grad_buf gq = grad_new(nq);
    float *hfq = download(fq, nq), *hfk = download(fk, nk), *hfv = download(fv, nk);
    for (int64_t i = 0; i < nq; i++)
        gq.ref[i] += hfq[i];
    for (int s = 0; s < 2; s++) {
        grad_buf gk = grad_new(nkh), gv = grad_new(nkh);
        for (int64_t bi = 0; bi < b; bi++)
            for (int64_t j = 0; j < half * kvh * d; j++) {
                gk.ref[bi * half * kvh * d + j] += hfk[(bi * t + s * half) * kvh * d + j];
                gv.ref[bi * half * kvh * d + j] += hfv[(bi * t + s * half) * kvh * d + j];
            }
        assert_int_equal(api->attention_doc_backward(dev, gq.dev, gk.dev, gv.dev, ddo, dq_, kh[s], vh[s], wo, wl, dp,
                                                     kp[s], dd, kd[s], b, t, half, h, kvh, d),
                         CT_OK);
        grad_check_free(s ? "attention_doc_backward dk (second block)" : "attention_doc_backward dk (first block)",
                        &gk);
        grad_check_free(s ? "attention_doc_backward dv (second block)" : "attention_doc_backward dv (first block)",
                        &gv);
    }
    grad_check_free("attention_doc_backward dq (two blocks)", &gq);
    free(hfq);
    free(hfk);
    free(hfv);
    float *bufs[] = {dq_, dk_, dv_, ddo, out, lse, o2, l2, wo, wl, fq, fk, fv, kh[0], kh[1], vh[0], vh[1]};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        api->free(dev, bufs[i]);
    int32_t *ibufs[] = {dp, dd, kp[0], kp[1], kd[0], kd[1]};
    for (size_t i = 0; i < sizeof ibufs / sizeof ibufs[0]; i++)
        api->free(dev, ibufs[i]);
    free(docs);
    free(q);
    free(k);
    free(v);
    free(dout);
}

static void test_attention_block_no_visible_key(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(attention_block_forward);
    TP_SKIP_UNLESS(attention_block_backward);
    const int64_t b = 2, tq = 4, tk = 5, h = 2, kvh = 1, d = 8;
    const int32_t q_pos[4] = {9, 1, 4, 0}, k_pos[5] = {3, 7, 2, 8, 5};
    int64_t nq = b * tq * h * d, nk = b * tk * kvh * d, nl = b * h * tq;
    float *q = host_rand(nq, 1.5), *k = host_rand(nk, 1.5), *v = host_rand(nk, 1),
          *dout = host_rand(nq, 1);
    float *dq_ = dev_floats(q, nq), *dk_ = dev_floats(k, nk), *dv_ = dev_floats(v, nk);
    float *ddout = dev_floats(dout, nq), *out = dev_floats(NULL, nq), *lse = dev_floats(NULL, nl);
    int32_t *dqp = dev_ints(q_pos, tq), *dkp = dev_ints(k_pos, tk);
    assert_int_equal(api->attention_block_forward(dev, out, lse, dq_, dk_, dv_, dqp, dkp, b, tq, tk, h,
                                                  kvh, d),
                     CT_OK);
    /* the reference: each query's visible keys in double */
    double *ro = ref_alloc(nq), *rl = ref_alloc(nl);
    double scale = 1.0 / sqrt((double)d);
    for (int64_t bi = 0; bi < b; bi++)
        for (int64_t hi = 0; hi < h; hi++)
            for (int64_t i = 0; i < tq; i++) {
                double s[5], mx = -INFINITY, sum = 0;
                const float *qi = q + ((bi * tq + i) * h + hi) * d;
                for (int64_t j = 0; j < tk; j++) {
                    const float *kj = k + (bi * tk + j) * kvh * d;
                    s[j] = 0;
                    for (int64_t c = 0; c < d; c++)
                        s[j] += (double)qi[c] * kj[c] * scale;
                    if (k_pos[j] <= q_pos[i])
                        mx = fmax(mx, s[j]);
                }
                double *oi = ro + ((bi * tq + i) * h + hi) * d;
                for (int64_t j = 0; j < tk; j++)
                    if (k_pos[j] <= q_pos[i])
                        sum += exp(s[j] - mx);
                rl[(bi * h + hi) * tq + i] = sum > 0 ? mx + log(sum) : -INFINITY;
                for (int64_t j = 0; j < tk; j++)
                    if (k_pos[j] <= q_pos[i])
                        for (int64_t c = 0; c < d; c++)
                            oi[c] += exp(s[j] - mx) / sum * v[(bi * tk + j) * kvh * d + c];
            }
    expect_close("attention_block_forward out (masked queries)", out, ro, nq);
    float *hl = download(lse, nl);
    for (int64_t i = 0; i < nl; i++) {
        if (isinf(rl[i])) {
            if (!(isinf(hl[i]) && hl[i] < 0))
                fail_msg("lse[%lld] = %g for a query that sees no key, expected -inf", (long long)i,
                         (double)hl[i]);
            rl[i] = 0; /* compared as 0 below */
            hl[i] = 0;
        }
        assert_true(fabs(hl[i] - rl[i]) <= rtol * (1 + fabs(rl[i])));
    }
    free(hl);
    /* backward with this block as the whole of the keys: finite, and nothing for queries 1 and 3 */
    grad_buf gq = grad_new(nq);
    float *gk = dev_floats(NULL, nk), *gv = dev_floats(NULL, nk);
    assert_int_equal(api->attention_block_backward(dev, gq.dev, gk, gv, ddout, dq_, dk_, dv_, out, lse,
                                                   dqp, dkp, b, tq, tk, h, kvh, d),
                     CT_OK);
    float *hq = download(gq.dev, nq), *hk = download(gk, nk), *hv = download(gv, nk);
    for (int64_t i = 0; i < nq; i++) {
        int64_t row = (i / (h * d)) % tq;
        assert_false(isnan(hq[i]));
        if (row == 1 || row == 3)
            assert_true(hq[i] == gq.init[i]);
    }
    for (int64_t i = 0; i < nk; i++)
        assert_true(isfinite(hk[i]) && isfinite(hv[i]));
    free(hq);
    free(hk);
    free(hv);
    api->free(dev, gq.dev);
    free(gq.init);
    free(gq.ref);
    expect_error(api->attention_block_forward(dev, out, lse, dq_, dk_, dv_, dqp, dkp, b, tq, tk, 3, 2,
                                              d),
                 CT_ERR_INVALID, "attention_block_forward with h % kvh != 0");
    float *bufs[] = {dq_, dk_, dv_, ddout, out, lse, gk, gv};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        api->free(dev, bufs[i]);
    api->free(dev, dqp);
    api->free(dev, dkp);
    free(q);
    free(k);
    free(v);
    free(dout);
    free(ro);
    free(rl);
}

/* The merge with -inf on one side or both: that side drops out, no NaN. */
static void test_attention_merge_infinite(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(attention_merge);
    const int64_t b = 1, t = 4, h = 1, d = 4, n = t * d;
    const float ninf = -INFINITY;
    float l1[4] = {ninf, 0.5f, ninf, 1.25f}, l2[4] = {0.75f, ninf, ninf, -0.5f};
    float *o1 = host_rand(n, 1), *o2 = host_rand(n, 1);
    for (int64_t c = 0; c < d; c++) /* a side at -inf holds 0 (as attention_block_forward leaves it) */
        o1[c] = o1[2 * d + c] = o2[d + c] = o2[2 * d + c] = 0;
    float *do1 = dev_floats(o1, n), *do2 = dev_floats(o2, n), *dl1 = dev_floats(l1, t),
          *dl2 = dev_floats(l2, t);
    assert_int_equal(api->attention_merge(dev, do1, dl1, do2, dl2, b, t, h, d), CT_OK);
    double *want = ref_alloc(n);
    for (int64_t c = 0; c < d; c++) {
        want[c] = o2[c];
        want[d + c] = o1[d + c];
        want[2 * d + c] = 0;
        double l = log(exp(1.25) + exp(-0.5));
        want[3 * d + c] = o1[3 * d + c] * exp(1.25 - l) + o2[3 * d + c] * exp(-0.5 - l);
    }
    expect_close("attention_merge out", do1, want, n);
    float *hl = download(dl1, t);
    assert_true(fabs(hl[0] - 0.75) < 1e-6 && fabs(hl[1] - 0.5) < 1e-6);
    assert_true(isinf(hl[2]) && hl[2] < 0);
    assert_true(fabs(hl[3] - log(exp(1.25) + exp(-0.5))) < 1e-6);
    free(hl);
    api->free(dev, do1);
    api->free(dev, do2);
    api->free(dev, dl1);
    api->free(dev, dl2);
    free(o1);
    free(o2);
    free(want);
}

/* Shuffled positions, twice: the same bits. */
static void test_attention_block_is_deterministic(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(attention_block_forward);
    TP_SKIP_UNLESS(attention_block_backward);
    const int64_t b = 2, t = 96, h = 4, kvh = 2, d = 16, tl = t / 2;
    int32_t qp[48], kp[48];
    cp_positions(qp, t, 2, 1);
    cp_positions(kp, t, 2, 0);
    shuffle_positions(qp, tl);
    shuffle_positions(kp, tl);
    int64_t nq = b * tl * h * d, nk = b * tl * kvh * d, nl = b * h * tl;
    float *q = host_rand(nq, 1.5), *k = host_rand(nk, 1.5), *v = host_rand(nk, 1),
          *dout = host_rand(nq, 1);
    float *dq_ = dev_floats(q, nq), *dk_ = dev_floats(k, nk), *dv_ = dev_floats(v, nk),
          *ddout = dev_floats(dout, nq);
    int32_t *dqp = dev_ints(qp, tl), *dkp = dev_ints(kp, tl);
    float *res[2][5];
    for (int run = 0; run < 2; run++) {
        float *out = dev_floats(NULL, nq), *lse = dev_floats(NULL, nl), *gq = dev_floats(NULL, nq),
              *gk = dev_floats(NULL, nk), *gv = dev_floats(NULL, nk);
        assert_int_equal(api->attention_block_forward(dev, out, lse, dq_, dk_, dv_, dqp, dkp, b, tl, tl,
                                                      h, kvh, d),
                         CT_OK);
        assert_int_equal(api->attention_block_backward(dev, gq, gk, gv, ddout, dq_, dk_, dv_, out, lse,
                                                       dqp, dkp, b, tl, tl, h, kvh, d),
                         CT_OK);
        float *bufs[5] = {out, lse, gq, gk, gv};
        int64_t ns[5] = {nq, nl, nq, nk, nk};
        for (int i = 0; i < 5; i++) {
            res[run][i] = download(bufs[i], ns[i]);
            api->free(dev, bufs[i]);
        }
        if (run == 1)
            for (int i = 0; i < 5; i++) {
                expect_same_bits("attention_block", res[0][i], res[1][i], ns[i]);
                free(res[0][i]);
                free(res[1][i]);
            }
    }
    float *bufs[] = {dq_, dk_, dv_, ddout};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        api->free(dev, bufs[i]);
    api->free(dev, dqp);
    api->free(dev, dkp);
    free(q);
    free(k);
    free(v);
    free(dout);
}

static void test_bad_arguments_are_errors(void **state)
{
    (void)state;
    float *buf = dev_floats(NULL, 64);
    expect_error(api->matmul(dev, buf, buf, buf, -1, 2, 2, 0, 0, 1, 0), CT_ERR_INVALID,
                 "matmul m = -1");
    expect_error(api->axpy(dev, buf, buf, 1, -5), CT_ERR_INVALID, "axpy n = -5");
    expect_error(api->copy(dev, buf, buf, 4, (ct_copy_kind)99), CT_ERR_INVALID, "copy kind 99");
    expect_error(api->adamw(dev, buf, buf, buf, buf, 4, 1e-3f, 0.9f, 0.95f, 1e-8f, 0, 0),
                 CT_ERR_INVALID, "adamw step 0");
    expect_error(api->rmsnorm_forward(dev, buf, buf, buf, buf, 2, -3, 1e-5f), CT_ERR_INVALID,
                 "rmsnorm c = -3");
    /* empty shapes are fine */
    expect_error(api->matmul(dev, buf, buf, buf, 0, 4, 4, 0, 0, 1, 0), CT_OK, "matmul m = 0");
    expect_error(api->attention_forward(dev, buf, buf, buf, buf, buf, 0, 4, 2, 1, 8), CT_OK,
                 "attention b = 0");
    api->free(dev, buf);
}

/* ---------------------------------------------------------------- ABI 2.14: mixture of experts */

static int32_t *download_ints(const int32_t *d, int64_t n)
{
    return download_bytes(d, (size_t)n * sizeof(int32_t));
}

static void expect_ints(const char *what, const int32_t *dgot, const int32_t *ref, int64_t n)
{
    int32_t *got = download_ints(dgot, n);
    for (int64_t i = 0; i < n; i++)
        if (got[i] != ref[i]) {
            int32_t g = got[i];
            free(got);
            fail_msg("%s[%lld] = %d, expected %d", what, (long long)i, g, ref[i]);
        }
    free(got);
}

static void test_moe_scores(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(moe_scores_forward);
    const int64_t n = 37, e = 13;
    for (int func = CT_MOE_SOFTMAX; func <= CT_MOE_SIGMOID; func++) {
        float *l = host_rand(n * e, 4), *ds = host_rand(n * e, 1);
        double *ref = ref_alloc(n * e);
        for (int64_t t = 0; t < n; t++) {
            double m = -INFINITY, sum = 0;
            for (int64_t j = 0; j < e; j++)
                m = fmax(m, l[t * e + j]);
            for (int64_t j = 0; j < e; j++)
                sum += exp((double)l[t * e + j] - m);
            for (int64_t j = 0; j < e; j++)
                ref[t * e + j] = func == CT_MOE_SIGMOID ? 1 / (1 + exp(-(double)l[t * e + j]))
                                                        : exp((double)l[t * e + j] - m) / sum;
        }
        float *dl = dev_floats(l, n * e), *dsc = dev_floats(NULL, n * e), *dds = dev_floats(ds, n * e);
        expect_error(api->moe_scores_forward(dev, dsc, dl, n, e, func), CT_OK, "moe_scores_forward");
        expect_close(func ? "moe_scores_forward sigmoid" : "moe_scores_forward softmax", dsc, ref, n * e);
        float *s = download(dsc, n * e);
        grad_buf g = grad_new(n * e);
        for (int64_t t = 0; t < n; t++) {
            double dot = 0;
            for (int64_t j = 0; j < e; j++)
                dot += (double)ds[t * e + j] * s[t * e + j];
            for (int64_t j = 0; j < e; j++) {
                double sj = s[t * e + j], dj = ds[t * e + j];
                g.ref[t * e + j] += func == CT_MOE_SIGMOID ? dj * sj * (1 - sj) : sj * (dj - dot);
            }
        }
        expect_error(api->moe_scores_backward(dev, g.dev, dds, dsc, n, e, func), CT_OK, "moe_scores_backward");
        grad_check_free("moe_scores_backward", &g);
        api->free(dev, dl);
        api->free(dev, dsc);
        api->free(dev, dds);
        free(l);
        free(ds);
        free(s);
        free(ref);
    }
}

/* The reference's ranking: by value (computed in f32, as the device does) descending, then index. */
typedef struct moe_ranked {
    float v;
    int64_t i;
} moe_ranked;

static int moe_ranked_cmp(const void *a, const void *b)
{
    const moe_ranked *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* idx (n,k) and weights (n,k) by sorting: the group scores by sorting each group, the groups by
 * sorting their scores, the eligible experts by sorting them. */
static void moe_topk_reference(int32_t *idx, double *w, const float *s, const float *bias, int64_t n, int64_t e,
                               int64_t k, int64_t n_groups, int64_t topk_groups, int normalize, double scale)
{
    moe_ranked *r = malloc((size_t)e * sizeof *r), *gr = malloc((size_t)e * sizeof *gr);
    char *ok = malloc((size_t)e);
    assert_true(r && gr && ok);
    const int64_t groups = n_groups > 1 ? n_groups : 1, gsize = e / groups;
    for (int64_t t = 0; t < n; t++) {
        for (int64_t j = 0; j < e; j++)
            r[j] = (moe_ranked){s[t * e + j] + (bias ? bias[j] : 0.0f), j};
        memset(ok, 1, (size_t)e);
        if (groups > 1) {
            for (int64_t g = 0; g < groups; g++) {
                moe_ranked m[64];
                assert_true(gsize <= 64);
                memcpy(m, r + g * gsize, (size_t)gsize * sizeof *m);
                qsort(m, (size_t)gsize, sizeof *m, moe_ranked_cmp);
                gr[g] = (moe_ranked){gsize >= 2 ? m[0].v + m[1].v : m[0].v, g};
            }
            qsort(gr, (size_t)groups, sizeof *gr, moe_ranked_cmp);
            memset(ok, 0, (size_t)e);
            for (int64_t q = 0; q < topk_groups; q++)
                memset(ok + gr[q].i * gsize, 1, (size_t)gsize);
        }
        int64_t m = 0;
        for (int64_t j = 0; j < e; j++)
            if (ok[j])
                r[m++] = r[j];
        qsort(r, (size_t)m, sizeof *r, moe_ranked_cmp);
        double sum = 0;
        for (int64_t c = 0; c < k; c++) {
            idx[t * k + c] = (int32_t)r[c].i;
            sum += s[t * e + r[c].i];
        }
        for (int64_t c = 0; c < k; c++)
            w[t * k + c] = s[t * e + r[c].i] * (normalize ? scale / (sum + 1e-20) : scale);
    }
    free(r);
    free(gr);
    free(ok);
}

static void test_moe_topk(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(moe_topk_forward);
    const int64_t n = 41, e = 16;
    float *s = host_rand(n * e, 1), *bias = host_rand(e, 0.3), *dw = host_rand(n * e, 1);
    for (int64_t j = 0; j < n * e; j++)
        s[j] = 0.5f + 0.5f * s[j]; /* scores in [0, 1), as softmax and sigmoid give */
    for (int64_t j = 0; j < e; j++) /* row 0: every score equal: the lowest indices win */
        s[j] = 0.25f;
    for (int64_t j = 0; j < e; j++) /* row 1: ties between non-neighbours */
        s[e + j] = j % 3 == 0 ? 0.75f : 0.125f;
    for (int64_t j = 2 * e; j < 3 * e; j++) /* row 2: two tied groups */
        s[j] = (j % 4) == 0 ? 0.5f : 0.125f;
    float *ds = dev_floats(s, n * e), *db = dev_floats(bias, e);
    struct {
        int64_t k, n_groups, topk_groups;
        int bias, normalize;
        float scale;
    } cases[] = {
        {1, 0, 0, 0, 0, 1.0f}, {3, 0, 0, 0, 1, 1.0f}, {4, 0, 0, 1, 1, 2.5f},  {2, 1, 1, 1, 0, 1.0f},
        {3, 4, 2, 0, 1, 1.0f}, {5, 4, 2, 1, 1, 2.5f}, {8, 8, 4, 1, 0, 0.5f}, {16, 4, 4, 1, 1, 1.0f},
        {2, 16, 2, 1, 1, 1.0f},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t k = cases[c].k;
        char what[160];
        snprintf(what, sizeof what, "moe_topk_forward k=%lld n_groups=%lld topk_groups=%lld bias=%d normalize=%d",
                 (long long)k, (long long)cases[c].n_groups, (long long)cases[c].topk_groups, cases[c].bias,
                 cases[c].normalize);
        int32_t *ridx = malloc((size_t)(n * k) * sizeof *ridx);
        double *rw = ref_alloc(n * k);
        assert_non_null(ridx);
        moe_topk_reference(ridx, rw, s, cases[c].bias ? bias : NULL, n, e, k, cases[c].n_groups,
                           cases[c].topk_groups, cases[c].normalize, cases[c].scale);
        int32_t *didx = dev_ints(NULL, n * k);
        float *dwt = dev_floats(NULL, n * k);
        expect_error(api->moe_topk_forward(dev, didx, dwt, ds, cases[c].bias ? db : NULL, n, e, k, cases[c].n_groups,
                                           cases[c].topk_groups, cases[c].normalize, cases[c].scale),
                     CT_OK, what);
        expect_ints(what, didx, ridx, n * k);
        expect_close(what, dwt, rw, n * k);
        /* backward: dscores += d(weights)/d(scores)^T dweights at the chosen experts */
        grad_buf g = grad_new(n * e);
        float *ddw = dev_floats(dw, n * k);
        for (int64_t t = 0; t < n; t++) {
            double sum = 0, dot = 0;
            for (int64_t q = 0; q < k; q++) {
                sum += s[t * e + ridx[t * k + q]];
                dot += (double)dw[t * k + q] * s[t * e + ridx[t * k + q]];
            }
            for (int64_t q = 0; q < k; q++)
                g.ref[t * e + ridx[t * k + q]] +=
                    cases[c].normalize ? cases[c].scale * (dw[t * k + q] / (sum + 1e-20) - dot / ((sum + 1e-20) * (sum + 1e-20)))
                                       : cases[c].scale * dw[t * k + q];
        }
        expect_error(api->moe_topk_backward(dev, g.dev, ddw, ds, didx, n, e, k, cases[c].normalize, cases[c].scale),
                     CT_OK, "moe_topk_backward");
        grad_check_free("moe_topk_backward", &g);
        api->free(dev, ddw);
        api->free(dev, didx);
        api->free(dev, dwt);
        free(ridx);
        free(rw);
    }
    /* ties: row 0 takes experts 0..k-1 */
    int32_t *didx = dev_ints(NULL, n * 4);
    float *dwt = dev_floats(NULL, n * 4);
    expect_error(api->moe_topk_forward(dev, didx, dwt, ds, NULL, n, e, 4, 0, 0, 0, 1.0f), CT_OK, "moe_topk ties");
    int32_t *got = download_ints(didx, 4 * 2);
    for (int q = 0; q < 4; q++)
        assert_int_equal(got[q], q);
    assert_int_equal(got[4], 0); /* row 1: 0, 3, 6, 9 tie at 0.75 */
    assert_int_equal(got[5], 3);
    free(got);
    /* bad arguments */
    expect_error(api->moe_topk_forward(dev, didx, dwt, ds, NULL, n, e, e + 1, 0, 0, 0, 1.0f), CT_ERR_INVALID,
                 "moe_topk_forward k > e");
    expect_error(api->moe_topk_forward(dev, didx, dwt, ds, NULL, n, e, 0, 0, 0, 0, 1.0f), CT_ERR_INVALID,
                 "moe_topk_forward k = 0");
    expect_error(api->moe_topk_forward(dev, didx, dwt, ds, NULL, n, e, 2, 3, 1, 0, 1.0f), CT_ERR_INVALID,
                 "moe_topk_forward 3 groups of 16 experts");
    expect_error(api->moe_topk_forward(dev, didx, dwt, ds, NULL, n, e, 2, 4, 5, 0, 1.0f), CT_ERR_INVALID,
                 "moe_topk_forward topk_groups > n_groups");
    expect_error(api->moe_topk_forward(dev, didx, dwt, ds, NULL, n, e, 9, 4, 2, 0, 1.0f), CT_ERR_INVALID,
                 "moe_topk_forward k past the eligible experts");
    expect_error(api->moe_topk_forward(dev, NULL, dwt, ds, NULL, n, e, 2, 0, 0, 0, 1.0f), CT_ERR_INVALID,
                 "moe_topk_forward idx NULL");
    expect_error(api->moe_scores_forward(dev, dwt, ds, n, e, 7), CT_ERR_INVALID, "moe_scores_forward func 7");
    api->free(dev, didx);
    api->free(dev, dwt);
    api->free(dev, ds);
    api->free(dev, db);
    free(s);
    free(bias);
    free(dw);
}

/* The reference permutation: a stable sort by expert, out-of-range indices after every expert. */
static void moe_permute_reference(int32_t *order, int32_t *inv, int32_t *offsets, const int32_t *idx, int64_t nk,
                                  int64_t e)
{
    int64_t p = 0;
    for (int64_t g = 0; g <= e; g++) {
        offsets[g < e ? g : e] = (int32_t)p;
        if (g == e)
            offsets[e] = (int32_t)p;
        for (int64_t j = 0; j < nk; j++) {
            int64_t b = idx[j] >= 0 && idx[j] < e ? idx[j] : e;
            if (b == g) {
                order[p] = (int32_t)j;
                inv[j] = (int32_t)p++;
            }
        }
    }
}

static void test_moe_permute(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(moe_permute);
    /* nk = 21 (7 tokens x 3), 5 experts, expert 3 chosen by nobody; then a longer one over many
     * experts, and one with indices no expert owns */
    const int64_t sizes[][2] = {{21, 5}, {1531, 37}, {0, 4}, {19, 6}};
    for (int c = 0; c < 4; c++) {
        const int64_t nk = sizes[c][0], e = sizes[c][1];
        int32_t *idx = malloc((size_t)(nk + 1) * sizeof *idx), *order = malloc((size_t)(nk + 1) * sizeof *order),
                *inv = malloc((size_t)(nk + 1) * sizeof *inv), *offsets = malloc((size_t)(e + 1) * sizeof *offsets);
        assert_true(idx && order && inv && offsets);
        for (int64_t j = 0; j < nk; j++) {
            idx[j] = (int32_t)(rnd_u64() % (uint64_t)e);
            if (c == 0 && idx[j] == 3)
                idx[j] = 4;
            if (c == 3 && j % 5 == 2)
                idx[j] = j % 2 ? -1 : (int32_t)(e + j);
        }
        moe_permute_reference(order, inv, offsets, idx, nk, e);
        int32_t *di = dev_ints(idx, nk), *dord = dev_ints(NULL, nk), *dinv = dev_ints(NULL, nk),
                *doff = dev_ints(NULL, e + 1);
        expect_error(api->moe_permute(dev, dord, dinv, doff, di, nk, e), CT_OK, "moe_permute");
        expect_ints("moe_permute offsets", doff, offsets, e + 1);
        expect_ints("moe_permute order", dord, order, nk);
        expect_ints("moe_permute inv", dinv, inv, nk);
        if (c == 0)
            assert_int_equal(offsets[3], offsets[4]); /* the expert nobody chose holds no row */
        api->free(dev, di);
        api->free(dev, dord);
        api->free(dev, dinv);
        api->free(dev, doff);
        free(idx);
        free(order);
        free(inv);
        free(offsets);
    }
    int32_t *buf = dev_ints(NULL, 8);
    expect_error(api->moe_permute(dev, buf, buf, buf, buf, 4, 0), CT_ERR_INVALID, "moe_permute e = 0");
    expect_error(api->moe_permute(dev, buf, buf, NULL, buf, 4, 2), CT_ERR_INVALID, "moe_permute offsets NULL");
    api->free(dev, buf);
}

/* A random permutation of 0..nk-1 (order) and its inverse. */
static void moe_random_permutation(int32_t *order, int32_t *inv, int64_t nk)
{
    for (int64_t j = 0; j < nk; j++)
        order[j] = (int32_t)j;
    for (int64_t j = nk - 1; j > 0; j--) {
        int64_t r = (int64_t)(rnd_u64() % (uint64_t)(j + 1));
        int32_t tmp = order[j];
        order[j] = order[r];
        order[r] = tmp;
    }
    for (int64_t j = 0; j < nk; j++)
        inv[order[j]] = (int32_t)j;
}

static void test_moe_gather_and_combine(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(moe_gather_forward);
    const int64_t n = 7, k = 3, d = 45, nk = n * k; /* 21 rows, d past one 32-wide slice */
    int32_t order[21], inv[21];
    moe_random_permutation(order, inv, nk);
    float *x = host_rand(n * d, 1), *dout = host_rand(nk * d, 1), *y = host_rand(nk * d, 1),
          *w = host_rand(nk, 1), *dcomb = host_rand(n * d, 1);
    int32_t *dord = dev_ints(order, nk), *dinv = dev_ints(inv, nk);
    float *dx = dev_floats(x, n * d), *dg = dev_floats(NULL, nk * d), *ddout = dev_floats(dout, nk * d),
          *dy = dev_floats(y, nk * d), *dw = dev_floats(w, nk), *dc = dev_floats(NULL, n * d),
          *ddc = dev_floats(dcomb, n * d);
    /* gather */
    double *ref = ref_alloc(nk * d);
    for (int64_t j = 0; j < nk; j++)
        for (int64_t c = 0; c < d; c++)
            ref[j * d + c] = x[(order[j] / k) * d + c];
    expect_error(api->moe_gather_forward(dev, dg, dx, dord, n, k, d), CT_OK, "moe_gather_forward");
    expect_close("moe_gather_forward", dg, ref, nk * d);
    grad_buf gx = grad_new(n * d);
    for (int64_t t = 0; t < n; t++)
        for (int64_t s = 0; s < k; s++)
            for (int64_t c = 0; c < d; c++)
                gx.ref[t * d + c] += dout[inv[t * k + s] * d + c];
    expect_error(api->moe_gather_backward(dev, gx.dev, ddout, dinv, n, k, d), CT_OK, "moe_gather_backward");
    grad_check_free("moe_gather_backward", &gx);
    /* combine */
    double *rc = ref_alloc(n * d);
    for (int64_t t = 0; t < n; t++)
        for (int64_t s = 0; s < k; s++)
            for (int64_t c = 0; c < d; c++)
                rc[t * d + c] += (double)w[t * k + s] * y[inv[t * k + s] * d + c];
    expect_error(api->moe_combine_forward(dev, dc, dy, dw, dinv, n, k, d), CT_OK, "moe_combine_forward");
    expect_close("moe_combine_forward", dc, rc, n * d);
    grad_buf gy = grad_new(nk * d), gw = grad_new(nk);
    for (int64_t t = 0; t < n; t++)
        for (int64_t s = 0; s < k; s++) {
            int64_t j = inv[t * k + s];
            for (int64_t c = 0; c < d; c++) {
                gy.ref[j * d + c] += (double)w[t * k + s] * dcomb[t * d + c];
                gw.ref[t * k + s] += (double)dcomb[t * d + c] * y[j * d + c];
            }
        }
    expect_error(api->moe_combine_backward(dev, gy.dev, gw.dev, ddc, dy, dw, dinv, n, k, d), CT_OK,
                 "moe_combine_backward");
    grad_check_free("moe_combine_backward dy", &gy);
    grad_check_free("moe_combine_backward dweights", &gw);
    /* the same bits twice */
    float *a1 = download(dc, n * d);
    expect_error(api->moe_combine_forward(dev, dc, dy, dw, dinv, n, k, d), CT_OK, "moe_combine_forward again");
    float *a2 = download(dc, n * d);
    assert_memory_equal(a1, a2, (size_t)(n * d) * sizeof(float));
    /* bad arguments, and no work without pointers */
    expect_error(api->moe_gather_forward(dev, dg, dx, dord, n, 0, d), CT_ERR_INVALID, "moe_gather_forward k = 0");
    expect_error(api->moe_combine_forward(dev, dc, dy, NULL, dinv, n, k, d), CT_ERR_INVALID,
                 "moe_combine_forward weights NULL");
    expect_error(api->moe_gather_backward(dev, NULL, NULL, NULL, 0, k, d), CT_OK, "moe_gather_backward n = 0");
    free(a1);
    free(a2);
    free(ref);
    free(rc);
    free(x);
    free(dout);
    free(y);
    free(w);
    free(dcomb);
    float *bufs[] = {dx, dg, ddout, dy, dw, dc, ddc};
    for (size_t b = 0; b < sizeof bufs / sizeof bufs[0]; b++)
        api->free(dev, bufs[b]);
    api->free(dev, dord);
    api->free(dev, dinv);
}

static void test_grouped_matmul(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(grouped_matmul_forward);
    /* segments of 7, 0, 33 and 3 rows (expert 1 gets none) and 5 rows past every segment; then
     * one expert holding every row; o and i across several tiles and not multiples of anything */
    const int32_t offs1[] = {0, 7, 7, 40, 43}, offs2[] = {0, 29};
    const struct {
        const int32_t *offsets;
        int64_t m, e, o, i;
    } cases[] = {{offs1, 48, 4, 37, 45}, {offs2, 29, 1, 5, 70}};
    for (int c = 0; c < 2; c++) {
        const int64_t m = cases[c].m, e = cases[c].e, o = cases[c].o, in = cases[c].i;
        const int32_t *off = cases[c].offsets;
        float *x = host_rand(m * in, 1), *w = host_rand(e * o * in, 1), *dyh = host_rand(m * o, 1),
              *y0 = host_rand(m * o, 1);
        float *dx = dev_floats(x, m * in), *dw = dev_floats(w, e * o * in), *ddy = dev_floats(dyh, m * o),
              *dy = dev_floats(y0, m * o);
        int32_t *doff = dev_ints(off, e + 1);
        double *ref = ref_alloc(m * o);
        for (int64_t r = 0; r < m; r++)
            for (int64_t q = 0; q < o; q++)
                ref[r * o + q] = y0[r * o + q]; /* rows in no segment keep their values */
        grad_buf gx = grad_new(m * in), gw = grad_new(e * o * in);
        for (int64_t g = 0; g < e; g++)
            for (int64_t r = off[g]; r < off[g + 1]; r++)
                for (int64_t q = 0; q < o; q++) {
                    double acc = 0;
                    for (int64_t p = 0; p < in; p++) {
                        acc += (double)x[r * in + p] * w[(g * o + q) * in + p];
                        gx.ref[r * in + p] += (double)dyh[r * o + q] * w[(g * o + q) * in + p];
                        gw.ref[(g * o + q) * in + p] += (double)dyh[r * o + q] * x[r * in + p];
                    }
                    ref[r * o + q] = acc;
                }
        expect_error(api->grouped_matmul_forward(dev, dy, dx, dw, doff, m, e, o, in), CT_OK, "grouped_matmul_forward");
        expect_close("grouped_matmul_forward", dy, ref, m * o);
        expect_error(api->grouped_matmul_backward_input(dev, gx.dev, ddy, dw, doff, m, e, o, in), CT_OK,
                     "grouped_matmul_backward_input");
        grad_check_free("grouped_matmul_backward_input", &gx);
        expect_error(api->grouped_matmul_backward_weight(dev, gw.dev, ddy, dx, doff, m, e, o, in), CT_OK,
                     "grouped_matmul_backward_weight");
        grad_check_free("grouped_matmul_backward_weight", &gw);
        float *a1 = download(dy, m * o);
        expect_error(api->grouped_matmul_forward(dev, dy, dx, dw, doff, m, e, o, in), CT_OK, "grouped_matmul again");
        float *a2 = download(dy, m * o);
        assert_memory_equal(a1, a2, (size_t)(m * o) * sizeof(float));
        expect_error(api->grouped_matmul_forward(dev, dy, dx, dw, NULL, m, e, o, in), CT_ERR_INVALID,
                     "grouped_matmul_forward offsets NULL");
        expect_error(api->grouped_matmul_forward(dev, dy, dx, dw, doff, m, 0, o, in), CT_ERR_INVALID,
                     "grouped_matmul_forward e = 0");
        expect_error(api->grouped_matmul_backward_weight(dev, gw.dev, ddy, dx, doff, -1, e, o, in), CT_ERR_INVALID,
                     "grouped_matmul_backward_weight m = -1");
        /* offsets that break the contract: refused with a message by a device that reads them, or
         * clamped into [0, m] by one that cannot without a round trip; never a read past the rows */
        int32_t bad[5] = {0, (int32_t)m + 9, 3, -4, (int32_t)m * 2};
        int32_t *dbad = dev_ints(bad, e + 1);
        ct_status st = api->grouped_matmul_forward(dev, dy, dx, dw, dbad, m, e, o, in);
        if (st != CT_OK)
            expect_error(st, CT_ERR_INVALID, "grouped_matmul_forward with bad offsets");
        st = api->grouped_matmul_backward_weight(dev, dw, ddy, dx, dbad, m, e, o, in);
        if (st != CT_OK)
            expect_error(st, CT_ERR_INVALID, "grouped_matmul_backward_weight with bad offsets");
        api->free(dev, dbad);
        free(a1);
        free(a2);
        free(ref);
        free(x);
        free(w);
        free(dyh);
        free(y0);
        api->free(dev, dx);
        api->free(dev, dw);
        api->free(dev, ddy);
        api->free(dev, dy);
        api->free(dev, doff);
    }
}

/* The ops composed as a layer uses them (scores, top-k, permute, gather, one grouped GEMM, combine)
 * against the same layer computed here in double from the device's routing; run twice, the same bits. */
static void test_moe_layer_composed(void **state)
{
    (void)state;
    TP_SKIP_UNLESS(moe_combine_forward);
    const int64_t n = 29, e = 8, k = 3, d = 19, o = 23, nk = n * k;
    float *logits = host_rand(n * e, 3), *x = host_rand(n * d, 1), *w = host_rand(e * o * d, 0.5);
    float *dl = dev_floats(logits, n * e), *dxs = dev_floats(x, n * d), *dwt = dev_floats(w, e * o * d);
    float *ds = dev_floats(NULL, n * e), *dweights = dev_floats(NULL, nk), *dgx = dev_floats(NULL, nk * d),
          *dh = dev_floats(NULL, nk * o), *dout = dev_floats(NULL, n * o);
    int32_t *didx = dev_ints(NULL, nk), *dord = dev_ints(NULL, nk), *dinv = dev_ints(NULL, nk),
            *doff = dev_ints(NULL, e + 1);
    float *first = NULL;
    for (int run = 0; run < 2; run++) {
        expect_error(api->moe_scores_forward(dev, ds, dl, n, e, CT_MOE_SIGMOID), CT_OK, "layer scores");
        expect_error(api->moe_topk_forward(dev, didx, dweights, ds, NULL, n, e, k, 4, 2, 1, 2.0f), CT_OK, "layer topk");
        expect_error(api->moe_permute(dev, dord, dinv, doff, didx, nk, e), CT_OK, "layer permute");
        expect_error(api->moe_gather_forward(dev, dgx, dxs, dord, n, k, d), CT_OK, "layer gather");
        expect_error(api->grouped_matmul_forward(dev, dh, dgx, dwt, doff, nk, e, o, d), CT_OK, "layer grouped");
        expect_error(api->moe_combine_forward(dev, dout, dh, dweights, dinv, n, k, o), CT_OK, "layer combine");
        float *got = download(dout, n * o);
        if (run == 0)
            first = got;
        else {
            assert_memory_equal(first, got, (size_t)(n * o) * sizeof(float));
            free(got);
        }
    }
    int32_t *idx = download_ints(didx, nk);
    float *wts = download(dweights, nk);
    double *ref = ref_alloc(n * o);
    for (int64_t t = 0; t < n; t++)
        for (int64_t s = 0; s < k; s++) {
            int64_t g = idx[t * k + s];
            assert_true(g >= 0 && g < e);
            for (int64_t q = 0; q < o; q++) {
                double acc = 0;
                for (int64_t p = 0; p < d; p++)
                    acc += (double)x[t * d + p] * w[(g * o + q) * d + p];
                ref[t * o + q] += wts[t * k + s] * acc;
            }
        }
    expect_close("the composed MoE layer", dout, ref, n * o);
    free(first);
    free(idx);
    free(wts);
    free(ref);
    free(logits);
    free(x);
    free(w);
    float *fb[] = {dl, dxs, dwt, ds, dweights, dgx, dh, dout};
    for (size_t b = 0; b < sizeof fb / sizeof fb[0]; b++)
        api->free(dev, fb[b]);
    int32_t *ib[] = {didx, dord, dinv, doff};
    for (size_t b = 0; b < sizeof ib / sizeof ib[0]; b++)
        api->free(dev, ib[b]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plugin_info),
        cmocka_unit_test(test_copy_async),
        cmocka_unit_test(test_adamw_bf16_moments),
        cmocka_unit_test(test_info_and_peak_flops),
        cmocka_unit_test(test_memory_alloc_copy_zero),
        cmocka_unit_test(test_matmul_against_reference),
        cmocka_unit_test(test_vector_ops),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_layernorm_with_bias),
        cmocka_unit_test(test_layernorm_without_bias),
        cmocka_unit_test(test_bias),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attention_gqa),
        cmocka_unit_test(test_attention_mha_and_mqa),
        cmocka_unit_test(test_attention_rejects_bad_heads),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_bf16_casts),
        cmocka_unit_test(test_float8_decode_every_code),
        cmocka_unit_test(test_float8_group_scales),
        cmocka_unit_test(test_float8_transpose),
        cmocka_unit_test(test_embedding_range),
        cmocka_unit_test(test_embedding_range_is_deterministic),
        cmocka_unit_test(test_cross_entropy_sharded),
        cmocka_unit_test(test_cross_entropy_sharded_is_deterministic),
        cmocka_unit_test(test_copy_2d),
        cmocka_unit_test(test_matmul_fp8),
        cmocka_unit_test(test_matmul_fp8_rows),
        cmocka_unit_test(test_matmul_bf16),
        cmocka_unit_test(test_same_inputs_give_same_bits),
        cmocka_unit_test(test_bad_arguments_are_errors),
        cmocka_unit_test(test_elementwise_ops),
        cmocka_unit_test(test_elementwise_nan),
        cmocka_unit_test(test_sum_to_device),
        cmocka_unit_test(test_cross_entropy_backward_dev),
        cmocka_unit_test(test_general_ops),
        cmocka_unit_test(test_rope_pos),
        cmocka_unit_test(test_rope_freqs),
        cmocka_unit_test(test_attention_block_is_attention),
        cmocka_unit_test(test_attention_blocks_merge_to_attention),
        cmocka_unit_test(test_attention_block_no_visible_key),
        cmocka_unit_test(test_attention_merge_infinite),
        cmocka_unit_test(test_attention_block_is_deterministic),
        cmocka_unit_test(test_attention_doc),
        cmocka_unit_test(test_attention_doc_blocks_merge),
        cmocka_unit_test(test_moe_scores),
        cmocka_unit_test(test_moe_topk),
        cmocka_unit_test(test_moe_permute),
        cmocka_unit_test(test_moe_gather_and_combine),
        cmocka_unit_test(test_grouped_matmul),
        cmocka_unit_test(test_moe_layer_composed),
        cmocka_unit_test(test_share_stream), /* the device stays on the shared stream from here */
        cmocka_unit_test(test_graph_capture),
    };
    /* CT_CONFORMANCE_ONLY=GLOB[,GLOB...]: only the tests whose names match one of them (fnmatch) */
    const char *only = getenv("CT_CONFORMANCE_ONLY");
    if (!only) return cmocka_run_group_tests(tests, load_plugin, unload_plugin);
    struct CMUnitTest picked[sizeof tests / sizeof tests[0]];
    size_t n = 0;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        char globs[1024];
        snprintf(globs, sizeof globs, "%s", only);
        int match = 0;
        for (char *save = NULL, *g = strtok_r(globs, ",", &save); g && !match; g = strtok_r(NULL, ",", &save))
            match = fnmatch(g, tests[i].name, 0) == 0;
        if (match) picked[n++] = tests[i];
    }
    if (!n) {
        fprintf(stderr, "CT_CONFORMANCE_ONLY=%s: no test of this suite matches\n", only);
        return 1;
    }
    return _cmocka_run_group_tests("device conformance", picked, n, load_plugin, unload_plugin);
}
