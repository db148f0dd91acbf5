/* kernels_attention.cu: fused causal attention with grouped-query heads, in f32 (flash-attention
 * style: tiles in shared memory, online softmax, the probabilities never stored).
 *
 * q (b,t,h,d); k, v (b,t,kvh,d); query head i reads kv head i / (h / kvh); scale 1/sqrt(d).
 * Tiles are ATT_TILE (64) queries by ATT_TILE keys; a block is 128 threads: thread (ty, tx),
 * ty = tid / 8 in 0..15, tx = tid % 8, owns rows 4 ty .. 4 ty + 3 and columns tx + 8 j of every
 * tile-shaped product it computes (S = Q K^T, P V, ...), so a head dim d <= 8 DC fits the DC
 * registers per row (DC = 4, 8 or 16: d <= 32, 64, 128).
 *
 * Forward, one block per (query tile, head, batch): walks key tiles 0 .. the diagonal, keeping
 * the running max m, sum l and the output rows scaled by exp(m_old - m_new); writes out = O / l
 * and lse = m + log l (b,h,t).
 *
 * Backward recomputes P = exp(scale q k - lse) from the saved lse, with D = rowsum(dO * O):
 *   dV += P^T dO;  dP = dO V^T;  dS = P (dP - D);  dK += scale dS^T Q;  dQ += scale dS K.
 * Two kernels, so that every gradient element has one owner and a fixed summation order (no
 * atomics): one block per (key tile, kv head, batch) sums dK and dV over the group's query heads
 * in order and over query tiles from the diagonal on; one block per (query tile, head, batch)
 * sums dQ over key tiles up to the diagonal. Each adds its total into the gradient once.
 *
 * By blocks (ABI 2.3, context parallel): the same three kernels with the causal mask taken from
 * position arrays (k_pos[j] <= q_pos[i]) instead of row indices, tq query rows against tk key rows;
 * a (query tile, key tile) pair whose keys are all after every query is skipped, decided from each
 * tile's extreme positions; attention_merge combines two blocks' results by their lse.
 *
 * Shared memory: d + 1 floats per tile row (the pad keeps the strided reads of K rows on distinct
 * banks). The largest need is the dK/dV kernel's at d = 128: about 162 KiB (Hopper and Ampere
 * allow up to 227 and 163 KiB per block); cuk_attention_smem_bytes tells the host.
 */
#include "kernels_common.cuh"

#define ATT_TILE 64
#define ATT_THREADS 128
#define ATT_LDS (ATT_TILE + 1) /* row stride of the (tile, tile) score blocks */

/* rows [row0, row0 + ATT_TILE) of one head of a (b, t, heads, d) tensor into s (row stride ld),
 * zeros past t. `base` points at (batch, row 0, head), rows are `ldrow` floats apart. */
static __device__ __forceinline__ void load_tile(float *s, int ld, const float *base, int64_t ldrow, int row0,
                                                 int t, int d)
{
    for (int idx = threadIdx.x; idx < ATT_TILE * d; idx += blockDim.x) {
        int r = idx / d, c = idx - r * d, row = row0 + r;
        s[r * ld + c] = row < t ? base[(int64_t)row * ldrow + c] : 0.0f;
    }
}

/* s[a][jj] = sum_kk A[(4 ty + a) * ld + kk] * B[(tx + 8 jj) * ld + kk]: one thread's 4 x 8 block of
 * a (tile, tile) product of two row-major tiles. */
static __device__ __forceinline__ void tile_dot(float s[4][8], const float *A, const float *B, int ld, int d,
                                                int tx, int ty)
{
    for (int a = 0; a < 4; a++)
        for (int jj = 0; jj < 8; jj++)
            s[a][jj] = 0.0f;
    for (int kk = 0; kk < d; kk++) {
        float av[4], bv[8];
        for (int a = 0; a < 4; a++)
            av[a] = A[(ty * 4 + a) * ld + kk];
        for (int jj = 0; jj < 8; jj++)
            bv[jj] = B[(tx + 8 * jj) * ld + kk];
        for (int a = 0; a < 4; a++)
            for (int jj = 0; jj < 8; jj++)
                s[a][jj] += av[a] * bv[jj];
    }
}

/* ---------------------------------------------------------------- forward */

template <int DC>
static __global__ void __launch_bounds__(ATT_THREADS)
    attention_forward_k(float *out, float *lse, const float *q, const float *k, const float *v, int t, int h,
                        int kvh, int d, float scale)
{
    extern __shared__ float smem[];
    const int ld = d + 1;
    float *Qs = smem, *Ks = Qs + ATT_TILE * ld, *Vs = Ks + ATT_TILE * ld, *Ss = Vs + ATT_TILE * ld;
    float *row_m = Ss + ATT_TILE * ATT_LDS, *row_l = row_m + ATT_TILE, *row_a = row_l + ATT_TILE;
    const int ntiles = (t + ATT_TILE - 1) / ATT_TILE;
    const int qt = ntiles - 1 - (int)blockIdx.x; /* the longest tiles (most keys) start first */
    const int hi = blockIdx.y, bi = blockIdx.z, kh = hi / (h / kvh);
    const int tid = threadIdx.x, tx = tid & 7, ty = tid >> 3, warp = tid >> 5, lane = tid & 31;
    const int q0 = qt * ATT_TILE;
    const int64_t ldq = (int64_t)h * d, ldk = (int64_t)kvh * d;
    const float *qb = q + (int64_t)bi * t * ldq + (int64_t)hi * d;
    const float *kb = k + (int64_t)bi * t * ldk + (int64_t)kh * d;
    const float *vb = v + (int64_t)bi * t * ldk + (int64_t)kh * d;

    load_tile(Qs, ld, qb, ldq, q0, t, d);
    if (tid < ATT_TILE) {
        row_m[tid] = -INFINITY;
        row_l[tid] = 0.0f;
    }
    float acc[4][DC];
    for (int a = 0; a < 4; a++)
        for (int cc = 0; cc < DC; cc++)
            acc[a][cc] = 0.0f;

    for (int kt = 0; kt <= qt; kt++) {
        const int k0 = kt * ATT_TILE;
        __syncthreads(); /* the previous tile's K, V and P are used up */
        load_tile(Ks, ld, kb, ldk, k0, t, d);
        load_tile(Vs, ld, vb, ldk, k0, t, d);
        __syncthreads();
        float s[4][8];
        tile_dot(s, Qs, Ks, ld, d, tx, ty);
        for (int a = 0; a < 4; a++)
            for (int jj = 0; jj < 8; jj++) {
                int i = ty * 4 + a, j = tx + 8 * jj, qi = q0 + i, kj = k0 + j;
                Ss[i * ATT_LDS + j] = kj <= qi && kj < t ? s[a][jj] * scale : -INFINITY;
            }
        __syncthreads();
        /* online softmax: warp w updates rows 16 w .. 16 w + 15, two columns per lane */
        for (int r = warp * 16; r < warp * 16 + 16; r++) {
            float *srow = Ss + r * ATT_LDS;
            float x0 = srow[lane], x1 = srow[lane + 32], m_old = row_m[r];
            float m_new = fmaxf(m_old, cuk_warp_max(fmaxf(x0, x1)));
            float p0 = 0.0f, p1 = 0.0f, alpha = 1.0f;
            if (m_new != -INFINITY) {
                p0 = expf(x0 - m_new);
                p1 = expf(x1 - m_new);
                alpha = expf(m_old - m_new);
            }
            float sum = cuk_warp_sum(p0 + p1);
            srow[lane] = p0;
            srow[lane + 32] = p1;
            if (lane == 0) {
                row_l[r] = row_l[r] * alpha + sum;
                row_m[r] = m_new;
                row_a[r] = alpha;
            }
        }
        __syncthreads();
        /* O = O * alpha + P V over the keys of this tile that exist */
        for (int a = 0; a < 4; a++) {
            float al = row_a[ty * 4 + a];
            for (int cc = 0; cc < DC; cc++)
                acc[a][cc] *= al;
        }
        const int kmax = t - k0 < ATT_TILE ? t - k0 : ATT_TILE;
        for (int j = 0; j < kmax; j++) {
            float pv[4];
            for (int a = 0; a < 4; a++)
                pv[a] = Ss[(ty * 4 + a) * ATT_LDS + j];
            for (int cc = 0; cc < DC; cc++) {
                int col = tx + 8 * cc;
                if (col < d) {
                    float vv = Vs[j * ld + col];
                    for (int a = 0; a < 4; a++)
                        acc[a][cc] += pv[a] * vv;
                }
            }
        }
    }
    for (int a = 0; a < 4; a++) {
        int i = ty * 4 + a, qi = q0 + i;
        if (qi >= t)
            continue;
        float l = row_l[i], inv = 1.0f / l;
        float *orow = out + ((int64_t)bi * t + qi) * ldq + (int64_t)hi * d;
        for (int cc = 0; cc < DC; cc++) {
            int col = tx + 8 * cc;
            if (col < d)
                orow[col] = acc[a][cc] * inv;
        }
        if (tx == 0)
            lse[((int64_t)bi * h + hi) * t + qi] = row_m[i] + logf(l);
    }
}

