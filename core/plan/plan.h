/* plan.h: the planner (`ctitan plan`, `ctitan train --dry-run`): what a layout costs on given hardware.
 *
 * Pieces, one file each:
 *   hardware.c  hw_profile: a YAML hardware profile (configs/hardware/), datasheet or calibrated
 *   trace.c     plan_trace: one microbatch of the model run through a planning builder (ABI 2.2,
 *               ct_builder.planning) under the layout's op-level strategies: every op with its shapes,
 *               FLOPs, bytes, saved activations and collectives, per unit
 *   eval.c      plan_eval: memory per rank by category and step time by part for one layout, from
 *               the trace, the strategies' reports, the optimizer's and quantizer's plan calls, the
 *               schedule's own action lists and the hardware profile
 *   search.c    plan_search: the layouts that multiply to N GPUs, evaluated, ranked
 *   calibrate.c plan_calibrate: measures a hw_profile on this machine through the manifest's plugins
 *   output.c    text, JSON and manifest output
 * core/cmd/cmd_plan.c is the command.
 *
 * Units: bytes, seconds, FLOP and FLOP/s (not GiB, ms or TFLOP/s) everywhere in these structs; the
 * output converts. Errors: functions return CT_OK, or a status (CT_ERR_INVALID, bad input, unless they
 * say otherwise) with one line set (ct_last_error: file, line, key where there is one).
 */
#ifndef CT_PLAN_H
#define CT_PLAN_H

#include "config/manifest.h"
#include "engine/observer.h"
#include "ctitan/model.h"
#include "ctitan/strategy.h"

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

/* ---- hardware ---- */

/* GEMM element types a profile rates. */
enum { PLAN_F32 = 0, PLAN_BF16 = 1, PLAN_FP8 = 2, PLAN_NDTYPES = 3 };

/* One measured op at one shape (calibration): seconds per call, forward and backward. */
typedef struct plan_measured_op {
    int kind;            /* rt_op_kind */
    int64_t shape[4];    /* as in plan_op.shape */
    int dtype;           /* PLAN_F32 / PLAN_BF16 / PLAN_FP8 for GEMMs, else PLAN_F32 */
    double seconds[2];   /* forward, backward (both halves) */
} plan_measured_op;

/* One measured collective: `kind` (ct_collective) over `ranks` ranks of one node, `bytes` the
 * whole buffer, seconds per call. */
typedef struct plan_measured_comm {
    int kind, ranks;
    double bytes, seconds;
} plan_measured_comm;

typedef struct hw_profile {
    char name[128];       /* e.g. "NVIDIA H100 SXM5 80GB" */
    char path[1024];      /* the file it came from ("" when built in) */
    char source[512];     /* where its figures come from (datasheet, calibration run) */
    double mem_bytes;     /* device memory */
    double mem_bw;        /* memory bandwidth, bytes/s (datasheet) */
    double peak_flops[PLAN_NDTYPES];   /* dense peak, FLOP/s (datasheet); MFU is against [PLAN_BF16] */
    double matmul_eff;    /* fraction of peak a large GEMM reaches (datasheet profiles: an assumption
                             the output states; calibrated ones: measured) */
    double attn_eff;      /* fraction of the matmul rate attention reaches */
    double mem_eff;       /* fraction of mem_bw memory-bound ops reach */
    double intra_bw, intra_lat; /* per-GPU bandwidth (bytes/s, one direction) and latency (s) in a node */
    double inter_bw, inter_lat; /* the same between nodes (the GPU's share of the network) */
    double host_bw;             /* one GPU's link to host memory, bytes/s one direction (activation
                                   offload's copies); 0: not given, offload's copy time not counted */
    double host_mem;            /* one GPU's share of its node's host memory, bytes (activation offload's
                                   copies must fit in it with the headroom); 0: not given, not checked */
    int gpus_per_node;
    double overhead_bytes;      /* runtime, context and library memory per GPU */
    double alloc_frac;          /* allocator slack: fraction added to activations and buffers */
    double headroom_frac;       /* fraction of mem_bytes kept free for "fits" */
    int calibrated;             /* 1: the figures below were measured by --calibrate */
    double core_share;          /* calibrated on more ranks than cores: cores / ranks (the ops' times are
                                   with every rank busy); 0 or 1: a device per rank */
    double comm_overlap;        /* the share of a collective that hides behind compute when issued
                                   asynchronously (calibrated); 0: all of it (separate streams) */
    plan_measured_op *ops;
    int n_ops;
    plan_measured_comm *comms;
    int n_comms;
} hw_profile;

