/* nccl_conformance: the NCCL comm plugin against comm.h on real GPUs, exact values.
 *
 *   mpirun -np 1|2 nccl_conformance build/plugins/ctitan-nccl.so
 *
 * Built and run by tests/cli/nccl_plugin.sh (only where `nvidia-smi -L` lists a GPU; 2 ranks need
 * 2 GPUs, NCCL refuses two ranks on one device). The program is a stand-in host: it dlopens the
 * plugin, creates the comm (the plugin initialises MPI), and checks on device buffers
 *   all_reduce (f32 sum, in place max, i32 min, bf16 sum, 1 Mi elements), all_gather, reduce_scatter,
 *   broadcast, all_to_all, fp8 moves, started operations + wait, split (key order, colors),
 *   send/recv (2 ranks), count 0, argument errors, barrier, ordering with a bound stream (ABI 1.4),
 * and last the timeout: a 64 MB send nobody receives must fail with CT_ERR_TIMEOUT and the message
 * of comm.h within train_timeout_seconds (set to 20 here), after which the group refuses work.
 * Values are small integers, so every sum is exact in f32 and bf16. Each rank prints its failures
 * and exits non-zero if it has any.
 */
#include <ctitan/abi.h>
#include <ctitan/comm.h>
#include <ctitan/host.h>

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int failures, rank, size;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL rank %d %s:%d: ", rank, __FILE__, __LINE__); \
    printf(__VA_ARGS__); printf("\n"); fflush(stdout); } } while (0)

/* ---- the stand-in host ---- */
static char last_error[1024];
static void h_log(const ct_host *h, ct_log_level l, const char *f, ...) {
    (void)h; (void)l; va_list a; va_start(a, f); printf("rank %d log: ", rank); vprintf(f, a); printf("\n"); va_end(a);
}
static void h_err(const ct_host *h, const char *f, ...) {
    (void)h; va_list a; va_start(a, f); vsnprintf(last_error, sizeof last_error, f, a); va_end(a);
}
static void *h_alloc(const ct_host *h, size_t n, ct_mem_category c) {
    (void)h; (void)c; void *p = NULL; return posix_memalign(&p, 64, n ? n : 1) ? NULL : p;
}
static void h_free(const ct_host *h, void *p) { (void)h; free(p); }
static void h_account(const ct_host *h, ct_mem_category c, int64_t d) { (void)h; (void)c; (void)d; }
static const ct_option_spec *spec;
static const char *opt(const char *key) {
    if (strcmp(key, "train_timeout_seconds") == 0) return "20";
    for (const ct_option_spec *o = spec; o && o->key; o++) if (strcmp(o->key, key) == 0) return o->default_value;
    CHECK(0, "plugin asked for undeclared option '%s'", key);
    return NULL;
}
static ct_status h_int(const ct_host *h, const char *k, int64_t *o) {
    (void)h; const char *v = opt(k); if (!v) return CT_ERR_INVALID; *o = strtoll(v, NULL, 10); return CT_OK;
}
static ct_status h_float(const ct_host *h, const char *k, double *o) {
    (void)h; const char *v = opt(k); if (!v) return CT_ERR_INVALID; *o = strtod(v, NULL); return CT_OK;
}
static ct_status h_bool(const ct_host *h, const char *k, int *o) {
    (void)h; const char *v = opt(k); if (!v) return CT_ERR_INVALID; *o = strcmp(v, "true") == 0; return CT_OK;
}
static ct_status h_string(const ct_host *h, const char *k, const char **o) {
    (void)h; const char *v = opt(k); if (!v) return CT_ERR_INVALID; *o = v; return CT_OK;
}
static void h_trace(const ct_host *h, const char *n) { (void)h; (void)n; }
static const ct_host host = {
    .struct_size = sizeof(ct_host), .abi_major = CT_ABI_MAJOR, .abi_minor = CT_ABI_MINOR, .log = h_log,
    .set_error = h_err, .mem_alloc = h_alloc, .mem_free = h_free, .mem_account = h_account, .opt_int = h_int,
    .opt_float = h_float, .opt_bool = h_bool, .opt_string = h_string, .trace_begin = h_trace, .trace_end = h_trace};

