// Shared by the fuzz targets: what every error message must be (one line of printable ASCII,
// bounded), checked on every input; a violation traps, which libFuzzer reports as a crash.
#pragma once
#include <string>

#include "planner/inputs/result.hpp"

namespace np::fuzz {

inline void check_message(const std::string& m) {
  if (m.empty() || m.size() > 2000) __builtin_trap();
  for (char c : m)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      __builtin_trap();  // a newline, a control byte or raw input bytes in a message
}

template <typename T>
void check_result(const Result<T>& r) {
  if (!r) check_message(r.error().message);
}

}  // namespace np::fuzz
