/* fuzz_manifest.c: any bytes as a manifest: parse (libyaml events, then the document, flattening),
 * override, alias, validate against the core's schema and a plugin's, read every key, print.
 * It must return an error or a manifest, never crash, leak or hang, and it checks what the limits
 * promise: an error is one line naming the file; a manifest holds at most MF_MAX_KEYS keys, none
 * longer than MF_MAX_KEY_LEN, none without a value (explicit nulls are refused). */
#include "config/manifest.h"
#include "base/error.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Options shaped like a model pack's (plugin keys validate by type only). */
static const ct_option_spec plugin_opts[] = {
    {sizeof(ct_option_spec), "n_layers", CT_OPT_INT, NULL, "blocks", NULL, NULL},
    {sizeof(ct_option_spec), "norm_eps", CT_OPT_FLOAT, "1e-5", "epsilon", NULL, NULL},
    {sizeof(ct_option_spec), "depth_init", CT_OPT_BOOL, "true", "init", NULL, NULL},
    {sizeof(ct_option_spec), "kind", CT_OPT_STRING, NULL, "a string", NULL, NULL},
    {0},
};

/* A broken promise is a crash the fuzzer reports. */
static void check(int ok) {
    if (!ok) abort();
}

static void read_every_key(const manifest *m) {
    char where[700];
    for (int i = 0; i < m->n_values; i++) mf_where(m, m->values[i].key, where, sizeof where);
    for (int i = 0; i < m->n_schema; i++) {
        const char *s;
        int64_t iv;
        double fv;
        int bv;
        switch (m->schema[i].type) {
        case CT_OPT_INT: mf_get_int(m, m->schema[i].key, &iv); break;
        case CT_OPT_FLOAT: mf_get_float(m, m->schema[i].key, &fv); break;
        case CT_OPT_BOOL: mf_get_bool(m, m->schema[i].key, &bv); break;
        case CT_OPT_STRING: mf_get_str(m, m->schema[i].key, &s); break;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("manifest", 0);
    if (fd < 0) return 0;
    if (write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    manifest *m = manifest_load(path);
    if (!m) {
        const char *err = ct_last_error();
        check(strncmp(err, path, strlen(path)) == 0 && !strchr(err, '\n'));
        close(fd);
        return 0;
    }
    check(m->n_values <= MF_MAX_KEYS);
    for (int i = 0; i < m->n_values; i++) check(m->values[i].value && strlen(m->values[i].key) <= MF_MAX_KEY_LEN);
    manifest_add_core_schema(m);
    manifest_add_plugin_schema(m, "model", plugin_opts);
    /* the first byte picks overrides that meet the ranges, the choices and the size checks */
    static const char *const overrides[][2] = {
        {"training.steps", "3"},          {"optimizer.lr", "-1"},
        {"lr_scheduler.decay_type", "x"}, {"training.local_batch_size", "65536"},
        {"generate.top_p", "0"},          {"parallelism.data_parallel_shard_degree", "-1"},
        {"model.n_layers", "2"},          {"quantize.linear.mx.recipe_name", "mxpf8"},
    };
    const char *const *ov = overrides[size ? data[0] % 8 : 0];
    manifest_override(m, ov[0], ov[1]);
    manifest_alias(m, "quantize.linear.mx.recipe_name", "quantize.dense.float8.format");
    ct_clear_error();
    if (manifest_validate(m) == CT_OK) {
        read_every_key(m);
        FILE *devnull = fopen("/dev/null", "w");
        if (devnull) {
            manifest_print(m, devnull);
            fclose(devnull);
        }
    } else {
        check(ct_last_error()[0] && !strchr(ct_last_error(), '\n'));
    }
    manifest_free(m);
    close(fd);
    return 0;
}
