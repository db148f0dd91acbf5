/* runtime.c: parameters, initialisation, the forward/backward driver over units, activation
 * checkpointing, and gradient utilities. */
#include "engine/runtime.h"
#include "engine/liveness.h"
#include "base/util.h"

#include "host/host.h"
#include "engine/mesh.h"
#include "engine/tape.h"
#include "engine/moe.h"
#include "engine/quantize.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- parameters ---- */
typedef struct decl {
    int unit;
    char *name;
    int ndim;
    int64_t shape[CT_MAX_DIMS];
    ct_init init;
    uint32_t flags;
    int copy_of; /* a shared parameter's use in another unit: the declared parameter's index, else -1 */
} decl;

typedef struct registry_ctx {
    runtime *rt;
    decl *decls;
    int n, cap;
    int *index;        /* open addressing over decls by name hash: decl i + 1, 0 = empty */
    size_t index_size; /* a power of two, at least twice n, so a lookup takes O(1) */
    int failed;
} registry_ctx;

/* The slot of `name` in the index: where it is, or the empty slot where it would go. */
static size_t reg_slot(const registry_ctx *c, const char *name) {
    size_t mask = c->index_size - 1, i = (size_t)rng_hash_str(name) & mask;
    while (c->index[i] && strcmp(c->decls[c->index[i] - 1].name, name)) i = (i + 1) & mask;
    return i;
}

/* Room for one more declaration: the arrays grow by doubling, the index is rebuilt at half full.
 * CT_OK, or CT_ERR_NOMEM with nothing set (reg_add says where). */
static ct_status reg_grow(registry_ctx *c) {
    if (c->n == c->cap) {
        if (c->cap > INT_MAX / 2) return CT_ERR_NOMEM;
        int cap = c->cap ? 2 * c->cap : 64;
        decl *grown = realloc(c->decls, sizeof(*grown) * (size_t)cap);
        if (!grown) return CT_ERR_NOMEM;
        c->decls = grown;
        rt_tensor **ps = realloc(c->rt->params, sizeof(*ps) * (size_t)cap);
        if (!ps) return CT_ERR_NOMEM;
        c->rt->params = ps;
        c->cap = cap;
    }
    if (2 * (size_t)(c->n + 1) <= c->index_size) return CT_OK;
    size_t size = c->index_size ? 2 * c->index_size : 128;
    int *old = c->index;
    if (!(c->index = calloc(size, sizeof *c->index))) {
        c->index = old;
        return CT_ERR_NOMEM;
    }
    c->index_size = size;
    for (int i = 0; i < c->n; i++) c->index[reg_slot(c, c->decls[i].name)] = i + 1;
    free(old);
    return CT_OK;
}

/* Elements of a declared shape: every dimension at least 1, and its bytes (f32) within int64. */
static int64_t shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 1 || __builtin_mul_overflow(n, shape[i], &n)) return -1;
    return n > INT64_MAX / (int64_t)sizeof(float) ? -1 : n;
}

static ct_tensor *reg_add(ct_param_registry *r, int unit, const char *name, int ndim, const int64_t *shape,
                          const ct_init *init, uint32_t flags) {
    registry_ctx *c = r->ctx;
    if (!name || ndim < 1 || ndim > CT_MAX_DIMS || !init || unit < 0 || unit >= c->rt->desc.n_units) {
        ct_set_error("declare_params: bad parameter '%s' (unit %d, %d dims)", name ? name : "?", unit, ndim);
        c->failed = 1;
        return NULL;
    }
    if (!shape || shape_numel(ndim, shape) < 0) {
        ct_set_error("declare_params: parameter '%s' has a dimension below 1 or more than 2^61 elements", name);
        c->failed = 1;
        return NULL;
    }
    rt_tensor *t = NULL;
    char *copy = NULL;
    if (reg_grow(c) != CT_OK || !(t = calloc(1, sizeof *t)) || !(copy = strdup(name))) {
        ct_set_error("declare_params: out of memory at parameter %d ('%s')", c->n, name);
        goto fail;
    }
    size_t slot = reg_slot(c, name);
    if (c->index[slot]) {
        ct_set_error("declare_params: parameter '%s' declared twice", name);
        goto fail;
    }
    c->index[slot] = c->n + 1;
    decl *d = &c->decls[c->n++];
    memset(d, 0, sizeof *d);
    d->unit = unit;
    d->name = copy;
    d->ndim = ndim;
    for (int i = 0; i < ndim; i++) d->shape[i] = shape[i];
    d->init = *init;
    d->flags = flags | CT_TENSOR_PARAM;
    d->copy_of = -1;
    t->t.struct_size = sizeof t->t;
    t->t.dtype = CT_F32;
    t->t.ndim = ndim;
    memcpy(t->t.shape, d->shape, sizeof d->shape);
    t->t.name = d->name;
    t->t.flags = d->flags;
    t->param = c->n;
    /* the runtime owns t from here, in declaration order */
    c->rt->params[c->n - 1] = t;
    c->rt->n_params = c->n;
    return &t->t;
fail:
    free(copy);
    free(t);
    c->failed = 1;
    return NULL;
}

/* A shared parameter's use in another unit: a copy declared like the parameter (same shape, init
 * and flags, values from the parameter's name), under the use's name. */
static ct_tensor *reg_share(ct_param_registry *r, int unit, const char *use_name, ct_tensor *param) {
    registry_ctx *c = r->ctx;
    const rt_tensor *p = (const rt_tensor *)param;
    int owner = -1;
    for (int i = 0; param && i < c->n; i++) /* the pack's handle must be one of ours */
        if (&c->rt->params[i]->t == param) owner = i;
    if (owner < 0 || p->param != owner + 1) {
        ct_set_error("declare_params: share('%s'): the tensor is not a parameter declared with add",
                     use_name ? use_name : "?");
        c->failed = 1;
        return NULL;
    }
    const decl *o = &c->decls[owner];
    if (o->copy_of >= 0) {
        ct_set_error("declare_params: share('%s'): '%s' is itself a shared use; share the declared parameter '%s'",
                     use_name ? use_name : "?", o->name, c->decls[o->copy_of].name);
        c->failed = 1;
        return NULL;
    }
    if (unit == o->unit) {
        ct_set_error("declare_params: share('%s'): '%s' is declared in unit %d already; a unit computes with its own "
                     "parameters directly", use_name ? use_name : "?", o->name, unit);
        c->failed = 1;
        return NULL;
    }
    for (int i = 0; i < c->n; i++)
        if (c->decls[i].copy_of == owner && c->decls[i].unit == unit) {
            ct_set_error("declare_params: share('%s'): '%s' is shared with unit %d twice (also as '%s')",
                         use_name ? use_name : "?", o->name, unit, c->decls[i].name);
            c->failed = 1;
            return NULL;
        }
    decl od = *o; /* add may move the array */
    ct_tensor *t = reg_add(r, unit, use_name, od.ndim, od.shape, &od.init, od.flags & ~CT_TENSOR_PARAM);
    if (!t) return NULL;
    c->decls[c->n - 1].copy_of = owner;
    return t;
}

int runtime_param_copy_of(const runtime *rt, int i) {
    return CT_HAS_FIELD(&rt->slots[i], ct_param_slot, copy_of) ? rt->slots[i].copy_of : -1;
}

const char *runtime_param_key(const runtime *rt, int i) {
    int o = runtime_param_copy_of(rt, i);
    return rt->params[o >= 0 ? o : i]->t.name;
}

int64_t runtime_global_index(const ct_param_slot *sl, int64_t k) {
    if (!CT_HAS_FIELD(sl, ct_param_slot, global_shape) || sl->split_dim < 0 || sl->split_parts <= 1) return k;
    const ct_tensor *p = sl->param;
    int64_t inner = 1;
    for (int d = sl->split_dim + 1; d < p->ndim; d++) inner *= p->shape[d];
    int64_t local = p->shape[sl->split_dim], global = sl->global_shape[sl->split_dim];
    int64_t r = k % inner, rest = k / inner, dd = rest % local, o = rest / local;
    return (o * global + (int64_t)sl->split_index * local + dd) * inner + r;
}

const int64_t *runtime_global_shape(const runtime *rt, int i) { return rt->slots[i].global_shape; }

int runtime_token_axes(const runtime *rt, int axes[CT_MESH_NAXES], int rows_only) {
    const ct_mesh_info *m = rt->dist.mesh;
    int n = 0;
    if (!m) return 0;
    if (!rows_only)
        for (int a = CT_AXIS_DP_REPLICATE; a <= CT_AXIS_DP_SHARD; a++)
            if (m->degree[a] > 1) axes[n++] = a;
    for (int k = 0; k < rt->dist.n_st && n < CT_MESH_NAXES; k++) {
        const ct_strategy_api *a = rt->dist.st[k];
        int x = rt->dist.axis[k];
        if (x < 0 || x >= CT_MESH_NAXES || m->degree[x] <= 1 || !CT_HAS_FIELD(a, ct_strategy_api, sequence_multiple) ||
            !a->sequence_multiple || a->sequence_multiple(rt->dist.strat[k]) <= 1)
            continue;
        axes[n++] = x;
    }
    return n;
}

ct_status runtime_wrap_builder(runtime *rt) {
    if (rt->qapi) { /* the quantizer first, innermost: the strategies' linears reach it */
        ct_builder *q = quantize_layer_new(rt, rt->top);
        if (!q) return ct_fail(CT_ERR_NOMEM, "out of memory");
        rt->layers[rt->n_layers++] = q;
        rt->top = q;
    }
    for (int k = 0; k < rt->dist.n_st; k++) {
        const ct_strategy_api *a = rt->dist.st[k];
        if (CT_HAS_FIELD(a, ct_strategy_api, sequence_multiple) && a->sequence_multiple) {
            int64_t m = a->sequence_multiple(rt->dist.strat[k]);
            int64_t g = rt->seq_multiple, r = m; /* the least common multiple of every strategy's */
            while (r > 0) {
                int64_t t = g % r;
                g = r;
                r = t;
            }
            if (m > 1) rt->seq_multiple = rt->seq_multiple / g * m;
        }
        if (!CT_HAS_FIELD(a, ct_strategy_api, wrap_builder) || !a->wrap_builder) continue;
        ct_builder *out = tape_layer_new(rt, rt->top);
        if (!out || rt->n_layers >= RT_MAX_LAYERS) {
            tape_layer_free(out);
            return ct_fail(CT_ERR_NOMEM, "out of memory");
        }
        rt->layers[rt->n_layers++] = out;
        ct_clear_error();
        if (a->wrap_builder(rt->dist.strat[k], rt->top, out) != CT_OK)
            return ct_fail(CT_ERR_INVALID, "strategy: wrap_builder failed: %s",
                           ct_last_error()[0] ? ct_last_error() : "no message");
        rt->top = out;
    }
    return CT_OK;
}

static int64_t global_numel(const ct_param_slot *sl) {
    int64_t n = 1;
    for (int d = 0; d < sl->param->ndim; d++) n *= sl->global_shape[d];
    return n;
}

/* Elements [offset, offset + count) of the flattened parameter block; past its end, zeros (padding).
 * Each value depends only on its index in the GLOBAL parameter, so every layout initialises alike. */
