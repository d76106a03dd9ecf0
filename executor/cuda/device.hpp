// The GPUs this process can use, for `nanoplan run --backend cuda|auto`.
#pragma once
#include <string>

namespace np::cuda {

struct GpuProbe {
  int count = 0;
  std::string why;  // when count is 0: what the CUDA runtime said
};
GpuProbe probe_gpus();

// Whether `run --backend cuda` may use the CUDA backend (not yet: it runs dense models through the
// emulation, but MoE, the eager attention GEMMs and the NCCL collectives are missing and it has
// not run on a GPU; README, "The CUDA backend").
constexpr bool kBackendComplete = false;

}  // namespace np::cuda
