/* profile.h: profiling windows (profiling.profile_freq) and memory snapshots, driven from the step loop. */
#ifndef CT_PROFILE_H
#define CT_PROFILE_H

#include "config/manifest.h"
#include "engine/session.h"
#include "train/settings.h"

#include <stdint.h>

typedef struct profiler {
    int trace, snapshot;          /* profiling.enable_profiling, enable_memory_snapshot */
    int64_t freq, warmup, active; /* profile_freq, profiler_warmup, profiler_active */
    char traces[2048], snaps[2048]; /* the folders under job.dump_folder */
} profiler;

/* Checks the profiling keys (ps, read by train_settings_read; mf names a bad one) and places the folders
 * under dump (job.dump_folder); a bad one is one line on stderr and CT_ERR_INVALID. */
ct_status profiler_open(profiler *p, const manifest *mf, const profile_settings *ps, const char *dump);
/* Before a step: opens the trace window when the step is in one; arms the snapshot's peak. */
void profiler_step_begin(profiler *p, int64_t step);
/* After a step's work: stops recording and the snapshot's peak capture. */
void profiler_step_end(profiler *p, int64_t step);
/* Then, outside the step's timing: at a window's last step, writes each rank's trace and rank 0 the
 * merged one; writes the step's memory snapshot. A file that cannot be written is a warning: CT_OK;
 * the comm's status when the ranks failed to meet. */
ct_status profiler_write(profiler *p, session *s, int64_t step);

#endif
