/* tape.c: the builder ops a model pack calls, their recording, and the backward replay.
 *
 * Each op runs its device forward at once and, when recording, appends a tape entry holding its
 * inputs, output and saved values. Backward walks a unit's entries in reverse and calls the
 * device's backward halves (input gradient, then weight gradient), accumulating into gradients.
 */
#include "host/host.h"
#include "engine/mesh.h"
#include "engine/runtime.h"
#include "engine/liveness.h"
#include "engine/tape.h"
#include "engine/moe.h"
#include "base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct tape_entry {
    op_kind op;
    rt_tensor *out;
    rt_tensor *in[3];
    rt_tensor *aux[2];
    float f;
    int64_t i0, i1; /* collectives: the kind, and axis * 2 + (1 if over columns) */
    struct custom_entry *custom; /* OP_CUSTOM: the strategy's op and its tensors */
    const tape_gemm *gemm;       /* OP_LINEAR: the GEMMs a builder layer handed it (NULL: the device's) */
    int idx;                     /* the op's index in its unit's pass (liveness.c) */
    tape_entry *prev;
};

#define RT(b) ((runtime *)(b)->ctx)
#define DEV(rt) (rt)->d
/* A device call's status, with a message when it failed and the callee left none. */
static ct_status dev_check(ct_status st, const char *what) {
    if (st != CT_OK && !ct_last_error()[0]) ct_set_error("device op %s failed (status %d)", what, st);
    return st;
}

static int64_t numel(const rt_tensor *t) { return ct_tensor_numel(&t->t); }

/* A new tensor in the current activation arena. */
static rt_tensor *new_tensor(runtime *rt, arena *a, ct_dtype dt, int ndim, const int64_t *shape) {
    rt_tensor *t = pool_alloc(&a->desc, sizeof *t);
    if (!t) goto nomem;
    memset(t, 0, sizeof *t);
    t->t.struct_size = sizeof t->t;
    t->t.dtype = dt;
    t->t.ndim = ndim;
    for (int i = 0; i < ndim; i++) t->t.shape[i] = shape[i];
    size_t bytes = (size_t)numel(t) * ct_dtype_size(dt);
    ct_clear_error();
    t->t.data = pool_alloc(&a->data, bytes);
    t->data_heap = a->data.heap ? &a->data : NULL;
    live_alloc(rt, t, bytes);
    rt->act_allocs++;
    if (t->data_heap) runtime_note_act_peak(rt);
    if (!t->t.data) { /* the device's reason (a memory cap, say) with ours */
        char why[400];
        snprintf(why, sizeof why, "%s", ct_last_error());
        ct_set_error("out of memory for activations (%.1f MiB more)%s%s", (double)bytes / 1048576.0, why[0] ? ": " : "",
                     why);
        return NULL;
    }
    return t;
nomem:
    ct_set_error("out of memory for activations");
    return NULL;
}

rt_tensor *tape_new_activation(runtime *rt, ct_dtype dt, int ndim, const int64_t *shape) {
    return new_tensor(rt, rt->act, dt, ndim, shape);
}

/* A tensor of x's shape. */
static rt_tensor *like(runtime *rt, const rt_tensor *x) { return new_tensor(rt, rt->act, CT_F32, x->t.ndim, x->t.shape); }

/* Called after every op, recording or not: appends its tape entry when recording, then lets
 * liveness.c give back what the op read last. */
static ct_status record(runtime *rt, op_kind op, rt_tensor *out, rt_tensor *a, rt_tensor *b, rt_tensor *c,
                        rt_tensor *aux0, rt_tensor *aux1, float f) {
    if (rt->recording) {
        tape_entry *e = pool_alloc(&rt->act->desc, sizeof *e);
        if (!e) return ct_fail(CT_ERR_NOMEM, "out of memory for the tape");
        *e = (tape_entry){op, out, {a, b, c}, {aux0, aux1}, f, 0, 0, NULL, NULL, live_op_index(rt), rt->tail};
        rt->tail = e;
    }
    rt_tensor *in[3] = {a, b, c};
    return live_op(rt, in, 3);
}

/* The checks below give CT_OK, or CT_ERR_INVALID with the model's mistake set. */
static ct_status check_f32(const ct_tensor *t, const char *op, const char *what) {
    if (!t || t->dtype != CT_F32) return ct_fail(CT_ERR_INVALID, "%s: %s must be an f32 tensor", op, what);
    return CT_OK;
}

ct_status tape_gemm_run(runtime *rt, const tape_gemm *g, const tape_gemm_call *c) {
    static const char *const half[] = {"forward", "backward_input", "backward_weight"};
    ct_status st = g->run(rt, c);
    if (st != CT_OK && !ct_last_error()[0])
        ct_set_error("%s %s%s failed (status %d)", g->name, c->offsets ? "grouped_" : "", half[c->half], st);
    return st;
}

/* ---- per-op selective checkpointing (RT_AC_OP units) ----
 * torchtitan's policy: the outputs of the compute-heavy ops (attention, every other matmul of a
 * block: the 1st, 3rd, ... and reduce-scatters) are saved in forward; everything else is
 * recomputed in backward. The recompute meets the same ops in the same order and takes the saved
 * outputs instead of computing them again, so it is bit-identical to `none`. */
static int sac_saves(runtime *rt, int is_mm) {
    if (rt->sac_phase == RT_SAC_OFF) return 0;
    return is_mm ? ++rt->sac_mm % 2 == 1 : 1;
}

/* The output of a saved op: SAVE allocates it in the saved arena and chains it; REUSE takes the
 * next saved one (a new descriptor over its data; the op then computes nothing). */
static rt_tensor *sac_out(runtime *rt, ct_dtype dt, int ndim, const int64_t *shape) {
    if (rt->sac_phase == RT_SAC_SAVE) {
        rt_tensor *t = new_tensor(rt, &rt->saved, dt, ndim, shape);
        if (!t) return NULL;
        if (rt->sac_tail) rt->sac_tail->sac_next = t;
        else rt->sac_head = t;
        rt->sac_tail = t;
        return t;
    }
    rt_tensor *src = rt->sac_head;
    if (!src || src->t.dtype != dt || src->t.ndim != ndim || memcmp(src->t.shape, shape, sizeof(int64_t) * (size_t)ndim)) {
        ct_set_error("per-op checkpointing: the recompute of a block differs from its forward");
        return NULL;
    }
    rt->sac_head = src->sac_next;
    rt_tensor *t = pool_alloc(&rt->act->desc, sizeof *t);
    if (!t) {
        ct_set_error("out of memory for activations");
        return NULL;
    }
    memset(t, 0, sizeof *t);
    t->t = src->t; /* the saved data; a gradient of its own */
    t->t.grad = NULL;
    t->t.flags = 0;
    t->seq = -1;
    return t;
}

#define SAC_REUSED(rt, saved) ((saved) && (rt)->sac_phase == RT_SAC_REUSE)

/* ---- differentiable collectives over a mesh axis ---- */

static float *grad_of(runtime *rt, rt_tensor *t);

static const char *comm_trace_name(const runtime *rt, int axis) {
    static const char *names[CT_MESH_NAXES][2] = {{"pp_comm_fwd", "pp_comm_bwd"},
                                                   {"dp_replicate_comm_fwd", "dp_replicate_comm_bwd"},
                                                   {"dp_shard_comm_fwd", "dp_shard_comm_bwd"},
                                                   {"cp_comm_fwd", "cp_comm_bwd"},
                                                   {"tp_comm_fwd", "tp_comm_bwd"}};
    return names[axis][rt->in_backward ? 1 : 0];
}

static void account_comm(runtime *rt, int axis, double seconds) {
    runtime_axis_comm *c = &rt->axis_comm[axis];
    c->seconds += seconds;
    if (rt->in_backward) c->bwd_seconds += seconds;
    rt->comm_seconds += seconds;
}

/* One blocking collective over `axis` (counted, timed, traced). kind: 'g' all-gather, 's' reduce-scatter
 * (count = the received elements), 'r' all-reduce, 'a' all-to-all (count = the elements for one rank).
 * CT_OK, or the comm's status with its error. */
static ct_status axis_collective(runtime *rt, int axis, char kind, const float *send, float *recv, int64_t count) {
    if (rt->planning) { /* nothing is sent: the planner notes what would be */
        ct_collective k = kind == 'g'   ? CT_COLL_ALL_GATHER
                          : kind == 's' ? CT_COLL_REDUCE_SCATTER
                          : kind == 'a' ? CT_COLL_ALL_TO_ALL
                                        : CT_COLL_ALL_REDUCE;
        int degree = rt->dist.mesh->degree[axis];
        double whole = (double)count * sizeof(float) * (kind == 'r' ? 1 : degree); /* a2a: one rank's send */
        return rt->observer->comm(rt, axis, k, whole, 0);
    }
    const ct_comm_api *c = rt->coll_capi;
    void *comm = rt->dist.comm, *group = rt->dist.mesh->group[axis];
    const char *name = comm_trace_name(rt, axis);
    trace_begin(name);
    double t0 = ct_now();
    ct_clear_error();
    ct_status st = kind == 'g'   ? c->all_gather(comm, group, send, recv, count, CT_F32, NULL)
                   : kind == 's' ? c->reduce_scatter(comm, group, send, recv, count, CT_F32, CT_REDUCE_SUM, NULL)
                   : kind == 'a' ? c->all_to_all(comm, group, send, recv, count, CT_F32, NULL)
                                 : c->all_reduce(comm, group, send, recv, count, CT_F32, CT_REDUCE_SUM, NULL);
    account_comm(rt, axis, ct_now() - t0);
    trace_end(name);
    rt->axis_comm[axis].collectives++;
    if (st != CT_OK) {
        if (!ct_last_error()[0])
            ct_set_error("%s over the %s axis failed (status %d)",
                         kind == 'g'   ? "all-gather"
                         : kind == 's' ? "reduce-scatter"
                         : kind == 'a' ? "all-to-all"
                                       : "all-reduce",
                         mesh_axis_names[axis], st);
        return st;
    }
    return CT_OK;
}

ct_status tape_axis_all_reduce(runtime *rt, int axis, float *buf, int64_t count) {
    if (!rt->dist.mesh || axis < 0 || axis >= CT_MESH_NAXES || rt->dist.mesh->degree[axis] <= 1) return CT_OK;
    return axis_collective(rt, axis, 'r', buf, buf, count);
}

/* x's shape with dim d multiplied by num/den (checked: it must divide; CT_ERR_INVALID otherwise). */
static ct_status scaled_shape(const rt_tensor *x, int d, int64_t num, int64_t den, int64_t *shape) {
    if ((x->t.shape[d] * num) % den)
        return ct_fail(CT_ERR_INVALID, "collective: dim %d of %lld cannot be split in %lld", d,
                       (long long)x->t.shape[d], (long long)den);
    memcpy(shape, x->t.shape, sizeof(int64_t) * CT_MAX_DIMS);
    shape[d] = x->t.shape[d] * num / den;
    return CT_OK;
}

/* ---- notes strategies keep on activations (ct_builder.memo) ---- */
typedef struct rt_memo {
    const void *key;
    rt_tensor *value;
    struct rt_memo *next;
} rt_memo;

static rt_tensor *memo_get(const runtime *rt, const rt_tensor *x, const void *key) {
    if (x->memo_pass != rt->memo_pass) return NULL; /* made in an earlier unit pass: its arena may be gone */
    for (const rt_memo *m = x->memo; m; m = m->next)
        if (m->key == key) return m->value;
    return NULL;
}

static ct_status memo_put(runtime *rt, rt_tensor *x, const void *key, rt_tensor *v) {
    if (x->memo_pass != rt->memo_pass) {
        x->memo = NULL;
        x->memo_pass = rt->memo_pass;
    }
    rt_memo *m = pool_alloc(&rt->act->desc, sizeof *m);
    if (!m) return ct_fail(CT_ERR_NOMEM, "out of memory for activations");
    *m = (rt_memo){key, v, x->memo};
    x->memo = m;
    return CT_OK;
}

/* The memo keys of the collectives that are made once per tensor: [kind][axis][cols]. */
static char coll_keys[CT_COLL_ALL_TO_ALL + 1][CT_MESH_NAXES][2];

/* Every rank's columns of x (rows n, v columns here) -> (n, v * degree), through a scratch buffer. */
static ct_status gather_cols(runtime *rt, int axis, int degree, const rt_tensor *x, rt_tensor *y) {
    const ct_device_api *d = DEV(rt);
    if (!CT_HAS_FIELD(d, ct_device_api, copy_2d) || !d->copy_2d)
        return ct_fail(CT_ERR_UNSUPPORTED, "collective over columns: the device lacks copy_2d");
    int64_t v = x->t.shape[x->t.ndim - 1], n = numel(x) / v;
    pool_mark m = pool_get_mark(&rt->opscratch);
    float *all = pool_alloc(&rt->opscratch, sizeof(float) * (size_t)(n * v * degree));
    ct_status st = all ? axis_collective(rt, axis, 'g', x->t.data, all, n * v) : CT_ERR_NOMEM;
    for (int64_t p = 0; p < degree && st == CT_OK; p++)
        st = d->copy_2d(rt->dev, (float *)y->t.data + p * v, v * degree, all + p * n * v, v, n, v);
    pool_release(&rt->opscratch, m);
    return st;
}

/* The all-to-all of src (n rows of v columns here) into dst. cols: each rank's run of columns goes to
 * it, what comes back stacked as rows, (n, v) -> (degree * n, v / degree); else each rank's run of
 * rows goes to it, what comes back set side by side as columns, (n, v) -> (n / degree, degree * v). */
