/* device.c: the CPU device plugin (ctitan-cpu.so): entry point, lifecycle, memory, and the
 * ct_device_api table.
 *
 * The host checks each op's arguments before it gets here (core/host/devcheck.c: shapes, null
 * pointers, groups, formats, ...); an op checks what only it reads (ids and targets in its
 * memory), reports through host->set_error, and hands the work to the f32 kernels
 * (kernels_impl.h instanced by kernels_f32.c, and kernels_fp8.c for the float8 ops of ABI 1.2). The ABI 1.3 ops (vocabulary-sharded embedding and cross-entropy,
 * copy_2d), the elementwise ops of ABI 2.1 (ew_*), the explicit-position rope and blockwise
 * attention of ABI 2.3 and the frequency-table rope of ABI 2.4 are kernels_impl.h's too. Memory is
 * plain host memory: the host does the accounting,
 * copies are memcpy, and every op has finished when it returns. The copies of ABI 2.9
 * (copy_async) are the exception: queued, they run when waited for (copy_wait, synchronize,
 * host_free), so a host that reads or overwrites too early sees it here too.
 *
 * Threads: option `threads` (0 = one per available core) sets both OpenMP and OpenBLAS. Every op
 * sets the OpenMP thread count of the calling thread again, so ops called from another host
 * thread use the same count (and give the same bits).
 */
#define _DEFAULT_SOURCE /* mmap's MAP_ANONYMOUS and MAP_NORESERVE, madvise */
#include "ctitan/abi.h"
#include "ctitan/device.h"
#include "ctitan/host.h"
#include "ctitan/util.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cblas.h>
#include <omp.h>
#include <pthread.h>

#include "cpu_math.h"
#include "kernels.h"
#include "moe.h"

/* The ABI's opaque ct_device is this state: create hands out a cpu_device *. */
typedef struct cpu_copy_job {
    void *dst;
    const void *src;
    size_t bytes;
} cpu_copy_job;

typedef struct ct_device {
    const ct_host *host;
    int threads;
    size_t limit; /* memory_limit_mb in bytes, 0: none */
    size_t used;  /* bytes held (malloc_usable_size of every live block), updated atomically */
    /* copy_async's queue (ABI 2.9): copies issued and not yet run, oldest first. A copy runs when
     * it, or a later one, is waited for (or at synchronize and host_free): the latest moment the
     * contract allows, so a host that forgets a wait reads stale bytes here too. */
    pthread_mutex_t copies_lock;
    cpu_copy_job *pending;
    size_t n_pending, cap_pending;
    uint64_t issued, done; /* tickets handed out; copies run (tickets done+1.. are pending) */
} cpu_device;

/* ---------------------------------------------------------------- errors and checks */

/* Reports "op: message" through the host and returns `status`. */
__attribute__((format(printf, 4, 5))) static ct_status
cpu_fail(const cpu_device *d, ct_status status, const char *op, const char *fmt, ...)
{
    if (d && d->host && d->host->set_error) {
        char msg[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        d->host->set_error(d->host, "%s: %s", op, msg);
    }
    return status;
}

/* The thread count applies per calling thread in OpenMP; OpenBLAS follows it. */
static void cpu_enter(const cpu_device *d)
{
    if (omp_get_max_threads() != d->threads)
        omp_set_num_threads(d->threads);
}

/* First i with ids[i] outside [0, limit), or -1 when all are valid. With use_skip, entries equal
 * to `skip` (cross-entropy's ignore_index) are valid whatever their value. */
static int64_t cpu_find_bad_id(const int32_t *ids, int64_t n, int64_t limit, int use_skip,
                               int32_t skip)
{
    for (int64_t i = 0; i < n; i++) {
        if (use_skip && ids[i] == skip)
            continue;
        if (ids[i] < 0 || ids[i] >= limit)
            return i;
    }
    return -1;
}

/* For moe.c, which sees the device only through these two. */
void cpu_device_enter(const ct_device *d)
{
    cpu_enter(d);
}

ct_status cpu_device_fail(const ct_device *d, ct_status status, const char *op, const char *fmt, ...)
{
    if (d && d->host && d->host->set_error) {
        char msg[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        d->host->set_error(d->host, "%s: %s", op, msg);
    }
    return status;
}

/* ---------------------------------------------------------------- lifecycle */

static const ct_option_spec cpu_options[] = {
    {sizeof(ct_option_spec), "threads", CT_OPT_INT, "0",
     "worker threads for OpenMP and OpenBLAS; 0 = the available cores divided among this node's ranks", NULL, NULL},
    {sizeof(ct_option_spec), "memory_limit_mb", CT_OPT_FLOAT, "0",
     "the most memory the device holds at once, in MiB (a GPU's capacity, to rehearse a layout on a CPU); an "
     "allocation past it fails as out of memory; 0 = no limit", "[0, 1e9]", NULL},
    {0},
};

/* ---- OpenBLAS under an address-space limit (ulimit -v)
 * OpenBLAS (0.3.21) keeps a 128 MiB buffer per thread of its own and one per concurrent caller (the
 * attention kernels call sgemm from every OpenMP thread at once), maps each the first time it is
 * needed, and when that mmap is refused retries forever: a run under a tight limit spun with no
 * output. So under a limit the room is checked before OpenBLAS is asked for its threads, and every
 * buffer it can use is mapped at start-up (blas_memory_alloc / blas_memory_free: mapped buffers
 * stay for reuse), before parameters and activations take the room. Measured with VmSize (OpenBLAS
 * loaded with OMP_NUM_THREADS=1, as the core loads it under a limit): setting T threads maps
 * (T - 1) x 128 MiB; T concurrent callers map T x 128 MiB more, and the OpenMP team a stack for each
 * extra thread. Without a limit nothing here runs. */
#define CPU_BLAS_BUFFER ((int64_t)128 << 20)

/* OpenBLAS's buffer pool; weak, so another BLAS without them leaves the warm-up to the first calls */
extern void *blas_memory_alloc(int procpos) __attribute__((weak));
extern void blas_memory_free(void *buffer) __attribute__((weak));

/* Bytes still mappable under RLIMIT_AS (the limit minus VmSize), or -1 with no limit. */
static int64_t cpu_address_space_left(int64_t *limit)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > INT64_MAX)
        return -1;
    if (limit)
        *limit = (int64_t)rl.rlim_cur;
    int64_t used = 0;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmSize:", 7))
            used = strtoll(line + 7, NULL, 10) * 1024;
    if (f)
        fclose(f);
    return (int64_t)rl.rlim_cur > used ? (int64_t)rl.rlim_cur - used : 0;
}

/* What OpenBLAS and OpenMP map for `threads` threads beyond what is mapped now, when OpenBLAS has
 * buffers for `loaded` threads of its own and none for callers yet. */
static int64_t cpu_blas_need(int threads, int loaded, int64_t stack)
{
    int64_t more = threads > loaded ? threads - loaded : 0;
    return (more + threads) * CPU_BLAS_BUFFER + (int64_t)(threads - 1) * stack;
}

