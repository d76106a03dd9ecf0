// The schedule interpreter: one RankRunner per (stage, TP rank) thread.
#include "executor/runner.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include "executor/comm/inproc.hpp"
#include "executor/init.hpp"
#include "planner/simulate.hpp"
#include "planner/units.hpp"

namespace np::exec {
namespace {

struct Shared {
  Shared(const Schedule& sched, const RunOptions& o)
      : s(sched), opt(o), world(sched.setup.tp, sched.setup.pp) {}
  const Schedule& s;
  const RunOptions& opt;
  InProcessWorld world;
  std::mutex mu;
  RunResult result;
  std::optional<Error> error;
};

bool tp_sharded(const GraphOp& op, size_t w) {
  bool bias = std::string(op.weights[w].suffix) == "bias";
  switch (op.kind) {
    case OpKind::kEmbedding:
    case OpKind::kColumnLinear:
    case OpKind::kExpertColumn:
    case OpKind::kExpertRow:
      return true;
    case OpKind::kRowLinear:
      return !bias;
    default:
      return false;
  }
}

class RankRunner {
 public:
  RankRunner(Shared& sh, int64_t stage, int64_t tp_rank, std::unique_ptr<Backend> be)
      : sh_(sh),
        s_(sh.s),
        p_(sh.s.stages[stage]),
        stage_(stage),
        tp_rank_(tp_rank),
        alloc_(sh.opt.enforce_budget),
        be_(std::move(be)),
        comm_(sh.world.comm(stage, tp_rank)) {}

  void run() {
    for (int step = 0; step < sh_.opt.steps; ++step) {
      step_ = step;
      bound_.assign(p_.tensors.size(), Tensor{});
      loss_ = 0;
      for (const Instr& in : p_.instrs) exec(in, step);
      if (stage_ == s_.setup.pp - 1 && tp_rank_ == 0) {
        std::lock_guard lock(sh_.mu);
        double tokens =
            static_cast<double>(s_.setup.seq_len * s_.setup.micro_batch * s_.setup.microbatches);
        sh_.result.losses.push_back(loss_ / tokens);
      }
    }
    report();
  }

 private:
  struct Group {
    Tensor grad, master, m, v;
    std::vector<std::pair<Tensor, int64_t>> members;  // weight, element offset in the flat buffers
    int64_t n = 0;
  };

  void exec(const Instr& in, int step) {
    if (!sh_.opt.profile || step + 1 != sh_.opt.steps) return dispatch(in, step);
    auto start = std::chrono::steady_clock::now();
    dispatch(in, step);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::string key = name_of(in.kind);
    if (in.op >= 0) key += std::string(" ") + name_of(p_.blocks[in.block].graph->ops[in.op].kind);
    if (in.kind == InstrKind::kSend || in.kind == InstrKind::kRecv) key = "p2p";
    profile_[key] += dt;
  }

  void dispatch(const Instr& in, int step) {
    switch (in.kind) {
      case InstrKind::kAlloc:
        if (in.block < 0 && step == 0) allocate_statics();
        if (in.block >= 0)
          throw std::logic_error("ZeRO-2/3 gradient buckets are not supported by this executor");
        break;
      case InstrKind::kLoad:
        load_tokens(in);
        break;
      case InstrKind::kForward:
        forward(in, step, false);
        break;
      case InstrKind::kRecompute:
        forward(in, step, true);
        break;
      case InstrKind::kBackward:
        backward(in);
        break;
      case InstrKind::kSend:
        send(in);
        break;
      case InstrKind::kRecv:
        recv(in);
        break;
      case InstrKind::kFree: {
        int32_t id = p_.reads(in)[0];
        alloc_.release(bound_[id].data);
        bound_[id] = {};
        break;
      }
      case InstrKind::kOptimizerStep:
        optimizer_step(step);
        break;
      case InstrKind::kGatherParams:
      case InstrKind::kReduceGrads:
        throw std::logic_error("ZeRO-2/3 instructions are not supported by this executor");
    }
  }

  Category category_of(int32_t id) const { return p_.tensors[id].category; }

  Tensor allocate(const TensorType& type, const std::string& name, Category c) {
    return Tensor{alloc_.allocate(type.bytes(), name, c), type};
  }

