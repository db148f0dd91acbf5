/* cp.c: context parallel (torchtitan's) as a strategy plugin, written against the public SDK only.
 *
 * Each sequence is split over the cp ranks (cp.h: 2 x cp chunks, load-balanced); every rank of a cp
 * group gets the same whole batch from the host and the builder this plugin wraps (ops.c) keeps only
 * its rows: token ids and targets are cut at the embedding and the loss, RoPE takes the rows' real
 * positions, attention reaches every rank's keys (attention.c), or every rank's rows by heads
 * (ulysses.c), and the loss is summed over cp. The
 * core knows nothing of it. Parameters are not split: a data-parallel strategy that shards over
 * dp_shard x cp (CT_AXIS_DP_SHARD_CP) sums the cp ranks' partial gradients in its reduce-scatter;
 * the gradient of every other slot is summed over cp here, once per step.
 */
#include "cp.h"
#include "ctitan/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "context_parallel_rotate_method", CT_OPT_STRING, "allgather",
     "how attention reaches the other cp ranks' keys: allgather (gather K and V, attend at once), alltoall "
     "(pass K/V blocks around a ring, each hop hidden behind a block's attention) or ulysses (all-to-all q, k and "
     "v to H/cp heads of the whole sequence, attend, all-to-all the output back; heads must divide by cp)", NULL,
     "allgather|alltoall|ulysses"},
    {sizeof(ct_option_spec), "context_parallel_ring_overlap", CT_OPT_BOOL, "true",
     "under alltoall, start each ring transfer before the attention it hides behind (false: wait for it first, "
     "to measure what the overlap hides)", NULL, NULL},
    {0},
};

/* What a planner's search may vary (ABI 2.21): the rotate method, shown as "cp 2 (alltoall)". */
static const ct_search_knob knobs[] = {
    {sizeof(ct_search_knob), "context_parallel_rotate_method", "allgather|alltoall|ulysses", NULL},
    {0},
};

int cp_failed(cp *c, ct_status st, const char *what) {
    if (st == CT_OK) return 0;
    c->host->set_error(c->host, "context parallel: %s failed (status %d)", what, st);
    return -1;
}

/* The device ops a live instance needs (ABI 2.3, optional in the device table). */
static ct_status check_device(cp *c) {
    const ct_device_api *d = c->env.dapi;
    if (!CT_HAS_FIELD(d, ct_device_api, rope_backward_general) || !d->rope_forward_general ||
        !d->rope_backward_general || !d->attention_block_forward || !d->attention_merge ||
        !d->attention_block_backward) {
        c->host->set_error(c->host, "context parallel: the device lacks the ops it needs (rope_forward_general, "
                                    "attention_block_forward, attention_merge, attention_block_backward)");
        return CT_ERR_UNSUPPORTED;
    }
    return CT_OK;
}

static ct_status read_options(cp *c) {
    const ct_host *h = c->host;
    const char *method = "allgather";
    int overlap = 1;
    if (h->opt_string(h, "context_parallel_rotate_method", &method) ||
        h->opt_bool(h, "context_parallel_ring_overlap", &overlap))
        return CT_ERR_INVALID;
    if (strcmp(method, "allgather") && strcmp(method, "alltoall") && strcmp(method, "ulysses")) {
        /* the host checked the choices already */
        h->set_error(h, "context_parallel_rotate_method: expected allgather, alltoall or ulysses, got '%s'", method);
        return CT_ERR_INVALID;
    }
    c->ring = strcmp(method, "alltoall") == 0;
    c->ulysses = strcmp(method, "ulysses") == 0;
    c->ring_overlap = overlap;
    return CT_OK;
}

/* Ulysses splits each rank's heads over cp: n_heads and n_kv_heads, per tp rank under TP, must divide
 * by the degree. Checked here where the pack describes its heads, else on the first attention call
 * (ulysses.c). Tensor parallel refuses heads its own degree does not divide. */
static ct_status check_heads(cp *c) {
    const ct_model_desc *d = c->env.model;
    int64_t h = d ? d->n_heads : 0, kvh = d && d->n_kv_heads ? d->n_kv_heads : h;
    int tp = c->mesh.degree[CT_AXIS_TP] > 1 ? c->mesh.degree[CT_AXIS_TP] : 1;
    if (h <= 0 || h % tp || kvh % tp || (h / tp % c->size == 0 && kvh / tp % c->size == 0)) return CT_OK;
    if (tp == 1)
        c->host->set_error(c->host, "context_parallel_rotate_method: ulysses splits the attention heads over "
                                    "context_parallel_degree %d, which must divide n_heads %lld and n_kv_heads %lld; "
                                    "use a degree that divides both, or allgather or alltoall",
                           c->size, (long long)h, (long long)kvh);
    else
        c->host->set_error(c->host, "context_parallel_rotate_method: ulysses splits each tp rank's attention heads "
                                    "over context_parallel_degree %d, which must divide the heads per tp rank: "
                                    "n_heads %lld and n_kv_heads %lld over tensor_parallel_degree %d leave %lld and "
                                    "%lld; use a degree that divides both, or allgather or alltoall",
                           c->size, (long long)h, (long long)kvh, tp, (long long)(h / tp), (long long)(kvh / tp));
    return CT_ERR_INVALID;
}

