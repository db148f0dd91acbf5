/* dualpipev.c: DualPipeV (PyTorch's ScheduleDualPipeV), the V-shaped half of DeepSeek's DualPipe
 * (DeepSeek-V3 report, arXiv 2412.19437, section 3.2.1; the "cut-in-half" variant of the DualPipe
 * repository). Exactly 2 stages per rank in a V: rank r holds stage r (chunk 0, on the way down) and
 * stage 2p - 1 - r (chunk 1, on the way back up), as ZBVZeroBubble places them.
 *
 * The order on rank r of p, for m >= 2p microbatches:
 *   1. warm-up: 2 (p - 1 - r) forwards of chunk 0, then r + 1 pairs of forwards, chunk 0 then chunk 1;
 *   2. p - 1 - r rounds of chunk 1's I, the W it owes, and chunk 1's next F (zero bubble);
 *   3. steady state, m - 2p + r + 1 rounds of two pairs: F of chunk 0 with B of chunk 1, then F of
 *      chunk 1 with B of chunk 0; then p - 1 - r rounds of B of chunk 1 and the pair F chunk 1, B chunk 0;
 *   4. cool-down: r + 1 rounds of a backward of chunk 1 then of chunk 0; half way through them the
 *      backward splits into I (the W left for later), on odd ranks before chunk 1's, on even ranks
 *      between the two; then p - 1 - r rounds of an owed W and chunk 0's I; then the owed Ws, oldest
 *      first.
 *
 * What DualPipe is for: each steady-state pair is one forward and one backward of different
 * microbatches (and chunks), which PyTorch runs as one "overlapped F+B" action so that expert
 * parallel's all-to-all of one hides behind the other's compute. ctitan's schedule ABI (2.x) has no
 * action that pairs two microbatches: each pair is emitted here as its F then its B, consecutive, in
 * the order PyTorch runs them inside the pair. The order of every action is PyTorch's
 * (tests/unit/test_schedules.c holds the plugin to it); the overlap itself would need a new action
 * kind in ctitan/schedule.h and a runner that interleaves the two halves' communication and compute.
 *
 * PyTorch refuses fewer microbatches than stages (2p); so does this plugin. */
#include "schedule_common.h"

/* One rank's list in the making. A backward is B, or I now and W later: owed[] is the queue of the
 * Is whose W has not run (chunk * m + microbatch), paid oldest first. */
typedef struct dpv {
    sched_writer w;
    int m;
    int stage[2];     /* chunk 0 and chunk 1 */
    int f[2], bwd[2]; /* next microbatch of F and of the backward (B or I) per chunk */
    int *owed, n_owed, n_paid;
} dpv;

static ct_status dpv_actions(const ct_host *h, const ct_schedule_shape *s, ct_pp_action *out, int cap, int *n);

static const ct_schedule_api api = {
    .struct_size = sizeof(ct_schedule_api),
    .placement = CT_PP_V,
    .min_stages_per_rank = 2,
    .max_stages_per_rank = 2,
    .actions = dpv_actions,
};

static void dpv_forward(dpv *d, int chunk) { sched_emit(&d->w, CT_PP_F, d->stage[chunk], d->f[chunk]++); }

/* split: I now, its W queued; else the whole B. */
static void dpv_backward(dpv *d, int chunk, int split) {
    int mb = d->bwd[chunk]++;
    sched_emit(&d->w, split ? CT_PP_I : CT_PP_B, d->stage[chunk], mb);
    if (split) d->owed[d->n_owed++] = chunk * d->m + mb;
}

/* The oldest owed W, if one is owed. */
static void dpv_pay_weight(dpv *d) {
    if (d->n_paid == d->n_owed) return;
    int k = d->owed[d->n_paid++];
    sched_emit(&d->w, CT_PP_W, d->stage[k / d->m], k % d->m);
}

/* A steady-state pair: a forward of one chunk and a backward of the other, run as F then B. */
static void dpv_pair(dpv *d, int fwd_chunk) {
    dpv_forward(d, fwd_chunk);
    dpv_backward(d, 1 - fwd_chunk, 0);
}

static void dpv_order(dpv *d, int p, int r) {
    for (int k = 0; k < 2 * (p - 1 - r); k++) dpv_forward(d, 0);
    for (int k = 0; k < r + 1; k++) {
        dpv_forward(d, 0);
        dpv_forward(d, 1);
    }
    for (int k = 0; k < p - 1 - r; k++) {
        dpv_backward(d, 1, 1);
        dpv_pay_weight(d);
        dpv_forward(d, 1);
    }
    for (int k = 0; k < d->m - 2 * p + r + 1; k++) {
        dpv_pair(d, 0);
        dpv_pair(d, 1);
    }
    for (int k = 0; k < p - 1 - r; k++) {
        dpv_backward(d, 1, 0);
        dpv_pair(d, 1);
    }
    int split = 0, half = (r + 1) / 2;
    for (int k = 0; k < r + 1; k++) {
        if (k == half && r % 2 == 1) split = 1;
        dpv_backward(d, 1, split);
        if (k == half && r % 2 == 0) split = 1;
        dpv_backward(d, 0, split);
    }
    for (int k = 0; k < p - 1 - r; k++) {
        dpv_pay_weight(d);
        dpv_backward(d, 0, 1);
    }
    while (d->n_paid < d->n_owed) dpv_pay_weight(d);
}

static ct_status dpv_actions(const ct_host *h, const ct_schedule_shape *s, ct_pp_action *out, int cap, int *n) {
    ct_status st = sched_check_shape(h, &api, s);
    if (st) return st;
    int p = s->pp_size, r = s->rank, m = s->n_microbatches;
    if (m < 2 * p) {
        h->set_error(h, "needs at least as many microbatches as stages (2 x pp = %d), got %d: raise "
                        "training.local_batch_size or lower parallelism.pipeline_parallel_microbatch_size",
                     2 * p, m);
        return CT_ERR_INVALID;
    }
    dpv d = {.w = {out, cap, 0}, .m = m, .stage = {r, 2 * p - 1 - r}};
    d.owed = malloc(sizeof(int) * 2 * (size_t)m); /* at most every backward of both chunks */
    if (!d.owed) {
        h->set_error(h, "out of memory for a %d-microbatch schedule", m);
        return CT_ERR_NOMEM;
    }
    dpv_order(&d, p, r);
    free(d.owed);
    return sched_finish(&d.w, n);
}

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    return sched_entry(info, "DualPipeV",
                       "pipeline schedule: DeepSeek's DualPipeV (2 stages per rank in a V: r and 2p-1-r), a forward "
                       "of one chunk paired with a backward of the other, I and W in the cool-down",
                       &api);
}
