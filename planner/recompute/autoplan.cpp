// The auto planner: frontier, per-stage solve, verification by simulation.
#include "planner/recompute/autoplan.hpp"

#include <algorithm>
#include <cmath>
#include <future>
#include <limits>
#include <stdexcept>
#include <tuple>

#include "planner/schedule/parallel.hpp"
#include "planner/schedule/runtime_terms.hpp"
#include "planner/schedule/simulate.hpp"
#include "planner/recompute/mincut.hpp"
#include "planner/recompute/solve.hpp"
#include "planner/recompute/solve_chunks.hpp"

namespace np {

Schedule schedule_for_setup(const ModelSpec& m, const TrainSpec& t, const RuntimeAssumptions& rt,
                            std::optional<int64_t> budget, const HardwareModel& hw,
                            const AutoPlanOptions& options) {
  if (t.recompute != Recompute::kAuto) return build_schedule(m, t);
  if (!budget) throw std::invalid_argument("schedule_for_setup: recompute auto needs a budget");
  return auto_plan(m, t, rt, *budget, hw, options).schedule;
}

PlannedSetup plan_setup(const ModelSpec& m, const TrainSpec& t, const PlanInputs& in) {
  PlannedSetup p;
  if (t.recompute == Recompute::kAuto) {
    if (!in.budget) throw std::invalid_argument("plan_setup: recompute auto needs a budget");
    p.plan = auto_plan(m, t, in.rt, *in.budget, in.hw, in.options);
    p.schedule = std::move(p.plan->schedule);
  } else {
    p.schedule = build_schedule(m, t);
  }
  p.estimate = estimate_schedule(p.schedule, in.rt, {.budget = in.budget, .suggestions = false});
  p.estimate.headroom = in.headroom;
  if (p.plan) p.estimate.fits = p.plan->fits;
  return p;
}

std::string option_name(const BlockGraph& g, const std::vector<bool>& mask) {
  struct Named {
    const char* name;
    Recompute r;
    bool regather;
  };
  for (Named n :
       {Named{"none", Recompute::kNone, false}, Named{"none+regather", Recompute::kNone, true},
        Named{"selective", Recompute::kSelective, false},
        Named{"selective+regather", Recompute::kSelective, true},
        Named{"full", Recompute::kFull, false},
        Named{"full+regather", Recompute::kFull, true}})  // a head's MTP depths re-run
    if (named_mask(g, n.r, n.regather) == mask) return n.name;
  std::string ops;
  for (size_t o = 0; o < mask.size(); ++o)
    if (mask[o]) ops += (ops.empty() ? "" : ", ") + g.ops[o].name;
  // Under context parallelism the named policies exchange K/V again; re-running nothing keeps it.
  if (ops.empty()) return "keep-all (the gathered K/V kept)";
  return "custom: re-runs " + ops;
}

namespace {

// The allocator-level budget that keeps static + dynamic + fixed <= budget, `fixed` being the
// stage's runtime and framework lines. The caching allocator's rounding and cached blocks come
// on top; the plan's replay finds them and tightens the stage by its excess (solve_and_verify).
int64_t allocator_budget(int64_t budget, int64_t fixed) { return budget - fixed; }

// The options of the embedding or the head block: its Pareto frontier, led by the setup's named
// policy (which the solver keeps on ties).
struct EdgeOptions {
  std::vector<LayerOption> options;
  std::vector<std::string> names;
};

// The forward time of each op of a block: what re-running it costs.
std::vector<double> rerun_seconds(const BlockGraph& g, const TrainSpec& t,
                                  const HardwareModel& hw) {
  std::vector<double> cost(g.ops.size());
  for (size_t o = 0; o < g.ops.size(); ++o)
    cost[o] = op_seconds(g, static_cast<int>(o), hw, t, false);
  return cost;
}

EdgeOptions edge_options(const BlockGraph& g, const TrainSpec& t, const HardwareModel& hw) {
  std::vector<double> cost = rerun_seconds(g, t, hw);
  EdgeOptions e;
  e.options.push_back(evaluate_option(g, named_policy(g, t).recompute, cost));
  // A head with multi-token prediction holds whole decoder layers, whose subsets are too many to
  // enumerate beside the head's own ops: its options are Megatron's for the depths (keep, the
  // attention core, the checkpointed forward), each with the all-gathers as the setup has them.
  std::vector<LayerOption> all;
  if (has_mtp(g))
    for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      TrainSpec u = t;
      u.recompute = r;
      all.push_back(evaluate_option(g, named_policy(g, u).recompute, cost));
    }
  else
    all = enumerate_options(g, cost);
  for (LayerOption& o : pareto_frontier(std::move(all)))
    if (o.recompute != e.options.front().recompute) e.options.push_back(std::move(o));
  for (const LayerOption& o : e.options) e.names.push_back(option_name(g, o.recompute));
  return e;
}

// The blocks of a model under one setup; `dense` a mixed model's dense layer (else empty).
struct Blocks {
  BlockGraph layer, embedding, head;
  std::optional<BlockGraph> dense;
};

Blocks build_blocks(const ModelSpec& m, const TrainSpec& t) {
  return {build_layer(m, t), build_embedding(m, t), build_head(m, t),
          mixed_layers(m) ? std::optional(build_dense_layer(m, t)) : std::nullopt};
}

// A stage as the solver sees it: what it holds besides the decoder layers' options.
struct StageShape {
  int64_t stage = 0, in_flight = 1, static_bytes = 0, layers = 0;
  bool embedding = false, head = false;
  int64_t fixed = 0;  // the runtime and framework lines (runtime_terms.hpp)
  // ZeRO's transient while a block runs, per block kind: the gathered bf16 weights (ZeRO-3) and
  // the unsharded gradient bucket (ZeRO-2/3), both live through the block's backward.
  int64_t layer_zero = 0, embedding_zero = 0, head_zero = 0;
  // Interleaved: the layers of each local chunk and the steps that may set the peak (the
  // embedding in chunk 0 of the first stage, the head in the last chunk of the last); empty
  // otherwise (one chunk, `in_flight` micro-batches).
  std::vector<int64_t> chunk_layers;
  std::vector<ChunkLoad> loads;
  // A mixed model: per layer of the stage in block order, whether it is a dense layer, and the
  // dense layers' ZeRO transient (empty and 0 otherwise).
  std::vector<bool> dense;
  int64_t dense_zero = 0;
};

// `list`: the stage's decoder layers in block order, where they matter (a mixed model's); else
// any `layers` layers.
StageShape stage_shape(const ModelSpec& m, const TrainSpec& t, const RuntimeAssumptions& rt,
                       const Blocks& blocks, const StageStatics& statics, int64_t s,
                       int64_t layers, const std::vector<int>* list = nullptr) {
  StageStatics::ZeroTransients z = statics.zero_transients(static_cast<int>(s));
  StageShape shape{s,
                   in_flight(t.pp_schedule, s, t.pp, t.microbatches, t.virtual_stages),
                   list ? statics(static_cast<int>(s), *list)
                        : statics(static_cast<int>(s), static_cast<int>(layers)),
                   layers,
                   s == 0,
                   s == t.pp - 1,
                   0,
                   z.layer,
                   z.embedding,
                   z.head,
                   {},
                   {}};
  bool any_dense = false, any_moe = false;
  if (blocks.dense && list)
    for (int l : *list) {
      shape.dense.push_back(dense_layer(m, l));
      (shape.dense.back() ? any_dense : any_moe) = true;
    }
  shape.dense_zero = z.dense_layer;
  const BlockGraph* first = any_dense && !any_moe ? &*blocks.dense : &blocks.layer;
  shape.fixed = fixed_overhead_bytes(
      m, t, rt,
      {layers > 0 ? first : nullptr, any_dense && any_moe ? &*blocks.dense : nullptr,
       shape.head ? &blocks.head : nullptr, s == 0,
       t.pp_schedule == PpSchedule::kInterleaved ? t.virtual_stages : 1, layers});
  if (t.pp_schedule == PpSchedule::kInterleaved && t.virtual_stages > 1) {
    std::vector<int64_t> chunks = chunk_layers(m, t);
    for (size_t j = static_cast<size_t>(s); j < chunks.size(); j += static_cast<size_t>(t.pp))
      shape.chunk_layers.push_back(chunks[j]);
    // The simulation's micro-batches: the same peaks (simulation_setup).
    shape.loads =
        chunk_loads(t.pp_schedule, s, t.pp, simulation_setup(t).microbatches, t.virtual_stages);
  }
  return shape;
}

// A stage's plan: the layers' choice and the option of its embedding and head blocks.
struct StageChoice {
  StageSolution layers;
  int embedding = 0, head = 0;
  double cost = std::numeric_limits<double>::infinity();  // per micro-batch, all blocks
  // Interleaved stages whose search stopped at its branch limit: no plan costs less than `lower`
  // (else `lower` = cost, proven cheapest); for the least peak, `proven` alone.
  bool proven = true;
  double lower = 0;
};

class StageSolver {
 public:
  // `dense`: a mixed model's dense-layer options (null otherwise).
  StageSolver(const std::vector<LayerOption>& layer, const EdgeOptions& embedding,
              const EdgeOptions& head, FrontierCache::Entry& entry,
              const std::vector<LayerOption>* dense = nullptr)
      : embedding_(embedding), head_(head), entry_(entry) {
    for (const LayerOption& o : layer) layer_.push_back({o.kept_bytes, o.working_bytes, o.cost});
    if (dense)
      for (const LayerOption& o : *dense) dense_.push_back({o.kept_bytes, o.working_bytes, o.cost});
  }

