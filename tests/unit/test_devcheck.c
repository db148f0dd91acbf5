/* test_devcheck: the host's layer of device argument checks (core/host/devcheck.c) around a stand-in
 * device whose ops only count their calls.
 *
 *   - a bad call is refused with CT_ERR_INVALID and one "op: what" line through the plugin's host
 *     table, and never reaches the plugin; a good one reaches it once, with its arguments, and
 *     its status comes back; a null device is refused without a message;
 *   - the table keeps the plugin's struct_size; ops the plugin leaves NULL stay NULL; ops the layer
 *     does not check are the plugin's own functions;
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(refused_before_the_plugin, setup),
        cmocka_unit_test_setup(good_calls_reach_the_plugin, setup),
        cmocka_unit_test_setup(the_table, setup),
        cmocka_unit_test_setup(refusal_fails_the_capture, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
