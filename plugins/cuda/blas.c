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
 * transposes, operand types, beta == 0, operand alignments) key, in a small cache with
 * least-recently-used eviction (a training step uses a few dozen shapes). When cuBLASLt has no
 * algorithm for an f32 key, the plan falls back to cublasSgemm with the same mapping.
 *
 * bf16 (set_matmul_dtype(CT_BF16), what mixed_precision_param: bfloat16 asks for): each operand
 * is cast to bf16 (round to nearest even) into scratch memory and cuBLASLt multiplies bf16 A and
 * B on the tensor cores with f32 accumulation into the f32 c. A shape with no bf16 algorithm
 * runs the f32 GEMM on the rounded operands (the same values, without the tensor cores).
 *
 * fp8 (matmul_fp8): cuBLASLt's fp8 GEMM (compute capability 8.9 and newer), which takes A
 * transposed and B not ("TN"): the ABI's c = a b^T with both operands k-contiguous is exactly
 * that. Its scale attributes multiply (D = alpha (sa A)(sb B) + beta C), the ABI's scales divide,
 * so a small kernel writes the two reciprocals to d->fp8_recip before each GEMM; the pointers in
 * the descriptor never change. matmul_fp8_rows: one scale per row of each operand (torchao's rowwise
 * recipes) through cuBLASLt's outer-vector scaling (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F:
 * product (i, j) times sa[i] sb[j]); the reciprocal vectors go to d->fp8_rows, whose address the
 * descriptor gets before each call. What cuBLASLt cannot run (e5m2 x e5m2, k not a multiple of 16, an
 * older GPU) is CT_ERR_UNSUPPORTED, and the quantizer emulates.
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
    int type_a, type_b; /* cudaDataType of the ABI's a and b (c is always f32) */
    int rows;           /* fp8 with one scale per row (cuBLASLt's outer-vector scaling) */
    int align_a, align_b, align_c; /* bytes, a power of two up to 256 */
} plan_key;