static ct_status cpu_blas_room(const cpu_device *unborn, int threads)
{
    int64_t limit = 0, left = cpu_address_space_left(&limit);
    if (left < 0)
        return CT_OK;
    struct rlimit rl;
    int64_t stack = (int64_t)8 << 20; /* a thread's stack is RLIMIT_STACK (glibc), 8 MiB by default */
    if (getrlimit(RLIMIT_STACK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < ((rlim_t)1 << 32))
        stack = (int64_t)rl.rlim_cur;
    int loaded = openblas_get_num_threads();
    int64_t need = cpu_blas_need(threads, loaded, stack);
    if (need <= left)
        return CT_OK;
    int fit = 0; /* the most threads that fit, 0 when even one does not */
    while (fit < threads && cpu_blas_need(fit + 1, loaded, stack) <= left)
        fit++;
    char advice[64];
    if (fit > 0)
        snprintf(advice, sizeof advice, "set device.threads=%d or raise ulimit -v", fit);
    else
        snprintf(advice, sizeof advice, "raise ulimit -v");
    return cpu_fail(unborn, CT_ERR_NOMEM, "create",
                    "%d threads need %lld MiB more address space for OpenBLAS's buffers (128 MiB "
                    "per thread and per caller) than the limit (ulimit -v %lld KiB) leaves (%lld "
                    "MiB): %s",
                    threads, (long long)(need >> 20), (long long)(limit >> 10),
                    (long long)(left >> 20), advice);
}

/* Starts the OpenMP team and maps one OpenBLAS buffer per concurrent caller, now. */
static void cpu_blas_warm_up(const cpu_device *d)
{
    cpu_enter(d);
#pragma omp parallel
    {
        (void)0;
    }
    if (!blas_memory_alloc || !blas_memory_free)
        return;
    void *held[4096]; /* threads <= 4096 (cpu_create) */
    int n = 0;
    while (n < d->threads && (held[n] = blas_memory_alloc(0)) != NULL)
        n++;
    while (n > 0)
        blas_memory_free(held[--n]);
}

static ct_status cpu_create(const ct_host *host, ct_device **dev)
{
    if (!dev)
        return CT_ERR_INVALID;
    *dev = NULL;
    int64_t threads = 0;
    if (host && host->opt_int) {
        ct_status st = host->opt_int(host, "threads", &threads);
        if (st != CT_OK && st != CT_ERR_INVALID)
            return st;
        if (st != CT_OK)
            threads = 0;
    }
    double limit_mb = 0;
    if (host && host->opt_float && host->opt_float(host, "memory_limit_mb", &limit_mb) != CT_OK)
        limit_mb = 0;
    cpu_device unborn = {.host = host, .threads = 1}; /* reports errors before the device exists */
    if (!(limit_mb >= 0 && limit_mb <= 1e9))
        return cpu_fail(&unborn, CT_ERR_INVALID, "create", "option memory_limit_mb = %g, expected 0 (no limit) to 1e9",
                        limit_mb);
    if (threads < 0 || threads > 4096)
        return cpu_fail(&unborn, CT_ERR_INVALID, "create",
                        "option threads = %lld, expected 0 (one per core) to 4096",
                        (long long)threads);
    if (threads == 0) { /* the cores this process may run on, shared among the ranks on this node */
        static const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"};
        int local = 1;
        for (size_t i = 0; i < sizeof vars / sizeof vars[0] && local == 1; i++)
            if (getenv(vars[i]) && atoi(getenv(vars[i])) > 1)
                local = atoi(getenv(vars[i]));
        threads = omp_get_num_procs() / local;
        if (threads < 1)
            threads = 1;
    }
    ct_status room = cpu_blas_room(&unborn, (int)threads);
    if (room != CT_OK)
        return room;
    cpu_device *d = calloc(1, sizeof *d);
    if (!d)
        return cpu_fail(&unborn, CT_ERR_NOMEM, "create", "cannot allocate the device");
    d->host = host;
    d->threads = (int)threads;
    d->limit = (size_t)(limit_mb * 1048576.0);
    pthread_mutex_init(&d->copies_lock, NULL);
    omp_set_num_threads(d->threads);
    openblas_set_num_threads(d->threads);
    if (cpu_address_space_left(NULL) >= 0)
        cpu_blas_warm_up(d);
    if (host && host->log)
        host->log(host, CT_LOG_DEBUG, "%d threads (OpenMP and OpenBLAS)", d->threads);
    *dev = d;
    return CT_OK;
}

static void cpu_destroy(ct_device *dev)
{
    cpu_device *d = dev;
    if (d) {
        free(d->pending); /* copies never waited for: their blocks are gone with the caller's */
        pthread_mutex_destroy(&d->copies_lock);
    }
    free(dev);
}

static ct_status cpu_info(ct_device *dev, ct_device_info *out)
{
    cpu_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    if (!out)
        return cpu_fail(d, CT_ERR_INVALID, "info", "null output");
    if (out->struct_size == 0)
        out->struct_size = sizeof *out;
    if (CT_HAS_FIELD(out, ct_device_info, name))
        out->name = "cpu";
    if (CT_HAS_FIELD(out, ct_device_info, threads))
        out->threads = d->threads;
    if (CT_HAS_FIELD(out, ct_device_info, memory_bytes)) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        out->memory_bytes = pages > 0 && page > 0 ? (int64_t)pages * page : 0;
        if (d->limit)
            out->memory_bytes = (int64_t)d->limit;
    }
    return CT_OK;
}

/* Best rate of a square sgemm over ~0.3 s. */
/* f32 flops per cycle of one core: vector lanes x 2 (an FMA counts two) x 2 FMA units, as server
 * cores since Haswell, Skylake-SP Gold and Zen have. A core with one unit (or AVX-512 run at half
 * rate) is over-counted, so MFU then reads low, never above 100%. */
static int cpu_flops_per_cycle(const char **isa)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        *isa = "AVX-512: 16 lanes x 2 FMA units x 2";
        return 64;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        *isa = "AVX2: 8 lanes x 2 FMA units x 2";
        return 32;
    }
    if (__builtin_cpu_supports("avx")) {
        *isa = "AVX: 8 lanes x (1 mul + 1 add)";
        return 16;
    }
    *isa = "SSE: 4 lanes x (1 mul + 1 add)";
    return 8;
#elif defined(__aarch64__)
    *isa = "NEON: 4 lanes x 2 FMA units x 2";
    return 16;
#else
    *isa = "scalar FMA";
    return 2;
#endif
}

/* The highest clock the cores report, GHz (0 if unknown): cpufreq's maximum (turbo included), else
 * the largest 'cpu MHz' of /proc/cpuinfo (in a VM often the nominal clock). */
static double cpu_max_ghz(const char **from)
{
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "r");
    long khz = 0;
    if (f) {
        int ok = fscanf(f, "%ld", &khz) == 1 && khz > 0;
        fclose(f);
        if (ok) {
            *from = "cpuinfo_max_freq";
            return (double)khz / 1e6;
        }
    }
    double best = 0, mhz;
    char line[512];
    if (!(f = fopen("/proc/cpuinfo", "r")))
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "cpu MHz : %lf", &mhz) == 1 && mhz > best)
            best = mhz;
    fclose(f);
    *from = "/proc/cpuinfo cpu MHz";
    return best / 1e3;
}

/* The f32 matmul peak: the cores' own figure (threads x clock x flops per cycle), or a best-of-N
 * sgemm probe when that reads higher (the clock figure is then below the real one, as with turbo
 * under a VM's nominal 'cpu MHz'). One line says which and how. */
