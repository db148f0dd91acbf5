/* tp.c: Megatron-style tensor parallelism as a strategy plugin, written against the public SDK only.
 *
 * The model pack's plan (ct_model_api.tp_plan, handed over in the strategy env) names a style per
 * parameter. place() splits each parameter over the tp axis: column-wise weights (and the embedding
 * and output tables) on dim 0, row-wise weights on dim 1, a column-wise linear's bias with its
 * output features; everything else stays whole. The builder
 * this plugin wraps (ops.c) then puts the collectives each style implies around the linear,
 * embedding and loss ops, through the host's differentiable collectives and its own custom ops
 * (custom.c). What is left here is the one reduction no op sees: under sequence parallel a norm
 * weight meets 1/tp of the token rows on each rank, and a CT_TP_REPLICATED_PARTIAL weight (QK-norm;
 * MLA's low-rank projections and their norms, before head-split weights) gets a partial gradient, so
 * their gradients are summed over tp after the step's last backward. ops.c refuses a replicated weight whose gradient would be partial without such a sum.
 */
#include "tp.h"
#include "ctitan/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "enable_sequence_parallel", CT_OPT_BOOL, "true",
     "under tensor parallel, shard the residual stream's token rows over tp (all-gather / reduce-scatter)", NULL, NULL},
    {sizeof(ct_option_spec), "disable_loss_parallel", CT_OPT_BOOL, "false",
     "gather the vocabulary-sharded logits before the loss instead of computing it sharded", NULL, NULL},
    {sizeof(ct_option_spec), "enable_async_tensor_parallel", CT_OPT_BOOL, "false",
     "overlap the tp all-gather with the column-wise matmul and the row-wise matmul with its reduce-scatter", NULL,
     NULL},
    {sizeof(ct_option_spec), "async_tensor_parallel_chunks", CT_OPT_INT, "4",
     "chunks per overlapped collective under async TP", "[1, 64]", NULL},
    {sizeof(ct_option_spec), "compile.enable_async_tensor_parallel", CT_OPT_BOOL, NULL,
     "torchtitan's later spelling of parallelism.enable_async_tensor_parallel; wins over it when given", NULL, NULL},
    {0},
};

/* What a planner's search may vary (ABI 2.21): async TP, in the spelling that wins. */
static const ct_search_knob knobs[] = {
    {sizeof(ct_search_knob), "compile.enable_async_tensor_parallel", "false|true", "async"},
    {0},
};

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

static ct_tp_style plan_style(const tp *t, const char *name) {
    for (const ct_tp_rule *r = t->env.tp_plan; r->pattern; r++)
        if (name && glob(r->pattern, name)) return r->style;
    return CT_TP_NONE;
}

static size_t style_slot(const tp *t, const ct_tensor *w) {
    size_t h = ((uintptr_t)w >> 4) * 0x9E3779B97F4A7C15ull, mask = t->style_cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask)
        if (!t->style_key[i] || t->style_key[i] == w) return i;
}

ct_tp_style tp_style_of(const tp *t, const ct_tensor *w) {
    if (!t->style_cap || !w) return CT_TP_NONE;
    size_t i = style_slot(t, w);
    return t->style_key[i] ? (ct_tp_style)t->style_val[i] : CT_TP_NONE;
}

/* Tensor parallel splits heads, kv heads, the feed-forward width and the vocabulary, and sequence
 * parallel the sequence: each must divide by the degree. */
static ct_status check_divides(const tp *t) {
    const ct_model_desc *d = t->env.model;
    struct {
        const char *what;
        int64_t n;
    } dims[] = {{"attention heads", d ? d->n_heads : 0},
                {"kv heads", d ? d->n_kv_heads : 0},
                {"feed-forward hidden size", d ? d->ffn_hidden : 0},
                {"vocabulary size", d ? d->vocab_size : 0},
                {"sequence length (sequence parallel)", t->sequence_parallel ? t->env.seq_len : 0}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].n > 0 && dims[i].n % t->size) {
            t->host->set_error(t->host, "tensor_parallel_degree %d must divide the %s (%lld)", t->size, dims[i].what,
                               (long long)dims[i].n);
            return CT_ERR_INVALID;
        }
    return CT_OK;
}

static ct_status read_options(tp *t) {
    const ct_host *h = t->host;
    int sp = 1, loss_off = 0, async = 0, later = 0;
    int64_t chunks = 4;
    if (h->opt_bool(h, "enable_sequence_parallel", &sp) || h->opt_bool(h, "disable_loss_parallel", &loss_off) ||
        h->opt_bool(h, "enable_async_tensor_parallel", &async) ||
        h->opt_int(h, "async_tensor_parallel_chunks", &chunks))
        return CT_ERR_INVALID;
    /* the later spelling, when given, wins (it has no default: unset answers CT_ERR_INVALID): it is the
     * knob a planner's search sets */
    if (h->opt_bool(h, "compile.enable_async_tensor_parallel", &later) == CT_OK) async = later;
    if (chunks < 1 || chunks > 64) {
        h->set_error(h, "async_tensor_parallel_chunks: expected 1 to 64 chunks, got %lld", (long long)chunks);
        return CT_ERR_INVALID;
    }
    if (async && !sp && t->mesh.world_rank == 0)
        h->log(h, CT_LOG_INFO, "async TP overlaps the sequence-parallel collectives; without sequence parallel it has no effect");
    t->sequence_parallel = sp;
    t->loss_parallel = !loss_off;
    t->async_chunks = async ? (int)chunks : 0;
    return CT_OK;
}