typedef struct plan {
    plan_key key;
    int used; /* the slot holds a plan */
    int sgemm; /* no cuBLASLt algorithm: cublasSgemm for f32, the caller's fallback otherwise */
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
    if ((e = cudaMalloc((void **)&d->fp8_recip, 2 * sizeof(float))) != cudaSuccess) {
        d->fp8_recip = NULL;
        return cuda_error(d, "create", "cudaMalloc (fp8 scale reciprocals)", e);
    }
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
    if (d->fp8_recip)
        cudaFree(d->fp8_recip);
    d->fp8_recip = NULL;
    if (d->fp8_rows)
        cuda_free(d, d->fp8_rows);
    d->fp8_rows = NULL;
    d->fp8_rows_cap = 0;
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

/* Builds the cuBLASLt objects for key k into p and asks the heuristic for an algorithm; no
 * algorithm (or an unsupported key) leaves p->sgemm set. */
static ct_status plan_build(cuda_device *d, plan *p, const plan_key *k)
{
    memset(p, 0, sizeof *p);
    p->key = *k;
    p->used = 1;
    int typed = k->type_a != CUDA_R_32F;
    cublasComputeType_t compute = d->tf32 && !typed ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasOperation_t op_a = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLAS's A is b */
    cublasOperation_t op_b = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLAS's B is a */
    cublasStatus_t s = cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F);
    if (s != CUBLAS_STATUS_SUCCESS)
        return cuda_blas_error(d, "matmul", "cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F)", s);
    s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a);
    if (s != CUBLAS_STATUS_SUCCESS)
        return cuda_blas_error(
            d, "matmul", "cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a)", s);
    s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b);
    if (s != CUBLAS_STATUS_SUCCESS)
        return cuda_blas_error(
            d, "matmul", "cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b)", s);
    /* stored shapes, column-major: b is (n, k) with ld n, or (k, n) with ld k when trans_b */
    uint64_t rows_a = (uint64_t)(k->trans_b ? k->k : k->n), cols_a = (uint64_t)(k->trans_b ? k->n : k->k);
    uint64_t rows_b = (uint64_t)(k->trans_a ? k->m : k->k), cols_b = (uint64_t)(k->trans_a ? k->k : k->m);
    s = cublasLtMatrixLayoutCreate(&p->la, (cudaDataType)k->type_b, rows_a, cols_a, (int64_t)rows_a);
    if (s != CUBLAS_STATUS_SUCCESS)
        return cuda_blas_error(
            d, "matmul", "cublasLtMatrixLayoutCreate(&p->la, (cudaDataType)k->type_b, rows_a, cols_a, (int64_t)rows_a)",
            s);
    s = cublasLtMatrixLayoutCreate(&p->lb, (cudaDataType)k->type_a, rows_b, cols_b, (int64_t)rows_b);
    if (s != CUBLAS_STATUS_SUCCESS)
        return cuda_blas_error(
            d, "matmul", "cublasLtMatrixLayoutCreate(&p->lb, (cudaDataType)k->type_a, rows_b, cols_b, (int64_t)rows_b)",
            s);
    if (k->rows) { /* the scale vectors' pointers change per call: lt_run sets them */
        int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode);
        if (s != CUBLAS_STATUS_SUCCESS)
            return cuda_blas_error(
                d, "matmul",
                "cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode)", s);
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode);
        if (s != CUBLAS_STATUS_SUCCESS)
            return cuda_blas_error(
                d, "matmul",
                "cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode)", s);
    } else if (k->type_a == CUDA_R_8F_E4M3 || k->type_a == CUDA_R_8F_E5M2) { /* cuBLAS's A is b: factor [1] */
        const float *sa = d->fp8_recip + 1, *sb = d->fp8_recip;
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
        if (s != CUBLAS_STATUS_SUCCESS)
            return cuda_blas_error(
                d, "matmul",
                "cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa)", s);
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
        if (s != CUBLAS_STATUS_SUCCESS)
            return cuda_blas_error(
                d, "matmul",
                "cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb)", s);
    }
    s = cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, (uint64_t)k->n, (uint64_t)k->m, k->n);
    if (s != CUBLAS_STATUS_SUCCESS)
        return cuda_blas_error(
            d, "matmul", "cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, (uint64_t)k->n, (uint64_t)k->m, k->n)", s);

    cublasLtMatmulPreference_t pref;
    s = cublasLtMatmulPreferenceCreate(&pref);
    if (s != CUBLAS_STATUS_SUCCESS)
        return cuda_blas_error(d, "matmul", "cublasLtMatmulPreferenceCreate(&pref)", s);
    uint64_t ws = d->workspace_bytes;
    uint32_t align[4] = {(uint32_t)k->align_b, (uint32_t)k->align_a, (uint32_t)k->align_c, (uint32_t)k->align_c};
    s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
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
        d->host->log(d->host, CT_LOG_DEBUG, "matmul m=%lld n=%lld k=%lld types %d x %d: no cuBLASLt algorithm, %s",
                     (long long)k->m, (long long)k->n, (long long)k->k, k->type_a, k->type_b,
                     typed ? "the caller falls back" : "using cublasSgemm");
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

static ct_status run_sgemm(cuda_device *d, const plan_key *k, float *c, const void *a, const void *b,
                           float alpha, float beta)
{
    cublasOperation_t op_a = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    int lda = (int)(k->trans_b ? k->k : k->n), ldb = (int)(k->trans_a ? k->m : k->k);
    cublasStatus_t s = cublasSgemm(d->blas, op_a, op_b, (int)k->n, (int)k->m, (int)k->k, &alpha, b, lda, a, ldb,
                                   &beta, c, (int)k->n);
    return s == CUBLAS_STATUS_SUCCESS ? CT_OK : cuda_blas_error(d, "matmul", "cublasSgemm", s);
}

static plan_key make_key(int64_t m, int64_t n, int64_t k, int trans_a, int trans_b, float beta, int type_a,
                         int type_b, const void *a, const void *b, const void *c)
{
    plan_key key;
    memset(&key, 0, sizeof key); /* padding too: keys are compared with memcmp */
    key.m = m;
    key.n = n;
    key.k = k;
    key.trans_a = trans_a != 0;
    key.trans_b = trans_b != 0;
    key.beta_zero = beta == 0.0f;
    key.type_a = type_a;
    key.type_b = type_b;
    key.align_a = alignment_of(a);
    key.align_b = alignment_of(b);
    key.align_c = alignment_of(c);
    return key;
}

/* One GEMM through the plan of `key` (the caller holds d->op_lock). A typed key without a cuBLASLt
 * algorithm sets *no_algo and runs nothing; an f32 one runs cublasSgemm. */
