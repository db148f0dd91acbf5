/* calibrate.c: `ctitan plan --calibrate`: a hardware profile measured through the manifest's own
 * device, quantizer, optimizer and comm plugins (see calibrate.h for what it measures).
 *
 * How a time is measured (measure): two warm-up calls, then R timed samples, each a call (or a
 * group of short calls) followed by the device's synchronize; the median of the R. R gives about
 * CAL_TARGET_S of timed work, within [CAL_MIN_REPS, CAL_MAX_REPS]. On several ranks the ranks agree
 * on R (the slowest warm-up decides), start together after a barrier, and the profile keeps the
 * largest median over ranks (an all-reduce MAX): on one machine the ranks share its cores and
 * memory as they do in training, and a step waits for its slowest rank.
 *
 * Only rank 0 traces the layout (plan_trace_layout) and writes the profile; it broadcasts the ops
 * and sizes to measure, so every rank runs the same calls in the same order.
 */
#include "plan/calibrate.h"

#include "engine/mesh.h"
#include "engine/session.h"
#include "host/host.h"
#include "base/util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CAL_TARGET_S 0.05  /* timed seconds per measurement, before the bounds on repeats */
#define CAL_MIN_REPS 3
#define CAL_MAX_REPS 41    /* short ops: many samples, so that a shared machine's stalls fall outside the median */
#define CAL_MAX_OPS 512    /* distinct (kind, shape, dtype) of one microbatch */
#define CAL_MAX_SIZES 12   /* collective sizes per kind and group size */
#define CAL_OP_FIELDS 9    /* doubles per op in rank 0's broadcast */
#define CAL_FAIL (-2)

/* One distinct op of the trace: what to run, and what it took. */
typedef struct cal_op {
    int kind, dtype, kv_heads;
    int64_t shape[4];
    double flops[2];   /* the trace's, forward and backward (attention's rate) */
    double seconds[2]; /* measured: forward, backward (both halves) */
} cal_op;

typedef struct cal {
    session s;                 /* device, model, quantizer, comm (no parameters) */
    ct_comm_group *world;      /* NULL on one rank */
    int rank, size;
    /* the line to report, kept here while the calls after the failure clear the thread's message
     * (ct_clear_error before each plugin call); plan_calibrate sets it on return */
    char err[2048];
    char note[384];            /* what the profile's figures assumed, for its source line */
    ct_device_info info;
    int bf16_gemm;             /* the device took set_matmul_dtype(CT_BF16) */
    int train_bf16;            /* training.mixed_precision_param: bfloat16 */
    cal_op *ops;
    int n_ops;
    double sizes[CAL_MAX_SIZES]; /* collective buffers to measure, bytes */
    int n_sizes;
    plan_measured_comm *comms;
    int n_comms;
    /* rates */
    double gemm_rate[PLAN_NDTYPES], peak[PLAN_NDTYPES], matmul_eff;
    int64_t gemm_n;            /* the large square GEMM's size */
    double add_bw, copy_bw, opt_bw, attn_rate;
    double intra_bw, intra_lat;
    int oversubscribed;        /* more ranks than cores on this machine */
    double core_share;         /* then cores / ranks, for the profile */
    double comm_overlap;       /* the share of a collective that hid behind a GEMM */
} cal;

/* The line to report, kept in c->err: a plugin call between a failure and its report may clear the
 * thread's message. */
