// The CUDA backend's ops: each OpKind's forward and backward on the kernels (ops.hpp).
#include "executor/cuda/ops.hpp"

#include <algorithm>
#include <cmath>

namespace np::cuda {

using exec::AllocRole;
using exec::BackwardArgs;
using exec::OpContext;

[[noreturn]] void unsupported(const OpContext& c, const char* why) {
  throw std::runtime_error(std::string("cuda backend: ") + c.op->name + " (" +
                           name_of(c.op->kind) + "): " + why);
}

Tensor& Bwd::grad(int k, const TensorType& t, bool& acc) const {
  Tensor& dst = a.grad_inputs[static_cast<size_t>(k)];
  acc = static_cast<bool>(dst);
  if (!dst) dst = c.alloc(t, AllocRole::kGradInput);
  return dst;
}

void Bwd::pass(int k, const Tensor& g) const {
  bool acc = false;
  Tensor& dst = grad(k, g.type, acc);
  if (acc) accumulate(dst, g, stream);
  else NP_CUDA_CHECK(cudaMemcpy(dst.data, g.data, static_cast<size_t>(g.bytes()), cudaMemcpyDeviceToDevice));
}

namespace {

constexpr float kEps = static_cast<float>(exec::kNormEps);
constexpr Dtype kAct = Dtype::kBf16;

const Tensor& need(std::span<const Tensor> ts, size_t i, const char* what) {
  if (i >= ts.size() || !ts[i]) throw std::invalid_argument(std::string("cuda backend: missing ") + what);
  return ts[i];
}

TensorType with_rows(TensorType t, int64_t rows) {
  t.shape.at(0) = rows;
  return t;
}

int64_t first_row(const OpContext& c, int64_t rows) { return exec::first_token_row(c, rows); }

// The experts this rank routes to: all of them (expert parallelism, its all-to-all, runs on the
// CPU executor).
int64_t routed_experts(const OpContext& c) {
  if (c.op->attrs.group > 1)
    unsupported(c, "expert parallelism (ep > 1) runs on the CPU executor; this backend routes at "
                   "ep = 1");
  return c.op->attrs.experts;
}

AttentionShape attention_shape(const OpAttrs& a) {
  return {a.batch, a.seq, a.heads, a.kv_heads, a.head_dim, a.v_dim()};
}

// The op's MLA geometry and the rows' first global position.
MlaShape mla_shape(const OpContext& c, int64_t rows) {
  const OpAttrs& a = c.op->attrs;
  return {a.heads, a.head_dim, a.rope_dim, a.v_dim(), first_row(c, rows), c.setup->micro_batch};
}

void rope_apply(const Fwd& e, const Tensor& in, const Tensor& out, float sign) {
  const OpContext& c = e.c;
  int64_t tp = c.setup->tp, rows = in.type.shape.at(0);
  rope(in, out, c.model->heads / tp, c.model->kv_heads / tp, c.model->head_dim,
       first_row(c, rows), c.setup->micro_batch, sign, e.stream);
}

// mx = the maximum over the TP group, in place on the device (Megatron's all-reduce with MAX;
// NCCL takes device buffers only, so no host staging).
void global_max(const OpContext& c, const Tensor& mx) { c.comm->all_reduce_max(mx); }

}  // namespace

// ---- forward, per op ----

Outs embedding_fwd(const Fwd& e, Ins in, Ins w) {
  const Tensor &ids = need(in, 0, "ids"), &W = need(w, 0, "embedding weight");
  Tensor y = e.out({{ids.numel(), W.type.shape.at(1)}, kAct});
  embedding_forward(ids, W, y, e.c.tp_rank, e.stream);
  return {y};
}

Outs pos_embedding_fwd(const Fwd& e, Ins in, Ins w) {
  const Tensor& x = need(in, 0, "input");
  Tensor y = e.out(x.type);
  pos_embedding_forward(x, need(w, 0, "position weight"), y, first_row(e.c, x.type.shape.at(0)),
                        e.c.setup->micro_batch, e.stream);
  return {y};
}

Outs rmsnorm_fwd(const Fwd& e, Ins in, Ins w) {
  const Tensor& x = need(in, 0, "input");
  Tensor y = e.out(x.type);
  rmsnorm_forward(x, need(w, 0, "weight"), y, nullptr, kEps, e.stream);
  return {y};
}

Outs qk_norm_fwd(const Fwd& e, Ins in, Ins w) {
  const Tensor& x = need(in, 0, "input");
  const OpAttrs& a = e.attrs();
  Tensor y = e.out(x.type),
         rstd = e.out({{x.type.shape.at(0), a.heads + a.kv_heads}, Dtype::kFp32});
  qk_norm_forward(x, need(w, 0, "q weight"), need(w, 1, "k weight"), y, rstd, a.heads, a.kv_heads,
                  kEps, e.stream);
  return {y, rstd};
}

Outs qk_norm_hf_fwd(const Fwd& e, Ins in, Ins w) {
  const Tensor& x = need(in, 0, "input");
  const OpAttrs& at = e.attrs();
  const int64_t rows = x.type.shape.at(0), nh = at.heads + at.kv_heads;
  TensorType fp32{{rows, nh * at.head_dim}, Dtype::kFp32};
  Tensor y = e.out(x.type), a = e.out(fp32), r = e.out({{rows, nh}, Dtype::kFp32}),
         cst = e.out({{rows, nh * at.head_dim}, x.type.dtype}), b = e.ws(fp32);
  qk_norm_hf_forward(x, need(w, 0, "q weight"), need(w, 1, "k weight"), y, a, r, b, cst, at.heads,
                     at.kv_heads, kEps, e.stream);
  return {y, a, r, cst, b};
}

Outs rmsnorm_stats_fwd(const Fwd& e, Ins in, Ins w) {
  const Tensor& x = need(in, 0, "input");
  if (e.attrs().fp8 != Fp8Recipe::kNone) {  // before a TE LayerNorm-linear (te_fp8.cu)
    std::vector<Tensor> stats;
    Tensor y = te_norm_fwd(e, x, need(w, 0, "weight"), nullptr, stats);
    return {y, stats[0]};
  }
  Tensor y = e.out(x.type), rstd = e.out({{x.type.shape.at(0)}, Dtype::kFp32});
  rmsnorm_forward(x, need(w, 0, "weight"), y, &rstd, kEps, e.stream);
  return {y, rstd};
}

Outs layernorm_fwd(const Fwd& e, Ins in, Ins w) {
  const Tensor& x = need(in, 0, "input");
  Tensor y = e.out(x.type);
  layernorm_forward(x, need(w, 0, "weight"), need(w, 1, "bias"), y, nullptr, nullptr, kEps,
                    e.stream);
  return {y};
}

Outs layernorm_stats_fwd(const Fwd& e, Ins in, Ins w) {
  const Tensor& x = need(in, 0, "input");
  if (e.attrs().fp8 != Fp8Recipe::kNone) {  // before a TE LayerNorm-linear (te_fp8.cu)
    std::vector<Tensor> stats;
    Tensor y = te_norm_fwd(e, x, need(w, 0, "weight"), &need(w, 1, "bias"), stats);
    return {y, stats[0], stats[1]};
  }
  TensorType row{{x.type.shape.at(0)}, Dtype::kFp32};
  Tensor y = e.out(x.type), mean = e.out(row), rstd = e.out(row);
  layernorm_forward(x, need(w, 0, "weight"), need(w, 1, "bias"), y, &mean, &rstd, kEps, e.stream);
  return {y, mean, rstd};
}

Outs rmsnorm_hf_fwd(const Fwd& e, Ins in, Ins w) {
  const Tensor& x = need(in, 0, "input");
  TensorType fp32{x.type.shape, Dtype::kFp32};
  Tensor y = e.out(x.type), a = e.out(fp32), r = e.out({{x.type.shape.at(0)}, Dtype::kFp32}),
         cst = e.out(x.type), b = e.ws(fp32);
  rmsnorm_hf_forward(x, need(w, 0, "weight"), y, a, r, b, cst, kEps, e.stream);
  return {y, a, r, cst, b};
}

Outs repeat_kv_fwd(const Fwd& e, Ins in, Ins) {
  const OpAttrs& at = e.attrs();
  const Tensor& x = need(in, 0, "input");
  Tensor y = e.out({{x.type.shape.at(0), 3 * at.heads * at.head_dim}, x.type.dtype});
  repeat_kv_forward(x, y, at.heads, at.kv_heads, at.head_dim, e.stream);
  return {y};
}

Outs softmax_fp32_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor& x = need(in, 0, "scores");
  Tensor cast = e.out(x.type), f = e.out({x.type.shape, Dtype::kFp32});
  causal_softmax_forward(x, f, e.attrs().head_dim, e.stream);
  cuda::copy_elements(cast, 0, f, 0, f.numel(), e.stream);
  return {cast, f};
}

