// The CUDA emulation's runtime: fibers for the threads of a block, barriers, warp exchange, the
// memory, stream and event calls, and the driver's virtual memory calls. See cuda_emu.hpp for
// what is emulated. Fibers switch with a few instructions on x86-64 (the callee-saved registers,
// the stack pointer and the floating-point control words; no system call, unlike swapcontext,
// which saves the signal mask), and through ucontext elsewhere.
#include "executor/cuda/emu/cuda_emu.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <sys/mman.h>

#if defined(__SANITIZE_ADDRESS__)
#define NP_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NP_EMU_ASAN 1
#endif
#endif
#ifdef NP_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__x86_64__)
#define NP_EMU_FAST_SWITCH 1
// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack, stores
// the stack pointer in *save, and resumes the context whose stack pointer is `load`.
extern "C" void np_emu_switch(void** save, void* load);
asm(R"(
  .text
  .globl np_emu_switch
  .type np_emu_switch, @function
np_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size np_emu_switch, .-np_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");
#else
#include <ucontext.h>
#endif

namespace np::emu {
namespace {

#ifdef NP_EMU_ASAN
constexpr size_t kStackBytes = 512 * 1024;
#else
constexpr size_t kStackBytes = 128 * 1024;
#endif

enum class Wait { kNone, kBlock, kWarp, kDone };

// A saved execution context.
struct Context {
#ifdef NP_EMU_FAST_SWITCH
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
};

void switch_context(Context& save, Context& load) {
#ifdef NP_EMU_FAST_SWITCH
  np_emu_switch(&save.sp, load.sp);
#else
  swapcontext(&save.uc, &load.uc);
#endif
}

struct Fiber {
  Context ctx;
  char* stack = nullptr;
  Wait wait = Wait::kNone;
  ThreadState st;
  void* fake_stack = nullptr;
};

struct Block {
  std::vector<Fiber> fibers;
  Context main;
  const void* main_bottom = nullptr;
  size_t main_size = 0;
  void* main_fake_stack = nullptr;
  std::vector<unsigned char> shared;
  std::vector<uint64_t> slots;  // one per thread: warp exchanges
  const std::function<void()>* body = nullptr;
  std::exception_ptr error;
  int running = -1;
};

thread_local Block* g_block = nullptr;
std::atomic<uint64_t> g_launches{0};

// Fiber stacks, allocated once per host thread and reused (not touched until used).
std::vector<std::unique_ptr<char[]>>& stacks() {
  thread_local std::vector<std::unique_ptr<char[]>> s;
  return s;
}

void to_main(Fiber& f, bool dying) {
#ifdef NP_EMU_ASAN
  __sanitizer_start_switch_fiber(dying ? nullptr : &f.fake_stack, g_block->main_bottom,
                                 g_block->main_size);
#else
  (void)dying;
#endif
  switch_context(f.ctx, g_block->main);
#ifdef NP_EMU_ASAN
  __sanitizer_finish_switch_fiber(f.fake_stack, nullptr, nullptr);
#endif
}

void to_fiber(Block& b, int i) {
  b.running = i;
  Fiber& f = b.fibers[i];
#ifdef NP_EMU_ASAN
  __sanitizer_start_switch_fiber(&b.main_fake_stack, f.stack, kStackBytes);
#endif
  switch_context(b.main, f.ctx);
#ifdef NP_EMU_ASAN
  __sanitizer_finish_switch_fiber(b.main_fake_stack, nullptr, nullptr);
#endif
  b.running = -1;
}

void fiber_entry() {
  Block& b = *g_block;
  Fiber& f = b.fibers[b.running];
#ifdef NP_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &b.main_bottom, &b.main_size);
#endif
  try {
    (*b.body)();
  } catch (...) {
    if (!b.error) b.error = std::current_exception();
  }
  f.wait = Wait::kDone;
  to_main(f, /*dying=*/true);
}

// A context that starts fiber_entry on `stack` (kStackBytes) when first switched to.
void start_context(Context& c, char* stack) {
#ifdef NP_EMU_ASAN
  // A fiber that finished never unwound: its frames' redzones are still poisoned.
  ASAN_UNPOISON_MEMORY_REGION(stack, kStackBytes);
#endif
#ifdef NP_EMU_FAST_SWITCH
  // np_emu_switch's frame as it pops it: control words, r15, r14, r13, r12, rbx, rbp, then the
  // return address; above it a zero return address for fiber_entry, which leaves it entered
  // with the stack 16-byte aligned less 8, as after a call.
  auto top = reinterpret_cast<uintptr_t>(stack + kStackBytes) & ~uintptr_t{15};
  auto* frame = reinterpret_cast<uint64_t*>(top) - 9;
  uint32_t control[2] = {0x1F80, 0x037F};  // MXCSR and the x87 control word at reset
  std::memcpy(&frame[0], control, sizeof(control));
  for (int r = 1; r <= 6; ++r) frame[r] = 0;
  frame[7] = reinterpret_cast<uint64_t>(&fiber_entry);
  frame[8] = 0;
  c.sp = frame;
#else
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = kStackBytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, fiber_entry, 0);
#endif
}

Fiber& current_fiber() {
  if (!g_block || g_block->running < 0)
    throw std::logic_error("CUDA emulation: a device function ran outside a kernel launch");
  return g_block->fibers[g_block->running];
}

void wait_at(Wait w) {
  Fiber& f = current_fiber();
  f.wait = w;
  to_main(f, false);
}

std::string where(const Fiber& f) {
  return "thread (" + std::to_string(f.st.thread.x) + "," + std::to_string(f.st.thread.y) + "," +
         std::to_string(f.st.thread.z) + ") of block (" + std::to_string(f.st.block.x) + "," +
         std::to_string(f.st.block.y) + "," + std::to_string(f.st.block.z) + ")";
}

// Releases a barrier once every live thread waits at it; throws when a barrier can never be
// released (a thread returned, or warps wait at different kinds of barrier).
bool release(Block& b) {
  size_t n = b.fibers.size();
  bool any_waiting = false;
  for (size_t w = 0; w * 32 < n; ++w) {  // warp barriers first: they involve one warp only
    size_t lo = w * 32, hi = std::min(n, lo + 32);
    bool waiting = false, all = true;
    const Fiber* gone = nullptr;
    for (size_t i = lo; i < hi; ++i) {
      Wait s = b.fibers[i].wait;
      waiting |= s == Wait::kWarp;
      if (s == Wait::kDone) gone = &b.fibers[i];
      else if (s != Wait::kWarp) all = false;
    }
    if (!waiting) continue;
    any_waiting = true;
    if (gone)
      throw std::runtime_error("CUDA emulation: a warp shuffle or __syncwarp waits for " +
                               where(*gone) + ", which returned");
    if (all) {
      for (size_t i = lo; i < hi; ++i) b.fibers[i].wait = Wait::kNone;
      return true;
    }
  }
  bool block_waiting = false;
  const Fiber* gone = nullptr;
  for (const Fiber& f : b.fibers) {
    if (f.wait == Wait::kBlock) block_waiting = true;
    if (f.wait == Wait::kDone) gone = &f;
  }
  if (!block_waiting && !any_waiting) return false;  // every thread is done
  if (any_waiting)
    throw std::runtime_error("CUDA emulation: deadlock: some threads wait in a warp shuffle while "
                             "others of their warp wait at __syncthreads");
  if (gone)
    throw std::runtime_error("CUDA emulation: __syncthreads waits for " + where(*gone) +
                             ", which returned");
  for (Fiber& f : b.fibers) f.wait = Wait::kNone;
  return true;
}

void run_block(Block& b, bool reverse_first) {
  size_t n = b.fibers.size();
  auto& pool = stacks();
  while (pool.size() < n) pool.emplace_back(new char[kStackBytes]);
  for (size_t i = 0; i < n; ++i) {
    Fiber& f = b.fibers[i];
    f.stack = pool[i].get();
    f.wait = Wait::kNone;
    start_context(f.ctx, f.stack);
  }
  for (int phase = 0;; ++phase) {
    bool reverse = (phase % 2 == 1) != reverse_first;
    // A warp whose lanes all wait at a warp barrier (a shuffle, a vote, __syncwarp) goes on at
    // once, ahead of the warps not yet run in this pass: a block barrier missing between two
    // phases that the warp synchronises within then shows up as a wrong result.
    auto run_warp_ahead = [&](size_t w) {
      size_t lo = w * 32, hi = std::min(n, lo + 32);
      for (;;) {
        for (size_t l = lo; l < hi; ++l)
          if (b.fibers[l].wait != Wait::kWarp) return;
        for (size_t l = lo; l < hi; ++l) b.fibers[l].wait = Wait::kNone;
        for (size_t q = 0; q < hi - lo; ++q) {
          to_fiber(b, static_cast<int>(reverse ? hi - 1 - q : lo + q));
          if (b.error) std::rethrow_exception(b.error);
        }
      }
    };
    for (size_t k = 0; k < n; ++k) {
      size_t i = reverse ? n - 1 - k : k;
      if (b.fibers[i].wait == Wait::kNone) to_fiber(b, static_cast<int>(i));
      if (b.error) std::rethrow_exception(b.error);
      run_warp_ahead(i / 32);
    }
    if (!release(b)) break;
  }
}

struct Device {
  std::mutex mu;
  size_t total = size_t{80} << 30;
  size_t used = 0;
  std::map<void*, size_t> sizes;
  // Virtual memory (the cuMem* calls): reservations by base, physical handles, mappings by
  // address.
  struct Handle {
    size_t bytes = 0;
    int mappings = 0;
    bool released = false;
  };
  struct Mapping {
    size_t bytes = 0;
    CUmemGenericAllocationHandle handle = 0;
    bool accessible = false;
  };
  std::map<uintptr_t, size_t> reservations;
  std::map<CUmemGenericAllocationHandle, Handle> handles;
  CUmemGenericAllocationHandle next_handle = 1;
  std::map<uintptr_t, Mapping> mappings;
};
Device& device() {
  static Device d;
  return d;
}

}  // namespace

ThreadState& state() { return current_fiber().st; }
void sync_block() { wait_at(Wait::kBlock); }
void sync_warp() { wait_at(Wait::kWarp); }
void* dynamic_shared() {
  current_fiber();
  return g_block->shared.data();
}

uint64_t warp_exchange(uint64_t mine, int src) {
  Block& b = *g_block;
  size_t self = static_cast<size_t>(b.running), base = self / 32 * 32;
  b.slots[self] = mine;
  sync_warp();
  size_t from = base + static_cast<size_t>(src);
  uint64_t got = from < b.slots.size() ? b.slots[from] : ~uint64_t{0};
  sync_warp();  // nobody overwrites a slot before every lane has read
  return got;
}

uint64_t launches() { return g_launches.load(); }

namespace {
std::mutex g_shared_mu;
std::map<const void*, size_t> g_shared_allowed;  // kernels' raised dynamic shared-memory limits
}  // namespace

void allow_shared(const void* kernel, size_t bytes) {
  if (bytes > kMaxSharedOptIn)
    throw std::runtime_error("CUDA emulation: cudaFuncSetAttribute: " + std::to_string(bytes) +
                             " bytes of dynamic shared memory exceed the device's " +
                             std::to_string(kMaxSharedOptIn));
  std::lock_guard<std::mutex> lock(g_shared_mu);
  size_t& a = g_shared_allowed[kernel];
  a = std::max(a, bytes);
}

void launch(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes,
            const std::function<void()>& body) {
  size_t threads = size_t{block.x} * block.y * block.z;
  auto refuse = [&](const std::string& why) {
    throw std::runtime_error("CUDA emulation: invalid launch configuration: " + why + " (grid " +
                             std::to_string(grid.x) + " x " + std::to_string(grid.y) + " x " +
                             std::to_string(grid.z) + ", block " + std::to_string(block.x) +
                             " x " + std::to_string(block.y) + " x " + std::to_string(block.z) +
                             ", " + std::to_string(shared_bytes) + " bytes of shared memory)");
  };
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64)
    refuse("a block holds 1 to 1,024 threads, at most 1,024 x 1,024 x 64");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 ||
      grid.z > 65535)
    refuse("a grid is at most 2^31 - 1 x 65,535 x 65,535 blocks, none empty");
  size_t allowed = kDefaultShared;
  {
    std::lock_guard<std::mutex> lock(g_shared_mu);
    if (auto it = g_shared_allowed.find(kernel); it != g_shared_allowed.end())
      allowed = std::max(allowed, it->second);
  }
  if (shared_bytes > allowed)
    refuse("more dynamic shared memory than the kernel may take (" + std::to_string(allowed) +
           " bytes; cudaFuncSetAttribute raises it)");
  bool reverse_first = (g_launches.fetch_add(1) % 2) == 1;
  Block b;
  Block* outer = g_block;
  g_block = &b;
  b.body = &body;
  b.fibers.resize(threads);
  b.slots.assign(threads, ~uint64_t{0});
  try {
    for (unsigned bz = 0; bz < grid.z; ++bz)
      for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
          b.shared.assign((shared_bytes + 15) / 16 * 16, 0xFF);  // poison: NaN as floats
          size_t i = 0;
          for (unsigned tz = 0; tz < block.z; ++tz)
            for (unsigned ty = 0; ty < block.y; ++ty)
              for (unsigned tx = 0; tx < block.x; ++tx)
                b.fibers[i++].st = {dim3(tx, ty, tz), dim3(bx, by, bz), block, grid};
          run_block(b, reverse_first);
        }
  } catch (...) {
    g_block = outer;
    throw;
  }
  g_block = outer;
}

