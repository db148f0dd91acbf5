/* bench_host.h: the smallest host a device benchmark hands a device plugin (the programs in tests/bench/): logs
 * dropped, errors to stderr, options at the plugin's declared defaults, except `threads` from env
 * CT_BENCH_THREADS. The benchmark sets `options` to the plugin's option list before create. */
#ifndef CT_BENCH_HOST_H
#define CT_BENCH_HOST_H

#include "ctitan/abi.h"
#include "ctitan/host.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const ct_option_spec *options;

static void h_log(const ct_host *h, ct_log_level l, const char *fmt, ...)
{
    (void)h, (void)l, (void)fmt;
}
static void h_err(const ct_host *h, const char *fmt, ...)
{
    (void)h;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "plugin error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}
static ct_status h_int(const ct_host *h, const char *key, int64_t *out)
{
    (void)h;
    if (strcmp(key, "threads") == 0 && getenv("CT_BENCH_THREADS")) {
        *out = atoll(getenv("CT_BENCH_THREADS"));
        return CT_OK;
    }
    for (const ct_option_spec *o = options; o && o->key; o++)
        if (strcmp(o->key, key) == 0 && o->default_value) {
            *out = atoll(o->default_value);
            return CT_OK;
        }
    return CT_ERR_INVALID;
}
static ct_status h_float(const ct_host *h, const char *key, double *out)
{
    (void)h;
    for (const ct_option_spec *o = options; o && o->key; o++)
        if (strcmp(o->key, key) == 0 && o->default_value) {
            *out = atof(o->default_value);
            return CT_OK;
        }
    return CT_ERR_INVALID;
}

static const ct_host host = {.struct_size = sizeof(ct_host),
                             .abi_major = CT_ABI_MAJOR,
                             .abi_minor = CT_ABI_MINOR,
                             .log = h_log,
                             .set_error = h_err,
                             .opt_int = h_int,
                             .opt_float = h_float};

#endif
