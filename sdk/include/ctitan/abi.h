/* ctitan/abi.h: versions, status codes, plugin kinds and the one entry symbol.
 *
 * Every plugin (.so) exports exactly one symbol, CT_PLUGIN_ENTRY_NAME:
 *
 *     CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info);
 *
 * The host fills `info->struct_size` and zeroes the rest; the plugin fills its kind, name, the ABI
 * version it was built against (CT_ABI_MAJOR / CT_ABI_MINOR) and a pointer to its kind's API
 * table (ct_device_api, ct_model_api, ct_optimizer_api ...), which must stay valid until the
 * host unloads the plugin. The host refuses a plugin whose abi_major differs from its own.
 *
 * Instances: each kind's `create` hands out an opaque, typed handle (ct_device *, ct_model *,
 * ct_comm * ...; see "Opaque handles" below) that the host passes back to every call until
 * `destroy`. Lifetimes: every header says, for each pointer that crosses the ABI, who owns it and
 * until when. Pointers the plugin hands out in static tables live until it is unloaded.
 *
 * Versioning: every ABI struct begins with `size_t struct_size`. Minor versions only append
 * fields; a reader checks struct_size before touching a field newer than what it was built with
 * (CT_HAS_FIELD). A NULL optional function pointer means "not supported".
 *
 * Errors are values: calls return ct_status and put the detail in a message through
 * host->set_error(). No plugin calls exit() or abort().
 */
#ifndef CTITAN_ABI_H
#define CTITAN_ABI_H

#include <stddef.h>
#include <stdint.h>

#define CT_ABI_MAJOR 1
#define CT_ABI_MINOR 5 /* 1.1: comm and strategy kinds, CT_ERR_TIMEOUT; 1.2: float8 device ops;
                          1.3: tensor-parallel ops and hooks, the schedule kind;
                          1.4: scaled fp8 matmul, the matmul operand dtype, shared device streams;
                          1.5: device-resident loss ops and graph capture */

#define CT_PLUGIN_ENTRY_NAME "ctitan_plugin_entry"

#if defined(__GNUC__)
#define CT_EXPORT __attribute__((visibility("default")))
#else
#define CT_EXPORT
#endif

/* True when `s` (a pointer to an ABI struct) is large enough to hold `field`. */
#define CT_HAS_FIELD(s, type, field) \
    ((s)->struct_size >= offsetof(type, field) + sizeof(((type *)0)->field))

typedef enum ct_status {
    CT_OK = 0,
    CT_ERR_INVALID = 1,     /* bad argument or option value */
    CT_ERR_UNSUPPORTED = 2, /* the plugin cannot do this (shape, dtype, feature) */
    CT_ERR_NOMEM = 3,       /* allocation failed */
    CT_ERR_IO = 4,          /* file or stream error */
    CT_ERR_INTERNAL = 5,    /* a bug; the message says where */
    CT_ERR_TIMEOUT = 6      /* a collective or transfer did not complete in time (a rank died or hangs) */
} ct_status;

typedef enum ct_plugin_kind {
    CT_KIND_DEVICE = 1,
    CT_KIND_MODEL = 2,
    CT_KIND_OPTIMIZER = 3,
    CT_KIND_COMM = 4,
    CT_KIND_STRATEGY = 5,
    CT_KIND_QUANTIZER = 6,
    CT_KIND_SCHEDULE = 7, /* 1.3: pipeline schedules (ctitan/schedule.h) */
    CT_KIND_PIPELINE = 8  /* 1.3: the pipeline runner (ctitan/pipeline.h) */
} ct_plugin_kind;

/* An option a plugin accepts in its manifest section. The host validates the manifest against
 * this list (unknown keys and wrong types are errors naming file, line and key) and answers the
 * host->opt_* getters from it. The list ends with an entry whose key is NULL. */
typedef enum ct_opt_type { CT_OPT_INT = 1, CT_OPT_FLOAT = 2, CT_OPT_STRING = 3, CT_OPT_BOOL = 4 } ct_opt_type;

/* The list and its strings belong to the plugin and must stay valid until it is unloaded (static). */
typedef struct ct_option_spec {
    size_t struct_size;
    const char *key;
    ct_opt_type type;
    const char *default_value; /* as written in YAML; NULL = no default (optional, unset) */
    const char *help;
} ct_option_spec;

typedef struct ct_host ct_host;

/* Opaque handles. Each is a pointer to a struct that only its creator defines (a device plugin
 * writes `struct ct_device { ... }` for its own state); everyone else passes it back unread. A
 * typed pointer instead of `void *` lets the compiler catch a comm handed where a device belongs.
 * Who owns each and until when:
 *   ct_device, ct_comm, ct_model, ct_optimizer, ct_strategy, ct_quantizer, ct_runner
 *       a plugin instance: made by its api's create, owned by the host until it calls destroy.
 *   ct_comm_group    made by the comm (world, split); world's belongs to the comm until destroy,
 *                    split's to the caller until group_free.
 *   ct_comm_request  a started operation; belongs to the comm until wait() completes and frees it.
 *   ct_graph         a captured device graph (graph_end); the host's until graph_free.
 *   ct_stream        the device's compute stream (share_stream); the device's until its destroy.
 *                    A CUDA device hands out its cudaStream_t itself, cast to ct_stream *.
 * `void *` is left only for untyped memory (buffers) and the ctx fields of host tables. */
typedef struct ct_device ct_device;
typedef struct ct_stream ct_stream;
typedef struct ct_graph ct_graph;
typedef struct ct_comm ct_comm;
typedef struct ct_comm_group ct_comm_group;
typedef struct ct_comm_request ct_comm_request;
typedef struct ct_model ct_model;
typedef struct ct_optimizer ct_optimizer;
typedef struct ct_strategy ct_strategy;
typedef struct ct_quantizer ct_quantizer;
typedef struct ct_runner ct_runner;

/* Filled by the entry function. Every pointer in it (name, description, options, api) belongs to
 * the plugin and must stay valid until the host unloads it: static storage, never the stack. */
typedef struct ct_plugin_info {
    size_t struct_size;
    uint32_t abi_major;
    uint32_t abi_minor;
    ct_plugin_kind kind;
    const char *name;        /* e.g. "cpu", "llama3", "adamw" */
    const char *description; /* one line for `ctitan plugins` */
    const ct_option_spec *options; /* may be NULL: accepts no options */
    const void *api;         /* ct_device_api *, ct_model_api *, ct_optimizer_api *, ct_comm_api *,
                                ct_strategy_api *, ct_quantizer_api *,
                                ct_schedule_api *, ct_pipeline_api * per kind */
} ct_plugin_info;

typedef ct_status (*ct_plugin_entry_fn)(const ct_host *host, ct_plugin_info *info);

#endif
