// What runs a plan for `--backend cpu|cuda|auto`: the backend of every rank, the world connecting
// them (ranks as threads) and the transfer between the backend's memory and the host (ranks as
// processes). The CUDA backend comes from its module (executor/cuda/module.hpp), opened only here.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "executor/comm/inproc.hpp"
#include "executor/cuda/module.hpp"
#include "executor/runner.hpp"
#include "planner/inputs/result.hpp"

namespace np::exec {

struct Executor {
  BackendFactory backend;
  CommWorldFactory world;
  std::shared_ptr<Transfer> transfer;
  bool device = false;                     // the CUDA backend
  const cuda::Module* cuda = nullptr;      // its module, when device
  std::string fallback;                    // auto without a usable GPU: why the CPU executor runs
};

// cpu: the CPU reference. cuda: the CUDA backend where its module opens and finds a GPU, else the
// one-line error saying why. auto: cuda where it would run, else the CPU executor with the reason
// in `fallback`. On one GPU the ranks of a TP x PP plan run as virtual ranks sharing it; under
// mpirun each process takes GPU (local rank mod GPUs).
Result<Executor> choose_executor(std::string_view backend);

}  // namespace np::exec
