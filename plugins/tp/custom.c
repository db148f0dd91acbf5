/* custom.c: tensor parallel's custom ops, each a forward and a backward the host records on its
 * tape: the vocabulary-ranged embedding, loss parallel's cross entropy, and async TP's overlapped
 * all-gather + matmul and matmul + reduce-scatter. They call the device and the comm the strategy
 * was given; the time they are blocked in a collective is reported as the tp axis's. Each also has
 * a plan (ABI 2.2), which the planner's builder calls instead of forward: the same output shapes,
 * with the op's GEMM FLOPs, memory traffic and the collectives it runs inside; no device, no comm. */
#define _POSIX_C_SOURCE 199309L /* clock_gettime (ct_util_now) */
#include "tp.h"
#include "ctitan/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TP_PIECES 4 /* matmul pieces per rank block of a chunk, with a poke of the collective in flight after each */

static const char *trace_name(int backward) { return backward ? "tp_comm_bwd" : "tp_comm_fwd"; }

static int64_t numel(const ct_tensor *t) { return ct_tensor_numel(t); }

/* The status of a failed call, with a message when the callee left none. */
static int failed(tp *t, ct_status st, const char *what) {
    if (st == CT_OK) return 0;
    t->host->set_error(t->host, "%s failed (status %d)", what, st);
    return -1;
}

int tp_comm(tp *t, ct_builder *b, int backward, char kind, const float *send, float *recv, int64_t count,
            ct_comm_request **req) {
    const ct_comm_api *c = t->env.capi;
    if (!req) t->host->trace_begin(t->host, trace_name(backward)); /* a started one is waited for later */
    double t0 = ct_util_now();
    ct_status st = kind == 'g'   ? c->all_gather(t->env.comm, t->group, send, recv, count, CT_F32, req)
                   : kind == 's' ? c->reduce_scatter(t->env.comm, t->group, send, recv, count, CT_F32, CT_REDUCE_SUM, req)
                                 : c->all_reduce(t->env.comm, t->group, send, recv, count, CT_F32, CT_REDUCE_SUM, req);
    if (!req) {
        b->account_comm(b, CT_AXIS_TP, ct_util_now() - t0);
        t->host->trace_end(t->host, trace_name(backward));
    }
    return failed(t, st, kind == 'g' ? "tp all-gather" : kind == 's' ? "tp reduce-scatter" : "tp all-reduce");
}

int tp_wait(tp *t, ct_builder *b, int backward, ct_comm_request *req) {
    t->host->trace_begin(t->host, trace_name(backward));
    double t0 = ct_util_now();
    ct_status st = t->env.capi->wait(t->env.comm, req);
    b->account_comm(b, CT_AXIS_TP, ct_util_now() - t0);
    t->host->trace_end(t->host, trace_name(backward));
    return failed(t, st, "tp wait");
}

/* Lets a started collective move while this rank computes (MPI progresses only inside calls). */
static void poke(tp *t, ct_builder *b, ct_comm_request *req) {
    const ct_comm_api *c = t->env.capi;
    if (!req || !CT_HAS_FIELD(c, ct_comm_api, test) || !c->test) return;
    int done = 0;
    t->host->trace_begin(t->host, trace_name(0));
    double t0 = ct_util_now();
    c->test(t->env.comm, req, &done); /* an error here resurfaces at the wait */
    b->account_comm(b, CT_AXIS_TP, ct_util_now() - t0);
    t->host->trace_end(t->host, trace_name(0));
}

/* ---- the vocabulary-ranged embedding: this rank's rows of the table, zeros for the other ids ---- */
typedef struct {
    tp *t;
    int64_t begin;
} ranged_state;

static ct_status embedding_fwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    ranged_state *s = sp;
    const ct_device_api *d = s->t->env.dapi;
    const ct_tensor *ids = in[0], *table = in[1];
    (void)n_in;
    (void)n_out;
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, ids->shape, sizeof shape);
    shape[ids->ndim] = table->shape[1];
    if (!(out[0] = b->new_tensor(b, CT_F32, ids->ndim + 1, shape))) return CT_ERR_NOMEM;
    return d->embedding_forward_general(s->t->env.dev, out[0]->data, ids->data, table->data, numel(ids),
                                        table->shape[1], s->begin, table->shape[0], 0);
}

static ct_status embedding_bwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                               const float *const *dy, int n_out, int halves) {
    ranged_state *s = sp;
    ct_tensor *ids = in[0], *table = in[1];
    (void)n_in;
    (void)out;
    (void)n_out;
    if (!(halves & CT_GRAD_WEIGHT) || !dy[0]) return CT_OK;
    float *g = b->grad(b, table);
    if (!g) return CT_ERR_NOMEM;
    return s->t->env.dapi->embedding_backward_general(s->t->env.dev, g, ids->data, dy[0], numel(ids), table->shape[1],
                                                      s->begin, table->shape[0], 0);
}

/* The GEMM dtype of a matmul the device runs for the strategy: the host rounds every matmul's
 * operands to bf16 under training.mixed_precision_param: bfloat16. */
static int gemm_dtype(const tp *t) { return t->env.bf16_compute ? CT_BF16 : CT_F32; }