  void allocate_statics() {
    std::vector<std::string> tied;
    weights_.resize(p_.blocks.size());
    wgrads_.resize(p_.blocks.size());
    std::vector<std::pair<size_t, size_t>> owner(p_.blocks.size() * 64);
    for (size_t b = 0; b < p_.blocks.size(); ++b) {
      const StageBlock& blk = p_.blocks[b];
      weights_[b].resize(blk.graph->ops.size());
      for (size_t o = 0; o < blk.graph->ops.size(); ++o) {
        const GraphOp& op = blk.graph->ops[o];
        if (!op.attrs.tie.empty() && tie_owner_.count(op.attrs.tie)) continue;
        if (!op.attrs.tie.empty()) tie_owner_[op.attrs.tie] = {b, o};
        for (size_t w = 0; w < op.weights.size(); ++w) {
          TensorType type{op.weights[w].shape, Dtype::kBf16};
          Tensor t = allocate(type, weight_key(blk, op, w), Category::kWeight);
          init_weight(t, blk, op, w, s_.setup.tp, tp_rank_, sh_.opt.seed);
          weights_[b][o].push_back(t);
          Group& g = op.expert_weights ? expert_ : dense_;
          g.members.push_back({t, g.n});
          g.n += t.numel();
        }
      }
    }
    for (auto [g, name] : {std::pair{&dense_, "dense"}, std::pair{&expert_, "expert"}})
      allocate_group(*g, name);
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

  void allocate_group(Group& g, const std::string& name) {
    if (g.n == 0) return;
    Dtype gd = s_.setup.grad_dtype;
    g.grad = allocate({{g.n}, gd}, "grad_buffer." + name + " (" + name_of(gd) + ")",
                      Category::kGradient);
    for (int64_t i = 0; i < g.n; ++i) store(g.grad, i, 0.0f);
    if (s_.setup.optimizer == Optimizer::kNone) return;
    g.master = allocate({{g.n}, Dtype::kFp32}, "optimizer.master." + name + " (fp32)",
                        Category::kOptimizer);
    for (auto& [w, off] : g.members)
      for (int64_t i = 0; i < w.numel(); ++i) g.master.as<float>()[off + i] = load(w, i);
    if (s_.setup.optimizer != Optimizer::kAdamW) return;
    g.m = allocate({{g.n}, Dtype::kFp32}, "optimizer.exp_avg." + name + " (fp32)",
                   Category::kOptimizer);
    g.v = allocate({{g.n}, Dtype::kFp32}, "optimizer.exp_avg_sq." + name + " (fp32)",
                   Category::kOptimizer);
    std::fill(g.m.as<float>(), g.m.as<float>() + g.n, 0.0f);
    std::fill(g.v.as<float>(), g.v.as<float>() + g.n, 0.0f);
  }

  Tensor grad_view(const Tensor& w) const {
    for (const Group* g : {&dense_, &expert_})
      for (const auto& [member, off] : g->members)
        if (member.data == w.data)
          return Tensor{g->grad.as<unsigned char>() + off * dtype_bytes(g->grad.type.dtype),
                        {w.type.shape, g->grad.type.dtype}};
    throw std::logic_error("weight without a gradient slot");
  }

  OpContext context(const Instr& in) {
    const StageBlock& blk = p_.blocks[in.block];
    const TrainSpec& t = s_.setup;
    OpContext ctx;
    ctx.op = &blk.graph->ops[in.op];
    ctx.model = &s_.model;
    ctx.setup = &t;
    ctx.comm = &comm_;
    ctx.tp_rank = tp_rank_;
    ctx.layer = blk.layer;
    ctx.op_index = in.op;
    ctx.mb = in.mb;
    ctx.seed = sh_.opt.seed +
               0x9E3779B97F4A7C15ull * static_cast<uint64_t>(step_ + 1);  // new masks each step
    ctx.token_offset = t.sp ? tp_rank_ * (t.seq_len * t.micro_batch / t.tp) : 0;
    ctx.loss_scale = 1.0f / static_cast<float>(t.seq_len * t.micro_batch * t.microbatches);
    return ctx;
  }

  // Allocation hook for one instruction: outputs and workspaces take the plan's names and
  // categories in order; gradients are named once the backend has placed them.
  void hook(OpContext& ctx, const Instr& in) {
    out_ids_.clear(), ws_ids_.clear(), pending_.clear();
    for (int32_t id : p_.allocs(in)) {
      ValueKind k = p_.tensors[id].kind;
      if (k == ValueKind::kWorkspace)
        ws_ids_.push_back(id);
      else if (k != ValueKind::kGrad)
        out_ids_.push_back(id);
    }
    next_out_ = next_ws_ = 0;
    ctx.alloc = [this, &in](const TensorType& type, AllocRole role) {
      int32_t id = -1;
      if (role == AllocRole::kOutput && next_out_ < out_ids_.size()) id = out_ids_[next_out_++];
      if (role == AllocRole::kWorkspace && next_ws_ < ws_ids_.size()) id = ws_ids_[next_ws_++];
      std::string name = id >= 0                         ? p_.tensor_name(id)
                         : role == AllocRole::kGradInput ? "grad:pending"
                                                         : "unplanned:" + p_.instr_name(in);
      Tensor t = allocate(type, name, id >= 0 ? category_of(id) : Category::kTransient);
      pending_.push_back({t, id, role});
      if (id >= 0) bound_[id] = t;
      return t;
    };
  }

  // Frees what the plan did not name (it still counted in the measured peak).
  void release_unplanned(const Instr& in) {
    for (const Pending& pa : pending_) {
      if (pa.id >= 0 || pa.role == AllocRole::kGradInput) continue;
      unplanned_.push_back(std::string(pa.role == AllocRole::kWorkspace ? "workspace" : "output") +
                           " of " + p_.instr_name(in) + " (" + std::to_string(pa.tensor.bytes()) +
                           " bytes)");
      alloc_.release(pa.tensor.data);
    }
  }

  std::vector<Tensor> gather(std::span<const int32_t> ids) const {
    std::vector<Tensor> out;
    for (int32_t id : ids) {
      if (!bound_[id])
        throw std::logic_error("plan reads " + p_.tensor_name(id) + ", which holds no data");
      out.push_back(bound_[id]);
    }
    return out;
  }

  void forward(const Instr& in, int step, bool recompute) {
    const GraphOp& op = p_.blocks[in.block].graph->ops[in.op];
    OpContext ctx = context(in);
    hook(ctx, in);
    std::vector<Tensor> inputs = gather(p_.reads(in));
    inputs.resize(op.inputs.size());
    std::vector<Tensor> outs = be_->forward(ctx, inputs, weights_[in.block][in.op]);
    release_unplanned(in);
    if (step == 0) ++runs_[{static_cast<int>(stage_), in.block, in.op}];
    if (op.kind == OpKind::kCrossEntropy && !recompute)
      for (int64_t i = 0; i < outs[0].numel(); ++i) loss_ += outs[0].as<float>()[i];
  }

  void backward(const Instr& in) {
    const GraphOp& op = p_.blocks[in.block].graph->ops[in.op];
    std::vector<Tensor> inputs(op.inputs.size()), outputs(op.outputs.size()),
        gout(op.outputs.size()), gin(op.inputs.size());
    // The reads come in the planner's order: per output its gradient (if any) and its value (if
    // the backward reads it), then per input its value (if read) and its gradient (if one exists).
    const OpInfo& info = op_info(op.kind);
    std::span<const int32_t> reads = p_.reads(in);
    size_t next = 0;
    auto take = [&](bool grad) -> Tensor {
      if (next >= reads.size() || (p_.tensors[reads[next]].kind == ValueKind::kGrad) != grad)
        return {};
      return bound_[reads[next++]];
    };
    for (size_t j = 0; j < op.outputs.size(); ++j) {
      if (info.grad_outputs >> j & 1u) gout[j] = take(true);
      if (info.bwd_reads_outputs >> j & 1u) outputs[j] = take(false);
    }
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      if (info.bwd_reads_inputs >> k & 1u) inputs[k] = take(false);
      if (info.grad_inputs >> k & 1u) gin[k] = take(true);
    }
    std::vector<Tensor> before = gin;
    OpContext ctx = context(in);
    hook(ctx, in);
    be_->backward(
        ctx, {inputs, outputs, gout, gin, weights_[in.block][in.op], wgrads_[in.block][in.op]});
    for (size_t k = 0; k < gin.size(); ++k) {
      if (before[k] || !gin[k]) continue;
      int32_t id = -1;
      for (int32_t a : p_.allocs(in))
        if (p_.tensors[a].kind == ValueKind::kGrad && p_.tensors[a].tensor == op.inputs[k]) id = a;
      if (id < 0) {
        unplanned_.push_back("unplanned gradient of " +
                             p_.blocks[in.block].graph->tensors[op.inputs[k]].name);
        alloc_.release(gin[k].data);
        continue;
      }
      bound_[id] = gin[k];
      alloc_.rename(gin[k].data, p_.tensor_name(id));
    }
    release_unplanned(in);
  }

