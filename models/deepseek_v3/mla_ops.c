/* mla_ops.c: column split, column join (with a one-head operand repeated over the heads, or zero padding)
 * and a scalar multiply, as custom ops: forward now, backward on the host's tape. Copies go through the
 * device's copy_2d where it has one, else a copy per row. Backward accumulates (+=) into the inputs'
 * gradients through a scratch buffer, as every op's backward does. */
#include "mla_ops.h"

#include <ctitan/device.h>

#include <string.h>

static int64_t numel(const ct_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

static ct_status device_of(ct_builder *b, const ct_device_api **d, ct_device **dev) {
    if (!CT_HAS_FIELD(b, ct_builder, device) || !b->device) return CT_ERR_UNSUPPORTED;
    return b->device(b, d, dev);
}

/* dst[r * ds + j] = src[r * ss + j], r < rows, j < cols */
static ct_status copy_cols(const ct_device_api *d, ct_device *dev, float *dst, int64_t ds, const float *src,
                           int64_t ss, int64_t rows, int64_t cols) {
    if (CT_HAS_FIELD(d, ct_device_api, copy_2d) && d->copy_2d) return d->copy_2d(dev, dst, ds, src, ss, rows, cols);
    for (int64_t r = 0; r < rows; r++) {
        ct_status st = d->copy(dev, dst + r * ds, src + r * ss, sizeof(float) * (size_t)cols, CT_COPY_D2D);
        if (st != CT_OK) return st;
    }
    return CT_OK;
}

/* g (rows, cols) += columns [at, at + cols) of dy (rows, stride) */
static ct_status add_cols(ct_builder *b, const ct_device_api *d, ct_device *dev, float *g, const float *dy,
                          int64_t stride, int64_t at, int64_t rows, int64_t cols) {
    float *tmp = b->scratch(b, sizeof(float) * (size_t)(rows * cols));
    if (!tmp) return CT_ERR_NOMEM;
    ct_status st = copy_cols(d, dev, tmp, cols, dy + at, stride, rows, cols);
    return st != CT_OK ? st : d->axpy(dev, g, tmp, 1.0f, rows * cols);
}

static ct_tensor *shaped(ct_builder *b, const ct_tensor *like, int64_t last) {
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, like->shape, sizeof(int64_t) * (size_t)like->ndim);
    shape[like->ndim - 1] = last;
    return b->new_tensor(b, CT_F32, like->ndim, shape);
}

/* ---- split: x (rows, a + c) -> (rows, a), (rows, c) ---- */

typedef struct split_state {
    int64_t a;
    int n_out;
} split_state;

static ct_status split_shapes(ct_builder *b, const split_state *s, const ct_tensor *x, ct_tensor **out) {
    int64_t w = x->shape[x->ndim - 1];
    if (!(out[0] = shaped(b, x, s->a))) return CT_ERR_NOMEM;
    if (s->n_out > 1 && !(out[1] = shaped(b, x, w - s->a))) return CT_ERR_NOMEM;
    return CT_OK;
}

static ct_status split_fwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    const split_state *s = sp;
    const ct_tensor *x = in[0];
    const ct_device_api *d;
    ct_device *dev;
    (void)n_in;
    (void)n_out;
    ct_status st = device_of(b, &d, &dev);
    if (st != CT_OK || (st = split_shapes(b, s, x, out)) != CT_OK) return st;
    int64_t w = x->shape[x->ndim - 1], rows = numel(x) / w;
    st = copy_cols(d, dev, out[0]->data, s->a, x->data, w, rows, s->a);
    if (st == CT_OK && s->n_out > 1)
        st = copy_cols(d, dev, out[1]->data, w - s->a, (const float *)x->data + s->a, w, rows, w - s->a);
    return st;
}

