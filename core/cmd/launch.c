/* launch.c: `ctitan launch -n N COMMAND ...`: runs N ranks of this ctitan under OpenMPI's mpirun
 * with the flags a small machine and a root account need. Multi-node jobs use mpirun or srun
 * directly (with a host file); nothing in ctitan assumes one machine. */
#include "cmd/launch.h"

#include "base/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

/* The job's exit status from its ranks' records: the first non-zero one in rank order, 0 when all
 * are 0, or -1 when the first rank that did not end with 0 left no status (it was killed). */
static int job_status(const char *dir, long n) {
    int worst = 0;
    for (long r = 0; r < n; r++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/rank-%ld", dir, r);
        FILE *f = fopen(path, "r");
        int st = -1;
        snprintf(path, sizeof path, "%s/pid-%ld", dir, r);
        unlink(path);
        snprintf(path, sizeof path, "%s/rank-%ld", dir, r);
        if (f) {
            if (fscanf(f, "%d", &st) != 1) st = -1;
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

/* ---- each error once ----
 * Every rank prints its errors with "[rank N] " in front, and a bad manifest or a failed collective
 * is seen by every rank: the job's stderr would say it N times. mpirun's stderr comes through a pipe
 * to a thread here, and a rank's line whose text (after the prefix) another rank printed first is
 * dropped: the first rank to say it speaks for all. Other lines pass unchanged as soon as they end
 * (a partial line after 100 ms). relay_start before the fork, relay_child in the child,
 * relay_finish after mpirun has exited. */
#define RELAY_SEEN_MAX 4096 /* distinct texts remembered; past that, lines pass unchecked */

typedef struct relay_seen {
    char *text;
    long rank;
} relay_seen;

typedef struct stderr_relay {
    int fd[2]; /* the pipe: mpirun writes fd[1], the thread reads fd[0] */
    pthread_t thread;
    int started;
    volatile sig_atomic_t stop; /* mpirun has exited: drain what is there and end */
    char line[65536];
    size_t len;
    int mid_line; /* part of this line went out already: pass the rest through */
    relay_seen seen[RELAY_SEEN_MAX];
    int n_seen;
} stderr_relay;

/* "[rank N] text": N, and *text after the prefix; -1 for any other line. */
static long relay_rank(const char *s, size_t n, size_t *text) {
    if (n < 9 || memcmp(s, "[rank ", 6)) return -1;
    size_t i = 6;
    long r = 0;
    for (; i < n && s[i] >= '0' && s[i] <= '9' && r < 1000000000; i++) r = r * 10 + (s[i] - '0');
    if (i == 6 || i + 1 >= n || s[i] != ']' || s[i + 1] != ' ') return -1;
    *text = i + 2;
    return r;
}

/* Whether another rank printed this text first (and remembers it when new). */
static int relay_repeat(stderr_relay *r, long rank, const char *text, size_t n) {
    for (int i = 0; i < r->n_seen; i++)
        if (strlen(r->seen[i].text) == n && !memcmp(r->seen[i].text, text, n)) return r->seen[i].rank != rank;
    if (r->n_seen < RELAY_SEEN_MAX && (r->seen[r->n_seen].text = strndup(text, n))) r->seen[r->n_seen++].rank = rank;
    return 0;
}

/* One line (whole: with its newline) out to our stderr, unless another rank said it first. */
static void relay_line(stderr_relay *r, const char *s, size_t n, int whole) {
    size_t text = 0;
    long rank = r->mid_line ? -1 : relay_rank(s, n, &text);
    if (!(whole && rank >= 0 && relay_repeat(r, rank, s + text, n - text))) ct_write_all(2, s, n);
    r->mid_line = !whole;
}

static void *relay_main(void *arg) {
    stderr_relay *r = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals are the launcher's main thread's */
    for (;;) {
        struct pollfd p = {r->fd[0], POLLIN, 0};
        int ready = poll(&p, 1, 100);
        if (ready < 0 && errno != EINTR) break;
        if (ready <= 0) {
            if (r->len) relay_line(r, r->line, r->len, 0); /* a partial line waits no longer */
            r->len = 0;
            if (r->stop) break;
            continue;
        }
        ssize_t got = read(r->fd[0], r->line + r->len, sizeof r->line - r->len);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        size_t start = 0, end = r->len + (size_t)got;
        for (size_t i = r->len; i < end; i++)
            if (r->line[i] == '\n') {
                relay_line(r, r->line + start, i + 1 - start, 1);
                start = i + 1;
            }
        r->len = end - start;
        memmove(r->line, r->line + start, r->len);
        if (r->len == sizeof r->line) { /* a line longer than the buffer: out in pieces */
            relay_line(r, r->line, r->len, 0);
            r->len = 0;
        }
    }
    if (r->len) relay_line(r, r->line, r->len, 0);
    return NULL;
}

/* 0, or -1 when there is no pipe (then mpirun writes to our stderr directly). */
static int relay_start(stderr_relay *r) {
    memset(r, 0, sizeof *r);
    r->fd[0] = r->fd[1] = -1;
    if (pipe2(r->fd, O_CLOEXEC)) return -1;
    if (pthread_create(&r->thread, NULL, relay_main, r)) {
        close(r->fd[0]);
        close(r->fd[1]);
        r->fd[0] = r->fd[1] = -1;
        return -1;
    }
    r->started = 1;
    return 0;
}

/* In the forked child, before exec: stderr is the pipe. */
static void relay_child(const stderr_relay *r) {
    if (r->started) dup2(r->fd[1], 2);
}

/* After the fork in the parent: only the children hold the write end now. */
static void relay_parent(stderr_relay *r) {
    if (r->started) close(r->fd[1]);
}

/* After mpirun exited: the thread ends at end of file, or, when something it left behind still holds
 * the pipe, at the next quiet 100 ms. */
static void relay_finish(stderr_relay *r) {
    if (!r->started) return;
    r->stop = 1;
    pthread_join(r->thread, NULL);
    close(r->fd[0]);
    for (int i = 0; i < r->n_seen; i++) free(r->seen[i].text);
    r->started = 0;
}

static const char *launch_usage =
    "usage: ctitan launch -n N [--mpirun-arg ARG ...] COMMAND [ARGS...]\n"
    "  Runs `ctitan COMMAND ARGS` on N ranks: mpirun -n N --oversubscribe --bind-to none\n"
    "  --mca orte_abort_on_non_zero_status 0 (and --allow-run-as-root as root). A rank that dies leaves\n"
    "  the others to time out in their collective and say which one; the launcher exits with the\n"
    "  first non-zero status of a rank. With more ranks than cores, OpenMP threads wait passively.\n"
    "  Every rank's stderr lines carry [rank N]; a line several ranks print comes out once.\n"
    "  SIGTERM, SIGINT and SIGHUP (as SIGTERM) are passed to every rank, which stops after its step and\n"
    "  saves a checkpoint; a second one ends them at once. mpirun runs in its own process group (a\n"
    "  Ctrl-C reaches it through the launcher) with --stdin none; when the launcher dies, so do the ranks.\n"
    "  example: ctitan launch -n 4 train configs/llama3_debug.yaml --parallelism.data_parallel_shard_degree=4\n";

/* What `ctitan launch` was asked: the ranks, mpirun's extra arguments, where the command starts. */
typedef struct launch_args {
    long n;
    const char *extra[32]; /* --mpirun-arg, in order */
    int n_extra;
    int cmd;  /* argv index of COMMAND */
    int help; /* --help was printed */
} launch_args;

/* CT_OK (a->help when the usage was printed) or CT_ERR_INVALID after an error line. */
static ct_status launch_args_parse(int argc, char **argv, launch_args *a) {
    memset(a, 0, sizeof *a);
    int i = 0;
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(launch_usage, stdout);
            a->help = 1;
            return CT_OK;
        } else if (!strcmp(argv[i], "-n") || !strcmp(argv[i], "-np")) {
            char *end;
            a->n = i + 1 < argc ? strtol(argv[++i], &end, 10) : 0;
            if (a->n < 1 || *end) {
                fprintf(stderr, "ctitan: launch: -n needs a positive number of ranks\n");
                return CT_ERR_INVALID;
            }
        } else if (!strcmp(argv[i], "--mpirun-arg") && i + 1 < argc && a->n_extra < 32) {
            a->extra[a->n_extra++] = argv[++i];
        } else {
            break;
        }
    }
    if (a->n < 1 || i >= argc) {
        fprintf(stderr, "ctitan: launch: expected -n N and a command (see ctitan launch --help)\n");
        return CT_ERR_INVALID;
    }
    a->cmd = i;
    return CT_OK;
}

/* mpirun's argument vector (NULL-terminated; the caller frees the array): its options, then this
 * executable (self) with the command and its arguments. nbuf holds the rank count as text. */
static const char **mpirun_argv(const launch_args *a, int argc, char **argv, const char *self, const char *nbuf) {
    const char **av = calloc((size_t)(argc + a->n_extra + 16), sizeof(char *));
    if (!av) return NULL;
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
    for (int e = 0; e < a->n_extra; e++) av[k++] = a->extra[e];
    av[k++] = self;
    for (int i = a->cmd; i < argc; i++) av[k++] = argv[i];
    av[k] = NULL;
    return av;
}

/* Runs mpirun (av, freed here) with stderr relayed and stop signals forwarded. CT_OK with *job_exit
 * the job's exit status (the first non-zero status of a rank; dir holds their records), or a status
 * when the launch itself failed: mpirun could not run or failed with every rank at 0, or a rank
 * left no status. */
static ct_status mpirun_run(const char **av, const char *dir, long n, const char *self_pid, int *job_exit) {
    fflush(stdout);
    static stderr_relay relay; /* 64 KiB line buffer and the texts seen: not on the stack */
    relay_start(&relay);
    pid_t pid = fork();
    if (pid == 0) {
        relay_child(&relay);
        /* its own process group: a Ctrl-C reaches the launcher only, which forwards it to the ranks;
         * and mpirun (which ends the ranks on SIGTERM) ends with the launcher */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != (pid_t)atol(self_pid)) _exit(1); /* the launcher died already: nobody reads this */
        execvp("mpirun", (char *const *)av);
        fprintf(stderr, "ctitan: launch: cannot run mpirun (install openmpi-bin: make deps)\n");
        _exit(127); /* to the parent below: the shell's "command not found" */
    }
    free(av);
    relay_parent(&relay);
    int wst = 0;
    int waited = pid < 0 ? -1 : wait_job(pid, dir, n, &wst); /* forwards stop signals to the ranks */
    relay_finish(&relay);
    if (waited) {
        fprintf(stderr, "ctitan: launch: cannot run mpirun\n");
        return CT_ERR_INTERNAL;
    }
    if (WIFEXITED(wst) && WEXITSTATUS(wst) == 127) {
        rmdir(dir);
        return CT_ERR_IO;
    }
    int st = job_status(dir, n);
    if (st < 0) return CT_ERR_INTERNAL; /* a rank killed: said so above */
    if (!st && !(WIFEXITED(wst) && WEXITSTATUS(wst) == 0)) return CT_ERR_INTERNAL; /* mpirun said why */
    *job_exit = st;
    return CT_OK;
}

ct_status cmd_launch(int argc, char **argv, int *job_exit) {
    launch_args a;
    *job_exit = 0;
    ct_status st = launch_args_parse(argc, argv, &a);
    if (st || a.help) return st;
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        fprintf(stderr, "ctitan: launch: cannot find this executable\n");
        return CT_ERR_IO;
    }
    self[len] = 0;
    char nbuf[32];
    snprintf(nbuf, sizeof nbuf, "%ld", a.n);
    const char **av = mpirun_argv(&a, argc, argv, self, nbuf);
    if (!av) return CT_ERR_NOMEM;
    if (a.n > sysconf(_SC_NPROCESSORS_ONLN)) setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    char dir[] = "/tmp/ctitan-launch-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "ctitan: launch: cannot create a status folder in /tmp\n");
        free(av);
        return CT_ERR_IO;
    }
    setenv("CTITAN_STATUS_DIR", dir, 1);
    char self_pid[32];
    snprintf(self_pid, sizeof self_pid, "%ld", (long)getpid());
    setenv("CTITAN_LAUNCH_PID", self_pid, 1);
    return mpirun_run(av, dir, a.n, self_pid, job_exit);
}

