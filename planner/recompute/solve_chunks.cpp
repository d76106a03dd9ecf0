// The stage solver for stages of several model chunks (the interleaved schedule), exact under the
// model in solve.hpp:
//
// 1. Each chunk's choices that no other beats on (K, K + E, cost) (pareto_choices); a choice whose
//    own terms already break some step's budget, with every other chunk at its least, is left
//    out. Choice i of chunk c adds a_{c,i,s} = alive_s[c] K + [running_s = c] E to step s.
// 2. A depth-first search over the chunks in order, each chunk's choices by reduced cost, with P_s
//    the partial sum of step s: a branch is cut when some step cannot stay within the room even
//    with the later chunks at their least, or when its cost plus a lower bound on the later
//    chunks' reaches the best complete choice known. The bound is Lagrangian: for multipliers
//    l_s >= 0, the later chunks cost at least sum_c min_i (cost_i + l . a_{c,i}) - l . (room - P);
//    the multipliers are set once by a subgradient ascent on the whole problem, whose feasible
//    minimisers seed the best known. The last chunk takes its cheapest choice that fits.
// The least peak: the same search over the largest P_s, cut by each step's least completion.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <optional>
#include <tuple>

#include "planner/recompute/solve.hpp"
#include "planner/recompute/solve_chunks.hpp"

