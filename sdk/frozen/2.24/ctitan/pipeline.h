/* ctitan/pipeline.h: the pipeline runner (plugin kind CT_KIND_PIPELINE).
 *
 * With pipeline_parallel_degree > 1 the model's units are split into stages over the pp axis and a
 * runner plugin executes one training step: the list of actions a schedule plugin (schedule.h) gave
 * this rank, in order, moving activations and gradients between stages with the comm plugin.
 *
 * The host owns the model, the tape and the memory; it lends the runner a ct_pipeline_host whose
 * calls run one stage's forward or backward for one microbatch and hand out the tensors that cross
 * stage boundaries. The runner owns the order, the communication (non-blocking sends right after
 * the work that produced them, receives posted early) and the timing it reports.
 *
 * Boundary tensors are f32 and contiguous; their shapes are the model's business (under sequence
 * parallel an activation holds 1/tp of the rows), so the runner sends each one's shape ahead of it.
 * Both ends of a message run the same runner plugin, so the wire format is the runner's business.
 */
#ifndef CTITAN_PIPELINE_H
#define CTITAN_PIPELINE_H

#include "ctitan/abi.h"
#include "ctitan/comm.h"
#include "ctitan/host.h"
#include "ctitan/schedule.h"
#include "ctitan/tensor.h"

#define CT_PP_ACTIVATION 0 /* a stage's output going forward (the next stage's input) */
#define CT_PP_GRADIENT 1   /* the gradient of a stage's input going backward (the previous stage's output grad) */

/* Lent by the host for one step. Every call returns CT_OK or an error with its message set. */
typedef struct ct_pipeline_host {
    size_t struct_size;
    void *ctx;
    /* Forward of `stage` for microbatch `mb`. Stage 0 reads the tokens; a later stage reads the
     * activation that input() placed; the last stage computes the loss. */
    ct_status (*forward)(void *ctx, int stage, int mb);
    /* Backward halves: CT_PP_B (both), CT_PP_I (input gradients only) or CT_PP_W (weight gradients,
     * after the I of the same stage and microbatch). The last stage seeds its loss gradient itself;
     * an earlier one reads the output gradient that input() placed. */
    ct_status (*backward)(void *ctx, int stage, int mb, int op);
    /* What leaves a stage after its work: kind CT_PP_ACTIVATION after forward (its output), or
     * CT_PP_GRADIENT after B or I (the gradient of its input). *data is the host's, valid until the
     * runner releases (stage, mb): the host then reuses that memory for another microbatch. */
    ct_status (*output)(void *ctx, int stage, int mb, int kind, const float **data, int *ndim, int64_t *shape);
    /* Where what arrives for a stage goes: kind CT_PP_ACTIVATION (its input, before its forward) or
     * CT_PP_GRADIENT (its output's gradient, before its backward), of the shape the sender sent.
     * *data is the host's buffer for the runner to fill, valid until it releases (stage, mb). */
    ct_status (*input)(void *ctx, int stage, int mb, int kind, int ndim, const int64_t *shape, float **data);
    /* The runner is done with (stage, mb): its last action ran and every send from it completed. When
     * all of this rank's stages released a microbatch, the host reuses its memory for another. */
    void (*release)(void *ctx, int stage, int mb);
} ct_pipeline_host;

/* How the pipeline is laid out, given at create. Copy the struct; the pointers in it (capi, comm,
 * group, actions) are the host's and stay valid until destroy. */
typedef struct ct_pipeline_env {
    size_t struct_size;
    const ct_comm_api *capi;
    ct_comm *comm;
    ct_comm_group *group; /* the pp group: rank r of it runs stage(s) per placement */
    int pp_rank, pp_size;
    int n_stages, n_microbatches;
    ct_pp_placement placement;
    const ct_pp_action *actions; /* this rank's, in order (the host keeps them alive); step with CT_AT */
    int n_actions;
} ct_pipeline_env;

/* What one step measured on this rank. */
typedef struct ct_pipeline_stats {
    size_t struct_size;
    double busy_seconds;   /* inside forward/backward calls */
    double wait_seconds;   /* blocked on receives */
    double step_seconds;   /* the whole run_step */
} ct_pipeline_stats;

typedef struct ct_pipeline_api {
    size_t struct_size;
    /* *runner is the host's until destroy. */
    ct_status (*create)(const ct_host *host, const ct_pipeline_env *env, ct_runner **runner);
    void (*destroy)(ct_runner *runner);
    /* Runs every action of this rank for one step; returns after all its sends completed. */
    ct_status (*run_step)(ct_runner *runner, const ct_pipeline_host *ph, ct_pipeline_stats *stats);
} ct_pipeline_api;

#endif
