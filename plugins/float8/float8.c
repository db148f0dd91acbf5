/* float8.c: float8 training recipes as a quantizer plugin, following torchao.
 *
 *   tensorwise          per-tensor dynamic scales from amax; e4m3 inputs and weights, e5m2 gradients
 *   e4m3 / e5m2         tensorwise with that format for every operand
 *   rowwise             e4m3, one scale per row along each GEMM's reduction dimension, powers of two
 *   rowwise_with_gw_hp  rowwise, but the weight-gradient GEMM in high precision
 *   mxfp8               e4m3 in blocks of 32 along the reduction dimension, E8M0 (power-of-two) scales
 *
 * Tensor-wide recipes (tensorwise, e4m3, e5m2) run each GEMM on the device's scaled fp8 matmul
 * (ABI 1.4 matmul_fp8: cuBLASLt's fp8 GEMM on a GPU, dequantise + sgemm on the CPU), row-wise ones
 * on its row-scaled twin (matmul_fp8_rows: cuBLASLt's outer-vector scaling): both operands
 * quantised k-contiguous, so the input-gradient GEMM takes w transposed and the weight-gradient
 * GEMM takes dy and x transposed (as torchao's float8 linear does). A start-up probe decides: a
 * device without the op, or one that refuses the recipe's format pairs (cuBLASLt has no e5m2 x
 * e5m2), emulates, and says so once.
 *
 * The MoE experts' grouped GEMMs (ABI 2.24; weights named in grouped_mm_fqns, torchtitan's
 * quantize.grouped_mm.*) follow torchao's float8 grouped GEMM: e4m3 for every operand; rowwise scales
 * along each GEMM's reduction, so the forward scales x per token and w per expert output channel, the
 * input gradient dy per token and w per expert input column, and the weight gradient, whose reduction
 * runs over an expert's tokens, dy and x per column within each expert's segment (mxfp8: blocks of 32
 * along the same dimensions, a segment's tail block zero-padded as torchtitan pads token groups). They
 * are emulated (casts, then the device's f32 grouped GEMM): no device op multiplies fp8 per segment.
 * The weight gradient needs the segments' bounds on the host: one copy of the e+1 offsets, the same
 * round trip the scales make.
 *
 * Emulation (MXFP8's 32-element blocks everywhere, and the fallback above): each operand
 * is cast to the fp8 grid with the device's quantize/dequantize ops and the GEMM runs in f32 on
 * the dequantised values, the exact emulation of an fp8 GEMM with f32 accumulation (up to
 * summation order).
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

typedef struct ct_quantizer { /* the ABI's opaque ct_quantizer */
    const ct_host *host;
    const ct_device_api *d;
    ct_device *dev;
    recipe r;
    const char *filter; /* comma-separated substrings of weight names left in high precision */
    buf a, b, t, q8, sc; /* scratch: two dequantised operands, a transpose, fp8 bytes, scales */
    buf q8b, s2;         /* the device GEMM's second fp8 operand, and its two tensor-wide scales */
    buf pad;             /* mxfp8 grouped: an expert segment padded to whole blocks of 32 rows */
    recipe gr;           /* the experts' recipe: R_ROWWISE or R_MXFP8 */
    const char *grouped; /* comma-separated substrings of experts weight names converted ("": none) */
    int linears;         /* 0: only the experts are converted */
    int grouped_noted;   /* the log line about the grouped GEMMs was written */
    int32_t *host_off;   /* the offsets read back for the weight gradient */
    size_t off_cap;
    int device_gemm;     /* the start-up probe found matmul_fp8 running this recipe's format pairs */
    int probed;          /* the probe ran a GEMM: its small buffers stay in the scratch */
    float *host_amax;
    size_t host_cap;
    int gather_fp8; /* enable_fsdp_float8_all_gather, under the tensorwise recipe */
} f8;

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "enable", CT_OPT_BOOL, "false", "train the converted linear layers in float8", NULL, NULL},
    {sizeof(ct_option_spec), "format", CT_OPT_STRING, "tensorwise",
     "tensorwise | rowwise | rowwise_with_gw_hp | mxfp8 | e4m3 | e5m2", NULL,
     "tensorwise|rowwise|rowwise_with_gw_hp|mxfp8|e4m3|e5m2|mxfp8_cublas|mxfp8_cublas_rceil|mxfp8_rceil"},
    {sizeof(ct_option_spec), "emulate", CT_OPT_BOOL, "false",
     "torchao's emulate: fp8 casts with f32 GEMMs even where the device has a scaled fp8 matmul", NULL, NULL},
    {sizeof(ct_option_spec), "filter_fqns", CT_OPT_STRING, "output",
     "comma-separated substrings: linear weights whose name contains one stay in high precision", NULL, NULL},
    {sizeof(ct_option_spec), "linears", CT_OPT_BOOL, "true",
     "convert the linear layers (false: only the experts grouped_mm_fqns names, as torchtitan's converters list "
     "with only quantize.grouped_mm.*)", NULL, NULL},
    {sizeof(ct_option_spec), "grouped_mm_fqns", CT_OPT_STRING, "",
     "comma-separated substrings: the MoE experts weights (e, o, i) whose name contains one run their grouped GEMMs "
     "in float8 (torchtitan's quantize.grouped_mm.float8.fqns, e.g. experts); empty: none", NULL, NULL},
    {sizeof(ct_option_spec), "grouped_mm_recipe", CT_OPT_STRING, "rowwise",
     "the experts' recipe: rowwise (e4m3, power-of-two scales per row along each GEMM's reduction) or mxfp8 "
     "(torchtitan's quantize.grouped_mm.mx)", NULL, "rowwise|mxfp8"},
    {sizeof(ct_option_spec), "enable_fsdp_float8_all_gather", CT_OPT_BOOL, "false",
     "FSDP gathers the converted weights in float8 (tensorwise only: e4m3 with one all-reduced amax per "
     "weight, half the bytes of bf16); no effect while enable is false", NULL, NULL},
    {0},
};

