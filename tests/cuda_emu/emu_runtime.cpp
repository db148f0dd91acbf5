/* emu_runtime.cpp: the CPU side of tests/cuda_emu: the CUDA runtime, cuBLAS and cuBLASLt calls the
 * CUDA plugin makes, and the execution of kernel launches (see cuda_emu.h for the model).
 *
 * Device memory is aligned host memory; copies are memcpy; every stream operation has finished
 * when the call returns, unless its stream captures (each goes through emu_enqueue, which then
 * records it for a graph: emu_graphs.cpp). cudaMalloc keeps a registry of live blocks, so a copy
 * or memset that reaches outside every block, or a free of a pointer that is not a block, is a
 * failed call (cudaErrorInvalidValue) and a line on stderr. The driver's virtual memory calls
 * (include/cuda.h: reserve, create, map, set access, unmap, release) keep reserved ranges and
 * mapped pieces: a piece is memory only once cuMemSetAccess opened it, and copies may cross from
 * one mapped piece into the next. Environment:
 *   CUDA_EMU_DEVICES=0      no device: cudaGetDeviceCount fails as without a driver
 *   CUDA_EMU_MALLOC_LIMIT=N cudaMalloc fails once N bytes are live (tests the allocator's trim)
 *   CUDA_EMU_LT_NONE=1      cuBLASLt's heuristic finds no algorithm (the plugin uses cublasSgemm)
 *   CUDA_EMU_NO_VMM=1       the driver maps no memory (the plugin has no growable regions)
 */
#include "cuda_emu.h"
#include "emu_internal.h"

#include "cuda.h"

#include "cublasLt.h"
#include "cublas_v2.h"

#include <cblas.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <vector>

/* ---------------------------------------------------------------- errors */

static __thread cudaError_t last_error EMU_TLS = cudaSuccess;

cudaError_t emu_fail(cudaError_t e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("cuda_emu: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    last_error = e;
    return e;
}

extern "C" cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

extern "C" const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
    default: return "cudaErrorUnknown";
    }
}

extern "C" const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (emulated)";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit:
        return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread:
        return "attempt to terminate a thread-local capture sequence from another thread";
    default: return "emulated error";
    }
}

/* ---------------------------------------------------------------- device */

extern "C" cudaError_t cudaGetDeviceCount(int *count)
{
    const char *env = getenv("CUDA_EMU_DEVICES");
    *count = env ? atoi(env) : 1;
    if (*count <= 0) {
        *count = 0;
        last_error = cudaErrorNoDevice;
        return cudaErrorNoDevice;
    }
    return cudaSuccess;
}

extern "C" cudaError_t cudaSetDevice(int device)
{
    int n;
    if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n)
        return emu_fail(cudaErrorInvalidDevice, "cudaSetDevice: no such device");
    return cudaSuccess;
}

static const size_t EMU_SMEM_OPTIN = 227 * 1024;
static const int EMU_SMS = 4; /* few SMs: grid-stride loops then really loop */

extern "C" cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    (void)device;
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "CUDA emulator (tests/cuda_emu)");
    prop->totalGlobalMem = (size_t)8 << 30;
    prop->multiProcessorCount = EMU_SMS;
    prop->sharedMemPerBlockOptin = EMU_SMEM_OPTIN;
    prop->major = 9;
    prop->minor = 0;
    return cudaSuccess;
}

/* ---------------------------------------------------------------- memory */

static std::mutex mem_lock;
static std::map<uintptr_t, size_t> blocks; /* device blocks: start -> bytes */
static std::map<uintptr_t, size_t> pinned;
static size_t live_bytes;
/* the driver's virtual memory (cuMem*): reserved ranges, physical handles, mapped pieces (start ->
 * bytes, with whether cuMemSetAccess opened them) */
static std::map<uintptr_t, size_t> reserved;
static std::map<unsigned long long, size_t> handles;
static unsigned long long next_handle = 1;
struct emu_mapping {
    size_t bytes;
    bool open;
};
static std::map<uintptr_t, emu_mapping> mapped;

/* true when [u, u + n) lies in mapped pieces, each opened for access, one after another */
static bool in_mapped(uintptr_t u, size_t n)
{
    auto it = mapped.upper_bound(u);
    if (it == mapped.begin())
        return false;
    --it;
    for (uintptr_t at = u;;) {
        if (it == mapped.end() || at < it->first || at >= it->first + it->second.bytes || !it->second.open)
            return false;
        uintptr_t end = it->first + it->second.bytes;
        if (u + n <= end)
            return true;
        at = end;
        ++it;
    }
}

/* true when [p, p + n) lies inside one device block, or in a region's mapped pieces */
static bool in_block(const void *p, size_t n)
{
    std::lock_guard<std::mutex> g(mem_lock);
    uintptr_t u = (uintptr_t)p;
    if (in_mapped(u, n ? n : 1))
        return true;
    auto it = blocks.upper_bound(u);
    if (it == blocks.begin())
        return false;
    --it;
    return u >= it->first && u + n <= it->first + it->second;
}

/* ---------------------------------------------------------------- the driver's virtual memory */

static const size_t EMU_VMM_GRANULARITY = (size_t)2 << 20;

static CUresult vmm_fail(CUresult r, const char *what)
{
    fprintf(stderr, "cuda_emu: %s\n", what);
    return r;
}

extern "C" CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                                  CUmemAllocationGranularity_flags option)
{
    (void)option;
    if (!granularity || !prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id != 0)
        return vmm_fail(CUDA_ERROR_INVALID_VALUE, "cuMemGetAllocationGranularity: bad arguments");
    if (getenv("CUDA_EMU_NO_VMM"))
        return CUDA_ERROR_NOT_SUPPORTED; /* as a GPU that cannot map memory this way */
    *granularity = EMU_VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

extern "C" CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                       unsigned long long flags)
{
    if (!ptr || !size || size % EMU_VMM_GRANULARITY || addr || flags ||
        (alignment && alignment % EMU_VMM_GRANULARITY))
        return vmm_fail(CUDA_ERROR_INVALID_VALUE, "cuMemAddressReserve: bad arguments");
    /* over-reserve, then trim to the granularity's alignment */
    size_t span = size + EMU_VMM_GRANULARITY;
    void *m = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return vmm_fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAddressReserve: no address space");
    uintptr_t base = ((uintptr_t)m + EMU_VMM_GRANULARITY - 1) / EMU_VMM_GRANULARITY * EMU_VMM_GRANULARITY;
    if (base > (uintptr_t)m)
        munmap(m, base - (uintptr_t)m);
    if ((uintptr_t)m + span > base + size)
        munmap((void *)(base + size), (uintptr_t)m + span - (base + size));
    std::lock_guard<std::mutex> g(mem_lock);
    reserved[base] = size;
    *ptr = base;
    return CUDA_SUCCESS;
}

