/* ctitan/optimizer.h: the optimizer interface (plugin kind CT_KIND_OPTIMIZER).
 *
 * The host owns the learning-rate schedule, gradient clipping and all memory: it asks how many
 * f32 state values the optimizer keeps per parameter element, allocates them (zeroed, counted as
 * optimizer memory, on the same shard as the parameter's local storage) and, once per step, after
 * every gradient reduction and the clipping, calls the optimizer on this rank's local storage only.
 * The optimizer computes with the device's ops (it is handed the device API at create time).
 *
 * What it is called with, in order of preference:
 *   step_param (2.1): one call per parameter this rank stores, with its slot (ctitan/strategy.h):
 *       the real block shape (slot->param->ndim / shape), the whole parameter's global_shape, the
 *       split an axis strategy made (split_axis/dim/parts/index) and the flat shard this rank
 *       stores (placement, shard_axis, offset, local_numel), the local data and gradient
 *       (slot->local_data, slot->local_grad). With `attach`'s mesh and comm the optimizer can
 *       gather a whole matrix (Muon's orthogonalisation does). On one rank the slot is whole.
 *   step: with a flat 1-D view of local storage (param->shape = {numel}); when `elementwise` says
 *       so, one call covers parameters stored back to back.
 *
 * Manifest: the `optimizer` section's `name` and `lr` belong to the host; every other key is the
 * plugin's own option (declared in its ct_option_spec list), e.g. beta1, beta2, eps, weight_decay.
 */
#ifndef CTITAN_OPTIMIZER_H
#define CTITAN_OPTIMIZER_H

#include "ctitan/abi.h"
#include "ctitan/device.h"
#include "ctitan/host.h"
#include "ctitan/strategy.h"
#include "ctitan/tensor.h"

/* ABI 2.1: what `attach` hands over on many ranks (every pointer the host's, valid until destroy). */
typedef struct ct_optimizer_env {
    size_t struct_size;
    const ct_comm_api *capi;
    ct_comm *comm;
    const ct_mesh_info *mesh; /* its groups reach every axis a slot is split or sharded over */
} ct_optimizer_env;

/* ABI 2.2: what one step_param (or step) of a slot costs, for the planner (plan_step). */
typedef struct ct_optimizer_cost {
    size_t struct_size;
    double bytes;        /* memory traffic: parameter, gradient and states read and written */
    double flops;        /* elementwise FLOPs */
    double matmul_flops; /* GEMM FLOPs (Muon's Newton-Schulz iterations) */
    double comm_bytes;   /* bytes the optimizer moves itself over the slot's shard axis (gathers) */
} ct_optimizer_cost;

typedef struct ct_optimizer_api {
    size_t struct_size;
    /* dapi and dev are the host's and outlive the optimizer (it may keep them). *opt is the host's
     * until destroy. */
    ct_status (*create)(const ct_host *host, const ct_device_api *dapi, ct_device *dev,
                        ct_optimizer **opt);
    void (*destroy)(ct_optimizer *opt);
    /* f32 state values per parameter element (AdamW: 2, the moments). */
    int (*state_count)(ct_optimizer *opt);
    /* One update of `param` (data f32, grad f32, param->flags say CT_TENSOR_NO_DECAY).
     * state[i] points to numel f32 values on the device. step counts from 1. param, state and
     * their memory are the host's, lent for this call only. */
    ct_status (*step)(ct_optimizer *opt, ct_tensor *param, float *const *state, int64_t numel,
                      float lr, int64_t step);
    /* Optional: 1 when `step` treats every element alike (it reads only data, grad, numel
     * and the CT_TENSOR_NO_DECAY flag: AdamW, SGD). The host may then update parameters that lie
     * back to back in memory with the same CT_TENSOR_NO_DECAY in ONE call (the padding between them
     * included: it is zero in data, grad and state, and stays zero); the host stores the decayed
     * tensors first, so a step takes two calls. NULL or 0: one call per tensor (an optimizer that
     * needs each matrix's shape, like Muon). */
    int (*elementwise)(ct_optimizer *opt);
    /* ---- ABI 2.1, optional ---- */
    /* Called once after create when the run has more than one rank (never on one rank). */
    ct_status (*attach)(ct_optimizer *opt, const ct_optimizer_env *env);
    /* When set, used instead of step: one update of the parameter in `slot` (see the top of this
     * file). state[i]: slot->local_numel f32 values. Called on EVERY rank for every slot in the same
     * order (slots of another pipeline stage have local_numel 0: return at once), so the optimizer
     * may run collectives over the mesh's groups. Slot and state are lent for the call. */
    ct_status (*step_param)(ct_optimizer *opt, const ct_param_slot *slot, float *const *state, float lr,
                            int64_t step);
    /* ---- ABI 2.2, optional ---- */
    /* For the planner: what one update of this placed slot costs on this rank (slot->local_numel
     * elements; whole-matrix methods read slot->global_shape and the split). May be called on an
     * instance made with dapi and dev NULL: it must not touch the device. NULL: the planner assumes
     * (2 + 2 x state_count) x 4 bytes of traffic per element and no FLOPs, and says so. */
    ct_status (*plan_step)(ct_optimizer *opt, const ct_param_slot *slot, ct_optimizer_cost *cost);
} ct_optimizer_api;

#endif
