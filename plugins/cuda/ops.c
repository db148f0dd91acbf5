/* ops.c: the CUDA plugin's ops of ABI 1.0 (but matmul, in blas.c): what only the GPU checks, then
 * the launchers of kernels.h.
 *
 * The host checks every op's arguments before it gets here (core/host/devcheck.c: shapes, null
 * pointers, ..., with the messages both devices give), so an op sees a valid call. What only the
 * GPU adds: shapes past the grid limits (CT_ERR_UNSUPPORTED), and ids and targets that live in
 * device memory: cuk_find_bad_id finds the first bad one on the GPU, the op's kernels skip their
 * work when there is one, and the answer is read back (one wait on the stream) to return
 * CT_ERR_INVALID naming that entry, so a refused call changes nothing, as on the CPU.
 */
#include "cuda_device.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>

/* ---------------------------------------------------------------- ids checked on the GPU */

/* Enqueues the check of ids (n) against [0, limit) (entries equal to skip pass when use_skip)
 * into d->flag. The caller holds d->op_lock until ids_check_end. */
static ct_status ids_check_begin(cuda_device *d, const char *op, const int32_t *ids, int64_t n, int64_t limit,
                                 int use_skip, int32_t skip)
{
    cudaError_t e = cuk_find_bad_id(&d->env, d->flag, ids, n, limit, use_skip, skip);
    return e == cudaSuccess ? CT_OK : cuda_error(d, op, "kernel launch (id check)", e);
}

/* Waits for the check: CT_OK, or CT_ERR_INVALID naming the first bad entry of `what`. */
static ct_status ids_check_end(cuda_device *d, const char *op, const char *what, const int32_t *ids, int64_t n,
                               int64_t limit, int use_skip, int32_t skip)
{
    if (d->capture) /* a graph cannot wait for the answer: the op's kernels still skip on a bad id */
        return CT_OK;
    unsigned long long bad = 0;
    ct_status st = cuda_readback(d, op, &bad, d->flag, sizeof bad);
    if (st != CT_OK || bad >= (unsigned long long)n)
        return st;
    int32_t id = 0;
    if ((st = cuda_readback(d, op, &id, ids + bad, sizeof id)) != CT_OK)
        return st;
    if (use_skip)
        return cuda_fail(d, CT_ERR_INVALID, op, "%s[%llu] = %d is outside [0, %lld) and not ignore_index %d", what,
                         bad, id, (long long)limit, skip);
    return cuda_fail(d, CT_ERR_INVALID, op, "%s[%llu] = %d is outside [0, %lld)", what, bad, id, (long long)limit);
}

/* ---------------------------------------------------------------- dense algebra */

ct_status cuda_axpy(ct_device *dev, float *y, const float *x, float alpha, int64_t n)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "axpy");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_axpy(&d->env, y, x, alpha, n);
    if (e != cudaSuccess)
        return cuda_error(d, "axpy", "kernel launch", e);
    return CT_OK;
}

ct_status cuda_add(ct_device *dev, float *out, const float *a, const float *b, int64_t n)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "add");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_add(&d->env, out, a, b, n);
    if (e != cudaSuccess)
        return cuda_error(d, "add", "kernel launch", e);
    return CT_OK;
}

ct_status cuda_scale(ct_device *dev, float *x, float alpha, int64_t n)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "scale");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_scale(&d->env, x, alpha, n);
    if (e != cudaSuccess)
        return cuda_error(d, "scale", "kernel launch", e);
    return CT_OK;
}

/* sum or sum of squares in double on the GPU, read back (waits for the stream) */
static ct_status sum_generic(cuda_device *d, const char *op, double *out, const float *x, int64_t n, int squares)
{
    if (n == 0) {
        *out = 0;
        return CT_OK;
    }
    ct_status st = cuda_enter(d, op);
    if (st != CT_OK)
        return st;
    pthread_mutex_lock(&d->op_lock);
    cudaError_t e = cuk_sum(&d->env, d->dsum, NULL, x, n, squares);
    st = e == cudaSuccess ? cuda_readback(d, op, out, d->dsum, sizeof *out) : cuda_error(d, op, "kernel launch", e);
    pthread_mutex_unlock(&d->op_lock);
    return st;
}