/* ---------------------------------------------------------------- backward */

/* Dv (b,h,t) = rowsum(dout * out): one warp per (b, t, h) row. */
static __global__ void attention_dvec_k(float *Dv, const float *dout, const float *out, int64_t rows, int t,
                                        int h, int d)
{
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5); r < rows; r += warps) {
        const float *o = out + r * d, *g = dout + r * d;
        float s = 0.0f;
        for (int c = lane; c < d; c += 32)
            s += o[c] * g[c];
        s = cuk_warp_sum(s);
        if (lane == 0) {
            int64_t hi = r % h, bt = r / h, ti = bt % t, bi = bt / t;
            Dv[(bi * h + hi) * t + ti] = s;
        }
    }
}

/* P (and dS) of query rows q0.. against this block's key tile k0..: p = exp(scale s - lse) under
 * the causal mask, ds = p (dp - D). Written to Ps / dSs at [query row][key]. */
static __device__ __forceinline__ void scores_to_grads(float *Ps, float *dSs, const float *Qs, const float *dOs,
                                                       const float *Ks, const float *Vs, const float *lse_s,
                                                       const float *D_s, int ld, int d, int q0, int k0, int t,
                                                       float scale, int tx, int ty)
{
    float s[4][8];
    tile_dot(s, Qs, Ks, ld, d, tx, ty);
    float p[4][8];
    for (int a = 0; a < 4; a++)
        for (int jj = 0; jj < 8; jj++) {
            int i = ty * 4 + a, j = tx + 8 * jj, qi = q0 + i, kj = k0 + j;
            p[a][jj] = qi < t && kj <= qi ? expf(s[a][jj] * scale - lse_s[i]) : 0.0f;
            if (Ps)
                Ps[i * ATT_LDS + j] = p[a][jj];
        }
    tile_dot(s, dOs, Vs, ld, d, tx, ty); /* s is now dP */
    for (int a = 0; a < 4; a++)
        for (int jj = 0; jj < 8; jj++) {
            int i = ty * 4 + a, j = tx + 8 * jj;
            dSs[i * ATT_LDS + j] = p[a][jj] * (s[a][jj] - D_s[i]);
        }
}

/* One block per (key tile, kv head, batch): dK, dV of its keys over every query head of the
 * group (in order) and every query tile from the diagonal on. */
template <int DC>
static __global__ void __launch_bounds__(ATT_THREADS)
    attention_dkdv_k(float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v,
                     const float *lse, const float *Dv, int t, int h, int kvh, int d, float scale)
{
    extern __shared__ float smem[];
    const int ld = d + 1;
    float *Ks = smem, *Vs = Ks + ATT_TILE * ld, *Qs = Vs + ATT_TILE * ld, *dOs = Qs + ATT_TILE * ld;
    float *Ps = dOs + ATT_TILE * ld, *dSs = Ps + ATT_TILE * ATT_LDS;
    float *lse_s = dSs + ATT_TILE * ATT_LDS, *D_s = lse_s + ATT_TILE;
    const int ntiles = (t + ATT_TILE - 1) / ATT_TILE;
    const int kt = blockIdx.x; /* low key tiles see the most queries: they start first */
    const int kh = blockIdx.y, bi = blockIdx.z, group = h / kvh;
    const int tid = threadIdx.x, tx = tid & 7, ty = tid >> 3;
    const int k0 = kt * ATT_TILE;
    const int64_t ldq = (int64_t)h * d, ldk = (int64_t)kvh * d;

    load_tile(Ks, ld, k + (int64_t)bi * t * ldk + (int64_t)kh * d, ldk, k0, t, d);
    load_tile(Vs, ld, v + (int64_t)bi * t * ldk + (int64_t)kh * d, ldk, k0, t, d);
    float dka[4][DC], dva[4][DC];
    for (int a = 0; a < 4; a++)
        for (int cc = 0; cc < DC; cc++) {
            dka[a][cc] = 0.0f;
            dva[a][cc] = 0.0f;
        }

    for (int hi = kh * group; hi < (kh + 1) * group; hi++) {
        const float *qb = q + (int64_t)bi * t * ldq + (int64_t)hi * d;
        const float *dob = dout + (int64_t)bi * t * ldq + (int64_t)hi * d;
        const float *lse_b = lse + ((int64_t)bi * h + hi) * t, *D_b = Dv + ((int64_t)bi * h + hi) * t;
        for (int qt = kt; qt < ntiles; qt++) {
            const int q0 = qt * ATT_TILE;
            __syncthreads(); /* the previous tile's Q, dO, P, dS are used up */
            load_tile(Qs, ld, qb, ldq, q0, t, d);
            load_tile(dOs, ld, dob, ldq, q0, t, d);
            if (tid < ATT_TILE) {
                int qi = q0 + tid;
                lse_s[tid] = qi < t ? lse_b[qi] : 0.0f;
                D_s[tid] = qi < t ? D_b[qi] : 0.0f;
            }
            __syncthreads();
            scores_to_grads(Ps, dSs, Qs, dOs, Ks, Vs, lse_s, D_s, ld, d, q0, k0, t, scale, tx, ty);
            __syncthreads();
            /* dV[j] += sum_i P[i][j] dO[i];  dK[j] += sum_i dS[i][j] Q[i]  (this thread: keys 4 ty + a) */
            const int imax = t - q0 < ATT_TILE ? t - q0 : ATT_TILE;
            for (int i = 0; i < imax; i++) {
                float pa[4], sa[4];
                for (int a = 0; a < 4; a++) {
                    pa[a] = Ps[i * ATT_LDS + ty * 4 + a];
                    sa[a] = dSs[i * ATT_LDS + ty * 4 + a];
                }
                for (int cc = 0; cc < DC; cc++) {
                    int col = tx + 8 * cc;
                    if (col < d) {
                        float g = dOs[i * ld + col], x = Qs[i * ld + col];
                        for (int a = 0; a < 4; a++) {
                            dva[a][cc] += pa[a] * g;
                            dka[a][cc] += sa[a] * x;
                        }
                    }
                }
            }
        }
    }
    for (int a = 0; a < 4; a++) {
        int kj = k0 + ty * 4 + a;
        if (kj >= t)
            continue;
        float *dkr = dk + ((int64_t)bi * t + kj) * ldk + (int64_t)kh * d;
        float *dvr = dv + ((int64_t)bi * t + kj) * ldk + (int64_t)kh * d;
        for (int cc = 0; cc < DC; cc++) {
            int col = tx + 8 * cc;
            if (col < d) {
                dkr[col] += scale * dka[a][cc];
                dvr[col] += dva[a][cc];
            }
        }
    }
}