static ct_status all_to_all(runtime *rt, int axis, int degree, int cols, const float *src, float *dst, int64_t n,
                            int64_t v) {
    const ct_device_api *d = DEV(rt);
    if (!rt->planning && (!CT_HAS_FIELD(d, ct_device_api, copy_2d) || !d->copy_2d))
        return ct_fail(CT_ERR_UNSUPPORTED, "collective all-to-all: the device lacks copy_2d");
    int64_t count = n * v / degree; /* elements for one rank */
    pool_mark m = pool_get_mark(&rt->opscratch);
    float *tmp = pool_alloc(&rt->opscratch, sizeof(float) * (size_t)(n * v));
    ct_status st = tmp ? CT_OK : ct_fail(CT_ERR_NOMEM, "out of memory for an all-to-all");
    if (cols) { /* columns made contiguous per rank, sent; the rows that come back are the result */
        int64_t w = v / degree;
        for (int64_t p = 0; p < degree && st == CT_OK && !rt->planning; p++)
            st = d->copy_2d(rt->dev, tmp + p * count, w, src + p * w, v, n, w);
        if (st == CT_OK) st = axis_collective(rt, axis, 'a', tmp, dst, count);
    } else { /* each rank's rows are already contiguous; what comes back goes in as columns */
        int64_t r = n / degree;
        if (st == CT_OK) st = axis_collective(rt, axis, 'a', src, tmp, count);
        for (int64_t p = 0; p < degree && st == CT_OK && !rt->planning; p++)
            st = d->copy_2d(rt->dev, dst + p * v, v * degree, tmp + p * count, v, r, v);
    }
    pool_release(&rt->opscratch, m);
    return st;
}

static rt_tensor *collective_impl(runtime *rt, ct_collective kind, rt_tensor *x, int axis, int dim) {
    if (axis < 0 || axis >= CT_MESH_NAXES || kind < CT_COLL_ALL_GATHER || kind > CT_COLL_ALL_TO_ALL) {
        ct_set_error("collective: unknown kind %d or mesh axis %d", (int)kind, axis);
        return NULL;
    }
    int degree = rt->dist.mesh ? rt->dist.mesh->degree[axis] : 1, nd = x->t.ndim;
    if (degree <= 1) return x;
    int cols = dim == CT_DIM_COLS || dim == nd - 1;
    if (nd == 1 && kind != CT_COLL_ALL_TO_ALL && (dim == CT_DIM_ROWS || dim == CT_DIM_COLS || dim == 0))
        cols = 0; /* a vector is one run: its blocks are contiguous whichever dim is named */
    else if (nd < 1 || (nd == 1 && kind == CT_COLL_ALL_TO_ALL) || (!cols && dim != CT_DIM_ROWS && dim != nd - 2) ||
             (cols && kind == CT_COLL_REDUCE_SCATTER)) {
        ct_set_error("collective: dim %d of a %d-dim tensor is not supported (token rows or columns; no reduce-scatter "
                     "of columns; an all-to-all needs rows and columns)", dim, nd);
        return NULL;
    }
    int d = cols ? nd - 1 : nd >= 2 ? nd - 2 : 0,
        once = kind == CT_COLL_ALL_GATHER || kind == CT_COLL_ALL_GATHER_SLICE || kind == CT_COLL_COPY;
    const void *key = &coll_keys[kind][axis][cols];
    rt_tensor *y = once ? memo_get(rt, x, key) : NULL;
    if (y) return y;
    int64_t shape[CT_MAX_DIMS];
    switch (kind) {
    case CT_COLL_ALL_GATHER:
    case CT_COLL_ALL_GATHER_SLICE:
        if (scaled_shape(x, d, degree, 1, shape) != CT_OK || !(y = new_tensor(rt, rt->act, CT_F32, nd, shape)))
            return NULL;
        ct_status st = cols ? gather_cols(rt, axis, degree, x, y)
                            : axis_collective(rt, axis, 'g', x->t.data, y->t.data, numel(x));
        if (st != CT_OK) return NULL;
        break;
    case CT_COLL_REDUCE_SCATTER: { /* torchtitan's per-op policy saves its output */
        if (scaled_shape(x, d, 1, degree, shape) != CT_OK) return NULL;
        int saved = sac_saves(rt, 0);
        y = saved ? sac_out(rt, CT_F32, nd, shape) : new_tensor(rt, rt->act, CT_F32, nd, shape);
        if (!y || (!SAC_REUSED(rt, saved) && axis_collective(rt, axis, 's', x->t.data, y->t.data, numel(y)) != CT_OK))
            return NULL;
        break;
    }
    case CT_COLL_ALL_REDUCE:
        if (!(y = new_tensor(rt, rt->act, CT_F32, nd, x->t.shape)) ||
            axis_collective(rt, axis, 'r', x->t.data, y->t.data, numel(x)) != CT_OK)
            return NULL;
        break;
    case CT_COLL_ALL_TO_ALL: { /* (rows, c) <-> (rows * degree, c / degree), see ct_collective */
        int64_t v = x->t.shape[nd - 1], n = numel(x) / v;
        if (scaled_shape(x, nd - 1, cols ? 1 : degree, cols ? degree : 1, shape) != CT_OK ||
            (!cols && scaled_shape(x, nd - 2, 1, degree, shape) != CT_OK))
            return NULL;
        if (cols) shape[nd - 2] = x->t.shape[nd - 2] * degree;
        else shape[nd - 1] = v * degree;
        if (!(y = new_tensor(rt, rt->act, CT_F32, nd, shape)) ||
            all_to_all(rt, axis, degree, cols, x->t.data, y->t.data, n, v) != CT_OK)
            return NULL;
        break;
    }
    case CT_COLL_COPY: /* the same data, a gradient of its own */
        if (!(y = pool_alloc(&rt->act->desc, sizeof *y))) return NULL;
        memset(y, 0, sizeof *y);
        y->t = x->t;
        y->t.grad = NULL;
        y->t.flags = 0;
        y->alias = x->base ? x->base : x->alias ? x->alias : x; /* the same data: its readers keep x's alive */
        y->seq = -1;
        break;
    }
    if (record(rt, OP_COLLECTIVE, y, x, NULL, NULL, NULL, NULL, 0) != CT_OK) return NULL;
    if (rt->recording) {
        rt->tail->i0 = kind;
        rt->tail->i1 = axis * 2 + cols;
    }
    if (once && memo_put(rt, x, key, y) != CT_OK) return NULL;
    return y;
}

static ct_tensor *op_collective(ct_builder *b, ct_collective kind, ct_tensor *xt, int axis, int dim) {
    if (check_f32(xt, "collective", "x") != CT_OK) return NULL;
    rt_tensor *y = collective_impl(RT(b), kind, (rt_tensor *)xt, axis, dim);
    return y ? &y->t : NULL;
}

/* The region a unit's backward gives memory back to at each tensor's last use (the pool its
 * gradients go to, in heap mode), or NULL outside such a backward. Temporaries of a backward op
 * taken there are given back when the op is done (runtime.h op_heap). */
static pool *backward_heap(runtime *rt) { return rt->grad_pool && rt->grad_pool->heap ? rt->grad_pool : NULL; }

/* The conjugate of a collective in backward: x's gradient += f(dy). */
static ct_status collective_backward(runtime *rt, tape_entry *e, const float *dy) {
    const ct_device_api *d = DEV(rt);
    rt_tensor *x = e->in[0];
    int kind = (int)e->i0, axis = (int)(e->i1 / 2), cols = (int)(e->i1 % 2);
    int degree = rt->dist.mesh->degree[axis], me = rt->dist.mesh->coord[axis];
    int64_t nx = numel(x), v = x->t.shape[x->t.ndim - 1], n = nx / v;
    float *gx = grad_of(rt, x);
    if (!gx) return CT_ERR_NOMEM;
    if (kind == CT_COLL_ALL_REDUCE) return d->axpy(rt->dev, gx, dy, 1.0f, nx);
    if (x->t.ndim == 1) v = 1, n = nx; /* a vector is one run (its collectives are over rows) */
    if (kind == CT_COLL_ALL_GATHER_SLICE && !cols) return d->axpy(rt->dev, gx, dy + me * nx, 1.0f, nx);
    /* the temporary comes from the unit's backward region (given back below), so it shares memory
     * with the other backward temporaries; else from opscratch */
    pool *heap = backward_heap(rt);
    size_t bytes = sizeof(float) * (size_t)nx * (kind == CT_COLL_ALL_GATHER && cols ? degree + 1 : 1);
    pool_mark m = pool_get_mark(&rt->opscratch);
    float *tmp = pool_alloc(heap ? heap : &rt->opscratch, bytes);
    if (!tmp) return ct_fail(CT_ERR_NOMEM, "out of memory for activation gradients");
    if (heap) runtime_note_act_peak(rt);
    ct_status st = CT_OK;
    switch (kind) {
    case CT_COLL_ALL_GATHER:
        if (cols) /* each rank's columns made contiguous, then summed onto their rank */
            for (int64_t p = 0; p < degree && st == CT_OK; p++)
                st = d->copy_2d(rt->dev, tmp + nx + p * nx, v, dy + p * v, v * degree, n, v);
        if (st == CT_OK) st = axis_collective(rt, axis, 's', cols ? tmp + nx : dy, tmp, nx);
        break;
    case CT_COLL_ALL_GATHER_SLICE: st = d->copy_2d(rt->dev, tmp, v, dy + me * v, v * degree, n, v); break;
    case CT_COLL_REDUCE_SCATTER: st = axis_collective(rt, axis, 'g', dy, tmp, numel(e->out)); break;
    case CT_COLL_ALL_TO_ALL: { /* the inverse all-to-all of dy (shaped as the output) */
        int64_t ov = e->out->t.shape[e->out->t.ndim - 1];
        st = all_to_all(rt, axis, degree, !cols, dy, tmp, nx / ov, ov);
        break;
    }
    default: st = axis_collective(rt, axis, 'r', dy, tmp, nx); break; /* CT_COLL_COPY */
    }
    if (st == CT_OK) st = d->axpy(rt->dev, gx, tmp, 1.0f, nx);
    if (heap) pool_free(heap, tmp, bytes);
    else pool_release(&rt->opscratch, m);
    return st;
}

/* ---- custom ops a strategy records (ct_builder.custom) ---- */
#define CUSTOM_MAX_IO CT_CUSTOM_MAX_IO /* the SDK states the limit (ctitan/model.h) */

typedef struct custom_entry {
    const ct_custom_op *op;
    void *state;
    ct_tensor *in[CUSTOM_MAX_IO], *out[CUSTOM_MAX_IO];
    int n_in, n_out;
    int hidden; /* its forward made activations it did not return (its state may point at them) */
    double bwd_scratch; /* planning: its plan's backward_scratch (ABI 2.7), 0 when not given */
} custom_entry;

static ct_status param_usable(runtime *rt, const ct_tensor *t, const char *op);

static ct_status op_custom(ct_builder *b, const ct_custom_op *op, const void *state, size_t state_bytes,
                           ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    runtime *rt = RT(b);
    if (!op || !op->forward || !op->backward || n_in < 0 || n_in > CUSTOM_MAX_IO || n_out < 1 ||
        n_out > CUSTOM_MAX_IO || (n_in && !in) || !out) {
        ct_set_error("custom op %s: needs forward and backward, 0-%d inputs and 1-%d outputs", op && op->name ? op->name : "?",
                     CUSTOM_MAX_IO, CUSTOM_MAX_IO);
        return CT_ERR_INVALID;
    }
    for (int i = 0; i < n_in; i++)
        if (param_usable(rt, in[i], op->name ? op->name : "custom op") != CT_OK) return CT_ERR_INVALID;
    custom_entry *c = pool_alloc(&rt->act->desc, sizeof *c);
    void *st = state_bytes ? pool_alloc(&rt->act->desc, state_bytes) : NULL;
    if (!c || (state_bytes && !st)) {
        ct_set_error("out of memory for the tape");
        return CT_ERR_NOMEM;
    }
    memset(c, 0, sizeof *c);
    if (state_bytes) memcpy(st, state, state_bytes);
    *c = (custom_entry){.op = op, .state = st, .n_in = n_in, .n_out = n_out};
    for (int i = 0; i < n_in; i++) c->in[i] = in[i];
    pool_mark m = pool_get_mark(&rt->opscratch);
    int64_t allocs = rt->act_allocs;
    ct_clear_error();
    rt->plan_bwd_scratch = 0;
    ct_status s = rt->planning ? rt->observer->custom(rt, op, st, c->in, n_in, c->out, n_out)
                               : op->forward(&rt->builder, st, c->in, n_in, c->out, n_out);
    c->bwd_scratch = rt->plan_bwd_scratch;
    pool_release(&rt->opscratch, m);
    c->hidden = rt->act_allocs - allocs > n_out;
    for (int i = 0; i < n_out && s == CT_OK; i++)
        if (!c->out[i]) s = CT_ERR_INTERNAL;
    if (s != CT_OK) {
        if (!ct_last_error()[0]) ct_set_error("custom op %s failed (status %d)", op->name ? op->name : "?", s);
        return s;
    }
    for (int i = 0; i < n_out; i++) out[i] = c->out[i];
    if (live_check(rt, (rt_tensor *const *)c->in, n_in) != CT_OK) return CT_ERR_INTERNAL;
    if (record(rt, OP_CUSTOM, (rt_tensor *)c->out[0], NULL, NULL, NULL, NULL, NULL, 0) != CT_OK) return CT_ERR_NOMEM;
    if (rt->recording) rt->tail->custom = c;
    return CT_OK;
}

static const float *grad_if_any(const rt_tensor *t);

/* The planner's stand-in for an op's backward scratch (its plan's backward_scratch): taken and
 * given back where the runtime's op_scratch would take it. */
static ct_status plan_bwd_scratch(runtime *rt, const custom_entry *c, pool *heap) {
    if (c->bwd_scratch <= 0) return CT_OK;
    size_t bytes = (size_t)c->bwd_scratch;
    pool_mark m = pool_get_mark(&rt->opscratch);
    void *p = pool_alloc(heap ? heap : &rt->opscratch, bytes);
    if (!p) return ct_fail(CT_ERR_NOMEM, "out of memory for a custom op's backward scratch (%zu bytes)", bytes);
    if (heap) {
        runtime_note_act_peak(rt);
        pool_free(heap, p, bytes);
    } else {
        pool_release(&rt->opscratch, m);
    }
    return CT_OK;
}

