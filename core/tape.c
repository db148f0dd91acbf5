/* tape.c: the builder ops a model pack calls, their recording, and the backward replay.
 *
 * Each op runs its device forward at once and, when recording, appends a tape entry holding its
 * inputs, output and saved values. Backward walks a unit's entries in reverse and calls the
 * device's backward halves (input gradient, then weight gradient), accumulating into gradients.
 */
#include "host.h"
#include "runtime.h"
#include "tape.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct tape_entry {
    op_kind op;
    rt_tensor *out;
    rt_tensor *in[3];
    rt_tensor *aux[2];
    float f;
    int64_t i0, i1; /* embedding and loss over a vocabulary range: its first row/column, and 1 when ranged */
    tape_entry *prev;
};

#define RT(b) ((runtime *)(b)->ctx)
#define DEV(rt) (rt)->d
#define CALL(rt, expr)                                                                   \
    do {                                                                                 \
        ct_status st_ = (expr);                                                          \
        if (st_ != CT_OK) {                                                              \
            if (!ct_last_error()[0]) ct_set_error("device op failed: %s (status %d)", #expr, st_); \
            return NULL;                                                                 \
        }                                                                                \
    } while (0)

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
    t->t.data = pool_alloc(&a->data, bytes);
    if (!t->t.data) goto nomem;
    (void)rt;
    return t;
nomem:
    ct_set_error("out of memory for activations");
    return NULL;
}

rt_tensor *tape_new_activation(runtime *rt, ct_dtype dt, int ndim, const int64_t *shape) {
    return new_tensor(rt, rt->act, dt, ndim, shape);
}

/* A tensor of x's shape; row-wise ops keep x's token rows, so a sequence-parallel x stays so. */
static rt_tensor *like(runtime *rt, const rt_tensor *x) {
    rt_tensor *y = new_tensor(rt, rt->act, CT_F32, x->t.ndim, x->t.shape);
    if (y) y->sp = x->sp;
    return y;
}

static int record(runtime *rt, op_kind op, rt_tensor *out, rt_tensor *a, rt_tensor *b, rt_tensor *c,
                  rt_tensor *aux0, rt_tensor *aux1, float f) {
    if (!rt->recording) return 0;
    tape_entry *e = pool_alloc(&rt->act->desc, sizeof *e);
    if (!e) {
        ct_set_error("out of memory for the tape");
        return -1;
    }
    *e = (tape_entry){op, out, {a, b, c}, {aux0, aux1}, f, 0, 0, rt->tail};
    rt->tail = e;
    return 0;
}

/* record() for an op over a vocabulary range (tensor parallel): begin and the ranged flag. */
static int record_range(runtime *rt, op_kind op, rt_tensor *out, rt_tensor *a, rt_tensor *b, rt_tensor *aux0,
                        int64_t begin) {
    if (record(rt, op, out, a, b, NULL, aux0, NULL, 0)) return -1;
    if (rt->recording) {
        rt->tail->i0 = begin;
        rt->tail->i1 = 1;
    }
    return 0;
}

static int check_f32(const ct_tensor *t, const char *op, const char *what) {
    if (!t || t->dtype != CT_F32) {
        ct_set_error("%s: %s must be an f32 tensor", op, what);
        return -1;
    }
    return 0;
}

/* The start-up report of which linear layers float8 converts (rank 0 prints it). */
void quant_note(runtime *rt, const char *name, int yes, const char *why) {
    if (g_log_rank > 0) return;
    (void)rt;
    if (yes) printf("float8: %s converted\n", name);
    else printf("float8: %s stays in high precision (%s)\n", name, why);
}

/* ---- per-op selective checkpointing (RT_AC_OP units) ----
 * torchtitan's policy: the outputs of the compute-heavy ops (attention, every other matmul of a
 * block: the 1st, 3rd, ... and tp reduce-scatters) are saved in forward; everything else is
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
    return t;
}

#define SAC_REUSED(rt, saved) ((saved) && (rt)->sac_phase == RT_SAC_REUSE)

/* ---- tensor parallel: collectives over the tp group ---- */

/* The tp style of a parameter (CT_TP_NONE for activations, or without tensor parallel). */
static int tp_style(const runtime *rt, const rt_tensor *w) {
    const rt_tensor *owner = w->base ? w->base : w;
    if (rt->tp.size <= 1 || owner->param <= 0) return CT_TP_NONE;
    return rt->slots[owner->param - 1].tp_style;
}

#define TP_TRACE(rt) ((rt)->tp.in_backward ? "tp_comm_bwd" : "tp_comm_fwd")

static void tp_account(runtime *rt, double t0) {
    double dt = ct_now() - t0;
    rt->tp.comm_seconds += dt;
    if (rt->tp.in_backward) rt->tp.bwd_seconds += dt;
    rt->comm_seconds += dt;
    trace_end(TP_TRACE(rt));
}

static int tp_done(runtime *rt, ct_status st, double t0, const char *what) {
    tp_account(rt, t0);
    rt->tp.collectives++;
    if (st != CT_OK) {
        if (!ct_last_error()[0]) ct_set_error("tensor parallel %s failed (status %d)", what, st);
        rt->dist_status = st;
        return -1;
    }
    return 0;
}

static int tp_all_gather(runtime *rt, const float *send, float *recv, int64_t count) {
    trace_begin(TP_TRACE(rt));
    double t0 = ct_now();
    ct_clear_error();
    return tp_done(rt, rt->tp.capi->all_gather(rt->dist.comm, rt->tp.group, send, recv, count, CT_F32, NULL), t0,
                   "all-gather");
}

static int tp_reduce_scatter(runtime *rt, const float *send, float *recv, int64_t count) {
    trace_begin(TP_TRACE(rt));
    double t0 = ct_now();
    ct_clear_error();
    return tp_done(rt,
                   rt->tp.capi->reduce_scatter(rt->dist.comm, rt->tp.group, send, recv, count, CT_F32, CT_REDUCE_SUM,
                                               NULL),
                   t0, "reduce-scatter");
}

