/* fuzz_hw_profile.c: any bytes as a hardware profile (core/plan/hardware.c through config/'s YAML
 * reader). It must return an error or a profile, never crash, leak or hang, and it checks what the
 * reader promises: an error is one line naming the file; a profile loaded is written back
 * (hw_profile_write refuses what the loader would) and reads back bit for bit. */
#include "plan/plan.h"
#include "base/error.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A broken promise is a crash the fuzzer reports. */
static void check(int ok) {
    if (!ok) abort();
}

/* Every field but the path, doubles compared by their bits. */
static int same(const hw_profile *a, const hw_profile *b) {
    if (strcmp(a->name, b->name) || strcmp(a->source, b->source) || a->gpus_per_node != b->gpus_per_node ||
        a->calibrated != b->calibrated || a->n_ops != b->n_ops || a->n_comms != b->n_comms)
        return 0;
    const double da[] = {a->peak_flops[0], a->peak_flops[1], a->peak_flops[2], a->mem_bytes, a->mem_bw,
                         a->intra_bw, a->intra_lat, a->inter_bw, a->inter_lat, a->host_bw, a->host_mem,
                         a->matmul_eff, a->attn_eff, a->mem_eff, a->overhead_bytes, a->alloc_frac,
                         a->headroom_frac, a->core_share, a->comm_overlap};
    const double db[] = {b->peak_flops[0], b->peak_flops[1], b->peak_flops[2], b->mem_bytes, b->mem_bw,
                         b->intra_bw, b->intra_lat, b->inter_bw, b->inter_lat, b->host_bw, b->host_mem,
                         b->matmul_eff, b->attn_eff, b->mem_eff, b->overhead_bytes, b->alloc_frac,
                         b->headroom_frac, b->core_share, b->comm_overlap};
    if (memcmp(da, db, sizeof da)) return 0;
    for (int i = 0; i < a->n_ops; i++) {
        const plan_measured_op *x = &a->ops[i], *y = &b->ops[i];
        if (x->kind != y->kind || x->dtype != y->dtype || memcmp(x->shape, y->shape, sizeof x->shape) ||
            memcmp(x->seconds, y->seconds, sizeof x->seconds))
            return 0;
    }
    for (int i = 0; i < a->n_comms; i++) {
        const plan_measured_comm *x = &a->comms[i], *y = &b->comms[i];
        if (x->kind != y->kind || x->ranks != y->ranks || memcmp(&x->bytes, &y->bytes, sizeof x->bytes) ||
            memcmp(&x->seconds, &y->seconds, sizeof x->seconds))
            return 0;
    }
    return 1;
}

static char scratch[64], written[80];
static void remove_scratch(void) {
    unlink(written);
    rmdir(scratch);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!written[0]) { /* one scratch folder for the process's write-backs, removed at exit */
        snprintf(scratch, sizeof scratch, "/tmp/ctitan-fuzz-hw-XXXXXX");
        if (!mkdtemp(scratch)) return 0;
        snprintf(written, sizeof written, "%s/p.yaml", scratch);
        atexit(remove_scratch);
    }
    int fd = memfd_create("profile", 0);
    if (fd < 0) return 0;
    if (write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    hw_profile hw, back;
    if (hw_profile_load(path, &hw) != CT_OK) {
        const char *err = ct_last_error();
        check(strncmp(err, path, strlen(path)) == 0 && !strchr(err, '\n'));
        check(!hw.ops && !hw.comms);
        close(fd);
        return 0;
    }
    check(hw_profile_write(&hw, written) == CT_OK);
    check(hw_profile_load(written, &back) == CT_OK);
    check(same(&hw, &back));
    hw_profile_free(&back);
    hw_profile_free(&hw);
    unlink(written);
    close(fd);
    return 0;
}
