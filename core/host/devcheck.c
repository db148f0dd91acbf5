/* devcheck.c: the device ops' shared argument checks (see devcheck.h).
 *
 * Each wrapper checks in the order the plugins did and calls the plugin's op only when every check
 * passed; a null device is refused without a message, as the plugins refused it. The checks are
 * conditions on the arguments alone: nothing here reads device memory or the device's state. */
#include "host/devcheck.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const ct_device_api *real;
static const ct_host *host;
static ct_device_api wrapped;
/* whether the plugin has each 2.23 general op itself (else the host derives it from the narrow ones) */
static int own_embedding, own_rope, own_xent;
/* a graph capture in progress (graph_begin succeeded, graph_end not called yet), and the first
 * refusal during it */
static int capturing;
static ct_status capture_failed;

/* Reports "op: message" through the plugin's host table and returns CT_ERR_INVALID. */
__attribute__((format(printf, 2, 3))) static ct_status fail(const char *op, const char *fmt, ...) {
    if (host && host->set_error) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        host->set_error(host, "%s: %s", op, msg);
    }
    if (capturing && capture_failed == CT_OK) capture_failed = CT_ERR_INVALID;
    return CT_ERR_INVALID;
}

#define CHECK(call)                                                                                                    \
    do {                                                                                                               \
        ct_status st_ = (call);                                                                                        \
        if (st_ != CT_OK) return st_;                                                                                  \
    } while (0)

/* ---- the checks several ops share ---- */

/* n >= 0 elements; the pointers set unless n is 0 */
static ct_status length(const char *op, int64_t n, int pointers_set) {
    if (n < 0) return fail(op, "negative length %lld", (long long)n);
    if (!(n == 0 || pointers_set)) return fail(op, "null pointer");
    return CT_OK;
}

/* rows n >= 0 of c >= 0 columns */
static ct_status rows(const char *op, int64_t n, int64_t c) {
    if (n < 0 || c < 0) return fail(op, "negative shape n=%lld c=%lld", (long long)n, (long long)c);
    return CT_OK;
}

/* A GEMM's (m, n, k): non-negative and within BLAS's int. */
static ct_status gemm_shape(const char *op, int64_t m, int64_t n, int64_t k) {
    if (m < 0 || n < 0 || k < 0)
        return fail(op, "negative shape m=%lld n=%lld k=%lld", (long long)m, (long long)n, (long long)k);
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX)
        return fail(op, "shape m=%lld n=%lld k=%lld exceeds the BLAS int range", (long long)m, (long long)n,
                    (long long)k);
    return CT_OK;
}

/* RoPE's (b, t, h, d): not negative, d even (pairs). */
static ct_status rope_shape(const char *op, int64_t b, int64_t t, int64_t h, int64_t hd) {
    if (b < 0 || t < 0 || h < 0 || hd < 0)
        return fail(op, "negative shape b=%lld t=%lld h=%lld d=%lld", (long long)b, (long long)t, (long long)h,
                    (long long)hd);
    if (hd % 2 != 0) return fail(op, "head dim %lld is odd, expected pairs", (long long)hd);
    return CT_OK;
}

/* rope_forward/backward and their _pos forms: the shape, theta, and the pointers when there is work. */
static ct_status rope_theta(const char *op, const void *out, const void *x, int pos_set, int64_t b, int64_t t,
                            int64_t h, int64_t hd, float theta) {
    CHECK(rope_shape(op, b, t, h, hd));
    if (!(theta > 0)) return fail(op, "theta %g, expected > 0", (double)theta);
    if (b == 0 || t == 0 || h == 0 || hd == 0) return CT_OK;
    if (!out || !x || !pos_set) return fail(op, "null pointer");
    return CT_OK;
}

/* Attention's grouped-query shape: kvh and d > 0, h a multiple of kvh, within BLAS's int. */
static ct_status attention_shape(const char *op, int64_t b, int64_t t, int64_t h, int64_t kvh, int64_t hd) {
    if (b < 0 || t < 0 || h < 0 || kvh <= 0 || hd <= 0)
        return fail(op, "shape b=%lld t=%lld h=%lld kvh=%lld d=%lld, expected kvh and d > 0", (long long)b,
                    (long long)t, (long long)h, (long long)kvh, (long long)hd);
    if (h % kvh != 0)
        return fail(op, "%lld query heads are not a multiple of %lld kv heads", (long long)h, (long long)kvh);
    if (t > INT_MAX || h * hd > INT_MAX)
        return fail(op, "t=%lld or h*d=%lld exceeds the BLAS int range", (long long)t, (long long)(h * hd));
    return CT_OK;
}

/* The block attention ops: tk apart, then attention_shape with tq. */
static ct_status attention_block_shape(const char *op, int64_t b, int64_t tq, int64_t tk, int64_t h, int64_t kvh,
                                       int64_t hd) {
    if (tk < 0 || tk > INT_MAX) return fail(op, "tk=%lld, expected 0..%d", (long long)tk, INT_MAX);
    return attention_shape(op, b, tq, h, kvh, hd);
}

/* Full-vocabulary cross-entropy: v > 0 columns, targets given when there are rows. The targets'
 * values live in device memory: the plugin checks them. */
static ct_status cross_entropy_shape(const char *op, const int32_t *targets, int64_t n, int64_t v) {
    if (n < 0 || v <= 0) return fail(op, "shape n=%lld v=%lld, expected v > 0", (long long)n, (long long)v);
    if (n > 0 && !targets) return fail(op, "null targets");
    return CT_OK;
}

/* A vocabulary shard's first row: an offset into the full vocabulary. */
static ct_status vocab_offset(const char *op, int64_t begin) {
    if (begin < 0) return fail(op, "begin %lld, expected >= 0 (a vocabulary offset)", (long long)begin);
    return CT_OK;
}

static ct_status adamw_args(const char *op, int pointers_set, int64_t n, float beta1, float beta2, int64_t step) {
    if (n < 0) return fail(op, "negative length %lld", (long long)n);
    if (step < 1) return fail(op, "step %lld, expected >= 1 (counted from 1)", (long long)step);
    if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1))
        return fail(op, "betas (%g, %g), expected each in [0, 1)", (double)beta1, (double)beta2);
    if (!(n == 0 || pointers_set)) return fail(op, "null pointer");
    return CT_OK;
}

/* n >= 0 elements in groups of `group` (>= 1, dividing n). */
static ct_status groups(const char *op, int64_t n, int64_t group) {
    if (n < 0 || group < 1)
        return fail(op, "n=%lld group=%lld, expected n >= 0 and group >= 1", (long long)n, (long long)group);
    if (n % group != 0) return fail(op, "group %lld does not divide n=%lld", (long long)group, (long long)n);
    return CT_OK;
}

static ct_status fp8_format(const char *op, ct_dtype fmt) {
    if (fmt != CT_F8_E4M3 && fmt != CT_F8_E5M2)
        return fail(op, "format %d, expected CT_F8_E4M3 (%d) or CT_F8_E5M2 (%d)", (int)fmt, (int)CT_F8_E4M3,
                    (int)CT_F8_E5M2);
    return CT_OK;
}

/* ---- memory and copies ---- */

static ct_status w_copy(ct_device *dev, void *dst, const void *src, size_t bytes, ct_copy_kind kind) {
    if (!dev) return CT_ERR_INVALID;
    if (!(kind == CT_COPY_H2D || kind == CT_COPY_D2H || kind == CT_COPY_D2D))
        return fail("copy", "unknown copy kind %d", (int)kind);
    if (bytes > 0 && (!dst || !src)) return fail("copy", "null pointer");
    return real->copy(dev, dst, src, bytes, kind);
}