static int tp_all_reduce(runtime *rt, const float *send, float *recv, int64_t count) {
    trace_begin(TP_TRACE(rt));
    double t0 = ct_now();
    ct_clear_error();
    return tp_done(rt,
                   rt->tp.capi->all_reduce(rt->dist.comm, rt->tp.group, send, recv, count, CT_F32, CT_REDUCE_SUM, NULL),
                   t0, "all-reduce");
}

static int tp_wait(runtime *rt, void *req) {
    trace_begin(TP_TRACE(rt));
    double t0 = ct_now();
    ct_clear_error();
    return tp_done(rt, rt->tp.capi->wait(rt->dist.comm, req), t0, "wait");
}

/* Async TP: lets a started collective move while this rank computes (MPI progresses only inside calls). */
static void tp_poke(runtime *rt, void *req) {
    const ct_comm_api *c = rt->tp.capi;
    if (!req || !CT_HAS_FIELD(c, ct_comm_api, test) || !c->test) return;
    int done = 0;
    trace_begin(TP_TRACE(rt));
    double t0 = ct_now();
    c->test(rt->dist.comm, req, &done); /* an error here resurfaces at the wait */
    tp_account(rt, t0);
}

/* x's shape with its token-row dim (the one before the features) multiplied by num/den. */
static int rows_shape(const rt_tensor *x, int64_t num, int64_t den, int64_t *shape) {
    if (x->t.ndim < 2 || (x->t.shape[x->t.ndim - 2] * num) % den) {
        ct_set_error("tensor parallel: (%d dims, %lld rows) cannot be split in %lld", x->t.ndim,
                     x->t.ndim >= 2 ? (long long)x->t.shape[x->t.ndim - 2] : 0LL, (long long)den);
        return -1;
    }
    memcpy(shape, x->t.shape, sizeof(int64_t) * CT_MAX_DIMS);
    shape[x->t.ndim - 2] = x->t.shape[x->t.ndim - 2] * num / den;
    return 0;
}

/* Every token row of x (sequence parallel): the all-gather, made once per x. */
static rt_tensor *tp_gather_rows(runtime *rt, rt_tensor *x) {
    if (x->gathered) return x->gathered;
    int64_t shape[CT_MAX_DIMS];
    if (rows_shape(x, rt->tp.size, 1, shape)) return NULL;
    rt_tensor *y = new_tensor(rt, rt->act, CT_F32, x->t.ndim, shape);
    if (!y || tp_all_gather(rt, x->t.data, y->t.data, numel(x))) return NULL;
    if (record(rt, OP_TP_GATHER_ROWS, y, x, NULL, NULL, NULL, NULL, 0)) return NULL;
    x->gathered = y;
    return y;
}

/* The sum over tp ranks of x's partial values, this rank keeping its 1/tp of the token rows. */
static rt_tensor *tp_reduce_scatter_rows(runtime *rt, rt_tensor *x) {
    int64_t shape[CT_MAX_DIMS];
    if (rows_shape(x, 1, rt->tp.size, shape)) return NULL;
    int saved = sac_saves(rt, 0);
    rt_tensor *y = saved ? sac_out(rt, CT_F32, x->t.ndim, shape) : new_tensor(rt, rt->act, CT_F32, x->t.ndim, shape);
    if (!y || (!SAC_REUSED(rt, saved) && tp_reduce_scatter(rt, x->t.data, y->t.data, numel(y)))) return NULL;
    y->sp = 1;
    if (record(rt, OP_TP_REDUCE_SCATTER_ROWS, y, x, NULL, NULL, NULL, NULL, 0)) return NULL;
    return y;
}

/* Megatron's f: the same values, whose gradient is summed over tp ranks in backward. Made once per x. */
static rt_tensor *tp_copy(runtime *rt, rt_tensor *x) {
    if (x->gathered) return x->gathered;
    rt_tensor *y = pool_alloc(&rt->act->desc, sizeof *y);
    if (!y) return NULL;
    memset(y, 0, sizeof *y);
    y->t = x->t; /* shares the data, has its own gradient */
    y->t.grad = NULL;
    y->t.flags = 0;
    if (record(rt, OP_TP_COPY, y, x, NULL, NULL, NULL, NULL, 0)) return NULL;
    x->gathered = y;
    return y;
}

/* Megatron's g: the sum over tp ranks of x's partial values. */
static rt_tensor *tp_all_reduce_op(runtime *rt, rt_tensor *x) {
    rt_tensor *y = like(rt, x);
    if (!y || tp_all_reduce(rt, x->t.data, y->t.data, numel(x))) return NULL;
    if (record(rt, OP_TP_ALL_REDUCE, y, x, NULL, NULL, NULL, NULL, 0)) return NULL;
    return y;
}

/* Vocabulary-sharded logits (n, v) -> every column (n, V), for a loss that is not loss parallel. */
static rt_tensor *tp_gather_cols(runtime *rt, rt_tensor *x) {
    const ct_device_api *d = DEV(rt);
    if (!CT_HAS_FIELD(d, ct_device_api, copy_2d) || !d->copy_2d) {
        ct_set_error("tensor parallel: device lacks copy_2d (ABI 1.3), needed to gather logits without loss parallel");
        return NULL;
    }
    int64_t v = x->t.shape[x->t.ndim - 1], n = numel(x) / v, tp = rt->tp.size, shape[CT_MAX_DIMS];
    memcpy(shape, x->t.shape, sizeof shape);
    shape[x->t.ndim - 1] = v * tp;
    rt_tensor *y = new_tensor(rt, rt->act, CT_F32, x->t.ndim, shape);
    pool_mark m = pool_get_mark(&rt->scratch.data);
    float *all = pool_alloc(&rt->scratch.data, sizeof(float) * (size_t)(n * v * tp));
    if (!y || !all || tp_all_gather(rt, x->t.data, all, n * v)) return NULL;
    for (int64_t p = 0; p < tp; p++)
        CALL(rt, d->copy_2d(rt->dev, (float *)y->t.data + p * v, v * tp, all + p * n * v, v, n, v));
    pool_release(&rt->scratch.data, m);
    if (record_range(rt, OP_TP_GATHER_COLS, y, x, NULL, NULL, x->col_begin)) return NULL;
    return y;
}

