/* ctitan/device.h: the device-ops interface (plugin kind CT_KIND_DEVICE).
 *
 * A device plugin owns memory on its device and runs every op the models need. The host calls ops
 * with raw device pointers and explicit shapes (llm.c style); tensors are row-major, contiguous,
 * f32 unless the name says otherwise. The shape comment on each op is the contract.
 *
 * Conventions every op follows (the conformance harness checks them):
 *  - Backward ops ACCUMULATE into their gradient outputs (`+=`): the host zeroes gradients once,
 *    and fan-out (residuals) and gradient accumulation come for free.
 *  - Backward is split into an input-gradient half and a weight-gradient half where the op has
 *    weights, so zero-bubble pipeline schedules can run them apart.
 *  - Ops are deterministic: the same inputs and the same thread count give the same bits.
 *  - Ops may run asynchronously; `copy` to the host and `synchronize` wait for them.
 *  - Every function returns CT_OK or an error code with detail through host->set_error.
 *  - Before it calls an op, the host checks the arguments every device checks alike (sizes not
 *    negative, pointers set where there is work, groups and fp8 formats, head counts, strides;
 *    core/host/devcheck.c lists the ops) and refuses a bad call itself, with the message under the
 *    plugin's name: a plugin checks what only it knows (its limits, ids and targets in its
 *    memory, what a graph capture cannot hold).
 *
 * Optional ops (NULL = unsupported) are marked so; everything else is required, save the narrow ops a
 * 2.23 general op supersedes (marked so). Ops are grouped by topic, the whole-tensor op before its
 * variants; none is ordered by the version that added it.
 *
 * Handles (abi.h): the ct_device from create is the host's to pass back until destroy; a ct_stream
 * (share_stream) belongs to the device and lives until its destroy; a ct_graph (graph_end) is the
 * caller's until graph_free, which must come before the device's destroy.
 */
#ifndef CTITAN_DEVICE_H
#define CTITAN_DEVICE_H

#include "ctitan/abi.h"
#include "ctitan/host.h"
#include "ctitan/tensor.h"

typedef enum ct_copy_kind { CT_COPY_H2D = 1, CT_COPY_D2H = 2, CT_COPY_D2D = 3 } ct_copy_kind;

/* The router's score function of moe_scores_forward / moe_scores_backward (ABI 2.14). */
typedef enum ct_moe_score { CT_MOE_SOFTMAX = 0, CT_MOE_SIGMOID = 1 } ct_moe_score;

typedef struct ct_device_info {
    size_t struct_size;
    const char *name;   /* "cpu", "cuda:0"; the device's string, valid until its destroy */
    int threads;        /* worker threads (CPU) or SMs (GPU) */
    int64_t memory_bytes; /* total device memory, 0 if unknown */
} ct_device_info;

