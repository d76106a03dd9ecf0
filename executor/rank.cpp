// The schedule interpreter of one rank. It binds the plan's tensor ids to what the kernels
// allocate (planner/schedule/contract.hpp, points 1-4), frees each tensor after its own count of the
// tensor's last use (point 5; the plan's kFree instructions are never read), and records every
// allocation and release against the plan instruction that caused it.
#include "executor/rank.hpp"

#include <chrono>
#include <limits>
#include <stdexcept>

#include "executor/init.hpp"
#include "executor/params.hpp"
#include "planner/schedule/contract.hpp"

namespace np::exec {
namespace {

class RankRunner {
 public:
  RankRunner(const Schedule& s, int64_t stage, Backend& be, Communicator& comm,
             const RunOptions& opt)
      : s_(s),
        p_(s.stages.at(stage)),
        stage_(stage),
        dp_rank_(comm.dp_rank() / comm.cp_size()),
        cp_rank_(comm.cp_rank()),
        tp_rank_(comm.tp_rank()),
        opt_(opt),
        be_(be),
        comm_(comm),
        alloc_(be, opt.enforce_budget, opt.allocator),
        params_(s, stage, comm.tp_rank(), be, comm) {
    count_lifetimes();
    std::vector<RuntimeBuffer> buffers = be_.runtime_buffers();
    for (size_t i = 0; i < buffers.size(); ++i)
      be_.use_runtime_buffer(i, alloc_.allocate_runtime(buffers[i].bytes, buffers[i].name));
    if (s.setup.fsdp) {  // the ops' weight gradients before they become the plan's (params.hpp)
      TensorType t{{params_.fsdp_staging_elements()}, Dtype::kBf16};
      params_.use_fsdp_staging(Tensor{alloc_.allocate_runtime(t.bytes(), kFsdpStagingName), t});
    }
    for (int32_t id = 0; id < static_cast<int32_t>(p_.tensors.size()); ++id)
      if (p_.tensors[id].kind == ValueKind::kStatic)
        static_ids_.emplace(p_.static_names.at(p_.tensors[id].tensor), id);
  }

