/* test_core_config.c: the manifest (nesting, overrides, nulls, types), torchtitan's LR schedule,
 * and the data loader (windows, shuffling, layout-independent global batches). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/data.h"
#include "engine/lr.h"
#include "config/manifest.h"
#include "host/host.h"
#include "base/error.h"
#include "data/shard.h"
#include "manifest_fixture.h"

/* manifest_load's error for a YAML text (the manifest must be refused). */
static void load_error(const char *yaml, char *err, size_t errlen) {
    char path[FIXTURE_PATH_LEN];
    fixture_write(yaml, path);
    manifest *m = manifest_load(path);
    snprintf(err, errlen, "%s", ct_last_error());
    unlink(path);
    if (m) fail_msg("accepted: %s", yaml);
}

static void test_overrides_last_wins_and_unset_keys_take_defaults(void **state) {
    (void)state;
    manifest *m = fixture_yaml("training:\n  steps: 5\n  seq_len: 64\nlr_scheduler: {decay_type: sqrt}\n");
    assert_int_equal(manifest_override(m, "training.steps", "7"), 0);
    assert_int_equal(manifest_override(m, "training.steps", "9"), 0);
    assert_int_equal(manifest_validate(m), 0);
    int64_t v;
    double f;
    assert_int_equal(mf_get_int(m, "training.steps", &v), 0);
    assert_int_equal(v, 9);
    assert_int_equal(mf_get_int(m, "training.seq_len", &v), 0);
    assert_int_equal(v, 64);
    assert_int_equal(mf_get_int(m, "lr_scheduler.warmup_steps", &v), 0); /* not given -> default 200 */
    assert_int_equal(v, 200);
    assert_int_equal(mf_get_float(m, "lr_scheduler.decay_ratio", &f), -1); /* no default: unset */
    char where[256];
    mf_where(m, "training.steps", where, sizeof where);
    assert_string_equal(where, "command line: --training.steps");
    mf_where(m, "training.seq_len", where, sizeof where);
    assert_non_null(strstr(where, ":3: training.seq_len"));
    manifest_free(m);
}

static void test_duplicate_keys_and_lists_are_errors(void **state) {
    (void)state;
    char path[] = "/tmp/ctitan-cfg-XXXXXX.yaml";
    int fd = mkstemps(path, 5);
    const char *y = "training:\n  steps: 1\n  steps: 2\n";
    assert_int_equal(write(fd, y, strlen(y)), (int)strlen(y));
    close(fd);
    assert_null(manifest_load(path));
    unlink(path);
    assert_non_null(strstr(ct_last_error(), ":3: training.steps: duplicate key"));
    manifest *m = fixture_yaml("training:\n  steps: [1, 2]\n");
    assert_int_equal(manifest_validate(m), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "expected an integer"));
    manifest_free(m);
}

/* An explicit null is refused naming the key, never the default in disguise; so are a second
 * document and a TOML file. */
static void test_nulls_and_second_documents_are_refused(void **state) {
    (void)state;
    char err[1024];
    load_error("training:\n  seq_len: 64\n  steps: ~\n", err, sizeof err);
    assert_non_null(strstr(err, ":3: training.steps: no value"));
    load_error("lr_scheduler: {decay_ratio: null}\n", err, sizeof err);
    assert_non_null(strstr(err, ":1: lr_scheduler.decay_ratio: no value"));
    load_error("training:\n  steps:\n  seq_len: 64\n", err, sizeof err);
    assert_non_null(strstr(err, ":2: training.steps: no value"));
    load_error("training: {steps: 1}\n---\ntraining: {steps: 2}\n", err, sizeof err);
    assert_non_null(strstr(err, ":2: a second YAML document"));
    manifest *m = fixture_yaml("generate: {prompt: \"\"}\n"); /* an empty string is a value */
    assert_int_equal(manifest_validate(m), 0);
    manifest_free(m);
}

/* A manifest in a file named *.toml (mkstemps keeps the suffix). NULL with err set when refused. */
static manifest *load_toml(const char *toml, char *err, size_t errlen) {
    char path[] = "/tmp/ctitan-cfg-XXXXXX.toml";
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, toml, strlen(toml)), (int)strlen(toml));
    close(fd);
    manifest *m = manifest_load(path);
    if (!m) snprintf(err, errlen, "%s", ct_last_error());
    unlink(path);
    if (m) manifest_add_core_schema(m);
    return m;
}

/* torchtitan's TOML (through toml++) gives the keys, values and lines YAML would: tables nest into
 * dotted keys, arrays become lists, arrays of tables lists of maps, and the usual checks apply. */
