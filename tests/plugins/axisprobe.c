/* axisprobe.c: a third party's strategy for a mesh axis, as parallelism.strategies loads it with no
 * change to the core; used by tests/cli/strategy_list.sh. It says what it serves (ABI 2.22: the tp axis
 * here; axisprobe_cp.c builds the same code for the cp axis), leaves every parameter whole on every rank
 * of its axis (so a run computes one rank's function), and wraps the builder's linear: the first linear
 * of each instance logs one line, "first linear (rank R)" (the host prefixes the plugin name), before it calls the builder
 * below. The pack calls the outermost builder, so those lines come in the reverse of the list's order:
 * the test reads the wrapping order from them. It reports no costs of its own, so the planner runs it too.
 */
#include "ctitan/model.h"
#include "ctitan/strategy.h"
#include "ctitan/util.h"

#include <stdlib.h>

#ifndef AXISPROBE_AXIS
#define AXISPROBE_AXIS CT_AXIS_TP
#define AXISPROBE_NAME "axisprobe"
#endif

typedef struct ct_strategy { /* the ABI's opaque ct_strategy */
    const ct_host *host;
    ct_builder *next;
    int rank;   /* in the world; -1 on a planning instance */
    int logged; /* the first linear is logged */
} probe;

static ct_status probe_create(const ct_host *host, const ct_strategy_env *env, ct_strategy **out) {
    probe *p = calloc(1, sizeof *p);
    if (!p) return CT_ERR_NOMEM;
    p->host = host;
    p->rank = env->planning ? -1 : env->mesh->world_rank;
    *out = p;
    return CT_OK;
}

static void probe_destroy(ct_strategy *s) { free(s); }

/* Every slot stays as the host made it (whole) or as an earlier strategy placed it. */
static ct_status probe_place(ct_strategy *s, ct_param_slot *slots, int n) {
    (void)s;
    (void)slots;
    (void)n;
    return CT_OK;
}

static ct_status probe_setup(ct_strategy *s, ct_param_slot *slots, int n, int n_units) {
    (void)s;
    (void)n_units;
    ct_util_use_local_storage(slots, n);
    return CT_OK;
}

static ct_status probe_post_backward(ct_strategy *s, int unit, int last) {
    (void)s;
    (void)unit;
    (void)last;
    return CT_OK;
}

static ct_status probe_finish(ct_strategy *s) {
    (void)s;
    return CT_OK;
}

static ct_tensor *probe_linear(ct_builder *b, ct_tensor *x, ct_tensor *w) {
    probe *p = b->ctx;
    if (!p->logged) {
        p->logged = 1;
        p->host->log(p->host, CT_LOG_WARN, "first linear (rank %d)", p->rank);
    }
    return p->next->linear(p->next, x, w);
}

static ct_status probe_wrap(ct_strategy *s, ct_builder *next, ct_builder *out) {
    s->next = next;
    out->ctx = s;
    out->linear = probe_linear;
    return CT_OK;
}

static ct_status probe_report(ct_strategy *s, int n_microbatches, ct_strategy_report *out) {
    (void)s;
    (void)n_microbatches;
    ct_util_report_clear(out);
    return CT_OK;
}

static const ct_strategy_api api = {
    .struct_size = sizeof(ct_strategy_api),
    .create = probe_create,
    .destroy = probe_destroy,
    .place = probe_place,
    .setup = probe_setup,
    .pre_forward = ct_util_unit_noop,
    .post_forward = ct_util_unit_noop,
    .pre_backward = ct_util_unit_noop,
    .post_backward = probe_post_backward,
    .finish_backward = probe_finish,
    .wrap_builder = probe_wrap,
    .report = probe_report,
    .serves = CT_SERVES_AXIS,
    .axis = AXISPROBE_AXIS,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_STRATEGY;
    info->name = AXISPROBE_NAME;
    info->description = "test: a third party's strategy for one mesh axis; logs its first linear";
    info->api = &api;
    return CT_OK;
}