static ct_status lt_run(cuda_device *d, const plan_key *key, float *c, const void *a, const void *b, float alpha,
                        float beta, int *no_algo)
{
    plan *p;
    ct_status st = plan_get(d, key, &p);
    if (st != CT_OK)
        return st;
    if (p->sgemm) {
        if (key->type_a == CUDA_R_32F)
            return run_sgemm(d, key, c, a, b, alpha, beta);
        *no_algo = 1;
        return CT_OK;
    }
    if (key->rows) { /* cuBLAS's A is b: its vector is b's (n), after a's (m) in d->fp8_rows */
        const float *sa = d->fp8_rows + key->m, *sb = d->fp8_rows;
        cublasStatus_t s1 = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
        if (s1 == CUBLAS_STATUS_SUCCESS)
            s1 = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
        if (s1 != CUBLAS_STATUS_SUCCESS)
            return cuda_blas_error(d, "matmul_fp8_rows", "cublasLtMatmulDescSetAttribute", s1);
    }
    cublasStatus_t s = cublasLtMatmul(d->lt, p->desc, &alpha, b, p->la, a, p->lb, &beta, c, p->lc, c, p->lc, &p->algo,
                                      d->workspace, d->workspace_bytes, d->stream);
    return s == CUBLAS_STATUS_SUCCESS ? CT_OK : cuda_blas_error(d, "matmul", "cublasLtMatmul", s);
}

static ct_status lt_run_locked(cuda_device *d, const plan_key *key, float *c, const void *a, const void *b,
                               float alpha, float beta, int *no_algo)
{
    pthread_mutex_lock(&d->op_lock);
    ct_status st = lt_run(d, key, c, a, b, alpha, beta, no_algo);
    pthread_mutex_unlock(&d->op_lock);
    return st;
}

/* A GEMM's (m, n, k): non-negative and within BLAS's int. */
static ct_status gemm_shape_check(cuda_device *d, const char *op, int64_t m, int64_t n, int64_t k)
{
    if (m < 0 || n < 0 || k < 0)
        return cuda_fail(d, CT_ERR_INVALID, op, "negative shape m=%lld n=%lld k=%lld", (long long)m, (long long)n,
                         (long long)k);
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX)
        return cuda_fail(d, CT_ERR_INVALID, op, "shape m=%lld n=%lld k=%lld exceeds the BLAS int range", (long long)m,
                         (long long)n, (long long)k);
    return CT_OK;
}

/* The bf16 GEMM: both operands cast to bf16 scratch, then cuBLASLt's bf16 GEMM; a shape it has no
 * algorithm for multiplies the rounded operands, widened back to f32, with the f32 GEMM (same
 * values, no tensor cores). */
static ct_status matmul_bf16(cuda_device *d, float *c, const float *a, const float *b, int64_t m, int64_t n,
                             int64_t k, int trans_a, int trans_b, float alpha, float beta)
{
    size_t na = (size_t)(m * k), nb = (size_t)(k * n);
    uint16_t *a16 = cuda_scratch_get(d, sizeof(uint16_t) * na);
    uint16_t *b16 = a16 ? cuda_scratch_get(d, sizeof(uint16_t) * nb) : NULL;
    float *a32 = NULL, *b32 = NULL;
    int no_algo = 0;
    ct_status st = CT_OK;
    cudaError_t e = cudaSuccess;
    if (!b16) {
        st = cuda_fail(d, CT_ERR_NOMEM, "matmul", "no memory for the bf16 operands (%zu + %zu elements)", na, nb);
    } else if ((e = cuk_cast_f32_to_bf16(&d->env, a16, a, (int64_t)na)) != cudaSuccess ||
               (e = cuk_cast_f32_to_bf16(&d->env, b16, b, (int64_t)nb)) != cudaSuccess) {
        st = cuda_error(d, "matmul", "kernel launch", e);
    }
    if (st == CT_OK) {
        plan_key key = make_key(m, n, k, trans_a, trans_b, beta, CUDA_R_16BF, CUDA_R_16BF, a16, b16, c);
        st = lt_run_locked(d, &key, c, a16, b16, alpha, beta, &no_algo);
    }
    if (st == CT_OK && no_algo) {
        a32 = cuda_scratch_get(d, sizeof(float) * na);
        b32 = a32 ? cuda_scratch_get(d, sizeof(float) * nb) : NULL;
        if (!b32)
            st = cuda_fail(d, CT_ERR_NOMEM, "matmul", "no memory for the rounded operands (%zu + %zu elements)", na, nb);
        else if ((e = cuk_cast_bf16_to_f32(&d->env, a32, a16, (int64_t)na)) != cudaSuccess ||
                 (e = cuk_cast_bf16_to_f32(&d->env, b32, b16, (int64_t)nb)) != cudaSuccess)
            st = cuda_error(d, "matmul", "kernel launch", e);
        if (st == CT_OK) {
            plan_key key = make_key(m, n, k, trans_a, trans_b, beta, CUDA_R_32F, CUDA_R_32F, a32, b32, c);
            st = lt_run_locked(d, &key, c, a32, b32, alpha, beta, &no_algo);
        }
    }
    /* scratch goes back once the GEMM is enqueued: later users are ordered after it on the stream */
    void *scratch[4] = {a16, b16, a32, b32};
    for (int i = 0; i < 4; i++)
        if (scratch[i])
            cuda_scratch_put(d, scratch[i]);
    return st;
}

