/* zero.c: Megatron's distributed optimizer as a strategy plugin, built twice from this file:
 * ctitan-zero1.so (ZERO_STAGE 1) and ctitan-zero2.so (ZERO_STAGE 2).
 *
 * The model computes with whole parameters (the host's whole_data, ABI 2.1) while the optimizer
 * steps on a shard of each: the fp32 master weights and the optimizer states are split over
 * dp_shard in FSDP's layout (dim-0 row blocks, the last ones zero-padded). After the optimizer's
 * step, post_step all-gathers the updated shards into whole_data.
 *   zero1: gradients accumulate whole (the host's whole_grad) over every microbatch; after a unit's
 *          last backward they are reduce-scattered (fp32, SUM) into the local gradient shard.
 *   zero2: no whole gradient is kept: each unit's backward writes into a transient zeroed buffer that
 *          is reduce-scattered (accumulating into the shard) after every microbatch and given back.
 * With dp_replicate > 1 the reduced shard is then all-reduced (SUM) over the replicas, as HSDP does.
 */
#include "ctitan/strategy.h"
#include "ctitan/util.h"

#include <stdlib.h>
#include <string.h>

#ifndef ZERO_STAGE
#define ZERO_STAGE 1
#endif

typedef struct unit_state {
    int *params;
    int n;
    int open;                /* backward windows open (pre_backward without its post_backward yet) */
    float **grad;            /* zero2: per param, the transient whole gradient (padded) */
    float **rs_in;           /* zero1: per param, the padded copy reduce-scattered (NULL: whole_grad itself) */
    float **rs_out;          /* zero2: per param, the reduced shard before it is added */
    ct_comm_request **rsreq; /* per param: pending reduce-scatter */
    int rs_pending;
} unit_state;

typedef struct ct_strategy { /* the ABI's opaque ct_strategy */
    const ct_host *host;
    ct_strategy_env env;
    ct_mesh_info mesh;
    int stage;
    ct_param_slot *slots;
    int n_slots, n_units;
    unit_state *units;
    int64_t live[8]; /* bytes of transient buffers held, by ct_mem_category */
} zero;

#define DAPI(z) (z)->env.dapi
#define CAPI(z) (z)->env.capi

static ct_status zero_create(const ct_host *h, const ct_strategy_env *env, ct_strategy **out) {
    int planning = CT_HAS_FIELD(env, ct_strategy_env, planning) && env->planning;
    if (!planning && (!env->capi || !env->mesh->group[CT_AXIS_DP_SHARD])) {
        h->set_error(h, "needs a comm plugin and a dp_shard group");
        return CT_ERR_INVALID;
    }
    zero *z = calloc(1, sizeof *z);
    if (!z) return CT_ERR_NOMEM;
    z->host = h;
    z->env = *env;
    z->mesh = *env->mesh;
    z->stage = ZERO_STAGE;
    *out = z;
    return CT_OK;
}

/* ---- transient buffers: allocated when needed and given back at once, so what a rank holds is
 * the few units in flight, never the whole model's worth (gradients: CT_MEM_GRADS, the padded
 * gather of post_step: CT_MEM_COMM) ---- */
static float *buf_get(zero *z, int64_t n, ct_mem_category cat) {
    void *p = NULL;
    if (DAPI(z)->alloc(z->env.dev, (size_t)n * sizeof(float), &p) != CT_OK) {
        z->host->set_error(z->host, "cannot allocate %lld floats for a transient buffer", (long long)n);
        return NULL;
    }
    z->host->mem_account(z->host, cat, n * (int64_t)sizeof(float));
    z->live[cat] += n * (int64_t)sizeof(float);
    return p;
}

static void buf_put(zero *z, float *p, int64_t n, ct_mem_category cat) {
    if (!p) return;
    DAPI(z)->free(z->env.dev, p);
    z->host->mem_account(z->host, cat, -n * (int64_t)sizeof(float));
    z->live[cat] -= n * (int64_t)sizeof(float);
}

static int64_t full_n(const zero *z, const ct_param_slot *s) { return s->local_numel * z->mesh.degree[CT_AXIS_DP_SHARD]; }

