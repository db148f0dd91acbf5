/* launch.c: `ctitan launch -n N COMMAND ...`: runs N ranks of this ctitan under OpenMPI's mpirun
 * with the flags a small machine and a root account need. Multi-node jobs use mpirun or srun
 * directly (with a host file); nothing in ctitan assumes one machine. */
#include "session.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* mpirun runs with orte_abort_on_non_zero_status=0 so that when a rank dies the others live long
 * enough to hit their collective timeout and say which collective failed. mpirun's exit status
 * then no longer tells which rank failed (it is 0 when ranks exit non-zero on their own), so each
 * rank records its exit status in $CTITAN_STATUS_DIR and launch derives the job's status: the
 * first non-zero status of a rank, or 1 for a rank that left no status (it was killed). */
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
            _exit(EXIT_RUN_FAILED);
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

/* Launcher side: a stop signal for the job. mpirun would pass SIGTERM on with a SIGKILL one second
 * later (too soon for a checkpoint), so the launcher signals the ranks itself: SIGTERM and SIGINT as
 * they are, SIGHUP as SIGTERM (the terminal is gone: stop cleanly). With no rank registered yet,
 * mpirun gets it and ends the job its way. */
static volatile sig_atomic_t g_forward;

static void on_launch_signal(int sig) { g_forward = sig; }

static void forward_to_ranks(const char *dir, long n, pid_t mpirun, int sig) {
    int to = sig == SIGHUP ? SIGTERM : sig, sent = 0;
    for (long r = 0; r < n; r++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/pid-%ld", dir, r);
        FILE *f = fopen(path, "r");
        long pid = 0;
        if (!f) continue;
        if (fscanf(f, "%ld", &pid) == 1 && pid > 1 && kill((pid_t)pid, to) == 0) sent++;
        fclose(f);
    }
    if (!sent) kill(mpirun, to);
}

/* Waits for mpirun, forwarding stop signals meanwhile. */
static int wait_job(pid_t pid, const char *dir, long n, int *wst) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_launch_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    for (;;) {
        pid_t r = waitpid(pid, wst, WNOHANG);
        if (r == pid) return 0;
        if (r < 0 && errno != EINTR) return -1;
        if (g_forward) {
            int sig = g_forward;
            g_forward = 0;
            forward_to_ranks(dir, n, pid, sig);
        }
        struct timespec t = {0, 50 * 1000 * 1000}; /* a signal cuts the sleep short */
        nanosleep(&t, NULL);
    }
}

static int job_status(const char *dir, long n) {
    int worst = 0;
    for (long r = 0; r < n; r++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/rank-%ld", dir, r);
        FILE *f = fopen(path, "r");
        int st = 1;
        snprintf(path, sizeof path, "%s/pid-%ld", dir, r);
        unlink(path);
        snprintf(path, sizeof path, "%s/rank-%ld", dir, r);
        if (f) {
            if (fscanf(f, "%d", &st) != 1) st = 1;
            fclose(f);
            unlink(path);
        } else {
            fprintf(stderr, "ctitan: launch: rank %ld ended without a status (killed?)\n", r);
        }
        if (st && !worst) worst = st;
    }
    rmdir(dir);
    return worst;
}

static const char *launch_usage =
    "usage: ctitan launch -n N [--mpirun-arg ARG ...] COMMAND [ARGS...]\n"
    "  Runs `ctitan COMMAND ARGS` on N ranks: mpirun -n N --oversubscribe --bind-to none\n"
    "  --mca orte_abort_on_non_zero_status 0 (and --allow-run-as-root as root). A rank that dies leaves\n"
    "  the others to time out in their collective and say which one; the launcher exits with the\n"
    "  first non-zero status of a rank. With more ranks than cores, OpenMP threads wait passively.\n"
    "  SIGTERM, SIGINT and SIGHUP (as SIGTERM) are passed to every rank, which stops after its step and\n"
    "  saves a checkpoint; a second one ends them at once. mpirun runs in its own process group (a\n"
    "  Ctrl-C reaches it through the launcher) with --stdin none; when the launcher dies, so do the ranks.\n"
    "  example: ctitan launch -n 4 train configs/llama3_debug.yaml --parallelism.data_parallel_shard_degree=4\n";