/* ---- device buffers ---- */
static void *dev(size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) { printf("FAIL rank %d: cudaMalloc(%zu): %s\n", rank, bytes, cudaGetErrorString(e)); exit(1); }
    return p;
}
static void up(void *d, const void *h, size_t bytes) {
    cudaError_t e = cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) { printf("FAIL rank %d: copy to device: %s\n", rank, cudaGetErrorString(e)); exit(1); }
}
static void down(void *h, const void *d, size_t bytes) {
    cudaError_t e = cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) { printf("FAIL rank %d: copy to host: %s\n", rank, cudaGetErrorString(e)); exit(1); }
}

/* Compares n floats with what was expected; reports the first difference. */
static void expect_f32(const char *what, const float *got, const float *want, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            CHECK(0, "%s: [%lld] = %g, expected %g", what, (long long)i, got[i], want[i]);
            return;
        }
    }
}
static uint16_t to_bf16(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)(u >> 16); } /* exact for small ints */
static float from_bf16(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }

static const ct_comm_api *api;
static ct_comm *comm;
static ct_comm_group *world;
enum { N = 1031, BIG = 1 << 20 };

/* Calls an operation and checks it returned CT_OK. */
#define OK(call, what) do { last_error[0] = '\0'; ct_status st_ = (call); \
    CHECK(st_ == CT_OK, "%s: status %d '%s'", what, (int)st_, last_error); } while (0)

static void test_all_reduce(void) {
    float *h = malloc(BIG * sizeof *h), *want = malloc(BIG * sizeof *want), *got = malloc(BIG * sizeof *got);
    float *d_in = dev(BIG * sizeof(float)), *d_out = dev(BIG * sizeof(float));
    for (int64_t n = N; n <= BIG; n = n == N ? BIG : BIG + 1) {
        for (int64_t i = 0; i < n; i++) {
            h[i] = (float)(rank + i % 7);
            want[i] = (float)(size * (size - 1) / 2 + size * (i % 7));
        }
        up(d_in, h, (size_t)n * 4);
        OK(api->all_reduce(comm, world, d_in, d_out, n, CT_F32, CT_REDUCE_SUM, NULL), "all_reduce f32 sum");
        down(got, d_out, (size_t)n * 4);
        expect_f32(n == N ? "all_reduce f32 sum" : "all_reduce f32 sum (1 Mi)", got, want, n);
    }
    /* in place, max */
    for (int i = 0; i < N; i++) { h[i] = (float)(rank * 10 + i % 3); want[i] = (float)((size - 1) * 10 + i % 3); }
    up(d_in, h, N * 4);
    OK(api->all_reduce(comm, world, d_in, d_in, N, CT_F32, CT_REDUCE_MAX, NULL), "all_reduce f32 max in place");
    down(got, d_in, N * 4);
    expect_f32("all_reduce f32 max in place", got, want, N);
    /* i32 min */
    int32_t hi[N], gi[N];
    for (int i = 0; i < N; i++) hi[i] = rank - i % 5;
    up(d_in, hi, sizeof hi);
    OK(api->all_reduce(comm, world, d_in, d_out, N, CT_I32, CT_REDUCE_MIN, NULL), "all_reduce i32 min");
    down(gi, d_out, sizeof gi);
    for (int i = 0; i < N; i++)
        if (gi[i] != -(i % 5)) { CHECK(0, "all_reduce i32 min: [%d] = %d, expected %d", i, gi[i], -(i % 5)); break; }
    /* bf16 sum */
    uint16_t hb[N], gb[N];
    for (int i = 0; i < N; i++) hb[i] = to_bf16((float)((rank + 1) * (i % 4)));
    up(d_in, hb, sizeof hb);
    OK(api->all_reduce(comm, world, d_in, d_out, N, CT_BF16, CT_REDUCE_SUM, NULL), "all_reduce bf16 sum");
    down(gb, d_out, sizeof gb);
    for (int i = 0; i < N; i++) {
        float w = (float)((i % 4) * size * (size + 1) / 2);
        if (from_bf16(gb[i]) != w) { CHECK(0, "all_reduce bf16 sum: [%d] = %g, expected %g", i, from_bf16(gb[i]), w); break; }
    }
    cudaFree(d_in); cudaFree(d_out); free(h); free(want); free(got);
}