/* One block per (query tile, head, batch): dQ of its rows over key tiles up to the diagonal. */
template <int DC>
static __global__ void __launch_bounds__(ATT_THREADS)
    attention_dq_k(float *dq, const float *dout, const float *q, const float *k, const float *v,
                   const float *lse, const float *Dv, int t, int h, int kvh, int d, float scale)
{
    extern __shared__ float smem[];
    const int ld = d + 1;
    float *Qs = smem, *dOs = Qs + ATT_TILE * ld, *Ks = dOs + ATT_TILE * ld, *Vs = Ks + ATT_TILE * ld;
    float *dSs = Vs + ATT_TILE * ld, *lse_s = dSs + ATT_TILE * ATT_LDS, *D_s = lse_s + ATT_TILE;
    const int ntiles = (t + ATT_TILE - 1) / ATT_TILE;
    const int qt = ntiles - 1 - (int)blockIdx.x;
    const int hi = blockIdx.y, bi = blockIdx.z, kh = hi / (h / kvh);
    const int tid = threadIdx.x, tx = tid & 7, ty = tid >> 3;
    const int q0 = qt * ATT_TILE;
    const int64_t ldq = (int64_t)h * d, ldk = (int64_t)kvh * d;
    const float *kb = k + (int64_t)bi * t * ldk + (int64_t)kh * d;
    const float *vb = v + (int64_t)bi * t * ldk + (int64_t)kh * d;

    load_tile(Qs, ld, q + (int64_t)bi * t * ldq + (int64_t)hi * d, ldq, q0, t, d);
    load_tile(dOs, ld, dout + (int64_t)bi * t * ldq + (int64_t)hi * d, ldq, q0, t, d);
    if (tid < ATT_TILE) {
        int qi = q0 + tid;
        int64_t base = ((int64_t)bi * h + hi) * t;
        lse_s[tid] = qi < t ? lse[base + qi] : 0.0f;
        D_s[tid] = qi < t ? Dv[base + qi] : 0.0f;
    }
    float dqa[4][DC];
    for (int a = 0; a < 4; a++)
        for (int cc = 0; cc < DC; cc++)
            dqa[a][cc] = 0.0f;

    for (int kt = 0; kt <= qt; kt++) {
        const int k0 = kt * ATT_TILE;
        __syncthreads();
        load_tile(Ks, ld, kb, ldk, k0, t, d);
        load_tile(Vs, ld, vb, ldk, k0, t, d);
        __syncthreads();
        scores_to_grads(NULL, dSs, Qs, dOs, Ks, Vs, lse_s, D_s, ld, d, q0, k0, t, scale, tx, ty);
        __syncthreads();
        /* dQ[i] += sum_j dS[i][j] K[j]  (this thread: rows 4 ty + a) */
        const int jmax = t - k0 < ATT_TILE ? t - k0 : ATT_TILE;
        for (int j = 0; j < jmax; j++) {
            float sa[4];
            for (int a = 0; a < 4; a++)
                sa[a] = dSs[(ty * 4 + a) * ATT_LDS + j];
            for (int cc = 0; cc < DC; cc++) {
                int col = tx + 8 * cc;
                if (col < d) {
                    float x = Ks[j * ld + col];
                    for (int a = 0; a < 4; a++)
                        dqa[a][cc] += sa[a] * x;
                }
            }
        }
    }
    for (int a = 0; a < 4; a++) {
        int qi = q0 + ty * 4 + a;
        if (qi >= t)
            continue;
        float *dqr = dq + ((int64_t)bi * t + qi) * ldq + (int64_t)hi * d;
        for (int cc = 0; cc < DC; cc++) {
            int col = tx + 8 * cc;
            if (col < d)
                dqr[col] += scale * dqa[a][cc];
        }
    }
}

/* ---------------------------------------------------------------- launchers */

static size_t smem_forward(int64_t d)
{
    return sizeof(float) * (size_t)(3 * ATT_TILE * (d + 1) + ATT_TILE * ATT_LDS + 3 * ATT_TILE);
}

static size_t smem_dkdv(int64_t d)
{
    return sizeof(float) * (size_t)(4 * ATT_TILE * (d + 1) + 2 * ATT_TILE * ATT_LDS + 2 * ATT_TILE);
}

static size_t smem_dq(int64_t d)
{
    return sizeof(float) * (size_t)(4 * ATT_TILE * (d + 1) + ATT_TILE * ATT_LDS + 2 * ATT_TILE);
}

/* (with the block variants' tiles of positions and documents: ATT_POS_BYTES, defined below) */
extern "C" size_t cuk_attention_smem_bytes(int64_t d)
{
    size_t pos = 4 * ATT_TILE * sizeof(int);
    size_t a = smem_forward(d) + pos, b = smem_dkdv(d) + pos, c = smem_dq(d) + pos;
    return a > b ? (a > c ? a : c) : (b > c ? b : c);
}