static ct_status w_zero(ct_device *dev, void *p, size_t bytes) {
    if (!dev) return CT_ERR_INVALID;
    if (bytes > 0 && !p) return fail("zero", "null pointer");
    return real->zero(dev, p, bytes);
}

static ct_status w_copy_2d(ct_device *dev, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                           int64_t nrows, int64_t cols) {
    if (!dev) return CT_ERR_INVALID;
    if (nrows < 0 || cols < 0)
        return fail("copy_2d", "negative shape rows=%lld cols=%lld", (long long)nrows, (long long)cols);
    if (dst_stride < cols || src_stride < cols)
        return fail("copy_2d", "strides dst %lld src %lld, expected each >= cols %lld", (long long)dst_stride,
                    (long long)src_stride, (long long)cols);
    if (nrows > 0 && cols > 0) {
        /* the last element's byte offset, (rows - 1) * stride + cols floats, must fit */
        int64_t stride = dst_stride > src_stride ? dst_stride : src_stride;
        int64_t limit = INT64_MAX / (int64_t)sizeof(float);
        if (cols > limit || nrows - 1 > (limit - cols) / stride)
            return fail("copy_2d", "rows=%lld cols=%lld with stride %lld is too large", (long long)nrows,
                        (long long)cols, (long long)stride);
        if (!dst || !src) return fail("copy_2d", "null pointer");
    }
    return real->copy_2d(dev, dst, dst_stride, src, src_stride, nrows, cols);
}

/* ---- graph capture: a refusal here while capturing is the capture's failure too ---- */

static ct_status w_graph_begin(ct_device *dev) {
    ct_status st = real->graph_begin(dev);
    if (st == CT_OK) capturing = 1, capture_failed = CT_OK;
    return st;
}

static ct_status w_graph_end(ct_device *dev, ct_graph **graph, int64_t *ops) {
    ct_status st = real->graph_end(dev, graph, ops);
    if (!capturing) return st;
    capturing = 0;
    if (st == CT_OK && capture_failed != CT_OK) { /* the plugin saw no failure: this layer's refusal */
        if (graph && *graph && wrapped.graph_free) wrapped.graph_free(dev, *graph);
        if (graph) *graph = NULL;
        st = capture_failed;
    }
    return st;
}

/* ---- dense algebra and reductions ---- */

static ct_status w_matmul(ct_device *dev, float *c, const float *a, const float *b, int64_t m, int64_t n, int64_t k,
                          int trans_a, int trans_b, float alpha, float beta) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(gemm_shape("matmul", m, n, k));
    if (m > 0 && n > 0 && !(c && (k == 0 || (a && b)))) return fail("matmul", "null pointer");
    return real->matmul(dev, c, a, b, m, n, k, trans_a, trans_b, alpha, beta);
}

static ct_status w_axpy(ct_device *dev, float *y, const float *x, float alpha, int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(length("axpy", n, y && x));
    return real->axpy(dev, y, x, alpha, n);
}

static ct_status w_add(ct_device *dev, float *out, const float *a, const float *b, int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(length("add", n, out && a && b));
    return real->add(dev, out, a, b, n);
}

static ct_status w_scale(ct_device *dev, float *x, float alpha, int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(length("scale", n, x != NULL));
    return real->scale(dev, x, alpha, n);
}

/* the reductions: out always (n = 0 writes 0), x when there is work */
static ct_status w_sum(ct_device *dev, double *out, const float *x, int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    if (n < 0) return fail("sum", "negative length %lld", (long long)n);
    if (!(out && (n == 0 || x))) return fail("sum", "null pointer");
    return real->sum(dev, out, x, n);
}

static ct_status w_sum_squares(ct_device *dev, double *out, const float *x, int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    if (n < 0) return fail("sum_squares", "negative length %lld", (long long)n);
    if (!(out && (n == 0 || x))) return fail("sum_squares", "null pointer");
    return real->sum_squares(dev, out, x, n);
}

static ct_status w_sum_to_device(ct_device *dev, float *out, const float *x, int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    if (n < 0) return fail("sum_to_device", "negative length %lld", (long long)n);
    if (!(out && (n == 0 || x))) return fail("sum_to_device", "null pointer");
    return real->sum_to_device(dev, out, x, n);
}

static ct_status w_transpose(ct_device *dev, float *dst, const float *src, int64_t nrows, int64_t cols) {
    if (!dev) return CT_ERR_INVALID;
    if (nrows < 0 || cols < 0)
        return fail("transpose", "negative shape rows=%lld cols=%lld", (long long)nrows, (long long)cols);
    if (nrows > 0 && cols > 0) {
        if (nrows > INT64_MAX / cols / (int64_t)sizeof(float))
            return fail("transpose", "shape rows=%lld cols=%lld is too large", (long long)nrows, (long long)cols);
        if (!dst || !src) return fail("transpose", "null pointer");
        uintptr_t bytes = (uintptr_t)(nrows * cols) * sizeof(float), a = (uintptr_t)dst, b = (uintptr_t)src;
        if (!(a + bytes <= b || b + bytes <= a)) return fail("transpose", "dst and src overlap (not done in place)");
    }
    return real->transpose(dev, dst, src, nrows, cols);
}

/* ---- embedding ---- */

/* The ids' values live in device memory (the plugin checks them against vocab), and each plugin
 * checks the table and output pointers in its own order around that. */
static ct_status embedding_args(const char *op, const int32_t *ids, int64_t n, int64_t c, int64_t vocab) {
    if (n < 0 || c < 0 || vocab < 0)
        return fail(op, "negative shape n=%lld c=%lld vocab=%lld", (long long)n, (long long)c, (long long)vocab);
    if (!(n == 0 || ids)) return fail(op, "null ids");
    return CT_OK;
}

/* An op a plugin built for an older minor does not have, asked for through a general op. */
static ct_status lacks(const char *op, const char *narrow) {
    if (host && host->set_error) host->set_error(host, "%s: the device has neither this op nor %s", op, narrow);
    if (capturing && capture_failed == CT_OK) capture_failed = CT_ERR_UNSUPPORTED;
    return CT_ERR_UNSUPPORTED;
}

/* The embedding family, checked: the plugin's general op, or for an older plugin the narrow op of the case. */
static ct_status embedding_any(ct_device *dev, int backward, float *dst, const int32_t *ids, const float *src,
                               int64_t n, int64_t c, int64_t begin, int64_t nrows, int strict) {
    if (own_embedding)
        return backward ? real->embedding_backward_general(dev, dst, ids, src, n, c, begin, nrows, strict)
                        : real->embedding_forward_general(dev, dst, ids, src, n, c, begin, nrows, strict);
    if (strict)
        return backward ? real->embedding_backward(dev, dst, ids, src, n, c, nrows)
                        : real->embedding_forward(dev, dst, ids, src, n, c, nrows);
    if (backward)
        return real->embedding_backward_range ? real->embedding_backward_range(dev, dst, ids, src, n, c, begin, nrows)
                                              : lacks("embedding_backward_general", "embedding_backward_range");
    return real->embedding_forward_range ? real->embedding_forward_range(dev, dst, ids, src, n, c, begin, nrows)
                                         : lacks("embedding_forward_general", "embedding_forward_range");
}

static ct_status w_embedding_forward(ct_device *dev, float *out, const int32_t *ids, const float *table, int64_t n,
                                     int64_t c, int64_t vocab) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(embedding_args("embedding_forward", ids, n, c, vocab));
    return embedding_any(dev, 0, out, ids, table, n, c, 0, vocab, 1);
}