rt_tensor *tape_tp_gather_cols(runtime *rt, rt_tensor *logits) { return tp_gather_cols(rt, logits); }

/* ---- ops ---- */

/* y = x w^T on this rank's operands (the quantizer's GEMMs when it converts w). */
static rt_tensor *linear_plain(runtime *rt, rt_tensor *x, rt_tensor *w) {
    int64_t in = w->t.shape[1], outf = w->t.shape[0], n = numel(x) / in;
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, x->t.shape, sizeof shape);
    shape[x->t.ndim - 1] = outf;
    int saved = sac_saves(rt, 1);
    rt_tensor *y = saved ? sac_out(rt, CT_F32, x->t.ndim, shape) : new_tensor(rt, rt->act, CT_F32, x->t.ndim, shape);
    if (!y) return NULL;
    rt_tensor *owner = w->base ? w->base : w;
    if (rt->qapi && !(owner->t.flags & CT_TENSOR_QUANT_DECIDED)) { /* ask once per weight */
        const char *why = "";
        int yes = rt->qapi->converts(rt->quant, &owner->t, &why);
        owner->t.flags |= CT_TENSOR_QUANT_DECIDED | (yes ? CT_TENSOR_QUANTIZED : 0);
        quant_note(rt, owner->t.name, yes, why);
    }
    int quant = rt->qapi && (owner->t.flags & CT_TENSOR_QUANTIZED);
    if (!SAC_REUSED(rt, saved)) { /* else computed in forward and saved */
        if (quant) CALL(rt, rt->qapi->forward(rt->quant, y->t.data, x->t.data, w->t.data, n, outf, in));
        else CALL(rt, DEV(rt)->matmul(rt->dev, y->t.data, x->t.data, w->t.data, n, outf, in, 0, 1, 1.0f, 0.0f));
    }
    if (record(rt, OP_LINEAR, y, x, w, NULL, NULL, NULL, (float)quant)) return NULL;
    return y;
}

static int converted(const runtime *rt, const rt_tensor *w) {
    const rt_tensor *owner = w->base ? w->base : w;
    return rt->qapi && (owner->t.flags & CT_TENSOR_QUANTIZED);
}

#define TP_PIECES 4 /* matmul pieces per rank block of a chunk, with a poke of the collective in flight after each */

/* Async TP, column-wise: the all-gather of x's rows in chunks, each chunk's matmul overlapping the
 * gather of the next. Records the same two entries as the plain path (gather, then linear). */
static rt_tensor *gather_linear_async(runtime *rt, rt_tensor *x, rt_tensor *w) {
    const ct_device_api *d = DEV(rt);
    int64_t in = w->t.shape[1], outf = w->t.shape[0], nl = numel(x) / in, tp = rt->tp.size, shape[CT_MAX_DIMS];
    int64_t chunks = rt->tp.async_chunks < nl ? rt->tp.async_chunks : nl, rc = (nl + chunks - 1) / chunks;
    chunks = (nl + rc - 1) / rc;
    if (rows_shape(x, tp, 1, shape)) return NULL;
    rt_tensor *X = new_tensor(rt, rt->act, CT_F32, x->t.ndim, shape);
    shape[x->t.ndim - 1] = outf;
    rt_tensor *Y = new_tensor(rt, rt->act, CT_F32, x->t.ndim, shape);
    pool_mark m = pool_get_mark(&rt->scratch.data);
    float *buf[2] = {pool_alloc(&rt->scratch.data, sizeof(float) * (size_t)(tp * rc * in)),
                     pool_alloc(&rt->scratch.data, sizeof(float) * (size_t)(tp * rc * in))};
    if (!X || !Y || !buf[0] || !buf[1]) return NULL;
    float *xd = x->t.data, *Xd = X->t.data, *Yd = Y->t.data;
    ct_comm_request *req[2] = {NULL, NULL};
    ct_clear_error();
    int64_t cnt0 = rc < nl ? rc : nl;
    if (rt->tp.capi->all_gather(rt->dist.comm, rt->tp.group, xd, buf[0], cnt0 * in, CT_F32, &req[0]) != CT_OK)
        return NULL;
    for (int64_t i = 0; i < chunks; i++) {
        int64_t r0 = i * rc, cnt = nl - r0 < rc ? nl - r0 : rc;
        if (i + 1 < chunks) { /* the next chunk's gather runs while this one multiplies */
            int64_t r1 = (i + 1) * rc, c1 = nl - r1 < rc ? nl - r1 : rc;
            if (rt->tp.capi->all_gather(rt->dist.comm, rt->tp.group, xd + r1 * in, buf[(i + 1) % 2], c1 * in, CT_F32,
                                        &req[(i + 1) % 2]) != CT_OK)
                return NULL;
        }
        if (tp_wait(rt, req[i % 2])) return NULL;
        void *next = i + 1 < chunks ? req[(i + 1) % 2] : NULL;
        for (int64_t p = 0; p < tp; p++) {
            int64_t row = p * nl + r0;
            CALL(rt, d->copy(rt->dev, Xd + row * in, buf[i % 2] + p * cnt * in, sizeof(float) * (size_t)(cnt * in),
                             CT_COPY_D2D));
            for (int64_t q = 0; q < TP_PIECES; q++) { /* poke the next gather between pieces of the matmul */
                int64_t a = cnt * q / TP_PIECES, z = cnt * (q + 1) / TP_PIECES;
                if (z > a)
                    CALL(rt, d->matmul(rt->dev, Yd + (row + a) * outf, Xd + (row + a) * in, w->t.data, z - a, outf, in,
                                       0, 1, 1.0f, 0.0f));
                tp_poke(rt, next);
            }
        }
    }
    pool_release(&rt->scratch.data, m);
    if (record(rt, OP_TP_GATHER_ROWS, X, x, NULL, NULL, NULL, NULL, 0) ||
        record(rt, OP_LINEAR, Y, X, w, NULL, NULL, NULL, 0))
        return NULL;
    x->gathered = X;
    return Y;
}

/* Async TP, row-wise: the matmul in chunks of every rank's token rows, each chunk's reduce-scatter
 * overlapping the next chunk's matmul. The linear's output tensor holds the partial sums in send
 * order (only its gradient is used later); records the same entries as the plain path. */
