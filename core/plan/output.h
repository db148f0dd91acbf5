/* output.h: a plan as text, as JSON (the schema is in docs/planning.md) and as a manifest. */
#ifndef CT_PLAN_OUTPUT_H
#define CT_PLAN_OUTPUT_H

#include "plan/plan.h"
#include "plan/search.h"

#include <stdio.h>

/* What one `ctitan plan` run found: the manifest's own layout (results[0], search NULL), or a
 * search's best layouts with its statistics. */
typedef struct plan_report {
    const char *manifest_path;
    const hw_profile *hw;
    int gpus, gpus_per_node;
    const plan_model_sizes *model;     /* may be NULL: sizes not printed */
    const plan_result *results;
    int n_results;
    const plan_search_stats *search;   /* NULL: an evaluation of the manifest's layout */
} plan_report;

/* The whole report as text (each layout by plan.h's plan_print_text). */
void plan_report_text(const plan_report *rep, FILE *f);
/* CT_OK, or a status with the error set (out of memory, a write error). */
ct_status plan_print_json(const plan_report *rep, FILE *f);

/* Writes `mf` (its values as given in the file and on the command line) with the layout's keys set:
 * parallelism.*, training.local_batch_size and global_batch_size, activation_checkpoint.*,
 * compile.enable, each plugin search knob where it counts. Relative paths that name files beside the manifest are
 * rewritten to stay valid from the new file's folder. CT_OK, or a status (CT_ERR_IO, or CT_ERR_NOMEM)
 * with one line set. */
ct_status plan_write_manifest(const manifest *mf, const plan_layout *l, const char *path);

/* The layout in one line ("dp_replicate 1 x dp_shard 8 x cp 1 x tp 1 x pp 1, local batch 2 ..."). */
void plan_layout_line(const plan_layout *l, char *out, size_t len);

#endif
