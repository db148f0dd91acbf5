/* fuzz_checkpoint.c: any bytes as a checkpoint's metadata.json: the validator must accept or give
 * one line of error that starts with the label, never crash, overflow or leak. */
#include "checkpoint/checkpoint.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (ckpt_check_metadata((const char *)data, size, "fuzz") != CT_OK &&
        (strncmp(ct_last_error(), "fuzz", 4) || strchr(ct_last_error(), '\n'))) {
        fprintf(stderr, "fuzz_checkpoint: a rejection must be one line starting with the label: \"%s\"\n",
                ct_last_error());
        abort();
    }
    return 0;
}