extern "C" CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    std::lock_guard<std::mutex> g(mem_lock);
    auto it = reserved.find((uintptr_t)ptr);
    if (it == reserved.end() || it->second != size)
        return vmm_fail(CUDA_ERROR_INVALID_VALUE, "cuMemAddressFree of a range cuMemAddressReserve did not return");
    auto m = mapped.lower_bound((uintptr_t)ptr);
    if (m != mapped.end() && m->first < (uintptr_t)ptr + size)
        return vmm_fail(CUDA_ERROR_INVALID_VALUE, "cuMemAddressFree of a range with memory still mapped");
    munmap((void *)(uintptr_t)ptr, size);
    reserved.erase(it);
    return CUDA_SUCCESS;
}

extern "C" CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags)
{
    if (!handle || !prop || !size || size % EMU_VMM_GRANULARITY || flags ||
        prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return vmm_fail(CUDA_ERROR_INVALID_VALUE, "cuMemCreate: bad arguments");
    if (emu_capture_forbid("cuMemCreate", false) != cudaSuccess)
        return CUDA_ERROR_NOT_SUPPORTED;
    const char *limit = getenv("CUDA_EMU_MALLOC_LIMIT");
    std::lock_guard<std::mutex> g(mem_lock);
    if (limit && live_bytes + size > (size_t)strtoull(limit, NULL, 10)) {
        fprintf(stderr, "cuda_emu: cuMemCreate of %zu bytes refused (%zu live, CUDA_EMU_MALLOC_LIMIT %s)\n", size,
                live_bytes, limit);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    live_bytes += size;
    handles[next_handle] = size;
    *handle = next_handle++;
    return CUDA_SUCCESS;
}

extern "C" CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    std::lock_guard<std::mutex> g(mem_lock);
    auto it = handles.find(handle);
    if (it == handles.end())
        return vmm_fail(CUDA_ERROR_INVALID_VALUE, "cuMemRelease of a handle cuMemCreate did not return");
    live_bytes -= it->second;
    handles.erase(it);
    return CUDA_SUCCESS;
}

extern "C" CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                            unsigned long long flags)
{
    std::lock_guard<std::mutex> g(mem_lock);
    auto h = handles.find(handle);
    if (h == handles.end() || offset || flags || h->second != size)
        return vmm_fail(CUDA_ERROR_INVALID_VALUE, "cuMemMap: bad arguments (the whole handle, offset 0)");
    uintptr_t u = (uintptr_t)ptr;
    auto r = reserved.upper_bound(u);
    if (r == reserved.begin() || (--r, u + size > r->first + r->second))
        return vmm_fail(CUDA_ERROR_INVALID_VALUE, "cuMemMap outside every reserved range");
    auto m = mapped.upper_bound(u);
    if ((m != mapped.end() && m->first < u + size) ||
        (m != mapped.begin() && (--m, m->first + m->second.bytes > u)))
        return vmm_fail(CUDA_ERROR_INVALID_VALUE, "cuMemMap over memory already mapped");
    mapped[u] = emu_mapping{size, false};
    return CUDA_SUCCESS;
}

extern "C" CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    if (!desc || count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc->location.id != 0 ||
        desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        return vmm_fail(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess: bad arguments");
    std::lock_guard<std::mutex> g(mem_lock);
    auto m = mapped.find((uintptr_t)ptr);
    if (m == mapped.end() || m->second.bytes != size)
        return vmm_fail(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess of a range cuMemMap did not map");
    if (mprotect((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE) != 0)
        return vmm_fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemSetAccess: mprotect failed");
    memset((void *)(uintptr_t)ptr, 0xA5, size); /* fresh device memory holds garbage */
    m->second.open = true;
    return CUDA_SUCCESS;
}

extern "C" CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    std::lock_guard<std::mutex> g(mem_lock);
    auto m = mapped.find((uintptr_t)ptr);
    if (m == mapped.end() || m->second.bytes != size)
        return vmm_fail(CUDA_ERROR_INVALID_VALUE, "cuMemUnmap of a range cuMemMap did not map");
    madvise((void *)(uintptr_t)ptr, size, MADV_DONTNEED);
    mprotect((void *)(uintptr_t)ptr, size, PROT_NONE);
    mapped.erase(m);
    return CUDA_SUCCESS;
}

extern "C" cudaError_t cudaMalloc(void **p, size_t bytes)
{
    cudaError_t e = emu_capture_forbid("cudaMalloc", false);
    if (e != cudaSuccess)
        return e;
    const char *limit = getenv("CUDA_EMU_MALLOC_LIMIT");
    std::lock_guard<std::mutex> g(mem_lock);
    if (limit && live_bytes + bytes > (size_t)strtoull(limit, NULL, 10)) {
        fprintf(stderr, "cuda_emu: cudaMalloc of %zu bytes refused (%zu live, CUDA_EMU_MALLOC_LIMIT %s)\n", bytes,
                live_bytes, limit);
        last_error = cudaErrorMemoryAllocation;
        return cudaErrorMemoryAllocation;
    }
    void *m = aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
    if (!m) {
        last_error = cudaErrorMemoryAllocation;
        return cudaErrorMemoryAllocation;
    }
    memset(m, 0xA5, bytes); /* fresh device memory holds garbage */
    blocks[(uintptr_t)m] = bytes;
    live_bytes += bytes;
    *p = m;
    return cudaSuccess;
}

extern "C" cudaError_t cudaFree(void *p)
{
    if (!p)
        return cudaSuccess;
    cudaError_t e = emu_capture_forbid("cudaFree", true);
    if (e != cudaSuccess)
        return e;
    std::lock_guard<std::mutex> g(mem_lock);
    auto it = blocks.find((uintptr_t)p);
    if (it == blocks.end())
        return emu_fail(cudaErrorInvalidValue, "cudaFree of a pointer that cudaMalloc did not return");
    live_bytes -= it->second;
    blocks.erase(it);
    free(p);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMallocHost(void **p, size_t bytes)
{
    void *m = aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!m)
        return emu_fail(cudaErrorMemoryAllocation, "cudaMallocHost");
    std::lock_guard<std::mutex> g(mem_lock);
    pinned[(uintptr_t)m] = bytes;
    *p = m;
    return cudaSuccess;
}

extern "C" cudaError_t cudaFreeHost(void *p)
{
    if (!p)
        return cudaSuccess;
    cudaError_t e = emu_capture_forbid("cudaFreeHost", true);
    if (e != cudaSuccess)
        return e;
    std::lock_guard<std::mutex> g(mem_lock);
    pinned.erase((uintptr_t)p);
    free(p);
    return cudaSuccess;
}

extern "C" cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *p)
{
    memset(attr, 0, sizeof *attr);
    if (in_block(p, 1))
        attr->type = cudaMemoryTypeDevice;
    else {
        std::lock_guard<std::mutex> g(mem_lock);
        attr->type = pinned.count((uintptr_t)p) ? cudaMemoryTypeHost : cudaMemoryTypeUnregistered;
    }
    return cudaSuccess;
}

/* the device side of a copy must lie in a block; the host side must not */
static cudaError_t check_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (dst_dev != in_block(dst, bytes) || src_dev != in_block(src, bytes))
        return emu_fail(cudaErrorInvalidValue, "cudaMemcpy kind %d of %zu bytes %p <- %p: %s", (int)kind, bytes, dst,
                        src,
                        dst_dev && !in_block(dst, bytes) ? "destination outside every device block"
                        : src_dev && !in_block(src, bytes) ? "source outside every device block"
                                                           : "host pointer inside a device block");
    return cudaSuccess;
}

