/* kernels_rows.cu: row ops: embedding forward, RMSNorm, LayerNorm, bias, cross-entropy.
 *
 * Per-row reductions (norm statistics, softmax max and sum) use one block per row and the fixed
 * order of kernels_common.cuh, accumulating in double where the CPU plugin does. Column sums
 * over rows (weight and bias gradients) are two passes: blocks of 32 columns x CUK_COL_ROWS rows
 * write partial sums (double), then one thread per column adds the partials in row-chunk order
 * and adds the total into the gradient. The chunking depends on n only, so the bits do too.
 *
 * Rows are blockIdx.x (up to 2^31 - 1); a row's columns are looped over by the block's threads.
 */
#include "kernels_common.cuh"

/* ---------------------------------------------------------------- embedding */

/* out (n,c) = table[ids[i] - begin] for ids in [begin, begin + rows), else 0. */
static __global__ void embedding_forward_k(float *out, const int32_t *ids, const float *table, int64_t n,
                                           int64_t c, int64_t begin, int64_t rows,
                                           const unsigned long long *bad)
{
    if (cuk_is_bad(bad, n))
        return;
    int64_t i = blockIdx.x, r = (int64_t)ids[i] - begin;
    float *o = out + i * c;
    if (r >= 0 && r < rows) {
        const float *src = table + r * c;
        for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
            o[j] = src[j];
    } else {
        for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
            o[j] = 0.0f;
    }
}

