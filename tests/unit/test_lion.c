/* test_lion: the SDK template's Lion optimizer (sdk/template/lion.c), built as a plugin, stepping
 * parameters on the CPU device plugin, against the formula evaluated here in double:
 *
 *     c = beta1 m + (1 - beta1) g;  p = p (1 - lr wd) - lr sign(c);  m = beta2 m + (1 - beta2) g
 *
 * Three steps with a new gradient each; after each, p and m must lie within 1e-6 of the
 * reference, relative to max(|reference|, lr). The reference takes the options rounded to f32, as
 * the plugin holds them (0.99 is not an f32). Cases: values on a 1/64 grid with betas 0.5/0.75
 * (every c exact in f32, some exactly 0, so sign(0) = 0 is checked), random values with the
 * default betas and a momentum already non-zero, a CT_TENSOR_NO_DECAY tensor (no decay), and a
 * tensor longer than the plugin's 4M-element scratch slice.
 */
#include "ctitan/abi.h"
#include "ctitan/device.h"
#include "ctitan/host.h"
#include "ctitan/optimizer.h"

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stddef.h>
#include <cmocka.h>

/* ---------------------------------------------------------------- a minimal host */

static char last_error[512];
static const ct_option_spec *spec;           /* the plugin being created */
static double opt_beta1, opt_beta2, opt_wd;  /* Lion's options for the next create */

static void h_log(const ct_host *h, ct_log_level l, const char *f, ...) { (void)h, (void)l, (void)f; }
static void h_err(const ct_host *h, const char *f, ...)
{
    (void)h;
    va_list a;
    va_start(a, f);
    vsnprintf(last_error, sizeof last_error, f, a);
    va_end(a);
}
static void *h_alloc(const ct_host *h, size_t n, ct_mem_category c)
{
    (void)h, (void)c;
    void *p = NULL;
    return posix_memalign(&p, 64, n ? n : 1) ? NULL : p;
}
static void h_free(const ct_host *h, void *p) { (void)h, free(p); }
static void h_account(const ct_host *h, ct_mem_category c, int64_t d) { (void)h, (void)c, (void)d; }
static const char *spec_default(const char *key)
{
    for (const ct_option_spec *o = spec; o && o->key; o++)
        if (strcmp(o->key, key) == 0)
            return o->default_value;
    return NULL;
}
static ct_status h_float(const ct_host *h, const char *k, double *o)
{
    (void)h;
    if (strcmp(k, "beta1") == 0) *o = opt_beta1;
    else if (strcmp(k, "beta2") == 0) *o = opt_beta2;
    else if (strcmp(k, "weight_decay") == 0) *o = opt_wd;
    else if (spec_default(k)) *o = strtod(spec_default(k), NULL);
    else return CT_ERR_INVALID;
    return CT_OK;
}
static ct_status h_int(const ct_host *h, const char *k, int64_t *o)
{
    (void)h;
    const char *v = spec_default(k);
    if (!v) return CT_ERR_INVALID;
    *o = strtoll(v, NULL, 10);
    return CT_OK;
}
static ct_status h_bool(const ct_host *h, const char *k, int *o)
{
    (void)h;
    const char *v = spec_default(k);
    if (!v) return CT_ERR_INVALID;
    *o = strcmp(v, "true") == 0;
    return CT_OK;
}
static ct_status h_string(const ct_host *h, const char *k, const char **o)
{
    (void)h;
    *o = spec_default(k);
    return *o ? CT_OK : CT_ERR_INVALID;
}
static void h_trace(const ct_host *h, const char *n) { (void)h, (void)n; }
static const ct_host host = {.struct_size = sizeof(ct_host), .abi_major = CT_ABI_MAJOR, .abi_minor = CT_ABI_MINOR,
                             .log = h_log, .set_error = h_err, .mem_alloc = h_alloc, .mem_free = h_free,
                             .mem_account = h_account, .opt_int = h_int, .opt_float = h_float, .opt_bool = h_bool,
                             .opt_string = h_string, .trace_begin = h_trace, .trace_end = h_trace};

