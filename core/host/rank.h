/* rank.h: a rank's side of `ctitan launch` (rank.c); the launcher is cmd/launch.c. The two speak
 * through the environment: CTITAN_LAUNCH_PID (the launcher's pid) and CTITAN_STATUS_DIR, where each
 * rank writes rank-N (its exit status) and pid-N (its pid, for signal forwarding). */
#ifndef CT_HOST_RANK_H
#define CT_HOST_RANK_H

#include "ctitan/abi.h"

/* Under `ctitan launch`: records this rank's exit status (main.c's, from the status) for the
 * launcher. */
void launch_record_status(int exit_status);
/* In a rank started by `ctitan launch`: registers its pid for the launcher's signal forwarding and
 * ends the rank when the launcher or its parent (mpirun) ends. No-op otherwise. */
void launch_rank_start(void);
/* Started by torchrun (WORLD_SIZE) or srun (SLURM_STEP_NUM_TASKS) with several processes but not
 * as an MPI job (each would be rank 0 of 1): CT_ERR_INVALID with one line saying how to launch; else
 * CT_OK. Call before the comm plugin joins (an MPI singleton sets MPI's variables). */
ct_status launch_check_world(void);

#endif
