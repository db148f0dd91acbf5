/* muon.c: the Muon optimizer (Keller Jordan's, with Moonlight's update scale: Liu et al. 2025, "Muon
 * is Scalable for LLM Training") for the 2-D weights of linear layers, AdamW for every other
 * parameter (embeddings, the output head, norms, biases).
 *
 * Muon, per weight W (rows, cols) with gradient g and momentum m (state 0):
 *   m = mu m + g;  u = g + mu m (nesterov) or m;  O = NewtonSchulz5(u / (||u||_F + 1e-7))
 *   W *= 1 - lr wd;  W -= lr * scale * O,   scale = 0.2 sqrt(max(rows, cols)) (moonlight)
 *                                             or sqrt(max(1, rows / cols))      (original)
 * O is computed on the whole matrix however the weight is sharded or split (whole.c). */
#include "muon.h"

#include <fnmatch.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "momentum", CT_OPT_FLOAT, "0.95", "Muon momentum mu", "[0, 1)", NULL},
    {sizeof(ct_option_spec), "nesterov", CT_OPT_BOOL, "true", "Nesterov update g + mu m (false: m)", NULL, NULL},
    {sizeof(ct_option_spec), "ns_steps", CT_OPT_INT, "5", "Newton-Schulz iterations", "[1, 100]", NULL},
    {sizeof(ct_option_spec), "weight_decay", CT_OPT_FLOAT, "0.1", "decoupled weight decay of Muon's weights",
     "[0, 1000]", NULL},
    {sizeof(ct_option_spec), "adjust_lr", CT_OPT_STRING, "moonlight",
     "update scale: moonlight (0.2 sqrt(max(rows, cols))) | original (sqrt(max(1, rows/cols)))", NULL,
     "moonlight|original"},
    {sizeof(ct_option_spec), "muon_exclude", CT_OPT_STRING, "output.weight,lm_head.weight,*embed*",
     "comma-separated name patterns (fnmatch) of linear weights left to AdamW", NULL, NULL},
    {sizeof(ct_option_spec), "adamw_beta1", CT_OPT_FLOAT, "0.9", "AdamW first-moment decay", "[0, 1)", NULL},
    {sizeof(ct_option_spec), "adamw_beta2", CT_OPT_FLOAT, "0.95", "AdamW second-moment decay", "[0, 1)", NULL},
    {sizeof(ct_option_spec), "adamw_eps", CT_OPT_FLOAT, "1e-8", "AdamW denominator epsilon", "(0, 1]", NULL},
    {sizeof(ct_option_spec), "adamw_weight_decay", CT_OPT_FLOAT, "0.1",
     "AdamW decoupled weight decay (none on norms and biases)", "[0, 1000]", NULL},
    {0},
};

float *muon_buf(muon *o, int which, int64_t n) {
    if (n <= o->cap[which]) return o->buf[which];
    if (o->buf[which]) {
        o->d->free(o->dev, o->buf[which]);
        o->host->mem_account(o->host, CT_MEM_OPTIMIZER, -o->cap[which] * (int64_t)sizeof(float));
    }
    o->buf[which] = NULL;
    o->cap[which] = 0;
    if (o->d->alloc(o->dev, (size_t)n * sizeof(float), (void **)&o->buf[which]) != CT_OK) {
        o->host->set_error(o->host, "cannot allocate %lld f32 of scratch", (long long)n);
        return NULL;
    }
    o->cap[which] = n;
    o->host->mem_account(o->host, CT_MEM_OPTIMIZER, n * (int64_t)sizeof(float));
    return o->buf[which];
}

static void muon_destroy(ct_optimizer *p) {
    muon *o = p;
    for (int i = 0; i < N_BUFS; i++)
        if (o->buf[i]) {
            o->d->free(o->dev, o->buf[i]);
            o->host->mem_account(o->host, CT_MEM_OPTIMIZER, -o->cap[i] * (int64_t)sizeof(float));
        }
    free(o->exclude);
    free(o);
}

