// PyTorch's memory snapshot, the pickle torch.cuda.memory._dump_snapshot() writes, read without
// Python (pickle_reader.hpp): what the caching allocator held when it was taken, and, when memory
// history was recorded, the allocated and reserved bytes over its trace with the blocks live at
// the allocated peak. `nanoplan compare` reads it as one rank's record (memory_record.hpp).
//
// The structure is the one torch/cuda/memory.py's _snapshot documents (pytorch/pytorch
// 00b65a04a2d30e498eedcb1e3476abd547f428f1): a dict with "segments" (each with "device",
// "total_size" and its "blocks", each with "address", "size", "requested_size" and "state") and
// "device_traces" (per device, the allocator's actions in order: "action", "addr", "size").
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "planner/inputs/result.hpp"

namespace np {

struct MemorySnapshot {
  int64_t device = 0;  // the device the segments (else the trace) are on
  int64_t allocated = 0, reserved = 0;  // when the snapshot was taken
  // The largest allocated and reserved bytes over the recorded trace and the snapshot (the
  // trace is a window: max_entries, or history recorded late, can leave earlier peaks out).
  int64_t max_allocated = 0, max_reserved = 0;
  size_t trace_entries = 0;  // the device's recorded actions
  size_t peak_after = 0;     // the allocated peak is the state after this many of them
  std::vector<int64_t> live_at_peak;  // the allocated blocks' sizes then, largest first
  // Blocks at the peak whose size is the request rounded by PyTorch's round_size, not read from
  // the snapshot (a block freed before it was taken: the trace records only the request).
  size_t rounded_blocks = 0;
};

// `file` names it in errors. Bad input: not a pickle this reader accepts (pickle_reader.hpp), not
// a snapshot's structure, a trace that does not lead to the segments (an alloc with no live
// block at its address, bytes going below zero), segments of more than one device.
Result<MemorySnapshot> read_memory_snapshot(std::string_view file, std::string_view data);

}  // namespace np