static void init_values(const decl *d, const char *key_name, const ct_param_slot *sl, uint64_t seed, float *out,
                        int64_t offset, int64_t count) {
    uint64_t key = ct_util_splitmix64(seed) ^ rng_hash_str(key_name);
    const ct_init *in = &d->init;
    int64_t n = global_numel(sl);
    for (int64_t k = 0; k < count; k++) {
        double v;
        if (offset + k >= sl->numel) {
            out[k] = 0.0f;
            continue;
        }
        int64_t i = runtime_global_index(sl, offset + k);
        switch (in->kind) {
        case CT_INIT_CONSTANT: v = in->value; break;
        case CT_INIT_UNIFORM: v = in->lo + (in->hi - in->lo) * rng_uniform(key, (uint64_t)i); break;
        case CT_INIT_TRUNC_NORMAL: {
            /* redraw outside [lo, hi]: draw j of element i is stream index i + j * n */
            uint64_t j = 0;
            do v = in->std * rng_normal(key, (uint64_t)i + j++ * (uint64_t)n);
            while ((v < in->lo || v > in->hi) && j < 1000);
            break;
        }
        default: v = in->std * rng_normal(key, (uint64_t)i); break;
        }
        out[k] = (float)v;
    }
}

/* The name whose random stream parameter i starts from: a shared parameter's copies all take the
 * declared one's, so they start alike. */
static const char *init_key(const decl *decls, int i) {
    return decls[decls[i].copy_of >= 0 ? decls[i].copy_of : i].name;
}

/* Placement: the strategies' (the axis strategy first, then the data-parallel one), or everything local on one rank. */
static ct_status place_params(runtime *rt, const decl *decls) {
    rt->slots = calloc((size_t)rt->n_params, sizeof(ct_param_slot));
    rt->local = calloc((size_t)rt->n_params, sizeof(ct_tensor));
    rt->storage_order = calloc((size_t)rt->n_params + 1, sizeof(int));
    if (!rt->slots || !rt->local || !rt->storage_order) return ct_fail(CT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < rt->n_params; i++) {
        ct_param_slot *sl = &rt->slots[i];
        sl->struct_size = sizeof *sl;
        sl->param = &rt->params[i]->t;
        sl->numel = ct_tensor_numel(sl->param);
        sl->placement = CT_PLACE_REPLICATE;
        sl->local_numel = sl->numel;
        sl->split_axis = -1;
        sl->split_dim = -1;
        sl->split_parts = 1;
        memcpy(sl->global_shape, sl->param->shape, sizeof sl->global_shape);
        sl->unit = decls[i].unit;
        sl->copy_of = decls[i].copy_of;
        if (rt->dist.unit_rank && rt->dist.unit_rank[sl->unit] != rt->dist.mesh->coord[CT_AXIS_PP]) {
            sl->placement = CT_PLACE_NONE; /* another pipeline stage's: no storage here */
            sl->local_numel = 0;
        }
    }
    for (int k = 0; k < rt->dist.n_st; k++) {
        ct_clear_error();
        ct_status st = rt->dist.st[k]->place(rt->dist.strat[k], rt->slots, rt->n_params);
        if (st != CT_OK) /* a layout the model cannot take is bad input */
            return ct_fail(st == CT_ERR_INVALID ? CT_ERR_INVALID : CT_ERR_INTERNAL, "strategy place failed: %s",
                           ct_last_error());
    }
    for (int i = 0; i < rt->n_params; i++) {
        const ct_param_slot *sl = &rt->slots[i];
        const ct_tensor *p = sl->param;
        int64_t split;
        int split_ok = sl->split_dim < 0 ? sl->split_parts == 1 && !memcmp(sl->global_shape, p->shape, sizeof sl->global_shape)
                                   : sl->split_dim < p->ndim && sl->split_parts > 1 && rt->dist.mesh &&
                                         ((sl->split_axis >= 0 && sl->split_axis < CT_MESH_NAXES) ||
                                          sl->split_axis == CT_AXIS_EP) &&
                                         mesh_shard_degree(rt->dist.mesh, sl->split_axis) == sl->split_parts &&
                                         sl->split_index >= 0 &&
                                         sl->split_index < sl->split_parts &&
                                         !__builtin_mul_overflow(p->shape[sl->split_dim], sl->split_parts, &split) &&
                                         split == sl->global_shape[sl->split_dim];
        /* sizes the runtime computes later (bytes of the whole tensor, of a gathered shard) fit */
        int sharded = sl->placement == CT_PLACE_SHARD;
        if (sharded && (!rt->dist.mesh || !mesh_axis_bits(sl->shard_axis))) split_ok = 0;
        int64_t gathered, parts = split_ok && sharded ? mesh_shard_degree(rt->dist.mesh, sl->shard_axis) : 1;
        split_ok = split_ok && shape_numel(p->ndim, sl->global_shape) >= 0 &&
                !__builtin_mul_overflow(sl->local_numel, parts * (int64_t)sizeof(float), &gathered);
        if (!split_ok || sl->numel != ct_tensor_numel(p) || sl->local_numel < 0 || sl->offset < 0 ||
            (sl->placement == CT_PLACE_REPLICATE && sl->local_numel != sl->numel) ||
            (sl->placement == CT_PLACE_NONE && sl->local_numel != 0))
            return ct_fail(CT_ERR_INTERNAL, "strategy placed %s badly (local %lld at %lld of %lld, dim %d in %d parts)",
                           p->name, (long long)sl->local_numel, (long long)sl->offset, (long long)sl->numel,
                           sl->split_dim, sl->split_parts);
        /* experts split over ep: the ranks that hold the same ones are efsdp, and only there may their
         * storage be sharded (and their gradients reduced) */
        if (sl->split_dim >= 0 && sl->split_axis == CT_AXIS_EP &&
            (sharded ? sl->shard_axis != CT_AXIS_EFSDP
                     : sl->placement == CT_PLACE_REPLICATE && mesh_shard_degree(rt->dist.mesh, CT_AXIS_EFSDP) > 1))
            return ct_fail(CT_ERR_INVALID, "parallelism.expert_parallel_degree: %s is split over ep, but the data-parallel "
                           "strategy %s it; it must shard it over efsdp (the ranks holding the same experts), as fsdp "
                           "does", p->name, sharded ? "shards it over another axis than efsdp" : "replicates");
    }
    return CT_OK;
}

static void bytes_str(char *buf, size_t len, int64_t bytes) {
    if (bytes >= (int64_t)1 << 30) snprintf(buf, len, "%.2f GiB", (double)bytes / (1 << 30));
    else snprintf(buf, len, "%.1f MiB", (double)bytes / (1 << 20));
}

/* Parameters and gradients (2 x param_bytes) must fit before they are allocated: a model too large
 * for the device's memory, or for what the address-space limit (ulimit -v) leaves, fails here with
 * one line instead of in an allocation, or, under overcommit, at the first touch of a page (CT_ERR_INVALID:
 * the model is too large for the layout). */
static ct_status params_fit(runtime *rt) {
    int64_t need, limit, left = ct_address_space_left(&limit);
    if (rt->param_bytes > INT64_MAX / 2) need = INT64_MAX;
    else need = 2 * (int64_t)rt->param_bytes;
    ct_device_info info = {sizeof info, NULL, 0, 0};
    int64_t mem = rt->d->info && rt->d->info(rt->dev, &info) == CT_OK ? info.memory_bytes : 0;
    char a[32], b[32], what[160];
    bytes_str(a, sizeof a, need);
    if (mem > 0 && need > mem) {
        bytes_str(b, sizeof b, mem);
        snprintf(what, sizeof what, "the device's memory (%s: %s)", info.name ? info.name : "device", b);
    } else if (left >= 0 && need > left) {
        bytes_str(b, sizeof b, left);
        snprintf(what, sizeof what, "what the address-space limit leaves (ulimit -v %lld KiB: %s)",
                 (long long)(limit >> 10), b);
    } else {
        return CT_OK;
    }
    double n = (double)rt->n_param_elems;
    return ct_fail(CT_ERR_INVALID, "model: %.2f%s parameters need %s on this rank for parameters and gradients (4 "
                   "bytes each), more than %s: a smaller model or more ranks", n >= 1e9 ? n / 1e9 : n / 1e6,
                   n >= 1e9 ? "B" : "M", a, what);
}

/* The model's description and its parameter declarations; the tensors own their names after.
 * CT_ERR_INVALID when the pack refuses (its options are bad input), CT_ERR_INTERNAL on other errors. */
static ct_status declare_params(runtime *rt, registry_ctx *rc) {
    rt->desc.struct_size = sizeof rt->desc;
    ct_clear_error();
    if (rt->m->describe(rt->model, &rt->desc) != CT_OK)
        return ct_fail(CT_ERR_INTERNAL, "model describe failed: %s", ct_last_error());
    if (rt->desc.n_units < 2)
        return ct_fail(CT_ERR_INTERNAL, "model has %d units; need at least an embedding and a head", rt->desc.n_units);
    ct_param_registry reg = {sizeof reg, rc, reg_add, reg_share};
    ct_status st = rt->m->declare_params(rt->model, &reg);
    free(rc->index);
    rc->index = NULL;
    if (st != CT_OK || rc->failed) {
        ct_set_error("model declare_params failed: %s", ct_last_error());
        for (int i = 0; i < rc->n; i++) free(rc->decls[i].name);
        for (int i = 0; i < rt->n_params; i++) rt->params[i]->t.name = NULL;
        return CT_ERR_INVALID;
    }
    for (int i = 0; i < rc->n; i++) rt->params[i]->t.name = rc->decls[i].name;
    return CT_OK;
}

/* Bytes of this rank's storage (64-byte aligned per parameter) and the largest local tensor;
 * CT_ERR_INVALID when it would not fit the device or the address-space limit. */
static ct_status size_storage(runtime *rt, size_t *max_n) {
    size_t total = 0;
    *max_n = 0;
    for (int i = 0; i < rt->n_params; i++) {
        size_t n = (size_t)rt->slots[i].local_numel; /* bounded by place_params */
        if (__builtin_add_overflow(total, align64(n * sizeof(float)), &total) ||
            __builtin_add_overflow(rt->n_param_elems, rt->slots[i].copy_of >= 0 ? 0 : global_numel(&rt->slots[i]),
                                   &rt->n_param_elems))
            return ct_fail(CT_ERR_UNSUPPORTED, "model: the parameters' sizes add up past 2^63 bytes");
        if (n > *max_n) *max_n = n;
    }
    rt->param_bytes = total ? total : 64;
    return params_fit(rt);
}

/* One allocation for the parameters, one for their gradients, carved in storage order: the
 * weight-decayed tensors first, then the rest (norms), so an elementwise optimizer updates each group
 * in one call (session_train_step); every tensor 64-byte aligned, the padding zero. */
static ct_status alloc_storage(runtime *rt) {
    const ct_device_api *d = rt->d;
    if (d->alloc(rt->dev, rt->param_bytes, (void **)&rt->param_mem) != CT_OK ||
        d->alloc(rt->dev, rt->param_bytes, (void **)&rt->grad_mem) != CT_OK ||
        d->zero(rt->dev, rt->param_mem, rt->param_bytes) != CT_OK) {
        ct_set_error("cannot allocate %zu bytes for parameters and gradients", 2 * rt->param_bytes);
        if (rt->param_mem) d->free(rt->dev, rt->param_mem);
        if (rt->grad_mem) d->free(rt->dev, rt->grad_mem);
        rt->param_mem = rt->grad_mem = NULL; /* not yet counted: runtime_free must not uncount them */
        return CT_ERR_NOMEM;
    }
    mem_account(CT_MEM_PARAMS, (int64_t)rt->param_bytes);
    mem_account(CT_MEM_GRADS, (int64_t)rt->param_bytes);
    size_t off = 0;
    int placed = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < rt->n_params; i++) {
            if (!(rt->params[i]->t.flags & CT_TENSOR_NO_DECAY) != !pass) continue;
            rt->storage_order[placed++] = i;
            rt->slots[i].local_data = (float *)(rt->param_mem + off);
            rt->slots[i].local_grad = (float *)(rt->grad_mem + off);
            off += align64((size_t)rt->slots[i].local_numel * sizeof(float));
        }
    return CT_OK;
}

