/* ep.c: expert parallel (torchtitan's expert_parallel_degree) as an operation-level strategy.
 *
 * The ep group (ct_mesh_info.ep_group, ABI 2.17: ep consecutive ranks of dp_shard x cp) splits every
 * stacked experts parameter the pack declared with CT_TENSOR_EXPERTS along dim 0: rank r holds experts
 * r*e/ep .. (r+1)*e/ep - 1 (split over CT_AXIS_EP), which the data-parallel strategy then shards over
 * efsdp, the ranks holding the same experts (fsdp does). The builder's moe_experts is wrapped: its rows
 * come sorted by expert, so the rows for rank j are one contiguous run, offsets[j*el] ..
 * offsets[(j+1)*el] (el = e/ep experts per rank):
 *   1. counts: each rank's offsets of every other rank's experts go out by one equal all-to-all on the
 *      device, and the (ep, el+1) offsets that come back are read once: the only read to the host, the
 *      row counts the variable all-to-all and the shapes need;
 *   2. dispatch: the builder's all_to_all_v (rows by those counts), then the rows put in expert order
 *      (from rank 0's rows of expert 0, rank 1's of expert 0, ... to the last rank's of the last);
 *   3. the next builder's moe_experts on this rank's experts, with their offsets;
 *   4. combine: the rows put back in source order and the all_to_all_v back.
 * Every step is differentiable (the reorders are the device's moe_gather with k = 1), so the experts'
 * gradients are the sums over every token routed to them, whichever rank it came from.
 */
#include "ctitan/strategy.h"
#include "ctitan/util.h"

#include <stdlib.h>
#include <string.h>

#define EP_MAX_UNITS 1024

typedef struct ct_strategy { /* the ABI's opaque ct_strategy */
    const ct_host *host;
    ct_strategy_env env;
    int size, rank; /* ep */
    ct_builder *next;
    int n_experts;  /* split parameters seen by place */
    int64_t el;     /* experts per rank (the split parameters' dim 0) */
    int units[EP_MAX_UNITS], n_units; /* the units holding experts: one routing exchange each per microbatch */
} ep;

#define EP(b) ((ep *)(b)->ctx)

static ct_status ep_create(const ct_host *h, const ct_strategy_env *env, ct_strategy **out) {
    const ct_mesh_info *m = env->mesh;
    int planning = CT_HAS_FIELD(env, ct_strategy_env, planning) && env->planning;
    if (!CT_HAS_FIELD(m, ct_mesh_info, efsdp_size) || m->ep_size < 2) {
        h->set_error(h, "expert parallel needs a host of ABI 2.17 or later with expert_parallel_degree > 1");
        return CT_ERR_UNSUPPORTED;
    }
    if (!planning && !(CT_HAS_FIELD(env->capi, ct_comm_api, all_to_allv) && env->capi->all_to_allv)) {
        h->set_error(h, "expert parallel needs the comm plugin's all_to_allv (ABI 2.17)");
        return CT_ERR_UNSUPPORTED;
    }
    if (!planning && !(CT_HAS_FIELD(env->dapi, ct_device_api, moe_combine_backward) && env->dapi->moe_gather_forward)) {
        h->set_error(h, "expert parallel needs the device's mixture-of-experts ops (ABI 2.14)");
        return CT_ERR_UNSUPPORTED;
    }
    ep *e = calloc(1, sizeof *e);
    if (!e) return CT_ERR_NOMEM;
    e->host = h;
    e->env = *env;
    e->size = m->ep_size;
    e->rank = m->ep_rank;
    *out = e;
    return CT_OK;
}

static void ep_destroy(ct_strategy *p) { free(p); }