/* Adds a collective a custom op runs inside, over the tp axis (bytes: the whole f32 buffer). */
static void plan_comm(ct_op_cost *c, int kind, int phase, int overlapped, int64_t elems, int calls) {
    if (c->n_comm >= (int)(sizeof c->comm / sizeof c->comm[0])) return;
    c->comm[c->n_comm++] = (ct_op_comm){CT_AXIS_TP, kind, phase, overlapped, (double)elems * sizeof(float), calls};
}

/* The planner's forward: out (ids' shape, dim) as embedding_fwd makes it. Traffic: the ids read,
 * every output row written (zeros outside the range), this rank's share of the rows read from the
 * table (ids spread over the vocabulary: 1/size of them fall in range); backward adds the in-range
 * rows of dy into the table's gradient (read dy, read and write the gradient row). */
static ct_status embedding_plan(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                                ct_op_cost *cost) {
    const tp *t = ((ranged_state *)sp)->t;
    const ct_tensor *ids = in[0], *table = in[1];
    (void)n_in;
    (void)n_out;
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, ids->shape, sizeof shape);
    shape[ids->ndim] = table->shape[1];
    if (!(out[0] = b->new_tensor(b, CT_F32, ids->ndim + 1, shape))) return CT_ERR_NOMEM;
    double n = (double)numel(ids), row = (double)table->shape[1] * sizeof(float), hits = n / t->size;
    cost->matmul_dtype = CT_F32;
    cost->bytes[0] = n * sizeof(int32_t) + n * row + hits * row;
    cost->bytes[1] = n * sizeof(int32_t) + hits * row * 3;
    return CT_OK;
}

static const ct_custom_op embedding_op = {sizeof(ct_custom_op), "tp.embedding", embedding_fwd, embedding_bwd,
                                          embedding_plan};

ct_tensor *tp_embedding_ranged(tp *t, ct_builder *b, const ct_tensor *ids, ct_tensor *table) {
    const ct_device_api *d = t->env.dapi; /* NULL on a planning instance: only shapes then */
    if (!ids || ids->dtype != CT_I32 || ids->ndim >= CT_MAX_DIMS || !table || table->ndim != 2) {
        t->host->set_error(t->host, "embedding: expects int32 ids and a (vocab, dim) f32 table");
        return NULL;
    }
    if (!tp_planning(b) && (!CT_HAS_FIELD(d, ct_device_api, embedding_backward_general) ||
                            !d->embedding_forward_general || !d->embedding_backward_general)) {
        t->host->set_error(t->host, "tensor parallel: the device lacks the ranged embedding ops");
        return NULL;
    }
    ranged_state s = {t, table->shape[0] * t->rank};
    ct_tensor *in[2] = {(ct_tensor *)ids, table}, *out[1] = {NULL};
    return b->custom(b, &embedding_op, &s, sizeof s, in, 2, out, 1) == CT_OK ? out[0] : NULL;
}

/* ---- loss parallel: cross entropy on vocabulary-sharded logits ----
 * Each rank's per-row (max, sum of exp, target logit) are gathered and merged into the whole row's
 * log-sum-exp; the logits never move. */
typedef struct {
    tp *t;
    int64_t begin;
    ct_tensor *lse;
} ce_state;

/* Merges every rank's stats (host, rank-major) into lse (host) and the summed loss. */
static int ce_merge(tp *t, const float *stats, const int32_t *tg, int64_t n, int64_t vfull, float *lse, double *sum) {
    *sum = 0;
    for (int64_t i = 0; i < n; i++) {
        double mx = -INFINITY, s = 0, tl = 0;
        for (int64_t p = 0; p < t->size; p++) mx = fmax(mx, stats[(p * n + i) * 3]);
        for (int64_t p = 0; p < t->size; p++) {
            const float *st = stats + (p * n + i) * 3;
            s += st[1] * exp(st[0] - mx);
            tl += st[2];
        }
        lse[i] = (float)(mx + log(s));
        if (tg[i] == CT_IGNORE_INDEX) continue;
        if (tg[i] < 0 || tg[i] >= vfull) {
            t->host->set_error(t->host, "cross_entropy: target %d outside the vocabulary [0, %lld)", tg[i], (long long)vfull);
            return -1;
        }
        *sum += (double)lse[i] - tl;
    }
    return 0;
}

/* Every rank's stats (3 per row, on the device) into s->lse and the summed loss (out). */
static int ce_finish(ce_state *s, ct_builder *b, ct_tensor *stats, const ct_tensor *targets, int64_t n, int64_t v,
                     ct_tensor *loss) {
    tp *t = s->t;
    const ct_device_api *d = t->env.dapi;
    ct_device *dev = t->env.dev;
    float *all = b->scratch(b, sizeof(float) * (size_t)(3 * n * t->size));
    float *host = malloc(sizeof(float) * (size_t)(3 * n * t->size + n + 1));
    int32_t *tg = malloc(sizeof(int32_t) * (size_t)(n + 1));
    double sum = 0;
    int bad = !all || !host || !tg;
    bad = bad || tp_comm(t, b, 0, 'g', stats->data, all, 3 * n, NULL);
    bad = bad || failed(t, d->copy(dev, host, all, sizeof(float) * (size_t)(3 * n * t->size), CT_COPY_D2H), "copy") ||
          failed(t, d->copy(dev, tg, targets->data, sizeof(int32_t) * (size_t)n, CT_COPY_D2H), "copy");
    float *l = host ? host + 3 * n * t->size : NULL;
    bad = bad || ce_merge(t, host, tg, n, v * t->size, l, &sum);
    float fsum = (float)sum;
    bad = bad || failed(t, d->copy(dev, s->lse->data, l, sizeof(float) * (size_t)n, CT_COPY_H2D), "copy") ||
          failed(t, d->copy(dev, loss->data, &fsum, sizeof fsum, CT_COPY_H2D), "copy");
    free(host);
    free(tg);
    return bad;
}

