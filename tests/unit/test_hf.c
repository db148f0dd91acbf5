/* test_hf.c: Hugging Face Llama folders <-> ctitan's llama3 through the pack's own tables (core/checkpoint/hf_pack.c,
 * `ctitan convert`'s path; hf_pack_fixture.h), against transformers.
 *
 * Golden data (tests/golden/hf/, made and checked by tests/golden/gen_hf_golden.py):
 *   from_transformers/ + from_transformers.ctt: a LlamaForCausalLM saved by transformers and its
 *       logits; we load it with hf_load, run ctitan's llama3 on the CPU and want 1e-4 agreement.
 *   from_transformers_bf16/: the same weights in bfloat16 shards with an index.
 *   from_ctitan/: llama3_tiny exported by ctitan and verified by transformers (logits within 1e-4
 *       of llama3_tiny's); hf_save must reproduce it byte for byte.
 *   llama31_from_transformers/ + .ctt: a Llama 3.1-style model (RoPE scaling of rope_type llama3);
 *       ctitan's llama3 with model.rope_scaling: llama3 must match its logits within 1e-5. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf_pack_fixture.h"
#include "io/safetensors.h"
#include "session_fixture.h"
#include "io/tensorfile.h"

#define GOLDEN_DIR "tests/golden/hf"
#define LLAMA3_TINY "tests/golden/llama3_tiny.ctt"

static char tmpdir[64];

static int make_tmpdir(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ct-hf-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_tmpdir(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static double rel_err(const float *got, const float *want, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-30));
}

static int64_t scalar_i(const tf_file *f, const char *name) {
    const tf_entry *e = tf_find(f, name);
    if (!e) fail_msg("golden has no %s", name);
    return *(const int32_t *)e->data;
}

/* Opens a CPU session of ctitan's llama3 with cfg's sizes (and its RoPE scaling, when it has one). */
static void open_session(session *s, const hf_config *c, int64_t seq_len, int64_t batch) {
    char yaml[1536], scaling[400] = "";
    if (c->rope_scaling_factor != 0)
        snprintf(scaling, sizeof scaling,
                 ",\n        rope_scaling: llama3, rope_scaling_factor: %.17g, rope_low_freq_factor: %.17g,\n"
                 "        rope_high_freq_factor: %.17g, rope_original_max_position: %lld",
                 c->rope_scaling_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
                 (long long)c->rope_original_max_position);
    snprintf(yaml, sizeof yaml,
             "device: {name: cpu, threads: 2}\n"
             "model: {name: llama3, flavor: debugmodel, dim: %lld, n_layers: %lld, n_heads: %lld, n_kv_heads: %lld,\n"
             "        vocab_size: %lld, ffn_hidden: %lld, rope_theta: %.17g, norm_eps: %.17g%s}\n"
             "optimizer: {name: AdamW, lr: 1e-3}\n"
             "training: {seq_len: %lld, local_batch_size: %lld}\n"
             "activation_checkpoint: {mode: none}\n",
             (long long)c->dim, (long long)c->n_layers, (long long)c->n_heads, (long long)c->n_kv_heads,
             (long long)c->vocab, (long long)c->ffn_hidden, c->rope_theta, c->norm_eps, scaling, (long long)seq_len,
             (long long)batch);
    if (fixture_open(s, yaml)) fail_msg("session: %s", ct_last_error());
}

/* Sets every parameter of the session from w (by name) and returns the logits' relative error. */
static double logits_error(session *s, const tf_file *w, const tf_file *g, int64_t B, int64_t T) {
    assert_int_equal(s->rt.n_params, w->count);
    for (int i = 0; i < w->count; i++) {
        int k = runtime_find_param(&s->rt, w->entries[i].name);
        if (k < 0) fail_msg("the model has no parameter %s", w->entries[i].name);
        assert_int_equal(ct_tensor_numel(&s->rt.params[k]->t), w->entries[i].numel);
        assert_int_equal(runtime_param_set(&s->rt, k, w->entries[i].data), CT_OK);
    }
    const tf_entry *want = tf_find(g, "expected.logits");
    assert_non_null(want);
    float *logits = malloc(sizeof(float) * (size_t)want->numel);
    assert_int_equal(runtime_forward_logits(&s->rt, tf_find(g, "input.tokens")->data, B, T, logits), CT_OK);
    double e = rel_err(logits, want->data, want->numel);
    free(logits);
    return e;
}