static ct_status custom_backward(runtime *rt, tape_entry *e, int halves) {
    custom_entry *c = e->custom;
    const float *dy[CUSTOM_MAX_IO];
    int any = 0;
    for (int i = 0; i < c->n_out; i++) any |= (dy[i] = grad_if_any((rt_tensor *)c->out[i])) != NULL;
    if (!any) return CT_OK;
    pool *heap = backward_heap(rt);
    if (rt->planning) { /* the costs came from plan; the gradients it would accumulate into are made */
        for (int i = 0; i < c->n_in; i++) {
            rt_tensor *x = (rt_tensor *)c->in[i];
            rt_tensor *owner = x && x->base ? x->base : x;
            if (!x || x->t.dtype != CT_F32 || (owner->param && !(halves & CT_GRAD_WEIGHT)) ||
                (!owner->param && !(halves & CT_GRAD_INPUT)))
                continue;
            if (!grad_of(rt, x)) return CT_ERR_NOMEM;
        }
        return plan_bwd_scratch(rt, c, heap);
    }
    pool_mark m = pool_get_mark(&rt->opscratch);
    ct_clear_error();
    rt->op_heap = heap;
    rt->n_op_heap = 0;
    ct_status s = c->op->backward(&rt->builder, c->state, c->in, c->n_in, c->out, dy, c->n_out, halves);
    for (int i = rt->n_op_heap - 1; i >= 0; i--) pool_free(heap, rt->op_heap_at[i].p, rt->op_heap_at[i].bytes);
    rt->op_heap = NULL;
    rt->n_op_heap = 0;
    pool_release(&rt->opscratch, m);
    if (s != CT_OK && !ct_last_error()[0]) ct_set_error("custom op %s backward failed (status %d)", c->op->name, s);
    return s;
}

static ct_tensor *op_new_tensor(ct_builder *b, ct_dtype dt, int ndim, const int64_t *shape) {
    if ((dt != CT_F32 && dt != CT_I32) || ndim < 0 || ndim > CT_MAX_DIMS) {
        ct_set_error("new_tensor: f32 or int32 with 0-%d dims", CT_MAX_DIMS);
        return NULL;
    }
    rt_tensor *t = new_tensor(RT(b), RT(b)->act, dt, ndim, shape);
    return t ? &t->t : NULL;
}

/* ABI 2.7: in a backward in heap mode, from the unit's region (runtime.h op_heap); else scratch. */
static void *op_scratch(ct_builder *b, size_t bytes);
static void *op_backward_scratch(ct_builder *b, size_t bytes) {
    runtime *rt = RT(b);
    int n = rt->n_op_heap, cap = (int)(sizeof rt->op_heap_at / sizeof rt->op_heap_at[0]);
    if (!rt->op_heap || n == cap) return op_scratch(b, bytes);
    void *p = pool_alloc(rt->op_heap, bytes);
    if (!p) {
        ct_set_error("out of memory for a custom op's backward scratch (%zu bytes)", bytes);
        return NULL;
    }
    rt->op_heap_at[n].p = p;
    rt->op_heap_at[n].bytes = bytes;
    rt->n_op_heap = n + 1;
    runtime_note_act_peak(rt);
    return p;
}

static void *op_scratch(ct_builder *b, size_t bytes) {
    runtime *rt = RT(b);
    void *p = pool_alloc(&rt->opscratch, bytes);
    if (!p) ct_set_error("out of memory for a custom op's scratch (%zu bytes)", bytes);
    return p;
}

static float *op_grad(ct_builder *b, ct_tensor *t) { return t ? grad_of(RT(b), (rt_tensor *)t) : NULL; }

static ct_tensor *op_memo(ct_builder *b, ct_tensor *xt, const void *key, ct_tensor *value) {
    runtime *rt = RT(b);
    if (!xt) return NULL;
    if (!value) return (ct_tensor *)memo_get(rt, (rt_tensor *)xt, key);
    return memo_put(rt, (rt_tensor *)xt, key, (rt_tensor *)value) != CT_OK ? NULL : value;
}

static void op_account_comm(ct_builder *b, int axis, double seconds) {
    if (axis >= 0 && axis < CT_MESH_NAXES) account_comm(RT(b), axis, seconds);
}

static ct_tensor *op_finish_output(ct_builder *b, ct_tensor *x) {
    (void)b;
    return x;
}

/* ---- ops ---- */

/* A parameter the unit computes with must be its own (declared or shared with it) and have storage
 * now: a strategy provides it only inside its unit's window, so any other use would read or write
 * memory that is not the parameter's. */
static ct_status param_usable(runtime *rt, const ct_tensor *t, const char *op) {
    const rt_tensor *w = (const rt_tensor *)t;
    if (w && w->base) w = w->base;
    if (!w || !w->param || rt->cur_unit < 0) return CT_OK;
    const ct_param_slot *sl = &rt->slots[w->param - 1];
    if (sl->unit == rt->cur_unit && w->t.data) return CT_OK; /* every op with a weight passes here: keep it cheap */
    const char *un = rt->m->unit_name ? rt->m->unit_name(rt->model, rt->cur_unit) : NULL;
    if (sl->unit != rt->cur_unit)
        return ct_fail(CT_ERR_INVALID, "model: %s in unit %d (%s) uses parameter '%s' of unit %d: a parameter used by "
                       "several units must be shared with each (ct_param_registry.share)", op, rt->cur_unit,
                       un ? un : "?", w->t.name, sl->unit);
    if (!w->t.data)
        return ct_fail(CT_ERR_INVALID, "%s in unit %d (%s): parameter '%s' has no storage here (the strategy left its "
                       "data NULL)", op, rt->cur_unit, un ? un : "?", w->t.name);
    return CT_OK;
}

/* y = x w^T on this rank's operands, on the device's matmul or g's GEMMs. */
static rt_tensor *linear_plain(runtime *rt, rt_tensor *x, rt_tensor *w, const tape_gemm *g) {
    int64_t in = w->t.shape[1], outf = w->t.shape[0], n = numel(x) / in;
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, x->t.shape, sizeof shape);
    shape[x->t.ndim - 1] = outf;
    int saved = sac_saves(rt, 1);
    rt_tensor *y = saved ? sac_out(rt, CT_F32, x->t.ndim, shape) : new_tensor(rt, rt->act, CT_F32, x->t.ndim, shape);
    if (!y) return NULL;
    rt_tensor *owner = w->base ? w->base : w;
    if (rt->trace_ops == 1 && rt->observer->linear(rt, owner, n, in, outf, g, saved) != CT_OK) return NULL;
    if (!SAC_REUSED(rt, saved) && !(g && rt->planning)) { /* else computed in forward and saved */
        tape_gemm_call c = {TAPE_GEMM_FORWARD, y->t.data, x->t.data, w->t.data, NULL, n, 1, outf, in};
        if (g && tape_gemm_run(rt, g, &c) != CT_OK) return NULL;
        if (!g && dev_check(DEV(rt)->matmul(rt->dev, y->t.data, x->t.data, w->t.data, n, outf, in, 0, 1, 1.0f, 0.0f),
                            "matmul") != CT_OK)
            return NULL;
    }
    if (record(rt, OP_LINEAR, y, x, w, NULL, NULL, NULL, 0.0f) != CT_OK) return NULL;
    if (rt->recording) rt->tail->gemm = g;
    return y;
}

static ct_tensor *linear_op(runtime *rt, ct_tensor *xt, ct_tensor *wt, const tape_gemm *g) {
    rt_tensor *x = (rt_tensor *)xt, *w = (rt_tensor *)wt;
    if (check_f32(xt, "linear", "x") != CT_OK || check_f32(wt, "linear", "w") != CT_OK ||
        param_usable(rt, wt, "linear") != CT_OK)
        return NULL;
    if (w->t.ndim != 2 || x->t.shape[x->t.ndim - 1] != w->t.shape[1]) {
        ct_set_error("linear: x (..., %lld) does not match w (%lld, %lld)", (long long)x->t.shape[x->t.ndim - 1],
                     (long long)w->t.shape[0], (long long)w->t.shape[w->t.ndim - 1]);
        return NULL;
    }
    rt_tensor *y = linear_plain(rt, x, w, g);
    return y ? &y->t : NULL;
}

static ct_tensor *op_linear(ct_builder *b, ct_tensor *xt, ct_tensor *wt) { return linear_op(RT(b), xt, wt, NULL); }

static ct_tensor *op_bias(ct_builder *b, ct_tensor *xt, ct_tensor *bt) {
    runtime *rt = RT(b);
    rt_tensor *x = (rt_tensor *)xt, *bs = (rt_tensor *)bt;
    if (check_f32(xt, "bias", "x") != CT_OK || check_f32(bt, "bias", "bias") != CT_OK ||
        param_usable(rt, bt, "bias") != CT_OK)
        return NULL;
    int64_t c = x->t.shape[x->t.ndim - 1];
    if (numel(bs) != c) {
        ct_set_error("bias: %lld values for rows of %lld", (long long)numel(bs), (long long)c);
        return NULL;
    }
    rt_tensor *y = like(rt, x);
    if (!y) return NULL;
    if (rt->trace_ops == 1 && rt->observer->op(rt, RT_OP_BIAS, numel(x) / c, c, 0, 0, 0, 0) != CT_OK) return NULL;
    if (dev_check(DEV(rt)->bias_forward(rt->dev, y->t.data, x->t.data, bs->t.data, numel(x) / c, c), "bias_forward") !=
        CT_OK)
        return NULL;
    if (record(rt, OP_BIAS, y, x, bs, NULL, NULL, NULL, 0) != CT_OK) return NULL;
    return &y->t;
}

static ct_tensor *op_embedding(ct_builder *b, const ct_tensor *idst, ct_tensor *tablet) {
    runtime *rt = RT(b);
    rt_tensor *ids = (rt_tensor *)idst, *table = (rt_tensor *)tablet;
    if (!idst || idst->dtype != CT_I32 || check_f32(tablet, "embedding", "table") != CT_OK || table->t.ndim != 2) {
        ct_set_error("embedding: expects int32 ids and a (vocab, dim) f32 table");
        return NULL;
    }
    if (param_usable(rt, tablet, "embedding") != CT_OK) return NULL;
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, ids->t.shape, sizeof shape);
    if (ids->t.ndim >= CT_MAX_DIMS) return NULL;
    shape[ids->t.ndim] = table->t.shape[1];
    rt_tensor *y = new_tensor(rt, rt->act, CT_F32, ids->t.ndim + 1, shape);
    if (!y) return NULL;
    if (rt->trace_ops == 1 &&
        rt->observer->op(rt, RT_OP_EMBEDDING, numel(ids), table->t.shape[1], table->t.shape[0], 0, 0, 0) != CT_OK)
        return NULL;
    if (dev_check(DEV(rt)->embedding_forward_general(rt->dev, y->t.data, ids->t.data, table->t.data, numel(ids),
                                                     table->t.shape[1], 0, table->t.shape[0], 1),
                  "embedding_forward") != CT_OK)
        return NULL;
    if (record(rt, OP_EMBEDDING, y, ids, table, NULL, NULL, NULL, 0) != CT_OK) return NULL;
    return &y->t;
}

static ct_tensor *op_rmsnorm(ct_builder *b, ct_tensor *xt, ct_tensor *wt, float eps) {
    runtime *rt = RT(b);
    rt_tensor *x = (rt_tensor *)xt, *w = (rt_tensor *)wt;
    if (check_f32(xt, "rmsnorm", "x") != CT_OK || check_f32(wt, "rmsnorm", "w") != CT_OK ||
        param_usable(rt, wt, "rmsnorm") != CT_OK)
        return NULL;
    int64_t c = x->t.shape[x->t.ndim - 1], n = numel(x) / c;
    if (numel(w) != c) {
        ct_set_error("rmsnorm: weight has %lld values for rows of %lld", (long long)numel(w), (long long)c);
        return NULL;
    }
    rt_tensor *y = like(rt, x), *rstd = new_tensor(rt, rt->act, CT_F32, 1, &n);
    if (!y || !rstd) return NULL;
    if (rt->trace_ops == 1 && rt->observer->op(rt, RT_OP_RMSNORM, n, c, 0, 0, 0, 0) != CT_OK) return NULL;
    if (dev_check(DEV(rt)->rmsnorm_forward(rt->dev, y->t.data, rstd->t.data, x->t.data, w->t.data, n, c, eps),
                  "rmsnorm_forward") != CT_OK)
        return NULL;
    if (record(rt, OP_RMSNORM, y, x, w, NULL, rstd, NULL, eps) != CT_OK) return NULL;
    return &y->t;
}

static ct_tensor *op_layernorm(ct_builder *b, ct_tensor *xt, ct_tensor *wt, ct_tensor *bt, float eps) {
    runtime *rt = RT(b);
    rt_tensor *x = (rt_tensor *)xt, *w = (rt_tensor *)wt, *bs = (rt_tensor *)bt;
    if (check_f32(xt, "layernorm", "x") != CT_OK || check_f32(wt, "layernorm", "w") != CT_OK ||
        param_usable(rt, wt, "layernorm") != CT_OK)
        return NULL;
    if (bt && (check_f32(bt, "layernorm", "bias") || param_usable(rt, bt, "layernorm") != CT_OK)) return NULL;
    int64_t c = x->t.shape[x->t.ndim - 1], n = numel(x) / c;
    if (numel(w) != c || (bs && numel(bs) != c)) {
        ct_set_error("layernorm: weight/bias size does not match rows of %lld", (long long)c);
        return NULL;
    }
    rt_tensor *y = like(rt, x), *mean = new_tensor(rt, rt->act, CT_F32, 1, &n),
              *rstd = new_tensor(rt, rt->act, CT_F32, 1, &n);
    if (!y || !mean || !rstd) return NULL;
    if (rt->trace_ops == 1 && rt->observer->op(rt, RT_OP_LAYERNORM, n, c, 0, 0, 0, 0) != CT_OK) return NULL;
    if (dev_check(DEV(rt)->layernorm_forward(rt->dev, y->t.data, mean->t.data, rstd->t.data, x->t.data, w->t.data,
                                        bs ? bs->t.data : NULL, n, c, eps), "layernorm_forward") != CT_OK) return NULL;
    if (record(rt, OP_LAYERNORM, y, x, w, bs, mean, rstd, eps) != CT_OK) return NULL;
    return &y->t;
}

