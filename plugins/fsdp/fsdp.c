/* fsdp.c: FSDP2 semantics as a strategy plugin (and HSDP when dp_replicate > 1).
 *
 * Every parameter is flattened and sharded over the dp_shard axis (under context parallel over
 * torchtitan's dp_shard x cp, so the reduce-scatter also sums the cp ranks' partial gradients) in dim-0 row blocks, padded so
 * each rank holds the same count. Before a unit's forward its parameters are all-gathered (the next
 * unit's gather is started as a prefetch), after it they are freed per the reshard policy, before
 * its backward gathered again; after its backward the full gradients are reduce-scattered (fp32,
 * SUM) into the local shard, and with HSDP then all-reduced (SUM) over dp_replicate. The optimizer
 * sees shards only. Gathered buffers come from a small cache, counted as communication memory.
 *
 * Under bf16 compute (training.mixed_precision_param: bfloat16) a unit that stays gathered between
 * its windows (reshard never, which pipeline parallel implies; not under a schedule that splits
 * backward, whose windows of one unit overlap) is gathered and kept in bf16, as
 * torchtitan's param_dtype keeps it, and expanded to f32 only while a forward or backward window of
 * the unit is open: half the bytes held and moved, the same values as an f32 gather rounded to bf16
 * in place, which is what a unit resharded after its forward still gets. With float8 all-gather
 * such a unit keeps its converted weights as the gathered e4m3 bytes (in f32 or bf16 compute) and
 * dequantizes them again for each window: the same values, a quarter of the f32 bytes held.
 *
 * Under pipeline parallel the hooks run per microbatch in the schedule's order (strategy.h). A unit
 * then stays gathered for the whole step (no resharding between microbatches), its full gradients
 * accumulate in one buffer across microbatches and are reduce-scattered once, at post_backward with
 * last set (PyTorch's pipelining syncs gradients only on the last microbatch). Zero-bubble windows
 * of one unit may overlap, so each unit counts its open backward windows and nothing it holds is
 * given back while one is open.
 *
 * A parameter whose group is one rank (experts with efsdp 1, or dp_shard x cp 1 under an explicit
 * fsdp) is its own shard: no gather, no reduce-scatter. In f32 compute the shard itself is the
 * parameter; under bf16 compute its rounded values are made from the shard for each window
 * (rounds_own), under the float8 all-gather its e4m3 copy as before. Its gradient accumulates
 * in the local gradient directly (see grad_in_place).
 */
#include "ctitan/strategy.h"
#include "ctitan/util.h"

#include <stdlib.h>
#include <string.h>

typedef struct buf {
    float *p;
    int64_t n;
} buf;

typedef struct unit_state {
    int *params;
    int n;
    float **q8_local, **q8_full; /* float8 all-gather: this rank's e4m3 shard and the gathered bytes */
    float **h_local, **h_full;   /* bf16 all-gather: this rank's bf16 shard and the gathered values */
    int64_t *h_n;                /* their sizes in floats: [2j] h_full's, [2j + 1] h_local's */
    int fwd_open;                /* between pre_forward and post_forward */
    int gathered;            /* full parameters valid (or being gathered) */
    float **full;            /* per param: its gathered buffer while gathered (owned here, so destroy frees it) */
    int64_t *full_numel;
    ct_comm_request **greq;  /* per param: pending all_gather */
    float **rs_out;          /* per param: reduce-scatter output (local_numel) */
    ct_comm_request **rsreq; /* per param: pending reduce-scatter */
    int rs_pending;
    int windows;             /* backward windows open: pre_backward calls not yet closed by post_backward */
    int grads;               /* full gradient buffers held (accumulating) */
    char *gin;               /* per param: its gradient accumulates in the local shard itself (grad_in_place) */
} unit_state;

typedef struct ct_strategy { /* the ABI's opaque ct_strategy */
    const ct_host *host;
    ct_strategy_env env;
    ct_mesh_info mesh;
    int reshard; /* 0 never, 1 default, 2 always */
    ct_param_slot *slots;
    int n_slots, n_units;
    unit_state *units;
    buf *cache; /* free full-size buffers */
    int n_cache, cap_cache;
    int fp8;           /* gather converted weights in float8 */
    float *dev_scales; /* per slot: the float8 scale of its gather (device) */
    float *host_scales;
    int scales_fresh;  /* host/dev_scales match the current weights (cleared after each backward) */
    int sync_last;     /* pipeline parallel: keep gathers and full gradients until post_backward's last */
    int saw_last;      /* a post_backward with last since the previous finish_backward */
    int split;         /* the pipeline schedule splits backward (ABI 2.6): windows of a unit overlap */
    int fresh;         /* the next backward is a step's first (the local gradients are zero) */
    /* what it shards over: dp_shard, or under context parallel torchtitan's dp_shard x cp (ABI 2.3),
     * whose reduce-scatter also sums the cp ranks' partial gradients */
    int axis, S, r;
    ct_comm_group *group;
} fsdp;

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "fsdp_reshard_after_forward", CT_OPT_STRING, "default",
     "default (reshard after forward but the last unit) | always | never", NULL, "default|always|never"},
    {0},
};

#define DAPI(f) (f)->env.dapi
#define CAPI(f) (f)->env.capi

static ct_comm_group *shard_group(fsdp *f) { return f->group; }

/* ABI 2.17: experts split over ep (CT_AXIS_EP) are sharded over efsdp, the ranks that hold the same
 * experts; every other slot over the strategy's own axis. */
static int on_efsdp(const fsdp *f, const ct_param_slot *s) {
    return s->split_dim >= 0 && s->split_axis == CT_AXIS_EP && CT_HAS_FIELD(&f->mesh, ct_mesh_info, efsdp_size) &&
           f->mesh.ep_size > 1;
}
static int slot_S(const fsdp *f, const ct_param_slot *s) { return on_efsdp(f, s) ? f->mesh.efsdp_size : f->S; }
static ct_comm_group *slot_group(fsdp *f, const ct_param_slot *s) {
    return on_efsdp(f, s) ? f->mesh.efsdp_group : f->group;
}

/* A group of one rank (experts with efsdp 1, or dp_shard x cp 1 under an explicit fsdp): the shard
 * is the whole tensor, so there is nothing to gather or reduce-scatter. */
static int whole(const fsdp *f, const ct_param_slot *s) { return slot_S(f, s) == 1; }
static int is_fp8(const fsdp *f, const ct_param_slot *s) { return f->fp8 && (s->param->flags & CT_TENSOR_QUANTIZED); }
/* Its shard is used in place for compute: no copy, no buffer. Not under bf16 compute or the float8
 * all-gather, whose compute values are rounded copies of the f32 master (made without a collective). */
