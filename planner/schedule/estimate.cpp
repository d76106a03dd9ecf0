// Estimate assembly: simulate each stage's program, add the runtime overheads, search suggestions.
#include "planner/schedule/estimate.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "planner/inputs/units.hpp"
#include "planner/schedule/caching_allocator.hpp"
#include "planner/schedule/parallel.hpp"
#include "planner/schedule/simulate.hpp"

namespace np {
namespace {

std::vector<LiveTensor> live_tensors(const StageProgram& p, const SimResult& r) {
  std::vector<LiveTensor> out;
  for (int32_t id : r.live_at_peak)
    out.push_back({p.tensor_name(id), p.tensors[id].bytes, p.tensors[id].category});
  std::stable_sort(out.begin(), out.end(),
                   [](const LiveTensor& a, const LiveTensor& b) { return a.bytes > b.bytes; });
  return out;
}

StageBlocks stage_blocks(const StageProgram& p) {
  StageBlocks b;
  int chunk = -1;
  for (const StageBlock& blk : p.blocks) {
    if (blk.kind == BlockKind::kLayer) {
      if (!b.layer) b.layer = blk.graph.get();
      if (blk.graph.get() != b.layer) b.other_layer = blk.graph.get();  // dense and MoE layers
      ++b.layers;
    }
    if (blk.kind == BlockKind::kHead) b.head = blk.graph.get();
    if (blk.kind == BlockKind::kEmbedding) b.embedding = true;
    chunk = std::max(chunk, blk.chunk);
  }
  b.chunks = chunk + 1;
  return b;
}

// The reserved bytes beyond the live ones at the peak: the blocks' rounding and what the
// allocator keeps cached. Not in torch.cuda.max_memory_allocated(), in max_memory_reserved().
OverheadLine allocator_line(const AllocatorChoice& c, const AllocatorReplay& a, int64_t bytes) {
  std::string how = std::string("PyTorch's caching allocator (--allocator ") + name_of(c.model) +
                    (c.options.empty() ? "" : ", --allocator-conf " + quote_input(c.options)) +
                    ") replayed over " + count_noun(a.steps, "step") +
                    (a.steady ? " to its steady state" : ", still growing") +
                    ": block rounding and cached free blocks, " +
                    count_noun(a.segments, c.model == AllocatorModel::kExpandable
                                               ? "expandable segment"
                                               : "segment");
  return {"allocator cache", bytes, how, false};
}

StageEstimate estimate_stage(const Schedule& s, const StageProgram& p, const RuntimeAssumptions& rt,
                             bool explain, ReplayCache& replays) {
  const TrainSpec& t = s.setup;
  const bool replay = rt.allocator.model != AllocatorModel::kExact;
  SimResult r = simulate(p, {.live_set = explain, .events = replay, .canonical = false});
  StageEstimate e;
  e.stage = p.stage;
  e.first_rank = static_cast<int64_t>(p.stage) * t.dp * t.cp * t.tp;
  e.first_layer = p.first_layer();
  e.num_layers = p.num_layers();
  e.layer_ranges = format_ranges(p.layers());
  e.in_flight = in_flight(t.pp_schedule, p.stage, t.pp, t.microbatches, t.virtual_stages);
  e.chunk_passes =
      chunk_passes_in_flight(t.pp_schedule, p.stage, t.pp, t.microbatches, t.virtual_stages);
  e.bytes = r.at_peak;
  e.allocator_peak = r.peak_bytes;
  e.overheads = stage_overheads(s.model, t, rt, stage_blocks(p));
  std::vector<int64_t> kept;  // the lines the allocator holds, for the run
  for (const OverheadLine& o : e.overheads)
    if (o.allocator)
      for (int64_t b : allocations_of(o)) kept.push_back(b);
  const int64_t live = e.allocator_peak + std::accumulate(kept.begin(), kept.end(), int64_t{0});
  e.allocated_peak = e.reserved_peak = live;
  if (replay) {
    AllocatorReplay a = replays.get(r.events, kept, rt.allocator.config);
    e.allocated_peak = a.max_allocated;
    e.reserved_peak = a.max_reserved;
    e.allocator_steps = a.steps;
    e.allocator_steady = a.steady;
    e.overheads.push_back(allocator_line(rt.allocator, a, e.reserved_peak - live));
  }
  for (const OverheadLine& o : e.overheads) e.overhead_bytes += o.bytes;
  e.peak_bytes = e.allocator_peak + e.overhead_bytes;
  e.peak_at = r.peak_instr >= 0 ? p.instr_name(p.instrs[r.peak_instr]) : "";
  for (const StageBlock& b : p.blocks) {
    if (b.kind == BlockKind::kLayer) e.layers.push_back({b.layer, b.policy.name, b.saved.bytes});
    if (b.kind == BlockKind::kEmbedding) e.embedding_saved = b.saved.bytes;
    if (b.kind == BlockKind::kHead) e.head_saved = b.saved.bytes;
  }
  if (explain) e.live_at_peak = live_tensors(p, r);
  return e;
}

}  // namespace

AllocatorReplay ReplayCache::get(const std::vector<MemEvent>& events,
                                 const std::vector<int64_t>& kept, const AllocatorConfig& c) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over the events and the kept sizes
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ULL; };
  for (const MemEvent& e : events) {
    mix(static_cast<uint64_t>(e.bytes));
    mix((static_cast<uint64_t>(static_cast<uint32_t>(e.tensor)) << 1) | (e.alloc ? 1 : 0));
    mix(static_cast<uint64_t>(static_cast<uint32_t>(e.instr)));
  }
  for (int64_t k : kept) mix(static_cast<uint64_t>(k));
  {
    std::lock_guard lock(mu_);
    for (const Entry& e : done_)
      if (e.hash == h && e.events == events.size()) return e.replay;
  }
  AllocatorReplay r = replay_steps(events, kept, c);  // outside the lock: stages in parallel
  std::lock_guard lock(mu_);
  done_.push_back({h, events.size(), r});
  return r;
}