/* FSDP's layout (so a checkpoint moves between the two): dim-0 row blocks over dp_shard, padded. */
static ct_status zero_place(ct_strategy *p, ct_param_slot *slots, int n) {
    zero *z = p;
    int S = z->mesh.degree[CT_AXIS_DP_SHARD], r = z->mesh.coord[CT_AXIS_DP_SHARD];
    z->slots = slots; /* report() reads the placement (a planning instance gets no setup) */
    z->n_slots = n;
    for (int i = 0; i < n; i++) {
        ct_param_slot *s = CT_SLOT_AT(slots, i);
        if (s->placement == CT_PLACE_NONE) continue; /* another pipeline stage's */
        if (!CT_HAS_FIELD(s, ct_param_slot, whole)) {
            z->host->set_error(z->host, "needs a host with whole compute storage (ABI 2.1)");
            return CT_ERR_UNSUPPORTED;
        }
        int64_t rows = s->param->ndim ? s->param->shape[0] : 1, row = s->numel / (rows ? rows : 1);
        int64_t rows_per = (rows + S - 1) / S;
        s->placement = CT_PLACE_SHARD;
        s->shard_axis = CT_AXIS_DP_SHARD;
        s->local_numel = rows_per * row;
        s->offset = (int64_t)r * s->local_numel;
        s->whole = CT_WHOLE_DATA | (z->stage == 1 ? CT_WHOLE_GRAD : 0);
    }
    return CT_OK;
}

static ct_status zero_setup(ct_strategy *p, ct_param_slot *slots, int n, int n_units) {
    zero *z = p;
    z->slots = slots;
    z->n_slots = n;
    z->n_units = n_units;
    z->units = calloc((size_t)n_units, sizeof(unit_state));
    if (!z->units) return CT_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        ct_param_slot *s = CT_SLOT_AT(slots, i);
        if (s->unit < 0 || s->unit >= n_units) return CT_ERR_INVALID;
        if (s->placement == CT_PLACE_NONE) continue;
        if (!s->whole_data || (z->stage == 1 && !s->whole_grad)) {
            z->host->set_error(z->host, "the host gave %s no whole compute storage", s->param->name);
            return CT_ERR_INVALID;
        }
        unit_state *u = &z->units[s->unit];
        int *grown = realloc(u->params, sizeof(int) * (size_t)(u->n + 1));
        if (!grown) return CT_ERR_NOMEM;
        u->params = grown;
        u->params[u->n++] = i;
        if (z->stage == 2) s->param->grad = NULL; /* only inside a backward window */
        if (z->env.bf16_compute) { /* compute with bf16 values from the first step; the shards stay fp32 */
            ct_status st = DAPI(z)->round_bf16(z->env.dev, s->whole_data, s->numel);
            if (st) return st;
        }
    }
    for (int k = 0; k < n_units; k++) {
        unit_state *u = &z->units[k];
        u->grad = calloc((size_t)u->n + 1, sizeof(float *));
        u->rs_in = calloc((size_t)u->n + 1, sizeof(float *));
        u->rs_out = calloc((size_t)u->n + 1, sizeof(float *));
        u->rsreq = calloc((size_t)u->n + 1, sizeof *u->rsreq);
        if (!u->grad || !u->rs_in || !u->rs_out || !u->rsreq) return CT_ERR_NOMEM;
    }
    return CT_OK;
}

/* Waits for unit k's reduce-scatters, sums the shards over replicas (HSDP) and, under zero2, adds
 * them to the local gradient; gives the unit's transient buffers back. */