/* model.rope_positions: document: the rows' positions within their documents (the third plane of the
 * microbatch's (3, B, T) document tensor), or NULL to rotate by the row index. x is (B, T, H, D). */
static rt_tensor *rope_doc_rows(runtime *rt, const rt_tensor *x) {
    rt_tensor *docs = rt->cur_docs;
    if (!rt->rope_doc || !docs) return NULL;
    if (docs->t.shape[0] != 3 || docs->t.shape[1] != x->t.shape[0] || docs->t.shape[2] != x->t.shape[1]) {
        ct_set_error("rope: positions restart per document (model.rope_positions: document), but rope got %lld x %lld "
                     "rows and the microbatch has %lld x %lld", (long long)x->t.shape[0], (long long)x->t.shape[1],
                     (long long)docs->t.shape[1], (long long)docs->t.shape[2]);
        return NULL;
    }
    return docs;
}

/* Rotary embedding at the document positions of each row (b calls of one row): forward, or the backward
 * (dx += R^T dout) when `back`; table NULL for theta's plain RoPE. */
static ct_status rope_doc_rows_run(runtime *rt, const rt_tensor *docs, float *out, const float *in, const float *table,
                                   float theta, const int64_t *shape, int back) {
    const ct_device_api *d = DEV(rt);
    int64_t B = shape[0], T = shape[1], H = shape[2], D = shape[3], row = T * H * D;
    const int32_t *pos = docs->t.data ? (const int32_t *)docs->t.data + 2 * B * T : NULL;
    if (!pos) return CT_OK; /* the planner's */
    ct_status st = CT_OK;
    for (int64_t bi = 0; bi < B && st == CT_OK; bi++) {
        const int32_t *p = pos + bi * T;
        st = back ? d->rope_backward_general(rt->dev, out + bi * row, in + bi * row, p, table, theta, 1, T, H, D)
                  : d->rope_forward_general(rt->dev, out + bi * row, in + bi * row, p, table, theta, 1, T, H, D);
    }
    return dev_check(st, back ? "rope backward at document positions" : "rope at document positions");
}

static ct_tensor *op_rope(ct_builder *b, ct_tensor *xt, float theta) {
    runtime *rt = RT(b);
    rt_tensor *x = (rt_tensor *)xt;
    if (check_f32(xt, "rope", "x") != CT_OK) return NULL;
    if (x->t.ndim != 4 || x->t.shape[3] % 2) {
        ct_set_error("rope: expects x of shape (B, T, H, D) with D even");
        return NULL;
    }
    rt_tensor *y = like(rt, x), *docs = rope_doc_rows(rt, x);
    if (!y || (rt->rope_doc && rt->cur_docs && !docs)) return NULL;
    if (rt->trace_ops == 1 &&
        rt->observer->op(rt, RT_OP_ROPE, x->t.shape[0], x->t.shape[1], x->t.shape[2], x->t.shape[3], 0, 0) != CT_OK)
        return NULL;
    if (docs) {
        if (rope_doc_rows_run(rt, docs, y->t.data, x->t.data, NULL, theta, x->t.shape, 0) != CT_OK) return NULL;
    } else if (dev_check(DEV(rt)->rope_forward_general(rt->dev, y->t.data, x->t.data, NULL, NULL, theta, x->t.shape[0],
                                                       x->t.shape[1], x->t.shape[2], x->t.shape[3]),
                         "rope_forward") != CT_OK)
        return NULL;
    if (record(rt, OP_ROPE, y, x, NULL, NULL, NULL, docs, theta) != CT_OK) return NULL;
    return &y->t;
}

/* rope_freqs' tables in device memory, one per distinct table, kept until runtime_free: a copy from
 * the host at every forward would be refused inside a captured graph (compile.enable), and a
 * model has one table (a few hundred bytes). Found by content, not address. NULL when out of memory. */
struct rope_table {
    struct rope_table *next;
    float *dev;
    int64_t half;
    float host[];
};

static float *rope_table_on_device(runtime *rt, const float *inv, int64_t half) {
    size_t bytes = sizeof(float) * (size_t)half;
    for (struct rope_table *t = rt->rope_tables; t; t = t->next)
        if (t->half == half && !memcmp(t->host, inv, bytes)) return t->dev;
    struct rope_table *t = calloc(1, sizeof *t + bytes);
    if (!t) goto nomem;
    void *p = NULL;
    if (DEV(rt)->alloc(rt->dev, bytes, &p) != CT_OK || !p) {
        free(t);
        goto nomem;
    }
    if (dev_check(DEV(rt)->copy(rt->dev, p, inv, bytes, CT_COPY_H2D), "copy") != CT_OK) {
        DEV(rt)->free(rt->dev, p);
        free(t);
        return NULL;
    }
    t->dev = p;
    t->half = half;
    memcpy(t->host, inv, bytes);
    t->next = rt->rope_tables;
    rt->rope_tables = t;
    return t->dev;
nomem:
    ct_set_error("rope_freqs: out of device memory for the frequency table");
    return NULL;
}

void tape_rope_tables_free(runtime *rt) {
    while (rt->rope_tables) {
        struct rope_table *t = rt->rope_tables;
        rt->rope_tables = t->next;
        DEV(rt)->free(rt->dev, t->dev);
        free(t);
    }
}

/* ABI 2.4: rope with the pack's frequency table (host memory, D/2 floats), held on the device for
 * the run (rope_table_on_device); the tape entry's aux[0] is a view of it, which its backward
 * reads. The planner costs the op as rope. */
static ct_tensor *op_rope_freqs(ct_builder *b, ct_tensor *xt, const float *inv_freq) {
    runtime *rt = RT(b);
    rt_tensor *x = (rt_tensor *)xt;
    const ct_device_api *d = DEV(rt);
    if (check_f32(xt, "rope_freqs", "x") != CT_OK) return NULL;
    if (x->t.ndim != 4 || x->t.shape[3] % 2 || !inv_freq) {
        ct_set_error("rope_freqs: expects x of shape (B, T, H, D) with D even and a table of D/2 frequencies");
        return NULL;
    }
    if (!CT_HAS_FIELD(d, ct_device_api, rope_backward_general) || !d->rope_forward_general || !d->rope_backward_general) {
        ct_set_error("rope_freqs: the device lacks rope_forward_general/rope_backward_general (ABI 2.23), which "
                     "scaled RoPE needs");
        return NULL;
    }
    int64_t half = x->t.shape[3] / 2;
    rt_tensor *y = like(rt, x), *table = pool_alloc(&rt->act->desc, sizeof *table);
    if (!y || !table) {
        if (!table) ct_set_error("out of memory for the tape");
        return NULL;
    }
    memset(table, 0, sizeof *table);
    table->t = (ct_tensor){.struct_size = sizeof table->t, .dtype = CT_F32, .ndim = 1, .shape = {half}};
    if (!(table->t.data = rope_table_on_device(rt, inv_freq, half))) return NULL;
    rt_tensor *docs = rope_doc_rows(rt, x);
    if (rt->rope_doc && rt->cur_docs && !docs) return NULL;
    if (rt->trace_ops == 1 &&
        rt->observer->op(rt, RT_OP_ROPE, x->t.shape[0], x->t.shape[1], x->t.shape[2], x->t.shape[3], 0, 0) != CT_OK)
        return NULL;
    if (docs) {
        if (rope_doc_rows_run(rt, docs, y->t.data, x->t.data, table->t.data, 0, x->t.shape, 0) != CT_OK) return NULL;
    } else if (dev_check(d->rope_forward_general(rt->dev, y->t.data, x->t.data, NULL, table->t.data, 0, x->t.shape[0],
                                                 x->t.shape[1], x->t.shape[2], x->t.shape[3]),
                         "rope_freqs_forward") != CT_OK)
        return NULL;
    if (record(rt, OP_ROPE, y, x, NULL, NULL, table, docs, 0) != CT_OK) return NULL;
    return &y->t;
}

static ct_tensor *op_attention(ct_builder *b, ct_tensor *qt, ct_tensor *kt, ct_tensor *vt) {
    runtime *rt = RT(b);
    rt_tensor *q = (rt_tensor *)qt, *k = (rt_tensor *)kt, *v = (rt_tensor *)vt;
    if (check_f32(qt, "attention", "q") != CT_OK || check_f32(kt, "attention", "k") != CT_OK ||
        check_f32(vt, "attention", "v") != CT_OK)
        return NULL;
    const int64_t *qs = q->t.shape, *ks = k->t.shape;
    if (q->t.ndim != 4 || k->t.ndim != 4 || v->t.ndim != 4 || ks[0] != qs[0] || ks[1] != qs[1] ||
        ks[3] != qs[3] || memcmp(k->t.shape, v->t.shape, sizeof(int64_t) * 4) || qs[2] % ks[2]) {
        ct_set_error("attention: expects q (B,T,H,D), k and v (B,T,KVH,D) with H a multiple of KVH");
        return NULL;
    }
    int64_t lse_shape[3] = {qs[0], qs[2], qs[1]};
    int saved = sac_saves(rt, 0);
    rt_tensor *y = saved ? sac_out(rt, CT_F32, q->t.ndim, q->t.shape) : like(rt, q);
    rt_tensor *lse = !y ? NULL : saved ? sac_out(rt, CT_F32, 3, lse_shape) : new_tensor(rt, rt->act, CT_F32, 3, lse_shape);
    if (!y || !lse) return NULL;
    if (rt->trace_ops == 1 &&
        rt->observer->op(rt, RT_OP_ATTENTION, qs[0], qs[1], qs[2], qs[3], (int)ks[2], saved) != CT_OK)
        return NULL;
    rt_tensor *docs = rt->cur_docs; /* block-causal: the rows' positions and document ids (2, B, T) */
    if (docs && (docs->t.shape[1] != qs[0] || docs->t.shape[2] != qs[1])) {
        ct_set_error("attention: block-causal attention over %lld x %lld rows, but the microbatch's document ids are "
                     "(%lld, %lld): a strategy that splits the sequence must wrap attention itself (ct_builder.doc_ids)",
                     (long long)qs[0], (long long)qs[1], (long long)docs->t.shape[1], (long long)docs->t.shape[2]);
        return NULL;
    }
    if (docs && !SAC_REUSED(rt, saved)) {
        const int32_t *pos = docs->t.data, *doc = pos ? pos + qs[0] * qs[1] : NULL;
        if (dev_check(DEV(rt)->attention_doc_forward(rt->dev, y->t.data, lse->t.data, q->t.data, k->t.data, v->t.data,
                                                     pos, pos, doc, doc, qs[0], qs[1], qs[1], qs[2], ks[2], qs[3]),
                      "attention_doc_forward") != CT_OK)
            return NULL;
    } else if (!SAC_REUSED(rt, saved) &&
               dev_check(DEV(rt)->attention_forward(rt->dev, y->t.data, lse->t.data, q->t.data, k->t.data, v->t.data,
                                                    qs[0], qs[1], qs[2], ks[2], qs[3]),
                         "attention_forward") != CT_OK)
        return NULL;
    if (record(rt, OP_ATTENTION, y, q, k, v, lse, docs, 0) != CT_OK) return NULL;
    return &y->t;
}

static ct_status same_shape(const rt_tensor *a, const rt_tensor *b, const char *op) {
    if (a->t.ndim != b->t.ndim || memcmp(a->t.shape, b->t.shape, sizeof(int64_t) * (size_t)a->t.ndim))
        return ct_fail(CT_ERR_INVALID, "%s: operands have different shapes", op);
    return CT_OK;
}

static ct_tensor *op_swiglu(ct_builder *b, ct_tensor *at, ct_tensor *gt) {
    runtime *rt = RT(b);
    rt_tensor *a = (rt_tensor *)at, *g = (rt_tensor *)gt;
    if (check_f32(at, "swiglu", "a") != CT_OK || check_f32(gt, "swiglu", "g") != CT_OK ||
        same_shape(a, g, "swiglu") != CT_OK)
        return NULL;
    rt_tensor *y = like(rt, a);
    if (!y) return NULL;
    if (rt->trace_ops == 1 && rt->observer->op(rt, RT_OP_SWIGLU, numel(a), 0, 0, 0, 0, 0) != CT_OK) return NULL;
    if (dev_check(DEV(rt)->swiglu_forward(rt->dev, y->t.data, a->t.data, g->t.data, numel(a)), "swiglu_forward") !=
        CT_OK)
        return NULL;
    if (record(rt, OP_SWIGLU, y, a, g, NULL, NULL, NULL, 0) != CT_OK) return NULL;
    return &y->t;
}

static ct_tensor *op_gelu(ct_builder *b, ct_tensor *xt) {
    runtime *rt = RT(b);
    rt_tensor *x = (rt_tensor *)xt;
    if (check_f32(xt, "gelu", "x") != CT_OK) return NULL;
    rt_tensor *y = like(rt, x);
    if (!y) return NULL;
    if (rt->trace_ops == 1 && rt->observer->op(rt, RT_OP_GELU, numel(x), 0, 0, 0, 0, 0) != CT_OK) return NULL;
    if (dev_check(DEV(rt)->gelu_forward(rt->dev, y->t.data, x->t.data, numel(x)), "gelu_forward") != CT_OK) return NULL;
    if (record(rt, OP_GELU, y, x, NULL, NULL, NULL, NULL, 0) != CT_OK) return NULL;
    return &y->t;
}

