/* moe.c: the builder's mixture-of-experts ops (ABI 2.15: moe, moe_experts) and the auxiliary-loss
 * channel (aux_loss), written as the tape's custom ops over the device's 2.14 MoE ops.
 *
 * One layer on n tokens of width d, e experts, k per token:
 *   logits (n,e) = linear(x, router)                  the builder's own linear (a strategy sees it)
 *   route:    scores (n,e), weights (n,k), idx (n,k)  moe_scores + moe_topk
 *   dispatch: xs (n*k,d) in expert order, order/inv (n*k), offsets (e+1)   moe_permute + moe_gather
 *   ys (n*k,d) = moe_experts(xs, offsets, w1, w3, w2) grouped GEMMs and the builder's swiglu
 *   out (n,d) = combine(ys, weights, inv)
 *   balance:  the Switch load-balancing loss from scores and offsets, through aux_loss
 * Nothing is read back to the host: per-expert counts come from the offsets on the device (a grouped
 * GEMM of ones over the segments), and the aux loss's value is summed on the device and read once
 * per step (runtime_take_aux).
 */
#include "host/host.h"
#include "engine/moe.h"
#include "engine/mesh.h"
#include "engine/tape.h"
#include "host/trace.h"
#include "base/util.h"

#include <stdlib.h>
#include <string.h>

/* The loss scale of the microbatch being run, the aux-loss sum over the step's microbatches, ones for
 * the count GEMMs, and each moe call site's per-expert counts, all in device memory. */
typedef struct moe_site {
    char *router;   /* the call's router weight name */
    int64_t e;
    float *counts;  /* (e) */
} moe_site;

struct rt_moe {
    float *scalars;  /* [0] the loss scale, [1] the aux-loss sum */
    float *ones;
    int64_t n_ones;
    moe_site *sites;
    int n_sites;
    ct_moe_load *loads; /* for post_step */
};

#define RT(b) ((runtime *)(b)->ctx)

static ct_status check(ct_status st, const char *what) {
    if (st != CT_OK && !ct_last_error()[0]) ct_set_error("device op %s failed (status %d)", what, st);
    return st;
}

/* The runtime's MoE state, made on first use (the loss scale copied in). NULL with the error set. */
static struct rt_moe *moe_state(runtime *rt) {
    if (rt->moe) return rt->moe;
    struct rt_moe *m = calloc(1, sizeof *m);
    void *p = NULL;
    if (!m || rt->d->alloc(rt->dev, 64, &p) != CT_OK) {
        free(m);
        ct_set_error("out of memory for the MoE state");
        return NULL;
    }
    m->scalars = p;
    float init[2] = {rt->loss_scale, 0};
    if (check(rt->d->copy(rt->dev, m->scalars, init, sizeof init, CT_COPY_H2D), "copy") != CT_OK) {
        rt->d->free(rt->dev, p);
        free(m);
        return NULL;
    }
    return rt->moe = m;
}

/* At least n ones in device memory. */
static const float *moe_ones(runtime *rt, int64_t n) {
    struct rt_moe *m = moe_state(rt);
    if (!m) return NULL;
    if (m->n_ones >= n) return m->ones;
    float *host = malloc(sizeof(float) * (size_t)n);
    void *p = NULL;
    if (!host || rt->d->alloc(rt->dev, sizeof(float) * (size_t)n, &p) != CT_OK) {
        free(host);
        ct_set_error("out of memory for the MoE counts");
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) host[i] = 1.0f;
    ct_status st = check(rt->d->copy(rt->dev, p, host, sizeof(float) * (size_t)n, CT_COPY_H2D), "copy");
    free(host);
    if (st != CT_OK) {
        rt->d->free(rt->dev, p);
        return NULL;
    }
    if (m->ones) rt->d->free(rt->dev, m->ones);
    m->ones = p;
    m->n_ones = n;
    return m->ones;
}

/* The call site of the layer whose router is named `router` (made on first use), or -1 with the error set. */
static int moe_site_of(runtime *rt, const char *router, int64_t e) {
    struct rt_moe *m = moe_state(rt);
    if (!m) return -1;
    for (int i = 0; i < m->n_sites; i++)
        if (!strcmp(m->sites[i].router, router)) return i;
    moe_site *s = realloc(m->sites, sizeof *s * (size_t)(m->n_sites + 1));
    if (!s) goto nomem;
    m->sites = s;
    s = &m->sites[m->n_sites];
    void *p = NULL;
    if (!(s->router = strdup(router)) || rt->d->alloc(rt->dev, sizeof(float) * (size_t)e, &p) != CT_OK) {
        free(s->router);
        goto nomem;
    }
    s->counts = p;
    s->e = e;
    if (check(rt->d->zero(rt->dev, p, sizeof(float) * (size_t)e), "zero") != CT_OK) {
        rt->d->free(rt->dev, p);
        free(s->router);
        return -1;
    }
    return m->n_sites++;
nomem:
    ct_set_error("out of memory for the MoE counts");
    return -1;
}

void runtime_moe_set_loss_scale(runtime *rt, float scale) {
    rt->loss_scale = scale;
    if (rt->moe && !rt->planning) (void)rt->d->copy(rt->dev, rt->moe->scalars, &scale, sizeof scale, CT_COPY_H2D);
}

ct_status runtime_take_aux(runtime *rt, double *aux) {
    *aux = 0;
    if (!rt->moe || rt->planning) return CT_OK;
    float v = 0;
    ct_status st = check(rt->d->copy(rt->dev, &v, rt->moe->scalars + 1, sizeof v, CT_COPY_D2H), "copy");
    if (st == CT_OK) st = check(rt->d->zero(rt->dev, rt->moe->scalars + 1, sizeof(float)), "zero");
    *aux = v;
    return st;
}

