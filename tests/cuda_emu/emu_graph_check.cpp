/* emu_graph_check.cpp: the emulator's stream capture and graphs (emu_graphs.cpp) against CUDA's
 * rules, on its own (tests/cli/cuda_emulated.sh builds it against the emulator's objects): what a
 * capture records does not run until the graph is launched, then runs in order with the arguments
 * of the call; what CUDA forbids during a capture fails and invalidates it. Prints "ok: ..." per
 * check; the first failure exits 1. The refusals it provokes print "cuda_emu:" lines on stderr. */
#include "cuda_emu.h"

#include "cublasLt.h"
#include "cublas_v2.h"
#include <cub/device/device_radix_sort.cuh>

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#define CHECK(cond, ...)                                                                                             \
    do {                                                                                                             \
        if (!(cond)) {                                                                                               \
            fprintf(stderr, "FAIL (line %d): ", __LINE__);                                                           \
            fprintf(stderr, __VA_ARGS__);                                                                            \
            fputc('\n', stderr);                                                                                     \
            exit(1);                                                                                                 \
        }                                                                                                            \
    } while (0)

/* `call` returned `want`, and so did cudaGetLastError (which is then clear) unless it succeeded. */
#define EXPECT(call, want)                                                                                           \
    do {                                                                                                             \
        cudaError_t e_ = (call);                                                                                     \
        CHECK(e_ == (want), "%s returned %s, not %s", #call, cudaGetErrorName(e_), cudaGetErrorName(want));          \
        cudaError_t last_ = cudaGetLastError();                                                                      \
        CHECK(last_ == e_ || (want) == cudaSuccess, "%s left %s as the last error", #call, cudaGetErrorName(last_)); \
    } while (0)
#define OK(call) EXPECT(call, cudaSuccess)

__global__ void axpb(const float *x, float *y, float a, float b, int n)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n)
        y[i] = a * x[i] + b;
}

static const int N = 1000;

static void fill(float *p, float v)
{
    for (int i = 0; i < N; i++)
        p[i] = v;
}

static bool all(const float *p, float v)
{
    for (int i = 0; i < N; i++)
        if (p[i] != v)
            return false;
    return true;
}

static void launch_axpb(cudaStream_t s, const float *x, float *y, float a)
{
    emu_launch(EMU_CFG(dim3((N + 255) / 256), dim3(256), 0, s), axpb, x, y, a, 1.0f, N);
}

static enum cudaStreamCaptureStatus status_of(cudaStream_t s)
{
    enum cudaStreamCaptureStatus st;
    OK(cudaStreamIsCapturing(s, &st));
    return st;
}

static size_t node_count(cudaGraph_t g)
{
    size_t n = 0;
    OK(cudaGraphGetNodes(g, NULL, &n));
    return n;
}

