/* test_float8_grouped.c: the float8 quantizer's grouped GEMMs (the MoE experts, ABI 2.24) on the CPU
 * device against a PyTorch reference.
 *
 * tests/golden/float8/float8_grouped.ctt (made by tests/golden/float8/gen_float8_grouped_golden.py) holds
 * x (72, 64), dy (72, 32), experts weights w (4, 32, 64) with outliers, tiny and zero rows and columns,
 * three segment layouts ("mixed": one expert empty; "one": every row to one expert; "tail": rows in no
 * segment), and per recipe (rowwise, mxfp8) and layout y, dx and dw as torchao's float8 grouped GEMM
 * defines them: e4m3 casts scaled along each GEMM's reduction (per token, per expert channel, per column
 * within an expert's segment for the weight gradient), the GEMMs in float64 on the dequantised values.
 *
 * Tolerance: both sides cast every operand to the same fp8 values, so they differ only by the plugin's
 * float32 summation over at most 64 terms, which is within 64 * 2^-24 (4e-6) of sum_k |a_k b_k| of the
 * dequantised operands; those are within 2^-4 of the unquantised ones (e4m3 has 3 mantissa bits). Each
 * element must lie within 1e-5 * 2 * sum_k |a_k| |b_k| (unquantised operands) of the reference, as in
 * test_float8_golden; a single operand cast to a neighbouring fp8 value (6% to 12% of that product
 * term) breaks it wherever the term carries weight. Rows no segment covers must stay as they were.
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

#define GOLDEN "tests/golden/float8/float8_grouped.ctt"
#define TOL 1e-5
enum { M = 72, E = 4, O = 32, I = 64 };

typedef f8_env env;
#define env_close f8_env_close

/* The float8 quantizer converting the experts with grouped_mm_recipe = recipe. */
static void env_open(env *e, const char *recipe) {
    char opts[256];
    snprintf(opts, sizeof opts, "      format: rowwise\n      grouped_mm_fqns: experts\n      grouped_mm_recipe: %s\n",
             recipe);
    f8_env_open(e, opts);
    assert_true(CT_HAS_FIELD(e->q, ct_quantizer_api, grouped_backward_weight));
    assert_non_null(e->q->grouped_forward);
}

static tf_file *g_golden;

static const tf_entry *golden(const char *name, int dtype, int ndim, const int64_t *shape) {
    if (!g_golden && !(g_golden = tf_read(GOLDEN))) fail_msg("%s", ct_last_error());
    const tf_entry *t = tf_expect(g_golden, GOLDEN, name, dtype, ndim, shape);
    if (!t) fail_msg("%s", ct_last_error());
    return t;
}

static const float *golden_f32(const char *name, int ndim, const int64_t *shape) {
    return golden(name, TF_F32, ndim, shape)->data;
}

static void *to_device(env *e, const void *h, size_t bytes) {
    void *p;
    assert_int_equal(e->d->alloc(e->dev, bytes, &p), CT_OK);
    assert_int_equal(e->d->copy(e->dev, p, h, bytes, CT_COPY_H2D), CT_OK);
    return p;
}

static float *to_host(env *e, const void *d, int64_t numel) {
    float *h = malloc(sizeof(float) * (size_t)numel);
    assert_non_null(h);
    assert_int_equal(e->d->copy(e->dev, h, d, sizeof(float) * (size_t)numel, CT_COPY_D2H), CT_OK);
    return h;
}

/* c (rows, n) against want, c[r, j] = sum_k A(r, k) B(k, j) with A, B given by the accessors' strides:
 * a[r * ar + k * ak], b[k * bk + j * bj], over k in [k0, k1). Rows outside [r0, r1) must equal want
 * exactly (zero). Returns the number of elements outside the tolerance. */
typedef struct gemm_view {
    const float *a, *b;
    int64_t ar, ak, bk, bj, k0, k1;
} gemm_view;

