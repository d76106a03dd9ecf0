// PyTorch's CUDA caching allocator, with pools per stream (caching_allocator.hpp). "[A] L..." cites
// c10/cuda/CUDACachingAllocator.cpp and "[C] L..." c10/core/AllocatorConfig.cpp, both of
// pytorch/pytorch at b944315b93d36f842ef94d67a041371993234a74.
#include "planner/schedule/caching_allocator.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

namespace np {
namespace {

constexpr int64_t kMaxSize = std::numeric_limits<int64_t>::max();

}  // namespace

// round_size, [A] L2493-2505 (allocator_conf.hpp).
int64_t CachingAllocator::round_size(int64_t bytes, const AllocatorConfig& c) {
  return allocator_round_size(bytes, c);
}

// get_allocation_size, [A] L2997-3005.
int64_t CachingAllocator::allocation_size(int64_t rounded) {
  if (rounded <= kAllocSmallSize) return kAllocSmallBuffer;
  if (rounded < kAllocMinLargeAlloc) return kAllocLargeBuffer;
  return (rounded + kAllocRoundLarge - 1) / kAllocRoundLarge * kAllocRoundLarge;
}

CachingAllocator::CachingAllocator(AllocatorConfig config, SegmentMemory* memory)
    : c_(config), memory_(memory) {}

CachingAllocator::StreamPools& CachingAllocator::on(int stream) {
  if (stream < 0 || stream > std::numeric_limits<int16_t>::max())
    throw std::invalid_argument("CachingAllocator: stream " + std::to_string(stream) +
                                " (valid: 0 to 32767)");
  if (static_cast<size_t>(stream) >= streams_.size())
    streams_.resize(static_cast<size_t>(stream) + 1);
  return streams_[static_cast<size_t>(stream)];
}

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

size_t CachingAllocator::Pool::find(int64_t size) const {
  return static_cast<size_t>(
      std::lower_bound(buckets_.begin(), buckets_.end(), size,
                       [](const Bucket& b, int64_t s) { return b.size < s; }) -
      buckets_.begin());
}

namespace {
// A bucket's blocks are in descending address order.
auto descending = [](const std::pair<int64_t, int32_t>& a, int64_t ptr) { return a.first > ptr; };
}  // namespace

void CachingAllocator::Pool::insert(const Entry& e) {
  size_t i = find(e.size);
  if (i == buckets_.size() || buckets_[i].size != e.size) {
    Bucket b{e.size, {}};
    if (!spare_.empty()) {
      b.blocks = std::move(spare_.back());
      spare_.pop_back();
    }
    buckets_.insert(buckets_.begin() + static_cast<ptrdiff_t>(i), std::move(b));
  }
  auto& v = buckets_[i].blocks;
  v.insert(std::lower_bound(v.begin(), v.end(), e.ptr, descending), {e.ptr, e.id});
}

void CachingAllocator::Pool::erase(int64_t size, int64_t ptr) {
  size_t i = find(size);
  if (i == buckets_.size() || buckets_[i].size != size)
    throw std::logic_error("CachingAllocator: a free block missing from its pool");
  auto& v = buckets_[i].blocks;
  auto at = v.back().first == ptr ? v.end() - 1 : std::lower_bound(v.begin(), v.end(), ptr, descending);
  if (at == v.end() || at->first != ptr)
    throw std::logic_error("CachingAllocator: a free block missing from its pool");
  v.erase(at);
  if (v.empty()) {
    spare_.push_back(std::move(v));
    buckets_.erase(buckets_.begin() + static_cast<ptrdiff_t>(i));
  }
}

std::optional<CachingAllocator::Pool::Entry> CachingAllocator::Pool::lower_bound(int64_t size) const {
  size_t i = find(size);
  if (i == buckets_.size()) return std::nullopt;
  const Bucket& b = buckets_[i];
  return Entry{b.size, b.blocks.back().first, b.blocks.back().second};
}

std::optional<CachingAllocator::Pool::Entry> CachingAllocator::Pool::after(const Entry& e) const {
  size_t i = find(e.size);
  const auto& v = buckets_[i].blocks;
  auto at = std::lower_bound(v.begin(), v.end(), e.ptr, descending);  // e itself
  if (at != v.begin()) return Entry{e.size, (at - 1)->first, (at - 1)->second};
  if (i + 1 == buckets_.size()) return std::nullopt;
  const Bucket& n = buckets_[i + 1];
  return Entry{n.size, n.blocks.back().first, n.blocks.back().second};
}

std::optional<CachingAllocator::Pool::Entry> CachingAllocator::Pool::largest() const {
  if (buckets_.empty()) return std::nullopt;
  const Bucket& b = buckets_.back();
  return Entry{b.size, b.blocks.front().first, b.blocks.front().second};
}

std::vector<CachingAllocator::Pool::Entry> CachingAllocator::Pool::all() const {
  std::vector<Entry> out;
  for (const Bucket& b : buckets_)
    for (auto it = b.blocks.rbegin(); it != b.blocks.rend(); ++it)
      out.push_back({b.size, it->first, it->second});
  return out;
}

void CachingAllocator::pool_insert(int32_t id) {
  const Block& b = blocks_.at(static_cast<size_t>(id));
  pool(b.stream, b.small).insert({b.size, b.ptr, id});
}

void CachingAllocator::pool_erase(int32_t id) {
  const Block& b = blocks_.at(static_cast<size_t>(id));
  pool(b.stream, b.small).erase(b.size, b.ptr);
}

void CachingAllocator::grow(int64_t reserved, int64_t allocated) {
  reserved_ += reserved, allocated_ += allocated;
  max_reserved_ = std::max(max_reserved_, reserved_);
  max_allocated_ = std::max(max_allocated_, allocated_);
}

// get_free_block, [A] L3007-3065: the smallest cached block that fits, lowest address first;
// an expandable segment's growing end counts as larger than any block inside (L3020-3036);
// then the two oversize rules (L3053-3061).
std::optional<int32_t> CachingAllocator::free_block_for(int stream, bool small, int64_t size) {
  Pool& p = pool(stream, small);
  std::optional<Pool::Entry> it = p.lower_bound(size);
  if (!it) return std::nullopt;
  if (c_.expandable_segments &&
      it->id == streams_[static_cast<size_t>(stream)].expandable[small ? 1 : 0].last)
    if (std::optional<Pool::Entry> inside = p.after(*it)) it = inside;  // an inside block fits
  const int64_t found = it->size;
  if (size < c_.max_split_size && found >= c_.max_split_size) return std::nullopt;
  if (size >= c_.max_split_size && found >= size + c_.max_non_split_rounding)
    return std::nullopt;
  const int32_t id = it->id;
  p.erase(it->size, it->ptr);
  return id;
}

// alloc_block, [A] L3140-3253: a new segment of allocation_size (cudaMalloc); expandable
// segments instead map whole pages (2 MiB small, 20 MiB large) at the end of the pool's one
// segment, continuing a free block that ends there (try_allocate_expandable_block and
// map_block, L2740-2840).
std::optional<int32_t> CachingAllocator::new_segment(int stream, bool small, int64_t size) {
  const auto s = static_cast<int16_t>(stream);
  if (!c_.expandable_segments) {
    int64_t bytes = allocation_size(size);
    if (c_.capacity > 0 && reserved_ + bytes > c_.capacity) return std::nullopt;
    if (memory_ && !memory_->map(next_address_, bytes)) return std::nullopt;
    int32_t id = new_block({next_address_, bytes, 0, -1, -1, small, false, true, s});
    next_address_ += bytes + kAllocLargeBuffer;  // segments are never adjacent
    ++segments_;
    grow(bytes, 0);
    return id;
  }
  Expandable& e = streams_[static_cast<size_t>(stream)].expandable[small ? 1 : 0];
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
  if (memory_ && !memory_->map(e.base + e.mapped, bytes)) return std::nullopt;
  grow(bytes, 0);
  if (tail >= 0) {
    pool_erase(tail);
    blocks_[static_cast<size_t>(tail)].size += bytes;
    e.mapped += bytes;
    return tail;
  }
  int32_t id = new_block({e.base + e.mapped, bytes, 0, e.last, -1, small, false, true, s});
  if (e.last >= 0) blocks_[static_cast<size_t>(e.last)].next = id;
  e.mapped += bytes;
  e.last = id;
  return id;
}

// release_available_cached_blocks, [A] L3258-3304: with max_split_size set, cudaFree a cached
// oversize block at least max(size, max_split_size), else the largest oversize ones until that
// much is freed (those freed stay freed).
bool CachingAllocator::release_oversize(int stream, bool small, int64_t size) {
  if (c_.max_split_size == kMaxSize || c_.expandable_segments) return false;
  Pool& p = pool(stream, small);
  int64_t key = std::max(size, c_.max_split_size);
  auto release = [&](int32_t id) {
    pool_erase(id);
    release_segment(id);
  };
  if (std::optional<Pool::Entry> it = p.lower_bound(key)) {
    release(it->id);
    return true;
  }
  int64_t freed = 0;
  while (freed < key && !p.empty()) {
    std::optional<Pool::Entry> last = p.largest();
    if (last->size < c_.max_split_size) break;
    freed += last->size;
    release(last->id);
  }
  return freed >= key;
}

// release_block, [A] L3367-3412: a whole cached segment out of the pool, cudaFreed.
void CachingAllocator::release_segment(int32_t id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  if (memory_) memory_->unmap(b.ptr, b.size);
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
    for (size_t i = 0; i < 2 * streams_.size(); ++i) {
      const int s = static_cast<int>(i % 2);
      Expandable& e = streams_[i / 2].expandable[s];
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
      if (memory_) memory_->unmap(e.base + e.mapped, bytes);
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
  for (StreamPools& sp : streams_)
    for (Pool* p : {&sp.pool[1], &sp.pool[0]})
      for (const Pool::Entry& e : p->all()) {
        const Block& b = blocks_[static_cast<size_t>(e.id)];
        if (b.prev >= 0 || b.next >= 0) continue;
        p->erase(e.size, e.ptr);
        release_segment(e.id);
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
    chosen = new_block({rest.ptr, size, 0, rest.prev, id, rest.small, false, true, rest.stream});
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

std::optional<int32_t> CachingAllocator::malloc(int64_t bytes, int stream) {
  // malloc, [A] L1361-1576: a cached block, else a new segment, else release oversize cached
  // blocks and retry, else release every cached segment and retry, else out of memory.
  int64_t size = round_size(bytes, c_);
  bool small = size <= kAllocSmallSize;
  if (static_cast<size_t>(stream) >= streams_.size())
    on(stream);  // a new stream's pools; one out of range is refused before anything changes
  std::optional<int32_t> b = free_block_for(stream, small, size);
  if (!b) b = new_segment(stream, small, size);
  if (!b && release_oversize(stream, small, size)) b = new_segment(stream, small, size);
  if (!b) {
    release_whole_segments();
    b = new_segment(stream, small, size);
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
  if (c_.expandable_segments)
    for (Expandable& e : streams_[static_cast<size_t>(d.stream)].expandable)
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

namespace {

// Tensor ids to the allocator's blocks: plan tensors (ids >= 0) by index, an executor's own
// allocations (negative ids) by map.
class Handles {
 public:
  void set(int32_t tensor, int32_t block) {
    if (tensor < 0) {
      other_[tensor] = block;
      return;
    }
    if (static_cast<size_t>(tensor) >= by_id_.size()) by_id_.resize(static_cast<size_t>(tensor) + 1, -1);
    by_id_[static_cast<size_t>(tensor)] = block;
  }
  // The block of a live tensor, forgotten (-1: none).
  int32_t take(int32_t tensor) {
    if (tensor < 0) {
      auto it = other_.find(tensor);
      if (it == other_.end()) return -1;
      int32_t b = it->second;
      other_.erase(it);
      return b;
    }
    if (static_cast<size_t>(tensor) >= by_id_.size()) return -1;
    return std::exchange(by_id_[static_cast<size_t>(tensor)], -1);
  }

 private:
  std::vector<int32_t> by_id_;
  std::unordered_map<int32_t, int32_t> other_;
};

// Replays events [begin, end) (size-0 requests never reach the allocator); false when one found
// the device full (its index in r.out_of_memory_event).
bool replay_range(CachingAllocator& a, Handles& h, const std::vector<MemEvent>& events,
                  size_t begin, size_t end, AllocatorReplay& r) {
  for (size_t i = begin; i < end; ++i) {
    const MemEvent& e = events[i];
    if (e.bytes <= 0) continue;
    if (!e.alloc) {
      if (int32_t b = h.take(e.tensor); b >= 0) a.free(b);
      continue;
    }
    std::optional<int32_t> block = a.malloc(e.bytes, e.stream);
    if (!block) {
      r.out_of_memory_event = static_cast<int64_t>(i);
      return false;
    }
    h.set(e.tensor, *block);
  }
  return true;
}

AllocatorReplay finish(const CachingAllocator& a, AllocatorReplay r) {
  r.max_allocated = a.max_allocated(), r.max_reserved = a.max_reserved();
  r.segments = a.segments();
  return r;
}

}  // namespace

AllocatorReplay replay_allocator(const std::vector<MemEvent>& events, const AllocatorConfig& c) {
  CachingAllocator a(c);
  Handles h;
  AllocatorReplay r;
  replay_range(a, h, events, 0, events.size(), r);
  return finish(a, r);
}

namespace {

AllocatorReplay replay_run(const std::vector<MemEvent>& events, const std::vector<int64_t>& kept,
                           const AllocatorConfig& c, int max_steps, bool until_steady) {
  CachingAllocator a(c);
  Handles h;
  AllocatorReplay r;
  size_t statics = 0;
  while (statics < events.size() && events[statics].instr == 0 && events[statics].alloc)
    ++statics;
  if (!replay_range(a, h, events, 0, statics, r)) return finish(a, r);
  for (int64_t bytes : kept)
    if (bytes > 0 && !a.malloc(bytes)) {
      r.out_of_memory_event = static_cast<int64_t>(statics);
      return finish(a, r);
    }
  r.steps = 0;
  while (r.steps < max_steps) {
    const int64_t reserved = a.reserved(), segments = a.segments();
    ++r.steps;
    if (!replay_range(a, h, events, statics, events.size(), r)) break;
    r.steady = a.reserved() == reserved && a.segments() == segments;
    if (r.steady && until_steady) break;
  }
  return finish(a, r);
}

}  // namespace

AllocatorReplay replay_steps(const std::vector<MemEvent>& events, const std::vector<int64_t>& kept,
                             const AllocatorConfig& c, int max_steps) {
  return replay_run(events, kept, c, max_steps, true);
}

AllocatorReplay replay_exact_steps(const std::vector<MemEvent>& events,
                                   const std::vector<int64_t>& kept, const AllocatorConfig& c,
                                   int steps) {
  return replay_run(events, kept, c, steps, false);
}

}  // namespace np