static ct_status cpu_measure_peak_flops(ct_device *dev, double *flops_per_s)
{
    cpu_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    if (!flops_per_s)
        return cpu_fail(d, CT_ERR_INVALID, "measure_peak_flops", "null output");
    /* every rank of every run pays for this probe at start-up: 1024^3 reads OpenBLAS's 1536^3 rate
     * (best of 5 each, 1 and 2 threads, within a 2-core VM's noise) in a third of the time */
    const int n = 1024;
    size_t bytes = (size_t)n * n * sizeof(float);
    float *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes),
          *c = aligned_alloc(64, bytes);
    if (!a || !b || !c) {
        free(a);
        free(b);
        free(c);
        return cpu_fail(d, CT_ERR_NOMEM, "measure_peak_flops", "cannot allocate 3 x %zu bytes",
                        bytes);
    }
    for (size_t i = 0; i < (size_t)n * n; i++) {
        a[i] = (float)(i % 7) * 0.01f;
        b[i] = (float)(i % 5) * 0.02f;
    }
    cpu_enter(d);
    double best = 1e30, start = ct_util_now();
    int reps = 0;
    for (int rep = 0; rep < 20; rep++) {
        double t0 = ct_util_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c,
                    n);
        double dt = ct_util_now() - t0;
        if (rep > 0 && dt < best) /* rep 0 warms up caches and threads */
            best = dt;
        reps = rep;
        if (rep >= 2 && ct_util_now() - start > 0.1)
            break;
    }
    free(a);
    free(b);
    free(c);
    double probe = 2.0 * n * n * (double)n / best;
    const char *isa = "", *from = "";
    int fpc = cpu_flops_per_cycle(&isa);
    double ghz = cpu_max_ghz(&from), figure = (double)d->threads * ghz * 1e9 * fpc;
    *flops_per_s = figure > probe ? figure : probe;
    if (!d->host || !d->host->log)
        return CT_OK;
    if (figure >= probe)
        d->host->log(d->host, CT_LOG_INFO,
                     "peak %.1f GFLOP/s f32 = %d threads x %.2f GHz (%s) x %d flops/cycle (%s); "
                     "sgemm %d^3 probe, best of %d: %.1f GFLOP/s",
                     figure / 1e9, d->threads, ghz, from, fpc, isa, n, reps, probe / 1e9);
    else
        d->host->log(d->host, CT_LOG_INFO,
                     "peak %.1f GFLOP/s f32 from an sgemm %d^3 probe, best of %d: above the %d threads x "
                     "%.2f GHz (%s) x %d flops/cycle (%s) = %.1f figure, so the cores run faster than "
                     "that clock",
                     probe / 1e9, n, reps, d->threads, ghz, from, fpc, isa, figure / 1e9);
    return CT_OK;
}

/* ---------------------------------------------------------------- memory */

/* A 64-byte aligned block for `op` (alloc, host_alloc) into *out: CT_OK, or the error reported. */
static ct_status cpu_block(cpu_device *d, const char *op, size_t bytes, void **out)
{
    if (!d)
        return CT_ERR_INVALID;
    if (!out)
        return cpu_fail(d, CT_ERR_INVALID, op, "null output");
    *out = NULL;
    if (bytes > SIZE_MAX - 64)
        return cpu_fail(d, CT_ERR_INVALID, op, "size %zu is too large", bytes);
    size_t rounded = (bytes + 63) / 64 * 64; /* aligned_alloc wants a multiple of the alignment */
    *out = aligned_alloc(64, rounded ? rounded : 64);
    return *out ? CT_OK : cpu_fail(d, CT_ERR_NOMEM, op, "cannot allocate %zu bytes", bytes);
}

static ct_status cpu_alloc(ct_device *dev, size_t bytes, void **out)
{
    cpu_device *d = dev;
    ct_status st = cpu_block(d, "alloc", bytes, out);
    if (st != CT_OK)
        return st;
    void *p = *out;
    *out = NULL;
    size_t held = malloc_usable_size(p);
    size_t now = __atomic_add_fetch(&d->used, held, __ATOMIC_RELAXED);
    if (d->limit && now > d->limit) {
        __atomic_sub_fetch(&d->used, held, __ATOMIC_RELAXED);
        free(p);
        return cpu_fail(d, CT_ERR_NOMEM, "alloc",
                        "%.1f MiB more would pass memory_limit_mb %.0f (%.1f MiB held)", (double)bytes / 1048576.0,
                        (double)d->limit / 1048576.0, (double)(now - held) / 1048576.0);
    }
    *out = p;
    return CT_OK;
}

static void cpu_free(ct_device *dev, void *p)
{
    cpu_device *d = dev;
    if (p && d)
        __atomic_sub_fetch(&d->used, malloc_usable_size(p), __ATOMIC_RELAXED);
    free(p);
}

/* Growable regions (ABI 2.8): address space from mmap with no access and no swap reserved, made
 * readable and writable as far as the host asks, in 2 MiB steps; what is given back is dropped
 * (MADV_DONTNEED) and closed again. A page in front of the region holds its sizes. Backed bytes
 * count against memory_limit_mb as blocks do. */
#define CPU_REGION_STEP ((size_t)2 << 20)
#define CPU_REGION_MAGIC 0x6374726567696f6eull /* "ctregion" */

typedef struct cpu_region {
    uint64_t magic;
    size_t reserved, backed;
} cpu_region;

static size_t page_bytes(void)
{
    long pg = sysconf(_SC_PAGESIZE);
    return pg > 0 ? (size_t)pg : 4096;
}

static cpu_region *region_of(void *base)
{
    cpu_region *r = base ? (cpu_region *)((char *)base - page_bytes()) : NULL;
    return r && r->magic == CPU_REGION_MAGIC ? r : NULL;
}

static ct_status cpu_region_reserve(ct_device *dev, size_t max_bytes, void **base)
{
    cpu_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    if (!base)
        return cpu_fail(d, CT_ERR_INVALID, "region_reserve", "null output");
    *base = NULL;
    size_t pg = page_bytes();
    if (!max_bytes || max_bytes > ((size_t)1 << 46))
        return cpu_fail(d, CT_ERR_INVALID, "region_reserve", "size %zu is not 1 byte to 64 TiB", max_bytes);
    size_t reserved = (max_bytes + CPU_REGION_STEP - 1) / CPU_REGION_STEP * CPU_REGION_STEP;
    char *map = mmap(NULL, pg + reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED)
        return cpu_fail(d, CT_ERR_NOMEM, "region_reserve", "cannot reserve %zu bytes of address space", reserved);
    if (mprotect(map, pg, PROT_READ | PROT_WRITE) != 0) {
        munmap(map, pg + reserved);
        return cpu_fail(d, CT_ERR_NOMEM, "region_reserve", "cannot open the region's header page");
    }
    *(cpu_region *)map = (cpu_region){CPU_REGION_MAGIC, reserved, 0};
    *base = map + pg;
    return CT_OK;
}