static void test_transformers_checkpoint_runs_in_ctitan_within_1e4(void **state) {
    (void)state;
    tf_file *g = tf_read(GOLDEN_DIR "/from_transformers.ctt"), *w;
    if (!g) fail_msg("%s", ct_last_error());
    hf_config c;
    if (hf_load(GOLDEN_DIR "/from_transformers", &c, &w) != CT_OK) fail_msg("%s", ct_last_error());
    assert_int_equal(c.dim, scalar_i(g, "config.hidden_size"));
    assert_int_equal(c.ffn_hidden, scalar_i(g, "config.intermediate_size"));
    assert_int_equal(c.n_layers, scalar_i(g, "config.num_hidden_layers"));
    assert_int_equal(c.n_heads, scalar_i(g, "config.num_attention_heads"));
    assert_int_equal(c.n_kv_heads, scalar_i(g, "config.num_key_value_heads"));
    assert_int_equal(c.vocab, scalar_i(g, "config.vocab_size"));
    assert_true(c.rope_theta == (double)*(const float *)tf_find(g, "config.rope_theta")->data);
    assert_true(fabs(c.norm_eps - 1e-6) < 1e-12);
    const tf_entry *tokens = tf_find(g, "input.tokens");
    int64_t B = tokens->shape[0], T = tokens->shape[1];
    session s;
    open_session(&s, &c, T, B);
    double e = logits_error(&s, w, g, B, T);
    double e_hf32 = rel_err(tf_find(g, "expected.logits_hf_f32")->data, tf_find(g, "expected.logits")->data,
                            tf_find(g, "expected.logits")->numel);
    print_message("ctitan vs transformers (float64) logits: relative error %.2e (transformers float32: %.2e)\n", e,
                  e_hf32);
    if (!(e <= 1e-4)) fail_msg("logits: relative error %.3g > 1e-4", e);

    /* Without the q/k un-permutation the same weights give other logits: the test can tell. */
    for (int i = 0; i < w->count; i++) {
        tf_entry *p = &w->entries[i];
        int64_t heads = strstr(p->name, ".wq.") ? c.n_heads : strstr(p->name, ".wk.") ? c.n_kv_heads : 0;
        if (!heads) continue;
        float *hf = malloc(sizeof(float) * (size_t)p->numel);
        hf_permute_rows(hf, p->data, heads, c.head_dim, c.dim, 1);
        memcpy(p->data, hf, sizeof(float) * (size_t)p->numel);
        free(hf);
    }
    double wrong = logits_error(&s, w, g, B, T);
    print_message("with HF's q/k row order left in place: relative error %.2e\n", wrong);
    if (!(wrong > 1e-2)) fail_msg("q/k layout does not change the logits (%.3g): the test is blind", wrong);
    session_close(&s);
    tf_free(w);
    tf_free(g);
}

static float scalar_f(const tf_file *f, const char *name) {
    const tf_entry *e = tf_find(f, name);
    if (!e) fail_msg("golden has no %s", name);
    return *(const float *)e->data;
}

/* Llama 3.1's scaled RoPE: hf_load reads rope_parameters' llama3 scaling, and ctitan's llama3 with
 * those options computes transformers' logits; with plain RoPE it does not (the test can tell). */
