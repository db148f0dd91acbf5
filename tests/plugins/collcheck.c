/* collcheck.c: a test strategy that holds the builder's collectives to the data movement
 * ctitan/model.h documents (ct_collective, CT_DIM_ROWS / CT_DIM_COLS), forward and backward, on real
 * ranks; used by tests/cli/builder_collectives.sh as parallelism.cp_strategy by path, so it serves
 * the cp mesh axis (its group may be the world or a sub-group of it).
 *
 * It places every parameter as context parallel does (the data-parallel strategy shards over
 * dp_shard x cp) and wraps the builder's embedding: after the next builder's embedding of each
 * microbatch it runs four checks over the cp axis, each a chain of
 *
 *   src   a custom op with no inputs whose output x holds values that name this rank and the
 *         element; its backward compares x's gradient with the conjugate collective's exact result
 *   y = collective(x)
 *   sink  a custom op (y, e) -> e: its forward compares y with the exact result; its backward passes
 *         e's gradient through and gives y a gradient that names the rank and the element
 *
 * for: the all-to-all by columns of a (2, 3, N W) tensor, (rows, c) -> (N rows, c / N), and by rows of
 * a (2, 2N, W) one, (rows, c) -> (rows / N, N c), each backward the other direction; the 1-D all-gather
 * (backward: reduce-scatter) of 3 elements; the 1-D reduce-scatter (backward: all-gather) of 3N.
 * Values are small integers, so every sum is exact and the comparisons are for equality. A mismatch
 * fails the op (CT_ERR_INTERNAL) with one line naming the check, the element, what came and what was
 * due. At destroy every rank logs how many checks passed, which the test compares with the steps.
 * The planner's builder (ctitan train's start-up plan) runs the embedding alone.
 */
#include "ctitan/model.h"
#include "ctitan/strategy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { W = 2, K = 3 }; /* columns per rank's block (all-to-all); elements per rank's block (1-D) */
enum { A2A_COLS = 0, A2A_ROWS = 1, GATHER_1D = 2, SCATTER_1D = 3, N_CHECKS = 4 };
static const char *const check_names[N_CHECKS] = {"all-to-all by columns", "all-to-all by rows", "1-D all-gather",
                                                  "1-D reduce-scatter"};

typedef struct ct_strategy { /* the ABI's opaque ct_strategy */
    const ct_host *host;
    ct_strategy_env env;
    int size, rank; /* the cp axis */
    int world;      /* this rank in the world */
    ct_builder *next;
    long forward_ok[N_CHECKS], backward_ok[N_CHECKS];
} collcheck;

typedef struct {
    collcheck *c;
    int check;
} op_state;

/* What rank r holds at flat element i of a check's input, and the gradient rank r gives element i of
 * its output. Both distinct per rank and element; the 1-D ones small enough to sum exactly. */
static float input_value(int check, int r, int64_t i) {
    return check >= GATHER_1D ? (float)(100 * r + i) : (float)(1000 * r + i);
}
static float grad_value(int check, int r, int64_t i) {
    return check >= GATHER_1D ? (float)(-10 * r - (int)i - 1) : (float)(-1000 * r - i - 1);
}

/* The shapes: input (ndim, shape), output numel. */
static int input_shape(const collcheck *c, int check, int64_t *shape) {
    int n = c->size;
    switch (check) {
    case A2A_COLS: shape[0] = 2, shape[1] = 3, shape[2] = (int64_t)n * W; return 3;
    case A2A_ROWS: shape[0] = 2, shape[1] = 2 * (int64_t)n, shape[2] = W; return 3;
    case GATHER_1D: shape[0] = K; return 1;
    default: shape[0] = (int64_t)K * n; return 1;
    }
}