static void test_toml_reads_as_yaml_would(void **state) {
    (void)state;
    char err[1024];
    const char *v;
    int64_t iv;
    double fv;
    int bv;
    manifest *m = load_toml("# torchtitan\n[job]\ndump_folder = \"./out\"\n\n[optimizer]\nlr = 3e-4\n"
                            "[training]\nsteps = 10\nseq_len = 2048\n[checkpoint]\nenable = true\n"
                            "[quantize.linear.float8]\nfilter_fqns = [\"output\", \"wo\"]\n"
                            "[[training.dataset]]\npath = \"a.bin\"\nweight = 3\n[[training.dataset]]\npath = \"b.bin\"\n",
                            err, sizeof err);
    if (!m) fail_msg("%s", err);
    assert_int_equal(manifest_validate(m), 0);
    assert_int_equal(mf_get_str(m, "job.dump_folder", &v), 0);
    assert_string_equal(v, "./out");
    assert_int_equal(mf_get_float(m, "optimizer.lr", &fv), 0);
    assert_true(fv == 3e-4);
    assert_int_equal(mf_get_int(m, "training.steps", &iv), 0);
    assert_int_equal(iv, 10);
    assert_int_equal(mf_get_bool(m, "checkpoint.enable", &bv), 0);
    assert_int_equal(bv, 1);
    assert_int_equal(mf_get_str(m, "quantize.linear.float8.filter_fqns", &v), 0);
    assert_string_equal(v, "output,wo");
    assert_int_equal(mf_list_len(m, "training.dataset"), 2);
    assert_int_equal(mf_get_str(m, "training.dataset[1].path", &v), 0);
    assert_string_equal(v, "b.bin");
    mf_where(m, "training.steps", err, sizeof err);
    assert_non_null(strstr(err, ".toml:8: training.steps"));
    manifest_free(m);

    assert_null(load_toml("[training]\nsteps = 10\nsteps = 11\n", err, sizeof err));
    assert_non_null(strstr(err, ".toml:3:9: TOML syntax error")); /* toml++ refuses the redefinition */
    assert_null(load_toml("[training]\nsteps = \n", err, sizeof err));
    assert_non_null(strstr(err, ".toml:2:"));
    assert_null(load_toml("[training]\nsteps = 1979-05-27\n", err, sizeof err));
    assert_non_null(strstr(err, ".toml:2: training.steps: a date or time"));
    assert_null(load_toml("[training]\n\"a.b\" = 1\n", err, sizeof err));
    assert_non_null(strstr(err, ".toml:2: training.a.b: keys are plain names"));
    m = load_toml("[training]\nsteps = \"ten\"\n", err, sizeof err);
    assert_non_null(m);
    assert_int_equal(manifest_validate(m), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), ".toml:2: training.steps: expected an integer, got 'ten'"));
    manifest_free(m);
    /* TOML text in a file of another name is read as TOML when it is no YAML */
    m = fixture_yaml("[job]\ndump_folder = \"./outputs\"\n[training]\nsteps = 10\n");
    assert_int_equal(mf_get_int(m, "training.steps", &iv), 0);
    assert_int_equal(iv, 10);
    manifest_free(m);
}

/* torchtitan's command-line spellings: tyro's dashes and negations, bare flags checked by validation. */
static void test_bare_flags_and_negations(void **state) {
    (void)state;
    char key[MF_MAX_KEY_LEN + 1];
    const char *value;
    int neg, bv;
    static const struct {
        const char *arg, *key, *value;
        int negated;
    } cases[] = {
        {"--checkpoint.enable", "checkpoint.enable", NULL, 0},
        {"--no-checkpoint.enable", "checkpoint.enable", NULL, 1},
        {"--checkpoint.no-enable", "checkpoint.enable", NULL, 1},
        {"--checkpoint.no_enable", "checkpoint.enable", NULL, 1},
        {"--training.local-batch-size=4", "training.local_batch_size", "4", 0},
        {"--checkpoint.enable=false", "checkpoint.enable", "false", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(manifest_cli_key(cases[i].arg, key, sizeof key, &value, &neg), 0);
        assert_string_equal(key, cases[i].key);
        if (cases[i].value) assert_string_equal(value, cases[i].value);
        else assert_null(value);
        assert_int_equal(neg, cases[i].negated);
    }
    assert_int_equal(manifest_cli_key("--no-checkpoint.enable=true", key, sizeof key, &value, &neg), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "takes no value"));

    manifest *m = fixture_yaml("checkpoint: {enable: false}\n");
    assert_int_equal(manifest_override_flag(m, "checkpoint.enable", MF_FLAG_BARE), 0);
    assert_int_equal(manifest_validate(m), 0);
    assert_int_equal(mf_get_bool(m, "checkpoint.enable", &bv), 0);
    assert_int_equal(bv, 1);
    assert_int_equal(manifest_override_flag(m, "checkpoint.enable", MF_FLAG_NEGATED), 0);
    assert_int_equal(mf_get_bool(m, "checkpoint.enable", &bv), 0);
    assert_int_equal(bv, 0);
    assert_int_equal(manifest_override_flag(m, "training.steps", MF_FLAG_BARE), 0);
    assert_int_equal(manifest_validate(m), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "command line: --training.steps: needs a value"));
    manifest_free(m);
}

