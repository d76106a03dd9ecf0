// Enumeration of recompute masks with a fast per-mask liveness evaluation, and the 3-D Pareto
// filter. The evaluation replays the block's forward, recompute segment and backward exactly as
// the schedule orders them (tests compare it with the schedule's simulation).
#include "planner/recompute/frontier.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>

#include "planner/schedule/parallel.hpp"
#include "planner/recompute/mincut.hpp"
#include "planner/recompute/staircase.hpp"

namespace np {
namespace {

// Replays one micro-batch of a block under a mask without allocating: the forward (block inputs,
// each op with its forward workspace), then the backward phase (the incoming gradient, the kept
// values, the recompute segment, the backward ops with their workspaces and new gradients).
// Slots: value t, recomputed value n + t, gradient 2n + t; a slot dies after its last use.
class OptionEvaluator {
 public:
  OptionEvaluator(const BlockGraph& g, const std::vector<double>& op_cost)
      : g_(g),
        cost_(op_cost),
        n_(static_cast<int>(g.tensors.size())),
        runs_(backward_runs(g)),
        needed_(backward_reads(g)) {
    for (const GraphOp& op : g.ops) {
      std::vector<TensorType> in;
      for (int t : op.inputs) in.push_back(g.tensors[t].type);
      const OpInfo& info = op_info(op.kind);
      int64_t f = 0, b = 0;
      for (const TensorType& w : forward_workspace(info, op.attrs, in)) f += w.bytes();
      for (const TensorType& w : info.bwd_workspace(op.attrs, in)) b += w.bytes();
      // A stepped op (ops.hpp, OpStep): the workspace that, with its outputs, peaks as the steps.
      if (std::vector<OpStep> steps = op_steps(info, op.attrs, in, true); !steps.empty()) {
        std::vector<int64_t> out;
        for (int t : op.outputs) out.push_back(g.tensors[t].type.bytes());
        f = steps_peak_workspace(steps, out);
      }
      fwd_ws_.push_back(f), bwd_ws_.push_back(b);
    }
    // And with the input gradients it allocates, which are the same under every mask (the
    // backward's order and runs are).
    std::vector<char> has(n_, 0);
    if (g.hidden_out >= 0) has[g.hidden_out] = 1;
    for (int o = static_cast<int>(g.ops.size()) - 1; o >= 0; --o) {
      if (!runs_[o]) continue;
      const GraphOp& op = g.ops[o];
      const OpInfo& info = op_info(op.kind);
      int64_t fresh = 0;
      std::vector<TensorType> in;
      for (size_t k = 0; k < op.inputs.size(); ++k) {
        int t = op.inputs[k];
        in.push_back(g.tensors[t].type);
        if (!(info.grad_inputs >> k & 1u) || has[t]) continue;
        fresh += grad_bytes(g.tensors[t].type), has[t] = 1;
      }
      if (std::vector<OpStep> steps = op_steps(info, op.attrs, in, false); !steps.empty())
        bwd_ws_[o] = steps_peak_workspace(steps, fresh);
    }
    bytes_.resize(3 * n_);
    for (int t = 0; t < n_; ++t)
      bytes_[t] = bytes_[n_ + t] = g.tensors[t].type.bytes(),
      bytes_[2 * n_ + t] = grad_bytes(g.tensors[t].type);
  }

  LayerOption evaluate(const std::vector<bool>& rec) {
    LayerOption opt{rec, 0, 0, 0};
    for (size_t o = 0; o < g_.ops.size(); ++o)
      if (rec[o]) opt.cost += cost_[o];
    mark_saved(rec);
    for (int t = 0; t < n_; ++t)
      if (saved_[t]) opt.kept_bytes += bytes_[t];
    // The slots' lives, then the bytes live at each event.
    opt.working_bytes = peak(lives(rec));
    return opt;
  }

  // The least working bytes of any mask: the forward's events are the same under every mask,
  // and each value lives at least until its last use there (a kept one longer).
  int64_t forward_floor() {
    walk_forward_once();
    born_ = forward_born_, last_ = forward_last_, ws_at_ = forward_ws_;
    return peak(static_cast<int>(g_.ops.size()) + 1);
  }

