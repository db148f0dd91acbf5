/* observer.h: what the tape tells an observer about each op it records, so a planner can price a run
 * without the tape knowing the planner (core/plan sets runtime.observer on its planning runtime).
 *
 * The tape calls these only on a runtime with `planning` set: while `trace_ops` is 1 (the traced
 * forward pass) or 2 (the traced backward, recomputes included) for op, linear and comm, and for
 * every custom op in place of its forward. Each returns CT_OK, or a status with the error set.
 */
#ifndef CT_ENGINE_OBSERVER_H
#define CT_ENGINE_OBSERVER_H

#include <stdint.h>

#include "ctitan/model.h"

typedef enum rt_op_kind {
    RT_OP_GEMM = 0,   /* shape: m, k, n (x (m,k) @ w(n,k)^T), dtype by the quantizer */
    RT_OP_ATTENTION,  /* shape: batch, seq, heads, head_dim (kv heads in shape? no: see kv_heads) */
    RT_OP_EMBEDDING,  /* shape: tokens, dim, vocab rows */
    RT_OP_RMSNORM,    /* shape: rows, cols */
    RT_OP_LAYERNORM,
    RT_OP_ROPE,       /* shape: batch, seq, heads, head_dim */
    RT_OP_SWIGLU,     /* shape: elements */
    RT_OP_GELU,
    RT_OP_ADD,
    RT_OP_BIAS,
    RT_OP_XENT,       /* shape: rows, vocab */
    RT_OP_CAST,       /* bf16-held activations (actpack.c): f32 elements, 0 packed (forward) and
                           expanded (backward) or 1 rounded where they are (forward only) */
    RT_OP_CUSTOM,     /* a strategy's custom op: costs from its plan callback */
    RT_OP_COLLECTIVE, /* builder collective: axis, kind, bytes */
    RT_OP_NKINDS
} rt_op_kind;

struct runtime;
struct rt_tensor;
struct tape_gemm;
struct ct_quant_cost;

typedef struct rt_observer {
    /* an op of kind rt_op_kind with its shape (see the kinds), kv heads (attention) and whether
     * selective checkpointing keeps its output */
    ct_status (*op)(struct runtime *rt, int kind, int64_t s0, int64_t s1, int64_t s2, int64_t s3, int kv_heads,
                    int sac_keep);
    /* a linear of weight w: n rows of in -> out features, on the device's matmul (gemm NULL) or on the
     * GEMMs a builder layer handed the tape (tape.h: the quantizer's), which price themselves */
    ct_status (*linear)(struct runtime *rt, const struct rt_tensor *w, int64_t n, int64_t in, int64_t out,
                        const struct tape_gemm *gemm, int sac_keep);
    /* a collective the tape would run now (bytes: the whole gathered or reduced buffer) */
    ct_status (*comm)(struct runtime *rt, int axis, ct_collective kind, double bytes, int overlapped);
    /* the op just noted runs its forward again in backward (a fused loss recomputes its GEMM) */
    void (*refwd)(struct runtime *rt);
    /* a custom op on a planning builder: its plan callback instead of forward; sets
     * rt->plan_bwd_scratch to the op's backward scratch */
    ct_status (*custom)(struct runtime *rt, const ct_custom_op *op, void *state, ct_tensor *const *in, int n_in,
                        ct_tensor **out, int n_out);
    /* the memory of GEMMs a builder layer handed an op that prices them itself (moe.c's grouped linear:
     * the quantizer's saved bytes, cached weight casts and scratch), as linear counts a linear's */
    void (*gemm_memory)(struct runtime *rt, const struct ct_quant_cost *cost);
} rt_observer;

#endif