static void test_gather_scatter(void) {
    size_t all = (size_t)size * N;
    float *h = malloc(all * 4), *want = malloc(all * 4), *got = malloc(all * 4);
    float *d_small = dev(N * 4), *d_all = dev(all * 4);
    /* all_gather: recv block j is rank j's send */
    for (int i = 0; i < N; i++) h[i] = (float)(100 * rank + i);
    for (int j = 0; j < size; j++) for (int i = 0; i < N; i++) want[(size_t)j * N + i] = (float)(100 * j + i);
    up(d_small, h, N * 4);
    OK(api->all_gather(comm, world, d_small, d_all, N, CT_F32, NULL), "all_gather f32");
    down(got, d_all, all * 4);
    expect_f32("all_gather f32", got, want, (int64_t)all);
    /* reduce_scatter: rank r receives the sum over ranks of their block r */
    for (int j = 0; j < size; j++) for (int i = 0; i < N; i++) h[(size_t)j * N + i] = (float)(rank * 1000 + j * 10 + i % 5);
    for (int i = 0; i < N; i++) want[i] = (float)(1000 * size * (size - 1) / 2 + size * (rank * 10 + i % 5));
    up(d_all, h, all * 4);
    OK(api->reduce_scatter(comm, world, d_all, d_small, N, CT_F32, CT_REDUCE_SUM, NULL), "reduce_scatter f32 sum");
    down(got, d_small, N * 4);
    expect_f32("reduce_scatter f32 sum", got, want, N);
    /* broadcast from the last rank */
    int root = size - 1;
    for (int i = 0; i < N; i++) { h[i] = rank == root ? (float)(7 + i % 11) : -1.0f; want[i] = (float)(7 + i % 11); }
    up(d_small, h, N * 4);
    OK(api->broadcast(comm, world, d_small, N, CT_F32, root, NULL), "broadcast f32");
    down(got, d_small, N * 4);
    expect_f32("broadcast f32", got, want, N);
    /* all_to_all: block j of send goes to rank j; block j of recv came from rank j */
    float *d_all2 = dev(all * 4);
    for (int j = 0; j < size; j++) for (int i = 0; i < N; i++) {
        h[(size_t)j * N + i] = (float)(rank * 100 + j * 10 + i % 3);
        want[(size_t)j * N + i] = (float)(j * 100 + rank * 10 + i % 3);
    }
    up(d_all, h, all * 4);
    OK(api->all_to_all(comm, world, d_all, d_all2, N, CT_F32, NULL), "all_to_all f32");
    down(got, d_all2, all * 4);
    expect_f32("all_to_all f32", got, want, (int64_t)all);
    /* fp8 moves bit for bit (values below 0x40 avoid the NaN encodings of both formats) */
    uint8_t *b = malloc(all), *gb = malloc(all);
    for (int i = 0; i < N; i++) b[i] = (uint8_t)((rank * 31 + i) & 0x3f);
    up(d_small, b, N);
    for (int k = 0; k < 2; k++) {
        ct_dtype dt = k ? CT_F8_E5M2 : CT_F8_E4M3;
        OK(api->all_gather(comm, world, d_small, d_all, N, dt, NULL), "all_gather fp8");
        down(gb, d_all, all);
        for (size_t i = 0; i < all; i++) {
            uint8_t w = (uint8_t)(((int)(i / N) * 31 + (int)(i % N)) & 0x3f);
            if (gb[i] != w) { CHECK(0, "all_gather fp8 (%d): [%zu] = %u, expected %u", k, i, gb[i], w); break; }
        }
    }
    cudaFree(d_small); cudaFree(d_all); cudaFree(d_all2); free(h); free(want); free(got); free(b); free(gb);
}

