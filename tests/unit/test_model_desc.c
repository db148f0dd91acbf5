/* test_model_desc: a saved model's description (core/checkpoint/model_desc.c): what is accepted
 * as untrusted input, and how it fills and checks a manifest. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <unistd.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/model_desc.h"

static const char good[] =
    "{\"format\": \"ctitan-model\", \"version\": 1, \"name\": \"llama3\", \"flavor\": \"debugmodel\","
    " \"options\": {\"dim\": 64, \"n_heads\": 4, \"norm_eps\": 1e-05, \"rope_theta\": 500000.0,"
    " \"tie_word_embeddings\": false},"
    " \"model\": {\"dim\": 64, \"n_heads\": 4, \"n_kv_heads\": 2, \"rope_theta\": 500000.0, \"norm_eps\": 1e-05,"
    " \"hf_model_type\": \"llama\"}}";

static json_t *parse(const char *text) {
    json_error_t je;
    json_t *d = json_loads(text, 0, &je);
    if (!d) fail_msg("%s: %s", text, je.text);
    return d;
}

/* good with one substring replaced */
static json_t *edited(const char *from, const char *to) {
    const char *at = strstr(good, from);
    assert_non_null(at);
    char text[2048];
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at - good), good, to, at + strlen(from));
    return parse(text);
}

static void test_check_accepts_a_description_and_refuses_others(void **state) {
    (void)state;
    json_t *d = parse(good);
    assert_int_equal(mdesc_check(d, "x.ctt"), CT_OK);
    double v;
    assert_int_equal(mdesc_field(d, "n_kv_heads", &v), 1);
    assert_true(v == 2);
    assert_int_equal(mdesc_field(d, "ffn_hidden", &v), 0);
    json_decref(d);
    static const struct { const char *from, *to, *msg; } bad[] = {
        {"ctitan-model", "ctitan-checkpoint", "x.ctt: the model description is not an object with format \"ctitan-model\""},
        {"\"version\": 1", "\"version\": 2", "x.ctt: model description version is not 1 (a newer ctitan wrote it?)"},
        {"\"llama3\"", "\"lla\\nma3\"", "name and flavor must be strings of 1 to 4095 printable characters"},
        {"\"flavor\": \"debugmodel\"", "\"flavor\": 7", "name and flavor must be strings"},
        {"\"dim\": 64, \"n_heads\"", "\"compile.x\": 64, \"n_heads\"", "option 'compile.x' must be a lowercase key"},
        {"\"tie_word_embeddings\": false", "\"tie_word_embeddings\": [1]", "option 'tie_word_embeddings' must be"},
        {"\"n_kv_heads\": 2", "\"n_kv_heads\": -2", "model description: n_kv_heads must be a non-negative integer"},
        {"\"n_kv_heads\": 2", "\"n_kv_heads\": 2.5", "model description: n_kv_heads must be a non-negative integer"},
        {"\"hf_model_type\": \"llama\"", "\"hf_model_type\": 1", "hf_model_type must be a short string"},
        {"\"options\": {", "\"options\": 3, \"x\": {", "options and model must be objects"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        d = edited(bad[i].from, bad[i].to);
        ct_clear_error();
        assert_int_equal(mdesc_check(d, "x.ctt"), CT_ERR_INVALID);
        if (!strstr(ct_last_error(), bad[i].msg)) fail_msg("case %zu: '%s' lacks '%s'", i, ct_last_error(), bad[i].msg);
        json_decref(d);
    }
}

static manifest *fresh(void) {
    manifest *mf = manifest_new();
    assert_non_null(mf);
    manifest_add_core_schema(mf);
    return mf;
}

static void test_apply_fills_the_manifest_and_compares_what_it_sets(void **state) {
    (void)state;
    const char *s;
    json_t *d = parse(good);
    manifest *mf = fresh();
    assert_int_equal(manifest_override(mf, "model.flavor", "from_checkpoint"), 0);
    assert_int_equal(manifest_override(mf, "model.n_heads", "4"), 0);
    assert_int_equal(manifest_override(mf, "model.norm_eps", "1e-5"), 0); /* the same number */
    assert_int_equal(mdesc_apply(mf, d, "x.ctt", 1), CT_OK);
    assert_int_equal(mf_get_str(mf, "model.flavor", &s), 0);
    assert_string_equal(s, "debugmodel");
    assert_int_equal(mf_get_str(mf, "model.name", &s), 0);
    assert_string_equal(s, "llama3");
    assert_int_equal(mf_get_str(mf, "model.dim", &s), 0);
    assert_string_equal(s, "64");
    assert_int_equal(mf_get_str(mf, "model.rope_theta", &s), 0);
    assert_string_equal(s, "500000"); /* the shortest form that reads back */
    assert_int_equal(mf_get_str(mf, "model.norm_eps", &s), 0);
    assert_string_equal(s, "1e-5"); /* agreeing keys stay as written */
    assert_int_equal(mf_get_str(mf, "model.tie_word_embeddings", &s), 0);
    assert_string_equal(s, "false");
    manifest_free(mf);

    /* a key that contradicts: one line with the key, both values and the file */
    mf = fresh();
    assert_int_equal(manifest_override(mf, "model.n_heads", "8"), 0);
    assert_int_equal(mdesc_apply(mf, d, "x.ctt", 1), CT_ERR_INVALID);
    assert_string_equal(ct_last_error(),
                        "command line: --model.n_heads: 8 contradicts the checkpoint's 4 (x.ctt); drop the key or make "
                        "it agree");
    manifest_free(mf);
    mf = fresh();
    assert_int_equal(manifest_override(mf, "model.name", "qwen2"), 0);
    assert_int_equal(mdesc_apply(mf, d, "x.ctt", 0), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "--model.name: qwen2 contradicts the checkpoint's llama3"));
    manifest_free(mf);

    /* the flavor: compared for from_checkpoint, left alone for a model load (generate) */
    mf = fresh();
    assert_int_equal(manifest_override(mf, "model.flavor", "8B"), 0);
    assert_int_equal(mdesc_apply(mf, d, "x.ctt", 1), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "--model.flavor: 8B contradicts the checkpoint's debugmodel"));
    assert_int_equal(mdesc_apply(mf, d, "x.ctt", 0), CT_OK);
    assert_int_equal(mf_get_str(mf, "model.flavor", &s), 0);
    assert_string_equal(s, "8B");
    manifest_free(mf);
    json_decref(d);
}