static ct_status cp_create(const ct_host *h, const ct_strategy_env *env, ct_strategy **out) {
    if (!CT_HAS_FIELD(env, ct_strategy_env, planning) || !CT_HAS_FIELD(env->mesh, ct_mesh_info, dp_shard_cp_size)) {
        h->set_error(h, "context parallel: the host predates ABI 2.3 (no dp_shard x cp group)");
        return CT_ERR_UNSUPPORTED;
    }
    cp *c = calloc(1, sizeof *c);
    if (!c) return CT_ERR_NOMEM;
    c->host = h;
    c->env = *env;
    c->mesh = *env->mesh;
    c->size = c->mesh.degree[CT_AXIS_CP];
    c->rank = c->mesh.coord[CT_AXIS_CP];
    c->group = c->mesh.group[CT_AXIS_CP];
    ct_status st = read_options(c);
    if (st == CT_OK && c->size > 1 && env->seq_len % (2 * c->size)) {
        h->set_error(h, "context_parallel_degree: %d does not cut training.seq_len %lld into 2 x %d equal chunks "
                        "(load-balanced sharding); use a degree whose double divides the sequence length",
                     c->size, (long long)env->seq_len, c->size);
        st = CT_ERR_INVALID;
    }
    if (st == CT_OK && c->ulysses && c->size > 1) st = check_heads(c);
    if (st == CT_OK && !env->planning) st = check_device(c);
    if (st != CT_OK) {
        free(c);
        return st;
    }
    *out = c;
    return CT_OK;
}

/* The ring's overlap, measured over the run: how long its transfers were in flight and how long
 * this rank spent in their waits and pokes; the rest of the time in flight was spent computing. That
 * share is what the overlap hid where the comm moves bytes in the background (NCCL); where it moves
 * them only inside its calls (MPI), a transfer stays in flight until the next poke and the share is
 * an upper bound: a run with context_parallel_ring_overlap: false gives the waits to compare with. */
static void log_ring(const cp *c) {
    if (!c->ring || c->ring_transfers == 0 || c->mesh.world_rank != 0) return;
    double hidden = c->ring_inflight_s > 0 ? 1.0 - c->ring_blocked_s / c->ring_inflight_s : 0;
    if (hidden < 0) hidden = 0;
    c->host->log(c->host, CT_LOG_INFO,
                 "context parallel ring: overlap %s, %lld transfers in flight %.4f s, this rank in their waits and "
                 "pokes %.4f s: %.1f%% of the time in flight spent computing (the share hidden behind attention; "
                 "an upper bound over MPI, compare context_parallel_ring_overlap: false)",
                 c->ring_overlap ? "on" : "off", (long long)c->ring_transfers, c->ring_inflight_s, c->ring_blocked_s,
                 100.0 * hidden);
}

static void cp_destroy(ct_strategy *p) {
    cp *c = p;
    if (!c) return;
    log_ring(c);
    for (cp_positions *q = c->positions, *n; q; q = n) {
        n = q->next;
        c->env.dapi->free(c->env.dev, q->pos);
        free(q);
    }
    while (c->freqs) {
        cp_freqs *f = c->freqs;
        c->freqs = f->next;
        c->env.dapi->free(c->env.dev, f->dev);
        free(f);
    }
    if (c->positions_bytes) c->host->mem_account(c->host, CT_MEM_OTHER, -c->positions_bytes);
    free(c);
}

/* Nothing to split: every rank computes with whole parameters. The slots are kept for report() and
 * finish_backward, which read what the data-parallel strategy placed after this. */
static ct_status cp_place(ct_strategy *p, ct_param_slot *slots, int n) {
    cp *c = p;
    c->slots = slots;
    c->n_slots = n;
    return CT_OK;
}

static ct_status cp_setup(ct_strategy *p, ct_param_slot *slots, int n, int n_units) {
    cp *c = p;
    (void)n_units;
    c->slots = slots;
    c->n_slots = n;
    ct_util_use_local_storage(slots, n); /* a data-parallel strategy may repoint them */
    return CT_OK;
}

static ct_status cp_post_backward(ct_strategy *p, int unit, int last_microbatch) {
    (void)unit;
    ((cp *)p)->last |= last_microbatch;
    return CT_OK;
}

