/* torchtitan_keys.c: torchtitan v0.2.2's keys that are not ctitan's, and what becomes of each. A key
 * accepted here has no effect by design (the reason says why), and only with the values that describe
 * what ctitan does; any other value is refused with that reason, so no setting is silently dropped. */
#include "config/torchtitan_keys.h"

#include "config/manifest.h"

#include <string.h>

#define NO_FT "no torchft fault tolerance: a dead rank ends the job (comm.train_timeout_seconds) and the run " \
              "resumes from its newest checkpoint"
#define LOADER "the data loader reads memory-mapped token shards in the training thread: no worker processes"
/* worker counts tune torchtitan's loader speed only; any value reads the same data here */
#define LOADER_WORKERS "the data loader reads memory-mapped token shards in the training thread: the worker count has no effect"

const tt_key tt_keys[] = {
    /* mapped onto ctitan's key */
    {"debug.seed", "*", "training.seed", "ctitan's training.seed"},
    {"float8.enable_fsdp_float8_all_gather", "*", "quantize.linear.float8.enable_fsdp_float8_all_gather",
     "[float8] is [quantize.linear.float8]"},
    {"float8.recipe_name", "*", "quantize.linear.float8.recipe_name", "[float8] is [quantize.linear.float8]"},
    {"float8.filter_fqns", "*", "quantize.linear.float8.filter_fqns", "[float8] is [quantize.linear.float8]"},
    {"float8.emulate", "*", "quantize.linear.float8.emulate", "[float8] is [quantize.linear.float8]"},
    {"quantize.grouped_mm.float8.fqns", "*", "quantize.dense.float8.grouped_mm_fqns",
     "[quantize.grouped_mm.float8] fqns is the float8 plugin's grouped_mm_fqns (recipe rowwise)"},
    {"quantize.grouped_mm.mx.fqns", "*", "quantize.dense.float8.grouped_mm_fqns",
     "[quantize.grouped_mm.mx] fqns is the float8 plugin's grouped_mm_fqns (quantize.grouped_mm.mx in "
     "model.converters makes its grouped_mm_recipe mxfp8)"},
    {"quantize.grouped_mm.mx.recipe_name", "*", "quantize.dense.float8.grouped_mm_recipe",
     "[quantize.grouped_mm.mx] recipe_name is the float8 plugin's grouped_mm_recipe (mxfp8)"},
    {"float8.precompute_float8_dynamic_scale_for_fsdp", "*", NULL,
     "float8 all-gather already computes every weight's scale in one all-reduce per step"},
    /* accepted with the values that describe ctitan */
    {"job.save_config_file", "", NULL, "ctitan writes no copy of the config; --print-config prints the effective one"},
    {"job.custom_config_module", "", NULL, "plugins declare their own keys (ctitan train --help lists them); no Python modules"},
    {"metrics.disable_color_printing", "*", NULL, "ctitan prints no colour"},
    {"metrics.save_for_all_ranks", "false", NULL, "metrics.jsonl is written by rank 0 for the whole job"},
    {"model.print_after_conversion", "false", NULL, "no module tree to print; the float8 lines name each converted weight"},
    {"optimizer.early_step_in_backward", "false", NULL,
     "the optimizer steps after the whole backward (gradients are clipped by their global norm first)"},
    {"training.enable_cpu_offload", "false", NULL,
     "no CPU offload of parameters or optimizer states; `ctitan plan` finds a layout that fits in device memory"},
    {"training.dtype", "float32", NULL,
     "parameters and optimizer states are float32; bfloat16 compute is training.mixed_precision_param"},
    {"training.mixed_precision_reduce", "float32", NULL, "gradients are reduced in float32"},
    {"training.gc_freq", "*", NULL, "no garbage collector: memory is one allocation per lifetime"},
    {"training.gc_debug", "false", NULL, "no garbage collector: memory is one allocation per lifetime"},
    {"training.dataloader.num_workers", "*", NULL, LOADER_WORKERS},
    {"training.dataloader.persistent_workers", "*", NULL, LOADER_WORKERS},
    {"training.dataloader.pin_memory", "*", NULL, LOADER},
    {"training.dataloader.prefetch_factor", "*", NULL, LOADER},
    {"validation.dataloader.num_workers", "*", NULL, LOADER_WORKERS},
    {"validation.dataloader.persistent_workers", "*", NULL, LOADER_WORKERS},
    {"validation.dataloader.pin_memory", "*", NULL, LOADER},
    {"validation.dataloader.prefetch_factor", "*", NULL, LOADER},
    {"parallelism.module_fqns_per_model_part", NULL, NULL,
     "stages are split by units: parallelism.pipeline_parallel_stage_units (e.g. \"3,3,2\") or layers_per_stage"},
    {"parallelism.pipeline_parallel_expert_parallel_overlap", "*", NULL,
     "expert parallel's all-to-alls are not overlapped with another pipeline microbatch's compute (DualPipeV runs "
     "each paired forward and backward one after the other)"},
    {"parallelism.context_parallel_load_balancer", "headtail", NULL,
     "each sequence is split into 2 x cp chunks, rank r holding chunk r and its mirror (headtail)"},
    {"parallelism.expert_tensor_parallel_degree", "1", NULL, "no expert tensor parallel: each expert is whole on the ep rank that holds it (parallelism.expert_parallel_degree)"},
    {"parallelism.expert_parallel_comm_backend", "*", NULL,
     "expert parallel's tokens go through the comm plugin's all_to_allv (comm.name picks the backend)"},
    {"checkpoint.enable_ft_dataloader_checkpoints", "false", NULL, NO_FT},
    {"checkpoint.initial_load_in_hf_quantized", "false", NULL, "Hugging Face folders are read as bf16/f32 safetensors"},
    {"checkpoint.enable_first_step_checkpoint", "false", NULL,
     "checkpoints are saved every checkpoint.interval steps and at the end (create_seed_checkpoint writes step 0)"},
    {"checkpoint.load_only", "false", NULL,
     "to load without saving, start from checkpoint.initial_load_path with checkpoint.enable false"},
    {"activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns", "*", NULL,
     "the per-op policy keeps every block's costly outputs by its own rule; there is no MoE router to recompute"},
    {"activation_checkpoint.early_stop", "false", NULL, "recomputation runs a block whole"},
    {"activation_checkpoint.memory_budget", "*", NULL, "only read by mode memory_budget, which ctitan has not"},
    {"activation_checkpoint.visualize_memory_budget_pareto", "false", NULL, "mode memory_budget is not ctitan's"},
    {"activation_checkpoint.preserve_rng_state", "*", NULL, "no random op runs in the forward (no dropout)"},
    {"activation_checkpoint.determinism_check", "*", NULL, "recomputation replays the same ops on the same inputs"},
    {"activation_checkpoint.debug", "false", NULL, "no debug mode for recomputation"},
    {"compile.components", "model|loss", NULL,
     "compile.enable captures a microbatch's whole forward and backward, model and loss, as one device graph"},
    {"compile.backend", "inductor", NULL, "compile.enable captures a device graph (CUDA); there is no backend to pick"},
    {"quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp", "*", NULL,
     "float8 all-gather already computes every weight's scale in one all-reduce per step"},
    {"quantize.linear.mx.mxfp8_dim1_cast_kernel_choice", "*", NULL, "the float8 plugin casts with its own kernels"},
    {"comm.trace_buf_size", "*", NULL, "no NCCL flight recorder; collectives are traced by profiling"},
    {"comm.save_traces_folder", "*", NULL, "no NCCL flight recorder; collectives are traced by profiling"},
    {"comm.save_traces_file_prefix", "*", NULL, "no NCCL flight recorder; collectives are traced by profiling"},
    {"comm.mode", "default", NULL, "no fake backend: `ctitan train --dry-run` and `ctitan plan` plan without devices"},
    {"memory_estimation.enable", "false", NULL, "`ctitan train --dry-run` and `ctitan plan` estimate memory"},
    {"memory_estimation.disable_fake_mode", "*", NULL, "`ctitan train --dry-run` and `ctitan plan` estimate memory"},
    {"fault_tolerance.enable", "false", NULL, NO_FT},
    {"fault_tolerance.process_group", "*", NULL, NO_FT},
    {"fault_tolerance.process_group_timeout_ms", "*", NULL, NO_FT},
    {"fault_tolerance.replica_id", "*", NULL, NO_FT},
    {"fault_tolerance.group_size", "*", NULL, NO_FT},
    {"fault_tolerance.min_replica_size", "*", NULL, NO_FT},
    {"fault_tolerance.semi_sync_method", "", NULL, NO_FT},
    {"experimental.custom_import", "", NULL, "plugins are loaded by name or path (model.name, optimizer.name ...)"},
    {"experimental.custom_args_module", "", NULL, "plugins declare their own keys; no Python modules"},
    {"debug.deterministic", "false", NULL,
     "no deterministic mode to switch on"},
    {"debug.deterministic_warn_only", "*", NULL, "no deterministic mode to switch on"},
    /* true becomes model.moe_force_load_balance (manifest_torchtitan), which the MoE packs declare */
    {"debug.moe_force_load_balance", "true|false", NULL,
     "false routes as the model learned; true is the MoE packs' model.moe_force_load_balance (qwen3, deepseek_v3)"},
    {0},
};

