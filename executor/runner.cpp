// Runs every rank of a schedule as a thread through run_rank, and merges what they report.
#include "executor/runner.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <thread>

#include "executor/comm/inproc.hpp"
#include "planner/schedule/simulate.hpp"
#include "planner/inputs/units.hpp"

namespace np::exec {

CommWorldFactory in_process_world() {
  return [](int64_t tp, int64_t pp, int64_t dp, int64_t cp, int64_t ep) {
    return std::make_unique<InProcessWorld>(tp, pp, dp, cp, ep);
  };
}

std::optional<Error> check_runnable(const Schedule& s, bool host_memory) {
  const TrainSpec& t = s.setup;
  if (t.cp != 1 && !host_memory)
    return make_error("the CUDA backend runs cp = 1 (context parallelism runs on the CPU "
                      "executor); got --cp " + std::to_string(t.cp) + ": use --cp 1 or --backend cpu");
  if (t.ep != 1 && t.moe_capacity_factor <= 0)
    return make_error("the executor runs expert parallelism with a capacity factor (static "
                      "all-to-all sizes; dropless ep > 1 is estimated for balanced routing only); "
                      "got --ep " + std::to_string(t.ep) +
                      " without one: add --moe-capacity-factor (e.g. 1.25) or use --ep 1");
  if (!host_memory && s.model.mla && s.model.mla->v_head_dim > s.model.head_dim)
    return make_error("the CUDA backend's attention reads the values zero-padded to the q/k head "
                      "dim, so it runs v_head_dim at most head_dim; " + s.model.name + " has " +
                      std::to_string(s.model.mla->v_head_dim) + " > " +
                      std::to_string(s.model.head_dim) + ": use --backend cpu");
  if (!host_memory && t.ep != 1)
    return make_error("the CUDA backend runs ep = 1 (expert parallelism runs on the CPU "
                      "executor); got --ep " + std::to_string(t.ep) + ": use --backend cpu");
  if (t.fsdp && (s.model.tie_embeddings || mtp_depths(s.model, t) > 0))
    return make_error(std::string("the executor runs FSDP2 without ") +
                      (s.model.tie_embeddings ? "tied embeddings yet (" + s.model.name +
                                                    "): use --zero 3 in place of --fsdp"
                                              : "multi-token prediction yet: use --mtp-layers 0"));
  if (t.zero >= 2 && s.model.tie_embeddings)
    return make_error("the executor runs ZeRO-2/3 without tied embeddings (it does not yet gather "
                      "or bucket the LM head's tied table); got --zero " + std::to_string(t.zero) +
                      " with " + s.model.name + ": use --zero 0 or 1");
  if (t.fp8_param_gather)
    return make_error("the executor keeps bf16 weights: Megatron's float8 parameters "
                      "(--fp8-param-gather) are estimated and planned, not run; use "
                      "--fp8-param-gather off");
  if (t.gpus() > 64)
    return make_error("the executor runs at most 64 ranks; got tp x cp x pp x dp = " +
                      std::to_string(t.gpus()));
  return std::nullopt;
}

std::optional<Error> check_host_memory(const Schedule& s) {
  const TrainSpec& t = s.setup;
  // Every rank's predicted peak must fit in what this machine has free.
  double need = 0;
  for (const StageProgram& p : s.stages)
    need += static_cast<double>(simulate(p).peak_bytes) * static_cast<double>(t.tp * t.cp * t.dp);
  double avail =
      static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (avail > 0 && need > 0.8 * avail)
    return make_error("the CPU executor would need " + format_human(static_cast<int64_t>(need)) +
                      " of host memory and " + format_human(static_cast<int64_t>(avail)) +
                      " is free; run a smaller model (e.g. --scenario scenarios/tiny-llama.toml)");
  return std::nullopt;
}

Result<RunResult> run_schedule(const Schedule& s, const BackendFactory& backend,
                               const RunOptions& options, const CommWorldFactory& world_factory) {
  if (auto e = check_runnable(s, !options.device_memory)) return *e;
  if (!options.device_memory)
    if (auto e = check_host_memory(s)) return *e;
  const TrainSpec& t = s.setup;
  std::unique_ptr<CommWorld> world = world_factory(t.tp, t.pp, t.dp, t.cp, t.ep);
  std::mutex mu;
  RunResult result;
  std::optional<Error> error;
  {
    std::vector<std::jthread> threads;
    for (int64_t stage = 0; stage < t.pp; ++stage)
      for (int64_t d = 0; d < t.dp * t.cp; ++d)  // DP rank: replica x cp + CP rank
        for (int64_t r = 0; r < t.tp; ++r)
          threads.emplace_back([&, stage, d, r] {
            int64_t global = (stage * t.dp * t.cp + d) * t.tp + r;
            try {
              std::unique_ptr<Backend> be = backend();
              RankRun run = run_rank(s, stage, *be, world->comm(stage, d, r), options);
              std::lock_guard lock(mu);
              merge_rank(result, std::move(run));
            } catch (const OutOfBudget& e) {
              {
                std::lock_guard lock(mu);
                if (!result.out_of_memory) result.out_of_memory = e, result.oom_rank = global;
              }
              world->abort(stage, d, r);
            } catch (const RunAborted&) {
              world->abort(stage, d, r);
            } catch (const std::exception& e) {
              {
                std::lock_guard lock(mu);
                if (!error)
                  error = make_error("run failed on rank " + std::to_string(global) +
                                     " (pp stage " + std::to_string(stage) + "): " + e.what());
              }
              world->abort(stage, d, r);
            }
          });
  }
  if (error) return *error;
  result.ranks_per_device = t.gpus();
  finish_merge(result);
  return result;
}

void finish_merge(RunResult& result) {
  std::sort(result.ranks.begin(), result.ranks.end(),
            [](const RankResult& a, const RankResult& b) { return a.global_rank < b.global_rank; });
  result.losses.clear();
  for (const auto& [rank, part] : result.loss_parts) {  // global rank order: DP, then CP
    result.losses.resize(std::max(result.losses.size(), part.size()), 0.0);
    for (size_t i = 0; i < part.size(); ++i) result.losses[i] += part[i];
  }
}

void merge_rank(RunResult& result, RankRun&& run) {
  bool first_of_group =
      run.memory.tp_rank == 0 && run.memory.dp_rank == 0 && run.memory.cp_rank == 0;
  if (!run.losses.empty()) result.loss_parts[run.memory.global_rank] = std::move(run.losses);
  result.ranks.push_back(std::move(run.memory));
  for (auto& [key, g] : run.grads) {
    std::vector<float>& into = result.grads[key];
    if (into.empty()) into = g;
    for (size_t i = 0; i < g.size() && i < into.size(); ++i)
      if (std::isnan(into[i])) into[i] = g[i];
  }
  if (first_of_group)
    for (auto& [key, n] : run.forward_runs) result.forward_runs[key] = n;
  for (auto& [key, sec] : run.profile) result.profile[key] += sec;
}

}  // namespace np::exec
