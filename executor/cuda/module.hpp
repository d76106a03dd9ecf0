// The CUDA backend as a module the executor opens at run time (dlopen), as ggml loads its
// backends: the nanoplan binaries link no CUDA library, so estimate, plan and sweep start without
// them, and `run --backend cuda` says in one line why when they cannot be loaded.
//
// libnanoplan_cuda.so (module.cpp over executor_cuda) exports one C symbol, nanoplan_cuda_module,
// that returns this table. The module carries its own copy of the planner and executor code it
// uses (linked statically, not exported); what crosses the boundary is this table and the objects
// it makes, which both sides compile from the same headers in the same build (checked by abi).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "executor/backend.hpp"
#include "executor/comm/comm.hpp"
#include "executor/comm/inproc.hpp"
#include "executor/cuda/calibrate.hpp"
#include "executor/cuda/device.hpp"
#include "planner/inputs/result.hpp"

namespace np::cuda {

// Raised whenever the table or an object crossing it changes layout.
inline constexpr int kModuleAbi = 3;

struct Module {
  int abi = kModuleAbi;
  size_t size = sizeof(Module);
  GpuProbe (*probe_gpus)() = nullptr;
  void (*select_device)(int local_rank) = nullptr;
  std::unique_ptr<exec::Backend> (*make_backend)() = nullptr;
  exec::CommWorldFactory (*virtual_rank_world)() = nullptr;
  std::shared_ptr<exec::Transfer> (*device_transfer)() = nullptr;
  // Null when the module was built without NCCL.
  std::unique_ptr<exec::Communicator> (*make_nccl_comm)(
      exec::Communicator& mpi, const std::function<void(void*, int)>& broadcast) = nullptr;
  // `nanoplan calibrate`'s microbenchmarks on the current device (calibrate.hpp).
  Result<Calibration> (*calibrate)(const CalibrateOptions&) = nullptr;
  // Its NCCL collectives over this machine's GPUs; null when the module was built without NCCL.
  Result<std::vector<CalibratedCollective>> (*calibrate_collectives)(const CollectiveOptions&) =
      nullptr;
  bool emulated = false;  // the module over the CUDA emulation (one emulated device, host code)
};

// The module's file: $NANOPLAN_CUDA_MODULE when set, else libnanoplan_cuda.so beside the running
// binary, else <prefix>/<libdir>/nanoplan/libnanoplan_cuda.so for a binary installed in <prefix>/bin.
std::string module_path();

// Opens the module at module_path() (once per path; later calls return the same table) or says
// why it cannot: not built, a CUDA library it needs not loadable (the loader's words), or a
// module from another build.
Result<const Module*> load_module();

}  // namespace np::cuda

extern "C" const np::cuda::Module* nanoplan_cuda_module();