Outs all_gather_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor& x = need(in, 0, "input");
  Tensor y = e.out(with_rows(x.type, x.type.shape.at(0) * e.c.comm->tp_size()));
  e.c.comm->all_gather(x, y);
  if (x.type.dtype == Dtype::kFp8E4m3) te_gathered(e, x, y);  // TE's float8 shard's scale
  return {y};
}

Outs reduce_scatter_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor& x = need(in, 0, "input");
  Tensor y = e.out(with_rows(x.type, x.type.shape.at(0) / e.c.comm->tp_size()));
  e.c.comm->reduce_scatter(x, y);
  return {y};
}

Outs all_reduce_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor& x = need(in, 0, "input");
  Tensor y = e.out(x.type);
  NP_CUDA_CHECK(cudaMemcpy(y.data, x.data, static_cast<size_t>(x.bytes()), cudaMemcpyDeviceToDevice));
  e.c.comm->all_reduce(y);
  return {y};
}

// Column- and row-parallel, and replicated (kLinear): a row-parallel bias is added on TP rank 0
// only (before the sum).
Outs linear_fwd(const Fwd& e, Ins in, Ins w) {
  const Tensor &x = need(in, 0, "input"), &W = need(w, 0, "weight");
  Tensor y = e.out({{x.type.shape.at(0), W.type.shape.at(0)}, kAct});
  bool bias = w.size() > 1 && (e.c.op->kind != OpKind::kRowLinear || e.c.tp_rank == 0);
  linear_forward(e.blas, x, W, bias ? &w[1] : nullptr, y, e.stream);
  return {y};
}

Outs rope_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor& x = need(in, 0, "input");
  Tensor y = e.out(x.type);
  rope_apply(e, x, y, 1.0f);
  return {y};
}

// MLA's [q | k | v] rows from q, the kv up-projection and the keys' RoPE part (pointwise.cu).
Outs mla_rope_fwd(const Fwd& e, Ins in, Ins) {
  const OpAttrs& a = e.attrs();
  const Tensor &q = need(in, 0, "queries"), &kv = need(in, 1, "kv up-projection"),
               &pe = need(in, 2, "keys' rope part");
  const int64_t rows = q.type.shape.at(0);
  Tensor y = e.out({{rows, a.heads * (2 * a.head_dim + a.v_dim())}, q.type.dtype});
  mla_rope_forward(q, kv, pe, y, mla_shape(e.c, rows), e.stream);
  return {y};
}

Outs flash_attention_fwd(const Fwd& e, Ins in, Ins) {
  const OpAttrs& a = e.attrs();
  const Tensor& qkv = need(in, 0, "qkv");
  Tensor y = e.out({{a.batch * a.seq, a.heads * a.v_dim()}, kAct}),
         lse = e.out({{a.batch, a.heads, a.seq}, Dtype::kFp32});
  flash_attention_forward(attention_shape(a), qkv, y, lse, e.stream);
  return {y, lse};
}

Outs attn_scores_fwd(const Fwd& e, Ins in, Ins) {
  const OpAttrs& a = e.attrs();
  Tensor sc = e.out({{a.batch, a.heads, a.seq, a.seq}, kAct});
  attn_scores_forward(e.blas, attention_shape(a), need(in, 0, "qkv"), sc, e.stream);
  return {sc};
}

Outs attn_context_fwd(const Fwd& e, Ins in, Ins) {
  const OpAttrs& a = e.attrs();
  Tensor y = e.out({{a.batch * a.seq, a.heads * a.v_dim()}, kAct});
  attn_context_forward(e.blas, attention_shape(a), need(in, 0, "probabilities"),
                       need(in, 1, "qkv"), y, e.stream);
  return {y};
}

Outs softmax_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor& x = need(in, 0, "scores");
  Tensor y = e.out(x.type);
  causal_softmax_forward(x, y, e.attrs().head_dim, e.stream);
  return {y};
}

// The mask of the hidden states (rows by global token) or of the attention probabilities (by
// global head), as the CPU reference draws it.
Outs dropout_fwd(const Fwd& e, Ins in, Ins) {
  const OpContext& c = e.c;
  const Tensor& x = need(in, 0, "input");
  Tensor y = e.out(x.type), mask = e.out({x.type.shape, Dtype::kU8});
  const std::vector<int64_t>& sh = x.type.shape;
  DropoutLayout l;
  if (sh.size() == 4) {
    l.probs = true, l.heads_local = sh[1], l.seq = sh[2], l.tp = c.setup->tp, l.tp_rank = c.tp_rank;
  } else {
    l.width = x.numel() / sh.at(0), l.first_row = first_row(c, sh.at(0));
  }
  uint64_t stream_id = exec::dropout_stream(c) ^ (static_cast<uint64_t>(c.mb) * 0x9E3779B97F4A7C15ull);
  dropout_forward(x, y, mask, static_cast<float>(c.model->dropout), c.seed, stream_id, l, e.stream);
  return {y, mask};
}

