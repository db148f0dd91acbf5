/* cuda_device.h: the CUDA plugin's device handle and what its C files share.
 *
 * Files: device.c (entry, options, lifecycle, the API table), memory.c (the caching allocator,
 * copies, scratch and readbacks), blas.c (matmul through cuBLASLt, the peak-FLOP/s loop),
 * ops.c, ops_ext.c and ops_ew.c (the GPU's own limits and id checks, then the kernel launchers of
 * kernels.h; ops_ew.c has ABI 2.1's elementwise ops; the host checked the arguments first,
 * core/host/devcheck.c), stream.c (share_stream; the copy stream of ABI 2.9's
 * copy_async), graph.c (capture into CUDA graphs, ABI 1.5).
 *
 * Streams: every op runs on d->stream. Until share_stream (ABI 1.4) that is the legacy default
 * stream, ordered both ways with the NCCL plugin's blocking streams (no events needed, no
 * overlap either); after it, a non-blocking stream of the plugin's own, which the NCCL plugin
 * orders against with events once the host binds it (comm.h, bind_stream). copy_async's copies
 * run on a second stream of the plugin's, d->copy_stream, ordered against d->stream with events
 * both ways. See stream.c.
 */
#ifndef CTITAN_CUDA_DEVICE_H
#define CTITAN_CUDA_DEVICE_H

#include "ctitan/abi.h"
#include "ctitan/device.h"
#include "ctitan/host.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "kernels.h"

/* One cudaMalloc'd block of the cache. `held`: the serial of the graph that owns the block while
 * it is not in use (a scratch block given back during that graph's capture), 0 for none. */
typedef struct cuda_block {
    void *ptr;
    size_t size;
    int in_use;
    unsigned held;
} cuda_block;

/* The caching allocator: every block it got from cudaMalloc, and a map from a block's pointer
 * to its index (open addressing, linear probing, -1 = empty). */
typedef struct cuda_cache {
    cuda_block *blocks;
    size_t n, cap;
    int64_t *slots;
    size_t nslots;
    size_t reserved, in_use; /* bytes held from CUDA, bytes handed out */
    size_t mallocs;          /* cudaMalloc calls so far (steady state: no new ones) */
} cuda_cache;

struct cuda_plans; /* blas.c: cached cuBLASLt matmul plans */

#define CUDA_COPY_EVENTS 32 /* copy_async's ring of completion events (stream.c) */

typedef struct ct_device { /* the ABI's opaque ct_device */
    const ct_host *host;
    int device;
    int tf32;
    int matmul_bf16; /* set_matmul_dtype(CT_BF16): matmul operands rounded to bf16, bf16 tensor cores */
    int fp8_gemm;    /* compute capability >= 8.9: cuBLASLt runs fp8 GEMMs */
    char name[32]; /* "cuda:N" */
    int64_t memory_bytes;
    cudaStream_t stream;
    cuk_env env;
    cublasLtHandle_t lt;
    cublasHandle_t blas;
    void *workspace; /* cuBLASLt's */
    float *fp8_recip; /* device: the two dequantisation factors of the fp8 GEMM in flight (blas.c) */
    float *fp8_rows;  /* device: a row-scaled fp8 GEMM's factors, a's m then b's n (cache memory) */
    size_t fp8_rows_cap;
    size_t workspace_bytes;
    struct cuda_plans *plans;
    pthread_mutex_t mem_lock; /* the cache */
    pthread_mutex_t op_lock;  /* the flag word and the pinned readback buffer */
    cuda_cache cache;
    unsigned long long *flag; /* device: cuk_find_bad_id's answer */
    double *dsum;             /* device: cuk_sum's answer */
    void *pinned;             /* CUDA_PINNED_BYTES of page-locked host memory for readbacks */
    /* graph capture (graph.c): the serial of the graph being captured (0: not capturing), the
     * first failure of an op during the capture, the last serial handed out */
    unsigned capture;
    ct_status capture_failed;
    unsigned graph_serial;
    /* growable regions (region.c), under mem_lock */
    struct cuda_region **regions;
    int n_regions, cap_regions;
    /* copies beside the work (stream.c, ABI 2.9), under copy_lock: the copy stream and its events
     * (made by the first copy_async), and the tickets handed out so far. copy_before is recorded
     * on d->stream before each copy, which the copy stream waits for; copy_done[t % CUDA_COPY_EVENTS]
     * is recorded on the copy stream after copy t, and copy_wait(t) makes d->stream wait for it. */
    pthread_mutex_t copy_lock;
    cudaStream_t copy_stream; /* NULL until the first copy_async */
    cudaEvent_t copy_before;
    cudaEvent_t copy_done[CUDA_COPY_EVENTS];
    uint64_t copies_issued;
} cuda_device;

