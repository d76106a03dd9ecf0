// The tensor-core wrapper: one warp's 16 x 16 x 16 bf16 product with fp32 accumulation. On a GPU
// it is nvcuda::wmma (Hopper runs it on the tensor cores); in the emulation lane 0 computes the
// tile while the warp waits, which keeps its collective semantics (every lane calls it, nobody
// reads the result before all have). Every kernel that uses tensor cores goes through here.
#pragma once
#include <type_traits>

#include "executor/cuda/common.cuh"

#if !defined(NANOPLAN_CUDA_EMULATION)
#include <mma.h>
#endif

namespace np::cuda {

constexpr int kMmaTile = 16;

// c (16 x 16 fp32, row-major, leading dimension ldc) += a (16 x 16 bf16, row-major, lda) x b
// (16 x 16 bf16: element (k, n) at b[n * ldb + k] when b_col_major, else at b[k * ldb + n]).
// Warp-collective: every lane of the warp calls it with the same arguments. The pointers are
// 32-byte aligned (shared memory); lda and ldb are multiples of 8, ldc of 4.
template <bool b_col_major>
__device__ __forceinline__ void mma_16x16x16(const __nv_bfloat16* a, unsigned lda,
                                             const __nv_bfloat16* b, unsigned ldb, float* c,
                                             unsigned ldc) {
#if defined(NANOPLAN_CUDA_EMULATION)
  __syncwarp();
  if (np::emu::lane_id() == 0)
    for (int i = 0; i < kMmaTile; ++i)
      for (int n = 0; n < kMmaTile; ++n) {
        float acc = c[i * ldc + n];
        for (int k = 0; k < kMmaTile; ++k)
          acc += __bfloat162float(a[i * lda + k]) *
                 __bfloat162float(b_col_major ? b[n * ldb + k] : b[k * ldb + n]);
        c[i * ldc + n] = acc;
      }
  __syncwarp();
#else
  using namespace nvcuda;
  using BLayout = typename std::conditional<b_col_major, wmma::col_major, wmma::row_major>::type;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, BLayout> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::load_matrix_sync(fa, a, lda);
  wmma::load_matrix_sync(fb, b, ldb);
  wmma::load_matrix_sync(fc, c, ldc, wmma::mem_row_major);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(c, fc, ldc, wmma::mem_row_major);
#endif
}

}  // namespace np::cuda