static ct_status w_embedding_backward(ct_device *dev, float *dtable, const int32_t *ids, const float *dout, int64_t n,
                                      int64_t c, int64_t vocab) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(embedding_args("embedding_backward", ids, n, c, vocab));
    return embedding_any(dev, 1, dtable, ids, dout, n, c, 0, vocab, 1);
}

static ct_status range_shape(const char *op, int64_t n, int64_t c, int64_t begin, int64_t nrows) {
    if (n < 0 || c < 0 || nrows < 0)
        return fail(op, "negative shape n=%lld c=%lld rows=%lld", (long long)n, (long long)c, (long long)nrows);
    return vocab_offset(op, begin);
}

static ct_status w_embedding_forward_range(ct_device *dev, float *out, const int32_t *ids, const float *table,
                                           int64_t n, int64_t c, int64_t begin, int64_t nrows) {
    const char *op = "embedding_forward_range";
    if (!dev) return CT_ERR_INVALID;
    CHECK(range_shape(op, n, c, begin, nrows));
    if (n > 0 && c > 0 && !(out && ids && (nrows == 0 || table))) return fail(op, "null pointer");
    return embedding_any(dev, 0, out, ids, table, n, c, begin, nrows, 0);
}

static ct_status w_embedding_backward_range(ct_device *dev, float *dtable, const int32_t *ids, const float *dout,
                                            int64_t n, int64_t c, int64_t begin, int64_t nrows) {
    const char *op = "embedding_backward_range";
    if (!dev) return CT_ERR_INVALID;
    CHECK(range_shape(op, n, c, begin, nrows));
    if (n > 0 && c > 0 && nrows > 0 && (!dtable || !ids || !dout)) return fail(op, "null pointer");
    return embedding_any(dev, 1, dtable, ids, dout, n, c, begin, nrows, 0);
}

/* The general op checks as the narrow op of its case: strict as embedding_forward (the plugin checks
 * the ids and its pointers), a range as embedding_forward_range. */
static ct_status embedding_general_args(const char *op, int backward, const void *dst, const int32_t *ids,
                                        const void *src, int64_t n, int64_t c, int64_t begin, int64_t nrows,
                                        int strict) {
    if (strict != 0 && strict != 1) return fail(op, "strict %d, expected 0 or 1", strict);
    if (strict) {
        if (begin != 0) return fail(op, "begin %lld with strict, expected 0 (the whole table)", (long long)begin);
        return embedding_args(op, ids, n, c, nrows);
    }
    CHECK(range_shape(op, n, c, begin, nrows));
    if (n > 0 && c > 0 && (backward ? nrows > 0 && !(dst && ids && src) : !(dst && ids && (nrows == 0 || src))))
        return fail(op, "null pointer");
    return CT_OK;
}

static ct_status w_embedding_forward_general(ct_device *dev, float *out, const int32_t *ids, const float *table,
                                             int64_t n, int64_t c, int64_t begin, int64_t nrows, int strict) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(embedding_general_args("embedding_forward_general", 0, out, ids, table, n, c, begin, nrows, strict));
    return embedding_any(dev, 0, out, ids, table, n, c, begin, nrows, strict);
}

static ct_status w_embedding_backward_general(ct_device *dev, float *dtable, const int32_t *ids, const float *dout,
                                              int64_t n, int64_t c, int64_t begin, int64_t nrows, int strict) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(embedding_general_args("embedding_backward_general", 1, dtable, ids, dout, n, c, begin, nrows, strict));
    return embedding_any(dev, 1, dtable, ids, dout, n, c, begin, nrows, strict);
}

/* ---- norms and bias ---- */

/* The forward norms: c > 0 where there are rows, eps >= 0, the pointers when there are rows. */
static ct_status norm_forward_args(const char *op, int pointers_set, int64_t n, int64_t c, float eps) {
    CHECK(rows(op, n, c));
    if (!(c > 0 || n == 0)) return fail(op, "zero columns");
    if (!(eps >= 0)) return fail(op, "eps %g is negative", (double)eps);
    if (n > 0 && !pointers_set) return fail(op, "null pointer");
    return CT_OK;
}

/* The backward halves and bias: the pointers when there is work. */
static ct_status rows_args(const char *op, int pointers_set, int64_t n, int64_t c) {
    CHECK(rows(op, n, c));
    if (n > 0 && c > 0 && !pointers_set) return fail(op, "null pointer");
    return CT_OK;
}

static ct_status w_rmsnorm_forward(ct_device *dev, float *out, float *rstd, const float *x, const float *w, int64_t n,
                                   int64_t c, float eps) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(norm_forward_args("rmsnorm_forward", out && rstd && x && w, n, c, eps));
    return real->rmsnorm_forward(dev, out, rstd, x, w, n, c, eps);
}

static ct_status w_rmsnorm_backward_input(ct_device *dev, float *dx, const float *dout, const float *x, const float *w,
                                          const float *rstd, int64_t n, int64_t c) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(rows_args("rmsnorm_backward_input", dx && dout && x && w && rstd, n, c));
    return real->rmsnorm_backward_input(dev, dx, dout, x, w, rstd, n, c);
}

static ct_status w_rmsnorm_backward_weight(ct_device *dev, float *dw, const float *dout, const float *x,
                                           const float *rstd, int64_t n, int64_t c) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(rows_args("rmsnorm_backward_weight", dw && dout && x && rstd, n, c));
    return real->rmsnorm_backward_weight(dev, dw, dout, x, rstd, n, c);
}

static ct_status w_layernorm_forward(ct_device *dev, float *out, float *mean, float *rstd, const float *x,
                                     const float *w, const float *b, int64_t n, int64_t c, float eps) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(norm_forward_args("layernorm_forward", out && mean && rstd && x && w, n, c, eps)); /* b may be NULL */
    return real->layernorm_forward(dev, out, mean, rstd, x, w, b, n, c, eps);
}

static ct_status w_layernorm_backward_input(ct_device *dev, float *dx, const float *dout, const float *x,
                                            const float *w, const float *mean, const float *rstd, int64_t n,
                                            int64_t c) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(rows_args("layernorm_backward_input", dx && dout && x && w && mean && rstd, n, c));
    return real->layernorm_backward_input(dev, dx, dout, x, w, mean, rstd, n, c);
}

static ct_status w_layernorm_backward_weight(ct_device *dev, float *dw, float *db, const float *dout, const float *x,
                                             const float *mean, const float *rstd, int64_t n, int64_t c) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(rows_args("layernorm_backward_weight", dw && dout && x && mean && rstd, n, c)); /* db may be NULL */
    return real->layernorm_backward_weight(dev, dw, db, dout, x, mean, rstd, n, c);
}

static ct_status w_bias_forward(ct_device *dev, float *out, const float *x, const float *bias, int64_t n, int64_t c) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(rows_args("bias_forward", out && x && bias, n, c));
    return real->bias_forward(dev, out, x, bias, n, c);
}

static ct_status w_bias_backward(ct_device *dev, float *dbias, const float *dout, int64_t n, int64_t c) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(rows_args("bias_backward", dbias && dout, n, c));
    return real->bias_backward(dev, dbias, dout, n, c);
}

/* ---- position and attention ---- */

/* The RoPE family, checked: the plugin's general op, or for an older plugin the narrow op of the case
 * (a table: rope_freqs_*; positions: rope_*_pos; neither: rope_forward/backward). */
