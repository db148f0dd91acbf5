/* schedule.h: the host side of pipeline schedules (ctitan/schedule.h): loading a schedule plugin by
 * name, collecting every rank's action list, and the checker that simulates all ranks together.
 *
 * The checker runs each rank's list in order; an action starts when the rank is free and its
 * dependencies have finished:
 *   F(s, m)          after F(s - 1, m)
 *   B(s, m), I(s, m) after F(s, m) and, unless s is the last stage, B or I of (s + 1, m)
 *   W(s, m)          after I(s, m)
 * Communication is free. It reports the makespan, each rank's busy time, the bubble fraction
 * 1 - sum(busy) / (ranks * makespan), and the peak number of microbatches whose activations a rank
 * holds (a (stage, microbatch) counts from its F until its B or W). `ctitan schedule` prints all of
 * it with a timeline; the pp runtime uses the same lists (and the same check) to run a step.
 */
#ifndef CT_SCHEDULE_CORE_H
#define CT_SCHEDULE_CORE_H

#include "ctitan/schedule.h"
#include "host/host.h"

#include <stdint.h>
#include <stdio.h>

/* Time units per action; the checker's model of a step (F = 1, B = 2, I = 1, W = 1 by default). */
typedef struct schedule_costs {
    int f, b, i, w;
} schedule_costs;
#define SCHEDULE_COSTS_DEFAULT ((schedule_costs){1, 2, 1, 1})

typedef struct sched_rank {
    ct_pp_action *actions; /* in the order the rank runs them; allocated here with sizeof(ct_pp_action) elements,
                              so the host indexes them directly (plugins step with CT_AT) */
    int n;
    int64_t *start; /* schedule_check: when each action starts */
    int64_t busy;   /* schedule_check: time spent computing */
    int peak_activations;
} sched_rank;

typedef struct sched_plan {
    char name[64]; /* the plugin's info->name */
    ct_pp_placement placement;
    int pp, stages_per_rank, n_stages, n_microbatches;
    sched_rank *ranks; /* pp of them */
    /* filled by schedule_check */
    schedule_costs costs;
    int64_t makespan;
    double bubble;
    int peak_activations; /* the max over ranks */
} sched_plan;

/* Turns a schedule name as a user writes it ("Interleaved1F1B", "interleave_1f1b", "zbv", "csv") into
 * the file name of its plugin, "ctitan-schedule-<canonical lowercase>.so": lowercases, drops '_',
 * '-', ' ' and a leading "schedule" (PyTorch's class names), and maps the aliases. A name that is
 * no shipped schedule still gets a file name (a third party's plugin on the search path). 0, or -1
 * when the name is empty, has other characters or does not fit in len. */
int schedule_normalize(const char *name, char *out, size_t len);

/* Loads a schedule plugin: a name (normalized, looked up on the plugin search path), or a path (a
 * name with '/' or ending in .so, relative to the manifest's folder when mf is given). Checks the
 * kind and the API table's size. An unknown name is an error listing the schedules that can be
 * loaded. NULL with one line in ct_last_error on failure. */
plugin *schedule_load(const char *name, const manifest *mf);

/* The API table of a plugin schedule_load returned. */
const ct_schedule_api *schedule_api(const plugin *p);
/* The stages per rank the schedule runs when the user names no split: its stages_per_rank (ABI 2.11;
 * the CSV schedule counts its file's), else its min_stages_per_rank. CT_OK, or a status with one line set. */
ct_status schedule_stages_per_rank(const plugin *p, int pp, int n_microbatches, const char *csv_path, int *spr);

/* Writes the names of the schedules on the search path ("GPipe, 1F1B, ...") into out. Returns how many. */
int schedule_list(const manifest *mf, char *out, size_t len);

/* The rank that holds `stage` under a placement. */
int schedule_stage_rank(ct_pp_placement placement, int pp, int stage);

/* Asks the plugin for every rank's actions for the shape (csv_path may be NULL) into *plan. CT_OK, or
 * CT_ERR_INVALID (the shape, or the plugin refused it), CT_ERR_INTERNAL (the plugin broke its
 * contract), CT_ERR_NOMEM, with one line in ct_last_error. Free with schedule_plan_free, also after a
 * failure. */
ct_status schedule_actions(const plugin *p, int pp, int stages_per_rank, int n_microbatches, const char *csv_path,
                           sched_plan *plan);
void schedule_plan_free(sched_plan *plan);

/* Checks and simulates the plan (see the top of this file). CT_OK when valid (the timing fields of the
 * plan and its ranks are filled); CT_ERR_INTERNAL when the schedule is wrong, the message naming the
 * rank and the action ("rank 1 never runs 1B3", "deadlock: rank 0 waits at 0B2 for 1B2 (rank 1),
 * ..."); CT_ERR_INVALID when the costs are not positive or the plan is inconsistent; CT_ERR_NOMEM. */
ct_status schedule_check(sched_plan *plan, const schedule_costs *costs);

/* A short name of an action: "F3" when every rank holds one stage, "2F3" (stage 2) otherwise. */
void schedule_action_name(const sched_plan *plan, const ct_pp_action *a, char *out, size_t len);

/* A checked plan as text: a time axis, then one line per rank with one column per time unit. */
void schedule_timeline(const sched_plan *plan, FILE *out);

/* The plan in the CSV schedule's format (one row per rank, cells like 0F0, 3I2): a shipped schedule
 * to start a hand-written one from. Written to a temporary name and renamed. */
ct_status schedule_write_csv(const sched_plan *plan, const char *path);

/* A checked plan as an SVG picture (one bar per action, coloured by op, on a time axis), written
 * to a temporary name and renamed. */
ct_status schedule_svg(const sched_plan *plan, const char *path);

#endif
