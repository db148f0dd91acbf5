/* kernels_moe.cu: the mixture-of-experts kernels (ABI 2.14). Nothing here reads back to the host:
 * every size that depends on the routing (an expert's rows, the tiles of the grouped GEMMs) is
 * found on the device, so a step with MoE layers stays asynchronous and capturable.
 *
 *   scores     one warp per row (softmax: warp max and sum), or elementwise (sigmoid)
 *   top-k      one thread per row: k passes over the row, each taking the best expert that ranks
 *              after the previous choice (larger score + bias, then lower index); group-limited
 *              routing ranks the groups first into scratch (2 values per group and row)
 *   permute    a stable radix sort (CUB) of (expert, flat index) pairs, then offsets[g] as the
 *              lower bound of g in the sorted keys (a binary search per expert)
 *   gather, combine   elementwise over output elements, slots summed in order of s; combine's
 *              dweights one warp per (token, slot)
 *   grouped GEMM      16 x 16 output tiles. Forward and backward_input: the grid's x covers an upper
 *              bound on the (expert, row tile) pairs, sum over g of ceil(rows_g / 16) <= ceil(m / 16) + e,
 *              and each block finds its pair by walking the offsets; blocks past the last pair
 *              exit. backward_weight: one block per (expert, o tile, i tile), the reduction over
 *              the expert's rows.
 *
 * Every sum runs in an order fixed by the shapes: the same inputs give the same bits. Indices out
 * of range are skipped, never read through. The grouped GEMM is a plain shared-memory tiled GEMM in
 * f32 (correctness first): tensor-core speed needs a grouped GEMM library, and cuBLASLt's grouped
 * and batched forms want each group's size on the host.
 */
#include "kernels_common.cuh"

#include <cub/device/device_radix_sort.cuh>

/* Side of the grouped GEMM's square output tiles (TILE x TILE threads per block). */
#define CUK_MOE_TILE 16
/* Rows per block of the warp-per-row kernels. */
#define CUK_MOE_WARPS (CUK_THREADS / 32)

/* ---------------------------------------------------------------- router scores */

static __global__ void moe_softmax_k(float *scores, const float *logits, int64_t n, int64_t e)
{
    const int64_t t = (int64_t)blockIdx.x * CUK_MOE_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (t >= n)
        return;
    const float *l = logits + t * e;
    float *s = scores + t * e;
    float m = -INFINITY;
    for (int64_t j = lane; j < e; j += 32)
        m = fmaxf(m, l[j]);
    m = cuk_warp_max(m);
    float sum = 0;
    for (int64_t j = lane; j < e; j += 32)
        sum += expf(l[j] - m);
    sum = cuk_warp_sum(sum);
    for (int64_t j = lane; j < e; j += 32)
        s[j] = expf(l[j] - m) / sum;
}

static __global__ void moe_sigmoid_k(float *scores, const float *logits, int64_t n)
{
    CUK_FOR(i, n) {
        scores[i] = 1.0f / (1.0f + expf(-logits[i]));
    }
}

static __global__ void moe_softmax_backward_k(float *dlogits, const float *dscores, const float *scores, int64_t n,
                                              int64_t e)
{
    const int64_t t = (int64_t)blockIdx.x * CUK_MOE_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (t >= n)
        return;
    const float *s = scores + t * e, *ds = dscores + t * e;
    float dot = 0;
    for (int64_t j = lane; j < e; j += 32)
        dot += ds[j] * s[j];
    dot = cuk_warp_sum(dot);
    for (int64_t j = lane; j < e; j += 32)
        dlogits[t * e + j] += s[j] * (ds[j] - dot);
}

static __global__ void moe_sigmoid_backward_k(float *dlogits, const float *dscores, const float *scores, int64_t n)
{
    CUK_FOR(i, n) {
        dlogits[i] += dscores[i] * scores[i] * (1.0f - scores[i]);
    }
}