/* Element i of the collective's output on rank `me`, as model.h defines the collective. */
static float forward_due(const collcheck *c, int check, int64_t i) {
    int n = c->size, me = c->rank;
    switch (check) {
    case A2A_COLS: { /* x (6 rows, n W): rank p's rows come back stacked, this rank's run of columns */
        int64_t row = i / W, col = i % W, p = row / 6, r = row % 6;
        return input_value(check, (int)p, r * n * W + me * W + col);
    }
    case A2A_ROWS: { /* x (4n rows, W): this rank's run of 4 rows from every rank, set side by side */
        int64_t row = i / ((int64_t)n * W), col = i % ((int64_t)n * W), p = col / W, j = col % W;
        return input_value(check, (int)p, (me * 4 + row) * W + j);
    }
    case GATHER_1D: return input_value(check, (int)(i / K), i % K);
    default: {
        float sum = 0;
        for (int p = 0; p < n; p++) sum += input_value(check, p, me * K + i);
        return sum;
    }
    }
}

/* Element i of x's gradient on rank `me`: the conjugate collective of every rank's grad_value. */
static float backward_due(const collcheck *c, int check, int64_t i) {
    int n = c->size, me = c->rank;
    switch (check) {
    case A2A_COLS: { /* x (6, n W); y (6 n, W): element (r, p W + j) went to rank p as its row me 6 + r */
        int64_t r = i / ((int64_t)n * W), col = i % ((int64_t)n * W), p = col / W, j = col % W;
        return grad_value(check, (int)p, (me * 6 + r) * W + j);
    }
    case A2A_ROWS: { /* x (4n, W); y (4, n W): row p 4 + r went to rank p as its row r, columns me W.. */
        int64_t row = i / W, j = i % W, p = row / 4, r = row % 4;
        return grad_value(check, (int)p, r * n * W + me * W + j);
    }
    case GATHER_1D: { /* the reduce-scatter: this rank's block summed over the ranks */
        float sum = 0;
        for (int p = 0; p < n; p++) sum += grad_value(check, p, me * K + i);
        return sum;
    }
    default: return grad_value(check, (int)(i / K), i % K); /* the all-gather of every rank's K */
    }
}

/* Compares n device floats with what is due; 0, or -1 with the error set. */
static int compare(collcheck *c, int check, const char *what, const float *dev, int64_t n, int backward) {
    float *got = malloc(sizeof(float) * (size_t)n);
    if (!got) {
        c->host->set_error(c->host, "out of memory");
        return -1;
    }
    int bad = 0;
    if (c->env.dapi->copy(c->env.dev, got, dev, sizeof(float) * (size_t)n, CT_COPY_D2H) != CT_OK) {
        c->host->set_error(c->host, "%s: a device copy failed", check_names[check]);
        bad = 1;
    }
    for (int64_t i = 0; i < n && !bad; i++) {
        float due = backward ? backward_due(c, check, i) : forward_due(c, check, i);
        if (got[i] != due) {
            c->host->set_error(c->host, "%s over cp %d (rank %d), %s: element %lld is %g, expected %g",
                               check_names[check], c->size, c->rank, what, (long long)i, got[i], due);
            bad = 1;
        }
    }
    free(got);
    return bad ? -1 : 0;
}

/* ---- src: x with this rank's values; its backward checks x's gradient ---- */
static ct_status src_fwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    op_state *s = sp;
    collcheck *c = s->c;
    int64_t shape[CT_MAX_DIMS] = {0};
    int nd = input_shape(c, s->check, shape);
    (void)in;
    (void)n_in;
    (void)n_out;
    if (!(out[0] = b->new_tensor(b, CT_F32, nd, shape))) return CT_ERR_NOMEM;
    int64_t n = ct_tensor_numel(out[0]);
    float *host = malloc(sizeof(float) * (size_t)n);
    if (!host) return CT_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++) host[i] = input_value(s->check, c->rank, i);
    ct_status st = c->env.dapi->copy(c->env.dev, out[0]->data, host, sizeof(float) * (size_t)n, CT_COPY_H2D);
    free(host);
    return st;
}