ct_status runtime_moe_loads(runtime *rt, const ct_moe_load **loads, int *n) {
    struct rt_moe *m = rt->moe;
    *loads = NULL;
    *n = 0;
    if (!m || !m->n_sites) return CT_OK;
    if (!m->loads && !(m->loads = calloc((size_t)m->n_sites, sizeof *m->loads)))
        return ct_fail(CT_ERR_NOMEM, "out of memory for the MoE counts");
    for (int i = 0; i < m->n_sites; i++)
        m->loads[i] = (ct_moe_load){m->sites[i].router, m->sites[i].e, m->sites[i].counts};
    *loads = m->loads;
    *n = m->n_sites;
    return CT_OK;
}

ct_status runtime_moe_zero_counts(runtime *rt) {
    struct rt_moe *m = rt->moe;
    for (int i = 0; m && i < m->n_sites; i++) {
        ct_status st = check(rt->d->zero(rt->dev, m->sites[i].counts, sizeof(float) * (size_t)m->sites[i].e), "zero");
        if (st != CT_OK) return st;
    }
    return CT_OK;
}

void runtime_moe_free(runtime *rt) {
    struct rt_moe *m = rt->moe;
    if (!m) return;
    for (int i = 0; i < m->n_sites; i++) {
        rt->d->free(rt->dev, m->sites[i].counts);
        free(m->sites[i].router);
    }
    if (m->ones) rt->d->free(rt->dev, m->ones);
    rt->d->free(rt->dev, m->scalars);
    free(m->sites);
    free(m->loads);
    free(m);
    rt->moe = NULL;
}

/* ---- route: scores and top-k ---- */

typedef struct route_state {
    int64_t n, e, k, n_groups, topk_groups;
    int func, normalize, force;
    float route_scale;
    const float *bias;
} route_state;

/* in: logits (n,e). out: weights (n,k), idx (n,k) int32, scores (n,e), and under force the scores
 * masked to the forced experts (n,e), which choose and weigh in their place. */
static ct_status route_forward(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    (void)n_in;
    runtime *rt = RT(b);
    const route_state *s = state;
    const ct_device_api *d = rt->d;
    int64_t n = s->n, e = s->e, k = s->k;
    if (!(out[0] = b->new_tensor(b, CT_F32, 2, (int64_t[]){n, k})) ||
        !(out[1] = b->new_tensor(b, CT_I32, 2, (int64_t[]){n, k})) ||
        !(out[2] = b->new_tensor(b, CT_F32, 2, (int64_t[]){n, e})) ||
        (n_out > 3 && !(out[3] = b->new_tensor(b, CT_F32, 2, (int64_t[]){n, e}))))
        return CT_ERR_NOMEM;
    float *scores = out[2]->data;
    ct_status st = check(d->moe_scores_forward(rt->dev, scores, in[0]->data, n, e, s->func), "moe_scores_forward");
    if (st != CT_OK) return st;
    const float *choose = scores;
    if (s->force) { /* torchtitan's forced balance: token t's slot j takes expert (t*k + j) % e */
        float *mask = malloc(sizeof(float) * (size_t)(n * e));
        float *dmask = b->scratch(b, sizeof(float) * (size_t)(n * e));
        if (!mask || !dmask) {
            free(mask);
            if (!ct_last_error()[0]) ct_set_error("out of memory for the forced routing");
            return CT_ERR_NOMEM;
        }
        memset(mask, 0, sizeof(float) * (size_t)(n * e));
        for (int64_t t = 0; t < n; t++)
            for (int64_t j = 0; j < k; j++) mask[t * e + (t * k + j) % e] = 1.0f;
        st = check(d->copy(rt->dev, dmask, mask, sizeof(float) * (size_t)(n * e), CT_COPY_H2D), "copy");
        free(mask);
        if (st == CT_OK) st = check(d->ew_mul(rt->dev, out[3]->data, scores, dmask, n * e), "ew_mul");
        if (st != CT_OK) return st;
        choose = out[3]->data; /* the forced experts hold their (positive) scores, the rest 0 */
    }
    return check(d->moe_topk_forward(rt->dev, out[1]->data, out[0]->data, choose, s->force ? NULL : s->bias, n, e, k,
                                     s->force ? 0 : s->n_groups, s->topk_groups, s->normalize, s->route_scale),
                 "moe_topk_forward");
}

static ct_status route_backward(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                                const float *const *dy, int n_out, int halves) {
    (void)n_in;
    (void)n_out;
    if (!(halves & CT_GRAD_INPUT)) return CT_OK;
    runtime *rt = RT(b);
    const route_state *s = state;
    const ct_device_api *d = rt->d;
    int64_t n = s->n, e = s->e, k = s->k;
    float *ds = b->backward_scratch(b, sizeof(float) * (size_t)(n * e)), *dl = b->grad(b, in[0]);
    if (!ds || !dl) return CT_ERR_NOMEM;
    ct_status st = dy[2] ? check(d->copy(rt->dev, ds, dy[2], sizeof(float) * (size_t)(n * e), CT_COPY_D2D), "copy")
                         : check(d->zero(rt->dev, ds, sizeof(float) * (size_t)(n * e)), "zero");
    /* under force the masked scores chose: their gradient is the scores' at the chosen experts */
    if (st == CT_OK && dy[0])
        st = check(d->moe_topk_backward(rt->dev, ds, dy[0], out[s->force ? 3 : 2]->data, out[1]->data, n, e, k,
                                        s->normalize, s->route_scale),
                   "moe_topk_backward");
    if (st == CT_OK) st = check(d->moe_scores_backward(rt->dev, dl, ds, out[2]->data, n, e, s->func), "moe_scores_backward");
    return st;
}