/* CUDA would capture a copy from or to pinned memory, but the plugin must never queue one into a
 * capture (the host side would be read or written at every replay, not at the call): refused. */
static cudaError_t refuse_host_copy(const char *call, cudaMemcpyKind kind)
{
    return emu_fail(cudaErrorStreamCaptureUnsupported, "%s of kind %d into a capture: only device-to-device copies "
                                                       "are captured here", call, (int)kind);
}

extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                                       cudaStream_t s)
{
    if (bytes == 0)
        return cudaSuccess;
    return emu_enqueue(s, "cudaMemcpyAsync", [=](bool run) {
        if (!run && kind != cudaMemcpyDeviceToDevice)
            return refuse_host_copy("cudaMemcpyAsync", kind);
        cudaError_t e = check_copy(dst, src, bytes, kind);
        if (e != cudaSuccess)
            return e;
        uintptr_t d = (uintptr_t)dst, r = (uintptr_t)src;
        if (d < r + bytes && r < d + bytes && dst != src)
            return emu_fail(cudaErrorInvalidValue, "cudaMemcpyAsync with overlapping ranges (undefined on a GPU)");
        if (run)
            memcpy(dst, src, bytes);
        return cudaSuccess;
    });
}

extern "C" cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                         size_t height, enum cudaMemcpyKind kind, cudaStream_t s)
{
    if (width == 0 || height == 0)
        return cudaSuccess;
    return emu_enqueue(s, "cudaMemcpy2DAsync", [=](bool run) {
        if (!run && kind != cudaMemcpyDeviceToDevice)
            return refuse_host_copy("cudaMemcpy2DAsync", kind);
        if (width > dpitch || width > spitch)
            return emu_fail(cudaErrorInvalidValue, "cudaMemcpy2DAsync: width above a pitch");
        size_t dspan = dpitch * (height - 1) + width, sspan = spitch * (height - 1) + width;
        if (kind != cudaMemcpyDeviceToDevice || !in_block(dst, dspan) || !in_block(src, sspan))
            return emu_fail(cudaErrorInvalidValue, "cudaMemcpy2DAsync outside device blocks");
        uintptr_t d = (uintptr_t)dst, r = (uintptr_t)src;
        if (d < r + sspan && r < d + dspan)
            return emu_fail(cudaErrorInvalidValue, "cudaMemcpy2DAsync with overlapping spans (undefined on a GPU)");
        for (size_t i = 0; run && i < height; i++)
            memcpy((char *)dst + i * dpitch, (const char *)src + i * spitch, width);
        return cudaSuccess;
    });
}

extern "C" cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s)
{
    if (bytes == 0)
        return cudaSuccess;
    return emu_enqueue(s, "cudaMemsetAsync", [=](bool run) {
        if (!in_block(p, bytes))
            return emu_fail(cudaErrorInvalidValue, "cudaMemsetAsync outside every device block");
        if (run)
            memset(p, value, bytes);
        return cudaSuccess;
    });
}

/* Nothing to wait for (every operation has finished); on the capturing stream, a refusal that
 * invalidates the capture, as in CUDA. */
extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    return emu_enqueue(s, "cudaStreamSynchronize", [s](bool run) {
        return run ? cudaSuccess
                   : emu_fail(cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize of stream %p, which captures",
                              (void *)s);
    });
}

/* ---------------------------------------------------------------- events */

/* An event is a handle from cudaEventCreate(WithFlags) until cudaEventDestroy. Using one that was
 * never created or is destroyed is undefined in CUDA (often cudaErrorInvalidResourceHandle); here
 * it always is, with a "cuda_emu:" line, and the handle is not touched. An event never destroyed
 * shows as a leak under LeakSanitizer. */
struct emu_event {
    unsigned flags;
    std::chrono::steady_clock::time_point t;
    bool captured; /* last recorded into a capture: no time to wait for or read until recorded again */
};

static std::mutex event_lock;
static std::set<cudaEvent_t> live_events;

static cudaError_t check_event(const char *call, cudaEvent_t e)
{
    std::lock_guard<std::mutex> hold(event_lock);
    if (live_events.count(e))
        return cudaSuccess;
    return emu_fail(cudaErrorInvalidResourceHandle, "%s on event %p, which is not a live event (never created or "
                                                    "already destroyed)", call, (void *)e);
}

/* The legacy stream (or 0), or a stream cudaStreamCreateWithFlags made and nobody destroyed. Not
 * called under capture_lock (emu_graphs.cpp's and emu_streams.cpp's locks are never held together). */