std::vector<Suggestion> nearest_setups(const ModelSpec& m, const TrainSpec& t,
                                       const PeakIfFits& fits) {
  std::vector<Suggestion> out;
  auto try_setup = [&](TrainSpec c, std::string change, std::string note) {
    if (validate_setup(m, c)) return false;
    std::optional<int64_t> peak = fits(c);
    if (!peak) return false;
    out.push_back({std::move(change), std::move(note), c, *peak});
    return true;
  };
  // First the single changes that keep the GPUs and the global batch: a higher ZeRO stage over
  // the same replicas, more TP in place of data parallelism, full recompute, a smaller
  // micro-batch.
  for (int zero = t.zero + 1; zero <= 3 && t.dp * t.cp > 1; ++zero) {
    TrainSpec c = t;
    c.zero = zero;
    if (try_setup(c, "--zero " + std::to_string(zero),
                  std::string(zero == 1   ? "optimizer states"
                              : zero == 2 ? "optimizer states and gradients"
                                          : "optimizer states, gradients and weights") +
                      " sharded over the same dp " + std::to_string(t.dp * t.cp)))
      break;
  }
  for (int64_t k = 2; t.dp % k == 0 && t.tp * k <= 64; k *= 2) {  // tp x k, dp / k
    TrainSpec c = t;
    c.tp = t.tp * k, c.dp = t.dp / k, c.sp = t.sp || t.tp == 1;
    c.microbatches = t.microbatches * k;
    if (c.dp * c.cp == 1) c.zero = 0;
    if (try_setup(c, "--tp " + std::to_string(c.tp) + " --dp " + std::to_string(c.dp) +
                         " --microbatches " + std::to_string(c.microbatches),
                  "the same GPUs and global batch, more tensor parallelism"))
      break;
  }
  if (t.recompute != Recompute::kFull && t.recompute != Recompute::kAuto) {
    TrainSpec c = t;
    c.recompute = Recompute::kFull;
    try_setup(c, "--recompute full", "nanotron recompute_layer: true; one extra forward per layer");
  }
  for (int64_t mbs = t.micro_batch / 2; mbs >= 1; mbs /= 2) {
    TrainSpec c = t;
    c.micro_batch = mbs;
    c.microbatches = t.microbatches * (t.micro_batch / mbs);
    if (try_setup(c, "--micro-batch " + std::to_string(mbs),
                  "--microbatches " + std::to_string(c.microbatches) + " keeps the global batch"))
      break;
  }
  // Then the ones that take more GPUs or change the global batch.
  for (int64_t pp = t.pp * 2; pp <= m.layers; pp *= 2) {
    TrainSpec c = t;
    c.pp = pp;
    c.stage_layers.clear();  // counts for the old pp no longer apply: balanced
    if (c.pp_schedule == PpSchedule::k1F1B) c.microbatches = std::max(c.microbatches, pp - 1);
    if (c.pp_schedule == PpSchedule::kInterleaved)
      c.microbatches = (c.microbatches + pp - 1) / pp * pp;
    c.zero = std::min(c.zero, 1);
    if (try_setup(
            c, "--pp " + std::to_string(pp),
            count_noun(pp * t.tp * t.cp * t.dp, "GPU") + " (pp x " + std::to_string(pp / t.pp) +
                ")"))
      break;
  }
  for (int64_t dp = t.dp * 2; dp <= 4096; dp *= 2) {
    TrainSpec c = t;
    c.dp = dp;
    c.zero = std::max(c.zero, 1);
    std::string change =
        (t.zero == c.zero ? "" : "--zero 1 ") + std::string("--dp ") + std::to_string(dp);
    if (try_setup(c, change,
                  "optimizer states sharded over dp " + std::to_string(dp) + "; global batch x " +
                      std::to_string(dp / t.dp)))
      break;
  }
  // Long sequences: context parallelism splits every sequence (flash attention only).
  for (int64_t cp = t.cp * 2; t.seq_len >= 8192 && cp <= 64; cp *= 2) {
    TrainSpec c = t;
    c.cp = cp;
    if (try_setup(c, "--cp " + std::to_string(cp),
                  count_noun(c.gpus(), "GPU") + " (each sequence split over " +
                      std::to_string(cp) + " ranks)"))
      break;
  }
  return out;
}

