/* schedule_common.h: what every schedule plugin in this folder shares: the shape check, an action
 * writer that counts past the caller's capacity (ctitan/schedule.h's "cap too small" rule), the
 * 1F1B-family generator used by Interleaved1F1B and InterleavedZeroBubble, and the entry boilerplate.
 *
 * Everything here is static inline: each schedule is its own .so, built from its one .c file. */
#ifndef CT_SCHEDULE_COMMON_H
#define CT_SCHEDULE_COMMON_H

#include "ctitan/schedule.h"

#include <stdlib.h>

/* Checks what every schedule needs from the shape: sizes positive, rank in range, stages per rank
 * within [min, max] of `api`. Returns CT_OK or CT_ERR_INVALID with a message. */
static inline ct_status sched_check_shape(const ct_host *h, const ct_schedule_api *api, const ct_schedule_shape *s) {
    if (!s || s->struct_size < sizeof(ct_schedule_shape)) {
        h->set_error(h, "shape struct too small (built against an older ctitan/schedule.h?)");
        return CT_ERR_INVALID;
    }
    if (s->pp_size < 1 || s->n_microbatches < 1 || s->stages_per_rank < 1) {
        h->set_error(h, "pp_size %d, stages_per_rank %d, n_microbatches %d: each must be at least 1", s->pp_size,
                     s->stages_per_rank, s->n_microbatches);
        return CT_ERR_INVALID;
    }
    if (s->rank < 0 || s->rank >= s->pp_size) {
        h->set_error(h, "rank %d is outside the pipeline's ranks 0..%d", s->rank, s->pp_size - 1);
        return CT_ERR_INVALID;
    }
    int lo = api->min_stages_per_rank, hi = api->max_stages_per_rank;
    if (s->stages_per_rank < lo || (hi > 0 && s->stages_per_rank > hi)) {
        if (lo == hi)
            h->set_error(h, "runs exactly %d stage%s per rank, got %d", lo, lo == 1 ? "" : "s", s->stages_per_rank);
        else
            h->set_error(h, "needs at least %d stages per rank, got %d", lo, s->stages_per_rank);
        return CT_ERR_INVALID;
    }
    /* stage and microbatch indices are ints; keep every count the generators form below INT_MAX */
    if ((long long)s->pp_size * s->stages_per_rank * (s->n_microbatches + 2LL) > (1LL << 30)) {
        h->set_error(h, "%d ranks x %d stages x %d microbatches is too large a schedule", s->pp_size,
                     s->stages_per_rank, s->n_microbatches);
        return CT_ERR_INVALID;
    }
    return CT_OK;
}

/* Writes actions into out[0 .. cap) and counts every action, so the caller learns how many it needs. */
typedef struct sched_writer {
    ct_pp_action *out;
    int cap, n;
} sched_writer;

/* Element k steps by the host's struct_size (ctitan/abi.h), which the host set on every element. */
static inline void sched_emit(sched_writer *w, int op, int stage, int microbatch) {
    if (w->n < w->cap) {
        ct_pp_action *a = CT_AT(ct_pp_action, w->out, w->n);
        a->op = op;
        a->stage = stage;
        a->microbatch = microbatch;
    }
    w->n++;
}

/* Hands the written list back: *n is the count; CT_ERR_INVALID when out was too small for it. */
static inline ct_status sched_finish(const sched_writer *w, int *n) {
    *n = w->n;
    return w->n > w->cap ? CT_ERR_INVALID : CT_OK;
}

/* The interleaved 1F1B family (PyTorch's _get_1f1b_rank_ops; Megatron's interleaved schedule).
 *
 * Rank r holds stages r, r + p, r + 2p ... (v = stages per rank). Microbatches go through the local
 * stages in rounds of `per_round` microbatches: forward step k runs local stage (k / per_round) % v,
 * depth first. The rank warms up with `warmup` forwards, then alternates one forward and one backward,
 * then cools down with the remaining backwards, which run the local stages in reverse.
 *
 * zero_bubble: the backward is split into I and W. The rank's first `rank` steady-state backwards
 * keep their W for later; from then on each I is followed by the W of the oldest backward still
 * owed one, and the owed Ws close the list (PyTorch's ZB1P, ScheduleInterleavedZeroBubble). */
typedef struct sched_1f1b_plan {
    int p, v, m, rank;
    int per_round; /* microbatches per round */
    int warmup;    /* forwards before the first backward */
    int zero_bubble;
} sched_1f1b_plan;

static inline int sched_fwd_stage(const sched_1f1b_plan *pl, int step) {
    return ((step / pl->per_round) % pl->v) * pl->p + pl->rank;
}