ct_status cuda_sum(ct_device *dev, double *out, const float *x, int64_t n)
{
    cuda_device *d = dev;
    return sum_generic(d, "sum", out, x, n, 0);
}

ct_status cuda_sum_squares(ct_device *dev, double *out, const float *x, int64_t n)
{
    cuda_device *d = dev;
    return sum_generic(d, "sum_squares", out, x, n, 1);
}

ct_status cuda_sum_to_device(ct_device *dev, float *out, const float *x, int64_t n)
{
    cuda_device *d = dev;
    ct_status st = cuda_enter(d, "sum_to_device");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_sum(&d->env, NULL, out, x, n, 0); /* n == 0: one empty block, *out = 0 */
    if (e != cudaSuccess)
        return cuda_error(d, "sum_to_device", "kernel launch", e);
    return CT_OK;
}

/* ---------------------------------------------------------------- embedding */

/* The forward and backward of the full table: ids checked against vocab on the GPU. */
static ct_status embedding_checked(cuda_device *d, const char *op, float *dst, const int32_t *ids,
                                   const float *src, int64_t n, int64_t c, int64_t vocab, int backward)
{
    if (n == 0)
        return CT_OK;
    if (c > 0 && (!dst || !src))
        return cuda_fail(d, CT_ERR_INVALID, op, "null pointer");
    if (n > INT32_MAX || vocab >= INT32_MAX || c > (int64_t)65535 * 128)
        return cuda_fail(d, CT_ERR_UNSUPPORTED, op, "shape n=%lld c=%lld vocab=%lld exceeds the CUDA kernels' limits",
                         (long long)n, (long long)c, (long long)vocab);
    ct_status st = cuda_enter(d, op);
    if (st != CT_OK)
        return st;
    pthread_mutex_lock(&d->op_lock);
    st = ids_check_begin(d, op, ids, n, vocab, 0, 0);
    if (st == CT_OK && c > 0) {
        cudaError_t e = backward ? cuk_embedding_backward(&d->env, dst, ids, src, n, c, 0, vocab, d->flag)
                                 : cuk_embedding_forward(&d->env, dst, ids, src, n, c, 0, vocab, d->flag);
        if (e != cudaSuccess)
            st = cuda_error(d, op, "kernel launch", e);
    }
    if (st == CT_OK)
        st = ids_check_end(d, op, "ids", ids, n, vocab, 0, 0);
    pthread_mutex_unlock(&d->op_lock);
    return st;
}

/* A shard's rows [begin, begin + rows): an id outside them gives a zero row, or adds nothing. */
static ct_status embedding_ranged(cuda_device *d, const char *op, float *dst, const int32_t *ids, const float *src,
                                  int64_t n, int64_t c, int64_t begin, int64_t rows, int backward)
{
    if (n == 0 || c == 0 || (backward && rows == 0))
        return CT_OK;
    if (n > INT32_MAX || (backward && (rows >= INT32_MAX || c > (int64_t)65535 * 128)))
        return cuda_fail(d, CT_ERR_UNSUPPORTED, op, "shape n=%lld c=%lld rows=%lld exceeds the CUDA kernels' limits",
                         (long long)n, (long long)c, (long long)rows);
    ct_status st = cuda_enter(d, op);
    if (st != CT_OK)
        return st;
    cudaError_t e = backward ? cuk_embedding_backward(&d->env, dst, ids, src, n, c, begin, rows, NULL)
                             : cuk_embedding_forward(&d->env, dst, ids, src, n, c, begin, rows, NULL);
    return e == cudaSuccess ? CT_OK : cuda_error(d, op, "kernel launch", e);
}

