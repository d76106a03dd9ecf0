// The JSON documents scripts rely on: the estimate's keys and the versioned schedule.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "planner/schedule/plan_io.hpp"
#include "planner/report/report.hpp"
#include "planner/inputs/scenario.hpp"
#include "planner/schedule/simulate.hpp"
#include "planner/schedule/contract.hpp"
#include "test_util.hpp"

namespace np {
namespace {

using testing::model;

TrainSpec setup() {
  TrainSpec t;
  t.tp = 2, t.sp = true, t.pp = 2, t.microbatches = 2, t.seq_len = 256,
  t.pp_schedule = PpSchedule::k1F1B;
  return t;
}

TEST(EstimateJson, CarriesTheIssueKeys) {
  nlohmann::json j =
      estimate_to_json(estimate(model("llama-3.1-8b"), setup(), {}, {.budget = 1'000'000'000}));
  for (const char* k : {"model", "setup", "budget_bytes", "fits", "peak_bytes", "peak_rank",
                        "suggestions", "ranks"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["model"]["name"], "llama-3.1-8b");
  EXPECT_EQ(j["model"]["parameters"], 8'030'261'248);
  for (const char* k :
       {"tp", "pp", "dp", "sp", "zero", "micro_batch", "seq_len", "microbatches", "recompute"})
    EXPECT_TRUE(j["setup"].contains(k)) << k;
  EXPECT_EQ(j["budget_bytes"], 1'000'000'000);
  EXPECT_EQ(j["fits"], false);
  ASSERT_EQ(j["ranks"].size(), 2u);
  for (const auto& r : j["ranks"]) {
    for (const char* k :
         {"pp_stage", "parameter_bytes", "gradient_bytes", "optimizer_bytes", "activation_bytes",
          "transient_bytes", "overhead_bytes", "peak_bytes", "layers"})
      EXPECT_TRUE(r.contains(k)) << k;
    for (const auto& l : r["layers"])
      for (const char* k : {"index", "policy", "saved_bytes"}) EXPECT_TRUE(l.contains(k)) << k;
  }
  EXPECT_EQ(j["ranks"][0]["layers"].size() + j["ranks"][1]["layers"].size(), 32u);
}

TEST(EstimateJson, NullBudgetWithoutOne) {
  nlohmann::json j = estimate_to_json(estimate(model("llama-3.1-8b"), setup(), {}, {}));
  EXPECT_TRUE(j["budget_bytes"].is_null());
  EXPECT_EQ(j["fits"], true);
}

TEST(ScheduleJson, VersionedWithSetupAndPrograms) {
  Schedule s = build_schedule(model("llama-3.1-8b"), setup());
  nlohmann::json j = schedule_to_json(s);
  EXPECT_EQ(j["format"], "nanoplan-schedule");
  EXPECT_EQ(j["format_version"], kScheduleFormatVersion);
  EXPECT_EQ(j["setup"]["tp"], 2);
  ASSERT_EQ(j["stages"].size(), 2u);
  for (size_t st = 0; st < 2; ++st) {
    const auto& stage = j["stages"][st];
    EXPECT_EQ(stage["ranks"].size(), 2u);
    EXPECT_EQ(stage["program"].size(), s.stages[st].instrs.size());
    EXPECT_EQ(stage["tensors"].size(), s.stages[st].tensors.size());
    // Every non-static tensor is freed exactly once in the emitted program.
    std::vector<int> frees(stage["tensors"].size(), 0);
    for (const auto& i : stage["program"])
      if (i["kind"] == "free") ++frees[i["reads"][0].get<int>()];
    for (const auto& t : stage["tensors"])
      EXPECT_EQ(frees[t["id"].get<int>()], t["kind"] == "static" ? 0 : 1) << t["name"];
  }
  // SP collectives: each forward all-gather has a reduce-scatter in its backward.
  int gathers = 0, scatters_in_backward = 0;
  for (const auto& i : j["stages"][0]["program"]) {
    if (!i.contains("collective")) continue;
    gathers += i["kind"] == "forward" && i["collective"] == "all_gather";
    scatters_in_backward += i["kind"] == "backward" && i["collective"] == "reduce_scatter";
  }
  EXPECT_EQ(gathers, 2 * s.stages[0].num_layers() * 2);  // 2 per layer, 2 micro-batches
  EXPECT_EQ(scatters_in_backward, gathers);
  // The last stage sends nothing forward and ends with the optimizer step.
  EXPECT_EQ(j["stages"][1]["program"].back()["kind"], "optimizer_step");
  bool sends = false;
  for (const auto& i : j["stages"][0]["program"]) sends |= i["kind"] == "send";
  EXPECT_TRUE(sends);
}

}  // namespace
}  // namespace np

namespace np {
namespace {

// The plan file round-trips: the program read back is the program written.
TEST(PlanFile, RoundTrips) {
  TrainSpec t = setup();
  t.recompute = Recompute::kSelective;
  t.attention = AttentionImpl::kEager;
  Schedule s = build_schedule(testing::model("qwen1.5-moe-a2.7b"), t);
  Result<Schedule> back = schedule_from_json(nlohmann::json::parse(schedule_to_json(s).dump()));
  ASSERT_TRUE(back.ok()) << back.error().message;
  ASSERT_EQ(back->stages.size(), s.stages.size());
  for (size_t st = 0; st < s.stages.size(); ++st) {
    const StageProgram &a = s.stages[st], &b = back->stages[st];
    ASSERT_EQ(a.instrs.size(), b.instrs.size());
    EXPECT_EQ(a.pool, b.pool);
    for (size_t i = 0; i < a.instrs.size(); ++i) {
      EXPECT_EQ(a.instrs[i].kind, b.instrs[i].kind);
      EXPECT_EQ(a.instrs[i].op, b.instrs[i].op);
      EXPECT_EQ(a.instrs[i].mb, b.instrs[i].mb);
    }
    for (size_t k = 0; k < a.blocks.size(); ++k) {
      EXPECT_EQ(a.blocks[k].saved.saved, b.blocks[k].saved.saved);
      EXPECT_EQ(a.blocks[k].saved.bytes, b.blocks[k].saved.bytes);
      EXPECT_EQ(a.blocks[k].policy.recompute, b.blocks[k].policy.recompute);
    }
    EXPECT_FALSE(check_program(b));
    EXPECT_EQ(simulate(a).peak_bytes, simulate(b).peak_bytes);
    for (size_t id = 0; id < a.tensors.size(); ++id)
      EXPECT_EQ(a.tensor_name(id), b.tensor_name(id));
  }
  EXPECT_EQ(back->model.moe->num_experts, 60);
}

// DeepSeek's routing and its expert bias (in the parameter count the plan states) read back.
TEST(PlanFile, RoundTripsTheRouting) {
  ModelSpec m = testing::model("qwen1.5-moe-a2.7b");
  m.moe->expert_bias = true;
  m.moe->router = {.sigmoid = true, .groups = 4, .topk_groups = 2, .scaling = 2.5};
  Schedule s = build_schedule(m, setup());
  Result<Schedule> back = schedule_from_json(nlohmann::json::parse(schedule_to_json(s).dump()));
  ASSERT_TRUE(back.ok()) << back.error().message;
  const MoeSpec& e = *back->model.moe;
  EXPECT_TRUE(e.expert_bias && e.router.sigmoid && e.router.normalize);
  EXPECT_EQ(e.router.groups, 4);
  EXPECT_EQ(e.router.topk_groups, 2);
  EXPECT_EQ(e.router.scaling, 2.5);
  EXPECT_EQ(simulate(back->stages[0]).peak_bytes, simulate(s.stages[0]).peak_bytes);
}

TEST(PlanFile, RejectsOtherVersionsAndJunk) {
  nlohmann::json j = schedule_to_json(build_schedule(testing::model("llama-3.1-8b"), setup()));
  j["format_version"] = kScheduleFormatVersion + 1;
  auto r = schedule_from_json(j);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("format version " + std::to_string(kScheduleFormatVersion + 1) +
                                    " is not supported"),
            std::string::npos)
      << r.error().message;
  j["format_version"] = kScheduleFormatVersion;
  j["stages"][0]["program"][5]["op"] = "attn.nonsense";
  r = schedule_from_json(j);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("stages[0].program[5].op"), std::string::npos)
      << r.error().message;
  EXPECT_NE(r.error().message.find("\"attn.nonsense\""), std::string::npos) << r.error().message;
  EXPECT_FALSE(schedule_from_json(nlohmann::json::array()).ok());
}

// A plan edited to drop a tensor that a backward op reads is refused when it is read, with the
// block's kept set and the tensor named (check_program's own test is in test_schedule.cpp).
TEST(PlanFile, TamperedKeptSetIsCaught) {
  Schedule built = build_schedule(testing::model("llama-3.1-8b"), setup());
  nlohmann::json j = schedule_to_json(built);
  nlohmann::json& kept = j["stages"][0]["blocks"][1]["kept_tensors"];
  auto it = std::find(kept.begin(), kept.end(), "mlp.swiglu");
  ASSERT_NE(it, kept.end());
  kept.erase(it);
  auto s = schedule_from_json(j);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("stages[0].blocks[1].kept_tensors: mlp.swiglu is missing"),
            std::string::npos)
      << s.error().message;
}

// A plan file is written whole or not at all, and read back equal.
TEST(PlanFile, WrittenWholeOrNotAtAll) {
  Schedule s = build_schedule(model("llama-3.1-8b"), setup());
  std::string dir = testing::temp_path("plan_write");
  std::filesystem::create_directories(dir);
  std::string path = dir + "/plan.json";
  ASSERT_FALSE(write_plan(s, path));
  auto back = load_plan(path);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(schedule_to_json(*back), schedule_to_json(s));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  auto folder = write_plan(s, dir);
  ASSERT_TRUE(folder);
  EXPECT_NE(folder->message.find("it is a folder"), std::string::npos) << folder->message;
  std::string missing = dir + "/no/such/folder/plan.json";
  auto e = write_plan(s, missing);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("cannot write " + missing), std::string::npos) << e->message;
  EXPECT_FALSE(std::filesystem::exists(missing + ".tmp"));
  std::filesystem::remove_all(dir);
}

TEST(PlanFile, ModelMustMatchTheNamedOne) {
  ModelSpec m = model("llama-3.1-8b");
  EXPECT_FALSE(check_plan_model(m, m, "the catalog's"));
  ModelSpec other = m;
  other.ffn += 1;
  auto e = check_plan_model(other, m, "the catalog's");
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("its intermediate_size is 14337, the catalog's is 14336"),
            std::string::npos)
      << e->message;
  e = check_plan_model(m, model("llama-3.1-70b"), "the model's");
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("made for model llama-3.1-8b, not llama-3.1-70b"), std::string::npos)
      << e->message;
}

// A scenario's [expect] checks, each able to fail on its own.
TEST(ScenarioVerdict, NamesEachFailedCheck) {
  Scenario sc = testing::scenario("tiny-llama");
  sc.expect = {.predicted_equals_measured = true, .first_loss_rel_ln_vocab = 0.05,
               .loss_decreases = true};
  double ln_v = std::log(static_cast<double>(sc.model.vocab));
  EXPECT_EQ(scenario_failures(sc, sc.base, true, {ln_v, ln_v - 0.1}), "");
  EXPECT_EQ(scenario_failures(sc, sc.base, false, {ln_v, ln_v - 0.1}), "predicted != measured; ");
  EXPECT_NE(scenario_failures(sc, sc.base, true, {1.2 * ln_v, ln_v}).find("first loss"),
            std::string::npos);
  EXPECT_EQ(scenario_failures(sc, sc.base, true, {ln_v, ln_v}), "loss did not decrease; ");
  sc.expect = {.predicted_equals_measured = false, .first_loss_rel_ln_vocab = 0,
               .loss_decreases = false};
  EXPECT_EQ(scenario_failures(sc, sc.base, false, {2 * ln_v, 3 * ln_v}), "");
}

}  // namespace
}  // namespace np
