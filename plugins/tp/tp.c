/* tp.c: Megatron-style tensor parallelism as a strategy plugin, written against the public SDK only.
 *
 * The model pack's plan (ct_model_api.tp_plan, handed over in the strategy env) names a style per
 * parameter. place() splits each parameter over the tp axis: column-wise weights (and the embedding
 * and output tables) on dim 0, row-wise weights on dim 1; everything else stays whole. The host's
 * tape then runs the collectives each style implies around the linear, embedding and loss ops
 * (all-gather before a column-wise linear, reduce-scatter after a row-wise one under sequence
 * parallel, all-reduces without it). What is left here is the one reduction the tape cannot see:
 * under sequence parallel a norm weight meets 1/tp of the token rows on each rank, so its gradient
 * is summed over tp after the step's last backward.
 */
#include "ctitan/strategy.h"

#include <stdlib.h>
#include <string.h>

typedef struct ct_strategy { /* the ABI's opaque ct_strategy */
    const ct_host *host;
    ct_strategy_env env;
    ct_mesh_info mesh;
    ct_param_slot *slots;
    int n_slots;
    int last; /* the microbatch whose backward just ran is the step's last */
} tp;

/* '*' matches any run of characters; everything else matches itself. */
static int glob(const char *p, const char *s) {
    if (!*p) return !*s;
    if (*p == '*') {
        for (;; s++) {
            if (glob(p + 1, s)) return 1;
            if (!*s) return 0;
        }
    }
    return *s == *p && glob(p + 1, s + 1);
}

static ct_status tp_create(const ct_host *h, const ct_strategy_env *env, ct_strategy **out) {
    if (!CT_HAS_FIELD(env, ct_strategy_env, sequence_parallel) || !env->tp_plan) {
        h->set_error(h, "tensor parallel needs the model pack's plan (ct_model_api.tp_plan, ABI 1.3)");
        return CT_ERR_INVALID;
    }
    tp *t = calloc(1, sizeof *t);
    if (!t) return CT_ERR_NOMEM;
    t->host = h;
    t->env = *env;
    t->mesh = *env->mesh;
    *out = t;
    return CT_OK;
}

static void tp_destroy(ct_strategy *p) { free(p); }

static ct_tp_style style_of(const tp *t, const char *name) {
    for (const ct_tp_rule *r = t->env.tp_plan; r->pattern; r++)
        if (glob(r->pattern, name)) return r->style;
    return CT_TP_NONE;
}

static ct_status tp_place(ct_strategy *p, ct_param_slot *slots, int n) {
    tp *t = p;
    int parts = t->mesh.degree[CT_AXIS_TP], index = t->mesh.coord[CT_AXIS_TP];
    for (int i = 0; i < n; i++) {
        ct_param_slot *s = &slots[i];
        if (!CT_HAS_FIELD(s, ct_param_slot, global_shape)) {
            t->host->set_error(t->host, "tensor parallel: the host's parameter slots predate ABI 1.3");
            return CT_ERR_UNSUPPORTED;
        }
        if (s->placement == CT_PLACE_NONE) continue; /* another pipeline stage's */
        ct_tensor *w = s->param;
        ct_tp_style st = style_of(t, w->name);
        s->tp_style = st;
        int dim = st == CT_TP_ROWWISE ? 1
                  : (st == CT_TP_COLWISE || st == CT_TP_EMBED_ROWWISE || st == CT_TP_OUTPUT_COLWISE) ? 0
                                                                                                    : -1;
        if (dim < 0) continue;
        if (w->ndim != 2 || w->shape[dim] % parts) {
            t->host->set_error(t->host,
                               "tensor parallel: %s (%lld x %lld) cannot be split in %d along dim %d (the plan says %s)",
                               w->name, (long long)w->shape[0], w->ndim > 1 ? (long long)w->shape[1] : 1LL, parts, dim,
                               dim ? "row-wise" : "column-wise");
            return CT_ERR_INVALID;
        }
        w->shape[dim] /= parts;
        s->tp_dim = dim;
        s->tp_parts = parts;
        s->tp_index = index;
        s->numel = w->shape[0] * w->shape[1];
        s->placement = CT_PLACE_REPLICATE;
        s->local_numel = s->numel;
        s->offset = 0;
    }
    return CT_OK;
}

static ct_status tp_setup(ct_strategy *p, ct_param_slot *slots, int n, int n_units) {
    tp *t = p;
    (void)n_units;
    t->slots = slots;
    t->n_slots = n;
    for (int i = 0; i < n; i++) { /* compute on the local block (a data-parallel strategy repoints these) */
        slots[i].param->data = slots[i].local_data;
        slots[i].param->grad = slots[i].local_grad;
    }
    return CT_OK;
}

static ct_status tp_noop(ct_strategy *p, int unit) {
    (void)p;
    (void)unit;
    return CT_OK;
}

static ct_status tp_post_backward(ct_strategy *p, int unit, int last_microbatch) {
    (void)unit;
    ((tp *)p)->last = last_microbatch;
    return CT_OK;
}

/* Runs after the data-parallel strategy's finish: the local gradients are final but for tp. */
static ct_status tp_finish_backward(ct_strategy *p) {
    tp *t = p;
    if (!t->last || !t->env.sequence_parallel) return CT_OK;
    for (int i = 0; i < t->n_slots; i++) {
        ct_param_slot *s = &t->slots[i];
        if (s->tp_style != CT_TP_SEQUENCE_PARALLEL || s->local_numel == 0) continue;
        ct_status st = t->env.capi->all_reduce(t->env.comm, t->mesh.group[CT_AXIS_TP], s->local_grad, s->local_grad,
                                               s->local_numel, CT_F32, CT_REDUCE_SUM, NULL);
        if (st) return st;
    }
    return CT_OK;
}

static const ct_strategy_api api = {
    .struct_size = sizeof(ct_strategy_api),
    .create = tp_create,
    .destroy = tp_destroy,
    .place = tp_place,
    .setup = tp_setup,
    .pre_forward = tp_noop,
    .post_forward = tp_noop,
    .pre_backward = tp_noop,
    .post_backward = tp_post_backward,
    .finish_backward = tp_finish_backward,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_STRATEGY;
    info->name = "tp";
    info->description = "tensor parallel (Megatron): column/row-wise splits from the model's plan, sequence and loss parallel";
    info->options = NULL;
    info->api = &api;
    return CT_OK;
}
