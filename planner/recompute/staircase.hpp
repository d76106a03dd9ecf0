// A staircase of points (m ascending, v descending) that no other point beats on both: the
// 2-D Pareto filter the solver and the frontier share.
#pragma once
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <utility>
#include <vector>

namespace np {

template <typename V>
class Staircase {
 public:
  // False when some step has no larger m and no larger v than (m, v); else the point goes in and
  // the steps it beats go out.
  bool admits(int64_t m, V v) {
    auto by_m = [](const auto& x, const auto& y) { return x.first < y.first; };
    auto it = std::upper_bound(steps_.begin(), steps_.end(), std::pair{m, v}, by_m);
    if (it != steps_.begin() && std::prev(it)->second <= v) return false;
    auto lo = std::lower_bound(steps_.begin(), steps_.end(), std::pair{m, v}, by_m);
    auto hi = lo;
    while (hi != steps_.end() && hi->second >= v) ++hi;
    steps_.insert(steps_.erase(lo, hi), {m, v});
    return true;
  }
  void clear() { steps_.clear(); }
  const std::vector<std::pair<int64_t, V>>& steps() const { return steps_; }

 private:
  std::vector<std::pair<int64_t, V>> steps_;
};

}  // namespace np
