/* test_tp_place.c: plugins/tp's placement of 1-D tensors (biases), driven through its ABI table with
 * a stand-in host, as the planner does (env.planning: no device, no comm).
 *
 * model.h: a 1-D tensor takes the style of the linear it belongs to; CT_TP_COLWISE splits it along
 * its one dim with the output features, CT_TP_ROWWISE leaves it whole. A split that does not divide
 * is refused with the tensor's real shape. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "ctitan/strategy.h"

static char last_error[512];
static void h_log(const ct_host *h, ct_log_level l, const char *f, ...) {
    (void)h;
    (void)l;
    (void)f;
}
static void h_err(const ct_host *h, const char *f, ...) {
    (void)h;
    va_list a;
    va_start(a, f);
    vsnprintf(last_error, sizeof last_error, f, a);
    va_end(a);
}
/* every option at its default: sequence parallel on, loss parallel on, no async TP */
static ct_status h_int(const ct_host *h, const char *k, int64_t *o) {
    (void)h;
    (void)k;
    *o = 4;
    return CT_OK;
}
static ct_status h_bool(const ct_host *h, const char *k, int *o) {
    (void)h;
    *o = strcmp(k, "enable_sequence_parallel") == 0;
    return CT_OK;
}
static const ct_host host = {.struct_size = sizeof(ct_host), .abi_major = CT_ABI_MAJOR, .abi_minor = CT_ABI_MINOR,
                             .log = h_log, .set_error = h_err, .opt_int = h_int, .opt_bool = h_bool};

static const ct_tp_rule plan[] = {
    {"w.*", CT_TP_COLWISE}, /* weight (8 x 4) and bias (8) */
    {"o.*", CT_TP_ROWWISE}, /* weight (4 x 8) and bias (4) */
    {NULL, CT_TP_NONE},
};

static const ct_strategy_api *load_tp(void) {
    void *so = dlopen(CT_BUILD_PLUGIN_DIR "/ctitan-tp.so", RTLD_NOW | RTLD_LOCAL);
    if (!so) fail_msg("dlopen: %s", dlerror());
    ct_plugin_entry_fn entry = (ct_plugin_entry_fn)dlsym(so, CT_PLUGIN_ENTRY_NAME);
    ct_plugin_info info = {.struct_size = sizeof info};
    assert_non_null(entry);
    assert_int_equal(entry(&host, &info), CT_OK);
    return info.api;
}

/* Places tensors t[0..n) on tp rank 1 of 2; returns place()'s status. */
static ct_status place(ct_tensor *t, ct_param_slot *slots, int n) {
    const ct_strategy_api *api = load_tp();
    ct_mesh_info mesh = {.struct_size = sizeof mesh, .world_size = 2, .world_rank = 1};
    for (int a = 0; a < CT_MESH_NAXES; a++) mesh.degree[a] = 1;
    mesh.degree[CT_AXIS_TP] = 2;
    mesh.coord[CT_AXIS_TP] = 1;
    ct_strategy_env env = {.struct_size = sizeof env, .mesh = &mesh, .tp_plan = plan, .seq_len = 8, .planning = 1};
    ct_strategy *s = NULL;
    assert_int_equal(api->create(&host, &env, &s), CT_OK);
    for (int i = 0; i < n; i++)
        slots[i] = (ct_param_slot){.struct_size = sizeof(ct_param_slot), .param = &t[i], .numel = ct_tensor_numel(&t[i]),
                                   .split_axis = -1, .split_dim = -1, .copy_of = -1};
    ct_status st = api->place(s, slots, n);
    api->destroy(s);
    return st;
}

static void test_colwise_bias_splits_rowwise_bias_stays_whole(void **state) {
    (void)state;
    ct_tensor t[4] = {
        {.struct_size = sizeof(ct_tensor), .dtype = CT_F32, .ndim = 2, .shape = {8, 4}, .name = "w.weight"},
        {.struct_size = sizeof(ct_tensor), .dtype = CT_F32, .ndim = 1, .shape = {8}, .name = "w.bias"},
        {.struct_size = sizeof(ct_tensor), .dtype = CT_F32, .ndim = 2, .shape = {4, 8}, .name = "o.weight"},
        {.struct_size = sizeof(ct_tensor), .dtype = CT_F32, .ndim = 1, .shape = {4}, .name = "o.bias"},
    };
    ct_param_slot s[4];
    assert_int_equal(place(t, s, 4), CT_OK);
    /* the column-wise bias: rank 1's half of the output features, as its weight's rows */
    assert_int_equal(t[0].shape[0], 4);
    assert_int_equal(t[1].shape[0], 4);
    assert_int_equal(s[1].split_axis, CT_AXIS_TP);
    assert_int_equal(s[1].split_dim, 0);
    assert_int_equal(s[1].split_parts, 2);
    assert_int_equal(s[1].split_index, 1);
    assert_int_equal(s[1].numel, 4);
    assert_int_equal(s[1].local_numel, 4);
    /* the row-wise weight split on its input features; its bias whole */
    assert_int_equal(t[2].shape[1], 4);
    assert_int_equal(s[2].split_dim, 1);
    assert_int_equal(t[3].shape[0], 4);
    assert_int_equal(s[3].split_axis, -1);
    assert_int_equal(s[3].split_dim, -1);
    assert_int_equal(s[3].numel, 4);
}

static void test_bias_that_does_not_divide_names_its_shape(void **state) {
    (void)state;
    ct_tensor t[1] = {{.struct_size = sizeof(ct_tensor), .dtype = CT_F32, .ndim = 1, .shape = {7}, .name = "w.bias"}};
    ct_param_slot s[1];
    last_error[0] = 0;
    assert_int_equal(place(t, s, 1), CT_ERR_INVALID);
    assert_string_equal(last_error, "tensor parallel: w.bias (7) cannot be split in 2 along dim 0 (the plan says column-wise)");
    ct_tensor m[1] = {{.struct_size = sizeof(ct_tensor), .dtype = CT_F32, .ndim = 2, .shape = {4, 7}, .name = "o.weight"}};
    assert_int_equal(place(m, s, 1), CT_ERR_INVALID);
    assert_string_equal(last_error, "tensor parallel: o.weight (4 x 7) cannot be split in 2 along dim 1 (the plan says row-wise)");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_colwise_bias_splits_rowwise_bias_stays_whole),
        cmocka_unit_test(test_bias_that_does_not_divide_names_its_shape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
