// The stage solver. Two exact methods: the general one, for any stage, below; and the programme
// over option groups for stages whose layers share one option list (GroupProgramme, further
// down), which solve_stage uses for those.
//
// Pareto dynamic programme over the layers of a stage, last layer first. A state is (Q, E, cost):
// Q the kept bytes of the layers chosen so far (the suffix), E the transient term so far. Adding
// layer l with option o gives E' = max(E, w_o - k_o - Q), Q' = Q + k_o. Smaller Q, E and cost
// are each better for every completion (f >= 1), so dominated states are dropped, and states
// with base + f Q + E over budget are dropped too (Q and E never decrease).
#include "planner/recompute/solve.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>

#include "planner/recompute/staircase.hpp"

namespace np {

std::pair<int64_t, int64_t> layer_terms(const std::vector<std::vector<StageOption>>& layers,
                                        const std::vector<int>& choice, int64_t extra) {
  int64_t q = 0, e = extra;
  for (size_t i = layers.size(); i-- > 0;) {
    const StageOption& o = layers[i][choice[i]];
    e = std::max(e, o.working - o.kept - q);
    q += o.kept;
  }
  return {q, e};
}

int64_t model_peak(const StageProblem& p, const std::vector<int>& choice) {
  auto [K, e] = layer_terms(p.layers, choice, p.extra);
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
  Staircase<double> stair;  // e ascending, cost descending
  for (const State& st : s)
    if (stair.admits(st.e, st.cost)) out.push_back(st);
  return out;
}

// The programme's levels, last layer first: levels[i] holds the states after i layers that no
// other beats and that stay within the budget; empty when some level has none.
std::vector<std::vector<State>> layer_levels(const StageProblem& p) {
  const size_t L = p.layers.size();
  std::vector<std::vector<State>> levels;
  levels.push_back({{0, p.extra, 0.0, -1, -1}});
  for (size_t step = 0; step < L; ++step) {
    size_t l = L - 1 - step;
    std::vector<State> next;
    const std::vector<State>& cur = levels.back();
    for (size_t s = 0; s < cur.size(); ++s)
      for (size_t o = 0; o < p.layers[l].size(); ++o) {
        const StageOption& opt = p.layers[l][o];
        State n{cur[s].q + opt.kept, std::max(cur[s].e, opt.working - opt.kept - cur[s].q),
                cur[s].cost + opt.cost, static_cast<int>(s), static_cast<int>(o)};
        if (p.base + p.in_flight * n.q + n.e > p.budget) continue;
        next.push_back(n);
      }
    if (next.empty()) return {};
    levels.push_back(prune(std::move(next)));
  }
  return levels;
}

// The choice (option per layer, forward order) behind state `best` of the last level.
std::vector<int> choice_of(const std::vector<std::vector<State>>& levels, int best) {
  const size_t L = levels.size() - 1;
  std::vector<int> choice(L);
  for (size_t step = L; step-- > 0;) {
    const State& st = levels[step + 1][best];
    choice[L - 1 - step] = st.option;
    best = st.parent;
  }
  return choice;
}

}  // namespace