/* ABI 2.23: strict (begin 0) checks the ids against the whole table; otherwise the table is a shard. */
ct_status cuda_embedding_forward_general(ct_device *dev, float *out, const int32_t *ids, const float *table, int64_t n,
                                         int64_t c, int64_t begin, int64_t rows, int strict)
{
    cuda_device *d = dev;
    const char *op = "embedding_forward_general";
    return strict ? embedding_checked(d, op, out, ids, table, n, c, rows, 0)
                  : embedding_ranged(d, op, out, ids, table, n, c, begin, rows, 0);
}

ct_status cuda_embedding_backward_general(ct_device *dev, float *dtable, const int32_t *ids, const float *dout,
                                          int64_t n, int64_t c, int64_t begin, int64_t rows, int strict)
{
    cuda_device *d = dev;
    const char *op = "embedding_backward_general";
    return strict ? embedding_checked(d, op, dtable, ids, dout, n, c, rows, 1)
                  : embedding_ranged(d, op, dtable, ids, dout, n, c, begin, rows, 1);
}

/* ---------------------------------------------------------------- norms, bias */

ct_status cuda_rmsnorm_forward(ct_device *dev, float *out, float *rstd, const float *x, const float *w, int64_t n,
                               int64_t c, float eps)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    if (n > INT32_MAX)
        return cuda_fail(d, CT_ERR_UNSUPPORTED, "rmsnorm_forward", "%lld rows exceed the CUDA grid (2^31 - 1 blocks)",
                         (long long)n);
    ct_status st = cuda_enter(d, "rmsnorm_forward");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_rmsnorm_forward(&d->env, out, rstd, x, w, n, c, eps);
    if (e != cudaSuccess)
        return cuda_error(d, "rmsnorm_forward", "kernel launch", e);
    return CT_OK;
}

ct_status cuda_rmsnorm_backward_input(ct_device *dev, float *dx, const float *dout, const float *x, const float *w,
                                      const float *rstd, int64_t n, int64_t c)
{
    cuda_device *d = dev;
    if (n == 0 || c == 0)
        return CT_OK;
    if (n > INT32_MAX)
        return cuda_fail(d, CT_ERR_UNSUPPORTED, "rmsnorm_backward_input",
                         "%lld rows exceed the CUDA grid (2^31 - 1 blocks)", (long long)n);
    ct_status st = cuda_enter(d, "rmsnorm_backward_input");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_rmsnorm_backward_input(&d->env, dx, dout, x, w, rstd, n, c);
    if (e != cudaSuccess)
        return cuda_error(d, "rmsnorm_backward_input", "kernel launch", e);
    return CT_OK;
}

ct_status cuda_rmsnorm_backward_weight(ct_device *dev, float *dw, const float *dout, const float *x,
                                       const float *rstd, int64_t n, int64_t c)
{
    cuda_device *d = dev;
    if (n == 0 || c == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "rmsnorm_backward_weight");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_rmsnorm_backward_weight(&d->env, dw, dout, x, rstd, n, c);
    if (e != cudaSuccess)
        return cuda_error(d, "rmsnorm_backward_weight", "kernel launch", e);
    return CT_OK;
}

ct_status cuda_layernorm_forward(ct_device *dev, float *out, float *mean, float *rstd, const float *x, const float *w,
                                 const float *b, int64_t n, int64_t c, float eps)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    if (n > INT32_MAX)
        return cuda_fail(d, CT_ERR_UNSUPPORTED, "layernorm_forward", "%lld rows exceed the CUDA grid (2^31 - 1 blocks)",
                         (long long)n);
    ct_status st = cuda_enter(d, "layernorm_forward");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_layernorm_forward(&d->env, out, mean, rstd, x, w, b, n, c, eps);
    if (e != cudaSuccess)
        return cuda_error(d, "layernorm_forward", "kernel launch", e);
    return CT_OK;
}

