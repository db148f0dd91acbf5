/* interleavedzerobubble.c: Interleaved Zero Bubble (PyTorch's ScheduleInterleavedZeroBubble, the ZB1P
 * schedule of arXiv 2401.10241). The interleaved 1F1B order with the backward split in two: the
 * input-gradient half (I) runs where 1F1B runs B, so the previous stage gets its gradient as early
 * as before, and the weight-gradient half (W) is deferred to fill the bubbles of the cooldown.
 * v >= 2 stages per rank, loop placement; warmup (v - 1) * per_round + (p - 1 - r) forwards. */
#include "schedule_common.h"

static ct_status zb_actions(const ct_host *h, const ct_schedule_shape *s, ct_pp_action *out, int cap, int *n);

static const ct_schedule_api api = {
    .struct_size = sizeof(ct_schedule_api),
    .placement = CT_PP_LOOP,
    .min_stages_per_rank = 2,
    .max_stages_per_rank = 0,
    .actions = zb_actions,
};

static ct_status zb_actions(const ct_host *h, const ct_schedule_shape *s, ct_pp_action *out, int cap, int *n) {
    return sched_interleaved(h, &api, s, 1, out, cap, n);
}

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    return sched_entry(info, "InterleavedZeroBubble",
                       "pipeline schedule: interleaved 1F1B with the backward split into I and W, W filling bubbles (ZB1P)",
                       &api);
}