static ct_tensor *op_add(ct_builder *b, ct_tensor *xt, ct_tensor *yt) {
    runtime *rt = RT(b);
    rt_tensor *x = (rt_tensor *)xt, *y = (rt_tensor *)yt;
    if (check_f32(xt, "add", "x") != CT_OK || check_f32(yt, "add", "y") != CT_OK || same_shape(x, y, "add") != CT_OK)
        return NULL;
    rt_tensor *o = like(rt, x);
    if (!o) return NULL;
    if (rt->trace_ops == 1 && rt->observer->op(rt, RT_OP_ADD, numel(x), 0, 0, 0, 0, 0) != CT_OK) return NULL;
    if (dev_check(DEV(rt)->add(rt->dev, o->t.data, x->t.data, y->t.data, numel(x)), "add") != CT_OK) return NULL;
    if (record(rt, OP_ADD, o, x, y, NULL, NULL, NULL, 0) != CT_OK) return NULL;
    return &o->t;
}

static ct_tensor *op_view(ct_builder *b, ct_tensor *xt, int ndim, const int64_t *shape) {
    runtime *rt = RT(b);
    rt_tensor *x = (rt_tensor *)xt;
    int64_t n = 1;
    if (ndim < 0 || ndim > CT_MAX_DIMS) {
        ct_set_error("view: %d dims (at most %d)", ndim, CT_MAX_DIMS);
        return NULL;
    }
    for (int i = 0; i < ndim; i++) n *= shape[i];
    if (n != numel(x)) {
        ct_set_error("view: %lld elements cannot be viewed as %lld", (long long)numel(x), (long long)n);
        return NULL;
    }
    rt_tensor *v = pool_alloc(&rt->act->desc, sizeof *v);
    if (!v) return NULL;
    *v = *x;
    v->data_heap = v->grad_heap = NULL; /* its owner's */
    v->t.ndim = ndim;
    memset(v->t.shape, 0, sizeof v->t.shape);
    for (int i = 0; i < ndim; i++) v->t.shape[i] = shape[i];
    v->base = x->base ? x->base : x;
    v->memo = NULL;
    v->t.grad = NULL;
    v->t.flags = 0;
    return &v->t;
}

/* y (scalar) = the sum of losses (n), on the device when it can (no wait for it). */
static ct_status loss_sum(runtime *rt, rt_tensor *y, rt_tensor *losses, int64_t n) {
    const ct_device_api *d = DEV(rt);
    if (CT_HAS_FIELD(d, ct_device_api, sum_to_device) && d->sum_to_device)
        return dev_check(d->sum_to_device(rt->dev, y->t.data, losses->t.data, n), "sum_to_device");
    double sum = 0;
    ct_status st = dev_check(d->sum(rt->dev, &sum, losses->t.data, n), "sum");
    if (st != CT_OK) return st;
    float fsum = (float)sum;
    return dev_check(d->copy(rt->dev, y->t.data, &fsum, sizeof fsum, CT_COPY_H2D), "copy");
}

static ct_tensor *op_cross_entropy(ct_builder *b, ct_tensor *lt, const ct_tensor *tt) {
    runtime *rt = RT(b);
    rt_tensor *logits = (rt_tensor *)lt, *targets = (rt_tensor *)tt;
    if (check_f32(lt, "cross_entropy", "logits") != CT_OK) return NULL;
    int64_t v = logits->t.shape[logits->t.ndim - 1], n = numel(logits) / v;
    if (!tt || tt->dtype != CT_I32 || numel(targets) != n) {
        ct_set_error("cross_entropy: targets must be int32 with one value per row of logits");
        return NULL;
    }
    rt_tensor *y = new_tensor(rt, rt->act, CT_F32, 0, NULL);
    if (!y) return NULL;
    rt_tensor *losses = new_tensor(rt, rt->act, CT_F32, 1, &n);
    if (!losses) return NULL;
    if (rt->trace_ops == 1 && rt->observer->op(rt, RT_OP_XENT, n, v, 0, 0, 0, 0) != CT_OK) return NULL;
    if (dev_check(DEV(rt)->cross_entropy_forward(rt->dev, losses->t.data, logits->t.data, targets->t.data, n, v,
                                            CT_IGNORE_INDEX), "cross_entropy_forward") != CT_OK ||
        loss_sum(rt, y, losses, n) != CT_OK)
        return NULL;
    if (record(rt, OP_CROSS_ENTROPY, y, logits, targets, NULL, NULL, NULL, 0) != CT_OK) return NULL;
    return &y->t;
}

/* ABI 2.5: the loss of logits = x w^T. Under bf16 compute the logits exist a block of rows at a
 * time (xent_rows): each block's GEMM and cross entropy in forward, the per-row losses summed once;
 * backward computes each block's logits again, its logit gradients, and from them the input's and
 * the weight's, so (rows x V) floats twice are the most it holds, not (n x V) logits and their
 * gradient. In f32, and where a block would not pay (a per-op checkpointed unit, whose recompute
 * must meet the same ops), it is the linear and cross_entropy ops themselves, the same numbers bit
 * for bit. A weight whose GEMMs a builder layer runs (a quantized one) never reaches this op: that
 * layer (quantize.c) gives the head its own linear and this builder's cross_entropy. */
static int64_t xent_rows(int64_t n, int64_t in, int64_t v) {
    /* a block's logits at most half the head input's bytes: the loss costs O(x), not O(n V) */
    int64_t r = (n * in + 2 * v - 1) / (2 * v);
    return r < 1 ? 1 : r > n ? n : r;
}

/* Whether linear_cross_entropy runs fused (in blocks) here, else as the two ops. */
static int xent_fused(runtime *rt, const ct_tensor *wt) {
    rt_tensor *w = (rt_tensor *)wt;
    return rt->bf16_compute && rt->sac_phase == RT_SAC_OFF && DEV(rt)->zero && w && w->t.dtype == CT_F32;
}

static ct_tensor *op_linear_cross_entropy(ct_builder *b, ct_tensor *xt, ct_tensor *wt, const ct_tensor *tt) {
    runtime *rt = RT(b);
    rt_tensor *x = (rt_tensor *)xt, *w = (rt_tensor *)wt, *targets = (rt_tensor *)tt;
    if (check_f32(xt, "linear_cross_entropy", "x") != CT_OK || check_f32(wt, "linear_cross_entropy", "w") != CT_OK ||
        param_usable(rt, wt, "linear_cross_entropy") != CT_OK)
        return NULL;
    if (w->t.ndim != 2 || x->t.shape[x->t.ndim - 1] != w->t.shape[1]) {
        ct_set_error("linear_cross_entropy: x (..., %lld) does not match w (%lld, %lld)",
                     (long long)x->t.shape[x->t.ndim - 1], (long long)w->t.shape[0], (long long)w->t.shape[w->t.ndim - 1]);
        return NULL;
    }
    int64_t in = w->t.shape[1], v = w->t.shape[0], n = numel(x) / in;
    if (!tt || tt->dtype != CT_I32 || numel(targets) != n) {
        ct_set_error("linear_cross_entropy: targets must be int32 with one value per row of x");
        return NULL;
    }
    rt_tensor *owner = w->base ? w->base : w;
    const ct_device_api *d = DEV(rt);
    rt_tensor *y = new_tensor(rt, rt->act, CT_F32, 0, NULL), *losses = y ? new_tensor(rt, rt->act, CT_F32, 1, &n) : NULL;
    if (!losses) return NULL;
    if (rt->trace_ops == 1) { /* the GEMM and the loss, each run again in backward */
        if (rt->observer->linear(rt, owner, n, in, v, 0, 0) != CT_OK) return NULL;
        rt->observer->refwd(rt);
        if (rt->observer->op(rt, RT_OP_XENT, n, v, 0, 0, 0, 0) != CT_OK) return NULL;
        rt->observer->refwd(rt);
    }
    int64_t rows = xent_rows(n, in, v);
    pool_mark m = pool_get_mark(&rt->opscratch);
    float *logits = pool_alloc(&rt->opscratch, sizeof(float) * (size_t)(rows * v));
    int bad = !logits;
    if (bad) ct_set_error("out of memory for the loss's logits (%lld rows)", (long long)rows);
    for (int64_t r0 = 0; r0 < n && !bad; r0 += rows) {
        int64_t nr = n - r0 < rows ? n - r0 : rows;
        bad = dev_check(d->matmul(rt->dev, logits, (const float *)x->t.data + r0 * in, w->t.data, nr, v, in, 0, 1, 1.0f,
                                  0.0f),
                        "matmul") != CT_OK ||
              dev_check(d->cross_entropy_forward(rt->dev, (float *)losses->t.data + r0, logits,
                                                 (const int32_t *)targets->t.data + r0, nr, v, CT_IGNORE_INDEX),
                        "cross_entropy_forward") != CT_OK;
    }
    pool_release(&rt->opscratch, m);
    if (bad || loss_sum(rt, y, losses, n) != CT_OK) return NULL;
    if (record(rt, OP_LINEAR_XENT, y, x, w, targets, NULL, NULL, 0) != CT_OK) return NULL;
    return &y->t;
}

static ct_tensor *op_positions(ct_builder *b, int64_t batch, int64_t seq) {
    runtime *rt = RT(b);
    int64_t shape[2] = {batch, seq};
    if (batch <= 0 || seq <= 0) {
        ct_set_error("positions: batch and seq must be positive");
        return NULL;
    }
    rt_tensor *p = new_tensor(rt, rt->act, CT_I32, 2, shape);
    int32_t *host = malloc(sizeof(int32_t) * (size_t)(batch * seq));
    if (!p || !host) {
        free(host);
        return NULL;
    }
    for (int64_t i = 0; i < batch * seq; i++) host[i] = (int32_t)(i % seq);
    ct_status st = DEV(rt)->copy(rt->dev, p->t.data, host, sizeof(int32_t) * (size_t)(batch * seq), CT_COPY_H2D);
    free(host);
    return st == CT_OK ? &p->t : NULL;
}

/* ---- trace events for the device ops, while a trace window is open ----
 * Each op's event spans its host-side call: on a CPU device the compute itself; on an asynchronous
 * device (CUDA) the launch, the kernel running later on its stream. FLOPs are counted for matmuls
 * (2 m n k) and attention (causal: 2 B H T^2 D forward, 2.5x that backward) as the planner does; the
 * memory-bound ops report 0, as torch.profiler does. */
static const char *const op_names[] = {"linear", "bias", "embedding", "rmsnorm", "layernorm", "rope", "attention",
                                       "swiglu", "gelu", "add", "cross_entropy", "collective", "custom",
                                       "linear_cross_entropy"};

static int put_shape(char *p, size_t n, const ct_tensor *t) {
    int k = snprintf(p, n, "[");
    for (int i = 0; t && i < t->ndim && (size_t)k < n; i++)
        k += snprintf(p + k, n - (size_t)k, "%s%lld", i ? "," : "", (long long)t->shape[i]);
    if ((size_t)k < n) k += snprintf(p + k, n - (size_t)k, "]");
    return k;
}

static void trace_op(const char *name, double t0, const ct_tensor *y, const ct_tensor *const *in, int n_in,
                     double flops) {
    char args[512];
    size_t n = sizeof args;
    int k = snprintf(args, n, "{\"inputs\":[");
    for (int i = 0; i < n_in && (size_t)k < n; i++) {
        if (i) k += snprintf(args + k, n - (size_t)k, ",");
        if ((size_t)k < n) k += put_shape(args + k, n - (size_t)k, in[i]);
    }
    if ((size_t)k < n) k += snprintf(args + k, n - (size_t)k, "],\"output\":");
    if ((size_t)k < n) k += put_shape(args + k, n - (size_t)k, y);
    if ((size_t)k < n) k += snprintf(args + k, n - (size_t)k, ",\"flops\":%.0f}", flops);
    if ((size_t)k >= n) snprintf(args, n, "{\"flops\":%.0f}", flops); /* too many dims to list */
    trace_complete(name, "device_op", t0, args);
}

#define TRACED_OP(name, flops, call, ...)                                                                              \
    do {                                                                                                               \
        if (!trace_active()) return call;                                                                              \
        double t0_ = trace_now_us();                                                                                   \
        ct_tensor *y_ = call;                                                                                          \
        const ct_tensor *in_[] = {__VA_ARGS__};                                                                        \
        if (y_) trace_op(name, t0_, y_, in_, (int)(sizeof in_ / sizeof in_[0]), (flops));                              \
        return y_;                                                                                                     \
    } while (0)

static double linear_flops(const ct_tensor *x, const ct_tensor *w) {
    return 2.0 * (double)ct_tensor_numel(x) * (double)w->shape[0]; /* 2 m n k, m k = numel(x) */
}
static double attention_flops(const ct_tensor *q) { /* q is (B, T, H, D) */
    return q->ndim == 4 ? 2.0 * (double)q->shape[0] * (double)q->shape[2] * (double)q->shape[1] * (double)q->shape[1] * (double)q->shape[3] : 0;
}

