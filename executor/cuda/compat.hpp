// What the CUDA backend's sources include instead of the CUDA headers: the real runtime, cuBLAS
// and bf16 headers (nvcc, and host code such as the GPU tests that links the nvcc-built library),
// or, where NANOPLAN_CUDA_EMULATION is defined, the host emulation in executor/cuda/emu/. Kernels
// launch through np_launch, never <<<>>>, and take shared memory only through np_shared<T>()
// (dynamic shared memory), so one source serves both.
#pragma once
#include <cstddef>
#include <stdexcept>
#include <string>

#if defined(NANOPLAN_CUDA_EMULATION)
#include "executor/cuda/emu/cublas_emu.hpp"
#include "executor/cuda/emu/cuda_emu.hpp"
#define NP_HD
#else
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define NP_HD __host__ __device__
#endif

namespace np::cuda {

// Launches kernel over grid x block with `shared` bytes of dynamic shared memory on `stream`.
template <typename... Params, typename... Args>
void np_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared,
               cudaStream_t stream, Args... args) {
#if defined(NANOPLAN_CUDA_EMULATION)
  (void)stream;
  ::np::emu::launch(reinterpret_cast<const void*>(kernel), grid, block, shared,
                    [&] { kernel(args...); });
#elif defined(__CUDACC__)
  kernel<<<grid, block, shared, stream>>>(args...);
#else
  static_assert(sizeof...(Params) < 0, "kernels launch from .cu files (nvcc) or the emulation");
#endif
}

// This block's dynamic shared memory as T[] (128-byte aligned on a GPU, as the tensor-core tiles
// need at least 32; 16 in the emulation, whose tiles need no alignment).
template <typename T>
__device__ __forceinline__ T* np_shared() {
#if defined(NANOPLAN_CUDA_EMULATION)
  return static_cast<T*>(::np::emu::dynamic_shared());
#elif defined(__CUDACC__)
  extern __shared__ __align__(128) unsigned char np_shared_bytes[];
  return reinterpret_cast<T*>(np_shared_bytes);
#else
  static_assert(sizeof(T) == 0, "shared memory is for kernels (.cu files, or the emulation)");
  return nullptr;
#endif
}

// Errors name the statement, file:line and the device.
[[noreturn]] void cuda_failure(const char* statement, const char* file, int line,
                               const std::string& what);

}  // namespace np::cuda

#define NP_CUDA_CHECK(stmt)                                                             \
  do {                                                                                  \
    cudaError_t np_err_ = (stmt);                                                       \
    if (np_err_ != cudaSuccess)                                                         \
      ::np::cuda::cuda_failure(#stmt, __FILE__, __LINE__, cudaGetErrorString(np_err_)); \
  } while (0)
#define NP_CUBLAS_CHECK(stmt)                                                                \
  do {                                                                                       \
    cublasStatus_t np_st_ = (stmt);                                                          \
    if (np_st_ != CUBLAS_STATUS_SUCCESS)                                                     \
      ::np::cuda::cuda_failure(#stmt, __FILE__, __LINE__,                                    \
                               "cuBLAS status " + std::to_string(static_cast<int>(np_st_))); \
  } while (0)
// A kernel launch's errors surface at the next call; this checks at once.
#define NP_CUDA_CHECK_LAUNCH() NP_CUDA_CHECK(cudaGetLastError())

namespace np::cuda {

// Lets `kernel` take `bytes` of dynamic shared memory (past the default 48 KiB on a GPU).
template <typename... Params>
void np_allow_shared(void (*kernel)(Params...), size_t bytes) {
#if defined(NANOPLAN_CUDA_EMULATION)
  ::np::emu::allow_shared(reinterpret_cast<const void*>(kernel), bytes);
#elif defined(__CUDACC__)
  NP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(bytes)));
#else
  static_assert(sizeof...(Params) < 0, "kernels launch from .cu files (nvcc) or the emulation");
#endif
}

}  // namespace np::cuda
