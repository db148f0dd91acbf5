/* test_schedules.c: every shipped pipeline schedule, loaded as a plugin, produces action lists the
 * checker accepts for many shapes; the bubbles are the textbook ones; the zero-bubble schedules beat
 * 1F1B; and the checker refuses broken schedules (hand-written CSVs) with a message naming the rank
 * and the action. Needs the schedule plugins built (make all). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tmpdir.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "schedule/schedule.h"


static int setup(void **state) {
    (void)state;
    return tmpdir_make("schedules");
}

static int teardown(void **state) {
    (void)state;
    tmpdir_remove();
    return 0;
}

static plugin *load(const char *name) {
    plugin *p = schedule_load(name, NULL);
    if (!p) fail_msg("cannot load schedule %s: %s", name, ct_last_error());
    return p;
}

/* Builds and checks a plan with the default costs; fails the test when either step fails. */
static void plan_checked(const plugin *p, int pp, int spr, int m, sched_plan *plan) {
    if (schedule_actions(p, pp, spr, m, NULL, plan) != CT_OK)
        fail_msg("%s pp %d x %d stages, %d microbatches: refused: %s", p->info.name, pp, spr, m, ct_last_error());
    schedule_costs costs = SCHEDULE_COSTS_DEFAULT;
    if (schedule_check(plan, &costs) != CT_OK)
        fail_msg("%s pp %d x %d stages, %d microbatches: the checker says: %s", p->info.name, pp, spr, m,
                 ct_last_error());
}

/* ---- names ---- */

static void test_normalize_maps_spellings_to_one_file(void **state) {
    (void)state;
    static const char *cases[][2] = {
        {"GPipe", "gpipe"},
        {"gpipe", "gpipe"},
        {"ScheduleGPipe", "gpipe"},
        {"1F1B", "1f1b"},
        {"1f1b", "1f1b"},
        {"Interleaved1F1B", "interleaved1f1b"},
        {"interleaved_1f1b", "interleaved1f1b"},
        {"interleave_1f1b", "interleaved1f1b"},
        {"Interleave-1F1B", "interleaved1f1b"},
        {"looped 1f1b", "interleaved1f1b"},
        {"LoopedBFS", "loopedbfs"},
        {"looped_bfs", "loopedbfs"},
        {"InterleavedZeroBubble", "interleavedzerobubble"},
        {"interleaved_zb", "interleavedzerobubble"},
        {"ZBVZeroBubble", "zbvzerobubble"},
        {"zbv", "zbvzerobubble"},
        {"zero_bubble_v", "zbvzerobubble"},
        {"DualPipeV", "dualpipev"},
        {"ScheduleDualPipeV", "dualpipev"},
        {"dual_pipe_v", "dualpipev"},
        {"CSV", "csv"},
        {"PipelineScheduleMulti", "csv"},
        {"MyOwnSchedule", "myownschedule"}, /* not shipped: still a file name on the search path */
    };
    char out[128], want[128];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        assert_int_equal(schedule_normalize(cases[i][0], out, sizeof out), 0);
        snprintf(want, sizeof want, "ctitan-schedule-%s.so", cases[i][1]);
        if (strcmp(out, want)) fail_msg("'%s' -> %s, expected %s", cases[i][0], out, want);
    }
    assert_int_equal(schedule_normalize("", out, sizeof out), -1);
    assert_int_equal(schedule_normalize("__", out, sizeof out), -1);
    assert_int_equal(schedule_normalize("../evil", out, sizeof out), -1);
    assert_int_equal(schedule_normalize("a.b", out, sizeof out), -1);
    assert_int_equal(schedule_normalize("gpipe", out, 8), -1); /* does not fit */
}

static void test_unknown_name_lists_loadable_schedules(void **state) {
    (void)state;
    assert_null(schedule_load("NoSuchSchedule", NULL));
    const char *err = ct_last_error();
    static const char *names[] = {"GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
                                  "ZBVZeroBubble", "DualPipeV", "CSV"};
    assert_non_null(strstr(err, "NoSuchSchedule"));
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strstr(err, names[i])) fail_msg("'%s' missing from: %s", names[i], err);
    /* a path that is not there: the loader's message */
    assert_null(schedule_load("/nonexistent/sched.so", NULL));
    assert_non_null(strstr(ct_last_error(), "/nonexistent/sched.so"));
    /* a plugin of another kind is refused */
    assert_null(schedule_load(CT_BUILD_PLUGIN_DIR "/ctitan-adamw.so", NULL));
    assert_non_null(strstr(ct_last_error(), "expected a schedule plugin"));
}