/* Every CT_TENSOR_EXPERTS parameter: this rank's experts, dim 0 split in ep. */
static ct_status ep_place(ct_strategy *p, ct_param_slot *slots, int n) {
    ep *e = p;
    for (int i = 0; i < n; i++) {
        ct_param_slot *s = CT_SLOT_AT(slots, i);
        ct_tensor *w = s->param;
        if (!(w->flags & CT_TENSOR_EXPERTS)) continue;
        if (w->ndim < 2 || w->shape[0] % e->size || s->split_dim >= 0) {
            e->host->set_error(e->host, "parallelism.expert_parallel_degree: %s (%lld experts) cannot be split over %d "
                               "ranks%s", w->name, (long long)(w->ndim ? w->shape[0] : 0), e->size,
                               s->split_dim >= 0 ? " (another strategy split it already)" : "");
            return CT_ERR_INVALID;
        }
        w->shape[0] /= e->size;
        s->numel /= e->size;
        s->split_axis = CT_AXIS_EP;
        s->split_dim = 0;
        s->split_parts = e->size;
        s->split_index = e->rank;
        e->el = w->shape[0];
        e->n_experts++;
        if (s->placement == CT_PLACE_NONE) continue; /* another pipeline stage's: no routing exchange here */
        if (e->n_units < EP_MAX_UNITS && (!e->n_units || e->units[e->n_units - 1] != s->unit)) e->units[e->n_units++] = s->unit;
        s->placement = CT_PLACE_REPLICATE;
        s->local_numel = s->numel;
        s->offset = 0;
    }
    if (!e->n_experts) {
        e->host->set_error(e->host, "parallelism.expert_parallel_degree: the model declares no experts "
                           "(CT_TENSOR_EXPERTS); expert parallel needs a mixture-of-experts model");
        return CT_ERR_INVALID;
    }
    return CT_OK;
}

static ct_status ep_setup(ct_strategy *p, ct_param_slot *slots, int n, int n_units) {
    (void)p;
    (void)n_units;
    ct_util_use_local_storage(slots, n);
    return CT_OK;
}

/* ---- reorder: y row j = x row order[j] (moe_gather with k = 1), backward by the inverse ---- */

typedef struct reorder_state {
    int64_t m, d;
} reorder_state;

static ct_status reorder_forward(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out,
                                 int n_out) {
    (void)n_in;
    (void)n_out;
    const reorder_state *s = state;
    const ct_device_api *d;
    ct_device *dev;
    ct_status st = b->device(b, &d, &dev); /* b is the host's builder here, not this strategy's layer */
    if (st != CT_OK) return st;
    if (!(out[0] = b->new_tensor(b, CT_F32, 2, (int64_t[]){s->m, s->d}))) return CT_ERR_NOMEM;
    return d->moe_gather_forward(dev, out[0]->data, in[0]->data, in[1]->data, s->m, 1, s->d);
}

static ct_status reorder_backward(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                                  const float *const *dy, int n_out, int halves) {
    (void)n_in;
    (void)n_out;
    (void)out;
    if (!(halves & CT_GRAD_INPUT) || !dy[0]) return CT_OK;
    const reorder_state *s = state;
    const ct_device_api *d;
    ct_device *dev;
    ct_status st = b->device(b, &d, &dev);
    if (st != CT_OK) return st;
    float *dx = b->grad(b, in[0]);
    if (!dx) return CT_ERR_NOMEM;
    return d->moe_gather_backward(dev, dx, dy[0], in[2]->data, s->m, 1, s->d);
}

static ct_status reorder_plan(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                              ct_op_cost *cost) {
    (void)in;
    (void)n_in;
    (void)n_out;
    const reorder_state *s = state;
    cost->bytes[0] = cost->bytes[1] = 8.0 * (double)(s->m * s->d);
    return (out[0] = b->new_tensor(b, CT_F32, 2, (int64_t[]){s->m, s->d})) ? CT_OK : CT_ERR_NOMEM;
}

static const ct_custom_op reorder_op = {sizeof(ct_custom_op), "ep_reorder", reorder_forward, reorder_backward,
                                        reorder_plan};

/* x (m, d) -> rows in `order` (int32 (m) device tensors order and inv, inv its inverse). */
static ct_tensor *reorder(ct_builder *n, ct_tensor *x, ct_tensor *order, ct_tensor *inv) {
    reorder_state s = {x->shape[0], x->shape[1]};
    ct_tensor *in[3] = {x, order, inv}, *y;
    return n->custom(n, &reorder_op, &s, sizeof s, in, 3, &y, 1) == CT_OK ? y : NULL;
}