ct_status cuda_matmul(ct_device *dev, float *c, const float *a, const float *b, int64_t m, int64_t n, int64_t k,
                      int trans_a, int trans_b, float alpha, float beta)
{
    cuda_device *d = dev;
    if (m == 0 || n == 0)
        return CT_OK;
    ct_status st = cuda_enter(d, "matmul");
    if (st != CT_OK)
        return st;
    if (k == 0) { /* an empty product: c = beta c (beta 0 ignores c's contents, NaN included) */
        if (beta == 0.0f) {
            cudaError_t e = cudaMemsetAsync(c, 0, sizeof(float) * (size_t)(m * n), d->stream);
            return e == cudaSuccess ? CT_OK : cuda_error(d, "matmul", "cudaMemsetAsync", e);
        }
        cudaError_t e = cuk_scale(&d->env, c, beta, m * n);
        if (e != cudaSuccess)
            return cuda_error(d, "matmul", "kernel launch", e);
        return CT_OK;
    }
    if (d->matmul_bf16)
        return matmul_bf16(d, c, a, b, m, n, k, trans_a, trans_b, alpha, beta);
    plan_key key = make_key(m, n, k, trans_a, trans_b, beta, CUDA_R_32F, CUDA_R_32F, a, b, c);
    int no_algo = 0;
    return lt_run_locked(d, &key, c, a, b, alpha, beta, &no_algo);
}

ct_status cuda_set_matmul_dtype(ct_device *dev, ct_dtype dtype)
{
    cuda_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    if (dtype != CT_F32 && dtype != CT_BF16)
        return cuda_fail(d, CT_ERR_UNSUPPORTED, "set_matmul_dtype", "dtype %d: only f32 and bf16 operands are offered",
                         (int)dtype);
    d->matmul_bf16 = dtype == CT_BF16;
    return CT_OK;
}

