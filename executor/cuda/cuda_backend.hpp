// The CUDA backend behind the executor's Backend interface: device memory on cudaMalloc (through
// the rank's tracking allocator, like every backend), the kernels of executor/cuda/*.cu, GEMMs
// through cuBLAS. In progress: it runs the ops of the dense models (Llama, Qwen, GPT) through the
// CUDA emulation in tests; MoE and the eager attention GEMMs are not written yet, and its
// collectives use the rank's communicator on device pointers, which only the emulation (host
// memory) supports until the NCCL communicator exists.
#pragma once
#include <memory>

#include "executor/backend.hpp"

namespace np::cuda {

std::unique_ptr<exec::Backend> make_cuda_backend();

}  // namespace np::cuda
