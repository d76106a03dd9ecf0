// Virtual ranks on one GPU: the in-process world's Transfer on device memory (cudaMemcpy between
// ranks' buffers, and a reduction kernel summing them in rank order in fp32), so that the CUDA
// backend runs tensor- and pipeline-parallel plans as threads sharing one device, each rank with
// its own tracking allocator. NCCL refuses two ranks on one GPU; this needs no NCCL.
#pragma once
#include "executor/comm/inproc.hpp"

namespace np::cuda {

// At most this many ranks per TP group (the reduction kernel's argument holds their pointers).
inline constexpr int kMaxVirtualRanks = 16;

// Moves and sums device memory (cudaMemcpy, a reduction kernel).
std::shared_ptr<exec::Transfer> device_transfer();
// The world factory of virtual ranks: an in-process world over device memory.
exec::CommWorldFactory virtual_rank_world();

}  // namespace np::cuda
