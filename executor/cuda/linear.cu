// Linear layers through cuBLAS (bf16 or fp32 in, fp32 accumulation): y = x W^T (+ b) with x
// [rows, in] and W [out, in] row-major, which cuBLAS sees column-major as x^T and W^T.
#include "executor/cuda/common.cuh"

namespace np::cuda {
namespace {

cudaDataType type_of(const Tensor& t) {
  return t.type.dtype == Dtype::kBf16 ? CUDA_R_16BF : CUDA_R_32F;
}

int dim_int(long long v, const char* what) {
  if (v < 0 || v > 0x7fffffffLL)
    throw std::invalid_argument(std::string("linear: ") + what + " exceeds cuBLAS's int range");
  return static_cast<int>(v);
}

// y[r][c] += b[c] in fp32, rounded once.
__global__ void add_bias_kernel(View y, View b, long long rows, long long cols) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < rows * cols) st(y, i, ld(y, i) + ld(b, i % cols));
}

}  // namespace

// Puts the handle on `stream` only when it is on another: cublasSetStream resets the handle's
// workspace to cuBLAS's own default pool (cuBLAS documentation, cublasSetStream), which cuBLAS
// then allocates outside the caller's accounting. The backend sets its stream once, before its
// tracked workspace (cuda_backend.cu), so the GEMMs keep that workspace; PyTorch likewise sets the
// workspace again after every cublasSetStream (aten/src/ATen/cuda/CublasHandlePool.cpp).
namespace {
void use_stream(cublasHandle_t h, cudaStream_t stream) {
  cudaStream_t current = nullptr;
  NP_CUBLAS_CHECK(cublasGetStream(h, &current));
  if (current != stream) NP_CUBLAS_CHECK(cublasSetStream(h, stream));
}
}  // namespace

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B's buffer goes first.
void gemm_rows(cublasHandle_t h, long long m, long long n, long long k, const MatArg& a,
               const MatArg& b, const MatArg& c, float beta, long long batch,
               cudaStream_t stream) {
  if (m == 0 || n == 0 || batch == 0) return;
  float one = 1.0f;
  use_stream(h, stream);
  NP_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      h, b.trans ? CUBLAS_OP_T : CUBLAS_OP_N, a.trans ? CUBLAS_OP_T : CUBLAS_OP_N,
      dim_int(n, "n"), dim_int(m, "m"), dim_int(k, "k"), &one, b.p, b.bf16 ? CUDA_R_16BF : CUDA_R_32F,
      dim_int(b.ld, "ldb"), b.stride, a.p, a.bf16 ? CUDA_R_16BF : CUDA_R_32F, dim_int(a.ld, "lda"),
      a.stride, &beta, c.p, c.bf16 ? CUDA_R_16BF : CUDA_R_32F, dim_int(c.ld, "ldc"), c.stride,
      dim_int(batch, "batch"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void linear_forward(cublasHandle_t h, const Tensor& x, const Tensor& w, const Tensor* bias,
                    const Tensor& y, cudaStream_t stream) {
  long long in = w.type.shape.at(1), out = w.type.shape.at(0), rows = in ? x.numel() / in : 0;
  if (rows * in != x.numel() || y.numel() != rows * out)
    throw std::invalid_argument("linear: x, W and y do not agree");
  float one = 1.0f, zero = 0.0f;
  use_stream(h, stream);
  NP_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, dim_int(out, "out"),
                               dim_int(rows, "rows"), dim_int(in, "in"), &one, w.data, type_of(w),
                               dim_int(in, "in"), x.data, type_of(x), dim_int(in, "in"), &zero,
                               y.data, type_of(y), dim_int(out, "out"), CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
  if (bias && rows * out > 0) {
    np_launch(add_bias_kernel, dim3(blocks_for(rows * out)), dim3(kThreads), 0, stream, view(y),
              view(*bias), rows, out);
    NP_CUDA_CHECK_LAUNCH();
  }
}

void linear_backward(cublasHandle_t h, const Tensor& x, const Tensor& w, const Tensor& dy,
                     const Tensor* dx, bool add_dx, const Tensor& dw, const Tensor* db,
                     cudaStream_t stream, const Tensor* dense) {
  long long in = w.type.shape.at(1), out = w.type.shape.at(0), rows = in ? x.numel() / in : 0;
  if (dy.numel() != rows * out || dw.numel() != w.numel() || (dx && dx->numel() != x.numel()))
    throw std::invalid_argument("linear backward: shapes do not agree");
  float one = 1.0f, zero = 0.0f;
  use_stream(h, stream);
  if (dx)  // dx^T (in x rows) = W^T (in x out) dy^T (out x rows)
    NP_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, dim_int(in, "in"),
                                 dim_int(rows, "rows"), dim_int(out, "out"), &one, w.data,
                                 type_of(w), dim_int(in, "in"), dy.data, type_of(dy),
                                 dim_int(out, "out"), add_dx ? &one : &zero, dx->data,
                                 type_of(*dx), dim_int(in, "in"), CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
  // dW^T (in x out) += x^T (in x rows) dy (rows x out); with dense, into it (bf16), then added.
  const Tensor& into = dense ? *dense : dw;
  if (dense && dense->numel() != dw.numel())
    throw std::invalid_argument("linear backward: the dense weight gradient's size differs");
  NP_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, dim_int(in, "in"),
                               dim_int(out, "out"), dim_int(rows, "rows"), &one, x.data,
                               type_of(x), dim_int(in, "in"), dy.data, type_of(dy),
                               dim_int(out, "out"), dense ? &zero : &one, into.data,
                               type_of(into), dim_int(in, "in"), CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
  if (dense) accumulate(dw, *dense, stream);
  if (db) column_sums_add(dy, rows, *db, stream);
}

}  // namespace np::cuda
