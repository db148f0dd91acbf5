/* ctitan/schedule.h: pipeline schedules (plugin kind CT_KIND_SCHEDULE).
 *
 * A schedule is pure logic: given the pipeline's shape and one pp rank, it lists that rank's compute
 * actions in the order the rank runs them. It never touches a tensor, so it can be checked and
 * drawn without a model (`ctitan schedule`), and swapped from the manifest with no rebuild.
 *
 * Stages: the model's units are split into n_stages = pp_size * stages_per_rank stages, stage 0
 * first. The schedule's placement says which rank holds stage s:
 *   CT_PP_LOOP  rank s % pp_size        (rank r holds r, r + p, r + 2p ...; GPipe, 1F1B, interleaved)
 *   CT_PP_V     stages_per_rank == 2:   rank r holds r and 2p - 1 - r (ZBV zero bubble)
 *
 * Actions: F (forward of one microbatch through one stage), B (its whole backward), or the backward
 * split in two halves, I (gradient for the stage's input: what the previous stage waits for) and
 * W (gradients for the stage's weights; after the I of the same stage and microbatch). Every
 * (stage, microbatch) gets exactly one F and either one B or one I and one W, on the rank that
 * holds the stage.
 *
 * Communication is implied, not listed: the pp runtime sends a stage's output to the next stage's
 * rank after each F and the input gradient to the previous stage's rank after each B or I, and
 * posts the matching receives early (non-blocking). F of stage s > 0 waits for F of stage s - 1 of
 * the same microbatch; B or I of stage s < n_stages - 1 waits for B or I of stage s + 1.
 */
#ifndef CTITAN_SCHEDULE_H
#define CTITAN_SCHEDULE_H

#include "ctitan/abi.h"
#include "ctitan/host.h"

typedef enum ct_pp_op {
    CT_PP_F = 1, /* forward */
    CT_PP_B = 2, /* full backward (input and weight gradients) */
    CT_PP_I = 3, /* backward for the input only */
    CT_PP_W = 4  /* backward for the weights only */
} ct_pp_op;

/* One action. Lists of them are arrays of ABI structs (ctitan/abi.h): whoever allocates a list sets
 * every element's struct_size, and readers and writers step through it with CT_AT, never out[k]. */
typedef struct ct_pp_action {
    size_t struct_size;
    int op; /* ct_pp_op */
    int stage;
    int microbatch;
} ct_pp_action;

typedef enum ct_pp_placement { CT_PP_LOOP = 0, CT_PP_V = 1 } ct_pp_placement;

typedef struct ct_schedule_shape {
    size_t struct_size;
    int pp_size;         /* ranks in the pipeline */
    int stages_per_rank; /* 1 for GPipe and 1F1B, 2 or more for the interleaved ones */
    int n_microbatches;
    int rank;            /* the pp rank whose actions are wanted, 0 .. pp_size - 1 */
    const char *csv_path; /* parallelism.pipeline_parallel_schedule_csv (the CSV schedule reads it), or NULL;
                             the host's, valid during the call */
} ct_schedule_shape;

typedef struct ct_schedule_api {
    size_t struct_size;
    ct_pp_placement placement;
    /* The stages per rank the schedule supports: [min, max], max 0 = no upper limit. */
    int min_stages_per_rank, max_stages_per_rank;
    /* Writes the rank's actions into out's first *n elements. The host allocated `cap` elements and set
     * every one's struct_size: write element k at CT_AT(ct_pp_action, out, k), only the fields that
     * struct_size covers, and leave struct_size as it is. The array is the caller's: keep no pointer to it
     * or to shape. When cap is too small: CT_ERR_INVALID with *n set to
     * the number needed. A shape the schedule cannot serve (e.g. fewer microbatches than it needs):
     * CT_ERR_INVALID with a message through host->set_error. */
    ct_status (*actions)(const ct_host *host, const ct_schedule_shape *shape, ct_pp_action *out, int cap, int *n);
    /* ABI 2.11, optional: the stages per rank this schedule runs for the shape (its stages_per_rank and
     * rank are unset), when the user named no split: the CSV schedule answers with as many as its file
     * names, as torchtitan derives them from the file. NULL: min_stages_per_rank. A shape it cannot
     * serve: CT_ERR_INVALID with a message through host->set_error. */
    ct_status (*stages_per_rank)(const ct_host *host, const ct_schedule_shape *shape, int *stages_per_rank);
} ct_schedule_api;

#endif