static int param_in_place(const fsdp *f, const ct_param_slot *s) {
    return whole(f, s) && !f->env.bf16_compute && !is_fp8(f, s);
}
/* Its gradient accumulates straight into the local shard's gradient (zeroed at the step's start)
 * when that holds nothing yet: under pipeline parallel (one reduction per step) or in a step's first
 * microbatch. A later microbatch without PP accumulates in a buffer of its own and adds it, as
 * before, so the sums keep their order and HSDP's all-reduce sums each microbatch once. */
static int grad_in_place(const fsdp *f, const ct_param_slot *s, int first) {
    return whole(f, s) && (f->sync_last || first);
}

static ct_status fsdp_create(const ct_host *h, const ct_strategy_env *env, ct_strategy **out) {
    fsdp *f = calloc(1, sizeof *f);
    if (!f) return CT_ERR_NOMEM;
    f->host = h;
    f->env = *env;
    f->mesh = *env->mesh;
    f->fp8 = CT_HAS_FIELD(env, ct_strategy_env, fp8_all_gather) && env->fp8_all_gather;
    int planning = CT_HAS_FIELD(env, ct_strategy_env, planning) && env->planning; /* report only: no device, no comm */
    if (f->fp8 && !planning && (!CT_HAS_FIELD(env->dapi, ct_device_api, transpose) || !env->dapi->quantize_fp8)) {
        h->set_error(h, "float8 all-gather needs the device's float8 ops");
        free(f);
        return CT_ERR_UNSUPPORTED;
    }
    const char *policy = "default";
    h->opt_string(h, "fsdp_reshard_after_forward", &policy);
    int pp = env->mesh->degree[CT_AXIS_PP] > 1;
    f->sync_last = pp;
    f->fresh = 1;
    /* a host before 2.6 cannot say: keep nothing beside the f32 copy, as under a split schedule */
    f->split = !CT_HAS_FIELD(env, ct_strategy_env, split_backward) || env->split_backward;
    if (!strcmp(policy, "never")) f->reshard = 0;
    else if (!strcmp(policy, "default")) f->reshard = pp ? 0 : 1; /* torchtitan: no resharding between microbatches under PP */
    else if (!strcmp(policy, "always") && pp) {
        h->set_error(h, "parallelism.fsdp_reshard_after_forward: 'always' is not supported with pipeline parallel "
                        "(microbatches of a stage interleave); use default or never");
        free(f);
        return CT_ERR_INVALID;
    }
    else if (!strcmp(policy, "always")) f->reshard = 2;
    else {
        h->set_error(h, "parallelism.fsdp_reshard_after_forward: expected default, always or never, got '%s'", policy);
        free(f);
        return CT_ERR_INVALID;
    }
    f->axis = CT_AXIS_DP_SHARD;
    f->S = f->mesh.degree[CT_AXIS_DP_SHARD];
    f->r = f->mesh.coord[CT_AXIS_DP_SHARD];
    f->group = f->mesh.group[CT_AXIS_DP_SHARD];
    if (f->mesh.degree[CT_AXIS_CP] > 1) {
        if (!CT_HAS_FIELD(env->mesh, ct_mesh_info, dp_shard_cp_size)) {
            h->set_error(h, "context parallel needs a host of ABI 2.3 or later (the dp_shard x cp group)");
            free(f);
            return CT_ERR_UNSUPPORTED;
        }
        f->axis = CT_AXIS_DP_SHARD_CP;
        f->S = f->mesh.dp_shard_cp_size;
        f->r = f->mesh.dp_shard_cp_rank;
        f->group = f->mesh.dp_shard_cp_group;
    }
    if (!planning && (!env->capi || !f->group)) {
        h->set_error(h, "needs a comm plugin and a dp_shard group");
        free(f);
        return CT_ERR_INVALID;
    }
    *out = f;
    return CT_OK;
}

/* ---- buffer cache: full-size parameter and gradient buffers ---- */
static float *buf_get(fsdp *f, int64_t n) {
    for (int i = 0; i < f->n_cache; i++)
        if (f->cache[i].n == n) {
            float *p = f->cache[i].p;
            f->cache[i] = f->cache[--f->n_cache];
            return p;
        }
    void *p = NULL;
    if (DAPI(f)->alloc(f->env.dev, (size_t)n * sizeof(float), &p) != CT_OK) return NULL;
    f->host->mem_account(f->host, CT_MEM_COMM, n * (int64_t)sizeof(float));
    return p;
}

static void buf_put(fsdp *f, float *p, int64_t n) {
    if (!p) return;
    if (f->n_cache == f->cap_cache) {
        int cap = f->cap_cache ? 2 * f->cap_cache : 16;
        buf *c = realloc(f->cache, sizeof(buf) * (size_t)cap);
        if (!c) { /* no room to cache it: give it back */
            DAPI(f)->free(f->env.dev, p);
            f->host->mem_account(f->host, CT_MEM_COMM, -n * (int64_t)sizeof(float));
            return;
        }
        f->cache = c;
        f->cap_cache = cap;
    }
    f->cache[f->n_cache++] = (buf){p, n};
}

static int64_t full_n(fsdp *f, const ct_param_slot *s) { return s->local_numel * slot_S(f, s); }

static ct_status fsdp_place(ct_strategy *p, ct_param_slot *slots, int n) {
    fsdp *f = p;
    for (int i = 0; i < n; i++) {
        ct_param_slot *s = CT_SLOT_AT(slots, i);
        if (s->placement == CT_PLACE_NONE) continue; /* another pipeline stage's */
        int ef = on_efsdp(f, s), S = ef ? f->mesh.efsdp_size : f->S, r = ef ? f->mesh.efsdp_rank : f->r;
        int64_t rows = s->param->ndim ? s->param->shape[0] : 1, row = s->numel / (rows ? rows : 1);
        int64_t rows_per = (rows + S - 1) / S; /* dim-0 blocks, the last ones padded */
        s->placement = CT_PLACE_SHARD;
        s->shard_axis = ef ? CT_AXIS_EFSDP : f->axis;
        s->local_numel = rows_per * row;
        s->offset = (int64_t)r * s->local_numel;
    }
    return CT_OK;
}

