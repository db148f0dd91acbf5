/* test_hf_pack_tables.c: the llama3 and qwen2 packs' own Hugging Face tables (ABI 2.12, hf_export),
 * by which checkpoint.last_save_in_hf exports and checkpoint.initial_load_in_hf loads.
 *
 *   - llama3's table writes llama3_tiny as tests/golden/hf/from_ctitan, the folder transformers
 *     verified, byte for byte (config.json and model.safetensors);
 *   - transformers' Llama and Qwen2 folders load by the tables; a key transformers defaults to the
 *     model's value (CT_HF_OR_ABSENT: attention_bias, use_sliding_window) may be left out, and
 *     another value of it is refused naming the key; a tied Llama folder reads into the untied llama3
 *     as a copy of the table (CT_HF_TIED);
 *   - a pack without a table has no Hugging Face form: the export check names it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "io/hf_export.h"
#include "io/tensorfile.h"
#include "session_fixture.h"

#define GOLDEN "tests/golden"

static void open_or_fail(session *s, const char *model) {
    char yaml[1200];
    snprintf(yaml, sizeof yaml,
             "device: {name: cpu, threads: 1}\n"
             "model: {%s}\n"
             "optimizer: {name: AdamW, lr: 1e-3}\n"
             "training: {seq_len: 16, local_batch_size: 1}\n"
             "activation_checkpoint: {mode: none}\n",
             model);
    if (fixture_open(s, yaml)) fail_msg("session: %s", ct_last_error());
}

static void table_of(session *s, ct_hf_export *x) {
    assert_true(CT_HAS_FIELD(s->m, ct_model_api, hf_export) && s->m->hf_export);
    memset(x, 0, sizeof *x);
    x->struct_size = sizeof *x;
    if (s->m->hf_export(s->model, x) != CT_OK) fail_msg("hf_export: %s", ct_last_error());
}

/* The model's parameters as names and shapes (a shared head left out), data from `from` when given. */
static tf_file *params_of(session *s, const tf_file *from) {
    tf_file *w = calloc(1, sizeof *w);
    w->entries = calloc((size_t)s->rt.n_params, sizeof(tf_entry));
    w->version = TF_VERSION;
    for (int i = 0; i < s->rt.n_params; i++) {
        const ct_tensor *p = &s->rt.params[i]->t;
        if (runtime_param_copy_of(&s->rt, i) >= 0) continue;
        tf_entry *e = &w->entries[w->count++];
        *e = (tf_entry){.name = (char *)p->name, .dtype = TF_F32, .ndim = p->ndim, .numel = ct_tensor_numel(p)};
        memcpy(e->shape, p->shape, sizeof(int64_t) * (size_t)p->ndim);
        if (from) {
            const tf_entry *g = tf_find(from, p->name);
            if (!g || g->numel != e->numel) fail_msg("the golden has no %s of the model's shape", p->name);
            e->data = g->data;
        }
    }
    return w;
}

static void free_params(tf_file *w) {
    free(w->entries);
    free(w);
}

static int same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) same = 0;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

static void test_llama3_table_writes_the_verified_golden(void **state) {
    (void)state;
    session s;
    open_or_fail(&s, "name: llama3, flavor: debugmodel, dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, "
                     "vocab_size: 256, ffn_hidden: 192, rope_theta: 500000, norm_eps: 1e-5");
    ct_hf_export x;
    table_of(&s, &x);
    tf_file *g = tf_read(GOLDEN "/llama3_tiny.ctt");
    assert_non_null(g);
    tf_file *w = params_of(&s, g);
    char dir[] = "/tmp/ctitan-hfpack-XXXXXX";
    assert_non_null(mkdtemp(dir));
    if (hf_export_save(dir, &x, w, s.rt.desc.head_dim, HF_FLOAT32, "llama3") != CT_OK)
        fail_msg("%s", ct_last_error());
    char got[256];
    snprintf(got, sizeof got, "%s/config.json", dir);
    assert_true(same_file(got, GOLDEN "/hf/from_ctitan/config.json"));
    unlink(got);
    snprintf(got, sizeof got, "%s/model.safetensors", dir);
    assert_true(same_file(got, GOLDEN "/hf/from_ctitan/model.safetensors"));
    unlink(got);
    rmdir(dir);
    free_params(w);
    tf_free(g);
    session_close(&s);
}