  // A decoder layer split at op `mid` into its attention half (A: ops before mid) and its MLP
  // half (B). The events fall in seven phases, each with one active half: the forward of A (and
  // the block inputs), of B; the backward's start (A's, by convention); A's re-run ops, B's; the
  // backward of B, of A. A slot is internal to a half when its tensor is made and read there
  // only (block inputs count as A's), a boundary slot otherwise. An internal slot of the
  // inactive half is neither born nor freed in a phase, so its bytes stay constant there; the
  // boundary slots live as the ops touching their tensors decide (the split's configuration).
  // So, with that configuration fixed, the bytes at an event are the active half's (its internal
  // and the boundary slots, and the op's workspace) plus the inactive half's constant, and the
  // working bytes of a whole mask are max over phases of (A's figure + B's figure): for each half
  // its largest active bytes in the phases where it is active, its constant in the others.
  static constexpr int kPhases = 7;
  static constexpr int64_t kNoEvent = std::numeric_limits<int64_t>::min() / 8;
  static constexpr int kActive[kPhases] = {0, 1, 0, 0, 1, 1, 0};
  struct HalfFigures {
    int64_t kept = 0;  // the boundary tensors' kept bytes count in A's
    double cost = 0;
    std::array<int64_t, kPhases> v{};
  };

  // The working bytes of a mask from its halves' figures (the same configuration).
  static int64_t working(const HalfFigures& a, const HalfFigures& b) {
    int64_t most = std::numeric_limits<int64_t>::min();
    for (int ph = 0; ph < kPhases; ++ph) most = std::max(most, a.v[ph] + b.v[ph]);
    return most;
  }

  void split_at(int mid) {
    mid_ = mid;
    std::vector<int> made(n_, 0), read_a(n_, 0), read_b(n_, 0);
    for (int t = 0; t < n_; ++t) made[t] = g_.tensors[t].producer >= mid ? 1 : 0;
    for (size_t o = 0; o < g_.ops.size(); ++o)
      for (int t : g_.ops[o].inputs) (static_cast<int>(o) < mid ? read_a : read_b)[t] = 1;
    tensor_half_.assign(n_, 0);
    for (int t = 0; t < n_; ++t)
      tensor_half_[t] = (made[t] == 0 && read_b[t]) || (made[t] == 1 && read_a[t]) ? 2 : made[t];
    for (int h : {0, 1}) {
      half_slots_[h].clear();
      for (int slot = 0; slot < 3 * n_; ++slot)
        if (const int c = tensor_half_[slot % n_]; c == h || c == 2)
          half_slots_[h].push_back({slot, c == h});
    }
  }
  // Whether tensor t is read or made by both halves.
  bool boundary(int t) const { return tensor_half_[t] == 2; }