static void cal_error(cal *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void cal_error(cal *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
}

static void note_add(cal *c, const char *text) {
    size_t n = strlen(c->note);
    snprintf(c->note + n, sizeof c->note - n, "%s%s", n ? "; " : "", text);
}

/* A device or comm call failed: one line naming it, status CAL_FAIL. */
static int failed(cal *c, ct_status st, const char *what) {
    if (st == CT_OK) return 0;
    cal_error(c, "calibrate: %s failed: %s", what,
              ct_last_error()[0] ? ct_last_error() : "no detail");
    return CAL_FAIL;
}

/* A core call failed with its line set (ct_last_error): kept as the line to report, status -1. */
static int took_error(cal *c) {
    snprintf(c->err, sizeof c->err, "%s", ct_last_error());
    return -1;
}

/* A failure once the ranks measure together: the others would wait in the next collective until
 * its timeout, so the job ends here (as a training step's failure does). */
static int fail_job(cal *c) {
    if (c->size > 1) {
        fprintf(stderr, "ctitan plan: %s\n", c->err);
        fflush(stderr);
        c->s.capi->abort(c->s.comm, 1);
    }
    return CAL_FAIL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- the ranks together: reductions and broadcasts through device memory (the comm's) ---- */

/* v (n) = max over ranks, or rank 0's (bcast). A no-op on one rank. */
static int ranks_share(cal *c, double *v, int n, int bcast) {
    if (c->size == 1 || n == 0) return 0;
    const ct_device_api *d = c->s.d;
    void *buf = NULL;
    size_t bytes = sizeof(double) * (size_t)n;
    ct_clear_error();
    int rc = failed(c, d->alloc(c->s.dev, bytes, &buf), "device alloc");
    if (!rc) rc = failed(c, d->copy(c->s.dev, buf, v, bytes, CT_COPY_H2D), "device copy");
    if (!rc)
        rc = failed(c,
                    bcast ? c->s.capi->broadcast(c->s.comm, c->world, buf, n, CT_F64, 0, NULL)
                          : c->s.capi->all_reduce(c->s.comm, c->world, buf, buf, n, CT_F64, CT_REDUCE_MAX, NULL),
                    bcast ? "broadcast" : "all_reduce");
    if (!rc) rc = failed(c, d->copy(c->s.dev, v, buf, bytes, CT_COPY_D2H), "device copy");
    if (buf) d->free(c->s.dev, buf);
    return rc;
}

static int ranks_max(cal *c, double *v, int n) { return ranks_share(c, v, n, 0); }

static int ranks_barrier(cal *c, ct_comm_group *g) {
    if (c->size == 1) return 0;
    ct_clear_error();
    return failed(c, c->s.capi->barrier(c->s.comm, g), "barrier");
}

/* ---- device buffers ---- */

/* Fills n elements of 4 bytes at p: small floats in [-0.01, 0.01] (no denormals, no overflow
 * however often a backward accumulates), or ids in [0, mod) when mod > 0. Chunked: a large
 * buffer needs no host copy of its size. */
static int fill(cal *c, void *p, int64_t n, int64_t mod) {
    enum { CHUNK = 1 << 16 };
    static union { float f[CHUNK]; int32_t i[CHUNK]; } host;
    for (int64_t at = 0; at < n; at += CHUNK) {
        int64_t len = n - at < CHUNK ? n - at : CHUNK;
        for (int64_t j = 0; j < len; j++) {
            uint32_t h = (uint32_t)(at + j) * 2654435761u;
            if (mod > 0) host.i[j] = (int32_t)((uint64_t)(at + j) * 7919u % (uint64_t)mod);
            else host.f[j] = 0.02f * ((float)(h >> 16) / 65536.0f - 0.5f);
        }
        ct_clear_error();
        if (failed(c, c->s.d->copy(c->s.dev, (char *)p + 4 * at, &host, 4 * (size_t)len, CT_COPY_H2D), "device copy"))
            return CAL_FAIL;
    }
    return 0;
}

#define CAL_NBUF 10
typedef struct bufs {
    void *p[CAL_NBUF];
    int n;
} bufs;

/* Allocates the next buffer of n 4-byte elements (filled as `fill` says). */
static int buf_new(cal *c, bufs *b, int64_t n, int64_t mod) {
    if (n < 1) n = 1;
    ct_clear_error();
    if (failed(c, c->s.d->alloc(c->s.dev, 4 * (size_t)n, &b->p[b->n]), "device alloc")) return CAL_FAIL;
    return fill(c, b->p[b->n++], n, mod);
}

static void bufs_free(cal *c, bufs *b) {
    for (int i = 0; i < b->n; i++) c->s.d->free(c->s.dev, b->p[i]);
    b->n = 0;
}

/* ---- one op's forward and backward ---- */

typedef struct bench {
    const cal_op *op;
    bufs b;
    int quant; /* an fp8 GEMM through the quantizer */
} bench;

/* Buffers for the op, in the order op_run reads them. */
static int bench_alloc(cal *c, bench *bn) {
    const int64_t *s = bn->op->shape;
    int64_t kv = bn->op->kv_heads > 0 ? bn->op->kv_heads : s[2];
    int64_t sizes[CAL_NBUF] = {0}, mods[CAL_NBUF] = {0};
    int n = 0;
#define B(size) (sizes[n++] = (size))
#define IDS(size, mod) (mods[n] = (mod), sizes[n++] = (size))
    switch (bn->op->kind) {
    case RT_OP_GEMM: /* x (m,k), w (n,k), y (m,n), dy (m,n), dx (m,k), dw (n,k) */
        B(s[0] * s[1]), B(s[2] * s[1]), B(s[0] * s[2]), B(s[0] * s[2]), B(s[0] * s[1]), B(s[2] * s[1]);
        break;
    case RT_OP_ATTENTION: /* q, k, v, out, lse, dout, dq, dk, dv */
        B(s[0] * s[1] * s[2] * s[3]), B(s[0] * s[1] * kv * s[3]), B(s[0] * s[1] * kv * s[3]);
        B(s[0] * s[1] * s[2] * s[3]), B(s[0] * s[2] * s[1]), B(s[0] * s[1] * s[2] * s[3]);
        B(s[0] * s[1] * s[2] * s[3]), B(s[0] * s[1] * kv * s[3]), B(s[0] * s[1] * kv * s[3]);
        break;
    case RT_OP_EMBEDDING: /* ids (n), table (vocab,c), out (n,c), dout (n,c), dtable (vocab,c) */
        IDS(s[0], s[2]), B(s[2] * s[1]), B(s[0] * s[1]), B(s[0] * s[1]), B(s[2] * s[1]);
        break;
    case RT_OP_RMSNORM: /* x, w, out, rstd, dout, dx, dw */
        B(s[0] * s[1]), B(s[1]), B(s[0] * s[1]), B(s[0]), B(s[0] * s[1]), B(s[0] * s[1]), B(s[1]);
        break;
    case RT_OP_LAYERNORM: /* x, w, b, out, mean, rstd, dout, dx, dw, db */
        B(s[0] * s[1]), B(s[1]), B(s[1]), B(s[0] * s[1]), B(s[0]), B(s[0]), B(s[0] * s[1]), B(s[0] * s[1]);
        B(s[1]), B(s[1]);
        break;
    case RT_OP_ROPE: /* x, out, dout, dx */
        for (int i = 0; i < 4; i++) B(s[0] * s[1] * s[2] * s[3]);
        break;
    case RT_OP_SWIGLU: case RT_OP_ADD: /* a, g, out, dout, da, dg (add: x, y, out, dout, dx, dy) */
        for (int i = 0; i < 6; i++) B(s[0]);
        break;
    case RT_OP_GELU: /* x, out, dout, dx */
        for (int i = 0; i < 4; i++) B(s[0]);
        break;
    case RT_OP_BIAS: /* x, bias, out, dout, dx, dbias */
        B(s[0] * s[1]), B(s[1]), B(s[0] * s[1]), B(s[0] * s[1]), B(s[0] * s[1]), B(s[1]);
        break;
    case RT_OP_XENT: /* logits (n,v), targets (n), losses (n), dlogits (n,v) */
        B(s[0] * s[1]), IDS(s[0], s[1]), B(s[0]), B(s[0] * s[1]);
        break;
    case RT_OP_CAST: /* f32 (n), bf16 (n, in floats: n / 2) */
        B(s[0]), B((s[0] + 1) / 2);
        break;
    }
#undef B
#undef IDS
    for (int i = 0; i < n; i++)
        if (buf_new(c, &bn->b, sizes[i], mods[i])) return CAL_FAIL;
    return 0;
}

/* One forward (backward 0) or one backward, both halves, as the tape calls them. */
static ct_status op_run(cal *c, bench *bn, int backward) {
    const ct_device_api *d = c->s.d;
    ct_device *dev = c->s.dev;
    const int64_t *s = bn->op->shape;
    int64_t kv = bn->op->kv_heads > 0 ? bn->op->kv_heads : s[2];
    void **p = bn->b.p;
    float *f[CAL_NBUF];
    for (int i = 0; i < CAL_NBUF; i++) f[i] = p[i];
    ct_status st;
    switch (bn->op->kind) {
    case RT_OP_GEMM: /* (m,k) @ (n,k)^T; backward dx = dy w, dw = dy^T x (accumulating) */
        if (bn->quant) {
            const ct_quantizer_api *q = c->s.qapi;
            if (!backward) return q->forward(c->s.quant, f[2], f[0], f[1], s[0], s[2], s[1]);
            st = q->backward_input(c->s.quant, f[4], f[3], f[1], s[0], s[2], s[1]);
            return st ? st : q->backward_weight(c->s.quant, f[5], f[3], f[0], s[0], s[2], s[1]);
        }
        if (!backward) return d->matmul(dev, f[2], f[0], f[1], s[0], s[2], s[1], 0, 1, 1.0f, 0.0f);
        st = d->matmul(dev, f[4], f[3], f[1], s[0], s[1], s[2], 0, 0, 1.0f, 1.0f);
        return st ? st : d->matmul(dev, f[5], f[3], f[0], s[2], s[1], s[0], 1, 0, 1.0f, 1.0f);
    case RT_OP_ATTENTION:
        if (!backward) return d->attention_forward(dev, f[3], f[4], f[0], f[1], f[2], s[0], s[1], s[2], kv, s[3]);
        return d->attention_backward(dev, f[6], f[7], f[8], f[5], f[0], f[1], f[2], f[3], f[4], s[0], s[1], s[2], kv,
                                     s[3]);
    case RT_OP_EMBEDDING:
        if (!backward) return d->embedding_forward_general(dev, f[2], p[0], f[1], s[0], s[1], 0, s[2], 1);
        return d->embedding_backward_general(dev, f[4], p[0], f[3], s[0], s[1], 0, s[2], 1);
    case RT_OP_RMSNORM:
        if (!backward) return d->rmsnorm_forward(dev, f[2], f[3], f[0], f[1], s[0], s[1], 1e-5f);
        st = d->rmsnorm_backward_input(dev, f[5], f[4], f[0], f[1], f[3], s[0], s[1]);
        return st ? st : d->rmsnorm_backward_weight(dev, f[6], f[4], f[0], f[3], s[0], s[1]);
    case RT_OP_LAYERNORM:
        if (!backward) return d->layernorm_forward(dev, f[3], f[4], f[5], f[0], f[1], f[2], s[0], s[1], 1e-5f);
        st = d->layernorm_backward_input(dev, f[7], f[6], f[0], f[1], f[4], f[5], s[0], s[1]);
        return st ? st : d->layernorm_backward_weight(dev, f[8], f[9], f[6], f[0], f[4], f[5], s[0], s[1]);
    case RT_OP_ROPE:
        if (!backward) return d->rope_forward_general(dev, f[1], f[0], NULL, NULL, 10000.0f, s[0], s[1], s[2], s[3]);
        return d->rope_backward_general(dev, f[3], f[2], NULL, NULL, 10000.0f, s[0], s[1], s[2], s[3]);
    case RT_OP_SWIGLU:
        if (!backward) return d->swiglu_forward(dev, f[2], f[0], f[1], s[0]);
        return d->swiglu_backward(dev, f[4], f[5], f[3], f[0], f[1], s[0]);
    case RT_OP_GELU:
        if (!backward) return d->gelu_forward(dev, f[1], f[0], s[0]);
        return d->gelu_backward(dev, f[3], f[2], f[0], s[0]);
    case RT_OP_ADD: /* backward: the gradient flows to both inputs */
        if (!backward) return d->add(dev, f[2], f[0], f[1], s[0]);
        st = d->axpy(dev, f[4], f[3], 1.0f, s[0]);
        return st ? st : d->axpy(dev, f[5], f[3], 1.0f, s[0]);
    case RT_OP_BIAS:
        if (!backward) return d->bias_forward(dev, f[2], f[0], f[1], s[0], s[1]);
        st = d->axpy(dev, f[4], f[3], 1.0f, s[0] * s[1]);
        return st ? st : d->bias_backward(dev, f[5], f[3], s[0], s[1]);
    case RT_OP_XENT:
        if (!backward) return d->cross_entropy_forward(dev, f[2], f[0], p[1], s[0], s[1], -100);
        return d->cross_entropy_backward_general(dev, f[3], f[0], p[1], NULL, 1.0f / (float)s[0], NULL, s[0], s[1], 0,
                                                 -100);
    case RT_OP_CAST:
        if (s[1]) return backward ? CT_OK : d->round_bf16(dev, f[0], s[0]);
        if (!backward) return d->cast_f32_to_bf16(dev, p[1], f[0], s[0]);
        return d->cast_bf16_to_f32(dev, f[0], p[1], s[0]);
    }
    ct_set_error("op kind %d cannot be run", bn->op->kind);
    return CT_ERR_INTERNAL;
}

/* Something timed: an op's forward/backward, the optimizer's step, a collective. */
typedef struct timed {
    ct_status (*run)(cal *c, void *arg, int phase);
    void *arg;
    int phases;           /* 1 or 2 */
    ct_comm_group *group; /* the ranks that start together (world, or a collective's group) */
} timed;

static ct_status run_op(cal *c, void *arg, int phase) { return op_run(c, arg, phase); }

/* `calls` calls of one phase, then the device's synchronize: seconds per call. */
static int run_synced(cal *c, const timed *t, int phase, int calls, double *sec) {
    double t0 = ct_now();
    ct_status st = CT_OK;
    ct_clear_error();
    for (int i = 0; i < calls && st == CT_OK; i++) st = t->run(c, t->arg, phase);
    if (st == CT_OK) st = c->s.d->synchronize(c->s.dev);
    *sec = (ct_now() - t0) / calls;
    return failed(c, st, "a measured call");
}

/* The median seconds of each phase, the largest over ranks. Two warm-up calls per phase (the first
 * pays for fresh buffers, thread pools, cached plans; the second tells how long a call takes); a
 * call under a millisecond is timed in groups of up to 100 between synchronizes, so that an
 * asynchronous device's launch and wait do not count as the op's time. A warm-up that fails on any
 * rank returns -1 on every rank (the one that failed with its error in c->err; the caller decides
 * whether that is fatal); a failure after the ranks agreed ends the job. */
static int measure(cal *c, const timed *t, const char *what, double med[2]) {
    double warm[3] = {0, 0, 0}, samples[2][CAL_MAX_REPS];
    for (int p = 0; p < t->phases && !warm[2]; p++)
        if (run_synced(c, t, p, 1, &warm[p]) || run_synced(c, t, p, 1, &warm[p])) warm[2] = 1;
    int mine = warm[2] != 0;
    if (ranks_max(c, warm, 3)) return fail_job(c);
    if (warm[2]) {
        if (!mine) cal_error(c, "calibrate: %s failed on another rank (see its message)", what);
        else {
            size_t n = strlen(c->err);
            snprintf(c->err + n, sizeof c->err - n, " (measuring %s)", what);
        }
        return -1;
    }
    double per = warm[0] + warm[1];
    int calls = per > 0 && per < 1e-3 ? (int)ceil(1e-3 / per) : 1;
    if (calls > 100) calls = 100;
    int reps = per > 0 ? (int)ceil(CAL_TARGET_S / (per * calls)) : CAL_MAX_REPS;
    reps = reps < CAL_MIN_REPS ? CAL_MIN_REPS : reps > CAL_MAX_REPS ? CAL_MAX_REPS : reps;
    if (ranks_barrier(c, t->group)) return fail_job(c);
    for (int r = 0; r < reps; r++)
        for (int p = 0; p < t->phases; p++)
            if (run_synced(c, t, p, calls, &samples[p][r])) return fail_job(c);
    med[1] = 0;
    for (int p = 0; p < t->phases; p++) {
        /* more ranks than cores: the ranks take turns on a core in slices longer than a short op, so
         * the median would be a rank's speed alone; the mean is its share, what a step gets */
        double mean = 0;
        for (int r = 0; r < reps; r++) mean += samples[p][r] / reps;
        med[p] = c->oversubscribed ? mean : median(samples[p], reps);
    }
    return 0;
}

/* The device's matmul precision for an op of `dtype` (PLAN_*, the trace's), as training sets it: bf16
 * for bf16 ops, and for the f32 GEMMs inside a quantizer's fp8 ones when training runs in bf16. */
static int set_op_dtype(cal *c, int dtype) {
    if (!c->bf16_gemm) return 0;
    int bf16 = dtype == PLAN_BF16 || (dtype == PLAN_FP8 && c->train_bf16);
    ct_clear_error();
    return failed(c, c->s.d->set_matmul_dtype(c->s.dev, bf16 ? CT_BF16 : CT_F32), "set_matmul_dtype") ? fail_job(c) : 0;
}

/* An op at its shape: seconds forward and backward (this rank's; the ranks' max is taken later). */
static int measure_op(cal *c, const cal_op *op, double sec[2]) {
    char what[96];
    bench bn = {op, {{0}, 0}, 0};
    bn.quant = op->kind == RT_OP_GEMM && op->dtype == PLAN_FP8 && c->s.qapi;
    if (set_op_dtype(c, op->dtype)) return CAL_FAIL;
    static const char *const names[] = {"GEMM", "attention", "embedding", "rmsnorm", "layernorm", "rope", "swiglu",
                                        "gelu", "add", "bias", "cross entropy", "bf16 cast"};
    snprintf(what, sizeof what, "%s at %lld x %lld x %lld x %lld",
             op->kind >= 0 && op->kind <= RT_OP_CAST ? names[op->kind] : "an op", (long long)op->shape[0],
             (long long)op->shape[1], (long long)op->shape[2], (long long)op->shape[3]);
    timed t = {run_op, &bn, 2, c->world};
    int rc = bench_alloc(c, &bn);
    if (rc) rc = fail_job(c); /* an allocation that fails on one rank only: the job cannot agree */
    else if ((rc = measure(c, &t, what, sec)) == -1) rc = CAL_FAIL;
    bufs_free(c, &bn.b);
    return rc;
}

/* ---- what to measure: the trace's ops and sizes (rank 0), shared with every rank ---- */

/* Whether the op's shape has every extent its kind reads, and a dtype a profile names. */
static int op_shape_ok(const plan_op *o) {
    if (o->dtype < 0 || o->dtype >= PLAN_NDTYPES) return 0;
    int dims = o->kind == RT_OP_GEMM || o->kind == RT_OP_EMBEDDING ? 3
               : o->kind == RT_OP_ATTENTION || o->kind == RT_OP_ROPE ? 4
               : o->kind == RT_OP_SWIGLU || o->kind == RT_OP_GELU || o->kind == RT_OP_ADD ||
                       o->kind == RT_OP_CAST
                   ? 1
                                                                                                 : 2;
    for (int i = 0; i < dims; i++)
        if (o->shape[i] < 1) return 0;
    return 1;
}

static void size_add(double *v, int *n, int cap, double bytes) {
    if (bytes <= 0) return;
    for (int i = 0; i < *n; i++)
        if (v[i] == bytes) return;
    if (*n < cap) v[(*n)++] = bytes;
}

/* The distinct ops of the trace, and the largest collective the layout moves: its collectives, one
 * unit's parameters (an FSDP gather), all parameters (a DDP all-reduce). */
static int ops_from_trace(cal *c, const plan_trace *t, double n_params, double *largest) {
    double unit_bytes = 0, cur = 0;
    int unit = -1, skipped = 0;
    *largest = n_params * 4;
    for (int i = 0; i < t->n_ops; i++) {
        const plan_op *o = &t->ops[i];
        if (o->unit != unit) unit = o->unit, cur = 0;
        if (o->kind == RT_OP_GEMM) cur += 4.0 * (double)o->shape[1] * (double)o->shape[2];
        if (o->kind == RT_OP_EMBEDDING) cur += 4.0 * (double)o->shape[1] * (double)o->shape[2];
        if (cur > unit_bytes) unit_bytes = cur;
        if (o->kind == RT_OP_COLLECTIVE) {
            if (o->coll_bytes > *largest) *largest = o->coll_bytes;
            continue;
        }
        if (o->kind == RT_OP_CUSTOM || o->kind < 0 || o->kind >= RT_OP_NKINDS) continue; /* its plan's costs */
        if (!op_shape_ok(o)) {
            skipped++;
            continue;
        }
        int k = 0;
        for (; k < c->n_ops; k++) {
            const cal_op *q = &c->ops[k];
            /* a profile keys ops by kind, shape and dtype (the trace's, which the planner looks up):
             * attention's kv heads are the model's, one count per trace, so they need no place */
            if (q->kind == o->kind && q->dtype == o->dtype && !memcmp(q->shape, o->shape, sizeof q->shape)) break;
        }
        if (k < c->n_ops) continue;
        if (c->n_ops == CAL_MAX_OPS) {
            cal_error(c, "calibrate: the trace has more than %d distinct ops", CAL_MAX_OPS);
            return -1;
        }
        cal_op *q = &c->ops[c->n_ops++];
        memset(q, 0, sizeof *q);
        q->kind = o->kind;
        q->dtype = o->dtype;
        q->kv_heads = o->kind == RT_OP_ATTENTION ? o->kv_heads : 0;
        memcpy(q->shape, o->shape, sizeof q->shape);
        q->flops[0] = o->flops[0], q->flops[1] = o->flops[1];
    }
    if (unit_bytes > *largest) *largest = unit_bytes;
    if (skipped) {
        char line[96];
        snprintf(line, sizeof line, "%d trace ops without a shape or dtype not measured", skipped);
        note_add(c, line);
    }
    return 0;
}

/* A copy of the manifest for the planner's context, which sets each layout's keys in the manifest
 * it reads (the caller's stays as given): the same values with the same origins. */
static manifest *manifest_copy(const manifest *mf) {
    manifest *m = manifest_new();
    if (!m) {
        ct_set_error("out of memory");
        return NULL;
    }
    free(m->path);
    free(m->dir);
    m->path = strdup(mf->path);
    m->dir = strdup(mf->dir);
    if (!m->path || !m->dir) goto nomem;
    for (int i = 0; i < mf->n_values; i++) {
        const mf_value *v = &mf->values[i];
        if (!v->value) continue; /* a map where a scalar belongs: validation refused it already */
        if (manifest_override(m, v->key, v->value) != CT_OK) goto fail;
        m->values[m->n_values - 1].line = v->line;
        m->values[m->n_values - 1].is_seq = v->is_seq;
    }
    manifest_add_core_schema(m);
    return m;
nomem:
    ct_set_error("out of memory");
fail:
    manifest_free(m);
    return NULL;
}

/* Rank 0: the layout's trace into c->ops and the largest collective size. */
static int trace_layout(cal *c, manifest *mf, double *largest) {
    plan_ctx *ctx = NULL;
    plan_layout layout;
    plan_trace trace;
    ct_model_desc desc;
    memset(&trace, 0, sizeof trace);
    memset(&desc, 0, sizeof desc);
    desc.struct_size = sizeof desc;
    ct_clear_error();
    if (c->s.m->describe(c->s.model, &desc) != CT_OK) {
        cal_error(c, "model: %s", ct_last_error());
        return -1;
    }
    manifest *copy = manifest_copy(mf);
    if (!copy) return took_error(c);
    int rc = -1;
    if (plan_open(&ctx, copy) != CT_OK) {
        manifest_free(copy);
        return took_error(c);
    }
    if (plan_layout_from_manifest(ctx, c->size, &layout) != CT_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", ct_last_error());
        cal_error(c, "calibrate: the manifest's layout on this job's %d rank%s: %s (calibrate with "
                  "`ctitan launch -n N` for a layout of N GPUs)", c->size, c->size > 1 ? "s" : "", why);
        goto done;
    }
    if (plan_trace_layout(ctx, &layout, &trace) != CT_OK) {
        took_error(c);
        goto done;
    }
    if (trace.cannot[0]) {
        char line[320];
        snprintf(line, sizeof line, "the trace stopped early (%s): its later ops are not measured", trace.cannot);
        fprintf(stderr, "ctitan plan: calibrate: %s\n", line);
        note_add(c, line);
    }
    rc = ops_from_trace(c, &trace, (double)desc.n_params, largest);
done:
    plan_trace_free(&trace);
    plan_close(ctx);
    manifest_free(copy);
    return rc;
}

/* Collective sizes: x4 steps from 4 KiB to the largest (capped), each a multiple of 4 x N bytes so
 * every group size splits it evenly. */
static void plan_sizes(cal *c, double largest) {
    double cap = 256.0 * (1 << 20), unit = 4.0 * c->size;
    if (c->info.memory_bytes > 0 && cap > (double)c->info.memory_bytes / 16) cap = (double)c->info.memory_bytes / 16;
    if (largest > cap) {
        char line[96];
        snprintf(line, sizeof line, "collectives measured up to %.0f MiB (the layout moves up to %.0f)",
                 cap / (1 << 20), largest / (1 << 20));
        note_add(c, line);
        largest = cap;
    }
    if (largest < 65536) largest = 65536;
    c->n_sizes = 0;
    for (double b = 4096; b < largest && c->n_sizes < CAL_MAX_SIZES - 1; b *= 4)
        size_add(c->sizes, &c->n_sizes, CAL_MAX_SIZES, ceil(b / unit) * unit);
    size_add(c->sizes, &c->n_sizes, CAL_MAX_SIZES, ceil(largest / unit) * unit);
}

/* Whether the profile can be written, before anything is measured: its folder exists and is
 * writable (the profile is written there under a temporary name, then renamed). */
static int output_ok(cal *c, const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    struct stat st;
    if (!*path || (slash && !slash[1])) {
        cal_error(c, "calibrate: --output '%s': expected a file name", path);
        return -1;
    }
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + (slash == path) : 1, slash ? path : ".");
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        cal_error(c, "calibrate: --output %s: is a folder; expected a file name", path);
        return -1;
    }
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || access(dir, W_OK | X_OK) != 0) {
        cal_error(c, "calibrate: --output %s: cannot write into folder %s: %s", path, dir,
                  stat(dir, &st) != 0 ? strerror(errno) : !S_ISDIR(st.st_mode) ? "not a folder" : strerror(errno));
        return -1;
    }
    return 0;
}

