/* test_settings.c: the typed settings each folder reads once (engine/settings.c, train/settings.c,
 * checkpoint/settings.c), on manifests built from overrides: every field is the value the typed getter
 * gives for its key, the schema's default when the key is not given, and the fallbacks the readers
 * apply (validation's microbatch, generate's seed, a list's items) hold. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "checkpoint/settings.h"
#include "config/manifest.h"
#include "engine/settings.h"
#include "manifest_fixture.h"
#include "train/settings.h"

/* The fixture's manifests, validated. */
static manifest *with(const char *const *kv) {
    manifest *m = fixture_overrides(kv);
    if (manifest_validate(m) != CT_OK) fail_msg("%s", ct_last_error());
    return m;
}
static manifest *from_yaml(const char *yaml) {
    manifest *m = fixture_yaml(yaml);
    if (manifest_validate(m) != CT_OK) fail_msg("%s", ct_last_error());
    return m;
}

static int64_t int_of(const manifest *m, const char *key) {
    int64_t v;
    assert_int_equal(mf_get_int(m, key, &v), 0);
    return v;
}
static const char *str_of(const manifest *m, const char *key) {
    const char *v;
    assert_int_equal(mf_get_str(m, key, &v), 0);
    return v;
}

/* Nothing given: every field is its key's schema default. */
static void test_engine_defaults(void **state) {
    (void)state;
    const char *kv[] = {NULL};
    manifest *m = with(kv);
    engine_settings es;
    engine_settings_read(m, &es);
    assert_string_equal(es.device_name, str_of(m, "device.name"));
    assert_string_equal(es.model_name, str_of(m, "model.name"));
    assert_string_equal(es.flavor, str_of(m, "model.flavor"));
    assert_int_equal(es.seq_len, int_of(m, "training.seq_len"));
    assert_true(es.has_seq_len && es.has_seed);
    assert_string_equal(es.mixed_precision_param, str_of(m, "training.mixed_precision_param"));
    assert_string_equal(es.ac_mode, str_of(m, "activation_checkpoint.mode"));
    assert_string_equal(es.pp.schedule, str_of(m, "parallelism.pipeline_parallel_schedule"));
    assert_string_equal(es.pp.runner, str_of(m, "parallelism.pipeline_runner"));
    assert_null(es.pp.stage_units); /* empty: the split by weight */
    for (int a = 0; a < CT_MESH_NAXES; a++) {
        assert_true(es.mesh.has_degree[a]);
        assert_int_equal(es.mesh.degree[a], int_of(m, mesh_degree_keys[a]));
    }
    assert_null(es.strategies.list); /* not given: torchtitan's order */
    for (int e = 0; e < STRATEGY_N_KEYS; e++) assert_false(es.strategies.role_set[e]);
    assert_false(es.attn_mask_set);
    assert_false(es.lr.has_total_steps); /* training.steps then */
    assert_string_equal(es.lr.decay_type, str_of(m, "lr_scheduler.decay_type"));
    manifest_free(m);
}

/* Given values win, and a set key says so. */
static void test_engine_given(void **state) {
    (void)state;
    const char *kv[] = {"parallelism.pipeline_parallel_degree=2", "parallelism.pipeline_parallel_microbatch_size=2",
                        "training.local_batch_size=8", "parallelism.pipeline_parallel_stage_units=2,2",
                        "parallelism.tp_strategy=mytp", "parallelism.strategies=mytp,dp",
                        "lr_scheduler.decay_ratio=0.5", "model.attn_mask_type=block_causal",
                        "activation_offload.layers=3", NULL};
    manifest *m = with(kv);
    engine_settings es;
    engine_settings_read(m, &es);
    assert_int_equal(es.mesh.degree[CT_AXIS_PP], 2);
    assert_int_equal(es.pp.microbatch_size, 2);
    assert_int_equal(es.pp.local_batch_size, 8);
    assert_string_equal(es.pp.stage_units, "2,2");
    assert_true(es.strategies.role_set[STRATEGY_KEY_TP]);
    assert_string_equal(es.strategies.role[STRATEGY_KEY_TP], "mytp");
    assert_string_equal(es.strategies.list, "mytp,dp");
    assert_true(es.lr.has_decay_ratio);
    assert_true(es.lr.decay_ratio == 0.5);
    assert_true(es.attn_mask_set);
    assert_string_equal(es.attn_mask_type, "block_causal");
    assert_int_equal(es.offload_layers, 3);
    manifest_free(m);
}

/* validation.local_batch_size falls back to training's, generate.seed to training.seed; a dataset list's
 * items keep what each gives. */
static void test_train_fallbacks_and_lists(void **state) {
    (void)state;
    manifest *m = from_yaml("training:\n  local_batch_size: 4\n  seed: 7\n  dataset:\n    - {path: a.bin, weight: 3}\n"
                            "    - {path: b.bin}\nvalidation: {dataset: v.bin}\n");
    train_settings ts;
    assert_int_equal(train_settings_read(m, &ts), CT_OK);
    assert_int_equal(ts.local_batch_size, 4);
    assert_int_equal(ts.validation.local_batch_size, 4);
    assert_false(ts.validation.has_seq_len && ts.validation.seq_len != int_of(m, "validation.seq_len"));
    assert_int_equal(ts.generate.seed, 7);
    assert_int_equal(ts.data.n_items, 2);
    assert_true(ts.data.has && !ts.data.has_old);
    assert_string_equal(ts.data.items[0].path, "a.bin");
    assert_true(ts.data.items[0].has_weight && ts.data.items[0].weight == 3.0);
    assert_string_equal(ts.data.items[1].path, "b.bin");
    double w = 0; /* an item's weight not given: what the getter says (the schema may default it) */
    assert_int_equal(ts.data.items[1].has_weight, !mf_get_float(m, "training.dataset[1].weight", &w));
    assert_true(ts.data.items[1].weight == (ts.data.items[1].has_weight ? w : 1.0));
    assert_int_equal(ts.validation.data.n_items, -1);
    assert_string_equal(ts.validation.data.path, "v.bin");
    assert_string_equal(ts.dump_folder, str_of(m, "job.dump_folder"));
    assert_int_equal(ts.profiling.freq, int_of(m, "profiling.profile_freq"));
    train_settings_free(&ts);
    manifest_free(m);
}

/* The checkpoint section; a session without a manifest reads all off. */
static void test_checkpoint(void **state) {
    (void)state;
    const char *kv[] = {"checkpoint.enable=true", "checkpoint.interval=5", "checkpoint.initial_load_path=x", NULL};
    manifest *m = with(kv);
    ckpt_settings cs;
    ckpt_settings_read(m, &cs);
    assert_true(cs.enable);
    assert_int_equal(cs.interval, 5);
    assert_string_equal(cs.initial_load_path, "x");
    assert_int_equal(cs.load_step, int_of(m, "checkpoint.load_step"));
    assert_string_equal(cs.folder, str_of(m, "checkpoint.folder"));
    assert_int_equal(cs.steps, int_of(m, "training.steps"));
    manifest_free(m);
    ckpt_settings_read(NULL, &cs);
    assert_false(cs.enable || cs.allow_config_change);
    assert_null(cs.initial_load_path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_defaults),
        cmocka_unit_test(test_engine_given),
        cmocka_unit_test(test_train_fallbacks_and_lists),
        cmocka_unit_test(test_checkpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
