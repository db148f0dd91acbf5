/* blas.c: matmul through cuBLASLt, and the peak-FLOP/s measurement.
 *
 * The ABI's matmul is row-major: c (m,n) = alpha op(a) op(b) + beta c. cuBLAS is column-major,
 * and a row-major (r, s) matrix is the column-major (s, r) matrix of the same memory, its
 * transpose. So the plugin asks cuBLASLt for C^T (n,m) = op(b)^T op(a)^T: "A" is b (n x k after
 * its op: transposed exactly when trans_b), "B" is a (k x m: transposed when trans_a), ldc = n.
 *
 * Precision: compute type CUBLAS_COMPUTE_32F (exact f32 FMA, no TF32) unless the `tf32` option
 * is on (CUBLAS_COMPUTE_32F_FAST_TF32). Determinism: cuBLAS gives the same bits for the same
 * call on the same GPU; the plugin fixes the algorithm of each shape once (the first heuristic
 * answer, cached in a plan) and gives it a fixed workspace, so repeated calls cannot switch.
 *
 * Plans: the layouts, the operation descriptor and the chosen algorithm for one (m, n, k,
 * transposes, beta == 0, operand alignments) key, in a small cache with least-recently-used
 * eviction (a training step uses a few dozen shapes). When cuBLASLt has no algorithm for a key,
 * the plan falls back to cublasSgemm with the same mapping.
 */
#include "cuda_device.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define CUDA_WORKSPACE_BYTES ((size_t)32 << 20) /* what NVIDIA suggests for Hopper */
#define CUDA_PLANS 64

typedef struct plan_key {
    int64_t m, n, k;
    int trans_a, trans_b, beta_zero;
    int align_a, align_b, align_c; /* bytes, a power of two up to 256 */
} plan_key;

typedef struct plan {
    plan_key key;
    int used; /* the slot holds a plan */
    int sgemm; /* no cuBLASLt algorithm: use cublasSgemm */
    uint64_t last_use;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} plan;

struct cuda_plans {
    plan slot[CUDA_PLANS];
    uint64_t clock;
};

static void plan_clear(plan *p)
{
    if (p->desc)
        cublasLtMatmulDescDestroy(p->desc);
    if (p->la)
        cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb)
        cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc)
        cublasLtMatrixLayoutDestroy(p->lc);
    memset(p, 0, sizeof *p);
}

ct_status cuda_blas_init(cuda_device *d)
{
    cublasStatus_t s = cublasLtCreate(&d->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        d->lt = NULL;
        return cuda_blas_error(d, "create", "cublasLtCreate", s);
    }
    if ((s = cublasCreate(&d->blas)) != CUBLAS_STATUS_SUCCESS) {
        d->blas = NULL;
        return cuda_blas_error(d, "create", "cublasCreate", s);
    }
    if ((s = cublasSetStream(d->blas, d->stream)) != CUBLAS_STATUS_SUCCESS)
        return cuda_blas_error(d, "create", "cublasSetStream", s);
    s = cublasSetMathMode(d->blas, d->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    if (s != CUBLAS_STATUS_SUCCESS)
        return cuda_blas_error(d, "create", "cublasSetMathMode", s);
    cudaError_t e = cudaMalloc(&d->workspace, CUDA_WORKSPACE_BYTES);
    if (e != cudaSuccess) {
        d->workspace = NULL;
        return cuda_error(d, "create", "cudaMalloc (cuBLASLt workspace)", e);
    }
    d->workspace_bytes = CUDA_WORKSPACE_BYTES;
    if (d->host && d->host->mem_account)
        d->host->mem_account(d->host, CT_MEM_OTHER, (int64_t)d->workspace_bytes);
    d->plans = calloc(1, sizeof *d->plans);
    if (!d->plans)
        return cuda_fail(d, CT_ERR_NOMEM, "create", "cannot allocate the matmul plan cache");
    return CT_OK;
}

void cuda_blas_release(cuda_device *d)
{
    if (d->plans) {
        for (int i = 0; i < CUDA_PLANS; i++)
            plan_clear(&d->plans->slot[i]);
        free(d->plans);
        d->plans = NULL;
    }
    if (d->workspace) {
        cudaFree(d->workspace);
        if (d->host && d->host->mem_account)
            d->host->mem_account(d->host, CT_MEM_OTHER, -(int64_t)d->workspace_bytes);
        d->workspace = NULL;
    }
    if (d->blas)
        cublasDestroy(d->blas);
    if (d->lt)
        cublasLtDestroy(d->lt);
    d->blas = NULL;
    d->lt = NULL;
}

/* The largest power of two up to 256 that divides the address. */
static int alignment_of(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    int a = 1;
    while (a < 256 && u % (uintptr_t)(2 * a) == 0)
        a *= 2;
    return a;
}

#define LT_TRY(call)                                                                               \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            return cuda_blas_error(d, "matmul", #call, s_);                                        \
    } while (0)

