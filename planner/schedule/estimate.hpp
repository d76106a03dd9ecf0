// The per-GPU memory estimate of a training setup: static bytes, the simulated activation and
// transient peak of every pipeline stage, runtime overheads on their own lines, and, when it does
// not fit the budget, the nearest setups that do (each found by estimating it).
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "planner/schedule/caching_allocator.hpp"
#include "planner/schedule/runtime_terms.hpp"
#include "planner/schedule/schedule.hpp"
#include "planner/inputs/spec.hpp"

namespace np {

struct LayerSaved {
  int index = 0;
  std::string policy;
  int64_t saved_bytes = 0;  // per micro-batch
};

struct LiveTensor {
  std::string name;
  int64_t bytes = 0;
  Category category;
};

struct StageEstimate {
  int stage = 0;
  int64_t first_rank = 0;  // global rank of the stage's first TP rank (order: pp, dp, tp)
  int first_layer = 0, num_layers = 0;
  std::string layer_ranges;                  // e.g. "0-9", or "0-4,20-24" when interleaved
  int64_t in_flight = 0;                     // micro-batches whose activations are alive at once
  int64_t chunk_passes = 0;  // interleaved: chunk passes alive at once (in_flight: per chunk)
  std::array<int64_t, kCategories> bytes{};  // by category, at the stage's peak
  int64_t allocator_peak = 0;                // sum of bytes
  std::vector<OverheadLine> overheads;
  int64_t overhead_bytes = 0;
  int64_t peak_bytes = 0;  // allocator_peak + overhead_bytes: device memory in use
  // What torch.cuda.max_memory_allocated() reports: the schedule's tensors plus the overhead
  // lines held in PyTorch's caching allocator (workspaces, the framework's buffers), as the
  // allocator hands out blocks (sizes rounded; exact under --allocator exact).
  int64_t allocated_peak = 0;
  // What torch.cuda.max_memory_reserved() reports: the segments the allocator holds at its
  // steady state, from replaying the stage's events (caching_allocator.hpp); equal to
  // allocated_peak under --allocator exact. The overhead line "allocator cache" is its excess
  // over the live bytes at the peak.
  int64_t reserved_peak = 0;
  int allocator_steps = 0;      // steps replayed to reach the steady state (0: exact)
  bool allocator_steady = true;  // the replay reached it
  std::string peak_at;     // the instruction at the peak
  std::vector<LayerSaved> layers;
  int64_t embedding_saved = 0, head_saved = 0;  // per micro-batch
  std::vector<LiveTensor> live_at_peak;         // with EstimateOptions::explain_peak
};

struct Suggestion {
  std::string change;  // e.g. "--pp 4"
  std::string note;    // what else changes
  TrainSpec setup;
  int64_t peak_bytes = 0;
};

struct Estimate {
  ModelSpec model;
  int64_t parameters = 0;
  TrainSpec setup;
  RuntimeAssumptions runtime;
  std::optional<int64_t> budget;  // what the peak must fit: the budget given less the headroom
  int64_t headroom = 0;           // bytes kept free of the budget given (--headroom)
  bool fits = true;
  int64_t peak_bytes = 0;  // device memory in use on the peak rank
  int peak_stage = 0;
  int64_t peak_rank = 0;
  int64_t allocated_peak_bytes = 0;  // the most any rank's caching allocator holds
  int allocated_peak_stage = 0;
  int64_t reserved_peak_bytes = 0;  // the most any rank's caching allocator reserves
  int reserved_peak_stage = 0;
  std::vector<StageEstimate> stages;
  std::vector<Suggestion> suggestions;
};

// Allocator replays already made (caching_allocator.hpp, replay_steps), by their events: stages
// with the same events and kept allocations (AFAB's middle stages, or a stage an auto plan's
// verification did not change) replay alike. One allocator configuration per cache.
class ReplayCache {
 public:
  // Safe to call from several threads (the stages of one estimate are replayed in parallel).
  AllocatorReplay get(const std::vector<MemEvent>& events, const std::vector<int64_t>& kept,
                      const AllocatorConfig& c);

 private:
  std::mutex mu_;
  struct Entry {
    uint64_t hash;
    size_t events;
    AllocatorReplay replay;
  };
  std::vector<Entry> done_;
};

struct EstimateOptions {
  std::optional<int64_t> budget;  // bytes per GPU
  bool suggestions = true;        // search nearby setups when it does not fit
  bool explain_peak = false;      // list the live tensors at each stage's peak
  ReplayCache* replays = nullptr;  // replays to reuse and add to (else the estimate's own)
};

// The nearest setups that fit, one per family, each found by asking `fits` (a peak when it fits):
// first those that keep the GPUs and the global batch (a higher ZeRO stage over the same
// replicas, more TP in place of DP, full recompute, a smaller micro-batch), then those that take
// more GPUs or a larger global batch (more pp, ZeRO-1 over more dp, context parallelism).
using PeakIfFits = std::function<std::optional<int64_t>(const TrainSpec&)>;
std::vector<Suggestion> nearest_setups(const ModelSpec& m, const TrainSpec& t,
                                       const PeakIfFits& fits);

// The setup must already be valid (validate_setup).
Estimate estimate(const ModelSpec& m, const TrainSpec& t, const RuntimeAssumptions& rt,
                  const EstimateOptions& options);
// Estimates an already built schedule (the one code path behind `estimate` and `plan`).
Estimate estimate_schedule(const Schedule& s, const RuntimeAssumptions& rt,
                           const EstimateOptions& options);

}  // namespace np