static ct_status ce_fwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    ce_state *s = sp;
    tp *t = s->t;
    ct_tensor *logits = in[0], *targets = in[1];
    (void)n_in;
    (void)n_out;
    int64_t v = logits->shape[logits->ndim - 1], n = numel(logits) / v, three = 3 * n;
    ct_tensor *stats = b->new_tensor(b, CT_F32, 1, &three);
    s->lse = b->new_tensor(b, CT_F32, 1, &n);
    out[0] = b->new_tensor(b, CT_F32, 0, NULL);
    int bad = !stats || !s->lse || !out[0];
    bad = bad || failed(t, t->env.dapi->cross_entropy_stats(t->env.dev, stats->data, logits->data, targets->data, n, v,
                                                            s->begin, CT_IGNORE_INDEX),
                        "loss parallel: cross_entropy_stats");
    bad = bad || ce_finish(s, b, stats, targets, n, v, out[0]);
    return bad ? CT_ERR_INVALID : CT_OK;
}

static ct_status ce_bwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                        const float *const *dy, int n_out, int halves) {
    ce_state *s = sp;
    const ct_device_api *d = s->t->env.dapi;
    ct_tensor *logits = in[0], *targets = in[1];
    (void)n_in;
    (void)out;
    (void)n_out;
    if (!(halves & CT_GRAD_INPUT) || !dy[0]) return CT_OK;
    int64_t v = logits->shape[logits->ndim - 1], n = numel(logits) / v;
    float dloss, *g = b->grad(b, logits);
    if (!g) return CT_ERR_NOMEM;
    ct_status st = d->copy(s->t->env.dev, &dloss, dy[0], sizeof dloss, CT_COPY_D2H);
    if (st != CT_OK) return st;
    return d->cross_entropy_backward_general(s->t->env.dev, g, logits->data, targets->data, s->lse->data, dloss, NULL,
                                             n, v, s->begin, CT_IGNORE_INDEX);
}

/* The planner's forward: the scalar loss, and the per-row stats (3 per row) and log-sum-exp that
 * ce_fwd keeps on the tape. Forward reads this rank's logits once (the device's stats pass) and
 * all-gathers every rank's stats (3 f32 per row per rank), then moves them to the host and the lse
 * back; backward reads the logits and the lse and accumulates into the logits' gradient. */
static ct_status ce_plan(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                         ct_op_cost *cost) {
    const tp *t = ((ce_state *)sp)->t;
    const ct_tensor *logits = in[0];
    (void)n_in;
    (void)n_out;
    int64_t v = logits->shape[logits->ndim - 1], n = numel(logits) / v, three = 3 * n;
    if (!b->new_tensor(b, CT_F32, 1, &three) || !b->new_tensor(b, CT_F32, 1, &n) ||
        !(out[0] = b->new_tensor(b, CT_F32, 0, NULL)) ||
        !b->scratch(b, sizeof(float) * (size_t)(3 * n * t->size))) /* ce_finish's gathered stats */
        return CT_ERR_NOMEM;
    double f = sizeof(float), rows = (double)n, all = 3.0 * rows * t->size;
    cost->matmul_dtype = CT_F32;
    cost->bytes[0] = rows * (double)v * f + rows * sizeof(int32_t) + 3 * rows * f + all * f * 2 + 2 * rows * f;
    cost->bytes[1] = 3 * rows * (double)v * f + rows * sizeof(int32_t) + rows * f;
    plan_comm(cost, CT_COLL_ALL_GATHER, CT_PHASE_FORWARD, 0, 3 * n * t->size, 1);
    return CT_OK;
}

static const ct_custom_op ce_op = {sizeof(ct_custom_op), "tp.cross_entropy", ce_fwd, ce_bwd, ce_plan};

ct_tensor *tp_cross_entropy_sharded(tp *t, ct_builder *b, ct_tensor *logits, const ct_tensor *targets) {
    const ct_device_api *d = t->env.dapi; /* NULL on a planning instance: only shapes then */
    if (!tp_planning(b) && (!d->cross_entropy_stats || !CT_HAS_FIELD(d, ct_device_api, cross_entropy_backward_general) ||
                            !d->cross_entropy_backward_general)) {
        t->host->set_error(t->host, "loss parallel: the device lacks cross_entropy_stats; set "
                                    "parallelism.disable_loss_parallel");
        return NULL;
    }
    int64_t v = logits->shape[logits->ndim - 1];
    if (logits->dtype != CT_F32 || !targets || targets->dtype != CT_I32 || numel(targets) != numel(logits) / v) {
        t->host->set_error(t->host, "cross_entropy: targets must be int32 with one value per row of logits");
        return NULL;
    }
    ce_state s = {t, v * t->rank, NULL};
    ct_tensor *in[2] = {logits, (ct_tensor *)targets}, *out[1] = {NULL};
    return b->custom(b, &ce_op, &s, sizeof s, in, 2, out, 1) == CT_OK ? out[0] : NULL;
}