/* Rank 0 checks the output, traces and sends every rank the ops and sizes: [status, n_ops, n_sizes],
 * then the ops (CAL_OP_FIELDS doubles each) and sizes. An output or a trace that fails returns -1 on
 * every rank, rank 0's with its error (the others' err empty: rank 0 prints the line). */
static int share_work(cal *c, manifest *mf, const char *out_path) {
    double head[3] = {0, 0, 0}, largest = 0;
    if (c->rank == 0) {
        head[0] = output_ok(c, out_path) || trace_layout(c, mf, &largest) ? -1 : 0;
        if (head[0] == 0) plan_sizes(c, largest);
        head[1] = c->n_ops, head[2] = c->n_sizes;
    }
    if (ranks_share(c, head, 3, 1)) return fail_job(c);
    if (head[0] != 0) {
        if (c->rank != 0) c->err[0] = '\0';
        return -1;
    }
    int n = (int)head[1] * CAL_OP_FIELDS + (int)head[2];
    double *v = calloc((size_t)n + 1, sizeof *v);
    if (!v) {
        cal_error(c, "out of memory");
        return fail_job(c);
    }
    for (int i = 0; c->rank == 0 && i < c->n_ops; i++) {
        const cal_op *o = &c->ops[i];
        double *f = v + i * CAL_OP_FIELDS;
        f[0] = o->kind, f[1] = o->dtype, f[2] = o->kv_heads, f[7] = o->flops[0], f[8] = o->flops[1];
        for (int k = 0; k < 4; k++) f[3 + k] = (double)o->shape[k];
    }
    if (c->rank == 0) memcpy(v + c->n_ops * CAL_OP_FIELDS, c->sizes, sizeof(double) * (size_t)c->n_sizes);
    if (ranks_share(c, v, n, 1)) {
        free(v);
        return fail_job(c);
    }
    c->n_ops = (int)head[1], c->n_sizes = (int)head[2];
    for (int i = 0; c->rank != 0 && i < c->n_ops; i++) {
        const double *f = v + i * CAL_OP_FIELDS;
        cal_op *o = &c->ops[i];
        memset(o, 0, sizeof *o);
        o->kind = (int)f[0], o->dtype = (int)f[1], o->kv_heads = (int)f[2], o->flops[0] = f[7], o->flops[1] = f[8];
        for (int k = 0; k < 4; k++) o->shape[k] = (int64_t)f[3 + k];
    }
    if (c->rank != 0) memcpy(c->sizes, v + c->n_ops * CAL_OP_FIELDS, sizeof(double) * (size_t)c->n_sizes);
    free(v);
    return 0;
}

