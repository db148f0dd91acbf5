/* device.c: the CUDA device plugin (ctitan-cuda.so): entry point, options, lifecycle, errors and
 * the ct_device_api table.
 *
 * The entry function touches no CUDA API, so `ctitan plugins` lists the plugin on a machine
 * without a GPU; create is what looks for one and returns CT_ERR_UNSUPPORTED ("no CUDA device is
 * visible") when there is none. Every CUDA, cuBLAS and cuBLASLt status is checked; a failure is
 * CT_ERR_INTERNAL (CT_ERR_NOMEM for memory) with the call and CUDA's text of the error.
 *
 * Options: `device` (which GPU; the default -1 takes the rank's index on its node modulo the
 * visible GPUs, as the NCCL plugin does, so the ranks of a node compute on the GPUs their
 * collectives run on; a single process gets GPU 0) and `tf32` (let f32 GEMMs use TF32 tensor
 * cores, default false: f32 GEMMs then stay within the conformance harness's f32 tolerances).
 *
 * Where the work is: memory.c (caching allocator), blas.c (matmul), ops.c / ops_ext.c / ops_ew.c
 * (argument checks), kernels_*.cu (the kernels), stream.c (the device's stream, shared with the comm plugin
 * through share_stream; and a second stream, made by the first copy_async, for ABI 2.9's copies
 * beside the device's work: pinned host memory, copies ordered against the device's stream with
 * events).
 */
#include "cuda_device.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- errors */

ct_status cuda_fail(cuda_device *d, ct_status status, const char *op, const char *fmt, ...)
{
    if (d && d->host && d->host->set_error) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        d->host->set_error(d->host, "%s: %s", op, msg);
    }
    if (d && d->capture && d->capture_failed == CT_OK) /* graph_end reports it */
        d->capture_failed = status;
    return status;
}

ct_status cuda_error(cuda_device *d, const char *op, const char *call, cudaError_t e)
{
    (void)cudaGetLastError(); /* clear it unless it is sticky (then every later call reports it) */
    ct_status st = e == cudaErrorMemoryAllocation ? CT_ERR_NOMEM : CT_ERR_INTERNAL;
    return cuda_fail(d, st, op, "%s failed: %s (%s)", call, cudaGetErrorName(e), cudaGetErrorString(e));
}

ct_status cuda_blas_error(cuda_device *d, const char *op, const char *call, cublasStatus_t s)
{
    ct_status st = s == CUBLAS_STATUS_ALLOC_FAILED ? CT_ERR_NOMEM : CT_ERR_INTERNAL;
    return cuda_fail(d, st, op, "%s failed: %s (status %d)", call, cublasGetStatusString(s), (int)s);
}

/* The GPU current on this thread, as far as this plugin knows: cudaSetDevice is per thread, and
 * an op may come from a thread that has not called it yet. */
static _Thread_local int cuda_current = -1;

ct_status cuda_enter(cuda_device *d, const char *op)
{
    if (cuda_current == d->device)
        return CT_OK;
    cudaError_t e = cudaSetDevice(d->device);
    if (e != cudaSuccess)
        return cuda_error(d, op, "cudaSetDevice", e);
    cuda_current = d->device;
    return CT_OK;
}

/* ---------------------------------------------------------------- lifecycle */

static const ct_option_spec cuda_options[] = {
    {sizeof(ct_option_spec), "device", CT_OPT_INT, "-1",
     "CUDA device index of this process; -1 = the rank's index on its node modulo the visible GPUs (0 alone)", NULL, NULL},
    {sizeof(ct_option_spec), "tf32", CT_OPT_BOOL, "false",
     "let f32 matmuls use TF32 tensor cores (faster, ~1e-3 relative error); false keeps f32 accuracy", NULL, NULL},
    {0},
};

/* This process's index among the ranks of its node (launchers' variables), 0 when alone. */
static int cuda_local_rank(void)
{
    static const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v)
            return atoi(v) > 0 ? atoi(v) : 0;
    }
    return 0;
}

/* Options, read before any CUDA call (an unset key with no default reads as the default). */
static ct_status cuda_read_options(const ct_host *host, int64_t *device, int *tf32)
{
    *device = -1;
    *tf32 = 0;
    if (!host)
        return CT_OK;
    ct_status st;
    if (host->opt_int && (st = host->opt_int(host, "device", device)) != CT_OK) {
        if (st != CT_ERR_INVALID)
            return st;
        *device = -1;
    }
    if (host->opt_bool && (st = host->opt_bool(host, "tf32", tf32)) != CT_OK) {
        if (st != CT_ERR_INVALID)
            return st;
        *tf32 = 0;
    }
    return CT_OK;
}

static void cuda_destroy(ct_device *dev);