/* DIR/config.json <- src's config.json with `from` replaced by `to` (the first occurrence; "" drops
 * it), and DIR/model.safetensors a link to src's. */
static void edited_folder(const char *dir, const char *src, const char *from, const char *to) {
    char path[512], text[8192];
    snprintf(path, sizeof path, "%s/config.json", src);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    char *at = strstr(text, from);
    assert_non_null(at);
    snprintf(path, sizeof path, "%s/config.json", dir);
    f = fopen(path, "wb");
    assert_non_null(f);
    fprintf(f, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    fclose(f);
    char real[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    assert_non_null(realpath(src, real));
    strncat(real, "/model.safetensors", sizeof real - strlen(real) - 1);
    assert_int_equal(symlink(real, path), 0);
}

/* Loads dir by s's table: CT_OK and the folder freed, or the status (error set). */
static ct_status load(session *s, const char *dir, const char *who) {
    ct_hf_export x;
    table_of(s, &x);
    tf_file *want = params_of(s, NULL), *out = NULL;
    ct_status st = hf_import_load(dir, &x, want, s->rt.desc.head_dim, who, &out);
    if (st == CT_OK) assert_int_equal(out->count, want->count);
    tf_free(out);
    free_params(want);
    return st;
}

static void remove_folder(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

static void test_llama3_table_loads_transformers_llama(void **state) {
    (void)state;
    session s;
    open_or_fail(&s, "name: llama3, flavor: debugmodel, dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, "
                     "vocab_size: 128, ffn_hidden: 80, rope_theta: 25000, norm_eps: 1e-6");
    const char *src = GOLDEN "/hf/from_transformers";
    if (load(&s, src, "llama3") != CT_OK) fail_msg("%s", ct_last_error());
    char dir[] = "/tmp/ctitan-hfpack-XXXXXX";
    assert_non_null(mkdtemp(dir));
    edited_folder(dir, src, "\"attention_bias\": false,", ""); /* older LlamaConfigs leave it out */
    if (load(&s, dir, "llama3") != CT_OK) fail_msg("without attention_bias: %s", ct_last_error());
    edited_folder(dir, src, "\"attention_bias\": false", "\"attention_bias\": true");
    assert_int_equal(load(&s, dir, "llama3"), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "attention_bias is true, model llama3 has false"));
    edited_folder(dir, src, "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 4");
    assert_int_equal(load(&s, dir, "llama3"), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "num_key_value_heads is 4, model llama3 has 2"));
    remove_folder(dir);
    session_close(&s);
}

/* A tied Llama folder (Llama 3.2 1B and 3B are tied) reads into the untied llama3 as a copy of the
 * table (CT_HF_TIED) and into the tied one as itself; an untied folder without lm_head.weight is
 * refused, and so is an untied folder for the tied model. */
static void test_llama3_reads_tied_folders(void **state) {
    (void)state;
    const char *sizes = "name: llama3, flavor: debugmodel, dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, "
                        "vocab_size: 128, ffn_hidden: 80, rope_theta: 25000, norm_eps: 1e-6";
    char model[400];
    session untied, tied;
    open_or_fail(&untied, sizes);
    snprintf(model, sizeof model, "%s, tie_word_embeddings: true", sizes);
    open_or_fail(&tied, model);
    ct_hf_export xu, xt;
    table_of(&untied, &xu);
    table_of(&tied, &xt);
    tf_file *want = params_of(&untied, NULL), *golden = NULL, *back = NULL;
    if (hf_import_load(GOLDEN "/hf/from_transformers", &xu, want, 32 / 4, "llama3", &golden) != CT_OK)
        fail_msg("%s", ct_last_error());
    tf_file *w = params_of(&tied, golden); /* no output.weight: the tied head is the table's use */
    char dir[] = "/tmp/ctitan-hfpack-XXXXXX";
    assert_non_null(mkdtemp(dir));
    if (hf_export_save(dir, &xt, w, 8, HF_FLOAT32, "llama3") != CT_OK) fail_msg("%s", ct_last_error());
    if (hf_import_load(dir, &xu, want, 8, "llama3", &back) != CT_OK) fail_msg("tied into untied: %s", ct_last_error());
    const tf_entry *emb = tf_find(back, "tok_embeddings.weight"), *out = tf_find(back, "output.weight");
    assert_non_null(emb);
    assert_non_null(out);
    assert_int_equal(emb->numel, out->numel);
    assert_memory_equal(emb->data, out->data, sizeof(float) * (size_t)emb->numel);
    assert_memory_equal(emb->data, tf_find(golden, "tok_embeddings.weight")->data, sizeof(float) * (size_t)emb->numel);
    tf_free(back);
    if (load(&tied, dir, "llama3") != CT_OK) fail_msg("tied into tied: %s", ct_last_error());
    assert_int_equal(load(&tied, GOLDEN "/hf/from_transformers", "llama3"), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "tie_word_embeddings is false, model llama3 has true"));
    char conf[256];
    snprintf(conf, sizeof conf, "%s/config.json", dir);
    char saved[300];
    snprintf(saved, sizeof saved, "%s.tied", conf);
    assert_int_equal(rename(conf, saved), 0);
    FILE *in = fopen(saved, "rb"), *o = fopen(conf, "wb");
    char line[256];
    while (fgets(line, sizeof line, in))
        fputs(strstr(line, "\"tie_word_embeddings\": true") ? "  \"tie_word_embeddings\": false,\n" : line, o);
    fclose(in);
    fclose(o);
    unlink(saved);
    assert_int_equal(load(&untied, dir, "llama3"), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "tensor 'lm_head.weight' (ctitan's 'output.weight') is missing"));
    remove_folder(dir);
    free_params(w);
    free_params(want);
    tf_free(golden);
    session_close(&tied);
    session_close(&untied);
}