/* ---- the ops, and the device's rates ---- */

static int measure_ops(cal *c) {
    double *all = calloc(2 * (size_t)c->n_ops + 1, sizeof *all);
    if (!all) {
        cal_error(c, "out of memory");
        return fail_job(c);
    }
    int rc = 0;
    for (int i = 0; i < c->n_ops && !rc; i++) rc = measure_op(c, &c->ops[i], all + 2 * i);
    if (!rc && ranks_max(c, all, 2 * c->n_ops)) rc = fail_job(c);
    for (int i = 0; i < c->n_ops && !rc; i++) c->ops[i].seconds[0] = all[2 * i], c->ops[i].seconds[1] = all[2 * i + 1];
    free(all);
    return rc;
}

/* A square GEMM at dtype: n grows (x2 from 512) while one call takes under 10 ms, to at most 8192;
 * every rank agrees on n. FLOP/s of the forward, the slowest rank's. */
static int gemm_rate(cal *c, int dtype, double *rate) {
    int64_t n = 512;
    for (;;) {
        cal_op sq = {RT_OP_GEMM, dtype, 0, {n, n, n, 0}, {0, 0}, {0, 0}};
        bench bn = {&sq, {{0}, 0}, dtype == PLAN_FP8 && c->s.qapi};
        timed t = {run_op, &bn, 1, c->world};
        double sec[2] = {0, 0}, one[1];
        int rc = bench_alloc(c, &bn) ? fail_job(c) : run_synced(c, &t, 0, 1, &one[0]) ? fail_job(c) : 0;
        if (!rc && ranks_max(c, one, 1)) rc = fail_job(c);
        int grow = !rc && one[0] < 0.01 && n < 8192;
        if (!rc && !grow && (rc = measure(c, &t, "a large GEMM", sec)) == -1) rc = CAL_FAIL;
        bufs_free(c, &bn.b);
        if (rc) return rc;
        if (!grow) {
            if (ranks_max(c, sec, 1)) return fail_job(c);
            *rate = 2.0 * (double)n * (double)n * (double)n / sec[0];
            if (dtype == PLAN_F32) c->gemm_n = n;
            return 0;
        }
        n *= 2;
    }
}

