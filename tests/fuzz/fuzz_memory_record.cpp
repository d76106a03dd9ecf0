// Fuzz target: a training run's log, benchmark CSV or PyTorch memory snapshot (a pickle:
// planner/inputs/pickle_reader.cpp, memory_snapshot.cpp) read as a memory record
// (planner/inputs/memory_record.cpp), then set beside an estimate
// (planner/report/record_compare.cpp). Every error is one bounded line; a record that reads has
// at least one rank, each with a figure, and compares without a crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.hpp"
#include "planner/inputs/memory_record.hpp"
#include "planner/report/record_compare.hpp"

namespace {
// A small setup's estimate: tp 2 x dp 2 x pp 2 of a two-layer model, built once.
const np::Estimate& estimate() {
  static const np::Estimate e = [] {
    np::ModelSpec m;
    m.name = "fuzz", m.hidden = 64, m.ffn = 128, m.layers = 2, m.heads = 4, m.kv_heads = 2;
    m.vocab = 128, m.max_positions = 64, m.head_dim = 16;
    np::TrainSpec t;
    t.tp = 2, t.dp = 2, t.pp = 2, t.seq_len = 16, t.microbatches = 2;
    return np::estimate(m, t, {}, {.explain_peak = true});  // a snapshot's live set beside it
  }();
  return e;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  np::Result<np::MemoryRecord> r = np::read_memory_record("run.log", text);
  np::fuzz::check_result(r);
  if (!r) return 0;
  if (r->ranks.empty()) __builtin_trap();
  for (const np::RecordRank& k : r->ranks)
    if (!k.max_allocated && !k.max_reserved) __builtin_trap();
  np::Result<np::RecordComparison> c = np::compare_records({*r}, estimate());
  np::fuzz::check_result(c);
  if (c) (void)np::record_table(*c, estimate());
  return 0;
}
