/* param_view.c: the smallest model pack whose op reads a parameter through a view, as a Qwen3
 * pack's per-head QK-norm does (rmsnorm on a reshaped norm weight), for tests/cli/param_view.sh.
 * Unit 0 looks the tokens up in `wte`; unit 1 normalises with `gain` and projects with `w1`; unit 2
 * is the head and its cross entropy. With `view: true` (the default) unit 1's rmsnorm takes a view
 * of `gain` ((1, DIM) viewed as (DIM)); with `view: false` it takes `gain` itself, the reference.
 * Under FSDP the block's parameters are gathered anew for its backward, so a view that kept the
 * forward's data address reads a buffer the gather gave back. */
#include "ctitan/abi.h"
#include "ctitan/model.h"

#include <stdlib.h>

typedef struct ct_model {
    const ct_host *host;
    int view;
    ct_tensor *wte, *gain, *w1, *head;
} pview;

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "view", CT_OPT_BOOL, "true", "unit 1 reads its norm weight through a view", NULL, NULL},
    {0},
};

enum { VOCAB = 2048, DIM = 32 };

static ct_status p_create(const ct_host *h, const ct_model_config *cfg, ct_model **out) {
    (void)cfg;
    pview *m = calloc(1, sizeof *m);
    if (!m) return CT_ERR_NOMEM;
    m->host = h;
    if (h->opt_bool(h, "view", &m->view) != CT_OK) m->view = 1;
    *out = m;
    return CT_OK;
}

static void p_destroy(ct_model *m) { free(m); }

static ct_status p_describe(ct_model *m, ct_model_desc *d) {
    (void)m;
    d->n_units = 3;
    d->vocab_size = VOCAB;
    d->dim = DIM;
    d->n_layers = 1;
    d->n_params = 2 * (int64_t)VOCAB * DIM + DIM * DIM + DIM;
    d->n_embedding_params = (int64_t)VOCAB * DIM;
    d->flops_per_token = 6.0 * (VOCAB * DIM + DIM * DIM);
    return CT_OK;
}

static ct_status p_declare(ct_model *m, ct_param_registry *r) {
    int64_t emb[2] = {VOCAB, DIM}, gain[2] = {1, DIM}, sq[2] = {DIM, DIM};
    ct_init normal = {sizeof normal, CT_INIT_NORMAL, 0.05f, 0, 0, 0};
    ct_init ones = {sizeof ones, CT_INIT_CONSTANT, 0, 0, 0, 1.0f};
    m->wte = r->add(r, 0, "wte.weight", 2, emb, &normal, CT_TENSOR_LINEAR);
    m->gain = r->add(r, 1, "block.norm.weight", 2, gain, &ones, CT_TENSOR_NO_DECAY);
    m->w1 = r->add(r, 1, "block.w1.weight", 2, sq, &normal, CT_TENSOR_LINEAR);
    m->head = r->add(r, 2, "head.weight", 2, emb, &normal, CT_TENSOR_LINEAR);
    return m->wte && m->gain && m->w1 && m->head ? CT_OK : CT_ERR_INVALID;
}

static const char *p_unit_name(ct_model *m, int unit) {
    (void)m;
    return unit == 0 ? "wte" : unit == 1 ? "block" : "head";
}

static ct_status p_forward(ct_model *m, int unit, ct_builder *b, ct_tensor *x, const ct_tensor *tokens,
                           const ct_tensor *targets, ct_tensor **out) {
    if (unit == 0) {
        *out = b->embedding(b, tokens, m->wte);
    } else if (unit == 1) {
        int64_t flat[1] = {DIM};
        ct_tensor *g = m->view ? b->view(b, m->gain, 1, flat) : m->gain;
        ct_tensor *h = g ? b->rmsnorm(b, x, g, 1e-5f) : NULL;
        ct_tensor *y = h ? b->linear(b, h, m->w1) : NULL;
        *out = y ? b->add(b, x, y) : NULL;
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
    .create = p_create,
    .destroy = p_destroy,
    .describe = p_describe,
    .declare_params = p_declare,
    .unit_name = p_unit_name,
    .unit_forward = p_forward,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_MODEL;
    info->name = "param_view";
    info->description = "test pack: an rmsnorm reading its weight through a view";
    info->options = options;
    info->api = &api;
    return CT_OK;
}
