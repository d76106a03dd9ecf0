// Replays a stage program: allocations add bytes when their instruction runs, frees remove them.
#include "planner/schedule/simulate.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace np {

void canonical_order(std::vector<MemEvent>& events) {
  std::stable_sort(events.begin(), events.end(), [](const MemEvent& a, const MemEvent& b) {
    if (a.instr != b.instr) return a.instr < b.instr;
    if (a.alloc != b.alloc) return a.alloc;
    return a.tensor < b.tensor;
  });
}

SimResult simulate(const StageProgram& p, const SimOptions& options) {
  SimResult r;
  std::array<int64_t, kCategories> cur{};
  int64_t total = 0;
  int32_t anchor = -1;  // the last instruction that is not a free
  for (int32_t i = 0; i < static_cast<int32_t>(p.instrs.size()); ++i) {
    const Instr& in = p.instrs[i];
    if (in.kind == InstrKind::kFree) {
      int32_t id = p.reads(in)[0];
      const ScheduleTensor& t = p.tensors[id];
      cur[static_cast<int>(t.category)] -= t.bytes;
      total -= t.bytes;
      if (options.events) r.events.push_back({anchor, id, t.bytes, false});
    } else {
      anchor = i;
      for (int32_t id : p.allocs(in)) {
        const ScheduleTensor& t = p.tensors[id];
        if (options.events) r.events.push_back({i, id, t.bytes, true, stream_of(t.kind)});
        int c = static_cast<int>(t.category);
        if (__builtin_add_overflow(cur[c], t.bytes, &cur[c]) ||
            __builtin_add_overflow(total, t.bytes, &total))
          throw std::overflow_error("stage " + std::to_string(p.stage) + ": the bytes live at '" +
                                    p.instr_name(in) + "' exceed 2^63 - 1");
        r.max_by_category[c] = std::max(r.max_by_category[c], cur[c]);
      }
      if (total > r.peak_bytes) {
        r.peak_bytes = total;
        r.peak_instr = i;
        r.at_peak = cur;
      }
    }
    if (options.timeline) r.timeline.push_back(total);
  }
  if (options.events && options.canonical) canonical_order(r.events);
  if (options.live_set && r.peak_instr >= 0) {
    std::vector<bool> live(p.tensors.size(), false);
    for (int32_t i = 0; i <= r.peak_instr; ++i) {
      const Instr& in = p.instrs[i];
      if (in.kind == InstrKind::kFree) live[p.reads(in)[0]] = false;
      for (int32_t id : p.allocs(in)) live[id] = true;
    }
    for (int32_t id = 0; id < static_cast<int32_t>(live.size()); ++id)
      if (live[id]) r.live_at_peak.push_back(id);
  }
  return r;
}

}  // namespace np
