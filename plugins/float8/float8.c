/* float8.c: float8 training recipes as a quantizer plugin, following torchao.
 *
 *   tensorwise          per-tensor dynamic scales from amax; e4m3 inputs and weights, e5m2 gradients
 *   e4m3 / e5m2         tensorwise with that format for every operand
 *   rowwise             e4m3, one scale per row along each GEMM's reduction dimension, powers of two
 *   rowwise_with_gw_hp  rowwise, but the weight-gradient GEMM in high precision
 *   mxfp8               e4m3 in blocks of 32 along the reduction dimension, E8M0 (power-of-two) scales
 *
 * Each GEMM operand is cast to the fp8 grid with the device's quantize/dequantize ops and the GEMM
 * runs in f32 on the dequantised values: on the CPU this is the exact emulation of an fp8 GEMM with
 * f32 accumulation (up to summation order); a GPU device could run its scaled matmul instead.
 */
#include "ctitan/quantizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enum recipe { R_TENSORWISE, R_E4M3, R_E5M2, R_ROWWISE, R_ROWWISE_GW_HP, R_MXFP8 } recipe;
static const char *const recipe_names[] = {"tensorwise", "e4m3", "e5m2", "rowwise", "rowwise_with_gw_hp", "mxfp8"};
#define N_RECIPES 6

typedef struct buf {
    void *p;
    size_t cap;
} buf;

typedef struct f8 {
    const ct_host *host;
    const ct_device_api *d;
    void *dev;
    recipe r;
    const char *filter; /* comma-separated substrings of weight names left in high precision */
    buf a, b, t, q8, sc; /* scratch: two dequantised operands, a transpose, fp8 bytes, scales */
    float *host_amax;
    size_t host_cap;
} f8;

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "enable", CT_OPT_BOOL, "false", "train the converted linear layers in float8"},
    {sizeof(ct_option_spec), "format", CT_OPT_STRING, "tensorwise",
     "tensorwise | rowwise | rowwise_with_gw_hp | mxfp8 | e4m3 | e5m2"},
    {sizeof(ct_option_spec), "filter_fqns", CT_OPT_STRING, "output",
     "comma-separated substrings: linear weights whose name contains one stay in high precision"},
    {0, NULL, 0, NULL, NULL},
};

static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b), prev[64], cur[64];
    if (la > 62 || lb > 62) return 99;
    for (size_t j = 0; j <= lb; j++) prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]), del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(size_t) * (lb + 1));
    }
    return prev[lb];
}

static ct_status f8_create(const ct_host *h, const ct_device_api *d, void *dev, void **out) {
    const char *fmt = "tensorwise", *filter = "output";
    h->opt_string(h, "format", &fmt);
    h->opt_string(h, "filter_fqns", &filter);
    int r = -1;
    for (int i = 0; i < N_RECIPES; i++)
        if (!strcmp(fmt, recipe_names[i])) r = i;
    if (!strcmp(fmt, "mxfp8_cublas") || !strcmp(fmt, "mxfp8_cublas_rceil") || !strcmp(fmt, "mxfp8_rceil"))
        r = R_MXFP8; /* torchao's MX recipe names */
    if (r < 0) {
        const char *best = recipe_names[0];
        size_t bd = 99;
        for (int i = 0; i < N_RECIPES; i++) { /* the closest known name, for the hint */
            size_t dd = edit_distance(fmt, recipe_names[i]);
            if (dd < bd) {
                bd = dd;
                best = recipe_names[i];
            }
        }
        h->set_error(h, "unknown float8 format '%s'%s%s%s (known: tensorwise, rowwise, rowwise_with_gw_hp, mxfp8, e4m3, "
                        "e5m2)", fmt, bd <= 2 ? "; did you mean '" : "", bd <= 2 ? best : "", bd <= 2 ? "'?" : "");
        return CT_ERR_INVALID;
    }
    if (!CT_HAS_FIELD(d, ct_device_api, transpose) || !d->amax || !d->quantize_fp8 || !d->dequantize_fp8 ||
        !d->transpose) {
        h->set_error(h, "the device has no float8 ops (amax, quantize_fp8, dequantize_fp8, transpose: ABI 1.2)");
        return CT_ERR_UNSUPPORTED;
    }
    f8 *q = calloc(1, sizeof *q);
    if (!q) return CT_ERR_NOMEM;
    *q = (f8){.host = h, .d = d, .dev = dev, .r = (recipe)r, .filter = filter};
    *out = q;
    return CT_OK;
}

static void buf_free(f8 *q, buf *b) {
    if (!b->p) return;
    q->d->free(q->dev, b->p);
    q->host->mem_account(q->host, CT_MEM_OTHER, -(int64_t)b->cap);
    b->p = NULL;
    b->cap = 0;
}