void set_device_memory(size_t bytes) {
  std::lock_guard<std::mutex> lock(device().mu);
  device().total = bytes;
}

}  // namespace np::emu

using np::emu::device;

cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t bytes) {
  auto& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  *p = nullptr;
  if (bytes > d.total - d.used) return cudaErrorMemoryAllocation;
  size_t rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  void* q = std::aligned_alloc(256, rounded);
  if (!q) return cudaErrorMemoryAllocation;
  std::memset(q, 0xFF, rounded);  // fresh device memory holds garbage: NaN here
  d.used += bytes;
  d.sizes[q] = bytes;
  *p = q;
  return cudaSuccess;
}
std::optional<size_t> np::emu::device_bytes_from(const void* p) {
  auto& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  const auto at = reinterpret_cast<uintptr_t>(p);
  if (auto it = d.sizes.upper_bound(const_cast<void*>(p)); it != d.sizes.begin()) {
    --it;
    const auto base = reinterpret_cast<uintptr_t>(it->first);
    if (at == base || at < base + it->second) return base + it->second - at;
  }
  if (auto it = d.mappings.upper_bound(at); it != d.mappings.begin()) {
    --it;
    if (it->second.accessible && at < it->first + it->second.bytes)
      return it->first + it->second.bytes - at;
  }
  return std::nullopt;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  *a = {};
  if (np::emu::device_bytes_from(p)) {
    a->type = cudaMemoryTypeDevice, a->device = 0;
    a->devicePointer = const_cast<void*>(p);
  } else {
    a->hostPointer = const_cast<void*>(p);
  }
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  auto& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.sizes.find(p);
  if (it == d.sizes.end()) return cudaErrorInvalidValue;
  d.used -= it->second;
  d.sizes.erase(it);
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind k,
                            cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, k);
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  if (bytes) std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  return cudaMemset(p, value, bytes);
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  auto& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  *free_bytes = d.total - d.used;
  *total_bytes = d.total;
  return cudaSuccess;
}
struct np_emu_stream {};
struct np_emu_event {
  std::chrono::steady_clock::time_point t;
};
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = new np_emu_stream;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new np_emu_event;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  e->t = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
cudaError_t cudaGetLastError() { return cudaSuccess; }
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unknown error";
}