/* ---- every shipped schedule over many shapes ---- */

static const char *shipped[] = {"GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
                                "ZBVZeroBubble", "DualPipeV"};

/* pp in {2, 4, 8} x stages per rank in the schedule's range and {1, 2} x microbatches in {pp, 2pp, 4pp}.
 * No shape in this grid is refused: every microbatch count is a multiple of pp, which is all the
 * interleaved schedules ask (max(1, m / pp) equal rounds), and DualPipeV, which needs at least as many
 * microbatches as stages, skips m = pp; refusals are tested below. */
static void test_every_schedule_passes_the_checker(void **state) {
    (void)state;
    int checked = 0;
    for (size_t i = 0; i < sizeof shipped / sizeof *shipped; i++) {
        plugin *p = load(shipped[i]);
        const ct_schedule_api *api = schedule_api(p);
        assert_string_equal(p->info.name, shipped[i]);
        for (int pp = 2; pp <= 8; pp *= 2)
            for (int spr = 1; spr <= 2; spr++) {
                if (spr < api->min_stages_per_rank || (api->max_stages_per_rank && spr > api->max_stages_per_rank))
                    continue;
                for (int f = 1; f <= 4; f *= 2) {
                    int m = f * pp, mixed = !strcmp(shipped[i], "DualPipeV");
                    if (mixed && m < pp * spr) continue;
                    sched_plan plan;
                    plan_checked(p, pp, spr, m, &plan);
                    /* one F and one backward (B, or I and W) per (stage, microbatch), nothing else */
                    int64_t total = 0, busy = 0, counts[5] = {0};
                    for (int r = 0; r < pp; r++) {
                        total += plan.ranks[r].n;
                        busy += plan.ranks[r].busy;
                        for (int k = 0; k < plan.ranks[r].n; k++) counts[plan.ranks[r].actions[k].op]++;
                    }
                    int64_t cells = (int64_t)pp * spr * m;
                    int split = !strcmp(shipped[i], "InterleavedZeroBubble") || !strcmp(shipped[i], "ZBVZeroBubble");
                    assert_int_equal(counts[CT_PP_F], cells);
                    assert_int_equal(counts[CT_PP_B] + counts[CT_PP_I], cells);
                    assert_int_equal(counts[CT_PP_I], counts[CT_PP_W]);
                    if (mixed) /* DualPipeV: whole Bs in the steady state, I and W in the cool-down, both */
                        assert_true(counts[CT_PP_B] > 0 && counts[CT_PP_I] > 0);
                    else
                        assert_int_equal(total, cells * (split ? 3 : 2));
                    assert_int_equal(busy, (int64_t)pp * spr * m * 3); /* F=1 + B=2, or F + I + W */
                    assert_true(plan.bubble >= 0 && plan.bubble < 1);
                    assert_true(plan.makespan >= (int64_t)spr * m * 3);
                    assert_true(plan.peak_activations >= 1 && plan.peak_activations <= spr * m);
                    schedule_plan_free(&plan);
                    checked++;
                }
            }
        plugin_unload(p);
    }
    /* GPipe, 1F1B at 1 stage; four schedules at 2 stages; DualPipeV at 2 stages and m of 2pp and 4pp */
    assert_int_equal(checked, 2 * 9 + 4 * 9 + 6);
}

static void test_gpipe_and_1f1b_have_the_textbook_bubble(void **state) {
    (void)state;
    plugin *gp = load("gpipe"), *ob = load("1f1b");
    for (int pp = 2; pp <= 8; pp *= 2)
        for (int m = pp; m <= 4 * pp; m *= 2) {
            sched_plan g, o;
            plan_checked(gp, pp, 1, m, &g);
            plan_checked(ob, pp, 1, m, &o);
            double textbook = (double)(pp - 1) / (double)(m + pp - 1);
            assert_true(fabs(g.bubble - textbook) < 1e-12);
            assert_true(fabs(o.bubble - textbook) < 1e-12);
            assert_int_equal(g.makespan, 3 * (m + pp - 1));
            assert_int_equal(o.makespan, 3 * (m + pp - 1));
            /* what 1F1B is for: rank 0 holds pp microbatches, GPipe's hold all m */
            assert_int_equal(g.peak_activations, m);
            assert_int_equal(o.peak_activations, pp);
            for (int r = 0; r < pp; r++) assert_int_equal(o.ranks[r].peak_activations, pp - r);
            schedule_plan_free(&g);
            schedule_plan_free(&o);
        }
    /* the costs are parameters: with B as cheap as F, GPipe takes 2 (m + p - 1) */
    sched_plan g;
    assert_int_equal(schedule_actions(gp, 4, 1, 8, NULL, &g), CT_OK);
    schedule_costs even = {1, 1, 1, 1};
    assert_int_equal(schedule_check(&g, &even), CT_OK);
    assert_int_equal(g.makespan, 2 * (8 + 4 - 1));
    schedule_costs bad = {1, 0, 1, 1};
    assert_int_equal(schedule_check(&g, &bad), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "B=0"));
    schedule_plan_free(&g);
    plugin_unload(gp);
    plugin_unload(ob);
}