  TensorType hidden_type() const {
    const TrainSpec& t = s_.setup;
    return {{t.seq_len * t.micro_batch / (t.sp ? t.tp : 1), s_.model.hidden}, Dtype::kBf16};
  }

  void load_tokens(const Instr& in) {
    int32_t id = p_.allocs(in)[0];
    const ScheduleTensor& t = p_.tensors[id];
    const std::string& which = p_.blocks[t.block].graph->tensors[t.tensor].name;
    Tensor x = allocate({{s_.setup.seq_len * s_.setup.micro_batch}, Dtype::kI64},
                        p_.tensor_name(id), t.category);
    fill_tokens(x, which, in.mb, s_.model.vocab, sh_.opt.seed);
    bound_[id] = x;
  }

  void send(const Instr& in) {
    int32_t id = p_.reads(in)[0];
    bool grad = p_.tensors[id].kind == ValueKind::kGrad;
    comm_.send(bound_[id], stage_ + (grad ? -1 : 1));
  }

  void recv(const Instr& in) {
    int32_t id = p_.allocs(in)[0];
    bool grad = p_.tensors[id].kind == ValueKind::kGrad;
    Tensor x = allocate(hidden_type(), p_.tensor_name(id), category_of(id));
    bound_[id] = x;
    comm_.recv(x, stage_ + (grad ? 1 : -1));
  }

