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

// The setup the fixtures stand for: llama-3.1-8b --tp 2 --pp 2 --dp 2 --microbatches 2
// --pp-schedule 1f1b --seq-len 2048.
TrainSpec fixture_setup() {
  TrainSpec t;
  t.tp = 2, t.pp = 2, t.dp = 2, t.sp = true, t.pp_schedule = PpSchedule::k1F1B;
  t.microbatches = 2, t.seq_len = 2048;
  return t;
}

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
  TrainSpec t = fixture_setup();
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

// nanotron's benchmark CSV (written by tests/data/records/make_records.py with Python's csv
// module): one row per run, rank 0's peaks in GiB, the run's degrees; a quoted name keeps its
// comma; job "N/A" is left out of the context.
TEST(MemoryRecord, NanotronBenchmarkCsv) {
  MemoryRecord r = fixture("nanotron_benchmark.csv");
  EXPECT_EQ(r.format, RecordFormat::kNanotronCsv);
  ASSERT_EQ(r.ranks.size(), 3u);
  const RecordRank& k = r.ranks[0];
  EXPECT_EQ(k.rank, 0);
  EXPECT_EQ(k.line, 2);
  EXPECT_EQ(*k.max_allocated, std::llround(42.87 * (1LL << 30)));
  EXPECT_EQ(*k.max_reserved, std::llround(45.10 * (1LL << 30)));
  ASSERT_TRUE(k.run);
  EXPECT_EQ(k.run->dp, 2);
  EXPECT_EQ(k.run->pp, 2);
  EXPECT_EQ(k.run->tp, 2);
  EXPECT_EQ(k.run->cp, 1);
  EXPECT_EQ(k.context, "run llama8b, tp2 pp2 dp2 (job 14001)");
  EXPECT_EQ(r.ranks[2].context, "run llama8b dp8");
  EXPECT_EQ(r.ranks[1].run->tp, 8);

  const std::string head = "Mem Alloc (GB),Mem Res (GB),dp,pp,tp\n";
  auto refused = [&](const std::string& text, const std::string& what) {
    Result<MemoryRecord> bad = read_memory_record("b.csv", text);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_NE(bad.error().message.find(what), std::string::npos) << bad.error().message;
    EXPECT_EQ(bad.error().message.find('\n'), std::string::npos);
  };
  refused(head + "1.0,2.0,1,1\n", "b.csv:2: a row of 4 fields under a header of 5");
  refused(head + "1.0,2.0,1,1,\"8\n", "b.csv:2: a quoted field left open");
  refused(head + "x,2.0,1,1,1\n", "must be numbers of GiB");
  refused(head + "1.0,2.0,0,1,1\n", "\"dp\" is '0', not a parallel degree");
  refused("Mem Alloc (GB),Mem Res (GB),pp,tp\n1,2,1,1\n", "no \"dp\" column");
  refused(head, "a benchmark CSV with no row of figures");
  // Without the cp column (older nanotron) the run had none.
  Result<MemoryRecord> old = read_memory_record("o.csv", head + "1.50,2.00,8,1,1\n");
  ASSERT_TRUE(old.ok()) << old.error().message;
  EXPECT_EQ(old->ranks[0].run->cp, 1);
  EXPECT_EQ(old->ranks[0].run->dp, 8);
}

// compare keeps the CSV rows that ran the setup (rank 0: stage 0), and refuses a CSV none of
// whose rows did, listing what they ran.
TEST(MemoryRecord, TheCsvRowsOfTheSetupAreCompared) {
  TrainSpec t = fixture_setup();
  Estimate e = estimate(testing::model("llama-3.1-8b"), t, {}, {});
  MemoryRecord csv = fixture("nanotron_benchmark.csv");
  Result<RecordComparison> c = compare_records({csv}, e);
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_EQ(c->rows.size(), 1u);
  EXPECT_EQ(c->rows[0].line, 2);
  EXPECT_EQ(c->rows[0].pp, 0);
  EXPECT_EQ(c->rows[0].predicted_allocated, e.stages[0].allocated_peak);
  TrainSpec other = t;
  other.tp = 4, other.dp = 1;
  Estimate e4 = estimate(testing::model("llama-3.1-8b"), other, {}, {});
  Result<RecordComparison> none = compare_records({csv}, e4);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("nanotron_benchmark.csv: no row ran the setup's dp 1 pp 2 "
                                      "tp 4 cp 1 (its rows: line 2: dp 2 pp 2 tp 2 cp 1; line 3: "
                                      "dp 1 pp 1 tp 8 cp 1"),
            std::string::npos)
      << none.error().message;
}

// A snapshot (tests/data/records/000000_step_1.pickle, rank 0) beside the estimate's live set
// at its peak: sizes matched, and the counts of each side add up to what each holds.
TEST(MemoryRecord, ASnapshotsLiveBlocksBesideThePredictedLiveSet) {
  TrainSpec t = fixture_setup();
  EstimateOptions o;
  o.explain_peak = true;
  Estimate e = estimate(testing::model("llama-3.1-8b"), t, {}, o);
  MemoryRecord snap = fixture("000000_step_1.pickle");
  EXPECT_EQ(snap.format, RecordFormat::kSnapshot);
  ASSERT_EQ(snap.ranks.size(), 1u);
  int64_t blocks = 0;
  for (int64_t b : snap.ranks[0].live_blocks) blocks += b;
  EXPECT_EQ(blocks, *snap.ranks[0].max_allocated);  // the peak is the blocks then live
  Result<RecordComparison> c = compare_records({snap}, e);
  ASSERT_TRUE(c.ok()) << c.error().message;
  const RecordRow& r = c->rows[0];
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.predicted_peak_at, e.stages[0].peak_at);
  int64_t measured = 0, predicted = 0, tensors = 0;
  for (const LiveSize& l : r.live) {
    measured += l.measured * l.bytes;
    predicted += l.predicted;
    tensors += static_cast<int64_t>(l.tensors.size());
    if (l.bytes == 32 * MiB) {  // cuBLAS's workspaces: one in the fixture, two predicted
      EXPECT_EQ(l.measured, 1);
      EXPECT_EQ(l.predicted, 2);
    }
  }
  EXPECT_EQ(measured, blocks);
  EXPECT_EQ(predicted, tensors);
  size_t kept = 0;  // the live tensors and the allocator-held lines' blocks, each counted once
  for (const OverheadLine& l : e.stages[0].overheads) {
    if (l.allocator) kept += allocations_of(l).size();
    int64_t sum = 0;  // a line of several allocations is their sum
    for (int64_t b : allocations_of(l)) sum += b;
    EXPECT_EQ(sum, l.bytes) << l.name;
  }
  EXPECT_EQ(static_cast<size_t>(predicted), e.stages[0].live_at_peak.size() + kept);
}

}  // namespace
}  // namespace np
