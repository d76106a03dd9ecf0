// The CUDA backend behind the executor's Backend interface: device memory on cudaMalloc (through
// the rank's tracking allocator, like every backend), the kernels of executor/cuda/*.cu, GEMMs
// through cuBLAS (its workspace a runtime buffer from the allocator). It runs every op of the
// dense and MoE models (ep = 1). Its collectives and pipeline transfers go through the rank's
// communicator on device pointers: virtual ranks on one GPU (transfer.hpp) serve them.
#pragma once
#include <memory>

#include "executor/backend.hpp"

namespace np::cuda {

std::unique_ptr<exec::Backend> make_cuda_backend();

}  // namespace np::cuda