  // The figures of half h under `rec` (the other half's ops at the configuration's bits).
  HalfFigures half_figures(const std::vector<bool>& rec, int h) {
    HalfFigures f;
    const int n_ops = static_cast<int>(g_.ops.size());
    int counts[2][2] = {{0, 0}, {0, 0}};  // [half][re-run, backward runs]
    for (int o = 0; o < n_ops; ++o) {
      const int half = o < mid_ ? 0 : 1;
      counts[half][0] += rec[o];
      counts[half][1] += runs_[o];
      if (half == h && rec[o]) f.cost += cost_[o];
    }
    mark_saved(rec);
    for (int t = 0; t < n_; ++t)
      if (saved_[t] && (tensor_half_[t] == h || (h == 0 && tensor_half_[t] == 2)))
        f.kept += bytes_[t];
    const int events = lives(rec);
    const int start[kPhases + 1] = {0,
                                    mid_ + 1,
                                    n_ops + 1,
                                    n_ops + 2,
                                    n_ops + 2 + counts[0][0],
                                    n_ops + 2 + counts[0][0] + counts[1][0],
                                    n_ops + 2 + counts[0][0] + counts[1][0] + counts[1][1],
                                    events};
    // Only this half's slots and the boundary slots enter its figures: per event, the bytes of
    // those born and of those last used there; and, for the phases where the other half is
    // active, the bytes of this half's slots alive across the phase's start.
    born_at_.assign(events, 0), dead_at_.assign(events, 0);
    int64_t across[kPhases] = {};
    for (const auto [s, own] : half_slots_[h]) {
      if (born_[s] < 0) continue;
      born_at_[born_[s]] += bytes_[s], dead_at_[last_[s]] += bytes_[s];
      if (own)
        for (int ph = 0; ph < kPhases; ++ph)
          if (kActive[ph] != h && born_[s] < start[ph] && last_[s] >= start[ph])
            across[ph] += bytes_[s];
    }
    int64_t live = 0;  // this half's and the boundary slots' bytes before event `i`
    int i = 0;
    for (int ph = 0; ph < kPhases; ++ph) {
      if (kActive[ph] != h) {  // the inactive half's constant (defined where no event is)
        f.v[ph] = across[ph];
        continue;
      }
      for (; i < start[ph]; ++i) live += born_at_[i] - dead_at_[i];
      int64_t most = kNoEvent;
      for (; i < start[ph + 1]; ++i) {
        live += born_at_[i];
        most = std::max(most, live + ws_at_[i]);
        live -= dead_at_[i];
      }
      f.v[ph] = most;
    }
    return f;
  }

 private:
  // One walk: each slot's birth and last use (born_, last_; -1 for a slot never made) and the
  // workspace bytes at each event (ws_at_); returns the number of events. The forward does not
  // depend on the mask: walked once, its slots and workspaces copied for every mask after.
  int lives(const std::vector<bool>& rec) {
    const int n_ops = static_cast<int>(g_.ops.size());
    int events = n_ops + 2;
    for (int o = 0; o < n_ops; ++o) events += rec[o] + runs_[o];
    auto alloc = [&](int i, int s) { born_[s] = i, last_[s] = std::max(last_[s], i); };
    auto use = [&](int i, int s) { last_[s] = i; };
    auto ws = [&](int i, int64_t w) { ws_at_[i] += w; };
    walk_forward_once();
    born_ = forward_born_, last_ = forward_last_;
    ws_at_.assign(events, 0);
    std::copy(forward_ws_.begin(), forward_ws_.end(), ws_at_.begin());
    walk_backward(rec, n_ops, alloc, use, ws);
    return events;
  }

  // The forward's slots and workspaces (forward_born_, forward_last_, forward_ws_), walked once.
  void walk_forward_once() {
    if (!forward_born_.empty()) return;
    forward_born_.assign(3 * n_, -1), forward_last_.assign(3 * n_, -1);
    forward_ws_.assign(g_.ops.size() + 1, 0);
    std::vector<int> &born = forward_born_, &last = forward_last_;
    walk_forward([&](int i, int s) { born[s] = i, last[s] = std::max(last[s], i); },
                 [&](int i, int s) { last[s] = i; },
                 [&](int i, int64_t w) { forward_ws_[i] += w; });
  }

  // The most bytes live at any of the first `events` events of born_, last_ and ws_at_.
  int64_t peak(int events) {
    free_at_.assign(events, 0), alloc_at_.assign(ws_at_.begin(), ws_at_.begin() + events);
    for (int s = 0; s < 3 * n_; ++s)
      if (born_[s] >= 0) alloc_at_[born_[s]] += bytes_[s], free_at_[last_[s]] += bytes_[s];
    int64_t live = 0, most = 0;
    for (int i = 0; i < events; ++i) {
      live += alloc_at_[i];
      most = std::max(most, live);
      live -= free_at_[i] + ws_at_[i];
    }
    return most;
  }

  // saved_: the values kept for the backward under `rec`.
  void mark_saved(const std::vector<bool>& rec) {
    saved_.assign(n_, 0);
    for (int t = 0; t < n_; ++t) saved_[t] = needed_[t];
    for (size_t o = 0; o < g_.ops.size(); ++o)
      if (rec[o])
        for (int t : g_.ops[o].inputs) saved_[t] = 1;
    for (int t = 0; t < n_; ++t) {
      int p = g_.tensors[t].producer;
      if (saved_[t] && p >= 0 && rec[p]) saved_[t] = 0;
    }
  }

