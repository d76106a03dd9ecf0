// torchao's Float8Linear as the steps of its eager code (ops.hpp, OpStep), read from pytorch/ao
// 36027d8: torchao/float8/float8_linear.py (matmul_with_hp_or_float8_args), float8_scaling_utils.py
// (hp_tensor_to_float8_dynamic), float8_utils.py (tensor_to_amax, amax_to_scale,
// to_fp8_saturated, _round_scale_down_to_power_of_2), float8_training_tensor.py
// (_ToFloat8ConstrFunc) and float8_ops.py (preprocess_addmm, addmm_float8_unwrapped).
//
// Forward of y = x W^T, x [R, K], W [N, K]: autograd keeps the bf16 input and the weight, as a bf16
// linear does; x is cast to e4m3, then W^T (a view: its cast keeps W's layout, so _scaled_mm takes
// it without a copy), then _scaled_mm makes y from the reciprocal scales. The float8 tensors are
// the function's locals and die with it. Backward: the output gradient is cast (tensorwise: e5m2),
// then the weight again; the input gradient's _scaled_mm needs W's float8 copy transposed
// (b.t().contiguous().t()); then the output gradient and the input are cast once more, each
// copied to the layouts _scaled_mm needs, for the weight gradient. Every float8 tensor of the
// backward is a local that lives to its end.
//
// Rowwise: the scales are [R, 1] or [1, N] (an axis per role), and the two backward GEMMs run
// without fast accumulation, so addmm_float8_unwrapped forms their fp32 outer product of the
// reciprocal scales ([R, K] and [N, K]), runs the tensorwise kernel with two 0-dim ones and
// multiplies the bf16 result by it in place.
//
// Under FSDP's float8 all-gather (OpAttrs::fp8_gathered, tensorwise) the weight arrives as a
// Float8TrainingTensor: neither pass casts it (tensor_already_casted_to_fp8), and the backward's
// transposed copy is made from it.
//
// Under plain TP (the LM head; every linear under the rowwise recipes at tp > 1) the operands are
// DTensor shards, and a cast's max over a split dimension is all-reduced (fp8_max_over_tp): a
// column linear's output gradient per row and weight per input feature, a row linear's input
// and weight per row; the rest are the rank's own.
//
// Not counted: the 0-dim fp64 and fp32 temporaries of the scale computation, which die inside
// amax_to_scale (a few hundred bytes, or 8 bytes per row under rowwise), the copy of the max
// that a reduction across TP makes (as many elements), and the cuBLASLt workspace, which is
// PyTorch's cuBLAS workspace (a runtime term).
#include "planner/graph/ops.hpp"

#include <algorithm>

namespace np {
namespace {

struct Steps {
  std::vector<OpStep> s;
  int next = 0;  // temporaries so far

