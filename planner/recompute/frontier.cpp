// Enumeration of recompute masks with a fast per-mask liveness evaluation, and the 3-D Pareto
// filter. The evaluation replays the block's forward, recompute segment and backward exactly as
// the schedule orders them (tests compare it with the schedule's simulation).
#include "planner/recompute/frontier.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>

#include "planner/recompute/mincut.hpp"

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
      fwd_ws_.push_back(f), bwd_ws_.push_back(b);
    }
    bytes_.resize(3 * n_);
    for (int t = 0; t < n_; ++t)
      bytes_[t] = bytes_[n_ + t] = bytes_[2 * n_ + t] = g.tensors[t].type.bytes();
  }

  LayerOption evaluate(const std::vector<bool>& rec) {
    LayerOption opt{rec, 0, 0, 0};
    for (size_t o = 0; o < g_.ops.size(); ++o)
      if (rec[o]) opt.cost += cost_[o];
    saved_.assign(n_, 0);
    for (int t = 0; t < n_; ++t) saved_[t] = needed_[t];
    for (size_t o = 0; o < g_.ops.size(); ++o)
      if (rec[o])
        for (int t : g_.ops[o].inputs) saved_[t] = 1;
    for (int t = 0; t < n_; ++t) {
      int p = g_.tensors[t].producer;
      if (saved_[t] && p >= 0 && rec[p]) saved_[t] = 0;
      if (saved_[t]) opt.kept_bytes += bytes_[t];
    }
    // Pass 1: birth and last use of every slot; pass 2: bytes live at each event.
    born_.assign(3 * n_, -1), last_.assign(3 * n_, -1);
    int events = walk(
        rec, [&](int i, int s) { born_[s] = i, last_[s] = std::max(last_[s], i); },
        [&](int i, int s) { last_[s] = i; }, [](int, int64_t) {});
    free_at_.assign(events, 0), alloc_at_.assign(events, 0);
    for (int s = 0; s < 3 * n_; ++s)
      if (born_[s] >= 0) free_at_[last_[s]] += bytes_[s];
    walk(
        rec, [&](int i, int s) { alloc_at_[i] += bytes_[s]; }, [](int, int) {},
        [&](int i, int64_t ws) { alloc_at_[i] += ws, free_at_[i] += ws; });
    int64_t live = 0, peak = 0;
    for (int i = 0; i < events; ++i) {
      live += alloc_at_[i];
      peak = std::max(peak, live);
      live -= free_at_[i];
    }
    opt.working_bytes = peak;
    return opt;
  }

 private:
  template <typename Alloc, typename Use, typename Ws>
  int walk(const std::vector<bool>& rec, Alloc alloc, Use use, Ws ws) {
    int i = 0;
    for (int input : g_.inputs) alloc(i, input);
    for (size_t o = 0; o < g_.ops.size(); ++o) {
      ++i;
      for (int t : g_.ops[o].inputs) use(i, t);
      if (fwd_ws_[o]) ws(i, fwd_ws_[o]);
      for (int t : g_.ops[o].outputs) alloc(i, t);
    }
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
  std::vector<char> saved_, has_grad_;
};

}  // namespace

LayerOption evaluate_option(const BlockGraph& g, const std::vector<bool>& rec,
                            const std::vector<double>& op_cost) {
  return OptionEvaluator(g, op_cost).evaluate(rec);
}

namespace {

// Visits every non-wasteful mask that agrees with `base` outside ops [lo, hi) (the ops there are
// chosen freely); stops after `limit` masks and returns how many it visited.
size_t visit_masks(const BlockGraph& g, const std::vector<bool>& base, int lo, int hi,
                   size_t limit, const std::function<void(const std::vector<bool>&)>& visit) {
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
    take(false);
    if (eligible) take(true);
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

size_t count_options(const BlockGraph& g, size_t limit) {
  const int n = static_cast<int>(g.ops.size());
  return visit_masks(g, std::vector<bool>(n, false), 0, n, limit, nullptr);
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

// The candidates of a layer whose choices are too many to enumerate: each half's non-wasteful
// masks with the other half at none and at full recompute, each half's Pareto-best kept, then
// every pairing of a best first half with a best second half, plus the min-cut hull's vertices.
std::vector<LayerOption> half_candidates(const BlockGraph& g, const std::vector<double>& op_cost,
                                         const std::function<bool(const std::vector<bool>&)>& ok) {
  const int n = static_cast<int>(g.ops.size()), mid = mlp_half(g);
  OptionEvaluator eval(g, op_cost);
  std::vector<bool> none(n, false), full = named_mask(g, Recompute::kFull, false);
  auto best_of_half = [&](int lo, int hi) {
    std::vector<LayerOption> seen;
    for (const std::vector<bool>* other : {&none, &full})
      visit_masks(g, *other, lo, hi, SIZE_MAX, [&](const std::vector<bool>& m) {
        if (ok(m)) seen.push_back(eval.evaluate(m));
      });
    std::vector<std::vector<bool>> halves;
    for (const LayerOption& o : pareto_frontier(std::move(seen)))
      halves.emplace_back(o.recompute.begin() + lo, o.recompute.begin() + hi);
    std::sort(halves.begin(), halves.end());
    halves.erase(std::unique(halves.begin(), halves.end()), halves.end());
    return halves;
  };
  std::vector<std::vector<bool>> first = best_of_half(0, mid), second = best_of_half(mid, n);
  std::vector<LayerOption> out;
  std::vector<bool> m(n);
  for (const std::vector<bool>& a : first)
    for (const std::vector<bool>& b : second) {
      std::copy(a.begin(), a.end(), m.begin());
      std::copy(b.begin(), b.end(), m.begin() + mid);
      if (ok(m)) out.push_back(eval.evaluate(m));
    }
  for (const LayerOption& v : min_cut_hull(g, op_cost))
    if (ok(v.recompute)) out.push_back(eval.evaluate(v.recompute));
  return out;
}

}  // namespace

LayerFrontier layer_frontier(const BlockGraph& g, const TrainSpec& t,
                             const std::vector<double>& op_cost, size_t exhaustive_limit) {
  LayerFrontier lf;
  // --tp-recompute-allgather false: never gather again in backward.
  auto ok = [&](const std::vector<bool>& m) {
    if (t.tp_recompute_allgather) return true;
    for (size_t i = 0; i < g.ops.size(); ++i)
      if (m[i] && g.ops[i].kind == OpKind::kAllGather) return false;
    return true;
  };
  std::vector<LayerOption> all;
  lf.choices = count_options(g, exhaustive_limit + 1);
  if (lf.choices <= exhaustive_limit || mlp_half(g) < 0) {
    all = enumerate_options(g, op_cost);
    std::erase_if(all, [&](const LayerOption& o) { return !ok(o.recompute); });
  } else {
    lf.exhaustive = false;
    all = half_candidates(g, op_cost, ok);
  }
  lf.evaluated = all.size();
  lf.options = pareto_frontier(std::move(all));
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
