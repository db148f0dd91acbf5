/* gpipe.c: GPipe (PyTorch's ScheduleGPipe): every rank runs all its forwards, then all its backwards,
 * microbatches in order. One stage per rank; a rank holds the activations of every microbatch. */
#include "schedule_common.h"

static ct_status gpipe_actions(const ct_host *h, const ct_schedule_shape *s, ct_pp_action *out, int cap, int *n);

static const ct_schedule_api api = {
    .struct_size = sizeof(ct_schedule_api),
    .placement = CT_PP_LOOP,
    .min_stages_per_rank = 1,
    .max_stages_per_rank = 1,
    .actions = gpipe_actions,
};

static ct_status gpipe_actions(const ct_host *h, const ct_schedule_shape *s, ct_pp_action *out, int cap, int *n) {
    ct_status st = sched_check_shape(h, &api, s);
    if (st) return st;
    sched_writer w = {out, cap, 0};
    for (int mb = 0; mb < s->n_microbatches; mb++) sched_emit(&w, CT_PP_F, s->rank, mb);
    for (int mb = 0; mb < s->n_microbatches; mb++) sched_emit(&w, CT_PP_B, s->rank, mb);
    return sched_finish(&w, n);
}

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    return sched_entry(info, "GPipe", "pipeline schedule: all forwards, then all backwards (1 stage per rank)", &api);
}
