/* cmd_plan.c: `ctitan plan`, the planner's command: options, then manifest -> planner -> hardware ->
 * evaluation or search -> text, JSON or a manifest. */
#include "cmd/cmd_plan.h"

#include "checkpoint/checkpoint.h"

#include "engine/session.h"
#include "base/util.h"
#include "plan/calibrate.h"
#include "plan/output.h"
#include "plan/plan.h"
#include "plan/search.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ERRLEN 2048

static const char usage[] =
    "usage: ctitan plan MANIFEST [--section.key=value ...] --hardware NAME|FILE --gpus N [--gpus-per-node G]\n"
    "                   [--search [--top K]] [--json] [--write-manifest FILE]\n"
    "       ctitan plan MANIFEST [--section.key=value ...] --calibrate --output PROFILE.yaml\n"
    "\n"
    "Plans the manifest's layout on N GPUs of the given hardware: memory per GPU (the largest rank) by\n"
    "category and whether it fits with the profile's headroom, step time by part (GEMMs, attention,\n"
    "memory-bound work, optimizer, recomputation, each collective exposed or hidden, the pipeline\n"
    "bubble), tokens/s per GPU and MFU against the bf16 peak. Nothing is allocated and no rank is started.\n"
    "\n"
    "  MANIFEST                 a training manifest (the one `ctitan train` takes)\n"
    "  --section.key=value      override a manifest key, as for `ctitan train` (also --section.key value)\n"
    "  --hardware NAME|FILE     a shipped profile by name (configs/hardware/NAME.yaml) or a profile's path;\n"
    "                           a --calibrate output is one\n"
    "  --gpus N                 GPUs in all (parallelism.data_parallel_shard_degree -1 takes what is left)\n"
    "  --gpus-per-node G        GPUs per node (default: the profile's); TP stays within a node, and\n"
    "                           collectives over more GPUs than a node use the inter-node figures\n"
    "  --search                 instead of the manifest's layout, search the layouts that multiply to N:\n"
    "                           dp_replicate x dp_shard x cp x tp x pp (tp up to a node and dividing the\n"
    "                           heads, pp up to the layers), schedule (1F1B, Interleaved1F1B, ZBVZeroBubble,\n"
    "                           GPipe), pp microbatch size, local batch for the manifest's global batch\n"
    "                           (training.global_batch_size, else local_batch_size x the manifest's data-\n"
    "                           parallel degree), AC mode, compile and the plugins' search knobs (float8,\n"
    "                           async TP, cp's rotate method, a third party's own); drop those that do\n"
    "                           not fit, rank by tokens/s per GPU, print the best with their breakdowns,\n"
    "                           the largest microbatch that fits the winner, the scaling efficiency against\n"
    "                           the smallest count N/2^k that fits, and the guide's rule for this model's\n"
    "                           size beside what the search picked\n"
    "  --top K                  how many layouts --search prints (default 5)\n"
    "  --json                   print the plan as JSON instead of text (schema: docs/planning.md)\n"
    "  --write-manifest FILE    write the manifest with the plan's layout (the winner with --search) set:\n"
    "                           parallelism.*, training.local_batch_size and global_batch_size,\n"
    "                           activation_checkpoint.*, compile.enable, the plugins' search knobs; `ctitan\n"
    "                           train FILE` runs it unchanged\n"
    "  --calibrate              measure this machine through the manifest's own device and comm plugins\n"
    "                           (under `ctitan launch -n N` also the collectives) and write a profile\n"
    "  --output PROFILE.yaml    where --calibrate writes the profile\n"
    "  --help                   this text\n"
    "\n"
    "Exit status: 0 a plan was printed (whether or not it fits); 2 bad usage or input (the manifest, an\n"
    "override, the hardware profile, a layout the plugins refuse); 1 a failure while running (writing\n"
    "an output, a measurement; --write-manifest when no layout fits).\n";

typedef struct plan_args {
    const char *hardware, *write_manifest, *output;
    int gpus, gpus_per_node, top, search, json, calibrate, help;
    int top_given;
    /* what is left for session_parse: the manifest and its overrides */
    char **rest;
    int n_rest;
} plan_args;

static ct_status usage_error(const char *msg, const char *arg) {
    fprintf(stderr, "ctitan plan: %s%s%s (see ctitan plan --help)\n", msg, arg ? " " : "", arg ? arg : "");
    return CT_ERR_INVALID;
}

static int parse_count(const char *s, int *out) {
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < 1 || v > 1000000) return -1;
    *out = (int)v;
    return 0;
}