  // The cheapest plan within `target` allocator bytes, over every option of the stage's
  // embedding and head blocks; layers.feasible is false when none fits.
  StageChoice cheapest(const StageShape& s, int64_t target) const {
    StageChoice best;
    if (!s.loads.empty()) {
      // The least any unfinished search proves (a finished one proves its own best).
      double lower = std::numeric_limits<double>::infinity();
      bool proven = true;
      each_chunked(s, target, [&](const ChunkedStageProblem& p, int e, int h) {
        double edge = edge_cost(s, e, h);
        if (edge >= best.cost) return;
        ChunkedSolution sol = solve_chunked_stage(p, best.cost - edge);
        if (!sol.proven) proven = false, lower = std::min(lower, sol.lower + edge);
        if (sol.feasible && sol.cost + edge < best.cost)
          best = {flatten(sol), e, h, sol.cost + edge};
      });
      // Proven when no unfinished search could still beat the plan.
      best.proven = proven || !(lower < best.cost * (1 - 1e-12));
      best.lower = std::min(lower, best.cost);
      return best;
    }
    each(s, target, [&](StageProblem& p, int e, int h) {
      double edge = edge_cost(s, e, h);
      if (edge >= best.cost) return;  // the layers cost something or nothing: no better
      // Only a cheaper one is wanted.
      StageSolution sol = solve_stage(p, best.cost - edge, &entry_.run_tables);
      if (sol.feasible && sol.cost + edge < best.cost)
        best = {std::move(sol), e, h, sol.cost + edge};
    });
    return best;
  }