static ct_status route_plan(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                            ct_op_cost *cost) {
    (void)in;
    (void)n_in;
    const route_state *s = state;
    int64_t n = s->n, e = s->e, k = s->k;
    if (!(out[0] = b->new_tensor(b, CT_F32, 2, (int64_t[]){n, k})) ||
        !(out[1] = b->new_tensor(b, CT_I32, 2, (int64_t[]){n, k})) ||
        !(out[2] = b->new_tensor(b, CT_F32, 2, (int64_t[]){n, e})) ||
        (n_out > 3 && !(out[3] = b->new_tensor(b, CT_F32, 2, (int64_t[]){n, e}))))
        return CT_ERR_NOMEM;
    cost->bytes[0] = 4.0 * (double)(n * e) * 3;
    cost->bytes[1] = 4.0 * (double)(n * e) * 4;
    cost->backward_scratch = 4.0 * (double)(n * e);
    return CT_OK;
}

static const ct_custom_op route_op = {sizeof(ct_custom_op), "moe_route", route_forward, route_backward, route_plan};

/* ---- dispatch: sort the pairs by expert and gather the tokens in that order ---- */

typedef struct dispatch_state {
    int64_t n, k, d, e;
    int site; /* the call site whose counts its backward adds to (-1: none, planning) */
} dispatch_state;

/* in: x (n,d), idx (n,k). out: xs (n*k,d), offsets (e+1), order (n*k), inv (n*k). */
static ct_status dispatch_new(ct_builder *b, const dispatch_state *s, ct_tensor **out) {
    int64_t nk = s->n * s->k;
    return (out[0] = b->new_tensor(b, CT_F32, 2, (int64_t[]){nk, s->d})) &&
                   (out[1] = b->new_tensor(b, CT_I32, 1, (int64_t[]){s->e + 1})) &&
                   (out[2] = b->new_tensor(b, CT_I32, 1, (int64_t[]){nk})) &&
                   (out[3] = b->new_tensor(b, CT_I32, 1, (int64_t[]){nk}))
               ? CT_OK
               : CT_ERR_NOMEM;
}

static ct_status dispatch_forward(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out,
                                  int n_out) {
    (void)n_in;
    (void)n_out;
    runtime *rt = RT(b);
    const dispatch_state *s = state;
    ct_status st = dispatch_new(b, s, out);
    if (st != CT_OK) return st;
    st = check(rt->d->moe_permute(rt->dev, out[2]->data, out[3]->data, out[1]->data, in[1]->data, s->n * s->k, s->e),
               "moe_permute");
    if (st != CT_OK) return st;
    return check(rt->d->moe_gather_forward(rt->dev, out[0]->data, in[0]->data, out[2]->data, s->n, s->k, s->d),
                 "moe_gather_forward");
}

/* Backward runs once per microbatch whatever recomputes the forward: the counts are added here. */
static ct_status dispatch_backward(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                                   const float *const *dy, int n_out, int halves) {
    (void)n_in;
    (void)n_out;
    if (!(halves & CT_GRAD_INPUT)) return CT_OK;
    runtime *rt = RT(b);
    const dispatch_state *s = state;
    int64_t nk = s->n * s->k;
    ct_status st = CT_OK;
    if (s->site >= 0) {
        const float *ones = moe_ones(rt, nk);
        if (!ones) return CT_ERR_NOMEM;
        st = check(rt->d->grouped_matmul_backward_weight(rt->dev, rt->moe->sites[s->site].counts, ones, ones,
                                                         out[1]->data, nk, s->e, 1, 1),
                   "grouped_matmul_backward_weight");
    }
    if (st != CT_OK || !dy[0]) return st;
    float *dx = b->grad(b, in[0]);
    if (!dx) return CT_ERR_NOMEM;
    return check(rt->d->moe_gather_backward(rt->dev, dx, dy[0], out[3]->data, s->n, s->k, s->d), "moe_gather_backward");
}

static ct_status dispatch_plan(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                               ct_op_cost *cost) {
    (void)in;
    (void)n_in;
    (void)n_out;
    const dispatch_state *s = state;
    cost->bytes[0] = 8.0 * (double)(s->n * s->k * s->d);
    cost->bytes[1] = 8.0 * (double)(s->n * s->k * s->d);
    return dispatch_new(b, s, out);
}

static const ct_custom_op dispatch_op = {sizeof(ct_custom_op), "moe_dispatch", dispatch_forward, dispatch_backward,
                                         dispatch_plan};

/* ---- grouped linear: y (m,o) segment g = x_g @ w_g^T ----
 * On the device's grouped GEMMs, or on the GEMMs a builder layer handed moe_experts (tape.h's
 * tape_gemm: the quantizer's, with the same operands). */

typedef struct glinear_state {
    int64_t m, e, o, i;
    const tape_gemm *gemm; /* NULL: the device's */
} glinear_state;

/* in: x (m,i), w (e,o,i), offsets (e+1). out: y (m,o). */
static ct_status glinear_forward(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out,
                                 int n_out) {
    (void)n_in;
    (void)n_out;
    runtime *rt = RT(b);
    const glinear_state *s = state;
    const tape_gemm *g = s->gemm;
    if (!(out[0] = b->new_tensor(b, CT_F32, 2, (int64_t[]){s->m, s->o}))) return CT_ERR_NOMEM;
    ct_status st = check(rt->d->zero(rt->dev, out[0]->data, sizeof(float) * (size_t)(s->m * s->o)), "zero");
    if (st != CT_OK) return st;
    tape_gemm_call c = {TAPE_GEMM_FORWARD, out[0]->data, in[0]->data, in[1]->data, in[2]->data, s->m, s->e, s->o, s->i};
    if (g) return tape_gemm_run(rt, g, &c);
    return check(rt->d->grouped_matmul_forward(rt->dev, out[0]->data, in[0]->data, in[1]->data, in[2]->data, s->m, s->e,
                                               s->o, s->i),
                 "grouped_matmul_forward");
}

