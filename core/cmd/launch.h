/* launch.h: `ctitan launch -n N COMMAND ...` (launch.c), the launcher's side; a rank's side is
 * host/rank.h. */
#ifndef CT_CMD_LAUNCH_H
#define CT_CMD_LAUNCH_H

#include "ctitan/abi.h"

/* With CT_OK the job ran to its end and *job_exit is its exit status: the first non-zero exit status
 * of a rank, else 0. Any other status is launch's own failure (bad usage, mpirun missing or failed, a
 * rank that ended without a status), *job_exit unset. */
ct_status cmd_launch(int argc, char **argv, int *job_exit);

#endif
