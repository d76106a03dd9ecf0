// nanoplan compare: a training run's own memory record (planner/inputs/memory_record.hpp) beside
// the estimate of the same setup, per rank the record covers: measured max allocated and max
// reserved, the prediction of the same quantities (allocated_peak, reserved_peak: the caching
// allocator's, without the CUDA context or NCCL's buffers), the signed error.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "planner/inputs/memory_record.hpp"
#include "planner/schedule/estimate.hpp"

namespace np {

// A snapshot's blocks at its allocated peak beside the estimate's live tensors at the stage's
// peak (with the runtime buffers PyTorch's allocator holds), grouped by block size: each
// predicted tensor's size as the allocator rounds it.
struct LiveSize {
  int64_t bytes = 0;  // one block's
  int64_t measured = 0, predicted = 0;  // blocks of this size
  std::vector<std::string> tensors;     // the predicted ones' names
};

struct RecordRow {
  std::string file;
  RecordFormat format = RecordFormat::kMegatron;
  int64_t rank = 0, pp = 0, dp = 0, cp = 0, tp = 0;
  std::optional<int64_t> measured_allocated, measured_reserved, measured_device;
  int64_t predicted_allocated = 0, predicted_reserved = 0;
  std::optional<int64_t> theoretical;  // Megatron's own estimate (total), on rank 0's stage
  int line = 0;
  std::string context;
  std::vector<LiveSize> live;  // a snapshot's; largest size first
  std::string predicted_peak_at;  // the stage's peak instruction (with `live`)
  // 100 (predicted - measured) / measured, where measured is in the record.
  std::optional<double> allocated_error() const;
  std::optional<double> reserved_error() const;
};

struct RecordComparison {
  std::vector<RecordRow> rows;  // by file, then global rank
  std::vector<std::string> formats;
};

// Errors (bad input): a rank or a coordinate beyond the setup's world; a benchmark CSV none of
// whose rows ran the setup's degrees. `e` should list its live tensors (explain_peak) where a
// record is a snapshot.
Result<RecordComparison> compare_records(const std::vector<MemoryRecord>& records,
                                         const Estimate& e);
std::string record_table(const RecordComparison& c, const Estimate& e);
nlohmann::json record_json(const RecordComparison& c, const Estimate& e);

}  // namespace np
