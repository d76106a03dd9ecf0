// The JSON documents scripts rely on: the estimate's keys and the versioned schedule.
#include <gtest/gtest.h>

#include "planner/report.hpp"
#include "test_util.hpp"

namespace np {
namespace {

using testing::model;

TrainSpec setup() {
  TrainSpec t;
  t.tp = 2, t.sp = true, t.pp = 2, t.microbatches = 2, t.seq_len = 256, t.pp_schedule = PpSchedule::k1F1B;
  return t;
}

TEST(EstimateJson, CarriesTheIssueKeys) {
  nlohmann::json j = estimate_to_json(estimate(model("llama-3.1-8b"), setup(), {}, {.budget = 1'000'000'000}));
  for (const char* k : {"model", "setup", "budget_bytes", "fits", "peak_bytes", "peak_rank", "suggestions", "ranks"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["model"]["name"], "llama-3.1-8b");
  EXPECT_EQ(j["model"]["parameters"], 8'030'261'248);
  for (const char* k : {"tp", "pp", "dp", "sp", "zero", "micro_batch", "seq_len", "microbatches", "recompute"})
    EXPECT_TRUE(j["setup"].contains(k)) << k;
  EXPECT_EQ(j["budget_bytes"], 1'000'000'000);
  EXPECT_EQ(j["fits"], false);
  ASSERT_EQ(j["ranks"].size(), 2u);
  for (const auto& r : j["ranks"]) {
    for (const char* k : {"pp_stage", "parameter_bytes", "gradient_bytes", "optimizer_bytes", "activation_bytes",
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
