// Fuzz target: a plan file (planner/schedule/plan_io.cpp, planner/schedule/plan_check.cpp): parsed, read strictly and
// checked against the schedule rebuilt from its own model and setup. A plan that loads must pass
// check_program and simulate without overflow.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.hpp"
#include "planner/inputs/json_reader.hpp"
#include "planner/schedule/plan_io.hpp"
#include "planner/schedule/simulate.hpp"
#include "planner/schedule/contract.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  np::Result<nlohmann::json> j = np::parse_json(text, "plan.json");
  if (!j) {
    np::fuzz::check_message(j.error().message);
    return 0;
  }
  np::Result<np::Schedule> s = np::schedule_from_json(*j);
  np::fuzz::check_result(s);
  if (!s) return 0;
  for (const np::StageProgram& p : s->stages) {
    if (np::check_program(p)) __builtin_trap();  // check_plan ran it: a loaded plan is well formed
    (void)np::simulate(p);
  }
  return 0;
}
