// The GPUs this process can use, for `nanoplan run --backend cuda|auto`.
#pragma once
#include <string>

namespace np::cuda {

struct GpuProbe {
  int count = 0;
  std::string why;  // when count is 0: what the CUDA runtime said
};
GpuProbe probe_gpus();

}  // namespace np::cuda