// SwiGLU fused, or the unfused GLU's silu(gate).
Outs glu_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor& x = need(in, 0, "input");
  Tensor y = e.out({{x.type.shape.at(0), x.type.shape.at(1) / 2}, kAct});
  if (e.c.op->kind == OpKind::kSwiGlu) swiglu_forward(x, y, e.stream);
  else glu_act_forward(x, y, e.stream);
  return {y};
}

Outs glu_mul_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor& a = need(in, 0, "activation");
  Tensor y = e.out(a.type);
  glu_mul_forward(a, need(in, 1, "input"), y, e.stream);
  return {y};
}

Outs gelu_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor& x = need(in, 0, "input");
  Tensor y = e.out(x.type);
  gelu_forward(x, y, e.stream);
  return {y};
}

Outs add_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor& x = need(in, 0, "input a");
  Tensor y = e.out(x.type);
  add(x, need(in, 1, "input b"), y, e.stream);
  return {y};
}

Outs router_fwd(const Fwd& e, Ins in, Ins w) {
  const Tensor &x = need(in, 0, "input"), &W = need(w, 0, "router weight");
  Tensor y = e.out({{x.type.shape.at(0), W.type.shape.at(0)}, Dtype::kFp32});
  linear_forward(e.blas, x, W, w.size() > 1 ? &w[1] : nullptr, y, e.stream);
  return {y};
}

Outs topk_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor& logits = need(in, 0, "router logits");
  int64_t T = logits.type.shape.at(0), k = e.attrs().top_k;
  Tensor probs = e.out({{T, k}, Dtype::kFp32}), idx = e.out({{T, k}, Dtype::kI64});
  topk_forward(logits, probs, idx, e.stream);
  return {probs, idx};
}

Outs moe_dispatch_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor &x = need(in, 0, "tokens"), &idx = need(in, 1, "routing indices");
  const int64_t E = routed_experts(e.c), C = e.attrs().capacity;
  Tensor xe = e.out({{C > 0 ? E * C : idx.numel(), x.type.shape.at(1)}, kAct});
  moe_dispatch_forward(x, idx, xe, E, C, e.stream);
  return {xe};
}

// The grouped GEMMs of the experts' first (column) and second (row) linears.
Outs expert_fwd(const Fwd& e, Ins in, Ins w) {
  const Tensor &xe = need(in, 0, "expert input"), &W = need(w, 0, "expert weight");
  routed_experts(e.c);
  Tensor y = e.out({{xe.type.shape.at(0), W.type.shape.at(1)}, kAct});
  expert_forward(e.blas, xe, need(in, 1, "routing indices"), W, y, e.attrs().capacity, e.stream);
  return {y};
}

Outs moe_combine_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor &ye = need(in, 0, "expert outputs"), &idx = need(in, 2, "routing indices");
  Tensor y = e.out({{idx.type.shape.at(0), ye.type.shape.at(1)}, kAct});
  moe_combine_forward(ye, need(in, 1, "routing probabilities"), idx, y, routed_experts(e.c),
                      e.attrs().capacity, e.stream);
  return {y};
}

Outs shared_gate_fwd(const Fwd& e, Ins in, Ins w) {
  const Tensor& y = need(in, 1, "shared expert output");
  Tensor o = e.out(y.type);
  shared_gate_forward(need(in, 0, "gate input"), need(w, 0, "gate weight"), y, o, e.stream);
  return {o};
}

Outs cast_fp32_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor& x = need(in, 0, "input");
  Tensor y = e.out({x.type.shape, Dtype::kFp32});
  cuda::copy_elements(y, 0, x, 0, x.numel(), e.stream);
  return {y};
}

// The vocabulary-parallel cross-entropy (and, on the fp32 logits, the log-softmax loss), in
// stages around the TP reductions of the row maxima, exponential sums and target logits.
Outs cross_entropy_fwd(const Fwd& e, Ins in, Ins) {
  const OpContext& c = e.c;
  const Tensor &logits = need(in, 0, "logits"), &targets = need(in, 1, "targets");
  int64_t T = logits.type.shape.at(0), V = logits.type.shape.at(1);
  Tensor loss = e.out({{T}, Dtype::kFp32}), sm = e.out({{T, V}, Dtype::kFp32});
  // fp32_copy: the logits cast to an fp32 tensor first, the loss computed from the copy.
  Tensor copy = e.attrs().fp32_copy ? e.ws({{T, V}, Dtype::kFp32}) : Tensor{};
  Tensor mx = e.ws({{T}, Dtype::kFp32}), se = e.ws({{T}, Dtype::kFp32}), tg = e.ws({{T}, Dtype::kFp32});
  if (copy) cuda::copy_elements(copy, 0, logits, 0, T * V, e.stream);
  const Tensor& l = copy ? copy : logits;
  cross_entropy_max(l, mx, e.stream);
  int64_t tp = c.comm ? c.comm->tp_size() : 1;
  if (tp > 1) global_max(c, mx);
  cross_entropy_exp_sum(l, targets, mx, sm, se, tg, c.tp_rank, e.stream);
  if (tp > 1) c.comm->all_reduce(se), c.comm->all_reduce(tg);
  bool log_probs = c.op->kind == OpKind::kLogSoftmaxLoss;
  cross_entropy_finalize(sm, se, mx, tg, loss, log_probs ? &l : nullptr, e.stream);
  if (copy) return {loss, sm, copy, mx, se, tg};
  return {loss, sm, mx, se, tg};
}

Outs log_softmax_loss_fwd(const Fwd& e, Ins in, Ins w) {
  need(in, 2, "the bf16 logits the loss outlives");
  return cross_entropy_fwd(e, in, w);
}

Outs cross_entropy_te_fwd(const Fwd& e, Ins in, Ins) {
  const OpContext& c = e.c;
  const Tensor &logits = need(in, 0, "logits"), &targets = need(in, 1, "targets");
  int64_t T = logits.type.shape.at(0);
  Tensor loss = e.out({{T}, Dtype::kFp32}), stats = e.out({{T, 2}, Dtype::kFp32});
  Tensor mx = e.ws({{T}, Dtype::kFp32}), se = e.ws({{T}, Dtype::kFp32}), tg = e.ws({{T}, Dtype::kFp32});
  cross_entropy_max(logits, mx, e.stream);
  int64_t tp = c.comm ? c.comm->tp_size() : 1;
  if (tp > 1) global_max(c, mx);
  cross_entropy_exp_sum(logits, targets, mx, Tensor{}, se, tg, c.tp_rank, e.stream);
  if (tp > 1) c.comm->all_reduce(se), c.comm->all_reduce(tg);
  cross_entropy_te_finalize(se, mx, tg, loss, stats, e.stream);
  return {loss, stats, mx, se, tg};
}

