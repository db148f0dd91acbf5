/* test_cpu_gradcheck: the CPU kernels' backward ops against central finite differences.
 *
 * plugins/cpu/kernels_impl.h is compiled here twice: in double (the gradient checks) and in
 * float (the plugin's own numerics, checked against the double build). For each op with a
 * backward, the objective is L = sum(out * R) with R random and fixed, so dout = R, and
 *   - the analytic gradients (double kernels) match (L(x+h) - L(x-h)) / 2h to ~1e-6 relative;
 *   - calling backward twice gives twice the gradient (backward accumulates);
 *   - the float kernels' outputs and gradients agree with the double ones to float tolerance.
 * The mixture-of-experts kernels (moe_impl.h, ABI 2.14) are checked as one layer: router scores,
 * top-k weights, gather, the grouped GEMMs and combine, composed.
 * Also: matmul's transposes and beta against a triple loop, AdamW against a hand computation,
 * and bf16 rounding (ties to even, NaN, inf, subnormals, overflow).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "ctitan/util.h"

/* Both instances stay private to this file (no clash with the core objects it links). */
#define CPU_KERNEL_LINKAGE static __attribute__((unused))
#define CT_REAL_DOUBLE 1
#include "kernels_impl.h"
#define CT_REAL_DOUBLE 0
#include "kernels_impl.h"
#define CT_REAL_DOUBLE 1
#include "moe_impl.h"
#define CT_REAL_DOUBLE 0
#include "moe_impl.h"

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

/* splitmix64 */
static uint64_t rnd_u64(void)
{
    return ct_util_splitmix64_next(&rng_state);
}

/* uniform in [-1, 1) */
static double rnd(void)
{
    return (double)(rnd_u64() >> 11) / 4503599627370496.0 - 1.0;
}

static double *rand_vec(int64_t n, double scale)
{
    double *x = malloc((size_t)n * sizeof *x + 1);
    assert_non_null(x);
    for (int64_t i = 0; i < n; i++)
        x[i] = scale * rnd();
    return x;
}

static double *zero_vec(int64_t n)
{
    double *x = calloc((size_t)n + 1, sizeof *x);
    assert_non_null(x);
    return x;
}

static float *to_f32(const double *x, int64_t n)
{
    float *y = malloc((size_t)n * sizeof *y + 1);
    assert_non_null(y);
    for (int64_t i = 0; i < n; i++)
        y[i] = (float)x[i];
    return y;
}

static double max_abs(const double *x, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        m = fmax(m, fabs(x[i]));
    return m;
}

/* ---------------------------------------------------------------- the op-case harness */

#define MAX_IN 4
#define MAX_SAVED 3

/* One op under test. The case owns its differentiable inputs (double, and float copies made by
 * the harness), R (= dout), and op-specific integers and saved tensors. */
typedef struct op_case op_case;
struct op_case {
    const char *name;
    int n_in;
    const char *in_name[MAX_IN];
    int64_t in_size[MAX_IN];
    double *in[MAX_IN];
    float *in_f[MAX_IN];
    double *grad[MAX_IN];
    float *grad_f[MAX_IN];
    int64_t out_size;
    double *r;
    float *r_f;
    int64_t dim[6];
    int32_t *ids;
    double param; /* eps of the norms, theta of rope */
    int64_t saved_size[MAX_SAVED];
    double *saved[MAX_SAVED];
    float *saved_f[MAX_SAVED];
    void (*forward_f64)(op_case *c, double *out);
    void (*backward_f64)(op_case *c); /* grad[i] += ..., dout = r; runs its own forward first */
    void (*forward_f32)(op_case *c, float *out);
    void (*backward_f32)(op_case *c);
};

static double case_loss(op_case *c, double *out)
{
    c->forward_f64(c, out);
    double l = 0;
    for (int64_t i = 0; i < c->out_size; i++)
        l += out[i] * c->r[i];
    return l;
}

static void case_zero_grads(op_case *c)
{
    for (int i = 0; i < c->n_in; i++)
        memset(c->grad[i], 0, (size_t)c->in_size[i] * sizeof(double));
}

/* backward twice == 2 x backward once */
static void check_accumulates(op_case *c)
{
    double *once[MAX_IN];
    case_zero_grads(c);
    c->backward_f64(c);
    for (int i = 0; i < c->n_in; i++) {
        once[i] = zero_vec(c->in_size[i]);
        memcpy(once[i], c->grad[i], (size_t)c->in_size[i] * sizeof(double));
    }
    c->backward_f64(c);
    for (int i = 0; i < c->n_in; i++) {
        double scale = fmax(max_abs(once[i], c->in_size[i]), 1e-30);
        for (int64_t j = 0; j < c->in_size[i]; j++) {
            double err = fabs(c->grad[i][j] - 2 * once[i][j]) / scale;
            if (err > 1e-12)
                fail_msg("%s: d%s[%lld] = %g after two backward calls, expected 2 x %g", c->name,
                         c->in_name[i], (long long)j, c->grad[i][j], once[i][j]);
        }
        free(once[i]);
    }
}

/* analytic gradient vs central differences, max error relative to the largest gradient */
static void check_finite_differences(op_case *c)
{
    const double h = 1e-6;
    double *out = zero_vec(c->out_size);
    case_zero_grads(c);
    c->backward_f64(c);
    for (int i = 0; i < c->n_in; i++) {
        double max_err = 0, scale = fmax(max_abs(c->grad[i], c->in_size[i]), 1e-3);
        int64_t worst = 0;
        for (int64_t j = 0; j < c->in_size[i]; j++) {
            double keep = c->in[i][j];
            c->in[i][j] = keep + h;
            double lp = case_loss(c, out);
            c->in[i][j] = keep - h;
            double lm = case_loss(c, out);
            c->in[i][j] = keep;
            double err = fabs((lp - lm) / (2 * h) - c->grad[i][j]);
            if (err > max_err) {
                max_err = err;
                worst = j;
            }
        }
        if (max_err / scale > 1e-6)
            fail_msg("%s: d%s[%lld] analytic %.10g vs numeric off by %.3g (relative %.3g > 1e-6)",
                     c->name, c->in_name[i], (long long)worst, c->grad[i][worst], max_err,
                     max_err / scale);
    }
    free(out);
}