  // The forward: the block inputs at event 0, op o at event o + 1.
  template <typename Alloc, typename Use, typename Ws>
  void walk_forward(Alloc alloc, Use use, Ws ws) {
    int i = 0;
    for (int input : g_.inputs) alloc(i, input);
    for (size_t o = 0; o < g_.ops.size(); ++o) {
      ++i;
      for (int t : g_.ops[o].inputs) use(i, t);
      if (fwd_ws_[o]) ws(i, fwd_ws_[o]);
      for (int t : g_.ops[o].outputs) alloc(i, t);
    }
  }

  // The backward phase under `rec`, after the forward's last event `i`; returns the events.
  template <typename Alloc, typename Use, typename Ws>
  int walk_backward(const std::vector<bool>& rec, int i, Alloc alloc, Use use, Ws ws) {
    ++i;  // the backward phase starts: the incoming gradient; kept values survive until here
    if (g_.hidden_out >= 0) alloc(i, 2 * n_ + g_.hidden_out);
    for (int t = 0; t < n_; ++t)
      if (saved_[t]) use(i, t);
    auto value = [&](int t) {
      int p = g_.tensors[t].producer;
      return p >= 0 && rec[p] ? n_ + t : t;
    };
    for (size_t o = 0; o < g_.ops.size(); ++o) {
      if (!rec[o]) continue;
      ++i;
      for (int t : g_.ops[o].inputs) use(i, value(t));
      if (fwd_ws_[o]) ws(i, fwd_ws_[o]);  // a re-run op allocates its forward scratch again
      for (int t : g_.ops[o].outputs) alloc(i, n_ + t);
    }
    has_grad_.assign(n_, 0);
    if (g_.hidden_out >= 0) has_grad_[g_.hidden_out] = 1;
    for (int o = static_cast<int>(g_.ops.size()) - 1; o >= 0; --o) {
      if (!runs_[o]) continue;
      const GraphOp& op = g_.ops[o];
      const OpInfo& info = op_info(op.kind);
      ++i;
      for (size_t j = 0; j < op.outputs.size(); ++j) {
        if ((info.grad_outputs >> j & 1u) && has_grad_[op.outputs[j]])
          use(i, 2 * n_ + op.outputs[j]);
        if (info.bwd_reads_outputs >> j & 1u) use(i, value(op.outputs[j]));
      }
      for (size_t k = 0; k < op.inputs.size(); ++k)
        if (info.bwd_reads_inputs >> k & 1u) use(i, value(op.inputs[k]));
      if (bwd_ws_[o]) ws(i, bwd_ws_[o]);
      for (size_t k = 0; k < op.inputs.size(); ++k) {
        int t = op.inputs[k];
        if (!(info.grad_inputs >> k & 1u)) continue;
        if (has_grad_[t]) {
          use(i, 2 * n_ + t);
        } else {
          alloc(i, 2 * n_ + t);
          has_grad_[t] = 1;
        }
      }
    }
    return i + 1;
  }

