/* util.c: small helpers shared by the core's files. */
#include "base/util.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int ct_write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

double ct_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int ct_mkdir_p(const char *path) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) && errno != EEXIST ? -1 : 0;
}

int ct_cli_opt(int argc, char **argv, int *i, const char *name, const char **val) {
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return 0;
    if (a[n] == '=') {
        *val = a + n + 1;
        return 1;
    }
    if (a[n] != 0) return 0;
    *val = *i + 1 < argc ? argv[++*i] : NULL;
    return 1;
}

int64_t ct_address_space_left(int64_t *limit) {
    struct rlimit rl;
    if (limit) *limit = -1;
    if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > INT64_MAX) return -1;
    if (limit) *limit = (int64_t)rl.rlim_cur;
    int64_t used = 0; /* VmSize: what the limit counts */
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmSize:", 7)) used = strtoll(line + 7, NULL, 10) * 1024;
    if (f) fclose(f);
    return (int64_t)rl.rlim_cur > used ? (int64_t)rl.rlim_cur - used : 0;
}

FILE *ct_fopen_nofollow(const char *path, const char *mode) {
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (mode[0] == 'a' ? O_APPEND : O_TRUNC);
    int fd = open(path, flags, 0644);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, mode);
    if (!f) {
        int e = errno;
        close(fd);
        errno = e;
    }
    return f;
}

const char *ct_open_strerror(int e) {
    /* O_NOFOLLOW reports a symlink as ELOOP, whose text ("too many levels") misleads */
    return e == ELOOP ? "it is a symbolic link (refusing to write through it)" : strerror(e);
}

int ct_require_dir(const char *path) {
    struct stat sb;
    if (stat(path, &sb)) return -1;
    if (!S_ISDIR(sb.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

void ct_utc_iso(char *out, size_t len) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    struct tm tm;
    gmtime_r(&t.tv_sec, &tm);
    char day[32];
    strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, len, "%s.%03ldZ", day, t.tv_nsec / 1000000);
}

/* ---- counter-based RNG: value i of stream `key` does not depend on any other draw ---- */
uint64_t rng_hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

double rng_uniform(uint64_t key, uint64_t i) {
    uint64_t r = ct_util_splitmix64(key ^ ct_util_splitmix64(i));
    return ((double)(r >> 11) + 0.5) * (1.0 / 9007199254740992.0); /* (0, 1) */
}

double rng_normal(uint64_t key, uint64_t i) {
    double u1 = rng_uniform(key, 2 * i), u2 = rng_uniform(key, 2 * i + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