  RankRun run() {
    for (int step = 0; step < opt_.steps; ++step) {
      auto start = std::chrono::steady_clock::now();
      step_ = step;
      alloc_.begin_step();
      bound_.assign(p_.tensors.size(), Tensor{});
      loss_ = 0;
      // A stepped op's kernel takes its kStep instructions itself (next_step): cur_ is the last.
      for (int32_t i = 0; i < static_cast<int32_t>(p_.instrs.size()); i = cur_ + 1) {
        cur_ = i;
        exec(i);
      }
      if (stage_ == s_.setup.pp - 1 && tp_rank_ == 0) out_.losses.push_back(loss_ / step_tokens());
      be_.synchronize();
      out_.memory.step_seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    RankResult& r = out_.memory;
    const TrainSpec& t = s_.setup;
    r.stage = stage_, r.dp_rank = dp_rank_, r.cp_rank = cp_rank_, r.tp_rank = tp_rank_;
    r.global_rank = ((stage_ * t.dp + dp_rank_) * t.cp + cp_rank_) * t.tp + tp_rank_;
    r.measured_peak = alloc_.peak();
    r.measured_at_peak = alloc_.at_peak();
    r.live_at_peak = alloc_.live_at_peak();
    r.timeline = alloc_.timeline();
    r.events = alloc_.events();
    r.unplanned = alloc_.unplanned_names();
    r.runtime_buffers = alloc_.runtime();
    r.measured_device_peak = alloc_.device_peak();
    r.measured_reserved_peak = alloc_.reserved_peak();
    r.measured_allocated_blocks_peak = alloc_.allocated_blocks_peak();
    r.measured_in_use_at_end = alloc_.in_use();
    r.measured_reserved_at_end = alloc_.reserved_now();
    r.measured_allocated_blocks_at_end = alloc_.allocated_blocks_now();
    for (const RuntimeBuffer& b : be_.measured_overheads())
      r.measured_overheads.push_back({b.name, b.bytes, Category::kTransient});
    for (const auto& [name, bytes] : comm_.measured_overheads())
      r.measured_overheads.push_back({name, bytes, Category::kTransient});
    return std::move(out_);
  }

 private:
  // The contract's point 5, counted from the program's reads and allocations alone: a tensor
  // dies after the last instruction that reads or allocates it.
  void count_lifetimes() {
    constexpr int32_t kNever = std::numeric_limits<int32_t>::max();
    std::vector<int32_t> last(p_.tensors.size(), kNever);
    for (int32_t i = 0; i < static_cast<int32_t>(p_.instrs.size()); ++i) {
      const Instr& in = p_.instrs[i];
      if (in.kind == InstrKind::kFree) continue;
      for (int32_t id : p_.reads(in)) last[id] = i;
      for (int32_t id : p_.allocs(in)) last[id] = i;
    }
    dies_after_.assign(p_.instrs.size(), {});
    for (int32_t id = 0; id < static_cast<int32_t>(p_.tensors.size()); ++id)
      if (p_.tensors[id].kind != ValueKind::kStatic && last[id] != kNever)
        dies_after_[last[id]].push_back(id);
  }

  void exec(int32_t i) {
    const Instr& in = p_.instrs[i];
    if (in.kind == InstrKind::kFree) return;  // the plan's prediction, not an instruction
    if (in.kind == InstrKind::kStep)
      throw std::logic_error("plan step '" + p_.instr_name(in) + "' was not taken by its op's kernel");
    alloc_.set_instruction(i);
    auto start = std::chrono::steady_clock::now();
    dispatch(in);
    release_unplanned();
    release_dead(cur_);
    if (!opt_.profile || step_ + 1 != opt_.steps) return;
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::string key = name_of(in.kind);
    if (in.op >= 0) key += std::string(" ") + name_of(p_.blocks[in.block].graph->ops[in.op].kind);
    if (in.kind == InstrKind::kSend || in.kind == InstrKind::kRecv) key = "p2p";
    out_.profile[key] += dt;
  }

  void dispatch(const Instr& in) {
    switch (in.kind) {
      case InstrKind::kAlloc:
        if (in.block >= 0) {  // ZeRO-2/3: the block's gradient bucket
          params_.bind_bucket(in.block, allocate_block_buffer(in, s_.setup.grad_dtype));
          break;
        }
        if (step_ == 0)
          params_.allocate([this](const TensorType& type, const std::string& name,
                                  Category c) { return allocate_static(type, name, c); },
                           opt_.seed);
        bind_statics();
        break;
      case InstrKind::kLoad:
        load_tokens(in);
        break;
      case InstrKind::kForward:
        forward(in, false);
        break;
      case InstrKind::kRecompute:
        forward(in, true);
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
      case InstrKind::kOptimizerStep:
        params_.sync_gradients();
        if (step_ == 0 && opt_.capture_grads) out_.grads = params_.capture_gradients();
        params_.optimizer_step(step_, opt_.lr);
        break;
      case InstrKind::kGatherParams:  // ZeRO-3: the block's weights, gathered
        if (s_.setup.fsdp) return fsdp_gather(in);
        params_.gather_block(in.block, allocate_block_buffer(in, Dtype::kBf16));
        break;
      case InstrKind::kReduceGrads:
        if (s_.setup.fsdp) return fsdp_reduce(in);
        params_.reduce_bucket(in.block, bound(p_.reads(in)[0]));
        break;
      case InstrKind::kFree:
      case InstrKind::kStep:  // taken by the op's kernel (next_step)
        break;
    }
  }

  // The plan's tensor of kind k this instruction allocates (-1: none) or reads.
  int32_t allocated(const Instr& in, ValueKind k) const {
    for (int32_t id : p_.allocs(in))
      if (p_.tensors[id].kind == k) return id;
    return -1;
  }
  int32_t read_id(const Instr& in, ValueKind k) const {
    for (int32_t id : p_.reads(in))
      if (p_.tensors[id].kind == k) return id;
    return -1;
  }
  Tensor read_of(const Instr& in, ValueKind k) const {
    if (int32_t id = read_id(in, k); id >= 0) return bound(id);
    throw std::logic_error(p_.instr_name(in) + " reads no " + name_of(k));
  }
  // A planned tensor of `elements` in `dtype`, bound to its id.
  Tensor allocate_planned(int32_t id, int64_t elements, Dtype dtype) {
    TensorType type{{elements}, dtype};
    Tensor t{alloc_.allocate(type.bytes(), p_.tensor_name(id), p_.tensors[id].category, id,
                             stream_of(p_.tensors[id].kind)),
             type};
    bound_[id] = t;
    return t;
  }

  // FSDP2's unshard (planner/schedule/schedule.cpp, fsdp_all_gather and fsdp_unshard): the bf16
  // copy of this rank's chunks, the flat all-gather output, then the copy-out into the unit's
  // unsharded weights.
  // A unit with float8 weights (FSDP's float8 all-gather) gathers bytes: each float8 weight's
  // cast first (an instruction per step, its op the linear's), the bf16 copy-in of the others,
  // then byte buffers.
  void fsdp_gather(const Instr& in) {
    if (in.op >= 0) return fsdp_fp8_cast(in);
    const bool bytes = params_.fsdp_gathers_bytes(in.block);
    const int64_t n = bytes ? params_.fsdp_shard_bytes(in.block)
                            : params_.fsdp_shard_elements(in.block),
                  group = s_.setup.fsdp_shards();
    const Dtype dtype = bytes ? Dtype::kU8 : Dtype::kBf16;
    if (int32_t id = allocated(in, ValueKind::kAllGatherInput); id >= 0) {
      params_.fsdp_copy_in(in.block, allocate_planned(id, params_.fsdp_bf16_elements(in.block),
                                                      Dtype::kBf16));
    } else if (int32_t id = allocated(in, ValueKind::kAllGatherBuffer); id >= 0) {
      Tensor input;  // the bf16 copy-in (none when every weight is float8)
      for (int32_t r : p_.reads(in))
        if (p_.tensors[r].kind == ValueKind::kAllGatherInput && p_.tensors[r].tensor < 0)
          input = bound(r);
      params_.fsdp_all_gather(in.block, input, allocate_planned(id, group * n, dtype));
    } else if (int32_t id = allocated(in, ValueKind::kParamGather); id >= 0) {
      params_.fsdp_copy_out(in.block, read_of(in, ValueKind::kAllGatherBuffer),
                            allocate_planned(id, group * n, dtype));
    }
  }
  // One step of a float8 weight's pre-all-gather cast (schedule.cpp, fsdp_all_gather: five
  // instructions of the op in a row; the fourth-step clamp and the e4m3 shard come last).
  void fsdp_fp8_cast(const Instr& in) {
    cast_step_ = cast_block_ == in.block && cast_op_ == in.op && cast_step_ < 4 ? cast_step_ + 1 : 0;
    cast_block_ = in.block, cast_op_ = in.op;
    std::vector<Tensor> made;
    std::span<const int32_t> ids = p_.allocs(in);
    for (size_t k = 0; k < ids.size(); ++k) {
      const bool fp8 = cast_step_ == 4 && k == 1;
      const int64_t bytes = p_.tensors[ids[k]].bytes;
      made.push_back(allocate_planned(ids[k], fp8 ? bytes : bytes / 4,
                                      fp8 ? Dtype::kFp8E4m3 : Dtype::kFp32));
    }
    params_.fsdp_fp8_cast(in.block, in.op, cast_step_, made);
  }
  int cast_step_ = 4, cast_block_ = -1, cast_op_ = -1;  // the cast in flight

  // FSDP2's post-backward (fsdp_reduce): the fp32 reduce-scatter input from the ops' bf16
  // gradients, then the reduce-scatter into this rank's gradient shard. Its first instruction
  // (the reshard, the previous input freed) allocates nothing.
  void fsdp_reduce(const Instr& in) {
    const int64_t n = params_.fsdp_shard_elements(in.block), group = s_.setup.fsdp_shards();
    if (int32_t id = allocated(in, ValueKind::kReduceScatterInput); id >= 0) {
      params_.fsdp_fill_reduce_input(in.block, allocate_planned(id, group * n, Dtype::kFp32));
    } else if (int32_t id = allocated(in, ValueKind::kGradShard); id >= 0) {
      params_.fsdp_reduce_scatter(in.block, read_of(in, ValueKind::kReduceScatterInput),
                                  allocate_planned(id, n, Dtype::kFp32), in.mb == 0);
    } else if (int32_t id = allocated(in, ValueKind::kGradBucket); id >= 0) {  // PP: accumulate
      Tensor acc = allocate_planned(id, p_.tensors[id].bytes / 4, Dtype::kFp32);
      params_.fsdp_accumulate(in.block, &acc);
    } else if (read_id(in, ValueKind::kGradBucket) >= 0) {
      params_.fsdp_accumulate(in.block, nullptr);
    }
  }

  // A ZeRO bucket or gathered buffer: the block's weight elements in `dtype`, bound to the plan's
  // tensor the instruction allocates.
  Tensor allocate_block_buffer(const Instr& in, Dtype dtype) {
    int32_t id = p_.allocs(in).empty() ? -1 : p_.allocs(in)[0];
    TensorType type{{params_.block_elements(in.block)}, dtype};
    std::string name = id >= 0 ? p_.tensor_name(id) : "ZeRO buffer of " + p_.instr_name(in);
    Tensor t{alloc_.allocate(type.bytes(), name, id >= 0 ? p_.tensors[id].category
                                                         : Category::kTransient, id),
             type};
    if (id >= 0) bound_[id] = t;
    return t;
  }

  // Statics are bound to the plan's ids by name (contract point 1).
  Tensor allocate_static(const TensorType& type, const std::string& name, Category c) {
    auto it = static_ids_.find(name);
    int32_t id = it == static_ids_.end() ? -1 : it->second;
    Tensor t{alloc_.allocate(type.bytes(), id >= 0 ? name : "unplanned static " + name, c, id),
             type};
    statics_.push_back({id, t});
    return t;
  }
  void bind_statics() {
    for (auto& [id, t] : statics_)
      if (id >= 0) bound_[id] = t;
  }

  OpContext context(const Instr& in) {
    const StageBlock& blk = p_.blocks[in.block];
    const TrainSpec& t = s_.setup;
    OpContext ctx;
    ctx.op = &blk.graph->ops[in.op];
    ctx.cached_output = in.kind == InstrKind::kRecompute && !blk.policy.recompute[in.op];
    ctx.model = &s_.model;
    ctx.setup = &t;
    ctx.comm = &comm_;
    ctx.tp_rank = tp_rank_;
    ctx.layer = blk.layer;
    ctx.op_index = in.op;
    ctx.mb = global_mb(in.mb);
    ctx.seed = opt_.seed +
               0x9E3779B97F4A7C15ull * static_cast<uint64_t>(step_ + 1);  // new masks each step
    ctx.token_offset = t.sp ? tp_rank_ * (t.seq_len / t.cp * t.micro_batch / t.tp) : 0;
    ctx.cp_rank = cp_rank_;
    ctx.loss_scale = static_cast<float>(ctx.op->attrs.loss_weight / step_tokens());
    ctx.train_step = step_;
    ctx.te_fp8 = &te_fp8_;
    return ctx;
  }

  // Replica d runs micro-batches d m .. d m + m - 1 of the step's dp x m: the same tokens and
  // dropout masks as one replica running them all.
  int global_mb(int mb) const { return static_cast<int>(dp_rank_ * s_.setup.microbatches + mb); }
  double step_tokens() const {
    const TrainSpec& t = s_.setup;
    return static_cast<double>(t.seq_len * t.micro_batch * t.microbatches * t.dp);
  }

  // Allocation hook of one instruction (contract points 2 and 3): the k-th output the kernel
  // allocates takes the k-th output id of the plan's allocs, the k-th workspace the k-th
  // workspace id; gradients are bound once the backend has placed them.
  void hook(OpContext& ctx, const Instr& in) {
    out_ids_.clear(), ws_ids_.clear(), pending_.clear(), kept_ids_.clear();
    for (int32_t id : p_.allocs(in)) {
      ValueKind k = p_.tensors[id].kind;
      if (k == ValueKind::kWorkspace)
        ws_ids_.push_back(id);
      else if (k != ValueKind::kGrad)
        out_ids_.push_back(id);
    }
    // A recompute's workspaces the forward kept (per-op checkpointing: kept activations the
    // instruction reads where it would allocate them; planner/schedule/schedule.cpp, emit_steps).
    if (in.kind == InstrKind::kRecompute || in.kind == InstrKind::kStep)
      for (int32_t id : p_.reads(in))
        if (p_.tensors[id].kind == ValueKind::kWorkspace &&
            p_.tensors[id].category == Category::kActivation && p_.tensors[id].tensor == in.op)
          kept_ids_.push_back(id);
    next_out_ = next_ws_ = next_kept_ = 0;
    if (!ctx.step) ctx.step = [this, &ctx] { next_step(ctx); };  // set once: it runs hook too
    if (!ctx.kept)
      ctx.kept = [this, &ctx](const TensorType& type) {
        if (next_kept_ < kept_ids_.size()) return bound_[kept_ids_[next_kept_++]];
        return ctx.alloc(type, AllocRole::kWorkspace);
      };
    ctx.alloc = [this, &in](const TensorType& type, AllocRole role) {
      int32_t id = -1;
      if (role == AllocRole::kOutput && next_out_ < out_ids_.size()) id = out_ids_[next_out_++];
      if (role == AllocRole::kWorkspace && next_ws_ < ws_ids_.size()) id = ws_ids_[next_ws_++];
      std::string name = id >= 0                         ? p_.tensor_name(id)
                         : role == AllocRole::kGradInput ? "gradient of " + p_.instr_name(in)
                         : role == AllocRole::kWorkspace ? "workspace of " + p_.instr_name(in)
                                                         : "output of " + p_.instr_name(in);
      Category c = id >= 0 ? p_.tensors[id].category : Category::kTransient;
      Tensor t{alloc_.allocate(type.bytes(), name, c, id), type};
      pending_.push_back({t, id, role});
      if (id >= 0) bound_[id] = t;
      return t;
    };
  }

  // Releases, at the end of the op's instructions, what the plan did not name (the allocator
  // keeps it as an unplanned allocation: a divergence).
  void release_unplanned() {
    for (const Pending& pa : pending_)
      if (pa.id < 0) alloc_.release(pa.tensor.data);
    pending_.clear();
  }
  // The tensors whose last use was instruction i.
  void release_dead(int32_t i) {
    for (int32_t id : dies_after_[i]) {
      if (!bound_[id]) continue;  // never allocated: the event comparison reports it
      alloc_.release(bound_[id].data);
      bound_[id] = {};
    }
  }

  // OpContext::step: a stepped op's kernel goes on to its next step, the next kStep instruction
  // (frees aside) of the same op. The step's dead tensors are released; its unplanned
  // allocations are kept to the op's end (the kernel may still use them).
  void next_step(OpContext& ctx) {
    const Instr& was = p_.instrs[cur_];
    bind_grad_inputs();
    int32_t j = cur_ + 1;
    while (j < static_cast<int32_t>(p_.instrs.size()) && p_.instrs[j].kind == InstrKind::kFree) ++j;
    if (j == static_cast<int32_t>(p_.instrs.size()) || p_.instrs[j].kind != InstrKind::kStep ||
        p_.instrs[j].block != was.block || p_.instrs[j].op != was.op || p_.instrs[j].mb != was.mb)
      throw std::logic_error("the kernel of '" + p_.instr_name(was) +
                             "' takes a step its plan does not have");
    std::vector<Pending> unplanned;
    for (const Pending& pa : pending_)
      if (pa.id < 0) unplanned.push_back(pa);
    pending_.clear();
    release_dead(cur_);
    cur_ = j;
    alloc_.set_instruction(j);
    hook(ctx, p_.instrs[j]);
    pending_ = std::move(unplanned);
  }

  // Gradients the backward's kernel allocated (so far): bound to the plan's gradient of that input
  // among the current instruction's allocations, if it has one.
  void bind_grad_inputs() {
    if (!bw_gin_) return;
    const Instr& in = p_.instrs[cur_];
    const GraphOp& op = p_.blocks[in.block].graph->ops[in.op];
    std::vector<Tensor>& gin = *bw_gin_;
    for (size_t k = 0; k < gin.size(); ++k) {
      if (bw_ids_->grad_inputs[k] >= 0 || !gin[k]) continue;
      for (Pending& pa : pending_) {
        if (pa.tensor.data != gin[k].data || pa.id >= 0) continue;
        for (int32_t a : p_.allocs(in))
          if (p_.tensors[a].kind == ValueKind::kGrad && p_.tensors[a].tensor == op.inputs[k])
            pa.id = a;
        if (pa.id < 0) continue;
        alloc_.bind(gin[k].data, pa.id, p_.tensor_name(pa.id));
        bound_[pa.id] = gin[k];
      }
    }
  }

  Tensor bound(int32_t id) const {
    if (id < 0) return {};
    if (!bound_[id])
      throw std::logic_error("plan reads " + p_.tensor_name(id) + ", which holds no data");
    return bound_[id];
  }

  void forward(const Instr& in, bool recompute) {
    const GraphOp& op = p_.blocks[in.block].graph->ops[in.op];
    OpContext ctx = context(in);
    hook(ctx, in);
    std::vector<Tensor> inputs;
    for (int32_t id : p_.reads(in))
      if (p_.tensors[id].kind != ValueKind::kParamGather) inputs.push_back(bound(id));
    inputs.resize(op.inputs.size());
    std::vector<Tensor> outs = be_.forward(ctx, inputs, params_.weights(in.block, in.op));
    if (ctx.cached_output) return;  // its casts only: the op did not run again
    if (step_ == 0) ++out_.forward_runs[{static_cast<int>(stage_), in.block, in.op}];
    // The reported loss is the main model's (Megatron logs the MTP losses apart).
    if (is_loss(op.kind) && !recompute && op.mtp_depth == 0) loss_ += be_.sum(outs[0]);
  }

  void backward(const Instr& in) {
    const GraphOp& op = p_.blocks[in.block].graph->ops[in.op];
    BackwardOperands ids = backward_operands(p_, in);
    auto tensors = [&](const std::vector<int32_t>& v) {
      std::vector<Tensor> t;
      for (int32_t id : v) t.push_back(bound(id));
      return t;
    };
    std::vector<Tensor> inputs = tensors(ids.inputs), outputs = tensors(ids.outputs),
                        gout = tensors(ids.grad_outputs), gin = tensors(ids.grad_inputs);
    OpContext ctx = context(in);
    hook(ctx, in);
    const bool fsdp_grads = s_.setup.fsdp && !op.weights.empty();
    if (fsdp_grads) params_.fsdp_stage_grads(in.block, in.op);
    bw_ids_ = &ids, bw_gin_ = &gin;
    be_.backward(ctx, {inputs, outputs, gout, gin, params_.weights(in.block, in.op),
                       params_.weight_grads(in.block, in.op)});
    bind_grad_inputs();
    bw_ids_ = nullptr, bw_gin_ = nullptr;
    // FSDP2: autograd's bf16 gradient of the op's weights, after its input gradients (a stepped
    // op's, in its last step).
    const Instr& last = p_.instrs[cur_];
    if (int32_t id = fsdp_grads ? allocated(last, ValueKind::kGradBucket) : -1; id >= 0) {
      int64_t n = 0;
      for (const WeightShape& w : op.weights) n += w.elements();
      params_.fsdp_take_grads(in.block, in.op, allocate_planned(id, n, Dtype::kBf16));
    }
  }

  TensorType hidden_type() const {
    const TrainSpec& t = s_.setup;
    return {{t.seq_len / t.cp * t.micro_batch / (t.sp ? t.tp : 1), s_.model.hidden}, Dtype::kBf16};
  }

  // Token ids or targets: generated on the host, copied to the device.
  void load_tokens(const Instr& in) {
    int32_t id = p_.allocs(in)[0];
    const ScheduleTensor& t = p_.tensors[id];
    const std::string& which = p_.blocks[t.block].graph->tensors[t.tensor].name;
    const TrainSpec& st = s_.setup;
    TensorType all{{st.seq_len * st.micro_batch}, Dtype::kI64},
        type{{st.seq_len / st.cp * st.micro_batch}, Dtype::kI64};
    Tensor x{alloc_.allocate(type.bytes(), p_.tensor_name(id), t.category, id), type};
    std::vector<int64_t> host(static_cast<size_t>(all.elements()));
    fill_tokens(Tensor{host.data(), all}, which, global_mb(in.mb), s_.model.vocab, opt_.seed);
    if (st.cp > 1) {  // this CP rank's rows of the sequence (its two load-balanced chunks)
      OpContext pos;
      pos.setup = &st, pos.cp_rank = cp_rank_;
      std::vector<int64_t> mine(static_cast<size_t>(type.elements()));
      for (int64_t i = 0; i < type.elements(); ++i) mine[i] = host[global_token_row(pos, i)];
      host = std::move(mine);
    }
    be_.copy_from_host(x, host.data());
    bound_[id] = x;
  }

  // Pipeline messages go to the next model chunk (activations) or the previous one (gradients):
  // chunk j is stage j mod pp's, so the last stage's chunk feeds the first stage's next one. The
  // tag is the sending chunk and the direction.
  int64_t chunk_of(const Instr& in) const {
    return p_.blocks[in.block].chunk * s_.setup.pp + stage_;
  }
  static int64_t tag(int64_t sender_chunk, bool grad) { return 2 * sender_chunk + grad; }

  void send(const Instr& in) {
    int32_t id = p_.reads(in)[0];
    bool grad = p_.tensors[id].kind == ValueKind::kGrad;
    int64_t pp = s_.setup.pp, to = chunk_of(in) + (grad ? -1 : 1);
    comm_.send(bound(id), to % pp, tag(chunk_of(in), grad));
  }

  void recv(const Instr& in) {
    int32_t id = p_.allocs(in)[0];
    bool grad = p_.tensors[id].kind == ValueKind::kGrad;
    Tensor x{alloc_.allocate(hidden_type().bytes(), p_.tensor_name(id), p_.tensors[id].category,
                             id),
             hidden_type()};
    bound_[id] = x;
    int64_t pp = s_.setup.pp, from = chunk_of(in) + (grad ? 1 : -1);
    comm_.recv(x, from % pp, tag(from, grad));
  }

  struct Pending {
    Tensor tensor;
    int32_t id;
    AllocRole role;
  };

  const Schedule& s_;
  const StageProgram& p_;
  int64_t stage_, dp_rank_, cp_rank_, tp_rank_;
  const RunOptions& opt_;
  Backend& be_;
  Communicator& comm_;
  TrackingAllocator alloc_;
  ParamStore params_;
  std::map<std::string, int32_t> static_ids_;
  std::vector<std::pair<int32_t, Tensor>> statics_;
  std::vector<std::vector<int32_t>> dies_after_;  // per instruction: ids ascending
  std::vector<Tensor> bound_;                     // per plan tensor id
  TeFp8State te_fp8_;                             // Transformer Engine's float8 state
  std::vector<int32_t> out_ids_, ws_ids_, kept_ids_;
  size_t next_out_ = 0, next_ws_ = 0, next_kept_ = 0;
  std::vector<Pending> pending_;
  int32_t cur_ = 0;  // the instruction running (a stepped op's: its current step)
  const BackwardOperands* bw_ids_ = nullptr;  // the backward running: its operands' ids
  std::vector<Tensor>* bw_gin_ = nullptr;     // ... and its input gradients
  double loss_ = 0;
  int step_ = 0;
  RankRun out_;
};

}  // namespace

RankRun run_rank(const Schedule& s, int64_t stage, Backend& backend, Communicator& comm,
                 const RunOptions& options) {
  return RankRunner(s, stage, backend, comm, options).run();
}

}  // namespace np::exec
