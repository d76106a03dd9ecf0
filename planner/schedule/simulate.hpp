// Liveness simulation of a stage program: the memory timeline per rank, its peak, and the live
// tensors at the peak (what to blame).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "planner/schedule/schedule.hpp"

namespace np {

// One allocation or release of a rank's memory. `instr` is the index (in StageProgram::instrs) of
// the instruction that allocated the tensor, or, for a release, of the last instruction before
// the free that is not itself a free: the one whose completion ends the tensor's life. `tensor`
// is the plan's tensor id; an executor's allocation the plan did not name has a negative id.
struct MemEvent {
  int32_t instr = -1;
  int32_t tensor = -1;
  int64_t bytes = 0;
  bool alloc = true;
  int16_t stream = 0;  // its stream (caching_allocator.hpp): 0, the compute stream
  bool operator==(const MemEvent&) const = default;
};

// The canonical order of a rank's events, the form in which predicted and measured sequences are
// compared: instruction by instruction, an instruction's allocations (by tensor id) before its
// releases (by tensor id). Kernels may allocate an instruction's tensors in any order, and frees
// at one point in any order, without changing any peak: allocations of an instruction all come
// before its releases.
void canonical_order(std::vector<MemEvent>& events);

struct SimResult {
  int64_t peak_bytes = 0;   // allocator-level high-water mark of the stage's ranks
  int32_t peak_instr = -1;  // instruction index at which the peak is reached
  std::array<int64_t, kCategories> at_peak{};          // bytes by category at the peak
  std::array<int64_t, kCategories> max_by_category{};  // each category's own high-water mark
  std::vector<int32_t> live_at_peak;                   // tensor ids, filled when asked for
  std::vector<int64_t> timeline;  // bytes after each instruction, when asked for
  std::vector<MemEvent> events;   // every allocation and release, when asked for
};

struct SimOptions {
  bool live_set = false;  // record the tensors live at the peak
  bool timeline = false;  // record the bytes after every instruction
  bool events = false;    // record every allocation and release (MemEvent)
  // The events in canonical order (the form predicted and measured are compared in); false: in
  // the program's order, as an executor allocates and frees (what an allocator replays).
  bool canonical = true;
};

// Throws std::overflow_error when the bytes live at some instruction exceed 2^63 - 1 (a setup or
// plan too large to count in 64 bits: bad input).
SimResult simulate(const StageProgram& p, const SimOptions& options = {});

}  // namespace np
