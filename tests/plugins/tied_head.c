/* tied_head.c: the smallest model pack with a tied output head, for tests/cli/tied_params.sh.
 * Unit 0 looks the tokens up in `wte` (vocab, dim); unit 1 projects back onto the same table and
 * returns the summed cross entropy. With the option `share: true` the head declares its use of wte
 * through ct_param_registry.share, as model.h asks; with `share: false` it computes with the handle
 * declared for unit 0, which the host must refuse, naming the tensor and both units. With
 * `fused: true` both uses sit in unit 0 (unit 1 only takes the loss): the tape alone sums the two
 * gradients of one tensor, the reference the shared copies must match. */
#include "ctitan/abi.h"
#include "ctitan/model.h"

#include <stdlib.h>

typedef struct ct_model {
    const ct_host *host;
    int share, fused;
    ct_tensor *wte, *head; /* head: the head unit's use of wte */
} tied;

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "share", CT_OPT_BOOL, "true", "declare the head's use of wte with share", NULL, NULL},
    {sizeof(ct_option_spec), "fused", CT_OPT_BOOL, "false", "both uses of wte in unit 0 (the reference)", NULL, NULL},
    {0},
};

enum { VOCAB = 2048, DIM = 32 };

static ct_status t_create(const ct_host *h, const ct_model_config *cfg, ct_model **out) {
    (void)cfg;
    tied *m = calloc(1, sizeof *m);
    if (!m) return CT_ERR_NOMEM;
    m->host = h;
    if (h->opt_bool(h, "share", &m->share) != CT_OK) m->share = 1;
    if (h->opt_bool(h, "fused", &m->fused) != CT_OK) m->fused = 0;
    *out = m;
    return CT_OK;
}

static void t_destroy(ct_model *m) { free(m); }

static ct_status t_describe(ct_model *m, ct_model_desc *d) {
    d->n_units = 2;
    d->vocab_size = VOCAB;
    d->dim = DIM;
    d->n_layers = 0;
    d->n_params = (int64_t)VOCAB * DIM;
    d->n_embedding_params = (int64_t)VOCAB * DIM;
    d->flops_per_token = 6.0 * VOCAB * DIM;
    d->features = m->share ? CT_MODEL_TIED_EMBEDDINGS : 0;
    return CT_OK;
}

static ct_status t_declare(ct_model *m, ct_param_registry *r) {
    int64_t shape[2] = {VOCAB, DIM};
    ct_init init = {sizeof init, CT_INIT_NORMAL, 0.05f, 0, 0, 0};
    if (!(m->wte = r->add(r, 0, "wte.weight", 2, shape, &init, CT_TENSOR_LINEAR))) return CT_ERR_INVALID;
    m->head = m->share && !m->fused ? r->share(r, 1, "lm_head.weight", m->wte) : m->wte;
    return m->head ? CT_OK : CT_ERR_INVALID;
}

static const char *t_unit_name(ct_model *m, int unit) {
    (void)m;
    return unit == 0 ? "wte" : "lm_head";
}

static ct_status t_forward(ct_model *m, int unit, ct_builder *b, ct_tensor *x, const ct_tensor *tokens,
                           const ct_tensor *targets, ct_tensor **out) {
    if (unit == 0) {
        ct_tensor *e = b->embedding(b, tokens, m->wte);
        *out = m->fused && e ? b->linear(b, e, m->wte) : e;
    } else if (m->fused) {
        *out = targets ? b->cross_entropy(b, x, targets) : x;
    } else {
        ct_tensor *logits = b->linear(b, x, m->head);
        *out = !logits ? NULL : targets ? b->cross_entropy(b, logits, targets) : logits;
    }
    return *out ? CT_OK : CT_ERR_INVALID;
}

static const char *const flavors[] = {"tiny", NULL};
static const ct_model_api api = {
    .struct_size = sizeof(ct_model_api),
    .flavors = flavors,
    .create = t_create,
    .destroy = t_destroy,
    .describe = t_describe,
    .declare_params = t_declare,
    .unit_name = t_unit_name,
    .unit_forward = t_forward,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_MODEL;
    info->name = "tied_head";
    info->description = "test pack: an embedding and a head tied to it";
    info->options = options;
    info->api = &api;
    return CT_OK;
}
