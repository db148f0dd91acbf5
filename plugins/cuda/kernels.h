/* kernels.h: the CUDA plugin's kernel launchers (kernels_*.cu), called by its C files.
 *
 * Every launcher enqueues its kernels on env->stream and returns the launch status
 * (cudaGetLastError, or cudaErrorMemoryAllocation when its scratch memory is not there). The
 * arguments are already checked by ops.c / ops_ext.c / ops_ew.c: shapes are non-negative, pointers set,
 * ids and targets validated by cuk_find_bad_id where the op needs it. Shapes and contracts are
 * those of ctitan/device.h: row-major, contiguous, f32; backward launchers ADD into gradients.
 *
 * Determinism: no launcher uses floating-point atomics. Reductions run in a fixed order that
 * depends on the shapes only (fixed-size chunks, then an ordered combine), so the same inputs
 * give the same bits run to run.
 *
 * `bad` arguments: a device word written by cuk_find_bad_id; the kernels of an op whose ids or
 * targets were found bad (*bad < n) return at once, so an invalid call changes nothing.
 */
#ifndef CTITAN_CUDA_KERNELS_H
#define CTITAN_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ct_device;

typedef struct cuk_env {
    cudaStream_t stream;
    int sms;                 /* multiprocessors: grid sizes of the grid-stride kernels */
    size_t smem_optin;       /* largest dynamic shared memory a block may ask for */
    struct ct_device *dev; /* for scratch memory */
} cuk_env;

/* Scratch device memory (memory.c) from the plugin's cache. A launcher hands it back right
 * after enqueueing the kernels that use it: everything runs on one stream, so the next user of
 * the block is ordered after them. NULL when there is no memory. */
void *cuda_scratch_get(struct ct_device *d, size_t bytes);
void cuda_scratch_put(struct ct_device *d, void *p);

/* ---- validation (kernels_elementwise.cu) ---- */
/* *bad = the first i with ids[i] outside [0, limit) (entries equal to `skip` are valid when
 * use_skip), or n when all are valid. */
cudaError_t cuk_find_bad_id(const cuk_env *e, unsigned long long *bad, const int32_t *ids, int64_t n,
                            int64_t limit, int use_skip, int32_t skip);

/* ---- dense algebra and elementwise (kernels_elementwise.cu) ---- */
cudaError_t cuk_fill(const cuk_env *e, float *x, int64_t n, float base, float step, int period);
cudaError_t cuk_axpy(const cuk_env *e, float *y, const float *x, float alpha, int64_t n);
cudaError_t cuk_add(const cuk_env *e, float *out, const float *a, const float *b, int64_t n);
cudaError_t cuk_scale(const cuk_env *e, float *x, float alpha, int64_t n);
/* *out (device double) = sum x, or sum x^2 when squares */
/* *out = sum x (or of x^2) in double; with out NULL, *out_f32 = that double rounded to f32 */
cudaError_t cuk_sum(const cuk_env *e, double *out, float *out_f32, const float *x, int64_t n, int squares);
/* row t at position pos[t] (device int32, t entries), or t when pos is NULL; pair i's frequency
 * inv_freq[i] (device, d/2 entries), or theta^(-2i/d) when inv_freq is NULL */
cudaError_t cuk_rope(const cuk_env *e, float *out, const float *x, const int32_t *pos, const float *inv_freq,
                     int64_t b, int64_t t, int64_t h, int64_t d, float theta, int backward);
cudaError_t cuk_swiglu_forward(const cuk_env *e, float *out, const float *a, const float *g, int64_t n);
cudaError_t cuk_swiglu_backward(const cuk_env *e, float *da, float *dg, const float *dout, const float *a,
                                const float *g, int64_t n);