/* Loads NAME (configs/hardware/NAME.yaml next to the binary's tree, or the shipped search path) or
 * a FILE path. Every key is checked: an unknown key, a missing required one or a value out of range
 * is one line naming file, line and key. */
ct_status hw_profile_load(const char *name_or_path, hw_profile *hw);
void hw_profile_free(hw_profile *hw);
/* Writes a profile (calibration's output) that hw_profile_load reads back unchanged. */
ct_status hw_profile_write(const hw_profile *hw, const char *path);
/* The shipped profiles' names, comma-separated, for messages and --help. */
void hw_profile_list(char *out, size_t len);

/* Measured seconds for an op or collective, or -1 when the profile has none at that shape. */
double hw_measured_op(const hw_profile *hw, int kind, const int64_t shape[4], int dtype, int backward);
double hw_measured_comm(const hw_profile *hw, int kind, int ranks, double bytes);

/* ---- trace ---- */

/* what each traced op is: rt_op_kind (engine/observer.h) */

typedef struct plan_op {
    int kind;             /* rt_op_kind */
    int unit;
    int64_t shape[4];
    int kv_heads;         /* attention */
    int dtype;            /* GEMM: PLAN_F32 / PLAN_BF16 / PLAN_FP8 */
    double flops[2];      /* FLOPs: forward, backward (GEMMs and attention) */
    double attn_flops[2]; /* a custom op's attention FLOPs (ct_op_cost.attention_flops), beside its GEMMs' */
    double bytes[2];      /* memory traffic of memory-bound work: forward, backward */
    double out_bytes;     /* the output tensor(s) the tape allocates */
    double saved_bytes;   /* what the tape keeps from this op until backward (no AC) */
    int sac_keep;         /* selective per-op AC keeps this op's output (not recomputed) */
    int bwd_refwd;        /* its forward runs again in its backward (linear_cross_entropy's blocks) */
    /* RT_OP_COLLECTIVE, and a custom op's collectives (one plan_op each, kind COLLECTIVE) */
    int axis, coll_kind, phase, overlapped;
    double coll_bytes;
    int coll_calls;       /* issued as this many collectives of coll_bytes / coll_calls (1: one) */
    const char *name;     /* custom op's name, a weight's name for GEMMs (owned by the model/plugin) */
} plan_op;

typedef struct plan_unit {
    double out_bytes;           /* its output activation (what a pipeline stage sends on) */
    double saved_bytes;         /* what the tape keeps from its forward until its backward, under the
                                   layout's activation checkpointing */
    double boundary_grad_bytes; /* its input's gradient, kept until the microbatch ends */
    double in_grad_bytes;       /* its input's gradient, whether kept or in the two shared buffers */
    double fwd_peak, bwd_peak;  /* its temporaries above what was live when it started: forward, backward */
    double grads_peak;          /* of which activation gradients in its backward (a pipeline context's own) */
    double scratch_peak;        /* of which recompute scratch, forward or backward (one arena per rank) */
    double zeroed_bytes;        /* activation gradients zeroed in its backward (memory traffic) */
    double offload_bytes;       /* activation offload: its packed activations (0: not offloaded) */
    int offload_copied;         /* ... copied out after its forward and in before its backward */
} plan_unit;

typedef struct plan_trace {
    plan_op *ops;
    int n_ops, cap_ops;
    plan_unit *units;
    int n_units;
    int64_t tokens;        /* per microbatch on one rank (local batch x seq / cp) */
    char cannot[256];      /* non-empty: what stopped the trace (a custom op without plan) */
    void *state;           /* the planner's own, while the trace is made */
    /* the tape's arenas, bytes: ids and targets of a microbatch; the whole microbatch's live peak
     * (forward and backward, as training measures it on one pipeline stage holding every unit) */
    double io_bytes, live_peak;
    /* what the activation arenas hold in steady state (each pool at its peak, or its first chunk):
     * the device memory a run's activations take, however much of it is live at once */
    double arena_bytes;
    /* the host-side descriptor arenas (tensors, tape entries) and the custom ops' device scratch, as
     * the tape left them: their allocated sizes */
    double desc_bytes, opscratch_bytes;
    double host_bytes; /* activation offload's host copies */
} plan_trace;
void plan_trace_free(plan_trace *t);

/* ---- layouts and results ---- */