  // The plan with the smallest model peak (for stages where nothing fits).
  StageChoice closest(const StageShape& s) const {
    StageChoice best;
    if (!s.loads.empty()) {
      int64_t lower = std::numeric_limits<int64_t>::max();
      each_chunked(
          s, std::numeric_limits<int64_t>::max() / 4,
          [&](const ChunkedStageProblem& p, int e, int h) {
            ChunkedSolution c = min_peak_chunked_solution(p);
            if (c.choice.empty()) return;  // some chunk has no choice at all
            lower = std::min(lower, c.lower_peak);
            StageSolution sol = flatten(c);
            if (best.cost == std::numeric_limits<double>::infinity() || sol.peak < best.layers.peak)
              best = {std::move(sol), e, h, 0.0};
          });
      best.cost = best.layers.cost + edge_cost(s, best.embedding, best.head);
      // Proven when no unfinished search could still peak lower.
      best.proven = lower >= best.layers.peak;
      return best;
    }
    each(s, std::numeric_limits<int64_t>::max() / 4, [&](StageProblem& p, int e, int h) {
      StageSolution sol = min_peak_solution(p);
      if (best.cost == std::numeric_limits<double>::infinity() || sol.peak < best.layers.peak)
        best = {std::move(sol), e, h, 0.0};
    });
    best.cost = best.layers.cost + edge_cost(s, best.embedding, best.head);
    return best;
  }

 private:
  double edge_cost(const StageShape& s, int e, int h) const {
    return (s.embedding ? embedding_.options[e].cost : 0) + (s.head ? head_.options[h].cost : 0);
  }

  // Every option pair of the stage's embedding and head, the pair with the least time first (the
  // setup's named options first among equals).
  std::vector<std::pair<int, int>> edge_pairs(const StageShape& s) const {
    const int ne = s.embedding ? static_cast<int>(embedding_.options.size()) : 1;
    const int nh = s.head ? static_cast<int>(head_.options.size()) : 1;
    std::vector<std::pair<int, int>> pairs;
    for (int e = 0; e < ne; ++e)
      for (int h = 0; h < nh; ++h) pairs.push_back({e, h});
    std::stable_sort(pairs.begin(), pairs.end(), [&](auto a, auto b) {
      return edge_cost(s, a.first, a.second) < edge_cost(s, b.first, b.second);
    });
    return pairs;
  }

  // Calls f(problem, e, h) for every option pair of the stage's embedding and head, in that
  // order.
  template <typename F>
  void each(const StageShape& s, int64_t target, F f) const {
    for (auto [e, h] : edge_pairs(s)) {
      StageProblem p;
      p.in_flight = s.in_flight;
      p.base = s.static_bytes;
      p.budget = target;
      if (s.embedding) {
        p.base += s.in_flight * embedding_.options[e].kept_bytes;
        p.extra = std::max(p.extra, embedding_.options[e].extra_bytes() + s.embedding_zero);
      }
      if (s.head) {
        p.base += s.in_flight * head_.options[h].kept_bytes;
        p.extra = std::max(p.extra, head_.options[h].extra_bytes() + s.head_zero);
      }
      // The head runs after the layers, so a layer's forward and backward see this pass's head
      // tensors not yet made or already freed: its transient term is less by their bytes (as
      // the chunk model's, solve.hpp).
      const int64_t after = s.head ? head_.options[h].kept_bytes : 0;
      std::vector<StageOption> opts = layer_, dense = dense_;
      for (StageOption& o : opts) o.working += s.layer_zero - after;
      for (StageOption& o : dense) o.working += s.dense_zero - after;
      if (s.dense.empty()) {
        p.layers.assign(s.layers, opts);
      } else {  // each layer its kind's options
        for (bool d : s.dense) p.layers.push_back(d ? dense : opts);
      }
      f(p, e, h);
    }
  }