cudaError_t cuk_gelu_forward(const cuk_env *e, float *out, const float *x, int64_t n);
cudaError_t cuk_gelu_backward(const cuk_env *e, float *dx, const float *dout, const float *x, int64_t n);
/* The constants come from the host in double, as the CPU plugin computes them. */
cudaError_t cuk_adamw(const cuk_env *e, float *param, const float *grad, float *m, float *v, int64_t n,
                      float beta1, float beta2, float eps, float step_size, float bc2_sqrt, float decay);
/* ABI 2.10: the moments as bf16 pairs, m in the low half of mv[i] and v in the high half. */
cudaError_t cuk_adamw_bf16_moments(const cuk_env *e, float *param, const float *grad, uint32_t *mv, int64_t n,
                                   float beta1, float beta2, float eps, float step_size, float bc2_sqrt,
                                   float decay);
cudaError_t cuk_cast_f32_to_bf16(const cuk_env *e, uint16_t *dst, const float *src, int64_t n);
cudaError_t cuk_cast_bf16_to_f32(const cuk_env *e, float *dst, const uint16_t *src, int64_t n);
cudaError_t cuk_round_bf16(const cuk_env *e, float *x, int64_t n);
cudaError_t cuk_amax(const cuk_env *e, float *amax, const float *src, int64_t n, int64_t group);
cudaError_t cuk_quantize_fp8(const cuk_env *e, uint8_t *dst, const float *src, const float *scale,
                             int64_t n, int64_t group, int e5m2);
cudaError_t cuk_dequantize_fp8(const cuk_env *e, float *dst, const uint8_t *src, const float *scale,
                               int64_t n, int64_t group, int e5m2);
cudaError_t cuk_transpose(const cuk_env *e, float *dst, const float *src, int64_t rows, int64_t cols);
/* out[0] = 1 / *a, out[1] = 1 / *b (the dequantisation factors of two fp8 scales; device memory) */
cudaError_t cuk_reciprocal2(const cuk_env *e, float *out, const float *a, const float *b);
/* out (n) = 1 / x (n) */
cudaError_t cuk_reciprocal(const cuk_env *e, float *out, const float *x, int64_t n);

/* ---- ABI 2.1 elementwise ops (kernels_ew.cu): device.h's ew_*, out may alias any input ---- */
cudaError_t cuk_ew_axpby(const cuk_env *e, float *out, float alpha, const float *x, float beta, const float *y,
                         int64_t n);
cudaError_t cuk_ew_mul(const cuk_env *e, float *out, const float *x, const float *y, int64_t n);
cudaError_t cuk_ew_div(const cuk_env *e, float *out, const float *x, const float *y, float eps, int64_t n);
cudaError_t cuk_ew_sqrt(const cuk_env *e, float *out, const float *x, int64_t n);
cudaError_t cuk_ew_sign(const cuk_env *e, float *out, const float *x, int64_t n);
cudaError_t cuk_ew_clamp(const cuk_env *e, float *out, const float *x, float lo, float hi, int64_t n);
cudaError_t cuk_ew_greater(const cuk_env *e, float *out, const float *x, const float *y, int64_t n);

/* ---- row ops (kernels_rows.cu) ---- */
/* The table holds rows [begin, begin + rows); ids outside give zero rows. */
cudaError_t cuk_embedding_forward(const cuk_env *e, float *out, const int32_t *ids, const float *table,
                                  int64_t n, int64_t c, int64_t begin, int64_t rows,
                                  const unsigned long long *bad);
cudaError_t cuk_rmsnorm_forward(const cuk_env *e, float *out, float *rstd, const float *x, const float *w,
                                int64_t n, int64_t c, float eps);
cudaError_t cuk_rmsnorm_backward_input(const cuk_env *e, float *dx, const float *dout, const float *x,
                                       const float *w, const float *rstd, int64_t n, int64_t c);
cudaError_t cuk_rmsnorm_backward_weight(const cuk_env *e, float *dw, const float *dout, const float *x,
                                        const float *rstd, int64_t n, int64_t c);
