/* quantize.c: the run's quantizer (quantize.dense.*, ct_quantizer_api) as one more layer of the
 * builder chain, the innermost: below every operation-level strategy, right above the host's builder,
 * so the linears tensor parallel shards and the expert GEMMs expert parallel routes reach it as any
 * other linear does. Its linear asks the quantizer once per weight whether it converts it (reported at
 * start-up) and, where it does, runs the tape's own linear op on the quantizer's GEMMs (tape.h,
 * tape_gemm): recorded, checkpointed, freed and planned like the device's. moe_experts does the same
 * for the experts' grouped GEMMs (ABI 2.24), linear_cross_entropy gives a converted head its linear
 * and the host's cross_entropy. Everything else forwards to the host's builder.
 */
#include "host/host.h"
#include "engine/quantize.h"
#include "engine/tape.h"
#include "engine/moe.h"

#include <stdio.h>

/* The start-up report of which weights the quantizer converts (rank 0 prints it). */
static void quant_note(runtime *rt, const char *name, int yes, const char *why) {
    if (g_log_rank > 0 || rt->planning) return;
    const char *q = rt->quant_name ? rt->quant_name : "quantizer";
    if (yes) printf("%s: %s converted\n", q, name);
    else printf("%s: %s stays in high precision (%s)\n", q, name, why);
}

/* 1 when the quantizer has the experts' grouped GEMMs (ABI 2.24: all three). */
static int quant_grouped(const runtime *rt) {
    const ct_quantizer_api *q = rt->qapi;
    return CT_HAS_FIELD(q, ct_quantizer_api, grouped_backward_weight) && q->grouped_forward &&
           q->grouped_backward_input && q->grouped_backward_weight;
}

/* 1 when the quantizer runs the GEMMs of weight w (asked once per owner and reported): a linear's
 * (out, in) weight, or an experts weight (e, o, i) when it has grouped GEMMs (one without is never
 * asked about a 3-D weight). */
static int quant_converts(runtime *rt, ct_tensor *wt) {
    rt_tensor *w = (rt_tensor *)wt, *owner = w->base ? w->base : w;
    if (owner->t.ndim == 3 && !quant_grouped(rt)) return 0;
    if (!(owner->t.flags & CT_TENSOR_QUANT_DECIDED)) {
        const char *why = "";
        int yes = rt->qapi->converts(rt->quant, &owner->t, &why);
        owner->t.flags |= CT_TENSOR_QUANT_DECIDED | (yes ? CT_TENSOR_QUANTIZED : 0);
        quant_note(rt, owner->t.name, yes, why);
    }
    return (owner->t.flags & CT_TENSOR_QUANTIZED) != 0;
}

void quantize_decide_linears(runtime *rt) {
    for (int i = 0; i < rt->n_params; i++) {
        ct_tensor *w = &rt->params[i]->t;
        if (!(w->flags & CT_TENSOR_LINEAR)) continue; /* others are decided when a linear first uses them */
        const char *why = "";
        int yes = rt->qapi->converts(rt->quant, w, &why);
        w->flags |= CT_TENSOR_QUANT_DECIDED | (yes ? CT_TENSOR_QUANTIZED : 0);
        quant_note(rt, w->name, yes, why);
    }
}

/* ---- the quantizer's GEMMs, as the tape runs them (tape.h) ---- */

