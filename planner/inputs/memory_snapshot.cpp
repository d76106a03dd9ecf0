// Reading PyTorch's memory snapshot (memory_snapshot.hpp). How the allocator records its actions,
// from c10/cuda/CUDACachingAllocator.cpp of pytorch/pytorch at
// b944315b93d36f842ef94d67a041371993234a74:
// - malloc records "alloc" with the requested size (orig_size), and adds the block's size (the
//   request rounded, or a little more where a cached block was not split) to allocated_bytes;
// - free records "free_requested" with the block's requested_size and takes its size off
//   allocated_bytes at once; "free_completed" follows when other streams are done with it, and
//   changes no counter of allocated bytes;
// - "segment_alloc" and "segment_free" (cudaMalloc, cudaFree), "segment_map" and
//   "segment_unmap" (expandable segments' pages) change reserved_bytes by their size.
// So the state at the snapshot (its segments and blocks), walked back through the trace, gives
// allocated and reserved before every action: the trace's window need not start at the process's.
#include "planner/inputs/memory_snapshot.hpp"

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>

#include "planner/inputs/allocator_conf.hpp"
#include "planner/inputs/pickle_reader.hpp"

namespace np {
namespace {

using K = Pickle::Kind;

struct Entry {
  enum Action : uint8_t { kAlloc, kFree, kSegmentUp, kSegmentDown, kOther } action = kOther;
  int64_t addr = 0, size = 0;
};

}  // namespace

Result<MemorySnapshot> read_memory_snapshot(std::string_view file, std::string_view data) {
  Result<Pickle> read = Pickle::read(file, data);
  if (!read) return read.error();
  const Pickle& p = *read;
  const std::string name(file);
  auto bad = [&](const std::string& why) {
    return make_error(name + ": not a PyTorch memory snapshot: " + why +
                      " (valid: torch.cuda.memory._dump_snapshot()'s pickle, a dict of "
                      "\"segments\" and \"device_traces\")");
  };
  auto integer = [&](int32_t dict, std::string_view key, int64_t fallback,
                     bool required) -> std::optional<int64_t> {
    int32_t v = p.get(dict, key);
    if (v < 0) return required ? std::nullopt : std::optional<int64_t>(fallback);
    if (p.kind(v) != K::kInt || p.node(v).value < 0) return std::nullopt;
    return p.node(v).value;
  };

  int32_t segments = p.get(p.root(), "segments");
  if (segments < 0 || p.kind(segments) != K::kList) return bad("no \"segments\" list");
  AllocatorConfig config;
  if (int32_t settings = p.get(p.root(), "allocator_settings"); settings >= 0) {
    int32_t conf = p.get(settings, "PYTORCH_CUDA_ALLOC_CONF");
    if (conf >= 0 && p.kind(conf) == K::kString)
      if (Result<AllocatorConfig> c = parse_allocator_conf(p.string(conf)); c) config = *c;
  }

  MemorySnapshot s;
  std::optional<int64_t> device;
  std::unordered_map<int64_t, int64_t> live;  // address -> block size
  for (int32_t seg : p.items(segments)) {
    if (p.kind(seg) != K::kDict) return bad("a segment that is not a dict");
    std::optional<int64_t> d = integer(seg, "device", 0, false),
                           total = integer(seg, "total_size", 0, true);
    if (!d || !total) return bad("a segment without a \"total_size\" (or with a bad \"device\")");
    if (device && *device != *d)
      return make_error(name + ": a memory snapshot of devices " + std::to_string(*device) +
                        " and " + std::to_string(*d) +
                        " (valid: one device's, as one rank's process takes it)");
    device = d;
    s.reserved += *total;
    int32_t blocks = p.get(seg, "blocks");
    if (blocks < 0 || p.kind(blocks) != K::kList) return bad("a segment without a \"blocks\" list");
    for (int32_t b : p.items(blocks)) {
      std::optional<int64_t> size = integer(b, "size", 0, true), addr = integer(b, "address", 0, true);
      int32_t state = p.get(b, "state");
      if (!size || !addr || state < 0 || p.kind(state) != K::kString)
        return bad("a block without its \"size\", \"address\" and \"state\"");
      if (p.string(state) != "active_allocated") continue;
      if (!live.emplace(*addr, *size).second)
        return bad("two allocated blocks at address " + std::to_string(*addr));
      s.allocated += *size;
    }
  }

  // The device's trace, when memory history was recorded.
  std::vector<Entry> trace;
  if (int32_t traces = p.get(p.root(), "device_traces"); traces >= 0) {
    if (p.kind(traces) != K::kList) return bad("\"device_traces\" is not a list");
    const auto& per_device = p.items(traces);
    if (!device)  // no segment: the first device with a trace
      for (size_t d = 0; d < per_device.size() && !device; ++d)
        if (!p.items(per_device[d]).empty()) device = static_cast<int64_t>(d);
    if (device && static_cast<size_t>(*device) < per_device.size()) {
      int32_t list = per_device[static_cast<size_t>(*device)];
      if (p.kind(list) != K::kList) return bad("a device's trace that is not a list");
      for (int32_t e : p.items(list)) {
        int32_t action = p.get(e, "action");
        if (action < 0 || p.kind(action) != K::kString)
          return bad("trace entry " + std::to_string(trace.size()) + " without an \"action\"");
        std::string_view a = p.string(action);
        Entry t;
        if (a == "alloc") t.action = Entry::kAlloc;
        else if (a == "free_requested") t.action = Entry::kFree;
        else if (a == "segment_alloc" || a == "segment_map") t.action = Entry::kSegmentUp;
        else if (a == "segment_free" || a == "segment_unmap") t.action = Entry::kSegmentDown;
        if (t.action != Entry::kOther) {
          std::optional<int64_t> addr = integer(e, "addr", 0, true), size = integer(e, "size", 0, true);
          if (!addr || !size)
            return bad("trace entry " + std::to_string(trace.size()) + " (" + std::string(a) +
                       ") without its \"addr\" and \"size\"");
          t.addr = *addr, t.size = *size;
        }
        trace.push_back(t);
      }
    }
  }
  s.device = device.value_or(0);
  s.trace_entries = trace.size();

  // Walks the trace back from the snapshot's state; `at_peak` sees the blocks live at step
  // `stop` (the state after that many entries) when given.
  struct Walk {
    int64_t max_allocated, max_reserved;
    size_t peak_after;
  };
  std::optional<Error> broken;
  auto walk = [&](std::unordered_map<int64_t, int64_t>& blocks, size_t stop,
                  std::unordered_map<int64_t, bool>* rounded) -> Walk {
    int64_t allocated = s.allocated, reserved = s.reserved;
    Walk w{allocated, reserved, trace.size()};
    for (size_t i = trace.size(); i-- > stop;) {
      const Entry& t = trace[i];
      auto fail = [&](const std::string& why) {
        if (!broken)
          broken = make_error(name + ": its trace does not lead to its segments: entry " +
                              std::to_string(i) + " " + why +
                              " (valid: a snapshot as torch.cuda.memory._dump_snapshot() "
                              "wrote it)");
      };
      switch (t.action) {
        case Entry::kAlloc: {  // before it, the block was not live
          auto it = blocks.find(t.addr);
          if (it == blocks.end()) return fail("allocates a block that is not live after it"), w;
          allocated -= it->second;
          blocks.erase(it);
          if (rounded) rounded->erase(t.addr);
          break;
        }
        case Entry::kFree: {  // before it, the block was live
          int64_t size = allocator_round_size(std::max<int64_t>(t.size, 1), config);
          if (!blocks.emplace(t.addr, size).second)
            return fail("frees a block whose address is live after it"), w;
          if (rounded) (*rounded)[t.addr] = true;
          allocated += size;
          break;
        }
        case Entry::kSegmentUp: reserved -= t.size; break;
        case Entry::kSegmentDown: reserved += t.size; break;
        case Entry::kOther: break;
      }
      if (allocated < 0 || reserved < 0)
        return fail("takes the allocated or reserved bytes below zero"), w;
      if (allocated > w.max_allocated) w.max_allocated = allocated, w.peak_after = i;
      w.max_reserved = std::max(w.max_reserved, reserved);
    }
    return w;
  };
  std::unordered_map<int64_t, int64_t> blocks = live;
  Walk w = walk(blocks, 0, nullptr);
  if (broken) return *broken;
  s.max_allocated = w.max_allocated, s.max_reserved = w.max_reserved, s.peak_after = w.peak_after;
  blocks = live;
  std::unordered_map<int64_t, bool> rounded;
  walk(blocks, s.peak_after, &rounded);
  for (const auto& [addr, size] : blocks) s.live_at_peak.push_back(size);
  std::sort(s.live_at_peak.begin(), s.live_at_peak.end(), std::greater<>());
  s.rounded_blocks = rounded.size();
  return s;
}

}  // namespace np