static ct_status cpu_region_resize(ct_device *dev, void *base, size_t bytes, size_t *backed)
{
    cpu_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    cpu_region *r = region_of(base);
    if (!r)
        return cpu_fail(d, CT_ERR_INVALID, "region_resize", "%p is not a region of this device", base);
    if (bytes > r->reserved)
        return cpu_fail(d, CT_ERR_INVALID, "region_resize", "%zu bytes is more than the region's %zu", bytes,
                        r->reserved);
    size_t want = (bytes + CPU_REGION_STEP - 1) / CPU_REGION_STEP * CPU_REGION_STEP;
    char *b = base;
    if (want > r->backed) {
        size_t more = want - r->backed, now = __atomic_add_fetch(&d->used, more, __ATOMIC_RELAXED);
        if (d->limit && now > d->limit) {
            __atomic_sub_fetch(&d->used, more, __ATOMIC_RELAXED);
            return cpu_fail(d, CT_ERR_NOMEM, "region_resize",
                            "%.1f MiB more would pass memory_limit_mb %.0f (%.1f MiB held)", (double)more / 1048576.0,
                            (double)d->limit / 1048576.0, (double)(now - more) / 1048576.0);
        }
        if (mprotect(b + r->backed, more, PROT_READ | PROT_WRITE) != 0) {
            __atomic_sub_fetch(&d->used, more, __ATOMIC_RELAXED);
            return cpu_fail(d, CT_ERR_NOMEM, "region_resize", "cannot back %zu bytes more", more);
        }
    } else if (want < r->backed) {
        size_t less = r->backed - want;
        madvise(b + want, less, MADV_DONTNEED);
        mprotect(b + want, less, PROT_NONE);
        __atomic_sub_fetch(&d->used, less, __ATOMIC_RELAXED);
    }
    r->backed = want;
    if (backed)
        *backed = want;
    return CT_OK;
}

static void cpu_region_release(ct_device *dev, void *base)
{
    cpu_device *d = dev;
    cpu_region *r = region_of(base);
    if (!r)
        return;
    if (d)
        __atomic_sub_fetch(&d->used, r->backed, __ATOMIC_RELAXED);
    size_t total = page_bytes() + r->reserved;
    r->magic = 0;
    munmap(r, total);
}

static ct_status cpu_copy(ct_device *dev, void *dst, const void *src, size_t bytes, ct_copy_kind kind)
{
    (void)dev;
    (void)kind; /* every kind is a memmove here */
    if (bytes > 0)
        memmove(dst, src, bytes);
    return CT_OK;
}

static ct_status cpu_zero(ct_device *dev, void *p, size_t bytes)
{
    (void)dev;
    if (bytes > 0)
        memset(p, 0, bytes);
    return CT_OK;
}

/* Runs the queued copies up to ticket `upto`, oldest first. */
static void cpu_run_copies(cpu_device *d, uint64_t upto)
{
    pthread_mutex_lock(&d->copies_lock);
    size_t n = 0;
    while (n < d->n_pending && d->done < upto) {
        memcpy(d->pending[n].dst, d->pending[n].src, d->pending[n].bytes);
        n++;
        d->done++;
    }
    if (n && n < d->n_pending) /* (nothing queued: pending may be NULL) */
        memmove(d->pending, d->pending + n, sizeof *d->pending * (d->n_pending - n));
    d->n_pending -= n;
    pthread_mutex_unlock(&d->copies_lock);
}

static ct_status cpu_synchronize(ct_device *dev)
{
    cpu_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    cpu_run_copies(d, UINT64_MAX);
    return CT_OK;
}

/* ---------------------------------------------------------------- copies beside the work (ABI 2.9) */

/* Host memory for offloaded activations: plain aligned memory, not counted as the device's (it is
 * what a GPU's host holds, not what its device does). */
static ct_status cpu_host_alloc(ct_device *dev, size_t bytes, void **out)
{
    return cpu_block(dev, "host_alloc", bytes, out);
}

static void cpu_host_free(ct_device *dev, void *p)
{
    cpu_device *d = dev;
    if (d)
        cpu_run_copies(d, UINT64_MAX);
    free(p);
}

static ct_status cpu_copy_async(ct_device *dev, void *dst, const void *src, size_t bytes, ct_copy_kind kind,
                                uint64_t *ticket)
{
    cpu_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    if (!ticket)
        return cpu_fail(d, CT_ERR_INVALID, "copy_async", "null ticket");
    if (kind != CT_COPY_H2D && kind != CT_COPY_D2H)
        return cpu_fail(d, CT_ERR_INVALID, "copy_async", "copy kind %d, expected CT_COPY_H2D or CT_COPY_D2H", (int)kind);
    if (bytes && (!dst || !src))
        return cpu_fail(d, CT_ERR_INVALID, "copy_async", "null pointer");
    if (bytes && (uintptr_t)dst < (uintptr_t)src + bytes && (uintptr_t)src < (uintptr_t)dst + bytes)
        return cpu_fail(d, CT_ERR_INVALID, "copy_async", "overlapping ranges");
    pthread_mutex_lock(&d->copies_lock);
    if (d->n_pending == d->cap_pending) {
        size_t cap = d->cap_pending ? 2 * d->cap_pending : 16;
        cpu_copy_job *v = realloc(d->pending, sizeof *v * cap);
        if (!v) {
            pthread_mutex_unlock(&d->copies_lock);
            return cpu_fail(d, CT_ERR_NOMEM, "copy_async", "cannot queue a copy");
        }
        d->pending = v;
        d->cap_pending = cap;
    }
    d->pending[d->n_pending++] = (cpu_copy_job){dst, src, bytes};
    *ticket = ++d->issued;
    pthread_mutex_unlock(&d->copies_lock);
    return CT_OK;
}

static ct_status cpu_copy_wait(ct_device *dev, uint64_t ticket)
{
    cpu_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    pthread_mutex_lock(&d->copies_lock);
    uint64_t issued = d->issued;
    pthread_mutex_unlock(&d->copies_lock);
    if (ticket > issued)
        return cpu_fail(d, CT_ERR_INVALID, "copy_wait", "ticket %llu not issued (%llu so far)",
                        (unsigned long long)ticket, (unsigned long long)issued);
    cpu_run_copies(d, ticket);
    return CT_OK;
}

/* ---------------------------------------------------------------- dense algebra */

/* A GEMM's (m, n, k): non-negative and within BLAS's int. */
static ct_status cpu_gemm_shape_check(cpu_device *d, const char *op, int64_t m, int64_t n, int64_t k)
{
    if (m < 0 || n < 0 || k < 0)
        return cpu_fail(d, CT_ERR_INVALID, op, "negative shape m=%lld n=%lld k=%lld", (long long)m,
                        (long long)n, (long long)k);
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX)
        return cpu_fail(d, CT_ERR_INVALID, op, "shape m=%lld n=%lld k=%lld exceeds the BLAS int range",
                        (long long)m, (long long)n, (long long)k);
    return CT_OK;
}

static ct_status cpu_matmul(ct_device *dev, float *c, const float *a, const float *b, int64_t m,
                            int64_t n, int64_t k, int trans_a, int trans_b, float alpha, float beta)
{
    if (m == 0 || n == 0)
        return CT_OK;
    cpu_enter(dev);
    matmul_f32(c, a, b, (int)m, (int)n, (int)k, trans_a, trans_b, alpha, beta);
    return CT_OK;
}

static ct_status cpu_axpy(ct_device *dev, float *y, const float *x, float alpha, int64_t n)
{
    cpu_enter(dev);
    axpy_f32(y, x, alpha, n);
    return CT_OK;
}

static ct_status cpu_add(ct_device *dev, float *out, const float *a, const float *b, int64_t n)
{
    cpu_enter(dev);
    add_f32(out, a, b, n);
    return CT_OK;
}

static ct_status cpu_scale(ct_device *dev, float *x, float alpha, int64_t n)
{
    cpu_enter(dev);
    scale_f32(x, alpha, n);
    return CT_OK;
}

static ct_status cpu_sum(ct_device *dev, double *out, const float *x, int64_t n)
{
    cpu_enter(dev);
    *out = sum_f32(x, n);
    return CT_OK;
}