/* An int32 device tensor holding host values. */
static ct_tensor *ints(ct_builder *n, ep *e, const int32_t *v, int64_t len) {
    ct_tensor *t = n->new_tensor(n, CT_I32, 1, (int64_t[]){len > 0 ? len : 1});
    if (!t || n->planning || len <= 0) return t;
    return e->env.dapi->copy(e->env.dev, t->data, v, sizeof(int32_t) * (size_t)len, CT_COPY_H2D) == CT_OK ? t : NULL;
}

/* ---- moe_experts over the ep group ---- */

static ct_tensor *ep_moe_experts(ct_builder *b, ct_tensor *x, const ct_tensor *offsets, ct_tensor *w1, ct_tensor *w3,
                                 ct_tensor *w2) {
    ep *e = EP(b);
    ct_builder *n = e->next;
    const ct_device_api *d = e->env.dapi;
    int P = e->size, me = e->rank;
    int64_t el = w1->shape[0], E = el * P, dm = x->shape[1], m = x->shape[0];
    if (offsets->ndim != 1 || offsets->shape[0] != E + 1) {
        e->host->set_error(e->host, "expert parallel: %lld offsets for %d ranks of %lld experts",
                           (long long)offsets->shape[0], P, (long long)el);
        return NULL;
    }
    int64_t *send = calloc((size_t)P * 2, sizeof(int64_t)), *recv = send ? send + P : NULL;
    int32_t *all = malloc(sizeof(int32_t) * (size_t)(2 * P * (el + 1))), *order = NULL, *lo = NULL;
    ct_tensor *y = NULL;
    void *buf = NULL;
    if (!send || !all) goto nomem;
    int32_t *mine = all + P * (el + 1); /* (P, el+1): rank j's own offsets of my experts */
    if (n->planning) { /* balanced rows: what the plan prices */
        for (int j = 0; j < P; j++) send[j] = recv[j] = m / P;
        send[P - 1] += m % P, recv[P - 1] += m % P;
    } else {
        /* 1. counts: block j of the send buffer is offsets[j*el .. (j+1)*el] (el+1 ints) */
        if (d->alloc(e->env.dev, sizeof(int32_t) * (size_t)(2 * P * (el + 1)), &buf) != CT_OK) goto nomem;
        int32_t *sb = buf, *rb = sb + P * (el + 1);
        ct_status st = CT_OK;
        for (int j = 0; j < P && st == CT_OK; j++)
            st = d->copy(e->env.dev, sb + j * (el + 1), (const int32_t *)offsets->data + j * el,
                         sizeof(int32_t) * (size_t)(el + 1), CT_COPY_D2D);
        if (st == CT_OK)
            st = e->env.capi->all_to_all(e->env.comm, e->env.mesh->ep_group, sb, rb, el + 1, CT_I32, NULL);
        if (st == CT_OK) st = d->copy(e->env.dev, all, sb, sizeof(int32_t) * (size_t)(2 * P * (el + 1)), CT_COPY_D2H);
        d->free(e->env.dev, buf);
        buf = NULL;
        if (st != CT_OK) goto fail;
        for (int j = 0; j < P; j++) {
            send[j] = all[j * (el + 1) + el] - all[j * (el + 1)];
            recv[j] = mine[j * (el + 1) + el] - mine[j * (el + 1)];
        }
    }
    /* 2. dispatch */
    ct_tensor *xr = n->all_to_all_v(n, x, CT_AXIS_EP, send, recv);
    if (!xr) goto fail;
    int64_t mr = xr->shape[0];
    if (!(order = malloc(sizeof(int32_t) * (size_t)(2 * mr + el + 2)))) goto nomem;
    int32_t *inv = order + mr;
    lo = inv + mr;
    if (!n->planning) { /* expert-major: expert g's rows from rank 0, then rank 1, ... */
        int64_t at = 0, src = 0;
        for (int64_t g = 0; g < el; g++) {
            lo[g] = (int32_t)at;
            for (int j = 0; j < P; j++) {
                src = 0;
                for (int q = 0; q < j; q++) src += mine[q * (el + 1) + el] - mine[q * (el + 1)];
                int64_t first = src + mine[j * (el + 1) + g] - mine[j * (el + 1)],
                        cnt = mine[j * (el + 1) + g + 1] - mine[j * (el + 1) + g];
                for (int64_t r = 0; r < cnt; r++, at++) {
                    order[at] = (int32_t)(first + r);
                    inv[first + r] = (int32_t)at;
                }
            }
        }
        lo[el] = (int32_t)at;
    } else {
        for (int64_t g = 0; g <= el; g++) lo[g] = (int32_t)(g * mr / el);
    }
    ct_tensor *ord = ints(n, e, order, mr), *iv = ints(n, e, inv, mr), *lof = ints(n, e, lo, el + 1);
    ct_tensor *xs, *ys, *yb;
    if (!ord || !iv || !lof || !(lof = n->view(n, lof, 1, (int64_t[]){el + 1})) || !(xs = mr ? reorder(n, xr, ord, iv) : xr))
        goto fail;
    /* 3. this rank's experts */
    if (!(ys = n->moe_experts(n, xs, lof, w1, w3, w2))) goto fail;
    /* 4. combine: back in source order, then home */
    if (!(yb = mr ? reorder(n, ys, iv, ord) : ys) || !(y = n->all_to_all_v(n, yb, CT_AXIS_EP, recv, send))) goto fail;
    (void)me;
    (void)dm;
    free(send);
    free(all);
    free(order);
    return y;
nomem:
    e->host->set_error(e->host, "expert parallel: out of memory for the routing counts");
fail:
    if (buf) d->free(e->env.dev, buf);
    free(send);
    free(all);
    free(order);
    return NULL;
}