/* Each parameter's local view, and its values from the seed (element i of the whole parameter gets
 * the same value whatever the layout). */
static ct_status init_storage(runtime *rt, const decl *decls, size_t max_n) {
    float *host = malloc((max_n ? max_n : 1) * sizeof(float));
    if (!host) return ct_fail(CT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < rt->n_params; i++) {
        ct_param_slot *sl = &rt->slots[i];
        rt_tensor *t = rt->params[i];
        rt->local[i] = (ct_tensor){.struct_size = sizeof(ct_tensor), .dtype = CT_F32, .ndim = 1,
                                   .shape = {sl->local_numel}, .data = sl->local_data, .grad = sl->local_grad,
                                   .name = t->t.name, .flags = t->t.flags};
        if (!rt->dist.n_st) { /* one rank: the model computes on the storage itself */
            t->t.data = sl->local_data;
            t->t.grad = sl->local_grad;
        }
        init_values(&decls[i], init_key(decls, i), sl, rt->seed, host, sl->offset, sl->local_numel);
        if (rt->d->copy(rt->dev, sl->local_data, host, (size_t)sl->local_numel * sizeof(float), CT_COPY_H2D) != CT_OK) {
            free(host);
            return ct_fail(CT_ERR_INTERNAL, "cannot copy initial weights to the device: %s", ct_last_error());
        }
    }
    free(host);
    return CT_OK;
}

/* ---- whole compute storage (ABI 2.1, ZeRO): slots whose `whole` place() set ---- */

/* Bytes of a slot's placed local data, as alloc_storage carved them. */
static int64_t local_bytes(const ct_param_slot *sl) { return (int64_t)align64((size_t)sl->local_numel * sizeof(float)); }

/* For every slot place() asked it of: whole_data (counted as parameters, its placed local data then
 * as master weights) initialised like local storage, and/or whole_grad (counted as gradients); the
 * model computes with them for the whole run. */
static ct_status whole_alloc(runtime *rt, const decl *decls) {
    float *host = NULL;
    ct_status st = CT_OK;
    for (int i = 0; i < rt->n_params; i++) {
        ct_param_slot *sl = &rt->slots[i];
        if (!sl->whole || sl->placement == CT_PLACE_NONE) continue;
        size_t bytes = (size_t)sl->numel * sizeof(float);
        if (sl->whole & CT_WHOLE_DATA) {
            float *grown = realloc(host, bytes ? bytes : 1);
            if (!grown || rt->d->alloc(rt->dev, bytes, (void **)&sl->whole_data) != CT_OK) {
                if (grown) host = grown;
                st = ct_fail(CT_ERR_NOMEM, "cannot allocate %zu bytes for the whole copy of %s", bytes,
                             sl->param->name);
                sl->whole_data = NULL;
                goto done;
            }
            host = grown;
            mem_account(CT_MEM_PARAMS, -local_bytes(sl)); /* the placed shard is the optimizer's master now */
            mem_account(CT_MEM_MASTER, local_bytes(sl));
            mem_account(CT_MEM_PARAMS, (int64_t)bytes);
            init_values(&decls[i], init_key(decls, i), sl, rt->seed, host, 0, sl->numel); /* as local storage */
            if (rt->d->copy(rt->dev, sl->whole_data, host, bytes, CT_COPY_H2D) != CT_OK) {
                st = ct_fail(CT_ERR_INTERNAL, "cannot copy initial weights to the device: %s", ct_last_error());
                goto done;
            }
            sl->param->data = sl->whole_data;
        }
        if (sl->whole & CT_WHOLE_GRAD) {
            if (rt->d->alloc(rt->dev, bytes, (void **)&sl->whole_grad) != CT_OK ||
                rt->d->zero(rt->dev, sl->whole_grad, bytes) != CT_OK) {
                if (sl->whole_grad) rt->d->free(rt->dev, sl->whole_grad);
                sl->whole_grad = NULL;
                st = ct_fail(CT_ERR_NOMEM, "cannot allocate %zu bytes for the whole gradient of %s", bytes,
                             sl->param->name);
                goto done;
            }
            mem_account(CT_MEM_GRADS, (int64_t)bytes);
            sl->param->grad = sl->whole_grad;
        }
    }
done:
    free(host);
    return st;
}

/* Zeroes every whole gradient (with the local ones, at each step). */
static ct_status whole_zero_grads(runtime *rt) {
    for (int i = 0; rt->slots && i < rt->n_params; i++) {
        const ct_param_slot *sl = &rt->slots[i];
        ct_status st = sl->whole_grad ? rt->d->zero(rt->dev, sl->whole_grad, (size_t)sl->numel * sizeof(float)) : CT_OK;
        if (st != CT_OK) return st;
    }
    return CT_OK;
}

/* Gives back the whole copies and moves the master weights' bytes back to parameters (runtime_free
 * then uncounts the local storage as a whole). */
static void whole_free(runtime *rt) {
    for (int i = 0; rt->slots && i < rt->n_params; i++) {
        ct_param_slot *sl = &rt->slots[i];
        if (sl->whole_data) {
            rt->d->free(rt->dev, sl->whole_data);
            mem_account(CT_MEM_PARAMS, -(int64_t)((size_t)sl->numel * sizeof(float)));
            mem_account(CT_MEM_MASTER, -local_bytes(sl));
            mem_account(CT_MEM_PARAMS, local_bytes(sl));
        }
        if (sl->whole_grad) {
            rt->d->free(rt->dev, sl->whole_grad);
            mem_account(CT_MEM_GRADS, -(int64_t)((size_t)sl->numel * sizeof(float)));
        }
        sl->whole_data = sl->whole_grad = NULL;
    }
}

/* Gradients zeroed, the strategies' setup, the activation arenas and the per-unit tables. */
static ct_status start_runtime(runtime *rt) {
    if (runtime_zero_grads(rt) != CT_OK) return ct_fail(CT_ERR_INTERNAL, "cannot zero gradients: %s", ct_last_error());
    for (int k = 0; k < rt->dist.n_st; k++) {
        ct_clear_error();
        if (rt->dist.st[k]->setup(rt->dist.strat[k], rt->slots, rt->n_params, rt->desc.n_units) != CT_OK)
            return ct_fail(CT_ERR_INTERNAL, "strategy setup failed: %s", ct_last_error());
    }
    const ct_device_api *d = rt->d;
    pool_init(&rt->opscratch, d, rt->dev, CT_MEM_ACTIVATIONS);
    pool_init(&rt->saved.data, d, rt->dev, CT_MEM_ACTIVATIONS);
    pool_init(&rt->saved.desc, NULL, NULL, CT_MEM_OTHER);
    pool_init(&rt->scratch.data, d, rt->dev, CT_MEM_ACTIVATIONS);
    pool_init(&rt->scratch.desc, NULL, NULL, CT_MEM_OTHER);
    pool_init(&rt->grads.data, d, rt->dev, CT_MEM_ACTIVATIONS);
    pool_init(&rt->grads.desc, NULL, NULL, CT_MEM_OTHER);
    pool_init(&rt->bgrads[0], d, rt->dev, CT_MEM_ACTIVATIONS);
    pool_init(&rt->bgrads[1], d, rt->dev, CT_MEM_ACTIVATIONS);
    rt->in_order = 1; /* the pipeline turns it off: its microbatches interleave */
    rt->pack_units = 1;
    rt->grad_pool = &rt->grads.data;
    int nu = rt->desc.n_units;
    rt->ac = calloc((size_t)nu, sizeof(int));
    rt->unit_in = calloc((size_t)nu, sizeof(rt_tensor *));
    rt->unit_out = calloc((size_t)nu, sizeof(rt_tensor *));
    rt->unit_tape = calloc((size_t)nu, sizeof(tape_entry *));
    rt->unit_mark = calloc((size_t)nu, sizeof(rt_unit_mark));
    if (!rt->ac || !rt->unit_in || !rt->unit_out || !rt->unit_tape || !rt->unit_mark ||
        !(rt->unit_pack = runtime_pack_new(nu)))
        return ct_fail(CT_ERR_NOMEM, "out of memory");
    tape_builder_init(rt);
    rt->seq_multiple = 1;
    rt->doc_eos = -1;
    rt->cur_unit = -1;
    return CT_OK;
}

ct_status runtime_init(runtime *rt, const ct_device_api *d, ct_device *dev, const ct_model_api *m, ct_model *model,
                       uint64_t seed, const runtime_dist *dist) {
    memset(rt, 0, sizeof *rt);
    rt->d = d;
    rt->dev = dev;
    rt->m = m;
    rt->model = model;
    rt->seed = seed;
    if (dist) rt->dist = *dist;
    registry_ctx rc = {.rt = rt};
    size_t max_n = 0;
    ct_status st = declare_params(rt, &rc);
    if (st == CT_OK) st = place_params(rt, rc.decls);
    if (st == CT_OK) st = size_storage(rt, &max_n);
    if (st == CT_OK) st = alloc_storage(rt);
    if (st == CT_OK) st = init_storage(rt, rc.decls, max_n);
    if (st == CT_OK) st = whole_alloc(rt, rc.decls);
    free(rc.decls); /* the names belong to the tensors now; runtime_free releases them */
    if (st != CT_OK) {
        runtime_free(rt);
        return st;
    }
    if ((st = start_runtime(rt)) != CT_OK) return st;
    return runtime_check_shared(rt) != CT_OK ? CT_ERR_INVALID : CT_OK;
}

/* The parameters declared and placed by the strategies, nothing allocated (a plan: `ctitan train
 * --dry-run` asks the strategies for their costs on these slots). runtime_free releases it. */
ct_status runtime_plan(runtime *rt, const ct_device_api *d, ct_device *dev, const ct_model_api *m, ct_model *model,
                       const runtime_dist *dist) {
    memset(rt, 0, sizeof *rt);
    rt->d = d;
    rt->dev = dev;
    rt->m = m;
    rt->model = model;
    if (dist) rt->dist = *dist;
    registry_ctx rc = {.rt = rt};
    ct_status st = declare_params(rt, &rc);
    if (st == CT_OK) st = place_params(rt, rc.decls);
    free(rc.decls);
    return st;
}

ct_status runtime_plan_start(runtime *rt, const rt_observer *observer) {
    size_t max_n;
    ct_status st = size_storage(rt, &max_n);
    if (st != CT_OK) return st;
    if (rt->d->alloc(rt->dev, rt->param_bytes, (void **)&rt->param_mem) != CT_OK ||
        rt->d->alloc(rt->dev, rt->param_bytes, (void **)&rt->grad_mem) != CT_OK)
        return ct_fail(CT_ERR_NOMEM, "out of address space for a plan of %zu parameter bytes", rt->param_bytes);
    size_t off = 0;
    for (int i = 0; i < rt->n_params; i++) { /* addresses only: the planner's device never reads them */
        ct_param_slot *sl = &rt->slots[i];
        sl->local_data = (float *)(rt->param_mem + off);
        sl->local_grad = (float *)(rt->grad_mem + off);
        rt->params[i]->t.data = sl->local_data;
        rt->params[i]->t.grad = sl->local_grad;
        off += align64((size_t)sl->local_numel * sizeof(float));
    }
    for (int i = 0; i < rt->n_params; i++) { /* a slot with no local part still computes with an address */
        if (rt->params[i]->t.data && rt->slots[i].local_numel) continue;
        rt->params[i]->t.data = (float *)rt->param_mem;
        rt->params[i]->t.grad = (float *)rt->grad_mem;
    }
    runtime_dist keep = rt->dist;
    rt->dist.n_st = 0; /* planning strategies have no setup to run */
    st = start_runtime(rt);
    rt->dist = keep;
    if (st != CT_OK) return st;
    rt->planning = 1;
    rt->observer = observer;
    rt->builder.planning = 1;
    /* one chunk of address space each: a pass runs as the steady state does, in one chunk */
    pool *ps[] = {&rt->saved.data, &rt->scratch.data, &rt->grads.data, &rt->bgrads[0], &rt->bgrads[1], &rt->opscratch};
    for (int i = 0; i < 6; i++) ps[i]->first_chunk = RT_PLAN_CHUNK;
    return CT_OK;
}