static int fp8_type(ct_dtype f)
{
    return f == CT_F8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

/* Both fp8 GEMMs: tensor-wide scales (rows 0) or one per row (rows 1, cuBLASLt's outer vectors). */
static ct_status fp8_gemm(cuda_device *d, const char *op, float *c, const uint8_t *a, const float *a_scale,
                          ct_dtype a_fmt, const uint8_t *b, const float *b_scale, ct_dtype b_fmt, int64_t m, int64_t n,
                          int64_t k, float alpha, float beta, int rows)
{
    if (!(a_fmt == CT_F8_E4M3 || a_fmt == CT_F8_E5M2) || !(b_fmt == CT_F8_E4M3 || b_fmt == CT_F8_E5M2))
        return cuda_fail(d, CT_ERR_INVALID, op, "formats %d x %d: expected CT_F8_E4M3 or CT_F8_E5M2", (int)a_fmt,
                         (int)b_fmt);
    ct_status st = gemm_shape_check(d, op, m, n, k);
    if (st != CT_OK || m == 0 || n == 0)
        return st;
    if (!c || (k > 0 && !(a && b && a_scale && b_scale)))
        return cuda_fail(d, CT_ERR_INVALID, op, "null pointer");
    if (k == 0) /* an empty product: c = beta c, as matmul */
        return cuda_matmul(d, c, NULL, NULL, m, n, 0, 0, 1, alpha, beta);
    if ((st = cuda_no_capture(d, op, "an fp8 GEMM (its scale buffers are not held for graphs)")) != CT_OK)
        return st;
    if (!d->fp8_gemm)
        return cuda_fail(d, CT_ERR_UNSUPPORTED, op, "%s has no fp8 tensor cores (compute capability < 8.9)", d->name);
    if (a_fmt == CT_F8_E5M2 && b_fmt == CT_F8_E5M2)
        return cuda_fail(d, CT_ERR_UNSUPPORTED, op, "cuBLASLt has no e5m2 x e5m2 GEMM");
    if (k % 16)
        return cuda_fail(d, CT_ERR_UNSUPPORTED, op, "k = %lld: cuBLASLt's fp8 GEMM needs a multiple of 16", (long long)k);
    if ((st = cuda_enter(d, op)) != CT_OK)
        return st;
    /* the ABI's a and b are k-contiguous: a (m,k) as is, b (n,k) transposed */
    plan_key key = make_key(m, n, k, 0, 1, beta, fp8_type(a_fmt), fp8_type(b_fmt), a, b, c);
    key.rows = rows;
    int no_algo = 0;
    pthread_mutex_lock(&d->op_lock); /* the reciprocals' buffers are shared: keep them with their GEMM */
    cudaError_t e = cudaSuccess;
    if (rows && (size_t)(m + n) > d->fp8_rows_cap) { /* grow the vectors' buffer (ordered: one stream) */
        if (d->fp8_rows)
            cuda_free(d, d->fp8_rows);
        d->fp8_rows = NULL;
        d->fp8_rows_cap = 0;
        if ((st = cuda_alloc(d, sizeof(float) * (size_t)(m + n), (void **)&d->fp8_rows)) == CT_OK)
            d->fp8_rows_cap = (size_t)(m + n);
    }
    if (st == CT_OK) {
        e = rows ? cuk_reciprocal(&d->env, d->fp8_rows, a_scale, m) : cuk_reciprocal2(&d->env, d->fp8_recip, a_scale, b_scale);
        if (e == cudaSuccess && rows)
            e = cuk_reciprocal(&d->env, d->fp8_rows + m, b_scale, n);
        if (e != cudaSuccess)
            st = cuda_error(d, op, "kernel launch", e);
    }
    if (st == CT_OK)
        st = lt_run(d, &key, c, a, b, alpha, beta, &no_algo);
    pthread_mutex_unlock(&d->op_lock);
    if (st == CT_OK && no_algo)
        return cuda_fail(d, CT_ERR_UNSUPPORTED, op, "cuBLASLt has no fp8 algorithm for m=%lld n=%lld k=%lld (formats %s x %s%s)",
                         (long long)m, (long long)n, (long long)k, a_fmt == CT_F8_E4M3 ? "e4m3" : "e5m2",
                         b_fmt == CT_F8_E4M3 ? "e4m3" : "e5m2", rows ? ", row scales" : "");
    return st;
}

ct_status cuda_matmul_fp8(ct_device *dev, float *c, const uint8_t *a, const float *a_scale, ct_dtype a_fmt,
                          const uint8_t *b, const float *b_scale, ct_dtype b_fmt, int64_t m, int64_t n, int64_t k,
                          float alpha, float beta)
{
    cuda_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    return fp8_gemm(d, "matmul_fp8", c, a, a_scale, a_fmt, b, b_scale, b_fmt, m, n, k, alpha, beta, 0);
}

ct_status cuda_matmul_fp8_rows(ct_device *dev, float *c, const uint8_t *a, const float *a_scale, ct_dtype a_fmt,
                               const uint8_t *b, const float *b_scale, ct_dtype b_fmt, int64_t m, int64_t n, int64_t k,
                               float alpha, float beta)
{
    cuda_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    return fp8_gemm(d, "matmul_fp8_rows", c, a, a_scale, a_fmt, b, b_scale, b_fmt, m, n, k, alpha, beta, 1);
}

/* Best rate of a 4096^3 f32 matmul timed with events: a warm-up, then repetitions until two
 * or more have run and 50 ms have passed (about 20 on an H100; never more than 10 timed). */
ct_status cuda_measure_peak_flops(ct_device *dev, double *flops_per_s)
{
    cuda_device *d = dev;
    if (!d)
        return CT_ERR_INVALID;
    if (!flops_per_s)
        return cuda_fail(d, CT_ERR_INVALID, "measure_peak_flops", "null output");
    ct_status st = cuda_enter(d, "measure_peak_flops");
    if (st != CT_OK)
        return st;
    const int64_t n = 4096;
    const size_t bytes = sizeof(float) * (size_t)(n * n);
    float *a = NULL, *b = NULL, *c = NULL;
    cudaEvent_t start = NULL, stop = NULL;
    st = cuda_alloc(d, bytes, (void **)&a);
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