static void test_llama31_scaled_rope_matches_transformers_within_1e5(void **state) {
    (void)state;
    tf_file *g = tf_read(GOLDEN_DIR "/llama31_from_transformers.ctt"), *w;
    if (!g) fail_msg("%s", ct_last_error());
    hf_config c;
    if (hf_load(GOLDEN_DIR "/llama31_from_transformers", &c, &w) != CT_OK) fail_msg("%s", ct_last_error());
    assert_int_equal(c.n_heads, scalar_i(g, "config.num_attention_heads"));
    assert_int_equal(c.n_kv_heads, scalar_i(g, "config.num_key_value_heads"));
    assert_true(c.rope_theta == (double)scalar_f(g, "config.rope_theta"));
    assert_true(c.rope_scaling_factor == (double)scalar_f(g, "config.rope_scaling_factor"));
    assert_true(c.rope_low_freq_factor == (double)scalar_f(g, "config.rope_low_freq_factor"));
    assert_true(c.rope_high_freq_factor == (double)scalar_f(g, "config.rope_high_freq_factor"));
    assert_int_equal(c.rope_original_max_position, scalar_i(g, "config.rope_original_max_position"));
    const tf_entry *tokens = tf_find(g, "input.tokens");
    int64_t B = tokens->shape[0], T = tokens->shape[1];
    session s;
    open_session(&s, &c, T, B);
    double e = logits_error(&s, w, g, B, T);
    session_close(&s);
    double e_hf32 = rel_err(tf_find(g, "expected.logits_hf_f32")->data, tf_find(g, "expected.logits")->data,
                            tf_find(g, "expected.logits")->numel);
    print_message("llama3 RoPE scaling: ctitan vs transformers (float64) logits: relative error %.2e (transformers "
                  "float32: %.2e)\n", e, e_hf32);
    if (!(e <= 1e-5)) fail_msg("logits: relative error %.3g > 1e-5", e);

    hf_config plain = c;
    plain.rope_scaling_factor = 0;
    open_session(&s, &plain, T, B);
    double wrong = logits_error(&s, w, g, B, T);
    session_close(&s);
    print_message("the same weights with plain RoPE: relative error %.2e\n", wrong);
    if (!(wrong > 1e-3)) fail_msg("the scaling does not change the logits (%.3g): the test is blind", wrong);
    tf_free(w);
    tf_free(g);
}

static void test_bf16_shards_load_as_rounded_float32(void **state) {
    (void)state;
    hf_config c32, c16;
    tf_file *w32, *w16;
    if (hf_load(GOLDEN_DIR "/from_transformers", &c32, &w32) != CT_OK) fail_msg("%s", ct_last_error());
    if (hf_load(GOLDEN_DIR "/from_transformers_bf16", &c16, &w16) != CT_OK) fail_msg("%s", ct_last_error());
    assert_int_equal(w16->count, w32->count);
    assert_int_equal(c16.dim, c32.dim);
    for (int i = 0; i < w32->count; i++) {
        const tf_entry *a = &w32->entries[i], *b = &w16->entries[i];
        assert_string_equal(a->name, b->name);
        assert_int_equal(a->numel, b->numel);
        const float *x = a->data, *y = b->data;
        for (int64_t k = 0; k < a->numel; k++) /* torch's .to(bfloat16) rounds to nearest even too */
            if (st_bf16_to_f32(st_f32_to_bf16(x[k])) != y[k])
                fail_msg("%s[%lld]: bf16 shard has %a, round(f32) is %a", a->name, (long long)k, (double)y[k],
                         (double)st_bf16_to_f32(st_f32_to_bf16(x[k])));
    }
    tf_free(w32);
    tf_free(w16);
}

