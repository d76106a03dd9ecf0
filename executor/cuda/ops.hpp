// The CUDA backend's ops (ops.cu): the forward and backward of each OpKind on the kernels of
// kernels.hpp, with the CPU reference's allocation contract (outputs in op-table order, then the op
// table's workspaces; an input gradient accumulated when BackwardArgs holds one, else allocated as
// AllocRole::kGradInput). cuda_backend.cu dispatches every OpKind to them.
#pragma once
#include <span>
#include <vector>

#include "executor/backend.hpp"
#include "executor/cuda/kernels.hpp"

namespace np::cuda {

// What an op's forward works with: its context, and the rank's cuBLAS handle and stream.
struct Fwd {
  const exec::OpContext& c;
  cublasHandle_t blas;
  cudaStream_t stream;
  const OpAttrs& attrs() const { return c.op->attrs; }
  Tensor out(const TensorType& t) const { return c.alloc(t, exec::AllocRole::kOutput); }
  Tensor ws(const TensorType& t) const { return c.alloc(t, exec::AllocRole::kWorkspace); }
  // A workspace the per-op checkpointing's cache may hold (OpContext::kept).
  Tensor kept(const TensorType& t) const { return c.kept ? c.kept(t) : ws(t); }
};

// The backward's: the same, and its arguments.
struct Bwd : Fwd {
  const exec::BackwardArgs& a;
  // The gradient of input k: the one already there (acc set) or a new one of type t.
  Tensor& grad(int k, const TensorType& t, bool& acc) const;
  // An input gradient that equals a tensor already held (collectives, add): copied or added.
  void pass(int k, const Tensor& g) const;
};

// Throws "cuda backend: <op name> (<kind>): <why>".
[[noreturn]] void unsupported(const exec::OpContext& c, const char* why);

using Ins = std::span<const Tensor>;
using Outs = std::vector<Tensor>;

// Forward: returns the op's outputs, then its forward workspaces. One function serves both
// linears, SwiGLU and the unfused GLU's activation, and both expert GEMMs.
Outs embedding_fwd(const Fwd& e, Ins in, Ins w);
Outs pos_embedding_fwd(const Fwd& e, Ins in, Ins w);
Outs rmsnorm_fwd(const Fwd& e, Ins in, Ins w);
Outs rmsnorm_stats_fwd(const Fwd& e, Ins in, Ins w);
Outs layernorm_fwd(const Fwd& e, Ins in, Ins w);
Outs layernorm_stats_fwd(const Fwd& e, Ins in, Ins w);
Outs rmsnorm_hf_fwd(const Fwd& e, Ins in, Ins w);
Outs repeat_kv_fwd(const Fwd& e, Ins in, Ins w);
Outs softmax_fp32_fwd(const Fwd& e, Ins in, Ins w);
Outs all_gather_fwd(const Fwd& e, Ins in, Ins w);
Outs reduce_scatter_fwd(const Fwd& e, Ins in, Ins w);
Outs all_reduce_fwd(const Fwd& e, Ins in, Ins w);
Outs concat_fwd(const Fwd& e, Ins in, Ins w);
Outs gather_features_fwd(const Fwd& e, Ins in, Ins w);
Outs scatter_rows_fwd(const Fwd& e, Ins in, Ins w);
Outs linear_fwd(const Fwd& e, Ins in, Ins w);
Outs rope_fwd(const Fwd& e, Ins in, Ins w);
Outs mla_rope_fwd(const Fwd& e, Ins in, Ins w);
Outs qk_norm_fwd(const Fwd& e, Ins in, Ins w);
Outs qk_norm_hf_fwd(const Fwd& e, Ins in, Ins w);
Outs flash_attention_fwd(const Fwd& e, Ins in, Ins w);
Outs attn_scores_fwd(const Fwd& e, Ins in, Ins w);
Outs attn_context_fwd(const Fwd& e, Ins in, Ins w);
Outs softmax_fwd(const Fwd& e, Ins in, Ins w);
Outs dropout_fwd(const Fwd& e, Ins in, Ins w);
Outs glu_fwd(const Fwd& e, Ins in, Ins w);
Outs glu_mul_fwd(const Fwd& e, Ins in, Ins w);
Outs gelu_fwd(const Fwd& e, Ins in, Ins w);
Outs add_fwd(const Fwd& e, Ins in, Ins w);
Outs router_fwd(const Fwd& e, Ins in, Ins w);
Outs topk_fwd(const Fwd& e, Ins in, Ins w);
Outs route_scores_fwd(const Fwd& e, Ins in, Ins w);
Outs route_topk_fwd(const Fwd& e, Ins in, Ins w);
Outs moe_dispatch_fwd(const Fwd& e, Ins in, Ins w);
Outs expert_fwd(const Fwd& e, Ins in, Ins w);
Outs moe_combine_fwd(const Fwd& e, Ins in, Ins w);
Outs shared_gate_fwd(const Fwd& e, Ins in, Ins w);
Outs cast_fp32_fwd(const Fwd& e, Ins in, Ins w);
Outs cross_entropy_fwd(const Fwd& e, Ins in, Ins w);
Outs log_softmax_loss_fwd(const Fwd& e, Ins in, Ins w);
Outs cross_entropy_te_fwd(const Fwd& e, Ins in, Ins w);
Outs silu_fwd(const Fwd& e, Ins in, Ins w);
Outs sdpa_fwd(const Fwd& e, Ins in, Ins w);
Outs float8_linear_fwd(const Fwd& e, Ins in, Ins w);  // float8.cu: torchao's Float8Linear
Outs fp8_all_gather_fwd(const Fwd& e, Ins in, Ins w);  // ... and torchao's float8 TP
Outs fp8_column_linear_fwd(const Fwd& e, Ins in, Ins w);
Outs fp8_row_linear_fwd(const Fwd& e, Ins in, Ins w);
Outs mul_fwd(const Fwd& e, Ins in, Ins w);
Outs head_rmsnorm_fwd(const Fwd& e, Ins in, Ins w);
Outs rope_qk_fwd(const Fwd& e, Ins in, Ins w);
Outs rope_half_qk_fwd(const Fwd& e, Ins in, Ins w);

// Backward: as forward, and one function serves each pair of norms (statistics kept or
// recomputed), the all-gather and the reduce-scatter, the cross-entropy and the log-softmax loss.
void embedding_bwd(const Bwd& e);
void pos_embedding_bwd(const Bwd& e);
void rmsnorm_bwd(const Bwd& e);
void rmsnorm_hf_bwd(const Bwd& e);
void repeat_kv_bwd(const Bwd& e);
void softmax_fp32_bwd(const Bwd& e);
void layernorm_bwd(const Bwd& e);
void gather_scatter_bwd(const Bwd& e);
void all_reduce_bwd(const Bwd& e);
void concat_bwd(const Bwd& e);
void gather_features_bwd(const Bwd& e);
void scatter_rows_bwd(const Bwd& e);
void linear_bwd(const Bwd& e);
void rope_bwd(const Bwd& e);
void mla_rope_bwd(const Bwd& e);
void qk_norm_bwd(const Bwd& e);
void qk_norm_hf_bwd(const Bwd& e);
void flash_attention_bwd(const Bwd& e);
void attn_scores_bwd(const Bwd& e);
void attn_context_bwd(const Bwd& e);
void softmax_bwd(const Bwd& e);
void dropout_bwd(const Bwd& e);
void glu_bwd(const Bwd& e);
void glu_mul_bwd(const Bwd& e);
void gelu_bwd(const Bwd& e);
void add_bwd(const Bwd& e);
void router_bwd(const Bwd& e);
void topk_bwd(const Bwd& e);
void route_scores_bwd(const Bwd& e);
void route_topk_bwd(const Bwd& e);
void moe_dispatch_bwd(const Bwd& e);
void expert_bwd(const Bwd& e);
void moe_combine_bwd(const Bwd& e);
void shared_gate_bwd(const Bwd& e);
void cast_fp32_bwd(const Bwd& e);
void cross_entropy_te_bwd(const Bwd& e);
void silu_bwd(const Bwd& e);
void sdpa_bwd(const Bwd& e);
void float8_linear_bwd(const Bwd& e);
void fp8_column_linear_bwd(const Bwd& e);
void fp8_row_linear_bwd(const Bwd& e);
// te_fp8.cu: Transformer Engine's float8 linears (te_fp8), the float8 output of a norm with
// OpAttrs::fp8 (b: LayerNorm's bias, null for RMSNorm; stats gets mean and rstd, or rstd), and
// the scale a float8 all-gather passes on.
Outs te_column_linear_fwd(const Fwd& e, Ins in, Ins w);
void te_column_linear_bwd(const Bwd& e);
Outs te_row_linear_fwd(const Fwd& e, Ins in, Ins w);
void te_row_linear_bwd(const Bwd& e);
Tensor te_norm_fwd(const Fwd& e, const Tensor& x, const Tensor& w, const Tensor* b,
                   std::vector<Tensor>& stats);
void te_gathered(const Fwd& e, const Tensor& from, const Tensor& to);
void mul_bwd(const Bwd& e);
void head_rmsnorm_bwd(const Bwd& e);
void rope_qk_bwd(const Bwd& e);
void rope_half_qk_bwd(const Bwd& e);
void cross_entropy_bwd(const Bwd& e);

}  // namespace np::cuda
