// One rank of a run: the per-rank entry point. A process (or thread) that owns one device runs
// one (pipeline stage, DP rank, TP rank) of a schedule with its own backend and communicator; run_schedule
// (runner.hpp) runs every rank of a schedule as threads of one process.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "executor/allocator.hpp"
#include "executor/backend.hpp"
#include "planner/schedule/schedule.hpp"

namespace np::exec {

struct RunOptions {
  int steps = 1;
  // The ranks' memory is a device's (the CUDA backend), not this host's: no host-memory check.
  bool device_memory = false;
  uint64_t seed = 1234;
  std::optional<int64_t> enforce_budget;  // per rank, bytes
  // What allocates the plan's tensors (run --allocator): one device allocation each (exact), or
  // PyTorch's caching allocator over the device's memory (caching; executor/allocator.hpp).
  AllocatorChoice allocator = TrackingAllocator::exact_allocator();
  float lr = 1e-2f;                       // AdamW
  bool capture_grads = false;             // keep the first step's gradients, in global layout
  bool profile = false;                   // wall time per op kind and phase (last step)
};

struct RankResult {
  int64_t stage = 0, dp_rank = 0, cp_rank = 0, tp_rank = 0, global_rank = 0;  // dp: replica
  int64_t measured_peak = 0;
  std::array<int64_t, kCategories> measured_at_peak{};
  std::vector<LiveAllocation> live_at_peak;
  std::vector<int64_t> timeline;  // bytes in use after every allocation and release
  // Every allocation and release, per step, canonical order (planner/schedule/simulate.hpp).
  std::vector<std::vector<MemEvent>> events;
  // Allocations the plan did not name (MemEvent tensor -(1 + k) is the k-th), a divergence.
  std::vector<std::string> unplanned;
  // The backend's runtime buffers (a cuBLAS workspace), outside the plan's accounting.
  std::vector<LiveAllocation> runtime_buffers;
  // The device level: the most bytes the device reported in use (a GPU: cudaMemGetInfo), and
  // the runtime's overheads as the backend measured them; absent on the CPU.
  std::optional<int64_t> measured_device_peak;
  // --allocator caching: the most device bytes the allocator's segments held (max reserved) and
  // the most its blocks held (max allocated, sizes rounded); absent under exact.
  std::optional<int64_t> measured_reserved_peak, measured_allocated_blocks_peak;
  // At the end of the run: the plan's bytes in use, and under caching the allocator's reserved
  // and allocated (blocks) bytes, as torch.cuda.memory_reserved() and memory_allocated() say.
  int64_t measured_in_use_at_end = 0;
  std::optional<int64_t> measured_reserved_at_end, measured_allocated_blocks_at_end;
  std::vector<LiveAllocation> measured_overheads;
  std::vector<double> step_seconds;  // wall time of each step, the device's work included
};

// What one rank reports besides its memory.
struct RankRun {
  RankResult memory;
  // Per step: the summed per-token losses of this replica's micro-batches over the step's tokens
  // (all replicas'); the last stage's TP rank 0 only. The step's loss sums them over DP ranks.
  std::vector<double> losses;
  // First step's gradients by global weight key, global layout; NaN where other ranks hold them.
  std::map<std::string, std::vector<float>> grads;
  std::map<std::array<int, 3>, int> forward_runs;  // per (stage, block, op): forward executions
  std::map<std::string, double> profile;           // seconds by "phase op-kind" (last step)
};

// Runs `options.steps` steps of rank (stage, DP rank, TP rank) (the DP and TP ranks are the
// communicator's). Throws OutOfBudget when the enforced budget or the device refuses an
// allocation, RunAborted when a peer gave up, and std::exception for anything else.
RankRun run_rank(const Schedule& s, int64_t stage, Backend& backend, Communicator& comm,
                 const RunOptions& options);

}  // namespace np::exec