static ct_status fsdp_setup(ct_strategy *p, ct_param_slot *slots, int n, int n_units) {
    fsdp *f = p;
    f->slots = slots;
    f->n_slots = n;
    f->n_units = n_units;
    f->units = calloc((size_t)n_units, sizeof(unit_state));
    if (!f->units) return CT_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        if (CT_SLOT_AT(slots, i)->unit < 0 || CT_SLOT_AT(slots, i)->unit >= n_units) return CT_ERR_INVALID;
        if (CT_SLOT_AT(slots, i)->placement == CT_PLACE_NONE) continue;
        unit_state *u = &f->units[CT_SLOT_AT(slots, i)->unit];
        int *grown = realloc(u->params, sizeof(int) * (size_t)(u->n + 1));
        if (!grown) return CT_ERR_NOMEM;
        u->params = grown;
        u->params[u->n++] = i;
        CT_SLOT_AT(slots, i)->param->data = NULL;
        CT_SLOT_AT(slots, i)->param->grad = NULL;
    }
    for (int k = 0; k < n_units; k++) {
        unit_state *u = &f->units[k];
        u->greq = calloc((size_t)u->n + 1, sizeof *u->greq);
        u->full = calloc((size_t)u->n + 1, sizeof(float *));
        u->full_numel = calloc((size_t)u->n + 1, sizeof(int64_t));
        u->rsreq = calloc((size_t)u->n + 1, sizeof *u->rsreq);
        u->rs_out = calloc((size_t)u->n + 1, sizeof(float *));
        u->q8_local = calloc((size_t)u->n + 1, sizeof(float *));
        u->q8_full = calloc((size_t)u->n + 1, sizeof(float *));
        u->h_local = calloc((size_t)u->n + 1, sizeof(float *));
        u->h_full = calloc((size_t)u->n + 1, sizeof(float *));
        u->h_n = calloc(2 * (size_t)u->n + 1, sizeof(int64_t));
        u->gin = calloc((size_t)u->n + 1, 1);
        if (!u->h_n || !u->gin || !u->greq || !u->full || !u->full_numel || !u->rsreq || !u->rs_out || !u->q8_local || !u->q8_full ||
            !u->h_local || !u->h_full)
            return CT_ERR_NOMEM;
    }
    if (f->fp8) {
        f->host_scales = calloc((size_t)n + 1, sizeof(float));
        if (!f->host_scales || DAPI(f)->alloc(f->env.dev, sizeof(float) * (size_t)(n + 1), (void **)&f->dev_scales))
            return CT_ERR_NOMEM;
    }
    return CT_OK;
}


/* Float8 scales of every converted weight this rank holds, from ONE all-reduce of their amaxes
 * over the shard group (torchao's precompute_float8_dynamic_scale_for_fsdp): tensor-wide e4m3
 * scales 448 / amax. Runs at the first gather after the weights may have changed. */
static ct_status fp8_precompute(fsdp *f) {
    int nq = 0;
    float *amax = calloc((size_t)f->n_slots + 1, sizeof(float));
    if (!amax) return CT_ERR_NOMEM;
    ct_status st = CT_OK;
    for (int i = 0; i < f->n_slots && !st; i++) {
        ct_param_slot *s = CT_SLOT_AT(f->slots, i);
        if (!is_fp8(f, s) || s->placement == CT_PLACE_NONE) continue;
        st = DAPI(f)->amax(f->env.dev, f->dev_scales + i, s->local_data, s->local_numel, s->local_numel);
        if (!st) st = DAPI(f)->copy(f->env.dev, &amax[nq++], f->dev_scales + i, sizeof(float), CT_COPY_D2H);
    }
    if (!st && nq) st = CAPI(f)->all_reduce(f->env.comm, shard_group(f), amax, amax, nq, CT_F32, CT_REDUCE_MAX, NULL);
    for (int i = 0, q = 0; i < f->n_slots && !st; i++) {
        ct_param_slot *s = CT_SLOT_AT(f->slots, i);
        if (!is_fp8(f, s) || s->placement == CT_PLACE_NONE) continue;
        float a = amax[q++], sc = a != a ? a : 448.0f / (a > 1e-12f ? a : 1e-12f);
        f->host_scales[i] = sc;
        st = DAPI(f)->copy(f->env.dev, f->dev_scales + i, &sc, sizeof(float), CT_COPY_H2D);
    }
    free(amax);
    f->scales_fresh = !st;
    return st;
}

/* Float8 all-gather of unit k's converted weights: each shard cast to e4m3 with its precomputed
 * scale, so each rank gathers bytes instead of floats. */
static ct_status fp8_prepare(fsdp *f, unit_state *u) {
    ct_status st = f->scales_fresh ? CT_OK : fp8_precompute(f);
    for (int j = 0; j < u->n && !st; j++) {
        ct_param_slot *s = CT_SLOT_AT(f->slots, u->params[j]);
        if (!is_fp8(f, s)) continue;
        u->q8_local[j] = buf_get(f, (s->local_numel + 3) / 4);
        u->q8_full[j] = buf_get(f, (full_n(f, s) + 3) / 4);
        if (!u->q8_local[j] || !u->q8_full[j]) return CT_ERR_NOMEM;
        st = DAPI(f)->quantize_fp8(f->env.dev, (uint8_t *)u->q8_local[j], s->local_data, f->dev_scales + u->params[j],
                                   s->local_numel, s->local_numel, CT_F8_E4M3);
    }
    return st;
}

/* The units stay gathered between their windows, so under bf16 compute their bf16 copies are kept
 * and the f32 ones dropped between windows. */
static int keeps_bf16(fsdp *f) { return f->env.bf16_compute && f->reshard == 0 && !f->split; }
/* bf16 gathers: where the bf16 copy is kept, for every weight float8 does not gather. (A unit
 * resharded after its forward gathers f32 and rounds: the buffer cache keeps each size it ever
 * held, so bf16 buffers beside the f32 ones would add memory, not save it.) bf16 values take half
 * the floats of a buffer (rounded up). */
static int gathers_bf16(fsdp *f, const ct_param_slot *s) { return keeps_bf16(f) && !is_fp8(f, s) && !whole(f, s); }
/* A group of one rank under bf16 compute has nothing to gather: its rounded f32 values are made from
 * the shard for each window and, where a unit stays gathered, dropped between windows instead of a
 * bf16 copy held (the same values: both round to nearest even). */
static int rounds_own(fsdp *f, const ct_param_slot *s) {
    return whole(f, s) && f->env.bf16_compute && !is_fp8(f, s);
}
/* rounds_own's values for a window: the shard copied and rounded to bf16 */
static ct_status round_own(fsdp *f, const ct_param_slot *s, float *full) {
    ct_status st = DAPI(f)->copy(f->env.dev, full, s->local_data, sizeof(float) * (size_t)s->local_numel, CT_COPY_D2D);
    return st ? st : DAPI(f)->round_bf16(f->env.dev, full, s->numel);
}
/* A unit kept gathered between windows keeps its float8-gathered weights as the gathered e4m3
 * bytes (a quarter of the f32 bytes) and dequantizes them again for each window: the same bytes
 * and scale give the same values, so this loses nothing in f32 or bf16 compute. */