typedef struct mem_bench {
    bufs b; /* a, b, out */
    int64_t n;
} mem_bench;

static ct_status run_add(cal *c, void *arg, int phase) {
    (void)phase;
    mem_bench *m = arg;
    return c->s.d->add(c->s.dev, m->b.p[2], m->b.p[0], m->b.p[1], m->n);
}

static ct_status run_copy(cal *c, void *arg, int phase) {
    (void)phase;
    mem_bench *m = arg;
    return c->s.d->copy(c->s.dev, m->b.p[2], m->b.p[0], 4 * (size_t)m->n, CT_COPY_D2D);
}

/* Memory bandwidth: out = a + b (12 bytes an element) and a device-to-device copy (8), on buffers
 * past any cache: 16M elements, x4 while an add takes under 5 ms (a GPU), to at most 256M. */
static int mem_bandwidth(cal *c) {
    mem_bench m = {{{0}, 0}, 16 << 20};
    for (;;) {
        double one[1], add[2] = {0, 0}, copy[2] = {0, 0};
        timed ta = {run_add, &m, 1, c->world}, tc = {run_copy, &m, 1, c->world};
        int rc = 0;
        for (int i = 0; i < 3 && !rc; i++) rc = buf_new(c, &m.b, m.n, 0);
        if (rc || run_synced(c, &ta, 0, 1, &one[0]) || ranks_max(c, one, 1)) rc = fail_job(c);
        int grow = !rc && one[0] < 0.005 && m.n < (256 << 20);
        if (!rc && !grow) {
            if ((rc = measure(c, &ta, "memory bandwidth (add)", add)) == 0)
                rc = measure(c, &tc, "memory bandwidth (copy)", copy);
            if (rc == -1) rc = CAL_FAIL;
        }
        bufs_free(c, &m.b);
        if (rc) return rc;
        if (!grow) {
            double sec[2] = {add[0], copy[0]};
            if (ranks_max(c, sec, 2)) return fail_job(c);
            c->add_bw = 12.0 * (double)m.n / sec[0];
            c->copy_bw = 8.0 * (double)m.n / sec[1];
            return 0;
        }
        m.n *= 4;
    }
}

/* The optimizer's step on one 1024-wide matrix of 4M elements, through the manifest's optimizer:
 * its memory traffic (plan_step's, or the planner's default of (2 + 2 x states) x 4 bytes an
 * element) per second. Skipped, with a note, when the optimizer cannot step alone or reports GEMM
 * work (its time is then not memory-bound). */
typedef struct opt_bench {
    ct_optimizer *opt;
    ct_tensor t;
    float *state[8];
    int64_t step;
} opt_bench;

static ct_status run_opt(cal *c, void *arg, int phase) {
    (void)phase;
    opt_bench *o = arg;
    return c->s.o->step(o->opt, &o->t, o->state, ct_tensor_numel(&o->t), 1e-4f, ++o->step);
}