#define CUDA_PINNED_BYTES 64

/* ---- errors (device.c) ---- */
/* Reports "op: message" through the host and returns `status`. */
ct_status cuda_fail(cuda_device *d, ct_status status, const char *op, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A failed CUDA call: CT_ERR_NOMEM for an allocation failure, CT_ERR_INTERNAL otherwise, with the
 * call and CUDA's name and text of the error. Clears the (non-sticky) error. */
ct_status cuda_error(cuda_device *d, const char *op, const char *call, cudaError_t e);
ct_status cuda_blas_error(cuda_device *d, const char *op, const char *call, cublasStatus_t s);
/* Makes d's GPU current on the calling thread (a no-op when it already is). */
ct_status cuda_enter(cuda_device *d, const char *op);

/* ---- memory (memory.c) ---- */
ct_status cuda_cache_init(cuda_device *d);
void cuda_cache_release(cuda_device *d); /* every block back to CUDA (destroy) */
/* The cache's free blocks back to CUDA (not during a capture). mem_lock held. */
void cuda_cache_trim_locked(cuda_device *d);
/* ---- growable regions (region.c) ---- */
void cuda_regions_release(cuda_device *d); /* every region back to CUDA (destroy) */
ct_status cuda_alloc(ct_device *dev, size_t bytes, void **out);
void cuda_free(ct_device *dev, void *p);
ct_status cuda_copy(ct_device *dev, void *dst, const void *src, size_t bytes, ct_copy_kind kind);
ct_status cuda_zero(ct_device *dev, void *p, size_t bytes);
ct_status cuda_synchronize(ct_device *dev);
/* bytes (<= CUDA_PINNED_BYTES) from device memory `src` into `dst`, waiting for the stream.
 * The caller holds d->op_lock. */
ct_status cuda_readback(cuda_device *d, const char *op, void *dst, const void *src, size_t bytes);
/* destroy: the shared stream (if any) back to CUDA (stream.c) */
void cuda_stream_release(cuda_device *d);
/* destroy: waits for the copy stream, then gives it and its events back (stream.c) */
void cuda_copies_release(cuda_device *d);
/* synchronize's half for copies: waits for every copy queued so far (stream.c) */
ct_status cuda_copies_synchronize(cuda_device *d, const char *op);
/* graph_free: the blocks graph `serial` held go back to the cache */
void cuda_cache_unhold(cuda_device *d, unsigned serial);
/* CT_OK, or CT_ERR_INVALID "op: ... cannot be part of a graph" while a capture runs */
ct_status cuda_no_capture(cuda_device *d, const char *op, const char *what);

/* ---- dense algebra (blas.c) ---- */
ct_status cuda_blas_init(cuda_device *d);
void cuda_blas_release(cuda_device *d);
ct_status cuda_matmul(ct_device *dev, float *c, const float *a, const float *b, int64_t m, int64_t n,
                      int64_t k, int trans_a, int trans_b, float alpha, float beta);
ct_status cuda_measure_peak_flops(ct_device *dev, double *flops_per_s);

/* ---- ops (ops.c; ops_ext.c: float8 and tensor parallel): the GPU's checks, then launches ----
 * CUDA_OP(x) declares cuda_x with the exact type of ct_device_api's member x. */
#define CUDA_OP(name) __typeof__(*((ct_device_api *)0)->name) cuda_##name
CUDA_OP(axpy);
CUDA_OP(add);
CUDA_OP(scale);
CUDA_OP(sum);
CUDA_OP(sum_squares);
CUDA_OP(rmsnorm_forward);
CUDA_OP(rmsnorm_backward_input);
CUDA_OP(rmsnorm_backward_weight);
CUDA_OP(layernorm_forward);
CUDA_OP(layernorm_backward_input);
CUDA_OP(layernorm_backward_weight);
CUDA_OP(bias_forward);
CUDA_OP(bias_backward);
CUDA_OP(attention_forward);
CUDA_OP(attention_backward);
CUDA_OP(swiglu_forward);
CUDA_OP(swiglu_backward);
CUDA_OP(gelu_forward);
CUDA_OP(gelu_backward);
CUDA_OP(cross_entropy_forward);
CUDA_OP(adamw);
CUDA_OP(adamw_bf16_moments);
CUDA_OP(cast_f32_to_bf16);
CUDA_OP(cast_bf16_to_f32);
CUDA_OP(round_bf16);
CUDA_OP(amax);
CUDA_OP(quantize_fp8);
CUDA_OP(dequantize_fp8);
CUDA_OP(transpose);
CUDA_OP(cross_entropy_stats);
CUDA_OP(copy_2d);
/* ABI 1.4: blas.c (matmul_fp8, set_matmul_dtype), stream.c (share_stream) */
CUDA_OP(matmul_fp8);
CUDA_OP(set_matmul_dtype);
CUDA_OP(share_stream);
CUDA_OP(matmul_fp8_rows);
/* ABI 1.5: ops.c (sum_to_device), graph.c (the graph ops) */
CUDA_OP(sum_to_device);
CUDA_OP(graph_begin);
CUDA_OP(graph_end);
CUDA_OP(graph_launch);
CUDA_OP(graph_free);
/* ABI 2.1: ops_ew.c (the elementwise ops) */
CUDA_OP(ew_axpby);
CUDA_OP(ew_mul);
CUDA_OP(ew_div);
CUDA_OP(ew_sqrt);
CUDA_OP(ew_sign);
CUDA_OP(ew_clamp);
CUDA_OP(ew_greater);
/* ABI 2.3: ops.c (attention by blocks and its merge) */
CUDA_OP(attention_block_forward);
CUDA_OP(attention_merge);
CUDA_OP(attention_block_backward);
/* ABI 2.13: ops.c (attention over packed documents) */
CUDA_OP(attention_doc_forward);
CUDA_OP(attention_doc_backward);
CUDA_OP(region_reserve);
CUDA_OP(region_resize);
CUDA_OP(region_release);
/* ABI 2.9: stream.c (copies beside the work) */
CUDA_OP(host_alloc);
CUDA_OP(host_free);
CUDA_OP(copy_async);
CUDA_OP(copy_wait);
/* ABI 2.14: ops_moe.c (mixture of experts) */
CUDA_OP(moe_scores_forward);
CUDA_OP(moe_scores_backward);
CUDA_OP(moe_topk_forward);
CUDA_OP(moe_topk_backward);
CUDA_OP(moe_permute);
CUDA_OP(moe_gather_forward);
CUDA_OP(moe_gather_backward);
CUDA_OP(grouped_matmul_forward);
CUDA_OP(grouped_matmul_backward_input);
CUDA_OP(grouped_matmul_backward_weight);
CUDA_OP(moe_combine_forward);
CUDA_OP(moe_combine_backward);
/* ABI 2.23: ops.c (one op per family: embedding, rope, cross-entropy backward) */
CUDA_OP(embedding_forward_general);
CUDA_OP(embedding_backward_general);
CUDA_OP(rope_forward_general);
CUDA_OP(rope_backward_general);
CUDA_OP(cross_entropy_backward_general);

#endif