/* Two operations started, then waited for in order. */
static void test_started(void) {
    size_t all = (size_t)size * N;
    float h[N], want[N], *got = malloc(all * 4), *wall = malloc(all * 4);
    float *a = dev(N * 4), *g_in = dev(N * 4), *g_out = dev(all * 4);
    for (int i = 0; i < N; i++) { h[i] = (float)(i % 9); want[i] = (float)(size * (i % 9)); }
    up(a, h, sizeof h);
    for (int i = 0; i < N; i++) h[i] = (float)(rank + 2 * i);
    up(g_in, h, sizeof h);
    for (int j = 0; j < size; j++) for (int i = 0; i < N; i++) wall[(size_t)j * N + i] = (float)(j + 2 * i);
    ct_comm_request *r1 = NULL, *r2 = NULL;
    OK(api->all_reduce(comm, world, a, a, N, CT_F32, CT_REDUCE_SUM, &r1), "started all_reduce");
    OK(api->all_gather(comm, world, g_in, g_out, N, CT_F32, &r2), "started all_gather");
    CHECK(r1 && r2, "started operations gave no request");
    if (r1) OK(api->wait(comm, r1), "wait all_reduce");
    if (r2) OK(api->wait(comm, r2), "wait all_gather");
    down(got, a, N * 4);
    expect_f32("started all_reduce", got, want, N);
    down(got, g_out, all * 4);
    expect_f32("started all_gather", got, wall, (int64_t)all);
    /* count 0: nothing to move, NULL buffers allowed, both forms */
    ct_comm_request *r0 = NULL;
    OK(api->all_reduce(comm, world, NULL, NULL, 0, CT_F32, CT_REDUCE_SUM, NULL), "all_reduce of 0");
    OK(api->all_gather(comm, world, NULL, NULL, 0, CT_F32, &r0), "started all_gather of 0");
    if (r0) OK(api->wait(comm, r0), "wait all_gather of 0");
    cudaFree(a); cudaFree(g_in); cudaFree(g_out); free(got); free(wall);
}

static void test_split(void) {
    /* one group, reversed: key = -rank puts the last world rank first */
    ct_comm_group *rev = NULL, *par = NULL;
    int r = -1, s = -1;
    OK(api->split(comm, world, 0, -rank, "rev", &rev), "split rev");
    if (rev) {
        OK(api->group_rank(comm, rev, &r, &s), "group_rank rev");
        CHECK(r == size - 1 - rank && s == size, "rev: rank %d of %d, expected %d of %d", r, s, size - 1 - rank, size);
        float *d = dev(4), one = (float)(r + 1), got = 0;
        up(d, &one, 4);
        OK(api->all_reduce(comm, rev, d, d, 1, CT_F32, CT_REDUCE_SUM, NULL), "all_reduce on rev");
        down(&got, d, 4);
        CHECK(got == (float)(size * (size + 1) / 2), "all_reduce on rev: %g", got);
        OK(api->barrier(comm, rev), "barrier on rev");
        cudaFree(d);
    }
    /* colors: even and odd world ranks */
    OK(api->split(comm, world, rank % 2, rank, "parity", &par), "split parity");
    if (par) {
        OK(api->group_rank(comm, par, &r, &s), "group_rank parity");
        int want_s = (size + (rank % 2 ? 0 : 1)) / 2;
        CHECK(r == rank / 2 && s == want_s, "parity: rank %d of %d, expected %d of %d", r, s, rank / 2, want_s);
        OK(api->barrier(comm, par), "barrier on parity");
    }
    if (par) api->group_free(comm, par);
    if (rev) api->group_free(comm, rev);
}