/* A Hugging Face folder's config.json describes the pack its model_type names (hf_pack.c): here a tied
 * Qwen2 with q/k/v biases, as transformers writes its config. */
static void test_hf_config_describes_the_pack_that_runs_it(void **state) {
    (void)state;
    char dir[] = "/tmp/ct-mdesc-XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"model_type\": \"qwen2\", \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,\n"
          " \"num_key_value_heads\": 2, \"vocab_size\": 256, \"intermediate_size\": 192, \"rope_theta\": 1000000.0,\n"
          " \"rms_norm_eps\": 1e-06, \"tie_word_embeddings\": true, \"hidden_act\": \"silu\"}\n", f);
    fclose(f);
    json_t *d = NULL;
    if (mdesc_read(dir, 1, &d) != CT_OK) fail_msg("%s", ct_last_error());
    unlink(path);
    rmdir(dir);
    assert_non_null(d);
    assert_int_equal(mdesc_check(d, "hf"), CT_OK);
    assert_string_equal(json_string_value(json_object_get(d, "name")), "qwen2");
    assert_null(json_object_get(d, "flavor"));
    json_t *o = json_object_get(d, "options");
    assert_int_equal(json_integer_value(json_object_get(o, "n_kv_heads")), 2);
    assert_true(json_is_true(json_object_get(o, "tie_word_embeddings")));
    double v;
    assert_int_equal(mdesc_field(d, "head_dim", &v), 1);
    assert_true(v == 16);
    json_decref(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_accepts_a_description_and_refuses_others),
        cmocka_unit_test(test_apply_fills_the_manifest_and_compares_what_it_sets),
        cmocka_unit_test(test_hf_config_describes_the_pack_that_runs_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
