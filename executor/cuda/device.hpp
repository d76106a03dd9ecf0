// The GPUs this process can use, for `nanoplan run --backend cuda|auto`.
#pragma once
#include <string>

namespace np::cuda {

struct GpuProbe {
  int count = 0;
  std::string why;  // when count is 0: what the CUDA runtime said
};
GpuProbe probe_gpus();
// Makes GPU (local_rank mod the GPUs present) this process's device (one process per rank).
void select_device(int local_rank);

}  // namespace np::cuda
