/* lr.c: torchtitan's learning-rate schedule: linear warmup, an optional stable phase, then a
 * linear, sqrt or cosine decay to min_lr_factor (warmup-stable-decay when decay_ratio is set). */
#include "engine/lr.h"

#include "base/error.h"

#include <math.h>
#include <string.h>

/* torchtitan's linear_warmup_stable_decay; `step` counts from 1. */
double lr_at(const lr_schedule *s, int64_t step) {
    int64_t cur = step - 1;
    double adj;
    if (cur < s->warmup) {
        adj = (double)(cur + 1) / (double)(s->warmup + 1);
    } else if (cur < s->warmup + s->stable) {
        adj = 1.0;
    } else {
        double progress = (double)(cur + 1 - s->warmup - s->stable) / (double)(s->decay + 1);
        if (!strcmp(s->type, "sqrt")) adj = 1.0 - sqrt(progress);
        else if (!strcmp(s->type, "cosine")) adj = 0.5 * (1.0 + cos(M_PI * progress));
        else adj = 1.0 - progress;
        adj = s->min_lr_factor + (1.0 - s->min_lr_factor) * adj;
    }
    return s->lr * adj;
}

ct_status lr_setup(const lr_settings *ls, const manifest *mf, int64_t steps, lr_schedule *s) {
    int64_t total = ls->total_steps;
    double ratio = ls->decay_ratio;
    char where[600];
    s->lr = ls->lr;
    s->min_lr_factor = ls->min_lr_factor;
    s->warmup = ls->warmup_steps;
    s->type = ls->decay_type;
    const char *total_key = "lr_scheduler.total_steps";
    if (!ls->has_total_steps) {
        total = steps;
        total_key = "training.steps";
    }
    /* manifest_validate holds each key to its range and choices; these name the key for a caller
     * that did not validate */
    const char *bad = strcmp(s->type, "linear") && strcmp(s->type, "sqrt") && strcmp(s->type, "cosine")
                          ? "lr_scheduler.decay_type"
                      : s->warmup < 0                                   ? "lr_scheduler.warmup_steps"
                      : !(s->min_lr_factor >= 0 && s->min_lr_factor <= 1) ? "lr_scheduler.min_lr_factor"
                      : total < 1                                       ? total_key
                                                                        : NULL;
    if (bad) {
        mf_where(mf, bad, where, sizeof where);
        return ct_fail(CT_ERR_INVALID, "%s: need decay_type linear, sqrt or cosine, warmup_steps >= 0, 0 <= "
                       "min_lr_factor <= 1 and at least one step", where);
    }
    if (s->warmup > total) s->warmup = total;
    if (ls->has_decay_ratio) {
        if (ratio < 0 || ratio > 1) {
            mf_where(mf, "lr_scheduler.decay_ratio", where, sizeof where);
            return ct_fail(CT_ERR_INVALID, "%s: expected a fraction in [0, 1], got %g", where, ratio);
        }
        s->decay = (int64_t)llround((double)total * ratio);
        if (s->warmup + s->decay > total) s->warmup = total - s->decay;
    } else {
        s->decay = total - s->warmup;
    }
    s->stable = total - s->warmup - s->decay;
    return CT_OK;
}