  int temp(const TensorType& t) {
    s.back().temps.push_back(t);
    return next++;
  }
  void step(std::vector<int> reads = {}, unsigned results = 0) {
    s.push_back({{}, std::move(reads), results});
  }
  // One hp_tensor_to_float8_dynamic of a [rows, cols] bf16 tensor: |x| and its max (the max over
  // the scale's axis); the fp32 scale (float8 max / amax); the fp32 copy and its product by the
  // scale; the clamp to +-max and the float8 result. Returns the float8 tensor's and the scale's
  // temporaries; where the op keeps or passes them on, they are its outputs `q_out` and
  // `scale_out` (OpStep::outputs) instead, and -1 is returned for them.
  // `tp_max`: the max is taken across TP (fp8_max_over_tp), by the step making the scale.
  std::pair<int, int> cast(int64_t rows, int64_t cols, Dtype to, std::vector<int64_t> scale,
                           bool tp_max, int scale_out = -1, int q_out = -1) {
    step();
    temp({{rows, cols}, Dtype::kBf16});  // abs: dies here
    int amax = temp({scale, Dtype::kBf16});
    const int64_t amax_bytes = s.back().temps.back().bytes();
    // Tensorwise (a 0-dim scale) takes torch.max, aten.max, which torchtitan's per-op policy keeps;
    // rowwise takes torch.amax, aten.amax, which it does not.
    if (scale.empty()) s.back().sac_kept.push_back(amax);
    step({amax});
    if (tp_max) s.back().tp_max_bytes = amax_bytes;
    int sc = -1;
    if (scale_out >= 0)
      s.back().outputs.push_back(scale_out);
    else
      sc = temp({scale, Dtype::kFp32});
    // The product reads the scale (a recompute of the casts alone ends with them).
    step(sc >= 0 ? std::vector<int>{sc} : std::vector<int>{});
    temp({{rows, cols}, Dtype::kFp32});  // tensor.to(float32): dies after the product
    int scaled = temp({{rows, cols}, Dtype::kFp32});
    step({scaled});
    temp({{rows, cols}, Dtype::kFp32});  // the clamp
    if (q_out >= 0) {
      s.back().outputs.push_back(q_out);
      return {-1, sc};
    }
    return {temp({{rows, cols}, to}), sc};
  }
  // The float8 TP linears' W^T [K, N]: cast (its max across TP) unless FSDP's float8 all-gather
  // brought it (`gathered`); its float8 tensor and scale, or none.
  std::vector<int> tp_weight(bool gathered, int64_t K, int64_t N) {
    if (gathered) return {};
    auto [w8, ws] = cast(K, N, Dtype::kFp8E4m3, {}, true);
    return {w8, ws};
  }
  // The float8 TP linears' backward GEMMs, reading the float8 gradient, its scale and the
  // weight's (`reads`): the input gradient's (W8 copied transposed), the weight gradient's (g8^T
  // made row-major, x8 column-major).
  void tp_backward_gemms(const std::vector<int>& reads, int64_t R, int64_t K, int64_t N) {
    gemm(reads, {{{N, K}, Dtype::kFp8E4m3}}, kStepResults);
    gemm(reads, {{{N, R}, Dtype::kFp8E5m2}, {{R, K}, Dtype::kFp8E4m3}}, kStepWeightGrads);
  }
  // _scaled_mm of two tensorwise float8 operands (tensorwise: no post-scale): the operands'
  // layout copies, the two 0-dim reciprocal scales, then the result.
  void gemm(std::vector<int> reads, std::vector<TensorType> copies, unsigned results) {
    step(std::move(reads), results);
    for (const TensorType& c : copies) temp(c);
    temp({{}, Dtype::kFp32});
    temp({{}, Dtype::kFp32});
  }
};

// torchao's float8 tensor parallelism (tensorwise; ops.hpp, kFp8AllGather, kFp8ColumnLinear,
// kFp8RowLinear). Every max of a TP-sharded tensor is all-reduced over TP (DTensor's partial
// max, redistributed inside amax_to_scale among its uncounted 0-dim temporaries).
//
// PrepareFloat8ModuleInput on the sequence shard [R, K]: the cast, its scale output 1, then the
// all-gather of the float8 shard into output 0.
std::vector<OpStep> fp8_gather_steps(int64_t R, int64_t K) {
  Steps s;
  int q = s.cast(R, K, Dtype::kFp8E4m3, {}, true, 1).first;
  s.step({q}, kStepResults);
  return std::move(s.s);
}

// Float8ColwiseParallel's linear, x8 [R, K] given with its scale, W [N, K]. Forward: W^T cast,
// then _scaled_mm. Backward: the output gradient cast to e5m2 (NoopFwToFloat8BwDynamic; the bf16
// gradient dropped after it), W^T cast again, the input gradient's GEMM (W8 copied transposed),
// the weight gradient's (g8^T made row-major, x8 column-major); no other cast, as every operand
// is float8 already (tensor_already_casted_to_fp8). Under FSDP's float8 all-gather (`gathered`)
// the weight arrives in float8 with its scale: neither pass casts it.
std::vector<OpStep> fp8_column_steps(bool forward, bool gathered, int64_t R, int64_t K, int64_t N) {
  Steps s;
  if (forward) {
    s.gemm(s.tp_weight(gathered, K, N), {}, kStepResults);
    return std::move(s.s);
  }
  auto [g8, gs] = s.cast(R, N, Dtype::kFp8E5m2, {}, true);
  const size_t dropped = s.s.size();  // the step after the gradient's cast
  std::vector<int> reads = {g8, gs}, w = s.tp_weight(gathered, K, N);
  reads.insert(reads.end(), w.begin(), w.end());
  s.tp_backward_gemms(reads, R, K, N);
  s.s[dropped].drops_grad_outputs = true;
  return std::move(s.s);
}

// Float8RowwiseParallel's linear and its reduce-scatter, x [R, K] (this rank's input features),
// W [N, K]. Forward: x cast into outputs 1 and 2 (the linear saves the float8 input), W^T cast,
// _scaled_mm into the bf16 partial product, reduce-scattered into output 0 [R / group, N].
// Backward: output 0's gradient cast to e5m2 on the sequence shard, all-gathered as float8 (the
// bf16 gradient and the float8 shard dropped after), then as the column linear's. A gathered
// weight (FSDP's float8 all-gather) is cast in neither pass.
std::vector<OpStep> fp8_row_steps(bool forward, bool gathered, int64_t R, int64_t K, int64_t N,
                                  int64_t group) {
  Steps s;
  if (forward) {
    s.cast(R, K, Dtype::kFp8E4m3, {}, true, 2, 1);
    s.gemm(s.tp_weight(gathered, K, N), {}, 0);
    int partial = s.temp({{R, N}, Dtype::kBf16});
    s.step({partial}, kStepResults);
    return std::move(s.s);
  }
  auto [shard, gs] = s.cast(R / group, N, Dtype::kFp8E5m2, {}, true);
  s.step({shard, gs});
  s.s.back().drops_grad_outputs = true;
  int g8 = s.temp({{R, N}, Dtype::kFp8E5m2});
  std::vector<int> reads = {g8, gs}, w = s.tp_weight(gathered, K, N);
  reads.insert(reads.end(), w.begin(), w.end());
  s.tp_backward_gemms(reads, R, K, N);
  return std::move(s.s);
}

std::vector<OpStep> forward_steps(OpKind kind, int64_t tp, Fp8Recipe r, bool gathered, int64_t R,
                                  int64_t K, int64_t N) {
  const bool row = r != Fp8Recipe::kTensorwise;  // rowwise_with_gw_hp's forward is rowwise's
  const Fp8ScaleAxis per_row = row ? Fp8ScaleAxis::kRows : Fp8ScaleAxis::kTensor;
  Steps s;
  auto shape = [row](int64_t a, int64_t b) {
    return row ? std::vector<int64_t>{a, b} : std::vector<int64_t>{};
  };
  auto [x8, xs] = s.cast(R, K, Dtype::kFp8E4m3, shape(R, 1),
                         fp8_max_over_tp(kind, tp, Fp8Operand::kInput, per_row));
  std::vector<int> reads = {x8, xs};
  if (!gathered) {  // a gathered weight is float8 already (tensor_already_casted_to_fp8)
    // W^T per output feature: W's rows.
    auto [w8, ws] = s.cast(K, N, Dtype::kFp8E4m3, shape(1, N),
                           fp8_max_over_tp(kind, tp, Fp8Operand::kWeight, per_row));
    reads.insert(reads.end(), {w8, ws});
  }
  // The reciprocal scales _scaled_mm takes, then its output (fast accumulation: no post-scaling).
  s.step(reads, kStepResults);
  s.temp({shape(R, 1), Dtype::kFp32});
  s.temp({shape(1, N), Dtype::kFp32});
  return std::move(s.s);
}

std::vector<OpStep> backward_steps(OpKind kind, int64_t tp, Fp8Recipe r, bool gathered, int64_t R,
                                   int64_t K, int64_t N) {
  const bool row = r != Fp8Recipe::kTensorwise, hp = r == Fp8Recipe::kRowwiseGwHp;
  const Dtype grad = row ? Dtype::kFp8E4m3 : Dtype::kFp8E5m2;
  auto shape = [row](int64_t a, int64_t b) {
    return row ? std::vector<int64_t>{a, b} : std::vector<int64_t>{};
  };
  auto across = [&](Fp8Operand operand, Fp8ScaleAxis axis) {
    return fp8_max_over_tp(kind, tp, operand, row ? axis : Fp8ScaleAxis::kTensor);
  };
  Steps s;
  // grad_input = g8 @ W8: the output gradient per row, the weight per input feature (W's columns).
  auto [g8, gs] =
      s.cast(R, N, grad, shape(R, 1), across(Fp8Operand::kGradOutput, Fp8ScaleAxis::kRows));
  std::vector<int> keep = {g8, gs};  // the backward's locals
  if (!gathered) {  // rowwise_with_gw_hp: one scale (cast_config_weight_for_grad_input)
    auto [w8, ws] = s.cast(K, N, Dtype::kFp8E4m3, hp ? std::vector<int64_t>{} : shape(K, 1),
                           across(Fp8Operand::kWeight,
                                  hp ? Fp8ScaleAxis::kTensor : Fp8ScaleAxis::kCols));
    keep.insert(keep.end(), {w8, ws});
  }
  // A GEMM of _scaled_mm: the operand copies, the reciprocal scales; under rowwise their fp32
  // outer product, then (the reciprocals dropped) two 0-dim ones for the tensorwise kernel.
  // rowwise_with_gw_hp's input-gradient GEMM first repeats the weight's one scale along K
  // (preprocess_addmm: b_scale.repeat, so _scaled_mm takes two axiswise scales).
  auto gemm = [&](std::vector<TensorType> copies, std::vector<int> reads, std::vector<int64_t> a,
                  std::vector<int64_t> b, int64_t rows, int64_t cols, unsigned results,
                  int64_t repeated = 0) {
    std::vector<int> all = keep;
    all.insert(all.end(), reads.begin(), reads.end());
    s.step(all, row ? 0u : results);
    std::vector<int> held;
    for (const TensorType& c : copies) held.push_back(s.temp(c));
    if (repeated > 0) s.temp({{repeated}, Dtype::kFp32});
    s.temp({std::move(a), Dtype::kFp32});
    s.temp({std::move(b), Dtype::kFp32});
    if (!row) return;
    int post = s.temp({{rows, cols}, Dtype::kFp32});
    held.push_back(post);
    held.insert(held.end(), keep.begin(), keep.end());
    s.step(held, results);
    s.temp({{}, Dtype::kFp32});
    s.temp({{}, Dtype::kFp32});
  };
  gemm({{{N, K}, Dtype::kFp8E4m3}}, {}, shape(R, 1), shape(1, K), R, K, kStepResults,
       hp && !gathered ? K : 0);
  // rowwise_with_gw_hp: grad_weight = g^T @ x, torch.mm of the bf16 tensors (cast_config_*
  // _for_grad_weight disabled; the transposes are views): no temporaries.
  if (hp) {
    s.step(keep, kStepWeightGrads);
    return std::move(s.s);
  }
  // grad_weight = g8^T @ x8, each cast along the other axis, then copied: g8^T made row-major,
  // x8 column-major.
  auto [g8c, gcs] =
      s.cast(R, N, grad, shape(1, N), across(Fp8Operand::kGradOutput, Fp8ScaleAxis::kCols));
  auto [x8c, xcs] = s.cast(R, K, Dtype::kFp8E4m3, shape(1, K),
                           across(Fp8Operand::kInput, Fp8ScaleAxis::kCols));
  keep.insert(keep.end(), {g8c, gcs, x8c, xcs});
  gemm({{{N, R}, grad}, {{R, K}, Dtype::kFp8E4m3}}, {}, shape(N, 1), shape(1, K), N, K,
       kStepWeightGrads);
  return std::move(s.s);
}

}  // namespace

bool fp8_max_over_tp(OpKind kind, int64_t tp, Fp8Operand operand, Fp8ScaleAxis axis) {
  if (tp <= 1) return false;
  const bool n_split = kind == OpKind::kColumnLinear, k_split = kind == OpKind::kRowLinear;
  bool split[2] = {false, false};  // the operand's dims 0 and 1
  switch (operand) {
    case Fp8Operand::kInput:  // [R, K]
      split[1] = k_split;
      break;
    case Fp8Operand::kWeight:  // [N, K]
      split[0] = n_split, split[1] = k_split;
      break;
    case Fp8Operand::kGradOutput:  // [R, N]
      split[1] = n_split;
      break;
  }
  switch (axis) {
    case Fp8ScaleAxis::kTensor:
      return split[0] || split[1];
    case Fp8ScaleAxis::kRows:  // the max over the columns
      return split[1];
    case Fp8ScaleAxis::kCols:  // over the rows
      return split[0];
  }
  return false;
}

std::vector<OpStep> op_steps(const OpInfo& info, const OpAttrs& a, std::span<const TensorType> in,
                             bool forward) {
  auto dim = [&](size_t d) { return in[0].shape.at(d); };
  const int64_t N = a.features;
  switch (info.kind) {
    case OpKind::kFp8AllGather:
      return forward ? fp8_gather_steps(dim(0), dim(1)) : std::vector<OpStep>{};
    case OpKind::kFp8ColumnLinear:
      return fp8_column_steps(forward, a.fp8_gathered, dim(0), dim(1), N);
    case OpKind::kFp8RowLinear:
      return fp8_row_steps(forward, a.fp8_gathered, dim(0), dim(1), N, a.group);
    default:
      break;
  }
  if (a.fp8 == Fp8Recipe::kNone ||
      (info.kind != OpKind::kColumnLinear && info.kind != OpKind::kRowLinear))
    return {};
  const int64_t R = dim(0), K = dim(1);
  return forward ? forward_steps(info.kind, a.group, a.fp8, a.fp8_gathered, R, K, N)
                 : backward_steps(info.kind, a.group, a.fp8, a.fp8_gathered, R, K, N);
}

int64_t steps_peak_workspace(const std::vector<OpStep>& steps, int64_t results) {
  return steps_peak_workspace(steps, std::vector<int64_t>{results});
}

int64_t steps_peak_workspace(const std::vector<OpStep>& steps, const std::vector<int64_t>& outputs) {
  int64_t results = 0;
  for (int64_t b : outputs) results += b;
  std::vector<int64_t> bytes;
  std::vector<size_t> last;  // per temporary: its last step
  for (size_t k = 0; k < steps.size(); ++k) {
    for (const TensorType& t : steps[k].temps) bytes.push_back(t.bytes()), last.push_back(k);
    for (int r : steps[k].reads) last.at(static_cast<size_t>(r)) = k;
  }
  int64_t live = 0, peak = 0, made = 0;
  size_t first = 0;
  for (size_t k = 0; k < steps.size(); ++k) {
    for (size_t t = first; t < first + steps[k].temps.size(); ++t) live += bytes[t];
    first += steps[k].temps.size();
    for (int o : steps[k].outputs) made += outputs.at(static_cast<size_t>(o));
    if (steps[k].results & kStepResults) made = results;
    peak = std::max(peak, live + made);
    for (size_t t = 0; t < first; ++t)
      if (last[t] == k) live -= bytes[t];
  }
  return std::max<int64_t>(peak - results, 0);
}

}  // namespace np