static ct_status rope_any(ct_device *dev, int backward, float *out, const float *x, const int32_t *pos,
                          const float *inv, float theta, int64_t b, int64_t t, int64_t h, int64_t hd) {
    const char *op = backward ? "rope_backward_general" : "rope_forward_general";
    if (own_rope)
        return backward ? real->rope_backward_general(dev, out, x, pos, inv, theta, b, t, h, hd)
                        : real->rope_forward_general(dev, out, x, pos, inv, theta, b, t, h, hd);
    if (inv) {
        ct_status (*f)(ct_device *, float *, const float *, const int32_t *, const float *, int64_t, int64_t, int64_t,
                       int64_t) = backward ? real->rope_freqs_backward : real->rope_freqs_forward;
        return f ? f(dev, out, x, pos, inv, b, t, h, hd) : lacks(op, "rope_freqs_forward/rope_freqs_backward");
    }
    if (pos) {
        ct_status (*f)(ct_device *, float *, const float *, const int32_t *, int64_t, int64_t, int64_t, int64_t,
                       float) = backward ? real->rope_backward_pos : real->rope_forward_pos;
        return f ? f(dev, out, x, pos, b, t, h, hd, theta) : lacks(op, "rope_forward_pos/rope_backward_pos");
    }
    return backward ? real->rope_backward(dev, out, x, b, t, h, hd, theta)
                    : real->rope_forward(dev, out, x, b, t, h, hd, theta);
}

static ct_status w_rope_forward(ct_device *dev, float *out, const float *x, int64_t b, int64_t t, int64_t h,
                                int64_t hd, float theta) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(rope_theta("rope_forward", out, x, 1, b, t, h, hd, theta));
    return rope_any(dev, 0, out, x, NULL, NULL, theta, b, t, h, hd);
}

static ct_status w_rope_backward(ct_device *dev, float *dx, const float *dout, int64_t b, int64_t t, int64_t h,
                                 int64_t hd, float theta) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(rope_theta("rope_backward", dx, dout, 1, b, t, h, hd, theta));
    return rope_any(dev, 1, dx, dout, NULL, NULL, theta, b, t, h, hd);
}

static ct_status w_rope_forward_pos(ct_device *dev, float *out, const float *x, const int32_t *pos, int64_t b,
                                    int64_t t, int64_t h, int64_t hd, float theta) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(rope_theta("rope_forward_pos", out, x, pos != NULL, b, t, h, hd, theta));
    return rope_any(dev, 0, out, x, pos, NULL, theta, b, t, h, hd);
}

static ct_status w_rope_backward_pos(ct_device *dev, float *dx, const float *dout, const int32_t *pos, int64_t b,
                                     int64_t t, int64_t h, int64_t hd, float theta) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(rope_theta("rope_backward_pos", dx, dout, pos != NULL, b, t, h, hd, theta));
    return rope_any(dev, 1, dx, dout, pos, NULL, theta, b, t, h, hd);
}

/* rope_freqs_*: the frequency table instead of theta; pos may be NULL (rows 0..t-1). */
static ct_status rope_freqs_args(const char *op, const void *out, const void *x, const float *inv_freq, int64_t b,
                                 int64_t t, int64_t h, int64_t hd) {
    CHECK(rope_shape(op, b, t, h, hd));
    if (b > 0 && t > 0 && h > 0 && hd > 0 && (!out || !x || !inv_freq)) return fail(op, "null pointer");
    return CT_OK;
}

static ct_status w_rope_freqs_forward(ct_device *dev, float *out, const float *x, const int32_t *pos,
                                      const float *inv_freq, int64_t b, int64_t t, int64_t h, int64_t hd) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(rope_freqs_args("rope_freqs_forward", out, x, inv_freq, b, t, h, hd));
    return rope_any(dev, 0, out, x, pos, inv_freq, 1.0f, b, t, h, hd);
}

static ct_status w_rope_freqs_backward(ct_device *dev, float *dx, const float *dout, const int32_t *pos,
                                       const float *inv_freq, int64_t b, int64_t t, int64_t h, int64_t hd) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(rope_freqs_args("rope_freqs_backward", dx, dout, inv_freq, b, t, h, hd));
    return rope_any(dev, 1, dx, dout, pos, inv_freq, 1.0f, b, t, h, hd);
}

/* The general op: as rope_freqs_* with a table, as rope_* (theta > 0) without. */
static ct_status rope_general_args(const char *op, const void *out, const void *x, const float *inv, float theta,
                                   int64_t b, int64_t t, int64_t h, int64_t hd) {
    if (inv) return rope_freqs_args(op, out, x, inv, b, t, h, hd);
    return rope_theta(op, out, x, 1, b, t, h, hd, theta);
}

static ct_status w_rope_forward_general(ct_device *dev, float *out, const float *x, const int32_t *pos,
                                        const float *inv_freq, float theta, int64_t b, int64_t t, int64_t h,
                                        int64_t hd) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(rope_general_args("rope_forward_general", out, x, inv_freq, theta, b, t, h, hd));
    return rope_any(dev, 0, out, x, pos, inv_freq, theta, b, t, h, hd);
}

static ct_status w_rope_backward_general(ct_device *dev, float *dx, const float *dout, const int32_t *pos,
                                         const float *inv_freq, float theta, int64_t b, int64_t t, int64_t h,
                                         int64_t hd) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(rope_general_args("rope_backward_general", dx, dout, inv_freq, theta, b, t, h, hd));
    return rope_any(dev, 1, dx, dout, pos, inv_freq, theta, b, t, h, hd);
}

static ct_status w_attention_forward(ct_device *dev, float *out, float *lse, const float *q, const float *k,
                                     const float *v, int64_t b, int64_t t, int64_t h, int64_t kvh, int64_t hd) {
    const char *op = "attention_forward";
    if (!dev) return CT_ERR_INVALID;
    CHECK(attention_shape(op, b, t, h, kvh, hd));
    if (b > 0 && t > 0 && h > 0 && (!out || !lse || !q || !k || !v)) return fail(op, "null pointer");
    return real->attention_forward(dev, out, lse, q, k, v, b, t, h, kvh, hd);
}

static ct_status w_attention_backward(ct_device *dev, float *dq, float *dk, float *dv, const float *dout,
                                      const float *q, const float *k, const float *v, const float *out,
                                      const float *lse, int64_t b, int64_t t, int64_t h, int64_t kvh, int64_t hd) {
    const char *op = "attention_backward";
    if (!dev) return CT_ERR_INVALID;
    CHECK(attention_shape(op, b, t, h, kvh, hd));
    if (b > 0 && t > 0 && h > 0 && (!dq || !dk || !dv || !dout || !q || !k || !v || !out || !lse))
        return fail(op, "null pointer");
    return real->attention_backward(dev, dq, dk, dv, dout, q, k, v, out, lse, b, t, h, kvh, hd);
}

static ct_status w_attention_block_forward(ct_device *dev, float *out, float *lse, const float *q, const float *k,
                                           const float *v, const int32_t *q_pos, const int32_t *k_pos, int64_t b,
                                           int64_t tq, int64_t tk, int64_t h, int64_t kvh, int64_t hd) {
    const char *op = "attention_block_forward";
    if (!dev) return CT_ERR_INVALID;
    CHECK(attention_block_shape(op, b, tq, tk, h, kvh, hd));
    if (b > 0 && tq > 0 && h > 0 && (!out || !lse || !q || !q_pos || (tk > 0 && (!k || !v || !k_pos))))
        return fail(op, "null pointer");
    return real->attention_block_forward(dev, out, lse, q, k, v, q_pos, k_pos, b, tq, tk, h, kvh, hd);
}

