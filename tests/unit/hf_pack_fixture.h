/* hf_pack_fixture.h: the Llama/Qwen2 view of a Hugging Face folder that test_hf.c and test_qwen2_hf.c
 * check, over the path `ctitan convert` takes (checkpoint/hf_pack.h: the model pack that runs the
 * folder's model_type, created from config.json by its hf_import, then its hf_export table). The test
 * knows the llama3 and qwen2 packs' option names; the core does not. */
#ifndef CT_TEST_HF_PACK_FIXTURE_H
#define CT_TEST_HF_PACK_FIXTURE_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint/hf_pack.h"
#include "io/hf_export.h"
#include "io/tensorfile.h"

typedef struct hf_config {
    int64_t dim, n_layers, n_heads, n_kv_heads, head_dim, vocab, ffn_hidden, max_position_embeddings;
    double rope_theta, norm_eps;
    double rope_scaling_factor, rope_low_freq_factor, rope_high_freq_factor;
    int64_t rope_original_max_position;
    int tied;          /* config.json's tie_word_embeddings */
    uint32_t features; /* the pack's: CT_MODEL_QKV_BIAS (qwen2), CT_MODEL_TIED_EMBEDDINGS (it shares the table) */
} hf_config;

#define HF_DEFAULT_ROPE_THETA 500000.0
#define HF_DEFAULT_NORM_EPS 1e-5
#define HF_DEFAULT_MAX_POSITIONS 8192

static inline const char *hf_model_type(const hf_config *c) { return c->features & CT_MODEL_QKV_BIAS ? "qwen2" : "llama"; }

/* DIR's config.json and weights (float32, the pack's names, in its order) by the pack its model_type names. */
static inline ct_status hf_load(const char *dir, hf_config *c, tf_file **weights) {
    hf_pack k;
    *weights = NULL;
    memset(c, 0, sizeof *c);
    ct_status st = hf_pack_from_folder(dir, NULL, &k);
    if (st == CT_OK) st = hf_import_load_folder(dir, &k.x, k.im ? k.im->options : NULL, k.want, k.desc.head_dim, k.p->info.name, weights);
    if (st == CT_OK) {
        const ct_model_desc *d = &k.desc;
        *c = (hf_config){d->dim, d->n_layers, d->n_heads, d->n_kv_heads, d->head_dim, d->vocab_size, d->ffn_hidden, 0,
                         d->rope_theta, d->norm_eps, d->rope_scaling_factor, d->rope_low_freq_factor,
                         d->rope_high_freq_factor, d->rope_original_max_position, 0, d->features};
        char path[4200];
        snprintf(path, sizeof path, "%s/config.json", dir);
        json_t *root = hf_config_read(path);
        c->tied = json_is_true(json_object_get(root, "tie_word_embeddings"));
        c->max_position_embeddings = json_integer_value(json_object_get(root, "max_position_embeddings"));
        json_decref(root);
    }
    hf_pack_close(&k);
    return st;
}

/* config.json's text parsed as hf_load does (through a scratch folder; no tensors are read). */
static inline ct_status hf_config_parse(const char *json, size_t len, const char *label, hf_config *c) {
    char dir[] = "/tmp/ct-hfcfg-XXXXXX", path[64];
    (void)label;
    memset(c, 0, sizeof *c);
    if (!mkdtemp(dir)) return CT_ERR_IO;
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (f) {
        fwrite(json, 1, len, f);
        fclose(f);
    }
    hf_pack k;
    ct_status st = hf_pack_from_folder(dir, NULL, &k);
    if (st == CT_OK) c->features = k.desc.features;
    hf_pack_close(&k);
    unlink(path);
    rmdir(dir);
    return st;
}

/* The sizes the weights' shapes give (the caller sets n_heads, rope_theta, norm_eps first), and the
 * features which tensors are there give: biases (qwen2), no output.weight (a shared table). */
