/* interleaved1f1b.c: Interleaved 1F1B (PyTorch's ScheduleInterleaved1F1B; Megatron-LM's interleaved
 * schedule, arXiv 2104.04473). v >= 2 stages per rank, loop placement (rank r holds r, r + p ...).
 * Microbatches run depth first through the local stages in rounds; the warmup is
 * (v - 1) * per_round + 2 (p - 1 - r) forwards, so the bubble shrinks about v-fold against 1F1B.
 * Like PyTorch, microbatches need not be a multiple of p, but must split into max(1, m / p) equal rounds. */
#include "schedule_common.h"

static ct_status interleaved_actions(const ct_host *h, const ct_schedule_shape *s, ct_pp_action *out, int cap,
                                     int *n);

static const ct_schedule_api api = {
    .struct_size = sizeof(ct_schedule_api),
    .placement = CT_PP_LOOP,
    .min_stages_per_rank = 2,
    .max_stages_per_rank = 0,
    .actions = interleaved_actions,
};

static ct_status interleaved_actions(const ct_host *h, const ct_schedule_shape *s, ct_pp_action *out, int cap, int *n) {
    return sched_interleaved(h, &api, s, 0, out, cap, n);
}

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    return sched_entry(info, "Interleaved1F1B",
                       "pipeline schedule: 1F1B over 2+ looped stages per rank, depth first (Megatron interleaved)", &api);
}
