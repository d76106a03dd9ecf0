// Parameters of a rank: statics in the contract's order, initial values staged on the host and
// copied in, updates through the backend.
#include "executor/params.hpp"

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
  Dtype gd = s_.setup.grad_dtype;
  g.grad = alloc({{g.n}, gd}, "grad_buffer." + name + " (" + name_of(gd) + ")",
                 Category::kGradient);
  be_.fill(g.grad, 0.0f);
  if (s_.setup.optimizer == Optimizer::kNone) return;
  g.master = alloc({{g.n}, Dtype::kFp32}, "optimizer.master." + name + " (fp32)",
                   Category::kOptimizer);
  for (auto& [w, off] : g.members) be_.copy_elements(g.master, off, w, 0, w.numel());
  if (s_.setup.optimizer != Optimizer::kAdamW) return;
  g.m = alloc({{g.n}, Dtype::kFp32}, "optimizer.exp_avg." + name + " (fp32)",
              Category::kOptimizer);
  g.v = alloc({{g.n}, Dtype::kFp32}, "optimizer.exp_avg_sq." + name + " (fp32)",
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
        for (int64_t i = 0; i < g.numel(); ++i)
          v[global_weight_index(op, w, i, tp, sharded ? tp_rank_ : 0)] = load(h, i);
      }
    }
  return out;
}

void ParamStore::optimizer_step(int step, float lr) {
  for (Group* g : {&dense_, &expert_}) {
    if (g->n == 0) continue;
    if (s_.setup.optimizer != Optimizer::kNone) {
      be_.optimizer_update({.kind = s_.setup.optimizer,
                            .grad = g->grad,
                            .master = g->master,
                            .m = g->m,
                            .v = g->v,
                            .lr = lr,
                            .step = step});
      for (auto& [w, off] : g->members) be_.copy_elements(w, 0, g->master, off, w.numel());
    }
    be_.fill(g->grad, 0.0f);
  }
}

}  // namespace np::exec
