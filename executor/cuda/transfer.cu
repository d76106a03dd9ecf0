// Device memory for the in-process world (transfer.hpp): copies through cudaMemcpy (the kind
// inferred from the pointers), sums through one kernel, each complete before it returns (the
// world's host barriers order the ranks).
#include "executor/comm/inproc.hpp"
#include "executor/cuda/common.cuh"
#include "executor/cuda/transfer.hpp"

namespace np::cuda {
namespace {

// The peers' buffers, a kernel parameter indexed by rank in place (__grid_constant__: no local
// copy, so the kernels keep no stack).
struct Peers {
  const void* p[kMaxVirtualRanks];
};

// out[out_offset + i] = sum over q < n_in of ins[q][in_offset + i], in order, in fp32.
__global__ void sum_ranks_kernel(View out, long long out_offset, const __grid_constant__ Peers ins,
                                 int n_in, long long in_offset, long long n) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  float s = 0;
  for (int q = 0; q < n_in; ++q) s += ld(View{const_cast<void*>(ins.p[q]), out.bf16}, in_offset + i);
  st(out, out_offset + i, s);
}

// The same with the maximum.
__global__ void max_ranks_kernel(View out, long long out_offset, const __grid_constant__ Peers ins,
                                 int n_in, long long in_offset, long long n) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  float m = -INFINITY;
  for (int q = 0; q < n_in; ++q)
    m = fmaxf(m, ld(View{const_cast<void*>(ins.p[q]), out.bf16}, in_offset + i));
  st(out, out_offset + i, m);
}

class DeviceTransfer final : public exec::Transfer {
 public:
  // Complete when it returns: a device-to-device cudaMemcpy may still run after it returns.
  void copy(void* dst, const void* src, int64_t bytes) override {
    if (bytes <= 0) return;
    NP_CUDA_CHECK(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault));
    NP_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
  void sum(const Tensor& out, int64_t out_offset, const std::vector<const void*>& ins,
           int64_t in_offset, int64_t n) override {
    reduce(sum_ranks_kernel, out, out_offset, ins, in_offset, n);
  }
  void max(const Tensor& out, int64_t out_offset, const std::vector<const void*>& ins,
           int64_t in_offset, int64_t n) override {
    reduce(max_ranks_kernel, out, out_offset, ins, in_offset, n);
  }
  // NCCL's rule: a collective's buffers are device memory (cudaPointerGetAttributes: device or
  // managed), never pageable host memory.
  void check_collective_buffer(const void* p, const char* what) const override {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess ||
        (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)) {
      cudaGetLastError();  // clear the error a host pointer may leave
      throw std::invalid_argument(std::string("collective: ") + what +
                                  " is not device memory (NCCL takes device buffers only)");
    }
  }

 private:
  using Kernel = void (*)(View, long long, const Peers, int, long long, long long);
  static void reduce(Kernel kernel, const Tensor& out, int64_t out_offset,
                     const std::vector<const void*>& ins, int64_t in_offset, int64_t n) {
    need(ins.size() <= static_cast<size_t>(kMaxVirtualRanks),
         "virtual ranks: at most 16 ranks per TP group on one GPU");
    if (n <= 0) return;
    Peers peers{};
    for (size_t q = 0; q < ins.size(); ++q) peers.p[q] = ins[q];
    np_launch(kernel, dim3(blocks_for(n)), dim3(kThreads), 0, nullptr, view(out),
              static_cast<long long>(out_offset), peers, static_cast<int>(ins.size()),
              static_cast<long long>(in_offset), static_cast<long long>(n));
    NP_CUDA_CHECK_LAUNCH();
    NP_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
};

}  // namespace

std::shared_ptr<exec::Transfer> device_transfer() {
  return std::make_shared<DeviceTransfer>();
}

exec::CommWorldFactory virtual_rank_world() {
  std::shared_ptr<exec::Transfer> transfer = device_transfer();
  return [transfer](int64_t tp, int64_t pp, int64_t dp, int64_t cp,
                    int64_t ep) -> std::unique_ptr<exec::CommWorld> {
    if (tp > kMaxVirtualRanks || dp * cp > kMaxVirtualRanks)
      throw std::invalid_argument(
          "virtual ranks: at most 16 ranks per TP or DP group on one GPU");
    return std::make_unique<exec::InProcessWorld>(tp, pp, dp, cp, ep, transfer);
  };
}

}  // namespace np::cuda
