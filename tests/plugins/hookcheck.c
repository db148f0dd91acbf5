/* hookcheck.c: a test strategy that holds the host to the hook order strategy.h documents ("Life of
 * a run"), used by tests/cli/strategy_hooks.sh as parallelism.dp_strategy by path.
 *
 * It places every parameter replicated, computes on the replica and all-reduces each unit's
 * gradients over dp_replicate at its post_backward with last (as DDP). It records every hook call
 * and fails the call (CT_ERR_INTERNAL, one message naming the rule) on the first violation of:
 *   units      hooks name units of this rank's stages only (a unit with a placed parameter)
 *   forward    pre_forward(u), forward, post_forward(u): one forward window at a time, no
 *              backward hook inside it; a microbatch reaches u after u-1 (same rank)
 *   backward   pre_backward(u) after u's forward of that microbatch and after u+1's backward;
 *              post_backward(u) closes an open window (zero-bubble windows of u may overlap),
 *              once per microbatch: per backward period as many as forwards and pre_backwards
 *   last       on u's final post_backward only: nothing for u after it until finish_backward,
 *              and on every unit of this rank or on none in one period
 *   finish     finish_backward after every window closed and every microbatch's post_backward;
 *              with parallelism.hookcheck_microbatches set, each local unit saw that many
 *              microbatches' hooks in the period (forward hooks per microbatch, not per step)
 * A backward period is what lies between two finish_backward calls (one microbatch without PP, one
 * local batch with PP). Forward-only passes (sampling) are not expected: run with
 * generate.max_new_tokens=0. At destroy it logs its totals, which the test compares with units x
 * microbatches x steps.
 */
#include "ctitan/strategy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct unit_rec {
    int own;                /* 1: a parameter placed here; 0: only other stages' parameters; -1: none */
    int fwd_pre, fwd_post;  /* this period */
    int bwd_pre, bwd_post;  /* this period */
    int open;               /* backward windows open */
    int done;               /* post_backward with last seen this period */
} unit_rec;

typedef struct ct_strategy { /* the ABI's opaque ct_strategy */
    const ct_host *host;
    ct_strategy_env env;
    ct_mesh_info mesh;
    ct_param_slot *slots;
    int n_slots, n_units, n_local;
    unit_rec *u;
    int in_forward; /* the unit whose forward window is open, -1 none */
    int64_t expect_mb; /* microbatches per backward period, 0: not checked */
    /* totals over the run */
    long pre_forward, post_forward, pre_backward, post_backward, lasts, finishes;
    int max_open;   /* most backward windows of one unit open at once */
} hookcheck;

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "hookcheck_microbatches", CT_OPT_INT, "0",
     "microbatches per backward period the hooks must show (0: not checked)", NULL, NULL},
    {0},
};

/* One message naming the rule and the call: "pre_forward(3) ..." or "finish_backward: unit 3 ...". */
static ct_status violated(hookcheck *h, const char *rule, const char *hook, int unit, const char *what) {
    if (strcmp(hook, "finish_backward")) h->host->set_error(h->host, "hook order rule '%s' violated: %s(%d) %s", rule, hook, unit, what);
    else if (unit >= 0) h->host->set_error(h->host, "hook order rule '%s' violated: %s: unit %d %s", rule, hook, unit, what);
    else h->host->set_error(h->host, "hook order rule '%s' violated: %s %s", rule, hook, what);
    return CT_ERR_INTERNAL;
}

static ct_status hc_create(const ct_host *host, const ct_strategy_env *env, ct_strategy **out) {
    if (env->mesh->degree[CT_AXIS_DP_SHARD] > 1) {
        host->set_error(host, "hookcheck replicates only: set data_parallel_shard_degree to 1");
        return CT_ERR_INVALID;
    }
    hookcheck *h = calloc(1, sizeof *h);
    if (!h) return CT_ERR_NOMEM;
    h->host = host;
    h->env = *env;
    h->mesh = *env->mesh;
    h->in_forward = -1;
    host->opt_int(host, "hookcheck_microbatches", &h->expect_mb);
    *out = h;
    return CT_OK;
}