static ct_status src_bwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                         const float *const *dy, int n_out, int halves) {
    op_state *s = sp;
    (void)b;
    (void)in;
    (void)n_in;
    (void)n_out;
    if (!(halves & CT_GRAD_INPUT)) return CT_OK;
    if (!dy[0]) {
        s->c->host->set_error(s->c->host, "%s: no gradient reached its input", check_names[s->check]);
        return CT_ERR_INTERNAL;
    }
    if (compare(s->c, s->check, "the input's gradient (backward)", dy[0], ct_tensor_numel(out[0]), 1))
        return CT_ERR_INTERNAL;
    s->c->backward_ok[s->check]++;
    return CT_OK;
}

/* ---- sink: (y, e) -> e, y checked; backward gives y its gradient ---- */
static ct_status sink_fwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    op_state *s = sp;
    collcheck *c = s->c;
    const ct_tensor *y = in[0], *e = in[1];
    (void)n_in;
    (void)n_out;
    if (compare(c, s->check, "the output (forward)", y->data, ct_tensor_numel(y), 0)) return CT_ERR_INTERNAL;
    c->forward_ok[s->check]++;
    if (!(out[0] = b->new_tensor(b, CT_F32, e->ndim, e->shape))) return CT_ERR_NOMEM;
    return c->env.dapi->copy(c->env.dev, out[0]->data, e->data, sizeof(float) * (size_t)ct_tensor_numel(e),
                             CT_COPY_D2D);
}

static ct_status sink_bwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                          const float *const *dy, int n_out, int halves) {
    op_state *s = sp;
    collcheck *c = s->c;
    ct_tensor *y = in[0], *e = in[1];
    (void)out;
    (void)n_in;
    (void)n_out;
    if (!(halves & CT_GRAD_INPUT)) return CT_OK;
    int64_t ny = ct_tensor_numel(y), ne = ct_tensor_numel(e);
    float *gy = b->grad(b, y), *ge = b->grad(b, e), *tmp = b->scratch(b, sizeof(float) * (size_t)ny);
    float *host = malloc(sizeof(float) * (size_t)ny);
    if (!gy || !ge || !tmp || !host) {
        free(host);
        return CT_ERR_NOMEM;
    }
    for (int64_t i = 0; i < ny; i++) host[i] = grad_value(s->check, c->rank, i);
    ct_status st = c->env.dapi->copy(c->env.dev, tmp, host, sizeof(float) * (size_t)ny, CT_COPY_H2D);
    free(host);
    if (st == CT_OK) st = c->env.dapi->axpy(c->env.dev, gy, tmp, 1.0f, ny);
    if (st == CT_OK && dy[0]) st = c->env.dapi->axpy(c->env.dev, ge, dy[0], 1.0f, ne);
    return st;
}

static const ct_custom_op src_op = {sizeof(ct_custom_op), "collcheck.src", src_fwd, src_bwd, NULL};
static const ct_custom_op sink_op = {sizeof(ct_custom_op), "collcheck.sink", sink_fwd, sink_bwd, NULL};

/* One check chained onto e: e's stand-in (the same values) on the way to the loss, or NULL. */
static ct_tensor *run_check(collcheck *c, ct_builder *n, int check, ct_tensor *e) {
    static const ct_collective kinds[N_CHECKS] = {CT_COLL_ALL_TO_ALL, CT_COLL_ALL_TO_ALL, CT_COLL_ALL_GATHER,
                                                  CT_COLL_REDUCE_SCATTER};
    static const int dims[N_CHECKS] = {CT_DIM_COLS, CT_DIM_ROWS, CT_DIM_ROWS, CT_DIM_COLS}; /* a vector: either */
    op_state s = {c, check};
    ct_tensor *x[1] = {NULL};
    if (n->custom(n, &src_op, &s, sizeof s, NULL, 0, x, 1) != CT_OK) return NULL;
    ct_tensor *y = n->collective(n, kinds[check], x[0], CT_AXIS_CP, dims[check]);
    ct_tensor *in[2] = {y, e}, *out[1] = {NULL};
    if (!y || n->custom(n, &sink_op, &s, sizeof s, in, 2, out, 1) != CT_OK) return NULL;
    return out[0];
}

