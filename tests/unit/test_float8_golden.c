/* test_float8_golden.c: the float8 quantizer (plugins/float8) on the CPU device against torchao.
 *
 * tests/golden/float8/float8_linear.ctt (made by tests/golden/float8/gen_float8_golden.py with torchao's
 * convert_to_float8_training and Float8LinearConfig(emulate=True)) holds one nn.Linear(64, 96, bias=False)
 * with inputs x (32, 64), w (96, 64), dy (32, 96) chosen with outliers, tiny rows and columns and zero rows,
 * and torchao's y, dx, dw for the recipes tensorwise, rowwise and rowwise_with_gw_hp; plus a 16x16x16
 * rowwise case ("edge.*") whose rows sit on the power-of-two scale edge (see the golden's README).
 *
 * Both sides cast the same operands to the same fp8 values and multiply them in f32, so the results may
 * differ only by the summation order: each element must lie within 1e-5 * 2 * sum_k |a_ik| |b_kj| of
 * torchao's (the GEMM error bound over the unquantised operands, with room for fp8 rounding up), which
 * a different fp8 value anywhere in a row or column would break. The relative L2 error per output is
 * printed.
 *
 * The plugins are loaded through the core's loader (plugin_load) with a manifest from a temporary file,
 * as a session does; run from the repository root (BUILD=build-san picks the sanitizer build).
 */
#include "io/tensorfile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "float8_fixture.h"

#define GOLDEN "tests/golden/float8/float8_linear.ctt"
#define TOL 1e-5

/* ---------------------------------------------------------------- the device and the quantizer */

typedef f8_env env;
#define env_close f8_env_close

/* The float8 quantizer with format = format and, unless filter is NULL (the plugin's default,
 * "output"), filter_fqns = filter. */
static void env_open(env *e, const char *format, const char *filter) {
    char opts[256];
    snprintf(opts, sizeof opts, "      format: %s\n%s%s%s", format, filter ? "      filter_fqns: \"" : "",
             filter ? filter : "", filter ? "\"\n" : "");
    f8_env_open(e, opts);
}

/* ---------------------------------------------------------------- the golden file */

static tf_file *g_golden; /* read once, freed by the group teardown */

static tf_file *golden(void) {
    if (!g_golden && !(g_golden = tf_read(GOLDEN))) fail_msg("%s", ct_last_error());
    return g_golden;
}

static const float *golden_tensor(const char *name, int64_t rows, int64_t cols) {
    int64_t shape[2] = {rows, cols};
    const tf_entry *t = tf_expect(golden(), GOLDEN, name, TF_F32, 2, shape);
    if (!t) fail_msg("%s", ct_last_error());
    return t->data;
}

/* ---------------------------------------------------------------- one linear layer */

typedef struct linear_out {
    float *y, *dx, *dw; /* (n, out), (n, in), (out, in), host memory */
} linear_out;

static void *to_device(env *e, const float *h, int64_t numel) {
    void *p;
    assert_int_equal(e->d->alloc(e->dev, sizeof(float) * (size_t)numel, &p), CT_OK);
    assert_int_equal(e->d->copy(e->dev, p, h, sizeof(float) * (size_t)numel, CT_COPY_H2D), CT_OK);
    return p;
}

static float *to_host(env *e, const void *d, int64_t numel) {
    float *h = malloc(sizeof(float) * (size_t)numel);
    assert_non_null(h);
    assert_int_equal(e->d->copy(e->dev, h, d, sizeof(float) * (size_t)numel, CT_COPY_D2H), CT_OK);
    return h;
}

/* y = x w^T, dx = dy w, dw = dy^T x through the quantizer. The backward halves accumulate, so dx and
 * dw are zeroed first; then each is run a second time on top of the first result, which must double. */
