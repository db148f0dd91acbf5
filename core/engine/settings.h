/* settings.h: the core's keys the engine reads (the mesh's degrees, the strategies' list and keys, the
 * pipeline, the learning-rate schedule, activation checkpointing and offload, precision, attention and
 * the plugins each slot names), read once into plain values when a session opens (session_open,
 * session_open_plan) or, for a caller with a manifest and no session, by engine_settings_read itself.
 *
 * Reading checks nothing and fails never: a value is what mf_get_* gives (the schema's default when the
 * key is not given; a key given with a value of the wrong type counts as not given, which only a reader
 * before manifest_validate sees). Each consumer checks its own values as before and names a key through
 * mf_where. Strings point into the manifest and live as long as it does, until a key is overridden. */
#ifndef CT_ENGINE_SETTINGS_H
#define CT_ENGINE_SETTINGS_H

#include "config/manifest.h"
#include "engine/mesh.h"

#include <stdint.h>

/* The keys naming the axes' strategies, in torchtitan's order (engine/strategies.c's table follows it). */
enum { STRATEGY_KEY_TP, STRATEGY_KEY_CP, STRATEGY_KEY_EP, STRATEGY_KEY_DP, STRATEGY_N_KEYS };
extern const char *const strategy_role_keys[STRATEGY_N_KEYS];

/* The mesh's degrees (parallelism.*_degree, mesh_degree_keys' order) and expert parallel's. */
typedef struct mesh_settings {
    int64_t degree[CT_MESH_NAXES];
    int has_degree[CT_MESH_NAXES]; /* the key has a value (given or default) that is an integer */
    int64_t ep;                    /* parallelism.expert_parallel_degree, 1 when it has none */
} mesh_settings;

/* parallelism.strategies and the *_strategy keys. */
typedef struct strategy_settings {
    const char *list; /* parallelism.strategies when the manifest gives it, else NULL */
    const char *role[STRATEGY_N_KEYS]; /* each key's value (its default when not given), NULL when none */
    int role_set[STRATEGY_N_KEYS];     /* the manifest gives the key */
} strategy_settings;

/* parallelism.pipeline_* and what the microbatches divide. */
typedef struct pipeline_settings {
    const char *schedule;     /* pipeline_parallel_schedule ("1F1B" when none) */
    const char *schedule_csv; /* NULL when unset or empty */
    const char *stage_units;  /* NULL when unset or empty */
    const char *runner;       /* pipeline_runner ("pp" when none) */
    int64_t first_less, last_less; /* *_stage_less_layers (1 when none) */
    int64_t layers_per_stage;      /* 0 when none */
    int64_t microbatch_size;       /* 1 when none */
    int64_t local_batch_size;      /* training.local_batch_size (1 when none) */
} pipeline_settings;

/* optimizer.lr and lr_scheduler.* */
typedef struct lr_settings {
    double lr, min_lr_factor;
    int64_t warmup_steps;
    const char *decay_type;
    int64_t total_steps;
    int has_total_steps; /* else training.steps */
    double decay_ratio;
    int has_decay_ratio; /* else decay takes every step after warmup */
} lr_settings;

typedef struct engine_settings {
    /* the plugin each slot names: device.name, model.name, optimizer.name, comm.name (NULL when none) */
    const char *device_name, *model_name, *optimizer_name, *comm_name;
    const char *quantizer_name;        /* quantize.dense.name ("" when none) */
    const char *flavor;                /* model.flavor */
    int64_t seq_len, seed;             /* training.* (0 when none) */
    int has_seq_len, has_seed;         /* they have a value (given or default) that is an integer */
    const char *mixed_precision_param; /* training.* ("float32" when none) */
    const char *ac_mode, *ac_option;   /* activation_checkpoint.mode, selective_ac_option */
    int64_t offload_layers;            /* activation_offload.layers (0 when none) */
    const char *attn_mask_type, *rope_positions; /* model.* */
    int attn_mask_set;                 /* the manifest gives model.attn_mask_type */
    const char *tokenizer_path, *hf_assets_path; /* model.*: NULL when unset */
    /* training.dataset as written, what a checkpoint records: "PATH" for one source (or
     * training.dataset_path), "PATH weight W; ..." for a mixture; has_dataset 0 when none (generate) */
    char dataset[4096];
    int has_dataset;
    int tokenizer_path_set;            /* the manifest gives model.tokenizer_path */
    mesh_settings mesh;
    strategy_settings strategies;
    pipeline_settings pp;
    lr_settings lr;
} engine_settings;

/* Reads every key above. Never fails. */
void engine_settings_read(const manifest *mf, engine_settings *es);

#endif