static int files_equal(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int x = fgetc(fa), y = fgetc(fb);
        if (x != y) same = 0;
        if (x == EOF || y == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* llama3_tiny's weights and the config its config.* entries give. */
static tf_file *llama3_tiny(hf_config *c) {
    tf_file *f = tf_read(LLAMA3_TINY);
    if (!f) fail_msg("%s", ct_last_error());
    memset(c, 0, sizeof *c);
    c->n_heads = scalar_i(f, "config.n_heads");
    c->rope_theta = HF_DEFAULT_ROPE_THETA;
    c->norm_eps = HF_DEFAULT_NORM_EPS;
    c->max_position_embeddings = HF_DEFAULT_MAX_POSITIONS;
    if (hf_config_from_weights(c, f) != CT_OK) fail_msg("%s", ct_last_error());
    assert_int_equal(c->n_kv_heads, scalar_i(f, "config.n_kv_heads")); /* from wk's shape */
    assert_int_equal(c->n_layers, scalar_i(f, "config.n_layers"));
    assert_int_equal(c->ffn_hidden, scalar_i(f, "config.ffn_hidden"));
    return f;
}

static void test_export_reproduces_the_transformers_verified_folder(void **state) {
    (void)state;
    hf_config c;
    tf_file *f = llama3_tiny(&c);
    char dir[128], a[256], b[256];
    snprintf(dir, sizeof dir, "%s/export", tmpdir);
    if (hf_save(dir, &c, f, HF_FLOAT32) != CT_OK) fail_msg("%s", ct_last_error());
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(a, sizeof a, "%s/%s", dir, files[i]);
        snprintf(b, sizeof b, GOLDEN_DIR "/from_ctitan/%s", files[i]);
        if (!files_equal(a, b)) fail_msg("%s differs from %s", a, b);
    }
    tf_free(f);
}

static void test_round_trip_is_bit_exact_and_bf16_rounds(void **state) {
    (void)state;
    hf_config c, back;
    tf_file *f = llama3_tiny(&c), *w;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/rt", tmpdir);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        if (hf_save(dir, &c, f, bf16 ? HF_BFLOAT16 : HF_FLOAT32) != CT_OK) fail_msg("%s", ct_last_error());
        if (hf_load(dir, &back, &w) != CT_OK) fail_msg("%s", ct_last_error());
        assert_int_equal(back.dim, c.dim);
        assert_int_equal(back.n_kv_heads, c.n_kv_heads);
        assert_int_equal(back.max_position_embeddings, c.max_position_embeddings);
        assert_true(back.rope_theta == c.rope_theta && back.norm_eps == c.norm_eps);
        assert_int_equal(w->count, 21);
        for (int i = 0; i < w->count; i++) {
            const tf_entry *got = &w->entries[i], *want = tf_find(f, got->name);
            assert_non_null(want);
            assert_int_equal(got->ndim, want->ndim);
            assert_memory_equal(got->shape, want->shape, sizeof got->shape);
            const float *x = want->data, *y = got->data;
            for (int64_t k = 0; k < got->numel; k++) {
                float expect = bf16 ? st_bf16_to_f32(st_f32_to_bf16(x[k])) : x[k];
                if (memcmp(&expect, &y[k], 4)) fail_msg("%s[%lld] changed in the round trip", got->name, (long long)k);
            }
        }
        tf_free(w);
    }
    /* the parameter order is the llama3 pack's (tok_embeddings, layers..., norm, output) */
    if (hf_load(dir, &back, &w) != CT_OK) fail_msg("%s", ct_last_error());
    assert_string_equal(w->entries[0].name, "tok_embeddings.weight");
    assert_string_equal(w->entries[2].name, "layers.0.attention.wq.weight");
    assert_string_equal(w->entries[19].name, "norm.weight");
    assert_string_equal(w->entries[20].name, "output.weight");
    tf_free(w);
    tf_free(f);
}

static void test_permutation_is_the_hf_converter_one(void **state) {
    (void)state;
    /* 2 heads of head_dim 4, one column holding the row index: ctitan rows 0..7 */
    float src[8], hf[8], back[8];
    for (int i = 0; i < 8; i++) src[i] = (float)i;
    hf_permute_rows(hf, src, 2, 4, 1, 1);
    const float want[8] = {0, 2, 1, 3, 4, 6, 5, 7}; /* per head: even rows, then odd rows */
    assert_memory_equal(hf, want, sizeof want);
    hf_permute_rows(back, hf, 2, 4, 1, 0);
    assert_memory_equal(back, src, sizeof src);
    /* head_dim 8: w.view(1, 4, 2, cols).transpose(1, 2) gives rows 0 2 4 6 1 3 5 7 */
    float s8[16], h8[16];
    for (int i = 0; i < 16; i++) s8[i] = (float)i;
    hf_permute_rows(h8, s8, 1, 8, 2, 1);
    const int rows[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    for (int r = 0; r < 8; r++) {
        assert_true(h8[2 * r] == (float)(2 * rows[r]));
        assert_true(h8[2 * r + 1] == (float)(2 * rows[r] + 1));
    }
}

/* ---- bad folders --------------------------------------------------------------------------------- */

static void put_text(const char *dir, const char *name, const char *text) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* A valid export of llama3_tiny in dir, whose config.json we then replace. */
static void fresh_export(const char *dir) {
    hf_config c;
    tf_file *f = llama3_tiny(&c);
    if (hf_save(dir, &c, f, HF_BFLOAT16) != CT_OK) fail_msg("%s", ct_last_error());
    tf_free(f);
}

/* Writes dir/config.json: llama3_tiny's sizes, with key set to the JSON value (or removed, value
 * NULL); key NULL: unchanged. */
static void config_with(const char *dir, const char *key, const char *value) {
    json_t *c = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f}", "model_type", "llama", "hidden_size", 64,
                          "intermediate_size", 192, "num_hidden_layers", 2, "num_attention_heads", 4,
                          "num_key_value_heads", 2, "vocab_size", 256, "rope_theta", 500000.0, "rms_norm_eps", 1e-5);
    assert_non_null(c);
    if (key && value) assert_int_equal(json_object_set_new(c, key, json_loads(value, JSON_DECODE_ANY, NULL)), 0);
    if (key && !value) json_object_del(c, key);
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(json_dump_file(c, path, JSON_INDENT(2)), 0);
    json_decref(c);
}

