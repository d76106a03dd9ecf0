// The CPU reference backend's dispatch: one switch per direction over every OpKind, with no
// default case, so that a new kind without a kernel is a compiler warning (-Wswitch).
#include "executor/cpu/cpu_backend.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <string>

#include "executor/cpu/kernels.hpp"

namespace np::exec {

namespace {

using namespace cpu;

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(Dtype act) : act_(act) {}
  const char* name() const override {
    return act_ == Dtype::kBf16 ? "cpu" : "cpu-fp32-activations";
  }

  std::vector<Tensor> forward(const OpContext& ctx, std::span<const Tensor> in,
                              std::span<const Tensor> w) override {
    check(ctx.op && ctx.model && ctx.setup, "the context needs op, model and setup");
    check(ctx.op->kind >= OpKind::kEmbedding && ctx.op->kind < OpKind::kCount, "not an op kind");
    const OpInfo& info = op_info(ctx.op->kind);
    if (in.size() != static_cast<size_t>(info.num_inputs))
      fail(std::string(info.name) + ": wrong number of inputs");
    // A float8 weight of FSDP's float8 all-gather comes with its scale after the weights.
    const size_t scales = ctx.op->attrs.fp8_gathered_weight(0);
    if (w.size() != ctx.op->weights.size() + scales)
      fail(std::string(info.name) + ": wrong number of weights");
    Env env{ctx, act_};
    switch (ctx.op->kind) {
      case OpKind::kCpGatherKv:
        return cp_gather_kv_forward(env, in, w);
      case OpKind::kFlashAttentionCp:
        return flash_attention_cp_forward(env, in, w);
      case OpKind::kEmbedding:
        return embedding_forward(env, in, w);
      case OpKind::kPosEmbedding:
        return pos_embedding_forward(env, in, w);
      case OpKind::kRmsNorm:
      case OpKind::kRmsNormStats:
        return rmsnorm_forward(env, in, w);
      case OpKind::kLayerNorm:
      case OpKind::kLayerNormStats:
        return layernorm_forward(env, in, w);
      case OpKind::kRmsNormHf:
        return rmsnorm_hf_forward(env, in, w);
      case OpKind::kSoftmaxFp32:
        return softmax_fp32_forward(env, in, w);
      case OpKind::kRepeatKv:
        return repeat_kv_forward(env, in, w);
      case OpKind::kAllGather:
        return all_gather_forward(env, in, w);
      case OpKind::kReduceScatter:
        return reduce_scatter_forward(env, in, w);
      case OpKind::kAllReduce:
        return all_reduce_forward(env, in, w);
      case OpKind::kColumnLinear:
        if (ctx.op->attrs.fp8 != Fp8Recipe::kNone) return float8_linear_forward(env, in, w);
        return column_linear_forward(env, in, w);
      case OpKind::kRowLinear:
        if (ctx.op->attrs.fp8 != Fp8Recipe::kNone) return float8_linear_forward(env, in, w);
        return row_linear_forward(env, in, w);
      case OpKind::kRope:
        return rope_forward(env, in, w);
      case OpKind::kQkNorm:
        return qk_norm_forward(env, in, w);
      case OpKind::kQkNormHf:
        return qk_norm_hf_forward(env, in, w);
      case OpKind::kFlashAttention:
        return flash_attention_forward(env, in, w);
      case OpKind::kAttnScores:
        return attn_scores_forward(env, in, w);
      case OpKind::kSoftmax:
        return softmax_forward(env, in, w);
      case OpKind::kAttnContext:
        return attn_context_forward(env, in, w);
      case OpKind::kDropout:
        return dropout_forward(env, in, w);
      case OpKind::kSwiGlu:
        return swiglu_forward(env, in, w);
      case OpKind::kGluAct:
        return glu_act_forward(env, in, w);
      case OpKind::kGluMul:
        return glu_mul_forward(env, in, w);
      case OpKind::kGelu:
        return gelu_forward(env, in, w);
      case OpKind::kAdd:
        return add_forward(env, in, w);
      case OpKind::kRouter:
        return router_forward(env, in, w);
      case OpKind::kTopK:
        return topk_forward(env, in, w);
      case OpKind::kRouteScores:
        return route_scores_forward(env, in, w);
      case OpKind::kRouteTopK:
        return route_topk_forward(env, in, w);
      case OpKind::kMoeDispatch:
        return moe_dispatch_forward(env, in, w);
      case OpKind::kExpertColumn:
        return expert_column_forward(env, in, w);
      case OpKind::kExpertRow:
        return expert_row_forward(env, in, w);
      case OpKind::kMoeCombine:
        return moe_combine_forward(env, in, w);
      case OpKind::kSharedGate:
        return shared_gate_forward(env, in, w);
      case OpKind::kCrossEntropy:
        return cross_entropy_forward(env, in, w);
      case OpKind::kCastFp32:
        return cast_fp32_forward(env, in, w);
      case OpKind::kLogSoftmaxLoss:
        return log_softmax_loss_forward(env, in, w);
      case OpKind::kCrossEntropyTe:
        return cross_entropy_te_forward(env, in, w);
      case OpKind::kLinear:
        return replicated_linear_forward(env, in, w);
      case OpKind::kMlaRope:
        return mla_rope_forward(env, in, w);
      case OpKind::kConcat:
        return concat_forward(env, in, w);
      case OpKind::kGatherFeatures:
        return gather_features_forward(env, in, w);
      case OpKind::kScatterRows:
        return scatter_rows_forward(env, in, w);
      case OpKind::kRopeQk:
        return rope_qk_forward(env, in, w);
      case OpKind::kSdpa:
        return sdpa_forward(env, in, w);
      case OpKind::kSilu:
        return silu_forward(env, in, w);
      case OpKind::kMul:
        return mul_forward(env, in, w);
      case OpKind::kHeadRmsNorm:
        return head_rmsnorm_forward(env, in, w);
      case OpKind::kRopeHalfQk:
        return rope_half_qk_forward(env, in, w);
      case OpKind::kFp8AllGather:
        return fp8_all_gather_forward(env, in, w);
      case OpKind::kFp8ColumnLinear:
        return fp8_column_linear_forward(env, in, w);
      case OpKind::kFp8RowLinear:
        return fp8_row_linear_forward(env, in, w);
      case OpKind::kTeColumnLinear:
        return te_column_linear_forward(env, in, w);
      case OpKind::kTeRowLinear:
        return te_row_linear_forward(env, in, w);
      case OpKind::kCount:
        break;
    }
    fail("forward: not an op kind");
  }

