// Liveness simulation of a stage program: the memory timeline per rank, its peak, and the live
// tensors at the peak (what to blame).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "planner/schedule.hpp"

namespace np {

struct SimResult {
  int64_t peak_bytes = 0;   // allocator-level high-water mark of the stage's ranks
  int32_t peak_instr = -1;  // instruction index at which the peak is reached
  std::array<int64_t, kCategories> at_peak{};          // bytes by category at the peak
  std::array<int64_t, kCategories> max_by_category{};  // each category's own high-water mark
  std::vector<int32_t> live_at_peak;                   // tensor ids, filled when asked for
  std::vector<int64_t> timeline;  // bytes after each instruction, when asked for
};

struct SimOptions {
  bool live_set = false;  // record the tensors live at the peak
  bool timeline = false;  // record the bytes after every instruction
};

SimResult simulate(const StageProgram& p, const SimOptions& options = {});

}  // namespace np