/* ---- loss parallel over the output head itself (ABI 2.5's linear_cross_entropy) ----
 * in: X (n, k) with every token row, this rank's vocabulary rows of the weight (v, k), targets.
 * The logits of a block of rows at a time: forward each block's stats, then the same merge as
 * above; backward each block's logits again, their gradient against the whole row's lse, and from
 * it X's and the weight's. (rows x v) floats twice are the most it holds, not (n x v) and their
 * gradient. Blocks as the host's: a block's logits at most half of X's bytes. */
static int64_t xent_rows(int64_t n, int64_t k, int64_t v) {
    int64_t r = (n * k + 2 * v - 1) / (2 * v);
    return r < 1 ? 1 : r > n ? n : r;
}

/* Forward's blocks are half as tall: its logits block is held by the custom ops' pool all step,
 * while backward's two come from the unit's backward region (ABI 2.7). Each row's logits and
 * statistics are its own, so the height does not change what forward computes (bit for bit on
 * the CPU plugin). */
static int64_t xent_fwd_rows(int64_t n, int64_t k, int64_t v) {
    int64_t r = xent_rows(n, k, v) / 2;
    return r < 1 ? 1 : r;
}

static ct_status lxe_fwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    ce_state *s = sp;
    tp *t = s->t;
    const ct_device_api *d = t->env.dapi;
    ct_tensor *X = in[0], *w = in[1], *targets = in[2];
    (void)n_in;
    (void)n_out;
    int64_t k = w->shape[1], v = w->shape[0], n = numel(X) / k, three = 3 * n, rows = xent_fwd_rows(n, k, v);
    ct_tensor *stats = b->new_tensor(b, CT_F32, 1, &three);
    s->lse = b->new_tensor(b, CT_F32, 1, &n);
    out[0] = b->new_tensor(b, CT_F32, 0, NULL);
    float *logits = b->scratch(b, sizeof(float) * (size_t)(rows * v));
    int bad = !stats || !s->lse || !out[0] || !logits;
    for (int64_t r0 = 0; r0 < n && !bad; r0 += rows) {
        int64_t nr = n - r0 < rows ? n - r0 : rows;
        bad = failed(t, d->matmul(t->env.dev, logits, (const float *)X->data + r0 * k, w->data, nr, v, k, 0, 1, 1.0f, 0.0f),
                     "loss parallel: matmul") ||
              failed(t, d->cross_entropy_stats(t->env.dev, (float *)stats->data + 3 * r0, logits,
                                               (const int32_t *)targets->data + r0, nr, v, s->begin, CT_IGNORE_INDEX),
                     "loss parallel: cross_entropy_stats");
    }
    bad = bad || ce_finish(s, b, stats, targets, n, v, out[0]);
    return bad ? CT_ERR_INVALID : CT_OK;
}

static ct_status lxe_bwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                         const float *const *dy, int n_out, int halves) {
    ce_state *s = sp;
    tp *t = s->t;
    const ct_device_api *d = t->env.dapi;
    ct_device *dev = t->env.dev;
    ct_tensor *X = in[0], *w = in[1], *targets = in[2];
    (void)n_in;
    (void)out;
    (void)n_out;
    if (!dy[0]) return CT_OK;
    int64_t k = w->shape[1], v = w->shape[0], n = numel(X) / k, rows = xent_rows(n, k, v);
    float dloss, *gx = (halves & CT_GRAD_INPUT) ? b->grad(b, X) : NULL, *gw = (halves & CT_GRAD_WEIGHT) ? b->grad(b, w) : NULL;
    if (((halves & CT_GRAD_INPUT) && !gx) || ((halves & CT_GRAD_WEIGHT) && !gw)) return CT_ERR_NOMEM;
    if (!gx && !gw) return CT_OK;
    /* a block's logits and their gradient, in one piece: from the unit's backward region where the
     * host has one (ABI 2.7), so they share memory with the other units' backward temporaries */
    size_t two = sizeof(float) * (size_t)(2 * rows * v);
    float *logits = CT_HAS_FIELD(b, ct_builder, backward_scratch) && b->backward_scratch ? b->backward_scratch(b, two)
                                                                                         : b->scratch(b, two);
    float *dl = logits ? logits + rows * v : NULL;
    if (!logits) return CT_ERR_NOMEM;
    int bad = failed(t, d->copy(dev, &dloss, dy[0], sizeof dloss, CT_COPY_D2H), "copy");
    for (int64_t r0 = 0; r0 < n && !bad; r0 += rows) {
        int64_t nr = n - r0 < rows ? n - r0 : rows;
        const float *xr = (const float *)X->data + r0 * k;
        bad = failed(t, d->matmul(dev, logits, xr, w->data, nr, v, k, 0, 1, 1.0f, 0.0f), "loss parallel: matmul") ||
              failed(t, d->zero(dev, dl, sizeof(float) * (size_t)(nr * v)), "zero") ||
              failed(t, d->cross_entropy_backward_general(dev, dl, logits, (const int32_t *)targets->data + r0,
                                                          (const float *)s->lse->data + r0, dloss, NULL, nr, v,
                                                          s->begin, CT_IGNORE_INDEX),
                     "loss parallel: cross_entropy_backward_general") ||
              (gx && failed(t, d->matmul(dev, gx + r0 * k, dl, w->data, nr, k, v, 0, 0, 1.0f, 1.0f), "matmul")) ||
              (gw && failed(t, d->matmul(dev, gw, dl, xr, v, k, nr, 1, 0, 1.0f, 1.0f), "matmul"));
    }
    return bad ? CT_ERR_INVALID : CT_OK;
}

