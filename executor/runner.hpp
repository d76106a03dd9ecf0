// Runs a schedule for real: one thread per (pipeline stage, TP rank), each with its own tracking
// allocator, backend and communicator. The runner binds the plan's tensor ids to what the kernels
// allocate and frees exactly where the plan says; it never reads byte counts from the plan.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "executor/allocator.hpp"
#include "executor/backend.hpp"
#include "planner/result.hpp"
#include "planner/schedule.hpp"

namespace np::exec {

struct RunOptions {
  int steps = 1;
  uint64_t seed = 1234;
  std::optional<int64_t> enforce_budget;  // per rank, bytes
  float lr = 1e-2f;                       // AdamW
  bool capture_grads = false;             // keep the first step's gradients, in global layout
  bool profile = false;                   // wall time per op kind and phase (last step)
};

struct RankResult {
  int64_t stage = 0, tp_rank = 0, global_rank = 0;
  int64_t measured_peak = 0;
  std::array<int64_t, kCategories> measured_at_peak{};
  std::vector<LiveAllocation> live_at_peak;
  std::vector<int64_t> timeline;       // bytes in use after every allocation and release
  std::vector<std::string> unplanned;  // allocations the plan did not name (a mismatch)
};

struct RunResult {
  std::vector<double> losses;  // per step: mean per-token loss over the step's micro-batches
  std::vector<RankResult> ranks;
  // First step's gradients by global weight key, in the global (unsharded) layout.
  std::map<std::string, std::vector<float>> grads;
  // Forward executions (forward + recompute) per (stage, block, op) in one step.
  std::map<std::array<int, 3>, int> forward_runs;
  // With RunOptions::profile: seconds of the last step by "phase op-kind" (e.g. "backward
  // flash_attention", "p2p", "optimizer"), summed over ranks.
  std::map<std::string, double> profile;
  std::optional<OutOfBudget> out_of_memory;
  int64_t oom_rank = -1;
};

using BackendFactory = std::function<std::unique_ptr<Backend>()>;

// Which setups the executor can run; an error names the limit and the way out.
std::optional<Error> check_runnable(const Schedule& s);

// Runs `options.steps` training steps. Errors other than running out of the enforced budget (which
// is reported in RunResult::out_of_memory) come back as an Error.
Result<RunResult> run_schedule(const Schedule& s, const BackendFactory& backend,
                               const RunOptions& options);

}  // namespace np::exec
