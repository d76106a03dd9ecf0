// The optimizer step as one fused kernel per parameter group (AdamW with bias corrections, or SGD),
// and the element copy between dtypes that the runner uses to move weights and gradients.
#include "executor/cuda/common.cuh"

namespace np::cuda {
namespace {

// The CPU reference's arithmetic, in the same fp32 order: m, v, then the master weight. Every
// operation rounds on its own (the _rn intrinsics), so nvcc cannot contract a multiply and an add
// into one FMA: the result is the CPU reference's bit for bit.
__global__ void adamw_kernel(View grad, float* master, float* m, float* v, long long n, float lr,
                             float beta1, float beta2, float eps, float weight_decay, float c1,
                             float c2) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  float g = ld(grad, i);
  m[i] = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(1 - beta1, g));
  v[i] = __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(__fmul_rn(1 - beta2, g), g));
  float step = __fdiv_rn(__fdiv_rn(m[i], c1), __fadd_rn(__fsqrt_rn(__fdiv_rn(v[i], c2)), eps));
  master[i] = __fsub_rn(master[i], __fmul_rn(lr, __fadd_rn(step, __fmul_rn(weight_decay, master[i]))));
}

__global__ void sgd_kernel(View grad, float* master, long long n, float lr) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) master[i] = __fsub_rn(master[i], __fmul_rn(lr, ld(grad, i)));
}

__global__ void copy_kernel(View dst, long long dst_offset, View src, long long src_offset,
                            long long n) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) st(dst, dst_offset + i, ld(src, src_offset + i));
}

}  // namespace

void adamw_step(const Tensor& grad, const Tensor& master, const Tensor& m, const Tensor& v,
                float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                cudaStream_t stream) {
  long long n = master.numel();
  need(grad.numel() == n && m.numel() == n && v.numel() == n &&
           master.type.dtype == Dtype::kFp32 && m.type.dtype == Dtype::kFp32 &&
           v.type.dtype == Dtype::kFp32,
       "adamw: gradient, master and moments must have one size; master and moments fp32");
  if (n == 0) return;
  // Bias corrections on the host, as the CPU reference computes them (fp32 pow).
  float c1 = 1.0f - std::pow(beta1, static_cast<float>(step + 1)),
        c2 = 1.0f - std::pow(beta2, static_cast<float>(step + 1));
  np_launch(adamw_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(grad),
            master.as<float>(), m.as<float>(), v.as<float>(), n, lr, beta1, beta2, eps,
            weight_decay, c1, c2);
  NP_CUDA_CHECK_LAUNCH();
}

void sgd_step(const Tensor& grad, const Tensor& master, float lr, cudaStream_t stream) {
  long long n = master.numel();
  need(grad.numel() == n && master.type.dtype == Dtype::kFp32, "sgd: sizes or dtype differ");
  if (n == 0) return;
  np_launch(sgd_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(grad),
            master.as<float>(), n, lr);
  NP_CUDA_CHECK_LAUNCH();
}

void copy_elements(const Tensor& dst, long long dst_offset, const Tensor& src,
                   long long src_offset, long long n, cudaStream_t stream) {
  need(dst_offset >= 0 && src_offset >= 0 && n >= 0 && dst_offset + n <= dst.numel() &&
           src_offset + n <= src.numel(),
       "copy_elements: range out of bounds");
  if (n == 0) return;
  np_launch(copy_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(dst), dst_offset,
            view(src), src_offset, n);
  NP_CUDA_CHECK_LAUNCH();
}

}  // namespace np::cuda
