// The CUDA tests built against the nvcc-built library (label gpu): without a usable GPU every test
// skips, with the CUDA runtime's reason, and never passes without running. In the emulation build
// this adds nothing.
#pragma once
#include <gtest/gtest.h>

#ifndef NANOPLAN_CUDA_EMULATION
#include "executor/cuda/device.hpp"

namespace np::testing {
class NeedsGpu : public ::testing::Environment {
 public:
  void SetUp() override {
    np::cuda::GpuProbe p = np::cuda::probe_gpus();
    if (p.count == 0) GTEST_SKIP() << "no CUDA device: " << p.why;
  }
};
inline ::testing::Environment* const kNeedsGpu = ::testing::AddGlobalTestEnvironment(new NeedsGpu);
}  // namespace np::testing
#endif
