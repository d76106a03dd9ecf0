// Host emulation of the CUDA subset that nanoplan's CUDA backend uses, so that the same kernel
// and backend sources (executor/cuda/*.cu) compile with the host compiler and run in tests on
// machines without a GPU. Test infrastructure only: not a user-facing backend, no speed claim.
//
// What it emulates: kernel launches (np_launch in executor/cuda/compat.hpp) over a grid of blocks;
// the threads of a block as fibers, run one at a time between barriers, in forward order in one
// phase and reverse order in the next, so that a missing __syncthreads or a wrong shared-memory
// index changes the result; dynamic shared memory poisoned with 0xFF bytes (NaN) before each
// block; warp shuffles, votes and __syncwarp with every lane of the warp; atomics; the memory,
// stream and event calls of the runtime API; the driver's virtual memory calls (cuMem*, reached
// as on a GPU through cudaGetDriverEntryPointByVersion) with their rules; bf16 conversion with
// round-to-nearest-even. A thread
// that leaves the kernel while others wait at a barrier is an error (undefined on a GPU).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>

#include "executor/bf16.hpp"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// A kernel parameter read in place in the parameter space (sm_70 and later), so that indexing it
// takes no local-memory copy (CUDA C++ Programming Guide, "__grid_constant__").
#define __grid_constant__

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace np::emu {

struct ThreadState {
  dim3 thread, block, block_dim, grid_dim;
};

// The emulated thread running now (valid inside a kernel only).
ThreadState& state();
void sync_block();
void sync_warp();
// This block's dynamic shared memory (the launch's shared_bytes), 16-byte aligned.
void* dynamic_shared();
// Exchanges 8 bytes with another lane of this thread's warp: returns lane `src`'s value.
uint64_t warp_exchange(uint64_t mine, int src);
// Runs `body` as every thread of every block of the grid; throws std::runtime_error when a block
// deadlocks at a barrier or the body throws. `kernel` identifies the kernel for its shared-memory
// limit (allow_shared). The launch is refused as a GPU of compute capability 9.0 refuses it (CUDA
// C++ Programming Guide, "Technical Specifications per Compute Capability"): grid x up to
// 2^31 - 1 blocks, y and z up to 65,535; blocks of up to 1,024 threads, x and y up to 1,024, z up
// to 64; dynamic shared memory up to 48 KiB, or up to what the kernel was allowed.
void launch(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes,
            const std::function<void()>& body);
// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes): at most
// kMaxSharedOptIn (227 KiB on sm_90); more is refused.
void allow_shared(const void* kernel, size_t bytes);
inline constexpr size_t kDefaultShared = size_t{48} << 10;
inline constexpr size_t kMaxSharedOptIn = 232448;
// Launches so far (each launch alternates the starting order of its threads).
uint64_t launches();

}  // namespace np::emu

#define threadIdx (::np::emu::state().thread)
#define blockIdx (::np::emu::state().block)
#define blockDim (::np::emu::state().block_dim)
#define gridDim (::np::emu::state().grid_dim)
constexpr int warpSize = 32;

inline void __syncthreads() { np::emu::sync_block(); }
inline void __syncwarp(unsigned = 0xffffffffu) { np::emu::sync_warp(); }

namespace np::emu {
inline int lane_id() {
  const ThreadState& s = state();
  unsigned linear = s.thread.x + s.thread.y * s.block_dim.x +
                    s.thread.z * s.block_dim.x * s.block_dim.y;
  return static_cast<int>(linear % 32);
}
template <typename T>
T shuffle_from(T v, int src) {
  static_assert(sizeof(T) <= 8, "a warp shuffle moves at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  uint64_t got = warp_exchange(bits, src);
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}
}  // namespace np::emu

template <typename T>
T __shfl_sync(unsigned, T v, int src, int width = 32) {
  int lane = np::emu::lane_id();
  return np::emu::shuffle_from(v, (lane / width) * width + (src % width));
}
template <typename T>
T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
  int lane = np::emu::lane_id(), src = lane ^ mask;
  return np::emu::shuffle_from(v, src / width == lane / width ? src : lane);
}
template <typename T>
T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  int lane = np::emu::lane_id(), src = lane + static_cast<int>(delta);
  return np::emu::shuffle_from(v, src / width == lane / width ? src : lane);
}
inline unsigned __ballot_sync(unsigned, int pred) {
  unsigned bits = 0;
  for (int l = 0; l < 32; ++l)
    bits |= (np::emu::shuffle_from<int>(pred != 0, l) ? 1u : 0u) << l;
  return bits;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __any_sync(unsigned m, int pred) { return __ballot_sync(m, pred) != 0; }
inline int __all_sync(unsigned m, int pred) { return __ballot_sync(m, !pred) == 0; }

// Threads of a block never run at the same time: plain read-modify-write is atomic.
inline float atomicAdd(float* p, float v) { float old = *p; *p = old + v; return old; }
inline int atomicAdd(int* p, int v) { int old = *p; *p = old + v; return old; }
inline unsigned atomicAdd(unsigned* p, unsigned v) { unsigned old = *p; *p = old + v; return old; }
inline int atomicMax(int* p, int v) { int old = *p; *p = old > v ? old : v; return old; }

inline float __expf(float x) { return std::exp(x); }
// sin(pi x) and cos(pi x) (CUDA Math API): exact argument reduction on a GPU.
inline void sincospi(double x, double* s, double* c) {
  const double pi = 3.14159265358979323846;
  *s = std::sin(pi * x), *c = std::cos(pi * x);
}
// Single-rounding arithmetic (on a GPU: never contracted into an FMA).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __logf(float x) { return std::log(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __fdividef(float a, float b) { return a / b; }

// bf16 storage: the top 16 bits of an IEEE float, rounded to nearest even.
struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 v) { return np::bf16_bits_to_f32(v.bits); }
inline __nv_bfloat16 __float2bfloat16(float f) { return {np::f32_to_bf16_bits(f)}; }

