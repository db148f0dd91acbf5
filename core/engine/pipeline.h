/* pipeline.h: pipeline parallel on the host side. The model's units are split into stages over
 * the pp axis (pipeline_parallel_* keys), a schedule plugin lists each rank's actions and a runner
 * plugin (ctitan/pipeline.h) executes them; this file plans the split, lends the runner the calls
 * that run one stage for one microbatch, and keeps each microbatch's activations until its last
 * backward on this rank. */
#ifndef CT_PIPELINE_H
#define CT_PIPELINE_H

#include "ctitan/pipeline.h"
#include "config/manifest.h"
#include "engine/settings.h"
#include "engine/runtime.h"
#include "schedule/schedule.h"

typedef struct pp_ctx pp_ctx;

typedef struct pp_inbox {
    float *data;
    size_t cap; /* bytes */
    int used;
    int ndim;
    int64_t shape[CT_MAX_DIMS];
} pp_inbox;

typedef struct pipeline {
    plugin *schedp, *runp;
    const ct_pipeline_api *api;
    ct_runner *runner;
    sched_plan plan;
    int pp, rank, n_stages, spr, n_mb;
    int64_t mb_size;
    int *stage_u0, *stage_u1; /* units [u0, u1] of each stage */
    int *unit_rank;           /* the pp rank that runs each unit (runtime_dist.unit_rank) */
    int *stage_head;          /* per unit: 1 for a stage's first unit */
    int *stage_left;          /* per microbatch: this rank's stages whose work is not finished */
    pp_ctx **ctx;             /* microbatch contexts: activations, tape, gradients; reused */
    int n_ctx;
    int *mb_ctx;              /* microbatch -> context index, -1 none yet */
    int peak_ctx;             /* the most contexts live at once (microbatches held) */
    int split_backward;       /* this rank's schedule has I/W actions (zero bubble) */
    /* Activations received ahead of their F (the runner posts every receive early) wait in buffers of
     * their own, so an early arrival does not take a whole context: a free list of device buffers,
     * and per (stage, microbatch) the buffer holding its input, -1 none. */
    pp_inbox *inbox;
    int n_inbox;
    int *inbox_of;
    /* one call of pipeline_step */
    runtime *rt;
    const int32_t *tokens, *targets;
    const uint8_t *starts; /* the tokens' document starts (runtime.doc_starts), or NULL */
    int64_t T;
    float loss_scale;
    int last;
    double loss_sum;
    int *bwd_done; /* per unit: backwards whose weight gradient is complete (post_backward calls) */
    /* measured over the timed steps */
    double busy_seconds, step_seconds; /* summed over every pipeline_step */
} pipeline;

/* Plans the pipeline from its keys (ps, engine_settings_read's; pp > 1): loads the schedule and checks it,
 * splits the units into stages; a bad key is named where mf set it. Prints one clear line and returns CT_ERR_INVALID for a bad setting (CT_ERR_NOMEM when
 * memory runs out); CT_OK on success. */
ct_status pipeline_plan(pipeline *pl, const pipeline_settings *ps, const manifest *mf, const ct_model_desc *desc,
                        const ct_mesh_info *mesh, const char *(*unit_name)(ct_model *, int), ct_model *model);
/* 1 when some rank's schedule splits a unit's backward into input and weight halves (I/W). */
int pipeline_splits_backward(const pipeline *pl);
/* Creates the runner plugin once the runtime exists. CT_OK, or a status after printing one line. */
ct_status pipeline_start(pipeline *pl, const pipeline_settings *ps, const manifest *mf, runtime *rt,
                         const ct_comm_api *capi, ct_comm *comm, const ct_mesh_info *mesh);
/* One local batch (B sequences of T) through the pipeline: forward, backward and the strategies'
 * hooks; *loss_sum gets the summed loss of the batch on every pp rank. CT_OK, or the status of what
 * failed (the runner's, a hook's, the comm's) with the error set. */
ct_status pipeline_step(pipeline *pl, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T,
                        float loss_scale, int last, double *loss_sum);
void pipeline_free(pipeline *pl);

#endif