static rt_tensor *linear_reduce_scatter_async(runtime *rt, rt_tensor *x, rt_tensor *w) {
    const ct_device_api *d = DEV(rt);
    int64_t in = w->t.shape[1], outf = w->t.shape[0], n = numel(x) / in, tp = rt->tp.size, shape[CT_MAX_DIMS];
    if (n % tp) {
        ct_set_error("async tensor parallel: %lld token rows do not split in %lld", (long long)n, (long long)tp);
        return NULL;
    }
    int64_t nl = n / tp, chunks = rt->tp.async_chunks < nl ? rt->tp.async_chunks : nl, rc = (nl + chunks - 1) / chunks;
    chunks = (nl + rc - 1) / rc;
    memcpy(shape, x->t.shape, sizeof shape);
    shape[x->t.ndim - 1] = outf;
    rt_tensor *P = new_tensor(rt, rt->act, CT_F32, x->t.ndim, shape); /* partial sums, chunk-major */
    if (!P) return NULL;
    int64_t oshape[CT_MAX_DIMS];
    if (rows_shape(P, 1, tp, oshape)) return NULL;
    rt_tensor *y = new_tensor(rt, rt->act, CT_F32, x->t.ndim, oshape);
    ct_comm_request **req = calloc((size_t)chunks, sizeof *req);
    if (!y || !req) {
        free(req);
        return NULL;
    }
    float *xd = x->t.data, *Pd = P->t.data, *yd = y->t.data;
    int bad = 0;
    int64_t posted = 0;
    for (int64_t i = 0; i < chunks && !bad; i++) {
        int64_t r0 = i * rc, cnt = nl - r0 < rc ? nl - r0 : rc;
        float *send = Pd + tp * r0 * outf; /* chunk i: (tp, cnt, out), block p for rank p */
        for (int64_t p = 0; p < tp && !bad; p++)
            for (int64_t q = 0; q < TP_PIECES && !bad; q++) { /* poke the previous reduce-scatter between pieces */
                int64_t a = cnt * q / TP_PIECES, z = cnt * (q + 1) / TP_PIECES;
                if (z > a)
                    bad = d->matmul(rt->dev, send + (p * cnt + a) * outf, xd + (p * nl + r0 + a) * in, w->t.data, z - a,
                                    outf, in, 0, 1, 1.0f, 0.0f) != CT_OK;
                if (i > 0) tp_poke(rt, req[i - 1]);
            }
        ct_clear_error();
        if (!bad)
            bad = rt->tp.capi->reduce_scatter(rt->dist.comm, rt->tp.group, send, yd + r0 * outf, cnt * outf, CT_F32,
                                              CT_REDUCE_SUM, &req[i]) != CT_OK;
        if (!bad) posted = i + 1;
    }
    for (int64_t i = 0; i < posted; i++) bad |= tp_wait(rt, req[i]) != 0;
    free(req);
    if (bad) {
        if (!ct_last_error()[0]) ct_set_error("async tensor parallel: matmul/reduce-scatter failed");
        return NULL;
    }
    y->sp = 1;
    if (record(rt, OP_LINEAR, P, x, w, NULL, NULL, NULL, 0) ||
        record(rt, OP_TP_REDUCE_SCATTER_ROWS, y, P, NULL, NULL, NULL, NULL, 0))
        return NULL;
    return y;
}

static ct_tensor *op_linear(ct_builder *b, ct_tensor *xt, ct_tensor *wt) {
    runtime *rt = RT(b);
    rt_tensor *x = (rt_tensor *)xt, *w = (rt_tensor *)wt, *y;
    if (check_f32(xt, "linear", "x") || check_f32(wt, "linear", "w")) return NULL;
    if (w->t.ndim != 2 || x->t.shape[x->t.ndim - 1] != w->t.shape[1]) {
        ct_set_error("linear: x (..., %lld) does not match w (%lld, %lld)", (long long)x->t.shape[x->t.ndim - 1],
                     (long long)w->t.shape[0], (long long)w->t.shape[w->t.ndim - 1]);
        return NULL;
    }
    int style = tp_style(rt, w), async = rt->tp.async_chunks > 0 && !converted(rt, w);
    switch (style) {
    case CT_TP_COLWISE:
    case CT_TP_OUTPUT_COLWISE:
        /* every token row in; this rank's output features out */
        if (x->sp && async && !x->gathered) y = gather_linear_async(rt, x, w);
        else {
            rt_tensor *xf = x->sp ? tp_gather_rows(rt, x) : tp_copy(rt, x);
            y = xf ? linear_plain(rt, xf, w) : NULL;
        }
        if (!y || style == CT_TP_COLWISE) break;
        y->col_begin = w->t.shape[0] * rt->tp.rank; /* vocabulary-sharded logits */
        y->col_full = w->t.shape[0] * rt->tp.size;
        if (!rt->tp.loss_parallel) y = tp_gather_cols(rt, y);
        break;
    case CT_TP_ROWWISE:
        /* partial sums over this rank's input features: reduced (and scattered on rows under SP) */
        if (rt->tp.sequence_parallel && async) {
            y = linear_reduce_scatter_async(rt, x, w);
            break;
        }
        y = linear_plain(rt, x, w);
        if (y) y = rt->tp.sequence_parallel ? tp_reduce_scatter_rows(rt, y) : tp_all_reduce_op(rt, y);
        break;
    default: y = linear_plain(rt, x, w); break;
    }
    return y ? &y->t : NULL;
}

static ct_tensor *op_bias(ct_builder *b, ct_tensor *xt, ct_tensor *bt) {
    runtime *rt = RT(b);
    rt_tensor *x = (rt_tensor *)xt, *bs = (rt_tensor *)bt;
    if (check_f32(xt, "bias", "x") || check_f32(bt, "bias", "bias")) return NULL;
    int64_t c = x->t.shape[x->t.ndim - 1];
    if (numel(bs) != c) {
        ct_set_error("bias: %lld values for rows of %lld", (long long)numel(bs), (long long)c);
        return NULL;
    }
    rt_tensor *y = like(rt, x);
    if (!y) return NULL;
    CALL(rt, DEV(rt)->bias_forward(rt->dev, y->t.data, x->t.data, bs->t.data, numel(x) / c, c));
    if (record(rt, OP_BIAS, y, x, bs, NULL, NULL, NULL, 0)) return NULL;
    return &y->t;
}

