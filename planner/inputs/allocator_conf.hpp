// The options of PyTorch's CUDA caching allocator that change the bytes it reserves
// (PYTORCH_CUDA_ALLOC_CONF), and which allocator model an estimate replays: the planner's
// inputs. The model itself is planner/schedule/caching_allocator.hpp.
//
// The constants and rules follow c10/cuda/CUDACachingAllocator.cpp and c10/core/AllocatorConfig.cpp
// of pytorch/pytorch at commit b944315b93d36f842ef94d67a041371993234a74 (main, late 2025).
#pragma once
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "planner/inputs/result.hpp"

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

// The block size PyTorch's caching allocator rounds a request of `bytes` to (round_size): 512 B
// steps, or the roundup_power2_divisions step of the size's interval.
int64_t allocator_round_size(int64_t bytes, const AllocatorConfig& c);

// "expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:[64:8,>:2]", as
// PyTorch parses it: booleans True/False, max_split_size_mb and max_non_split_rounding_mb at
// least 20, divisions 0 or powers of two, list boundaries powers of two (MiB). Keys that change
// no size of one stream (garbage_collection_threshold, backend, ...) are accepted and ignored;
// an unknown key is an error naming the valid ones.
Result<AllocatorConfig> parse_allocator_conf(std::string_view text);

// What an estimate assumes allocates the schedule's tensors (--allocator).
enum class AllocatorModel : uint8_t {
  kCaching,     // PyTorch's caching allocator, its options as given (the default)
  kExpandable,  // the same with expandable_segments:True
  kExact,       // one allocation per tensor of exactly its size: no rounding, nothing cached
};
// "caching", "expandable", "exact".
const char* name_of(AllocatorModel m);

// The allocator of an estimate or a run: --allocator and --allocator-conf together.
struct AllocatorChoice {
  AllocatorModel model = AllocatorModel::kCaching;
  AllocatorConfig config;  // --allocator-conf (expandable: expandable_segments set)
  std::string options;     // --allocator-conf as given, for reports ("" when none)
};

// --allocator caching|expandable|exact with --allocator-conf's PYTORCH_CUDA_ALLOC_CONF-style
// options. expandable_segments:True in the options means --allocator expandable; options with
// --allocator exact are an error (nothing is cached to tune).
Result<AllocatorChoice> parse_allocator_choice(std::string_view model, std::string_view options);

}  // namespace np