static int compare_block(const char *what, const float *c, const float *want, int64_t r0, int64_t r1, int64_t n,
                         gemm_view v, double *worst, int *bad) {
    for (int64_t r = r0; r < r1; r++)
        for (int64_t j = 0; j < n; j++) {
            double bound = 0;
            for (int64_t k = v.k0; k < v.k1; k++) bound += fabs((double)v.a[r * v.ar + k * v.ak] * v.b[k * v.bk + j * v.bj]);
            double d = fabs((double)c[r * n + j] - want[r * n + j]), ratio = d / (2 * bound + 1e-30);
            if (ratio > *worst) *worst = ratio;
            if (d > TOL * 2 * bound + 1e-30) {
                if (*bad < 3)
                    print_message("  %s[%lld, %lld]: ctitan %.9g, reference %.9g\n", what, (long long)r, (long long)j,
                                  c[r * n + j], want[r * n + j]);
                (*bad)++;
            }
        }
    return *bad;
}

static int outside_zero(const char *what, const float *c, int64_t r0, int64_t r1, int64_t n) {
    int bad = 0;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t j = 0; j < n; j++)
            if (c[r * n + j] != 0.0f) bad++;
    if (bad) print_message("  %s: %d values written in rows %lld..%lld, which no segment covers\n", what, bad,
                           (long long)r0, (long long)r1);
    return bad;
}

/* Runs the three grouped GEMMs of `recipe` on layout `lay`; the backward halves run twice (they must
 * accumulate: the second result is twice the first). Returns the elements out of tolerance. */
static int check_layout(const char *recipe, const char *lay) {
    char name[96];
    const int64_t sx[2] = {M, I}, sdy[2] = {M, O}, sw[3] = {E, O, I}, so[1] = {E + 1};
    const float *x = golden_f32("x", 2, sx), *w = golden_f32("w", 3, sw), *dy = golden_f32("dy", 2, sdy);
    snprintf(name, sizeof name, "%s.offsets", lay);
    const int32_t *off = golden(name, TF_I32, 1, so)->data;
    env e;
    env_open(&e, recipe);
    float *xd = to_device(&e, x, sizeof(float) * M * I), *wd = to_device(&e, w, sizeof(float) * E * O * I);
    float *dyd = to_device(&e, dy, sizeof(float) * M * O);
    int32_t *offd = to_device(&e, off, sizeof(int32_t) * (E + 1));
    static const float zeros[E * O * I];
    float *yd = to_device(&e, zeros, sizeof(float) * M * O), *dxd = to_device(&e, zeros, sizeof(float) * M * I);
    float *dwd = to_device(&e, zeros, sizeof(float) * E * O * I);
    assert_int_equal(e.q->grouped_forward(e.quant, yd, xd, wd, offd, M, E, O, I), CT_OK);
    assert_int_equal(e.q->grouped_backward_input(e.quant, dxd, dyd, wd, offd, M, E, O, I), CT_OK);
    assert_int_equal(e.q->grouped_backward_weight(e.quant, dwd, dyd, xd, offd, M, E, O, I), CT_OK);
    float *y = to_host(&e, yd, M * O), *dx = to_host(&e, dxd, M * I), *dw = to_host(&e, dwd, E * O * I);
    assert_int_equal(e.q->grouped_backward_input(e.quant, dxd, dyd, wd, offd, M, E, O, I), CT_OK);
    assert_int_equal(e.q->grouped_backward_weight(e.quant, dwd, dyd, xd, offd, M, E, O, I), CT_OK);
    float *dx2 = to_host(&e, dxd, M * I), *dw2 = to_host(&e, dwd, E * O * I);
    for (int64_t k = 0; k < M * I; k++)
        if (fabsf(dx2[k] - 2 * dx[k]) > 1e-6f * fabsf(dx[k]) + 1e-30f) fail_msg("dx[%lld] does not accumulate", (long long)k);
    for (int64_t k = 0; k < E * O * I; k++)
        if (fabsf(dw2[k] - 2 * dw[k]) > 1e-6f * fabsf(dw[k]) + 1e-30f) fail_msg("dw[%lld] does not accumulate", (long long)k);

    int bad = 0;
    double wy = 0, wdx = 0, wdw = 0;
    snprintf(name, sizeof name, "%s.%s.y", lay, recipe);
    const float *ry = golden_f32(name, 2, sdy);
    snprintf(name, sizeof name, "%s.%s.dx", lay, recipe);
    const float *rdx = golden_f32(name, 2, sx);
    snprintf(name, sizeof name, "%s.%s.dw", lay, recipe);
    const float *rdw = golden_f32(name, 3, sw);
    for (int g = 0; g < E; g++) {
        int64_t a = off[g], b = off[g + 1];
        const float *wg = w + (int64_t)g * O * I;
        /* y[r, j] = sum_k x[r, k] w_g[j, k]; dx[r, j] = sum_k dy[r, k] w_g[k, j]; dw_g[o, i] = sum_r dy[r, o] x[r, i] */
        compare_block("y", y, ry, a, b, O, (gemm_view){x, wg, I, 1, 1, I, 0, I}, &wy, &bad);
        compare_block("dx", dx, rdx, a, b, I, (gemm_view){dy, wg, O, 1, I, 1, 0, O}, &wdx, &bad);
        compare_block("dw", dw + (int64_t)g * O * I, rdw + (int64_t)g * O * I, 0, O, I,
                      (gemm_view){dy - 0, x, 1, O, I, 1, a, b}, &wdw, &bad);
    }
    bad += outside_zero("y", y, off[E], M, O) + outside_zero("dx", dx, off[E], M, I);
    print_message("%-8s %-6s worst |err| / (2 sum|a||b|): y %.2e, dx %.2e, dw %.2e; %d outside %.0e\n", recipe, lay,
                  wy, wdx, wdw, bad, TOL);
    free(y), free(dx), free(dw), free(dx2), free(dw2);
    void *bufs[] = {xd, wd, dyd, offd, yd, dxd, dwd};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) e.d->free(e.dev, bufs[k]);
    env_close(&e);
    return bad;
}

