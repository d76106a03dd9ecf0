// Run under mpirun by tests/cli_mpi.sh: the tiny Llama at tp 2 x pp 2, one process per rank, two
// steps, against the in-process run on process 0: every rank event-exact, and the losses and every
// first-step gradient bitwise equal. Prints one line; exit 0 when all hold, 1 otherwise.
#include <cstdio>
#include <cstring>

#include "executor/comm/mpi.hpp"
#include "executor/compare.hpp"
#include "executor/cpu/cpu_backend.hpp"
#include "test_util.hpp"

int main(int argc, char** argv) {
  using namespace np;
  exec::mpi::Process p = exec::mpi::init(&argc, &argv);
  Scenario sc = np::testing::scenario("tiny-llama");
  TrainSpec t = sc.base;
  t.tp = 2, t.pp = 2, t.sp = true, t.pp_schedule = PpSchedule::k1F1B, t.recompute = Recompute::kSelective;
  Schedule s = build_schedule(sc.model, t);
  exec::RunOptions o;
  o.steps = 2;
  o.capture_grads = true;
  auto factory = [] { return exec::make_cpu_backend(); };
  auto r = exec::mpi::run_schedule(s, factory, o);
  int code = 0;
  if (!r) {
    std::fprintf(stderr, "mpi_grads: %s\n", r.error().message.c_str());
    code = 1;
  } else if (r->has_value()) {
    const exec::RunResult& mpi = **r;
    auto ref = exec::run_schedule(s, factory, o);
    exec::RunComparison c = exec::compare(s, mpi, "mpi");
    size_t same = 0;
    bool equal = ref.ok() && c.all_equal && mpi.losses.size() == ref->losses.size() &&
                 std::memcmp(mpi.losses.data(), ref->losses.data(), ref->losses.size() * sizeof(double)) == 0 &&
                 mpi.grads.size() == ref->grads.size() && !ref->grads.empty();
    for (const auto& [key, g] : ref.ok() ? ref->grads : decltype(mpi.grads){}) {
      auto it = mpi.grads.find(key);
      bool eq = it != mpi.grads.end() && it->second.size() == g.size() &&
                std::memcmp(it->second.data(), g.data(), g.size() * sizeof(float)) == 0;
      same += eq;
      equal = equal && eq;
    }
    std::printf("%s: %zu processes event-exact %s, losses and %zu of %zu gradient tensors bitwise "
                "equal to the in-process run\n",
                equal ? "ok" : "MISMATCH", static_cast<size_t>(p.size), c.all_equal ? "yes" : "no",
                same, ref.ok() ? ref->grads.size() : size_t{0});
    code = equal ? 0 : 1;
  }
  code = exec::mpi::broadcast_exit_code(code);
  exec::mpi::finalize();
  return code;
}
