/* stream.c: the CUDA plugin's streams: the device's stream and share_stream (ABI 1.4), which
 * hands it to other plugins; the copy stream of copy_async (ABI 2.9).
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
 *
 * Copies beside the work (ABI 2.9, for activation offload): copy_async queues its copy on a
 * second stream, d->copy_stream, non-blocking so that neither the legacy stream nor the NCCL
 * plugin's blocking streams wait for it or make it wait: it overlaps the device's work and is
 * ordered against d->stream (whichever it is at the call) by events alone. Before each copy an
 * event recorded on d->stream, which the copy stream waits for: the copy runs after every op
 * queued before it. After it, event t % CUDA_COPY_EVENTS of a ring (t: the copy's ticket), which
 * copy_wait(t) makes d->stream wait for (cudaStreamWaitEvent: the host does not wait). When a
 * later ticket has reused the slot, d->stream waits for that later copy instead, which is still
 * correct (the copy stream runs its copies in order), only later. synchronize and host_free wait
 * for the copy stream; destroy waits for it, then gives it and its events back.
 *
 * The caller keeps a copy's buffers untouched until copy_wait: the allocator orders block reuse
 * on d->stream alone, so a device block a copy reads or writes is freed after copy_wait, not
 * before (then whatever later gets it is queued after the wait). Graphs: copy_async is refused
 * while a capture runs (the copy would run at every replay); copy_wait during a capture waits on
 * the host for the copy stream instead of queuing the wait (the captured work, which runs at
 * graph_launch, is then after the copy, and the graph holds no event from outside the capture).
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

/* ---------------------------------------------------------------- copies beside the work (ABI 2.9) */

/* Page-locked memory: copies to and from it are DMA at the link's rate, and asynchronous (from
 * pageable memory CUDA stages them on the host). cudaMallocHost's blocks are page aligned. */
ct_status cuda_host_alloc(ct_device *dev, size_t bytes, void **out)
{
    cuda_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    if (!out)
        return cuda_fail(d, CT_ERR_INVALID, "host_alloc", "null output");
    *out = NULL;
    ct_status st = cuda_enter(d, "host_alloc");
    if (st != CT_OK)
        return st;
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
    if (e != cudaSuccess)
        return cuda_error(d, "host_alloc", "cudaMallocHost", e);
    *out = p;
    return CT_OK;
}

void cuda_host_free(ct_device *dev, void *p)
{
    cuda_device *d = dev;
    if (!p)
        return;
    if (d && cuda_enter(d, "host_free") == CT_OK)
        (void)cuda_copies_synchronize(d, "host_free"); /* a copy in flight may still use the block */
    cudaError_t e = cudaFreeHost(p);
    if (e != cudaSuccess)
        (void)cuda_error(d, "host_free", "cudaFreeHost", e);
}

ct_status cuda_copies_synchronize(cuda_device *d, const char *op)
{
    pthread_mutex_lock(&d->copy_lock);
    cudaStream_t s = d->copy_stream; /* once made, it stays until destroy */
    pthread_mutex_unlock(&d->copy_lock);
    if (!s)
        return CT_OK;
    cudaError_t e = cudaStreamSynchronize(s);
    return e == cudaSuccess ? CT_OK : cuda_error(d, op, "cudaStreamSynchronize (copy stream)", e);
}

/* The copy stream's events back to CUDA (those that exist). */
static void copies_destroy_events(cuda_device *d)
{
    if (d->copy_before)
        (void)cudaEventDestroy(d->copy_before);
    d->copy_before = NULL;
    for (int i = 0; i < CUDA_COPY_EVENTS; i++) {
        if (d->copy_done[i])
            (void)cudaEventDestroy(d->copy_done[i]);
        d->copy_done[i] = NULL;
    }
}

