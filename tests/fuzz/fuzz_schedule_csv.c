/* fuzz_schedule_csv.c: any bytes as a CSV pipeline schedule: the parser of the CSV schedule plugin
 * (plugins/schedules/csv.c, compiled in here) returns every rank's actions or refuses with a message
 * naming the file; the checker (core/schedule/schedule.c) then accepts the lists or names what is wrong, and
 * the timeline of an accepted schedule is drawn. Never a crash, a leak or an out-of-range action.
 *
 * The first 3 bytes choose the shape: pp = 1 + b0 % 4, stages per rank = 1 + b1 % 3,
 * microbatches = 1 + b2 % 8 (seed files start with printable digits: "101" is pp 2, 1 stage per
 * rank, 2 microbatches); the rest is the file.
 *
 * libFuzzer:  make build/fuzz/fuzz_schedule_csv (links build/fuzz/libctitan-core.a, the core built with the
 *             fuzzer's instrumentation); replay: tests/cli/fuzz_replay.sh's build of it.
 * plain:      link with tests/fuzz/replay_main.c instead of -fsanitize=fuzzer (tests/cli/schedule_cli.sh) */
#include "../../plugins/schedules/csv.c"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedule/schedule.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "fuzz_schedule_csv: %s failed\n", #c); __builtin_trap(); } } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Parses the row of one rank twice: once to count (no room), once into an array of that size. */
static int parse_rank(const char *text, size_t len, const ct_schedule_shape *shape, sched_rank *out, char *err,
                      size_t errlen) {
    sched_writer w = {NULL, 0, 0};
    if (csv_parse("fuzz.csv", text, len, shape, &w, NULL, err, errlen)) {
        CHECK(strncmp(err, "fuzz.csv:", 9) == 0);
        return -1;
    }
    out->actions = malloc(sizeof *out->actions * (size_t)(w.n + 1));
    CHECK(out->actions);
    for (int k = 0; k < w.n; k++) out->actions[k] = (ct_pp_action){.struct_size = sizeof(ct_pp_action)}; /* as the host does */
    sched_writer fill = {out->actions, w.n, 0};
    CHECK(csv_parse("fuzz.csv", text, len, shape, &fill, NULL, err, errlen) == 0);
    CHECK(fill.n == w.n);
    out->n = w.n;
    for (int k = 0; k < out->n; k++) {
        const ct_pp_action *a = &out->actions[k];
        CHECK(a->op >= CT_PP_F && a->op <= CT_PP_W);
        CHECK(a->stage >= 0 && a->stage < shape->pp_size * shape->stages_per_rank);
        CHECK(a->microbatch >= 0 && a->microbatch < shape->n_microbatches);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    sched_plan plan = {.name = "CSV", .placement = CT_PP_LOOP, .pp = 1 + data[0] % 4,
                       .stages_per_rank = 1 + data[1] % 3, .n_microbatches = 1 + data[2] % 8};
    plan.n_stages = plan.pp * plan.stages_per_rank;
    const char *text = (const char *)data + 3;
    size_t len = size - 3;
    char err[1024];
    plan.ranks = calloc((size_t)plan.pp, sizeof *plan.ranks);
    CHECK(plan.ranks);
    int parsed = 1;
    for (int r = 0; r < plan.pp && parsed; r++) {
        ct_schedule_shape shape = {.struct_size = sizeof shape, .pp_size = plan.pp,
                                   .stages_per_rank = plan.stages_per_rank, .n_microbatches = plan.n_microbatches,
                                   .rank = r, .csv_path = "fuzz.csv"};
        parsed = parse_rank(text, len, &shape, &plan.ranks[r], err, sizeof err) == 0;
    }
    if (parsed) {
        schedule_costs costs = SCHEDULE_COSTS_DEFAULT;
        ct_status rc = schedule_check(&plan, &costs);
        const char *why = ct_last_error();
        CHECK(rc == CT_OK || rc == CT_ERR_INTERNAL);
        CHECK(rc == CT_OK || strncmp(why, "rank ", 5) == 0 || strncmp(why, "deadlock: rank ", 15) == 0);
        if (rc == CT_OK) {
            CHECK(plan.bubble >= 0 && plan.bubble < 1);
            CHECK(plan.peak_activations >= 1 && plan.peak_activations <= plan.n_stages * plan.n_microbatches);
            for (int r = 0; r < plan.pp; r++) CHECK(plan.ranks[r].busy <= plan.makespan);
            FILE *devnull = fopen("/dev/null", "w");
            if (devnull) {
                schedule_timeline(&plan, devnull);
                fclose(devnull);
            }
        }
    }
    schedule_plan_free(&plan);
    return 0;
}
