// nanoplan sweep: every (tp, cp, pp, virtual stages, dp, ZeRO stage, micro-batch) that uses the given
// GPUs, each with its cheapest recompute plan under the budget, ranked by predicted throughput.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "planner/autoplan.hpp"

namespace np {

struct SweepOptions {
  int64_t gpus = 8;
  int64_t budget = 0;
  int64_t global_batch = 0;  // sequences per optimizer step; 0: 4 x gpus
  TrainSpec base;  // seq_len, attention, optimizer, ... (tp/pp/dp/zero/micro-batch are swept)
  RuntimeAssumptions runtime;
  HardwareModel hw;
  bool search_partition = false;  // search the layers per stage of every setup too
  // Chunks per stage to try: 1 is the base schedule, v > 1 the interleaved one (pp > 1).
  std::vector<int64_t> virtual_stages = {1};
  // Context-parallel degrees to try (each sequence split over cp ranks).
  std::vector<int64_t> context_parallel = {1};
};

struct SweepResult {
  TrainSpec setup;
  bool fits = false;
  double step_seconds = 0, tokens_per_second = 0, mfu = 0, recompute_seconds = 0;
  int64_t peak_bytes = 0;
  std::string plan;  // e.g. "80 x none+regather" per stage, compressed
};

struct SweepReport {
  std::vector<SweepResult> fitting;  // best first
  size_t evaluated = 0, invalid = 0, not_fitting = 0;
  double seconds = 0;
};

// `progress(done, total)` is called as setups are evaluated.
SweepReport sweep(const ModelSpec& m, const SweepOptions& o,
                  const std::function<void(size_t, size_t)>& progress = {});

// The sweep's summary line and its best `top` setups as a table, or as a JSON document.
std::string sweep_table(const SweepReport& r, const ModelSpec& m, const SweepOptions& o, size_t top);
nlohmann::json sweep_json(const SweepReport& r, const ModelSpec& m, const SweepOptions& o, size_t top);

}  // namespace np
