// Timing device work, for the CUDA backend's microbenchmarks (tools/bench_kernels, `nanoplan
// calibrate`): device tensors of random values and the median of event-timed repetitions. Built
// with nvcc or the host compiler against CUDA's runtime, and in the emulation.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "executor/cuda/kernels.hpp"
#include "executor/tensor.hpp"

namespace np::cuda {

// A device tensor of random values in [-1, 1) (never zeros: some kernels run faster on zeros);
// bytes (u8, e.g. a cuBLAS workspace) are set to one non-zero value.
struct DeviceBuffer {
  exec::Tensor t;
  DeviceBuffer(std::vector<int64_t> shape, Dtype d, uint32_t seed) {
    t.type = {std::move(shape), d};
    NP_CUDA_CHECK(cudaMalloc(&t.data, static_cast<size_t>(t.bytes())));
    if (d == Dtype::kU8) {  // store() writes bf16 and fp32 only
      NP_CUDA_CHECK(cudaMemset(t.data, 0x5a, static_cast<size_t>(t.bytes())));
      return;
    }
    std::vector<uint8_t> host(static_cast<size_t>(t.bytes()));
    exec::Tensor h{host.data(), t.type};
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int64_t i = 0; i < t.numel(); ++i) exec::store(h, i, u(rng));
    NP_CUDA_CHECK(cudaMemcpy(t.data, host.data(), host.size(), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(t.data); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// Median milliseconds of `reps` runs of f after `warmup` runs, each between two events on the
// default stream.
inline double median_ms(const std::function<void()>& f, int warmup = 3, int reps = 10) {
  cudaEvent_t a, b;
  NP_CUDA_CHECK(cudaEventCreate(&a));
  NP_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) f();
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    NP_CUDA_CHECK(cudaEventRecord(a, nullptr));
    f();
    NP_CUDA_CHECK(cudaEventRecord(b, nullptr));
    NP_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    NP_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  NP_CUDA_CHECK(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace np::cuda