// ---- backward, per op ----

void embedding_bwd(const Bwd& e) {
  const BackwardArgs& a = e.a;
  const Tensor& dw = need(a.weight_grads, 0, "weight gradient");
  // dense_wgrad: the table's gradient whole in bf16 first, then added into the buffer.
  Tensor dense = e.attrs().dense_wgrad ? e.ws({dw.type.shape, Dtype::kBf16}) : Tensor{};
  if (dense) cuda::fill(dense, 0.0f, e.stream);
  embedding_backward(need(a.inputs, 0, "ids"), need(a.grad_outputs, 0, "gradient"),
                     dense ? dense : dw, e.c.tp_rank, e.stream);
  if (dense) cuda::accumulate(dw, dense, e.stream);
}

void pos_embedding_bwd(const Bwd& e) {
  const Tensor& g = need(e.a.grad_outputs, 0, "gradient");
  e.pass(0, g);
  pos_embedding_backward(g, need(e.a.weight_grads, 0, "weight gradient"),
                         first_row(e.c, g.type.shape.at(0)), e.c.setup->micro_batch, e.stream);
}

void rmsnorm_bwd(const Bwd& e) {
  const BackwardArgs& a = e.a;
  const Tensor& x = need(a.inputs, 0, "input");
  // The per-row 1/rms: kept by the forward, or recomputed into the op table's workspace.
  bool saved = e.c.op->kind == OpKind::kRmsNormStats, acc = false;
  Tensor rstd = saved ? need(a.outputs, 1, "rstd") : e.ws({{x.type.shape.at(0)}, Dtype::kFp32});
  Tensor& dx = e.grad(0, x.type, acc);
  rmsnorm_backward(x, need(a.weights, 0, "weight"), need(a.grad_outputs, 0, "gradient"), dx, acc,
                   need(a.weight_grads, 0, "weight gradient"), rstd, saved, kEps, e.stream);
}

void qk_norm_bwd(const Bwd& e) {
  const BackwardArgs& a = e.a;
  const Tensor& x = need(a.inputs, 0, "input");
  bool acc = false;
  Tensor& dx = e.grad(0, x.type, acc);
  qk_norm_backward(x, need(a.weights, 0, "q weight"), need(a.weights, 1, "k weight"),
                   need(a.grad_outputs, 0, "gradient"), dx, acc,
                   need(a.weight_grads, 0, "q weight gradient"),
                   need(a.weight_grads, 1, "k weight gradient"), need(a.outputs, 1, "rstd"),
                   e.attrs().heads, e.attrs().kv_heads, e.stream);
}

void qk_norm_hf_bwd(const Bwd& e) {
  const BackwardArgs& a = e.a;
  // The input is not read (its fp32 copy is): the gradient has its shape.
  const Tensor &g = need(a.grad_outputs, 0, "gradient"), &fp32 = need(a.outputs, 1, "fp32 input");
  Tensor db = e.ws(fp32.type), da = e.ws(fp32.type);
  bool acc = false;
  Tensor& dx = e.grad(0, g.type, acc);
  qk_norm_hf_backward(fp32, need(a.outputs, 2, "rstd"), need(a.outputs, 3, "normalized"),
                      need(a.weights, 0, "q weight"), need(a.weights, 1, "k weight"),
                      g, db, da, dx, acc, need(a.weight_grads, 0, "q weight gradient"),
                      need(a.weight_grads, 1, "k weight gradient"), e.attrs().heads,
                      e.attrs().kv_heads, e.stream);
}

void rmsnorm_hf_bwd(const Bwd& e) {
  const BackwardArgs& a = e.a;
  const Tensor &fp32 = need(a.outputs, 1, "fp32 input"), &cst = need(a.outputs, 3, "normalized");
  Tensor db = e.ws(fp32.type), da = e.ws(fp32.type);
  bool acc = false;
  Tensor& dx = e.grad(0, cst.type, acc);
  rmsnorm_hf_backward(fp32, need(a.outputs, 2, "rstd"), cst, need(a.weights, 0, "weight"),
                      need(a.grad_outputs, 0, "gradient"), db, da, dx, acc,
                      need(a.weight_grads, 0, "weight gradient"), e.stream);
}

void repeat_kv_bwd(const Bwd& e) {
  const Tensor& g = need(e.a.grad_outputs, 0, "gradient");
  const OpAttrs& at = e.attrs();
  bool acc = false;
  Tensor& dx =
      e.grad(0, {{g.type.shape.at(0), (at.heads + 2 * at.kv_heads) * at.head_dim}, g.type.dtype}, acc);
  repeat_kv_backward(g, dx, acc, at.heads, at.kv_heads, at.head_dim, e.stream);
}

void softmax_fp32_bwd(const Bwd& e) {
  const Tensor &f = need(e.a.outputs, 1, "fp32 probabilities"),
               &g = need(e.a.grad_outputs, 0, "gradient");
  Tensor g32 = e.ws(f.type);
  cuda::copy_elements(g32, 0, g, 0, g.numel(), e.stream);
  bool acc = false;
  Tensor& dx = e.grad(0, g.type, acc);
  causal_softmax_backward(f, g32, dx, acc, e.attrs().head_dim, e.stream);
}

void layernorm_bwd(const Bwd& e) {
  const BackwardArgs& a = e.a;
  const Tensor& x = need(a.inputs, 0, "input");
  bool saved = e.c.op->kind == OpKind::kLayerNormStats, acc = false;
  TensorType row{{x.type.shape.at(0)}, Dtype::kFp32};
  Tensor mean = saved ? need(a.outputs, 1, "mean") : e.ws(row);
  Tensor rstd = saved ? need(a.outputs, 2, "rstd") : e.ws(row);
  Tensor& dx = e.grad(0, x.type, acc);
  layernorm_backward(x, need(a.weights, 0, "weight"), need(a.grad_outputs, 0, "gradient"), dx, acc,
                     need(a.weight_grads, 0, "weight gradient"),
                     need(a.weight_grads, 1, "bias gradient"), mean, rstd, saved, kEps, e.stream);
}

