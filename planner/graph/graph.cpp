// Builders of the per-rank block graphs and the graph invariant checker.
#include "planner/graph/graph.hpp"

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/topological_sort.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>

namespace np {

const char* name_of(BlockKind kind) {
  constexpr const char* k[] = {"embedding", "layer", "head"};
  return k[static_cast<int>(kind)];
}

int64_t BlockGraph::weight_elements(bool expert) const {
  int64_t n = 0;
  for (const GraphOp& op : ops)
    if (op.expert_weights == expert)
      for (const WeightShape& w : op.weights) n += w.elements();
  return n;
}

double BlockGraph::forward_flops() const {
  double f = 0;
  for (const GraphOp& op : ops) f += op.flops;
  return f;
}

double BlockGraph::backward_flops() const {
  double f = 0;
  for (const GraphOp& op : ops) f += op.bwd_flops;
  return f;
}

std::string torchtitan_fqn(const std::string& name) {
  if (name == "lm_head") return "output";
  for (auto [ours, theirs] : {std::pair{"attn.", "attention."}, {"mlp.", "feed_forward."}})
    if (name.rfind(ours, 0) == 0) return theirs + name.substr(std::string(ours).size());
  return name;
}

namespace {

// Appends ops and tensors in topological order, shapes from the op table.
class Builder {
 public:
  Builder(BlockKind kind, const ModelSpec& m, const TrainSpec& t) : m_(m), t_(t) { g_.kind = kind; }

  // Names from here on start with `prefix`, and ops carry the MTP depth and checkpoint flag.
  void scope(std::string prefix, int mtp_depth = 0, bool checkpointed = false) {
    prefix_ = std::move(prefix), mtp_depth_ = mtp_depth, checkpointed_ = checkpointed;
  }

  int input(std::string name, TensorType type) {
    int id = add_tensor(prefix_ + name, std::move(type), -1);
    g_.inputs.push_back(id);
    return id;
  }

  std::vector<int> op(OpKind kind, std::string name, OpAttrs attrs, std::vector<int> inputs,
                      std::vector<std::string> out_names = {}) {
    const OpInfo& info = op_info(kind);
    std::vector<TensorType> in;
    for (int i : inputs) in.push_back(g_.tensors[i].type);
    // Megatron without gradient-accumulation fusion: each linear's weight gradient whole in bf16
    // before the DDP hook adds it into the fp32 buffer (the LM head's too: Megatron's own
    // ColumnParallelLinear, megatron/core/tensor_parallel/layers.py,
    // LinearWithGradAccumulationAndAsyncCommunication.backward).
    if ((kind == OpKind::kColumnLinear || kind == OpKind::kRowLinear || kind == OpKind::kLinear) &&
        t_.impl == Impl::kMegatron && !t_.grad_accum_fusion)
      attrs.dense_wgrad = true;
    name = prefix_ + name;
    if ((kind == OpKind::kColumnLinear || kind == OpKind::kRowLinear) && in.size() == 1 &&
        float8_linear(t_, torchtitan_fqn(name), in[0].shape.at(1) * (kind == OpKind::kRowLinear ? t_.tp : 1),
                      attrs.features * (kind == OpKind::kColumnLinear ? t_.tp : 1)))
      // group: the TP ranks whose maxima its casts may take (fp8_max_over_tp).
      attrs.fp8 = t_.fp8, attrs.fp8_gathered = t_.fp8_all_gather, attrs.group = t_.tp;
    GraphOp o{kind, name, attrs, inputs, {}, info.weights(attrs, in)};
    o.mtp_depth = mtp_depth_, o.mtp_checkpointed = checkpointed_;
    o.flops = info.flops(attrs, in);
    o.bwd_flops = backward_flops(info, attrs, in);
    int index = static_cast<int>(g_.ops.size());
    std::vector<TensorType> outs = info.infer(attrs, in);
    for (size_t j = 0; j < outs.size(); ++j) {
      // Named outputs are "op.name"; an empty name (or none given) is the op's own name.
      std::string tname =
          j < out_names.size() && !out_names[j].empty() ? name + "." + out_names[j] : name;
      o.outputs.push_back(add_tensor(tname, outs[j], index));
    }
    for (int i : inputs) g_.tensors[i].consumers.push_back(index);
    set_collectives(o);
    o.tp_partial_weight_grads = partial_weight_grads(o);
    g_.ops.push_back(std::move(o));
    return g_.ops.back().outputs;
  }
  int op1(OpKind kind, std::string name, OpAttrs attrs, std::vector<int> inputs) {
    return op(kind, std::move(name), std::move(attrs), std::move(inputs))[0];
  }
  GraphOp& last() { return g_.ops.back(); }