extern "C" cudaError_t cuk_moe_scores(const cuk_env *e, float *out, const float *dscores, const float *in,
                                      int64_t n, int64_t experts, int sigmoid, int backward)
{
    const unsigned rows_grid = (unsigned)((n + CUK_MOE_WARPS - 1) / CUK_MOE_WARPS);
    const int64_t total = n * experts;
    if (sigmoid && !backward)
        moe_sigmoid_k<<<cuk_grid(e, total, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(out, in, total);
    else if (sigmoid)
        moe_sigmoid_backward_k<<<cuk_grid(e, total, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(out, dscores, in,
                                                                                              total);
    else if (!backward)
        moe_softmax_k<<<rows_grid, CUK_THREADS, 0, e->stream>>>(out, in, n, experts);
    else
        moe_softmax_backward_k<<<rows_grid, CUK_THREADS, 0, e->stream>>>(out, dscores, in, n, experts);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- top-k */

/* (a, i) ranks before (b, j): the larger value, and on a tie the lower index */
static __device__ __forceinline__ bool moe_before(float a, int64_t i, float b, int64_t j)
{
    return a > b || (a == b && i < j);
}

static __device__ float moe_group_score(const float *s, const float *bias, int64_t g, int64_t gsize)
{
    float b1 = 0, b2 = 0;
    for (int64_t j = g * gsize, c = 0; j < (g + 1) * gsize; j++, c++) {
        float v = s[j] + (bias ? bias[j] : 0.0f);
        if (c == 0)
            b1 = v;
        else if (v > b1) {
            b2 = b1;
            b1 = v;
        } else if (c == 1 || v > b2)
            b2 = v;
    }
    return gsize >= 2 ? b1 + b2 : b1;
}

/* One thread per row; scratch (n, 2 groups) when groups > 1: the group scores, then eligibility. */
static __global__ void moe_topk_k(int32_t *idx, float *weights, const float *scores, const float *bias,
                                  float *scratch, int64_t n, int64_t e, int64_t k, int64_t groups,
                                  int64_t topk_groups, int normalize, float route_scale)
{
    CUK_FOR(t, n) {
        const float *s = scores + t * e;
        int32_t *ix = idx + t * k;
        float *w = weights + t * k;
        const int64_t gsize = e / groups;
        float *gs = scratch ? scratch + t * 2 * groups : NULL, *eligible = gs ? gs + groups : NULL;
        if (groups > 1) {
            for (int64_t g = 0; g < groups; g++)
                gs[g] = moe_group_score(s, bias, g, gsize);
            for (int64_t g = 0; g < groups; g++) {
                int64_t ahead = 0;
                for (int64_t h = 0; h < groups; h++)
                    ahead += h != g && moe_before(gs[h], h, gs[g], g);
                eligible[g] = ahead < topk_groups ? 1.0f : 0.0f;
            }
        }
        float prev_v = 0;
        int64_t prev_j = -1;
        for (int64_t c = 0; c < k; c++) {
            int64_t best = -1;
            float best_v = 0;
            for (int64_t j = 0; j < e; j++) {
                float v = s[j] + (bias ? bias[j] : 0.0f);
                if (prev_j >= 0 && !moe_before(prev_v, prev_j, v, j))
                    continue;
                if (best >= 0 && !moe_before(v, j, best_v, best))
                    continue;
                if (eligible && eligible[j / gsize] == 0.0f)
                    continue;
                best = j;
                best_v = v;
            }
            ix[c] = (int32_t)(best < 0 ? 0 : best);
            prev_v = best_v;
            prev_j = best;
        }
        float sum = 0;
        for (int64_t c = 0; c < k; c++) {
            w[c] = s[ix[c]];
            sum += w[c];
        }
        float f = normalize ? route_scale / (sum + 1e-20f) : route_scale;
        for (int64_t c = 0; c < k; c++)
            w[c] *= f;
    }
}

extern "C" cudaError_t cuk_moe_topk(const cuk_env *e, int32_t *idx, float *weights, const float *scores,
                                    const float *bias, int64_t n, int64_t experts, int64_t k, int64_t n_groups,
                                    int64_t topk_groups, int normalize, float route_scale)
{
    const int64_t groups = n_groups > 1 ? n_groups : 1;
    float *scratch = NULL;
    if (groups > 1 && !(scratch = (float *)cuda_scratch_get(e->dev, sizeof(float) * (size_t)(n * 2 * groups))))
        return cudaErrorMemoryAllocation;
    moe_topk_k<<<cuk_grid(e, n, 128), 128, 0, e->stream>>>(idx, weights, scores, bias, scratch, n, experts, k,
                                                           groups, topk_groups, normalize, route_scale);
    cudaError_t err = cudaGetLastError();
    if (scratch)
        cuda_scratch_put(e->dev, scratch);
    return err;
}

static __global__ void moe_topk_backward_k(float *dscores, const float *dweights, const float *scores,
                                           const int32_t *idx, int64_t n, int64_t e, int64_t k, int normalize,
                                           float route_scale)
{
    CUK_FOR(t, n) {
        const float *s = scores + t * e, *dw = dweights + t * k;
        const int32_t *ix = idx + t * k;
        float *ds = dscores + t * e;
        if (!normalize) {
            for (int64_t c = 0; c < k; c++)
                if (ix[c] >= 0 && ix[c] < e)
                    ds[ix[c]] += route_scale * dw[c];
            continue;
        }
        float sum = 0, dot = 0;
        for (int64_t c = 0; c < k; c++)
            if (ix[c] >= 0 && ix[c] < e) {
                sum += s[ix[c]];
                dot += dw[c] * s[ix[c]];
            }
        float den = sum + 1e-20f;
        for (int64_t c = 0; c < k; c++)
            if (ix[c] >= 0 && ix[c] < e)
                ds[ix[c]] += route_scale * (dw[c] - dot / den) / den;
    }
}

extern "C" cudaError_t cuk_moe_topk_backward(const cuk_env *e, float *dscores, const float *dweights,
                                             const float *scores, const int32_t *idx, int64_t n, int64_t experts,
                                             int64_t k, int normalize, float route_scale)
{
    moe_topk_backward_k<<<cuk_grid(e, n, 128), 128, 0, e->stream>>>(dscores, dweights, scores, idx, n, experts, k,
                                                                    normalize, route_scale);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- permute */

/* keys[j] = the pair's expert, or e for an index no expert owns; vals[j] = j */
static __global__ void moe_keys_k(int32_t *keys, int32_t *vals, const int32_t *idx, int64_t nk, int64_t e)
{
    CUK_FOR(j, nk) {
        int32_t g = idx[j];
        keys[j] = g >= 0 && g < e ? g : (int32_t)e;
        vals[j] = (int32_t)j;
    }
}

/* inv[order[p]] = p, and offsets[g] = the first sorted position whose key is >= g */
static __global__ void moe_inverse_k(int32_t *inv, int32_t *offsets, const int32_t *order, const int32_t *keys,
                                     int64_t nk, int64_t e)
{
    CUK_FOR(p, nk) {
        inv[order[p]] = (int32_t)p;
    }
    CUK_FOR(g, e + 1) {
        int64_t lo = 0, hi = nk;
        while (lo < hi) {
            int64_t mid = (lo + hi) / 2;
            if (keys[mid] < g)
                lo = mid + 1;
            else
                hi = mid;
        }
        offsets[g] = (int32_t)lo;
    }
}

extern "C" cudaError_t cuk_moe_permute(const cuk_env *e, int32_t *order, int32_t *inv, int32_t *offsets,
                                       const int32_t *idx, int64_t nk, int64_t experts)
{
    int end_bit = 1; /* the sort looks at the key bits that can be set: keys run to `experts` */
    while (end_bit < 31 && ((int64_t)1 << end_bit) <= experts)
        end_bit++;
    const int num = (int)nk;
    size_t temp_bytes = 0;
    cudaError_t err = cub::DeviceRadixSort::SortPairs(NULL, temp_bytes, (const int32_t *)NULL, (int32_t *)NULL,
                                                      (const int32_t *)NULL, (int32_t *)NULL, num, 0, end_bit,
                                                      e->stream);
    if (err != cudaSuccess)
        return err;
    size_t ints = sizeof(int32_t) * (size_t)(nk > 0 ? nk : 1), head = (3 * ints + 255) / 256 * 256;
    char *scratch = (char *)cuda_scratch_get(e->dev, head + temp_bytes);
    if (!scratch)
        return cudaErrorMemoryAllocation;
    int32_t *keys_in = (int32_t *)scratch, *vals_in = keys_in + nk, *keys = vals_in + nk;
    if (nk > 0) {
        moe_keys_k<<<cuk_grid(e, nk, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(keys_in, vals_in, idx, nk, experts);
        err = cudaGetLastError();
        if (err == cudaSuccess)
            err = cub::DeviceRadixSort::SortPairs(scratch + head, temp_bytes, keys_in, keys, vals_in, order, num, 0,
                                                  end_bit, e->stream);
    }
    if (err == cudaSuccess) {
        moe_inverse_k<<<cuk_grid(e, nk > experts ? nk : experts + 1, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(
            inv, offsets, order, keys, nk, experts);
        err = cudaGetLastError();
    }
    cuda_scratch_put(e->dev, scratch);
    return err;
}

/* ---------------------------------------------------------------- gather and combine */

static __global__ void moe_gather_k(float *out, const float *x, const int32_t *order, int64_t nk, int64_t k,
                                    int64_t d)
{
    CUK_FOR(i, nk * d) {
        int64_t j = i / d, c = i % d;
        int32_t p = order[j];
        out[i] = p >= 0 && p < nk ? x[(p / k) * d + c] : 0.0f;
    }
}

static __global__ void moe_gather_backward_k(float *dx, const float *dout, const int32_t *inv, int64_t n, int64_t k,
                                             int64_t d)
{
    const int64_t nk = n * k;
    CUK_FOR(i, n * d) {
        int64_t t = i / d, c = i % d;
        float acc = dx[i];
        for (int64_t s = 0; s < k; s++) {
            int32_t j = inv[t * k + s];
            if (j >= 0 && j < nk)
                acc += dout[(int64_t)j * d + c];
        }
        dx[i] = acc;
    }
}

extern "C" cudaError_t cuk_moe_gather(const cuk_env *e, float *out, const float *in, const int32_t *perm, int64_t n,
                                      int64_t k, int64_t d, int backward)
{
    if (backward)
        moe_gather_backward_k<<<cuk_grid(e, n * d, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(out, in, perm, n, k, d);
    else
        moe_gather_k<<<cuk_grid(e, n * k * d, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(out, in, perm, n * k, k, d);
    return cudaGetLastError();
}

static __global__ void moe_combine_k(float *out, const float *y, const float *weights, const int32_t *inv, int64_t n,
                                     int64_t k, int64_t d)
{
    const int64_t nk = n * k;
    CUK_FOR(i, n * d) {
        int64_t t = i / d, c = i % d;
        float acc = 0;
        for (int64_t s = 0; s < k; s++) {
            int32_t j = inv[t * k + s];
            if (j >= 0 && j < nk)
                acc += weights[t * k + s] * y[(int64_t)j * d + c];
        }
        out[i] = acc;
    }
}

/* dy rows: one writer per (t, s) when inv is a permutation */
static __global__ void moe_combine_dy_k(float *dy, const float *dout, const float *weights, const int32_t *inv,
                                        int64_t n, int64_t k, int64_t d)
{
    const int64_t nk = n * k;
    CUK_FOR(i, nk * d) {
        int64_t ts = i / d, c = i % d;
        int32_t j = inv[ts];
        if (j >= 0 && j < nk)
            dy[(int64_t)j * d + c] += weights[ts] * dout[(ts / k) * d + c];
    }
}

/* dweights: one warp per (t, s) pair, the dot product summed by the warp */
static __global__ void moe_combine_dw_k(float *dweights, const float *dout, const float *y, const int32_t *inv,
                                        int64_t n, int64_t k, int64_t d)
{
    const int64_t nk = n * k, ts = (int64_t)blockIdx.x * CUK_MOE_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (ts >= nk)
        return;
    int32_t j = inv[ts];
    if (j < 0 || j >= nk)
        return;
    const float *g = dout + (ts / k) * d, *yr = y + (int64_t)j * d;
    float dot = 0;
    for (int64_t c = lane; c < d; c += 32)
        dot += g[c] * yr[c];
    dot = cuk_warp_sum(dot);
    if (lane == 0)
        dweights[ts] += dot;
}

extern "C" cudaError_t cuk_moe_combine(const cuk_env *e, float *out, const float *y, const float *weights,
                                       const int32_t *inv, int64_t n, int64_t k, int64_t d)
{
    moe_combine_k<<<cuk_grid(e, n * d, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(out, y, weights, inv, n, k, d);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_moe_combine_backward(const cuk_env *e, float *dy, float *dweights, const float *dout,
                                                const float *y, const float *weights, const int32_t *inv, int64_t n,
                                                int64_t k, int64_t d)
{
    const int64_t nk = n * k;
    if (d > 0) {
        moe_combine_dy_k<<<cuk_grid(e, nk * d, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(dy, dout, weights, inv, n,
                                                                                         k, d);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess)
            return err;
    }
    moe_combine_dw_k<<<(unsigned)((nk + CUK_MOE_WARPS - 1) / CUK_MOE_WARPS), CUK_THREADS, 0, e->stream>>>(
        dweights, dout, y, inv, n, k, d);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- grouped GEMMs */

/* Expert g's rows [*begin, *end), clamped into [0, m] */
static __device__ __forceinline__ void moe_segment(const int32_t *offsets, int64_t g, int64_t m, int64_t *begin,
                                                   int64_t *end)
{
    int64_t b = offsets[g], en = offsets[g + 1];
    b = b < 0 ? 0 : (b > m ? m : b);
    en = en < b ? b : (en > m ? m : en);
    *begin = b;
    *end = en;
}

/* One TILE x TILE tile of C (M,N) (+)= A (M,K) B (K,N), with A(r, q) = A[r * a_rs + q * a_cs] and
 * B(q, c) = B[q * b_rs + c * b_cs]; the tile at (row0, col0). Every thread of the block calls it. */
static __device__ void moe_tile_gemm(float *C, int64_t ldc, const float *A, int64_t a_rs, int64_t a_cs,
                                     const float *B, int64_t b_rs, int64_t b_cs, int64_t M, int64_t N, int64_t K,
                                     int64_t row0, int64_t col0, int accumulate)
{
    __shared__ float As[CUK_MOE_TILE][CUK_MOE_TILE + 1];
    __shared__ float Bs[CUK_MOE_TILE][CUK_MOE_TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t r = row0 + ty, c = col0 + tx;
    float acc = 0;
    for (int64_t q0 = 0; q0 < K; q0 += CUK_MOE_TILE) {
        As[ty][tx] = r < M && q0 + tx < K ? A[r * a_rs + (q0 + tx) * a_cs] : 0.0f;
        Bs[ty][tx] = q0 + ty < K && c < N ? B[(q0 + ty) * b_rs + c * b_cs] : 0.0f;
        __syncthreads();
        for (int q = 0; q < CUK_MOE_TILE; q++)
            acc += As[ty][q] * Bs[q][tx];
        __syncthreads();
    }
    if (r < M && c < N)
        C[r * ldc + c] = accumulate ? C[r * ldc + c] + acc : acc;
}

/* Forward (input_grad 0): y_seg (len,o) = x_seg (len,i) w_g^T. backward_input (1): dx_seg (len,i) +=
 * dy_seg (len,o) w_g. blockIdx.x: the (expert, row tile) pair, found by walking the offsets. */
static __global__ void moe_grouped_rows_k(float *out, const float *a, const float *w, const int32_t *offsets,
                                          int64_t m, int64_t e, int64_t o, int64_t i, int input_grad)
{
    __shared__ int64_t seg[3]; /* expert, first row of the tile, end of the expert's rows */
    if (threadIdx.x == 0 && threadIdx.y == 0) {
        int64_t tile = blockIdx.x, g = 0;
        seg[0] = -1;
        for (; g < e; g++) {
            int64_t b, en;
            moe_segment(offsets, g, m, &b, &en);
            int64_t tiles = (en - b + CUK_MOE_TILE - 1) / CUK_MOE_TILE;
            if (tile < tiles) {
                seg[0] = g;
                seg[1] = b + tile * CUK_MOE_TILE;
                seg[2] = en;
                break;
            }
            tile -= tiles;
        }
    }
    __syncthreads();
    const int64_t g = seg[0];
    if (g < 0)
        return; /* past the last tile */
    const int64_t r0 = seg[1], rows = seg[2] - r0;
    const float *wg = w + g * o * i;
    const int64_t col0 = (int64_t)blockIdx.y * CUK_MOE_TILE;
    if (!input_grad) /* A = x rows (i wide), B(q, c) = w_g[c * i + q] */
        moe_tile_gemm(out + r0 * o, o, a + r0 * i, i, 1, wg, 1, i, rows, o, i, 0, col0, 0);
    else /* A = dy rows (o wide), B(q, c) = w_g[q * i + c] */
        moe_tile_gemm(out + r0 * i, i, a + r0 * o, o, 1, wg, i, 1, rows, i, o, 0, col0, 1);
}

/* backward_weight: dw_g (o,i) += dy_seg^T (o,len) x_seg (len,i); block (i tile, o tile, expert) */
static __global__ void moe_grouped_weight_k(float *dw, const float *dy, const float *x, const int32_t *offsets,
                                            int64_t m, int64_t o, int64_t i)
{
    const int64_t g = blockIdx.z;
    int64_t b, en;
    moe_segment(offsets, g, m, &b, &en);
    if (en == b)
        return; /* no row: nothing to add (the whole block agrees) */
    moe_tile_gemm(dw + g * o * i, i, dy + b * o, 1, o, x + b * i, i, 1, o, i, en - b,
                  (int64_t)blockIdx.y * CUK_MOE_TILE, (int64_t)blockIdx.x * CUK_MOE_TILE, 1);
}

extern "C" cudaError_t cuk_grouped_matmul(const cuk_env *e, int which, float *out, const float *a, const float *b,
                                          const int32_t *offsets, int64_t m, int64_t experts, int64_t o, int64_t i)
{
    const dim3 block(CUK_MOE_TILE, CUK_MOE_TILE);
    const int64_t T = CUK_MOE_TILE;
    if (which == 2) {
        dim3 grid((unsigned)((i + T - 1) / T), (unsigned)((o + T - 1) / T), (unsigned)experts);
        moe_grouped_weight_k<<<grid, block, 0, e->stream>>>(out, a, b, offsets, m, o, i);
    } else {
        const int64_t cols = which == 0 ? o : i;
        dim3 grid((unsigned)((m + T - 1) / T + experts), (unsigned)((cols + T - 1) / T));
        moe_grouped_rows_k<<<grid, block, 0, e->stream>>>(out, a, b, offsets, m, experts, o, i, which);
    }
    return cudaGetLastError();
}