  // The chunks' choices one after another: the stage's layers in block order.
  static StageSolution flatten(const ChunkedSolution& c) {
    StageSolution s{c.feasible, c.cost, {}, c.peak};
    for (const std::vector<int>& chunk : c.choice)
      s.choice.insert(s.choice.end(), chunk.begin(), chunk.end());
    return s;
  }

  // As `each`, for a stage of several chunks: the embedding block before the layers of the first
  // stage's chunk 0, the head block after those of the last stage's last chunk.
  template <typename F>
  void each_chunked(const StageShape& s, int64_t target, F f) const {
    std::vector<StageOption> opts = layer_, dense = dense_;
    for (StageOption& o : opts) o.working += s.layer_zero;
    for (StageOption& o : dense) o.working += s.dense_zero;
    for (auto [e, h] : edge_pairs(s)) {
      ChunkedStageProblem p;
      p.budget = target;
      p.base = s.static_bytes;
      p.loads = s.loads;
      size_t first = 0;
      for (int64_t n : s.chunk_layers) {
        if (s.dense.empty()) {
          p.chunks.push_back(
              {{}, {}, std::vector(n, opts), choices(n, s, opts, target - s.static_bytes)});
          continue;
        }
        // A mixed model's chunk: each layer its kind's options (the solver finds its choices).
        std::vector<std::vector<StageOption>> layers;
        for (int64_t l = 0; l < n; ++l) layers.push_back(s.dense[first + l] ? dense : opts);
        first += static_cast<size_t>(n);
        p.chunks.push_back({{}, {}, std::move(layers), nullptr});
      }
      if (s.embedding) {
        const LayerOption& o = embedding_.options[e];
        p.chunks.front().before = {o.kept_bytes, o.working_bytes + s.embedding_zero, o.cost};
      }
      if (s.head) {
        const LayerOption& o = head_.options[h];
        p.chunks.back().after = {o.kept_bytes, o.working_bytes + s.head_zero, o.cost};
      }
      f(p, e, h);
    }
  }

  // The Pareto choices of a chunk of n layers whose kept plus transient bytes fit `cap` (a
  // chunk's pass runs with at least itself alive, so no other can fit), computed once per
  // frontier for the largest cap asked for (a sweep shares them; the solver filters for a
  // smaller cap).
  std::shared_ptr<const std::vector<ParetoChoice>> choices(int64_t n, const StageShape& s,
                                                           const std::vector<StageOption>& opts,
                                                           int64_t cap) const {
    FrontierCache::Entry::ChunkChoices* known;
    {
      std::lock_guard lock(entry_.chunk_mu);  // map nodes never move
      known = &entry_.chunk_choices[{n, s.layer_zero}];
    }
    std::lock_guard lock(known->mu);
    if (!known->choices || cap > known->cap) {
      StageProblem alone;
      alone.layers.assign(n, opts);
      alone.budget = cap;
      known->choices = std::make_shared<const std::vector<ParetoChoice>>(pareto_choices(alone));
      known->cap = cap;
    }
    return known->choices;
  }

