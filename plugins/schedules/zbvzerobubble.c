/* zbvzerobubble.c: ZBV zero bubble (PyTorch's ScheduleZBVZeroBubble, the ZB-V schedule of
 * arXiv 2401.10241, section 6). Exactly 2 stages per rank in a V: rank r holds stage r (chunk 0, on
 * the way down) and stage 2p - 1 - r (chunk 1, on the way back up), so the last stage sits on rank 0
 * next to the first. The backward is split into I and W; Ws fill what would be bubbles. With
 * F = I = W in time and m >= 2p - 1 microbatches the pipeline has no bubble past the warmup. */
#include "schedule_common.h"

static ct_status zbv_actions(const ct_host *h, const ct_schedule_shape *s, ct_pp_action *out, int cap, int *n);

static const ct_schedule_api api = {
    .struct_size = sizeof(ct_schedule_api),
    .placement = CT_PP_V,
    .min_stages_per_rank = 2,
    .max_stages_per_rank = 2,
    .actions = zbv_actions,
};

/* The order is planned for max(2p - 1, m) microbatches; actions on microbatches past m are dropped. */
typedef struct zbv {
    sched_writer w;
    int m;
    int stage[2];    /* chunk 0 and chunk 1 */
    int f[2], b[2], wt[2]; /* next microbatch of each op per chunk */
} zbv;

static void zbv_op(zbv *z, int op, int chunk) {
    int *counter = op == CT_PP_F ? &z->f[chunk] : op == CT_PP_I ? &z->b[chunk] : &z->wt[chunk];
    int mb = (*counter)++;
    if (mb < z->m) sched_emit(&z->w, op, z->stage[chunk], mb);
}

static ct_status zbv_actions(const ct_host *h, const ct_schedule_shape *s, ct_pp_action *out, int cap, int *n) {
    ct_status st = sched_check_shape(h, &api, s);
    if (st) return st;
    int p = s->pp_size, r = s->rank;
    int planned = s->n_microbatches > 2 * p - 1 ? s->n_microbatches : 2 * p - 1;
    zbv z = {.w = {out, cap, 0}, .m = s->n_microbatches, .stage = {r, 2 * p - 1 - r}};

    /* warmup: 2 (p - r) - 1 forwards of chunk 0; r pairs (chunk 1, chunk 0); p - r rounds of
     * chunk 1's F, I, W (the bottom of the V turns around at once) */
    for (int k = 0; k < 2 * (p - r) - 1; k++) zbv_op(&z, CT_PP_F, 0);
    for (int k = 0; k < r; k++) {
        zbv_op(&z, CT_PP_F, 1);
        zbv_op(&z, CT_PP_F, 0);
    }
    for (int k = 0; k < p - r; k++) {
        zbv_op(&z, CT_PP_F, 1);
        zbv_op(&z, CT_PP_I, 1);
        zbv_op(&z, CT_PP_W, 1);
    }
    /* steady state: F I W on chunk 0, then on chunk 1, until every planned forward ran */
    while (z.f[1] < z.f[0] || z.f[0] < planned) {
        if (z.f[0] < planned) zbv_op(&z, CT_PP_F, 0);
        zbv_op(&z, CT_PP_I, 0);
        zbv_op(&z, CT_PP_W, 0);
        zbv_op(&z, CT_PP_F, 1);
        zbv_op(&z, CT_PP_I, 1);
        zbv_op(&z, CT_PP_W, 1);
    }
    /* cooldown: r pairs of Is (chunk 0, chunk 1), then p - r rounds of chunk 0's I and an owed W,
     * then the Ws still owed, chunk 1's first */
    for (int k = 0; k < r; k++) {
        zbv_op(&z, CT_PP_I, 0);
        zbv_op(&z, CT_PP_I, 1);
    }
    for (int k = 0; k < p - r; k++) {
        zbv_op(&z, CT_PP_I, 0);
        zbv_op(&z, CT_PP_W, 0);
    }
    while (z.wt[1] < z.b[1]) zbv_op(&z, CT_PP_W, 1);
    while (z.wt[0] < z.b[0]) zbv_op(&z, CT_PP_W, 0);
    return sched_finish(&z.w, n);
}

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    return sched_entry(info, "ZBVZeroBubble",
                       "pipeline schedule: zero bubble in a V (2 stages per rank: r and 2p-1-r), backward split into I and W",
                       &api);
}