int cmd_launch(int argc, char **argv) {
    long n = 0;
    int i = 0;
    const char *extra[32];
    int n_extra = 0;
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(launch_usage, stdout);
            return 0;
        } else if (!strcmp(argv[i], "-n") || !strcmp(argv[i], "-np")) {
            char *end;
            n = i + 1 < argc ? strtol(argv[++i], &end, 10) : 0;
            if (n < 1 || *end) {
                fprintf(stderr, "ctitan: launch: -n needs a positive number of ranks\n");
                return EXIT_BAD_INPUT;
            }
        } else if (!strcmp(argv[i], "--mpirun-arg") && i + 1 < argc && n_extra < 32) {
            extra[n_extra++] = argv[++i];
        } else {
            break;
        }
    }
    if (n < 1 || i >= argc) {
        fprintf(stderr, "ctitan: launch: expected -n N and a command (see ctitan launch --help)\n");
        return EXIT_BAD_INPUT;
    }
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        fprintf(stderr, "ctitan: launch: cannot find this executable\n");
        return EXIT_RUN_FAILED;
    }
    self[len] = 0;
    char nbuf[32];
    snprintf(nbuf, sizeof nbuf, "%ld", n);
    const char **av = calloc((size_t)(argc + n_extra + 16), sizeof(char *));
    if (!av) return EXIT_RUN_FAILED;
    int k = 0;
    av[k++] = "mpirun";
    av[k++] = "-n";
    av[k++] = nbuf;
    av[k++] = "--oversubscribe";
    av[k++] = "--bind-to";
    av[k++] = "none";
    av[k++] = "--mca";
    av[k++] = "orte_abort_on_non_zero_status";
    av[k++] = "0";
    av[k++] = "--stdin"; /* mpirun is in a background process group, where reading the terminal stops it */
    av[k++] = "none";
    if (geteuid() == 0) av[k++] = "--allow-run-as-root";
    for (int e = 0; e < n_extra; e++) av[k++] = extra[e];
    av[k++] = self;
    for (; i < argc; i++) av[k++] = argv[i];
    av[k] = NULL;
    if (n > sysconf(_SC_NPROCESSORS_ONLN)) setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    char dir[] = "/tmp/ctitan-launch-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "ctitan: launch: cannot create a status folder in /tmp\n");
        free(av);
        return EXIT_RUN_FAILED;
    }
    setenv("CTITAN_STATUS_DIR", dir, 1);
    char self_pid[32];
    snprintf(self_pid, sizeof self_pid, "%ld", (long)getpid());
    setenv("CTITAN_LAUNCH_PID", self_pid, 1);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        /* its own process group: a Ctrl-C reaches the launcher only, which forwards it to the ranks;
         * and mpirun (which ends the ranks on SIGTERM) ends with the launcher */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != (pid_t)atol(self_pid)) _exit(EXIT_RUN_FAILED); /* the launcher died already */
        execvp("mpirun", (char *const *)av);
        fprintf(stderr, "ctitan: launch: cannot run mpirun (install openmpi-bin: make deps)\n");
        _exit(127);
    }
    free(av);
    int wst = 0;
    if (pid < 0 || wait_job(pid, dir, n, &wst)) {
        fprintf(stderr, "ctitan: launch: cannot run mpirun\n");
        return EXIT_RUN_FAILED;
    }
    if (WIFEXITED(wst) && WEXITSTATUS(wst) == 127) {
        rmdir(dir);
        return EXIT_RUN_FAILED;
    }
    int st = job_status(dir, n);
    if (!st && !(WIFEXITED(wst) && WEXITSTATUS(wst) == 0)) st = EXIT_RUN_FAILED;
    return st;
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

int launch_check_world(void) {
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK") || getenv("PMI_SIZE")) return 0;
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
        return EXIT_BAD_INPUT;
    }
    if (slurm > 1) {
        fprintf(stderr, "ctitan: started by srun (SLURM_STEP_NUM_TASKS=%d, SLURM_PROCID=%s) but not as an MPI job, "
                        "so each task would train alone: launch with `srun --mpi=pmix ctitan train ...` (or `mpirun "
                        "-n %d ctitan train ...` inside the allocation)\n",
                slurm, getenv("SLURM_PROCID"), slurm);
        return EXIT_BAD_INPUT;
    }
    return 0;
}