static void graph_drop(runtime *rt);

void runtime_free(runtime *rt) {
    if (!rt->d) return;
    graph_drop(rt);
    runtime_moe_free(rt);
    for (int i = 0; i < rt->n_params; i++) {
        free((char *)rt->params[i]->t.name);
        free(rt->params[i]);
    }
    free(rt->params);
    whole_free(rt);
    free(rt->slots);
    free(rt->local);
    free(rt->storage_order);
    if (rt->param_mem) {
        rt->d->free(rt->dev, rt->param_mem);
        mem_account(CT_MEM_PARAMS, -(int64_t)rt->param_bytes);
    }
    if (rt->grad_mem) {
        rt->d->free(rt->dev, rt->grad_mem);
        mem_account(CT_MEM_GRADS, -(int64_t)rt->param_bytes);
    }
    if (rt->bf16_shadow) {
        rt->d->free(rt->dev, rt->bf16_shadow);
        mem_account(CT_MEM_PARAMS, -(int64_t)rt->shadow_bytes);
    }
    free(rt->shadow_off);
    if (rt->share_buf) rt->d->free(rt->dev, rt->share_buf);
    tape_rope_tables_free(rt);
    for (int i = 0; i < rt->n_layers; i++) tape_layer_free(rt->layers[i]);
    runtime_offload_free(rt);
    pool_destroy(&rt->opscratch);
    pool_destroy(&rt->saved.data);
    pool_destroy(&rt->saved.desc);
    pool_destroy(&rt->scratch.data);
    pool_destroy(&rt->scratch.desc);
    pool_destroy(&rt->grads.data);
    pool_destroy(&rt->grads.desc);
    pool_destroy(&rt->bgrads[0]);
    pool_destroy(&rt->bgrads[1]);
    live_free(rt);
    free(rt->ac);
    free(rt->unit_in);
    free(rt->unit_out);
    free(rt->unit_tape);
    free(rt->unit_mark);
    free(rt->unit_pack);
    memset(rt, 0, sizeof *rt);
}

ct_status runtime_set_ac(runtime *rt, const char *mode, const char *option) {
    int nu = rt->desc.n_units;
    memset(rt->ac, 0, sizeof(int) * (size_t)nu);
    if (strcmp(mode, "none") == 0) return CT_OK;
    if (strcmp(mode, "full") == 0) {
        for (int u = 1; u < nu - 1; u++) rt->ac[u] = RT_AC_FULL; /* every block; embedding and head stay */
        return CT_OK;
    }
    if (strcmp(mode, "selective") == 0) {
        int64_t every;
        if (strcmp(option, "op") == 0) { /* torchtitan's per-op SAC: every block, the costly outputs kept */
            for (int u = 1; u < nu - 1; u++) rt->ac[u] = RT_AC_OP;
            return CT_OK;
        }
        if (mf_parse_int(option, &every) || every < 1)
            return ct_fail(CT_ERR_INVALID, "expected 'op' (per-op policy) or a positive integer N (every Nth block), "
                           "got '%s'", option);
        /* torchtitan's layer SAC: the k-th block (1-based) is checkpointed when k % N == 0 */
        for (int u = 1; u < nu - 1; u++) rt->ac[u] = (u % every) == 0 ? RT_AC_FULL : RT_AC_NONE;
        return CT_OK;
    }
    return ct_fail(CT_ERR_INVALID, "expected none, full or selective, got '%s'", mode);
}

/* A replicated parameter with storage here: what bf16 compute keeps rounded copies of. */
static int shadowed(const runtime *rt, int i) {
    return rt->slots[i].placement == CT_PLACE_REPLICATE && rt->slots[i].local_data;
}

/* bf16 parameter copies for compute, for replicated parameters (a sharding strategy rounds what
 * it gathers instead, told by ct_strategy_env.bf16_compute): one unit's at a time, in a buffer as
 * large as the largest unit's copies, so the parameters are held once more only by a unit. */
ct_status runtime_enable_bf16_params(runtime *rt) {
    rt->shadow_off = calloc((size_t)rt->n_params, sizeof(size_t));
    if (!rt->shadow_off) return ct_fail(CT_ERR_NOMEM, "out of memory");
    size_t bytes = 0; /* only the replicated parameters get copies: nothing at all under FSDP */
    for (int u = 0; u < rt->desc.n_units; u++) {
        size_t unit_bytes = 0;
        for (int i = 0; i < rt->n_params; i++) {
            if (rt->slots[i].unit != u || !shadowed(rt, i)) continue;
            rt->shadow_off[i] = unit_bytes;
            unit_bytes += align64((size_t)rt->slots[i].numel * sizeof(float));
        }
        if (unit_bytes > bytes) bytes = unit_bytes;
    }
    rt->shadow_bytes = bytes;
    rt->shadow_unit = -1;
    rt->bf16_compute = 1;
    if (!bytes) return CT_OK;
    if (rt->d->alloc(rt->dev, bytes, (void **)&rt->bf16_shadow) != CT_OK)
        return ct_fail(CT_ERR_NOMEM, "cannot allocate the bf16 parameter copies (%zu bytes)", bytes);
    mem_account(CT_MEM_PARAMS, (int64_t)bytes);
    return CT_OK;
}

static float *shadow_of(runtime *rt, int i) { return (float *)((char *)rt->bf16_shadow + rt->shadow_off[i]); }

void runtime_begin_step(runtime *rt) {
    rt->shadow_unit = -1; /* the weights may have changed */
}

/* Points unit u's replicated parameters at bf16-rounded copies of their masters (made unless the
 * buffer holds them already) and the previous unit's back at their masters. */
ct_status runtime_shadow_unit(runtime *rt, int u) {
    if (!rt->bf16_shadow || !rt->shadow_on || rt->shadow_unit == u) return CT_OK;
    for (int i = 0; i < rt->n_params; i++)
        if (shadowed(rt, i) && rt->slots[i].unit == rt->shadow_unit) rt->params[i]->t.data = rt->slots[i].local_data;
    rt->shadow_unit = -1;
    for (int i = 0; i < rt->n_params; i++) {
        const ct_param_slot *sl = &rt->slots[i];
        if (!shadowed(rt, i) || sl->unit != u) continue;
        float *dst = shadow_of(rt, i);
        ct_status st = rt->d->copy(rt->dev, dst, sl->local_data, (size_t)sl->numel * sizeof(float), CT_COPY_D2D);
        if (st == CT_OK) st = rt->d->round_bf16(rt->dev, dst, sl->numel);
        if (st != CT_OK) return st;
        rt->params[i]->t.data = dst;
    }
    rt->shadow_unit = u;
    return CT_OK;
}

void runtime_use_shadow(runtime *rt, int on) {
    if (!rt->bf16_shadow) return;
    rt->shadow_on = on;
    if (on) return;
    for (int i = 0; i < rt->n_params; i++)
        if (shadowed(rt, i)) rt->params[i]->t.data = rt->slots[i].local_data;
    rt->shadow_unit = -1;
}

/* ---- forward / backward over units ---- */
rt_tensor *runtime_upload_ids(runtime *rt, const int32_t *ids, int64_t B, int64_t T) {
    int64_t shape[2] = {B, T};
    rt_tensor *t = tape_new_activation(rt, CT_I32, 2, shape);
    if (!t) return NULL;
    if (rt->d->copy(rt->dev, t->t.data, ids, sizeof(int32_t) * (size_t)(B * T), CT_COPY_H2D) != CT_OK) return NULL;
    return t;
}

void runtime_doc_ids(int32_t *docs, int32_t *pos, const int32_t *tokens, const uint8_t *starts, int64_t B,
                     int64_t T, int32_t eos) {
    for (int64_t b = 0; b < B; b++) {
        int32_t d = 0, at = 0;
        for (int64_t t = 0; t < T; t++) {
            if (starts && t > 0 && starts[b * T + t]) d++, at = 0;
            docs[b * T + t] = d;
            if (pos) pos[b * T + t] = at;
            at++;
            if (!starts && tokens[b * T + t] == eos) d++, at = 0; /* the EOS is its document's last token */
        }
    }
}

rt_tensor *runtime_upload_tokens(runtime *rt, const int32_t *ids, const uint8_t *starts, int64_t B, int64_t T) {
    rt_tensor *t = runtime_upload_ids(rt, ids, B, T);
    if (!t || rt->doc_eos < 0) return t;
    /* two tensors, each its own owner: the tape's backward reads a view's data from its owner's start */
    int64_t planes = rt->rope_doc ? 3 : 2, shape[3] = {planes, B, T};
    rt_tensor *d = tape_new_activation(rt, CT_I32, 3, shape), *v = d ? tape_new_activation(rt, CT_I32, 2, shape + 1) : NULL;
    if (!d || !v) return NULL;
    if (d->t.data && ids) { /* the planner's tensors hold no data */
        int32_t *host = malloc(sizeof(int32_t) * (size_t)(planes * B * T) + 1);
        if (!host) {
            ct_set_error("out of memory for document ids");
            return NULL;
        }
        for (int64_t i = 0; i < B * T; i++) host[i] = (int32_t)(i % T); /* positions 0..T-1 in each row */
        runtime_doc_ids(host + B * T, planes == 3 ? host + 2 * B * T : NULL, ids, starts, B, T, rt->doc_eos);
        size_t bytes = sizeof(int32_t) * (size_t)(B * T);
        ct_status st = rt->d->copy(rt->dev, d->t.data, host, (size_t)planes * bytes, CT_COPY_H2D);
        if (st == CT_OK) st = rt->d->copy(rt->dev, v->t.data, host + B * T, bytes, CT_COPY_H2D);
        free(host);
        if (st != CT_OK) return NULL;
    }
    t->docs = d;
    t->doc_view = v;
    return t;
}

ct_status runtime_reset_arenas(runtime *rt) {
    pool *pools[] = {&rt->opscratch,   &rt->saved.data,  &rt->saved.desc, &rt->scratch.data, &rt->scratch.desc,
                     &rt->grads.data,  &rt->grads.desc,  &rt->bgrads[0],  &rt->bgrads[1]};
    ct_status st = CT_OK;
    for (size_t i = 0; i < sizeof pools / sizeof pools[0]; i++) { /* every pool, whatever failed before */
        ct_status one = pool_reset(pools[i]);
        if (st == CT_OK) st = one;
    }
    if (rt->unit_mark) memset(rt->unit_mark, 0, sizeof(rt_unit_mark) * (size_t)rt->desc.n_units);
    runtime_pack_clear(rt->unit_pack, rt->desc.n_units);
    runtime_offload_reset(rt);
    return st;
}

void runtime_note_act_peak(runtime *rt) {
    int64_t live = (int64_t)(rt->saved.data.used + rt->scratch.data.used + rt->grads.data.used +
                             rt->bgrads[0].used + rt->bgrads[1].used + rt->offload.slot[0].used +
                             rt->offload.slot[1].used);
    if (live > rt->peak_act_bytes) rt->peak_act_bytes = live;
}