  void backward(const OpContext& ctx, const BackwardArgs& a) override {
    check(ctx.op && ctx.model && ctx.setup, "the context needs op, model and setup");
    check(ctx.op->kind >= OpKind::kEmbedding && ctx.op->kind < OpKind::kCount, "not an op kind");
    const OpInfo& info = op_info(ctx.op->kind);
    if (a.inputs.size() != static_cast<size_t>(info.num_inputs) ||
        a.grad_inputs.size() != static_cast<size_t>(info.num_inputs))
      fail(std::string(info.name) + ": backward needs one inputs and grad_inputs entry per input");
    if (a.outputs.size() != static_cast<size_t>(info.num_outputs) ||
        a.grad_outputs.size() != static_cast<size_t>(info.num_outputs))
      fail(std::string(info.name) +
           ": backward needs one outputs and grad_outputs entry per output");
    const size_t scales = ctx.op->attrs.fp8_gathered_weight(0);
    if (a.weights.size() != ctx.op->weights.size() + scales ||
        a.weight_grads.size() != ctx.op->weights.size())
      fail(std::string(info.name) + ": backward needs the weights and their gradients");
    Env env{ctx, act_};
    switch (ctx.op->kind) {
      case OpKind::kCpGatherKv:
        return cp_gather_kv_backward(env, a);
      case OpKind::kFlashAttentionCp:
        return flash_attention_cp_backward(env, a);
      case OpKind::kEmbedding:
        return embedding_backward(env, a);
      case OpKind::kPosEmbedding:
        return pos_embedding_backward(env, a);
      case OpKind::kRmsNorm:
      case OpKind::kRmsNormStats:
        return rmsnorm_backward(env, a);
      case OpKind::kLayerNorm:
      case OpKind::kLayerNormStats:
        return layernorm_backward(env, a);
      case OpKind::kRmsNormHf:
        return rmsnorm_hf_backward(env, a);
      case OpKind::kSoftmaxFp32:
        return softmax_fp32_backward(env, a);
      case OpKind::kRepeatKv:
        return repeat_kv_backward(env, a);
      case OpKind::kAllGather:
        return all_gather_backward(env, a);
      case OpKind::kReduceScatter:
        return reduce_scatter_backward(env, a);
      case OpKind::kAllReduce:
        return all_reduce_backward(env, a);
      case OpKind::kColumnLinear:
        if (ctx.op->attrs.fp8 != Fp8Recipe::kNone) return float8_linear_backward(env, a);
        return column_linear_backward(env, a);
      case OpKind::kRowLinear:
        if (ctx.op->attrs.fp8 != Fp8Recipe::kNone) return float8_linear_backward(env, a);
        return row_linear_backward(env, a);
      case OpKind::kRope:
        return rope_backward(env, a);
      case OpKind::kQkNorm:
        return qk_norm_backward(env, a);
      case OpKind::kQkNormHf:
        return qk_norm_hf_backward(env, a);
      case OpKind::kFlashAttention:
        return flash_attention_backward(env, a);
      case OpKind::kAttnScores:
        return attn_scores_backward(env, a);
      case OpKind::kSoftmax:
        return softmax_backward(env, a);
      case OpKind::kAttnContext:
        return attn_context_backward(env, a);
      case OpKind::kDropout:
        return dropout_backward(env, a);
      case OpKind::kSwiGlu:
        return swiglu_backward(env, a);
      case OpKind::kGluAct:
        return glu_act_backward(env, a);
      case OpKind::kGluMul:
        return glu_mul_backward(env, a);
      case OpKind::kGelu:
        return gelu_backward(env, a);
      case OpKind::kAdd:
        return add_backward(env, a);
      case OpKind::kRouter:
        return router_backward(env, a);
      case OpKind::kTopK:
        return topk_backward(env, a);
      case OpKind::kRouteScores:
        return route_scores_backward(env, a);
      case OpKind::kRouteTopK:
        return route_topk_backward(env, a);
      case OpKind::kMoeDispatch:
        return moe_dispatch_backward(env, a);
      case OpKind::kExpertColumn:
        return expert_column_backward(env, a);
      case OpKind::kExpertRow:
        return expert_row_backward(env, a);
      case OpKind::kMoeCombine:
        return moe_combine_backward(env, a);
      case OpKind::kSharedGate:
        return shared_gate_backward(env, a);
      case OpKind::kCrossEntropy:
        return cross_entropy_backward(env, a);
      case OpKind::kCastFp32:
        return cast_fp32_backward(env, a);
      case OpKind::kLogSoftmaxLoss:
        return log_softmax_loss_backward(env, a);
      case OpKind::kCrossEntropyTe:
        return cross_entropy_te_backward(env, a);
      case OpKind::kLinear:
        return replicated_linear_backward(env, a);
      case OpKind::kMlaRope:
        return mla_rope_backward(env, a);
      case OpKind::kConcat:
        return concat_backward(env, a);
      case OpKind::kGatherFeatures:
        return gather_features_backward(env, a);
      case OpKind::kScatterRows:
        return scatter_rows_backward(env, a);
      case OpKind::kRopeQk:
        return rope_qk_backward(env, a);
      case OpKind::kSdpa:
        return sdpa_backward(env, a);
      case OpKind::kSilu:
        return silu_backward(env, a);
      case OpKind::kMul:
        return mul_backward(env, a);
      case OpKind::kHeadRmsNorm:
        return head_rmsnorm_backward(env, a);
      case OpKind::kRopeHalfQk:
        return rope_half_qk_backward(env, a);
      case OpKind::kFp8AllGather:
        return all_gather_backward(env, a);
      case OpKind::kFp8ColumnLinear:
        return fp8_column_linear_backward(env, a);
      case OpKind::kFp8RowLinear:
        return fp8_row_linear_backward(env, a);
      case OpKind::kTeColumnLinear:
        return te_column_linear_backward(env, a);
      case OpKind::kTeRowLinear:
        return te_row_linear_backward(env, a);
      case OpKind::kCount:
        break;
    }
    fail("backward: not an op kind");
  }

