/* lr.h: the learning-rate schedule (torchtitan's lr_scheduler section). */
#ifndef CT_LR_H
#define CT_LR_H

#include "config/manifest.h"
#include "engine/settings.h"

#include <stdint.h>

typedef struct lr_schedule {
    double lr, min_lr_factor;
    int64_t warmup, stable, decay;
    const char *type; /* linear | sqrt | cosine */
} lr_schedule;

/* The schedule of optimizer.lr and lr_scheduler.* (ls, engine_settings_read's) for a run of `steps`: CT_OK,
 * or CT_ERR_INVALID with the line naming the key (where mf set it) set (nothing printed). */
ct_status lr_setup(const lr_settings *ls, const manifest *mf, int64_t steps, lr_schedule *s);
/* The learning rate of optimizer step `step` (counted from 1), as torchtitan's LambdaLR gives it. */
double lr_at(const lr_schedule *s, int64_t step);

#endif
