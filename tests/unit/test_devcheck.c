/* test_devcheck: the host's layer of device argument checks (core/host/devcheck.c) around a stand-in
 * device whose ops only count their calls.
 *
 *   - a bad call is refused with CT_ERR_INVALID and one "op: what" line through the plugin's host
 *     table, and never reaches the plugin; a good one reaches it once, with its arguments, and
 *     its status comes back; a null device is refused without a message;
 *   - the table has today's struct_size; ops the plugin leaves NULL stay NULL; ops the layer
 *     does not check are the plugin's own functions;
 *   - the 2.23 families: a plugin with only the general ops gets every narrow op, each calling the
 *     general op with its case's arguments; a plugin of an older minor with only narrow ops gets the
 *     general ops, each case calling its narrow op (and a case it has no op for is unsupported);
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
    assert_int_equal(d->struct_size, sizeof(ct_device_api)); /* today's: the 2.23 general ops are always there */
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

/* ---- the 2.23 families: which op the plugin saw, with which case arguments ---- */

static char seen[64];
static const void *seen_pos, *seen_table, *seen_lse, *seen_dloss_dev;
static int64_t seen_begin, seen_rows;
static int seen_strict;
static float seen_theta, seen_dloss;

static void saw(const char *op) {
    calls++;
    snprintf(seen, sizeof seen, "%s", op);
}
static ct_status g_emb_fwd(ct_device *dev, float *out, const int32_t *ids, const float *table, int64_t n, int64_t c,
                           int64_t begin, int64_t rows, int strict) {
    (void)dev, (void)out, (void)ids, (void)table, (void)n, (void)c;
    saw("embedding_forward_general");
    seen_begin = begin, seen_rows = rows, seen_strict = strict;
    return CT_OK;
}
static ct_status g_emb_bwd(ct_device *dev, float *dt, const int32_t *ids, const float *dout, int64_t n, int64_t c,
                           int64_t begin, int64_t rows, int strict) {
    (void)dt, (void)dout;
    ct_status st = g_emb_fwd(dev, NULL, ids, NULL, n, c, begin, rows, strict);
    saw("embedding_backward_general");
    return st;
}
static ct_status g_rope(ct_device *dev, float *out, const float *x, const int32_t *pos, const float *inv, float theta,
                        int64_t b, int64_t t, int64_t h, int64_t d) {
    (void)dev, (void)out, (void)x, (void)b, (void)t, (void)h, (void)d;
    saw("rope_forward_general");
    seen_pos = pos, seen_table = inv, seen_theta = theta;
    return CT_OK;
}
static ct_status g_xent(ct_device *dev, float *dl, const float *l, const int32_t *t, const float *lse, float dloss,
                        const float *dloss_dev, int64_t n, int64_t v, int64_t begin, int32_t ig) {
    (void)dev, (void)dl, (void)l, (void)t, (void)n, (void)v, (void)ig;
    saw("cross_entropy_backward_general");
    seen_lse = lse, seen_dloss = dloss, seen_dloss_dev = dloss_dev, seen_begin = begin;
    return CT_OK;
}
static ct_status n_emb(ct_device *dev, float *out, const int32_t *ids, const float *table, int64_t n, int64_t c,
                       int64_t vocab) {
    (void)dev, (void)out, (void)ids, (void)table, (void)n, (void)c;
    saw("embedding_forward");
    seen_rows = vocab;
    return CT_OK;
}
static ct_status n_emb_range(ct_device *dev, float *out, const int32_t *ids, const float *table, int64_t n, int64_t c,
                             int64_t begin, int64_t rows) {
    (void)dev, (void)out, (void)ids, (void)table, (void)n, (void)c;
    saw("embedding_forward_range");
    seen_begin = begin, seen_rows = rows;
    return CT_OK;
}
static ct_status n_rope(ct_device *dev, float *out, const float *x, int64_t b, int64_t t, int64_t h, int64_t d,
                        float theta) {
    (void)dev, (void)out, (void)x, (void)b, (void)t, (void)h, (void)d;
    saw("rope_forward");
    seen_theta = theta;
    return CT_OK;
}
static ct_status n_rope_pos(ct_device *dev, float *out, const float *x, const int32_t *pos, int64_t b, int64_t t,
                            int64_t h, int64_t d, float theta) {
    (void)dev, (void)out, (void)x, (void)b, (void)t, (void)h, (void)d;
    saw("rope_forward_pos");
    seen_pos = pos, seen_theta = theta;
    return CT_OK;
}
static ct_status n_xent(ct_device *dev, float *dl, const float *l, const int32_t *t, float dloss, int64_t n, int64_t v,
                        int32_t ig) {
    (void)dev, (void)dl, (void)l, (void)t, (void)n, (void)v, (void)ig;
    saw("cross_entropy_backward");
    seen_dloss = dloss;
    return CT_OK;
}
static ct_status n_xent_lse(ct_device *dev, float *dl, const float *l, const int32_t *t, const float *lse, float dloss,
                            int64_t n, int64_t v, int64_t begin, int32_t ig) {
    (void)dev, (void)dl, (void)l, (void)t, (void)n, (void)v, (void)ig;
    saw("cross_entropy_backward_lse");
    seen_lse = lse, seen_dloss = dloss, seen_begin = begin;
    return CT_OK;
}