/* Splits muon_exclude at its commas in place; an empty pattern is an error. */
static int parse_exclude(muon *o, const char *list) {
    size_t len = strlen(list) + 1;
    if (!(o->exclude = malloc(len))) return -1;
    memcpy(o->exclude, list, len);
    if (!*list) return 0; /* "": every linear weight is Muon's */
    for (char *s = o->exclude;; s++) {
        char *end = strchr(s, ',');
        if (end) *end = 0;
        if (!*s) {
            o->host->set_error(o->host, "muon_exclude: expected comma-separated non-empty patterns, got '%s'", list);
            return -1;
        }
        o->n_exclude++;
        if (!end) return 0;
        s = end;
    }
}

static ct_status read_options(muon *o) {
    const ct_host *h = o->host;
    const char *adjust = "moonlight", *exclude = "";
    ct_status st = h->opt_float(h, "momentum", &o->momentum);
    if (!st) st = h->opt_bool(h, "nesterov", &o->nesterov);
    if (!st) st = h->opt_int(h, "ns_steps", &o->ns_steps);
    if (!st) st = h->opt_float(h, "weight_decay", &o->weight_decay);
    if (!st) st = h->opt_string(h, "adjust_lr", &adjust);
    if (!st) st = h->opt_string(h, "muon_exclude", &exclude);
    if (!st) st = h->opt_float(h, "adamw_beta1", &o->beta1);
    if (!st) st = h->opt_float(h, "adamw_beta2", &o->beta2);
    if (!st) st = h->opt_float(h, "adamw_eps", &o->eps);
    if (!st) st = h->opt_float(h, "adamw_weight_decay", &o->adamw_weight_decay);
    if (st) return st;
    /* the host checks the ranges above before create; these guard a host that does not. Each error
     * starts with its key, so the host reports it where the key was set. */
    if (!(o->momentum >= 0 && o->momentum < 1)) h->set_error(h, "momentum: expected 0 <= momentum < 1, got %g", o->momentum);
    else if (o->ns_steps < 1 || o->ns_steps > 100)
        h->set_error(h, "ns_steps: expected 1 <= ns_steps <= 100, got %lld", (long long)o->ns_steps);
    else if (!(o->weight_decay >= 0 && o->weight_decay <= 1e3))
        h->set_error(h, "weight_decay: expected 0 <= weight_decay <= 1000, got %g", o->weight_decay);
    else if (strcmp(adjust, "moonlight") && strcmp(adjust, "original"))
        h->set_error(h, "adjust_lr: expected moonlight or original, got '%s'", adjust);
    else if (!(o->beta1 >= 0 && o->beta1 < 1)) h->set_error(h, "adamw_beta1: expected 0 <= adamw_beta1 < 1, got %g", o->beta1);
    else if (!(o->beta2 >= 0 && o->beta2 < 1)) h->set_error(h, "adamw_beta2: expected 0 <= adamw_beta2 < 1, got %g", o->beta2);
    else if (!(o->eps > 0 && o->eps <= 1)) h->set_error(h, "adamw_eps: expected 0 < adamw_eps <= 1, got %g", o->eps);
    else if (!(o->adamw_weight_decay >= 0 && o->adamw_weight_decay <= 1e3))
        h->set_error(h, "adamw_weight_decay: expected 0 <= adamw_weight_decay <= 1000, got %g", o->adamw_weight_decay);
    else {
        o->moonlight = !strcmp(adjust, "moonlight");
        return parse_exclude(o, exclude) ? CT_ERR_INVALID : CT_OK;
    }
    return CT_ERR_INVALID;
}

static ct_status muon_create(const ct_host *h, const ct_device_api *d, ct_device *dev, ct_optimizer **out) {
    muon *o = calloc(1, sizeof *o);
    if (!o) return CT_ERR_NOMEM;
    o->host = h;
    o->d = d;
    o->dev = dev;
    ct_status st = read_options(o);
    if (st) {
        muon_destroy(o);
        return st;
    }
    *out = o;
    return CT_OK;
}

