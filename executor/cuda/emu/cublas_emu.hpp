// Host emulation of the cuBLAS GEMM calls the CUDA backend makes, with cuBLAS's semantics:
// column-major matrices, op(A) and op(B) by transpose flags, leading dimensions, strided batches,
// bf16 or fp32 inputs and outputs, fp32 accumulation. Test infrastructure only.
//
// The workspace follows cuBLAS's documented rules (cuBLAS documentation, cublasSetStream and
// cublasSetWorkspace): cublasSetStream unconditionally resets the handle's workspace to cuBLAS's
// default pool, and a GEMM without a user workspace takes that pool, which cuBLAS allocates on
// the device itself (cudaMalloc here: kCublasDefaultWorkspace bytes, once per handle and stream,
// freed by cublasDestroy). A caller that sets its own workspace and then the stream loses it.
#pragma once
#include <cstdint>

#include "executor/cuda/emu/cuda_emu.hpp"

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cudaDataType { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
using cublasHandle_t = struct np_emu_cublas*;

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream);
// cuBLAS's default workspace pool on Hopper and later (cuBLAS documentation, cublasSetWorkspace).
inline constexpr size_t kCublasDefaultWorkspace = size_t{32} << 20;
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes);
// C = alpha op(A) op(B) + beta C; A is m x k after op, B is k x n, C is m x n, column-major.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void* alpha, const void* A, cudaDataType Atype, int lda, long long strideA,
    const void* B, cudaDataType Btype, int ldb, long long strideB, const void* beta, void* C,
    cudaDataType Ctype, int ldc, long long strideC, int batch, cublasComputeType_t compute,
    cublasGemmAlgo_t algo);
