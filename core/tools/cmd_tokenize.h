/* cmd_tokenize.h: the `ctitan tokenize` and `ctitan tokenizer` commands.
 *
 * Both take the command's own argv: argv[0] is the command name ("tokenize" / "tokenizer") and is
 * skipped. They return 0 on success, 1 on a failure (one line on stderr), 2 on a usage error (one line
 * on stderr); `--help` prints the usage to stdout and returns 0.
 */
#ifndef CTITAN_CMD_TOKENIZE_H
#define CTITAN_CMD_TOKENIZE_H

/* ctitan tokenize --tokenizer FILE --input FILE [--input FILE ...] --output SHARD
 *                 [--format text|jsonl] [--split-on LINE] [--allow-special] */
int cmd_tokenize(int argc, char **argv);

/* ctitan tokenizer train  --input FILE [...] --vocab-size N --output FILE [--format F] [--split-on LINE]
 * ctitan tokenizer encode --tokenizer FILE --text STR [--allow-special]
 * ctitan tokenizer decode --tokenizer FILE ID... */
int cmd_tokenizer(int argc, char **argv);

#endif