static ct_tensor *op_embedding(ct_builder *b, const ct_tensor *idst, ct_tensor *tablet) {
    runtime *rt = RT(b);
    rt_tensor *ids = (rt_tensor *)idst, *table = (rt_tensor *)tablet;
    if (!idst || idst->dtype != CT_I32 || check_f32(tablet, "embedding", "table") || table->t.ndim != 2) {
        ct_set_error("embedding: expects int32 ids and a (vocab, dim) f32 table");
        return NULL;
    }
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, ids->t.shape, sizeof shape);
    if (ids->t.ndim >= CT_MAX_DIMS) return NULL;
    shape[ids->t.ndim] = table->t.shape[1];
    rt_tensor *y = new_tensor(rt, rt->act, CT_F32, ids->t.ndim + 1, shape);
    if (!y) return NULL;
    if (tp_style(rt, table) == CT_TP_EMBED_ROWWISE) { /* this rank's vocabulary rows; the rest are summed in */
        const ct_device_api *d = DEV(rt);
        if (!CT_HAS_FIELD(d, ct_device_api, embedding_backward_range) || !d->embedding_forward_range ||
            !d->embedding_backward_range) {
            ct_set_error("tensor parallel: device lacks the ranged embedding ops (ABI 1.3)");
            return NULL;
        }
        int64_t rows = table->t.shape[0], begin = rows * rt->tp.rank;
        CALL(rt, d->embedding_forward_range(rt->dev, y->t.data, ids->t.data, table->t.data, numel(ids),
                                            table->t.shape[1], begin, rows));
        if (record_range(rt, OP_EMBEDDING, y, ids, table, NULL, begin)) return NULL;
        y = rt->tp.sequence_parallel ? tp_reduce_scatter_rows(rt, y) : tp_all_reduce_op(rt, y);
        return y ? &y->t : NULL;
    }
    CALL(rt, DEV(rt)->embedding_forward(rt->dev, y->t.data, ids->t.data, table->t.data, numel(ids),
                                        table->t.shape[1], table->t.shape[0]));
    if (record(rt, OP_EMBEDDING, y, ids, table, NULL, NULL, NULL, 0)) return NULL;
    return &y->t;
}

static ct_tensor *op_rmsnorm(ct_builder *b, ct_tensor *xt, ct_tensor *wt, float eps) {
    runtime *rt = RT(b);
    rt_tensor *x = (rt_tensor *)xt, *w = (rt_tensor *)wt;
    if (check_f32(xt, "rmsnorm", "x") || check_f32(wt, "rmsnorm", "w")) return NULL;
    int64_t c = x->t.shape[x->t.ndim - 1], n = numel(x) / c;
    if (numel(w) != c) {
        ct_set_error("rmsnorm: weight has %lld values for rows of %lld", (long long)numel(w), (long long)c);
        return NULL;
    }
    rt_tensor *y = like(rt, x), *rstd = new_tensor(rt, rt->act, CT_F32, 1, &n);
    if (!y || !rstd) return NULL;
    CALL(rt, DEV(rt)->rmsnorm_forward(rt->dev, y->t.data, rstd->t.data, x->t.data, w->t.data, n, c, eps));
    if (record(rt, OP_RMSNORM, y, x, w, NULL, rstd, NULL, eps)) return NULL;
    return &y->t;
}

static ct_tensor *op_layernorm(ct_builder *b, ct_tensor *xt, ct_tensor *wt, ct_tensor *bt, float eps) {
    runtime *rt = RT(b);
    rt_tensor *x = (rt_tensor *)xt, *w = (rt_tensor *)wt, *bs = (rt_tensor *)bt;
    if (check_f32(xt, "layernorm", "x") || check_f32(wt, "layernorm", "w")) return NULL;
    if (bt && check_f32(bt, "layernorm", "bias")) return NULL;
    int64_t c = x->t.shape[x->t.ndim - 1], n = numel(x) / c;
    if (numel(w) != c || (bs && numel(bs) != c)) {
        ct_set_error("layernorm: weight/bias size does not match rows of %lld", (long long)c);
        return NULL;
    }
    rt_tensor *y = like(rt, x), *mean = new_tensor(rt, rt->act, CT_F32, 1, &n),
              *rstd = new_tensor(rt, rt->act, CT_F32, 1, &n);
    if (!y || !mean || !rstd) return NULL;
    CALL(rt, DEV(rt)->layernorm_forward(rt->dev, y->t.data, mean->t.data, rstd->t.data, x->t.data, w->t.data,
                                        bs ? bs->t.data : NULL, n, c, eps));
    if (record(rt, OP_LAYERNORM, y, x, w, bs, mean, rstd, eps)) return NULL;
    return &y->t;
}

static ct_tensor *op_rope(ct_builder *b, ct_tensor *xt, float theta) {
    runtime *rt = RT(b);
    rt_tensor *x = (rt_tensor *)xt;
    if (check_f32(xt, "rope", "x")) return NULL;
    if (x->t.ndim != 4 || x->t.shape[3] % 2) {
        ct_set_error("rope: expects x of shape (B, T, H, D) with D even");
        return NULL;
    }
    rt_tensor *y = like(rt, x);
    if (!y) return NULL;
    CALL(rt, DEV(rt)->rope_forward(rt->dev, y->t.data, x->t.data, x->t.shape[0], x->t.shape[1], x->t.shape[2],
                                   x->t.shape[3], theta));
    if (record(rt, OP_ROPE, y, x, NULL, NULL, NULL, NULL, theta)) return NULL;
    return &y->t;
}

