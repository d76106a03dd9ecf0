// --recompute auto: the cheapest recompute plan that fits the budget. For the decoder-layer graph
// it computes the frontier of options; for every pipeline stage it solves the stage problem
// (solve.hpp) and then checks the plan with the schedule simulation, tightening the stage's budget
// and solving again if the simulated peak is over (so a plan's peak never exceeds its budget).
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "planner/recompute/cost.hpp"
#include "planner/schedule/estimate.hpp"
#include "planner/recompute/frontier.hpp"
#include "planner/recompute/solve.hpp"

namespace np {

struct StagePlan {
  int stage = 0;
  bool feasible = false;
  int64_t min_peak = 0;  // smallest achievable peak (bytes, with overheads) when not feasible
  std::vector<int> layer_option;  // index into AutoPlan::frontier.options, per layer of the stage
  // Interleaved stages: false when the solver's search stopped at its branch limit
  // (kChunkSearchBranches) before proving the plan cheapest (or, not feasible, its peak least);
  // then no plan re-runs less than `recompute_lower` seconds per micro-batch, where this one
  // re-runs `recompute` seconds.
  bool proven = true;
  double recompute = 0, recompute_lower = 0;
};

struct AutoPlan {
  bool fits = false;
  LayerFrontier frontier;                   // of the decoder-layer graph
  std::vector<std::string> option_names;    // per frontier option: "none", "full", "custom (...)"
  // A mixed model's dense layers (ModelSpec::dense_layers): their own graph's frontier; frontier
  // is then the MoE layers'. Empty otherwise.
  LayerFrontier dense_frontier;
  std::vector<std::string> dense_option_names;
  std::vector<BlockPolicy> layer_policies;  // per global layer, the chosen option's mask
  std::optional<BlockPolicy> embedding_policy, head_policy;  // the chosen options of those blocks
  std::vector<StagePlan> stages;
  Schedule schedule;                             // built with layer_policies
  Estimate estimate;                             // of that schedule
  StepTime time;                                 // of that schedule
  std::optional<StepTime> time_none, time_full;  // uniform nanotron settings, for comparison
  std::optional<int64_t> peak_none, peak_full;   // their peaks (bytes, with overheads)
  // Under FSDP2, torchtitan's default checkpointing (selective_ac_option "2": full recompute of
  // every `every`th layer), for comparison; 0 and empty otherwise.
  int64_t every = 0;
  std::optional<StepTime> time_every;
  std::optional<int64_t> peak_every;
  // Under the torchtitan profile, torchtitan's per-op checkpointing (selective_ac_option "op") of
  // every layer, for comparison; empty otherwise.
  std::optional<StepTime> time_op;
  std::optional<int64_t> peak_op;
  int64_t regathered = 0, gathers = 0;  // all-gathers re-done in backward, of all in the blocks
  bool partition_searched = false;      // schedule.setup.stage_layers came from --partition auto
  int simulations = 0;  // verification rounds: 1 when the stage model saw everything the
                        // simulation sees, more when a stage's budget had to be tightened
};

// Layer frontiers by graph shape, reused across the setups of one model that share one (a sweep);
// safe to share between threads.
struct FrontierCache {
  struct Entry {
    std::once_flag once;  // computed by the first thread that needs it; others wait
    LayerFrontier frontier;
    std::vector<std::string> names;
    // Interleaved stages: the Pareto choices of a chunk's layers with kept + transient bytes
    // within a cap (the largest asked for so far), by (layer count, ZeRO transient per layer).
    struct ChunkChoices {
      std::mutex mu;  // held while they are computed: other keys go on in parallel
      int64_t cap = -1;
      std::shared_ptr<const std::vector<ParetoChoice>> choices;
    };
    std::mutex chunk_mu;  // guards the map only
    std::map<std::pair<int64_t, int64_t>, ChunkChoices> chunk_choices;
    RunTablesCache run_tables;  // the stage solver's tables over runs of these layers
  };
  std::mutex mu;  // guards the map only: different keys are computed in parallel
  std::map<std::string, std::shared_ptr<Entry>> entries;
};

struct AutoPlanOptions {
  // Find the smallest achievable peak and the plan reaching it. Without it (the sweep), a plan
  // that cannot fit is settled as soon as a stage fits no choice, and its estimate is the
  // simulation's alone, without the caching allocator's replay (reserved could only be higher).
  bool closest_when_infeasible = true;
  bool compare_uniform = true;     // also time and size no recompute and recompute_layer: true
  FrontierCache* cache = nullptr;  // reuse frontiers of identical layer graphs
  bool full_schedule = true;  // build AutoPlan::schedule with every micro-batch (for plan files)
  // Search the layers per stage too (when the setup gives none): the split whose slowest stage,
  // with its optimal plan, takes least time per micro-batch. AutoPlan::schedule.setup carries
  // the partition when it differs from the balanced one.
  bool search_partition = false;
};

// The setup's recompute must be Recompute::kAuto and the setup valid.
AutoPlan auto_plan(const ModelSpec& m, const TrainSpec& t, const RuntimeAssumptions& rt,
                   int64_t budget, const HardwareModel& hw, const AutoPlanOptions& options = {});

// True when no recompute plan of the setup can fit `budget` (the usable bytes, as auto_plan's),
// proven without the layer frontier: some pipeline stage's static bytes and fixed runtime lines,
// plus its in-flight micro-batches times the least bytes any recompute choice keeps of each of
// its layers and the least working bytes of its last layer, exceed it. The split is the setup's
// (no partition search). A sweep skips such setups; false says nothing (auto_plan decides).
bool cannot_fit(const ModelSpec& m, const TrainSpec& t, const RuntimeAssumptions& rt,
                int64_t budget);

// What planning a setup needs besides the model and the setup: the runtime assumptions, the
// usable budget (the budget less the headroom) and the headroom, the cost model's hardware, and
// the auto planner's options.
struct PlanInputs {
  RuntimeAssumptions rt;
  std::optional<int64_t> budget;
  int64_t headroom = 0;
  HardwareModel hw;
  AutoPlanOptions options;
};

// A setup planned and estimated: the schedule it asks for (the auto plan's under
// Recompute::kAuto, whose schedule is moved here), its estimate against the budget with the
// headroom and, for an auto plan, the plan's own verdict on the fit.
struct PlannedSetup {
  Schedule schedule;
  Estimate estimate;
  std::optional<AutoPlan> plan;
};
// Recompute::kAuto needs in.budget. What plan, report, run and --emit share.
PlannedSetup plan_setup(const ModelSpec& m, const TrainSpec& t, const PlanInputs& in);

// The schedule a setup asks for: the auto planner's (under `budget`, which Recompute::kAuto
// needs) or the uniform policy's. This is what `plan` writes and `run --model` executes.
Schedule schedule_for_setup(const ModelSpec& m, const TrainSpec& t, const RuntimeAssumptions& rt,
                            std::optional<int64_t> budget, const HardwareModel& hw,
                            const AutoPlanOptions& options = {});

// A short name of a layer option: a named policy's name when the mask equals one, else
// "custom: re-runs a, b, c".
std::string option_name(const BlockGraph& g, const std::vector<bool>& mask);

}  // namespace np

namespace np {

// The nearest setups for which the auto planner fits (nearest_setups' families), each found by
// planning it.
std::vector<Suggestion> auto_suggestions(const ModelSpec& m, const TrainSpec& t,
                                         const RuntimeAssumptions& rt, int64_t budget,
                                         const HardwareModel& hw);

// The step time of a setup under its named recompute policy (none, selective, full): the cost
// model over its schedule, every micro-batch counted.
StepTime named_step_time(const ModelSpec& m, const TrainSpec& t, const HardwareModel& hw);

}  // namespace np
