// The per-rank tracking allocator: every device-model byte of a run goes through it. It records
// the high-water mark, the bytes by category at that moment, the named live set at the peak and a
// timeline, and can refuse to go past a budget.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "planner/schedule.hpp"

namespace np::exec {

// Thrown when an allocation would exceed the enforced budget.
struct OutOfBudget : std::runtime_error {
  OutOfBudget(std::string tensor, int64_t bytes, int64_t in_use, int64_t budget);
  std::string tensor;
  int64_t bytes, in_use, budget;
};

struct LiveAllocation {
  std::string name;
  int64_t bytes = 0;
  Category category = Category::kTransient;
};

class TrackingAllocator {
 public:
  explicit TrackingAllocator(std::optional<int64_t> budget = std::nullopt) : budget_(budget) {}
  ~TrackingAllocator();
  TrackingAllocator(const TrackingAllocator&) = delete;
  TrackingAllocator& operator=(const TrackingAllocator&) = delete;

  // Returns 64-byte aligned memory filled with 0xFF bytes (NaN for floats), so that an element no
  // kernel wrote shows up. Throws OutOfBudget.
  void* allocate(int64_t bytes, std::string name, Category category);
  void release(void* p);
  void rename(void* p, std::string name);  // names a live allocation once its role is known

  int64_t in_use() const { return in_use_; }
  int64_t peak() const { return peak_; }
  const std::array<int64_t, kCategories>& at_peak() const { return at_peak_; }
  std::vector<LiveAllocation> live_at_peak() const;                   // largest first
  const std::vector<int64_t>& timeline() const { return timeline_; }  // bytes after each event
  size_t live_count() const;

 private:
  struct Block {
    void* ptr;
    int64_t bytes;
    std::string name;
    Category category;
    bool live;
  };
  std::optional<int64_t> budget_;
  std::vector<Block> blocks_;    // every allocation ever made, in order
  std::vector<int64_t> events_;  // +index: allocation, -(index+1): release
  int64_t in_use_ = 0, peak_ = 0;
  size_t peak_event_ = 0;  // events_ prefix length at the peak
  std::array<int64_t, kCategories> current_{}, at_peak_{};
  std::vector<int64_t> timeline_;
};

}  // namespace np::exec
