/* tests/cuda_emu: the cuBLAS types both stand-in headers share (see cuda_runtime_api.h). */
#ifndef CTITAN_CUDA_EMU_CUBLAS_API_H
#define CTITAN_CUDA_EMU_CUBLAS_API_H

#include "cuda_runtime_api.h"

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_NOT_SUPPORTED = 15
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 } cublasComputeType_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14, CUDA_R_8F_E4M3 = 28, CUDA_R_8F_E5M2 = 29 } cudaDataType;

#endif