static void test_interleaved_and_zero_bubble_beat_1f1b(void **state) {
    (void)state;
    plugin *ob = load("1F1B"), *il = load("Interleaved1F1B"), *zb = load("InterleavedZeroBubble"),
           *zbv = load("ZBVZeroBubble");
    for (int pp = 2; pp <= 8; pp *= 2)
        for (int m = pp; m <= 4 * pp; m *= 2) {
            sched_plan o, i, z, v;
            plan_checked(ob, pp, 1, m, &o);
            plan_checked(il, pp, 2, m, &i);
            plan_checked(zb, pp, 2, m, &z);
            plan_checked(zbv, pp, 2, m, &v);
            if (!(i.bubble < o.bubble && z.bubble < o.bubble && v.bubble < o.bubble))
                fail_msg("pp %d m %d: bubbles 1F1B %.4f Interleaved1F1B %.4f InterleavedZeroBubble %.4f ZBV %.4f", pp, m,
                         o.bubble, i.bubble, z.bubble, v.bubble);
            if (!(z.bubble < i.bubble)) fail_msg("pp %d m %d: ZB %.4f not below interleaved %.4f", pp, m, z.bubble, i.bubble);
            schedule_plan_free(&o);
            schedule_plan_free(&i);
            schedule_plan_free(&z);
            schedule_plan_free(&v);
        }
    /* ZB-V with F = I = W and m >= 2p - 1: no bubble past the warmup, under 10% at pp 4 x 16 */
    sched_plan v;
    assert_int_equal(schedule_actions(zbv, 4, 2, 16, NULL, &v), CT_OK);
    schedule_costs equal = {1, 2, 1, 1};
    assert_int_equal(schedule_check(&v, &equal), CT_OK);
    assert_true(v.bubble < 0.1);
    schedule_plan_free(&v);
    plugin_unload(ob);
    plugin_unload(il);
    plugin_unload(zb);
    plugin_unload(zbv);
}

/* DualPipeV: below 1F1B's and Interleaved1F1B's bubble, and its memory balanced: every rank runs 2p
 * forwards before its first backward (2 (p - 1 - r) of chunk 0, then r + 1 of each chunk), and a
 * steady-state pair's F comes before its B, so every rank holds at most 2p + 1 (stage, microbatch)
 * activations, whatever m is. At the bottom of the V, rank p - 1 runs microbatch 0 through stage p right
 * after stage p - 1, at time p: no bubble at the turn. */
static void test_dualpipev_bubble_and_memory(void **state) {
    (void)state;
    plugin *ob = load("1F1B"), *il = load("Interleaved1F1B"), *dp = load("DualPipeV");
    for (int pp = 2; pp <= 8; pp *= 2)
        for (int m = 2 * pp; m <= 4 * pp; m *= 2) {
            sched_plan o, i, d;
            plan_checked(ob, pp, 1, m, &o);
            plan_checked(il, pp, 2, m, &i);
            plan_checked(dp, pp, 2, m, &d);
            if (!(d.bubble < o.bubble && d.bubble < i.bubble))
                fail_msg("pp %d m %d: DualPipeV bubble %.4f, 1F1B %.4f, Interleaved1F1B %.4f", pp, m, d.bubble,
                         o.bubble, i.bubble);
            for (int r = 0; r < pp; r++) assert_int_equal(d.ranks[r].peak_activations, 2 * pp + 1);
            const sched_rank *last = &d.ranks[pp - 1];
            assert_int_equal(last->actions[1].op, CT_PP_F);
            assert_int_equal(last->actions[1].stage, pp);
            assert_int_equal(last->actions[1].microbatch, 0);
            assert_int_equal(last->start[1], pp);
            schedule_plan_free(&o);
            schedule_plan_free(&i);
            schedule_plan_free(&d);
        }
    plugin_unload(ob);
    plugin_unload(il);
    plugin_unload(dp);
}

