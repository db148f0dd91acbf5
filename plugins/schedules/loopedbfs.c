/* loopedbfs.c: Looped BFS (PyTorch's ScheduleLoopedBFS, breadth-first pipelining, arXiv 2211.05953).
 * v >= 2 stages per rank, loop placement. Breadth first: a rank runs every microbatch through its
 * first local stage, then its second ... and the backwards the other way round, last local stage
 * first, microbatches last-in first-out. Few, large phases (good for overlapping FSDP gathers), at
 * the price of holding every microbatch's activations. */
#include "schedule_common.h"

static ct_status bfs_actions(const ct_host *h, const ct_schedule_shape *s, ct_pp_action *out, int cap, int *n);

static const ct_schedule_api api = {
    .struct_size = sizeof(ct_schedule_api),
    .placement = CT_PP_LOOP,
    .min_stages_per_rank = 2,
    .max_stages_per_rank = 0,
    .actions = bfs_actions,
};

static ct_status bfs_actions(const ct_host *h, const ct_schedule_shape *s, ct_pp_action *out, int cap, int *n) {
    ct_status st = sched_check_shape(h, &api, s);
    if (st) return st;
    int p = s->pp_size, v = s->stages_per_rank, m = s->n_microbatches;
    sched_writer w = {out, cap, 0};
    for (int k = 0; k < v; k++)
        for (int mb = 0; mb < m; mb++) sched_emit(&w, CT_PP_F, k * p + s->rank, mb);
    for (int k = v - 1; k >= 0; k--)
        for (int mb = m - 1; mb >= 0; mb--) sched_emit(&w, CT_PP_B, k * p + s->rank, mb);
    return sched_finish(&w, n);
}

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    return sched_entry(info, "LoopedBFS", "pipeline schedule: breadth first over 2+ looped stages per rank", &api);
}