/* Builds the cuBLASLt objects for key k into p and asks the heuristic for an algorithm; no
 * algorithm (or an unsupported key) leaves p->sgemm set. */
static ct_status plan_build(cuda_device *d, plan *p, const plan_key *k)
{
    memset(p, 0, sizeof *p);
    p->key = *k;
    p->used = 1;
    cublasComputeType_t compute = d->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasOperation_t op_a = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLAS's A is b */
    cublasOperation_t op_b = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLAS's B is a */
    LT_TRY(cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    /* stored shapes, column-major: b is (n, k) with ld n, or (k, n) with ld k when trans_b */
    uint64_t rows_a = (uint64_t)(k->trans_b ? k->k : k->n), cols_a = (uint64_t)(k->trans_b ? k->n : k->k);
    uint64_t rows_b = (uint64_t)(k->trans_a ? k->m : k->k), cols_b = (uint64_t)(k->trans_a ? k->k : k->m);
    LT_TRY(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_32F, rows_a, cols_a, (int64_t)rows_a));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_32F, rows_b, cols_b, (int64_t)rows_b));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, (uint64_t)k->n, (uint64_t)k->m, k->n));

    cublasLtMatmulPreference_t pref;
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = d->workspace_bytes;
    uint32_t align[4] = {(uint32_t)k->align_b, (uint32_t)k->align_a, (uint32_t)k->align_c, (uint32_t)k->align_c};
    cublasStatus_t s =
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++)
        s = cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof align[i]);
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoGetHeuristic(d->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
        p->algo = result.algo;
        return CT_OK;
    }
    if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED)
        return cuda_blas_error(d, "matmul", "cublasLtMatmulAlgoGetHeuristic", s);
    p->sgemm = 1;
    if (d->host && d->host->log)
        d->host->log(d->host, CT_LOG_DEBUG, "matmul m=%lld n=%lld k=%lld: no cuBLASLt algorithm, using cublasSgemm",
                     (long long)k->m, (long long)k->n, (long long)k->k);
    return CT_OK;
}

/* The cached plan for k, built on first use; the least recently used one makes room. */
static ct_status plan_get(cuda_device *d, const plan_key *k, plan **out)
{
    struct cuda_plans *ps = d->plans;
    plan *victim = &ps->slot[0];
    ps->clock++;
    for (int i = 0; i < CUDA_PLANS; i++) {
        plan *p = &ps->slot[i];
        if (p->used && memcmp(&p->key, k, sizeof *k) == 0) {
            p->last_use = ps->clock;
            *out = p;
            return CT_OK;
        }
        if (!p->used || (victim->used && p->last_use < victim->last_use))
            victim = p;
    }
    plan_clear(victim);
    ct_status st = plan_build(d, victim, k);
    if (st != CT_OK) {
        plan_clear(victim);
        return st;
    }
    victim->last_use = ps->clock;
    *out = victim;
    return CT_OK;
}

static ct_status run_sgemm(cuda_device *d, const plan_key *k, float *c, const float *a, const float *b,
                           float alpha, float beta)
{
    cublasOperation_t op_a = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    int lda = (int)(k->trans_b ? k->k : k->n), ldb = (int)(k->trans_a ? k->m : k->k);
    cublasStatus_t s = cublasSgemm(d->blas, op_a, op_b, (int)k->n, (int)k->m, (int)k->k, &alpha, b, lda, a, ldb,
                                   &beta, c, (int)k->n);
    return s == CUBLAS_STATUS_SUCCESS ? CT_OK : cuda_blas_error(d, "matmul", "cublasSgemm", s);
}