enum { PLAN_AC_NONE = 0, PLAN_AC_SELECTIVE_OP = 1, PLAN_AC_SELECTIVE_LAYER = 2, PLAN_AC_FULL = 3 };

/* A plugin's search knob (ABI 2.21, ct_search_knob) as a layout carries it: the option's whole manifest
 * key, its value there and where it counts, so that a layout prints and writes itself without the
 * plugins. The planner knows none of these keys by name. */
#define PLAN_MAX_KNOBS 8
typedef struct plan_setting {
    char key[128];  /* "compile.enable_async_tensor_parallel", "quantize.dense.float8.format" */
    char value[48]; /* "" where the layout leaves it to the manifest */
    char label[24]; /* a boolean's word in the layout line where it is true; "" shows a string's value */
    int axis;       /* CT_AXIS_* of the op-level strategy declaring it: counts where that axis has > 1 rank */
    int quantizer;  /* the dense quantizer's: counts where the quantizer is on ... */
    int enables;    /* ... except its enable key, whose "true" turns it on (plan_layout.quant) */
} plan_setting;

typedef struct plan_layout {
    int dp_replicate, dp_shard, cp, tp, pp;   /* multiply to the GPU count */
    char schedule[64];        /* parallelism.pipeline_parallel_schedule (pp > 1) */
    int pp_microbatch_size;   /* parallelism.pipeline_parallel_microbatch_size */
    int64_t local_batch, global_batch, seq_len;
    int ac;                   /* PLAN_AC_* */
    int ac_every;             /* selective layer: every n-th block */
    /* the dense quantizer (quantize.dense.name, `quant_name`) converts the linears: the typed copy of
     * its enable knob (or the manifest's asking for it), which the cost model reads */
    int quant;
    char quant_name[32];
    int compile, bf16;
    int offload;              /* activation_offload.layers: blocks whose saved activations wait in host memory */
    plan_setting knob[PLAN_MAX_KNOBS]; /* the plugins' search knobs (plan_knobs' order) */
    int n_knobs;
    /* parallelism.expert_parallel_degree (0 or 1: none): borrowed from dp_shard x cp, which it divides;
     * efsdp, the ranks holding the same experts, is dp_shard x cp / ep */
    int ep;
} plan_layout;

/* Memory categories of a plan (bytes on the largest rank). */
enum {
    PLAN_MEM_PARAMS = 0, PLAN_MEM_GRADS, PLAN_MEM_OPTIMIZER, PLAN_MEM_MASTER,
    PLAN_MEM_FSDP_BUFFERS,  /* the strategies' own: gathers, reduce-scatters, buckets, prefetch */
    PLAN_MEM_TP_BUFFERS, PLAN_MEM_PP_BUFFERS,
    PLAN_MEM_ACTIVATIONS,   /* saved for backward, x in-flight microbatches */
    PLAN_MEM_TRANSIENT,     /* the largest unit's temporaries and activation gradients */
    PLAN_MEM_FLOAT8,        /* quantizer's cached casts and saved copies */
    PLAN_MEM_LOGITS,        /* the head's logits and loss buffers */
    PLAN_MEM_OVERHEAD,      /* runtime and allocator */
    PLAN_MEM_N
};
extern const char *const plan_mem_names[PLAN_MEM_N]; /* JSON keys: "params", "grads" ... */

/* One collective class in the step (per unit summed), with what hides and what shows. */
typedef struct plan_comm_line {
    char what[48];       /* "fsdp all_gather", "tp reduce_scatter", "pp send", "dp all_reduce" */
    int axis, kind;
    double bytes, count, seconds, exposed;
    int inter_node;
    double hidden_candidate; /* the evaluation's own: overlapped seconds before the overlap is known */
} plan_comm_line;

typedef struct plan_result {
    plan_layout layout;
    int fits;
    double mem[PLAN_MEM_N];
    double mem_total, mem_capacity;
    /* step time parts, seconds per step on the slowest rank */
    double t_gemm, t_attention, t_memory_bound, t_optimizer, t_recompute;
    double t_comm_exposed, t_comm_hidden, t_bubble, step_time;
    plan_comm_line comms[16];
    int n_comms;
    double bubble_fraction;       /* the schedule simulated with these F/B/W costs */
    int inflight_microbatches;    /* from the schedule's action lists (1 without pp) */
    double tokens_per_s_per_gpu, mfu, flops_per_token; /* MFU against peak_flops[PLAN_BF16], torchtitan's formula */
    double scaling_efficiency;    /* against the smallest GPU count that fits (search), else 0 */
    char assumptions[1024];       /* what the plan assumed because a plugin reported nothing */
    /* activation offload: host memory held for the copies, bytes copied out and in per step, and
     * the copy time that does not hide behind the neighbouring units' compute */
    double host_bytes, offload_bytes, t_offload, t_offload_exposed;
    /* mixture of experts: the experts per layer (0: a dense model), and under ep > 1 the seconds per step
     * of the dispatch and combine all-to-alls and the load imbalance they were timed at */
    int n_experts;
    double t_ep_all_to_all, ep_imbalance;
} plan_result;

