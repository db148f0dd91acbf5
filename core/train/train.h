/* train.h: `ctitan train` and `ctitan generate` (train.c): the training loop with its datasets,
 * validation, metrics, checkpoints and profiling, and sampling from a saved model. */
#ifndef CT_TRAIN_TRAIN_H
#define CT_TRAIN_TRAIN_H

#include "ctitan/abi.h"

/* The commands take the arguments after their name; `--help` prints the usage and returns CT_OK.
 * cmd_train: *stop_signal is N (SIGTERM, SIGINT) when a stop signal ended the run cleanly after a
 * step (checkpoint saved when checkpoints are on), with CT_OK; else 0 (main.c exits 128 + N: an
 * outcome that is not an error reaches the exit code through the out-parameter, never the status). */
ct_status cmd_train(int argc, char **argv, int *stop_signal);
ct_status cmd_generate(int argc, char **argv);

#endif