namespace {

bool uniform(const StageProblem& p);

// Keeps the choices no other beats on (kept, kept + transient, cost): the transient term enters
// every peak with the kept bytes of its own chunk's pass (f K + E = (f - 1) K + (K + E), f >= 1),
// so that order is the one every step's sum grows with.
std::vector<ParetoChoice> keep_least(std::vector<ParetoChoice> in) {
  std::sort(in.begin(), in.end(), [](const ParetoChoice& a, const ParetoChoice& b) {
    int64_t ma = a.kept + a.transient, mb = b.kept + b.transient;
    return std::tie(a.kept, ma, a.cost) < std::tie(b.kept, mb, b.cost);
  });
  std::vector<ParetoChoice> out;
  Staircase<double> stair;  // kept + transient ascending, cost descending
  for (ParetoChoice& c : in)
    if (stair.admits(c.kept + c.transient, c.cost)) out.push_back(std::move(c));
  return out;
}

// Layers sharing one option list: only how many take each option matters (the order with the
// larger transient first is the best one, see GroupProgramme), so the programme runs over the
// options in that order adding one copy at a time; a state is (layers placed j, kept bytes P,
// M = the largest P_l + w_l so far, cost), and one no other of the same j beats on all of
// (P, M, cost) is kept; a state whose f P + extra or (f - 1) P + M leaves the budget is dropped.
// A chunk's choice then has kept P and transient max(extra, M - P). A state for which `beyond`
// holds is dropped too (a caller's bound: it holds for every state grown from it).
std::vector<ParetoChoice> group_choices(
    const StageProblem& p, const std::function<bool(int64_t, int64_t, double)>& beyond = {}) {
  const std::vector<StageOption>& opts = p.layers.front();
  const int64_t L = static_cast<int64_t>(p.layers.size()), f = p.in_flight,
                room = p.budget - p.base;
  if (L == 1) {  // one layer: its options within the budget, the unbeaten ones
    std::vector<ParetoChoice> out;
    for (size_t o = 0; o < opts.size(); ++o) {
      const StageOption& x = opts[o];
      if (f * x.kept + p.extra > room || (f - 1) * x.kept + x.working > room) continue;
      out.push_back({x.kept, std::max(p.extra, x.working - x.kept), x.cost, {static_cast<int>(o)}});
    }
    return keep_least(std::move(out));
  }
  std::vector<int> order(opts.size());
  for (size_t o = 0; o < opts.size(); ++o) order[o] = static_cast<int>(o);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return opts[a].working - opts[a].kept > opts[b].working - opts[b].kept;
  });
  struct St {
    int64_t P, M;
    double cost;
    int node;
  };
  struct Node {
    int parent, option;
  };
  constexpr int64_t kNone = std::numeric_limits<int64_t>::min() / 4;
  std::vector<Node> nodes;
  std::vector<std::vector<St>> at(L + 1);
  at[0].push_back({0, kNone, 0.0, -1});
  std::vector<St> shifted, merged;
  Staircase<double> stair;  // M ascending, cost descending
  for (int o : order) {
    const StageOption& op = opts[o];
    for (int64_t j = 0; j < L; ++j) {
      shifted.clear();
      for (const St& s : at[j]) {
        St n{s.P + op.kept, std::max(s.M, s.P + op.working), s.cost + op.cost, s.node};
        if (f * n.P + p.extra > room || (f - 1) * n.P + n.M > room) continue;
        if (beyond && beyond(n.P, n.M, n.cost)) continue;
        shifted.push_back(n);
      }
      if (shifted.empty()) continue;
      for (St& s : shifted) {
        nodes.push_back({s.node, o});
        s.node = static_cast<int>(nodes.size()) - 1;
      }
      merged.clear();
      std::merge(at[j + 1].begin(), at[j + 1].end(), shifted.begin(), shifted.end(),
                 std::back_inserter(merged), [](const St& x, const St& y) {
                   return std::tie(x.P, x.M, x.cost) < std::tie(y.P, y.M, y.cost);
                 });
      std::vector<St>& out = at[j + 1];
      out.clear();
      stair.clear();
      for (const St& s : merged)
        if (stair.admits(s.M, s.cost)) out.push_back(s);
    }
  }
  std::vector<ParetoChoice> out;
  for (const St& s : at[L]) {
    ParetoChoice c{s.P, std::max(p.extra, s.M - s.P), 0.0, {}};
    for (int n = s.node; n >= 0; n = nodes[n].parent) c.choice.push_back(nodes[n].option);
    std::reverse(c.choice.begin(), c.choice.end());
    for (int o : c.choice) c.cost += opts[o].cost;  // summed in layer order
    if (p.base + f * c.kept + c.transient <= p.budget) out.push_back(std::move(c));
  }
  return keep_least(std::move(out));
}

bool same_options(const std::vector<StageOption>& a, const std::vector<StageOption>& b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](const StageOption& x, const StageOption& y) {
           return x.kept == y.kept && x.working == y.working && x.cost == y.cost;
         });
}

// The stage's runs of layers with identical options, [first, end) in order.
std::vector<std::pair<size_t, size_t>> option_runs(const StageProblem& p) {
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t l = 0; l < p.layers.size();) {
    size_t end = l + 1;
    while (end < p.layers.size() && same_options(p.layers[end], p.layers[l])) ++end;
    runs.push_back({l, end});
    l = end;
  }
  return runs;
}

// A stage whose layers come in runs of identical options (a mixed model's dense layers, then its
// MoE layers): each run's Pareto choices (group_choices, exact for a run, whose layers may take
// their choices in any order) are the options of one layer of a smaller programme. A run's choice
// of kept P and transient T enters as kept P and working P + T: the programme's transient term
// max(e, T - q) is the run's largest w_l - k_l less the kept bytes after it, as layer by layer.
struct Runs {
  StageProblem q;                                  // one layer per run
  std::vector<std::vector<ParetoChoice>> choices;  // per run: its choices, q's options' order
};

// Empty when no run has two layers (nothing to gain), some run has no choice within the budget,
// or some run is longer than kMaxRun: the group programme makes every Pareto choice of a run,
// which for a long run of many options costs far more than the layer-by-layer programme's
// budget-pruned levels (a stage of one or two dense layers then 46 MoE layers).
constexpr size_t kMaxRun = 4;
std::optional<Runs> runs_of(const StageProblem& p) {
  Runs r;
  r.q = p;
  r.q.layers.clear();
  for (auto [l, end] : option_runs(p)) {
    if (end - l > kMaxRun) return std::nullopt;
    StageProblem run = p;
    run.layers.assign(p.layers.begin() + static_cast<std::ptrdiff_t>(l),
                      p.layers.begin() + static_cast<std::ptrdiff_t>(end));
    r.choices.push_back(run.layers.size() == 1 ? std::vector<ParetoChoice>{} : group_choices(run));
    std::vector<StageOption>& opts = r.q.layers.emplace_back();
    if (run.layers.size() == 1) {  // a lone layer keeps its own options
      opts = run.layers.front();
      for (size_t o = 0; o < opts.size(); ++o)
        r.choices.back().push_back({opts[o].kept, 0, opts[o].cost, {static_cast<int>(o)}});
    } else {
      if (r.choices.back().empty()) return std::nullopt;
      for (const ParetoChoice& c : r.choices.back())
        opts.push_back({c.kept, c.kept + c.transient, c.cost});
    }
  }
  if (r.q.layers.size() == p.layers.size()) return std::nullopt;
  return r;
}

