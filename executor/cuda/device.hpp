// The GPUs this process can use, for `nanoplan run --backend cuda|auto`.
#pragma once
#include <string>

namespace np::cuda {

struct GpuProbe {
  int count = 0;
  std::string why;  // when count is 0: what the CUDA runtime said
};
GpuProbe probe_gpus();

// Whether the CUDA backend runs a whole training step yet (it does not: its kernels are being
// written op family by op family; README, "The CUDA backend").
constexpr bool kBackendComplete = false;

}  // namespace np::cuda
