/* settings.c: the train and generate commands' keys, read once (settings.h). */
#include "train/settings.h"

#include "base/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* SECTION.dataset and SECTION.dataset_path as given; which of them may be set together is train.c's check. */
static ct_status dataset_read(const manifest *mf, const char *section, train_dataset *ds) {
    char key[64], old_key[64], item[300];
    snprintf(key, sizeof key, "%s.dataset", section);
    snprintf(old_key, sizeof old_key, "%s.dataset_path", section);
    ds->n_items = mf_list_len(mf, key);
    ds->has = ds->n_items >= 0 || !mf_get_str(mf, key, &ds->path);
    ds->has_old = !mf_get_str(mf, old_key, &ds->old_path);
    if (ds->n_items <= 0) return CT_OK;
    ds->items = calloc((size_t)ds->n_items, sizeof *ds->items);
    if (!ds->items) return ct_fail(CT_ERR_NOMEM, "%s: out of memory for %d items of %s", mf->path, ds->n_items, key);
    for (int i = 0; i < ds->n_items; i++) {
        train_dataset_item *it = &ds->items[i];
        it->weight = 1.0;
        snprintf(item, sizeof item, "%s[%d].weight", key, i);
        it->has_weight = !mf_get_float(mf, item, &it->weight);
        snprintf(item, sizeof item, "%s[%d].path", key, i);
        if (mf_get_str(mf, item, &it->path)) it->path = NULL;
    }
    return CT_OK;
}

static void profile_read(const manifest *mf, profile_settings *p) {
    mf_get_bool(mf, "profiling.enable_profiling", &p->trace);
    mf_get_bool(mf, "profiling.enable_memory_snapshot", &p->snapshot);
    mf_get_int(mf, "profiling.profile_freq", &p->freq);
    mf_get_int(mf, "profiling.profiler_warmup", &p->warmup);
    mf_get_int(mf, "profiling.profiler_active", &p->active);
    mf_get_str(mf, "profiling.save_traces_folder", &p->traces);
    mf_get_str(mf, "profiling.save_memory_snapshot_folder", &p->snaps);
}

static void generate_read(const manifest *mf, generate_settings *g) {
    mf_get_int(mf, "generate.max_new_tokens", &g->max_new);
    mf_get_str(mf, "generate.prompt", &g->prompt);
    mf_get_float(mf, "generate.temperature", &g->temperature);
    mf_get_int(mf, "generate.top_k", &g->top_k);
    mf_get_float(mf, "generate.top_p", &g->top_p);
    if (mf_get_int(mf, "generate.seed", &g->seed)) mf_get_int(mf, "training.seed", &g->seed);
}

static ct_status validation_read(const manifest *mf, int64_t local_batch_size, validation_settings *v) {
    mf_get_bool(mf, "validation.enable", &v->enable);
    mf_get_int(mf, "validation.freq", &v->freq);
    mf_get_int(mf, "validation.steps", &v->steps);
    if (mf_get_int(mf, "validation.local_batch_size", &v->local_batch_size)) v->local_batch_size = local_batch_size;
    v->has_seq_len = !mf_get_int(mf, "validation.seq_len", &v->seq_len);
    return dataset_read(mf, "validation", &v->data);
}

ct_status train_settings_read(const manifest *mf, train_settings *ts) {
    memset(ts, 0, sizeof *ts);
    ts->mixed_precision_param = "float32";
    ts->tb_folder = "tb";
    mf_get_int(mf, "training.steps", &ts->steps);
    mf_get_int(mf, "training.local_batch_size", &ts->local_batch_size);
    mf_get_int(mf, "training.global_batch_size", &ts->global_batch_size);
    mf_get_int(mf, "training.seq_len", &ts->seq_len);
    mf_get_int(mf, "training.seed", &ts->seed);
    mf_get_float(mf, "training.max_norm", &ts->max_norm);
    mf_get_str(mf, "training.mixed_precision_param", &ts->mixed_precision_param);
    mf_get_int(mf, "metrics.log_freq", &ts->log_freq);
    mf_get_bool(mf, "metrics.enable_tensorboard", &ts->tensorboard);
    mf_get_str(mf, "metrics.save_tb_folder", &ts->tb_folder);
    mf_get_bool(mf, "metrics.enable_wandb", &ts->wandb);
    mf_get_str(mf, "job.dump_folder", &ts->dump_folder);
    if (mf_get_str(mf, "job.description", &ts->description)) ts->description = NULL;
    mf_get_bool(mf, "job.print_config", &ts->print_config);
    mf_get_bool(mf, "compile.enable", &ts->compile);
    mf_get_bool(mf, "checkpoint.enable", &ts->ckpt_enable);
    mf_get_bool(mf, "checkpoint.last_save_in_hf", &ts->hf_export);
    mf_get_bool(mf, "checkpoint.create_seed_checkpoint", &ts->seed_checkpoint);
    if (mf_get_str(mf, "model.tokenizer_path", &ts->tokenizer_path)) ts->tokenizer_path = NULL;
    if (mf_get_str(mf, "model.hf_assets_path", &ts->hf_assets_path)) ts->hf_assets_path = NULL;
    for (int a = 0; a < CT_MESH_NAXES; a++)
        if (mf_get_int(mf, mesh_degree_keys[a], &ts->degree[a])) ts->degree[a] = 0;
    profile_read(mf, &ts->profiling);
    generate_read(mf, &ts->generate);
    ct_status st = dataset_read(mf, "training", &ts->data);
    if (st == CT_OK) st = validation_read(mf, ts->local_batch_size, &ts->validation);
    return st;
}

void train_settings_free(train_settings *ts) {
    free(ts->data.items);
    free(ts->validation.data.items);
    ts->data.items = ts->validation.data.items = NULL;
}