static linear_out linear_run(env *e, const float *x, const float *w, const float *dy, int64_t n, int64_t out,
                             int64_t in) {
    float *dxd = to_device(e, x, n * in), *xd = to_device(e, x, n * in), *wd = to_device(e, w, out * in);
    float *dyd = to_device(e, dy, n * out), *yd = to_device(e, dy, n * out), *dwd = to_device(e, w, out * in);
    assert_int_equal(e->q->forward(e->quant, yd, xd, wd, n, out, in), CT_OK);
    assert_int_equal(e->d->zero(e->dev, dxd, sizeof(float) * (size_t)(n * in)), CT_OK);
    assert_int_equal(e->d->zero(e->dev, dwd, sizeof(float) * (size_t)(out * in)), CT_OK);
    assert_int_equal(e->q->backward_input(e->quant, dxd, dyd, wd, n, out, in), CT_OK);
    assert_int_equal(e->q->backward_weight(e->quant, dwd, dyd, xd, n, out, in), CT_OK);
    linear_out r = {to_host(e, yd, n * out), to_host(e, dxd, n * in), to_host(e, dwd, out * in)};
    assert_int_equal(e->q->backward_input(e->quant, dxd, dyd, wd, n, out, in), CT_OK);
    assert_int_equal(e->q->backward_weight(e->quant, dwd, dyd, xd, n, out, in), CT_OK);
    float *dx2 = to_host(e, dxd, n * in), *dw2 = to_host(e, dwd, out * in);
    for (int64_t i = 0; i < n * in; i++)
        if (fabsf(dx2[i] - 2 * r.dx[i]) > 1e-6f * fabsf(r.dx[i]) + 1e-30f)
            fail_msg("backward_input does not accumulate: dx[%lld] %g then %g", (long long)i, r.dx[i], dx2[i]);
    for (int64_t i = 0; i < out * in; i++)
        if (fabsf(dw2[i] - 2 * r.dw[i]) > 1e-6f * fabsf(r.dw[i]) + 1e-30f)
            fail_msg("backward_weight does not accumulate: dw[%lld] %g then %g", (long long)i, r.dw[i], dw2[i]);
    free(dx2);
    free(dw2);
    void *bufs[] = {xd, wd, dyd, yd, dxd, dwd};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) e->d->free(e->dev, bufs[i]);
    return r;
}

static void linear_out_free(linear_out *r) {
    free(r->y);
    free(r->dx);
    free(r->dw);
}

/* Compares c (m, n) with torchao's want, where c = A B with A (m, k) = a (trans_a: a is (k, m)) and
 * B (k, n) = b (trans_b: b is (n, k)), a and b the unquantised operands. Prints the relative L2 error;
 * returns the number of elements outside TOL * 2 * sum_k |A_ik| |B_kj|. */
static int compare(const char *what, const float *c, const float *want, const float *a, const float *b, int64_t m,
                   int64_t n, int64_t k, int trans_a, int trans_b) {
    double num = 0, den = 0, worst = 0;
    int bad = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double bound = 0;
            for (int64_t p = 0; p < k; p++) {
                double av = trans_a ? a[p * m + i] : a[i * k + p], bv = trans_b ? b[j * k + p] : b[p * n + j];
                bound += fabs(av * bv);
            }
            double got = c[i * n + j], ref = want[i * n + j], d = fabs(got - ref);
            num += d * d;
            den += ref * ref;
            double ratio = d / (2 * bound + 1e-30);
            if (ratio > worst) worst = ratio;
            if (d > TOL * 2 * bound + 1e-30) {
                if (bad < 3)
                    print_message("  %s[%lld, %lld]: ctitan %.9g, torchao %.9g\n", what, (long long)i, (long long)j,
                                  got, ref);
                bad++;
            }
        }
    print_message("%-26s rel. L2 error %.2e, worst |err| / (2 sum|a||b|) %.2e, %d of %lld outside %.0e\n", what,
                  sqrt(num / (den > 0 ? den : 1)), worst, bad, (long long)(m * n), TOL);
    return bad;
}