/* Runs a hook of every strategy, in order (finish_backward in reverse); the time spent in them
 * (gathers, waits, reductions) counts as communication. */
ct_status runtime_hook(runtime *rt, rt_hook which, int unit, int last) {
    static const char *names[] = {"pre_forward", "post_forward", "pre_backward", "post_backward", "finish_backward"};
    for (int j = 0; j < rt->dist.n_st; j++) {
        int k = which == HOOK_FINISH_BACKWARD ? rt->dist.n_st - 1 - j : j;
        const ct_strategy_api *a = rt->dist.st[k];
        ct_strategy *s = rt->dist.strat[k];
        ct_clear_error();
        double t0 = ct_now();
        ct_status st = which == HOOK_PRE_FORWARD     ? a->pre_forward(s, unit)
                       : which == HOOK_POST_FORWARD  ? a->post_forward(s, unit)
                       : which == HOOK_PRE_BACKWARD  ? a->pre_backward(s, unit)
                       : which == HOOK_POST_BACKWARD ? a->post_backward(s, unit, last)
                                                     : a->finish_backward(s);
        rt->comm_seconds += ct_now() - t0;
        if (st != CT_OK) {
            if (!ct_last_error()[0]) ct_set_error("strategy %s failed (status %d)", names[which], st);
            return st;
        }
    }
    return CT_OK;
}

/* The model's forward of unit u: CT_OK, or the model's status (CT_ERR_INTERNAL when it gave CT_OK and
 * no output) with its error, or one saying which unit failed. */
static ct_status unit_forward(runtime *rt, int u, rt_tensor *x, rt_tensor *tokens, rt_tensor *targets,
                              rt_tensor **out) {
    ct_tensor *o = NULL;
    ct_clear_error();
    trace_begin(rt->m->unit_name ? rt->m->unit_name(rt->model, u) : "unit");
    rt->memo_pass++; /* strategies' notes on activations hold within one pass over a unit */
    tokens->t.flags |= CT_TENSOR_TOKEN_IDS; /* ABI 2.12: what a strategy wrapping embedding cuts */
    rt->cur_docs = tokens->docs;            /* block-causal attention's rows (NULL: causal) */
    rt->cur_doc_ids = tokens->doc_view;
    if (targets) targets->t.flags |= CT_TENSOR_TARGETS;
    ct_status st = rt->m->unit_forward(rt->model, u, rt->top, x ? &x->t : NULL, &tokens->t,
                                       targets ? &targets->t : NULL, &o);
    trace_end(rt->m->unit_name ? rt->m->unit_name(rt->model, u) : "unit");
    if (st != CT_OK || !o) {
        if (!ct_last_error()[0]) ct_set_error("model unit %d forward failed (status %d)", u, st);
        return st != CT_OK ? st : CT_ERR_INTERNAL;
    }
    *out = (rt_tensor *)o;
    runtime_note_act_peak(rt);
    return CT_OK;
}

/* A fully checkpointed unit's forward, given back per its liveness script; recorded, to learn a
 * script, when it has none to run (liveness.h). */
static ct_status live_forward(runtime *rt, int u, rt_tensor *x, rt_tensor *tokens, rt_tensor *tg, rt_tensor **o) {
    ct_status st = live_begin(rt, u, LIVE_FORWARD);
    if (st != CT_OK) return st;
    int learn = live_learning(rt);
    rt->recording = learn;
    st = unit_forward(rt, u, x, tokens, tg, o);
    rt->recording = 0;
    int bad = st != CT_OK;
    ct_status end = live_end(rt, u, learn ? rt->tail : NULL, learn && !bad ? *o : NULL, bad);
    if (st == CT_OK) st = end;
    rt->tail = NULL;
    return st;
}

/* Forward of unit u from x (NULL for unit 0), no hooks; a checkpointed unit keeps only its output. */
ct_status runtime_unit_fwd(runtime *rt, int u, rt_tensor *x, rt_tensor *tokens, rt_tensor *targets, int record,
                           rt_tensor **out) {
    rt_tensor *tg = u == rt->desc.n_units - 1 ? targets : NULL;
    rt->cur_unit = u;
    rt->unit_in[u] = x;
    rt->tail = NULL;
    ct_status st = runtime_shadow_unit(rt, u);
    if (st != CT_OK) return st;
    if (record) rt->unit_mark[u] = (rt_unit_mark){pool_get_mark(&rt->saved.data), pool_get_mark(&rt->saved.desc), 1};
    if (record && rt->ac[u] == RT_AC_FULL && rt->in_order && x) {
        /* one region: the output's place first, the forward above it, given back after the copy
         * (a block's output has its input's shape; another shape keeps the forward where it is) */
        rt->act = &rt->saved;
        rt_tensor *keep = tape_new_activation(rt, x->t.dtype, x->t.ndim, x->t.shape), *o;
        if (!keep) return CT_ERR_NOMEM;
        pool_mark md = pool_get_mark(&rt->saved.data), mh = pool_get_mark(&rt->saved.desc);
        rt->recording = 0;
        pool_heap_begin(&rt->saved.data); /* what the forward reads last is given back (liveness.c) */
        if ((st = live_forward(rt, u, x, tokens, tg, &o)) != CT_OK) return st;
        x = o;
        if (o->t.dtype == keep->t.dtype && o->t.ndim == keep->t.ndim &&
            !memcmp(o->t.shape, keep->t.shape, sizeof(int64_t) * (size_t)o->t.ndim)) {
            st = rt->d->copy(rt->dev, keep->t.data, o->t.data,
                             (size_t)ct_tensor_numel(&o->t) * ct_dtype_size(o->t.dtype), CT_COPY_D2D);
            if (st != CT_OK) return st;
            pool_release(&rt->saved.data, md);
            pool_release(&rt->saved.desc, mh);
            x = keep;
        }
        pool_heap_end(&rt->saved.data); /* (an output of another shape stays where it is) */
    } else if (record && rt->ac[u] == RT_AC_OP && rt->in_order) {
        /* one region: the forward's temporaries above the unit's kept outputs, which then move
         * down over them (actpack.c) */
        pool_mark md = pool_get_mark(&rt->saved.data);
        rt->recording = 0;
        rt->act = &rt->saved;
        rt->sac_phase = RT_SAC_SAVE;
        rt->sac_mm = 0;
        rt->sac_head = rt->sac_tail = NULL;
        rt_tensor *o = NULL;
        st = unit_forward(rt, u, x, tokens, tg, &o);
        rt->sac_phase = RT_SAC_OFF;
        if (st == CT_OK) st = runtime_keep_op_unit(rt, md, &o);
        if (st != CT_OK) return st;
        x = o;
    } else if (record && rt->ac[u]) {
        pool_mark md = pool_get_mark(&rt->scratch.data), mh = pool_get_mark(&rt->scratch.desc);
        rt->recording = 0;
        rt->act = &rt->scratch;
        rt->sac_phase = rt->ac[u] == RT_AC_OP ? RT_SAC_SAVE : RT_SAC_OFF; /* the kept outputs go to saved */
        rt->sac_mm = 0;
        rt->sac_head = rt->sac_tail = NULL;
        rt_tensor *o = NULL;
        int live = rt->ac[u] == RT_AC_FULL; /* its forward gives back at last use (liveness.c) */
        if (live) pool_heap_begin(&rt->scratch.data);
        st = live ? live_forward(rt, u, x, tokens, tg, &o) : unit_forward(rt, u, x, tokens, tg, &o);
        rt->sac_phase = RT_SAC_OFF;
        if (st != CT_OK) return st;
        rt->act = &rt->saved;
        rt_tensor *keep = tape_new_activation(rt, o->t.dtype, o->t.ndim, o->t.shape);
        if (!keep) return CT_ERR_NOMEM;
        keep->sac_next = rt->sac_head; /* the recompute finds the saved outputs here */
        st = rt->d->copy(rt->dev, keep->t.data, o->t.data, (size_t)ct_tensor_numel(&o->t) * ct_dtype_size(o->t.dtype),
                         CT_COPY_D2D);
        if (st != CT_OK) return st;
        pool_release(&rt->scratch.data, md);
        pool_release(&rt->scratch.desc, mh);
        x = keep;
    } else {
        rt->recording = record;
        rt->act = &rt->saved;
        if ((st = unit_forward(rt, u, x, tokens, tg, &x)) != CT_OK) return st;
        /* bf16 compute without a backward (evaluation, generation): the next unit reads the output
         * in bf16, as a training forward's next unit does (actpack.c's handoff) */
        if (!record && rt->bf16_compute && u < rt->desc.n_units - 1 && x->t.dtype == CT_F32 && !x->base &&
            !rt->planning && (st = rt->d->round_bf16(rt->dev, x->t.data, ct_tensor_numel(&x->t))) != CT_OK)
            return st;
    }
    rt->recording = 0;
    rt->unit_tape[u] = rt->tail;
    rt->unit_out[u] = x;
    *out = x;
    /* bf16 compute: what the unit keeps waits for its backward in bf16 (actpack.c); the last unit's
     * backward follows at once */
    if (record && (rt->bf16_compute || runtime_offloads(rt, u)) && u < rt->desc.n_units - 1)
        return runtime_pack_unit(rt, u);
    return CT_OK;
}

float *runtime_boundary_grad(runtime *rt, rt_tensor *t) {
    return tape_grad_in(rt, t, rt->bgrad_ctx ? rt->bgrad_ctx : rt->grad_pool);
}

/* Unit u's input gradient, which outlives the unit's backward: with units in order (or inside a
 * pipeline stage, but for the stage's first unit), in bgrads[u & 1], whose previous tenant (unit
 * u+2's input gradient) died with unit u+1's backward; else where runtime_boundary_grad puts it. */
static float *boundary_grad(runtime *rt, int u, rt_tensor *in) {
    rt_tensor *owner = in->base ? in->base : in;
    int alternate = rt->in_order || (rt->bgrad_keep && !rt->bgrad_keep[u]);
    if (!alternate || owner->t.grad) return runtime_boundary_grad(rt, in);
    if (pool_reset(&rt->bgrads[u & 1]) != CT_OK) return NULL;
    return tape_grad_in(rt, in, &rt->bgrads[u & 1]);
}

/* Gives back unit u's saved activations once its backward is done, if no later unit still holds
 * some (the arena is a stack: a zero-bubble schedule's input half keeps a unit's until its weight
 * half). */
static void release_saved(runtime *rt, int u) {
    if (!rt->unit_mark[u].held) return;
    for (int v = u + 1; v < rt->desc.n_units; v++)
        if (rt->unit_mark[v].held) return;
    pool_release(&rt->saved.data, rt->unit_mark[u].data);
    pool_release(&rt->saved.desc, rt->unit_mark[u].desc);
    rt->unit_mark[u].held = 0;
    rt->unit_out[u] = NULL;
    rt->unit_tape[u] = NULL;
}

/* Backward halves of unit u, no hooks. TAPE_BOTH frees the unit's activation gradients after it;
 * TAPE_INPUT keeps them (and a checkpointed unit's recomputed activations, in the saved arena) for
 * the TAPE_WEIGHT half that follows later (zero-bubble pipeline schedules). After TAPE_BOTH or
 * TAPE_WEIGHT the unit's saved activations are dead and given back (release_saved). */