static int keeps_fp8(fsdp *f) { return f->reshard == 0 && !f->split; }
static int64_t half_n(int64_t n) { return (n + 1) / 2; }

/* Starts all-gathering unit k's parameters into full buffers (bf16 ones: see gathers_bf16). */
static ct_status gather_start(fsdp *f, int k) {
    if (k < 0 || k >= f->n_units) return CT_OK;
    unit_state *u = &f->units[k];
    if (u->gathered) return CT_OK;
    ct_status st = f->fp8 ? fp8_prepare(f, u) : CT_OK;
    if (st) return st;
    for (int j = 0; j < u->n; j++) {
        ct_param_slot *s = CT_SLOT_AT(f->slots, u->params[j]);
        if (param_in_place(f, s)) { /* the shard is the whole tensor */
            s->param->data = s->local_data;
            continue;
        }
        if (gathers_bf16(f, s)) { /* the shard cast to bf16 (round to nearest even), gathered as bf16 */
            u->h_n[2 * j] = half_n(full_n(f, s));
            u->h_n[2 * j + 1] = half_n(s->local_numel);
            u->h_local[j] = buf_get(f, u->h_n[2 * j + 1]);
            u->h_full[j] = buf_get(f, u->h_n[2 * j]);
            if (!u->h_local[j] || !u->h_full[j]) {
                f->host->set_error(f->host, "cannot allocate bf16 buffers to gather %s", s->param->name);
                return CT_ERR_NOMEM;
            }
            st = DAPI(f)->cast_f32_to_bf16(f->env.dev, (uint16_t *)u->h_local[j], s->local_data, s->local_numel);
            if (!st)
                st = CAPI(f)->all_gather(f->env.comm, slot_group(f, s), u->h_local[j], u->h_full[j], s->local_numel,
                                         CT_BF16, &u->greq[j]);
            if (st) return st;
            continue;
        }
        float *full = buf_get(f, full_n(f, s));
        if (!full) {
            f->host->set_error(f->host, "cannot allocate %lld floats to gather %s", (long long)full_n(f, s),
                               s->param->name);
            return CT_ERR_NOMEM;
        }
        s->param->data = full;
        u->full[j] = full;
        u->full_numel[j] = full_n(f, s);
        if (rounds_own(f, s)) /* no collective (gather_wait rounds only what it waited for) */
            st = round_own(f, s, full);
        else if (u->q8_full[j])
            st = CAPI(f)->all_gather(f->env.comm, slot_group(f, s), u->q8_local[j], u->q8_full[j], s->local_numel,
                                     CT_F8_E4M3, &u->greq[j]);
        else
            st = CAPI(f)->all_gather(f->env.comm, slot_group(f, s), s->local_data, full, s->local_numel, CT_F32,
                                     &u->greq[j]);
        if (st) return st;
    }
    u->gathered = 1;
    return CT_OK;
}

/* float8 bytes -> the f32 values on the e4m3 grid the quantizer would make (bf16 under bf16
 * compute, exact on e4m3 times the scale's reciprocal rounded) */
static ct_status dequantize(fsdp *f, unit_state *u, int j) {
    ct_param_slot *s = CT_SLOT_AT(f->slots, u->params[j]);
    ct_status st = DAPI(f)->dequantize_fp8(f->env.dev, s->param->data, (const uint8_t *)u->q8_full[j],
                                           f->dev_scales + u->params[j], full_n(f, s), full_n(f, s), CT_F8_E4M3);
    if (!st && f->env.bf16_compute) st = DAPI(f)->round_bf16(f->env.dev, s->param->data, s->numel);
    return st;
}

/* The f32 values of unit k's bf16- or float8-held parameters, for a window; the compact copy is
 * kept only where the unit stays gathered between windows. */
static ct_status expand(fsdp *f, unit_state *u) {
    for (int j = 0; j < u->n; j++) {
        if (u->full[j] || u->greq[j]) continue;
        ct_param_slot *w = CT_SLOT_AT(f->slots, u->params[j]);
        /* held float8 bytes (keeps_fp8), or a group of one's values dropped since its last window */
        int f8 = u->q8_full[j] != NULL, own = !f8 && keeps_bf16(f) && rounds_own(f, w);
        if (f8 || own) {
            if (!(u->full[j] = buf_get(f, full_n(f, w)))) {
                f->host->set_error(f->host, "cannot allocate %lld floats for %s", (long long)full_n(f, w),
                                   w->param->name);
                return CT_ERR_NOMEM;
            }
            w->param->data = u->full[j];
            u->full_numel[j] = full_n(f, w);
            ct_status st = f8 ? dequantize(f, u, j) : round_own(f, w, u->full[j]);
            if (st) return st;
            continue;
        }
        if (!u->h_full[j]) continue;
        ct_param_slot *s = CT_SLOT_AT(f->slots, u->params[j]);
        float *full = buf_get(f, full_n(f, s));
        if (!full) {
            f->host->set_error(f->host, "cannot allocate %lld floats for %s", (long long)full_n(f, s), s->param->name);
            return CT_ERR_NOMEM;
        }
        ct_status st = DAPI(f)->cast_bf16_to_f32(f->env.dev, full, (const uint16_t *)u->h_full[j], full_n(f, s));
        s->param->data = full;
        u->full[j] = full;
        u->full_numel[j] = full_n(f, s);
        if (st) return st;
        if (!keeps_bf16(f)) {
            buf_put(f, u->h_full[j], u->h_n[2 * j]);
            u->h_full[j] = NULL;
        }
    }
    return CT_OK;
}

/* Between windows of a unit kept in bf16 (or float8 bytes): its f32 values go. */
static void shrink_to_bf16(fsdp *f, unit_state *u) {
    if (u->fwd_open || u->windows) return;
    for (int j = 0; j < u->n; j++) {
        ct_param_slot *s = CT_SLOT_AT(f->slots, u->params[j]);
        int remade = u->h_full[j] || u->q8_full[j] || (keeps_bf16(f) && rounds_own(f, s));
        if (!remade || !u->full[j] || u->greq[j]) continue;
        buf_put(f, u->full[j], full_n(f, s));
        u->full[j] = NULL;
        s->param->data = NULL;
    }
}