extern "C" cudaError_t cuk_embedding_forward(const cuk_env *e, float *out, const int32_t *ids,
                                             const float *table, int64_t n, int64_t c, int64_t begin,
                                             int64_t rows, const unsigned long long *bad)
{
    embedding_forward_k<<<(unsigned)n, CUK_THREADS, 0, e->stream>>>(out, ids, table, n, c, begin, rows, bad);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- column sums */

/* Columns per block (one per lane) of the two-pass column reduction; rows per partial sum (at
 * least; more when n would need more than CUK_COL_CHUNKS chunks: the partials stay small). */
#define CUK_COL_BLOCK 32
#define CUK_COL_ROWS 256
#define CUK_COL_CHUNKS 1024

typedef enum col_mode {
    COL_BIAS = 0,      /* sum dout */
    COL_RMSNORM = 1,   /* sum dout * x * rstd */
    COL_LAYERNORM = 2, /* sum dout * (x - mean) * rstd, and sum dout */
} col_mode;

/* Block (32, 8): lane tx owns a column, the 8 rows of threads walk rows r0 + ty, r0 + ty + 8, ..
 * of the block's chunk of `per` rows; the 8 sums are then added in ty order.
 * partial (nchunks, c) [x2]. */
static __global__ void colsum_partial_k(double *partial_a, double *partial_b, const float *dout,
                                        const float *x, const float *mean, const float *rstd, int64_t n,
                                        int64_t c, int64_t per, int mode)
{
    __shared__ double sa[8][CUK_COL_BLOCK], sb[8][CUK_COL_BLOCK];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t col = (int64_t)blockIdx.x * CUK_COL_BLOCK + tx;
    const int64_t r0 = (int64_t)blockIdx.y * per;
    const int64_t r1 = r0 + per < n ? r0 + per : n;
    double acc_a = 0, acc_b = 0;
    if (col < c)
        for (int64_t r = r0 + ty; r < r1; r += 8) {
            double g = (double)dout[r * c + col];
            if (mode == COL_BIAS) {
                acc_a += g;
            } else if (mode == COL_RMSNORM) {
                acc_a += g * (double)x[r * c + col] * (double)rstd[r];
            } else {
                acc_a += g * (((double)x[r * c + col] - (double)mean[r]) * (double)rstd[r]);
                acc_b += g;
            }
        }
    sa[ty][tx] = acc_a;
    sb[ty][tx] = acc_b;
    __syncthreads();
    if (ty == 0 && col < c) {
        double a = 0, b = 0;
        for (int k = 0; k < 8; k++) {
            a += sa[k][tx];
            b += sb[k][tx];
        }
        partial_a[(int64_t)blockIdx.y * c + col] = a;
        if (partial_b)
            partial_b[(int64_t)blockIdx.y * c + col] = b;
    }
}

/* dst_a[col] += sum of the chunks' partials, in chunk order (dst_b likewise when set). */
static __global__ void colsum_finish_k(float *dst_a, float *dst_b, const double *partial_a,
                                       const double *partial_b, int64_t nchunks, int64_t c)
{
    CUK_FOR(col, c) {
        double a = 0, b = 0;
        for (int64_t k = 0; k < nchunks; k++) {
            a += partial_a[k * c + col];
            if (dst_b)
                b += partial_b[k * c + col];
        }
        dst_a[col] += (float)a;
        if (dst_b)
            dst_b[col] += (float)b;
    }
}

static cudaError_t colsum(const cuk_env *e, float *dst_a, float *dst_b, const float *dout, const float *x,
                          const float *mean, const float *rstd, int64_t n, int64_t c, int mode)
{
    /* the chunking depends on n alone, so the summation order does too */
    int64_t nchunks = (n + CUK_COL_ROWS - 1) / CUK_COL_ROWS, cblocks = (c + CUK_COL_BLOCK - 1) / CUK_COL_BLOCK;
    if (nchunks > CUK_COL_CHUNKS)
        nchunks = CUK_COL_CHUNKS;
    const int64_t per = (n + nchunks - 1) / nchunks;
    nchunks = (n + per - 1) / per;
    if (cblocks > 2147483647)
        return cudaErrorInvalidConfiguration;
    int two = mode == COL_LAYERNORM && dst_b;
    double *partial =
        (double *)cuda_scratch_get(e->dev, sizeof(double) * (size_t)(nchunks * c) * (two ? 2 : 1));
    if (!partial)
        return cudaErrorMemoryAllocation;
    double *partial_b = two ? partial + nchunks * c : NULL;
    colsum_partial_k<<<dim3((unsigned)cblocks, (unsigned)nchunks), dim3(CUK_COL_BLOCK, 8), 0, e->stream>>>(
        partial, partial_b, dout, x, mean, rstd, n, c, per, mode);
    colsum_finish_k<<<cuk_grid(e, c, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(dst_a, two ? dst_b : NULL,
                                                                                  partial, partial_b, nchunks, c);
    cudaError_t err = cudaGetLastError();
    cuda_scratch_put(e->dev, partial);
    return err;
}

/* ---------------------------------------------------------------- rmsnorm */

/* out (n,c) = x * rstd * w;  rstd (n) = 1/sqrt(mean(x^2) + eps), the mean in double.
 * out may alias x: each element is read and written by the same thread. */
static __global__ void rmsnorm_forward_k(float *out, float *rstd, const float *x, const float *w, int64_t c,
                                         float eps)
{
    __shared__ double red[32];
    const int64_t row = blockIdx.x;
    const float *xr = x + row * c;
    float *orow = out + row * c;
    double ss = 0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        double v = (double)xr[j];
        ss += v * v;
    }
    ss = cuk_block_sum(ss, red);
    float r = (float)(1.0 / sqrt(ss / (double)c + (double)eps));
    if (threadIdx.x == 0)
        rstd[row] = r;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
        orow[j] = xr[j] * r * w[j];
}

/* dx_j += r w_j g_j - x_j r^3 / c * sum_k g_k w_k x_k */
static __global__ void rmsnorm_backward_input_k(float *dx, const float *dout, const float *x, const float *w,
                                                const float *rstd, int64_t c)
{
    __shared__ double red[32];
    const int64_t row = blockIdx.x;
    const float *xr = x + row * c, *gr = dout + row * c;
    float *dxr = dx + row * c;
    double dot = 0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
        dot += (double)gr[j] * (double)w[j] * (double)xr[j];
    dot = cuk_block_sum(dot, red);
    float r = rstd[row];
    float k = (float)(dot * (double)r * (double)r * (double)r / (double)c);
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
        dxr[j] += r * w[j] * gr[j] - xr[j] * k;
}

extern "C" cudaError_t cuk_rmsnorm_forward(const cuk_env *e, float *out, float *rstd, const float *x,
                                           const float *w, int64_t n, int64_t c, float eps)
{
    rmsnorm_forward_k<<<(unsigned)n, CUK_THREADS, 0, e->stream>>>(out, rstd, x, w, c, eps);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_rmsnorm_backward_input(const cuk_env *e, float *dx, const float *dout, const float *x,
                                                  const float *w, const float *rstd, int64_t n, int64_t c)
{
    rmsnorm_backward_input_k<<<(unsigned)n, CUK_THREADS, 0, e->stream>>>(dx, dout, x, w, rstd, c);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_rmsnorm_backward_weight(const cuk_env *e, float *dw, const float *dout, const float *x,
                                                   const float *rstd, int64_t n, int64_t c)
{
    return colsum(e, dw, NULL, dout, x, NULL, rstd, n, c, COL_RMSNORM);
}

/* ---------------------------------------------------------------- layernorm */

/* out (n,c) = (x - mean) * rstd * w + b (b may be NULL); mean and variance in double, two passes. */
static __global__ void layernorm_forward_k(float *out, float *mean, float *rstd, const float *x, const float *w,
                                           const float *b, int64_t c, float eps)
{
    __shared__ double red[32];
    const int64_t row = blockIdx.x;
    const float *xr = x + row * c;
    float *orow = out + row * c;
    double s = 0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
        s += (double)xr[j];
    s = cuk_block_sum(s, red);
    double mu = s / (double)c, var = 0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        double dlt = (double)xr[j] - mu;
        var += dlt * dlt;
    }
    var = cuk_block_sum(var, red);
    float m = (float)mu, r = (float)(1.0 / sqrt(var / (double)c + (double)eps));
    if (threadIdx.x == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
        orow[j] = (xr[j] - m) * r * w[j] + (b ? b[j] : 0.0f);
}

/* dx += r * (g w - mean(g w) - xhat * mean(g w xhat)),  xhat = (x - mean) r */
static __global__ void layernorm_backward_input_k(float *dx, const float *dout, const float *x, const float *w,
                                                  const float *mean, const float *rstd, int64_t c)
{
    __shared__ double red[32];
    const int64_t row = blockIdx.x;
    const float *xr = x + row * c, *gr = dout + row * c;
    float *dxr = dx + row * c;
    const float m = mean[row], r = rstd[row];
    double s_gw = 0, s_gwx = 0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        double gw = (double)gr[j] * (double)w[j];
        s_gw += gw;
        s_gwx += gw * ((double)xr[j] - (double)m) * (double)r;
    }
    s_gw = cuk_block_sum(s_gw, red);
    s_gwx = cuk_block_sum(s_gwx, red);
    float mean_gw = (float)(s_gw / (double)c), mean_gwx = (float)(s_gwx / (double)c);
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        float xhat = (xr[j] - m) * r;
        dxr[j] += r * (gr[j] * w[j] - mean_gw - xhat * mean_gwx);
    }
}

extern "C" cudaError_t cuk_layernorm_forward(const cuk_env *e, float *out, float *mean, float *rstd,
                                             const float *x, const float *w, const float *b, int64_t n,
                                             int64_t c, float eps)
{
    layernorm_forward_k<<<(unsigned)n, CUK_THREADS, 0, e->stream>>>(out, mean, rstd, x, w, b, c, eps);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_layernorm_backward_input(const cuk_env *e, float *dx, const float *dout,
                                                    const float *x, const float *w, const float *mean,
                                                    const float *rstd, int64_t n, int64_t c)
{
    layernorm_backward_input_k<<<(unsigned)n, CUK_THREADS, 0, e->stream>>>(dx, dout, x, w, mean, rstd, c);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_layernorm_backward_weight(const cuk_env *e, float *dw, float *db, const float *dout,
                                                     const float *x, const float *mean, const float *rstd,
                                                     int64_t n, int64_t c)
{
    return colsum(e, dw, db, dout, x, mean, rstd, n, c, COL_LAYERNORM);
}

/* ---------------------------------------------------------------- bias */

/* out (n,c) = x + bias broadcast over rows; out may alias x */
static __global__ void bias_forward_k(float *out, const float *x, const float *bias, int64_t c)
{
    const int64_t row = blockIdx.x;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
        out[row * c + j] = x[row * c + j] + bias[j];
}

extern "C" cudaError_t cuk_bias_forward(const cuk_env *e, float *out, const float *x, const float *bias,
                                        int64_t n, int64_t c)
{
    bias_forward_k<<<(unsigned)n, CUK_THREADS, 0, e->stream>>>(out, x, bias, c);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_bias_backward(const cuk_env *e, float *dbias, const float *dout, int64_t n, int64_t c)
{
    return colsum(e, dbias, NULL, dout, NULL, NULL, NULL, n, c, COL_BIAS);
}

/* ---------------------------------------------------------------- cross-entropy */

/* Threads per row of the cross-entropy kernels (rows are long: a vocabulary). */
#define CUK_CE_THREADS 512

/* The row's max and sum exp(x - max) (in double), in every thread. */
static __device__ void row_softmax_stats(const float *x, int64_t v, float *mx_out, double *sum_out,
                                         float *redf, double *redd)
{
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x)
        mx = fmaxf(mx, x[j]);
    mx = cuk_block_max(mx, redf);
    double s = 0;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x)
        s += (double)expf(x[j] - mx);
    *sum_out = cuk_block_sum(s, redd);
    *mx_out = mx;
}

/* losses (n) = (max - logits[target]) + log sum exp(logits - max); 0 where ignored */
static __global__ void cross_entropy_forward_k(float *losses, const float *logits, const int32_t *targets,
                                               int64_t n, int64_t v, int32_t ignore_index,
                                               const unsigned long long *bad)
{
    __shared__ float redf[32];
    __shared__ double redd[32];
    if (cuk_is_bad(bad, n))
        return;
    const int64_t row = blockIdx.x;
    const int32_t t = targets[row];
    if (t == ignore_index) {
        if (threadIdx.x == 0)
            losses[row] = 0.0f;
        return;
    }
    const float *x = logits + row * v;
    float mx;
    double s;
    row_softmax_stats(x, v, &mx, &s, redf, redd);
    if (threadIdx.x == 0)
        losses[row] = (float)((double)(mx - x[t]) + log(s));
}

/* dlogits (n,v) += dloss * (softmax - onehot(target)) on rows not ignored; as the CPU plugin:
 * dx += (dloss / sum) * exp(x - max), then dx[target] -= dloss (one thread does both). */
static __global__ void cross_entropy_backward_k(float *dlogits, const float *logits, const int32_t *targets,
                                                float dloss_value, const float *dloss_dev, int64_t n, int64_t v,
                                                int32_t ignore_index, const unsigned long long *bad)
{
    __shared__ float redf[32];
    __shared__ double redd[32];
    if (cuk_is_bad(bad, n))
        return;
    const int64_t row = blockIdx.x;
    const int32_t t = targets[row];
    if (t == ignore_index)
        return;
    const float *x = logits + row * v;
    float *dx = dlogits + row * v;
    float mx;
    double s;
    row_softmax_stats(x, v, &mx, &s, redf, redd);
    const float dloss = dloss_dev ? *dloss_dev : dloss_value;
    float w = (float)((double)dloss / s);
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
        dx[j] += w * expf(x[j] - mx);
        if (j == t)
            dx[j] -= dloss;
    }
}

/* stats (n,3) = {max, sum exp(x - max), the target's logit or 0}; v == 0: {-inf, 0, 0}. */
static __global__ void cross_entropy_stats_k(float *stats, const float *logits, const int32_t *targets,
                                             int64_t v, int64_t begin, int32_t ignore_index)
{
    __shared__ float redf[32];
    __shared__ double redd[32];
    const int64_t row = blockIdx.x;
    float *st = stats + row * 3;
    if (v == 0) {
        if (threadIdx.x == 0) {
            st[0] = -INFINITY;
            st[1] = 0.0f;
            st[2] = 0.0f;
        }
        return;
    }
    const float *x = logits + row * v;
    float mx;
    double s;
    row_softmax_stats(x, v, &mx, &s, redf, redd);
    if (threadIdx.x == 0) {
        int64_t t = (int64_t)targets[row] - begin;
        st[0] = mx;
        st[1] = (float)s;
        st[2] = targets[row] != ignore_index && t >= 0 && t < v ? x[t] : 0.0f;
    }
}

/* dlogits (n,v) += dloss * exp(logits - lse[row]), then -= dloss at the target's column (when it
 * is in this shard); rows whose target is ignore_index are left alone. dloss_dev (device, one f32)
 * replaces dloss_value when not NULL. Fully parallel:
 * grid.x = rows, grid.y = column slices. */
static __global__ void cross_entropy_backward_lse_k(float *dlogits, const float *logits, const int32_t *targets,
                                                    const float *lse, float dloss_value, const float *dloss_dev,
                                                    int64_t v, int64_t begin, int32_t ignore_index)
{
    const int64_t row = blockIdx.x;
    const int32_t target = targets[row];
    if (target == ignore_index)
        return;
    const float dloss = dloss_dev ? *dloss_dev : dloss_value;
    const int64_t t = (int64_t)target - begin;
    const float l = lse[row];
    const float *x = logits + row * v;
    float *dx = dlogits + row * v;
    for (int64_t j = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; j < v; j += (int64_t)gridDim.y * blockDim.x) {
        float g = dx[j] + dloss * expf(x[j] - l);
        if (j == t)
            g -= dloss;
        dx[j] = g;
    }
}

extern "C" cudaError_t cuk_cross_entropy_forward(const cuk_env *e, float *losses, const float *logits,
                                                 const int32_t *targets, int64_t n, int64_t v,
                                                 int32_t ignore_index, const unsigned long long *bad)
{
    cross_entropy_forward_k<<<(unsigned)n, CUK_CE_THREADS, 0, e->stream>>>(losses, logits, targets, n, v,
                                                                            ignore_index, bad);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_cross_entropy_backward(const cuk_env *e, float *dlogits, const float *logits,
                                                  const int32_t *targets, float dloss, const float *dloss_dev,
                                                  int64_t n, int64_t v, int32_t ignore_index,
                                                  const unsigned long long *bad)
{
    cross_entropy_backward_k<<<(unsigned)n, CUK_CE_THREADS, 0, e->stream>>>(dlogits, logits, targets, dloss,
                                                                             dloss_dev, n, v, ignore_index, bad);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_cross_entropy_stats(const cuk_env *e, float *stats, const float *logits,
                                               const int32_t *targets, int64_t n, int64_t v, int64_t begin,
                                               int32_t ignore_index)
{
    cross_entropy_stats_k<<<(unsigned)n, CUK_CE_THREADS, 0, e->stream>>>(stats, logits, targets, v, begin,
                                                                          ignore_index);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_cross_entropy_backward_lse(const cuk_env *e, float *dlogits, const float *logits,
                                                      const int32_t *targets, const float *lse, float dloss,
                                                      const float *dloss_dev, int64_t n, int64_t v, int64_t begin,
                                                      int32_t ignore_index)
{
    int64_t slices = (v + CUK_THREADS * 4 - 1) / (CUK_THREADS * 4);
    if (slices > 65535)
        slices = 65535;
    if (slices < 1)
        slices = 1;
    cross_entropy_backward_lse_k<<<dim3((unsigned)n, (unsigned)slices), CUK_THREADS, 0, e->stream>>>(
        dlogits, logits, targets, lse, dloss, dloss_dev, v, begin, ignore_index);
    return cudaGetLastError();
}
