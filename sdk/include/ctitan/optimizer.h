/* ctitan/optimizer.h: the optimizer interface (plugin kind CT_KIND_OPTIMIZER).
 *
 * The host owns the learning-rate schedule, gradient clipping and all memory: it asks how many
 * f32 state values the optimizer keeps per parameter element, allocates them (zeroed, counted as
 * optimizer memory, on the same shard as the parameter) and calls `step` once per parameter
 * tensor with the already clipped gradient in param->grad. The optimizer computes with the
 * device's ops (it is handed the device API at create time).
 *
 * Manifest: the `optimizer` section's `name` and `lr` belong to the host; every other key is the
 * plugin's own option (declared in its ct_option_spec list), e.g. beta1, beta2, eps, weight_decay.
 */
#ifndef CTITAN_OPTIMIZER_H
#define CTITAN_OPTIMIZER_H

#include "ctitan/abi.h"
#include "ctitan/device.h"
#include "ctitan/host.h"
#include "ctitan/tensor.h"

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
} ct_optimizer_api;

#endif
