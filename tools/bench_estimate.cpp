// Benchmark (not a test): wall time of one full estimate (schedule build + simulation of every
// stage and the caching allocator's replay) for large setups, the auto planner and the sweep.
// Prints the median over repetitions.
//   bench_estimate [caching|expandable|exact] [estimate|plan|sweep] [MODEL]
//     the allocator model (--allocator; default caching: exact times the same work without the
//     replay), one part only (default: all three), and that part's cases of one model only
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "planner/recompute/autoplan.hpp"
#include "planner/inputs/catalog.hpp"
#include "planner/schedule/estimate.hpp"
#include "planner/recompute/sweep.hpp"

namespace {
np::RuntimeAssumptions rt;  // the allocator model from the command line

double median_ms(const np::ModelSpec& m, const np::TrainSpec& t, int reps) {
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    auto start = std::chrono::steady_clock::now();
    np::Estimate e = np::estimate(m, t, rt, {.budget = 80'000'000'000, .suggestions = false});
    auto stop = std::chrono::steady_clock::now();
    if (e.peak_bytes <= 0) std::abort();
    ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  auto allocator = np::parse_allocator_choice(argc > 1 ? argv[1] : "caching", "");
  if (!allocator) {
    std::fprintf(stderr, "bench_estimate: %s\n", allocator.error().message.c_str());
    return 2;
  }
  rt.allocator = *allocator;
  const std::string part = argc > 2 ? argv[2] : "";
  const std::string only = argc > 3 ? argv[3] : "";
  auto runs = [&](const char* name) { return part.empty() || part == name; };
  auto wanted = [&](const char* model) { return only.empty() || only == model; };
  std::printf("allocator: %s\n\n", np::name_of(rt.allocator.model));
  auto catalog = np::load_model_catalog(std::string(NANOPLAN_SOURCE_DIR) + "/models");
  if (!catalog) {
    std::fprintf(stderr, "%s\n", catalog.error().message.c_str());
    return 1;
  }
  struct Case {
    const char* model;
    int64_t tp, pp, microbatches;
    np::PpSchedule sched;
  };
  const Case cases[] = {{"llama-3.1-405b", 8, 16, 16, np::PpSchedule::kAfab},
                        {"llama-3.1-405b", 8, 16, 64, np::PpSchedule::k1F1B},
                        {"llama-3.1-70b", 8, 1, 1, np::PpSchedule::kAfab},
                        {"llama-3.1-70b", 8, 8, 8, np::PpSchedule::k1F1B}};
  if (runs("estimate"))
    std::printf("%-16s %4s %4s %6s %6s %12s\n", "model", "tp", "pp", "mb", "sched", "median ms");
  for (const Case& c : cases) {
    if (!runs("estimate")) break;
    if (!wanted(c.model)) continue;
    np::ModelSpec m = *np::resolve_model(*catalog, c.model);
    np::TrainSpec t;
    t.tp = c.tp, t.pp = c.pp, t.sp = true, t.microbatches = c.microbatches, t.pp_schedule = c.sched;
    std::printf("%-16s %4lld %4lld %6lld %6s %12.2f\n", c.model, (long long)c.tp, (long long)c.pp,
                (long long)c.microbatches, np::name_of(c.sched), median_ms(m, t, 15));
  }
  // The auto planner (frontier, per-stage solve, verification by simulation, step times) as
  // `nanoplan estimate` runs it: the simulation's schedule, none of every micro-batch (which
  // `nanoplan plan -o` builds on top, for the plan file).
  struct Plan {
    const char* model;
    int64_t tp, pp, microbatches;
    int64_t budget;
    int64_t ep = 1, dp = 1;  // MoE: experts over ep, carved out of dp
  };
  const Plan plans[] = {{"llama-3.1-70b", 8, 8, 8, 80'000'000'000},
                        {"llama-3.1-405b", 8, 16, 16, 80'000'000'000},
                        {"llama-3.1-70b", 8, 1, 1, 170'000'000'000},
                        {"qwen3-235b-a22b", 1, 8, 16, 80'000'000'000, 8, 8},
                        {"qwen3-30b-a3b", 2, 1, 1, 80'000'000'000, 4, 4},
                        // DeepSeek-V3's own training: pp 16, ep 64, no tp (its report, 3.2)
                        {"deepseek-v3", 1, 16, 32, 80'000'000'000, 64, 128},
                        {"deepseek-v3", 8, 16, 32, 80'000'000'000, 8, 8},
                        {"deepseek-v3", 8, 8, 16, 80'000'000'000, 8, 8}};
  if (runs("plan"))
    std::printf("\n%-16s %4s %4s %4s %6s %10s %8s %12s\n", "auto plan", "tp", "pp", "ep", "mb",
                "budget", "fits", "median ms");
  for (const Plan& c : plans) {
    if (!runs("plan")) break;
    if (!wanted(c.model)) continue;
    np::ModelSpec m = *np::resolve_model(*catalog, c.model);
    np::TrainSpec t;
    t.tp = c.tp, t.pp = c.pp, t.sp = c.tp > 1, t.microbatches = c.microbatches,
    t.pp_schedule = np::PpSchedule::k1F1B;
    t.ep = c.ep, t.dp = c.dp, t.zero = c.dp > 1 ? 1 : 0;
    t.recompute = np::Recompute::kAuto;
    std::vector<double> ms;
    bool fits = false;
    for (int i = 0; i < 5; ++i) {
      auto start = std::chrono::steady_clock::now();
      np::AutoPlan p =
          np::auto_plan(m, t, rt, c.budget, np::default_hardware(), {.full_schedule = false});
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
      fits = p.fits;
    }
    std::sort(ms.begin(), ms.end());
    std::printf("%-16s %4lld %4lld %4lld %6lld %9lldG %8s %12.2f\n", c.model, (long long)c.tp,
                (long long)c.pp, (long long)c.ep, (long long)c.microbatches,
                (long long)(c.budget / 1000000000), fits ? "yes" : "no", ms[ms.size() / 2]);
  }
  // The sweep as `nanoplan sweep --model M --gpus N --budget 80GB` runs it (1F1B, one worker
  // thread per core): setups evaluated per second, median of 5.
  struct Sweep {
    const char* model;
    int64_t gpus;
    bool partition;           // --partition auto
    bool interleaved = false;  // --virtual-stages 1,2,4
    int runs = 5;              // the median of this many (the slow MoE sweeps: one)
  };
  const Sweep sweeps[] = {{"llama-3.1-70b", 64, false},
                          {"llama-3.1-405b", 256, false},
                          {"mixtral-8x7b", 16, false},
                          {"llama-3.1-70b", 64, true},
                          {"llama-3.1-70b", 64, false, true},
                          {"qwen3-30b-a3b", 16, false, false, 1}};
  if (runs("sweep"))
    std::printf("\n%-16s %6s %10s %8s %8s %10s\n", "sweep", "gpus", "partition", "chunks",
                "setups", "setups/s");
  for (const Sweep& c : sweeps) {
    if (!runs("sweep")) break;
    if (!wanted(c.model)) continue;
    np::SweepOptions o;
    o.gpus = c.gpus, o.budget = 80'000'000'000, o.hw = np::default_hardware();
    o.runtime = rt;
    o.search_partition = c.partition;
    if (c.interleaved) o.virtual_stages = {1, 2, 4};
    o.base.pp_schedule = np::PpSchedule::k1F1B;
    o.base.recompute = np::Recompute::kAuto;
    std::vector<double> rate;
    size_t n = 0;
    for (int i = 0; i < c.runs; ++i) {
      np::SweepReport r = np::sweep(*np::resolve_model(*catalog, c.model), o);
      n = r.evaluated;
      rate.push_back(static_cast<double>(r.evaluated) / r.seconds);
    }
    std::sort(rate.begin(), rate.end());
    std::printf("%-16s %6lld %10s %8s %8zu %10.0f\n", c.model, (long long)c.gpus,
                c.partition ? "auto" : "balanced", c.interleaved ? "1,2,4" : "1", n,
                rate[rate.size() / 2]);
  }
  return 0;
}
