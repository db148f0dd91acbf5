/* test_qwen2_hf.c: a Hugging Face Qwen2 folder runs in sdk/examples/qwen2's pack (through the qwen2 pack's tables, core/checkpoint/hf_pack.c).
 *
 * Golden data (tests/golden/hf/, made and checked by tests/golden/gen_qwen2_golden.py):
 *   qwen2_from_transformers/ + .ctt: a tiny tied Qwen2ForCausalLM with random q/k/v biases saved by
 *       transformers, and its logits (float64). We load it with hf_load (what `ctitan convert --from
 *       hf` does), run the qwen2 pack on the CPU, tied (the head shares the table) and untied (the
 *       head a copy), and want 1e-4 agreement; without the biases, or with
 *       them in Hugging Face's row order, the logits must be far off (the test can tell).
 * The pack is built by tests/unit/test_qwen2_hf.mk from the SDK headers, as a third party would. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf_pack_fixture.h"
#include "io/safetensors.h"
#include "io/tensorfile.h"
#include "session_fixture.h"

#define GOLDEN "tests/golden/hf/qwen2_from_transformers"

static double rel_err(const float *got, const float *want, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-30));
}

/* A CPU session of the qwen2 pack with c's sizes; tied as c says. */
static int open_qwen2(session *s, const hf_config *c, int tied, int64_t T, int64_t B) {
    char yaml[1200];
    snprintf(yaml, sizeof yaml,
             "device: {name: cpu, threads: 2}\n"
             "model: {name: %s, flavor: tiny, dim: %lld, n_layers: %lld, n_heads: %lld, n_kv_heads: %lld,\n"
             "        vocab_size: %lld, ffn_hidden: %lld, rope_theta: %.17g, norm_eps: %.17g, tie_word_embeddings: %s}\n"
             "optimizer: {name: AdamW, lr: 1e-3}\n"
             "training: {seq_len: %lld, local_batch_size: %lld}\n"
             "activation_checkpoint: {mode: none}\n",
             QWEN2_SO, (long long)c->dim, (long long)c->n_layers, (long long)c->n_heads, (long long)c->n_kv_heads,
             (long long)c->vocab, (long long)c->ffn_hidden, c->rope_theta, c->norm_eps, tied ? "true" : "false",
             (long long)T, (long long)B);
    return fixture_open(s, yaml);
}

/* Sets the session's parameters from w by name (output.weight, when the pack has its own, from the
 * embedding table) and returns the logits' relative error against g's. */
static double logits_error(session *s, const tf_file *w, const tf_file *g, int64_t B, int64_t T) {
    for (int k = 0; k < s->rt.n_params; k++) {
        const char *name = s->rt.params[k]->t.name;
        const tf_entry *e = tf_find(w, !strcmp(name, "output.weight") ? "tok_embeddings.weight" : name);
        if (!e) fail_msg("the file has no %s", name);
        assert_int_equal(ct_tensor_numel(&s->rt.params[k]->t), e->numel);
        assert_int_equal(runtime_param_set(&s->rt, k, e->data), CT_OK);
    }
    const tf_entry *want = tf_find(g, "expected.logits");
    float *logits = malloc(sizeof(float) * (size_t)want->numel);
    assert_int_equal(runtime_forward_logits(&s->rt, tf_find(g, "input.tokens")->data, B, T, logits), CT_OK);
    double e = rel_err(logits, want->data, want->numel);
    free(logits);
    return e;
}

static void test_transformers_qwen2_runs_in_the_pack_within_1e4(void **state) {
    (void)state;
    tf_file *g = tf_read(GOLDEN ".ctt"), *w;
    if (!g) fail_msg("%s", ct_last_error());
    hf_config c;
    if (hf_load(GOLDEN, &c, &w) != CT_OK) fail_msg("%s", ct_last_error());
    assert_true(c.tied);
    assert_int_equal(c.features, CT_MODEL_QKV_BIAS | CT_MODEL_TIED_EMBEDDINGS);
    assert_null(tf_find(w, "output.weight")); /* the pack shares the table */
    assert_non_null(tf_find(w, "layers.1.attention.wk.bias"));
    assert_int_equal(w->count, 1 + 12 * 2 + 1);
    const tf_entry *tokens = tf_find(g, "input.tokens");
    int64_t B = tokens->shape[0], T = tokens->shape[1];
    session s;
    for (int tied = 0; tied < 2; tied++) { /* untied: output.weight a copy of the table */
        if (open_qwen2(&s, &c, tied, T, B)) fail_msg("session: %s", ct_last_error());
        double e = logits_error(&s, w, g, B, T);
        print_message("qwen2 pack (%s) vs transformers (float64) logits: relative error %.2e\n",
                      tied ? "tied" : "untied", e);
        if (!(e <= 1e-4)) fail_msg("logits: relative error %.3g > 1e-4", e);
        if (!tied) session_close(&s);
    }

    /* The biases matter, in ctitan's row order: in Hugging Face's order, or zeroed, they are far off. */
    for (int zero = 0; zero < 2; zero++) {
        for (int i = 0; i < w->count; i++) {
            tf_entry *p = &w->entries[i];
            int64_t heads = strstr(p->name, ".wq.bias") ? c.n_heads : strstr(p->name, ".wk.bias") ? c.n_kv_heads : 0;
            if (zero && strstr(p->name, ".bias")) memset(p->data, 0, sizeof(float) * (size_t)p->numel);
            if (zero || !heads) continue;
            float *hf = malloc(sizeof(float) * (size_t)p->numel);
            hf_permute_rows(hf, p->data, heads, c.head_dim, 1, 1);
            memcpy(p->data, hf, sizeof(float) * (size_t)p->numel);
            free(hf);
        }
        double wrong = logits_error(&s, w, g, B, T);
        print_message("biases %s: relative error %.2e\n", zero ? "zeroed" : "in HF's row order", wrong);
        if (!(wrong > 1e-3)) fail_msg("the biases do not change the logits (%.3g): the test is blind", wrong);
    }
    session_close(&s);
    tf_free(w);
    tf_free(g);
}