static ct_status rs_finish(zero *z, int k) {
    unit_state *u = &z->units[k];
    if (!u->rs_pending) return CT_OK;
    ct_status st = CT_OK;
    for (int j = 0; j < u->n; j++) {
        ct_param_slot *s = CT_SLOT_AT(z->slots, u->params[j]);
        ct_status w = u->rsreq[j] ? CAPI(z)->wait(z->env.comm, u->rsreq[j]) : CT_OK; /* every request waited */
        u->rsreq[j] = NULL;
        if (!st) st = w;
        float *shard = z->stage == 2 ? u->rs_out[j] : s->local_grad;
        if (!st && z->mesh.degree[CT_AXIS_DP_REPLICATE] > 1)
            st = CAPI(z)->all_reduce(z->env.comm, z->mesh.group[CT_AXIS_DP_REPLICATE], shard, shard, s->local_numel,
                                     CT_F32, CT_REDUCE_SUM, NULL);
        if (!st && z->stage == 2) st = DAPI(z)->axpy(z->env.dev, s->local_grad, shard, 1.0f, s->local_numel);
        buf_put(z, u->rs_out[j], s->local_numel, CT_MEM_GRADS);
        u->rs_out[j] = NULL;
        buf_put(z, u->rs_in[j], full_n(z, s), CT_MEM_GRADS);
        u->rs_in[j] = NULL;
        if (z->stage == 2 && !u->open) { /* no backward window of the unit needs it any more */
            buf_put(z, u->grad[j], full_n(z, s), CT_MEM_GRADS);
            u->grad[j] = NULL;
            s->param->grad = NULL;
        }
    }
    u->rs_pending = 0;
    return st;
}

/* zero2: fresh zeroed gradients for unit k's backward (the host accumulates into them). */
static ct_status zero_pre_backward(ct_strategy *p, int k) {
    zero *z = p;
    unit_state *u = &z->units[k];
    if (z->stage == 1 || u->open++) return CT_OK; /* a window already open keeps its buffers */
    ct_status st = rs_finish(z, k);               /* the previous microbatch's reduction reads them */
    for (int j = 0; j < u->n && !st; j++) {
        ct_param_slot *s = CT_SLOT_AT(z->slots, u->params[j]);
        if (!u->grad[j] && !(u->grad[j] = buf_get(z, full_n(z, s), CT_MEM_GRADS))) return CT_ERR_NOMEM;
        st = DAPI(z)->zero(z->env.dev, u->grad[j], sizeof(float) * (size_t)full_n(z, s));
        s->param->grad = u->grad[j];
    }
    return st;
}

/* Starts reduce-scattering unit k's gradients into the shard: zero1 after the unit's last backward
 * (its whole gradient is complete), zero2 after every one. */
static ct_status zero_post_backward(ct_strategy *p, int k, int last_microbatch) {
    zero *z = p;
    unit_state *u = &z->units[k];
    if (z->stage == 2 && u->open > 0) u->open--;
    if (z->stage == 1 && !last_microbatch) return CT_OK; /* accumulate whole until the step's last */
    ct_status st = rs_finish(z, k);
    for (int j = 0; j < u->n && !st; j++) {
        ct_param_slot *s = CT_SLOT_AT(z->slots, u->params[j]);
        const float *in = z->stage == 2 ? u->grad[j] : s->whole_grad;
        float *out = s->local_grad; /* zero1: the step's only write into the zeroed shard */
        if (z->stage == 1 && full_n(z, s) != s->numel) { /* the padded rows, zero */
            if (!(u->rs_in[j] = buf_get(z, full_n(z, s), CT_MEM_GRADS))) return CT_ERR_NOMEM;
            st = DAPI(z)->zero(z->env.dev, u->rs_in[j], sizeof(float) * (size_t)full_n(z, s));
            if (!st)
                st = DAPI(z)->copy(z->env.dev, u->rs_in[j], in, sizeof(float) * (size_t)s->numel, CT_COPY_D2D);
            in = u->rs_in[j];
        }
        if (z->stage == 2 && !(out = u->rs_out[j] = buf_get(z, s->local_numel, CT_MEM_GRADS))) return CT_ERR_NOMEM;
        if (!st)
            st = CAPI(z)->reduce_scatter(z->env.comm, z->mesh.group[CT_AXIS_DP_SHARD], in, out, s->local_numel, CT_F32,
                                         CT_REDUCE_SUM, &u->rsreq[j]);
    }
    u->rs_pending = u->n > 0;
    if (st) return st;
    if (z->stage == 2 && u->open) { /* another microbatch's window still writes into the buffers: they
                                       start again from zero once this reduction has read them */
        st = rs_finish(z, k);
        for (int j = 0; j < u->n && !st; j++)
            st = DAPI(z)->zero(z->env.dev, u->grad[j],
                               sizeof(float) * (size_t)full_n(z, CT_SLOT_AT(z->slots, u->params[j])));
        if (st) return st;
    }
    /* one unit's reductions in flight at a time: finish the unit after this one */
    return k + 1 < z->n_units ? rs_finish(z, k + 1) : CT_OK;
}

