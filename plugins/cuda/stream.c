/* stream.c: the CUDA plugin's stream, and share_stream (ABI 1.4), which hands it to other plugins.
 *
 * Every op, copy, memset, readback, kernel, cuBLAS and cuBLASLt call runs on d->stream (cuBLAS
 * through cublasSetStream, cuBLASLt and the kernels through d->stream / d->env.stream per call),
 * so the plugin's own work is always in order and a scratch block or a freed block is only ever
 * reused by work queued after its last user.
 *
 * Until share_stream, d->stream is the legacy default stream: it is ordered both ways with every
 * blocking stream of the process, so the NCCL plugin (blocking streams) needs no events, but
 * compute and communication never overlap. share_stream moves the device onto a non-blocking
 * stream of its own and returns it: from then on the legacy stream and blocking streams no longer
 * order anything against the device's work, and whoever touches device buffers on another stream
 * orders itself with events (the NCCL plugin after bind_stream: an event recorded on this stream
 * before each collective, and this stream made to wait for the collective's event in wait()).
 * The host must then also wait for a collective before it frees a buffer the collective uses:
 * the allocator hands a freed block to the next work on this stream, not to the comm's.
 *
 * share_stream is a setup call: it swaps the stream that unlocked ops read, so no other thread
 * may run ops on the device while it runs. It is idempotent (a second call returns the same
 * stream), and destroy gives the stream back (cuda_stream_release).
 */
#include "cuda_device.h"

ct_status cuda_share_stream(ct_device *dev, ct_stream **stream)
{
    cuda_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    if (!stream)
        return cuda_fail(d, CT_ERR_INVALID, "share_stream", "null output");
    *stream = NULL;
    ct_status st = cuda_enter(d, "share_stream");
    if (st != CT_OK)
        return st;
    /* op_lock: cuBLAS's handle (blas.c calls it under this lock) and the readbacks' stream */
    pthread_mutex_lock(&d->op_lock);
    if (d->stream != cudaStreamLegacy) {
        *stream = (ct_stream *)d->stream;
        goto out;
    }
    /* Everything queued so far finishes on the legacy stream, so the new stream starts with no
     * work behind it that it is not ordered after (scratch blocks in flight included). */
    cudaError_t e = cudaStreamSynchronize(cudaStreamLegacy);
    if (e != cudaSuccess) {
        st = cuda_error(d, "share_stream", "cudaStreamSynchronize (legacy stream)", e);
        goto out;
    }
    cudaStream_t s;
    if ((e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess) {
        st = cuda_error(d, "share_stream", "cudaStreamCreateWithFlags (non-blocking)", e);
        goto out;
    }
    cublasStatus_t bs = cublasSetStream(d->blas, s);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        (void)cudaStreamDestroy(s);
        st = cuda_blas_error(d, "share_stream", "cublasSetStream", bs);
        goto out;
    }
    d->stream = s;
    d->env.stream = s;
    *stream = (ct_stream *)s; /* the ABI's ct_stream is a cudaStream_t here */
    if (d->host && d->host->log)
        d->host->log(d->host, CT_LOG_DEBUG, "%s: computing on a shared non-blocking stream", d->name);
out:
    pthread_mutex_unlock(&d->op_lock);
    return st;
}

/* destroy, after it synchronized d->stream: back to the legacy stream, and the shared stream (if
 * share_stream made one) back to CUDA. */
void cuda_stream_release(cuda_device *d)
{
    if (d->stream == cudaStreamLegacy || !d->stream)
        return;
    cudaStream_t s = d->stream;
    if (d->blas)
        (void)cublasSetStream(d->blas, cudaStreamLegacy);
    d->stream = cudaStreamLegacy;
    d->env.stream = cudaStreamLegacy;
    (void)cudaStreamDestroy(s);
}
