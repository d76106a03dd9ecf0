// The cuBLAS emulation: a plain triple loop with cuBLAS's argument checks and semantics.
#include "executor/cuda/emu/cublas_emu.hpp"

#include <algorithm>
#include <utility>
#include <vector>

struct np_emu_cublas {
  void* workspace = nullptr;  // the user's (cublasSetWorkspace); null: the default pool
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
  std::vector<std::pair<cudaStream_t, void*>> pools;  // default pools cuBLAS allocated, by stream
};

namespace {

float load(const void* p, cudaDataType t, long long i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}
void store(void* p, cudaDataType t, long long i, float v) {
  if (t == CUDA_R_32F)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
}
bool known(cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }

}  // namespace

cublasStatus_t cublasCreate(cublasHandle_t* h) {
  *h = new np_emu_cublas;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  for (auto& [stream, pool] : h->pools) cudaFree(pool);
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  h->workspace = nullptr, h->workspace_bytes = 0;  // back to the default pool, unconditionally
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t* s) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  *s = h->stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void* w, size_t bytes) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->workspace = w, h->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
    const void* alpha, const void* A, cudaDataType at, int lda, long long sa, const void* B,
    cudaDataType bt, int ldb, long long sb, const void* beta, void* C, cudaDataType ct, int ldc,
    long long sc, int batch, cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  // cuBLAS's supported type combinations for CUBLAS_COMPUTE_32F: A and B of one type; a bf16 C
  // only with bf16 inputs.
  if (compute != CUBLAS_COMPUTE_32F || !known(at) || !known(bt) || !known(ct) || at != bt ||
      (ct == CUDA_R_16BF && at != CUDA_R_16BF))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  // cuBLAS's checks: sizes non-negative; leading dimensions at least the stored rows.
  int a_rows = ta == CUBLAS_OP_N ? m : k, b_rows = tb == CUBLAS_OP_N ? k : n;
  if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < std::max(1, a_rows) ||
      ldb < std::max(1, b_rows) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  // No user workspace: the default pool of the handle's stream, allocated on first use.
  if (!h->workspace && std::none_of(h->pools.begin(), h->pools.end(),
                                    [&](const auto& p) { return p.first == h->stream; })) {
    void* pool = nullptr;
    if (cudaMalloc(&pool, kCublasDefaultWorkspace) != cudaSuccess) return CUBLAS_STATUS_ALLOC_FAILED;
    h->pools.push_back({h->stream, pool});
  }
  float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  for (int b = 0; b < batch; ++b)
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float acc = 0;
        for (int p = 0; p < k; ++p) {
          long long ai = ta == CUBLAS_OP_N ? i + static_cast<long long>(p) * lda
                                           : p + static_cast<long long>(i) * lda;
          long long bi = tb == CUBLAS_OP_N ? p + static_cast<long long>(j) * ldb
                                           : j + static_cast<long long>(p) * ldb;
          acc += load(A, at, b * sa + ai) * load(B, bt, b * sb + bi);
        }
        long long ci = b * sc + i + static_cast<long long>(j) * ldc;
        float prev = be == 0.0f ? 0.0f : load(C, ct, ci);  // beta 0: C is not read (may be NaN)
        store(C, ct, ci, al * acc + be * prev);
      }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void* alpha, const void* A, cudaDataType at,
                            int lda, const void* B, cudaDataType bt, int ldb, const void* beta,
                            void* C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
  return cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta,
                                    C, ct, ldc, 0, 1, compute, algo);
}