static ct_status glinear_backward(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                                  const float *const *dy, int n_out, int halves) {
    (void)n_in;
    (void)n_out;
    (void)out;
    runtime *rt = RT(b);
    const glinear_state *s = state;
    const tape_gemm *g = s->gemm;
    ct_status st = CT_OK;
    if (!dy[0]) return CT_OK;
    if (halves & CT_GRAD_INPUT) {
        float *dx = b->grad(b, in[0]);
        if (!dx) return CT_ERR_NOMEM;
        tape_gemm_call c = {TAPE_GEMM_INPUT, dx, dy[0], in[1]->data, in[2]->data, s->m, s->e, s->o, s->i};
        st = g ? tape_gemm_run(rt, g, &c)
               : check(rt->d->grouped_matmul_backward_input(rt->dev, dx, dy[0], in[1]->data, in[2]->data, s->m, s->e,
                                                            s->o, s->i),
                       "grouped_matmul_backward_input");
    }
    if (st == CT_OK && (halves & CT_GRAD_WEIGHT)) {
        float *dw = b->grad(b, in[1]);
        if (!dw) return CT_ERR_NOMEM;
        tape_gemm_call c = {TAPE_GEMM_WEIGHT, dw, dy[0], in[0]->data, in[2]->data, s->m, s->e, s->o, s->i};
        st = g ? tape_gemm_run(rt, g, &c)
               : check(rt->d->grouped_matmul_backward_weight(rt->dev, dw, dy[0], in[0]->data, in[2]->data, s->m, s->e,
                                                             s->o, s->i),
                       "grouped_matmul_backward_weight");
    }
    return st;
}

static ct_status glinear_plan(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                              ct_op_cost *cost) {
    (void)in;
    (void)n_in;
    (void)n_out;
    const glinear_state *s = state;
    double f = 2.0 * (double)s->m * (double)s->o * (double)s->i;
    cost->matmul_flops[0] = f;
    cost->matmul_flops[1] = 2 * f;
    cost->matmul_dtype = CT_F32;
    if (s->gemm && s->gemm->plan) { /* the GEMMs' own costs (a quantizer's casts: its GEMM dtype and traffic) */
        ct_quant_cost qc = {sizeof qc, CT_F32, 0, 0, 0, {0, 0}};
        ct_status st = s->gemm->plan(RT(b), in[1], s->m, &qc);
        if (st != CT_OK) return st;
        cost->matmul_dtype = qc.gemm_dtype;
        cost->bytes[0] += qc.cast_bytes[0];
        cost->bytes[1] += qc.cast_bytes[1];
        runtime *rt = RT(b);
        if (rt->trace_ops == 1 && rt->observer) rt->observer->gemm_memory(rt, &qc); /* its casts' memory */
    }
    return (out[0] = b->new_tensor(b, CT_F32, 2, (int64_t[]){s->m, s->o})) ? CT_OK : CT_ERR_NOMEM;
}

static const ct_custom_op glinear_op = {sizeof(ct_custom_op), "grouped_linear", glinear_forward, glinear_backward,
                                        glinear_plan};

/* ---- combine: out (n,d) row t = sum_j weights[t,j] * ys row inv[t*k + j] ---- */

typedef struct combine_state {
    int64_t n, k, d;
} combine_state;

/* in: ys (n*k,d), weights (n,k), inv (n*k). out: (n,d). */
static ct_status combine_forward(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out,
                                 int n_out) {
    (void)n_in;
    (void)n_out;
    runtime *rt = RT(b);
    const combine_state *s = state;
    if (!(out[0] = b->new_tensor(b, CT_F32, 2, (int64_t[]){s->n, s->d}))) return CT_ERR_NOMEM;
    return check(rt->d->moe_combine_forward(rt->dev, out[0]->data, in[0]->data, in[1]->data, in[2]->data, s->n, s->k,
                                            s->d),
                 "moe_combine_forward");
}

static ct_status combine_backward(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                                  const float *const *dy, int n_out, int halves) {
    (void)n_in;
    (void)n_out;
    (void)out;
    if (!(halves & CT_GRAD_INPUT) || !dy[0]) return CT_OK;
    runtime *rt = RT(b);
    const combine_state *s = state;
    float *dys = b->grad(b, in[0]), *dw = b->grad(b, in[1]);
    if (!dys || !dw) return CT_ERR_NOMEM;
    return check(rt->d->moe_combine_backward(rt->dev, dys, dw, dy[0], in[0]->data, in[1]->data, in[2]->data, s->n, s->k,
                                             s->d),
                 "moe_combine_backward");
}

static ct_status combine_plan(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                              ct_op_cost *cost) {
    (void)in;
    (void)n_in;
    (void)n_out;
    const combine_state *s = state;
    cost->bytes[0] = 4.0 * (double)(s->n * s->d) * (double)(s->k + 1);
    cost->bytes[1] = 8.0 * (double)(s->n * s->d) * (double)(s->k + 1);
    return (out[0] = b->new_tensor(b, CT_F32, 2, (int64_t[]){s->n, s->d})) ? CT_OK : CT_ERR_NOMEM;
}

static const ct_custom_op combine_op = {sizeof(ct_custom_op), "moe_combine", combine_forward, combine_backward,
                                        combine_plan};

