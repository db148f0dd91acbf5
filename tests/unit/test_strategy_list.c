/* test_strategy_list.c: engine/strategies.c, the run's strategies as one ordered list, on manifests
 * built from overrides and stand-in API tables (no plugin loaded).
 *
 * strategies.h: without parallelism.strategies the list is torchtitan's order from the *_strategy keys,
 * then the data-parallel pick by the degrees; parallelism.strategies gives the order; a plugin's own word
 * on what it serves wins, one built before ABI 2.22 takes its key's; the checks refuse what cannot run,
 * naming the key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "base/error.h"
#include "config/manifest.h"
#include "engine/strategies.h"
#include "manifest_fixture.h"

/* The list as a session reads it: the keys once (engine_settings_read), then the list from them. */
static ct_status list_read(const manifest *m, int world, int with_dp, strategy_list *l) {
    engine_settings es;
    engine_settings_read(m, &es);
    return strategy_list_read(&es, m, world, with_dp, l);
}

/* "name:serves:axis,..." of a list, for one comparison */
static const char *show(const strategy_list *l) {
    static char buf[512];
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < l->n; i++)
        at += (size_t)snprintf(buf + at, sizeof buf - at, "%s%s:%d:%d", i ? "," : "", l->item[i].name,
                               l->item[i].serves, l->item[i].axis);
    return buf;
}

/* API tables as a plugin of 2.22 (saying, or not) or of 2.21 (before the field) fills them */
static ct_strategy_api said(int serves, int axis) {
    ct_strategy_api a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.serves = serves;
    a.axis = axis;
    return a;
}
static ct_strategy_api before_2_22(void) {
    ct_strategy_api a = said(0, 0);
    a.struct_size = offsetof(ct_strategy_api, serves);
    return a;
}

static void test_default_is_torchtitans_order_from_the_keys(void **state) {
    (void)state;
    strategy_list l;
    manifest *m = fixture_overrides((const char *[]){"parallelism.tensor_parallel_degree=2", NULL});
    assert_int_equal(list_read(m, 8, 1, &l), CT_OK); /* dp_shard -1 -> 4: fsdp */
    assert_int_equal(l.listed, 0);
    assert_string_equal(show(&l), "tp:1:4,cp:1:3,ep:1:6,fsdp:2:-1");
    assert_int_equal(list_read(m, 2, 1, &l), CT_OK); /* tp 2 on 2 ranks: no data parallel */
    assert_string_equal(show(&l), "tp:1:4,cp:1:3,ep:1:6");
    manifest_free(m);
    m = fixture_overrides((const char *[]){"parallelism.tp_strategy=/x/mytp.so", "parallelism.data_parallel_replicate_degree=2",
                              NULL});
    assert_int_equal(list_read(m, 2, 1, &l), CT_OK);
    assert_string_equal(show(&l), "/x/mytp.so:1:4,cp:1:3,ep:1:6,ddp:2:-1");
    assert_int_equal(list_read(m, 2, 0, &l), CT_OK); /* without the job's size: no dp pick */
    assert_string_equal(show(&l), "/x/mytp.so:1:4,cp:1:3,ep:1:6");
    manifest_free(m);
}

static void test_the_list_gives_the_order(void **state) {
    (void)state;
    strategy_list l;
    manifest *m = fixture_overrides((const char *[]){"parallelism.strategies=cp, /x/probe.so,tp ,dp", NULL});
    assert_int_equal(list_read(m, 4, 1, &l), CT_OK); /* dp_shard 4: fsdp */
    assert_int_equal(l.listed, 1);
    /* items known by a key's value take its role until the plugin says; others wait for theirs */
    assert_string_equal(show(&l), "cp:1:3,/x/probe.so:0:-1,tp:1:4,fsdp:2:-1");
    ct_strategy_api tpa = said(CT_SERVES_AXIS, CT_AXIS_TP), epa = said(CT_SERVES_AXIS, CT_AXIS_EP);
    assert_int_equal(strategy_resolve(m, &l.item[1], &epa, "probe"), CT_OK);
    assert_int_equal(strategy_resolve(m, &l.item[2], &tpa, "tp"), CT_OK);
    assert_int_equal(strategy_list_check(m, &l), CT_OK);
    assert_string_equal(show(&l), "cp:1:3,/x/probe.so:1:6,tp:1:4,fsdp:2:-1");
    manifest_free(m);
}

static void test_a_plugin_before_2_22_takes_its_keys_role(void **state) {
    (void)state;
    strategy_list l;
    manifest *m = fixture_overrides((const char *[]){"parallelism.cp_strategy=/x/old.so", "parallelism.strategies=/x/old.so,/x/new.so",
                                        NULL});
    ct_strategy_api old = before_2_22(), unsaid = said(CT_SERVES_UNSAID, 0);
    assert_int_equal(list_read(m, 1, 1, &l), CT_OK);
    assert_int_equal(strategy_resolve(m, &l.item[0], &old, "old"), CT_OK);
    assert_int_equal(l.item[0].serves, CT_SERVES_AXIS);
    assert_int_equal(l.item[0].axis, CT_AXIS_CP);
    /* no key names the other: it must say */
    assert_int_equal(strategy_resolve(m, &l.item[1], &unsaid, "new"), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "command line: --parallelism.strategies: strategy 'new' does not say"));
    manifest_free(m);
}