/* ---------------------------------------------------------------- the plugins */

static void *cpu_so, *lion_so;
static const ct_device_api *dapi;
static ct_device *dev;
static const ct_optimizer_api *oapi;
static const ct_option_spec *lion_spec;

static const void *load(const char *path, ct_plugin_kind kind, void **so, const ct_option_spec **options)
{
    *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!*so) {
        fprintf(stderr, "cannot load %s: %s\n", path, dlerror());
        return NULL;
    }
    ct_plugin_entry_fn entry;
    *(void **)&entry = dlsym(*so, CT_PLUGIN_ENTRY_NAME);
    ct_plugin_info info = {.struct_size = sizeof info};
    if (!entry || entry(&host, &info) != CT_OK || info.kind != kind) {
        fprintf(stderr, "%s: not a plugin of kind %d\n", path, (int)kind);
        return NULL;
    }
    *options = info.options;
    return info.api;
}

static int setup(void **state)
{
    (void)state;
    const ct_option_spec *cpu_spec;
    dapi = load(CT_CPU_SO, CT_KIND_DEVICE, &cpu_so, &cpu_spec);
    oapi = load(CT_LION_SO, CT_KIND_OPTIMIZER, &lion_so, &lion_spec);
    if (!dapi || !oapi)
        return -1;
    spec = cpu_spec;
    if (dapi->create(&host, &dev) != CT_OK) {
        fprintf(stderr, "cpu create: %s\n", last_error);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (dev)
        dapi->destroy(dev);
    /* the CPU plugin is linked -z nodelete; closing both is still right */
    if (lion_so) dlclose(lion_so);
    if (cpu_so) dlclose(cpu_so);
    return 0;
}

/* ---------------------------------------------------------------- the cases */

static uint64_t rng = 0x853C49E6748FEA9Bull;
static double urand(void) /* [-1, 1) */
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) / 4503599627370496.0 - 1.0;
}

/* grid: multiples of 1/64 in [-1, 1] (then c is exact in f32 for betas 0.5/0.75) */
static float draw(int grid, double lo)
{
    if (grid)
        return (float)(floor(urand() * 64.0) / 64.0);
    double u = urand();
    return (float)(u < 0 ? u - lo : u + lo);
}

static int sign(double x) { return x > 0 ? 1 : x < 0 ? -1 : 0; }

