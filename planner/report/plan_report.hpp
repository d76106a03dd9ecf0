// What the user sees of an auto plan (plan_report.cpp): the human summary (plan per stage, time,
// nanotron and Megatron equivalents) and the JSON "plan".
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "planner/recompute/autoplan.hpp"

namespace np {

// "predicted step time (cost model) 1.013 s, recompute ... MFU ..., HFU ...\n"
std::string step_time_line(const StepTime& t);
// `verbose`: also the layer options the plan was chosen from (the frontier).
std::string auto_plan_table(const AutoPlan& p, int64_t budget, bool verbose = false);
nlohmann::json auto_plan_json(const AutoPlan& p);

}  // namespace np
