// nanoplan sweep: every (tp, cp, pp, virtual stages, dp, ZeRO stage, micro-batch) that uses the given
// GPUs, each with its cheapest recompute plan under the budget, ranked by predicted throughput.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "planner/recompute/autoplan.hpp"

namespace np {

struct SweepOptions {
  int64_t gpus = 8;
  int64_t budget = 0;    // what a plan must fit: the budget given less the headroom
  int64_t headroom = 0;  // kept free of the budget given
  // How each row's `nanoplan estimate` command names the model and the budget (flags as given,
  // e.g. "--gpu h100"), so that it reproduces the row.
  std::string model_arg, budget_flags;
  int64_t global_batch = 0;  // sequences per optimizer step; 0: 4 x gpus
  TrainSpec base;  // seq_len, attention, optimizer, ... (tp/pp/dp/zero/micro-batch are swept)
  RuntimeAssumptions runtime;
  HardwareModel hw;
  bool search_partition = false;  // search the layers per stage of every setup too
  // Chunks per stage to try: 1 is the base schedule, v > 1 the interleaved one (pp > 1).
  std::vector<int64_t> virtual_stages = {1};
  // Context-parallel degrees to try (each sequence split over cp ranks).
  std::vector<int64_t> context_parallel = {1};
  // Expert-parallel degrees to try (MoE; each within the data-parallel replicas); empty: every
  // power of two that divides the experts, for an MoE model, else 1.
  std::vector<int64_t> expert_parallel;
  // Pipeline schedules to try for pp > 1 (v > 1 adds the interleaved one); base.pp_schedule when
  // empty.
  std::vector<PpSchedule> schedules;
};

struct SweepResult {
  TrainSpec setup;
  bool fits = false;
  double step_seconds = 0, tokens_per_second = 0, mfu = 0, recompute_seconds = 0;
  int64_t peak_bytes = 0;
  std::string plan;       // e.g. "80 x none+regather" per stage, compressed
  std::string recompute;  // short: none, full, selective, or "mixed: n of L layers"
};

struct SweepReport {
  std::vector<SweepResult> fitting;  // best first
  size_t evaluated = 0, invalid = 0, not_fitting = 0;
  double seconds = 0;
};

// `progress(done, total)` is called as setups are evaluated.
SweepReport sweep(const ModelSpec& m, const SweepOptions& o,
                  const std::function<void(size_t, size_t)>& progress = {});

// The `nanoplan estimate` command that reproduces a row (its setup, plan and step time).
std::string estimate_command(const SweepResult& x, const SweepOptions& o);

// The sweep's summary line and its best `top` setups as a table (each with its command), as a
// JSON document, or as CSV (a header row, then one row per setup).
std::string sweep_table(const SweepReport& r, const ModelSpec& m, const SweepOptions& o, size_t top);
nlohmann::json sweep_json(const SweepReport& r, const ModelSpec& m, const SweepOptions& o, size_t top);
std::string sweep_csv(const SweepReport& r, const SweepOptions& o, size_t top);

}  // namespace np
