/* test_qwen3_hf.c: transformers' Qwen3 runs in models/qwen3 through the pack's own Hugging Face table
 * (ABI 2.12, core/io/hf_export.c), with no Qwen3 knowledge in the core.
 *
 * Golden data (tests/golden/hf/, made and checked by tests/golden/gen_qwen3_golden.py):
 *   qwen3_from_transformers/ + .ctt: a tiny tied Qwen3ForCausalLM (head_dim 16 where hidden_size /
 *       heads is 8; random QK-norm weights) saved by transformers 5, and its logits in float64. We
 *       load it with hf_import_load and the pack's table, as checkpoint.initial_load_in_hf does, run
 *       the pack on the CPU and want the logits within 1e-6 (1.6e-7 measured); with the QK-norm weights in Hugging
 *       Face's element order, or reset to one, they must be far off (the test can tell).
 * Also: what the table refuses (a config.json whose checked field differs, a tensor the model lacks)
 * and the config.json writer (transformers' layout, nested keys, Python's floats). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/hf_export.h"
#include "io/tensorfile.h"
#include "session_fixture.h"

#define GOLDEN "tests/golden/hf/qwen3_from_transformers"

static double rel_err(const float *got, const float *want, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-30));
}

static int open_qwen3(session *s, int64_t T, int64_t B, double rope_theta) {
    char yaml[1200];
    snprintf(yaml, sizeof yaml,
             "device: {name: cpu, threads: 2}\n"
             "model: {name: qwen3, flavor: debugmodel, dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, head_dim: 16,\n"
             "        vocab_size: 512, ffn_hidden: 64, rope_theta: %.17g, norm_eps: 1e-6, tie_word_embeddings: true}\n"
             "optimizer: {name: AdamW, lr: 1e-3}\n"
             "training: {seq_len: %lld, local_batch_size: %lld}\n"
             "activation_checkpoint: {mode: none}\n",
             rope_theta, (long long)T, (long long)B);
    return fixture_open(s, yaml);
}

/* The model's parameters as names and shapes (a shared head left out), as the checkpoint code asks. */
static tf_file *wanted(session *s) {
    tf_file *w = calloc(1, sizeof *w);
    w->entries = calloc((size_t)s->rt.n_params, sizeof(tf_entry));
    for (int i = 0; i < s->rt.n_params; i++) {
        const ct_tensor *p = &s->rt.params[i]->t;
        if (runtime_param_copy_of(&s->rt, i) >= 0) continue;
        tf_entry *e = &w->entries[w->count++];
        *e = (tf_entry){.name = (char *)p->name, .dtype = TF_F32, .ndim = p->ndim, .numel = ct_tensor_numel(p)};
        memcpy(e->shape, p->shape, sizeof(int64_t) * (size_t)p->ndim);
    }
    return w;
}

static void free_wanted(tf_file *w) {
    free(w->entries);
    free(w);
}

static double logits_error(session *s, const tf_file *w, const tf_file *g, int64_t B, int64_t T) {
    for (int k = 0; k < s->rt.n_params; k++) {
        const tf_entry *e = tf_find(w, runtime_param_key(&s->rt, k));
        if (!e) fail_msg("no %s", s->rt.params[k]->t.name);
        assert_int_equal(runtime_param_set(&s->rt, k, e->data), 0);
    }
    const tf_entry *want = tf_find(g, "expected.logits");
    float *logits = malloc(sizeof(float) * (size_t)want->numel);
    assert_int_equal(runtime_forward_logits(&s->rt, tf_find(g, "input.tokens")->data, B, T, logits), 0);
    double e = rel_err(logits, want->data, want->numel);
    free(logits);
    return e;
}

