/* session.h: a run's pieces, built from a manifest: plugins, device, model, runtime, optimizer. */
#ifndef CT_SESSION_H
#define CT_SESSION_H

#include "ctitan/device.h"
#include "ctitan/model.h"
#include "ctitan/optimizer.h"
#include "ctitan/quantizer.h"
#include "ctitan/strategy.h"
#include "host/host.h"
#include "config/manifest.h"
#include "engine/pipeline.h"
#include "engine/runtime.h"
#include "engine/settings.h"
#include "engine/strategies.h"
#include "tokenizer/tokenizer.h"

/* Errors: every function here that can fail returns ct_status after printing its one line on
 * stderr: CT_ERR_INVALID for bad input (manifest, options, plugins, data files, usage), another
 * status for a failure while running. main.c alone turns statuses into exit codes. */

typedef struct session {
    manifest *mf;
    engine_settings cfg; /* the engine's keys, read from mf once when the session opens */
    plugin *devp, *modelp, *optp, *commp, *quantp;
    const ct_quantizer_api *qapi; /* NULL: no quantizer */
    char quant_section[160];      /* its options' section (quantize.dense.NAME): quantp->section points here */
    ct_quantizer *quant;
    const ct_comm_api *capi; /* NULL on one rank */
    ct_comm *comm;
    /* the strategies in the order they are applied (engine/strategies.h): item i's plugin, its API and
     * its instance (NULL where it is not created: a mesh axis of degree 1, or no run) */
    strategy_list strategies;
    plugin *strategyp[SESSION_MAX_STRATEGIES];
    const ct_strategy_api *strategy_api[SESSION_MAX_STRATEGIES];
    ct_strategy *strategy[SESSION_MAX_STRATEGIES];
    ct_mesh_info mesh;
    int rank, world;
    const ct_device_api *d;
    ct_device *dev;
    const ct_model_api *m;
    ct_model *model;
    const ct_optimizer_api *o;
    ct_optimizer *opt;
    runtime rt;
    int rt_ready;
    char *opt_mem;   /* one allocation: state_count f32 values per parameter element */
    size_t opt_bytes;
    int n_state;
    pipeline *pl;      /* pipeline parallel (pp > 1), else NULL */
    double peak_flops; /* measured matmul peak of the device at matmul_precision, FLOP/s (0 if unknown) */
    int peak_stated;   /* 1: peak_flops is metrics.peak_tflops, not measured */
    int opt_calls;                /* optimizer calls in the last step (contiguous tensors merged) */
    double aux_loss;   /* the last step's auxiliary losses (ct_builder.aux_loss), normalised as the loss is
                          and included in it; 0 without any */
    int has_aux;       /* a unit added an auxiliary loss in some step */
    const char *matmul_precision; /* "f32", or "bf16" once the device took set_matmul_dtype(CT_BF16) */
    char flavor[64];      /* model.flavor as the pack got it: torchtitan's *_flex_attn / *_varlen_attn names
                             without their suffix */
    int flavor_doc;       /* the flavor's name asked for block-causal attention (its suffix) */
} session;

/* Command-line arguments common to train/generate: a manifest and --section.key=value overrides. */
typedef struct run_args {
    const char *config;
    int print_config, dry_run, help;
    const char *checkpoint; /* generate: model file */
    const char *prompt;     /* generate: overrides generate.prompt */
    int chat;               /* generate --chat: the prompt as a user message through a chat template */
    const char *chat_template; /* generate --chat-template: llama3, chatml or a file (implies chat) */
    int print_prompt_ids;   /* generate --print-prompt-ids */
    const char *logits_out; /* generate --logits-out FILE: the prompt's logits */
    int reads_no_data;      /* generate: a torchtitan dataset name (c4_test) is dropped, not refused */
} run_args;

/* Parses argv after the subcommand into args (every field but reads_no_data, which the command sets
 * first) and applies overrides to a freshly loaded manifest.
 * Returns the manifest, or NULL after printing one error line (*status CT_ERR_INVALID; CT_OK with
 * args->help). */
manifest *session_parse(int argc, char **argv, run_args *args, const char *usage, ct_status *status);

/* Loads plugins, validates the manifest, creates device and model; with `with_params`, also the
 * runtime (parameters initialised) and `with_optimizer` the optimizer and its states.
 * Prints one error line and returns its status on failure, CT_OK on success. */
ct_status session_open(session *s, manifest *mf, int with_params, int with_optimizer);
void session_close(session *s);

/* A path from the manifest: as given when it exists (or is absolute), else relative to the
 * manifest's folder. */
void session_resolve_path(const manifest *mf, const char *p, char *out, size_t len);

/* Reads the parameters back from a ctt file (ckpt_save_model, checkpoint/checkpoint.h, writes one).
 * Prints nothing: CT_OK, or a status with the error set. A manifest whose model.flavor is
 * from_checkpoint must have been resolved first (mdesc_from_checkpoint, checkpoint/model_desc.h):
 * the session takes the manifest as it is. */
ct_status session_load_model(session *s, const char *path);

/* ABI 2.20: the pack's buffers (ct_model_buffer: its own state beside the parameters), *out the pack's
 * array; 0 (and *out NULL) when it has none. */
int session_buffers(const session *s, const struct ct_model_buffer **out);

/* Whether this rank's copy of buffer b is the one a save writes: the first rank of every mesh axis but pp,
 * on the pipeline stage that runs b's unit. */