/* The stream, the cuBLAS handles, the readback words. Called with d's GPU current. */
static ct_status cuda_open(cuda_device *d)
{
    cudaError_t e;
    ct_status st;
    d->stream = cudaStreamLegacy;
    if ((st = cuda_cache_init(d)) != CT_OK)
        return st;
    if ((e = cudaMalloc((void **)&d->flag, 256)) != cudaSuccess)
        return cuda_error(d, "create", "cudaMalloc (flag words)", e);
    d->dsum = (double *)((char *)d->flag + 128);
    if ((e = cudaMallocHost(&d->pinned, CUDA_PINNED_BYTES)) != cudaSuccess)
        return cuda_error(d, "create", "cudaMallocHost", e);
    if ((st = cuda_blas_init(d)) != CT_OK)
        return st;
    return CT_OK;
}

static ct_status cuda_create(const ct_host *host, ct_device **dev)
{
    if (!dev)
        return CT_ERR_INVALID;
    *dev = NULL;
    cuda_device unborn = {0}; /* reports errors before the device exists */
    unborn.host = host;
    int64_t device;
    int tf32;
    ct_status st = cuda_read_options(host, &device, &tf32);
    if (st != CT_OK)
        return st;
    if (device < -1 || device > 1023)
        return cuda_fail(&unborn, CT_ERR_INVALID, "create",
                         "option device = %lld, expected a GPU index >= 0 or -1 (the rank's index on its node)",
                         (long long)device);
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0) {
        (void)cudaGetLastError();
        return cuda_fail(&unborn, CT_ERR_UNSUPPORTED, "create",
                         "no CUDA device is visible (cudaGetDeviceCount: %s); use device.name: cpu",
                         e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    if (device == -1)
        device = cuda_local_rank() % count;
    if (device >= count)
        return cuda_fail(&unborn, CT_ERR_INVALID, "create", "option device = %lld, but %d CUDA device%s visible",
                         (long long)device, count, count == 1 ? " is" : "s are");
    struct cudaDeviceProp prop;
    if ((e = cudaSetDevice((int)device)) != cudaSuccess)
        return cuda_error(&unborn, "create", "cudaSetDevice", e);
    if ((e = cudaGetDeviceProperties(&prop, (int)device)) != cudaSuccess)
        return cuda_error(&unborn, "create", "cudaGetDeviceProperties", e);
    cuda_device *d = calloc(1, sizeof *d);
    if (!d)
        return cuda_fail(&unborn, CT_ERR_NOMEM, "create", "cannot allocate the device");
    d->host = host;
    d->device = (int)device;
    d->tf32 = tf32;
    d->fp8_gemm = prop.major * 10 + prop.minor >= 89;
    snprintf(d->name, sizeof d->name, "cuda:%d", d->device);
    d->memory_bytes = (int64_t)prop.totalGlobalMem;
    pthread_mutex_init(&d->mem_lock, NULL);
    pthread_mutex_init(&d->op_lock, NULL);
    pthread_mutex_init(&d->copy_lock, NULL);
    cuda_current = d->device;
    if ((st = cuda_open(d)) != CT_OK) {
        cuda_destroy(d);
        return st;
    }
    d->env = (cuk_env){d->stream, prop.multiProcessorCount, prop.sharedMemPerBlockOptin, d};
    if (host && host->log)
        host->log(host, CT_LOG_INFO, "%s: %s, %d SMs, %.1f GiB, compute capability %d.%d, TF32 %s", d->name,
                  prop.name, prop.multiProcessorCount, (double)prop.totalGlobalMem / (1 << 30), prop.major,
                  prop.minor, tf32 ? "on" : "off");
    *dev = d;
    return CT_OK;
}

/* Waits for the GPU, then returns everything to CUDA. The CUDA context itself stays: other
 * plugins of the process (NCCL) share it. */
static void cuda_destroy(ct_device *dev)
{
    cuda_device *d = dev;
    if (!d)
        return;
    if (cuda_enter(d, "destroy") == CT_OK)
        (void)cudaStreamSynchronize(d->stream);
    cuda_copies_release(d); /* waits for the copy stream first */
    cuda_stream_release(d);
    cuda_blas_release(d);
    cuda_regions_release(d);
    cuda_cache_release(d);
    if (d->flag)
        cudaFree(d->flag);
    if (d->pinned)
        cudaFreeHost(d->pinned);
    (void)cudaGetLastError();
    pthread_mutex_destroy(&d->mem_lock);
    pthread_mutex_destroy(&d->op_lock);
    pthread_mutex_destroy(&d->copy_lock);
    free(d);
}

static ct_status cuda_info(ct_device *dev, ct_device_info *out)
{
    cuda_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    if (!out)
        return cuda_fail(d, CT_ERR_INVALID, "info", "null output");
    if (out->struct_size == 0)
        out->struct_size = sizeof *out;
    if (CT_HAS_FIELD(out, ct_device_info, name))
        out->name = d->name;
    if (CT_HAS_FIELD(out, ct_device_info, threads))
        out->threads = d->env.sms;
    if (CT_HAS_FIELD(out, ct_device_info, memory_bytes))
        out->memory_bytes = d->memory_bytes;
    return CT_OK;
}

/* ---------------------------------------------------------------- entry */

static const ct_device_api cuda_api = {
    .struct_size = sizeof(ct_device_api),
    .create = cuda_create,
    .destroy = cuda_destroy,
    .info = cuda_info,
    .measure_peak_flops = cuda_measure_peak_flops,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .zero = cuda_zero,
    .synchronize = cuda_synchronize,
    .matmul = cuda_matmul,
    .axpy = cuda_axpy,
    .add = cuda_add,
    .scale = cuda_scale,
    .sum = cuda_sum,
    .sum_squares = cuda_sum_squares,
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .rmsnorm_backward_input = cuda_rmsnorm_backward_input,
    .rmsnorm_backward_weight = cuda_rmsnorm_backward_weight,
    .layernorm_forward = cuda_layernorm_forward,
    .layernorm_backward_input = cuda_layernorm_backward_input,
    .layernorm_backward_weight = cuda_layernorm_backward_weight,
    .bias_forward = cuda_bias_forward,
    .bias_backward = cuda_bias_backward,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .swiglu_forward = cuda_swiglu_forward,
    .swiglu_backward = cuda_swiglu_backward,
    .gelu_forward = cuda_gelu_forward,
    .gelu_backward = cuda_gelu_backward,
    .cross_entropy_forward = cuda_cross_entropy_forward,
    .adamw = cuda_adamw,
    .adamw_bf16_moments = cuda_adamw_bf16_moments,
    .cast_f32_to_bf16 = cuda_cast_f32_to_bf16,
    .cast_bf16_to_f32 = cuda_cast_bf16_to_f32,
    .round_bf16 = cuda_round_bf16,
    .amax = cuda_amax,
    .quantize_fp8 = cuda_quantize_fp8,
    .dequantize_fp8 = cuda_dequantize_fp8,
    .transpose = cuda_transpose,
    .cross_entropy_stats = cuda_cross_entropy_stats,
    .copy_2d = cuda_copy_2d,
    .matmul_fp8 = cuda_matmul_fp8,
    .set_matmul_dtype = cuda_set_matmul_dtype,
    .share_stream = cuda_share_stream,
    .matmul_fp8_rows = cuda_matmul_fp8_rows,
    .sum_to_device = cuda_sum_to_device,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_free = cuda_graph_free,
    .ew_axpby = cuda_ew_axpby,
    .ew_mul = cuda_ew_mul,
    .ew_div = cuda_ew_div,
    .ew_sqrt = cuda_ew_sqrt,
    .ew_sign = cuda_ew_sign,
    .ew_clamp = cuda_ew_clamp,
    .ew_greater = cuda_ew_greater,
    .attention_block_forward = cuda_attention_block_forward,
    .attention_merge = cuda_attention_merge,
    .attention_block_backward = cuda_attention_block_backward,
    .attention_doc_forward = cuda_attention_doc_forward,
    .attention_doc_backward = cuda_attention_doc_backward,
    .region_reserve = cuda_region_reserve,
    .region_resize = cuda_region_resize,
    .region_release = cuda_region_release,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .copy_async = cuda_copy_async,
    .copy_wait = cuda_copy_wait,
    .moe_scores_forward = cuda_moe_scores_forward,
    .moe_scores_backward = cuda_moe_scores_backward,
    .moe_topk_forward = cuda_moe_topk_forward,
    .moe_topk_backward = cuda_moe_topk_backward,
    .moe_permute = cuda_moe_permute,
    .moe_gather_forward = cuda_moe_gather_forward,
    .moe_gather_backward = cuda_moe_gather_backward,
    .grouped_matmul_forward = cuda_grouped_matmul_forward,
    .grouped_matmul_backward_input = cuda_grouped_matmul_backward_input,
    .grouped_matmul_backward_weight = cuda_grouped_matmul_backward_weight,
    .moe_combine_forward = cuda_moe_combine_forward,
    .moe_combine_backward = cuda_moe_combine_backward,
    /* ABI 2.23: one op per family; the narrow ops it supersedes stay NULL (the host derives them) */
    .embedding_forward_general = cuda_embedding_forward_general,
    .embedding_backward_general = cuda_embedding_backward_general,
    .rope_forward_general = cuda_rope_forward_general,
    .rope_backward_general = cuda_rope_backward_general,
    .cross_entropy_backward_general = cuda_cross_entropy_backward_general,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info)
{
    (void)host;
    if (!info || !CT_HAS_FIELD(info, ct_plugin_info, api))
        return CT_ERR_INVALID;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_DEVICE;
    info->name = "cuda";
    info->description = "CUDA device: cuBLASLt f32 GEMMs, fused flash attention, deterministic kernels, caching allocator";
    info->options = cuda_options;
    info->api = &cuda_api;
    return CT_OK;
}
