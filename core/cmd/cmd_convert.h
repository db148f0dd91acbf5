/* cmd_convert.h: `ctitan convert`, between ctitan model files (.ctt) and Hugging Face Llama folders.
 *
 * Takes the command's own argv: argv[0] is the command name ("convert") and is skipped. Returns CT_OK
 * on success, CT_ERR_IO when writing the output fails, CT_ERR_INVALID on a usage error or bad input
 * (one line on stderr); `--help` prints the usage to stdout and returns CT_OK.
 */
#ifndef CTITAN_CMD_CONVERT_H
#define CTITAN_CMD_CONVERT_H

#include "ctitan/abi.h"

/* ctitan convert --to hf --input MODEL.ctt --output DIR [--dtype float32|bfloat16] [--n-heads H]
 *                [--n-kv-heads K] [--rope-theta X] [--norm-eps X] [--max-position-embeddings N]
 * ctitan convert --from hf --input DIR --output MODEL.ctt */
ct_status cmd_convert(int argc, char **argv);

#endif
