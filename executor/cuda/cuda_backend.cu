// The CUDA backend: op dispatch onto the kernels, with the CPU reference's allocation contract
// (outputs in op-table order, then the op table's workspaces; an input gradient accumulated when
// BackwardArgs holds one, else allocated as AllocRole::kGradInput).
#include <cmath>
#include <vector>

#include "executor/cuda/cuda_backend.hpp"
#include "executor/cuda/kernels.hpp"

namespace np::cuda {
namespace {

using exec::AllocRole;
using exec::BackwardArgs;
using exec::OpContext;

constexpr float kEps = static_cast<float>(exec::kNormEps);

[[noreturn]] void unsupported(const OpContext& c, const char* why) {
  throw std::runtime_error(std::string("cuda backend: ") + c.op->name + " (" +
                           name_of(c.op->kind) + "): " + why);
}

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
  return {a.batch, a.seq, a.heads, a.kv_heads, a.head_dim};
}

class CudaBackend final : public exec::Backend {
 public:
  // The context first (cudaFree(0) creates it), then the cuBLAS handle, each measured.
  CudaBackend() {
    NP_CUDA_CHECK(cudaFree(nullptr));
    int64_t at_start = used_now();
    NP_CUBLAS_CHECK(cublasCreate(&blas_));
    overheads_ = {{"device memory in use as this rank's backend started (the CUDA context, and "
                   "anything else on the device)",
                   at_start},
                  {"cuBLAS handle", std::max<int64_t>(0, used_now() - at_start)}};
    NP_CUDA_CHECK(cudaStreamCreate(&stream_));
  }
  ~CudaBackend() override {
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }
  const char* name() const override { return "cuda"; }

  // cuBLAS's workspace, set explicitly so that its bytes come through the tracking allocator
  // (never cuBLAS's own cudaMalloc): the estimate's assumed size (RuntimeAssumptions).
  std::vector<exec::RuntimeBuffer> runtime_buffers() const override {
    return {{"cuBLAS workspace", kWorkspaceBytes}};
  }
  void use_runtime_buffer(size_t i, void* p) override {
    if (i != 0) throw std::logic_error("cuda backend: it has one runtime buffer");
    NP_CUBLAS_CHECK(cublasSetWorkspace(blas_, p, static_cast<size_t>(kWorkspaceBytes)));
  }

  // ---- device memory ----
  void* allocate(int64_t bytes) override {
    void* p = nullptr;
    if (cudaMalloc(&p, static_cast<size_t>(bytes)) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky error: the allocator reports the refusal
      return nullptr;
    }
    return p;
  }
  void release(void* p) override { NP_CUDA_CHECK(cudaFree(p)); }
  std::optional<int64_t> device_used() override { return used_now(); }
  std::vector<exec::RuntimeBuffer> measured_overheads() const override { return overheads_; }
  void synchronize() override { NP_CUDA_CHECK(cudaDeviceSynchronize()); }
  void fill_bytes(void* p, uint8_t value, int64_t bytes) override {
    NP_CUDA_CHECK(cudaMemset(p, value, static_cast<size_t>(bytes)));
  }
  void copy_to_host(void* dst, const Tensor& src) override {
    NP_CUDA_CHECK(cudaMemcpy(dst, src.data, static_cast<size_t>(src.bytes()), cudaMemcpyDeviceToHost));
  }
  void copy_from_host(const Tensor& dst, const void* src) override {
    NP_CUDA_CHECK(cudaMemcpy(dst.data, src, static_cast<size_t>(dst.bytes()), cudaMemcpyHostToDevice));
  }

  // ---- device operations around the ops ----
  void fill(const Tensor& t, float value) override { cuda::fill(t, value, stream_); }
  void copy_elements(const Tensor& dst, int64_t dst_offset, const Tensor& src, int64_t src_offset,
                     int64_t n) override {
    cuda::copy_elements(dst, dst_offset, src, src_offset, n, stream_);
  }
  void optimizer_update(const exec::OptimizerUpdate& u) override {
    if (u.kind == Optimizer::kNone) return;
    if (u.kind == Optimizer::kSgd) return sgd_step(u.grad, u.master, u.lr, stream_);
    adamw_step(u.grad, u.master, u.m, u.v, u.lr, u.beta1, u.beta2, u.eps, u.weight_decay, u.step,
               stream_);
  }
  // In index order, in double, on the host (the loss readout: one fp32 per token).
  double sum(const Tensor& t) override {
    std::vector<uint8_t> host(static_cast<size_t>(t.bytes()));
    copy_to_host(host.data(), t);
    Tensor h{host.data(), t.type};
    double s = 0;
    for (int64_t i = 0; i < t.numel(); ++i) s += exec::load(h, i);
    return s;
  }

