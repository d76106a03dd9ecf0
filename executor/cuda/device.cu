// GPU discovery through the CUDA runtime.
#include "executor/cuda/compat.hpp"
#include "executor/cuda/device.hpp"

namespace np::cuda {

GpuProbe probe_gpus() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return {0, cudaGetErrorString(e)};
  return {n, n > 0 ? "" : "no CUDA device"};
}

void select_device(int local_rank) {
  int n = 0;
  NP_CUDA_CHECK(cudaGetDeviceCount(&n));
  if (n > 0) NP_CUDA_CHECK(cudaSetDevice(local_rank % n));
}

}  // namespace np::cuda
