/* trace.c: the notes the tape makes on a planning runtime: each op of one microbatch's forward with
 * its shapes, FLOPs and memory traffic, and each collective, forward or backward. The bytes an op
 * keeps are not noted here: the driver (plan.c) reads them off the tape's own arenas. */
#include "plan/plan_internal.h"

#include "host/host.h"
#include "engine/mesh.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F32 4.0

static plan_op *next_op(runtime *rt) {
    plan_trace *t = rt->trace;
    if (t->n_ops == t->cap_ops) {
        int cap = t->cap_ops ? t->cap_ops * 2 : 256;
        plan_op *grown = realloc(t->ops, sizeof *grown * (size_t)cap);
        if (!grown) {
            ct_set_error("out of memory for the plan's trace");
            return NULL;
        }
        t->ops = grown;
        t->cap_ops = cap;
    }
    plan_op *o = &t->ops[t->n_ops++];
    memset(o, 0, sizeof *o);
    o->unit = rt->cur_unit;
    return o;
}

static plan_trace_state *state_of(runtime *rt) { return (plan_trace_state *)rt->trace->state; }

ct_status plan_note_op(runtime *rt, int kind, int64_t s0, int64_t s1, int64_t s2, int64_t s3, int kv_heads,
                       int sac_keep) {
    plan_op *o = next_op(rt);
    if (!o) return CT_ERR_NOMEM;
    o->kind = kind;
    o->shape[0] = s0, o->shape[1] = s1, o->shape[2] = s2, o->shape[3] = s3;
    o->kv_heads = kv_heads;
    o->sac_keep = sac_keep;
    o->dtype = PLAN_F32;
    double a = (double)s0, b = (double)s1;
    switch (kind) {
    case RT_OP_ATTENTION: { /* causal: half of the score matrix; backward recomputes the scores */
        double bh = a * (double)s2, t = b, d = (double)s3, kv = (double)kv_heads;
        /* block-causal over documents of mean length L: t (L + 1) / 2 visible pairs, not t (t + 1) / 2 */
        double L = rt->attn_doc_len, pairs = L > 0 && L < t ? (L + 1) / (t + 1) : 1;
        o->dtype = state_of(rt)->matmul_dtype;
        o->flops[0] = 2.0 * bh * t * t * d * pairs;
        o->flops[1] = 2.5 * o->flops[0];
        o->bytes[0] = F32 * (2.0 * a * t * (double)s2 * d + 2.0 * a * t * kv * d + bh * t);
        o->bytes[1] = 2.0 * o->bytes[0];
        break;
    }
    case RT_OP_EMBEDDING: o->bytes[0] = o->bytes[1] = F32 * 2.0 * a * b; break;
    case RT_OP_RMSNORM:
    case RT_OP_LAYERNORM:
        o->bytes[0] = F32 * (2.0 * a * b + a + b);
        o->bytes[1] = F32 * (4.0 * a * b + a + b);
        break;
    case RT_OP_ROPE: {
        double n = a * b * (double)s2 * (double)s3;
        o->bytes[0] = o->bytes[1] = F32 * 2.0 * n;
        break;
    }
    case RT_OP_SWIGLU: o->bytes[0] = F32 * 3.0 * a, o->bytes[1] = F32 * 5.0 * a; break;
    case RT_OP_GELU: o->bytes[0] = F32 * 2.0 * a, o->bytes[1] = F32 * 3.0 * a; break;
    case RT_OP_ADD: o->bytes[0] = F32 * 3.0 * a, o->bytes[1] = F32 * 5.0 * a; break;
    case RT_OP_BIAS: o->bytes[0] = F32 * 2.0 * a * b, o->bytes[1] = F32 * 4.0 * a * b; break;
    case RT_OP_XENT: o->bytes[0] = F32 * 2.0 * a * b, o->bytes[1] = F32 * 3.0 * a * b; break;
    case RT_OP_CAST: /* 4 bytes read and 2 written per element each way; rounding: 4 and 4, once */
        o->bytes[0] = s1 ? 2.0 * F32 * a : 1.5 * F32 * a;
        o->bytes[1] = s1 ? 0 : 1.5 * F32 * a;
        break;
    default: break;
    }
    return CT_OK;
}

/* A converted GEMM's own memory: what it keeps per microbatch and per weight, its largest temporaries. */
static void plan_note_gemm_memory(runtime *rt, const ct_quant_cost *c) {
    plan_trace_state *ps = state_of(rt);
    ps->float8_saved += c->saved_bytes;
    ps->float8_weights += c->weight_bytes;
    if (c->scratch_bytes > ps->float8_scratch) ps->float8_scratch = c->scratch_bytes;
}