static ct_status tp_create(const ct_host *h, const ct_strategy_env *env, ct_strategy **out) {
    if (!CT_HAS_FIELD(env, ct_strategy_env, has_quantizer) || !env->tp_plan) {
        h->set_error(h, "the model pack declares no tensor-parallel plan (ct_model_api.tp_plan or get_tp_plan)");
        return CT_ERR_INVALID;
    }
    tp *t = calloc(1, sizeof *t);
    if (!t) return CT_ERR_NOMEM;
    t->host = h;
    t->env = *env;
    t->mesh = *env->mesh;
    t->size = t->mesh.degree[CT_AXIS_TP];
    t->rank = t->mesh.coord[CT_AXIS_TP];
    t->group = t->mesh.group[CT_AXIS_TP];
    ct_status st = read_options(t);
    if (st == CT_OK) st = check_divides(t);
    if (st != CT_OK) {
        free(t);
        return st;
    }
    *out = t;
    return CT_OK;
}

static void tp_destroy(ct_strategy *p) {
    tp *t = p;
    if (!t) return;
    free(t->style_key);
    free(t->style_val);
    free(t);
}

/* "(128)", "(256 x 64)": a tensor's shape for messages. */
static void shape_str(char *out, size_t len, const ct_tensor *w) {
    size_t k = (size_t)snprintf(out, len, "(");
    for (int d = 0; d < w->ndim && k < len; d++)
        k += (size_t)snprintf(out + k, len - k, "%s%lld", d ? " x " : "", (long long)w->shape[d]);
    if (k < len) snprintf(out + k, len - k, ")");
}

/* The dim a style splits w along, or -1 for none. A matrix: column-wise (and the embedding and
 * output tables) on dim 0, row-wise on dim 1. A 1-D tensor is a bias of the linear whose style it
 * takes: column-wise splits it with the output features; row-wise leaves it whole (it is added
 * after the reduction). */
static int split_dim(const ct_tensor *w, ct_tp_style st) {
    int cols = st == CT_TP_COLWISE || st == CT_TP_EMBED_ROWWISE || st == CT_TP_OUTPUT_COLWISE;
    if (w->ndim == 1) return st == CT_TP_COLWISE || st == CT_TP_OUTPUT_COLWISE ? 0 : -1;
    return st == CT_TP_ROWWISE ? 1 : cols ? 0 : -1;
}

/* Splits one parameter by its style (split_dim). */
static ct_status split_slot(tp *t, ct_param_slot *s, ct_tp_style st) {
    ct_tensor *w = s->param;
    int dim = split_dim(w, st);
    if (dim < 0) return CT_OK;
    if (w->ndim > 2 || w->shape[dim] % t->size) {
        char shape[96];
        shape_str(shape, sizeof shape, w);
        t->host->set_error(t->host, "tensor parallel: %s %s cannot be split in %d along dim %d (the plan says %s)",
                           w->name, shape, t->size, dim, st == CT_TP_ROWWISE ? "row-wise" : "column-wise");
        return CT_ERR_INVALID;
    }
    w->shape[dim] /= t->size;
    s->split_axis = CT_AXIS_TP;
    s->split_dim = dim;
    s->split_parts = t->size;
    s->split_index = t->rank;
    s->numel = w->ndim == 1 ? w->shape[0] : w->shape[0] * w->shape[1];
    s->placement = CT_PLACE_REPLICATE;
    s->local_numel = s->numel;
    s->offset = 0;
    if (st == CT_TP_OUTPUT_COLWISE && w->ndim == 2) t->output_rows = w->shape[0];
    return CT_OK;
}

static ct_status tp_place(ct_strategy *p, ct_param_slot *slots, int n) {
    tp *t = p;
    if (n > 0 && !CT_HAS_FIELD(slots, ct_param_slot, global_shape)) {
        t->host->set_error(t->host, "tensor parallel: the host's parameter slots predate ABI 2.0");
        return CT_ERR_UNSUPPORTED;
    }
    t->style_cap = 16;
    while (t->style_cap < (size_t)n * 2 + 2) t->style_cap *= 2;
    t->style_key = calloc(t->style_cap, sizeof *t->style_key);
    t->style_val = calloc(t->style_cap, 1);
    if (!t->style_key || !t->style_val) return CT_ERR_NOMEM;
    t->slots = slots; /* report() reads the placement (a planning instance gets no setup) */
    t->n_slots = n;
    for (int i = 0; i < n; i++) {
        ct_param_slot *s = CT_SLOT_AT(slots, i);
        if (s->placement == CT_PLACE_NONE) continue; /* another pipeline stage's */
        ct_tp_style st = plan_style(t, s->param->name);
        if (st == CT_TP_NONE) continue;
        size_t k = style_slot(t, s->param);
        t->style_key[k] = s->param;
        t->style_val[k] = (unsigned char)st;
        ct_status rc = split_slot(t, s, st);
        if (rc != CT_OK) return rc;
    }
    return CT_OK;
}

