/* mlp_tp.c: an operation-level strategy written out of tree: tensor parallel of the feed-forward
 * blocks only. Attention, the embedding and the output stay whole on every tp rank; each block's
 * w1 and w3 are split column-wise and w2 row-wise, with Megatron's f (identity forward, all-reduce
 * backward) before the column-wise pair and g (all-reduce forward) after the row-wise one:
 *
 *     h -> f -> w1, w3 (this rank's hidden features) -> swiglu -> w2 (partial sums) -> g -> out
 *
 * It uses nothing but the SDK: placement in place(), the host's differentiable collectives through
 * the builder it wraps, and one finish_backward reduction (none is needed here: every whole
 * parameter sees the same gradient on every tp rank). Load it with
 *     parallelism.tp_strategy: ./mlp_tp.so      parallelism.tensor_parallel_degree: 2
 */
#include "ctitan/strategy.h"

#include <stdlib.h>
#include <string.h>

typedef struct ct_strategy { /* the ABI's opaque ct_strategy */
    const ct_host *host;
    int size, rank;
    ct_builder *next;
    ct_tensor **colwise, **rowwise; /* the split weights, by address */
    int n_col, n_row;
} mlp_tp;

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int in_list(ct_tensor *const *list, int n, const ct_tensor *w) {
    for (int i = 0; i < n; i++)
        if (list[i] == w) return 1;
    return 0;
}

static ct_status mlp_create(const ct_host *h, const ct_strategy_env *env, ct_strategy **out) {
    mlp_tp *t = calloc(1, sizeof *t);
    if (!t) return CT_ERR_NOMEM;
    t->host = h;
    t->size = env->mesh->degree[CT_AXIS_TP];
    t->rank = env->mesh->coord[CT_AXIS_TP];
    if (env->model && env->model->ffn_hidden % t->size) {
        h->set_error(h, "tensor_parallel_degree %d must divide the feed-forward hidden size (%lld)", t->size,
                     (long long)env->model->ffn_hidden);
        free(t);
        return CT_ERR_INVALID;
    }
    *out = t;
    return CT_OK;
}

static void mlp_destroy(ct_strategy *p) {
    mlp_tp *t = p;
    free(t->colwise);
    free(t->rowwise);
    free(t);
}

/* w (out, in): block `rank` of `size` along dim. */
static void split(mlp_tp *t, ct_param_slot *s, int dim) {
    s->param->shape[dim] /= t->size;
    s->split_axis = CT_AXIS_TP;
    s->split_dim = dim;
    s->split_parts = t->size;
    s->split_index = t->rank;
    s->numel = s->param->shape[0] * s->param->shape[1];
    s->local_numel = s->numel;
}

static ct_status mlp_place(ct_strategy *p, ct_param_slot *slots, int n) {
    mlp_tp *t = p;
    t->colwise = calloc((size_t)n + 1, sizeof *t->colwise);
    t->rowwise = calloc((size_t)n + 1, sizeof *t->rowwise);
    if (!t->colwise || !t->rowwise) return CT_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        ct_param_slot *s = CT_SLOT_AT(slots, i);
        const char *name = s->param->name;
        if (s->placement == CT_PLACE_NONE || s->param->ndim != 2) continue;
        if (ends_with(name, ".feed_forward.w1.weight") || ends_with(name, ".feed_forward.w3.weight")) {
            split(t, s, 0);
            t->colwise[t->n_col++] = s->param;
        } else if (ends_with(name, ".feed_forward.w2.weight")) {
            split(t, s, 1);
            t->rowwise[t->n_row++] = s->param;
        }
    }
    return CT_OK;
}

static ct_status mlp_setup(ct_strategy *p, ct_param_slot *slots, int n, int n_units) {
    (void)p;
    (void)n_units;
    for (int i = 0; i < n; i++) { /* compute on the local block (a data-parallel strategy repoints these) */
        ct_param_slot *s = CT_SLOT_AT(slots, i);
        s->param->data = s->local_data;
        s->param->grad = s->local_grad;
    }
    return CT_OK;
}

static ct_status mlp_unit(ct_strategy *p, int unit) {
    (void)p;
    (void)unit;
    return CT_OK;
}
static ct_status mlp_post_backward(ct_strategy *p, int unit, int last) {
    (void)p;
    (void)unit;
    (void)last;
    return CT_OK;
}
static ct_status mlp_finish(ct_strategy *p) {
    (void)p;
    return CT_OK;
}

static char copy_key; /* f's output, made once per input: w1 and w3 read the same h */

static ct_tensor *mlp_linear(ct_builder *b, ct_tensor *x, ct_tensor *w) {
    mlp_tp *t = b->ctx;
    ct_builder *n = t->next;
    if (in_list(t->colwise, t->n_col, w)) {
        ct_tensor *xf = n->memo(n, x, &copy_key, NULL);
        if (!xf && (!(xf = n->collective(n, CT_COLL_COPY, x, CT_AXIS_TP, CT_DIM_ROWS)) || !n->memo(n, x, &copy_key, xf)))
            return NULL;
        return n->linear(n, xf, w);
    }
    if (in_list(t->rowwise, t->n_row, w)) {
        ct_tensor *y = n->linear(n, x, w);
        return y ? n->collective(n, CT_COLL_ALL_REDUCE, y, CT_AXIS_TP, CT_DIM_ROWS) : NULL;
    }
    return n->linear(n, x, w);
}

static ct_status mlp_wrap(ct_strategy *p, ct_builder *next, ct_builder *out) {
    mlp_tp *t = p;
    t->next = next;
    out->ctx = t;
    out->linear = mlp_linear; /* every other op already forwards to next */
    return CT_OK;
}

/* For the planner (ABI 2.1 report): this strategy allocates nothing of its own and issues no
 * collective outside an op (f and g are the builder's, which the planner sees op by op on its
 * planning builder). create and the wrapped linear touch no device or comm, so a planning instance
 * (env.planning: no device, no comm, no groups) is an ordinary one. Built against the 2.0 headers
 * (tests/cli/abi_frozen.sh does) the table has no report, and the planner says so. */
#if CT_ABI_MAJOR > 2 || CT_ABI_MINOR >= 1
static ct_status mlp_report(ct_strategy *p, int n_microbatches, ct_strategy_report *out) {
    (void)p;
    (void)n_microbatches;
    memset(out->mem_bytes, 0, sizeof out->mem_bytes);
    out->n_comms = 0;
    return CT_OK;
}
#endif

static const ct_strategy_api api = {
    .struct_size = sizeof(ct_strategy_api),
    .create = mlp_create,
    .destroy = mlp_destroy,
    .place = mlp_place,
    .setup = mlp_setup,
    .pre_forward = mlp_unit,
    .post_forward = mlp_unit,
    .pre_backward = mlp_unit,
    .post_backward = mlp_post_backward,
    .finish_backward = mlp_finish,
    .wrap_builder = mlp_wrap,
#if CT_ABI_MAJOR > 2 || CT_ABI_MINOR >= 1
    .report = mlp_report,
#endif
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_STRATEGY;
    info->name = "mlp_tp";
    info->description = "tensor parallel of the feed-forward blocks only (an out-of-tree example)";
    info->options = NULL;
    info->api = &api;
    return CT_OK;
}
