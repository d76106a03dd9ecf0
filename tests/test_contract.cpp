// The executor contract (planner/schedule/contract.hpp): one statement of TP sharding that every weight
// maps through, the event-exact comparison (a moved free or an allocation the plan did not name
// is a divergence), and plans read from files validated completely before anything runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>

#include "executor/compare.hpp"
#include "executor/cpu/cpu_backend.hpp"
#include "executor/init.hpp"
#include "executor/runner.hpp"
#include "planner/schedule/plan_io.hpp"
#include "planner/inputs/scenario.hpp"
#include "planner/schedule/plan_check.hpp"
#include "test_util.hpp"

namespace np::exec {
namespace {

using testing::scenario;

TrainSpec tp_pp(TrainSpec t, int64_t tp, int64_t pp) {
  t.tp = tp, t.pp = pp, t.sp = tp > 1;
  return t;
}

// Every weight of every block: the TP (and, for experts, EP) ranks' local elements, mapped
// through the one sharding statement (weight_shard, read by global_weight_index), cover the
// tp = ep = 1 weight exactly once, and a weight is replicated exactly when its shape does not
// shrink with tp.
TEST(Sharding, EveryWeightIsAPermutationOfTheGlobalOne) {
  int checked = 0;
  for (const char* name :
       {"tiny-llama", "tiny-gpt", "tiny-moe", "tiny-qwen", "tiny-qwen3", "tiny-moe-mixed",
        "tiny-llama-torchtitan"}) {
    Scenario sc = scenario(name);
    for (auto [tp, ep] : {std::pair{2, 1}, std::pair{4, 1}, std::pair{1, 2}, std::pair{2, 3}}) {
      TrainSpec t = tp_pp(sc.base, tp, 1), one = tp_pp(sc.base, 1, 1);
      t.ep = ep, t.dp = ep;
      if (validate_setup(sc.model, t)) continue;
      for (BlockKind kind : {BlockKind::kEmbedding, BlockKind::kLayer, BlockKind::kHead}) {
        BlockGraphs sharded(sc.model, t), global(sc.model, one);
        const BlockGraph &g = *sharded.of(kind), &g1 = *global.of(kind);
        for (const GraphOp& op : g.ops)
          for (size_t w = 0; w < op.weights.size(); ++w) {
            auto same = std::find_if(g1.ops.begin(), g1.ops.end(),
                                     [&](const GraphOp& o) { return o.name == op.name; });
            ASSERT_NE(same, g1.ops.end()) << op.name << " has weights only under tp > 1";
            int64_t local = op.weights[w].elements(), n = same->weights.at(w).elements();
            Shard shard = weight_shard(op.kind, op.weights[w].suffix);
            std::string what = std::string(name) + " tp " + std::to_string(tp) + " " + op.name +
                               "." + op.weights[w].suffix + " (" + name_of(shard) + ")";
            if (shard == Shard::kReplicated) {
              EXPECT_EQ(local, n) << what;
              for (int64_t i = 0; i < local; ++i)
                ASSERT_EQ(global_weight_index(op, w, i, {tp, 1, 1}), i) << what;
              ++checked;
              continue;
            }
            const int64_t eps = op.expert_weights ? ep : 1;
            ASSERT_EQ(local * tp * eps, n) << what << " ep " << ep;
            std::vector<int> hits(static_cast<size_t>(n), 0);
            for (int64_t e = 0; e < eps; ++e)
              for (int64_t r = 0; r < tp; ++r)
                for (int64_t i = 0; i < local; ++i) {
                  int64_t gi = global_weight_index(op, w, i, {tp, r, e});
                  ASSERT_GE(gi, 0) << what;
                  ASSERT_LT(gi, n) << what;
                  ++hits[static_cast<size_t>(gi)];
                }
            EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }))
                << what << ": some global element is held by no rank or by two";
            ++checked;
          }
      }
    }
  }
  EXPECT_GT(checked, 60);
}

