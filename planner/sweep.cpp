// The setup sweep: enumerate, validate, plan, time, rank.
#include "planner/sweep.hpp"

#include <algorithm>
#include <chrono>

namespace np {
namespace {

std::vector<TrainSpec> candidates(const ModelSpec& m, const SweepOptions& o, size_t& invalid) {
  std::vector<TrainSpec> out;
  int64_t batch = o.global_batch > 0 ? o.global_batch : 4 * o.gpus;
  for (int64_t tp = 1; tp <= std::min<int64_t>(o.gpus, o.hw.gpus_per_node); tp *= 2)
    for (int64_t pp = 1; pp <= std::min(o.gpus / tp, m.layers); ++pp) {
      if (o.gpus % (tp * pp) != 0) continue;
      int64_t dp = o.gpus / (tp * pp);
      for (int zero : {0, 1})
        for (int64_t mbs : {1, 2, 4}) {
          if (zero == 1 && dp == 1) continue;  // nothing to shard
          if (batch % (dp * mbs) != 0) continue;
          TrainSpec t = o.base;
          t.tp = tp, t.pp = pp, t.dp = dp, t.zero = zero, t.micro_batch = mbs, t.sp = tp > 1;
          t.microbatches = batch / (dp * mbs);
          t.recompute = Recompute::kAuto;
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
    auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == b.name; });
    if (it == counts.end()) counts.push_back({b.name, 1});
    else ++it->second;
  }
  std::sort(counts.begin(), counts.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string s;
  for (size_t i = 0; i < counts.size(); ++i) s += (i ? ", " : "") + std::to_string(counts[i].second) + " x " + counts[i].first;
  return s;
}

}  // namespace

SweepReport sweep(const ModelSpec& m, const SweepOptions& o, const std::function<void(size_t, size_t)>& progress) {
  auto start = std::chrono::steady_clock::now();
  SweepReport r;
  std::vector<TrainSpec> setups = candidates(m, o, r.invalid);
  FrontierCache cache;
  for (size_t i = 0; i < setups.size(); ++i) {
    AutoPlan p = auto_plan(m, setups[i], o.runtime, o.budget, o.hw, {.closest_when_infeasible = false, .compare_uniform = false, .cache = &cache, .full_schedule = false});
    ++r.evaluated;
    if (progress) progress(i + 1, setups.size());
    if (!p.fits) {
      ++r.not_fitting;
      continue;
    }
    r.fitting.push_back({setups[i], true, p.time.seconds, p.time.tokens_per_second, p.time.mfu, p.time.recompute_seconds,
                         p.estimate.peak_bytes, summary(p)});
  }
  std::stable_sort(r.fitting.begin(), r.fitting.end(),
                   [](const SweepResult& a, const SweepResult& b) { return a.tokens_per_second > b.tokens_per_second; });
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace np
