/* float8_fixture.h: the cpu device and the float8 quantizer loaded through the core's loader (as a
 * session does) from a manifest written to a temporary file, for the float8 plugin's golden tests.
 * Include after cmocka.h; run from the repository root (BUILD=build-san picks the sanitizer build). */
#ifndef CT_TEST_FLOAT8_FIXTURE_H
#define CT_TEST_FLOAT8_FIXTURE_H

#include "host/host.h"
#include "config/manifest.h"
#include "session_fixture.h"

#include "ctitan/quantizer.h"

typedef struct f8_env {
    manifest *mf;
    plugin *devp, *quantp;
    const ct_device_api *d;
    ct_device *dev;
    const ct_quantizer_api *q;
    ct_quantizer *quant;
} f8_env;

static inline void f8_env_close(f8_env *e) {
    if (e->quant) e->q->destroy(e->quant);
    if (e->dev) e->d->destroy(e->dev);
    if (e->quantp) plugin_unload(e->quantp);
    if (e->devp) plugin_unload(e->devp);
    if (e->mf) manifest_free(e->mf);
    memset(e, 0, sizeof *e);
}

/* Loads the cpu device (2 threads) and the float8 quantizer, enabled, with the option lines `opts`
 * (YAML under quantize.dense.float8, each indented six spaces). Fails the test on any error. */
static inline void f8_env_open(f8_env *e, const char *opts) {
    memset(e, 0, sizeof *e);
    fixture_plugin_path();
    char yaml[1024], path[] = "/tmp/ctitan-float8-XXXXXX.yaml";
    snprintf(yaml, sizeof yaml,
             "device: {name: cpu, threads: 2}\nquantize:\n  dense:\n    float8:\n      enable: true\n%s", opts);
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fputs(yaml, f);
    fclose(f);
    e->mf = manifest_load(path);
    unlink(path);
    if (!e->mf) fail_msg("manifest: %s", ct_last_error());
    manifest_add_core_schema(e->mf);
    e->devp = plugin_load("cpu", CT_KIND_DEVICE, "device", e->mf);
    if (!e->devp) fail_msg("%s", ct_last_error());
    manifest_add_plugin_schema(e->mf, "device", e->devp->info.options);
    e->quantp = plugin_load("float8", CT_KIND_QUANTIZER, "quantize.dense.float8", e->mf);
    if (!e->quantp) fail_msg("%s", ct_last_error());
    manifest_add_plugin_schema(e->mf, "quantize.dense.float8", e->quantp->info.options);
    if (manifest_validate(e->mf) != CT_OK) fail_msg("manifest: %s", ct_last_error());
    e->d = e->devp->info.api;
    e->q = e->quantp->info.api;
    ct_clear_error();
    if (e->d->create(&e->devp->host, &e->dev) != CT_OK) fail_msg("cpu create: %s", ct_last_error());
    if (e->q->create(&e->quantp->host, e->d, e->dev, &e->quant) != CT_OK)
        fail_msg("float8 create (%s): %s", opts, ct_last_error());
}

#endif
