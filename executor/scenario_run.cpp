// A scenario's matrix on one executor (scenario_run.hpp).
#include "executor/scenario_run.hpp"

#include "executor/rank.hpp"
#include "planner/schedule/schedule.hpp"

namespace np::exec {

ScenarioResult run_scenario(const Scenario& sc, const Executor& ex, RunOptions options,
                            const RuntimeAssumptions& rt, const HardwareModel* hardware,
                            const std::function<void()>& started,
                            const std::function<void(const ScenarioCase&)>& each) {
  ScenarioResult out;
  auto stop = [&](ScenarioStop why, const TrainSpec& t, std::string message) {
    out.stop = why, out.stopped_at = t, out.message = std::move(message);
    return out;
  };
  std::vector<Schedule> schedules;
  for (const TrainSpec& t : sc.matrix) {  // refuse before anything runs
    const Schedule& s = schedules.emplace_back(build_schedule(sc.model, t));
    if (auto e = check_runnable(s, !ex.device)) return stop(ScenarioStop::kRefused, t, e->message);
    if (!ex.device)
      if (auto e = check_host_memory(s)) return stop(ScenarioStop::kHostMemory, t, e->message);
  }
  if (options.steps == 1) options.steps = sc.steps;
  started();
  for (size_t i = 0; i < sc.matrix.size(); ++i) {
    const TrainSpec& t = sc.matrix[i];
    const Schedule& s = schedules[i];
    Result<RunResult> r = run_schedule(s, ex.backend, options, ex.world);
    if (!r) return stop(ScenarioStop::kRunFailed, t, r.error().message);
    if (r->out_of_memory)
      return stop(ScenarioStop::kOutOfMemory, t,
                  "rank " + std::to_string(r->oom_rank) + ": " + r->out_of_memory->what());
    ScenarioCase c{t, compare(s, *r, sc.name + ": " + describe_short(t), rt, hardware), ""};
    c.why = scenario_failures(sc, t, c.comparison.all_equal, c.comparison.losses);
    out.failed += !c.why.empty();
    each(c);
  }
  return out;
}

}  // namespace np::exec
