// A model of PyTorch's CUDA caching allocator, to replay a rank's allocation events and predict
// what it reserves (torch.cuda.max_memory_reserved) besides what it allocates
// (max_memory_allocated, which counts the allocator's rounded blocks, not the requested bytes).
//
// The rules follow c10/cuda/CUDACachingAllocator.cpp and c10/core/AllocatorConfig.cpp of
// pytorch/pytorch at commit b944315b93d36f842ef94d67a041371993234a74 (main, late 2025); the .cpp
// cites the functions and lines of each rule. One stream, no CUDA graphs, no record_stream: the
// replay of one rank's compute stream. Documented limits: docs/estimate.md, "Reserved memory".
#pragma once
#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>
#include <vector>

#include "planner/inputs/result.hpp"
#include "planner/schedule/simulate.hpp"

namespace np {

inline constexpr int64_t kAllocMinBlock = 512;            // kMinBlockSize
inline constexpr int64_t kAllocSmallSize = 1 << 20;       // kSmallSize: the small pool's largest
inline constexpr int64_t kAllocSmallBuffer = 2 << 20;     // kSmallBuffer: a small segment, page
inline constexpr int64_t kAllocLargeBuffer = 20 << 20;    // kLargeBuffer: 1-10 MiB segments, page
inline constexpr int64_t kAllocMinLargeAlloc = 10 << 20;  // kMinLargeAlloc
inline constexpr int64_t kAllocRoundLarge = 2 << 20;      // kRoundLarge

// PYTORCH_CUDA_ALLOC_CONF's options that change sizes (the others change no byte of one stream).
struct AllocatorConfig {
  bool expandable_segments = false;
  int64_t max_split_size = std::numeric_limits<int64_t>::max();  // max_split_size_mb; unset: none
  int64_t max_non_split_rounding = kAllocLargeBuffer;             // max_non_split_rounding_mb
  // roundup_power2_divisions per size interval: [0] every size below 2 MiB, [k] sizes in
  // [2^(20+k), 2^(21+k)), [15] from 32 GiB; 0 or 1: off.
  std::array<int64_t, 16> roundup_divisions{};
  int64_t capacity = 0;  // device bytes a segment may take (0: unlimited); past it, the OOM path
};

// "expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:[64:8,>:2]", as
// PyTorch parses it: booleans True/False, max_split_size_mb and max_non_split_rounding_mb at
// least 20, divisions 0 or powers of two, list boundaries powers of two (MiB). Keys that change
// no size of one stream (garbage_collection_threshold, backend, ...) are accepted and ignored;
// an unknown key is an error naming the valid ones.
Result<AllocatorConfig> parse_allocator_conf(std::string_view text);

// The allocator: malloc and free of one stream, with PyTorch's counters.
class CachingAllocator {
 public:
  explicit CachingAllocator(AllocatorConfig config = {});

  // A block for `bytes` (> 0): its handle, or nullopt when the device is full after PyTorch's
  // release-and-retry path (an OutOfMemoryError there).
  std::optional<int32_t> malloc(int64_t bytes);
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

  // The size a request is rounded to (round_size), and the segment a non-expandable miss
  // cudaMallocs for a rounded size (get_allocation_size).
  static int64_t round_size(int64_t bytes, const AllocatorConfig& c);
  static int64_t allocation_size(int64_t rounded);

 private:
  struct Block {
    int64_t ptr = 0, size = 0, requested = 0;
    int32_t prev = -1, next = -1;  // neighbours carved from the same segment
    bool small = false, allocated = false, live = true;
  };
  // Free blocks of a pool by (size, address), as BlockComparatorSize orders one stream's.
  using Pool = std::set<std::tuple<int64_t, int64_t, int32_t>>;

  Pool& pool(bool small) { return small ? small_ : large_; }
  int32_t new_block(Block b);
  void pool_insert(int32_t id);
  void pool_erase(int32_t id);
  std::optional<int32_t> free_block_for(bool small, int64_t size);
  std::optional<int32_t> new_segment(bool small, int64_t size);
  bool release_oversize(bool small, int64_t size);
  void release_whole_segments();
  void release_segment(int32_t id);
  int32_t take(int32_t id, int64_t size, int64_t requested);
  void merge(int32_t dst, int32_t src);
  void grow(int64_t reserved, int64_t allocated);

  AllocatorConfig c_;
  std::vector<Block> blocks_;
  std::vector<int32_t> unused_;  // ids of merged-away blocks, reused
  Pool small_, large_;
  int64_t next_address_ = 0;
  int64_t allocated_ = 0, reserved_ = 0, requested_ = 0, max_allocated_ = 0, max_reserved_ = 0;
  int64_t segments_ = 0;
  // Expandable segments: one per pool, mapped up to its end; the block that ends there.
  struct Expandable {
    int64_t base = -1, mapped = 0;
    int32_t last = -1;
  };
  Expandable expandable_[2];  // [0] large, [1] small
};

// A rank's allocation events (simulate's, canonical order) replayed through the allocator.
struct AllocatorReplay {
  int64_t max_allocated = 0;  // torch.cuda.max_memory_allocated(): blocks as the allocator hands them out
  int64_t max_reserved = 0;   // torch.cuda.max_memory_reserved()
  int64_t segments = 0;       // segments (or expandable segments) at the end
  int64_t out_of_memory_event = -1;  // the event that found the device full (config.capacity)
};
AllocatorReplay replay_allocator(const std::vector<MemEvent>& events, const AllocatorConfig& c);

}  // namespace np