/* Three steps of one tensor of n elements; m starts at 0, or drawn when warm. */
static void lion_case(const char *what, int64_t n, double beta1, double beta2, double wd, uint32_t flags, int grid,
                      int warm, double glo)
{
    const float lr = 0.01f;
    opt_beta1 = beta1, opt_beta2 = beta2, opt_wd = wd;
    spec = lion_spec;
    ct_optimizer *opt = NULL;
    assert_int_equal(oapi->create(&host, dapi, dev, &opt), CT_OK);
    assert_int_equal(oapi->state_count(opt), 1);
    assert_true(oapi->elementwise && oapi->elementwise(opt) == 1);

    size_t bytes = (size_t)n * sizeof(float);
    float *p = NULL, *g = NULL, *m = NULL, *host_p = malloc(bytes), *host_g = malloc(bytes), *host_m = malloc(bytes);
    double *rp = malloc((size_t)n * sizeof(double)), *rm = malloc((size_t)n * sizeof(double));
    assert_true(host_p && host_g && host_m && rp && rm);
    assert_int_equal(dapi->alloc(dev, bytes, (void **)&p), CT_OK);
    assert_int_equal(dapi->alloc(dev, bytes, (void **)&g), CT_OK);
    assert_int_equal(dapi->alloc(dev, bytes, (void **)&m), CT_OK);
    for (int64_t i = 0; i < n; i++) {
        host_p[i] = draw(grid, 0), rp[i] = host_p[i];
        host_m[i] = warm ? draw(grid, 0) : 0.0f, rm[i] = host_m[i];
    }
    assert_int_equal(dapi->copy(dev, p, host_p, bytes, CT_COPY_H2D), CT_OK);
    assert_int_equal(dapi->copy(dev, m, host_m, bytes, CT_COPY_H2D), CT_OK);
    ct_tensor t = {.struct_size = sizeof t, .dtype = CT_F32, .ndim = 1, .shape = {n}, .data = p, .grad = g,
                   .name = "w", .flags = flags};
    float *state[1] = {m};
    double decay = (flags & CT_TENSOR_NO_DECAY) ? 0.0 : (float)wd;
    beta1 = (float)beta1, beta2 = (float)beta2; /* the options as the plugin holds them, in f32 */
    int64_t zeros = 0;
    for (int step = 1; step <= 3; step++) {
        for (int64_t i = 0; i < n; i++)
            host_g[i] = draw(grid, glo);
        assert_int_equal(dapi->copy(dev, g, host_g, bytes, CT_COPY_H2D), CT_OK);
        assert_int_equal(oapi->step(opt, &t, state, n, lr, step), CT_OK);
        for (int64_t i = 0; i < n; i++) {
            double gi = host_g[i], c = beta1 * rm[i] + (1 - beta1) * gi;
            zeros += c == 0;
            rp[i] = rp[i] * (1 - (double)lr * decay) - (double)lr * sign(c);
            rm[i] = beta2 * rm[i] + (1 - beta2) * gi;
        }
        assert_int_equal(dapi->copy(dev, host_p, p, bytes, CT_COPY_D2H), CT_OK);
        assert_int_equal(dapi->copy(dev, host_m, m, bytes, CT_COPY_D2H), CT_OK);
        for (int64_t i = 0; i < n; i++) {
            double ep = fabs(host_p[i] - rp[i]) / fmax(fabs(rp[i]), lr);
            double em = fabs(host_m[i] - rm[i]) / fmax(fabs(rm[i]), lr);
            if (!(ep <= 1e-6 && em <= 1e-6))
                fail_msg("%s: step %d [%lld]: p %.9g (reference %.9g), m %.9g (reference %.9g)", what, step,
                         (long long)i, (double)host_p[i], rp[i], (double)host_m[i], rm[i]);
        }
    }
    if (grid)
        assert_true(zeros > 0); /* sign(0) = 0 was exercised */
    printf("ok   %s: %lld elements, 3 steps within 1e-6 (%lld exact zeros of c)\n", what, (long long)n,
           (long long)zeros);
    dapi->free(dev, p), dapi->free(dev, g), dapi->free(dev, m);
    free(host_p), free(host_g), free(host_m), free(rp), free(rm);
    oapi->destroy(opt);
}

static void test_lion_exact_grid(void **state)
{
    (void)state;
    lion_case("grid, betas 0.5/0.75, wd 0.25", 300, 0.5, 0.75, 0.25, 0, 1, 1, 0);
}

static void test_lion_defaults_warm_momentum(void **state)
{
    (void)state;
    lion_case("random, default betas, wd 0.1, m warm", 257, 0.9, 0.99, 0.1, 0, 0, 1, 0);
}

static void test_lion_no_decay_flag(void **state)
{
    (void)state;
    lion_case("CT_TENSOR_NO_DECAY, wd 0.5 ignored", 300, 0.9, 0.99, 0.5, CT_TENSOR_NO_DECAY, 0, 1, 0);
}

/* Past the 4M-element scratch slice; |g| >= 0.5 keeps every c well away from 0. */
static void test_lion_longer_than_a_slice(void **state)
{
    (void)state;
    lion_case("4M + 1000 elements (two slices)", ((int64_t)1 << 22) + 1000, 0.9, 0.99, 0.1, 0, 0, 0, 0.5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lion_exact_grid),
        cmocka_unit_test(test_lion_defaults_warm_momentum),
        cmocka_unit_test(test_lion_no_decay_flag),
        cmocka_unit_test(test_lion_longer_than_a_slice),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