static cudaError_t check_stream(const char *call, cudaStream_t s)
{
    unsigned flags;
    if (s == nullptr || s == cudaStreamLegacy || emu_stream_live(s, &flags))
        return cudaSuccess;
    return emu_fail(cudaErrorInvalidResourceHandle, "%s on stream %p, which is not a live stream", call, (void *)s);
}

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    if (!e || (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming)))
        return emu_fail(cudaErrorInvalidValue, "cudaEventCreateWithFlags with %s", e ? "unknown flags" : "a null output");
    cudaEvent_t h = new emu_event{flags, {}, false};
    std::lock_guard<std::mutex> hold(event_lock);
    live_events.insert(h);
    *e = h;
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    return cudaEventCreateWithFlags(e, cudaEventDefault);
}
extern "C" cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    std::lock_guard<std::mutex> hold(event_lock);
    if (live_events.erase(e) == 0)
        return emu_fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy of %p, which is not a live event (never "
                                                        "created or already destroyed)", (void *)e);
    delete e;
    return cudaSuccess;
}
/* Checked again when a graph records it: the event may be destroyed by then. */
extern "C" cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    cudaError_t err = check_stream("cudaEventRecord", s);
    if (err != cudaSuccess)
        return err;
    return emu_enqueue(s, "cudaEventRecord", [e](bool run) {
        cudaError_t err = check_event("cudaEventRecord", e);
        if (err != cudaSuccess)
            return err;
        if (run)
            e->t = std::chrono::steady_clock::now();
        e->captured = !run;
        return cudaSuccess;
    });
}
/* An event last recorded into a capture has no time until the graph records it: CUDA refuses to
 * wait for it or read it (and the wait would invalidate the capture that holds the record). */
static cudaError_t refuse_captured(const char *call, cudaEvent_t e)
{
    emu_capture_invalidate(call);
    return emu_fail(cudaErrorCapturedEvent, "%s on event %p, last recorded into a capture", call, (void *)e);
}
extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    cudaError_t err = check_event("cudaEventSynchronize", e);
    if (err != cudaSuccess)
        return err;
    return e->captured ? refuse_captured("cudaEventSynchronize", e) : cudaSuccess;
}
/* As in CUDA, an event made with cudaEventDisableTiming has no time to read. */
extern "C" cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t stop)
{
    cudaError_t err = check_event("cudaEventElapsedTime", start);
    if (err == cudaSuccess)
        err = check_event("cudaEventElapsedTime", stop);
    if (err != cudaSuccess)
        return err;
    if ((start->flags | stop->flags) & cudaEventDisableTiming)
        return emu_fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime on an event made with "
                                                        "cudaEventDisableTiming");
    if (start->captured || stop->captured)
        return refuse_captured("cudaEventElapsedTime", start->captured ? start : stop);
    *ms = std::chrono::duration<float, std::milli>(stop->t - start->t).count();
    return cudaSuccess;
}
/* CUDA: work queued on s after the call waits for the work the event's last record covers; the
 * host does not wait. Here that work has finished when its call returned, so the wait only
 * checks, queued through emu_enqueue like cudaEventRecord: a live stream and a live event, flags
 * cudaEventWaitDefault (stricter: CUDA also takes cudaEventWaitExternal, which the plugin does
 * not use). On the capturing stream the wait is recorded (a dependency inside the graph, checked
 * again at each launch); an event last recorded into a capture is refused from a stream that does
 * not capture (cudaErrorCapturedEvent, and the capture is invalidated, as for
 * cudaEventSynchronize). Stricter than CUDA: the capturing stream may not wait for an event
 * recorded outside the capture (cudaErrorStreamCaptureUnsupported): a graph could not wait for it
 * at a replay, so the plugin must order such work otherwise. */
extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    cudaError_t err = check_stream("cudaStreamWaitEvent", s);
    if (err != cudaSuccess)
        return err;
    if (flags != cudaEventWaitDefault)
        return emu_fail(cudaErrorInvalidValue, "cudaStreamWaitEvent with flags %#x (only cudaEventWaitDefault here)",
                        flags);
    return emu_enqueue(s, "cudaStreamWaitEvent", [e](bool run) {
        cudaError_t err = check_event("cudaStreamWaitEvent", e);
        if (err != cudaSuccess)
            return err;
        if (run && e->captured)
            return refuse_captured("cudaStreamWaitEvent", e);
        if (!run && !e->captured)
            return emu_fail(cudaErrorStreamCaptureUnsupported, "cudaStreamWaitEvent into a capture on event %p, "
                                                               "recorded outside it", (void *)e);
        return cudaSuccess;
    });
}

/* ---------------------------------------------------------------- launches */

static std::mutex attr_lock;
static std::map<const void *, int> smem_limit; /* cudaFuncAttributeMaxDynamicSharedMemorySize */

extern "C" cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || (size_t)value > EMU_SMEM_OPTIN)
        return emu_fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: bad attribute or value");
    std::lock_guard<std::mutex> g(attr_lock);
    smem_limit[func] = value;
    return cudaSuccess;
}

/* Kernels run as fibers: every CUDA thread of a block is a fiber with its own stack, all on the
 * calling host thread. A fiber runs until it waits at a barrier (__syncthreads, or a warp
 * shuffle's exchange) or returns; the scheduler releases a barrier once every fiber that has not
 * returned waits at it (the block's, or the warp's for a shuffle), as on the GPU. Fibers of one
 * block waiting at different barriers is a kernel bug: reported, launch failed.
 *
 * The switch between fibers is a few instructions (emu_switch below: the callee-saved registers
 * and the stack pointer), not swapcontext, which makes a system call each time: kernels with
 * block reductions switch tens of millions of times in the conformance suite. */
enum fiber_state { RUNNABLE, WAIT_SYNC, WAIT_WARP, DONE };

struct Fiber {
    void *sp; /* saved stack pointer while switched out */
    char *stack;
    fiber_state state;
    uint3 tid;
    int linear;
    unsigned shuffles; /* shuffles done: picks the exchange slot (double buffered) */
    void *fake_stack;  /* AddressSanitizer's bookkeeping of this fiber's stack */
};