ct_status runtime_unit_bwd(runtime *rt, int u, rt_tensor *tokens, rt_tensor *targets, int halves) {
    int nu = rt->desc.n_units;
    rt_tensor *in = rt->unit_in[u];
    rt->cur_unit = u;
    ct_status st = runtime_shadow_unit(rt, u);
    /* offloaded activations back on the device (this unit's and the one below's), bf16-held ones
     * back in f32; then the unit two below starts coming back */
    if (st == CT_OK) st = runtime_offload_in(rt, u);
    if (st == CT_OK) st = runtime_unpack_unit(rt, u);
    if (st == CT_OK) st = runtime_offload_prefetch(rt, u);
    if (st != CT_OK) return st;
    runtime_note_act_peak(rt);
    if (in && !boundary_grad(rt, u, in)) return CT_ERR_NOMEM; /* the boundary gradient outlives the unit */
    pool_mark gd = pool_get_mark(&rt->grads.data);
    pool_mark sd = pool_get_mark(&rt->scratch.data), sh = pool_get_mark(&rt->scratch.desc);
    tape_entry *tail = rt->unit_tape[u];
    /* units strictly in reverse: the recompute and the gradients go above the unit's activations */
    int one_region = rt->in_order && halves == TAPE_BOTH;
    if (halves == TAPE_BOTH && rt->pack_units) { /* what the backward makes is given back at its last use (tape.c) */
        pool_heap_begin(&rt->grads.data);
        pool_heap_begin(&rt->scratch.data);
        if (one_region) pool_heap_begin(&rt->saved.data);
    }
    if (rt->ac[u] && halves != TAPE_WEIGHT) { /* recompute the unit, recording */
        rt->recording = 1;
        /* units in order: the recompute goes above the unit's kept activations; else a per-op
         * one's shares the scratch its forward's temporaries used */
        int in_scratch = halves == TAPE_BOTH && !one_region;
        rt->act = in_scratch ? &rt->scratch : &rt->saved;
        rt->tail = NULL;
        rt->sac_phase = rt->ac[u] == RT_AC_OP ? RT_SAC_REUSE : RT_SAC_OFF;
        rt->sac_mm = 0;
        rt->sac_head = rt->unit_out[u]->sac_next;
        rt_tensor *o = NULL;
        int live = rt->ac[u] == RT_AC_FULL && halves == TAPE_BOTH && rt->pack_units; /* its arena in heap mode */
        if (live && (st = live_begin(rt, u, LIVE_RECOMPUTE)) != CT_OK) return st;
        st = unit_forward(rt, u, in, tokens, u == nu - 1 ? targets : NULL, &o);
        if (live) {
            ct_status end = live_end(rt, u, rt->tail, o, st != CT_OK);
            if (end != CT_OK) return end;
        }
        if (st == CT_OK && rt->sac_phase == RT_SAC_REUSE && rt->sac_head)
            st = ct_fail(CT_ERR_INTERNAL, "per-op checkpointing: unit %d's recompute used fewer saved outputs than "
                         "its forward made", u);
        rt->sac_phase = RT_SAC_OFF;
        if (st != CT_OK) return st;
        rt->recording = 0;
        rt->act = &rt->saved;
        rt_tensor *owner = o->base ? o->base : o;
        owner->t.grad = rt->unit_out[u]->t.grad;
        tail = rt->tail;
        if (halves == TAPE_INPUT) rt->unit_tape[u] = tail; /* the weight half replays the recomputed ops */
        if (halves == TAPE_BOTH) tape_drop_unread(rt, tail);
    }
    trace_begin(halves == TAPE_BOTH ? "backward" : halves == TAPE_INPUT ? "backward_input" : "backward_weight");
    if (one_region) rt->grad_pool = &rt->saved.data;
    st = tape_backward(rt, tail, halves);
    rt->grad_pool = &rt->grads.data;
    trace_end(halves == TAPE_BOTH ? "backward" : halves == TAPE_INPUT ? "backward_input" : "backward_weight");
    if (st != CT_OK) return st;
    runtime_note_act_peak(rt);
    if (halves == TAPE_BOTH) {
        pool_release(&rt->grads.data, gd);
        pool_release(&rt->scratch.data, sd);
        pool_release(&rt->scratch.desc, sh);
    }
    if (halves != TAPE_INPUT) release_saved(rt, u);
    pool_heap_end(&rt->grads.data); /* (released above: already off) */
    pool_heap_end(&rt->scratch.data);
    pool_heap_end(&rt->saved.data);
    return CT_OK;
}

/* Forward of every unit with the strategies' hooks around each. */
static ct_status forward_units(runtime *rt, rt_tensor *tokens, rt_tensor *targets, int record, rt_tensor **last) {
    rt_tensor *x = NULL;
    for (int u = 0; u < rt->desc.n_units; u++) {
        ct_status st = runtime_hook(rt, HOOK_PRE_FORWARD, u, 0);
        if (st == CT_OK) st = runtime_unit_fwd(rt, u, x, tokens, targets, record, &x);
        if (st == CT_OK) st = runtime_hook(rt, HOOK_POST_FORWARD, u, 0);
        if (st != CT_OK) return st;
    }
    *last = x;
    return CT_OK;
}

static ct_status backward_units(runtime *rt, rt_tensor *tokens, rt_tensor *targets, int last_microbatch) {
    for (int u = rt->desc.n_units - 1; u >= 0; u--) {
        ct_status st = runtime_hook(rt, HOOK_PRE_BACKWARD, u, 0);
        if (st == CT_OK) st = runtime_unit_bwd(rt, u, tokens, targets, TAPE_BOTH);
        if (st == CT_OK) st = runtime_hook(rt, HOOK_POST_BACKWARD, u, last_microbatch);
        if (st != CT_OK) return st;
    }
    return runtime_hook(rt, HOOK_FINISH_BACKWARD, 0, 0);
}

/* Uploads a microbatch into the freshly reset arenas: ids, targets, then the loss scale, which the
 * backward copies into the loss's gradient on the device (so a replayed graph reads this step's).
 * The arenas are bump allocators, so the same shapes land at the same addresses every time. */
static ct_status upload_microbatch(runtime *rt, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T,
                                   float loss_scale, rt_tensor *io[4]) {
    ct_status st = runtime_reset_arenas(rt);
    if (st != CT_OK) return st;
    rt->act = &rt->saved;
    io[0] = runtime_upload_tokens(rt, tokens, rt->doc_starts, B, T);
    io[1] = io[0] ? runtime_upload_ids(rt, targets, B, T) : NULL;
    io[2] = io[1] ? tape_new_activation(rt, CT_F32, 0, NULL) : NULL;
    io[3] = io[2] ? tape_new_activation(rt, CT_F32, 0, NULL) : NULL; /* the loss, kept past the head's backward */
    if (!io[3]) return CT_ERR_NOMEM;
    runtime_moe_set_loss_scale(rt, loss_scale); /* what aux_loss gives the units' own losses */
    return rt->d->copy(rt->dev, io[2]->t.data, &loss_scale, sizeof loss_scale, CT_COPY_H2D);
}

/* Forward and backward of the uploaded microbatch, with no host synchronisation when the device has
 * ABI 1.5's loss ops (so it can run inside a capture); *loss: the scalar loss on the device. */
static ct_status microbatch(runtime *rt, rt_tensor *io[4], int last_microbatch, rt_tensor **loss) {
    runtime_use_shadow(rt, 1);
    *loss = NULL;
    ct_status st = forward_units(rt, io[0], io[1], 1, loss);
    if (st == CT_OK && ((*loss)->t.ndim != 0 || (*loss)->t.dtype != CT_F32))
        st = ct_fail(CT_ERR_INVALID, "model: the last unit must return a scalar loss when given targets");
    if (st == CT_OK) {
        float *g = tape_grad(rt, *loss);
        st = g ? rt->d->copy(rt->dev, g, io[2]->t.data, sizeof(float), CT_COPY_D2D) : CT_ERR_NOMEM;
        if (st == CT_OK) st = rt->d->copy(rt->dev, io[3]->t.data, (*loss)->t.data, sizeof(float), CT_COPY_D2D);
        if (st == CT_OK) *loss = io[3]; /* the head's backward gives its own activations back */
    }
    /* backward runs with the same (bf16-rounded) weights as forward; gradients land in the f32
     * master gradients, which the parameters point at whatever their data pointer */
    if (st == CT_OK) st = backward_units(rt, io[0], io[1], last_microbatch);
    runtime_use_shadow(rt, 0);
    return st;
}

static void graph_drop(runtime *rt) {
    if (rt->graph.graph) rt->d->graph_free(rt->dev, rt->graph.graph);
    rt->graph.graph = NULL;
}

/* The device addresses a graph depends on: the uploads, the loss, and the arena chunks under them
 * (after a reset each arena is one chunk; one that grew since gets a new chunk). */
static void graph_addresses(runtime *rt, rt_tensor *io[4], const rt_tensor *loss, void *at[4], char *base[5]) {
    for (int i = 0; i < 3; i++) at[i] = io[i]->t.data;
    at[3] = loss ? loss->t.data : NULL;
    const pool *p[5] = {&rt->saved.data, &rt->scratch.data, &rt->grads.data, &rt->bgrads[0], &rt->bgrads[1]};
    for (int i = 0; i < 5; i++) base[i] = p[i]->n_chunks == 1 ? p[i]->chunks[0].base : NULL;
}

/* Captures the uploaded microbatch; on success the graph has not run yet. On failure the capture
 * is given up for good (graph.why, the error cleared) and the caller runs the microbatch eagerly:
 * a status, but no error for the caller to report. */
static ct_status graph_capture(runtime *rt, rt_tensor *io[4], int last_microbatch) {
    runtime_graph *g = &rt->graph;
    rt_tensor *loss = NULL;
    ct_clear_error();
    ct_status st = rt->d->graph_begin(rt->dev);
    int bad = st != CT_OK;
    if (!bad) {
        st = microbatch(rt, io, last_microbatch, &loss);
        bad = st != CT_OK;
        char failed[sizeof g->why];
        snprintf(failed, sizeof failed, "%s", ct_last_error());
        ct_status end = rt->d->graph_end(rt->dev, &g->graph, &g->ops);
        if (end != CT_OK || !g->graph) {
            if (!bad) st = end != CT_OK ? end : CT_ERR_INTERNAL;
            bad = 1;
        } else if (bad) {
            graph_drop(rt);
        }
        if (bad && failed[0]) ct_set_error("%s", failed); /* the op that failed, not the end of capture */
    }
    if (bad) {
        g->failed = 1;
        snprintf(g->why, sizeof g->why, "%s", ct_last_error()[0] ? ct_last_error() : "the device refused");
        ct_clear_error();
        return st;
    }
    void *at[4];
    char *base[5];
    graph_addresses(rt, io, loss, at, base);
    memcpy(g->at, at, sizeof at);
    memcpy(g->arena_base, base, sizeof base);
    g->captures++;
    return CT_OK;
}

