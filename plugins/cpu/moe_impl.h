/* moe_impl.h: the CPU kernels of the mixture-of-experts ops (ABI 2.14), written once for two
 * precisions, as kernels_impl.h is: an instance defines CT_REAL_DOUBLE (0 or 1) and includes it
 * after kernels_impl.h's instance of the same precision (the grouped GEMMs call its matmul).
 * plugins/cpu/moe.c is the plugin's instance; tests/unit/test_cpu_gradcheck.c builds the double
 * one for finite differences.
 *
 * Shapes and contracts are those of ctitan/device.h (moe_* and grouped_matmul_*). The kernels trust
 * their shapes; index values read from "device" memory are not trusted: an index out of its range
 * is skipped (or gives a zero row), never read through. Backward kernels accumulate. Every sum runs
 * in a fixed order (slots in order of s, segments one GEMM each), so results do not depend on the
 * thread count, apart from OpenBLAS's own split of a GEMM.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef CT_REAL_DOUBLE
#error "define CT_REAL_DOUBLE (0 or 1) before including moe_impl.h"
#endif

#if CT_REAL_DOUBLE
#define real double
#define K(name) name##_f64
#define R_EXP(x) exp(x)
#else
#define real float
#define K(name) name##_f32
#define R_EXP(x) expf(x)
#endif

#ifndef CPU_MOE_LINKAGE
#ifdef CPU_KERNEL_LINKAGE
#define CPU_MOE_LINKAGE CPU_KERNEL_LINKAGE
#else
#define CPU_MOE_LINKAGE
#endif
#endif

#ifndef CT_MOE_CONSTANTS
#define CT_MOE_CONSTANTS
/* Added to the sum of a row's chosen scores before dividing by it (device.h: moe_topk_forward). */
#define CPU_MOE_NORM_EPS 1e-20
/* Rows of the row-wise MoE kernels below which a parallel region costs more than it saves. */
#define CPU_MOE_PAR_ROWS 64
#endif

/* ---------------------------------------------------------------- router scores */

/* scores (n,e) = softmax(logits) per row (sigmoid: 0) or sigmoid elementwise (1) */
CPU_MOE_LINKAGE void K(moe_scores_forward)(real *scores, const real *logits, int64_t n, int64_t e, int sigmoid)
{
#pragma omp parallel for schedule(static) if (n >= CPU_MOE_PAR_ROWS)
    for (int64_t t = 0; t < n; t++) {
        const real *l = logits + t * e;
        real *s = scores + t * e;
        if (sigmoid) {
            for (int64_t j = 0; j < e; j++)
                s[j] = 1 / (1 + R_EXP(-l[j]));
            continue;
        }
        real m = l[0];
        for (int64_t j = 1; j < e; j++)
            m = l[j] > m ? l[j] : m;
        real sum = 0;
        for (int64_t j = 0; j < e; j++) {
            s[j] = R_EXP(l[j] - m);
            sum += s[j];
        }
        for (int64_t j = 0; j < e; j++)
            s[j] /= sum;
    }
}

/* dlogits (n,e) += the scores' backward from the saved scores (n,e) */
CPU_MOE_LINKAGE void K(moe_scores_backward)(real *dlogits, const real *dscores, const real *scores, int64_t n,
                                            int64_t e, int sigmoid)
{
#pragma omp parallel for schedule(static) if (n >= CPU_MOE_PAR_ROWS)
    for (int64_t t = 0; t < n; t++) {
        const real *s = scores + t * e, *ds = dscores + t * e;
        real *dl = dlogits + t * e;
        if (sigmoid) {
            for (int64_t j = 0; j < e; j++)
                dl[j] += ds[j] * s[j] * (1 - s[j]);
            continue;
        }
        real dot = 0;
        for (int64_t j = 0; j < e; j++)
            dot += ds[j] * s[j];
        for (int64_t j = 0; j < e; j++)
            dl[j] += s[j] * (ds[j] - dot);
    }
}

/* ---------------------------------------------------------------- top-k routing */

/* (a, i) ranks before (b, j): the larger value, and on a tie the lower index */
static inline int K(moe_before)(real a, int64_t i, real b, int64_t j)
{
    return a > b || (a == b && i < j);
}