static inline int sched_bwd_stage(const sched_1f1b_plan *pl, int step) {
    return (pl->v - 1 - ((step - pl->warmup) / pl->per_round) % pl->v) * pl->p + pl->rank;
}

/* next[] counts per local stage (stage / p): the next microbatch of that stage for one op. */
static inline int sched_take(int *next, const sched_1f1b_plan *pl, int stage) {
    return next[stage / pl->p]++;
}

static inline ct_status sched_1f1b_family(const ct_host *h, const sched_1f1b_plan *pl, sched_writer *w) {
    int total = pl->v * pl->m; /* forwards on this rank, and as many backwards */
    /* per local stage: next forward, backward and weight microbatch; then the steps whose W is owed */
    int *next = calloc((size_t)pl->v * 3 + (size_t)total, sizeof(int));
    if (!next) {
        h->set_error(h, "out of memory for a %d-action schedule", 3 * total);
        return CT_ERR_NOMEM;
    }
    int *next_f = next, *next_b = next + pl->v, *next_w = next + 2 * pl->v, *owed = next + 3 * pl->v;
    int n_owed = 0, n_paid = 0;
    int back_op = pl->zero_bubble ? CT_PP_I : CT_PP_B;
    for (int step = 0; step < total + pl->warmup; step++) {
        if (step < total) { /* warmup and steady state: a forward */
            int s = sched_fwd_stage(pl, step);
            sched_emit(w, CT_PP_F, s, sched_take(next_f, pl, s));
        }
        if (step < pl->warmup) continue;
        int s = sched_bwd_stage(pl, step); /* steady state and cooldown: a backward */
        sched_emit(w, back_op, s, sched_take(next_b, pl, s));
        if (!pl->zero_bubble) continue;
        owed[n_owed++] = step;
        if (step - pl->warmup >= pl->rank) { /* the first `rank` Ws wait to fill the cooldown */
            int ws = sched_bwd_stage(pl, owed[n_paid++]);
            sched_emit(w, CT_PP_W, ws, sched_take(next_w, pl, ws));
        }
    }
    while (n_paid < n_owed) {
        int ws = sched_bwd_stage(pl, owed[n_paid++]);
        sched_emit(w, CT_PP_W, ws, sched_take(next_w, pl, ws));
    }
    free(next);
    return CT_OK;
}

/* PyTorch's rounds for the interleaved schedules: max(1, m / p) rounds of m / rounds microbatches;
 * m must split evenly into the rounds (any multiple of p does; so does any m < 2p). */
static inline ct_status sched_rounds(const ct_host *h, const ct_schedule_shape *s, int *per_round) {
    int rounds = s->n_microbatches / s->pp_size;
    if (rounds < 1) rounds = 1;
    if (s->n_microbatches % rounds) {
        h->set_error(h, "the microbatches must split into max(1, microbatches / pp) = %d equal rounds, "
                        "and %d do not: use a multiple of pp (e.g. %d or %d)",
                     rounds, s->n_microbatches, rounds * s->pp_size, (rounds + 1) * s->pp_size);
        return CT_ERR_INVALID;
    }
    *per_round = s->n_microbatches / rounds;
    return CT_OK;
}

/* The whole action list of an interleaved schedule (loop placement, checked against `api`): the
 * warmup is (v - 1) * per_round + (p - 1 - r) forwards, doubled in its second term for plain
 * interleaved 1F1B (whose B is twice an F), single for the zero-bubble variant (whose I is one). */
static inline ct_status sched_interleaved(const ct_host *h, const ct_schedule_api *api, const ct_schedule_shape *s,
                                          int zero_bubble, ct_pp_action *out, int cap, int *n) {
    ct_status st = sched_check_shape(h, api, s);
    if (st) return st;
    sched_1f1b_plan pl = {
        .p = s->pp_size, .v = s->stages_per_rank, .m = s->n_microbatches, .rank = s->rank, .zero_bubble = zero_bubble};
    if ((st = sched_rounds(h, s, &pl.per_round))) return st;
    pl.warmup = (pl.v - 1) * pl.per_round + (zero_bubble ? 1 : 2) * (pl.p - 1 - pl.rank);
    if (pl.warmup > pl.v * pl.m) pl.warmup = pl.v * pl.m;
    sched_writer w = {out, cap, 0};
    if ((st = sched_1f1b_family(h, &pl, &w))) return st;
    return sched_finish(&w, n);
}

/* Fills the plugin info of a schedule plugin. */
static inline ct_status sched_entry(ct_plugin_info *info, const char *name, const char *description,
                                    const ct_schedule_api *api) {
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_SCHEDULE;
    info->name = name;
    info->description = description;
    info->options = NULL;
    info->api = api;
    return CT_OK;
}

#endif
