// Runs a schedule for real: every (pipeline stage, TP rank) as a thread of this process, each
// with its own backend (device memory, kernels) and communicator, through the per-rank entry
// point run_rank (rank.hpp). The results are merged into one RunResult.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "executor/comm/comm.hpp"
#include "executor/rank.hpp"
#include "planner/inputs/result.hpp"
#include "planner/schedule/schedule.hpp"

namespace np::exec {

struct RunResult {
  std::vector<double> losses;  // per step: mean per-token loss over the step's micro-batches
  // Each replica's (and CP rank's) part of the losses, by global rank (summed in that order by
  // finish_merge).
  std::map<int64_t, std::vector<double>> loss_parts;
  std::vector<RankResult> ranks;  // by global rank
  // First step's gradients by global weight key, in the global (unsharded) layout.
  std::map<std::string, std::vector<float>> grads;
  // Forward executions (forward + recompute) per (stage, block, op) in one step.
  std::map<std::array<int, 3>, int> forward_runs;
  // With RunOptions::profile: seconds of the last step by "phase op-kind" (e.g. "backward
  // flash_attention", "p2p", "optimizer_step"), summed over ranks.
  std::map<std::string, double> profile;
  std::optional<OutOfBudget> out_of_memory;
  int64_t oom_rank = -1;
  // Ranks sharing one device: every rank of an in-process run (virtual ranks on one GPU), 1 for
  // one process per rank.
  int64_t ranks_per_device = 1;
};

using BackendFactory = std::function<std::unique_ptr<Backend>()>;

// The in-process communicators (ranks as threads).
CommWorldFactory in_process_world();

// Which setups the executor can run; an error names the limit and the way out (bad input).
// `host_memory`: the ranks' memory is this host's (the CPU executor).
std::optional<Error> check_runnable(const Schedule& s, bool host_memory = true);
// Whether this host has the free memory for every rank's predicted peak (the CPU executor); a
// refusal is the executor's failure (exit 4), checked by run_schedule.
std::optional<Error> check_host_memory(const Schedule& s);

// Adds one rank's report to a run's: its memory, its replica's part of the loss (the last stage's
// TP rank 0), the gradients it holds (NaN elsewhere), forward counts (TP rank 0's of DP rank 0),
// profile times (summed). finish_merge then sorts the ranks and sums the losses.
void merge_rank(RunResult& result, RankRun&& run);
void finish_merge(RunResult& result);

// Runs `options.steps` training steps. Errors other than running out of the enforced budget (which
// is reported in RunResult::out_of_memory) come back as an Error.
Result<RunResult> run_schedule(const Schedule& s, const BackendFactory& backend,
                               const RunOptions& options,
                               const CommWorldFactory& world = in_process_world());

}  // namespace np::exec