static ct_tensor *t_linear(ct_builder *b, ct_tensor *x, ct_tensor *w) {
    TRACED_OP("linear", linear_flops(x, w), op_linear(b, x, w), x, w);
}
ct_tensor *tape_linear_gemm(runtime *rt, ct_tensor *x, ct_tensor *w, const tape_gemm *g) {
    TRACED_OP("linear", linear_flops(x, w), linear_op(rt, x, w, g), x, w);
}
static ct_tensor *t_bias(ct_builder *b, ct_tensor *x, ct_tensor *bs) { TRACED_OP("bias", 0, op_bias(b, x, bs), x, bs); }
static ct_tensor *t_embedding(ct_builder *b, const ct_tensor *ids, ct_tensor *table) {
    TRACED_OP("embedding", 0, op_embedding(b, ids, table), ids, table);
}
static ct_tensor *t_rmsnorm(ct_builder *b, ct_tensor *x, ct_tensor *w, float eps) {
    TRACED_OP("rmsnorm", 0, op_rmsnorm(b, x, w, eps), x, w);
}
static ct_tensor *t_layernorm(ct_builder *b, ct_tensor *x, ct_tensor *w, ct_tensor *bs, float eps) {
    TRACED_OP("layernorm", 0, op_layernorm(b, x, w, bs, eps), x, w, bs);
}
static ct_tensor *t_rope(ct_builder *b, ct_tensor *x, float theta) { TRACED_OP("rope", 0, op_rope(b, x, theta), x); }
static ct_tensor *t_rope_freqs(ct_builder *b, ct_tensor *x, const float *inv) {
    TRACED_OP("rope", 0, op_rope_freqs(b, x, inv), x);
}
static ct_tensor *t_attention(ct_builder *b, ct_tensor *q, ct_tensor *k, ct_tensor *v) {
    TRACED_OP("attention", attention_flops(q), op_attention(b, q, k, v), q, k, v);
}
static ct_tensor *t_swiglu(ct_builder *b, ct_tensor *a, ct_tensor *g) { TRACED_OP("swiglu", 0, op_swiglu(b, a, g), a, g); }
static ct_tensor *t_gelu(ct_builder *b, ct_tensor *x) { TRACED_OP("gelu", 0, op_gelu(b, x), x); }
static ct_tensor *t_add(ct_builder *b, ct_tensor *x, ct_tensor *y) { TRACED_OP("add", 0, op_add(b, x, y), x, y); }
static ct_tensor *t_cross_entropy(ct_builder *b, ct_tensor *l, const ct_tensor *t) {
    TRACED_OP("cross_entropy", 0, op_cross_entropy(b, l, t), l, t);
}
static ct_tensor *t_linear_cross_entropy(ct_builder *b, ct_tensor *x, ct_tensor *w, const ct_tensor *t) {
    if (!xent_fused(RT(b), w)) { /* the two ops, each traced as itself */
        ct_tensor *y = t_linear(b, x, w);
        return y ? t_cross_entropy(b, y, t) : NULL;
    }
    TRACED_OP("linear_cross_entropy", linear_flops(x, w), op_linear_cross_entropy(b, x, w, t), x, w, t);
}

static const ct_tensor *op_doc_ids(ct_builder *b) {
    runtime *rt = RT(b);
    return rt->cur_doc_ids ? &rt->cur_doc_ids->t : NULL;
}

static ct_status op_device(ct_builder *b, const ct_device_api **api, ct_device **dev) {
    runtime *rt = RT(b);
    *api = DEV(rt);
    *dev = rt->dev;
    return CT_OK;
}

void tape_builder_init(runtime *rt) {
    rt->builder = (ct_builder){
        .struct_size = sizeof(ct_builder),
        .ctx = rt,
        .linear = t_linear,
        .bias = t_bias,
        .embedding = t_embedding,
        .rmsnorm = t_rmsnorm,
        .layernorm = t_layernorm,
        .rope = t_rope,
        .attention = t_attention,
        .swiglu = t_swiglu,
        .gelu = t_gelu,
        .add = t_add,
        .view = op_view,
        .cross_entropy = t_cross_entropy,
        .positions = op_positions,
        .collective = op_collective,
        .finish_output = op_finish_output,
        .new_tensor = op_new_tensor,
        .scratch = op_scratch,
        .backward_scratch = op_backward_scratch,
        .device = op_device,
        .custom = op_custom,
        .grad = op_grad,
        .memo = op_memo,
        .account_comm = op_account_comm,
        .rope_freqs = t_rope_freqs,
        .linear_cross_entropy = t_linear_cross_entropy,
        .doc_ids = op_doc_ids,
        .moe = tape_moe,
        .moe_experts = tape_moe_experts,
        .aux_loss = tape_aux_loss,
        .all_to_all_v = tape_all_to_all_v,
    };
    rt->top = &rt->builder;
}

/* ---- backward ---- */

/* The gradient buffer of t (a view's is its base's), allocated zeroed in pool p when it has none. */
float *tape_grad_in(runtime *rt, rt_tensor *t, pool *p) {
    rt_tensor *owner = t->base ? t->base : t;
    if (!owner->t.grad && owner->param) { /* never a throwaway buffer: the gradient would be lost */
        const ct_param_slot *sl = &rt->slots[owner->param - 1];
        ct_set_error("backward of unit %d: parameter '%s' (unit %d) has no gradient storage here: %s", rt->cur_unit,
                     owner->t.name, sl->unit,
                     sl->unit != rt->cur_unit ? "a parameter used by several units must be shared with each "
                                                "(ct_param_registry.share)"
                                              : "the strategy left its grad NULL inside the unit's backward window");
        return NULL;
    }
    if (!owner->t.grad) {
        size_t bytes = (size_t)numel(owner) * sizeof(float);
        owner->t.grad = pool_alloc(p, bytes);
        if (!owner->t.grad) {
            ct_set_error("out of memory for activation gradients");
            return NULL;
        }
        owner->grad_heap = p->heap ? p : NULL;
        if (p->heap) runtime_note_act_peak(rt);
        ct_clear_error();
        if (dev_check(DEV(rt)->zero(rt->dev, owner->t.grad, bytes), "zero") != CT_OK) { /* the device's reason */
            owner->t.grad = NULL;
            return NULL;
        }
    }
    return owner->t.grad;
}

static float *grad_of(runtime *rt, rt_tensor *t) { return tape_grad_in(rt, t, rt->grad_pool); }

float *tape_grad(runtime *rt, rt_tensor *t) { return grad_of(rt, t); }

static const float *grad_if_any(const rt_tensor *t) {
    const rt_tensor *owner = t->base ? t->base : t;
    return owner->t.grad;
}

/* Gradient buffers of up to three tensors (NULL entries skipped): CT_OK, or CT_ERR_NOMEM when one
 * cannot be had (grad_of's message says why). The backward helpers below return CT_OK or the status
 * of what failed, its message set. */
static ct_status grads_of(runtime *rt, rt_tensor *a, float **ga, rt_tensor *b, float **gb, rt_tensor *c, float **gc) {
    if (a && !(*ga = grad_of(rt, a))) return CT_ERR_NOMEM;
    if (b && !(*gb = grad_of(rt, b))) return CT_ERR_NOMEM;
    if (c && !(*gc = grad_of(rt, c))) return CT_ERR_NOMEM;
    return CT_OK;
}

/* Each op's backward: its input half (in) and weight half (wt) accumulate into the gradients. */
static ct_status linear_bwd(runtime *rt, tape_entry *e, const float *dy, int in, int wt) {
    const ct_device_api *d = DEV(rt);
    rt_tensor *x = e->in[0], *w = e->in[1];
    int64_t k = w->t.shape[1], m = w->t.shape[0], n = numel(x) / k;
    float *gx = NULL, *gw = NULL;
    ct_status st = grads_of(rt, in ? x : NULL, &gx, wt ? w : NULL, &gw, NULL, NULL);
    if (st != CT_OK) return st;
    const tape_gemm *g = e->gemm;
    if (g && rt->planning) return CT_OK; /* g's costs came from its plan */
    if (g) { /* g runs both GEMMs */
        tape_gemm_call ci = {TAPE_GEMM_INPUT, gx, dy, w->t.data, NULL, n, 1, m, k},
                       cw = {TAPE_GEMM_WEIGHT, gw, dy, x->t.data, NULL, n, 1, m, k};
        if (in && (st = tape_gemm_run(rt, g, &ci)) != CT_OK) return st;
        return wt ? tape_gemm_run(rt, g, &cw) : CT_OK;
    }
    if (in && (st = dev_check(d->matmul(rt->dev, gx, dy, w->t.data, n, k, m, 0, 0, 1.0f, 1.0f), "matmul")) != CT_OK)
        return st;
    if (wt) st = dev_check(d->matmul(rt->dev, gw, dy, x->t.data, m, k, n, 1, 0, 1.0f, 1.0f), "matmul");
    return st;
}

static ct_status norm_bwd(runtime *rt, tape_entry *e, const float *dy, int in, int wt) {
    const ct_device_api *d = DEV(rt);
    rt_tensor *x = e->in[0], *w = e->in[1], *bs = e->in[2];
    int64_t c = numel(w), n = numel(x) / c;
    float *gx = NULL, *gw = NULL, *gb = NULL;
    ct_status st = grads_of(rt, in ? x : NULL, &gx, wt ? w : NULL, &gw, wt ? bs : NULL, &gb);
    if (st != CT_OK) return st;
    const float *xd = x->t.data, *a0 = e->aux[0]->t.data;
    if (e->op == OP_RMSNORM) {
        if (in && (st = dev_check(d->rmsnorm_backward_input(rt->dev, gx, dy, xd, w->t.data, a0, n, c),
                                  "rmsnorm_backward_input")) != CT_OK)
            return st;
        if (wt) st = dev_check(d->rmsnorm_backward_weight(rt->dev, gw, dy, xd, a0, n, c), "rmsnorm_backward_weight");
        return st;
    }
    const float *a1 = e->aux[1]->t.data;
    if (in && (st = dev_check(d->layernorm_backward_input(rt->dev, gx, dy, xd, w->t.data, a0, a1, n, c),
                              "layernorm_backward_input")) != CT_OK)
        return st;
    if (wt)
        st = dev_check(d->layernorm_backward_weight(rt->dev, gw, gb, dy, xd, a0, a1, n, c),
                       "layernorm_backward_weight");
    return st;
}

static ct_status attention_bwd(runtime *rt, tape_entry *e, const float *dy) {
    rt_tensor *q = e->in[0], *k = e->in[1], *v = e->in[2];
    const int64_t *s = q->t.shape;
    float *gq, *gk, *gv;
    ct_status st = grads_of(rt, q, &gq, k, &gk, v, &gv);
    if (st != CT_OK) return st;
    if (e->aux[1]) { /* block-causal: the positions and document ids the forward had */
        const int32_t *pos = e->aux[1]->t.data, *doc = pos ? pos + s[0] * s[1] : NULL;
        return dev_check(DEV(rt)->attention_doc_backward(rt->dev, gq, gk, gv, dy, q->t.data, k->t.data, v->t.data,
                                                         e->out->t.data, e->aux[0]->t.data, pos, pos, doc, doc, s[0],
                                                         s[1], s[1], s[2], k->t.shape[2], s[3]),
                         "attention_doc_backward");
    }
    return dev_check(DEV(rt)->attention_backward(rt->dev, gq, gk, gv, dy, q->t.data, k->t.data, v->t.data,
                                                 e->out->t.data, e->aux[0]->t.data, s[0], s[1], s[2], k->t.shape[2],
                                                 s[3]),
                     "attention_backward");
}

/* linear_cross_entropy's blocks again: logits, their gradient (dy = d(loss)), then dx and dW. */
static ct_status linear_xent_bwd(runtime *rt, tape_entry *e, const float *dy, int in, int wt) {
    const ct_device_api *d = DEV(rt);
    rt_tensor *x = e->in[0], *w = e->in[1], *targets = e->in[2];
    int64_t k = w->t.shape[1], v = w->t.shape[0], n = numel(x) / k, rows = xent_rows(n, k, v);
    float *gx = NULL, *gw = NULL, dloss = 0;
    ct_status st = grads_of(rt, in ? x : NULL, &gx, wt ? w : NULL, &gw, NULL, NULL);
    if (st != CT_OK) return st;
    if (!gx && !gw) return CT_OK;
    int on_dev = CT_HAS_FIELD(d, ct_device_api, cross_entropy_backward_dev) && d->cross_entropy_backward_dev;
    if (!on_dev && (st = dev_check(d->copy(rt->dev, &dloss, dy, sizeof dloss, CT_COPY_D2H), "copy")) != CT_OK)
        return st;
    pool_mark m = pool_get_mark(&rt->opscratch);
    float *logits = pool_alloc(&rt->opscratch, sizeof(float) * (size_t)(rows * v));
    float *dl = logits ? pool_alloc(&rt->opscratch, sizeof(float) * (size_t)(rows * v)) : NULL;
    if (!dl) st = ct_fail(CT_ERR_NOMEM, "out of memory for the loss's logits (%lld rows)", (long long)rows);
    for (int64_t r0 = 0; r0 < n && st == CT_OK; r0 += rows) {
        int64_t nr = n - r0 < rows ? n - r0 : rows;
        const float *xr = (const float *)x->t.data + r0 * k;
        const int32_t *tr = (const int32_t *)targets->t.data + r0;
        st = dev_check(d->matmul(rt->dev, logits, xr, w->t.data, nr, v, k, 0, 1, 1.0f, 0.0f), "matmul");
        if (st == CT_OK) st = dev_check(d->zero(rt->dev, dl, sizeof(float) * (size_t)(nr * v)), "zero");
        if (st == CT_OK)
            st = dev_check(d->cross_entropy_backward_general(rt->dev, dl, logits, tr, NULL, dloss, on_dev ? dy : NULL,
                                                             nr, v, 0, CT_IGNORE_INDEX),
                           "cross_entropy_backward");
        if (st == CT_OK && gx)
            st = dev_check(d->matmul(rt->dev, gx + r0 * k, dl, w->t.data, nr, k, v, 0, 0, 1.0f, 1.0f), "matmul");
        if (st == CT_OK && gw) st = dev_check(d->matmul(rt->dev, gw, dl, xr, v, k, nr, 1, 0, 1.0f, 1.0f), "matmul");
    }
    pool_release(&rt->opscratch, m);
    return st;
}

/* The loss's gradient dloss: on the device where it reads it there (ABI 1.5; the checking layer sets
 * cross_entropy_backward_dev exactly when cross_entropy_backward_general takes dloss_dev), else read to
 * the host once by xent_host_dloss and passed by value. */
static int xent_dloss_on_device(const ct_device_api *d) {
    return CT_HAS_FIELD(d, ct_device_api, cross_entropy_backward_dev) && d->cross_entropy_backward_dev;
}