  const BlockGraph& g_;
  const std::vector<double>& cost_;
  const int n_;
  std::vector<bool> runs_, needed_;
  std::vector<int64_t> fwd_ws_, bwd_ws_, bytes_, free_at_, alloc_at_;
  std::vector<int> born_, last_;
  std::vector<int> forward_born_, forward_last_;  // after the forward, any mask (lives)
  std::vector<int64_t> forward_ws_;
  std::vector<char> saved_, has_grad_;
  int mid_ = -1;
  std::vector<int> tensor_half_;  // 0 A, 1 B, 2 boundary
  // Per half: its slots and the boundary slots, each with whether it is the half's own.
  std::array<std::vector<std::pair<int, bool>>, 2> half_slots_;
  std::vector<int64_t> ws_at_;
  std::vector<int64_t> born_at_, dead_at_;  // per event: a half's and the boundary slots' bytes
};

}  // namespace

LayerOption evaluate_option(const BlockGraph& g, const std::vector<bool>& rec,
                            const std::vector<double>& op_cost) {
  return OptionEvaluator(g, op_cost).evaluate(rec);
}

int64_t least_working_bytes(const BlockGraph& g) {
  const std::vector<double> no_cost(g.ops.size(), 0.0);  // the evaluator keeps a reference
  return OptionEvaluator(g, no_cost).forward_floor();
}

namespace {

// Visits every non-wasteful mask that agrees with `base` outside ops [lo, hi) (the ops there are
// chosen freely, except those `forced` gives: 0 or 1, -1 free); stops after `limit` masks and
// returns how many it visited.
size_t visit_masks(const BlockGraph& g, const std::vector<bool>& base, int lo, int hi,
                   size_t limit, const std::function<void(const std::vector<bool>&)>& visit,
                   const std::vector<signed char>* forced = nullptr) {
  const int n_ops = static_cast<int>(g.ops.size());
  const std::vector<bool> needed = backward_reads(g);
  std::vector<int> read_by_rec(g.tensors.size(), 0);
  std::vector<bool> mask(n_ops, false);
  size_t count = 0;
  std::function<void(int)> dfs = [&](int o) {
    if (count >= limit) return;
    if (o < 0) {
      ++count;
      if (visit) visit(mask);
      return;
    }
    auto take = [&](bool on) {
      mask[o] = on;
      if (on)
        for (int t : g.ops[o].inputs) ++read_by_rec[t];
      dfs(o - 1);
      if (on)
        for (int t : g.ops[o].inputs) --read_by_rec[t];
      mask[o] = false;
    };
    if (o < lo || o >= hi) return take(base[o]);
    bool eligible = false;
    for (int t : g.ops[o].outputs) eligible |= needed[t] || read_by_rec[t] > 0;
    const int force = forced ? (*forced)[o] : -1;
    if (force != 1) take(false);
    if (eligible && force != 0) take(true);
  };
  dfs(n_ops - 1);
  return count;
}

}  // namespace

std::vector<LayerOption> enumerate_options(const BlockGraph& g,
                                           const std::vector<double>& op_cost) {
  OptionEvaluator eval(g, op_cost);
  std::vector<LayerOption> out;
  const int n = static_cast<int>(g.ops.size());
  visit_masks(g, std::vector<bool>(n, false), 0, n, SIZE_MAX,
              [&](const std::vector<bool>& m) { out.push_back(eval.evaluate(m)); });
  return out;
}

std::vector<LayerOption> enumerate_all_subsets(const BlockGraph& g,
                                               const std::vector<double>& op_cost) {
  const size_t n_ops = g.ops.size();
  std::vector<LayerOption> out;
  OptionEvaluator eval(g, op_cost);
  for (uint64_t bits = 0; bits < (uint64_t{1} << n_ops); ++bits) {
    std::vector<bool> mask(n_ops);
    for (size_t o = 0; o < n_ops; ++o) mask[o] = bits >> o & 1u;
    out.push_back(eval.evaluate(mask));
  }
  return out;
}

namespace {
bool dominates(const LayerOption& a, const LayerOption& b) {
  return a.kept_bytes <= b.kept_bytes && a.working_bytes <= b.working_bytes && a.cost <= b.cost;
}
}  // namespace

std::vector<LayerOption> pareto_frontier(std::vector<LayerOption> options) {
  std::sort(options.begin(), options.end(), [](const LayerOption& a, const LayerOption& b) {
    if (a.cost != b.cost) return a.cost < b.cost;
    if (a.kept_bytes != b.kept_bytes) return a.kept_bytes < b.kept_bytes;
    return a.working_bytes < b.working_bytes;
  });
  std::vector<LayerOption> front;
  for (LayerOption& o : options) {
    bool beaten = false;
    for (const LayerOption& f : front)
      if (dominates(f, o)) {
        beaten = true;
        break;
      }
    if (!beaten) front.push_back(std::move(o));
  }
  std::sort(front.begin(), front.end(), [](const LayerOption& a, const LayerOption& b) {
    return a.kept_bytes != b.kept_bytes ? a.kept_bytes > b.kept_bytes : a.cost < b.cost;
  });
  return front;
}

std::vector<bool> mla_up_proj_mask(const BlockGraph& g) {
  std::vector<bool> mask(g.ops.size(), false);
  bool mla = false;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const std::string& n = g.ops[i].name;
    mla |= g.ops[i].kind == OpKind::kMlaRope;
    for (const char* prefix : {"attn.q_norm", "attn.q_up", "attn.q.", "attn.kv_norm", "attn.kv_up"})
      if (n.rfind(prefix, 0) == 0) mask[i] = true;
    if (n == "attn.q" || g.ops[i].kind == OpKind::kMlaRope) mask[i] = true;
  }
  return mla ? mask : std::vector<bool>{};
}

