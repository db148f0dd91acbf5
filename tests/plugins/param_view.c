/* param_view.c: the smallest model pack whose ops read parameters through views, as a Qwen3 pack's
 * per-head QK-norm does (rmsnorm on a reshaped norm weight, over head-split q), for
 * tests/cli/param_view.sh. Unit 0 looks the tokens up in `wte`; unit 1 is a block: rmsnorm with
 * `norm` (1, DIM), q = linear with `wq`, an rmsnorm of every head of q with `q_norm` (1, HEAD_DIM),
 * linear with `wo`, added to the stream; unit 2 is the head and its cross entropy.
 *
 * Options: `view: true` (the default) reads both norm weights through views ((1, n) viewed as (n));
 * `view: false` reads them as they are, the reference. `q_norm_style` is q_norm's rule in the tp
 * plan: `partial` (CT_TP_REPLICATED_PARTIAL, right), `none` (no rule: its gradient would be partial
 * over tp, which tensor parallel must refuse) or `sequence_parallel` (summed only under SP).
 *
 * `double_by` doubles the block's branch before it joins the stream: `none` (the default) does not,
 * `add` with the builder's add (y + y), `custom` with a custom op of the pack's own that runs on the
 * device the builder hands it (ABI 2.12, ct_builder.device): forward 2y, backward dx += 2 dy, the
 * same bits as add's.
 *
 * Under FSDP the block's parameters are gathered anew for its backward, so a view that kept the
 * forward's data address reads a buffer the gather gave back. */
#include "ctitan/abi.h"
#include "ctitan/device.h"
#include "ctitan/model.h"

#include <stdlib.h>
#include <string.h>

typedef struct ct_model {
    const ct_host *host;
    int view;
    const char *double_by;
    ct_tp_rule plan[8];
    ct_tensor *wte, *norm, *wq, *q_norm, *wo, *head;
} pview;

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "view", CT_OPT_BOOL, "true", "the norms read their weights through views", NULL, NULL},
    {sizeof(ct_option_spec), "q_norm_style", CT_OPT_STRING, "partial", "q_norm's tensor-parallel rule", NULL,
     "partial|none|sequence_parallel"},
    {sizeof(ct_option_spec), "double_by", CT_OPT_STRING, "none", "how the block's branch is doubled", NULL,
     "none|add|custom"},
    {0},
};

enum { VOCAB = 2048, DIM = 32, HEAD_DIM = 8 };

static ct_status p_create(const ct_host *h, const ct_model_config *cfg, ct_model **out) {
    (void)cfg;
    pview *m = calloc(1, sizeof *m);
    const char *style = "partial";
    if (!m) return CT_ERR_NOMEM;
    m->host = h;
    if (h->opt_bool(h, "view", &m->view) != CT_OK) m->view = 1;
    if (h->opt_string(h, "double_by", &m->double_by) != CT_OK || !m->double_by) m->double_by = "none";
    if (h->opt_string(h, "q_norm_style", &style) != CT_OK || !style) style = "partial";
    ct_tp_rule plan[] = {
        {"wte.weight", CT_TP_EMBED_ROWWISE},    {"block.norm.weight", CT_TP_SEQUENCE_PARALLEL},
        {"block.wq.weight", CT_TP_COLWISE},     {"block.q_norm.weight", CT_TP_REPLICATED_PARTIAL},
        {"block.wo.weight", CT_TP_ROWWISE},     {"head.weight", CT_TP_OUTPUT_COLWISE},
        {NULL, CT_TP_NONE},
    };
    if (!strcmp(style, "none")) plan[3].pattern = "nothing matches this";
    if (!strcmp(style, "sequence_parallel")) plan[3].style = CT_TP_SEQUENCE_PARALLEL;
    memcpy(m->plan, plan, sizeof plan);
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
    d->n_heads = d->n_kv_heads = DIM / HEAD_DIM;
    d->n_params = 2 * (int64_t)VOCAB * DIM + 2 * DIM * DIM + DIM + HEAD_DIM;
    d->n_embedding_params = (int64_t)VOCAB * DIM;
    d->flops_per_token = 6.0 * (VOCAB * DIM + 2 * DIM * DIM);
    return CT_OK;
}

static ct_status p_declare(ct_model *m, ct_param_registry *r) {
    int64_t emb[2] = {VOCAB, DIM}, norm[2] = {1, DIM}, qn[2] = {1, HEAD_DIM}, sq[2] = {DIM, DIM};
    ct_init normal = {sizeof normal, CT_INIT_NORMAL, 0.05f, 0, 0, 0};
    ct_init ones = {sizeof ones, CT_INIT_CONSTANT, 0, 0, 0, 1.0f};
    m->wte = r->add(r, 0, "wte.weight", 2, emb, &normal, CT_TENSOR_LINEAR);
    m->norm = r->add(r, 1, "block.norm.weight", 2, norm, &ones, CT_TENSOR_NO_DECAY);
    m->wq = r->add(r, 1, "block.wq.weight", 2, sq, &normal, CT_TENSOR_LINEAR);
    m->q_norm = r->add(r, 1, "block.q_norm.weight", 2, qn, &ones, CT_TENSOR_NO_DECAY);
    m->wo = r->add(r, 1, "block.wo.weight", 2, sq, &normal, CT_TENSOR_LINEAR);
    m->head = r->add(r, 2, "head.weight", 2, emb, &normal, CT_TENSOR_LINEAR);
    return m->wte && m->norm && m->wq && m->q_norm && m->wo && m->head ? CT_OK : CT_ERR_INVALID;
}

