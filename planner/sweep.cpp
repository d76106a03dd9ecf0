// The setup sweep: enumerate, validate, plan, time, rank.
#include "planner/sweep.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "planner/report.hpp"
#include "planner/schedule.hpp"
#include "planner/units.hpp"

namespace np {
namespace {

std::vector<TrainSpec> candidates(const ModelSpec& m, const SweepOptions& o, size_t& invalid) {
  std::vector<TrainSpec> out;
  int64_t batch = o.global_batch > 0 ? o.global_batch : 4 * o.gpus;
  for (int64_t tp = 1; tp <= std::min<int64_t>(o.gpus, o.hw.gpus_per_node); tp *= 2)
    for (int64_t cp : o.context_parallel)
      for (int64_t pp = 1; pp <= std::min(o.gpus / (tp * cp), m.layers); ++pp) {
        if (o.gpus % (tp * cp * pp) != 0) continue;
        int64_t dp = o.gpus / (tp * cp * pp);
        for (int zero : {0, 1, 2, 3})
          for (int64_t mbs : {1, 2, 4})
            for (int64_t v : o.virtual_stages) {
              if (zero >= 1 && dp * cp == 1) continue;  // nothing to shard
              if (batch % (dp * mbs) != 0) continue;
              // Virtual stages: v = 1 runs the base schedule; v > 1 the interleaved one with v
              // chunks per stage (pp > 1 only).
              if (v > 1 && pp == 1) continue;
              TrainSpec t = o.base;
              t.tp = tp, t.cp = cp, t.pp = pp, t.dp = dp, t.zero = zero, t.micro_batch = mbs;
              t.sp = tp > 1;
              t.microbatches = batch / (dp * mbs);
              t.recompute = Recompute::kAuto;
              if (v > 1) t.pp_schedule = PpSchedule::kInterleaved;
              t.virtual_stages = v;
              if (validate_setup(m, t)) {
                ++invalid;
                continue;
              }
              out.push_back(t);
            }
      }
  return out;
}

std::string summary(const AutoPlan& p) {
  std::vector<std::pair<std::string, int>> counts;
  for (const BlockPolicy& b : p.layer_policies) {
    auto it = std::find_if(counts.begin(), counts.end(),
                           [&](const auto& c) { return c.first == b.name; });
    if (it == counts.end())
      counts.push_back({b.name, 1});
    else
      ++it->second;
  }
  std::sort(counts.begin(), counts.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string s;
  for (size_t i = 0; i < counts.size(); ++i)
    s += (i ? ", " : "") + std::to_string(counts[i].second) + " x " + counts[i].first;
  return s;
}

}  // namespace

SweepReport sweep(const ModelSpec& m, const SweepOptions& o,
                  const std::function<void(size_t, size_t)>& progress) {
  auto start = std::chrono::steady_clock::now();
  SweepReport r;
  std::vector<TrainSpec> setups = candidates(m, o, r.invalid);
  // Setups are independent: one worker thread per core, sharing one frontier cache, taking the
  // next setup from a shared counter; results land in setup order.
  std::vector<std::optional<SweepResult>> results(setups.size());
  std::atomic<size_t> next{0}, done{0};
  std::mutex progress_mu;
  FrontierCache cache;
  auto work = [&] {
    for (size_t i; (i = next++) < setups.size();) {
      AutoPlan p = auto_plan(m, setups[i], o.runtime, o.budget, o.hw,
                             {.closest_when_infeasible = false,
                              .compare_uniform = false,
                              .cache = &cache,
                              .full_schedule = false,
                              .search_partition = o.search_partition});
      results[i] = SweepResult{p.estimate.setup,
                               p.fits,
                               p.time.seconds,
                               p.time.tokens_per_second,
                               p.time.mfu,
                               p.time.recompute_seconds,
                               p.estimate.peak_bytes,
                               p.fits ? summary(p) : ""};
      size_t d = ++done;
      if (progress) {
        std::lock_guard lock(progress_mu);
        progress(d, setups.size());
      }
    }
  };
  {
    std::vector<std::jthread> pool;
    unsigned workers = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 64));
    for (unsigned w = 0; w < workers; ++w) pool.emplace_back(work);
  }
  for (const auto& x : results) {
    ++r.evaluated;
    if (x->fits)
      r.fitting.push_back(*x);
    else
      ++r.not_fitting;
  }
  std::stable_sort(r.fitting.begin(), r.fitting.end(),
                   [](const SweepResult& a, const SweepResult& b) {
                     return a.tokens_per_second > b.tokens_per_second;
                   });
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

std::string sweep_table(const SweepReport& r, const ModelSpec& m, const SweepOptions& o,
                        size_t top) {
  char line[512];
  std::snprintf(line, sizeof line,
                "sweep: %s on %lld GPUs, budget %s: %zu setups evaluated (%zu fit, %zu invalid "
                "skipped) in %.2f s (%.0f setups/s)\n",
                m.name.c_str(), static_cast<long long>(o.gpus), format_human(o.budget).c_str(),
                r.evaluated, r.fitting.size(), r.invalid, r.seconds,
                r.evaluated / std::max(1e-9, r.seconds));
  std::string out = line;
  if (r.fitting.empty())
    return out + "no setup fits: try more GPUs, a shorter sequence or a larger budget\n";
  std::snprintf(line, sizeof line, "%4s %4s %3s %4s %2s %4s %5s %4s %5s %10s %11s %6s %10s  %s\n",
                "rank", "tp", "cp", "pp", "v", "dp", "zero", "mbs", "m", "step s", "tokens/s",
                "MFU", "peak GiB", "recompute plan");
  out += line;
  for (size_t i = 0; i < r.fitting.size() && i < top; ++i) {
    const SweepResult& x = r.fitting[i];
    std::string plan = x.plan;
    if (!x.setup.stage_layers.empty())
      plan = "layers per stage " + format_partition(x.setup.stage_layers) + "; " + plan;
    std::snprintf(
        line, sizeof line,
        "%4zu %4lld %3lld %4lld %2lld %4lld %5d %4lld %5lld %10.3f %11.0f %5.1f%% %10.2f  ", i + 1,
        static_cast<long long>(x.setup.tp), static_cast<long long>(x.setup.cp),
        static_cast<long long>(x.setup.pp), static_cast<long long>(x.setup.virtual_stages),
        static_cast<long long>(x.setup.dp), x.setup.zero,
        static_cast<long long>(x.setup.micro_batch), static_cast<long long>(x.setup.microbatches),
        x.step_seconds, x.tokens_per_second, 100 * x.mfu, static_cast<double>(x.peak_bytes) / kGiB);
    out += line + plan + "\n";
  }
  return out;
}

nlohmann::json sweep_json(const SweepReport& r, const ModelSpec& m, const SweepOptions& o,
                          size_t top) {
  nlohmann::json best = nlohmann::json::array();
  for (size_t i = 0; i < r.fitting.size() && i < top; ++i) {
    const SweepResult& x = r.fitting[i];
    best.push_back({{"setup", setup_to_json(x.setup)},
                    {"step_seconds", x.step_seconds},
                    {"tokens_per_second", x.tokens_per_second},
                    {"mfu", x.mfu},
                    {"recompute_seconds", x.recompute_seconds},
                    {"peak_bytes", x.peak_bytes},
                    {"plan", x.plan}});
  }
  return {{"model", m.name},
          {"gpus", o.gpus},
          {"budget_bytes", o.budget},
          {"evaluated", r.evaluated},
          {"fitting", r.fitting.size()},
          {"invalid", r.invalid},
          {"seconds", r.seconds},
          {"top", best}};
}

}  // namespace np
