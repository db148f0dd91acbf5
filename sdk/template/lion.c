/* lion.c: a complete ctitan optimizer plugin, meant to be copied.
 *
 * Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"), the formula of
 * lion-pytorch and torch-optimizer:
 *
 *     c = beta1 * m + (1 - beta1) * g      the update's direction, interpolated with momentum
 *     p = p * (1 - lr * wd) - lr * sign(c) (decoupled weight decay; wd = 0 for CT_TENSOR_NO_DECAY)
 *     m = beta2 * m + (1 - beta2) * g      (m starts at 0)
 *
 * Build:  cc $(pkg-config --cflags ctitan-sdk) -shared -fPIC -o lion.so lion.c
 * Use:    optimizer: { name: ./lion.so, lr: 1e-4, beta1: 0.9, beta2: 0.99, weight_decay: 0.0 }
 *
 * What the host does and this file does not: the learning-rate schedule (lr arrives per step),
 * gradient clipping (param->grad is already clipped), all memory the optimizer keeps per element
 * (m is state[0], allocated zeroed by the host on the parameter's device and checkpointed with it).
 * Parameters and state live in device memory, so the update uses only the device's ops (the
 * elementwise ew_* ops of ABI 2.1), never a CPU loop: the same .so then runs on any device plugin
 * that has them.
 */
#include <ctitan/abi.h>
#include <ctitan/device.h>
#include <ctitan/host.h>
#include <ctitan/optimizer.h>
#include <ctitan/tensor.h>

/* c is computed in a scratch buffer of this many elements, a slice of the parameter at a time,
 * so the optimizer's own memory stays 16 MiB whatever the model's size. */
#define LION_CHUNK ((int64_t)1 << 22)

/* The plugin's manifest keys (the `optimizer` section's `name` and `lr` belong to the host). The
 * host checks every given value against the range, so create need not. */
static const ct_option_spec lion_options[] = {
    {sizeof(ct_option_spec), "beta1", CT_OPT_FLOAT, "0.9", "weight of the momentum in the update's sign", "[0, 1]",
     NULL},
    {sizeof(ct_option_spec), "beta2", CT_OPT_FLOAT, "0.99", "decay of the momentum", "[0, 1]", NULL},
    {sizeof(ct_option_spec), "weight_decay", CT_OPT_FLOAT, "0.0",
     "decoupled weight decay (not applied to CT_TENSOR_NO_DECAY tensors)", "[0, inf)", NULL},
    {0},
};

/* The plugin's state. The API hands it back as an opaque `ct_optimizer *`; naming the struct
 * `ct_optimizer` makes that handle this struct, so no function needs a cast. */
typedef struct ct_optimizer {
    const ct_host *host;
    const ct_device_api *dapi;
    ct_device *dev;
    float beta1, beta2, weight_decay;
    float *c; /* (LION_CHUNK) device scratch */
} lion;

static ct_status lion_create(const ct_host *host, const ct_device_api *dapi, ct_device *dev, ct_optimizer **out) {
    /* A device API built before ABI 2.1, or one without the ops, ends before them or has NULLs.
     * No device at all: the planner's instance, which only answers plan_step. */
    if (dapi && (!CT_HAS_FIELD(dapi, ct_device_api, ew_sign) || !dapi->ew_axpby || !dapi->ew_sign)) {
        host->set_error(host, "the device has no ew_axpby/ew_sign ops (ABI 2.1)");
        return CT_ERR_UNSUPPORTED;
    }
    double beta1 = 0, beta2 = 0, weight_decay = 0;
    /* Every key has a default, so the getters only fail on a host bug. */
    if (host->opt_float(host, "beta1", &beta1) != CT_OK || host->opt_float(host, "beta2", &beta2) != CT_OK ||
        host->opt_float(host, "weight_decay", &weight_decay) != CT_OK) {
        host->set_error(host, "could not read options beta1/beta2/weight_decay");
        return CT_ERR_INTERNAL;
    }
    lion *s = host->mem_alloc(host, sizeof(*s), CT_MEM_OTHER);
    if (!s) {
        host->set_error(host, "out of memory for the optimizer state");
        return CT_ERR_NOMEM;
    }
    *s = (lion){host, dapi, dev, (float)beta1, (float)beta2, (float)weight_decay, NULL};
    if (!dapi) { /* planning: no scratch */
        *out = s;
        return CT_OK;
    }
    void *c = NULL;
    ct_status st = dapi->alloc(dev, LION_CHUNK * sizeof(float), &c);
    if (st != CT_OK) {
        host->mem_free(host, s); /* the device has said why through set_error */
        return st;
    }
    s->c = c;
    *out = s;
    return CT_OK;
}

