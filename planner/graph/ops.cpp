// The op table. Adding an OpKind without a row here fails the static_assert below.
#include "planner/graph/ops.hpp"

#include <iterator>

namespace np {

int64_t TensorType::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t WeightShape::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const char* name_of(Shard s) {
  constexpr const char* n[] = {"replicated",          "rows",          "section_rows", "columns",
                               "expert_section_rows", "expert_columns"};
  return n[static_cast<int>(s)];
}

Shard weight_shard(OpKind kind, std::string_view suffix) {
  bool bias = suffix == "bias";
  switch (kind) {
    case OpKind::kEmbedding:
      return Shard::kRows;
    case OpKind::kColumnLinear:
    case OpKind::kFp8ColumnLinear:
    case OpKind::kTeColumnLinear:
      return Shard::kSectionRows;
    case OpKind::kRowLinear:
    case OpKind::kFp8RowLinear:
    case OpKind::kTeRowLinear:
      return bias ? Shard::kReplicated : Shard::kColumns;
    case OpKind::kExpertColumn:
      return Shard::kExpertSectionRows;
    case OpKind::kExpertRow:
      return Shard::kExpertColumns;
    default:
      return Shard::kReplicated;
  }
}

int64_t grad_bytes(const TensorType& t) {
  return is_float8(t.dtype) ? t.elements() * dtype_bytes(Dtype::kBf16) : t.bytes();
}

int64_t checked_bytes(const TensorType& t) {
  int64_t n = dtype_bytes(t.dtype);
  for (int64_t d : t.shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  return n;
}

namespace {

using In = std::span<const TensorType>;
using Types = std::vector<TensorType>;
using Weights = std::vector<WeightShape>;

constexpr Dtype kAct = Dtype::kBf16;  // activations are stored in bf16

int64_t rows_of(const TensorType& t) {
  return t.shape.at(0);
}
int64_t cols_of(const TensorType& t) {
  return t.shape.at(1);
}

Types same(const OpAttrs&, In in) {
  return {in[0]};
}
Types none_types(const OpAttrs&, In) {
  return {};
}
// The dispatched tokens: experts x ep x capacity rows with a capacity factor, else tokens x top_k.
int64_t dispatched_rows(const OpAttrs& a, const TensorType& x) {
  return a.capacity > 0 ? a.experts * a.group * a.capacity : rows_of(x) * a.top_k;
}
Types dispatched(const OpAttrs& a, In in) {
  return {{{dispatched_rows(a, in[0]), cols_of(in[0])}, kAct}};
}
Types exchange_buffer(const OpAttrs& a, In in) {
  if (a.group == 1) return {};
  return {{{dispatched_rows(a, in[0]), cols_of(in[0])}, kAct}};
}
// The combine's: the expert outputs (its input 0) received back over ep > 1.
Types outputs_exchanged(const OpAttrs& a, In in) {
  return a.group > 1 ? Types{in[0]} : Types{};
}
double zero_flops(const OpAttrs&, In) {
  return 0;
}
double elementwise(const OpAttrs&, In in) {
  return static_cast<double>(in[0].elements());
}
double norm_flops(const OpAttrs&, In in) {
  return 5.0 * in[0].elements();
}
Weights no_weights(const OpAttrs&, In) {
  return {};
}

Weights linear_weights(const OpAttrs& a, In in) {
  Weights w{{"weight", {a.features, cols_of(in[0])}}};
  if (a.bias) w.push_back({"bias", {a.features}});
  return w;
}
Types linear_out(const OpAttrs& a, In in) {
  return {{{rows_of(in[0]), a.features}, kAct}};
}
double linear_flops(const OpAttrs& a, In in) {
  return 2.0 * rows_of(in[0]) * cols_of(in[0]) * a.features;
}

// dense_wgrad: the weight gradient whole in bf16, a backward workspace of the weight's shape.
Types dense_weight_grad(const OpAttrs& a, In in) {
  if (!a.dense_wgrad) return {};
  return {{{a.features, cols_of(in[0])}, kAct}};
}

Types attn_ctx(const OpAttrs& a, In in) {
  return {{{rows_of(in.back()), a.heads * a.v_dim()}, kAct}};
}
// One of attention's matmuls over all heads, of inner (scores) or output (context) width d.
double attn_matmul_of(const OpAttrs& a, int64_t d) {
  return 2.0 * a.batch * a.seq * a.seq * a.heads * d;
}
double attn_matmul(const OpAttrs& a, In) {
  return attn_matmul_of(a, a.head_dim);
}
// Flash attention: both matmuls, Q K^T over head_dim and P V over the values' head dim.
double flash_matmuls(const OpAttrs& a) {
  return attn_matmul_of(a, a.head_dim) + attn_matmul_of(a, a.v_dim());
}
TensorType scores_type(const OpAttrs& a) {
  return {{a.batch, a.heads, a.seq, a.seq}, kAct};
}

// The q/k norms': the q and k columns of [q | k | v] rows in `d`, one fp32 1/rms per row and
// head, 4 FLOPs per q and k element, a head_dim weight for the queries and one for the keys.
TensorType qk_columns(const OpAttrs& a, In in, Dtype d) {
  return {{rows_of(in[0]), (a.heads + a.kv_heads) * a.head_dim}, d};
}
TensorType qk_rstd(const OpAttrs& a, In in) {
  return {{rows_of(in[0]), a.heads + a.kv_heads}, Dtype::kFp32};
}
double qk_norm_flops(const OpAttrs& a, In in) {
  return 4.0 * static_cast<double>(qk_columns(a, in, Dtype::kFp32).elements());
}
Weights qk_norm_weights(const OpAttrs& a, In) {
  return {{"q_weight", {a.head_dim}}, {"k_weight", {a.head_dim}}};
}

// The RoPE of separate q and k (rope_qk, rope_half_qk): both rotated as they are, 3 FLOPs per
// element (a complex product per pair of features); their scratch is sized by the larger input.
Types both_inputs(const OpAttrs&, In in) {
  return {in[0], in[1]};
}
double rope_pair_flops(const OpAttrs&, In in) {
  return 3.0 * (in[0].elements() + in[1].elements());
}
const TensorType& larger_input(In in) {
  return in[0].elements() >= in[1].elements() ? in[0] : in[1];
}
Types two_of_larger(const OpAttrs&, In in) {
  return {larger_input(in), larger_input(in)};
}

// Transformer Engine's float8 (ops.hpp, kTeColumnLinear and kTeRowLinear). Forward operands are
// e4m3; gradients e5m2 (Megatron's --fp8-format hybrid; e4m3 throughout is the same bytes).
// A transposed copy is written [cols, rows] (Float8Tensor's _transpose).
//
// A norm with attrs.fp8 writes its output in float8 (TE's normalization with the input
// quantizer: delayed scaling fused into the kernel; current scaling (tensorwise) as
// FUSED_NORM_AMAX_FP8, the norm into a bf16 scratch with its amax, then cast, csrc/extensions/
// normalization.cpp). The float8 output and, without SP, its transpose are allocated before
// that scratch (create_tensor); the transpose is counted in the scratch here, as the column
// linear holds its own copy next.
TensorType norm_out(const OpAttrs& a, In in) {
  return {in[0].shape, a.fp8 != Fp8Recipe::kNone ? Dtype::kFp8E4m3 : in[0].dtype};
}
Types te_norm_scratch(const OpAttrs& a, In in) {
  if (a.fp8 != Fp8Recipe::kTensorwise) return {};
  Types t{{in[0].shape, kAct}};
  if (a.fp8_transpose) t.push_back({{cols_of(in[0]), rows_of(in[0])}, Dtype::kFp8E4m3});
  return t;
}
// The column linear's forward: the rowwise copy beside the transposed one (no all-gather).
Types te_column_forward(const OpAttrs& a, In in) {
  if (!a.fp8_transpose) return {};
  return {{in[0].shape, Dtype::kFp8E4m3}};
}
// Its backward: the output gradient cast with its transpose (grad_output_preprocess with both
// usages), the gathered input's transpose under SP (update_usage(columnwise_usage=True)).
Types te_column_backward(const OpAttrs& a, In in) {
  const int64_t r = rows_of(in[0]), k = cols_of(in[0]), n = a.features;
  Types t{{{r, n}, Dtype::kFp8E5m2}, {{n, r}, Dtype::kFp8E5m2}};
  if (!a.fp8_transpose) t.push_back({{k, r}, Dtype::kFp8E4m3});
  for (const TensorType& w : dense_weight_grad(a, in)) t.push_back(w);
  return t;
}
// The row linear's forward: the rowwise copy of its float8 input; under SP the GEMM's bf16
// partial product, reduce-scattered into output 0.
Types te_row_forward(const OpAttrs& a, In in) {
  Types t{{in[0].shape, Dtype::kFp8E4m3}};
  if (a.group > 1) t.push_back({{rows_of(in[0]), a.features}, kAct});
  return t;
}
// Its backward: under SP the gradient's shard cast rowwise, then the all-gather's output made
// with its transpose (_all_gather_fp8: make_empty with both usages, _create_transpose); else
// the gradient cast with its transpose. The float8 shard dies once gathered in TE; it is
// counted to the backward's end here (over by its bytes during the GEMMs: the safe side).
Types te_row_backward(const OpAttrs& a, In in) {
  const int64_t r = rows_of(in[0]), n = a.features;
  Types t;
  if (a.group > 1) t.push_back({{r / a.group, n}, Dtype::kFp8E5m2});
  t.push_back({{r, n}, Dtype::kFp8E5m2});
  t.push_back({{n, r}, Dtype::kFp8E5m2});
  for (const TensorType& w : dense_weight_grad(a, in)) t.push_back(w);
  return t;
}

// The vocab-parallel loss's per-token fp32 reductions: max, sum of exponentials, target logit.
Types vocab_reductions(const OpAttrs&, In in) {
  TensorType row{{rows_of(in[0])}, Dtype::kFp32};
  return {row, row, row};
}

const OpInfo kOps[] =
    {
        {OpKind::kEmbedding, "embedding", 1, 1, 0b1, 0, 0, 0b1, false,
         [](const OpAttrs& a, In in) -> Types {
           return {{{rows_of(in[0]), a.features}, kAct}};
         },
         zero_flops,
         [](const OpAttrs& a, In) -> Weights {
           return {{"weight", {a.rows, a.features}}};
         },
         [](const OpAttrs& a, In) -> Types {
           if (!a.dense_wgrad) return {};
           return {{{a.rows, a.features}, kAct}};
         }},
        {OpKind::kPosEmbedding, "pos_embedding", 1, 1, 0, 0, 0b1, 0b1, false, same, elementwise,
         [](const OpAttrs& a, In) -> Weights {
           return {{"weight", {a.rows, a.features}}};
         },
         none_types},
        {OpKind::kRmsNorm, "rmsnorm", 1, 1, 0b1, 0, 0b1, 0b1, false, same, norm_flops,
         [](const OpAttrs&, In in) -> Weights {
           return {{"weight", {cols_of(in[0])}}};
         },
         // Backward: each row's fp32 1/rms, so that the weight gradient is a deterministic
         // column sum over rows.
         [](const OpAttrs&, In in) -> Types {
           return {{{rows_of(in[0])}, Dtype::kFp32}};
         }},
        {OpKind::kLayerNorm, "layernorm", 1, 1, 0b1, 0, 0b1, 0b1, false, same, norm_flops,
         [](const OpAttrs&, In in) -> Weights {
           return {{"weight", {cols_of(in[0])}}, {"bias", {cols_of(in[0])}}};
         },
         // Backward: each row's fp32 mean and 1/std (the weight gradient as RMSNorm's).
         [](const OpAttrs&, In in) -> Types {
           TensorType row{{rows_of(in[0])}, Dtype::kFp32};
           return {row, row};
         }},
        {OpKind::kRmsNormStats, "rmsnorm_stats", 1, 2, 0b1, 0b10, 0b1, 0b01, false,
         [](const OpAttrs& a, In in) -> Types {
           return {norm_out(a, in), {{rows_of(in[0])}, Dtype::kFp32}};
         },
         norm_flops,
         [](const OpAttrs&, In in) -> Weights {
           return {{"weight", {cols_of(in[0])}}};
         },
         none_types, te_norm_scratch},
        {OpKind::kRmsNormHf, "rmsnorm_hf", 1, 4, 0, 0b1110, 0b1, 0b0001, false,
         [](const OpAttrs&, In in) -> Types {
           TensorType fp32{in[0].shape, Dtype::kFp32};
           return {in[0], fp32, {{rows_of(in[0])}, Dtype::kFp32}, in[0]};
         },
         norm_flops,
         [](const OpAttrs&, In in) -> Weights {
           return {{"weight", {cols_of(in[0])}}};
         },
         [](const OpAttrs&, In in) -> Types {
           TensorType fp32{in[0].shape, Dtype::kFp32};
           return {fp32, fp32};
         },
         [](const OpAttrs&, In in) -> Types {
           return {{in[0].shape, Dtype::kFp32}};
         }},
        {OpKind::kLayerNormStats, "layernorm_stats", 1, 3, 0b1, 0b110, 0b1, 0b001, false,
         [](const OpAttrs& a, In in) -> Types {
           TensorType row{{rows_of(in[0])}, Dtype::kFp32};
           return {norm_out(a, in), row, row};
         },
         norm_flops,
         [](const OpAttrs&, In in) -> Weights {
           return {{"weight", {cols_of(in[0])}}, {"bias", {cols_of(in[0])}}};
         },
         none_types, te_norm_scratch},
        {OpKind::kAllGather, "all_gather", 1, 1, 0, 0, 0b1, 0b1, true,
         [](const OpAttrs& a, In in) -> Types {
           return {{{rows_of(in[0]) * a.group, cols_of(in[0])}, in[0].dtype}};
         },
         zero_flops, no_weights, none_types},
        {OpKind::kReduceScatter, "reduce_scatter", 1, 1, 0, 0, 0b1, 0b1, true,
         [](const OpAttrs& a, In in) -> Types {
           return {{{rows_of(in[0]) / a.group, cols_of(in[0])}, in[0].dtype}};
         },
         elementwise, no_weights, none_types},
        {OpKind::kAllReduce, "all_reduce", 1, 1, 0, 0, 0b1, 0b1, true, same, elementwise,
         no_weights, none_types},
        {OpKind::kColumnLinear, "column_linear", 1, 1, 0b1, 0, 0b1, 0b1, false, linear_out,
         linear_flops, linear_weights, dense_weight_grad},
        {OpKind::kRowLinear, "row_linear", 1, 1, 0b1, 0, 0b1, 0b1, false, linear_out, linear_flops,
         linear_weights, dense_weight_grad},
        {OpKind::kRope, "rope", 1, 1, 0, 0, 0b1, 0b1, false, same, elementwise, no_weights,
         none_types},
        {OpKind::kFlashAttention, "flash_attention", 1, 2, 0b1, 0b11, 0b1, 0b01, false,
         [](const OpAttrs& a, In in) -> Types {
           return {attn_ctx(a, in)[0], {{a.batch, a.heads, a.seq}, Dtype::kFp32}};
         },
         [](const OpAttrs& a, In) { return flash_matmuls(a); }, no_weights,
         // FlashAttention-2 backward: fp32 dQ accumulator and the fp32 rowsum(dO * O).
         [](const OpAttrs& a, In in) -> Types {
           return {{{rows_of(in[0]), a.heads * a.head_dim}, Dtype::kFp32},
                   {{a.batch, a.heads, a.seq}, Dtype::kFp32}};
         }},
        {OpKind::kAttnScores, "attn_scores", 1, 1, 0b1, 0, 0b1, 0b1, false,
         [](const OpAttrs& a, In) -> Types { return {scores_type(a)}; }, attn_matmul, no_weights,
         none_types},
        {OpKind::kSoftmax, "softmax", 1, 1, 0, 0b1, 0b1, 0b1, false, same,
         [](const OpAttrs&, In in) { return 5.0 * in[0].elements(); }, no_weights, none_types},
        {OpKind::kSoftmaxFp32, "softmax_fp32", 1, 2, 0, 0b10, 0b1, 0b01, false,
         [](const OpAttrs&, In in) -> Types {
           return {in[0], {in[0].shape, Dtype::kFp32}};
         },
         [](const OpAttrs&, In in) { return 5.0 * in[0].elements(); }, no_weights,
         [](const OpAttrs&, In in) -> Types {
           return {{in[0].shape, Dtype::kFp32}};
         }},
        {OpKind::kRepeatKv, "repeat_kv", 1, 1, 0, 0, 0b1, 0b1, false,
         [](const OpAttrs& a, In in) -> Types {
           return {{{rows_of(in[0]), 3 * a.heads * a.head_dim}, in[0].dtype}};
         },
         zero_flops, no_weights, none_types},
        {OpKind::kAttnContext, "attn_context", 2, 1, 0b11, 0, 0b11, 0b1, false, attn_ctx,
         [](const OpAttrs& a, In) { return attn_matmul_of(a, a.v_dim()); }, no_weights,
         none_types},
        {OpKind::kDropout, "dropout", 1, 2, 0, 0b10, 0b1, 0b01, false,
         [](const OpAttrs&, In in) -> Types {
           return {in[0], {in[0].shape, Dtype::kU8}};
         },
         elementwise, no_weights, none_types},
        {OpKind::kSwiGlu, "swiglu", 1, 1, 0b1, 0, 0b1, 0b1, false,
         [](const OpAttrs&, In in) -> Types {
           return {{{rows_of(in[0]), cols_of(in[0]) / 2}, kAct}};
         },
         [](const OpAttrs&, In in) { return 4.0 * in[0].elements(); }, no_weights, none_types},
        {OpKind::kGluAct, "glu_act", 1, 1, 0b1, 0, 0b1, 0b1, false,
         [](const OpAttrs&, In in) -> Types {
           return {{{rows_of(in[0]), cols_of(in[0]) / 2}, kAct}};
         },
         [](const OpAttrs&, In in) { return 2.0 * in[0].elements(); }, no_weights, none_types},
        {OpKind::kGluMul, "glu_mul", 2, 1, 0b11, 0, 0b11, 0b1, false,
         [](const OpAttrs&, In in) -> Types { return {in[0]}; }, elementwise, no_weights,
         none_types},
        {OpKind::kGelu, "gelu", 1, 1, 0b1, 0, 0b1, 0b1, false, same,
         [](const OpAttrs&, In in) { return 8.0 * in[0].elements(); }, no_weights, none_types},
        {OpKind::kAdd, "add", 2, 1, 0, 0, 0b11, 0b1, false, same, elementwise, no_weights,
         none_types},
        {OpKind::kRouter, "router", 1, 1, 0b1, 0, 0b1, 0b1, false,
         [](const OpAttrs& a, In in) -> Types {
           return {{{rows_of(in[0]), a.features}, Dtype::kFp32}};
         },
         linear_flops, linear_weights, none_types},
        {OpKind::kTopK, "topk", 1, 2, 0, 0b11, 0b1, 0b01, false,
         [](const OpAttrs& a, In in) -> Types {
           return {{{rows_of(in[0]), a.top_k}, Dtype::kFp32},
                   {{rows_of(in[0]), a.top_k}, Dtype::kI64}};
         },
         elementwise, no_weights, none_types},
        // Under ep > 1 the all-to-all's other side is a workspace of the exchanged tensor's size:
        // the send buffer in forward, the received gradient in backward.
        {OpKind::kMoeDispatch, "moe_dispatch", 2, 1, 0b10, 0, 0b01, 0b1, true, dispatched,
         zero_flops, no_weights, exchange_buffer, exchange_buffer},
        {OpKind::kExpertColumn, "expert_column", 2, 1, 0b11, 0, 0b01, 0b1, false, linear_out,
         linear_flops,
         [](const OpAttrs& a,
            In in) -> Weights { return {{"weight", {a.experts, a.features, cols_of(in[0])}}}; },
         none_types},
        {OpKind::kExpertRow, "expert_row", 2, 1, 0b11, 0, 0b01, 0b1, false, linear_out,
         linear_flops,
         [](const OpAttrs& a,
            In in) -> Weights { return {{"weight", {a.experts, a.features, cols_of(in[0])}}}; },
         none_types},
        // Under ep > 1: the expert outputs received back from the experts' ranks (forward; backward
        // exchanges them again for the probability gradient, then sends the gradient from it).
        {OpKind::kMoeCombine, "moe_combine", 3, 1, 0b111, 0, 0b011, 0b1, true,
         [](const OpAttrs&, In in) -> Types {
           return {{{rows_of(in[1]), cols_of(in[0])}, kAct}};
         },
         [](const OpAttrs&, In in) { return 2.0 * in[0].elements(); }, no_weights,
         outputs_exchanged, outputs_exchanged},
        {OpKind::kSharedGate, "shared_gate", 2, 1, 0b11, 0, 0b11, 0b1, false,
         [](const OpAttrs&, In in) -> Types { return {in[1]}; },
         [](const OpAttrs&, In in) { return 3.0 * in[0].elements(); },
         [](const OpAttrs&, In in) -> Weights {
           return {{"weight", {1, cols_of(in[0])}}};
         },
         // Backward: each row's fp32 gate gradient, so that the weight gradient is a
         // deterministic column sum over rows.
         [](const OpAttrs&, In in) -> Types {
           return {{{rows_of(in[0])}, Dtype::kFp32}};
         }},
        {OpKind::kCrossEntropy, "cross_entropy", 2, 2, 0b10, 0b10, 0b01, 0, false,
         [](const OpAttrs&, In in) -> Types {
           return {{{rows_of(in[0])}, Dtype::kFp32}, {in[0].shape, Dtype::kFp32}};
         },
         [](const OpAttrs&, In in) { return 5.0 * in[0].elements(); }, no_weights,
         [](const OpAttrs& a, In in) -> Types {
           if (!a.fp32_grad) return {};
           return {{in[0].shape, Dtype::kFp32}};
         },
         // The fp32 copy of the logits (fp32_copy), then the vocab-parallel reductions: per-token
         // max, sum of exponentials and target logit (fp32).
         [](const OpAttrs& a, In in) -> Types {
           Types ws = vocab_reductions(a, in);
           if (a.fp32_copy) ws.insert(ws.begin(), {in[0].shape, Dtype::kFp32});
           return ws;
         }},
        {OpKind::kCpGatherKv, "cp_gather_kv", 1, 1, 0, 0, 0b1, 0b1, true,
         [](const OpAttrs& a, In in) -> Types {
           return {{{rows_of(in[0]) * a.group, 2 * a.kv_heads * a.head_dim}, in[0].dtype}};
         },
         zero_flops, no_weights, none_types},
        {OpKind::kFlashAttentionCp, "flash_attention_cp", 2, 2, 0b11, 0b11, 0b11, 0b01, false,
         [](const OpAttrs& a, In in) -> Types {
           return {{{rows_of(in[0]), a.heads * a.head_dim}, kAct},
                   {{a.batch, a.heads, a.seq / a.group}, Dtype::kFp32}};
         },
         // This rank's 1 / cp of the queries against every key: 1 / cp of the attention FLOPs
         // (the load-balanced chunks give every rank the same share of the causal triangle).
         [](const OpAttrs& a, In) { return flash_matmuls(a) / a.group; }, no_weights,
         // As flash attention's: the fp32 dQ accumulator and rowsum(dO * O) of the local queries.
         [](const OpAttrs& a, In in) -> Types {
           return {{{rows_of(in[0]), a.heads * a.head_dim}, Dtype::kFp32},
                   {{a.batch, a.heads, a.seq / a.group}, Dtype::kFp32}};
         }},
        {OpKind::kCastFp32, "cast_fp32", 1, 1, 0, 0, 0b1, 0b1, false,
         [](const OpAttrs&, In in) -> Types {
           return {{in[0].shape, Dtype::kFp32}};
         },
         elementwise, no_weights, none_types},
        {OpKind::kLogSoftmaxLoss, "log_softmax_loss", 3, 2, 0b010, 0b10, 0b001, 0, false,
         [](const OpAttrs&, In in) -> Types {
           return {{{rows_of(in[0])}, Dtype::kFp32}, {in[0].shape, Dtype::kFp32}};
         },
         [](const OpAttrs&, In in) { return 5.0 * in[0].elements(); }, no_weights,
         [](const OpAttrs&, In in) -> Types {
           return {{in[0].shape, Dtype::kFp32}};
         },
         vocab_reductions},
        {OpKind::kCrossEntropyTe, "cross_entropy_te", 2, 2, 0b11, 0b10, 0b01, 0, false,
         [](const OpAttrs&, In in) -> Types {
           return {{{rows_of(in[0])}, Dtype::kFp32}, {{rows_of(in[0]), 2}, Dtype::kFp32}};
         },
         [](const OpAttrs&, In in) { return 5.0 * in[0].elements(); }, no_weights, none_types,
         vocab_reductions},
        {OpKind::kQkNorm, "qk_norm", 1, 2, 0b1, 0b10, 0b1, 0b01, false,
         [](const OpAttrs& a, In in) -> Types { return {in[0], qk_rstd(a, in)}; }, qk_norm_flops,
         qk_norm_weights, none_types},
        {OpKind::kQkNormHf, "qk_norm_hf", 1, 4, 0, 0b1110, 0b1, 0b0001, false,
         [](const OpAttrs& a, In in) -> Types {  // y, fp32 copy, 1/rms, the normalized heads
           return {in[0], qk_columns(a, in, Dtype::kFp32), qk_rstd(a, in),
                   qk_columns(a, in, in[0].dtype)};
         },
         qk_norm_flops, qk_norm_weights,
         [](const OpAttrs& a, In in) -> Types {  // db and da
           return {qk_columns(a, in, Dtype::kFp32), qk_columns(a, in, Dtype::kFp32)};
         },
         [](const OpAttrs& a, In in) -> Types {  // b = a x r
           return {qk_columns(a, in, Dtype::kFp32)};
         }},
        {OpKind::kLinear, "linear", 1, 1, 0b1, 0, 0b1, 0b1, false, linear_out, linear_flops,
         linear_weights, dense_weight_grad},
        {OpKind::kMlaRope, "mla_rope", 3, 1, 0, 0, 0b111, 0b1, false,
         [](const OpAttrs& a, In in) -> Types {
           return {{{rows_of(in[0]), a.heads * (2 * a.head_dim + a.v_dim())}, kAct}};
         },
         elementwise, no_weights, none_types},
        {OpKind::kRouteScores, "route_scores", 1, 1, 0, 0b1, 0b1, 0b1, false, same,
         [](const OpAttrs&, In in) { return 4.0 * in[0].elements(); }, no_weights, none_types},
        {OpKind::kRouteTopK, "route_topk", 1, 2, 0b1, 0b10, 0b1, 0b01, false,
         [](const OpAttrs& a, In in) -> Types {
           return {{{rows_of(in[0]), a.top_k}, Dtype::kFp32},
                   {{rows_of(in[0]), a.top_k}, Dtype::kI64}};
         },
         elementwise, no_weights, none_types,
         // Megatron-LM d98e8a6, moe_utils.py: scores_for_routing = scores + expert_bias; and
         // group_limited_topk's fp32 group mask expanded to [tokens, experts] (reshape copies
         // it) and the masked scores (transformers' DeepseekV3 allocates the same three).
         [](const OpAttrs& a, In in) -> Types {
           Types t;
           if (a.bias) t.push_back(in[0]);
           if (a.router.groups > 1) t.insert(t.end(), {in[0], in[0]});
           return t;
         }},
        {OpKind::kConcat, "concat", 2, 1, 0, 0, 0b11, 0b1, false,
         [](const OpAttrs&, In in) -> Types {
           return {{{rows_of(in[0]), cols_of(in[0]) + cols_of(in[1])}, in[0].dtype}};
         },
         zero_flops, no_weights, none_types},
        {OpKind::kGatherFeatures, "gather_features", 1, 1, 0, 0, 0b1, 0b1, true,
         [](const OpAttrs& a, In in) -> Types {
           return {{{rows_of(in[0]), cols_of(in[0]) * a.group}, in[0].dtype}};
         },
         zero_flops, no_weights, none_types,
         [](const OpAttrs& a, In in) -> Types {  // the all-gather's [group x rows] buffer
           return {{{rows_of(in[0]) * a.group, cols_of(in[0])}, in[0].dtype}};
         }},
        {OpKind::kScatterRows, "scatter_rows", 1, 1, 0, 0, 0b1, 0b1, false,
         [](const OpAttrs& a, In in) -> Types {
           return {{{rows_of(in[0]) / a.group, cols_of(in[0])}, in[0].dtype}};
         },
         zero_flops, no_weights, none_types},
        {OpKind::kRopeQk, "rope_qk", 2, 2, 0, 0, 0b11, 0b11, false, both_inputs,
         rope_pair_flops, no_weights,
         [](const OpAttrs&, In in) -> Types {
           TensorType fp32{larger_input(in).shape, Dtype::kFp32};
           return {fp32, fp32};
         },
         [](const OpAttrs&, In in) -> Types {
           TensorType q{in[0].shape, Dtype::kFp32}, k{in[1].shape, Dtype::kFp32};
           return {q, k, q, k};  // xq_ and xk_, then the two products
         }},
        {OpKind::kSdpa, "sdpa_flash", 3, 2, 0b111, 0b11, 0b111, 0b01, false,
         [](const OpAttrs& a, In in) -> Types {
           return {{{rows_of(in[0]), a.heads * a.v_dim()}, kAct},
                   {{a.batch, a.heads, a.seq}, Dtype::kFp32}};
         },
         [](const OpAttrs& a, In) { return flash_matmuls(a); }, no_weights,
         [](const OpAttrs& a, In in) -> Types {
           Types t{{{rows_of(in[0]), a.heads * a.head_dim}, Dtype::kFp32},
                   {{a.batch, a.heads, a.seq}, Dtype::kFp32}};
           if (a.kv_heads < a.heads) {
             t.push_back({{rows_of(in[0]), a.heads * a.head_dim}, kAct});
             t.push_back({{rows_of(in[0]), a.heads * a.v_dim()}, kAct});
           }
           return t;
         }},
        {OpKind::kSilu, "silu", 1, 1, 0b1, 0, 0b1, 0b1, false, same,
         [](const OpAttrs&, In in) { return 4.0 * in[0].elements(); }, no_weights, none_types},
        {OpKind::kMul, "mul", 2, 1, 0b11, 0, 0b11, 0b1, false, same, elementwise, no_weights,
         none_types},
        {OpKind::kHeadRmsNorm, "head_rmsnorm", 1, 2, 0b1, 0b10, 0b1, 0b01, false,
         [](const OpAttrs& a, In in) -> Types {
           return {in[0], {{rows_of(in[0]), a.heads}, Dtype::kFp32}};
         },
         norm_flops,
         [](const OpAttrs& a, In) -> Weights {
           return {{"weight", {a.head_dim}}};
         },
         none_types},
        {OpKind::kRopeHalfQk, "rope_half_qk", 2, 2, 0, 0, 0b11, 0b11, false, both_inputs,
         rope_pair_flops, no_weights, two_of_larger, two_of_larger},
        {OpKind::kFp8AllGather, "fp8_all_gather", 1, 2, 0, 0, 0b1, 0b01, true,
         [](const OpAttrs& a, In in) -> Types {
           return {{{rows_of(in[0]) * a.group, cols_of(in[0])}, Dtype::kFp8E4m3},
                   {{}, Dtype::kFp32}};
         },
         zero_flops, no_weights, none_types},
        {OpKind::kFp8ColumnLinear, "fp8_column_linear", 2, 1, 0b11, 0, 0b01, 0b1, false,
         linear_out, linear_flops, linear_weights, none_types},
        {OpKind::kFp8RowLinear, "fp8_row_linear", 1, 3, 0, 0b110, 0b1, 0b001, true,
         [](const OpAttrs& a, In in) -> Types {
           return {{{rows_of(in[0]) / a.group, a.features}, kAct},
                   {{rows_of(in[0]), cols_of(in[0])}, Dtype::kFp8E4m3},
                   {{}, Dtype::kFp32}};
         },
         linear_flops, linear_weights, none_types},
        {OpKind::kTeColumnLinear, "te_column_linear", 1, 1, 0b1, 0, 0b1, 0b1, false, linear_out,
         linear_flops, linear_weights, te_column_backward, te_column_forward},
        {OpKind::kTeRowLinear, "te_row_linear", 1, 2, 0, 0b10, 0b1, 0b01, true,
         [](const OpAttrs& a, In in) -> Types {
           return {{{rows_of(in[0]) / a.group, a.features}, kAct},
                   {{cols_of(in[0]), rows_of(in[0])}, Dtype::kFp8E4m3}};
         },
         linear_flops, linear_weights, te_row_backward, te_row_forward},
};
static_assert(sizeof(kOps) / sizeof(kOps[0]) == static_cast<size_t>(OpKind::kCount),
              "every OpKind needs exactly one row in the op table");

}  // namespace

const OpInfo& op_info(OpKind kind) {
  return kOps[static_cast<int>(kind)];
}
bool is_norm(OpKind kind) {
  return kind == OpKind::kRmsNorm || kind == OpKind::kLayerNorm || kind == OpKind::kRmsNormStats ||
         kind == OpKind::kLayerNormStats || kind == OpKind::kRmsNormHf || kind == OpKind::kQkNorm ||
         kind == OpKind::kQkNormHf || kind == OpKind::kHeadRmsNorm;
}
bool is_loss(OpKind kind) {
  return kind == OpKind::kCrossEntropy || kind == OpKind::kLogSoftmaxLoss ||
         kind == OpKind::kCrossEntropyTe;
}
const char* name_of(OpKind kind) {
  return op_info(kind).name;
}

std::vector<TensorType> forward_workspace(const OpInfo& info, const OpAttrs& attrs,
                                          std::span<const TensorType> in) {
  return info.fwd_workspace ? info.fwd_workspace(attrs, in) : std::vector<TensorType>{};
}

double backward_flops(const OpInfo& info, const OpAttrs& attrs, std::span<const TensorType> in) {
  double f = info.flops(attrs, in);
  bool matmul = info.kind == OpKind::kFlashAttention || info.kind == OpKind::kAttnScores ||
                info.kind == OpKind::kAttnContext || info.kind == OpKind::kFlashAttentionCp ||
                info.kind == OpKind::kSdpa;
  return matmul || !info.weights(attrs, in).empty() ? 2.0 * f : f;
}

}  // namespace np