int session_buffer_saved_here(const session *s, const struct ct_model_buffer *b);

/* Buffer b's values (numel floats into host) as the pipeline stage that runs its unit holds them: the
 * copy a save or an export writes (another stage's copy is never updated). A collective over pp. */
ct_status session_buffer_get(session *s, const struct ct_model_buffer *b, float *host);
/* Every strategy's post_step (ABI 2.1): after the optimizer's step and after local storage was loaded.
 * CT_OK, or the strategy's status with the error set. */
ct_status session_post_step(session *s);
/* The planner's session: plugins, model and (with_instances) optimizer and quantizer without a
 * device; see session.c. */
ct_status session_open_plan(session *s, manifest *mf, int with_instances);
/* The data-parallel strategy's plugin of s (NULL: none). */
const plugin *session_dp_strategy(const session *s);
/* Loads a plugin by name as a run does (its options join the manifest's schema). */
ct_status session_load_plugin(session *s, const char *section, const char *key, const char *name, ct_plugin_kind kind,
                              plugin **out);
/* Loads the dense quantizer (quantize.dense.name) into s->quantp as a run that asks for it does, without
 * creating it (already loaded: nothing); *enable_key gets the key that switches it on. */
ct_status session_load_quantizer(session *s, char *enable_key, size_t len);

/* Opens model.tokenizer_path (else model.hf_assets_path; a tokenizer file or a folder) and checks it
 * against the model (every id it makes is a row of the embedding). Prints one line naming the key
 * and returns CT_ERR_INVALID, or CT_OK with *tok set. */
ct_status session_open_tokenizer(session *s, ct_tokenizer **tok);
/* Samples up to max_new tokens after `prompt` and prints the text (rank 0). Sizes are checked, and
 * memory grows with the tokens made. */
ct_status session_generate(session *s, const ct_tokenizer *tok, const char *prompt, int64_t max_new, double temperature,
                     int64_t top_k, double top_p, uint64_t seed, int64_t max_context);
/* The same from a chat template's prompt: prompt (n ids, as the template renders it: no BOS added)
 * and the template's end-of-turn token stop, which may be sampled (though special) and ends the
 * reply; only the reply is printed. */
ct_status session_generate_chat(session *s, const ct_tokenizer *tok, const int32_t *prompt, size_t n, int32_t stop,
                                int64_t max_new, double temperature, int64_t top_k, double top_p, uint64_t seed,
                                int64_t max_context);

/* One optimizer step. inputs, targets: this rank's G sequences (its slice of the global batch; the
 * whole batch on one rank), (G, T) on the host, run in microbatches of L: zero grads,
 * forward/backward each microbatch with the loss normalised by the global batch's valid-token
 * count, global grad norm over every rank, clip to max_norm, optimizer step at lr on local storage.
 * *loss and *valid are global.
 * Under block-causal attention, starts (G, T; may be NULL) gives the documents: 1 where an input starts
 * one (dataloader_sequence_docs, which also ignored the targets that start one); NULL: a document ends
 * at each EOS, and a target after an EOS is ignored here.
 * CT_OK, or the status of what failed (ct_last_error). A norm that is not finite is no failure: CT_OK
 * with *norm not finite and nothing updated (the caller decides). */
ct_status session_train_step(session *s, const int32_t *inputs, const int32_t *targets, const uint8_t *starts,
                             int64_t G, int64_t L,
                             int64_t T, double lr, double max_norm, int64_t step, double *loss, double *norm,
                             int64_t *valid);

/* Validation: the loss of this rank's G sequences (its slice of a global batch), forward only in
 * microbatches of L with nothing recorded, no gradient, optimizer or strategy post_step touched (the
 * same forward the training step runs, so the same loss under every layout; under pipeline parallel
 * each stage's output goes to the next over the pp group, outside the schedule). *loss_sum: the summed
 * cross entropy and *valid the valid target tokens, both over the whole global batch. starts: as
 * session_train_step's.
 * CT_OK, or the status of what failed (ct_last_error). */
ct_status session_eval_step(session *s, const int32_t *inputs, const int32_t *targets, const uint8_t *starts,
                            int64_t G, int64_t L,
                            int64_t T, double *loss_sum, int64_t *valid);

/* ABI 2.1: the optimizer's step_param once per parameter slot, in slot order on every rank (slots of
 * another pipeline stage included), at lr. CT_OK, or the optimizer's status (ct_last_error;
 * CT_ERR_UNSUPPORTED when it has no step_param). */
ct_status session_step_params(session *s, double lr, int64_t step);


/* The loaded dense quantizer's recipe as its own options read it: the values of its string search
 * knobs (ABI 2.21, ct_plugin_info.knobs; the planner's layout line names it by the same words), one
 * word each, into out (len bytes, "" when it has none or no quantizer is loaded). Returns out. */
const char *session_quant_recipe(const session *s, char *out, size_t len);
/* The dense quantizer's format key (quantize.dense.NAME.format), where a message about its recipe points. */
const char *session_quant_format_key(const session *s, char *out, size_t len);
/* 1 when the quantizer asks a data-parallel strategy to gather its converted weights in float8
 * (ABI 2.19's gather_quantized; the strategy env's fp8_all_gather); 0 without one. */
int session_quant_gathers(const ct_quantizer_api *qapi, ct_quantizer *q);

#endif
