// Predicted against measured, per rank: the planner's simulation of the schedule beside what the
// executor's tracking allocators saw, event by event (every allocation and release, with its
// instruction, tensor and bytes; the first divergence reported with what was live), and the
// peaks by category, with the live sets at both peaks when they differ.
#pragma once
#include <array>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "executor/runner.hpp"
#include "planner/recompute/cost.hpp"
#include "planner/schedule/estimate.hpp"
#include "planner/schedule/schedule.hpp"

namespace np::exec {

// The first event where the run and the plan part ways.
struct Divergence {
  int step = 0;            // 0-based training step
  size_t event = 0;        // index in the step's canonical event sequence
  int32_t instr = -1;      // plan instruction of the earlier of the two events
  std::string instr_name;  // e.g. "backward L0/mb1 attn.core"
  std::string predicted, measured;  // "alloc L0/mb1/attn.qkv (4,096 B)", or "nothing"
  std::vector<LiveAllocation> live;  // measured live tensors just before it, largest first
  int64_t live_bytes = 0;
};

struct RankComparison {
  int64_t rank = 0, stage = 0, dp_rank = 0, cp_rank = 0, tp_rank = 0;
  int64_t predicted = 0, measured = 0;
  std::array<int64_t, kCategories> predicted_at_peak{}, measured_at_peak{};
  std::string predicted_peak_at;
  std::vector<LiveTensor> predicted_live;     // filled when the peaks differ
  std::vector<LiveAllocation> measured_live;  // filled when the peaks differ
  std::vector<std::string> unplanned;
  std::vector<LiveAllocation> runtime_buffers;  // outside the plan (the estimate's overheads)
  size_t events = 0;  // events compared, all steps
  std::optional<Divergence> divergence;
  // --allocator caching: the predicted events replayed through the caching allocator model, for
  // as many steps as ran, against what the run's allocator reserved from the device (and its
  // blocks' peak, max allocated); absent under exact.
  std::optional<int64_t> predicted_reserved, measured_reserved;
  std::optional<int64_t> predicted_allocated_blocks, measured_allocated_blocks;
  int64_t difference() const { return measured - predicted; }
  bool equal() const {
    return !divergence && difference() == 0 && unplanned.empty() &&
           predicted_reserved == measured_reserved &&
           predicted_allocated_blocks == measured_allocated_blocks;
  }
};

// The device level, where the backend can read it (a GPU): the most bytes in use on a device
// (cudaMemGetInfo) against the allocator peaks of the ranks on it plus the estimate's runtime
// assumptions (CUDA context once per device, a cuBLAS workspace per rank, NCCL buffers per rank
// of one process per GPU with TP). The allocator peaks are the predicted reserved peaks under
// --allocator caching (its segments are the device memory), the schedule's peaks under exact
// (one cudaMalloc per tensor).
struct DeviceLevel {
  int64_t predicted = 0, measured = 0;
  int64_t allocator_peaks = 0, context = 0, workspaces = 0, nccl = 0;  // the prediction's terms
  // The executor's own buffers (FSDP's gradient staging), which PyTorch does not have: added to
  // the prediction so that the comparison stays PyTorch's terms against the rest.
  int64_t executor_buffers = 0;
  bool reserved = false;          // allocator_peaks are the caching allocator's reserved peaks
  int64_t measured_reserved = 0;  // caching: the measured reserved peaks of the device's ranks
  std::vector<LiveAllocation> measured_overheads;  // as rank 0's backend measured them
  double error() const { return predicted ? double(measured - predicted) / double(predicted) : 0; }
};

struct RunComparison {
  std::string title;
  TrainSpec setup;
  std::vector<RankComparison> ranks;
  std::vector<double> losses;
  bool all_equal = true;
  std::optional<DeviceLevel> device;
  RuntimeAssumptions runtime;
  std::vector<double> step_seconds;  // per step, the slowest rank's wall time
  // The cost model's step time for this plan on `hardware` (given for a GPU run): a model output.
  std::optional<double> predicted_step_seconds, predicted_recompute_seconds;
  std::string hardware;
};

RunComparison compare(const Schedule& s, const RunResult& r, std::string title,
                      const RuntimeAssumptions& runtime = {},
                      const HardwareModel* hardware = nullptr);
std::string comparison_table(const RunComparison& c);
nlohmann::json comparison_json(const RunComparison& c);

}  // namespace np::exec