/* the float build against the double build: outputs and gradients */
static void check_f32_matches(op_case *c)
{
    double *out = zero_vec(c->out_size);
    float *out_f = calloc((size_t)c->out_size + 1, sizeof(float));
    assert_non_null(out_f);
    for (int i = 0; i < c->n_in; i++) {
        c->in_f[i] = to_f32(c->in[i], c->in_size[i]);
        c->grad_f[i] = calloc((size_t)c->in_size[i] + 1, sizeof(float));
        assert_non_null(c->grad_f[i]);
    }
    c->r_f = to_f32(c->r, c->out_size);
    for (int s = 0; s < MAX_SAVED; s++)
        if (c->saved_size[s]) {
            c->saved_f[s] = calloc((size_t)c->saved_size[s] + 1, sizeof(float));
            assert_non_null(c->saved_f[s]);
        }

    c->forward_f64(c, out);
    c->forward_f32(c, out_f);
    double scale = fmax(max_abs(out, c->out_size), 1e-3);
    for (int64_t j = 0; j < c->out_size; j++)
        if (fabs(out_f[j] - out[j]) > 2e-5 * scale)
            fail_msg("%s: f32 out[%lld] = %.8g, f64 gives %.8g", c->name, (long long)j,
                     (double)out_f[j], out[j]);

    case_zero_grads(c);
    c->backward_f64(c);
    c->backward_f32(c);
    for (int i = 0; i < c->n_in; i++) {
        double gscale = fmax(max_abs(c->grad[i], c->in_size[i]), 1e-3);
        for (int64_t j = 0; j < c->in_size[i]; j++)
            if (fabs(c->grad_f[i][j] - c->grad[i][j]) > 1e-4 * gscale)
                fail_msg("%s: f32 d%s[%lld] = %.8g, f64 gives %.8g", c->name, c->in_name[i],
                         (long long)j, (double)c->grad_f[i][j], c->grad[i][j]);
    }

    for (int i = 0; i < c->n_in; i++) {
        free(c->in_f[i]);
        free(c->grad_f[i]);
    }
    for (int s = 0; s < MAX_SAVED; s++)
        free(c->saved_f[s]);
    free(c->r_f);
    free(out_f);
    free(out);
}

/* Allocates the case's buffers: random inputs (scaled), zero gradients, random R, saved tensors. */
static void case_setup(op_case *c, double in_scale)
{
    for (int i = 0; i < c->n_in; i++) {
        c->in[i] = rand_vec(c->in_size[i], in_scale);
        c->grad[i] = zero_vec(c->in_size[i]);
    }
    c->r = rand_vec(c->out_size, 1.0);
    for (int s = 0; s < MAX_SAVED; s++)
        if (c->saved_size[s])
            c->saved[s] = zero_vec(c->saved_size[s]);
}

static void case_run_and_free(op_case *c)
{
    check_accumulates(c);
    check_finite_differences(c);
    check_f32_matches(c);
    for (int i = 0; i < c->n_in; i++) {
        free(c->in[i]);
        free(c->grad[i]);
    }
    for (int s = 0; s < MAX_SAVED; s++)
        free(c->saved[s]);
    free(c->r);
    free(c->ids);
}

/* ---------------------------------------------------------------- linear (matmul) */

/* y (n,o) = x (n,i) @ W (o,i)^T;  dX += dY W;  dW += dY^T X */
static void linear_fwd64(op_case *c, double *y)
{
    matmul_f64(y, c->in[0], c->in[1], (int)c->dim[0], (int)c->dim[2], (int)c->dim[1], 0, 1, 1, 0);
}
static void linear_bwd64(op_case *c)
{
    int n = (int)c->dim[0], in = (int)c->dim[1], o = (int)c->dim[2];
    matmul_f64(c->grad[0], c->r, c->in[1], n, in, o, 0, 0, 1, 1);
    matmul_f64(c->grad[1], c->r, c->in[0], o, in, n, 1, 0, 1, 1);
}
static void linear_fwd32(op_case *c, float *y)
{
    matmul_f32(y, c->in_f[0], c->in_f[1], (int)c->dim[0], (int)c->dim[2], (int)c->dim[1], 0, 1, 1,
               0);
}
static void linear_bwd32(op_case *c)
{
    int n = (int)c->dim[0], in = (int)c->dim[1], o = (int)c->dim[2];
    matmul_f32(c->grad_f[0], c->r_f, c->in_f[1], n, in, o, 0, 0, 1, 1);
    matmul_f32(c->grad_f[1], c->r_f, c->in_f[0], o, in, n, 1, 0, 1, 1);
}

static void test_linear_gradients(void **state)
{
    (void)state;
    op_case c = {.name = "linear", .n_in = 2, .in_name = {"x", "w"}, .dim = {6, 5, 4}};
    c.in_size[0] = 6 * 5;
    c.in_size[1] = 4 * 5;
    c.out_size = 6 * 4;
    c.forward_f64 = linear_fwd64;
    c.backward_f64 = linear_bwd64;
    c.forward_f32 = linear_fwd32;
    c.backward_f32 = linear_bwd32;
    case_setup(&c, 1.0);
    case_run_and_free(&c);
}

/* every transpose combination and beta against a triple loop */
static void test_matmul_transposes_and_beta(void **state)
{
    (void)state;
    const int m = 5, n = 7, k = 3;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int bi = 0; bi < 3; bi++) {
                double beta = bi == 0 ? 0.0 : bi == 1 ? 1.0 : -0.5, alpha = 1.5;
                double *a = rand_vec(m * k, 1), *b = rand_vec(k * n, 1), *cc = rand_vec(m * n, 1);
                double *ref = malloc(sizeof(double) * m * n);
                assert_non_null(ref);
                for (int i = 0; i < m; i++)
                    for (int j = 0; j < n; j++) {
                        double s = 0;
                        for (int p = 0; p < k; p++)
                            s += (ta ? a[p * m + i] : a[i * k + p]) *
                                 (tb ? b[j * k + p] : b[p * n + j]);
                        ref[i * n + j] = alpha * s + (beta == 0 ? 0 : beta * cc[i * n + j]);
                    }
                if (beta == 0) /* beta 0 ignores c's contents, NaN included */
                    cc[0] = NAN;
                matmul_f64(cc, a, b, m, n, k, ta, tb, alpha, beta);
                for (int i = 0; i < m * n; i++)
                    if (!(fabs(cc[i] - ref[i]) < 1e-12))
                        fail_msg("matmul ta=%d tb=%d beta=%g: c[%d] = %g, expected %g", ta, tb,
                                 beta, i, cc[i], ref[i]);
                free(a);
                free(b);
                free(cc);
                free(ref);
            }
}

/* ---------------------------------------------------------------- embedding */

/* out (n,c) = table[ids];  grad wrt the table (vocab,c) */
static void emb_fwd64(op_case *c, double *out)
{
    embedding_forward_f64(out, c->ids, c->in[0], c->dim[0], c->dim[1], 0, c->dim[2]);
}
static void emb_bwd64(op_case *c)
{
    embedding_backward_f64(c->grad[0], c->ids, c->r, c->dim[0], c->dim[1], 0, c->dim[2]);
}
static void emb_fwd32(op_case *c, float *out)
{
    embedding_forward_f32(out, c->ids, c->in_f[0], c->dim[0], c->dim[1], 0, c->dim[2]);
}
static void emb_bwd32(op_case *c)
{
    embedding_backward_f32(c->grad_f[0], c->ids, c->r_f, c->dim[0], c->dim[1], 0, c->dim[2]);
}

static void test_embedding_gradients(void **state)
{
    (void)state;
    const int64_t n = 9, ch = 70, vocab = 5; /* ch > one column block; ids repeat */
    op_case c = {.name = "embedding", .n_in = 1, .in_name = {"table"}, .dim = {n, ch, vocab}};
    c.in_size[0] = vocab * ch;
    c.out_size = n * ch;
    c.ids = malloc(sizeof(int32_t) * n);
    assert_non_null(c.ids);
    const int32_t ids[9] = {3, 0, 3, 4, 1, 3, 0, 2, 4};
    memcpy(c.ids, ids, sizeof ids);
    c.forward_f64 = emb_fwd64;
    c.backward_f64 = emb_bwd64;
    c.forward_f32 = emb_fwd32;
    c.backward_f32 = emb_bwd32;
    case_setup(&c, 1.0);
    case_run_and_free(&c);
}