static const char *p_unit_name(ct_model *m, int unit) {
    (void)m;
    return unit == 0 ? "wte" : unit == 1 ? "block" : "head";
}

/* w (1, n) as the rmsnorm weight (n): a view of it, or w itself */
static ct_tensor *norm_weight(pview *m, ct_builder *b, ct_tensor *w) {
    int64_t n[1] = {w->shape[1]};
    return m->view ? b->view(b, w, 1, n) : w;
}

/* The custom op: out = 2 in, on the builder's device (a pack has no strategy environment). */
static ct_status dev_of(ct_builder *b, const ct_device_api **d, ct_device **dev) {
    if (!CT_HAS_FIELD(b, ct_builder, device) || !b->device) return CT_ERR_UNSUPPORTED;
    return b->device(b, d, dev);
}

static ct_status double_fwd(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    (void)state, (void)n_in, (void)n_out;
    const ct_device_api *d;
    ct_device *dev;
    ct_status st = dev_of(b, &d, &dev);
    if (st != CT_OK) return st;
    if (!(out[0] = b->new_tensor(b, CT_F32, in[0]->ndim, in[0]->shape))) return CT_ERR_NOMEM;
    int64_t n = ct_tensor_numel(in[0]);
    if ((st = d->zero(dev, out[0]->data, sizeof(float) * (size_t)n)) != CT_OK) return st;
    return d->axpy(dev, out[0]->data, in[0]->data, 2.0f, n);
}

static ct_status double_bwd(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                            const float *const *dy, int n_out, int halves) {
    (void)state, (void)n_in, (void)out, (void)n_out;
    const ct_device_api *d;
    ct_device *dev;
    ct_status st = dev_of(b, &d, &dev);
    if (st != CT_OK || !dy[0] || !(halves & CT_GRAD_INPUT)) return st;
    float *g = b->grad(b, in[0]);
    return g ? d->axpy(dev, g, dy[0], 2.0f, ct_tensor_numel(in[0])) : CT_ERR_NOMEM;
}

static ct_status double_plan(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                             ct_op_cost *cost) {
    (void)state, (void)n_in, (void)n_out, (void)cost;
    return (out[0] = b->new_tensor(b, CT_F32, in[0]->ndim, in[0]->shape)) ? CT_OK : CT_ERR_NOMEM;
}

static const ct_custom_op double_op = {sizeof(ct_custom_op), "pview_double", double_fwd, double_bwd, double_plan};

static ct_tensor *doubled(pview *m, ct_builder *b, ct_tensor *y) {
    if (!strcmp(m->double_by, "add")) return b->add(b, y, y);
    if (strcmp(m->double_by, "custom")) return y;
    ct_tensor *out = NULL;
    return b->custom(b, &double_op, NULL, 0, &y, 1, &out, 1) == CT_OK ? out : NULL;
}

static ct_tensor *block(pview *m, ct_builder *b, ct_tensor *x) {
    ct_tensor *g = norm_weight(m, b, m->norm), *h = g ? b->rmsnorm(b, x, g, 1e-5f) : NULL;
    ct_tensor *q = h ? b->linear(b, h, m->wq) : NULL; /* under tp: this rank's heads */
    if (!q) return NULL;
    int64_t heads[2] = {ct_tensor_numel(q) / HEAD_DIM, HEAD_DIM};
    ct_tensor *qh = b->view(b, q, 2, heads), *qg = norm_weight(m, b, m->q_norm);
    ct_tensor *qn = qh && qg ? b->rmsnorm(b, qh, qg, 1e-5f) : NULL;
    ct_tensor *back = qn ? b->view(b, qn, q->ndim, q->shape) : NULL;
    ct_tensor *y = back ? b->linear(b, back, m->wo) : NULL;
    y = y ? doubled(m, b, y) : NULL;
    return y ? b->add(b, x, y) : NULL;
}

static ct_status p_forward(ct_model *m, int unit, ct_builder *b, ct_tensor *x, const ct_tensor *tokens,
                           const ct_tensor *targets, ct_tensor **out) {
    if (unit == 0) {
        *out = b->embedding(b, tokens, m->wte);
    } else if (unit == 1) {
        *out = block(m, b, x);
    } else {
        ct_tensor *logits = b->linear(b, x, m->head);
        *out = !logits ? NULL : targets ? b->cross_entropy(b, logits, targets) : logits;
    }
    return *out ? CT_OK : CT_ERR_INVALID;
}

static const ct_tp_rule *p_tp_plan(ct_model *m) { return m->plan; }

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
    .get_tp_plan = p_tp_plan,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_MODEL;
    info->name = "param_view";
    info->description = "test pack: norms reading their weights through views, one over head-split q (QK-norm)";
    info->options = options;
    info->api = &api;
    return CT_OK;
}