// ---- the driver's virtual memory calls (cuda_emu.hpp states their rules) ----
namespace {

constexpr size_t kGranularity = size_t{2} << 20;

bool reservation_holds(const np::emu::Device& d, uintptr_t p, size_t bytes) {
  auto it = d.reservations.upper_bound(p);
  if (it == d.reservations.begin()) return false;
  --it;
  return p >= it->first && p + bytes <= it->first + it->second;
}

// The physical bytes of a handle back to the device once it is released and unmapped.
void drop_if_done(np::emu::Device& d, CUmemGenericAllocationHandle h) {
  auto it = d.handles.find(h);
  if (it != d.handles.end() && it->second.released && it->second.mappings == 0) {
    d.used -= it->second.bytes;
    d.handles.erase(it);
  }
}

CUresult emu_cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                           CUmemAllocationGranularity_flags) {
  if (!granularity || !prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id != 0)
    return CUDA_ERROR_INVALID_VALUE;
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

CUresult emu_cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                 unsigned long long flags) {
  if (!ptr || size == 0 || size % kGranularity != 0 || addr != 0 || flags != 0 ||
      (alignment != 0 && alignment % kGranularity != 0))
    return CUDA_ERROR_INVALID_VALUE;
  // Addresses without memory: PROT_NONE, nothing reserved in swap; 2 MiB aligned by reserving
  // one granule more and giving back the ends.
  size_t span = size + kGranularity;
  void* p = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t raw = reinterpret_cast<uintptr_t>(p);
  uintptr_t base = (raw + kGranularity - 1) / kGranularity * kGranularity;
  if (base > raw) munmap(p, base - raw);
  if (raw + span > base + size)
    munmap(reinterpret_cast<void*>(base + size), raw + span - base - size);
  auto& d = np::emu::device();
  std::lock_guard<std::mutex> lock(d.mu);
  d.reservations[base] = size;
  *ptr = base;
  return CUDA_SUCCESS;
}