static ct_status xent_host_dloss(runtime *rt, const float *dy, float *dloss) {
    *dloss = 0;
    if (xent_dloss_on_device(DEV(rt))) return CT_OK;
    return dev_check(DEV(rt)->copy(rt->dev, dloss, dy, sizeof *dloss, CT_COPY_D2H), "copy");
}

/* dx += the gradient of the cross entropy of n rows of logits. */
static ct_status xent_grad_rows(runtime *rt, float *dx, const float *logits, const int32_t *targets, const float *dy,
                                float dloss, int64_t n, int64_t v) {
    const ct_device_api *d = DEV(rt);
    const float *dloss_dev = xent_dloss_on_device(d) ? dy : NULL;
    return dev_check(d->cross_entropy_backward_general(rt->dev, dx, logits, targets, NULL, dloss, dloss_dev, n, v, 0,
                                                       CT_IGNORE_INDEX),
                     "cross_entropy_backward");
}

/* The logits' gradient in place of the logits, when nothing reads them after this op (its
 * backward is their last reader's) and they have no gradient yet: a block of rows at a time into a
 * block-sized buffer, copied over the rows just read, so the logits and their gradient (in f32,
 * both [tokens x vocab]) are never held at once. Each row's gradient is its own: the same values.
 * *done 1 when done, 0 when it does not apply (CT_OK either way); a status on failure. */
static ct_status cross_entropy_bwd_in_place(runtime *rt, tape_entry *e, const float *dy, float dloss, int64_t n,
                                            int64_t v, int *done) {
    const ct_device_api *d = DEV(rt);
    rt_tensor *x = e->in[0], *targets = e->in[1];
    pool *heap = backward_heap(rt);
    *done = 0;
    if (!heap || x->base || x->alias || x->param || x->t.grad || (x->data_heap && x->data_heap != heap) ||
        x->last_bwd != e)
        return CT_OK;
    const tape_entry *p = e->prev; /* made in this unit's forward: else an earlier unit may read it still */
    while (p && p->out != x) p = p->prev;
    if (!p) return CT_OK;
    int64_t rows = n / 16 > 0 ? n / 16 : 1;
    size_t bytes = sizeof(float) * (size_t)(rows * v);
    float *blk = pool_alloc(heap, bytes);
    if (!blk) return ct_fail(CT_ERR_NOMEM, "out of memory for the logits' gradient (%lld rows)", (long long)rows);
    runtime_note_act_peak(rt);
    ct_status st = CT_OK;
    for (int64_t r0 = 0; r0 < n && st == CT_OK; r0 += rows) {
        int64_t nr = n - r0 < rows ? n - r0 : rows;
        float *xr = (float *)x->t.data + r0 * v;
        size_t b = sizeof(float) * (size_t)(nr * v);
        st = dev_check(d->zero(rt->dev, blk, b), "zero");
        if (st == CT_OK) st = xent_grad_rows(rt, blk, xr, (const int32_t *)targets->t.data + r0, dy, dloss, nr, v);
        if (st == CT_OK) st = dev_check(d->copy(rt->dev, xr, blk, b, CT_COPY_D2D), "copy");
    }
    pool_free(heap, blk, bytes);
    if (st != CT_OK) return st;
    x->t.grad = x->t.data; /* the gradient owns the memory now: given back after its producer's backward, */
    x->grad_heap = x->data_heap; /* or with the unit's activations */
    x->data_heap = NULL;
    *done = 1;
    return CT_OK;
}

static ct_status cross_entropy_bwd(runtime *rt, tape_entry *e, const float *dy, int both) {
    rt_tensor *x = e->in[0], *targets = e->in[1];
    int64_t v = x->t.shape[x->t.ndim - 1], n = numel(x) / v;
    float *gx, dloss;
    int done = 0;
    ct_status st = xent_host_dloss(rt, dy, &dloss);
    if (st == CT_OK && both) st = cross_entropy_bwd_in_place(rt, e, dy, dloss, n, v, &done);
    if (st != CT_OK || done) return st;
    if ((st = grads_of(rt, x, &gx, NULL, NULL, NULL, NULL)) != CT_OK) return st;
    return xent_grad_rows(rt, gx, x->t.data, targets->t.data, dy, dloss, n, v);
}

/* The ops whose backward is one elementwise device call (or two, for add). */
static ct_status pointwise_bwd(runtime *rt, tape_entry *e, const float *dy, int in, int wt) {
    const ct_device_api *d = DEV(rt);
    rt_tensor *x = e->in[0], *w = e->in[1];
    float *gx = NULL, *gw = NULL;
    ct_status st = CT_OK;
    switch (e->op) {
    case OP_BIAS:
        if ((st = grads_of(rt, in ? x : NULL, &gx, wt ? w : NULL, &gw, NULL, NULL)) != CT_OK) return st;
        if (in) st = d->axpy(rt->dev, gx, dy, 1.0f, numel(x));
        if (wt && st == CT_OK) st = d->bias_backward(rt->dev, gw, dy, numel(x) / numel(w), numel(w));
        break;
    case OP_EMBEDDING:
        if (!wt) return CT_OK;
        if ((st = grads_of(rt, w, &gw, NULL, NULL, NULL, NULL)) != CT_OK) return st;
        st = d->embedding_backward_general(rt->dev, gw, x->t.data, dy, numel(x), w->t.shape[1], 0, w->t.shape[0], 1);
        break;
    case OP_ROPE:
        if (!in) return CT_OK;
        if ((st = grads_of(rt, x, &gx, NULL, NULL, NULL, NULL)) != CT_OK) return st;
        if (e->aux[1]) /* model.rope_positions: document */
            return rope_doc_rows_run(rt, e->aux[1], gx, dy, e->aux[0] ? e->aux[0]->t.data : NULL, e->f, x->t.shape, 1);
        /* rope_freqs: the table it copied; rope: theta */
        st = d->rope_backward_general(rt->dev, gx, dy, NULL, e->aux[0] ? e->aux[0]->t.data : NULL, e->f, x->t.shape[0],
                                      x->t.shape[1], x->t.shape[2], x->t.shape[3]);
        break;
    case OP_SWIGLU:
        if (!in) return CT_OK;
        if ((st = grads_of(rt, x, &gx, w, &gw, NULL, NULL)) != CT_OK) return st;
        st = d->swiglu_backward(rt->dev, gx, gw, dy, x->t.data, w->t.data, numel(x));
        break;
    case OP_GELU:
        if (!in) return CT_OK;
        if ((st = grads_of(rt, x, &gx, NULL, NULL, NULL, NULL)) != CT_OK) return st;
        st = d->gelu_backward(rt->dev, gx, dy, x->t.data, numel(x));
        break;
    default: /* OP_ADD */
        if (!in) return CT_OK;
        if ((st = grads_of(rt, x, &gx, w, &gw, NULL, NULL)) != CT_OK) return st;
        st = d->axpy(rt->dev, gx, dy, 1.0f, numel(x));
        if (st == CT_OK) st = d->axpy(rt->dev, gw, dy, 1.0f, numel(x));
        break;
    }
    return dev_check(st, "backward");
}

static ct_status entry_backward(runtime *rt, tape_entry *e, int halves) {
    int in = halves & TAPE_INPUT, wt = halves & TAPE_WEIGHT;
    ct_status st;
    if (e->op == OP_CUSTOM) {
        rt->in_backward = 1;
        st = custom_backward(rt, e, halves);
        rt->in_backward = 0;
        return st;
    }
    const float *dy = grad_if_any(e->out);
    if (!dy) return CT_OK; /* nothing flowed into this op */
    switch (e->op) {
    case OP_LINEAR: return linear_bwd(rt, e, dy, in, wt);
    case OP_RMSNORM:
    case OP_LAYERNORM: return norm_bwd(rt, e, dy, in, wt);
    case OP_ATTENTION: return in ? attention_bwd(rt, e, dy) : CT_OK;
    case OP_CROSS_ENTROPY: return in ? cross_entropy_bwd(rt, e, dy, in && wt) : CT_OK;
    case OP_LINEAR_XENT: return linear_xent_bwd(rt, e, dy, in, wt);
    case OP_COLLECTIVE:
        if (!in) return CT_OK;
        rt->in_backward = 1;
        st = collective_backward(rt, e, dy);
        rt->in_backward = 0;
        return st;
    default: return pointwise_bwd(rt, e, dy, in, wt);
    }
}

/* A backward entry's event: its op's name with "_backward", the forward's shapes. */
static void trace_backward(const tape_entry *e, int halves, double t0) {
    const ct_tensor *in[3];
    int n = 0;
    for (int i = 0; i < 3 && e->in[i]; i++) in[n++] = &e->in[i]->t;
    double flops = 0;
    if ((e->op == OP_LINEAR || e->op == OP_LINEAR_XENT) && n >= 2) /* dX and dW: 2 m n k each (and the logits again) */
        flops = linear_flops(in[0], in[1]) * (((halves & TAPE_INPUT) != 0) + ((halves & TAPE_WEIGHT) != 0) +
                                              (e->op == OP_LINEAR_XENT));
    else if (e->op == OP_ATTENTION && n && (halves & TAPE_INPUT))
        flops = 2.5 * attention_flops(in[0]);
    char name[40];
    snprintf(name, sizeof name, "%s_backward", (unsigned)e->op < sizeof op_names / sizeof *op_names ? op_names[e->op] : "op");
    trace_op(name, t0, e->out ? &e->out->t : NULL, in, n, flops);
}

/* ---- giving activations back at their last use ----
 * Where the unit's backward runs in a pool in heap mode (runtime_unit_bwd), a tensor the tape made
 * there is given back once nothing can read it again: its data when the backward of its last
 * reader is done (the reader earliest in forward; its producer, when no backward reads it), its
 * gradient when its producer's backward is done (every reader of an output comes after its
 * producer in forward, so before it in backward), and after a recompute, what no backward reads
 * at all. */

static int64_t bytes_of(const rt_tensor *t) { return numel(t) * (int64_t)ct_dtype_size(t->t.dtype); }

void tape_give_back_data(rt_tensor *t) {
    if (!t || t->base || !t->data_heap) return;
    pool_free(t->data_heap, t->t.data, (size_t)bytes_of(t));
    t->data_heap = NULL;
}

static void give_back_grad(rt_tensor *t) {
    if (!t || t->base || !t->grad_heap) return;
    pool_free(t->grad_heap, t->t.grad, (size_t)numel(t) * sizeof(float));
    t->grad_heap = NULL;
    t->t.grad = NULL;
}

/* What op e made: its output, statistics and a custom op's outputs. */
static void entry_made(tape_entry *e, rt_tensor **made, int *n) {
    *n = 0;
    if (e->out) made[(*n)++] = e->out;
    for (int i = 0; i < 2; i++)
        if (e->aux[i]) made[(*n)++] = e->aux[i];
    if (e->custom)
        for (int i = 1; i < e->custom->n_out; i++) made[(*n)++] = (rt_tensor *)e->custom->out[i];
}

/* Whose data t is: a view's base, a copy's source, else itself. */
static rt_tensor *data_owner(rt_tensor *t) {
    rt_tensor *o = t->base ? t->base : t;
    return o->alias ? o->alias : o;
}

/* The forward tensors op e's backward reads (its device backward's arguments): up to
 * 5 + 2 * CUSTOM_MAX_IO of them in r; how many. */
static int entry_read_list(const tape_entry *e, rt_tensor **r) {
    int n = 0;
    switch (e->op) {
    case OP_ADD:
    case OP_COLLECTIVE: /* gradients and shapes only */
    case OP_BIAS: return 0;
    case OP_ROPE: /* rope_freqs' table; the document positions */
        r[n++] = e->aux[0];
        r[n++] = e->aux[1];
        return n;
    case OP_ATTENTION: r[n++] = e->out; break;
    case OP_CUSTOM:
        for (int i = 0; i < e->custom->n_in; i++) r[n++] = (rt_tensor *)e->custom->in[i];
        for (int i = 0; i < e->custom->n_out; i++) r[n++] = (rt_tensor *)e->custom->out[i];
        return n;
    default: break;
    }
    for (int i = 0; i < 3; i++) r[n++] = e->in[i];
    for (int i = 0; i < 2; i++) r[n++] = e->aux[i];
    return n;
}

static void entry_reads(const tape_entry *e, int64_t pass) {
    rt_tensor *r[5 + 2 * CUSTOM_MAX_IO];
    int n = entry_read_list(e, r);
    for (int i = 0; i < n; i++)
        if (r[i]) data_owner(r[i])->need_pass = pass;
}

static void live_raise(runtime *rt, const rt_tensor *t, int idx, int *dies_after) {
    int a = live_seq_of(rt, t);
    if (a >= 0 && dies_after[a] < idx) dies_after[a] = idx;
}

int tape_live_scan(runtime *rt, tape_entry *tail, int *dies_after, unsigned char *bwd, int n) {
    int64_t pass = ++rt->need_pass;
    for (tape_entry *e = tail; e; e = e->prev) {
        if (e->custom && e->custom->hidden) return 1;
        entry_reads(e, pass);
        if (e->idx < 0) continue;
        rt_tensor *made[2 + CUSTOM_MAX_IO];
        int nm;
        entry_made(e, made, &nm);
        for (int i = 0; i < nm; i++) live_raise(rt, made[i], e->idx, dies_after);
        for (int i = 0; i < 3; i++) live_raise(rt, e->in[i], e->idx, dies_after);
        for (int i = 0; e->custom && i < e->custom->n_in; i++)
            live_raise(rt, (rt_tensor *)e->custom->in[i], e->idx, dies_after);
        if (e->custom) live_raise(rt, e->out, e->idx, dies_after);
    }
    for (int a = 0; a < n; a++) bwd[a] = 0;
    for (tape_entry *e = tail; e; e = e->prev) { /* what a backward reads: marked on owners above */
        rt_tensor *cand[5 + 2 * CUSTOM_MAX_IO];
        int nc = 0;
        for (int i = 0; i < 3; i++) cand[nc++] = e->in[i];
        for (int i = 0; i < 2; i++) cand[nc++] = e->aux[i];
        cand[nc++] = e->out;
        for (int i = 0; e->custom && i < e->custom->n_in; i++) cand[nc++] = (rt_tensor *)e->custom->in[i];
        for (int i = 0; e->custom && i < e->custom->n_out; i++) cand[nc++] = (rt_tensor *)e->custom->out[i];
        for (int i = 0; i < nc; i++) {
            rt_tensor *t = cand[i];
            int a = live_seq_of(rt, t);
            if (a >= 0 && (t->base ? t->base : t)->need_pass == pass) bwd[a] = 1;
        }
    }
    return 0;
}

