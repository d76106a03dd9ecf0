// Every scenario in scenarios/, across its whole setup matrix, on the CPU reference executor:
// predicted peak = measured peak on every rank to the byte, and the scenario's loss checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "executor/compare.hpp"
#include "executor/cpu/cpu_backend.hpp"
#include "executor/runner.hpp"
#include "executor/scenario_run.hpp"
#include "planner/inputs/scenario.hpp"
#include "test_util.hpp"

namespace np::exec {
namespace {

class Scenarios : public ::testing::TestWithParam<std::string> {};

TEST_P(Scenarios, PredictedEqualsMeasuredAcrossTheMatrix) {
  auto sc = load_scenario(std::string(NANOPLAN_SOURCE_DIR) + "/scenarios/" + GetParam() + ".toml",
                          testing::catalog());
  ASSERT_TRUE(sc.ok()) << sc.error().message;
  ASSERT_GE(sc->matrix.size(), 8u);
  // The setups each scenario is there for are in its matrix.
  auto has = [&](auto pred) { return std::any_of(sc->matrix.begin(), sc->matrix.end(), pred); };
  const std::string name = GetParam();
  if (name == "tiny-llama-dp") {
    for (int zero : {0, 1, 2, 3})
      EXPECT_TRUE(has([&](const TrainSpec& t) {
        return t.dp == 4 && t.zero == zero && t.tp == 2 && t.pp == (zero >= 2 ? 1 : 2);
      }));
  }
  if (name == "tiny-gpt-cp") {  // CP with TP, a pipeline, data replicas and ZeRO-1
    EXPECT_TRUE(has([](const TrainSpec& t) {
      return t.cp == 2 && t.tp == 2 && t.pp == 2 && t.dp == 2 && t.zero == 1;
    }));
  }
  if (name == "tiny-moe") {  // ZeRO-3 over the dense and the expert groups, with TP
    EXPECT_TRUE(has([](const TrainSpec& t) { return t.dp == 2 && t.zero == 3 && t.tp == 2; }));
  }
  if (name == "tiny-moe-ep") {  // EP with TP, a pipeline, and ZeRO-3 over the expert group
    for (int zero : {1, 3})
      EXPECT_TRUE(has([&](const TrainSpec& t) {
        return t.ep == 2 && t.tp == 2 && t.zero == zero && t.pp == (zero == 3 ? 1 : 2);
      }));
  }
  if (name == "tiny-gpt-megatron") {  // the Megatron variants of the op table, through the runs
    EXPECT_TRUE(has([](const TrainSpec& t) {
      return t.impl == Impl::kMegatron && !t.grad_accum_fusion &&
             t.loss_fusion == LossFusion::kNative && t.tp == 2 && t.pp == 2 && t.sp;
    }));
  }
  if (name == "tiny-gpt-te-fp8") {  // TE's float8 under SP with a pipeline, both recipes
    for (Fp8Recipe r : {Fp8Recipe::kDelayed, Fp8Recipe::kTensorwise})
      EXPECT_TRUE(has([&](const TrainSpec& t) {
        return t.impl == Impl::kMegatron && t.fp8 == r && t.tp == 2 && t.pp == 2 && t.sp &&
               t.recompute == Recompute::kFull;
      }));
  }
  if (name == "tiny-qwen3") {  // the q/k norms' TP-partial gradients under ZeRO-3 and a pipeline
    EXPECT_TRUE(has([](const TrainSpec& t) { return t.tp == 2 && t.dp == 2 && t.zero == 3; }));
    EXPECT_TRUE(has([](const TrainSpec& t) {
      return t.tp == 2 && t.pp == 2 && t.pp_schedule == PpSchedule::kInterleaved &&
             t.recompute == Recompute::kFull && t.impl == Impl::kMegatron;
    }));
  }
  if (name == "tiny-llama-torchtitan") {  // per-op checkpointing's cache under TP, PP and ZeRO-3
    EXPECT_TRUE(has([](const TrainSpec& t) {
      return t.impl == Impl::kTorchtitan && t.recompute == Recompute::kSelectiveOp && t.tp == 2 &&
             t.pp == 2 && t.pp_schedule == PpSchedule::kInterleaved;
    }));
    EXPECT_TRUE(has([](const TrainSpec& t) {
      return t.recompute == Recompute::kSelectiveOp && t.tp == 2 && t.dp == 2 && t.zero == 3;
    }));
  }
  if (name == "tiny-llama-fsdp") {  // FSDP2 with TP, reshard off, per-op checkpointing
    EXPECT_TRUE(has([](const TrainSpec& t) {
      return t.fsdp && t.tp == 2 && t.dp == 4 && !t.reshard_after_forward &&
             t.recompute == Recompute::kSelectiveOp && t.impl == Impl::kTorchtitan;
    }));
    EXPECT_TRUE(has([](const TrainSpec& t) {  // float8 TP with FSDP's float8 all-gather
      return t.tp == 2 && t.fp8 == Fp8Recipe::kTensorwise && t.fp8_all_gather;
    }));
    EXPECT_TRUE(has([](const TrainSpec& t) {  // rowwise float8 on plain TP
      return t.tp == 2 && t.fp8 == Fp8Recipe::kRowwise && t.recompute == Recompute::kSelectiveOp;
    }));
  }
  if (name == "tiny-moe-mixed") {  // the layer kinds over stages and chunks, with EP and ZeRO-3
    EXPECT_TRUE(has([](const TrainSpec& t) {
      return t.pp == 2 && t.pp_schedule == PpSchedule::kInterleaved && t.ep == 2;
    }));
    EXPECT_TRUE(has([](const TrainSpec& t) { return t.ep == 2 && t.zero == 3 && t.tp == 2; }));
    BlockGraphs g(sc->model, sc->matrix.front());
    ASSERT_NE(g.dense_layer, nullptr);
    EXPECT_EQ(g.of(BlockKind::kLayer, 0), g.dense_layer);
    EXPECT_EQ(g.of(BlockKind::kLayer, 1), g.layer);
  }
  if (name == "tiny-deepseek") {  // MLA with the q latent, a dense first layer, EP, ZeRO-3
    EXPECT_TRUE(has([](const TrainSpec& t) { return t.ep == 2 && t.zero == 3 && t.tp == 2; }));
    EXPECT_TRUE(sc->model.mla && sc->model.mla->q_lora_rank > 0 && sc->model.moe &&
                sc->model.moe->shared_ffn > 0 && !sc->model.moe->shared_gate);
  }
  if (name == "tiny-deepseek-lite") {  // MLA's direct q projection, TP without SP
    EXPECT_TRUE(has([](const TrainSpec& t) { return t.tp == 2 && !t.sp && t.pp == 2; }));
    EXPECT_TRUE(sc->model.mla && sc->model.mla->q_lora_rank == 0);
  }
  if (name == "tiny-llama" || name == "tiny-gpt") {  // 4 layers: pp 2 x 2 chunks
    EXPECT_TRUE(has([](const TrainSpec& t) {
      return t.pp_schedule == PpSchedule::kInterleaved && t.virtual_stages == 2;
    }));
  }
  double ln_v = std::log(static_cast<double>(sc->model.vocab));
  // NANOPLAN_SCENARIO_STRIDE=N runs every Nth setup of the matrix (the first, the N+1st, ...):
  // tools/test --sanitize sets it, as the sanitizers slow each run several times over; the
  // release suite runs every setup.
  size_t stride = 1;
  if (const char* e = std::getenv("NANOPLAN_SCENARIO_STRIDE"); e && std::atoi(e) > 1)
    stride = static_cast<size_t>(std::atoi(e));
  size_t index = 0, position = 0;
  for (const TrainSpec& t : sc->matrix) {
    if (position++ % stride != 0) continue;
    Schedule s = build_schedule(sc->model, t);
    RunOptions o;
    o.steps = sc->steps;
    // The tensors from the caching allocator model over the backend's memory, so that reserved
    // is compared too: `run`'s default, and expandable segments every other setup.
    o.allocator = *parse_allocator_choice(index++ % 2 ? "expandable" : "caching", "");
    auto r = run_schedule(
        s, [] { return make_cpu_backend(); }, o);
    ASSERT_TRUE(r.ok()) << r.error().message;
    RunComparison c = compare(s, *r, describe_short(t));
    ASSERT_EQ(c.ranks.size(), static_cast<size_t>(t.gpus()));
    if (sc->expect.predicted_equals_measured) {
      EXPECT_TRUE(c.all_equal) << comparison_table(c);
      for (const RankComparison& rc : c.ranks) {
        EXPECT_EQ(rc.predicted_at_peak, rc.measured_at_peak) << c.title;
        ASSERT_TRUE(rc.measured_reserved && rc.predicted_reserved) << c.title;
        EXPECT_EQ(*rc.predicted_reserved, *rc.measured_reserved) << c.title;
      }
    }
    ASSERT_EQ(c.losses.size(), static_cast<size_t>(sc->steps));
    if (sc->expect.first_loss_rel_ln_vocab > 0) {
      // The softmax spans the vocabulary the LM head holds (megatron pads it to 128 x tp).
      double ln_held = std::log(static_cast<double>(padded_vocab(sc->model, t)));
      EXPECT_NEAR(c.losses.front(), ln_held, sc->expect.first_loss_rel_ln_vocab * ln_v) << c.title;
    }
    if (sc->expect.loss_decreases) {
      EXPECT_LT(c.losses.back(), c.losses.front()) << c.title;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, Scenarios,
                         ::testing::Values("tiny-llama", "tiny-qwen", "tiny-moe", "tiny-gpt",
                                           "tiny-llama-dp", "tiny-gpt-cp", "tiny-moe-ep",
                                           "tiny-gpt-megatron", "tiny-gpt-te-fp8", "tiny-qwen3", "tiny-moe-mixed",
                                           "tiny-deepseek", "tiny-deepseek-lite",
                                           "tiny-llama-torchtitan", "tiny-llama-fsdp"),
                         testing::ParamName());

// The runner nanoplan run --scenario calls: found by name beside the catalog, each case seen as
// it completes after one start, the scenario's checks counted, and a stop said with its setup.
TEST(ScenarioRunner, FindsRunsJudgesAndStops) {
  const std::string src = NANOPLAN_SOURCE_DIR;
  EXPECT_EQ(*find_scenario("tiny-llama", src + "/models"), src + "/scenarios/tiny-llama.toml");
  EXPECT_EQ(*find_scenario("tiny-llama", src + "/models/"), src + "/scenarios/tiny-llama.toml");
  EXPECT_EQ(*find_scenario("elsewhere/x.toml", src + "/models"), "elsewhere/x.toml");
  Result<std::string> unknown = find_scenario("tiny-lama", src + "/models");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("unknown scenario 'tiny-lama' (valid: "), std::string::npos);
  EXPECT_NE(unknown.error().message.find("tiny-llama, "), std::string::npos);

  auto sc = load_scenario(src + "/scenarios/tiny-llama.toml", testing::catalog());
  ASSERT_TRUE(sc.ok()) << sc.error().message;
  sc->matrix.resize(2);
  Executor cpu = *choose_executor("cpu");
  int starts = 0;
  std::vector<std::string> seen;
  auto started = [&] { ++starts; };
  auto each = [&](const ScenarioCase& c) {
    EXPECT_EQ(starts, 1);
    EXPECT_TRUE(c.comparison.all_equal) << comparison_table(c.comparison);
    EXPECT_EQ(c.comparison.losses.size(), static_cast<size_t>(sc->steps));
    seen.push_back(describe_short(c.setup));
  };
  ScenarioResult ok = run_scenario(*sc, cpu, {}, {}, nullptr, started, each);
  EXPECT_EQ(ok.stop, ScenarioStop::kNone);
  EXPECT_EQ(ok.failed, 0);
  EXPECT_EQ(seen, (std::vector<std::string>{describe_short(sc->matrix[0]),
                                            describe_short(sc->matrix[1])}));

  Scenario judged = *sc;  // no first loss is ln(vocab) to 1e-12: both setups fail the check
  judged.expect.first_loss_rel_ln_vocab = 1e-12;
  ScenarioResult bad = run_scenario(judged, cpu, {}, {}, nullptr, [] {}, [](const ScenarioCase& c) {
    EXPECT_NE(c.why.find("first loss "), std::string::npos) << c.why;
  });
  EXPECT_EQ(bad.failed, 2);

  RunOptions tight;
  tight.enforce_budget = 4096;
  starts = 0, seen.clear();
  ScenarioResult oom = run_scenario(*sc, cpu, tight, {}, nullptr, started, each);
  EXPECT_EQ(oom.stop, ScenarioStop::kOutOfMemory);
  EXPECT_EQ(describe_short(oom.stopped_at), describe_short(sc->matrix[0]));
  EXPECT_TRUE(oom.message.starts_with("rank ")) << oom.message;
  EXPECT_EQ(starts, 1);
  EXPECT_TRUE(seen.empty());
}

}  // namespace
}  // namespace np::exec