/* Shapes a schedule cannot serve are refused with a message, never a crash or a wrong list. */
static void test_refused_shapes_are_clean_errors(void **state) {
    (void)state;
    static const struct {
        const char *name;
        int pp, spr, m;
        const char *want;
    } cases[] = {
        {"Interleaved1F1B", 4, 2, 9, "rounds"}, /* max(1, 9 / 4) = 2 rounds of 4.5 */
        {"InterleavedZeroBubble", 8, 2, 17, "rounds"},
        {"GPipe", 4, 2, 8, "exactly 1 stage per rank"},
        {"1F1B", 2, 3, 8, "exactly 1 stage per rank"},
        {"Interleaved1F1B", 4, 1, 8, "2 or more stages per rank"},
        {"ZBVZeroBubble", 2, 3, 8, "exactly 2 stages per rank"},
        {"DualPipeV", 2, 1, 8, "exactly 2 stages per rank"},
        {"DualPipeV", 4, 2, 7, "at least as many microbatches as stages (2 x pp = 8), got 7"},
        {"DualPipeV", 8, 2, 1, "at least as many microbatches as stages (2 x pp = 16), got 1"},
        {"CSV", 2, 1, 4, "pipeline_parallel_schedule_csv"}, /* no file */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        plugin *p = load(cases[i].name);
        sched_plan plan;
        ct_status rc = schedule_actions(p, cases[i].pp, cases[i].spr, cases[i].m, NULL, &plan);
        const char *err = ct_last_error();
        if (rc != CT_ERR_INVALID || !strstr(err, cases[i].want) || !strstr(err, cases[i].name))
            fail_msg("%s pp %d x %d, m %d: rc %d, message '%s' (wanted '%s')", cases[i].name, cases[i].pp,
                     cases[i].spr, cases[i].m, rc, err, cases[i].want);
        schedule_plan_free(&plan);
        plugin_unload(p);
    }
    /* what PyTorch's flexible rounds allow besides multiples of pp: m < 2 pp, and m a multiple of
     * m / pp (10 over pp 4: 2 rounds of 5); the lists must still pass the checker */
    static const int flexible[][2] = {{4, 1}, {4, 3}, {4, 6}, {4, 7}, {4, 10}, {8, 12}, {2, 3}};
    for (int k = 0; k < 2; k++) {
        plugin *p = load(k ? "InterleavedZeroBubble" : "Interleaved1F1B");
        for (size_t i = 0; i < sizeof flexible / sizeof *flexible; i++) {
            sched_plan plan;
            plan_checked(p, flexible[i][0], 2, flexible[i][1], &plan);
            schedule_plan_free(&plan);
        }
        plugin_unload(p);
    }
    /* ZB-V plans for max(2p - 1, m) microbatches and drops the extra ones: fewer must still work */
    plugin *p = load("zbv");
    for (int m = 1; m <= 9; m++) {
        sched_plan plan;
        plan_checked(p, 4, 2, m, &plan);
        schedule_plan_free(&plan);
    }
    plugin_unload(p);
}

/* The orders are PyTorch's: tests/unit/data/schedule_orders.txt holds what torch.distributed.pipelining
 * runs on every rank for many shapes (gen_schedule_orders.py wrote it); each must match the plugin's
 * list action for action, and pass the checker. */
