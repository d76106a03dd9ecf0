// Pareto dynamic programme over the layers of a stage, last layer first. A state is (Q, E, cost):
// Q the kept bytes of the layers chosen so far (the suffix), E the transient term so far. Adding
// layer l with option o gives E' = max(E, w_o - k_o - Q), Q' = Q + k_o. Smaller Q, E and cost
// are each better for every completion (f >= 1), so dominated states are dropped, and states
// with base + f Q + E over budget are dropped too (Q and E never decrease).
#include "planner/solve.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace np {

int64_t model_peak(const StageProblem& p, const std::vector<int>& choice) {
  int64_t K = 0, q = 0, e = p.extra;
  for (size_t l = 0; l < p.layers.size(); ++l) K += p.layers[l][choice[l]].kept;
  for (size_t i = p.layers.size(); i-- > 0;) {
    const StageOption& o = p.layers[i][choice[i]];
    e = std::max(e, o.working - o.kept - q);
    q += o.kept;
  }
  return p.base + p.in_flight * K + e;
}

namespace {

struct State {
  int64_t q, e;
  double cost;
  int parent, option;
};

// Keeps the states no other state beats on all of (q, e, cost).
std::vector<State> prune(std::vector<State> s) {
  std::sort(s.begin(), s.end(), [](const State& a, const State& b) {
    if (a.q != b.q) return a.q < b.q;
    if (a.e != b.e) return a.e < b.e;
    return a.cost < b.cost;
  });
  std::vector<State> out;
  std::map<int64_t, double> stair;  // e -> cost, e ascending, cost strictly descending
  for (const State& st : s) {
    auto it = stair.upper_bound(st.e);
    if (it != stair.begin() && std::prev(it)->second <= st.cost) continue;
    out.push_back(st);
    auto lo = stair.lower_bound(st.e);
    while (lo != stair.end() && lo->second >= st.cost) lo = stair.erase(lo);
    stair[st.e] = st.cost;
  }
  return out;
}

}  // namespace

namespace {

// Branch-and-bound data for stages whose layers all share one option list (the usual case): the
// lower convex envelope of cost against kept bytes gives, by LP relaxation, a lower bound on the
// cost of the remaining layers given the kept bytes they may still use; an all-same choice gives
// an upper bound on the optimum. Both only discard states that cannot lead to a better optimum.
struct Bounds {
  bool uniform = false;
  std::vector<std::pair<double, double>> hull;  // (kept, cost), kept ascending, cost descending
  double upper = std::numeric_limits<double>::infinity();
  std::vector<int> best_choice;  // a choice reaching `upper`

