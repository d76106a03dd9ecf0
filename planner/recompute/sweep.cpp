// The setup sweep: enumerate, validate, plan, time, rank.
#include "planner/recompute/sweep.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "planner/schedule/plan_io.hpp"
#include "planner/schedule/schedule.hpp"
#include "planner/inputs/setup_flags.hpp"
#include "planner/inputs/units.hpp"

namespace np {
namespace {

std::vector<TrainSpec> candidates(const ModelSpec& m, const SweepOptions& o, size_t& invalid) {
  std::vector<TrainSpec> out;
  int64_t batch = o.global_batch > 0 ? o.global_batch : 4 * o.gpus;
  const std::vector<PpSchedule> schedules =
      o.schedules.empty() ? std::vector<PpSchedule>{o.base.pp_schedule} : o.schedules;
  std::vector<int64_t> eps = o.expert_parallel;
  if (eps.empty()) {
    eps.push_back(1);
    for (int64_t ep = 2; m.moe && ep <= std::min(o.gpus, m.moe->num_experts); ep *= 2)
      if (m.moe->num_experts % ep == 0) eps.push_back(ep);
  }
  for (int64_t tp = 1; tp <= std::min<int64_t>(o.gpus, o.hw.gpus_per_node); tp *= 2)
    for (int64_t cp : o.context_parallel)
      for (int64_t pp = 1; pp <= std::min(o.gpus / (tp * cp), m.layers); ++pp) {
        if (o.gpus % (tp * cp * pp) != 0) continue;
        int64_t dp = o.gpus / (tp * cp * pp);
        for (int zero : {0, 1, 2, 3}) {
          if (o.base.fsdp && zero > 0) continue;  // FSDP2 in place of ZeRO
          for (int64_t mbs : {1, 2, 4})
            for (int64_t v : o.virtual_stages)
              for (int64_t ep : eps)
              for (PpSchedule sched : schedules) {
              if (zero >= 1 && dp * cp == 1) continue;  // nothing to shard
              if (batch % (dp * mbs) != 0) continue;
              // Virtual stages: v = 1 runs the listed schedules; v > 1 the interleaved one with v
              // chunks per stage (pp > 1 only). Without a pipeline the schedules are one.
              if (v > 1 && pp == 1) continue;
              if ((pp == 1 || v > 1) && sched != schedules.front()) continue;
              TrainSpec t = o.base;
              t.tp = tp, t.cp = cp, t.pp = pp, t.dp = dp, t.zero = zero, t.micro_batch = mbs;
              t.ep = ep;
              t.sp = tp > 1;
              t.tp_comm_overlap = o.base.tp_comm_overlap && tp > 1;  // TE's: TP with SP only
              t.microbatches = batch / (dp * mbs);
              t.recompute = Recompute::kAuto;
              t.pp_schedule = v > 1 ? PpSchedule::kInterleaved : sched;
              t.virtual_stages = v;
              if (t.fsdp) {  // torchtitan's: micro-batches in turn without PP; units kept under PP
                if (pp == 1) t.pp_schedule = PpSchedule::k1F1B;
                t.reshard_after_forward = pp == 1;
              }
              if (validate_setup(m, t)) {
                ++invalid;
                continue;
              }
              out.push_back(t);
            }
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

// One word where the plan is uniform (the all-gather variants fold into their policy), else how
// many layers recompute something.
std::string short_recompute(const AutoPlan& p) {
  auto base = [](const std::string& name) { return name.substr(0, name.find('+')); };
  const std::string first = p.layer_policies.empty() ? "none" : base(p.layer_policies[0].name);
  size_t recomputing = 0;
  bool uniform = true;
  for (const BlockPolicy& b : p.layer_policies) {
    uniform &= base(b.name) == first;
    recomputing += base(b.name) != "none";
  }
  if (uniform && (first == "none" || first == "full" || first == "selective")) return first;
  return "mixed: " + std::to_string(recomputing) + " of " +
         std::to_string(p.layer_policies.size()) + " layers";
}

std::string schedule_name(const TrainSpec& t) {
  if (t.pp == 1) return "-";
  if (t.pp_schedule == PpSchedule::kInterleaved) return "int x" + std::to_string(t.virtual_stages);
  return name_of(t.pp_schedule);
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
      // Most setups of a large model on few GPUs cannot fit whatever they recompute: those are
      // proven so before any layer frontier is found (a sweep lists only setups that fit).
      if (!o.search_partition && cannot_fit(m, setups[i], o.runtime, o.budget)) {
        results[i] = SweepResult{.setup = setups[i]};
      } else {
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
                                 p.fits ? summary(p) : "",
                                 p.fits ? short_recompute(p) : ""};
      }
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

std::string estimate_command(const SweepResult& x, const SweepOptions& o) {
  return "nanoplan estimate --model " + o.model_arg + setup_command_flags(x.setup) +
         (o.budget_flags.empty() ? "" : " " + o.budget_flags);
}

std::string sweep_table(const SweepReport& r, const ModelSpec& m, const SweepOptions& o,
                        size_t top) {
  char line[512];
  std::string budget = format_human(o.budget + o.headroom);
  if (o.headroom > 0)
    budget += " less headroom " + format_gib(o.headroom) + " = " + format_gib(o.budget);
  std::snprintf(line, sizeof line,
                "sweep: %s on %lld GPUs, budget %s: %zu setups evaluated (%zu fit, %zu invalid "
                "skipped) in %.2f s (%.0f setups/s)\n",
                m.name.c_str(), static_cast<long long>(o.gpus), budget.c_str(), r.evaluated,
                r.fitting.size(), r.invalid, r.seconds, r.evaluated / std::max(1e-9, r.seconds));
  std::string out = line;
  if (r.fitting.empty())
    return out + "no setup fits: try more GPUs, a shorter sequence or a larger budget\n";
  out += "step times are the cost model's predictions on " + o.hw.name +
         (o.hw.origin.empty() ? "" : " (" + o.hw.origin + ")") + ", " + overlap_text(o.base) +
         "; each row's command re-runs its estimate\n  efficiencies: " + efficiency_basis(o.hw, o.base.impl) +
         "\n";
  std::snprintf(line, sizeof line,
                "%4s %3s %3s %3s %-6s %4s %3s %4s %3s %5s %6s %8s %9s %6s %8s  %s\n", "rank", "tp",
                "cp", "pp", "sched", "dp", "ep", "zero", "mbs", "m", "gbs", "step s", "tokens/s",
                "MFU", "peak GiB", "recompute");
  out += line;
  for (size_t i = 0; i < r.fitting.size() && i < top; ++i) {
    const SweepResult& x = r.fitting[i];
    std::snprintf(line, sizeof line,
                  "%4zu %3lld %3lld %3lld %-6s %4lld %3lld %4s %3lld %5lld %6lld %8.3f %9.0f %5.1f%% "
                  "%8.2f  %s\n",
                  i + 1, static_cast<long long>(x.setup.tp), static_cast<long long>(x.setup.cp),
                  static_cast<long long>(x.setup.pp), schedule_name(x.setup).c_str(),
                  static_cast<long long>(x.setup.dp), static_cast<long long>(x.setup.ep),
                  x.setup.fsdp ? "fsdp" : std::to_string(x.setup.zero).c_str(),
                  static_cast<long long>(x.setup.micro_batch),
                  static_cast<long long>(x.setup.microbatches),
                  static_cast<long long>(x.setup.micro_batch * x.setup.microbatches * x.setup.dp),
                  x.step_seconds,
                  x.tokens_per_second, 100 * x.mfu, static_cast<double>(x.peak_bytes) / kGiB,
                  x.recompute.c_str());
    out += line;
    out += "       " + estimate_command(x, o) + "\n";
  }
  return out;
}

std::string sweep_csv(const SweepReport& r, const SweepOptions& o, size_t top) {
  std::string out =
      "rank,tp,cp,pp,pp_schedule,virtual_stages,dp,ep,zero,micro_batch,microbatches,global_batch,"
      "step_seconds,tokens_per_second,mfu,peak_bytes,recompute,command\n";
  char line[256];
  for (size_t i = 0; i < r.fitting.size() && i < top; ++i) {
    const SweepResult& x = r.fitting[i];
    const TrainSpec& t = x.setup;
    std::snprintf(line, sizeof line,
                  "%zu,%lld,%lld,%lld,%s,%lld,%lld,%lld,%d,%lld,%lld,%lld,%.6f,%.1f,%.4f,%lld,",
                  i + 1, static_cast<long long>(t.tp), static_cast<long long>(t.cp),
                  static_cast<long long>(t.pp), name_of(t.pp_schedule),
                  static_cast<long long>(t.virtual_stages), static_cast<long long>(t.dp),
                  static_cast<long long>(t.ep), t.zero, static_cast<long long>(t.micro_batch),
                  static_cast<long long>(t.microbatches),
                  static_cast<long long>(t.micro_batch * t.microbatches * t.dp),
                  x.step_seconds, x.tokens_per_second, x.mfu,
                  static_cast<long long>(x.peak_bytes));
    // Quoted fields (RFC 4180): the summary and the command contain commas or spaces.
    auto quoted = [](const std::string& v) {
      std::string q = "\"";
      for (char ch : v) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
      return q + "\"";
    };
    out += line + quoted(x.recompute) + "," + quoted(estimate_command(x, o)) + "\n";
  }
  return out;
}

nlohmann::json sweep_json(const SweepReport& r, const ModelSpec& m, const SweepOptions& o,
                          size_t top) {
  nlohmann::json best = nlohmann::json::array();
  for (size_t i = 0; i < r.fitting.size() && i < top; ++i) {
    const SweepResult& x = r.fitting[i];
    best.push_back({{"setup", setup_to_json(x.setup)},
                    {"global_batch", x.setup.micro_batch * x.setup.microbatches * x.setup.dp},
                    {"step_seconds", x.step_seconds},
                    {"tokens_per_second", x.tokens_per_second},
                    {"mfu", x.mfu},
                    {"recompute_seconds", x.recompute_seconds},
                    {"peak_bytes", x.peak_bytes},
                    {"recompute", x.recompute},
                    {"plan", x.plan},
                    {"command", estimate_command(x, o)}});
  }
  return {{"model", m.name},
          {"gpus", o.gpus},
          {"budget_bytes", o.budget + o.headroom},
          {"headroom_bytes", o.headroom},
          {"usable_bytes", o.budget},
          {"evaluated", r.evaluated},
          {"fitting", r.fitting.size()},
          {"invalid", r.invalid},
          {"seconds", r.seconds},
          {"top", best}};
}

}  // namespace np
