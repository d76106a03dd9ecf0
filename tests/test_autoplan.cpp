// --recompute auto end to end: plans stay within their budget, a larger budget never gives a
// slower plan, the schedule carries every layer's option, and the CPU executor runs a mixed plan
// with predicted = measured and the same gradients as no recompute.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <set>

#include "executor/compare.hpp"
#include "executor/cpu/cpu_backend.hpp"
#include "executor/runner.hpp"
#include "planner/recompute/autoplan.hpp"
#include "planner/report/plan_report.hpp"
#include "planner/schedule/plan_io.hpp"
#include "planner/inputs/scenario.hpp"
#include "planner/schedule/contract.hpp"
#include "test_util.hpp"

namespace np {
namespace {

TrainSpec setup8b() {
  TrainSpec t;
  t.tp = 2, t.sp = true, t.pp = 2, t.microbatches = 4, t.seq_len = 2048,
  t.pp_schedule = PpSchedule::k1F1B;
  t.recompute = Recompute::kAuto;
  return t;
}

// Budgets from below the leanest plan to above no recompute: every plan that fits peaks within
// its budget (by the schedule simulation), and the step time never grows with the budget.
// Recomputation changes no number: the first loss and every gradient, bit for bit.
void expect_bitwise_equal(const exec::RunResult& ref, const exec::RunResult& run) {
  EXPECT_EQ(std::memcmp(&ref.losses[0], &run.losses[0], sizeof(double)), 0);
  for (const auto& [key, g] : ref.grads)
    EXPECT_EQ(std::memcmp(g.data(), run.grads.at(key).data(), g.size() * sizeof(float)), 0) << key;
}

void expect_within_budget_and_monotone(const TrainSpec& t) {
  ModelSpec m = testing::model("llama-3.1-8b");
  ASSERT_FALSE(validate_setup(m, t));
  AutoPlan loose = auto_plan(m, t, {}, 1'000'000'000'000, default_hardware());
  ASSERT_TRUE(loose.fits);
  ASSERT_TRUE(loose.peak_none && loose.peak_full);
  int64_t lo = *loose.peak_full - (2LL << 30), hi = *loose.peak_none + (1LL << 30);
  double last = std::numeric_limits<double>::infinity();
  int fits = 0, misses = 0;
  for (int64_t b = lo; b <= hi; b += (hi - lo) / 24) {
    AutoPlan p = auto_plan(m, t, {}, b, default_hardware(), {.compare_uniform = false});
    if (!p.fits) {
      ++misses;
      EXPECT_EQ(fits, 0) << "a larger budget stopped fitting at " << b;
      continue;
    }
    ++fits;
    EXPECT_LE(p.estimate.peak_bytes, b);
    EXPECT_LE(p.time.seconds, last * (1 + 1e-12)) << "budget " << b;
    last = p.time.seconds;
  }
  EXPECT_GT(fits, 10);
  EXPECT_GT(misses, 0);
  // With room for no recompute at all, no layer recomputes anything (only the LM head's all-gather,
  // kept as a shard per --tp-recompute-allgather, is re-done).
  for (const BlockPolicy& bp : loose.layer_policies) EXPECT_EQ(bp.name, "none");
}

// The frontier cache's key is the layer graph's: every field build_layer reads changes it, and
// setups that differ only elsewhere build the same layer (sweeps mixing cp, ep, the capacity
// factor, the profile and the attention form reused one frontier for all before).
TEST(AutoPlan, LayerGraphKeyCoversWhatTheLayerReads) {
  const ModelSpec m = testing::model("mixtral-8x7b");
  TrainSpec t;
  t.tp = 2, t.sp = true, t.dp = 4, t.ep = 2, t.moe_capacity_factor = 1.0;
  t.impl = Impl::kMegatron;
  ASSERT_FALSE(validate_setup(m, t));
  auto same_layer = [&](const TrainSpec& a, const TrainSpec& b) {
    BlockGraph x = build_layer(m, a), y = build_layer(m, b);
    if (x.tensors.size() != y.tensors.size() || x.ops.size() != y.ops.size()) return false;
    for (size_t i = 0; i < x.tensors.size(); ++i)
      if (x.tensors[i].type.shape != y.tensors[i].type.shape ||
          x.tensors[i].type.dtype != y.tensors[i].type.dtype)
        return false;
    for (size_t i = 0; i < x.ops.size(); ++i) {
      if (x.ops[i].kind != y.ops[i].kind || x.ops[i].attrs.dense_wgrad != y.ops[i].attrs.dense_wgrad ||
          x.ops[i].attrs.capacity != y.ops[i].attrs.capacity ||
          x.ops[i].weights.size() != y.ops[i].weights.size())
        return false;
      for (size_t w = 0; w < x.ops[i].weights.size(); ++w)
        if (x.ops[i].weights[w].shape != y.ops[i].weights[w].shape) return false;
    }
    return true;
  };
  std::vector<std::function<void(TrainSpec&)>> in_key = {
      [](TrainSpec& c) { c.tp = 4; },
      [](TrainSpec& c) { c.cp = 2; },
      [](TrainSpec& c) { c.ep = 4; },
      [](TrainSpec& c) { c.seq_len = 2048; },
      [](TrainSpec& c) { c.micro_batch = 2; },
      [](TrainSpec& c) { c.attention = AttentionImpl::kEager; },
      [](TrainSpec& c) { c.impl = Impl::kFused; },
      [](TrainSpec& c) { c.moe_capacity_factor = 1.5; },
      [](TrainSpec& c) { c.grad_accum_fusion = false; }};
  for (size_t i = 0; i < in_key.size(); ++i) {
    TrainSpec c = t;
    in_key[i](c);
    EXPECT_NE(layer_graph_key(c), layer_graph_key(t)) << "field " << i;
    EXPECT_FALSE(same_layer(c, t)) << "field " << i << " changes no layer: drop it from the key";
  }
  std::vector<std::function<void(TrainSpec&)>> outside = {
      [](TrainSpec& c) { c.pp = 2, c.microbatches = 2; },
      [](TrainSpec& c) { c.dp = 8; },
      [](TrainSpec& c) { c.zero = 1; },
      [](TrainSpec& c) { c.recompute = Recompute::kFull; },
      [](TrainSpec& c) { c.loss_fusion = LossFusion::kTe; },
      [](TrainSpec& c) { c.dataloader_mask = false; },
      [](TrainSpec& c) { c.vocab_multiple = 64; },
      [](TrainSpec& c) { c.grad_dtype = Dtype::kBf16; }};
  for (size_t i = 0; i < outside.size(); ++i) {
    TrainSpec c = t;
    outside[i](c);
    EXPECT_EQ(layer_graph_key(c), layer_graph_key(t)) << "field " << i;
    EXPECT_TRUE(same_layer(c, t)) << "field " << i << " changes the layer: add it to the key";
  }
  // Sequence parallelism (a dense model: MoE under TP needs it).
  TrainSpec d;
  d.tp = 2, d.sp = true;
  TrainSpec e = d;
  e.sp = false;
  EXPECT_NE(layer_graph_key(d), layer_graph_key(e));
}

TEST(AutoPlan, WithinBudgetAndMonotone) {
  expect_within_budget_and_monotone(setup8b());
}

// The same under the interleaved schedule (2 chunks per stage; the stage solver takes each
// chunk's passes alive at each step, and the simulation checks every plan).
TEST(AutoPlan, InterleavedWithinBudgetAndMonotone) {
  TrainSpec t = setup8b();
  t.pp_schedule = PpSchedule::kInterleaved, t.virtual_stages = 2;
  expect_within_budget_and_monotone(t);
}

// Context parallelism: the auto planner decides around the K/V exchange. With room, it keeps the
// gathered K/V (re-running nothing: the named policies exchange it again); tighter, it re-runs the
// exchange before it re-runs anything that costs compute. Every plan within its budget.
TEST(AutoPlan, ContextParallelKeepsOrRegathersTheKv) {
  ModelSpec m = testing::model("llama-3.1-8b");
  TrainSpec t = setup8b();
  t.pp = 1, t.microbatches = 1, t.cp = 2, t.seq_len = 16384;
  ASSERT_FALSE(validate_setup(m, t));
  auto regathers = [](const AutoPlan& p) {
    const BlockGraph& g = *p.schedule.stages[0].blocks[1].graph;
    int n = 0;
    for (const BlockPolicy& bp : p.layer_policies)
      for (size_t o = 0; o < g.ops.size(); ++o)
        n += g.ops[o].kind == OpKind::kCpGatherKv && bp.recompute[o];
    return n;
  };
  AutoPlan loose = auto_plan(m, t, {}, 1'000'000'000'000, default_hardware());
  ASSERT_TRUE(loose.fits);
  EXPECT_EQ(regathers(loose), 0);
  EXPECT_EQ(loose.time.recompute_seconds, 0);
  ASSERT_TRUE(loose.peak_none);
  // Just below keeping everything: some layers exchange K/V again, and fit.
  AutoPlan tight =
      auto_plan(m, t, {}, loose.estimate.peak_bytes - (256LL << 20), default_hardware());
  ASSERT_TRUE(tight.fits);
  EXPECT_GT(regathers(tight), 0);
  EXPECT_LE(tight.estimate.peak_bytes, loose.estimate.peak_bytes - (256LL << 20));
}

// The stage model sees what the simulation sees (the schedule's bytes, exactly): across ZeRO stages (ZeRO-3's gathered weights
// and ZeRO-2/3's gradient buckets live through every block's backward), both pipeline schedules
// and budgets from tight to loose, every plan that fits was verified by its first simulation.
TEST(AutoPlan, StageModelNeedsNoTightening) {
  ModelSpec m = testing::model("llama-3.1-8b");
  RuntimeAssumptions rt;  // the schedule's own bytes: the caching allocator's come on top
  rt.allocator.model = AllocatorModel::kExact;
  int plans = 0;
  for (int zero : {0, 1, 2, 3})
    for (PpSchedule sched : {PpSchedule::kAfab, PpSchedule::k1F1B})
      for (int64_t pp : {1, 2}) {
        if (zero >= 2 && pp > 1) continue;  // nanotron: ZeRO-2/3 only without pipelining
        TrainSpec t = setup8b();
        t.pp = pp, t.dp = 4, t.zero = zero, t.pp_schedule = sched;
        AutoPlan loose = auto_plan(m, t, rt, 1'000'000'000'000, default_hardware());
        ASSERT_TRUE(loose.peak_full && loose.peak_none);
        for (double at : {0.1, 0.4, 0.7, 1.0}) {
          int64_t b =
              *loose.peak_full +
              static_cast<int64_t>(at * static_cast<double>(*loose.peak_none - *loose.peak_full));
          AutoPlan p = auto_plan(m, t, rt, b, default_hardware(), {.compare_uniform = false});
          if (!p.fits) continue;
          ++plans;
          EXPECT_EQ(p.simulations, 1)
              << "zero " << zero << " " << name_of(sched) << " pp " << pp << " budget " << b;
        }
      }
  EXPECT_GT(plans, 20);
}

// The 8B plan halfway between the peaks of recompute_layer: true and of no recompute (its budget
// in `budget`), of setup8b or another setup.
AutoPlan halfway8b(int64_t* budget = nullptr, TrainSpec t = setup8b()) {
  ModelSpec m = testing::model("llama-3.1-8b");
  AutoPlan loose = auto_plan(m, t, {}, 1'000'000'000'000, default_hardware());
  int64_t b = (*loose.peak_full + *loose.peak_none) / 2;
  if (budget) *budget = b;
  return auto_plan(m, t, {}, b, default_hardware());
}

// Between the peaks of recompute_layer: true and of no recompute, the plan beats nanotron's
// all-or-nothing flag on time.
TEST(AutoPlan, BeatsUniformFullRecompute) {
  AutoPlan p = halfway8b();
  ASSERT_TRUE(p.fits);
  ASSERT_TRUE(p.time_full);
  EXPECT_LT(p.time.seconds, p.time_full->seconds);
  EXPECT_GT(p.time.recompute_seconds, 0.0);
}

// The plan file carries every layer's chosen option, and reading it back gives the same program.
TEST(AutoPlan, ScheduleCarriesEveryLayerOption) {
  AutoPlan p = halfway8b();
  nlohmann::json j = schedule_to_json(p.schedule);
  int layers = 0;
  for (const auto& st : j["stages"])
    for (const auto& b : st["blocks"])
      if (b["kind"] == "layer") {
        EXPECT_EQ(b["policy"], p.layer_policies[b["layer"].get<int>()].name);
        ++layers;
      }
  EXPECT_EQ(layers, 32);
  auto back = schedule_from_json(j);
  ASSERT_TRUE(back.ok()) << back.error().message;
  for (const StageProgram& sp : back->stages) EXPECT_FALSE(check_program(sp));
  for (int l = 0; l < 32; ++l) {
    const StageProgram& sp = back->stages[l < back->stages[0].num_layers() ? 0 : 1];
    for (const StageBlock& b : sp.blocks) {
      if (b.layer != l) continue;
      EXPECT_EQ(b.policy.recompute, p.layer_policies[l].recompute) << "layer " << l;
    }
  }
}

// A stage whose interleaved search stopped at its branch limit is marked in the table, with the
// most a cheaper plan could save, and in the JSON with its recompute time and the lower bound.
TEST(AutoPlan, UnprovenStagesAreMarked) {
  int64_t b = 0;
  TrainSpec t = setup8b();
  t.pp_schedule = PpSchedule::kInterleaved, t.virtual_stages = 2;
  AutoPlan p = halfway8b(&b, t);
  ASSERT_TRUE(p.fits);
  std::string proven = auto_plan_table(p, b);  // two chunks per stage: the search finishes
  EXPECT_EQ(proven.find(" *\n"), std::string::npos);
  EXPECT_EQ(proven.find("search stopped"), std::string::npos);
  const nlohmann::json stages = auto_plan_json(p)["per_stage"];
  ASSERT_EQ(stages.size(), 2u);
  for (const auto& st : stages) EXPECT_TRUE(st["proven"].get<bool>());
  p.stages[1].proven = false;
  p.stages[1].recompute = 0.004, p.stages[1].recompute_lower = 0.003;
  std::string table = auto_plan_table(p, b);
  EXPECT_NE(table.find(" *\n"), std::string::npos) << table;
  EXPECT_NE(table.find("search stopped at 200,000 branches before proving these stages best; a "
                       "cheaper plan would re-run at most 25.0% less"),
            std::string::npos)
      << table;
  nlohmann::json j = auto_plan_json(p)["per_stage"][1];
  EXPECT_FALSE(j["proven"].get<bool>());
  EXPECT_EQ(j["recompute_seconds_per_microbatch"].get<double>(), 0.004);
  EXPECT_EQ(j["recompute_seconds_lower_bound"].get<double>(), 0.003);
}

// The plan run on the CPU executor: every event as planned, every rank within budget `b`, and the
// loss and gradients bitwise those of no recompute.
void expect_runs_as_planned(const ModelSpec& m, const TrainSpec& t, const AutoPlan& p,
                            int64_t b) {
  exec::RunOptions o;
  o.capture_grads = true;
  auto run = exec::run_schedule(
      p.schedule, [] { return exec::make_cpu_backend(); }, o);
  ASSERT_TRUE(run.ok()) << run.error().message;
  exec::RunComparison c = exec::compare(p.schedule, *run, "auto");
  EXPECT_TRUE(c.all_equal) << exec::comparison_table(c);
  for (const exec::RankComparison& r : c.ranks) EXPECT_LE(r.measured, b);
  TrainSpec none = t;
  none.recompute = Recompute::kNone;
  none.tp_recompute_allgather = false;
  auto ref = exec::run_schedule(
      build_schedule(m, none), [] { return exec::make_cpu_backend(); }, o);
  ASSERT_TRUE(ref.ok());
  expect_bitwise_equal(*ref, *run);
}

// A mixed plan on the CPU executor: predicted = measured on every rank, and recomputation changes
// no number (bitwise equal to the same setup without recompute).
TEST(AutoPlan, ExecutorRunsAMixedPlan) {
  auto sc = load_scenario(std::string(NANOPLAN_SOURCE_DIR) + "/scenarios/tiny-llama.toml",
                          testing::catalog());
  ASSERT_TRUE(sc.ok()) << sc.error().message;
  TrainSpec t = sc->base;
  t.tp = 2, t.sp = true, t.pp = 2, t.pp_schedule = PpSchedule::k1F1B,
  t.recompute = Recompute::kAuto;
  RuntimeAssumptions rt;
  rt.cuda_context_bytes = rt.cublas_workspace_bytes = rt.nccl_bytes_per_comm = 0;
  rt.allocator.model = AllocatorModel::kExact;  // the schedule's bytes, exactly
  AutoPlan loose = auto_plan(sc->model, t, rt, 1LL << 40, default_hardware());
  int64_t b = (*loose.peak_full + *loose.peak_none) / 2;
  AutoPlan p = auto_plan(sc->model, t, rt, b, default_hardware());
  ASSERT_TRUE(p.fits);
  std::set<std::string> options;
  for (const BlockPolicy& bp : p.layer_policies) options.insert(bp.name);
  EXPECT_GE(options.size(), 2u) << "the budget should force a mix of options across the layers";
  expect_runs_as_planned(sc->model, t, p, b);
}

// A model with dense layers among its MoE layers: each kind's own frontier, every layer an option
// of its kind, the plan within its budget as the executor measures it, event-exact, and the
// loss and gradients bitwise those of no recompute; under 1F1B and the interleaved schedule.
TEST(AutoPlan, MixedLayersEachOnItsOwnFrontier) {
  auto sc = load_scenario(std::string(NANOPLAN_SOURCE_DIR) + "/scenarios/tiny-moe-mixed.toml",
                          testing::catalog());
  ASSERT_TRUE(sc.ok()) << sc.error().message;
  for (PpSchedule sched : {PpSchedule::k1F1B, PpSchedule::kInterleaved}) {
    TrainSpec t = sc->base;
    t.tp = 2, t.sp = true, t.pp = 2, t.pp_schedule = sched, t.recompute = Recompute::kAuto;
    t.virtual_stages = sched == PpSchedule::kInterleaved ? 2 : 1;
    ASSERT_FALSE(validate_setup(sc->model, t));
    RuntimeAssumptions rt;
    rt.cuda_context_bytes = rt.cublas_workspace_bytes = rt.nccl_bytes_per_comm = 0;
    rt.allocator.model = AllocatorModel::kExact;
    AutoPlan loose = auto_plan(sc->model, t, rt, 1LL << 40, default_hardware());
    ASSERT_FALSE(loose.dense_frontier.options.empty());
    int64_t b = (*loose.peak_full + *loose.peak_none) / 2;
    AutoPlan p = auto_plan(sc->model, t, rt, b, default_hardware());
    ASSERT_TRUE(p.fits) << name_of(sched);
    BlockGraphs graphs(sc->model, t);
    for (const StageProgram& st : p.schedule.stages)
      for (const StageBlock& blk : st.blocks) {
        if (blk.kind != BlockKind::kLayer) continue;
        const bool dense = dense_layer(sc->model, blk.layer);
        EXPECT_EQ(blk.policy.recompute.size(),
                  (dense ? graphs.dense_layer : graphs.layer)->ops.size())
            << blk.layer;
        const auto& names = dense ? p.dense_option_names : p.option_names;
        EXPECT_NE(std::find(names.begin(), names.end(), blk.policy.name), names.end())
            << blk.layer << " " << blk.policy.name;
      }
    expect_runs_as_planned(sc->model, t, p, b);
  }
}

// cannot_fit, which lets a sweep skip a setup before its frontier is found, refuses only setups
// the auto planner cannot fit: over MoE, mixed and dense models, pipelines, ZeRO stages and
// budgets from far too small to ample, each setup it refuses fails auto_plan too. Some setups are
// refused for their layers' least kept bytes, not their static bytes alone, and setups the
// planner fits are left to it.
TEST(AutoPlan, CannotFitRefusesOnlyWhatDoesNotFit) {
  struct Case {
    const char* model;
    int64_t tp, pp, ep;
    int zero;
    PpSchedule sched;
  };
  int refused = 0, refused_for_layers = 0, planned = 0;
  for (Case c : {Case{"qwen3-30b-a3b", 2, 2, 4, 1, PpSchedule::k1F1B},
                 Case{"qwen3-30b-a3b", 1, 4, 8, 0, PpSchedule::kAfab},
                 Case{"deepseek-v2-lite", 2, 1, 2, 3, PpSchedule::k1F1B},
                 Case{"llama-3.1-8b", 2, 2, 1, 1, PpSchedule::kInterleaved}}) {
    const ModelSpec m = testing::model(c.model);
    TrainSpec t;
    t.tp = c.tp, t.sp = c.tp > 1, t.pp = c.pp, t.ep = c.ep, t.zero = c.zero;
    t.dp = std::max<int64_t>(c.ep, 2);
    t.pp_schedule = c.sched, t.virtual_stages = c.sched == PpSchedule::kInterleaved ? 2 : 1;
    t.microbatches = 8, t.seq_len = 4096, t.recompute = Recompute::kAuto;
    auto bad = validate_setup(m, t);
    ASSERT_FALSE(bad) << c.model << ": " << bad->message;
    const AutoPlan loose = auto_plan(m, t, {}, 1LL << 40, default_hardware());
    ASSERT_TRUE(loose.peak_full) << c.model;
    // Where nothing fits, the closest plan's least peak of each stage: no budget that holds it
    // may be refused (the bound is below the model's least peak, the simulation's at or above).
    const AutoPlan tight = auto_plan(m, t, {}, *loose.peak_full / 8, default_hardware(),
                                     {.compare_uniform = false});
    ASSERT_FALSE(tight.fits) << c.model;
    int64_t least = 0;
    for (const StagePlan& sp : tight.stages)
      if (!sp.feasible) least = std::max(least, sp.min_peak);
    EXPECT_FALSE(cannot_fit(m, t, {}, least)) << c.model << " least peak " << least;
    // Far below the leanest plan's peak, then around it, where a bound too high would refuse.
    std::vector<int64_t> budgets;
    for (int i = 1; i <= 6; ++i) budgets.push_back(*loose.peak_full * i / 8);
    for (int i = -5; i <= 5; ++i) budgets.push_back(*loose.peak_full + *loose.peak_full * i / 50);
    for (int64_t b : budgets) {
      const bool refuse = cannot_fit(m, t, {}, b);
      const AutoPlan p = auto_plan(m, t, {}, b, default_hardware(), {.compare_uniform = false});
      if (refuse) {
        EXPECT_FALSE(p.fits) << c.model << " budget " << b;
        ++refused;
        // With one micro-batch in flight it would not be refused: the layers' kept bytes, not
        // the static bytes and fixed lines alone, refused it.
        TrainSpec one = t;
        one.microbatches = 1;
        refused_for_layers += !cannot_fit(m, one, {}, b);
      } else {
        planned += p.fits;
      }
    }
  }
  EXPECT_GT(refused, 4);
  EXPECT_GT(refused_for_layers, 0);
  EXPECT_GT(planned, 4);
}

// The LM head's options are planned with the layers: under AFAB the last stage keeps the head's
// saved tensors (logits-sized with a 128k vocabulary) for every micro-batch, and at tight budgets
// the plan re-runs part of the head instead of more of the layers. Every plan stays within its
// budget and its step time never grows with the budget.
TEST(AutoPlan, PlansTheHeadToo) {
  ModelSpec m = testing::model("llama-3.1-8b");
  TrainSpec t = setup8b();
  t.pp_schedule = PpSchedule::kAfab, t.microbatches = 8;
  AutoPlan loose = auto_plan(m, t, {}, 1'000'000'000'000, default_hardware());
  ASSERT_TRUE(loose.head_policy);
  EXPECT_EQ(loose.head_policy->name, "none");  // room for everything: nothing re-done
  int64_t lo = *loose.peak_full, hi = *loose.peak_none;
  std::set<std::string> heads;
  double last = std::numeric_limits<double>::infinity();
  for (int64_t b = lo; b <= hi; b += (hi - lo) / 16) {
    AutoPlan p = auto_plan(m, t, {}, b, default_hardware(), {.compare_uniform = false});
    if (!p.fits) continue;
    EXPECT_LE(p.estimate.peak_bytes, b);
    EXPECT_LE(p.time.seconds, last * (1 + 1e-12)) << "budget " << b;
    last = p.time.seconds;
    const StageProgram& lastst = p.schedule.stages.back();
    EXPECT_EQ(lastst.blocks.back().kind, BlockKind::kHead);
    EXPECT_EQ(lastst.blocks.back().policy.name, p.head_policy->name);
    heads.insert(p.head_policy->name);
  }
  EXPECT_GE(heads.size(), 2u) << "tight budgets should re-run part of the head";
}

// A head that re-runs its ops (norm, all-gather, LM head matmul, loss) runs on the CPU executor
// with predicted = measured and the same numbers as keeping everything.
TEST(AutoPlan, ExecutorRunsARecomputedHead) {
  auto sc = load_scenario(std::string(NANOPLAN_SOURCE_DIR) + "/scenarios/tiny-llama.toml",
                          testing::catalog());
  ASSERT_TRUE(sc.ok()) << sc.error().message;
  TrainSpec t = sc->base;
  t.tp = 2, t.sp = true, t.pp = 2, t.tp_recompute_allgather = false;
  BlockGraph head = build_head(sc->model, t);
  std::vector<LayerOption> options =
      pareto_frontier(enumerate_options(head, std::vector<double>(head.ops.size(), 1.0)));
  const LayerOption& leanest = options.back();  // sorted by kept bytes, largest first
  BlockPolicies pol;
  pol.layers.assign(sc->model.layers, named_policy(build_layer(sc->model, t), t));
  pol.head = BlockPolicy{leanest.recompute, "leanest"};
  Schedule s = build_schedule(sc->model, t, &pol);
  ASSERT_EQ(s.stages.back().blocks.back().policy.name, "leanest");
  exec::RunOptions o;
  o.capture_grads = true;
  auto run = exec::run_schedule(
      s, [] { return exec::make_cpu_backend(); }, o);
  ASSERT_TRUE(run.ok()) << run.error().message;
  exec::RunComparison c = exec::compare(s, *run, "head");
  EXPECT_TRUE(c.all_equal) << exec::comparison_table(c);
  auto ref = exec::run_schedule(
      build_schedule(sc->model, t), [] { return exec::make_cpu_backend(); }, o);
  ASSERT_TRUE(ref.ok());
  expect_bitwise_equal(*ref, *run);
}

// The slowest stage's time per micro-batch (forward, backward, recompute): what a partition sets.
double bottleneck(const AutoPlan& p) {
  double worst = 0;
  for (const StageSeconds& s : p.time.stages) worst = std::max(worst, s.microbatch());
  return worst;
}

// --partition auto against every split: on a tiny 8-layer Llama with 3 stages under 1F1B, at
// budgets where memory binds. When the searched split is kept, its slowest stage is as fast as
// the best of all 21 splits that fit (their plans solved each on its own); either way the plan
// fits and is never slower than the balanced split's.
TEST(AutoPlan, PartitionSearchMatchesEverySplit) {
  auto sc = load_scenario(std::string(NANOPLAN_SOURCE_DIR) + "/scenarios/tiny-llama.toml",
                          testing::catalog());
  ASSERT_TRUE(sc.ok()) << sc.error().message;
  ModelSpec m = sc->model;
  m.layers = 8;
  TrainSpec t = sc->base;
  t.tp = 2, t.sp = true, t.pp = 3, t.microbatches = 4, t.pp_schedule = PpSchedule::k1F1B;
  t.recompute = Recompute::kAuto;
  RuntimeAssumptions rt;
  rt.cuda_context_bytes = rt.cublas_workspace_bytes = rt.nccl_bytes_per_comm = 0;
  rt.allocator.model = AllocatorModel::kExact;  // the schedule's bytes, exactly
  AutoPlan loose = auto_plan(m, t, rt, 1LL << 40, default_hardware());
  ASSERT_TRUE(loose.peak_full && loose.peak_none);
  int kept_searched = 0;
  for (double at : {0.3, 0.5, 0.7, 0.9}) {
    int64_t b = *loose.peak_full +
                static_cast<int64_t>(at * static_cast<double>(*loose.peak_none - *loose.peak_full));
    AutoPlan s = auto_plan(m, t, rt, b, default_hardware(),
                           {.compare_uniform = false, .search_partition = true});
    AutoPlan even = auto_plan(m, t, rt, b, default_hardware(), {.compare_uniform = false});
    double best = std::numeric_limits<double>::infinity();
    for (int64_t a = 1; a <= 6; ++a)
      for (int64_t c = 1; a + c <= 7; ++c) {
        TrainSpec u = t;
        u.stage_layers = {a, c, 8 - a - c};
        AutoPlan p = auto_plan(m, u, rt, b, default_hardware(), {.compare_uniform = false});
        if (p.fits) best = std::min(best, bottleneck(p));
      }
    if (!std::isfinite(best)) {
      EXPECT_FALSE(s.fits) << "budget " << b;
      continue;
    }
    ASSERT_TRUE(s.fits) << "budget " << b;
    EXPECT_LE(s.estimate.peak_bytes, b);
    if (even.fits) {
      EXPECT_LE(s.time.seconds, even.time.seconds) << "budget " << b;
    }
    EXPECT_EQ(s.partition_searched, !s.schedule.setup.stage_layers.empty());
    if (!s.partition_searched) continue;
    ++kept_searched;
    EXPECT_NEAR(bottleneck(s), best, 1e-9 * best) << "budget " << b;
    std::vector<int64_t> split = s.schedule.setup.stage_layers;
    EXPECT_EQ(split[0] + split[1] + split[2], 8);
  }
  EXPECT_GT(kept_searched, 0) << "some budget should move layers off the balanced split";
}

// The stage solver is exact: on a tiny Llama with two layers per stage (pp 2 and 3, 2 pp
// micro-batches; interleaved with one layer per chunk, where the first stage holds 2 pp - 1
// passes of its first chunk and pp of its second at its peak, and 1F1B), every stage's layer
// choice costs no more than the cheapest of all its layers' frontier choices that the schedule
// simulation finds within the budget (the embedding's and head's options as the plan chose
// them), from tight budgets to loose. One simulation verifies every plan.
TEST(AutoPlan, StageSolverMatchesEveryLayerChoice) {
  auto sc = load_scenario(std::string(NANOPLAN_SOURCE_DIR) + "/scenarios/tiny-llama.toml",
                          testing::catalog());
  ASSERT_TRUE(sc.ok()) << sc.error().message;
  RuntimeAssumptions rt;
  rt.cuda_context_bytes = rt.cublas_workspace_bytes = rt.nccl_bytes_per_comm = 0;
  rt.allocator.model = AllocatorModel::kExact;  // the schedule's bytes, exactly
  int compared = 0, recomputing = 0;
  for (int64_t pp : {2, 3})
    for (PpSchedule sched : {PpSchedule::kInterleaved, PpSchedule::k1F1B}) {
      ModelSpec m = sc->model;
      m.layers = 2 * pp;
      TrainSpec t = sc->base;
      t.tp = 2, t.sp = true, t.pp = pp, t.microbatches = 2 * pp;
      t.pp_schedule = sched, t.virtual_stages = sched == PpSchedule::kInterleaved ? 2 : 1;
      t.recompute = Recompute::kAuto;
      ASSERT_FALSE(validate_setup(m, t));
      AutoPlan loose = auto_plan(m, t, rt, 1LL << 40, default_hardware());
      ASSERT_TRUE(loose.peak_full && loose.peak_none);
      const std::vector<std::vector<int>> layers = stage_layer_lists(m, t);
      for (double at : {0.05, 0.2, 0.4, 0.6, 0.8}) {
        int64_t b =
            *loose.peak_full +
            static_cast<int64_t>(at * static_cast<double>(*loose.peak_none - *loose.peak_full));
        AutoPlan p = auto_plan(m, t, rt, b, default_hardware(), {.compare_uniform = false});
        if (!p.fits) continue;
        EXPECT_EQ(p.simulations, 1) << name_of(sched) << " pp " << pp << " budget " << b;
        const std::vector<LayerOption>& opts = p.frontier.options;
        for (int64_t st = 0; st < pp; ++st) {
          double chosen = 0;
          for (int o : p.stages[st].layer_option) chosen += opts[o].cost;
          recomputing += chosen > 0;
          // Every choice of the stage's two layers, cheapest first; the first that fits is the
          // oracle's optimum.
          std::vector<std::pair<double, std::pair<int, int>>> pairs;
          for (size_t x = 0; x < opts.size(); ++x)
            for (size_t y = 0; y < opts.size(); ++y)
              pairs.push_back(
                  {opts[x].cost + opts[y].cost, {static_cast<int>(x), static_cast<int>(y)}});
          std::stable_sort(pairs.begin(), pairs.end(),
                           [](const auto& u, const auto& v) { return u.first < v.first; });
          double oracle = std::numeric_limits<double>::infinity();
          for (const auto& [cost, xy] : pairs) {
            if (cost >= chosen * (1 + 1e-9) + 1e-15) break;  // no cheaper choice than the plan's
            BlockPolicies pol{p.layer_policies, p.embedding_policy, p.head_policy};
            pol.layers[layers[st][0]] = {opts[xy.first].recompute, "x"};
            pol.layers[layers[st][1]] = {opts[xy.second].recompute, "y"};
            Schedule s = build_schedule(m, simulation_setup(t), &pol, /*peak_only=*/true);
            if (estimate_schedule(s, rt, {.budget = b, .suggestions = false})
                    .stages[st]
                    .peak_bytes <= b) {
              oracle = cost;
              break;
            }
          }
          // Nothing cheaper than the plan's choice fits (the plan's own choice fits: p.fits).
          EXPECT_FALSE(oracle < chosen * (1 - 1e-9))
              << name_of(sched) << " pp " << pp << " stage " << st << " budget " << b
              << ": a choice costing " << oracle << " s fits, the plan's costs " << chosen << " s";
          ++compared;
        }
      }
    }
  EXPECT_GT(compared, 12);
  EXPECT_GT(recomputing, 4);
}

// An uneven split runs on the CPU executor with predicted = measured, and survives the plan file.
TEST(AutoPlan, ExecutorRunsAnUnevenSplit) {
  auto sc = load_scenario(std::string(NANOPLAN_SOURCE_DIR) + "/scenarios/tiny-llama.toml",
                          testing::catalog());
  ASSERT_TRUE(sc.ok()) << sc.error().message;
  TrainSpec t = sc->base;
  t.tp = 2, t.sp = true, t.pp = 2, t.pp_schedule = PpSchedule::k1F1B;
  t.stage_layers = {3, 1};
  Result<Schedule> back = schedule_from_json(schedule_to_json(build_schedule(sc->model, t)));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->setup.stage_layers, t.stage_layers);
  ASSERT_EQ(back->stages[0].num_layers(), 3);
  auto run = exec::run_schedule(*back, [] { return exec::make_cpu_backend(); }, {});
  ASSERT_TRUE(run.ok()) << run.error().message;
  exec::RunComparison c = exec::compare(*back, *run, "uneven");
  EXPECT_TRUE(c.all_equal) << exec::comparison_table(c);
}

// plan_setup, the pipeline plan, report, run and --emit share: the auto plan's schedule and its
// verdict under Recompute::kAuto, the named policy's schedule otherwise, each estimated against
// the usable budget with the headroom carried.
TEST(AutoPlan, PlanSetupIsTheAutoPlanOrTheNamedScheduleEstimated) {
  ModelSpec m = testing::model("llama-3.1-8b");
  TrainSpec t = setup8b();
  t.recompute = Recompute::kAuto;
  const int64_t budget = 30'000'000'000, headroom = 900'000'000;
  PlanInputs in{{}, budget, headroom, default_hardware(), {}};
  PlannedSetup p = plan_setup(m, t, in);
  AutoPlan direct = auto_plan(m, t, {}, budget, default_hardware());
  ASSERT_TRUE(p.plan.has_value());
  EXPECT_EQ(p.plan->fits, direct.fits);
  EXPECT_EQ(p.estimate.fits, direct.fits);
  EXPECT_EQ(p.estimate.peak_bytes, direct.estimate.peak_bytes);
  EXPECT_EQ(p.estimate.headroom, headroom);
  ASSERT_EQ(p.schedule.stages.size(), direct.schedule.stages.size());
  for (size_t s = 0; s < p.schedule.stages.size(); ++s)
    EXPECT_EQ(p.schedule.stages[s].instrs.size(), direct.schedule.stages[s].instrs.size());
  EXPECT_TRUE(p.plan->schedule.stages.empty());  // moved into PlannedSetup::schedule

  t.recompute = Recompute::kFull;
  PlannedSetup full = plan_setup(m, t, in);
  EXPECT_FALSE(full.plan.has_value());
  Estimate e = estimate_schedule(build_schedule(m, t), {}, {.budget = budget});
  EXPECT_EQ(full.estimate.peak_bytes, e.peak_bytes);
  EXPECT_EQ(full.estimate.fits, e.fits);

  t.recompute = Recompute::kAuto;
  in.budget.reset();
  EXPECT_THROW(plan_setup(m, t, in), std::invalid_argument);
}

}  // namespace
}  // namespace np