// A backend that allocates one workspace its op table does not list (in the forward of
// attn.qkv, micro-batch 0, TP rank 0): the allocation is counted and reported as a divergence.
class ExtraWorkspace final : public Backend {
 public:
  ExtraWorkspace() : inner_(make_cpu_backend()) {}
  const char* name() const override { return "cpu+extra"; }
  void* allocate(int64_t bytes) override { return inner_->allocate(bytes); }
  void release(void* p) override { inner_->release(p); }
  void fill_bytes(void* p, uint8_t v, int64_t n) override { inner_->fill_bytes(p, v, n); }
  void copy_to_host(void* dst, const Tensor& src) override { inner_->copy_to_host(dst, src); }
  void copy_from_host(const Tensor& dst, const void* src) override {
    inner_->copy_from_host(dst, src);
  }
  void fill(const Tensor& t, float v) override { inner_->fill(t, v); }
  void copy_elements(const Tensor& d, int64_t doff, const Tensor& s, int64_t soff,
                     int64_t n) override {
    inner_->copy_elements(d, doff, s, soff, n);
  }
  void optimizer_update(const OptimizerUpdate& u) override { inner_->optimizer_update(u); }
  double sum(const Tensor& t) override { return inner_->sum(t); }
  std::vector<Tensor> forward(const OpContext& ctx, std::span<const Tensor> in,
                              std::span<const Tensor> w) override {
    std::vector<Tensor> out = inner_->forward(ctx, in, w);
    if (ctx.op->name == "attn.qkv" && ctx.mb == 0 && ctx.tp_rank == 0 && ctx.layer == 0)
      out.push_back(ctx.alloc(TensorType{{64}, Dtype::kFp32}, AllocRole::kWorkspace));
    return out;
  }
  void backward(const OpContext& ctx, const BackwardArgs& a) override { inner_->backward(ctx, a); }

 private:
  std::unique_ptr<Backend> inner_;
};

RunComparison run_and_compare(const Schedule& s, const BackendFactory& f) {
  auto r = run_schedule(s, f, RunOptions{});
  if (!r) throw std::runtime_error(r.error().message);
  return compare(s, *r, "test");
}

TEST(EventExact, EveryEventOfEveryRankMatchesTheSimulation) {
  Scenario sc = scenario("tiny-llama");
  for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    TrainSpec t = tp_pp(sc.base, 2, 2);
    t.recompute = rc;
    RunComparison c = run_and_compare(build_schedule(sc.model, t), [] { return make_cpu_backend(); });
    EXPECT_TRUE(c.all_equal) << comparison_table(c);
    for (const RankComparison& r : c.ranks) {
      EXPECT_TRUE(r.equal()) << "rank " << r.rank;
      EXPECT_GT(r.events, 100u) << "rank " << r.rank;
    }
  }
}

TEST(EventExact, AnAllocationThePlanDidNotNameIsADivergence) {
  Scenario sc = scenario("tiny-llama");
  Schedule s = build_schedule(sc.model, tp_pp(sc.base, 2, 1));
  RunComparison c = run_and_compare(s, [] { return std::make_unique<ExtraWorkspace>(); });
  EXPECT_FALSE(c.all_equal);
  const RankComparison& r0 = c.ranks.at(0);
  ASSERT_EQ(r0.unplanned.size(), 1u);
  EXPECT_NE(r0.unplanned[0].find("L0/mb0 attn.qkv"), std::string::npos) << r0.unplanned[0];
  ASSERT_TRUE(r0.divergence);
  EXPECT_NE(r0.divergence->measured.find("unplanned"), std::string::npos)
      << r0.divergence->measured;
  EXPECT_NE(r0.divergence->measured.find("256 B"), std::string::npos) << r0.divergence->measured;
  EXPECT_TRUE(c.ranks.at(1).equal()) << "rank 1 allocated nothing extra";
  EXPECT_NE(comparison_table(c).find("first divergence"), std::string::npos);
}