/* Each limit on a manifest refuses it with the limit named, fast (the texts expand to billions of
 * nodes, or nest 100,000 deep, if read without limits). */
static void test_limits_refuse_bombs_depth_and_key_counts(void **state) {
    (void)state;
    char err[1024], yaml[4096];
    size_t n = (size_t)snprintf(yaml, sizeof yaml, "s:\n  a0: &a0 {}\n");
    for (int i = 1; i < 10; i++) {
        n += (size_t)snprintf(yaml + n, sizeof yaml - n, "  a%d: &a%d {", i, i);
        for (int j = 0; j < 9; j++) n += (size_t)snprintf(yaml + n, sizeof yaml - n, "%sk%d: *a%d", j ? ", " : "", j, i - 1);
        n += (size_t)snprintf(yaml + n, sizeof yaml - n, "}\n");
    }
    load_error(yaml, err, sizeof err);
    assert_non_null(strstr(err, "expands to more than"));
    load_error("x: &a {b: *a}\n", err, sizeof err); /* a map holding an alias of itself */
    assert_non_null(strstr(err, "nested deeper than 64"));
    size_t deep = 100000;
    char *big = malloc(4 * deep + 16);
    strcpy(big, "x: ");
    for (size_t i = 0; i < deep; i++) strcat(big + 3 + 4 * i, "{a: ");
    load_error(big, err, sizeof err);
    assert_non_null(strstr(err, ":1: maps and lists nested deeper than 64 levels"));
    free(big);
    size_t keys = MF_MAX_KEYS + 10;
    big = malloc(16 * keys + 16);
    n = (size_t)sprintf(big, "training:\n");
    for (size_t i = 0; i < keys; i++) n += (size_t)sprintf(big + n, "  k%zu: 1\n", i);
    load_error(big, err, sizeof err);
    assert_non_null(strstr(err, "more than 65536 keys"));
    free(big);
    load_error("training:\n  k: 1\n  j: 2\n  k: 3\n", err, sizeof err); /* duplicates, found by hash */
    assert_non_null(strstr(err, ":4: training.k: duplicate key"));
}

/* validate's message for one override on an otherwise empty manifest ("" when valid). */
static const char *override_error(const char *key, const char *value) {
    static char err[1024];
    manifest *m = fixture_yaml("job: {description: x}\n");
    /* the dense quantizer's keys are its plugin's (a run adds them whether or not it creates it) */
    plugin *q = plugin_load("float8", CT_KIND_QUANTIZER, "quantize.dense.float8", m);
    if (!q) fail_msg("%s", ct_last_error());
    manifest_add_plugin_schema(m, "quantize.dense.float8", q->info.options);
    plugin_unload(q);
    assert_int_equal(manifest_override(m, key, value), CT_OK);
    err[0] = 0;
    if (manifest_validate(m) != CT_OK) snprintf(err, sizeof err, "%s", ct_last_error());
    manifest_free(m);
    return err;
}

