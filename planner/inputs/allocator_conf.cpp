// PYTORCH_CUDA_ALLOC_CONF and --allocator (allocator_conf.hpp). "[C] L..." cites
// c10/core/AllocatorConfig.cpp of pytorch/pytorch at b944315b93d36f842ef94d67a041371993234a74.
#include "planner/inputs/allocator_conf.hpp"

#include <algorithm>
#include <bit>
#include <cctype>
#include <optional>

#include "planner/inputs/units.hpp"

namespace np {
namespace {

int floor_log2(int64_t v) { return 63 - std::countl_zero(static_cast<uint64_t>(v)); }
bool power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// roundup_power2_next_division, c10/cuda/CUDACachingAllocator.cpp L2473-2491 (same commit): up
// to the next of `d` equal steps between two powers of two.
int64_t next_division(int64_t size, int64_t d) {
  if (power_of_two(size)) return size;
  int64_t floor = int64_t{1} << floor_log2(size);
  int64_t step = floor >> floor_log2(d);
  if (step == 0) return 2 * floor;
  return (size + step - 1) / step * step;
}

}  // namespace

// round_size, c10/cuda/CUDACachingAllocator.cpp L2493-2505; the interval of a size, [C] L40-56.
int64_t allocator_round_size(int64_t bytes, const AllocatorConfig& c) {
  if (bytes < kAllocMinBlock) return kAllocMinBlock;
  int interval = std::clamp(floor_log2(bytes) - 20, 0, 15);
  int64_t d = c.roundup_divisions[static_cast<size_t>(interval)];
  if (d > 1 && bytes > kAllocMinBlock * d) return next_division(bytes, d);
  return (bytes + kAllocMinBlock - 1) / kAllocMinBlock * kAllocMinBlock;
}

const char* name_of(AllocatorModel m) {
  switch (m) {
    case AllocatorModel::kCaching: return "caching";
    case AllocatorModel::kExpandable: return "expandable";
    case AllocatorModel::kExact: return "exact";
  }
  return "?";
}

// parseArgs, [C] L195-229, and the CUDA keys of c10/cuda/CUDAAllocatorConfig.cpp.
Result<AllocatorConfig> parse_allocator_conf(std::string_view text) {
  AllocatorConfig c;
  std::string s;
  for (char ch : text)
    if (!std::isspace(static_cast<unsigned char>(ch))) s += ch;
  auto bad = [&](const std::string& why) {
    return make_error("invalid allocator options " + quote_input(text) + ": " + why);
  };
  auto whole = [](const std::string& v) -> std::optional<int64_t> {
    if (v.empty() || v.size() > 15 || v.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    return std::stoll(v);
  };
  size_t at = 0;
  while (at < s.size()) {
    size_t colon = s.find(':', at);
    if (colon == std::string::npos) return bad("'" + s.substr(at) + "' has no value (key:value)");
    std::string key = s.substr(at, colon - at);
    size_t end = s[colon + 1] == '[' ? s.find(']', colon) : s.find(',', colon);
    if (end == std::string::npos) end = s.size();
    std::string value = s.substr(colon + 1, end - colon - (s[colon + 1] == '[' ? 0 : 1));
    at = end + (end < s.size() && s[end] == ']' ? 1 : 0);
    if (at < s.size() && s[at] == ',') ++at;
    if (key == "expandable_segments") {
      if (value != "True" && value != "False")
        return bad("expandable_segments takes True or False");
      c.expandable_segments = value == "True";
    } else if (key == "max_split_size_mb" || key == "max_non_split_rounding_mb") {
      std::optional<int64_t> mb = whole(value);
      if (!mb || *mb < kAllocLargeBuffer / kMiB)
        return bad(key + " takes a whole number of MiB, at least 20");
      (key == "max_split_size_mb" ? c.max_split_size : c.max_non_split_rounding) = *mb * kMiB;
    } else if (key == "roundup_power2_divisions") {
      if (value.empty() || value[0] != '[') {
        std::optional<int64_t> d = whole(value);
        if (!d || !power_of_two(*d)) return bad("roundup_power2_divisions takes a power of two");
        c.roundup_divisions.fill(*d);
        continue;
      }
      // [B:d,...,>:d]: B MiB a power of two, its interval log2(B) (sizes [B, 2B) MiB); the
      // first also fills the intervals below it, '>' those after the last (L109-175).
      std::string list = value.substr(1, value.size() - 2);
      size_t last = 0;
      bool first = true;
      for (size_t p = 0; p < list.size();) {
        size_t comma = std::min(list.find(',', p), list.size());
        std::string pair = list.substr(p, comma - p);
        p = comma + 1;
        size_t c2 = pair.find(':');
        std::optional<int64_t> d = c2 == std::string::npos ? std::nullopt : whole(pair.substr(c2 + 1));
        if (!d || (*d != 0 && !power_of_two(*d)))
          return bad("roundup_power2_divisions: '" + pair + "' needs a division of 0 or a power of two");
        std::string bound = pair.substr(0, c2);
        if (bound == ">") {
          std::fill(c.roundup_divisions.begin() + static_cast<ptrdiff_t>(last) + 1,
                    c.roundup_divisions.end(), *d);
          continue;
        }
        std::optional<int64_t> mb = whole(bound);
        if (!mb || !power_of_two(*mb))
          return bad("roundup_power2_divisions: '" + bound + "' is not a power of two (MiB)");
        size_t slot = std::min<size_t>(static_cast<size_t>(floor_log2(*mb)), 15);
        if (first) std::fill(c.roundup_divisions.begin(), c.roundup_divisions.begin() + static_cast<ptrdiff_t>(slot), *d);
        first = false;
        c.roundup_divisions[slot] = *d;
        last = slot;
      }
    } else if (key == "garbage_collection_threshold" || key == "backend" ||
               key == "release_lock_on_cudamalloc" || key == "pinned_use_cuda_host_register" ||
               key == "pinned_num_register_threads" || key == "pinned_use_background_threads" ||
               key == "graph_capture_record_stream_reuse" ||
               key == "per_process_memory_fraction") {
      // No size of one stream depends on these (garbage collection needs a memory fraction).
    } else {
      return bad("unknown key " + quote_input(key) +
                 " (valid: expandable_segments, max_split_size_mb, max_non_split_rounding_mb, "
                 "roundup_power2_divisions, garbage_collection_threshold, backend, "
                 "release_lock_on_cudamalloc, pinned_use_cuda_host_register, "
                 "pinned_num_register_threads, pinned_use_background_threads, "
                 "graph_capture_record_stream_reuse, per_process_memory_fraction)");
    }
  }
  return c;
}

Result<AllocatorChoice> parse_allocator_choice(std::string_view model, std::string_view options) {
  AllocatorChoice c;
  if (model == "caching") c.model = AllocatorModel::kCaching;
  else if (model == "expandable") c.model = AllocatorModel::kExpandable;
  else if (model == "exact") c.model = AllocatorModel::kExact;
  else
    return make_error("unknown allocator " + quote_input(model) +
                      " (valid: caching, expandable, exact)");
  if (options.find_first_not_of(" \t") == std::string_view::npos) {
    c.config.expandable_segments = c.model == AllocatorModel::kExpandable;
    return c;
  }
  if (c.model == AllocatorModel::kExact)
    return make_error("--allocator-conf " + quote_input(options) +
                      " with --allocator exact: the exact model caches nothing (valid: "
                      "--allocator caching or expandable with options)");
  Result<AllocatorConfig> conf = parse_allocator_conf(options);
  if (!conf) return conf.error();
  c.config = *conf;
  if (c.model == AllocatorModel::kExpandable) c.config.expandable_segments = true;
  if (c.config.expandable_segments) c.model = AllocatorModel::kExpandable;
  c.options = std::string(options);
  return c;
}

}  // namespace np
