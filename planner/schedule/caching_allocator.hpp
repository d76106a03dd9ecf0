// A model of PyTorch's CUDA caching allocator, to replay a rank's allocation events and predict
// what it reserves (torch.cuda.max_memory_reserved) besides what it allocates
// (max_memory_allocated, which counts the allocator's rounded blocks, not the requested bytes).
//
// The rules follow c10/cuda/CUDACachingAllocator.cpp and c10/core/AllocatorConfig.cpp of
// pytorch/pytorch at commit b944315b93d36f842ef94d67a041371993234a74 (main, late 2025); the .cpp
// cites the functions and lines of each rule. Pools per stream; no CUDA graphs; record_stream is
// the caller's (a block used on another stream comes back when that stream is done: its free
// event comes later). Documented limits: docs/estimate.md, "Reserved memory".
#pragma once
#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "planner/inputs/allocator_conf.hpp"
#include "planner/schedule/simulate.hpp"

namespace np {

// What backs the allocator's segments: an executor maps each onto device memory (cudaMalloc's
// part); the model alone counts bytes. Addresses are the allocator's own: segments never touch,
// and an expandable segment is 2^50 addresses, mapped from its start up (each map continues the
// last; unmap takes pages back from its end).
class SegmentMemory {
 public:
  virtual ~SegmentMemory() = default;
  // [base, base + bytes): a new segment, or an expandable segment's next pages; false when the
  // device has no room.
  virtual bool map(int64_t base, int64_t bytes) = 0;
  virtual void unmap(int64_t base, int64_t bytes) = 0;
};

// The allocator: malloc and free on streams, with PyTorch's counters. Each stream has its own
// pools and segments: a cached block serves only requests of the stream that allocated its
// segment (BlockComparatorSize orders a pool by stream first, and get_free_block takes only a
// block of the request's stream), so blocks freed on a side stream (FSDP's all-gathers, a
// collective's outputs) are never reused by the compute stream. Streams are small numbers, 0
// the compute stream.
class CachingAllocator {
 public:
  explicit CachingAllocator(AllocatorConfig config = {}, SegmentMemory* memory = nullptr);

  // A block for `bytes` (> 0) on `stream` (>= 0): its handle, or nullopt when the device is full
  // after PyTorch's release-and-retry path (an OutOfMemoryError there).
  std::optional<int32_t> malloc(int64_t bytes, int stream = 0);
  void free(int32_t handle);
  // torch.cuda.empty_cache(): every cached whole segment released (expandable: the free whole
  // pages at a segment's end unmapped).
  void empty_cache();

  int64_t allocated() const { return allocated_; }  // the blocks handed out (rounded sizes)
  int64_t reserved() const { return reserved_; }    // segments cudaMalloc'd (or pages mapped)
  int64_t requested() const { return requested_; }  // the sizes asked for
  int64_t max_allocated() const { return max_allocated_; }
  int64_t max_reserved() const { return max_reserved_; }
  int64_t segments() const { return segments_; }
  int64_t block_size(int32_t handle) const { return blocks_.at(handle).size; }
  // A live block's address, inside the segment SegmentMemory::map was given.
  int64_t address(int32_t handle) const { return blocks_.at(static_cast<size_t>(handle)).ptr; }

  // The size a request is rounded to (round_size), and the segment a non-expandable miss
  // cudaMallocs for a rounded size (get_allocation_size).
  static int64_t round_size(int64_t bytes, const AllocatorConfig& c);
  static int64_t allocation_size(int64_t rounded);

 private:
  struct Block {
    int64_t ptr = 0, size = 0, requested = 0;
    int32_t prev = -1, next = -1;  // neighbours carved from the same segment
    bool small = false, allocated = false, live = true;
    int16_t stream = 0;  // the stream whose segment it is carved from
  };
  // Free blocks of a pool by (size, address), as BlockComparatorSize orders one stream's. A
  // replay's pool holds hundreds of free blocks of about ten sizes (a tree's node per insertion
  // cost most of its time): one bucket per size, in size order, each its blocks by descending
  // address, so that the lowest address, the one best fit takes, is the last.
  class Pool {
   public:
    struct Entry {
      int64_t size = 0, ptr = 0;
      int32_t id = -1;
    };
    void insert(const Entry& e);
    void erase(int64_t size, int64_t ptr);
    // The first block of at least `size` in (size, address) order, and the one after a block.
    std::optional<Entry> lower_bound(int64_t size) const;
    std::optional<Entry> after(const Entry& e) const;
    std::optional<Entry> largest() const;
    bool empty() const { return buckets_.empty(); }
    std::vector<Entry> all() const;  // every block, in order

