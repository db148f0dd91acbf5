/* ctitan/quantizer.h: the quantizer interface (plugin kind CT_KIND_QUANTIZER).
 *
 * A quantizer owns the GEMMs of the linear layers it converts: forward (x W^T), input gradient
 * (dY W) and weight gradient (dY^T X). It casts the operands per its recipe (scales, formats) and
 * runs them with the device's ops; layers it does not convert stay in high precision. The host asks
 * `converts` once per linear weight at start-up and reports the list. From ABI 2.24 a quantizer may
 * also own the MoE experts' grouped GEMMs (grouped_forward and its two backward halves).
 *
 * Accumulation: backward halves ADD into dx and dw, like every device backward op.
 */
#ifndef CTITAN_QUANTIZER_H
#define CTITAN_QUANTIZER_H

#include "ctitan/abi.h"
#include "ctitan/device.h"
#include "ctitan/host.h"
#include "ctitan/tensor.h"

/* ABI 2.2: what one converted linear costs per microbatch, for the planner (plan_linear). */
typedef struct ct_quant_cost {
    size_t struct_size;
    int gemm_dtype;        /* ct_dtype the three GEMMs run at (CT_F8_E4M3: the device's fp8 rate) */
    double saved_bytes;    /* bytes kept from forward for backward, beyond the host's own input x */
    double weight_bytes;   /* bytes kept per weight between steps (cached casts), 0 if none */
    double scratch_bytes;  /* peak temporaries during one of the GEMMs */
    double cast_bytes[2];  /* memory traffic of the casts and scales: [0] forward, [1] backward */
} ct_quant_cost;

typedef struct ct_quantizer_api {
    size_t struct_size;
    /* Reads the plugin's options (the recipe); an unknown recipe is CT_ERR_INVALID with a hint.
     * dapi and dev are the host's and outlive the quantizer; *q is the host's until destroy. */
    ct_status (*create)(const ct_host *host, const ct_device_api *dapi, ct_device *dev, ct_quantizer **q);
    void (*destroy)(ct_quantizer *q);
    /* 1 when this linear weight (out, in) is converted; *why gets a short reason when it is not,
     * a string the quantizer owns and keeps valid until destroy. */
    int (*converts)(ct_quantizer *q, const ct_tensor *weight, const char **why);
    /* y (n, out) = x (n, in) @ w (out, in)^T */
    ct_status (*forward)(ct_quantizer *q, float *y, const float *x, const float *w, int64_t n, int64_t out,
                         int64_t in);
    /* dx (n, in) += dy (n, out) @ w (out, in) */
    ct_status (*backward_input)(ct_quantizer *q, float *dx, const float *dy, const float *w, int64_t n,
                                int64_t out, int64_t in);
    /* dw (out, in) += dy (n, out)^T @ x (n, in) */
    ct_status (*backward_weight)(ct_quantizer *q, float *dw, const float *dy, const float *x, int64_t n,
                                 int64_t out, int64_t in);
    /* ---- ABI 2.2, optional ---- */
    /* For the planner: the costs of the linear `weight` (out, in) that converts() accepted, with n
     * tokens. May be called on an instance made with dapi and dev NULL (planning): it must then
     * not touch the device. NULL: the planner assumes f32 GEMMs and no extra memory, and says so. */
    ct_status (*plan_linear)(ct_quantizer *q, const ct_tensor *weight, int64_t n, ct_quant_cost *cost);
    /* ---- ABI 2.19, optional ---- */
    /* 1 when a data-parallel strategy gathers the weights this quantizer converts (CT_TENSOR_QUANTIZED)
     * as e4m3 with tensor-wide scales from one all-reduced amax (torchao's float8 all-gather for FSDP:
     * ct_strategy_env.fp8_all_gather), as the quantizer's own options ask; the quantizer refuses at
     * create a recipe that cannot run from such weights. NULL or 0: gathered in the compute dtype. */
    int (*gather_quantized)(ct_quantizer *q);
    /* ---- ABI 2.24, optional: the experts' grouped GEMMs (all three or none) ----
     * The device's grouped_matmul ops (device.h, ABI 2.14) through the quantizer: w (e, o, i) holds
     * expert g's (o, i) weight, rows offsets[g] .. offsets[g+1] of the (m, .) activations are expert
     * g's segment, offsets (e+1) int32 in device memory (non-decreasing, within [0, m]; offsets that
     * are not: CT_ERR_INVALID with a message). A segment may be empty. Rows in no segment are not
     * read, and y's are not written. A quantizer that sets these is also asked converts() on each
     * 3-D experts weight (e, o, i) at first use, and plan_linear() with it (n: the m rows of all
     * segments together); one that leaves them NULL is asked about 2-D linear weights only. */
    /* y segment g (rows, o) = x_g (rows, i) @ w_g (o, i)^T */
    ct_status (*grouped_forward)(ct_quantizer *q, float *y, const float *x, const float *w, const int32_t *offsets,
                                 int64_t m, int64_t e, int64_t o, int64_t i);
    /* dx_g (rows, i) += dy_g (rows, o) @ w_g (o, i) */
    ct_status (*grouped_backward_input)(ct_quantizer *q, float *dx, const float *dy, const float *w,
                                        const int32_t *offsets, int64_t m, int64_t e, int64_t o, int64_t i);
    /* dw_g (o, i) += dy_g (rows, o)^T @ x_g (rows, i); an expert with no row adds nothing */
    ct_status (*grouped_backward_weight)(ct_quantizer *q, float *dw, const float *dy, const float *x,
                                         const int32_t *offsets, int64_t m, int64_t e, int64_t o, int64_t i);
} ct_quantizer_api;

#endif