const tt_key *tt_key_find(const char *key) {
    for (const tt_key *t = tt_keys; t->key; t++)
        if (!strcmp(t->key, key)) return t;
    return NULL;
}

/* 1 when the comma-separated list names item. */
static int list_has(const char *list, const char *item) {
    size_t n = strlen(item);
    for (const char *p = list; *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ',')) {
        p += strspn(p, " ");
        if (!strncmp(p, item, n) && (p[n] == ',' || p[n] == ' ' || !p[n])) return 1;
    }
    return 0;
}

/* torchtitan's converters list: the linear converters (float8, mx, quantize.linear.*) turn the
 * quantizer on; the grouped_mm ones too, and alone they leave the linear layers in high precision
 * (linears: false); quantize.grouped_mm.mx makes the experts' recipe mxfp8 unless one is set. */
static int tt_converters(manifest *mf, const char *v) {
    int linear = list_has(v, "float8") || list_has(v, "mx") || list_has(v, "quantize.linear.float8") ||
                 list_has(v, "quantize.linear.mx");
    int grouped_f8 = list_has(v, "quantize.grouped_mm.float8"), grouped_mx = list_has(v, "quantize.grouped_mm.mx");
    const char *r;
    if (grouped_mx && mf_get_str(mf, "quantize.dense.float8.grouped_mm_recipe", &r))
        manifest_override(mf, "quantize.dense.float8.grouped_mm_recipe", "mxfp8");
    if (!linear && (grouped_f8 || grouped_mx)) manifest_override(mf, "quantize.dense.float8.linears", "false");
    return linear || grouped_f8 || grouped_mx;
}