/* ---------------------------------------------------------------- rmsnorm */

static void rms_fwd64(op_case *c, double *out)
{
    rmsnorm_forward_f64(out, c->saved[0], c->in[0], c->in[1], c->dim[0], c->dim[1], c->param);
}
static void rms_bwd64(op_case *c)
{
    double *out = zero_vec(c->out_size);
    rms_fwd64(c, out);
    rmsnorm_backward_input_f64(c->grad[0], c->r, c->in[0], c->in[1], c->saved[0], c->dim[0],
                               c->dim[1]);
    rmsnorm_backward_weight_f64(c->grad[1], c->r, c->in[0], c->saved[0], c->dim[0], c->dim[1]);
    free(out);
}
static void rms_fwd32(op_case *c, float *out)
{
    rmsnorm_forward_f32(out, c->saved_f[0], c->in_f[0], c->in_f[1], c->dim[0], c->dim[1],
                        (float)c->param);
}
static void rms_bwd32(op_case *c)
{
    float *out = calloc((size_t)c->out_size, sizeof(float));
    assert_non_null(out);
    rms_fwd32(c, out);
    rmsnorm_backward_input_f32(c->grad_f[0], c->r_f, c->in_f[0], c->in_f[1], c->saved_f[0],
                               c->dim[0], c->dim[1]);
    rmsnorm_backward_weight_f32(c->grad_f[1], c->r_f, c->in_f[0], c->saved_f[0], c->dim[0],
                                c->dim[1]);
    free(out);
}

static void test_rmsnorm_gradients(void **state)
{
    (void)state;
    const int64_t n = 4, ch = 40;
    op_case c = {
        .name = "rmsnorm", .n_in = 2, .in_name = {"x", "w"}, .dim = {n, ch}, .param = 1e-5};
    c.in_size[0] = n * ch;
    c.in_size[1] = ch;
    c.out_size = n * ch;
    c.saved_size[0] = n;
    c.forward_f64 = rms_fwd64;
    c.backward_f64 = rms_bwd64;
    c.forward_f32 = rms_fwd32;
    c.backward_f32 = rms_bwd32;
    case_setup(&c, 1.0);
    case_run_and_free(&c);
}

/* ---------------------------------------------------------------- layernorm */

static void ln_fwd64(op_case *c, double *out)
{
    layernorm_forward_f64(out, c->saved[0], c->saved[1], c->in[0], c->in[1], c->in[2], c->dim[0],
                          c->dim[1], c->param);
}
static void ln_bwd64(op_case *c)
{
    double *out = zero_vec(c->out_size);
    ln_fwd64(c, out);
    layernorm_backward_input_f64(c->grad[0], c->r, c->in[0], c->in[1], c->saved[0], c->saved[1],
                                 c->dim[0], c->dim[1]);
    layernorm_backward_weight_f64(c->grad[1], c->grad[2], c->r, c->in[0], c->saved[0], c->saved[1],
                                  c->dim[0], c->dim[1]);
    free(out);
}
static void ln_fwd32(op_case *c, float *out)
{
    layernorm_forward_f32(out, c->saved_f[0], c->saved_f[1], c->in_f[0], c->in_f[1], c->in_f[2],
                          c->dim[0], c->dim[1], (float)c->param);
}
static void ln_bwd32(op_case *c)
{
    float *out = calloc((size_t)c->out_size, sizeof(float));
    assert_non_null(out);
    ln_fwd32(c, out);
    layernorm_backward_input_f32(c->grad_f[0], c->r_f, c->in_f[0], c->in_f[1], c->saved_f[0],
                                 c->saved_f[1], c->dim[0], c->dim[1]);
    layernorm_backward_weight_f32(c->grad_f[1], c->grad_f[2], c->r_f, c->in_f[0], c->saved_f[0],
                                  c->saved_f[1], c->dim[0], c->dim[1]);
    free(out);
}

static void test_layernorm_gradients(void **state)
{
    (void)state;
    const int64_t n = 4, ch = 40;
    op_case c = {
        .name = "layernorm", .n_in = 3, .in_name = {"x", "w", "b"}, .dim = {n, ch}, .param = 1e-5};
    c.in_size[0] = n * ch;
    c.in_size[1] = ch;
    c.in_size[2] = ch;
    c.out_size = n * ch;
    c.saved_size[0] = n;
    c.saved_size[1] = n;
    c.forward_f64 = ln_fwd64;
    c.backward_f64 = ln_bwd64;
    c.forward_f32 = ln_fwd32;
    c.backward_f32 = ln_bwd32;
    case_setup(&c, 1.0);
    case_run_and_free(&c);
}

/* ---------------------------------------------------------------- bias */

/* out = x + bias; the gradient checked is the bias's (x's is dout itself). x is saved[0]. */
static void bias_fwd64(op_case *c, double *out)
{
    bias_forward_f64(out, c->saved[0], c->in[0], c->dim[0], c->dim[1]);
}
static void bias_bwd64(op_case *c)
{
    bias_backward_f64(c->grad[0], c->r, c->dim[0], c->dim[1]);
}
static void bias_fwd32(op_case *c, float *out)
{
    float *x = to_f32(c->saved[0], c->saved_size[0]);
    bias_forward_f32(out, x, c->in_f[0], c->dim[0], c->dim[1]);
    free(x);
}
static void bias_bwd32(op_case *c)
{
    bias_backward_f32(c->grad_f[0], c->r_f, c->dim[0], c->dim[1]);
}

static void test_bias_gradients(void **state)
{
    (void)state;
    const int64_t n = 5, ch = 37;
    op_case c = {.name = "bias", .n_in = 1, .in_name = {"bias"}, .dim = {n, ch}};
    c.in_size[0] = ch;
    c.out_size = n * ch;
    c.saved_size[0] = n * ch;
    c.forward_f64 = bias_fwd64;
    c.backward_f64 = bias_bwd64;
    c.forward_f32 = bias_fwd32;
    c.backward_f32 = bias_bwd32;
    case_setup(&c, 1.0);
    for (int64_t i = 0; i < n * ch; i++)
        c.saved[0][i] = rnd();
    case_run_and_free(&c);
}

/* ---------------------------------------------------------------- rope */

static void rope_fwd64(op_case *c, double *out)
{
    assert_int_equal(
        rope_forward_f64(out, c->in[0], NULL, NULL, c->param, c->dim[0], c->dim[1], c->dim[2], c->dim[3]), 0);
}
static void rope_bwd64(op_case *c)
{
    assert_int_equal(
        rope_backward_f64(c->grad[0], c->r, NULL, NULL, c->param, c->dim[0], c->dim[1], c->dim[2], c->dim[3]),
        0);
}
static void rope_fwd32(op_case *c, float *out)
{
    assert_int_equal(rope_forward_f32(out, c->in_f[0], NULL, NULL, (float)c->param, c->dim[0], c->dim[1], c->dim[2], c->dim[3]),
                     0);
}
static void rope_bwd32(op_case *c)
{
    assert_int_equal(rope_backward_f32(c->grad_f[0], c->r_f, NULL, NULL, (float)c->param, c->dim[0], c->dim[1], c->dim[2],
                                       c->dim[3]),
                     0);
}