std::vector<bool> named_mask(const BlockGraph& g, Recompute r, bool regather) {
  TrainSpec t;
  t.recompute = r;
  t.tp = 2;
  t.sp = true;
  t.tp_recompute_allgather = regather;
  return named_policy(g, t).recompute;
}

int mlp_half(const BlockGraph& g) {
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (g.ops[i].name == "attn.residual") return static_cast<int>(i) + 1;
  return -1;
}

namespace {

// Splits `eval` at the layer's halves; the ops that make or read a boundary tensor (at most 12),
// or nullopt for a block without halves.
std::optional<std::vector<int>> configuration(const BlockGraph& g, OptionEvaluator& eval) {
  const int n = static_cast<int>(g.ops.size()), mid = mlp_half(g);
  if (mid <= 0 || mid >= n) return std::nullopt;
  eval.split_at(mid);
  std::vector<int> config;
  for (int t = 0; t < static_cast<int>(g.tensors.size()); ++t) {
    if (!eval.boundary(t)) continue;
    if (g.tensors[t].producer >= 0) config.push_back(g.tensors[t].producer);
    for (int o = 0; o < n; ++o)
      if (std::find(g.ops[o].inputs.begin(), g.ops[o].inputs.end(), t) != g.ops[o].inputs.end())
        config.push_back(o);
  }
  std::sort(config.begin(), config.end());
  config.erase(std::unique(config.begin(), config.end()), config.end());
  if (config.size() > 12) return std::nullopt;
  return config;
}

struct SplitFrontier {
  std::vector<LayerOption> options;
  size_t choices = 0, evaluated = 0;  // the layer's non-wasteful masks; the halves' evaluated
};

std::optional<SplitFrontier> split_frontier(const BlockGraph& g,
                                            const std::vector<double>& op_cost,
                                            const std::function<bool(const std::vector<bool>&)>& ok) {
  using Figures = OptionEvaluator::HalfFigures;
  const int n = static_cast<int>(g.ops.size()), mid = mlp_half(g);
  OptionEvaluator eval(g, op_cost);
  std::optional<std::vector<int>> ops = configuration(g, eval);
  if (!ops) return std::nullopt;
  const std::vector<int>& config = *ops;
  SplitFrontier out;
  struct Pair {
    int64_t kept, working;
    double cost;
    uint32_t c, a, b;
  };
  auto by_value = [](const Pair& x, const Pair& y) {
    return std::tie(x.cost, x.kept, x.working, x.c, x.a, x.b) <
           std::tie(y.cost, y.kept, y.working, y.c, y.a, y.b);
  };
  // The pairs no other beats on all of (kept, working, cost), in the order sorted.
  auto front = [&](std::vector<Pair>& pairs) {
    std::sort(pairs.begin(), pairs.end(), by_value);
    Staircase<int64_t> stair;
    std::vector<Pair> kept;
    for (const Pair& p : pairs)
      if (stair.admits(p.kept, p.working)) kept.push_back(p);
    pairs = std::move(kept);
  };
  // Each configuration on its own (in parallel, each with its own evaluator), then merged in
  // configuration order.
  struct Config {
    std::array<std::vector<std::vector<bool>>, 2> masks;  // per half: the undominated ones
    std::vector<Pair> pairs;
    size_t choices = 0, evaluated = 0;
  };
  std::vector<Config> configs(size_t{1} << config.size());
  parallel_for(configs.size(), [&](size_t ci) {
    const uint32_t c = static_cast<uint32_t>(ci);
    Config& out_c = configs[ci];
    OptionEvaluator ev(g, op_cost);
    ev.split_at(mid);
    std::vector<bool> base(n, false);
    std::vector<signed char> forced(n, -1);
    for (size_t j = 0; j < config.size(); ++j)
      base[config[j]] = c >> j & 1u, forced[config[j]] = static_cast<signed char>(c >> j & 1u);
    std::array<std::vector<Figures>, 2> figs;
    size_t raw[2] = {0, 0};
    for (int h : {1, 0}) {  // the MLP half first: without its masks, the attention's are not needed
      if (h == 0 && raw[1] == 0) break;
      std::vector<std::pair<std::vector<bool>, Figures>> seen;
      visit_masks(
          g, base, h ? mid : 0, h ? n : mid, SIZE_MAX,
          [&](const std::vector<bool>& mask) {
            if (!ok(mask)) return;
            ++raw[h];
            seen.emplace_back(mask, ev.half_figures(mask, h));
          },
          &forced);
      out_c.evaluated += seen.size();
      // Cheapest first; one whose figures an earlier one's match or beat everywhere goes.
      std::stable_sort(seen.begin(), seen.end(), [](const auto& x, const auto& y) {
        return std::tie(x.second.cost, x.second.kept) < std::tie(y.second.cost, y.second.kept);
      });
      for (auto& [mask, f] : seen) {
        bool beaten = false;
        for (const Figures& k : figs[h]) {
          bool all = k.cost <= f.cost && k.kept <= f.kept;
          for (int ph = 0; all && ph < OptionEvaluator::kPhases; ++ph) all = k.v[ph] <= f.v[ph];
          if (all) {
            beaten = true;
            break;
          }
        }
        if (beaten) continue;
        figs[h].push_back(f);
        out_c.masks[h].push_back(std::move(mask));
      }
    }
    out_c.choices = raw[0] * raw[1];
    for (uint32_t a = 0; a < figs[0].size(); ++a)
      for (uint32_t b = 0; b < figs[1].size(); ++b) {
        const Figures &x = figs[0][a], &y = figs[1][b];
        out_c.pairs.push_back(
            {x.kept + y.kept, OptionEvaluator::working(x, y), x.cost + y.cost, c, a, b});
      }
    front(out_c.pairs);
  });
  std::vector<Pair> best;
  for (const Config& c : configs) {
    out.choices += c.choices, out.evaluated += c.evaluated;
    best.insert(best.end(), c.pairs.begin(), c.pairs.end());
  }
  front(best);
  for (const Pair& p : best) {
    std::vector<bool> mask = configs[p.c].masks[0][p.a];
    for (int o = mid; o < n; ++o) mask[o] = configs[p.c].masks[1][p.b][o];
    LayerOption o = eval.evaluate(mask);
    if (o.kept_bytes != p.kept || o.working_bytes != p.working)
      throw std::logic_error("the layer's halves disagree with its whole evaluation");
    out.options.push_back(std::move(o));
  }
  out.options = pareto_frontier(std::move(out.options));
  return out;
}

}  // namespace