// Moving one free later leaves the peak unchanged (the tensor is small), but the allocation
// timeline differs at that instruction: a divergence, named.
TEST(EventExact, AFreeMovedLaterIsADivergence) {
  Scenario sc = scenario("tiny-llama");
  Schedule s = build_schedule(sc.model, tp_pp(sc.base, 2, 1));
  StageProgram& p = s.stages[0];
  auto it = std::find_if(p.instrs.begin(), p.instrs.end(),
                         [](const Instr& in) { return in.kind == InstrKind::kFree; });
  ASSERT_NE(it, p.instrs.end());
  size_t at = static_cast<size_t>(it - p.instrs.begin());
  std::rotate(it, it + 1, it + 3);  // two instructions later
  RunComparison c = run_and_compare(s, [] { return make_cpu_backend(); });
  EXPECT_FALSE(c.all_equal);
  for (const RankComparison& r : c.ranks) {
    ASSERT_TRUE(r.divergence) << "rank " << r.rank;
    EXPECT_GE(r.divergence->instr, static_cast<int32_t>(at) - 1);
    EXPECT_LE(r.divergence->instr, static_cast<int32_t>(at) + 2);
    EXPECT_EQ(r.divergence->step, 0);
    EXPECT_FALSE(r.divergence->live.empty());
  }
}

// --- Plans read from files ------------------------------------------------------------------

nlohmann::json plan_json(const TrainSpec& t) {
  return schedule_to_json(build_schedule(scenario("tiny-llama").model, t));
}

std::string load_error(const nlohmann::json& j) {
  auto r = schedule_from_json(j);
  return r ? std::string("(loaded)") : r.error().message;
}

int tensor_index(const nlohmann::json& stage, const std::string& suffix) {
  const auto& ts = stage["tensors"];
  for (size_t i = 0; i < ts.size(); ++i)
    if (ts[i]["kind"] == "value" && ts[i]["name"].get<std::string>().ends_with(suffix))
      return static_cast<int>(i);
  return -1;
}

#define EXPECT_HAS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing \"" << (part) << "\" in: " << (text)

TEST(PlanFile, AnOffPeakTensorEightBytesLargeIsRefused) {
  TrainSpec t = tp_pp(scenario("tiny-llama").base, 2, 2);
  nlohmann::json j = plan_json(t);
  ASSERT_EQ(load_error(j), "(loaded)");
  int k = tensor_index(j["stages"][0], "L0/mb0/attn.rope");
  ASSERT_GE(k, 0);
  j["stages"][0]["tensors"][k]["bytes"] = j["stages"][0]["tensors"][k]["bytes"].get<int64_t>() + 8;
  std::string e = load_error(j);
  EXPECT_HAS(e, "stages[0].tensors[" + std::to_string(k) + "].bytes");
  EXPECT_HAS(e, "L0/mb0/attn.rope");
  EXPECT_HAS(e, "gives");
}

// A static's name is the file's own text: a wrong one is quoted, escaped, in the one-line error
// (the plan fuzzer found raw bytes of it in the message).
TEST(PlanFile, AWrongStaticNameIsQuotedAsInput) {
  nlohmann::json j = plan_json(tp_pp(scenario("tiny-llama").base, 1, 1));
  auto& ts = j["stages"][0]["tensors"];
  size_t k = 0;
  while (k < ts.size() && ts[k]["kind"] != "static") ++k;
  ASSERT_LT(k, ts.size());
  ts[k]["name"] = std::string("weights\xc9\x88\nline");
  std::string e = load_error(j);
  EXPECT_HAS(e, "'weights\\xc9\\x88\\x0aline' (static)");
  EXPECT_EQ(std::count_if(e.begin(), e.end(),
                          [](char c) { return static_cast<unsigned char>(c) < 0x20 ||
                                              static_cast<unsigned char>(c) >= 0x7f; }),
            0)
      << e;
}