static void test_qwen2_table_loads_transformers_qwen2(void **state) {
    (void)state;
    session s;
    open_or_fail(&s, "name: " QWEN2_SO ", flavor: tiny, dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, "
                     "vocab_size: 96, ffn_hidden: 64, rope_theta: 50000, norm_eps: 1e-6, tie_word_embeddings: true");
    const char *src = GOLDEN "/hf/qwen2_from_transformers";
    if (load(&s, src, "qwen2") != CT_OK) fail_msg("%s", ct_last_error());
    char dir[] = "/tmp/ctitan-hfpack-XXXXXX";
    assert_non_null(mkdtemp(dir));
    edited_folder(dir, src, "\"use_sliding_window\": false,", "");
    if (load(&s, dir, "qwen2") != CT_OK) fail_msg("without use_sliding_window: %s", ct_last_error());
    edited_folder(dir, src, "\"use_sliding_window\": false", "\"use_sliding_window\": true");
    assert_int_equal(load(&s, dir, "qwen2"), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "use_sliding_window is true, model qwen2 has false"));
    edited_folder(dir, src, "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false");
    assert_int_equal(load(&s, dir, "qwen2"), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "tie_word_embeddings is false, model qwen2 has true"));
    remove_folder(dir);
    session_close(&s);
}

static void test_a_pack_without_a_table_has_no_hf_form(void **state) {
    (void)state;
    session s;
    open_or_fail(&s, "name: " TIED_HEAD_SO ", flavor: tiny");
    assert_int_equal(ckpt_hf_export_check(&s, "checkpoint.last_save_in_hf"), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "checkpoint.last_save_in_hf: model tied_head has no Hugging Face form"));
    session_close(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama3_table_writes_the_verified_golden),
        cmocka_unit_test(test_llama3_table_loads_transformers_llama),
        cmocka_unit_test(test_llama3_reads_tied_folders),
        cmocka_unit_test(test_qwen2_table_loads_transformers_qwen2),
        cmocka_unit_test(test_a_pack_without_a_table_has_no_hf_form),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