/* Waits for unit k's gathers (if any are pending) and gives it f32 values. */
static ct_status gather_wait(fsdp *f, int k) {
    unit_state *u = &f->units[k];
    ct_status st = gather_start(f, k);
    if (st) return st;
    for (int j = 0; j < u->n; j++) {
        if (!u->greq[j]) continue;
        st = CAPI(f)->wait(f->env.comm, u->greq[j]);
        u->greq[j] = NULL;
        if (st) return st;
        ct_param_slot *s = CT_SLOT_AT(f->slots, u->params[j]);
        if (u->h_local[j]) {
            buf_put(f, u->h_local[j], u->h_n[2 * j + 1]);
            u->h_local[j] = NULL;
            continue;
        }
        if (u->q8_full[j]) {
            st = dequantize(f, u, j);
            buf_put(f, u->q8_local[j], (s->local_numel + 3) / 4);
            u->q8_local[j] = NULL;
            if (!keeps_fp8(f)) {
                buf_put(f, u->q8_full[j], (full_n(f, s) + 3) / 4);
                u->q8_full[j] = NULL;
            }
            if (st) return st;
        } else if (f->env.bf16_compute) { /* an f32 gather under bf16 compute: bf16 values */
            st = DAPI(f)->round_bf16(f->env.dev, s->param->data, s->numel);
            if (st) return st;
        }
    }
    return expand(f, u);
}

static void release_params(fsdp *f, int k) {
    unit_state *u = &f->units[k];
    for (int j = 0; j < u->n; j++) {
        ct_param_slot *s = CT_SLOT_AT(f->slots, u->params[j]);
        if (u->full[j]) buf_put(f, u->full[j], full_n(f, s));
        if (u->h_full[j]) buf_put(f, u->h_full[j], u->h_n[2 * j]);
        if (u->q8_full[j]) buf_put(f, u->q8_full[j], (full_n(f, s) + 3) / 4);
        s->param->data = NULL;
        u->full[j] = u->h_full[j] = u->q8_full[j] = NULL;
    }
    u->gathered = 0;
}

/* Gives back every gathered unit (the weights may change next): after a step's last backward and
 * after a checkpoint load. A forward-only pass may have left units gathered. */
static ct_status release_all(fsdp *f) {
    for (int k = 0; k < f->n_units; k++) {
        if (!f->units[k].gathered) continue;
        if (f->units[k].windows) {
            f->host->set_error(f->host, "unit %d: its parameters are still in use by %d backward windows", k,
                               f->units[k].windows);
            return CT_ERR_INTERNAL;
        }
        ct_status st = gather_wait(f, k);
        if (st) return st;
        release_params(f, k);
    }
    return CT_OK;
}

/* Gathered units are reused: under PP, every microbatch's forward finds its unit still gathered. */
static ct_status fsdp_pre_forward(ct_strategy *p, int k) {
    fsdp *f = p;
    ct_status st = gather_wait(f, k);
    if (!st) st = gather_start(f, k + 1); /* prefetch the next unit while this one computes */
    f->units[k].fwd_open = 1;
    return st;
}

static ct_status fsdp_post_forward(ct_strategy *p, int k) {
    fsdp *f = p;
    int last = k == f->n_units - 1;
    f->units[k].fwd_open = 0;
    if (f->reshard == 2 || (f->reshard == 1 && !last)) release_params(f, k);
    else shrink_to_bf16(f, &f->units[k]);
    return CT_OK;
}

/* Completes unit k's reduce-scatters (defined below). */
static ct_status rs_finish(fsdp *f, int k);

/* Opens a backward window of unit k: its parameters gathered and full gradient buffers to
 * accumulate into, fresh (zeroed) unless an earlier microbatch's are still held (PP). */
static ct_status fsdp_pre_backward(ct_strategy *p, int k) {
    fsdp *f = p;
    ct_status st = gather_wait(f, k);
    if (!st) st = rs_finish(f, k); /* a previous microbatch's reduction still holds the old buffers */
    if (st) return st;
    unit_state *u = &f->units[k];
    u->windows++;
    if (u->grads) return gather_start(f, k - 1);
    u->grads = 1;
    for (int j = 0; j < u->n; j++) { /* fresh full gradients, zeroed: the tape accumulates into them */
        ct_param_slot *s = CT_SLOT_AT(f->slots, u->params[j]);
        if ((u->gin[j] = (char)grad_in_place(f, s, f->fresh))) { /* zeroed with the step */
            s->param->grad = s->local_grad;
            continue;
        }
        float *g = buf_get(f, full_n(f, s));
        if (!g) return CT_ERR_NOMEM;
        st = DAPI(f)->zero(f->env.dev, g, sizeof(float) * (size_t)full_n(f, s));
        if (st) return st;
        s->param->grad = g;
    }
    return gather_start(f, k - 1); /* prefetch the unit backward reaches next */
}

/* Completes unit k's reduce-scatters: local gradient += reduced shard (then summed over replicas). */
static ct_status rs_finish(fsdp *f, int k) {
    unit_state *u = &f->units[k];
    if (!u->rs_pending) return CT_OK;
    ct_status st = CT_OK;
    for (int j = 0; j < u->n && !st; j++) {
        ct_param_slot *s = CT_SLOT_AT(f->slots, u->params[j]);
        if (u->gin[j]) continue; /* reduced in place at post_backward */
        st = CAPI(f)->wait(f->env.comm, u->rsreq[j]);
        u->rsreq[j] = NULL;
        if (!st && f->mesh.degree[CT_AXIS_DP_REPLICATE] > 1) /* HSDP: sum the shard over replicas */
            st = CAPI(f)->all_reduce(f->env.comm, f->mesh.group[CT_AXIS_DP_REPLICATE], u->rs_out[j], u->rs_out[j],
                                     s->local_numel, CT_F32, CT_REDUCE_SUM, NULL);
        if (!st) st = DAPI(f)->axpy(f->env.dev, s->local_grad, u->rs_out[j], 1.0f, s->local_numel);
        buf_put(f, u->rs_out[j], s->local_numel);
        u->rs_out[j] = NULL;
        buf_put(f, s->param->grad, full_n(f, s));
        s->param->grad = NULL;
    }
    u->rs_pending = 0;
    return st;
}

/* Closes a backward window of unit k. Without PP (FSDP2's default) every microbatch's gradients
 * are reduce-scattered into the local shard and the unit released; under PP only the final one
 * (last), after which no window of the unit is open. */
