/* sgd_abi2_0.c: an optimizer plugin written against ABI 2.0, kept for tests/cli/abi_frozen.sh.
 *
 * It was the SDK template (sdk/template/) until ABI 2.1's elementwise ops let the template become
 * Lion. The 2.1 template cannot build against the frozen 2.0 headers (they have no ew_* ops), so
 * this file stays as it was to prove that an optimizer built against 2.0 still loads and trains.
 * Keep it to the 2.0 headers: it is compiled against sdk/frozen/2.0 only.
 *
 * SGD with momentum and (L2, "coupled") weight decay, PyTorch's torch.optim.SGD formula with
 * dampening 0 and nesterov off:
 *
 *     g = grad + weight_decay * p          (weight_decay is 0 for CT_TENSOR_NO_DECAY tensors)
 *     b = momentum * b + g                 (b starts at 0, so step 1 gives b = g, as PyTorch does)
 *     p = p - lr * b                       (without momentum: p = p - lr * g, and no state)
 *
 * Build:  cc $(pkg-config --cflags ctitan-sdk) -shared -fPIC -o sgd.so sgd.c
 * Use:    optimizer: { name: ./sgd.so, lr: 0.1, momentum: 0.9, weight_decay: 0.0 }
 *
 * What the host does and this file does not: the learning-rate schedule (lr arrives per step),
 * gradient clipping (param->grad is already clipped), all memory (the momentum buffer is state[0],
 * allocated zeroed by the host on the parameter's device). Parameters and state live in device
 * memory, so the update uses only the device's ops (dapi->scale, dapi->axpy), never a CPU loop:
 * the same .so then runs on any device plugin.
 */
#include <ctitan/abi.h>
#include <ctitan/device.h>
#include <ctitan/host.h>
#include <ctitan/optimizer.h>
#include <ctitan/tensor.h>

/* The plugin's manifest keys (the `optimizer` section's `name` and `lr` belong to the host). */
static const ct_option_spec sgd_options[] = {
    {sizeof(ct_option_spec), "momentum", CT_OPT_FLOAT, "0.0", "momentum factor in [0, 1); 0 keeps no state", NULL, NULL},
    {sizeof(ct_option_spec), "weight_decay", CT_OPT_FLOAT, "0.0",
     "L2 penalty added to the gradient (not applied to CT_TENSOR_NO_DECAY tensors)", NULL, NULL},
    {0},
};

/* The plugin's state. The API hands it back as an opaque `ct_optimizer *`; naming the struct
 * `ct_optimizer` makes that handle this struct, so no function needs a cast. */
typedef struct ct_optimizer {
    const ct_host *host;
    const ct_device_api *dapi;
    ct_device *dev;
    float momentum;
    float weight_decay;
} sgd;

static ct_status sgd_create(const ct_host *host, const ct_device_api *dapi, ct_device *dev,
                            ct_optimizer **out) {
    /* A device API built against an older minor version may end before the ops we call. */
    if (!dapi || !CT_HAS_FIELD(dapi, ct_device_api, scale) || !dapi->axpy || !dapi->scale) {
        host->set_error(host, "the device API has no axpy/scale ops");
        return CT_ERR_UNSUPPORTED;
    }
    double momentum = 0.0, weight_decay = 0.0;
    /* Both keys have defaults, so the getters only fail on a host bug. */
    if (host->opt_float(host, "momentum", &momentum) != CT_OK ||
        host->opt_float(host, "weight_decay", &weight_decay) != CT_OK) {
        host->set_error(host, "could not read options momentum/weight_decay");
        return CT_ERR_INTERNAL;
    }
    if (!(momentum >= 0.0 && momentum < 1.0)) {
        host->set_error(host, "option momentum = %g, expected a value in [0, 1)", momentum);
        return CT_ERR_INVALID;
    }
    if (!(weight_decay >= 0.0)) {
        host->set_error(host, "option weight_decay = %g, expected a value >= 0", weight_decay);
        return CT_ERR_INVALID;
    }
    sgd *s = host->mem_alloc(host, sizeof(*s), CT_MEM_OTHER);
    if (!s) {
        host->set_error(host, "out of memory for the optimizer state");
        return CT_ERR_NOMEM;
    }
    *s = (sgd){host, dapi, dev, (float)momentum, (float)weight_decay};
    *out = s;
    return CT_OK;
}

static void sgd_destroy(ct_optimizer *opt) {
    sgd *s = opt;
    if (s) s->host->mem_free(s->host, s);
}

/* One f32 buffer per parameter element with momentum, none without. */
static int sgd_state_count(ct_optimizer *opt) {
    const sgd *s = opt;
    return s->momentum > 0.0f ? 1 : 0;
}

static ct_status sgd_step(ct_optimizer *opt, ct_tensor *param, float *const *state, int64_t numel, float lr,
                          int64_t step) {
    sgd *s = opt;
    const ct_device_api *d = s->dapi;
    (void)step; /* plain SGD needs no step count; AdamW's bias correction would */
    if (param->dtype != CT_F32 || !param->grad) {
        s->host->set_error(s->host, "parameter '%s': expected f32 data with a gradient",
                           param->name ? param->name : "?");
        return CT_ERR_UNSUPPORTED;
    }
    float *p = param->data;          /* p (numel) */
    const float *g = param->grad;    /* g (numel), host-owned: read it, never write it */
    float wd = (param->flags & CT_TENSOR_NO_DECAY) ? 0.0f : s->weight_decay;
    ct_status st;

    if (s->momentum == 0.0f) {
        /* p = p - lr * (g + wd * p) = (1 - lr * wd) * p - lr * g */
        if (wd != 0.0f && (st = d->scale(s->dev, p, 1.0f - lr * wd, numel)) != CT_OK) return st;
        return d->axpy(s->dev, p, g, -lr, numel);
    }

    float *b = state[0]; /* b (numel), the momentum buffer */
    if ((st = d->scale(s->dev, b, s->momentum, numel)) != CT_OK) return st;   /* b = m * b    */
    if ((st = d->axpy(s->dev, b, g, 1.0f, numel)) != CT_OK) return st;        /* b += g       */
    if (wd != 0.0f && (st = d->axpy(s->dev, b, p, wd, numel)) != CT_OK) return st; /* b += wd p */
    return d->axpy(s->dev, p, b, -lr, numel);                                  /* p -= lr * b  */
}

/* ABI 1.4 (optional): SGD treats every element alike, so the host may hand it several tensors
 * that lie back to back (same decay flag) as one; leave it out if your step needs each shape. */
static int sgd_elementwise(ct_optimizer *opt) {
    (void)opt;
    return 1;
}

static const ct_optimizer_api sgd_api = {
    .struct_size = sizeof(ct_optimizer_api),
    .create = sgd_create,
    .destroy = sgd_destroy,
    .state_count = sgd_state_count,
    .step = sgd_step,
    .elementwise = sgd_elementwise,
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
    info->name = "sgd";
    info->description = "SGD with momentum and weight decay (an ABI 2.0 plugin)";
    info->options = sgd_options;
    info->api = &sgd_api;
    return CT_OK;
}
