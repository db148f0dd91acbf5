/* plan_internal.h: what the tape and the planner's own files share (not part of `ctitan plan`'s
 * interface, plan.h). */
#ifndef CT_PLAN_INTERNAL_H
#define CT_PLAN_INTERNAL_H

#include "ctitan/device.h"
#include "engine/runtime.h"
#include "engine/tape.h"
#include "plan/plan.h"

/* The device the planner runs the tape on: computes nothing, allocates address space only. */
extern const ct_device_api plan_null_device;
ct_device *plan_null_handle(void);
extern double plan_null_zeroed; /* bytes zeroed on it so far (activation gradients) */

/* The tape's observer on a planning runtime (engine/observer.h): the functions below. */
extern const rt_observer plan_observer;

/* Called by the tape on a planning runtime while rt->trace_ops is set (1: the traced forward pass;
 * 2: the traced backward pass, recomputes included). Each returns CT_OK, or a status with the error set
 * (CT_ERR_NOMEM for the trace; the status of a linear's GEMMs' plan: the quantizer's plan_linear). */
ct_status plan_note_op(runtime *rt, int kind, int64_t s0, int64_t s1, int64_t s2, int64_t s3, int kv_heads,
                       int sac_keep);
ct_status plan_note_linear(runtime *rt, const rt_tensor *w, int64_t n, int64_t in, int64_t out, const tape_gemm *g,
                           int sac_keep);
/* A collective the tape would run now (bytes: the whole gathered or reduced buffer). */
ct_status plan_note_comm(runtime *rt, int axis, ct_collective kind, double bytes, int overlapped);
/* A custom op on a planning builder: its plan callback instead of forward, its costs noted. */
ct_status plan_custom(runtime *rt, const ct_custom_op *op, void *state, ct_tensor *const *in, int n_in, ct_tensor **out,
                      int n_out);

/* The plugins' search knobs (knobs.c): each setting's value "", its values "a|b" beside it. */
struct plugin;
typedef struct plan_knob_table {
    plan_setting k[PLAN_MAX_KNOBS];
    char values[PLAN_MAX_KNOBS][256];
    const char *vp[PLAN_MAX_KNOBS]; /* values[i], for plan_knobs */
    int n;
    char dropped[200]; /* a knob past PLAN_MAX_KNOBS, left out ("" none) */
} plan_knob_table;
void plan_knobs_add(plan_knob_table *t, const struct plugin *p, const char *section, int axis, int quantizer,
                    const char *enable_key);
/* The quantizer's settings of l as one string ("key=value;..."), to tell when to create it again. */
void plan_knobs_quant_signature(const plan_layout *l, char *out, size_t len);

/* Per-trace state the notes need: the GEMM dtype of an unconverted linear, the float8 bytes. */
typedef struct plan_trace_state {
    int matmul_dtype;        /* PLAN_F32 or PLAN_BF16 */
    double float8_saved;     /* the quantizer's saved bytes per microbatch, all units */
    double float8_weights;   /* its cached weight casts */
    double float8_scratch;   /* its largest GEMM temporaries */
    char assumptions[512];
} plan_trace_state;

#endif