cudaError_t cuk_layernorm_forward(const cuk_env *e, float *out, float *mean, float *rstd, const float *x,
                                  const float *w, const float *b, int64_t n, int64_t c, float eps);
cudaError_t cuk_layernorm_backward_input(const cuk_env *e, float *dx, const float *dout, const float *x,
                                         const float *w, const float *mean, const float *rstd, int64_t n,
                                         int64_t c);
cudaError_t cuk_layernorm_backward_weight(const cuk_env *e, float *dw, float *db, const float *dout,
                                          const float *x, const float *mean, const float *rstd, int64_t n,
                                          int64_t c);
cudaError_t cuk_bias_forward(const cuk_env *e, float *out, const float *x, const float *bias, int64_t n,
                             int64_t c);
cudaError_t cuk_bias_backward(const cuk_env *e, float *dbias, const float *dout, int64_t n, int64_t c);
cudaError_t cuk_cross_entropy_forward(const cuk_env *e, float *losses, const float *logits,
                                      const int32_t *targets, int64_t n, int64_t v, int32_t ignore_index,
                                      const unsigned long long *bad);
/* dloss_dev (device, one f32) replaces dloss when not NULL */
cudaError_t cuk_cross_entropy_backward(const cuk_env *e, float *dlogits, const float *logits,
                                       const int32_t *targets, float dloss, const float *dloss_dev, int64_t n,
                                       int64_t v, int32_t ignore_index, const unsigned long long *bad);
cudaError_t cuk_cross_entropy_stats(const cuk_env *e, float *stats, const float *logits,
                                    const int32_t *targets, int64_t n, int64_t v, int64_t begin,
                                    int32_t ignore_index);
/* dloss_dev (device, one f32) replaces dloss when not NULL */
cudaError_t cuk_cross_entropy_backward_lse(const cuk_env *e, float *dlogits, const float *logits,
                                           const int32_t *targets, const float *lse, float dloss,
                                           const float *dloss_dev, int64_t n, int64_t v, int64_t begin,
                                           int32_t ignore_index);

/* ---- embedding backward (kernels_embedding.cu): sort by id, then one ordered sum per id ---- */
/* dtable (rows,c) += dout rows whose ids are in [begin, begin + rows); n <= INT32_MAX,
 * rows < INT32_MAX. */
cudaError_t cuk_embedding_backward(const cuk_env *e, float *dtable, const int32_t *ids, const float *dout,
                                   int64_t n, int64_t c, int64_t begin, int64_t rows,
                                   const unsigned long long *bad);

/* ---- attention (kernels_attention.cu): head dim d <= CUK_ATTENTION_MAX_D ---- */
#define CUK_ATTENTION_MAX_D 128
cudaError_t cuk_attention_forward(const cuk_env *e, float *out, float *lse, const float *q, const float *k,
                                  const float *v, int64_t b, int64_t t, int64_t h, int64_t kvh, int64_t d);
cudaError_t cuk_attention_backward(const cuk_env *e, float *dq, float *dk, float *dv, const float *dout,
                                   const float *q, const float *k, const float *v, const float *out,
                                   const float *lse, int64_t b, int64_t t, int64_t h, int64_t kvh, int64_t d);
/* ABI 2.3, by blocks at explicit positions (device int32): key j visible to query i when
 * k_pos[j] <= q_pos[i]; a (query tile, key tile) pair with no visible key is skipped. */
cudaError_t cuk_attention_block_forward(const cuk_env *e, float *out, float *lse, const float *q, const float *k,
                                        const float *v, const int32_t *q_pos, const int32_t *k_pos, int64_t b,
                                        int64_t tq, int64_t tk, int64_t h, int64_t kvh, int64_t d);
cudaError_t cuk_attention_block_backward(const cuk_env *e, float *dq, float *dk, float *dv, const float *dout,
                                         const float *q, const float *k, const float *v, const float *out,
                                         const float *lse, const int32_t *q_pos, const int32_t *k_pos,
                                         int64_t b, int64_t tq, int64_t tk, int64_t h, int64_t kvh, int64_t d);
