/* rank.c: a rank's side of `ctitan launch` (cmd/launch.c is the launcher's): the exit status each
 * rank records for the launcher, no rank outliving its launcher, and a torchrun or srun world that
 * is not an MPI job refused. */
#include "host/rank.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

/* mpirun runs with orte_abort_on_non_zero_status=0 so that when a rank dies the others live long
 * enough to hit their collective timeout and say which collective failed. mpirun's exit status
 * then no longer tells which rank failed (it is 0 when ranks exit non-zero on their own), so each
 * rank records its exit status in $CTITAN_STATUS_DIR and launch derives the job's status: the
 * first non-zero status of a rank; a rank that left no status (it was killed) fails the launch. */
void launch_record_status(int status) {
    const char *dir = getenv("CTITAN_STATUS_DIR"), *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (!dir || !rank) return;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/rank-%s", dir, rank);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "%d\n", status);
    fclose(f);
}

/* ---- no rank outlives its launcher ----
 * `ctitan launch` exports CTITAN_LAUNCH_PID; each rank it starts registers its pid in the status
 * folder (so the launcher can forward stop signals to it), asks the kernel for SIGKILL when its
 * parent (mpirun, or orted on another node) dies, and runs a watchdog thread that ends it within a
 * second of the launcher's end (covering a parent that died before the request). */
static pid_t g_launcher;

static void *launcher_watchdog(void *arg) {
    (void)arg;
    for (;;) {
        struct timespec t = {0, 500 * 1000 * 1000};
        nanosleep(&t, NULL);
        if (kill(g_launcher, 0) && errno == ESRCH) {
            fprintf(stderr, "ctitan: the launcher (pid %ld) is gone; this rank ends too\n", (long)g_launcher);
            fflush(stderr);
            _exit(1); /* the rank ends here, not through main.c: 1, a failure while running */
        }
    }
    return NULL;
}

void launch_rank_start(void) {
    const char *lp = getenv("CTITAN_LAUNCH_PID"), *dir = getenv("CTITAN_STATUS_DIR"),
               *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (!lp || !dir || !rank) return; /* not started by `ctitan launch` */
    g_launcher = (pid_t)atol(lp);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (g_launcher > 1) {
        pthread_t t;
        if (!pthread_create(&t, NULL, launcher_watchdog, NULL)) pthread_detach(t);
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/pid-%s", dir, rank);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "%ld\n", (long)getpid());
    fclose(f);
}

/* ---- a launcher's world against the MPI world ----
 * torchrun (RANK, WORLD_SIZE) and srun without an MPI plugin (SLURM_PROCID, SLURM_STEP_NUM_TASKS)
 * start N processes but no MPI job: each would join an MPI world of one and train on its own into
 * the same folder. A process an MPI launcher started (mpirun: OMPI_COMM_WORLD_SIZE; PMI or PMIx:
 * srun --mpi=pmix) has its world from MPI, and nothing else is compared. */
static int env_int(const char *name) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : 0;
}

ct_status launch_check_world(void) {
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK") || getenv("PMI_SIZE")) return CT_OK;
    int torch = env_int("WORLD_SIZE");
    /* a task of an srun step; a batch script also has SLURM_PROCID but no step, and runs one process */
    int slurm = getenv("SLURM_PROCID") && (getenv("SLURM_STEP_ID") || getenv("SLURM_STEPID"))
                    ? env_int("SLURM_STEP_NUM_TASKS")
                    : 0;
    if (torch > 1) {
        fprintf(stderr, "ctitan: started by torchrun (WORLD_SIZE=%d, RANK=%s) but not as an MPI job, so each process "
                        "would train alone: ctitan's ranks are MPI processes; launch with `ctitan launch -n %d train "
                        "...` or `mpirun -n %d ctitan train ...`\n",
                torch, getenv("RANK") ? getenv("RANK") : "?", torch, torch);
        return CT_ERR_INVALID;
    }
    if (slurm > 1) {
        fprintf(stderr, "ctitan: started by srun (SLURM_STEP_NUM_TASKS=%d, SLURM_PROCID=%s) but not as an MPI job, "
                        "so each task would train alone: launch with `srun --mpi=pmix ctitan train ...` (or `mpirun "
                        "-n %d ctitan train ...` inside the allocation)\n",
                slurm, getenv("SLURM_PROCID"), slurm);
        return CT_ERR_INVALID;
    }
    return CT_OK;
}
