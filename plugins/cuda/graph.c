/* graph.c: capture of the device's work into CUDA graphs, and their replay (ABI 1.5).
 *
 * graph_begin starts a stream capture of d->stream: from then on every kernel, memset, device
 * copy, cuBLAS and cuBLASLt call the ops queue is recorded into a graph instead of run. CUDA
 * cannot capture the legacy default stream, so the device first moves onto a stream of its own
 * (share_stream's). The capture is in relaxed mode: the allocator may still cudaMalloc a block it
 * has never had (the host captures the steady state, so that is rare), which global mode forbids.
 *
 * What a graph cannot contain is refused while d->capture is set, with CT_ERR_INVALID and a
 * message: copies to or from the host, readbacks (sum, sum_squares), synchronize, the fp8 GEMMs
 * (their scale buffers are not held for a graph). The id and target checks run their kernel but
 * skip the readback (the ops' kernels still skip their work on a bad id). The first failure is
 * kept in d->capture_failed (cuda_fail), and graph_end returns it.
 *
 * Memory: scratch blocks given back during the capture stay the graph's (memory.c, `held`) until
 * graph_free, which is the point at which they may be handed to other work: the graph exec is
 * destroyed there, and CUDA finishes a launch in flight before releasing it, while any later
 * user of the blocks is queued on the same stream after that launch.
 */
#include "cuda_device.h"

#include <stdlib.h>

typedef struct ct_graph { /* the ABI's opaque ct_graph */
    cudaGraphExec_t exec;
    unsigned serial;
} cuda_graph;

ct_status cuda_graph_begin(ct_device *dev)
{
    cuda_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    if (d->capture)
        return cuda_fail(d, CT_ERR_INVALID, "graph_begin", "a capture is already running");
    ct_stream *stream;
    ct_status st = cuda_share_stream(d, &stream); /* CUDA cannot capture the legacy stream */
    if (st != CT_OK)
        return st;
    st = cuda_enter(d, "graph_begin");
    if (st != CT_OK)
        return st;
    cudaError_t e = cudaStreamBeginCapture(d->stream, cudaStreamCaptureModeRelaxed);
    if (e != cudaSuccess)
        return cuda_error(d, "graph_begin", "cudaStreamBeginCapture", e);
    d->capture_failed = CT_OK;
    if (++d->graph_serial == 0) /* 0 means "not capturing" */
        d->graph_serial = 1;
    d->capture = d->graph_serial;
    return CT_OK;
}

ct_status cuda_graph_end(ct_device *dev, ct_graph **graph, int64_t *ops)
{
    cuda_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    if (!graph)
        return cuda_fail(d, CT_ERR_INVALID, "graph_end", "null output");
    *graph = NULL;
    if (ops)
        *ops = 0;
    if (!d->capture)
        return cuda_fail(d, CT_ERR_INVALID, "graph_end", "no capture is running (graph_begin)");
    ct_status st = cuda_enter(d, "graph_end");
    if (st != CT_OK)
        return st;
    unsigned serial = d->capture;
    ct_status failed = d->capture_failed;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(d->stream, &g);
    d->capture = 0; /* from here on, failures are this call's own */
    st = CT_OK;
    size_t nodes = 0;
    cudaGraphExec_t exec = NULL;
    cuda_graph *out = NULL;
    if (failed != CT_OK)
        st = failed; /* the failing op's message is the host's error already */
    else if (e != cudaSuccess)
        st = cuda_fail(d, CT_ERR_UNSUPPORTED, "graph_end", "the capture failed: cudaStreamEndCapture: %s (%s)",
                       cudaGetErrorName(e), cudaGetErrorString(e));
    else if ((e = cudaGraphGetNodes(g, NULL, &nodes)) != cudaSuccess)
        st = cuda_error(d, "graph_end", "cudaGraphGetNodes", e);
    else if ((e = cudaGraphInstantiate(&exec, g, 0)) != cudaSuccess)
        st = cuda_error(d, "graph_end", "cudaGraphInstantiate", e);
    else if (!(out = malloc(sizeof *out)))
        st = cuda_fail(d, CT_ERR_NOMEM, "graph_end", "out of host memory");
    if (g)
        (void)cudaGraphDestroy(g); /* the exec keeps what it needs */
    if (st != CT_OK) {
        if (exec)
            (void)cudaGraphExecDestroy(exec);
        (void)cudaGetLastError();
        cuda_cache_unhold(d, serial); /* nothing will launch what was recorded */
        return st;
    }
    *out = (cuda_graph){exec, serial};
    *graph = out;
    if (ops)
        *ops = (int64_t)nodes;
    return CT_OK;
}

ct_status cuda_graph_launch(ct_device *dev, ct_graph *graph)
{
    cuda_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    if (!graph)
        return cuda_fail(d, CT_ERR_INVALID, "graph_launch", "null graph");
    if (d->capture)
        return cuda_fail(d, CT_ERR_INVALID, "graph_launch", "cannot launch a graph while a capture is running");
    ct_status st = cuda_enter(d, "graph_launch");
    if (st != CT_OK)
        return st;
    cudaError_t e = cudaGraphLaunch(graph->exec, d->stream);
    return e == cudaSuccess ? CT_OK : cuda_error(d, "graph_launch", "cudaGraphLaunch", e);
}

void cuda_graph_free(ct_device *dev, ct_graph *graph)
{
    cuda_device *d = dev;
    cuda_graph *g = graph;
    if (!d || !g)
        return;
    if (cuda_enter(d, "graph_free") == CT_OK)
        (void)cudaGraphExecDestroy(g->exec);
    cuda_cache_unhold(d, g->serial);
    free(g);
}
