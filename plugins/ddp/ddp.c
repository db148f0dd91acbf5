/* ddp.c: DDP as a strategy plugin, written against the public SDK only (the way a third party
 * adds a strategy). Every rank holds every parameter; after the step's last backward each unit's
 * gradients are all-reduced (SUM: the loss is already normalised by the global token count) as one
 * bucket per unit, started as soon as the unit's backward ends so they overlap the rest. */
#include "ctitan/strategy.h"
#include "ctitan/util.h"

#include <stdlib.h>
#include <string.h>

typedef struct ct_strategy { /* the ABI's opaque ct_strategy */
    const ct_host *host;
    ct_strategy_env env;
    ct_mesh_info mesh;
    ct_param_slot *slots;
    int n_slots, n_units;
    ct_comm_request **req; /* per slot: pending all_reduce */
} ddp;

static ct_status ddp_create(const ct_host *h, const ct_strategy_env *env, ct_strategy **out) {
    if (env->mesh->degree[CT_AXIS_DP_SHARD] > 1) {
        h->set_error(h, "DDP replicates only; use fsdp for data_parallel_shard_degree > 1");
        return CT_ERR_INVALID;
    }
    ddp *d = calloc(1, sizeof *d);
    if (!d) return CT_ERR_NOMEM;
    d->host = h;
    d->env = *env;
    d->mesh = *env->mesh;
    *out = d;
    return CT_OK;
}

static void ddp_destroy(ct_strategy *p) {
    ddp *d = p;
    if (!d) return;
    free(d->req);
    free(d);
}

static ct_status ddp_place(ct_strategy *p, ct_param_slot *slots, int n) {
    (void)p;
    for (int i = 0; i < n; i++) {
        if (CT_SLOT_AT(slots, i)->placement == CT_PLACE_NONE) continue; /* another pipeline stage's */
        CT_SLOT_AT(slots, i)->placement = CT_PLACE_REPLICATE;
        CT_SLOT_AT(slots, i)->local_numel = CT_SLOT_AT(slots, i)->numel;
        CT_SLOT_AT(slots, i)->offset = 0;
    }
    return CT_OK;
}

static ct_status ddp_setup(ct_strategy *p, ct_param_slot *slots, int n, int n_units) {
    ddp *d = p;
    d->slots = slots;
    d->n_slots = n;
    d->n_units = n_units;
    d->req = calloc((size_t)n + 1, sizeof *d->req);
    if (!d->req) return CT_ERR_NOMEM;
    for (int i = 0; i < n; i++) { /* the model computes on the replica itself */
        CT_SLOT_AT(slots, i)->param->data = CT_SLOT_AT(slots, i)->local_data;
        CT_SLOT_AT(slots, i)->param->grad = CT_SLOT_AT(slots, i)->local_grad;
    }
    return CT_OK;
}

static ct_status ddp_post_backward(ct_strategy *p, int unit, int last_microbatch) {
    ddp *d = p;
    if (!last_microbatch) return CT_OK; /* accumulate locally until the step's last microbatch */
    for (int i = 0; i < d->n_slots; i++) {
        if (CT_SLOT_AT(d->slots, i)->unit != unit || CT_SLOT_AT(d->slots, i)->placement == CT_PLACE_NONE) continue;
        ct_status st = d->env.capi->all_reduce(d->env.comm, d->mesh.group[CT_AXIS_DP_REPLICATE], CT_SLOT_AT(d->slots, i)->local_grad,
                                               CT_SLOT_AT(d->slots, i)->local_grad, CT_SLOT_AT(d->slots, i)->numel, CT_F32, CT_REDUCE_SUM,
                                               &d->req[i]);
        if (st) return st;
    }
    return CT_OK;
}

static ct_status ddp_finish_backward(ct_strategy *p) {
    ddp *d = p;
    for (int i = 0; i < d->n_slots; i++) {
        if (!d->req[i]) continue;
        ct_status st = d->env.capi->wait(d->env.comm, d->req[i]);
        d->req[i] = NULL;
        if (st) return st;
    }
    return CT_OK;
}

/* place(), keeping the slots for report() (a planning instance gets no setup). */
static ct_status ddp_place_kept(ct_strategy *p, ct_param_slot *slots, int n) {
    ddp *d = p;
    d->slots = slots;
    d->n_slots = n;
    return ddp_place(p, slots, n);
}

/* No buffers of its own (the replicas' gradients are reduced in place); per step one all-reduce of
 * each parameter's gradient over dp_replicate after the last microbatch, overlapping the backward. */
static ct_status ddp_report(ct_strategy *p, int n_microbatches, ct_strategy_report *out) {
    ddp *d = p;
    (void)n_microbatches; /* reduced once per step whatever the count */
    ct_util_report_clear(out);
    for (int i = 0; i < d->n_slots; i++) {
        const ct_param_slot *s = CT_SLOT_AT(d->slots, i);
        if (s->placement == CT_PLACE_NONE || d->mesh.degree[CT_AXIS_DP_REPLICATE] <= 1) continue;
        ct_util_report_comm(out, CT_AXIS_DP_REPLICATE, CT_COLL_ALL_REDUCE, s->unit, CT_PHASE_BACKWARD,
                            (double)s->numel * sizeof(float), 1.0, 1);
    }
    return CT_OK;
}

static const ct_strategy_api api = {
    .struct_size = sizeof(ct_strategy_api),
    .create = ddp_create,
    .destroy = ddp_destroy,
    .place = ddp_place_kept,
    .setup = ddp_setup,
    .pre_forward = ct_util_unit_noop,
    .post_forward = ct_util_unit_noop,
    .pre_backward = ct_util_unit_noop,
    .post_backward = ddp_post_backward,
    .finish_backward = ddp_finish_backward,
    .report = ddp_report,
    .serves = CT_SERVES_DATA_PARALLEL,
    .axis = -1,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_STRATEGY;
    info->name = "ddp";
    info->description = "DDP: replicated parameters, gradients all-reduced per unit after the last microbatch";
    info->options = NULL;
    info->api = &api;
    return CT_OK;
}