static void test_rope_gradients(void **state)
{
    (void)state;
    /* a small theta makes the angles large */
    const double thetas[2] = {10000.0, 3.0};
    for (int ti = 0; ti < 2; ti++) {
        op_case c = {
            .name = "rope", .n_in = 1, .in_name = {"x"}, .dim = {2, 5, 3, 8}, .param = thetas[ti]};
        c.in_size[0] = 2 * 5 * 3 * 8;
        c.out_size = c.in_size[0];
        c.forward_f64 = rope_fwd64;
        c.backward_f64 = rope_bwd64;
        c.forward_f32 = rope_fwd32;
        c.backward_f32 = rope_bwd32;
        case_setup(&c, 1.0);
        case_run_and_free(&c);
    }
}

/* the pair convention itself: position p, pair i turns by p * theta^(-2i/d); in place works */
static void test_rope_convention_and_in_place(void **state)
{
    (void)state;
    const int64_t t = 4, d = 6;
    const double theta = 100.0;
    double x[4 * 6], y[4 * 6];
    for (int i = 0; i < t * d; i++)
        x[i] = y[i] = rnd();
    assert_int_equal(rope_forward_f64(y, y, NULL, NULL, theta, 1, t, 1, d), 0); /* out aliases x */
    for (int64_t p = 0; p < t; p++)
        for (int64_t i = 0; i < d / 2; i++) {
            double a = (double)p * pow(theta, -2.0 * (double)i / (double)d);
            double x0 = x[p * d + 2 * i], x1 = x[p * d + 2 * i + 1];
            assert_true(fabs(y[p * d + 2 * i] - (x0 * cos(a) - x1 * sin(a))) < 1e-12);
            assert_true(fabs(y[p * d + 2 * i + 1] - (x0 * sin(a) + x1 * cos(a))) < 1e-12);
        }
}

/* ---------------------------------------------------------------- attention */

/* inputs q, k, v; saved: lse (b,h,t) and out (b,t,h,d) for backward */
static void att_fwd64(op_case *c, double *out)
{
    assert_int_equal(attention_forward_f64(out, c->saved[0], c->in[0], c->in[1], c->in[2],
                                           c->dim[0], c->dim[1], c->dim[2], c->dim[3], c->dim[4]),
                     0);
}
static void att_bwd64(op_case *c)
{
    att_fwd64(c, c->saved[1]);
    assert_int_equal(attention_backward_f64(c->grad[0], c->grad[1], c->grad[2], c->r, c->in[0],
                                            c->in[1], c->in[2], c->saved[1], c->saved[0], c->dim[0],
                                            c->dim[1], c->dim[2], c->dim[3], c->dim[4]),
                     0);
}
static void att_fwd32(op_case *c, float *out)
{
    assert_int_equal(attention_forward_f32(out, c->saved_f[0], c->in_f[0], c->in_f[1], c->in_f[2],
                                           c->dim[0], c->dim[1], c->dim[2], c->dim[3], c->dim[4]),
                     0);
}
static void att_bwd32(op_case *c)
{
    att_fwd32(c, c->saved_f[1]);
    assert_int_equal(attention_backward_f32(c->grad_f[0], c->grad_f[1], c->grad_f[2], c->r_f,
                                            c->in_f[0], c->in_f[1], c->in_f[2], c->saved_f[1],
                                            c->saved_f[0], c->dim[0], c->dim[1], c->dim[2],
                                            c->dim[3], c->dim[4]),
                     0);
}

static void attention_case(int64_t b, int64_t t, int64_t h, int64_t kvh, int64_t d)
{
    op_case c = {
        .name = "attention", .n_in = 3, .in_name = {"q", "k", "v"}, .dim = {b, t, h, kvh, d}};
    c.in_size[0] = b * t * h * d;
    c.in_size[1] = c.in_size[2] = b * t * kvh * d;
    c.out_size = b * t * h * d;
    c.saved_size[0] = b * h * t;
    c.saved_size[1] = b * t * h * d;
    c.forward_f64 = att_fwd64;
    c.backward_f64 = att_bwd64;
    c.forward_f32 = att_fwd32;
    c.backward_f32 = att_bwd32;
    case_setup(&c, 1.5);
    case_run_and_free(&c);
}

static void test_attention_gradients_gqa(void **state)
{
    (void)state;
    attention_case(2, 5, 4, 2, 6);
}

static void test_attention_gradients_mha(void **state)
{
    (void)state;
    attention_case(2, 5, 4, 4, 6);
}

/* t beyond one query block (CPU_ATT_BLOCK rows), with one kv head for all */
static void test_attention_gradients_blocked_mqa(void **state)
{
    (void)state;
    attention_case(1, CPU_ATT_BLOCK + 6, 2, 1, 4);
}

/* ---------------------------------------------------------------- context parallel (ABI 2.3) */

/* Positions out of order, as a context-parallel rank holds them; query rows 1 and 4 see no key. */
static const int32_t gc_q_pos[7] = {9, 0, 4, 12, 1, 6, 7};
static const int32_t gc_k_pos[6] = {3, 8, 2, 5, 11, 6};

static void rope_pos_fwd64(op_case *c, double *out)
{
    assert_int_equal(rope_forward_f64(out, c->in[0], gc_q_pos, NULL, c->param, c->dim[0], c->dim[1],
                                      c->dim[2], c->dim[3]),
                     0);
}
static void rope_pos_bwd64(op_case *c)
{
    assert_int_equal(rope_backward_f64(c->grad[0], c->r, gc_q_pos, NULL, c->param, c->dim[0], c->dim[1],
                                           c->dim[2], c->dim[3]),
                     0);
}
static void rope_pos_fwd32(op_case *c, float *out)
{
    assert_int_equal(rope_forward_f32(out, c->in_f[0], gc_q_pos, NULL, (float)c->param, c->dim[0], c->dim[1],
                                          c->dim[2], c->dim[3]),
                     0);
}
static void rope_pos_bwd32(op_case *c)
{
    assert_int_equal(rope_backward_f32(c->grad_f[0], c->r_f, gc_q_pos, NULL, (float)c->param, c->dim[0], c->dim[1],
                                           c->dim[2], c->dim[3]),
                     0);
}

static void test_rope_pos_gradients(void **state)
{
    (void)state;
    op_case c = {.name = "rope_pos", .n_in = 1, .in_name = {"x"}, .dim = {2, 7, 3, 8}, .param = 3.0};
    c.in_size[0] = 2 * 7 * 3 * 8;
    c.out_size = c.in_size[0];
    c.forward_f64 = rope_pos_fwd64;
    c.backward_f64 = rope_pos_bwd64;
    c.forward_f32 = rope_pos_fwd32;
    c.backward_f32 = rope_pos_bwd32;
    case_setup(&c, 1.0);
    case_run_and_free(&c);
}