  // Least cost of r layers keeping at most `cap` bytes together (LP relaxation).
  double lower(size_t r, double cap) const {
    if (!uniform || r == 0) return 0;
    double x = cap / static_cast<double>(r);
    if (x < hull.front().first) return std::numeric_limits<double>::infinity();
    if (x >= hull.back().first) return static_cast<double>(r) * hull.back().second;
    size_t i = 1;
    while (hull[i].first < x) ++i;
    auto [x0, y0] = hull[i - 1];
    auto [x1, y1] = hull[i];
    double y = y0 + (y1 - y0) * (x - x0) / (x1 - x0);
    return static_cast<double>(r) * y * (1 - 1e-12);  // a hair under, against rounding
  }
};

Bounds bounds(const StageProblem& p) {
  Bounds b;
  if (p.layers.empty()) return b;
  const auto& first = p.layers.front();
  for (const auto& l : p.layers)
    if (l.size() != first.size() || !std::equal(l.begin(), l.end(), first.begin(),
                                                [](const StageOption& a, const StageOption& c) {
                                                  return a.kept == c.kept &&
                                                         a.working == c.working && a.cost == c.cost;
                                                }))
      return b;
  b.uniform = true;
  std::vector<int> order(first.size());
  for (size_t o = 0; o < order.size(); ++o) order[o] = static_cast<int>(o);
  std::sort(order.begin(), order.end(), [&](int a, int c) {
    return first[a].kept != first[c].kept ? first[a].kept < first[c].kept
                                          : first[a].cost < first[c].cost;
  });
  std::vector<int> vertex;  // option index of each hull point
  for (int o : order) {     // lower convex envelope, keeping only points whose cost falls with kept
    std::pair<double, double> pt{static_cast<double>(first[o].kept), first[o].cost};
    if (!b.hull.empty() && pt.second >= b.hull.back().second) continue;
    while (b.hull.size() >= 2) {
      auto [x0, y0] = b.hull[b.hull.size() - 2];
      auto [x1, y1] = b.hull.back();
      if ((y1 - y0) * (pt.first - x0) >= (pt.second - y0) * (x1 - x0))
        b.hull.pop_back(), vertex.pop_back();
      else
        break;
    }
    b.hull.push_back(pt);
    vertex.push_back(o);
  }
  // Upper bound: mixes of two options (the LP optimum mixes two adjacent hull vertices), each
  // arranged with the larger transient first, which is the best order for a given mix.
  const size_t L = p.layers.size();
  auto try_mix = [&](int a, int c) {
    std::vector<int> choice(L);
    for (size_t n = 0; n <= L; ++n) {  // n layers of c, the rest of a
      for (size_t l = 0; l < L; ++l) choice[l] = l < n ? c : a;
      if (first[c].working - first[c].kept < first[a].working - first[a].kept)
        std::reverse(choice.begin(), choice.end());
      if (model_peak(p, choice) <= p.budget) {
        double cost =
            static_cast<double>(L - n) * first[a].cost + static_cast<double>(n) * first[c].cost;
        if (cost < b.upper) b.upper = cost, b.best_choice = choice;
        return;
      }
    }
  };
  for (size_t o = 0; o < first.size(); ++o) try_mix(static_cast<int>(o), static_cast<int>(o));
  for (size_t i = 0; i + 1 < vertex.size(); ++i) try_mix(vertex[i + 1], vertex[i]);
  // Tighten the upper bound by local search from the best mix: move one layer to any cheaper
  // option while the choice stays within budget (first improvement, layers last to first).
  if (b.best_choice.empty()) return b;
  std::vector<int> choice = b.best_choice;
  double cost = b.upper;
  for (bool improved = true; improved;) {
    improved = false;
    for (size_t l = L; l-- > 0;)
      for (size_t o = 0; o < first.size(); ++o) {
        double delta = first[o].cost - first[choice[l]].cost;
        if (delta >= 0) continue;
        int old = choice[l];
        choice[l] = static_cast<int>(o);
        if (model_peak(p, choice) <= p.budget) {
          cost += delta;
          improved = true;
        } else {
          choice[l] = old;
        }
      }
  }
  cost = 0;  // summed afresh, in layer order, so the bound is a cost some choice really has
  for (int o : choice) cost += first[o].cost;
  b.upper = std::min(b.upper, cost);
  return b;
}

}  // namespace

namespace {

// The programme with states pruned by `upper`: exact whenever the optimum costs at most `upper`
// (the optimal path's partial costs plus their lower bounds never exceed it); infeasible otherwise.
StageSolution solve_bounded(const StageProblem& p, const Bounds& bnd, double upper) {
  const size_t L = p.layers.size();
  std::vector<std::vector<State>> levels;
  levels.push_back({{0, p.extra, 0.0, -1, -1}});
  for (size_t step = 0; step < L; ++step) {
    size_t l = L - 1 - step, remaining = L - 1 - step;
    std::vector<State> next;
    const std::vector<State>& cur = levels.back();
    for (size_t s = 0; s < cur.size(); ++s)
      for (size_t o = 0; o < p.layers[l].size(); ++o) {
        const StageOption& opt = p.layers[l][o];
        State n{cur[s].q + opt.kept, std::max(cur[s].e, opt.working - opt.kept - cur[s].q),
                cur[s].cost + opt.cost, static_cast<int>(s), static_cast<int>(o)};
        if (p.base + p.in_flight * n.q + n.e > p.budget) continue;
        if (bnd.uniform) {
          double cap =
              static_cast<double>(p.budget - p.base - n.e) / static_cast<double>(p.in_flight) -
              static_cast<double>(n.q);
          if (n.cost + bnd.lower(remaining, cap) > upper * (1 + 1e-12)) continue;
        }
        next.push_back(n);
      }
    if (next.empty()) return {};
    levels.push_back(prune(std::move(next)));
  }
  const std::vector<State>& last = levels.back();
  int best = 0;
  for (size_t i = 1; i < last.size(); ++i)
    if (last[i].cost < last[best].cost) best = static_cast<int>(i);
  StageSolution sol{true, last[best].cost, std::vector<int>(L), 0};
  int idx = best;
  for (size_t step = L; step-- > 0;) {
    const State& st = levels[step + 1][idx];
    sol.choice[L - 1 - step] = st.option;
    idx = st.parent;
  }
  sol.peak = model_peak(p, sol.choice);
  return sol;
}

}  // namespace