/* The planner's forward: ce_plan's outputs and traffic over blocks, and the GEMM three times over
 * (forward; backward's logits again, dX and dW). */
static ct_status lxe_plan(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                          ct_op_cost *cost) {
    const tp *t = ((ce_state *)sp)->t;
    const ct_tensor *X = in[0], *w = in[1];
    (void)n_in;
    (void)n_out;
    int64_t k = w->shape[1], v = w->shape[0], n = numel(X) / k, three = 3 * n, rows = xent_rows(n, k, v);
    /* forward's scratch, as lxe_fwd and ce_finish take it; backward's (logits and their gradient) apart */
    int bwd_apart = CT_HAS_FIELD(b, ct_builder, backward_scratch) && b->backward_scratch;
    if (!b->new_tensor(b, CT_F32, 1, &three) || !b->new_tensor(b, CT_F32, 1, &n) ||
        !(out[0] = b->new_tensor(b, CT_F32, 0, NULL)) ||
        !b->scratch(b, sizeof(float) * (size_t)(bwd_apart ? xent_fwd_rows(n, k, v) * v : 2 * rows * v)) ||
        (bwd_apart && !b->scratch(b, sizeof(float) * (size_t)(3 * n * t->size))))
        return CT_ERR_NOMEM;
    if (bwd_apart) cost->backward_scratch = (double)sizeof(float) * 2.0 * (double)rows * (double)v;
    double f = sizeof(float), rows_d = (double)n, all = 3.0 * rows_d * t->size, gemm = 2.0 * (double)n * (double)k * (double)v;
    cost->matmul_dtype = gemm_dtype(t);
    cost->matmul_flops[0] = gemm;
    cost->matmul_flops[1] = 3 * gemm;
    cost->bytes[0] = rows_d * (double)v * f + rows_d * sizeof(int32_t) + 3 * rows_d * f + all * f * 2 + 2 * rows_d * f;
    cost->bytes[1] = 4 * rows_d * (double)v * f + rows_d * sizeof(int32_t) + rows_d * f;
    plan_comm(cost, CT_COLL_ALL_GATHER, CT_PHASE_FORWARD, 0, 3 * n * t->size, 1);
    return CT_OK;
}

static const ct_custom_op lxe_op = {sizeof(ct_custom_op), "tp.linear_cross_entropy", lxe_fwd, lxe_bwd, lxe_plan};

ct_tensor *tp_linear_cross_entropy_sharded(tp *t, ct_builder *b, ct_tensor *X, ct_tensor *w, const ct_tensor *targets) {
    const ct_device_api *d = t->env.dapi; /* NULL on a planning instance: only shapes then */
    if (!tp_planning(b) && (!d->cross_entropy_stats || !CT_HAS_FIELD(d, ct_device_api, cross_entropy_backward_general) ||
                            !d->cross_entropy_backward_general || !d->zero)) {
        t->host->set_error(t->host, "loss parallel: the device lacks cross_entropy_stats; set "
                                    "parallelism.disable_loss_parallel");
        return NULL;
    }
    int64_t k = w->shape[w->ndim - 1];
    if (X->dtype != CT_F32 || w->ndim != 2 || X->shape[X->ndim - 1] != k || !targets || targets->dtype != CT_I32 ||
        numel(targets) != numel(X) / k) {
        t->host->set_error(t->host, "linear_cross_entropy: x (..., in), w (V, in) and int32 targets, one per row of x");
        return NULL;
    }
    ce_state s = {t, w->shape[0] * t->rank, NULL};
    ct_tensor *in[3] = {X, w, (ct_tensor *)targets}, *out[1] = {NULL};
    return b->custom(b, &lxe_op, &s, sizeof s, in, 3, out, 1) == CT_OK ? out[0] : NULL;
}

/* ---- async TP, column-wise: out = (y, x with every row) ---- */
typedef struct {
    tp *t;
} async_state;

/* Chunks of at most rc rows over nl rows: how many, and rc. */
static int64_t chunking(const tp *t, int64_t nl, int64_t *rc) {
    int64_t chunks = t->async_chunks < nl ? t->async_chunks : nl;
    *rc = (nl + chunks - 1) / chunks;
    return (nl + *rc - 1) / *rc;
}

/* Chunk i of x's rows arrived in buf (rank-major): copied into its place in X, multiplied in pieces,
 * the next chunk's gather poked between them. */