static int optimizer_rate(cal *c) {
    const int64_t rows = 4096, cols = 1024, n = rows * cols;
    opt_bench ob;
    bufs b = {{0}, 0};
    double sec[2] = {0, 0}, bytes = 0;
    memset(&ob, 0, sizeof ob);
    ct_clear_error();
    ct_status st = c->s.o->create(&c->s.optp->host, c->s.d, c->s.dev, &ob.opt);
    int states = st == CT_OK ? c->s.o->state_count(ob.opt) : -1;
    int rc = 0, skip = st != CT_OK || states < 0 || states > 8;
    for (int i = 0; !skip && i < 2 + states && !rc; i++) rc = buf_new(c, &b, n, 0);
    if (!skip && !rc) {
        ob.t = (ct_tensor){sizeof ob.t, CT_F32, 2, {rows, cols}, b.p[0], b.p[1], "calibrate.weight",
                           CT_TENSOR_PARAM, 0};
        for (int i = 0; i < states; i++) ob.state[i] = b.p[2 + i];
        bytes = (2.0 + 2.0 * states) * 4.0 * (double)n;
        if (CT_HAS_FIELD(c->s.o, ct_optimizer_api, plan_step) && c->s.o->plan_step) {
            ct_param_slot slot;
            ct_optimizer_cost cost = {sizeof cost, 0, 0, 0, 0};
            memset(&slot, 0, sizeof slot);
            slot.struct_size = sizeof slot, slot.param = &ob.t, slot.numel = n, slot.local_numel = n;
            slot.placement = CT_PLACE_REPLICATE, slot.shard_axis = -1, slot.split_axis = -1, slot.split_dim = -1;
            slot.split_parts = 1, slot.local_data = b.p[0], slot.local_grad = b.p[1], slot.copy_of = -1;
            slot.global_shape[0] = rows, slot.global_shape[1] = cols;
            if (c->s.o->plan_step(ob.opt, &slot, &cost) == CT_OK && cost.bytes > 0) bytes = cost.bytes;
            skip = cost.matmul_flops > 0;
        }
    }
    timed t = {run_opt, &ob, 1, c->world};
    /* every rank decides the same (the same plugin): skip, or measure together */
    if (!skip && !rc && (rc = measure(c, &t, "the optimizer's step", sec)) == -1) skip = 1, rc = 0;
    if (!rc && !skip && ranks_max(c, sec, 1)) rc = fail_job(c);
    if (!rc && !skip) c->opt_bw = bytes / sec[0];
    if (!rc && skip) note_add(c, "optimizer step not measured");
    bufs_free(c, &b);
    if (ob.opt) c->s.o->destroy(ob.opt);
    return rc;
}

/* Matmul peaks and rates per GEMM dtype. The primary dtype (bf16 where the device offers bf16
 * GEMMs, else f32, which a CPU runs for bf16 too) takes the device's peak; the others' peaks are
 * set so that peak x matmul_eff gives their measured rate. */
static int device_rates(cal *c) {
    const ct_device_api *d = c->s.d;
    int primary = c->bf16_gemm ? PLAN_BF16 : PLAN_F32;
    for (int dt = PLAN_F32; dt <= PLAN_BF16; dt++) {
        if (dt == PLAN_BF16 && !c->bf16_gemm) {
            c->gemm_rate[dt] = c->gemm_rate[PLAN_F32];
            continue;
        }
        int rc = set_op_dtype(c, dt);
        if (rc || (rc = gemm_rate(c, dt, &c->gemm_rate[dt]))) return rc;
        if (dt == primary && d->measure_peak_flops) {
            double peak[1] = {0};
            ct_clear_error();
            if (failed(c, d->measure_peak_flops(c->s.dev, &peak[0]), "measure_peak_flops")) return fail_job(c);
            if (ranks_max(c, peak, 1)) return fail_job(c);
            c->peak[dt] = peak[0];
        }
    }
    if (!c->bf16_gemm) note_add(c, "bf16 GEMMs run at f32 (no bf16 matmul)");
    if (c->s.qapi) {
        int rc = set_op_dtype(c, PLAN_FP8);
        if (rc || (rc = gemm_rate(c, PLAN_FP8, &c->gemm_rate[PLAN_FP8]))) return rc;
    } else {
        c->gemm_rate[PLAN_FP8] = c->gemm_rate[primary];
        note_add(c, "fp8 = bf16 rate (float8 off)");
    }
    if (c->peak[primary] < c->gemm_rate[primary]) c->peak[primary] = c->gemm_rate[primary];
    c->matmul_eff = c->gemm_rate[primary] / c->peak[primary];
    for (int dt = 0; dt < PLAN_NDTYPES; dt++)
        if (dt != primary) c->peak[dt] = c->gemm_rate[dt] / c->matmul_eff;
    return set_op_dtype(c, PLAN_F32);
}

/* Attention's rate: the trace's attention op of most FLOPs, forward and backward, by the trace's
 * FLOPs (or the causal count 2 b h t^2 d forward, 2.5x that backward, where the trace has none). */
static void attention_rate(cal *c) {
    double best = 0;
    for (int i = 0; i < c->n_ops; i++) {
        const cal_op *o = &c->ops[i];
        if (o->kind != RT_OP_ATTENTION) continue;
        double f = o->flops[0] + o->flops[1];
        double b = (double)o->shape[0], t = (double)o->shape[1], h = (double)o->shape[2], d = (double)o->shape[3];
        if (f <= 0) f = 3.5 * 2.0 * b * h * t * t * d;
        if (f > best && o->seconds[0] + o->seconds[1] > 0) best = f, c->attn_rate = f / (o->seconds[0] + o->seconds[1]);
    }
    if (best == 0) note_add(c, "no attention in the trace: rated as GEMMs");
}

/* ---- collectives ---- */

typedef struct coll_bench {
    ct_comm_group *g;
    int kind, d;
    int64_t count; /* elements per rank (all-gather, reduce-scatter) or of the buffer (all-reduce) */
    void *send, *recv;
} coll_bench;

static ct_status run_coll(cal *c, void *arg, int phase) {
    (void)phase;
    coll_bench *b = arg;
    const ct_comm_api *api = c->s.capi;
    if (b->kind == CT_COLL_ALL_GATHER)
        return api->all_gather(c->s.comm, b->g, b->send, b->recv, b->count, CT_F32, NULL);
    if (b->kind == CT_COLL_REDUCE_SCATTER)
        return api->reduce_scatter(c->s.comm, b->g, b->send, b->recv, b->count, CT_F32, CT_REDUCE_SUM, NULL);
    return api->all_reduce(c->s.comm, b->g, b->send, b->recv, b->count, CT_F32, CT_REDUCE_SUM, NULL);
}

/* Every collective kind at every size over groups of d consecutive ranks (all groups at once). */
static int measure_group(cal *c, int d, double *secs) {
    static const int kinds[3] = {CT_COLL_ALL_GATHER, CT_COLL_REDUCE_SCATTER, CT_COLL_ALL_REDUCE};
    coll_bench cb = {c->world, 0, d, 0, NULL, NULL};
    bufs b = {{0}, 0};
    int rc = 0;
    ct_clear_error();
    if (d < c->size &&
        failed(c, c->s.capi->split(c->s.comm, c->world, c->rank / d, c->rank, "calibrate", &cb.g), "split"))
        return fail_job(c);
    double largest = c->sizes[c->n_sizes - 1];
    if (buf_new(c, &b, (int64_t)(largest / 4), 0) || buf_new(c, &b, (int64_t)(largest / 4), 0)) rc = fail_job(c);
    cb.send = b.p[0], cb.recv = b.p[1];
    for (int k = 0; k < 3 && !rc; k++)
        for (int s = 0; s < c->n_sizes && !rc; s++) {
            char what[64];
            double sec[2];
            cb.kind = kinds[k];
            cb.count = (int64_t)(c->sizes[s] / 4) / (kinds[k] == CT_COLL_ALL_REDUCE ? 1 : d);
            timed t = {run_coll, &cb, 1, cb.g};
            snprintf(what, sizeof what, "a collective of %.0f bytes", c->sizes[s]);
            if ((rc = measure(c, &t, what, sec)) == -1) rc = fail_job(c);
            secs[k * c->n_sizes + s] = sec[0];
        }
    bufs_free(c, &b);
    if (cb.g != c->world) c->s.capi->group_free(c->s.comm, cb.g);
    return rc;
}

/* How much of a collective hides behind compute on this machine: an all-gather over every rank
 * started without waiting, the trace's largest GEMM run meanwhile (with test() pokes between
 * calls where the comm has them, as the strategies do), then the wait; against each alone. */
typedef struct overlap_bench {
    coll_bench cb;
    bench *gemm;
    int both; /* 0 the collective alone, 1 the GEMM alone, 2 both */
} overlap_bench;

