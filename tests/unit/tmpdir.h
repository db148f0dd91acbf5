/* tmpdir.h: one scratch folder per test binary, `dir`: made by the group setup (tmpdir_make), emptied
 * and removed by its teardown (tmpdir_remove). */
#ifndef CT_TEST_TMPDIR_H
#define CT_TEST_TMPDIR_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char dir[64];

static int tmpdir_make(const char *test) {
    snprintf(dir, sizeof dir, "/tmp/ctitan-test-%s-XXXXXX", test);
    return mkdtemp(dir) ? 0 : -1;
}

static void tmpdir_remove(void) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

#endif