/* Bounds and choices hold for every value, whether or not its feature is on. */
static void test_ranges_and_choices_name_the_key(void **state) {
    (void)state;
    static const struct {
        const char *key, *value, *want; /* want: a piece of the error, NULL: accepted */
    } cases[] = {
        {"optimizer.lr", "-1", "optimizer.lr: expected a number in [0, 1000], got '-1'"},
        {"optimizer.lr", "1e308", "optimizer.lr: expected a number in [0, 1000]"},
        {"optimizer.lr", "3e-4", NULL},
        {"training.steps", "0", "training.steps: expected an integer in [1, 1e12], got '0'"},
        {"training.local_batch_size", "1000000000", "training.local_batch_size: expected an integer in"},
        {"training.local_batch_size", "65536", "training.local_batch_size: 65536 sequences of seq_len 2048"},
        {"training.global_batch_size", "1000000", "training.global_batch_size: 1000000 sequences"},
        {"training.global_batch_size", "-1", NULL},
        {"training.seq_len", "0", "training.seq_len: expected an integer in [1, 1048576]"},
        {"generate.temperature", "-1", "generate.temperature: expected a number in [0, 100]"},
        {"generate.top_k", "-1", "generate.top_k: expected an integer in"},
        {"generate.top_p", "0", "generate.top_p: expected a number in (0, 1]"},
        {"generate.top_p", "1", NULL},
        {"generate.max_new_tokens", "4611686018427387891", "generate.max_new_tokens: expected an integer in [0, 1048576]"},
        {"generate.max_new_tokens", "-1", "generate.max_new_tokens"},
        {"lr_scheduler.decay_type", "exp", "lr_scheduler.decay_type: expected linear, sqrt or cosine, got 'exp'"},
        {"activation_checkpoint.mode", "partial", "expected none, full or selective"},
        {"checkpoint.async_mode", "sync", "expected disabled or async"},
        {"quantize.dense.float8.format", "mxpf8", "quantize.dense.float8.format: expected tensorwise, rowwise"},
        {"quantize.dense.float8.format", "mxfp8_cublas", NULL},
        {"parallelism.tensor_parallel_degree", "0", "tensor_parallel_degree: expected an integer in [1, 1048576]"},
        {"parallelism.data_parallel_shard_degree", "-1", NULL},
        {"parallelism.data_parallel_shard_degree", "-2", "data_parallel_shard_degree: expected an integer in [-1,"},
        {"parallelism.pipeline_parallel_degree", "99999999999", "pipeline_parallel_degree: expected an integer in"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *err = override_error(cases[i].key, cases[i].value);
        if (cases[i].want ? !strstr(err, cases[i].want) : err[0] != 0)
            fail_msg("--%s=%s: got \"%s\", wanted \"%s\"", cases[i].key, cases[i].value, err,
                     cases[i].want ? cases[i].want : "");
    }
}

/* A plugin's option list may be unloaded right after its options join the schema (a plugin a run
 * names but does not create): the schema keeps its own copies of the key, help, range and choices. */
static void test_plugin_options_outlive_the_plugin(void **state) {
    (void)state;
    char key[32] = "probe_level", help[32] = "a level", range[32] = "[0, 3]", choices[32] = "a|b";
    char skey[32] = "probe_mode";
    ct_option_spec opts[3] = {
        {sizeof(ct_option_spec), key, CT_OPT_INT, "1", help, range, NULL},
        {sizeof(ct_option_spec), skey, CT_OPT_STRING, "a", help, NULL, choices},
        {0},
    };
    manifest *m = fixture_yaml("parallelism: {probe_level: 4}\n");
    manifest_add_plugin_schema(m, "parallelism", opts);
    memset(key, 'x', sizeof key - 1); /* the plugin's strings are gone */
    memset(skey, 'x', sizeof skey - 1);
    memset(range, 0, sizeof range);
    memset(choices, 0, sizeof choices);
    assert_int_equal(manifest_validate(m), CT_ERR_INVALID);
    if (!strstr(ct_last_error(), "parallelism.probe_level: expected an integer in [0, 3], got '4'"))
        fail_msg("got \"%s\"", ct_last_error());
    assert_int_equal(manifest_override(m, "parallelism.probe_level", "3"), 0);
    assert_int_equal(manifest_override(m, "parallelism.probe_mode", "c"), 0);
    assert_int_equal(manifest_validate(m), CT_ERR_INVALID);
    if (!strstr(ct_last_error(), "parallelism.probe_mode: expected a or b, got 'c'"))
        fail_msg("got \"%s\"", ct_last_error());
    manifest_free(m);
}

static lr_schedule schedule(const char *yaml, int64_t steps) {
    manifest *m = fixture_yaml(yaml);
    assert_int_equal(manifest_validate(m), 0);
    lr_schedule s;
    engine_settings es;
    engine_settings_read(m, &es);
    assert_int_equal(lr_setup(&es.lr, m, steps, &s), CT_OK);
    /* s.type points into the manifest, freed below: keep a literal instead */
    s.type = strcmp(s.type, "cosine") == 0 ? "cosine" : strcmp(s.type, "sqrt") == 0 ? "sqrt" : "linear";
    manifest_free(m);
    return s;
}

/* Expected values worked out from torchtitan's linear_warmup_stable_decay (0-based step c):
 * warmup: (c+1)/(warmup+1); decay: progress = (c+1 - warmup - stable)/(decay+1). */
static void test_lr_schedule_is_torchtitans(void **state) {
    (void)state;
    lr_schedule s = schedule("optimizer: {lr: 1.0}\nlr_scheduler: {warmup_steps: 2}\n", 10);
    assert_true(fabs(lr_at(&s, 1) - 1.0 / 3) < 1e-12);
    assert_true(fabs(lr_at(&s, 2) - 2.0 / 3) < 1e-12);
    assert_true(fabs(lr_at(&s, 3) - (1 - 1.0 / 9)) < 1e-12); /* decay 8 steps, progress 1/9 */
    assert_true(fabs(lr_at(&s, 10) - (1 - 8.0 / 9)) < 1e-12);
    s = schedule("optimizer: {lr: 2.0}\nlr_scheduler: {warmup_steps: 2, decay_ratio: 0.5, decay_type: cosine, "
                 "min_lr_factor: 0.1}\n",
                 10);
    assert_int_equal(s.warmup, 2);
    assert_int_equal(s.stable, 3);
    assert_int_equal(s.decay, 5);
    assert_true(fabs(lr_at(&s, 3) - 2.0) < 1e-12); /* stable */
    assert_true(fabs(lr_at(&s, 5) - 2.0) < 1e-12);
    double adj = 0.1 + 0.9 * 0.5 * (1 + cos(M_PI * 1.0 / 6)); /* step 6: progress 1/6 */
    assert_true(fabs(lr_at(&s, 6) - 2.0 * adj) < 1e-12);
    s = schedule("optimizer: {lr: 1.0}\nlr_scheduler: {warmup_steps: 0, decay_type: sqrt}\n", 4);
    assert_true(fabs(lr_at(&s, 1) - (1 - sqrt(1.0 / 5))) < 1e-12);
}

static void make_shard(const char *path, uint32_t n) {
    uint32_t *t = malloc(sizeof(uint32_t) * n);
    for (uint32_t i = 0; i < n; i++) t[i] = i;
    assert_int_equal(shard_write(path, t, n), CT_OK);
    free(t);
}

static void test_dataloader_windows_shuffle_and_layouts(void **state) {
    (void)state;
    char path[] = "/tmp/ctitan-shard-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    make_shard(path, 4 * 50 + 1); /* 50 windows of 4 + 1 */
    dataloader dl, dl2;
    assert_int_equal(dataloader_open(&dl, path, 4, 11, 1000), CT_OK);
    assert_int_equal(dl.n_windows, 50);
    int seen[50] = {0};
    int32_t in[4], tg[4];
    for (int s = 0; s < 50; s++) { /* one epoch: every window once, targets shifted by one */
        assert_int_equal(dataloader_sequence(&dl, s, in, tg), CT_OK);
        assert_int_equal(in[0] % 4, 0);
        for (int i = 0; i < 4; i++) assert_int_equal(tg[i], in[i] + 1);
        seen[in[0] / 4]++;
    }
    for (int w = 0; w < 50; w++) assert_int_equal(seen[w], 1);
    /* the same seed gives the same order; another seed, another order; epochs differ */
    assert_int_equal(dataloader_open(&dl2, path, 4, 11, 1000), CT_OK);
    int32_t in2[4], tg2[4], differ_epoch = 0;
    for (int s = 0; s < 120; s++) {
        dataloader_sequence(&dl, s, in, tg);
        dataloader_sequence(&dl2, s, in2, tg2);
        assert_memory_equal(in, in2, sizeof in);
    }
    for (int s = 0; s < 50; s++) {
        dataloader_sequence(&dl, s, in, tg);
        dataloader_sequence(&dl2, s + 50, in2, tg2);
        differ_epoch |= in[0] != in2[0];
    }
    assert_true(differ_epoch);
    dataloader_close(&dl2);
    assert_int_equal(dataloader_open(&dl2, path, 4, 12, 1000), CT_OK);
    int differ_seed = 0;
    for (int s = 0; s < 50; s++) {
        dataloader_sequence(&dl, s, in, tg);
        dataloader_sequence(&dl2, s, in2, tg2);
        differ_seed |= in[0] != in2[0];
    }
    assert_true(differ_seed);
    dataloader_close(&dl2);
    /* a step's global batch is the same whatever the data-parallel degree */
    const int64_t G = 8;
    for (int64_t step = 1; step <= 3; step++) {
        int64_t ref[8], got[8];
        for (int64_t i = 0; i < G; i++) ref[i] = dataloader_global_index((step - 1) * G, G, 0, 1, i);
        for (int64_t dp = 2; dp <= 8; dp *= 2) {
            int64_t k = 0;
            for (int64_t r = 0; r < dp; r++)
                for (int64_t i = 0; i < G / dp; i++) got[k++] = dataloader_global_index((step - 1) * G, G, r, dp, i);
            assert_memory_equal(ref, got, sizeof ref);
        }
    }
    /* tokens outside the vocabulary are refused */
    dataloader_close(&dl);
    assert_int_equal(dataloader_open(&dl, path, 4, 11, 100), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "outside the model's vocabulary"));
    unlink(path);
}

