// A staircase of points (m ascending, v descending) that no other point beats on both: the
// 2-D Pareto filter the solver and the frontier share.
#pragma once
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <utility>
#include <vector>

namespace np {

// False when some step has no larger m and no larger v than (m, v); else the point goes in and
// the steps it beats go out.
template <typename V>
bool stair_admits(std::vector<std::pair<int64_t, V>>& stair, int64_t m, V v) {
  auto by_m = [](const auto& x, const auto& y) { return x.first < y.first; };
  auto it = std::upper_bound(stair.begin(), stair.end(), std::pair{m, v}, by_m);
  if (it != stair.begin() && std::prev(it)->second <= v) return false;
  auto lo = std::lower_bound(stair.begin(), stair.end(), std::pair{m, v}, by_m);
  auto hi = lo;
  while (hi != stair.end() && hi->second >= v) ++hi;
  stair.insert(stair.erase(lo, hi), {m, v});
  return true;
}

}  // namespace np
