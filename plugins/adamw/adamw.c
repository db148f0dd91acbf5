/* adamw.c: the AdamW optimizer (decoupled weight decay, PyTorch's formula) on the device's op.
 * Norm weights and biases (CT_TENSOR_NO_DECAY) get no weight decay. With implementation
 * fused_opt_states_bf16 (torchtitan's name) the two moments are held in bf16, packed in one
 * 32-bit state per element (device.h adamw_bf16_moments, ABI 2.10): half the optimizer's memory,
 * parameters and gradients still f32. */
#include "ctitan/optimizer.h"

#include <stdlib.h>
#include <string.h>

typedef struct ct_optimizer { /* the ABI's opaque ct_optimizer */
    const ct_host *host;
    const ct_device_api *d;
    ct_device *dev;
    double beta1, beta2, eps, weight_decay;
    int bf16_moments; /* implementation fused_opt_states_bf16 */
} adamw;

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "beta1", CT_OPT_FLOAT, "0.9", "first-moment decay", NULL, NULL},
    {sizeof(ct_option_spec), "beta2", CT_OPT_FLOAT, "0.95", "second-moment decay", NULL, NULL},
    {sizeof(ct_option_spec), "eps", CT_OPT_FLOAT, "1e-8", "denominator epsilon", NULL, NULL},
    {sizeof(ct_option_spec), "weight_decay", CT_OPT_FLOAT, "0.1", "decoupled weight decay", NULL, NULL},
    {sizeof(ct_option_spec), "implementation", CT_OPT_STRING, "fused",
     "fused | foreach | for-loop (one kernel per tensor here) | fused_opt_states_bf16 (moments held in bf16)", NULL,
     NULL},
    {0},
};

static ct_status adamw_create(const ct_host *h, const ct_device_api *d, ct_device *dev, ct_optimizer **out) {
    adamw *a = calloc(1, sizeof *a);
    if (!a) return CT_ERR_NOMEM;
    *a = (adamw){h, d, dev, 0.9, 0.95, 1e-8, 0.1, 0};
    ct_status st = h->opt_float(h, "beta1", &a->beta1);
    if (!st) st = h->opt_float(h, "beta2", &a->beta2);
    if (!st) st = h->opt_float(h, "eps", &a->eps);
    if (!st) st = h->opt_float(h, "weight_decay", &a->weight_decay);
    if (st) {
        free(a);
        return st;
    }
    /* each error starts with its key, so the host reports it where the key was set */
    const char *impl = "fused";
    h->opt_string(h, "implementation", &impl);
    if (!(a->beta1 >= 0 && a->beta1 < 1)) h->set_error(h, "beta1: expected 0 <= beta1 < 1, got %g", a->beta1);
    else if (!(a->beta2 >= 0 && a->beta2 < 1)) h->set_error(h, "beta2: expected 0 <= beta2 < 1, got %g", a->beta2);
    else if (!(a->eps > 0 && a->eps <= 1)) h->set_error(h, "eps: expected 0 < eps <= 1, got %g", a->eps);
    else if (!(a->weight_decay >= 0 && a->weight_decay <= 1e3))
        h->set_error(h, "weight_decay: expected 0 <= weight_decay <= 1000, got %g", a->weight_decay);
    else if (strcmp(impl, "fused") && strcmp(impl, "foreach") && strcmp(impl, "for-loop") &&
             strcmp(impl, "fused_opt_states_bf16"))
        h->set_error(h, "implementation: expected fused, foreach, for-loop or fused_opt_states_bf16, got '%s'", impl);
    else if (!strcmp(impl, "fused_opt_states_bf16") && d &&
             !(CT_HAS_FIELD(d, ct_device_api, adamw_bf16_moments) && d->adamw_bf16_moments))
        h->set_error(h, "implementation: fused_opt_states_bf16 needs a device with adamw_bf16_moments (ABI 2.10)");
    else {
        a->bf16_moments = !strcmp(impl, "fused_opt_states_bf16");
        *out = a;
        return CT_OK;
    }
    free(a);
    return CT_ERR_INVALID;
}

static void adamw_destroy(ct_optimizer *p) { free(p); }
static int adamw_state_count(ct_optimizer *p) {
    return ((adamw *)p)->bf16_moments ? 1 : 2; /* bf16 moments: both in one 32-bit word */
}

static ct_status adamw_step(ct_optimizer *p, ct_tensor *param, float *const *state, int64_t numel, float lr,
                            int64_t step) {
    adamw *a = p;
    float wd = (param->flags & CT_TENSOR_NO_DECAY) ? 0.0f : (float)a->weight_decay;
    if (a->bf16_moments)
        return a->d->adamw_bf16_moments(a->dev, param->data, param->grad, (uint32_t *)state[0], numel, lr,
                                        (float)a->beta1, (float)a->beta2, (float)a->eps, wd, step);
    return a->d->adamw(a->dev, param->data, param->grad, state[0], state[1], numel, lr, (float)a->beta1,
                       (float)a->beta2, (float)a->eps, wd, step);
}

static int adamw_elementwise(ct_optimizer *p) {
    (void)p;
    return 1; /* PyTorch's AdamW is elementwise: contiguous tensors with one decay flag go in one call */
}

/* For the planner (ABI 2.2): the device's adamw op reads p, g, m and v and writes p, m and v once per
 * element (7 f32; with bf16 moments p, g and the moments' word read, p and the word written: 5), with
 * 14 FLOPs (m: 3, v: 4, the decayed step over sqrt(v) / bc2 + eps: 7). Needs no device, so a
 * planning instance (dapi NULL) answers too. */
static ct_status adamw_plan_step(ct_optimizer *p, const ct_param_slot *slot, ct_optimizer_cost *cost) {
    double n = (double)slot->local_numel;
    cost->bytes = (((adamw *)p)->bf16_moments ? 5 : 7) * sizeof(float) * n;
    cost->flops = 14 * n;
    cost->matmul_flops = 0;
    cost->comm_bytes = 0;
    return CT_OK;
}

static const ct_optimizer_api api = {
    .struct_size = sizeof(ct_optimizer_api),
    .create = adamw_create,
    .destroy = adamw_destroy,
    .state_count = adamw_state_count,
    .step = adamw_step,
    .elementwise = adamw_elementwise,
    .plan_step = adamw_plan_step,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_OPTIMIZER;
    info->name = "adamw";
    info->description = "AdamW (PyTorch formula; no weight decay on norms and biases)";
    info->options = options;
    info->api = &api;
    return CT_OK;
}