  // ---- ops ----
  std::vector<Tensor> forward(const OpContext& c, std::span<const Tensor> in,
                              std::span<const Tensor> w) override {
    const GraphOp& op = *c.op;
    auto out = [&](const TensorType& t) { return c.alloc(t, AllocRole::kOutput); };
    auto ws = [&](const TensorType& t) { return c.alloc(t, AllocRole::kWorkspace); };
    const Dtype act = Dtype::kBf16;
    switch (op.kind) {
      case OpKind::kEmbedding: {
        const Tensor &ids = need(in, 0, "ids"), &W = need(w, 0, "embedding weight");
        Tensor y = out({{ids.numel(), W.type.shape.at(1)}, act});
        embedding_forward(ids, W, y, c.tp_rank, stream_);
        return {y};
      }
      case OpKind::kPosEmbedding: {
        const Tensor& x = need(in, 0, "input");
        Tensor y = out(x.type);
        pos_embedding_forward(x, need(w, 0, "position weight"), y,
                              first_row(c, x.type.shape.at(0)), c.setup->micro_batch, stream_);
        return {y};
      }
      case OpKind::kRmsNorm: {
        const Tensor& x = need(in, 0, "input");
        Tensor y = out(x.type);
        rmsnorm_forward(x, need(w, 0, "weight"), y, nullptr, kEps, stream_);
        return {y};
      }
      case OpKind::kRmsNormStats: {
        const Tensor& x = need(in, 0, "input");
        Tensor y = out(x.type), rstd = out({{x.type.shape.at(0)}, Dtype::kFp32});
        rmsnorm_forward(x, need(w, 0, "weight"), y, &rstd, kEps, stream_);
        return {y, rstd};
      }
      case OpKind::kLayerNorm: {
        const Tensor& x = need(in, 0, "input");
        Tensor y = out(x.type);
        layernorm_forward(x, need(w, 0, "weight"), need(w, 1, "bias"), y, nullptr, nullptr, kEps,
                          stream_);
        return {y};
      }
      case OpKind::kRmsNormHf: {
        const Tensor& x = need(in, 0, "input");
        TensorType fp32{x.type.shape, Dtype::kFp32};
        Tensor y = out(x.type), a = out(fp32), r = out({{x.type.shape.at(0)}, Dtype::kFp32}),
               cst = out(x.type), b = ws(fp32);
        rmsnorm_hf_forward(x, need(w, 0, "weight"), y, a, r, b, cst, kEps, stream_);
        return {y, a, r, cst, b};
      }
      case OpKind::kRepeatKv: {
        const Tensor& x = need(in, 0, "input");
        Tensor y = out({{x.type.shape.at(0), 3 * op.attrs.heads * op.attrs.head_dim}, x.type.dtype});
        repeat_kv_forward(x, y, op.attrs.heads, op.attrs.kv_heads, op.attrs.head_dim, stream_);
        return {y};
      }
      case OpKind::kSoftmaxFp32: {
        const Tensor& x = need(in, 0, "scores");
        Tensor cast = out(x.type), f = out({x.type.shape, Dtype::kFp32});
        causal_softmax_forward(x, f, op.attrs.head_dim, stream_);
        cuda::copy_elements(cast, 0, f, 0, f.numel(), stream_);
        return {cast, f};
      }
      case OpKind::kLayerNormStats: {
        const Tensor& x = need(in, 0, "input");
        TensorType row{{x.type.shape.at(0)}, Dtype::kFp32};
        Tensor y = out(x.type), mean = out(row), rstd = out(row);
        layernorm_forward(x, need(w, 0, "weight"), need(w, 1, "bias"), y, &mean, &rstd, kEps,
                          stream_);
        return {y, mean, rstd};
      }
      case OpKind::kAllGather: {
        const Tensor& x = need(in, 0, "input");
        Tensor y = out(with_rows(x.type, x.type.shape.at(0) * c.comm->tp_size()));
        c.comm->all_gather(x, y);
        return {y};
      }
      case OpKind::kReduceScatter: {
        const Tensor& x = need(in, 0, "input");
        Tensor y = out(with_rows(x.type, x.type.shape.at(0) / c.comm->tp_size()));
        c.comm->reduce_scatter(x, y);
        return {y};
      }
      case OpKind::kAllReduce: {
        const Tensor& x = need(in, 0, "input");
        Tensor y = out(x.type);
        NP_CUDA_CHECK(cudaMemcpy(y.data, x.data, static_cast<size_t>(x.bytes()), cudaMemcpyDeviceToDevice));
        c.comm->all_reduce(y);
        return {y};
      }
      case OpKind::kColumnLinear:
      case OpKind::kRowLinear: {
        const Tensor &x = need(in, 0, "input"), &W = need(w, 0, "weight");
        Tensor y = out({{x.type.shape.at(0), W.type.shape.at(0)}, act});
        bool bias = w.size() > 1 && (op.kind == OpKind::kColumnLinear || c.tp_rank == 0);
        linear_forward(blas_, x, W, bias ? &w[1] : nullptr, y, stream_);
        return {y};
      }
      case OpKind::kRope: {
        const Tensor& x = need(in, 0, "input");
        Tensor y = out(x.type);
        rope_apply(c, x, y, 1.0f);
        return {y};
      }
      case OpKind::kFlashAttention: {
        const OpAttrs& a = op.attrs;
        const Tensor& qkv = need(in, 0, "qkv");
        Tensor y = out({{a.batch * a.seq, a.heads * a.head_dim}, act}),
               lse = out({{a.batch, a.heads, a.seq}, Dtype::kFp32});
        flash_attention_forward(attention_shape(a), qkv, y, lse, stream_);
        return {y, lse};
      }
      case OpKind::kAttnScores: {
        const OpAttrs& a = op.attrs;
        Tensor sc = out({{a.batch, a.heads, a.seq, a.seq}, act});
        attn_scores_forward(blas_, attention_shape(a), need(in, 0, "qkv"), sc, stream_);
        return {sc};
      }
      case OpKind::kAttnContext: {
        const OpAttrs& a = op.attrs;
        Tensor y = out({{a.batch * a.seq, a.heads * a.head_dim}, act});
        attn_context_forward(blas_, attention_shape(a), need(in, 0, "probabilities"),
                             need(in, 1, "qkv"), y, stream_);
        return {y};
      }
      case OpKind::kSoftmax: {
        const Tensor& x = need(in, 0, "scores");
        Tensor y = out(x.type);
        causal_softmax_forward(x, y, op.attrs.head_dim, stream_);
        return {y};
      }
      case OpKind::kDropout: {
        const Tensor& x = need(in, 0, "input");
        Tensor y = out(x.type), mask = out({x.type.shape, Dtype::kU8});
        const std::vector<int64_t>& sh = x.type.shape;
        DropoutLayout l;
        if (sh.size() == 4) {
          l.probs = true, l.heads_local = sh[1], l.seq = sh[2], l.tp = c.setup->tp, l.tp_rank = c.tp_rank;
        } else {
          l.width = x.numel() / sh.at(0), l.first_row = first_row(c, sh.at(0));
        }
        uint64_t stream_id = exec::dropout_stream(c) ^ (static_cast<uint64_t>(c.mb) * 0x9E3779B97F4A7C15ull);
        dropout_forward(x, y, mask, static_cast<float>(c.model->dropout), c.seed, stream_id, l, stream_);
        return {y, mask};
      }
      case OpKind::kSwiGlu:
      case OpKind::kGluAct: {
        const Tensor& x = need(in, 0, "input");
        Tensor y = out({{x.type.shape.at(0), x.type.shape.at(1) / 2}, act});
        if (op.kind == OpKind::kSwiGlu) swiglu_forward(x, y, stream_);
        else glu_act_forward(x, y, stream_);
        return {y};
      }
      case OpKind::kGluMul: {
        const Tensor& a = need(in, 0, "activation");
        Tensor y = out(a.type);
        glu_mul_forward(a, need(in, 1, "input"), y, stream_);
        return {y};
      }
      case OpKind::kGelu: {
        const Tensor& x = need(in, 0, "input");
        Tensor y = out(x.type);
        gelu_forward(x, y, stream_);
        return {y};
      }
      case OpKind::kAdd: {
        const Tensor& x = need(in, 0, "input a");
        Tensor y = out(x.type);
        add(x, need(in, 1, "input b"), y, stream_);
        return {y};
      }
      case OpKind::kRouter: {
        const Tensor &x = need(in, 0, "input"), &W = need(w, 0, "router weight");
        Tensor y = out({{x.type.shape.at(0), W.type.shape.at(0)}, Dtype::kFp32});
        linear_forward(blas_, x, W, w.size() > 1 ? &w[1] : nullptr, y, stream_);
        return {y};
      }
      case OpKind::kTopK: {
        const Tensor& logits = need(in, 0, "router logits");
        int64_t T = logits.type.shape.at(0), k = op.attrs.top_k;
        Tensor probs = out({{T, k}, Dtype::kFp32}), idx = out({{T, k}, Dtype::kI64});
        topk_forward(logits, probs, idx, stream_);
        return {probs, idx};
      }
      case OpKind::kMoeDispatch: {
        const Tensor &x = need(in, 0, "tokens"), &idx = need(in, 1, "routing indices");
        const int64_t E = routed_experts(c), C = op.attrs.capacity;
        Tensor xe = out({{C > 0 ? E * C : idx.numel(), x.type.shape.at(1)}, act});
        moe_dispatch_forward(x, idx, xe, E, C, stream_);
        return {xe};
      }
      case OpKind::kExpertColumn:
      case OpKind::kExpertRow: {
        const Tensor &xe = need(in, 0, "expert input"), &W = need(w, 0, "expert weight");
        routed_experts(c);
        Tensor y = out({{xe.type.shape.at(0), W.type.shape.at(1)}, act});
        expert_forward(blas_, xe, need(in, 1, "routing indices"), W, y, op.attrs.capacity, stream_);
        return {y};
      }
      case OpKind::kMoeCombine: {
        const Tensor &ye = need(in, 0, "expert outputs"), &idx = need(in, 2, "routing indices");
        Tensor y = out({{idx.type.shape.at(0), ye.type.shape.at(1)}, act});
        moe_combine_forward(ye, need(in, 1, "routing probabilities"), idx, y, routed_experts(c),
                            op.attrs.capacity, stream_);
        return {y};
      }
      case OpKind::kSharedGate: {
        const Tensor& y = need(in, 1, "shared expert output");
        Tensor o = out(y.type);
        shared_gate_forward(need(in, 0, "gate input"), need(w, 0, "gate weight"), y, o, stream_);
        return {o};
      }
      case OpKind::kCastFp32: {
        const Tensor& x = need(in, 0, "input");
        Tensor y = out({x.type.shape, Dtype::kFp32});
        cuda::copy_elements(y, 0, x, 0, x.numel(), stream_);
        return {y};
      }
      case OpKind::kLogSoftmaxLoss:
        need(in, 2, "the bf16 logits the loss outlives");
        [[fallthrough]];
      case OpKind::kCrossEntropy: {
        const Tensor &logits = need(in, 0, "logits"), &targets = need(in, 1, "targets");
        int64_t T = logits.type.shape.at(0), V = logits.type.shape.at(1);
        Tensor loss = out({{T}, Dtype::kFp32}), sm = out({{T, V}, Dtype::kFp32});
        // fp32_copy: the logits cast to an fp32 tensor first, the loss computed from the copy.
        Tensor copy = op.attrs.fp32_copy ? ws({{T, V}, Dtype::kFp32}) : Tensor{};
        Tensor mx = ws({{T}, Dtype::kFp32}), se = ws({{T}, Dtype::kFp32}), tg = ws({{T}, Dtype::kFp32});
        if (copy) cuda::copy_elements(copy, 0, logits, 0, T * V, stream_);
        const Tensor& l = copy ? copy : logits;
        cross_entropy_max(l, mx, stream_);
        int64_t tp = c.comm ? c.comm->tp_size() : 1;
        if (tp > 1) global_max(c, mx, tp);
        cross_entropy_exp_sum(l, targets, mx, sm, se, tg, c.tp_rank, stream_);
        if (tp > 1) c.comm->all_reduce(se), c.comm->all_reduce(tg);
        bool log_probs = op.kind == OpKind::kLogSoftmaxLoss;
        cross_entropy_finalize(sm, se, mx, tg, loss, log_probs ? &l : nullptr, stream_);
        if (copy) return {loss, sm, copy, mx, se, tg};
        return {loss, sm, mx, se, tg};
      }
      case OpKind::kCrossEntropyTe: {
        const Tensor &logits = need(in, 0, "logits"), &targets = need(in, 1, "targets");
        int64_t T = logits.type.shape.at(0);
        Tensor loss = out({{T}, Dtype::kFp32}), stats = out({{T, 2}, Dtype::kFp32});
        Tensor mx = ws({{T}, Dtype::kFp32}), se = ws({{T}, Dtype::kFp32}), tg = ws({{T}, Dtype::kFp32});
        cross_entropy_max(logits, mx, stream_);
        int64_t tp = c.comm ? c.comm->tp_size() : 1;
        if (tp > 1) global_max(c, mx, tp);
        cross_entropy_exp_sum(logits, targets, mx, Tensor{}, se, tg, c.tp_rank, stream_);
        if (tp > 1) c.comm->all_reduce(se), c.comm->all_reduce(tg);
        cross_entropy_te_finalize(se, mx, tg, loss, stats, stream_);
        return {loss, stats, mx, se, tg};
      }
      default:
        unsupported(c, "not written for the CUDA backend yet");
    }
  }

