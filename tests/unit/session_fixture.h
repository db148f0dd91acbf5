/* session_fixture.h: opens a real session (plugins from the build) from a manifest written to a
 * temporary file, for tests that drive the runtime directly. */
#ifndef CT_TEST_SESSION_FIXTURE_H
#define CT_TEST_SESSION_FIXTURE_H

#include "engine/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Points the plugin search at $BUILD/plugins (default build/plugins). */
static inline void fixture_plugin_path(void) {
    static char path[4096];
    const char *build = getenv("BUILD");
    char cwd[2048];
    if (!getcwd(cwd, sizeof cwd)) cwd[0] = 0;
    snprintf(path, sizeof path, "%s/%s/plugins", cwd, build ? build : "build");
    setenv("CTITAN_PLUGIN_PATH", path, 1);
}

/* Writes yaml to a temporary manifest and opens a session with parameters and optimizer.
 * Returns 0 on success. */
static inline int fixture_open(session *s, const char *yaml) {
    fixture_plugin_path();
    char path[] = "/tmp/ctitan-test-XXXXXX.yaml";
    int fd = mkstemps(path, 5);
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "w");
    fputs(yaml, f);
    fclose(f);
    manifest *mf = manifest_load(path);
    unlink(path);
    if (!mf) {
        fprintf(stderr, "%s\n", ct_last_error());
        return -1;
    }
    manifest_add_core_schema(mf);
    int st = session_open(s, mf, 1, 1);
    if (st) session_close(s);
    return st;
}

#endif