/* ABI 1.5: the sum stays in device memory (here the host's: nothing to wait for) */
static ct_status cpu_sum_to_device(ct_device *dev, float *out, const float *x, int64_t n)
{
    double sum = 0;
    ct_status st = cpu_sum(dev, &sum, x, n);
    if (st == CT_OK)
        *out = (float)sum;
    return st;
}

static ct_status cpu_sum_squares(ct_device *dev, double *out, const float *x, int64_t n)
{
    cpu_enter(dev);
    *out = sum_squares_f32(x, n);
    return CT_OK;
}

/* ---------------------------------------------------------------- layers */

/* ABI 2.23: the table holds rows [begin, begin + rows) of the vocabulary. strict (begin 0): an id
 * outside them is an error; otherwise its row is 0 (forward) or skipped (backward). One kernel each
 * way, so the whole table and a shard add up repeated ids in the same order. */
static ct_status cpu_embedding(cpu_device *d, const char *op, int backward, float *dst,
                               const int32_t *ids, const float *src, int64_t n, int64_t c,
                               int64_t begin, int64_t rows, int strict)
{
    if (strict) {
        int64_t bad = cpu_find_bad_id(ids, n, rows, 0, 0);
        if (bad >= 0)
            return cpu_fail(d, CT_ERR_INVALID, op, "ids[%lld] = %d is outside [0, %lld)",
                            (long long)bad, ids[bad], (long long)rows);
    }
    if (n == 0 || c == 0 || (backward && rows == 0))
        return CT_OK;
    if (strict && (!dst || !src))
        return cpu_fail(d, CT_ERR_INVALID, op, "null pointer");
    cpu_enter(d);
    if (backward)
        embedding_backward_f32(dst, ids, src, n, c, begin, rows);
    else
        embedding_forward_f32(dst, ids, src, n, c, begin, rows);
    return CT_OK;
}

static ct_status cpu_embedding_forward_general(ct_device *dev, float *out, const int32_t *ids,
                                               const float *table, int64_t n, int64_t c,
                                               int64_t begin, int64_t rows, int strict)
{
    return cpu_embedding(dev, "embedding_forward_general", 0, out, ids, table, n, c, begin, rows,
                         strict);
}

static ct_status cpu_embedding_backward_general(ct_device *dev, float *dtable, const int32_t *ids,
                                                const float *dout, int64_t n, int64_t c,
                                                int64_t begin, int64_t rows, int strict)
{
    return cpu_embedding(dev, "embedding_backward_general", 1, dtable, ids, dout, n, c, begin,
                         rows, strict);
}

static ct_status cpu_rmsnorm_forward(ct_device *dev, float *out, float *rstd, const float *x,
                                     const float *w, int64_t n, int64_t c, float eps)
{
    if (n == 0)
        return CT_OK;
    cpu_enter(dev);
    rmsnorm_forward_f32(out, rstd, x, w, n, c, eps);
    return CT_OK;
}

static ct_status cpu_rmsnorm_backward_input(ct_device *dev, float *dx, const float *dout, const float *x,
                                            const float *w, const float *rstd, int64_t n, int64_t c)
{
    if (n == 0 || c == 0)
        return CT_OK;
    cpu_enter(dev);
    rmsnorm_backward_input_f32(dx, dout, x, w, rstd, n, c);
    return CT_OK;
}

static ct_status cpu_rmsnorm_backward_weight(ct_device *dev, float *dw, const float *dout,
                                             const float *x, const float *rstd, int64_t n,
                                             int64_t c)
{
    if (n == 0 || c == 0)
        return CT_OK;
    cpu_enter(dev);
    rmsnorm_backward_weight_f32(dw, dout, x, rstd, n, c);
    return CT_OK;
}

static ct_status cpu_layernorm_forward(ct_device *dev, float *out, float *mean, float *rstd,
                                       const float *x, const float *w, const float *b, int64_t n,
                                       int64_t c, float eps)
{
    if (n == 0)
        return CT_OK;
    cpu_enter(dev);
    layernorm_forward_f32(out, mean, rstd, x, w, b, n, c, eps);
    return CT_OK;
}

static ct_status cpu_layernorm_backward_input(ct_device *dev, float *dx, const float *dout,
                                              const float *x, const float *w, const float *mean,
                                              const float *rstd, int64_t n, int64_t c)
{
    if (n == 0 || c == 0)
        return CT_OK;
    cpu_enter(dev);
    layernorm_backward_input_f32(dx, dout, x, w, mean, rstd, n, c);
    return CT_OK;
}

static ct_status cpu_layernorm_backward_weight(ct_device *dev, float *dw, float *db, const float *dout,
                                               const float *x, const float *mean, const float *rstd,
                                               int64_t n, int64_t c)
{
    if (n == 0 || c == 0)
        return CT_OK;
    cpu_enter(dev);
    layernorm_backward_weight_f32(dw, db, dout, x, mean, rstd, n, c);
    return CT_OK;
}

static ct_status cpu_bias_forward(ct_device *dev, float *out, const float *x, const float *bias,
                                  int64_t n, int64_t c)
{
    if (n == 0 || c == 0)
        return CT_OK;
    cpu_enter(dev);
    bias_forward_f32(out, x, bias, n, c);
    return CT_OK;
}

static ct_status cpu_bias_backward(ct_device *dev, float *dbias, const float *dout, int64_t n, int64_t c)
{
    if (n == 0 || c == 0)
        return CT_OK;
    cpu_enter(dev);
    bias_backward_f32(dbias, dout, n, c);
    return CT_OK;
}

/* ABI 2.23: RoPE at positions pos (NULL: 0..t-1) with the table inv_freq (NULL: theta's). */
static ct_status cpu_rope(cpu_device *d, const char *op, float *out, const float *x,
                          const int32_t *pos, const float *inv_freq, float theta, int64_t b,
                          int64_t t, int64_t h, int64_t hd, int backward)
{
    if (b == 0 || t == 0 || h == 0 || hd == 0)
        return CT_OK;
    cpu_enter(d);
    int rc = backward ? rope_backward_f32(out, x, pos, inv_freq, theta, b, t, h, hd)
                      : rope_forward_f32(out, x, pos, inv_freq, theta, b, t, h, hd);
    if (rc != 0)
        return cpu_fail(d, CT_ERR_NOMEM, op, "cannot allocate the cos/sin table");
    return CT_OK;
}

static ct_status cpu_rope_forward_general(ct_device *dev, float *out, const float *x,
                                          const int32_t *pos, const float *inv_freq, float theta,
                                          int64_t b, int64_t t, int64_t h, int64_t hd)
{
    return cpu_rope(dev, "rope_forward_general", out, x, pos, inv_freq, theta, b, t, h, hd, 0);
}

static ct_status cpu_rope_backward_general(ct_device *dev, float *dx, const float *dout,
                                           const int32_t *pos, const float *inv_freq, float theta,
                                           int64_t b, int64_t t, int64_t h, int64_t hd)
{
    return cpu_rope(dev, "rope_backward_general", dx, dout, pos, inv_freq, theta, b, t, h, hd, 1);
}

static ct_status cpu_attention_forward(ct_device *dev, float *out, float *lse, const float *q,
                                       const float *k, const float *v, int64_t b, int64_t t,
                                       int64_t h, int64_t kvh, int64_t hd)
{
    cpu_device *d = dev;
    if (b == 0 || t == 0 || h == 0)
        return CT_OK;
    cpu_enter(d);
    if (attention_forward_f32(out, lse, q, k, v, b, t, h, kvh, hd) != 0)
        return cpu_fail(d, CT_ERR_NOMEM, "attention_forward", "cannot allocate scratch memory");
    return CT_OK;
}