struct Block {
    int nthreads;
    std::vector<Fiber> fibers;
    std::vector<uint64_t> lanes; /* shuffle exchange slots: two per thread */
    std::vector<unsigned char> smem;
    const std::function<void()> *body;
};

#if !defined(__x86_64__)
#error "tests/cuda_emu switches fibers with x86-64 code"
#endif
/* emu_switch(&save, to): pushes the callee-saved registers, stores the stack pointer in *save,
 * loads `to` (a stack saved the same way, or a new one laid out by fiber_init) and pops. */
extern "C" void emu_switch(void **save, void *to);
asm(".text\n"
    ".p2align 4\n"
    ".type emu_switch,@function\n"
    "emu_switch:\n"
    "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n    pushq %r13\n    pushq %r14\n    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n    popq %r14\n    popq %r13\n    popq %r12\n    popq %rbx\n    popq %rbp\n"
    "    ret\n"
    ".size emu_switch, .-emu_switch\n");

static const size_t EMU_STACK = (size_t)256 << 10;
/* What a finished fiber leaves poisoned on its stack (under AddressSanitizer): the redzones of the
 * frames that never returned, fiber_main's alone (every frame below it returned, and a returning
 * frame unpoisons its own), which lies within this many bytes of the top. A block that ends in a
 * deadlock leaves frames anywhere: launch_blocks then unpoisons its stacks whole. Unpoisoning all
 * 256 KiB of every thread's stack before every block (32 KiB of shadow each) took a quarter of
 * a training run's time on the emulator (perf, 2026-12-07). */
static const size_t EMU_STACK_TOP = (size_t)4 << 10;
struct StackPool {
    std::vector<char *> stacks;
    ~StackPool()
    {
        for (char *st : stacks)
            free(st);
    }
};
static StackPool stack_pool;

__thread uint3 threadIdx EMU_TLS, blockIdx EMU_TLS;
__thread dim3 blockDim EMU_TLS, gridDim EMU_TLS;
static __thread Block *tl_block EMU_TLS;
static __thread Fiber *tl_fiber EMU_TLS;
static __thread void *tl_sched_sp EMU_TLS;
static __thread void *tl_sched_fake EMU_TLS;
static __thread const void *tl_sched_bottom EMU_TLS;
static __thread size_t tl_sched_size EMU_TLS;

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_START_SWITCH(fake, bottom, size) __sanitizer_start_switch_fiber(fake, bottom, size)
#define EMU_FINISH_SWITCH(fake, bottom, size) __sanitizer_finish_switch_fiber(fake, bottom, size)
/* a stack used before still carries the poisoned redzones of its old frames */
#define EMU_UNPOISON(p, n) __asan_unpoison_memory_region(p, n)
#else
#define EMU_START_SWITCH(fake, bottom, size) ((void)(fake), (void)(bottom), (void)(size))
#define EMU_FINISH_SWITCH(fake, bottom, size) ((void)(fake), (void)(bottom), (void)(size))
#define EMU_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* From a fiber back to the scheduler, in `state`; returns when the scheduler resumes it. */
static void fiber_yield(fiber_state state)
{
    Fiber *f = tl_fiber;
    f->state = state;
    EMU_START_SWITCH(&f->fake_stack, tl_sched_bottom, tl_sched_size);
    emu_switch(&f->sp, tl_sched_sp);
    EMU_FINISH_SWITCH(f->fake_stack, &tl_sched_bottom, &tl_sched_size);
}

/* A fiber's first frame: runs the kernel body for this thread, then leaves for good. */
static void fiber_main(void)
{
    EMU_FINISH_SWITCH(NULL, &tl_sched_bottom, &tl_sched_size);
    (*tl_block->body)();
    Fiber *f = tl_fiber;
    f->state = DONE;
    EMU_START_SWITCH(NULL, tl_sched_bottom, tl_sched_size); /* NULL: this stack is finished */
    void *dead;
    emu_switch(&dead, tl_sched_sp);
    abort(); /* never resumed */
}

/* Lays out a new stack so that switching to it enters fiber_main as if called: six zero
 * registers for emu_switch to pop, then fiber_main as the return address (stack aligned so that
 * the entry sees rsp = 8 mod 16, as after a call). */
static void fiber_init(Fiber *f)
{
    EMU_UNPOISON(f->stack + EMU_STACK - EMU_STACK_TOP, EMU_STACK_TOP);
    uintptr_t top = ((uintptr_t)f->stack + EMU_STACK) & ~(uintptr_t)15;
    void **sp = (void **)(top - 8);
    *sp = NULL; /* fiber_main's own return address: it never returns */
    *--sp = (void *)fiber_main;
    for (int i = 0; i < 6; i++)
        *--sp = NULL;
    f->sp = sp;
    f->state = RUNNABLE;
    f->fake_stack = NULL;
    f->shuffles = 0;
}

void __syncthreads(void)
{
    fiber_yield(WAIT_SYNC);
}

void *emu_dynamic_smem(void)
{
    return tl_block->smem.data();
}

/* One barrier per shuffle: a lane's next shuffle writes the other slot, and cannot reach this
 * slot again before every lane has passed the next barrier, so the values read here are intact. */
uint64_t emu_shfl_xor(uint64_t v, int lanemask)
{
    Block *b = tl_block;
    Fiber *f = tl_fiber;
    int me = f->linear, other = (me & ~31) + ((me & 31) ^ lanemask);
    size_t slot = (size_t)(f->shuffles++ & 1u) * (size_t)b->nthreads;
    b->lanes[slot + (size_t)me] = v;
    fiber_yield(WAIT_WARP);
    return other < b->nthreads ? b->lanes[slot + (size_t)other] : v;
}

static void resume(Fiber *f)
{
    tl_fiber = f;
    threadIdx = f->tid;
    f->state = RUNNABLE;
    EMU_START_SWITCH(&tl_sched_fake, f->stack, EMU_STACK);
    emu_switch(&tl_sched_sp, f->sp);
    EMU_FINISH_SWITCH(tl_sched_fake, NULL, NULL);
}

/* Runs one block to its end; false on a deadlock (fibers waiting at different barriers).
 * `reverse`: resume the runnable fibers from the last thread to the first. Blocks alternate the
 * order, so shared memory read before the barrier that should order it after another thread's
 * write gives a wrong result in one order or the other. */
