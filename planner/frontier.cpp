// Enumeration of recompute masks with a fast per-mask liveness evaluation, and the 3-D Pareto
// filter. The evaluation replays the block's forward, recompute segment and backward exactly as
// the schedule orders them (tests compare it with the schedule's simulation).
#include "planner/frontier.hpp"

#include <cmath>

#include "planner/mincut.hpp"

#include <algorithm>
#include <functional>

namespace np {
namespace {

struct Event {
  std::vector<int> allocs;  // "slots": tensor t as value t, recomputed value n + t, gradient 2n + t, workspace 3n + k
  std::vector<int> uses;
};

}  // namespace

LayerOption evaluate_option(const BlockGraph& g, const std::vector<bool>& rec, const std::vector<double>& op_cost) {
  const int n = static_cast<int>(g.tensors.size());
  BlockPolicy policy{rec, ""};
  SavedSet saved = saved_set(g, policy);
  LayerOption opt{rec, saved.bytes, 0, 0};
  for (size_t o = 0; o < g.ops.size(); ++o)
    if (rec[o]) opt.cost += op_cost[o];
  std::vector<int64_t> bytes(4 * n + 64, 0);
  for (int t = 0; t < n; ++t) bytes[t] = bytes[n + t] = bytes[2 * n + t] = g.tensors[t].type.bytes();
  std::vector<Event> ev;
  // Forward: block inputs, then each op; a value is live from its producer to its last use.
  ev.push_back({});
  for (int input : g.inputs) ev.back().allocs.push_back(input);
  std::vector<int> value(n);
  for (int t = 0; t < n; ++t) value[t] = t;
  for (const GraphOp& op : g.ops) {
    Event e;
    for (int t : op.inputs) e.uses.push_back(t);
    std::vector<TensorType> in;
    for (int t : op.inputs) in.push_back(g.tensors[t].type);
    int ws = 0;
    for (const TensorType& w : forward_workspace(op_info(op.kind), op.attrs, in)) {
      bytes[3 * n + ws] = w.bytes();
      e.allocs.push_back(3 * n + ws++);
    }
    for (int t : op.outputs) e.allocs.push_back(t);
    ev.push_back(std::move(e));
  }
  size_t forward_end = ev.size();
  // Backward: the incoming gradient, the recompute segment, then backward ops in reverse order.
  Event start;
  if (g.hidden_out >= 0) start.allocs.push_back(2 * n + g.hidden_out);
  for (int t = 0; t < n; ++t)
    if (saved.saved[t]) start.uses.push_back(t);  // kept values survive the forward
  ev.push_back(std::move(start));
  for (size_t o = 0; o < g.ops.size(); ++o) {
    if (!rec[o]) continue;
    Event e;
    for (int t : g.ops[o].inputs) e.uses.push_back(value[t]);
    for (int t : g.ops[o].outputs) {
      value[t] = n + t;
      e.allocs.push_back(n + t);
    }
    ev.push_back(std::move(e));
  }
  std::vector<bool> runs = backward_runs(g), has_grad(n, false);
  if (g.hidden_out >= 0) has_grad[g.hidden_out] = true;
  for (int o = static_cast<int>(g.ops.size()) - 1; o >= 0; --o) {
    if (!runs[o]) continue;
    const GraphOp& op = g.ops[o];
    const OpInfo& info = op_info(op.kind);
    Event e;
    for (size_t j = 0; j < op.outputs.size(); ++j) {
      if ((info.grad_outputs >> j & 1u) && has_grad[op.outputs[j]]) e.uses.push_back(2 * n + op.outputs[j]);
      if (info.bwd_reads_outputs >> j & 1u) e.uses.push_back(value[op.outputs[j]]);
    }
    std::vector<TensorType> in;
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      in.push_back(g.tensors[op.inputs[k]].type);
      if (info.bwd_reads_inputs >> k & 1u) e.uses.push_back(value[op.inputs[k]]);
    }
    int ws = 16;
    for (const TensorType& w : info.bwd_workspace(op.attrs, in)) {
      bytes[3 * n + ws] = w.bytes();
      e.allocs.push_back(3 * n + ws++);
    }
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      int t = op.inputs[k];
      if (!(info.grad_inputs >> k & 1u)) continue;
      if (has_grad[t]) e.uses.push_back(2 * n + t);
      else e.allocs.push_back(2 * n + t), has_grad[t] = true;
    }
    ev.push_back(std::move(e));
  }
  // Liveness: a slot dies after its last use (or its allocation when never used). The forward
  // and backward phases are separate: workspaces and gradients are reused as fresh slots.
  std::vector<int> last(bytes.size(), -1), born(bytes.size(), -1);
  for (int i = 0; i < static_cast<int>(ev.size()); ++i) {
    for (int s : ev[i].allocs) born[s] = i, last[s] = std::max(last[s], i);
    for (int s : ev[i].uses) last[s] = i;
  }
  // Workspace slots are reused across ops: each allocation lives only through its own event.
  int64_t live = 0, peak = 0;
  std::vector<std::vector<int>> dying(ev.size());
  std::vector<char> counted(bytes.size(), 0);
  for (int i = 0; i < static_cast<int>(ev.size()); ++i) {
    for (int s : ev[i].allocs) {
      live += bytes[s];
      if (s >= 3 * n) dying[i].push_back(s);
      else if (!counted[s]) counted[s] = 1, dying[last[s]].push_back(s);
    }
    peak = std::max(peak, live);
    for (int s : dying[i]) live -= bytes[s];
    (void)forward_end;
  }
  opt.working_bytes = peak;
  return opt;
}

