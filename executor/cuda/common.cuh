// Device-side helpers shared by the kernel files: a tensor as kernels see it (pointer and dtype),
// element loads and stores in fp32, and launch sizing.
#pragma once
#include "executor/cuda/kernels.hpp"

namespace np::cuda {

constexpr int kThreads = 128;  // threads per block of the elementwise and per-row kernels

struct View {
  void* p;
  bool bf16;
};
inline View view(const Tensor& t) { return {t.data, t.type.dtype == Dtype::kBf16}; }

__device__ __forceinline__ float ld(View v, long long i) {
  return v.bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(v.p)[i])
                : static_cast<const float*>(v.p)[i];
}
__device__ __forceinline__ void st(View v, long long i, float x) {
  if (v.bf16)
    static_cast<__nv_bfloat16*>(v.p)[i] = __float2bfloat16(x);
  else
    static_cast<float*>(v.p)[i] = x;
}

// Reductions over a block of kThreads threads: warp shuffles, then one value per warp in shared
// memory (kThreads / 32 floats of the launch's dynamic shared memory). Every thread gets the
// result. Launches using them pass kReduceShared bytes.
constexpr size_t kReduceShared = kThreads / 32 * sizeof(float);

struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename Op>
__device__ inline float block_reduce(float v, Op op) {
  for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  float* warp_values = np_shared<float>();
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_values[warp] = v;
  __syncthreads();
  float r = warp_values[0];
  for (int w = 1; w < kThreads / 32; ++w) r = op(r, warp_values[w]);
  __syncthreads();  // the slots may be reused by the next reduction
  return r;
}
__device__ inline float block_sum(float v) { return block_reduce(v, SumOp{}); }
__device__ inline float block_max(float v) { return block_reduce(v, MaxOp{}); }

using exec::slice;  // sub-tensor views (executor/tensor.hpp)

inline unsigned blocks_for(long long n) {
  return static_cast<unsigned>((n + kThreads - 1) / kThreads);
}

inline void need(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("cuda kernels: ") + what);
}

}  // namespace np::cuda