static ct_status fsdp_post_backward(ct_strategy *p, int k, int last_microbatch) {
    fsdp *f = p;
    unit_state *u = &f->units[k];
    if (u->windows < 1) {
        f->host->set_error(f->host, "post_backward of unit %d with no backward window open (pre_backward missing)", k);
        return CT_ERR_INTERNAL;
    }
    u->windows--;
    f->saw_last |= last_microbatch;
    if (f->sync_last && !last_microbatch) { /* accumulate; keep the unit gathered */
        shrink_to_bf16(f, u);
        return CT_OK;
    }
    if (u->windows > 0) { /* the buffers would go while a later microbatch still writes them */
        f->host->set_error(f->host, "unit %d: gradients to reduce while %d backward windows are still open", k,
                           u->windows);
        return CT_ERR_INTERNAL;
    }
    u->grads = 0;
    int pending = 0;
    for (int j = 0; j < u->n; j++) {
        ct_param_slot *s = CT_SLOT_AT(f->slots, u->params[j]);
        if (u->gin[j]) { /* the gradient is the local shard's already; HSDP sums it over replicas */
            ct_status st = f->mesh.degree[CT_AXIS_DP_REPLICATE] > 1
                               ? CAPI(f)->all_reduce(f->env.comm, f->mesh.group[CT_AXIS_DP_REPLICATE], s->local_grad,
                                                     s->local_grad, s->local_numel, CT_F32, CT_REDUCE_SUM, NULL)
                               : CT_OK;
            s->param->grad = NULL;
            if (st) return st;
            continue;
        }
        pending = 1;
        u->rs_out[j] = buf_get(f, s->local_numel);
        if (!u->rs_out[j]) return CT_ERR_NOMEM;
        ct_status st = CAPI(f)->reduce_scatter(f->env.comm, slot_group(f, s), s->param->grad, u->rs_out[j],
                                               s->local_numel, CT_F32, CT_REDUCE_SUM, &u->rsreq[j]);
        if (st) return st;
    }
    u->rs_pending = pending;
    release_params(f, k);
    /* one unit's reductions in flight at a time: finish the unit after this one */
    return k + 1 < f->n_units ? rs_finish(f, k + 1) : CT_OK;
}

static ct_status fsdp_finish_backward(ct_strategy *p) {
    fsdp *f = p;
    f->scales_fresh = 0; /* the optimizer may change the weights next */
    for (int k = 0; k < f->n_units; k++) {
        ct_status st = rs_finish(f, k);
        if (st) return st;
        if (f->saw_last && (f->units[k].grads || f->units[k].windows)) { /* never reduced: silently wrong */
            f->host->set_error(f->host, "unit %d: the step ended with its gradients unreduced (%d backward windows open)",
                               k, f->units[k].windows);
            return CT_ERR_INTERNAL;
        }
    }
    f->fresh = f->saw_last; /* without PP, a step's later microbatches add to what the first left */
    if (!f->saw_last) return CT_OK; /* more microbatches of this step follow: stay gathered */
    f->saw_last = 0;
    return release_all(f);
}

/* The weights may have changed (optimizer, checkpoint load): nothing gathered stays. */
static ct_status fsdp_post_step(ct_strategy *p) { return release_all(p); }

static void fsdp_destroy(ct_strategy *p) {
    fsdp *f = p;
    if (!f) return;
    /* a forward-only pass (sampling) leaves the last unit gathered; the parameters themselves may be
     * gone by now, so the unit's own record of its buffers is what is given back */
    for (int k = 0; f->units && k < f->n_units; k++) {
        unit_state *u = &f->units[k];
        for (int j = 0; u->full && j < u->n; j++) {
            if (u->greq && u->greq[j]) CAPI(f)->wait(f->env.comm, u->greq[j]); /* never free under a gather */
            if (u->full[j]) buf_put(f, u->full[j], u->full_numel[j]);
            if (u->h_full && u->h_full[j]) buf_put(f, u->h_full[j], u->h_n[2 * j]);
            if (u->h_local && u->h_local[j]) buf_put(f, u->h_local[j], u->h_n[2 * j + 1]);
            /* float8 bytes (held between windows, or a gather never waited for): full_numel was set
             * with them, full_n floats, local_numel * S */
            if (u->q8_full && u->q8_full[j]) buf_put(f, u->q8_full[j], (u->full_numel[j] + 3) / 4);
            if (u->q8_local && u->q8_local[j]) buf_put(f, u->q8_local[j], (u->full_numel[j] / f->S + 3) / 4);
        }
    }
    for (int i = 0; i < f->n_cache; i++) {
        DAPI(f)->free(f->env.dev, f->cache[i].p);
        f->host->mem_account(f->host, CT_MEM_COMM, -f->cache[i].n * (int64_t)sizeof(float));
    }
    free(f->cache);
    for (int k = 0; f->units && k < f->n_units; k++) {
        free(f->units[k].params);
        free(f->units[k].greq);
        free(f->units[k].full);
        free(f->units[k].full_numel);
        free(f->units[k].rsreq);
        free(f->units[k].rs_out);
        free(f->units[k].q8_local);
        free(f->units[k].q8_full);
        free(f->units[k].h_local);
        free(f->units[k].h_full);
        free(f->units[k].h_n);
        free(f->units[k].gin);
    }
    free(f->units);
    if (f->dev_scales) DAPI(f)->free(f->env.dev, f->dev_scales);
    free(f->host_scales);
    free(f);
}

/* place(), keeping the slots for report() (a planning instance gets no setup). */
static ct_status fsdp_place_kept(ct_strategy *p, ct_param_slot *slots, int n) {
    fsdp *f = p;
    f->slots = slots;
    f->n_slots = n;
    return fsdp_place(p, slots, n);
}

/* ---- report: the hooks' buffer traffic replayed on sizes ----
 * The buffer cache never gives memory back (buf_put keeps it for the next buf_get of the same
 * size), so the communication memory a run holds is everything the cache ever allocated. report()
 * replays one microbatch's hooks as above on sizes only (a planning instance has no setup and no
 * device): the same gets and puts in the same order, so the same reuse. Later microbatches start
 * from the same state (every unit released, no reduction pending) and allocate nothing new. Under
 * pipeline parallel the units stay gathered and their full gradients are held until the last
 * microbatch: an earlier microbatch, which keeps them, is replayed before the last, which reduces
 * and releases them (one microbatch alone is the last). */
typedef struct sim {
    int64_t *free; /* sizes (floats) of the cached buffers */
    int n, cap;
    int64_t total; /* floats the cache has allocated */
    int oom;
} sim;

typedef struct sim_unit {
    int *params, n;
    int gathered, waiting, grads, rs_pending;
    int half, expanded; /* its bf16-gathered parameters' bf16 copies held; their f32 values held */
    int f8_full;        /* its float8-gathered parameters' f32 values held (their bytes: keeps_fp8) */
    int own;            /* its rounds_own parameters' f32 values held */
} sim_unit;

static void sim_get(sim *m, int64_t n) {
    for (int i = 0; i < m->n; i++)
        if (m->free[i] == n) {
            m->free[i] = m->free[--m->n];
            return;
        }
    m->total += n;
}