static void test_orders_match_pytorch(void **state) {
    (void)state;
    FILE *f = fopen("tests/unit/data/schedule_orders.txt", "r");
    if (!f) fail_msg("cannot open tests/unit/data/schedule_orders.txt (run from the repository root)");
    static char line[1 << 16], got[1 << 16];
    char name[64] = "", cur[64] = "";
    int p, v, m, r, cp = 0, cv = 0, cm = 0, lines = 0, shapes = 0;
    plugin *pl = NULL;
    sched_plan plan = {0};
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        int off = 0;
        assert_int_equal(sscanf(line, "%63s %d %d %d %d %n", name, &p, &v, &m, &r, &off), 5);
        line[strcspn(line, "\n")] = 0;
        if (strcmp(name, cur) || p != cp || v != cv || m != cm) { /* a new shape: build and check it */
            schedule_plan_free(&plan);
            if (strcmp(name, cur)) {
                plugin_unload(pl);
                pl = load(name);
                snprintf(cur, sizeof cur, "%s", name);
            }
            plan_checked(pl, p, v, m, &plan);
            cp = p, cv = v, cm = m;
            shapes++;
        }
        assert_true(r >= 0 && r < plan.pp);
        size_t used = 0;
        got[0] = 0;
        for (int k = 0; k < plan.ranks[r].n && used + 48 < sizeof got; k++) {
            const ct_pp_action *a = &plan.ranks[r].actions[k];
            used += (size_t)snprintf(got + used, sizeof got - used, "%s%d%c%d", k ? "," : "", a->stage,
                                     "?FBIW"[a->op], a->microbatch);
        }
        if (strcmp(got, line + off))
            fail_msg("%s pp %d x %d, %d microbatches, rank %d:\n  ctitan  %s\n  pytorch %s", name, p, v, m, r, got, line + off);
        lines++;
    }
    fclose(f);
    schedule_plan_free(&plan);
    plugin_unload(pl);
    assert_true(shapes >= 100 && lines >= 300); /* the file was read, not skipped */
}

/* The API contract: too small an array gives CT_ERR_INVALID and the count needed. */
static void test_small_capacity_reports_the_count(void **state) {
    (void)state;
    plugin *p = load("ZBVZeroBubble");
    const ct_schedule_api *api = schedule_api(p);
    ct_schedule_shape shape = {.struct_size = sizeof shape, .pp_size = 4, .stages_per_rank = 2, .n_microbatches = 8, .rank = 1};
    ct_pp_action few[5];
    for (int k = 0; k < 5; k++) few[k] = (ct_pp_action){.struct_size = sizeof few[k]};
    int n = -1;
    assert_int_equal(api->actions(&p->host, &shape, few, 5, &n), CT_ERR_INVALID);
    assert_int_equal(n, 2 * 8 * 3);
    n = -1;
    assert_int_equal(api->actions(&p->host, &shape, NULL, 0, &n), CT_ERR_INVALID);
    assert_int_equal(n, 2 * 8 * 3);
    plugin_unload(p);
}

/* ---- the checker on hand-written CSVs ---- */

static plugin *csv_plugin;

static const char *write_csv(const char *name, const char *text) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* Runs a CSV through the plugin and the checker: CT_OK valid, REJECTED by the checker, REFUSED by the
 * plugin; the message in ct_last_error(). */
#define REJECTED CT_ERR_INTERNAL
#define REFUSED CT_ERR_INVALID
static ct_status run_csv(const char *text, int pp, int spr, int m, sched_plan *keep) {
    const char *path = write_csv("s.csv", text);
    sched_plan plan;
    ct_status rc = schedule_actions(csv_plugin, pp, spr, m, path, &plan);
    if (rc == CT_OK) {
        schedule_costs costs = SCHEDULE_COSTS_DEFAULT;
        rc = schedule_check(&plan, &costs);
    }
    if (keep && rc == CT_OK) *keep = plan;
    else schedule_plan_free(&plan);
    return rc;
}

static void expect_rejected(const char *what, const char *text, int pp, int m, ct_status want_rc, const char *s1,
                            const char *s2) {
    ct_status rc = run_csv(text, pp, 1, m, NULL);
    const char *err = ct_last_error();
    if (rc != want_rc || !strstr(err, s1) || (s2 && !strstr(err, s2)))
        fail_msg("%s: rc %d (wanted %d), message '%s' (wanted '%s' and '%s')", what, rc, want_rc, err, s1,
                 s2 ? s2 : "");
}