// ---- runtime API ---------------------------------------------------------------------------------
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorNoDevice = 100,
  cudaErrorLaunchFailure = 719,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
using cudaStream_t = struct np_emu_stream*;
using cudaEvent_t = struct np_emu_event*;

cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaGetLastError();
const char* cudaGetErrorString(cudaError_t e);
// What memory a pointer is (CUDA Runtime API, cudaPointerGetAttributes): device memory for a
// pointer inside a cudaMalloc'd block or an accessible cuMemMap'd range, unregistered (host)
// memory otherwise, as the runtime answers for pageable host memory since CUDA 11.
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};
struct cudaPointerAttributes {
  cudaMemoryType type = cudaMemoryTypeUnregistered;
  int device = -1;
  void* devicePointer = nullptr;
  void* hostPointer = nullptr;
};
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p);

// ---- driver API: virtual memory management ---------------------------------------------------
// The subset PyTorch's expandable segments use (CUDA Driver API reference, "Virtual Memory
// Management"), with the layouts and values of cuda.h. The emulation keeps the driver's rules, so
// that code breaking one fails here as it would on a GPU:
// - physical memory (cuMemCreate) comes in multiples of the granularity (2 MiB here, as on
//   Hopper) and counts against the device's memory (cudaMemGetInfo) until released and unmapped;
// - cuMemMap maps a whole handle (offset 0) at a granularity-aligned address inside one
//   reservation, over nothing already mapped;
// - mapped memory cannot be touched until cuMemSetAccess makes it readable and writable (here a
//   segmentation fault, on a GPU an illegal address); fresh memory holds garbage (0xFF bytes);
// - cuMemUnmap takes exactly one mapping; cuMemAddressFree takes a whole reservation with
//   nothing mapped in it.
enum CUresult {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
};
using CUdeviceptr = unsigned long long;
using CUmemGenericAllocationHandle = unsigned long long;
enum CUmemAllocationType { CU_MEM_ALLOCATION_TYPE_INVALID = 0, CU_MEM_ALLOCATION_TYPE_PINNED = 1 };
enum CUmemLocationType { CU_MEM_LOCATION_TYPE_INVALID = 0, CU_MEM_LOCATION_TYPE_DEVICE = 1 };
enum CUmemAccess_flags {
  CU_MEM_ACCESS_FLAGS_PROT_NONE = 0,
  CU_MEM_ACCESS_FLAGS_PROT_READ = 1,
  CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
};
enum CUmemAllocationGranularity_flags {
  CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
  CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
};
struct CUmemLocation {
  CUmemLocationType type;
  int id;
};
struct CUmemAllocationProp {
  CUmemAllocationType type;
  int requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType, gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};
struct CUmemAccessDesc {
  CUmemLocation location;
  CUmemAccess_flags flags;
};
enum cudaDriverEntryPointQueryResult {
  cudaDriverEntryPointSuccess = 0,
  cudaDriverEntryPointSymbolNotFound = 1,
  cudaDriverEntryPointVersionNotSufficent = 2,
};
constexpr unsigned long long cudaEnableDefault = 0;
// The driver function `symbol` (cuMemCreate, ...) of at least `version` (12000: CUDA 12.0).
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned version,
                                             unsigned long long flags,
                                             cudaDriverEntryPointQueryResult* status = nullptr);

namespace np::emu {
// The emulated device's memory size (cudaMemGetInfo's total; cudaMalloc past it fails).
void set_device_memory(size_t bytes);
// The device bytes from `p` to the end of its cudaMalloc'd block (0 at a zero-byte block's
// address) or accessible mapping; nullopt when `p` is not device memory: cudaPointerGetAttributes'
// answer, with the extent the library emulations check a buffer's size against.
std::optional<size_t> device_bytes_from(const void* p);
}  // namespace np::emu
