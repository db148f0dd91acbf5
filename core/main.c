/* main.c: the `ctitan` command line. */
#include "tools/cmd_convert.h"
#include "tools/cmd_schedule.h"
#include "tools/cmd_tokenize.h"
#include "engine/session.h"

#include <stdio.h>
#include <string.h>

static const char *usage =
    "usage: ctitan COMMAND [ARGS]   (ctitan COMMAND --help for each)\n"
    "commands:\n"
    "  train MANIFEST      train the model a YAML manifest names (torchtitan's config keys)\n"
    "  generate MANIFEST   sample text from the model a training run saved\n"
    "  plugins [FOLDER]    list loadable plugins: kind, name, ABI version\n"
    "  launch -n N CMD     run `ctitan CMD` on N ranks under mpirun (as root, oversubscribed)\n"
    "  tokenize            turn text or JSONL into a token shard\n"
    "  tokenizer           train / encode / decode with a BPE vocabulary (tiktoken format)\n"
    "  convert             --to hf | --from hf: a model (.ctt) to or from a Hugging Face Llama folder\n"
    "  schedule            check and draw a pipeline schedule (timeline, bubble, --svg)\n"
    "  help                this text\n"
    "  --version           the plugin ABI version this ctitan speaks\n";

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_BAD_INPUT : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("ctitan: plugin ABI %d.%d\n", CT_ABI_MAJOR, CT_ABI_MINOR);
        return 0;
    }
    const char *cmd = argv[1];
    int st;
    if (!strcmp(cmd, "train") || !strcmp(cmd, "generate")) {
        log_set_rank_from_env(); /* "[rank N]" from the start */
        launch_rank_start();     /* under `ctitan launch`: register with it, end with it */
    }
    if (!strcmp(cmd, "train")) st = cmd_train(argc - 2, argv + 2);
    else if (!strcmp(cmd, "generate")) st = cmd_generate(argc - 2, argv + 2);
    else goto other;
    launch_record_status(st); /* under `ctitan launch`: the job's status comes from its ranks */
    return st;
other:
    if (!strcmp(cmd, "plugins")) return cmd_plugins(argc - 2, argv + 2);
    if (!strcmp(cmd, "launch")) return cmd_launch(argc - 2, argv + 2);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "convert")) return cmd_convert(argc - 1, argv + 1);
    if (!strcmp(cmd, "schedule")) return cmd_schedule(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenizer")) return cmd_tokenizer(argc - 1, argv + 1);
    fprintf(stderr, "ctitan: unknown command '%s' (commands: train, generate, plugins, launch, tokenize, tokenizer, convert; see ctitan help)\n", cmd);
    return EXIT_BAD_INPUT;
}