/* hf_save of a tied Qwen2: Qwen2ForCausalLM, tie_word_embeddings true, biases under HF's names, no
 * lm_head.weight; and hf_load reads it back bit for bit. */
static void test_export_is_a_tied_qwen2_folder(void **state) {
    (void)state;
    char dir[] = "/tmp/ct-qwen2-XXXXXX";
    assert_non_null(mkdtemp(dir));
    hf_config c, back;
    tf_file *w, *w2;
    if (hf_load(GOLDEN, &c, &w) != CT_OK) fail_msg("%s", ct_last_error());
    hf_config shapes = {.n_heads = c.n_heads, .rope_theta = c.rope_theta, .norm_eps = c.norm_eps,
                        .max_position_embeddings = 64};
    if (hf_config_from_weights(&shapes, w) != CT_OK) fail_msg("%s", ct_last_error());
    assert_int_equal(shapes.features, CT_MODEL_QKV_BIAS | CT_MODEL_TIED_EMBEDDINGS);
    assert_string_equal(hf_model_type(&shapes), "qwen2");
    if (hf_save(dir, &shapes, w, HF_FLOAT32) != CT_OK) fail_msg("%s", ct_last_error());
    char path[128], text[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    assert_non_null(strstr(text, "\"Qwen2ForCausalLM\""));
    assert_non_null(strstr(text, "\"model_type\": \"qwen2\""));
    assert_non_null(strstr(text, "\"tie_word_embeddings\": true"));
    st_model *m = st_model_open(dir);
    if (!m) fail_msg("%s", ct_last_error());
    assert_null(st_model_find(m, "lm_head.weight"));
    assert_non_null(st_model_find(m, "model.layers.1.self_attn.v_proj.bias"));
    assert_int_equal(m->count, 26);
    st_model_free(m);
    if (hf_load(dir, &back, &w2) != CT_OK) fail_msg("%s", ct_last_error());
    assert_int_equal(w2->count, w->count);
    for (int i = 0; i < w->count; i++) {
        assert_string_equal(w->entries[i].name, w2->entries[i].name);
        assert_memory_equal(w->entries[i].data, w2->entries[i].data, sizeof(float) * (size_t)w->entries[i].numel);
    }
    tf_free(w2);
    tf_free(w);
    snprintf(path, sizeof path, "rm -rf %s", dir);
    assert_int_equal(system(path), 0);
}

/* A Qwen2 config ctitan would run differently is refused, naming the key. */
static void test_qwen2_configs_refused(void **state) {
    (void)state;
    hf_config c;
    const char *sliding = "{\"model_type\": \"qwen2\", \"hidden_size\": 32, \"intermediate_size\": 64, "
                          "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 96, "
                          "\"use_sliding_window\": true}";
    assert_int_equal(hf_config_parse(sliding, strlen(sliding), "c.json", &c), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "config.json: use_sliding_window must be false"));
    const char *other = "{\"model_type\": \"mistral\", \"hidden_size\": 32}"; /* no pack on the search path runs it */
    assert_int_equal(hf_config_parse(other, strlen(other), "c.json", &c), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "model_type 'mistral' is not supported"));
    const char *ok = "{\"model_type\": \"qwen2\", \"hidden_size\": 32, \"intermediate_size\": 64, "
                     "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 96, "
                     "\"tie_word_embeddings\": false}";
    assert_int_equal(hf_config_parse(ok, strlen(ok), "c.json", &c), CT_OK);
    assert_int_equal(c.features, CT_MODEL_QKV_BIAS);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transformers_qwen2_runs_in_the_pack_within_1e4),
        cmocka_unit_test(test_export_is_a_tied_qwen2_folder),
        cmocka_unit_test(test_qwen2_configs_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