static ct_status zero_finish_backward(ct_strategy *p) {
    zero *z = p;
    for (int k = 0; k < z->n_units; k++) {
        ct_status st = rs_finish(z, k);
        if (st) return st;
    }
    return CT_OK;
}

/* The updated shards back into the whole compute copies: one all-gather per parameter into a
 * padded buffer when the rows do not divide evenly, else straight into whole_data. */
static ct_status zero_post_step(ct_strategy *p) {
    zero *z = p;
    ct_status st = CT_OK;
    for (int i = 0; i < z->n_slots && !st; i++) {
        ct_param_slot *s = CT_SLOT_AT(z->slots, i);
        if (s->placement == CT_PLACE_NONE || !s->whole_data) continue;
        int64_t n = full_n(z, s);
        float *dst = n == s->numel ? s->whole_data : buf_get(z, n, CT_MEM_COMM);
        if (!dst) return CT_ERR_NOMEM;
        st = CAPI(z)->all_gather(z->env.comm, z->mesh.group[CT_AXIS_DP_SHARD], s->local_data, dst, s->local_numel, CT_F32,
                                 NULL);
        if (!st && dst != s->whole_data)
            st = DAPI(z)->copy(z->env.dev, s->whole_data, dst, sizeof(float) * (size_t)s->numel, CT_COPY_D2D);
        if (dst != s->whole_data) buf_put(z, dst, n, CT_MEM_COMM);
        if (!st && z->env.bf16_compute) st = DAPI(z)->round_bf16(z->env.dev, s->whole_data, s->numel);
    }
    return st;
}

/* Own memory: zero2's transient gradients (a unit's whole gradient and its shard, two neighbouring
 * units at once while the later one's reduction is in flight), zero1's padded copies of uneven
 * gradients, post_step's padded gather; per step: one reduce-scatter per unit (zero2: per
 * microbatch), its all-reduce over replicas, one all-gather of every shard after the step. */
