// The plan file: the versioned JSON form of a Schedule (model spec, setup, and per pipeline stage
// its blocks, tensors and ordered program), written by `nanoplan plan` and read by `nanoplan run`.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "planner/result.hpp"
#include "planner/schedule.hpp"

namespace np {

nlohmann::json model_spec_to_json(const ModelSpec& m);
Result<ModelSpec> model_spec_from_json(const nlohmann::json& j);
Result<TrainSpec> setup_from_json(const nlohmann::json& j);

nlohmann::json schedule_to_json(const Schedule& s);
// Rebuilds the block graphs from the plan's model and setup and reads the programs back. Rejects
// another format version, a malformed document, and references to unknown ops or tensors. It does
// not judge the program: check_program does.
Result<Schedule> schedule_from_json(const nlohmann::json& j);
Result<Schedule> load_plan(const std::string& path);

}  // namespace np
