// The CPU reference backend's dispatch: one switch per direction over every OpKind, with no
// default case, so that a new kind without a kernel is a compiler warning (-Wswitch).
#include "executor/cpu/cpu_backend.hpp"

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
    if (w.size() != ctx.op->weights.size())
      fail(std::string(info.name) + ": wrong number of weights");
    Env env{ctx, act_};
    switch (ctx.op->kind) {
      case OpKind::kEmbedding:
        return embedding_forward(env, in, w);
      case OpKind::kPosEmbedding:
        return pos_embedding_forward(env, in, w);
      case OpKind::kRmsNorm:
        return rmsnorm_forward(env, in, w);
      case OpKind::kLayerNorm:
        return layernorm_forward(env, in, w);
      case OpKind::kAllGather:
        return all_gather_forward(env, in, w);
      case OpKind::kReduceScatter:
        return reduce_scatter_forward(env, in, w);
      case OpKind::kAllReduce:
        return all_reduce_forward(env, in, w);
      case OpKind::kColumnLinear:
        return column_linear_forward(env, in, w);
      case OpKind::kRowLinear:
        return row_linear_forward(env, in, w);
      case OpKind::kRope:
        return rope_forward(env, in, w);
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
      case OpKind::kGelu:
        return gelu_forward(env, in, w);
      case OpKind::kAdd:
        return add_forward(env, in, w);
      case OpKind::kRouter:
        return router_forward(env, in, w);
      case OpKind::kTopK:
        return topk_forward(env, in, w);
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
    if (a.weights.size() != ctx.op->weights.size() ||
        a.weight_grads.size() != ctx.op->weights.size())
      fail(std::string(info.name) + ": backward needs the weights and their gradients");
    Env env{ctx, act_};
    switch (ctx.op->kind) {
      case OpKind::kEmbedding:
        return embedding_backward(env, a);
      case OpKind::kPosEmbedding:
        return pos_embedding_backward(env, a);
      case OpKind::kRmsNorm:
        return rmsnorm_backward(env, a);
      case OpKind::kLayerNorm:
        return layernorm_backward(env, a);
      case OpKind::kAllGather:
        return all_gather_backward(env, a);
      case OpKind::kReduceScatter:
        return reduce_scatter_backward(env, a);
      case OpKind::kAllReduce:
        return all_reduce_backward(env, a);
      case OpKind::kColumnLinear:
        return column_linear_backward(env, a);
      case OpKind::kRowLinear:
        return row_linear_backward(env, a);
      case OpKind::kRope:
        return rope_backward(env, a);
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
      case OpKind::kGelu:
        return gelu_backward(env, a);
      case OpKind::kAdd:
        return add_backward(env, a);
      case OpKind::kRouter:
        return router_backward(env, a);
      case OpKind::kTopK:
        return topk_backward(env, a);
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
      case OpKind::kCount:
        break;
    }
    fail("backward: not an op kind");
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
