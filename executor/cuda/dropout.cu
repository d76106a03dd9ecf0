// Dropout with the counter-based generator of executor/rng.cpp, bit for bit: keep element i iff
// u(seed, stream, global index) >= p, out = x / (1 - p) where kept. The global index does not
// depend on the TP rank or the sequence shard, so a recompute, another rank or the CPU reference
// regenerates the same mask.
#include "executor/cuda/common.cuh"

namespace np::cuda {
namespace {

__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ float counter_uniform_d(unsigned long long seed,
                                                   unsigned long long stream,
                                                   unsigned long long index) {
  unsigned long long h = mix64(mix64(mix64(seed ^ 0x9E3779B97F4A7C15ull) ^ stream) ^ index);
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

__device__ unsigned long long global_index(const DropoutLayout& l, long long i) {
  if (l.probs) {  // {b, heads_local, s, s}
    long long s = l.seq, j = i % s, r = i / s, row = r % s, hb = r / s, h = hb % l.heads_local,
              bi = hb / l.heads_local;
    long long H = l.heads_local * l.tp;
    return static_cast<unsigned long long>(((bi * H + l.tp_rank * l.heads_local + h) * s + row) * s + j);
  }
  return static_cast<unsigned long long>((l.first_row + i / l.width) * l.width + i % l.width);
}

__global__ void dropout_forward_kernel(View x, View out, unsigned char* mask, long long n, float p,
                                       unsigned long long seed, unsigned long long stream,
                                       DropoutLayout l) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  bool keep = counter_uniform_d(seed, stream, global_index(l, i)) >= p;
  mask[i] = keep ? 1 : 0;
  st(out, i, keep ? ld(x, i) / (1.0f - p) : 0.0f);
}

__global__ void dropout_backward_kernel(View dy, const unsigned char* mask, View dx, bool acc,
                                        long long n, float q) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  float g = mask[i] ? ld(dy, i) / q : 0.0f;
  st(dx, i, acc ? ld(dx, i) + g : g);
}

}  // namespace

void dropout_forward(const Tensor& x, const Tensor& out, const Tensor& mask, float p,
                     unsigned long long seed, unsigned long long stream_id,
                     const DropoutLayout& layout, cudaStream_t stream) {
  long long n = x.numel();
  need(out.numel() == n && mask.numel() == n && mask.type.dtype == Dtype::kU8 &&
           (layout.probs ? layout.seq > 0 && layout.heads_local > 0 : layout.width > 0),
       "dropout: shapes or layout do not agree");
  if (n == 0) return;
  np_launch(dropout_forward_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(x),
            view(out), mask.as<unsigned char>(), n, p, seed, stream_id, layout);
  NP_CUDA_CHECK_LAUNCH();
}

void dropout_backward(const Tensor& dy, const Tensor& mask, const Tensor& dx, bool accumulate,
                      float p, cudaStream_t stream) {
  long long n = dy.numel();
  need(mask.numel() == n && dx.numel() == n, "dropout backward: sizes differ");
  if (n == 0) return;
  np_launch(dropout_backward_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(dy),
            static_cast<const unsigned char*>(mask.data), view(dx), accumulate, n, 1.0f - p);
  NP_CUDA_CHECK_LAUNCH();
}

}  // namespace np::cuda