// The per-layer choice behind a choice of the runs' programme.
std::vector<int> expand(const Runs& r, const std::vector<int>& choice) {
  std::vector<int> out;
  for (size_t run = 0; run < choice.size(); ++run) {
    const std::vector<int>& c = r.choices[run][static_cast<size_t>(choice[run])].choice;
    out.insert(out.end(), c.begin(), c.end());
  }
  return out;
}

}  // namespace

std::vector<ParetoChoice> pareto_choices(const StageProblem& p) {
  if (p.layers.empty()) return {{0, p.extra, 0.0, {}}};
  if (uniform(p)) return group_choices(p);
  if (std::optional<Runs> r = runs_of(p)) {
    std::vector<ParetoChoice> out = pareto_choices(r->q);
    for (ParetoChoice& c : out) c.choice = expand(*r, c.choice);
    return out;
  }
  std::vector<std::vector<State>> levels = layer_levels(p);
  if (levels.empty()) return {};
  std::vector<ParetoChoice> out;
  for (size_t i = 0; i < levels.back().size(); ++i) {
    const State& st = levels.back()[i];
    out.push_back({st.q, st.e, st.cost, choice_of(levels, static_cast<int>(i))});
  }
  return keep_least(std::move(out));
}

StageSolution solve_stage_programme(const StageProblem& p) {
  if (std::optional<Runs> r = runs_of(p)) {
    StageSolution sol = solve_stage_programme(r->q);
    if (!sol.feasible) return sol;
    sol.choice = expand(*r, sol.choice);
    sol.peak = model_peak(p, sol.choice);
    return sol;
  }
  if (p.layers.empty()) return {};
  // The programme over the layers after the first; the first layer's step only looks for the
  // cheapest state within the budget, the least (cost, kept, transient), as the full programme's
  // last level would give, without making and pruning that level.
  StageProblem rest = p;
  rest.layers.erase(rest.layers.begin());
  std::vector<std::vector<State>> levels = layer_levels(rest);
  if (levels.empty()) return {};
  const std::vector<State>& last = levels.back();
  const std::vector<StageOption>& first = p.layers.front();
  std::optional<State> best;
  for (size_t st = 0; st < last.size(); ++st)
    for (size_t o = 0; o < first.size(); ++o) {
      State n{last[st].q + first[o].kept,
              std::max(last[st].e, first[o].working - first[o].kept - last[st].q),
              last[st].cost + first[o].cost, static_cast<int>(st), static_cast<int>(o)};
      if (p.base + p.in_flight * n.q + n.e > p.budget) continue;
      if (!best || std::tie(n.cost, n.q, n.e) < std::tie(best->cost, best->q, best->e)) best = n;
    }
  if (!best) return {};
  StageSolution sol{true, best->cost, {best->option}, 0};
  std::vector<int> after = choice_of(levels, best->parent);
  sol.choice.insert(sol.choice.end(), after.begin(), after.end());
  sol.peak = model_peak(p, sol.choice);
  return sol;
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
  if (r == 0) return cap >= 0 ? 0 : std::numeric_limits<double>::infinity();
  if (hull.empty()) return std::numeric_limits<double>::infinity();
  double x = cap / static_cast<double>(r);
  if (x < hull.front().first) return std::numeric_limits<double>::infinity();
  if (x >= hull.back().first) return static_cast<double>(r) * hull.back().second;
  // The first vertex right of x: never the first one, since hull.front().first <= x.
  size_t i = static_cast<size_t>(
      std::upper_bound(hull.begin(), hull.end(), x,
                       [](double v, const std::pair<double, double>& h) { return v < h.first; }) -
      hull.begin());
  auto [x0, y0] = hull[i - 1];
  auto [x1, y1] = hull[i];
  double y = y0 + (y1 - y0) * (x - x0) / (x1 - x0);
  return static_cast<double>(r) * y * (1 - 1e-12);  // a hair under, against rounding
}