  // Sequence-parallel all-gather before a column-parallel linear; under plain TP the linear's
  // backward all-reduces its input gradient instead (Megatron's f).
  int gather(int x, const std::string& name) {
    if (!t_.sp) return x;
    return op1(OpKind::kAllGather, name + ".all_gather", {.group = t_.tp}, {x});
  }
  int column(int x, const std::string& name, int64_t features, bool bias,
             std::vector<int64_t> sections = {}) {
    OpAttrs a{.features = features, .bias = bias, .sections = std::move(sections)};
    OpKind kind = OpKind::kColumnLinear;
    const Dtype in = g_.tensors[x].type.dtype;
    if (in == Dtype::kFp8E4m3 && te_fp8(t_))  // the input of a norm writing float8
      kind = OpKind::kTeColumnLinear, a.fp8 = t_.fp8, a.fp8_transpose = !t_.sp;
    int y = op1(kind, name, std::move(a), {x});
    if (t_.tp > 1 && !t_.sp) last().bwd_collective = "all_reduce";
    return y;
  }
  // Reduction after a row-parallel linear: reduce-scatter under SP, all-reduce under plain TP.
  // torchao's float8 tensor parallelism (tensorwise, torchtitan's apply_tp; ops.hpp): the
  // sequence shard cast and gathered in float8 ({e4m3, scale}); a column linear on it; a row
  // linear that casts its input and reduce-scatters (its output, the SP shard). Under FSDP's
  // float8 all-gather the linears' weights arrive in float8 (OpAttrs::fp8_gathered).
  std::vector<int> fp8_gather(int x, const std::string& name) {
    OpAttrs a{.group = t_.tp};
    a.fp8 = Fp8Recipe::kTensorwise;
    return op(OpKind::kFp8AllGather, name + ".all_gather", a, {x}, {"", "scale"});
  }
  int fp8_column(const std::vector<int>& x8, const std::string& name, int64_t features,
                 bool bias) {
    OpAttrs a{.features = features, .group = t_.tp, .bias = bias};
    a.fp8 = Fp8Recipe::kTensorwise, a.fp8_gathered = t_.fp8_all_gather;
    return op1(OpKind::kFp8ColumnLinear, name, a, {x8[0], x8[1]});
  }
  int fp8_row(int x, const std::string& name, int64_t features, bool bias) {
    OpAttrs a{.features = features, .group = t_.tp, .bias = bias};
    a.fp8 = Fp8Recipe::kTensorwise, a.fp8_gathered = t_.fp8_all_gather;
    return op(OpKind::kFp8RowLinear, name, a, {x}, {"", "input_fp8", "input_scale"})[0];
  }
  // A row-parallel linear and its reduction (reduce-scatter under SP, else all-reduce over TP):
  // under te_fp8 one TE float8 op, else the linear and reduce().
  int row_reduce(int x, const std::string& name, int64_t features, bool bias) {
    if (!te_fp8(t_))
      return reduce(op1(OpKind::kRowLinear, name, {.features = features, .bias = bias}, {x}),
                    name.substr(0, name.find('.')));
    OpAttrs a{.features = features, .group = t_.sp ? t_.tp : 1, .bias = bias};
    a.fp8 = t_.fp8;
    int y = op(OpKind::kTeRowLinear, name, a, {x}, {"", "input_fp8"})[0];
    if (t_.tp > 1 && !t_.sp) last().fwd_collective = "all_reduce";
    return y;
  }
  int reduce(int x, const std::string& name) {
    if (t_.tp == 1) return x;
    if (t_.sp) return op1(OpKind::kReduceScatter, name + ".reduce_scatter", {.group = t_.tp}, {x});
    return op1(OpKind::kAllReduce, name + ".all_reduce", {.group = t_.tp}, {x});
  }
  int dropout(int x, const std::string& name) {
    if (m_.dropout <= 0.0) return x;
    return op(OpKind::kDropout, name, {}, {x}, {"out", "mask"})[0];
  }
  // The profile's norm: statistics recomputed in backward (fused) or kept as extra outputs.
  // te_input: it is the norm of a TE LayerNorm-linear, which under te_fp8 writes float8.
  int norm(int x, const std::string& name, bool te_input = false) {
    bool rms = m_.norm == Norm::kRms;
    if (te_input && te_fp8(t_)) {
      OpAttrs a;
      a.fp8 = t_.fp8, a.fp8_transpose = !t_.sp;
      return op(rms ? OpKind::kRmsNormStats : OpKind::kLayerNormStats, name, a, {x},
                rms ? std::vector<std::string>{"", "rstd"}
                    : std::vector<std::string>{"", "mean", "rstd"})[0];
    }
    if (rms && t_.impl == Impl::kHf)
      return op(OpKind::kRmsNormHf, name, {}, {x}, {"", "fp32_input", "rstd", "normalized"})[0];
    if (t_.impl == Impl::kFused)
      return op1(rms ? OpKind::kRmsNorm : OpKind::kLayerNorm, name, {}, {x});
    return op(rms ? OpKind::kRmsNormStats : OpKind::kLayerNormStats, name, {}, {x},
              rms ? std::vector<std::string>{"", "rstd"}
                  : std::vector<std::string>{"", "mean", "rstd"})[0];
  }
  // silu(gate) * up of [gate | up]: one fused op, or (nanotron, hf) act(gate) kept, then the
  // product.
  int glu(int gu, const std::string& name) {
    if (t_.impl != Impl::kNanotron && t_.impl != Impl::kHf)
      return op1(OpKind::kSwiGlu, name + ".swiglu", {}, {gu});
    int a = op1(OpKind::kGluAct, name + ".silu", {}, {gu});
    return op1(OpKind::kGluMul, name + ".swiglu", {}, {a, gu});
  }