const char *const tt_quantizer_recipe_keys[] = {"quantize.linear.float8.recipe_name", "quantize.linear.mx.recipe_name",
                                                NULL};

int tt_converter_quantizes(const char *s, size_t n) { return memmem(s, n, "float8", 6) || memmem(s, n, "mx", 2); }

int tt_dense_quantizer_requested(manifest *mf) {
    int on = 0;
    const char *v;
    if (!mf_get_str(mf, "quantize.linear.float8.recipe_name", &v) || !mf_get_str(mf, "quantize.linear.mx.recipe_name", &v))
        on = 1;
    if (!mf_get_str(mf, "model.converters", &v) && tt_converters(mf, v)) on = 1;
    manifest_alias(mf, "quantize.linear.mx.recipe_name", "quantize.dense.float8.format");
    manifest_alias(mf, "quantize.linear.float8.recipe_name", "quantize.dense.float8.format");
    manifest_alias(mf, "quantize.linear.mx.filter_fqns", "quantize.dense.float8.filter_fqns");
    manifest_alias(mf, "quantize.linear.float8.filter_fqns", "quantize.dense.float8.filter_fqns");
    manifest_alias(mf, "quantize.linear.float8.emulate", "quantize.dense.float8.emulate");
    manifest_alias(mf, "quantize.linear.float8.enable_fsdp_float8_all_gather",
                   "quantize.dense.float8.enable_fsdp_float8_all_gather");
    return on;
}
