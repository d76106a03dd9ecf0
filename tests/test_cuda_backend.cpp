// The CUDA backend end to end through the CUDA emulation: a tiny Llama across TP, SP, PP and the
// recompute policies, with the event-exact comparison (every allocation and release as the plan
// predicts), the loss near the CPU reference's, and loss and gradients bitwise identical across
// recompute policies (recomputation regenerates exactly what the forward produced).
#include <gtest/gtest.h>

#include <cstring>

#include "executor/compare.hpp"
#include "executor/cpu/cpu_backend.hpp"
#include "executor/cuda/cuda_backend.hpp"
#include "executor/runner.hpp"
#include "test_util.hpp"

namespace np::exec {
namespace {

RunResult run(const Schedule& s, bool cuda) {
  RunOptions o;
  o.steps = 1;
  o.capture_grads = true;
  auto r = run_schedule(s, cuda ? BackendFactory([] { return cuda::make_cuda_backend(); })
                                : BackendFactory([] { return make_cpu_backend(); }),
                        o);
  if (!r) throw std::runtime_error(r.error().message);
  return *r;
}

TEST(CudaBackend, TinyLlamaEventExactAndRecomputeInvariant) {
  Scenario sc = testing::scenario("tiny-llama");
  struct Case {
    int64_t tp, pp;
    bool sp;
  };
  // SP with pipeline stages; and TP without SP (the column-parallel backward's all-reduce). The
  // emulation runs every CUDA thread as a fiber: a few setups keep the test to seconds.
  for (Case k : {Case{2, 2, true}, Case{2, 1, false}}) {
    std::optional<RunResult> ref;
    for (Recompute rc : {Recompute::kNone, Recompute::kFull}) {
      TrainSpec t = sc.base;
      t.tp = k.tp, t.pp = k.pp, t.sp = k.sp, t.recompute = rc, t.pp_schedule = PpSchedule::k1F1B;
      std::string what = describe_short(t);
      Schedule s = build_schedule(sc.model, t);
      RunResult r = run(s, true);
      RunComparison c = compare(s, r, what);
      EXPECT_TRUE(c.all_equal) << comparison_table(c);
      RunResult cpu = run(s, false);
      ASSERT_EQ(r.losses.size(), cpu.losses.size());
      for (size_t i = 0; i < r.losses.size(); ++i)
        EXPECT_NEAR(r.losses[i], cpu.losses[i], 2e-2 * cpu.losses[i]) << what << " step " << i;
      if (!ref) {
        ref = r;
        continue;
      }
      EXPECT_EQ(std::memcmp(&r.losses[0], &ref->losses[0], sizeof(double)), 0) << what;
      for (const auto& [key, g] : ref->grads) {
        const std::vector<float>& h = r.grads.at(key);
        ASSERT_EQ(h.size(), g.size()) << key;
        EXPECT_EQ(std::memcmp(h.data(), g.data(), g.size() * sizeof(float)), 0) << key << " " << what;
      }
    }
  }
}

}  // namespace
}  // namespace np::exec
