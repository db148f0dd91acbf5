/* emu_graphs.cpp: stream capture and CUDA graphs for tests/cuda_emu, with the runtime's signatures
 * and rules, so that the CUDA plugin can capture a training step and replay it here.
 *
 * Every operation queued to a stream goes through emu_enqueue (cuda_emu.h). While a stream
 * captures, its operations are checked at the call as they would be if they ran (the same
 * refusals) and recorded with their arguments as at the call: a kernel's by value, host scalars
 * (alpha, beta) read, cuBLASLt's descriptor and layouts copied, device pointers as pointers. The
 * graph is the recorded operations in order; cudaGraphLaunch runs them in order, each checked
 * again, and stops at the first that fails. Operations on other streams run as without a capture.
 *
 * As in CUDA: the legacy stream (cudaStreamLegacy, or 0) cannot capture; while a stream captures,
 * synchronising it, cudaFree and cudaFreeHost (which synchronise the device), cudaMalloc in a
 * Global capture (or a ThreadLocal one on its thread; Relaxed allows it), and waiting for or
 * timing an event recorded into a capture (cudaErrorCapturedEvent, until a launch records it) fail
 * and invalidate the capture, as does any refused operation on the capturing stream; using the
 * legacy stream while a blocking stream (cudaStreamDefault) captures is
 * cudaErrorStreamCaptureImplicit and invalidates it too. An invalidated capture refuses every
 * further operation on its stream and ends with a NULL graph and cudaErrorStreamCaptureInvalidated.
 * A Global or ThreadLocal capture ends on the thread that began it.
 * Stricter than CUDA: a copy to or from host memory on the capturing stream is refused (CUDA would
 * capture it from pinned memory; the plugin must not queue one into a graph), and a graph launch
 * cannot be captured (no child graphs). One capture at a time in the process: beginning a second
 * while one is active is cudaErrorIllegalState. cudaGraphInstantiate takes no flags. A graph or
 * exec never destroyed shows as a leak under LeakSanitizer. For tests, CUDA_EMU_CAPTURE_FAIL_AT=N
 * refuses the Nth operation of a capture (cudaErrorStreamCaptureUnsupported), as CUDA refuses an
 * operation it cannot capture. */
#include "cuda_emu.h"
#include "emu_internal.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

struct emu_graph_node {
    const char *kind; /* the call that queued it, for messages */
    std::function<cudaError_t(bool run)> op;
};
struct emu_graph {
    std::vector<emu_graph_node> nodes;
};
/* A copy of the graph's operations: the graph may be destroyed once instantiated. */
struct emu_graph_exec {
    std::vector<emu_graph_node> nodes;
};

/* The capture in progress; stream is null when there is none. */
struct Capture {
    cudaStream_t stream = nullptr;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    std::thread::id thread; /* the one that began it (ThreadLocal and Global captures end there) */
    bool blocking = false;  /* created with cudaStreamDefault: the legacy stream would wait for it */
    bool invalidated = false;
    std::string why; /* the first reason it was invalidated */
    std::vector<emu_graph_node> nodes;
};

static std::mutex capture_lock;
static Capture cap;

static bool is_legacy(cudaStream_t s)
{
    return s == nullptr || s == cudaStreamLegacy;
}

static const char *mode_name(cudaStreamCaptureMode mode)
{
    return mode == cudaStreamCaptureModeGlobal        ? "Global"
           : mode == cudaStreamCaptureModeThreadLocal ? "ThreadLocal"
                                                      : "Relaxed";
}

/* With capture_lock held. The recorded operations go: the capture can only end without a graph. */
static void invalidate(const std::string &why)
{
    if (!cap.stream || cap.invalidated)
        return;
    cap.invalidated = true;
    cap.why = why;
    cap.nodes.clear();
}