// The all-gather's backward is a reduce-scatter, and the reduce-scatter's an all-gather.
void gather_scatter_bwd(const Bwd& e) {
  const OpContext& c = e.c;
  const Tensor& g = need(e.a.grad_outputs, 0, "gradient");
  bool gather = c.op->kind == OpKind::kAllGather || c.op->kind == OpKind::kFp8AllGather, acc = false;
  int64_t tp = c.comm->tp_size(), rows = g.type.shape.at(0);
  TensorType t = with_rows(g.type, gather ? rows / tp : rows * tp);
  if (e.a.grad_inputs[0] && !gather)
    unsupported(c, "accumulating a collective's input gradient needs a planned buffer");
  Tensor& dst = e.grad(0, t, acc);
  // Accumulating into this rank's shard (MLA's replicated down-projections read it too): the
  // gradient so far is added into this rank's rows of the gathered gradient, which dies here,
  // before the reduce-scatter writes the sum over the ranks into it.
  if (acc) accumulate(slice(g, c.tp_rank * dst.numel(), dst.type.shape), dst, e.stream);
  if (gather) c.comm->reduce_scatter(g, dst);
  else c.comm->all_gather(g, dst);
}

void all_reduce_bwd(const Bwd& e) { e.pass(0, need(e.a.grad_outputs, 0, "gradient")); }

void linear_bwd(const Bwd& e) {
  const OpContext& c = e.c;
  const BackwardArgs& a = e.a;
  const Tensor& x = need(a.inputs, 0, "input");
  bool reduce = c.op->bwd_collective == "all_reduce", acc = false;
  const Tensor& w = need(a.weights, 0, "weight");
  // Accumulating into a gradient that other consumers have already made whole (the same on
  // every TP rank: each contribution to a replicated activation's gradient is reduced, as MLA's
  // down-projections' are): all-reduce(E / tp + partial) = E + all-reduce(partial), in place.
  if (reduce && a.grad_inputs[0]) scale(a.grad_inputs[0], 1.0f / static_cast<float>(c.comm->tp_size()), e.stream);
  // dense_wgrad: the weight gradient whole in bf16 first (taken before dx, as the op
  // table orders a backward's workspaces and input gradients), then added into the buffer.
  Tensor dense = e.attrs().dense_wgrad ? e.ws({w.type.shape, Dtype::kBf16}) : Tensor{};
  Tensor& dx = e.grad(0, x.type, acc);
  linear_backward(e.blas, x, w, need(a.grad_outputs, 0, "gradient"), &dx, acc,
                  need(a.weight_grads, 0, "weight gradient"),
                  a.weight_grads.size() > 1 ? &a.weight_grads[1] : nullptr, e.stream,
                  dense ? &dense : nullptr);
  if (reduce) c.comm->all_reduce(dx);  // bf16 partial sums (the CPU reduces fp32 ones)
}

void rope_bwd(const Bwd& e) {
  const Tensor& g = need(e.a.grad_outputs, 0, "gradient");
  if (e.a.grad_inputs[0]) unsupported(e.c, "accumulating RoPE's input gradient needs a planned buffer");
  bool acc = false;
  Tensor& dx = e.grad(0, g.type, acc);
  rope_apply(e, g, dx, -1.0f);
}

// Each input's gradient is fresh (its producer's only consumer is this op); the keys' RoPE part's
// is all-reduced over TP without SP (bf16 partial sums: the CPU reduces fp32 ones).
void mla_rope_bwd(const Bwd& e) {
  const OpAttrs& a = e.attrs();
  const Tensor& g = need(e.a.grad_outputs, 0, "gradient");
  for (int k = 0; k < 3; ++k)
    if (e.a.grad_inputs[k]) unsupported(e.c, "accumulating MLA's RoPE input gradients needs a planned buffer");
  const int64_t rows = g.type.shape.at(0);
  const int64_t dn = a.head_dim - a.rope_dim;
  bool acc = false;
  Tensor& dq = e.grad(0, {{rows, a.heads * a.head_dim}, g.type.dtype}, acc);
  Tensor& dkv = e.grad(1, {{rows, a.heads * (dn + a.v_dim())}, g.type.dtype}, acc);
  Tensor& dpe = e.grad(2, {{rows, a.rope_dim}, g.type.dtype}, acc);
  mla_rope_backward(g, dq, dkv, dpe, mla_shape(e.c, rows), e.stream);
  if (e.c.op->bwd_collective == "all_reduce") e.c.comm->all_reduce(dpe);
}

void flash_attention_bwd(const Bwd& e) {
  const BackwardArgs& a = e.a;
  const OpAttrs& s = e.attrs();
  const Tensor& qkv = need(a.inputs, 0, "qkv");
  Tensor dq = e.ws({{s.batch * s.seq, s.heads * s.head_dim}, Dtype::kFp32}),
         rowsum = e.ws({{s.batch, s.heads, s.seq}, Dtype::kFp32});
  bool acc = false;
  Tensor& dx = e.grad(0, qkv.type, acc);
  flash_attention_backward(attention_shape(s), qkv, need(a.outputs, 0, "output"),
                           need(a.outputs, 1, "logsumexp"), need(a.grad_outputs, 0, "gradient"),
                           dx, acc, dq, rowsum, e.stream);
}

void attn_scores_bwd(const Bwd& e) {
  const Tensor& qkv = need(e.a.inputs, 0, "qkv");
  bool acc = false;
  Tensor& dx = e.grad(0, qkv.type, acc);
  attn_scores_backward(e.blas, attention_shape(e.attrs()), qkv,
                       need(e.a.grad_outputs, 0, "gradient"), dx, acc, e.stream);
}

void attn_context_bwd(const Bwd& e) {
  const Tensor &p = need(e.a.inputs, 0, "probabilities"), &qkv = need(e.a.inputs, 1, "qkv");
  bool acc_p = false, acc_q = false;
  Tensor& dp = e.grad(0, p.type, acc_p);
  Tensor& dx = e.grad(1, qkv.type, acc_q);
  attn_context_backward(e.blas, attention_shape(e.attrs()), p, qkv,
                        need(e.a.grad_outputs, 0, "gradient"), dp, acc_p, dx, acc_q, e.stream);
}

void softmax_bwd(const Bwd& e) {
  const Tensor& p = need(e.a.outputs, 0, "probabilities");
  bool acc = false;
  Tensor& dx = e.grad(0, p.type, acc);
  causal_softmax_backward(p, need(e.a.grad_outputs, 0, "gradient"), dx, acc, e.attrs().head_dim,
                          e.stream);
}

void dropout_bwd(const Bwd& e) {
  const Tensor& g = need(e.a.grad_outputs, 0, "gradient");
  bool acc = false;
  Tensor& dx = e.grad(0, g.type, acc);
  dropout_backward(g, need(e.a.outputs, 1, "mask"), dx, acc,
                   static_cast<float>(e.c.model->dropout), e.stream);
}

void glu_bwd(const Bwd& e) {
  const Tensor &x = need(e.a.inputs, 0, "input"), &g = need(e.a.grad_outputs, 0, "gradient");
  bool acc = false;
  Tensor& dx = e.grad(0, x.type, acc);
  if (e.c.op->kind == OpKind::kSwiGlu) return swiglu_backward(x, g, dx, acc, e.stream);
  glu_act_backward(x, g, dx, acc, e.stream);
}

