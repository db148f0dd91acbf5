/* manifest_fixture.h: manifests for unit tests, the core's schema added: from a YAML text (written to a
 * temporary file and loaded as a manifest is; a refused text fails the test with its error), or from
 * "key=value" overrides on an empty manifest (NULL-terminated). Neither validates. */
#ifndef CT_TEST_MANIFEST_FIXTURE_H
#define CT_TEST_MANIFEST_FIXTURE_H

#include "base/error.h"
#include "config/manifest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Writes yaml into a new temporary file whose name it leaves in path; the caller unlinks it. */
#define FIXTURE_PATH_LEN sizeof "/tmp/ctitan-cfg-XXXXXX.yaml"
static inline void fixture_write(const char *yaml, char path[FIXTURE_PATH_LEN]) {
    memcpy(path, "/tmp/ctitan-cfg-XXXXXX.yaml", FIXTURE_PATH_LEN);
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, yaml, strlen(yaml)), (int)strlen(yaml));
    close(fd);
}

static inline manifest *fixture_yaml(const char *yaml) {
    char path[FIXTURE_PATH_LEN];
    fixture_write(yaml, path);
    manifest *m = manifest_load(path);
    unlink(path);
    if (!m) fail_msg("%s", ct_last_error());
    manifest_add_core_schema(m);
    return m;
}

static inline manifest *fixture_overrides(const char *const *kv) {
    manifest *m = manifest_new();
    assert_non_null(m);
    manifest_add_core_schema(m);
    for (; *kv; kv++) {
        char key[128];
        const char *eq = strchr(*kv, '=');
        snprintf(key, sizeof key, "%.*s", (int)(eq - *kv), *kv);
        assert_int_equal(manifest_override(m, key, eq + 1), CT_OK);
    }
    return m;
}

#endif