/* ---- balance: the Switch load-balancing loss, as a sum over the tokens ----
 * Over the N tokens of the microbatch on every rank that holds different tokens of it (the
 * data-parallel ranks, and the ranks that split its rows: context parallel, sequence parallel;
 * runtime_token_axes), so that a layout computes the statistic one rank computes on the same
 * microbatch: C_j the (token, slot) pairs routed to expert j and S_j = sum_t scores[t,j], both summed
 * over those ranks (one all-reduce of 2e floats per axis, in the forward), and
 *   A = coef * e / N * sum_j C_j S_j,
 * which is N * coef * e * sum_j (C_j / N) (S_j / N): transformers' load_balancing_loss_func on one
 * layer, times N (a sum over tokens, like the cross-entropy's). This rank's value is its share
 * A * n / N (n its tokens; every rank holds the same n), so the shares the session sums over those
 * axes make A; dA/dscores[t,j] = coef * e / N * C_j for this rank's tokens (the choice, and so C, is
 * constant). */

typedef struct balance_state {
    int64_t n, e, k;
    float coef;
    int64_t N; /* n times the product of the token axes' degrees */
    int n_axes;
    int axes[CT_MESH_NAXES];
} balance_state;

/* in: scores (n,e), offsets (e+1). out: A's share (scalar), [C | S] (2e). */
static ct_status balance_forward(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out,
                                 int n_out) {
    (void)n_in;
    (void)n_out;
    runtime *rt = RT(b);
    const balance_state *s = state;
    const ct_device_api *d = rt->d;
    int64_t n = s->n, e = s->e, nk = s->n * s->k;
    if (!(out[0] = b->new_tensor(b, CT_F32, 0, NULL)) || !(out[1] = b->new_tensor(b, CT_F32, 1, (int64_t[]){2 * e})))
        return CT_ERR_NOMEM;
    const float *ones = moe_ones(rt, nk > n ? nk : n);
    if (!ones) return CT_ERR_NOMEM;
    float *c = out[1]->data, *colsum = c + e;
    ct_status st = check(d->zero(rt->dev, c, sizeof(float) * (size_t)e), "zero");
    if (st == CT_OK)
        st = check(d->grouped_matmul_backward_weight(rt->dev, c, ones, ones, in[1]->data, nk, e, 1, 1),
                   "grouped_matmul_backward_weight");
    /* S (1,e) = ones (1,n) @ scores (n,e) */
    if (st == CT_OK) st = check(d->matmul(rt->dev, colsum, ones, in[0]->data, 1, e, n, 0, 0, 1.0f, 0.0f), "matmul");
    for (int i = 0; i < s->n_axes && st == CT_OK; i++) st = tape_axis_all_reduce(rt, s->axes[i], c, 2 * e);
    /* A's share (1,1) = coef e n / N^2 * S (1,e) @ C (e,1) */
    double N = (double)s->N;
    if (st == CT_OK)
        st = check(d->matmul(rt->dev, out[0]->data, colsum, c, 1, 1, e, 0, 0,
                             (float)((double)s->coef * (double)e * (double)n / (N * N)), 0.0f),
                   "matmul");
    return st;
}

static ct_status balance_backward(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                                  const float *const *dy, int n_out, int halves) {
    (void)n_in;
    (void)n_out;
    if (!(halves & CT_GRAD_INPUT) || !dy[0]) return CT_OK;
    runtime *rt = RT(b);
    const balance_state *s = state;
    float *g = b->backward_scratch(b, sizeof(float) * (size_t)s->e), *ds = b->grad(b, in[0]);
    if (!g || !ds) return CT_ERR_NOMEM;
    /* g (1,e) = dA (1,1) @ C (1,e) * coef e / N, added to every row of dscores */
    ct_status st = check(rt->d->matmul(rt->dev, g, dy[0], out[1]->data, 1, s->e, 1, 0, 0,
                                       (float)((double)s->coef * (double)s->e / (double)s->N), 0.0f),
                         "matmul");
    if (st == CT_OK) st = check(rt->d->bias_forward(rt->dev, ds, ds, g, s->n, s->e), "bias_forward");
    return st;
}

static ct_status balance_plan(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                              ct_op_cost *cost) {
    (void)in;
    (void)n_in;
    (void)n_out;
    const balance_state *s = state;
    cost->bytes[0] = 4.0 * (double)(s->n * s->e);
    cost->bytes[1] = 8.0 * (double)(s->n * s->e);
    cost->backward_scratch = 4.0 * (double)s->e;
    for (int i = 0; i < s->n_axes && cost->n_comm < (int)(sizeof cost->comm / sizeof cost->comm[0]); i++)
        cost->comm[cost->n_comm++] = (ct_op_comm){s->axes[i], CT_COLL_ALL_REDUCE, CT_PHASE_FORWARD, 0,
                                                  8.0 * (double)s->e, 1};
    return (out[0] = b->new_tensor(b, CT_F32, 0, NULL)) &&
                   (out[1] = b->new_tensor(b, CT_F32, 1, (int64_t[]){2 * s->e}))
               ? CT_OK
               : CT_ERR_NOMEM;
}

static const ct_custom_op balance_op = {sizeof(ct_custom_op), "moe_balance_loss", balance_forward, balance_backward,
                                        balance_plan};

/* ---- aux_loss: y = x, and loss joins the step's loss ---- */

/* in: x, loss (scalar). out: y, x's copy. */
static ct_status aux_forward(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    (void)state;
    (void)n_in;
    (void)n_out;
    runtime *rt = RT(b);
    if (!moe_state(rt) || !(out[0] = b->new_tensor(b, CT_F32, in[0]->ndim, in[0]->shape))) return CT_ERR_NOMEM;
    return check(rt->d->copy(rt->dev, out[0]->data, in[0]->data, sizeof(float) * (size_t)ct_tensor_numel(in[0]),
                             CT_COPY_D2D),
                 "copy");
}

/* The loss's gradient is the loss scale (on the device), and its value joins the step's aux sum here,
 * in backward, which runs once per microbatch. */