static bool run_block(Block *b, bool reverse)
{
    for (Fiber &f : b->fibers)
        fiber_init(&f);
    memset(b->smem.data(), 0xff, b->smem.size());
    const int nwarps = (b->nthreads + 31) / 32;
    for (;;) {
        for (int i = 0; i < b->nthreads; i++) {
            Fiber &f = b->fibers[(size_t)(reverse ? b->nthreads - 1 - i : i)];
            if (f.state == RUNNABLE)
                resume(&f);
        }
        int live = 0, at_sync = 0;
        for (const Fiber &f : b->fibers) {
            live += f.state != DONE;
            at_sync += f.state == WAIT_SYNC;
        }
        if (live == 0)
            return true;
        bool released = false;
        if (at_sync == live) {
            for (Fiber &f : b->fibers)
                if (f.state == WAIT_SYNC)
                    f.state = RUNNABLE;
            released = true;
        }
        for (int w = 0; w < nwarps && !released; w++) {
            int wl = 0, ww = 0;
            for (int l = w * 32; l < b->nthreads && l < w * 32 + 32; l++) {
                wl += b->fibers[(size_t)l].state != DONE;
                ww += b->fibers[(size_t)l].state == WAIT_WARP;
            }
            if (ww > 0 && ww == wl) {
                for (int l = w * 32; l < b->nthreads && l < w * 32 + 32; l++)
                    b->fibers[(size_t)l].state = RUNNABLE;
                released = true;
            }
        }
        if (!released) {
            fprintf(stderr, "cuda_emu: deadlock in block (%u,%u,%u): %d threads live, %d at __syncthreads, the "
                            "rest at warp shuffles of partly waiting warps\n",
                    blockIdx.x, blockIdx.y, blockIdx.z, live, at_sync);
            return false;
        }
    }
}

/* A launch's checks, as CUDA makes them when the launch is queued. */
static cudaError_t launch_check(const emu_cfg &cfg, const void *kernel)
{
    uint64_t nthreads = (uint64_t)cfg.block.x * cfg.block.y * cfg.block.z;
    uint64_t nblocks = (uint64_t)cfg.grid.x * cfg.grid.y * cfg.grid.z;
    if (nthreads == 0 || nthreads > 1024 || nblocks == 0 || cfg.grid.x > 2147483647u || cfg.grid.y > 65535 ||
        cfg.grid.z > 65535)
        return emu_fail(cudaErrorInvalidConfiguration, "launch of grid (%u,%u,%u) block (%u,%u,%u) refused",
                        cfg.grid.x, cfg.grid.y, cfg.grid.z, cfg.block.x, cfg.block.y, cfg.block.z);
    size_t limit = 48 * 1024;
    {
        std::lock_guard<std::mutex> g(attr_lock);
        auto it = smem_limit.find(kernel);
        if (it != smem_limit.end() && (size_t)it->second > limit)
            limit = (size_t)it->second;
    }
    if (cfg.smem > limit)
        return emu_fail(cudaErrorInvalidValue,
                        "launch with %zu bytes of dynamic shared memory; the kernel's limit is %zu", cfg.smem, limit);
    return cudaSuccess;
}

/* Runs a launch that passed launch_check. */
static cudaError_t launch_blocks(const emu_cfg &cfg, const std::function<void()> &f)
{
    uint64_t nthreads = (uint64_t)cfg.block.x * cfg.block.y * cfg.block.z;
    uint64_t nblocks = (uint64_t)cfg.grid.x * cfg.grid.y * cfg.grid.z;
    static std::mutex launch_lock; /* one launch at a time: the stacks are shared */
    std::lock_guard<std::mutex> g(launch_lock);
    while (stack_pool.stacks.size() < nthreads) {
        char *st = (char *)malloc(EMU_STACK);
        if (!st)
            return last_error = cudaErrorMemoryAllocation;
        stack_pool.stacks.push_back(st);
    }
    Block b;
    b.nthreads = (int)nthreads;
    b.fibers.resize(nthreads);
    b.lanes.resize(2 * nthreads);
    b.smem.resize(cfg.smem + 16);
    b.body = &f;
    for (uint64_t t = 0; t < nthreads; t++) {
        Fiber &fb = b.fibers[t];
        fb.stack = stack_pool.stacks[t];
        fb.linear = (int)t;
        fb.tid = uint3{(unsigned)(t % cfg.block.x), (unsigned)(t / cfg.block.x % cfg.block.y),
                       (unsigned)(t / cfg.block.x / cfg.block.y)};
    }
    tl_block = &b;
    blockDim = cfg.block;
    gridDim = cfg.grid;
    cudaError_t e = cudaSuccess;
    for (uint64_t blk = 0; blk < nblocks && e == cudaSuccess; blk++) {
        blockIdx = uint3{(unsigned)(blk % cfg.grid.x), (unsigned)(blk / cfg.grid.x % cfg.grid.y),
                         (unsigned)(blk / cfg.grid.x / cfg.grid.y)};
        if (!run_block(&b, blk % 2 == 1))
            e = last_error = cudaErrorLaunchFailure;
    }
    if (e != cudaSuccess) /* fibers left mid-frame: their stacks are poisoned anywhere (EMU_STACK_TOP) */
        for (uint64_t t = 0; t < nthreads; t++)
            EMU_UNPOISON(b.fibers[t].stack, EMU_STACK);
    tl_block = NULL;
    return e;
}

/* Errors reach the caller as CUDA's do, through cudaGetLastError. */
void emu_run(const emu_cfg &cfg, const void *kernel, const std::function<void()> &f)
{
    (void)emu_enqueue(cfg.stream, "kernel launch", [cfg, kernel, f](bool run) {
        cudaError_t e = launch_check(cfg, kernel);
        return e != cudaSuccess || !run ? e : launch_blocks(cfg, f);
    });
}

/* ---------------------------------------------------------------- cuBLAS, cuBLASLt */

struct emu_cublas {
    cudaStream_t stream; /* cublasSetStream's: where cublasSgemm queues its work */
};
struct emu_lt {
    int unused;
};
struct emu_lt_desc {
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    const float *a_scale = nullptr, *b_scale = nullptr; /* device pointers (fp8 operands) */
    int32_t a_mode = 0, b_mode = 0;                     /* CUBLASLT_MATMUL_MATRIX_SCALE_* */
};
struct emu_lt_layout {
    uint64_t rows, cols;
    int64_t ld;
    cudaDataType type;
};
struct emu_lt_pref {
    int unused;
};