/* Raises the kernel's dynamic shared memory limit to `bytes` when it is above the 48 KiB default. */
static cudaError_t smem_limit(const void *kernel, size_t bytes)
{
    if (bytes <= 48 * 1024)
        return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

template <int DC>
static cudaError_t forward_launch(const cuk_env *e, float *out, float *lse, const float *q, const float *k,
                                  const float *v, int b, int t, int h, int kvh, int d)
{
    size_t bytes = smem_forward(d);
    cudaError_t err = smem_limit((const void *)attention_forward_k<DC>, bytes);
    if (err != cudaSuccess)
        return err;
    dim3 grid((unsigned)((t + ATT_TILE - 1) / ATT_TILE), (unsigned)h, (unsigned)b);
    attention_forward_k<DC><<<grid, ATT_THREADS, bytes, e->stream>>>(out, lse, q, k, v, t, h, kvh, d,
                                                                      (float)(1.0 / sqrt((double)d)));
    return cudaGetLastError();
}

template <int DC>
static cudaError_t backward_launch(const cuk_env *e, float *dq, float *dk, float *dv, const float *dout,
                                   const float *q, const float *k, const float *v, const float *lse,
                                   const float *Dv, int b, int t, int h, int kvh, int d)
{
    const float scale = (float)(1.0 / sqrt((double)d));
    const unsigned ntiles = (unsigned)((t + ATT_TILE - 1) / ATT_TILE);
    size_t bytes_kv = smem_dkdv(d), bytes_q = smem_dq(d);
    cudaError_t err = smem_limit((const void *)attention_dkdv_k<DC>, bytes_kv);
    if (err == cudaSuccess)
        err = smem_limit((const void *)attention_dq_k<DC>, bytes_q);
    if (err != cudaSuccess)
        return err;
    attention_dkdv_k<DC><<<dim3(ntiles, (unsigned)kvh, (unsigned)b), ATT_THREADS, bytes_kv, e->stream>>>(
        dk, dv, dout, q, k, v, lse, Dv, t, h, kvh, d, scale);
    attention_dq_k<DC><<<dim3(ntiles, (unsigned)h, (unsigned)b), ATT_THREADS, bytes_q, e->stream>>>(
        dq, dout, q, k, v, lse, Dv, t, h, kvh, d, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_attention_forward(const cuk_env *e, float *out, float *lse, const float *q,
                                             const float *k, const float *v, int64_t b, int64_t t, int64_t h,
                                             int64_t kvh, int64_t d)
{
    int B = (int)b, T = (int)t, H = (int)h, KVH = (int)kvh, D = (int)d;
    if (d <= 32)
        return forward_launch<4>(e, out, lse, q, k, v, B, T, H, KVH, D);
    if (d <= 64)
        return forward_launch<8>(e, out, lse, q, k, v, B, T, H, KVH, D);
    if (d <= 128)
        return forward_launch<16>(e, out, lse, q, k, v, B, T, H, KVH, D);
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t cuk_attention_backward(const cuk_env *e, float *dq, float *dk, float *dv,
                                              const float *dout, const float *q, const float *k, const float *v,
                                              const float *out, const float *lse, int64_t b, int64_t t,
                                              int64_t h, int64_t kvh, int64_t d)
{
    if (d > CUK_ATTENTION_MAX_D)
        return cudaErrorInvalidValue;
    int64_t rows = b * t * h;
    float *Dv = (float *)cuda_scratch_get(e->dev, sizeof(float) * (size_t)rows);
    if (!Dv)
        return cudaErrorMemoryAllocation;
    attention_dvec_k<<<cuk_grid(e, rows * 32, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(Dv, dout, out, rows,
                                                                                          (int)t, (int)h, (int)d);
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) {
        int B = (int)b, T = (int)t, H = (int)h, KVH = (int)kvh, D = (int)d;
        if (d <= 32)
            err = backward_launch<4>(e, dq, dk, dv, dout, q, k, v, lse, Dv, B, T, H, KVH, D);
        else if (d <= 64)
            err = backward_launch<8>(e, dq, dk, dv, dout, q, k, v, lse, Dv, B, T, H, KVH, D);
        else
            err = backward_launch<16>(e, dq, dk, dv, dout, q, k, v, lse, Dv, B, T, H, KVH, D);
    }
    cuda_scratch_put(e->dev, Dv);
    return err;
}

/* ---------------------------------------------------------------- by blocks at positions (ABI 2.3) */
/* Context parallel's ring attention: a query block against a key block, the causal mask from
 * position arrays (key j visible to query i when k_pos[j] <= q_pos[i]), the same tiles and thread
 * layout as above. Positions come in any order, so each tile's extreme position (the largest query
 * position, the smallest key position) decides whether a (query tile, key tile) pair has any visible
 * key; pairs with none are skipped, which is what keeps context parallel's ranks balanced. A query
 * that sees no key gets out 0 and lse -inf; the backward takes the final out and lse and skips
 * queries at lse -inf. */

#define ATT_POS_NONE 0x7fffffff /* a key position past tk: visible to no query */

/* What a tile's rows span, three ints per tile, per batch row when positions are (ABI 2.13: nb = b)
 * or once for the batch (nb = 1): for query tile i, { the largest q_pos, the smallest and the
 * largest q_doc } at bounds[(bi * (nqt + nkt) + i) * 3]; for key tile j the same at nqt + j with
 * the smallest k_pos. Without documents (NULL) every row is in document 0. */
static __global__ void att_tile_bounds_k(int *bounds, const int32_t *q_pos, const int32_t *k_pos,
                                         const int32_t *q_doc, const int32_t *k_doc, int tq, int tk, int nqt,
                                         int nkt, int nb)
{
    CUK_FOR(i, (int64_t)nb * (nqt + nkt)) {
        int bi = (int)(i / (nqt + nkt)), t = (int)(i % (nqt + nkt));
        int *o = bounds + i * 3, dlo = ATT_POS_NONE, dhi = -1;
        if (t < nqt) {
            const int32_t *pos = q_pos + (int64_t)bi * tq, *doc = q_doc ? q_doc + (int64_t)bi * tq : NULL;
            int m = -1;
            for (int r = t * ATT_TILE; r < tq && r < (t + 1) * ATT_TILE; r++) {
                int dr = doc ? doc[r] : 0;
                m = pos[r] > m ? pos[r] : m;
                dlo = dr < dlo ? dr : dlo;
                dhi = dr > dhi ? dr : dhi;
            }
            o[0] = m;
        } else {
            const int32_t *pos = k_pos + (int64_t)bi * tk, *doc = k_doc ? k_doc + (int64_t)bi * tk : NULL;
            int j = t - nqt, m = ATT_POS_NONE;
            for (int c = j * ATT_TILE; c < tk && c < (j + 1) * ATT_TILE; c++) {
                int dc = doc ? doc[c] : 0;
                m = pos[c] < m ? pos[c] : m;
                dlo = dc < dlo ? dc : dlo;
                dhi = dc > dhi ? dc : dhi;
            }
            o[0] = m;
        }
        o[1] = dlo;
        o[2] = dhi;
    }
}

/* Whether some key of key tile kb (bounds) may be visible to some query of query tile qb: a key
 * position at or before the latest query's, and the two document ranges overlapping. */
static __device__ __forceinline__ bool tiles_meet(const int *qb, const int *kb)
{
    return kb[0] <= qb[0] && kb[1] <= qb[2] && kb[2] >= qb[1];
}

/* A tile's rows' documents into s (-1 for every row without documents, `fill` past n). */
static __device__ __forceinline__ void load_doc(int *s, const int32_t *doc, int row0, int n, int fill)
{
    for (int r = threadIdx.x; r < ATT_TILE; r += blockDim.x)
        s[r] = row0 + r < n ? (doc ? doc[row0 + r] : -1) : fill;
}

/* the positions of tile rows row0.. into s, `fill` past n */
static __device__ __forceinline__ void load_pos(int *s, const int32_t *pos, int row0, int n, int fill)
{
    for (int r = threadIdx.x; r < ATT_TILE; r += blockDim.x)
        s[r] = row0 + r < n ? pos[row0 + r] : fill;
}

/* One block per (query tile, head, batch), as attention_forward_k, over the key tiles it can see. */
template <int DC>
static __global__ void __launch_bounds__(ATT_THREADS)
    attention_block_forward_k(float *out, float *lse, const float *q, const float *k, const float *v,
                              const int32_t *q_pos, const int32_t *k_pos, const int32_t *q_doc,
                              const int32_t *k_doc, int per_batch, const int *bounds, int tq, int tk, int h, int kvh,
                              int d, float scale)
{
    extern __shared__ float smem[];
    const int ld = d + 1;
    float *Qs = smem, *Ks = Qs + ATT_TILE * ld, *Vs = Ks + ATT_TILE * ld, *Ss = Vs + ATT_TILE * ld;
    float *row_m = Ss + ATT_TILE * ATT_LDS, *row_l = row_m + ATT_TILE, *row_a = row_l + ATT_TILE;
    int *qpos_s = (int *)(row_a + ATT_TILE), *kpos_s = qpos_s + ATT_TILE;
    int *qdoc_s = kpos_s + ATT_TILE, *kdoc_s = qdoc_s + ATT_TILE;
    const int nqt = (tq + ATT_TILE - 1) / ATT_TILE, nkt = (tk + ATT_TILE - 1) / ATT_TILE;
    const int qt = blockIdx.x, hi = blockIdx.y, bi = blockIdx.z, kh = hi / (h / kvh);
    const int tid = threadIdx.x, tx = tid & 7, ty = tid >> 3, warp = tid >> 5, lane = tid & 31;
    const int q0 = qt * ATT_TILE;
    if (per_batch) { /* ABI 2.13: this batch row's positions and documents */
        q_pos += (int64_t)bi * tq;
        k_pos += (int64_t)bi * tk;
        q_doc = q_doc ? q_doc + (int64_t)bi * tq : NULL;
        k_doc = k_doc ? k_doc + (int64_t)bi * tk : NULL;
        bounds += (int64_t)bi * (nqt + nkt) * 3;
    }
    const int *qbound = bounds + qt * 3;
    const int64_t ldq = (int64_t)h * d, ldk = (int64_t)kvh * d;
    const float *qb = q + (int64_t)bi * tq * ldq + (int64_t)hi * d;
    const float *kb = k + (int64_t)bi * tk * ldk + (int64_t)kh * d;
    const float *vb = v + (int64_t)bi * tk * ldk + (int64_t)kh * d;

    load_tile(Qs, ld, qb, ldq, q0, tq, d);
    load_pos(qpos_s, q_pos, q0, tq, -1);
    load_doc(qdoc_s, q_doc, q0, tq, -1);
    if (tid < ATT_TILE) {
        row_m[tid] = -INFINITY;
        row_l[tid] = 0.0f;
    }
    float acc[4][DC];
    for (int a = 0; a < 4; a++)
        for (int cc = 0; cc < DC; cc++)
            acc[a][cc] = 0.0f;

    for (int kt = 0; kt < nkt; kt++) {
        if (!tiles_meet(qbound, bounds + (nqt + kt) * 3)) /* no key of the tile is visible to a query of ours */
            continue;
        const int k0 = kt * ATT_TILE;
        __syncthreads(); /* the previous tile's K, V and P are used up */
        load_tile(Ks, ld, kb, ldk, k0, tk, d);
        load_tile(Vs, ld, vb, ldk, k0, tk, d);
        load_pos(kpos_s, k_pos, k0, tk, ATT_POS_NONE);
        load_doc(kdoc_s, k_doc, k0, tk, -2);
        __syncthreads();
        float s[4][8];
        tile_dot(s, Qs, Ks, ld, d, tx, ty);
        for (int a = 0; a < 4; a++)
            for (int jj = 0; jj < 8; jj++) {
                int i = ty * 4 + a, j = tx + 8 * jj;
                bool seen = kpos_s[j] <= qpos_s[i] && kdoc_s[j] == qdoc_s[i];
                Ss[i * ATT_LDS + j] = seen ? s[a][jj] * scale : -INFINITY;
            }
        __syncthreads();
        for (int r = warp * 16; r < warp * 16 + 16; r++) {
            float *srow = Ss + r * ATT_LDS;
            float x0 = srow[lane], x1 = srow[lane + 32], m_old = row_m[r];
            float m_new = fmaxf(m_old, cuk_warp_max(fmaxf(x0, x1)));
            float p0 = 0.0f, p1 = 0.0f, alpha = 1.0f;
            if (m_new != -INFINITY) {
                p0 = expf(x0 - m_new);
                p1 = expf(x1 - m_new);
                alpha = expf(m_old - m_new);
            }
            float sum = cuk_warp_sum(p0 + p1);
            srow[lane] = p0;
            srow[lane + 32] = p1;
            if (lane == 0) {
                row_l[r] = row_l[r] * alpha + sum;
                row_m[r] = m_new;
                row_a[r] = alpha;
            }
        }
        __syncthreads();
        for (int a = 0; a < 4; a++) {
            float al = row_a[ty * 4 + a];
            for (int cc = 0; cc < DC; cc++)
                acc[a][cc] *= al;
        }
        const int kmax = tk - k0 < ATT_TILE ? tk - k0 : ATT_TILE;
        for (int j = 0; j < kmax; j++) {
            float pv[4];
            for (int a = 0; a < 4; a++)
                pv[a] = Ss[(ty * 4 + a) * ATT_LDS + j];
            for (int cc = 0; cc < DC; cc++) {
                int col = tx + 8 * cc;
                if (col < d) {
                    float vv = Vs[j * ld + col];
                    for (int a = 0; a < 4; a++)
                        acc[a][cc] += pv[a] * vv;
                }
            }
        }
    }
    __syncthreads(); /* row_m, row_l written (also when no tile was visible) */
    for (int a = 0; a < 4; a++) {
        int i = ty * 4 + a, qi = q0 + i;
        if (qi >= tq)
            continue;
        float l = row_l[i], inv = l > 0.0f ? 1.0f / l : 0.0f;
        float *orow = out + ((int64_t)bi * tq + qi) * ldq + (int64_t)hi * d;
        for (int cc = 0; cc < DC; cc++) {
            int col = tx + 8 * cc;
            if (col < d)
                orow[col] = acc[a][cc] * inv;
        }
        if (tx == 0)
            lse[((int64_t)bi * h + hi) * tq + qi] = l > 0.0f ? row_m[i] + logf(l) : -INFINITY;
    }
}

/* scores_to_grads with the mask from positions; a query at lse -inf has p = 0. */
static __device__ __forceinline__ void block_scores_to_grads(float *Ps, float *dSs, const float *Qs,
                                                             const float *dOs, const float *Ks, const float *Vs,
                                                             const float *lse_s, const float *D_s, const int *qpos_s,
                                                             const int *kpos_s, const int *qdoc_s, const int *kdoc_s,
                                                             int ld, int d, float scale, int tx, int ty)
{
    float s[4][8];
    tile_dot(s, Qs, Ks, ld, d, tx, ty);
    float p[4][8];
    for (int a = 0; a < 4; a++)
        for (int jj = 0; jj < 8; jj++) {
            int i = ty * 4 + a, j = tx + 8 * jj;
            bool seen = kpos_s[j] <= qpos_s[i] && kdoc_s[j] == qdoc_s[i] && lse_s[i] != -INFINITY;
            p[a][jj] = seen ? expf(s[a][jj] * scale - lse_s[i]) : 0.0f;
            if (Ps)
                Ps[i * ATT_LDS + j] = p[a][jj];
        }
    tile_dot(s, dOs, Vs, ld, d, tx, ty); /* s is now dP */
    for (int a = 0; a < 4; a++)
        for (int jj = 0; jj < 8; jj++) {
            int i = ty * 4 + a, j = tx + 8 * jj;
            dSs[i * ATT_LDS + j] = p[a][jj] * (s[a][jj] - D_s[i]);
        }
}

/* One block per (key tile, kv head, batch): as attention_dkdv_k, over the query tiles that see it. */
template <int DC>
static __global__ void __launch_bounds__(ATT_THREADS)
    attention_block_dkdv_k(float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v,
                           const float *lse, const float *Dv, const int32_t *q_pos, const int32_t *k_pos,
                           const int32_t *q_doc, const int32_t *k_doc, int per_batch, const int *bounds, int tq,
                           int tk, int h, int kvh, int d, float scale)
{
    extern __shared__ float smem[];
    const int ld = d + 1;
    float *Ks = smem, *Vs = Ks + ATT_TILE * ld, *Qs = Vs + ATT_TILE * ld, *dOs = Qs + ATT_TILE * ld;
    float *Ps = dOs + ATT_TILE * ld, *dSs = Ps + ATT_TILE * ATT_LDS;
    float *lse_s = dSs + ATT_TILE * ATT_LDS, *D_s = lse_s + ATT_TILE;
    int *qpos_s = (int *)(D_s + ATT_TILE), *kpos_s = qpos_s + ATT_TILE;
    int *qdoc_s = kpos_s + ATT_TILE, *kdoc_s = qdoc_s + ATT_TILE;
    const int nqt = (tq + ATT_TILE - 1) / ATT_TILE, nkt = (tk + ATT_TILE - 1) / ATT_TILE;
    const int kt = blockIdx.x, kh = blockIdx.y, bi = blockIdx.z, group = h / kvh;
    const int tid = threadIdx.x, tx = tid & 7, ty = tid >> 3;
    const int k0 = kt * ATT_TILE;
    const int64_t ldq = (int64_t)h * d, ldk = (int64_t)kvh * d;
    if (per_batch) { /* ABI 2.13: this batch row's positions and documents */
        q_pos += (int64_t)bi * tq;
        k_pos += (int64_t)bi * tk;
        q_doc = q_doc ? q_doc + (int64_t)bi * tq : NULL;
        k_doc = k_doc ? k_doc + (int64_t)bi * tk : NULL;
        bounds += (int64_t)bi * (nqt + nkt) * 3;
    }
    const int *kbound = bounds + (nqt + kt) * 3;

    load_tile(Ks, ld, k + (int64_t)bi * tk * ldk + (int64_t)kh * d, ldk, k0, tk, d);
    load_tile(Vs, ld, v + (int64_t)bi * tk * ldk + (int64_t)kh * d, ldk, k0, tk, d);
    load_pos(kpos_s, k_pos, k0, tk, ATT_POS_NONE);
    load_doc(kdoc_s, k_doc, k0, tk, -2);
    float dka[4][DC], dva[4][DC];
    for (int a = 0; a < 4; a++)
        for (int cc = 0; cc < DC; cc++) {
            dka[a][cc] = 0.0f;
            dva[a][cc] = 0.0f;
        }

    for (int hi = kh * group; hi < (kh + 1) * group; hi++) {
        const float *qb = q + (int64_t)bi * tq * ldq + (int64_t)hi * d;
        const float *dob = dout + (int64_t)bi * tq * ldq + (int64_t)hi * d;
        const float *lse_b = lse + ((int64_t)bi * h + hi) * tq, *D_b = Dv + ((int64_t)bi * h + hi) * tq;
        for (int qt = 0; qt < nqt; qt++) {
            if (!tiles_meet(bounds + qt * 3, kbound)) /* no query of the tile sees a key of ours */
                continue;
            const int q0 = qt * ATT_TILE;
            __syncthreads();
            load_tile(Qs, ld, qb, ldq, q0, tq, d);
            load_tile(dOs, ld, dob, ldq, q0, tq, d);
            load_pos(qpos_s, q_pos, q0, tq, -1);
            load_doc(qdoc_s, q_doc, q0, tq, -1);
            if (tid < ATT_TILE) {
                int qi = q0 + tid;
                lse_s[tid] = qi < tq ? lse_b[qi] : 0.0f;
                D_s[tid] = qi < tq ? D_b[qi] : 0.0f;
            }
            __syncthreads();
            block_scores_to_grads(Ps, dSs, Qs, dOs, Ks, Vs, lse_s, D_s, qpos_s, kpos_s, qdoc_s, kdoc_s, ld, d, scale,
                                  tx, ty);
            __syncthreads();
            const int imax = tq - q0 < ATT_TILE ? tq - q0 : ATT_TILE;
            for (int i = 0; i < imax; i++) {
                float pa[4], sa[4];
                for (int a = 0; a < 4; a++) {
                    pa[a] = Ps[i * ATT_LDS + ty * 4 + a];
                    sa[a] = dSs[i * ATT_LDS + ty * 4 + a];
                }
                for (int cc = 0; cc < DC; cc++) {
                    int col = tx + 8 * cc;
                    if (col < d) {
                        float g = dOs[i * ld + col], x = Qs[i * ld + col];
                        for (int a = 0; a < 4; a++) {
                            dva[a][cc] += pa[a] * g;
                            dka[a][cc] += sa[a] * x;
                        }
                    }
                }
            }
        }
    }
    for (int a = 0; a < 4; a++) {
        int kj = k0 + ty * 4 + a;
        if (kj >= tk)
            continue;
        float *dkr = dk + ((int64_t)bi * tk + kj) * ldk + (int64_t)kh * d;
        float *dvr = dv + ((int64_t)bi * tk + kj) * ldk + (int64_t)kh * d;
        for (int cc = 0; cc < DC; cc++) {
            int col = tx + 8 * cc;
            if (col < d) {
                dkr[col] += scale * dka[a][cc];
                dvr[col] += dva[a][cc];
            }
        }
    }
}

/* One block per (query tile, head, batch): as attention_dq_k, over the key tiles it can see. */
template <int DC>
static __global__ void __launch_bounds__(ATT_THREADS)
    attention_block_dq_k(float *dq, const float *dout, const float *q, const float *k, const float *v,
                         const float *lse, const float *Dv, const int32_t *q_pos, const int32_t *k_pos,
                         const int32_t *q_doc, const int32_t *k_doc, int per_batch, const int *bounds, int tq, int tk,
                         int h, int kvh, int d, float scale)
{
    extern __shared__ float smem[];
    const int ld = d + 1;
    float *Qs = smem, *dOs = Qs + ATT_TILE * ld, *Ks = dOs + ATT_TILE * ld, *Vs = Ks + ATT_TILE * ld;
    float *dSs = Vs + ATT_TILE * ld, *lse_s = dSs + ATT_TILE * ATT_LDS, *D_s = lse_s + ATT_TILE;
    int *qpos_s = (int *)(D_s + ATT_TILE), *kpos_s = qpos_s + ATT_TILE;
    int *qdoc_s = kpos_s + ATT_TILE, *kdoc_s = qdoc_s + ATT_TILE;
    const int nqt = (tq + ATT_TILE - 1) / ATT_TILE, nkt = (tk + ATT_TILE - 1) / ATT_TILE;
    const int qt = blockIdx.x, hi = blockIdx.y, bi = blockIdx.z, kh = hi / (h / kvh);
    const int tid = threadIdx.x, tx = tid & 7, ty = tid >> 3;
    const int q0 = qt * ATT_TILE;
    const int64_t ldq = (int64_t)h * d, ldk = (int64_t)kvh * d;
    if (per_batch) { /* ABI 2.13: this batch row's positions and documents */
        q_pos += (int64_t)bi * tq;
        k_pos += (int64_t)bi * tk;
        q_doc = q_doc ? q_doc + (int64_t)bi * tq : NULL;
        k_doc = k_doc ? k_doc + (int64_t)bi * tk : NULL;
        bounds += (int64_t)bi * (nqt + nkt) * 3;
    }
    const int *qbound = bounds + qt * 3;
    const float *kb = k + (int64_t)bi * tk * ldk + (int64_t)kh * d;
    const float *vb = v + (int64_t)bi * tk * ldk + (int64_t)kh * d;

    load_tile(Qs, ld, q + (int64_t)bi * tq * ldq + (int64_t)hi * d, ldq, q0, tq, d);
    load_tile(dOs, ld, dout + (int64_t)bi * tq * ldq + (int64_t)hi * d, ldq, q0, tq, d);
    load_pos(qpos_s, q_pos, q0, tq, -1);
    load_doc(qdoc_s, q_doc, q0, tq, -1);
    if (tid < ATT_TILE) {
        int qi = q0 + tid;
        int64_t base = ((int64_t)bi * h + hi) * tq;
        lse_s[tid] = qi < tq ? lse[base + qi] : 0.0f;
        D_s[tid] = qi < tq ? Dv[base + qi] : 0.0f;
    }
    float dqa[4][DC];
    for (int a = 0; a < 4; a++)
        for (int cc = 0; cc < DC; cc++)
            dqa[a][cc] = 0.0f;

    for (int kt = 0; kt < nkt; kt++) {
        if (!tiles_meet(qbound, bounds + (nqt + kt) * 3))
            continue;
        const int k0 = kt * ATT_TILE;
        __syncthreads();
        load_tile(Ks, ld, kb, ldk, k0, tk, d);
        load_tile(Vs, ld, vb, ldk, k0, tk, d);
        load_pos(kpos_s, k_pos, k0, tk, ATT_POS_NONE);
        load_doc(kdoc_s, k_doc, k0, tk, -2);
        __syncthreads();
        block_scores_to_grads(NULL, dSs, Qs, dOs, Ks, Vs, lse_s, D_s, qpos_s, kpos_s, qdoc_s, kdoc_s, ld, d, scale,
                              tx, ty);
        __syncthreads();
        const int jmax = tk - k0 < ATT_TILE ? tk - k0 : ATT_TILE;
        for (int j = 0; j < jmax; j++) {
            float sa[4];
            for (int a = 0; a < 4; a++)
                sa[a] = dSs[(ty * 4 + a) * ATT_LDS + j];
            for (int cc = 0; cc < DC; cc++) {
                int col = tx + 8 * cc;
                if (col < d) {
                    float x = Ks[j * ld + col];
                    for (int a = 0; a < 4; a++)
                        dqa[a][cc] += sa[a] * x;
                }
            }
        }
    }
    for (int a = 0; a < 4; a++) {
        int qi = q0 + ty * 4 + a;
        if (qi >= tq)
            continue;
        float *dqr = dq + ((int64_t)bi * tq + qi) * ldq + (int64_t)hi * d;
        for (int cc = 0; cc < DC; cc++) {
            int col = tx + 8 * cc;
            if (col < d)
                dqr[col] += scale * dqa[a][cc];
        }
    }
}

/* What each tile's rows span (att_tile_bounds_k), in scratch the caller puts back; nb = b when
 * positions and documents are per batch row, else 1. */
static int *tile_bounds(const cuk_env *e, const int32_t *q_pos, const int32_t *k_pos, const int32_t *q_doc,
                        const int32_t *k_doc, int tq, int tk, int nb)
{
    int nqt = (tq + ATT_TILE - 1) / ATT_TILE, nkt = (tk + ATT_TILE - 1) / ATT_TILE;
    int64_t n = (int64_t)nb * (nqt + nkt);
    int *bounds = (int *)cuda_scratch_get(e->dev, sizeof(int) * (size_t)(3 * n + 1));
    if (bounds)
        att_tile_bounds_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(bounds, q_pos, k_pos, q_doc,
                                                                                      k_doc, tq, tk, nqt, nkt, nb);
    return bounds;
}

/* the positions' and documents' tiles of ints next to each kernel's floats */
#define ATT_POS_BYTES (4 * ATT_TILE * sizeof(int))

/* The rows' positions and documents, as the kernels take them. */
typedef struct {
    const int32_t *q_pos, *k_pos, *q_doc, *k_doc;
    int per_batch;
    const int *bounds;
} att_mask;

template <int DC>
static cudaError_t block_forward_launch(const cuk_env *e, float *out, float *lse, const float *q, const float *k,
                                        const float *v, const att_mask *m, int b, int tq, int tk, int h, int kvh,
                                        int d)
{
    size_t bytes = smem_forward(d) + ATT_POS_BYTES;
    cudaError_t err = smem_limit((const void *)attention_block_forward_k<DC>, bytes);
    if (err != cudaSuccess)
        return err;
    dim3 grid((unsigned)((tq + ATT_TILE - 1) / ATT_TILE), (unsigned)h, (unsigned)b);
    attention_block_forward_k<DC><<<grid, ATT_THREADS, bytes, e->stream>>>(
        out, lse, q, k, v, m->q_pos, m->k_pos, m->q_doc, m->k_doc, m->per_batch, m->bounds, tq, tk, h, kvh, d,
        (float)(1.0 / sqrt((double)d)));
    return cudaGetLastError();
}

template <int DC>
static cudaError_t block_backward_launch(const cuk_env *e, float *dq, float *dk, float *dv, const float *dout,
                                         const float *q, const float *k, const float *v, const float *lse,
                                         const float *Dv, const att_mask *m, int b, int tq, int tk, int h, int kvh,
                                         int d)
{
    const float scale = (float)(1.0 / sqrt((double)d));
    size_t bytes_kv = smem_dkdv(d) + ATT_POS_BYTES, bytes_q = smem_dq(d) + ATT_POS_BYTES;
    cudaError_t err = smem_limit((const void *)attention_block_dkdv_k<DC>, bytes_kv);
    if (err == cudaSuccess)
        err = smem_limit((const void *)attention_block_dq_k<DC>, bytes_q);
    if (err != cudaSuccess)
        return err;
    const unsigned nqt = (unsigned)((tq + ATT_TILE - 1) / ATT_TILE), nkt = (unsigned)((tk + ATT_TILE - 1) / ATT_TILE);
    attention_block_dkdv_k<DC><<<dim3(nkt, (unsigned)kvh, (unsigned)b), ATT_THREADS, bytes_kv, e->stream>>>(
        dk, dv, dout, q, k, v, lse, Dv, m->q_pos, m->k_pos, m->q_doc, m->k_doc, m->per_batch, m->bounds, tq, tk, h,
        kvh, d, scale);
    attention_block_dq_k<DC><<<dim3(nqt, (unsigned)h, (unsigned)b), ATT_THREADS, bytes_q, e->stream>>>(
        dq, dout, q, k, v, lse, Dv, m->q_pos, m->k_pos, m->q_doc, m->k_doc, m->per_batch, m->bounds, tq, tk, h, kvh,
        d, scale);
    return cudaGetLastError();
}

/* The forward of either form: positions shared by the batch (per_batch 0, no documents) or per
 * batch row with documents (ABI 2.13). */
static cudaError_t masked_forward(const cuk_env *e, float *out, float *lse, const float *q, const float *k,
                                  const float *v, const int32_t *q_pos, const int32_t *k_pos, const int32_t *q_doc,
                                  const int32_t *k_doc, int per_batch, int64_t b, int64_t tq, int64_t tk, int64_t h,
                                  int64_t kvh, int64_t d)
{
    if (d > CUK_ATTENTION_MAX_D)
        return cudaErrorInvalidValue;
    int B = (int)b, TQ = (int)tq, TK = (int)tk, H = (int)h, KVH = (int)kvh, D = (int)d;
    att_mask m = {q_pos, k_pos, q_doc, k_doc, per_batch, NULL};
    int *bounds = tile_bounds(e, q_pos, k_pos, q_doc, k_doc, TQ, TK, per_batch ? B : 1);
    if (!bounds)
        return cudaErrorMemoryAllocation;
    m.bounds = bounds;
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) {
        if (d <= 32)
            err = block_forward_launch<4>(e, out, lse, q, k, v, &m, B, TQ, TK, H, KVH, D);
        else if (d <= 64)
            err = block_forward_launch<8>(e, out, lse, q, k, v, &m, B, TQ, TK, H, KVH, D);
        else
            err = block_forward_launch<16>(e, out, lse, q, k, v, &m, B, TQ, TK, H, KVH, D);
    }
    cuda_scratch_put(e->dev, bounds);
    return err;
}

static cudaError_t masked_backward(const cuk_env *e, float *dq, float *dk, float *dv, const float *dout,
                                   const float *q, const float *k, const float *v, const float *out, const float *lse,
                                   const int32_t *q_pos, const int32_t *k_pos, const int32_t *q_doc,
                                   const int32_t *k_doc, int per_batch, int64_t b, int64_t tq, int64_t tk, int64_t h,
                                   int64_t kvh, int64_t d)
{
    if (d > CUK_ATTENTION_MAX_D)
        return cudaErrorInvalidValue;
    int B = (int)b, TQ = (int)tq, TK = (int)tk, H = (int)h, KVH = (int)kvh, D = (int)d;
    int64_t rows = b * tq * h;
    float *Dv = (float *)cuda_scratch_get(e->dev, sizeof(float) * (size_t)rows);
    if (!Dv)
        return cudaErrorMemoryAllocation;
    int *bounds = tile_bounds(e, q_pos, k_pos, q_doc, k_doc, TQ, TK, per_batch ? B : 1);
    if (!bounds) {
        cuda_scratch_put(e->dev, Dv);
        return cudaErrorMemoryAllocation;
    }
    att_mask m = {q_pos, k_pos, q_doc, k_doc, per_batch, bounds};
    attention_dvec_k<<<cuk_grid(e, rows * 32, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(Dv, dout, out, rows, TQ,
                                                                                          H, D);
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) {
        if (d <= 32)
            err = block_backward_launch<4>(e, dq, dk, dv, dout, q, k, v, lse, Dv, &m, B, TQ, TK, H, KVH, D);
        else if (d <= 64)
            err = block_backward_launch<8>(e, dq, dk, dv, dout, q, k, v, lse, Dv, &m, B, TQ, TK, H, KVH, D);
        else
            err = block_backward_launch<16>(e, dq, dk, dv, dout, q, k, v, lse, Dv, &m, B, TQ, TK, H, KVH, D);
    }
    cuda_scratch_put(e->dev, bounds);
    cuda_scratch_put(e->dev, Dv);
    return err;
}

extern "C" cudaError_t cuk_attention_block_forward(const cuk_env *e, float *out, float *lse, const float *q,
                                                   const float *k, const float *v, const int32_t *q_pos,
                                                   const int32_t *k_pos, int64_t b, int64_t tq, int64_t tk,
                                                   int64_t h, int64_t kvh, int64_t d)
{
    return masked_forward(e, out, lse, q, k, v, q_pos, k_pos, NULL, NULL, 0, b, tq, tk, h, kvh, d);
}

extern "C" cudaError_t cuk_attention_block_backward(const cuk_env *e, float *dq, float *dk, float *dv,
                                                    const float *dout, const float *q, const float *k,
                                                    const float *v, const float *out, const float *lse,
                                                    const int32_t *q_pos, const int32_t *k_pos, int64_t b,
                                                    int64_t tq, int64_t tk, int64_t h, int64_t kvh, int64_t d)
{
    return masked_backward(e, dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, NULL, NULL, 0, b, tq, tk, h, kvh, d);
}

extern "C" cudaError_t cuk_attention_doc_forward(const cuk_env *e, float *out, float *lse, const float *q,
                                                 const float *k, const float *v, const int32_t *q_pos,
                                                 const int32_t *k_pos, const int32_t *q_doc, const int32_t *k_doc,
                                                 int64_t b, int64_t tq, int64_t tk, int64_t h, int64_t kvh, int64_t d)
{
    return masked_forward(e, out, lse, q, k, v, q_pos, k_pos, q_doc, k_doc, 1, b, tq, tk, h, kvh, d);
}

extern "C" cudaError_t cuk_attention_doc_backward(const cuk_env *e, float *dq, float *dk, float *dv,
                                                  const float *dout, const float *q, const float *k, const float *v,
                                                  const float *out, const float *lse, const int32_t *q_pos,
                                                  const int32_t *k_pos, const int32_t *q_doc, const int32_t *k_doc,
                                                  int64_t b, int64_t tq, int64_t tk, int64_t h, int64_t kvh,
                                                  int64_t d)
{
    return masked_backward(e, dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, q_doc, k_doc, 1, b, tq, tk, h, kvh,
                           d);
}

/* ---------------------------------------------------------------- merge */

/* The merged log-sum-exp of two sides; a side at -inf drops out. */
static __device__ __forceinline__ float lse_add(float l1, float l2)
{
    if (l1 == -INFINITY)
        return l2;
    if (l2 == -INFINITY)
        return l1;
    float mx = fmaxf(l1, l2), mn = fminf(l1, l2);
    return mx + log1pf(expf(mn - mx));
}

/* out (b,t,h,d) = out exp(lse - l) + out2 exp(lse2 - l), l = lse_add(lse, lse2): every element
 * reads its row's two lse, so lse itself is updated by the next kernel. */
static __global__ void attention_merge_out_k(float *out, const float *lse, const float *out2, const float *lse2,
                                             int64_t n, int t, int h, int d)
{
    CUK_FOR(idx, n) {
        int64_t row = idx / d, hi = row % h, ti = (row / h) % t, bi = row / ((int64_t)h * t);
        int64_t li = (bi * h + hi) * t + ti;
        float l1 = lse[li], l2 = lse2[li];
        if (l2 == -INFINITY) {
            if (l1 == -INFINITY)
                out[idx] = 0.0f;
            continue;
        }
        if (l1 == -INFINITY) {
            out[idx] = out2[idx];
            continue;
        }
        float l = lse_add(l1, l2);
        out[idx] = out[idx] * expf(l1 - l) + out2[idx] * expf(l2 - l);
    }
}

static __global__ void attention_merge_lse_k(float *lse, const float *lse2, int64_t n)
{
    CUK_FOR(i, n) lse[i] = lse_add(lse[i], lse2[i]);
}

extern "C" cudaError_t cuk_attention_merge(const cuk_env *e, float *out, float *lse, const float *out2,
                                           const float *lse2, int64_t b, int64_t t, int64_t h, int64_t d)
{
    int64_t n = b * t * h * d, rows = b * h * t;
    attention_merge_out_k<<<cuk_grid(e, n, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(out, lse, out2, lse2, n, (int)t,
                                                                                      (int)h, (int)d);
    attention_merge_lse_k<<<cuk_grid(e, rows, CUK_THREADS), CUK_THREADS, 0, e->stream>>>(lse, lse2, rows);
    return cudaGetLastError();
}