/* A list of maps: item keys under key[N]., typed and checked by the schema's key[].field; an override
 * of the key replaces the whole list, one of an item key changes that item; print shows the list. */
static void test_lists_of_maps(void **state) {
    (void)state;
    char err[1024];
    manifest *m = fixture_yaml("training:\n  dataset:\n    - path: a.bin\n      weight: 3\n    - {path: b.bin}\n");
    assert_int_equal(manifest_validate(m), 0);
    assert_int_equal(mf_list_len(m, "training.dataset"), 2);
    const char *p;
    double w;
    assert_int_equal(mf_get_str(m, "training.dataset[1].path", &p), 0);
    assert_string_equal(p, "b.bin");
    assert_int_equal(mf_get_float(m, "training.dataset[0].weight", &w), 0);
    assert_true(w == 3.0);
    assert_int_equal(mf_get_float(m, "training.dataset[1].weight", &w), 0); /* the default */
    assert_true(w == 1.0);
    mf_where(m, "training.dataset[0].weight", err, sizeof err);
    assert_non_null(strstr(err, ":4: training.dataset[0].weight"));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    manifest_print(m, f);
    fclose(f);
    assert_non_null(strstr(buf, "  dataset:\n    - path: \"a.bin\"\n      weight: 3\n    - path: \"b.bin\"\n"));
    assert_null(strstr(buf, "[]"));
    free(buf);
    /* an item past the list; then the whole list replaced by one path */
    assert_int_equal(manifest_override(m, "training.dataset[1].weight", "2"), 0);
    assert_int_equal(manifest_validate(m), 0);
    assert_int_equal(manifest_override(m, "training.dataset[2].weight", "2"), 0);
    assert_int_equal(manifest_validate(m), CT_ERR_INVALID);
    assert_non_null(
        strstr(ct_last_error(), "command line: --training.dataset[2].weight: training.dataset has 2 items (0 to 1)"));
    {
        manifest *z = fixture_yaml("training:\n  dataset: [{path: a.bin}, {path: b.bin}]\n");
        assert_int_equal(manifest_override(z, "training.dataset[01].weight", "2"), 0);
        assert_int_equal(manifest_validate(z), CT_ERR_INVALID);
        assert_non_null(strstr(ct_last_error(), "--training.dataset[01].weight: item index with a leading zero"));
        manifest_free(z);
    }
    assert_int_equal(manifest_override(m, "training.dataset", "c.bin"), 0);
    assert_int_equal(mf_list_len(m, "training.dataset"), -1);
    assert_int_equal(mf_get_str(m, "training.dataset[0].path", &p), -1); /* the items went with the list */
    assert_int_equal(manifest_validate(m), 0);
    manifest_free(m);
    /* a weight out of range names its line; a list of maps where none is declared is refused */
    m = fixture_yaml("training:\n  dataset:\n    - {path: a.bin}\n    - path: b.bin\n      weight: 0\n");
    assert_int_equal(manifest_validate(m), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), ":5: training.dataset[1].weight: expected a number in (0, 1e12], got '0'"));
    manifest_free(m);
    m = fixture_yaml("training:\n  seq_len: [{a: 1}]\n");
    assert_int_equal(manifest_validate(m), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "training.seq_len[0].a: unknown key"));
    manifest_free(m);
}