static ct_status split_bwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                           const float *const *dy, int n_out, int halves) {
    const split_state *s = sp;
    ct_tensor *x = in[0];
    const ct_device_api *d;
    ct_device *dev;
    (void)n_in;
    (void)out;
    if (!(halves & CT_GRAD_INPUT) || (!dy[0] && (n_out < 2 || !dy[1]))) return CT_OK;
    ct_status st = device_of(b, &d, &dev);
    float *g = st == CT_OK ? b->grad(b, x) : NULL;
    if (!g) return st != CT_OK ? st : CT_ERR_NOMEM;
    int64_t w = x->shape[x->ndim - 1], rows = numel(x) / w, widths[2] = {s->a, w - s->a};
    for (int k = 0; k < n_out && st == CT_OK; k++) {
        if (!dy[k]) continue;
        float *tmp = b->scratch(b, sizeof(float) * (size_t)(rows * w));
        if (!tmp) return CT_ERR_NOMEM;
        /* g's columns of output k += dy[k]: through a zeroed (rows, w) buffer holding dy[k] in those columns */
        if ((st = d->zero(dev, tmp, sizeof(float) * (size_t)(rows * w))) != CT_OK) return st;
        if ((st = copy_cols(d, dev, tmp + (k ? s->a : 0), w, dy[k], widths[k], rows, widths[k])) != CT_OK) return st;
        st = d->axpy(dev, g, tmp, 1.0f, rows * w);
    }
    return st;
}

static ct_status split_plan(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                            ct_op_cost *cost) {
    (void)n_in;
    (void)n_out;
    ct_status st = split_shapes(b, sp, in[0], out);
    double bytes = (double)numel(in[0]) * sizeof(float);
    cost->matmul_dtype = CT_F32;
    cost->bytes[0] = 2 * bytes;
    cost->bytes[1] = 4 * bytes;
    return st;
}

static const ct_custom_op split_op = {sizeof(ct_custom_op), "deepseek_v3.split", split_fwd, split_bwd, split_plan};

ct_status mla_split(ct_builder *b, ct_tensor *x, int64_t a, ct_tensor **lo, ct_tensor **hi) {
    split_state s = {a, hi ? 2 : 1};
    ct_tensor *out[2] = {NULL, NULL};
    ct_status st = b->custom(b, &split_op, &s, sizeof s, &x, 1, out, s.n_out);
    if (st != CT_OK) return st;
    *lo = out[0];
    if (hi) *hi = out[1];
    return CT_OK;
}

/* ---- join: x (rows, a) and y (rows / rep, c) repeated over rep consecutive rows, or zeros -> (rows, a + c) ---- */

typedef struct join_state {
    int64_t c, rep; /* y's columns; rows of x per row of y (1: y is per head; H: one head repeated) */
} join_state;

static ct_status join_fwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    const join_state *s = sp;
    const ct_tensor *x = in[0];
    const ct_device_api *d;
    ct_device *dev;
    (void)n_out;
    ct_status st = device_of(b, &d, &dev);
    if (st != CT_OK) return st;
    int64_t a = x->shape[x->ndim - 1], w = a + s->c, rows = numel(x) / a;
    if (!(out[0] = shaped(b, x, w))) return CT_ERR_NOMEM;
    float *o = out[0]->data;
    if (n_in < 2 && (st = d->zero(dev, o, sizeof(float) * (size_t)(rows * w))) != CT_OK) return st; /* the padding */
    if ((st = copy_cols(d, dev, o, w, x->data, a, rows, a)) != CT_OK || n_in < 2) return st;
    for (int64_t h = 0; h < s->rep && st == CT_OK; h++) /* y's row r goes to x's rows r * rep + h */
        st = copy_cols(d, dev, o + h * w + a, s->rep * w, in[1]->data, s->c, rows / s->rep, s->c);
    return st;
}

static ct_status join_bwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                          const float *const *dy, int n_out, int halves) {
    const join_state *s = sp;
    ct_tensor *x = in[0];
    const ct_device_api *d;
    ct_device *dev;
    (void)out;
    (void)n_out;
    if (!(halves & CT_GRAD_INPUT) || !dy[0]) return CT_OK;
    ct_status st = device_of(b, &d, &dev);
    if (st != CT_OK) return st;
    int64_t a = x->shape[x->ndim - 1], w = a + s->c, rows = numel(x) / a;
    float *gx = b->grad(b, x);
    if (!gx) return CT_ERR_NOMEM;
    if ((st = add_cols(b, d, dev, gx, dy[0], w, 0, rows, a)) != CT_OK || n_in < 2) return st;
    float *gy = b->grad(b, in[1]);
    if (!gy) return CT_ERR_NOMEM;
    for (int64_t h = 0; h < s->rep && st == CT_OK; h++) /* a repeated y sums its copies' gradients */
        st = add_cols(b, d, dev, gy, dy[0] + h * w, s->rep * w, a, rows / s->rep, s->c);
    return st;
}