/* ---------------------------------------------------------------- scaled RoPE (ABI 2.4) */

/* A Llama 3.1-style table (one pair kept, one blended, two divided), positions from gc_q_pos or
 * rows 0..t-1 (param 1 or 0). */
static const double gc_inv64[4] = {1.0, 0.21, 0.0125, 0.000125};
static const float gc_inv32[4] = {1.0f, 0.21f, 0.0125f, 0.000125f};

static void rope_freqs_fwd64(op_case *c, double *out)
{
    assert_int_equal(rope_forward_f64(out, c->in[0], c->param ? gc_q_pos : NULL, gc_inv64, 1, c->dim[0],
                                            c->dim[1], c->dim[2], c->dim[3]),
                     0);
}
static void rope_freqs_bwd64(op_case *c)
{
    assert_int_equal(rope_backward_f64(c->grad[0], c->r, c->param ? gc_q_pos : NULL, gc_inv64, 1, c->dim[0],
                                             c->dim[1], c->dim[2], c->dim[3]),
                     0);
}
static void rope_freqs_fwd32(op_case *c, float *out)
{
    assert_int_equal(rope_forward_f32(out, c->in_f[0], c->param ? gc_q_pos : NULL, gc_inv32, 1, c->dim[0],
                                            c->dim[1], c->dim[2], c->dim[3]),
                     0);
}
static void rope_freqs_bwd32(op_case *c)
{
    assert_int_equal(rope_backward_f32(c->grad_f[0], c->r_f, c->param ? gc_q_pos : NULL, gc_inv32, 1,
                                             c->dim[0], c->dim[1], c->dim[2], c->dim[3]),
                     0);
}

static void test_rope_freqs_gradients(void **state)
{
    (void)state;
    for (int with_pos = 0; with_pos < 2; with_pos++) {
        op_case c = {.name = with_pos ? "rope_freqs (positions)" : "rope_freqs", .n_in = 1, .in_name = {"x"},
                     .dim = {2, 7, 3, 8}, .param = with_pos};
        c.in_size[0] = 2 * 7 * 3 * 8;
        c.out_size = c.in_size[0];
        c.forward_f64 = rope_freqs_fwd64;
        c.backward_f64 = rope_freqs_bwd64;
        c.forward_f32 = rope_freqs_fwd32;
        c.backward_f32 = rope_freqs_bwd32;
        case_setup(&c, 1.0);
        case_run_and_free(&c);
    }
}

/* One key block as the whole of the keys: its out and lse are the final ones, so the block backward
 * is the gradient of the block forward. dim = b, tq, tk, h, kvh, d; saved: lse, out. */
static void attb_fwd64(op_case *c, double *out)
{
    assert_int_equal(attention_block_forward_f64(out, c->saved[0], c->in[0], c->in[1], c->in[2],
                                                 gc_q_pos, gc_k_pos, c->dim[0], c->dim[1],
                                                 c->dim[2], c->dim[3], c->dim[4], c->dim[5]),
                     0);
}
static void attb_bwd64(op_case *c)
{
    attb_fwd64(c, c->saved[1]);
    assert_int_equal(attention_block_backward_f64(c->grad[0], c->grad[1], c->grad[2], c->r, c->in[0],
                                                  c->in[1], c->in[2], c->saved[1], c->saved[0],
                                                  gc_q_pos, gc_k_pos, c->dim[0], c->dim[1],
                                                  c->dim[2], c->dim[3], c->dim[4], c->dim[5]),
                     0);
}
static void attb_fwd32(op_case *c, float *out)
{
    assert_int_equal(attention_block_forward_f32(out, c->saved_f[0], c->in_f[0], c->in_f[1],
                                                 c->in_f[2], gc_q_pos, gc_k_pos, c->dim[0],
                                                 c->dim[1], c->dim[2], c->dim[3], c->dim[4],
                                                 c->dim[5]),
                     0);
}
static void attb_bwd32(op_case *c)
{
    attb_fwd32(c, c->saved_f[1]);
    assert_int_equal(attention_block_backward_f32(c->grad_f[0], c->grad_f[1], c->grad_f[2], c->r_f,
                                                  c->in_f[0], c->in_f[1], c->in_f[2], c->saved_f[1],
                                                  c->saved_f[0], gc_q_pos, gc_k_pos, c->dim[0],
                                                  c->dim[1], c->dim[2], c->dim[3], c->dim[4],
                                                  c->dim[5]),
                     0);
}

static void test_attention_block_gradients(void **state)
{
    (void)state;
    const int64_t b = 2, tq = 7, tk = 6, h = 4, kvh = 2, d = 6;
    op_case c = {.name = "attention_block",
                 .n_in = 3,
                 .in_name = {"q", "k", "v"},
                 .dim = {b, tq, tk, h, kvh, d}};
    c.in_size[0] = b * tq * h * d;
    c.in_size[1] = c.in_size[2] = b * tk * kvh * d;
    c.out_size = b * tq * h * d;
    c.saved_size[0] = b * h * tq;
    c.saved_size[1] = b * tq * h * d;
    c.forward_f64 = attb_fwd64;
    c.backward_f64 = attb_bwd64;
    c.forward_f32 = attb_fwd32;
    c.backward_f32 = attb_bwd32;
    case_setup(&c, 1.5);
    case_run_and_free(&c);
}

/* Block-causal attention (ABI 2.13), one key block as the whole: per batch row positions and
 * documents, rows unsorted, several documents per row, row 0's query 3 alone in its document (no
 * key: no gradient) and a key of a document no query has. dim and saved as attention_block. */
static const int32_t gc_dq_pos[2 * 7] = {9, 0, 4, 12, 1, 6, 7, 0, 1, 2, 3, 4, 5, 6};
static const int32_t gc_dk_pos[2 * 6] = {3, 8, 2, 5, 11, 6, 6, 5, 4, 0, 1, 2};
static const int32_t gc_dq_doc[2 * 7] = {1, 0, 0, 4, 0, 1, 1, 0, 0, 0, 1, 1, 2, 2};
static const int32_t gc_dk_doc[2 * 6] = {0, 1, 0, 1, 3, 1, 2, 1, 1, 0, 0, 1};

