/* knobcheck.c: a third party's strategy that declares its own search knobs (ABI 2.21,
 * ct_plugin_info.knobs), used by tests/cli/plan_knobs.sh as parallelism.cp_strategy by path: the
 * planner must vary them, price each value through this plugin's report and write the best value in
 * the manifest it proposes, knowing neither key.
 *
 * It computes nothing of its own (each cp rank keeps its sequence chunk's attention local), and its
 * report says what its knobs cost per unit and microbatch over the cp axis:
 *   knobcheck_exchange   "gather" (the first value, where a search starts): an all-gather of
 *                        knobcheck_gather_gib GiB, exposed; "none": nothing
 *   knobcheck_overlap    false (first): the gather shows; true: it is hidden behind compute
 * A search tunes one knob at a time in this order: overlap first (true hides the gather), then the
 * exchange ("none" drops it), so its best layout with cp > 1 sets both to their second value; one
 * that kept the first values would show the gather in its step time. Built with -DKNOBCHECK_BAD_KNOB its knob list names an
 * option it does not have, which the host must refuse at load with one line.
 */
#include "ctitan/strategy.h"
#include "ctitan/util.h"

#include <stdlib.h>
#include <string.h>

typedef struct ct_strategy { /* the ABI's opaque ct_strategy */
    const ct_host *host;
    ct_strategy_env env;
    int gather, overlap;
    double gib;
} knobcheck;

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "knobcheck_exchange", CT_OPT_STRING, "gather",
     "gather: an exposed all-gather per unit over cp (its size knobcheck_gather_gib); none: no collective", NULL,
     "gather|none"},
    {sizeof(ct_option_spec), "knobcheck_overlap", CT_OPT_BOOL, "false", "hide the gather behind compute", NULL, NULL},
    {sizeof(ct_option_spec), "knobcheck_gather_gib", CT_OPT_FLOAT, "4", "GiB per unit the gather moves", "(0, 1024]",
     NULL},
    {0},
};

static const ct_search_knob knobs[] = {
#ifdef KNOBCHECK_BAD_KNOB
    {sizeof(ct_search_knob), "knobcheck_missing", "a|b", NULL},
#endif
    {sizeof(ct_search_knob), "knobcheck_overlap", "false|true", "hidden"},
    {sizeof(ct_search_knob), "knobcheck_exchange", "gather|none", NULL},
    {0},
};

static ct_status kc_create(const ct_host *host, const ct_strategy_env *env, ct_strategy **out) {
    knobcheck *k = calloc(1, sizeof *k);
    if (!k) return CT_ERR_NOMEM;
    const char *ex = "gather";
    k->host = host;
    k->env = *env;
    if (host->opt_string(host, "knobcheck_exchange", &ex) || host->opt_bool(host, "knobcheck_overlap", &k->overlap) ||
        host->opt_float(host, "knobcheck_gather_gib", &k->gib)) {
        free(k);
        return CT_ERR_INVALID;
    }
    k->gather = !strcmp(ex, "gather");
    *out = k;
    return CT_OK;
}

static void kc_destroy(ct_strategy *p) { free(p); }

static ct_status kc_place(ct_strategy *p, ct_param_slot *slots, int n) {
    (void)p;
    (void)slots;
    (void)n;
    return CT_OK;
}

static ct_status kc_setup(ct_strategy *p, ct_param_slot *slots, int n, int n_units) {
    (void)p;
    (void)n_units;
    ct_util_use_local_storage(slots, n);
    return CT_OK;
}

static ct_status kc_post_backward(ct_strategy *p, int unit, int last) {
    (void)p;
    (void)unit;
    (void)last;
    return CT_OK;
}

static ct_status kc_finish(ct_strategy *p) {
    (void)p;
    return CT_OK;
}

static ct_status kc_report(ct_strategy *p, int n_microbatches, ct_strategy_report *out) {
    knobcheck *k = p;
    ct_util_report_clear(out);
    if (!k->gather) return CT_OK;
    int units = k->env.model ? k->env.model->n_units : 1;
    for (int u = 0; u < units; u++)
        ct_util_report_comm(out, CT_AXIS_CP, CT_COLL_ALL_GATHER, u, CT_PHASE_FORWARD, k->gib * 1073741824.0,
                            n_microbatches, k->overlap);
    return CT_OK;
}

static const ct_strategy_api api = {
    .struct_size = sizeof(ct_strategy_api),
    .create = kc_create,
    .destroy = kc_destroy,
    .place = kc_place,
    .setup = kc_setup,
    .pre_forward = ct_util_unit_noop,
    .post_forward = ct_util_unit_noop,
    .pre_backward = ct_util_unit_noop,
    .post_backward = kc_post_backward,
    .finish_backward = kc_finish,
    .report = kc_report,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_STRATEGY;
    info->name = "knobcheck";
    info->description = "test strategy: declares two search knobs and reports what each value costs over cp";
    info->options = options;
    info->api = &api;
    info->knobs = knobs;
    return CT_OK;
}