void tape_drop_unread(runtime *rt, tape_entry *tail) {
    int64_t pass = ++rt->need_pass;
    for (tape_entry *e = tail; e; e = e->prev) {
        if (e->custom && e->custom->hidden) return; /* its state may point at tensors the tape cannot see */
        entry_reads(e, pass);
    }
    for (tape_entry *e = tail; e; e = e->prev) {
        rt_tensor *made[2 + CUSTOM_MAX_IO];
        int n;
        entry_made(e, made, &n);
        for (int i = 0; i < n; i++)
            if (made[i]->need_pass != pass) tape_give_back_data(made[i]);
    }
}

/* A view or a copy of a tensor reads its owner's data, and the owner's data may have moved since
 * forward: FSDP gathers a parameter anew for backward into another buffer. So the backward of op e
 * reads every such tensor's data from its owner now, not from the address forward saw. */
static void follow_owners(tape_entry *e) {
    rt_tensor *r[7 + 3 * CUSTOM_MAX_IO];
    int n = entry_read_list(e, r);
    for (int i = 0; i < n; i++)
        if (r[i] && (r[i]->base || r[i]->alias)) r[i]->t.data = data_owner(r[i])->t.data;
}

/* What op e made and what its backward reads (r holds 7 + 3 * CUSTOM_MAX_IO); how many. */
static int entry_touches(tape_entry *e, rt_tensor **r) {
    int n = entry_read_list(e, r), m;
    entry_made(e, r + n, &m);
    return n + m;
}

/* Sets, for every tensor the unit's backward touches, the op after whose backward its data is
 * dead: its last reader in backward (the earliest in forward), else its producer. A custom op with
 * hidden state may read what its inputs do not name: then every tensor made here waits for its
 * producer, which comes after any such op in backward. */
static void mark_last_readers(tape_entry *tail) {
    rt_tensor *r[7 + 3 * CUSTOM_MAX_IO];
    int hidden = 0;
    for (tape_entry *e = tail; e; e = e->prev) {
        int n = entry_touches(e, r);
        for (int i = 0; i < n; i++)
            if (r[i]) data_owner(r[i])->last_bwd = NULL;
        hidden |= e->custom && e->custom->hidden;
    }
    for (tape_entry *e = tail; e; e = e->prev) {
        int n = entry_read_list(e, r), m;
        for (int i = 0; i < n; i++)
            if (r[i]) data_owner(r[i])->last_bwd = e;
        entry_made(e, r, &m);
        for (int i = 0; i < m; i++) {
            rt_tensor *o = data_owner(r[i]);
            if (hidden || !o->last_bwd) o->last_bwd = e;
        }
    }
}

ct_status tape_backward(runtime *rt, tape_entry *tail, int halves) {
    rt_tensor *r[7 + 3 * CUSTOM_MAX_IO];
    if (halves == TAPE_BOTH) mark_last_readers(tail);
    for (tape_entry *e = tail; e; e = e->prev) {
        int traced = trace_active() && e->op != OP_COLLECTIVE; /* a collective is the comm's event */
        double t0 = traced ? trace_now_us() : 0;
        follow_owners(e);
        ct_status st = entry_backward(rt, e, halves);
        if (st != CT_OK) return st;
        if (traced && grad_if_any(e->out)) trace_backward(e, halves, t0);
        if (halves != TAPE_BOTH) continue;
        rt_tensor *made[2 + CUSTOM_MAX_IO]; /* op e's backward was the last to add to their gradients */
        int nm;
        entry_made(e, made, &nm);
        for (int i = 0; i < nm; i++) give_back_grad(made[i]);
        int n = entry_touches(e, r); /* and the last to read these */
        for (int i = 0; i < n; i++) {
            rt_tensor *o = r[i] ? data_owner(r[i]) : NULL;
            if (o && o->last_bwd == e) tape_give_back_data(o);
        }
    }
    return CT_OK;
}

/* ---- the layers operation-level strategies wrap around the builder ----
 * A layer starts as a builder whose every op forwards to the one below it; the strategy replaces
 * the ops it changes. The forwarding ops find the builder below from their own address. */
typedef struct tape_layer {
    ct_builder b; /* first */
    ct_builder *next;
} tape_layer;

#define NEXT(b) (((tape_layer *)(b))->next)

static ct_tensor *fw_linear(ct_builder *b, ct_tensor *x, ct_tensor *w) { return NEXT(b)->linear(NEXT(b), x, w); }
static ct_tensor *fw_bias(ct_builder *b, ct_tensor *x, ct_tensor *bias) { return NEXT(b)->bias(NEXT(b), x, bias); }
static ct_tensor *fw_embedding(ct_builder *b, const ct_tensor *ids, ct_tensor *table) {
    return NEXT(b)->embedding(NEXT(b), ids, table);
}
static ct_tensor *fw_rmsnorm(ct_builder *b, ct_tensor *x, ct_tensor *w, float eps) {
    return NEXT(b)->rmsnorm(NEXT(b), x, w, eps);
}
static ct_tensor *fw_layernorm(ct_builder *b, ct_tensor *x, ct_tensor *w, ct_tensor *bias, float eps) {
    return NEXT(b)->layernorm(NEXT(b), x, w, bias, eps);
}
static ct_tensor *fw_rope(ct_builder *b, ct_tensor *x, float theta) { return NEXT(b)->rope(NEXT(b), x, theta); }
static ct_tensor *fw_rope_freqs(ct_builder *b, ct_tensor *x, const float *inv_freq) {
    return NEXT(b)->rope_freqs(NEXT(b), x, inv_freq);
}
static ct_tensor *fw_attention(ct_builder *b, ct_tensor *q, ct_tensor *k, ct_tensor *v) {
    return NEXT(b)->attention(NEXT(b), q, k, v);
}
static ct_tensor *fw_swiglu(ct_builder *b, ct_tensor *a, ct_tensor *g) { return NEXT(b)->swiglu(NEXT(b), a, g); }
static ct_tensor *fw_gelu(ct_builder *b, ct_tensor *x) { return NEXT(b)->gelu(NEXT(b), x); }
static ct_tensor *fw_add(ct_builder *b, ct_tensor *x, ct_tensor *y) { return NEXT(b)->add(NEXT(b), x, y); }
static ct_tensor *fw_view(ct_builder *b, ct_tensor *x, int ndim, const int64_t *shape) {
    return NEXT(b)->view(NEXT(b), x, ndim, shape);
}
static ct_tensor *fw_cross_entropy(ct_builder *b, ct_tensor *logits, const ct_tensor *targets) {
    return NEXT(b)->cross_entropy(NEXT(b), logits, targets);
}
/* A strategy that replaced linear or cross_entropy on this layer (loss parallel, a vocabulary-split
 * head) gets the fused op as its own two; else the op goes on down. */
static ct_tensor *fw_linear_cross_entropy(ct_builder *b, ct_tensor *x, ct_tensor *w, const ct_tensor *targets) {
    ct_builder *n = NEXT(b);
    if (b->linear != fw_linear || b->cross_entropy != fw_cross_entropy || !CT_HAS_FIELD(n, ct_builder, linear_cross_entropy) ||
        !n->linear_cross_entropy) {
        ct_tensor *y = b->linear(b, x, w);
        return y ? b->cross_entropy(b, y, targets) : NULL;
    }
    return n->linear_cross_entropy(n, x, w, targets);
}
static ct_tensor *fw_positions(ct_builder *b, int64_t batch, int64_t seq) {
    return NEXT(b)->positions(NEXT(b), batch, seq);
}
static ct_tensor *fw_collective(ct_builder *b, ct_collective kind, ct_tensor *x, int axis, int dim) {
    return NEXT(b)->collective(NEXT(b), kind, x, axis, dim);
}
static ct_tensor *fw_finish_output(ct_builder *b, ct_tensor *x) { return NEXT(b)->finish_output(NEXT(b), x); }
static ct_tensor *fw_new_tensor(ct_builder *b, ct_dtype dt, int ndim, const int64_t *shape) {
    return NEXT(b)->new_tensor(NEXT(b), dt, ndim, shape);
}
static void *fw_scratch(ct_builder *b, size_t bytes) { return NEXT(b)->scratch(NEXT(b), bytes); }
static void *fw_backward_scratch(ct_builder *b, size_t bytes) { return NEXT(b)->backward_scratch(NEXT(b), bytes); }
static ct_status fw_custom(ct_builder *b, const ct_custom_op *op, const void *state, size_t state_bytes,
                           ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    return NEXT(b)->custom(NEXT(b), op, state, state_bytes, in, n_in, out, n_out);
}
static float *fw_grad(ct_builder *b, ct_tensor *t) { return NEXT(b)->grad(NEXT(b), t); }
static ct_tensor *fw_memo(ct_builder *b, ct_tensor *x, const void *key, ct_tensor *value) {
    return NEXT(b)->memo(NEXT(b), x, key, value);
}
static void fw_account_comm(ct_builder *b, int axis, double seconds) { NEXT(b)->account_comm(NEXT(b), axis, seconds); }
static ct_status fw_device(ct_builder *b, const ct_device_api **api, ct_device **dev) {
    return NEXT(b)->device(NEXT(b), api, dev);
}
static const ct_tensor *fw_doc_ids(ct_builder *b) { return NEXT(b)->doc_ids(NEXT(b)); }
static ct_tensor *fw_moe(ct_builder *b, ct_tensor *x, const ct_moe_layer *layer) {
    return NEXT(b)->moe(NEXT(b), x, layer);
}
static ct_tensor *fw_moe_experts(ct_builder *b, ct_tensor *x, const ct_tensor *offsets, ct_tensor *w1, ct_tensor *w3,
                                 ct_tensor *w2) {
    return NEXT(b)->moe_experts(NEXT(b), x, offsets, w1, w3, w2);
}
static ct_tensor *fw_aux_loss(ct_builder *b, ct_tensor *x, ct_tensor *loss) { return NEXT(b)->aux_loss(NEXT(b), x, loss); }
static ct_tensor *fw_all_to_all_v(ct_builder *b, ct_tensor *x, int axis, const int64_t *send_rows,
                                  const int64_t *recv_rows) {
    return NEXT(b)->all_to_all_v(NEXT(b), x, axis, send_rows, recv_rows);
}

ct_builder *tape_layer_new(runtime *rt, ct_builder *next) {
    tape_layer *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    l->next = next;
    l->b = (ct_builder){
        .struct_size = sizeof(ct_builder),
        .linear = fw_linear,
        .bias = fw_bias,
        .embedding = fw_embedding,
        .rmsnorm = fw_rmsnorm,
        .layernorm = fw_layernorm,
        .rope = fw_rope,
        .attention = fw_attention,
        .swiglu = fw_swiglu,
        .gelu = fw_gelu,
        .add = fw_add,
        .view = fw_view,
        .cross_entropy = fw_cross_entropy,
        .positions = fw_positions,
        .collective = fw_collective,
        .finish_output = fw_finish_output,
        .new_tensor = fw_new_tensor,
        .scratch = fw_scratch,
        .backward_scratch = fw_backward_scratch,
        .device = fw_device,
        .custom = fw_custom,
        .grad = fw_grad,
        .memo = fw_memo,
        .account_comm = fw_account_comm,
        .rope_freqs = fw_rope_freqs,
        .linear_cross_entropy = fw_linear_cross_entropy,
        .doc_ids = fw_doc_ids,
        .moe = fw_moe,
        .moe_experts = fw_moe_experts,
        .aux_loss = fw_aux_loss,
        .all_to_all_v = fw_all_to_all_v,
        .planning = next->planning, /* a strategy's layer over the planner's builder plans too */
    };
    (void)rt;
    return &l->b;
}

void tape_layer_free(ct_builder *b) { free(b); }

ct_builder *tape_layer_next(ct_builder *b) { return NEXT(b); }

ct_status tape_note_cast(runtime *rt, int64_t elements, int in_place) {
    if (rt->trace_ops != 1 || elements <= 0) return CT_OK;
    return rt->observer->op(rt, RT_OP_CAST, elements, in_place, 0, 0, 0, 0);
}

/* Calls fn on every tensor the entries from `tail` back to the first hold (inputs, outputs, saved
 * values; `aux` 1 for the saved statistics: a norm's rstd and mean, attention's lse, a rope's
 * table, a custom op's outputs after its first). 1 when a custom op's forward made activations it
 * did not return (its state may point at them, so nothing the unit holds may move), else 0. */
int tape_visit(tape_entry *tail, void (*fn)(void *ctx, rt_tensor *t, int aux), void *ctx) {
    int hidden = 0;
    for (tape_entry *e = tail; e; e = e->prev) {
        hidden |= e->custom && e->custom->hidden;
        if (e->out) fn(ctx, e->out, 0);
        for (int i = 0; i < 3; i++)
            if (e->in[i]) fn(ctx, e->in[i], 0);
        for (int i = 0; i < 2; i++)
            if (e->aux[i]) fn(ctx, e->aux[i], 1);
        if (e->custom) {
            for (int i = 0; i < e->custom->n_in; i++)
                if (e->custom->in[i]) fn(ctx, (rt_tensor *)e->custom->in[i], 0);
            for (int i = 0; i < e->custom->n_out; i++)
                if (e->custom->out[i]) fn(ctx, (rt_tensor *)e->custom->out[i], i > 0); /* lse-like: exact */
        }
    }
    return hidden;
}
