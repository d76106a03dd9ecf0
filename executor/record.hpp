// nanoplan's executor writing its own memory record (`run --record FILE`) in the form of
// Megatron-LM's report_memory lines, which `nanoplan compare --log FILE` reads back: a GPU run of
// nanoplan's executor is then compared with the estimate the way a Megatron run is.
#pragma once
#include <string>

#include "executor/runner.hpp"

namespace np::exec {

// One line per rank, global rank order, after `steps` iterations:
//   [Rank R] (after K iterations) memory (MB) | allocated: A | max allocated: M | reserved: X |
//   max reserved: Y[ | total device memory used: D]
// MB is 2^20 bytes, as Megatron's. The figures are the rank's allocator's, full precision (the
// shortest decimal that reads back to the same double, as older Megatron printed Python's float
// repr), so the bytes read back exactly. Under --allocator caching: its blocks (allocated, sizes
// rounded) and segments (reserved), as torch.cuda.memory_allocated() and memory_reserved() count
// them; under exact (one device allocation per tensor) both are the plan's bytes in use. The
// backend's runtime buffers (a cuBLAS workspace) are outside the allocator, and outside these
// figures. D: the device's most bytes in use, where the backend can read it (a GPU).
std::string megatron_memory_record(const RunResult& r, int steps);

}  // namespace np::exec