void glu_mul_bwd(const Bwd& e) {
  const Tensor &act_in = need(e.a.inputs, 0, "activation"), &x = need(e.a.inputs, 1, "input");
  bool acc = false, acc_x = false;
  Tensor& da = e.grad(0, act_in.type, acc);
  Tensor& dx = e.grad(1, x.type, acc_x);
  glu_mul_backward(act_in, x, need(e.a.grad_outputs, 0, "gradient"), da, acc, dx, acc_x, e.stream);
}

void gelu_bwd(const Bwd& e) {
  const Tensor& x = need(e.a.inputs, 0, "input");
  bool acc = false;
  Tensor& dx = e.grad(0, x.type, acc);
  gelu_backward(x, need(e.a.grad_outputs, 0, "gradient"), dx, acc, e.stream);
}

void add_bwd(const Bwd& e) {
  const Tensor& g = need(e.a.grad_outputs, 0, "gradient");
  e.pass(0, g);
  e.pass(1, g);
}

void router_bwd(const Bwd& e) {
  const BackwardArgs& a = e.a;
  const Tensor& x = need(a.inputs, 0, "input");
  bool acc = false;
  Tensor& dx = e.grad(0, x.type, acc);
  router_backward(x, need(a.weights, 0, "router weight"), need(a.grad_outputs, 0, "gradient"), dx,
                  acc, need(a.weight_grads, 0, "router weight gradient"),
                  a.weight_grads.size() > 1 ? &a.weight_grads[1] : nullptr, e.stream);
}

Outs route_scores_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor& logits = need(in, 0, "router logits");
  Tensor scores = e.out(logits.type);
  route_scores_forward(logits, scores, e.attrs().router.sigmoid, e.stream);
  return {scores};
}

// The top-k's outputs, then its forward scratch in the op table's order (the expert bias is zero,
// as the frameworks initialise it: no bias tensor is passed).
Outs route_topk_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor& scores = need(in, 0, "route scores");
  const OpAttrs& a = e.attrs();
  int64_t T = scores.type.shape.at(0), k = a.top_k;
  Tensor probs = e.out({{T, k}, Dtype::kFp32}), idx = e.out({{T, k}, Dtype::kI64});
  Outs out = {probs, idx};
  out.reserve(5);  // the scratch pointers below stay valid
  RouteScratch scratch;
  if (a.bias) out.push_back(e.ws(scores.type)), scratch.biased = &out.back();
  if (a.router.groups > 1) out.push_back(e.ws(scores.type)), out.push_back(e.ws(scores.type));
  if (a.router.groups > 1) scratch.mask = &out[out.size() - 2], scratch.masked = &out.back();
  route_topk_forward(scores, nullptr, scratch, a.router, probs, idx, e.stream);
  return out;
}

void route_scores_bwd(const Bwd& e) {
  const Tensor& scores = need(e.a.outputs, 0, "route scores");
  bool acc = false;
  Tensor& dl = e.grad(0, scores.type, acc);
  route_scores_backward(scores, need(e.a.grad_outputs, 0, "gradient"), dl, acc,
                        e.attrs().router.sigmoid, e.stream);
}

void route_topk_bwd(const Bwd& e) {
  const Tensor &scores = need(e.a.inputs, 0, "route scores"),
               &idx = need(e.a.outputs, 1, "routing indices");
  bool acc = false;
  Tensor& ds = e.grad(0, scores.type, acc);
  route_topk_backward(scores, idx, need(e.a.grad_outputs, 0, "gradient"), e.attrs().router, ds,
                      acc, e.stream);
}

void topk_bwd(const Bwd& e) {
  const OpContext& c = e.c;
  const Tensor &probs = need(e.a.outputs, 0, "routing probabilities"),
               &idx = need(e.a.outputs, 1, "routing indices");
  if (!c.model->moe) unsupported(c, "top-k routing outside a MoE model");
  bool acc = false;
  Tensor& dl = e.grad(0, {{idx.type.shape.at(0), c.model->moe->num_experts}, Dtype::kFp32}, acc);
  topk_backward(probs, idx, need(e.a.grad_outputs, 0, "gradient"), dl, acc, e.stream);
}

void moe_dispatch_bwd(const Bwd& e) {
  const Tensor &g = need(e.a.grad_outputs, 0, "gradient"),
               &idx = need(e.a.inputs, 1, "routing indices");
  bool acc = false;
  Tensor& dx = e.grad(0, {{idx.type.shape.at(0), g.type.shape.at(1)}, g.type.dtype}, acc);
  moe_dispatch_backward(g, idx, dx, acc, routed_experts(e.c), e.attrs().capacity, e.stream);
}

void expert_bwd(const Bwd& e) {
  const BackwardArgs& a = e.a;
  const Tensor& xe = need(a.inputs, 0, "expert input");
  routed_experts(e.c);
  bool acc = false;
  Tensor& dx = e.grad(0, xe.type, acc);
  expert_backward(e.blas, xe, need(a.inputs, 1, "routing indices"), need(a.weights, 0, "expert weight"),
                  need(a.grad_outputs, 0, "gradient"), dx, acc,
                  need(a.weight_grads, 0, "expert weight gradient"), e.attrs().capacity, e.stream);
}

void moe_combine_bwd(const Bwd& e) {
  const BackwardArgs& a = e.a;
  const Tensor &ye = need(a.inputs, 0, "expert outputs"),
               &probs = need(a.inputs, 1, "routing probabilities");
  bool acc = false, acc_p = false;
  Tensor& dye = e.grad(0, ye.type, acc);
  Tensor& dp = e.grad(1, probs.type, acc_p);
  moe_combine_backward(ye, probs, need(a.inputs, 2, "routing indices"),
                       need(a.grad_outputs, 0, "gradient"), dye, acc, dp, acc_p,
                       routed_experts(e.c), e.attrs().capacity, e.stream);
}

void shared_gate_bwd(const Bwd& e) {
  const BackwardArgs& a = e.a;
  const Tensor &x = need(a.inputs, 0, "gate input"), &y = need(a.inputs, 1, "shared expert output");
  Tensor dz = e.ws({{x.type.shape.at(0)}, Dtype::kFp32});
  bool acc = false, acc_y = false;
  Tensor& dx = e.grad(0, x.type, acc);
  Tensor& dy = e.grad(1, y.type, acc_y);
  shared_gate_backward(x, need(a.weights, 0, "gate weight"), y, need(a.grad_outputs, 0, "gradient"),
                       dx, acc, dy, acc_y, need(a.weight_grads, 0, "gate weight gradient"), dz,
                       e.stream);
}