static int muon_state_count(ct_optimizer *p) {
    (void)p;
    return 2; /* Muon: the momentum (state 1 unused); AdamW: m and v */
}

static int muon_elementwise(ct_optimizer *p) {
    (void)p;
    return 0; /* each matrix needs its shape */
}

static ct_status muon_attach(ct_optimizer *p, const ct_optimizer_env *env) {
    muon *o = p;
    if (!CT_HAS_FIELD(env, ct_optimizer_env, mesh) || !env->capi || !env->comm || !env->mesh) {
        o->host->set_error(o->host, "attach: the host handed no comm or mesh");
        return CT_ERR_INVALID;
    }
    o->capi = env->capi;
    o->comm = env->comm;
    o->mesh = env->mesh;
    return CT_OK;
}

/* Muon's: a 2-D linear weight whose name no muon_exclude pattern matches. */
static int is_muon_param(const muon *o, const ct_tensor *p) {
    if (p->ndim != 2 || !(p->flags & CT_TENSOR_LINEAR)) return 0;
    const char *pat = o->exclude;
    for (int i = 0; i < o->n_exclude; i++, pat += strlen(pat) + 1)
        if (p->name && fnmatch(pat, p->name, 0) == 0) return 0;
    return 1;
}

static ct_status muon_update(muon *o, const ct_param_slot *sl, float *mom, float lr) {
    int64_t n = sl->local_numel, rows = sl->global_shape[0], cols = sl->global_shape[1];
    float *u = muon_buf(o, BUF_U, n);
    if (!u) return CT_ERR_NOMEM;
    float mu = (float)o->momentum;
    ct_status st = o->d->scale(o->dev, mom, mu, n); /* m = mu m + g */
    if (!st) st = o->d->axpy(o->dev, mom, sl->local_grad, 1.0f, n);
    if (!st) st = o->d->copy(o->dev, u, o->nesterov ? sl->local_grad : mom, (size_t)n * sizeof(float), CT_COPY_D2D);
    if (!st && o->nesterov) st = o->d->axpy(o->dev, u, mom, mu, n); /* u = g + mu m */
    if (!st) st = muon_orthogonalise(o, sl, u);
    if (st) return st;
    double big = (double)(rows > cols ? rows : cols), ratio = (double)rows / (double)cols;
    double scale = o->moonlight ? 0.2 * sqrt(big) : sqrt(ratio > 1 ? ratio : 1.0);
    st = o->d->scale(o->dev, sl->local_data, (float)(1.0 - (double)lr * o->weight_decay), n);
    if (!st) st = o->d->axpy(o->dev, sl->local_data, u, (float)(-(double)lr * scale), n);
    return st;
}

static ct_status muon_step_param(ct_optimizer *p, const ct_param_slot *sl, float *const *state, float lr,
                                 int64_t step) {
    muon *o = p;
    if (sl->local_numel == 0) return CT_OK; /* another pipeline stage's: its whole group skips it too */
    if (is_muon_param(o, sl->param)) return muon_update(o, sl, state[0], lr);
    float wd = (sl->param->flags & CT_TENSOR_NO_DECAY) ? 0.0f : (float)o->adamw_weight_decay;
    return o->d->adamw(o->dev, sl->local_data, sl->local_grad, state[0], state[1], sl->local_numel, lr,
                       (float)o->beta1, (float)o->beta2, (float)o->eps, wd, step);
}

/* A host without step_param hands flat views: Muon cannot see the matrices. */
static ct_status muon_step(ct_optimizer *p, ct_tensor *param, float *const *state, int64_t numel, float lr,
                           int64_t step) {
    muon *o = p;
    (void)state, (void)numel, (void)lr, (void)step;
    o->host->set_error(o->host, "%s: Muon needs a host that calls step_param (ABI 2.1)",
                       param->name ? param->name : "parameter");
    return CT_ERR_UNSUPPORTED;
}