/* The planner's own options; everything else (the manifest, --section.key=value) goes to rest for
 * session_parse, as `ctitan train` reads it. train's own flags are refused here rather than ignored. */
static ct_status parse_args(int argc, char **argv, plan_args *a) {
    for (int i = 0; i < argc; i++) {
        const char *v = NULL, *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            a->help = 1;
            return CT_OK;
        }
        if (ct_cli_opt(argc, argv, &i, "--hardware", &v)) {
            if (!v || !*v) return usage_error("--hardware needs a profile name or file", NULL);
            a->hardware = v;
        } else if (ct_cli_opt(argc, argv, &i, "--gpus", &v)) {
            if (parse_count(v, &a->gpus)) return usage_error("--gpus needs a number of GPUs from 1 to 1000000, got", v ? v : "nothing");
        } else if (ct_cli_opt(argc, argv, &i, "--gpus-per-node", &v)) {
            if (parse_count(v, &a->gpus_per_node))
                return usage_error("--gpus-per-node needs a number from 1 to 1000000, got", v ? v : "nothing");
        } else if (ct_cli_opt(argc, argv, &i, "--top", &v)) {
            if (parse_count(v, &a->top)) return usage_error("--top needs a number of layouts >= 1, got", v ? v : "nothing");
            a->top_given = 1;
        } else if (ct_cli_opt(argc, argv, &i, "--write-manifest", &v)) {
            if (!v || !*v) return usage_error("--write-manifest needs a file", NULL);
            a->write_manifest = v;
        } else if (ct_cli_opt(argc, argv, &i, "--output", &v)) {
            if (!v || !*v) return usage_error("--output needs a file", NULL);
            a->output = v;
        } else if (!strcmp(arg, "--search")) a->search = 1;
        else if (!strcmp(arg, "--json")) a->json = 1;
        else if (!strcmp(arg, "--calibrate")) a->calibrate = 1;
        else if (!strcmp(arg, "--dry-run") || !strcmp(arg, "--dry_run") || !strcmp(arg, "--print-config") ||
                 !strcmp(arg, "--print_config") || !strcmp(arg, "--checkpoint") || !strncmp(arg, "--checkpoint=", 13) ||
                 !strcmp(arg, "--prompt") || !strncmp(arg, "--prompt=", 9))
            return usage_error("not an option of ctitan plan:", arg);
        else if (!strcmp(arg, "-")) return usage_error("unexpected argument", arg);
        else {
            a->rest[a->n_rest++] = argv[i];
            /* an override's value given separately travels with it; a bare boolean (--checkpoint.enable)
             * takes none, and session_parse tells which */
            if (!strncmp(arg, "--", 2) && !strchr(arg, '=') && i + 1 < argc && strncmp(argv[i + 1], "--", 2))
                a->rest[a->n_rest++] = argv[++i];
        }
    }
    if (a->calibrate) {
        if (!a->output) return usage_error("--calibrate needs --output PROFILE.yaml", NULL);
        if (a->search || a->json || a->write_manifest || a->hardware || a->gpus || a->top_given)
            return usage_error("--calibrate takes only the manifest, overrides and --output", NULL);
        return CT_OK;
    }
    if (a->output) return usage_error("--output goes with --calibrate (a plan prints to stdout)", NULL);
    if (!a->hardware) return usage_error("--hardware NAME|FILE is required (a profile: --help lists the shipped ones)", NULL);
    if (!a->gpus) return usage_error("--gpus N is required", NULL);
    if (a->top_given && !a->search) return usage_error("--top goes with --search", NULL);
    return CT_OK;
}

/* --write-manifest into a folder that does not exist is bad input, said before any work. */
static ct_status check_out_folder(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    struct stat sb;
    if (!slash) return CT_OK;
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path) + (slash == path), path);
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "ctitan plan: --write-manifest %s: the folder %s does not exist\n", path, dir);
        return CT_ERR_INVALID;
    }
    return CT_OK;
}

static ct_status calibrate(manifest *mf, const char *out) {
    ct_status st = plan_calibrate(mf, out);
    if (st == CT_OK) return CT_OK;
    if (ct_last_error()[0]) fprintf(stderr, "ctitan plan: %s\n", ct_last_error()); /* none: printed already */
    return st;
}

static void help_print(void) {
    char names[1024];
    fputs(usage, stdout);
    hw_profile_list(names, sizeof names);
    printf("\nshipped hardware profiles: %s\n", names);
}

