/* kernels.h: the f32 instance of kernels_impl.h and the float8 kernels, as device.c calls them.
 *
 * kernels_f32.c and kernels_fp8.c include this file before their definitions, so the compiler
 * checks every prototype here against its definition. Shapes and semantics: see ctitan/device.h
 * and kernels_impl.h.
 * Functions returning int return nonzero only when their scratch memory cannot be allocated.
 */
#ifndef CTITAN_CPU_KERNELS_H
#define CTITAN_CPU_KERNELS_H

#include <stdint.h>

void matmul_f32(float *c, const float *a, const float *b, int m, int n, int k, int trans_a,
                int trans_b, float alpha, float beta);
void axpy_f32(float *y, const float *x, float alpha, int64_t n);
void add_f32(float *out, const float *a, const float *b, int64_t n);
void scale_f32(float *x, float alpha, int64_t n);
/* ABI 2.1 elementwise ops (device.h's ew_*); out may alias any input. */
void ew_axpby_f32(float *out, float alpha, const float *x, float beta, const float *y, int64_t n);
void ew_mul_f32(float *out, const float *x, const float *y, int64_t n);
void ew_div_f32(float *out, const float *x, const float *y, float eps, int64_t n);
void ew_sqrt_f32(float *out, const float *x, int64_t n);
void ew_sign_f32(float *out, const float *x, int64_t n);
void ew_clamp_f32(float *out, const float *x, float lo, float hi, int64_t n);
void ew_greater_f32(float *out, const float *x, const float *y, int64_t n);
double sum_f32(const float *x, int64_t n);
double sum_squares_f32(const float *x, int64_t n);

/* A table holding vocabulary rows [begin, begin + rows) (begin 0, rows vocab: the whole table);
 * begin >= 0, ids outside the range give a zero row (forward) and nothing (backward). */
void embedding_forward_f32(float *out, const int32_t *ids, const float *table, int64_t n, int64_t c,
                           int64_t begin, int64_t rows);
void embedding_backward_f32(float *dtable, const int32_t *ids, const float *dout, int64_t n,
                            int64_t c, int64_t begin, int64_t rows);
void copy_2d_f32(float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows,
                 int64_t cols);

void rmsnorm_forward_f32(float *out, float *rstd, const float *x, const float *w, int64_t n,
                         int64_t c, float eps);
void rmsnorm_backward_input_f32(float *dx, const float *dout, const float *x, const float *w,
                                const float *rstd, int64_t n, int64_t c);
void rmsnorm_backward_weight_f32(float *dw, const float *dout, const float *x, const float *rstd,
                                 int64_t n, int64_t c);
void layernorm_forward_f32(float *out, float *mean, float *rstd, const float *x, const float *w,
                           const float *b, int64_t n, int64_t c, float eps);
void layernorm_backward_input_f32(float *dx, const float *dout, const float *x, const float *w,
                                  const float *mean, const float *rstd, int64_t n, int64_t c);
void layernorm_backward_weight_f32(float *dw, float *db, const float *dout, const float *x,
                                   const float *mean, const float *rstd, int64_t n, int64_t c);

void bias_forward_f32(float *out, const float *x, const float *bias, int64_t n, int64_t c);
void bias_backward_f32(float *dbias, const float *dout, int64_t n, int64_t c);

/* ABI 2.23, every case: positions pos (int32, any values >= 0, in any order) or NULL for rows
 * 0..t-1; the model's per-pair inverse frequencies inv_freq (d/2) or NULL for theta^(-2i/d). */
int rope_forward_f32(float *out, const float *x, const int32_t *pos, const float *inv_freq,
                     float theta, int64_t b, int64_t t, int64_t h, int64_t d);
int rope_backward_f32(float *dx, const float *dout, const int32_t *pos, const float *inv_freq,
                      float theta, int64_t b, int64_t t, int64_t h, int64_t d);
int attention_block_forward_f32(float *out, float *lse, const float *q, const float *k,
                                const float *v, const int32_t *q_pos, const int32_t *k_pos,
                                int64_t b, int64_t tq, int64_t tk, int64_t h, int64_t kvh,
                                int64_t d);