static ct_status tp_setup(ct_strategy *p, ct_param_slot *slots, int n, int n_units) {
    tp *t = p;
    (void)n_units;
    t->slots = slots;
    t->n_slots = n;
    ct_util_use_local_storage(slots, n); /* a data-parallel strategy may repoint them */
    return CT_OK;
}

/* Notes whether this backward is the step's last: under pipeline parallel post_backward runs per
 * microbatch, with last on each unit's final one, in an order the schedule decides. */
static ct_status tp_post_backward(ct_strategy *p, int unit, int last_microbatch) {
    (void)unit;
    ((tp *)p)->last |= last_microbatch;
    return CT_OK;
}

int tp_grad_summed(const tp *t, const ct_tensor *w) {
    ct_tp_style style = tp_style_of(t, w);
    if (style == CT_TP_REPLICATED_PARTIAL) return 1;
    int whole_bias = style == CT_TP_ROWWISE && w->ndim == 1; /* added to 1/tp of the rows too */
    return t->sequence_parallel && (style == CT_TP_SEQUENCE_PARALLEL || whole_bias);
}

/* Runs after the data-parallel strategy's finish: the local gradients are final but for tp. Under
 * sequence parallel a norm weight and a row-wise linear's bias (whole, added after the
 * reduce-scatter) each met 1/tp of the token rows, and with or without it a CT_TP_REPLICATED_PARTIAL
 * weight met head-split activations: their gradients are summed over tp (tp_grad_summed). */
static ct_status tp_finish_backward(ct_strategy *p) {
    tp *t = p;
    int last = t->last;
    t->last = 0;
    if (!last) return CT_OK;
    for (int i = 0; i < t->n_slots; i++) {
        ct_param_slot *s = CT_SLOT_AT(t->slots, i);
        if (s->local_numel == 0 || !tp_grad_summed(t, s->param)) continue;
        ct_status st = t->env.capi->all_reduce(t->env.comm, t->group, s->local_grad, s->local_grad, s->local_numel,
                                               CT_F32, CT_REDUCE_SUM, NULL);
        if (st) return st;
    }
    return CT_OK;
}

/* The one collective no op sees: finish_backward's all-reduce of the gradients of the weights that
 * met 1/tp of the token rows under sequence parallel (norms, row-wise biases) or head-split
 * activations (CT_TP_REPLICATED_PARTIAL), once per step after the
 * last microbatch, blocking. Every other collective of tensor parallel belongs to an op (the host's
 * differentiable collectives and this plugin's custom ops): the planner sees those through the
 * builder, per microbatch. No memory of its own: the custom ops' outputs are the tape's and their
 * temporaries the builder's scratch. */
static ct_status tp_report(ct_strategy *p, int n_microbatches, ct_strategy_report *out) {
    tp *t = p;
    (void)n_microbatches; /* once per step whatever the count */
    ct_util_report_clear(out);
    for (int i = 0; t->size > 1 && i < t->n_slots; i++) {
        const ct_param_slot *s = CT_SLOT_AT(t->slots, i);
        if (s->placement == CT_PLACE_NONE || s->local_numel == 0 || !tp_grad_summed(t, s->param)) continue;
        ct_util_report_comm(out, CT_AXIS_TP, CT_COLL_ALL_REDUCE, s->unit, CT_PHASE_BACKWARD,
                            (double)s->local_numel * sizeof(float), 1.0, 0);
    }
    return CT_OK;
}

static ct_status tp_wrap_builder(ct_strategy *p, ct_builder *next, ct_builder *out) {
    tp_builder_init(p, next, out);
    return CT_OK;
}

static int64_t tp_sequence_multiple(ct_strategy *p) {
    const tp *t = p;
    return t->sequence_parallel ? t->size : 1;
}

static const ct_strategy_api api = {
    .struct_size = sizeof(ct_strategy_api),
    .create = tp_create,
    .destroy = tp_destroy,
    .place = tp_place,
    .setup = tp_setup,
    .pre_forward = ct_util_unit_noop,
    .post_forward = ct_util_unit_noop,
    .pre_backward = ct_util_unit_noop,
    .post_backward = tp_post_backward,
    .finish_backward = tp_finish_backward,
    .wrap_builder = tp_wrap_builder,
    .sequence_multiple = tp_sequence_multiple,
    .report = tp_report,
    .serves = CT_SERVES_AXIS,
    .axis = CT_AXIS_TP,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_STRATEGY;
    info->name = "tp";
    info->description = "tensor parallel (Megatron): column/row-wise splits from the model's plan, sequence and loss "
                        "parallel, async TP";
    info->options = options;
    info->api = &api;
    info->knobs = knobs;
    return CT_OK;
}
