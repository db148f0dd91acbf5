/* ctitan/abi.h: versions, status codes, plugin kinds and the one entry symbol.
 *
 * Every plugin (.so) exports exactly one symbol, CT_PLUGIN_ENTRY_NAME:
 *
 *     CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info);
 *
 * The host fills `info->struct_size` and zeroes the rest; the plugin fills its kind, name, the ABI
 * version it was built against (CT_ABI_MAJOR / CT_ABI_MINOR) and a pointer to its kind's API
 * table (ct_device_api, ct_model_api, ct_optimizer_api ...), which must stay valid until the
 * host unloads the plugin. The host refuses a plugin whose abi_major differs from its own, one of
 * a newer minor than its own, and one older than the oldest minor it accepts for the plugin's kind.
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
 * Arrays of ABI structs (ct_option_spec lists, ct_pp_action lists) are stepped through by their
 * elements' struct_size, never by the reader's sizeof: a writer built against a later minor has
 * larger elements. Element i is CT_AT(type, base, i), with the stride base->struct_size; every
 * element of one array has the same struct_size (a terminator of all zeros aside), set by whoever
 * allocated the array. Before stepping, the reader checks that stride covers the last field it
 * reads (CT_HAS_FIELD(base, type, field)); an array whose stride does not is refused, never read.
 *
 * Errors are values: calls return ct_status and put the detail in a message through
 * host->set_error(). No plugin calls exit() or abort(). The host keeps ct_status end to end and
 * only its main() turns it into an exit status: 2 for bad input (CT_ERR_INVALID; a plugin whose
 * create refuses its options counts as that), 1 for a failure while running, 0 for CT_OK.
 */
#ifndef CTITAN_ABI_H
#define CTITAN_ABI_H

#include <stddef.h>
#include <stdint.h>

/* The one place the ABI version is written: the pkg-config file and `ctitan --version` take it from
 * here, and a test holds the README to it. 2.0 is the break with 1.x: a 1.x plugin is refused and must
 * be rebuilt against this SDK. Minor versions of 2 only append fields, functions and kinds; what each
 * appended is in sdk/CHANGELOG.md, and sdk/frozen/ holds each minor's headers as released. */
#define CT_ABI_MAJOR 2
#define CT_ABI_MINOR 24

#define CT_PLUGIN_ENTRY_NAME "ctitan_plugin_entry"

#if defined(__GNUC__)
#define CT_EXPORT __attribute__((visibility("default")))
#else
#define CT_EXPORT
#endif

/* True when `s` (a pointer to an ABI struct) is large enough to hold `field`. */
#define CT_HAS_FIELD(s, type, field) \
    ((s)->struct_size >= offsetof(type, field) + sizeof(((type *)0)->field))

/* Element i of an array of ABI structs whose first element is `base`, stepping by base->struct_size
 * (the element size of whoever allocated the array, which may differ from the reader's sizeof). Check CT_HAS_FIELD(base, type, <last field read>) once first: it also
 * refuses a stride of 0. `type` may be const-qualified: CT_AT(const ct_option_spec, opts, i). */
#define CT_AT(type, base, i) ((type *)(const void *)((const char *)(base) + (size_t)(i) * (base)->struct_size))

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
    CT_KIND_SCHEDULE = 7, /* pipeline schedules (ctitan/schedule.h) */
    CT_KIND_PIPELINE = 8  /* the pipeline runner (ctitan/pipeline.h) */
} ct_plugin_kind;

/* An option a plugin accepts in its manifest section. The host validates the manifest against
 * this list (unknown keys and wrong types are errors naming file, line and key) and answers the
 * host->opt_* getters from it. The list ends with an entry whose key is NULL. Every entry but that
 * last one has struct_size = sizeof(ct_option_spec): the host steps through the list by the first
 * entry's struct_size (CT_AT) and refuses a list whose entries differ. */
typedef enum ct_opt_type { CT_OPT_INT = 1, CT_OPT_FLOAT = 2, CT_OPT_STRING = 3, CT_OPT_BOOL = 4 } ct_opt_type;

/* The list and its strings belong to the plugin and must stay valid until it is unloaded (static). */
typedef struct ct_option_spec {
    size_t struct_size;
    const char *key;           /* in the plugin's section ("n_layers"); a key with a dot is another
                                  section's, spelled whole ("compile.enable_async_tensor_parallel") */
    ct_opt_type type;
    const char *default_value; /* as written in YAML; NULL = no default (optional, unset) */
    const char *help;
    /* ABI 2.0, may be NULL: checked by the host for every value given, whether or not the plugin
     * is created in the run. range: "[lo, hi]" (a bracket may be "(" or ")" for an open end);
     * choices: "a|b|c". */
    const char *range;
    const char *choices;
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

/* ABI 2.21: one of a plugin's options that a planner's search may vary (`ctitan plan --search`). The
 * planner sets the option's key to each value in turn, asks the plugins for the layout's cost as for
 * any layout, and writes the best value in the manifest it proposes: it knows no plugin's key by name.
 * A knob counts only where its plugin runs in the layout: a strategy's where its mesh axis has more
 * than one rank (an op-level strategy) or always (a unit-level one), the dense quantizer's where it is
 * on; the quantizer's knob on its own `enable` key is how the search turns it on (tried only on
 * hardware whose profile gives a float8 rate). A plugin that takes one setting under two spellings
 * declares the knob on one and lets that one, when given, win over the other. The list ends with an
 * entry whose key is NULL and is stepped by its first entry's struct_size (CT_AT), like the options. */
typedef struct ct_search_knob {
    size_t struct_size;
    const char *key;    /* one of the plugin's options, spelled as in its list ("enable",
                           "compile.enable_async_tensor_parallel") */
    const char *values; /* "a|b", in the order the search tries them; the first is where every layout
                           starts ("false|true" for a boolean; for a string, some of its choices) */
    const char *label;  /* may be NULL: a boolean's word in the plan's layout line where it is true
                           ("async": "tp 2 (async)"); a string knob shows its value */
} ct_search_knob;

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
    /* ABI 2.21, may be NULL: the options a planner's search may vary. The host reads it only from a
     * plugin built against 2.21 or later (the host zeroes the struct before the entry runs). */
    const ct_search_knob *knobs;
} ct_plugin_info;

typedef ct_status (*ct_plugin_entry_fn)(const ct_host *host, ct_plugin_info *info);

#endif