/* The list read from kv, each item resolved by `apis` (NULL: the key's role), then checked: the status
 * and, on a refusal, whether the message holds `want`. */
static ct_status refused(const char *const *kv, const ct_strategy_api *apis, const char *want) {
    strategy_list l;
    manifest *m = fixture_overrides(kv);
    ct_status st = list_read(m, 4, 1, &l);
    for (int i = 0; i < l.n && st == CT_OK; i++)
        st = strategy_resolve(m, &l.item[i], apis ? &apis[i] : &(ct_strategy_api){0}, l.item[i].name);
    if (st == CT_OK) st = strategy_list_check(m, &l);
    manifest_free(m);
    if (st != CT_OK && !strstr(ct_last_error(), want)) fail_msg("got '%s', wanted '%s'", ct_last_error(), want);
    return st;
}

static void test_impossible_lists_are_refused_naming_the_key(void **state) {
    (void)state;
    ct_strategy_api dp_tp[] = {said(CT_SERVES_DATA_PARALLEL, 0), said(CT_SERVES_AXIS, CT_AXIS_TP)};
    assert_int_equal(refused((const char *[]){"parallelism.strategies=fsdp,tp", NULL}, dp_tp,
                             "--parallelism.strategies: 'fsdp' (data parallel) comes before 'tp' (the tp axis)"),
                     CT_ERR_INVALID);
    ct_strategy_api two_tp[] = {said(CT_SERVES_AXIS, CT_AXIS_TP), said(CT_SERVES_AXIS, CT_AXIS_TP)};
    assert_int_equal(refused((const char *[]){"parallelism.strategies=tp,/x/tp2.so", NULL}, two_tp,
                             "'tp' and '/x/tp2.so' both serve the tp axis"),
                     CT_ERR_INVALID);
    ct_strategy_api pp[] = {said(CT_SERVES_AXIS, CT_AXIS_PP)};
    assert_int_equal(refused((const char *[]){"parallelism.strategies=/x/pp.so", NULL}, pp,
                             "says it serves mesh axis 0, which no strategy may serve"),
                     CT_ERR_INVALID);
    ct_strategy_api wrong[] = {said(CT_SERVES_DATA_PARALLEL, 0)}; /* the tp key's plugin serves data parallel */
    assert_int_equal(refused((const char *[]){"parallelism.tp_strategy=fsdp", "parallelism.strategies=fsdp", NULL}, wrong,
                             "strategy 'fsdp' serves data parallel, not the tp axis"),
                     CT_ERR_INVALID);
    assert_int_equal(refused((const char *[]){"parallelism.strategies=tp,dp", "parallelism.cp_strategy=ring", NULL},
                             NULL, "--parallelism.cp_strategy: 'ring' is not an item of parallelism.strategies"),
                     CT_ERR_INVALID);
    assert_int_equal(refused((const char *[]){"parallelism.strategies=tp", "parallelism.dp_strategy=ddp", NULL}, NULL,
                             "--parallelism.dp_strategy: 'ddp' is not an item of parallelism.strategies"),
                     CT_ERR_INVALID);
    assert_int_equal(refused((const char *[]){"parallelism.strategies=tp,tp", NULL}, NULL, "'tp' is listed twice"),
                     CT_ERR_INVALID);
    assert_int_equal(refused((const char *[]){"parallelism.strategies=tp,", NULL}, NULL, "an empty item in 'tp,'"),
                     CT_ERR_INVALID);
    assert_int_equal(refused((const char *[]){"parallelism.strategies=tp,dp", NULL}, NULL, ""), CT_OK);
}

static void test_an_axis_of_degree_above_1_needs_a_strategy(void **state) {
    (void)state;
    strategy_list l;
    ct_mesh_info mesh;
    memset(&mesh, 0, sizeof mesh);
    mesh.struct_size = sizeof mesh;
    for (int a = 0; a < CT_MESH_NAXES; a++) mesh.degree[a] = 1;
    mesh.degree[CT_AXIS_CP] = 2;
    manifest *m = fixture_overrides((const char *[]){"parallelism.strategies=tp", NULL});
    assert_int_equal(list_read(m, 2, 1, &l), CT_OK);
    assert_int_equal(strategy_list_cover(m, &l, &mesh), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "no strategy serves the cp axis, whose degree "
                                            "(parallelism.context_parallel_degree) is 2"));
    mesh.degree[CT_AXIS_CP] = 1;
    assert_int_equal(strategy_list_cover(m, &l, &mesh), CT_OK);
    assert_int_equal(strategy_on_mesh(&l.item[0], &mesh), 0); /* tp of degree 1: not created */
    mesh.degree[CT_AXIS_DP_SHARD] = 2; /* two data-parallel ranks and no data-parallel strategy */
    assert_int_equal(strategy_list_cover(m, &l, &mesh), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "no data-parallel strategy, and the job has 2 data-parallel ranks"));
    manifest_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_is_torchtitans_order_from_the_keys),
        cmocka_unit_test(test_the_list_gives_the_order),
        cmocka_unit_test(test_a_plugin_before_2_22_takes_its_keys_role),
        cmocka_unit_test(test_impossible_lists_are_refused_naming_the_key),
        cmocka_unit_test(test_an_axis_of_degree_above_1_needs_a_strategy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
