// Fuzz target: a scenario file (planner/inputs/scenario.cpp), against the repository's model catalog.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.hpp"
#include "planner/inputs/catalog.hpp"
#include "planner/inputs/scenario.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<np::ModelSpec> catalog = [] {
    auto c = np::load_model_catalog(std::string(NANOPLAN_SOURCE_DIR) + "/models");
    if (!c) __builtin_trap();
    return *c;
  }();
  std::string text(reinterpret_cast<const char*>(data), size);
  np::fuzz::check_result(np::scenario_from_text(text, "scenario.toml", catalog));
  return 0;
}