static void test_send_recv(void) {
    if (size < 2) { printf("rank %d: note: send/recv needs 2 ranks, skipped\n", rank); return; }
    if (rank > 1) return;
    float h[N], want[N], got[N];
    float *d = dev(N * 4);
    /* rank 0 sends then receives, rank 1 receives then sends (NCCL pairs by order) */
    for (int round = 0; round < 2; round++) {
        int sender = round;
        if (rank == sender) {
            for (int i = 0; i < N; i++) h[i] = (float)(round * 1000 + i);
            up(d, h, sizeof h);
            ct_comm_request *req = NULL;
            OK(api->send(comm, world, d, N, CT_F32, 1 - rank, 7, round ? &req : NULL), "send");
            if (req) OK(api->wait(comm, req), "wait send");
        } else {
            OK(api->recv(comm, world, d, N, CT_F32, 1 - rank, 7, NULL), "recv");
            down(got, d, sizeof got);
            for (int i = 0; i < N; i++) want[i] = (float)(round * 1000 + i);
            expect_f32("recv", got, want, N);
        }
    }
    cudaFree(d);
}

/* Errors found before anything is enqueued leave the group usable. */
static void test_errors(void) {
    float *d = dev(N * 4);
    last_error[0] = '\0';
    CHECK(api->send(comm, world, d, N, CT_F32, size, 0, NULL) == CT_ERR_INVALID && strstr(last_error, "outside"),
          "send to rank %d: '%s'", size, last_error);
    CHECK(api->all_reduce(comm, world, d, d, N, (ct_dtype)99, CT_REDUCE_SUM, NULL) == CT_ERR_INVALID, "dtype 99");
    CHECK(api->all_reduce(comm, world, d, d, -1, CT_F32, CT_REDUCE_SUM, NULL) == CT_ERR_INVALID, "count -1");
    CHECK(api->all_reduce(comm, world, d, d, N, CT_F32, (ct_reduce_op)9, NULL) == CT_ERR_INVALID, "reduce op 9");
    CHECK(api->reduce_scatter(comm, world, d, d, 1, CT_F32, (ct_reduce_op)0, NULL) == CT_ERR_INVALID, "reduce op 0");
    CHECK(api->all_reduce(comm, world, NULL, d, N, CT_F32, CT_REDUCE_SUM, NULL) == CT_ERR_INVALID, "NULL send");
    CHECK(api->broadcast(comm, world, d, N, CT_F32, -1, NULL) == CT_ERR_INVALID, "root -1");
    CHECK(api->wait(comm, NULL) == CT_ERR_INVALID, "wait(NULL)");
    CHECK(api->split(comm, world, -3, 0, "neg", &(ct_comm_group *){NULL}) == CT_ERR_INVALID, "color -3");
    OK(api->barrier(comm, world), "barrier after argument errors");
    cudaFree(d);
}

/* A 64 MB send to the next rank (to itself with one rank) that nobody receives. */
static void test_timeout(void) {
    int64_t n = 16 << 20;
    float *d = dev((size_t)n * 4);
    cudaMemset(d, 0, (size_t)n * 4);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ct_comm_request *req = NULL;
    last_error[0] = '\0';
    ct_status st = api->send(comm, world, d, n, CT_F32, (rank + 1) % size, 0, &req);
    if (st == CT_OK && req) st = api->wait(comm, req);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("rank %d: unmatched send: status %d after %.1f s: %s\n", rank, (int)st, s, last_error);
    CHECK(st == CT_ERR_TIMEOUT, "unmatched send: status %d, expected CT_ERR_TIMEOUT (%d)", (int)st, (int)CT_ERR_TIMEOUT);
    CHECK(strstr(last_error, "no completion within 20 s; a rank died or is stuck") && strstr(last_error, "send of 16777216 f32"),
          "timeout message '%s'", last_error);
    CHECK(s >= 19 && s < 60, "timed out after %.1f s, expected about 20", s);
    CHECK(api->barrier(comm, world) == CT_ERR_INVALID && strstr(last_error, "aborted"),
          "the aborted world still takes work: '%s'", last_error);
    /* d may still be referenced by the aborted kernel for a moment; the process ends soon */
}

