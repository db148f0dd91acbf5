/* settings.c: the checkpoint section's keys, read once (settings.h). */
#include "checkpoint/settings.h"

#include <string.h>

void ckpt_settings_read(const manifest *mf, ckpt_settings *cs) {
    memset(cs, 0, sizeof *cs);
    if (!mf) return;
    mf_get_bool(mf, "checkpoint.enable", &cs->enable);
    mf_get_str(mf, "checkpoint.folder", &cs->folder);
    mf_get_int(mf, "checkpoint.interval", &cs->interval);
    mf_get_int(mf, "checkpoint.keep_latest_k", &cs->keep);
    mf_get_int(mf, "checkpoint.load_step", &cs->load_step);
    mf_get_bool(mf, "checkpoint.last_save_model_only", &cs->last_model_only);
    mf_get_bool(mf, "checkpoint.last_save_in_hf", &cs->last_in_hf);
    mf_get_str(mf, "checkpoint.async_mode", &cs->async_mode);
    mf_get_str(mf, "checkpoint.export_dtype", &cs->export_dtype);
    mf_get_str(mf, "checkpoint.exclude_from_loading", &cs->exclude_from_loading);
    mf_get_bool(mf, "checkpoint.allow_config_change", &cs->allow_config_change);
    if (mf_get_str(mf, "checkpoint.initial_load_path", &cs->initial_load_path)) cs->initial_load_path = NULL;
    mf_get_bool(mf, "checkpoint.initial_load_model_only", &cs->initial_load_model_only);
    mf_get_bool(mf, "checkpoint.initial_load_in_hf", &cs->initial_load_in_hf);
    mf_get_int(mf, "training.steps", &cs->steps);
    mf_get_int(mf, "training.seed", &cs->seed);
}