static inline ct_status hf_config_from_weights(hf_config *c, const tf_file *w) {
    const tf_entry *emb = tf_find(w, "tok_embeddings.weight"), *w1 = tf_find(w, "layers.0.feed_forward.w1.weight");
    const tf_entry *wk = tf_find(w, "layers.0.attention.wk.weight");
    if (!emb || !w1 || !wk) return ct_fail(CT_ERR_INVALID, "a tensor that gives the sizes is missing");
    c->vocab = emb->shape[0];
    c->dim = emb->shape[1];
    c->ffn_hidden = w1->shape[0];
    char name[64];
    for (c->n_layers = 0;; c->n_layers++) {
        snprintf(name, sizeof name, "layers.%lld.attention_norm.weight", (long long)c->n_layers);
        if (!tf_find(w, name)) break;
    }
    if (c->n_heads < 1 || c->dim % c->n_heads)
        return ct_fail(CT_ERR_INVALID, "n_heads %lld does not divide the model width %lld (from tok_embeddings.weight)",
                       (long long)c->n_heads, (long long)c->dim);
    c->head_dim = c->dim / c->n_heads;
    if (!c->n_kv_heads) c->n_kv_heads = wk->shape[0] / c->head_dim;
    c->features = tf_find(w, "layers.0.attention.wq.bias") ? CT_MODEL_QKV_BIAS : 0;
    if (!tf_find(w, "output.weight")) c->features |= CT_MODEL_TIED_EMBEDDINGS;
    c->tied = (c->features & CT_MODEL_TIED_EMBEDDINGS) != 0;
    return CT_OK;
}

/* Writes DIR by the pack c's features name (qwen2 with biases, else llama3), created with c's sizes:
 * what `ctitan convert --to hf` does with a model file's description. */
static inline ct_status hf_save(const char *dir, const hf_config *c, const tf_file *w, hf_dtype dtype) {
    int qwen2 = (c->features & CT_MODEL_QKV_BIAS) != 0;
    json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:b}", "dim", (json_int_t)c->dim, "n_layers",
                          (json_int_t)c->n_layers, "n_heads", (json_int_t)c->n_heads, "n_kv_heads",
                          (json_int_t)c->n_kv_heads, "vocab_size", (json_int_t)c->vocab, "ffn_hidden",
                          (json_int_t)c->ffn_hidden, "rope_theta", c->rope_theta, "norm_eps", c->norm_eps,
                          "tie_word_embeddings", (c->features & CT_MODEL_TIED_EMBEDDINGS) != 0);
    if (c->rope_scaling_factor != 0) {
        json_object_set_new(o, "rope_scaling", json_string("llama3"));
        json_object_set_new(o, "rope_scaling_factor", json_real(c->rope_scaling_factor));
        json_object_set_new(o, "rope_low_freq_factor", json_real(c->rope_low_freq_factor));
        json_object_set_new(o, "rope_high_freq_factor", json_real(c->rope_high_freq_factor));
        json_object_set_new(o, "rope_original_max_position", json_integer(c->rope_original_max_position));
    }
    hf_pack k;
    ct_status st = hf_pack_from_options(qwen2 ? "qwen2" : "llama3", NULL, o, qwen2 ? "tiny" : NULL, "config", &k);
    json_decref(o);
    tf_file params = {calloc((size_t)(st == CT_OK ? k.want->count : 0) + 1, sizeof(tf_entry)), 0, TF_VERSION};
    for (int i = 0; st == CT_OK && i < k.want->count; i++) {
        const tf_entry *p = &k.want->entries[i], *e = tf_expect(w, NULL, p->name, TF_F32, p->ndim, p->shape);
        if (!e) st = CT_ERR_INVALID;
        else params.entries[params.count++] = *e;
    }
    for (int i = 0; st == CT_OK && i < w->count; i++) {
        char hf[256];
        uint32_t flags;
        if (!tf_find(&params, w->entries[i].name) && hf_export_name(&k.x, w->entries[i].name, hf, sizeof hf, &flags) == CT_OK)
            st = ct_fail(CT_ERR_INVALID, "tensor '%s' is not a parameter of model %s", w->entries[i].name, k.p->info.name);
    }
    ct_hf_field fields[32];
    ct_hf_export x = st == CT_OK ? k.x : (ct_hf_export){0};
    int n = 0;
    for (; st == CT_OK && x.fields[n].key && n < 31; n++) {
        fields[n] = x.fields[n];
        if (!strcmp(fields[n].key, "max_position_embeddings") && c->max_position_embeddings)
            fields[n].i = c->max_position_embeddings;
    }
    fields[n] = (ct_hf_field){0};
    x.fields = fields;
    if (st == CT_OK) st = hf_export_save(dir, &x, &params, k.desc.head_dim, dtype, dir);
    free(params.entries);
    hf_pack_close(&k);
    return st;
}

#endif