/* A slot whose gradient this plugin sums over cp: one this rank holds that no data-parallel strategy
 * sums over dp_shard x cp. Experts split over ep (ABI 2.17) are complete already: the ep group's
 * all-to-all brings them the tokens of its cp ranks, and the reduction over efsdp the rest of
 * dp_shard x cp. */
static int summed_here(const ct_param_slot *s) {
    if (s->placement == CT_PLACE_NONE || s->local_numel == 0) return 0;
    if (CT_HAS_FIELD(s, ct_param_slot, split_axis) && s->split_dim >= 0 && s->split_axis == CT_AXIS_EP) return 0;
    return !(s->placement == CT_PLACE_SHARD && s->shard_axis == CT_AXIS_DP_SHARD_CP);
}

/* Runs after the data-parallel strategy's finish (finish_backward goes in reverse order), so the
 * local gradients hold everything but the other cp ranks' tokens: summed here, once per step, after
 * the last pass (gradient accumulation and pipeline microbatches call this once per pass). */
static ct_status cp_finish_backward(ct_strategy *p) {
    cp *c = p;
    int last = c->last;
    c->last = 0;
    if (!last || c->size <= 1) return CT_OK;
    for (int i = 0; i < c->n_slots; i++) {
        ct_param_slot *s = CT_SLOT_AT(c->slots, i);
        if (!summed_here(s)) continue;
        ct_status st = c->env.capi->all_reduce(c->env.comm, c->group, s->local_grad, s->local_grad, s->local_numel,
                                               CT_F32, CT_REDUCE_SUM, NULL);
        if (cp_failed(c, st, "all-reduce of a gradient over cp")) return st;
    }
    return CT_OK;
}

/* The collectives no op sees: finish_backward's all-reduce over cp of each slot no data-parallel
 * strategy shards over dp_shard x cp, once per step, blocking. Every other collective of context
 * parallel belongs to an op (the loss's all-reduce, the custom ops' gathers and ring transfers,
 * ulysses' all-to-alls on the builder), which the planner sees through the builder per microbatch.
 * Memory: the custom ops' temporaries are the builder's scratch or, for ulysses' reordering in
 * backward, the unit's backward region (their plan reserves it, so the planner counts it there);
 * what this plugin allocates itself is the position tables, a few int32 per token. */
static ct_status cp_report(ct_strategy *p, int n_microbatches, ct_strategy_report *out) {
    cp *c = p;
    (void)n_microbatches; /* once per step whatever the count */
    ct_util_report_clear(out);
    out->mem_bytes[CT_MEM_OTHER] = c->env.planning ? 2 * c->env.seq_len * (int64_t)sizeof(int32_t) : c->positions_bytes;
    for (int i = 0; c->size > 1 && i < c->n_slots; i++) {
        const ct_param_slot *s = CT_SLOT_AT(c->slots, i);
        if (!summed_here(s)) continue;
        ct_util_report_comm(out, CT_AXIS_CP, CT_COLL_ALL_REDUCE, s->unit, CT_PHASE_BACKWARD,
                            (double)s->local_numel * sizeof(float), 1.0, 0);
    }
    return CT_OK;
}

static ct_status cp_wrap_builder(ct_strategy *p, ct_builder *next, ct_builder *out) {
    cp_builder_init(p, next, out);
    return CT_OK;
}

/* Every sequence splits into 2 x cp chunks, and each rank's rows over tp (sequence parallel). */
static int64_t cp_sequence_multiple(ct_strategy *p) {
    const cp *c = p;
    int tp = c->mesh.degree[CT_AXIS_TP] > 1 ? c->mesh.degree[CT_AXIS_TP] : 1;
    return 2 * (int64_t)c->size * tp;
}

static const ct_strategy_api api = {
    .struct_size = sizeof(ct_strategy_api),
    .create = cp_create,
    .destroy = cp_destroy,
    .place = cp_place,
    .setup = cp_setup,
    .pre_forward = ct_util_unit_noop,
    .post_forward = ct_util_unit_noop,
    .pre_backward = ct_util_unit_noop,
    .post_backward = cp_post_backward,
    .finish_backward = cp_finish_backward,
    .wrap_builder = cp_wrap_builder,
    .sequence_multiple = cp_sequence_multiple,
    .report = cp_report,
    .serves = CT_SERVES_AXIS,
    .axis = CT_AXIS_CP,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_STRATEGY;
    info->name = "cp";
    info->description = "context parallel: each sequence split over cp in 2 x cp load-balanced chunks, attention by "
                        "all-gathered or ring-passed K/V, or heads all-to-all'd (ulysses)";
    info->options = options;
    info->api = &api;
    info->knobs = knobs;
    return CT_OK;
}
