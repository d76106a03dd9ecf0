// --backend's choice (backend_choice.hpp).
#include "executor/backend_choice.hpp"

#include <cstdlib>

#include "executor/cpu/cpu_backend.hpp"
#include "planner/inputs/units.hpp"

namespace np::exec {

Result<Executor> choose_executor(std::string_view backend) {
  if (backend != "cpu" && backend != "cuda" && backend != "auto")
    return make_error("invalid --backend " + quote_input(backend) + " (valid: cpu, cuda, auto)");
  Executor cpu{[] { return make_cpu_backend(); }, in_process_world(), host_transfer()};
  if (backend == "cpu") return cpu;
  Result<const cuda::Module*> module = cuda::load_module();
  std::string why;
  if (module) {
    const cuda::Module& m = **module;
    cuda::GpuProbe gpus = m.probe_gpus();
    if (gpus.count > 0) {
      if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK"))
        m.select_device(std::atoi(local));
      return Executor{m.make_backend, m.virtual_rank_world(), m.device_transfer(), true, &m, ""};
    }
    why = "no GPU: " + gpus.why;
  } else {
    why = module.error().message;
  }
  if (backend == "cuda") return make_error("--backend cuda: " + why + " (valid here: cpu, auto)");
  cpu.fallback = why;
  return cpu;
}

}  // namespace np::exec