void cast_fp32_bwd(const Bwd& e) {
  const Tensor& g = need(e.a.grad_outputs, 0, "gradient");
  bool acc = false;
  Tensor& dx = e.grad(0, {g.type.shape, Dtype::kBf16}, acc);
  if (acc) unsupported(e.c, "accumulating the cast's input gradient needs a planned buffer");
  cuda::copy_elements(dx, 0, g, 0, g.numel(), e.stream);
}

void cross_entropy_te_bwd(const Bwd& e) {
  const BackwardArgs& a = e.a;
  const Tensor& logits = need(a.inputs, 0, "logits");
  bool acc = false;
  Tensor& dl = e.grad(0, logits.type, acc);
  cross_entropy_te_backward(logits, need(a.outputs, 1, "row statistics"), need(a.inputs, 1, "targets"),
                            dl, acc, e.c.tp_rank, e.c.loss_scale, e.stream);
}

// The cross-entropy's and the log-softmax loss's (whose logits' gradient is fp32).
void cross_entropy_bwd(const Bwd& e) {
  const OpContext& c = e.c;
  const BackwardArgs& a = e.a;
  const Tensor& sm = need(a.outputs, 1, "softmax");
  bool log_probs = c.op->kind == OpKind::kLogSoftmaxLoss, acc = false;
  Dtype dt = log_probs ? Dtype::kFp32
             : a.inputs[0] && !a.inputs[0].type.shape.empty() ? a.inputs[0].type.dtype
                                                              : Dtype::kBf16;
  // The log-softmax loss: the NLL's fp32 gradient per logit first (a workspace).
  Tensor nll = log_probs ? e.ws(sm.type) : Tensor{};
  // fp32_grad: the gradient formed in a fresh fp32 buffer, then cast into dl.
  Tensor fp32 = e.attrs().fp32_grad ? e.ws(sm.type) : Tensor{};
  Tensor& dl = e.grad(0, {sm.type.shape, dt}, acc);
  if (fp32) {
    cross_entropy_backward(sm, need(a.inputs, 1, "targets"), fp32, false, c.tp_rank, c.loss_scale,
                           nullptr, e.stream);
    if (acc) return cuda::accumulate(dl, fp32, e.stream);
    return cuda::copy_elements(dl, 0, fp32, 0, fp32.numel(), e.stream);
  }
  cross_entropy_backward(sm, need(a.inputs, 1, "targets"), dl, acc, c.tp_rank, c.loss_scale,
                         nll ? &nll : nullptr, e.stream);
}

// Multi-token prediction's data movement: the concatenation along the features, the features
// gathered over TP (through the op's [tp x rows] workspace), this rank's rows.
Outs concat_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor &x = need(in, 0, "input a"), &y = need(in, 1, "input b");
  long long a = e.attrs().features, rows = x.type.shape.at(0), b = y.numel() / std::max(rows, 1LL);
  if (x.numel() != rows * a) unsupported(e.c, "features must give the first input's width");
  Tensor out = e.out({{rows, a + b}, x.type.dtype});
  copy_columns(out, 0, x, 0, a, false, e.stream);
  copy_columns(out, a, y, 0, b, false, e.stream);
  return {out};
}

void concat_bwd(const Bwd& e) {
  const Tensor& g = need(e.a.grad_outputs, 0, "gradient");
  long long rows = g.type.shape.at(0), a = e.attrs().features, b = g.numel() / rows - a;
  for (int k = 0; k < 2; ++k) {
    bool acc = false;
    Tensor& dst = e.grad(k, {{rows, k == 0 ? a : b}, g.type.dtype}, acc);
    copy_columns(dst, 0, g, k == 0 ? 0 : a, k == 0 ? a : b, acc, e.stream);
  }
}

Outs gather_features_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor& x = need(in, 0, "input");
  long long tp = e.c.comm->tp_size(), rows = x.type.shape.at(0), c = x.numel() / rows;
  Tensor out = e.out({{rows, c * tp}, x.type.dtype});
  Tensor all = e.ws({{rows * tp, c}, x.type.dtype});
  e.c.comm->all_gather(x, all);
  for (long long r = 0; r < tp; ++r)
    copy_columns(out, r * c, slice(all, r * rows * c, {rows, c}), 0, c, false, e.stream);
  return {out, all};
}

void gather_features_bwd(const Bwd& e) {
  const Tensor& g = need(e.a.grad_outputs, 0, "gradient");
  long long tp = e.c.comm->tp_size(), rows = g.type.shape.at(0), c = g.numel() / rows / tp;
  bool acc = false;
  Tensor& dst = e.grad(0, {{rows, c}, g.type.dtype}, acc);
  copy_columns(dst, 0, g, e.c.tp_rank * c, c, acc, e.stream);
}

Outs scatter_rows_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor& x = need(in, 0, "input");
  long long tp = e.c.comm->tp_size(), rows = x.type.shape.at(0);
  if (rows % tp != 0) unsupported(e.c, "the token dim is not a multiple of tp");
  Tensor out = e.out(with_rows(x.type, rows / tp));
  copy_elements(out, 0, x, e.c.tp_rank * out.numel(), out.numel(), e.stream);
  return {out};
}

void scatter_rows_bwd(const Bwd& e) {
  const Tensor& g = need(e.a.grad_outputs, 0, "gradient");
  if (e.a.grad_inputs[0]) unsupported(e.c, "accumulating an all-gather's result needs a planned buffer");
  bool acc = false;
  Tensor& dst = e.grad(0, with_rows(g.type, g.type.shape.at(0) * e.c.comm->tp_size()), acc);
  e.c.comm->all_gather(g, dst);
}


// ---- torchtitan's ops (the CPU reference's pointwise.cpp: the same outputs, workspaces and
// gradients, in the same order) ----

Outs silu_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor& x = need(in, 0, "input");
  Tensor y = e.out(x.type);
  silu_forward(x, y, e.stream);
  return {y};
}
void silu_bwd(const Bwd& e) {
  const Tensor& x = need(e.a.inputs, 0, "input");
  bool acc = false;
  Tensor& dx = e.grad(0, x.type, acc);
  silu_backward(x, need(e.a.grad_outputs, 0, "gradient"), dx, acc, e.stream);
}

Outs mul_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor &a = need(in, 0, "input a"), &b = need(in, 1, "input b");
  Tensor y = e.out(a.type);
  mul_forward(a, b, y, e.stream);
  return {y};
}
void mul_bwd(const Bwd& e) {
  const Tensor &a = need(e.a.inputs, 0, "input a"), &b = need(e.a.inputs, 1, "input b");
  bool acc_a = false, acc_b = false;
  Tensor& da = e.grad(0, a.type, acc_a);
  Tensor& db = e.grad(1, b.type, acc_b);
  mul_backward(a, b, need(e.a.grad_outputs, 0, "gradient"), da, acc_a, db, acc_b, e.stream);
}