/* A planner over one manifest: its plugins loaded, model created (no parameters). */
typedef struct plan_ctx plan_ctx;
ct_status plan_open(plan_ctx **ctx, manifest *mf);
void plan_close(plan_ctx *ctx);
/* The model's description and the manifest the planner reads (the layouts' keys are set in it). */
const ct_model_desc *plan_model(const plan_ctx *ctx);
manifest *plan_manifest(const plan_ctx *ctx);
/* The manifest's own layout for `gpus` GPUs (data_parallel_shard_degree -1 takes what is left). */
ct_status plan_layout_from_manifest(plan_ctx *ctx, int gpus, plan_layout *l);
/* The search knobs the manifest's plugins declare (ABI 2.21): each with its values ("|"-separated,
 * in the order tried) in *values (the context's; NULL where a slot is out of range), n of them. The
 * layouts of plan_layout_from_manifest carry the same knobs in the same order. */
int plan_knobs(const plan_ctx *ctx, const plan_setting **knobs, const char *const **values);
/* Whether a knob counts in a layout (its plugin runs there). */
int plan_knob_applies(const plan_setting *k, const plan_layout *l);
/* Sets knob i of l (as plan_knobs lists it) to value, and the typed field it feeds (quant). */
void plan_layout_set_knob(plan_layout *l, int i, const char *value);
/* The i-th of a knob's values ("a|b") into out: 1, or 0 past the last. */
int plan_knob_value(const char *values, int i, char *out, size_t len);
/* Whether a knob's value is "true" (a boolean knob that is on). */
int plan_knob_true(const plan_setting *k);
/* Evaluates one layout; r->fits says whether it fits hw with headroom. A status other than CT_OK only
 * for a layout the plugins refuse (ct_last_error says why; the search skips those). */
ct_status plan_eval(plan_ctx *ctx, const plan_layout *l, const hw_profile *hw, plan_result *r);
/* The trace of one layout (for calibration: the ops at their shapes). */
ct_status plan_trace_layout(plan_ctx *ctx, const plan_layout *l, plan_trace *t);

typedef struct plan_search_opts {
    int gpus, gpus_per_node, top_k;
    int vary_ac, vary_knobs, vary_compile, vary_schedule; /* all 1 by default; vary_knobs: every search
                                                             knob the plugins declare (plan_knobs) */
    int vary_offload; /* 1: a mesh without a pipeline whose whole local batch fits in no AC mode is tried
                         again with every block's activations offloaded (activation_offload.layers) */
} plan_search_opts;
/* Every layout that multiplies to opts->gpus and divides the model, evaluated; *out sorted by
 * tokens/s per GPU (fitting first). */
ct_status plan_search(plan_ctx *ctx, const plan_search_opts *o, const hw_profile *hw, plan_result **out, int *n);

/* The evaluation as text: memory by category with the fit, step time by part, the collectives,
 * tokens/s, MFU, assumptions (output.c). */
void plan_print_text(FILE *f, const plan_result *r, const hw_profile *hw);

/* For a run (`ctitan train`): the planner's evaluation of the manifest given by argv (parsed again:
 * the run's own manifest is not touched; `prepare`, when given, resolves it as the run did, e.g. a
 * model.flavor taken from a checkpoint; `run`, when given, lends its optimizer and quantizer) on
 * `world` GPUs of the profile named by plan.hardware (hw left zeroed with *have_hw 0 when it is
 * empty: memory only). CT_OK, or a status with the error set. */
struct session;
ct_status plan_for_run(int argc, char **argv, const char *usage, ct_status (*prepare)(manifest *mf), int world,
                       const struct session *run, plan_result *r, hw_profile *hw, int *have_hw);

/* The guide's rule for a model of n_params: its text and the layout it names for `gpus`. */
const char *plan_guide_rule(double n_params, int gpus, int gpus_per_node, plan_layout *rule_layout);

#endif