  // Device memory is host memory: 64-byte aligned blocks.
  void* allocate(int64_t bytes) override {
    size_t size = static_cast<size_t>(std::max<int64_t>(64, (bytes + 63) / 64 * 64));
    return std::aligned_alloc(64, size);
  }
  void release(void* p) override { std::free(p); }
  // Expandable segments: addresses reserved without memory (PROT_NONE, no swap reserved), pages
  // made usable as the allocator maps them and given back as it unmaps them.
  void* reserve_addresses(int64_t bytes) override {
    void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  bool map_addresses(void* base, int64_t offset, int64_t bytes) override {
    return mprotect(static_cast<char*>(base) + offset, static_cast<size_t>(bytes),
                    PROT_READ | PROT_WRITE) == 0;
  }
  void unmap_addresses(void* base, int64_t offset, int64_t bytes) override {
    char* p = static_cast<char*>(base) + offset;
    madvise(p, static_cast<size_t>(bytes), MADV_DONTNEED);
    mprotect(p, static_cast<size_t>(bytes), PROT_NONE);
  }
  void release_addresses(void* base, int64_t bytes) override {
    munmap(base, static_cast<size_t>(bytes));
  }
  void fill_bytes(void* p, uint8_t value, int64_t bytes) override {
    std::memset(p, value, static_cast<size_t>(bytes));
  }
  void copy_to_host(void* dst, const Tensor& src) override {
    std::memcpy(dst, src.data, static_cast<size_t>(src.bytes()));
  }
  void copy_from_host(const Tensor& dst, const void* src) override {
    std::memcpy(dst.data, src, static_cast<size_t>(dst.bytes()));
  }

  void fill(const Tensor& t, float value) override {
    for (int64_t i = 0; i < t.numel(); ++i) store(t, i, value);
  }
  void copy_elements(const Tensor& dst, int64_t dst_offset, const Tensor& src, int64_t src_offset,
                     int64_t n) override {
    check(dst_offset >= 0 && src_offset >= 0 && dst_offset + n <= dst.numel() &&
              src_offset + n <= src.numel(),
          "copy_elements: range out of bounds");
    for (int64_t i = 0; i < n; ++i) store(dst, dst_offset + i, load(src, src_offset + i));
  }
  void optimizer_update(const OptimizerUpdate& u) override {
    if (u.kind == Optimizer::kNone) return;
    float* master = u.master.as<float>();
    int64_t n = u.master.numel();
    check(u.grad.numel() == n, "optimizer_update: gradient and master sizes differ");
    if (u.kind == Optimizer::kSgd) {
      for (int64_t i = 0; i < n; ++i) master[i] -= u.lr * load(u.grad, i);
      return;
    }
    float c1 = 1.0f - std::pow(u.beta1, static_cast<float>(u.step + 1)),
          c2 = 1.0f - std::pow(u.beta2, static_cast<float>(u.step + 1));
    float* m = u.m.as<float>();
    float* v = u.v.as<float>();
    for (int64_t i = 0; i < n; ++i) {
      float g = load(u.grad, i);
      m[i] = u.beta1 * m[i] + (1 - u.beta1) * g;
      v[i] = u.beta2 * v[i] + (1 - u.beta2) * g * g;
      master[i] -= u.lr * ((m[i] / c1) / (std::sqrt(v[i] / c2) + u.eps) + u.weight_decay * master[i]);
    }
  }
  double sum(const Tensor& t) override {
    double s = 0;
    for (int64_t i = 0; i < t.numel(); ++i) s += load(t, i);
    return s;
  }

 private:
  Dtype act_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<CpuBackend>(Dtype::kBf16);
}
std::unique_ptr<Backend> make_cpu_backend_fp32_activations() {
  return std::make_unique<CpuBackend>(Dtype::kFp32);
}

}  // namespace np::exec
