// The CUDA backend's kernels through the host emulation of CUDA (executor/cuda/emu/), and the
// emulation itself: barriers, warp shuffles and shared memory behave as on a GPU, a missing
// __syncthreads gives a wrong answer, a thread that returns before a barrier is an error, and
// cuBLAS's GEMM follows its column-major semantics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "executor/backend.hpp"
#include "executor/cuda/kernels.hpp"
#include "executor/cuda/transfer.hpp"
#include "gpu_env.hpp"

namespace np::cuda {
namespace {

#ifdef NANOPLAN_CUDA_EMULATION
// ---- the emulation ------------------------------------------------------------------------------

// Thread t writes t to shared memory; after the barrier, thread t reads its right neighbour's.
__global__ void neighbour(int* out, bool sync) {
  int* s = np_shared<int>();
  int t = threadIdx.x, n = blockDim.x;
  s[t] = t;
  if (sync) __syncthreads();
  out[blockIdx.x * n + t] = s[(t + 1) % n];
}

TEST(CudaEmulation, BarriersOrderSharedMemory) {
  const int n = 64, blocks = 3;
  std::vector<int> out(n * blocks, -1);
  for (int launch = 0; launch < 2; ++launch) {  // each launch starts in the other order
    np_launch(neighbour, dim3(blocks), dim3(n), n * sizeof(int), nullptr, out.data(), true);
    for (int b = 0; b < blocks; ++b)
      for (int t = 0; t < n; ++t) ASSERT_EQ(out[b * n + t], (t + 1) % n) << "launch " << launch;
  }
  // Without the barrier some thread reads its neighbour's slot before it is written.
  bool wrong = false;
  for (int launch = 0; launch < 2; ++launch) {
    np_launch(neighbour, dim3(blocks), dim3(n), n * sizeof(int), nullptr, out.data(), false);
    for (int i = 0; i < n * blocks; ++i) wrong |= out[i] != (i % n + 1) % n;
  }
  EXPECT_TRUE(wrong) << "a missing __syncthreads went unnoticed";
}

// Thread t writes t, synchronises its warp only (or the block), then reads the slot of the thread
// one warp further on.
__global__ void other_warp(int* out, bool block_sync) {
  int* s = np_shared<int>();
  int t = threadIdx.x, n = blockDim.x;
  s[t] = t;
  if (block_sync)
    __syncthreads();
  else
    __syncwarp();
  out[t] = s[(t + 32) % n];
}

// A warp whose lanes meet at a warp barrier runs on ahead of the other warps: a block barrier
// missing between warp-synchronised phases gives a wrong result in either launch order.
TEST(CudaEmulation, AWarpBarrierDoesNotStandInForABlockBarrier) {
  const int n = 64;
  std::vector<int> out(n, -1);
  for (int launch = 0; launch < 2; ++launch) {
    np_launch(other_warp, dim3(1), dim3(n), n * sizeof(int), nullptr, out.data(), true);
    for (int t = 0; t < n; ++t) ASSERT_EQ(out[t], (t + 32) % n);
    np_launch(other_warp, dim3(1), dim3(n), n * sizeof(int), nullptr, out.data(), false);
    bool wrong = false;
    for (int t = 0; t < n; ++t) wrong |= out[t] != (t + 32) % n;
    EXPECT_TRUE(wrong) << "launch " << launch << ": a __syncwarp passed for a __syncthreads";
  }
}

__global__ void warp_reduce(const float* in, float* out, unsigned* ballots) {
  int t = threadIdx.x;
  float v = in[t];
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[t] = v;
  unsigned b = __ballot_sync(0xffffffffu, in[t] > 0);
  if (t % 32 == 0) ballots[t / 32] = b;
  float down = __shfl_down_sync(0xffffffffu, in[t], 1);
  if (t % 32 < 31) out[64 + t] = down;
}

TEST(CudaEmulation, WarpShufflesAndVotes) {
  std::vector<float> in(64), out(128, 0);
  std::vector<unsigned> ballots(2, 0);
  for (int i = 0; i < 64; ++i) in[i] = (i % 3 == 0 ? -1.0f : 1.0f) * static_cast<float>(i + 1);
  np_launch(warp_reduce, dim3(1), dim3(64), 0, nullptr, in.data(), out.data(), ballots.data());
  for (int w = 0; w < 2; ++w) {
    float sum = 0;
    unsigned want = 0;
    for (int l = 0; l < 32; ++l) sum += in[w * 32 + l], want |= (in[w * 32 + l] > 0 ? 1u : 0u) << l;
    for (int l = 0; l < 32; ++l) EXPECT_EQ(out[w * 32 + l], sum) << "warp " << w << " lane " << l;
    EXPECT_EQ(ballots[w], want);
    for (int l = 0; l < 31; ++l) EXPECT_EQ(out[64 + w * 32 + l], in[w * 32 + l + 1]);
  }
}

__global__ void early_return(int* out) {
  if (threadIdx.x == 5) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

TEST(CudaEmulation, AThreadLeavingBeforeABarrierIsAnError) {
  std::vector<int> out(32, 0);
  try {
    np_launch(early_return, dim3(1), dim3(32), 0, nullptr, out.data());
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("__syncthreads waits for thread (5,0,0)"),
              std::string::npos)
        << e.what();
  }
}

TEST(CudaEmulation, SharedMemoryStartsPoisoned) {
  std::vector<int> out(4, 0);
  np_launch(neighbour, dim3(1), dim3(4), 8 * sizeof(int), nullptr, out.data(), true);
  float probe = 0;
  auto read_poison = [](float* dst) {
    np_launch(
        +[](float* d) {
          if (threadIdx.x == 0) *d = np_shared<float>()[3];
        },
        dim3(1), dim3(1), 16, nullptr, dst);
  };
  read_poison(&probe);
  EXPECT_TRUE(std::isnan(probe));
}

// cuBLAS: C (m x n) = A^T (m x k) B (k x n), column-major with padded leading dimensions,
// against a direct sum.
TEST(CudaEmulation, CublasGemmIsColumnMajorWithTransposesAndStrides) {
  const int m = 5, n = 3, k = 7, lda = 9, ldb = 8, ldc = 6, batch = 2;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> A(lda * m * batch), B(ldb * n * batch), C(ldc * n * batch, NAN);
  for (float& a : A) a = u(rng);
  for (float& b : B) b = u(rng);
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  float alpha = 1.5f, beta = 0.0f;
  ASSERT_EQ(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, A.data(),
                                       CUDA_R_32F, lda, lda * m, B.data(), CUDA_R_32F, ldb, ldb * n,
                                       &beta, C.data(), CUDA_R_32F, ldc, ldc * n, batch,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double want = 0;
        for (int p = 0; p < k; ++p)
          want += double(A[b * lda * m + i * lda + p]) * B[b * ldb * n + j * ldb + p];
        EXPECT_NEAR(C[b * ldc * n + j * ldc + i], 1.5 * want, 1e-5) << b << " " << i << " " << j;
      }
  EXPECT_EQ(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, A.data(), CUDA_R_32F, m - 1,
                         B.data(), CUDA_R_32F, ldb, &beta, C.data(), CUDA_R_32F, ldc,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE)
      << "lda < m is refused, as cuBLAS does";
  cublasDestroy(h);
}

// cuBLAS's workspace rules (cublas_emu.hpp, from cuBLAS's documentation): a GEMM with a user
// workspace allocates nothing; cublasSetStream resets the handle to cuBLAS's default pool, which
// the next GEMM allocates on the device, once per stream. The backend's GEMMs (linear.cu) set a
// stream only when it changes, so a handle put on its stream before its workspace keeps it.
size_t device_in_use();
TEST(CudaEmulation, CublasSetStreamResetsTheWorkspace) {
  const int m = 4, n = 3, k = 5;
  std::vector<float> A(m * k, 0.5f), B(k * n, 0.25f), C(m * n, 0.0f);
  float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&](cublasHandle_t h) {
    return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, A.data(), CUDA_R_32F, m,
                        B.data(), CUDA_R_32F, k, &beta, C.data(), CUDA_R_32F, m,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  cudaStream_t s1 = nullptr, s2 = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s1), cudaSuccess);
  ASSERT_EQ(cudaStreamCreate(&s2), cudaSuccess);
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, 1 << 20), cudaSuccess);
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  const size_t before = device_in_use();
  ASSERT_EQ(cublasSetWorkspace(h, ws, 1 << 20), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(gemm(h), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(device_in_use(), before) << "the user's workspace: nothing allocated";
  ASSERT_EQ(cublasSetStream(h, s1), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(gemm(h), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(device_in_use(), before + kCublasDefaultWorkspace) << "reset to the default pool";
  ASSERT_EQ(gemm(h), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(device_in_use(), before + kCublasDefaultWorkspace) << "one pool per stream";
  // The backend's order: the stream, then the workspace; linear_forward on that stream keeps it.
  cublasHandle_t g;
  ASSERT_EQ(cublasCreate(&g), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(g, s2), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetWorkspace(g, ws, 1 << 20), CUBLAS_STATUS_SUCCESS);
  std::vector<uint16_t> x(8 * 16, 0x3f80), w(4 * 16, 0x3f80), y(8 * 4, 0);
  Tensor xt{x.data(), {{8, 16}, Dtype::kBf16}}, wt{w.data(), {{4, 16}, Dtype::kBf16}},
      yt{y.data(), {{8, 4}, Dtype::kBf16}};
  linear_forward(g, xt, wt, nullptr, yt, s2);
  EXPECT_EQ(device_in_use(), before + kCublasDefaultWorkspace)
      << "linear_forward on the handle's own stream keeps the user's workspace";
  cublasDestroy(g);
  cublasDestroy(h);
  EXPECT_EQ(device_in_use(), before) << "cublasDestroy frees the pools";
  cudaFree(ws);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

// NCCL's rule that collectives take device buffers, as the emulation checks it:
// cudaPointerGetAttributes says device for a pointer inside a cudaMalloc'd block and unregistered for host memory, and the
// virtual ranks' collectives refuse a host buffer (the cross-entropy's host all-gather did that).
// Their all_reduce_max (Megatron's MAX all-reduce of the logits' maxima) is the element-wise max.
TEST(CudaEmulation, CollectivesTakeDeviceBuffersOnly) {
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 4096), cudaSuccess);
  std::vector<float> host(16, 0.0f);
  cudaPointerAttributes a{};
  ASSERT_EQ(cudaPointerGetAttributes(&a, static_cast<char*>(d) + 100), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  ASSERT_EQ(cudaPointerGetAttributes(&a, host.data()), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  auto transfer = device_transfer();
  EXPECT_NO_THROW(transfer->check_collective_buffer(d, "x"));
  EXPECT_THROW(transfer->check_collective_buffer(host.data(), "x"), std::invalid_argument);

  auto world = virtual_rank_world()(2, 1, 1, 1, 1);
  std::vector<float*> buf(2);
  for (auto& b : buf)
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&b), 3 * sizeof(float)), cudaSuccess);
  const float values[2][3] = {{1.0f, -5.0f, 7.0f}, {2.0f, -6.0f, 3.0f}};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      std::copy(values[r], values[r] + 3, buf[r]);  // emulated device memory is addressable
      world->comm(0, 0, r).all_reduce_max(Tensor{buf[r], {{3}, Dtype::kFp32}});
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(buf[r][0], 2.0f);
    EXPECT_EQ(buf[r][1], -5.0f);
    EXPECT_EQ(buf[r][2], 7.0f);
  }
  std::vector<std::thread> bad;
  std::vector<std::string> errors(2);
  for (int r = 0; r < 2; ++r)
    bad.emplace_back([&, r] {
      try {
        world->comm(0, 0, r).all_gather(Tensor{buf[r], {{1}, Dtype::kFp32}},
                                         Tensor{host.data(), {{2}, Dtype::kFp32}});
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : bad) t.join();
  for (const std::string& e : errors)
    EXPECT_NE(e.find("all_gather's output is not device memory"), std::string::npos) << e;
  for (auto* b : buf) cudaFree(b);
  cudaFree(d);
}

// Launches a GPU of compute capability 9.0 refuses are refused (cuda_emu.hpp, launch): grid y and z
// past 65,535 blocks, blocks past 1,024 threads or 64 in z, dynamic shared memory past 48 KiB
// unless the kernel was allowed more, and an allowance past the device's 227 KiB.
__global__ void noop_kernel(int* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) *out = 1;
}
TEST(CudaEmulation, LaunchesKeepTheDevicesLimits) {
  int out = 0;
  EXPECT_NO_THROW(np_launch(noop_kernel, dim3(1, 65535), dim3(1), 0, nullptr, &out));
  EXPECT_THROW(np_launch(noop_kernel, dim3(1, 65536), dim3(1), 0, nullptr, &out),
               std::runtime_error);
  EXPECT_THROW(np_launch(noop_kernel, dim3(1, 1, 65536), dim3(1), 0, nullptr, &out),
               std::runtime_error);
  EXPECT_THROW(np_launch(noop_kernel, dim3(1), dim3(1025), 0, nullptr, &out), std::runtime_error);
  EXPECT_THROW(np_launch(noop_kernel, dim3(1), dim3(1, 1, 65), 0, nullptr, &out),
               std::runtime_error);
  EXPECT_THROW(np_launch(noop_kernel, dim3(1), dim3(32), (48 << 10) + 16, nullptr, &out),
               std::runtime_error);
  np_allow_shared(noop_kernel, 100 << 10);
  EXPECT_NO_THROW(np_launch(noop_kernel, dim3(1), dim3(32), 100 << 10, nullptr, &out));
  EXPECT_THROW(np_allow_shared(noop_kernel, 228 << 10), std::runtime_error);
  EXPECT_EQ(out, 1);
}

// The driver's virtual memory calls, each rule that a GPU enforces (cuda_emu.hpp): a call that
// breaks one fails here as it would there, and the physical bytes count in cudaMemGetInfo.
template <typename Fn>
Fn driver(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  EXPECT_EQ(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found),
            cudaSuccess);
  EXPECT_EQ(found, cudaDriverEntryPointSuccess) << name;
  return reinterpret_cast<Fn>(p);
}

size_t device_in_use() {
  size_t free_bytes = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  return total - free_bytes;
}

TEST(CudaEmulation, VirtualMemoryFollowsTheDriversRules) {
  auto granularity = driver<CUresult (*)(size_t*, const CUmemAllocationProp*,
                                         CUmemAllocationGranularity_flags)>(
      "cuMemGetAllocationGranularity");
  auto reserve = driver<CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr,
                                     unsigned long long)>("cuMemAddressReserve");
  auto address_free = driver<CUresult (*)(CUdeviceptr, size_t)>("cuMemAddressFree");
  auto create = driver<CUresult (*)(CUmemGenericAllocationHandle*, size_t,
                                    const CUmemAllocationProp*, unsigned long long)>("cuMemCreate");
  auto release = driver<CUresult (*)(CUmemGenericAllocationHandle)>("cuMemRelease");
  auto map = driver<CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                                 unsigned long long)>("cuMemMap");
  auto access = driver<CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t)>(
      "cuMemSetAccess");
  auto unmap = driver<CUresult (*)(CUdeviceptr, size_t)>("cuMemUnmap");
  void* missing = &missing;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSuccess;
  EXPECT_EQ(cudaGetDriverEntryPointByVersion("cuNoSuchCall", &missing, 12000, cudaEnableDefault,
                                             &found),
            cudaSuccess);
  EXPECT_EQ(found, cudaDriverEntryPointSymbolNotFound);
  EXPECT_EQ(missing, nullptr);

  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  size_t g = 0;
  ASSERT_EQ(granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  ASSERT_EQ(g, size_t{2} << 20);
  const size_t range = 8 * g;
  CUdeviceptr base = 0;
  ASSERT_EQ(reserve(&base, range, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(base % g, 0u);
  EXPECT_EQ(reserve(&base, g + 1, 0, 0, 0), CUDA_ERROR_INVALID_VALUE) << "a partial granule";
  const size_t before = device_in_use();

  CUmemGenericAllocationHandle h = 0, h2 = 0;
  EXPECT_EQ(create(&h, g / 2, &prop, 0), CUDA_ERROR_INVALID_VALUE) << "a partial granule";
  ASSERT_EQ(create(&h, 2 * g, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(device_in_use(), before + 2 * g) << "physical memory counts when created";
  EXPECT_EQ(map(base + g / 2, 2 * g, 0, h, 0), CUDA_ERROR_INVALID_VALUE) << "an unaligned address";
  EXPECT_EQ(map(base, g, 0, h, 0), CUDA_ERROR_INVALID_VALUE) << "part of a handle";
  EXPECT_EQ(map(base, 2 * g, g, h, 0), CUDA_ERROR_INVALID_VALUE) << "an offset into the handle";
  EXPECT_EQ(map(base + 7 * g, 2 * g, 0, h, 0), CUDA_ERROR_INVALID_VALUE) << "past the reservation";
  ASSERT_EQ(map(base, 2 * g, 0, h, 0), CUDA_SUCCESS);
  ASSERT_EQ(create(&h2, g, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(map(base + g, g, 0, h2, 0), CUDA_ERROR_INVALID_VALUE) << "over a mapping";
  ASSERT_EQ(map(base + 2 * g, g, 0, h2, 0), CUDA_SUCCESS);

  CUmemAccessDesc rw{{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  EXPECT_EQ(access(base, 4 * g, &rw, 1), CUDA_ERROR_INVALID_VALUE) << "a range not all mapped";
  ASSERT_EQ(access(base, 3 * g, &rw, 1), CUDA_SUCCESS) << "across two mappings";
  auto* bytes = reinterpret_cast<unsigned char*>(base);
  EXPECT_EQ(bytes[0], 0xFF) << "fresh memory holds garbage";
  bytes[3 * g - 1] = 7;  // readable and writable to the end
  EXPECT_EQ(bytes[3 * g - 1], 7);

  EXPECT_EQ(unmap(base, g), CUDA_ERROR_INVALID_VALUE) << "part of a mapping";
  EXPECT_EQ(unmap(base, 3 * g), CUDA_ERROR_INVALID_VALUE) << "two mappings at once";
  EXPECT_EQ(address_free(base, range), CUDA_ERROR_INVALID_VALUE) << "pages still mapped";
  ASSERT_EQ(release(h), CUDA_SUCCESS);
  EXPECT_EQ(release(h), CUDA_ERROR_INVALID_VALUE) << "released twice";
  EXPECT_EQ(device_in_use(), before + 3 * g) << "a released handle lives while mapped";
  ASSERT_EQ(unmap(base, 2 * g), CUDA_SUCCESS);
  EXPECT_EQ(device_in_use(), before + g) << "released and unmapped: given back";
  ASSERT_EQ(unmap(base + 2 * g, g), CUDA_SUCCESS);
  EXPECT_EQ(device_in_use(), before + g) << "unmapped, not yet released";
  EXPECT_EQ(map(base, g, 0, h, 0), CUDA_ERROR_INVALID_VALUE) << "a handle already released";
  ASSERT_EQ(release(h2), CUDA_SUCCESS);
  EXPECT_EQ(device_in_use(), before);
  EXPECT_EQ(address_free(base, range / 2), CUDA_ERROR_INVALID_VALUE) << "part of a reservation";
  EXPECT_EQ(address_free(base, range), CUDA_SUCCESS);

  ::np::emu::set_device_memory(before + g);
  EXPECT_EQ(create(&h, 2 * g, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY) << "past the device's memory";
  ::np::emu::set_device_memory(size_t{80} << 30);
}

#endif  // NANOPLAN_CUDA_EMULATION

// ---- kernels against a double-precision reference -----------------------------------------------

// A device tensor for the tests, read and written through cudaMemcpy (so the same test runs on a
// GPU); it starts poisoned with 0xFF bytes (NaN).
struct DeviceTensor {
  Tensor t;
  DeviceTensor(std::vector<int64_t> shape, Dtype d) {
    t.type = {std::move(shape), d};
    NP_CUDA_CHECK(cudaMalloc(&t.data, static_cast<size_t>(t.bytes())));
    NP_CUDA_CHECK(cudaMemset(t.data, 0xFF, static_cast<size_t>(t.bytes())));
  }
  ~DeviceTensor() { cudaFree(t.data); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  void set_raw(const void* p) {
    NP_CUDA_CHECK(cudaMemcpy(t.data, p, static_cast<size_t>(t.bytes()), cudaMemcpyHostToDevice));
  }
  std::vector<uint8_t> raw() const {
    std::vector<uint8_t> h(static_cast<size_t>(t.bytes()));
    NP_CUDA_CHECK(cudaMemcpy(h.data(), t.data, h.size(), cudaMemcpyDeviceToHost));
    return h;
  }
  template <typename T>
  std::vector<T> as() const {
    std::vector<uint8_t> h = raw();
    std::vector<T> v(h.size() / sizeof(T));
    std::memcpy(v.data(), h.data(), v.size() * sizeof(T));
    return v;
  }
  void set(const std::vector<double>& v) {
    std::vector<uint8_t> h(static_cast<size_t>(t.bytes()));
    Tensor host{h.data(), t.type};
    for (size_t i = 0; i < v.size(); ++i)
      exec::store(host, static_cast<int64_t>(i), static_cast<float>(v[i]));
    set_raw(h.data());
  }
  std::vector<double> get() const {
    std::vector<uint8_t> h = raw();
    Tensor host{h.data(), t.type};
    std::vector<double> v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = exec::load(host, static_cast<int64_t>(i));
    return v;
  }
};

std::vector<double> random_values(size_t n, uint32_t seed, double lo = -2, double hi = 2) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (double& x : v)
    x = static_cast<double>(exec::bf16_to_f32(exec::f32_to_bf16(static_cast<float>(u(rng)))));
  return v;
}

// Relative error in the 2-norm; NaN anywhere fails.
void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << what << ": NaN at " << i;
    num += (got[i] - want[i]) * (got[i] - want[i]), den += want[i] * want[i];
  }
  EXPECT_LE(std::sqrt(num / std::max(den, 1e-300)), tol) << what;
}

double tolerance(Dtype d) {
  return d == Dtype::kBf16 ? 1e-2 : 1e-5;
}

TEST(CudaKernels, RmsNormForwardAndBackward) {
  const int64_t rows = 71, h = 229;
  const float eps = 1e-5f;
  for (Dtype d : {Dtype::kFp32, Dtype::kBf16}) {
    auto xv = random_values(rows * h, 1), wv = random_values(h, 2, 0.5, 1.5),
         gv = random_values(rows * h, 3);
    DeviceTensor x({rows, h}, d), w({h}, d), y({rows, h}, d), dy({rows, h}, d), dx({rows, h}, d),
        dw({h}, Dtype::kFp32), rstd({rows}, Dtype::kFp32);
    x.set(xv), w.set(wv), dy.set(gv), dw.set(std::vector<double>(h, 0.0));
    rmsnorm_forward(x.t, w.t, y.t, nullptr, eps, nullptr);
    rmsnorm_backward(x.t, w.t, dy.t, dx.t, false, dw.t, rstd.t, false, eps, nullptr);
    std::vector<double> yr(rows * h), dxr(rows * h), dwr(h, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0, gx = 0;
      for (int64_t c = 0; c < h; ++c) ss += xv[r * h + c] * xv[r * h + c];
      double inv = 1.0 / std::sqrt(ss / h + eps);
      for (int64_t c = 0; c < h; ++c) gx += gv[r * h + c] * wv[c] * xv[r * h + c];
      for (int64_t c = 0; c < h; ++c) {
        yr[r * h + c] = xv[r * h + c] * inv * wv[c];
        dxr[r * h + c] = inv * gv[r * h + c] * wv[c] - xv[r * h + c] * inv * inv * inv * gx / h;
        dwr[c] += gv[r * h + c] * xv[r * h + c] * inv;
      }
    }
    std::string name = d == Dtype::kBf16 ? "bf16" : "fp32";
    expect_close(y.get(), yr, tolerance(d), "rmsnorm forward " + name);
    expect_close(dx.get(), dxr, tolerance(d), "rmsnorm dx " + name);
    expect_close(dw.get(), dwr, 1e-5, "rmsnorm dw " + name);
  }
}

// The profiles' variants: norms that keep their statistics give the recomputing kernels' results
// (the backward reads them instead); act(gate) then the product gives the fused SwiGLU's.
TEST(CudaKernels, KeptNormStatisticsAndUnfusedGlu) {
  const int64_t rows = 37, h = 131, f = 97;
  const float eps = 1e-5f;
  for (Dtype d : {Dtype::kFp32, Dtype::kBf16}) {
    std::string name = d == Dtype::kBf16 ? "bf16" : "fp32";
    auto xv = random_values(rows * h, 11), wv = random_values(h, 12, 0.5, 1.5),
         bv = random_values(h, 13), gv = random_values(rows * h, 14);
    DeviceTensor x({rows, h}, d), w({h}, d), b({h}, d), dy({rows, h}, d);
    x.set(xv), w.set(wv), b.set(bv), dy.set(gv);
    for (bool ln : {false, true}) {
      std::string what = std::string(ln ? "layernorm" : "rmsnorm") + " " + name;
      DeviceTensor y1({rows, h}, d), y2({rows, h}, d), dx1({rows, h}, d), dx2({rows, h}, d),
          dw1({h}, Dtype::kFp32), dw2({h}, Dtype::kFp32), db1({h}, Dtype::kFp32),
          db2({h}, Dtype::kFp32), m1({rows}, Dtype::kFp32), r1({rows}, Dtype::kFp32),
          m2({rows}, Dtype::kFp32), r2({rows}, Dtype::kFp32);
      for (DeviceTensor* t : {&dw1, &dw2, &db1, &db2}) t->set(std::vector<double>(h, 0.0));
      if (ln) {
        layernorm_forward(x.t, w.t, b.t, y1.t, nullptr, nullptr, eps, nullptr);
        layernorm_backward(x.t, w.t, dy.t, dx1.t, false, dw1.t, db1.t, m1.t, r1.t, false, eps,
                           nullptr);
        layernorm_forward(x.t, w.t, b.t, y2.t, &m2.t, &r2.t, eps, nullptr);
        expect_close(m2.get(), m1.get(), 1e-6, what + " kept mean");
        layernorm_backward(x.t, w.t, dy.t, dx2.t, false, dw2.t, db2.t, m2.t, r2.t, true, eps,
                           nullptr);
      } else {
        rmsnorm_forward(x.t, w.t, y1.t, nullptr, eps, nullptr);
        rmsnorm_backward(x.t, w.t, dy.t, dx1.t, false, dw1.t, r1.t, false, eps, nullptr);
        rmsnorm_forward(x.t, w.t, y2.t, &r2.t, eps, nullptr);
        rmsnorm_backward(x.t, w.t, dy.t, dx2.t, false, dw2.t, r2.t, true, eps, nullptr);
      }
      expect_close(r2.get(), r1.get(), 1e-6, what + " kept rstd");
      expect_close(y2.get(), y1.get(), 1e-6, what + " forward");
      expect_close(dx2.get(), dx1.get(), 1e-6, what + " dx from the kept statistics");
      expect_close(dw2.get(), dw1.get(), 1e-6, what + " dw from the kept statistics");
    }
    // Unfused GLU against the fused kernel: the act is rounded to the dtype once in between.
    auto uv = random_values(rows * 2 * f, 15), ev = random_values(rows * f, 16);
    DeviceTensor gu({rows, 2 * f}, d), fused({rows, f}, d), act({rows, f}, d), prod({rows, f}, d),
        g({rows, f}, d), dfused({rows, 2 * f}, d), dact({rows, f}, d), dgu({rows, 2 * f}, d);
    gu.set(uv), g.set(ev);
    swiglu_forward(gu.t, fused.t, nullptr);
    swiglu_backward(gu.t, g.t, dfused.t, false, nullptr);
    glu_act_forward(gu.t, act.t, nullptr);
    glu_mul_forward(act.t, gu.t, prod.t, nullptr);
    dgu.set(std::vector<double>(rows * 2 * f, std::nan("")));  // every element must be written
    glu_mul_backward(act.t, gu.t, g.t, dact.t, false, dgu.t, false, nullptr);
    glu_act_backward(gu.t, dact.t, dgu.t, true, nullptr);
    expect_close(prod.get(), fused.get(), tolerance(d), "glu act x up " + name);
    expect_close(dgu.get(), dfused.get(), tolerance(d), "glu gradient " + name);
    // glu_act alone writes the gate half and zeroes the up half.
    DeviceTensor only({rows, 2 * f}, d);
    only.set(std::vector<double>(rows * 2 * f, std::nan("")));
    glu_act_backward(gu.t, dact.t, only.t, false, nullptr);
    std::vector<double> o = only.get();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < f; ++c) {
        ASSERT_FALSE(std::isnan(o[r * 2 * f + c])) << "gate half " << r << "," << c;
        ASSERT_EQ(o[r * 2 * f + f + c], 0.0) << "up half " << r << "," << c;
      }
  }
}

TEST(CudaKernels, SwiGluAddAccumulateFill) {
  const int64_t rows = 71, f = 229;
  for (Dtype d : {Dtype::kFp32, Dtype::kBf16}) {
    auto xv = random_values(rows * 2 * f, 4), gv = random_values(rows * f, 5),
         prior = random_values(rows * 2 * f, 6);
    DeviceTensor x({rows, 2 * f}, d), y({rows, f}, d), dy({rows, f}, d), dx({rows, 2 * f}, d);
    x.set(xv), dy.set(gv), dx.set(prior);
    swiglu_forward(x.t, y.t, nullptr);
    swiglu_backward(x.t, dy.t, dx.t, /*accumulate=*/true, nullptr);
    std::vector<double> yr(rows * f), dxr = prior;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < f; ++c) {
        double g = xv[r * 2 * f + c], u = xv[r * 2 * f + f + c], s = 1 / (1 + std::exp(-g));
        double dd = gv[r * f + c];
        yr[r * f + c] = g * s * u;
        dxr[r * 2 * f + c] += dd * u * s * (1 + g * (1 - s));
        dxr[r * 2 * f + f + c] += dd * g * s;
      }
    std::string name = d == Dtype::kBf16 ? "bf16" : "fp32";
    expect_close(y.get(), yr, tolerance(d), "swiglu forward " + name);
    expect_close(dx.get(), dxr, tolerance(d), "swiglu dx (accumulated) " + name);

    DeviceTensor a({rows, f}, d), b({rows, f}, d), out({rows, f}, d);
    auto av = random_values(rows * f, 7), bv = random_values(rows * f, 8);
    a.set(av), b.set(bv);
    add(a.t, b.t, out.t, nullptr);
    std::vector<double> sum(rows * f);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = av[i] + bv[i];
    expect_close(out.get(), sum, tolerance(d), "add " + name);
    accumulate(a.t, b.t, nullptr);
    expect_close(a.get(), sum, tolerance(d), "accumulate " + name);
    fill(out.t, 0.25f, nullptr);
    expect_close(out.get(), std::vector<double>(rows * f, 0.25), 0, "fill " + name);
  }
}

TEST(CudaKernels, LinearThroughCublas) {
  const int64_t rows = 71, in = 229, out = 37;
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  for (Dtype d : {Dtype::kFp32, Dtype::kBf16}) {
    auto xv = random_values(rows * in, 11), wv = random_values(out * in, 12, -0.2, 0.2),
         bv = random_values(out, 13), gv = random_values(rows * out, 14),
         dx0 = random_values(rows * in, 15), dw0 = random_values(out * in, 16);
    DeviceTensor x({rows, in}, d), w({out, in}, d), b({out}, d), y({rows, out}, d),
        dy({rows, out}, d), dx({rows, in}, d), dw({out, in}, Dtype::kFp32), db({out}, Dtype::kFp32);
    x.set(xv), w.set(wv), b.set(bv), dy.set(gv), dx.set(dx0), dw.set(dw0),
        db.set(std::vector<double>(out, 0.0));
    linear_forward(h, x.t, w.t, &b.t, y.t, nullptr);
    linear_backward(h, x.t, w.t, dy.t, &dx.t, /*accumulate=*/true, dw.t, &db.t, nullptr);
    std::vector<double> yr(rows * out), dxr = dx0, dwr = dw0, dbr(out, 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o) {
        double acc = bv[o];
        for (int64_t k = 0; k < in; ++k) acc += xv[r * in + k] * wv[o * in + k];
        yr[r * out + o] = acc;
        double g = gv[r * out + o];
        dbr[o] += g;
        for (int64_t k = 0; k < in; ++k) {
          dxr[r * in + k] += g * wv[o * in + k];
          dwr[o * in + k] += g * xv[r * in + k];
        }
      }
    std::string name = d == Dtype::kBf16 ? "bf16" : "fp32";
    expect_close(y.get(), yr, tolerance(d), "linear forward " + name);
    expect_close(dx.get(), dxr, tolerance(d), "linear dx (accumulated) " + name);
    expect_close(dw.get(), dwr, 1e-5, "linear dW (fp32 accumulation) " + name);
    expect_close(db.get(), dbr, 1e-5, "linear db " + name);
  }
  cublasDestroy(h);
}

// More batch x heads than a grid's y dimension holds (65,535): the launches split into slices.
// With one position per sequence each head's output is its value row, and the gradient reaches
// only the values (dV = dO): every head, those past 65,535 included.
TEST(CudaKernels, FlashAttentionPastTheGridsYLimit) {
  const int64_t b = 1, s = 1, hq = 65536 + 6, hkv = hq, d = 2, width = (hq + 2 * hkv) * d;
  const AttentionShape shape{b, s, hq, hkv, d};
  auto xv = random_values(width, 51), gv = random_values(hq * d, 52);
  DeviceTensor qkv({1, width}, Dtype::kFp32), out({1, hq * d}, Dtype::kFp32),
      lse({b, hq, s}, Dtype::kFp32), dout({1, hq * d}, Dtype::kFp32),
      dx({1, width}, Dtype::kFp32), dq({1, hq * d}, Dtype::kFp32), rowsum({b, hq, s}, Dtype::kFp32);
  qkv.set(xv), dout.set(gv);
  flash_attention_forward(shape, qkv.t, out.t, lse.t, nullptr);
  flash_attention_backward(shape, qkv.t, out.t, lse.t, dout.t, dx.t, false, dq.t, rowsum.t,
                           nullptr);
  std::vector<float> o = out.as<float>(), g = dx.as<float>();
  for (int64_t h = 0; h < hq; h += (h < 65530 ? 4099 : 1))
    for (int64_t c = 0; c < d; ++c) {
      EXPECT_NEAR(o[h * d + c], xv[(hq + hkv + h) * d + c], 1e-6) << "head " << h;
      EXPECT_NEAR(g[(hq + hkv + h) * d + c], gv[h * d + c], 1e-6) << "dV, head " << h;
      EXPECT_NEAR(g[h * d + c], 0.0, 1e-6) << "dQ, head " << h;
    }
}

// RoPE on [q | k | v] rows with GQA (3 q heads, 1 kv head here), odd row count, sequence-sharded
// rows (first_row > 0); the inverse rotation (sign -1) undoes it.
TEST(CudaKernels, RopeRotatesQAndKAndIsInvertible) {
  const int64_t rows = 71, hq = 3, hkv = 1, d = 8, width = (hq + 2 * hkv) * d, batch = 2, first = 6;
  auto xv = random_values(rows * width, 21);
  DeviceTensor x({rows, width}, Dtype::kFp32), y({rows, width}, Dtype::kFp32),
      back({rows, width}, Dtype::kFp32);
  x.set(xv);
  rope(x.t, y.t, hq, hkv, d, first, batch, 1.0f, nullptr);
  rope(y.t, back.t, hq, hkv, d, first, batch, -1.0f, nullptr);
  std::vector<double> want = xv;
  for (int64_t t = 0; t < rows; ++t) {
    double pos = static_cast<double>((first + t) / batch);
    for (int64_t head = 0; head < hq + hkv; ++head)
      for (int64_t i = 0; i < d / 2; ++i) {
        double ang = pos * std::pow(10000.0, -2.0 * i / d);
        int64_t c0 = t * width + head * d + i, c1 = c0 + d / 2;
        want[c0] = xv[c0] * std::cos(ang) - xv[c1] * std::sin(ang);
        want[c1] = xv[c1] * std::cos(ang) + xv[c0] * std::sin(ang);
      }
  }
  expect_close(y.get(), want, 1e-5, "rope");
  expect_close(back.get(), xv, 1e-5, "rope inverse");
}

// The fused AdamW step equals the CPU reference's arithmetic bit for bit (same fp32 operations in
// the same order), over two steps; SGD and the dtype-converting copy likewise.
TEST(CudaKernels, OptimizerAndCopyMatchTheCpuReferenceBitwise) {
  const int64_t n = 229;
  auto gv = random_values(n, 31), wv = random_values(n, 32);
  DeviceTensor g({n}, Dtype::kBf16), w({n}, Dtype::kFp32), m({n}, Dtype::kFp32),
      v({n}, Dtype::kFp32), w2({n}, Dtype::kFp32);
  g.set(gv), w.set(wv), w2.set(wv), m.set(std::vector<double>(n, 0.0)),
      v.set(std::vector<double>(n, 0.0));
  std::vector<float> rw(wv.begin(), wv.end()), rm(n, 0), rv(n, 0);
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  for (int step = 0; step < 2; ++step) {
    adamw_step(g.t, w.t, m.t, v.t, lr, b1, b2, eps, wd, step, nullptr);
    float c1 = 1.0f - std::pow(b1, static_cast<float>(step + 1)),
          c2 = 1.0f - std::pow(b2, static_cast<float>(step + 1));
    for (int64_t i = 0; i < n; ++i) {
      float gi = static_cast<float>(gv[i]);
      rm[i] = b1 * rm[i] + (1 - b1) * gi;
      rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
      rw[i] -= lr * ((rm[i] / c1) / (std::sqrt(rv[i] / c2) + eps) + wd * rw[i]);
    }
  }
  const std::vector<double> wh = w.get();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(wh[i], rw[i]) << i;
  sgd_step(g.t, w2.t, lr, nullptr);
  const std::vector<double> w2h = w2.get();
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(w2h[i], static_cast<float>(wv[i]) - lr * static_cast<float>(gv[i]));
  DeviceTensor b({n}, Dtype::kBf16);
  copy_elements(b.t, 3, w.t, 5, n - 7, nullptr);
  const std::vector<double> bh = b.get();
  for (int64_t i = 0; i < n - 7; ++i)
    ASSERT_EQ(bh[3 + i], exec::bf16_to_f32(exec::f32_to_bf16(static_cast<float>(wh[5 + i]))));
  EXPECT_TRUE(std::isnan(bh[0])) << "elements outside the range stay untouched";
  EXPECT_THROW(copy_elements(b.t, 3, w.t, 5, n, nullptr), std::invalid_argument);
}

// Flash attention against a direct double-precision evaluation: GQA with three query heads per
// key-value head, odd sequence lengths that leave partial tiles, batch 2, gradients accumulated
// onto a prior value; bf16 takes the tensor-core forward (head_dim 8 and 40 padded to 16 and 48:
// one and three k-steps), fp32 the CUDA-core one.
TEST(CudaKernels, FlashAttentionForwardAndBackward) {
  for (auto [s, d] : {std::pair<int64_t, int64_t>{37, 8}, {71, 40}})
    for (Dtype dt : {Dtype::kFp32, Dtype::kBf16}) {
      const int64_t b = 2, hq = 6, hkv = 2, width = (hq + 2 * hkv) * d, T = b * s;
      const AttentionShape shape{b, s, hq, hkv, d};
      auto xv = random_values(T * width, 41), gv = random_values(T * hq * d, 42),
           prior = random_values(T * width, 43);
      DeviceTensor qkv({T, width}, dt), out({T, hq * d}, dt), lse({b, hq, s}, Dtype::kFp32),
          dout({T, hq * d}, dt), dx({T, width}, dt), dq({T, hq * d}, Dtype::kFp32),
          rowsum({b, hq, s}, Dtype::kFp32);
      qkv.set(xv), dout.set(gv), dx.set(prior);
      flash_attention_forward(shape, qkv.t, out.t, lse.t, nullptr);
      flash_attention_backward(shape, qkv.t, out.t, lse.t, dout.t, dx.t, true, dq.t, rowsum.t,
                               nullptr);
      std::vector<double> outr(T * hq * d, 0.0), lser(b * hq * s), dxr = prior;
      const double scale = 1.0 / std::sqrt(double(d));
      auto at = [&](int64_t bi, int64_t pos, int64_t col) {
        return xv[(pos * b + bi) * width + col];
      };
      for (int64_t bi = 0; bi < b; ++bi)
        for (int64_t h = 0; h < hq; ++h) {
          int64_t kc = (hq + h / (hq / hkv)) * d, vc = (hq + hkv + h / (hq / hkv)) * d, qc = h * d;
          for (int64_t i = 0; i < s; ++i) {
            std::vector<double> p(i + 1);
            double m = -1e300, z = 0;
            for (int64_t j = 0; j <= i; ++j) {
              double sc = 0;
              for (int64_t c = 0; c < d; ++c) sc += at(bi, i, qc + c) * at(bi, j, kc + c);
              p[j] = sc * scale, m = std::max(m, p[j]);
            }
            for (int64_t j = 0; j <= i; ++j) z += p[j] = std::exp(p[j] - m);
            for (int64_t j = 0; j <= i; ++j) p[j] /= z;
            lser[(bi * hq + h) * s + i] = m + std::log(z);
            int64_t ti = i * b + bi;
            double D = 0;
            std::vector<double> o(d, 0.0);
            for (int64_t j = 0; j <= i; ++j)
              for (int64_t c = 0; c < d; ++c) o[c] += p[j] * at(bi, j, vc + c);
            for (int64_t c = 0; c < d; ++c) {
              outr[ti * hq * d + qc + c] = o[c];
              D += gv[ti * hq * d + qc + c] * o[c];
            }
            for (int64_t j = 0; j <= i; ++j) {
              int64_t tj = j * b + bi;
              double dov = 0;
              for (int64_t c = 0; c < d; ++c) dov += gv[ti * hq * d + qc + c] * at(bi, j, vc + c);
              double ds = p[j] * (dov - D);
              for (int64_t c = 0; c < d; ++c) {
                dxr[tj * width + vc + c] += p[j] * gv[ti * hq * d + qc + c];
                dxr[ti * width + qc + c] += scale * ds * at(bi, j, kc + c);
                dxr[tj * width + kc + c] += scale * ds * at(bi, i, qc + c);
              }
            }
          }
        }
      std::string name =
          (dt == Dtype::kBf16 ? "bf16" : "fp32") + std::string(" d ") + std::to_string(d);
      expect_close(out.get(), outr, tolerance(dt), "attention output " + name);
      expect_close(lse.get(), lser, 1e-5, "attention logsumexp " + name);
      expect_close(dx.get(), dxr, tolerance(dt), "attention dqkv (accumulated) " + name);
    }
}

// The vocabulary-parallel embedding and cross-entropy on the shard of TP rank 1 of 2 (ids outside
// the shard give zero rows and no target logit), against a direct evaluation.
TEST(CudaKernels, EmbeddingAndCrossEntropyOnAVocabShard) {
  const int64_t rows = 71, v = 229, h = 37, rank = 1;
  std::mt19937 rng(51);
  std::uniform_int_distribution<int64_t> id(0, 2 * v - 1);
  std::vector<int64_t> ids(rows);
  for (int64_t& x : ids) x = id(rng);
  DeviceTensor idt({rows}, Dtype::kI64), tgt({rows}, Dtype::kI64);
  idt.set_raw(ids.data());
  tgt.set_raw(ids.data());
  for (Dtype d : {Dtype::kFp32, Dtype::kBf16}) {
    auto wv = random_values(v * h, 52), lv = random_values(rows * v, 53),
         prior = random_values(rows * v, 54);
    DeviceTensor w({v, h}, d), out({rows, h}, d), logits({rows, v}, d), mx({rows}, Dtype::kFp32),
        sm({rows, v}, Dtype::kFp32), se({rows}, Dtype::kFp32), tg({rows}, Dtype::kFp32),
        loss({rows}, Dtype::kFp32), dl({rows, v}, d);
    w.set(wv), logits.set(lv), dl.set(prior);
    embedding_forward(idt.t, w.t, out.t, rank, nullptr);
    auto ev = random_values(rows * h, 55);
    DeviceTensor dout({rows, h}, d), dwt({v, h}, Dtype::kFp32);
    dout.set(ev), dwt.set(std::vector<double>(v * h, 0.0));
    embedding_backward(idt.t, dout.t, dwt.t, rank, nullptr);
    std::vector<double> dwr(v * h, 0.0);
    for (int64_t t = 0; t < rows; ++t) {
      int64_t r = ids[t] - rank * v;
      if (r >= 0 && r < v)
        for (int64_t c = 0; c < h; ++c) dwr[r * h + c] += ev[t * h + c];
    }
    expect_close(dwt.get(), dwr, 1e-6,
                 std::string("embedding dW ") + (d == Dtype::kBf16 ? "bf16" : "fp32"));
    cross_entropy_max(logits.t, mx.t, nullptr);
    cross_entropy_exp_sum(logits.t, tgt.t, mx.t, sm.t, se.t, tg.t, rank, nullptr);
    cross_entropy_finalize(sm.t, se.t, mx.t, tg.t, loss.t, nullptr, nullptr);
    const float scale = 0.125f;
    cross_entropy_backward(sm.t, tgt.t, dl.t, true, rank, scale, nullptr, nullptr);
    std::vector<double> outr(rows * h, 0.0), lossr(rows), smr(rows * v), dlr = prior;
    for (int64_t t = 0; t < rows; ++t) {
      int64_t r = ids[t] - rank * v;
      bool here = r >= 0 && r < v;
      for (int64_t c = 0; c < h && here; ++c) outr[t * h + c] = wv[r * h + c];
      double m = -1e300, z = 0;
      for (int64_t j = 0; j < v; ++j) m = std::max(m, lv[t * v + j]);
      for (int64_t j = 0; j < v; ++j) z += std::exp(lv[t * v + j] - m);
      lossr[t] = std::log(z) + m - (here ? lv[t * v + r] : 0.0);
      for (int64_t j = 0; j < v; ++j) {
        smr[t * v + j] = std::exp(lv[t * v + j] - m) / z;
        dlr[t * v + j] += (smr[t * v + j] - (j == r ? 1.0 : 0.0)) * scale;
      }
    }
    std::string name = d == Dtype::kBf16 ? "bf16" : "fp32";
    expect_close(out.get(), outr, 0, "embedding " + name);
    expect_close(loss.get(), lossr, 1e-5, "cross-entropy loss (this shard) " + name);
    expect_close(sm.get(), smr, 1e-5, "cross-entropy softmax " + name);
    expect_close(dl.get(), dlr, tolerance(d), "cross-entropy dlogits (accumulated) " + name);
    // Transformer Engine's loss: no softmax stored; the loss and each row's {max, log sum}, then
    // the gradient from the logits and those (accumulated onto the same prior).
    DeviceTensor mx2({rows}, Dtype::kFp32), se2({rows}, Dtype::kFp32), tg2({rows}, Dtype::kFp32),
        loss2({rows}, Dtype::kFp32), stats({rows, 2}, Dtype::kFp32), dl2({rows, v}, d);
    dl2.set(prior);
    cross_entropy_max(logits.t, mx2.t, nullptr);
    cross_entropy_exp_sum(logits.t, tgt.t, mx2.t, Tensor{}, se2.t, tg2.t, rank, nullptr);
    cross_entropy_te_finalize(se2.t, mx2.t, tg2.t, loss2.t, stats.t, nullptr);
    cross_entropy_te_backward(logits.t, stats.t, tgt.t, dl2.t, true, rank, scale, nullptr);
    std::vector<double> statsr(2 * rows);
    for (int64_t t = 0; t < rows; ++t) {
      double m = -1e300, z = 0;
      for (int64_t j = 0; j < v; ++j) m = std::max(m, lv[t * v + j]);
      for (int64_t j = 0; j < v; ++j) z += std::exp(lv[t * v + j] - m);
      statsr[2 * t] = m, statsr[2 * t + 1] = std::log(z);
    }
    expect_close(loss2.get(), lossr, 1e-5, "TE cross-entropy loss " + name);
    expect_close(stats.get(), statsr, 1e-5, "TE cross-entropy row statistics " + name);
    expect_close(dl2.get(), dlr, tolerance(d), "TE cross-entropy dlogits (accumulated) " + name);
    // Megatron's embedding gradient: whole in bf16 first, then added into the fp32 buffer.
    DeviceTensor dense({v, h}, Dtype::kBf16), dwt2({v, h}, Dtype::kFp32);
    dense.set(std::vector<double>(v * h, 0.0)), dwt2.set(std::vector<double>(v * h, 0.0));
    embedding_backward(idt.t, dout.t, dense.t, rank, nullptr);
    accumulate(dwt2.t, dense.t, nullptr);
    expect_close(dwt2.get(), dwr, tolerance(Dtype::kBf16), "embedding dW through bf16 " + name);
  }
}

// The hf profile's kernels against direct evaluations: PyTorch's RMSNorm order (fp32 copy, 1/rms,
// normalized, times w; backward from those), repeat_kv (GQA 6 query heads over 2 KV heads) and
// the log-softmax loss (log-probabilities kept; backward through the NLL's fp32 gradient).
TEST(CudaKernels, HuggingFaceKernels) {
  const int64_t rows = 37, h = 131, hq = 6, hkv = 2, d = 8, v = 97;
  const float eps = 1e-5f;
  auto xv = random_values(rows * h, 81), wv = random_values(h, 82, 0.5, 1.5),
       gv = random_values(rows * h, 83);
  DeviceTensor x({rows, h}, Dtype::kFp32), w({h}, Dtype::kFp32), y({rows, h}, Dtype::kFp32),
      a({rows, h}, Dtype::kFp32), r({rows}, Dtype::kFp32), b({rows, h}, Dtype::kFp32),
      c({rows, h}, Dtype::kFp32), dy({rows, h}, Dtype::kFp32), db({rows, h}, Dtype::kFp32),
      da({rows, h}, Dtype::kFp32), dx({rows, h}, Dtype::kFp32), dw({h}, Dtype::kFp32);
  x.set(xv), w.set(wv), dy.set(gv), dw.set(std::vector<double>(h, 0.0));
  rmsnorm_hf_forward(x.t, w.t, y.t, a.t, r.t, b.t, c.t, eps, nullptr);
  rmsnorm_hf_backward(a.t, r.t, c.t, w.t, dy.t, db.t, da.t, dx.t, false, dw.t, nullptr);
  std::vector<double> yr(rows * h), rr(rows), dxr(rows * h), dwr(h, 0.0);
  for (int64_t t = 0; t < rows; ++t) {
    double ss = 0, dot = 0;
    for (int64_t k = 0; k < h; ++k) ss += xv[t * h + k] * xv[t * h + k];
    rr[t] = 1.0 / std::sqrt(ss / h + eps);
    for (int64_t k = 0; k < h; ++k) {
      yr[t * h + k] = wv[k] * xv[t * h + k] * rr[t];
      dot += gv[t * h + k] * wv[k] * xv[t * h + k];
      dwr[k] += gv[t * h + k] * xv[t * h + k] * rr[t];
    }
    for (int64_t k = 0; k < h; ++k)
      dxr[t * h + k] =
          gv[t * h + k] * wv[k] * rr[t] - xv[t * h + k] * rr[t] * rr[t] * rr[t] * dot / h;
  }
  expect_close(y.get(), yr, 1e-5, "rmsnorm_hf forward");
  expect_close(a.get(), xv, 0, "rmsnorm_hf fp32 input");
  expect_close(r.get(), rr, 1e-6, "rmsnorm_hf rstd");
  expect_close(dx.get(), dxr, 1e-5, "rmsnorm_hf dx");
  expect_close(dw.get(), dwr, 1e-5, "rmsnorm_hf dw");

  const int64_t wx = (hq + 2 * hkv) * d, wy = 3 * hq * d;
  auto qv = random_values(rows * wx, 84), ev = random_values(rows * wy, 85);
  DeviceTensor qkv({rows, wx}, Dtype::kBf16), rep({rows, wy}, Dtype::kBf16),
      g({rows, wy}, Dtype::kFp32), dq({rows, wx}, Dtype::kFp32);
  qkv.set(qv), g.set(ev);
  repeat_kv_forward(qkv.t, rep.t, hq, hkv, d, nullptr);
  repeat_kv_backward(g.t, dq.t, false, hq, hkv, d, nullptr);
  std::vector<double> q16 = qkv.get(), repr(rows * wy), dqr(rows * wx, 0.0);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t hh = 0; hh < hq; ++hh)
      for (int64_t j = 0; j < d; ++j) {
        int64_t kv = hh / (hq / hkv);
        repr[t * wy + hh * d + j] = q16[t * wx + hh * d + j];
        repr[t * wy + (hq + hh) * d + j] = q16[t * wx + (hq + kv) * d + j];
        repr[t * wy + (2 * hq + hh) * d + j] = q16[t * wx + (hq + hkv + kv) * d + j];
        dqr[t * wx + hh * d + j] = ev[t * wy + hh * d + j];
        dqr[t * wx + (hq + kv) * d + j] += ev[t * wy + (hq + hh) * d + j];
        dqr[t * wx + (hq + hkv + kv) * d + j] += ev[t * wy + (2 * hq + hh) * d + j];
      }
  expect_close(rep.get(), repr, 0, "repeat_kv forward");
  expect_close(dq.get(), dqr, 1e-6, "repeat_kv backward");

  std::mt19937 ids_rng(86);
  std::vector<int64_t> ids(rows);
  for (int64_t& i : ids) i = std::uniform_int_distribution<int64_t>(0, v - 1)(ids_rng);
  auto lv = random_values(rows * v, 87);
  DeviceTensor logits({rows, v}, Dtype::kFp32), tgt({rows}, Dtype::kI64), mx({rows}, Dtype::kFp32),
      sm({rows, v}, Dtype::kFp32), se({rows}, Dtype::kFp32), tg({rows}, Dtype::kFp32),
      loss({rows}, Dtype::kFp32), nll({rows, v}, Dtype::kFp32), dl({rows, v}, Dtype::kFp32);
  logits.set(lv), tgt.set_raw(ids.data());
  cross_entropy_max(logits.t, mx.t, nullptr);
  cross_entropy_exp_sum(logits.t, tgt.t, mx.t, sm.t, se.t, tg.t, 0, nullptr);
  cross_entropy_finalize(sm.t, se.t, mx.t, tg.t, loss.t, &logits.t, nullptr);
  const float scale = 0.25f;
  cross_entropy_backward(sm.t, tgt.t, dl.t, false, 0, scale, &nll.t, nullptr);
  std::vector<double> lpr(rows * v), nllr(rows * v, 0.0), dlr(rows * v);
  for (int64_t t = 0; t < rows; ++t) {
    double m = -1e300, z = 0;
    for (int64_t j = 0; j < v; ++j) m = std::max(m, lv[t * v + j]);
    for (int64_t j = 0; j < v; ++j) z += std::exp(lv[t * v + j] - m);
    nllr[t * v + ids[t]] = -scale;
    for (int64_t j = 0; j < v; ++j) {
      lpr[t * v + j] = lv[t * v + j] - m - std::log(z);
      dlr[t * v + j] = nllr[t * v + j] + std::exp(lpr[t * v + j]) * scale;
    }
  }
  expect_close(sm.get(), lpr, 1e-5, "log-softmax loss: log-probabilities");
  expect_close(nll.get(), nllr, 0, "log-softmax loss: the NLL's gradient");
  expect_close(dl.get(), dlr, 1e-5, "log-softmax loss: dlogits");
}

TEST(CudaKernels, LayerNormAndGelu) {
  const int64_t rows = 71, h = 229;
  const float eps = 1e-5f;
  for (Dtype d : {Dtype::kFp32, Dtype::kBf16}) {
    auto xv = random_values(rows * h, 61), wv = random_values(h, 62, 0.5, 1.5),
         bv = random_values(h, 63), gv = random_values(rows * h, 64);
    DeviceTensor x({rows, h}, d), w({h}, d), b({h}, d), y({rows, h}, d), dy({rows, h}, d),
        dx({rows, h}, d), dw({h}, Dtype::kFp32), db({h}, Dtype::kFp32), mean({rows}, Dtype::kFp32),
        rstd({rows}, Dtype::kFp32), gy({rows, h}, d), gdx({rows, h}, d);
    x.set(xv), w.set(wv), b.set(bv), dy.set(gv), dw.set(std::vector<double>(h, 0.0)),
        db.set(std::vector<double>(h, 0.0));
    layernorm_forward(x.t, w.t, b.t, y.t, nullptr, nullptr, eps, nullptr);
    layernorm_backward(x.t, w.t, dy.t, dx.t, false, dw.t, db.t, mean.t, rstd.t, false, eps,
                       nullptr);
    gelu_forward(x.t, gy.t, nullptr);
    gelu_backward(x.t, dy.t, gdx.t, false, nullptr);
    std::vector<double> yr(rows * h), dxr(rows * h), dwr(h, 0.0), dbr(h, 0.0), gyr(rows * h),
        gdr(rows * h);
    const double c0 = std::sqrt(2.0 / 3.141592653589793), a0 = 0.044715;
    for (int64_t r = 0; r < rows; ++r) {
      double mu = 0, var = 0, mg = 0, mgx = 0;
      for (int64_t c = 0; c < h; ++c) mu += xv[r * h + c];
      mu /= h;
      for (int64_t c = 0; c < h; ++c) var += (xv[r * h + c] - mu) * (xv[r * h + c] - mu);
      double inv = 1 / std::sqrt(var / h + eps);
      for (int64_t c = 0; c < h; ++c) {
        double xh = (xv[r * h + c] - mu) * inv, g = gv[r * h + c];
        yr[r * h + c] = xh * wv[c] + bv[c];
        mg += g * wv[c], mgx += g * wv[c] * xh;
        dwr[c] += g * xh, dbr[c] += g;
        double v = xv[r * h + c], th = std::tanh(c0 * (v + a0 * v * v * v));
        gyr[r * h + c] = 0.5 * v * (1 + th);
        gdr[r * h + c] = g * (0.5 * (1 + th) + 0.5 * v * (1 - th * th) * c0 * (1 + 3 * a0 * v * v));
      }
      for (int64_t c = 0; c < h; ++c) {
        double xh = (xv[r * h + c] - mu) * inv;
        dxr[r * h + c] = inv * (gv[r * h + c] * wv[c] - mg / h - xh * mgx / h);
      }
    }
    std::string name = d == Dtype::kBf16 ? "bf16" : "fp32";
    expect_close(y.get(), yr, tolerance(d), "layernorm forward " + name);
    expect_close(dx.get(), dxr, tolerance(d), "layernorm dx " + name);
    expect_close(dw.get(), dwr, 1e-5, "layernorm dw " + name);
    expect_close(db.get(), dbr, 1e-5, "layernorm db " + name);
    expect_close(gy.get(), gyr, tolerance(d), "gelu forward " + name);
    expect_close(gdx.get(), gdr, tolerance(d), "gelu dx " + name);
  }
}

// Dropout draws the CPU reference's numbers (executor/rng.cpp) bit for bit: rows of a sequence
// shard and attention probabilities of TP rank 1 of 2.
TEST(CudaKernels, DropoutMaskIsTheCpuReferencesBitForBit) {
  const float p = 0.3f;
  const uint64_t seed = 1234, stream_id = 0xABCDEF;
  for (bool probs : {false, true}) {
    DropoutLayout l;
    std::vector<int64_t> shape;
    if (probs) {
      l.probs = true, l.heads_local = 3, l.seq = 13, l.tp = 2, l.tp_rank = 1;
      shape = {2, 3, 13, 13};
    } else {
      l.width = 37, l.first_row = 71;
      shape = {71, 37};
    }
    DeviceTensor x(shape, Dtype::kBf16), y(shape, Dtype::kBf16), mask(shape, Dtype::kU8),
        dy(shape, Dtype::kBf16), dx(shape, Dtype::kBf16);
    int64_t n = x.t.numel();
    auto xv = random_values(n, 71), gv = random_values(n, 72);
    x.set(xv), dy.set(gv);
    dropout_forward(x.t, y.t, mask.t, p, seed, stream_id, l, nullptr);
    dropout_backward(dy.t, mask.t, dx.t, false, p, nullptr);
    int kept = 0;
    const std::vector<uint8_t> mk = mask.as<uint8_t>();
    const std::vector<double> yh = y.get(), dxh = dx.get();
    for (int64_t i = 0; i < n; ++i) {
      uint64_t index;
      if (probs) {
        int64_t s = 13, j = i % s, r = i / s, row = r % s, hb = r / s, h = hb % 3, bi = hb / 3;
        index = static_cast<uint64_t>(((bi * 6 + 1 * 3 + h) * s + row) * s + j);
      } else {
        index = static_cast<uint64_t>((71 + i / 37) * 37 + i % 37);
      }
      bool keep = exec::counter_uniform(seed, stream_id, index) >= p;
      kept += keep;
      ASSERT_EQ(mk[i], keep ? 1 : 0) << i;
      float want = keep ? static_cast<float>(xv[i]) / (1.0f - p) : 0.0f;
      ASSERT_EQ(yh[i], exec::bf16_to_f32(exec::f32_to_bf16(want))) << i;
      float gwant = keep ? static_cast<float>(gv[i]) / (1.0f - p) : 0.0f;
      ASSERT_EQ(dxh[i], exec::bf16_to_f32(exec::f32_to_bf16(gwant))) << i;
    }
    EXPECT_GT(kept, n / 2);
    EXPECT_LT(kept, n * 9 / 10);
  }
}

// Learned positions on a sequence shard that starts mid-position (first row 5, batch 2).
TEST(CudaKernels, PositionEmbeddingOnASequenceShard) {
  const int64_t rows = 71, h = 37, batch = 2, first = 5, table = 64;
  for (Dtype d : {Dtype::kFp32, Dtype::kBf16}) {
    auto xv = random_values(rows * h, 81), wv = random_values(table * h, 82),
         gv = random_values(rows * h, 83);
    DeviceTensor x({rows, h}, d), w({table, h}, d), out({rows, h}, d), dy({rows, h}, d),
        dw({table, h}, Dtype::kFp32);
    x.set(xv), w.set(wv), dy.set(gv), dw.set(std::vector<double>(table * h, 0.0));
    pos_embedding_forward(x.t, w.t, out.t, first, batch, nullptr);
    pos_embedding_backward(dy.t, dw.t, first, batch, nullptr);
    std::vector<double> outr(rows * h), dwr(table * h, 0.0);
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t c = 0; c < h; ++c) {
        int64_t pos = (first + t) / batch;
        outr[t * h + c] = xv[t * h + c] + wv[pos * h + c];
        dwr[pos * h + c] += gv[t * h + c];
      }
    std::string name = d == Dtype::kBf16 ? "bf16" : "fp32";
    expect_close(out.get(), outr, tolerance(d), "pos_embedding forward " + name);
    expect_close(dw.get(), dwr, 1e-6, "pos_embedding dW " + name);
  }
  DeviceTensor x({4, 3}, Dtype::kFp32), w({2, 3}, Dtype::kFp32), out({4, 3}, Dtype::kFp32);
  EXPECT_THROW(pos_embedding_forward(x.t, w.t, out.t, 2, 1, nullptr), std::invalid_argument)
      << "position 5 is beyond a table of 2";
}

// The embedding backward across several id tiles (300 tokens) and column chunks (2,100 columns).
TEST(CudaKernels, EmbeddingBackwardAcrossTilesAndChunks) {
  const int64_t rows = 300, v = 5, h = 2100;
  std::vector<int64_t> ids(rows);
  for (int64_t t = 0; t < rows; ++t) ids[t] = (t * 7) % (v + 2);  // some ids outside the shard
  DeviceTensor idt({rows}, Dtype::kI64), dy({rows, h}, Dtype::kFp32), dw({v, h}, Dtype::kFp32);
  idt.set_raw(ids.data());
  auto gv = random_values(rows * h, 91);
  dy.set(gv), dw.set(std::vector<double>(v * h, 0.0));
  embedding_backward(idt.t, dy.t, dw.t, 0, nullptr);
  std::vector<double> want(v * h, 0.0);
  for (int64_t t = 0; t < rows; ++t)
    if (ids[t] < v)
      for (int64_t c = 0; c < h; ++c) want[ids[t] * h + c] += gv[t * h + c];
  expect_close(dw.get(), want, 1e-6, "embedding dW over tiles and chunks");
}

// The eager path's causal softmax (rows of 37 positions, more than one warp's worth of keys only
// late in the sequence) and its backward, against a double reference.
TEST(CudaKernels, CausalSoftmaxForwardAndBackward) {
  const int64_t b = 2, heads = 3, s = 37, d = 8, n = b * heads * s * s;
  for (Dtype dt : {Dtype::kFp32, Dtype::kBf16}) {
    auto xv = random_values(n, 101, -4, 4), gv = random_values(n, 102);
    DeviceTensor x({b, heads, s, s}, dt), p({b, heads, s, s}, dt), g({b, heads, s, s}, dt),
        dx({b, heads, s, s}, dt);
    x.set(xv), g.set(gv);
    causal_softmax_forward(x.t, p.t, d, nullptr);
    causal_softmax_backward(p.t, g.t, dx.t, false, d, nullptr);
    std::vector<double> pr(n, 0.0), dr(n, 0.0);
    const double scale = 1 / std::sqrt(double(d));
    auto pv = p.get();  // the backward reads the stored (rounded) probabilities
    for (int64_t r = 0; r < n / s; ++r) {
      int64_t i = r % s;
      double m = -1e300, z = 0, dot = 0;
      for (int64_t j = 0; j <= i; ++j) m = std::max(m, scale * xv[r * s + j]);
      for (int64_t j = 0; j <= i; ++j) z += std::exp(scale * xv[r * s + j] - m);
      for (int64_t j = 0; j <= i; ++j) pr[r * s + j] = std::exp(scale * xv[r * s + j] - m) / z;
      for (int64_t j = 0; j < s; ++j) dot += pv[r * s + j] * gv[r * s + j];
      for (int64_t j = 0; j < s; ++j) dr[r * s + j] = scale * pv[r * s + j] * (gv[r * s + j] - dot);
    }
    std::string name = dt == Dtype::kBf16 ? "bf16" : "fp32";
    expect_close(pv, pr, tolerance(dt), "softmax " + name);
    expect_close(dx.get(), dr, tolerance(dt), "softmax backward " + name);
  }
}

// Eager attention's GEMMs through cuBLAS (strided batches over each key-value head's group of
// three query heads, an odd sequence length, batch 2): scores = Q K^T with 0 above the diagonal,
// context = P V, and their backwards (dqkv written over poison for scores, accumulated onto a
// prior value for context; dprobs 0 above the diagonal), against a direct evaluation.
TEST(CudaKernels, EagerAttentionGemms) {
  const int64_t b = 2, s = 37, hq = 6, hkv = 2, d = 8, width = (hq + 2 * hkv) * d, T = b * s;
  const AttentionShape shape{b, s, hq, hkv, d};
  cublasHandle_t blas = nullptr;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  auto lower = [&](std::vector<double> v) {  // zero above the diagonal of {b, hq, s, s}
    for (size_t e = 0; e < v.size(); ++e)
      if (int64_t(e) % s > (int64_t(e) / s) % s) v[e] = 0;
    return v;
  };
  for (Dtype dt : {Dtype::kFp32, Dtype::kBf16}) {
    auto xv = random_values(T * width, 51), pv = lower(random_values(b * hq * s * s, 52)),
         gsv = lower(random_values(b * hq * s * s, 53)), gov = random_values(T * hq * d, 54),
         prior = random_values(T * width, 55);
    DeviceTensor qkv({T, width}, dt), sc({b, hq, s, s}, dt), dx1({T, width}, dt),
        probs({b, hq, s, s}, dt), gs({b, hq, s, s}, dt), ctx({T, hq * d}, dt),
        dout({T, hq * d}, dt), dp({b, hq, s, s}, dt), dx2({T, width}, dt);
    qkv.set(xv), probs.set(pv), gs.set(gsv), dout.set(gov), dx2.set(prior);
    attn_scores_forward(blas, shape, qkv.t, sc.t, nullptr);
    attn_scores_backward(blas, shape, qkv.t, gs.t, dx1.t, false, nullptr);
    attn_context_forward(blas, shape, probs.t, qkv.t, ctx.t, nullptr);
    attn_context_backward(blas, shape, probs.t, qkv.t, dout.t, dp.t, false, dx2.t, true, nullptr);
    std::vector<double> scr(b * hq * s * s, 0.0), dx1r(T * width, 0.0), ctxr(T * hq * d, 0.0),
        dpr(b * hq * s * s, 0.0), dx2r = prior;
    auto x = [&](int64_t bi, int64_t pos, int64_t col) { return xv[(pos * b + bi) * width + col]; };
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t h = 0; h < hq; ++h) {
        int64_t qc = h * d, kc = (hq + h / (hq / hkv)) * d, vc = (hq + hkv + h / (hq / hkv)) * d;
        for (int64_t i = 0; i < s; ++i)
          for (int64_t j = 0; j <= i; ++j) {
            int64_t e = ((bi * hq + h) * s + i) * s + j, ti = i * b + bi, tj = j * b + bi;
            double dpe = 0;
            for (int64_t c = 0; c < d; ++c) {
              scr[e] += x(bi, i, qc + c) * x(bi, j, kc + c);
              dx1r[ti * width + qc + c] += gsv[e] * x(bi, j, kc + c);
              dx1r[tj * width + kc + c] += gsv[e] * x(bi, i, qc + c);
              ctxr[ti * hq * d + qc + c] += pv[e] * x(bi, j, vc + c);
              dpe += gov[ti * hq * d + qc + c] * x(bi, j, vc + c);
              dx2r[tj * width + vc + c] += pv[e] * gov[ti * hq * d + qc + c];
            }
            dpr[e] = dpe;
          }
      }
    std::string name = dt == Dtype::kBf16 ? " bf16" : " fp32";
    expect_close(sc.get(), scr, tolerance(dt), "scores" + name);
    expect_close(dx1.get(), dx1r, tolerance(dt), "scores dqkv" + name);
    expect_close(ctx.get(), ctxr, tolerance(dt), "context" + name);
    expect_close(dp.get(), dpr, tolerance(dt), "context dprobs" + name);
    expect_close(dx2.get(), dx2r, tolerance(dt), "context dqkv (accumulated)" + name);
  }
  cublasDestroy(blas);
}

// Mixture of experts on 37 tokens, 6 experts, top-2, width 29 (odd): top-k routing (and its
// backward), the router's backward, dispatch and combine (over more than one chunk of the
// routing scan: 74 items), the grouped expert GEMMs and the shared gate, against a direct
// evaluation on the routing the kernels chose (itself checked against the reference top-k).
TEST(CudaKernels, MixtureOfExperts) {
  const int64_t T = 37, E = 6, k = 2, h = 29, F = 11, N = T * k;
  cublasHandle_t blas = nullptr;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  const Dtype bf = Dtype::kBf16, f32 = Dtype::kFp32;
  auto lv = random_values(T * E, 61), xv = random_values(T * h, 62), wv = random_values(E * h, 63),
       gpv = random_values(T * k, 64), glv = random_values(T * E, 65);
  DeviceTensor logits({T, E}, f32), probs({T, k}, f32), idx({T, k}, Dtype::kI64),
      dprobs({T, k}, f32), dlogits({T, E}, f32);
  logits.set(lv), dprobs.set(gpv);
  topk_forward(logits.t, probs.t, idx.t, nullptr);
  topk_backward(probs.t, idx.t, dprobs.t, dlogits.t, false, nullptr);
  const std::vector<int64_t> idv = idx.as<int64_t>();
  const int64_t* id = idv.data();
  std::vector<double> pr(T * k), dlr(T * E, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int64_t> order(E);
    for (int64_t e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return lv[t * E + a] > lv[t * E + b]; });
    double z = 0, pg = 0;
    for (int64_t j = 0; j < k; ++j) {
      ASSERT_EQ(id[t * k + j], order[j]) << "token " << t << " choice " << j;
      z += std::exp(lv[t * E + order[j]] - lv[t * E + order[0]]);
    }
    for (int64_t j = 0; j < k; ++j)
      pr[t * k + j] = std::exp(lv[t * E + order[j]] - lv[t * E + order[0]]) / z;
    for (int64_t j = 0; j < k; ++j) pg += pr[t * k + j] * gpv[t * k + j];
    for (int64_t j = 0; j < k; ++j) dlr[t * E + order[j]] = pr[t * k + j] * (gpv[t * k + j] - pg);
  }
  expect_close(probs.get(), pr, 1e-5, "topk probabilities");
  expect_close(dlogits.get(), dlr, 1e-5, "topk backward");

  // The router's backward: dx = g W (accumulated onto a prior), dW += g^T x.
  DeviceTensor x({T, h}, bf), w({E, h}, bf), gl({T, E}, f32), dx({T, h}, bf), dw({E, h}, f32);
  auto prior = random_values(T * h, 66), wprior = random_values(E * h, 67);
  x.set(xv), w.set(wv), gl.set(glv), dx.set(prior), dw.set(wprior);
  router_backward(x.t, w.t, gl.t, dx.t, true, dw.t, nullptr, nullptr);
  std::vector<double> dxr = prior, dwr = wprior;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e)
      for (int64_t c = 0; c < h; ++c) {
        dxr[t * h + c] += glv[t * E + e] * wv[e * h + c];
        dwr[e * h + c] += glv[t * E + e] * xv[t * h + c];
      }
  expect_close(dx.get(), dxr, tolerance(bf), "router dx");
  expect_close(dw.get(), dwr, tolerance(f32), "router dW");

  // Expert-major rows of the kernels' routing, as the CPU reference lays them out.
  std::vector<int64_t> row(N), count(E + 1, 0);
  for (int64_t i = 0; i < N; ++i) ++count[id[i] + 1];
  for (int64_t e = 0; e < E; ++e) count[e + 1] += count[e];
  for (int64_t i = 0; i < N; ++i) row[i] = count[id[i]]++;
  auto yev = random_values(N * h, 68), gov = random_values(T * h, 69),
       dpprior = random_values(T * k, 70);
  DeviceTensor xe({N, h}, bf), dxe({N, h}, bf), dxd({T, h}, bf), ye({N, h}, bf), comb({T, h}, bf),
      gout({T, h}, bf), dye({N, h}, bf), dpc({T, k}, f32);
  ye.set(yev), gout.set(gov), dxe.set(yev), dpc.set(dpprior);
  moe_dispatch_forward(x.t, idx.t, xe.t, E, 0, nullptr);
  moe_dispatch_backward(dxe.t, idx.t, dxd.t, false, E, 0, nullptr);
  moe_combine_forward(ye.t, probs.t, idx.t, comb.t, E, 0, nullptr);
  moe_combine_backward(ye.t, probs.t, idx.t, gout.t, dye.t, false, dpc.t, true, E, 0, nullptr);
  auto pk = probs.get();
  // The double references of dispatch, its backward, combine and its backward for a layout: the
  // row of each choice (-1: dropped) over `rows` rows, y the expert outputs (and the dispatch's
  // gradient), dp0 what the probabilities' gradient starts from.
  struct Routed {
    std::vector<double> xe, dx, comb, dye, dp;
  };
  auto routed = [&](const std::vector<int64_t>& at, int64_t rows, const std::vector<double>& yv,
                    const std::vector<double>& dp0) {
    Routed r{std::vector<double>(rows * h, 0.0), std::vector<double>(T * h, 0.0),
             std::vector<double>(T * h, 0.0), std::vector<double>(rows * h, 0.0), dp0};
    for (int64_t i = 0; i < N; ++i) {
      int64_t t = i / k, q = at[i];
      if (q < 0) continue;
      for (int64_t c = 0; c < h; ++c) {
        r.xe[q * h + c] = xv[t * h + c];
        r.dx[t * h + c] += yv[q * h + c];
        r.comb[t * h + c] += pk[i] * yv[q * h + c];
        r.dye[q * h + c] = pk[i] * gov[t * h + c];
        r.dp[i] += yv[q * h + c] * gov[t * h + c];
      }
    }
    return r;
  };
  Routed ref = routed(row, N, yev, dpprior);
  expect_close(xe.get(), ref.xe, tolerance(bf), "dispatch");
  expect_close(dxd.get(), ref.dx, tolerance(bf), "dispatch backward");
  expect_close(comb.get(), ref.comb, tolerance(bf), "combine");
  expect_close(dye.get(), ref.dye, tolerance(bf), "combine backward: expert outputs");
  expect_close(dpc.get(), ref.dp, tolerance(f32), "combine backward: probabilities (accumulated)");

  // The grouped expert GEMMs: out[r] = xe[r] W_e^T for the rows r of expert e; dx, dW +=.
  auto wev = random_values(E * F * h, 71), gev = random_values(N * F, 72);
  DeviceTensor we({E, F, h}, bf), eo({N, F}, bf), ge({N, F}, bf), dxe2({N, h}, bf),
      dwe({E, F, h}, f32);
  we.set(wev), ge.set(gev), dwe.set(std::vector<double>(E * F * h, 0.0));
  expert_forward(blas, xe.t, idx.t, we.t, eo.t, 0, nullptr);
  expert_backward(blas, xe.t, idx.t, we.t, ge.t, dxe2.t, false, dwe.t, 0, nullptr);
  // The double references of the grouped GEMMs: row r of the dispatched rows xr belongs to
  // expert expert_of[r]; g the output gradient.
  struct Grouped {
    std::vector<double> out, dx, dw;
  };
  auto grouped = [&](const std::vector<int64_t>& expert_of, const std::vector<double>& xr,
                     const std::vector<double>& g) {
    const int64_t rows = static_cast<int64_t>(expert_of.size());
    Grouped r{std::vector<double>(rows * F, 0.0), std::vector<double>(rows * h, 0.0),
              std::vector<double>(E * F * h, 0.0)};
    for (int64_t q = 0; q < rows; ++q) {
      int64_t e = expert_of[q];
      for (int64_t f = 0; f < F; ++f)
        for (int64_t c = 0; c < h; ++c) {
          r.out[q * F + f] += xr[q * h + c] * wev[(e * F + f) * h + c];
          r.dx[q * h + c] += g[q * F + f] * wev[(e * F + f) * h + c];
          r.dw[(e * F + f) * h + c] += g[q * F + f] * xr[q * h + c];
        }
    }
    return r;
  };
  std::vector<int64_t> expert_of_row(N);
  for (int64_t i = 0; i < N; ++i) expert_of_row[row[i]] = id[i];
  Grouped gref = grouped(expert_of_row, ref.xe, gev);
  expect_close(eo.get(), gref.out, tolerance(bf), "expert GEMMs");
  expect_close(dxe2.get(), gref.dx, tolerance(bf), "expert GEMMs backward: dx");
  expect_close(dwe.get(), gref.dw, tolerance(f32), "expert GEMMs backward: dW");

  // With a capacity of C = 5 slots per expert (74 choices over 6 experts: many dropped): choice i
  // takes slot e C + (its rank among e's choices) while that is below C; every other slot is zero,
  // as are the gradients of dropped choices. Buffers start as garbage (prior values).
  const int64_t C = 5, R = E * C;
  std::vector<int64_t> slot(N, -1), used(E, 0);
  for (int64_t i = 0; i < N; ++i)
    if (used[id[i]] < C) slot[i] = id[i] * C + used[id[i]]++;
  ASSERT_LT(std::count(slot.begin(), slot.end(), -1), N);
  ASSERT_GT(std::count(slot.begin(), slot.end(), -1), 0);
  auto cyv = random_values(R * h, 76);
  DeviceTensor cxe({R, h}, bf), cdxe({R, h}, bf), cdx({T, h}, bf), cye({R, h}, bf),
      ccomb({T, h}, bf), cdye({R, h}, bf), cdp({T, k}, f32);
  cxe.set(cyv), cdxe.set(cyv), cdx.set(prior), cye.set(cyv), ccomb.set(prior), cdye.set(cyv),
      cdp.set(dpprior);
  moe_dispatch_forward(x.t, idx.t, cxe.t, E, C, nullptr);
  moe_dispatch_backward(cdxe.t, idx.t, cdx.t, false, E, C, nullptr);
  moe_combine_forward(cye.t, probs.t, idx.t, ccomb.t, E, C, nullptr);
  moe_combine_backward(cye.t, probs.t, idx.t, gout.t, cdye.t, false, cdp.t, false, E, C, nullptr);
  Routed cref = routed(slot, R, cyv, std::vector<double>(T * k, 0.0));
  expect_close(cxe.get(), cref.xe, tolerance(bf), "capacity: dispatch");
  expect_close(cdx.get(), cref.dx, tolerance(bf), "capacity: dispatch backward");
  expect_close(ccomb.get(), cref.comb, tolerance(bf), "capacity: combine");
  expect_close(cdye.get(), cref.dye, tolerance(bf), "capacity: combine backward, expert outputs");
  expect_close(cdp.get(), cref.dp, tolerance(f32), "capacity: combine backward, probabilities");
  // The grouped GEMMs over C rows per expert.
  auto cgev = random_values(R * F, 77);
  DeviceTensor ceo({R, F}, bf), cge({R, F}, bf), cdxe2({R, h}, bf), cdwe({E, F, h}, f32);
  cge.set(cgev), cdwe.set(std::vector<double>(E * F * h, 0.0));
  expert_forward(blas, cxe.t, idx.t, we.t, ceo.t, C, nullptr);
  expert_backward(blas, cxe.t, idx.t, we.t, cge.t, cdxe2.t, false, cdwe.t, C, nullptr);
  std::vector<int64_t> expert_of_slot(R);
  for (int64_t q = 0; q < R; ++q) expert_of_slot[q] = q / C;
  Grouped cg = grouped(expert_of_slot, cref.xe, cgev);
  expect_close(ceo.get(), cg.out, tolerance(bf), "capacity: expert GEMMs");
  expect_close(cdxe2.get(), cg.dx, tolerance(bf), "capacity: expert GEMMs backward, dx");
  expect_close(cdwe.get(), cg.dw, tolerance(f32), "capacity: expert GEMMs backward, dW");

  // The shared gate: out = sigmoid(x . w) y; dy = s g, dx = dz w, dw += sum dz x.
  auto gwv = random_values(h, 73, -0.3, 0.3), sy = random_values(T * F, 74),
       sg = random_values(T * F, 75);
  DeviceTensor gw({1, h}, bf), y({T, F}, bf), go({T, F}, bf), gateo({T, F}, bf), gdx({T, h}, bf),
      gdy({T, F}, bf), gdw({1, h}, f32), dz({T}, f32);
  gw.set(gwv), y.set(sy), go.set(sg), gdw.set(std::vector<double>(h, 0.0));
  shared_gate_forward(x.t, gw.t, y.t, gateo.t, nullptr);
  shared_gate_backward(x.t, gw.t, y.t, go.t, gdx.t, false, gdy.t, false, gdw.t, dz.t, nullptr);
  std::vector<double> gor(T * F), gdxr(T * h), gdyr(T * F), gdwr(h, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    double z = 0, gy = 0;
    for (int64_t c = 0; c < h; ++c) z += xv[t * h + c] * gwv[c];
    for (int64_t f = 0; f < F; ++f) gy += sg[t * F + f] * sy[t * F + f];
    double sgm = 1 / (1 + std::exp(-z)), d = gy * sgm * (1 - sgm);
    for (int64_t f = 0; f < F; ++f)
      gor[t * F + f] = sgm * sy[t * F + f], gdyr[t * F + f] = sgm * sg[t * F + f];
    for (int64_t c = 0; c < h; ++c) gdxr[t * h + c] = d * gwv[c], gdwr[c] += d * xv[t * h + c];
  }
  expect_close(gateo.get(), gor, tolerance(bf), "shared gate");
  expect_close(gdy.get(), gdyr, tolerance(bf), "shared gate backward: dy");
  expect_close(gdx.get(), gdxr, tolerance(bf), "shared gate backward: dx");
  expect_close(gdw.get(), gdwr, tolerance(f32), "shared gate backward: dw");
  cublasDestroy(blas);
}

// A failed CUDA or cuBLAS call throws naming the statement, file:line, the device and the status.
TEST(CudaKernels, CheckMacrosNameTheStatementPlaceAndDevice) {
  cublasHandle_t blas = nullptr;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  float one = 1.0f;
  try {
    NP_CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, -1, 1, 1, &one, nullptr,
                                 CUDA_R_32F, 1, nullptr, CUDA_R_32F, 1, &one, nullptr, CUDA_R_32F,
                                 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    ADD_FAILURE() << "a GEMM with m = -1 did not fail";
  } catch (const std::runtime_error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("cublasGemmEx(blas, CUBLAS_OP_N"), std::string::npos) << m;
    EXPECT_NE(m.find("test_cuda_emu.cpp:"), std::string::npos) << m;
    EXPECT_NE(m.find(" on device 0: cuBLAS status 7"), std::string::npos) << m;
  }
  cublasDestroy(blas);
}

}  // namespace
}  // namespace np::cuda