cudaError_t emu_enqueue(cudaStream_t s, const char *kind, std::function<cudaError_t(bool run)> op)
{
    {
        std::lock_guard<std::mutex> hold(capture_lock);
        if (cap.stream && s == cap.stream) {
            if (cap.invalidated)
                return emu_fail(cudaErrorStreamCaptureInvalidated,
                                "%s on stream %p, whose capture was invalidated (%s): end the capture first", kind,
                                (void *)s, cap.why.c_str());
            cudaError_t e = op(false);
            if (e != cudaSuccess) {
                invalidate(std::string(kind) + " refused during the capture");
                return e;
            }
            const char *fail_at = getenv("CUDA_EMU_CAPTURE_FAIL_AT"); /* tests: an operation CUDA cannot capture */
            size_t index = cap.nodes.size() + 1;
            if (fail_at && (size_t)atol(fail_at) == index) {
                invalidate(std::string(kind) + " refused by CUDA_EMU_CAPTURE_FAIL_AT");
                return emu_fail(cudaErrorStreamCaptureUnsupported,
                                "%s: operation %zu of the capture refused (CUDA_EMU_CAPTURE_FAIL_AT)", kind, index);
            }
            cap.nodes.push_back(emu_graph_node{kind, std::move(op)});
            return cudaSuccess;
        }
        if (cap.stream && cap.blocking && is_legacy(s)) {
            invalidate(std::string(kind) + " on the legacy stream");
            return emu_fail(cudaErrorStreamCaptureImplicit,
                            "%s on the legacy stream while blocking stream %p captures (the legacy stream would "
                            "wait for the capture)",
                            kind, (void *)cap.stream);
        }
    }
    return op(true);
}

bool emu_stream_capturing(cudaStream_t s)
{
    std::lock_guard<std::mutex> hold(capture_lock);
    return cap.stream && s == cap.stream;
}

cudaError_t emu_capture_forbid(const char *what, bool any_mode)
{
    std::lock_guard<std::mutex> hold(capture_lock);
    if (!cap.stream)
        return cudaSuccess;
    if (!any_mode && cap.mode != cudaStreamCaptureModeGlobal &&
        !(cap.mode == cudaStreamCaptureModeThreadLocal && cap.thread == std::this_thread::get_id()))
        return cudaSuccess;
    invalidate(std::string(what) + " during the capture");
    if (any_mode)
        return emu_fail(cudaErrorStreamCaptureUnsupported, "%s while stream %p captures (it synchronises the device)",
                        what, (void *)cap.stream);
    return emu_fail(cudaErrorStreamCaptureUnsupported, "%s while stream %p captures in %s mode", what,
                    (void *)cap.stream, mode_name(cap.mode));
}

void emu_capture_invalidate(const char *why)
{
    std::lock_guard<std::mutex> hold(capture_lock);
    invalidate(std::string(why) + " during the capture");
}