static void attd_fwd64(op_case *c, double *out)
{
    assert_int_equal(attention_doc_forward_f64(out, c->saved[0], c->in[0], c->in[1], c->in[2], gc_dq_pos, gc_dk_pos,
                                               gc_dq_doc, gc_dk_doc, c->dim[0], c->dim[1], c->dim[2], c->dim[3],
                                               c->dim[4], c->dim[5]),
                     0);
}
static void attd_bwd64(op_case *c)
{
    attd_fwd64(c, c->saved[1]);
    assert_int_equal(attention_doc_backward_f64(c->grad[0], c->grad[1], c->grad[2], c->r, c->in[0], c->in[1],
                                                c->in[2], c->saved[1], c->saved[0], gc_dq_pos, gc_dk_pos, gc_dq_doc,
                                                gc_dk_doc, c->dim[0], c->dim[1], c->dim[2], c->dim[3], c->dim[4],
                                                c->dim[5]),
                     0);
}
static void attd_fwd32(op_case *c, float *out)
{
    assert_int_equal(attention_doc_forward_f32(out, c->saved_f[0], c->in_f[0], c->in_f[1], c->in_f[2], gc_dq_pos,
                                               gc_dk_pos, gc_dq_doc, gc_dk_doc, c->dim[0], c->dim[1], c->dim[2],
                                               c->dim[3], c->dim[4], c->dim[5]),
                     0);
}
static void attd_bwd32(op_case *c)
{
    attd_fwd32(c, c->saved_f[1]);
    assert_int_equal(attention_doc_backward_f32(c->grad_f[0], c->grad_f[1], c->grad_f[2], c->r_f, c->in_f[0],
                                                c->in_f[1], c->in_f[2], c->saved_f[1], c->saved_f[0], gc_dq_pos,
                                                gc_dk_pos, gc_dq_doc, gc_dk_doc, c->dim[0], c->dim[1], c->dim[2],
                                                c->dim[3], c->dim[4], c->dim[5]),
                     0);
}

static void test_attention_doc_gradients(void **state)
{
    (void)state;
    const int64_t b = 2, tq = 7, tk = 6, h = 4, kvh = 2, d = 6;
    op_case c = {.name = "attention_doc", .n_in = 3, .in_name = {"q", "k", "v"}, .dim = {b, tq, tk, h, kvh, d}};
    c.in_size[0] = b * tq * h * d;
    c.in_size[1] = c.in_size[2] = b * tk * kvh * d;
    c.out_size = b * tq * h * d;
    c.saved_size[0] = b * h * tq;
    c.saved_size[1] = b * tq * h * d;
    c.forward_f64 = attd_fwd64;
    c.backward_f64 = attd_bwd64;
    c.forward_f32 = attd_fwd32;
    c.backward_f32 = attd_bwd32;
    case_setup(&c, 1.5);
    case_run_and_free(&c);
}

/* ---------------------------------------------------------------- swiglu, gelu */

static void swiglu_fwd64(op_case *c, double *out)
{
    swiglu_forward_f64(out, c->in[0], c->in[1], c->dim[0]);
}
static void swiglu_bwd64(op_case *c)
{
    swiglu_backward_f64(c->grad[0], c->grad[1], c->r, c->in[0], c->in[1], c->dim[0]);
}
static void swiglu_fwd32(op_case *c, float *out)
{
    swiglu_forward_f32(out, c->in_f[0], c->in_f[1], c->dim[0]);
}
static void swiglu_bwd32(op_case *c)
{
    swiglu_backward_f32(c->grad_f[0], c->grad_f[1], c->r_f, c->in_f[0], c->in_f[1], c->dim[0]);
}

static void test_swiglu_gradients(void **state)
{
    (void)state;
    op_case c = {.name = "swiglu", .n_in = 2, .in_name = {"a", "g"}, .dim = {37}};
    c.in_size[0] = c.in_size[1] = c.out_size = 37;
    c.forward_f64 = swiglu_fwd64;
    c.backward_f64 = swiglu_bwd64;
    c.forward_f32 = swiglu_fwd32;
    c.backward_f32 = swiglu_bwd32;
    case_setup(&c, 4.0);
    case_run_and_free(&c);
}

static void gelu_fwd64(op_case *c, double *out)
{
    gelu_forward_f64(out, c->in[0], c->dim[0]);
}
static void gelu_bwd64(op_case *c)
{
    gelu_backward_f64(c->grad[0], c->r, c->in[0], c->dim[0]);
}
static void gelu_fwd32(op_case *c, float *out)
{
    gelu_forward_f32(out, c->in_f[0], c->dim[0]);
}
static void gelu_bwd32(op_case *c)
{
    gelu_backward_f32(c->grad_f[0], c->r_f, c->in_f[0], c->dim[0]);
}

static void test_gelu_gradients(void **state)
{
    (void)state;
    op_case c = {.name = "gelu", .n_in = 1, .in_name = {"x"}, .dim = {41}};
    c.in_size[0] = c.out_size = 41;
    c.forward_f64 = gelu_fwd64;
    c.backward_f64 = gelu_bwd64;
    c.forward_f32 = gelu_fwd32;
    c.backward_f32 = gelu_bwd32;
    case_setup(&c, 4.0);
    case_run_and_free(&c);
}

/* ---------------------------------------------------------------- cross-entropy */

#define IGNORE (-100)

/* losses (n); the op takes one dloss for all rows, so R is that constant */
static void ce_fwd64(op_case *c, double *out)
{
    cross_entropy_forward_f64(out, c->in[0], c->ids, c->dim[0], c->dim[1], IGNORE);
}
static void ce_bwd64(op_case *c)
{
    assert_int_equal(cross_entropy_backward_f64(c->grad[0], c->in[0], c->ids, c->r[0], c->dim[0],
                                                c->dim[1], IGNORE),
                     0);
}
static void ce_fwd32(op_case *c, float *out)
{
    cross_entropy_forward_f32(out, c->in_f[0], c->ids, c->dim[0], c->dim[1], IGNORE);
}
static void ce_bwd32(op_case *c)
{
    assert_int_equal(cross_entropy_backward_f32(c->grad_f[0], c->in_f[0], c->ids, c->r_f[0],
                                                c->dim[0], c->dim[1], IGNORE),
                     0);
}

static void test_cross_entropy_gradients(void **state)
{
    (void)state;
    const int64_t n = 6, v = 11;
    op_case c = {.name = "cross_entropy", .n_in = 1, .in_name = {"logits"}, .dim = {n, v}};
    c.in_size[0] = n * v;
    c.out_size = n;
    c.ids = malloc(sizeof(int32_t) * n);
    assert_non_null(c.ids);
    const int32_t targets[6] = {3, IGNORE, 0, 10, IGNORE, 7};
    memcpy(c.ids, targets, sizeof targets);
    c.forward_f64 = ce_fwd64;
    c.backward_f64 = ce_bwd64;
    c.forward_f32 = ce_fwd32;
    c.backward_f32 = ce_bwd32;
    case_setup(&c, 3.0);
    for (int64_t i = 0; i < n; i++)
        c.r[i] = 0.7;
    case_run_and_free(&c);
}

/* ignored rows: zero loss and no gradient; huge logits stay finite (max subtracted) */
static void test_cross_entropy_ignored_rows_and_stability(void **state)
{
    (void)state;
    float logits[2 * 3] = {1000.f, 999.f, -1000.f, 5.f, 6.f, 7.f};
    int32_t targets[2] = {1, IGNORE};
    float losses[2] = {-1, -1}, grad[6] = {0};
    cross_entropy_forward_f32(losses, logits, targets, 2, 3, IGNORE);
    double expect = log(1.0 + exp(1.0)); /* -log softmax at the second largest, 1 below the max */
    assert_true(fabs(losses[0] - expect) < 1e-5);
    assert_true(losses[1] == 0.0f);
    assert_int_equal(cross_entropy_backward_f32(grad, logits, targets, 1.0f, 2, 3, IGNORE), 0);
    for (int j = 3; j < 6; j++)
        assert_true(grad[j] == 0.0f);
    assert_true(fabs(grad[0] - 1.0 / (1.0 + exp(-1.0))) < 1e-6);
}