static ct_status aux_backward(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                              const float *const *dy, int n_out, int halves) {
    (void)state;
    (void)n_in;
    (void)n_out;
    (void)out;
    if (!(halves & CT_GRAD_INPUT)) return CT_OK;
    runtime *rt = RT(b);
    struct rt_moe *m = moe_state(rt);
    float *dx = b->grad(b, in[0]), *dl = b->grad(b, in[1]);
    if (!m || !dx || !dl) return CT_ERR_NOMEM;
    ct_status st = dy[0] ? check(rt->d->axpy(rt->dev, dx, dy[0], 1.0f, ct_tensor_numel(in[0])), "axpy") : CT_OK;
    if (st == CT_OK) st = check(rt->d->add(rt->dev, dl, dl, m->scalars, 1), "add");
    if (st == CT_OK) st = check(rt->d->add(rt->dev, m->scalars + 1, m->scalars + 1, in[1]->data, 1), "add");
    return st;
}

static ct_status aux_plan(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                          ct_op_cost *cost) {
    (void)state;
    (void)n_in;
    (void)n_out;
    cost->bytes[0] = 8.0 * (double)ct_tensor_numel(in[0]);
    cost->bytes[1] = 12.0 * (double)ct_tensor_numel(in[0]);
    return (out[0] = b->new_tensor(b, CT_F32, in[0]->ndim, in[0]->shape)) ? CT_OK : CT_ERR_NOMEM;
}

static const ct_custom_op aux_op = {sizeof(ct_custom_op), "aux_loss", aux_forward, aux_backward, aux_plan};

/* ---- the builder's ops ---- */

static int has_moe_ops(const ct_device_api *d) {
    return CT_HAS_FIELD(d, ct_device_api, moe_combine_backward) && d->moe_scores_forward && d->moe_combine_backward;
}

static ct_status need_moe_ops(runtime *rt, const char *op) {
    if (rt->planning || has_moe_ops(rt->d)) return CT_OK;
    ct_device_info info = {sizeof info, NULL, 0, 0};
    if (rt->d->info) rt->d->info(rt->dev, &info);
    return ct_fail(CT_ERR_UNSUPPORTED, "%s: device '%s' has no mixture-of-experts ops (ABI 2.14)", op,
                   info.name ? info.name : "?");
}

ct_tensor *tape_aux_loss(ct_builder *b, ct_tensor *x, ct_tensor *loss) {
    runtime *rt = RT(b);
    if (!x || !loss || x->dtype != CT_F32 || loss->dtype != CT_F32 || loss->ndim != 0) {
        ct_set_error("aux_loss: needs an f32 tensor and an f32 scalar loss");
        return NULL;
    }
    ct_tensor *in[2] = {x, loss}, *out[1];
    return rt->builder.custom(&rt->builder, &aux_op, NULL, 0, in, 2, out, 1) == CT_OK ? out[0] : NULL;
}

ct_tensor *tape_moe_experts(ct_builder *b, ct_tensor *x, const ct_tensor *offsets, ct_tensor *w1, ct_tensor *w3,
                            ct_tensor *w2) {
    const tape_gemm *device[3] = {NULL, NULL, NULL};
    return tape_moe_experts_gemm(RT(b), x, offsets, w1, w3, w2, device);
}

ct_tensor *tape_moe_experts_gemm(runtime *rt, ct_tensor *x, const ct_tensor *offsets, ct_tensor *w1, ct_tensor *w3,
                                 ct_tensor *w2, const tape_gemm *const gemm[3]) {
    if (need_moe_ops(rt, "moe_experts") != CT_OK) return NULL;
    if (!x || !offsets || !w1 || !w3 || !w2 || x->ndim != 2 || w1->ndim != 3 || w3->ndim != 3 || w2->ndim != 3 ||
        offsets->dtype != CT_I32 || offsets->ndim != 1) {
        ct_set_error("moe_experts: needs x (m, d), offsets (e+1) int32 and w1, w3 (e, h, d), w2 (e, d, h)");
        return NULL;
    }
    int64_t m = x->shape[0], d = x->shape[1], e = w1->shape[0], h = w1->shape[1];
    if (w1->shape[2] != d || w3->shape[0] != e || w3->shape[1] != h || w3->shape[2] != d || w2->shape[0] != e ||
        w2->shape[1] != d || w2->shape[2] != h || offsets->shape[0] != e + 1) {
        ct_set_error("moe_experts: shapes disagree: x (%lld, %lld), offsets (%lld), w1 (%lld, %lld, %lld), "
                     "w3 (%lld, %lld, %lld), w2 (%lld, %lld, %lld)",
                     (long long)m, (long long)d, (long long)offsets->shape[0], (long long)w1->shape[0],
                     (long long)w1->shape[1], (long long)w1->shape[2], (long long)w3->shape[0], (long long)w3->shape[1],
                     (long long)w3->shape[2], (long long)w2->shape[0], (long long)w2->shape[1], (long long)w2->shape[2]);
        return NULL;
    }
    ct_builder *top = rt->top, *base = &rt->builder;
    glinear_state up = {m, e, h, d, gemm[0]}, up3 = {m, e, h, d, gemm[1]}, down = {m, e, d, h, gemm[2]};
    ct_tensor *a, *g, *y;
    ct_tensor *in1[3] = {x, w1, (ct_tensor *)offsets}, *in3[3] = {x, w3, (ct_tensor *)offsets};
    if (base->custom(base, &glinear_op, &up, sizeof up, in1, 3, &a, 1) != CT_OK ||
        base->custom(base, &glinear_op, &up3, sizeof up3, in3, 3, &g, 1) != CT_OK || !(a = top->swiglu(top, a, g)))
        return NULL;
    ct_tensor *in2[3] = {a, w2, (ct_tensor *)offsets};
    return base->custom(base, &glinear_op, &down, sizeof down, in2, 3, &y, 1) == CT_OK ? y : NULL;
}