static ct_tensor *cc_embedding(ct_builder *b, const ct_tensor *ids, ct_tensor *table) {
    collcheck *c = b->ctx;
    ct_builder *n = c->next;
    ct_tensor *e = n->embedding(n, ids, table);
    if (n->planning) return e;
    for (int k = 0; k < N_CHECKS && e; k++) e = run_check(c, n, k, e);
    return e;
}

/* ---- the strategy: cp's placement, the builder wrapped ---- */
static ct_status cc_create(const ct_host *host, const ct_strategy_env *env, ct_strategy **out) {
    collcheck *c = calloc(1, sizeof *c);
    if (!c) return CT_ERR_NOMEM;
    c->host = host;
    c->env = *env;
    c->size = env->mesh->degree[CT_AXIS_CP];
    c->rank = env->mesh->coord[CT_AXIS_CP];
    c->world = env->mesh->world_rank;
    *out = c;
    return CT_OK;
}

static void cc_destroy(ct_strategy *p) {
    collcheck *c = p;
    if (!c) return;
    if (!c->env.planning) /* stderr: every rank's line (the world rank keeps equal lines apart) */
        c->host->log(c->host, CT_LOG_WARN,
                     "collcheck: rank %d, cp rank %d of %d: exact forward/backward: all-to-all by columns %ld/%ld, "
                     "by rows %ld/%ld, 1-D all-gather %ld/%ld, 1-D reduce-scatter %ld/%ld",
                     c->world, c->rank, c->size, c->forward_ok[0], c->backward_ok[0], c->forward_ok[1], c->backward_ok[1],
                     c->forward_ok[2], c->backward_ok[2], c->forward_ok[3], c->backward_ok[3]);
    free(c);
}

static ct_status cc_place(ct_strategy *p, ct_param_slot *slots, int n) {
    (void)p;
    (void)slots;
    (void)n;
    return CT_OK;
}

static ct_status cc_setup(ct_strategy *p, ct_param_slot *slots, int n, int n_units) {
    (void)p;
    (void)n_units;
    int whole = n > 0 && CT_HAS_FIELD(slots, ct_param_slot, whole_grad);
    for (int i = 0; i < n; i++) { /* as context parallel: compute on the local storage */
        ct_param_slot *s = CT_SLOT_AT(slots, i);
        if (!whole || !s->whole_data) s->param->data = s->local_data;
        if (!whole || !s->whole_grad) s->param->grad = s->local_grad;
    }
    return CT_OK;
}

static ct_status cc_noop(ct_strategy *p, int unit) {
    (void)p;
    (void)unit;
    return CT_OK;
}

static ct_status cc_post_backward(ct_strategy *p, int unit, int last) {
    (void)p;
    (void)unit;
    (void)last;
    return CT_OK;
}

static ct_status cc_finish(ct_strategy *p) {
    (void)p;
    return CT_OK;
}

static ct_status cc_wrap(ct_strategy *p, ct_builder *next, ct_builder *out) {
    collcheck *c = p;
    c->next = next;
    out->ctx = c;
    out->embedding = cc_embedding;
    return CT_OK;
}

static ct_status cc_report(ct_strategy *p, int n_microbatches, ct_strategy_report *out) {
    (void)p;
    (void)n_microbatches;
    memset(out->mem_bytes, 0, sizeof out->mem_bytes);
    out->n_comms = 0;
    return CT_OK;
}

static const ct_strategy_api api = {
    .struct_size = sizeof(ct_strategy_api),
    .create = cc_create,
    .destroy = cc_destroy,
    .place = cc_place,
    .setup = cc_setup,
    .pre_forward = cc_noop,
    .post_forward = cc_noop,
    .pre_backward = cc_noop,
    .post_backward = cc_post_backward,
    .finish_backward = cc_finish,
    .wrap_builder = cc_wrap,
    .report = cc_report,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_STRATEGY;
    info->name = "collcheck";
    info->description = "test strategy: the builder's all-to-all and 1-D collectives over cp, checked element by element";
    info->options = NULL;
    info->api = &api;
    return CT_OK;
}
