/* tape.h: builder ops (recorded) and backward replay. See tape.c. */
#ifndef CT_TAPE_H
#define CT_TAPE_H

#include "engine/runtime.h"

typedef enum op_kind {
    OP_LINEAR, OP_BIAS, OP_EMBEDDING, OP_RMSNORM, OP_LAYERNORM, OP_ROPE, OP_ATTENTION,
    OP_SWIGLU, OP_GELU, OP_ADD, OP_CROSS_ENTROPY,
    OP_COLLECTIVE, /* ct_builder.collective: over a mesh axis, with its conjugate in backward */
    OP_CUSTOM,     /* ct_builder.custom: a strategy's own forward and backward */
    OP_LINEAR_XENT /* ct_builder.linear_cross_entropy under bf16 compute: the head's loss in blocks */
} op_kind;

/* Which halves of the backward to run: input gradients, weight gradients, or both. */
#define TAPE_INPUT 1
#define TAPE_WEIGHT 2
#define TAPE_BOTH 3

/* Fills rt->builder with the ops. */
void tape_builder_init(runtime *rt);
/* A fresh activation tensor in the arena the builder currently writes to. */
rt_tensor *tape_new_activation(runtime *rt, ct_dtype dt, int ndim, const int64_t *shape);
/* t's gradient buffer (allocated zeroed on first use where rt->grad_pool says). */
float *tape_grad(runtime *rt, rt_tensor *t);
/* The same, allocated in pool p on first use. */
float *tape_grad_in(runtime *rt, rt_tensor *t, pool *p);
/* GEMMs that run a linear, or the MoE experts' grouped linears, in place of the device's: what a
 * builder layer hands the tape's own linear op (tape_linear_gemm) and the experts' (moe.h,
 * tape_moe_experts_gemm), which record and replay them like the device's (selective checkpointing,
 * liveness and the planner's trace see the same linear). quantize.c's run the quantizer. */
typedef enum tape_gemm_half {
    TAPE_GEMM_FORWARD, /* out (n, o) = a (n, i) @ b (o, i)^T: a = x, b = w */
    TAPE_GEMM_INPUT,   /* out (n, i) += a (n, o) @ b (o, i): a = dy, b = w */
    TAPE_GEMM_WEIGHT   /* out (o, i) += a (n, o)^T @ b (n, i): a = dy, b = x */
} tape_gemm_half;
/* One GEMM: the shapes above, per expert segment where offsets is set (w (e, o, i), rows offsets[g] ..
 * offsets[g+1] of the (n, .) activations expert g's, offsets (e+1) int32 in device memory: the
 * quantizer's grouped calls, ABI 2.24); offsets NULL: a linear's (e 1). */
typedef struct tape_gemm_call {
    tape_gemm_half half;
    float *out;
    const float *a, *b;
    const int32_t *offsets;
    int64_t n, e, o, i;
} tape_gemm_call;
/* run: CT_OK or a status (with the error set, or the tape names `name` and the half). plan: on a
 * planning runtime, the costs of the GEMMs of weight w over n rows (grouped: all segments'); NULL: the
 * planner prices them at the unconverted rate and says so. Nothing but plan is called while planning. */
typedef struct tape_gemm {
    const char *name; /* who runs them, for errors and the planner's assumptions */
    ct_status (*run)(runtime *rt, const tape_gemm_call *c);
    ct_status (*plan)(runtime *rt, const ct_tensor *w, int64_t n, ct_quant_cost *cost);
} tape_gemm;
/* The tape's linear, x (..., in) @ w (out, in)^T, with its GEMMs run by g (NULL: the device's matmul,
 * which is ct_builder.linear of the host's builder). Recorded as the same linear op either way. */
ct_tensor *tape_linear_gemm(runtime *rt, ct_tensor *x, ct_tensor *w, const tape_gemm *g);
/* g runs c: CT_OK, or its status with a message naming g and the half where it left none. */
ct_status tape_gemm_run(runtime *rt, const tape_gemm *g, const tape_gemm_call *c);
/* A builder layer for an operation-level strategy: every op forwards to `next` until the strategy
 * replaces it (ct_strategy_api.wrap_builder). Freed with tape_layer_free. */
ct_builder *tape_layer_new(runtime *rt, ct_builder *next);
void tape_layer_free(ct_builder *b);
/* The builder below a layer tape_layer_new made. */
ct_builder *tape_layer_next(ct_builder *b);
/* Frees rope_freqs' device tables (runtime_free). */
void tape_rope_tables_free(runtime *rt);
/* Replays entries from `tail` back to the first, accumulating gradients. CT_OK, or the status of the
 * op's backward that failed (the device's, the comm's, a custom op's) with the error set. */
/* buf (count floats, device memory) summed in place over a mesh axis's ranks, timed and counted as
 * the tape's collectives are (planning: only noted): CT_OK or the comm's status, its error set. */
ct_status tape_axis_all_reduce(runtime *rt, int axis, float *buf, int64_t count);
ct_status tape_backward(runtime *rt, tape_entry *tail, int halves);
/* After a recompute in a pool in heap mode: gives back what the tape made there that no op's
 * backward reads (nothing when a custom op keeps tensors the tape cannot see). */
void tape_drop_unread(runtime *rt, tape_entry *tail);
/* Gives t's data back to the pool in heap mode it came from (nothing for a view or a tensor
 * allocated outside heap mode); its descriptor stays. */
void tape_give_back_data(rt_tensor *t);
/* For liveness.c, over a pass of n allocations: per allocation the last op that reads or makes it
 * (dies_after, raised) and whether a backward reads it (bwd). Returns 1 when a custom op hides
 * tensors (the scan stops: nothing is known), else 0; not a status. */
int tape_live_scan(runtime *rt, tape_entry *tail, int *dies_after, unsigned char *bwd, int n);
/* The planner's trace (forward only): `elements` f32 activations packed to bf16 and expanded in
 * backward, or (in_place) rounded where they are. CT_OK, or a status with the error set. */
ct_status tape_note_cast(runtime *rt, int64_t elements, int in_place);
/* Calls fn on every tensor entries from `tail` back hold (aux 1: saved statistics, kept exact);
 * returns 1 when a custom op's forward made activations it did not return (nothing may move), else 0
 * (a predicate, not a status). */
int tape_visit(tape_entry *tail, void (*fn)(void *ctx, rt_tensor *t, int aux), void *ctx);

#endif