static ct_status cpu_attention_backward(ct_device *dev, float *dq, float *dk, float *dv,
                                        const float *dout, const float *q, const float *k,
                                        const float *v, const float *out, const float *lse,
                                        int64_t b, int64_t t, int64_t h, int64_t kvh, int64_t hd)
{
    cpu_device *d = dev;
    if (b == 0 || t == 0 || h == 0)
        return CT_OK;
    cpu_enter(d);
    if (attention_backward_f32(dq, dk, dv, dout, q, k, v, out, lse, b, t, h, kvh, hd) != 0)
        return cpu_fail(d, CT_ERR_NOMEM, "attention_backward", "cannot allocate scratch memory");
    return CT_OK;
}

/* ---------------------------------------------------------------- context parallel (ABI 2.3) */

static ct_status cpu_attention_block_forward(ct_device *dev, float *out, float *lse, const float *q,
                                             const float *k, const float *v, const int32_t *q_pos,
                                             const int32_t *k_pos, int64_t b, int64_t tq,
                                             int64_t tk, int64_t h, int64_t kvh, int64_t hd)
{
    cpu_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    const char *op = "attention_block_forward";
    if (b == 0 || tq == 0 || h == 0)
        return CT_OK;
    cpu_enter(d);
    if (tk == 0) { /* an empty key block: no query sees a key */
        memset(out, 0, (size_t)(b * tq * h * hd) * sizeof(float));
        for (int64_t i = 0; i < b * h * tq; i++)
            lse[i] = -INFINITY;
        return CT_OK;
    }
    if (attention_block_forward_f32(out, lse, q, k, v, q_pos, k_pos, b, tq, tk, h, kvh, hd) != 0)
        return cpu_fail(d, CT_ERR_NOMEM, op, "cannot allocate scratch memory");
    return CT_OK;
}

static ct_status cpu_attention_merge(ct_device *dev, float *out, float *lse, const float *out2,
                                     const float *lse2, int64_t b, int64_t t, int64_t h, int64_t hd)
{
    if (b == 0 || t == 0 || h == 0)
        return CT_OK;
    cpu_enter(dev);
    attention_merge_f32(out, lse, out2, lse2, b, t, h, hd);
    return CT_OK;
}

static ct_status cpu_attention_block_backward(ct_device *dev, float *dq, float *dk, float *dv,
                                              const float *dout, const float *q, const float *k,
                                              const float *v, const float *out, const float *lse,
                                              const int32_t *q_pos, const int32_t *k_pos, int64_t b,
                                              int64_t tq, int64_t tk, int64_t h, int64_t kvh,
                                              int64_t hd)
{
    cpu_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    const char *op = "attention_block_backward";
    if (b == 0 || tq == 0 || tk == 0 || h == 0)
        return CT_OK;
    cpu_enter(d);
    if (attention_block_backward_f32(dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, b, tq, tk,
                                     h, kvh, hd) != 0)
        return cpu_fail(d, CT_ERR_NOMEM, op, "cannot allocate scratch memory");
    return CT_OK;
}

static ct_status cpu_attention_doc_forward(ct_device *dev, float *out, float *lse, const float *q,
                                           const float *k, const float *v, const int32_t *q_pos,
                                           const int32_t *k_pos, const int32_t *q_doc,
                                           const int32_t *k_doc, int64_t b, int64_t tq, int64_t tk,
                                           int64_t h, int64_t kvh, int64_t hd)
{
    cpu_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    if (b == 0 || tq == 0 || h == 0)
        return CT_OK;
    cpu_enter(d);
    if (tk == 0) { /* an empty key block: no query sees a key */
        memset(out, 0, (size_t)(b * tq * h * hd) * sizeof(float));
        for (int64_t i = 0; i < b * h * tq; i++)
            lse[i] = -INFINITY;
        return CT_OK;
    }
    if (attention_doc_forward_f32(out, lse, q, k, v, q_pos, k_pos, q_doc, k_doc, b, tq, tk, h, kvh,
                                  hd) != 0)
        return cpu_fail(d, CT_ERR_NOMEM, "attention_doc_forward", "cannot allocate scratch memory");
    return CT_OK;
}

static ct_status cpu_attention_doc_backward(ct_device *dev, float *dq, float *dk, float *dv,
                                            const float *dout, const float *q, const float *k,
                                            const float *v, const float *out, const float *lse,
                                            const int32_t *q_pos, const int32_t *k_pos,
                                            const int32_t *q_doc, const int32_t *k_doc, int64_t b,
                                            int64_t tq, int64_t tk, int64_t h, int64_t kvh,
                                            int64_t hd)
{
    cpu_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    if (b == 0 || tq == 0 || tk == 0 || h == 0)
        return CT_OK;
    cpu_enter(d);
    if (attention_doc_backward_f32(dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, q_doc, k_doc,
                                   b, tq, tk, h, kvh, hd) != 0)
        return cpu_fail(d, CT_ERR_NOMEM, "attention_doc_backward", "cannot allocate scratch memory");
    return CT_OK;
}

static ct_status cpu_swiglu_forward(ct_device *dev, float *out, const float *a, const float *g,
                                    int64_t n)
{
    cpu_enter(dev);
    swiglu_forward_f32(out, a, g, n);
    return CT_OK;
}

static ct_status cpu_swiglu_backward(ct_device *dev, float *da, float *dg, const float *dout,
                                     const float *a, const float *g, int64_t n)
{
    cpu_enter(dev);
    swiglu_backward_f32(da, dg, dout, a, g, n);
    return CT_OK;
}

static ct_status cpu_gelu_forward(ct_device *dev, float *out, const float *x, int64_t n)
{
    cpu_enter(dev);
    gelu_forward_f32(out, x, n);
    return CT_OK;
}

static ct_status cpu_gelu_backward(ct_device *dev, float *dx, const float *dout, const float *x,
                                   int64_t n)
{
    cpu_enter(dev);
    gelu_backward_f32(dx, dout, x, n);
    return CT_OK;
}

static ct_status cpu_cross_entropy_check(cpu_device *d, const char *op, const int32_t *targets,
                                         int64_t n, int64_t v, int32_t ignore_index)
{
    int64_t bad = cpu_find_bad_id(targets, n, v, 1, ignore_index);
    if (bad >= 0)
        return cpu_fail(d, CT_ERR_INVALID, op,
                        "targets[%lld] = %d is outside [0, %lld) and not ignore_index %d",
                        (long long)bad, targets[bad], (long long)v, ignore_index);
    return CT_OK;
}

static ct_status cpu_cross_entropy_forward(ct_device *dev, float *losses, const float *logits,
                                           const int32_t *targets, int64_t n, int64_t v,
                                           int32_t ignore_index)
{
    cpu_device *d = dev;
    ct_status st = cpu_cross_entropy_check(d, "cross_entropy_forward", targets, n, v, ignore_index);
    if (st != CT_OK)
        return st;
    if (n == 0)
        return CT_OK;
    if (!losses || !logits)
        return cpu_fail(d, CT_ERR_INVALID, "cross_entropy_forward", "null pointer");
    cpu_enter(d);
    cross_entropy_forward_f32(losses, logits, targets, n, v, ignore_index);
    return CT_OK;
}

/* ABI 2.23: every form of the backward. dloss_dev (when set) is read as the op runs. Whole rows
 * (lse NULL): targets checked, the softmax formed from each row. A shard (lse set): targets not
 * checked, an id outside this shard's columns is simply not here. */