static void sim_put(sim *m, int64_t n) {
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 16;
        int64_t *g = realloc(m->free, sizeof(int64_t) * (size_t)cap);
        if (!g) {
            m->oom = 1;
            return;
        }
        m->free = g;
        m->cap = cap;
    }
    m->free[m->n++] = n;
}

#define SIM_SLOT(f, u, j) CT_SLOT_AT((f)->slots, (u)->params[j])

static void sim_gather_start(fsdp *f, sim *m, sim_unit *us, int nu, int k) { /* gather_start, fp8_prepare */
    if (k < 0 || k >= nu || us[k].gathered) return;
    sim_unit *u = &us[k];
    for (int j = 0; f->fp8 && j < u->n; j++)
        if (is_fp8(f, SIM_SLOT(f, u, j))) {
            sim_get(m, (SIM_SLOT(f, u, j)->local_numel + 3) / 4);
            sim_get(m, (full_n(f, SIM_SLOT(f, u, j)) + 3) / 4);
        }
    u->f8_full = 1;
    for (int j = 0; j < u->n; j++) {
        const ct_param_slot *s = SIM_SLOT(f, u, j);
        if (param_in_place(f, s)) continue;
        if (!gathers_bf16(f, s)) {
            sim_get(m, full_n(f, s));
            continue;
        }
        sim_get(m, half_n(s->local_numel));
        sim_get(m, half_n(full_n(f, s)));
        u->half = 1;
    }
    u->gathered = u->waiting = u->own = 1;
    u->expanded = 0;
}

static void sim_expand(fsdp *f, sim *m, sim_unit *u) { /* expand */
    for (int j = 0; !u->f8_full && j < u->n; j++)
        if (is_fp8(f, SIM_SLOT(f, u, j))) sim_get(m, full_n(f, SIM_SLOT(f, u, j)));
    u->f8_full = 1;
    for (int j = 0; !u->own && keeps_bf16(f) && j < u->n; j++)
        if (rounds_own(f, SIM_SLOT(f, u, j))) sim_get(m, full_n(f, SIM_SLOT(f, u, j)));
    u->own = 1;
    if (u->expanded || !u->half) return;
    for (int j = 0; j < u->n; j++) {
        const ct_param_slot *s = SIM_SLOT(f, u, j);
        if (!gathers_bf16(f, s)) continue;
        sim_get(m, full_n(f, s));
        if (!keeps_bf16(f)) sim_put(m, half_n(full_n(f, s)));
    }
    u->expanded = 1;
    u->half = keeps_bf16(f);
}

static void sim_shrink(fsdp *f, sim *m, sim_unit *u) { /* shrink_to_bf16 */
    for (int j = 0; keeps_fp8(f) && u->f8_full && j < u->n; j++)
        if (is_fp8(f, SIM_SLOT(f, u, j))) sim_put(m, full_n(f, SIM_SLOT(f, u, j)));
    if (keeps_fp8(f)) u->f8_full = 0;
    for (int j = 0; u->own && keeps_bf16(f) && j < u->n; j++)
        if (rounds_own(f, SIM_SLOT(f, u, j))) sim_put(m, full_n(f, SIM_SLOT(f, u, j)));
    if (keeps_bf16(f)) u->own = 0;
    if (!u->expanded || !u->half) return;
    for (int j = 0; j < u->n; j++)
        if (gathers_bf16(f, SIM_SLOT(f, u, j))) sim_put(m, full_n(f, SIM_SLOT(f, u, j)));
    u->expanded = 0;
}

static void sim_gather_wait(fsdp *f, sim *m, sim_unit *us, int nu, int k) {
    sim_gather_start(f, m, us, nu, k);
    sim_unit *u = &us[k];
    for (int j = 0; u->waiting && j < u->n; j++)
        if (is_fp8(f, SIM_SLOT(f, u, j))) {
            if (!keeps_fp8(f)) sim_put(m, (full_n(f, SIM_SLOT(f, u, j)) + 3) / 4);
            sim_put(m, (SIM_SLOT(f, u, j)->local_numel + 3) / 4);
        } else if (gathers_bf16(f, SIM_SLOT(f, u, j))) {
            sim_put(m, half_n(SIM_SLOT(f, u, j)->local_numel));
        }
    u->waiting = 0;
    sim_expand(f, m, u);
}

static void sim_release(fsdp *f, sim *m, sim_unit *u) {
    for (int j = 0; u->gathered && j < u->n; j++) {
        const ct_param_slot *s = SIM_SLOT(f, u, j);
        if (is_fp8(f, s)) {
            if (u->f8_full) sim_put(m, full_n(f, s));
            if (keeps_fp8(f)) sim_put(m, (full_n(f, s) + 3) / 4);
            continue;
        }
        if (param_in_place(f, s)) continue;
        if (rounds_own(f, s)) {
            if (u->own) sim_put(m, full_n(f, s));
            continue;
        }
        if (!gathers_bf16(f, s) || u->expanded) sim_put(m, full_n(f, s));
        if (gathers_bf16(f, s) && u->half) sim_put(m, half_n(full_n(f, s)));
    }
    u->gathered = u->half = u->expanded = u->f8_full = u->own = 0;
}

static void sim_rs_finish(fsdp *f, sim *m, sim_unit *u, int gin) {
    for (int j = 0; u->rs_pending && j < u->n; j++) {
        if (grad_in_place(f, SIM_SLOT(f, u, j), gin)) continue;
        sim_put(m, SIM_SLOT(f, u, j)->local_numel);
        sim_put(m, full_n(f, SIM_SLOT(f, u, j)));
    }
    u->rs_pending = 0;
}

/* Floats the buffer cache allocates over one microbatch (see above); under pipeline parallel with
 * several microbatches over two, the first keeping every unit gathered and its full gradients, the
 * last reducing them. */