static int bad_layer(const ct_moe_layer *L, const ct_tensor *x) {
    if (!L || !x || !CT_HAS_FIELD(L, ct_moe_layer, force_load_balance) || !L->router || !L->w1 || !L->w3 || !L->w2) {
        ct_set_error("moe: needs x and a ct_moe_layer (2.15) with router, w1, w3 and w2");
        return 1;
    }
    int64_t d = x->shape[x->ndim - 1];
    if (x->ndim < 1 || x->dtype != CT_F32 || L->router->ndim != 2 || L->router->shape[1] != d) {
        ct_set_error("moe: x (..., %lld) and router '%s' (%lld, %lld) disagree", (long long)d,
                     L->router->name ? L->router->name : "?", (long long)L->router->shape[0],
                     (long long)(L->router->ndim > 1 ? L->router->shape[1] : 0));
        return 1;
    }
    int64_t e = L->router->shape[0];
    if (L->top_k < 1 || L->top_k > e) {
        ct_set_error("moe: top_k %lld must be within [1, %lld experts]", (long long)L->top_k, (long long)e);
        return 1;
    }
    if (L->score_func != CT_MOE_SOFTMAX && L->score_func != CT_MOE_SIGMOID) {
        ct_set_error("moe: score_func %d is neither softmax nor sigmoid", L->score_func);
        return 1;
    }
    if (L->n_groups > 1 && (e % L->n_groups || L->topk_groups < 1 || L->topk_groups > L->n_groups ||
                            L->top_k > L->topk_groups * (e / L->n_groups))) {
        ct_set_error("moe: %lld groups (top %lld) cannot route %lld of %lld experts", (long long)L->n_groups,
                     (long long)L->topk_groups, (long long)L->top_k, (long long)e);
        return 1;
    }
    return 0;
}

ct_tensor *tape_moe(ct_builder *b, ct_tensor *x, const ct_moe_layer *L) {
    runtime *rt = RT(b);
    if (bad_layer(L, x) || need_moe_ops(rt, "moe") != CT_OK) return NULL;
    if (L->force_load_balance && !rt->planning && !(CT_HAS_FIELD(rt->d, ct_device_api, ew_mul) && rt->d->ew_mul)) {
        ct_set_error("moe: force_load_balance needs the device's ew_mul (ABI 2.1)");
        return NULL;
    }
    ct_builder *top = rt->top, *base = &rt->builder;
    int64_t d = x->shape[x->ndim - 1], n = ct_tensor_numel(x) / d, e = L->router->shape[0], k = L->top_k;
    ct_tensor *x2, *logits;
    if (!(x2 = top->view(top, x, 2, (int64_t[]){n, d})) || !(logits = top->linear(top, x2, L->router))) return NULL;
    route_state rs = {n, e, k, L->n_groups, L->topk_groups, L->score_func, L->normalize, L->force_load_balance,
                      L->route_scale, L->expert_bias};
    ct_tensor *r[4], *dsp[4];
    if (base->custom(base, &route_op, &rs, sizeof rs, &logits, 1, r, rs.force ? 4 : 3) != CT_OK) return NULL;
    int site = rt->planning ? -1 : moe_site_of(rt, L->router->name ? L->router->name : "?", e);
    if (!rt->planning && site < 0) return NULL;
    dispatch_state ds = {n, k, d, e, site};
    ct_tensor *din[2] = {x2, r[1]};
    if (base->custom(base, &dispatch_op, &ds, sizeof ds, din, 2, dsp, 4) != CT_OK) return NULL;
    ct_tensor *ys = top->moe_experts(top, dsp[0], dsp[1], L->w1, L->w3, L->w2), *y;
    if (!ys) return NULL;
    combine_state cs = {n, k, d};
    ct_tensor *cin[3] = {ys, r[0], dsp[3]};
    if (base->custom(base, &combine_op, &cs, sizeof cs, cin, 3, &y, 1) != CT_OK) return NULL;
    if (L->aux_loss_coef > 0) {
        balance_state bs = {n, e, k, L->aux_loss_coef, n, 0, {0}};
        bs.n_axes = runtime_token_axes(rt, bs.axes, 0);
        for (int i = 0; i < bs.n_axes; i++) bs.N *= rt->dist.mesh->degree[bs.axes[i]];
        ct_tensor *bin[2] = {r[2], dsp[1]}, *bal[2];
        if (base->custom(base, &balance_op, &bs, sizeof bs, bin, 2, bal, 2) != CT_OK ||
            !(y = top->aux_loss(top, y, bal[0])))
            return NULL;
    }
    return top->view(top, y, x->ndim, x->shape);
}

/* ---- all_to_all_v (ABI 2.17): rows to each rank of an axis by counts, the gradient back the other way ---- */

#define A2AV_MAX_RANKS 256

typedef struct a2av_state {
    int axis, degree;
    int64_t c; /* columns */
    int64_t send[A2AV_MAX_RANKS], recv[A2AV_MAX_RANKS]; /* rows; only the first `degree` are sent in the state */
} a2av_state;

static int64_t rows_sum(const int64_t *r, int n) {
    int64_t s = 0;
    for (int i = 0; i < n; i++) s += r[i];
    return s;
}

