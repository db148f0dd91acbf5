/* test_devcheck: the host's layer of device argument checks (core/host/devcheck.c) around a stand-in
 * device whose ops only count their calls.
 *
 *   - a bad call is refused with CT_ERR_INVALID and one "op: what" line through the plugin's host
 *     table, and never reaches the plugin; a good one reaches it once, with its arguments, and
 *     its status comes back; a null device is refused without a message;
 *   - the table keeps the plugin's struct_size; ops the plugin leaves NULL stay NULL; ops the layer
 *     does not check are the plugin's own functions;
 *   - the MoE ops (ABI 2.14): bad shapes and group settings refused, and a table with some but not
 *     all twelve offers none;
 *   - a refusal while a graph captures makes graph_end fail with it and free the graph, as a
 *     plugin's own failure does; a capture without one ends as the plugin says.
 * (tests/unit/test_device_conformance.c runs the real plugins behind the layer.)
 */
#include "host/devcheck.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <setjmp.h>
#include <stddef.h>
#include <cmocka.h>

/* ---- the plugin's host table: set_error as the host formats it, under the plugin's name ---- */

static char last_error[600];
static void h_err(const ct_host *h, const char *fmt, ...) {
    (void)h;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(last_error, sizeof last_error, "fake: %s", msg);
}
static const ct_host host = {.struct_size = sizeof(ct_host), .set_error = h_err};

/* ---- a stand-in device: ops count their calls ---- */

static struct ct_device {
    int dummy;
} the_device;
static int calls, graph_frees;
static int64_t last_n;
static ct_status next_status;
static ct_graph *the_graph = (ct_graph *)&the_device; /* any non-NULL handle */

static ct_status f_axpy(ct_device *dev, float *y, const float *x, float alpha, int64_t n) {
    (void)dev, (void)y, (void)x, (void)alpha;
    calls++;
    last_n = n;
    return next_status;
}
static ct_status f_gelu(ct_device *dev, float *out, const float *x, int64_t n) {
    (void)dev, (void)out, (void)x;
    calls++;
    last_n = n;
    return next_status;
}
static ct_status f_amax(ct_device *dev, float *amax, const float *src, int64_t n, int64_t group) {
    (void)dev, (void)amax, (void)src, (void)n, (void)group;
    calls++;
    return CT_OK;
}
static ct_status f_sync(ct_device *dev) {
    (void)dev;
    calls++;
    return CT_OK;
}
static ct_status f_graph_begin(ct_device *dev) {
    (void)dev;
    return CT_OK;
}
static ct_status f_graph_end(ct_device *dev, ct_graph **graph, int64_t *ops) {
    (void)dev;
    *graph = the_graph;
    if (ops) *ops = calls;
    return CT_OK;
}
static void f_graph_free(ct_device *dev, ct_graph *graph) {
    (void)dev;
    assert_ptr_equal(graph, the_graph);
    graph_frees++;
}

static ct_device_api fake;

static int setup(void **state) {
    (void)state;
    memset(&fake, 0, sizeof fake);
    fake.struct_size = sizeof fake;
    fake.axpy = f_axpy;
    fake.gelu_forward = f_gelu;
    fake.synchronize = f_sync;
    fake.graph_begin = f_graph_begin;
    fake.graph_end = f_graph_end;
    fake.graph_free = f_graph_free;
    calls = graph_frees = 0;
    next_status = CT_OK;
    last_error[0] = '\0';
    return 0;
}

static void refused_before_the_plugin(void **state) {
    (void)state;
    const ct_device_api *d = devcheck_wrap(&fake, &host);
    float x[4] = {0};
    assert_int_equal(d->axpy(&the_device, x, x, 1.0f, -3), CT_ERR_INVALID);
    assert_string_equal(last_error, "fake: axpy: negative length -3");
    assert_int_equal(d->gelu_forward(&the_device, NULL, x, 4), CT_ERR_INVALID);
    assert_string_equal(last_error, "fake: gelu_forward: null pointer");
    assert_int_equal(calls, 0);
    last_error[0] = '\0';
    assert_int_equal(d->axpy(NULL, x, x, 1.0f, 4), CT_ERR_INVALID); /* no device: no message */
    assert_string_equal(last_error, "");
    assert_int_equal(calls, 0);
}

static void good_calls_reach_the_plugin(void **state) {
    (void)state;
    const ct_device_api *d = devcheck_wrap(&fake, &host);
    float x[4] = {0};
    assert_int_equal(d->axpy(&the_device, x, x, 1.0f, 4), CT_OK);
    assert_int_equal(calls, 1);
    assert_int_equal(last_n, 4);
    assert_int_equal(d->gelu_forward(&the_device, NULL, NULL, 0), CT_OK); /* no work: no pointers needed */
    assert_int_equal(calls, 2);
    next_status = CT_ERR_UNSUPPORTED; /* the plugin's own answer comes back unchanged */
    assert_int_equal(d->axpy(&the_device, x, x, 1.0f, 2), CT_ERR_UNSUPPORTED);
    assert_string_equal(last_error, "");
}