ct_status cuda_layernorm_backward_input(ct_device *dev, float *dx, const float *dout, const float *x, const float *w,
                                        const float *mean, const float *rstd, int64_t n, int64_t c)
{
    cuda_device *d = dev;
    if (n == 0 || c == 0)
        return CT_OK;
    if (n > INT32_MAX)
        return cuda_fail(d, CT_ERR_UNSUPPORTED, "layernorm_backward_input",
                         "%lld rows exceed the CUDA grid (2^31 - 1 blocks)", (long long)n);
    ct_status st = cuda_enter(d, "layernorm_backward_input");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_layernorm_backward_input(&d->env, dx, dout, x, w, mean, rstd, n, c);
    if (e != cudaSuccess)
        return cuda_error(d, "layernorm_backward_input", "kernel launch", e);
    return CT_OK;
}

ct_status cuda_layernorm_backward_weight(ct_device *dev, float *dw, float *db, const float *dout, const float *x,
                                         const float *mean, const float *rstd, int64_t n, int64_t c)
{
    cuda_device *d = dev;
    if (n == 0 || c == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "layernorm_backward_weight");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_layernorm_backward_weight(&d->env, dw, db, dout, x, mean, rstd, n, c);
    if (e != cudaSuccess)
        return cuda_error(d, "layernorm_backward_weight", "kernel launch", e);
    return CT_OK;
}

ct_status cuda_bias_forward(ct_device *dev, float *out, const float *x, const float *bias, int64_t n, int64_t c)
{
    cuda_device *d = dev;
    if (n == 0 || c == 0)
        return CT_OK;
    if (n > INT32_MAX)
        return cuda_fail(d, CT_ERR_UNSUPPORTED, "bias_forward", "%lld rows exceed the CUDA grid (2^31 - 1 blocks)",
                         (long long)n);
    ct_status st = cuda_enter(d, "bias_forward");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_bias_forward(&d->env, out, x, bias, n, c);
    if (e != cudaSuccess)
        return cuda_error(d, "bias_forward", "kernel launch", e);
    return CT_OK;
}

ct_status cuda_bias_backward(ct_device *dev, float *dbias, const float *dout, int64_t n, int64_t c)
{
    cuda_device *d = dev;
    if (n == 0 || c == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "bias_backward");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_bias_backward(&d->env, dbias, dout, n, c);
    if (e != cudaSuccess)
        return cuda_error(d, "bias_backward", "kernel launch", e);
    return CT_OK;
}

/* ---------------------------------------------------------------- rope */

/* pos: the rows' positions, or NULL for rows 0..t-1; inv: the model's frequency table (then theta
 * is unused), or NULL for theta^(-2i/d) */
static ct_status rope_launch(cuda_device *d, const char *op, float *out, const float *x, const int32_t *pos,
                             const float *inv, int64_t b, int64_t t, int64_t h, int64_t hd, float theta, int backward)
{
    if (b == 0 || t == 0 || h == 0 || hd == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, op);
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_rope(&d->env, out, x, pos, inv, b, t, h, hd, theta, backward);
    return e == cudaSuccess ? CT_OK : cuda_error(d, op, "kernel launch", e);
}

/* ABI 2.23: every case of RoPE (pos and inv_freq each optional). */
ct_status cuda_rope_forward_general(ct_device *dev, float *out, const float *x, const int32_t *pos,
                                    const float *inv_freq, float theta, int64_t b, int64_t t, int64_t h, int64_t hd)
{
    cuda_device *d = dev;
    return rope_launch(d, "rope_forward_general", out, x, pos, inv_freq, b, t, h, hd, theta, 0);
}

ct_status cuda_rope_backward_general(ct_device *dev, float *dx, const float *dout, const int32_t *pos,
                                     const float *inv_freq, float theta, int64_t b, int64_t t, int64_t h, int64_t hd)
{
    cuda_device *d = dev;
    return rope_launch(d, "rope_backward_general", dx, dout, pos, inv_freq, b, t, h, hd, theta, 1);
}

/* ---------------------------------------------------------------- attention */

