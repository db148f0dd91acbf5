/* ctitan/quantizer.h: the quantizer interface (plugin kind CT_KIND_QUANTIZER).
 *
 * A quantizer owns the GEMMs of the linear layers it converts: forward (x W^T), input gradient
 * (dY W) and weight gradient (dY^T X). It casts the operands per its recipe (scales, formats) and
 * runs them with the device's ops; layers it does not convert stay in high precision. The host asks
 * `converts` once per linear weight at start-up and reports the list.
 *
 * Accumulation: backward halves ADD into dx and dw, like every device backward op.
 */
#ifndef CTITAN_QUANTIZER_H
#define CTITAN_QUANTIZER_H

#include "ctitan/abi.h"
#include "ctitan/device.h"
#include "ctitan/host.h"
#include "ctitan/tensor.h"

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
} ct_quantizer_api;

#endif