static int64_t sim_step(fsdp *f, sim_unit *us, int nu, int n_microbatches) {
    sim m = {0};
    /* without PP a step's later microbatches (replayed here) keep their gradients in buffers; its
     * only one, or PP's whole step, in the shard of a group of one (grad_in_place) */
    int gin = f->sync_last || n_microbatches <= 1;
    for (int mb = f->sync_last && n_microbatches > 1 ? 0 : 1; mb < 2; mb++) {
        int last = mb == 1;
        for (int k = 0; k < nu; k++) { /* pre_forward, post_forward */
            sim_gather_wait(f, &m, us, nu, k);
            sim_gather_start(f, &m, us, nu, k + 1);
            if (f->reshard == 2 || (f->reshard == 1 && k != nu - 1)) sim_release(f, &m, &us[k]);
            else sim_shrink(f, &m, &us[k]);
        }
        for (int k = nu - 1; k >= 0; k--) {
            sim_gather_wait(f, &m, us, nu, k); /* pre_backward */
            sim_rs_finish(f, &m, &us[k], gin);
            if (!us[k].grads)
                for (int j = 0; j < us[k].n; j++)
                    if (!grad_in_place(f, SIM_SLOT(f, &us[k], j), gin)) sim_get(&m, full_n(f, SIM_SLOT(f, &us[k], j)));
            us[k].grads = 1;
            sim_gather_start(f, &m, us, nu, k - 1);
            if (!last) { /* post_backward of an earlier microbatch under PP: keep accumulating */
                sim_shrink(f, &m, &us[k]);
                continue;
            }
            us[k].grads = 0; /* post_backward: reduce */
            for (int j = 0; j < us[k].n; j++)
                if (!grad_in_place(f, SIM_SLOT(f, &us[k], j), gin)) sim_get(&m, SIM_SLOT(f, &us[k], j)->local_numel);
            us[k].rs_pending = us[k].n > 0;
            sim_release(f, &m, &us[k]);
            if (k + 1 < nu) sim_rs_finish(f, &m, &us[k + 1], gin);
        }
    }
    for (int k = 0; k < nu; k++) { /* finish_backward */
        sim_rs_finish(f, &m, &us[k], gin);
        if (us[k].gathered) {
            sim_gather_wait(f, &m, us, nu, k);
            sim_release(f, &m, &us[k]);
        }
    }
    free(m.free);
    return m.oom ? -1 : m.total;
}

/* Collectives per step: every parameter gathered for its forward and gathered again for its
 * backward where the reshard policy freed it (default: all but the last unit; always: all; never:
 * none), its gradient reduce-scattered (f32) and, with HSDP, all-reduced over replicas: each once
 * per microbatch, or once per step under pipeline parallel (the units stay gathered and the
 * gradients accumulate until the last microbatch). A converted weight under the float8 all-gather
 * moves one byte per element (its e4m3 shard; the scale comes from one all-reduce of every such
 * weight's amax, once per gathering pass). Own memory (CT_MEM_COMM): what the buffer cache
 * allocates, replayed by sim_step: the gathered parameters with the next unit's prefetch in flight,
 * a unit's full gradients with the previous unit's reduction in flight, the float8 bytes. */
static ct_status fsdp_report(ct_strategy *p, int n_microbatches, ct_strategy_report *out) {
    fsdp *f = p;
    int R = f->mesh.degree[CT_AXIS_DP_REPLICATE], nu = 0, n_fp8 = 0;
    double mb = f->sync_last ? 1 : n_microbatches > 0 ? n_microbatches : 1;
    ct_util_report_clear(out);
    for (int i = 0; i < f->n_slots; i++) {
        const ct_param_slot *s = CT_SLOT_AT(f->slots, i);
        if (s->placement != CT_PLACE_NONE && s->unit + 1 > nu) nu = s->unit + 1;
    }
    sim_unit *us = calloc((size_t)nu + 1, sizeof *us);
    int *idx = calloc((size_t)f->n_slots + 1, sizeof(int));
    if (!us || !idx) {
        free(us);
        free(idx);
        return CT_ERR_NOMEM;
    }
    for (int i = 0; i < f->n_slots; i++) { /* each unit's slots, in slot order as setup lists them */
        const ct_param_slot *s = CT_SLOT_AT(f->slots, i);
        if (s->placement != CT_PLACE_NONE && s->unit >= 0) us[s->unit].n++;
    }
    for (int k = 0, at = 0; k < nu; k++) {
        us[k].params = idx + at;
        at += us[k].n;
        us[k].n = 0;
    }
    for (int i = 0; i < f->n_slots; i++) {
        const ct_param_slot *s = CT_SLOT_AT(f->slots, i);
        if (s->placement == CT_PLACE_NONE || s->unit < 0) continue;
        us[s->unit].params[us[s->unit].n++] = i;
        double l = (double)s->local_numel * sizeof(float),
               sent = is_fp8(f, s) ? l / sizeof(float) : gathers_bf16(f, s) ? l / 2 : l;
        int regather = f->reshard == 2 || (f->reshard == 1 && s->unit != nu - 1);
        n_fp8 += is_fp8(f, s);
        /* experts split over ep are sharded over efsdp, the ranks holding the same ones: gathered and
         * reduced there (nothing to move where efsdp is one rank) */
        int axis = on_efsdp(f, s) ? CT_AXIS_EFSDP : f->axis, Sx = slot_S(f, s);
        if (Sx > 1) {
            ct_util_report_comm(out, axis, CT_COLL_ALL_GATHER, s->unit, CT_PHASE_FORWARD, sent * Sx, mb, 1);
            if (regather) ct_util_report_comm(out, axis, CT_COLL_ALL_GATHER, s->unit, CT_PHASE_BACKWARD, sent * Sx, mb, 1);
            ct_util_report_comm(out, axis, CT_COLL_REDUCE_SCATTER, s->unit, CT_PHASE_BACKWARD, l * Sx, mb, 1);
        }
        if (R > 1) ct_util_report_comm(out, CT_AXIS_DP_REPLICATE, CT_COLL_ALL_REDUCE, s->unit, CT_PHASE_BACKWARD, l, mb, 0);
    }
    if (n_fp8) /* fp8_precompute: every converted weight's amax in one all-reduce (MAX) */
        ct_util_report_comm(out, f->axis, CT_COLL_ALL_REDUCE, -1, CT_PHASE_FORWARD, (double)n_fp8 * sizeof(float), mb, 0);
    int64_t floats = sim_step(f, us, nu, n_microbatches);
    free(us);
    free(idx);
    if (floats < 0) return CT_ERR_NOMEM;
    out->mem_bytes[CT_MEM_COMM] = floats * (int64_t)sizeof(float);
    return CT_OK;
}

static const ct_strategy_api api = {
    .struct_size = sizeof(ct_strategy_api),
    .create = fsdp_create,
    .destroy = fsdp_destroy,
    .place = fsdp_place_kept,
    .setup = fsdp_setup,
    .pre_forward = fsdp_pre_forward,
    .post_forward = fsdp_post_forward,
    .pre_backward = fsdp_pre_backward,
    .post_backward = fsdp_post_backward,
    .finish_backward = fsdp_finish_backward,
    .post_step = fsdp_post_step,
    .report = fsdp_report,
    .serves = CT_SERVES_DATA_PARALLEL,
    .axis = -1,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_STRATEGY;
    info->name = "fsdp";
    info->description = "FSDP2: parameters sharded on dim 0 over dp_shard, gathered per unit; HSDP with dp_replicate";
    info->options = options;
    info->api = &api;
    return CT_OK;
}