Estimate estimate_schedule(const Schedule& s, const RuntimeAssumptions& rt,
                           const EstimateOptions& options) {
  Estimate e;
  e.model = s.model;
  e.parameters = count_parameters(s.model);
  e.setup = s.setup;
  e.runtime = rt;
  e.budget = options.budget;
  ReplayCache own;
  ReplayCache& replays = options.replays ? *options.replays : own;
  // The stages are independent: simulated and replayed in parallel, kept in stage order.
  e.stages.resize(s.stages.size());
  parallel_for(s.stages.size(), [&](size_t i) {
    e.stages[i] = estimate_stage(s, s.stages[i], rt, options.explain_peak, replays);
  });
  for (const StageEstimate& st : e.stages)
    if (st.peak_bytes > e.peak_bytes) {
      e.peak_bytes = st.peak_bytes;
      e.peak_stage = st.stage;
      e.peak_rank = st.first_rank;
    }
  for (const StageEstimate& st : e.stages) {
    if (st.allocated_peak > e.allocated_peak_bytes) {
      e.allocated_peak_bytes = st.allocated_peak;
      e.allocated_peak_stage = st.stage;
    }
    if (st.reserved_peak > e.reserved_peak_bytes) {
      e.reserved_peak_bytes = st.reserved_peak;
      e.reserved_peak_stage = st.stage;
    }
  }
  e.fits = !options.budget || e.peak_bytes <= *options.budget;
  if (!e.fits && options.suggestions)
    e.suggestions =
        nearest_setups(s.model, s.setup, [&](const TrainSpec& c) -> std::optional<int64_t> {
          Estimate near =
              estimate(s.model, c, rt, {.budget = options.budget, .suggestions = false});
          return near.fits ? std::optional<int64_t>(near.peak_bytes) : std::nullopt;
        });
  return e;
}

Estimate estimate(const ModelSpec& m, const TrainSpec& t, const RuntimeAssumptions& rt,
                  const EstimateOptions& options) {
  // The same peaks with fewer micro-batches to replay.
  Schedule s = build_schedule(m, simulation_setup(t), nullptr, /*peak_only=*/true);
  s.setup = t;
  return estimate_schedule(s, rt, options);
}

}  // namespace np