static void expect_load_error(const char *dir, const char *want) {
    hf_config c;
    tf_file *w = NULL;
    if (hf_load(dir, &c, &w) == CT_OK) fail_msg("accepted; wanted an error with '%s'", want);
    assert_null(w);
    if (!strstr(ct_last_error(), want) || strchr(ct_last_error(), '\n'))
        fail_msg("got: %s\nwant: ...%s...", ct_last_error(), want);
}

static void expect_config_error(const char *dir, const char *key, const char *value, const char *want) {
    config_with(dir, key, value);
    expect_load_error(dir, want);
}

static void test_unsupported_or_broken_configs_are_refused(void **state) {
    (void)state;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/bad", tmpdir);
    fresh_export(dir);
    config_with(dir, NULL, NULL);
    hf_config c;
    tf_file *w;
    if (hf_load(dir, &c, &w) != CT_OK) fail_msg("the base config: %s", ct_last_error());
    tf_free(w);
    expect_config_error(dir, "rope_scaling", "{\"rope_type\": \"dynamic\", \"factor\": 8.0}",
                        "rope_scaling rope_type 'dynamic' is not supported (ctitan reads rope_type default, llama3 and "
                        "yarn)");
    expect_config_error(dir, "rope_scaling", "{\"factor\": 8.0}", "rope_scaling has no rope_type");
    expect_config_error(dir, "rope_parameters", "{\"rope_type\": \"yarn\", \"rope_theta\": 1e4}",
                        "rope_parameters.factor must be a number of at least 1 (rope_type yarn)");
    /* YaRN that ctitan runs (cos and sin unscaled) is read, and refused by llama3's pack, naming the key */
    expect_config_error(dir, "rope_parameters",
                        "{\"rope_type\": \"yarn\", \"rope_theta\": 1e4, \"factor\": 8.0, \"mscale\": 1.0, "
                        "\"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 64}",
                        "rope_scaling.rope_type 'yarn' is not supported (the pack's model.rope_scaling takes none|llama3)");
    expect_config_error(dir, "rope_scaling", "{\"rope_type\": \"llama3\"}", "rope_scaling of rope_type llama3 has no factor");
    expect_config_error(dir, "rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0}",
                        "must be above rope_low_freq_factor 4");
    expect_config_error(dir, "rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 0.5}", "rope_scaling_factor");
    expect_config_error(dir, "rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": \"8\"}",
                        "rope_scaling.factor must be a number");
    expect_config_error(dir, "head_dim", "32", "head_dim must be 16");
    expect_config_error(dir, "model_type", "\"mistral\"", "model_type 'mistral' is not supported");
    expect_config_error(dir, "attention_bias", "true", "attention_bias must be false");
    expect_config_error(dir, "mlp_bias", "true", "mlp_bias must be false");
    expect_config_error(dir, "hidden_act", "\"gelu\"", "hidden_act must be \"silu\"");
    expect_config_error(dir, "num_key_value_heads", "3", "must be a multiple of n_kv_heads 3");
    expect_config_error(dir, "vocab_size", "0", "key 'vocab_size' must be a positive integer");
    expect_config_error(dir, "hidden_size", "64.0", "key 'hidden_size' must be a positive integer");
    expect_config_error(dir, "rms_norm_eps", "\"small\"", "key 'rms_norm_eps' must be a number");
    expect_config_error(dir, "tie_word_embeddings", "1", "tie_word_embeddings must be true or false");
    expect_config_error(dir, "intermediate_size", NULL, "config.json: key 'intermediate_size' is missing");
    put_text(dir, "config.json", "[1, 2");
    expect_load_error(dir, "config.json: invalid JSON");
    put_text(dir, "config.json", "{\"a\": 1, \"a\": 2}");
    expect_load_error(dir, "duplicate");
}

