// Formatting of results: the human table and the JSON document for scripts. Results are plain
// data (estimate.hpp, schedule.hpp) first; these functions only format them.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "planner/schedule/estimate.hpp"
#include "planner/schedule/schedule.hpp"

namespace np {

nlohmann::json model_to_json(const ModelSpec& m, int64_t parameters);
nlohmann::json estimate_to_json(const Estimate& e);
// `requested` is the model name the user typed (shown when it was an alias).
// `verbose`: every live tensor at the peak (with --explain-peak), not only their groups.
// "tp 8 (sp on) x pp 1 x dp 1 = 8 GPUs; micro-batch 1 x seq 4096, ..." (two lines).
std::string describe_setup(const TrainSpec& t);
std::string estimate_to_table(const Estimate& e, const std::string& requested,
                              bool verbose = false);

}  // namespace np