/* A 2.23 plugin with the general ops alone: every narrow op is there and reaches the general op. */
static void narrow_ops_from_the_general(void **state) {
    (void)state;
    fake.embedding_forward_general = g_emb_fwd;
    fake.embedding_backward_general = g_emb_bwd;
    fake.rope_forward_general = g_rope;
    fake.rope_backward_general = g_rope;
    fake.cross_entropy_backward_general = g_xent;
    const ct_device_api *d = devcheck_wrap(&fake, &host);
    float x[8] = {0}, one = 1.0f;
    int32_t ids[2] = {0, 1};
    assert_int_equal(d->embedding_forward(&the_device, x, ids, x, 2, 2, 7), CT_OK);
    assert_string_equal(seen, "embedding_forward_general");
    assert_true(seen_begin == 0 && seen_rows == 7 && seen_strict == 1);
    assert_int_equal(d->embedding_backward_range(&the_device, x, ids, x, 2, 2, 5, 3), CT_OK);
    assert_string_equal(seen, "embedding_backward_general");
    assert_true(seen_begin == 5 && seen_rows == 3 && seen_strict == 0);
    assert_int_equal(d->rope_forward(&the_device, x, x, 1, 2, 1, 4, 500.0f), CT_OK);
    assert_true(!seen_pos && !seen_table && seen_theta == 500.0f);
    assert_int_equal(d->rope_backward_pos(&the_device, x, x, ids, 1, 2, 1, 4, 9.0f), CT_OK);
    assert_true(seen_pos == ids && !seen_table && seen_theta == 9.0f);
    assert_int_equal(d->rope_freqs_forward(&the_device, x, x, NULL, x, 1, 2, 1, 4), CT_OK);
    assert_true(!seen_pos && seen_table == x);
    assert_int_equal(d->cross_entropy_backward_dev(&the_device, x, x, ids, &one, 2, 4, -100), CT_OK);
    assert_true(!seen_lse && seen_dloss_dev == &one && seen_begin == 0);
    assert_int_equal(d->cross_entropy_backward_lse(&the_device, x, x, ids, x, 0.5f, 2, 4, 8, -100), CT_OK);
    assert_true(seen_lse == x && seen_dloss == 0.5f && !seen_dloss_dev && seen_begin == 8);
    assert_int_equal(calls, 8);
    /* the general op's own checks: a case no narrow op has a name for */
    assert_int_equal(d->cross_entropy_backward_general(&the_device, x, x, ids, NULL, 1, NULL, 2, 4, 3, -100),
                     CT_ERR_INVALID);
    assert_string_equal(last_error, "fake: cross_entropy_backward_general: begin 3 without lse, expected 0 (whole rows)");
    assert_int_equal(d->embedding_forward_general(&the_device, x, ids, x, 2, 2, 1, 3, 1), CT_ERR_INVALID);
    assert_string_equal(last_error, "fake: embedding_forward_general: begin 1 with strict, expected 0 (the whole table)");
    assert_int_equal(calls, 8);
}

