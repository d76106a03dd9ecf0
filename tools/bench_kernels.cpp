// Per-kernel figures of the CUDA backend on a GPU: achieved bandwidth (memory-bound kernels) or
// FLOP/s (GEMMs, attention) against two ceilings measured in the same run, a device-to-device copy
// and a large cuBLAS bf16 GEMM. Inputs are random (never zeros); each figure is the median of
// timed repetitions after warm-up, timed with CUDA events. Built only with the CUDA toolkit; run
// by tools/device_check. Prints one table (or JSON with --json).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "executor/bf16.hpp"
#include "executor/cuda/kernels.hpp"
#include "executor/cuda/timing.hpp"

namespace {

using np::Dtype;
using np::exec::Tensor;

using Buffer = np::cuda::DeviceBuffer;
using np::cuda::median_ms;
// Median milliseconds of `reps` runs of f after `warmup` runs.
double time_ms(const std::function<void()>& f, int warmup = 3, int reps = 10) {
  return median_ms(f, warmup, reps);
}

struct Row {
  std::string kernel, shape, unit;
  double ms, rate, ceiling;  // rate in GB/s or TFLOP/s; ceiling in the same unit
};

}  // namespace

int main(int argc, char** argv) {
  bool json = argc > 1 && std::strcmp(argv[1], "--json") == 0;
  if (argc > 1 && !json) {
    std::fprintf(stderr, "usage: bench_kernels [--json]\n");
    return 2;
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "bench_kernels: no CUDA device\n");
    return 2;
  }
  cublasHandle_t blas;
  NP_CUBLAS_CHECK(cublasCreate(&blas));
  Buffer ws({32 << 20}, Dtype::kU8, 1);
  NP_CUBLAS_CHECK(cublasSetWorkspace(blas, ws.t.data, 32 << 20));
  std::vector<Row> rows;
  auto gbs = [](double bytes, double ms) { return bytes / ms / 1e6; };
  auto tflops = [](double flops, double ms) { return flops / ms / 1e9; };

  // Ceilings: a 2 GiB device-to-device copy (bytes read + written) and an 8192^3 bf16 GEMM.
  const int64_t big = int64_t{1} << 30;  // bf16 elements: 2 GiB
  double copy_ceiling, gemm_ceiling;
  {
    Buffer a({big}, Dtype::kBf16, 2), b({big}, Dtype::kBf16, 3);
    double ms = time_ms([&] {
      NP_CUDA_CHECK(cudaMemcpyAsync(b.t.data, a.t.data, static_cast<size_t>(a.t.bytes()),
                                    cudaMemcpyDeviceToDevice, nullptr));
    });
    copy_ceiling = gbs(2.0 * a.t.bytes(), ms);
    rows.push_back({"copy (ceiling)", "2 GiB", "GB/s", ms, copy_ceiling, copy_ceiling});
  }
  {
    const int64_t m = 8192;
    Buffer x({m, m}, Dtype::kBf16, 4), w({m, m}, Dtype::kBf16, 5), y({m, m}, Dtype::kBf16, 6);
    double ms = time_ms([&] { np::cuda::linear_forward(blas, x.t, w.t, nullptr, y.t, nullptr); });
    gemm_ceiling = tflops(2.0 * m * m * m, ms);
    rows.push_back({"cuBLAS GEMM (ceiling)", "8192^3 bf16", "TFLOP/s", ms, gemm_ceiling, gemm_ceiling});
  }
  // Memory-bound kernels: bytes each reads and writes once.
  {
    const int64_t e = int64_t{1} << 28;
    Buffer a({e}, Dtype::kBf16, 7), b({e}, Dtype::kBf16, 8), c({e}, Dtype::kBf16, 9);
    double ms = time_ms([&] { np::cuda::add(a.t, b.t, c.t, nullptr); });
    rows.push_back({"add", "2^28 bf16", "GB/s", ms, gbs(3.0 * a.t.bytes(), ms), copy_ceiling});
  }
  {
    const int64_t r = 32768, h = 4096;
    Buffer x({r, h}, Dtype::kBf16, 10), w({h}, Dtype::kBf16, 11), y({r, h}, Dtype::kBf16, 12),
        dy({r, h}, Dtype::kBf16, 13), dx({r, h}, Dtype::kBf16, 14), dw({h}, Dtype::kFp32, 15),
        rstd({r}, Dtype::kFp32, 16);
    double ms = time_ms([&] { np::cuda::rmsnorm_forward(x.t, w.t, y.t, nullptr, 1e-5f, nullptr); });
    rows.push_back({"rmsnorm forward", "32768 x 4096", "GB/s", ms, gbs(2.0 * x.t.bytes(), ms), copy_ceiling});
    ms = time_ms([&] {
      np::cuda::rmsnorm_backward(x.t, w.t, dy.t, dx.t, false, dw.t, rstd.t, false, 1e-5f, nullptr);
    });
    rows.push_back({"rmsnorm backward", "32768 x 4096", "GB/s", ms, gbs(3.0 * x.t.bytes(), ms), copy_ceiling});
  }
  {
    const int64_t r = 8192, f = 14336;
    Buffer x({r, 2 * f}, Dtype::kBf16, 17), y({r, f}, Dtype::kBf16, 18);
    double ms = time_ms([&] { np::cuda::swiglu_forward(x.t, y.t, nullptr); });
    rows.push_back({"swiglu forward", "8192 x 2*14336", "GB/s", ms, gbs(1.5 * x.t.bytes(), ms), copy_ceiling});
  }
  {
    const int64_t e = int64_t{1} << 27;
    Buffer g({e}, Dtype::kBf16, 19), p({e}, Dtype::kFp32, 20), m({e}, Dtype::kFp32, 21),
        v({e}, Dtype::kFp32, 22);
    double ms = time_ms([&] {
      np::cuda::adamw_step(g.t, p.t, m.t, v.t, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, nullptr);
    });
    rows.push_back({"adamw", "2^27 params", "GB/s", ms, gbs(e * (2.0 + 6 * 4.0), ms), copy_ceiling});
  }
  // Attention at Llama-3.1-8B's shape (32 query heads, 8 key-value heads, head_dim 128), causal:
  // forward 2 b h s^2 d FLOPs, backward 2.5 times that.
  {
    const int64_t b = 1, s = 4096, hq = 32, hkv = 8, d = 128, T = b * s;
    np::cuda::AttentionShape a{b, s, hq, hkv, d};
    Buffer qkv({T, (hq + 2 * hkv) * d}, Dtype::kBf16, 23), out({T, hq * d}, Dtype::kBf16, 24),
        lse({b, hq, s}, Dtype::kFp32, 25), dout({T, hq * d}, Dtype::kBf16, 26),
        dqkv({T, (hq + 2 * hkv) * d}, Dtype::kBf16, 27), dq({T, hq * d}, Dtype::kFp32, 28),
        rowsum({b, hq, s}, Dtype::kFp32, 29);
    double fwd = 2.0 * b * hq * s * s * d;
    double ms = time_ms([&] { np::cuda::flash_attention_forward(a, qkv.t, out.t, lse.t, nullptr); }, 2, 5);
    rows.push_back({"flash attention forward", "s 4096, 32/8 heads, d 128", "TFLOP/s", ms, tflops(fwd, ms), gemm_ceiling});
    ms = time_ms([&] {
      np::cuda::flash_attention_backward(a, qkv.t, out.t, lse.t, dout.t, dqkv.t, false, dq.t,
                                         rowsum.t, nullptr);
    }, 1, 3);
    rows.push_back({"flash attention backward", "s 4096, 32/8 heads, d 128", "TFLOP/s", ms, tflops(2.5 * fwd, ms), gemm_ceiling});
  }
  cublasDestroy(blas);

  cudaDeviceProp prop{};
  NP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  if (json) {
    std::printf("{\"gpu\": \"%s\", \"kernels\": [\n", prop.name);
    for (size_t i = 0; i < rows.size(); ++i)
      std::printf("  {\"kernel\": \"%s\", \"shape\": \"%s\", \"ms\": %.4f, \"rate\": %.2f, "
                  "\"unit\": \"%s\", \"ceiling\": %.2f}%s\n",
                  rows[i].kernel.c_str(), rows[i].shape.c_str(), rows[i].ms, rows[i].rate,
                  rows[i].unit.c_str(), rows[i].ceiling, i + 1 < rows.size() ? "," : "");
    std::printf("]}\n");
    return 0;
  }
  std::printf("kernel figures on %s (median of timed runs; ceilings measured above)\n", prop.name);
  std::printf("| kernel | shape | ms | achieved | of ceiling |\n|---|---|---:|---:|---:|\n");
  for (const Row& r : rows)
    std::printf("| %s | %s | %.3f | %.1f %s | %.0f%% |\n", r.kernel.c_str(), r.shape.c_str(), r.ms,
                r.rate, r.unit.c_str(), 100.0 * r.rate / r.ceiling);
  return 0;
}
