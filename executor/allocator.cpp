// Tracking allocator: bookkeeping by event log, so the live set at the peak is rebuilt on demand.
#include "executor/allocator.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "planner/units.hpp"

namespace np::exec {

OutOfBudget::OutOfBudget(std::string t, int64_t b, int64_t use, int64_t bud)
    : std::runtime_error("out of memory: allocating " + t + " (" + format_int(b) + " bytes) with " +
                         format_int(use) + " bytes in use would exceed the budget of " +
                         format_int(bud) + " bytes"),
      tensor(std::move(t)),
      bytes(b),
      in_use(use),
      budget(bud) {}

TrackingAllocator::~TrackingAllocator() {
  for (Block& b : blocks_)
    if (b.live) std::free(b.ptr);
}

void* TrackingAllocator::allocate(int64_t bytes, std::string name, Category category) {
  if (budget_ && in_use_ + bytes > *budget_)
    throw OutOfBudget(std::move(name), bytes, in_use_, *budget_);
  size_t size = static_cast<size_t>(std::max<int64_t>(64, (bytes + 63) / 64 * 64));
  void* p = std::aligned_alloc(64, size);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0xFF, size);
  events_.push_back(static_cast<int64_t>(blocks_.size()));
  blocks_.push_back({p, bytes, std::move(name), category, true});
  in_use_ += bytes;
  current_[static_cast<int>(category)] += bytes;
  if (in_use_ > peak_) {
    peak_ = in_use_;
    peak_event_ = events_.size();
    at_peak_ = current_;
  }
  timeline_.push_back(in_use_);
  return p;
}

void TrackingAllocator::release(void* p) {
  if (!p) return;
  for (size_t i = blocks_.size(); i-- > 0;) {
    Block& b = blocks_[i];
    if (b.ptr != p || !b.live) continue;
    b.live = false;
    std::free(b.ptr);
    in_use_ -= b.bytes;
    current_[static_cast<int>(b.category)] -= b.bytes;
    events_.push_back(-static_cast<int64_t>(i) - 1);
    timeline_.push_back(in_use_);
    return;
  }
  throw std::logic_error("tracking allocator: release of memory it does not own");
}

void TrackingAllocator::rename(void* p, std::string name) {
  for (size_t i = blocks_.size(); i-- > 0;)
    if (blocks_[i].ptr == p && blocks_[i].live) {
      blocks_[i].name = std::move(name);
      return;
    }
}

std::vector<LiveAllocation> TrackingAllocator::live_at_peak() const {
  std::vector<bool> live(blocks_.size(), false);
  for (size_t e = 0; e < peak_event_; ++e) {
    int64_t v = events_[e];
    if (v >= 0)
      live[v] = true;
    else
      live[-v - 1] = false;
  }
  std::vector<LiveAllocation> out;
  for (size_t i = 0; i < blocks_.size(); ++i)
    if (live[i]) out.push_back({blocks_[i].name, blocks_[i].bytes, blocks_[i].category});
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
  return out;
}

size_t TrackingAllocator::live_count() const {
  return static_cast<size_t>(
      std::count_if(blocks_.begin(), blocks_.end(), [](const Block& b) { return b.live; }));
}

}  // namespace np::exec
