/* cuda_emu.h: CUDA's device-side language on the CPU, for running the CUDA plugin's kernels
 * (plugins/cuda/kernels_*.cu) where there is no GPU. Included first (g++ -include) into each .cu
 * file after tests/cuda_emu/emu.mk (`make cuda-emu`) has rewritten its launches:
 *
 *     kernel<<<grid, block, smem, stream>>>(args)  ->  emu_launch(EMU_CFG(grid, block, smem, stream), kernel, args)
 *     extern __shared__ T name[];                   ->  T *name = (T *)emu_dynamic_smem();
 *
 * The model (emu_runtime.cpp): a launch runs its blocks one after another; inside a block every
 * CUDA thread is a fiber (its own stack, switched on the calling thread). __syncthreads is a
 * barrier of the block's threads and a warp shuffle a barrier of the warp's 32 lanes; a thread
 * that has returned no longer counts at either (as on the GPU). Between barriers the threads run
 * one after another, first to last in even blocks and last to first in odd ones, so a missing
 * barrier shows as a wrong value in one order. __shared__ variables are function statics (one
 * block at a time), and dynamic shared memory is filled with 0xff bytes (NaN floats) before each
 * block, so a read of a value no thread wrote shows up in the results. Launch checks follow
 * CUDA's: at most 1024 threads, grid.y and grid.z at most 65535, dynamic shared memory above
 * 48 KiB only after cudaFuncSetAttribute raised the kernel's limit, never above 227 KiB.
 *
 * Every operation queued to a stream (a launch, a copy, a memset, a cuBLAS or CUB call) goes
 * through emu_enqueue: it runs before the call returns, unless the stream is capturing
 * (cudaStreamBeginCapture): then it is checked as if it ran, and recorded, with its arguments as
 * at the call, to run when the captured graph is launched (emu_graphs.cpp).
 *
 * What it cannot show: races between blocks (they never overlap here), interleavings finer than
 * barrier to barrier, the timing and memory model of a real GPU, and CUB's or cuBLAS's own
 * kernels (stand-ins in include/).
 */
#ifndef CTITAN_CUDA_EMU_H
#define CTITAN_CUDA_EMU_H

#include "cuda_runtime_api.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
    unsigned x, y, z;
};
struct float2 {
    float x, y;
};
static inline float2 make_float2(float x, float y)
{
    return float2{x, y};
}

/* The launch's coordinates, per host thread. __thread (constant-initialized: no C++ TLS wrapper
 * and init function to call) and initial-exec: a read is one load at a fixed offset from the
 * thread pointer, where the default model for a shared object calls __tls_get_addr (which
 * AddressSanitizer intercepts) on every read of threadIdx in every kernel; the emulated plugin's
 * few bytes of thread-local storage fit in what the C library keeps for a dlopen'ed object. */
#define EMU_TLS __attribute__((tls_model("initial-exec")))
extern __thread uint3 threadIdx EMU_TLS, blockIdx EMU_TLS;
extern __thread dim3 blockDim EMU_TLS, gridDim EMU_TLS;

void __syncthreads(void);
void *emu_dynamic_smem(void);
/* Exchanges 8 bytes with lane (this lane ^ lanemask) of the warp: the shuffle's core. */
uint64_t emu_shfl_xor(uint64_t v, int lanemask);

template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int lanemask)
{
    (void)mask;
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = emu_shfl_xor(bits, lanemask);
    T r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

static inline unsigned long long atomicMin(unsigned long long *p, unsigned long long v)
{
    unsigned long long old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}
static inline unsigned atomicMax(unsigned *p, unsigned v)
{
    unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v > old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}

static inline unsigned __float_as_uint(float x)
{
    unsigned u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float __uint_as_float(unsigned u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
static inline float __fadd_rn(float a, float b)
{
    return a + b;
}
/* one rounding per call, as on the GPU (g++ -std=c++17 does not contract a * b + c into an FMA) */
static inline float __fmul_rn(float a, float b)
{
    return a * b;
}
static inline unsigned max(unsigned a, unsigned b)
{
    return a > b ? a : b;
}
static inline unsigned min(unsigned a, unsigned b)
{
    return a < b ? a : b;
}

/* ---- launches ---- */
struct emu_cfg {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
};
static inline emu_cfg emu_cfg_of(dim3 g, dim3 b, size_t smem = 0, cudaStream_t s = 0)
{
    return emu_cfg{g, b, smem, s};
}
#define EMU_CFG(...) emu_cfg_of(__VA_ARGS__)

/* ---- streams ---- */
/* Queues op to stream s: runs op(true) now, or when s captures, calls op(false) (the operation's
 * checks, made at the call as CUDA makes them) and, if that succeeds, keeps op for the graph,
 * where it runs as op(true), checks again included. A refusal on the capturing stream invalidates
 * the capture; so does any use of the legacy stream (cudaErrorStreamCaptureImplicit) while a
 * blocking stream captures. Returns what op returned or the refusal. */
cudaError_t emu_enqueue(cudaStream_t s, const char *kind, std::function<cudaError_t(bool run)> op);

/* Runs f on every thread of every block of cfg (or records why the launch is refused); queued
 * through emu_enqueue to cfg.stream, with f (the kernel's arguments by value) kept by a capture. */
void emu_run(const emu_cfg &cfg, const void *kernel, const std::function<void()> &f);

template <typename... P, typename... A> static inline void emu_launch(const emu_cfg &cfg, void (*kernel)(P...), A... args)
{
    std::function<void()> f = [=]() { kernel(args...); };
    emu_run(cfg, (const void *)kernel, f);
}

#endif
