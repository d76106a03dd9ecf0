// The per-rank tracking allocator: every device byte of a run goes through it, from the backend's
// DeviceMemory. It records the high-water mark, the bytes by category at that moment, the named
// live set at the peak, the timeline, and every allocation and release as a MemEvent (which plan
// instruction, which plan tensor), and can refuse to go past a budget.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "executor/backend.hpp"
#include "planner/schedule/caching_allocator.hpp"
#include "planner/schedule/schedule.hpp"
#include "planner/schedule/simulate.hpp"

namespace np::exec {

// Thrown when an allocation would exceed the enforced budget, or the device has no room.
struct OutOfBudget : std::runtime_error {
  OutOfBudget(std::string tensor, int64_t bytes, int64_t in_use, int64_t budget);
  std::string tensor;
  int64_t bytes, in_use, budget;  // budget -1: the device itself refused
};

struct LiveAllocation {
  std::string name;
  int64_t bytes = 0;
  Category category = Category::kTransient;
};

// Under --allocator caching the plan's tensors come from a model of PyTorch's caching allocator
// (planner/schedule/caching_allocator.hpp) whose segments are the device's memory: each segment
// one DeviceMemory::allocate, each tensor a block carved from one, so that what the run reserves
// is measured where the device gives it out. --allocator exact: one device allocation per tensor.
class TrackingAllocator {
 public:
  explicit TrackingAllocator(DeviceMemory& device, std::optional<int64_t> budget = std::nullopt,
                             const AllocatorChoice& allocator = exact_allocator());
  static AllocatorChoice exact_allocator() { return {.model = AllocatorModel::kExact}; }
  // Whether `device` can back expandable segments (DeviceMemory::reserve_addresses).
  static bool can_expand(DeviceMemory& device);
  ~TrackingAllocator();
  TrackingAllocator(const TrackingAllocator&) = delete;
  TrackingAllocator& operator=(const TrackingAllocator&) = delete;

  // The plan instruction whose allocations and releases follow (MemEvent::instr).
  void set_instruction(int32_t instr) { instr_ = instr; }
  // Starts a new training step: events are kept per step.
  void begin_step() { steps_.push_back(log_.size()); }

  // Returns memory filled with 0xFF bytes (NaN for floats), so that an element no kernel wrote
  // shows up. `tensor`: the plan's tensor id, or -1 for an allocation the plan did not name
  // (bind() may name it later). Throws OutOfBudget.
  // `stream`: the stream whose pool serves it (planner/schedule/schedule.hpp, stream_of: FSDP2's
  // all-gather and reduce-scatter buffers come from their own streams' pools).
  void* allocate(int64_t bytes, std::string name, Category category, int32_t tensor,
                 int16_t stream = 0);
  void release(void* p);
  // A runtime buffer (Backend::runtime_buffers): from the device like every byte, filled with
  // 0xFF, held until the allocator goes, and kept out of the plan's accounting (in_use, peak,
  // events); runtime() lists them. Throws OutOfBudget when the device refuses.
  void* allocate_runtime(int64_t bytes, std::string name);
  const std::vector<LiveAllocation>& runtime() const { return runtime_; }
  // The most bytes the device reported in use, sampled after every allocation (a GPU: the whole
  // device, every rank and runtime on it); nullopt where the memory cannot say.
  std::optional<int64_t> device_peak() const { return device_peak_; }
  // Names a live allocation once its role is known (a gradient the kernel allocated).
  void bind(void* p, int32_t tensor, std::string name);

  int64_t in_use() const { return in_use_; }
  int64_t peak() const { return peak_; }
  // Caching: the most device bytes the allocator's segments held (what
  // torch.cuda.max_memory_reserved() reports), and the most its blocks held
  // (max_memory_allocated); nullopt under --allocator exact.
  std::optional<int64_t> reserved_peak() const;
  std::optional<int64_t> allocated_blocks_peak() const;
  // Caching: what the segments and the blocks hold now (memory_reserved(), memory_allocated()).
  std::optional<int64_t> reserved_now() const;
  std::optional<int64_t> allocated_blocks_now() const;
  const std::array<int64_t, kCategories>& at_peak() const { return at_peak_; }
  std::vector<LiveAllocation> live_at_peak() const;                   // largest first
  const std::vector<int64_t>& timeline() const { return timeline_; }  // bytes after each event
  // Events per step, canonical order. Allocations the plan did not name get the tensor id
  // -(1 + k), k indexing unplanned_names().
  std::vector<std::vector<MemEvent>> events() const;
  std::vector<std::string> unplanned_names() const;

 private:
  struct Block {
    void* ptr;
    int64_t bytes;
    std::string name;
    Category category;
    int32_t tensor;
    bool live;
    int32_t handle = -1;  // the caching allocator's block (caching)
  };
  // The caching allocator's segments on the device: its address of each to the device's. A
  // segment is one DeviceMemory::allocate; an expandable segment is addresses the device
  // reserved (kExpandableRange of them), mapped page by page as the allocator grows it.
  class Segments : public SegmentMemory {
   public:
    Segments(DeviceMemory& device, bool expandable) : device_(device), expandable_(expandable) {}
    ~Segments() override;
    bool map(int64_t base, int64_t bytes) override;
    void unmap(int64_t base, int64_t bytes) override;
    void* pointer(int64_t address) const;  // the device address of an allocator address
    int64_t held = 0, max_held = 0;        // device bytes the segments hold
    static constexpr int64_t kExpandableRange = int64_t{1} << 40;  // addresses per segment

   private:
    DeviceMemory& device_;
    const bool expandable_;
    std::map<int64_t, void*> base_;  // segment address -> device memory (or reserved addresses)
  };
  std::unique_ptr<Segments> segments_;     // caching only
  std::unique_ptr<CachingAllocator> cache_;  // caching only
  struct LogEntry {
    size_t block;
    int32_t instr;
    bool alloc;
    int16_t stream = 0;
  };
  DeviceMemory& device_;
  std::optional<int64_t> budget_;
  std::vector<LiveAllocation> runtime_;
  std::vector<void*> runtime_ptrs_;
  std::optional<int64_t> device_peak_;
  void sample_device();
  int32_t instr_ = -1;
  std::vector<Block> blocks_;  // every allocation ever made, in order
  std::vector<LogEntry> log_;  // every allocation and release, in order
  std::vector<size_t> steps_;  // log_ index where each step begins
  int64_t in_use_ = 0, peak_ = 0;
  size_t peak_entry_ = 0;  // log_ prefix length at the peak
  std::array<int64_t, kCategories> current_{}, at_peak_{};
  std::vector<int64_t> timeline_;
};

}  // namespace np::exec