/* dst (sum recv rows, c) from src (sum send rows, c), rows by the counts over the axis's group. */
static ct_status a2av_move(runtime *rt, const a2av_state *s, const int64_t *send, const int64_t *recv, const float *src,
                           float *dst) {
    int64_t so[A2AV_MAX_RANKS], ro[A2AV_MAX_RANKS], sc[A2AV_MAX_RANKS], rc[A2AV_MAX_RANKS], a = 0, b = 0;
    for (int j = 0; j < s->degree; j++) {
        sc[j] = send[j] * s->c, rc[j] = recv[j] * s->c;
        so[j] = a, ro[j] = b;
        a += sc[j], b += rc[j];
    }
    const ct_comm_api *c = rt->coll_capi;
    int traced_axis = s->axis < CT_MESH_NAXES ? s->axis : CT_AXIS_DP_SHARD; /* ep lives within dp_shard x cp */
    const char *name = rt->in_backward ? "ep_comm_bwd" : "ep_comm_fwd";
    trace_begin(name);
    double t0 = ct_now();
    ct_clear_error();
    ct_status st = c->all_to_allv(rt->dist.comm, mesh_shard_group(rt->dist.mesh, s->axis), src, sc, so, dst, rc, ro,
                                  CT_F32, NULL);
    rt->builder.account_comm(&rt->builder, traced_axis, ct_now() - t0);
    trace_end(name);
    if (st != CT_OK && !ct_last_error()[0]) ct_set_error("all_to_all_v over axis %d failed (status %d)", s->axis, st);
    return st;
}

static ct_status a2av_forward(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    (void)n_in;
    (void)n_out;
    const a2av_state *s = state;
    if (!(out[0] = b->new_tensor(b, CT_F32, 2, (int64_t[]){rows_sum(s->recv, s->degree), s->c}))) return CT_ERR_NOMEM;
    return a2av_move(RT(b), s, s->send, s->recv, in[0]->data, out[0]->data);
}

static ct_status a2av_backward(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                               const float *const *dy, int n_out, int halves) {
    (void)n_in;
    (void)n_out;
    (void)out;
    if (!(halves & CT_GRAD_INPUT)) return CT_OK;
    runtime *rt = RT(b);
    const a2av_state *s = state;
    int64_t n = rows_sum(s->send, s->degree) * s->c, m = rows_sum(s->recv, s->degree) * s->c;
    /* every rank takes part, whether a gradient reached its output or not */
    float *tmp = b->backward_scratch(b, sizeof(float) * (size_t)(n + (dy[0] ? 0 : m) + 1)), *dx = b->grad(b, in[0]);
    if (!tmp || !dx) return CT_ERR_NOMEM;
    const float *g = dy[0];
    if (!g) {
        ct_status z = check(rt->d->zero(rt->dev, tmp + n, sizeof(float) * (size_t)m), "zero");
        if (z != CT_OK) return z;
        g = tmp + n;
    }
    ct_status st = a2av_move(rt, s, s->recv, s->send, g, tmp);
    return st == CT_OK ? check(rt->d->axpy(rt->dev, dx, tmp, 1.0f, n), "axpy") : st;
}

static ct_status a2av_plan(ct_builder *b, void *state, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                           ct_op_cost *cost) {
    (void)in;
    (void)n_in;
    (void)n_out;
    const a2av_state *s = state;
    int axis = s->axis; /* a mesh axis or CT_AXIS_EP: the planner times it over that group */
    double sent = 4.0 * (double)(rows_sum(s->send, s->degree) * s->c);
    cost->n_comm = 2;
    cost->comm[0] = (ct_op_comm){axis, CT_COLL_ALL_TO_ALL, 1, 0, sent, 0};
    cost->comm[1] = (ct_op_comm){axis, CT_COLL_ALL_TO_ALL, 2, 0, sent, 0};
    cost->backward_scratch = sent;
    return (out[0] = b->new_tensor(b, CT_F32, 2, (int64_t[]){rows_sum(s->recv, s->degree), s->c})) ? CT_OK
                                                                                                   : CT_ERR_NOMEM;
}

static const ct_custom_op a2av_op = {sizeof(ct_custom_op), "all_to_all_v", a2av_forward, a2av_backward, a2av_plan};

ct_tensor *tape_all_to_all_v(ct_builder *b, ct_tensor *x, int axis, const int64_t *send_rows, const int64_t *recv_rows) {
    runtime *rt = RT(b);
    const ct_mesh_info *mesh = rt->dist.mesh;
    int degree = mesh ? mesh_shard_degree(mesh, axis) : 1;
    if (!x || x->dtype != CT_F32 || x->ndim != 2 || !send_rows || !recv_rows ||
        !((axis >= 0 && axis < CT_MESH_NAXES) || axis == CT_AXIS_EP)) {
        ct_set_error("all_to_all_v: needs an f32 x (rows, c), a mesh axis or CT_AXIS_EP (got %d) and both counts", axis);
        return NULL;
    }
    if (degree > A2AV_MAX_RANKS) {
        ct_set_error("all_to_all_v: %d ranks on the axis, more than the %d it handles", degree, A2AV_MAX_RANKS);
        return NULL;
    }
    int64_t sent = 0;
    for (int j = 0; j < degree; j++) {
        if (send_rows[j] < 0 || recv_rows[j] < 0) {
            ct_set_error("all_to_all_v: negative row count for rank %d", j);
            return NULL;
        }
        sent += send_rows[j];
    }
    if (sent != x->shape[0]) {
        ct_set_error("all_to_all_v: the send counts add up to %lld rows, x has %lld", (long long)sent,
                     (long long)x->shape[0]);
        return NULL;
    }
    if (degree <= 1) return x;
    if (!rt->planning && !(rt->coll_capi && CT_HAS_FIELD(rt->coll_capi, ct_comm_api, all_to_allv) &&
                           rt->coll_capi->all_to_allv)) {
        ct_set_error("all_to_all_v: the comm plugin has no all_to_allv (ABI 2.17)");
        return NULL;
    }
    a2av_state s = {axis, degree, x->shape[1], {0}, {0}};
    memcpy(s.send, send_rows, sizeof(int64_t) * (size_t)degree);
    memcpy(s.recv, recv_rows, sizeof(int64_t) * (size_t)degree);
    ct_tensor *y;
    return rt->builder.custom(&rt->builder, &a2av_op, &s, sizeof s, &x, 1, &y, 1) == CT_OK ? y : NULL;
}