static void test_rowwise_matches_reference(void **state) {
    (void)state;
    assert_int_equal(check_layout("rowwise", "mixed") + check_layout("rowwise", "one") + check_layout("rowwise", "tail"),
                     0);
}

static void test_mxfp8_matches_reference(void **state) {
    (void)state;
    assert_int_equal(check_layout("mxfp8", "mixed") + check_layout("mxfp8", "one") + check_layout("mxfp8", "tail"), 0);
}

/* The experts weights are asked as (e, o, i); grouped_mm_fqns picks them and the recipe's multiple. */
static void test_converts_experts_by_name_and_dims(void **state) {
    (void)state;
    env e;
    env_open(&e, "rowwise");
    const char *why = "";
    ct_tensor w = {.struct_size = sizeof w, .dtype = CT_F32, .ndim = 3, .shape = {E, O, I}, .name = "layers.0.moe.experts.w1"};
    assert_int_equal(e.q->converts(e.quant, &w, &why), 1);
    w.name = "layers.0.moe.shared.w1";
    assert_int_equal(e.q->converts(e.quant, &w, &why), 0);
    assert_string_equal(why, "not in grouped_mm_fqns");
    w.name = "layers.0.moe.experts.w2";
    w.shape[1] = 24;
    assert_int_equal(e.q->converts(e.quant, &w, &why), 0);
    assert_non_null(strstr(why, "16"));
    env_close(&e);
    env_open(&e, "mxfp8");
    w.shape[1] = 48; /* a multiple of 16, not of 32 */
    assert_int_equal(e.q->converts(e.quant, &w, &why), 0);
    assert_non_null(strstr(why, "32"));
    env_close(&e);
}

/* Offsets that decrease or pass m are refused with a message, not read through. */
static void test_bad_offsets_refused(void **state) {
    (void)state;
    env e;
    env_open(&e, "rowwise");
    const int32_t bad[E + 1] = {0, 30, 10, 40, M};
    static const float zeros[E * O * I];
    float *xd = to_device(&e, zeros, sizeof(float) * M * I), *dyd = to_device(&e, zeros, sizeof(float) * M * O);
    float *dwd = to_device(&e, zeros, sizeof(float) * E * O * I);
    int32_t *offd = to_device(&e, bad, sizeof bad);
    ct_clear_error();
    assert_int_equal(e.q->grouped_backward_weight(e.quant, dwd, dyd, xd, offd, M, E, O, I), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "offsets[2]"));
    void *bufs[] = {xd, dyd, dwd, offd};
    for (size_t k = 0; k < 4; k++) e.d->free(e.dev, bufs[k]);
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
        cmocka_unit_test(test_rowwise_matches_reference),
        cmocka_unit_test(test_mxfp8_matches_reference),
        cmocka_unit_test(test_converts_experts_by_name_and_dims),
        cmocka_unit_test(test_bad_offsets_refused),
    };
    return cmocka_run_group_tests(tests, NULL, teardown_golden);
}