/* ABI 1.4 bind_stream: a non-blocking stream stands in for the device's compute stream. A 64 MB
 * memset queued on it must land before the all_reduce that reads the buffer (the comm's stream
 * waits for an event recorded on it), and a copy queued on it after wait() must see the sum (wait
 * makes it wait for the collective), with no host synchronisation in between. */
static void test_bound_stream(void) {
    if (!CT_HAS_FIELD(api, ct_comm_api, bind_stream) || !api->bind_stream) {
        CHECK(0, "bind_stream is missing (ABI 1.4)");
        return;
    }
    enum { M = 16 << 20 }; /* floats */
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "cudaStreamCreateWithFlags");
    float *d = dev((size_t)M * 4), *h = NULL;
    CHECK(cudaMallocHost((void **)&h, (size_t)M * 4) == cudaSuccess, "cudaMallocHost");
    OK(api->bind_stream(comm, (ct_stream *)s), "bind_stream");
    cudaMemsetAsync(d, 0x3f, (size_t)M * 4, s); /* every float 0x3f3f3f3f */
    ct_comm_request *req = NULL;
    OK(api->all_reduce(comm, world, d, d, M, CT_F32, CT_REDUCE_SUM, &req), "all_reduce after a memset on the bound stream");
    if (req) OK(api->wait(comm, req), "wait");
    cudaMemcpyAsync(h, d, (size_t)M * 4, cudaMemcpyDeviceToHost, s);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "cudaStreamSynchronize");
    uint32_t bits = 0x3f3f3f3fu;
    float one, want;
    memcpy(&one, &bits, 4);
    want = one * (float)size;
    for (int64_t i = 0; i < M; i += 4099)
        if (h[i] != want) { CHECK(0, "bound stream: [%lld] = %g, expected %g (ordering by events broken)", (long long)i, h[i], want); break; }
    cudaFreeHost(h);
    cudaFree(d);
    /* the stream stays bound (the plugin never destroys it); the timeout test follows on it */
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: mpirun -np 1|2 %s ctitan-nccl.so\n", argv[0]); return 2; }
    void *so = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!so) { printf("FAIL dlopen %s: %s\n", argv[1], dlerror()); return 1; }
    ct_plugin_entry_fn entry = (ct_plugin_entry_fn)dlsym(so, CT_PLUGIN_ENTRY_NAME);
    ct_plugin_info info = {.struct_size = sizeof info};
    if (!entry || entry(&host, &info) != CT_OK || info.kind != CT_KIND_COMM || !info.api) {
        printf("FAIL %s is not a comm plugin\n", argv[1]);
        return 1;
    }
    api = info.api;
    spec = info.options;
    ct_status st = api->create(&host, &comm);
    if (st != CT_OK) { printf("FAIL create: status %d '%s'\n", (int)st, last_error); return 1; }
    OK(api->world(comm, &world), "world");
    OK(api->group_rank(comm, world, &rank, &size), "group_rank world");
    printf("rank %d of %d: running\n", rank, size);
    fflush(stdout);

    test_all_reduce();
    test_gather_scatter();
    test_started();
    test_split();
    test_send_recv();
    test_errors();
    OK(api->barrier(comm, world), "barrier");
    test_bound_stream();
    test_timeout();

    api->destroy(comm);
    printf("rank %d of %d: %s: %d failure(s)\n", rank, size, failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