static int gl_chunk(tp *t, ct_builder *b, const float *buf, int64_t r0, int64_t cnt, int64_t nl, int64_t in,
                    int64_t outf, const ct_tensor *w, float *Xd, float *Yd, ct_comm_request *next) {
    const ct_device_api *d = t->env.dapi;
    ct_device *dev = t->env.dev;
    for (int64_t p = 0; p < t->size; p++) {
        int64_t row = p * nl + r0;
        if (failed(t, d->copy(dev, Xd + row * in, buf + p * cnt * in, sizeof(float) * (size_t)(cnt * in), CT_COPY_D2D),
                   "copy"))
            return -1;
        for (int64_t q = 0; q < TP_PIECES; q++) {
            int64_t a = cnt * q / TP_PIECES, z = cnt * (q + 1) / TP_PIECES;
            if (z > a && failed(t, d->matmul(dev, Yd + (row + a) * outf, Xd + (row + a) * in, w->data, z - a, outf, in, 0,
                                             1, 1.0f, 0.0f), "matmul"))
                return -1;
            poke(t, b, next);
        }
    }
    return 0;
}

static ct_status gl_fwd(ct_builder *b, void *sp, ct_tensor *const *in_t, int n_in, ct_tensor **out, int n_out) {
    tp *t = ((async_state *)sp)->t;
    ct_tensor *x = in_t[0], *w = in_t[1];
    (void)n_in;
    (void)n_out;
    int64_t in = w->shape[1], outf = w->shape[0], nl = numel(x) / in, rc, shape[CT_MAX_DIMS];
    int64_t chunks = chunking(t, nl, &rc);
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 2] *= t->size;
    ct_tensor *X = b->new_tensor(b, CT_F32, x->ndim, shape);
    shape[x->ndim - 1] = outf;
    ct_tensor *Y = b->new_tensor(b, CT_F32, x->ndim, shape);
    float *buf[2] = {b->scratch(b, sizeof(float) * (size_t)(t->size * rc * in)),
                     b->scratch(b, sizeof(float) * (size_t)(t->size * rc * in))};
    if (!X || !Y || !buf[0] || !buf[1]) return CT_ERR_NOMEM;
    const float *xd = x->data;
    ct_comm_request *req[2] = {NULL, NULL};
    if (tp_comm(t, b, 0, 'g', xd, buf[0], (rc < nl ? rc : nl) * in, &req[0])) return CT_ERR_INTERNAL;
    for (int64_t i = 0; i < chunks; i++) {
        int64_t r0 = i * rc, cnt = nl - r0 < rc ? nl - r0 : rc;
        if (i + 1 < chunks) { /* the next chunk's gather runs while this one multiplies */
            int64_t r1 = (i + 1) * rc, c1 = nl - r1 < rc ? nl - r1 : rc;
            if (tp_comm(t, b, 0, 'g', xd + r1 * in, buf[(i + 1) % 2], c1 * in, &req[(i + 1) % 2])) return CT_ERR_INTERNAL;
        }
        if (tp_wait(t, b, 0, req[i % 2])) return CT_ERR_INTERNAL;
        ct_comm_request *next = i + 1 < chunks ? req[(i + 1) % 2] : NULL;
        if (gl_chunk(t, b, buf[i % 2], r0, cnt, nl, in, outf, w, X->data, Y->data, next)) return CT_ERR_INTERNAL;
    }
    out[0] = Y;
    out[1] = X;
    return CT_OK;
}

/* dX (every row: from this op's y and from the other linears that read X) is reduce-scattered
 * onto x's rows; dw from dy and X. */
static ct_status gl_bwd(ct_builder *b, void *sp, ct_tensor *const *in_t, int n_in, ct_tensor *const *out,
                        const float *const *dy, int n_out, int halves) {
    tp *t = ((async_state *)sp)->t;
    const ct_device_api *d = t->env.dapi;
    ct_device *dev = t->env.dev;
    ct_tensor *x = in_t[0], *w = in_t[1], *X = out[1];
    (void)n_in;
    (void)n_out;
    int64_t k = w->shape[1], m = w->shape[0], n = numel(X) / k, nx = numel(x);
    if (halves & CT_GRAD_INPUT) {
        float *gX = b->grad(b, X), *gx = b->grad(b, x), *tmp = b->scratch(b, sizeof(float) * (size_t)nx);
        if (!gX || !gx || !tmp) return CT_ERR_NOMEM;
        if (dy[0] && failed(t, d->matmul(dev, gX, dy[0], w->data, n, k, m, 0, 0, 1.0f, 1.0f), "matmul")) return CT_ERR_INTERNAL;
        if (tp_comm(t, b, 1, 's', gX, tmp, nx, NULL) || failed(t, d->axpy(dev, gx, tmp, 1.0f, nx), "axpy"))
            return CT_ERR_INTERNAL;
    }
    if ((halves & CT_GRAD_WEIGHT) && dy[0]) {
        float *gw = b->grad(b, w);
        if (!gw) return CT_ERR_NOMEM;
        return d->matmul(dev, gw, dy[0], X->data, m, k, n, 1, 0, 1.0f, 1.0f);
    }
    return CT_OK;
}