// The lower convex envelope of points sorted by (kept, cost), keeping only points whose cost
// falls as kept grows (an option with more kept bytes and no less cost never helps the LP).
std::vector<std::pair<double, double>> lower_chain(const std::vector<std::pair<double, double>>& pts) {
  std::vector<std::pair<double, double>> hull;
  for (const auto& pt : pts) {
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

// The envelope of (kept, cost) over `opts`.
std::vector<std::pair<double, double>> envelope(const std::vector<StageOption>& opts) {
  std::vector<std::pair<double, double>> pts;
  for (const StageOption& o : opts) pts.push_back({static_cast<double>(o.kept), o.cost});
  std::sort(pts.begin(), pts.end());
  return lower_chain(pts);
}

// The envelope of `hull` (an envelope) and one more point: the same as that of all the points
// behind `hull` and it, since a point off a subset's hull is off the whole set's.
std::vector<std::pair<double, double>> envelope_with(std::vector<std::pair<double, double>> hull,
                                                     std::pair<double, double> pt) {
  hull.insert(std::upper_bound(hull.begin(), hull.end(), pt), pt);
  return lower_chain(hull);
}

// Whether an option is a vertex of `hull` (its envelope or a wider one).
bool on_envelope(const std::vector<std::pair<double, double>>& hull, const StageOption& o) {
  return std::find(hull.begin(), hull.end(), std::pair{static_cast<double>(o.kept), o.cost}) !=
         hull.end();
}

// Stages whose layers share one option list (every stage the auto planner builds).
//
// Order. For a given multiset of options, the arrangement with the larger transient d = w - k
// first (forward order) minimises the peak: swapping adjacent layers a, b with d_a >= d_b into
// that order never raises max(w_a - k_a - Q_a, w_b - k_b - Q_b), and f K does not depend on the
// order. So only the counts matter, and the options form groups in that order.
//
// In that order the peak is base + max(f K + extra, (f - 1) K + M), where M is the largest
// P_l + w_l over the layers, P_l the kept bytes of the layers before l (the layer runs its
// backward with f - 1 whole micro-batches and its predecessors' kept bytes alive). The programme
// runs over the groups; its states are (layers placed j, kept bytes P, M, cost), and smaller P,
// M and cost are each better for every completion. Copies of a group are added one at a time, j
// ascending, so a state may take any number of them. With f = 1, M only has to stay within the
// room, which is checked as each copy is added, so the states are (j, P, cost) and the states of
// each j form a staircase.
// The group programme's tables over one option list: they depend on the options and f only, and
// on the options' working bytes only up to a common shift (the solve shifts its bounds instead),
// so one set serves every stage, bound and round with those options (RunTablesCache).
struct GroupTables {
  GroupTables(const std::vector<StageOption>& opts, int64_t f) {
    order.resize(opts.size());
    for (size_t o = 0; o < opts.size(); ++o) order[o] = static_cast<int>(o);
    std::stable_sort(order.begin(), order.end(), [&](int a, int c) {
      return opts[a].working - opts[a].kept > opts[c].working - opts[c].kept;
    });
    for (int o : order) opt.push_back(opts[o]);
    suffix_hull.resize(opt.size() + 1);
    suffix_last.resize(opt.size() + 1);
    // Each suffix's envelope and staircase from the next suffix's and the one option added (the
    // lower hull of a set is that of its subset's hull and the rest), not from all its options.
    // (w + (f - 1) k, cost) of the options from g on that no other beats on both: the bound
    // below tries each; with many, runs of neighbours are merged into their least key and least
    // cost (key ascending, cost descending: first key, last cost), which bounds each from below.
    Staircase<double> last;
    for (size_t g = opt.size(); g-- > 0;) {
      suffix_hull[g] =
          envelope_with(suffix_hull[g + 1], {static_cast<double>(opt[g].kept), opt[g].cost});
      last.admits(opt[g].working + (f - 1) * opt[g].kept, opt[g].cost);
      const auto& steps = last.steps();
      constexpr size_t kMost = 16;
      if (steps.size() <= kMost) {
        suffix_last[g] = steps;
        continue;
      }
      for (size_t i = 0; i < kMost; ++i) {
        size_t lo = i * steps.size() / kMost, hi = (i + 1) * steps.size() / kMost;
        suffix_last[g].push_back({steps[lo].first, steps[hi - 1].second});
      }
    }
    for (size_t g = 0; g < opt.size(); ++g) {
      if (on_envelope(suffix_hull[0], opt[g])) vertex.push_back(g);
      least_kept = std::min(least_kept, opt[g].kept);
    }
  }
  std::vector<int> order;                                            // option index of each group
  std::vector<StageOption> opt;                                      // the options in group order
  std::vector<std::vector<std::pair<double, double>>> suffix_hull;   // envelope of groups g..
  std::vector<std::vector<std::pair<int64_t, double>>> suffix_last;  // (w + (f-1) k, cost)
  std::vector<size_t> vertex;  // the groups on the whole envelope
  int64_t least_kept = std::numeric_limits<int64_t>::max();  // over all options
};

class GroupProgramme {
 public:
  // `t`: the tables of p's options, made with every working byte count `shift` less.
  GroupProgramme(const StageProblem& p, const GroupTables& t, int64_t shift)
      : p_(p), L_(static_cast<int64_t>(p.layers.size())), f_(p.in_flight), shift_(shift),
        order_(t.order), opt_(t.opt), suffix_hull_(t.suffix_hull), suffix_last_(t.suffix_last),
        vertex_(t.vertex), least_kept_(t.least_kept) {}

  static constexpr int64_t kNone = std::numeric_limits<int64_t>::min() / 4;  // M of no layer

  // What the run's kept bytes P (all its layers) and M = the largest P_l + w_l must satisfy:
  // f P + extra <= room_k and (f - 1) P + max(m0, M) <= room_m. A stage alone has both rooms
  // budget - base, its own extra and no m0; a run inside a stage has them shifted by the layers
  // around it (solve_around_run).
  struct Bounds {
    int64_t room_k, room_m, extra, m0;
  };
  static Bounds alone(const StageProblem& p) {
    return {p.budget - p.base, p.budget - p.base, p.extra, kNone};
  }

  // The LP lower bound on the run's cost within `b` (infinite when nothing can fit).
  double lower_bound(const Bounds& b) {
    b_ = shifted(b);
    if (b_.extra > b_.room_k || b_.m0 > b_.room_m) return std::numeric_limits<double>::infinity();
    return lower(0, static_cast<size_t>(L_), 0, f_ == 1 ? kNone : b_.m0);
  }

  // `hint`: a feasible choice of this stage known in advance (a tighter bound than the seed's).
  // `below`: only a choice costing less than it is wanted (the result is infeasible otherwise).
  // The tables the constructor makes serve any number of calls.
  StageSolution solve(const Bounds& b, const StageSolution* hint, double below) {
    b_ = shifted(b);
    best_ = {};
    upper_ = std::numeric_limits<double>::infinity();
    nodes_.clear();
    StageSolution sol = search(hint, below);
    return sol.feasible && sol.cost < below ? sol : StageSolution{};
  }

 private:
  // The bounds on M in the tables' working bytes: M and every working byte count `shift_` less.
  Bounds shifted(Bounds b) const {
    b.room_m -= shift_;
    if (b.m0 != kNone) b.m0 -= shift_;
    return b;
  }

  StageSolution search(const StageSolution* hint, double below) {
    if (b_.extra > b_.room_k || b_.m0 > b_.room_m) return {};
    const int64_t m0 = f_ == 1 ? kNone : b_.m0;  // with f = 1, M is only checked (done above)
    if (lower(0, static_cast<size_t>(L_), 0, m0) >= below) return {};  // none cheaper
    seed();
    if (hint && hint->feasible && (!best_.feasible || hint->cost < best_.cost)) {
      best_ = *hint;
      upper_ = hint->cost;
    }
    upper_ = std::min(upper_, below);
    std::vector<std::vector<State>> stair(L_ + 1);
    stair[0].push_back({0, m0, 0.0, -1});
    std::vector<State> shifted, merged;
    // An option no choice within the bounds can take (with every other layer at the least kept
    // bytes of all: f K + extra and (f - 1) K + its own working bytes still too much) adds no
    // state, and its pass is skipped.
    for (size_t g = 0; g < opt_.size(); ++g) {
      const StageOption& o = opt_[g];
      const int64_t d = o.working - o.kept, K = o.kept + (L_ - 1) * least_kept_;
      if (f_ * K + b_.extra > b_.room_k || (f_ - 1) * K + o.working > b_.room_m) continue;
      for (int64_t j = 0; j < L_; ++j) {
        const size_t rest = static_cast<size_t>(L_ - j - 1);  // layers after this copy
        shifted.clear();
        for (const State& s : stair[j]) {
          int64_t P = s.p + o.kept, M = std::max(s.m, P + d);
          if (f_ * P + b_.extra > b_.room_k) break;  // P ascending: the rest fail too
          if ((f_ - 1) * P + M > b_.room_m) {
            if (f_ == 1) break;  // M = P + d here, ascending too
            continue;
          }
          double cost = s.cost + o.cost, limit = upper_ * (1 + 1e-12);
          double lb = lower(g, rest, P, f_ == 1 ? kNone : M, limit - cost);
          if (!std::isfinite(lb) || cost + lb > limit) continue;  // infinite: cannot complete
          shifted.push_back({P, f_ == 1 ? kNone : M, cost, s.node});
        }
        if (shifted.empty()) continue;
        for (State& s : shifted) {  // the new copy: a node naming its group and its parent
          nodes_.push_back({s.node, static_cast<int>(g)});
          s.node = static_cast<int>(nodes_.size()) - 1;
          // A state of all L layers is a choice within the bounds: the least one found so far
          // bounds the search from here on.
          if (rest == 0) upper_ = std::min(upper_, s.cost);
        }
        merged.clear();
        std::merge(stair[j + 1].begin(), stair[j + 1].end(), shifted.begin(), shifted.end(),
                   std::back_inserter(merged), [](const State& x, const State& y) {
                     return x.p != y.p ? x.p < y.p : x.m != y.m ? x.m < y.m : x.cost < y.cost;
                   });
        keep_undominated(merged, stair[j + 1]);
      }
      // States that the groups after g cannot complete within the bound are dropped for good
      // (every 8th group: each state shifted meanwhile is bounded as it is made; every group
      // costs more bounds than it saves, none leaves too many states).
      if (g % 8 != 7) continue;
      const double limit = upper_ * (1 + 1e-12);
      for (int64_t j = 0; j < L_; ++j)
        std::erase_if(stair[j], [&](const State& s) {
          double lb = lower(g + 1, static_cast<size_t>(L_ - j), s.p, s.m, limit - s.cost);
          return !std::isfinite(lb) || s.cost + lb > limit;
        });
    }
    if (stair[L_].empty()) return best_;  // the seed, when nothing cheaper exists
    const State* best = &stair[L_].front();
    for (const State& s : stair[L_])
      if (s.cost < best->cost) best = &s;
    std::vector<int64_t> count(opt_.size(), 0);
    for (int n = best->node; n >= 0; n = nodes_[n].parent) ++count[nodes_[n].group];
    Mix mix;
    for (size_t g = 0; g < count.size(); ++g)
      if (count[g] > 0) mix.push_back({g, count[g]});
    StageSolution sol = expand(mix);
    return !best_.feasible || sol.cost <= best_.cost ? sol : best_;
  }

  struct State {
    int64_t p, m;
    double cost;
    int node;  // the last copy added, -1 for none
  };
  struct Node {
    int parent, group;
  };

  // `in`, sorted by P: the states no earlier one beats on all of (P, M, cost), into `out`.
  void keep_undominated(const std::vector<State>& in, std::vector<State>& out) {
    out.clear();
    if (f_ == 1) {  // M is not part of the state: a staircase in (P, cost)
      for (const State& s : in)
        if (out.empty() || s.cost < out.back().cost) out.push_back(s);
      return;
    }
    Staircase<double>& stair = scratch_;  // M ascending, cost descending
    stair.clear();
    for (const State& s : in)
      if (stair.admits(s.m, s.cost)) out.push_back(s);
  }

  // A lower bound on the cost of `rest` more layers on groups g and later, after kept bytes P
  // and with M so far: the LP relaxation with all layers' kept bytes K within both
  // (room - extra) / f and (room - M) / (f - 1); and, for each option the last layer may take,
  // its cost plus the LP of the others, whose kept bytes fit (room - w - (f - 1) k) / f - P
  // since the last layer runs its backward with everything else alive (the least over those
  // options).
  // With a finite `give_up`, only whether the bound passes it is wanted: past it, the result is
  // some bound past it; within it, some value within it (the search stops as soon as it knows).
  double lower(size_t g, size_t rest, int64_t P, int64_t M,
               double give_up = std::numeric_limits<double>::infinity()) const {
    if (rest == 0) return 0;
    int64_t kmax = (b_.room_k - b_.extra) / f_;
    if (f_ > 1 && M != kNone) kmax = std::min(kmax, (b_.room_m - M) / (f_ - 1));
    double all = envelope_lower(suffix_hull_[g], rest, static_cast<double>(kmax - P));
    if (all > give_up) return all;
    double last = std::numeric_limits<double>::infinity();
    for (auto [key, c] : suffix_last_[g]) {
      double cap =
          static_cast<double>(b_.room_m - key) / static_cast<double>(f_) - static_cast<double>(P);
      last = std::min(last, c + envelope_lower(suffix_hull_[g], rest - 1, cap));
      if (last <= all || (std::isfinite(give_up) && last <= give_up)) return std::max(all, last);
    }
    return std::max(all, last);
  }

  // Layer counts of some groups: (group, count), group order.
  using Mix = std::vector<std::pair<size_t, int64_t>>;

  // Whether a mix keeps within the bounds, without expanding it.
  bool fits(const Mix& mix) const {
    int64_t P = 0, M = b_.m0;
    for (auto [g, n] : mix)
      if (n > 0) {
        P += n * opt_[g].kept;
        M = std::max(M, P + opt_[g].working - opt_[g].kept);  // its last layer
      }
    return f_ * P + b_.extra <= b_.room_k && (f_ - 1) * P + M <= b_.room_m;
  }

  // The layers in forward order, and their cost summed in that order.
  StageSolution expand(const Mix& mix) const {
    StageSolution sol;
    sol.feasible = true;
    for (auto [g, n] : mix)
      for (int64_t i = 0; i < n; ++i) sol.choice.push_back(order_[g]);
    for (int o : sol.choice) sol.cost += p_.layers.front()[o].cost;
    sol.peak = model_peak(p_, sol.choice);
    return sol;
  }

  // Upper bound to start from: each option alone, and each mix of two vertices of the convex
  // envelope with the fewest layers on the dearer one that still fits.
  void seed() {
    auto offer = [&](const Mix& mix) {
      if (!fits(mix)) return;
      // A mix clearly dearer than the best so far is not expanded (its cost summed in another
      // order differs by rounding only).
      double cost = 0;
      for (auto [g, n] : mix) cost += static_cast<double>(n) * opt_[g].cost;
      if (best_.feasible && cost > best_.cost * (1 + 1e-9)) return;
      StageSolution s = expand(mix);
      if (!best_.feasible || s.cost < best_.cost) best_ = s;
    };
    for (size_t g = 0; g < opt_.size(); ++g) offer({{g, L_}});
    for (size_t a : vertex_)
      for (size_t c : vertex_) {
        if (opt_[c].cost <= opt_[a].cost) continue;  // a the cheaper, c the dearer
        for (int64_t n = 1; n < L_; ++n) {           // n layers of c, the rest of a
          Mix mix = a < c ? Mix{{a, L_ - n}, {c, n}} : Mix{{c, n}, {a, L_ - n}};
          if (!fits(mix)) continue;
          offer(mix);
          break;
        }
      }
    if (best_.feasible) upper_ = best_.cost;
  }

  const StageProblem& p_;
  const int64_t L_, f_, shift_;
  const std::vector<int>& order_;
  const std::vector<StageOption>& opt_;
  const std::vector<std::vector<std::pair<double, double>>>& suffix_hull_;
  const std::vector<std::vector<std::pair<int64_t, double>>>& suffix_last_;
  const std::vector<size_t>& vertex_;
  const int64_t least_kept_;
  std::vector<Node> nodes_;
  Staircase<double> scratch_;
  Bounds b_{};
  StageSolution best_;  // the seed
  double upper_ = std::numeric_limits<double>::infinity();
};

}  // namespace

// The tables of one option list's run solver: the group programme's over all options and, with
// many options, over the vertices of their (kept, cost) envelope alone (`index`: the option
// behind each vertex).
struct RunTables {
  RunTables(const std::vector<StageOption>& all, int64_t f) : full(all, f) {
    std::vector<std::pair<double, double>> hull = envelope(all);
    if (all.size() <= 8 || hull.size() >= all.size()) return;
    std::vector<StageOption> vertices;
    for (size_t o = 0; o < all.size(); ++o)
      if (on_envelope(hull, all[o]) &&
          std::find_if(vertices.begin(), vertices.end(), [&](const StageOption& x) {
            return x.kept == all[o].kept && x.cost == all[o].cost;
          }) == vertices.end()) {
        vertices.push_back(all[o]);
        index.push_back(static_cast<int>(o));
      }
    few.emplace(vertices, f);
  }
  GroupTables full;
  std::optional<GroupTables> few;
  std::vector<int> index;
};

struct RunTablesCache::Impl {
  std::mutex mu;
  std::map<std::pair<int64_t, std::vector<std::tuple<int64_t, int64_t, double>>>,
           std::shared_ptr<const RunTables>>
      tables;
};

RunTablesCache::RunTablesCache() : impl_(std::make_unique<Impl>()) {}
RunTablesCache::~RunTablesCache() = default;

std::shared_ptr<const RunTables> RunTablesCache::get(const std::vector<StageOption>& opts,
                                                     int64_t f) {
  // The key: f and the options with their working bytes less the first one's.
  const int64_t w0 = opts.empty() ? 0 : opts.front().working;
  std::vector<std::tuple<int64_t, int64_t, double>> key;
  for (const StageOption& o : opts) key.emplace_back(o.kept, o.working - w0, o.cost);
  std::pair k{f, std::move(key)};
  {
    std::lock_guard lock(impl_->mu);
    auto it = impl_->tables.find(k);
    if (it != impl_->tables.end()) return it->second;
  }
  std::vector<StageOption> base = opts;  // working bytes from 0 at the first option
  for (StageOption& o : base) o.working -= w0;
  auto made = std::make_shared<const RunTables>(base, f);  // outside the lock
  std::lock_guard lock(impl_->mu);
  return impl_->tables.emplace(std::move(k), std::move(made)).first->second;
}

// The group programme of one run of identical layers. With many options, the vertices of the
// (kept, cost) envelope alone first give a choice whose cost is usually within a hair of the
// optimum: a tight bound for the search over all options. The tables (from `cache` when given)
// serve any number of bounds.
class RunSolver {
 public:
  RunSolver(StageProblem p, RunTablesCache* cache) : p_(std::move(p)) {
    const std::vector<StageOption>& all = p_.layers.front();
    const int64_t shift = all.empty() ? 0 : all.front().working;
    if (cache) {
      tables_ = cache->get(all, p_.in_flight);
    } else {
      std::vector<StageOption> base = all;
      for (StageOption& o : base) o.working -= shift;
      tables_ = std::make_shared<const RunTables>(base, p_.in_flight);
    }
    if (tables_->few) {
      few_ = p_;
      std::vector<StageOption> vertices;
      for (int o : tables_->index) vertices.push_back(all[static_cast<size_t>(o)]);
      few_.layers.assign(p_.layers.size(), vertices);
      few_programme_.emplace(few_, *tables_->few, shift);
    }
    programme_.emplace(p_, tables_->full, shift);
  }

  double lower_bound(const GroupProgramme::Bounds& b) { return programme_->lower_bound(b); }

  StageSolution solve(const GroupProgramme::Bounds& b, double below) {
    if (!few_programme_) return programme_->solve(b, nullptr, below);
    StageSolution hint = few_programme_->solve(b, nullptr, below);
    for (int& c : hint.choice) c = tables_->index[static_cast<size_t>(c)];
    return programme_->solve(b, &hint, below);
  }

 private:
  StageProblem p_, few_;
  std::shared_ptr<const RunTables> tables_;
  std::optional<GroupProgramme> few_programme_, programme_;
};

// A stage with a run of two or more identical layers among others (a mixed model's dense layers
// before its MoE layers): every pairing of a Pareto choice of the layers before the longest run
// with one of the layers after it, cheapest first, and for each the group programme over the
// run, its bounds shifted by the pairing. With K_b, M_b the kept bytes and largest P_l + w_l of
// the layers before (P_l from the stage's start), K_a, T_a = max(extra, M_a - K_a) those after
// (from their own start), and the run's K, M counted from its own start, the stage's peak
// base + max(f K_all + extra, (f - 1) K_all + M_all) stays within the budget exactly when
//   f K + T_a <= room - f (K_b + K_a)                     (K_all = K_b + K + K_a), and
//   (f - 1) K + max(M_b - K_b, M) <= room - f K_b - (f - 1) K_a,
// the run's own bounds with extra T_a and m0 = M_b - K_b. Smaller K_b, M_b, K_a, K_a + T_a and
// cost are each better, so the Pareto choices on each side are enough. nullopt when no run has
// two layers.
std::optional<StageSolution> solve_around_run(const StageProblem& p, double below,
                                              RunTablesCache* cache) {
  const size_t n = p.layers.size();
  size_t lo = 0, hi = 0;
  for (auto [l, end] : option_runs(p))
    if (end - l > hi - lo) lo = l, hi = end;
  if (hi - lo < 2) return std::nullopt;
  auto at = [&](size_t i) { return p.layers.begin() + static_cast<std::ptrdiff_t>(i); };
  StageProblem before = p, run = p, after = p;
  before.layers.assign(at(0), at(lo));
  before.extra = GroupProgramme::kNone;  // its transient is then M_b - K_b
  run.layers.assign(at(lo), at(hi));
  after.layers.assign(at(hi), p.layers.end());
  const std::vector<ParetoChoice> post = pareto_choices(after);
  RunSolver solver(std::move(run), cache);
  const int64_t room = p.budget - p.base, f = p.in_flight;
  auto bounds_of = [&](const ParetoChoice& b, const ParetoChoice& a) {
    GroupProgramme::Bounds bounds{room - f * (b.kept + a.kept), 0, a.transient, b.transient};
    bounds.room_m = bounds.room_k + a.kept;
    return bounds;
  };
  StageSolution best;
  double bound = below;
  // Each pairing's cost plus the run's LP lower bound within its bounds: the least any choice
  // with that pairing can cost. Searched in that order, until the bound passes the best found.
  auto search = [&](const std::vector<ParetoChoice>& pre) {
    struct Pairing {
      double cost, lower;
      size_t b, a;
    };
    std::vector<Pairing> pairings;
    for (size_t i = 0; i < pre.size(); ++i)
      for (size_t j = 0; j < post.size(); ++j) {
        const double cost = pre[i].cost + post[j].cost;
        if (cost >= bound) continue;
        const double lower = cost + solver.lower_bound(bounds_of(pre[i], post[j]));
        if (lower < bound) pairings.push_back({cost, lower, i, j});
      }
    std::stable_sort(pairings.begin(), pairings.end(),
                     [](const Pairing& x, const Pairing& y) { return x.lower < y.lower; });
    for (const Pairing& pr : pairings) {
      if (pr.lower >= bound) break;  // least bound first: no later pairing does better
      const ParetoChoice &b = pre[pr.b], &a = post[pr.a];
      StageSolution mid = solver.solve(bounds_of(b, a), bound - pr.cost);
      if (!mid.feasible) continue;
      StageSolution sol{true, 0, b.choice, 0};
      sol.choice.insert(sol.choice.end(), mid.choice.begin(), mid.choice.end());
      sol.choice.insert(sol.choice.end(), a.choice.begin(), a.choice.end());
      for (size_t l = 0; l < n; ++l)
        sol.cost += p.layers[l][static_cast<size_t>(sol.choice[l])].cost;
      if (sol.cost >= bound) continue;
      sol.peak = model_peak(p, sol.choice);
      best = std::move(sol);
      bound = best.cost;
    }
  };
  if (lo == 0 || !uniform(before) || post.empty()) {
    search(pareto_choices(before));
    return best;
  }
  // Layers of one kind before the run (DeepSeek's dense layers): their Pareto choices are many
  // (tens of thousands for 3 layers of hundreds of options), most of them far from the optimum.
  // First every layer before the run at one option, for a bound; then only the choices whose
  // cost and the run's LP bound, with the loosest layers after it, can still beat it.
  const std::vector<StageOption>& opts = before.layers.front();
  const int64_t nb = static_cast<int64_t>(lo);
  std::vector<ParetoChoice> same;
  for (size_t o = 0; o < opts.size(); ++o) {
    const int64_t K = nb * opts[o].kept, M = (nb - 1) * opts[o].kept + opts[o].working;
    if ((f - 1) * K + M > room) continue;
    ParetoChoice c{K, M - K, 0.0, std::vector<int>(lo, static_cast<int>(o))};
    for (size_t l = 0; l < lo; ++l) c.cost += opts[o].cost;
    same.push_back(std::move(c));
  }
  search(keep_least(std::move(same)));
  ParetoChoice loosest{std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max(),
                       std::numeric_limits<double>::infinity(), {}};
  for (const ParetoChoice& a : post) {
    loosest.kept = std::min(loosest.kept, a.kept);
    loosest.transient = std::min(loosest.transient, a.transient);
    loosest.cost = std::min(loosest.cost, a.cost);
  }
  search(group_choices(before, [&](int64_t P, int64_t M, double cost) {
    return cost + loosest.cost + solver.lower_bound(bounds_of({P, M - P, 0.0, {}}, loosest)) >= bound;
  }));
  return best;
}

StageSolution solve_stage(const StageProblem& p, double below, RunTablesCache* cache) {
  if (uniform(p)) return RunSolver(p, cache).solve(GroupProgramme::alone(p), below);
  if (std::optional<StageSolution> sol = solve_around_run(p, below, cache)) return *sol;
  StageSolution sol = solve_stage_programme(p);
  return sol.feasible && sol.cost < below ? sol : StageSolution{};
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
  StageSolution sol{true, 0, {}, 0};
  if (std::optional<Runs> r = runs_of(q)) {
    sol.choice = expand(*r, min_peak_solution(r->q).choice);
  } else {
    std::vector<std::vector<State>> levels = layer_levels(q);
    const std::vector<State>& last = levels.back();
    int best = 0;
    for (size_t i = 1; i < last.size(); ++i)
      if (q.in_flight * last[i].q + last[i].e < q.in_flight * last[best].q + last[best].e)
        best = static_cast<int>(i);
    sol.choice = choice_of(levels, best);
  }
  for (size_t l = 0; l < sol.choice.size(); ++l) sol.cost += p.layers[l][sol.choice[l]].cost;
  sol.peak = model_peak(p, sol.choice);
  sol.feasible = sol.peak <= p.budget;
  return sol;
}

int64_t min_stage_peak(const StageProblem& p) {
  return min_peak_solution(p).peak;
}

}  // namespace np
