// The executor's record in Megatron-LM's report_memory form (record.hpp). The line's text is
// Megatron-LM's (d98e8a64ddf34856e74b24714e3bedb2f5a39553, megatron/training/utils/
// common_utils.py report_memory L313-334: "[Rank R] {name} memory (MB)", then " | allocated: ",
// " | max allocated: ", " | reserved: ", " | max reserved: " and, where it is known,
// " | total device memory used: "; called with name "(after {iteration} iterations)").
#include "executor/record.hpp"

#include <charconv>

namespace np::exec {
namespace {

// Bytes in MB (2^20 bytes), the shortest decimal that reads back to the same double: exact, as
// bytes below 2^53 over 2^20 are doubles.
std::string mb(int64_t bytes) {
  char buf[64];
  double v = static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 20);
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed);
  std::string s(buf, end);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";  // Python's repr of a whole float
  return s;
}

}  // namespace

std::string megatron_memory_record(const RunResult& r, int steps) {
  std::string out;
  for (const RankResult& k : r.ranks) {
    const bool caching = k.measured_reserved_peak.has_value();
    int64_t allocated = caching ? k.measured_allocated_blocks_at_end.value_or(0)
                                : k.measured_in_use_at_end;
    int64_t max_allocated = caching ? k.measured_allocated_blocks_peak.value_or(0)
                                    : k.measured_peak;
    int64_t reserved = caching ? k.measured_reserved_at_end.value_or(0) : allocated;
    int64_t max_reserved = caching ? *k.measured_reserved_peak : max_allocated;
    out += "[Rank " + std::to_string(k.global_rank) + "] (after " + std::to_string(steps) +
           " iterations) memory (MB) | allocated: " + mb(allocated) +
           " | max allocated: " + mb(max_allocated) + " | reserved: " + mb(reserved) +
           " | max reserved: " + mb(max_reserved);
    if (k.measured_device_peak) out += " | total device memory used: " + mb(*k.measured_device_peak);
    out += "\n";
  }
  return out;
}

}  // namespace np::exec