/* The planner's forward: (y, X) as gl_fwd makes them, X holding every rank's rows. GEMMs: y = X w^T
 * (m = X's rows, k = in, n = out) forward; dX = dy w and dw = dy^T X backward. Forward all-gathers x in
 * chunks beside the matmuls (overlapped) and copies each chunk into X; backward reduce-scatters dX
 * in one blocking call and adds the result into x's gradient. */
static ct_status gl_plan(ct_builder *b, void *sp, ct_tensor *const *in_t, int n_in, ct_tensor **out, int n_out,
                         ct_op_cost *cost) {
    const tp *t = ((async_state *)sp)->t;
    const ct_tensor *x = in_t[0], *w = in_t[1];
    (void)n_in;
    (void)n_out;
    int64_t in = w->shape[1], outf = w->shape[0], shape[CT_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 2] *= t->size;
    ct_tensor *X = b->new_tensor(b, CT_F32, x->ndim, shape);
    shape[x->ndim - 1] = outf;
    ct_tensor *Y = b->new_tensor(b, CT_F32, x->ndim, shape);
    if (!X || !Y) return CT_ERR_NOMEM;
    int64_t nX = numel(X), nx = numel(x);
    double m = (double)(nX / in), gemm = 2.0 * m * (double)in * (double)outf;
    cost->matmul_flops[0] = gemm;
    cost->matmul_flops[1] = 2 * gemm;
    cost->matmul_dtype = gemm_dtype(t);
    cost->bytes[0] = 2.0 * (double)nX * sizeof(float);       /* each gathered chunk copied into X */
    cost->bytes[1] = 3.0 * (double)nx * sizeof(float);       /* gx += the reduced block */
    int64_t rc;
    plan_comm(cost, CT_COLL_ALL_GATHER, CT_PHASE_FORWARD, 1, nX, (int)chunking(t, nx / in, &rc));
    plan_comm(cost, CT_COLL_REDUCE_SCATTER, CT_PHASE_BACKWARD, 0, nX, 1);
    out[0] = Y;
    out[1] = X;
    return CT_OK;
}

static const ct_custom_op gather_linear_op = {sizeof(ct_custom_op), "tp.all_gather_matmul", gl_fwd, gl_bwd, gl_plan};

ct_tensor *tp_gather_linear(tp *t, ct_builder *b, ct_tensor *x, ct_tensor *w, ct_tensor **gathered) {
    if (x->ndim < 2 || w->ndim != 2 || x->shape[x->ndim - 1] != w->shape[1]) {
        t->host->set_error(t->host, "async tensor parallel: x does not match the column-wise weight %s", w->name);
        return NULL;
    }
    async_state s = {t};
    ct_tensor *in[2] = {x, w}, *out[2] = {NULL, NULL};
    if (b->custom(b, &gather_linear_op, &s, sizeof s, in, 2, out, 2) != CT_OK) return NULL;
    *gathered = out[1];
    return out[0];
}

/* ---- async TP, row-wise: out = (y with this rank's rows, the partial sums P in send order) ---- */
static int rs_chunk(tp *t, ct_builder *b, const float *xd, const ct_tensor *w, float *send, int64_t r0, int64_t cnt,
                    int64_t nl, int64_t in, int64_t outf, ct_comm_request *prev) {
    const ct_device_api *d = t->env.dapi;
    for (int64_t p = 0; p < t->size; p++)
        for (int64_t q = 0; q < TP_PIECES; q++) { /* poke the previous reduce-scatter between pieces */
            int64_t a = cnt * q / TP_PIECES, z = cnt * (q + 1) / TP_PIECES;
            if (z > a && failed(t, d->matmul(t->env.dev, send + (p * cnt + a) * outf, xd + (p * nl + r0 + a) * in, w->data,
                                             z - a, outf, in, 0, 1, 1.0f, 0.0f), "matmul"))
                return -1;
            poke(t, b, prev);
        }
    return 0;
}

static ct_status rs_fwd(ct_builder *b, void *sp, ct_tensor *const *in_t, int n_in, ct_tensor **out, int n_out) {
    tp *t = ((async_state *)sp)->t;
    ct_tensor *x = in_t[0], *w = in_t[1];
    (void)n_in;
    (void)n_out;
    int64_t in = w->shape[1], outf = w->shape[0], n = numel(x) / in, rows = x->shape[x->ndim - 2], shape[CT_MAX_DIMS];
    if (n % t->size || rows % t->size) {
        t->host->set_error(t->host, "async tensor parallel: %lld token rows do not split in %d", (long long)n, t->size);
        return CT_ERR_INVALID;
    }
    int64_t nl = n / t->size, rc, chunks = chunking(t, nl, &rc);
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = outf;
    ct_tensor *P = b->new_tensor(b, CT_F32, x->ndim, shape); /* partial sums, chunk-major */
    shape[x->ndim - 2] = rows / t->size;
    ct_tensor *y = b->new_tensor(b, CT_F32, x->ndim, shape);
    ct_comm_request **req = calloc((size_t)chunks, sizeof *req);
    int bad = !P || !y || !req;
    int64_t posted = 0;
    for (int64_t i = 0; i < chunks && !bad; i++) {
        int64_t r0 = i * rc, cnt = nl - r0 < rc ? nl - r0 : rc;
        float *send = (float *)P->data + t->size * r0 * outf; /* chunk i: (tp, cnt, out), block p for rank p */
        bad = rs_chunk(t, b, x->data, w, send, r0, cnt, nl, in, outf, i > 0 ? req[i - 1] : NULL) ||
              tp_comm(t, b, 0, 's', send, (float *)y->data + r0 * outf, cnt * outf, &req[i]);
        if (!bad) posted = i + 1;
    }
    for (int64_t i = 0; i < posted; i++) bad |= tp_wait(t, b, 0, req[i]) != 0;
    free(req);
    if (bad) return CT_ERR_INTERNAL;
    out[0] = y;
    out[1] = P;
    return CT_OK;
}

