// A scenario's setup matrix run on one executor (nanoplan run --scenario): every setup checked
// before any runs, then each run, compared event by event and judged by the scenario's checks.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "executor/backend_choice.hpp"
#include "executor/compare.hpp"
#include "planner/inputs/scenario.hpp"
#include "planner/recompute/cost.hpp"

namespace np::exec {

struct ScenarioCase {
  TrainSpec setup;
  RunComparison comparison;
  std::string why;  // the scenario's checks that failed; empty when it passed
};

// Where a scenario stopped before its end, and why.
enum class ScenarioStop {
  kNone,
  kRefused,      // a setup the executor cannot run (bad input), before anything ran
  kHostMemory,   // a setup past the CPU executor's host memory, before anything ran
  kRunFailed,    // the executor failed on a setup
  kOutOfMemory,  // an enforced budget stopped a rank
};

struct ScenarioResult {
  int failed = 0;  // setups whose checks failed
  ScenarioStop stop = ScenarioStop::kNone;
  TrainSpec stopped_at;  // the setup it stopped at
  std::string message;   // what stopped it (with the rank, for kOutOfMemory)
};

// Runs `sc` with `options` (its steps when options.steps is 1); `hardware`, when given, adds the
// cost model's step time to each comparison. `started` is called once every setup passed the
// checks, before the first run; `each` sees every case as it completes.
ScenarioResult run_scenario(const Scenario& sc, const Executor& ex, RunOptions options,
                            const RuntimeAssumptions& rt, const HardwareModel* hardware,
                            const std::function<void()>& started,
                            const std::function<void(const ScenarioCase&)>& each);

}  // namespace np::exec