/* What a planner's search may vary (ABI 2.21): whether to convert at all, and the two recipes with a
 * scaled GEMM on every FP8 device (the mx formats need Blackwell's). */
static const ct_search_knob knobs[] = {
    {sizeof(ct_search_knob), "enable", "false|true", NULL},
    {sizeof(ct_search_knob), "format", "tensorwise|rowwise", NULL},
    {0},
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

static void f8_destroy(ct_quantizer *p);
static ct_status probe_device_gemm(f8 *q);
static int tensorwise(const f8 *q);
static int rowwise(const f8 *q);

/* The experts' options: grouped_mm_recipe, grouped_mm_fqns, linears into q. */
static ct_status grouped_options(const ct_host *h, f8 *q) {
    const char *gr = "rowwise";
    q->grouped = "";
    q->linears = 1;
    h->opt_string(h, "grouped_mm_recipe", &gr);
    h->opt_string(h, "grouped_mm_fqns", &q->grouped);
    h->opt_bool(h, "linears", &q->linears);
    if (strcmp(gr, "rowwise") && strcmp(gr, "mxfp8")) {
        h->set_error(h, "grouped_mm_recipe: unknown '%s' (known: rowwise, mxfp8)", gr);
        return CT_ERR_INVALID;
    }
    q->gr = strcmp(gr, "mxfp8") ? R_ROWWISE : R_MXFP8;
    return CT_OK;
}

static ct_status f8_create(const ct_host *h, const ct_device_api *d, ct_device *dev, ct_quantizer **out) {
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
    int gather = 0;
    h->opt_bool(h, "enable_fsdp_float8_all_gather", &gather);
    if (gather && r != R_TENSORWISE) {
        if (d) { /* a run; a planning instance (the search trying another recipe) gathers in high precision */
            h->set_error(h, "enable_fsdp_float8_all_gather needs the tensorwise format, not '%s' (as in torchao)", fmt);
            return CT_ERR_INVALID;
        }
        gather = 0;
    }
    if (!d) { /* a planning instance (plan_linear only): the device's GEMM is assumed where the recipe has one */
        f8 *q = calloc(1, sizeof *q);
        if (!q) return CT_ERR_NOMEM;
        int emulate = 0;
        h->opt_bool(h, "emulate", &emulate);
        *q = (f8){.host = h, .r = (recipe)r, .filter = filter, .gather_fp8 = gather};
        q->device_gemm = q->probed = !emulate && (tensorwise(q) || rowwise(q));
        ct_status st = grouped_options(h, q);
        if (st != CT_OK) {
            free(q);
            return st;
        }
        *out = q;
        return CT_OK;
    }
    if (!CT_HAS_FIELD(d, ct_device_api, transpose) || !d->amax || !d->quantize_fp8 || !d->dequantize_fp8 ||
        !d->transpose) {
        h->set_error(h, "the device has no float8 ops (amax, quantize_fp8, dequantize_fp8, transpose: ABI 1.2)");
        return CT_ERR_UNSUPPORTED;
    }
    f8 *q = calloc(1, sizeof *q);
    if (!q) return CT_ERR_NOMEM;
    *q = (f8){.host = h, .d = d, .dev = dev, .r = (recipe)r, .filter = filter, .gather_fp8 = gather};
    ct_status st = grouped_options(h, q);
    if (st == CT_OK && q->linears) st = probe_device_gemm(q); /* experts only: no linear GEMM to probe for */
    if (st != CT_OK) {
        f8_destroy(q);
        return st;
    }
    *out = q;
    return CT_OK;
}

static void buf_free(f8 *q, buf *b) {
    if (!b->p) return; /* a planning instance (no device) never holds one */
    q->d->free(q->dev, b->p);
    q->host->mem_account(q->host, CT_MEM_OTHER, -(int64_t)b->cap);
    b->p = NULL;
    b->cap = 0;
}

static void f8_destroy(ct_quantizer *p) {
    f8 *q = p;
    if (!q) return;
    buf_free(q, &q->a);
    buf_free(q, &q->b);
    buf_free(q, &q->t);
    buf_free(q, &q->q8);
    buf_free(q, &q->sc);
    buf_free(q, &q->q8b);
    buf_free(q, &q->s2);
    buf_free(q, &q->pad);
    free(q->host_amax);
    free(q->host_off);
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

/* 1 when name contains one of the comma-separated substrings in list. */
static int names_match(const char *list, const char *name) {
    for (const char *f = list; *f;) {
        size_t len = strcspn(f, ",");
        char pat[128];
        if (len && len < sizeof pat) {
            memcpy(pat, f, len);
            pat[len] = 0;
            if (strstr(name, pat)) return 1;
        }
        f += len + (f[len] == ',');
    }
    return 0;
}

/* An experts weight (e, o, i): converted when grouped_mm_fqns names it and o, i suit the recipe
 * (torchao's float8 grouped GEMM wants both multiples of 16; MX blocks of 32). */
static int converts_experts(const f8 *q, const ct_tensor *w, const char *name, const char **why) {
    if (!names_match(q->grouped, name)) {
        *why = "not in grouped_mm_fqns";
        return 0;
    }
    int64_t mult = q->gr == R_MXFP8 ? 32 : 16;
    if (w->shape[1] % mult || w->shape[2] % mult) {
        *why = q->gr == R_MXFP8 ? "expert dims not multiples of 32" : "expert dims not multiples of 16";
        return 0;
    }
    return 1;
}

static int f8_converts(ct_quantizer *p, const ct_tensor *w, const char **why) {
    f8 *q = p;
    const char *name = w->name ? w->name : "";
    if (w->ndim == 3) return converts_experts(q, w, name, why);
    if (!q->linears) {
        *why = "linears: false";
        return 0;
    }
    if (names_match(q->filter, name)) {
        *why = "filter_fqns";
        return 0;
    }
    int64_t mult = q->r == R_MXFP8 ? 32 : 16;
    if (w->ndim != 2 || w->shape[0] % mult || w->shape[1] % mult) {
        *why = q->r == R_MXFP8 ? "dims not multiples of 32" : "dims not multiples of 16";
        return 0;
    }
    return 1;
}

static float fmt_max(ct_dtype fmt) { return fmt == CT_F8_E5M2 ? 57344.0f : 448.0f; }

/* The host buffer of amaxes and scales, grown to hold n floats; nonzero when memory ran out. */
static int host_need(f8 *q, int64_t n) {
    if ((size_t)n <= q->host_cap) return 0;
    float *h = realloc(q->host_amax, sizeof(float) * (size_t)n);
    if (!h) return 1;
    q->host_amax = h;
    q->host_cap = (size_t)n;
    return 0;
}

/* scales (n / group, device) for src per the recipe's rule, from the device's amax:
 * tensor- and row-wise: torchao's max / amax (pow2: rounded down to a power of two); mx: E8M0
 * block scales (2^(emax - floor(log2 amax))). */
static ct_status compute_scales(f8 *q, float *scales, const float *src, int64_t n, int64_t group, ct_dtype fmt,
                                int pow2, int mx) {
    int64_t ng = n / group;
    if (host_need(q, ng)) return CT_ERR_NOMEM;
    ct_status st = q->d->amax(q->dev, scales, src, n, group);
    if (st != CT_OK) return st;
    st = q->d->copy(q->dev, q->host_amax, scales, sizeof(float) * (size_t)ng, CT_COPY_D2H);
    if (st != CT_OK) return st;
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
    return q->d->copy(q->dev, scales, q->host_amax, sizeof(float) * (size_t)ng, CT_COPY_H2D);
}

/* dst (n) = src cast to the fp8 grid and back, with one scale per group of `group` consecutive
 * elements (group = n: tensor-wide). */
static ct_status fake_quant(f8 *q, float *dst, const float *src, int64_t n, int64_t group, ct_dtype fmt, int pow2,
                            int mx) {
    float *scales = need(q, &q->sc, sizeof(float) * (size_t)(n / group));
    uint8_t *bytes = need(q, &q->q8, (size_t)n);
    if (!scales || !bytes) return CT_ERR_NOMEM;
    ct_status st = compute_scales(q, scales, src, n, group, fmt, pow2, mx);
    if (st != CT_OK) return st;
    st = q->d->quantize_fp8(q->dev, bytes, src, scales, n, group, fmt);
    if (st != CT_OK) return st;
    return q->d->dequantize_fp8(q->dev, dst, bytes, scales, n, group, fmt);
}

/* An operand (rows, cols) whose GEMM reduction runs along dim `red` (1: along rows' contiguous cols,
 * 0: down the columns), cast per recipe r into dst laid out like src (dst may be src). */
static ct_status cast_operand_as(f8 *q, recipe r, float *dst, const float *src, int64_t rows, int64_t cols, int red,
                                 ct_dtype fmt) {
    int64_t n = rows * cols;
    switch (r) {
    case R_TENSORWISE:
    case R_E4M3:
    case R_E5M2: return fake_quant(q, dst, src, n, n, fmt, 0, 0);
    default: break;
    }
    int mx = r == R_MXFP8;
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
    ct_status st = q->d->transpose(q->dev, t, src, rows, cols);
    if (st != CT_OK) return st;
    st = fake_quant(q, t, t, n, group, CT_F8_E4M3, !mx, mx);
    if (st != CT_OK) return st;
    return q->d->transpose(q->dev, dst, t, cols, rows);
}

static ct_status cast_operand(f8 *q, float *dst, const float *src, int64_t rows, int64_t cols, int red, ct_dtype fmt) {
    return cast_operand_as(q, q->r, dst, src, rows, cols, red, fmt);
}

static ct_dtype fmt_in(f8 *q) { return q->r == R_E5M2 ? CT_F8_E5M2 : CT_F8_E4M3; }
static ct_dtype fmt_grad(f8 *q) { return q->r == R_E4M3 ? CT_F8_E4M3 : q->r == R_TENSORWISE || q->r == R_E5M2 ? CT_F8_E5M2 : CT_F8_E4M3; }

/* ---- the device's scaled fp8 GEMMs (tensor-wide and row-wise recipes) ---- */

static int tensorwise(const f8 *q) { return q->r == R_TENSORWISE || q->r == R_E4M3 || q->r == R_E5M2; }
static int rowwise(const f8 *q) { return q->r == R_ROWWISE || q->r == R_ROWWISE_GW_HP; }

/* How one operand is scaled for the device GEMM. */
typedef enum { SC_TENSOR, SC_ROWS, SC_TENSOR_AS_ROWS } scaling;

/* An operand (rows, k) cast to fp8 bytes dst, its scales left at scale (device: 1 value, or `rows`
 * for the row-scaled GEMM; SC_TENSOR_AS_ROWS repeats one tensor-wide scale per row); with
 * transpose, src is (k, rows) and is transposed first, so dst is always k-contiguous. Row-wise
 * recipes round their scales down to powers of two, as torchao does. */
static ct_status quant_operand(f8 *q, uint8_t *dst, float *scale, const float *src, int64_t rows, int64_t k,
                               int transpose, ct_dtype fmt, scaling how) {
    int64_t n = rows * k, group = how == SC_ROWS ? k : n;
    int pow2 = rowwise(q);
    ct_status st;
    if (transpose) {
        float *t = need(q, &q->t, sizeof(float) * (size_t)n);
        if (!t) return CT_ERR_NOMEM;
        st = q->d->transpose(q->dev, t, src, k, rows);
        if (st != CT_OK) return st;
        src = t;
    }
    st = compute_scales(q, scale, src, n, group, fmt, pow2, 0);
    if (st != CT_OK) return st;
    if (how == SC_TENSOR_AS_ROWS) { /* compute_scales left the one scale in host_amax[0] */
        float s = q->host_amax[0];
        if (host_need(q, rows)) return CT_ERR_NOMEM;
        for (int64_t r = 0; r < rows; r++) q->host_amax[r] = s;
        st = q->d->copy(q->dev, scale, q->host_amax, sizeof(float) * (size_t)rows, CT_COPY_H2D);
        if (st != CT_OK) return st;
    }
    return q->d->quantize_fp8(q->dev, dst, src, scale, n, group, fmt);
}

/* The weight gradient's GEMM (both operands stored (k, .), k the tokens) of a tensor-wide recipe runs
 * in K_SLICES slices of the reduction: each operand's slice is transposed (f32) and cast on its own,
 * so the transposes take a quarter of an operand's f32 bytes instead of all of it (at 70B, TP 8 and
 * 131,072 tokens: 1 GiB instead of 4). The scales still come from the whole operands (an amax does not
 * depend on the layout), so every fp8 byte is the one the unsliced cast makes; the GEMM adds the
 * slices' products into c (beta 1 after the first). A k that does not split into 16-aligned slices
 * (the fp8 GEMM's alignment) is not sliced. */
#define K_SLICES 4
static int64_t k_slice(const f8 *q, int a_t, int b_t, int64_t k) {
    return tensorwise(q) && a_t && b_t && k % (16 * K_SLICES) == 0 ? k / K_SLICES : k;
}

/* c (m, n) = op(a) op(b)^T + beta c on the device's fp8 GEMM (row-scaled for the row-wise recipes);
 * a_t / b_t: the operand is stored (k, m) / (k, n) and is transposed into k-contiguous form first;
 * b_tensor: b takes one tensor-wide scale (rowwise_with_gw_hp's weight in the input gradient). */
static ct_status device_gemm(f8 *q, float *c, const float *a, int a_t, ct_dtype fa, const float *b, int b_t,
                             ct_dtype fb, int64_t m, int64_t n, int64_t k, float beta, int b_tensor) {
    int rows = rowwise(q);
    int64_t kc = k_slice(q, a_t, b_t, k);
    uint8_t *a8 = need(q, &q->q8, (size_t)(m * kc)), *b8 = need(q, &q->q8b, (size_t)(n * kc));
    float *sc = need(q, &q->s2, sizeof(float) * (size_t)(rows ? m + n : 2));
    if (!a8 || !b8 || !sc) return CT_ERR_NOMEM;
    float *sb = sc + (rows ? m : 1);
    if (kc < k) { /* tensor-wide, both transposed: slice by slice (k_slice) */
        float *t = need(q, &q->t, sizeof(float) * (size_t)((m > n ? m : n) * kc));
        if (!t) return CT_ERR_NOMEM;
        ct_status st = compute_scales(q, sc, a, m * k, m * k, fa, 0, 0);
        if (st == CT_OK) st = compute_scales(q, sb, b, n * k, n * k, fb, 0, 0);
        for (int64_t k0 = 0; k0 < k && st == CT_OK; k0 += kc) {
            st = q->d->transpose(q->dev, t, a + k0 * m, kc, m);
            if (st == CT_OK) st = q->d->quantize_fp8(q->dev, a8, t, sc, m * kc, m * kc, fa);
            if (st == CT_OK) st = q->d->transpose(q->dev, t, b + k0 * n, kc, n);
            if (st == CT_OK) st = q->d->quantize_fp8(q->dev, b8, t, sb, n * kc, n * kc, fb);
            if (st == CT_OK) st = q->d->matmul_fp8(q->dev, c, a8, sc, fa, b8, sb, fb, m, n, kc, 1.0f, k0 ? 1.0f : beta);
        }
        return st;
    }
    ct_status st = quant_operand(q, a8, sc, a, m, k, a_t, fa, rows ? SC_ROWS : SC_TENSOR);
    if (st != CT_OK) return st;
    st = quant_operand(q, b8, sb, b, n, k, b_t, fb, !rows ? SC_TENSOR : b_tensor ? SC_TENSOR_AS_ROWS : SC_ROWS);
    if (st != CT_OK) return st;
    return (rows ? q->d->matmul_fp8_rows : q->d->matmul_fp8)(q->dev, c, a8, sc, fa, b8, sb, fb, m, n, k, 1.0f, beta);
}

static ct_dtype fmt_in(f8 *q);
static ct_dtype fmt_grad(f8 *q);

/* At start-up: can the device run this recipe's GEMMs (the forward pair and the gradient pair)?
 * One 16x16x16 GEMM of zeros per pair; the answer and what follows from it go to the log once. */
static ct_status probe_device_gemm(f8 *q) {
    const char *name = recipe_names[q->r];
    int emulate = 0;
    q->host->opt_bool(q->host, "emulate", &emulate);
    if (emulate) {
        q->host->log(q->host, CT_LOG_INFO, "float8 %s: emulated (fp8 casts, f32 GEMMs), as emulate: true asks", name);
        return CT_OK;
    }
    if (!tensorwise(q) && !rowwise(q)) {
        q->host->log(q->host, CT_LOG_INFO,
                     "float8 %s: emulated (fp8 casts, f32 GEMMs): the device's scaled fp8 matmuls take tensor-wide or "
                     "per-row scales, not MX blocks", name);
        return CT_OK;
    }
    const char *op_name = rowwise(q) ? "matmul_fp8_rows" : "matmul_fp8";
    ct_status (*gemm)(ct_device *, float *, const uint8_t *, const float *, ct_dtype, const uint8_t *, const float *,
                      ct_dtype, int64_t, int64_t, int64_t, float, float) = NULL;
    if (rowwise(q) && CT_HAS_FIELD(q->d, ct_device_api, matmul_fp8_rows)) gemm = q->d->matmul_fp8_rows;
    if (tensorwise(q) && CT_HAS_FIELD(q->d, ct_device_api, matmul_fp8)) gemm = q->d->matmul_fp8;
    if (!gemm) {
        q->host->log(q->host, CT_LOG_INFO, "float8 %s: emulated (fp8 casts, f32 GEMMs): the device has no %s", name,
                     op_name);
        return CT_OK;
    }
    uint8_t *a8 = need(q, &q->q8, 256), *b8 = need(q, &q->q8b, 256);
    float *sc = need(q, &q->s2, 32 * sizeof(float)), *c = need(q, &q->a, 256 * sizeof(float));
    if (!a8 || !b8 || !sc || !c) return CT_ERR_NOMEM;
    q->probed = 1;
    float ones[32];
    for (int i = 0; i < 32; i++) ones[i] = 1.0f;
    ct_status st = q->d->zero(q->dev, a8, 256);
    if (st != CT_OK) return st;
    st = q->d->zero(q->dev, b8, 256);
    if (st != CT_OK) return st;
    st = q->d->copy(q->dev, sc, ones, sizeof ones, CT_COPY_H2D);
    if (st != CT_OK) return st;
    const ct_dtype pairs[2][2] = {{fmt_in(q), fmt_in(q)}, {fmt_grad(q), fmt_in(q)}};
    for (int i = 0; i < 2; i++) {
        ct_status st = gemm(q->dev, c, a8, sc, pairs[i][0], b8, sc + 16, pairs[i][1], 16, 16, 16, 1, 0);
        if (st == CT_ERR_UNSUPPORTED) {
            q->host->log(q->host, CT_LOG_INFO, "float8 %s: emulated (fp8 casts, f32 GEMMs): the device's %s does not run %s x %s",
                         name, op_name, pairs[i][0] == CT_F8_E4M3 ? "e4m3" : "e5m2",
                         pairs[i][1] == CT_F8_E4M3 ? "e4m3" : "e5m2");
            return CT_OK;
        }
        if (st != CT_OK) return st;
    }
    q->device_gemm = 1;
    q->host->log(q->host, CT_LOG_INFO, "float8 %s: GEMMs on the device's scaled fp8 matmul (%s)", name,
                 rowwise(q) ? "row scales" : "tensor-wide scales");
    return CT_OK;
}

/* A planning instance (made without a device) answers plan_linear only. */
static ct_status planning_only(f8 *q) {
    q->host->set_error(q->host, "this instance was made for planning (no device) and runs no GEMM");
    return CT_ERR_INTERNAL;
}

static ct_status f8_forward(ct_quantizer *p, float *y, const float *x, const float *w, int64_t n, int64_t out,
                            int64_t in) {
    f8 *q = p;
    if (!q->d) return planning_only(q);
    if (q->device_gemm) /* y (n, out) = x (n, in) w (out, in)^T: both k-contiguous already */
        return device_gemm(q, y, x, 0, fmt_in(q), w, 0, fmt_in(q), n, out, in, 0.0f, 0);
    float *xq = need(q, &q->a, sizeof(float) * (size_t)(n * in)), *wq = need(q, &q->b, sizeof(float) * (size_t)(out * in));
    if (!xq || !wq) return CT_ERR_NOMEM;
    ct_status st = cast_operand(q, xq, x, n, in, 1, fmt_in(q));
    if (st != CT_OK) return st;
    st = cast_operand(q, wq, w, out, in, 1, fmt_in(q));
    if (st != CT_OK) return st;
    return q->d->matmul(q->dev, y, xq, wq, n, out, in, 0, 1, 1.0f, 0.0f);
}

static ct_status f8_backward_input(ct_quantizer *p, float *dx, const float *dy, const float *w, int64_t n, int64_t out,
                                   int64_t in) {
    f8 *q = p;
    if (!q->d) return planning_only(q);
    if (q->device_gemm) /* dx (n, in) += dy (n, out) (w^T (in, out))^T: w transposed */
        return device_gemm(q, dx, dy, 0, fmt_grad(q), w, 1, fmt_in(q), n, in, out, 1.0f, q->r == R_ROWWISE_GW_HP);
    float *gq = need(q, &q->a, sizeof(float) * (size_t)(n * out)), *wq = need(q, &q->b, sizeof(float) * (size_t)(out * in));
    if (!gq || !wq) return CT_ERR_NOMEM;
    ct_status st = cast_operand(q, gq, dy, n, out, 1, fmt_grad(q)); /* reduction over out: along dy's rows */
    if (st != CT_OK) return st;
    if (q->r == R_ROWWISE_GW_HP) /* torchao: this recipe scales w tensor-wide (power of two) for grad_input */
        st = fake_quant(q, wq, w, out * in, out * in, CT_F8_E4M3, 1, 0);
    else
        st = cast_operand(q, wq, w, out, in, 0, fmt_in(q)); /* and down w's columns */
    if (st != CT_OK) return st;
    return q->d->matmul(q->dev, dx, gq, wq, n, in, out, 0, 0, 1.0f, 1.0f);
}

static ct_status f8_backward_weight(ct_quantizer *p, float *dw, const float *dy, const float *x, int64_t n, int64_t out,
                                    int64_t in) {
    f8 *q = p;
    if (!q->d) return planning_only(q);
    if (q->r == R_ROWWISE_GW_HP) return q->d->matmul(q->dev, dw, dy, x, out, in, n, 1, 0, 1.0f, 1.0f);
    if (q->device_gemm) /* dw (out, in) += dy^T (out, n) (x^T (in, n))^T: both transposed */
        return device_gemm(q, dw, dy, 1, fmt_grad(q), x, 1, fmt_in(q), out, in, n, 1.0f, 0);
    float *gq = need(q, &q->a, sizeof(float) * (size_t)(n * out)), *xq = need(q, &q->b, sizeof(float) * (size_t)(n * in));
    if (!gq || !xq) return CT_ERR_NOMEM;
    ct_status st = cast_operand(q, gq, dy, n, out, 0, fmt_grad(q)); /* reduction over n: down the columns */
    if (st != CT_OK) return st;
    st = cast_operand(q, xq, x, n, in, 0, fmt_in(q));
    if (st != CT_OK) return st;
    return q->d->matmul(q->dev, dw, gq, xq, out, in, n, 1, 0, 1.0f, 1.0f);
}

/* ---- the experts' grouped GEMMs (ABI 2.24) ---- */

/* The device's grouped GEMMs are there (the host offers MoE only with them), and the log says once
 * how the experts run. */
static ct_status grouped_ready(f8 *q) {
    if (!q->d) return planning_only(q);
    if (!CT_HAS_FIELD(q->d, ct_device_api, grouped_matmul_backward_weight) || !q->d->grouped_matmul_forward ||
        !q->d->grouped_matmul_backward_input || !q->d->grouped_matmul_backward_weight) {
        q->host->set_error(q->host, "float8 grouped GEMMs need the device's grouped_matmul ops (ABI 2.14)");
        return CT_ERR_UNSUPPORTED;
    }
    if (!q->grouped_noted) {
        q->grouped_noted = 1;
        q->host->log(q->host, CT_LOG_INFO, "float8 experts (%s): emulated (e4m3 casts, f32 grouped GEMMs)",
                     recipe_names[q->gr]);
    }
    return CT_OK;
}

/* y segment g = x_g w_g^T: x scaled per token along i, w per (expert, output channel) along i. */
static ct_status f8_grouped_forward(ct_quantizer *p, float *y, const float *x, const float *w, const int32_t *offsets,
                                    int64_t m, int64_t e, int64_t o, int64_t i) {
    f8 *q = p;
    ct_status st = grouped_ready(q);
    if (st != CT_OK) return st;
    float *xq = need(q, &q->a, sizeof(float) * (size_t)(m * i + 1)), *wq = need(q, &q->b, sizeof(float) * (size_t)(e * o * i));
    if (!xq || !wq) return CT_ERR_NOMEM;
    if (m > 0 && (st = cast_operand_as(q, q->gr, xq, x, m, i, 1, CT_F8_E4M3)) != CT_OK) return st;
    if ((st = cast_operand_as(q, q->gr, wq, w, e * o, i, 1, CT_F8_E4M3)) != CT_OK) return st;
    return q->d->grouped_matmul_forward(q->dev, y, xq, wq, offsets, m, e, o, i);
}

/* dx_g += dy_g w_g: dy scaled per token along o, w per (expert, input column) along o. */
static ct_status f8_grouped_backward_input(ct_quantizer *p, float *dx, const float *dy, const float *w,
                                           const int32_t *offsets, int64_t m, int64_t e, int64_t o, int64_t i) {
    f8 *q = p;
    ct_status st = grouped_ready(q);
    if (st != CT_OK) return st;
    float *gq = need(q, &q->a, sizeof(float) * (size_t)(m * o + 1)), *wq = need(q, &q->b, sizeof(float) * (size_t)(e * o * i));
    if (!gq || !wq) return CT_ERR_NOMEM;
    if (m > 0 && (st = cast_operand_as(q, q->gr, gq, dy, m, o, 1, CT_F8_E4M3)) != CT_OK) return st;
    for (int64_t g = 0; g < e && st == CT_OK; g++)
        st = cast_operand_as(q, q->gr, wq + g * o * i, w + g * o * i, o, i, 0, CT_F8_E4M3);
    if (st != CT_OK) return st;
    return q->d->grouped_matmul_backward_input(q->dev, dx, gq, wq, offsets, m, e, o, i);
}

/* The offsets (e+1) on the host, checked as the device checks them; NULL with the error set. */
static const int32_t *host_offsets(f8 *q, const int32_t *offsets, int64_t m, int64_t e) {
    if ((size_t)(e + 1) > q->off_cap) {
        int32_t *h = realloc(q->host_off, sizeof(int32_t) * (size_t)(e + 1));
        if (!h) {
            q->host->set_error(q->host, "out of memory for %lld expert offsets", (long long)(e + 1));
            return NULL;
        }
        q->host_off = h;
        q->off_cap = (size_t)(e + 1);
    }
    if (q->d->copy(q->dev, q->host_off, offsets, sizeof(int32_t) * (size_t)(e + 1), CT_COPY_D2H) != CT_OK) return NULL;
    for (int64_t g = 0; g <= e; g++)
        if (q->host_off[g] < 0 || q->host_off[g] > m || (g && q->host_off[g] < q->host_off[g - 1])) {
            q->host->set_error(q->host, "float8 grouped GEMM: offsets[%lld] = %d is not within [offsets[%lld], %lld]",
                               (long long)g, q->host_off[g], (long long)(g ? g - 1 : 0), (long long)m);
            return NULL;
        }
    return q->host_off;
}

/* rows (len, cols) of one expert's segment cast with their scales down each column, over the
 * segment's rows only (its reduction); mxfp8 pads a segment to whole blocks of 32 rows with zeros. */
static ct_status cast_segment(f8 *q, float *dst, const float *src, int64_t len, int64_t cols) {
    int64_t padded = q->gr == R_MXFP8 ? (len + 31) / 32 * 32 : len;
    if (padded == len) return cast_operand_as(q, q->gr, dst, src, len, cols, 0, CT_F8_E4M3);
    float *t = need(q, &q->pad, sizeof(float) * (size_t)(padded * cols));
    if (!t) return CT_ERR_NOMEM;
    size_t bytes = sizeof(float) * (size_t)(len * cols);
    ct_status st = q->d->copy(q->dev, t, src, bytes, CT_COPY_D2D);
    if (st == CT_OK) st = q->d->zero(q->dev, t + len * cols, sizeof(float) * (size_t)((padded - len) * cols));
    if (st == CT_OK) st = cast_operand_as(q, q->gr, t, t, padded, cols, 0, CT_F8_E4M3);
    return st == CT_OK ? q->d->copy(q->dev, dst, t, bytes, CT_COPY_D2D) : st;
}

/* dw_g += dy_g^T x_g: the reduction runs over expert g's tokens, so dy and x are scaled per column
 * within each segment (an empty segment casts nothing and adds nothing). */
static ct_status f8_grouped_backward_weight(ct_quantizer *p, float *dw, const float *dy, const float *x,
                                            const int32_t *offsets, int64_t m, int64_t e, int64_t o, int64_t i) {
    f8 *q = p;
    ct_status st = grouped_ready(q);
    if (st != CT_OK) return st;
    const int32_t *off = host_offsets(q, offsets, m, e);
    if (!off) return CT_ERR_INVALID;
    float *gq = need(q, &q->a, sizeof(float) * (size_t)(m * o + 1)), *xq = need(q, &q->b, sizeof(float) * (size_t)(m * i + 1));
    if (!gq || !xq) return CT_ERR_NOMEM;
    for (int64_t g = 0; g < e && st == CT_OK; g++) {
        int64_t r0 = off[g], len = off[g + 1] - off[g];
        if (len == 0) continue;
        st = cast_segment(q, gq + r0 * o, dy + r0 * o, len, o);
        if (st == CT_OK) st = cast_segment(q, xq + r0 * i, x + r0 * i, len, i);
    }
    if (st != CT_OK) return st;
    return q->d->grouped_matmul_backward_weight(q->dev, dw, gq, xq, offsets, m, e, o, i);
}

/* ---- the planner's questions (ABI 2.2) ----
 * What one converted linear w (out, in) with n tokens costs, from what the three GEMMs above do.
 * Nothing is kept from forward for backward (each GEMM casts its operands afresh from the host's x,
 * w and dy), and no cast of a weight survives a step: saved_bytes and weight_bytes are 0. The
 * scratch is the plugin's grow-only buffers (need()), shared by every linear and kept for the run
 * (CT_MEM_OTHER): per buffer the largest of this linear's three GEMMs (and of the start-up probe's
 * GEMM), summed, which is what the run holds for its largest converted linear. Traffic per operand
 * of e elements: amax reads 4e and the cast reads 4e and writes e (device GEMM: 9e), the emulation
 * adds the dequantise (5e: 14e), a transpose into k-contiguous (or reduction-contiguous) form adds
 * 8e, the emulation's transpose back another 8e. */
typedef struct plan_bufs {
    double a, b, t, q8, sc, q8b, s2, pad; /* bytes of each need() buffer, as in f8 */
} plan_bufs;

static void grow(double *cap, double bytes) {
    if (bytes > *cap) *cap = bytes;
}

/* device_gemm(m, n, k) with a_t / b_t: the fp8 operands, their scales, the transposes. */
static double plan_device_gemm(const f8 *q, plan_bufs *pb, double m, double n, double k, int a_t, int b_t) {
    int rows = rowwise(q);
    double kc = (double)k_slice(q, a_t, b_t, (int64_t)k);
    if (kc < k) { /* sliced: one slice of each operand at a time; amax reads the whole (4e each) */
        grow(&pb->q8, m * kc);
        grow(&pb->q8b, n * kc);
        grow(&pb->s2, sizeof(float) * 2);
        grow(&pb->t, sizeof(float) * (m > n ? m : n) * kc);
        return 9 * (m * k + n * k) + 8 * (m * k + n * k);
    }
    grow(&pb->q8, m * k);
    grow(&pb->q8b, n * k);
    grow(&pb->s2, sizeof(float) * (rows ? m + n : 2));
    if (a_t) grow(&pb->t, sizeof(float) * m * k);
    if (b_t) grow(&pb->t, sizeof(float) * n * k);
    return 9 * (m * k + n * k) + 8 * ((a_t ? m * k : 0) + (b_t ? n * k : 0));
}

/* cast_operand_as (emulated) of (rows, cols) reduced along `red` per recipe r; fake_quant when
 * tensor-wide. */
static double plan_cast_as(const f8 *q, recipe r, plan_bufs *pb, double rows, double cols, int red, int tensor_wide) {
    (void)q;
    double e = rows * cols;
    grow(&pb->q8, e);
    if (tensor_wide || r == R_TENSORWISE || r == R_E4M3 || r == R_E5M2) {
        grow(&pb->sc, sizeof(float));
        return 14 * e;
    }
    double group = r == R_MXFP8 ? 32 : red ? cols : rows;
    grow(&pb->sc, sizeof(float) * e / group);
    if (red) return 14 * e;
    grow(&pb->t, sizeof(float) * e);
    return 30 * e;
}

static double plan_cast(const f8 *q, plan_bufs *pb, double rows, double cols, int red, int tensor_wide) {
    return plan_cast_as(q, q->r, pb, rows, cols, red, tensor_wide);
}

/* An experts weight (e, o, i) over m rows: the three emulated grouped GEMMs above. The weight
 * gradient's casts run per segment: a segment's transpose is at most all m rows (and the offsets'
 * host copy is not device memory). */
static ct_status plan_grouped(f8 *q, const ct_tensor *weight, double m, ct_quant_cost *cost) {
    double e = (double)weight->shape[0], o = (double)weight->shape[1], i = (double)weight->shape[2], f = sizeof(float);
    plan_bufs pb = {0};
    recipe r = q->gr;
    grow(&pb.a, f * (m * (i > o ? i : o) + 1));
    grow(&pb.b, f * (e * o * i > m * i + 1 ? e * o * i : m * i + 1));
    cost->cast_bytes[0] = plan_cast_as(q, r, &pb, m, i, 1, 0) + plan_cast_as(q, r, &pb, e * o, i, 1, 0);
    cost->cast_bytes[1] = plan_cast_as(q, r, &pb, m, o, 1, 0) + e * plan_cast_as(q, r, &pb, o, i, 0, 0) +
                          plan_cast_as(q, r, &pb, m, o, 0, 0) + plan_cast_as(q, r, &pb, m, i, 0, 0);
    if (r == R_MXFP8) grow(&pb.pad, f * (m + 31) * (i > o ? i : o));
    cost->gemm_dtype = CT_F32; /* emulated: f32 grouped GEMMs on dequantised values */
    cost->saved_bytes = 0;
    cost->weight_bytes = 0;
    cost->scratch_bytes = pb.a + pb.b + pb.t + pb.q8 + pb.sc + pb.pad;
    return CT_OK;
}

static ct_status f8_plan_linear(ct_quantizer *p, const ct_tensor *weight, int64_t n_tokens, ct_quant_cost *cost) {
    f8 *q = p;
    if (weight->ndim == 3) return plan_grouped(q, weight, (double)n_tokens, cost); /* ABI 2.24: experts */
    if (weight->ndim != 2) {
        q->host->set_error(q->host, "plan_linear wants a (out, in) or (e, out, in) weight, got %d dims", weight->ndim);
        return CT_ERR_INVALID;
    }
    double n = (double)n_tokens, out = (double)weight->shape[0], in = (double)weight->shape[1], f = sizeof(float);
    plan_bufs pb = {0};
    int gw_hp = q->r == R_ROWWISE_GW_HP;
    if (q->probed) { /* probe_device_gemm's 16 x 16 GEMM */
        pb.q8 = pb.q8b = 256;
        pb.s2 = 32 * f;
        pb.a = 256 * f;
    }
    if (q->device_gemm) {
        cost->cast_bytes[0] = plan_device_gemm(q, &pb, n, out, in, 0, 0);              /* y = x w^T */
        cost->cast_bytes[1] = plan_device_gemm(q, &pb, n, in, out, 0, 1);              /* dx = dy w */
        if (!gw_hp) cost->cast_bytes[1] += plan_device_gemm(q, &pb, out, in, n, 1, 1); /* dw = dy^T x */
    } else {
        grow(&pb.a, f * n * (in > out ? in : out));
        grow(&pb.b, f * out * in);
        cost->cast_bytes[0] = plan_cast(q, &pb, n, in, 1, 0) + plan_cast(q, &pb, out, in, 1, 0);
        cost->cast_bytes[1] = plan_cast(q, &pb, n, out, 1, 0) + plan_cast(q, &pb, out, in, 0, gw_hp);
        if (!gw_hp) {
            grow(&pb.b, f * n * in);
            cost->cast_bytes[1] += plan_cast(q, &pb, n, out, 0, 0) + plan_cast(q, &pb, n, in, 0, 0);
        }
    }
    /* the device's scaled fp8 GEMM runs at its fp8 rate; the emulation (MX blocks, emulate: true, or a
     * device without the op) multiplies dequantised f32 values. rowwise_with_gw_hp's weight-gradient
     * GEMM is f32 even then: one GEMM of three that the single dtype does not say. */
    cost->gemm_dtype = q->device_gemm ? CT_F8_E4M3 : CT_F32;
    cost->saved_bytes = 0;
    cost->weight_bytes = 0;
    cost->scratch_bytes = pb.a + pb.b + pb.t + pb.q8 + pb.sc + pb.q8b + pb.s2;
    return CT_OK;
}

/* ABI 2.19: FSDP gathers the converted weights in e4m3 (ct_strategy_env.fp8_all_gather) */
static int f8_gather_quantized(ct_quantizer *q) { return q->gather_fp8; }

static const ct_quantizer_api api = {
    .struct_size = sizeof(ct_quantizer_api),
    .create = f8_create,
    .destroy = f8_destroy,
    .converts = f8_converts,
    .forward = f8_forward,
    .backward_input = f8_backward_input,
    .backward_weight = f8_backward_weight,
    .plan_linear = f8_plan_linear,
    .gather_quantized = f8_gather_quantized,
    .grouped_forward = f8_grouped_forward,
    .grouped_backward_input = f8_grouped_backward_input,
    .grouped_backward_weight = f8_grouped_backward_weight,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_QUANTIZER;
    info->name = "float8";
    info->description = "float8 linear layers (tensorwise, rowwise, rowwise_with_gw_hp, mxfp8, e4m3, e5m2) and MoE "
                        "experts' grouped GEMMs (rowwise, mxfp8): torchao recipes";
    info->options = options;
    info->api = &api;
    info->knobs = knobs;
    return CT_OK;
}
