/* main.c: the `ctitan` command line, and the one place where statuses become exit codes.
 *
 * Every command returns a ct_status after printing its one error line on stderr. Here, and only
 * here: CT_OK exits 0, CT_ERR_INVALID (bad input: manifest, options, plugins, data files, command
 * line usage) exits 2, any other status (a failure while running) exits 1. Two outcomes that are not
 * errors come through an out-parameter of their command instead (engine/session.h): a run of
 * `train` stopped cleanly by signal N exits 128 + N (the shell's convention), and `launch` exits with
 * its job's status, the first non-zero exit status of a rank. `--help` exits 0.
 * Three paths end the process before main returns and write the same numbers themselves: a second
 * stop signal (128 + N), a rank aborting its job after a failure and a rank whose launcher died (1). */
#include "cmd/cmd_config.h"
#include "cmd/cmd_convert.h"
#include "cmd/cmd_plan.h"
#include "cmd/cmd_plot.h"
#include "cmd/cmd_plugins.h"
#include "cmd/cmd_schedule.h"
#include "cmd/cmd_tokenize.h"
#include "cmd/launch.h"
#include "host/rank.h"
#include "train/train.h"
#include "engine/session.h"

#include <stdio.h>
#include <string.h>

static const char *usage =
    "usage: ctitan COMMAND [ARGS]   (ctitan COMMAND --help for each)\n"
    "commands:\n"
    "  train MANIFEST      train the model a YAML manifest (or torchtitan's TOML config) names\n"
    "  generate MANIFEST   sample text from the model a training run saved\n"
    "  plan MANIFEST       memory and tokens/s of a layout on given hardware; --search for the best layouts\n"
    "  plugins [PATH]      the plugins on the search path; PATH: every file of a folder, or one plugin in full\n"
    "  launch -n N CMD     run `ctitan CMD` on N ranks under mpirun (as root, oversubscribed)\n"
    "  tokenize            turn text or JSONL into a token shard\n"
    "  tokenizer           train / encode / decode with a BPE vocabulary (tiktoken format)\n"
    "  convert             --to hf | --from hf: a model (.ctt) to or from a Hugging Face folder, through its pack\n"
    "  schedule            check and draw a pipeline schedule (timeline, bubble, --svg)\n"
    "  plot RUN_DIR...     runs' loss (or any metric) against step or tokens, as SVG or PNG\n"
    "  config import FILE  torchtitan's TOML config as a ctitan YAML manifest\n"
    "  help                this text\n"
    "  --version           the plugin ABI version this ctitan speaks\n";

static int exit_code(ct_status st) { return st == CT_OK ? 0 : st == CT_ERR_INVALID ? 2 : 1; }

/* train, generate and plan (calibration runs on ranks): under `ctitan launch`, the launcher learns this rank's exit code. */
static int run_command(const char *cmd, int argc, char **argv) {
    int stop_signal = 0;
    log_set_rank_from_env(); /* "[rank N]" from the start */
    launch_rank_start();     /* under `ctitan launch`: register with it, end with it */
    ct_status st = !strcmp(cmd, "train")      ? cmd_train(argc, argv, &stop_signal)
                   : !strcmp(cmd, "generate") ? cmd_generate(argc, argv)
                                              : cmd_plan(argc, argv);
    int code = st == CT_OK && stop_signal ? 128 + stop_signal : exit_code(st);
    launch_record_status(code); /* the job's status comes from its ranks */
    return code;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return exit_code(argc < 2 ? CT_ERR_INVALID : CT_OK);
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("ctitan: plugin ABI %d.%d\n", CT_ABI_MAJOR, CT_ABI_MINOR);
        return 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "train") || !strcmp(cmd, "generate") || !strcmp(cmd, "plan")) return run_command(cmd, argc - 2, argv + 2);
    if (!strcmp(cmd, "launch")) {
        int job_exit = 0;
        ct_status st = cmd_launch(argc - 2, argv + 2, &job_exit);
        return st == CT_OK ? job_exit : exit_code(st);
    }
    if (!strcmp(cmd, "plugins")) return exit_code(cmd_plugins(argc - 2, argv + 2));
    if (!strcmp(cmd, "tokenize")) return exit_code(cmd_tokenize(argc - 1, argv + 1));
    if (!strcmp(cmd, "convert")) return exit_code(cmd_convert(argc - 1, argv + 1));
    if (!strcmp(cmd, "schedule")) return exit_code(cmd_schedule(argc - 1, argv + 1));
    if (!strcmp(cmd, "plot")) return exit_code(cmd_plot(argc - 1, argv + 1));
    if (!strcmp(cmd, "config")) return exit_code(cmd_config(argc - 1, argv + 1));
    if (!strcmp(cmd, "tokenizer")) return exit_code(cmd_tokenizer(argc - 1, argv + 1));
    fprintf(stderr, "ctitan: unknown command '%s' (commands: train, generate, plan, plugins, launch, tokenize, tokenizer, convert, schedule, plot; see ctitan help)\n", cmd);
    return exit_code(CT_ERR_INVALID);
}