static void lion_destroy(ct_optimizer *opt) {
    lion *s = opt;
    if (!s) return;
    if (s->c) s->dapi->free(s->dev, s->c); /* a planning instance has none */
    s->host->mem_free(s->host, s);
}

/* One f32 per parameter element: the momentum m. */
static int lion_state_count(ct_optimizer *opt) {
    (void)opt;
    return 1;
}

/* One slice of at most LION_CHUNK elements: p (n), g (n), m (n); c is the scratch. */
static ct_status lion_update(lion *s, float *p, const float *g, float *m, int64_t n, float lr, float wd) {
    const ct_device_api *d = s->dapi;
    float *c = s->c;
    ct_status st;
    /* c = sign(beta1 m + (1 - beta1) g) */
    if ((st = d->ew_axpby(s->dev, c, s->beta1, m, 1.0f - s->beta1, g, n)) != CT_OK) return st;
    if ((st = d->ew_sign(s->dev, c, c, n)) != CT_OK) return st;
    /* p = (1 - lr wd) p - lr c */
    if ((st = d->ew_axpby(s->dev, p, 1.0f - lr * wd, p, -lr, c, n)) != CT_OK) return st;
    /* m = beta2 m + (1 - beta2) g */
    return d->ew_axpby(s->dev, m, s->beta2, m, 1.0f - s->beta2, g, n);
}

static ct_status lion_step(ct_optimizer *opt, ct_tensor *param, float *const *state, int64_t numel, float lr,
                           int64_t step) {
    lion *s = opt;
    (void)step; /* Lion has no bias correction */
    if (param->dtype != CT_F32 || !param->grad) {
        s->host->set_error(s->host, "parameter '%s': expected f32 data with a gradient",
                           param->name ? param->name : "?");
        return CT_ERR_UNSUPPORTED;
    }
    if (!s->dapi) {
        s->host->set_error(s->host, "this Lion instance was made for planning (no device)");
        return CT_ERR_INTERNAL;
    }
    float *p = param->data;       /* p (numel) */
    const float *g = param->grad; /* g (numel), host-owned: read it, never write it */
    float *m = state[0];          /* m (numel) */
    float wd = (param->flags & CT_TENSOR_NO_DECAY) ? 0.0f : s->weight_decay;
    for (int64_t at = 0; at < numel; at += LION_CHUNK) {
        int64_t n = numel - at < LION_CHUNK ? numel - at : LION_CHUNK;
        ct_status st = lion_update(s, p + at, g + at, m + at, n, lr, wd);
        if (st != CT_OK) return st;
    }
    return CT_OK;
}

/* Lion treats every element alike, so the host may hand it several tensors that lie back to back
 * (same decay flag) as one; leave this out if your step needs each tensor's shape. */
static int lion_elementwise(ct_optimizer *opt) {
    (void)opt;
    return 1;
}

/* Optional (ABI 2.2), for `ctitan plan`: what one update of a slot costs on this rank, as lion_update
 * runs it, per element: c = axpby(m, g) reads 2 f32 and writes 1 (3 FLOPs), sign reads and writes c
 * (1), p = axpby(p, c) reads 2 and writes 1 (3), m = axpby(m, g) reads 2 and writes 1 (3): 11 f32
 * and 10 FLOPs. It must not touch the device: the planner's instance has none. */
static ct_status lion_plan_step(ct_optimizer *opt, const ct_param_slot *slot, ct_optimizer_cost *cost) {
    (void)opt;
    double n = (double)slot->local_numel;
    cost->bytes = 11 * sizeof(float) * n;
    cost->flops = 10 * n;
    cost->matmul_flops = 0;
    cost->comm_bytes = 0;
    return CT_OK;
}

static const ct_optimizer_api lion_api = {
    .struct_size = sizeof(ct_optimizer_api),
    .create = lion_create,
    .destroy = lion_destroy,
    .state_count = lion_state_count,
    .step = lion_step,
    .elementwise = lion_elementwise,
    .plan_step = lion_plan_step,
};

/* The only exported symbol. The host has set info->struct_size and zeroed the rest. */
CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info);

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    if (!CT_HAS_FIELD(info, ct_plugin_info, api)) {
        host->set_error(host, "plugin info struct too small (%zu bytes)", info->struct_size);
        return CT_ERR_INVALID;
    }
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_OPTIMIZER;
    info->name = "lion";
    info->description = "Lion: the sign of interpolated momentum, decoupled weight decay (the SDK template)";
    info->options = lion_options;
    info->api = &lion_api;
    return CT_OK;
}
