// Validation of the training setup against the model: nanotron's checks (its ParallelismArgs and
// model config validation, github.com/huggingface/nanotron) and the ones a user expects. Each bad
// setup gets one message naming the problem and the valid choices.
#include <gtest/gtest.h>

#include <cmath>

#include "planner/inputs/spec.hpp"
#include "test_util.hpp"

namespace np {
namespace {

using testing::model;

TrainSpec tp8() {
  TrainSpec t;
  t.tp = 8;
  t.sp = true;
  return t;
}

std::string error_of(const ModelSpec& m, const TrainSpec& t) {
  auto e = validate_setup(m, t);
  EXPECT_TRUE(e.has_value()) << "setup was accepted";
  return e ? e->message : "";
}

TEST(Validate, AcceptsTheMainExample) {
  EXPECT_FALSE(validate_setup(model("llama-70b"), tp8()));
}

TEST(Validate, TpMustDivideHeads) {
  TrainSpec t = tp8();
  t.tp = 3;  // 64 heads, 8 kv heads: 3 divides neither
  t.sp = false;
  EXPECT_NE(error_of(model("llama-70b"), t).find("does not divide heads 64"), std::string::npos);
}

TEST(Validate, KvHeadsAtLeastTp) {
  TrainSpec t = tp8();
  t.tp = 16;  // 8 kv heads < 16 (nanotron: kv_heads >= tp)
  EXPECT_NE(error_of(model("llama-70b"), t).find("exceeds the 8 kv heads"), std::string::npos);
}

TEST(Validate, TpMustDivideKvHeadsFfnAndVocab) {
  ModelSpec m = model("llama-2-7b");  // 32 heads, 32 kv heads, ffn 11008, vocab 32000
  TrainSpec t;
  t.tp = 16;  // 11008 = 16 * 688 fine; make the others fail one at a time
  m.kv_heads = 24;
  m.heads = 48;
  EXPECT_NE(error_of(m, t).find("kv heads 24"), std::string::npos);
  m = model("llama-2-7b");
  m.ffn = 11000;  // 11000 / 16 = 687.5
  EXPECT_NE(error_of(m, t).find("FFN size 11000"), std::string::npos);
  m = model("llama-2-7b");
  m.vocab = 32001;
  EXPECT_NE(error_of(m, t).find("vocab size 32001"), std::string::npos);
}

TEST(Validate, PpAtMostLayers) {
  TrainSpec t = tp8();
  t.pp = 81;
  t.microbatches = 81;
  EXPECT_NE(error_of(model("llama-70b"), t).find("exceeds the 80 layers"), std::string::npos);
}

TEST(Validate, StageLayers) {
  ModelSpec m = model("llama-70b");
  TrainSpec t = tp8();
  t.pp = 4;
  t.stage_layers = {20, 20, 20, 20};
  EXPECT_FALSE(validate_setup(m, t));
  t.stage_layers = {23, 19, 19, 19};
  EXPECT_FALSE(validate_setup(m, t));
  struct Case {
    std::vector<int64_t> counts;
    std::vector<const char*> says;
  };
  for (const Case& c : {Case{{40, 20, 20}, {"--partition", "3 stages", "--pp 4"}},
                        Case{{21, 20, 20, 20}, {"--partition", "81 layers", "80"}},
                        Case{{40, 40, 0, 0}, {"--partition", "0 layers", "at least 1"}}}) {
    t.stage_layers = c.counts;
    std::string e = error_of(m, t);
    for (const char* s : c.says) EXPECT_NE(e.find(s), std::string::npos) << e;
  }
}

TEST(Validate, SeqLenDivisibleUnderSp) {
  TrainSpec t = tp8();
  t.seq_len = 4097;
  EXPECT_NE(error_of(model("llama-70b"), t).find("not divisible by --tp 8"), std::string::npos);
  t.sp = false;  // without SP the sequence is not sharded
  EXPECT_FALSE(validate_setup(model("llama-70b"), t));
}

TEST(Validate, OneFOneBNeedsEnoughMicrobatches) {
  TrainSpec t = tp8();
  t.pp = 4;
  t.pp_schedule = PpSchedule::k1F1B;
  t.microbatches = 2;  // nanotron: M >= pp - 1 = 3
  EXPECT_NE(error_of(model("llama-70b"), t).find("fewer than pp - 1 = 3"), std::string::npos);
  t.microbatches = 3;
  EXPECT_FALSE(validate_setup(model("llama-70b"), t));
  t.pp_schedule = PpSchedule::kAfab;  // AFAB has no such requirement
  t.microbatches = 1;
  EXPECT_FALSE(validate_setup(model("llama-70b"), t));
}

TEST(Validate, PositiveSizes) {
  for (int64_t TrainSpec::*field : {&TrainSpec::micro_batch, &TrainSpec::seq_len, &TrainSpec::dp,
                                    &TrainSpec::microbatches, &TrainSpec::pp}) {
    for (int64_t bad : {0, -1}) {
      TrainSpec t = tp8();
      t.*field = bad;
      EXPECT_NE(error_of(model("llama-70b"), t).find("must be a positive integer"),
                std::string::npos);
    }
  }
  TrainSpec t = tp8();
  t.zero = 4;
  EXPECT_NE(error_of(model("llama-70b"), t).find("valid: 0, 1, 2, 3"), std::string::npos);
}

TEST(Validate, ConflictingFlags) {
  TrainSpec t;
  t.sp = true;  // tp = 1
  EXPECT_NE(error_of(model("llama-70b"), t).find("--sp on needs --tp > 1"), std::string::npos);
  t = tp8();
  t.zero = 2;
  t.pp = 2;
  t.microbatches = 2;
  EXPECT_NE(error_of(model("llama-70b"), t).find("conflicts with --pp 2"), std::string::npos);
  t = tp8();
  t.ep = 2;
  t.dp = 2;
  EXPECT_NE(error_of(model("llama-70b"), t).find("needs an MoE model"), std::string::npos);
  t = tp8();
  t.zero = 1;
  t.optimizer = Optimizer::kNone;
  EXPECT_NE(error_of(model("llama-70b"), t).find("conflicts with --optimizer none"),
            std::string::npos);
}

TEST(Validate, ExpertParallelism) {
  ModelSpec m = model("mixtral-8x7b");
  TrainSpec t;
  t.ep = 3;
  t.dp = 3;
  EXPECT_NE(error_of(m, t).find("does not divide the 8 experts"), std::string::npos);
  t.ep = 4;
  t.dp = 2;
  EXPECT_NE(error_of(m, t).find("does not divide --dp 2"), std::string::npos);
  t.dp = 8;
  EXPECT_FALSE(validate_setup(m, t));
}

TEST(Validate, CapacityFactor) {
  ModelSpec m = model("mixtral-8x7b");
  TrainSpec t;
  for (double bad : {-1.0, 65.0, std::nan("")}) {
    t.moe_capacity_factor = bad;
    EXPECT_NE(error_of(m, t).find("--moe-capacity-factor"), std::string::npos) << bad;
    EXPECT_NE(error_of(m, t).find("valid: 0 for dropless routing"), std::string::npos) << bad;
  }
  t.moe_capacity_factor = 1.25;
  EXPECT_FALSE(validate_setup(m, t));
  EXPECT_NE(error_of(model("llama-2-7b"), t).find("needs an MoE model"), std::string::npos);
}

TEST(ParseEnum, ListsValidChoices) {
  auto r = parse_enum<Recompute>("--recompute", "sometimes");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message,
            "invalid --recompute 'sometimes' (valid: none, selective, selective-op, full, auto)");
  EXPECT_EQ(*parse_enum<PpSchedule>("--pp-schedule", "1f1b"), PpSchedule::k1F1B);
  EXPECT_EQ(*parse_enum<Dtype>("--grad-accum-dtype", "bf16"), Dtype::kBf16);
  EXPECT_FALSE(parse_enum<Dtype>("--grad-accum-dtype", "u8").ok());  // not a gradient dtype
}

TEST(ParsePartition, CountsOrTheValidForms) {
  auto r = parse_partition("21,20,20,19");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, (std::vector<int64_t>{21, 20, 20, 19}));
  EXPECT_EQ(*parse_partition("7"), (std::vector<int64_t>{7}));
  for (const char* bad : {"", ",", "1,", ",1", "1,,2", "a", "-1,2", "1.5", "1 ,2", "+3",
                          "1234567890", "99999999999999999999"}) {
    auto e = parse_partition(bad);
    ASSERT_FALSE(e.ok()) << "'" << bad << "'";
    EXPECT_EQ(e.error().message, "invalid --partition '" + std::string(bad) +
                                     "' (valid: balanced, auto, or layer counts such as "
                                     "21,20,20,19)");
  }
}

TEST(ValidateModel, RejectsInconsistentModels) {
  ModelSpec m = model("llama-70b");
  m.kv_heads = 7;
  ASSERT_TRUE(validate_model(m));
  EXPECT_NE(validate_model(m)->message.find("not a multiple of num_kv_heads 7"), std::string::npos);
  m = model("llama-70b");
  m.hidden = 0;
  EXPECT_NE(validate_model(m)->message.find("hidden_size must be a positive integer"),
            std::string::npos);
  // Group-limited routing: top_k 8 over 3 of 8 groups is Megatron's (each group scored by its
  // best 8 / 3 = 2), more groups than top_k is not.
  m = model("deepseek-v3");
  m.moe->router.topk_groups = 3;
  EXPECT_FALSE(validate_model(m));
  m.moe->top_k = 2;
  ASSERT_TRUE(validate_model(m));
  EXPECT_NE(validate_model(m)->message.find("at most top_k 2"), std::string::npos);
}

}  // namespace
}  // namespace np
