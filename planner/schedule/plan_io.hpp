// The plan file: the versioned JSON form of a Schedule (model spec, setup, and per pipeline stage
// its blocks, tensors and ordered program), written by `nanoplan plan` and read by `nanoplan run`.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "planner/inputs/result.hpp"
#include "planner/schedule/schedule.hpp"

namespace np {

nlohmann::json model_spec_to_json(const ModelSpec& m);
Result<ModelSpec> model_spec_from_json(const nlohmann::json& j);
nlohmann::json setup_to_json(const TrainSpec& t);
Result<TrainSpec> setup_from_json(const nlohmann::json& j);

nlohmann::json schedule_to_json(const Schedule& s);

// Rebuilds the block graphs from the plan's model and setup and reads the programs back, strictly
// (integers without wrap or fraction, enums with their valid values, every error naming its path),
// then check_plan. Rejects another format version, a malformed document, and references to
// unknown ops or tensors.
Result<Schedule> schedule_from_json(const nlohmann::json& j);
// schedule_from_json of a file; a folder, a missing file and malformed JSON (with its line) are
// refused by name.
Result<Schedule> load_plan(const std::string& path);

// Writes the plan file whole or not at all (a temporary file renamed into place); the error
// names the path and why.
std::optional<Error> write_plan(const Schedule& s, const std::string& path);

// Whether a plan's model is `named` (a catalog entry or a model file the user gave): equal in
// every field but the source and display name. The error names the first field that differs,
// with `whose` naming where `named` came from ("the catalog's").
std::optional<Error> check_plan_model(const ModelSpec& plan, const ModelSpec& named,
                                      const std::string& whose);

}  // namespace np