extern "C" const char *cublasGetStatusString(cublasStatus_t s)
{
    return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_EMULATED_ERROR";
}
extern "C" const char *cublasLtGetStatusString(cublasStatus_t s)
{
    return cublasGetStatusString(s);
}

/* The cuBLAS calls queue their work through emu_enqueue, whose operations say cudaError_t. */
static cudaError_t queued(cublasStatus_t s)
{
    return s == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}
static cublasStatus_t status_of(cudaError_t e)
{
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS
           : e == cudaErrorInvalidValue ? CUBLAS_STATUS_INVALID_VALUE
                                        : CUBLAS_STATUS_EXECUTION_FAILED;
}

/* C (m,n) = alpha op(A) op(B) + beta C, column-major, on device blocks; with `run` false only the
 * checks. */
static cublasStatus_t sgemm(bool run, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                            const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc)
{
    int arows = ta == CUBLAS_OP_N ? m : k, acols = ta == CUBLAS_OP_N ? k : m;
    int brows = tb == CUBLAS_OP_N ? k : n, bcols = tb == CUBLAS_OP_N ? n : k;
    if (m < 0 || n < 0 || k < 0 || lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) ||
        ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0)
        return CUBLAS_STATUS_SUCCESS;
    if (!in_block(a, sizeof(float) * ((size_t)lda * (size_t)(acols - 1) + (size_t)arows)) ||
        !in_block(b, sizeof(float) * ((size_t)ldb * (size_t)(bcols - 1) + (size_t)brows)) ||
        !in_block(c, sizeof(float) * ((size_t)ldc * (size_t)(n - 1) + (size_t)m))) {
        fprintf(stderr, "cuda_emu: sgemm operand outside every device block\n");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!run)
        return CUBLAS_STATUS_SUCCESS;
    cblas_sgemm(CblasColMajor, ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = new emu_cublas();
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode)
{
    (void)h;
    (void)mode;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                      int k, const float *alpha, const float *a, int lda, const float *b, int ldb,
                                      const float *beta, float *c, int ldc)
{
    float al = *alpha, be = *beta; /* host scalars: read at the call, as a capture reads them */
    return status_of(emu_enqueue(h->stream, "cublasSgemm", [=](bool run) {
        return queued(sgemm(run, ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc));
    }));
}

extern "C" cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    *h = new emu_lt();
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                                   cudaDataType scale)
{
    if ((compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32) || scale != CUDA_R_32F)
        return CUBLAS_STATUS_INVALID_VALUE;
    *d = new emu_lt_desc();
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                                         const void *buf, size_t size)
{
    if (attr == CUBLASLT_MATMUL_DESC_A_SCALE_MODE || attr == CUBLASLT_MATMUL_DESC_B_SCALE_MODE) {
        int32_t mode;
        if (size != sizeof mode)
            return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&mode, buf, size);
        if (mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F && mode != CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F)
            return CUBLAS_STATUS_INVALID_VALUE;
        (attr == CUBLASLT_MATMUL_DESC_A_SCALE_MODE ? d->a_mode : d->b_mode) = mode;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (attr == CUBLASLT_MATMUL_DESC_A_SCALE_POINTER || attr == CUBLASLT_MATMUL_DESC_B_SCALE_POINTER) {
        if (size != sizeof(void *))
            return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(attr == CUBLASLT_MATMUL_DESC_A_SCALE_POINTER ? &d->a_scale : &d->b_scale, buf, size);
        return CUBLAS_STATUS_SUCCESS;
    }
    if (size != sizeof(cublasOperation_t))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_DESC_TRANSA)
        memcpy(&d->ta, buf, size);
    else if (attr == CUBLASLT_MATMUL_DESC_TRANSB)
        memcpy(&d->tb, buf, size);
    else
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows,
                                                     uint64_t cols, int64_t ld)
{
    if ((type != CUDA_R_32F && type != CUDA_R_16BF && type != CUDA_R_8F_E4M3 && type != CUDA_R_8F_E5M2) ||
        ld < (int64_t)rows)
        return CUBLAS_STATUS_INVALID_VALUE;
    *l = new emu_lt_layout{rows, cols, ld, type};
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l)
{
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    *p = new emu_lt_pref();
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p)
{
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                               cublasLtMatmulPreferenceAttributes_t attr,
                                                               const void *buf, size_t size)
{
    (void)p;
    (void)buf;
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)
        return size == 8 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    return size == 4 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

static bool is_fp8(cudaDataType t)
{
    return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2;
}

/* A and B: both f32, both bf16, or both fp8 (C and D are f32 throughout). */
static bool types_agree(cudaDataType a, cudaDataType b)
{
    return a == b || (is_fp8(a) && is_fp8(b));
}

/* The OCP fp8 value of a bit pattern: e4m3 (bias 7, no inf, S.1111.111 NaN) or e5m2 (bias 15,
 * IEEE-like inf and NaN); decoded independently of the plugin's own tables. */
static float fp8_value(uint8_t v, bool e5m2)
{
    int sign = v >> 7, mbits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
    int e = (v & 0x7f) >> mbits, f = v & ((1 << mbits) - 1);
    float mag;
    if (e5m2 && e == 31)
        mag = f ? NAN : INFINITY;
    else if (!e5m2 && e == 15 && f == 7)
        mag = NAN;
    else if (e == 0)
        mag = ldexpf((float)f, 1 - bias - mbits);
    else
        mag = ldexpf((float)(f + (1 << mbits)), e - bias - mbits);
    return sign ? -mag : mag;
}

/* The elements a column-major (rows, cols) operand with leading dimension ld reaches. */
static size_t operand_span(const emu_lt_layout *l)
{
    return (size_t)l->ld * (l->cols ? l->cols - 1 : 0) + l->rows;
}

/* Whether an operand (and, fp8, its scale: one, or with `vec` one per stored column) lies in device
 * blocks. */
