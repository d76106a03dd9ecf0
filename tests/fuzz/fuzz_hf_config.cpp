// Fuzz target: a Hugging Face config.json (planner/inputs/catalog.cpp).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.hpp"
#include "planner/inputs/catalog.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  np::fuzz::check_result(np::hf_config_from_text(text, "config.json"));
  return 0;
}