/* A shard of n tokens base, base + 1, ...: each source's windows are told apart by their tokens. */
static void make_shard_from(const char *path, uint32_t n, uint32_t base) {
    uint32_t *t = malloc(sizeof(uint32_t) * n);
    for (uint32_t i = 0; i < n; i++) t[i] = base + i;
    assert_int_equal(shard_write(path, t, n), CT_OK);
    free(t);
}

/* Two sources at weights 3 : 1: every period of 1000 sequences holds exactly 750 and 250, each
 * source's stream visits every window of it once per its own epoch, the sources and windows follow
 * from the sequence number alone (read backwards: the same), and the seed picks the order. */
static void test_dataloader_mixture_is_exact_per_period(void **state) {
    (void)state;
    char a[] = "/tmp/ctitan-shard-XXXXXX", b[] = "/tmp/ctitan-shard-XXXXXX";
    close(mkstemp(a));
    close(mkstemp(b));
    make_shard_from(a, 4 * 50 + 1, 0);   /* 50 windows, tokens 0..200 */
    make_shard_from(b, 4 * 30 + 1, 500); /* 30 windows, tokens 500..620 */
    dataloader dl, back;
    for (int k = 0; k < 2; k++) {
        dataloader *d = k ? &back : &dl;
        dataloader_init(d, 4, 7, 0);
        assert_int_equal(dataloader_add(d, a, 3.0, 1000), CT_OK);
        assert_int_equal(dataloader_add(d, b, 1.0, 1000), CT_OK);
        assert_int_equal(dataloader_mix(d), CT_OK);
    }
    assert_int_equal(dl.period, 1000);
    assert_int_equal(dl.src[0].count, 750);
    assert_int_equal(dl.src[1].count, 250);
    enum { N = 3000 };
    static int32_t first[N];
    int32_t in[4], tg[4];
    int per[3][2] = {{0}};
    static int stream[2][N], n_stream[2];
    for (int s = 0; s < N; s++) {
        assert_int_equal(dataloader_sequence(&dl, s, in, tg), CT_OK);
        int src = in[0] >= 500;
        assert_int_equal(dataloader_source_of(&dl, s), src);
        for (int i = 0; i < 4; i++) assert_int_equal(tg[i], in[i] + 1);
        per[s / 1000][src]++;
        first[s] = in[0];
        stream[src][n_stream[src]++] = (in[0] - (src ? 500 : 0)) / 4;
    }
    for (int p = 0; p < 3; p++) {
        assert_int_equal(per[p][0], 750);
        assert_int_equal(per[p][1], 250);
    }
    int nw[2] = {50, 30};
    for (int src = 0; src < 2; src++) /* every full epoch of a source is a permutation of its windows */
        for (int e = 0; (e + 1) * nw[src] <= n_stream[src]; e++) {
            int seen[50] = {0};
            for (int k = 0; k < nw[src]; k++) seen[stream[src][e * nw[src] + k]]++;
            for (int w = 0; w < nw[src]; w++) assert_int_equal(seen[w], 1);
        }
    for (int s = N - 1; s >= 0; s--) { /* random access: the number alone decides */
        dataloader_sequence(&back, s, in, tg);
        assert_int_equal(in[0], first[s]);
    }
    dataloader_close(&back);
    /* another seed: another order, the same counts */
    dataloader_init(&back, 4, 8, 0);
    assert_int_equal(dataloader_add(&back, a, 3.0, 1000), CT_OK);
    assert_int_equal(dataloader_add(&back, b, 1.0, 1000), CT_OK);
    assert_int_equal(dataloader_mix(&back), CT_OK);
    int differ = 0;
    for (int s = 0; s < 1000; s++) {
        dataloader_sequence(&back, s, in, tg);
        differ |= in[0] != first[s];
    }
    assert_true(differ);
    dataloader_close(&back);
    dataloader_close(&dl);
    /* a tiny share widens the period so it still gets a sequence; a far tinier one is refused */
    dataloader_init(&dl, 4, 7, 0);
    assert_int_equal(dataloader_add(&dl, a, 1.0, 1000), CT_OK);
    assert_int_equal(dataloader_add(&dl, b, 1e-5, 1000), CT_OK);
    assert_int_equal(dataloader_mix(&dl), CT_OK);
    assert_int_equal(dl.period, 101000);
    assert_int_equal(dl.src[1].count, 1);
    dataloader_close(&dl);
    dataloader_init(&dl, 4, 7, 0);
    assert_int_equal(dataloader_add(&dl, a, 1.0, 1000), CT_OK);
    assert_int_equal(dataloader_add(&dl, b, 1e-9, 1000), CT_OK);
    assert_int_equal(dataloader_mix(&dl), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "expected weights within a factor of"));
    dataloader_close(&dl);
    /* bad weights; an ordered loader: windows in order, source after source, then padding */
    dataloader_init(&dl, 4, 7, 1);
    assert_int_equal(dataloader_add(&dl, a, 0.0, 1000), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "expected a finite number > 0"));
    assert_int_equal(dataloader_add(&dl, a, INFINITY, 1000), CT_ERR_INVALID);
    assert_int_equal(dataloader_add(&dl, a, 1.0, 1000), CT_OK);
    assert_int_equal(dataloader_add(&dl, b, 1.0, 1000), CT_OK);
    assert_int_equal(dl.n_windows, 80);
    for (int s = 0; s < 82; s++) {
        dataloader_sequence(&dl, s, in, tg);
        if (s < 50) assert_int_equal(in[0], 4 * s);
        else if (s < 80) assert_int_equal(in[0], 500 + 4 * (s - 50));
        else assert_int_equal(tg[3], -100); /* CT_IGNORE_INDEX: padding past the end */
    }
    dataloader_close(&dl);
    unlink(a);
    unlink(b);
}

