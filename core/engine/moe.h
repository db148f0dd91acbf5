/* moe.h: the builder's mixture-of-experts ops and the auxiliary-loss channel (ABI 2.15). See moe.c. */
#ifndef CT_MOE_H
#define CT_MOE_H

#include "engine/runtime.h"
#include "engine/tape.h"

/* ct_builder.moe, moe_experts and aux_loss of the host's builder (b->ctx is the runtime). */
ct_tensor *tape_moe(ct_builder *b, ct_tensor *x, const ct_moe_layer *layer);
ct_tensor *tape_moe_experts(ct_builder *b, ct_tensor *x, const ct_tensor *offsets, ct_tensor *w1, ct_tensor *w3,
                            ct_tensor *w2);
/* moe_experts with the grouped GEMMs of w1, w3 and w2 run by gemm[0], [1], [2] (tape.h; NULL: the
 * device's), recorded on the host's builder as the device's are: what a builder layer that runs some
 * experts' GEMMs itself (quantize.c) calls. */
ct_tensor *tape_moe_experts_gemm(runtime *rt, ct_tensor *x, const ct_tensor *offsets, ct_tensor *w1, ct_tensor *w3,
                                 ct_tensor *w2, const tape_gemm *const gemm[3]);
ct_tensor *tape_aux_loss(ct_builder *b, ct_tensor *x, ct_tensor *loss);
/* ABI 2.17: ct_builder.all_to_all_v of the host's builder. */
ct_tensor *tape_all_to_all_v(ct_builder *b, ct_tensor *x, int axis, const int64_t *send_rows, const int64_t *recv_rows);
/* The microbatch's loss scale (1 / global valid tokens), which aux_loss gives each auxiliary loss in
 * backward; called before each microbatch (or pipeline step). */
void runtime_moe_set_loss_scale(runtime *rt, float scale);
/* *aux = the auxiliary losses summed over the microbatches since the last call (not yet normalised),
 * and the sum restarted. CT_OK, or the device's status. */
ct_status runtime_take_aux(runtime *rt, double *aux);
/* The moe call sites' per-expert counts for post_step: *n of them (*loads the runtime's, valid until
 * the next call; 0 when none). CT_OK, or CT_ERR_NOMEM with the error set. */
ct_status runtime_moe_loads(runtime *rt, const ct_moe_load **loads, int *n);
ct_status runtime_moe_zero_counts(runtime *rt);
void runtime_moe_free(runtime *rt);

#endif