  // This rank's tokens of a micro-batch: 1 / cp of each sequence (context parallelism), then
  // 1 / tp of those between the TP regions (sequence parallelism).
  int64_t local_tokens() const { return tokens() / (t_.sp ? t_.tp : 1); }
  int64_t tokens() const { return t_.seq_len / t_.cp * t_.micro_batch; }
  BlockGraph finish(int in, int out) {
    g_.hidden_in = in;
    g_.hidden_out = out;
    return std::move(g_);
  }

 private:
  int add_tensor(std::string name, TensorType type, int producer) {
    g_.tensors.push_back({std::move(name), std::move(type), producer, {}});
    return static_cast<int>(g_.tensors.size()) - 1;
  }

  // Replicated weights (weight_shard) whose per-rank gradient is partial: applied to a sequence
  // shard, to this rank's heads (the q/k norms), or (the shared-expert gate) multiplying a
  // TP-partial sum. Their gradients are all-reduced over TP.
  bool partial_weight_grads(const GraphOp& o) const {
    for (const WeightShape& w : o.weights)
      if (weight_shard(o.kind, w.suffix) != Shard::kReplicated) return false;
    const bool qk = o.kind == OpKind::kQkNorm || o.kind == OpKind::kQkNormHf ||
                    o.kind == OpKind::kHeadRmsNorm;
    bool on_shard = (is_norm(o.kind) && !qk) || o.kind == OpKind::kPosEmbedding ||
                    o.kind == OpKind::kRouter || o.kind == OpKind::kLinear;
    bool on_heads = qk || o.kind == OpKind::kSharedGate;
    return !o.weights.empty() && ((t_.sp && on_shard) || (t_.tp > 1 && on_heads));
  }

  // The collectives of an op, forward and backward (the TP ones are conjugate pairs).
  void set_collectives(GraphOp& o) const {
    switch (o.kind) {
      case OpKind::kAllGather:
      case OpKind::kCpGatherKv:
      case OpKind::kFp8AllGather:
        o.fwd_collective = "all_gather", o.bwd_collective = "reduce_scatter";
        break;
      case OpKind::kReduceScatter:
      case OpKind::kFp8RowLinear:
        o.fwd_collective = "reduce_scatter", o.bwd_collective = "all_gather";
        break;
      case OpKind::kTeRowLinear:  // the all-reduce without SP: row_reduce
        if (o.attrs.group > 1) o.fwd_collective = "reduce_scatter", o.bwd_collective = "all_gather";
        break;
      case OpKind::kGatherFeatures:
        o.fwd_collective = "all_gather";
        break;
      case OpKind::kScatterRows:
        o.bwd_collective = "all_gather";
        break;
      case OpKind::kAllReduce:
        o.fwd_collective = "all_reduce";
        break;
      case OpKind::kMoeDispatch:
      case OpKind::kMoeCombine:
        if (t_.ep > 1) o.fwd_collective = o.bwd_collective = "all_to_all";
        break;
      default:
        break;
    }
  }