ct_status plan_note_linear(runtime *rt, const rt_tensor *w, int64_t n, int64_t in, int64_t out, const tape_gemm *g,
                           int sac_keep) {
    plan_trace_state *ps = state_of(rt);
    plan_op *o = next_op(rt);
    if (!o) return CT_ERR_NOMEM;
    o->kind = RT_OP_GEMM;
    o->shape[0] = n, o->shape[1] = in, o->shape[2] = out;
    o->sac_keep = sac_keep;
    o->name = w->t.name;
    o->dtype = ps->matmul_dtype;
    o->flops[0] = 2.0 * (double)n * (double)in * (double)out;
    o->flops[1] = 2.0 * o->flops[0];
    if (!g) return CT_OK; /* the device's matmul */
    if (!g->plan) {
        if (!strstr(ps->assumptions, "plan_linear"))
            snprintf(ps->assumptions + strlen(ps->assumptions), sizeof ps->assumptions - strlen(ps->assumptions),
                     "%sthe %s has no plan_linear: its GEMMs are planned at the unconverted rate, with no "
                     "memory of its own", ps->assumptions[0] ? "; " : "", g->name);
        return CT_OK;
    }
    ct_quant_cost c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.gemm_dtype = CT_F32;
    ct_clear_error();
    ct_status st = g->plan(rt, &w->t, n, &c);
    if (st != CT_OK) {
        if (!ct_last_error()[0]) ct_set_error("the %s's plan_linear failed for %s", g->name, w->t.name);
        return st;
    }
    o->dtype = c.gemm_dtype == CT_F8_E4M3 || c.gemm_dtype == CT_F8_E5M2 ? PLAN_FP8
               : c.gemm_dtype == CT_BF16                               ? PLAN_BF16
                                                                       : ps->matmul_dtype;
    o->bytes[0] = c.cast_bytes[0];
    o->bytes[1] = c.cast_bytes[1];
    plan_note_gemm_memory(rt, &c);
    return CT_OK;
}

ct_status plan_note_comm(runtime *rt, int axis, ct_collective kind, double bytes, int overlapped) {
    if (!rt->trace_ops || (rt->trace_ops == 2 && !rt->in_backward)) return CT_OK; /* a recompute's: eval adds those */
    plan_op *o = next_op(rt);
    if (!o) return CT_ERR_NOMEM;
    o->kind = RT_OP_COLLECTIVE;
    o->axis = axis;
    o->coll_kind = kind;
    o->coll_bytes = bytes;
    o->coll_calls = 1;
    o->phase = rt->trace_ops;
    o->overlapped = overlapped;
    o->shape[0] = rt->dist.mesh ? mesh_shard_degree(rt->dist.mesh, axis) : 1;
    return CT_OK;
}

ct_status plan_custom(runtime *rt, const ct_custom_op *op, void *state, ct_tensor *const *in, int n_in, ct_tensor **out,
                      int n_out) {
    if (!CT_HAS_FIELD(op, ct_custom_op, plan) || !op->plan) {
        ct_set_error("custom op %s has no plan callback (ABI 2.2 ct_custom_op.plan), so a run that uses it cannot "
                     "be planned", op->name ? op->name : "?");
        if (rt->trace) snprintf(rt->trace->cannot, sizeof rt->trace->cannot, "%s", ct_last_error());
        return CT_ERR_UNSUPPORTED;
    }
    ct_op_cost c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.matmul_dtype = CT_F32;
    ct_status st = op->plan(&rt->builder, state, in, n_in, out, n_out, &c);
    rt->plan_bwd_scratch = c.backward_scratch > 0 ? c.backward_scratch : 0; /* the tape keeps it with the op */
    if (st != CT_OK || rt->trace_ops != 1) return st;
    plan_op *o = next_op(rt);
    if (!o) return CT_ERR_NOMEM;
    o->kind = RT_OP_CUSTOM;
    o->name = op->name;
    o->dtype = c.matmul_dtype == CT_F8_E4M3 || c.matmul_dtype == CT_F8_E5M2 ? PLAN_FP8
               : c.matmul_dtype == CT_BF16                                 ? PLAN_BF16
                                                                           : state_of(rt)->matmul_dtype;
    o->flops[0] = c.matmul_flops[0], o->flops[1] = c.matmul_flops[1];
    o->attn_flops[0] = c.attention_flops[0], o->attn_flops[1] = c.attention_flops[1]; /* zeroed when a 2.2 op leaves it */
    o->bytes[0] = c.bytes[0], o->bytes[1] = c.bytes[1];
    for (int i = 0; i < c.n_comm && i < 4; i++) {
        plan_op *k = next_op(rt);
        if (!k) return CT_ERR_NOMEM;
        k->kind = RT_OP_COLLECTIVE;
        k->axis = c.comm[i].axis;
        k->coll_kind = c.comm[i].kind;
        k->coll_bytes = c.comm[i].bytes;
        k->coll_calls = c.comm[i].calls > 1 ? c.comm[i].calls : 1;
        k->phase = c.comm[i].phase == 2 ? 2 : 1;
        k->overlapped = c.comm[i].overlapped;
        k->name = op->name;
        k->shape[0] = rt->dist.mesh ? mesh_shard_degree(rt->dist.mesh, k->axis) : 1; /* (ep: the core's all_to_all_v) */
    }
    return CT_OK;
}

static void plan_note_refwd(runtime *rt) { rt->trace->ops[rt->trace->n_ops - 1].bwd_refwd = 1; }

const rt_observer plan_observer = {plan_note_op,     plan_note_linear, plan_note_comm,
                                   plan_note_refwd, plan_custom,      plan_note_gemm_memory};
