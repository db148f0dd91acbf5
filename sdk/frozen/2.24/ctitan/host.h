/* ctitan/host.h: the host-services table, handed to a plugin's entry function and to every
 * create call. A plugin never links the core: everything it needs from the host comes from here.
 *
 * Each loaded plugin gets its own table: `ctx` binds the getters to that plugin's manifest section.
 * The table outlives the plugin. All functions are safe to call from the thread that called the
 * plugin; log/set_error/trace are also safe from worker threads.
 */
#ifndef CTITAN_HOST_H
#define CTITAN_HOST_H

#include "ctitan/abi.h"

#include <stdarg.h>

typedef enum ct_log_level { CT_LOG_DEBUG = 0, CT_LOG_INFO = 1, CT_LOG_WARN = 2, CT_LOG_ERROR = 3 } ct_log_level;

/* Memory categories: every byte a run holds is counted under one; the metrics line reports peaks. */
typedef enum ct_mem_category {
    CT_MEM_PARAMS = 0,
    CT_MEM_GRADS = 1,
    CT_MEM_OPTIMIZER = 2,
    CT_MEM_ACTIVATIONS = 3,
    CT_MEM_COMM = 4,
    CT_MEM_OTHER = 5,
    CT_MEM_MASTER = 6, /* ABI 2.1: f32 master weights kept apart from whole compute parameters (ZeRO) */
    CT_MEM_NCATEGORIES = 7 /* grows with minors: size arrays by your own build's value */
} ct_mem_category;

struct ct_host {
    size_t struct_size;
    uint32_t abi_major;
    uint32_t abi_minor;
    void *ctx; /* host-private: which plugin, which manifest section */

    /* Logging; the message is one line without a trailing newline. */
    void (*log)(const ct_host *h, ct_log_level level, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
    /* Detail for the error the plugin is about to return; the host prefixes the plugin's name. A
     * create error that starts with one of the plugin's option keys ("n_layers: expected ...") is
     * reported at the file and line where that key was set. May be called from the plugin's own
     * thread (an async writer, a progress thread): the message is then kept until a call fails on
     * another thread that set none of its own, and reported there. */
    void (*set_error)(const ct_host *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

    /* Host memory, counted under `cat`. Returns NULL on failure (and sets no error). 64-byte aligned.
     * The block is the plugin's until it gives it back with mem_free (before its destroy returns). */
    void *(*mem_alloc)(const ct_host *h, size_t bytes, ct_mem_category cat);
    void (*mem_free)(const ct_host *h, void *p);
    /* For memory the plugin obtains elsewhere (device memory): add or remove bytes from a counter. */
    void (*mem_account)(const ct_host *h, ct_mem_category cat, int64_t delta_bytes);

    /* The plugin's own options, validated against its ct_option_spec list. A key that is unset and
     * has no default returns CT_ERR_INVALID with no message; a key outside the spec is a bug. */
    ct_status (*opt_int)(const ct_host *h, const char *key, int64_t *out);
    ct_status (*opt_float)(const ct_host *h, const char *key, double *out);
    ct_status (*opt_bool)(const ct_host *h, const char *key, int *out);
    /* The string stays valid as long as the host table. */
    ct_status (*opt_string)(const ct_host *h, const char *key, const char **out);

    /* Tracing: nested named ranges, shown by `--profiling.enable_profiling`. */
    void (*trace_begin)(const ct_host *h, const char *name);
    void (*trace_end)(const ct_host *h, const char *name);
};

#endif