static void the_table(void **state) {
    (void)state;
    fake.struct_size = offsetof(ct_device_api, amax); /* a plugin of an older ABI: its table ends earlier */
    fake.amax = f_amax; /* past its struct_size: never read */
    const ct_device_api *d = devcheck_wrap(&fake, &host);
    assert_int_equal(d->struct_size, offsetof(ct_device_api, amax));
    assert_null(d->amax);
    assert_null(d->add); /* the plugin's NULL stays NULL */
    assert_non_null(d->axpy);
    assert_ptr_not_equal(d->axpy, f_axpy);     /* checked */
    assert_ptr_equal(d->synchronize, f_sync);  /* nothing to check: the plugin's own */
}

static void refusal_fails_the_capture(void **state) {
    (void)state;
    const ct_device_api *d = devcheck_wrap(&fake, &host);
    float x[4] = {0};
    ct_graph *g = NULL;
    assert_int_equal(d->graph_begin(&the_device), CT_OK);
    assert_int_equal(d->axpy(&the_device, x, x, 1.0f, 4), CT_OK);
    assert_int_equal(d->axpy(&the_device, NULL, x, 1.0f, 4), CT_ERR_INVALID);
    assert_int_equal(d->graph_end(&the_device, &g, NULL), CT_ERR_INVALID);
    assert_null(g);
    assert_int_equal(graph_frees, 1);
    /* the next capture starts clean */
    assert_int_equal(d->graph_begin(&the_device), CT_OK);
    assert_int_equal(d->axpy(&the_device, x, x, 1.0f, 4), CT_OK);
    assert_int_equal(d->graph_end(&the_device, &g, NULL), CT_OK);
    assert_ptr_equal(g, the_graph);
    /* a refusal outside a capture is no later capture's */
    assert_int_equal(d->axpy(&the_device, NULL, x, 1.0f, 4), CT_ERR_INVALID);
    assert_int_equal(d->graph_begin(&the_device), CT_OK);
    assert_int_equal(d->graph_end(&the_device, &g, NULL), CT_OK);
    assert_int_equal(graph_frees, 1);
}

/* ---- ABI 2.14: the MoE ops come as a set, and their shapes are checked before the plugin ---- */

static ct_status f_topk(ct_device *dev, int32_t *idx, float *weights, const float *scores, const float *bias,
                        int64_t n, int64_t e, int64_t k, int64_t n_groups, int64_t topk_groups, int normalize,
                        float route_scale) {
    (void)dev, (void)idx, (void)weights, (void)scores, (void)bias, (void)e, (void)k, (void)n_groups;
    (void)topk_groups, (void)normalize, (void)route_scale;
    calls++;
    last_n = n;
    return CT_OK;
}
static ct_status f_permute(ct_device *dev, int32_t *order, int32_t *inv, int32_t *offsets, const int32_t *idx,
                           int64_t nk, int64_t e) {
    (void)dev, (void)order, (void)inv, (void)offsets, (void)idx, (void)e;
    calls++;
    last_n = nk;
    return CT_OK;
}
/* The other ten: never called here, only present. */
static ct_status f_scores(ct_device *dev, float *a, const float *b, int64_t n, int64_t e, int func) {
    (void)dev, (void)a, (void)b, (void)n, (void)e, (void)func;
    return CT_OK;
}
static ct_status f_scores_bwd(ct_device *dev, float *a, const float *b, const float *c, int64_t n, int64_t e,
                              int func) {
    (void)dev, (void)a, (void)b, (void)c, (void)n, (void)e, (void)func;
    return CT_OK;
}
static ct_status f_topk_bwd(ct_device *dev, float *a, const float *b, const float *c, const int32_t *idx, int64_t n,
                            int64_t e, int64_t k, int normalize, float scale) {
    (void)dev, (void)a, (void)b, (void)c, (void)idx, (void)n, (void)e, (void)k, (void)normalize, (void)scale;
    return CT_OK;
}
static ct_status f_gather(ct_device *dev, float *a, const float *b, const int32_t *ix, int64_t n, int64_t k,
                          int64_t d) {
    (void)dev, (void)a, (void)b, (void)ix, (void)n, (void)k, (void)d;
    return CT_OK;
}
static ct_status f_grouped(ct_device *dev, float *a, const float *b, const float *c, const int32_t *off, int64_t m,
                           int64_t e, int64_t o, int64_t i) {
    (void)dev, (void)a, (void)b, (void)c, (void)off, (void)m, (void)e, (void)o, (void)i;
    return CT_OK;
}
static ct_status f_combine(ct_device *dev, float *a, const float *b, const float *c, const int32_t *inv, int64_t n,
                           int64_t k, int64_t d) {
    (void)dev, (void)a, (void)b, (void)c, (void)inv, (void)n, (void)k, (void)d;
    return CT_OK;
}
static ct_status f_combine_bwd(ct_device *dev, float *a, float *b, const float *c, const float *y, const float *w,
                               const int32_t *inv, int64_t n, int64_t k, int64_t d) {
    (void)dev, (void)a, (void)b, (void)c, (void)y, (void)w, (void)inv, (void)n, (void)k, (void)d;
    return CT_OK;
}