std::optional<int64_t> working_by_halves(const BlockGraph& g, const std::vector<bool>& mask) {
  const int n = static_cast<int>(g.ops.size()), mid = mlp_half(g);
  const std::vector<double> no_cost(g.ops.size(), 0.0);  // the evaluator keeps a reference
  OptionEvaluator eval(g, no_cost);
  std::optional<std::vector<int>> config = configuration(g, eval);
  if (!config) return std::nullopt;
  std::vector<bool> a(n, false), b(n, false);  // each half's ops, the other's configuration's
  for (int o : *config) a[o] = b[o] = mask[o];
  for (int o = 0; o < n; ++o) (o < mid ? a : b)[o] = mask[o];
  return OptionEvaluator::working(eval.half_figures(a, 0), eval.half_figures(b, 1));
}

LayerFrontier layer_frontier(const BlockGraph& g, const TrainSpec& t,
                             const std::vector<double>& op_cost) {
  LayerFrontier lf;
  // --tp-recompute-allgather false: never gather again in backward.
  auto ok = [&](const std::vector<bool>& m) {
    if (t.tp_recompute_allgather) return true;
    for (size_t i = 0; i < g.ops.size(); ++i)
      if (m[i] && (g.ops[i].kind == OpKind::kAllGather || g.ops[i].kind == OpKind::kFp8AllGather))
        return false;
    return true;
  };
  if (std::optional<SplitFrontier> split = split_frontier(g, op_cost, ok)) {
    lf.choices = split->choices;
    lf.evaluated = split->evaluated;
    lf.options = std::move(split->options);
  } else {  // a block without halves: every non-wasteful mask
    std::vector<LayerOption> all = enumerate_options(g, op_cost);
    lf.evaluated = all.size();
    std::erase_if(all, [&](const LayerOption& o) { return !ok(o.recompute); });
    lf.choices = all.size();
    lf.options = pareto_frontier(std::move(all));
  }
  lf.on_hull.assign(lf.options.size(), false);
  for (const LayerOption& v : min_cut_hull(g, op_cost))
    for (size_t i = 0; i < lf.options.size(); ++i)
      if (lf.options[i].kept_bytes == v.kept_bytes &&
          std::abs(lf.options[i].cost - v.cost) <= 1e-12 * std::max(1.0, v.cost))
        lf.on_hull[i] = true;
  struct Named {
    const char* name;
    Recompute r;
    bool regather;
  };
  std::vector<Named> named = {{"none", Recompute::kNone, false},
                              {"selective", Recompute::kSelective, false},
                              {"full (nanotron recompute_layer)", Recompute::kFull, false}};
  if (t.sp && t.tp_recompute_allgather) {
    named.insert(named.begin() + 1, {"none + tp_recompute_allgather", Recompute::kNone, true});
    named.insert(named.begin() + 3,
                 {"selective + tp_recompute_allgather", Recompute::kSelective, true});
  }
  // torchtitan's per-op policy is named where its layer is torchtitan's (the profile whose
  // matmuls its every-second-mm rule counts). Its point is its re-run ops' option: the outputs
  // its cache holds unread (under TP the row-parallel ones) are in a schedule of the policy
  // itself (--recompute selective-op, caches_outputs), not here nor in an auto plan's layers.
  if (t.impl == Impl::kTorchtitan && g.kind == BlockKind::kLayer)
    named.push_back({t.tp > 1 ? "selective-op (torchtitan; its unread cached outputs aside)"
                              : "selective-op (torchtitan)",
                     Recompute::kSelectiveOp, false});
  std::vector<std::pair<std::string, std::vector<bool>>> masks;
  for (const Named& nm : named) masks.emplace_back(nm.name, named_mask(g, nm.r, nm.regather));
  if (std::vector<bool> up = mla_up_proj_mask(g); !up.empty())
    masks.emplace_back("Megatron's mla_up_proj", std::move(up));
  for (const auto& [name, mask] : masks) {
    NamedPoint p{name, evaluate_option(g, mask, op_cost)};
    for (size_t i = 0; i < lf.options.size(); ++i) {
      const LayerOption& f = lf.options[i];
      bool equal = f.kept_bytes == p.option.kept_bytes &&
                   f.working_bytes == p.option.working_bytes && f.cost == p.option.cost;
      if (equal && p.on_frontier < 0) p.on_frontier = static_cast<int>(i);
      if (!equal && dominates(f, p.option) && p.dominated_by < 0)
        p.dominated_by = static_cast<int>(i);
    }
    lf.named.push_back(std::move(p));
  }
  return lf;
}

}  // namespace np