namespace np {

namespace {

// A chunk's K_c and E_c from its layers' kept bytes q and transient term e (Q over the layers).
std::pair<int64_t, int64_t> chunk_terms(const ChunkedStageProblem::Chunk& ch, int64_t q,
                                        int64_t e) {
  const StageOption &b = ch.before, &h = ch.after;
  int64_t E = std::max({h.working - h.kept, e - h.kept, b.working - b.kept - q - h.kept});
  return {b.kept + q + h.kept, E};
}

}  // namespace

int64_t model_peak(const ChunkedStageProblem& p, const std::vector<std::vector<int>>& choice) {
  std::vector<int64_t> K(p.chunks.size()), E(p.chunks.size());
  for (size_t c = 0; c < p.chunks.size(); ++c) {
    const ChunkedStageProblem::Chunk& ch = p.chunks[c];
    auto [q, e] = layer_terms(ch.layers, choice[c], 0);
    std::tie(K[c], E[c]) = chunk_terms(ch, q, e);
  }
  int64_t peak = p.loads.empty() ? 0 : std::numeric_limits<int64_t>::min();
  for (const ChunkLoad& s : p.loads) {
    int64_t at = E[s.running];
    for (size_t c = 0; c < K.size(); ++c) at += s.alive[c] * K[c];
    peak = std::max(peak, at);
  }
  return p.base + peak;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

class ChunkProgramme {
 public:
  ChunkProgramme(const ChunkedStageProblem& p, int64_t branches)
      : p_(p),
        C_(p.chunks.size()),
        S_(p.loads.size()),
        room_(p.budget - p.base),
        branches_(branches) {}

  // The cheapest choice within the budget and below `below`.
  ChunkedSolution cheapest(double below) {
    if (!build_items(/*by_cost=*/true)) return {};
    upper_ = below;
    lagrangian();
    improve();
    // The least cost of every chunk together reached: nothing is cheaper.
    if (!(incumbent_.feasible && incumbent_.cost <= rest_cost_[0]) && fix_items()) {
      std::vector<int64_t> P(S_, 0);
      pick_.assign(C_, 0);
      index_last();
      search_cost(0, P, 0.0);
    }
    ChunkedSolution sol = incumbent_;
    sol.proven = !stopped_;
    // Unproven: every choice costs at least the Lagrangian bound and each chunk's cheapest.
    sol.lower = stopped_ ? std::min(upper_, std::max(dual_, rest_cost_[0])) : sol.cost;
    return sol;
  }

  // The choice with the least model peak.
  ChunkedSolution least_peak() {
    room_ = std::numeric_limits<int64_t>::max() / 8;
    if (!build_items(/*by_cost=*/false)) return {};
    pick_.assign(C_, 0);
    for (size_t c = 0; c < C_; ++c) pick_[c] = frugal(c);
    best_pick_ = pick_;
    least_ = peak_of(pick_);
    std::vector<int64_t> P(S_, 0);
    search_peak(0, P);
    ChunkedSolution sol{true, 0, {}, 0};
    for (size_t c = 0; c < C_; ++c) sol.choice.push_back(items_[c][best_pick_[c]].choice);
    sol.cost = summed_cost(sol.choice);
    sol.peak = model_peak(p_, sol.choice);
    sol.proven = !stopped_;
    // Unproven: no choice peaks under any step's least sum.
    int64_t floor = 0;
    for (size_t s = 0; s < S_; ++s) floor = std::max(floor, rest_min_[0][s]);
    sol.lower_peak = stopped_ ? p_.base + floor : sol.peak;
    return sol;
  }

 private:
  struct Item {
    int64_t K, E;
    double cost;
    std::vector<int> choice;
  };

  // What chunk c keeping K and adding E while it runs puts on step s.
  int64_t a(size_t c, int64_t K, int64_t E, size_t s) const {
    return p_.loads[s].alive[c] * K + (p_.loads[s].running == static_cast<int>(c) ? E : 0);
  }
  int64_t a(size_t c, const Item& it, size_t s) const { return a(c, it.K, it.E, s); }

  // Whether chunk c keeping K and adding E fits every step on top of partial sums P.
  bool fits(size_t c, int64_t K, int64_t E, const std::vector<int64_t>& P) const {
    for (size_t s = 0; s < S_; ++s)
      if (P[s] + a(c, K, E, s) > room_) return false;
    return true;
  }

  // Every step's sum over the chunks' picked items, chunks `skip` left out.
  std::vector<int64_t> sums(const std::vector<size_t>& pick,
                            std::initializer_list<size_t> skip = {}) const {
    std::vector<int64_t> P(S_, 0);
    for (size_t c = 0; c < C_; ++c) {
      if (std::find(skip.begin(), skip.end(), c) != skip.end()) continue;
      for (size_t s = 0; s < S_; ++s) P[s] += a(c, items_[c][pick[c]], s);
    }
    return P;
  }

  // The cost summed in chunk and layer order (as exhaustive search sums it).
  double summed_cost(const std::vector<std::vector<int>>& choice) const {
    double cost = 0;
    for (size_t c = 0; c < C_; ++c)
      for (size_t l = 0; l < choice[c].size(); ++l)
        cost += p_.chunks[c].layers[l][choice[c][l]].cost;
    return cost;
  }

  int64_t peak_of(const std::vector<size_t>& pick) const {
    std::vector<int64_t> P = sums(pick);
    return *std::max_element(P.begin(), P.end());
  }

  // Each chunk's Pareto choices (with its embedding or head block), those that cannot fit with
  // every other chunk at its least left out, cheapest first (or with the least largest
  // contribution first); false when some chunk has none.
  bool build_items(bool by_cost) {
    items_.assign(C_, {});
    // Each chunk's least K_c and E_c (E_c at least the head's term and 0 less the rest).
    std::vector<int64_t> kmin(C_), emin(C_);
    for (size_t c = 0; c < C_; ++c) {
      const ChunkedStageProblem::Chunk& ch = p_.chunks[c];
      int64_t q = 0;
      for (const auto& layer : ch.layers) {
        int64_t k = std::numeric_limits<int64_t>::max();
        for (const StageOption& o : layer) k = std::min(k, o.kept);
        q += k;
      }
      kmin[c] = chunk_terms(ch, q, 0).first;
      emin[c] = ch.after.working - ch.after.kept;
    }
    // Per chunk: each step's sum with every other chunk at its least.
    std::vector<std::vector<int64_t>> least_others(C_, std::vector<int64_t>(S_, 0));
    for (size_t c = 0; c < C_; ++c)
      for (size_t o = 0; o < C_; ++o)
        if (o != c)
          for (size_t s = 0; s < S_; ++s) least_others[c][s] += a(o, kmin[o], emin[o], s);
    for (size_t c = 0; c < C_; ++c) {
      const ChunkedStageProblem::Chunk& ch = p_.chunks[c];
      std::shared_ptr<const std::vector<ParetoChoice>> choices = ch.choices;
      if (!choices) {
        StageProblem sp;
        sp.layers = ch.layers;
        sp.budget = std::numeric_limits<int64_t>::max() / 8;
        choices = std::make_shared<const std::vector<ParetoChoice>>(pareto_choices(sp));
      }
      for (const ParetoChoice& pc : *choices) {
        auto [K, E] = chunk_terms(ch, pc.kept, pc.transient);
        Item it{K, E, pc.cost, pc.choice};
        if (fits(c, it.K, it.E, least_others[c])) items_[c].push_back(std::move(it));
      }
      if (items_[c].empty()) return false;
      if (by_cost) {
        std::stable_sort(items_[c].begin(), items_[c].end(),
                         [](const Item& x, const Item& y) { return x.cost < y.cost; });
      } else {
        std::vector<std::pair<int64_t, size_t>> key;
        for (size_t i = 0; i < items_[c].size(); ++i) key.push_back({largest(c, items_[c][i]), i});
        std::stable_sort(key.begin(), key.end());
        std::vector<Item> sorted;
        for (auto [k, i] : key) sorted.push_back(std::move(items_[c][i]));
        items_[c] = std::move(sorted);
      }
    }
    rest_arrays();
    return true;
  }

  // The later chunks' least contribution to each step, and least cost.
  void rest_arrays() {
    rest_min_.assign(C_ + 1, std::vector<int64_t>(S_, 0));
    rest_cost_.assign(C_ + 1, 0.0);
    for (size_t c = C_; c-- > 0;) {
      double cheapest = kInf;
      for (const Item& it : items_[c]) cheapest = std::min(cheapest, it.cost);
      rest_cost_[c] = rest_cost_[c + 1] + cheapest;
      for (size_t s = 0; s < S_; ++s) {
        int64_t least = std::numeric_limits<int64_t>::max();
        for (const Item& it : items_[c]) least = std::min(least, a(c, it, s));
        rest_min_[c][s] = rest_min_[c + 1][s] + least;
      }
    }
  }

  int64_t largest(size_t c, const Item& it) const {
    int64_t worst = 0;
    for (size_t s = 0; s < S_; ++s) worst = std::max(worst, a(c, it, s));
    return worst;
  }

  // Chunk c's item with the least largest contribution to a step.
  size_t frugal(size_t c) const {
    size_t pick = 0;
    for (size_t i = 1; i < items_[c].size(); ++i)
      if (largest(c, items_[c][i]) < largest(c, items_[c][pick])) pick = i;
    return pick;
  }

  // Item i of chunk c priced under multipliers l: cost + l . a.
  double priced(size_t c, size_t i, const std::vector<double>& l) const {
    double v = items_[c][i].cost;
    for (size_t s = 0; s < S_; ++s) v += l[s] * static_cast<double>(a(c, items_[c][i], s));
    return v;
  }
  // The cheapest item of chunk c under multipliers l: its index and priced value.
  std::pair<size_t, double> priced(size_t c, const std::vector<double>& l) const {
    size_t best = 0;
    double value = kInf;
    for (size_t i = 0; i < items_[c].size(); ++i)
      if (double v = priced(c, i, l); v < value) value = v, best = i;
    return {best, value};
  }

  // Takes one item per chunk as the best known when it fits and is cheaper.
  void offer(const std::vector<size_t>& pick) {
    double cost = 0;
    for (size_t c = 0; c < C_; ++c) cost += items_[c][pick[c]].cost;
    for (int64_t at : sums(pick))
      if (at > room_) return;
    if (cost >= upper_) return;
    upper_ = cost;
    best_pick_ = pick;
    incumbent_ = {true, cost, {}, 0};
    for (size_t c = 0; c < C_; ++c) incumbent_.choice.push_back(items_[c][pick[c]].choice);
    incumbent_.cost = summed_cost(incumbent_.choice);
    incumbent_.peak = model_peak(p_, incumbent_.choice);
  }

  // Subgradient ascent on the Lagrangian dual; keeps the multipliers of the best bound, and every
  // feasible minimiser (and each chunk's least-bytes item together) as a known choice.
  void lagrangian() {
    {
      std::vector<size_t> pick(C_);
      for (size_t c = 0; c < C_; ++c) pick[c] = frugal(c);
      offer(pick);
    }
    lambda_.assign(S_, 0.0);
    std::vector<double> l(S_, 0.0), g(S_);
    double best_dual = -kInf, theta = 1.0;
    int stale = 0;
    double scale = 0;  // a cost spread: the target while nothing is known
    for (size_t c = 0; c < C_; ++c)
      for (const Item& it : items_[c]) scale = std::max(scale, it.cost);
    scale *= static_cast<double>(C_);
    for (int iter = 0; iter < 300 && theta > 1.0 / 1024; ++iter) {
      std::vector<size_t> pick(C_);
      double dual = 0;
      std::fill(g.begin(), g.end(), -static_cast<double>(room_));
      for (size_t c = 0; c < C_; ++c) {
        auto [i, v] = priced(c, l);
        pick[c] = i, dual += v;
        for (size_t s = 0; s < S_; ++s) g[s] += static_cast<double>(a(c, items_[c][i], s));
      }
      for (size_t s = 0; s < S_; ++s) dual -= l[s] * static_cast<double>(room_);
      offer(pick);
      if (dual > best_dual) {
        best_dual = dual, lambda_ = l, stale = 0;
      } else if (++stale >= 5) {
        theta /= 2, stale = 0;
      }
      double norm = 0;
      for (size_t s = 0; s < S_; ++s)
        if (l[s] > 0 || g[s] > 0) norm += g[s] * g[s];
      double target = upper_ < kInf ? upper_ : best_dual + scale + 1e-9;
      if (norm == 0 || target <= best_dual + 1e-12 * std::abs(target)) break;
      double step = theta * (target - dual) / norm;
      for (size_t s = 0; s < S_; ++s) l[s] = std::max(0.0, l[s] + step * g[s]);
    }
    dual_ = best_dual;
    // Each chunk's least priced value under the kept multipliers, summed from c on.
    rest_priced_.assign(C_ + 1, 0.0);
    for (size_t c = C_; c-- > 0;) rest_priced_[c] = rest_priced_[c + 1] + priced(c, lambda_).second;
  }

  // Whether P plus the least completion from chunk j fits every step.
  bool completes(size_t j, const std::vector<int64_t>& P) const {
    for (size_t s = 0; s < S_; ++s)
      if (P[s] + rest_min_[j][s] > room_) return false;
    return true;
  }

  // Counts a branch; false once past the limit (the search then unwinds with what it has).
  bool branch() {
    if (++visited_ <= branches_) return true;
    stopped_ = true;
    return false;
  }

  // Depth-first over chunks 0 .. C - 2 (their items by reduced cost, so the Lagrangian bound only
  // grows along a loop), the last chunk by its cheapest item that fits.
  void search_cost(size_t c, std::vector<int64_t>& P, double cost) {
    if (!branch()) return;
    if (c + 1 == C_) {  // the last chunk's cheapest item that fits: a new best
      std::optional<size_t> i = cheapest_fit(P, cost);
      if (i) {
        pick_[c] = *i;
        offer(pick_);
      }
      return;
    }
    // cost + bound(c + 1, P + a_i) = node + reduced_i, reduced_i = cost_i + lambda . a_i.
    double node = cost + rest_priced_[c + 1];
    for (size_t s = 0; s < S_; ++s) node -= lambda_[s] * static_cast<double>(room_ - P[s]);
    std::vector<int64_t> next(S_);
    for (size_t i = 0; i < items_[c].size(); ++i) {
      const Item& it = items_[c][i];
      if (node + reduced_[c][i] >= upper_ * (1 + 1e-12) + 1e-15) break;
      double with = cost + it.cost;
      if (with + rest_cost_[c + 1] >= upper_) continue;
      for (size_t s = 0; s < S_; ++s) next[s] = P[s] + a(c, it, s);
      if (!completes(c + 1, next)) continue;
      pick_[c] = i;
      search_cost(c + 1, next, with);
      if (stopped_) return;
    }
  }

  // Local search from the best known choice: one chunk's item replaced by its cheapest that fits
  // with the others kept, or two chunks' items together (a cheaper item in one, the cheapest
  // that then fits in the other), while that lowers the cost.
  void improve() {
    if (!incumbent_.feasible || best_pick_.size() != C_) return;
    std::vector<size_t> pick = best_pick_;
    auto fits_with = [&](size_t c, size_t i, const std::vector<int64_t>& P) {
      return fits(c, items_[c][i].K, items_[c][i].E, P);
    };
    for (int round = 0; round < 8; ++round) {
      double before = upper_;
      for (size_t c = 0; c < C_; ++c) {  // items are cheapest first: the first that fits
        std::vector<int64_t> P = sums(pick, {c});
        for (size_t i = 0; i < items_[c].size() && items_[c][i].cost < items_[c][pick[c]].cost; ++i)
          if (fits_with(c, i, P)) {
            pick[c] = i;
            break;
          }
      }
      offer(pick);
      for (size_t x = 0; x < C_; ++x)
        for (size_t y = 0; y < C_; ++y) {
          if (x == y) continue;
          std::vector<int64_t> P = sums(pick, {x, y});
          const double fixed = upper_ - items_[x][pick[x]].cost - items_[y][pick[y]].cost;
          size_t tries = 0;
          for (size_t i = 0; i < items_[x].size() && tries < 64; ++i) {
            if (items_[x][i].cost >= items_[x][pick[x]].cost) break;
            std::vector<int64_t> Q = P;
            for (size_t s = 0; s < S_; ++s) Q[s] += a(x, items_[x][i], s);
            ++tries;
            for (size_t j = 0; j < items_[y].size(); ++j) {
              if (fixed + items_[x][i].cost + items_[y][j].cost >= upper_) break;
              if (fits_with(y, j, Q)) {
                pick[x] = i, pick[y] = j;
                offer(pick);
                P = sums(pick, {x, y});
                break;
              }
            }
          }
        }
      pick = best_pick_;
      if (upper_ >= before) break;
    }
  }

  // Items that cannot be part of a choice cheaper than the best known are dropped: with the
  // Lagrangian multipliers, a choice holding item i of chunk c costs at least the dual bound plus
  // i's reduced cost above the chunk's least. The others go by reduced cost (the last chunk by
  // cost) and the completions are recomputed; false when some chunk keeps none.
  bool fix_items() {
    reduced_.assign(C_, {});
    for (size_t c = 0; c < C_; ++c) {
      std::vector<std::pair<double, size_t>> order;
      double least = kInf;
      for (size_t i = 0; i < items_[c].size(); ++i) {
        double r = priced(c, i, lambda_);
        order.push_back({r, i});
        least = std::min(least, r);
      }
      const double slack = upper_ - dual_;
      std::vector<Item> kept;
      if (c + 1 < C_) std::stable_sort(order.begin(), order.end());
      for (auto [r, i] : order) {
        if (std::isfinite(upper_) && r - least > slack * (1 + 1e-9) + 1e-15) continue;
        kept.push_back(std::move(items_[c][i]));
        reduced_[c].push_back(r);
      }
      items_[c] = std::move(kept);
      if (items_[c].empty()) return false;
    }
    rest_arrays();
    rest_priced_.assign(C_ + 1, 0.0);
    for (size_t c = C_; c-- > 0;)
      rest_priced_[c] =
          rest_priced_[c + 1] + *std::min_element(reduced_[c].begin(), reduced_[c].end());
    return true;
  }

  // The last chunk's items (cheapest first) in a segment tree of their least K and least E: the
  // first item that fits after partial sums P is found without scanning those that cannot.
  void index_last() {
    const std::vector<Item>& items = items_[C_ - 1];
    leaves_ = 1;
    while (leaves_ < items.size()) leaves_ *= 2;
    constexpr int64_t kBig = std::numeric_limits<int64_t>::max() / 4;
    tree_.assign(2 * leaves_, {kBig, kBig});
    for (size_t i = 0; i < items.size(); ++i) tree_[leaves_ + i] = {items[i].K, items[i].E};
    for (size_t n = leaves_; n-- > 1;)
      tree_[n] = {std::min(tree_[2 * n].first, tree_[2 * n + 1].first),
                  std::min(tree_[2 * n].second, tree_[2 * n + 1].second)};
  }

  std::optional<size_t> cheapest_fit(const std::vector<int64_t>& P, double cost) const {
    const std::vector<Item>& items = items_[C_ - 1];
    // Only items that keep the total under the best known.
    size_t end =
        static_cast<size_t>(std::lower_bound(items.begin(), items.end(), upper_ - cost,
                                             [](const Item& it, double v) { return it.cost < v; }) -
                            items.begin());
    // A node whose least K and least E together cannot fit holds no item that fits (each step's
    // sum only grows with K and E; the steps not running the last chunk bound K, those that do
    // bound E by a line falling with K).
    std::function<std::optional<size_t>(size_t, size_t, size_t)> first =
        [&](size_t node, size_t lo, size_t hi) -> std::optional<size_t> {
      if (lo >= end || !fits(C_ - 1, tree_[node].first, tree_[node].second, P)) return std::nullopt;
      if (hi - lo == 1) return lo;
      size_t mid = (lo + hi) / 2;
      if (auto i = first(2 * node, lo, mid)) return i;
      return first(2 * node + 1, mid, hi);
    };
    return first(1, 0, leaves_);
  }

  void search_peak(size_t c, std::vector<int64_t>& P) {
    if (!branch()) return;
    std::vector<int64_t> next(S_);
    for (size_t i = 0; i < items_[c].size(); ++i) {
      const Item& it = items_[c][i];
      int64_t worst = std::numeric_limits<int64_t>::min();
      for (size_t s = 0; s < S_; ++s) {
        next[s] = P[s] + a(c, it, s);
        worst = std::max(worst, next[s] + rest_min_[c + 1][s]);
      }
      if (worst >= least_) continue;
      pick_[c] = i;
      if (c + 1 == C_) {
        least_ = worst, best_pick_ = pick_;
        continue;
      }
      search_peak(c + 1, next);
      if (stopped_) return;
    }
  }

  const ChunkedStageProblem& p_;
  const size_t C_, S_;
  int64_t room_;
  std::vector<std::vector<Item>> items_;
  std::vector<std::vector<int64_t>> rest_min_;
  std::vector<double> rest_cost_, rest_priced_, lambda_;
  std::vector<std::vector<double>> reduced_;  // per chunk, per item: cost + lambda . a
  std::vector<size_t> pick_, best_pick_;
  size_t leaves_ = 1;
  std::vector<std::pair<int64_t, int64_t>> tree_;  // (least K, least E) per node
  double upper_ = kInf, dual_ = -kInf;             // the best known cost; the best Lagrangian bound
  int64_t least_ = std::numeric_limits<int64_t>::max();
  ChunkedSolution incumbent_;
  const int64_t branches_;
  int64_t visited_ = 0;
  bool stopped_ = false;
};

}  // namespace

ChunkedSolution solve_chunked_stage(const ChunkedStageProblem& p, double below, int64_t branches) {
  if (p.chunks.empty() || p.loads.empty()) return {};
  ChunkedSolution sol = ChunkProgramme(p, branches).cheapest(below);
  if (sol.feasible && sol.peak <= p.budget && sol.cost < below) return sol;
  if (!sol.proven) {  // stopped with nothing found: the least peak may still fit
    ChunkedSolution least = ChunkProgramme(p, branches).least_peak();
    if (least.feasible && least.peak <= p.budget && least.cost < below) {
      least.proven = false, least.lower = sol.lower;
      return least;
    }
  }
  ChunkedSolution none;
  none.proven = sol.proven, none.lower = sol.proven ? below : sol.lower;
  return none;
}

ChunkedSolution min_peak_chunked_solution(const ChunkedStageProblem& p, int64_t branches) {
  if (p.chunks.empty() || p.loads.empty()) return {};
  ChunkedSolution sol = ChunkProgramme(p, branches).least_peak();
  sol.feasible = sol.feasible && sol.peak <= p.budget;
  return sol;
}

ChunkedSolution brute_force_chunked_stage(const ChunkedStageProblem& p) {
  std::vector<std::pair<size_t, size_t>> slots;  // (chunk, layer)
  for (size_t c = 0; c < p.chunks.size(); ++c)
    for (size_t l = 0; l < p.chunks[c].layers.size(); ++l) slots.push_back({c, l});
  std::vector<std::vector<int>> choice(p.chunks.size());
  for (size_t c = 0; c < p.chunks.size(); ++c) choice[c].assign(p.chunks[c].layers.size(), 0);
  ChunkedSolution best;
  while (true) {
    int64_t peak = model_peak(p, choice);
    double cost = 0;
    for (size_t c = 0; c < p.chunks.size(); ++c)
      for (size_t l = 0; l < choice[c].size(); ++l)
        cost += p.chunks[c].layers[l][choice[c][l]].cost;
    if (peak <= p.budget && (!best.feasible || cost < best.cost)) best = {true, cost, choice, peak};
    size_t k = 0;
    for (; k < slots.size(); ++k) {
      auto [c, l] = slots[k];
      if (++choice[c][l] < static_cast<int>(p.chunks[c].layers[l].size())) break;
      choice[c][l] = 0;
    }
    if (k == slots.size()) break;
  }
  return best;
}

}  // namespace np