ct_status cuda_matmul(void *dev, float *c, const float *a, const float *b, int64_t m, int64_t n, int64_t k,
                      int trans_a, int trans_b, float alpha, float beta)
{
    CUDA_OP_BEGIN(dev);
    CUDA_REQUIRE(m >= 0 && n >= 0 && k >= 0, "negative shape m=%lld n=%lld k=%lld", (long long)m, (long long)n,
                 (long long)k);
    CUDA_REQUIRE(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX, "shape m=%lld n=%lld k=%lld exceeds the BLAS int range",
                 (long long)m, (long long)n, (long long)k);
    if (m == 0 || n == 0)
        return CT_OK;
    CUDA_REQUIRE(c && (k == 0 || (a && b)), "null pointer");
    CUDA_ENTER();
    if (k == 0) { /* an empty product: c = beta c (beta 0 ignores c's contents, NaN included) */
        if (beta == 0.0f) {
            cudaError_t e = cudaMemsetAsync(c, 0, sizeof(float) * (size_t)(m * n), d->stream);
            return e == cudaSuccess ? CT_OK : cuda_error(d, "matmul", "cudaMemsetAsync", e);
        }
        CUDA_LAUNCH(cuk_scale(&d->env, c, beta, m * n));
        return CT_OK;
    }
    plan_key key;
    memset(&key, 0, sizeof key); /* padding too: keys are compared with memcmp */
    key.m = m;
    key.n = n;
    key.k = k;
    key.trans_a = trans_a != 0;
    key.trans_b = trans_b != 0;
    key.beta_zero = beta == 0.0f;
    key.align_a = alignment_of(a);
    key.align_b = alignment_of(b);
    key.align_c = alignment_of(c);
    plan *p;
    pthread_mutex_lock(&d->op_lock);
    ct_status st = plan_get(d, &key, &p);
    if (st == CT_OK) {
        if (p->sgemm) {
            st = run_sgemm(d, &key, c, a, b, alpha, beta);
        } else {
            cublasStatus_t s = cublasLtMatmul(d->lt, p->desc, &alpha, b, p->la, a, p->lb, &beta, c, p->lc, c, p->lc,
                                              &p->algo, d->workspace, d->workspace_bytes, d->stream);
            if (s != CUBLAS_STATUS_SUCCESS)
                st = cuda_blas_error(d, "matmul", "cublasLtMatmul", s);
        }
    }
    pthread_mutex_unlock(&d->op_lock);
    return st;
}

/* Best rate of a 4096^3 f32 matmul timed with events: a warm-up, then repetitions until two
 * or more have run and 50 ms have passed (about 20 on an H100; never more than 10 timed). */
ct_status cuda_measure_peak_flops(void *dev, double *flops_per_s)
{
    CUDA_OP_BEGIN(dev);
    CUDA_REQUIRE(flops_per_s != NULL, "null output");
    CUDA_ENTER();
    const int64_t n = 4096;
    const size_t bytes = sizeof(float) * (size_t)(n * n);
    float *a = NULL, *b = NULL, *c = NULL;
    cudaEvent_t start = NULL, stop = NULL;
    ct_status st = cuda_alloc(d, bytes, (void **)&a);
    if (st == CT_OK)
        st = cuda_alloc(d, bytes, (void **)&b);
    if (st == CT_OK)
        st = cuda_alloc(d, bytes, (void **)&c);
    cudaError_t e = cudaSuccess;
    if (st == CT_OK && ((e = cuk_fill(&d->env, a, n * n, 0.01f, 0.01f, 7)) != cudaSuccess ||
                        (e = cuk_fill(&d->env, b, n * n, -0.02f, 0.01f, 5)) != cudaSuccess))
        st = cuda_error(d, "measure_peak_flops", "kernel launch", e);
    if (st == CT_OK && ((e = cudaEventCreate(&start)) != cudaSuccess || (e = cudaEventCreate(&stop)) != cudaSuccess))
        st = cuda_error(d, "measure_peak_flops", "cudaEventCreate", e);
    float best_ms = 1e30f, total_ms = 0;
    for (int rep = 0; rep <= 10 && st == CT_OK; rep++) {
        if ((e = cudaEventRecord(start, d->stream)) != cudaSuccess) {
            st = cuda_error(d, "measure_peak_flops", "cudaEventRecord", e);
            break;
        }
        st = cuda_matmul(d, c, a, b, n, n, n, 0, 0, 1.0f, 0.0f);
        float ms = 0;
        if (st == CT_OK && ((e = cudaEventRecord(stop, d->stream)) != cudaSuccess ||
                            (e = cudaEventSynchronize(stop)) != cudaSuccess ||
                            (e = cudaEventElapsedTime(&ms, start, stop)) != cudaSuccess))
            st = cuda_error(d, "measure_peak_flops", "timing events", e);
        if (st != CT_OK || rep == 0) /* rep 0 warms up (plan, clocks) */
            continue;
        best_ms = ms < best_ms ? ms : best_ms;
        total_ms += ms;
        if (rep >= 2 && total_ms > 50.0f)
            break;
    }
    if (start)
        cudaEventDestroy(start);
    if (stop)
        cudaEventDestroy(stop);
    cuda_free(d, a);
    cuda_free(d, b);
    cuda_free(d, c);
    if (st != CT_OK)
        return st;
    *flops_per_s = 2.0 * (double)n * (double)n * (double)n / ((double)best_ms * 1e-3);
    return CT_OK;
}
