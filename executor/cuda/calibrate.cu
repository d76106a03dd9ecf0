// The microbenchmarks of `nanoplan calibrate` (calibrate.hpp): cuBLAS bf16 GEMMs through the
// backend's linear_forward, its flash attention kernels forward and backward, and a device copy.
#include "executor/cuda/calibrate.hpp"

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <vector>

#include "executor/cuda/kernels.hpp"
#include "executor/cuda/timing.hpp"

namespace np::cuda {
namespace {

using exec::Tensor;

using Buffer = DeviceBuffer;

// Median seconds of `reps` runs of f after `warmup` runs. The emulation's events can measure 0 for
// a short call: a floor of 1 ns keeps the rates finite.
double seconds(const std::function<void()>& f, int warmup, int reps) {
  return std::max(1e-9, 1e-3 * median_ms(f, warmup, reps));
}

std::string device_name() {
#if defined(NANOPLAN_CUDA_EMULATION)
  return "the CUDA emulation (host code; its figures mean nothing)";
#else
  int d = 0;
  cudaDeviceProp p{};
  NP_CUDA_CHECK(cudaGetDevice(&d));
  NP_CUDA_CHECK(cudaGetDeviceProperties(&p, d));
  return p.name;
#endif
}

Calibration run(const CalibrateOptions& o) {
  Calibration c;
  c.device = device_name();
  size_t free_bytes = 0, total_bytes = 0;
  NP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  c.memory_bytes = static_cast<int64_t>(total_bytes);
  const int w = o.warmup, r = o.repetitions;

  cublasHandle_t blas;
  NP_CUBLAS_CHECK(cublasCreate(&blas));
  constexpr int64_t kWorkspace = int64_t{32} << 20;  // PyTorch's cuBLAS workspace on Hopper
  Buffer ws({kWorkspace}, Dtype::kU8, 1);
  NP_CUBLAS_CHECK(cublasSetWorkspace(blas, ws.t.data, static_cast<size_t>(kWorkspace)));
  try {
    uint32_t seed = 2;
    for (const auto& [m, n, k] : o.gemm) {
      Buffer x({m, k}, Dtype::kBf16, seed++), wt({n, k}, Dtype::kBf16, seed++),
          y({m, n}, Dtype::kBf16, seed++);
      double s = seconds([&] { linear_forward(blas, x.t, wt.t, nullptr, y.t, nullptr); }, w, r);
      c.gemm.push_back({m, n, k, 2.0 * static_cast<double>(m) * static_cast<double>(n) *
                                     static_cast<double>(k) / s});
    }
  } catch (...) {
    cublasDestroy(blas);
    throw;
  }
  cublasDestroy(blas);

  const int64_t d = o.head_dim;
  for (const auto& [seq, heads] : o.attention) {
    // [q | k | v] rows of one sequence, as many K/V heads as query heads.
    AttentionShape a{1, seq, heads, heads, d};
    const int64_t width = 3 * heads * d;
    Buffer qkv({seq, width}, Dtype::kBf16, 10), out({seq, heads * d}, Dtype::kBf16, 11),
        lse({1, heads, seq}, Dtype::kFp32, 12), dout({seq, heads * d}, Dtype::kBf16, 13),
        dqkv({seq, width}, Dtype::kBf16, 14), dq({seq, heads * d}, Dtype::kFp32, 15),
        rowsum({1, heads, seq}, Dtype::kFp32, 16);
    const double work = 4.0 * static_cast<double>(seq) * static_cast<double>(seq) *
                        static_cast<double>(heads) * static_cast<double>(d);
    double f = seconds([&] { flash_attention_forward(a, qkv.t, out.t, lse.t, nullptr); }, w, r);
    double b = seconds(
        [&] {
          flash_attention_backward(a, qkv.t, out.t, lse.t, dout.t, dqkv.t, false, dq.t, rowsum.t,
                                   nullptr);
        },
        w, r);
    c.attention.push_back({seq, heads, work / f, 2.5 * work / b});
  }

  if (o.copy_bytes > 0) {
    Buffer a({o.copy_bytes}, Dtype::kU8, 20), b({o.copy_bytes}, Dtype::kU8, 21);
    double s = seconds(
        [&] {
          NP_CUDA_CHECK(cudaMemcpyAsync(b.t.data, a.t.data, static_cast<size_t>(o.copy_bytes),
                                        cudaMemcpyDeviceToDevice, nullptr));
        },
        w, r);
    c.copy_bytes_per_s = 2.0 * static_cast<double>(o.copy_bytes) / s;
  }
  {
    // 100 launches of a one-element add back to back, per launch.
    Buffer a({1}, Dtype::kBf16, 22), b({1}, Dtype::kBf16, 23), y({1}, Dtype::kBf16, 24);
    constexpr int kLaunches = 100;
    double s = seconds(
        [&] {
          for (int i = 0; i < kLaunches; ++i) add(a.t, b.t, y.t, nullptr);
        },
        w, r);
    c.kernel_overhead_s = s / kLaunches;
  }
  return c;
}

}  // namespace

Result<Calibration> calibrate(const CalibrateOptions& o) {
  try {
    return run(o);
  } catch (const std::exception& e) {
    return make_error(std::string("calibrate: ") + e.what());
  }
}

}  // namespace np::cuda