static ct_status w_attention_block_backward(ct_device *dev, float *dq, float *dk, float *dv, const float *dout,
                                            const float *q, const float *k, const float *v, const float *out,
                                            const float *lse, const int32_t *q_pos, const int32_t *k_pos, int64_t b,
                                            int64_t tq, int64_t tk, int64_t h, int64_t kvh, int64_t hd) {
    const char *op = "attention_block_backward";
    if (!dev) return CT_ERR_INVALID;
    CHECK(attention_block_shape(op, b, tq, tk, h, kvh, hd));
    if (b > 0 && tq > 0 && tk > 0 && h > 0 &&
        (!dq || !dk || !dv || !dout || !q || !k || !v || !out || !lse || !q_pos || !k_pos))
        return fail(op, "null pointer");
    return real->attention_block_backward(dev, dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, b, tq, tk, h, kvh,
                                          hd);
}

static ct_status w_attention_doc_forward(ct_device *dev, float *out, float *lse, const float *q, const float *k,
                                         const float *v, const int32_t *q_pos, const int32_t *k_pos,
                                         const int32_t *q_doc, const int32_t *k_doc, int64_t b, int64_t tq, int64_t tk,
                                         int64_t h, int64_t kvh, int64_t hd) {
    const char *op = "attention_doc_forward";
    if (!dev) return CT_ERR_INVALID;
    CHECK(attention_block_shape(op, b, tq, tk, h, kvh, hd));
    if (b > 0 && tq > 0 && h > 0 &&
        (!out || !lse || !q || !q_pos || !q_doc || (tk > 0 && (!k || !v || !k_pos || !k_doc))))
        return fail(op, "null pointer (positions and document ids are required, (b,tq) and (b,tk))");
    return real->attention_doc_forward(dev, out, lse, q, k, v, q_pos, k_pos, q_doc, k_doc, b, tq, tk, h, kvh, hd);
}

static ct_status w_attention_doc_backward(ct_device *dev, float *dq, float *dk, float *dv, const float *dout,
                                          const float *q, const float *k, const float *v, const float *out,
                                          const float *lse, const int32_t *q_pos, const int32_t *k_pos,
                                          const int32_t *q_doc, const int32_t *k_doc, int64_t b, int64_t tq,
                                          int64_t tk, int64_t h, int64_t kvh, int64_t hd) {
    const char *op = "attention_doc_backward";
    if (!dev) return CT_ERR_INVALID;
    CHECK(attention_block_shape(op, b, tq, tk, h, kvh, hd));
    if (b > 0 && tq > 0 && tk > 0 && h > 0 &&
        (!dq || !dk || !dv || !dout || !q || !k || !v || !out || !lse || !q_pos || !k_pos || !q_doc || !k_doc))
        return fail(op, "null pointer (positions and document ids are required, (b,tq) and (b,tk))");
    return real->attention_doc_backward(dev, dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, q_doc, k_doc, b, tq,
                                        tk, h, kvh, hd);
}

static ct_status w_attention_merge(ct_device *dev, float *out, float *lse, const float *out2, const float *lse2,
                                   int64_t b, int64_t t, int64_t h, int64_t hd) {
    const char *op = "attention_merge";
    if (!dev) return CT_ERR_INVALID;
    if (b < 0 || t < 0 || h < 0 || hd < 0)
        return fail(op, "negative shape b=%lld t=%lld h=%lld d=%lld", (long long)b, (long long)t, (long long)h,
                    (long long)hd);
    if (b > 0 && t > 0 && h > 0 && (!out || !lse || !out2 || !lse2)) return fail(op, "null pointer");
    return real->attention_merge(dev, out, lse, out2, lse2, b, t, h, hd);
}

/* ---- activations ---- */

static ct_status w_swiglu_forward(ct_device *dev, float *out, const float *a, const float *g, int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(length("swiglu_forward", n, out && a && g));
    return real->swiglu_forward(dev, out, a, g, n);
}

static ct_status w_swiglu_backward(ct_device *dev, float *da, float *dg, const float *dout, const float *a,
                                   const float *g, int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(length("swiglu_backward", n, da && dg && dout && a && g));
    return real->swiglu_backward(dev, da, dg, dout, a, g, n);
}

static ct_status w_gelu_forward(ct_device *dev, float *out, const float *x, int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(length("gelu_forward", n, out && x));
    return real->gelu_forward(dev, out, x, n);
}

static ct_status w_gelu_backward(ct_device *dev, float *dx, const float *dout, const float *x, int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(length("gelu_backward", n, dx && dout && x));
    return real->gelu_backward(dev, dx, dout, x, n);
}

/* ---- loss ---- */

static ct_status w_cross_entropy_forward(ct_device *dev, float *losses, const float *logits, const int32_t *targets,
                                         int64_t n, int64_t v, int32_t ignore_index) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(cross_entropy_shape("cross_entropy_forward", targets, n, v));
    return real->cross_entropy_forward(dev, losses, logits, targets, n, v, ignore_index);
}

/* The cross-entropy backward family, checked: the plugin's general op, or for an older plugin the narrow
 * op of the case (an lse: _lse, which takes dloss by value only; dloss on the device: _dev). */
static ct_status xent_any(ct_device *dev, float *dlogits, const float *logits, const int32_t *targets, const float *lse,
                          float dloss, const float *dloss_dev, int64_t n, int64_t v, int64_t begin,
                          int32_t ignore_index) {
    const char *op = "cross_entropy_backward_general";
    if (own_xent)
        return real->cross_entropy_backward_general(dev, dlogits, logits, targets, lse, dloss, dloss_dev, n, v, begin,
                                                    ignore_index);
    if (lse) {
        if (dloss_dev || !real->cross_entropy_backward_lse)
            return lacks(op, dloss_dev ? "a shard's backward with dloss in device memory" : "cross_entropy_backward_lse");
        return real->cross_entropy_backward_lse(dev, dlogits, logits, targets, lse, dloss, n, v, begin, ignore_index);
    }
    if (dloss_dev)
        return real->cross_entropy_backward_dev
                   ? real->cross_entropy_backward_dev(dev, dlogits, logits, targets, dloss_dev, n, v, ignore_index)
                   : lacks(op, "cross_entropy_backward_dev");
    return real->cross_entropy_backward(dev, dlogits, logits, targets, dloss, n, v, ignore_index);
}

static ct_status w_cross_entropy_backward(ct_device *dev, float *dlogits, const float *logits, const int32_t *targets,
                                          float dloss, int64_t n, int64_t v, int32_t ignore_index) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(cross_entropy_shape("cross_entropy_backward", targets, n, v));
    return xent_any(dev, dlogits, logits, targets, NULL, dloss, NULL, n, v, 0, ignore_index);
}

static ct_status w_cross_entropy_backward_dev(ct_device *dev, float *dlogits, const float *logits,
                                              const int32_t *targets, const float *dloss, int64_t n, int64_t v,
                                              int32_t ignore_index) {
    const char *op = "cross_entropy_backward_dev";
    if (!dev) return CT_ERR_INVALID;
    if (!dloss) return fail(op, "null dloss");
    CHECK(cross_entropy_shape(op, targets, n, v));
    return xent_any(dev, dlogits, logits, targets, NULL, 0.0f, dloss, n, v, 0, ignore_index);
}

/* The shard ops: v >= 0 columns (an empty shard is valid), targets not checked (an id outside the
 * shard is simply not in it). */
static ct_status shard_shape(const char *op, int64_t n, int64_t v, int64_t begin) {
    if (n < 0 || v < 0) return fail(op, "negative shape n=%lld v=%lld", (long long)n, (long long)v);
    return vocab_offset(op, begin);
}