/* The GPU kernels' limits (the host checked the shape): head dim, grid, shared memory. */
static ct_status attention_check(cuda_device *d, const char *op, int64_t b, int64_t h, int64_t hd)
{
    if (hd > CUK_ATTENTION_MAX_D)
        return cuda_fail(d, CT_ERR_UNSUPPORTED, op, "head dim %lld: the CUDA attention kernels take d <= %d",
                         (long long)hd, CUK_ATTENTION_MAX_D);
    if (b > 65535 || h > 65535)
        return cuda_fail(d, CT_ERR_UNSUPPORTED, op, "b=%lld or h=%lld exceeds the CUDA grid (65535)", (long long)b,
                         (long long)h);
    size_t need = cuk_attention_smem_bytes(hd);
    if (need > d->env.smem_optin)
        return cuda_fail(d, CT_ERR_UNSUPPORTED, op,
                         "head dim %lld needs %zu bytes of shared memory per block; %s allows %zu", (long long)hd,
                         need, d->name, d->env.smem_optin);
    return CT_OK;
}

ct_status cuda_attention_forward(ct_device *dev, float *out, float *lse, const float *q, const float *k,
                                 const float *v, int64_t b, int64_t t, int64_t h, int64_t kvh, int64_t hd)
{
    cuda_device *d = dev;
    ct_status st = attention_check(d, "attention_forward", b, h, hd);
    if (st != CT_OK)
        return st;
    if (b == 0 || t == 0 || h == 0)
        return CT_OK;
    st = cuda_enter(d, "attention_forward");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_attention_forward(&d->env, out, lse, q, k, v, b, t, h, kvh, hd);
    if (e != cudaSuccess)
        return cuda_error(d, "attention_forward", "kernel launch", e);
    return CT_OK;
}

ct_status cuda_attention_backward(ct_device *dev, float *dq, float *dk, float *dv, const float *dout, const float *q,
                                  const float *k, const float *v, const float *out, const float *lse, int64_t b,
                                  int64_t t, int64_t h, int64_t kvh, int64_t hd)
{
    cuda_device *d = dev;
    ct_status st = attention_check(d, "attention_backward", b, h, hd);
    if (st != CT_OK)
        return st;
    if (b == 0 || t == 0 || h == 0)
        return CT_OK;
    st = cuda_enter(d, "attention_backward");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_attention_backward(&d->env, dq, dk, dv, dout, q, k, v, out, lse, b, t, h, kvh, hd);
    if (e != cudaSuccess)
        return cuda_error(d, "attention_backward", "kernel launch", e);
    return CT_OK;
}

/* ---------------------------------------------------------------- attention by blocks (ABI 2.3) */

ct_status cuda_attention_block_forward(ct_device *dev, float *out, float *lse, const float *q, const float *k,
                                       const float *v, const int32_t *q_pos, const int32_t *k_pos, int64_t b,
                                       int64_t tq, int64_t tk, int64_t h, int64_t kvh, int64_t hd)
{
    cuda_device *d = dev;
    const char *op = "attention_block_forward";
    ct_status st = attention_check(d, op, b, h, hd);
    if (st != CT_OK)
        return st;
    if (b == 0 || tq == 0 || h == 0)
        return CT_OK;
    if (tk == 0) { /* no key tile: the kernel reads none of these, they only need to be addresses */
        k = v = q;
        k_pos = q_pos;
    }
    st = cuda_enter(d, op);
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_attention_block_forward(&d->env, out, lse, q, k, v, q_pos, k_pos, b, tq, tk, h, kvh, hd);
    if (e != cudaSuccess)
        return cuda_error(d, op, "kernel launch", e);
    return CT_OK;
}

ct_status cuda_attention_merge(ct_device *dev, float *out, float *lse, const float *out2, const float *lse2, int64_t b,
                               int64_t t, int64_t h, int64_t hd)
{
    cuda_device *d = dev;
    if (b == 0 || t == 0 || h == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "attention_merge");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_attention_merge(&d->env, out, lse, out2, lse2, b, t, h, hd);
    if (e != cudaSuccess)
        return cuda_error(d, "attention_merge", "kernel launch", e);
    return CT_OK;
}