  std::vector<StageOption> layer_, dense_;
  const EdgeOptions &embedding_, &head_;
  FrontierCache::Entry& entry_;
};

// The partition search: layers per stage minimising the slowest stage's time per micro-batch
// (forward, backward and the recompute of its optimal plan), every stage within the budget.
// Decoder layers are identical, so a stage's time T_s(n) depends only on the stage s and its
// layer count n, and grows with n (dropping a layer from a plan never raises its peak). Starting
// from one layer per stage, the greedy that gives the next layer to the stage whose T_s(n_s + 1)
// is least reaches the least possible maximum (it takes the values of the merged sorted
// sequences in order). nullopt when some stage fits no layers at all, or when the balanced split
// is as fast.

std::optional<std::vector<int64_t>> search_partition(const ModelSpec& m, const TrainSpec& t,
                                                     const RuntimeAssumptions& rt, int64_t budget,
                                                     const HardwareModel& hw, const Blocks& blocks,
                                                     const StageStatics& statics,
                                                     const StageSolver& solver) {
  auto seconds = [&](const BlockGraph& g) {
    BlockTime b = block_seconds(g, hw, t);
    return b.forward + b.backward;
  };
  const double layer_s = seconds(blocks.layer), emb_s = seconds(blocks.embedding),
               head_s = seconds(blocks.head);
  const int64_t pp = t.pp;
  auto stage_time = [&](int64_t s, int64_t n) {
    StageShape shape = stage_shape(m, t, rt, blocks, statics, s, n);
    StageChoice c = solver.cheapest(shape, allocator_budget(budget, shape.fixed));
    if (!c.layers.feasible) return std::numeric_limits<double>::infinity();
    return static_cast<double>(n) * layer_s + (shape.embedding ? emb_s : 0) +
           (shape.head ? head_s : 0) + c.cost;
  };
  std::vector<int64_t> n(pp, 1);
  std::vector<double> next(pp);
  double slowest = 0;
  for (int64_t s = 0; s < pp; ++s) {
    slowest = std::max(slowest, stage_time(s, 1));
    if (!std::isfinite(slowest)) return std::nullopt;
    next[s] = stage_time(s, 2);
  }
  for (int64_t placed = pp; placed < m.layers; ++placed) {
    int64_t s = std::min_element(next.begin(), next.end()) - next.begin();
    if (!std::isfinite(next[s])) return std::nullopt;
    slowest = std::max(slowest, next[s]);
    ++n[s];
    next[s] = stage_time(s, n[s] + 1);
  }
  // Kept only when strictly faster than the balanced split (equal times: the balanced one).
  std::vector<int64_t> balanced = partition_layers(m, t);
  double balanced_slowest = 0;
  for (int64_t s = 0; s < pp; ++s)
    balanced_slowest = std::max(balanced_slowest, stage_time(s, balanced[s]));
  if (slowest >= balanced_slowest * (1 - 1e-12)) return std::nullopt;
  return n;
}

// The layer frontier of `key`, computed once by the first thread that needs it (a sweep shares
// the cache; a single plan keeps its own, which the balanced comparison reuses).
std::shared_ptr<FrontierCache::Entry> cached_frontier(FrontierCache& cache, const std::string& key,
                                                      const BlockGraph& layer, const TrainSpec& t,
                                                      const HardwareModel& hw) {
  std::shared_ptr<FrontierCache::Entry> entry;
  {
    std::lock_guard lock(cache.mu);
    std::shared_ptr<FrontierCache::Entry>& slot = cache.entries[key];
    if (!slot) slot = std::make_shared<FrontierCache::Entry>();
    entry = slot;
  }
  std::call_once(entry->once, [&] {
    entry->frontier = layer_frontier(layer, t, rerun_seconds(layer, t, hw));
    for (const LayerOption& o : entry->frontier.options)
      entry->names.push_back(option_name(layer, o.recompute));
  });
  return entry;
}

// One auto plan's steps over its stages: each stage's shape and byte target, the solver's choice
// adopted into the plan's policies, verification by simulation, the closest plan where nothing
// fits, and the plan's schedule, estimate and times.
class PlanSteps {
 public:
  PlanSteps(AutoPlan& plan, const ModelSpec& m, const TrainSpec& t, const RuntimeAssumptions& rt,
            int64_t budget, const HardwareModel& hw, const Blocks& blocks,
            const StageStatics& statics, const StageSolver& solver, const EdgeOptions& embedding,
            const EdgeOptions& head)
      : plan_(plan), m_(m), rt_(rt), budget_(budget), hw_(hw), solver_(solver),
        embedding_(embedding), head_(head), sim_(simulation_setup(t)),
        stage_layers_(stage_layer_lists(m, t)) {
    // Start from no recompute everywhere.
    plan_.layer_policies.assign(
        m.layers, BlockPolicy{plan_.frontier.options.front().recompute, plan_.option_names.front()});
    if (blocks.dense)
      for (int64_t l : m.dense_layers)
        plan_.layer_policies[static_cast<size_t>(l)] = {
            plan_.dense_frontier.options.front().recompute, plan_.dense_option_names.front()};
    const std::vector<int64_t> counts = partition_layers(m, t);
    for (int64_t s = 0; s < t.pp; ++s) {
      StageShape shape = stage_shape(m, t, rt, blocks, statics, s, counts[s],
                                     blocks.dense ? &stage_layers_[s] : nullptr);
      shapes_.push_back(shape);
      target_.push_back(allocator_budget(budget, shape.fixed));
      plan_.stages.push_back({static_cast<int>(s), false, 0, {}, true, 0, 0});
    }
  }