static ct_status w_cross_entropy_stats(ct_device *dev, float *stats, const float *logits, const int32_t *targets,
                                       int64_t n, int64_t v, int64_t begin, int32_t ignore_index) {
    const char *op = "cross_entropy_stats";
    if (!dev) return CT_ERR_INVALID;
    CHECK(shard_shape(op, n, v, begin));
    if (n > 0 && !(stats && targets && (v == 0 || logits))) return fail(op, "null pointer");
    return real->cross_entropy_stats(dev, stats, logits, targets, n, v, begin, ignore_index);
}

static ct_status w_cross_entropy_backward_lse(ct_device *dev, float *dlogits, const float *logits,
                                              const int32_t *targets, const float *lse, float dloss, int64_t n,
                                              int64_t v, int64_t begin, int32_t ignore_index) {
    const char *op = "cross_entropy_backward_lse";
    if (!dev) return CT_ERR_INVALID;
    CHECK(shard_shape(op, n, v, begin));
    if (n > 0 && v > 0 && (!dlogits || !logits || !targets || !lse)) return fail(op, "null pointer");
    return xent_any(dev, dlogits, logits, targets, lse, dloss, NULL, n, v, begin, ignore_index);
}

/* The general op checks as the narrow op of its case: whole rows (begin 0) or a shard. */
static ct_status w_cross_entropy_backward_general(ct_device *dev, float *dlogits, const float *logits,
                                                  const int32_t *targets, const float *lse, float dloss,
                                                  const float *dloss_dev, int64_t n, int64_t v, int64_t begin,
                                                  int32_t ignore_index) {
    const char *op = "cross_entropy_backward_general";
    if (!dev) return CT_ERR_INVALID;
    if (lse) {
        CHECK(shard_shape(op, n, v, begin));
        if (n > 0 && v > 0 && (!dlogits || !logits || !targets)) return fail(op, "null pointer");
    } else {
        if (begin != 0) return fail(op, "begin %lld without lse, expected 0 (whole rows)", (long long)begin);
        CHECK(cross_entropy_shape(op, targets, n, v));
    }
    return xent_any(dev, dlogits, logits, targets, lse, dloss, dloss_dev, n, v, begin, ignore_index);
}

/* ---- optimizer and precision ---- */

static ct_status w_adamw(ct_device *dev, float *param, const float *grad, float *m, float *v, int64_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, int64_t step) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(adamw_args("adamw", param && grad && m && v, n, beta1, beta2, step));
    return real->adamw(dev, param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
}

static ct_status w_adamw_bf16_moments(ct_device *dev, float *param, const float *grad, uint32_t *mv, int64_t n,
                                      float lr, float beta1, float beta2, float eps, float weight_decay,
                                      int64_t step) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(adamw_args("adamw_bf16_moments", param && grad && mv, n, beta1, beta2, step));
    return real->adamw_bf16_moments(dev, param, grad, mv, n, lr, beta1, beta2, eps, weight_decay, step);
}

static ct_status w_cast_f32_to_bf16(ct_device *dev, uint16_t *dst, const float *src, int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(length("cast_f32_to_bf16", n, dst && src));
    return real->cast_f32_to_bf16(dev, dst, src, n);
}

static ct_status w_cast_bf16_to_f32(ct_device *dev, float *dst, const uint16_t *src, int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(length("cast_bf16_to_f32", n, dst && src));
    return real->cast_bf16_to_f32(dev, dst, src, n);
}

static ct_status w_round_bf16(ct_device *dev, float *x, int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(length("round_bf16", n, x != NULL));
    return real->round_bf16(dev, x, n);
}

/* The scales are not checked (they may come from a device-side amax). */
static ct_status w_amax(ct_device *dev, float *amax, const float *src, int64_t n, int64_t group) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(groups("amax", n, group));
    if (n > 0 && (!amax || !src)) return fail("amax", "null pointer");
    return real->amax(dev, amax, src, n, group);
}

static ct_status fp8_cast_args(const char *op, int pointers_set, int64_t n, int64_t group, ct_dtype fmt) {
    CHECK(groups(op, n, group));
    CHECK(fp8_format(op, fmt));
    if (n > 0 && !pointers_set) return fail(op, "null pointer");
    return CT_OK;
}

static ct_status w_quantize_fp8(ct_device *dev, uint8_t *dst, const float *src, const float *scale, int64_t n,
                                int64_t group, ct_dtype fmt) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(fp8_cast_args("quantize_fp8", dst && src && scale, n, group, fmt));
    return real->quantize_fp8(dev, dst, src, scale, n, group, fmt);
}

static ct_status w_dequantize_fp8(ct_device *dev, float *dst, const uint8_t *src, const float *scale, int64_t n,
                                  int64_t group, ct_dtype fmt) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(fp8_cast_args("dequantize_fp8", dst && src && scale, n, group, fmt));
    return real->dequantize_fp8(dev, dst, src, scale, n, group, fmt);
}

/* ---- ABI 2.1: elementwise ops (a one-input op checks x as its second input too) ---- */

static ct_status w_ew_axpby(ct_device *dev, float *out, float alpha, const float *x, float beta, const float *y,
                            int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(length("ew_axpby", n, out && x && y));
    return real->ew_axpby(dev, out, alpha, x, beta, y, n);
}

static ct_status w_ew_mul(ct_device *dev, float *out, const float *x, const float *y, int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(length("ew_mul", n, out && x && y));
    return real->ew_mul(dev, out, x, y, n);
}

static ct_status w_ew_div(ct_device *dev, float *out, const float *x, const float *y, float eps, int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(length("ew_div", n, out && x && y));
    return real->ew_div(dev, out, x, y, eps, n);
}

static ct_status w_ew_sqrt(ct_device *dev, float *out, const float *x, int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(length("ew_sqrt", n, out && x));
    return real->ew_sqrt(dev, out, x, n);
}

static ct_status w_ew_sign(ct_device *dev, float *out, const float *x, int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(length("ew_sign", n, out && x));
    return real->ew_sign(dev, out, x, n);
}

static ct_status w_ew_clamp(ct_device *dev, float *out, const float *x, float lo, float hi, int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(length("ew_clamp", n, out && x));
    return real->ew_clamp(dev, out, x, lo, hi, n);
}

static ct_status w_ew_greater(ct_device *dev, float *out, const float *x, const float *y, int64_t n) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(length("ew_greater", n, out && x && y));
    return real->ew_greater(dev, out, x, y, n);
}

/* ---- the table ---- */

/* ---- ABI 2.14: mixture of experts ---- */

/* n rows of e experts, k chosen per row: e > 0, 1 <= k <= e, n*k within int32 (flat pair indices) */
static ct_status moe_shape(const char *op, int64_t n, int64_t e, int64_t k) {
    if (n < 0 || e <= 0 || k < 1 || k > e)
        return fail(op, "shape n=%lld e=%lld k=%lld, expected n >= 0, e > 0 and 1 <= k <= e", (long long)n,
                    (long long)e, (long long)k);
    if (n > INT32_MAX / k)
        return fail(op, "n*k = %lld*%lld exceeds the int32 range of the routing indices", (long long)n, (long long)k);
    return CT_OK;
}

/* n tokens, k slots, d features of the dispatch ops; e is not an argument there */
static ct_status moe_rows(const char *op, int64_t n, int64_t k, int64_t d) {
    if (n < 0 || k < 1 || d < 0)
        return fail(op, "shape n=%lld k=%lld d=%lld, expected n, d >= 0 and k >= 1", (long long)n, (long long)k,
                    (long long)d);
    if (n > INT32_MAX / k)
        return fail(op, "n*k = %lld*%lld exceeds the int32 range of the routing indices", (long long)n, (long long)k);
    return CT_OK;
}