   private:
    struct Bucket {
      int64_t size = 0;
      std::vector<std::pair<int64_t, int32_t>> blocks;  // (address, id), descending address
    };
    size_t find(int64_t size) const;  // the first bucket of at least `size`
    std::vector<Bucket> buckets_;     // by size; none empty
    std::vector<std::vector<std::pair<int64_t, int32_t>>> spare_;  // emptied buckets' storage
  };
  // Expandable segments: one per pool and stream, mapped up to its end; the block that ends there.
  struct Expandable {
    int64_t base = -1, mapped = 0;
    int32_t last = -1;
  };
  struct StreamPools {
    Pool pool[2];              // [0] large, [1] small
    Expandable expandable[2];  // the same
  };
  StreamPools& on(int stream);  // a new stream's pools made (malloc checks the stream first)
  Pool& pool(int stream, bool small) {
    return streams_[static_cast<size_t>(stream)].pool[small ? 1 : 0];
  }
  int32_t new_block(Block b);
  void pool_insert(int32_t id);
  void pool_erase(int32_t id);
  std::optional<int32_t> free_block_for(int stream, bool small, int64_t size);
  std::optional<int32_t> new_segment(int stream, bool small, int64_t size);
  bool release_oversize(int stream, bool small, int64_t size);
  void release_whole_segments();
  void release_segment(int32_t id);
  int32_t take(int32_t id, int64_t size, int64_t requested);
  void merge(int32_t dst, int32_t src);
  void grow(int64_t reserved, int64_t allocated);

  AllocatorConfig c_;
  SegmentMemory* memory_ = nullptr;
  std::vector<Block> blocks_;
  std::vector<int32_t> unused_;  // ids of merged-away blocks, reused
  std::vector<StreamPools> streams_;  // by stream
  int64_t next_address_ = 0;
  int64_t allocated_ = 0, reserved_ = 0, requested_ = 0, max_allocated_ = 0, max_reserved_ = 0;
  int64_t segments_ = 0;
};

// A rank's allocation events (simulate's, canonical order) replayed through the allocator.
struct AllocatorReplay {
  int64_t max_allocated = 0;  // torch.cuda.max_memory_allocated(): blocks as the allocator hands them out
  int64_t max_reserved = 0;   // torch.cuda.max_memory_reserved()
  int64_t segments = 0;       // segments (or expandable segments) at the end
  int64_t out_of_memory_event = -1;  // the event that found the device full (config.capacity)
  int steps = 1;        // replay_steps: the steps replayed
  bool steady = true;   // replay_steps: the last step reserved nothing new
};
AllocatorReplay replay_allocator(const std::vector<MemEvent>& events, const AllocatorConfig& c);

// A rank's training steps as its allocator sees them: the step's static tensors (the
// allocations of its first instruction, which are never freed), then `kept` (the runtime's and
// the framework's allocations held for the run), then the step's other events, and those again,
// step after step, until a step reserves nothing new. Every dynamic tensor is freed by a step's
// end, so a step that maps no new segment leaves the cache as it found it, and every later step
// repeats it: the steady state, reached within `max_steps` (else `steady` is false).
AllocatorReplay replay_steps(const std::vector<MemEvent>& events, const std::vector<int64_t>& kept,
                             const AllocatorConfig& c, int max_steps = 8);
// The same for exactly `steps` steps (what a run of that many steps reserves): `steady` then says
// whether the last of them reserved nothing new.
AllocatorReplay replay_exact_steps(const std::vector<MemEvent>& events,
                                   const std::vector<int64_t>& kept, const AllocatorConfig& c,
                                   int steps);

}  // namespace np