ct_status runtime_forward_backward(runtime *rt, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T,
                                   float loss_scale, int last_microbatch, double *loss_sum) {
    runtime_graph *g = &rt->graph;
    rt_tensor *io[4], *loss = NULL;
    ct_status st = upload_microbatch(rt, tokens, targets, B, T, loss_scale, io);
    if (st != CT_OK) return st;
    if (B != g->B || T != g->T) { /* a new shape: eager until its arenas are steady */
        graph_drop(rt);
        g->B = B;
        g->T = T;
        g->eager_runs = 0;
    }
    if (g->graph) { /* the graph's addresses must still be these: else capture again */
        void *at[4];
        char *base[5];
        graph_addresses(rt, io, NULL, at, base);
        if (memcmp(at, g->at, 3 * sizeof at[0]) || memcmp(base, g->arena_base, sizeof base)) {
            graph_drop(rt);
            g->eager_runs = 0;
        }
    }
    if (!g->graph && g->enabled && !g->failed && g->eager_runs >= 2 &&
        graph_capture(rt, io, last_microbatch) != CT_OK) {
        /* the failed capture ran nothing: the microbatch runs eagerly after all, from fresh arenas */
        if ((st = upload_microbatch(rt, tokens, targets, B, T, loss_scale, io)) != CT_OK) return st;
    }
    const float *loss_at;
    if (g->graph) {
        ct_clear_error();
        if ((st = rt->d->graph_launch(rt->dev, g->graph)) != CT_OK) return st;
        g->launches++;
        loss_at = g->at[3];
    } else {
        if ((st = microbatch(rt, io, last_microbatch, &loss)) != CT_OK) return st;
        g->eager_runs++;
        loss_at = loss->t.data;
    }
    float lf = 0;
    if ((st = rt->d->copy(rt->dev, &lf, loss_at, sizeof lf, CT_COPY_D2H)) != CT_OK) return st;
    *loss_sum = lf;
    return CT_OK;
}

/* Forward without the pipeline runner (one sequence to sample from): each stage's units run on the
 * pp rank that holds them, and its output is broadcast over the pp group to every rank, so the next
 * stage's rank has its input and at the end every rank has the (gathered) logits. */
static ct_status forward_units_pp(runtime *rt, rt_tensor *tokens, rt_tensor *targets, rt_tensor **last) {
    const ct_mesh_info *mesh = rt->dist.mesh;
    int nu = rt->desc.n_units, me = mesh->coord[CT_AXIS_PP];
    rt_tensor *x = NULL;
    for (int u = 0; u < nu;) {
        int owner = rt->dist.unit_rank[u], u1 = u;
        while (u1 + 1 < nu && rt->dist.unit_rank[u1 + 1] == owner) u1++;
        double meta[3 + CT_MAX_DIMS] = {0}; /* ndim, (unused), shape..., a failure on the owner */
        ct_status st = CT_OK;
        if (owner == me) {
            for (int k = u; k <= u1 && st == CT_OK; k++) {
                st = runtime_hook(rt, HOOK_PRE_FORWARD, k, 0);
                if (st == CT_OK) st = runtime_unit_fwd(rt, k, x, tokens, targets, 0, &x);
                if (st == CT_OK) st = runtime_hook(rt, HOOK_POST_FORWARD, k, 0);
            }
            if (st == CT_OK && u1 == nu - 1 && !targets && !(x = (rt_tensor *)rt->top->finish_output(rt->top, &x->t)))
                st = CT_ERR_INTERNAL;
            meta[2 + CT_MAX_DIMS] = st != CT_OK;
            if (st == CT_OK) {
                meta[0] = x->t.ndim;
                for (int d = 0; d < x->t.ndim; d++) meta[2 + d] = (double)x->t.shape[d];
            }
        }
        ct_clear_error();
        ct_status bst = rt->dist.capi->broadcast(rt->dist.comm, mesh->group[CT_AXIS_PP], meta, 3 + CT_MAX_DIMS, CT_F64,
                                                 owner, NULL);
        if (bst != CT_OK) return bst;
        if (meta[2 + CT_MAX_DIMS] != 0) { /* every rank stops, the owner with its own error */
            if (owner != me) return ct_fail(CT_ERR_INTERNAL, "pipeline stage on pp rank %d failed in forward", owner);
            return st;
        }
        if (owner != me) {
            int64_t shape[CT_MAX_DIMS] = {0};
            int nd = (int)meta[0];
            for (int d = 0; d < nd && d < CT_MAX_DIMS; d++) shape[d] = (int64_t)meta[2 + d];
            if (!(x = tape_new_activation(rt, CT_F32, nd, shape))) return CT_ERR_NOMEM;
        }
        if ((bst = rt->dist.capi->broadcast(rt->dist.comm, mesh->group[CT_AXIS_PP], x->t.data, ct_tensor_numel(&x->t),
                                            CT_F32, owner, NULL)) != CT_OK)
            return bst;
        u = u1 + 1;
    }
    *last = x;
    return CT_OK;
}

/* A strategy may need every sequence length to be a multiple of some number (sequence parallel
 * splits token rows over tp), so a sequence of another length is right-padded (with its last token)
 * up to one: attention is causal, so the padding after the last real token changes none of the real
 * positions' logits. */
ct_status runtime_forward_logits(runtime *rt, const int32_t *tokens, int64_t B, int64_t T, float *logits_out) {
    int64_t mult = rt->seq_multiple > 1 ? rt->seq_multiple : 1, Tpad = (T + mult - 1) / mult * mult;
    int32_t *padded = NULL;
    float *host = NULL;
    if (B < 1 || T < 1)
        return ct_fail(CT_ERR_INVALID, "forward_logits: empty input (%lld x %lld)", (long long)B, (long long)T);
    if (Tpad != T) {
        if (!(padded = malloc(sizeof(int32_t) * (size_t)(B * Tpad)))) return ct_fail(CT_ERR_NOMEM, "out of memory");
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < Tpad; t++) padded[b * Tpad + t] = tokens[b * T + (t < T ? t : T - 1)];
        tokens = padded;
    }
    ct_status st = runtime_reset_arenas(rt);
    runtime_use_shadow(rt, 1);
    rt->act = &rt->saved;
    rt_tensor *tok = st != CT_OK ? NULL : runtime_upload_tokens(rt, tokens, NULL, B, Tpad), *logits = NULL;
    if (st == CT_OK && !tok) st = CT_ERR_NOMEM;
    if (st == CT_OK)
        st = rt->dist.unit_rank ? forward_units_pp(rt, tok, NULL, &logits) : forward_units(rt, tok, NULL, 0, &logits);
    if (st == CT_OK && !rt->dist.unit_rank && /* a strategy that left the logits split returns them whole */
        !(logits = (rt_tensor *)rt->top->finish_output(rt->top, &logits->t)))
        st = CT_ERR_INTERNAL;
    runtime_use_shadow(rt, 0);
    free(padded);
    if (st != CT_OK) return st;
    int64_t V = logits->t.shape[logits->t.ndim - 1];
    if (ct_tensor_numel(&logits->t) != B * Tpad * V)
        return ct_fail(CT_ERR_INVALID, "model: the last unit must return logits (B, T, V) without targets");
    if (Tpad == T)
        return rt->d->copy(rt->dev, logits_out, logits->t.data, sizeof(float) * (size_t)(B * T * V), CT_COPY_D2H);
    if (!(host = malloc(sizeof(float) * (size_t)(B * Tpad * V)))) return ct_fail(CT_ERR_NOMEM, "out of memory");
    st = rt->d->copy(rt->dev, host, logits->t.data, sizeof(float) * (size_t)(B * Tpad * V), CT_COPY_D2H);
    if (st == CT_OK)
        for (int64_t b = 0; b < B; b++) /* the real positions of each sequence */
            memcpy(logits_out + b * T * V, host + b * Tpad * V, sizeof(float) * (size_t)(T * V));
    free(host);
    return st;
}

ct_status runtime_forward_loss(runtime *rt, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T,
                               double *loss_sum) {
    ct_status st = runtime_reset_arenas(rt);
    runtime_use_shadow(rt, 1);
    rt->act = &rt->saved;
    rt_tensor *tok = st != CT_OK ? NULL : runtime_upload_tokens(rt, tokens, rt->doc_starts, B, T), *tg = NULL, *loss = NULL;
    if (tok) tg = runtime_upload_ids(rt, targets, B, T);
    if (st == CT_OK && !tg) st = CT_ERR_NOMEM;
    if (st == CT_OK)
        st = rt->dist.unit_rank ? forward_units_pp(rt, tok, tg, &loss) : forward_units(rt, tok, tg, 0, &loss);
    runtime_use_shadow(rt, 0);
    if (st != CT_OK) return st;
    if (loss->t.ndim != 0 || loss->t.dtype != CT_F32)
        return ct_fail(CT_ERR_INVALID, "model: the last unit must return a scalar loss when given targets");
    float lf = 0;
    if ((st = rt->d->copy(rt->dev, &lf, loss->t.data, sizeof lf, CT_COPY_D2H)) != CT_OK) return st;
    *loss_sum = lf;
    return CT_OK;
}

ct_status runtime_zero_grads(runtime *rt) {
    ct_status st = rt->d->zero(rt->dev, rt->grad_mem, rt->param_bytes);
    if (st != CT_OK) return st;
    return whole_zero_grads(rt);
}

/* The mesh axes a gradient is split over: the fsdp shard axis, the axis a strategy splits it over
 * (tp), pp (every parameter lives on one stage). */
static unsigned grad_axes(const ct_param_slot *sl, int pp) {
    unsigned mask = pp ? 1u << CT_AXIS_PP : 0;
    if (sl->placement == CT_PLACE_SHARD) mask |= mesh_axis_bits(sl->shard_axis);
    if (sl->split_dim >= 0 && sl->split_parts > 1) mask |= mesh_axis_bits(sl->split_axis);
    return mask;
}

/* Each gradient's sum of squares goes into the bucket of the mesh axes it is split over; each axis
 * then sums the buckets that include it over its group, in the same order on every rank. A gradient
 * that is whole on an axis is the same on every rank of it and counts once. Back-to-back gradients
 * of one bucket are summed in one pass (the padding between them is zero): on one rank, the whole
 * gradient storage in one sum_squares, one wait for the device. */
ct_status runtime_grad_norm(runtime *rt, double *norm) {
    enum { NB = 1 << CT_MESH_NAXES };
    double bucket[NB] = {0}, part[NB];
    int pp = rt->dist.mesh && rt->dist.mesh->degree[CT_AXIS_PP] > 1;
    const int *order = rt->storage_order;
    for (int i = 0; i < rt->n_params;) {
        if (rt->slots[order[i]].copy_of >= 0) { /* a shared parameter counts once */
            i++;
            continue;
        }
        unsigned mask = grad_axes(&rt->slots[order[i]], pp);
        const char *begin = (const char *)rt->slots[order[i]].local_grad, *end = begin;
        for (; i < rt->n_params && rt->slots[order[i]].copy_of < 0 && grad_axes(&rt->slots[order[i]], pp) == mask;
             i++) {
            const ct_param_slot *sl = &rt->slots[order[i]];
            const char *e = (const char *)(sl->local_grad + sl->local_numel);
            if (e > end) end = e;
        }
        double s = 0;
        ct_status st = end > begin ? rt->d->sum_squares(rt->dev, &s, (const float *)begin,
                                                        (int64_t)((size_t)(end - begin) / sizeof(float)))
                                   : CT_OK;
        if (st != CT_OK) return st;
        bucket[mask] += s;
    }
    for (int a = 0; a < CT_MESH_NAXES && rt->dist.capi; a++) {
        if (rt->dist.mesh->degree[a] <= 1) continue;
        for (unsigned m = 0; m < NB; m++) part[m] = (m & (1u << a)) ? bucket[m] : 0.0;
        ct_clear_error();
        double t0 = ct_now();
        ct_status st = rt->dist.capi->all_reduce(rt->dist.comm, rt->dist.mesh->group[a], part, part, NB, CT_F64,
                                                 CT_REDUCE_SUM, NULL);
        rt->comm_seconds += ct_now() - t0;
        if (st != CT_OK) return st;
        for (unsigned m = 0; m < NB; m++)
            if (m & (1u << a)) bucket[m] = part[m];
    }
    double total = 0;
    for (unsigned m = 0; m < NB; m++) total += bucket[m];
    *norm = sqrt(total);
    return CT_OK;
}