static void test_csv_valid_schedule_with_comments_and_gaps(void **state) {
    (void)state;
    csv_plugin = load("csv");
    /* pp 2, 2 microbatches, 1F1B by hand with a split backward on stage 1; blank cells are idle steps */
    const char *text = "# rank 0: forwards, then backwards\n"
                       "0F0, 0F1 ,, 0B0,0B1\n"
                       "\n"
                       "   # rank 1\n"
                       " ,1F0,1I0, 1F1 ,1I1,1W0,\t1W1  \r\n";
    sched_plan plan;
    assert_int_equal(run_csv(text, 2, 1, 2, &plan), CT_OK);
    assert_int_equal(plan.ranks[0].n, 4);
    assert_int_equal(plan.ranks[1].n, 6);
    const ct_pp_action *a = &plan.ranks[1].actions[5];
    assert_int_equal(a->op, CT_PP_W);
    assert_int_equal(a->stage, 1);
    assert_int_equal(a->microbatch, 1);
    /* 0F0 0F1 | 1F0 at 1, 1I0 at 2, 1F1 at 3, 1I1 at 4 | 0B0 waits for 1I0 (ends 3) */
    assert_int_equal(plan.ranks[0].start[2], 3);
    assert_int_equal(plan.peak_activations, 2);
    schedule_plan_free(&plan);
    plugin_unload(csv_plugin);
}

static void test_csv_broken_schedules_name_rank_and_action(void **state) {
    (void)state;
    csv_plugin = load("CSV");
    expect_rejected("missing action", "0F0,0F1,0B0,0B1\n1F0,1B0,1F1\n", 2, 2, REJECTED, "rank 1 never runs 1B1", NULL);
    expect_rejected("missing forward", "0F0,0B0,0B1\n1F0,1B0,1F1,1B1\n", 2, 2, REJECTED, "rank 0 never runs 0F1", NULL);
    expect_rejected("deadlock", "0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n", 2, 2, REJECTED, "deadlock: rank 0 waits at 0B0 for 1B0 (rank 1)",
                    "rank 1 waits at 1F1 for 0F1 (rank 0)");
    expect_rejected("duplicate", "0F0,0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n", 2, 2, REJECTED, "rank 0 runs 0F0 twice", NULL);
    expect_rejected("duplicate backward", "0F0,0F1,0B0,0B1\n1F0,1I0,1W0,1I0,1F1,1B1\n", 2, 2, REJECTED, "rank 1 runs 1I0 twice",
                    NULL);
    expect_rejected("stage of another rank", "0F0,1F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n", 2, 2, REJECTED,
                    "rank 0 runs 1F0, but stage 1 is held by rank 1", NULL);
    expect_rejected("B mixed with I", "0F0,0F1,0B0,0B1\n1F0,1B0,1I0,1F1,1B1\n", 2, 2, REJECTED, "rank 1 mixes 1B0 with 1I0", NULL);
    expect_rejected("B mixed with W", "0F0,0F1,0B0,0B1\n1F0,1B0,1W0,1F1,1B1\n", 2, 2, REJECTED, "rank 1 mixes 1B0 with 1W0", NULL);
    expect_rejected("W before I", "0F0,0F1,0B0,0B1\n1F0,1W0,1I0,1F1,1B1\n", 2, 2, REJECTED, "rank 1 runs 1W0 before 1I0", NULL);
    expect_rejected("W without I", "0F0,0F1,0B0,0B1\n1F0,1W0,1F1,1B1\n", 2, 2, REJECTED, "rank 1 runs 1W0 but never 1I0", NULL);
    expect_rejected("I without W", "0F0,0F1,0B0,0B1\n1F0,1I0,1F1,1B1\n", 2, 2, REJECTED, "rank 1 runs 1I0 but never 1W0", NULL);
    expect_rejected("B before F", "0F0,0F1,0B0,0B1\n1B0,1F0,1F1,1B1\n", 2, 2, REJECTED, "rank 1 runs 1B0 before 1F0", NULL);
    /* refused by the parser: file:line:column, the rank and the cell */
    expect_rejected("malformed op", "0F0,0F1,0B0,0B1\n# rank 1\n1F0, 1X0,1F1,1B1\n", 2, 2, REFUSED, ":3:6: rank 1: cell '1X0'",
                    "F, B, I or W");
    expect_rejected("no microbatch", "0F0,0F1,0B0,0B\n1F0,1B0,1F1,1B1\n", 2, 2, REFUSED, ":1:13: rank 0: cell '0B'", "microbatch");
    expect_rejected("trailing junk", "0F0,0F1 x,0B0,0B1\n1F0,1B0,1F1,1B1\n", 2, 2, REFUSED, ":1:5: rank 0: cell '0F1 x'", NULL);
    expect_rejected("stage out of range", "0F0,0F1,0B0,0B1\n1F0,1B0,7F1,1B1\n", 2, 2, REFUSED, "rank 1: cell '7F1': stage 7 is outside 0..1",
                    NULL);
    expect_rejected("microbatch out of range", "0F0,0F1,0B0,0B1\n1F0,1B0,1F2,1B1\n", 2, 2, REFUSED, "cell '1F2': microbatch 2", NULL);
    expect_rejected("huge number", "0F0,0F1,0B0,0B1\n1F0,1B0,1F99999999999,1B1\n", 2, 2, REFUSED, "too long", NULL);
    expect_rejected("too few rows", "0F0,0F1,0B0,0B1\n", 2, 2, REFUSED, "1 row of actions, but the pipeline has 2 ranks", NULL);
    expect_rejected("too many rows", "0F0\n1F0\n2F0\n", 2, 2, REFUSED, ":3: a row for rank 2", NULL);
    expect_rejected("binary junk", "0F0,\x01\xff\x80,0B0\n", 2, 2, REFUSED, "rank 0: cell '?\?\?'", NULL);
    sched_plan plan;
    assert_int_equal(schedule_actions(csv_plugin, 2, 1, 2, "/nonexistent/s.csv", &plan), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "/nonexistent/s.csv"));
    schedule_plan_free(&plan);
    plugin_unload(csv_plugin);
}