static void test_transformers_qwen3_runs_in_the_pack(void **state) {
    (void)state;
    tf_file *g = tf_read(GOLDEN ".ctt");
    if (!g) fail_msg("%s", ct_last_error());
    const tf_entry *tokens = tf_find(g, "input.tokens");
    int64_t B = tokens->shape[0], T = tokens->shape[1];
    session s;
    if (open_qwen3(&s, T, B, 50000)) fail_msg("session: %s", ct_last_error());
    assert_non_null(s.m->hf_export);
    ct_hf_export x = {.struct_size = sizeof x};
    assert_int_equal(s.m->hf_export(s.model, &x), CT_OK);
    tf_file *want = wanted(&s), *w = NULL;
    if (hf_import_load(GOLDEN, &x, want, s.rt.desc.head_dim, "qwen3", &w) != CT_OK) fail_msg("%s", ct_last_error());
    assert_int_equal(w->count, 1 + 11 * 2 + 1); /* tied: no output.weight */
    double e = logits_error(&s, w, g, B, T);
    print_message("qwen3 pack vs transformers (float64) logits: relative error %.2e\n", e);
    if (!(e <= 1e-6)) fail_msg("logits: relative error %.3g > 1e-6", e);

    /* The QK-norm weights matter, in ctitan's element order: in Hugging Face's, or at one, far off. */
    for (int ones = 0; ones < 2; ones++) {
        tf_file *v = NULL;
        assert_int_equal(hf_import_load(GOLDEN, &x, want, 16, "qwen3", &v), CT_OK);
        for (int i = 0; i < v->count; i++) {
            tf_entry *p = &v->entries[i];
            if (!strstr(p->name, "_norm.weight") || strstr(p->name, "attention_norm")) continue;
            float hf[16];
            if (ones) {
                for (int k = 0; k < 16; k++) ((float *)p->data)[k] = 1.0f;
            } else {
                hf_permute_rows(hf, p->data, 1, 16, 1, 1);
                memcpy(p->data, hf, sizeof hf);
            }
        }
        double wrong = logits_error(&s, v, g, B, T);
        print_message("QK-norm weights %s: relative error %.2e\n", ones ? "at one" : "in HF's order", wrong);
        if (!(wrong > 1e-3)) fail_msg("the QK-norm weights do not change the logits (%.3g): the test is blind", wrong);
        tf_free(v);
    }
    free_wanted(want);
    session_close(&s);

    /* a checked field that differs (the model's rope_theta against config.json's) is refused, naming it */
    if (open_qwen3(&s, T, B, 10000)) fail_msg("session: %s", ct_last_error());
    assert_int_equal(s.m->hf_export(s.model, &x), CT_OK);
    want = wanted(&s);
    tf_file *v = NULL;
    assert_int_equal(hf_import_load(GOLDEN, &x, want, 16, "qwen3", &v), CT_ERR_INVALID);
    if (!strstr(ct_last_error(), "config.json: rope_theta is 50000.0, model qwen3 has 10000.0")) fail_msg("%s", ct_last_error());
    /* a tensor of the folder that is no parameter of the model is refused, not dropped */
    assert_string_equal(want->entries[want->count - 1].name, "norm.weight");
    want->count--;
    x.fields = NULL; /* the config.json check passed above; this is about the tensors */
    assert_int_equal(hf_import_load(GOLDEN, &x, want, 16, "qwen3", &v), CT_ERR_INVALID);
    if (!strstr(ct_last_error(), "tensor 'model.norm.weight' is not a parameter of model qwen3"))
        fail_msg("%s", ct_last_error());
    session_close(&s);
    free_wanted(want);
    tf_free(w);
    tf_free(g);
}

/* The writer: transformers' layout (sorted keys, two-space indent, nested objects), Python's floats,
 * and the table's mistakes refused. */
static void test_config_writer_and_table_errors(void **state) {
    (void)state;
    const ct_hf_name names[] = {{"a.*.w", "model.*.w", 0}, {"b", "model.b", CT_HF_ROPE_ROWS}, {NULL, NULL, 0}};
    const ct_hf_field fields[] = {{"z", CT_HF_INT, 3, 0, NULL, 0},
                                  {"rope.factor", CT_HF_FLOAT, 0, 8, NULL, 0},
                                  {"eps", CT_HF_FLOAT, 0, 1e-5, NULL, 0},
                                  {"rope.type", CT_HF_STRING, 0, 0, "x\"y", 0},
                                  {"none", CT_HF_NULL, 0, 0, NULL, 0},
                                  {"tied", CT_HF_BOOL, 1, 0, NULL, 0},
                                  {NULL, 0, 0, 0, NULL, 0}};
    ct_hf_export x = {sizeof x, "TArch", "t", names, fields};
    char *text = hf_export_config(&x, HF_BFLOAT16, "t");
    assert_non_null(text);
    assert_string_equal(text, "{\n  \"architectures\": [\n    \"TArch\"\n  ],\n  \"eps\": 1e-05,\n  \"model_type\": \"t\",\n"
                              "  \"none\": null,\n  \"rope\": {\n    \"factor\": 8.0,\n    \"type\": \"x\\\"y\"\n  },\n"
                              "  \"tied\": true,\n  \"torch_dtype\": \"bfloat16\",\n  \"z\": 3\n}\n");
    free(text);
    char hf[64];
    uint32_t flags = 0;
    assert_int_equal(hf_export_name(&x, "a.12.w", hf, sizeof hf, &flags), CT_OK);
    assert_string_equal(hf, "model.12.w");
    assert_int_equal(hf_export_name(&x, "c", hf, sizeof hf, &flags), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "parameter 'c' has no Hugging Face name"));
    const ct_hf_field twice[] = {{"z", CT_HF_INT, 3, 0, NULL, 0}, {"z.y", CT_HF_INT, 3, 0, NULL, 0}, {NULL, 0, 0, 0, NULL, 0}};
    ct_hf_export bad = {sizeof bad, "TArch", "t", names, twice};
    assert_null(hf_export_config(&bad, HF_FLOAT32, "t"));
    assert_non_null(strstr(ct_last_error(), "'z' is a value and an object"));
    const ct_hf_field mine[] = {{"model_type", CT_HF_STRING, 0, 0, "u", 0}, {NULL, 0, 0, 0, NULL, 0}};
    bad.fields = mine;
    assert_null(hf_export_config(&bad, HF_FLOAT32, "t"));
    assert_non_null(strstr(ct_last_error(), "'model_type' is the host's to write"));
    /* a RoPE-permuted tensor must hold whole heads */
    float data[6] = {0};
    tf_entry e = {.name = "b", .dtype = TF_F32, .ndim = 1, .shape = {6}, .numel = 6, .data = data};
    tf_file w = {&e, 1, TF_VERSION};
    assert_int_equal(hf_export_check(&x, &w, 4, "t"), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "is not whole heads of an even head_dim 4"));
    assert_int_equal(hf_export_check(&x, &w, 6, "t"), CT_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transformers_qwen3_runs_in_the_pack),
        cmocka_unit_test(test_config_writer_and_table_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