/* dP (every rank's rows, in x's row order) is the all-gather of dy; dx and dw from it. */
static ct_status rs_bwd(ct_builder *b, void *sp, ct_tensor *const *in_t, int n_in, ct_tensor *const *out,
                        const float *const *dy, int n_out, int halves) {
    tp *t = ((async_state *)sp)->t;
    const ct_device_api *d = t->env.dapi;
    ct_device *dev = t->env.dev;
    ct_tensor *x = in_t[0], *w = in_t[1], *P = out[1];
    (void)n_in;
    (void)n_out;
    int64_t k = w->shape[1], m = w->shape[0], n = numel(x) / k, np = numel(P);
    const float *gP = dy[1];
    if ((halves & CT_GRAD_INPUT) && dy[0]) {
        float *g = b->grad(b, P), *gx = b->grad(b, x), *tmp = b->scratch(b, sizeof(float) * (size_t)np);
        if (!g || !gx || !tmp) return CT_ERR_NOMEM;
        if (tp_comm(t, b, 1, 'g', dy[0], tmp, numel(out[0]), NULL) || failed(t, d->axpy(dev, g, tmp, 1.0f, np), "axpy") ||
            failed(t, d->matmul(dev, gx, g, w->data, n, k, m, 0, 0, 1.0f, 1.0f), "matmul"))
            return CT_ERR_INTERNAL;
        gP = g;
    }
    if ((halves & CT_GRAD_WEIGHT) && gP) {
        float *gw = b->grad(b, w);
        if (!gw) return CT_ERR_NOMEM;
        return d->matmul(dev, gw, gP, x->data, m, k, n, 1, 0, 1.0f, 1.0f);
    }
    return CT_OK;
}

/* The planner's forward: (y with this rank's rows, P every row's partial sums) as rs_fwd makes them.
 * GEMMs: P = x w^T (m = x's rows, k = in, n = out) forward; dx = dP w and dw = dP^T x backward.
 * Forward reduce-scatters P in chunks beside the matmuls (overlapped); backward all-gathers dy in
 * one blocking call and adds it into P's gradient. */
static ct_status rs_plan(ct_builder *b, void *sp, ct_tensor *const *in_t, int n_in, ct_tensor **out, int n_out,
                         ct_op_cost *cost) {
    const tp *t = ((async_state *)sp)->t;
    const ct_tensor *x = in_t[0], *w = in_t[1];
    (void)n_in;
    (void)n_out;
    int64_t in = w->shape[1], outf = w->shape[0], n = numel(x) / in, rows = x->shape[x->ndim - 2], shape[CT_MAX_DIMS];
    if (n % t->size || rows % t->size) {
        t->host->set_error(t->host, "async tensor parallel: %lld token rows do not split in %d", (long long)n, t->size);
        return CT_ERR_INVALID;
    }
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = outf;
    ct_tensor *P = b->new_tensor(b, CT_F32, x->ndim, shape);
    shape[x->ndim - 2] = rows / t->size;
    ct_tensor *y = b->new_tensor(b, CT_F32, x->ndim, shape);
    if (!P || !y) return CT_ERR_NOMEM;
    int64_t np = numel(P);
    double gemm = 2.0 * (double)n * (double)in * (double)outf;
    cost->matmul_flops[0] = gemm;
    cost->matmul_flops[1] = 2 * gemm;
    cost->matmul_dtype = gemm_dtype(t);
    cost->bytes[1] = 3.0 * (double)np * sizeof(float); /* gP += the gathered dy */
    int64_t rc;
    plan_comm(cost, CT_COLL_REDUCE_SCATTER, CT_PHASE_FORWARD, 1, np, (int)chunking(t, n / t->size, &rc));
    plan_comm(cost, CT_COLL_ALL_GATHER, CT_PHASE_BACKWARD, 0, np, 1);
    out[0] = y;
    out[1] = P;
    return CT_OK;
}

static const ct_custom_op linear_rs_op = {sizeof(ct_custom_op), "tp.matmul_reduce_scatter", rs_fwd, rs_bwd, rs_plan};

ct_tensor *tp_linear_reduce_scatter(tp *t, ct_builder *b, ct_tensor *x, ct_tensor *w) {
    if (x->ndim < 2 || w->ndim != 2 || x->shape[x->ndim - 1] != w->shape[1]) {
        t->host->set_error(t->host, "async tensor parallel: x does not match the row-wise weight %s", w->name);
        return NULL;
    }
    async_state s = {t};
    ct_tensor *in[2] = {x, w}, *out[2] = {NULL, NULL};
    return b->custom(b, &linear_rs_op, &s, sizeof s, in, 2, out, 2) == CT_OK ? out[0] : NULL;
}
