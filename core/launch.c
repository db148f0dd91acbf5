/* launch.c: `ctitan launch -n N COMMAND ...`: runs N ranks of this ctitan under OpenMPI's mpirun
 * with the flags a small machine and a root account need. Multi-node jobs use mpirun or srun
 * directly (with a host file); nothing in ctitan assumes one machine. */
#include "session.h"

#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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

static int job_status(const char *dir, long n) {
    int worst = 0;
    for (long r = 0; r < n; r++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/rank-%ld", dir, r);
        FILE *f = fopen(path, "r");
        int st = 1;
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
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execvp("mpirun", (char *const *)av);
        fprintf(stderr, "ctitan: launch: cannot run mpirun (install openmpi-bin: make deps)\n");
        _exit(127);
    }
    free(av);
    int wst = 0;
    signal(SIGINT, SIG_IGN); /* Ctrl-C reaches mpirun, which stops the ranks; we report after */
    if (pid < 0 || waitpid(pid, &wst, 0) < 0) {
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
