// The auto planner: frontier, per-stage solve, verification by simulation.
#include "planner/autoplan.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "planner/simulate.hpp"
#include "planner/solve.hpp"

namespace np {

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
        Named{"full", Recompute::kFull, false}})
    if (named_mask(g, n.r, n.regather) == mask) return n.name;
  std::string ops;
  for (size_t o = 0; o < mask.size(); ++o)
    if (mask[o]) ops += (ops.empty() ? "" : ", ") + g.ops[o].name;
  return "custom: re-runs " + ops;
}

namespace {

int64_t fixed_overheads(const TrainSpec& t, const RuntimeAssumptions& rt) {
  int comms = (t.tp > 1) + (t.dp > 1) + (t.pp > 1) + (t.ep > 1);
  return rt.cuda_context_bytes + rt.cublas_workspace_bytes + comms * rt.nccl_bytes_per_comm;
}

// The allocator-level budget that keeps static + (1 + slack) x dynamic + fixed <= budget.
int64_t allocator_budget(int64_t budget, int64_t static_bytes, const TrainSpec& t,
                         const RuntimeAssumptions& rt) {
  double room = static_cast<double>(budget - fixed_overheads(t, rt) - static_bytes);
  if (room < 0) return static_bytes + static_cast<int64_t>(room);
  return static_bytes + static_cast<int64_t>(std::floor(room / (1.0 + rt.allocator_slack)));
}

int64_t static_bytes(const StageProgram& p) {
  int64_t n = 0;
  for (const ScheduleTensor& x : p.tensors)
    if (x.kind == ValueKind::kStatic) n += x.bytes;
  return n;
}

// The stage problem: the layers' options from the frontier, the constants from the schedule.
StageProblem stage_problem(const StageProgram& p, const std::vector<LayerOption>& options,
                           const TrainSpec& t, const std::vector<double>& zero_cost) {
  StageProblem sp;
  sp.in_flight = in_flight(t.pp_schedule, p.stage, t.pp, t.microbatches);
  sp.base = static_bytes(p);
  for (const StageBlock& b : p.blocks) {
    if (b.kind == BlockKind::kLayer) continue;
    LayerOption o = evaluate_option(*b.graph, b.policy.recompute, zero_cost);
    sp.base += sp.in_flight * o.kept_bytes;
    sp.extra = std::max(sp.extra, o.extra_bytes());
  }
  std::vector<StageOption> opts;
  for (const LayerOption& o : options) opts.push_back({o.kept_bytes, o.working_bytes, o.cost});
  sp.layers.assign(p.num_layers(), opts);
  return sp;
}

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
                                                     const HardwareModel& hw,
                                                     const BlockGraph& layer,
                                                     const std::vector<LayerOption>& options) {
  const BlockGraph emb = build_embedding(m, t), head = build_head(m, t);
  const std::vector<double> zc(128, 0.0);
  const LayerOption emb_opt = evaluate_option(emb, named_policy(emb, t).recompute, zc),
                    head_opt = evaluate_option(head, named_policy(head, t).recompute, zc);
  auto seconds = [&](const BlockGraph& g) {
    BlockTime b = block_seconds(g, hw, t);
    return b.forward + b.backward;
  };
  const double layer_s = seconds(layer), emb_s = seconds(emb), head_s = seconds(head);
  std::vector<StageOption> opts;
  for (const LayerOption& o : options) opts.push_back({o.kept_bytes, o.working_bytes, o.cost});
  const StageStatics statics(m, t);
  const int64_t pp = t.pp;
  auto stage_time = [&](int64_t s, int64_t n) {
    StageProblem sp;
    sp.in_flight = in_flight(t.pp_schedule, s, pp, t.microbatches);
    int64_t fixed = statics(static_cast<int>(s), static_cast<int>(n));
    sp.base = fixed;
    double time = static_cast<double>(n) * layer_s;
    for (auto [on, opt, sec] :
         {std::tuple{s == 0, &emb_opt, emb_s}, std::tuple{s == pp - 1, &head_opt, head_s}})
      if (on) {
        sp.base += sp.in_flight * opt->kept_bytes;
        sp.extra = std::max(sp.extra, opt->extra_bytes());
        time += sec;
      }
    sp.layers.assign(n, opts);
    sp.budget = allocator_budget(budget, fixed, t, rt);
    StageSolution sol = solve_stage(sp);
    return sol.feasible ? time + sol.cost : std::numeric_limits<double>::infinity();
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

}  // namespace

AutoPlan auto_plan(const ModelSpec& m, const TrainSpec& setup, const RuntimeAssumptions& rt,
                   int64_t budget, const HardwareModel& hw, const AutoPlanOptions& options) {
  AutoPlan plan;
  TrainSpec t = setup;  // with the searched partition, when asked for
  BlockGraph layer = build_layer(m, t);
  std::string key = hw.name + "/" + std::to_string(t.tp) + "/" + std::to_string(t.sp) + "/" +
                    std::to_string(t.ep) + "/" + std::to_string(t.tp_recompute_allgather) + "/" +
                    std::to_string(t.seq_len) + "/" + std::to_string(t.micro_batch) + "/" +
                    name_of(t.attention);
  // One computation per key: threads of a sweep that need the same frontier wait for it.
  std::unique_lock<std::mutex> lock;
  if (options.cache) lock = std::unique_lock(options.cache->mu);
  if (options.cache && options.cache->entries.count(key)) {
    std::tie(plan.frontier, plan.option_names) = options.cache->entries.at(key);
  } else {
    std::vector<double> cost(layer.ops.size());
    for (size_t o = 0; o < layer.ops.size(); ++o)
      cost[o] = op_seconds(layer, static_cast<int>(o), hw, t, false);
    plan.frontier = layer_frontier(layer, t, cost);
    for (const LayerOption& o : plan.frontier.options)
      plan.option_names.push_back(option_name(layer, o.recompute));
    if (options.cache) options.cache->entries[key] = {plan.frontier, plan.option_names};
  }
  if (lock.owns_lock()) lock.unlock();
  if (options.search_partition && t.pp > 1 && t.stage_layers.empty())
    if (auto counts = search_partition(m, t, rt, budget, hw, layer, plan.frontier.options))
      t.stage_layers = *counts;
  // Start from no recompute everywhere; solve each stage; verify by simulation.
  const LayerOption& none = plan.frontier.options.front();
  plan.layer_policies.assign(m.layers, BlockPolicy{none.recompute, plan.option_names.front()});
  const TrainSpec sim = simulation_setup(t);
  TrainSpec one = sim;  // the stage constants (static bytes, blocks) do not depend on m
  one.microbatches = 1;
  Schedule base = build_schedule(m, one, &plan.layer_policies);
  std::vector<StageProblem> problems;
  std::vector<int64_t> target;
  std::vector<double> zc(128, 0.0);
  for (const StageProgram& p : base.stages) {
    problems.push_back(stage_problem(p, plan.frontier.options, t, zc));
    target.push_back(allocator_budget(budget, static_bytes(p), t, rt));
    plan.stages.push_back({p.stage, false, 0, {}});
  }
  // Solve every stage, simulate the whole plan once, tighten the stages the simulation finds over
  // budget (by their excess) and solve those again.
  std::vector<bool> settled(base.stages.size(), false);
  std::optional<Schedule> verified;  // the last schedule simulated, of the current policies
  bool changed_after_verify = false;
  plan.fits = true;
  for (int attempt = 0; attempt < 8; ++attempt) {
    bool any = false;
    for (size_t st = 0; st < problems.size(); ++st) {
      if (settled[st]) continue;
      problems[st].budget = target[st];
      StageSolution sol = solve_stage(problems[st]);
      if (!sol.feasible) {
        settled[st] = true;
        continue;
      }
      any = true;
      plan.stages[st].layer_option = sol.choice;
      int first = base.stages[st].first_layer();
      for (size_t l = 0; l < sol.choice.size(); ++l)
        plan.layer_policies[first + l] = {plan.frontier.options[sol.choice[l]].recompute,
                                          plan.option_names[sol.choice[l]]};
    }
    if (!any) break;
    verified = build_schedule(m, sim, &plan.layer_policies, /*peak_only=*/true);
    Estimate e = estimate_schedule(*verified, rt, {.budget = budget, .suggestions = false});
    bool again = false;
    for (size_t st = 0; st < problems.size(); ++st) {
      if (settled[st]) continue;
      int64_t over = e.stages[st].peak_bytes - budget;
      if (over <= 0) {
        plan.stages[st].feasible = settled[st] = true;
      } else {
        target[st] -= over + 1;  // the model missed something the simulation sees: ask for less
        again = true;
      }
    }
    if (!again) break;
  }
  for (size_t st = 0; st < problems.size(); ++st) {
    if (plan.stages[st].feasible) continue;
    plan.fits = false;
    if (!options.closest_when_infeasible) continue;
    problems[st].budget = budget;
    StageSolution closest = min_peak_solution(problems[st]);  // show the plan that gets closest
    int64_t least = closest.peak;
    int first = base.stages[st].first_layer();
    changed_after_verify = true;
    for (size_t l = 0; l < closest.choice.size(); ++l)
      plan.layer_policies[first + l] = {plan.frontier.options[closest.choice[l]].recompute,
                                        plan.option_names[closest.choice[l]]};
    plan.stages[st].layer_option = closest.choice;
    plan.stages[st].min_peak =
        least + fixed_overheads(t, rt) +
        static_cast<int64_t>(rt.allocator_slack *
                             static_cast<double>(least - static_bytes(base.stages[st])));
    plan.fits = false;
  }
  // The verified schedule replays only what the peaks need; a full one is built for executors.
  bool reuse = verified && !changed_after_verify && !options.full_schedule;
  plan.schedule = reuse ? std::move(*verified)
                  : options.full_schedule
                      ? build_schedule(m, t, &plan.layer_policies)
                      : build_schedule(m, sim, &plan.layer_policies, /*peak_only=*/true);
  plan.estimate = estimate_schedule(plan.schedule, rt, {.budget = budget, .suggestions = false});
  plan.estimate.setup = t;
  plan.fits = plan.fits && plan.estimate.fits;
  for (StagePlan& sp : plan.stages)
    if (!sp.feasible)
      sp.min_peak = plan.estimate.stages[sp.stage].peak_bytes;  // simulated, of the closest plan
  plan.schedule.setup = t;  // the step time counts every micro-batch
  plan.time = step_time(plan.schedule, hw);
  for (Recompute r : {Recompute::kNone, Recompute::kFull}) {
    if (!options.compare_uniform) break;
    TrainSpec u = sim;
    u.recompute = r;
    Schedule s = build_schedule(m, u, nullptr, /*peak_only=*/true);
    s.setup.microbatches =
        t.microbatches;  // peaks repeat past pp + 1 micro-batches; time counts all
    (r == Recompute::kNone ? plan.time_none : plan.time_full) = step_time(s, hw);
    (r == Recompute::kNone ? plan.peak_none : plan.peak_full) =
        estimate_schedule(s, rt, {.suggestions = false}).peak_bytes;
  }
  for (int l = 0; l < m.layers; ++l)
    for (size_t o = 0; o < layer.ops.size(); ++o)
      if (layer.ops[o].kind == OpKind::kAllGather) {
        ++plan.gathers;
        plan.regathered += plan.layer_policies[l].recompute[o];
      }
  return plan;
}

}  // namespace np
