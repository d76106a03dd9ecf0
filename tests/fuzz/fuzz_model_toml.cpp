// Fuzz target: a model file in the catalog's TOML schema (planner/inputs/catalog.cpp). Any input must give
// a model or a one-line error; the error must not echo raw bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.hpp"
#include "planner/inputs/catalog.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  np::fuzz::check_result(np::model_toml_from_text(text, "model.toml"));
  return 0;
}