/* Ends the capture on s, which must have been invalidated: no graph. */
static void end_invalidated(cudaStream_t s)
{
    int dummy;
    cudaGraph_t g = (cudaGraph_t)&dummy;
    CHECK(status_of(s) == cudaStreamCaptureStatusInvalidated, "the capture is not invalidated");
    EXPECT(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    CHECK(g == NULL, "an invalidated capture returned a graph");
    CHECK(status_of(s) == cudaStreamCaptureStatusNone, "the stream still captures after EndCapture");
}

/* Ends the capture on s and instantiates its graph (destroyed: the exec keeps its operations). */
static cudaGraphExec_t end_instantiate(cudaStream_t s, size_t nodes)
{
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    OK(cudaStreamEndCapture(s, &g));
    CHECK(g != NULL && node_count(g) == nodes, "the graph holds %zu nodes, not %zu", g ? node_count(g) : 0, nodes);
    OK(cudaGraphInstantiate(&x, g, 0));
    OK(cudaGraphDestroy(g));
    return x;
}

int main(void)
{
    cudaStream_t s;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(status_of(s) == cudaStreamCaptureStatusNone, "a new stream captures");

    EXPECT(cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeRelaxed), cudaErrorStreamCaptureUnsupported);
    EXPECT(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported);
    EXPECT(cudaStreamBeginCapture((cudaStream_t)(uintptr_t)0x1000, cudaStreamCaptureModeGlobal),
           cudaErrorInvalidResourceHandle);
    EXPECT(cudaStreamEndCapture(s, NULL), cudaErrorInvalidValue);
    cudaGraph_t none = NULL;
    EXPECT(cudaStreamEndCapture(s, &none), cudaErrorIllegalState);
    puts("ok: the legacy stream, the null stream and a handle that is no stream cannot capture; EndCapture "
         "without a capture is cudaErrorIllegalState");

    float *x, *y, *z, *w;
    OK(cudaMalloc((void **)&x, sizeof(float) * N));
    OK(cudaMalloc((void **)&y, sizeof(float) * N));
    OK(cudaMalloc((void **)&z, sizeof(float) * N));
    OK(cudaMalloc((void **)&w, sizeof(float) * N));
    for (int i = 0; i < N; i++)
        x[i] = (float)i; /* device memory is host memory here: what a host-side copy would do */
    fill(y, 7.0f);
    fill(z, 7.0f);

    /* a kernel, a device-to-device copy and a memset, recorded, not run */
    float a = 2.0f;
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    CHECK(status_of(s) == cudaStreamCaptureStatusActive, "no active capture after BeginCapture");
    CHECK(status_of(cudaStreamLegacy) == cudaStreamCaptureStatusNone, "the legacy stream captures");
    EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaErrorIllegalState);
    launch_axpb(s, x, y, a);
    OK(cudaGetLastError());
    a = 100.0f; /* too late: the launch keeps its arguments */
    OK(cudaMemcpyAsync(z, y, sizeof(float) * N, cudaMemcpyDeviceToDevice, s));
    OK(cudaMemsetAsync(y, 0, sizeof(float) * N, s));
    std::vector<float> host(N, 3.0f);
    OK(cudaMemcpyAsync(w, host.data(), sizeof(float) * N, cudaMemcpyHostToDevice, cudaStreamLegacy));
    CHECK(all(w, 3.0f), "a copy on another stream did not run at the call");
    float *tmp;
    OK(cudaMalloc((void **)&tmp, 64));
    CHECK(all(y, 7.0f) && all(z, 7.0f), "an operation ran during the capture");
    CHECK(status_of(s) == cudaStreamCaptureStatusActive, "the capture was invalidated");
    cudaGraph_t g = NULL;
    OK(cudaStreamEndCapture(s, &g));
    OK(cudaFree(tmp));
    CHECK(node_count(g) == 3, "cudaGraphGetNodes counts %zu nodes, not 3", node_count(g));
    cudaGraphNode_t nodes[5];
    size_t got = 5;
    OK(cudaGraphGetNodes(g, nodes, &got));
    CHECK(got == 3 && nodes[0] && nodes[2] && !nodes[3] && !nodes[4], "cudaGraphGetNodes filled %zu", got);
    got = 2;
    OK(cudaGraphGetNodes(g, nodes, &got));
    CHECK(got == 2, "cudaGraphGetNodes with room for 2 filled %zu", got);
    cudaGraphExec_t exec = NULL;
    EXPECT(cudaGraphInstantiate(&exec, g, 1), cudaErrorInvalidValue);
    OK(cudaGraphInstantiate(&exec, g, 0));
    OK(cudaGraphDestroy(g));
    CHECK(all(y, 7.0f) && all(z, 7.0f), "an operation ran at EndCapture or instantiation");
    puts("ok: in a capture a kernel, a device-to-device copy and a memset do not run; cudaMalloc (Relaxed) and "
         "a copy on another stream do; cudaGraphGetNodes counts 3");

    OK(cudaGraphLaunch(exec, s));
    for (int i = 0; i < N; i++)
        CHECK(z[i] == 2.0f * (float)i + 1.0f && y[i] == 0.0f, "after the launch z[%d] = %g, y[%d] = %g", i,
              (double)z[i], i, (double)y[i]);
    puts("ok: the launch runs them in order (kernel, copy, memset), with the kernel's arguments of the call");
    for (int i = 0; i < N; i++)
        x[i] = -(float)i;
    fill(y, 7.0f);
    fill(z, 7.0f);
    OK(cudaGraphLaunch(exec, cudaStreamLegacy));
    for (int i = 0; i < N; i++)
        CHECK(z[i] == -2.0f * (float)i + 1.0f && y[i] == 0.0f, "after the second launch z[%d] = %g", i,
              (double)z[i]);
    puts("ok: a second launch (on the legacy stream) reads the input's new contents");

    /* cuBLAS and cuBLASLt: C (3,2) = A (3,4) B (4,2), column-major */
    const int m = 3, n = 2, k = 4;
    float *A, *B, *C, *D;
    OK(cudaMalloc((void **)&A, sizeof(float) * m * k));
    OK(cudaMalloc((void **)&B, sizeof(float) * k * n));
    OK(cudaMalloc((void **)&C, sizeof(float) * m * n));
    OK(cudaMalloc((void **)&D, sizeof(float) * m * n));
    for (int i = 0; i < m * k; i++)
        A[i] = (float)(i % 5) - 2.0f;
    for (int i = 0; i < k * n; i++)
        B[i] = (float)(i % 3) + 0.5f;
    float ref[m * n];
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            ref[j * m + i] = 0.0f;
            for (int l = 0; l < k; l++)
                ref[j * m + i] += A[l * m + i] * B[j * k + l];
        }
    for (int i = 0; i < m * n; i++)
        C[i] = D[i] = 9.0f;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    CHECK(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS && cublasSetStream(blas, s) == CUBLAS_STATUS_SUCCESS &&
              cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, m, k, m) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, n, k) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, m) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &heur, &found) ==
                  CUBLAS_STATUS_SUCCESS &&
              found == 1,
          "cuBLAS / cuBLASLt setup");
    float alpha = 1.0f, beta = 0.0f;
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    CHECK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, A, m, B, k, &beta, C, m) ==
              CUBLAS_STATUS_SUCCESS,
          "cublasSgemm in a capture");
    CHECK(cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, D, lc, D, lc, &heur.algo, NULL, 0, s) ==
              CUBLAS_STATUS_SUCCESS,
          "cublasLtMatmul in a capture");
    alpha = 5.0f; /* too late: host scalars are read at the call */
    beta = 1.0f;
    CHECK(cublasLtMatmulDescDestroy(desc) == CUBLAS_STATUS_SUCCESS && cublasLtMatrixLayoutDestroy(la) == 0 &&
              cublasLtMatrixLayoutDestroy(lb) == 0 && cublasLtMatrixLayoutDestroy(lc) == 0,
          "destroying the descriptor and layouts"); /* the capture holds copies */
    for (int i = 0; i < m * n; i++)
        CHECK(C[i] == 9.0f && D[i] == 9.0f, "a product ran during the capture");
    cudaGraphExec_t gemms = end_instantiate(s, 2);
    OK(cudaGraphLaunch(gemms, s));
    for (int i = 0; i < m * n; i++)
        CHECK(C[i] == ref[i] && D[i] == ref[i], "element %d: cublasSgemm %g, cublasLtMatmul %g, expected %g", i,
              (double)C[i], (double)D[i], (double)ref[i]);
    puts("ok: cublasSgemm (on its handle's stream) and cublasLtMatmul captured, then replayed, give the product "
         "with the call's alpha and beta and the destroyed descriptor's settings");

    /* CUB's radix sort stand-in */
    int32_t *keys_in, *keys, *vals_in, *vals;
    const int32_t kin[6] = {5, 3, 5, 1, 0, 3}, kout[6] = {0, 1, 3, 3, 5, 5}, vout[6] = {4, 3, 1, 5, 0, 2};
    OK(cudaMalloc((void **)&keys_in, sizeof kin));
    OK(cudaMalloc((void **)&keys, sizeof kin));
    OK(cudaMalloc((void **)&vals_in, sizeof kin));
    OK(cudaMalloc((void **)&vals, sizeof kin));
    for (int i = 0; i < 6; i++) {
        keys_in[i] = kin[i];
        vals_in[i] = i;
        keys[i] = vals[i] = -1;
    }
    size_t temp_bytes = 0;
    OK(cub::DeviceRadixSort::SortPairs(NULL, temp_bytes, (const int32_t *)NULL, (int32_t *)NULL,
                                       (const int32_t *)NULL, (int32_t *)NULL, 6, 0, 4, s));
    void *temp;
    OK(cudaMalloc(&temp, temp_bytes));
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    OK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, (const int32_t *)keys_in, keys, (const int32_t *)vals_in,
                                       vals, 6, 0, 4, s));
    CHECK(keys[0] == -1 && vals[0] == -1, "the sort ran during the capture");
    cudaGraphExec_t sort = end_instantiate(s, 1);
    OK(cudaGraphLaunch(sort, s));
    for (int i = 0; i < 6; i++)
        CHECK(keys[i] == kout[i] && vals[i] == vout[i], "sorted pair %d: (%d, %d)", i, keys[i], vals[i]);
    puts("ok: CUB's SortPairs captured, then replayed, sorts stably");

    /* what a capture forbids: each fails and invalidates it */
    fill(y, 7.0f);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    launch_axpb(s, x, y, 2.0f);
    OK(cudaGetLastError());
    EXPECT(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    EXPECT(cudaMemsetAsync(y, 0, sizeof(float), s), cudaErrorStreamCaptureInvalidated);
    end_invalidated(s);
    CHECK(y[0] == 7.0f, "the kernel of an invalidated capture ran");
    puts("ok: cudaStreamSynchronize of the capturing stream fails and invalidates the capture; what follows on it "
         "fails; EndCapture gives cudaErrorStreamCaptureInvalidated and a NULL graph");

    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    EXPECT(cudaMemcpyAsync(host.data(), y, sizeof(float) * N, cudaMemcpyDeviceToHost, s),
           cudaErrorStreamCaptureUnsupported);
    end_invalidated(s);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    EXPECT(cudaMemcpyAsync(y, host.data(), sizeof(float) * N, cudaMemcpyHostToDevice, s),
           cudaErrorStreamCaptureUnsupported);
    end_invalidated(s);
    CHECK(host[0] == 3.0f && y[0] == 7.0f, "a refused copy ran");
    puts("ok: device-to-host and host-to-device copies on the capturing stream are refused");

    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    EXPECT(cudaMalloc((void **)&tmp, 64), cudaErrorStreamCaptureUnsupported);
    end_invalidated(s);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cudaError_t other = cudaErrorInvalidValue;
    std::thread t([&]() { other = cudaMalloc((void **)&tmp, 64); });
    t.join();
    CHECK(other == cudaSuccess, "cudaMalloc on another thread during a ThreadLocal capture: %s",
          cudaGetErrorName(other));
    CHECK(status_of(s) == cudaStreamCaptureStatusActive, "another thread's cudaMalloc invalidated the capture");
    float *tmp2;
    EXPECT(cudaMalloc((void **)&tmp2, 64), cudaErrorStreamCaptureUnsupported);
    end_invalidated(s);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    EXPECT(cudaFree(tmp), cudaErrorStreamCaptureUnsupported);
    end_invalidated(s);
    OK(cudaFree(tmp));
    void *pinned;
    OK(cudaMallocHost(&pinned, 64));
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    EXPECT(cudaFreeHost(pinned), cudaErrorStreamCaptureUnsupported);
    end_invalidated(s);
    OK(cudaFreeHost(pinned));
    puts("ok: cudaMalloc in a Global capture, or a ThreadLocal one's thread, fails (on another thread it runs); "
         "cudaFree and cudaFreeHost during a capture fail");

    cudaStream_t blocking;
    OK(cudaStreamCreateWithFlags(&blocking, cudaStreamDefault));
    OK(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeRelaxed));
    EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaErrorIllegalState);
    EXPECT(cudaStreamDestroy(blocking), cudaErrorIllegalState);
    enum cudaStreamCaptureStatus st;
    EXPECT(cudaStreamIsCapturing(cudaStreamLegacy, &st), cudaErrorStreamCaptureImplicit);
    CHECK(status_of(blocking) == cudaStreamCaptureStatusActive, "cudaStreamIsCapturing invalidated the capture");
    OK(cudaMemsetAsync(y, 0, sizeof(float), s)); /* another stream, not the legacy one: runs */
    CHECK(y[0] == 0.0f, "a memset on another stream did not run");
    EXPECT(cudaMemsetAsync(y, 1, sizeof(float), cudaStreamLegacy), cudaErrorStreamCaptureImplicit);
    end_invalidated(blocking);
    OK(cudaStreamDestroy(blocking));
    puts("ok: while a blocking stream captures, a second capture, destroying it, and the legacy stream are refused");

    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    EXPECT(cudaGraphLaunch(exec, s), cudaErrorStreamCaptureUnsupported);
    end_invalidated(s);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    emu_launch(EMU_CFG(dim3(1), dim3(2048), 0, s), axpb, (const float *)x, y, 2.0f, 1.0f, N);
    cudaError_t refused = cudaGetLastError();
    CHECK(refused == cudaErrorInvalidConfiguration, "a launch of 2048 threads: %s", cudaGetErrorName(refused));
    end_invalidated(s);
    puts("ok: a graph launch into the capturing stream and a launch of 2048 threads are refused at the call");

    cudaEvent_t ev;
    OK(cudaEventCreate(&ev));
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    OK(cudaEventRecord(ev, s));
    EXPECT(cudaEventSynchronize(ev), cudaErrorCapturedEvent);
    end_invalidated(s);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    OK(cudaEventRecord(ev, s));
    cudaGraphExec_t record = end_instantiate(s, 1);
    EXPECT(cudaEventSynchronize(ev), cudaErrorCapturedEvent);
    OK(cudaGraphLaunch(record, s));
    OK(cudaEventSynchronize(ev));
    puts("ok: waiting for an event recorded into a capture fails (and invalidates it) until a launch records it");

    /* cudaStreamWaitEvent: a live event and stream; an event recorded into a capture is waited for
     * only inside it, and the capturing stream waits for no event recorded outside it */
    cudaStream_t waiter;
    OK(cudaStreamCreateWithFlags(&waiter, cudaStreamNonBlocking));
    cudaEvent_t untimed, gone_event;
    OK(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming));
    OK(cudaEventRecord(untimed, cudaStreamLegacy));
    OK(cudaStreamWaitEvent(s, untimed, 0));
    OK(cudaStreamWaitEvent(cudaStreamLegacy, untimed, 0));
    EXPECT(cudaStreamWaitEvent((cudaStream_t)(uintptr_t)0x1000, untimed, 0), cudaErrorInvalidResourceHandle);
    EXPECT(cudaStreamWaitEvent(s, untimed, 1), cudaErrorInvalidValue);
    float ms = 0;
    EXPECT(cudaEventElapsedTime(&ms, untimed, untimed), cudaErrorInvalidResourceHandle);
    OK(cudaEventCreate(&gone_event));
    OK(cudaEventDestroy(gone_event));
    EXPECT(cudaEventDestroy(gone_event), cudaErrorInvalidResourceHandle);
    EXPECT(cudaStreamWaitEvent(s, gone_event, 0), cudaErrorInvalidResourceHandle);
    EXPECT(cudaEventRecord(gone_event, s), cudaErrorInvalidResourceHandle);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    OK(cudaEventRecord(ev, s));
    OK(cudaStreamWaitEvent(s, ev, 0));
    EXPECT(cudaStreamWaitEvent(waiter, ev, 0), cudaErrorCapturedEvent);
    end_invalidated(s);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    EXPECT(cudaStreamWaitEvent(s, untimed, 0), cudaErrorStreamCaptureUnsupported);
    end_invalidated(s);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    OK(cudaEventRecord(ev, s));
    OK(cudaStreamWaitEvent(s, ev, 0));
    cudaGraphExec_t waits = end_instantiate(s, 2);
    EXPECT(cudaStreamWaitEvent(waiter, ev, 0), cudaErrorCapturedEvent);
    OK(cudaGraphLaunch(waits, s));
    OK(cudaStreamWaitEvent(waiter, ev, 0));
    OK(cudaEventDestroy(untimed));
    OK(cudaStreamDestroy(waiter));
    puts("ok: cudaStreamWaitEvent takes live events and streams; an event recorded into a capture is waited for "
         "inside it, not outside until a launch records it; a capture waits for no event from outside it");

    /* checked again at the launch: a block freed since, and a kernel's shared memory limit lowered */
    float *gone;
    OK(cudaMalloc((void **)&gone, 64));
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    OK(cudaMemsetAsync(gone, 0, 64, s));
    OK(cudaMemsetAsync(z, 0, sizeof(float) * N, s));
    cudaGraphExec_t stale = end_instantiate(s, 2);
    OK(cudaFree(gone));
    fill(z, 7.0f);
    EXPECT(cudaGraphLaunch(stale, s), cudaErrorInvalidValue);
    CHECK(all(z, 7.0f), "the launch went on past a failed node");
    OK(cudaFuncSetAttribute((const void *)axpb, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    emu_launch(EMU_CFG(dim3((N + 255) / 256), dim3(256), 64 << 10, s), axpb, (const float *)x, y, 2.0f, 1.0f, N);
    OK(cudaGetLastError());
    cudaGraphExec_t big = end_instantiate(s, 1);
    OK(cudaFuncSetAttribute((const void *)axpb, cudaFuncAttributeMaxDynamicSharedMemorySize, 0));
    EXPECT(cudaGraphLaunch(big, s), cudaErrorInvalidValue);
    puts("ok: a launch checks each node again and stops at the first that fails");

    for (cudaGraphExec_t e : {exec, gemms, sort, record, waits, stale, big})
        OK(cudaGraphExecDestroy(e));
    EXPECT(cudaGraphExecDestroy(NULL), cudaErrorInvalidValue);
    OK(cudaEventDestroy(ev));
    CHECK(cublasLtMatmulPreferenceDestroy(pref) == CUBLAS_STATUS_SUCCESS && cublasLtDestroy(lt) == 0 &&
              cublasDestroy(blas) == 0,
          "cuBLAS teardown");
    for (void *p : {(void *)x, (void *)y, (void *)z, (void *)w, (void *)A, (void *)B, (void *)C, (void *)D,
                    (void *)keys_in, (void *)keys, (void *)vals_in, (void *)vals, temp})
        OK(cudaFree(p));
    OK(cudaStreamDestroy(s));
    puts("ok: everything destroyed (LeakSanitizer checks at exit)");
    return 0;
}