/* ABI 2.13: positions and documents per batch row, q_pos/q_doc (b,tq), k_pos/k_doc (b,tk): key j
 * visible to query i when they share a document and k_pos[j] <= q_pos[i]; a (query tile, key tile)
 * pair whose position or document ranges rule out every key is skipped. */
cudaError_t cuk_attention_doc_forward(const cuk_env *e, float *out, float *lse, const float *q, const float *k,
                                      const float *v, const int32_t *q_pos, const int32_t *k_pos, const int32_t *q_doc,
                                      const int32_t *k_doc, int64_t b, int64_t tq, int64_t tk, int64_t h, int64_t kvh,
                                      int64_t d);
cudaError_t cuk_attention_doc_backward(const cuk_env *e, float *dq, float *dk, float *dv, const float *dout,
                                       const float *q, const float *k, const float *v, const float *out,
                                       const float *lse, const int32_t *q_pos, const int32_t *k_pos,
                                       const int32_t *q_doc, const int32_t *k_doc, int64_t b, int64_t tq, int64_t tk,
                                       int64_t h, int64_t kvh, int64_t d);
/* out, lse (b,t,h,d), (b,h,t) merged with out2, lse2 by log-sum-exp */
cudaError_t cuk_attention_merge(const cuk_env *e, float *out, float *lse, const float *out2, const float *lse2,
                                int64_t b, int64_t t, int64_t h, int64_t d);
/* Dynamic shared memory the attention kernels need for head dim d (the largest of the three). */
size_t cuk_attention_smem_bytes(int64_t d);

/* ---- mixture of experts (kernels_moe.cu, ABI 2.14): device.h's moe_* and grouped_matmul_* ---- */
/* scores forward (out = scores, in = logits) or backward (out = dlogits += ..., in = the saved scores) */
cudaError_t cuk_moe_scores(const cuk_env *e, float *out, const float *dscores, const float *in, int64_t n,
                           int64_t experts, int sigmoid, int backward);
cudaError_t cuk_moe_topk(const cuk_env *e, int32_t *idx, float *weights, const float *scores, const float *bias,
                         int64_t n, int64_t experts, int64_t k, int64_t n_groups, int64_t topk_groups, int normalize,
                         float route_scale);
cudaError_t cuk_moe_topk_backward(const cuk_env *e, float *dscores, const float *dweights, const float *scores,
                                  const int32_t *idx, int64_t n, int64_t experts, int64_t k, int normalize,
                                  float route_scale);
cudaError_t cuk_moe_permute(const cuk_env *e, int32_t *order, int32_t *inv, int32_t *offsets, const int32_t *idx,
                            int64_t nk, int64_t experts);
/* forward: out (n*k,d) from in = x by perm = order; backward: out = dx += from in = dout by perm = inv */
cudaError_t cuk_moe_gather(const cuk_env *e, float *out, const float *in, const int32_t *perm, int64_t n, int64_t k,
                           int64_t d, int backward);
cudaError_t cuk_moe_combine(const cuk_env *e, float *out, const float *y, const float *weights, const int32_t *inv,
                            int64_t n, int64_t k, int64_t d);
cudaError_t cuk_moe_combine_backward(const cuk_env *e, float *dy, float *dweights, const float *dout, const float *y,
                                     const float *weights, const int32_t *inv, int64_t n, int64_t k, int64_t d);
/* which 0: out = y, a = x, b = w; 1: out = dx, a = dy, b = w; 2: out = dw, a = dy, b = x */
cudaError_t cuk_grouped_matmul(const cuk_env *e, int which, float *out, const float *a, const float *b,
                               const int32_t *offsets, int64_t m, int64_t experts, int64_t o, int64_t i);

#ifdef __cplusplus
}
#endif

#endif
