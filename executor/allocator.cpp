// Tracking allocator: bookkeeping by an event log, so the live set at the peak and the MemEvent
// sequence are rebuilt on demand.
#include "executor/allocator.hpp"

#include <algorithm>

#include "planner/inputs/units.hpp"

namespace np::exec {

namespace {
std::string oom_message(const std::string& t, int64_t b, int64_t use, int64_t bud) {
  std::string head = "out of memory: allocating " + t + " (" + format_int(b) + " bytes) with " +
                     format_int(use) + " bytes in use ";
  return bud >= 0 ? head + "would exceed the budget of " + format_int(bud) + " bytes"
                  : head + "failed: the device has no room";
}
}  // namespace

OutOfBudget::OutOfBudget(std::string t, int64_t b, int64_t use, int64_t bud)
    : std::runtime_error(oom_message(t, b, use, bud)),
      tensor(std::move(t)),
      bytes(b),
      in_use(use),
      budget(bud) {}

TrackingAllocator::TrackingAllocator(DeviceMemory& device, std::optional<int64_t> budget,
                                     const AllocatorChoice& allocator)
    : device_(device), budget_(budget) {
  if (allocator.model == AllocatorModel::kExact) return;
  AllocatorConfig c = allocator.config;
  if (c.expandable_segments && !can_expand(device))
    throw std::invalid_argument(
        "--allocator expandable: this backend's memory cannot grow a segment in place (valid "
        "here: caching, exact)");
  if (budget) c.capacity = *budget;  // PyTorch runs out when it cannot reserve more
  segments_ = std::make_unique<Segments>(device, c.expandable_segments);
  cache_ = std::make_unique<CachingAllocator>(c, segments_.get());
}

TrackingAllocator::~TrackingAllocator() {
  for (Block& b : blocks_)
    if (b.live && b.handle < 0) device_.release(b.ptr);
  cache_.reset();
  segments_.reset();  // its segments back to the device
  for (void* p : runtime_ptrs_) device_.release(p);
}

bool TrackingAllocator::can_expand(DeviceMemory& device) {
  void* p = device.reserve_addresses(Segments::kExpandableRange);
  if (!p) return false;
  device.release_addresses(p, Segments::kExpandableRange);
  return true;
}

TrackingAllocator::Segments::~Segments() {
  for (auto& [base, p] : base_)
    if (expandable_)
      device_.release_addresses(p, kExpandableRange);
    else
      device_.release(p);
}

bool TrackingAllocator::Segments::map(int64_t base, int64_t bytes) {
  if (expandable_) {
    auto it = base_.upper_bound(base);
    if (it == base_.begin() || base - std::prev(it)->first >= kExpandableRange) {
      void* p = device_.reserve_addresses(kExpandableRange);  // a new expandable segment
      if (!p) return false;
      it = base_.emplace(base, p).first;
    } else {
      --it;
    }
    int64_t offset = base - it->first;
    if (offset + bytes > kExpandableRange || !device_.map_addresses(it->second, offset, bytes))
      return false;
  } else {
    void* p = device_.allocate(bytes);
    if (!p) return false;
    base_.emplace(base, p);
  }
  held += bytes;
  max_held = std::max(max_held, held);
  return true;
}

void TrackingAllocator::Segments::unmap(int64_t base, int64_t bytes) {
  auto it = base_.upper_bound(base);
  if (it == base_.begin()) throw std::logic_error("tracking allocator: unmap of an unknown segment");
  --it;
  if (expandable_) {
    device_.unmap_addresses(it->second, base - it->first, bytes);
  } else {
    if (it->first != base) throw std::logic_error("tracking allocator: unmap inside a segment");
    device_.release(it->second);
    base_.erase(it);
  }
  held -= bytes;
}

void* TrackingAllocator::Segments::pointer(int64_t address) const {
  auto it = base_.upper_bound(address);
  if (it == base_.begin()) throw std::logic_error("tracking allocator: a block outside segments");
  --it;
  return static_cast<char*>(it->second) + (address - it->first);
}

std::optional<int64_t> TrackingAllocator::reserved_peak() const {
  if (!segments_) return std::nullopt;
  return segments_->max_held;
}

std::optional<int64_t> TrackingAllocator::reserved_now() const {
  if (!segments_) return std::nullopt;
  return segments_->held;
}

std::optional<int64_t> TrackingAllocator::allocated_blocks_now() const {
  if (!cache_) return std::nullopt;
  return cache_->allocated();
}

std::optional<int64_t> TrackingAllocator::allocated_blocks_peak() const {
  if (!cache_) return std::nullopt;
  return cache_->max_allocated();
}

void* TrackingAllocator::allocate_runtime(int64_t bytes, std::string name) {
  if (bytes < 0) throw std::logic_error("tracking allocator: negative size for " + name);
  void* p = device_.allocate(bytes);
  if (!p) throw OutOfBudget(std::move(name), bytes, in_use_, -1);
  device_.fill_bytes(p, 0xFF, bytes);
  runtime_ptrs_.push_back(p);
  runtime_.push_back({std::move(name), bytes, Category::kTransient});
  sample_device();
  return p;
}

void TrackingAllocator::sample_device() {
  if (std::optional<int64_t> used = device_.device_used())
    device_peak_ = std::max(device_peak_.value_or(0), *used);
}

void* TrackingAllocator::allocate(int64_t bytes, std::string name, Category category,
                                  int32_t tensor, int16_t stream) {
  if (bytes < 0) throw std::logic_error("tracking allocator: negative size for " + name);
  if (budget_ && in_use_ + bytes > *budget_)
    throw OutOfBudget(std::move(name), bytes, in_use_, *budget_);
  void* p = nullptr;
  int32_t handle = -1;  // -1: the device's own allocation
  if (cache_ && bytes > 0) {  // (size-0 requests never reach PyTorch's allocator)
    std::optional<int32_t> h = cache_->malloc(bytes, stream);
    if (!h)  // the budget reached by what the allocator reserves, or the device full
      throw OutOfBudget(std::move(name), bytes, in_use_, budget_.value_or(-1));
    handle = *h;
    p = segments_->pointer(cache_->address(handle));
  } else {
    p = device_.allocate(bytes);
  }
  if (!p) throw OutOfBudget(std::move(name), bytes, in_use_, -1);
  if (bytes > 0) device_.fill_bytes(p, 0xFF, bytes);
  log_.push_back({blocks_.size(), instr_, true, stream});
  blocks_.push_back({p, bytes, std::move(name), category, tensor, true, handle});
  in_use_ += bytes;
  current_[static_cast<int>(category)] += bytes;
  if (in_use_ > peak_) {
    peak_ = in_use_;
    peak_entry_ = log_.size();
    at_peak_ = current_;
  }
  timeline_.push_back(in_use_);
  sample_device();
  return p;
}

void TrackingAllocator::release(void* p) {
  if (!p) return;
  for (size_t i = blocks_.size(); i-- > 0;) {
    Block& b = blocks_[i];
    if (b.ptr != p || !b.live) continue;
    b.live = false;
    if (b.handle >= 0)
      cache_->free(b.handle);
    else
      device_.release(b.ptr);
    in_use_ -= b.bytes;
    current_[static_cast<int>(b.category)] -= b.bytes;
    log_.push_back({i, instr_, false});
    timeline_.push_back(in_use_);
    return;
  }
  throw std::logic_error("tracking allocator: release of memory it does not own");
}

void TrackingAllocator::bind(void* p, int32_t tensor, std::string name) {
  for (size_t i = blocks_.size(); i-- > 0;)
    if (blocks_[i].ptr == p && blocks_[i].live) {
      blocks_[i].tensor = tensor;
      blocks_[i].name = std::move(name);
      return;
    }
  throw std::logic_error("tracking allocator: bind of memory it does not own");
}

std::vector<LiveAllocation> TrackingAllocator::live_at_peak() const {
  std::vector<bool> live(blocks_.size(), false);
  for (size_t e = 0; e < peak_entry_; ++e) live[log_[e].block] = log_[e].alloc;
  std::vector<LiveAllocation> out;
  for (size_t i = 0; i < blocks_.size(); ++i)
    if (live[i]) out.push_back({blocks_[i].name, blocks_[i].bytes, blocks_[i].category});
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
  return out;
}

std::vector<std::vector<MemEvent>> TrackingAllocator::events() const {
  std::vector<int32_t> ids(blocks_.size());
  int32_t unplanned = 0;
  for (size_t i = 0; i < blocks_.size(); ++i)
    ids[i] = blocks_[i].tensor >= 0 ? blocks_[i].tensor : -(1 + unplanned++);
  std::vector<std::vector<MemEvent>> out;
  for (size_t s = 0; s < steps_.size(); ++s) {
    size_t end = s + 1 < steps_.size() ? steps_[s + 1] : log_.size();
    std::vector<MemEvent> step;
    for (size_t e = steps_[s]; e < end; ++e) {
      const LogEntry& l = log_[e];
      step.push_back({l.instr, ids[l.block], blocks_[l.block].bytes, l.alloc, l.stream});
    }
    canonical_order(step);
    out.push_back(std::move(step));
  }
  return out;
}

std::vector<std::string> TrackingAllocator::unplanned_names() const {
  std::vector<std::string> names;
  for (const Block& b : blocks_)
    if (b.tensor < 0) names.push_back(b.name);
  return names;
}

}  // namespace np::exec