static ct_status cpu_cross_entropy_backward_general(ct_device *dev, float *dlogits,
                                                    const float *logits, const int32_t *targets,
                                                    const float *lse, float dloss,
                                                    const float *dloss_dev, int64_t n, int64_t v,
                                                    int64_t begin, int32_t ignore_index)
{
    cpu_device *d = dev;
    const char *op = "cross_entropy_backward_general";
    if (lse) {
        if (n == 0 || v == 0)
            return CT_OK;
        cpu_enter(d);
        cross_entropy_backward_lse_f32(dlogits, logits, targets, lse,
                                       dloss_dev ? *dloss_dev : dloss, n, v, begin, ignore_index);
        return CT_OK;
    }
    ct_status st = cpu_cross_entropy_check(d, op, targets, n, v, ignore_index);
    if (st != CT_OK)
        return st;
    if (n == 0)
        return CT_OK;
    if (!dlogits || !logits)
        return cpu_fail(d, CT_ERR_INVALID, op, "null pointer");
    cpu_enter(d);
    if (cross_entropy_backward_f32(dlogits, logits, targets, dloss_dev ? *dloss_dev : dloss, n, v,
                                   ignore_index) != 0)
        return cpu_fail(d, CT_ERR_NOMEM, op, "cannot allocate scratch memory");
    return CT_OK;
}

/* ---------------------------------------------------------------- optimizer and precision */

