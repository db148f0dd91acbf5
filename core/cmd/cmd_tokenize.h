/* cmd_tokenize.h: the `ctitan tokenize` and `ctitan tokenizer` commands.
 *
 * Both take the command's own argv: argv[0] is the command name ("tokenize" / "tokenizer") and is
 * skipped. They return CT_OK on success, CT_ERR_INVALID on a usage error or bad input (a missing or
 * corrupt input file, invalid JSON, a missing field, a corrupt shard), another status on a failure
 * (CT_ERR_IO: the tokenizer cannot be read, a write fails; one line on stderr either way); `--help`
 * prints the usage to stdout and returns CT_OK.
 */
#ifndef CTITAN_CMD_TOKENIZE_H
#define CTITAN_CMD_TOKENIZE_H

#include "ctitan/abi.h"

/* ctitan tokenize --tokenizer FILE --input FILE|- [--input FILE ...] --output SHARD
 *                 [--format text|jsonl] [--field NAME] [--skip-missing] [--split-on LINE]
 *                 [--allow-special] [--quiet] [--progress SECONDS]
 * ctitan tokenize --check SHARD [--check SHARD ...] */
ct_status cmd_tokenize(int argc, char **argv);

/* ctitan tokenizer train  --input FILE [...] --vocab-size N --output FILE [--format F] [--split-on LINE]
 * ctitan tokenizer encode --tokenizer FILE --text STR [--allow-special]
 * ctitan tokenizer decode --tokenizer FILE ID... */
ct_status cmd_tokenizer(int argc, char **argv);

#endif
