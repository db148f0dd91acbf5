/* ops_ew.c: the CUDA plugin's elementwise ops of ABI 2.1 (device.h's ew_*): the launchers of
 * kernels_ew.cu (the host checked the arguments: core/host/devcheck.c).
 */
#include "cuda_device.h"

#include <stdint.h>

/* The device entered for an ew_* op: CT_OK with n > 0 means the op may launch. */
static ct_status ew_begin(cuda_device *d, const char *op, int64_t n)
{
    return n == 0 ? CT_OK : cuda_enter(d, op);
}

static ct_status ew_end(cuda_device *d, const char *op, cudaError_t e)
{
    return e == cudaSuccess ? CT_OK : cuda_error(d, op, "kernel launch", e);
}

ct_status cuda_ew_axpby(ct_device *d, float *out, float alpha, const float *x, float beta, const float *y,
                        int64_t n)
{
    ct_status st = ew_begin(d, "ew_axpby", n);
    if (st != CT_OK || n == 0)
        return st;
    return ew_end(d, "ew_axpby", cuk_ew_axpby(&d->env, out, alpha, x, beta, y, n));
}

ct_status cuda_ew_mul(ct_device *d, float *out, const float *x, const float *y, int64_t n)
{
    ct_status st = ew_begin(d, "ew_mul", n);
    if (st != CT_OK || n == 0)
        return st;
    return ew_end(d, "ew_mul", cuk_ew_mul(&d->env, out, x, y, n));
}

ct_status cuda_ew_div(ct_device *d, float *out, const float *x, const float *y, float eps, int64_t n)
{
    ct_status st = ew_begin(d, "ew_div", n);
    if (st != CT_OK || n == 0)
        return st;
    return ew_end(d, "ew_div", cuk_ew_div(&d->env, out, x, y, eps, n));
}

ct_status cuda_ew_sqrt(ct_device *d, float *out, const float *x, int64_t n)
{
    ct_status st = ew_begin(d, "ew_sqrt", n);
    if (st != CT_OK || n == 0)
        return st;
    return ew_end(d, "ew_sqrt", cuk_ew_sqrt(&d->env, out, x, n));
}

ct_status cuda_ew_sign(ct_device *d, float *out, const float *x, int64_t n)
{
    ct_status st = ew_begin(d, "ew_sign", n);
    if (st != CT_OK || n == 0)
        return st;
    return ew_end(d, "ew_sign", cuk_ew_sign(&d->env, out, x, n));
}

ct_status cuda_ew_clamp(ct_device *d, float *out, const float *x, float lo, float hi, int64_t n)
{
    ct_status st = ew_begin(d, "ew_clamp", n);
    if (st != CT_OK || n == 0)
        return st;
    return ew_end(d, "ew_clamp", cuk_ew_clamp(&d->env, out, x, lo, hi, n));
}

ct_status cuda_ew_greater(ct_device *d, float *out, const float *x, const float *y, int64_t n)
{
    ct_status st = ew_begin(d, "ew_greater", n);
    if (st != CT_OK || n == 0)
        return st;
    return ew_end(d, "ew_greater", cuk_ew_greater(&d->env, out, x, y, n));
}
