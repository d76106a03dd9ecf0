// Parameters of a rank: statics in the contract's order, initial values staged on the host and
// copied in, ZeRO's buckets and gathered buffers, updates through the backend.
#include "executor/params.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "executor/bf16.hpp"
#include "executor/fp8.hpp"
#include "executor/init.hpp"
#include "planner/schedule/contract.hpp"

namespace np::exec {

ParamStore::ParamStore(const Schedule& s, int64_t stage, int64_t tp_rank, Backend& be,
                       Communicator& comm)
    : s_(s), p_(s.stages.at(stage)), stage_(stage), tp_rank_(tp_rank), be_(be), comm_(comm) {}

void ParamStore::allocate(const Allocate& alloc, uint64_t seed) {
  const int zero = s_.setup.zero;
  weights_.assign(p_.blocks.size(), {});
  wgrads_.assign(p_.blocks.size(), {});
  if (s_.setup.fsdp) return allocate_fsdp(alloc, seed);
  std::vector<uint16_t> host;
  auto init = [&](const Member& m) {  // the member's global initial values, on the host
    const StageBlock& blk = p_.blocks[m.block];
    const GraphOp& op = blk.graph->ops[m.op];
    TensorType type{op.weights[m.w].shape, Dtype::kBf16};
    host.assign(static_cast<size_t>(type.elements()), 0);
    init_weight(Tensor{host.data(), type}, blk, op, m.w, {s_.setup.tp, tp_rank_, comm_.ep_rank()},
                seed);
  };
  for (size_t b = 0; b < p_.blocks.size(); ++b) {
    const StageBlock& blk = p_.blocks[b];
    weights_[b].resize(blk.graph->ops.size());
    for (size_t o = 0; o < blk.graph->ops.size(); ++o) {
      const GraphOp& op = blk.graph->ops[o];
      if (!op.attrs.tie.empty() && tie_owner_.count(op.attrs.tie)) continue;
      if (!op.attrs.tie.empty()) tie_owner_[op.attrs.tie] = {b, o};
      for (size_t w = 0; w < op.weights.size(); ++w) {
        TensorType type{op.weights[w].shape, Dtype::kBf16};
        Group& g = op.expert_weights ? expert_ : dense_;
        Member m{static_cast<int>(b), static_cast<int>(o), static_cast<int>(w), g.n,
                 type.elements(), {}};
        if (zero < 3) {
          m.weight = alloc(type, static_weight_name(blk, op, w), Category::kWeight);
          init(m);
          be_.copy_from_host(m.weight, host.data());
        }
        weights_[b][o].push_back(m.weight);  // ZeRO-3: bound to the gathered buffer later
        g.members.push_back(m);
        g.n += m.n;
      }
    }
  }
  for (Group* g : {&dense_, &expert_}) {
    g->blocks.assign(p_.blocks.size(), {0, 0});
    for (const Member& m : g->members) {
      auto& [first, n] = g->blocks[static_cast<size_t>(m.block)];
      if (n == 0) first = m.off;
      n += m.n;
    }
  }
  // Tied copies (multi-token prediction's embedding and LM head), after each block's own weights.
  for (size_t b = 0; b < p_.blocks.size(); ++b) {
    int64_t at = block_elements(static_cast<int>(b));  // the copies so far are other blocks'
    for (size_t o = 0; o < p_.blocks[b].graph->ops.size(); ++o) {
      const GraphOp& op = p_.blocks[b].graph->ops[o];
      if (op.attrs.tie.empty() || tie_owner_.at(op.attrs.tie) == std::pair{b, o}) continue;
      auto [ob, oo] = tie_owner_.at(op.attrs.tie);
      for (size_t i = 0; i < dense_.members.size(); ++i) {
        const Member& m = dense_.members[i];
        if (static_cast<size_t>(m.block) != ob || static_cast<size_t>(m.op) != oo) continue;
        copies_.push_back({static_cast<int>(b), static_cast<int>(o), m.w, i, at});
        at += m.n;
      }
    }
  }
  allocate_group(dense_, "dense", alloc);
  allocate_group(expert_, "expert", alloc);
  for (Group* g : {&dense_, &expert_})
    for (const Member& m : g->members) {
      auto [a, z] = held(*g, m);
      if (z <= a) continue;
      if (zero == 3) {  // this rank's part of the weight, from the same global initial values
        init(m);
        be_.copy_from_host(slice(g->shard_weights, m.off + a - g->lo, {z - a}), host.data() + a);
      }
      if (g->master)  // fp32 master weights of the owned elements
        be_.copy_elements(g->master, m.off + a - g->lo, zero == 3 ? g->shard_weights : m.weight,
                          zero == 3 ? m.off + a - g->lo : a, z - a);
    }
  for (size_t b = 0; b < p_.blocks.size(); ++b) {
    wgrads_[b].resize(weights_[b].size());
    for (size_t o = 0; o < weights_[b].size(); ++o) {
      const GraphOp& op = p_.blocks[b].graph->ops[o];
      if (weights_[b][o].empty() && !op.attrs.tie.empty()) {  // tied: share the owner's tensors
        auto [ob, oo] = tie_owner_.at(op.attrs.tie);
        weights_[b][o] = weights_[ob][oo];
      }
      wgrads_[b][o].assign(weights_[b][o].size(), Tensor{});
    }
  }
  if (zero >= 2) return;  // gradients go to the blocks' buckets (bind_bucket)
  for (const Group* g : {&dense_, &expert_})
    for (const Member& m : g->members) {
      Tensor view = slice(g->grad, m.off, m.weight.type.shape);
      for (size_t b = 0; b < p_.blocks.size(); ++b)  // the owner, and its tied copies
        for (size_t o = 0; o < weights_[b].size(); ++o)
          if (static_cast<size_t>(m.w) < weights_[b][o].size() &&
              weights_[b][o][m.w].data == m.weight.data)
            wgrads_[b][o][m.w] = view;
    }
}

void ParamStore::allocate_group(Group& g, const std::string& name, const Allocate& alloc) {
  if (g.n == 0) return;
  const TrainSpec& t = s_.setup;
  Dtype gd = t.grad_dtype;
  g.shard = g.n, g.lo = 0, g.hi = g.n;
  if (t.zero >= 1) {
    // dp x cp ranks (dense) or dp x cp / ep (experts), as the planner
    g.shard = (g.n + comm_.group_size(g.dp) - 1) / comm_.group_size(g.dp);
    g.lo = std::min(g.n, comm_.group_rank(g.dp) * g.shard), g.hi = std::min(g.n, g.lo + g.shard);
  }
  if (t.zero >= 3) {
    g.shard_weights = alloc({{g.shard}, Dtype::kBf16}, "weights." + name + " (ZeRO-3 shard, bf16)",
                            Category::kWeight);
    be_.fill(g.shard_weights, 0.0f);
  }
  g.grad = alloc({{t.zero >= 2 ? g.shard : g.n}, gd},
                 "grad_buffer." + name + " (" + name_of(gd) + ")", Category::kGradient);
  be_.fill(g.grad, 0.0f);
  if (t.optimizer == Optimizer::kNone) return;
  g.master = alloc({{g.shard}, Dtype::kFp32}, "optimizer.master." + name + " (fp32)",
                   Category::kOptimizer);
  be_.fill(g.master, 0.0f);
  if (t.optimizer != Optimizer::kAdamW) return;
  g.m = alloc({{g.shard}, Dtype::kFp32}, "optimizer.exp_avg." + name + " (fp32)",
              Category::kOptimizer);
  g.v = alloc({{g.shard}, Dtype::kFp32}, "optimizer.exp_avg_sq." + name + " (fp32)",
              Category::kOptimizer);
  be_.fill(g.m, 0.0f);
  be_.fill(g.v, 0.0f);
}

std::pair<int64_t, int64_t> ParamStore::held(const Group& g, const Member& m) {
  return {std::clamp(g.lo - m.off, int64_t{0}, m.n), std::clamp(g.hi - m.off, int64_t{0}, m.n)};
}

int64_t ParamStore::block_elements(int block) const {
  int64_t n = block_range(dense_, block).second + block_range(expert_, block).second;
  for (const Copy& c : copies_)
    if (c.block == block) n += dense_.members[c.member].n;
  return n;
}

Tensor ParamStore::block_part(const Tensor& buffer, int block, const Group& g) const {
  int64_t before = &g == &expert_ ? block_range(dense_, block).second : 0;
  return slice(buffer, before, {block_range(g, block).second});
}

void ParamStore::bind_views(int block, const Tensor& buffer, bool grads) {
  for (const Group* g : {&dense_, &expert_}) {
    Tensor part = block_part(buffer, block, *g);
    int64_t first = block_range(*g, block).first;
    for (const Member& m : g->members) {
      if (m.block != block) continue;
      const GraphOp& op = p_.blocks[block].graph->ops[m.op];
      (grads ? wgrads_ : weights_)[block][m.op][m.w] =
          slice(part, m.off - first, op.weights[m.w].shape);
    }
  }
}

void ParamStore::bind_bucket(int block, const Tensor& bucket) {
  be_.fill(bucket, 0.0f);
  bind_views(block, bucket, true);
  for (const Copy& c : copies_)
    if (c.block == block)
      wgrads_[block][c.op][c.w] =
          slice(bucket, c.at, p_.blocks[block].graph->ops[c.op].weights[c.w].shape);
}

void ParamStore::reduce_bucket(int block, const Tensor& bucket) {
  // Replicated weights applied to sequence shards have partial gradients per TP rank: summed over
  // TP in the bucket first (every TP rank holds them at the same place).
  for (size_t o = 0; o < p_.blocks[block].graph->ops.size(); ++o)
    if (p_.blocks[block].graph->ops[o].tp_partial_weight_grads)
      for (const Tensor& g : wgrads_[block][o]) comm_.all_reduce(g);
  for (const Group* g : {&dense_, &expert_}) {
    auto [first, n] = block_range(*g, block);
    if (n > 0) comm_.dp_reduce_scatter_into(g->dp, block_part(bucket, block, *g), first, g->shard, g->grad);
  }
  for (const Copy& c : copies_) {  // summed into the owner's elements
    if (c.block != block) continue;
    const Member& m = dense_.members[c.member];
    comm_.dp_reduce_scatter_into(dense_.dp, slice(bucket, c.at, {m.n}), m.off, dense_.shard,
                                 dense_.grad);
  }
}

void ParamStore::gather_block(int block, const Tensor& gathered) {
  for (const Group* g : {&dense_, &expert_}) {
    auto [first, n] = block_range(*g, block);
    if (n == 0) continue;
    Tensor part = block_part(gathered, block, *g);
    int64_t a = std::max(first, g->lo), z = std::min(first + n, g->hi);
    if (z > a) be_.copy_elements(part, a - first, g->shard_weights, a - g->lo, z - a);
    comm_.dp_all_gather(g->dp, part, first, g->shard);
  }
  bind_views(block, gathered, false);
  for (const Copy& c : copies_) {  // the owner's elements, gathered again into the copy's place
    if (c.block != block) continue;
    const Member& m = dense_.members[c.member];
    Tensor part = slice(gathered, c.at, {m.n});
    int64_t a = std::max(m.off, dense_.lo), z = std::min(m.off + m.n, dense_.hi);
    if (z > a) be_.copy_elements(part, a - m.off, dense_.shard_weights, a - dense_.lo, z - a);
    comm_.dp_all_gather(dense_.dp, part, m.off, dense_.shard);
    weights_[block][c.op][c.w] =
        slice(gathered, c.at, p_.blocks[block].graph->ops[c.op].weights[c.w].shape);
  }
}

void ParamStore::sync_gradients() {
  // Every bucket (ZeRO-2/3) or unit (FSDP2) was reduced after its block's backward.
  if (s_.setup.zero >= 2 || s_.setup.fsdp) return;
  for (size_t b = 0; b < p_.blocks.size(); ++b)
    for (size_t o = 0; o < p_.blocks[b].graph->ops.size(); ++o)
      if (p_.blocks[b].graph->ops[o].tp_partial_weight_grads)
        for (const Tensor& g : wgrads_[b][o]) comm_.all_reduce(g);
  // Tied embeddings, or multi-token prediction's embedding, with pp > 1: the first and the last
  // stage hold copies; both apply the sum (Megatron's embedding group).
  int64_t last = s_.setup.pp - 1;
  const bool copies = s_.model.tie_embeddings || mtp_depths(s_.model, s_.setup) > 0;
  if (copies && last > 0 && tie_owner_.count("embedding")) {
    auto [b, o] = tie_owner_.at("embedding");
    comm_.all_reduce_with(wgrads_[b][o][0], stage_ == 0 ? last : 0);
  }
  for (Group* g : {&dense_, &expert_}) {
    if (g->n == 0) continue;
    if (s_.setup.zero >= 1)
      comm_.dp_reduce_scatter(g->dp, g->grad, 0, g->shard);
    else
      comm_.dp_all_reduce(g->dp, g->grad);
  }
}

std::map<std::string, std::vector<float>> ParamStore::capture_gradients() const {
  std::map<std::string, std::vector<float>> out;
  std::vector<unsigned char> host;
  if (s_.setup.fsdp) {  // each unit's gradient shard: this rank's rows of every parameter
    const int64_t r = fsdp_index();
    for (size_t b = 0; b < units_.size(); ++b) {
      const FsdpUnit& u = units_[b];
      if (!u.grad) continue;
      host.resize(static_cast<size_t>(u.grad.bytes()));
      be_.copy_to_host(host.data(), u.grad);
      Tensor h{host.data(), u.grad.type};
      for (const FsdpParam& f : u.params) {
        const GraphOp& op = p_.blocks[b].graph->ops[f.op];
        bool sharded = weight_shard(op.kind, op.weights[f.w].suffix) != Shard::kReplicated;
        RankShards at{sharded ? s_.setup.tp : 1, sharded ? tp_rank_ : 0, comm_.ep_rank()};
        std::vector<float>& v = out[weight_key(p_.blocks[b], op, f.w)];
        v.assign(static_cast<size_t>(f.rows * f.cols * at.tp), std::nanf(""));
        for (int64_t i = 0; i < f.chunk * f.cols; ++i) {
          const int64_t e = r * f.chunk * f.cols + i;
          if (e < f.rows * f.cols) v[global_weight_index(op, f.w, e, at)] = load(h, f.in_shard + i);
        }
      }
    }
    return out;
  }
  for (const Group* g : {&dense_, &expert_}) {
    if (g->n == 0) continue;
    // ZeRO-1/2/3: only the part whose optimizer states this rank holds has the DP sum.
    const bool sharded_buffer = s_.setup.zero >= 2;
    host.resize(static_cast<size_t>(g->grad.bytes()));
    be_.copy_to_host(host.data(), g->grad);
    Tensor h{host.data(), g->grad.type};
    for (const Member& m : g->members) {
      const GraphOp& op = p_.blocks[m.block].graph->ops[m.op];
      bool sharded = weight_shard(op.kind, op.weights[m.w].suffix) != Shard::kReplicated;
      RankShards at{sharded ? s_.setup.tp : 1, sharded ? tp_rank_ : 0, comm_.ep_rank()};
      std::vector<float>& v = out[weight_key(p_.blocks[m.block], op, m.w)];
      v.assign(static_cast<size_t>(m.n * at.tp * (op.expert_weights ? s_.setup.ep : 1)),
               std::nanf(""));
      auto [a, z] = held(*g, m);
      for (int64_t i = a; i < z; ++i)
        v[global_weight_index(op, m.w, i, at)] =
            load(h, (sharded_buffer ? m.off - g->lo : m.off) + i);
    }
  }
  return out;
}

void ParamStore::optimizer_step(int step, float lr) {
  const int zero = s_.setup.zero;
  if (s_.setup.fsdp) {  // each unit's fp32 shard and states, with its gradient shard
    for (FsdpUnit& u : units_) {
      if (u.shard_n > 0 && u.grad && s_.setup.optimizer != Optimizer::kNone) {
        auto part = [&](const Tensor& t) {
          return t ? slice(t, u.shard_off, {u.shard_n}) : Tensor{};
        };
        be_.optimizer_update({.kind = s_.setup.optimizer,
                              .grad = u.grad,
                              .master = part(fsdp_params_),
                              .m = part(fsdp_m_),
                              .v = part(fsdp_v_),
                              .lr = lr,
                              .step = step});
      }
      u.grad = Tensor{};  // set to None: the runner frees it after the step
    }
    return;
  }
  for (Group* g : {&dense_, &expert_}) {
    if (g->n == 0) continue;
    if (s_.setup.optimizer != Optimizer::kNone) {
      auto part = [&](const Tensor& t, int64_t first) {  // elements [lo, hi) of a flat buffer
        return slice(t, first, {g->hi - g->lo});
      };
      if (g->hi > g->lo)
        be_.optimizer_update({.kind = s_.setup.optimizer,
                              .grad = part(g->grad, zero >= 2 ? 0 : g->lo),
                              .master = part(g->master, 0),
                              .m = g->m ? part(g->m, 0) : Tensor{},
                              .v = g->v ? part(g->v, 0) : Tensor{},
                              .lr = lr,
                              .step = step});
      if (zero == 3) {
        if (g->hi > g->lo) be_.copy_elements(g->shard_weights, 0, g->master, 0, g->hi - g->lo);
      } else {
        for (const Member& m : g->members) {
          auto [a, z] = held(*g, m);
          if (z > a) be_.copy_elements(m.weight, a, g->master, m.off + a - g->lo, z - a);
          if (zero >= 1) comm_.dp_all_gather(g->dp, m.weight, m.off, g->shard);
        }
      }
    }
    be_.fill(g->grad, 0.0f);
  }
}

void ParamStore::allocate_fsdp(const Allocate& alloc, uint64_t seed) {
  const int64_t S = fsdp_shards(), r = fsdp_index();
  units_.assign(p_.blocks.size(), {});
  int64_t total = 0;
  for (size_t b = 0; b < p_.blocks.size(); ++b) {
    const StageBlock& blk = p_.blocks[b];
    FsdpUnit& u = units_[b];
    u.shard_off = total;
    weights_[b].resize(blk.graph->ops.size());
    wgrads_[b].resize(blk.graph->ops.size());
    int64_t in_unit = 0, in_unit_b = 0;
    for (size_t o = 0; o < blk.graph->ops.size(); ++o) {
      const GraphOp& op = blk.graph->ops[o];
      weights_[b][o].assign(op.weights.size(), Tensor{});
      wgrads_[b][o].assign(op.weights.size(), Tensor{});
      for (size_t w = 0; w < op.weights.size(); ++w) {
        const int64_t rows = op.weights[w].shape.front(), cols = op.weights[w].elements() / rows;
        const int64_t chunk = (rows + S - 1) / S;
        const bool fp8 = op.attrs.fp8_gathered_weight(w);
        const int64_t eb = fp8 ? 1 : 2;
        u.params.push_back({static_cast<int>(o), static_cast<int>(w), rows, cols, chunk,
                            u.shard_n, in_unit, fp8, u.shard_bytes, in_unit_b, u.bf16_n});
        u.shard_n += chunk * cols;
        in_unit += S * chunk * cols;
        u.shard_bytes += eb * chunk * cols;
        in_unit_b += eb * S * chunk * cols;
        if (fp8) u.fp8 = true;
        else u.bf16_n += chunk * cols;
      }
    }
    total += u.shard_n;
  }
  fsdp_params_ = alloc({{total}, Dtype::kFp32}, "params (FSDP shard, fp32)", Category::kWeight);
  if (s_.setup.optimizer == Optimizer::kAdamW) {
    fsdp_m_ = alloc({{total}, Dtype::kFp32}, "optimizer.exp_avg (FSDP shard, fp32)",
                    Category::kOptimizer);
    fsdp_v_ = alloc({{total}, Dtype::kFp32}, "optimizer.exp_avg_sq (FSDP shard, fp32)",
                    Category::kOptimizer);
    be_.fill(fsdp_m_, 0.0f);
    be_.fill(fsdp_v_, 0.0f);
  }
  // This rank's chunk of every parameter, from the same global initial values as every layout.
  std::vector<float> shard(static_cast<size_t>(total), 0.0f);
  std::vector<uint16_t> host;
  for (size_t b = 0; b < p_.blocks.size(); ++b)
    for (const FsdpParam& f : units_[b].params) {
      const StageBlock& blk = p_.blocks[b];
      const GraphOp& op = blk.graph->ops[f.op];
      host.assign(static_cast<size_t>(f.rows * f.cols), 0);
      init_weight(Tensor{host.data(), {op.weights[f.w].shape, Dtype::kBf16}}, blk, op,
                  static_cast<size_t>(f.w), {s_.setup.tp, tp_rank_, comm_.ep_rank()}, seed);
      for (int64_t i = 0; i < f.chunk * f.cols; ++i) {
        const int64_t g = r * f.chunk * f.cols + i;  // element of the padded parameter
        if (g < f.rows * f.cols)
          shard[static_cast<size_t>(units_[b].shard_off + f.in_shard + i)] =
              bf16_bits_to_f32(host[static_cast<size_t>(g)]);
      }
    }
  if (total > 0) be_.copy_from_host(fsdp_params_, shard.data());
}

void ParamStore::fsdp_copy_in(int block, const Tensor& input) {
  const FsdpUnit& u = units_.at(block);
  if (!u.fp8) {
    if (u.shard_n > 0) be_.copy_elements(input, 0, fsdp_params_, u.shard_off, u.shard_n);
    return;
  }
  for (const FsdpParam& f : u.params)
    if (!f.fp8)
      be_.copy_elements(input, f.in_bf16, fsdp_params_, u.shard_off + f.in_shard, f.chunk * f.cols);
}

// torchao's fsdp_pre_all_gather with dynamic scaling (pytorch/ao 36027d8,
// torchao/float8/fsdp_utils.py; float8_utils.py tensor_to_amax with reduce_amax, amax_to_scale;
// float8_training_tensor.py _ToFloat8ConstrFunc, to_fp8_saturated) on this rank's fp32 chunk,
// zero padding included; the values are formed on the host and stored in the plan's tensors.
// The max over the shard group is a device collective in place on the reduced max.
void ParamStore::fsdp_fp8_cast(int block, int op, int step, const std::vector<Tensor>& made) {
  FsdpUnit& u = units_.at(block);
  auto it = std::find_if(u.params.begin(), u.params.end(),
                         [op](const FsdpParam& f) { return f.op == op && f.fp8; });
  if (it == u.params.end() || made.size() != (step == 0 || step == 4 ? 2u : 1u))
    throw std::logic_error("FSDP float8 cast: no float8 weight or the wrong tensors");
  const FsdpParam& f = *it;
  Fp8Cast& c = u.cast;
  const float fmax = fp8_format(Dtype::kFp8E4m3).max;
  const size_t n = static_cast<size_t>(f.chunk * f.cols);
  switch (step) {
    case 0: {  // |x| and its max
      c.x.resize(n);
      be_.copy_to_host(c.x.data(), slice(fsdp_params_, u.shard_off + f.in_shard, {f.chunk * f.cols}));
      std::vector<float> a(n);
      c.amax = 0.0f;
      for (size_t i = 0; i < n; ++i) a[i] = std::fabs(c.x[i]), c.amax = std::fmax(c.amax, a[i]);
      be_.copy_from_host(made[0], a.data());
      be_.copy_from_host(made[1], &c.amax);
      break;
    }
    case 1:  // all_reduce(amax, "MAX") over the shard group (HSDP: the replicas are equal)
      be_.copy_from_host(made[0], &c.amax);
      comm_.dp_all_reduce_max(DpGroup::kDense, made[0]);
      be_.copy_to_host(&c.amax, made[0]);
      break;
    case 2:  // amax_to_scale: max / clamp(amax, 1e-12) in fp64, to fp32
      c.scale = static_cast<float>(double(fmax) / std::fmax(double(c.amax), 1e-12));
      c.scale_t = made[0];
      be_.copy_from_host(made[0], &c.scale);
      break;
    case 3:  // x.to(float32) * scale (x is fp32: no copy)
      c.scaled.resize(n);
      for (size_t i = 0; i < n; ++i) c.scaled[i] = c.x[i] * c.scale;
      be_.copy_from_host(made[0], c.scaled.data());
      break;
    default: {  // the clamp and the e4m3 shard
      std::vector<float> clamped(n);
      std::vector<uint8_t> q(n);
      for (size_t i = 0; i < n; ++i) {
        clamped[i] = std::fmin(std::fmax(c.scaled[i], -fmax), fmax);
        q[i] = f32_to_fp8(clamped[i], Dtype::kFp8E4m3);
      }
      be_.copy_from_host(made[0], clamped.data());
      be_.copy_from_host(made[1], q.data());
      u.fp8_shards[op] = {made[1], c.scale_t};
      c = Fp8Cast{};
    }
  }
}

// HSDP (dp_replicate > 1): the shard group is the replica's, group ranks rep x S .. rep x S + S - 1
// of the data-parallel group (torchtitan's mesh ["dp_replicate", "dp_shard"], CP inside the
// shard). The collectives run over shard groups of S ranks on the device (comm.hpp,
// dp_all_gather_blocks and dp_reduce_scatter_blocks_into): this rank's chunks placed at its
// index in the flat output, the shard group's gathered; each rank's gradient chunk summed over
// every rank (the shard group's reduce-scatter, then the replicas' all-reduce). Without HSDP the
// shard group is the whole group.
void ParamStore::fsdp_all_gather(int block, const Tensor& input, const Tensor& flat) {
  const FsdpUnit& u = units_.at(block);
  if (u.shard_n == 0) return;
  if (u.fp8) return fsdp_all_gather_bytes(block, input, flat);
  const int64_t g = comm_.group_rank(DpGroup::kDense), S = fsdp_shards();
  be_.copy_elements(flat, g % S * u.shard_n, input, 0, u.shard_n);
  comm_.dp_all_gather_blocks(DpGroup::kDense, flat, u.shard_n, S);
}

// A unit with float8 weights (all_gather_copy_in over bytes): this rank's shard assembled in
// parameter order from the float8 shards and the bf16 copy-in, then gathered as bytes.
void ParamStore::fsdp_all_gather_bytes(int block, const Tensor& input, const Tensor& flat) {
  FsdpUnit& u = units_.at(block);
  const int64_t g = comm_.group_rank(DpGroup::kDense), S = fsdp_shards(), B = u.shard_bytes;
  std::vector<uint8_t> bytes(static_cast<size_t>(B));
  uint8_t* mine = bytes.data();
  for (const FsdpParam& f : u.params) {
    if (!f.fp8) {
      be_.copy_to_host(mine + f.in_shard_b, slice(input, f.in_bf16, {f.chunk * f.cols}));
      continue;
    }
    auto it = u.fp8_shards.find(f.op);
    if (it == u.fp8_shards.end()) throw std::logic_error("FSDP float8 all-gather: a weight not cast");
    be_.copy_to_host(mine + f.in_shard_b, it->second.first);
  }
  be_.copy_from_host(Tensor{static_cast<char*>(flat.data) + g % S * B, {{B}, Dtype::kU8}}, mine);
  comm_.dp_all_gather_blocks(DpGroup::kDense, flat, B, S);
}

void ParamStore::fsdp_copy_out(int block, const Tensor& flat, const Tensor& params) {
  FsdpUnit& u = units_.at(block);
  const int64_t S = fsdp_shards();
  if (u.fp8) {  // byte copies; each float8 weight bound with its scale
    std::vector<uint8_t> in(static_cast<size_t>(flat.bytes())), out(static_cast<size_t>(params.bytes()));
    be_.copy_to_host(in.data(), flat);
    for (const FsdpParam& f : u.params) {
      const int64_t eb = f.fp8 ? 1 : 2, n = eb * f.chunk * f.cols;
      for (int64_t q = 0; q < S; ++q)
        std::memcpy(out.data() + f.in_unit_b + q * n, in.data() + q * u.shard_bytes + f.in_shard_b,
                    static_cast<size_t>(n));
      const std::vector<int64_t>& shape = p_.blocks[block].graph->ops[f.op].weights[f.w].shape;
      Tensor w{static_cast<char*>(params.data) + f.in_unit_b,
               {shape, f.fp8 ? Dtype::kFp8E4m3 : Dtype::kBf16}};
      if (!f.fp8) {
        weights_[block][f.op][f.w] = w;
        continue;
      }
      std::vector<Tensor>& ws = weights_[block][f.op];  // the weights, then the scale
      ws.resize(p_.blocks[block].graph->ops[f.op].weights.size());
      ws[static_cast<size_t>(f.w)] = w;
      ws.push_back(u.fp8_shards.at(f.op).second);
      u.fp8_shards.erase(f.op);
    }
    be_.copy_from_host(params, out.data());
    return;
  }
  for (const FsdpParam& f : u.params) {
    for (int64_t q = 0; q < S; ++q)
      be_.copy_elements(params, f.in_unit + q * f.chunk * f.cols, flat,
                        q * u.shard_n + f.in_shard, f.chunk * f.cols);
    weights_[block][f.op][f.w] =
        slice(params, f.in_unit, p_.blocks[block].graph->ops[f.op].weights[f.w].shape);
  }
}

int64_t ParamStore::fsdp_staging_elements() const {
  int64_t most = 0;
  for (const StageBlock& b : p_.blocks)
    for (const GraphOp& op : b.graph->ops) {
      int64_t n = 0;
      for (const WeightShape& w : op.weights) n += w.elements();
      most = std::max(most, n);
    }
  return most;
}

void ParamStore::fsdp_stage_grads(int block, int op) {
  const GraphOp& g = p_.blocks[block].graph->ops[op];
  if (!staging_) throw std::logic_error("FSDP: no gradient staging buffer");
  int64_t at = 0;
  for (size_t w = 0; w < g.weights.size(); ++w) {
    wgrads_[block][op][w] = slice(staging_, at, g.weights[w].shape);
    at += g.weights[w].elements();
  }
  if (at > 0) be_.fill(slice(staging_, 0, {at}), 0.0f);
}

void ParamStore::fsdp_take_grads(int block, int op, const Tensor& grads) {
  const GraphOp& g = p_.blocks[block].graph->ops[op];
  int64_t n = 0;
  for (size_t w = 0; w < g.weights.size(); ++w) {
    n += g.weights[w].elements();
    wgrads_[block][op][w] = Tensor{};
  }
  if (n > 0) be_.copy_elements(grads, 0, staging_, 0, n);
  units_.at(block).op_grads[op] = grads;
}

void ParamStore::fsdp_accumulate(int block, const Tensor* acc) {
  FsdpUnit& u = units_.at(block);
  if (acc) {
    u.acc = *acc;
    be_.fill(u.acc, 0.0f);
  }
  // The CPU executor's memory is the host's: the sum staged there, rounded once to fp32.
  std::vector<float> sum(static_cast<size_t>(u.acc.numel()));
  be_.copy_to_host(sum.data(), u.acc);
  std::vector<uint16_t> g;
  int64_t at = 0;
  for (auto& [op, grads] : u.op_grads) {
    g.resize(static_cast<size_t>(grads.numel()));
    be_.copy_to_host(g.data(), grads);
    for (size_t i = 0; i < g.size(); ++i) sum[static_cast<size_t>(at) + i] += bf16_bits_to_f32(g[i]);
    at += grads.numel();
  }
  be_.copy_from_host(u.acc, sum.data());
  u.op_grads.clear();
}

void ParamStore::fsdp_fill_reduce_input(int block, const Tensor& input) {
  FsdpUnit& u = units_.at(block);
  const int64_t S = fsdp_shards();
  be_.fill(input, 0.0f);
  // Each op's weights' offsets in its gradient tensor, or (PP) in the accumulated gradient,
  // whose ops are in op order, each op's weights in op-table order.
  std::map<int, int64_t> at;
  int64_t acc_at = 0;
  for (const FsdpParam& f : u.params) {
    const Tensor& g = u.acc ? u.acc : u.op_grads.at(f.op);
    const int64_t first = u.acc ? acc_at : at[f.op];
    at[f.op] += f.rows * f.cols, acc_at += f.rows * f.cols;
    for (int64_t q = 0; q < S; ++q) {
      const int64_t rows = std::clamp(f.rows - q * f.chunk, int64_t{0}, f.chunk);
      if (rows == 0) continue;
      const int64_t to = q * u.shard_n + f.in_shard;
      be_.copy_elements(input, to, g, first + q * f.chunk * f.cols, rows * f.cols);
      // Replicated weights applied to sequence shards: partial per TP rank, summed over TP.
      if (p_.blocks[block].graph->ops[f.op].tp_partial_weight_grads)
        comm_.all_reduce(slice(input, to, {rows * f.cols}));
    }
  }
  u.op_grads.clear();
  u.acc = Tensor{};  // read for the last time
}

void ParamStore::fsdp_reduce_scatter(int block, const Tensor& input, const Tensor& shard,
                                     bool first) {
  FsdpUnit& u = units_.at(block);
  be_.fill(shard, 0.0f);
  if (first) u.grad = shard;
  if (u.shard_n == 0) return;
  comm_.dp_reduce_scatter_blocks_into(DpGroup::kDense, input, u.shard_n, fsdp_shards(), u.grad);
}

}  // namespace np::exec