  // Solves every stage, simulates the whole plan once, tightens the stages the simulation finds
  // over budget (by their excess) and solves those again; the last schedule simulated, of the
  // current policies, is kept. Once a stage fits no choice, the plan cannot fit: without
  // `verify_when_infeasible` (no closest plan wanted) nothing more is simulated or replayed.
  void solve_and_verify(bool verify_when_infeasible) {
    std::vector<bool> settled(shapes_.size(), false);
    bool infeasible = false;
    plan_.fits = true;
    for (int attempt = 0; attempt < 8; ++attempt) {
      bool any = false;
      // The open stages' problems are independent: solved in parallel, adopted in stage order.
      std::vector<size_t> open;
      for (size_t st = 0; st < shapes_.size(); ++st)
        if (!settled[st]) open.push_back(st);
      std::vector<StageChoice> choices(open.size());
      parallel_for(open.size(), [&](size_t i) {
        choices[i] = solver_.cheapest(shapes_[open[i]], target_[open[i]]);
      });
      for (size_t i = 0; i < open.size(); ++i) {
        const size_t st = open[i];
        const StageChoice& c = choices[i];
        if (!c.layers.feasible) {
          settled[st] = true;
          infeasible = true;
          continue;
        }
        any = true;
        adopt(st, c);
      }
      if (!any || (infeasible && !verify_when_infeasible)) break;
      BlockPolicies pol = policies();
      // After the first simulation only the stages solved again are built again.
      std::vector<bool> changed(shapes_.size(), false);
      for (size_t st : open) changed[st] = true;
      verified_ = build_schedule(m_, sim_, &pol, /*peak_only=*/true,
                                 verified_ ? &*verified_ : nullptr, &changed);
      ++plan_.simulations;
      Estimate e = estimate_schedule(*verified_, rt_,
                                     {.budget = budget_, .suggestions = false, .replays = &replays_});
      bool again = false;
      for (size_t st = 0; st < shapes_.size(); ++st) {
        if (settled[st]) continue;
        int64_t over = e.stages[st].peak_bytes - budget_;
        if (over <= 0) {
          plan_.stages[st].feasible = settled[st] = true;
        } else {
          // The replay found the caching allocator's rounding and cached blocks (or the model
          // missed something the simulation sees): ask for that much less than the plan holds.
          target_[st] = std::min(target_[st], e.stages[st].allocator_peak) - over - 1;
          again = true;
        }
      }
      if (!again) break;
    }
  }

  // Stages nothing fits: the plan does not fit; with `closest`, such a stage takes the plan that
  // gets closest, with its smallest achievable peak.
  void settle_infeasible(bool closest) {
    for (size_t st = 0; st < shapes_.size(); ++st) {
      if (plan_.stages[st].feasible) continue;
      plan_.fits = false;
      if (!closest) continue;
      StageChoice c = solver_.closest(shapes_[st]);
      int64_t least = c.layers.peak;
      changed_after_verify_ = true;
      adopt(st, c);
      plan_.stages[st].min_peak = least + shapes_[st].fixed;  // finish() replays it
    }
  }

  // The plan's estimate, of the schedule the plan was verified on (the simulation's, whose
  // peaks and allocator replay the estimate of the same setup reports), its schedule (that one,
  // unless an executor needs every micro-batch) and its step time. A plan that does not fit,
  // when no closest plan is wanted (`replay_when_infeasible` false: the sweep), is estimated
  // without the allocator's replay: its reserved peak could only be higher.
  void finish(const TrainSpec& t, bool full_schedule, bool replay_when_infeasible) {
    BlockPolicies pol = policies();
    Schedule sim = verified_ && !changed_after_verify_
                       ? std::move(*verified_)
                       : build_schedule(m_, sim_, &pol, /*peak_only=*/true);
    sim.setup = t;
    RuntimeAssumptions rt = rt_;
    if (!plan_.fits && !replay_when_infeasible) rt.allocator.model = AllocatorModel::kExact;
    plan_.estimate = estimate_schedule(
        sim, rt, {.budget = budget_, .suggestions = false, .replays = &replays_});
    plan_.schedule = full_schedule ? build_schedule(m_, t, &pol) : std::move(sim);
    // The closest plan, replayed, may fit after all: the stage model, tightened by the replays of
    // cheaper plans (whose allocator caches differ), found nothing under its target, but the
    // plan of the least peak is within the budget. The estimate is the verdict.
    const bool closest_fits = !plan_.fits && replay_when_infeasible && plan_.estimate.fits;
    plan_.fits = (plan_.fits || closest_fits) && plan_.estimate.fits;
    for (StagePlan& sp : plan_.stages)
      if (!sp.feasible) {
        sp.min_peak = plan_.estimate.stages[sp.stage].peak_bytes;  // simulated, of the closest plan
        sp.feasible = closest_fits;
      }
    plan_.schedule.setup = t;  // the step time counts every micro-batch
    plan_.time = step_time(plan_.schedule, hw_);
  }

 private:
  void adopt(size_t st, const StageChoice& c) {
    plan_.stages[st].layer_option = c.layers.choice;
    plan_.stages[st].proven = c.proven;
    plan_.stages[st].recompute = c.cost;
    plan_.stages[st].recompute_lower = c.proven ? c.cost : c.lower;
    for (size_t l = 0; l < c.layers.choice.size(); ++l) {
      const int layer = stage_layers_[st][l], o = c.layers.choice[l];
      const bool dense = dense_layer(m_, layer);  // a mixed model's: its own frontier
      plan_.layer_policies[layer] = {
          (dense ? plan_.dense_frontier : plan_.frontier).options[o].recompute,
          (dense ? plan_.dense_option_names : plan_.option_names)[o]};
    }
    if (shapes_[st].embedding)
      plan_.embedding_policy =
          BlockPolicy{embedding_.options[c.embedding].recompute, embedding_.names[c.embedding]};
    if (shapes_[st].head)
      plan_.head_policy = BlockPolicy{head_.options[c.head].recompute, head_.names[c.head]};
  }
  BlockPolicies policies() const {
    return BlockPolicies{plan_.layer_policies, plan_.embedding_policy, plan_.head_policy};
  }