  void backward(const OpContext& c, const BackwardArgs& a) override {
    const GraphOp& op = *c.op;
    auto ws = [&](const TensorType& t) { return c.alloc(t, AllocRole::kWorkspace); };
    // The gradient of input k: the one already there (accumulate) or a new one of type t.
    auto grad = [&](int k, const TensorType& t, bool& acc) -> Tensor& {
      Tensor& dst = a.grad_inputs[static_cast<size_t>(k)];
      acc = static_cast<bool>(dst);
      if (!dst) dst = c.alloc(t, AllocRole::kGradInput);
      return dst;
    };
    // An input gradient that equals a tensor already held (collectives, add): copied or added.
    auto pass = [&](int k, const Tensor& g) {
      bool acc = false;
      Tensor& dst = grad(k, g.type, acc);
      if (acc) accumulate(dst, g, stream_);
      else NP_CUDA_CHECK(cudaMemcpy(dst.data, g.data, static_cast<size_t>(g.bytes()), cudaMemcpyDeviceToDevice));
    };
    bool acc = false;
    switch (op.kind) {
      case OpKind::kEmbedding: {
        const Tensor& dw = need(a.weight_grads, 0, "weight gradient");
        // dense_wgrad: the table's gradient whole in bf16 first, then added into the buffer.
        Tensor dense = op.attrs.dense_wgrad ? ws({dw.type.shape, Dtype::kBf16}) : Tensor{};
        if (dense) cuda::fill(dense, 0.0f, stream_);
        embedding_backward(need(a.inputs, 0, "ids"), need(a.grad_outputs, 0, "gradient"),
                           dense ? dense : dw, c.tp_rank, stream_);
        if (dense) cuda::accumulate(dw, dense, stream_);
        return;
      }
      case OpKind::kPosEmbedding: {
        const Tensor& g = need(a.grad_outputs, 0, "gradient");
        pass(0, g);
        return pos_embedding_backward(g, need(a.weight_grads, 0, "weight gradient"),
                                      first_row(c, g.type.shape.at(0)), c.setup->micro_batch, stream_);
      }
      case OpKind::kRmsNorm:
      case OpKind::kRmsNormStats: {
        const Tensor& x = need(a.inputs, 0, "input");
        // The per-row 1/rms: kept by the forward, or recomputed into the op table's workspace.
        bool saved = op.kind == OpKind::kRmsNormStats;
        Tensor rstd = saved ? need(a.outputs, 1, "rstd") : ws({{x.type.shape.at(0)}, Dtype::kFp32});
        Tensor& dx = grad(0, x.type, acc);
        return rmsnorm_backward(x, need(a.weights, 0, "weight"), need(a.grad_outputs, 0, "gradient"),
                                dx, acc, need(a.weight_grads, 0, "weight gradient"), rstd, saved, kEps,
                                stream_);
      }
      case OpKind::kRmsNormHf: {
        const Tensor &fp32 = need(a.outputs, 1, "fp32 input"), &cst = need(a.outputs, 3, "normalized");
        Tensor db = ws(fp32.type), da = ws(fp32.type);
        Tensor& dx = grad(0, cst.type, acc);
        return rmsnorm_hf_backward(fp32, need(a.outputs, 2, "rstd"), cst, need(a.weights, 0, "weight"),
                                   need(a.grad_outputs, 0, "gradient"), db, da, dx, acc,
                                   need(a.weight_grads, 0, "weight gradient"), stream_);
      }
      case OpKind::kRepeatKv: {
        const Tensor& g = need(a.grad_outputs, 0, "gradient");
        const OpAttrs& at = op.attrs;
        Tensor& dx = grad(0, {{g.type.shape.at(0), (at.heads + 2 * at.kv_heads) * at.head_dim}, g.type.dtype}, acc);
        return repeat_kv_backward(g, dx, acc, at.heads, at.kv_heads, at.head_dim, stream_);
      }
      case OpKind::kSoftmaxFp32: {
        const Tensor &f = need(a.outputs, 1, "fp32 probabilities"), &g = need(a.grad_outputs, 0, "gradient");
        Tensor g32 = ws(f.type);
        cuda::copy_elements(g32, 0, g, 0, g.numel(), stream_);
        Tensor& dx = grad(0, g.type, acc);
        return causal_softmax_backward(f, g32, dx, acc, op.attrs.head_dim, stream_);
      }
      case OpKind::kLayerNorm:
      case OpKind::kLayerNormStats: {
        const Tensor& x = need(a.inputs, 0, "input");
        bool saved = op.kind == OpKind::kLayerNormStats;
        TensorType row{{x.type.shape.at(0)}, Dtype::kFp32};
        Tensor mean = saved ? need(a.outputs, 1, "mean") : ws(row);
        Tensor rstd = saved ? need(a.outputs, 2, "rstd") : ws(row);
        Tensor& dx = grad(0, x.type, acc);
        return layernorm_backward(x, need(a.weights, 0, "weight"), need(a.grad_outputs, 0, "gradient"),
                                  dx, acc, need(a.weight_grads, 0, "weight gradient"),
                                  need(a.weight_grads, 1, "bias gradient"), mean, rstd, saved, kEps,
                                  stream_);
      }
      case OpKind::kAllGather:
      case OpKind::kReduceScatter: {
        const Tensor& g = need(a.grad_outputs, 0, "gradient");
        int64_t tp = c.comm->tp_size(), rows = g.type.shape.at(0);
        TensorType t = with_rows(g.type, op.kind == OpKind::kAllGather ? rows / tp : rows * tp);
        if (a.grad_inputs[0]) unsupported(c, "accumulating a collective's input gradient needs a planned buffer");
        Tensor& dst = grad(0, t, acc);
        if (op.kind == OpKind::kAllGather) c.comm->reduce_scatter(g, dst);
        else c.comm->all_gather(g, dst);
        return;
      }
      case OpKind::kAllReduce:
        return pass(0, need(a.grad_outputs, 0, "gradient"));
      case OpKind::kColumnLinear:
      case OpKind::kRowLinear: {
        const Tensor& x = need(a.inputs, 0, "input");
        bool reduce = op.bwd_collective == "all_reduce";
        if (reduce && a.grad_inputs[0]) unsupported(c, "accumulating an all-reduced input gradient needs a planned buffer");
        const Tensor& w = need(a.weights, 0, "weight");
        // dense_wgrad: the weight gradient whole in bf16 first (taken before dx, as the op
        // table orders a backward's workspaces and input gradients), then added into the buffer.
        Tensor dense = op.attrs.dense_wgrad ? ws({w.type.shape, Dtype::kBf16}) : Tensor{};
        Tensor& dx = grad(0, x.type, acc);
        linear_backward(blas_, x, w, need(a.grad_outputs, 0, "gradient"), &dx, acc,
                        need(a.weight_grads, 0, "weight gradient"),
                        a.weight_grads.size() > 1 ? &a.weight_grads[1] : nullptr, stream_,
                        dense ? &dense : nullptr);
        if (reduce) c.comm->all_reduce(dx);  // bf16 partial sums (the CPU reduces fp32 ones)
        return;
      }
      case OpKind::kRope: {
        const Tensor& g = need(a.grad_outputs, 0, "gradient");
        if (a.grad_inputs[0]) unsupported(c, "accumulating RoPE's input gradient needs a planned buffer");
        Tensor& dx = grad(0, g.type, acc);
        return rope_apply(c, g, dx, -1.0f);
      }
      case OpKind::kFlashAttention: {
        const OpAttrs& s = op.attrs;
        const Tensor& qkv = need(a.inputs, 0, "qkv");
        Tensor dq = ws({{s.batch * s.seq, s.heads * s.head_dim}, Dtype::kFp32}),
               rowsum = ws({{s.batch, s.heads, s.seq}, Dtype::kFp32});
        Tensor& dx = grad(0, qkv.type, acc);
        return flash_attention_backward(attention_shape(s), qkv,
                                        need(a.outputs, 0, "output"), need(a.outputs, 1, "logsumexp"),
                                        need(a.grad_outputs, 0, "gradient"), dx, acc, dq, rowsum, stream_);
      }
      case OpKind::kAttnScores: {
        const Tensor& qkv = need(a.inputs, 0, "qkv");
        Tensor& dx = grad(0, qkv.type, acc);
        return attn_scores_backward(blas_, attention_shape(op.attrs), qkv,
                                    need(a.grad_outputs, 0, "gradient"), dx, acc, stream_);
      }
      case OpKind::kAttnContext: {
        const Tensor &p = need(a.inputs, 0, "probabilities"), &qkv = need(a.inputs, 1, "qkv");
        bool acc_p = false, acc_q = false;
        Tensor& dp = grad(0, p.type, acc_p);
        Tensor& dx = grad(1, qkv.type, acc_q);
        return attn_context_backward(blas_, attention_shape(op.attrs), p, qkv,
                                     need(a.grad_outputs, 0, "gradient"), dp, acc_p, dx, acc_q,
                                     stream_);
      }
      case OpKind::kSoftmax: {
        const Tensor& p = need(a.outputs, 0, "probabilities");
        Tensor& dx = grad(0, p.type, acc);
        return causal_softmax_backward(p, need(a.grad_outputs, 0, "gradient"), dx, acc,
                                       op.attrs.head_dim, stream_);
      }
      case OpKind::kDropout: {
        const Tensor& g = need(a.grad_outputs, 0, "gradient");
        Tensor& dx = grad(0, g.type, acc);
        return dropout_backward(g, need(a.outputs, 1, "mask"), dx, acc,
                                static_cast<float>(c.model->dropout), stream_);
      }
      case OpKind::kSwiGlu:
      case OpKind::kGluAct: {
        const Tensor &x = need(a.inputs, 0, "input"), &g = need(a.grad_outputs, 0, "gradient");
        Tensor& dx = grad(0, x.type, acc);
        if (op.kind == OpKind::kSwiGlu) return swiglu_backward(x, g, dx, acc, stream_);
        return glu_act_backward(x, g, dx, acc, stream_);
      }
      case OpKind::kGluMul: {
        const Tensor &act_in = need(a.inputs, 0, "activation"), &x = need(a.inputs, 1, "input");
        bool acc_x = false;
        Tensor& da = grad(0, act_in.type, acc);
        Tensor& dx = grad(1, x.type, acc_x);
        return glu_mul_backward(act_in, x, need(a.grad_outputs, 0, "gradient"), da, acc, dx, acc_x,
                                stream_);
      }
      case OpKind::kGelu: {
        const Tensor& x = need(a.inputs, 0, "input");
        Tensor& dx = grad(0, x.type, acc);
        return gelu_backward(x, need(a.grad_outputs, 0, "gradient"), dx, acc, stream_);
      }
      case OpKind::kAdd: {
        const Tensor& g = need(a.grad_outputs, 0, "gradient");
        pass(0, g);
        return pass(1, g);
      }
      case OpKind::kRouter: {
        const Tensor& x = need(a.inputs, 0, "input");
        Tensor& dx = grad(0, x.type, acc);
        return router_backward(x, need(a.weights, 0, "router weight"), need(a.grad_outputs, 0, "gradient"),
                               dx, acc, need(a.weight_grads, 0, "router weight gradient"),
                               a.weight_grads.size() > 1 ? &a.weight_grads[1] : nullptr, stream_);
      }
      case OpKind::kTopK: {
        const Tensor &probs = need(a.outputs, 0, "routing probabilities"),
                     &idx = need(a.outputs, 1, "routing indices");
        if (!c.model->moe) unsupported(c, "top-k routing outside a MoE model");
        Tensor& dl = grad(0, {{idx.type.shape.at(0), c.model->moe->num_experts}, Dtype::kFp32}, acc);
        return topk_backward(probs, idx, need(a.grad_outputs, 0, "gradient"), dl, acc, stream_);
      }
      case OpKind::kMoeDispatch: {
        const Tensor &g = need(a.grad_outputs, 0, "gradient"), &idx = need(a.inputs, 1, "routing indices");
        Tensor& dx = grad(0, {{idx.type.shape.at(0), g.type.shape.at(1)}, g.type.dtype}, acc);
        return moe_dispatch_backward(g, idx, dx, acc, routed_experts(c), c.op->attrs.capacity, stream_);
      }
      case OpKind::kExpertColumn:
      case OpKind::kExpertRow: {
        const Tensor& xe = need(a.inputs, 0, "expert input");
        routed_experts(c);
        Tensor& dx = grad(0, xe.type, acc);
        return expert_backward(blas_, xe, need(a.inputs, 1, "routing indices"), need(a.weights, 0, "expert weight"),
                               need(a.grad_outputs, 0, "gradient"), dx, acc,
                               need(a.weight_grads, 0, "expert weight gradient"),
                               c.op->attrs.capacity, stream_);
      }
      case OpKind::kMoeCombine: {
        const Tensor &ye = need(a.inputs, 0, "expert outputs"), &probs = need(a.inputs, 1, "routing probabilities");
        bool acc_p = false;
        Tensor& dye = grad(0, ye.type, acc);
        Tensor& dp = grad(1, probs.type, acc_p);
        return moe_combine_backward(ye, probs, need(a.inputs, 2, "routing indices"),
                                    need(a.grad_outputs, 0, "gradient"), dye, acc, dp, acc_p,
                                    routed_experts(c), c.op->attrs.capacity, stream_);
      }
      case OpKind::kSharedGate: {
        const Tensor &x = need(a.inputs, 0, "gate input"), &y = need(a.inputs, 1, "shared expert output");
        Tensor dz = ws({{x.type.shape.at(0)}, Dtype::kFp32});
        bool acc_y = false;
        Tensor& dx = grad(0, x.type, acc);
        Tensor& dy = grad(1, y.type, acc_y);
        return shared_gate_backward(x, need(a.weights, 0, "gate weight"), y, need(a.grad_outputs, 0, "gradient"),
                                    dx, acc, dy, acc_y, need(a.weight_grads, 0, "gate weight gradient"), dz,
                                    stream_);
      }
      case OpKind::kCastFp32: {
        const Tensor& g = need(a.grad_outputs, 0, "gradient");
        Tensor& dx = grad(0, {g.type.shape, Dtype::kBf16}, acc);
        if (acc) unsupported(c, "accumulating the cast's input gradient needs a planned buffer");
        cuda::copy_elements(dx, 0, g, 0, g.numel(), stream_);
        return;
      }
      case OpKind::kCrossEntropyTe: {
        const Tensor& logits = need(a.inputs, 0, "logits");
        Tensor& dl = grad(0, logits.type, acc);
        return cross_entropy_te_backward(logits, need(a.outputs, 1, "row statistics"),
                                         need(a.inputs, 1, "targets"), dl, acc, c.tp_rank,
                                         c.loss_scale, stream_);
      }
      case OpKind::kCrossEntropy:
      case OpKind::kLogSoftmaxLoss: {
        const Tensor& sm = need(a.outputs, 1, "softmax");
        bool log_probs = op.kind == OpKind::kLogSoftmaxLoss;
        Dtype dt = log_probs ? Dtype::kFp32
                   : a.inputs[0] && !a.inputs[0].type.shape.empty() ? a.inputs[0].type.dtype
                                                                    : Dtype::kBf16;
        // The log-softmax loss: the NLL's fp32 gradient per logit first (a workspace).
        Tensor nll = log_probs ? ws(sm.type) : Tensor{};
        // fp32_grad: the gradient formed in a fresh fp32 buffer, then cast into dl.
        Tensor fp32 = op.attrs.fp32_grad ? ws(sm.type) : Tensor{};
        Tensor& dl = grad(0, {sm.type.shape, dt}, acc);
        if (fp32) {
          cross_entropy_backward(sm, need(a.inputs, 1, "targets"), fp32, false, c.tp_rank,
                                 c.loss_scale, nullptr, stream_);
          if (acc) return cuda::accumulate(dl, fp32, stream_);
          return cuda::copy_elements(dl, 0, fp32, 0, fp32.numel(), stream_);
        }
        return cross_entropy_backward(sm, need(a.inputs, 1, "targets"), dl, acc, c.tp_rank,
                                      c.loss_scale, nll ? &nll : nullptr, stream_);
      }
      default:
        unsupported(c, "not written for the CUDA backend yet");
    }
  }

