// libnanoplan_cuda.so's one exported symbol: the table of the CUDA backend's entry points
// (module.hpp). Built over executor_cuda (nvcc), and over executor_cuda_emu as the emulated module
// the CLI tests load.
#include "executor/cuda/module.hpp"

#include "executor/cuda/calibrate.hpp"
#include "executor/cuda/cuda_backend.hpp"
#include "executor/cuda/transfer.hpp"
#if defined(NANOPLAN_HAVE_NCCL)
#include "executor/cuda/nccl.hpp"
#endif

extern "C" __attribute__((visibility("default"))) const np::cuda::Module* nanoplan_cuda_module() {
  static const np::cuda::Module m = [] {
    np::cuda::Module t;
    t.probe_gpus = np::cuda::probe_gpus;
    t.select_device = np::cuda::select_device;
    t.make_backend = np::cuda::make_cuda_backend;
    t.virtual_rank_world = np::cuda::virtual_rank_world;
    t.device_transfer = np::cuda::device_transfer;
    t.calibrate = np::cuda::calibrate;
#if defined(NANOPLAN_HAVE_NCCL)
    t.make_nccl_comm = np::cuda::make_nccl_comm;
#endif
    // The emulated module's collectives run over the NCCL emulation, its ranks threads.
#if defined(NANOPLAN_HAVE_NCCL) || defined(NANOPLAN_CUDA_EMULATION)
    t.calibrate_collectives = np::cuda::calibrate_collectives;
#endif
#if defined(NANOPLAN_CUDA_EMULATION)
    t.emulated = true;
#endif
    return t;
  }();
  return &m;
}