/* Runs the recipe on the golden inputs under `prefix` and compares y, dx, dw with `expect`.<name>. */
static int check_recipe(const char *format, const char *prefix, const char *expect, int64_t n, int64_t out,
                        int64_t in) {
    char name[128];
    snprintf(name, sizeof name, "%s.x", prefix);
    const float *x = golden_tensor(name, n, in);
    snprintf(name, sizeof name, "%s.w", prefix);
    const float *w = golden_tensor(name, out, in);
    snprintf(name, sizeof name, "%s.dy", prefix);
    const float *dy = golden_tensor(name, n, out);
    env e;
    env_open(&e, format, "");
    linear_out r = linear_run(&e, x, w, dy, n, out, in);
    int bad = 0;
    snprintf(name, sizeof name, "%s.y", expect);
    bad += compare(name, r.y, golden_tensor(name, n, out), x, w, n, out, in, 0, 1);
    snprintf(name, sizeof name, "%s.dx", expect);
    bad += compare(name, r.dx, golden_tensor(name, n, in), dy, w, n, in, out, 0, 0);
    snprintf(name, sizeof name, "%s.dw", expect);
    bad += compare(name, r.dw, golden_tensor(name, out, in), dy, x, out, in, n, 1, 0);
    linear_out_free(&r);
    env_close(&e);
    return bad;
}

static const int64_t N = 32, IN = 64, OUT = 96;

static void test_tensorwise_matches_torchao(void **state) {
    (void)state;
    assert_int_equal(check_recipe("tensorwise", "input", "tensorwise", N, OUT, IN), 0);
}

static void test_rowwise_matches_torchao(void **state) {
    (void)state;
    assert_int_equal(check_recipe("rowwise", "input", "rowwise", N, OUT, IN), 0);
}

static void test_rowwise_with_gw_hp_matches_torchao(void **state) {
    (void)state;
    assert_int_equal(check_recipe("rowwise_with_gw_hp", "input", "rowwise_with_gw_hp", N, OUT, IN), 0);
}

/* Every x row's amax is one float32 step above 448 / 8: torchao's float32 log2 of the scale rounds up
 * to 3, so its power-of-two scale is 8 where floor(log2) of the exact scale gives 4. */
static void test_rowwise_pow2_scale_edge_matches_torchao(void **state) {
    (void)state;
    assert_int_equal(check_recipe("rowwise", "edge", "edge.rowwise", 16, 16, 16), 0);
}

/* ---------------------------------------------------------------- which layers convert */

static int converts(env *e, const char *name, int64_t out, int64_t in, const char **why) {
    ct_tensor w = {.struct_size = sizeof w, .dtype = CT_F32, .ndim = 2, .shape = {out, in}, .name = name};
    *why = "";
    return e->q->converts(e->quant, &w, why);
}

static void test_converts_filters_output_and_odd_dims(void **state) {
    (void)state;
    const char *why;
    env e;
    env_open(&e, "tensorwise", NULL); /* the default filter_fqns: "output" */
    assert_int_equal(converts(&e, "layers.0.attention.wq.weight", OUT, IN, &why), 1);
    assert_int_equal(converts(&e, "output.weight", OUT, IN, &why), 0);
    assert_string_equal(why, "filter_fqns");
    assert_int_equal(converts(&e, "layers.0.attention.wq.weight", OUT, 40, &why), 0);
    assert_non_null(strstr(why, "16"));
    assert_int_equal(converts(&e, "layers.0.attention.wq.weight", 40, IN, &why), 0);
    env_close(&e);
    env_open(&e, "rowwise", ""); /* no filter: output converts too */
    assert_int_equal(converts(&e, "output.weight", OUT, IN, &why), 1);
    assert_int_equal(converts(&e, "output.weight", OUT, 40, &why), 0);
    env_close(&e);
}

static int teardown_golden(void **state) {
    (void)state;
    tf_free(g_golden);
    g_golden = NULL;
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tensorwise_matches_torchao),
        cmocka_unit_test(test_rowwise_matches_torchao),
        cmocka_unit_test(test_rowwise_with_gw_hp_matches_torchao),
        cmocka_unit_test(test_rowwise_pow2_scale_edge_matches_torchao),
        cmocka_unit_test(test_converts_filters_output_and_odd_dims),
    };
    return cmocka_run_group_tests(tests, NULL, teardown_golden);
}