/* ---------------------------------------------------------------- AdamW */

/* ---------------------------------------------------------------- mixture of experts (ABI 2.14) */

/* A stable counting sort of idx (nk) by expert: the reference for moe_permute's contract. */
static void moe_permute_host(int32_t *order, int32_t *inv, int32_t *offsets, const int32_t *idx, int64_t nk,
                             int64_t e)
{
    int64_t p = 0;
    for (int64_t g = 0; g < e; g++) {
        offsets[g] = (int32_t)p;
        for (int64_t j = 0; j < nk; j++)
            if (idx[j] == g) {
                order[p] = (int32_t)j;
                inv[j] = (int32_t)p++;
            }
    }
    offsets[e] = (int32_t)p;
}

/* An MoE layer, out (n,o) = sum_s weight(t,s) * x_t W_{idx(t,s)}^T, through the kernels: scores from
 * logits (n,e), top-k (the case's routing), permute, gather x (n,d), grouped GEMM with w (e,o,d),
 * combine. With backward (dout = r), the gradients of logits, x and w, in reverse op order.
 * dim: n, e, k, d, o, and 0 (softmax, k of all experts, plain weights) or 1 (sigmoid, 4 groups of
 * which 2 eligible, a bias, normalised weights times 2.5). */
#define MOE_LAYER(real, sfx)                                                                                      \
    static void moe_layer_##sfx(const op_case *c, real *out, const real *logits, const real *x, const real *w,    \
                                const real *r, real *dlogits, real *dx, real *dw)                                 \
    {                                                                                                             \
        const int64_t n = c->dim[0], e = c->dim[1], k = c->dim[2], d = c->dim[3], o = c->dim[4], nk = n * k;      \
        const int grouped_route = c->dim[5] == 1;                                                                 \
        real *s = calloc((size_t)(n * e), sizeof(real)), *wt = calloc((size_t)nk, sizeof(real));                  \
        real *gx = calloc((size_t)(nk * d), sizeof(real)), *h = calloc((size_t)(nk * o), sizeof(real));           \
        real bias[64];                                                                                            \
        int32_t *idx = calloc((size_t)nk, sizeof(int32_t)), *order = calloc((size_t)nk, sizeof(int32_t));        \
        int32_t *inv = calloc((size_t)nk, sizeof(int32_t)), *offsets = calloc((size_t)e + 1, sizeof(int32_t));    \
        assert_true(s && wt && gx && h && idx && order && inv && offsets && e <= 64);                             \
        for (int64_t j = 0; j < e; j++)                                                                           \
            bias[j] = (real)(0.05 * (double)((j * 7) % 5));                                                       \
        moe_scores_forward_##sfx(s, logits, n, e, grouped_route);                                                 \
        assert_int_equal(moe_topk_forward_##sfx(idx, wt, s, grouped_route ? bias : NULL, n, e, k,                 \
                                                grouped_route ? 4 : 0, 2, grouped_route, grouped_route ? 2.5 : 1), \
                         0);                                                                                      \
        moe_permute_host(order, inv, offsets, idx, nk, e);                                                        \
        moe_gather_forward_##sfx(gx, x, order, n, k, d);                                                          \
        grouped_matmul_##sfx(0, h, gx, w, offsets, e, o, d);                                                      \
        moe_combine_forward_##sfx(out, h, wt, inv, n, k, o);                                                      \
        if (r) {                                                                                                  \
            real *dh = calloc((size_t)(nk * o), sizeof(real)), *dwt = calloc((size_t)nk, sizeof(real));          \
            real *dgx = calloc((size_t)(nk * d), sizeof(real)), *ds = calloc((size_t)(n * e), sizeof(real));      \
            assert_true(dh && dwt && dgx && ds);                                                                  \
            moe_combine_backward_##sfx(dh, dwt, r, h, wt, inv, n, k, o);                                          \
            grouped_matmul_##sfx(1, dgx, dh, w, offsets, e, o, d);                                                \
            grouped_matmul_##sfx(2, dw, dh, gx, offsets, e, o, d);                                                \
            moe_gather_backward_##sfx(dx, dgx, inv, n, k, d);                                                     \
            moe_topk_backward_##sfx(ds, dwt, s, idx, n, e, k, grouped_route, grouped_route ? 2.5 : 1);            \
            moe_scores_backward_##sfx(dlogits, ds, s, n, e, grouped_route);                                       \
            free(dh);                                                                                             \
            free(dwt);                                                                                            \
            free(dgx);                                                                                            \
            free(ds);                                                                                             \
        }                                                                                                         \
        free(s);                                                                                                  \
        free(wt);                                                                                                 \
        free(gx);                                                                                                 \
        free(h);                                                                                                  \
        free(idx);                                                                                                \
        free(order);                                                                                              \
        free(inv);                                                                                                \
        free(offsets);                                                                                            \
    }
MOE_LAYER(double, f64)
MOE_LAYER(float, f32)

static void moe_fwd64(op_case *c, double *out)
{
    moe_layer_f64(c, out, c->in[0], c->in[1], c->in[2], NULL, NULL, NULL, NULL);
}
static void moe_bwd64(op_case *c)
{
    double *out = zero_vec(c->out_size);
    moe_layer_f64(c, out, c->in[0], c->in[1], c->in[2], c->r, c->grad[0], c->grad[1], c->grad[2]);
    free(out);
}
static void moe_fwd32(op_case *c, float *out)
{
    moe_layer_f32(c, out, c->in_f[0], c->in_f[1], c->in_f[2], NULL, NULL, NULL, NULL);
}
static void moe_bwd32(op_case *c)
{
    float *out = calloc((size_t)c->out_size + 1, sizeof *out);
    assert_non_null(out);
    moe_layer_f32(c, out, c->in_f[0], c->in_f[1], c->in_f[2], c->r_f, c->grad_f[0], c->grad_f[1], c->grad_f[2]);
    free(out);
}

static void moe_case_run(int64_t n, int64_t e, int64_t k, int64_t d, int64_t o, int64_t route)
{
    op_case c = {.name = route ? "moe layer (sigmoid, groups, bias, normalised)" : "moe layer (softmax)",
                 .n_in = 3, .in_name = {"logits", "x", "w"}, .dim = {n, e, k, d, o, route}};
    c.in_size[0] = n * e;
    c.in_size[1] = n * d;
    c.in_size[2] = e * o * d;
    c.out_size = n * o;
    c.forward_f64 = moe_fwd64;
    c.backward_f64 = moe_bwd64;
    c.forward_f32 = moe_fwd32;
    c.backward_f32 = moe_bwd32;
    case_setup(&c, 1.0);
    case_run_and_free(&c);
}

/* Finite differences through every MoE kernel at once: scores, top-k weights, gather, the grouped
 * GEMMs and combine (the routing itself is piecewise constant: h = 1e-6 does not move it here). */
static void test_moe_layer_gradients(void **state)
{
    (void)state;
    moe_case_run(7, 6, 2, 5, 3, 0);  /* n*k = 14 rows over 6 experts: some get none */
    moe_case_run(5, 8, 3, 4, 6, 1);
}

