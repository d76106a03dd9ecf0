// Benchmark (not a test): wall time of one training step of a small Llama on the CPU reference
// executor, and where the time goes (per op kind and phase, summed over ranks).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "executor/cpu/cpu_backend.hpp"
#include "executor/runner.hpp"

int main() {
  np::ModelSpec m;
  m.name = "bench-llama";
  m.hidden = 512, m.ffn = 1376, m.layers = 4, m.heads = 8, m.kv_heads = 4, m.head_dim = 64;
  m.vocab = 4096, m.max_positions = 1024;
  struct Case {
    int64_t tp, pp;
    np::Recompute rc;
  };
  std::printf(
      "small llama: hidden %lld, %lld layers, heads %lld/%lld, ffn %lld, vocab %lld; seq 512, 2 "
      "micro-batches of 1\n",
      (long long)m.hidden, (long long)m.layers, (long long)m.heads, (long long)m.kv_heads,
      (long long)m.ffn, (long long)m.vocab);
  for (Case c : {Case{1, 1, np::Recompute::kNone}, Case{1, 1, np::Recompute::kFull},
                 Case{2, 1, np::Recompute::kNone}, Case{2, 2, np::Recompute::kNone}}) {
    np::TrainSpec t;
    t.tp = c.tp, t.pp = c.pp, t.sp = c.tp > 1, t.seq_len = 512, t.microbatches = 2,
    t.recompute = c.rc;
    np::Schedule s = np::build_schedule(m, t);
    np::exec::RunOptions o;
    o.steps = 3;  // the profile and the time are of the last step
    o.profile = true;
    auto start = std::chrono::steady_clock::now();
    auto r = np::exec::run_schedule(
        s, [] { return np::exec::make_cpu_backend(); }, o);
    double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!r) {
      std::fprintf(stderr, "%s\n", r.error().message.c_str());
      return 1;
    }
    double sum = 0;
    std::vector<std::pair<double, std::string>> parts;
    for (auto& [k, v] : r->profile) sum += v, parts.push_back({v, k});
    std::sort(parts.rbegin(), parts.rend());
    std::printf(
        "\ntp %lld pp %lld recompute %s: 3 steps in %.2f s; last step %.3f rank-seconds, loss "
        "%.4f\n",
        (long long)c.tp, (long long)c.pp, np::name_of(c.rc), total, sum, r->losses.back());
    for (size_t i = 0; i < std::min<size_t>(8, parts.size()); ++i)
      std::printf("  %5.1f%%  %-32s %.3f s\n", 100 * parts[i].first / sum, parts[i].second.c_str(),
                  parts[i].first);
  }
  return 0;
}