/* The score of group g of row (s, bias): its two best members' score + bias (its one if alone). */
static real K(moe_group_score)(const real *s, const real *bias, int64_t g, int64_t gsize)
{
    real b1 = 0, b2 = 0;
    for (int64_t j = g * gsize, c = 0; j < (g + 1) * gsize; j++, c++) {
        real v = s[j] + (bias ? bias[j] : 0);
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

/* idx (n,k), weights (n,k) from scores (n,e) and bias (e, or NULL): device.h's moe_topk_forward.
 * A group is eligible when fewer than topk_groups groups rank before it. The c-th choice is the best
 * eligible expert ranking after the (c-1)-th: k passes over the row, no per-expert scratch.
 * Returns 0, or -1 when the group scratch (2 n_groups values per row) cannot be allocated. */
CPU_MOE_LINKAGE int K(moe_topk_forward)(int32_t *idx, real *weights, const real *scores, const real *bias,
                                        int64_t n, int64_t e, int64_t k, int64_t n_groups, int64_t topk_groups,
                                        int normalize, real route_scale)
{
    const int64_t groups = n_groups > 1 ? n_groups : 1, gsize = e / groups;
    real *scratch = NULL;
    if (groups > 1 && !(scratch = malloc((size_t)(n * 2 * groups) * sizeof *scratch + 1)))
        return -1;
#pragma omp parallel for schedule(static) if (n >= CPU_MOE_PAR_ROWS)
    for (int64_t t = 0; t < n; t++) {
        const real *s = scores + t * e;
        int32_t *ix = idx + t * k;
        real *w = weights + t * k;
        real *gs = scratch ? scratch + t * 2 * groups : NULL, *eligible = gs ? gs + groups : NULL;
        if (groups > 1) {
            for (int64_t g = 0; g < groups; g++)
                gs[g] = K(moe_group_score)(s, bias, g, gsize);
            for (int64_t g = 0; g < groups; g++) {
                int64_t ahead = 0;
                for (int64_t h = 0; h < groups; h++)
                    ahead += h != g && K(moe_before)(gs[h], h, gs[g], g);
                eligible[g] = ahead < topk_groups;
            }
        }
        real prev_v = 0;
        int64_t prev_j = -1;
        for (int64_t c = 0; c < k; c++) {
            int64_t best = -1;
            real best_v = 0;
            for (int64_t j = 0; j < e; j++) {
                real v = s[j] + (bias ? bias[j] : 0);
                if (prev_j >= 0 && !K(moe_before)(prev_v, prev_j, v, j))
                    continue; /* already chosen, or ranks before the last choice */
                if (best >= 0 && !K(moe_before)(v, j, best_v, best))
                    continue;
                if (eligible && eligible[j / gsize] == 0)
                    continue;
                best = j;
                best_v = v;
            }
            ix[c] = (int32_t)(best < 0 ? 0 : best); /* best < 0 only for NaN scores */
            prev_v = best_v;
            prev_j = best;
        }
        real sum = 0;
        for (int64_t c = 0; c < k; c++) {
            w[c] = s[ix[c]];
            sum += w[c];
        }
        real f = normalize ? route_scale / (sum + (real)CPU_MOE_NORM_EPS) : route_scale;
        for (int64_t c = 0; c < k; c++)
            w[c] *= f;
    }
    free(scratch);
    return 0;
}

/* dscores (n,e) += the weights' gradient through the normalisation and route_scale */
CPU_MOE_LINKAGE void K(moe_topk_backward)(real *dscores, const real *dweights, const real *scores,
                                          const int32_t *idx, int64_t n, int64_t e, int64_t k, int normalize,
                                          real route_scale)
{
#pragma omp parallel for schedule(static) if (n >= CPU_MOE_PAR_ROWS)
    for (int64_t t = 0; t < n; t++) {
        const real *s = scores + t * e, *dw = dweights + t * k;
        const int32_t *ix = idx + t * k;
        real *ds = dscores + t * e;
        if (!normalize) {
            for (int64_t c = 0; c < k; c++)
                if (ix[c] >= 0 && ix[c] < e)
                    ds[ix[c]] += route_scale * dw[c];
            continue;
        }
        /* w_c = r p_c / D, D = sum p + eps:  dp_c = r (dw_c - sum_s dw_s p_s / D) / D */
        real sum = 0, dot = 0;
        for (int64_t c = 0; c < k; c++)
            if (ix[c] >= 0 && ix[c] < e) {
                sum += s[ix[c]];
                dot += dw[c] * s[ix[c]];
            }
        real den = sum + (real)CPU_MOE_NORM_EPS;
        for (int64_t c = 0; c < k; c++)
            if (ix[c] >= 0 && ix[c] < e)
                ds[ix[c]] += route_scale * (dw[c] - dot / den) / den;
    }
}

/* ---------------------------------------------------------------- dispatch and combine */

/* out (n*k,d) row j = x row order[j] / k (a zero row for an order entry out of range) */
CPU_MOE_LINKAGE void K(moe_gather_forward)(real *out, const real *x, const int32_t *order, int64_t n, int64_t k,
                                           int64_t d)
{
    const int64_t nk = n * k;
#pragma omp parallel for schedule(static) if (nk >= CPU_MOE_PAR_ROWS)
    for (int64_t j = 0; j < nk; j++) {
        int32_t p = order[j];
        if (p >= 0 && p < nk)
            memcpy(out + j * d, x + (p / k) * d, (size_t)d * sizeof(real));
        else
            memset(out + j * d, 0, (size_t)d * sizeof(real));
    }
}

/* dx (n,d) row t += dout rows inv[t*k + s], s = 0..k-1 in order */
CPU_MOE_LINKAGE void K(moe_gather_backward)(real *dx, const real *dout, const int32_t *inv, int64_t n, int64_t k,
                                            int64_t d)
{
    const int64_t nk = n * k;
#pragma omp parallel for schedule(static) if (n >= CPU_MOE_PAR_ROWS)
    for (int64_t t = 0; t < n; t++)
        for (int64_t s = 0; s < k; s++) {
            int32_t j = inv[t * k + s];
            if (j < 0 || j >= nk)
                continue;
            const real *src = dout + j * d;
            real *dst = dx + t * d;
            for (int64_t c = 0; c < d; c++)
                dst[c] += src[c];
        }
}

/* out (n,d) row t = sum_s weights[t*k+s] * y row inv[t*k+s] */
CPU_MOE_LINKAGE void K(moe_combine_forward)(real *out, const real *y, const real *weights, const int32_t *inv,
                                            int64_t n, int64_t k, int64_t d)
{
    const int64_t nk = n * k;
#pragma omp parallel for schedule(static) if (n >= CPU_MOE_PAR_ROWS)
    for (int64_t t = 0; t < n; t++) {
        real *dst = out + t * d;
        memset(dst, 0, (size_t)d * sizeof(real));
        for (int64_t s = 0; s < k; s++) {
            int32_t j = inv[t * k + s];
            if (j < 0 || j >= nk)
                continue;
            const real *src = y + j * d;
            real w = weights[t * k + s];
            for (int64_t c = 0; c < d; c++)
                dst[c] += w * src[c];
        }
    }
}

/* dy row inv[t*k+s] += weights * dout row t;  dweights[t*k+s] += dot(dout row t, y row inv[t*k+s]).
 * Each dy row has one (t, s) writer when inv is a permutation, so rows need no ordering. */
CPU_MOE_LINKAGE void K(moe_combine_backward)(real *dy, real *dweights, const real *dout, const real *y,
                                             const real *weights, const int32_t *inv, int64_t n, int64_t k,
                                             int64_t d)
{
    const int64_t nk = n * k;
#pragma omp parallel for schedule(static) if (n >= CPU_MOE_PAR_ROWS)
    for (int64_t t = 0; t < n; t++)
        for (int64_t s = 0; s < k; s++) {
            int32_t j = inv[t * k + s];
            if (j < 0 || j >= nk)
                continue;
            const real *g = dout + t * d, *yr = y + j * d;
            real w = weights[t * k + s], dot = 0;
            real *dr = dy + j * d;
            for (int64_t c = 0; c < d; c++) {
                dr[c] += w * g[c];
                dot += g[c] * yr[c];
            }
            dweights[t * k + s] += dot;
        }
}

/* ---------------------------------------------------------------- grouped GEMMs */

/* One GEMM per expert segment [offsets[g], offsets[g+1]) of the m rows (offsets checked by the caller).
 * which: 0 forward y_seg = x_seg w_g^T; 1 dx_seg += dy_seg w_g; 2 dw_g += dy_seg^T x_seg. */
CPU_MOE_LINKAGE void K(grouped_matmul)(int which, real *out, const real *a, const real *b,
                                       const int32_t *offsets, int64_t e, int64_t o, int64_t i)
{
    for (int64_t g = 0; g < e; g++) {
        int64_t r0 = offsets[g], len = offsets[g + 1] - r0;
        if (len <= 0)
            continue;
        if (which == 0) /* y (len,o) = x (len,i) w_g^T, w_g (o,i) */
            K(matmul)(out + r0 * o, a + r0 * i, b + g * o * i, (int)len, (int)o, (int)i, 0, 1, 1, 0);
        else if (which == 1) /* dx (len,i) += dy (len,o) w_g (o,i) */
            K(matmul)(out + r0 * i, a + r0 * o, b + g * o * i, (int)len, (int)i, (int)o, 0, 0, 1, 1);
        else /* dw_g (o,i) += dy^T (o,len) x (len,i) */
            K(matmul)(out + g * o * i, a + r0 * o, b + r0 * i, (int)o, (int)i, (int)len, 1, 0, 1, 1);
    }
}

#undef real
#undef K
#undef R_EXP
#undef CT_REAL_DOUBLE