/* The router's n rows of e > 0 experts, and its score function */
static ct_status moe_scores_args(const char *op, int64_t n, int64_t e, int func) {
    if (n < 0 || e <= 0)
        return fail(op, "shape n=%lld e=%lld, expected n >= 0 and e > 0", (long long)n, (long long)e);
    if (func != CT_MOE_SOFTMAX && func != CT_MOE_SIGMOID)
        return fail(op, "score function %d, expected CT_MOE_SOFTMAX (0) or CT_MOE_SIGMOID (1)", func);
    return CT_OK;
}

static ct_status w_moe_scores_forward(ct_device *dev, float *scores, const float *logits, int64_t n, int64_t e,
                                      int func) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(moe_scores_args("moe_scores_forward", n, e, func));
    if (n > 0 && !(scores && logits)) return fail("moe_scores_forward", "null pointer");
    return real->moe_scores_forward(dev, scores, logits, n, e, func);
}

static ct_status w_moe_scores_backward(ct_device *dev, float *dlogits, const float *dscores, const float *scores,
                                       int64_t n, int64_t e, int func) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(moe_scores_args("moe_scores_backward", n, e, func));
    if (n > 0 && !(dlogits && dscores && scores)) return fail("moe_scores_backward", "null pointer");
    return real->moe_scores_backward(dev, dlogits, dscores, scores, n, e, func);
}

static ct_status w_moe_topk_forward(ct_device *dev, int32_t *idx, float *weights, const float *scores,
                                   const float *bias, int64_t n, int64_t e, int64_t k, int64_t n_groups,
                                   int64_t topk_groups, int normalize, float route_scale) {
    const char *op = "moe_topk_forward";
    if (!dev) return CT_ERR_INVALID;
    CHECK(moe_shape(op, n, e, k));
    if (n_groups < 0) return fail(op, "n_groups %lld, expected >= 0", (long long)n_groups);
    if (n_groups > 1) {
        if (e % n_groups != 0)
            return fail(op, "%lld experts do not split into %lld groups", (long long)e, (long long)n_groups);
        if (topk_groups < 1 || topk_groups > n_groups)
            return fail(op, "topk_groups %lld, expected 1..%lld (n_groups)", (long long)topk_groups,
                        (long long)n_groups);
        if (k > topk_groups * (e / n_groups))
            return fail(op, "k=%lld is more than the %lld experts of the %lld eligible groups", (long long)k,
                        (long long)(topk_groups * (e / n_groups)), (long long)topk_groups);
    }
    if (!isfinite(route_scale)) return fail(op, "route_scale %g is not finite", (double)route_scale);
    if (n > 0 && !(idx && weights && scores)) return fail(op, "null pointer");
    return real->moe_topk_forward(dev, idx, weights, scores, bias, n, e, k, n_groups, topk_groups, normalize,
                                  route_scale);
}

static ct_status w_moe_topk_backward(ct_device *dev, float *dscores, const float *dweights, const float *scores,
                                    const int32_t *idx, int64_t n, int64_t e, int64_t k, int normalize,
                                    float route_scale) {
    const char *op = "moe_topk_backward";
    if (!dev) return CT_ERR_INVALID;
    CHECK(moe_shape(op, n, e, k));
    if (!isfinite(route_scale)) return fail(op, "route_scale %g is not finite", (double)route_scale);
    if (n > 0 && !(dscores && dweights && scores && idx)) return fail(op, "null pointer");
    return real->moe_topk_backward(dev, dscores, dweights, scores, idx, n, e, k, normalize, route_scale);
}

static ct_status w_moe_permute(ct_device *dev, int32_t *order, int32_t *inv, int32_t *offsets, const int32_t *idx,
                               int64_t nk, int64_t e) {
    const char *op = "moe_permute";
    if (!dev) return CT_ERR_INVALID;
    if (nk < 0 || e <= 0 || nk > INT32_MAX || e >= INT32_MAX)
        return fail(op, "shape nk=%lld e=%lld, expected 0 <= nk <= %d and e > 0", (long long)nk, (long long)e,
                    INT32_MAX);
    if (!offsets || (nk > 0 && !(order && inv && idx))) return fail(op, "null pointer");
    return real->moe_permute(dev, order, inv, offsets, idx, nk, e);
}

static ct_status w_moe_gather_forward(ct_device *dev, float *out, const float *x, const int32_t *order, int64_t n,
                                      int64_t k, int64_t d) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(moe_rows("moe_gather_forward", n, k, d));
    if (n > 0 && d > 0 && !(out && x && order)) return fail("moe_gather_forward", "null pointer");
    return real->moe_gather_forward(dev, out, x, order, n, k, d);
}

static ct_status w_moe_gather_backward(ct_device *dev, float *dx, const float *dout, const int32_t *inv, int64_t n,
                                       int64_t k, int64_t d) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(moe_rows("moe_gather_backward", n, k, d));
    if (n > 0 && d > 0 && !(dx && dout && inv)) return fail("moe_gather_backward", "null pointer");
    return real->moe_gather_backward(dev, dx, dout, inv, n, k, d);
}

/* The grouped GEMMs' (m, e, o, i): e > 0 experts, m rows within int32 (offsets), o and i within BLAS's int;
 * the offsets always (e + 1 of them), the others when there is work. */
static ct_status grouped_args(const char *op, int pointers_set, const int32_t *offsets, int64_t m, int64_t e,
                              int64_t o, int64_t i) {
    if (m < 0 || e <= 0 || o < 0 || i < 0)
        return fail(op, "shape m=%lld e=%lld o=%lld i=%lld, expected e > 0 and the others >= 0", (long long)m,
                    (long long)e, (long long)o, (long long)i);
    if (m > INT32_MAX || o > INT_MAX || i > INT_MAX || (o > 0 && i > INT64_MAX / o / e))
        return fail(op, "shape m=%lld o=%lld i=%lld exceeds the int range of the GEMMs", (long long)m, (long long)o,
                    (long long)i);
    if (!offsets) return fail(op, "null offsets");
    if (m > 0 && o > 0 && !pointers_set) return fail(op, "null pointer");
    return CT_OK;
}

static ct_status w_grouped_matmul_forward(ct_device *dev, float *y, const float *x, const float *w,
                                          const int32_t *offsets, int64_t m, int64_t e, int64_t o, int64_t i) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(grouped_args("grouped_matmul_forward", y && (i == 0 || (x && w)), offsets, m, e, o, i));
    return real->grouped_matmul_forward(dev, y, x, w, offsets, m, e, o, i);
}

static ct_status w_grouped_matmul_backward_input(ct_device *dev, float *dx, const float *dy, const float *w,
                                                 const int32_t *offsets, int64_t m, int64_t e, int64_t o,
                                                 int64_t i) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(grouped_args("grouped_matmul_backward_input", i == 0 || (dx && dy && w), offsets, m, e, o, i));
    return real->grouped_matmul_backward_input(dev, dx, dy, w, offsets, m, e, o, i);
}

static ct_status w_grouped_matmul_backward_weight(ct_device *dev, float *dw, const float *dy, const float *x,
                                                  const int32_t *offsets, int64_t m, int64_t e, int64_t o,
                                                  int64_t i) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(grouped_args("grouped_matmul_backward_weight", i == 0 || (dw && dy && x), offsets, m, e, o, i));
    return real->grouped_matmul_backward_weight(dev, dw, dy, x, offsets, m, e, o, i);
}

