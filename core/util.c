/* util.c: small helpers shared by the core's files. */
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void ct_errf(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    /* an error is one line: text quoted from untrusted input (a JSON parser's excerpt) may hold
     * newlines or other control bytes */
    for (char *c = err; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = ' ';
}

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
