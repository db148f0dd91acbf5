/* cmd_schedule.c: `ctitan schedule`, a pipeline schedule checked and drawn without a model. */
#include "cmd/cmd_schedule.h"

#include "config/manifest.h"
#include "base/error.h"
#include "base/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedule/schedule.h"

#define ERRLEN 2048

static const char usage[] =
    "usage: ctitan schedule --name NAME [--pp P] [--stages S] --microbatches M [--csv FILE] [--svg FILE]\n"
    "                       [--write-csv FILE] [--costs F,B,I,W] [--parallelism.KEY=VALUE ...]\n"
    "\n"
    "Builds every pp rank's list of actions for a pipeline schedule, checks the lists by running all\n"
    "ranks together (an action waits for what it needs: F of stage s for F of s-1; B or I of s for F of s\n"
    "and B or I of s+1; W for I), prints a timeline (one line per rank, one column per time unit), then\n"
    "\"bubble X.XXX  peak activations N  makespan T\". Exit status 0: valid; 1: the checker rejects it\n"
    "(the message names the rank and the action); 2: bad usage or input.\n"
    "\n"
    "  --name NAME         GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble,\n"
    "                      DualPipeV, CSV (any case; '_' and '-' ignored; aliases such as interleave_1f1b,\n"
    "                      zbv), or the path of a schedule plugin (.so). Default CSV when --csv is given.\n"
    "  --pp P              pipeline ranks (default: S / the schedule's fewest stages per rank)\n"
    "  --stages S          stages in all (default: P x the schedule's stages per rank: a CSV's own, else\n"
    "                      the fewest it runs)\n"
    "  --microbatches M    microbatches per step\n"
    "  --csv FILE          the CSV schedule's file: one row per rank, cells <stage><F|B|I|W><microbatch>\n"
    "  --svg FILE          also draw the timeline as SVG\n"
    "  --write-csv FILE    also write the actions as a CSV schedule (to edit and run with --csv)\n"
    "  --costs F,B,I,W     time units per action (default 1,2,1,1)\n"
    "  --parallelism.KEY=VALUE\n"
    "                      an option the schedule declares, as a manifest's parallelism.KEY (also\n"
    "                      --parallelism.KEY VALUE); checked against its type, range and choices\n"
    "                      (ctitan plugins FILE lists a plugin's options)\n"
    "  --help              this text\n";

static ct_status usage_error(const char *msg, const char *arg) {
    fprintf(stderr, "ctitan schedule: %s%s%s (see ctitan schedule --help)\n", msg, arg ? " " : "", arg ? arg : "");
    return CT_ERR_INVALID;
}

static int parse_pos_int(const char *s, int *out) {
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < 1 || v > 1000000) return -1;
    *out = (int)v;
    return 0;
}

static int parse_costs(const char *s, schedule_costs *c) {
    int v[4];
    const char *p = s;
    for (int k = 0; k < 4; k++) {
        char *end;
        errno = 0;
        long x = p ? strtol(p, &end, 10) : 0;
        if (!p || end == p || errno || x < 1 || x > 1000000 || *end != (k < 3 ? ',' : 0)) return -1;
        v[k] = (int)x;
        p = end + 1;
    }
    *c = (schedule_costs){v[0], v[1], v[2], v[3]};
    return 0;
}

typedef struct sched_args {
    const char *name, *csv, *svg, *write_csv;
    int pp, stages, microbatches;
    schedule_costs costs;
    int help; /* --help was asked for */
} sched_args;

/* --parallelism.KEY=VALUE or --parallelism.KEY VALUE: one of the schedule's options, into mf. */
static ct_status parse_option(int argc, char **argv, int *i, manifest *mf) {
    char key[256];
    const char *arg = argv[*i] + 2, *eq = strchr(arg, '='), *value;
    size_t klen = eq ? (size_t)(eq - arg) : strlen(arg);
    if (klen >= sizeof key) return usage_error("option key too long:", argv[*i]);
    memcpy(key, arg, klen);
    key[klen] = 0;
    if (eq) value = eq + 1;
    else if (*i + 1 < argc) value = argv[++*i];
    else return usage_error("no value for", argv[*i]);
    if (manifest_override(mf, key, value) != CT_OK) {
        fprintf(stderr, "ctitan schedule: %s\n", ct_last_error());
        return CT_ERR_INVALID;
    }
    return CT_OK;
}

/* CT_OK (a->help for --help), or CT_ERR_INVALID after printing a usage error. Schedule options go
 * into mf. */
