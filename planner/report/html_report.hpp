// `nanoplan report`: one self-contained HTML file (inline SVG and CSS, no script, nothing fetched)
// with the memory of each pipeline stage's first rank over one step from the simulation, stacked
// by category with the peak and the budget marked (and the measured total when a run is given),
// the plan per layer as a strip, the layer options the planner chose from (kept bytes against
// recompute time), and the sweep's ranking when one was run.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "planner/recompute/autoplan.hpp"
#include "planner/schedule/estimate.hpp"
#include "planner/schedule/simulate.hpp"
#include "planner/recompute/sweep.hpp"

namespace np {

struct ReportInput {
  Estimate estimate;  // of `schedule`: the verdict, the peaks, the budget
  Schedule schedule;
  std::optional<AutoPlan> plan;  // --recompute auto: the frontier and the layers' choices
  // Measured by a run: per pipeline stage, its first rank's allocations and releases of the first
  // step (empty when no run).
  std::vector<std::vector<MemEvent>> measured;
  std::string measured_by;  // "the CPU executor", ...
  std::optional<SweepReport> sweep;
  SweepOptions sweep_options;
  std::string command;  // the command line that made the report
};

std::string html_report(const ReportInput& in);

}  // namespace np