  void sync_gradients() {
    for (size_t b = 0; b < p_.blocks.size(); ++b)
      for (size_t o = 0; o < p_.blocks[b].graph->ops.size(); ++o)
        if (p_.blocks[b].graph->ops[o].tp_partial_weight_grads)
          for (const Tensor& g : wgrads_[b][o]) comm_.all_reduce(g);
    sync_tied_embeddings();
  }

  // Tied embeddings with pp > 1: the first and the last stage hold copies; their gradients are
  // summed (last -> first, sum back) so both apply the same update.
  void sync_tied_embeddings() {
    if (!s_.model.tie_embeddings || s_.setup.pp == 1 || !tie_owner_.count("embedding")) return;
    auto [b, o] = tie_owner_.at("embedding");
    const Tensor& g = wgrads_[b][o][0];
    int64_t last = s_.setup.pp - 1;
    if (stage_ == last) {
      comm_.send(g, 0);
      comm_.recv(g, 0);
    } else if (stage_ == 0) {
      std::vector<unsigned char> buf(g.bytes());
      Tensor other{buf.data(), g.type};
      comm_.recv(other, last);
      for (int64_t i = 0; i < g.numel(); ++i) store(g, i, load(g, i) + load(other, i));
      comm_.send(g, last);
    }
  }

  void capture_grads() {
    std::lock_guard lock(sh_.mu);
    for (size_t b = 0; b < p_.blocks.size(); ++b)
      for (size_t o = 0; o < p_.blocks[b].graph->ops.size(); ++o) {
        const GraphOp& op = p_.blocks[b].graph->ops[o];
        for (size_t w = 0; w < wgrads_[b][o].size(); ++w) {
          const Tensor& g = wgrads_[b][o][w];
          int64_t tp = tp_sharded(op, w) ? s_.setup.tp : 1;
          std::vector<float>& out = sh_.result.grads[weight_key(p_.blocks[b], op, w)];
          out.resize(g.numel() * tp);
          for (int64_t i = 0; i < g.numel(); ++i)
            out[global_weight_index(op, w, i, tp, tp == 1 ? 0 : tp_rank_)] = load(g, i);
        }
      }
  }

  void optimizer_step(int step) {
    sync_gradients();
    if (step == 0 && sh_.opt.capture_grads) capture_grads();
    const float lr = sh_.opt.lr, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.0f;
    float c1 = 1.0f - std::pow(b1, static_cast<float>(step + 1)),
          c2 = 1.0f - std::pow(b2, static_cast<float>(step + 1));
    for (Group* g : {&dense_, &expert_}) {
      if (g->n == 0) continue;
      if (s_.setup.optimizer != Optimizer::kNone) {
        float* master = g->master.as<float>();
        for (int64_t i = 0; i < g->n; ++i) {
          float grad = load(g->grad, i);
          if (s_.setup.optimizer == Optimizer::kSgd) {
            master[i] -= lr * grad;
            continue;
          }
          float& m = g->m.as<float>()[i];
          float& v = g->v.as<float>()[i];
          m = b1 * m + (1 - b1) * grad;
          v = b2 * v + (1 - b2) * grad * grad;
          master[i] -= lr * ((m / c1) / (std::sqrt(v / c2) + eps) + wd * master[i]);
        }
        for (auto& [w, off] : g->members)
          for (int64_t i = 0; i < w.numel(); ++i) store(w, i, master[off + i]);
      }
      for (int64_t i = 0; i < g->n; ++i) store(g->grad, i, 0.0f);
    }
  }

