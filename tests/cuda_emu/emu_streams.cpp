/* emu_streams.cpp: created streams for tests/cuda_emu (the CUDA plugin's share_stream). Every
 * operation has finished when its call returns (emu_runtime.cpp), so a stream is only a handle,
 * unless it captures (emu_graphs.cpp: its operations are then recorded for a graph). What this
 * file checks is its lifetime: a handle comes from cudaStreamCreateWithFlags, and destroying one
 * that was not created here (the legacy stream included), was already destroyed, or still
 * captures is a failed call (cudaErrorInvalidResourceHandle; cudaErrorIllegalState for a capture)
 * and a "cuda_emu:" line on stderr. Only created streams can capture (emu_stream_live). A stream
 * never destroyed shows as a leak under LeakSanitizer (the registry is gone by its exit check). */
#include "emu_internal.h"

#include <cstdio>
#include <mutex>
#include <set>

struct emu_stream {
    unsigned flags;
};

static std::mutex stream_lock;
static std::set<cudaStream_t> live_streams;

extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    if (!s || (flags != cudaStreamDefault && flags != cudaStreamNonBlocking)) {
        fprintf(stderr, "cuda_emu: cudaStreamCreateWithFlags with %s\n", s ? "unknown flags" : "a null output");
        return cudaErrorInvalidValue;
    }
    cudaStream_t h = new emu_stream{flags};
    std::lock_guard<std::mutex> hold(stream_lock);
    live_streams.insert(h);
    *s = h;
    return cudaSuccess;
}

bool emu_stream_live(cudaStream_t s, unsigned *flags)
{
    std::lock_guard<std::mutex> hold(stream_lock);
    if (!live_streams.count(s))
        return false;
    *flags = s->flags;
    return true;
}

extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    /* asked before the registry's lock is taken: this file's lock and emu_graphs.cpp's are never
     * held together */
    if (emu_stream_capturing(s))
        return emu_fail(cudaErrorIllegalState, "cudaStreamDestroy of %p, which captures (end the capture first)",
                        (void *)s);
    std::lock_guard<std::mutex> hold(stream_lock);
    if (live_streams.erase(s) == 0) {
        fprintf(stderr, "cuda_emu: cudaStreamDestroy of %p, which is not a live stream (never created, "
                        "already destroyed, or the legacy stream)\n", (void *)s);
        return cudaErrorInvalidResourceHandle;
    }
    delete s;
    return cudaSuccess;
}
