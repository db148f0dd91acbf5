/* 1f1b.c: 1F1B (PyTorch's Schedule1F1B, PipeDream-Flush): rank r warms up with p - r - 1 forwards,
 * then alternates one forward and one backward, then runs the backwards left. A rank holds at most
 * p - r microbatches' activations instead of GPipe's all of them, for the same bubble. */
#include "schedule_common.h"

static ct_status one_f1b_actions(const ct_host *h, const ct_schedule_shape *s, ct_pp_action *out, int cap, int *n);

static const ct_schedule_api api = {
    .struct_size = sizeof(ct_schedule_api),
    .placement = CT_PP_LOOP,
    .min_stages_per_rank = 1,
    .max_stages_per_rank = 1,
    .actions = one_f1b_actions,
};

static ct_status one_f1b_actions(const ct_host *h, const ct_schedule_shape *s, ct_pp_action *out, int cap, int *n) {
    ct_status st = sched_check_shape(h, &api, s);
    if (st) return st;
    int m = s->n_microbatches, stage = s->rank;
    int warmup = s->pp_size - s->rank - 1;
    if (warmup > m) warmup = m;
    sched_writer w = {out, cap, 0};
    for (int mb = 0; mb < warmup; mb++) sched_emit(&w, CT_PP_F, stage, mb);
    for (int k = 0; k < m - warmup; k++) { /* steady state: forward k + warmup, backward k */
        sched_emit(&w, CT_PP_F, stage, k + warmup);
        sched_emit(&w, CT_PP_B, stage, k);
    }
    for (int mb = m - warmup; mb < m; mb++) sched_emit(&w, CT_PP_B, stage, mb);
    return sched_finish(&w, n);
}

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    return sched_entry(info, "1F1B", "pipeline schedule: warmup forwards, then one forward one backward (1 stage per rank)",
                       &api);
}