extern "C" cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    if (is_legacy(s))
        return emu_fail(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture of the legacy stream (CUDA cannot "
                                                           "capture it)");
    unsigned flags;
    if (!emu_stream_live(s, &flags)) /* before capture_lock: see cudaStreamDestroy */
        return emu_fail(cudaErrorInvalidResourceHandle, "cudaStreamBeginCapture of %p, which is not a live stream",
                        (void *)s);
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return emu_fail(cudaErrorInvalidValue, "cudaStreamBeginCapture with mode %d", (int)mode);
    std::lock_guard<std::mutex> hold(capture_lock);
    if (cap.stream == s)
        return emu_fail(cudaErrorIllegalState, "cudaStreamBeginCapture of stream %p, which already captures",
                        (void *)s);
    if (cap.stream)
        return emu_fail(cudaErrorIllegalState,
                        "cudaStreamBeginCapture of stream %p while stream %p captures (one capture at a time here)",
                        (void *)s, (void *)cap.stream);
    cap = Capture();
    cap.stream = s;
    cap.mode = mode;
    cap.thread = std::this_thread::get_id();
    cap.blocking = !(flags & cudaStreamNonBlocking);
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    if (!graph)
        return emu_fail(cudaErrorInvalidValue, "cudaStreamEndCapture with a null output");
    std::lock_guard<std::mutex> hold(capture_lock);
    if (!cap.stream || s != cap.stream)
        return emu_fail(cudaErrorIllegalState, "cudaStreamEndCapture of stream %p, which does not capture",
                        (void *)s);
    if (cap.mode != cudaStreamCaptureModeRelaxed && cap.thread != std::this_thread::get_id())
        return emu_fail(cudaErrorStreamCaptureWrongThread,
                        "cudaStreamEndCapture of a %s capture from another thread than the one that began it",
                        mode_name(cap.mode));
    Capture done = std::move(cap);
    cap = Capture();
    if (done.invalidated) {
        *graph = nullptr;
        return emu_fail(cudaErrorStreamCaptureInvalidated, "cudaStreamEndCapture of stream %p: the capture was "
                                                           "invalidated (%s)", (void *)s, done.why.c_str());
    }
    *graph = new emu_graph{std::move(done.nodes)};
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status)
{
    if (!status)
        return emu_fail(cudaErrorInvalidValue, "cudaStreamIsCapturing with a null output");
    unsigned flags;
    if (!is_legacy(s) && !emu_stream_live(s, &flags))
        return emu_fail(cudaErrorInvalidResourceHandle, "cudaStreamIsCapturing of %p, which is not a live stream",
                        (void *)s);
    std::lock_guard<std::mutex> hold(capture_lock);
    if (cap.stream && cap.blocking && is_legacy(s)) /* the one use of the legacy stream that does not invalidate */
        return emu_fail(cudaErrorStreamCaptureImplicit,
                        "cudaStreamIsCapturing of the legacy stream while blocking stream %p captures",
                        (void *)cap.stream);
    *status = !cap.stream || s != cap.stream ? cudaStreamCaptureStatusNone
              : cap.invalidated              ? cudaStreamCaptureStatusInvalidated
                                             : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *numNodes)
{
    if (!g || !numNodes)
        return emu_fail(cudaErrorInvalidValue, "cudaGraphGetNodes with a null %s", g ? "count" : "graph");
    size_t n = g->nodes.size();
    if (!nodes) {
        *numNodes = n;
        return cudaSuccess;
    }
    /* CUDA fills *numNodes entries, NULL past the graph's nodes, and says how many it filled */
    size_t got = *numNodes < n ? *numNodes : n;
    for (size_t i = 0; i < *numNodes; i++)
        nodes[i] = i < got ? &g->nodes[i] : nullptr;
    *numNodes = got;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags)
{
    if (!exec || !g)
        return emu_fail(cudaErrorInvalidValue, "cudaGraphInstantiate with a null %s", g ? "output" : "graph");
    if (flags != 0)
        return emu_fail(cudaErrorInvalidValue, "cudaGraphInstantiate with flags %#llx (none are emulated)", flags);
    *exec = new emu_graph_exec{g->nodes};
    return cudaSuccess;
}

/* The exec's operations in order, each checked again (a block freed since the capture is a failed
 * node); the first that fails stops the launch. */
static cudaError_t replay(const emu_graph_exec *x)
{
    for (size_t i = 0; i < x->nodes.size(); i++) {
        cudaError_t e = x->nodes[i].op(true);
        if (e != cudaSuccess)
            return emu_fail(e, "cudaGraphLaunch: node %zu of %zu (%s) failed: %s", i, x->nodes.size(),
                            x->nodes[i].kind, cudaGetErrorName(e));
    }
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
    if (!exec)
        return emu_fail(cudaErrorInvalidValue, "cudaGraphLaunch of a null exec");
    return emu_enqueue(s, "cudaGraphLaunch", [exec](bool run) {
        return run ? replay(exec)
                   : emu_fail(cudaErrorStreamCaptureUnsupported,
                              "cudaGraphLaunch into a capturing stream (graphs do not nest here)");
    });
}

extern "C" cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    if (!exec)
        return emu_fail(cudaErrorInvalidValue, "cudaGraphExecDestroy of a null exec");
    delete exec;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    if (!g)
        return emu_fail(cudaErrorInvalidValue, "cudaGraphDestroy of a null graph");
    delete g;
    return cudaSuccess;
}
