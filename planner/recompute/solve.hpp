// The stage solver: pick one recompute option per decoder layer of a pipeline stage, minimising
// recompute time subject to the stage's peak staying within its byte budget, exactly under the
// peak model below (Pareto dynamic programmes; tests compare them with exhaustive search and with
// each other).
//
// Peak model of a stage with f micro-batches in flight, K = sum of kept bytes over its layers:
//   peak = base + f K + max(extra, max over layers l of (w_l - k_l - Q_{l+1}))
// where w_l, k_l are layer l's working and kept bytes and Q_{l+1} the kept bytes of the layers
// after l. It is the memory while layer l runs its backward for the oldest micro-batch (or its
// forward for the newest): the other f - 1 micro-batches keep everything, this one still keeps
// the layers before l, and layer l holds its working set. `base` is the static bytes plus the
// non-layer kept bytes; `extra` covers the embedding and head working sets.
// Stages of several model chunks (the interleaved schedule) take ChunkedStageProblem (solve_chunks.hpp).
#pragma once
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "planner/recompute/frontier.hpp"
#include "planner/schedule/schedule.hpp"

namespace np {

struct StageOption {
  int64_t kept = 0, working = 0;
  double cost = 0;
};

struct StageProblem {
  int64_t budget = 0;     // bytes for the whole stage
  int64_t base = 0;       // static + non-layer kept bytes
  int64_t in_flight = 1;  // f
  int64_t extra = 0;      // lower bound of the transient term (embedding / head working sets)
  std::vector<std::vector<StageOption>> layers;  // per layer in forward order: its options
};

struct StageSolution {
  bool feasible = false;
  double cost = 0;
  std::vector<int> choice;  // option index per layer
  int64_t peak = 0;         // model peak of the choice
};

int64_t model_peak(const StageProblem& p, const std::vector<int>& choice);
// A choice's kept bytes K and transient term E = max(extra, max_l (w_l - k_l - Q_{l+1})).
std::pair<int64_t, int64_t> layer_terms(const std::vector<std::vector<StageOption>>& layers,
                                        const std::vector<int>& choice, int64_t extra);
// The solver's tables for a run of layers sharing one option list, kept for reuse: they depend
// on the options (their working bytes up to a common shift) and f only, so the stages of a plan,
// its verification rounds and a sweep's setups with the same layer share them. Thread-safe.
struct RunTables;
class RunTablesCache {
 public:
  RunTablesCache();
  ~RunTablesCache();
  std::shared_ptr<const RunTables> get(const std::vector<StageOption>& options, int64_t f);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The cheapest choice within the budget. With `below`, only a choice costing less than it is
// wanted: the result is infeasible when there is none (a caller's bound that prunes the search).
// `cache`: tables to reuse and add to (else the solve makes its own).
StageSolution solve_stage(const StageProblem& p,
                          double below = std::numeric_limits<double>::infinity(),
                          RunTablesCache* cache = nullptr);
// The general programme over layers, for any stage. solve_stage uses it for stages whose layers
// differ and a faster exact programme over option groups for the others; tests compare the two.
StageSolution solve_stage_programme(const StageProblem& p);
// Exhaustive search over every combination (the test oracle; small instances only).
StageSolution brute_force_stage(const StageProblem& p);
// The smallest achievable model peak (for "nothing fits" reports), and a choice reaching it.
int64_t min_stage_peak(const StageProblem& p);
StageSolution min_peak_solution(const StageProblem& p);

// Every choice of a stage's layers that no other beats on all of (kept bytes K, K + E, cost),
// E = max(extra, max_l (w_l - k_l - Q_{l+1})) the transient term, and that keeps base + f K + E
// within the budget; K counts the layers only. (K + E, not E: a chunk's E enters a step's peak
// only while the chunk runs, with at least its own pass alive, so each step grows with K and
// K + E.)
struct ParetoChoice {
  int64_t kept = 0, transient = 0;
  double cost = 0;
  std::vector<int> choice;  // option index per layer
};
std::vector<ParetoChoice> pareto_choices(const StageProblem& p);

}  // namespace np