/* Documents for block-causal attention: a version 4 shard's recorded starts, whatever EOS tokens its
 * documents hold (ChatML's turns end in Qwen's EOS); a version 2 shard's, after each EOS. A target that
 * starts a document is ignored; the flags never reach the ids. One source is all version 4 or none. */
static void test_dataloader_document_starts(void **state) {
    (void)state;
    enum { EOS = 2, M = SHARD_MASKED, S = SHARD_DOC_START };
    /* two conversations in a window of 8: [5 EOS 6 EOS] [7 EOS 9 EOS], then a masked final EOS */
    uint32_t words[9] = {5 | M | S, EOS | M, 6, EOS, 7 | M | S, EOS | M, 9, EOS, EOS | M};
    char a[] = "/tmp/ctitan-docs-XXXXXX", b[] = "/tmp/ctitan-docs-XXXXXX";
    close(mkstemp(a));
    close(mkstemp(b));
    shard_writer *w = shard_writer_open_docs(a);
    assert_int_equal(shard_writer_append(w, words, 9), CT_OK);
    assert_int_equal(shard_writer_close(w), CT_OK);
    dataloader dl;
    assert_int_equal(dataloader_open(&dl, a, 8, 1, 100), CT_OK);
    assert_int_equal(dl.docs, 1);
    int32_t in[8], tg[8];
    uint8_t st[8];
    assert_int_equal(dataloader_sequence_docs(&dl, 0, in, tg, st, EOS), CT_OK);
    const int32_t want_in[8] = {5, EOS, 6, EOS, 7, EOS, 9, EOS}, want_tg[8] = {-100, 6, EOS, -100, -100, 9, EOS, -100};
    const uint8_t want_st[8] = {1, 0, 0, 0, 1, 0, 0, 0};
    assert_memory_equal(in, want_in, sizeof in);
    assert_memory_equal(tg, want_tg, sizeof tg);
    assert_memory_equal(st, want_st, sizeof st);
    /* without starts asked: the ids stripped of both flags, the masks as before */
    assert_int_equal(dataloader_sequence(&dl, 0, in, tg), CT_OK);
    assert_memory_equal(in, want_in, sizeof in);
    assert_memory_equal(tg, want_tg, sizeof tg); /* the starts are masked in the shard too */
    dataloader_close(&dl);
    /* version 2, the same ids: a document after each EOS, and the target after an EOS ignored */
    uint32_t plain[9];
    for (int i = 0; i < 9; i++) plain[i] = words[i] & SHARD_DOC_ID_MASK;
    assert_int_equal(shard_write(b, plain, 9), CT_OK);
    assert_int_equal(dataloader_open(&dl, b, 8, 1, 100), CT_OK);
    assert_int_equal(dl.docs, 0);
    assert_int_equal(dataloader_sequence_docs(&dl, 0, in, tg, st, EOS), CT_OK);
    const uint8_t eos_st[8] = {0, 0, 1, 0, 1, 0, 1, 0};
    const int32_t eos_tg[8] = {EOS, -100, EOS, -100, EOS, -100, EOS, -100};
    assert_memory_equal(st, eos_st, sizeof st);
    assert_memory_equal(tg, eos_tg, sizeof tg);
    dataloader_close(&dl);
    /* a folder with both kinds is refused, naming the shard */
    char dir[] = "/tmp/ctitan-docsdir-XXXXXX", p1[64], p2[64];
    assert_non_null(mkdtemp(dir));
    snprintf(p1, sizeof p1, "%s/a.bin", dir);
    snprintf(p2, sizeof p2, "%s/b.bin", dir);
    assert_int_equal(rename(a, p1), 0);
    assert_int_equal(rename(b, p2), 0);
    assert_int_equal(dataloader_open(&dl, dir, 8, 1, 100), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "b.bin is a version 2 shard, without document starts"));
    unlink(p1);
    unlink(p2);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dataloader_document_starts),
        cmocka_unit_test(test_overrides_last_wins_and_unset_keys_take_defaults),
        cmocka_unit_test(test_nulls_and_second_documents_are_refused),
        cmocka_unit_test(test_limits_refuse_bombs_depth_and_key_counts),
        cmocka_unit_test(test_ranges_and_choices_name_the_key),
        cmocka_unit_test(test_plugin_options_outlive_the_plugin),
        cmocka_unit_test(test_duplicate_keys_and_lists_are_errors),
        cmocka_unit_test(test_lr_schedule_is_torchtitans),
        cmocka_unit_test(test_dataloader_windows_shuffle_and_layouts),
        cmocka_unit_test(test_lists_of_maps),
        cmocka_unit_test(test_toml_reads_as_yaml_would),
        cmocka_unit_test(test_bare_flags_and_negations),
        cmocka_unit_test(test_dataloader_mixture_is_exact_per_period),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