static ct_status cpu_adamw(ct_device *dev, float *param, const float *grad, float *m, float *v,
                           int64_t n, float lr, float beta1, float beta2, float eps,
                           float weight_decay, int64_t step)
{
    cpu_enter(dev);
    adamw_f32(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
    return CT_OK;
}

static ct_status cpu_adamw_bf16_moments(ct_device *dev, float *param, const float *grad, uint32_t *mv, int64_t n,
                                        float lr, float beta1, float beta2, float eps, float weight_decay,
                                        int64_t step)
{
    cpu_enter(dev);
    adamw_bf16_moments_f32(param, grad, mv, n, lr, beta1, beta2, eps, weight_decay, step);
    return CT_OK;
}

static ct_status cpu_cast_f32_to_bf16(ct_device *dev, uint16_t *dst, const float *src, int64_t n)
{
    cpu_enter(dev);
#pragma omp parallel for simd schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; i++)
        dst[i] = cpu_f32_to_bf16(src[i]);
    return CT_OK;
}

static ct_status cpu_cast_bf16_to_f32(ct_device *dev, float *dst, const uint16_t *src, int64_t n)
{
    cpu_enter(dev);
#pragma omp parallel for simd schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; i++)
        dst[i] = cpu_bf16_to_f32(src[i]);
    return CT_OK;
}

static ct_status cpu_round_bf16(ct_device *dev, float *x, int64_t n)
{
    cpu_enter(dev);
#pragma omp parallel for simd schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; i++)
        x[i] = cpu_bf16_to_f32(cpu_f32_to_bf16(x[i]));
    return CT_OK;
}

/* ---------------------------------------------------------------- float8 (ABI 1.2) */

static ct_status cpu_fp8_format_check(cpu_device *d, const char *op, ct_dtype fmt)
{
    if (fmt != CT_F8_E4M3 && fmt != CT_F8_E5M2)
        return cpu_fail(d, CT_ERR_INVALID, op,
                        "format %d, expected CT_F8_E4M3 (%d) or CT_F8_E5M2 (%d)", (int)fmt,
                        (int)CT_F8_E4M3, (int)CT_F8_E5M2);
    return CT_OK;
}

static ct_status cpu_amax(ct_device *dev, float *amax, const float *src, int64_t n, int64_t group)
{
    if (n == 0)
        return CT_OK;
    cpu_enter(dev);
    amax_f32(amax, src, n, group);
    return CT_OK;
}

/* The scale values are not checked (they may come from a device-side amax); a positive finite
 * scale never makes a NaN or inf from a finite input, since the cast saturates. */
static ct_status cpu_quantize_fp8(ct_device *dev, uint8_t *dst, const float *src, const float *scale,
                                  int64_t n, int64_t group, ct_dtype fmt)
{
    if (n == 0)
        return CT_OK;
    cpu_enter(dev);
    quantize_fp8_f32(dst, src, scale, n, group, fmt == CT_F8_E5M2);
    return CT_OK;
}

static ct_status cpu_dequantize_fp8(ct_device *dev, float *dst, const uint8_t *src, const float *scale,
                                    int64_t n, int64_t group, ct_dtype fmt)
{
    if (n == 0)
        return CT_OK;
    cpu_enter(dev);
    dequantize_fp8_f32(dst, src, scale, n, group, fmt == CT_F8_E5M2);
    return CT_OK;
}

/* The scaled fp8 matmuls of ABI 1.4, emulated exactly: both operands dequantised to f32 (value /
 * scale, one scale per tensor or, with `rows`, per row), then one sgemm c = alpha a b^T + beta c.
 * Every format pair runs here. */
static ct_status cpu_fp8_gemm(cpu_device *d, const char *op, float *c, const uint8_t *a, const float *a_scale,
                              ct_dtype a_fmt, const uint8_t *b, const float *b_scale, ct_dtype b_fmt, int64_t m,
                              int64_t n, int64_t k, float alpha, float beta, int rows)
{
    ct_status st = cpu_fp8_format_check(d, op, a_fmt);
    if (st == CT_OK)
        st = cpu_fp8_format_check(d, op, b_fmt);
    if (st == CT_OK)
        st = cpu_gemm_shape_check(d, op, m, n, k);
    if (st != CT_OK)
        return st;
    if (m == 0 || n == 0)
        return CT_OK;
    if (!c || (k > 0 && !(a && b && a_scale && b_scale)))
        return cpu_fail(d, CT_ERR_INVALID, op, "null pointer");
    cpu_enter(d);
    float *fa = NULL, *fb = NULL;
    if (k > 0) {
        fa = malloc(sizeof(float) * (size_t)(m * k));
        fb = malloc(sizeof(float) * (size_t)(n * k));
        if (!fa || !fb) {
            free(fa);
            free(fb);
            return cpu_fail(d, CT_ERR_NOMEM, op, "cannot allocate scratch memory");
        }
        dequantize_fp8_f32(fa, a, a_scale, m * k, rows ? k : m * k, a_fmt == CT_F8_E5M2);
        dequantize_fp8_f32(fb, b, b_scale, n * k, rows ? k : n * k, b_fmt == CT_F8_E5M2);
    }
    matmul_f32(c, fa, fb, (int)m, (int)n, (int)k, 0, 1, alpha, beta);
    free(fa);
    free(fb);
    return CT_OK;
}

static ct_status cpu_matmul_fp8(ct_device *dev, float *c, const uint8_t *a, const float *a_scale, ct_dtype a_fmt,
                                const uint8_t *b, const float *b_scale, ct_dtype b_fmt, int64_t m, int64_t n,
                                int64_t k, float alpha, float beta)
{
    cpu_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    return cpu_fp8_gemm(d, "matmul_fp8", c, a, a_scale, a_fmt, b, b_scale, b_fmt, m, n, k, alpha, beta, 0);
}

static ct_status cpu_matmul_fp8_rows(ct_device *dev, float *c, const uint8_t *a, const float *a_scale,
                                     ct_dtype a_fmt, const uint8_t *b, const float *b_scale, ct_dtype b_fmt,
                                     int64_t m, int64_t n, int64_t k, float alpha, float beta)
{
    cpu_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    return cpu_fp8_gemm(d, "matmul_fp8_rows", c, a, a_scale, a_fmt, b, b_scale, b_fmt, m, n, k, alpha, beta, 1);
}

/* Not in place: dst and src must not overlap. */
static ct_status cpu_transpose(ct_device *dev, float *dst, const float *src, int64_t rows, int64_t cols)
{
    if (rows == 0 || cols == 0)
        return CT_OK;
    cpu_enter(dev);
    transpose_f32(dst, src, rows, cols);
    return CT_OK;
}

/* ---------------------------------------------------------------- tensor parallel (ABI 1.3) */

/* Targets are not checked: an id outside this shard's columns is simply not here. */
static ct_status cpu_cross_entropy_stats(ct_device *dev, float *stats, const float *logits,
                                         const int32_t *targets, int64_t n, int64_t v,
                                         int64_t begin, int32_t ignore_index)
{
    if (n == 0)
        return CT_OK;
    cpu_enter(dev);
    cross_entropy_stats_f32(stats, logits, targets, n, v, begin, ignore_index);
    return CT_OK;
}

static ct_status cpu_copy_2d(ct_device *dev, float *dst, int64_t dst_stride, const float *src,
                             int64_t src_stride, int64_t rows, int64_t cols)
{
    if (rows == 0 || cols == 0)
        return CT_OK;
    cpu_enter(dev);
    copy_2d_f32(dst, dst_stride, src, src_stride, rows, cols);
    return CT_OK;
}

/* ---------------------------------------------------------------- ABI 2.1: elementwise ops */

static ct_status cpu_ew_axpby(ct_device *d, float *out, float alpha, const float *x, float beta, const float *y,
                              int64_t n)
{
    cpu_enter(d);
    ew_axpby_f32(out, alpha, x, beta, y, n);
    return CT_OK;
}

static ct_status cpu_ew_mul(ct_device *d, float *out, const float *x, const float *y, int64_t n)
{
    cpu_enter(d);
    ew_mul_f32(out, x, y, n);
    return CT_OK;
}

static ct_status cpu_ew_div(ct_device *d, float *out, const float *x, const float *y, float eps, int64_t n)
{
    cpu_enter(d);
    ew_div_f32(out, x, y, eps, n);
    return CT_OK;
}

static ct_status cpu_ew_sqrt(ct_device *d, float *out, const float *x, int64_t n)
{
    cpu_enter(d);
    ew_sqrt_f32(out, x, n);
    return CT_OK;
}

static ct_status cpu_ew_sign(ct_device *d, float *out, const float *x, int64_t n)
{
    cpu_enter(d);
    ew_sign_f32(out, x, n);
    return CT_OK;
}

static ct_status cpu_ew_clamp(ct_device *d, float *out, const float *x, float lo, float hi, int64_t n)
{
    cpu_enter(d);
    ew_clamp_f32(out, x, lo, hi, n);
    return CT_OK;
}

static ct_status cpu_ew_greater(ct_device *d, float *out, const float *x, const float *y, int64_t n)
{
    cpu_enter(d);
    ew_greater_f32(out, x, y, n);
    return CT_OK;
}

/* ---------------------------------------------------------------- entry */

static const ct_device_api cpu_api = {
    .struct_size = sizeof(ct_device_api),
    .create = cpu_create,
    .destroy = cpu_destroy,
    .info = cpu_info,
    .measure_peak_flops = cpu_measure_peak_flops,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .synchronize = cpu_synchronize,
    .matmul = cpu_matmul,
    .axpy = cpu_axpy,
    .add = cpu_add,
    .scale = cpu_scale,
    .sum = cpu_sum,
    .sum_squares = cpu_sum_squares,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward_input = cpu_rmsnorm_backward_input,
    .rmsnorm_backward_weight = cpu_rmsnorm_backward_weight,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward_input = cpu_layernorm_backward_input,
    .layernorm_backward_weight = cpu_layernorm_backward_weight,
    .bias_forward = cpu_bias_forward,
    .bias_backward = cpu_bias_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .cross_entropy_forward = cpu_cross_entropy_forward,
    .adamw = cpu_adamw,
    .cast_f32_to_bf16 = cpu_cast_f32_to_bf16,
    .cast_bf16_to_f32 = cpu_cast_bf16_to_f32,
    .round_bf16 = cpu_round_bf16,
    .amax = cpu_amax,
    .quantize_fp8 = cpu_quantize_fp8,
    .dequantize_fp8 = cpu_dequantize_fp8,
    .transpose = cpu_transpose,
    .cross_entropy_stats = cpu_cross_entropy_stats,
    .copy_2d = cpu_copy_2d,
    .matmul_fp8 = cpu_matmul_fp8,
    .matmul_fp8_rows = cpu_matmul_fp8_rows,
    .sum_to_device = cpu_sum_to_device,
    .ew_axpby = cpu_ew_axpby,
    .ew_mul = cpu_ew_mul,
    .ew_div = cpu_ew_div,
    .ew_sqrt = cpu_ew_sqrt,
    .ew_sign = cpu_ew_sign,
    .ew_clamp = cpu_ew_clamp,
    .ew_greater = cpu_ew_greater,
    .attention_block_forward = cpu_attention_block_forward,
    .attention_merge = cpu_attention_merge,
    .attention_block_backward = cpu_attention_block_backward,
    .region_reserve = cpu_region_reserve,
    .region_resize = cpu_region_resize,
    .region_release = cpu_region_release,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .copy_async = cpu_copy_async,
    .copy_wait = cpu_copy_wait,
    .adamw_bf16_moments = cpu_adamw_bf16_moments,
    .attention_doc_forward = cpu_attention_doc_forward,
    .attention_doc_backward = cpu_attention_doc_backward,
    .moe_scores_forward = cpu_moe_scores_forward,
    .moe_scores_backward = cpu_moe_scores_backward,
    .moe_topk_forward = cpu_moe_topk_forward,
    .moe_topk_backward = cpu_moe_topk_backward,
    .moe_permute = cpu_moe_permute,
    .moe_gather_forward = cpu_moe_gather_forward,
    .moe_gather_backward = cpu_moe_gather_backward,
    .grouped_matmul_forward = cpu_grouped_matmul_forward,
    .grouped_matmul_backward_input = cpu_grouped_matmul_backward_input,
    .grouped_matmul_backward_weight = cpu_grouped_matmul_backward_weight,
    .moe_combine_forward = cpu_moe_combine_forward,
    .moe_combine_backward = cpu_moe_combine_backward,
    /* ABI 2.23: one op per family; the narrow ops it supersedes stay NULL (the host derives them) */
    .embedding_forward_general = cpu_embedding_forward_general,
    .embedding_backward_general = cpu_embedding_backward_general,
    .rope_forward_general = cpu_rope_forward_general,
    .rope_backward_general = cpu_rope_backward_general,
    .cross_entropy_backward_general = cpu_cross_entropy_backward_general,
};

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info)
{
    (void)host;
    if (!info || !CT_HAS_FIELD(info, ct_plugin_info, api))
        return CT_ERR_INVALID;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_DEVICE;
    info->name = "cpu";
    info->description = "CPU device: OpenBLAS sgemm, OpenMP kernels, deterministic reductions";
    info->options = cpu_options;
    info->api = &cpu_api;
    return CT_OK;
}