static void hc_destroy(ct_strategy *p) {
    hookcheck *h = p;
    if (!h) return;
    if (h->u) /* the totals the test compares */
        h->host->log(h->host, CT_LOG_WARN, /* stderr: every rank's; the rank keeps equal lines apart */
                     "hookcheck totals: rank %d units %d pre_forward %ld post_forward %ld pre_backward %ld post_backward %ld "
                     "last %ld finish_backward %ld max_open_windows %d",
                     h->mesh.world_rank, h->n_local, h->pre_forward, h->post_forward, h->pre_backward, h->post_backward, h->lasts,
                     h->finishes, h->max_open);
    free(h->u);
    free(h);
}

static ct_status hc_place(ct_strategy *p, ct_param_slot *slots, int n) {
    (void)p;
    for (int i = 0; i < n; i++) {
        ct_param_slot *s = CT_SLOT_AT(slots, i);
        if (s->placement == CT_PLACE_NONE) continue; /* another pipeline stage's */
        s->placement = CT_PLACE_REPLICATE;
        s->local_numel = s->numel;
        s->offset = 0;
    }
    return CT_OK;
}

static ct_status hc_setup(ct_strategy *p, ct_param_slot *slots, int n, int n_units) {
    hookcheck *h = p;
    h->slots = slots;
    h->n_slots = n;
    h->n_units = n_units;
    h->u = calloc((size_t)n_units + 1, sizeof *h->u);
    if (!h->u) return CT_ERR_NOMEM;
    for (int k = 0; k < n_units; k++) h->u[k].own = -1;
    for (int i = 0; i < n; i++) {
        ct_param_slot *s = CT_SLOT_AT(slots, i);
        if (s->unit < 0 || s->unit >= n_units) return CT_ERR_INVALID;
        unit_rec *r = &h->u[s->unit];
        if (s->placement == CT_PLACE_NONE) {
            if (r->own < 0) r->own = 0;
            continue;
        }
        r->own = 1;
        s->param->data = s->local_data; /* the model computes on the replica itself */
        s->param->grad = s->local_grad;
    }
    for (int k = 0; k < n_units; k++) h->n_local += h->u[k].own == 1;
    return CT_OK;
}

/* The checks every unit hook shares: a unit of this rank, no hook for it after its last. */
static ct_status unit_hook(hookcheck *h, const char *hook, int k) {
    if (k < 0 || k >= h->n_units) return violated(h, "units", hook, k, "names no unit of the model");
    if (h->u[k].own == 0) return violated(h, "units", hook, k, "names a unit of another pipeline stage");
    if (h->u[k].done) return violated(h, "last", hook, k, "comes after the unit's post_backward with last");
    return CT_OK;
}

static ct_status hc_pre_forward(ct_strategy *p, int k) {
    hookcheck *h = p;
    ct_status st = unit_hook(h, "pre_forward", k);
    if (st) return st;
    if (h->in_forward >= 0) return violated(h, "forward", "pre_forward", k, "while another unit's forward window is open");
    unit_rec *r = &h->u[k];
    if (k > 0 && h->u[k - 1].own == 1 && h->u[k - 1].fwd_post <= r->fwd_pre)
        return violated(h, "forward", "pre_forward", k, "before the previous unit's forward of that microbatch");
    h->in_forward = k;
    r->fwd_pre++;
    h->pre_forward++;
    return CT_OK;
}

static ct_status hc_post_forward(ct_strategy *p, int k) {
    hookcheck *h = p;
    ct_status st = unit_hook(h, "post_forward", k);
    if (st) return st;
    if (h->in_forward != k) return violated(h, "forward", "post_forward", k, "without its pre_forward just before");
    h->in_forward = -1;
    h->u[k].fwd_post++;
    h->post_forward++;
    return CT_OK;
}