/* A plugin of an older minor with narrow ops alone: each case of the general op reaches its narrow op. */
static void general_ops_from_the_narrow(void **state) {
    (void)state;
    fake.struct_size = offsetof(ct_device_api, embedding_forward_general);
    fake.embedding_forward = n_emb;
    fake.embedding_backward = n_emb; /* same shape of call: a stand-in */
    fake.embedding_forward_range = n_emb_range;
    fake.rope_forward = n_rope;
    fake.rope_backward = n_rope;
    fake.rope_forward_pos = n_rope_pos;
    fake.cross_entropy_backward = n_xent;
    fake.cross_entropy_backward_lse = n_xent_lse;
    const ct_device_api *d = devcheck_wrap(&fake, &host);
    assert_non_null(d->embedding_forward_general);
    assert_non_null(d->rope_forward_general);
    assert_non_null(d->cross_entropy_backward_general);
    assert_null(d->rope_freqs_forward); /* the plugin has no case for it: not offered */
    assert_null(d->cross_entropy_backward_dev);
    float x[8] = {0}, one = 1.0f;
    int32_t ids[2] = {0, 1};
    assert_int_equal(d->embedding_forward_general(&the_device, x, ids, x, 2, 2, 0, 7, 1), CT_OK);
    assert_string_equal(seen, "embedding_forward");
    assert_true(seen_rows == 7);
    assert_int_equal(d->embedding_forward_general(&the_device, x, ids, x, 2, 2, 4, 3, 0), CT_OK);
    assert_string_equal(seen, "embedding_forward_range");
    assert_true(seen_begin == 4 && seen_rows == 3);
    assert_int_equal(d->rope_forward_general(&the_device, x, x, NULL, NULL, 500.0f, 1, 2, 1, 4), CT_OK);
    assert_string_equal(seen, "rope_forward");
    assert_int_equal(d->rope_forward_general(&the_device, x, x, ids, NULL, 9.0f, 1, 2, 1, 4), CT_OK);
    assert_string_equal(seen, "rope_forward_pos");
    assert_true(seen_pos == ids && seen_theta == 9.0f);
    assert_int_equal(d->cross_entropy_backward_general(&the_device, x, x, ids, NULL, 0.25f, NULL, 2, 4, 0, -100),
                     CT_OK);
    assert_string_equal(seen, "cross_entropy_backward");
    assert_true(seen_dloss == 0.25f);
    assert_int_equal(d->cross_entropy_backward_general(&the_device, x, x, ids, x, 0.5f, NULL, 2, 4, 6, -100), CT_OK);
    assert_string_equal(seen, "cross_entropy_backward_lse");
    assert_true(seen_lse == x && seen_begin == 6);
    assert_int_equal(calls, 6);
    /* cases the old plugin has no op for: unsupported, with a line, and the plugin not called */
    assert_int_equal(d->rope_forward_general(&the_device, x, x, NULL, x, 1.0f, 1, 2, 1, 4), CT_ERR_UNSUPPORTED);
    assert_string_equal(last_error,
                        "fake: rope_forward_general: the device has neither this op nor rope_freqs_forward/rope_freqs_backward");
    assert_int_equal(d->cross_entropy_backward_general(&the_device, x, x, ids, x, 0.5f, &one, 2, 4, 6, -100),
                     CT_ERR_UNSUPPORTED);
    assert_int_equal(calls, 6);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(refused_before_the_plugin, setup),
        cmocka_unit_test_setup(good_calls_reach_the_plugin, setup),
        cmocka_unit_test_setup(the_table, setup),
        cmocka_unit_test_setup(narrow_ops_from_the_general, setup),
        cmocka_unit_test_setup(general_ops_from_the_narrow, setup),
        cmocka_unit_test_setup(refusal_fails_the_capture, setup),
        cmocka_unit_test_setup(moe_ops_checked, setup),
        cmocka_unit_test_setup(moe_ops_all_or_none, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
