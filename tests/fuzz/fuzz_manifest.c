/* fuzz_manifest.c: any bytes as a manifest: parse (libyaml + flattening), override, validate, print.
 * It must return an error or a manifest, never crash or leak. */
#include "manifest.h"

#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("manifest", 0);
    if (fd < 0) return 0;
    if (write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64], err[2048];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    manifest *m = manifest_load(path, err, sizeof err);
    if (m) {
        manifest_add_core_schema(m);
        manifest_override(m, "training.steps", "3", err, sizeof err);
        if (manifest_validate(m, err, sizeof err) == 0) {
            FILE *devnull = fopen("/dev/null", "w");
            if (devnull) {
                manifest_print(m, devnull);
                fclose(devnull);
            }
        }
        manifest_free(m);
    }
    close(fd);
    return 0;
}