  const ModelSpec& m_;
  const TrainSpec& t_;
  BlockGraph g_;
  std::string prefix_;
  int mtp_depth_ = 0;
  bool checkpointed_ = false;
};

// Multi-head latent attention's [q | k | v] rows, as Megatron's MLASelfAttention builds them
// (Megatron-LM d98e8a6, megatron/core/transformer/multi_latent_attention.py,
// get_query_key_value_tensors and qkv_up_proj_and_rope_apply; the TE layer spec puts each latent's
// norm in its up-projection, TELayerNormColumnParallelLinear, gpt_layer_specs.py L121-131):
// - the down-projections are TE Linears in "duplicated" mode, every TP rank holding their weights
//   and applying them to its own rows (its sequence shard under SP);
// - each latent is normed, then all-gathered under SP, before its column-parallel up-projection;
// - the keys' RoPE part (k_pos_emb) is all-gathered under SP (gather_from_sequence_parallel_
//   region), its gradient reduce-scattered; without SP the rope op all-reduces that gradient;
// - the RoPE of q's and k's rope parts and the concatenation into query, key and value are one op,
//   as apply_rope_fusion's fused_apply_mla_rope_for_q / _for_kv produce them.
// Megatron projects [kv latent | k_pos_emb] with one linear_kv_down_proj and splits its output
// into views of one allocation; here they are two linears, kv_down and k_pe, of the same weights
// and FLOPs in two tensors (docs/estimate.md says what that leaves out).
int mla_qkv(Builder& b, const ModelSpec& m, const TrainSpec& t, int n) {
  const MlaSpec& a = *m.mla;
  const int64_t h = m.heads / t.tp, dqk = m.head_dim;
  int q;
  if (a.q_lora_rank > 0) {
    int qc = b.op1(OpKind::kLinear, "attn.q_down", {.features = a.q_lora_rank}, {n});
    qc = b.norm(qc, "attn.q_norm");
    q = b.column(b.gather(qc, "attn.q_up"), "attn.q_up", h * dqk, false);
  } else {
    q = b.column(b.gather(n, "attn.q"), "attn.q", h * dqk, false);
  }
  int kv = b.op1(OpKind::kLinear, "attn.kv_down", {.features = a.kv_lora_rank}, {n});
  kv = b.norm(kv, "attn.kv_norm");
  kv = b.column(b.gather(kv, "attn.kv_up"), "attn.kv_up", h * (a.qk_nope_head_dim + a.v_head_dim),
                false, {h * a.qk_nope_head_dim, h * a.v_head_dim});
  int pe = b.op1(OpKind::kLinear, "attn.k_pe", {.features = a.qk_rope_head_dim}, {n});
  pe = b.gather(pe, "attn.k_pe");
  int qkv = b.op1(OpKind::kMlaRope, "attn.rope",
                  {.heads = h, .head_dim = dqk, .v_head_dim = a.v_head_dim,
                   .rope_dim = a.qk_rope_head_dim},
                  {q, kv, pe});
  if (t.tp > 1 && !t.sp) b.last().bwd_collective = "all_reduce";
  return qkv;
}

// torchtitan's Attention.forward (torchtitan 238fa99, torchtitan/models/llama3/model/model.py):
// the normed input (all-gathered under TP, which torchtitan runs with sequence parallelism:
// PrepareModuleInput to Replicate in infra/parallelize.py) through wq, wk and wv, RoPE of q and k
// in complex fp32, SDPA's flash kernel, wo, and the residual add. The models with q/k norms are
// torchtitan's qwen3 (torchtitan/models/qwen3/model/model.py): q_norm and k_norm on q's and k's
// heads, then its rotate-half RoPE in bf16 ops.
int titan_attention(Builder& b, const ModelSpec& m, const TrainSpec& t, int x) {
  const int64_t hq = m.heads / t.tp, hkv = m.kv_heads / t.tp, d = m.head_dim;
  int q, k, v;
  if (float8_tp(t)) {  // Float8ColwiseParallel after PrepareFloat8ModuleInput
    std::vector<int> x8 = b.fp8_gather(b.norm(x, "attn.norm"), "attn");
    q = b.fp8_column(x8, "attn.wq", hq * d, m.qkv_bias);
    k = b.fp8_column(x8, "attn.wk", hkv * d, m.qkv_bias);
    v = b.fp8_column(x8, "attn.wv", hkv * d, m.qkv_bias);
  } else {
    int n = b.gather(b.norm(x, "attn.norm"), "attn");
    q = b.column(n, "attn.wq", hq * d, m.qkv_bias);
    k = b.column(n, "attn.wk", hkv * d, m.qkv_bias);
    v = b.column(n, "attn.wv", hkv * d, m.qkv_bias);
  }
  std::vector<int> qk;
  if (m.qk_norm) {
    q = b.op(OpKind::kHeadRmsNorm, "attn.q_norm", {.heads = hq, .head_dim = d}, {q},
             {"", "rstd"})[0];
    k = b.op(OpKind::kHeadRmsNorm, "attn.k_norm", {.heads = hkv, .head_dim = d}, {k},
             {"", "rstd"})[0];
    qk = b.op(OpKind::kRopeHalfQk, "attn.rope", {.head_dim = d}, {q, k}, {"q", "k"});
  } else {
    qk = b.op(OpKind::kRopeQk, "attn.rope", {.head_dim = d}, {q, k}, {"q", "k"});
  }
  OpAttrs core{
      .batch = t.micro_batch, .seq = t.seq_len, .heads = hq, .kv_heads = hkv, .head_dim = d};
  int ctx = b.op(OpKind::kSdpa, "attn.core", core, {qk[0], qk[1], v}, {"out", "lse"})[0];
  if (float8_tp(t))  // Float8RowwiseParallel
    return b.op1(OpKind::kAdd, "attn.residual", {}, {x, b.fp8_row(ctx, "attn.wo", m.hidden, m.linear_bias)});
  int o = b.op1(OpKind::kRowLinear, "attn.wo", {.features = m.hidden, .bias = m.linear_bias},
                {ctx});
  return b.op1(OpKind::kAdd, "attn.residual", {}, {x, b.reduce(o, "attn")});
}

int attention(Builder& b, const ModelSpec& m, const TrainSpec& t, int x) {
  if (t.impl == Impl::kTorchtitan) return titan_attention(b, m, t, x);
  int64_t hq = m.heads / t.tp, hkv = m.kv_heads / t.tp, d = m.head_dim;
  int n = b.norm(x, "attn.norm", !m.mla);  // MLA's first linears are no LayerNorm-linears
  OpAttrs core{
      .batch = t.micro_batch, .seq = t.seq_len, .heads = hq, .kv_heads = hkv, .head_dim = d};
  int qkv;
  if (m.mla) {
    qkv = mla_qkv(b, m, t, n);
    core.v_head_dim = m.mla->v_head_dim;
  } else {
    qkv = b.column(b.gather(n, "attn"), "attn.qkv", (hq + 2 * hkv) * d, m.qkv_bias,
                   {hq * d, hkv * d, hkv * d});
  }
  if (m.qk_norm)
    qkv = t.impl == Impl::kHf
              ? b.op(OpKind::kQkNormHf, "attn.qk_norm", core, {qkv},
                     {"", "fp32_input", "rstd", "normalized"})[0]
              : b.op(OpKind::kQkNorm, "attn.qk_norm", core, {qkv}, {"", "rstd"})[0];
  if (m.position == PosEmb::kRope && !m.mla) qkv = b.op1(OpKind::kRope, "attn.rope", {}, {qkv});
  // Hugging Face's attention (eager and sdpa) materialises K and V repeated to every query head.
  bool hf = t.impl == Impl::kHf && t.cp == 1;
  if (hf && hkv < hq) {
    qkv = b.op1(OpKind::kRepeatKv, "attn.repeat_kv", core, {qkv});
    core.kv_heads = hq;
  }
  int ctx;
  if (t.cp > 1) {  // validate_setup: flash attention only
    OpAttrs cp = core;
    cp.group = t.cp;
    int kv = b.op1(OpKind::kCpGatherKv, "attn.cp_gather_kv", cp, {qkv});
    ctx = b.op(OpKind::kFlashAttentionCp, "attn.core", cp, {qkv, kv}, {"out", "lse"})[0];
  } else if (t.attention == AttentionImpl::kFlash) {
    ctx = b.op(OpKind::kFlashAttention, "attn.core", core, {qkv}, {"out", "lse"})[0];
  } else {
    int s = b.op1(OpKind::kAttnScores, "attn.scores", core, {qkv});
    b.last().attention_core = true;
    int p = hf ? b.op(OpKind::kSoftmaxFp32, "attn.softmax", core, {s}, {"", "fp32"})[0]
               : b.op1(OpKind::kSoftmax, "attn.softmax", core, {s});
    b.last().attention_core = true;
    int pd = b.dropout(p, "attn.probs_dropout");
    if (pd != p) b.last().attention_core = true;
    ctx = b.op1(OpKind::kAttnContext, "attn.context", core, {pd, qkv});
  }
  int o = b.dropout(b.row_reduce(ctx, "attn.out", m.hidden, m.linear_bias), "attn.dropout");
  return b.op1(OpKind::kAdd, "attn.residual", {}, {x, o});
}

// Returns the row-parallel output (partial over tp) of a SwiGLU or GeLU MLP of width ffn; under
// te_fp8 (dense models only) already reduced, by the TE row linear.
int dense_mlp(Builder& b, const ModelSpec& m, const TrainSpec& t, int x, const std::string& name,
              int64_t ffn) {
  if (m.activation == Activation::kSwiGlu && t.impl == Impl::kTorchtitan) {
    // torchtitan's FeedForward.forward: w2(F.silu(w1(x)) * w3(x)), evaluated in that order.
    int g = b.column(x, name + ".w1", ffn / t.tp, m.linear_bias);
    int a = b.op1(OpKind::kSilu, name + ".silu", {}, {g});
    int u = b.column(x, name + ".w3", ffn / t.tp, m.linear_bias);
    int p = b.op1(OpKind::kMul, name + ".mul", {}, {a, u});
    return b.op1(OpKind::kRowLinear, name + ".w2", {.features = m.hidden, .bias = m.linear_bias},
                 {p});
  }
  if (m.activation == Activation::kSwiGlu) {
    int gu =
        b.column(x, name + ".gate_up", 2 * ffn / t.tp, m.linear_bias, {ffn / t.tp, ffn / t.tp});
    int a = b.glu(gu, name);
    if (te_fp8(t)) return b.row_reduce(a, name + ".down", m.hidden, m.linear_bias);
    return b.op1(OpKind::kRowLinear, name + ".down", {.features = m.hidden, .bias = m.linear_bias},
                 {a});
  }
  int f1 = b.column(x, name + ".fc1", ffn / t.tp, m.linear_bias);
  int a = b.op1(OpKind::kGelu, name + ".gelu", {}, {f1});
  if (te_fp8(t)) return b.row_reduce(a, name + ".fc2", m.hidden, m.linear_bias);
  return b.op1(OpKind::kRowLinear, name + ".fc2", {.features = m.hidden, .bias = m.linear_bias},
               {a});
}

// Megatron's capacity per expert over one source rank's tokens: ceil(tokens x top_k x factor /
// experts); 0 without a factor (dropless).
int64_t expert_capacity(int64_t tokens, const MoeSpec& e, double factor) {
  if (factor <= 0) return 0;
  return static_cast<int64_t>(std::ceil(static_cast<double>(tokens * e.top_k) * factor /
                                        static_cast<double>(e.num_experts)));
}

// MoE under TP requires SP (as Megatron): the router sees this rank's sequence shard, and the
// routing decisions are gathered with the tokens, so no gradient is counted once per TP rank.
int moe_mlp(Builder& b, const ModelSpec& m, const TrainSpec& t, int shard) {
  const MoeSpec& e = *m.moe;
  int logits = b.op1(OpKind::kRouter, "moe.router", {.features = e.num_experts}, {shard});
  std::vector<int> routed;
  if (e.router.plain()) {
    routed = b.op(OpKind::kTopK, "moe.topk", {.top_k = e.top_k}, {logits}, {"probs", "indices"});
  } else {
    OpAttrs r{.top_k = e.top_k, .router = e.router, .bias = e.expert_bias};
    int scores = b.op1(OpKind::kRouteScores, "moe.scores", r, {logits});
    routed = b.op(OpKind::kRouteTopK, "moe.topk", r, {scores}, {"probs", "indices"});
  }
  int x = b.gather(shard, "moe");
  int probs = b.gather(routed[0], "moe.probs"), idx = b.gather(routed[1], "moe.indices");
  OpAttrs experts{.features = 2 * e.expert_ffn / t.tp,
                  .group = t.ep,
                  .experts = e.num_experts / t.ep,
                  .top_k = e.top_k,
                  .capacity = expert_capacity(b.tokens(), e, t.moe_capacity_factor),
                  .sections = {e.expert_ffn / t.tp, e.expert_ffn / t.tp}};
  int xe = b.op1(OpKind::kMoeDispatch, "moe.dispatch", experts, {x, idx});
  int gu = b.op1(OpKind::kExpertColumn, "moe.experts.gate_up", experts, {xe, idx});
  b.last().expert_weights = true;
  int a = b.glu(gu, "moe.experts");
  experts.features = m.hidden;
  experts.sections.clear();
  int ye = b.op1(OpKind::kExpertRow, "moe.experts.down", experts, {a, idx});
  b.last().expert_weights = true;
  int y = b.op1(OpKind::kMoeCombine, "moe.combine", experts, {ye, probs, idx});
  if (e.shared_ffn == 0) return y;
  int s = dense_mlp(b, m, t, x, "moe.shared", e.shared_ffn);
  if (e.shared_gate) s = b.op1(OpKind::kSharedGate, "moe.shared.gate", {}, {x, s});
  return b.op1(OpKind::kAdd, "moe.add_shared", {}, {y, s});
}

// torchtitan's FeedForward under torchao's float8 tensor parallelism: w1 and w3 on the float8
// gather of the normed shard n, w2 reduce-scattering itself; returns the SP shard.
int titan_fp8_mlp(Builder& b, const ModelSpec& m, const TrainSpec& t, int n) {
  std::vector<int> x8 = b.fp8_gather(n, "mlp");
  int g = b.fp8_column(x8, "mlp.w1", m.ffn / t.tp, m.linear_bias);
  int a = b.op1(OpKind::kSilu, "mlp.silu", {}, {g});
  int u = b.fp8_column(x8, "mlp.w3", m.ffn / t.tp, m.linear_bias);
  int p = b.op1(OpKind::kMul, "mlp.mul", {}, {a, u});
  return b.fp8_row(p, "mlp.w2", m.hidden, m.linear_bias);
}

// Attention, then the MLP (MoE when the model has it), on the residual stream x.
int decoder_layer(Builder& b, const ModelSpec& m, const TrainSpec& t, int x) {
  int x1 = attention(b, m, t, x);
  int n = b.norm(x1, "mlp.norm", !m.moe);
  if (float8_tp(t) && !m.moe)
    return b.op1(OpKind::kAdd, "mlp.residual", {}, {x1, titan_fp8_mlp(b, m, t, n)});
  int y = m.moe ? moe_mlp(b, m, t, n) : dense_mlp(b, m, t, b.gather(n, "mlp"), "mlp", m.ffn);
  if (!te_fp8(t)) y = b.reduce(y, "mlp");
  y = b.dropout(y, "mlp.dropout");
  return b.op1(OpKind::kAdd, "mlp.residual", {}, {x1, y});
}

// The token embedding (vocab-parallel, reduced over TP), positions and dropout, of token ids.
int embed(Builder& b, const ModelSpec& m, const TrainSpec& t, int ids) {
  int e = b.op1(OpKind::kEmbedding, "embed.tokens",
                {.features = m.hidden, .rows = padded_vocab(m, t) / t.tp,
                 .tie = "embedding",
                 .dense_wgrad = t.impl == Impl::kMegatron},
                {ids});
  e = b.reduce(e, "embed");
  if (m.position == PosEmb::kLearned)
    e = b.op1(OpKind::kPosEmbedding, "embed.positions",
              {.features = m.hidden, .rows = m.max_positions}, {e});
  return b.dropout(e, "embed.dropout");
}

// The LM head and the loss of normed hidden states n, against the block input "targets". With
// multi-token prediction every depth's head holds the main head's weights (tie "lm_head").
void lm_loss(Builder& b, const ModelSpec& m, const TrainSpec& t, int n, double weight) {
  int logits = b.column(b.gather(n, "lm_head"), "lm_head", padded_vocab(m, t) / t.tp, false);
  if (m.tie_embeddings) b.last().attrs.tie = "embedding";
  else if (mtp_depths(m, t) > 0) b.last().attrs.tie = "lm_head";
  int targets = b.input("targets", {{b.tokens()}, Dtype::kI64});
  // torchtitan's cross_entropy_loss is the same F.cross_entropy of pred.float() (torchtitan
  // 238fa99, torchtitan/components/loss.py), its train step holding pred until the loss is formed
  // (train.py: del pred before loss.backward()).
  if (t.impl == Impl::kHf || t.impl == Impl::kTorchtitan) {
    int fp32 = b.op1(OpKind::kCastFp32, "loss.cast", {}, {logits});
    b.op(OpKind::kLogSoftmaxLoss, "loss", {}, {fp32, targets, logits},
         {"per_token", "log_softmax"});
  } else if (t.impl == Impl::kMegatron && t.loss_fusion == LossFusion::kTe) {
    b.op(OpKind::kCrossEntropyTe, "loss", {}, {logits, targets}, {"per_token", "row_stats"});
  } else {
    b.op(OpKind::kCrossEntropy, "loss",
         {.fp32_copy = t.impl == Impl::kNanotron,
          .fp32_grad = t.impl == Impl::kMegatron && t.loss_fusion == LossFusion::kNative},
         {logits, targets}, {"per_token", "softmax"});
  }
  b.last().attrs.loss_weight = weight;
}

// Multi-token prediction depth k on h, the previous depth's normed output: the module's own ops
// (build_head in graph.hpp), returning its normed output. The ops from the norms to the final norm
// are those Megatron's _checkpointed_forward re-runs under full recompute.
int mtp_depth(Builder& b, const ModelSpec& m, const TrainSpec& t, int h, int k) {
  const std::string prefix = "mtp" + std::to_string(k) + ".";
  b.scope(prefix, k);
  int e = embed(b, m, t, b.input("input_ids", {{b.tokens()}, Dtype::kI64}));
  b.scope(prefix, k, true);
  int c = b.op1(OpKind::kConcat, "concat", {.features = m.hidden},
                {b.norm(e, "enorm"), b.norm(h, "hnorm")});
  int p = b.column(b.gather(c, "eh_proj"), "eh_proj", m.hidden / t.tp, false);
  if (t.tp > 1) {
    p = b.op1(OpKind::kGatherFeatures, "eh_proj.gather", {.group = t.tp}, {p});
    if (t.sp) p = b.op1(OpKind::kScatterRows, "eh_proj.scatter", {.group = t.tp}, {p});
  }
  int out = b.norm(decoder_layer(b, m, t, p), "final_norm");
  b.scope(prefix, k);
  return out;
}

}  // namespace

std::string layer_graph_key(const TrainSpec& t) {
  char cf[32];
  std::snprintf(cf, sizeof cf, "%.17g", t.moe_capacity_factor);
  std::string filters;
  for (const std::string& f : t.fp8_filter) filters += "," + f;
  return "tp" + std::to_string(t.tp) + "/sp" + std::to_string(t.sp) + "/cp" +
         std::to_string(t.cp) + "/ep" + std::to_string(t.ep) + "/s" + std::to_string(t.seq_len) +
         "/b" + std::to_string(t.micro_batch) + "/" + name_of(t.attention) + "/" +
         name_of(t.impl) + "/cf" + cf + "/gaf" + std::to_string(t.grad_accum_fusion) + "/fp8" +
         name_of(t.fp8) + filters + "/ag" + std::to_string(t.fp8_all_gather);
}

BlockGraph build_layer(const ModelSpec& m, const TrainSpec& t) {
  Builder b(BlockKind::kLayer, m, t);
  int x = b.input("x", {{b.local_tokens(), m.hidden}, Dtype::kBf16});
  return b.finish(x, decoder_layer(b, m, t, x));
}

bool mixed_layers(const ModelSpec& m) {
  return m.moe && !m.dense_layers.empty();
}

bool dense_layer(const ModelSpec& m, int64_t layer) {
  return mixed_layers(m) &&
         std::binary_search(m.dense_layers.begin(), m.dense_layers.end(), layer);
}

BlockGraph build_dense_layer(const ModelSpec& m, const TrainSpec& t) {
  ModelSpec dense = m;
  dense.moe.reset(), dense.dense_layers.clear();
  return build_layer(dense, t);
}

BlockGraph build_embedding(const ModelSpec& m, const TrainSpec& t) {
  Builder b(BlockKind::kEmbedding, m, t);
  return b.finish(-1, embed(b, m, t, b.input("input_ids", {{b.tokens()}, Dtype::kI64})));
}

BlockGraph build_head(const ModelSpec& m, const TrainSpec& t) {
  Builder b(BlockKind::kHead, m, t);
  int x = b.input("x", {{b.local_tokens(), m.hidden}, Dtype::kBf16});
  int n = b.norm(x, "final_norm");
  // Megatron's process_mtp_loss computes the depths' logits and losses before the main model's.
  const int64_t depths = mtp_depths(m, t);
  int h = n;
  for (int k = 1; k <= depths; ++k) {
    h = mtp_depth(b, m, t, h, k);
    lm_loss(b, m, t, h, t.mtp_loss_scale / static_cast<double>(depths));
  }
  b.scope("");
  lm_loss(b, m, t, n, 1.0);
  return b.finish(x, -1);
}

BlockGraphs::BlockGraphs(const ModelSpec& m, const TrainSpec& t)
    : embedding(std::make_shared<const BlockGraph>(build_embedding(m, t))),
      layer(std::make_shared<const BlockGraph>(build_layer(m, t))),
      head(std::make_shared<const BlockGraph>(build_head(m, t))),
      dense_layer(mixed_layers(m) ? std::make_shared<const BlockGraph>(build_dense_layer(m, t))
                                  : nullptr),
      dense_layers(mixed_layers(m) ? m.dense_layers : std::vector<int64_t>{}) {}

const std::shared_ptr<const BlockGraph>& BlockGraphs::of(BlockKind kind, int64_t l) const {
  if (kind == BlockKind::kLayer && dense_layer &&
      std::binary_search(dense_layers.begin(), dense_layers.end(), l))
    return dense_layer;
  return kind == BlockKind::kEmbedding ? embedding : kind == BlockKind::kLayer ? layer : head;
}

std::optional<Error> check_graph(const BlockGraph& g) {
  using Dag = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS>;
  Dag dag(g.ops.size());
  for (size_t i = 0; i < g.ops.size(); ++i)
    for (int t : g.ops[i].inputs) {
      int p = g.tensors.at(t).producer;
      if (p >= static_cast<int>(i))
        return make_error("graph: op " + g.ops[i].name + " reads " + g.tensors[t].name +
                          " before it is produced");
      if (p >= 0) boost::add_edge(p, i, dag);
    }
  std::vector<Dag::vertex_descriptor> order;
  try {
    boost::topological_sort(dag, std::back_inserter(order));
  } catch (const boost::not_a_dag&) {
    return make_error("graph: the block has a cycle");
  }
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const GraphOp& op = g.ops[i];
    const OpInfo& info = op_info(op.kind);
    if (static_cast<int>(op.inputs.size()) != info.num_inputs ||
        static_cast<int>(op.outputs.size()) != info.num_outputs)
      return make_error("graph: op " + op.name + " has the wrong number of inputs or outputs");
    for (int t : op.outputs)
      if (g.tensors.at(t).producer != static_cast<int>(i))
        return make_error("graph: tensor " + g.tensors[t].name + " has two producers");
  }
  return std::nullopt;
}