static bool operand_ok(const void *p, const emu_lt_layout *l, const float *scale, bool vec)
{
    size_t elem = l->type == CUDA_R_32F ? 4 : l->type == CUDA_R_16BF ? 2 : 1;
    if (!in_block(p, elem * operand_span(l)) ||
        (is_fp8(l->type) && (!scale || !in_block(scale, sizeof(float) * (vec ? l->cols : 1))))) {
        fprintf(stderr, "cuda_emu: cublasLtMatmul operand or scale outside every device block\n");
        return false;
    }
    return true;
}

/* An operand that passed operand_ok as f32 (fp8 times its scale; with `vec` one per stored column,
 * which for the TN fp8 layout is a row of op(A) / a column of op(B)). */
static void operand_f32(std::vector<float> &out, const void *p, const emu_lt_layout *l, const float *scale, bool vec)
{
    size_t span = operand_span(l);
    out.assign(span, 0.0f);
    for (size_t i = 0; i < span; i++) {
        if (l->type == CUDA_R_32F) {
            out[i] = ((const float *)p)[i];
        } else if (l->type == CUDA_R_16BF) {
            uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16;
            memcpy(&out[i], &bits, 4);
        } else {
            out[i] = fp8_value(((const uint8_t *)p)[i], l->type == CUDA_R_8F_E5M2) * scale[vec ? i / l->ld : 0];
        }
    }
}

/* The layouts must agree with the operation: op(A) (m,k), op(B) (k,n), C (m,n). */
static bool shapes_agree(const emu_lt_desc *d, const emu_lt_layout *a, const emu_lt_layout *b,
                         const emu_lt_layout *c)
{
    uint64_t m = c->rows, n = c->cols;
    uint64_t am = d->ta == CUBLAS_OP_N ? a->rows : a->cols, ak = d->ta == CUBLAS_OP_N ? a->cols : a->rows;
    uint64_t bk = d->tb == CUBLAS_OP_N ? b->rows : b->cols, bn = d->tb == CUBLAS_OP_N ? b->cols : b->rows;
    return am == m && bn == n && ak == bk;
}

extern "C" cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                                         cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                         cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                                         cublasLtMatmulPreference_t p, int requested,
                                                         cublasLtMatmulHeuristicResult_t *results, int *returned)
{
    (void)h;
    (void)p;
    *returned = 0;
    if (requested < 1 || !shapes_agree(d, a, b, c) || c->rows != dl->rows || c->cols != dl->cols ||
        c->type != CUDA_R_32F || dl->type != CUDA_R_32F || !types_agree(a->type, b->type))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (getenv("CUDA_EMU_LT_NONE"))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (is_fp8(a->type) && (d->ta != CUBLAS_OP_T || d->tb != CUBLAS_OP_N || a->ld % 16 || b->ld % 16 ||
                            (a->type == CUDA_R_8F_E5M2 && b->type == CUDA_R_8F_E5M2)))
        return CUBLAS_STATUS_NOT_SUPPORTED; /* cuBLASLt's fp8 rules */
    memset(&results[0], 0, sizeof results[0]);
    results[0].algo.data[0] = 0xE3u;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* D = alpha op(A) op(B) + beta C with C = D; with `run` false only the checks. */
static cublasStatus_t lt_matmul(bool run, const emu_lt_desc &d, float alpha, const void *a, const emu_lt_layout &la,
                                const void *b, const emu_lt_layout &lb, float beta, const void *c,
                                const emu_lt_layout &lc, void *dd, const emu_lt_layout &ld,
                                const cublasLtMatmulAlgo_t &algo)
{
    if (algo.data[0] != 0xE3u || !shapes_agree(&d, &la, &lb, &lc) || c != dd || lc.rows != ld.rows)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (lc.type != CUDA_R_32F || ld.type != CUDA_R_32F || !types_agree(la.type, lb.type) ||
        (is_fp8(la.type) && (d.ta != CUBLAS_OP_T || d.tb != CUBLAS_OP_N)))
        return CUBLAS_STATUS_INVALID_VALUE;
    int m = (int)lc.rows, n = (int)lc.cols, k = (int)(d.ta == CUBLAS_OP_N ? la.cols : la.rows);
    if (la.type == CUDA_R_32F)
        return sgemm(run, d.ta, d.tb, m, n, k, alpha, (const float *)a, (int)la.ld, (const float *)b, (int)lb.ld,
                     beta, (float *)dd, (int)lc.ld);
    /* typed operands: decoded into host vectors, multiplied with the same column-major sgemm */
    if ((d.a_mode || d.b_mode) && !is_fp8(la.type))
        return CUBLAS_STATUS_INVALID_VALUE; /* scale modes belong to fp8 operands */
    bool avec = d.a_mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    bool bvec = d.b_mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    if (!operand_ok(a, &la, d.a_scale, avec) || !operand_ok(b, &lb, d.b_scale, bvec) ||
        !in_block(dd, sizeof(float) * ((size_t)lc.ld * (size_t)(n - 1) + (size_t)m)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!run)
        return CUBLAS_STATUS_SUCCESS;
    std::vector<float> fa, fb;
    operand_f32(fa, a, &la, d.a_scale, avec);
    operand_f32(fb, b, &lb, d.b_scale, bvec);
    cblas_sgemm(CblasColMajor, d.ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                d.tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, alpha, fa.data(), (int)la.ld, fb.data(),
                (int)lb.ld, beta, (float *)dd, (int)lc.ld);
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                                         const void *a, cublasLtMatrixLayout_t la, const void *b,
                                         cublasLtMatrixLayout_t lb, const void *beta, const void *c,
                                         cublasLtMatrixLayout_t lc, void *dd, cublasLtMatrixLayout_t ld,
                                         const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes,
                                         cudaStream_t s)
{
    (void)h;
    (void)workspace;
    (void)workspace_bytes;
    if (!algo)
        return CUBLAS_STATUS_INVALID_VALUE;
    /* by value, as a capture keeps them: the caller may change or destroy the descriptor and
     * layouts once the call has returned, and alpha and beta are host scalars */
    emu_lt_desc dv = *d;
    emu_lt_layout av = *la, bv = *lb, cv = *lc, dl = *ld;
    cublasLtMatmulAlgo_t alg = *algo;
    float al = *(const float *)alpha, be = *(const float *)beta;
    return status_of(emu_enqueue(s, "cublasLtMatmul", [=](bool run) {
        return queued(lt_matmul(run, dv, al, a, av, b, bv, be, c, cv, dd, dl, alg));
    }));
}