ct_status cuda_attention_block_backward(ct_device *dev, float *dq, float *dk, float *dv, const float *dout,
                                        const float *q, const float *k, const float *v, const float *out,
                                        const float *lse, const int32_t *q_pos, const int32_t *k_pos, int64_t b,
                                        int64_t tq, int64_t tk, int64_t h, int64_t kvh, int64_t hd)
{
    cuda_device *d = dev;
    const char *op = "attention_block_backward";
    ct_status st = attention_check(d, op, b, h, hd);
    if (st != CT_OK)
        return st;
    if (b == 0 || tq == 0 || tk == 0 || h == 0)
        return CT_OK;
    st = cuda_enter(d, op);
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_attention_block_backward(&d->env, dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, b, tq,
                                                 tk, h, kvh, hd);
    if (e != cudaSuccess)
        return cuda_error(d, op, "kernel launch", e);
    return CT_OK;
}

/* ---------------------------------------------------------------- attention over documents (ABI 2.13) */

ct_status cuda_attention_doc_forward(ct_device *dev, float *out, float *lse, const float *q, const float *k,
                                     const float *v, const int32_t *q_pos, const int32_t *k_pos, const int32_t *q_doc,
                                     const int32_t *k_doc, int64_t b, int64_t tq, int64_t tk, int64_t h, int64_t kvh,
                                     int64_t hd)
{
    cuda_device *d = dev;
    const char *op = "attention_doc_forward";
    ct_status st = attention_check(d, op, b, h, hd);
    if (st != CT_OK)
        return st;
    if (b == 0 || tq == 0 || h == 0)
        return CT_OK;
    if (tk == 0) { /* no key tile: the kernel reads none of these, they only need to be addresses */
        k = v = q;
        k_pos = q_pos;
        k_doc = q_doc;
    }
    st = cuda_enter(d, op);
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_attention_doc_forward(&d->env, out, lse, q, k, v, q_pos, k_pos, q_doc, k_doc, b, tq, tk, h,
                                              kvh, hd);
    if (e != cudaSuccess)
        return cuda_error(d, op, "kernel launch", e);
    return CT_OK;
}

ct_status cuda_attention_doc_backward(ct_device *dev, float *dq, float *dk, float *dv, const float *dout,
                                      const float *q, const float *k, const float *v, const float *out,
                                      const float *lse, const int32_t *q_pos, const int32_t *k_pos,
                                      const int32_t *q_doc, const int32_t *k_doc, int64_t b, int64_t tq, int64_t tk,
                                      int64_t h, int64_t kvh, int64_t hd)
{
    cuda_device *d = dev;
    const char *op = "attention_doc_backward";
    ct_status st = attention_check(d, op, b, h, hd);
    if (st != CT_OK)
        return st;
    if (b == 0 || tq == 0 || tk == 0 || h == 0)
        return CT_OK;
    st = cuda_enter(d, op);
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_attention_doc_backward(&d->env, dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, q_doc,
                                               k_doc, b, tq, tk, h, kvh, hd);
    if (e != cudaSuccess)
        return cuda_error(d, op, "kernel launch", e);
    return CT_OK;
}

/* ---------------------------------------------------------------- activations */

ct_status cuda_swiglu_forward(ct_device *dev, float *out, const float *a, const float *g, int64_t n)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "swiglu_forward");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_swiglu_forward(&d->env, out, a, g, n);
    if (e != cudaSuccess)
        return cuda_error(d, "swiglu_forward", "kernel launch", e);
    return CT_OK;
}

ct_status cuda_swiglu_backward(ct_device *dev, float *da, float *dg, const float *dout, const float *a,
                               const float *g, int64_t n)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "swiglu_backward");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_swiglu_backward(&d->env, da, dg, dout, a, g, n);
    if (e != cudaSuccess)
        return cuda_error(d, "swiglu_backward", "kernel launch", e);
    return CT_OK;
}

