// Fuzz target: a nanotron YAML config (planner/inputs/configs.cpp), Megatron-LM arguments read
// against a fixed model, and a torchtitan job file (torchtitan_config.cpp, with and without a
// world size): the first byte picks which.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.hpp"
#include "planner/inputs/configs.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 3 == 0) {
    np::fuzz::check_result(np::nanotron_config(text, "config.yaml"));
  } else if (data[0] % 3 == 2) {
    np::fuzz::check_result(np::torchtitan_config(text, "job.toml", data[0] % 2 ? 0 : 8));
  } else {
    np::ModelSpec m;
    m.name = "m", m.hidden = 64, m.ffn = 128, m.layers = 8, m.heads = 4, m.kv_heads = 4;
    m.head_dim = 16, m.vocab = 100, m.max_positions = 64;
    np::fuzz::check_result(np::megatron_args(text, m, 2));
  }
  return 0;
}