ct_status cmd_plan(int argc, char **argv) {
    plan_args a = {0};
    a.top = 5;
    a.rest = calloc((size_t)argc + 1, sizeof *a.rest);
    if (!a.rest) {
        fprintf(stderr, "ctitan plan: out of memory\n");
        return CT_ERR_NOMEM;
    }
    ct_status st = parse_args(argc, argv, &a);
    if (st || a.help) {
        if (!st) help_print();
        free(a.rest);
        return st;
    }
    if (a.write_manifest && (st = check_out_folder(a.write_manifest))) {
        free(a.rest);
        return st;
    }
    run_args ra = {0};
    manifest *mf = session_parse(a.n_rest, a.rest, &ra, usage, &st);
    free(a.rest);
    if (!mf) return st;
    if ((st = mdesc_from_checkpoint(mf)) != CT_OK) { /* model.flavor: from_checkpoint, as a run takes it */
        manifest_free(mf);
        return st;
    }
    if (a.calibrate) {
        st = calibrate(mf, a.output);
        manifest_free(mf);
        return st;
    }

    hw_profile hw;
    plan_ctx *ctx = NULL;
    plan_result *res = NULL, one;
    int n = 0;
    plan_search_stats stats;
    plan_model_sizes sizes;
    int have_sizes = 0;
    memset(&hw, 0, sizeof hw);
    if (hw_profile_load(a.hardware, &hw) != CT_OK) {
        fprintf(stderr, "ctitan plan: %s\n", ct_last_error());
        manifest_free(mf);
        return CT_ERR_INVALID;
    }
    if (a.gpus_per_node) hw.gpus_per_node = a.gpus_per_node;
    if (plan_open(&ctx, mf) != CT_OK) {
        const char *err = ct_last_error();
        if (err[0] && !strstr(err, "(see above)")) fprintf(stderr, "ctitan plan: %s\n", err);
        st = CT_ERR_INVALID;
        goto out;
    }
    if (a.search) {
        plan_search_opts o = {a.gpus, hw.gpus_per_node, a.top, 1, 1, 1, 1, 1};
        if (plan_search_ex(ctx, &o, &hw, &res, &n, &stats) != CT_OK) {
            fprintf(stderr, "ctitan plan: %s\n", ct_last_error());
            st = CT_ERR_INVALID;
            goto out;
        }
        sizes = stats.model, have_sizes = 1;
    } else {
        plan_layout l;
        memset(&one, 0, sizeof one);
        if (plan_layout_from_manifest(ctx, a.gpus, &l) != CT_OK) {
            fprintf(stderr, "ctitan plan: %s\n", ct_last_error());
            st = CT_ERR_INVALID;
            goto out;
        }
        /* global_batch_size -1: one microbatch per data-parallel rank, as train reads it */
        if (l.global_batch <= 0) l.global_batch = l.local_batch * l.dp_replicate * l.dp_shard;
        if (plan_eval(ctx, &l, &hw, &one) != CT_OK) {
            fprintf(stderr, "ctitan plan: %s\n", ct_last_error());
            st = CT_ERR_INVALID;
            goto out;
        }
        one.layout = l;
        res = &one, n = 1;
        plan_model_sizes_get(ctx, &sizes);
        have_sizes = 1;
    }
    plan_report rep = {mf->path, &hw, a.gpus, hw.gpus_per_node, have_sizes ? &sizes : NULL, res, n,
                       a.search ? &stats : NULL};
    if (a.json) {
        if (plan_print_json(&rep, stdout) != CT_OK) {
            fprintf(stderr, "ctitan plan: %s\n", ct_last_error());
            st = CT_ERR_IO;
            goto out;
        }
    } else {
        plan_report_text(&rep, stdout);
    }
    if (fflush(stdout)) {
        fprintf(stderr, "ctitan plan: writing the plan failed: %s\n", strerror(errno));
        st = CT_ERR_IO;
        goto out;
    }
    if (a.write_manifest) {
        if (!n || (a.search && !res[0].fits)) {
            fprintf(stderr, "ctitan plan: --write-manifest %s: no layout fits on %d GPUs of %s; nothing written\n",
                    a.write_manifest, a.gpus, hw.name);
            st = CT_ERR_INTERNAL;
            goto out;
        }
        if (plan_write_manifest(mf, &res[0].layout, a.write_manifest) != CT_OK) {
            fprintf(stderr, "ctitan plan: %s\n", ct_last_error());
            st = CT_ERR_IO;
            goto out;
        }
        if (!a.json) printf("wrote %s\n", a.write_manifest);
    }
out:
    if (res != &one) free(res);
    plan_close(ctx);
    hw_profile_free(&hw);
    manifest_free(mf);
    return st;
}