static void test_adamw_matches_hand_computation(void **state)
{
    (void)state;
    enum { N = 7, STEPS = 3 };
    const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    double p[N], g[N], m[N] = {0}, v[N] = {0}, pd[N], md[N] = {0}, vd[N] = {0};
    float pf[N], gf[N], mf[N] = {0}, vf[N] = {0};
    for (int i = 0; i < N; i++) {
        p[i] = pd[i] = rnd();
        pf[i] = (float)p[i];
    }
    for (int step = 1; step <= STEPS; step++) {
        for (int i = 0; i < N; i++) {
            g[i] = rnd();
            gf[i] = (float)g[i];
        }
        for (int i = 0; i < N; i++) { /* the formula from ctitan/device.h, term by term */
            p[i] -= lr * wd * p[i];
            m[i] = b1 * m[i] + (1 - b1) * g[i];
            v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
            double mhat = m[i] / (1 - pow(b1, step)), vhat = v[i] / (1 - pow(b2, step));
            p[i] -= lr * mhat / (sqrt(vhat) + eps);
        }
        adamw_f64(pd, g, md, vd, N, lr, b1, b2, eps, wd, step);
        adamw_f32(pf, gf, mf, vf, N, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd, step);
        for (int i = 0; i < N; i++) {
            assert_true(fabs(pd[i] - p[i]) < 1e-12);
            assert_true(fabs(md[i] - m[i]) < 1e-12 && fabs(vd[i] - v[i]) < 1e-12);
            assert_true(fabs(pf[i] - p[i]) < 1e-6);
        }
    }
}

/* ---------------------------------------------------------------- bf16 */

static uint16_t bf16_of_bits(uint32_t u)
{
    return cpu_f32_to_bf16(cpu_f32_from_bits(u));
}

static void test_bf16_rounding(void **state)
{
    (void)state;
    assert_int_equal(bf16_of_bits(0x3F800000u), 0x3F80); /* 1.0 exact */
    assert_int_equal(bf16_of_bits(0x3F808000u), 0x3F80); /* tie, lower is even: down */
    assert_int_equal(bf16_of_bits(0x3F818000u), 0x3F82); /* tie, lower is odd: up */
    assert_int_equal(bf16_of_bits(0x3F808001u), 0x3F81); /* just above a tie: up */
    assert_int_equal(bf16_of_bits(0x3F807FFFu), 0x3F80); /* just below: down */
    assert_int_equal(bf16_of_bits(0xBF818000u), 0xBF82); /* negative tie to even */
    assert_int_equal(bf16_of_bits(0x7F800000u), 0x7F80); /* +inf */
    assert_int_equal(bf16_of_bits(0xFF800000u), 0xFF80); /* -inf */
    assert_int_equal(bf16_of_bits(0x7F7FFFFFu), 0x7F80); /* FLT_MAX overflows to inf */
    assert_int_equal(bf16_of_bits(0x00000001u), 0x0000); /* smallest subnormal: to zero */
    assert_int_equal(bf16_of_bits(0x00008000u), 0x0000); /* subnormal tie, even: down */
    assert_int_equal(bf16_of_bits(0x00018000u), 0x0002); /* subnormal tie, odd: up */
    assert_int_equal(bf16_of_bits(0x80010000u), 0x8001); /* negative subnormal exact */
    assert_int_equal(bf16_of_bits(0x007FFFFFu), 0x0080); /* largest subnormal rounds to FLT_MIN */
    assert_int_equal(bf16_of_bits(0x80000000u), 0x8000); /* -0 */
    /* NaNs stay NaNs (a signalling NaN whose payload is only in the low half included) */
    const uint32_t nans[4] = {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu};
    for (int i = 0; i < 4; i++) {
        uint16_t hb = bf16_of_bits(nans[i]);
        assert_true((hb & 0x7F80) == 0x7F80 && (hb & 0x007F) != 0);
        assert_int_equal(hb & 0x8000, (nans[i] >> 16) & 0x8000);
        assert_true(isnan(cpu_bf16_to_f32(hb)));
    }
    /* bf16 -> f32 is exact, and rounding is idempotent over every bf16 value */
    for (uint32_t hb = 0; hb < 0x10000u; hb++) {
        float f = cpu_bf16_to_f32((uint16_t)hb);
        assert_int_equal(cpu_f32_bits(f), hb << 16);
        if (!isnan(f))
            assert_int_equal(cpu_f32_to_bf16(f), hb);
    }
    /* against a reference: the nearest of the two neighbours, ties to the even one */
    for (int i = 0; i < 100000; i++) {
        uint32_t u = (uint32_t)rnd_u64();
        float f = cpu_f32_from_bits(u);
        if (isnan(f) || isinf(f))
            continue;
        uint32_t lo = u & 0xFFFF0000u, rest = u & 0xFFFFu;
        uint32_t expect = lo >> 16;
        if (rest > 0x8000u || (rest == 0x8000u && (expect & 1u)))
            expect++;
        assert_int_equal(cpu_f32_to_bf16(f), expect & 0xFFFFu);
    }
}

/* ---------------------------------------------------------------- exp */

/* cpu_expf feeds every softmax: check it against libm's exp over its range */
static void test_fast_exp_accuracy(void **state)
{
    (void)state;
    double worst = 0;
    for (float x = -87.0f; x < 88.0f; x += 0.0137f) {
        double rel = fabs((double)cpu_expf(x) - exp((double)x)) / exp((double)x);
        worst = fmax(worst, rel);
    }
    assert_true(worst < 3e-7);
    assert_true(cpu_expf(-200.0f) == 0.0f);
    assert_true(cpu_expf(0.0f) == 1.0f);
    assert_true(isnan(cpu_expf(NAN)));
    assert_true(isfinite(cpu_expf(1000.0f)));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_gradients),
        cmocka_unit_test(test_matmul_transposes_and_beta),
        cmocka_unit_test(test_embedding_gradients),
        cmocka_unit_test(test_rmsnorm_gradients),
        cmocka_unit_test(test_layernorm_gradients),
        cmocka_unit_test(test_bias_gradients),
        cmocka_unit_test(test_rope_gradients),
        cmocka_unit_test(test_rope_convention_and_in_place),
        cmocka_unit_test(test_attention_gradients_gqa),
        cmocka_unit_test(test_attention_gradients_mha),
        cmocka_unit_test(test_attention_gradients_blocked_mqa),
        cmocka_unit_test(test_rope_pos_gradients),
        cmocka_unit_test(test_rope_freqs_gradients),
        cmocka_unit_test(test_attention_block_gradients),
        cmocka_unit_test(test_attention_doc_gradients),
        cmocka_unit_test(test_swiglu_gradients),
        cmocka_unit_test(test_gelu_gradients),
        cmocka_unit_test(test_cross_entropy_gradients),
        cmocka_unit_test(test_cross_entropy_ignored_rows_and_stability),
        cmocka_unit_test(test_moe_layer_gradients),
        cmocka_unit_test(test_adamw_matches_hand_computation),
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_fast_exp_accuracy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