static ct_status ep_wrap_builder(ct_strategy *p, ct_builder *next, ct_builder *out) {
    ep *e = p;
    if (!CT_HAS_FIELD(next, ct_builder, all_to_all_v) || !next->all_to_all_v || !next->moe_experts) {
        e->host->set_error(e->host, "expert parallel needs a host of ABI 2.17 (the builder's all_to_all_v)");
        return CT_ERR_UNSUPPORTED;
    }
    e->next = next;
    out->ctx = e;
    out->moe_experts = ep_moe_experts;
    return CT_OK;
}

static ct_status ep_post_backward(ct_strategy *s, int unit, int last) {
    (void)s;
    (void)unit;
    (void)last;
    return CT_OK;
}
static ct_status ep_finish_backward(ct_strategy *s) {
    (void)s;
    return CT_OK;
}

/* What the planner asks: nothing allocated here that the host does not count (the dispatched rows and
 * their reorders are tape tensors, the all_to_all_v the builder's, which the planner sees per
 * microbatch); the routing counts' equal all-to-all, (ep, el+1) int32 per MoE layer and microbatch,
 * blocking in forward. */
static ct_status ep_report(ct_strategy *p, int n_microbatches, ct_strategy_report *out) {
    ep *e = p;
    ct_util_report_clear(out);
    double bytes = (double)e->size * (double)(e->el + 1) * sizeof(int32_t);
    for (int i = 0; i < e->n_units; i++)
        ct_util_report_comm(out, CT_AXIS_EP, CT_COLL_ALL_TO_ALL, e->units[i], CT_PHASE_FORWARD, bytes,
                            n_microbatches > 0 ? n_microbatches : 1, 0);
    return CT_OK;
}

static const ct_strategy_api api = {
    .struct_size = sizeof(ct_strategy_api),
    .create = ep_create,
    .destroy = ep_destroy,
    .place = ep_place,
    .setup = ep_setup,
    .pre_forward = ct_util_unit_noop,
    .post_forward = ct_util_unit_noop,
    .pre_backward = ct_util_unit_noop,
    .post_backward = ep_post_backward,
    .finish_backward = ep_finish_backward,
    .wrap_builder = ep_wrap_builder,
    .report = ep_report,
    .serves = CT_SERVES_AXIS,
    .axis = CT_AXIS_EP,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_STRATEGY;
    info->name = "ep";
    info->description = "expert parallel: MoE experts split over parallelism.expert_parallel_degree ranks of dp_shard x "
                        "cp, tokens exchanged by a variable all-to-all";
    info->api = &api;
    return CT_OK;
}