/* Transformers 4's rope_scaling (Meta's Llama 3.1 config.json) and 5's rope_parameters read the same;
 * hf_save writes rope_scaling, which reads back. */
static void test_rope_scaling_config_forms_and_export(void **state) {
    (void)state;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/scaled", tmpdir);
    fresh_export(dir);
    const char *forms[][2] = {
        {"rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                         "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}"},
        {"rope_scaling", "{\"type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, \"high_freq_factor\": 4, "
                         "\"original_max_position_embeddings\": 8192}"},
        {"rope_parameters", "{\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, \"factor\": 8.0, "
                            "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                            "\"original_max_position_embeddings\": 8192}"},
    };
    hf_config c;
    tf_file *w;
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        config_with(dir, forms[i][0], forms[i][1]);
        if (hf_load(dir, &c, &w) != CT_OK) fail_msg("%s form %zu: %s", forms[i][0], i, ct_last_error());
        assert_true(c.rope_scaling_factor == 8.0 && c.rope_low_freq_factor == 1.0 && c.rope_high_freq_factor == 4.0);
        assert_int_equal(c.rope_original_max_position, 8192);
        assert_true(c.rope_theta == 500000.0);
        tf_free(w);
    }
    /* hf_save writes rope_scaling as Meta's files do; it reads back the same */
    config_with(dir, forms[0][0], forms[0][1]);
    if (hf_load(dir, &c, &w) != CT_OK) fail_msg("%s", ct_last_error());
    c.rope_scaling_factor = 32;
    c.rope_original_max_position = 4096;
    char out[160];
    snprintf(out, sizeof out, "%s/scaled_out", tmpdir);
    if (hf_save(out, &c, w, HF_FLOAT32) != CT_OK) fail_msg("%s", ct_last_error());
    tf_free(w);
    hf_config back;
    if (hf_load(out, &back, &w) != CT_OK) fail_msg("%s", ct_last_error());
    tf_free(w);
    assert_true(back.rope_scaling_factor == 32 && back.rope_low_freq_factor == 1 && back.rope_high_freq_factor == 4);
    assert_int_equal(back.rope_original_max_position, 4096);
    char path[200];
    snprintf(path, sizeof path, "%s/config.json", out);
    json_t *j = json_load_file(path, 0, NULL);
    assert_non_null(j);
    json_t *rs = json_object_get(j, "rope_scaling");
    assert_true(json_is_object(rs));
    assert_string_equal(json_string_value(json_object_get(rs, "rope_type")), "llama3");
    assert_true(json_real_value(json_object_get(rs, "factor")) == 32.0);
    assert_int_equal(json_integer_value(json_object_get(rs, "original_max_position_embeddings")), 4096);
    json_decref(j);
}

