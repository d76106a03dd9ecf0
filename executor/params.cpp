// Parameters of a rank: statics in the contract's order, initial values staged on the host and
// copied in, updates through the backend.
#include "executor/params.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "executor/init.hpp"
#include "planner/contract.hpp"

namespace np::exec {

ParamStore::ParamStore(const Schedule& s, int64_t stage, int64_t tp_rank, Backend& be,
                       Communicator& comm)
    : s_(s), p_(s.stages.at(stage)), stage_(stage), tp_rank_(tp_rank), be_(be), comm_(comm) {}

void ParamStore::allocate(const Allocate& alloc, uint64_t seed) {
  weights_.assign(p_.blocks.size(), {});
  wgrads_.assign(p_.blocks.size(), {});
  std::vector<uint16_t> host;
  for (size_t b = 0; b < p_.blocks.size(); ++b) {
    const StageBlock& blk = p_.blocks[b];
    weights_[b].resize(blk.graph->ops.size());
    for (size_t o = 0; o < blk.graph->ops.size(); ++o) {
      const GraphOp& op = blk.graph->ops[o];
      if (!op.attrs.tie.empty() && tie_owner_.count(op.attrs.tie)) continue;
      if (!op.attrs.tie.empty()) tie_owner_[op.attrs.tie] = {b, o};
      for (size_t w = 0; w < op.weights.size(); ++w) {
        TensorType type{op.weights[w].shape, Dtype::kBf16};
        Tensor t = alloc(type, static_weight_name(blk, op, w), Category::kWeight);
        host.assign(static_cast<size_t>(type.elements()), 0);
        init_weight(Tensor{host.data(), type}, blk, op, w, s_.setup.tp, tp_rank_, seed);
        be_.copy_from_host(t, host.data());
        weights_[b][o].push_back(t);
        Group& g = op.expert_weights ? expert_ : dense_;
        g.members.push_back({t, g.n});
        g.n += t.numel();
      }
    }
  }
  allocate_group(dense_, "dense", alloc);
  allocate_group(expert_, "expert", alloc);
  for (size_t b = 0; b < p_.blocks.size(); ++b) {
    wgrads_[b].resize(weights_[b].size());
    for (size_t o = 0; o < weights_[b].size(); ++o) {
      const GraphOp& op = p_.blocks[b].graph->ops[o];
      if (weights_[b][o].empty() && !op.attrs.tie.empty()) {  // tied: share the owner's tensors
        auto [ob, oo] = tie_owner_.at(op.attrs.tie);
        weights_[b][o] = weights_[ob][oo];
      }
      for (const Tensor& w : weights_[b][o]) wgrads_[b][o].push_back(grad_view(w));
    }
  }
}

void ParamStore::allocate_group(Group& g, const std::string& name, const Allocate& alloc) {
  if (g.n == 0) return;
  const TrainSpec& t = s_.setup;
  Dtype gd = t.grad_dtype;
  g.grad = alloc({{g.n}, gd}, "grad_buffer." + name + " (" + name_of(gd) + ")",
                 Category::kGradient);
  be_.fill(g.grad, 0.0f);
  g.shard = g.n, g.lo = 0, g.hi = g.n;
  if (t.zero >= 1) {
    g.shard = (g.n + t.dp - 1) / t.dp;
    g.lo = std::min(g.n, comm_.dp_rank() * g.shard), g.hi = std::min(g.n, g.lo + g.shard);
  }
  if (t.optimizer == Optimizer::kNone) return;
  g.master = alloc({{g.shard}, Dtype::kFp32}, "optimizer.master." + name + " (fp32)",
                   Category::kOptimizer);
  be_.fill(g.master, 0.0f);
  for (auto& [w, off] : g.members) {
    int64_t a = std::max(off, g.lo), b = std::min(off + w.numel(), g.hi);
    if (b > a) be_.copy_elements(g.master, a - g.lo, w, a - off, b - a);
  }
  if (t.optimizer != Optimizer::kAdamW) return;
  g.m = alloc({{g.shard}, Dtype::kFp32}, "optimizer.exp_avg." + name + " (fp32)",
              Category::kOptimizer);
  g.v = alloc({{g.shard}, Dtype::kFp32}, "optimizer.exp_avg_sq." + name + " (fp32)",
              Category::kOptimizer);
  be_.fill(g.m, 0.0f);
  be_.fill(g.v, 0.0f);
}

Tensor ParamStore::grad_view(const Tensor& w) const {
  for (const Group* g : {&dense_, &expert_})
    for (const auto& [member, off] : g->members)
      if (member.data == w.data)
        return Tensor{g->grad.as<unsigned char>() + off * dtype_bytes(g->grad.type.dtype),
                      {w.type.shape, g->grad.type.dtype}};
  throw std::logic_error("weight without a gradient slot");
}

void ParamStore::sync_gradients() {
  for (size_t b = 0; b < p_.blocks.size(); ++b)
    for (size_t o = 0; o < p_.blocks[b].graph->ops.size(); ++o)
      if (p_.blocks[b].graph->ops[o].tp_partial_weight_grads)
        for (const Tensor& g : wgrads_[b][o]) comm_.all_reduce(g);
  // Tied embeddings with pp > 1: the first and the last stage hold copies; both apply the sum.
  int64_t last = s_.setup.pp - 1;
  if (s_.model.tie_embeddings && last > 0 && tie_owner_.count("embedding")) {
    auto [b, o] = tie_owner_.at("embedding");
    comm_.all_reduce_with(wgrads_[b][o][0], stage_ == 0 ? last : 0);
  }
  for (Group* g : {&dense_, &expert_}) {
    if (g->n == 0) continue;
    if (s_.setup.zero >= 1)
      comm_.dp_reduce_scatter(g->grad, 0, g->shard);
    else
      comm_.dp_all_reduce(g->grad);
  }
}

std::map<std::string, std::vector<float>> ParamStore::capture_gradients() const {
  std::map<std::string, std::vector<float>> out;
  std::vector<unsigned char> host;
  for (size_t b = 0; b < p_.blocks.size(); ++b)
    for (size_t o = 0; o < p_.blocks[b].graph->ops.size(); ++o) {
      const GraphOp& op = p_.blocks[b].graph->ops[o];
      for (size_t w = 0; w < wgrads_[b][o].size(); ++w) {
        const Tensor& g = wgrads_[b][o][w];
        bool sharded = weight_shard(op.kind, op.weights[w].suffix) != Shard::kReplicated;
        int64_t tp = sharded ? s_.setup.tp : 1;
        host.resize(static_cast<size_t>(g.bytes()));
        be_.copy_to_host(host.data(), g);
        Tensor h{host.data(), g.type};
        std::vector<float>& v = out[weight_key(p_.blocks[b], op, w)];
        v.assign(static_cast<size_t>(g.numel() * tp), std::nanf(""));
        // ZeRO-1: only the part whose optimizer states this rank holds has the DP sum.
        auto [lo, hi] = held(weights_[b][o][w]);
        for (int64_t i = lo; i < hi; ++i)
          v[global_weight_index(op, w, i, tp, sharded ? tp_rank_ : 0)] = load(h, i);
      }
    }
  return out;
}

std::pair<int64_t, int64_t> ParamStore::held(const Tensor& w) const {
  for (const Group* g : {&dense_, &expert_})
    for (const auto& [member, off] : g->members)
      if (member.data == w.data)
        return {std::clamp(g->lo - off, int64_t{0}, w.numel()),
                std::clamp(g->hi - off, int64_t{0}, w.numel())};
  throw std::logic_error("weight without a gradient slot");
}

void ParamStore::optimizer_step(int step, float lr) {
  for (Group* g : {&dense_, &expert_}) {
    if (g->n == 0) continue;
    if (s_.setup.optimizer != Optimizer::kNone) {
      auto part = [&](const Tensor& t, int64_t first) {  // elements [lo, hi) of a flat buffer
        return Tensor{t.as<unsigned char>() + first * dtype_bytes(t.type.dtype),
                      {{g->hi - g->lo}, t.type.dtype}};
      };
      if (g->hi > g->lo)
        be_.optimizer_update({.kind = s_.setup.optimizer,
                              .grad = part(g->grad, g->lo),
                              .master = part(g->master, 0),
                              .m = g->m ? part(g->m, 0) : Tensor{},
                              .v = g->v ? part(g->v, 0) : Tensor{},
                              .lr = lr,
                              .step = step});
      for (auto& [w, off] : g->members) {
        int64_t a = std::max(off, g->lo), b = std::min(off + w.numel(), g->hi);
        if (b > a) be_.copy_elements(w, a - off, g->master, a - g->lo, b - a);
        if (s_.setup.zero >= 1) comm_.dp_all_gather(w, off, g->shard);
      }
    }
    be_.fill(g->grad, 0.0f);
  }
}

}  // namespace np::exec
