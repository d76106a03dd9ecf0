// Predicted against measured, per rank: the planner's simulation of the schedule beside what the
// executor's tracking allocators saw, by category, with the live sets at both peaks when they
// differ.
#pragma once
#include <array>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "executor/runner.hpp"
#include "planner/estimate.hpp"
#include "planner/schedule.hpp"

namespace np::exec {

struct RankComparison {
  int64_t rank = 0, stage = 0, tp_rank = 0;
  int64_t predicted = 0, measured = 0;
  std::array<int64_t, kCategories> predicted_at_peak{}, measured_at_peak{};
  std::string predicted_peak_at;
  std::vector<LiveTensor> predicted_live;     // filled when the peaks differ
  std::vector<LiveAllocation> measured_live;  // filled when the peaks differ
  std::vector<std::string> unplanned;
  int64_t difference() const { return measured - predicted; }
};

struct RunComparison {
  std::string title;
  TrainSpec setup;
  std::vector<RankComparison> ranks;
  std::vector<double> losses;
  bool all_equal = true;
};

RunComparison compare(const Schedule& s, const RunResult& r, std::string title);
std::string comparison_table(const RunComparison& c);
nlohmann::json comparison_json(const RunComparison& c);

}  // namespace np::exec