static ct_tensor *op_attention(ct_builder *b, ct_tensor *qt, ct_tensor *kt, ct_tensor *vt) {
    runtime *rt = RT(b);
    rt_tensor *q = (rt_tensor *)qt, *k = (rt_tensor *)kt, *v = (rt_tensor *)vt;
    if (check_f32(qt, "attention", "q") || check_f32(kt, "attention", "k") || check_f32(vt, "attention", "v"))
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
    y->sp = q->sp;
    if (!SAC_REUSED(rt, saved))
        CALL(rt, DEV(rt)->attention_forward(rt->dev, y->t.data, lse->t.data, q->t.data, k->t.data, v->t.data, qs[0],
                                        qs[1], qs[2], ks[2], qs[3]));
    if (record(rt, OP_ATTENTION, y, q, k, v, lse, NULL, 0)) return NULL;
    return &y->t;
}

static int same_shape(const rt_tensor *a, const rt_tensor *b, const char *op) {
    if (a->t.ndim != b->t.ndim || memcmp(a->t.shape, b->t.shape, sizeof(int64_t) * (size_t)a->t.ndim)) {
        ct_set_error("%s: operands have different shapes", op);
        return -1;
    }
    return 0;
}

static ct_tensor *op_swiglu(ct_builder *b, ct_tensor *at, ct_tensor *gt) {
    runtime *rt = RT(b);
    rt_tensor *a = (rt_tensor *)at, *g = (rt_tensor *)gt;
    if (check_f32(at, "swiglu", "a") || check_f32(gt, "swiglu", "g") || same_shape(a, g, "swiglu")) return NULL;
    rt_tensor *y = like(rt, a);
    if (!y) return NULL;
    CALL(rt, DEV(rt)->swiglu_forward(rt->dev, y->t.data, a->t.data, g->t.data, numel(a)));
    if (record(rt, OP_SWIGLU, y, a, g, NULL, NULL, NULL, 0)) return NULL;
    return &y->t;
}

static ct_tensor *op_gelu(ct_builder *b, ct_tensor *xt) {
    runtime *rt = RT(b);
    rt_tensor *x = (rt_tensor *)xt;
    if (check_f32(xt, "gelu", "x")) return NULL;
    rt_tensor *y = like(rt, x);
    if (!y) return NULL;
    CALL(rt, DEV(rt)->gelu_forward(rt->dev, y->t.data, x->t.data, numel(x)));
    if (record(rt, OP_GELU, y, x, NULL, NULL, NULL, NULL, 0)) return NULL;
    return &y->t;
}

static ct_tensor *op_add(ct_builder *b, ct_tensor *xt, ct_tensor *yt) {
    runtime *rt = RT(b);
    rt_tensor *x = (rt_tensor *)xt, *y = (rt_tensor *)yt;
    if (check_f32(xt, "add", "x") || check_f32(yt, "add", "y") || same_shape(x, y, "add")) return NULL;
    rt_tensor *o = like(rt, x);
    if (!o) return NULL;
    CALL(rt, DEV(rt)->add(rt->dev, o->t.data, x->t.data, y->t.data, numel(x)));
    if (record(rt, OP_ADD, o, x, y, NULL, NULL, NULL, 0)) return NULL;
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
    v->t.ndim = ndim;
    memset(v->t.shape, 0, sizeof v->t.shape);
    for (int i = 0; i < ndim; i++) v->t.shape[i] = shape[i];
    v->base = x->base ? x->base : x;
    v->gathered = NULL;
    v->t.grad = NULL;
    v->t.flags = 0;
    return &v->t;
}

/* Loss parallel: cross entropy on vocabulary-sharded logits. Each rank's per-row (max, sum of exp,
 * target logit) are gathered and merged into the full row's logsumexp; the logits never move. */
static rt_tensor *cross_entropy_sharded(runtime *rt, rt_tensor *logits, rt_tensor *targets, rt_tensor *y) {
    const ct_device_api *d = DEV(rt);
    if (!CT_HAS_FIELD(d, ct_device_api, cross_entropy_backward_lse) || !d->cross_entropy_stats ||
        !d->cross_entropy_backward_lse) {
        ct_set_error("loss parallel: device lacks cross_entropy_stats (ABI 1.3); set parallelism.disable_loss_parallel");
        return NULL;
    }
    int64_t v = logits->t.shape[logits->t.ndim - 1], n = numel(logits) / v, tp = rt->tp.size, three = 3 * n;
    rt_tensor *stats = new_tensor(rt, rt->act, CT_F32, 1, &three), *lse = new_tensor(rt, rt->act, CT_F32, 1, &n);
    pool_mark m = pool_get_mark(&rt->scratch.data);
    float *all = pool_alloc(&rt->scratch.data, sizeof(float) * (size_t)(3 * n * tp));
    float *host = malloc(sizeof(float) * (size_t)(3 * n * tp + n + 1));
    int32_t *tg = malloc(sizeof(int32_t) * (size_t)(n + 1));
    double sum = 0;
    int bad = !stats || !lse || !all || !host || !tg;
    ct_clear_error();
    bad = bad || d->cross_entropy_stats(rt->dev, stats->t.data, logits->t.data, targets->t.data, n, v, logits->col_begin,
                                        CT_IGNORE_INDEX) != CT_OK;
    bad = bad || tp_all_gather(rt, stats->t.data, all, 3 * n);
    bad = bad || d->copy(rt->dev, host, all, sizeof(float) * (size_t)(3 * n * tp), CT_COPY_D2H) != CT_OK ||
          d->copy(rt->dev, tg, targets->t.data, sizeof(int32_t) * (size_t)n, CT_COPY_D2H) != CT_OK;
    float *l = host + 3 * n * tp;
    for (int64_t i = 0; i < n && !bad; i++) {
        double mx = -INFINITY, s = 0, t = 0;
        for (int64_t p = 0; p < tp; p++) mx = fmax(mx, host[(p * n + i) * 3]);
        for (int64_t p = 0; p < tp; p++) {
            const float *st = host + (p * n + i) * 3;
            s += st[1] * exp(st[0] - mx);
            t += st[2];
        }
        l[i] = (float)(mx + log(s));
        if (tg[i] == CT_IGNORE_INDEX) continue;
        if (tg[i] < 0 || tg[i] >= logits->col_full) {
            ct_set_error("cross_entropy: target %d outside the vocabulary [0, %lld)", tg[i], (long long)logits->col_full);
            bad = 1;
            break;
        }
        sum += (double)l[i] - t;
    }
    float fsum = (float)sum;
    bad = bad || d->copy(rt->dev, lse->t.data, l, sizeof(float) * (size_t)n, CT_COPY_H2D) != CT_OK ||
          d->copy(rt->dev, y->t.data, &fsum, sizeof fsum, CT_COPY_H2D) != CT_OK;
    free(host);
    free(tg);
    if (all) pool_release(&rt->scratch.data, m);
    if (bad || record_range(rt, OP_CROSS_ENTROPY, y, logits, targets, lse, logits->col_begin)) {
        if (!ct_last_error()[0]) ct_set_error("loss parallel: cross entropy failed");
        return NULL;
    }
    return y;
}

