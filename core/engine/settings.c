/* settings.c: the engine's keys, read once (settings.h). */
#include "engine/settings.h"

#include "engine/strategies.h"

#include <stdio.h>
#include <string.h>

const char *const strategy_role_keys[STRATEGY_N_KEYS] = {
    "parallelism.tp_strategy", "parallelism.cp_strategy", "parallelism.ep_strategy", "parallelism.dp_strategy"};

/* A string key's value, or NULL when it has none. */
static const char *str_or_null(const manifest *mf, const char *key) {
    const char *v;
    return mf_get_str(mf, key, &v) ? NULL : v;
}

static void mesh_read(const manifest *mf, mesh_settings *m) {
    for (int a = 0; a < CT_MESH_NAXES; a++) m->has_degree[a] = !mf_get_int(mf, mesh_degree_keys[a], &m->degree[a]);
    m->ep = 1;
    mf_get_int(mf, MESH_EP_DEGREE_KEY, &m->ep);
}

static void strategies_read(const manifest *mf, strategy_settings *st) {
    st->list = mf_is_set(mf, STRATEGY_LIST_KEY) ? str_or_null(mf, STRATEGY_LIST_KEY) : NULL;
    for (int e = 0; e < STRATEGY_N_KEYS; e++) {
        st->role[e] = str_or_null(mf, strategy_role_keys[e]);
        st->role_set[e] = mf_is_set(mf, strategy_role_keys[e]);
    }
}

static void pipeline_read(const manifest *mf, pipeline_settings *pp) {
    pp->schedule = "1F1B";
    pp->runner = "pp";
    pp->first_less = pp->last_less = pp->microbatch_size = pp->local_batch_size = 1;
    mf_get_str(mf, "parallelism.pipeline_parallel_schedule", &pp->schedule);
    pp->schedule_csv = str_or_null(mf, "parallelism.pipeline_parallel_schedule_csv");
    if (pp->schedule_csv && !pp->schedule_csv[0]) pp->schedule_csv = NULL;
    pp->stage_units = str_or_null(mf, "parallelism.pipeline_parallel_stage_units");
    if (pp->stage_units && !pp->stage_units[0]) pp->stage_units = NULL;
    mf_get_str(mf, "parallelism.pipeline_runner", &pp->runner);
    mf_get_int(mf, "parallelism.pipeline_parallel_first_stage_less_layers", &pp->first_less);
    mf_get_int(mf, "parallelism.pipeline_parallel_last_stage_less_layers", &pp->last_less);
    mf_get_int(mf, "parallelism.pipeline_parallel_layers_per_stage", &pp->layers_per_stage);
    mf_get_int(mf, "parallelism.pipeline_parallel_microbatch_size", &pp->microbatch_size);
    mf_get_int(mf, "training.local_batch_size", &pp->local_batch_size);
}

static void lr_read(const manifest *mf, lr_settings *lr) {
    mf_get_float(mf, "optimizer.lr", &lr->lr);
    mf_get_float(mf, "lr_scheduler.min_lr_factor", &lr->min_lr_factor);
    mf_get_int(mf, "lr_scheduler.warmup_steps", &lr->warmup_steps);
    mf_get_str(mf, "lr_scheduler.decay_type", &lr->decay_type);
    lr->has_total_steps = !mf_get_int(mf, "lr_scheduler.total_steps", &lr->total_steps);
    lr->has_decay_ratio = !mf_get_float(mf, "lr_scheduler.decay_ratio", &lr->decay_ratio);
}

/* training.dataset as written (engine_settings.dataset). */
static void dataset_spelling(const manifest *mf, engine_settings *es) {
    const char *path;
    int n = mf_list_len(mf, "training.dataset");
    if (n < 0) {
        if (!mf_get_str(mf, "training.dataset", &path) || !mf_get_str(mf, "training.dataset_path", &path))
            snprintf(es->dataset, sizeof es->dataset, "%s", path), es->has_dataset = 1;
        return;
    }
    char item[300];
    size_t len = 0;
    for (int i = 0; i < n && len < sizeof es->dataset; i++) {
        double w = 1.0;
        snprintf(item, sizeof item, "training.dataset[%d].weight", i);
        mf_get_float(mf, item, &w);
        snprintf(item, sizeof item, "training.dataset[%d].path", i);
        if (mf_get_str(mf, item, &path)) path = "";
        len += (size_t)snprintf(es->dataset + len, sizeof es->dataset - len, "%s%s weight %g", i ? "; " : "", path, w);
    }
    es->has_dataset = 1;
}

void engine_settings_read(const manifest *mf, engine_settings *es) {
    memset(es, 0, sizeof *es);
    es->device_name = str_or_null(mf, "device.name");
    es->model_name = str_or_null(mf, "model.name");
    es->optimizer_name = str_or_null(mf, "optimizer.name");
    es->comm_name = str_or_null(mf, "comm.name");
    es->quantizer_name = "";
    mf_get_str(mf, "quantize.dense.name", &es->quantizer_name);
    es->flavor = str_or_null(mf, "model.flavor");
    es->has_seq_len = !mf_get_int(mf, "training.seq_len", &es->seq_len);
    es->has_seed = !mf_get_int(mf, "training.seed", &es->seed);
    dataset_spelling(mf, es);
    es->mixed_precision_param = "float32";
    mf_get_str(mf, "training.mixed_precision_param", &es->mixed_precision_param);
    es->ac_mode = str_or_null(mf, "activation_checkpoint.mode");
    es->ac_option = str_or_null(mf, "activation_checkpoint.selective_ac_option");
    mf_get_int(mf, "activation_offload.layers", &es->offload_layers);
    es->attn_mask_type = str_or_null(mf, "model.attn_mask_type");
    es->rope_positions = str_or_null(mf, "model.rope_positions");
    es->attn_mask_set = mf_is_set(mf, "model.attn_mask_type");
    es->tokenizer_path = str_or_null(mf, "model.tokenizer_path");
    es->hf_assets_path = str_or_null(mf, "model.hf_assets_path");
    es->tokenizer_path_set = mf_is_set(mf, "model.tokenizer_path");
    mesh_read(mf, &es->mesh);
    strategies_read(mf, &es->strategies);
    pipeline_read(mf, &es->pp);
    lr_read(mf, &es->lr);
}