static void test_missing_wrong_or_extra_tensors_are_refused(void **state) {
    (void)state;
    char dir[128], path[256];
    snprintf(dir, sizeof dir, "%s/tensors", tmpdir);
    fresh_export(dir);
    expect_config_error(dir, "intermediate_size", "191",
                        "model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has shape (192, 64), "
                        "the model's 'layers.0.feed_forward.w1.weight' is (191, 64)");
    expect_config_error(dir, "num_hidden_layers", "1", "is not a parameter of model llama3");
    expect_config_error(dir, "num_hidden_layers", "3", "tensor 'model.layers.2.input_layernorm.weight' "
                                                       "(ctitan's 'layers.2.attention_norm.weight') is missing");

    /* a checkpoint without lm_head: refused, unless the embeddings are tied */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_file *sf = st_read(path);
    assert_non_null(sf);
    st_entry *keep = calloc((size_t)sf->count + 1, sizeof *keep);
    int n = 0;
    for (int i = 0; i < sf->count; i++) {
        const st_tensor *t = &sf->tensors[i];
        if (!strcmp(t->name, "lm_head.weight")) continue;
        keep[n++] = (st_entry){t->name, t->dtype, t->ndim, t->shape, NULL, t->data};
    }
    int64_t one = 1;
    float x = 0;
    keep[n] = (st_entry){"model.layers.0.self_attn.rotary_emb.inv_freq", ST_F32, 1, &one, &x, NULL}; /* ignored */
    char path2[256];
    snprintf(path2, sizeof path2, "%s/model2.safetensors", dir);
    assert_int_equal(st_write(path2, keep, n + 1, NULL, 0), CT_OK);
    free(keep);
    st_free(sf);
    assert_int_equal(rename(path2, path), 0);
    expect_config_error(dir, NULL, NULL,
                        "tensor 'lm_head.weight' (ctitan's 'output.weight') is missing and "
                        "tie_word_embeddings is false");
    config_with(dir, "tie_word_embeddings", "true");
    hf_config c;
    tf_file *w;
    if (hf_load(dir, &c, &w) != CT_OK) fail_msg("%s", ct_last_error());
    assert_true(c.tied);
    const tf_entry *emb = tf_find(w, "tok_embeddings.weight"), *out = tf_find(w, "output.weight");
    assert_non_null(out);
    assert_memory_equal(emb->data, out->data, sizeof(float) * (size_t)emb->numel);
    tf_free(w);

    /* corrupt, truncated and missing files */
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(truncate(path, sb.st_size - 1), 0);
    expect_load_error(dir, "run past the data section");
    FILE *fp = fopen(path, "r+b");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, 4, SEEK_SET), 0);
    fputc(0x01, fp); /* header length now over 4 GB */
    fclose(fp);
    expect_load_error(dir, "model.safetensors: header length");
    assert_int_equal(unlink(path), 0);
    expect_load_error(dir, "no model.safetensors or model.safetensors.index.json");
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(unlink(path), 0);
    expect_load_error(dir, "config.json: cannot open");
}

static void test_export_checks_the_ctitan_side(void **state) {
    (void)state;
    hf_config c;
    tf_file *f = llama3_tiny(&c);
    char dir[128];
    snprintf(dir, sizeof dir, "%s/never", tmpdir);
    hf_config bad = c;
    bad.n_heads = 3;
    assert_int_equal(hf_save(dir, &bad, f, HF_FLOAT32), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "dim 64 must split into n_heads 3 heads"));
    bad = c;
    bad.n_layers = 3;
    assert_int_equal(hf_save(dir, &bad, f, HF_FLOAT32), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "tensor 'layers.2.attention_norm.weight' is missing"));
    bad = c;
    bad.n_layers = 1;
    assert_int_equal(hf_save(dir, &bad, f, HF_FLOAT32), CT_ERR_INVALID);
    assert_non_null(
        strstr(ct_last_error(), "tensor 'layers.1.attention_norm.weight' is not a parameter of model llama3"));
    assert_int_not_equal(access(dir, F_OK), 0); /* nothing written */
    bad = c;
    bad.n_heads = 0;
    assert_int_equal(hf_config_from_weights(&bad, f), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "n_heads 0 does not divide"));
    tf_free(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transformers_checkpoint_runs_in_ctitan_within_1e4),
        cmocka_unit_test(test_bf16_shards_load_as_rounded_float32),
        cmocka_unit_test(test_export_reproduces_the_transformers_verified_folder),
        cmocka_unit_test(test_round_trip_is_bit_exact_and_bf16_rounds),
        cmocka_unit_test(test_permutation_is_the_hf_converter_one),
        cmocka_unit_test(test_unsupported_or_broken_configs_are_refused),
        cmocka_unit_test(test_llama31_scaled_rope_matches_transformers_within_1e5),
        cmocka_unit_test(test_rope_scaling_config_forms_and_export),
        cmocka_unit_test(test_missing_wrong_or_extra_tensors_are_refused),
        cmocka_unit_test(test_export_checks_the_ctitan_side),
    };
    return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