/* One of the six calls, by half and by whether it is grouped (offsets set). */
static ct_status q_run(runtime *rt, const tape_gemm_call *c) {
    const ct_quantizer_api *q = rt->qapi;
    ct_quantizer *h = rt->quant;
    if (c->offsets) switch (c->half) {
        case TAPE_GEMM_FORWARD: return q->grouped_forward(h, c->out, c->a, c->b, c->offsets, c->n, c->e, c->o, c->i);
        case TAPE_GEMM_INPUT: return q->grouped_backward_input(h, c->out, c->a, c->b, c->offsets, c->n, c->e, c->o, c->i);
        case TAPE_GEMM_WEIGHT: return q->grouped_backward_weight(h, c->out, c->a, c->b, c->offsets, c->n, c->e, c->o, c->i);
        }
    switch (c->half) {
    case TAPE_GEMM_FORWARD: return q->forward(h, c->out, c->a, c->b, c->n, c->o, c->i);
    case TAPE_GEMM_INPUT: return q->backward_input(h, c->out, c->a, c->b, c->n, c->o, c->i);
    case TAPE_GEMM_WEIGHT: return q->backward_weight(h, c->out, c->a, c->b, c->n, c->o, c->i);
    }
    return ct_fail(CT_ERR_INTERNAL, "quantizer: no GEMM half %d", (int)c->half);
}
/* The planner's costs of a converted weight (ABI 2.2 plan_linear). */
static ct_status q_plan(runtime *rt, const ct_tensor *w, int64_t n, ct_quant_cost *cost) {
    return rt->qapi->plan_linear(rt->quant, w, n, cost);
}

static const tape_gemm priced = {"quantizer", q_run, q_plan};
/* A quantizer without plan_linear: the planner prices its GEMMs at the unconverted rate and says so. */
static const tape_gemm unpriced = {"quantizer", q_run, NULL};

static const tape_gemm *gemm_of(const runtime *rt) {
    const ct_quantizer_api *q = rt->qapi;
    return CT_HAS_FIELD(q, ct_quantizer_api, plan_linear) && q->plan_linear ? &priced : &unpriced;
}

/* ---- the layer's ops (b->ctx is the runtime; the host's builder is below) ---- */

static ct_tensor *q_linear(ct_builder *b, ct_tensor *x, ct_tensor *w) {
    runtime *rt = b->ctx;
    ct_builder *next = tape_layer_next(b);
    if (!x || !w || w->dtype != CT_F32 || !quant_converts(rt, w)) return next->linear(next, x, w); /* (it says what is wrong) */
    return tape_linear_gemm(rt, x, w, gemm_of(rt));
}

/* A converted head is the two ops (the host's fused loss computes its logits on the device's GEMM). */
static ct_tensor *q_linear_cross_entropy(ct_builder *b, ct_tensor *x, ct_tensor *w, const ct_tensor *targets) {
    runtime *rt = b->ctx;
    ct_builder *next = tape_layer_next(b);
    if (!x || !w || w->dtype != CT_F32 || !quant_converts(rt, w))
        return next->linear_cross_entropy(next, x, w, targets);
    ct_tensor *y = tape_linear_gemm(rt, x, w, gemm_of(rt));
    return y ? next->cross_entropy(next, y, targets) : NULL;
}

static ct_tensor *q_moe_experts(ct_builder *b, ct_tensor *x, const ct_tensor *offsets, ct_tensor *w1, ct_tensor *w3,
                                ct_tensor *w2) {
    runtime *rt = b->ctx;
    ct_builder *next = tape_layer_next(b);
    if (!w1 || !w3 || !w2 || w1->ndim != 3 || w3->ndim != 3 || w2->ndim != 3 || !quant_grouped(rt))
        return next->moe_experts(next, x, offsets, w1, w3, w2);
    const tape_gemm *g = gemm_of(rt), *gemm[3];
    gemm[0] = quant_converts(rt, w1) ? g : NULL; /* asked (and reported) in this order: w1, w3, w2 */
    gemm[1] = quant_converts(rt, w3) ? g : NULL;
    gemm[2] = quant_converts(rt, w2) ? g : NULL;
    if (!gemm[0] && !gemm[1] && !gemm[2]) return next->moe_experts(next, x, offsets, w1, w3, w2);
    return tape_moe_experts_gemm(rt, x, offsets, w1, w3, w2, gemm);
}

ct_builder *quantize_layer_new(runtime *rt, ct_builder *next) {
    ct_builder *b = tape_layer_new(rt, next);
    if (!b) return NULL;
    b->ctx = rt;
    b->linear = q_linear;
    b->linear_cross_entropy = q_linear_cross_entropy;
    b->moe_experts = q_moe_experts;
    return b;
}
