/* tests/cuda_emu: a stand-in for cuBLAS (v2 API), the part the CUDA plugin uses. */
#ifndef CTITAN_CUDA_EMU_CUBLAS_V2_H
#define CTITAN_CUDA_EMU_CUBLAS_V2_H

#include "cublas_api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct emu_cublas *cublasHandle_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 } cublasMath_t;

cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode);
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *a, int lda, const float *b, int ldb, const float *beta,
                           float *c, int ldc);
const char *cublasGetStatusString(cublasStatus_t s);

#ifdef __cplusplus
}
#endif

#endif