static ct_status run_overlap(cal *c, void *arg, int phase) {
    (void)phase;
    overlap_bench *o = arg;
    const ct_comm_api *api = c->s.capi;
    if (o->both == 0) return run_coll(c, &o->cb, 0);
    if (o->both == 1) return op_run(c, o->gemm, 0);
    ct_comm_request *req = NULL;
    ct_status st = api->all_gather(c->s.comm, o->cb.g, o->cb.send, o->cb.recv, o->cb.count, CT_F32, &req);
    if (st == CT_OK) st = op_run(c, o->gemm, 0);
    int done = 0;
    if (st == CT_OK && req && CT_HAS_FIELD(api, ct_comm_api, test) && api->test) st = api->test(c->s.comm, req, &done);
    if (req) {
        ct_status w = api->wait(c->s.comm, req);
        if (st == CT_OK) st = w;
    }
    return st;
}

static int measure_overlap(cal *c) {
    c->comm_overlap = 0;
    if (c->size == 1) return 0;
    const cal_op *g = NULL;
    for (int i = 0; i < c->n_ops; i++)
        if (c->ops[i].kind == RT_OP_GEMM && (!g || c->ops[i].seconds[0] > g->seconds[0])) g = &c->ops[i];
    if (!g) return 0;
    bench bn = {g, {{0}, 0}, 0};
    bufs b = {{0}, 0};
    overlap_bench ob = {{c->world, CT_COLL_ALL_GATHER, c->size, 0, NULL, NULL}, &bn, 0};
    /* a gather about as long as the GEMM: the largest measured size that is not longer */
    double bytes = c->sizes[0];
    for (int i = 0; i < c->n_comms; i++)
        if (c->comms[i].kind == CT_COLL_ALL_GATHER && c->comms[i].ranks == c->size &&
            c->comms[i].seconds <= g->seconds[0] && c->comms[i].bytes > bytes)
            bytes = c->comms[i].bytes;
    ob.cb.count = (int64_t)(bytes / 4) / c->size;
    if (set_op_dtype(c, g->dtype)) return CAL_FAIL;
    int rc = bench_alloc(c, &bn) || buf_new(c, &b, (int64_t)(bytes / 4), 0) || buf_new(c, &b, (int64_t)(bytes / 4), 0);
    if (rc) {
        bufs_free(c, &bn.b);
        bufs_free(c, &b);
        return fail_job(c);
    }
    ob.cb.send = b.p[0], ob.cb.recv = b.p[1];
    double t[3][2];
    timed tm = {run_overlap, &ob, 1, c->world};
    for (ob.both = 0; ob.both < 3 && !rc; ob.both++)
        if ((rc = measure(c, &tm, "a collective beside a GEMM", t[ob.both])) == -1) rc = CAL_FAIL;
    bufs_free(c, &bn.b);
    bufs_free(c, &b);
    if (rc) return rc;
    double hidden = t[0][0] + t[1][0] - t[2][0], shorter = fmin(t[0][0], t[1][0]);
    c->comm_overlap = shorter > 0 ? fmin(1.0, fmax(0.0, hidden / shorter)) : 0;
    return 0;
}

/* The ring all-gather's time (d-1) lat + (d-1)/d bytes/bw, fitted to the measured all-gathers by
 * least squares on relative error (small sizes decide the latency, large ones the bandwidth). Where
 * noise makes that fit's latency negative, the latency is the smallest all-gather's time per step
 * (an upper bound) and the bandwidth is fitted to what remains. */
static void fit_ring(cal *c) {
    double s11 = 0, s12 = 0, s22 = 0, t1 = 0, t2 = 0, step = 0;
    for (int i = 0; i < c->n_comms; i++) {
        const plan_measured_comm *m = &c->comms[i];
        if (m->kind != CT_COLL_ALL_GATHER || m->seconds <= 0) continue;
        double w = 1.0 / (m->seconds * m->seconds), x1 = m->ranks - 1, x2 = (m->ranks - 1.0) / m->ranks * m->bytes;
        s11 += w * x1 * x1, s12 += w * x1 * x2, s22 += w * x2 * x2;
        t1 += w * x1 * m->seconds, t2 += w * x2 * m->seconds;
        if (step == 0 || m->seconds / x1 < step) step = m->seconds / x1;
    }
    double det = s11 * s22 - s12 * s12, lat = 0, inv_bw = 0;
    if (det > 0) lat = (t1 * s22 - t2 * s12) / det, inv_bw = (s11 * t2 - s12 * t1) / det;
    if (!(lat > 0) || !(inv_bw > 0)) {
        lat = step;
        inv_bw = s22 > 0 ? (t2 - lat * s12) / s22 : 0;
        if (!(inv_bw > 0)) lat = 0, inv_bw = s22 > 0 ? t2 / s22 : 0; /* the bandwidth alone */
    }
    c->intra_lat = lat;
    c->intra_bw = inv_bw > 0 ? 1.0 / inv_bw : 0;
}

static int measure_comms(cal *c) {
    if (c->size == 1) return 0;
    int n_groups = 0;
    for (int d = 2; d <= c->size; d++) n_groups += c->size % d == 0;
    int per = 3 * c->n_sizes;
    double *secs = calloc((size_t)(n_groups * per) + 1, sizeof *secs);
    c->comms = calloc((size_t)(n_groups * per) + 1, sizeof *c->comms);
    if (!secs || !c->comms) {
        free(secs);
        cal_error(c, "out of memory");
        return fail_job(c);
    }
    int rc = 0, gi = 0;
    for (int d = 2; d <= c->size && !rc; d++)
        if (c->size % d == 0) rc = measure_group(c, d, secs + per * gi++);
    if (!rc && ranks_max(c, secs, n_groups * per)) rc = fail_job(c);
    gi = 0;
    for (int d = 2; d <= c->size && !rc; d++) {
        if (c->size % d) continue;
        for (int i = 0; i < per; i++) {
            static const int kinds[3] = {CT_COLL_ALL_GATHER, CT_COLL_REDUCE_SCATTER, CT_COLL_ALL_REDUCE};
            plan_measured_comm *m = &c->comms[c->n_comms++];
            m->kind = kinds[i / c->n_sizes], m->ranks = d, m->bytes = c->sizes[i % c->n_sizes];
            m->seconds = secs[per * gi + i];
        }
        gi++;
    }
    free(secs);
    if (!rc) fit_ring(c);
    return rc;
}

/* ---- the profile ---- */

