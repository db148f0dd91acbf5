/* fuzz_checkpoint.c: any bytes as a checkpoint's metadata.json: the validator must accept or give
 * an error, never crash, overflow or leak. */
#include "checkpoint.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[1024];
    ckpt_check_metadata((const char *)data, size, "fuzz", err, sizeof err);
    return 0;
}
