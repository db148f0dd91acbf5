/* runlock.c: one run per dump folder. A `.lock` file in job.dump_folder held with flock(2) for the
 * life of the run (rank 0 holds it for the job). The kernel drops the lock when the process ends,
 * however it ends (kill -9 included), so a stale `.lock` file never blocks: only a live holder
 * does. The file says who holds it, so a refused run can name the holder. */
#include "host/runlock.h"

#include "base/error.h"
#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

static int g_lock_fd = -1;

/* The holder's line ("pid 1234 on host (started ...)"), read from the lock file. */
static void read_holder(int fd, char *out, size_t len) {
    char buf[256];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) { /* the holder has locked it but not written yet */
        snprintf(out, len, "another process");
        return;
    }
    buf[n] = 0;
    buf[strcspn(buf, "\n")] = 0;
    snprintf(out, len, "%s", buf);
}

ct_status runlock_acquire(const char *dump, const char *run_id) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/.lock", dump) >= (int)sizeof path)
        return ct_fail(CT_ERR_INVALID, "%s: path too long", dump);
    /* no O_TRUNC: a refused run must not erase the holder's line */
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return ct_fail(CT_ERR_IO, "cannot open %s: %s", path, ct_open_strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        int e = errno;
        ct_status st = CT_ERR_IO;
        if (e == EWOULDBLOCK) {
            char who[256];
            read_holder(fd, who, sizeof who);
            st = ct_fail(CT_ERR_INVALID, "%s is in use by %s; use another folder or stop that run", dump, who);
        } else {
            ct_set_error("cannot lock %s: %s", path, strerror(e));
        }
        close(fd);
        return st;
    }
    char host[128] = "?", now[40], line[512];
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    ct_utc_iso(now, sizeof now);
    int n = snprintf(line, sizeof line, "pid %ld on %s (started %s, run %s)\n", (long)getpid(), host, now, run_id);
    if (ftruncate(fd, 0) || ct_write_all(fd, line, (size_t)n)) {
        ct_set_error("cannot write %s: %s", path, strerror(errno));
        close(fd);
        return CT_ERR_IO;
    }
    g_lock_fd = fd;
    return CT_OK;
}

void runlock_release(void) {
    if (g_lock_fd < 0) return;
    close(g_lock_fd); /* drops the lock; the file stays (removing it would race a new holder) */
    g_lock_fd = -1;
}