  void report() {
    RankResult r;
    r.stage = stage_, r.tp_rank = tp_rank_,
    r.global_rank = stage_ * s_.setup.dp * s_.setup.tp + tp_rank_;
    r.measured_peak = alloc_.peak();
    r.measured_at_peak = alloc_.at_peak();
    r.live_at_peak = alloc_.live_at_peak();
    r.timeline = alloc_.timeline();
    r.unplanned = unplanned_;
    std::lock_guard lock(sh_.mu);
    sh_.result.ranks.push_back(std::move(r));
    if (tp_rank_ == 0)
      for (auto& [key, n] : runs_) sh_.result.forward_runs[key] = n;
    for (auto& [key, t] : profile_) sh_.result.profile[key] += t;
  }

  struct Pending {
    Tensor tensor;
    int32_t id;
    AllocRole role;
  };

  Shared& sh_;
  const Schedule& s_;
  const StageProgram& p_;
  int64_t stage_, tp_rank_;
  TrackingAllocator alloc_;
  std::unique_ptr<Backend> be_;
  Communicator& comm_;
  std::vector<Tensor> bound_;
  std::vector<std::vector<std::vector<Tensor>>> weights_, wgrads_;
  std::map<std::string, std::pair<size_t, size_t>> tie_owner_;
  Group dense_, expert_;
  std::vector<int32_t> out_ids_, ws_ids_;
  size_t next_out_ = 0, next_ws_ = 0;
  std::vector<Pending> pending_;
  std::vector<std::string> unplanned_;
  double loss_ = 0;
  int step_ = 0;
  std::map<std::string, double> profile_;
  std::map<std::array<int, 3>, int> runs_;
};

}  // namespace

std::optional<Error> check_runnable(const Schedule& s) {
  const TrainSpec& t = s.setup;
  if (t.dp != 1 || t.ep != 1)
    return make_error(
        "the CPU executor runs dp = 1 and ep = 1 (its ranks are TP x PP threads); got dp " +
        std::to_string(t.dp) + ", ep " + std::to_string(t.ep) + ": use --dp 1 --ep 1");
  if (t.zero >= 2)
    return make_error("the CPU executor runs ZeRO 0 or 1 (dp = 1); got --zero " +
                      std::to_string(t.zero));
  if (t.tp * t.pp > 64)
    return make_error("the CPU executor runs at most 64 ranks; got tp x pp = " +
                      std::to_string(t.tp * t.pp));
  // Host memory: every rank's predicted peak must fit in what this machine has free.
  double need = 0;
  for (const StageProgram& p : s.stages)
    need += static_cast<double>(simulate(p).peak_bytes) * static_cast<double>(t.tp);
  double avail =
      static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (avail > 0 && need > 0.8 * avail)
    return make_error("the CPU executor would need " + format_human(static_cast<int64_t>(need)) +
                      " of host memory and " + format_human(static_cast<int64_t>(avail)) +
                      " is free; run a smaller model (e.g. --scenario scenarios/tiny-llama.toml)");
  return std::nullopt;
}

Result<RunResult> run_schedule(const Schedule& s, const BackendFactory& backend,
                               const RunOptions& options) {
  if (auto e = check_runnable(s)) return *e;
  Shared sh(s, options);
  std::vector<std::unique_ptr<RankRunner>> runners;
  for (int64_t stage = 0; stage < s.setup.pp; ++stage)
    for (int64_t r = 0; r < s.setup.tp; ++r)
      runners.push_back(std::make_unique<RankRunner>(sh, stage, r, backend()));
  {
    std::vector<std::jthread> threads;
    for (size_t i = 0; i < runners.size(); ++i)
      threads.emplace_back([&, i] {
        int64_t stage = static_cast<int64_t>(i) / s.setup.tp;
        try {
          runners[i]->run();
        } catch (const OutOfBudget& e) {
          std::lock_guard lock(sh.mu);
          if (!sh.result.out_of_memory)
            sh.result.out_of_memory = e, sh.result.oom_rank = stage * s.setup.dp * s.setup.tp +
                                                              static_cast<int64_t>(i) % s.setup.tp;
          sh.world.abort(stage);
        } catch (const RunAborted&) {
          sh.world.abort(stage);
        } catch (const std::exception& e) {
          {
            std::lock_guard lock(sh.mu);
            if (!sh.error)
              sh.error = make_error(std::string("run failed on pp stage ") + std::to_string(stage) +
                                    ": " + e.what());
          }
          sh.world.abort(stage);
        }
      });
  }
  if (sh.error) return *sh.error;
  std::sort(sh.result.ranks.begin(), sh.result.ranks.end(),
            [](const RankResult& a, const RankResult& b) { return a.global_rank < b.global_rank; });
  return std::move(sh.result);
}

}  // namespace np::exec
