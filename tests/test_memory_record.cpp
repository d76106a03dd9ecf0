// A run's memory record: the frameworks' lines read (tests/data/records/, each fixture citing the
// source of its form), the largest figures per rank with the line they came from, ranks mapped to
// pipeline stage and tp/dp/cp coordinates by the setup, and bad input refused in one line.
#include <gtest/gtest.h>

#include "planner/inputs/memory_record.hpp"
#include "planner/inputs/read_file.hpp"
#include "planner/report/record_compare.hpp"
#include "test_util.hpp"

namespace np {
namespace {

constexpr int64_t MiB = 1 << 20;

MemoryRecord fixture(const std::string& name) {
  std::string path = std::string(NANOPLAN_SOURCE_DIR) + "/tests/data/records/" + name;
  Result<std::string> text = read_text_file(path);
  EXPECT_TRUE(text.ok());
  Result<MemoryRecord> r = read_memory_record(name, *text);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return *r;
}

// Megatron-LM: the ranks that printed (dp rank 0 of each (pp, tp)), the largest max allocated
// and max reserved over the iterations (MB = 2^20 bytes, two decimals or Python's full repr),
// the line of the largest, the device total where printed, and Megatron's own estimate.
TEST(MemoryRecord, MegatronReportMemory) {
  MemoryRecord r = fixture("megatron_report_memory.log");
  EXPECT_EQ(r.format, RecordFormat::kMegatron);
  ASSERT_EQ(r.ranks.size(), 4u);
  EXPECT_EQ(r.ranks[0].rank, 0);
  EXPECT_EQ(*r.ranks[0].max_allocated, std::llround(30512.00 * MiB));  // iteration 2's
  EXPECT_EQ(*r.ranks[0].max_reserved, 32768 * MiB);
  EXPECT_EQ(r.ranks[0].context, "(after 2 iterations)");
  EXPECT_EQ(r.ranks[0].line, 15);
  EXPECT_EQ(r.ranks[1].rank, 1);
  EXPECT_EQ(*r.ranks[1].max_allocated, std::llround(30001.5 * MiB));
  EXPECT_EQ(r.ranks[1].line, 11);  // the second line repeats the figure: the first kept
  EXPECT_EQ(r.ranks[3].rank, 5);   // behind a logger's "[utils:334] -" prefix
  EXPECT_EQ(*r.ranks[3].device_used, 28000 * MiB);
  EXPECT_FALSE(r.ranks[0].device_used);
  ASSERT_TRUE(r.theoretical);
  EXPECT_EQ(r.theoretical->weight_and_optimizer, 30720 * MiB);
  EXPECT_EQ(r.theoretical->total, std::llround(34816.50 * MiB));
}

// nanotron: rank 0's coordinates from the logger's prefix (ANSI colours stripped), the largest
// peak over the lines (its peaks are reset after each), and what the line reported on.
TEST(MemoryRecord, NanotronLogMemory) {
  MemoryRecord r = fixture("nanotron_log_memory.log");
  EXPECT_EQ(r.format, RecordFormat::kNanotron);
  ASSERT_EQ(r.ranks.size(), 1u);
  const RecordRank& k = r.ranks[0];
  EXPECT_EQ(k.rank, -1);
  EXPECT_EQ(k.pp, 0);
  EXPECT_EQ(k.dp, 0);
  EXPECT_EQ(k.tp, 0);
  EXPECT_FALSE(k.cp);  // a group of one is not printed
  EXPECT_EQ(*k.max_allocated, std::llround(40960.50 * MiB));
  EXPECT_EQ(*k.max_reserved, 43010 * MiB);
  EXPECT_EQ(k.context, "After train_batch_iter");
  EXPECT_EQ(k.line, 9);
}

// torchtitan: max reserved per rank (the "[rankN]:" prefix torchrun adds), GiB.
TEST(MemoryRecord, TorchtitanMetrics) {
  MemoryRecord r = fixture("torchtitan_metrics.log");
  EXPECT_EQ(r.format, RecordFormat::kTorchtitan);
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_EQ(*r.ranks[0].max_reserved, std::llround(31.50 * (1LL << 30)));
  EXPECT_EQ(r.ranks[0].context, "step 2");
  EXPECT_FALSE(r.ranks[0].max_allocated);
  EXPECT_EQ(r.ranks[1].rank, 1);
  EXPECT_EQ(*r.ranks[1].max_reserved, std::llround(30.25 * (1LL << 30)));
}

TEST(MemoryRecord, BadInputIsOneLineNamingTheFile) {
  Result<MemoryRecord> none = read_memory_record("run.log", "iteration 1 | lm loss: 1.0\n");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("run.log: no memory lines"), std::string::npos);
  EXPECT_NE(none.error().message.find("report_memory"), std::string::npos);
  Result<MemoryRecord> nan = read_memory_record(
      "run.log",
      "[Rank 0] (after 1 iterations) memory (MB) | allocated: 1 | max allocated: nan | "
      "reserved: 2 | max reserved: 2\n");
  ASSERT_FALSE(nan.ok());
  EXPECT_NE(nan.error().message.find("run.log:1:"), std::string::npos);
  EXPECT_FALSE(read_memory_record("x", "").ok());
}

// Ranks to coordinates: Megatron's order (tp fastest, then cp, dp, pp), nanotron's coordinates
// to its global rank ((pp, dp, cp, tp), tp fastest), each against its stage's prediction; a rank
// or a coordinate beyond the setup is bad input.
TEST(MemoryRecord, RanksMapToTheirStages) {
  TrainSpec t;
  t.tp = 2, t.pp = 2, t.dp = 2, t.sp = true, t.pp_schedule = PpSchedule::k1F1B;
  t.microbatches = 2, t.seq_len = 2048;
  Estimate e = estimate(testing::model("llama-3.1-8b"), t, {}, {});
  MemoryRecord meg = fixture("megatron_report_memory.log");
  MemoryRecord nan = fixture("nanotron_log_memory.log");
  Result<RecordComparison> c = compare_records({meg, nan}, e);
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_EQ(c->rows.size(), 5u);
  const RecordRow& r5 = c->rows[3];
  EXPECT_EQ(r5.rank, 5);
  EXPECT_EQ(r5.pp, 1);
  EXPECT_EQ(r5.dp, 0);
  EXPECT_EQ(r5.tp, 1);
  EXPECT_EQ(r5.predicted_allocated, e.stages[1].allocated_peak);
  EXPECT_EQ(r5.predicted_reserved, e.stages[1].reserved_peak);
  EXPECT_FALSE(r5.theoretical);  // Megatron's estimate is rank 0's stage
  EXPECT_TRUE(c->rows[0].theoretical);
  EXPECT_DOUBLE_EQ(*r5.allocated_error(),
                   100.0 * static_cast<double>(e.stages[1].allocated_peak - *r5.measured_allocated) /
                       static_cast<double>(*r5.measured_allocated));
  EXPECT_EQ(c->rows[4].rank, 0);  // nanotron's rank 0
  EXPECT_EQ(c->formats.size(), 2u);
  // A nanotron rank on stage 1, replica 1, tp rank 1: global ((1 x 2 + 1) x 1 + 0) x 2 + 1 = 7.
  Result<MemoryRecord> other = read_memory_record(
      "n.log",
      "12/03 10:00:01 [INFO|DP=1|PP=1|TP=1|host]:  Memory usage: 1.00MiB. Peak allocated 2.00MiB. "
      "Peak reserved: 4.00MiB\n");
  ASSERT_TRUE(other.ok());
  Result<RecordComparison> o = compare_records({*other}, e);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->rows[0].rank, 7);
  EXPECT_EQ(o->rows[0].pp, 1);
  TrainSpec small = t;
  small.dp = 1;
  Estimate e4 = estimate(testing::model("llama-3.1-8b"), small, {}, {});
  Result<RecordComparison> beyond = compare_records({meg}, e4);
  ASSERT_FALSE(beyond.ok());
  EXPECT_NE(beyond.error().message.find("rank 4 is beyond the setup's 4 GPUs"), std::string::npos);
  Result<RecordComparison> coord = compare_records({*other}, e4);
  ASSERT_FALSE(coord.ok());
  EXPECT_NE(coord.error().message.find("DP=1 is beyond"), std::string::npos);
}

}  // namespace
}  // namespace np
