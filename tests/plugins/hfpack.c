/* hfpack.c: a model pack the core knows nothing of, with its own Hugging Face form, for
 * tests/cli/hf_third_party.sh: `ctitan convert` finds it by its model_type ("ctitan_toy") on the plugin
 * search path, creates it from config.json by its hf_import links (ABI 2.16) and reads and writes the
 * folder by its hf_export table (2.12): its own tensor names, one matrix whose rows it marks
 * CT_HF_ROPE_ROWS, a field it checks (toy_kind) and one it writes only (toy_note).
 *
 * Parameters: embed.weight (vocab, dim) and layers.N.mix.weight (dim, dim), one head of dim. The pack
 * converts only: unit_forward refuses to compute. */
#include "ctitan/abi.h"
#include "ctitan/model.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct ct_model {
    int64_t dim, n_layers, vocab;
    double scale;
    char names[16][32]; /* "layers.N": unit_name's answers, kept until destroy */
    ct_hf_field fields[8];
} toy;

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "dim", CT_OPT_INT, "4", "width (even)", "[2, 64]", NULL},
    {sizeof(ct_option_spec), "n_layers", CT_OPT_INT, "1", "mixing layers", "[1, 14]", NULL},
    {sizeof(ct_option_spec), "vocab_size", CT_OPT_INT, "8", "vocabulary", "[1, 1024]", NULL},
    {sizeof(ct_option_spec), "scale", CT_OPT_FLOAT, "1", "a setting config.json carries as toy_scale", NULL, NULL},
    {0},
};

static const char *const flavors[] = {"toy", NULL};

static ct_status t_create(const ct_host *h, const ct_model_config *cfg, ct_model **out) {
    (void)cfg;
    toy *m = calloc(1, sizeof *m);
    if (!m) return CT_ERR_NOMEM;
    m->dim = 4, m->n_layers = 1, m->vocab = 8, m->scale = 1;
    h->opt_int(h, "dim", &m->dim);
    h->opt_int(h, "n_layers", &m->n_layers);
    h->opt_int(h, "vocab_size", &m->vocab);
    h->opt_float(h, "scale", &m->scale);
    if (m->dim % 2) {
        h->set_error(h, "dim: %lld must be even (its rows are RoPE pairs)", (long long)m->dim);
        free(m);
        return CT_ERR_INVALID;
    }
    for (int64_t i = 0; i < m->n_layers; i++) snprintf(m->names[i], sizeof m->names[i], "layers.%lld", (long long)i);
    *out = m;
    return CT_OK;
}

static void t_destroy(ct_model *m) { free(m); }

static ct_status t_describe(ct_model *m, ct_model_desc *d) {
    d->n_units = (int)m->n_layers + 1;
    d->vocab_size = m->vocab;
    d->dim = m->dim;
    d->n_layers = (int)m->n_layers;
    d->n_params = m->vocab * m->dim + m->n_layers * m->dim * m->dim;
    d->n_embedding_params = m->vocab * m->dim;
    d->n_heads = d->n_kv_heads = 1;
    d->head_dim = m->dim;
    d->hf_model_type = "ctitan_toy";
    return CT_OK;
}

static ct_status t_declare(ct_model *m, ct_param_registry *r) {
    ct_init init = {sizeof init, CT_INIT_NORMAL, 0.02f, 0, 0, 0};
    int64_t emb[2] = {m->vocab, m->dim}, mix[2] = {m->dim, m->dim};
    if (!r->add(r, 0, "embed.weight", 2, emb, &init, 0)) return CT_ERR_INVALID;
    for (int64_t i = 0; i < m->n_layers; i++) {
        char name[48];
        snprintf(name, sizeof name, "layers.%lld.mix.weight", (long long)i);
        if (!r->add(r, (int)i + 1, name, 2, mix, &init, 0)) return CT_ERR_INVALID;
    }
    return CT_OK;
}

static const char *t_unit_name(ct_model *m, int unit) { return unit == 0 ? "embed" : m->names[unit - 1]; }

static ct_status t_unit_forward(ct_model *m, int unit, ct_builder *b, ct_tensor *x, const ct_tensor *tokens,
                                const ct_tensor *targets, ct_tensor **out) {
    (void)m, (void)unit, (void)b, (void)x, (void)tokens, (void)targets, (void)out;
    return CT_ERR_INVALID; /* a converting pack: it never runs */
}

static const ct_hf_name hf_names[] = {
    {"embed.weight", "toy.embed_tokens.weight", 0},
    {"layers.*.mix.weight", "toy.blocks.*.mix.weight", CT_HF_ROPE_ROWS},
    {NULL, NULL, 0},
};

static ct_status t_hf_export(ct_model *m, ct_hf_export *out) {
    ct_hf_field *f = m->fields;
    f[0] = (ct_hf_field){"hidden_size", CT_HF_INT, m->dim, 0, NULL, CT_HF_CHECKED};
    f[1] = (ct_hf_field){"num_hidden_layers", CT_HF_INT, m->n_layers, 0, NULL, CT_HF_CHECKED};
    f[2] = (ct_hf_field){"toy_kind", CT_HF_STRING, 0, 0, "mixer", CT_HF_CHECKED};
    f[3] = (ct_hf_field){"toy_note", CT_HF_STRING, 0, 0, "written by the toy pack", 0};
    f[4] = (ct_hf_field){"toy_scale", CT_HF_FLOAT, 0, m->scale, NULL, CT_HF_CHECKED};
    f[5] = (ct_hf_field){"vocab_size", CT_HF_INT, m->vocab, 0, NULL, CT_HF_CHECKED};
    f[6] = (ct_hf_field){0};
    out->architecture = "ToyMixerForCausalLM";
    out->model_type = "ctitan_toy";
    out->names = hf_names;
    out->fields = f;
    return CT_OK;
}

static const ct_hf_option hf_options[] = {
    {"hidden_size", "dim", NULL, NULL, 0},
    {"num_hidden_layers", "n_layers", NULL, NULL, 0},
    {"vocab_size", "vocab_size", NULL, NULL, 0},
    {"toy_scale", "scale", NULL, "1.0", 0},
    {NULL, NULL, NULL, NULL, 0},
};

static const ct_hf_import hf_import = {
    .struct_size = sizeof(ct_hf_import), .model_type = "ctitan_toy", .options = hf_options};

static const ct_model_api api = {
    .struct_size = sizeof(ct_model_api),
    .flavors = flavors,
    .create = t_create,
    .destroy = t_destroy,
    .describe = t_describe,
    .declare_params = t_declare,
    .unit_name = t_unit_name,
    .unit_forward = t_unit_forward,
    .hf_export = t_hf_export,
    .hf_import = &hf_import,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_MODEL;
    info->name = "hfpack";
    info->description = "a toy pack with its own Hugging Face form (model_type ctitan_toy), for the convert tests";
    info->options = options;
    info->api = &api;
    return CT_OK;
}
