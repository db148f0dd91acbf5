/* settings.h: the keys `ctitan train` and `ctitan generate` read (training.*, metrics.*, validation.*,
 * profiling.*, generate.*, the job's), read once into plain values when the command starts.
 *
 * Reading checks nothing: a value is what mf_get_* gives after manifest_validate (the schema's default when
 * the key is not given), and the checks that involve several keys stay with the code that uses them
 * (train.c, profile.c), which names the key through mf_where. Strings point into the manifest and live as
 * long as it does; the dataset items are owned (train_settings_free). */
#ifndef CT_TRAIN_SETTINGS_H
#define CT_TRAIN_SETTINGS_H

#include "config/manifest.h"
#include "engine/mesh.h"

#include <stdint.h>

/* SECTION.dataset (a path, or a list of {path, weight}) and SECTION.dataset_path (the older spelling). */
typedef struct train_dataset_item {
    const char *path; /* NULL when not given */
    double weight;    /* 1.0 when not given */
    int has_weight;
} train_dataset_item;

typedef struct train_dataset {
    int n_items;                /* the list's items; -1 when SECTION.dataset is a path or unset */
    int has, has_old;           /* SECTION.dataset given (a list or a path), SECTION.dataset_path given */
    const char *path, *old_path;
    train_dataset_item *items;  /* n_items, owned */
} train_dataset;

/* profiling.* */
typedef struct profile_settings {
    int trace, snapshot;              /* enable_profiling, enable_memory_snapshot */
    int64_t freq, warmup, active;     /* profile_freq, profiler_warmup, profiler_active */
    const char *traces, *snaps;       /* save_traces_folder, save_memory_snapshot_folder */
} profile_settings;

/* generate.*: the end-of-run sample and `ctitan generate` */
typedef struct generate_settings {
    int64_t max_new;   /* max_new_tokens */
    const char *prompt;
    double temperature, top_p;
    int64_t top_k;
    int64_t seed;      /* generate.seed, else training.seed */
} generate_settings;

/* validation.* */
typedef struct validation_settings {
    int enable;
    int64_t freq, steps;
    int64_t local_batch_size; /* training.local_batch_size when not given */
    int64_t seq_len;
    int has_seq_len;          /* validation.seq_len given (or defaulted) */
    train_dataset data;
} validation_settings;

typedef struct train_settings {
    /* training.* and metrics.log_freq */
    int64_t steps, local_batch_size, global_batch_size, seq_len, log_freq, seed;
    double max_norm;
    const char *mixed_precision_param;
    train_dataset data;
    /* job.* */
    const char *dump_folder;
    const char *description; /* NULL when not given */
    int print_config;
    /* metrics.* */
    int tensorboard, wandb;
    const char *tb_folder;
    /* the run's other switches */
    int compile;                              /* compile.enable */
    int ckpt_enable, hf_export, seed_checkpoint; /* checkpoint.enable, last_save_in_hf, create_seed_checkpoint */
    const char *tokenizer_path, *hf_assets_path; /* model.*: the chat template beside the tokenizer */
    int64_t degree[CT_MESH_NAXES];            /* the mesh's degree keys: the dry run's world; 0 when unset */
    profile_settings profiling;
    validation_settings validation;
    generate_settings generate;
} train_settings;

/* Reads every key above from a validated manifest. CT_OK, or CT_ERR_NOMEM (line set) when a dataset
 * list's items cannot be held; train_settings_free is safe after either. */
ct_status train_settings_read(const manifest *mf, train_settings *ts);
void train_settings_free(train_settings *ts);

#endif