static ct_status w_moe_combine_forward(ct_device *dev, float *out, const float *y, const float *weights,
                                       const int32_t *inv, int64_t n, int64_t k, int64_t d) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(moe_rows("moe_combine_forward", n, k, d));
    if (n > 0 && d > 0 && !(out && y && weights && inv)) return fail("moe_combine_forward", "null pointer");
    return real->moe_combine_forward(dev, out, y, weights, inv, n, k, d);
}

static ct_status w_moe_combine_backward(ct_device *dev, float *dy, float *dweights, const float *dout,
                                        const float *y, const float *weights, const int32_t *inv, int64_t n,
                                        int64_t k, int64_t d) {
    if (!dev) return CT_ERR_INVALID;
    CHECK(moe_rows("moe_combine_backward", n, k, d));
    if (n > 0 && !(dweights && weights && inv && (d == 0 || (dy && dout && y))))
        return fail("moe_combine_backward", "null pointer");
    return real->moe_combine_backward(dev, dy, dweights, dout, y, weights, inv, n, k, d);
}

/* The twelve MoE ops come as a set: a table with some but not all of them offers none (a model
 * pack asks for the set with one NULL check). */
static void moe_all_or_none(void) {
    int have = !!wrapped.moe_scores_forward + !!wrapped.moe_scores_backward + !!wrapped.moe_topk_forward +
               !!wrapped.moe_topk_backward + !!wrapped.moe_permute + !!wrapped.moe_gather_forward +
               !!wrapped.moe_gather_backward + !!wrapped.grouped_matmul_forward +
               !!wrapped.grouped_matmul_backward_input + !!wrapped.grouped_matmul_backward_weight +
               !!wrapped.moe_combine_forward + !!wrapped.moe_combine_backward;
    if (have == 12) return;
    wrapped.moe_scores_forward = NULL;
    wrapped.moe_scores_backward = NULL;
    wrapped.moe_topk_forward = NULL;
    wrapped.moe_topk_backward = NULL;
    wrapped.moe_permute = NULL;
    wrapped.moe_gather_forward = NULL;
    wrapped.moe_gather_backward = NULL;
    wrapped.grouped_matmul_forward = NULL;
    wrapped.grouped_matmul_backward_input = NULL;
    wrapped.grouped_matmul_backward_weight = NULL;
    wrapped.moe_combine_forward = NULL;
    wrapped.moe_combine_backward = NULL;
}

/* Each op the plugin has (set, and inside its table's struct_size) gets its checking wrapper. */
#define WRAP(op)                                                                                                       \
    do {                                                                                                               \
        if (wrapped.op) wrapped.op = w_##op;                                                                           \
    } while (0)

/* The 2.23 families: the general op where the plugin has it or the narrow op of its base case (which
 * every device has: embedding_forward/backward, rope_forward/backward, cross_entropy_backward); each
 * narrow op where the plugin has it or its general op. Both reach the plugin through *_any. */
#define OWN(op) (CT_HAS_FIELD(real, ct_device_api, op) && real->op)
#define FILL(op, have)                                                                                                 \
    do {                                                                                                               \
        wrapped.op = (have) ? w_##op : NULL;                                                                           \
    } while (0)
static void general_and_narrow(void) {
    own_embedding = OWN(embedding_forward_general) && OWN(embedding_backward_general);
    own_rope = OWN(rope_forward_general) && OWN(rope_backward_general);
    own_xent = OWN(cross_entropy_backward_general);
    FILL(embedding_forward_general, own_embedding || real->embedding_forward);
    FILL(embedding_backward_general, own_embedding || real->embedding_backward);
    FILL(embedding_forward, own_embedding || real->embedding_forward);
    FILL(embedding_backward, own_embedding || real->embedding_backward);
    FILL(embedding_forward_range, own_embedding || OWN(embedding_forward_range));
    FILL(embedding_backward_range, own_embedding || OWN(embedding_backward_range));
    FILL(rope_forward_general, own_rope || real->rope_forward);
    FILL(rope_backward_general, own_rope || real->rope_backward);
    FILL(rope_forward, own_rope || real->rope_forward);
    FILL(rope_backward, own_rope || real->rope_backward);
    FILL(rope_forward_pos, own_rope || OWN(rope_forward_pos));
    FILL(rope_backward_pos, own_rope || OWN(rope_backward_pos));
    FILL(rope_freqs_forward, own_rope || OWN(rope_freqs_forward));
    FILL(rope_freqs_backward, own_rope || OWN(rope_freqs_backward));
    FILL(cross_entropy_backward_general, own_xent || real->cross_entropy_backward);
    FILL(cross_entropy_backward, own_xent || real->cross_entropy_backward);
    FILL(cross_entropy_backward_dev, own_xent || OWN(cross_entropy_backward_dev));
    FILL(cross_entropy_backward_lse, own_xent || OWN(cross_entropy_backward_lse));
}

const ct_device_api *devcheck_wrap(const ct_device_api *r, const ct_host *h) {
    real = r;
    host = h;
    capturing = 0;
    capture_failed = CT_OK;
    memset(&wrapped, 0, sizeof wrapped);
    memcpy(&wrapped, r, r->struct_size < sizeof wrapped ? r->struct_size : sizeof wrapped); /* an older table is shorter */
    WRAP(copy);
    WRAP(zero);
    WRAP(copy_2d);
    if (wrapped.graph_begin && wrapped.graph_end) {
        wrapped.graph_begin = w_graph_begin;
        wrapped.graph_end = w_graph_end;
    }
    WRAP(matmul);
    WRAP(axpy);
    WRAP(add);
    WRAP(scale);
    WRAP(sum);
    WRAP(sum_squares);
    WRAP(sum_to_device);
    WRAP(transpose);
    general_and_narrow();
    WRAP(rmsnorm_forward);
    WRAP(rmsnorm_backward_input);
    WRAP(rmsnorm_backward_weight);
    WRAP(layernorm_forward);
    WRAP(layernorm_backward_input);
    WRAP(layernorm_backward_weight);
    WRAP(bias_forward);
    WRAP(bias_backward);
    WRAP(attention_forward);
    WRAP(attention_backward);
    WRAP(attention_block_forward);
    WRAP(attention_block_backward);
    WRAP(attention_merge);
    WRAP(attention_doc_forward);
    WRAP(attention_doc_backward);
    WRAP(swiglu_forward);
    WRAP(swiglu_backward);
    WRAP(gelu_forward);
    WRAP(gelu_backward);
    WRAP(cross_entropy_forward);
    WRAP(cross_entropy_stats);
    WRAP(adamw);
    WRAP(adamw_bf16_moments);
    WRAP(cast_f32_to_bf16);
    WRAP(cast_bf16_to_f32);
    WRAP(round_bf16);
    WRAP(amax);
    WRAP(quantize_fp8);
    WRAP(dequantize_fp8);
    WRAP(ew_axpby);
    WRAP(ew_mul);
    WRAP(ew_div);
    WRAP(ew_sqrt);
    WRAP(ew_sign);
    WRAP(ew_clamp);
    WRAP(ew_greater);
    WRAP(moe_scores_forward);
    WRAP(moe_scores_backward);
    WRAP(moe_topk_forward);
    WRAP(moe_topk_backward);
    WRAP(moe_permute);
    WRAP(moe_gather_forward);
    WRAP(moe_gather_backward);
    WRAP(grouped_matmul_forward);
    WRAP(grouped_matmul_backward_input);
    WRAP(grouped_matmul_backward_weight);
    WRAP(moe_combine_forward);
    WRAP(moe_combine_backward);
    moe_all_or_none();
    wrapped.struct_size = sizeof wrapped; /* the general ops are there whatever the plugin's minor */
    return &wrapped;
}