static ct_status parse_args(int argc, char **argv, sched_args *a, manifest *mf) {
    *a = (sched_args){.costs = SCHEDULE_COSTS_DEFAULT};
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            a->help = 1;
            return CT_OK;
        }
        if (ct_cli_opt(argc, argv, &i, "--name", &v)) {
            if (!v || !*v) return usage_error("--name needs a schedule name or a plugin path", NULL);
            a->name = v;
        } else if (ct_cli_opt(argc, argv, &i, "--pp", &v)) {
            if (parse_pos_int(v, &a->pp)) return usage_error("--pp needs a number of ranks >= 1, got", v ? v : "nothing");
        } else if (ct_cli_opt(argc, argv, &i, "--stages", &v)) {
            if (parse_pos_int(v, &a->stages)) return usage_error("--stages needs a number >= 1, got", v ? v : "nothing");
        } else if (ct_cli_opt(argc, argv, &i, "--microbatches", &v)) {
            if (parse_pos_int(v, &a->microbatches))
                return usage_error("--microbatches needs a number >= 1, got", v ? v : "nothing");
        } else if (ct_cli_opt(argc, argv, &i, "--csv", &v)) {
            if (!v || !*v) return usage_error("--csv needs a file", NULL);
            a->csv = v;
        } else if (ct_cli_opt(argc, argv, &i, "--svg", &v)) {
            if (!v || !*v) return usage_error("--svg needs a file", NULL);
            a->svg = v;
        } else if (ct_cli_opt(argc, argv, &i, "--write-csv", &v)) {
            if (!v || !*v) return usage_error("--write-csv needs a file", NULL);
            a->write_csv = v;
        } else if (ct_cli_opt(argc, argv, &i, "--costs", &v)) {
            if (parse_costs(v, &a->costs))
                return usage_error("--costs needs four time units >= 1 for F,B,I,W (e.g. 1,2,1,1), got", v ? v : "nothing");
        } else if (!strncmp(argv[i], "--parallelism.", 14) && argv[i][14] && argv[i][14] != '=') {
            if (parse_option(argc, argv, &i, mf)) return CT_ERR_INVALID;
        } else {
            return usage_error("unknown argument", argv[i]);
        }
    }
    if (!a->name) a->name = a->csv ? "CSV" : NULL;
    if (!a->name) return usage_error("--name is required (e.g. --name 1F1B)", NULL);
    if (!a->microbatches) return usage_error("--microbatches is required", NULL);
    if (!a->pp && !a->stages) return usage_error("give --pp (ranks) or --stages (stages in all), or both", NULL);
    return CT_OK;
}

/* Fills pp and stages from whichever was given, with the schedule's stages per rank (the CSV
 * schedule: its file's; else its fewest). */
static ct_status resolve_shape(sched_args *a, const plugin *p) {
    const char *name = p->info.name;
    int min = schedule_api(p)->min_stages_per_rank;
    if (!a->stages && a->pp) {
        int spr = min;
        if (schedule_stages_per_rank(p, a->pp, a->microbatches, a->csv, &spr) != CT_OK) {
            fprintf(stderr, "ctitan schedule: %s\n", ct_last_error());
            return CT_ERR_INVALID;
        }
        a->stages = a->pp * spr;
    }
    if (!a->pp) {
        if (a->stages % min) {
            fprintf(stderr, "ctitan schedule: %s runs %d stages per rank; %d stages do not split evenly (give --pp)\n",
                    name, min, a->stages);
            return CT_ERR_INVALID;
        }
        a->pp = a->stages / min;
    }
    if (a->stages % a->pp) {
        fprintf(stderr, "ctitan schedule: %d stages do not split evenly over %d ranks\n", a->stages, a->pp);
        return CT_ERR_INVALID;
    }
    return CT_OK;
}

/* The options given, checked against the ones the schedule declares; then its getters read them. */
static ct_status apply_options(plugin *p, manifest *mf) {
    if (!p->info.options && mf->n_values) {
        fprintf(stderr, "ctitan schedule: command line: --%s: %s declares no options\n", mf->values[0].key,
                p->info.name);
        return CT_ERR_INVALID;
    }
    manifest_add_plugin_schema(mf, "parallelism", p->info.options);
    if (manifest_validate(mf) != CT_OK) {
        fprintf(stderr, "ctitan schedule: %s: %s\n", p->info.name, ct_last_error());
        return CT_ERR_INVALID;
    }
    p->mf = mf;
    return CT_OK;
}

ct_status cmd_schedule(int argc, char **argv) {
    sched_args a;
    manifest *mf = manifest_new();
    if (!mf) {
        fprintf(stderr, "ctitan schedule: out of memory\n");
        return CT_ERR_NOMEM;
    }
    ct_status rc = parse_args(argc, argv, &a, mf);
    if (rc || a.help) {
        if (!rc) fputs(usage, stdout);
        manifest_free(mf);
        return rc;
    }
    plugin *p = schedule_load(a.name, NULL);
    if (!p) {
        fprintf(stderr, "ctitan schedule: %s\n", ct_last_error());
        manifest_free(mf);
        return CT_ERR_INVALID;
    }
    sched_plan plan = {0};
    if ((rc = apply_options(p, mf)) || (rc = resolve_shape(&a, p))) goto out;
    if (schedule_actions(p, a.pp, a.stages / a.pp, a.microbatches, a.csv, &plan) != CT_OK) {
        fprintf(stderr, "ctitan schedule: %s\n", ct_last_error());
        rc = CT_ERR_INVALID;
        goto out;
    }
    ct_status bad = schedule_check(&plan, &a.costs);
    if (bad != CT_OK) {
        fprintf(stderr, "ctitan schedule: %s: %s\n", plan.name, ct_last_error());
        /* CT_ERR_INTERNAL: the schedule itself is wrong (exit 1); else lists the checker cannot read (bad input) */
        rc = bad == CT_ERR_INTERNAL ? CT_ERR_INTERNAL : CT_ERR_INVALID;
        goto out;
    }
    printf("%s: pp %d, %d stage%s (%d per rank), %d microbatch%s; F=%d B=%d I=%d W=%d time units\n", plan.name,
           plan.pp, plan.n_stages, plan.n_stages == 1 ? "" : "s", plan.stages_per_rank, plan.n_microbatches,
           plan.n_microbatches == 1 ? "" : "es", a.costs.f, a.costs.b, a.costs.i, a.costs.w);
    schedule_timeline(&plan, stdout);
    printf("bubble %.3f  peak activations %d  makespan %lld\n", plan.bubble, plan.peak_activations,
           (long long)plan.makespan);
    if ((a.svg && schedule_svg(&plan, a.svg) != CT_OK) ||
        (a.write_csv && schedule_write_csv(&plan, a.write_csv) != CT_OK)) {
        fprintf(stderr, "ctitan schedule: %s\n", ct_last_error());
        rc = CT_ERR_INVALID;
    }
out:
    schedule_plan_free(&plan);
    plugin_unload(p);
    manifest_free(mf);
    return rc;
}