StageSolution solve_stage(const StageProblem& p) {
  Bounds bnd = bounds(p);
  // With many options, the same programme over the convex-hull vertices alone (a handful) gives a
  // real choice whose cost is usually within a hair of the optimum: a much tighter upper bound.
  if (bnd.uniform && p.layers.front().size() > 8 && bnd.hull.size() < p.layers.front().size()) {
    StageProblem hull_only = p;
    std::vector<StageOption> opts;
    for (const StageOption& o : p.layers.front())
      for (auto [k, c] : bnd.hull)
        if (static_cast<double>(o.kept) == k && o.cost == c) {
          opts.push_back(o);
          break;
        }
    hull_only.layers.assign(p.layers.size(), opts);
    StageSolution h = solve_stage(hull_only);
    if (h.feasible) return solve_bounded(p, bnd, std::min(bnd.upper, h.cost));  // already tight
  }
  if (!bnd.uniform || !std::isfinite(bnd.upper)) return solve_bounded(p, bnd, bnd.upper);
  // Between the LP lower bound of the whole stage and the heuristic upper bound, try tight upper
  // bounds first: a search bounded by u finds the optimum whenever it costs at most u, and it
  // prunes far more than one bounded by a loose u.
  double cap = static_cast<double>(p.budget - p.base - p.extra) / static_cast<double>(p.in_flight);
  double lo = bnd.lower(p.layers.size(), cap);
  if (!std::isfinite(lo)) return solve_bounded(p, bnd, bnd.upper);
  for (double f : {1.0 / 256, 1.0 / 32, 1.0 / 4}) {
    StageSolution s = solve_bounded(p, bnd, lo + f * (bnd.upper - lo));
    if (s.feasible) return s;
  }
  return solve_bounded(p, bnd, bnd.upper);
}

StageSolution brute_force_stage(const StageProblem& p) {
  const size_t L = p.layers.size();
  std::vector<int> c(L, 0);
  StageSolution best;
  while (true) {
    int64_t peak = model_peak(p, c);
    double cost = 0;
    for (size_t l = 0; l < L; ++l) cost += p.layers[l][c[l]].cost;
    if (peak <= p.budget && (!best.feasible || cost < best.cost)) best = {true, cost, c, peak};
    size_t l = 0;
    while (l < L && ++c[l] == static_cast<int>(p.layers[l].size())) c[l++] = 0;
    if (l == L) break;
  }
  return best;
}

StageSolution min_peak_solution(const StageProblem& p) {
  // The same programme with every cost zero and no budget: only (Q, E) matter, and the answer is
  // the surviving state with the least base + f Q + E.
  StageProblem q = p;
  q.budget = std::numeric_limits<int64_t>::max() / 4;
  for (auto& layer : q.layers)
    for (auto& o : layer) o.cost = 0;
  const size_t L = q.layers.size();
  std::vector<std::vector<State>> levels;
  levels.push_back({{0, q.extra, 0.0, -1, -1}});
  for (size_t step = 0; step < L; ++step) {
    size_t l = L - 1 - step;
    std::vector<State> next;
    const std::vector<State>& cur = levels.back();
    for (size_t s = 0; s < cur.size(); ++s)
      for (size_t o = 0; o < q.layers[l].size(); ++o) {
        const StageOption& opt = q.layers[l][o];
        next.push_back({cur[s].q + opt.kept, std::max(cur[s].e, opt.working - opt.kept - cur[s].q),
                        0.0, static_cast<int>(s), static_cast<int>(o)});
      }
    levels.push_back(prune(std::move(next)));
  }
  const std::vector<State>& last = levels.back();
  int best = 0;
  for (size_t i = 1; i < last.size(); ++i)
    if (q.in_flight * last[i].q + last[i].e < q.in_flight * last[best].q + last[best].e)
      best = static_cast<int>(i);
  StageSolution sol{true, 0, std::vector<int>(L), 0};
  for (size_t step = L, idx = best; step-- > 0;) {
    const State& st = levels[step + 1][idx];
    sol.choice[L - 1 - step] = st.option;
    idx = st.parent;
  }
  for (size_t l = 0; l < L; ++l) sol.cost += p.layers[l][sol.choice[l]].cost;
  sol.peak = model_peak(p, sol.choice);
  sol.feasible = sol.peak <= p.budget;
  return sol;
}

int64_t min_stage_peak(const StageProblem& p) {
  return min_peak_solution(p).peak;
}

}  // namespace np