static void f8_destroy(void *p) {
    f8 *q = p;
    if (!q) return;
    buf_free(q, &q->a);
    buf_free(q, &q->b);
    buf_free(q, &q->t);
    buf_free(q, &q->q8);
    buf_free(q, &q->sc);
    free(q->host_amax);
    free(q);
}

/* A grow-only device scratch buffer. */
static void *need(f8 *q, buf *b, size_t bytes) {
    if (b->cap >= bytes) return b->p;
    buf_free(q, b);
    if (q->d->alloc(q->dev, bytes, &b->p) != CT_OK) {
        q->host->set_error(q->host, "cannot allocate %zu bytes of float8 scratch", bytes);
        b->p = NULL;
        return NULL;
    }
    b->cap = bytes;
    q->host->mem_account(q->host, CT_MEM_OTHER, (int64_t)bytes);
    return b->p;
}

static int f8_converts(void *p, const ct_tensor *w, const char **why) {
    f8 *q = p;
    const char *name = w->name ? w->name : "";
    for (const char *f = q->filter; *f;) {
        size_t len = strcspn(f, ",");
        char pat[128];
        if (len && len < sizeof pat) {
            memcpy(pat, f, len);
            pat[len] = 0;
            if (strstr(name, pat)) {
                *why = "filter_fqns";
                return 0;
            }
        }
        f += len + (f[len] == ',');
    }
    int64_t mult = q->r == R_MXFP8 ? 32 : 16;
    if (w->ndim != 2 || w->shape[0] % mult || w->shape[1] % mult) {
        *why = q->r == R_MXFP8 ? "dims not multiples of 32" : "dims not multiples of 16";
        return 0;
    }
    return 1;
}

#define TRY(x)                                  \
    do {                                        \
        ct_status st_ = (x);                    \
        if (st_ != CT_OK) return st_;           \
    } while (0)

static float fmt_max(ct_dtype fmt) { return fmt == CT_F8_E5M2 ? 57344.0f : 448.0f; }

/* dst (rows, cols) = src cast to the fp8 grid and back, with one scale per group of `group`
 * consecutive elements (group = rows*cols: tensor-wide). pow2: scales rounded down to powers of two;
 * mx: E8M0 block scales (2^(emax - floor(log2 amax))). */
static ct_status fake_quant(f8 *q, float *dst, const float *src, int64_t n, int64_t group, ct_dtype fmt, int pow2,
                            int mx) {
    int64_t ng = n / group;
    float *scales = need(q, &q->sc, sizeof(float) * (size_t)ng);
    uint8_t *bytes = need(q, &q->q8, (size_t)n);
    if (!scales || !bytes) return CT_ERR_NOMEM;
    if ((size_t)ng > q->host_cap) {
        float *h = realloc(q->host_amax, sizeof(float) * (size_t)ng);
        if (!h) return CT_ERR_NOMEM;
        q->host_amax = h;
        q->host_cap = (size_t)ng;
    }
    TRY(q->d->amax(q->dev, scales, src, n, group));
    TRY(q->d->copy(q->dev, q->host_amax, scales, sizeof(float) * (size_t)ng, CT_COPY_D2H));
    float maxv = fmt_max(fmt);
    for (int64_t g = 0; g < ng; g++) {
        float amax = q->host_amax[g], s;
        if (mx) { /* E8M0: shared exponent floor(log2 amax) - emax(e4m3) = 8; a zero block takes 1 */
            s = amax > 0 && isfinite(amax) ? ldexpf(1.0f, 8 - ilogbf(amax)) : isnan(amax) ? NAN : 1.0f;
        } else if (isnan(amax)) {
            s = NAN; /* torchao: a NaN anywhere makes the scale NaN, and so the group's values */
        } else {
            s = maxv / fmaxf(amax, 1e-12f); /* torchao amax_to_scale (an inf amax gives 0) */
            if (pow2 && s > 0) s = exp2f(floorf(log2f(s))); /* as torchao rounds, in f32 */
        }
        q->host_amax[g] = s;
    }
    TRY(q->d->copy(q->dev, scales, q->host_amax, sizeof(float) * (size_t)ng, CT_COPY_H2D));
    TRY(q->d->quantize_fp8(q->dev, bytes, src, scales, n, group, fmt));
    TRY(q->d->dequantize_fp8(q->dev, dst, bytes, scales, n, group, fmt));
    return CT_OK;
}

/* An operand (rows, cols) whose GEMM reduction runs along dim `red` (1: along rows' contiguous cols,
 * 0: down the columns), cast per the recipe into dst laid out like src. */
