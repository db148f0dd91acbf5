/* settings.h: the checkpoint section's keys (and training.steps, training.seed, which a resume checks
 * against), read once into plain values when the training loop's checkpointing begins (ckpt_begin), or
 * when a command that loads or seeds a checkpoint starts.
 *
 * Reading checks nothing: a value is what mf_get_* gives after manifest_validate (the schema's default
 * when the key is not given); ckpt_run.c checks them as before and names a key through mf_where. Strings
 * point into the manifest and live as long as it does. */
#ifndef CT_CKPT_SETTINGS_H
#define CT_CKPT_SETTINGS_H

#include "config/manifest.h"

#include <stdint.h>

typedef struct ckpt_settings {
    int enable;
    const char *folder;            /* under job.dump_folder */
    int64_t interval, keep;        /* interval, keep_latest_k */
    int64_t load_step;             /* -1: the newest */
    int last_model_only, last_in_hf; /* last_save_model_only, last_save_in_hf */
    const char *async_mode, *export_dtype, *exclude_from_loading;
    int allow_config_change;
    const char *initial_load_path; /* NULL when not set */
    int initial_load_model_only, initial_load_in_hf;
    int64_t steps, seed;           /* training.steps, training.seed */
} ckpt_settings;

/* Reads every key above (mf may be NULL: a session without a manifest; then every value is 0 or NULL). */
void ckpt_settings_read(const manifest *mf, ckpt_settings *cs);

#endif