static int write_profile(cal *c, const manifest *mf, const char *out_path) {
    hw_profile hw;
    char when[40];
    memset(&hw, 0, sizeof hw);
    ct_utc_iso(when, sizeof when);
    const char *dev = c->info.name ? c->info.name : "device";
    int cpu = !strncmp(dev, "cpu", 3);
    snprintf(hw.name, sizeof hw.name, "calibrated: %s x %d rank%s", dev, c->size, c->size > 1 ? "s" : "");
    double mem = (double)c->info.memory_bytes;
    if (mem <= 0) { /* the device does not say: the machine's memory */
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        mem = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
        cpu = 1;
    }
    if (cpu) { /* the ranks share the machine's memory */
        mem /= c->size;
        note_add(c, "memory: RAM / ranks");
    }
    note_add(c, "runtime overhead, allocator slack: not measured (0)");
    if (c->size == 1) note_add(c, "1 rank: no collectives; link bandwidth = device copy");
    snprintf(hw.source, sizeof hw.source, "ctitan plan --calibrate %s on %d rank%s, %s; %s", mf->path, c->size,
             c->size > 1 ? "s" : "", when, c->note);
    hw.mem_bytes = mem;
    hw.mem_bw = c->add_bw > c->copy_bw ? c->add_bw : c->copy_bw;
    for (int dt = 0; dt < PLAN_NDTYPES; dt++) hw.peak_flops[dt] = c->peak[dt];
    hw.matmul_eff = c->matmul_eff;
    int primary = c->bf16_gemm ? PLAN_BF16 : PLAN_F32;
    hw.attn_eff = c->attn_rate > 0 ? c->attn_rate / c->gemm_rate[primary] : 1.0;
    if (hw.attn_eff > 1) hw.attn_eff = 1;
    hw.mem_eff = (c->opt_bw > 0 ? c->opt_bw : c->add_bw) / hw.mem_bw;
    if (hw.mem_eff > 1) hw.mem_eff = 1;
    hw.intra_bw = c->size > 1 && c->intra_bw > 0 ? c->intra_bw : c->copy_bw;
    hw.intra_lat = c->size > 1 ? c->intra_lat : 0;
    hw.inter_bw = hw.intra_bw, hw.inter_lat = hw.intra_lat;
    hw.gpus_per_node = c->size;
    hw.overhead_bytes = 0, hw.alloc_frac = 0;
    hw.headroom_frac = 0.05;
    hw.calibrated = 1;
    hw.core_share = c->core_share;
    hw.comm_overlap = c->size > 1 ? fmax(c->comm_overlap, 1e-3) : 0;
    hw.n_ops = c->n_ops;
    hw.ops = calloc((size_t)c->n_ops + 1, sizeof *hw.ops);
    if (!hw.ops) {
        cal_error(c, "out of memory");
        return CAL_FAIL;
    }
    for (int i = 0; i < c->n_ops; i++) {
        plan_measured_op *m = &hw.ops[i];
        m->kind = c->ops[i].kind, m->dtype = c->ops[i].dtype;
        memcpy(m->shape, c->ops[i].shape, sizeof m->shape);
        m->seconds[0] = c->ops[i].seconds[0], m->seconds[1] = c->ops[i].seconds[1];
    }
    hw.comms = c->comms, hw.n_comms = c->n_comms;
    int rc = hw_profile_write(&hw, out_path) != CT_OK ? took_error(c) : 0;
    free(hw.ops);
    if (rc) return rc;
    printf("calibrate: %s: %d ops, GEMM %.1f GFLOP/s at %lld^3 f32 (%.0f%% of %.1f GFLOP/s), memory %.2f GB/s, "
           "attention %.1f GFLOP/s, optimizer %.2f GB/s",
           hw.name, c->n_ops, c->gemm_rate[PLAN_F32] / 1e9, (long long)c->gemm_n, 100 * c->matmul_eff,
           c->peak[primary] / 1e9, hw.mem_bw / 1e9, c->attn_rate / 1e9, c->opt_bw / 1e9);
    if (c->size > 1) printf(", ring %.2f GB/s + %.1f us", hw.intra_bw / 1e9, hw.intra_lat * 1e6);
    printf("\ncalibrate: wrote %s\n", out_path);
    return 0;
}

/* ---- opening: the manifest's device, model, quantizer and comm ---- */

static int open_comm(cal *c, manifest *mf) {
    const char *name = "mpi";
    mf_get_str(mf, "comm.name", &name);
    c->s.commp = plugin_load(name, CT_KIND_COMM, "comm", mf);
    if (!c->s.commp) {
        char where[600];
        mf_where(mf, "comm.name", where, sizeof where);
        cal_error(c, "%s: %s", where, ct_last_error());
        return -1;
    }
    c->s.capi = c->s.commp->info.api;
    if (*(const size_t *)c->s.capi < offsetof(ct_comm_api, test)) {
        cal_error(c, "%s: comm plugin '%s' has an API table too old for this host: rebuild it",
                  c->s.commp->path, c->s.commp->info.name);
        c->s.capi = NULL;
        return -1;
    }
    ct_clear_error();
    ct_status st = c->s.capi->create(&c->s.commp->host, &c->s.comm);
    if (st != CT_OK) {
        c->s.comm = NULL;
        cal_error(c, "comm: %s", ct_last_error());
        return st == CT_ERR_INVALID ? -1 : CAL_FAIL;
    }
    if (failed(c, c->s.capi->world(c->s.comm, &c->world), "comm world") ||
        failed(c, c->s.capi->group_rank(c->s.comm, c->world, &c->rank, &c->size), "comm group_rank"))
        return CAL_FAIL;
    log_set_rank(c->rank, c->size);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    c->oversubscribed = cores > 0 && c->size > cores;
    c->core_share = c->oversubscribed ? (double)cores / c->size : 0;
    if (c->oversubscribed) note_add(c, "more ranks than cores: each op's time is its mean under time sharing");
    /* CUDA + NCCL: the comm orders itself against the device's stream, as in training */
    if (CT_HAS_FIELD(c->s.capi, ct_comm_api, bind_stream) && c->s.capi->bind_stream &&
        CT_HAS_FIELD(c->s.d, ct_device_api, share_stream) && c->s.d->share_stream) {
        ct_stream *stream = NULL;
        if (failed(c, c->s.d->share_stream(c->s.dev, &stream), "device share_stream") ||
            failed(c, c->s.capi->bind_stream(c->s.comm, stream), "comm bind_stream"))
            return CAL_FAIL;
    }
    return 0;
}

/* The device's precision modes: bf16 GEMMs where it offers them; the quantizer when float8 is on. */
static int open_compute(cal *c, manifest *mf) {
    ct_clear_error();
    c->info.struct_size = sizeof c->info;
    if (failed(c, c->s.d->info(c->s.dev, &c->info), "device info")) return CAL_FAIL;
    const char *mp = "float32";
    mf_get_str(mf, "training.mixed_precision_param", &mp);
    c->train_bf16 = !strcmp(mp, "bfloat16");
    if (CT_HAS_FIELD(c->s.d, ct_device_api, set_matmul_dtype) && c->s.d->set_matmul_dtype) {
        ct_status st = c->s.d->set_matmul_dtype(c->s.dev, CT_BF16);
        if (st != CT_OK && st != CT_ERR_UNSUPPORTED) return failed(c, st, "set_matmul_dtype");
        c->bf16_gemm = st == CT_OK;
        if (c->bf16_gemm && failed(c, c->s.d->set_matmul_dtype(c->s.dev, CT_F32), "set_matmul_dtype")) return CAL_FAIL;
        ct_clear_error();
    }
    if (!c->s.quantp) return 0;
    c->s.qapi = c->s.quantp->info.api;
    ct_clear_error();
    if (c->s.qapi->create(&c->s.quantp->host, c->s.d, c->s.dev, &c->s.quant) != CT_OK) {
        char where[600], key[200];
        c->s.quant = NULL;
        mf_where(mf, session_quant_format_key(&c->s, key, sizeof key), where, sizeof where);
        cal_error(c, "%s: %s", where, ct_last_error());
        return -1;
    }
    return 0;
}

ct_status plan_calibrate(manifest *mf, const char *out_path) {
    cal *c = calloc(1, sizeof *c);
    if (!c) return ct_fail(CT_ERR_NOMEM, "out of memory");
    c->rank = 0, c->size = 1;
    int rc = -1;
    ct_status st = session_open(&c->s, mf, 0, 0); /* prints its own line */
    c->s.mf = NULL;                              /* the caller's: session_close must not free it */
    if (st != CT_OK) {
        rc = st == CT_ERR_INVALID ? -1 : CAL_FAIL;
        goto done;
    }
    if (!(c->ops = calloc(CAL_MAX_OPS, sizeof *c->ops))) {
        cal_error(c, "out of memory");
        rc = CAL_FAIL;
        goto done;
    }
    if ((rc = open_compute(c, mf)) || (mesh_env_world_size() > 1 && (rc = open_comm(c, mf)))) goto done;
    if ((rc = share_work(c, mf, out_path)) || (rc = measure_ops(c)) || (rc = device_rates(c)) ||
        (rc = mem_bandwidth(c)) || (rc = optimizer_rate(c)) || (rc = measure_comms(c)) || (rc = measure_overlap(c)))
        goto done;
    attention_rate(c);
    if (c->rank == 0) rc = write_profile(c, mf, out_path);
done:
    session_close(&c->s);
    /* the line to report, or none (ct_clear_error) when it was printed already */
    if (rc && c->err[0]) ct_set_error("%s", c->err);
    else ct_clear_error();
    st = !rc ? CT_OK : rc == -1 ? CT_ERR_INVALID : CT_ERR_INTERNAL;
    free(c->ops);
    free(c->comms);
    free(c);
    return st;
}