/* The copy stream and its events, made by the first copy_async. copy_lock held, d's GPU current. */
static ct_status copies_open(cuda_device *d)
{
    if (d->copy_stream)
        return CT_OK;
    cudaEvent_t ev;
    cudaError_t e;
    if ((e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) != cudaSuccess)
        goto fail_event;
    d->copy_before = ev;
    for (int i = 0; i < CUDA_COPY_EVENTS; i++) {
        if ((e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) != cudaSuccess)
            goto fail_event;
        d->copy_done[i] = ev;
    }
    cudaStream_t s;
    if ((e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess) {
        copies_destroy_events(d);
        return cuda_error(d, "copy_async", "cudaStreamCreateWithFlags (copy stream, non-blocking)", e);
    }
    d->copy_stream = s;
    return CT_OK;
fail_event:
    copies_destroy_events(d);
    return cuda_error(d, "copy_async", "cudaEventCreateWithFlags (disable timing)", e);
}

void cuda_copies_release(cuda_device *d)
{
    if (d->copy_stream) {
        (void)cudaStreamSynchronize(d->copy_stream);
        (void)cudaStreamDestroy(d->copy_stream);
        d->copy_stream = NULL;
    }
    copies_destroy_events(d);
}

/* The copy behind the ops queued so far, then its completion event. copy_lock held. */
static ct_status copies_queue(cuda_device *d, void *dst, const void *src, size_t bytes, ct_copy_kind kind,
                              uint64_t t)
{
    cudaError_t e;
    if ((e = cudaEventRecord(d->copy_before, d->stream)) != cudaSuccess)
        return cuda_error(d, "copy_async", "cudaEventRecord (the device's stream)", e);
    if ((e = cudaStreamWaitEvent(d->copy_stream, d->copy_before, 0)) != cudaSuccess)
        return cuda_error(d, "copy_async", "cudaStreamWaitEvent (copy stream)", e);
    if (bytes) {
        enum cudaMemcpyKind k = kind == CT_COPY_H2D ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
        if ((e = cudaMemcpyAsync(dst, src, bytes, k, d->copy_stream)) != cudaSuccess)
            return cuda_error(d, "copy_async", kind == CT_COPY_H2D ? "cudaMemcpyAsync (host to device, copy stream)"
                                                                   : "cudaMemcpyAsync (device to host, copy stream)",
                              e);
    }
    if ((e = cudaEventRecord(d->copy_done[t % CUDA_COPY_EVENTS], d->copy_stream)) != cudaSuccess)
        return cuda_error(d, "copy_async", "cudaEventRecord (copy stream)", e);
    return CT_OK;
}

ct_status cuda_copy_async(ct_device *dev, void *dst, const void *src, size_t bytes, ct_copy_kind kind,
                          uint64_t *ticket)
{
    cuda_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    if (!ticket)
        return cuda_fail(d, CT_ERR_INVALID, "copy_async", "null ticket");
    *ticket = 0;
    if (kind != CT_COPY_H2D && kind != CT_COPY_D2H)
        return cuda_fail(d, CT_ERR_INVALID, "copy_async", "copy kind %d, expected CT_COPY_H2D or CT_COPY_D2H",
                         (int)kind);
    if (bytes && (!dst || !src))
        return cuda_fail(d, CT_ERR_INVALID, "copy_async", "null pointer");
    ct_status st = cuda_no_capture(d, "copy_async", "a copy beside the device's work");
    if (st != CT_OK)
        return st;
    if ((st = cuda_enter(d, "copy_async")) != CT_OK)
        return st;
    pthread_mutex_lock(&d->copy_lock);
    uint64_t t = d->copies_issued + 1;
    if ((st = copies_open(d)) == CT_OK && (st = copies_queue(d, dst, src, bytes, kind, t)) == CT_OK) {
        d->copies_issued = t;
        *ticket = t;
    }
    pthread_mutex_unlock(&d->copy_lock);
    return st;
}

ct_status cuda_copy_wait(ct_device *dev, uint64_t ticket)
{
    cuda_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    /* the lock orders this after the copy_async that issued the ticket (and made the stream and
     * its events, which stay until destroy); CUDA's calls need no lock */
    pthread_mutex_lock(&d->copy_lock);
    uint64_t issued = d->copies_issued;
    pthread_mutex_unlock(&d->copy_lock);
    if (ticket > issued)
        return cuda_fail(d, CT_ERR_INVALID, "copy_wait", "ticket %llu not issued (%llu so far)",
                         (unsigned long long)ticket, (unsigned long long)issued);
    if (ticket == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "copy_wait");
    if (st != CT_OK)
        return st;
    if (d->capture) { /* the host waits (see the top of the file) */
        cudaError_t e = cudaStreamSynchronize(d->copy_stream);
        return e == cudaSuccess ? CT_OK : cuda_error(d, "copy_wait", "cudaStreamSynchronize (copy stream)", e);
    }
    cudaError_t e = cudaStreamWaitEvent(d->stream, d->copy_done[ticket % CUDA_COPY_EVENTS], 0);
    return e == cudaSuccess ? CT_OK : cuda_error(d, "copy_wait", "cudaStreamWaitEvent (the device's stream)", e);
}