ct_status cuda_gelu_forward(ct_device *dev, float *out, const float *x, int64_t n)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "gelu_forward");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_gelu_forward(&d->env, out, x, n);
    if (e != cudaSuccess)
        return cuda_error(d, "gelu_forward", "kernel launch", e);
    return CT_OK;
}

ct_status cuda_gelu_backward(ct_device *dev, float *dx, const float *dout, const float *x, int64_t n)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "gelu_backward");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_gelu_backward(&d->env, dx, dout, x, n);
    if (e != cudaSuccess)
        return cuda_error(d, "gelu_backward", "kernel launch", e);
    return CT_OK;
}

/* ---------------------------------------------------------------- cross-entropy */

/* Shapes and pointers, then the targets checked on the GPU around the op's kernel. */
static ct_status cross_entropy_checked(cuda_device *d, const char *op, float *dst, const float *logits,
                                       const int32_t *targets, float dloss, const float *dloss_dev, int64_t n,
                                       int64_t v, int32_t ignore_index, int backward)
{
    if (n == 0)
        return CT_OK;
    if (!dst || !logits)
        return cuda_fail(d, CT_ERR_INVALID, op, "null pointer");
    if (n > INT32_MAX)
        return cuda_fail(d, CT_ERR_UNSUPPORTED, op, "%lld rows exceed the CUDA grid (2^31 - 1 blocks)", (long long)n);
    ct_status st = cuda_enter(d, op);
    if (st != CT_OK)
        return st;
    pthread_mutex_lock(&d->op_lock);
    st = ids_check_begin(d, op, targets, n, v, 1, ignore_index);
    if (st == CT_OK) {
        cudaError_t e =
            backward ? cuk_cross_entropy_backward(&d->env, dst, logits, targets, dloss, dloss_dev, n, v, ignore_index,
                                                  d->flag)
                     : cuk_cross_entropy_forward(&d->env, dst, logits, targets, n, v, ignore_index, d->flag);
        if (e != cudaSuccess)
            st = cuda_error(d, op, "kernel launch", e);
    }
    if (st == CT_OK)
        st = ids_check_end(d, op, "targets", targets, n, v, 1, ignore_index);
    pthread_mutex_unlock(&d->op_lock);
    return st;
}

ct_status cuda_cross_entropy_forward(ct_device *dev, float *losses, const float *logits, const int32_t *targets,
                                     int64_t n, int64_t v, int32_t ignore_index)
{
    cuda_device *d = dev;
    return cross_entropy_checked(d, "cross_entropy_forward", losses, logits, targets, 0.0f, NULL, n, v, ignore_index,
                                 0);
}

/* A shard of each row (lse given): targets not checked, an id outside this shard's columns is simply
 * not here. */
static ct_status cross_entropy_backward_shard(cuda_device *d, const char *op, float *dlogits, const float *logits,
                                              const int32_t *targets, const float *lse, float dloss,
                                              const float *dloss_dev, int64_t n, int64_t v, int64_t begin,
                                              int32_t ignore_index)
{
    if (n == 0 || v == 0)
        return CT_OK;
    if (n > INT32_MAX)
        return cuda_fail(d, CT_ERR_UNSUPPORTED, op, "%lld rows exceed the CUDA grid (2^31 - 1 blocks)", (long long)n);
    ct_status st = cuda_enter(d, op);
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_cross_entropy_backward_lse(&d->env, dlogits, logits, targets, lse, dloss, dloss_dev, n, v,
                                                   begin, ignore_index);
    return e == cudaSuccess ? CT_OK : cuda_error(d, op, "kernel launch", e);
}