  AutoPlan& plan_;
  const ModelSpec& m_;
  const RuntimeAssumptions& rt_;
  const int64_t budget_;
  const HardwareModel& hw_;
  const StageSolver& solver_;
  const EdgeOptions &embedding_, &head_;
  const TrainSpec sim_;
  const std::vector<std::vector<int>> stage_layers_;
  std::vector<StageShape> shapes_;
  std::vector<int64_t> target_;
  std::optional<Schedule> verified_;
  bool changed_after_verify_ = false;
  ReplayCache replays_;  // the stages' allocator replays, reused while a stage's plan stands
};

// The step times and peaks of no recompute and of full recompute, for the comparison lines; they
// do not depend on the plan, so auto_plan makes them beside it (writing only these fields).
// Under FSDP2 also torchtitan's default, full recompute of every second layer
// (job_config.py: selective_ac_option "2"); under the torchtitan profile its per-op policy.
void compare_uniform(AutoPlan& plan, const ModelSpec& m, const TrainSpec& t,
                     const RuntimeAssumptions& rt, const HardwareModel& hw) {
  auto measure = [&](Recompute r, int64_t every, std::optional<StepTime>& time,
                     std::optional<int64_t>& peak) {
    TrainSpec u = simulation_setup(t);
    u.recompute = r, u.recompute_every = every;
    Schedule s = build_schedule(m, u, nullptr, /*peak_only=*/true);
    s.setup.microbatches = t.microbatches;  // peaks repeat past pp + 1 micro-batches; time counts all
    time = step_time(s, hw);
    peak = estimate_schedule(s, rt, {.suggestions = false}).peak_bytes;
  };
  measure(Recompute::kNone, 1, plan.time_none, plan.peak_none);
  measure(Recompute::kFull, 1, plan.time_full, plan.peak_full);
  if (t.fsdp && m.layers >= 2) {
    plan.every = 2;
    measure(Recompute::kFull, plan.every, plan.time_every, plan.peak_every);
  }
  if (t.impl == Impl::kTorchtitan) measure(Recompute::kSelectiveOp, 1, plan.time_op, plan.peak_op);
}

// Every block's all-gathers, and those the plan gathers again in backward.
void count_gathers(AutoPlan& plan) {
  for (const StageProgram& p : plan.schedule.stages)
    for (const StageBlock& b : p.blocks)
      for (size_t o = 0; o < b.graph->ops.size(); ++o)
        if (b.graph->ops[o].kind == OpKind::kAllGather ||
            b.graph->ops[o].kind == OpKind::kFp8AllGather) {
          ++plan.gathers;
          plan.regathered += b.policy.recompute[o];
        }
}

}  // namespace

AutoPlan auto_plan(const ModelSpec& m, const TrainSpec& setup, const RuntimeAssumptions& rt,
                   int64_t budget, const HardwareModel& hw, const AutoPlanOptions& options) {
  AutoPlan plan;
  TrainSpec t = setup;  // with the searched partition, when asked for
  // The comparison with no recompute and recompute_layer, made beside the plan (from the start
  // unless the split is searched first).
  std::future<void> comparing;
  if (options.compare_uniform && !options.search_partition)
    comparing = std::async(std::launch::async, compare_uniform, std::ref(plan), std::cref(m), t,
                           std::cref(rt), std::cref(hw));
  const Blocks blocks = build_blocks(m, t);
  // The frontier depends on the layer graph, the hardware's times and whether all-gathers may be
  // kept.
  std::string key = hw.name + "/" + layer_graph_key(t) + "/regather" +
                    std::to_string(t.tp_recompute_allgather);
  FrontierCache own;
  FrontierCache& cache = options.cache ? *options.cache : own;
  // The MoE layer's frontier and a mixed model's dense layers' own, cached beside it, found in
  // parallel.
  std::shared_ptr<FrontierCache::Entry> entry, dense;
  parallel_for(blocks.dense ? 2 : 1, [&](size_t i) {
    if (i == 0) entry = cached_frontier(cache, key, blocks.layer, t, hw);
    if (i == 1) dense = cached_frontier(cache, key + "/dense", *blocks.dense, t, hw);
  });
  plan.frontier = entry->frontier, plan.option_names = entry->names;
  if (dense) plan.dense_frontier = dense->frontier, plan.dense_option_names = dense->names;
  const EdgeOptions embedding = edge_options(blocks.embedding, t, hw),
                    head = edge_options(blocks.head, t, hw);
  const StageSolver solver(plan.frontier.options, embedding, head, *entry,
                           blocks.dense ? &plan.dense_frontier.options : nullptr);
  const StageStatics statics(m, t);  // per-stage constants; the split is an argument
  bool searched = false;
  if (options.search_partition && blocks.dense)
    throw std::invalid_argument(m.name + " has dense and MoE layers, which --partition auto does "
                                "not search yet (valid: --partition balanced, or layer counts)");
  if (options.search_partition && t.pp > 1 && t.stage_layers.empty() &&
      t.pp_schedule != PpSchedule::kInterleaved)  // interleaved chunks stay balanced
    if (auto counts = search_partition(m, t, rt, budget, hw, blocks, statics, solver)) {
      t.stage_layers = *counts;
      searched = true;
    }
  if (options.compare_uniform && options.search_partition)  // with the split the search chose
    comparing = std::async(std::launch::async, compare_uniform, std::ref(plan), std::cref(m), t,
                           std::cref(rt), std::cref(hw));
  PlanSteps steps(plan, m, t, rt, budget, hw, blocks, statics, solver, embedding, head);
  steps.solve_and_verify(options.closest_when_infeasible);
  steps.settle_infeasible(options.closest_when_infeasible);
  steps.finish(t, options.full_schedule, options.closest_when_infeasible);
  if (comparing.valid()) comparing.get();
  if (searched) {
    // The search compares splits by the slowest stage's time per micro-batch; the step time also
    // counts the optimizer and gradient traffic of the heaviest stage, and the simulation may
    // have tightened budgets. Keep the searched split only if the whole plan is faster, or fits
    // where the balanced one does not.
    AutoPlanOptions without = options;
    without.search_partition = false;
    without.cache = &cache;
    AutoPlan balanced = auto_plan(m, setup, rt, budget, hw, without);
    if (!plan.fits || (balanced.fits && balanced.time.seconds <= plan.time.seconds))
      return balanced;
    plan.partition_searched = true;
  }
  count_gathers(plan);
  return plan;
}

