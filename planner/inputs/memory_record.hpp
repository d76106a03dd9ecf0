// A training run's own memory record, read from its log: what PyTorch's caching allocator said per
// rank (max allocated, max reserved), as the framework printed it. `nanoplan compare` sets it
// beside the estimate of the same setup (planner/report/record_compare.hpp).
//
// Formats, each as its framework prints it (the sources in memory_record.cpp):
// - Megatron-LM's report_memory: "[Rank R] (after K iterations) memory (MB) | allocated: A |
//   max allocated: M | reserved: X | max reserved: Y [| total device memory used: D]", "MB"
//   being 2^20 bytes, printed by data-parallel rank 0 of each (pp, tp) group; and its
//   "Theoretical memory footprints: weight and optimizer=W MB, activation=A MB, total=T MB".
// - nanotron's log_memory: "Memory usage: U MiB. Peak allocated P MiB. Peak reserved: R MiB"
//   (and "[After model building] Memory usage: ..."), behind the logger's prefix with the ranks
//   ("[INFO|DP=0|PP=0|TP=0|host]") and ANSI colours; the peaks are reset after each line.
// - torchtitan's metrics line: "step: N  loss: L  ...  memory: X GiB(Y%)": max reserved, GiB.
// - nanotron's benchmark CSV (config.general.benchmark_csv_path): a header row with
//   "Mem Alloc (GB)" and "Mem Res (GB)" (max allocated and reserved in GiB, two decimals, world
//   rank 0's) and the run's dp, pp, tp, cp; one row per run.
// - PyTorch's memory snapshot (a pickle; memory_snapshot.hpp): one rank's, the rank read from
//   its file name (torchtitan's "000003_step_10.pickle", or "rank3_..."), else 0.
// Timestamps, logger prefixes, a launcher's "N:" or "[rankN]:" prefix are skipped.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "planner/inputs/result.hpp"

namespace np {

enum class RecordFormat : uint8_t {
  kMegatron,
  kNanotron,
  kTorchtitan,
  kNanotronCsv,
  kSnapshot
};
const char* name_of(RecordFormat f);  // "megatron-report-memory", "nanotron-log-memory", ...

// One rank's largest figures over the record, in bytes (absent: the record does not have it).
struct RecordRank {
  int64_t rank = 0;  // the global rank; -1 where the record gives coordinates instead (nanotron)
  // The ranks' coordinates where the record names them (nanotron's prefix); else derived from
  // the global rank by the setup.
  std::optional<int64_t> pp, dp, cp, tp;
  std::optional<int64_t> max_allocated, max_reserved, device_used;
  int line = 0;          // the line (1-based) of the largest max allocated (else max reserved)
  std::string context;   // what that line says it measured, e.g. "(after 10 iterations)"
  // nanotron's benchmark CSV: the run's degrees, from its row (the figures are world rank 0's).
  struct Degrees {
    int64_t dp = 1, pp = 1, tp = 1, cp = 1;
  };
  std::optional<Degrees> run;
  // A snapshot: the allocated blocks' sizes at its allocated peak, largest first.
  std::vector<int64_t> live_blocks;
};

// Megatron's own estimate (theoretical_memory_usage.py), for rank 0's stage, in bytes.
struct TheoreticalMemory {
  int64_t weight_and_optimizer = 0, activation = 0, total = 0;
};

struct MemoryRecord {
  RecordFormat format = RecordFormat::kMegatron;
  std::string file;
  std::vector<RecordRank> ranks;  // by global rank
  std::optional<TheoreticalMemory> theoretical;
};

// Reads a record from a log's text; `file` names it in errors. The format comes from the content.
// Errors (bad input): no memory line of any known format, a number that is not one.
Result<MemoryRecord> read_memory_record(std::string_view file, std::string_view text);

}  // namespace np