void attention_merge_f32(float *out, float *lse, const float *out2, const float *lse2, int64_t b,
                         int64_t t, int64_t h, int64_t d);
int attention_block_backward_f32(float *dq, float *dk, float *dv, const float *dout,
                                 const float *q, const float *k, const float *v, const float *out,
                                 const float *lse, const int32_t *q_pos, const int32_t *k_pos,
                                 int64_t b, int64_t tq, int64_t tk, int64_t h, int64_t kvh,
                                 int64_t d);

/* ABI 2.13: positions and documents per batch row (b,tq) and (b,tk). */
int attention_doc_forward_f32(float *out, float *lse, const float *q, const float *k,
                              const float *v, const int32_t *q_pos, const int32_t *k_pos,
                              const int32_t *q_doc, const int32_t *k_doc, int64_t b, int64_t tq,
                              int64_t tk, int64_t h, int64_t kvh, int64_t d);
int attention_doc_backward_f32(float *dq, float *dk, float *dv, const float *dout,
                               const float *q, const float *k, const float *v, const float *out,
                               const float *lse, const int32_t *q_pos, const int32_t *k_pos,
                               const int32_t *q_doc, const int32_t *k_doc, int64_t b, int64_t tq,
                               int64_t tk, int64_t h, int64_t kvh, int64_t d);

int attention_forward_f32(float *out, float *lse, const float *q, const float *k, const float *v,
                          int64_t b, int64_t t, int64_t h, int64_t kvh, int64_t d);
int attention_backward_f32(float *dq, float *dk, float *dv, const float *dout, const float *q,
                           const float *k, const float *v, const float *out, const float *lse,
                           int64_t b, int64_t t, int64_t h, int64_t kvh, int64_t d);

void swiglu_forward_f32(float *out, const float *a, const float *g, int64_t n);
void swiglu_backward_f32(float *da, float *dg, const float *dout, const float *a, const float *g,
                         int64_t n);
void gelu_forward_f32(float *out, const float *x, int64_t n);
void gelu_backward_f32(float *dx, const float *dout, const float *x, int64_t n);

void cross_entropy_forward_f32(float *losses, const float *logits, const int32_t *targets,
                               int64_t n, int64_t v, int32_t ignore_index);
int cross_entropy_backward_f32(float *dlogits, const float *logits, const int32_t *targets,
                               float dloss, int64_t n, int64_t v, int32_t ignore_index);

/* ABI 1.3: logits holding vocabulary columns [begin, begin + v); begin >= 0. */
void cross_entropy_stats_f32(float *stats, const float *logits, const int32_t *targets, int64_t n,
                             int64_t v, int64_t begin, int32_t ignore_index);
void cross_entropy_backward_lse_f32(float *dlogits, const float *logits, const int32_t *targets,
                                    const float *lse, float dloss, int64_t n, int64_t v,
                                    int64_t begin, int32_t ignore_index);

void adamw_f32(float *param, const float *grad, float *m, float *v, int64_t n, float lr,
               float beta1, float beta2, float eps, float weight_decay, int64_t step);
/* ABI 2.10: the moments as bf16 pairs, m in the low half of mv[i] and v in the high half. */
void adamw_bf16_moments_f32(float *param, const float *grad, uint32_t *mv, int64_t n, float lr, float beta1,
                            float beta2, float eps, float weight_decay, int64_t step);

void transpose_f32(float *dst, const float *src, int64_t rows, int64_t cols);

/* float8 (kernels_fp8.c): groups of `group` elements, group divides n; e5m2 selects the format
 * (else e4m3). */
void amax_f32(float *amax, const float *src, int64_t n, int64_t group);
void quantize_fp8_f32(uint8_t *dst, const float *src, const float *scale, int64_t n, int64_t group,
                      int e5m2);
void dequantize_fp8_f32(float *dst, const uint8_t *src, const float *scale, int64_t n,
                        int64_t group, int e5m2);

#endif
