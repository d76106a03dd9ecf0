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

}  // namespace np::cuda