/* For the planner (ABI 2.2): one update of a slot as muon_step_param runs it, without the device.
 * AdamW's slots: the device's adamw op, 7 f32 of traffic and 14 FLOPs per element. Muon's weight,
 * n = local_numel values of a block of B = numel values of the whole W (rows, cols), N = rows cols,
 * k = min(rows, cols), l = max(rows, cols):
 *   momentum and u      m *= mu, m += g, u = g, u += mu m   8n + 12n + 8n + 12n (without Nesterov 28n)
 *   gather_whole        the shard all-gathered over the shard axis, the blocks over the split axis
 *                       (comm_bytes: each whole gathered buffer), the blocks laid out 8N
 *   Newton-Schulz       copy to X 8N, norm 4N, scale 8N; per step A = X X^T (2 k k l), B = c A A
 *                       (2 k^3), B += b A (12 k^2), Y = X copy (8N), Y = B X + a Y (2 k k l)
 *   keep_part           the block out of the whole 8B (split), this rank's part 8B or 12n (sharded)
 *   update              W *= 1 - lr wd, W -= lr scale O   8n + 12n
 * The comm's parts come from attach's mesh; a planning instance without it takes them from the
 * padding (ceil(numel / local_numel)), which equals the degree unless the rows do not split evenly. */
static ct_status muon_plan_step(ct_optimizer *p, const ct_param_slot *sl, ct_optimizer_cost *cost) {
    muon *o = p;
    double n = (double)sl->local_numel, f = sizeof(float);
    *cost = (ct_optimizer_cost){.struct_size = cost->struct_size};
    if (sl->local_numel == 0) return CT_OK; /* another pipeline stage's */
    if (!is_muon_param(o, sl->param)) {
        cost->bytes = 7 * f * n;
        cost->flops = 14 * n;
        return CT_OK;
    }
    double rows = (double)sl->global_shape[0], cols = (double)sl->global_shape[1], N = rows * cols;
    double B = (double)sl->numel, k = rows < cols ? rows : cols, l = rows < cols ? cols : rows, ns = (double)o->ns_steps;
    int split = sl->split_dim >= 0 && sl->split_parts > 1, sharded = sl->placement == CT_PLACE_SHARD;
    cost->bytes = f * (o->nesterov ? 40 : 28) * n + f * (8 + 4 + 8) * N + ns * f * (8 * N + 12 * k * k) + f * 20 * n;
    cost->flops = (o->nesterov ? 5 : 3) * n + 3 * N + ns * 2 * k * k + 3 * n;
    cost->matmul_flops = ns * (4 * k * k * l + 2 * k * k * k);
    if (sharded) {
        int axis = sl->shard_axis;
        double parts = muon_axis_degree(o->mesh, axis) ? muon_axis_degree(o->mesh, axis) : ceil(B / (sl->local_numel ? n : 1));
        cost->comm_bytes += f * n * parts;
        cost->bytes += f * 12 * n;
    } else {
        cost->bytes += f * 8 * B;
    }
    if (split) {
        cost->comm_bytes += f * B * sl->split_parts;
        cost->bytes += f * 8 * N + f * 8 * B;
    }
    return CT_OK;
}

static const ct_optimizer_api api = {
    .struct_size = sizeof(ct_optimizer_api),
    .create = muon_create,
    .destroy = muon_destroy,
    .state_count = muon_state_count,
    .step = muon_step,
    .elementwise = muon_elementwise,
    .attach = muon_attach,
    .step_param = muon_step_param,
    .plan_step = muon_plan_step,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_OPTIMIZER;
    info->name = "muon";
    info->description = "Muon (Newton-Schulz orthogonalised momentum, Moonlight's scale) for linear weights, "
                        "AdamW for the rest";
    info->options = options;
    info->api = &api;
    return CT_OK;
}