typedef struct ct_device_api {
    size_t struct_size;

    /* ---- lifecycle ---- */
    /* Reads the plugin's options through `host` (e.g. `threads`). *dev is the caller's until destroy. */
    ct_status (*create)(const ct_host *host, ct_device **dev);
    void (*destroy)(ct_device *dev);
    ct_status (*info)(ct_device *dev, ct_device_info *out);
    /* Optional: measure the matmul peak of this device in FLOP/s (a short GEMM loop through matmul,
     * so at the operand precision set_matmul_dtype chose: f32 unless the host asked for bf16). */
    ct_status (*measure_peak_flops)(ct_device *dev, double *flops_per_s);

    /* ---- memory, copies and the stream ---- */
    /* 64-byte aligned; *out is the caller's until free (every block before destroy) */
    ct_status (*alloc)(ct_device *dev, size_t bytes, void **out);
    void (*free)(ct_device *dev, void *p);
    ct_status (*copy)(ct_device *dev, void *dst, const void *src, size_t bytes, ct_copy_kind kind);
    /* Optional. dst[r * dst_stride + j] = src[r * src_stride + j] for r < rows, j < cols (f32 elements); no overlap */
    ct_status (*copy_2d)(ct_device *dev, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                         int64_t rows, int64_t cols);
    ct_status (*zero)(ct_device *dev, void *p, size_t bytes);
    ct_status (*synchronize)(ct_device *dev);
    /* Optional. Moves the device's work onto a stream that other plugins order against with events, and
     * returns it (a cudaStream_t for CUDA). Until this call a device may run on a stream that is
     * implicitly ordered with every other (CUDA's legacy default stream); after it, whoever touches
     * device buffers on another stream must order itself with events (see comm.h, bind_stream).
     * The stream stays the device's (a second call returns the same one) until its destroy. */
    ct_status (*share_stream)(ct_device *dev, ct_stream **stream);

    /* ---- dense algebra and reductions ---- */
    /* c (m,n) = alpha * op(a) @ op(b) + beta * c, where op(a) is (m,k): a is (m,k), or (k,m) when
     * trans_a; op(b) is (k,n): b is (k,n), or (n,k) when trans_b. beta 0 ignores c's contents. */
    ct_status (*matmul)(ct_device *dev, float *c, const float *a, const float *b, int64_t m, int64_t n,
                        int64_t k, int trans_a, int trans_b, float alpha, float beta);
    /* Optional. The precision of matmul's operands from now on: CT_F32 (exact, the default) or CT_BF16 (each
     * operand rounded to bf16 as it is read, products summed in f32, c stays f32: a bf16 tensor-core
     * GEMM). The host calls it with CT_BF16 when training.mixed_precision_param is bfloat16. A dtype
     * the device does not offer is CT_ERR_UNSUPPORTED (matmul then stays exact). */
    ct_status (*set_matmul_dtype)(ct_device *dev, ct_dtype dtype);
    /* y (n) += alpha * x (n) */
    ct_status (*axpy)(ct_device *dev, float *y, const float *x, float alpha, int64_t n);
    /* out (n) = a (n) + b (n); out may alias a or b */
    ct_status (*add)(ct_device *dev, float *out, const float *a, const float *b, int64_t n);
    /* x (n) *= alpha */
    ct_status (*scale)(ct_device *dev, float *x, float alpha, int64_t n);
    /* *out = sum x (n) and sum x^2 (n), accumulated in double, returned to the host. */
    ct_status (*sum)(ct_device *dev, double *out, const float *x, int64_t n);
    ct_status (*sum_squares)(ct_device *dev, double *out, const float *x, int64_t n);
    /* Optional. *out (ONE f32 in device memory) = sum x (n), summed as `sum` sums (double), without waiting
     * for the device: the loss stays on the device until the host copies it back. */
    ct_status (*sum_to_device)(ct_device *dev, float *out, const float *x, int64_t n);
    /* Optional. dst (cols, rows) = src (rows, cols) transposed. */
    ct_status (*transpose)(ct_device *dev, float *dst, const float *src, int64_t rows, int64_t cols);

    /* ---- embedding: the whole vocabulary, or a range of it (tensor parallel) ----
     * Superseded by embedding_forward_general / embedding_backward_general (ABI 2.23): the host no longer
     * calls these four; a plugin built for ABI >= 2.23 may leave them NULL. */
    /* out (n,c) = table[ids[i]]; table (vocab,c); an id outside [0,vocab) is CT_ERR_INVALID. */
    ct_status (*embedding_forward)(ct_device *dev, float *out, const int32_t *ids, const float *table,
                                   int64_t n, int64_t c, int64_t vocab);
    /* dtable (vocab,c) += scatter of dout (n,c) by ids */
    ct_status (*embedding_backward)(ct_device *dev, float *dtable, const int32_t *ids, const float *dout,
                                    int64_t n, int64_t c, int64_t vocab);
    /* Optional. The table holds rows [begin, begin + rows) of the full vocabulary (begin >= 0).
     * out (n,c) = table[ids[i] - begin] where ids[i] is in that range, 0 elsewhere (any id is valid). */
    ct_status (*embedding_forward_range)(ct_device *dev, float *out, const int32_t *ids, const float *table,
                                         int64_t n, int64_t c, int64_t begin, int64_t rows);
    /* Optional. dtable (rows,c) += dout rows whose ids are in [begin, begin + rows) */
    ct_status (*embedding_backward_range)(ct_device *dev, float *dtable, const int32_t *ids, const float *dout,
                                          int64_t n, int64_t c, int64_t begin, int64_t rows);

    /* ---- norms and bias ---- */
    /* out (n,c) = x / rms(x) * w; rstd (n) saved for backward = 1/sqrt(mean(x^2) + eps) */
    ct_status (*rmsnorm_forward)(ct_device *dev, float *out, float *rstd, const float *x, const float *w,
                                 int64_t n, int64_t c, float eps);
    ct_status (*rmsnorm_backward_input)(ct_device *dev, float *dx, const float *dout, const float *x,
                                        const float *w, const float *rstd, int64_t n, int64_t c);
    ct_status (*rmsnorm_backward_weight)(ct_device *dev, float *dw, const float *dout, const float *x,
                                         const float *rstd, int64_t n, int64_t c);
    /* out (n,c) = (x - mean) * rstd * w + b; b may be NULL; mean, rstd (n) saved */
    ct_status (*layernorm_forward)(ct_device *dev, float *out, float *mean, float *rstd, const float *x,
                                   const float *w, const float *b, int64_t n, int64_t c, float eps);
    ct_status (*layernorm_backward_input)(ct_device *dev, float *dx, const float *dout, const float *x,
                                          const float *w, const float *mean, const float *rstd,
                                          int64_t n, int64_t c);
    /* db may be NULL */
    ct_status (*layernorm_backward_weight)(ct_device *dev, float *dw, float *db, const float *dout,
                                           const float *x, const float *mean, const float *rstd,
                                           int64_t n, int64_t c);
    /* out (n,c) = x + bias (c) broadcast over rows; out may alias x.  dbias (c) += column sums of dout */
    ct_status (*bias_forward)(ct_device *dev, float *out, const float *x, const float *bias, int64_t n, int64_t c);
    ct_status (*bias_backward)(ct_device *dev, float *dbias, const float *dout, int64_t n, int64_t c);

    /* ---- position and attention ---- */
    /* Rotary embedding on x (b,t,h,d), d even: each pair (x[2i], x[2i+1]) at position p (= t index)
     * rotates by angle p * theta^(-2i/d) (Llama's interleaved-pair convention). out may alias x.
     * Backward rotates by the negative angle: dx += R^T dout.
     * Superseded by rope_forward_general / rope_backward_general (ABI 2.23), as are rope_*_pos and
     * rope_freqs_*: the host no longer calls them; a plugin built for ABI >= 2.23 may leave them NULL. */
    ct_status (*rope_forward)(ct_device *dev, float *out, const float *x, int64_t b, int64_t t, int64_t h,
                              int64_t d, float theta);
    ct_status (*rope_backward)(ct_device *dev, float *dx, const float *dout, int64_t b, int64_t t,
                               int64_t h, int64_t d, float theta);
    /* Causal scaled-dot-product attention with grouped-query heads.
     * q (b,t,h,d); k, v (b,t,kvh,d), h % kvh == 0, query head i reads kv head i / (h/kvh);
     * out (b,t,h,d); lse (b,h,t) = logsumexp over keys of the scaled scores (scale 1/sqrt(d)),
     * saved for backward. Backward accumulates into dq (b,t,h,d), dk and dv (b,t,kvh,d). */
    ct_status (*attention_forward)(ct_device *dev, float *out, float *lse, const float *q, const float *k,
                                   const float *v, int64_t b, int64_t t, int64_t h, int64_t kvh,
                                   int64_t d);
    ct_status (*attention_backward)(ct_device *dev, float *dq, float *dk, float *dv, const float *dout,
                                    const float *q, const float *k, const float *v, const float *out,
                                    const float *lse, int64_t b, int64_t t, int64_t h, int64_t kvh,
                                    int64_t d);

    /* ---- activations ---- */
    /* out (n) = silu(a) * g;  backward: da += dout * g * silu'(a), dg += dout * silu(a) */
    ct_status (*swiglu_forward)(ct_device *dev, float *out, const float *a, const float *g, int64_t n);
    ct_status (*swiglu_backward)(ct_device *dev, float *da, float *dg, const float *dout, const float *a,
                                 const float *g, int64_t n);
    /* out (n) = gelu(x) with the tanh approximation (GPT-2);  dx += dout * gelu'(x) */
    ct_status (*gelu_forward)(ct_device *dev, float *out, const float *x, int64_t n);
    ct_status (*gelu_backward)(ct_device *dev, float *dx, const float *dout, const float *x, int64_t n);

    /* ---- loss: whole rows, or vocabulary-sharded rows merged by their log-sum-exp ---- */
    /* losses (n) = -log softmax(logits (n,v))[targets[i]], or 0 where targets[i] == ignore_index;
     * a target outside [0,v) that is not ignore_index is CT_ERR_INVALID.
     * Backward: dlogits (n,v) += dloss * (softmax(logits) - onehot(target)) on rows not ignored.
     * The backward, its _dev and its _lse form are superseded by cross_entropy_backward_general (ABI 2.23):
     * the host no longer calls them; a plugin built for ABI >= 2.23 may leave them NULL. */
    ct_status (*cross_entropy_forward)(ct_device *dev, float *losses, const float *logits,
                                       const int32_t *targets, int64_t n, int64_t v,
                                       int32_t ignore_index);
    ct_status (*cross_entropy_backward)(ct_device *dev, float *dlogits, const float *logits,
                                        const int32_t *targets, float dloss, int64_t n, int64_t v,
                                        int32_t ignore_index);
    /* Optional. cross_entropy_backward with dloss read from device memory (ONE f32) when the kernels run,
     * not passed by value: the loss scale of a replayed graph may change from step to step. */
    ct_status (*cross_entropy_backward_dev)(ct_device *dev, float *dlogits, const float *logits,
                                            const int32_t *targets, const float *dloss, int64_t n, int64_t v,
                                            int32_t ignore_index);
    /* Optional. logits (n,v) hold columns [begin, begin + v) of the full vocabulary. Per row i, stats (n,3) =
     * { m = max of the row, s = sum exp(logit - m), the target's logit when targets[i] - begin is in
     * [0, v), else 0 }. Rows whose target is ignore_index still get m and s (and 0). Targets are not checked.
     * v == 0 (an empty shard) writes { -inf, 0, 0 }, which drops out of the merge. */
    ct_status (*cross_entropy_stats)(ct_device *dev, float *stats, const float *logits, const int32_t *targets,
                                     int64_t n, int64_t v, int64_t begin, int32_t ignore_index);
    /* Optional. dlogits (n,v) += dloss * (exp(logits - lse[i]) - onehot(targets[i] - begin)) on rows whose target is
     * not ignore_index; lse (n) is the logsumexp of the FULL row (over every shard). */
    ct_status (*cross_entropy_backward_lse)(ct_device *dev, float *dlogits, const float *logits,
                                            const int32_t *targets, const float *lse, float dloss, int64_t n,
                                            int64_t v, int64_t begin, int32_t ignore_index);

    /* ---- optimizer ---- */
    /* One AdamW step on n elements, PyTorch's formula (decoupled weight decay, bias correction with
     * `step` counted from 1):  p -= lr*wd*p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
     * p -= lr * (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps). */
    ct_status (*adamw)(ct_device *dev, float *param, const float *grad, float *m, float *v, int64_t n,
                       float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step);

    /* ---- precision: bf16 and float8 ---- */
    /* Round to nearest even; NaN stays NaN. dst/src are bf16 bit patterns (uint16_t). */
    ct_status (*cast_f32_to_bf16)(ct_device *dev, uint16_t *dst, const float *src, int64_t n);
    ct_status (*cast_bf16_to_f32)(ct_device *dev, float *dst, const uint16_t *src, int64_t n);
    /* x (n) = f32(bf16(x)): the value a bf16 store would keep, in place. */
    ct_status (*round_bf16)(ct_device *dev, float *x, int64_t n);
    /* Optional. Groups: element i belongs to group i / group (group divides n; group == n: one tensor-wide
     * group). fmt is CT_F8_E4M3 or CT_F8_E5M2 (OCP FP8: e4m3 max 448, no inf; e5m2 max 57344).
     * amax (n / group) = max |src| of each group (NaN propagates). */
    ct_status (*amax)(ct_device *dev, float *amax, const float *src, int64_t n, int64_t group);
    /* Optional. dst (n) = fp8 bit patterns of saturate(round_nearest_even(src[i] * scale[i / group])):
     * finite values beyond the format's max become +-max, NaN stays NaN (e4m3: 0x7f/0xff). */
    ct_status (*quantize_fp8)(ct_device *dev, uint8_t *dst, const float *src, const float *scale, int64_t n,
                              int64_t group, ct_dtype fmt);
    /* Optional. dst (n) = value(src[i]) / scale[i / group]: the dequantised f32. */
    ct_status (*dequantize_fp8)(ct_device *dev, float *dst, const uint8_t *src, const float *scale, int64_t n,
                                int64_t group, ct_dtype fmt);
    /* Optional. Scaled fp8 matmul (a tensor-core fp8 GEMM with f32 accumulation):
     *   c (m,n) = alpha * A (m,k) @ B (n,k)^T + beta * c,  A = value(a) / *a_scale,  B = value(b) / *b_scale
     * a (m,k) and b (n,k) are fp8 bit patterns, row-major, both with k contiguous (the layout fp8 tensor
     * cores read); a_scale and b_scale point to ONE f32 each in device memory: the tensor-wide scales
     * quantize_fp8 was given (group == n). beta 0 ignores c's contents. The result is the f32 GEMM of the
     * dequantised operands up to summation order. A format pair or shape the device cannot run (e.g.
     * e5m2 x e5m2 on cuBLASLt, k not a multiple of 16, a GPU without fp8 tensor cores) is
     * CT_ERR_UNSUPPORTED with a message; the caller then emulates (dequantize + matmul). */
    ct_status (*matmul_fp8)(ct_device *dev, float *c, const uint8_t *a, const float *a_scale, ct_dtype a_fmt,
                            const uint8_t *b, const float *b_scale, ct_dtype b_fmt, int64_t m, int64_t n, int64_t k,
                            float alpha, float beta);
    /* Optional. matmul_fp8 with one scale per ROW of each operand (torchao's rowwise recipes): a_scale (m) and
     * b_scale (n) in device memory, A[i,:] = value(a[i,:]) / a_scale[i], B[j,:] = value(b[j,:]) /
     * b_scale[j]; otherwise as matmul_fp8 (cuBLASLt's outer-vector scaling on a GPU). */
    ct_status (*matmul_fp8_rows)(ct_device *dev, float *c, const uint8_t *a, const float *a_scale, ct_dtype a_fmt,
                                 const uint8_t *b, const float *b_scale, ct_dtype b_fmt, int64_t m, int64_t n,
                                 int64_t k, float alpha, float beta);

    /* ---- graph capture ---- */
    /* Optional. Graph capture (CUDA graphs), for the steady state of a training step. Between graph_begin and
     * graph_end the device RECORDS the work of every op instead of running it; graph_launch runs
     * the recorded work again, with whatever the buffers hold then, on the device's queue (async).
     * While capturing, an op that would wait for the device or move bytes between host and device
     * (copy to or from the host, sum, sum_squares, synchronize) fails with CT_ERR_INVALID, and
     * ops skip what they would read back: ids and targets are not checked (a bad one makes the
     * op a no-op instead of an error, so the host checks them before upload). A graph refers to
     * device addresses: the host keeps every buffer it uses alive and in place until graph_free;
     * memory an op takes and gives back internally (scratch) stays the graph's until graph_free.
     * graph_end ends the capture even when an op failed during it; it then returns that failure
     * (or CT_ERR_UNSUPPORTED when the device could not capture something) and *graph = NULL.
     * `ops` (may be NULL) receives the number of operations recorded. *graph is the caller's until
     * graph_free (before the device's destroy). */
    ct_status (*graph_begin)(ct_device *dev);
    ct_status (*graph_end)(ct_device *dev, ct_graph **graph, int64_t *ops);
    ct_status (*graph_launch)(ct_device *dev, ct_graph *graph);
    void (*graph_free)(ct_device *dev, ct_graph *graph);

    /* ---- ABI 2.1: elementwise ops for optimizers (optional: NULL = unsupported) ----
     * n elements each; `out` may alias any input. Results are what the same f32 expression in C gives
     * (sqrtf, copysign-free sign: -1, 0 or 1, NaN stays NaN). */
    /* out = alpha * x + beta * y */
    ct_status (*ew_axpby)(ct_device *dev, float *out, float alpha, const float *x, float beta, const float *y,
                          int64_t n);
    /* out = x * y */
    ct_status (*ew_mul)(ct_device *dev, float *out, const float *x, const float *y, int64_t n);
    /* out = x / (y + eps) */
    ct_status (*ew_div)(ct_device *dev, float *out, const float *x, const float *y, float eps, int64_t n);
    /* out = sqrt(x) */
    ct_status (*ew_sqrt)(ct_device *dev, float *out, const float *x, int64_t n);
    /* out = sign(x): -1, 0 or 1 */
    ct_status (*ew_sign)(ct_device *dev, float *out, const float *x, int64_t n);
    /* out = min(max(x, lo), hi) */
    ct_status (*ew_clamp)(ct_device *dev, float *out, const float *x, float lo, float hi, int64_t n);
    /* out = x > y ? 1 : 0 (a mask to multiply by) */
    ct_status (*ew_greater)(ct_device *dev, float *out, const float *x, const float *y, int64_t n);

    /* ---- ABI 2.3: positions given explicitly, attention by blocks (optional: NULL = unsupported) ----
     * What context parallel needs: a rank holds some token rows of each sequence (not a prefix), so
     * positions and the causal mask come from position arrays, and attention over the whole sequence
     * is computed one key block at a time and merged by log-sum-exp. pos, q_pos, k_pos are int32 in
     * device memory, any values >= 0 (not necessarily increasing). */
    /* rope_forward / rope_backward with row t at position pos[t] (t entries) instead of t. */
    ct_status (*rope_forward_pos)(ct_device *dev, float *out, const float *x, const int32_t *pos, int64_t b,
                                  int64_t t, int64_t h, int64_t d, float theta);
    ct_status (*rope_backward_pos)(ct_device *dev, float *dx, const float *dout, const int32_t *pos, int64_t b,
                                   int64_t t, int64_t h, int64_t d, float theta);
    /* Attention of a query block against a key block, grouped-query heads as attention_forward:
     * q (b,tq,h,d) at positions q_pos (tq); k, v (b,tk,kvh,d) at positions k_pos (tk). Key j is visible
     * to query i when k_pos[j] <= q_pos[i] (causal). out (b,tq,h,d) = softmax-weighted sum of the
     * visible keys' values (scale 1/sqrt(d)); lse (b,h,tq) = logsumexp of the visible scaled scores.
     * A query that sees no key of the block gets out 0 and lse -inf. With q_pos = k_pos = 0..t-1 it is
     * attention_forward. */
    ct_status (*attention_block_forward)(ct_device *dev, float *out, float *lse, const float *q, const float *k,
                                         const float *v, const int32_t *q_pos, const int32_t *k_pos, int64_t b,
                                         int64_t tq, int64_t tk, int64_t h, int64_t kvh, int64_t d);
    /* Merges a second block's partial result into the first: with l = logaddexp(lse, lse2),
     * out = out * exp(lse - l) + out2 * exp(lse2 - l) and lse = l, per (b, query, head); a side at -inf
     * drops out (both at -inf: out 0, lse -inf). out, out2 (b,t,h,d); lse, lse2 (b,h,t). */
    ct_status (*attention_merge)(ct_device *dev, float *out, float *lse, const float *out2, const float *lse2,
                                 int64_t b, int64_t t, int64_t h, int64_t d);
    /* The backward of one block, given the FINAL out and lse of the queries (over every key block,
     * after the merges): dq (b,tq,h,d), dk and dv (b,tk,kvh,d) += this block's share, the flash-attention
     * formula P = exp(s - lse), dS = P * (dout . v - rowsum(dout * out)). Summed over the blocks it is
     * attention_backward. Queries with lse -inf contribute nothing. */
    ct_status (*attention_block_backward)(ct_device *dev, float *dq, float *dk, float *dv, const float *dout,
                                          const float *q, const float *k, const float *v, const float *out,
                                          const float *lse, const int32_t *q_pos, const int32_t *k_pos, int64_t b,
                                          int64_t tq, int64_t tk, int64_t h, int64_t kvh, int64_t d);

    /* ---- ABI 2.4: rotary embedding with explicit frequencies (scaled RoPE) ---- */
    /* As rope_forward / rope_backward, but pair i (x[2i], x[2i+1]) at position p rotates by angle
     * p * inv_freq[i]: inv_freq (d/2 floats, device memory) is the model's table (Llama 3.1's "llama3"
     * frequency scaling, or plain theta^(-2i/d)). pos: int32 positions of the t rows in device memory,
     * or NULL for 0..t-1. The angle is formed in float32 as (float)p * inv_freq[i], as transformers
     * does, then its cosine and sine. out may alias x; backward accumulates dx += R^T dout. */
    ct_status (*rope_freqs_forward)(ct_device *dev, float *out, const float *x, const int32_t *pos,
                                    const float *inv_freq, int64_t b, int64_t t, int64_t h, int64_t d);
    ct_status (*rope_freqs_backward)(ct_device *dev, float *dx, const float *dout, const int32_t *pos,
                                     const float *inv_freq, int64_t b, int64_t t, int64_t h, int64_t d);

    /* ---- ABI 2.8: growable regions (optional: all three or none) ----
     * Address space reserved once and backed with memory only as far as the host asks, so a host
     * arena grows in place (no second block, no unused tail left in the first) and gives memory
     * back from its top: what a step holds is what it uses, from the first step on, and addresses
     * never move (a captured graph stays valid). CUDA's virtual memory management does this (as
     * PyTorch's expandable segments do); the CPU plugin reserves address space with mmap. */
    /* Reserves max_bytes of address space (64-byte aligned), nothing backed yet. *base is the
     * caller's until region_release. CT_ERR_UNSUPPORTED where the device cannot (the host then
     * allocates blocks with alloc). */
    ct_status (*region_reserve)(ct_device *dev, size_t max_bytes, void **base);
    /* Backs the region's first `bytes` (at most its max_bytes; rounded up to the device's
     * granularity) and gives back what was backed above; *backed gets the bytes now backed.
     * Content below both the old and the new size is kept. Before giving memory back it waits for
     * the work queued on the device. CT_ERR_NOMEM, with nothing changed, when the device is full. */
    ct_status (*region_resize)(ct_device *dev, void *base, size_t bytes, size_t *backed);
    /* Gives the region back, memory and address space (each region before destroy). */
    void (*region_release)(ct_device *dev, void *base);

    /* ---- ABI 2.9: copies beside the device's work (optional: all four or none) ----
     * For activation offload: the host moves what a unit saved for its backward to host memory
     * after the unit's forward and back before its backward, while other units compute. CUDA:
     * pinned memory and a second stream ordered against the device's with events; the CPU plugin
     * copies when the copy is waited for (the latest moment the contract allows). */
    /* 64-byte aligned host memory the device copies to and from at its link's full rate (CUDA:
     * page-locked). *out is the caller's until host_free (each block before destroy). The host may
     * not read or write it while a copy that touches it is in flight. */
    ct_status (*host_alloc)(ct_device *dev, size_t bytes, void **out);
    /* Waits for the copies in flight, then gives the block back. */
    void (*host_free)(ct_device *dev, void *p);
    /* Queues a copy of `bytes` on the device's copy queue, to run after every op queued on the
     * device before this call, and returns at once: CT_COPY_D2H (dst in a host_alloc block, src
     * device memory) or CT_COPY_H2D (the reverse). *ticket gets the copy's number (1, 2, ... in
     * call order). Until copy_wait(ticket), the copy may run at any moment: the caller queues no op
     * that writes its source or reads or writes its destination. Refused (CT_ERR_INVALID) while a
     * graph captures. */
    ct_status (*copy_async)(ct_device *dev, void *dst, const void *src, size_t bytes, ct_copy_kind kind,
                            uint64_t *ticket);
    /* Ops queued on the device after this call run after copy `ticket` and every copy before it
     * are done; the host does not wait (CUDA: cudaStreamWaitEvent). CT_ERR_INVALID for a ticket not
     * yet issued. synchronize waits for every copy queued before it too. */
    ct_status (*copy_wait)(ct_device *dev, uint64_t ticket);

    /* ---- ABI 2.10: AdamW with bf16 moments (optional) ----
     * adamw's step with m and v held in bf16 (torchtitan's optimizer.implementation
     * fused_opt_states_bf16): mv[i] is element i's moments, m's bf16 bits in the low 16 and v's in
     * the high 16, one 32-bit word per element, so a checkpoint or a new layout moves them with
     * their element. Each step widens them to f32, computes exactly as adamw does, and stores them
     * rounded to nearest even; param and grad stay f32. */
    ct_status (*adamw_bf16_moments)(ct_device *dev, float *param, const float *grad, uint32_t *mv, int64_t n,
                                    float lr, float beta1, float beta2, float eps, float weight_decay,
                                    int64_t step);

    /* ---- ABI 2.13: attention over packed documents (optional: both or neither) ----
     * attention_block_forward / attention_block_backward with a document id beside each position and
     * both given per batch row: q_pos and q_doc (b,tq), k_pos and k_doc (b,tk), int32 in device memory,
     * any values >= 0 (rows in any order, as context parallel's chunks come). Key j of batch row bi is
     * visible to query i when k_doc[bi,j] == q_doc[bi,i] and k_pos[bi,j] <= q_pos[bi,i] (block-causal: a
     * token sees the earlier tokens of its own document). Everything else is as the block ops: lse
     * (b,h,tq) is -inf (and out 0) for a query that sees no key, the results of several key blocks
     * merge with attention_merge, and the backward takes the FINAL out and lse. A device skips the key
     * tiles no query of a query tile can see (by position range and document range), so a sequence of
     * short documents costs less than a causal one. With every document id 0 and positions 0..t-1 in
     * each row it is attention_forward. */
    ct_status (*attention_doc_forward)(ct_device *dev, float *out, float *lse, const float *q, const float *k,
                                       const float *v, const int32_t *q_pos, const int32_t *k_pos,
                                       const int32_t *q_doc, const int32_t *k_doc, int64_t b, int64_t tq, int64_t tk,
                                       int64_t h, int64_t kvh, int64_t d);
    ct_status (*attention_doc_backward)(ct_device *dev, float *dq, float *dk, float *dv, const float *dout,
                                        const float *q, const float *k, const float *v, const float *out,
                                        const float *lse, const int32_t *q_pos, const int32_t *k_pos,
                                        const int32_t *q_doc, const int32_t *k_doc, int64_t b, int64_t tq,
                                        int64_t tk, int64_t h, int64_t kvh, int64_t d);

    /* ---- ABI 2.14: mixture of experts (optional: all or none) ----
     * Routing, dispatch and the experts' GEMMs of an MoE layer, all on the device: nothing is read
     * back to the host, so a step with MoE layers stays asynchronous and capturable. n tokens, e
     * experts, k experts per token (1 <= k <= e), d features; the n*k (token, slot) pairs are flat
     * index t*k + s. Indices are int32 in device memory. Ops are deterministic (no float atomics).
     * The layer: scores -> topk -> permute -> gather -> grouped_matmul (the experts' FFN, applied
     * per segment) -> combine. An index read from device memory outside its range is never read
     * through: the pair is skipped (an output row it would fill is zero). The host offers the ops
     * only when the table sets all twelve. */
    /* scores (n,e) = softmax over each row of logits (n,e) (func CT_MOE_SOFTMAX) or sigmoid of each
     * element (CT_MOE_SIGMOID). Backward from the saved scores: softmax dlogits += s * (ds - sum(ds * s))
     * per row, sigmoid dlogits += ds * s * (1 - s). */
    ct_status (*moe_scores_forward)(ct_device *dev, float *scores, const float *logits, int64_t n, int64_t e,
                                    int func);
    ct_status (*moe_scores_backward)(ct_device *dev, float *dlogits, const float *dscores, const float *scores,
                                     int64_t n, int64_t e, int func);
    /* Per row t of scores (n,e): idx (n,k) = the k experts with the largest scores[t,j] + bias[j], in
     * descending order of that sum; ties go to the LOWER expert index. bias (e) may be NULL (zero):
     * it changes only the choice (DeepSeek-V3's aux-loss-free balancing). Group-limited routing when
     * n_groups > 1: the e experts form n_groups groups of e / n_groups consecutive experts (n_groups
     * divides e); a group's score is the sum of its two best scores + bias (its one when it has one
     * expert); only the topk_groups best groups (ties: lower group) are eligible, and k must be at
     * most topk_groups * e / n_groups. n_groups 0 or 1: every expert is eligible (topk_groups ignored).
     * weights (n,k) = scores[t, idx[t,s]] (WITHOUT the bias), when normalize divided by their row's
     * sum + 1e-20, then multiplied by route_scale. Backward: dscores (n,e) += the gradient of weights
     * through that normalisation and scale (at the chosen experts only; the choice is constant). */
    ct_status (*moe_topk_forward)(ct_device *dev, int32_t *idx, float *weights, const float *scores,
                                  const float *bias, int64_t n, int64_t e, int64_t k, int64_t n_groups,
                                  int64_t topk_groups, int normalize, float route_scale);
    ct_status (*moe_topk_backward)(ct_device *dev, float *dscores, const float *dweights, const float *scores,
                                   const int32_t *idx, int64_t n, int64_t e, int64_t k, int normalize,
                                   float route_scale);
    /* A stable sort of the nk pairs (nk = n*k) by expert idx (nk): order (nk) = the flat pair index
     * of the j-th pair in expert order (pairs of one expert keep their flat order), inv (nk) with
     * inv[order[j]] = j, offsets (e+1): expert g's pairs are positions offsets[g] .. offsets[g+1]
     * (offsets[0] = 0). An index outside [0,e) is no expert's: such pairs sort after every expert,
     * at offsets[e] .. nk, in flat order (nothing reads them back to refuse them). */
    ct_status (*moe_permute)(ct_device *dev, int32_t *order, int32_t *inv, int32_t *offsets, const int32_t *idx,
                             int64_t nk, int64_t e);
    /* Dispatch: out (n*k,d) row j = x (n,d) row order[j] / k. Backward (no atomics): dx (n,d) row t
     * += sum over s < k, in order of s, of dout row inv[t*k + s]. */
    ct_status (*moe_gather_forward)(ct_device *dev, float *out, const float *x, const int32_t *order, int64_t n,
                                    int64_t k, int64_t d);
    ct_status (*moe_gather_backward)(ct_device *dev, float *dx, const float *dout, const int32_t *inv, int64_t n,
                                     int64_t k, int64_t d);
    /* The experts' linear layer over the permuted rows: w (e,o,i) holds expert g's (o,i) weight; rows
     * offsets[g] .. offsets[g+1] of x (m,i) are expert g's segment (offsets (e+1) in device memory,
     * non-decreasing, within [0,m]; offsets that are not: CT_ERR_INVALID where the device reads them
     * without a round trip (the CPU), elsewhere each segment clamped into [0,m]). y (m,o) segment
     * rows = x_seg w_g^T (overwritten; rows in no segment are not written). Backward: dx_seg += dy_seg w_g; dw_g += dy_seg^T x_seg (an expert
     * with no row adds nothing). */
    ct_status (*grouped_matmul_forward)(ct_device *dev, float *y, const float *x, const float *w,
                                        const int32_t *offsets, int64_t m, int64_t e, int64_t o, int64_t i);
    ct_status (*grouped_matmul_backward_input)(ct_device *dev, float *dx, const float *dy, const float *w,
                                               const int32_t *offsets, int64_t m, int64_t e, int64_t o,
                                               int64_t i);
    ct_status (*grouped_matmul_backward_weight)(ct_device *dev, float *dw, const float *dy, const float *x,
                                                const int32_t *offsets, int64_t m, int64_t e, int64_t o,
                                                int64_t i);
    /* Combine: out (n,d) row t = sum over s < k, in order of s, of weights[t*k + s] * y row
     * inv[t*k + s]; y is (n*k,d) in expert order. Backward: dy row inv[t*k+s] += weights[t*k+s] *
     * dout row t; dweights[t*k+s] += dot(dout row t, y row inv[t*k+s]). */
    ct_status (*moe_combine_forward)(ct_device *dev, float *out, const float *y, const float *weights,
                                     const int32_t *inv, int64_t n, int64_t k, int64_t d);
    ct_status (*moe_combine_backward)(ct_device *dev, float *dy, float *dweights, const float *dout,
                                      const float *y, const float *weights, const int32_t *inv, int64_t n,
                                      int64_t k, int64_t d);

    /* ---- ABI 2.23: one general op per family ----
     * Each covers every variant of its family above, which a plugin built for ABI >= 2.23 may leave NULL:
     * the host calls only these, and fills the narrow ops from them for any caller that still uses one
     * (and, for a plugin built for an older minor, these from its narrow ops). Optional; the host offers
     * them whenever the plugin has either form. */
    /* Embedding over rows [begin, begin + rows) of the vocabulary (begin >= 0): table (rows,c),
     * out (n,c) = table[ids[i] - begin] where ids[i] is in that range. An id outside it gives a zero row
     * when strict is 0 (a vocabulary shard), and is CT_ERR_INVALID when strict is 1, which needs begin 0
     * (the whole table). Backward: dtable (rows,c) += the dout rows whose ids are in range, in row order;
     * strict as the forward. embedding_forward/_backward are (0, vocab, strict 1), the _range ops strict 0. */
    ct_status (*embedding_forward_general)(ct_device *dev, float *out, const int32_t *ids, const float *table,
                                           int64_t n, int64_t c, int64_t begin, int64_t rows, int strict);
    ct_status (*embedding_backward_general)(ct_device *dev, float *dtable, const int32_t *ids, const float *dout,
                                            int64_t n, int64_t c, int64_t begin, int64_t rows, int strict);
    /* Rotary embedding of x (b,t,h,d): pos (t int32, device memory) the rows' positions, or NULL for
     * 0..t-1; inv_freq (d/2 f32, device memory) the frequency table, or NULL for theta^(-2i/d) formed on
     * the device as rope_forward forms it (theta is read only then). rope_forward, rope_forward_pos and
     * rope_freqs_forward are its three cases, bit for bit; backward accumulates dx += R^T dout. */
    ct_status (*rope_forward_general)(ct_device *dev, float *out, const float *x, const int32_t *pos,
                                      const float *inv_freq, float theta, int64_t b, int64_t t, int64_t h,
                                      int64_t d);
    ct_status (*rope_backward_general)(ct_device *dev, float *dx, const float *dout, const int32_t *pos,
                                       const float *inv_freq, float theta, int64_t b, int64_t t, int64_t h,
                                       int64_t d);
    /* Cross-entropy backward in every form: dlogits (n,v) += dloss * (softmax - onehot) on rows not ignored.
     * dloss is read from dloss_dev (ONE f32 in device memory, when the kernels run) when that is set, else
     * the value dloss. lse NULL: whole rows (begin 0, v the vocabulary), the softmax formed from the row,
     * a target outside [0,v) that is not ignore_index CT_ERR_INVALID: cross_entropy_backward (_dev).
     * lse (n) set: logits hold columns [begin, begin + v) of rows whose full logsumexp lse is, targets
     * not checked, v 0 a no-op: cross_entropy_backward_lse. Each case gives its narrow op's bits. */
    ct_status (*cross_entropy_backward_general)(ct_device *dev, float *dlogits, const float *logits,
                                                const int32_t *targets, const float *lse, float dloss,
                                                const float *dloss_dev, int64_t n, int64_t v, int64_t begin,
                                                int32_t ignore_index);
} ct_device_api;

#endif