/* The checker itself, on a plan no plugin made: out-of-range fields and V placement. */
static void test_checker_rejects_bad_fields_and_knows_v_placement(void **state) {
    (void)state;
    enum { SZ = sizeof(ct_pp_action) };
    ct_pp_action r0[] = {{SZ, CT_PP_F, 0, 0}, {SZ, CT_PP_F, 3, 0}, {SZ, CT_PP_B, 3, 0}, {SZ, CT_PP_B, 0, 0}};
    ct_pp_action r1[] = {{SZ, CT_PP_F, 1, 0}, {SZ, CT_PP_F, 2, 0}, {SZ, CT_PP_B, 2, 0}, {SZ, CT_PP_B, 1, 0}};
    sched_rank ranks[2] = {{.actions = r0, .n = 4}, {.actions = r1, .n = 4}};
    sched_plan plan = {.name = "V", .placement = CT_PP_V, .pp = 2, .stages_per_rank = 2, .n_stages = 4,
                       .n_microbatches = 1, .ranks = ranks};
    schedule_costs costs = SCHEDULE_COSTS_DEFAULT;
    assert_int_equal(schedule_check(&plan, &costs), CT_OK);
    /* F 0,1,2,3 then B 3,2,1,0: 4 + 8 */
    assert_int_equal(plan.makespan, 12);
    free(ranks[0].start);
    free(ranks[1].start);
    ranks[0].start = ranks[1].start = NULL;
    plan.placement = CT_PP_LOOP; /* now stage 3 belongs to rank 1 */
    assert_int_equal(schedule_check(&plan, &costs), CT_ERR_INTERNAL);
    assert_non_null(strstr(ct_last_error(), "rank 0 runs 3F0, but stage 3 is held by rank 1"));
    plan.placement = CT_PP_V;
    r1[1].op = 9;
    assert_int_equal(schedule_check(&plan, &costs), CT_ERR_INTERNAL);
    assert_non_null(strstr(ct_last_error(), "rank 1: action 1 has op 9"));
    r1[1].op = CT_PP_F;
    r1[1].microbatch = -1;
    assert_int_equal(schedule_check(&plan, &costs), CT_ERR_INTERNAL);
    assert_non_null(strstr(ct_last_error(), "microbatch -1 is outside 0..0"));
    free(ranks[0].start);
    free(ranks[1].start);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_normalize_maps_spellings_to_one_file),
        cmocka_unit_test(test_unknown_name_lists_loadable_schedules),
        cmocka_unit_test(test_every_schedule_passes_the_checker),
        cmocka_unit_test(test_gpipe_and_1f1b_have_the_textbook_bubble),
        cmocka_unit_test(test_interleaved_and_zero_bubble_beat_1f1b),
        cmocka_unit_test(test_dualpipev_bubble_and_memory),
        cmocka_unit_test(test_refused_shapes_are_clean_errors),
        cmocka_unit_test(test_orders_match_pytorch),
        cmocka_unit_test(test_small_capacity_reports_the_count),
        cmocka_unit_test(test_csv_valid_schedule_with_comments_and_gaps),
        cmocka_unit_test(test_csv_broken_schedules_name_rank_and_action),
        cmocka_unit_test(test_checker_rejects_bad_fields_and_knows_v_placement),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
