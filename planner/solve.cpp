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
#include <optional>

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

StageSolution solve_stage_programme(const StageProblem& p) {
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
    StageSolution h = solve_stage_programme(hull_only);
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

namespace {

// Whether every layer of the stage has the same option list.
bool uniform(const StageProblem& p) {
  if (p.layers.empty() || p.layers.front().empty()) return false;
  const auto& first = p.layers.front();
  for (const auto& l : p.layers)
    if (l.size() != first.size() || !std::equal(l.begin(), l.end(), first.begin(),
                                                [](const StageOption& a, const StageOption& c) {
                                                  return a.kept == c.kept &&
                                                         a.working == c.working && a.cost == c.cost;
                                                }))
      return false;
  return true;
}

// Least LP cost of r layers of a convex envelope (kept ascending, cost strictly descending) that
// keep at most `cap` bytes together; infinity when even the smallest kept bytes do not fit.
double envelope_lower(const std::vector<std::pair<double, double>>& hull, size_t r, double cap) {
  if (r == 0) return 0;
  if (hull.empty()) return std::numeric_limits<double>::infinity();
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

// The lower convex envelope of (kept, cost) over `opts`, keeping only points whose cost falls as
// kept grows (an option with more kept bytes and no less cost never helps the LP).
std::vector<std::pair<double, double>> envelope(std::vector<StageOption> opts) {
  std::sort(opts.begin(), opts.end(), [](const StageOption& a, const StageOption& c) {
    return a.kept != c.kept ? a.kept < c.kept : a.cost < c.cost;
  });
  std::vector<std::pair<double, double>> hull;
  for (const StageOption& o : opts) {
    std::pair<double, double> pt{static_cast<double>(o.kept), o.cost};
    if (!hull.empty() && pt.second >= hull.back().second) continue;
    while (hull.size() >= 2) {
      auto [x0, y0] = hull[hull.size() - 2];
      auto [x1, y1] = hull.back();
      if ((y1 - y0) * (pt.first - x0) >= (pt.second - y0) * (x1 - x0))
        hull.pop_back();
      else
        break;
    }
    hull.push_back(pt);
  }
  return hull;
}

// Stages whose layers share one option list, with one micro-batch in flight (f = 1: pp = 1, or
// the last stage under 1F1B).
//
// Order. For a given multiset of options, the arrangement with the larger transient d = w - k
// first (forward order) minimises the peak: swapping adjacent layers a, b with d_a >= d_b into
// that order never raises max(w_a - k_a - Q_a, w_b - k_b - Q_b), and f K does not depend on the
// order. So only the counts matter, and the options form groups in that order.
//
// With f = 1 the peak is base + max(K + extra, max over layers l of (P_l + w_l)), P_l the kept
// bytes of the layers before l, so a group's constraint depends on the kept bytes before it
// only. The programme runs over the groups; its states are (layers placed j, kept bytes P, cost),
// and for each j the states no other beats on both P and cost form a staircase. Copies of a group
// are added one at a time, j ascending, so a state may take any number of them.
class OneInFlight {
 public:
  explicit OneInFlight(const StageProblem& p) : p_(p), L_(static_cast<int64_t>(p.layers.size())) {
    const std::vector<StageOption>& opts = p.layers.front();
    order_.resize(opts.size());
    for (size_t o = 0; o < opts.size(); ++o) order_[o] = static_cast<int>(o);
    std::stable_sort(order_.begin(), order_.end(), [&](int a, int c) {
      return opts[a].working - opts[a].kept > opts[c].working - opts[c].kept;
    });
    for (int o : order_) opt_.push_back(opts[o]);
    suffix_hull_.resize(opt_.size() + 1);
    suffix_last_.resize(opt_.size() + 1);
    for (size_t g = opt_.size(); g-- > 0;) {
      suffix_hull_[g] = envelope({opt_.begin() + static_cast<std::ptrdiff_t>(g), opt_.end()});
      // (working, cost) of the options from g on that no other beats on both, working ascending.
      std::vector<std::pair<int64_t, double>> wc = suffix_last_[g + 1];
      wc.push_back({opt_[g].working, opt_[g].cost});
      std::sort(wc.begin(), wc.end());
      suffix_last_[g].clear();
      for (auto x : wc)
        if (suffix_last_[g].empty() || x.second < suffix_last_[g].back().second)
          suffix_last_[g].push_back(x);
    }
  }

  // `hint`: a feasible choice of this stage known in advance (a tighter bound than the seed's).
  StageSolution solve(const StageSolution* hint = nullptr) {
    seed();
    if (hint && hint->feasible && (!best_.feasible || hint->cost < best_.cost)) {
      best_ = *hint;
      upper_ = hint->cost;
    }
    const int64_t room = p_.budget - p_.base, cap = room - p_.extra;  // P + w <= room, K <= cap
    if (cap < 0) return {};
    std::vector<std::vector<State>> stair(L_ + 1);
    stair[0].push_back({0, 0.0, -1});
    std::vector<State> shifted, merged;
    for (size_t g = 0; g < opt_.size(); ++g) {
      const StageOption& o = opt_[g];
      for (int64_t j = 0; j < L_; ++j) {
        const size_t rest = static_cast<size_t>(L_ - j - 1);  // layers after this copy
        shifted.clear();
        for (const State& s : stair[j]) {
          int64_t P = s.p + o.kept;
          if (s.p + o.working > room || P > cap) break;  // P ascending: the rest fail too
          double cost = s.cost + o.cost;
          if (cost + lower(g, rest, P, room, cap) > upper_ * (1 + 1e-12)) continue;
          shifted.push_back({P, cost, s.node});
        }
        if (shifted.empty()) continue;
        for (State& s : shifted) {  // the new copy: a node naming its group and its parent
          nodes_.push_back({s.node, static_cast<int>(g)});
          s.node = static_cast<int>(nodes_.size()) - 1;
        }
        merged.clear();
        std::merge(stair[j + 1].begin(), stair[j + 1].end(), shifted.begin(), shifted.end(),
                   std::back_inserter(merged), [](const State& x, const State& y) {
                     return x.p != y.p ? x.p < y.p : x.cost < y.cost;
                   });
        stair[j + 1].clear();
        for (const State& s : merged)
          if (stair[j + 1].empty() || s.cost < stair[j + 1].back().cost) stair[j + 1].push_back(s);
      }
    }
    StageSolution sol;
    if (stair[L_].empty()) return best_;  // the seed, when nothing cheaper exists
    const State* best = &stair[L_].front();
    for (const State& s : stair[L_])
      if (s.cost < best->cost) best = &s;
    std::vector<int64_t> count(opt_.size(), 0);
    for (int n = best->node; n >= 0; n = nodes_[n].parent) ++count[nodes_[n].group];
    sol = expand(count);
    return sol.cost <= best_.cost || !best_.feasible ? sol : best_;
  }

 private:
  struct State {
    int64_t p;
    double cost;
    int node;  // the last copy added, -1 for none
  };
  struct Node {
    int parent, group;
  };

  // A lower bound on the cost of `rest` more layers on groups g and later after kept bytes P: the
  // LP relaxation with their kept bytes within cap - P; and, for each option the last of them
  // may take (working w, cost c), c plus the LP of the others within room - P - w, since the last
  // layer runs with all the others' kept bytes alive (the least over those options).
  double lower(size_t g, size_t rest, int64_t P, int64_t room, int64_t cap) const {
    if (rest == 0) return 0;
    double all = envelope_lower(suffix_hull_[g], rest, static_cast<double>(cap - P));
    double last = std::numeric_limits<double>::infinity();
    for (auto [w, c] : suffix_last_[g]) {
      last = std::min(
          last, c + envelope_lower(suffix_hull_[g], rest - 1, static_cast<double>(room - P - w)));
      if (last <= all) return all;
    }
    return std::max(all, last);
  }

  // The model peak of counts in group order (f = 1), without expanding them.
  int64_t peak(const std::vector<int64_t>& count) const {
    int64_t P = 0, top = 0;
    for (size_t g = 0; g < opt_.size(); ++g)
      if (count[g] > 0) {
        P += count[g] * opt_[g].kept;
        top = std::max(top, P + opt_[g].working - opt_[g].kept);  // its last layer
      }
    return p_.base + std::max(P + p_.extra, top);
  }

  // The layers in forward order, and their cost summed in that order.
  StageSolution expand(const std::vector<int64_t>& count) const {
    StageSolution sol;
    sol.feasible = true;
    for (size_t g = 0; g < opt_.size(); ++g)
      for (int64_t i = 0; i < count[g]; ++i) sol.choice.push_back(order_[g]);
    for (int o : sol.choice) sol.cost += p_.layers.front()[o].cost;
    sol.peak = model_peak(p_, sol.choice);
    return sol;
  }

  // Upper bound to start from: each option alone, and each mix of two vertices of the convex
  // envelope with the fewest layers on the dearer one that still fits.
  void seed() {
    const size_t m = opt_.size();
    auto offer = [&](const std::vector<int64_t>& count) {
      if (peak(count) > p_.budget) return;
      StageSolution s = expand(count);
      if (s.peak <= p_.budget && (!best_.feasible || s.cost < best_.cost)) best_ = s;
    };
    std::vector<size_t> vertex;
    for (size_t g = 0; g < m; ++g) {
      std::vector<int64_t> count(m, 0);
      count[g] = L_;
      offer(count);
      for (auto [k, c] : suffix_hull_[0])
        if (static_cast<double>(opt_[g].kept) == k && opt_[g].cost == c) vertex.push_back(g);
    }
    for (size_t a : vertex)
      for (size_t c : vertex) {
        if (opt_[c].cost <= opt_[a].cost) continue;  // a the cheaper, c the dearer
        for (int64_t n = 1; n < L_; ++n) {           // n layers of c, the rest of a
          std::vector<int64_t> count(m, 0);
          count[a] = L_ - n, count[c] = n;
          if (peak(count) > p_.budget) continue;
          offer(count);
          break;
        }
      }
    if (best_.feasible) upper_ = best_.cost;
  }

  const StageProblem& p_;
  const int64_t L_;
  std::vector<int> order_;                                           // option index of each group
  std::vector<StageOption> opt_;                                     // the options in group order
  std::vector<std::vector<std::pair<double, double>>> suffix_hull_;  // envelope of groups g..
  std::vector<std::vector<std::pair<int64_t, double>>> suffix_last_;
  std::vector<Node> nodes_;
  StageSolution best_;  // the seed
  double upper_ = std::numeric_limits<double>::infinity();
};

}  // namespace

StageSolution solve_stage(const StageProblem& p) {
  if (p.in_flight == 1 && uniform(p)) {
    // With many options, the vertices of the (kept, cost) envelope alone give a choice whose cost
    // is usually within a hair of the optimum: a tight bound for the search over all options.
    const std::vector<StageOption>& all = p.layers.front();
    std::vector<std::pair<double, double>> hull = envelope(all);
    if (all.size() <= 8 || hull.size() >= all.size()) return OneInFlight(p).solve();
    StageProblem few = p;
    std::vector<int> index;  // option of `p` behind each option of `few`
    few.layers.front().clear();
    for (size_t o = 0; o < all.size(); ++o)
      if (std::find(hull.begin(), hull.end(),
                    std::pair{static_cast<double>(all[o].kept), all[o].cost}) != hull.end() &&
          std::find_if(few.layers.front().begin(), few.layers.front().end(),
                       [&](const StageOption& x) {
                         return x.kept == all[o].kept && x.cost == all[o].cost;
                       }) == few.layers.front().end()) {
        few.layers.front().push_back(all[o]);
        index.push_back(static_cast<int>(o));
      }
    few.layers.assign(p.layers.size(), few.layers.front());
    StageSolution hint = OneInFlight(few).solve();
    for (int& c : hint.choice) c = index[c];
    return OneInFlight(p).solve(&hint);
  }
  return solve_stage_programme(p);
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