TEST(PlanFile, ByteCountsAreExactIntegers) {
  nlohmann::json base = plan_json(tp_pp(scenario("tiny-llama").base, 2, 1));
  for (auto [value, want] : std::vector<std::pair<nlohmann::json, std::string>>{
           {-5, "expected an integer in [0, 9223372036854775807], got -5"},
           {0, "gives"},
           {INT64_MAX, "9,223,372,036,854,775,807 for"},  // once wrapped the simulation's sums
           {576.5, "expected an integer, got 576.5"},
           {1.8446744073709552e19, "expected an integer"},
           {"576", "expected an integer, got \"576\""},
           {nullptr, "expected an integer"}}) {
    nlohmann::json j = base;
    j["stages"][0]["tensors"][3]["bytes"] = value;
    std::string e = load_error(j);
    EXPECT_HAS(e, "stages[0].tensors[3].bytes");
    EXPECT_HAS(e, want);
  }
}

TEST(PlanFile, ASetupInconsistentWithItsTensorsIsRefused) {
  TrainSpec t = tp_pp(scenario("tiny-llama").base, 2, 2);
  nlohmann::json base = plan_json(t);
  struct Edit {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    std::string want;
  };
  std::vector<Edit> edits = {
      {"tp", [](nlohmann::json& j) { j["setup"]["tp"] = 1, j["setup"]["sp"] = false; },
       "stages[0].blocks[1]"},
      {"tp text", [](nlohmann::json& j) { j["setup"]["tp"] = "two"; },
       "setup.tp: expected an integer, got \"two\""},
      {"micro_batch", [](nlohmann::json& j) { j["setup"]["micro_batch"] = 1000000; }, ".bytes"},
      {"layers", [](nlohmann::json& j) { j["model"]["num_layers"] = 9; }, "model.parameters"},
      {"ranks", [](nlohmann::json& j) { j["stages"][1]["ranks"] = {2, 4}; },
       "stages[1].ranks[1]"},
      {"stage index", [](nlohmann::json& j) { j["stages"][1]["pp_stage"] = 0; },
       "stages[1].pp_stage"},
      {"micro-batch index",
       [](nlohmann::json& j) {
         for (auto& in : j["stages"][0]["program"])
           if (in.contains("mb") && in["mb"] == 1) {
             in["mb"] = 5;
             break;
           }
       },
       "but setup.microbatches is"},
      {"stages", [](nlohmann::json& j) { j["stages"].erase(1); }, "setup.pp is 2"},
      {"dtype", [](nlohmann::json& j) { j["setup"]["grad_accum_dtype"] = "fp16"; },
       "setup.grad_accum_dtype"},
  };
  for (const Edit& e : edits) {
    nlohmann::json j = base;
    e.edit(j);
    std::string err = load_error(j);
    EXPECT_HAS(err, e.want) << " (edit: " << e.what << ")";
  }
  // The layer count with a matching parameter count: the blocks no longer fit the stages.
  nlohmann::json j = base;
  ModelSpec deeper = scenario("tiny-llama").model;
  deeper.layers += 2;
  j["model"]["num_layers"] = deeper.layers;
  j["model"]["parameters"] = count_parameters(deeper);
  EXPECT_HAS(load_error(j), "stages[0].blocks");
}

TEST(PlanFile, SizesAreCheckedWithoutOverflow) {
  ModelSpec m = scenario("tiny-llama").model;
  TrainSpec t = scenario("tiny-llama").base;
  EXPECT_FALSE(check_sizes(m, t));
  t.micro_batch = int64_t{1} << 40;
  t.seq_len = int64_t{1} << 30;
  ASSERT_TRUE(check_sizes(m, t));
  EXPECT_HAS(check_sizes(m, t)->message, "overflows 64 bits");
  t = scenario("tiny-llama").base;
  m.vocab = int64_t{1} << 40;
  m.hidden = int64_t{1} << 30;
  EXPECT_TRUE(check_sizes(m, t));
  TensorType huge{{int64_t{1} << 40, int64_t{1} << 30}, Dtype::kFp32};
  EXPECT_EQ(checked_bytes(huge), -1);
  EXPECT_EQ(checked_bytes(TensorType{{3, 5}, Dtype::kFp32}), 60);
}

}  // namespace
}  // namespace np::exec