 private:
  void rope_apply(const OpContext& c, const Tensor& in, const Tensor& out, float sign) {
    int64_t tp = c.setup->tp, rows = in.type.shape.at(0);
    rope(in, out, c.model->heads / tp, c.model->kv_heads / tp, c.model->head_dim,
         first_row(c, rows), c.setup->micro_batch, sign, stream_);
  }
  // mx = the maximum over the TP group, through an all-gather of every rank's maxima (host
  // staging outside the device model, as the CPU reference's).
  void global_max(const OpContext& c, const Tensor& mx, int64_t tp) {
    int64_t T = mx.numel();
    std::vector<float> all(static_cast<size_t>(tp * T));
    Tensor gathered{all.data(), {{tp * T}, Dtype::kFp32}};
    c.comm->all_gather(mx, gathered);
    std::vector<float> best(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      float v = all[static_cast<size_t>(t)];
      for (int64_t q = 1; q < tp; ++q) v = std::max(v, all[static_cast<size_t>(q * T + t)]);
      best[static_cast<size_t>(t)] = v;
    }
    copy_from_host(mx, best.data());
  }

  static constexpr int64_t kWorkspaceBytes = RuntimeAssumptions{}.cublas_workspace_bytes;
  static int64_t used_now() {
    size_t free_bytes = 0, total = 0;
    NP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return static_cast<int64_t>(total - free_bytes);
  }

  cublasHandle_t blas_ = nullptr;
  // This rank's own stream, a blocking one: the synchronous copies (on the legacy default stream)
  // and the virtual ranks' collectives wait for its work, so virtual ranks sharing a GPU each
  // issue in order on their own stream.
  cudaStream_t stream_ = nullptr;
  std::vector<exec::RuntimeBuffer> overheads_;
};

}  // namespace

std::unique_ptr<exec::Backend> make_cuda_backend() {
  return std::make_unique<CudaBackend>();
}

}  // namespace np::cuda