static void set_moe_ops(void) {
    fake.moe_scores_forward = f_scores;
    fake.moe_scores_backward = f_scores_bwd;
    fake.moe_topk_forward = f_topk;
    fake.moe_topk_backward = f_topk_bwd;
    fake.moe_permute = f_permute;
    fake.moe_gather_forward = f_gather;
    fake.moe_gather_backward = f_gather;
    fake.grouped_matmul_forward = f_grouped;
    fake.grouped_matmul_backward_input = f_grouped;
    fake.grouped_matmul_backward_weight = f_grouped;
    fake.moe_combine_forward = f_combine;
    fake.moe_combine_backward = f_combine_bwd;
}

static void moe_ops_checked(void **state) {
    (void)state;
    set_moe_ops();
    const ct_device_api *d = devcheck_wrap(&fake, &host);
    assert_ptr_not_equal(d->moe_topk_forward, f_topk);
    int32_t ix[8] = {0};
    float w[8] = {0};
    assert_int_equal(d->moe_topk_forward(&the_device, ix, w, w, NULL, 4, 8, 9, 0, 0, 1, 1.0f), CT_ERR_INVALID);
    assert_string_equal(last_error, "fake: moe_topk_forward: shape n=4 e=8 k=9, expected n >= 0, e > 0 and 1 <= k <= e");
    assert_int_equal(d->moe_topk_forward(&the_device, ix, w, w, NULL, 4, 8, 2, 3, 1, 1, 1.0f), CT_ERR_INVALID);
    assert_string_equal(last_error, "fake: moe_topk_forward: 8 experts do not split into 3 groups");
    assert_int_equal(d->moe_topk_forward(&the_device, ix, w, w, NULL, 4, 8, 5, 4, 2, 1, 1.0f), CT_ERR_INVALID);
    assert_string_equal(last_error, "fake: moe_topk_forward: k=5 is more than the 4 experts of the 2 eligible groups");
    assert_int_equal(d->moe_permute(&the_device, ix, ix, NULL, ix, 8, 4), CT_ERR_INVALID);
    assert_string_equal(last_error, "fake: moe_permute: null pointer");
    assert_int_equal(d->moe_topk_forward(&the_device, ix, w, w, NULL, (int64_t)1 << 30, 8, 4, 0, 0, 1, 1.0f),
                     CT_ERR_INVALID); /* n*k past int32 */
    assert_int_equal(calls, 0);
    assert_int_equal(d->moe_topk_forward(&the_device, ix, w, w, NULL, 4, 8, 4, 4, 2, 1, 1.0f), CT_OK);
    assert_int_equal(d->moe_permute(&the_device, ix, ix, ix, ix, 8, 4), CT_OK);
    assert_int_equal(calls, 2);
    assert_int_equal(last_n, 8);
}

static void moe_ops_all_or_none(void **state) {
    (void)state;
    set_moe_ops();
    fake.grouped_matmul_backward_weight = NULL; /* eleven of twelve: the set is not offered */
    const ct_device_api *d = devcheck_wrap(&fake, &host);
    assert_null(d->moe_topk_forward);
    assert_null(d->moe_permute);
    assert_null(d->moe_combine_backward);
    fake.grouped_matmul_backward_weight = f_grouped;
    d = devcheck_wrap(&fake, &host);
    assert_non_null(d->grouped_matmul_backward_weight);
    assert_non_null(d->moe_scores_forward);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(refused_before_the_plugin, setup),
        cmocka_unit_test_setup(good_calls_reach_the_plugin, setup),
        cmocka_unit_test_setup(the_table, setup),
        cmocka_unit_test_setup(refusal_fails_the_capture, setup),
        cmocka_unit_test_setup(moe_ops_checked, setup),
        cmocka_unit_test_setup(moe_ops_all_or_none, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