static ct_tensor *op_cross_entropy(ct_builder *b, ct_tensor *lt, const ct_tensor *tt) {
    runtime *rt = RT(b);
    rt_tensor *logits = (rt_tensor *)lt, *targets = (rt_tensor *)tt;
    if (check_f32(lt, "cross_entropy", "logits")) return NULL;
    int64_t v = logits->t.shape[logits->t.ndim - 1], n = numel(logits) / v;
    if (!tt || tt->dtype != CT_I32 || numel(targets) != n) {
        ct_set_error("cross_entropy: targets must be int32 with one value per row of logits");
        return NULL;
    }
    rt_tensor *y = new_tensor(rt, rt->act, CT_F32, 0, NULL);
    if (!y) return NULL;
    if (logits->col_full > 0) return (y = cross_entropy_sharded(rt, logits, targets, y)) ? &y->t : NULL;
    rt_tensor *losses = new_tensor(rt, rt->act, CT_F32, 1, &n);
    if (!losses) return NULL;
    CALL(rt, DEV(rt)->cross_entropy_forward(rt->dev, losses->t.data, logits->t.data, targets->t.data, n, v,
                                            CT_IGNORE_INDEX));
    if (CT_HAS_FIELD(DEV(rt), ct_device_api, sum_to_device) && DEV(rt)->sum_to_device) {
        CALL(rt, DEV(rt)->sum_to_device(rt->dev, y->t.data, losses->t.data, n)); /* no wait for the device */
    } else {
        double sum = 0;
        CALL(rt, DEV(rt)->sum(rt->dev, &sum, losses->t.data, n));
        float fsum = (float)sum;
        CALL(rt, DEV(rt)->copy(rt->dev, y->t.data, &fsum, sizeof fsum, CT_COPY_H2D));
    }
    if (record(rt, OP_CROSS_ENTROPY, y, logits, targets, NULL, NULL, NULL, 0)) return NULL;
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

void tape_builder_init(runtime *rt) {
    rt->builder = (ct_builder){
        .struct_size = sizeof(ct_builder),
        .ctx = rt,
        .linear = op_linear,
        .bias = op_bias,
        .embedding = op_embedding,
        .rmsnorm = op_rmsnorm,
        .layernorm = op_layernorm,
        .rope = op_rope,
        .attention = op_attention,
        .swiglu = op_swiglu,
        .gelu = op_gelu,
        .add = op_add,
        .view = op_view,
        .cross_entropy = op_cross_entropy,
        .positions = op_positions,
    };
}

/* ---- backward ---- */

/* The gradient buffer of t (a view's is its base's), allocated zeroed in the grads arena. */
static float *grad_of(runtime *rt, rt_tensor *t) {
    rt_tensor *owner = t->base ? t->base : t;
    if (!owner->t.grad) {
        size_t bytes = (size_t)numel(owner) * sizeof(float);
        owner->t.grad = pool_alloc(&rt->grads.data, bytes);
        if (!owner->t.grad || DEV(rt)->zero(rt->dev, owner->t.grad, bytes) != CT_OK) {
            ct_set_error("out of memory for activation gradients");
            owner->t.grad = NULL;
            return NULL;
        }
    }
    return owner->t.grad;
}

float *tape_grad(runtime *rt, rt_tensor *t) { return grad_of(rt, t); }

static const float *grad_if_any(const rt_tensor *t) {
    const rt_tensor *owner = t->base ? t->base : t;
    return owner->t.grad;
}

#define BCALL(expr)                                                                       \
    do {                                                                                  \
        ct_status st_ = (expr);                                                           \
        if (st_ != CT_OK) {                                                               \
            if (!ct_last_error()[0]) ct_set_error("device backward failed: %s", #expr);  \
            return -1;                                                                    \
        }                                                                                 \
    } while (0)
#define G(t) ({ float *g_ = grad_of(rt, (t)); if (!g_) return -1; g_; })

/* The conjugate collective of a tensor-parallel op: its input's gradient += f(dy). */
static int tp_backward_run(runtime *rt, tape_entry *e, const float *dy);
static int tp_backward(runtime *rt, tape_entry *e, const float *dy) {
    rt->tp.in_backward = 1;
    int rc = tp_backward_run(rt, e, dy);
    rt->tp.in_backward = 0;
    return rc;
}

static int tp_backward_run(runtime *rt, tape_entry *e, const float *dy) {
    const ct_device_api *d = DEV(rt);
    rt_tensor *x = e->in[0];
    int64_t nx = numel(x);
    float *gx = grad_of(rt, x);
    if (!gx) return -1;
    if (e->op == OP_TP_ALL_REDUCE) return d->axpy(rt->dev, gx, dy, 1.0f, nx) == CT_OK ? 0 : -1;
    pool_mark m = pool_get_mark(&rt->grads.data);
    float *tmp = pool_alloc(&rt->grads.data, sizeof(float) * (size_t)nx);
    if (!tmp) {
        ct_set_error("out of memory for activation gradients");
        return -1;
    }
    int bad = 0;
    switch (e->op) {
    case OP_TP_GATHER_ROWS: bad = tp_reduce_scatter(rt, dy, tmp, nx); break;
    case OP_TP_REDUCE_SCATTER_ROWS: bad = tp_all_gather(rt, dy, tmp, numel(e->out)); break;
    case OP_TP_COPY: bad = tp_all_reduce(rt, dy, tmp, nx); break;
    default: { /* OP_TP_GATHER_COLS: this rank's columns of dy */
        int64_t v = x->t.shape[x->t.ndim - 1], n = nx / v;
        bad = d->copy_2d(rt->dev, tmp, v, dy + e->i0, v * rt->tp.size, n, v) != CT_OK;
    }
    }
    bad = bad || d->axpy(rt->dev, gx, tmp, 1.0f, nx) != CT_OK;
    pool_release(&rt->grads.data, m);
    return bad ? -1 : 0;
}

static int entry_backward(runtime *rt, tape_entry *e, int halves) {
    const float *dy = grad_if_any(e->out);
    if (!dy) return 0; /* nothing flowed into this op */
    const ct_device_api *d = DEV(rt);
    void *dev = rt->dev;
    rt_tensor *x = e->in[0], *w = e->in[1];
    int in = halves & TAPE_INPUT, wt = halves & TAPE_WEIGHT;
    switch (e->op) {
    case OP_LINEAR: {
        int64_t k = w->t.shape[1], m = w->t.shape[0], n = numel(x) / k;
        if (e->f != 0) { /* float8: the quantizer runs both GEMMs */
            if (in) BCALL(rt->qapi->backward_input(rt->quant, G(x), dy, w->t.data, n, m, k));
            if (wt) BCALL(rt->qapi->backward_weight(rt->quant, G(w), dy, x->t.data, n, m, k));
            break;
        }
        if (in) BCALL(d->matmul(dev, G(x), dy, w->t.data, n, k, m, 0, 0, 1.0f, 1.0f));
        if (wt) BCALL(d->matmul(dev, G(w), dy, x->t.data, m, k, n, 1, 0, 1.0f, 1.0f));
        break;
    }
    case OP_BIAS: {
        int64_t c = numel(w), n = numel(x) / c;
        if (in) BCALL(d->axpy(dev, G(x), dy, 1.0f, numel(x)));
        if (wt) BCALL(d->bias_backward(dev, G(w), dy, n, c));
        break;
    }
    case OP_EMBEDDING:
        if (wt && e->i1)
            BCALL(d->embedding_backward_range(dev, G(w), x->t.data, dy, numel(x), w->t.shape[1], e->i0, w->t.shape[0]));
        else if (wt)
            BCALL(d->embedding_backward(dev, G(w), x->t.data, dy, numel(x), w->t.shape[1], w->t.shape[0]));
        break;
    case OP_RMSNORM: {
        int64_t c = numel(w), n = numel(x) / c;
        if (in) BCALL(d->rmsnorm_backward_input(dev, G(x), dy, x->t.data, w->t.data, e->aux[0]->t.data, n, c));
        if (wt) BCALL(d->rmsnorm_backward_weight(dev, G(w), dy, x->t.data, e->aux[0]->t.data, n, c));
        break;
    }
    case OP_LAYERNORM: {
        int64_t c = numel(w), n = numel(x) / c;
        rt_tensor *bs = e->in[2];
        if (in)
            BCALL(d->layernorm_backward_input(dev, G(x), dy, x->t.data, w->t.data, e->aux[0]->t.data,
                                              e->aux[1]->t.data, n, c));
        if (wt)
            BCALL(d->layernorm_backward_weight(dev, G(w), bs ? G(bs) : NULL, dy, x->t.data, e->aux[0]->t.data,
                                               e->aux[1]->t.data, n, c));
        break;
    }
    case OP_ROPE: {
        const int64_t *s = x->t.shape;
        if (in) BCALL(d->rope_backward(dev, G(x), dy, s[0], s[1], s[2], s[3], e->f));
        break;
    }
    case OP_ATTENTION: {
        rt_tensor *k = e->in[1], *v = e->in[2];
        const int64_t *s = x->t.shape;
        if (in)
            BCALL(d->attention_backward(dev, G(x), G(k), G(v), dy, x->t.data, k->t.data, v->t.data,
                                        e->out->t.data, e->aux[0]->t.data, s[0], s[1], s[2], k->t.shape[2], s[3]));
        break;
    }
    case OP_SWIGLU:
        if (in) BCALL(d->swiglu_backward(dev, G(x), G(w), dy, x->t.data, w->t.data, numel(x)));
        break;
    case OP_GELU:
        if (in) BCALL(d->gelu_backward(dev, G(x), dy, x->t.data, numel(x)));
        break;
    case OP_ADD:
        if (in) {
            BCALL(d->axpy(dev, G(x), dy, 1.0f, numel(x)));
            BCALL(d->axpy(dev, G(w), dy, 1.0f, numel(x)));
        }
        break;
    case OP_CROSS_ENTROPY: {
        if (!in) break;
        int64_t v = x->t.shape[x->t.ndim - 1], n = numel(x) / v;
        if (!e->i1 && CT_HAS_FIELD(d, ct_device_api, cross_entropy_backward_dev) && d->cross_entropy_backward_dev) {
            BCALL(d->cross_entropy_backward_dev(dev, G(x), x->t.data, w->t.data, dy, n, v, CT_IGNORE_INDEX));
            break; /* dloss stays on the device */
        }
        float dloss;
        BCALL(d->copy(dev, &dloss, dy, sizeof dloss, CT_COPY_D2H));
        if (e->i1)
            BCALL(d->cross_entropy_backward_lse(dev, G(x), x->t.data, w->t.data, e->aux[0]->t.data, dloss, n, v, e->i0,
                                                CT_IGNORE_INDEX));
        else
            BCALL(d->cross_entropy_backward(dev, G(x), x->t.data, w->t.data, dloss, n, v, CT_IGNORE_INDEX));
        break;
    }
    case OP_TP_GATHER_ROWS:
    case OP_TP_REDUCE_SCATTER_ROWS:
    case OP_TP_COPY:
    case OP_TP_ALL_REDUCE:
    case OP_TP_GATHER_COLS:
        if (in && tp_backward(rt, e, dy)) return -1;
        break;
    }
    return 0;
}

int tape_backward(runtime *rt, tape_entry *tail, int halves) {
    for (tape_entry *e = tail; e; e = e->prev)
        if (entry_backward(rt, e, halves)) return -1;
    return 0;
}