std::vector<bool> backward_runs(const BlockGraph& g) {
  std::vector<bool> has_grad(g.tensors.size(), false), runs(g.ops.size(), false);
  if (g.hidden_out >= 0) has_grad[g.hidden_out] = true;
  for (int o = static_cast<int>(g.ops.size()) - 1; o >= 0; --o) {
    const GraphOp& op = g.ops[o];
    const OpInfo& info = op_info(op.kind);
    bool live = info.grad_outputs == 0;
    for (size_t j = 0; j < op.outputs.size(); ++j)
      if ((info.grad_outputs >> j & 1u) && has_grad[op.outputs[j]]) live = true;
    if (!live) continue;
    runs[o] = true;
    for (size_t k = 0; k < op.inputs.size(); ++k)
      if (info.grad_inputs >> k & 1u) has_grad[op.inputs[k]] = true;
  }
  return runs;
}

std::vector<bool> backward_reads(const BlockGraph& g) {
  std::vector<bool> needed(g.tensors.size(), false);
  for (const GraphOp& op : g.ops) {
    const OpInfo& info = op_info(op.kind);
    for (size_t k = 0; k < op.inputs.size(); ++k)
      if (info.bwd_reads_inputs >> k & 1u) needed[op.inputs[k]] = true;
    for (size_t j = 0; j < op.outputs.size(); ++j)
      if (info.bwd_reads_outputs >> j & 1u) needed[op.outputs[j]] = true;
  }
  return needed;
}