/* ABI 2.23: whole rows (lse NULL, targets checked) or a shard; dloss_dev, when set, replaces dloss. */
ct_status cuda_cross_entropy_backward_general(ct_device *dev, float *dlogits, const float *logits,
                                              const int32_t *targets, const float *lse, float dloss,
                                              const float *dloss_dev, int64_t n, int64_t v, int64_t begin,
                                              int32_t ignore_index)
{
    cuda_device *d = dev;
    const char *op = "cross_entropy_backward_general";
    if (lse)
        return cross_entropy_backward_shard(d, op, dlogits, logits, targets, lse, dloss, dloss_dev, n, v, begin,
                                            ignore_index);
    return cross_entropy_checked(d, op, dlogits, logits, targets, dloss, dloss_dev, n, v, ignore_index, 1);
}

/* ---------------------------------------------------------------- optimizer, precision */

/* adamw's and adamw_bf16_moments' device entered, and the CPU plugin's
 * constants (bias corrections in double, the rest in float) into c[3]: step_size, bc2_sqrt, decay.
 * CT_OK with n > 0 to launch; *skip for n == 0. */
static ct_status adamw_prepare(cuda_device *d, const char *op, int64_t n, float lr, float beta1,
                               float beta2, float weight_decay, int64_t step, float c[3], int *skip)
{
    *skip = n == 0;
    double bc1 = 1.0 - pow((double)beta1, (double)step), bc2 = 1.0 - pow((double)beta2, (double)step);
    c[0] = (float)((double)lr / bc1), c[1] = (float)sqrt(bc2), c[2] = 1 - lr * weight_decay;
    return *skip ? CT_OK : cuda_enter(d, op);
}

ct_status cuda_adamw(ct_device *dev, float *param, const float *grad, float *m, float *v, int64_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, int64_t step)
{
    cuda_device *d = dev;
    float c[3];
    int skip;
    ct_status st = adamw_prepare(d, "adamw", n, lr, beta1, beta2, weight_decay, step, c, &skip);
    if (st != CT_OK || skip)
        return st;
    cudaError_t e = cuk_adamw(&d->env, param, grad, m, v, n, beta1, beta2, eps, c[0], c[1], c[2]);
    return e == cudaSuccess ? CT_OK : cuda_error(d, "adamw", "kernel launch", e);
}

ct_status cuda_adamw_bf16_moments(ct_device *dev, float *param, const float *grad, uint32_t *mv, int64_t n, float lr,
                                  float beta1, float beta2, float eps, float weight_decay, int64_t step)
{
    cuda_device *d = dev;
    float c[3];
    int skip;
    ct_status st = adamw_prepare(d, "adamw_bf16_moments", n, lr, beta1, beta2, weight_decay, step, c, &skip);
    if (st != CT_OK || skip)
        return st;
    cudaError_t e = cuk_adamw_bf16_moments(&d->env, param, grad, mv, n, beta1, beta2, eps, c[0], c[1], c[2]);
    return e == cudaSuccess ? CT_OK : cuda_error(d, "adamw_bf16_moments", "kernel launch", e);
}

ct_status cuda_cast_f32_to_bf16(ct_device *dev, uint16_t *dst, const float *src, int64_t n)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "cast_f32_to_bf16");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_cast_f32_to_bf16(&d->env, dst, src, n);
    if (e != cudaSuccess)
        return cuda_error(d, "cast_f32_to_bf16", "kernel launch", e);
    return CT_OK;
}

ct_status cuda_cast_bf16_to_f32(ct_device *dev, float *dst, const uint16_t *src, int64_t n)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "cast_bf16_to_f32");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_cast_bf16_to_f32(&d->env, dst, src, n);
    if (e != cudaSuccess)
        return cuda_error(d, "cast_bf16_to_f32", "kernel launch", e);
    return CT_OK;
}

ct_status cuda_round_bf16(ct_device *dev, float *x, int64_t n)
{
    cuda_device *d = dev;
    if (n == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "round_bf16");
    if (st != CT_OK)
        return st;
    cudaError_t e = cuk_round_bf16(&d->env, x, n);
    if (e != cudaSuccess)
        return cuda_error(d, "round_bf16", "kernel launch", e);
    return CT_OK;
}