/* ---- shared parameters ---- */

/* The pp rank of the stage holding parameter i, and whether that is this rank. */
static int stage_of(const runtime *rt, int i) { return rt->dist.unit_rank ? rt->dist.unit_rank[rt->slots[i].unit] : 0; }

/* Trades n values with the same parameter's other use on pp rank `peer`: send `mine`, receive into
 * `theirs`. Both sides post both operations, then wait. */
static ct_status trade(runtime *rt, int peer, const void *mine, void *theirs, int64_t n, ct_dtype dt, int tag) {
    const ct_comm_api *c = rt->dist.capi;
    ct_comm_group *g = rt->dist.mesh->group[CT_AXIS_PP];
    ct_comm_request *rs = NULL, *rr = NULL;
    ct_clear_error();
    double t0 = ct_now();
    ct_status st = c->recv(rt->dist.comm, g, theirs, n, dt, peer, tag, &rr);
    if (st == CT_OK) st = c->send(rt->dist.comm, g, mine, n, dt, peer, tag, &rs);
    ct_status w1 = rs ? c->wait(rt->dist.comm, rs) : CT_OK, w2 = rr ? c->wait(rt->dist.comm, rr) : CT_OK;
    rt->comm_seconds += ct_now() - t0;
    if (st == CT_OK) st = w1 != CT_OK ? w1 : w2;
    return st;
}

/* What must agree between a shared parameter's copies for their gradients to be summed element by
 * element: the same block of the same flattened parameter. */
static void slot_layout(const ct_param_slot *sl, double lay[6]) {
    lay[0] = sl->placement;
    lay[1] = (double)sl->offset;
    lay[2] = (double)sl->local_numel;
    lay[3] = sl->split_dim;
    lay[4] = sl->split_index;
    lay[5] = sl->shard_axis;
}

ct_status runtime_check_shared(runtime *rt) {
    int me = rt->dist.mesh ? rt->dist.mesh->coord[CT_AXIS_PP] : 0;
    for (int i = 0; i < rt->n_params; i++) {
        int o = rt->slots[i].copy_of;
        if (o < 0) continue;
        const ct_param_slot *a = &rt->slots[o], *b = &rt->slots[i];
        int here = stage_of(rt, i) == me, here_o = stage_of(rt, o) == me;
        if (!here && !here_o) continue;
        double lay[6], other[6];
        slot_layout(here ? b : a, lay);
        if (here && here_o) {
            slot_layout(a, other);
        } else if (trade(rt, here ? stage_of(rt, o) : stage_of(rt, i), lay, other, 6, CT_F64, 0x5a00 + i) != CT_OK) {
            return ct_fail(CT_ERR_INTERNAL, "shared parameter '%s': cannot compare its uses' placement across "
                           "stages: %s", rt->params[o]->t.name, ct_last_error());
        }
        if (memcmp(lay, other, sizeof lay))
            return ct_fail(CT_ERR_INVALID, "shared parameter '%s' is placed differently in unit %d (as '%s') than in "
                           "unit %d: its uses must be split and sharded alike (a tensor-parallel style that splits the "
                           "same dim)", rt->params[o]->t.name, b->unit, b->param->name, a->unit);
    }
    return CT_OK;
}

ct_status runtime_sum_shared_grads(runtime *rt) {
    const ct_device_api *d = rt->d;
    int me = rt->dist.mesh ? rt->dist.mesh->coord[CT_AXIS_PP] : 0;
    for (int i = 0; i < rt->n_params; i++) {
        int o = rt->slots[i].copy_of;
        if (o < 0) continue;
        ct_param_slot *a = &rt->slots[o], *b = &rt->slots[i];
        int here = stage_of(rt, i) == me, here_o = stage_of(rt, o) == me;
        int64_t n = here ? b->local_numel : a->local_numel;
        if ((!here && !here_o) || n == 0) continue;
        size_t bytes = sizeof(float) * (size_t)n;
        ct_status st;
        if (here && here_o) { /* both uses on this rank: each gets the sum */
            st = d->add(rt->dev, b->local_grad, b->local_grad, a->local_grad, n);
            if (st == CT_OK) st = d->copy(rt->dev, a->local_grad, b->local_grad, bytes, CT_COPY_D2D);
            if (st != CT_OK) return st;
            continue;
        }
        if (n > rt->share_buf_n) {
            if (rt->share_buf) d->free(rt->dev, rt->share_buf);
            rt->share_buf_n = 0;
            if (d->alloc(rt->dev, bytes, (void **)&rt->share_buf) != CT_OK) {
                rt->share_buf = NULL;
                return ct_fail(CT_ERR_NOMEM, "out of memory for a shared parameter's gradient (%zu bytes)", bytes);
            }
            rt->share_buf_n = n;
        }
        float *g = here ? b->local_grad : a->local_grad;
        /* a sum of two is the same bits in either order: both stages get the same values */
        st = d->synchronize(rt->dev);
        if (st == CT_OK)
            st = trade(rt, here ? stage_of(rt, o) : stage_of(rt, i), g, rt->share_buf, n, CT_F32, 0x5b00 + i);
        if (st == CT_OK) st = d->add(rt->dev, g, g, rt->share_buf, n);
        if (st != CT_OK) return st;
    }
    return CT_OK;
}

/* Every local gradient lies in grad_mem, the padding zero: one pass. */
ct_status runtime_scale_grads(runtime *rt, float s) {
    return rt->d->scale(rt->dev, (float *)rt->grad_mem, s, (int64_t)(rt->param_bytes / sizeof(float)));
}

/* The block of parameter i (numel floats) into host memory: gathered from the data-parallel
 * shards when sharded (a collective then). */
static ct_status local_block_get(runtime *rt, int i, float *host, int grad) {
    const ct_param_slot *sl = &rt->slots[i];
    const float *src = grad ? sl->local_grad : sl->local_data;
    if (sl->placement == CT_PLACE_REPLICATE)
        return rt->d->copy(rt->dev, host, src, sizeof(float) * (size_t)sl->numel, CT_COPY_D2H);
    /* sharded: gather every rank's piece (zero-padded blocks in rank order) */
    int size = mesh_shard_degree(rt->dist.mesh, sl->shard_axis);
    size_t bytes = sizeof(float) * (size_t)sl->local_numel * (size_t)size;
    float *full = NULL;
    ct_status st = rt->d->alloc(rt->dev, bytes, (void **)&full);
    if (st != CT_OK) return st;
    st = rt->dist.capi->all_gather(rt->dist.comm, mesh_shard_group(rt->dist.mesh, sl->shard_axis), src, full,
                                   sl->local_numel, CT_F32, NULL);
    if (st == CT_OK) st = rt->d->copy(rt->dev, host, full, sizeof(float) * (size_t)sl->numel, CT_COPY_D2H);
    rt->d->free(rt->dev, full);
    return st;
}

static ct_status param_get_here(runtime *rt, int i, float *host, int grad);

/* Under pipeline parallel the stage that holds the parameter reads it, then broadcasts it over pp. */
ct_status runtime_param_get(runtime *rt, int i, float *host, int grad) {
    const ct_param_slot *sl = &rt->slots[i];
    if (!rt->dist.unit_rank) return param_get_here(rt, i, host, grad);
    ct_status st = sl->placement != CT_PLACE_NONE ? param_get_here(rt, i, host, grad) : CT_OK;
    if (st != CT_OK) return st;
    int64_t n = 1;
    for (int d = 0; d < sl->param->ndim; d++) n *= sl->global_shape[d];
    return runtime_stage_broadcast(rt, sl->unit, host, n);
}

ct_status runtime_stage_broadcast(runtime *rt, int unit, float *host, int64_t n) {
    if (!rt->dist.unit_rank) return CT_OK;
    int owner = rt->dist.unit_rank[unit];
    float *dev = NULL; /* through the device: a comm backend may move device memory only */
    ct_status st = rt->d->alloc(rt->dev, sizeof(float) * (size_t)(n > 0 ? n : 1), (void **)&dev);
    if (st != CT_OK) return st;
    if (rt->dist.mesh->coord[CT_AXIS_PP] == owner) st = rt->d->copy(rt->dev, dev, host, sizeof(float) * (size_t)n, CT_COPY_H2D);
    if (st == CT_OK)
        st = rt->dist.capi->broadcast(rt->dist.comm, rt->dist.mesh->group[CT_AXIS_PP], dev, n, CT_F32, owner,
                                      NULL);
    if (st == CT_OK) st = rt->d->copy(rt->dev, host, dev, sizeof(float) * (size_t)n, CT_COPY_D2H);
    rt->d->free(rt->dev, dev);
    return st;
}

static ct_status param_get_here(runtime *rt, int i, float *host, int grad) {
    const ct_param_slot *sl = &rt->slots[i];
    if (sl->split_dim < 0) return local_block_get(rt, i, host, grad);
    /* split over a mesh axis: every rank's block, placed where it belongs */
    int parts = sl->split_parts;
    int64_t n = sl->numel;
    float *blocks = malloc(sizeof(float) * (size_t)n * (size_t)parts), *dev = NULL;
    ct_status st = blocks ? local_block_get(rt, i, blocks, grad) : CT_ERR_NOMEM;
    if (st == CT_OK) st = rt->d->alloc(rt->dev, sizeof(float) * (size_t)n * (size_t)(parts + 1), (void **)&dev);
    if (st == CT_OK) st = rt->d->copy(rt->dev, dev, blocks, sizeof(float) * (size_t)n, CT_COPY_H2D);
    if (st == CT_OK)
        st = rt->dist.capi->all_gather(rt->dist.comm, mesh_shard_group(rt->dist.mesh, sl->split_axis), dev, dev + n, n,
                                       CT_F32, NULL);
    if (st == CT_OK) st = rt->d->copy(rt->dev, blocks, dev + n, sizeof(float) * (size_t)n * (size_t)parts, CT_COPY_D2H);
    if (st == CT_OK) {
        ct_param_slot other = *sl;
        for (int p = 0; p < parts; p++) {
            other.split_index = p;
            for (int64_t k = 0; k < n; k++) host[runtime_global_index(&other, k)] = blocks[(int64_t)p * n + k];
        }
    }
    if (dev) rt->d->free(rt->dev, dev);
    free(blocks);
    return st;
}

/* Sets parameter i from the whole (global) tensor in host memory: this rank keeps its part. */
ct_status runtime_param_set(runtime *rt, int i, const float *host) {
    const ct_param_slot *sl = &rt->slots[i];
    float *block = NULL;
    if (sl->placement == CT_PLACE_NONE) return CT_OK; /* another pipeline stage's */
    if (sl->split_dim >= 0) { /* this rank's block first */
        if (!(block = malloc(sizeof(float) * (size_t)sl->numel))) return CT_ERR_NOMEM;
        for (int64_t k = 0; k < sl->numel; k++) block[k] = host[runtime_global_index(sl, k)];
        host = block;
    }
    int64_t n = sl->numel - sl->offset;
    if (n > sl->local_numel) n = sl->local_numel;
    if (n < 0) n = 0;
    ct_status st = rt->d->zero(rt->dev, sl->local_data, sizeof(float) * (size_t)sl->local_numel);
    if (st == CT_OK)
        st = rt->d->copy(rt->dev, sl->local_data, host + sl->offset, sizeof(float) * (size_t)n, CT_COPY_H2D);
    free(block);
    return st;
}

int runtime_find_param(runtime *rt, const char *name) {
    for (int i = 0; i < rt->n_params; i++)
        if (strcmp(rt->params[i]->t.name, name) == 0) return i;
    return -1;
}