CUresult emu_cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  auto& d = np::emu::device();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.reservations.find(static_cast<uintptr_t>(ptr));
  if (it == d.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  auto m = d.mappings.lower_bound(static_cast<uintptr_t>(ptr));
  if (m != d.mappings.end() && m->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;  // mapped
  munmap(reinterpret_cast<void*>(ptr), size);
  d.reservations.erase(it);
  return CUDA_SUCCESS;
}

CUresult emu_cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                         const CUmemAllocationProp* prop, unsigned long long flags) {
  size_t granularity = 0;
  if (!handle || size == 0 || size % kGranularity != 0 || flags != 0 ||
      emu_cuMemGetAllocationGranularity(&granularity, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
          CUDA_SUCCESS)
    return CUDA_ERROR_INVALID_VALUE;
  auto& d = np::emu::device();
  std::lock_guard<std::mutex> lock(d.mu);
  if (size > d.total - d.used) return CUDA_ERROR_OUT_OF_MEMORY;
  d.used += size;
  *handle = d.next_handle++;
  d.handles[*handle] = {size, 0, false};
  return CUDA_SUCCESS;
}

CUresult emu_cuMemRelease(CUmemGenericAllocationHandle handle) {
  auto& d = np::emu::device();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.handles.find(handle);
  if (it == d.handles.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
  it->second.released = true;
  drop_if_done(d, handle);
  return CUDA_SUCCESS;
}

CUresult emu_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                      CUmemGenericAllocationHandle handle, unsigned long long flags) {
  auto& d = np::emu::device();
  std::lock_guard<std::mutex> lock(d.mu);
  auto h = d.handles.find(handle);
  const uintptr_t p = static_cast<uintptr_t>(ptr);
  if (h == d.handles.end() || h->second.released || offset != 0 || flags != 0 ||
      size != h->second.bytes || p % kGranularity != 0 || !reservation_holds(d, p, size))
    return CUDA_ERROR_INVALID_VALUE;
  auto next = d.mappings.lower_bound(p);
  if (next != d.mappings.end() && next->first < p + size) return CUDA_ERROR_INVALID_VALUE;
  if (next != d.mappings.begin() && std::prev(next)->first + std::prev(next)->second.bytes > p)
    return CUDA_ERROR_INVALID_VALUE;
  d.mappings[p] = {size, handle, false};
  ++h->second.mappings;
  return CUDA_SUCCESS;
}

CUresult emu_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                            size_t count) {
  if (!desc || count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      desc->location.id != 0 || desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    return CUDA_ERROR_INVALID_VALUE;
  auto& d = np::emu::device();
  std::lock_guard<std::mutex> lock(d.mu);
  const uintptr_t p = static_cast<uintptr_t>(ptr);
  // The range must be mapped throughout, mapping after mapping.
  auto it = d.mappings.find(p);
  for (uintptr_t at = p; at < p + size; ++it) {
    if (it == d.mappings.end() || it->first != at) return CUDA_ERROR_INVALID_VALUE;
    at += it->second.bytes;
    if (at > p + size) return CUDA_ERROR_INVALID_VALUE;
  }
  for (it = d.mappings.find(p); it != d.mappings.end() && it->first < p + size; ++it) {
    if (it->second.accessible) continue;
    void* q = reinterpret_cast<void*>(it->first);
    if (mprotect(q, it->second.bytes, PROT_READ | PROT_WRITE) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    std::memset(q, 0xFF, it->second.bytes);  // fresh device memory holds garbage: NaN here
    it->second.accessible = true;
  }
  return CUDA_SUCCESS;
}

CUresult emu_cuMemUnmap(CUdeviceptr ptr, size_t size) {
  auto& d = np::emu::device();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.mappings.find(static_cast<uintptr_t>(ptr));
  if (it == d.mappings.end() || it->second.bytes != size) return CUDA_ERROR_INVALID_VALUE;
  void* q = reinterpret_cast<void*>(it->first);
  madvise(q, size, MADV_DONTNEED);
  mprotect(q, size, PROT_NONE);
  CUmemGenericAllocationHandle h = it->second.handle;
  d.mappings.erase(it);
  --d.handles[h].mappings;
  drop_if_done(d, h);
  return CUDA_SUCCESS;
}

}  // namespace

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned version,
                                             unsigned long long flags,
                                             cudaDriverEntryPointQueryResult* status) {
  static const std::pair<std::string_view, void*> table[] = {
      {"cuMemGetAllocationGranularity",
       reinterpret_cast<void*>(&emu_cuMemGetAllocationGranularity)},
      {"cuMemAddressReserve", reinterpret_cast<void*>(&emu_cuMemAddressReserve)},
      {"cuMemAddressFree", reinterpret_cast<void*>(&emu_cuMemAddressFree)},
      {"cuMemCreate", reinterpret_cast<void*>(&emu_cuMemCreate)},
      {"cuMemRelease", reinterpret_cast<void*>(&emu_cuMemRelease)},
      {"cuMemMap", reinterpret_cast<void*>(&emu_cuMemMap)},
      {"cuMemSetAccess", reinterpret_cast<void*>(&emu_cuMemSetAccess)},
      {"cuMemUnmap", reinterpret_cast<void*>(&emu_cuMemUnmap)},
  };
  if (!symbol || !fn || flags != cudaEnableDefault || version < 10020) return cudaErrorInvalidValue;
  for (const auto& [name, f] : table)
    if (name == symbol) {
      *fn = f;
      if (status) *status = cudaDriverEntryPointSuccess;
      return cudaSuccess;
    }
  *fn = nullptr;
  if (status) *status = cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}