int64_t mtp_parameters(const ModelSpec& m, int64_t depths) {
  TrainSpec with, without;
  with.seq_len = without.seq_len = 1;
  with.mtp_layers = depths, without.mtp_layers = 0;
  BlockGraph a = build_head(m, with), b = build_head(m, without);
  int64_t n = a.weight_elements(false) + a.weight_elements(true) - b.weight_elements(false) -
              b.weight_elements(true) -
              depths * 2 * m.vocab * m.hidden;  // each depth's embedding and LM head, tied
  if (m.moe && m.moe->expert_bias) n += depths * m.moe->num_experts;
  return n;
}

int64_t count_parameters(const ModelSpec& m) {
  TrainSpec t;
  t.seq_len = 1;
  t.mtp_layers = 0;
  BlockGraph emb = build_embedding(m, t), layer = build_layer(m, t), head = build_head(m, t);
  int64_t per_layer = layer.weight_elements(false) + layer.weight_elements(true);
  const int64_t dense = mixed_layers(m) ? static_cast<int64_t>(m.dense_layers.size()) : 0;
  int64_t n = emb.weight_elements(false) + (m.layers - dense) * per_layer +
              head.weight_elements(false);
  if (dense > 0) n += dense * build_dense_layer(m, t).weight_elements(false);
  if (m.tie_embeddings) n -= m.vocab * m.hidden;  // the LM head reuses the embedding table
  if (m.moe && m.moe->expert_bias) n += (m.layers - dense) * m.moe->num_experts;
  return n;
}

}  // namespace np