static ct_status join_plan(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                           ct_op_cost *cost) {
    const join_state *s = sp;
    const ct_tensor *x = in[0];
    (void)n_in;
    (void)n_out;
    int64_t a = x->shape[x->ndim - 1];
    if (!(out[0] = shaped(b, x, a + s->c))) return CT_ERR_NOMEM;
    double bytes = (double)numel(out[0]) * sizeof(float);
    cost->matmul_dtype = CT_F32;
    cost->bytes[0] = 2 * bytes;
    cost->bytes[1] = 4 * bytes;
    return CT_OK;
}

static const ct_custom_op join_op = {sizeof(ct_custom_op), "deepseek_v3.join", join_fwd, join_bwd, join_plan};

ct_tensor *mla_join(ct_builder *b, ct_tensor *x, ct_tensor *y, int64_t c) {
    join_state s = {y ? y->shape[y->ndim - 1] : c, 1};
    if (y && y->ndim == 4 && x->ndim == 4) s.rep = x->shape[2] / y->shape[2];
    ct_tensor *in[2] = {x, y}, *out = NULL;
    return b->custom(b, &join_op, &s, sizeof s, in, y ? 2 : 1, &out, 1) == CT_OK ? out : NULL;
}

/* ---- scale: s * x ---- */

static ct_status scale_fwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out) {
    const ct_device_api *d;
    ct_device *dev;
    (void)n_in;
    (void)n_out;
    ct_status st = device_of(b, &d, &dev);
    if (st != CT_OK) return st;
    int64_t n = numel(in[0]);
    if (!(out[0] = b->new_tensor(b, CT_F32, in[0]->ndim, in[0]->shape))) return CT_ERR_NOMEM;
    if ((st = d->copy(dev, out[0]->data, in[0]->data, sizeof(float) * (size_t)n, CT_COPY_D2D)) != CT_OK) return st;
    return d->scale(dev, out[0]->data, *(const float *)sp, n);
}

static ct_status scale_bwd(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor *const *out,
                           const float *const *dy, int n_out, int halves) {
    const ct_device_api *d;
    ct_device *dev;
    (void)n_in;
    (void)out;
    (void)n_out;
    if (!(halves & CT_GRAD_INPUT) || !dy[0]) return CT_OK;
    ct_status st = device_of(b, &d, &dev);
    float *g = st == CT_OK ? b->grad(b, in[0]) : NULL;
    if (!g) return st != CT_OK ? st : CT_ERR_NOMEM;
    return d->axpy(dev, g, dy[0], *(const float *)sp, numel(in[0]));
}

static ct_status scale_plan(ct_builder *b, void *sp, ct_tensor *const *in, int n_in, ct_tensor **out, int n_out,
                            ct_op_cost *cost) {
    (void)sp;
    (void)n_in;
    (void)n_out;
    if (!(out[0] = b->new_tensor(b, CT_F32, in[0]->ndim, in[0]->shape))) return CT_ERR_NOMEM;
    double bytes = (double)numel(in[0]) * sizeof(float);
    cost->matmul_dtype = CT_F32;
    cost->bytes[0] = 2 * bytes;
    cost->bytes[1] = 3 * bytes;
    return CT_OK;
}

static const ct_custom_op scale_op = {sizeof(ct_custom_op), "deepseek_v3.scale", scale_fwd, scale_bwd, scale_plan};

ct_tensor *mla_scale(ct_builder *b, ct_tensor *x, float s) {
    ct_tensor *out = NULL;
    return b->custom(b, &scale_op, &s, sizeof s, &x, 1, &out, 1) == CT_OK ? out : NULL;
}