static ct_status hc_pre_backward(ct_strategy *p, int k) {
    hookcheck *h = p;
    ct_status st = unit_hook(h, "pre_backward", k);
    if (st) return st;
    unit_rec *r = &h->u[k];
    if (h->in_forward >= 0) return violated(h, "forward", "pre_backward", k, "inside a forward window");
    if (r->bwd_pre >= r->fwd_post)
        return violated(h, "backward", "pre_backward", k, "for a microbatch whose forward has not run on the unit");
    if (k + 1 < h->n_units && h->u[k + 1].own == 1 && h->u[k + 1].bwd_pre <= r->bwd_pre)
        return violated(h, "backward", "pre_backward", k, "before the next unit's backward of that microbatch");
    r->bwd_pre++;
    r->open++;
    if (r->open > h->max_open) h->max_open = r->open;
    h->pre_backward++;
    return CT_OK;
}

static ct_status hc_post_backward(ct_strategy *p, int k, int last) {
    hookcheck *h = p;
    ct_status st = unit_hook(h, "post_backward", k);
    if (st) return st;
    unit_rec *r = &h->u[k];
    if (h->in_forward >= 0) return violated(h, "forward", "post_backward", k, "inside a forward window");
    if (r->open < 1) return violated(h, "backward", "post_backward", k, "with no backward window open");
    r->open--;
    r->bwd_post++;
    h->post_backward++;
    if (!last) return CT_OK;
    if (r->open || r->bwd_post != r->fwd_post)
        return violated(h, "last", "post_backward", k, "has last set before the unit's final microbatch");
    r->done = 1;
    h->lasts++;
    if (h->mesh.dp_size <= 1 || !h->mesh.group[CT_AXIS_DP_REPLICATE]) return CT_OK;
    for (int i = 0; i < h->n_slots; i++) { /* sum over replicas, as DDP */
        ct_param_slot *s = CT_SLOT_AT(h->slots, i);
        if (s->unit != k || s->placement == CT_PLACE_NONE) continue;
        st = h->env.capi->all_reduce(h->env.comm, h->mesh.group[CT_AXIS_DP_REPLICATE], s->local_grad, s->local_grad,
                                     s->numel, CT_F32, CT_REDUCE_SUM, NULL);
        if (st) return st;
    }
    return CT_OK;
}

static ct_status hc_finish_backward(ct_strategy *p) {
    hookcheck *h = p;
    int done = 0;
    if (h->in_forward >= 0)
        return violated(h, "finish", "finish_backward", h->in_forward, "has its forward window still open");
    for (int k = 0; k < h->n_units; k++) {
        unit_rec *r = &h->u[k];
        if (r->own != 1) continue;
        if (r->open) return violated(h, "finish", "finish_backward", k, "has a backward window still open");
        if (r->fwd_post == 0 || r->bwd_pre != r->fwd_post || r->bwd_post != r->fwd_post)
            return violated(h, "backward", "finish_backward", k,
                            "got other counts of forwards, pre_backwards and post_backwards in this period");
        if (h->expect_mb > 0 && r->fwd_post != h->expect_mb) {
            char what[160];
            snprintf(what, sizeof what, "saw the hooks of %d microbatches in this period, not %lld", r->fwd_post,
                     (long long)h->expect_mb);
            return violated(h, "microbatches", "finish_backward", k, what);
        }
        done += r->done;
    }
    if (done && done != h->n_local)
        return violated(h, "last", "finish_backward", -1, "after some of this rank's units got last and others not");
    for (int k = 0; k < h->n_units; k++) {
        unit_rec *r = &h->u[k];
        r->fwd_pre = r->fwd_post = r->bwd_pre = r->bwd_post = r->done = 0;
    }
    h->finishes++;
    return CT_OK;
}

static const ct_strategy_api api = {
    .struct_size = sizeof(ct_strategy_api),
    .create = hc_create,
    .destroy = hc_destroy,
    .place = hc_place,
    .setup = hc_setup,
    .pre_forward = hc_pre_forward,
    .post_forward = hc_post_forward,
    .pre_backward = hc_pre_backward,
    .post_backward = hc_post_backward,
    .finish_backward = hc_finish_backward,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_STRATEGY;
    info->name = "hookcheck";
    info->description = "test: replicated parameters; fails on any hook call out of the documented order";
    info->options = options;
    info->api = &api;
    return CT_OK;
}
