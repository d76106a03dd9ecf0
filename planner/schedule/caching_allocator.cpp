// PyTorch's CUDA caching allocator, one stream (caching_allocator.hpp). "[A] L..." cites
// c10/cuda/CUDACachingAllocator.cpp, "[C] L..." c10/core/AllocatorConfig.cpp, both of
// pytorch/pytorch at b944315b93d36f842ef94d67a041371993234a74.
#include "planner/schedule/caching_allocator.hpp"

#include <algorithm>
#include <bit>
#include <cctype>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "planner/inputs/units.hpp"

namespace np {
namespace {

constexpr int64_t kMaxSize = std::numeric_limits<int64_t>::max();

int floor_log2(int64_t v) { return 63 - std::countl_zero(static_cast<uint64_t>(v)); }
bool power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// roundup_power2_next_division, [A] L2473-2491: up to the next of `d` equal steps between two
// powers of two.
int64_t next_division(int64_t size, int64_t d) {
  if (power_of_two(size)) return size;
  int64_t floor = int64_t{1} << floor_log2(size);
  int64_t step = floor >> floor_log2(d);
  if (step == 0) return 2 * floor;
  return (size + step - 1) / step * step;
}

}  // namespace

// round_size, [A] L2493-2505; the interval of a size, [C] L40-56.
int64_t CachingAllocator::round_size(int64_t bytes, const AllocatorConfig& c) {
  if (bytes < kAllocMinBlock) return kAllocMinBlock;
  int interval = std::clamp(floor_log2(bytes) - 20, 0, 15);
  int64_t d = c.roundup_divisions[static_cast<size_t>(interval)];
  if (d > 1 && bytes > kAllocMinBlock * d) return next_division(bytes, d);
  return (bytes + kAllocMinBlock - 1) / kAllocMinBlock * kAllocMinBlock;
}

// get_allocation_size, [A] L2997-3005.
int64_t CachingAllocator::allocation_size(int64_t rounded) {
  if (rounded <= kAllocSmallSize) return kAllocSmallBuffer;
  if (rounded < kAllocMinLargeAlloc) return kAllocLargeBuffer;
  return (rounded + kAllocRoundLarge - 1) / kAllocRoundLarge * kAllocRoundLarge;
}

CachingAllocator::CachingAllocator(AllocatorConfig config) : c_(config) {}

int32_t CachingAllocator::new_block(Block b) {
  if (!unused_.empty()) {
    int32_t id = unused_.back();
    unused_.pop_back();
    blocks_[static_cast<size_t>(id)] = b;
    return id;
  }
  blocks_.push_back(b);
  return static_cast<int32_t>(blocks_.size()) - 1;
}

void CachingAllocator::pool_insert(int32_t id) {
  const Block& b = blocks_.at(static_cast<size_t>(id));
  pool(b.small).insert({b.size, b.ptr, id});
}

void CachingAllocator::pool_erase(int32_t id) {
  const Block& b = blocks_.at(static_cast<size_t>(id));
  pool(b.small).erase({b.size, b.ptr, id});
}

void CachingAllocator::grow(int64_t reserved, int64_t allocated) {
  reserved_ += reserved, allocated_ += allocated;
  max_reserved_ = std::max(max_reserved_, reserved_);
  max_allocated_ = std::max(max_allocated_, allocated_);
}

// get_free_block, [A] L3007-3065: the smallest cached block that fits, lowest address first;
// an expandable segment's growing end counts as larger than any block inside (L3020-3036);
// then the two oversize rules (L3053-3061).
std::optional<int32_t> CachingAllocator::free_block_for(bool small, int64_t size) {
  Pool& p = pool(small);
  auto it = p.lower_bound({size, std::numeric_limits<int64_t>::min(), -1});
  if (it == p.end()) return std::nullopt;
  if (c_.expandable_segments) {
    const int32_t tail = expandable_[small ? 1 : 0].last;
    if (std::get<2>(*it) == tail && std::next(it) != p.end()) ++it;  // an inside block fits
  }
  int64_t found = std::get<0>(*it);
  if (size < c_.max_split_size && found >= c_.max_split_size) return std::nullopt;
  if (size >= c_.max_split_size && found >= size + c_.max_non_split_rounding)
    return std::nullopt;
  int32_t id = std::get<2>(*it);
  p.erase(it);
  return id;
}

// alloc_block, [A] L3140-3253: a new segment of allocation_size (cudaMalloc); expandable
// segments instead map whole pages (2 MiB small, 20 MiB large) at the end of the pool's one
// segment, continuing a free block that ends there (try_allocate_expandable_block and
// map_block, L2740-2840).
std::optional<int32_t> CachingAllocator::new_segment(bool small, int64_t size) {
  if (!c_.expandable_segments) {
    int64_t bytes = allocation_size(size);
    if (c_.capacity > 0 && reserved_ + bytes > c_.capacity) return std::nullopt;
    int32_t id = new_block({next_address_, bytes, 0, -1, -1, small, false, true});
    next_address_ += bytes + kAllocLargeBuffer;  // segments are never adjacent
    ++segments_;
    grow(bytes, 0);
    return id;
  }
  Expandable& e = expandable_[small ? 1 : 0];
  const int64_t page = small ? kAllocSmallBuffer : kAllocLargeBuffer;
  if (e.base < 0) {
    e.base = next_address_;
    next_address_ += int64_t{1} << 50;  // the segment's virtual reservation
    ++segments_;
  }
  int32_t tail = e.last >= 0 && !blocks_[static_cast<size_t>(e.last)].allocated ? e.last : -1;
  int64_t have = tail >= 0 ? blocks_[static_cast<size_t>(tail)].size : 0;
  int64_t bytes = (size - have + page - 1) / page * page;
  if (c_.capacity > 0 && reserved_ + bytes > c_.capacity) return std::nullopt;
  grow(bytes, 0);
  if (tail >= 0) {
    pool_erase(tail);
    blocks_[static_cast<size_t>(tail)].size += bytes;
    e.mapped += bytes;
    return tail;
  }
  int32_t id = new_block({e.base + e.mapped, bytes, 0, e.last, -1, small, false, true});
  if (e.last >= 0) blocks_[static_cast<size_t>(e.last)].next = id;
  e.mapped += bytes;
  e.last = id;
  return id;
}

// release_available_cached_blocks, [A] L3258-3304: with max_split_size set, cudaFree a cached
// oversize block at least max(size, max_split_size), else the largest oversize ones until that
// much is freed (those freed stay freed).
bool CachingAllocator::release_oversize(bool small, int64_t size) {
  if (c_.max_split_size == kMaxSize || c_.expandable_segments) return false;
  Pool& p = pool(small);
  int64_t key = std::max(size, c_.max_split_size);
  auto release = [&](int32_t id) {
    pool_erase(id);
    release_segment(id);
  };
  auto it = p.lower_bound({key, std::numeric_limits<int64_t>::min(), -1});
  if (it != p.end()) {
    release(std::get<2>(*it));
    return true;
  }
  int64_t freed = 0;
  while (freed < key && !p.empty()) {
    auto last = std::prev(p.end());
    if (std::get<0>(*last) < c_.max_split_size) break;
    freed += std::get<0>(*last);
    release(std::get<2>(*last));
  }
  return freed >= key;
}

// release_block, [A] L3367-3412: a whole cached segment out of the pool, cudaFreed.
void CachingAllocator::release_segment(int32_t id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  reserved_ -= b.size;
  --segments_;
  b.live = false;
  unused_.push_back(id);
}

// release_cached_blocks, [A] L3306-3349 and release_blocks, L3485-3509: every cached whole
// segment is cudaFreed. Expandable segments unmap the whole pages of the free block at their end
// (unmap_block, L3414-3484); pages of free blocks inside a segment stay mapped in this model.
void CachingAllocator::release_whole_segments() {
  if (c_.expandable_segments) {
    for (int s = 0; s < 2; ++s) {
      Expandable& e = expandable_[s];
      if (e.last < 0 || blocks_[static_cast<size_t>(e.last)].allocated) continue;
      const int64_t page = s == 1 ? kAllocSmallBuffer : kAllocLargeBuffer;
      Block& b = blocks_[static_cast<size_t>(e.last)];
      int64_t from = (b.ptr - e.base + page - 1) / page * page;  // first whole page inside it
      int64_t bytes = e.mapped - from;
      if (bytes <= 0) continue;
      int32_t id = e.last;
      pool_erase(id);
      reserved_ -= bytes;
      e.mapped -= bytes;
      b.size -= bytes;
      if (b.size > 0) {
        pool_insert(id);
      } else {
        e.last = b.prev;
        if (b.prev >= 0) blocks_[static_cast<size_t>(b.prev)].next = -1;
        b.live = false;
        unused_.push_back(id);
      }
    }
    return;
  }
  for (Pool* p : {&small_, &large_})
    for (auto it = p->begin(); it != p->end();) {
      int32_t id = std::get<2>(*it);
      const Block& b = blocks_[static_cast<size_t>(id)];
      if (b.prev >= 0 || b.next >= 0) {
        ++it;
        continue;
      }
      it = p->erase(it);
      release_segment(id);
    }
}

// should_split, [A] L2987-2995, and alloc_found_block, L1578-1675: the request takes the front
// of the block, the rest stays cached; allocated counts the block handed out.
int32_t CachingAllocator::take(int32_t id, int64_t size, int64_t requested) {
  int64_t remaining = blocks_[static_cast<size_t>(id)].size - size;
  bool split = blocks_[static_cast<size_t>(id)].small || c_.expandable_segments
                   ? remaining >= kAllocMinBlock
                   : size < c_.max_split_size && remaining > kAllocSmallSize;
  int32_t chosen = id;
  if (split) {
    Block rest = blocks_[static_cast<size_t>(id)];
    chosen = new_block({rest.ptr, size, 0, rest.prev, id, rest.small, false, true});
    Block& b = blocks_[static_cast<size_t>(id)];
    if (b.prev >= 0) blocks_[static_cast<size_t>(b.prev)].next = chosen;
    b.prev = chosen;
    b.ptr += size;
    b.size -= size;
    pool_insert(id);
  }
  Block& c = blocks_[static_cast<size_t>(chosen)];
  c.allocated = true;
  c.requested = requested;
  requested_ += requested;
  grow(0, c.size);
  return chosen;
}

std::optional<int32_t> CachingAllocator::malloc(int64_t bytes) {
  // malloc, [A] L1361-1576: a cached block, else a new segment, else release oversize cached
  // blocks and retry, else release every cached segment and retry, else out of memory.
  int64_t size = round_size(bytes, c_);
  bool small = size <= kAllocSmallSize;
  std::optional<int32_t> b = free_block_for(small, size);
  if (!b) b = new_segment(small, size);
  if (!b && release_oversize(small, size)) b = new_segment(small, size);
  if (!b) {
    release_whole_segments();
    b = new_segment(small, size);
  }
  if (!b) return std::nullopt;
  return take(*b, size, bytes);
}

// try_merge_blocks, [A] L2921-2952: a free block absorbs a free neighbour of its own segment.
void CachingAllocator::merge(int32_t dst, int32_t src) {
  if (src < 0 || blocks_[static_cast<size_t>(src)].allocated) return;
  pool_erase(src);
  Block s = blocks_[static_cast<size_t>(src)];
  Block& d = blocks_[static_cast<size_t>(dst)];
  if (d.prev == src) {
    d.ptr = s.ptr;
    d.prev = s.prev;
    if (s.prev >= 0) blocks_[static_cast<size_t>(s.prev)].next = dst;
  } else {
    d.next = s.next;
    if (s.next >= 0) blocks_[static_cast<size_t>(s.next)].prev = dst;
  }
  d.size += s.size;
  for (Expandable& e : expandable_)
    if (e.last == src) e.last = dst;
  blocks_[static_cast<size_t>(src)].live = false;
  unused_.push_back(src);
}

// free and free_block, [A] L1895-1958, L2843-2917: allocated drops at once; the block merges
// with free neighbours and stays cached (reserved does not change).
void CachingAllocator::free(int32_t handle) {
  Block& b = blocks_.at(static_cast<size_t>(handle));
  if (!b.live || !b.allocated) throw std::logic_error("CachingAllocator: free of a free block");
  b.allocated = false;
  allocated_ -= b.size;
  requested_ -= b.requested;
  merge(handle, blocks_[static_cast<size_t>(handle)].prev);
  merge(handle, blocks_[static_cast<size_t>(handle)].next);
  pool_insert(handle);
}

void CachingAllocator::empty_cache() { release_whole_segments(); }

AllocatorReplay replay_allocator(const std::vector<MemEvent>& events, const AllocatorConfig& c) {
  CachingAllocator a(c);
  AllocatorReplay r;
  std::unordered_map<int32_t, int32_t> handle;  // tensor id -> block
  for (size_t i = 0; i < events.size(); ++i) {
    const MemEvent& e = events[i];
    if (e.bytes <= 0) continue;  // size-0 requests never reach the allocator
    if (e.alloc) {
      std::optional<int32_t> h = a.malloc(e.bytes);
      if (!h) {
        r.out_of_memory_event = static_cast<int64_t>(i);
        break;
      }
      handle[e.tensor] = *h;
    } else if (auto it = handle.find(e.tensor); it != handle.end()) {
      a.free(it->second);
      handle.erase(it);
    }
  }
  r.max_allocated = a.max_allocated(), r.max_reserved = a.max_reserved();
  r.segments = a.segments();
  return r;
}

// parseArgs, [C] L195-229, and the CUDA keys of c10/cuda/CUDAAllocatorConfig.cpp.
Result<AllocatorConfig> parse_allocator_conf(std::string_view text) {
  AllocatorConfig c;
  std::string s;
  for (char ch : text)
    if (!std::isspace(static_cast<unsigned char>(ch))) s += ch;
  auto bad = [&](const std::string& why) {
    return make_error("invalid allocator options " + quote_input(text) + ": " + why);
  };
  auto whole = [](const std::string& v) -> std::optional<int64_t> {
    if (v.empty() || v.size() > 15 || v.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    return std::stoll(v);
  };
  size_t at = 0;
  while (at < s.size()) {
    size_t colon = s.find(':', at);
    if (colon == std::string::npos) return bad("'" + s.substr(at) + "' has no value (key:value)");
    std::string key = s.substr(at, colon - at);
    size_t end = s[colon + 1] == '[' ? s.find(']', colon) : s.find(',', colon);
    if (end == std::string::npos) end = s.size();
    std::string value = s.substr(colon + 1, end - colon - (s[colon + 1] == '[' ? 0 : 1));
    at = end + (end < s.size() && s[end] == ']' ? 1 : 0);
    if (at < s.size() && s[at] == ',') ++at;
    if (key == "expandable_segments") {
      if (value != "True" && value != "False")
        return bad("expandable_segments takes True or False");
      c.expandable_segments = value == "True";
    } else if (key == "max_split_size_mb" || key == "max_non_split_rounding_mb") {
      std::optional<int64_t> mb = whole(value);
      if (!mb || *mb < kAllocLargeBuffer / kMiB)
        return bad(key + " takes a whole number of MiB, at least 20");
      (key == "max_split_size_mb" ? c.max_split_size : c.max_non_split_rounding) = *mb * kMiB;
    } else if (key == "roundup_power2_divisions") {
      if (value.empty() || value[0] != '[') {
        std::optional<int64_t> d = whole(value);
        if (!d || !power_of_two(*d)) return bad("roundup_power2_divisions takes a power of two");
        c.roundup_divisions.fill(*d);
        continue;
      }
      // [B:d,...,>:d]: B MiB a power of two, its interval log2(B) (sizes [B, 2B) MiB); the
      // first also fills the intervals below it, '>' those after the last (L109-175).
      std::string list = value.substr(1, value.size() - 2);
      size_t last = 0;
      bool first = true;
      for (size_t p = 0; p < list.size();) {
        size_t comma = std::min(list.find(',', p), list.size());
        std::string pair = list.substr(p, comma - p);
        p = comma + 1;
        size_t c2 = pair.find(':');
        std::optional<int64_t> d = c2 == std::string::npos ? std::nullopt : whole(pair.substr(c2 + 1));
        if (!d || (*d != 0 && !power_of_two(*d)))
          return bad("roundup_power2_divisions: '" + pair + "' needs a division of 0 or a power of two");
        std::string bound = pair.substr(0, c2);
        if (bound == ">") {
          std::fill(c.roundup_divisions.begin() + static_cast<ptrdiff_t>(last) + 1,
                    c.roundup_divisions.end(), *d);
          continue;
        }
        std::optional<int64_t> mb = whole(bound);
        if (!mb || !power_of_two(*mb))
          return bad("roundup_power2_divisions: '" + bound + "' is not a power of two (MiB)");
        size_t slot = std::min<size_t>(static_cast<size_t>(floor_log2(*mb)), 15);
        if (first) std::fill(c.roundup_divisions.begin(), c.roundup_divisions.begin() + static_cast<ptrdiff_t>(slot), *d);
        first = false;
        c.roundup_divisions[slot] = *d;
        last = slot;
      }
    } else if (key == "garbage_collection_threshold" || key == "backend" ||
               key == "release_lock_on_cudamalloc" || key == "pinned_use_cuda_host_register" ||
               key == "pinned_num_register_threads" || key == "pinned_use_background_threads" ||
               key == "graph_capture_record_stream_reuse" ||
               key == "per_process_memory_fraction") {
      // No size of one stream depends on these (garbage collection needs a memory fraction).
    } else {
      return bad("unknown key " + quote_input(key) +
                 " (valid: expandable_segments, max_split_size_mb, max_non_split_rounding_mb, "
                 "roundup_power2_divisions, garbage_collection_threshold, backend, "
                 "release_lock_on_cudamalloc, pinned_use_cuda_host_register, "
                 "pinned_num_register_threads, pinned_use_background_threads, "
                 "graph_capture_record_stream_reuse, per_process_memory_fraction)");
    }
  }
  return c;
}

}  // namespace np
