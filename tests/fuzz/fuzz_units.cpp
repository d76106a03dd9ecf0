// Fuzz target: the strings a user types for sizes and counts: budgets and byte sizes
// (parse_bytes), integer flags (parse_integer), layer counts (parse_partition) and enum spellings
// (parse_enum). The first byte picks the parser.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.hpp"
#include "planner/inputs/spec.hpp"
#include "planner/inputs/units.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 5) {
    case 0: {
      auto r = np::parse_bytes(text);
      np::fuzz::check_result(r);
      if (r && *r <= 0) __builtin_trap();  // positive unless zero is allowed
      break;
    }
    case 1:
      np::fuzz::check_result(np::parse_bytes(text, /*allow_zero=*/true));
      break;
    case 2: {
      auto r = np::parse_integer(text);
      np::fuzz::check_result(r);
      if (r && std::stoll(text) != *r) __builtin_trap();  // the number written, no wrap
      break;
    }
    case 3:
      np::fuzz::check_result(np::parse_partition(text));
      break;
    case 4:
      np::fuzz::check_result(np::parse_enum<np::Recompute>("--recompute", text));
      np::fuzz::check_message(np::quote_input(text));
      break;
  }
  return 0;
}