static ct_status cast_operand(f8 *q, float *dst, const float *src, int64_t rows, int64_t cols, int red, ct_dtype fmt) {
    int64_t n = rows * cols;
    switch (q->r) {
    case R_TENSORWISE:
    case R_E4M3:
    case R_E5M2: return fake_quant(q, dst, src, n, n, fmt, 0, 0);
    default: break;
    }
    int mx = q->r == R_MXFP8;
    int64_t red_len = red ? cols : rows;
    int64_t group = mx ? 32 : red_len;
    if (mx && red_len % 32) {
        q->host->set_error(q->host, "mxfp8: the reduction dimension (%lld) is not a multiple of 32", (long long)red_len);
        return CT_ERR_UNSUPPORTED;
    }
    if (red) return fake_quant(q, dst, src, n, group, CT_F8_E4M3, !mx, mx);
    /* groups run down the columns: cast the transpose, then transpose back */
    float *t = need(q, &q->t, sizeof(float) * (size_t)n);
    if (!t) return CT_ERR_NOMEM;
    TRY(q->d->transpose(q->dev, t, src, rows, cols));
    TRY(fake_quant(q, t, t, n, group, CT_F8_E4M3, !mx, mx));
    return q->d->transpose(q->dev, dst, t, cols, rows);
}

static ct_dtype fmt_in(f8 *q) { return q->r == R_E5M2 ? CT_F8_E5M2 : CT_F8_E4M3; }
static ct_dtype fmt_grad(f8 *q) { return q->r == R_E4M3 ? CT_F8_E4M3 : q->r == R_TENSORWISE || q->r == R_E5M2 ? CT_F8_E5M2 : CT_F8_E4M3; }

static ct_status f8_forward(void *p, float *y, const float *x, const float *w, int64_t n, int64_t out, int64_t in) {
    f8 *q = p;
    float *xq = need(q, &q->a, sizeof(float) * (size_t)(n * in)), *wq = need(q, &q->b, sizeof(float) * (size_t)(out * in));
    if (!xq || !wq) return CT_ERR_NOMEM;
    TRY(cast_operand(q, xq, x, n, in, 1, fmt_in(q)));
    TRY(cast_operand(q, wq, w, out, in, 1, fmt_in(q)));
    return q->d->matmul(q->dev, y, xq, wq, n, out, in, 0, 1, 1.0f, 0.0f);
}

static ct_status f8_backward_input(void *p, float *dx, const float *dy, const float *w, int64_t n, int64_t out,
                                   int64_t in) {
    f8 *q = p;
    float *gq = need(q, &q->a, sizeof(float) * (size_t)(n * out)), *wq = need(q, &q->b, sizeof(float) * (size_t)(out * in));
    if (!gq || !wq) return CT_ERR_NOMEM;
    TRY(cast_operand(q, gq, dy, n, out, 1, fmt_grad(q))); /* reduction over out: along dy's rows */
    if (q->r == R_ROWWISE_GW_HP) /* torchao: this recipe scales w tensor-wide (power of two) for grad_input */
        TRY(fake_quant(q, wq, w, out * in, out * in, CT_F8_E4M3, 1, 0));
    else
        TRY(cast_operand(q, wq, w, out, in, 0, fmt_in(q))); /* and down w's columns */
    return q->d->matmul(q->dev, dx, gq, wq, n, in, out, 0, 0, 1.0f, 1.0f);
}

static ct_status f8_backward_weight(void *p, float *dw, const float *dy, const float *x, int64_t n, int64_t out,
                                    int64_t in) {
    f8 *q = p;
    if (q->r == R_ROWWISE_GW_HP) return q->d->matmul(q->dev, dw, dy, x, out, in, n, 1, 0, 1.0f, 1.0f);
    float *gq = need(q, &q->a, sizeof(float) * (size_t)(n * out)), *xq = need(q, &q->b, sizeof(float) * (size_t)(n * in));
    if (!gq || !xq) return CT_ERR_NOMEM;
    TRY(cast_operand(q, gq, dy, n, out, 0, fmt_grad(q))); /* reduction over n: down the columns */
    TRY(cast_operand(q, xq, x, n, in, 0, fmt_in(q)));
    return q->d->matmul(q->dev, dw, gq, xq, out, in, n, 1, 0, 1.0f, 1.0f);
}

static const ct_quantizer_api api = {
    .struct_size = sizeof(ct_quantizer_api),
    .create = f8_create,
    .destroy = f8_destroy,
    .converts = f8_converts,
    .forward = f8_forward,
    .backward_input = f8_backward_input,
    .backward_weight = f8_backward_weight,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_QUANTIZER;
    info->name = "float8";
    info->description = "float8 linear layers: tensorwise, rowwise, rowwise_with_gw_hp, mxfp8, e4m3, e5m2 (torchao recipes)";
    info->options = options;
    info->api = &api;
    return CT_OK;
}