std::vector<LayerOption> enumerate_options(const BlockGraph& g, const std::vector<double>& op_cost) {
  const int n_ops = static_cast<int>(g.ops.size());
  const std::vector<bool> needed = backward_reads(g);
  std::vector<int> read_by_rec(g.tensors.size(), 0);
  std::vector<bool> mask(n_ops, false);
  std::vector<LayerOption> out;
  std::function<void(int)> dfs = [&](int o) {
    if (o < 0) {
      out.push_back(evaluate_option(g, mask, op_cost));
      return;
    }
    bool eligible = false;
    for (int t : g.ops[o].outputs) eligible |= needed[t] || read_by_rec[t] > 0;
    dfs(o - 1);
    if (!eligible) return;
    mask[o] = true;
    for (int t : g.ops[o].inputs) ++read_by_rec[t];
    dfs(o - 1);
    for (int t : g.ops[o].inputs) --read_by_rec[t];
    mask[o] = false;
  };
  dfs(n_ops - 1);
  return out;
}

std::vector<LayerOption> enumerate_all_subsets(const BlockGraph& g, const std::vector<double>& op_cost) {
  const size_t n_ops = g.ops.size();
  std::vector<LayerOption> out;
  for (uint64_t bits = 0; bits < (uint64_t{1} << n_ops); ++bits) {
    std::vector<bool> mask(n_ops);
    for (size_t o = 0; o < n_ops; ++o) mask[o] = bits >> o & 1u;
    out.push_back(evaluate_option(g, mask, op_cost));
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

std::vector<bool> named_mask(const BlockGraph& g, Recompute r, bool regather) {
  TrainSpec t;
  t.recompute = r;
  t.tp = 2;
  t.sp = true;
  t.tp_recompute_allgather = regather;
  return named_policy(g, t).recompute;
}

LayerFrontier layer_frontier(const BlockGraph& g, const TrainSpec& t, const std::vector<double>& op_cost) {
  LayerFrontier lf;
  std::vector<LayerOption> all = enumerate_options(g, op_cost);
  if (!t.tp_recompute_allgather)  // --tp-recompute-allgather false: never gather again in backward
    std::erase_if(all, [&](const LayerOption& o) {
      for (size_t i = 0; i < g.ops.size(); ++i)
        if (o.recompute[i] && g.ops[i].kind == OpKind::kAllGather) return true;
      return false;
    });
  lf.evaluated = all.size();
  lf.options = pareto_frontier(std::move(all));
  lf.on_hull.assign(lf.options.size(), false);
  for (const LayerOption& v : min_cut_hull(g, op_cost))
    for (size_t i = 0; i < lf.options.size(); ++i)
      if (lf.options[i].kept_bytes == v.kept_bytes && std::abs(lf.options[i].cost - v.cost) <= 1e-12 * std::max(1.0, v.cost))
        lf.on_hull[i] = true;
  struct Named { const char* name; Recompute r; bool regather; };
  std::vector<Named> named = {{"none", Recompute::kNone, false}, {"selective", Recompute::kSelective, false},
                              {"full (nanotron recompute_layer)", Recompute::kFull, false}};
  if (t.sp && t.tp_recompute_allgather) {
    named.insert(named.begin() + 1, {"none + tp_recompute_allgather", Recompute::kNone, true});
    named.insert(named.begin() + 3, {"selective + tp_recompute_allgather", Recompute::kSelective, true});
  }
  for (const Named& nm : named) {
    NamedPoint p{nm.name, evaluate_option(g, named_mask(g, nm.r, nm.regather), op_cost)};
    for (size_t i = 0; i < lf.options.size(); ++i) {
      const LayerOption& f = lf.options[i];
      bool equal = f.kept_bytes == p.option.kept_bytes && f.working_bytes == p.option.working_bytes && f.cost == p.option.cost;
      if (equal && p.on_frontier < 0) p.on_frontier = static_cast<int>(i);
      if (!equal && dominates(f, p.option) && p.dominated_by < 0) p.dominated_by = static_cast<int>(i);
    }
    lf.named.push_back(std::move(p));
  }
  return lf;
}

}  // namespace np