static ct_status zero_report(ct_strategy *p, int n_microbatches, ct_strategy_report *out) {
    zero *z = p;
    int S = z->mesh.degree[CT_AXIS_DP_SHARD], R = z->mesh.degree[CT_AXIS_DP_REPLICATE];
    int nu = 0;
    for (int i = 0; i < z->n_slots; i++) {
        const ct_param_slot *s = CT_SLOT_AT(z->slots, i);
        if (s->placement != CT_PLACE_NONE && s->unit + 1 > nu) nu = s->unit + 1;
    }
    int64_t *unit_full = calloc((size_t)nu + 1, sizeof(int64_t)), *unit_local = calloc((size_t)nu + 1, sizeof(int64_t));
    int64_t *unit_tmp = calloc((size_t)nu + 1, sizeof(int64_t));
    if (!unit_full || !unit_local || !unit_tmp) {
        free(unit_full);
        free(unit_local);
        free(unit_tmp);
        return CT_ERR_NOMEM;
    }
    int64_t gather_tmp = 0;
    for (int i = 0; i < z->n_slots; i++) {
        const ct_param_slot *s = CT_SLOT_AT(z->slots, i);
        if (s->placement == CT_PLACE_NONE) continue;
        int64_t full = s->local_numel * S * (int64_t)sizeof(float), padded = s->local_numel * S != s->numel;
        unit_full[s->unit] += full;
        unit_local[s->unit] += s->local_numel * (int64_t)sizeof(float);
        /* zero2: the whole gradient and its shard; zero1: a padded copy of an uneven one */
        unit_tmp[s->unit] += z->stage == 2 ? full + s->local_numel * (int64_t)sizeof(float) : padded ? full : 0;
        if (padded && full > gather_tmp) gather_tmp = full;
    }
    ct_util_report_clear(out);
    /* post_backward(k) takes unit k's buffers while unit k + 1's reduction is in flight (it is
     * finished right after): two neighbours at once, never two units further apart */
    int64_t peak = 0;
    for (int k = 0; k < nu; k++) {
        int64_t pair = unit_tmp[k] + (k + 1 < nu ? unit_tmp[k + 1] : 0);
        if (pair > peak) peak = pair;
    }
    out->mem_bytes[CT_MEM_GRADS] = peak;
    out->mem_bytes[CT_MEM_COMM] = gather_tmp;
    double per_step = z->stage == 2 ? (double)(n_microbatches > 0 ? n_microbatches : 1) : 1.0;
    for (int i = 0; i < z->n_slots; i++) { /* one reduction per parameter, as the hooks issue them */
        const ct_param_slot *s = CT_SLOT_AT(z->slots, i);
        if (s->placement == CT_PLACE_NONE) continue;
        double local = (double)s->local_numel * sizeof(float);
        ct_util_report_comm(out, CT_AXIS_DP_SHARD, CT_COLL_REDUCE_SCATTER, s->unit, CT_PHASE_BACKWARD, local * S, per_step, 1);
        if (R > 1) ct_util_report_comm(out, CT_AXIS_DP_REPLICATE, CT_COLL_ALL_REDUCE, s->unit, CT_PHASE_BACKWARD, local, per_step, 0);
    }
    for (int i = 0; i < z->n_slots; i++) { /* post_step: one gather per parameter */
        const ct_param_slot *s = CT_SLOT_AT(z->slots, i);
        if (s->placement != CT_PLACE_NONE)
            ct_util_report_comm(out, CT_AXIS_DP_SHARD, CT_COLL_ALL_GATHER, s->unit, CT_PHASE_STEP,
                     (double)s->local_numel * sizeof(float) * S, 1.0, 0);
    }
    free(unit_full);
    free(unit_local);
    free(unit_tmp);
    return CT_OK;
}

static void zero_destroy(ct_strategy *p) {
    zero *z = p;
    if (!z) return;
    for (int k = 0; z->units && k < z->n_units; k++) {
        unit_state *u = &z->units[k];
        for (int j = 0; u->rsreq && j < u->n; j++)
            if (u->rsreq[j]) CAPI(z)->wait(z->env.comm, u->rsreq[j]); /* never free under a reduction */
        /* the slots may be gone: buffers still held are freed here and uncounted from `live` below */
        for (int j = 0; u->grad && j < u->n; j++) {
            float *b[3] = {u->grad[j], u->rs_in[j], u->rs_out[j]};
            for (int q = 0; q < 3; q++)
                if (b[q]) DAPI(z)->free(z->env.dev, b[q]);
        }
        free(u->params);
        free(u->grad);
        free(u->rs_in);
        free(u->rs_out);
        free(u->rsreq);
    }
    for (int c = 0; c < 8; c++) /* the buffers freed above */
        if (z->live[c]) z->host->mem_account(z->host, (ct_mem_category)c, -z->live[c]);
    free(z->units);
    free(z);
}

static const ct_strategy_api api = {
    .struct_size = sizeof(ct_strategy_api),
    .create = zero_create,
    .destroy = zero_destroy,
    .place = zero_place,
    .setup = zero_setup,
    .pre_forward = ct_util_unit_noop,
    .post_forward = ct_util_unit_noop,
    .pre_backward = zero_pre_backward,
    .post_backward = zero_post_backward,
    .finish_backward = zero_finish_backward,
    .post_step = zero_post_step,
    .report = zero_report,
    .serves = CT_SERVES_DATA_PARALLEL,
    .axis = -1,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_STRATEGY;
#if ZERO_STAGE == 2
    info->name = "zero2";
    info->description = "ZeRO-2 (distributed optimizer): master weights, optimizer states and gradients sharded over "
                        "dp_shard, whole compute parameters";
#else
    info->name = "zero1";
    info->description = "ZeRO-1 (Megatron's distributed optimizer): master weights and optimizer states sharded over "
                        "dp_shard, whole compute parameters and gradients";
#endif
    info->options = NULL;
    info->api = &api;
    return CT_OK;
}