// nn.RMSNorm(head_dim) over one tensor of heads: the q/k norms' kernels with no k or v heads.
Outs head_rmsnorm_fwd(const Fwd& e, Ins in, Ins w) {
  const Tensor& x = need(in, 0, "input");
  const OpAttrs& a = e.attrs();
  Tensor y = e.out(x.type), rstd = e.out({{x.type.shape.at(0), a.heads}, Dtype::kFp32});
  const Tensor& wt = need(w, 0, "weight");
  qk_norm_forward(x, wt, wt, y, rstd, a.heads, 0, kEps, e.stream);
  return {y, rstd};
}
void head_rmsnorm_bwd(const Bwd& e) {
  const BackwardArgs& a = e.a;
  const Tensor& x = need(a.inputs, 0, "input");
  bool acc = false;
  Tensor& dx = e.grad(0, x.type, acc);
  const Tensor &wt = need(a.weights, 0, "weight"), &dw = need(a.weight_grads, 0, "weight gradient");
  qk_norm_backward(x, wt, wt, need(a.grad_outputs, 0, "gradient"), dx, acc, dw, dw,
                   need(a.outputs, 1, "rstd"), e.attrs().heads, 0, e.stream);
}

namespace {
// torchtitan's RoPE of q (input 0) and k (input 1): outputs, then the op table's scratch (fp32 q
// and k, then their rotations: rope_qk; or the larger input's two bf16 products, which nothing
// reads: rope_half_qk). Backward: the scratch, then each gradient rotated back.
Outs rope_two_fwd(const Fwd& e, Ins in, bool adjacent) {
  const Tensor &q = need(in, 0, "queries"), &k = need(in, 1, "keys");
  const int64_t d = e.attrs().head_dim, rows = q.type.shape.at(0);
  const int64_t first = first_row(e.c, rows), batch = e.c.setup->micro_batch;
  Tensor qo = e.out(q.type), ko = e.out(k.type);
  Outs out = {qo, ko};
  if (adjacent) {
    Tensor qf = e.ws({q.type.shape, Dtype::kFp32}), kf = e.ws({k.type.shape, Dtype::kFp32}),
           qp = e.ws({q.type.shape, Dtype::kFp32}), kp = e.ws({k.type.shape, Dtype::kFp32});
    cuda::copy_elements(qf, 0, q, 0, q.numel(), e.stream);
    cuda::copy_elements(kf, 0, k, 0, k.numel(), e.stream);
    rope_heads(q, qp, d, true, first, batch, 1.0f, e.stream);
    rope_heads(k, kp, d, true, first, batch, 1.0f, e.stream);
    out.insert(out.end(), {qf, kf, qp, kp});
  } else {
    const Tensor& big = q.numel() >= k.numel() ? q : k;
    out.push_back(e.ws(big.type));
    out.push_back(e.ws(big.type));
  }
  rope_heads(q, qo, d, adjacent, first, batch, 1.0f, e.stream);
  rope_heads(k, ko, d, adjacent, first, batch, 1.0f, e.stream);
  return out;
}
void rope_two_bwd(const Bwd& e, bool adjacent) {
  const Tensor &gq = need(e.a.grad_outputs, 0, "q gradient"),
               &gk = need(e.a.grad_outputs, 1, "k gradient");
  const Tensor& big = gq.numel() >= gk.numel() ? gq : gk;
  Tensor w0 = e.ws({big.type.shape, adjacent ? Dtype::kFp32 : big.type.dtype});
  e.ws({big.type.shape, adjacent ? Dtype::kFp32 : big.type.dtype});
  if (adjacent) cuda::copy_elements(w0, 0, big, 0, big.numel(), e.stream);
  if (e.a.grad_inputs[0] || e.a.grad_inputs[1])
    unsupported(e.c, "accumulating RoPE's input gradients needs a planned buffer");
  const int64_t d = e.attrs().head_dim, rows = gq.type.shape.at(0);
  const int64_t first = first_row(e.c, rows), batch = e.c.setup->micro_batch;
  bool acc = false;
  Tensor& dq = e.grad(0, gq.type, acc);
  Tensor& dk = e.grad(1, gk.type, acc);
  rope_heads(gq, dq, d, adjacent, first, batch, -1.0f, e.stream);
  rope_heads(gk, dk, d, adjacent, first, batch, -1.0f, e.stream);
}
}  // namespace

// PyTorch's SDPA flash kernel on separate q, k, v: the output and logsumexp; backward's scratch
// as the op table lists it (the fp32 dQ accumulator and rowsum, then under GQA FlashAttention-2's
// expanded dK and dV, which these kernels, summing each K/V head's group in place, leave unused).
Outs sdpa_fwd(const Fwd& e, Ins in, Ins) {
  const OpAttrs& a = e.attrs();
  Tensor y = e.out({{a.batch * a.seq, a.heads * a.v_dim()}, kAct}),
         lse = e.out({{a.batch, a.heads, a.seq}, Dtype::kFp32});
  sdpa_forward(attention_shape(a), need(in, 0, "q"), need(in, 1, "k"), need(in, 2, "v"), y, lse,
               e.stream);
  return {y, lse};
}
void sdpa_bwd(const Bwd& e) {
  const BackwardArgs& a = e.a;
  const OpAttrs& s = e.attrs();
  const Tensor &q = need(a.inputs, 0, "q"), &k = need(a.inputs, 1, "k"), &v = need(a.inputs, 2, "v");
  const int64_t rows = s.batch * s.seq;
  Tensor dq = e.ws({{rows, s.heads * s.head_dim}, Dtype::kFp32}),
         rowsum = e.ws({{s.batch, s.heads, s.seq}, Dtype::kFp32});
  if (s.kv_heads < s.heads) {
    e.ws({{rows, s.heads * s.head_dim}, kAct});
    e.ws({{rows, s.heads * s.v_dim()}, kAct});
  }
  bool acc_q = false, acc_k = false, acc_v = false;
  Tensor& gq = e.grad(0, q.type, acc_q);
  Tensor& gk = e.grad(1, k.type, acc_k);
  Tensor& gv = e.grad(2, v.type, acc_v);
  sdpa_backward(attention_shape(s), q, k, v, need(a.outputs, 0, "output"),
                need(a.outputs, 1, "logsumexp"), need(a.grad_outputs, 0, "gradient"), gq, acc_q,
                gk, acc_k, gv, acc_v, dq, rowsum, e.stream);
}

Outs rope_qk_fwd(const Fwd& e, Ins in, Ins) { return rope_two_fwd(e, in, true); }
void rope_qk_bwd(const Bwd& e) { rope_two_bwd(e, true); }
Outs rope_half_qk_fwd(const Fwd& e, Ins in, Ins) { return rope_two_fwd(e, in, false); }
void rope_half_qk_bwd(const Bwd& e) { rope_two_bwd(e, false); }

}  // namespace np::cuda