bool cannot_fit(const ModelSpec& m, const TrainSpec& t, const RuntimeAssumptions& rt,
                int64_t budget) {
  const Blocks blocks = build_blocks(m, t);
  const StageStatics statics(m, t);
  const std::vector<int64_t> counts = partition_layers(m, t);
  const std::vector<std::vector<int>> lists = stage_layer_lists(m, t);
  // The least any mask of a layer keeps (its frontier's last point; the min-cut hull's end), and
  // the least working bytes of any (its forward's floor).
  const int64_t least = least_kept_bytes(blocks.layer),
                least_dense = blocks.dense ? least_kept_bytes(*blocks.dense) : 0;
  const int64_t floor = least_working_bytes(blocks.layer),
                floor_dense = blocks.dense ? least_working_bytes(*blocks.dense) : 0;
  for (int64_t s = 0; s < t.pp; ++s) {
    const StageShape shape = stage_shape(m, t, rt, blocks, statics, s, counts[s],
                                         blocks.dense ? &lists[s] : nullptr);
    // The solver's peak: base + f K + max(extra, max_l (w_l - k_l - Q_{l+1})), base at least the
    // static bytes, w_l at least the layer's working bytes (ZeRO's transients add to them; the
    // last stage's head kept bytes, subtracted from them, are in base). Its last layer's term
    // alone gives base + f K - k_last + w_last
    //   >= static + f sum_l k_min,l - k_min,last + w_floor,last.
    // The interleaved stages' passes alive per chunk are not counted: some layer's forward runs.
    int64_t bound = shape.static_bytes;
    if (shape.layers > 0) {
      auto dense = [&](int64_t l) { return !shape.dense.empty() && shape.dense[l]; };
      const bool last_dense = dense(shape.layers - 1);
      if (shape.loads.empty()) {
        for (int64_t l = 0; l < shape.layers; ++l)
          bound += shape.in_flight * (dense(l) ? least_dense : least);
        bound += (last_dense ? floor_dense - least_dense : floor - least);
      } else {
        bound += blocks.dense ? std::min(floor, floor_dense) : floor;
      }
    }
    if (bound > allocator_budget(budget, shape.fixed)) return true;
  }
  return false;
}

StepTime named_step_time(const ModelSpec& m, const TrainSpec& t, const HardwareModel& hw) {
  // The simulation's micro-batches give the schedule (peaks repeat past them); the time counts
  // all of the setup's.
  Schedule s = build_schedule(m, simulation_setup(t), nullptr, /*peak_only=*/true);
  s.setup.microbatches = t.microbatches;
  return step_time(s, hw);
}

std::vector<Suggestion> auto_suggestions(const ModelSpec& m, const TrainSpec& t,
                                         const RuntimeAssumptions& rt, int64_t budget,
                                         const HardwareModel& hw) {
  return nearest_setups(m, t, [&](const TrainSpec& c) -> std::optional<int64_t> {
    AutoPlan p = auto_plan(m, c, rt, budget, hw,
                           {.closest_when_infeasible = false, .compare_uniform = false});
    return p.fits ? std::optional<int64_t>(p.estimate.peak_bytes) : std::nullopt;
  });
}

}  // namespace np
