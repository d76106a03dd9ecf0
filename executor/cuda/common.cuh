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

inline unsigned blocks_for(long long n) {
  return static_cast<unsigned>((n + kThreads - 1) / kThreads);
}

inline void need(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("cuda kernels: ") + what);
}

}  // namespace np::cuda
